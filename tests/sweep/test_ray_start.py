"""How a sweep finds its Ray (issue 34), as Ray users know it: with a local cluster running
(``ray start --head``) a sweep without ``--address`` joins it and leaves it running; Tune's
own results of the sweep are then readable through Tune's public API. (With none running,
the sweep starts its own and stops it: `test_driver_without_torch.py`.)

The cluster here is this test's own: started under a temp directory of its own
(``RAY_TMPDIR``, where Ray records the cluster that ``ray start`` left running), found only
by the sweep given the same directory, and stopped by killing its own process group (never
``ray stop``, which would stop every Ray on the machine)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

SPACE = {
    "name": "warm", "task": {"kind": "arithmetic", "operation": "add"},
    "fixed": {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "device": "cpu", "compile": "off"},
    "params": {"lr": {"type": "categorical", "choices": [0.01, 0.02], "target": "train.optimizer.lr"}},
    "seeds": 2, "steps": 20, "eval_every": 10, "trials": 2, "concurrency": 1,
    "scheduler": {"type": "none"}, "sampler": {"type": "grid"}, "resources": {"cpus": 1, "gpus": 0},
}


def _benchmark():
    """`benchmarks/sweep_overhead.py`, whose warm cluster this test uses as the benchmark does."""
    spec = importlib.util.spec_from_file_location("sweep_overhead", REPO / "benchmarks" / "sweep_overhead.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def running_cluster():
    """``ray start --head`` in a process group and temp directory of its own (the benchmark's
    `local_cluster`); yields the environment that finds it and the group's id; stops exactly
    that group afterwards."""
    bench = _benchmark()
    with bench.local_cluster(REPO) as (env, group):
        yield env, group, bench.process_group
    assert not bench.process_group(group)


def test_a_sweep_joins_a_running_local_ray_leaves_it_running_and_tune_reads_its_results(running_cluster, tmp_path):
    env, group, process_group = running_cluster
    gcs = [p for p in process_group(group) if p.name().startswith("gcs_server")]
    assert len(gcs) == 1, [p.name() for p in process_group(group)]
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    done = subprocess.run([sys.executable, "-m", "service", "sweep", "space.yaml"], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout
    assert "2 completed" in done.stdout, done.stdout
    assert "connected to the running Ray" in done.stdout and "left running" in done.stdout, done.stdout
    assert "started a local Ray" not in done.stdout, done.stdout
    time.sleep(1)
    assert gcs[0].is_running() and gcs[0].status() != psutil.STATUS_ZOMBIE  # the cluster is still up

    # Tune's own view of the sweep: each trial's config and what it reported
    from ray import tune

    from service.sweep.trainable import TRAINABLE_NAME

    path = str(tmp_path / "runs" / "warm")
    analysis = tune.ExperimentAnalysis(path)
    frame = analysis.dataframe()
    assert len(frame) == 2, frame
    assert sorted(frame["config/lr"]) == [0.01, 0.02]
    assert frame["objective"].notna().all() and (frame["step"] == 20).all(), frame.T

    def nalu_sweep_trial(config):  # what restoring asks for; nothing is run
        raise AssertionError("a finished sweep's trials do not run again")

    nalu_sweep_trial.__name__ = TRAINABLE_NAME
    grid = tune.Tuner.restore(path, trainable=nalu_sweep_trial).get_results()
    assert len(grid) == 2 and not grid.errors
    assert sorted(r.config["lr"] for r in grid) == [0.01, 0.02]
    assert all(r.metrics["objective"] == pytest.approx(o) for r, o in
               zip(sorted(grid, key=lambda r: r.config["lr"]),
                   frame.sort_values("config/lr")["objective"], strict=True))


DISCONNECT_CHECK = """
import ray
from service.cli import app
try:
    app(["sweep", "space.yaml", "--name", "again"])
except SystemExit as e:
    assert not e.code, e.code
print("connected after the sweep:", ray.is_initialized())
"""


def test_a_sweep_that_joined_a_running_ray_disconnects_at_its_end(running_cluster, tmp_path):
    """Through `ray.shutdown()` when the sweep ends (which leaves a joined cluster up), not in
    Ray's exit hook, which first waits half a second for log lines (issue 34's warm fixed
    cost); the cluster keeps running."""
    env, group, process_group = running_cluster
    gcs = [p for p in process_group(group) if p.name().startswith("gcs_server")]
    (tmp_path / "space.yaml").write_text(yaml.safe_dump({**SPACE, "trials": 1}))
    done = subprocess.run([sys.executable, "-c", DISCONNECT_CHECK], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout
    assert "connected to the running Ray" in done.stdout, done.stdout
    assert "connected after the sweep: False" in done.stdout, done.stdout
    assert gcs[0].is_running() and gcs[0].status() != psutil.STATUS_ZOMBIE
