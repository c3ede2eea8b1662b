"""Run a sweep: Ray Tune schedules trials, Optuna (TPE) proposes them, MLflow records them.

- `OptunaSearch` with a seeded TPE sampler over the define-by-run space, capped at
  ``concurrency`` trials in flight (TPE proposes each new trial from the finished ones);
  ``ASHAScheduler`` on the intermediate objective (or no scheduler); ``reuse_actors=True``
  so trials do not pay a process start-up each; failed trials are retried
  (``FailureConfig``).
- A local Ray is started by default; ``address`` connects to a running cluster.
- ``resume`` continues an interrupted sweep with ``Tuner.restore`` (the searcher's state is
  restored with it, and the Optuna study is made to agree with it and with MLflow:
  `service.sweep.searcher`, `service.sweep.study_sync`);
  MLflow child runs left RUNNING by the crash are closed first (after the writes their
  workers journalled on this machine but never sent are sent), and a resumed trial
  reopens its own run (see `service.tracking.runs.TrialRun`).
- Trials checkpoint to the Tune storage (`service.sweep.trial_state`); a retried or
  resumed trial continues from its latest checkpoint instead of starting over.
- With ``pack: K > 1`` a Tune trial is a pack of up to K Optuna trials trained as one
  computation (`service.sweep.pack_search`, `service.sweep.pack`); Tune's scheduler is
  FIFO and ASHA judges each member on the sweep's rung board (`service.sweep.rungs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from service import startup
from service.errors import UserError
from service.scoring.objective import OBJECTIVE
from service.search.sampler import DefineByRun
from service.search.space import SearchSpace
from service.sweep.cluster import (
    check_resources,
    init_ray,
    quiet_libraries,
    quiet_optuna,
    stop_ray,
    wait_for_released_trials,
)
from service.sweep.logged_params import task_params
from service.sweep.options import SweepOptions  # the CLI's flags, resolved (named here too)
from service.sweep.outcome import finished_reports, record_end, tune_trials
from service.sweep.race_board import release_race_board
from service.sweep.rungs import release_board
from service.sweep.study_sync import TrialRecords, settle_stored_study
from service.sweep.trainable import TrialSettings, make_trainable
from service.tracking import driver_tracking, helper, runs, store
from service.tracking.links import describe_experiment
from service.tracking.store import Outcome

DEFAULT_STORAGE_DIR = "runs"


@dataclass
class SweepSummary:
    name: str
    experiment_id: str
    parent_run_id: str
    tracking_uri: str
    storage_path: str
    outcome: str
    trials: dict[str, int]
    best_objective: float | None
    ray_left_running: bool = False  # a local Ray this sweep started and kept (`SweepOptions.keep_ray`)
    ray_connected: bool = False  # still connected to the running cluster it joined (`keep_ray`)


def default_storage_path() -> str:
    return str((Path.cwd() / DEFAULT_STORAGE_DIR).resolve())


def resolve_storage_path(option: str | None) -> str:
    """An absolute local path, or a URI (``s3://…``) as given."""
    if not option:
        return default_storage_path()
    if "://" in option:
        return option.rstrip("/")
    return str(Path(option).expanduser().resolve())


def experiment_path(storage_path: str, name: str) -> str:
    return f"{storage_path.rstrip('/')}/{name}"


# -- the trial, inside a Ray worker ------------------------------------------------------------------


# -- the driver -----------------------------------------------------------------------------------------


def _trial_name(trial: Any) -> str:
    return f"trial-{trial.trial_id}"


def _tuner(space: SearchSpace, options: SweepOptions, trainable: Any, records: TrialRecords):
    """A new Tune experiment; for a resumed sweep that Tune never snapshotted (its driver
    was killed before the first snapshot) its searcher first picks up the study and the
    runs the interrupted driver left (`ResumableOptunaSearch.resume_study`)."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from service.sweep.display import LiveProgress
    from service.sweep.metrics import SweepMetrics
    from service.sweep.pack_search import PackedOptunaSearch, race_spec, rung_spec
    from service.sweep.result_log import result_logger
    from service.sweep.searcher import (
        ResumableOptunaSearch,
        make_sampler,
        optuna_storage,
    )

    study: dict[str, Any] = {}
    if options.optuna_storage:
        study = {"storage": optuna_storage(options.optuna_storage), "study_name": options.name}
    args = dict(space=DefineByRun(space), metric=OBJECTIVE, mode="max", sampler=make_sampler(space),
                records=records, **study)
    # packs of trials: ASHA judges each member itself (service.sweep.rungs); a race runs on the
    # sweep's race board (service.sweep.race_board)
    if space.pack > 1:
        searcher = PackedOptunaSearch(pack=space.pack, planned=space.trials, rungs=rung_spec(space, options.name),
                                      race=race_spec(space, options.name, options.storage_path),
                                      **args)
        scheduler = FIFOScheduler()
    elif space.scheduler.type == "asha":
        searcher = ResumableOptunaSearch(**args)
        scheduler = ASHAScheduler(
            time_attr="training_iteration", metric=OBJECTIVE, mode="max",
            max_t=space.total_reports(), grace_period=space.grace_reports(),
            reduction_factor=space.scheduler.reduction_factor, brackets=space.scheduler.brackets,
        )
    elif space.scheduler.type == "race":  # seed blocks, decided against the incumbent
        from service.sweep.race_scheduler import RaceScheduler

        searcher = ResumableOptunaSearch(**args)
        race = race_spec(space, options.name, options.storage_path)
        scheduler = RaceScheduler(race.race, records, race.state_path, rungs=race.rungs)
    else:
        searcher = ResumableOptunaSearch(**args)
        scheduler = FIFOScheduler()
    if options.resume:
        searcher.resume_study()
    resources = {"cpu": space.resources.cpus, "gpu": space.resources.gpus}
    return tune.Tuner(
        tune.with_resources(trainable, resources),
        tune_config=tune.TuneConfig(
            search_alg=searcher, scheduler=scheduler, num_samples=space.trials,
            max_concurrent_trials=space.concurrency, reuse_actors=True,
            trial_name_creator=_trial_name, trial_dirname_creator=_trial_name,
        ),
        run_config=tune.RunConfig(
            name=options.name, storage_path=options.storage_path, verbose=0,
            failure_config=tune.FailureConfig(max_failures=space.retries),
            # every checkpoint is kept (a trial's is small): Tune snapshots its experiment state
            # on its own period, and a resume after a crash finds every checkpoint that state
            # names (with a retention, Tune forces a snapshot each `num_to_keep` checkpoints,
            # warns that it does so too often, and a resume after a crash may name one deleted)
            checkpoint_config=tune.CheckpointConfig(num_to_keep=None),
            # the terminal's progress board; each trial's result.json, which
            # `tune.ExperimentAnalysis` and `Tuner.restore(...).get_results()` read, written where
            # a killed driver cannot leave it behind (`result_log`; Tune's CSV and TensorBoard
            # loggers stay off); the sweep's figures as Ray metrics (Prometheus)
            callbacks=[LiveProgress(options.name), result_logger(options.storage_path),
                       SweepMetrics(options.name, space.seeds, space.steps * len(space.task_configs()))],
        ),
    )


def run_sweep(space: SearchSpace, options: SweepOptions, console: Console | None = None) -> SweepSummary:
    """Run (or resume) the sweep and record it; returns counts and the best objective.

    Everything that can be checked is checked before anything is written: the Tune
    experiment and the Optuna study are free (or a resumed sweep's exist), the MLflow store
    answers, a new sweep's name is free there too (or a resumed one exists, with the same
    spec), Ray is reachable and has the resources one trial asks for. The first checks, with
    Ray Tune's import and the store's opening (`_prepare`: 3-4 s of CPU on 2 cores, issue
    14), run on a thread while Ray starts rather than before it; a sweep refused by any of
    them stops the Ray it started.
    """
    console = console or Console()
    quiet_libraries(options.verbose)
    exp_path = experiment_path(options.storage_path, options.name)
    from concurrent.futures import ThreadPoolExecutor

    # for a database store this process answers its trial workers' tracking calls itself
    # (`driver_tracking`) where they run on this machine's Ray
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="nalu-sweep-prepare") as pool, \
            helper.announced(options.tracking_uri) as announcement, \
            driver_tracking.served(announcement, options.tracking_uri, local=not options.address) as tracking:
        prepared = pool.submit(_prepare, options, exp_path)
        started_ray = joined_ray = False
        try:
            import ray

            already = ray.is_initialized()  # this process's own Ray (a test's, a notebook's): left as it is
            started_ray = init_ray(options.address, options.verbose,
                                   say=lambda line: console.print(line, highlight=False))
            joined_ray = not started_ray and not already
            client, parent, snapshot = prepared.result()
            startup.loaded()  # Tune, MLflow and its store: loaded for the rest of the sweep
            if tracking is not None:
                tracking.use(client)
            _check_parent(space, options, parent, exp_path)
            check_resources(space)
            summary = _run(space, options, console, client, parent, exp_path,
                           str(announcement) if tracking is not None else None, restore=snapshot)
            summary.ray_left_running = started_ray and options.keep_ray
            summary.ray_connected = joined_ray and options.keep_ray
            return summary
        finally:
            # a Ray started here is stopped; from a running cluster this process disconnects
            # now (`ray.shutdown` leaves the cluster up), not in Ray's exit hook, which
            # waits half a second for log lines first
            if (started_ray or joined_ray) and not options.keep_ray:
                stop_ray()
            from service.tracking.spool import left_over_note  # what this store's journals still hold

            if (kept := left_over_note(options.tracking_uri)) is not None:
                console.print(kept, style="yellow", highlight=False, markup=False)


def _prepare(options: SweepOptions, exp_path: str) -> tuple[Any, Any, bool]:
    """What `run_sweep` does while Ray starts, in this order on one thread (two threads
    importing libraries that share dependencies could each see the other's modules half
    loaded): Ray Tune imported; a new sweep's Tune
    experiment and Optuna study do not exist yet (a resumed one's does); then the MLflow
    client and the sweep's parent run (`_open_store`), and whether Tune has a snapshot of
    the experiment to restore (`_snapshotted`)."""
    from ray import tune

    from service.sweep.searcher import check_study

    quiet_optuna(options.verbose)
    restorable = tune.Tuner.can_restore(exp_path)
    if options.resume and not restorable:
        raise UserError(f"nothing to resume: no Tune experiment at {exp_path} "
                        "(use the same --storage-path and --name as the original sweep)")
    if not options.resume and restorable:
        raise UserError(_exists(options, exp_path))
    check_study(options)
    return (*_open_store(options), options.resume and _snapshotted(exp_path))


def _snapshotted(exp_path: str) -> bool:
    """Whether Tune saved the experiment's state (its trials and searcher) at least once. A
    driver killed before Tune's first snapshot leaves an experiment that `Tuner.restore`
    cannot resume (it logs a traceback and runs a sweep of one trial): the resume starts
    the Tune experiment over instead, the Optuna study and MLflow runs kept."""
    from ray.tune import ExperimentAnalysis

    try:
        ExperimentAnalysis(exp_path)
    except Exception:  # noqa: BLE001 - Tune's answer for "no experiment state here" is a ValueError
        return False
    return True


def _open_store(options: SweepOptions) -> tuple[Any, Any]:
    """The MLflow client and the sweep's parent run (None for a new sweep)."""
    client = store.client(options.tracking_uri)
    try:
        experiment = store.retry(lambda: client.get_experiment_by_name(options.name))
        parent = runs.find_sweep_run(client, experiment.experiment_id, options.name) if experiment else None
    except Exception as e:  # noqa: BLE001 - an unreachable or broken tracking store
        raise UserError(f"cannot use the MLflow tracking store {options.tracking_uri}: {e}") from None
    return client, parent


def _exists(options: SweepOptions, exp_path: str) -> str:
    return (f"sweep {options.name!r} already exists (in {options.tracking_uri} or at {exp_path}); "
            f"continue it with --resume, or start a new one with --name {options.name}-2")


def _check_parent(space: SearchSpace, options: SweepOptions, parent: Any, exp_path: str) -> None:
    """A resumed sweep has its MLflow run, with the same search space; a new one has none."""
    if not options.resume:
        if parent is not None:
            raise UserError(_exists(options, exp_path))
        return
    if parent is None:
        raise UserError(f"nothing to resume in {options.tracking_uri}: sweep {options.name!r} has no "
                        "MLflow run there (use the same --tracking-uri as the original sweep)")
    old_hash = parent.data.tags.get(store.TAG_SPACE_HASH)
    if old_hash and old_hash != space.spec_hash():
        raise UserError(f"the search space of sweep {options.name!r} changed since it started "
                        f"(hash {old_hash} → {space.spec_hash()}); resume with the same file and flags")


def _run(space: SearchSpace, options: SweepOptions, console: Console, client: Any, parent: Any,
         exp_path: str, announcement: str | None = None, restore: bool = False) -> SweepSummary:
    from ray import tune

    experiment_id = store.ensure_experiment(client, options.name, options.tracking_uri)
    describe_experiment(client, experiment_id, options.name, list(space.params))
    if options.resume:
        parent_run_id = parent.info.run_id
        wait_for_released_trials(say=lambda line: console.print(line, highlight=False))  # the killed driver's
        closed = runs.close_stale_trial_runs(client, experiment_id, parent_run_id, options.tracking_uri)
        runs.reopen_sweep_run(client, parent_run_id)
        if closed:
            console.print(f"closed {len(closed)} trial run(s) left running by the interruption")
        if options.optuna_storage:  # trials the study finished are replayed, not trained again
            settle_stored_study(options.optuna_storage, options.name,
                                TrialRecords(options.tracking_uri, experiment_id, parent_run_id), space)
    else:
        parent_run_id = runs.start_sweep_run(
            client, experiment_id, options.name, space_file=options.space_file,
            spec_json=space.spec_json(), spec_hash=space.spec_hash(), storage_path=exp_path,
            params={"trials": space.trials, "seeds": space.seeds, "steps": space.steps,
                    "eval_every": space.eval_every, "concurrency": space.concurrency,
                    "scheduler": space.scheduler.type, "objective": space.objective,
                    **({"race": repr(space.scheduler.race())} if space.scheduler.type == "race" else {}),
                    "sampler": space.sampler.type, "cpus_per_trial": space.resources.cpus,
                    "gpus_per_trial": space.resources.gpus,
                    "searched": ", ".join(space.params) or "(none)", "tasks": ", ".join(space.task_configs()),
                    **({"pack": space.pack} if space.pack > 1 else {})},
        )
    settings = TrialSettings(
        space=space.model_dump(mode="json"), task_params=task_params(space), sweep=options.name,
        tracking_uri=options.tracking_uri, experiment_id=experiment_id, parent_run_id=parent_run_id,
        threads=max(1, int(space.resources.cpus)) if space.resources.gpus == 0 else 1,
        announcement=announcement,
        replay=finished_reports(client, experiment_id, parent_run_id, space.steps * len(space.task_configs()))
        if options.resume else {},
    )
    from service.sweep.display import SweepBoard, register_board, unregister_board

    board = SweepBoard(options.name, space.trials, space.steps * len(space.task_configs()), console,
                       concurrency=space.concurrency * space.pack)
    register_board(board)
    outcome = Outcome.FAILED
    grid = None
    try:
        trainable = make_trainable(settings)
        if restore:
            tuner = tune.Tuner.restore(exp_path, trainable=tune.with_resources(
                trainable, {"cpu": space.resources.cpus, "gpu": space.resources.gpus}),
                resume_unfinished=True, resume_errored=True)
        else:
            tuner = _tuner(space, options, trainable, TrialRecords(options.tracking_uri, experiment_id, parent_run_id))
        board.start()
        from service.tracking.system_metrics import system_metrics

        with system_metrics(parent_run_id, options.tracking_uri):
            grid = tuner.fit()
        outcome = Outcome.COMPLETED
    except KeyboardInterrupt:
        outcome = Outcome.INTERRUPTED
        raise
    finally:
        board.stop()
        unregister_board(board)
        release_board(options.name)
        release_race_board(options.name)
        trials = tune_trials(grid, board, space.steps * len(space.task_configs()))
        counts, best, outcome = record_end(client, options, experiment_id, parent_run_id, trials, outcome,
                                            space.trials)
    return SweepSummary(options.name, experiment_id, parent_run_id, options.tracking_uri,
                        exp_path, outcome, counts, best)
