"""Run a sweep: Ray Tune schedules trials, Optuna (TPE) proposes them, MLflow records them.

- `OptunaSearch` with a seeded TPE sampler over the define-by-run space, capped at
  ``concurrency`` trials in flight (TPE proposes each new trial from the finished ones);
  ``ASHAScheduler`` on the intermediate objective (or no scheduler); ``reuse_actors=True``
  so trials do not pay a process start-up each; failed trials are retried
  (``FailureConfig``).
- A local Ray is started by default; ``address`` connects to a running cluster.
- ``resume`` continues an interrupted sweep with ``Tuner.restore`` (the searcher's state is
  restored with it, and the Optuna study is made to agree with it: `service.search.study`);
  MLflow child runs left RUNNING by the crash are closed first, and a resumed trial reopens
  its own run (see `service.tracking.runs.TrialRun`).
- Trials checkpoint to the Tune storage (`service.search.trial_state`); a retried or
  resumed trial continues from its latest checkpoint instead of starting over.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from service.endpoints import check_ray_address
from service.errors import UserError
from service.search.display import LiveProgress, SweepBoard, register_board, unregister_board
from service.search.objective import OBJECTIVE
from service.search.space import SearchSpace, parse_space
from service.search.suggest import DefineByRun, active_params, run_configs
from service.search.trial import (
    STEP, TrialProgress, is_metric_key, regularizer_params, run_trial, task_params,
)
from service.search.trial_state import TrialState
from service.tracking import runs, store

TRAINABLE_NAME = "nalu_sweep_trial"
DEFAULT_STORAGE_DIR = "runs"


@dataclass(frozen=True)
class SweepOptions:
    """Where and how a sweep runs (the CLI's flags, resolved)."""

    name: str
    tracking_uri: str
    storage_path: str
    space_file: Path | None = None
    address: str | None = None
    resume: bool = False
    verbose: bool = False
    optuna_storage: str | None = None  # an RDB URL: keep the Optuna study there (name = the sweep's)


@dataclass(frozen=True)
class TrialSettings:
    """Everything a trial needs besides its sampled parameters; plain data (pickled)."""

    space: dict[str, Any]
    sweep: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    threads: int


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
def make_trainable(settings: TrialSettings):
    """The Tune function trainable (a closure over ``settings``, pickled by value)."""

    def nalu_sweep_trial(config: dict[str, Any]) -> None:
        execute_trial(config, settings)

    nalu_sweep_trial.__name__ = TRAINABLE_NAME
    return nalu_sweep_trial


def execute_trial(config: dict[str, Any], settings: TrialSettings) -> None:
    """Open (or reopen) the trial's MLflow run, train, and close the run with the right
    outcome whatever happens: ``completed``, ``pruned`` (ASHA raised inside a report
    before the end), or ``failed`` (an exception; Tune may retry, reusing the run).

    A retried or resumed trial gets its latest checkpoint from `tune.get_checkpoint` and
    continues from it (tagged ``nalu_sweep.resumed_from_step``); checkpoints are written to
    a temporary directory that `tune.report` copies to the sweep's storage."""
    import tempfile

    import torch
    from ray import tune

    context = tune.get_context()
    trial_id = context.get_trial_id()  # read first: stopping may interrupt anything later
    trial_name = context.get_trial_name() or trial_id
    torch.set_num_threads(settings.threads)
    space = parse_space(settings.space, source=f"sweep {settings.sweep}")
    params = {k: v for k, v in config.items() if k in space.params}
    tracker = runs.TrialRun.open(
        settings.tracking_uri, settings.experiment_id, settings.parent_run_id,
        trial_key=trial_id, run_name=trial_name,
        params={**params, **task_params(space), **regularizer_params(space, params)},
        tags={store.TAG_SWEEP: settings.sweep, store.TAG_NODE: _node_ip()},
    )
    progress = TrialProgress()
    outcome = "failed"

    def report(metrics: dict[str, float]) -> None:
        tune.report(metrics)

    def report_checkpoint(metrics: dict[str, float], state: TrialState) -> None:
        with tempfile.TemporaryDirectory(prefix="nalu-sweep-checkpoint-") as tmp:
            state.save(tmp)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))

    try:
        resume = None
        checkpoint = tune.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as directory:
                resume = TrialState.load(directory, run_configs(space, active_params(space, params)))
            tracker.set_tags({store.TAG_RESUMED_FROM: str(resume.step)})
        run_trial(params, space, report, tracker=tracker, progress=progress,
                  resume=resume, report_checkpoint=report_checkpoint)
        outcome = "completed"
    except SystemExit:  # Tune's way of stopping a trial from inside `tune.report`
        outcome = "completed" if progress.completed else "pruned"
        raise
    except Exception as e:
        tracker.set_tags({store.TAG_ERROR: f"{type(e).__name__}: {e}"[:5000]})
        raise
    finally:
        tracker.close(outcome)


