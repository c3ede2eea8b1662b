"""Tell the Optuna study the results that reached MLflow but not the study before a driver
died.

A trial's worker closes its own MLflow run (completed, or pruned), and only then does the
driver tell Optuna. A driver killed in between leaves the trial finished in MLflow but
RUNNING in a study kept in a database (``--optuna-storage``), or absent from the in-memory
study that Tune restores from its last snapshot. On ``--resume`` the searcher reads such
results back from the runs (tagged with their Optuna trial number) and tells the study:
the objective at every report, then COMPLETE with the final objective or PRUNED. Without
this the study would mark the trial FAIL (or never know it) while MLflow keeps its result,
and neither the sampler nor the rung board would learn from it.

The other way round (`settle_told_runs`): a pack's member pruned at a rung is told to the
study as soon as the driver gets the pack's report, while the member's worker closes its
run beside the training. A driver killed in between leaves the trial PRUNED in the study
and its run open; the resume closes it as interrupted, and a pack unknown to Tune's
snapshot never reopens it. Such a run is closed as the study finished its trial (pruned,
or completed, with the last objective the study holds), so that MLflow and the study
still agree member by member.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.scoring.objective import OBJECTIVE
from service.search.assign import typed_params
from service.search.sampler import suggest_params
from service.search.space import SearchSpace
from service.tracking import runs, store
from service.tracking.store import Outcome

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrialRecords:
    """Where a sweep's trial runs are (kept with the searcher, so a restored one finds them)."""

    tracking_uri: str
    experiment_id: str
    parent_run_id: str


@dataclass(frozen=True)
class FinishedRun:
    """What a closed trial run says about its Optuna trial."""

    run_id: str
    number: int  # its Optuna trial number, as tagged when the run was opened
    pruned: bool
    params: dict[str, str]  # as logged (strings)
    value: float | None  # the final objective (a completed trial)
    reports: dict[int, float]  # Tune's training_iteration -> the objective reported there


def report_step(space: SearchSpace, report: int) -> int:
    """The global training step of report ``report`` (the inverse of `report_number`)."""
    task, index = divmod(report - 1, space.reports_per_task())
    return task * space.steps + min((index + 1) * space.eval_every, space.steps)


def report_number(space: SearchSpace, step: int) -> int | None:
    """The report (Tune's ``training_iteration``) made at global training step ``step``,
    or None for a task's step 0 (logged, never reported)."""
    task, within = divmod(step, space.steps)
    if within == 0:  # the end of task `task - 1`
        task, within = task - 1, space.steps
    if task < 0:
        return None
    return task * space.reports_per_task() + math.ceil(within / space.eval_every)


def reported_values(space: SearchSpace, history: list[Any]) -> dict[int, float]:
    """``{report: objective}`` from a run's objective history. At a task boundary the run
    holds two points: the finished task's objective (reported) and the next task's step-0
    objective, the minimum over tasks including one not trained yet, so never above the
    first: the larger is the one reported. Points repeated by a retried attempt are equal."""
    out: dict[int, float] = {}
    for metric in history:
        number = report_number(space, int(metric.step))
        if number is not None and math.isfinite(metric.value):
            out[number] = max(out.get(number, -math.inf), float(metric.value))
    return out


def finished_runs(client: Any, records: TrialRecords, space: SearchSpace,
                  missing: Callable[[int], bool]) -> list[FinishedRun]:
    """The sweep's trial runs closed as completed or pruned whose Optuna trial number is
    ``missing`` from the study (only their objective histories are read)."""
    out = []
    for run in runs.trial_runs(client, records.experiment_id, records.parent_run_id):
        tags = run.data.tags
        outcome = tags.get(store.TAG_OUTCOME)
        number = tags.get(store.TAG_OPTUNA_TRIAL, "")
        if run.info.status != "FINISHED" or outcome not in (Outcome.COMPLETED, Outcome.PRUNED) or not number.isdigit():
            continue
        if not missing(int(number)):
            continue
        history = store.retry(lambda run=run: client.get_metric_history(run.info.run_id, OBJECTIVE))
        reports = reported_values(space, history)
        value = run.data.metrics.get(OBJECTIVE)
        out.append(FinishedRun(run.info.run_id, int(number), outcome == Outcome.PRUNED, dict(run.data.params),
                               None if outcome == Outcome.PRUNED else value, reports))
    return sorted(out, key=lambda r: r.number)


