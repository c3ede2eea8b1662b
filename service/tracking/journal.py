"""A trial's tracking writes survive a tracking server that is away: journal first, send later.

Every write of a trial run (metric batches, params, tags, artifacts, the final status) is
appended to a local JSON-lines journal, ``$NALU_SWEEP_SPOOL_DIR/<run id>/journal.jsonl``
(default ``~/.cache/nalu-sweep/spool``), then sent in order by one background thread.
While the server is unreachable or answers 5xx/429 the thread waits with exponential
backoff (0.5 s doubling to 15 s) and tries the same write again; nothing is dropped and
the trial goes on training. After each write the server acknowledged, a ``{"done": seq}``
line is appended, so a process that dies replays only what was never acknowledged (the
next `Outbox` of the same run, or ``python -m service.tracking.spool``). In a trial
worker the thread sends through the worker's helper process (`service.tracking.helper`),
which holds its MLflow client.

Replay is safe against the one write whose acknowledgement was lost: a metric point keeps
the timestamp it was journalled with, and MLflow's SQL stores (SQLite, PostgreSQL) ignore
a point equal to one already stored; params, tags, artifacts and the status overwrite.
What a journal still holds after its process ended is sent by `service.tracking.spool`.

`Outbox.close` waits for the journal to drain, up to ``$NALU_SWEEP_TRACKING_PATIENCE_S``
seconds (default 600); if the server is still away then, the journal is kept and the
message says where it is and how to upload it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.tracking.store import is_transient

log = logging.getLogger("nalu_sweep.tracking")

SPOOL_ENV = "NALU_SWEEP_SPOOL_DIR"
PATIENCE_ENV = "NALU_SWEEP_TRACKING_PATIENCE_S"
BACKOFF_MAX_ENV = "NALU_SWEEP_TRACKING_BACKOFF_MAX_S"
JOURNAL = "journal.jsonl"
META = "meta.json"
MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limit
UPLOAD_HINT = "python -m service.tracking.spool upload"


def spool_root() -> Path:
    """``$NALU_SWEEP_SPOOL_DIR``, else ``$XDG_CACHE_HOME/nalu-sweep/spool`` (``~/.cache``),
    else a directory under the system temp dir when the home is not writable."""
    if os.environ.get(SPOOL_ENV):
        return Path(os.environ[SPOOL_ENV]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = cache / "nalu-sweep" / "spool"
    try:
        root.mkdir(parents=True, exist_ok=True)
        return root
    except OSError:
        return Path(tempfile.gettempdir()) / f"nalu-sweep-spool-{os.getuid()}"


def patience_s() -> float:
    """How long a trial waits for an absent tracking server before it gives up on it."""
    return float(os.environ.get(PATIENCE_ENV, "600"))


@dataclass
class Entry:
    seq: int
    op: str  # metrics, params, tags, artifacts, status
    data: Any


def send_write(client: Any, run_id: str, op: str, data: Any, directory: str) -> None:
    """Send one journalled write (``op``, its plain ``data``) of run ``run_id`` with an
    `MlflowClient`; an artifact write names its folder under the run's spool ``directory``."""
    from mlflow.entities import Metric, Param, RunTag

    if op == "metrics":
        metrics = [Metric(k, float(v), int(ts), int(step)) for k, v, ts, step in data]
        for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            client.log_batch(run_id, metrics=metrics[i:i + MAX_METRICS_PER_BATCH])
    elif op == "params":
        client.log_batch(run_id, params=[Param(k, str(v)) for k, v in data.items()])
    elif op == "tags":
        client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in data.items()])
    elif op == "artifacts":
        client.log_artifacts(run_id, str(Path(directory) / data["dir"]), data["path"])
    elif op == "status":
        client.set_terminated(run_id, status=data)
    else:
        raise ValueError(f"unknown journal entry {op!r}")


