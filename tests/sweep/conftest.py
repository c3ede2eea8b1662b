"""What the sweep tests share: a trainable whose first attempt crashes after a checkpoint,
a sweep driver killed mid-sweep, and checks of a finished sweep's outcomes and Optuna study."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from types import SimpleNamespace

import pytest

from service.scoring.objective import OBJECTIVE
from service.sweep.rungs import Rungs
from service.sweep.study_sync import reported_values
from service.sweep.trainable import TRAINABLE_NAME
from service.tracking import store


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


def kill_driver_when(args: list[str], cwd: Path, ray_address: str, ready: Callable[[], bool],
                     timeout_s: float = 180) -> None:
    """Run ``nalu-sweep ARGS`` in its own process (joining the test session's Ray) and SIGKILL
    it once ``ready()`` holds and Tune has saved its experiment state in ``cwd/runs``."""
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    driver = subprocess.Popen([sys.executable, "-c", "from service.cli import app; app()", *args,
                               "--address", ray_address],
                              cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while not ready() or not list((cwd / "runs").glob("*/experiment_state-*.json")):
            assert driver.poll() is None, driver.stdout.read().decode()
            assert time.monotonic() < deadline, "the sweep did not get far enough in time"
            time.sleep(0.5)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()


@pytest.fixture
def driver_killed_when():
    """`kill_driver_when`, for the tests that resume a sweep whose driver was killed."""
    return kill_driver_when


def sweep_with_study(space, tmp_path: Path):
    """Run ``space`` as a sweep in this process, its Optuna study in SQLite under
    ``tmp_path``; returns the summary, the MLflow client, the trial runs and the study."""
    import io

    import optuna
    from rich.console import Console

    from service.sweep import driver
    from service.tracking import runs

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    options = driver.SweepOptions(name=space.name, tracking_uri=store.resolve_tracking_uri(None),
                                  storage_path=str(tmp_path / "runs"), optuna_storage=url)
    summary = driver.run_sweep(space, options, Console(file=io.StringIO()))
    assert summary.outcome == "completed", summary
    client = store.client(options.tracking_uri)
    children = runs.trial_runs(client, summary.experiment_id, summary.parent_run_id)
    return summary, client, children, optuna.load_study(study_name=space.name, storage=url)


def optuna_number(child) -> int:
    """The Optuna trial number a trial's MLflow run is tagged with."""
    return int(child.data.tags[store.TAG_OPTUNA_TRIAL])


def objective_reports(space, client, child) -> dict[int, float]:
    """``{Tune report: objective}`` of a trial, from its run's MLflow history."""
    return reported_values(space, client.get_metric_history(child.info.run_id, OBJECTIVE))


def asha_replay(space, histories: list[dict[int, float]]) -> list[bool]:
    """Whether each trial, run one after the other in this order with these reports, goes
    to the end under ASHA maximising the objective (`service.sweep.rungs.Rungs` applies
    Tune's rule; a trial at its last report has finished, whatever the rung there says);
    for a sweep of one bracket."""
    total = space.total_reports()
    rungs = Rungs(space.grace_reports(), total, space.scheduler.reduction_factor)
    return [all(rungs.judge(member, it, value) for it, value in sorted(history.items()) if it < total)
            for member, history in enumerate(histories)]


def assert_study_agrees(space, client, children, study) -> None:
    """Each finished trial's Optuna trial is as its MLflow run ended: PRUNED (pruned) or
    COMPLETE (completed), with the objective at every report the trial made as its
    intermediate values, a pruned one's last where it was stopped (its value), a
    completed one's at its last step, its final objective its value."""
    import optuna
    import pytest

    States = optuna.trial.TrialState
    expected = {"pruned": States.PRUNED, "completed": States.COMPLETE}
    total = space.total_reports()
    for child in children:
        trial = study.trials[optuna_number(child)]
        outcome, reports = child.data.tags[store.TAG_OUTCOME], objective_reports(space, client, child)
        assert trial.state == expected[outcome], (child.info.run_name, outcome, trial.state)
        assert trial.intermediate_values == pytest.approx(reports), (child.info.run_name, outcome)
        if outcome == "pruned":
            assert max(reports) < total and trial.value == reports[max(reports)], child.info.run_name
        else:
            assert max(reports) == total and trial.value == child.data.metrics[OBJECTIVE], child.info.run_name


@pytest.fixture
def sweep_checks():
    """`sweep_with_study`, `optuna_number`, `objective_reports`, `asha_replay` and
    `assert_study_agrees`."""
    return SimpleNamespace(sweep_with_study=sweep_with_study, optuna_number=optuna_number,
                           objective_reports=objective_reports,
                           asha_replay=asha_replay, assert_study_agrees=assert_study_agrees)
