"""The cluster options without a cluster: the Optuna study storage, credential forwarding
to remote Ray workers, and URIs with passwords kept out of messages."""

from __future__ import annotations

import pytest

from service.errors import UserError
from service.formatting import redact
from service.sweep.driver import SweepOptions
from service.sweep.searcher import check_study, optuna_storage
from service.tracking import store


def test_redact_hides_passwords_in_uris():
    assert redact("postgresql+psycopg://nalu:s3cret@db:5432/optuna") == "postgresql+psycopg://nalu:***@db:5432/optuna"
    assert redact("http://mlflow:5000") == "http://mlflow:5000"
    assert redact("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_credentials_are_forwarded_only_when_set(monkeypatch):
    for var in store.CREDENTIAL_VARS:
        monkeypatch.delenv(var, raising=False)
    assert store.credential_env() == {}
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "pw")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD_EXTRA", "not forwarded")
    assert store.credential_env() == {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": "pw"}


def test_a_taken_study_name_is_refused_unless_resuming(tmp_path):
    import optuna

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    options = SweepOptions(name="s1", tracking_uri="sqlite:///x.db", storage_path=str(tmp_path),
                           optuna_storage=url)
    check_study(options)  # free: fine
    optuna.create_study(study_name="s1", storage=optuna_storage(url))
    with pytest.raises(UserError, match="an Optuna study named 's1' already exists"):
        check_study(options)
    check_study(SweepOptions(**{**options.__dict__, "resume": True}))


def test_an_unreachable_study_database_is_a_clear_error():
    url = "postgresql+psycopg://u:topsecret@127.0.0.1:1/optuna"
    with pytest.raises(UserError) as err:
        check_study(SweepOptions(name="s", tracking_uri="sqlite:///x.db", storage_path="/tmp", optuna_storage=url))
    assert "cannot use the Optuna storage" in str(err.value) and "topsecret" not in str(err.value)


def test_the_cli_passes_the_study_storage(monkeypatch, tmp_path):
    from pathlib import Path

    from typer.testing import CliRunner

    from service.cli import app
    from service.sweep import driver

    seen = {}

    def fake_run(space, options, console):
        seen["options"] = options
        raise UserError("stop here")

    monkeypatch.setattr(driver, "run_sweep", fake_run)
    smoke = Path(__file__).resolve().parents[2] / "search_spaces" / "smoke.yaml"
    result = CliRunner().invoke(app, ["sweep", str(smoke), "--optuna-storage", "sqlite:///o.db"])
    assert result.exit_code == 2 and "stop here" in result.output
    assert seen["options"].optuna_storage == "sqlite:///o.db"
    monkeypatch.setenv("NALU_SWEEP_OPTUNA_STORAGE", "sqlite:///env.db")
    CliRunner().invoke(app, ["sweep", str(smoke)])
    assert seen["options"].optuna_storage == "sqlite:///env.db"
