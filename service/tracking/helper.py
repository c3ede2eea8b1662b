"""A trial worker's MLflow client in a process of its own, so the two imports overlap.

A trial worker imports torch (to train) and MLflow (to record the trial): two seconds or
more each, one after the other under one interpreter lock, on the critical path of every
sweep's first trial. `shared` starts a helper process, ``python -m service.tracking.helper``,
before the worker imports torch; the helper imports MLflow on another core meanwhile and
then makes the worker's two kinds of tracking call for it: open (find or create) a trial's
run, and send one journalled write of a run's `Outbox`. The worker never imports MLflow.

The calls and their answers are JSON lines over a pipe pair (not stdout: MLflow may
print; and nothing the project reads is unpickled). An error in the helper comes back as
`TrackingCallError`, marked transient as `store.is_transient` judged it there, so the
worker's retries and its outage handling (`spool`) work as with a client of its own; a
helper that died is a transient error, and the next call starts a new one. The helper ends
when the worker does (its pipe closes). A trial starts its helper first thing
(`service.sweep.trainable`), so that MLflow loads there while torch loads in the worker.
Artifacts are read from the worker's spool by path: the helper runs on the worker's node.
Where the sweep's driver answers these calls itself (a sweep on this machine's Ray and a
database store: `driver_tracking`), the worker connects to it instead (`driver_socket`, found
through the announcement its trial's settings name: `use_announcement`) and starts no helper.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.tracking import store


class TrackingCallError(RuntimeError):
    """A tracking call that failed in the helper; ``transient`` as `store.is_transient`
    judged the original error there."""

    def __init__(self, message: str, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


def same_code_env() -> dict[str, str]:
    """This process's environment with the package root of the running ``service`` first on
    ``PYTHONPATH``: the helper runs this very code, whatever else is installed."""
    root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, *paths])}


class HelperClient:
    """The worker's side: one helper process for one tracking URI, started on creation."""

    def __init__(self, tracking_uri: str) -> None:
        self.tracking_uri = tracking_uri
        self._lock = threading.Lock()  # a call and its answer at a time: trial thread and outbox threads share it
        self._proc: subprocess.Popen | None = None
        self._connection: socket.socket | None = None  # to the driver's `driver_tracking` instead
        self._send = self._receive = None
        self._start()

    def _start(self) -> None:
        store.tolerate_outages()  # the helper's MLflow reads these from its environment
        if self._connect_to_driver():
            return
        to_helper_r, to_helper_w = os.pipe()
        from_helper_r, from_helper_w = os.pipe()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "service.tracking.helper", str(to_helper_r), str(from_helper_w), self.tracking_uri],
            pass_fds=(to_helper_r, from_helper_w), stdin=subprocess.DEVNULL, close_fds=True, env=same_code_env())
        os.close(to_helper_r)
        os.close(from_helper_w)
        self._send = os.fdopen(to_helper_w, "wb")
        self._receive = os.fdopen(from_helper_r, "rb")

    def _connect_to_driver(self) -> bool:
        """Where this worker's local sweep driver answers tracking calls for this URI
        (`driver_tracking`), its socket instead of a process: nothing to import or open."""
        path = driver_socket(self.tracking_uri)
        if path is None:
            return False
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(path)
        except OSError:
            connection.close()
            return False
        self._connection = connection
        self._send, self._receive = connection.makefile("wb"), connection.makefile("rb")
        return True

    def _alive(self) -> bool:
        return self._connection is not None or (self._proc is not None and self._proc.poll() is None)

    def _stop(self) -> None:
        for f in (self._send, self._receive, self._connection):
            try:
                f.close()
            except (OSError, AttributeError):
                pass
        self._connection = None
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def call(self, name: str, *args: Any) -> Any:
        """Run ``name`` (one of `_calls`: ``find_or_create_run``, ``send_write``) in the helper
        with this URI's client."""
        with self._lock:
            if not self._alive():
                self._stop()
                self._start()
            try:
                self._send.write(json.dumps([name, self.tracking_uri, args]).encode() + b"\n")
                self._send.flush()
                line = self._receive.readline()
                if not line:
                    raise EOFError("no answer")
                ok, value = json.loads(line)
            except (OSError, EOFError, ValueError) as e:
                self._stop()  # the next call starts a new helper
                raise TrackingCallError(f"the tracking helper ended ({type(e).__name__})", True) from None
        if not ok:
            raise TrackingCallError(*value)
        return value

    def find_or_create_run(self, *args: Any) -> tuple[str, int | None, int | None]:
        run_id, last, attempts = self.call("find_or_create_run", *args)
        return run_id, last, attempts

    def send_write(self, *args: Any) -> None:
        self.call("send_write", *args)