def _node_ip() -> str:
    """The IP address of the Ray node running this trial (``unknown`` outside Ray)."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - only a label
        return "unknown"


# -- the driver -----------------------------------------------------------------------------------------
def _init_ray(address: str | None, verbose: bool) -> bool:
    """Start (or connect to) Ray; returns True when this call started it."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the live board replaces Tune's tables
    import logging

    import ray

    # the Tune loggers that would write result.json are off: don't warn that it is missing
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)

    check_ray_address(address)  # an explicit, unreachable --address is an error even if Ray is up
    if ray.is_initialized():
        return False
    package_root = str(Path(__file__).resolve().parents[2])
    if not address:  # local workers inherit the driver's environment: make `service` importable
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if package_root not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([package_root, *paths])
    extra: dict[str, Any] = {}
    forwarded = store.credential_env()
    if address and forwarded:  # workers on other machines need the MLflow server's credentials
        extra["runtime_env"] = {"env_vars": forwarded}
    try:
        ray.init(address=address or None, include_dashboard=False, log_to_driver=verbose,
                 logging_level=logging.INFO if verbose else logging.WARNING,
                 configure_logging=True, **extra)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = f"the Ray cluster at {address!r}" if address else "a local Ray"
        raise UserError(f"cannot start or reach {where}: {e}") from None
    return True


def _check_resources(space: SearchSpace) -> None:
    """A trial that asks for more than the cluster has would wait forever: say so now."""
    import ray

    total = ray.cluster_resources()
    cpus, gpus = total.get("CPU", 0.0), total.get("GPU", 0.0)
    if space.resources.gpus > gpus:
        raise UserError(f"each trial asks for {space.resources.gpus:g} GPU(s) but the Ray cluster has "
                        f"{gpus:g}; use --gpus-per-trial 0 (CPU) or a cluster with GPUs")
    if space.resources.cpus > cpus:
        raise UserError(f"each trial asks for {space.resources.cpus:g} CPUs but the Ray cluster has "
                        f"{cpus:g}; lower --cpus-per-trial")


def _trial_counts(client: Any, experiment_id: str, parent_run_id: str) -> tuple[dict[str, int], float | None]:
    counts = {"completed": 0, "pruned": 0, "failed": 0, "running": 0, "interrupted": 0}
    best = None
    for run in runs.trial_runs(client, experiment_id, parent_run_id):
        outcome = run.data.tags.get(store.TAG_OUTCOME, "running")
        counts[outcome] = counts.get(outcome, 0) + 1
        value = run.data.metrics.get(OBJECTIVE)
        if outcome == "completed" and value is not None and (best is None or value > best):
            best = value
    return counts, best


@dataclass
class TuneTrial:
    """What Tune knows of one trial at the end of `fit`: its last result and final state."""

    state: str  # done, pruned, failed, running
    last_result: dict[str, Any]


