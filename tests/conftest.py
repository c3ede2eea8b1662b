"""Shared test settings: one thread per test process keeps timings stable on 2 cores, and
one Ray for the whole test session (started on first use by a slow test)."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

# Before Ray is imported anywhere: no usage stats, no Tune file loggers. Ray's token
# authentication stays at its default (on for the local Ray the tests start: Ray writes the
# token to ~/.ray/auth_token once, and the sweeps that join it read it there).
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
torch.set_num_threads(1)
# Trial journals (service.tracking.spool) that killed workers leave behind go to this
# session's own folder, removed when it ends, not to the user's ~/.cache.
if "NALU_SWEEP_SPOOL_DIR" not in os.environ:
    os.environ["NALU_SWEEP_SPOOL_DIR"] = tempfile.mkdtemp(prefix="nalu-sweep-spool-")
    atexit.register(shutil.rmtree, os.environ["NALU_SWEEP_SPOOL_DIR"], True)

# Ray's discovery of a running local cluster (``ray.init()`` with no address: RAY_ADDRESS, or the
# cluster ``ray start --head`` recorded under its temp directory) sees only this session's own:
# a cluster someone else keeps running on this machine is never joined by a test's sweep.
os.environ.pop("RAY_ADDRESS", None)
if "RAY_TMPDIR" not in os.environ:
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="nalu-ray-", dir="/tmp")  # short: Ray's socket paths
    atexit.register(shutil.rmtree, os.environ["RAY_TMPDIR"], True)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_mlflow_in_cwd(tmp_path, monkeypatch):
    """Tests never write result files or tracking stores into the repository."""
    monkeypatch.chdir(tmp_path)
    yield


@pytest.fixture
def away(monkeypatch):
    """An MLflow client of a tracking server that is not there (a port nobody listens on):
    writes sent to it fail at once (no minutes of HTTP retries), as when a worker's server
    went away or the worker was killed while its outbox drained."""
    import socket

    from service.tracking import store

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return store.client(f"http://127.0.0.1:{port}")


@pytest.fixture(scope="session")
def ray_address():
    """Start Ray once (2 CPUs, no dashboard) for the sweep, cli and report tests; sweeps in
    this process reuse it and a sweep in a subprocess joins it with --address."""
    import ray

    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO) not in paths:  # Ray workers must import `service`
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *paths])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # always a new one
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def tracking_stack():
    """The deployment's tracking half, run natively once per session: a private
    PostgreSQL 15 (databases mlflow, mlflow_auth, optuna) and `mlflow server --app-name
    basic-auth --serve-artifacts --workers 2` on it. Starting the server costs ~20 s here,
    so the cluster, load and outage tests share it, each in its own experiment; a test may
    stop and restart the server (it comes back on the same port), never replace it."""
    import shutil
    import sys
    import tempfile

    sys.path.insert(0, str(REPO / "tests" / "cluster"))
    import loopback_stack

    reason = loopback_stack.stack_missing()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="nsstack", dir="/tmp"))
    stack = loopback_stack.Cluster(root)
    try:
        stack.start_postgres()
        stack.start_mlflow()
        yield stack
    finally:
        stack.stop()
        shutil.rmtree(root, ignore_errors=True)
