"""The sweep verbs without Ray: bad input is a clear error (exit 2, no traceback); `ui`
serves the configured store on 127.0.0.1."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.cli import sweep as cli_sweep
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
    monkeypatch.setattr(cli_sweep, "serve", lambda cmd: calls.append(cmd) or 0)
    result = runner.invoke(app, ["ui", "--port", "5123"])
    assert result.exit_code == 0, result.output
    assert "http://127.0.0.1:5123" in result.output
    (cmd,) = calls
    assert cmd[1:4] == ["-m", "mlflow", "ui"]
    assert cmd[cmd.index("--backend-store-uri") + 1] == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--default-artifact-root") + 1] == (tmp_path.resolve() / "mlruns").as_uri()
    assert cmd[cmd.index("--workers") + 1] == "1"  # not MLflow's 4 on a 2-core laptop


def test_ui_stops_its_server_and_workers_on_sigterm(tmp_path):
    """`serve` runs the server in a process group of its own; SIGTERM to `nalu-sweep ui`
    stops that group, workers included (here: a shell and its background child)."""
    import os
    import signal
    import sys
    import time

    pids = tmp_path / "pids"
    script = (f"import sys; from service.cli.sweep import serve; "
              f"sys.exit(serve(['sh', '-c', 'sleep 300 & echo $$ $! > {pids}; wait']))")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    deadline = time.monotonic() + 120
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        assert time.monotonic() < deadline and proc.poll() is None, "the server never started"
        time.sleep(0.2)
    server, worker = map(int, pids.read_text().split())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return not Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"

    deadline = time.monotonic() + 20
    while (alive(server) or alive(worker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(server) and not alive(worker), "the server or its worker outlived `ui`"


def test_ui_with_a_server_prints_its_address():
    result = runner.invoke(app, ["ui", "--tracking-uri", "http://mlflow.example:5000"])
    assert result.exit_code == 0 and "http://mlflow.example:5000" in result.output


def test_unreachable_ray_address_fails_fast():
    _fails(["sweep", SMOKE, "--address", "127.0.0.1:1"], "cannot reach the Ray cluster at '127.0.0.1:1'")
