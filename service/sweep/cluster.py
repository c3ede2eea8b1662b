"""The Ray side of a sweep: start or join the cluster, check it can run a trial, label
nodes, and keep the libraries' chatter out of the live board."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

import service
from service.endpoints import check_ray_address
from service.errors import UserError
from service.search.space import SearchSpace
from service.tracking import store


def node_ip() -> str:
    """The IP address of the Ray node running this trial (``unknown`` outside Ray)."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - only a label
        return "unknown"


# Ray warns on every start that token authentication is on (or off) for a local cluster,
# however it was chosen: the setting is kept, the notice only shown with --verbose
RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
# Optuna's grid sampler calls `Study.stop` when the grid is used up; outside `optimize`
# that raises, and Ray logs it as a warning although the trial was told (it is harmless)
STUDY_STOP_NOISE = "`Study.stop` is supposed to be invoked inside an objective function"


def _drop_study_stop(record: logging.LogRecord) -> bool:
    return STUDY_STOP_NOISE not in str(record.msg)


def init_ray(address: str | None, verbose: bool, say: Callable[[str], None] | None = None) -> bool:
    """Start (or connect to) Ray; returns True when this call started it. ``say`` gets one
    line before the wait ("starting a local Ray…", "connecting to Ray at …") and one
    after it, so the first seconds of a sweep are not silent."""
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
    if not address:  # local workers inherit the driver's environment: make `service` importable
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


def check_resources(space: SearchSpace) -> None:
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


def quiet_libraries(verbose: bool) -> None:
    """The live board is the sweep's output: keep library chatter to warnings."""
    import warnings

    import optuna

    search_log = logging.getLogger("ray.tune.search.optuna.optuna_search")
    if _drop_study_stop not in search_log.filters:
        search_log.addFilter(_drop_study_stop)
    if verbose:
        return
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # a resumed trial reports its first steps again; Optuna keeps the first values
    warnings.filterwarnings("ignore", message="The reported value is ignored")

