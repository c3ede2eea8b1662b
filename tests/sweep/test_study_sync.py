"""Results that reached MLflow but not the Optuna study before the driver died are told to
the study on restore (`service.sweep.study_sync`): real Optuna, a real MLflow store in
SQLite, the searcher driven by hand as Tune drives it (no Ray cluster)."""

from __future__ import annotations

import optuna
import pytest

from service.scoring.objective import OBJECTIVE
from service.search.loading import parse_space
from service.search.sampler import DefineByRun
from service.sweep.pack_search import PackedOptunaSearch
from service.sweep.results import OPTUNA_TRIAL, PACK_MEMBERS, PRUNED, RUN_CONFIGS, STATE, member_key
from service.sweep.searcher import ResumableOptunaSearch
from service.sweep.study_sync import (
    TrialRecords,
    report_number,
    report_step,
    reported_values,
)
from service.tracking import store
from service.tracking.store import Outcome

States = optuna.trial.TrialState
STEPS, EVAL_EVERY = 400, 50


def _space(tasks: int = 1, **overrides):
    task = {"kind": "small_mul", "eval_samples": 200, "threshold_samples": 10_000}
    return parse_space({
        "name": "sync", "steps": STEPS, "eval_every": EVAL_EVERY, "seeds": 2,
        **({"task": task} if tasks == 1 else {"tasks": {f"t{i}": task for i in range(tasks)}}),
        "fixed": {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "device": "cpu", "compile": "off"},
        "params": {
            "lr": {"type": "loguniform", "low": 1e-3, "high": 0.3, "target": "train.optimizer.lr"},
            "optimizer": {"type": "categorical", "choices": ["adam", "rmsprop"], "target": "train.optimizer.name"},
        },
        "trials": 6, **overrides,
    })


class Point:
    def __init__(self, step: int, value: float) -> None:
        self.step, self.value = step, value


def test_mlflow_steps_map_to_the_reports_tune_made():
    space = _space(tasks=2)
    assert space.reports_per_task() == 8
    assert [report_number(space, s) for s in (0, 50, 75, 400, 450, 800)] == [None, 1, 2, 8, 9, 16]
    assert [report_step(space, r) for r in (1, 2, 8, 9, 16)] == [50, 100, 400, 450, 800]
    odd = _space(steps=420)  # a last evaluation closer than eval_every: reported at the task's end
    assert [report_step(odd, r) for r in (8, 9)] == [400, 420]
    assert all(report_number(odd, report_step(odd, r)) == r for r in range(1, odd.total_reports() + 1))
    # at a task boundary the finished task's objective is logged, then the next task's
    # step-0 objective (a minimum that includes the untrained task): the first is reported
    history = [Point(0, 0.0), Point(50, 0.1), Point(400, 0.7), Point(400, 0.0), Point(450, 0.2), Point(450, 0.2)]
    assert reported_values(space, history) == {1: 0.1, 8: 0.7, 9: 0.2}


