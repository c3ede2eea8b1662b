"""The Optuna side of a sweep: the seeded sampler, the study's storage, and a searcher that
keeps the study consistent with what the sweep did, and with what Tune restores when a
sweep resumes.

A trial the scheduler (ASHA) stopped is PRUNED in the study, with the objective of every
report it made, the one it was stopped at included; a trial that trained all its steps is
COMPLETE with its final objective (Ray's `OptunaSearch` tells both COMPLETE and never
passes on the report a trial was stopped at). Tune does not tell a searcher why a trial
ended: one that ends without an error before its last step was stopped
(`service.sweep.results.stopped_early`, the rule the sweep's outcomes follow too).

Tune saves its trials and the searcher together, every few seconds; a driver killed in
between leaves the Optuna study (in a database: ``--optuna-storage``) a little ahead of
that snapshot:

- a trial asked just before the kill is RUNNING in the study (in a database) or only in
  its MLflow run, tagged with its number (an in-memory study restored from the snapshot),
  and unknown to the restored searcher: it is run again, with the same setting, under the
  same Optuna trial and MLflow run (`study_sync.reopen_trials`), as the next trials Tune
  asks for; and once the study holds the planned number of trials the searcher tells Tune
  it is finished, so a resumed sweep trains exactly its plan, each setting once;
- a trial that finished just before the kill is COMPLETE in the study but still running in
  Tune's snapshot: Tune runs it again from its checkpoint, and its reports and final
  ``tell`` hit a finished Optuna trial (`optuna.exceptions.UpdateFinishedTrialError`).
  The study already holds its result: `ResumableOptunaSearch` ignores the repeat;
- a trial whose worker closed its MLflow run just before the kill is finished in MLflow
  but was never told to the study: its result is read back from its run
  (`service.sweep.study_sync`) before the abandoned trials are marked FAIL;
- a trial the study finished whose worker had not closed its run yet (a pack's member
  pruned at a rung) has its run closed as the study has it (`study_sync.settle_told_runs`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Iterable

from ray.tune.result import TRAINING_ITERATION
from ray.tune.search.optuna import OptunaSearch

from service.errors import UserError
from service.formatting import redact
from service.sweep import kill_points
from service.sweep.race_trial import RACE_BLOCK
from service.sweep.results import ENDED_BEFORE, OPTUNA_TRIAL, RUN_CONFIGS, TRIAL_KEY, stopped_early
from service.sweep.study_sync import (
    TrialRecords,
    completed_run,
    extend_study,
    reopen_trials,
    settle_told_runs,
    sync_study,
    tell_run,
    unfinished_runs,
)

if TYPE_CHECKING:
    from service.search.space import SearchSpace
    from service.sweep.options import SweepOptions

logger = logging.getLogger(__name__)


def fail_abandoned_trials(study: Any, known: Iterable[int]) -> list[int]:
    """Mark FAIL every RUNNING trial of ``study`` whose number is not in ``known`` (the
    trials the restored searcher will finish); returns the numbers marked."""
    import optuna

    keep = set(known)
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    failed = []
    for trial in running:
        if trial.number not in keep:
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            failed.append(trial.number)
    return failed


class ResumableOptunaSearch(OptunaSearch):
    """`OptunaSearch` that survives being restored from a snapshot older than its study,
    and hands each trial its run configs, built once here in the driver from the space the
    define-by-run function holds (`service.search.sampler.DefineByRun`): a worker trains
    what it is given instead of rebuilding and re-checking the space. ``records`` says
    where the sweep's trial runs are, for a restore to read back results the study missed."""

    def __init__(self, *, records: TrialRecords | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._records = records
        self._synced: list[int] = []  # results read back from MLflow on restore
        self._restored = False  # restored from Tune's snapshot (a resumed sweep)
        self._settled: list[int] = []  # runs closed as the study had their trials on restore
        self._reopened: list[tuple[Any, str | None]] = []  # (trial, its run's key) to run again
        self._keys: dict[str, str] = {}  # Tune trial id -> the key of the run it reopens
        self._reopened_runs: dict[int, str] = {}  # Optuna trial number -> the run id of a trial to run again

    def suggest(self, trial_id: str) -> dict | str | None:
        from service.search.assign import active_params, run_configs

        space = getattr(self._space, "space", None)
        trials = self._ot_study.get_trials(deepcopy=False)
        if not trials:
            kill_points.reached("before_trials")
        if trial_id not in self._ot_trials:
            reopened = getattr(self, "_reopened", None)
            if reopened:
                self._ot_trials[trial_id], key = reopened.pop(0)
                if key:
                    self._keys[trial_id] = key
            elif space is not None and len(trials) >= space.trials:
                return self.FINISHED  # the plan is in the study (some trials finished after Tune's snapshot)
        config = super().suggest(trial_id)
        kill_points.reached("trial_started")
        if isinstance(config, dict) and trial_id in self._ot_trials:
            config = {**config, OPTUNA_TRIAL: self._ot_trials[trial_id].number}
        if isinstance(config, dict) and trial_id in getattr(self, "_keys", {}):
            config = {**config, TRIAL_KEY: self._keys[trial_id]}
        if isinstance(config, dict) and space is not None:
            params = active_params(space, {k: v for k, v in config.items() if k in space.params})
            try:
                config = {**config, RUN_CONFIGS: run_configs(space, params)}
            except Exception:  # noqa: BLE001 - the trial fails in its own run, where it is recorded
                pass
        return config

    def live_numbers(self) -> list[int]:
        """The Optuna trials this searcher will finish (the rest of the RUNNING ones were
        abandoned by a driver that died)."""
        return [t.number for t in self._ot_trials.values()] + [t.number for t, _ in getattr(self, "_reopened", [])]

    def restore(self, checkpoint_path: str) -> None:
        super().restore(checkpoint_path)
        self.resume_study()

    def resume_study(self) -> None:
        """Make the study agree with MLflow and with the trials Tune will run, for a resumed
        sweep: after `restore` from Tune's snapshot, or, for a sweep killed before Tune's
        first snapshot, on the study as the interrupted driver left it."""
        records, space = getattr(self, "_records", None), getattr(self._space, "space", None)
        self._synced, self._settled, self._reopened, self._restored = [], [], [], True
        self._keys = getattr(self, "_keys", {})
        if records is not None and space is not None:
            try:
                extended = extend_study(self._ot_study, records, space)
                self._synced = extended + sync_study(self._ot_study, records, space)
                self._settled = settle_told_runs(self._ot_study, records, space)
                self._reopened = self._reopen(records)
            except Exception as e:  # noqa: BLE001 - the store checked out a moment ago; the sweep goes on
                logger.warning("could not read the trial runs back from MLflow (%s); a trial that finished "
                               "there just before the interruption is marked FAIL in the Optuna study", e)
        if space is not None:
            self._ot_study.sampler = make_sampler(space, asked=len(self._ot_study.get_trials(deepcopy=False)))
        failed = fail_abandoned_trials(self._ot_study, self.live_numbers())
        if failed:
            logger.warning("Optuna trial(s) %s were started by the interrupted driver after Tune's "
                           "last snapshot; marked FAIL", failed)

    def _reopen(self, records: TrialRecords) -> list[tuple[Any, str | None]]:
        """The trials to run again (`study_sync.reopen_trials`), before any new one."""
        from service.tracking import store

        live = set(self.live_numbers())
        unfinished = unfinished_runs(store.client(records.tracking_uri), records, live)
        self._reopened_runs = {r.number: r.run_id for r in unfinished}
        return reopen_trials(self._ot_study, unfinished, live)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        from optuna.exceptions import UpdateFinishedTrialError

        if result.get(ENDED_BEFORE):  # an earlier attempt's end: its reports come from its run (`_complete`)
            return
        if RACE_BLOCK in result:  # a race: an intermediate value per block, at the block's number
            if not result[RACE_BLOCK]:
                return  # inside a first block (stopped there: its last report, at 0, in `_report_last`)
            result = {**result, TRAINING_ITERATION: result[RACE_BLOCK]}
        try:
            super().on_trial_result(trial_id, result)
        except UpdateFinishedTrialError:
            pass  # finished before the driver died: the study keeps its first result

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        self._complete(trial_id, result, error)
        kill_points.reached("trial_finished")

    def _complete(self, trial_id: str, result: dict | None, error: bool) -> None:
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is not None and self._frozen(ot_trial).state.is_finished():
            self._completed_trials.add(trial_id)  # told before the driver died
            return
        if ot_trial is not None and result and not error:
            if result.get(ENDED_BEFORE) and self._told_from_run(trial_id, ot_trial):
                return
            self._report_last(ot_trial, result)
            if self._stopped_early(result):
                if not self._completed_before(trial_id, ot_trial):
                    self._prune(trial_id, ot_trial)
                return
        super().on_trial_complete(trial_id, result, error)

    def _frozen(self, ot_trial: Any) -> Any:
        """The trial as the study holds it now (its state, its intermediate values)."""
        return self._ot_study.get_trials(deepcopy=False)[ot_trial.number]

    def _report_last(self, ot_trial: Any, result: dict) -> None:
        """Add the trial's last report to its intermediate values: Tune passes a searcher
        every report but the one its scheduler stops the trial at (ASHA: a pruned trial's
        last rung, a finished trial's ``max_t``)."""
        value, step = result.get(self.metric), result.get(RACE_BLOCK, result.get(TRAINING_ITERATION))
        if value is None or step is None or int(step) in self._frozen(ot_trial).intermediate_values:
            return
        try:
            ot_trial.report(float(value), int(step))
        except Exception as e:  # noqa: BLE001 - as Ray's searcher: telling Optuna never stops the sweep
            logger.warning("could not report the last result of Optuna trial %s: %s", ot_trial.number, e)

    def _stopped_early(self, result: dict) -> bool:
        """Whether the trial's last report ``result`` came before the end of its training
        (the scheduler stopped it there: `service.sweep.results.stopped_early`)."""
        space = getattr(self._space, "space", None)
        return space is not None and stopped_early(result, space.steps * len(space.task_configs()))

    def _completed_before(self, trial_id: str, ot_trial: Any) -> bool:
        """In a resumed sweep, a trial stopped early whose run an earlier attempt completed
        (`study_sync.completed_run`) is told COMPLETE as its run holds it; returns whether
        it was. A sweep never resumed reads nothing from MLflow here."""
        if not getattr(self, "_restored", False):
            return False
        return self._told_from_run(trial_id, ot_trial)

    def _told_from_run(self, trial_id: str, ot_trial: Any) -> bool:
        """Tell the study trial ``ot_trial`` COMPLETE as its run holds it (every report, the
        final objective: `study_sync.completed_run`) when an attempt trained all its steps;
        returns whether it did."""
        records, space = getattr(self, "_records", None), getattr(self._space, "space", None)
        if records is None or space is None:
            return False
        try:
            run = completed_run(records, space, ot_trial.number)
            if run is None:
                return False
            tell_run(self._ot_study, self._frozen(ot_trial), run)
        except Exception as e:  # noqa: BLE001 - the trial is then told PRUNED, as before
            logger.warning("could not read the run of Optuna trial %s back from MLflow: %s", ot_trial.number, e)
            return False
        self._completed_trials.add(trial_id)
        return True

    def _prune(self, trial_id: str, ot_trial: Any) -> None:
        """Tell the study a trial the scheduler stopped is PRUNED (Ray's `OptunaSearch` would
        tell it COMPLETE, its partial objective as final value)."""
        from optuna.trial import TrialState

        try:
            self._ot_study.tell(ot_trial, state=TrialState.PRUNED)
        except Exception as e:  # noqa: BLE001 - e.g. the grid sampler stopping the study after its last point
            if not self._frozen(ot_trial).state.is_finished():
                logger.warning("could not tell Optuna trial %s it was pruned: %s", ot_trial.number, e)
        self._completed_trials.add(trial_id)


def make_sampler(space: SearchSpace, asked: int = 0):
    """The seeded Optuna sampler named by the space (TPE by default). ``asked``: the trials
    the study holds already, for a resumed sweep's sampler: one restored from Tune's snapshot
    would replay its random stream from there and propose again the settings the interrupted
    driver asked after the snapshot, so its seed moves on by ``asked`` instead."""
    import optuna

    seed = space.sampler.seed if space.sampler.seed is None or not asked else space.sampler.seed + asked
    if space.sampler.type == "grid":
        return optuna.samplers.GridSampler(space.grid(), seed=seed)
    if space.sampler.type == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def optuna_storage(url: str):
    """An Optuna RDB storage (``postgresql+psycopg://…``, ``sqlite:///…``) for the study."""
    import optuna

    try:
        return optuna.storages.RDBStorage(url, heartbeat_interval=None)
    except ModuleNotFoundError as e:
        raise UserError(f"--optuna-storage {redact(url)}: missing driver ({e}); for PostgreSQL "
                        "install the 'postgres' extra: pip install 'nalu-sweep[postgres]'") from None
    except Exception as e:  # noqa: BLE001 - unreachable database, bad URL, ...
        raise UserError(f"cannot use the Optuna storage {redact(url)}: {e}") from None


def check_study(options: SweepOptions) -> None:
    """A new sweep must not silently continue an old study of the same name (Tune's
    OptunaSearch loads an existing study); a resumed one keeps Tune's restored searcher."""
    if not options.optuna_storage or options.resume:
        return
    storage = optuna_storage(options.optuna_storage)
    names = {s.study_name for s in storage.get_all_studies()}
    if options.name in names:
        raise UserError(f"an Optuna study named {options.name!r} already exists in "
                        f"{redact(options.optuna_storage)}; start a new sweep with --name {options.name}-2")

