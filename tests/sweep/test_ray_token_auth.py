"""A sweep joins a Ray cluster that ``ray start --head`` started with Ray's defaults, token
authentication included (issue 43), as Ray documents a client authenticates: on the head's
machine with the token ``ray start`` wrote to ``~/.ray/auth_token``, from another machine
with ``RAY_AUTH_TOKEN``; by its address or found as the local cluster. A missing or wrong
token is one ``error:`` paragraph within seconds, not Ray's log lines for 20 s.

The head is this module's own: a home directory of its own (where ``ray start --head``
writes the token, so the user's ~/.ray is not touched), a temp directory of its own (where
it records the cluster for ``ray.init()`` to find), free ports, its own process group,
stopped by killing that group (``ray stop`` would stop every Ray on the machine). "Another
machine" is a process with another home directory: no token file, only what it is given."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
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
    "seeds": 2, "steps": 20, "eval_every": 10, "trials": 1, "concurrency": 1,
    "scheduler": {"type": "none"}, "sampler": {"type": "grid"}, "resources": {"cpus": 1, "gpus": 0},
}
# what decides how a client authenticates, and which cluster it finds: each test sets its own
RAY_CLIENT_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")
# a refused token is reported within this (Ray retried it for 20 s, plus ~3 s of start-up,
# before); the package starts in ~3 s of it, more on a loaded shared 2-core machine
QUICK_S = 18


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group(pgid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                found.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


@pytest.fixture(scope="module")
def head():
    """``ray start --head`` with Ray's default authentication: yields the client environment
    of its machine (its home, its temp directory), its address and the token it wrote."""
    root = Path(tempfile.mkdtemp(prefix="nalu-auth-", dir="/tmp"))  # short: Ray's socket paths
    home, temp = root / "home", root / "ray"
    home.mkdir()
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in RAY_CLIENT_ENV}
    env.update(HOME=str(home), RAY_TMPDIR=str(temp), RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    ray_cli = str(Path(sys.executable).with_name("ray"))
    # `ray start --head` turns token authentication on when the machine has a token, as it has
    # once a first plain sweep started a local Ray (Ray 2.59+ writes ~/.ray/auth_token then),
    # or once the user followed Ray's documentation: that command
    subprocess.run([ray_cli, "get-auth-token", "--generate"], env=env, check=True, capture_output=True, timeout=60)
    port = _free_port()
    started = subprocess.Popen(
        [ray_cli, "start", "--head", "--port", str(port), "--num-cpus", "1",
         "--include-dashboard=false", "--disable-usage-stats"],
        env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = started.communicate(timeout=180)
        assert started.returncode == 0, out
        token = home / ".ray" / "auth_token"
        assert "Token authentication is enabled" in out, out
        yield env, f"127.0.0.1:{port}", token.read_text().strip()
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            procs = _group(started.pid)
            if not procs:
                break
            try:
                os.killpg(started.pid, sig)
            except ProcessLookupError:
                break
            psutil.wait_procs(procs, timeout=3)  # what ignores SIGTERM that long is killed
        shutil.rmtree(root, ignore_errors=True)


def _nalu_sweep(args: list[str], env: dict[str, str], cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    begun = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "service", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300, check=False)
    return done, time.monotonic() - begun


def _another_machine(env: dict[str, str], tmp_path: Path, **given: str) -> dict[str, str]:
    """The head's client environment with a home of its own (no ~/.ray/auth_token) and a temp
    directory where no cluster is recorded: only ``given`` tells it about the cluster."""
    (tmp_path / "elsewhere" / "ray").mkdir(parents=True)
    return {**env, "HOME": str(tmp_path / "elsewhere"), "RAY_TMPDIR": str(tmp_path / "elsewhere" / "ray"), **given}


def _joined(done: subprocess.CompletedProcess, finished: str = "1 completed") -> None:
    assert done.returncode == 0, done.stdout
    assert finished in done.stdout, done.stdout
    assert "connected to the running Ray" in done.stdout and "started a local Ray" not in done.stdout, done.stdout
    assert "InvalidAuthToken" not in done.stdout, done.stdout


def test_a_sweep_joins_a_token_head_on_its_machine_by_address(head, tmp_path):
    env, address, _ = head
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    done, _ = _nalu_sweep(["sweep", "space.yaml", "--address", address], env, tmp_path)
    _joined(done)


def test_a_sweep_without_address_joins_the_token_head_it_finds(head, tmp_path):
    env, _, _ = head
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    done, _ = _nalu_sweep(["sweep", "space.yaml"], env, tmp_path)
    _joined(done)


def test_from_another_machine_a_sweep_and_validate_join_with_ray_auth_token(head, tmp_path):
    env, address, token = head
    there = _another_machine(env, tmp_path, RAY_AUTH_TOKEN=token)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    done, _ = _nalu_sweep(["sweep", "space.yaml", "--address", address], there, tmp_path)
    _joined(done)
    done, _ = _nalu_sweep(["validate", "warm", "--top", "1", "--seeds", "2", "--address", address], there, tmp_path)
    _joined(done, "now: nalu-sweep report warm")


def _refused(done: subprocess.CompletedProcess, took: float, says: str) -> None:
    assert done.returncode == 2, done.stdout
    assert took < QUICK_S, (took, done.stdout)
    errors = [line for line in done.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stdout
    assert "token authentication" in errors[0] and says in errors[0], done.stdout
    assert "export RAY_AUTH_TOKEN=" in errors[0] and "ray get-auth-token" in errors[0], done.stdout
    assert "gcs_client" not in done.stdout and "InvalidAuthToken" not in done.stdout, done.stdout
    assert "Traceback" not in done.stdout, done.stdout


@pytest.mark.parametrize("by_address", [True, False], ids=["by-address", "found"])
def test_a_wrong_token_is_one_error_paragraph_within_seconds(head, tmp_path, by_address):
    env, address, _ = head
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    args = ["sweep", "space.yaml", *(["--address", address] if by_address else [])]
    done, took = _nalu_sweep(args, {**env, "RAY_AUTH_TOKEN": "wrong"}, tmp_path)
    _refused(done, took, "refused the token in $RAY_AUTH_TOKEN")


def test_no_token_on_another_machine_is_one_error_paragraph_within_seconds(head, tmp_path):
    env, address, _ = head
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    done, took = _nalu_sweep(["sweep", "space.yaml", "--address", address], _another_machine(env, tmp_path), tmp_path)
    _refused(done, took, "this machine has no token")
