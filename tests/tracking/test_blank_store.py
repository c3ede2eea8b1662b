"""A new SQLite tracking store copied from a migrated blank (`service.tracking.blank_store`)
is the store MLflow would have made, and nothing about it can cost a user a store."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from service.tracking import blank_store, store


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("NALU_SWEEP_CACHE", str(path))
    return path


def _clauses(sql: str | None) -> list[str]:
    """A CREATE statement's clauses, sorted: MLflow's own migrations list a table's CHECK
    constraints in a different order the second time they run in a process."""
    return sorted(line.strip().rstrip(",") for line in (sql or "").splitlines())


def _schema(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        tables = [(kind, name, table, _clauses(sql)) for kind, name, table, sql in
                  conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name")]
        revision = conn.execute("SELECT version_num FROM alembic_version").fetchall()
        experiments = conn.execute("SELECT experiment_id, name, artifact_location, lifecycle_stage "
                                   "FROM experiments").fetchall()
    return [*tables, ("alembic", *revision), ("experiments", *experiments)]


def _uri(path: Path) -> str:
    return f"sqlite:///{path}"


def test_a_store_from_the_blank_is_the_store_mlflow_makes(cache, tmp_path):
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=_uri(tmp_path / "by_mlflow.db")).search_experiments()
    client = store.client(_uri(tmp_path / "from_blank.db"))
    assert blank_store.blank_path().is_file()  # the blank was made, and used
    client.search_experiments()
    assert _schema(tmp_path / "from_blank.db") == _schema(tmp_path / "by_mlflow.db")
    # and it works as a store: an experiment, a run, a metric
    experiment = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    run = client.create_run(experiment)
    client.log_metric(run.info.run_id, "objective", 0.5, step=3)
    assert client.get_metric_history(run.info.run_id, "objective")[0].value == 0.5


def test_the_blank_is_made_once_and_never_written_through_a_copy(cache, tmp_path, monkeypatch):
    store.client(_uri(tmp_path / "first.db"))
    blank = blank_store.blank_path()
    before = blank.read_bytes()
    assert os.stat(blank).st_mode & 0o077 == 0  # private
    made = []
    monkeypatch.setattr(blank_store, "make_blank", lambda path: made.append(path))
    client = store.client(_uri(tmp_path / "second.db"))
    client.create_experiment("written", artifact_location=(tmp_path / "art").as_uri())
    assert made == []
    assert os.stat(tmp_path / "second.db").st_ino != os.stat(blank).st_ino
    assert blank.read_bytes() == before


def test_an_existing_store_is_left_alone(cache, tmp_path):
    db = tmp_path / "mlflow.db"
    client = store.client(_uri(db))
    client.create_experiment("kept", artifact_location=(tmp_path / "art").as_uri())
    content = db.read_bytes()
    assert blank_store.place_blank(_uri(db)) is None
    assert db.read_bytes() == content
    assert store.client(_uri(db)).get_experiment_by_name("kept") is not None


def test_a_store_made_meanwhile_by_another_process_is_not_replaced(cache, tmp_path, monkeypatch):
    db = tmp_path / "mlflow.db"
    store.client(_uri(tmp_path / "warm.db"))  # the blank exists
    real = blank_store.shutil.copyfileobj

    def copy_while_another_process_creates_the_store(src, dst):
        real(src, dst)
        db.write_bytes(b"the other process's store")

    monkeypatch.setattr(blank_store.shutil, "copyfileobj", copy_while_another_process_creates_the_store)
    assert blank_store.place_blank(_uri(db)) is None
    assert db.read_bytes() == b"the other process's store"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".mlflow.db")] == []  # no copy left aside


@pytest.mark.parametrize("damage", ["revision", "truncated"])
def test_a_blank_mlflow_would_refuse_is_dropped_and_mlflow_makes_the_store(cache, tmp_path, damage):
    store.client(_uri(tmp_path / "warm.db"))
    blank = blank_store.blank_path()
    if damage == "revision":  # as if made by another MLflow with the same version string
        with sqlite3.connect(blank) as conn:
            conn.execute("UPDATE alembic_version SET version_num = 'not-a-revision'")
    else:
        blank.write_bytes(blank.read_bytes()[: 64 * 1024])
    assert blank_store.place_blank(_uri(tmp_path / "mlflow.db")) is None
    assert not (tmp_path / "mlflow.db").exists()
    client = store.client(_uri(tmp_path / "mlflow.db"))
    client.create_experiment("works", artifact_location=(tmp_path / "art").as_uri())
    assert blank_store.is_current(blank)  # made again, by MLflow's migrations
    assert _schema(tmp_path / "mlflow.db")[-2] == _schema(tmp_path / "warm.db")[-2]  # MLflow's revision


def test_a_blank_others_could_have_written_is_not_used(cache, tmp_path, monkeypatch):
    store.client(_uri(tmp_path / "warm.db"))
    blank = blank_store.blank_path()
    blank.chmod(0o666)
    assert blank_store.place_blank(_uri(tmp_path / "mlflow.db")) is None
    client = store.client(_uri(tmp_path / "mlflow.db"))  # MLflow's own migrations
    client.search_experiments()
    assert _schema(tmp_path / "mlflow.db") == _schema(tmp_path / "warm.db")


def test_only_a_new_sqlite_file_gets_a_blank(cache, tmp_path):
    assert blank_store.place_blank("http://127.0.0.1:5000") is None
    assert blank_store.place_blank("sqlite:///:memory:") is None
    assert blank_store.place_blank((tmp_path / "mlruns").as_uri()) is None
    assert not cache.exists()