def completed_run(records: TrialRecords, space: SearchSpace, number: int) -> FinishedRun | None:
    """The run of Optuna trial ``number`` when an attempt of it trained all its steps, else
    None. In a resumed sweep, Tune may run again a trial whose earlier attempt trained all
    its steps after the restore read the runs back (its worker outlived the killed driver,
    or died before it closed the run): the repeat's worker then closes the run as completed
    even when the scheduler stops the repeat early (`service.sweep.trainable`), and the
    study must agree. The run may still be open when the scheduler stops the repeat, so the
    final report in its objective history decides, not its status."""
    client = store.client(records.tracking_uri)
    final = space.reports_per_task() * len(space.task_configs())
    for run in runs.trial_runs(client, records.experiment_id, records.parent_run_id):
        if run.data.tags.get(store.TAG_OPTUNA_TRIAL, "") != str(number):
            continue
        if run.data.tags.get(store.TAG_OUTCOME) == Outcome.PRUNED and run.info.status == "FINISHED":
            continue
        history = store.retry(lambda run=run: client.get_metric_history(run.info.run_id, OBJECTIVE))
        reports = reported_values(space, history)
        if final in reports:
            return FinishedRun(run.info.run_id, number, False, dict(run.data.params), reports[final], reports)
    return None


def tell_run(study: Any, frozen: Any, run: FinishedRun) -> None:
    """Tell ``study`` its RUNNING trial ``frozen`` ended as ``run`` holds it: the reports it
    is missing, then COMPLETE with the final objective or PRUNED."""
    import optuna

    trial = optuna.trial.Trial(study, frozen._trial_id)
    for step, value in sorted(run.reports.items()):
        if step not in frozen.intermediate_values:
            trial.report(value, step)
    if run.pruned:
        study.tell(frozen.number, state=optuna.trial.TrialState.PRUNED)
    else:
        study.tell(frozen.number, run.value)


def _add(study: Any, run: FinishedRun, space: SearchSpace) -> None:
    import optuna

    fixed = optuna.trial.FixedTrial(typed_params(space, run.params))
    params = suggest_params(fixed, space)
    state = optuna.trial.TrialState.PRUNED if run.pruned else optuna.trial.TrialState.COMPLETE
    study.add_trial(optuna.trial.create_trial(
        params=params, distributions=fixed.distributions, value=run.value, state=state,
        intermediate_values=run.reports))


def tell_finished(study: Any, finished: list[FinishedRun], space: SearchSpace) -> tuple[list[int], dict[str, int]]:
    """Tell ``study`` every result in ``finished`` it is missing: a RUNNING trial gets its
    reports and final state; a trial the study does not have (an in-memory study restored
    from an older snapshot) is added, under the next free number. Returns the numbers told
    and ``{run id: new number}`` of the trials added."""
    import optuna

    trials = study.get_trials(deepcopy=False)
    count = len(trials)
    told, added = [], {}
    for run in finished:
        try:
            if run.number >= count:
                _add(study, run, space)
                number, count = count, count + 1
                added[run.run_id] = number
            elif trials[run.number].state == optuna.trial.TrialState.RUNNING:
                tell_run(study, trials[run.number], run)
                number = run.number
            else:
                continue
        except Exception as e:  # noqa: BLE001 - the study then treats it as abandoned (FAIL)
            logger.warning("could not tell Optuna trial %s the result of MLflow run %s: %s", run.number, run.run_id, e)
            continue
        told.append(number)
    return told, added


@dataclass(frozen=True)
class UnfinishedRun:
    """A trial run the interruption left unfinished (open, or closed as interrupted)."""

    run_id: str
    number: int  # its Optuna trial number
    trial_key: str  # its `TAG_TRIAL_KEY`: a re-run of its trial reopens it by this key
    params: dict[str, str]  # as logged (strings)


def unfinished_runs(client: Any, records: TrialRecords, skip: set[int]) -> list[UnfinishedRun]:
    """The sweep's trial runs left open or closed as interrupted whose Optuna trial number
    is not in ``skip`` (the trials Tune's snapshot knows: Tune runs those again itself), by
    number."""
    out = []
    for run in runs.trial_runs(client, records.experiment_id, records.parent_run_id):
        tags = run.data.tags
        number = tags.get(store.TAG_OPTUNA_TRIAL, "")
        unfinished = run.info.status in ("RUNNING", "SCHEDULED") or tags.get(store.TAG_OUTCOME) == Outcome.INTERRUPTED
        if unfinished and number.isdigit() and int(number) not in skip:
            out.append(UnfinishedRun(run.info.run_id, int(number), tags.get(store.TAG_TRIAL_KEY, ""),
                                     dict(run.data.params)))
    return sorted(out, key=lambda r: r.number)


def reopen_trials(study: Any, unfinished: list[UnfinishedRun], live: set[int]) -> list[tuple[Any, str | None]]:
    """The study's RUNNING trials an interrupted driver asked and Tune's snapshot does not
    hold (not in ``live``), as ``(trial, the key of its run or None)``, to be run again with
    the same setting, under the same number and run."""
    import optuna

    keys = {r.number: r.trial_key for r in unfinished}
    return [(optuna.trial.Trial(study, t._trial_id), keys.get(t.number)) for t in study.get_trials(deepcopy=False)
            if t.state == optuna.trial.TrialState.RUNNING and t.number not in live]


