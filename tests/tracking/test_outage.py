"""A real `mlflow server` (PostgreSQL-backed, basic auth, proxied artifacts) stopped for
~20 s in the middle of a real sweep and started again: the sweep completes, no trial fails
for it, and every metric point and artifact the trials logged is stored, once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
import loopback_stack  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SWEEP = "outage"
TRIALS = 3
OUTAGE_S = 20
SPACE = loopback_stack.small_mul_space(SWEEP, seeds=4, steps=4000, eval_every=100, trials=TRIALS)
ARTIFACTS = {"seeds.csv", "weights/best_seed.json", "plots/curves.png"}


def _files(client, run_id: str) -> set[str]:
    out, stack = set(), [None]
    while stack:
        for item in client.list_artifacts(run_id, stack.pop()):
            (stack.append(item.path) if item.is_dir else out.add(item.path))
    return out


def test_a_sweep_loses_nothing_while_the_tracking_server_is_away(tracking_stack, tmp_path, monkeypatch):
    server = tracking_stack
    from mlflow.tracking import MlflowClient

    for k, v in server.client_env().items():
        monkeypatch.setenv(k, v)
    client = MlflowClient(tracking_uri=server.tracking_uri)
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    spool_dir = tmp_path / "spool"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_ADDRESS"))}
    env.update(server.client_env(), TUNE_DISABLE_AUTO_CALLBACK_LOGGERS="1", COLUMNS="200",
               NALU_SWEEP_SPOOL_DIR=str(spool_dir), NALU_SWEEP_TRACKING_BACKOFF_MAX_S="4")
    cmd = [sys.executable, "-c", "from service.cli import app; app()", "sweep", str(space),
           "--tracking-uri", server.tracking_uri, "--storage-path", str(tmp_path / "runs")]
    log = (tmp_path / "sweep.log").open("w")
    started, t0 = time.monotonic(), time.time()
    driver = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        def training() -> bool:  # a trial has logged a few evaluations
            exp = client.get_experiment_by_name(SWEEP)
            trials = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("nalu_sweep.role") == "trial"]
            return any(len(client.get_metric_history(r.info.run_id, "objective")) >= 2 for r in trials)

        loopback_stack.wait_until(lambda: driver.poll() is None and training(), 150, "first trial", tmp_path / "sweep.log")
        down = time.time()
        server.stop_mlflow()
        time.sleep(max(0.0, OUTAGE_S - server.startup_s))  # a start takes startup_s of the outage
        assert driver.poll() is None, "the sweep ended while the server was away"
        server.start_mlflow()
        up = time.time()
        assert up - down >= OUTAGE_S * 0.6
        rc = driver.wait(timeout=240)
    finally:
        if driver.poll() is None:
            loopback_stack.stop_trees([driver])
        log.close()
    output = (tmp_path / "sweep.log").read_text(errors="replace")
    print(f"sweep: {time.monotonic() - started:.0f} s, server away {up - down:.0f} s "
          f"(after {down - t0:.0f} s of the sweep)")
    assert rc == 0, output[-4000:]

    exp = client.get_experiment_by_name(SWEEP)
    found = client.search_runs([exp.experiment_id], max_results=100)
    (parent,) = [r for r in found if r.data.tags.get("nalu_sweep.role") == "sweep"]
    trials = [r for r in found if r.data.tags.get("nalu_sweep.role") == "trial"]
    assert parent.info.status == "FINISHED" and parent.data.tags["nalu_sweep.outcome"] == "completed"
    assert len(trials) == TRIALS
    during = 0
    for run in trials:
        name = run.info.run_name
        assert run.info.status == "FINISHED", name
        assert run.data.tags["nalu_sweep.outcome"] == "completed", name
        points = [m for key in run.data.metrics for m in client.get_metric_history(run.info.run_id, key)]
        assert len(points) == int(run.data.tags["nalu_sweep.metric_points"]), name  # none lost
        assert len({(m.key, m.step) for m in points}) == len(points), name  # none twice
        during += sum(down * 1000 <= m.timestamp <= up * 1000 for m in points)
        assert ARTIFACTS <= _files(client, run.info.run_id), name
    assert during > 0, "no trial logged while the server was away: the outage did not test anything"
    system = client.get_metric_history(parent.info.run_id, "system/cpu_utilization_percentage")
    assert any(down * 1000 <= m.timestamp <= up * 1000 for m in system)
    assert not any(spool_dir.rglob("journal.jsonl")), "writes left in the spool"
    print(f"{sum(int(r.data.tags['nalu_sweep.metric_points']) for r in trials)} metric points stored, "
          f"{during} of them logged while the server was away")