def _tune_trials(grid: Any, board: SweepBoard, total_steps: int) -> dict[str, TuneTrial]:
    """Every trial of the (possibly restored) Tune experiment, by trial id: the board's view
    for trials run by this process, the result grid's for those finished before a restart."""
    out: dict[str, TuneTrial] = {}
    for result in grid or []:
        trial_id = Path(str(result.path)).name.removeprefix("trial-")
        metrics = dict(result.metrics or {})
        if result.error is not None:
            state = "failed"
        else:
            state = "done" if float(metrics.get(STEP, 0) or 0) >= total_steps else "pruned"
        out[trial_id] = TuneTrial(state, metrics)
    for trial_id, line in board.trials.items():
        if line.state != "pending":
            out[trial_id] = TuneTrial(line.state, dict(line.last_result) or out.get(trial_id, TuneTrial("", {})).last_result)
    return out


def _settle_trial_runs(client: Any, experiment_id: str, parent_run_id: str,
                       trials: dict[str, TuneTrial], complete: bool) -> None:
    """Make MLflow agree with Tune once `fit` is over.

    A child run still RUNNING (or closed as ``interrupted`` when a resume began) whose trial
    Tune saw finish was stopped before its own ``finally`` ran (Tune does not wait for a
    stopped trial's thread, nor for a killed driver's): close it as Tune reports it
    (pruned / failed / completed). Runs of trials unknown to Tune were started just before a
    crash, after Tune last saved its state: the restored sweep never runs them, so once
    the sweep is complete they are deleted rather than left as phantom trials.
    """
    outcomes = {"done": "completed", "pruned": "pruned", "failed": "failed"}
    for run in runs.trial_runs(client, experiment_id, parent_run_id):
        open_run = run.info.status in ("RUNNING", "SCHEDULED")
        interrupted = run.data.tags.get(store.TAG_OUTCOME) == "interrupted"
        if not (open_run or interrupted):
            continue
        trial = trials.get(run.data.tags.get(store.TAG_TRIAL_KEY, ""))
        if trial is not None and trial.state in outcomes:
            result = {k: v for k, v in trial.last_result.items() if is_metric_key(k)}
            runs.settle_trial_run(client, run.info.run_id, outcomes[trial.state], result,
                                  int(trial.last_result.get(STEP, 0) or 0))
        elif trial is None and complete:
            store.retry(lambda: client.delete_run(run.info.run_id))
        elif open_run:
            runs.settle_trial_run(client, run.info.run_id, "interrupted")


def _record_end(client: Any, options: SweepOptions, experiment_id: str, parent_run_id: str,
                trials: dict[str, TuneTrial], outcome: str, planned: int) -> tuple[dict[str, int], float | None, str]:
    """Settle the trial runs and close the parent run; returns the counts, the best
    objective and the sweep's outcome. A tracking server that is away when the sweep ends
    is waited for (with backoff, up to the spool's patience) rather than leaving the sweep
    half-recorded; every step here is idempotent, so a retry repeats it from the start."""
    from service.tracking.spool import patience_s

    def record() -> tuple[dict[str, int], float | None, str]:
        _settle_trial_runs(client, experiment_id, parent_run_id, trials, complete=outcome == "completed")
        counts, best = _trial_counts(client, experiment_id, parent_run_id)
        finished = counts["completed"] + counts["pruned"] + counts["failed"]
        final = "interrupted" if outcome == "completed" and finished < planned else outcome
        runs.finish_sweep_run(client, parent_run_id, final, {
            "trials_completed": counts["completed"], "trials_pruned": counts["pruned"],
            "trials_failed": counts["failed"], **({"best_objective": best} if best is not None else {}),
        })
        return counts, best, final

    patience = patience_s()
    try:
        return store.retry(record, attempts=1, patience_s=patience)
    except Exception as e:  # noqa: BLE001 - still unreachable after waiting
        if not store.is_transient(e):
            raise
        raise UserError(
            f"the MLflow tracking store {store.redact(options.tracking_uri)} did not answer for {patience:.0f} s "
            f"when the sweep ended ({type(e).__name__}); the trials' results are in it or in the local spool "
            f"(upload with: python -m service.tracking.spool upload). Once it is back, run the same command "
            f"with --resume to record the sweep's end") from None


