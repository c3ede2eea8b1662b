"""A trial worker's side of its tracking helper (`service.tracking.helper`): the client that
starts the helper process, or connects to the sweep driver that answers the same calls
(`driver_tracking`), and sends it one call at a time.

Below the modules that use it (`runs`, `spool`'s journal): the helper process itself, which
makes the calls with those modules, is `service.tracking.helper`.
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
        """Run ``name`` (one of `service.tracking.helper`'s calls: ``find_or_create_run``, ``run_metrics``,
        ``send_write``) in the helper
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

    def find_or_create_run(self, *args: Any) -> tuple[str, int | None, int | None, dict[str, str]]:
        run_id, last, attempts, unlogged = self.call("find_or_create_run", *args)
        return run_id, last, attempts, dict(unlogged)

    def send_write(self, *args: Any) -> None:
        self.call("send_write", *args)

    def run_metrics(self, run_id: str) -> dict[str, float]:
        return dict(self.call("run_metrics", run_id))


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
