"""Load on the tracking path: 8 trial processes log metrics as fast as the server takes
them, for 20 s (``NALU_SWEEP_LOAD_S``: 120 for the 2-minute run), through the project's own
`TrialRun` (journal + background sender)
into the PostgreSQL-backed `mlflow server` of the deployment topology. Every point sent
must be stored, once; the sustained rate is printed and written to
``$NALU_SWEEP_LOAD_REPORT`` (default: the test's tmp dir, ``tracking_load.json``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loopback_stack  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TRIALS = 8
SECONDS = float(os.environ.get("NALU_SWEEP_LOAD_S", "20"))  # long enough for a steady rate
KEYS = 20  # metrics per evaluation, about what a two-range trial logs
# One trial: log an evaluation of KEYS metrics per step as fast as it goes; when more than
# BACKLOG evaluations wait to be sent, wait for the sender (the server sets the pace).
TRIAL = """
import json, sys, time
from service.tracking import runs
uri, exp, parent, key, seconds, keys, out = sys.argv[1:]
seconds, keys = float(seconds), int(keys)
trial = runs.TrialRun.open(uri, exp, parent, key, key, {"kind": "load"})
start = time.time()
step = 0
while time.time() - start < seconds:
    trial.log_metrics({f"load.m{i}": step * 0.5 + i for i in range(keys)}, step)
    step += 1
    while trial.outbox.pending() > 50:
        time.sleep(0.005)
trial.close("completed")
json.dump({"run_id": trial.run_id, "logged": trial.outbox.logged_points, "sent": trial.outbox.sent_points,
           "steps": step, "start": start, "end": time.time()}, open(out, "w"))
"""


def test_eight_trials_logging_at_full_rate_lose_no_metric_point(tracking_stack, tmp_path, monkeypatch):
    server = tracking_stack
    import psycopg
    from mlflow.tracking import MlflowClient

    for k, v in server.client_env().items():
        monkeypatch.setenv(k, v)
    client = MlflowClient(tracking_uri=server.tracking_uri)
    experiment_id = client.create_experiment("load")
    parent = client.create_run(experiment_id, run_name="load").info.run_id
    env = {**os.environ, "NALU_SWEEP_SPOOL_DIR": str(tmp_path / "spool")}
    outs = [tmp_path / f"trial-{i}.json" for i in range(TRIALS)]
    started = time.time()
    procs = [subprocess.Popen([sys.executable, "-c", TRIAL, server.tracking_uri, experiment_id, parent,
                               f"trial-{i}", str(SECONDS), str(KEYS), str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i, out in enumerate(outs)]
    try:
        logs = [p.communicate(timeout=SECONDS + 240)[0] for p in procs]
    finally:
        loopback_stack.stop_trees([p for p in procs if p.poll() is None])
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    results = [json.loads(out.read_text()) for out in outs]
    run_ids = [r["run_id"] for r in results]
    logged = sum(r["logged"] for r in results)
    acknowledged = sum(r["sent"] for r in results)
    with psycopg.connect(host="127.0.0.1", port=server.pg_port, user=loopback_stack.DB_USER,
                         password=server.pg_password, dbname="mlflow") as conn:
        stored, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT (run_uuid, key, step)) FROM metrics WHERE run_uuid = ANY(%s)",
            (run_ids,)).fetchone()
    elapsed = max(r["end"] for r in results) - min(r["start"] for r in results)
    rate = stored / elapsed
    figure = {
        "trials": TRIALS, "seconds_logging": SECONDS, "seconds_until_all_stored": round(elapsed, 1),
        "metric_points_logged": logged, "metric_points_acknowledged": acknowledged,
        "metric_points_stored": stored, "lost": logged - distinct, "duplicated": stored - distinct,
        "points_per_second": round(rate), "evaluations_per_second": round(rate / KEYS, 1),
        "server": "mlflow server --workers 2, basic auth, PostgreSQL 15 backend",
        "machine": f"{os.cpu_count()}-core CPU, load average at the end "
                   f"{os.getloadavg()[0]:.1f} (server, database and the {TRIALS} trials share it)",
    }
    report = Path(os.environ.get("NALU_SWEEP_LOAD_REPORT") or tmp_path / "tracking_load.json")
    report.write_text(json.dumps(figure, indent=1) + "\n")
    print(json.dumps(figure, indent=1))
    assert all(client.get_run(r).info.status == "FINISHED" for r in run_ids)
    assert logged == acknowledged, "a trial closed with points the server never acknowledged"
    assert stored == distinct, "metric points stored twice"
    assert distinct == logged, "metric points lost"
    assert all(r["steps"] > 0 for r in results)
    assert not any((tmp_path / "spool").rglob("journal.jsonl"))
    assert time.time() - started < SECONDS + 240
