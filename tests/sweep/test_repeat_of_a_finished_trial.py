"""The worker's side of a trial Tune runs again after a resume although an earlier attempt
trained all its steps (issue 43's kill-and-resume path; a clean-clone run told the study
PRUNED beside a completed run). The earlier attempt's end may still be only in its
journal when the repeat opens the run: the repeat sends it first and reports that end to
Tune instead of training again, so a scheduler restored older cannot stop the repeat
early and make the driver, reading MLflow before the journal arrived, prune the trial.
Real MLflow (SQLite), real outboxes; the earlier attempt's last writes go to a server
that is not there, as when its worker is killed mid-drain."""

from __future__ import annotations

import time

import pytest

from service.search.loading import parse_space
from service.sweep.results import STEP, stopped_early
from service.sweep.trainable import _end_trained_before
from service.tracking import runs, spool, store
from service.tracking.store import TAG_OUTCOME, Outcome

SPACE = parse_space({
    "name": "repeat", "steps": 300, "eval_every": 50, "seeds": 2,
    "task": {"kind": "small_mul", "eval_samples": 200, "threshold_samples": 10_000},
    "fixed": {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "device": "cpu", "compile": "off"},
    "params": {"lr": {"type": "loguniform", "low": 1e-2, "high": 0.3, "target": "train.optimizer.lr"}},
})


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    """``(uri, client, experiment_id, parent_run_id)`` of one SQLite store."""
    uri = store.default_tracking_uri(tmp_path_factory.mktemp("mlflow"))
    client = store.client(uri)
    experiment_id = store.ensure_experiment(client, "repeat", uri)
    parent = runs.start_sweep_run(client, experiment_id, "repeat", space_file=None, spec_json="{}",
                                  spec_hash="abc", storage_path="/tmp/x", params={"trials": 1})
    return uri, client, experiment_id, parent


def _report(step: int) -> list[tuple[str, float, int, int]]:
    now = int(time.time() * 1000)
    return [("objective", 1.0 - step / 1000, now, step), ("success_rate", step / 300, now, step)]


def _earlier_attempt(tracking, away, root, journalled_to: int) -> str:
    """An attempt whose reports up to step 200 reached MLflow; those up to ``journalled_to``
    and its close as completed stayed in its journal (its worker died as it drained)."""
    uri, _, experiment_id, parent = tracking
    trial = runs.TrialRun.open(uri, experiment_id, parent, f"t{journalled_to}", "trial", {"lr": 0.1})
    for step in range(50, 250, 50):
        trial.outbox.log_metrics(_report(step))
    trial.outbox.close(timeout_s=60)
    dying = spool.Outbox(away, trial.run_id, uri, root=root, backoff_s=(0.05, 0.2))
    for step in range(250, journalled_to + 1, 50):
        dying.log_metrics(_report(step))
    if journalled_to == SPACE.steps:
        dying.set_tags({TAG_OUTCOME: Outcome.COMPLETED})
        dying.set_status("FINISHED")
    assert not dying.close(timeout_s=0.5)
    return trial.run_id


def test_a_repeat_reports_the_end_its_earlier_attempt_journalled(tracking, away, tmp_path, monkeypatch):
    root = tmp_path / "spool"
    monkeypatch.setenv(spool.SPOOL_ENV, str(root))
    uri, client, experiment_id, parent = tracking
    run_id = _earlier_attempt(tracking, away, root, journalled_to=SPACE.steps)
    assert max(m.step for m in client.get_metric_history(run_id, "objective")) == 200  # the end is not in MLflow

    repeat = runs.TrialRun.open(uri, experiment_id, parent, f"t{SPACE.steps}", "trial", {"lr": 0.1})
    end = _end_trained_before(repeat, SPACE)

    assert end == {"objective": pytest.approx(0.7), "success_rate": pytest.approx(1.0), STEP: SPACE.steps}
    assert not stopped_early(end, SPACE.steps)  # what the driver reads: the trial completed
    assert max(m.step for m in client.get_metric_history(run_id, "objective")) == SPACE.steps
    repeat.close(Outcome.COMPLETED)
    assert client.get_run(run_id).data.tags[TAG_OUTCOME] == Outcome.COMPLETED


def test_a_repeat_of_an_attempt_cut_before_its_end_trains(tracking, away, tmp_path, monkeypatch):
    root = tmp_path / "spool"
    monkeypatch.setenv(spool.SPOOL_ENV, str(root))
    uri, _, experiment_id, parent = tracking
    _earlier_attempt(tracking, away, root, journalled_to=250)
    repeat = runs.TrialRun.open(uri, experiment_id, parent, "t250", "trial", {"lr": 0.1})
    assert repeat.resumed_from_step == 250
    assert _end_trained_before(repeat, SPACE) is None  # it trains again from its checkpoint
    repeat.close(Outcome.INTERRUPTED)
