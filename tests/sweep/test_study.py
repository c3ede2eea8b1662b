"""The Optuna study of a sweep whose driver was killed between two Tune snapshots (no Ray
cluster needed: the searcher is driven by hand, the study kept in SQLite)."""

from __future__ import annotations

import optuna
import pytest
from ray.tune.search.optuna import OptunaSearch

from service.sweep.searcher import ResumableOptunaSearch, fail_abandoned_trials

States = optuna.trial.TrialState


def space(trial):
    trial.suggest_float("lr", 1e-3, 1.0, log=True)


def _searcher(cls, url: str):
    searcher = cls(space=space, metric="objective", mode="max", storage=optuna.storages.RDBStorage(url),
                   study_name="s", sampler=optuna.samplers.RandomSampler(seed=0))
    searcher.set_search_properties(None, None, {})
    return searcher


def _interrupted(cls, tmp_path):
    """Two trials in Tune's snapshot; after it, trial "a" finished and a third was asked,
    then the driver died. Returns the searcher restored from the snapshot."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    before = _searcher(cls, url)
    before.suggest("a")
    before.suggest("b")
    before.on_trial_result("a", {"objective": 0.1, "training_iteration": 1})
    before.save(str(tmp_path / "searcher.pkl"))  # Tune's last snapshot
    before.on_trial_complete("a", {"objective": 0.5, "training_iteration": 2})
    before.suggest("c")  # asked after the snapshot: Tune will never know it
    after = _searcher(cls, url)
    after.restore(str(tmp_path / "searcher.pkl"))
    return after, url


def test_a_resumed_searcher_fails_abandoned_trials_and_ignores_finished_ones(tmp_path):
    searcher, url = _interrupted(ResumableOptunaSearch, tmp_path)
    study = optuna.load_study(study_name="s", storage=url)
    assert [t.state for t in study.trials] == [States.COMPLETE, States.RUNNING, States.FAIL]

    # Tune runs "a" again from its checkpoint: the study keeps its first result
    searcher.on_trial_result("a", {"objective": 0.2, "training_iteration": 2})
    searcher.on_trial_complete("a", {"objective": 0.6, "training_iteration": 2})
    searcher.on_trial_result("b", {"objective": 0.3, "training_iteration": 1})
    searcher.on_trial_complete("b", {"objective": 0.7, "training_iteration": 2})
    searcher.suggest("d")
    searcher.on_trial_complete("d", {"objective": 0.8, "training_iteration": 2})

    study = optuna.load_study(study_name="s", storage=url)
    assert [(t.state, t.value) for t in study.trials] == [
        (States.COMPLETE, 0.5), (States.COMPLETE, 0.7), (States.FAIL, None), (States.COMPLETE, 0.8)]


def test_a_plain_optuna_search_breaks_on_the_same_history(tmp_path):
    """Why the subclass exists: Ray's searcher fails on a repeated report and leaves the
    abandoned trial RUNNING forever."""
    searcher, url = _interrupted(OptunaSearch, tmp_path)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        searcher.on_trial_result("a", {"objective": 0.2, "training_iteration": 2})
    study = optuna.load_study(study_name="s", storage=url)
    assert study.trials[2].state == States.RUNNING


def test_fail_abandoned_trials_keeps_the_known_ones(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'o.db'}", study_name="x")
    for _ in range(3):
        study.ask()
    study.tell(0, 1.0)
    assert fail_abandoned_trials(study, known=[0, 1]) == [2]
    assert [t.state for t in study.trials] == [States.COMPLETE, States.RUNNING, States.FAIL]


# -- a trial the scheduler stopped ------------------------------------------------------------------------
def _space_searcher(url: str):
    """A searcher over a sweep space (200 steps, a report every 25: 8 reports)."""
    from service.search.loading import parse_space
    from service.search.sampler import DefineByRun

    sweep_space = parse_space({
        "name": "s", "steps": 200, "eval_every": 25, "seeds": 2, "task": {"kind": "small_mul"},
        "fixed": {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}},
        "params": {"lr": {"type": "loguniform", "low": 1e-3, "high": 1.0, "target": "train.optimizer.lr"}},
    })
    searcher = ResumableOptunaSearch(space=DefineByRun(sweep_space), metric="objective", mode="max",
                                     storage=optuna.storages.RDBStorage(url), study_name="s",
                                     sampler=optuna.samplers.RandomSampler(seed=0))
    searcher.set_search_properties(None, None, {})
    return searcher


def _run(searcher, trial_id: str, reports: int, failed: bool = False) -> None:
    """Tune's calls for a trial that reported ``reports`` times and ended: every report but
    the last goes to ``on_trial_result`` (Tune holds back the one its scheduler stops the
    trial at), the last comes with ``on_trial_complete``; a trial that failed for good
    gets ``on_trial_complete(error=True)`` alone after its reports."""
    results = [{"objective": it / 100, "training_iteration": it, "step": 25.0 * it} for it in range(1, reports + 1)]
    if failed:
        for result in results:
            searcher.on_trial_result(trial_id, result)
        searcher.on_trial_complete(trial_id, error=True)
        return
    for result in results[:-1]:
        searcher.on_trial_result(trial_id, result)
    searcher.on_trial_complete(trial_id, results[-1])


def test_a_trial_stopped_early_is_pruned_with_every_report_it_made(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    searcher = _space_searcher(url)
    for trial_id in "abc":
        searcher.suggest(trial_id)
    _run(searcher, "a", 3)  # stopped by ASHA at its third report (step 75 of 200)
    _run(searcher, "b", 8)  # trained all 200 steps
    _run(searcher, "c", 1, failed=True)  # failed for good
    searcher.save(str(tmp_path / "searcher.pkl"))
    resumed = _space_searcher(url)  # the same after a resume
    resumed.restore(str(tmp_path / "searcher.pkl"))
    resumed.suggest("d")
    _run(resumed, "d", 1)  # stopped at its first report

    study = optuna.load_study(study_name="s", storage=url)
    assert [t.state for t in study.trials] == [States.PRUNED, States.COMPLETE, States.FAIL, States.PRUNED]
    a, b, c, d = study.trials
    assert a.intermediate_values == {1: 0.01, 2: 0.02, 3: 0.03} and a.value == 0.03
    assert b.intermediate_values == {it: it / 100 for it in range(1, 9)} and b.value == 0.08
    assert c.intermediate_values == {1: 0.01} and c.value is None
    assert d.intermediate_values == {1: 0.01} and d.value == 0.01
    assert study.best_trial.number == b.number