def make_sampler(space: SearchSpace):
    """The seeded Optuna sampler named by the space (TPE by default)."""
    import optuna

    seed = space.sampler.seed
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
        raise UserError(f"--optuna-storage {store.redact(url)}: missing driver ({e}); for PostgreSQL "
                        "install the 'postgres' extra: pip install 'nalu-sweep[postgres]'") from None
    except Exception as e:  # noqa: BLE001 - unreachable database, bad URL, ...
        raise UserError(f"cannot use the Optuna storage {store.redact(url)}: {e}") from None


def _check_study(options: SweepOptions) -> None:
    """A new sweep must not silently continue an old study of the same name (Tune's
    OptunaSearch loads an existing study); a resumed one keeps Tune's restored searcher."""
    if not options.optuna_storage or options.resume:
        return
    storage = optuna_storage(options.optuna_storage)
    names = {s.study_name for s in storage.get_all_studies()}
    if options.name in names:
        raise UserError(f"an Optuna study named {options.name!r} already exists in "
                        f"{store.redact(options.optuna_storage)}; start a new sweep with --name {options.name}-2")


def _trial_name(trial: Any) -> str:
    return f"trial-{trial.trial_id}"


def _tuner(space: SearchSpace, options: SweepOptions, trainable: Any):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    from service.search.study import ResumableOptunaSearch

    study: dict[str, Any] = {}
    if options.optuna_storage:
        study = {"storage": optuna_storage(options.optuna_storage), "study_name": options.name}
    searcher = ResumableOptunaSearch(space=DefineByRun(space), metric=OBJECTIVE, mode="max",
                                     sampler=make_sampler(space), **study)
    if space.scheduler.type == "asha":
        scheduler = ASHAScheduler(
            time_attr="training_iteration", metric=OBJECTIVE, mode="max",
            max_t=space.total_reports(), grace_period=space.grace_reports(),
            reduction_factor=space.scheduler.reduction_factor, brackets=space.scheduler.brackets,
        )
    else:
        scheduler = FIFOScheduler()
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
            # a retried or resumed trial needs only its latest checkpoint
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            callbacks=[LiveProgress(options.name)],
        ),
    )


def _quiet_libraries(verbose: bool) -> None:
    """The live board is the sweep's output: keep library chatter to warnings."""
    import logging
    import warnings

    import optuna

    if verbose:
        return
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # a resumed trial reports its first steps again; Optuna keeps the first values
    warnings.filterwarnings("ignore", message="The reported value is ignored")


