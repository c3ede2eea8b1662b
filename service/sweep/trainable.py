"""The trial as Ray Tune runs it, inside a worker: open (or reopen) its MLflow run, resume
from its latest checkpoint, train, and close the run with the right outcome; or, with
``pack > 1``, the same for every trial of a pack (`execute_pack`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from service import startup
from service.formatting import settings_label
from service.search.assign import active_params, run_configs
from service.search.space import SearchSpace
from service.sweep.cluster import gpu_ids, node_ip
from service.sweep.logged_params import compile_params, regularizer_params
from service.sweep.results import (
    DONE,
    ENDED_BEFORE,
    OPTUNA_TRIAL,
    PACK_MEMBERS,
    PRUNED,
    RUN_CONFIGS,
    RUNNING,
    STEP,
    last_report,
    member_key,
    trial_key,
)
from service.sweep.rungs import SweepGone, board_judge
from service.tracking import helper, plot_server, runs, store
from service.tracking.store import Outcome

if TYPE_CHECKING:  # the training code loads in the worker, never in the sweep's driver
    from service.sweep.pack import PackState
    from service.sweep.pack_race import PackRaceState
    from service.sweep.trial_state import TrialState

TRAINABLE_NAME = "nalu_sweep_trial"
JOURNAL_WAIT_S = 120.0  # how long a repeat waits for an earlier attempt's writes to arrive


@dataclass(frozen=True)
class TrialSettings:
    """Everything a trial needs besides its sampled parameters and run configs; plain data
    (pickled). ``space`` was checked by the driver; ``task_params`` are logged with every
    trial."""

    space: dict[str, Any]
    task_params: dict[str, Any]
    sweep: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    threads: int
    # the driver's `helper.announced` file: where it answers this trial's tracking calls itself
    # (`driver_tracking`, a sweep on this machine); None where the worker uses its own helper
    announcement: str | None = None
    # a resumed sweep's trials whose runs finished before the interruption, by Optuna trial
    # number: their last report (`finished_reports`), replayed instead of training again
    replay: dict[int, dict[str, float]] = field(default_factory=dict)


def make_trainable(settings: TrialSettings):
    """The Tune function trainable (a closure over ``settings``, pickled by value): one
    trial, or with ``pack > 1`` one pack of trials (`execute_pack`)."""
    execute = execute_pack if settings.space.get("pack", 1) > 1 else execute_trial

    def nalu_sweep_trial(config: dict[str, Any]) -> None:
        execute(config, settings)

    nalu_sweep_trial.__name__ = TRAINABLE_NAME
    return nalu_sweep_trial


def _open_run(settings: TrialSettings, space: SearchSpace, trial_key: str, params: dict[str, Any],
              configs: dict[str, Any] | None, tags: dict[str, str] | None = None) -> runs.TrialRun:
    """Open (or reopen) a trial's MLflow child run, named by its settings, with its searched,
    task and regulariser parameters."""
    logged = {**params, **settings.task_params,
              **({**regularizer_params(configs), **compile_params(configs)} if configs else {})}
    return runs.TrialRun.open(
        settings.tracking_uri, settings.experiment_id, settings.parent_run_id,
        trial_key=trial_key, run_name=settings_label(params, list(space.params)), params=logged,
        tags={store.TAG_SWEEP: settings.sweep, store.TAG_NODE: node_ip(), store.TAG_GPU_IDS: gpu_ids(), **(tags or {})},
        client=helper.shared(settings.tracking_uri),
    )


def _report_checkpoint(metrics: dict[str, Any], state: TrialState | PackState | PackRaceState) -> None:
    """`tune.report` with a checkpoint: ``state`` saved to a temporary directory that Tune
    copies to the sweep's storage."""
    import tempfile

    from ray import tune

    with tempfile.TemporaryDirectory(prefix="nalu-sweep-checkpoint-") as tmp:
        state.save(tmp)
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))


