"""MLflow runs of a sweep: one parent run per sweep, one child run per trial.

A child run is found again by a stable key (the Tune trial id, tagged
``nalu_sweep.trial_key`` under its parent), so a trial that is retried after a crash or
resumed after the driver died reuses its run instead of leaving a second one behind.
Everything goes through an explicit `MlflowClient` with run ids: no global active run,
which Ray's reused actors and trial threads would otherwise share.
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any

from service.tracking import store
from service.tracking.store import (
    TAG_ATTEMPTS,
    TAG_GIT_COMMIT,
    TAG_METRIC_POINTS,
    TAG_MLFLOW_GIT,
    TAG_OUTCOME,
    TAG_PARENT,
    TAG_ROLE,
    TAG_SPACE_FILE,
    TAG_SPACE_HASH,
    TAG_STORAGE,
    TAG_SWEEP,
    TAG_TRIAL_KEY,
    Outcome,
    retry,
)

MAX_PARAM_LENGTH = 6000
FINAL_STATUS = {
    Outcome.COMPLETED: "FINISHED", Outcome.PRUNED: "FINISHED", Outcome.FAILED: "FAILED", Outcome.INTERRUPTED: "KILLED",
}


def quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def all_runs(client: Any, experiment_ids: list[str], filter_string: str) -> list[Any]:
    """Every matching run (all pages)."""
    runs: list[Any] = []
    token = None
    while True:
        page = retry(lambda: client.search_runs(experiment_ids, filter_string=filter_string,
                                                max_results=1000, page_token=token))
        runs.extend(page)
        token = page.token
        if not token:
            return runs


# -- the parent (sweep) run: created and closed by the driver ------------------------------------------
def find_sweep_run(client: Any, experiment_id: str, sweep: str) -> Any | None:
    """The most recent parent run of ``sweep`` in the experiment, or ``None``."""
    runs = all_runs(client, [experiment_id],
                     f"tags.`{TAG_ROLE}` = 'sweep' AND tags.`{TAG_SWEEP}` = {quote(sweep)}")
    runs.sort(key=lambda r: r.info.start_time or 0, reverse=True)
    return runs[0] if runs else None


def start_sweep_run(client: Any, experiment_id: str, sweep: str, *, space_file: Path | None,
                    spec_json: str, spec_hash: str, storage_path: str, params: dict[str, Any]) -> str:
    """Create the parent run: tags (sweep name, git commit, search-space hash), the search
    space file and the resolved spec as artifacts, the sweep's settings as params."""
    commit = store.git_commit()
    tags = {
        TAG_ROLE: "sweep", TAG_SWEEP: sweep, TAG_SPACE_HASH: spec_hash, TAG_GIT_COMMIT: commit,
        TAG_STORAGE: storage_path, TAG_OUTCOME: Outcome.RUNNING,
        "mlflow.note.content": f"nalu-sweep {sweep}: one child run per trial",
    }
    if commit != "unknown":
        tags[TAG_MLFLOW_GIT] = commit.removesuffix("+dirty")
    if space_file is not None:
        tags[TAG_SPACE_FILE] = str(space_file)
    run = retry(lambda: client.create_run(experiment_id, tags=tags, run_name=sweep))
    run_id = run.info.run_id
    log_params(client, run_id, params)
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "resolved_spec.json"
        spec.write_text(spec_json)
        retry(lambda: client.log_artifact(run_id, str(spec), "search_space"))
        if space_file is not None and Path(space_file).is_file():
            retry(lambda: client.log_artifact(run_id, str(space_file), "search_space"))
    return run_id


def reopen_sweep_run(client: Any, run_id: str) -> None:
    retry(lambda: client.update_run(run_id, status="RUNNING"))
    retry(lambda: client.set_tag(run_id, TAG_OUTCOME, Outcome.RUNNING))


def close_stale_trial_runs(client: Any, experiment_id: str, parent_run_id: str,
                           tracking_uri: str | None = None) -> list[str]:
    """Mark child runs still RUNNING (their process died with the driver) as KILLED /
    ``interrupted``; a resumed trial reopens its own run. With ``tracking_uri``, the writes
    this machine's spool still holds for such a run are sent first (`spool.replay_left_over`),
    and a run they closed stays as they left it. Returns the run ids closed."""
    from service.tracking.spool import replay_left_over

    closed = []
    open_states = ("RUNNING", "SCHEDULED")
    for run in trial_runs(client, experiment_id, parent_run_id):
        if run.info.status in open_states and tracking_uri and replay_left_over(run.info.run_id, tracking_uri):
            run = retry(lambda run=run: client.get_run(run.info.run_id))
        if run.info.status in open_states:
            retry(lambda: client.set_tag(run.info.run_id, TAG_OUTCOME, Outcome.INTERRUPTED))
            retry(lambda: client.set_terminated(run.info.run_id, status="KILLED"))
            closed.append(run.info.run_id)
    return closed


