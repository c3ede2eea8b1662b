"""A sweep's SQLite store for a test module: its experiment (named after the module) and a
parent sweep run (module-scoped: creating the store's tables costs seconds); and a trial
recorded by a worker process of its own, as a trial worker records it (`helper.shared`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from service.tracking import runs, store

REPO = Path(__file__).resolve().parents[2]

# a trial worker's tracking: its run opened, metrics and a plot logged, closed, opened again
# (found by its trial key) and its latest metrics read; it reports the run, its child processes and whether it imported MLflow
WORKER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import psutil
    from service.tracking import helper, runs

    uri, experiment_id, parent, plots = sys.argv[1:5]
    client = helper.shared(uri)
    assert helper.shared(uri) is client  # one client per worker and store
    trial = runs.TrialRun.open(uri, experiment_id, parent, "k1", "lr=0.1", {"lr": 0.1},
                               tags={"nalu_sweep.node": "here"}, client=client)
    for step in (100, 200):
        trial.log_metrics({"objective": step / 1000, "mse": float("nan")}, step)
    trial.log_artifact_dir(Path(plots), "plots")
    trial.close("completed")
    again = runs.TrialRun.open(uri, experiment_id, parent, "k1", "lr=0.1", {"lr": 0.1}, client=client)
    latest = again.latest_metrics(timeout_s=60)
    again.close("completed")
    print(json.dumps({"run": trial.run_id, "again": again.run_id, "resumed": again.resumed_from_step,
                      "latest": latest,
                      "children": [" ".join(p.cmdline()) for p in psutil.Process().children()],
                      "mlflow_imported": any(m == "mlflow" or m.startswith("mlflow.") for m in sys.modules)}))
    """)


@pytest.fixture(scope="module")
def tracking(tmp_path_factory, request):
    """``(uri, client, experiment_id, parent_run_id)``."""
    name = request.module.__name__.rsplit(".", 1)[-1]
    uri = store.default_tracking_uri(tmp_path_factory.mktemp("mlflow"))
    client = store.client(uri)
    experiment_id = store.ensure_experiment(client, name, uri)
    parent = runs.start_sweep_run(client, experiment_id, name, space_file=None, spec_json="{}",
                                  spec_hash="abc", storage_path="/tmp/x", params={"trials": 1})
    return uri, client, experiment_id, parent


@pytest.fixture
def record_trial(tmp_path, tracking):
    """``record_trial(env)``: `WORKER` run in a process with ``env`` added to this one's (and
    the spool in ``tmp_path / "spool"``); returns what it reported."""

    def record(env: dict[str, str] | None = None) -> dict:
        uri, _, experiment_id, parent = tracking
        plots = tmp_path / "plots"
        plots.mkdir(exist_ok=True)
        (plots / "curves.png").write_bytes(b"\x89PNG not really")
        script = tmp_path / "worker.py"
        script.write_text(WORKER)
        full_env = {**os.environ, "PYTHONPATH": str(REPO), "NALU_SWEEP_SPOOL_DIR": str(tmp_path / "spool"),
                    **(env or {})}
        done = subprocess.run([sys.executable, str(script), uri, experiment_id, parent, str(plots)],
                              capture_output=True, text=True, timeout=300, env=full_env, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    return record