def run_sweep(space: SearchSpace, options: SweepOptions, console: Console | None = None) -> SweepSummary:
    """Run (or resume) the sweep and record it; returns counts and the best objective.

    Everything that can be checked is checked before anything is written: the MLflow store
    answers, a new sweep's name is free (or a resumed one exists, with the same spec), Ray
    is reachable and has the resources one trial asks for.
    """
    console = console or Console()
    _quiet_libraries(options.verbose)
    client = store.client(options.tracking_uri)
    try:
        experiment = store.retry(lambda: client.get_experiment_by_name(options.name))
        parent = runs.find_sweep_run(client, experiment.experiment_id, options.name) if experiment else None
    except Exception as e:  # noqa: BLE001 - an unreachable or broken tracking store
        raise UserError(f"cannot use the MLflow tracking store {options.tracking_uri}: {e}") from None
    exp_path = experiment_path(options.storage_path, options.name)

    from ray import tune

    restorable = tune.Tuner.can_restore(exp_path)
    if options.resume:
        if not restorable:
            raise UserError(f"nothing to resume: no Tune experiment at {exp_path} "
                            "(use the same --storage-path and --name as the original sweep)")
        if parent is None:
            raise UserError(f"nothing to resume in {options.tracking_uri}: sweep {options.name!r} has no "
                            "MLflow run there (use the same --tracking-uri as the original sweep)")
        old_hash = parent.data.tags.get(store.TAG_SPACE_HASH)
        if old_hash and old_hash != space.spec_hash():
            raise UserError(f"the search space of sweep {options.name!r} changed since it started "
                            f"(hash {old_hash} → {space.spec_hash()}); resume with the same file and flags")
    elif parent is not None or restorable:
        raise UserError(f"sweep {options.name!r} already exists (in {options.tracking_uri} or at {exp_path}); "
                        f"continue it with --resume, or start a new one with --name {options.name}-2")

    _check_study(options)
    started_ray = _init_ray(options.address, options.verbose)
    try:
        _check_resources(space)
        return _run(space, options, console, client, parent, exp_path)
    finally:
        if started_ray:
            import ray

            ray.shutdown()


def _run(space: SearchSpace, options: SweepOptions, console: Console, client: Any, parent: Any,
         exp_path: str) -> SweepSummary:
    from ray import tune

    experiment_id = store.ensure_experiment(client, options.name, options.tracking_uri)
    if options.resume:
        parent_run_id = parent.info.run_id
        closed = runs.close_stale_trial_runs(client, experiment_id, parent_run_id)
        runs.reopen_sweep_run(client, parent_run_id)
        if closed:
            console.print(f"closed {len(closed)} trial run(s) left running by the interruption")
    else:
        parent_run_id = runs.start_sweep_run(
            client, experiment_id, options.name, space_file=options.space_file,
            spec_json=space.spec_json(), spec_hash=space.spec_hash(), storage_path=exp_path,
            params={"trials": space.trials, "seeds": space.seeds, "steps": space.steps,
                    "eval_every": space.eval_every, "concurrency": space.concurrency,
                    "scheduler": space.scheduler.type, "objective": space.objective,
                    "sampler": space.sampler.type, "cpus_per_trial": space.resources.cpus,
                    "gpus_per_trial": space.resources.gpus,
                    "searched": ", ".join(space.params) or "(none)", "tasks": ", ".join(space.task_configs())},
        )
    settings = TrialSettings(
        space=space.model_dump(mode="json"), sweep=options.name,
        tracking_uri=options.tracking_uri, experiment_id=experiment_id, parent_run_id=parent_run_id,
        threads=max(1, int(space.resources.cpus)) if space.resources.gpus == 0 else 1,
    )
    board = SweepBoard(options.name, space.trials, space.steps * len(space.task_configs()), console)
    register_board(board)
    outcome = "failed"
    grid = None
    try:
        trainable = make_trainable(settings)
        if options.resume:
            tuner = tune.Tuner.restore(exp_path, trainable=tune.with_resources(
                trainable, {"cpu": space.resources.cpus, "gpu": space.resources.gpus}),
                resume_unfinished=True, resume_errored=True)
        else:
            tuner = _tuner(space, options, trainable)
        board.start()
        from service.tracking.system_metrics import system_metrics

        with system_metrics(parent_run_id, options.tracking_uri):
            grid = tuner.fit()
        outcome = "completed"
    except KeyboardInterrupt:
        outcome = "interrupted"
        raise
    finally:
        board.stop()
        unregister_board(board)
        trials = _tune_trials(grid, board, space.steps * len(space.task_configs()))
        counts, best, outcome = _record_end(client, options, experiment_id, parent_run_id, trials, outcome,
                                            space.trials)
    return SweepSummary(options.name, experiment_id, parent_run_id, options.tracking_uri,
                        exp_path, outcome, counts, best)