class Outbox:
    """The journal and sender of one MLflow run (see the module docstring).

    ``sent_points`` counts the metric points the server acknowledged, ``logged_points``
    those handed to the outbox by this process; both exclude replayed entries of an
    earlier process (``replayed_points``). ``journalled_step`` is the highest metric step
    an earlier process journalled (sent or not; None if none)."""

    def __init__(self, client: Any, run_id: str, tracking_uri: str = "", root: Path | None = None,
                 backoff_s: tuple[float, float] | None = None, skip_stored: bool = False) -> None:
        self.client = client
        self.run_id = run_id
        self.directory = (root or spool_root()) / run_id
        self.journal = self.directory / JOURNAL
        _make_run_directory(self.directory, self.journal)
        if tracking_uri:
            (self.directory / META).write_text(json.dumps({"run_id": run_id, "tracking_uri": tracking_uri}))
        max_backoff = float(os.environ.get(BACKOFF_MAX_ENV, "15"))
        self.backoff_s = backoff_s or (0.5, max_backoff)
        self.logged_points = 0
        self.sent_points = 0
        self.rejected: list[tuple[int, str]] = []
        self.outage_s = 0.0
        self._lock = threading.Condition()
        self._queue: deque[Entry] = deque()
        self._seq = 0
        self._busy = False
        self._stop = False
        self.journalled_step: int | None = None
        self.replayed_points = self._load(skip_stored)
        self._file = self.journal.open("a", encoding="utf-8")
        self._thread = threading.Thread(target=self._send_loop, name=f"outbox-{run_id[:8]}", daemon=True)
        self._thread.start()

    # -- the journal ----------------------------------------------------------------------------
    def _load(self, skip_stored: bool = False) -> int:
        """Queue the entries an earlier process journalled but never got acknowledged (with
        ``skip_stored``, less the metric points the store holds already: `_drop_stored`)."""
        if not self.journal.exists():
            return 0
        entries: dict[int, Entry] = {}
        done = 0
        with self.journal.open(encoding="utf-8") as f:
            for line in f:
                try:
                    item = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a crash: it was never acknowledged either
                if "done" in item:
                    done = max(done, int(item["done"]))
                elif "seq" in item:
                    entries[int(item["seq"])] = Entry(int(item["seq"]), item["op"], item["data"])
                    if item["op"] == "metrics" and item["data"]:
                        step = max(int(p[3]) for p in item["data"])
                        self.journalled_step = max(step, self.journalled_step or step)
        self._seq = max([done, *entries])
        pending = [entries[s] for s in sorted(entries) if s > done]
        if skip_stored:
            self._drop_stored(pending)
        self._queue.extend(pending)
        points = sum(len(e.data) for e in pending if e.op == "metrics")
        if pending:
            log.warning("run %s: replaying %d tracking writes (%d metric points) left unsent in %s",
                        self.run_id, len(pending), points, self.journal)
        return points

    def _drop_stored(self, pending: list[Entry]) -> None:
        """Leave out of ``pending`` each metric point whose (key, step) the run holds already
        or an earlier entry sends: a point stored without its acknowledgement, or one the
        sweep's driver logged, with its own timestamp, when it closed a stopped trial's run.
        Asks the store (an `MlflowClient`) for the history of each key once."""
        keys = {p[0] for e in pending if e.op == "metrics" for p in e.data}
        seen = {(k, m.step) for k in sorted(keys) for m in self.client.get_metric_history(self.run_id, k)}
        for entry in pending:
            if entry.op != "metrics":
                continue
            kept = []
            for point in entry.data:
                if (point[0], int(point[3])) not in seen:
                    seen.add((point[0], int(point[3])))
                    kept.append(point)
            entry.data = kept

    def _append(self, item: dict[str, Any]) -> None:
        if self._file.closed:  # closed with writes left: the journal already says so
            return
        self._file.write(json.dumps(item, separators=(",", ":")) + "\n")
        self._file.flush()

    def put(self, op: str, data: Any) -> None:
        with self._lock:
            if self._stop:
                raise RuntimeError(f"the outbox of run {self.run_id} is closed")
            self._seq += 1
            entry = Entry(self._seq, op, data)
            self._append({"seq": entry.seq, "op": op, "data": data})
            self._queue.append(entry)
            if op == "metrics":
                self.logged_points += len(data)
            self._lock.notify_all()

    # -- what a run writes ----------------------------------------------------------------------
    def log_metrics(self, points: list[tuple[str, float, int, int]]) -> None:
        """Points ``(key, value, timestamp_ms, step)``; the timestamp is fixed now."""
        if points:
            self.put("metrics", [list(p) for p in points])

    def log_params(self, params: dict[str, str]) -> None:
        items = list(params.items())
        for i in range(0, len(items), 100):
            self.put("params", dict(items[i:i + 100]))

    def set_tags(self, tags: dict[str, str]) -> None:
        items = [(k, str(v)) for k, v in tags.items()]
        for i in range(0, len(items), 100):
            self.put("tags", dict(items[i:i + 100]))

    def log_artifacts(self, directory: Path, artifact_path: str | None = None) -> None:
        """Copy ``directory`` into the spool now (the caller may delete it), upload later."""
        import uuid

        slot = f"artifacts/{uuid.uuid4().hex}"
        shutil.copytree(directory, self.directory / slot)
        self.put("artifacts", {"dir": slot, "path": artifact_path})

    def set_status(self, status: str) -> None:
        self.put("status", status)

    # -- sending --------------------------------------------------------------------------------
    def _next(self) -> list[Entry] | None:
        """The next write: one entry, or consecutive metric entries merged up to the batch limit."""
        with self._lock:
            while not self._queue and not self._stop:
                self._lock.wait()
            if not self._queue:
                return None
            self._busy = True
            first = self._queue[0]
            batch = [first]
            if first.op == "metrics":
                size = len(first.data)
                for entry in list(self._queue)[1:]:
                    if entry.op != "metrics" or size + len(entry.data) > MAX_METRICS_PER_BATCH:
                        break
                    batch.append(entry)
                    size += len(entry.data)
            return batch

    def _send(self, batch: list[Entry]) -> None:
        from service.tracking.helper_client import HelperClient

        first = batch[0]
        data = [p for e in batch for p in e.data] if first.op == "metrics" else first.data
        if isinstance(self.client, HelperClient):  # a trial worker's: MLflow is in the helper process
            self.client.send_write(self.run_id, first.op, data, str(self.directory))
        else:
            send_write(self.client, self.run_id, first.op, data, str(self.directory))

    def _send_loop(self) -> None:
        delay = self.backoff_s[0]
        away_since: float | None = None
        while True:
            batch = self._next()
            if batch is None:
                return
            try:
                self._send(batch)
            except Exception as e:  # noqa: BLE001 - sorted into transient and permanent below
                if is_transient(e):
                    if away_since is None:
                        away_since = time.monotonic()
                        log.warning("run %s: tracking server unavailable (%s); keeping writes in %s and "
                                    "retrying", self.run_id, short_error(e), self.journal)
                    with self._lock:
                        self._busy = False
                        if self._stop:
                            return
                        self._lock.wait(delay)
                    delay = min(delay * 2, self.backoff_s[1])
                    continue
                log.error("run %s: the tracking server rejected a %s write: %s", self.run_id, batch[0].op, short_error(e))
                self.rejected.append((batch[0].seq, short_error(e)))
                with self._lock:
                    self._append({"rejected": batch[0].seq, "error": short_error(e)})
            if away_since is not None:
                self.outage_s += time.monotonic() - away_since
                log.warning("run %s: tracking server back after %.0f s", self.run_id, time.monotonic() - away_since)
                away_since = None
            delay = self.backoff_s[0]
            with self._lock:
                for _ in batch:
                    self._queue.popleft()
                self._append({"done": batch[-1].seq})
                self.sent_points += sum(len(e.data) for e in batch if e.op == "metrics")
                self._busy = False
                self._lock.notify_all()

    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until every write was acknowledged (True) or ``timeout_s`` passed (False)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while self._queue or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._lock.wait(left if left is None else min(left, 1.0))
            return True

    def close(self, timeout_s: float | None = None) -> bool:
        """Drain (up to ``timeout_s``, default the patience), stop the sender and delete the
        spool of this run when everything arrived. Never raises for an absent server: it
        logs where the journal is kept and how to upload it, and returns False."""
        drained = self.drain(patience_s() if timeout_s is None else timeout_s)
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        self._thread.join(timeout=5)
        self._file.close()
        if drained:
            shutil.rmtree(self.directory, ignore_errors=True)
            remove_empty(self.directory.parent)
        else:
            log.error("run %s: the tracking server did not take %d writes within %.0f s; they are kept in %s: "
                      "upload them with '%s %s' once it is back", self.run_id, self.pending(),
                      patience_s() if timeout_s is None else timeout_s, self.journal, UPLOAD_HINT, self.directory)
        return drained