def _records(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = store.client(uri)
    experiment_id = client.create_experiment("sync", artifact_location=str(tmp_path / "mlruns"))
    parent = client.create_run(experiment_id, tags={store.TAG_ROLE: store.ROLE_SWEEP})
    return client, TrialRecords(uri, experiment_id, parent.info.run_id)


def _trial_run(client, records, config, outcome: str, history: list[tuple[int, float]]) -> str:
    """A trial's MLflow run as its worker leaves it: tagged with its Optuna trial number,
    its objective at every evaluation, closed with its outcome."""
    run = client.create_run(records.experiment_id, tags={
        store.TAG_PARENT: records.parent_run_id, store.TAG_ROLE: store.ROLE_TRIAL,
        store.TAG_OPTUNA_TRIAL: str(config[OPTUNA_TRIAL]), store.TAG_OUTCOME: outcome})
    for key, value in config.items():
        if key not in (OPTUNA_TRIAL, RUN_CONFIGS):
            client.log_param(run.info.run_id, key, str(value))
    for step, value in history:
        client.log_metric(run.info.run_id, OBJECTIVE, value, step=step)
    client.set_terminated(run.info.run_id, "KILLED" if outcome == Outcome.INTERRUPTED else "FINISHED")
    return run.info.run_id


def _searcher(records, url: str | None):
    storage = {"storage": optuna.storages.RDBStorage(url), "study_name": "sync"} if url else {}
    searcher = ResumableOptunaSearch(space=DefineByRun(_space()), metric=OBJECTIVE, mode="max",
                                     sampler=optuna.samplers.RandomSampler(seed=0), records=records, **storage)
    searcher.set_search_properties(None, None, {})
    return searcher


PRUNED_AT = [(0, 0.0), (50, 0.1), (100, 0.2)]
COMPLETED = [(0, 0.0), *((s, s / 1000) for s in range(50, STEPS + 1, 50))]


def test_a_study_in_a_database_is_told_what_mlflow_has(tmp_path):
    """Tune's snapshot knows trials 0 and 1; after it, 1 completed in its worker and 2 and 3
    were asked, 3 pruned in its worker, and the driver died before telling the study."""
    client, records = _records(tmp_path)
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    before = _searcher(records, url)
    a, b = before.suggest("a"), before.suggest("b")
    before.save(str(tmp_path / "searcher.pkl"))
    c, d = before.suggest("c"), before.suggest("d")
    assert [a[OPTUNA_TRIAL], b[OPTUNA_TRIAL], c[OPTUNA_TRIAL], d[OPTUNA_TRIAL]] == [0, 1, 2, 3]
    _trial_run(client, records, b, Outcome.COMPLETED, COMPLETED)
    _trial_run(client, records, c, Outcome.INTERRUPTED, PRUNED_AT[:2])
    _trial_run(client, records, d, Outcome.PRUNED, PRUNED_AT)

    after = _searcher(records, url)
    after.restore(str(tmp_path / "searcher.pkl"))
    study = optuna.load_study(study_name="sync", storage=url)
    # 2, interrupted, is run again (not FAIL): the next trial Tune asks for, same setting
    assert [t.state for t in study.trials] == [States.RUNNING, States.COMPLETE, States.RUNNING, States.PRUNED]
    assert study.trials[1].value == pytest.approx(0.4)
    assert study.trials[1].intermediate_values == pytest.approx({i: i * 0.05 for i in range(1, 9)})
    assert study.trials[3].intermediate_values == pytest.approx({1: 0.1, 2: 0.2})
    assert study.trials[3].params["lr"] == pytest.approx(d["lr"])
    assert after._synced == [1, 3]
    again = after.suggest("e")
    assert again[OPTUNA_TRIAL] == 2 and again["lr"] == pytest.approx(c["lr"]) and again["optimizer"] == c["optimizer"]
    # then new trials up to the plan (6), however few Tune's snapshot knew of
    assert [after.suggest(t)[OPTUNA_TRIAL] for t in ("f", "g")] == [4, 5]
    assert after.suggest("h") == after.FINISHED

    # Tune runs trial 1 again from its checkpoint: the study keeps what MLflow had
    after.on_trial_result("b", {OBJECTIVE: 0.9, "training_iteration": 8})
    after.on_trial_complete("b", {OBJECTIVE: 0.9, "training_iteration": 8})
    assert optuna.load_study(study_name="sync", storage=url).trials[1].value == pytest.approx(0.4)


def test_an_in_memory_study_gets_the_trials_it_never_had(tmp_path):
    """Without --optuna-storage the study restored with Tune's snapshot has never heard of
    the trials asked after it: they are added in their runs' order (a finished one with its
    result, an interrupted one to be run again), so no later trial shares a number."""
    client, records = _records(tmp_path)
    before = _searcher(records, None)
    before.suggest("a")
    before.save(str(tmp_path / "searcher.pkl"))
    c, d = before.suggest("c"), before.suggest("d")
    _trial_run(client, records, c, Outcome.INTERRUPTED, PRUNED_AT[:2])
    run_d = _trial_run(client, records, d, Outcome.PRUNED, PRUNED_AT)

    after = _searcher(records, None)
    after.restore(str(tmp_path / "searcher.pkl"))
    study = after._ot_study
    # in the order of their numbers: c, interrupted, asked again with its setting (RUNNING, run
    # again as the next trial Tune asks for); d added with its result; both keep their numbers
    assert [t.state for t in study.trials] == [States.RUNNING, States.RUNNING, States.PRUNED]
    assert study.trials[2].params == {"lr": pytest.approx(d["lr"]), "optimizer": d["optimizer"]}
    assert study.trials[2].intermediate_values == pytest.approx({1: 0.1, 2: 0.2})
    assert client.get_run(run_d).data.tags[store.TAG_OPTUNA_TRIAL] == "2"
    e = after.suggest("e")
    assert e[OPTUNA_TRIAL] == 1 and e["lr"] == pytest.approx(c["lr"]) and e["optimizer"] == c["optimizer"]
    assert after.suggest("f")[OPTUNA_TRIAL] == 3

    # a second resume finds the study and the run in agreement: nothing is added twice
    after.save(str(tmp_path / "searcher-2.pkl"))
    again = _searcher(records, None)
    again.restore(str(tmp_path / "searcher-2.pkl"))
    assert len(again._ot_study.trials) == 4 and again._synced == []


@pytest.mark.slow
def test_what_mlflow_holds_is_what_the_study_was_told(ray_address, tmp_path, sweep_checks):
    """A real sweep of lone trials over two tasks: each run is tagged with its Optuna trial,
    and its objective history, read as `study_sync` reads it, gives back exactly the
    reports that trial got (Tune's iterations across the task boundary included)."""
    space = _space(tasks=2, steps=100, trials=2, concurrency=2, resources={"cpus": 1, "gpus": 0},
                   scheduler="none", sampler={"type": "random", "seed": 0})
    summary, client, children, study = sweep_checks.sweep_with_study(space, tmp_path)
    assert sorted(int(c.data.tags[store.TAG_OPTUNA_TRIAL]) for c in children) == [0, 1]
    for child in children:
        trial = study.trials[int(child.data.tags[store.TAG_OPTUNA_TRIAL])]
        assert trial.params["lr"] == pytest.approx(float(child.data.params["lr"]))
        history = client.get_metric_history(child.info.run_id, OBJECTIVE)
        assert len(trial.intermediate_values) == space.total_reports() == 4
        assert sorted(m.step for m in history).count(space.steps) == 2  # two points at the task boundary
        assert reported_values(space, history) == trial.intermediate_values
        assert trial.value == child.data.metrics[OBJECTIVE]


def test_runs_the_study_finished_are_closed_as_it_has_them(tmp_path):
    """After Tune's snapshot the dying driver asked 2, 3 and 4 and told the study that 2 was
    pruned at its second report and 4 completed, but their workers had not closed the runs
    (a pack's member is closed beside the training, after its report); the resume closed
    them as interrupted. The restore closes them as the study has them, with the
    objective the study holds where the run lacks it; 3, which the study never finished,
    keeps its interrupted run and RUNNING trial, to be run again."""
    client, records = _records(tmp_path)
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    before = _searcher(records, url)
    before.suggest("a"), before.suggest("b")
    before.save(str(tmp_path / "searcher.pkl"))
    c, d, e = before.suggest("c"), before.suggest("d"), before.suggest("e")
    study = optuna.load_study(study_name="sync", storage=url)
    for trial in study.trials[2:5]:
        if trial.number != 3:
            for report, value in ((1, 0.1), (2, 0.2)):
                study._storage.set_trial_intermediate_value(trial._trial_id, report, value)
    study.tell(2, state=States.PRUNED)
    study.tell(4, 0.4)
    run_c = _trial_run(client, records, c, Outcome.INTERRUPTED, PRUNED_AT[:2])  # the last point not sent
    run_d = _trial_run(client, records, d, Outcome.INTERRUPTED, PRUNED_AT[:2])
    run_e = _trial_run(client, records, e, Outcome.INTERRUPTED, PRUNED_AT)

    after = _searcher(records, url)
    after.restore(str(tmp_path / "searcher.pkl"))
    study = optuna.load_study(study_name="sync", storage=url)
    assert [t.state for t in study.trials[2:]] == [States.PRUNED, States.RUNNING, States.COMPLETE]
    assert after.suggest("f")[OPTUNA_TRIAL] == 3
    pruned, failed, completed = (client.get_run(r) for r in (run_c, run_d, run_e))
    assert (pruned.info.status, pruned.data.tags[store.TAG_OUTCOME]) == ("FINISHED", Outcome.PRUNED)
    assert [(m.step, m.value) for m in client.get_metric_history(run_c, OBJECTIVE)] == [*PRUNED_AT[:2], (100, 0.2)]
    assert (failed.info.status, failed.data.tags[store.TAG_OUTCOME]) == ("KILLED", Outcome.INTERRUPTED)
    assert (completed.info.status, completed.data.tags[store.TAG_OUTCOME]) == ("FINISHED", Outcome.COMPLETED)
    assert completed.data.metrics[OBJECTIVE] == study.trials[4].value == 0.4
    assert max(m.step for m in client.get_metric_history(run_e, OBJECTIVE)) == STEPS


def test_a_pack_member_pruned_before_the_kill_keeps_its_run_and_its_rung(tmp_path):
    """The case a killed packed sweep met: a pack started after Tune's snapshot, its second
    member pruned at a rung and told to the study, its run still open when the driver
    died. The member keeps its run (closed as pruned) and its place on the rung board;
    its partner, still training, is not marked FAIL: it leads the next pack Tune asks for,
    with its setting, Optuna trial and run (re-keyed to its place in that pack)."""
    client, records = _records(tmp_path)
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    space = _space(pack=2, sampler={"type": "random", "seed": 3})

    def packed():
        searcher = PackedOptunaSearch(pack=2, planned=6, space=DefineByRun(space), metric=OBJECTIVE, mode="max",
                                      sampler=optuna.samplers.RandomSampler(seed=3), records=records,
                                      study_name="sync", storage=optuna.storages.RDBStorage(url))
        searcher.set_search_properties(None, None, {})
        return searcher

    before = packed()
    before.suggest("a")
    before.save(str(tmp_path / "searcher.pkl"))
    members = before.suggest("b")[PACK_MEMBERS]
    for iteration, (first, second) in enumerate([(0.1, 0.15), (0.2, 0.05)], start=1):
        before.on_trial_result("b", {OBJECTIVE: first, "training_iteration": iteration,
                                     f"members/0/{OBJECTIVE}": first, f"members/0/{STATE}": "running",
                                     f"members/1/{OBJECTIVE}": second,
                                     f"members/1/{STATE}": PRUNED if iteration == 2 else "running"})
    opened = [_trial_run(client, records, {OPTUNA_TRIAL: m["number"], **m["params"]}, Outcome.INTERRUPTED,
                         PRUNED_AT[:2]) for m in members]

    after = packed()
    after.restore(str(tmp_path / "searcher.pkl"))
    study = optuna.load_study(study_name="sync", storage=url)
    assert [t.state for t in study.trials[2:]] == [States.RUNNING, States.PRUNED]
    partner, pruned = (client.get_run(r) for r in opened)
    assert (partner.info.status, partner.data.tags[store.TAG_OUTCOME]) == ("KILLED", Outcome.INTERRUPTED)
    assert (pruned.info.status, pruned.data.tags[store.TAG_OUTCOME]) == ("FINISHED", Outcome.PRUNED)
    assert pruned.data.metrics[OBJECTIVE] == 0.05
    assert after._settled == [3]
    assert [r for r in after.board_records() if r[0] >= 2] == [(3, 1, 0.15, True), (3, 2, 0.05, False)]
    again = after.suggest("c")[PACK_MEMBERS]
    assert again[0]["number"] == 2 and again[0]["params"] == pytest.approx(members[0]["params"])
    assert [m["number"] for m in again[1:]] == [4]  # filled with a new trial of the same structure
    assert client.get_run(opened[0]).data.tags[store.TAG_TRIAL_KEY] == member_key("c", 0)
    assert after.suggest("d") != after.FINISHED and after.suggest("e") == after.FINISHED  # 6 in all


def test_a_store_that_cannot_be_read_leaves_the_old_behaviour(tmp_path, caplog):
    """The restore does not fail when the runs cannot be read: the abandoned trials are
    marked FAIL as before, with a warning that says what was not checked."""
    broken = tmp_path / "mlflow.db"
    broken.write_text("not a database")
    records = TrialRecords(f"sqlite:///{broken}", "0", "parent")
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    before = _searcher(records, url)
    before.suggest("a")
    before.save(str(tmp_path / "searcher.pkl"))
    before.suggest("b")
    after = _searcher(records, url)
    after.restore(str(tmp_path / "searcher.pkl"))
    study = optuna.load_study(study_name="sync", storage=url)
    assert [t.state for t in study.trials] == [States.RUNNING, States.FAIL]
    assert "could not read the trial runs back from MLflow" in caplog.text


def _restored_with_trial_0(tmp_path):
    """A searcher restored from a snapshot taken when trial 0 ("a") had been asked."""
    client, records = _records(tmp_path)
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    before = _searcher(records, url)
    a = before.suggest("a")
    before.save(str(tmp_path / "searcher.pkl"))
    after = _searcher(records, url)
    after.restore(str(tmp_path / "searcher.pkl"))
    return client, records, url, a, after


def test_a_repeat_stopped_early_of_a_trial_completed_after_the_restore_stays_completed(tmp_path):
    """The kill-and-resume race a clean-clone run hit: trial 0's worker outlived the killed
    driver and closed its run as completed after the resumed driver read the runs back;
    Tune ran the trial again from an older checkpoint and ASHA stopped the repeat, whose run
    stays completed (its earlier attempt trained every step). The study must say COMPLETE,
    with the run's final objective and reports, not PRUNED."""
    client, records, url, a, after = _restored_with_trial_0(tmp_path)
    assert optuna.load_study(study_name="sync", storage=url).trials[0].state == States.RUNNING
    _trial_run(client, records, a, Outcome.COMPLETED, COMPLETED)  # closed after the restore

    after.on_trial_result("a", {OBJECTIVE: 0.05, "training_iteration": 1, "step": 50})
    after.on_trial_complete("a", {OBJECTIVE: 0.1, "training_iteration": 2, "step": 100})
    trial = optuna.load_study(study_name="sync", storage=url).trials[0]
    assert trial.state == States.COMPLETE
    assert trial.value == pytest.approx(0.4)
    assert trial.intermediate_values[8] == pytest.approx(0.4)


def test_a_trial_stopped_early_without_a_completed_run_is_pruned_after_a_restore(tmp_path):
    client, records, url, a, after = _restored_with_trial_0(tmp_path)
    _trial_run(client, records, a, Outcome.PRUNED, PRUNED_AT)
    after.on_trial_complete("a", {OBJECTIVE: 0.2, "training_iteration": 2, "step": 100})
    assert optuna.load_study(study_name="sync", storage=url).trials[0].state == States.PRUNED


def test_a_repeat_reporting_its_earlier_attempts_end_gets_every_report_from_the_run(tmp_path):
    """A trial run again reports, once, the end an earlier attempt trained (`ENDED_BEFORE`,
    `trainable._end_trained_before`) at Tune's first iteration: the study takes every report
    and the final objective from the run, not that report at iteration 1 (a clean-clone run
    of test_resume_after_the_driver_is_killed had the study one report short)."""
    from service.sweep.results import ENDED_BEFORE

    client, records, url, a, after = _restored_with_trial_0(tmp_path)
    _trial_run(client, records, a, Outcome.RUNNING, COMPLETED)  # its repeat's outbox sent it all
    end = {OBJECTIVE: 0.4, "training_iteration": 1, "step": STEPS, ENDED_BEFORE: 1.0}
    after.on_trial_result("a", end)
    after.on_trial_complete("a", end)
    trial = optuna.load_study(study_name="sync", storage=url).trials[0]
    assert trial.state == States.COMPLETE and trial.value == pytest.approx(0.4)
    assert trial.intermediate_values == pytest.approx({i: i * 0.05 for i in range(1, 9)})


def test_a_trial_the_study_pruned_before_the_kill_is_replayed_not_trained_again(tmp_path):
    """The driver told the study PRUNED at a rung and died before its worker closed the run
    (and before Tune's next snapshot, which still holds the trial as running). Before Tune
    restores the sweep, the resume closes the run as the study has it, so the trial is among
    the finished runs Tune gets the last report of (`finished_reports`, the trainable's
    replay) instead of a second training to an end the study never hears of (a clean-clone
    run of test_resume_after_kill had the study PRUNED beside a run completed so)."""
    from service.sweep.outcome import finished_reports
    from service.sweep.study_sync import settle_stored_study

    client, records = _records(tmp_path)
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    before = _searcher(records, url)
    a = before.suggest("a")
    before.on_trial_result("a", {OBJECTIVE: 0.1, "training_iteration": 1, "step": 50})
    before.on_trial_complete("a", {OBJECTIVE: 0.2, "training_iteration": 2, "step": 100})  # ASHA stopped it
    run_id = _trial_run(client, records, a, Outcome.INTERRUPTED, PRUNED_AT)  # closed so by the resume
    assert finished_reports(client, records.experiment_id, records.parent_run_id, STEPS) == {}

    assert settle_stored_study(url, "sync", records, _space()) == [0]
    replay = finished_reports(client, records.experiment_id, records.parent_run_id, STEPS)
    assert replay[0][OBJECTIVE] == pytest.approx(0.2) and replay[0]["step"] == 100  # its pruned end
    run = client.get_run(run_id)
    assert (run.info.status, run.data.tags[store.TAG_OUTCOME]) == ("FINISHED", Outcome.PRUNED)
    assert settle_stored_study(f"sqlite:///{tmp_path / 'none.db'}", "sync", records, _space()) == []
