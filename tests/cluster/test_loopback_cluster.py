"""The compose topology, run natively: PostgreSQL 15 (MLflow backend, auth users, Optuna
study), `mlflow server --app-name basic-auth --serve-artifacts` on it, a two-node Ray
cluster on 127.0.0.2 / 127.0.0.3, and `nalu-sweep sweep --address --tracking-uri
--optuna-storage` as a separate driver process. The Ray nodes do not get the MLflow
credentials: the driver forwards them (as on a real cluster whose workers only know the
server's address).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loopback_stack  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SWEEP = "cluster-smoke"
# Two trials of ~10-20 s each: long enough that the second one cannot wait for the first
# to finish and reuse its actor, so one runs on each single-CPU node.
TRIALS = 2
SPACE = loopback_stack.small_mul_space(SWEEP, seeds=2, steps=6000, eval_every=3000, trials=TRIALS)


@pytest.fixture(scope="module")
def cluster(tracking_stack):
    """The session's PostgreSQL + MLflow server, with a two-node Ray cluster added for
    this module (and stopped after it)."""
    if not all(map(loopback_stack.loopback_alias_usable, (loopback_stack.HEAD_IP, loopback_stack.WORKER_IP))):
        pytest.skip("127.0.0.2 / 127.0.0.3 are not usable loopback addresses here")
    started = time.monotonic()
    try:
        tracking_stack.start_ray()
        print(f"ray cluster up: {time.monotonic() - started:.0f} s")
        yield tracking_stack
    finally:
        tracking_stack.stop_ray()


@pytest.fixture(scope="module")
def swept(cluster, tmp_path_factory):
    """Run the sweep once as its own driver process; yields (cluster, completed process)."""
    work = tmp_path_factory.mktemp("sweep")
    space = work / "space.yaml"
    space.write_text(SPACE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_ADDRESS"))}
    env.update(cluster.client_env(), TUNE_DISABLE_AUTO_CALLBACK_LOGGERS="1", COLUMNS="200")
    cmd = [sys.executable, "-c", "from service.cli import app; app()", "sweep", str(space), "--address", cluster.ray_address,
           "--tracking-uri", cluster.tracking_uri, "--storage-path", str(work / "runs"),
           "--optuna-storage", cluster.db_url("optuna")]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    print(f"sweep: {time.monotonic() - started:.0f} s")
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n" + "\n".join(
        f"--- {n}\n{p.read_text(errors='replace')[-2000:]}" for n, p in cluster.logs.items() if p.exists())
    return cluster, proc


@pytest.fixture
def client(swept, monkeypatch):
    cluster, _ = swept
    for k, v in cluster.client_env().items():
        monkeypatch.setenv(k, v)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=cluster.tracking_uri)


def _runs(client):
    exp = client.get_experiment_by_name(SWEEP)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("nalu_sweep.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("nalu_sweep.role") == "trial"]
    return parents, children


def test_server_refuses_anonymous_clients(swept):
    import urllib.error
    import urllib.request

    cluster, _ = swept
    url = f"{cluster.tracking_uri}/api/2.0/mlflow/experiments/search?max_results=1"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url, timeout=10)
    assert err.value.code == 401


def test_one_parent_and_one_child_per_trial(client):
    parents, children = _runs(client)
    assert len(parents) == 1
    (parent,) = parents
    assert parent.data.tags["nalu_sweep.outcome"] == "completed"
    assert len(children) == TRIALS
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert len({c.data.tags["nalu_sweep.trial_key"] for c in children}) == TRIALS
    assert all(c.data.tags["nalu_sweep.outcome"] == "completed" for c in children)


def test_trials_ran_on_both_nodes(client):
    _, children = _runs(client)
    assert {c.data.tags.get("nalu_sweep.node_ip") for c in children} == {loopback_stack.HEAD_IP, loopback_stack.WORKER_IP}


def test_every_artifact_downloads_through_the_server(client, tmp_path):
    """Each run's artifact tree is listed and downloaded through the server's proxy
    (``mlflow-artifacts:`` URIs); every listed file arrives, non-empty."""
    import mlflow.artifacts

    parents, children = _runs(client)
    count = 0
    for run in [*parents, *children]:
        assert run.info.artifact_uri.startswith("mlflow-artifacts:"), run.info.artifact_uri
        stack: list[str | None] = [None]
        files = []
        while stack:
            for item in client.list_artifacts(run.info.run_id, stack.pop()):
                (stack if item.is_dir else files).append(item.path)
        assert files, f"run {run.info.run_name} has no artifacts"
        local = Path(mlflow.artifacts.download_artifacts(
            run_id=run.info.run_id, dst_path=str(tmp_path / run.info.run_id),
            tracking_uri=client._tracking_client.tracking_uri))
        for path in files:
            assert (local / path).is_file() and (local / path).stat().st_size > 0, path
        count += len(files)
    assert count >= len(children) + 1


def test_optuna_study_is_in_postgresql(swept):
    import optuna
    import psycopg

    cluster, _ = swept
    study = optuna.load_study(study_name=SWEEP, storage=cluster.db_url("optuna"))
    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(finished) == TRIALS
    assert {"lr"} <= set(finished[0].params)
    with psycopg.connect(host="127.0.0.1", port=cluster.pg_port, user=loopback_stack.DB_USER,
                         password=cluster.pg_password, dbname="optuna") as conn:
        (n,) = conn.execute("SELECT count(*) FROM trials t JOIN studies s USING (study_id) "
                            "WHERE s.study_name = %s", (SWEEP,)).fetchone()
    assert n == TRIALS


def test_a_new_sweep_with_a_taken_study_name_is_refused(swept, tmp_path):
    cluster, _ = swept
    from service.errors import UserError
    from service.sweep.driver import SweepOptions
    from service.sweep.searcher import check_study

    with pytest.raises(UserError, match="already exists"):
        check_study(SweepOptions(name=SWEEP, tracking_uri="sqlite:///x.db", storage_path=str(tmp_path),
                                  optuna_storage=cluster.db_url("optuna")))
