"""What the sweep tests share: a trainable whose first attempt crashes after a checkpoint,
and a sweep driver killed mid-sweep."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from service.sweep.trainable import TRAINABLE_NAME


def crash_once(marker: Path, crash_at: int, execute: str = "execute_trial"):
    """A `make_trainable` whose trainable (``service.sweep.trainable.<execute>``) dies on its
    first attempt — an exception out of the trainable, as a crashing worker's — right after
    reporting step ``crash_at``; ``marker`` records that it did."""

    def make(settings):
        def nalu_sweep_trial(config):
            from unittest import mock

            import ray.tune

            from service.sweep import trainable

            run = getattr(trainable, execute)
            if marker.exists():
                return run(config, settings)
            real_report = ray.tune.report

            def report(metrics, *, checkpoint=None):
                real_report(metrics, checkpoint=checkpoint)
                if metrics["step"] >= crash_at:
                    marker.write_text(str(metrics["step"]))
                    raise RuntimeError("injected fault after a checkpoint")

            with mock.patch.object(ray.tune, "report", report):
                run(config, settings)

        nalu_sweep_trial.__name__ = TRAINABLE_NAME
        return nalu_sweep_trial

    return make


@pytest.fixture
def crashing_trainable():
    """`crash_once`, for tests that patch it over `service.sweep.driver.make_trainable`."""
    return crash_once


def _cli_env() -> dict[str, str]:
    repo = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}


def run_cli(args: list[str], cwd: Path, ray_address: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """``nalu-sweep ARGS`` in its own process, joining the test session's Ray; its stdout and
    stderr together (what a user sees) in ``stdout``."""
    return subprocess.run([sys.executable, "-c", "from service.cli import app; app()", *args, "--address", ray_address],
                          cwd=cwd, env=_cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout_s, check=False)


def kill_driver_when(args: list[str], cwd: Path, ray_address: str, ready: Callable[[], bool],
                     timeout_s: float = 180) -> str:
    """Run ``nalu-sweep ARGS`` in its own process (joining the test session's Ray) and SIGKILL
    it once ``ready()`` holds and Tune has saved its experiment state in ``cwd/runs``; returns
    what it printed."""
    driver = subprocess.Popen([sys.executable, "-c", "from service.cli import app; app()", *args,
                               "--address", ray_address],
                              cwd=cwd, env=_cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while not ready() or not list((cwd / "runs").glob("*/experiment_state-*.json")):
            assert driver.poll() is None, driver.stdout.read().decode()
            assert time.monotonic() < deadline, "the sweep did not get far enough in time"
            time.sleep(0.5)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    return driver.stdout.read().decode(errors="replace")


@pytest.fixture
def cli_process():
    """`run_cli`, for the tests that read everything a sweep's process prints."""
    return run_cli


@pytest.fixture
def driver_killed_when():
    """`kill_driver_when`, for the tests that resume a sweep whose driver was killed."""
    return kill_driver_when