_SHARED: dict[str, HelperClient] = {}
_SHARED_LOCK = threading.Lock()


def shared(tracking_uri: str) -> HelperClient:
    """This process's helper for ``tracking_uri`` (started now if it has none yet): a worker
    that Tune reuses for the next trial keeps its helper, MLflow imported."""
    with _SHARED_LOCK:
        if tracking_uri not in _SHARED:
            _SHARED[tracking_uri] = HelperClient(tracking_uri)
        return _SHARED[tracking_uri]


# a file that holds the tracking URI the sweep's driver answers calls for (`announced`),
# named in this variable of a trial worker's environment (`use_announcement`)
ANNOUNCEMENT_VAR = "NALU_SWEEP_HELPER_FILE"


# where a local sweep's driver answers its workers' tracking calls: beside the announcement
DRIVER_SOCKET = "tracking.sock"


def use_announcement(path: str | None) -> None:
    """A trial worker's tracking calls go to the sweep driver's socket beside ``path`` (the
    driver's `announced` file, passed in the trial's settings) where it can reach it; with
    None, to its own helper."""
    if path:
        os.environ[ANNOUNCEMENT_VAR] = path
    else:
        os.environ.pop(ANNOUNCEMENT_VAR, None)


def driver_socket(tracking_uri: str) -> str | None:
    """The socket of this worker's sweep driver, which answers the calls for ``tracking_uri``
    itself (`driver_tracking`), while the sweep's trials run; else None."""
    path = os.environ.get(ANNOUNCEMENT_VAR)
    if not path:
        return None
    try:
        if Path(path).read_text().strip() != tracking_uri:
            return None
    except OSError:
        return None
    sock = Path(path).parent / DRIVER_SOCKET
    return str(sock) if sock.exists() else None


@contextmanager
def announced(tracking_uri: str) -> Iterator[Path]:
    """A private file holding ``tracking_uri`` while the block runs (the sweep's trials), for
    `driver_socket`; gone afterwards."""
    directory = Path(tempfile.mkdtemp(prefix="nalu-sweep-helper-"))  # mode 0700: the URI may hold credentials
    path = directory / "tracking_uri"
    try:
        path.write_text(tracking_uri)
        yield path
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _calls() -> dict[str, Any]:
    from service.tracking.runs import find_or_create_run
    from service.tracking.spool import send_write

    return {"find_or_create_run": find_or_create_run, "send_write": send_write}


def _warm_client(tracking_uri: str) -> Any:
    """``tracking_uri``'s client, a database store opened by one cheap query (MLflow
    imports the SQL store's modules, SQLAlchemy and alembic, only then)."""
    client = store.client(tracking_uri)
    if tracking_uri.startswith(("http://", "https://")):
        return client  # a REST client: no store to open
    try:
        client.search_experiments(max_results=1)
    except Exception:  # noqa: BLE001, S110 - only a warm-up
        pass
    return client


def serve(receive: Any, send: Any, tracking_uri: str) -> None:
    """The helper's loop: MLflow imported and ``tracking_uri``'s store opened first, then
    one call at a time until the pipe closes."""
    store.tolerate_outages()
    answer_calls(receive, send, {tracking_uri: _warm_client(tracking_uri)})


def answer_calls(receive: Any, send: Any, clients: dict[str, Any]) -> None:
    """One call at a time from ``receive``, answered on ``send``, with the client of the
    call's URI (opened on first use where ``clients`` has none), until the caller closes its
    end: the helper's loop, and a local sweep's driver's for each worker (`driver_tracking`)."""
    calls = _calls()
    while True:
        try:
            line = receive.readline()
        except OSError:
            return
        if not line:  # the worker closed its end: it has ended
            return
        name, uri, args = json.loads(line)
        try:
            if uri not in clients:
                clients[uri] = store.client(uri)
            answer = (True, calls[name](clients[uri], *args))
        except Exception as e:  # noqa: BLE001 - every error goes back to the worker, judged here
            answer = (False, (f"{type(e).__name__}: {e}", store.is_transient(e)))
        try:
            send.write(json.dumps(answer).encode() + b"\n")
            send.flush()
        except OSError:
            return


if __name__ == "__main__":
    with os.fdopen(int(sys.argv[1]), "rb") as _receive, os.fdopen(int(sys.argv[2]), "wb") as _send:
        serve(_receive, _send, sys.argv[3])
