"""The Ray side of a sweep: start or join the cluster, check it can run a trial, label
nodes, and keep the libraries' chatter out of the live board."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import service
from service.endpoints import check_ray_address
from service.errors import UserError
from service.search.space import SearchSpace
from service.sweep import worker_start
from service.sweep.ray_head import PRESTART_SETTING, lean_head
from service.tracking import helper, store


def node_ip() -> str:
    """The IP address of the Ray node running this trial (``unknown`` outside Ray)."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - only a label
        return "unknown"


def gpu_ids() -> str:
    """The GPUs Ray assigned to this worker, as Ray numbers them on its node (``"0"``,
    ``"0,1"``; ``"none"`` for a CPU trial, ``"unknown"`` outside Ray). Ray sets
    ``CUDA_VISIBLE_DEVICES`` to these, so torch's ``cuda:0`` is the first of them."""
    try:
        import ray

        ids = ray.get_gpu_ids()
    except Exception:  # noqa: BLE001 - only a label
        return "unknown"
    return ",".join(str(i) for i in ids) or "none"


# Ray warns on every start that token authentication is on (or off) for a local cluster,
# however it was chosen: the setting is kept, the notice only shown with --verbose
RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
# Ray's system setting (read from the environment by a raylet this process starts)
RAY_PRESTART = PRESTART_SETTING
# Optuna's grid sampler calls `Study.stop` when the grid is used up; outside `optimize`
# that raises, and Ray logs it as a warning although the trial was told (it is harmless)
STUDY_STOP_NOISE = "`Study.stop` is supposed to be invoked inside an objective function"
# Tune gives every trial actor the runtime environment {"env_vars": {"PL_DISABLE_FORK": "1"}},
# for PyTorch Lightning, which no trial here uses; any runtime environment makes the raylet
# start the actor's worker through `setup_worker.py` (one more Python start importing Ray)
# after its runtime-env agent has built it: about a second before the first trial trains
TUNE_LIGHTNING_ENV = "PL_DISABLE_FORK"


def plain_trial_workers() -> None:
    """Drop Tune's Lightning setting from the runtime environment of its trial actors, so
    their workers start as plain Ray workers (what Tune still forwards from this process's
    environment, e.g. AWS credentials, it forwards as before). Needed before Tune starts
    its first trial: the sweep's driver calls it as it imports Tune (`driver._prepare`)."""
    try:
        from ray.tune.execution import class_cache
    except ImportError:  # another Tune layout: its trial actors keep their environment
        return
    defaults = getattr(class_cache, "DEFAULT_ENV_VARS", None)
    if isinstance(defaults, dict):
        defaults.pop(TUNE_LIGHTNING_ENV, None)


@contextmanager
def prepared_workers(announcement: Path | None) -> Iterator[None]:
    """While a local Ray starts: its workers will run `worker_start.prepare` as Ray's
    worker-process setup hook (their MLflow helper for the tracking URI in the file
    ``announcement``, `helper.announced`, and the trial's imports, while that file exists).
    A raylet's workers inherit its environment, which is this process's while `ray.init`
    starts it; afterwards this process's is as it was. Nothing without a file, when another
    hook is set, or when Ray has no such hook."""
    try:
        from ray._private import ray_constants
    except ImportError:
        ray_constants = None
    hook = getattr(ray_constants, "WORKER_PROCESS_SETUP_HOOK_ENV_VAR", None)
    if announcement is None or not hook or hook in os.environ:
        yield
        return
    os.environ[hook] = f"{worker_start.__name__}.{worker_start.prepare.__name__}"
    os.environ[helper.PRESTART_FILE] = str(announcement)
    try:
        yield
    finally:
        os.environ.pop(hook, None)
        os.environ.pop(helper.PRESTART_FILE, None)


def _drop_study_stop(record: logging.LogRecord) -> bool:
    return STUDY_STOP_NOISE not in str(record.msg)


