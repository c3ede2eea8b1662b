"""Trial checkpoints without Ray: a trial that crashes after a checkpoint and is resumed
from the stored files reports and ends exactly as an uninterrupted trial (real training at
a tiny size; a list stands for Tune)."""

from __future__ import annotations

import pytest

from service.search.assign import active_params, run_configs
from service.search.loading import parse_space
from service.search.space import SearchSpaceError
from service.sweep.results import STEP
from service.sweep.trial import run_trial
from service.sweep.trial_state import TrialState
from service.training.checkpoint import CheckpointError

TASK = {"kind": "small_mul", "eval_samples": 200, "threshold_samples": 10_000}
PARAMS = {"lr": 0.05}


def _space(**extra):
    data = {
        "name": "tiny", "steps": 200, "eval_every": 25, "seeds": 4, "checkpoint_every": 2, "task": TASK,
        "fixed": {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "device": "cpu", "compile": "off",
                  "train": {"batch_size": 32, "regularizer": {"lambda_max": 0.1, "t_start": 50, "t_end": 150}}},
        "params": {"lr": {"type": "loguniform", "low": 1e-2, "high": 1e-1, "target": "train.optimizer.lr"}},
    }
    data.update(extra)
    return parse_space(data)


def _two_tasks():
    return _space(task=None, tasks={"small_mul": TASK, "far": {**TASK, "extrapolation": {"far": "U[2,20]"}}})


class Crash(Exception):
    pass


def _crash_after_checkpoint(space, at_step: int, directory):
    """Run until the checkpoint at ``at_step`` is stored in ``directory``, then crash the
    way a dying worker would. Returns the steps reported before the crash."""
    reports = []

    def report_checkpoint(metrics, state):
        state.save(directory)
        reports.append(metrics[STEP])
        if metrics[STEP] >= at_step:
            raise Crash

    with pytest.raises(Crash):
        run_trial(PARAMS, space, lambda m: reports.append(m[STEP]), report_checkpoint=report_checkpoint)
    return reports


def _resume(space, directory):
    configs = run_configs(space, active_params(space, PARAMS))
    state = TrialState.load(directory, configs)
    reports = []
    progress = run_trial(PARAMS, space, reports.append, resume=state,
                         report_checkpoint=lambda m, s: reports.append(m))
    return state, progress, reports


def _assert_same_trial(whole, resumed) -> None:
    assert resumed.completed and resumed.final_metrics == whole.final_metrics
    assert list(resumed.results) == list(whole.results)
    for name, result in whole.results.items():
        assert resumed.results[name].params_sha256 == result.params_sha256, name
        assert ([s.model_dump_json() for s in resumed.results[name].seeds]
                == [s.model_dump_json() for s in result.seeds])


def test_a_resumed_trial_continues_from_its_checkpoint_and_ends_as_an_uninterrupted_one(tmp_path):
    space = _space()
    whole_reports = []
    whole = run_trial(PARAMS, space, whole_reports.append)
    before = _crash_after_checkpoint(space, 100, tmp_path)
    assert before == [25.0, 50.0, 75.0, 100.0]  # checkpoints at 50 and 100 (every 2 evaluations)
    state, resumed, after = _resume(space, tmp_path)
    assert state.step == 100 and state.task_index == 0 and state.trainer.step == 100
    assert [r[STEP] for r in after] == [125.0, 150.0, 175.0, 200.0]  # not from step 0
    assert after == whole_reports[4:]  # the same metrics the uninterrupted trial reported
    _assert_same_trial(whole, resumed)


@pytest.mark.parametrize("crash_at", [200, 300])
def test_finished_tasks_are_restored_not_trained_again(crash_at, tmp_path):
    """A crash at the boundary of the two tasks (200) or inside the second one (300): the
    first task's result comes back from the checkpoint, bit for bit."""
    space = _two_tasks()
    whole_reports = []
    whole = run_trial(PARAMS, space, whole_reports.append)
    _crash_after_checkpoint(space, crash_at, tmp_path)
    state, resumed, after = _resume(space, tmp_path)
    assert state.task_index == 1 and list(state.finished) == ["small_mul"]
    assert (state.trainer is None) == (crash_at == 200)
    assert after[0][STEP] == crash_at + 25
    assert after == whole_reports[len(whole_reports) - len(after):]
    _assert_same_trial(whole, resumed)
    assert resumed.results["small_mul"].history.interpolation_mse.tobytes() == \
        whole.results["small_mul"].history.interpolation_mse.tobytes()


def test_checkpoints_are_off_without_a_checkpoint_reporter_or_with_zero():
    seen = []
    run_trial(PARAMS, _space(checkpoint_every=0), lambda m: None, report_checkpoint=lambda m, s: seen.append(s))
    assert seen == []
    run_trial(PARAMS, _space(), lambda m: None)  # no reporter: nothing to call, no checkpoint taken


def test_a_checkpoint_of_another_trial_is_refused(tmp_path):
    _crash_after_checkpoint(_space(), 50, tmp_path)
    other = _two_tasks()
    configs = run_configs(other, active_params(other, PARAMS))
    with pytest.raises(CheckpointError, match="does not fit"):
        TrialState.load(tmp_path, {"far": configs["far"], "small_mul": configs["small_mul"]})
    space = _space()
    different_lr = run_configs(space, active_params(space, {"lr": 0.02}))
    with pytest.raises(CheckpointError, match="does not fit this trial: task 'small_mul'"):
        TrialState.load(tmp_path, different_lr)
    TrialState.load(tmp_path, run_configs(space, active_params(space, PARAMS)))  # its own trial fits


def test_checkpoint_every_in_the_search_space():
    assert _space().checkpoint_every == 2
    data = _space().model_dump(mode="json")
    del data["checkpoint_every"]
    assert parse_space(data).checkpoint_every == 10
    with pytest.raises(SearchSpaceError, match=r"checkpoint_every: .*greater than or equal to 0.*\(got -1\)"):
        parse_space({**data, "checkpoint_every": -1}, source="s.yaml")


def test_a_repeat_of_a_trial_an_earlier_attempt_trained_to_the_end_is_not_pruned():
    """The worker's side of a trial run again after a resume: the run it reopens holds the
    last step (two tasks: 2 × steps), so a scheduler stopping the repeat leaves it completed."""
    from types import SimpleNamespace

    from service.sweep.trainable import _trained_before

    space = _two_tasks()
    total = 2 * space.steps
    assert _trained_before(SimpleNamespace(resumed_from_step=total), space)
    assert not _trained_before(SimpleNamespace(resumed_from_step=space.steps), space)  # the end of task 1 only
    assert not _trained_before(SimpleNamespace(resumed_from_step=None), space)  # a first attempt