def send_left_over_writes(client: Any, experiment_id: str, parent_run_id: str) -> list[str]:
    """Send the writes this machine's spool still holds for the parent's trial runs (a trial
    Tune stopped can be killed while its outbox drains: `spool.send_left_over`), before the
    sweep's end closes those runs from Tune's view: the run then holds the trial's own last
    points and close, and its journal is removed. Returns the run ids sent."""
    from service.tracking.spool import journalled_runs, send_left_over

    journalled = journalled_runs()
    if not journalled:
        return []
    mine = [r.info.run_id for r in trial_runs(client, experiment_id, parent_run_id) if r.info.run_id in journalled]
    return send_left_over(client, mine)


def settle_trial_run(client: Any, run_id: str, outcome: str, metrics: dict[str, float] | None = None,
                     step: int = 0) -> None:
    """Close a child run on the trial's behalf (its process was stopped before it could),
    logging the trial's last reported metrics if given."""
    from mlflow.entities import Metric

    logged = retry(lambda: client.get_metric_history(run_id, "objective"))
    if metrics and max((m.step for m in logged), default=-1) < step:
        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, int(step)) for k, v in metrics.items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
        if batch:
            retry(lambda: client.log_batch(run_id, metrics=batch[:900]))
    retry(lambda: client.set_tag(run_id, TAG_OUTCOME, outcome))
    retry(lambda: client.set_terminated(run_id, status=FINAL_STATUS.get(outcome, "KILLED")))


def finish_sweep_run(client: Any, run_id: str, outcome: str, metrics: dict[str, float] | None = None) -> None:
    """Close the parent run: ``completed`` → FINISHED, ``failed`` → FAILED, else KILLED."""
    from mlflow.entities import Metric

    if metrics:
        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, 0) for k, v in metrics.items() if math.isfinite(v)]
        retry(lambda: client.log_batch(run_id, metrics=batch))
    retry(lambda: client.set_tag(run_id, TAG_OUTCOME, outcome))
    retry(lambda: client.set_terminated(run_id, status=FINAL_STATUS.get(outcome, "KILLED")))


def trial_runs(client: Any, experiment_id: str, parent_run_id: str) -> list[Any]:
    """Every child run of the parent."""
    return all_runs(client, [experiment_id],
                     f"tags.`{TAG_PARENT}` = {quote(parent_run_id)} AND tags.`{TAG_ROLE}` = 'trial'")


def log_params(client: Any, run_id: str, params: dict[str, Any]) -> None:
    from mlflow.entities import Param

    items = [Param(str(k), str(v)[:MAX_PARAM_LENGTH]) for k, v in params.items()]
    for i in range(0, len(items), 100):
        chunk = items[i:i + 100]
        retry(lambda: client.log_batch(run_id, params=chunk))


# -- a child (trial) run: opened, fed and closed inside the trial --------------------------------------
def find_or_create_run(client: Any, experiment_id: str, parent_run_id: str, trial_key: str, run_name: str,
                       tags: dict[str, str], params: dict[str, str] | None = None,
                       ) -> tuple[str, int | None, int | None, dict[str, str]]:
    """A trial's child run: (run id, last logged step, attempt, the ``params`` it lacks) of
    the run found by its trial key, set running again; else a new run's id, None, None and
    every param. Looked up again on every try, so a create whose answer was lost is found
    instead of created twice. A found run may lack params: an attempt killed between its
    create and its first write (a driver killed then takes the answer with it) left none;
    the caller logs them, and a param the run holds keeps its value."""
    params = dict(params or {})
    existing = all_runs(client, [experiment_id],
                        f"tags.`{TAG_PARENT}` = {quote(parent_run_id)} AND tags.`{TAG_TRIAL_KEY}` = {quote(trial_key)}")
    if existing:
        run = max(existing, key=lambda r: r.info.start_time or 0)
        history = client.get_metric_history(run.info.run_id, "objective")
        last = max((m.step for m in history), default=None)
        client.update_run(run.info.run_id, status="RUNNING")
        missing = {k: v for k, v in params.items() if k not in run.data.params}
        return run.info.run_id, last, int(run.data.tags.get(TAG_ATTEMPTS, "1")) + 1, missing
    all_tags = {TAG_PARENT: parent_run_id, TAG_ROLE: "trial", TAG_TRIAL_KEY: trial_key,
                TAG_ATTEMPTS: "1", TAG_OUTCOME: Outcome.RUNNING, **tags}
    run = client.create_run(experiment_id, tags=all_tags, run_name=run_name)
    return run.info.run_id, None, None, params


