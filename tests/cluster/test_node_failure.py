"""A worker node dies mid-sweep: on the two-node loopback Ray cluster (tests/cluster/
loopback_stack.py; MLflow in a SQLite file, which both nodes share on this machine), the worker
node's raylet is SIGKILLed while a trial trains there. Ray declares the node dead, Tune
retries the trial (``retries`` → ``FailureConfig.max_failures``) on the surviving node
from its latest checkpoint, and the sweep completes with every trial exactly once in MLflow,
FINISHED, the retried one tagged with its second attempt on the head node.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loopback_stack  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SWEEP = "node-failure"
EVAL_EVERY = 500
STEPS = 3000
SPACE = loopback_stack.small_mul_space(SWEEP, seeds=2, steps=STEPS, eval_every=EVAL_EVERY, trials=2,
                                       retries=2, checkpoint_every=1)
# the GCS declares a node dead after 3 missed 500 ms health checks (default: ~30 s)
FAST_NODE_DEATH = {"RAY_health_check_initial_delay_ms": "1000", "RAY_health_check_period_ms": "500",
                   "RAY_health_check_timeout_ms": "500", "RAY_health_check_failure_threshold": "3"}


@pytest.fixture
def cluster():
    if not all(map(loopback_stack.loopback_alias_usable, (loopback_stack.HEAD_IP, loopback_stack.WORKER_IP))):
        pytest.skip("127.0.0.2 / 127.0.0.3 are not usable loopback addresses here")
    root = Path(tempfile.mkdtemp(prefix="nsnf", dir="/tmp"))
    c = loopback_stack.Cluster(root)
    try:
        c.start_ray(env=FAST_NODE_DEATH)
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def _trial_training_on_worker(db: Path) -> str | None:
    """The trial key of a run on the worker node that has passed its second evaluation
    (so the checkpoint of the first is in the Tune storage)."""
    try:
        with sqlite3.connect(db, timeout=1) as conn:
            row = conn.execute(
                "SELECT k.value FROM tags n JOIN tags k ON k.run_uuid = n.run_uuid AND k.key = ? "
                "WHERE n.key = ? AND n.value = ? AND EXISTS (SELECT 1 FROM metrics m WHERE "
                "m.run_uuid = n.run_uuid AND m.key = 'objective' AND m.step >= ?)",
                ("nalu_sweep.trial_key", "nalu_sweep.node_ip", loopback_stack.WORKER_IP, 2 * EVAL_EVERY)).fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def test_a_sweep_survives_the_loss_of_a_worker_node(cluster, tmp_path):
    from service.tracking import runs, store

    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    db = tmp_path / "mlflow.db"
    tracking_uri = f"sqlite:///{db}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_ADDRESS"))}
    env.update(RAY_AUTH_TOKEN=cluster.ray_token, RAY_USAGE_STATS_ENABLED="0", COLUMNS="200",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "service", "sweep", str(space), "--address", cluster.ray_address,
           "--tracking-uri", tracking_uri, "--storage-path", str(tmp_path / "runs")]
    out = tmp_path / "driver.log"
    started = time.monotonic()
    with open(out, "wb") as log:
        driver = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 150
        while (lost := _trial_training_on_worker(db)) is None:
            assert driver.poll() is None, out.read_text()
            assert time.monotonic() < deadline, "no trial trained on the worker node in time\n" + out.read_text()
            time.sleep(0.25)
        killed = cluster.kill_worker_raylet()
        print(f"killed the worker's raylet (pid {killed}) at {time.monotonic() - started:.0f} s; trial {lost}")
        rc = driver.wait(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    print(f"sweep: {time.monotonic() - started:.0f} s")
    output = out.read_text()
    assert rc == 0, output + "\n".join(
        f"--- {n}\n{p.read_text(errors='replace')[-2000:]}" for n, p in cluster.logs.items() if p.exists())
    assert f"sweep {SWEEP} completed: 2 completed" in output, output

    client = store.client(tracking_uri)
    experiment = client.get_experiment_by_name(SWEEP)
    parent = runs.find_sweep_run(client, experiment.experiment_id, SWEEP)
    assert parent.info.status == "FINISHED"
    children = runs.trial_runs(client, experiment.experiment_id, parent.info.run_id)
    keys = [c.data.tags[store.TAG_TRIAL_KEY] for c in children]
    assert len(keys) == len(set(keys)) == 2, keys  # every trial exactly once
    for child in children:
        assert child.info.status == "FINISHED", child.data.tags
        assert child.data.tags[store.TAG_OUTCOME] == "completed"
        assert child.data.metrics["n_seeds"] == 2
    (retried,) = [c for c in children if c.data.tags[store.TAG_TRIAL_KEY] == lost]
    tags = retried.data.tags
    assert int(tags[store.TAG_ATTEMPTS]) >= 2, tags  # FailureConfig retried it
    assert tags[store.TAG_NODE] == loopback_stack.HEAD_IP  # ... on the node that is left
    assert int(tags[store.TAG_RESUMED_FROM]) >= EVAL_EVERY  # ... from its checkpoint
    steps = [m.step for m in client.get_metric_history(retried.info.run_id, "objective")]
    assert steps == sorted(set(steps)) and steps[-1] == STEPS  # one series, no step twice
    import psutil

    assert not psutil.pid_exists(killed) or psutil.Process(killed).status() == psutil.STATUS_ZOMBIE
