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
    TAG_ATTEMPTS, TAG_GIT_COMMIT, TAG_MLFLOW_GIT, TAG_OUTCOME, TAG_PARENT, TAG_ROLE,
    TAG_SPACE_FILE, TAG_SPACE_HASH, TAG_STORAGE, TAG_SWEEP, TAG_TRIAL_KEY, retry,
)

MAX_PARAM_LENGTH = 6000
FINAL_STATUS = {
    "completed": "FINISHED", "pruned": "FINISHED", "failed": "FAILED", "interrupted": "KILLED",
}


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _all_runs(client: Any, experiment_ids: list[str], filter_string: str) -> list[Any]:
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
    runs = _all_runs(client, [experiment_id],
                     f"tags.`{TAG_ROLE}` = 'sweep' AND tags.`{TAG_SWEEP}` = {_quote(sweep)}")
    runs.sort(key=lambda r: r.info.start_time or 0, reverse=True)
    return runs[0] if runs else None


def start_sweep_run(client: Any, experiment_id: str, sweep: str, *, space_file: Path | None,
                    spec_json: str, spec_hash: str, storage_path: str, params: dict[str, Any]) -> str:
    """Create the parent run: tags (sweep name, git commit, search-space hash), the search
    space file and the resolved spec as artifacts, the sweep's settings as params."""
    commit = store.git_commit()
    tags = {
        TAG_ROLE: "sweep", TAG_SWEEP: sweep, TAG_SPACE_HASH: spec_hash, TAG_GIT_COMMIT: commit,
        TAG_STORAGE: storage_path, TAG_OUTCOME: "running",
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
    retry(lambda: client.set_tag(run_id, TAG_OUTCOME, "running"))


def close_stale_trial_runs(client: Any, experiment_id: str, parent_run_id: str) -> list[str]:
    """Mark child runs still RUNNING (their process died with the driver) as KILLED /
    ``interrupted``; a resumed trial reopens its own run. Returns the run ids closed."""
    closed = []
    for run in trial_runs(client, experiment_id, parent_run_id):
        if run.info.status in ("RUNNING", "SCHEDULED"):
            retry(lambda: client.set_tag(run.info.run_id, TAG_OUTCOME, "interrupted"))
            retry(lambda: client.set_terminated(run.info.run_id, status="KILLED"))
            closed.append(run.info.run_id)
    return closed


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
    return _all_runs(client, [experiment_id],
                     f"tags.`{TAG_PARENT}` = {_quote(parent_run_id)} AND tags.`{TAG_ROLE}` = 'trial'")


def log_params(client: Any, run_id: str, params: dict[str, Any]) -> None:
    from mlflow.entities import Param

    items = [Param(str(k), str(v)[:MAX_PARAM_LENGTH]) for k, v in params.items()]
    for i in range(0, len(items), 100):
        chunk = items[i:i + 100]
        retry(lambda: client.log_batch(run_id, params=chunk))


# -- a child (trial) run: opened, fed and closed inside the trial --------------------------------------
class TrialRun:
    """The MLflow child run of one Tune trial.

    `open` reuses the run tagged with the same trial key under the same parent (a retry or
    a resumed trial), else creates one. Metrics are sent as one asynchronous batch per
    evaluation; `close` waits for them, then sets the final status. Steps already logged by
    an earlier attempt are skipped, so a restarted trial leaves one consistent series.
    """

    def __init__(self, client: Any, run_id: str, resumed_from_step: int | None) -> None:
        self.client = client
        self.run_id = run_id
        self.resumed_from_step = resumed_from_step
        self._pending: list[Any] = []
        self.closed = False

    @classmethod
    def open(cls, tracking_uri: str, experiment_id: str, parent_run_id: str, trial_key: str,
             run_name: str, params: dict[str, Any], tags: dict[str, str] | None = None) -> "TrialRun":
        client = store.client(tracking_uri)
        existing = _all_runs(client, [experiment_id],
                             f"tags.`{TAG_PARENT}` = {_quote(parent_run_id)} AND "
                             f"tags.`{TAG_TRIAL_KEY}` = {_quote(trial_key)}")
        if existing:
            run = max(existing, key=lambda r: r.info.start_time or 0)
            run_id = run.info.run_id
            attempts = int(run.data.tags.get(TAG_ATTEMPTS, "1")) + 1
            history = retry(lambda: client.get_metric_history(run_id, "objective"))
            last = max((m.step for m in history), default=None)
            retry(lambda: client.update_run(run_id, status="RUNNING"))
            # the caller's tags describe this attempt (a retry may run on another node)
            for key, value in {**(tags or {}), TAG_ATTEMPTS: str(attempts), TAG_OUTCOME: "running"}.items():
                retry(lambda: client.set_tag(run_id, key, value))
            trial = cls(client, run_id, last)
        else:
            all_tags = {TAG_PARENT: parent_run_id, TAG_ROLE: "trial", TAG_TRIAL_KEY: trial_key,
                        TAG_ATTEMPTS: "1", TAG_OUTCOME: "running", **(tags or {})}
            run = retry(lambda: client.create_run(experiment_id, tags=all_tags, run_name=run_name))
            trial = cls(client, run.info.run_id, None)
            log_params(client, trial.run_id, params)
        return trial

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """One batch of finite metrics at ``step`` (asynchronous)."""
        from mlflow.entities import Metric

        if self.resumed_from_step is not None and step <= self.resumed_from_step:
            return
        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, int(step)) for k, v in metrics.items()
                 if v is not None and math.isfinite(float(v))]
        for i in range(0, len(batch), 900):
            chunk = batch[i:i + 900]
            try:
                op = self.client.log_batch(self.run_id, metrics=chunk, synchronous=False)
                self._pending.append((op, chunk))
            except Exception:  # noqa: BLE001 - fall back to a synchronous write
                retry(lambda: self.client.log_batch(self.run_id, metrics=chunk))

    def flush(self) -> None:
        """Wait for queued metric batches; a batch that failed is written again synchronously."""
        pending, self._pending = self._pending, []
        for op, chunk in pending:
            try:
                op.wait()
            except Exception:  # noqa: BLE001
                retry(lambda: self.client.log_batch(self.run_id, metrics=chunk))

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        batch = [RunTag(k, str(v)) for k, v in tags.items()]
        retry(lambda: self.client.log_batch(self.run_id, tags=batch))

    def log_artifact_dir(self, directory: Path, artifact_path: str | None = None) -> None:
        retry(lambda: self.client.log_artifacts(self.run_id, str(directory), artifact_path))

    def close(self, outcome: str) -> None:
        """Flush metrics, tag the outcome and set the MLflow status (idempotent)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.flush()
        finally:
            retry(lambda: self.client.set_tag(self.run_id, TAG_OUTCOME, outcome))
            retry(lambda: self.client.set_terminated(self.run_id, status=FINAL_STATUS.get(outcome, "FAILED")))