def init_ray(address: str | None, verbose: bool, say: Callable[[str], None] | None = None,
             helper_announcement: Path | None = None, warm_workers: int = 0) -> bool:
    """Start (or connect to) Ray; returns True when this call started it. ``say`` gets one
    line before the wait ("starting a local Ray…", "connecting to Ray at …") and one
    after it, so the first seconds of a sweep are not silent. The workers of a local Ray
    started with ``helper_announcement`` start their MLflow helper and load the trial's code
    at once, while that file exists (`prepared_workers`); ``warm_workers`` of them are
    started as the driver connects (`ray_head.raylet_command`), ready for the first trials."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the live board replaces Tune's tables
    import ray

    if not verbose:
        logging.getLogger(RAY_AUTH_LOGGER).setLevel(logging.ERROR)
    # the Tune loggers that would write result.json are off: don't warn that it is missing
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)

    check_ray_address(address)  # an explicit, unreachable --address is an error even if Ray is up
    if ray.is_initialized():
        return False
    package_root = str(Path(service.__file__).resolve().parent.parent)
    if not address:
        # a local raylet would start one idle Python worker per CPU when the driver connects
        # (~1.5 s of CPU each); the lean head prestarts only the warm workers asked for
        os.environ.setdefault(RAY_PRESTART, "0")
        # local workers inherit the driver's environment: make `service` importable
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if package_root not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([package_root, *paths])
    extra: dict[str, Any] = {}
    forwarded = store.credential_env()
    if address and forwarded:  # workers on other machines need the MLflow server's credentials
        extra["runtime_env"] = {"env_vars": forwarded}
    started = time.monotonic()
    if say is not None:
        say(f"connecting to Ray at {address}…" if address else "starting a local Ray…")
    try:
        with lean_head(verbose, warm_workers) if not address else nullcontext(), \
                prepared_workers(helper_announcement if not address else None):
            ray.init(address=address or None, include_dashboard=False, log_to_driver=verbose,
                     logging_level=logging.INFO if verbose else logging.WARNING,
                     configure_logging=True, **extra)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = f"the Ray cluster at {address!r}" if address else "a local Ray"
        raise UserError(f"cannot start or reach {where}: {e}") from None
    if say is not None:
        cpus = ray.cluster_resources().get("CPU", 0)
        say(f"Ray ready in {time.monotonic() - started:.0f} s ({cpus:g} CPUs); starting the first trials…")
    return True


def stop_ray() -> None:
    """`ray.shutdown` for a Ray this process started, less a second lost to the autoscaler
    where its head has one (`ray_head`: ``NALU_SWEEP_RAY_HEAD=full``, or another Ray).

    Ray stops its raylet and GCS first and its autoscaler monitor after them; the monitor
    answers SIGTERM by reporting its end to the GCS that is already gone, and Ray waits a
    full second before it SIGKILLs it (Ray 2.60, every local sweep). The monitor keeps no
    state a local cluster needs, so it is killed outright first; anything unexpected in
    Ray's internals leaves the plain `ray.shutdown`."""
    import ray

    try:
        from ray._private import ray_constants, worker

        node = worker._global_node  # noqa: SLF001 - no public handle on the processes Ray started
        if node is not None and node.is_head():
            for info in node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, []):
                info.process.kill()
                info.process.wait(timeout=5)
    except Exception:  # noqa: BLE001 - only a shortcut; ray.shutdown still stops everything
        pass
    ray.shutdown()


def quiet_optuna(verbose: bool) -> None:
    """Optuna's own messages kept to warnings. Importing Optuna takes 0.1-0.2 s, so a
    sweep's driver does it on the thread that runs while Ray starts (`driver._prepare`),
    not before Ray starts; Optuna resets its level when it is first used, so this runs
    after its import and before its first use."""
    if verbose:
        return
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def gpu_request_problem(gpus: float) -> str | None:
    """Why Ray would refuse ``gpus`` per trial, or None: a fraction finer than 0.0001 (Ray's
    resource unit), or more than one GPU that is not a whole number (1.5). Any fraction
    below one is accepted: 0.3 packs three trials on a GPU and leaves the rest unused."""
    if 0 < gpus < 1e-4:
        return f"each trial asks for {gpus:g} GPU; Ray counts GPUs in steps of 0.0001"
    if gpus > 1 and not float(gpus).is_integer():
        return (f"each trial asks for {gpus:g} GPUs; Ray shares a GPU only below one (0.5, 0.25, ...) "
                f"and hands out more than one only whole: use {int(gpus)} or {int(gpus) + 1}")
    return None


def check_resources(space: SearchSpace) -> None:
    """A trial that asks for more than the cluster has would wait forever, and one Ray
    refuses would fail with a cryptic error: say so now. A trial runs on one node, so the
    largest node must hold it, not only the cluster as a whole."""
    import ray

    problem = gpu_request_problem(space.resources.gpus)
    if problem:
        raise UserError(problem)
    total = ray.cluster_resources()
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    for kind, key, asked, hint in (
            ("GPU(s)", "GPU", space.resources.gpus, "use --gpus-per-trial 0 (CPU) or a cluster with GPUs"),
            ("CPUs", "CPU", space.resources.cpus, "lower --cpus-per-trial")):
        in_all, largest = total.get(key, 0.0), max((n.get(key, 0.0) for n in nodes), default=0.0)
        if asked > in_all:
            raise UserError(f"each trial asks for {asked:g} {kind} but the Ray cluster has {in_all:g}; {hint}")
        if asked > largest:
            raise UserError(f"each trial asks for {asked:g} {kind} but the largest Ray node has {largest:g} "
                            f"(the cluster {in_all:g} in all) and a trial runs on one node; {hint}")


def quiet_libraries(verbose: bool) -> None:
    """The live board is the sweep's output: keep library chatter to warnings (Optuna's:
    `quiet_optuna`, once it is loaded)."""
    import warnings

    search_log = logging.getLogger("ray.tune.search.optuna.optuna_search")
    if _drop_study_stop not in search_log.filters:
        search_log.addFilter(_drop_study_stop)
    if verbose:
        return
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # a resumed trial reports its first steps again; Optuna keeps the first values
    warnings.filterwarnings("ignore", message="The reported value is ignored")

