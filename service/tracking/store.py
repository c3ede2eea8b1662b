"""Where sweeps are recorded: the MLflow tracking store, experiments and common tags.

Embedded default: a SQLite file ``mlflow.db`` in the working directory
(``sqlite:////abs/path/mlflow.db``) with artifacts under ``mlruns/`` next to it, created by
the driver with an *absolute* artifact location (a relative one would resolve inside each
Ray trial's temporary working directory). ``--tracking-uri`` (or ``MLFLOW_TRACKING_URI``)
points at a server instead; the server then decides where artifacts go.
"""

from __future__ import annotations

import os
import subprocess
import time
from enum import Enum
from pathlib import Path
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class Outcome(str, Enum):
    """How a sweep or trial run ended (the value of `TAG_OUTCOME`); equal to its string."""

    RUNNING = "running"
    COMPLETED = "completed"
    PRUNED = "pruned"
    FAILED = "failed"
    INTERRUPTED = "interrupted"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def counts(cls) -> dict[str, int]:
        """``{outcome: 0}`` for every outcome: the start of a tally."""
        return {o.value: 0 for o in cls}


TAG_SWEEP = "nalu_sweep.sweep"
TAG_ROLE = "nalu_sweep.role"  # "sweep" (parent) or "trial" (child)
TAG_TRIAL_KEY = "nalu_sweep.trial_key"
TAG_OUTCOME = "nalu_sweep.outcome"  # running, completed, pruned, failed, interrupted
TAG_SPACE_HASH = "nalu_sweep.space_hash"
TAG_SPACE_FILE = "nalu_sweep.space_file"
TAG_GIT_COMMIT = "nalu_sweep.git_commit"
TAG_STORAGE = "nalu_sweep.storage_path"
TAG_ATTEMPTS = "nalu_sweep.attempts"
TAG_ERROR = "nalu_sweep.error"  # the exception of a failed trial
TAG_PARENT = "mlflow.parentRunId"
TAG_MLFLOW_GIT = "mlflow.source.git.commit"
TAG_NODE = "nalu_sweep.node_ip"  # the Ray node a trial ran on
TAG_GPU_IDS = "nalu_sweep.gpu_ids"  # the GPUs Ray assigned a trial ("0", "0,1"; "none" without one)
TAG_DEVICE = "nalu_sweep.device"  # the torch device a trial or validation run trained on ("cuda:0", "cpu")
TAG_RESUMED_FROM = "nalu_sweep.resumed_from_step"  # a retried/resumed trial's checkpoint step
TAG_PARAMS_SHA256 = "nalu_sweep.params_sha256"  # digest of a completed trial's final parameters
TAG_PACK_GROUP = "nalu_sweep.pack_group"  # a packed trial: the Tune trial (pack) it trained in
TAG_PACK_INDEX = "nalu_sweep.pack_index"  # a packed trial: its place in the pack (0, 1, ...)
TAG_OPTUNA_TRIAL = "nalu_sweep.optuna_trial"  # a trial (packed or not): its Optuna trial number
TAG_SOURCE_RUN = "nalu_sweep.validates_run"  # a validation run: the trial run it re-trains
TAG_SEED_IDS = "nalu_sweep.seed_ids"  # a validation run: its fresh seed ids, "first-last"
TAG_BATCH = "nalu_sweep.validation_batch"  # validation runs made by one `validate` call
TAG_RACE_SEEDS = "nalu_sweep.race.seeds"  # a racing trial: the seeds it has trained (its blocks so far)
TAG_RACE_EXIT = "nalu_sweep.race.exit"  # a racing trial: "incumbent", or why it left (race.Exit's reason)
TAG_RACE_EXIT_BLOCK = "nalu_sweep.race.exit_block"  # a racing trial that left: after how many blocks
ROLE_SWEEP, ROLE_TRIAL, ROLE_VALIDATION = "sweep", "trial", "validation"  # values of TAG_ROLE
SPEC_ARTIFACT = "search_space/resolved_spec.json"  # the parent run's resolved search space
TAG_METRIC_POINTS = "nalu_sweep.metric_points"  # metric points a trial attempt logged (sent or spooled)

# An MLflow server with basic auth: the client reads these (Ray workers need them too).
CREDENTIAL_VARS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
                   "MLFLOW_TRACKING_INSECURE_TLS", "MLFLOW_TRACKING_SERVER_CERT_PATH")

DB_FILE = "mlflow.db"
ARTIFACT_DIR = "mlruns"


def default_tracking_uri(directory: str | Path | None = None) -> str:
    """``sqlite:////abs/dir/mlflow.db`` for ``directory`` (default: the working directory)."""
    path = (Path(directory) if directory else Path.cwd()).resolve() / DB_FILE
    return f"sqlite:///{path}"