def _make_run_directory(directory: Path, journal: Path, tries: int = 100) -> None:
    """Create ``directory`` holding ``journal`` (empty if new). Another process's
    `remove_empty` may delete the folder between its ``mkdir`` and the journal's creation
    (it is empty then): made again until the journal is in it, which no `remove_empty`
    deletes."""
    for _ in range(tries):
        directory.mkdir(parents=True, exist_ok=True)
        try:
            journal.open("a", encoding="utf-8").close()
            return
        except FileNotFoundError:
            continue
    raise OSError(f"could not create the tracking journal {journal}: its folder keeps being removed")


def remove_empty(root: Path) -> None:
    """Delete the run folders under the spool ``root`` that hold no file (left by a trial
    stopped while it closed its spool, e.g. a pruned one). Safe beside other processes
    that create, fill or delete run folders at the same time: a folder is removed only
    while empty (``rmdir``, innermost first), one that vanishes or fills meanwhile is
    left to them."""
    try:
        children = list(root.iterdir())
    except OSError:
        return
    for child in children:
        remove_if_empty(child)


def remove_if_empty(folder: Path) -> None:
    """Remove ``folder`` if no file is under it (its empty sub-folders with it); nothing
    if it holds a file, is not a folder, or is gone."""
    walk = list(os.walk(folder, topdown=False))  # innermost first; a folder gone meanwhile is skipped
    if not walk or any(files for _, _, files in walk):
        return
    for path, _, _ in walk:
        try:
            os.rmdir(path)
        except OSError:
            return  # a file arrived, or another process removed it: theirs now


def short_error(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) < 300 else text[:300] + "…"
