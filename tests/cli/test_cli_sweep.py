"""The sweep verbs without Ray: bad input is a clear error (exit 2, no traceback); `ui`
serves the configured store on 127.0.0.1."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.tracking import store

SMOKE = str(Path(__file__).resolve().parents[2] / "search_spaces" / "smoke.yaml")
runner = CliRunner()


def _fails(args: list[str], expected: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert expected in result.output, result.output
    assert "Traceback" not in result.output


def test_bad_space_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ntask: {kind: small_mul}\nsteps: 100\n"
                   "params: {lr: {type: loguniform, low: 0, high: 1, target: train.optimizer.lr}}\n")
    _fails(["sweep", str(bad)], f"{bad}: params.lr.low: must be > 0")


def test_missing_space_file():
    _fails(["sweep", "nope.yaml"], "nope.yaml: no such file")


def test_overrides_are_checked():
    _fails(["sweep", SMOKE, "--steps", "100"], "eval_every: must be ≤ steps (100), got 250")
    _fails(["sweep", SMOKE, "--name", "a b"], "--name 'a b'")


def test_resume_without_a_sweep():
    _fails(["sweep", SMOKE, "--resume"], "nothing to resume")


@pytest.mark.parametrize("verb", [["status"], ["best", "smoke"], ["ui"]])
def test_reading_verbs_need_a_store(verb):
    _fails(verb, "no tracking store at")


def test_best_and_status_of_an_unknown_sweep(tmp_path):
    store.client(store.default_tracking_uri()).search_experiments()  # creates an empty store
    _fails(["best", "nope"], "no sweep named 'nope'")
    _fails(["status", "nope"], "no sweep named 'nope'")
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 0 and "no sweeps in" in result.output


def test_ui_serves_the_store_on_localhost(monkeypatch, tmp_path):
    (tmp_path / "mlflow.db").touch()
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, check: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    result = runner.invoke(app, ["ui", "--port", "5123"])
    assert result.exit_code == 0, result.output
    assert "http://127.0.0.1:5123" in result.output
    (cmd,) = calls
    assert cmd[1:4] == ["-m", "mlflow", "ui"]
    assert cmd[cmd.index("--backend-store-uri") + 1] == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--default-artifact-root") + 1] == (tmp_path.resolve() / "mlruns").as_uri()


def test_ui_with_a_server_prints_its_address():
    result = runner.invoke(app, ["ui", "--tracking-uri", "http://mlflow.example:5000"])
    assert result.exit_code == 0 and "http://mlflow.example:5000" in result.output


def test_unreachable_ray_address_fails_fast():
    _fails(["sweep", SMOKE, "--address", "127.0.0.1:1"], "cannot reach the Ray cluster at '127.0.0.1:1'")