def resolve_tracking_uri(option: str | None = None) -> str:
    """``--tracking-uri``, else ``$MLFLOW_TRACKING_URI``, else the embedded SQLite default.
    A relative ``sqlite:///file.db`` becomes absolute (trials run in other directories)."""
    uri = option or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = f"sqlite:///{Path(uri.removeprefix('sqlite:///')).resolve()}"
    elif "://" not in uri:  # a plain path: a file store directory
        uri = Path(uri).resolve().as_uri()
    return uri


def credential_env() -> dict[str, str]:
    """The MLflow client's credential variables that are set here (forwarded to Ray workers
    of a remote cluster, which do not inherit the driver's environment)."""
    return {k: os.environ[k] for k in CREDENTIAL_VARS if os.environ.get(k)}


def artifact_root(tracking_uri: str) -> str | None:
    """Absolute artifact directory for a SQLite store (``mlruns`` beside the database);
    ``None`` (the server's or file store's default) otherwise."""
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        return (db.parent / ARTIFACT_DIR).resolve().as_uri()
    return None


# MLflow's documented switch for the "🏃 View run … / 🧪 View experiment …" lines it prints
# to stdout each time a run of a tracking server ends (`mlflow.environment_variables`)
QUIET_RUN_LINKS_VAR = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"


def client(tracking_uri: str):
    """An `MlflowClient` bound to ``tracking_uri`` (no global MLflow state is touched).
    MLflow's own run links stay out of the output (the sweep prints its own links; a
    sweep's trials would print two lines each), unless the environment says otherwise."""
    from mlflow.tracking import MlflowClient

    os.environ.setdefault(QUIET_RUN_LINKS_VAR, "true")
    return MlflowClient(tracking_uri=tracking_uri)


def _is_locked(e: BaseException) -> bool:
    text = str(e).lower()
    return "locked" in text or "busy" in text


def is_transient(e: BaseException) -> bool:
    """True for errors that say "try again later": a locked SQLite file, a server that
    cannot be reached or times out, or one that answers 5xx / 429 (an MLflow REST error
    carries its HTTP status); False for a request the server refused (4xx) or a bug."""
    if _is_locked(e):
        return True
    judged = getattr(e, "transient", None)  # judged already where it happened (`helper.TrackingCallError`)
    if isinstance(judged, bool):
        return judged
    if isinstance(e, (ConnectionError, TimeoutError)):
        return True
    try:
        import requests

        if isinstance(e, (requests.ConnectionError, requests.Timeout)):
            return True
    except ImportError:  # pragma: no cover - mlflow depends on requests
        pass
    status = getattr(e, "get_http_status_code", None)
    if callable(status):
        try:
            code = int(status())
        except Exception:  # noqa: BLE001
            code = 0
        return code >= 500 or code in (408, 429)
    return False


def retry(fn: Callable[[], T], attempts: int = 8, delay_s: float = 0.2, patience_s: float | None = None) -> T:
    """Call ``fn``, retrying while SQLite reports a locked database (concurrent trials
    write to one file). With ``patience_s``, any transient error (`is_transient`: the
    server is away or overloaded) is also retried, with backoff from 0.5 s to 15 s, until
    that many seconds have passed. Any other error is raised at once."""
    deadline = None if patience_s is None else time.monotonic() + patience_s
    backoff = 0.5
    i = 0
    while True:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - MlflowException / sqlalchemy OperationalError
            i += 1
            if _is_locked(e) and i < attempts:
                time.sleep(delay_s * (2 ** (i - 1)))
                continue
            left = None if deadline is None else deadline - time.monotonic()
            if left is None or left <= 0 or not is_transient(e):
                raise
            if backoff == 0.5:
                import logging

                logging.getLogger("nalu_sweep.tracking").warning(
                    "tracking server unavailable (%s); retrying for up to %.0f s", type(e).__name__, left)
            time.sleep(min(backoff, left))
            backoff = min(backoff * 2, 15.0)


def tolerate_outages() -> None:
    """Make one MLflow HTTP call fail within seconds when the server is away (instead of
    its own retries over minutes), so the caller's backoff and spool are in control. Set
    only where unset: the environment may choose otherwise."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


def ensure_experiment(mlflow_client: Any, name: str, tracking_uri: str) -> str:
    """The id of experiment ``name``, created (with an absolute artifact location) if new;
    a deleted experiment of that name is restored."""
    from mlflow.entities import LifecycleStage

    exp = retry(lambda: mlflow_client.get_experiment_by_name(name))
    if exp is not None:
        if exp.lifecycle_stage == LifecycleStage.DELETED:
            retry(lambda: mlflow_client.restore_experiment(exp.experiment_id))
        return exp.experiment_id
    root = artifact_root(tracking_uri)
    location = f"{root}/{name}" if root else None
    if root:
        Path(root.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    return retry(lambda: mlflow_client.create_experiment(name, artifact_location=location))


def git_commit(directory: str | Path | None = None) -> str:
    """The commit of the code that runs (``+dirty`` with local changes); ``unknown`` when
    it is not a git checkout."""
    where = Path(directory) if directory else Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10)
        if commit.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
