"""The standard-library reader of a SQLite store (`service.tracking.sqlite_reader`) gives
the read-only verbs the same answers as MLflow's client, on a store written by MLflow's
client (two sweeps as a sweep records them, plus what a store collects over time:
validation runs, a deleted trial, a deleted experiment, NaN and infinite metrics, runs
started in the same millisecond), and leaves every other store to MLflow."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import math
import shutil
import sqlite3
from pathlib import Path

import pytest

from service.tracking import queries, runs, store
from service.tracking.sqlite_reader import (
    KNOWN_SCHEMAS,
    SqliteReader,
    open_reader,
    parse_tag_filter,
    schema_revision,
)

REPO = Path(__file__).resolve().parents[2]


def _build_store():
    spec = importlib.util.spec_from_file_location("readonly_verbs", REPO / "benchmarks" / "readonly_verbs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_store


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """``(uri, MlflowClient)`` of a store with sweeps ``bench`` (8 trials, one deleted, one
    validated), ``other`` (3 trials plus two started together, one with NaN, ±inf and
    out-of-order steps) and ``gone`` (its experiment deleted)."""
    from mlflow.entities import Metric

    root = tmp_path_factory.mktemp("store")
    build = _build_store()
    uri = build(root, "bench", 8)
    build(root, "other", 3, seed=1)
    build(root, "gone", 2, seed=2)
    client = store.client(uri)
    bench = queries.load_sweep(client, "bench")
    best = bench.ranked()[0]
    validation = client.create_run(bench.experiment_id, run_name="validate", tags={
        store.TAG_PARENT: bench.run_id, store.TAG_ROLE: store.ROLE_VALIDATION,
        store.TAG_SOURCE_RUN: best.run_id}).info.run_id
    client.log_batch(validation, metrics=[Metric("success_rate", 0.75, 1, 0), Metric("successes", 24, 1, 0)])
    client.set_terminated(validation, "FINISHED")
    client.delete_run(bench.trials[-1].run_id)
    other = queries.load_sweep(client, "other")
    started = other.trials[0].start_time + 1
    for key, values in (("same-a", {"objective": math.nan, "success_rate": math.inf}),
                        ("same-b", {"objective": -math.inf, "success_rate": 0.5})):
        run = client.create_run(other.experiment_id, start_time=started, run_name=f"trial_{key}", tags={
            store.TAG_PARENT: other.run_id, store.TAG_ROLE: store.ROLE_TRIAL, store.TAG_TRIAL_KEY: key,
            store.TAG_OUTCOME: "completed"}).info.run_id
        metrics = [Metric(k, v, started, 5) for k, v in values.items()]
        metrics += [Metric(k, 0.25, started + 1, 3) for k in values]  # an earlier step, logged later
        client.log_batch(run, metrics=metrics, params=[])
        client.set_terminated(run, "FINISHED")
    client.delete_experiment(client.get_experiment_by_name("gone").experiment_id)
    return uri, client


def _plain(value):
    """Dataclasses and runs as plain data, NaN as a string: answers compared with ``==``."""
    if dataclasses.is_dataclass(value):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def _run(run) -> dict:
    info = {k: getattr(run.info, k) for k in ("run_id", "run_name", "experiment_id", "status", "start_time",
                                               "end_time", "lifecycle_stage", "artifact_uri")}
    return _plain({"info": info, "tags": run.data.tags, "params": run.data.params, "metrics": run.data.metrics})


def test_the_reader_reads_the_schema_the_installed_mlflow_writes(recorded):
    uri, _ = recorded
    path = Path(uri.removeprefix("sqlite:///"))
    assert schema_revision(path) in KNOWN_SCHEMAS  # else: check the tables, then add the revision
    assert isinstance(open_reader(uri), SqliteReader)


@pytest.mark.parametrize("name", ["bench", "other", "gone", "missing"])
def test_a_sweep_reads_the_same_through_mlflow_and_sqlite(recorded, name):
    uri, client = recorded
    expected, got = queries.load_sweep(client, name), queries.load_sweep(open_reader(uri), name)
    assert _plain(got) == _plain(expected)
    if expected is None:
        return
    assert got.counts() == expected.counts() and queries.tally(got.trials) == queries.tally(expected.trials)
    assert [t.run_id for t in got.trials] == [t.run_id for t in expected.trials]
    if expected.ranked():
        top, want = got.ranked()[0], expected.ranked()[0]
        assert (top.run_id, top.params, top.metrics) == (want.run_id, want.params, want.metrics)


def test_the_store_reads_the_same_through_mlflow_and_sqlite(recorded):
    uri, client = recorded
    reader = open_reader(uri)
    assert _plain(queries.list_sweeps(reader)) == _plain(queries.list_sweeps(client))
    assert queries.sweep_names(reader) == queries.sweep_names(client) == ["bench", "other"]
    seen = 0
    for name in ("bench", "other", "gone"):  # gone: a deleted experiment, its runs deleted with it
        exp = client.get_experiment_by_name(name)
        assert _plain(reader.get_experiment_by_name(name)) == _plain(
            {k: getattr(exp, k) for k in ("experiment_id", "name", "lifecycle_stage", "artifact_location")})
        parent = runs.find_sweep_run(client, exp.experiment_id, name)
        parent_id = parent.info.run_id if parent else "0" * 32
        validated = [_run(r) for r in queries.validation_runs(client, exp.experiment_id, parent_id)]
        assert [_run(r) for r in queries.validation_runs(reader, exp.experiment_id, parent_id)] == validated
        seen += len(validated)
        for filter_string in ("", f"tags.`{store.TAG_ROLE}` = 'trial'",
                              (f"tags.`{store.TAG_PARENT}` = {runs.quote(parent_id)} AND "
                               f"tags.`{store.TAG_ROLE}` = 'trial'")):
            assert [_run(r) for r in runs.all_runs(reader, [exp.experiment_id], filter_string)] == \
                [_run(r) for r in runs.all_runs(client, [exp.experiment_id], filter_string)], filter_string
    assert seen == 1
    assert [e.name for e in reader.search_experiments()] == [e.name for e in client.search_experiments()]


def test_nan_infinities_and_the_latest_step_read_as_mlflow_reads_them(recorded):
    uri, client = recorded
    rows = {t.name: t for t in queries.load_sweep(open_reader(uri), "other").trials}
    assert math.isnan(rows["trial-same-a"].metrics["objective"])
    assert rows["trial-same-a"].metrics["success_rate"] == pytest.approx(1.7976931348623157e308)
    assert rows["trial-same-b"].metrics["objective"] == pytest.approx(-1.7976931348623157e308)
    assert rows["trial-same-b"].metrics["success_rate"] == 0.5  # step 5, not the later-logged step 3
    assert client.get_run(rows["trial-same-a"].run_id).data.metrics["success_rate"] == \
        rows["trial-same-a"].metrics["success_rate"]


def test_reading_leaves_the_file_as_it_was(recorded):
    uri, _ = recorded
    path = Path(uri.removeprefix("sqlite:///"))
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    reader = open_reader(uri)
    queries.list_sweeps(reader)
    reader.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_a_schema_the_reader_does_not_know_is_left_to_mlflow(recorded, tmp_path):
    from service.cli.common import open_client
    from service.errors import UserError

    uri, _ = recorded
    copy = tmp_path / "mlflow.db"
    shutil.copy(uri.removeprefix("sqlite:///"), copy)
    with sqlite3.connect(copy) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0123456789ab'")
    conn.close()
    copy_uri = f"sqlite:///{copy}"
    assert open_reader(copy_uri) is None
    with pytest.raises(UserError, match=r"cannot read the MLflow tracking store .*out-of-date database schema"):
        open_client(copy_uri)  # MLflow's own verdict on the store, as one error line


def test_only_a_local_sqlite_file_of_a_known_schema_is_read_without_mlflow(recorded, tmp_path, monkeypatch):
    uri, _ = recorded
    empty, junk = tmp_path / "empty.db", tmp_path / "junk.db"
    sqlite3.connect(empty).close()
    junk.write_text("not a database")
    for other in ("http://127.0.0.1:5000", "postgresql://u@localhost/mlflow", "file:///tmp/mlruns",
                  f"{uri}?mode=ro", "sqlite://", f"sqlite:///{tmp_path / 'absent.db'}",
                  f"sqlite:///{empty}", f"sqlite:///{junk}"):
        assert open_reader(other) is None, other
    monkeypatch.setenv("MLFLOW_ENABLE_WORKSPACES", "true")
    assert open_reader(uri) is None


def test_the_reader_answers_only_tag_equalities(recorded):
    uri, _ = recorded
    assert parse_tag_filter("tags.`a.b` = 'x' AND tags.`c` = '1f'") == [("a.b", "x"), ("c", "1f")]
    reader = open_reader(uri)
    with pytest.raises(ValueError, match="cannot search runs"):
        reader.search_runs(["1"], "attributes.status = 'FINISHED'")
    with pytest.raises(ValueError, match="cannot search runs"):
        reader.search_runs(["1"], "tags.`a` != 'x'")


def test_a_run_without_a_name_is_named_by_its_tag_as_mlflow_names_it(recorded, tmp_path):
    """Rows of an old store may have no run name: MLflow then reads ``mlflow.runName``."""
    uri, client = recorded
    copy = tmp_path / "mlflow.db"
    shutil.copy(uri.removeprefix("sqlite:///"), copy)
    trial = queries.load_sweep(client, "bench").trials[0]
    with sqlite3.connect(copy) as conn:
        conn.execute("UPDATE runs SET name = NULL WHERE run_uuid = ?", (trial.run_id,))
    conn.close()
    copy_uri = f"sqlite:///{copy}"
    expected = queries.load_sweep(store.client(copy_uri), "bench")
    assert expected.trials[0].run_name == trial.run_name  # from the tag
    assert _plain(queries.load_sweep(open_reader(copy_uri), "bench")) == _plain(expected)
