"""The Ray side of a sweep: start or join the cluster, check it can run a trial, label
nodes, and keep the libraries' chatter out of the live board."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import service
from service.endpoints import check_ray_address, reachable
from service.errors import UserError
from service.search.space import SearchSpace
from service.sweep import ray_join
from service.tracking import store


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
# however it was chosen: the setting is kept, the notice only shown with --verbose (a
# `logging.Filter` on the handlers of Ray's public "ray" logger, by the notice's text)
RAY_AUTH_NOTICE = "Token authentication is"


class _DropAuthNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(RAY_AUTH_NOTICE)


def quiet_ray_auth_notice() -> None:
    """Drop Ray's token-authentication notice from the handlers of the ``ray`` logger (where
    Ray prints its own messages); every other message passes. Idempotent."""
    for handler in logging.getLogger("ray").handlers:
        if not any(isinstance(f, _DropAuthNotice) for f in handler.filters):
            handler.addFilter(_DropAuthNotice())
# Optuna's grid sampler calls `Study.stop` when the grid is used up; outside `optimize`
# that raises, and Ray logs it as a warning although the trial was told (it is harmless)
STUDY_STOP_NOISE = "`Study.stop` is supposed to be invoked inside an objective function"
# the processes of a Ray node this process started itself (`ray.init` with no cluster to join)
RAY_NODE_PROCESSES = ("gcs_server", "raylet")


def _drop_study_stop(record: logging.LogRecord) -> bool:
    return STUDY_STOP_NOISE not in str(record.msg)


def started_here() -> bool:
    """Whether the Ray this process is connected to runs as this process's children (`ray.init`
    started it) rather than as a cluster of its own (``ray start --head``, a remote one)."""
    import psutil

    try:
        names = [c.name() for c in psutil.Process().children(recursive=True)]
    except psutil.Error:
        return False
    return any(n.startswith(RAY_NODE_PROCESSES) for n in names)


def init_ray(address: str | None, verbose: bool, say: Callable[[str], None] | None = None) -> bool:
    """Connect to Ray, or start it; returns True when this call started it (the caller stops
    it: `stop_ray`). As Ray itself resolves ``ray.init()``: an ``address`` (``--address``)
    is joined; without one, ``RAY_ADDRESS`` or the local cluster that ``ray start --head``
    left running is joined, and left running afterwards; with neither, a local Ray is
    started for this sweep and stopped at its end. ``say`` gets one line before the wait
    and one after it saying which it was, so the first seconds of a sweep are not silent."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # the JSON logger is added: `driver`
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the live board replaces Tune's tables
    import ray

    if not verbose:
        quiet_ray_auth_notice()

    check_ray_address(address)  # an explicit, unreachable --address is an error even if Ray is up
    if ray.is_initialized():
        return False
    if not address:
        # workers of a Ray started here inherit the driver's environment: make `service` importable
        package_root = str(Path(service.__file__).resolve().parent.parent)
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if package_root not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([package_root, *paths])
    extra: dict[str, Any] = {}
    forwarded = store.credential_env()
    if address and forwarded:  # workers on other machines need the MLflow server's credentials
        extra["runtime_env"] = {"env_vars": forwarded}
    started = time.monotonic()
    if say is not None:
        say(f"connecting to Ray at {address}…" if address else "looking for a running local Ray…")
    ray_join.check_token_path()
    # no address for a cluster found (RAY_ADDRESS, `ray start`'s): Ray finds it again, as it would
    options: dict[str, Any] = dict(address=address or None, include_dashboard=False, log_to_driver=verbose,
                                   logging_level=logging.INFO if verbose else logging.WARNING,
                                   configure_logging=True, **extra)
    target = ray_join.join_target(address)
    where = f"the Ray cluster at {address or target!r}" if address or target else "a local Ray"
    try:
        if target is not None and reachable(target):  # joining: a refused token is reported at once
            ray_join.join_watched(where, ray.init, verbose, **options)
        else:
            ray.init(**options)
    except (ConnectionError, RuntimeError, ValueError, ray.exceptions.AuthenticationError) as e:
        if ray_join.refused(e):
            raise ray_join.token_error(where) from None
        raise UserError(f"cannot start or reach {where}: {e}") from None
    ours = not address and started_here()
    if say is not None:
        cpus = ray.cluster_resources().get("CPU", 0)
        how = ("started a local Ray for this sweep (it stops at the end; sweeping often? keep one up "
               "with `ray start --head`)" if ours else
               f"connected to the running Ray at {ray.get_runtime_context().gcs_address} (left running)")
        say(f"{how}: ready in {time.monotonic() - started:.0f} s ({cpus:g} CPUs); starting the first trials…")
    return ours


def stop_ray() -> None:
    """Disconnect from Ray: `ray.shutdown`, which also stops a Ray this process started."""
    import ray

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


RESUME_WAIT_ENV = "NALU_SWEEP_RESUME_WAIT_S"


def wait_for_released_trials(say: Callable[[str], None] | None = None, timeout_s: float | None = None,
                             poll_s: float = 0.25) -> bool:
    """Wait until Ray holds none of its CPUs and GPUs for a task or actor, up to
    ``timeout_s`` (default ``$NALU_SWEEP_RESUME_WAIT_S``, 30 s); True when that happened.

    A resumed sweep waits so: the trials of a driver that was killed go on in their Ray
    workers until Ray reaps them, and one that is still training can finish and close its
    MLflow run after the resumed driver read the runs back, so that the run and the Optuna
    study would tell different stories of that trial. Once their resources are free, those
    workers have ended and the resume reads what they left. Ray's resource view is all
    Ray tells a driver without its dashboard (``ray.available_resources``); on a cluster
    that other jobs keep busy the wait runs its full length, then the resume goes on."""
    import ray

    timeout_s = float(os.environ.get(RESUME_WAIT_ENV, "30")) if timeout_s is None else timeout_s
    deadline, told = time.monotonic() + timeout_s, False
    while True:
        total, free = ray.cluster_resources(), ray.available_resources()
        held = {k: total.get(k, 0.0) - free.get(k, 0.0) for k in ("CPU", "GPU")}
        if all(v <= 1e-6 for v in held.values()):
            return True
        if time.monotonic() >= deadline:
            if say is not None:
                say(f"Ray still holds {held['CPU']:g} CPU(s) and {held['GPU']:g} GPU(s) after {timeout_s:g} s; "
                    f"resuming anyway (set {RESUME_WAIT_ENV} to wait longer for the interrupted trials)")
            return False
        if not told and say is not None and time.monotonic() > deadline - timeout_s + 1:
            say(f"waiting for the interrupted sweep's trials to end on Ray ({held['CPU']:g} CPU(s) still held)")
            told = True
        time.sleep(poll_s)


def quiet_libraries(verbose: bool) -> None:
    """The live board is the sweep's output: keep library chatter to warnings (Optuna's:
    `quiet_optuna`, once it is loaded)."""
    import warnings

    search_log = logging.getLogger("ray.tune.search.optuna.optuna_search")
    if _drop_study_stop not in search_log.filters:
        search_log.addFilter(_drop_study_stop)
    if verbose:
        return
    # MLflow's documented level (its loggers read it when it is imported), unless the user set one
    level = os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    logging.getLogger("mlflow").setLevel(level.upper())  # in case MLflow is already imported
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # a resumed trial reports its first steps again; Optuna keeps the first values
    warnings.filterwarnings("ignore", message="The reported value is ignored")