def extend_study(study: Any, records: TrialRecords, space: SearchSpace) -> list[int]:
    """Give an in-memory study restored from Tune's snapshot the trials asked after it, in
    the order of their runs' numbers: a finished run's result is added, an unfinished run's
    setting is asked again (RUNNING, for `reopen_trials`); a number that moved (a trial
    asked without a run) is tagged on its run. Returns the numbers of the finished ones."""
    client = store.client(records.tracking_uri)
    known = len(study.get_trials(deepcopy=False))
    finished = {r.number: r for r in finished_runs(client, records, space, lambda n: n >= known)}
    unfinished = {r.number: r for r in unfinished_runs(client, records, set(range(known)))}
    told = []
    for number in sorted({*finished, *unfinished}):
        if number in finished:
            run_id = finished[number].run_id
            _add(study, finished[number], space)
            told.append(len(study.get_trials(deepcopy=False)) - 1)
        else:
            run_id = unfinished[number].run_id
            study.enqueue_trial(typed_params(space, unfinished[number].params), skip_if_exists=False)
            study.ask()
        now = len(study.get_trials(deepcopy=False)) - 1
        if now != number:
            store.retry(lambda run_id=run_id, now=now: client.set_tag(run_id, store.TAG_OPTUNA_TRIAL, str(now)))
    if told:
        logger.warning("Optuna trial(s) %s finished in MLflow before the interrupted driver could tell the study; "
                       "told it now from their runs", told)
    return told


def sync_study(study: Any, records: TrialRecords, space: SearchSpace) -> list[int]:
    """`tell_finished` with the runs of ``records`` whose trials the study is missing; a
    trial added under a new number has its run's tag updated to it. Returns the Optuna
    trial numbers told."""
    import optuna

    trials = study.get_trials(deepcopy=False)

    def missing(number: int) -> bool:
        return number >= len(trials) or trials[number].state == optuna.trial.TrialState.RUNNING

    client = store.client(records.tracking_uri)
    told, added = tell_finished(study, finished_runs(client, records, space, missing), space)
    for run_id, number in added.items():
        store.retry(lambda run_id=run_id, number=number: client.set_tag(run_id, store.TAG_OPTUNA_TRIAL, str(number)))
    if told:
        logger.warning("Optuna trial(s) %s finished in MLflow before the interrupted driver could tell the study; "
                       "told it now from their runs", told)
    return told


def settle_told_runs(study: Any, records: TrialRecords, space: SearchSpace) -> list[int]:
    """Close as ``study`` finished their trials (PRUNED or COMPLETE) the trial runs left
    open or closed as interrupted, logging the trial's last objective where the run lacks
    it. Returns the Optuna trial numbers whose runs were closed."""
    import optuna

    States = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    client = store.client(records.tracking_uri)
    settled = []
    for run in runs.trial_runs(client, records.experiment_id, records.parent_run_id):
        tags = run.data.tags
        number = tags.get(store.TAG_OPTUNA_TRIAL, "")
        open_run = run.info.status in ("RUNNING", "SCHEDULED")
        if not (open_run or tags.get(store.TAG_OUTCOME) == Outcome.INTERRUPTED) or not number.isdigit():
            continue
        if int(number) >= len(trials) or trials[int(number)].state not in (States.PRUNED, States.COMPLETE):
            continue
        trial = trials[int(number)]
        reports = trial.intermediate_values
        if trial.state == States.COMPLETE:
            outcome, value, step = Outcome.COMPLETED, trial.value, space.steps * len(space.task_configs())
        else:
            outcome = Outcome.PRUNED
            last = max(reports, default=None)
            value, step = (None, 0) if last is None else (reports[last], report_step(space, last))
        metrics = {OBJECTIVE: value} if value is not None else None
        runs.settle_trial_run(client, run.info.run_id, outcome, metrics, step)
        settled.append(trial.number)
    if settled:
        logger.warning("Optuna trial(s) %s finished in the study before the interrupted driver's workers could "
                       "close their MLflow runs; closed them as the study has them", sorted(settled))
    return sorted(settled)


def settle_stored_study(url: str, name: str, records: TrialRecords, space: SearchSpace) -> list[int]:
    """`settle_told_runs` with the study kept in the database at ``url``, before Tune restores
    the sweep: a trial the interrupted driver told the study (PRUNED at a rung, say) just
    before it died may still be running in Tune's last snapshot, which would train it again,
    to an end the study never hears of. Its run, closed now as the study has it, is among
    the finished runs whose last report Tune gets back instead (`TrialSettings.replay`).
    Nothing happens when the study cannot be read (the searcher says why, later)."""
    import optuna

    try:
        study = optuna.load_study(study_name=name, storage=url)
    except Exception as e:  # noqa: BLE001 - no study yet, or a storage the searcher will refuse with a message
        logger.debug("no stored study to settle runs with: %s", e)
        return []
    return settle_told_runs(study, records, space)