def run_metrics(client: Any, run_id: str) -> dict[str, float]:
    """A run's latest value of each metric (MLflow's: the value at the highest step)."""
    return {k: float(v) for k, v in client.get_run(run_id).data.metrics.items()}


class TrialRun:
    """The MLflow child run of one Tune trial.

    `open` reuses the run tagged with the same trial key under the same parent (a retry or
    a resumed trial), else creates one; it waits out an absent server (up to the patience
    of `service.tracking.spool`), since a trial may start while the server is away.
    Every later write goes through the run's `Outbox`: journalled locally, sent in order in
    the background, retried while the server is away, so neither a metric point nor an
    artifact is lost and the trial is never failed for it. `close` tags the outcome and
    the number of metric points logged (``nalu_sweep.metric_points``), sets the status,
    and waits for everything to arrive. Steps already logged by an earlier attempt are
    skipped, so a restarted trial leaves one consistent series.
    """

    def __init__(self, client: Any, run_id: str, resumed_from_step: int | None, tracking_uri: str = "") -> None:
        from service.tracking.spool import Outbox

        self.client = client
        self.run_id = run_id
        self.outbox = Outbox(client, run_id, tracking_uri)
        # an earlier attempt's points still on their way (its journal, replayed now, or its
        # last write in flight) count as logged: the series keeps one point per step
        steps = [s for s in (resumed_from_step, self.outbox.journalled_step) if s is not None]
        self.resumed_from_step = max(steps, default=None)
        self.closed = False

    @classmethod
    def open(cls, tracking_uri: str, experiment_id: str, parent_run_id: str, trial_key: str,
             run_name: str, params: dict[str, Any], tags: dict[str, str] | None = None,
             client: Any = None) -> "TrialRun":
        """``client``: an `MlflowClient`, or a trial worker's `helper.HelperClient`
        (default: a new `MlflowClient` for ``tracking_uri``)."""
        from service.tracking.helper_client import HelperClient
        from service.tracking.spool import patience_s

        store.tolerate_outages()
        client = client if client is not None else store.client(tracking_uri)
        patience = patience_s()
        logged = {str(k): str(v)[:MAX_PARAM_LENGTH] for k, v in params.items()}
        args = (experiment_id, parent_run_id, trial_key, run_name, tags or {}, logged)
        if isinstance(client, HelperClient):
            run_id, last, attempts, unlogged = retry(lambda: client.find_or_create_run(*args), patience_s=patience)
        else:
            run_id, last, attempts, unlogged = retry(lambda: find_or_create_run(client, *args), patience_s=patience)
        trial = cls(client, run_id, last, tracking_uri)
        if attempts is not None:
            # the caller's tags describe this attempt (a retry may run on another node)
            trial.outbox.set_tags({**(tags or {}), TAG_ATTEMPTS: str(attempts), TAG_OUTCOME: Outcome.RUNNING})
        if unlogged:  # a new run's params, or those an earlier attempt was killed before it logged
            trial.outbox.log_params(unlogged)
        return trial

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """One batch of finite metrics at ``step`` (journalled now, sent in the background)."""
        if self.resumed_from_step is not None and step <= self.resumed_from_step:
            return
        now = int(time.time() * 1000)
        self.outbox.log_metrics([(k, float(v), now, int(step)) for k, v in metrics.items()
                                 if v is not None and math.isfinite(float(v))])

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every write so far has reached the server (True), or ``timeout_s``."""
        return self.outbox.drain(timeout_s)

    def latest_metrics(self, timeout_s: float | None = None) -> dict[str, float] | None:
        """The run's latest metrics once every write so far (an earlier attempt's journal
        included) has reached the server; None if they did not within ``timeout_s``."""
        if not self.flush(timeout_s):
            return None
        read = getattr(self.client, "run_metrics", None)  # a worker's helper
        return retry(lambda: read(self.run_id) if read else run_metrics(self.client, self.run_id))

    def set_tags(self, tags: dict[str, str]) -> None:
        self.outbox.set_tags(tags)

    def log_artifact_dir(self, directory: Path, artifact_path: str | None = None) -> None:
        """Upload the files of ``directory`` (copied into the spool first: it may go away)."""
        self.outbox.log_artifacts(directory, artifact_path)

    def close(self, outcome: str) -> None:
        """Tag the outcome, set the MLflow status and wait for every write to arrive, up to
        the patience (idempotent; never raises for an absent server)."""
        if self.closed:
            return
        self.closed = True
        self.outbox.set_tags({TAG_OUTCOME: outcome, TAG_METRIC_POINTS: str(self.outbox.logged_points)})
        self.outbox.set_status(FINAL_STATUS.get(outcome, "FAILED"))
        self.outbox.close()
