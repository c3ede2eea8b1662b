"""Unreachable servers are a clear error within 15 s, not a hang: the real CLI in a
subprocess against a loopback port nobody listens on, and against one that accepts the
connection and never answers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service import endpoints
from service.errors import UserError

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "search_spaces" / "smoke.yaml")
LIMIT_S = 15.0


def _free_port() -> int:
    """A loopback port that nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_port():
    """A port that accepts TCP connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s.getsockname()[1]


def _cli(args: list[str], cwd: Path, timeout_env: str | None = None) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("MLFLOW_TRACKING_URI", None)
    if timeout_env is not None:
        env["NALU_SWEEP_CONNECT_TIMEOUT"] = timeout_env
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "service", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)
    return proc, time.monotonic() - start


def _assert_clear(proc: subprocess.CompletedProcess, seconds: float, cwd: Path, *expected: str) -> None:
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "Traceback" not in text, text
    for part in expected:
        assert part in proc.stderr, proc.stderr
    assert seconds < LIMIT_S, f"took {seconds:.1f} s"
    assert not [p for p in os.listdir(cwd) if p in ("mlflow.db", "mlruns", "runs")], os.listdir(cwd)


def test_a_tracking_server_nobody_listens_on(tmp_path):
    port = _free_port()
    proc, seconds = _cli(["sweep", SMOKE, "--tracking-uri", f"http://127.0.0.1:{port}"], tmp_path)
    _assert_clear(proc, seconds, tmp_path, f"cannot reach the MLflow tracking server at http://127.0.0.1:{port}",
                  "connection refused", "leave out --tracking-uri")


def test_a_tracking_server_that_never_answers(tmp_path, silent_port):
    """Default timeout (5 s): the MLflow client alone would wait 120 s per request, 7 retries."""
    proc, seconds = _cli(["status", "--tracking-uri", f"http://127.0.0.1:{silent_port}"], tmp_path)
    _assert_clear(proc, seconds, tmp_path, "accepted the connection but sent no answer within 5 s",
                  "NALU_SWEEP_CONNECT_TIMEOUT")


def test_an_unreachable_ray_address(tmp_path):
    port = _free_port()
    proc, seconds = _cli(["sweep", SMOKE, "--address", f"127.0.0.1:{port}"], tmp_path)
    _assert_clear(proc, seconds, tmp_path, f"cannot reach the Ray cluster at '127.0.0.1:{port}'", "ray start --head")


def test_a_ray_address_that_never_answers_in_process(silent_port, monkeypatch):
    """A listening port passes the TCP probe (Ray's GCS handshake is Ray's business); a bad
    address is refused before any connection."""
    monkeypatch.setenv("NALU_SWEEP_CONNECT_TIMEOUT", "1")
    endpoints.check_ray_address(f"127.0.0.1:{silent_port}")
    for bad in ("nonsense", "host:port", "127.0.0.1:99999", "http://127.0.0.1:1"):
        with pytest.raises(UserError, match="not a Ray address"):
            endpoints.check_ray_address(bad)


def test_the_timeout_is_configurable(silent_port, monkeypatch):
    monkeypatch.setenv("NALU_SWEEP_CONNECT_TIMEOUT", "0.5")
    start = time.monotonic()
    with pytest.raises(endpoints.UnreachableError, match="no answer within 0.5 s"):
        endpoints.check_tracking_uri(f"http://127.0.0.1:{silent_port}")
    assert time.monotonic() - start < 5
    monkeypatch.setenv("NALU_SWEEP_CONNECT_TIMEOUT", "soon")
    with pytest.raises(UserError, match="NALU_SWEEP_CONNECT_TIMEOUT"):
        endpoints.check_tracking_uri(f"http://127.0.0.1:{silent_port}")


def test_an_http_server_that_answers_passes(monkeypatch):
    """Any HTTP answer counts (an MLflow server behind auth answers 401 to /health)."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(401)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoints.check_tracking_uri(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()


def test_database_urls_are_probed_and_redacted():
    port = _free_port()
    with pytest.raises(endpoints.UnreachableError) as err:
        endpoints.check_database_url(f"postgresql+psycopg://u:topsecret@127.0.0.1:{port}/optuna")
    assert "cannot reach the Optuna study database" in str(err.value) and "topsecret" not in str(err.value)
    endpoints.check_database_url("sqlite:///optuna.db")  # a local file: nothing to probe
    with pytest.raises(UserError, match="not a tracking store MLflow can use"):
        endpoints.check_tracking_uri("bogus://x")