def _buildable_configs(space: SearchSpace, params: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return run_configs(space, params)
    except Exception:  # noqa: BLE001 - the trial then fails in its own run, where it is recorded
        return None


def execute_trial(config: dict[str, Any], settings: TrialSettings) -> None:
    """Open (or reopen) the trial's MLflow run, train, and close the run with the right
    outcome whatever happens: ``completed``, ``pruned`` (ASHA raised inside a report
    before the end), or ``failed`` (an exception; Tune may retry, reusing the run).

    A retried or resumed trial gets its latest checkpoint from `tune.get_checkpoint` and
    continues from it (tagged ``nalu_sweep.resumed_from_step``); checkpoints are written to
    a temporary directory that `tune.report` copies to the sweep's storage."""
    helper.use_announcement(settings.announcement)
    helper.shared(settings.tracking_uri)  # MLflow loads in its own process while torch loads here
    startup.loading()
    import torch
    from ray import tune

    from service.sweep.trial import TrialProgress, run_trial
    from service.sweep.trial_state import TrialState

    startup.loaded()

    context = tune.get_context()
    trial_id = context.get_trial_id()  # read first: stopping may interrupt anything later
    number = config.get(OPTUNA_TRIAL)
    if number in settings.replay:
        # finished before the driver died, after Tune's last snapshot (which restored it as
        # running): its run and the Optuna study hold its result; Tune gets its last report
        tune.report(dict(settings.replay[number]))
        return
    torch.set_num_threads(settings.threads)
    plot_server.start()  # matplotlib loads in its own process while the trial trains
    space = SearchSpace.model_validate(settings.space)  # checked in full by the driver
    params = active_params(space, {k: v for k, v in config.items() if k in space.params})
    configs = config.get(RUN_CONFIGS) or _buildable_configs(space, params)
    tracker = _open_run(settings, space, trial_key(trial_id, config), params, configs,
                        {store.TAG_OPTUNA_TRIAL: str(number)} if number is not None else None)
    progress = TrialProgress()
    outcome = Outcome.FAILED
    try:
        if space.scheduler.type == "race":  # seed block after seed block (service.sweep.race_trial)
            from service.sweep.race_trial import run_race

            run_race(params, space, configs or run_configs(space, params), tune.get_checkpoint(), tune.report,
                     tracker=tracker, progress=progress, report_checkpoint=_report_checkpoint)
            outcome = Outcome.COMPLETED
            return
        if (final := _end_trained_before(tracker, space)) is not None:
            tune.report({**final, ENDED_BEFORE: 1.0})  # the earlier attempt's end: no training to stop early
            outcome = Outcome.COMPLETED
            return
        resume = None
        checkpoint = tune.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as directory:
                resume = TrialState.load(directory, configs or run_configs(space, params))
            tracker.set_tags({store.TAG_RESUMED_FROM: str(resume.step)})
        run_trial(params, space, tune.report, configs=configs, tracker=tracker, progress=progress,
                  resume=resume, report_checkpoint=_report_checkpoint)
        outcome = Outcome.COMPLETED
    except SystemExit:  # Tune's way of stopping a trial from inside `tune.report`
        outcome = Outcome.COMPLETED if progress.completed or _trained_before(tracker, space) else Outcome.PRUNED
        raise
    except Exception as e:
        tracker.set_tags({store.TAG_ERROR: f"{type(e).__name__}: {e}"[:5000]})
        raise
    finally:
        tracker.close(outcome)


def _trained_before(tracker: runs.TrialRun, space: SearchSpace) -> bool:
    """Whether an earlier attempt of the trial trained all its steps (its run holds the last
    one). A resumed sweep runs again a trial whose worker finished just before the driver
    died; a scheduler stopping that repeat does not undo the result its run and the Optuna
    study already hold."""
    last = tracker.resumed_from_step
    return last is not None and last >= space.steps * len(space.task_configs())


def _end_trained_before(tracker: runs.TrialRun, space: SearchSpace) -> dict[str, float] | None:
    """The last report of an earlier attempt that trained all the trial's steps, rebuilt
    from its run, for a repeat to report instead of training again (None: train).

    A resumed sweep runs again a trial whose earlier attempt finished after Tune's last
    snapshot, and its result may not have reached MLflow when the resumed driver read the
    runs back (it was still in that attempt's journal, which this attempt's outbox sends
    first). Trained again, the repeat could be stopped by a scheduler restored older, and
    the driver, reading MLflow before this worker's writes arrived, told the study PRUNED
    while the run stayed completed. Reporting the end makes Tune, the study and the run
    agree: the trial completed, with the objective its run holds."""
    if not _trained_before(tracker, space):
        return None
    metrics = tracker.latest_metrics(timeout_s=JOURNAL_WAIT_S)
    return None if metrics is None else last_report(metrics, space.steps * len(space.task_configs()))


def _replay(member: Any, settings: TrialSettings, space: SearchSpace) -> None:
    """A member whose run finished before the driver died, after Tune's last snapshot
    (which restored its pack as running), keeps that end: its last report, as done or
    pruned, is the pack's to report; it is neither trained nor its run reopened."""
    last = settings.replay.get(member.number)
    if last is None:
        return
    member.metrics = {k: v for k, v in last.items() if k != STEP}
    member.step = int(last[STEP])
    member.state = DONE if member.step >= space.steps * len(space.task_configs()) else PRUNED


def execute_pack(config: dict[str, Any], settings: TrialSettings) -> None:
    """A pack of trials (`service.sweep.pack`): each member's MLflow run opened (or reopened)
    and closed as its own trial's; a member ASHA stops is judged by the sweep's rung board
    (`service.sweep.rungs`) and closed as pruned inside `run_pack`; whatever ends the pack
    closes the runs still open: failed on an exception (Tune may retry the pack), interrupted
    when the sweep's board died under it (`SweepGone`: its driver was killed).

    A retried or resumed pack continues from its latest `PackState`: members pruned before
    it stay closed, the others continue from their own trainer checkpoints."""
    helper.use_announcement(settings.announcement)
    helper.shared(settings.tracking_uri)  # MLflow loads in its own process while torch loads here
    startup.loading()
    import torch
    from ray import tune

    from service.sweep.pack import Member, PackState, run_pack
    from service.sweep.pack_race import PackRaceState, run_pack_race
    from service.sweep.race_board import BoardRace

    startup.loaded()

    trial_id = tune.get_context().get_trial_id()
    torch.set_num_threads(settings.threads)
    plot_server.start()
    space = SearchSpace.model_validate(settings.space)
    members = []
    for index, m in enumerate(config[PACK_MEMBERS]):
        params = active_params(space, m["params"])
        members.append(Member(index, int(m["number"]), params,
                              m.get(RUN_CONFIGS) or _buildable_configs(space, params)))
        _replay(members[-1], settings, space)
    racing = space.scheduler.type == "race"  # seed block after seed block (service.sweep.pack_race)
    resume, problem = None, None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None and all(m.configs for m in members):
        try:
            with checkpoint.as_directory() as directory:
                resume = (PackRaceState if racing else PackState).load(directory, [m.configs for m in members])
        except Exception as e:  # noqa: BLE001 - recorded in the members' runs below
            problem = e
    for m in members:
        if m.state == RUNNING and (resume is None or resume.states[m.index] == RUNNING):
            m.tracker = _open_run(settings, space, member_key(trial_id, m.index), m.params, m.configs, {
                store.TAG_PACK_GROUP: trial_id, store.TAG_PACK_INDEX: str(m.index),
                store.TAG_OPTUNA_TRIAL: str(m.number)})
            if resume is not None:  # a racing pack's is by blocks, as a lone racing trial's
                m.tracker.set_tags({store.TAG_RESUMED_FROM: str(resume.blocks if racing else resume.step)})
    try:
        if problem is not None:
            raise problem
        for m in members:
            m.configs = m.configs or run_configs(space, m.params)
        if racing:
            run_pack_race(members, space, tune.report, BoardRace(settings.sweep), trial_id, resume=resume,
                          report_checkpoint=_report_checkpoint)
            return
        judge = board_judge(settings.sweep) if space.scheduler.type == "asha" else None
        run_pack(members, space, tune.report, judge=judge, resume=resume, report_checkpoint=_report_checkpoint)
    except SystemExit:  # Tune stopped the pack (the sweep is ending): as for a lone trial
        for m in members:
            if m.tracker is not None:
                m.tracker.close(Outcome.COMPLETED if m.state == DONE else Outcome.PRUNED)
        raise
    except SweepGone:  # the driver died (or the sweep ended) under the pack: not the settings' fault
        for m in members:
            if m.tracker is not None:
                m.tracker.close(Outcome.INTERRUPTED)  # no-op for a run closed already
        raise
    except Exception as e:
        for m in members:
            if m.tracker is not None and m.state == RUNNING:
                m.tracker.set_tags({store.TAG_ERROR: f"{type(e).__name__}: {e}"[:5000]})
        raise
    finally:
        for m in members:
            if m.tracker is not None:
                m.tracker.close(Outcome.FAILED)  # no-op for a run closed already
