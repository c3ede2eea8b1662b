"""A local sweep's driver answers its trial workers' tracking calls itself.

A trial worker's tracking calls (open its run, send a journalled write: `helper`) need an
MLflow client with the store open. A worker's own helper process imports MLflow and opens
the store (about 5 s of CPU on a 2-core machine), on the cores the worker needs to load
torch and train, while the driver of a local sweep has that client open already and mostly
waits. So the driver listens on a Unix socket beside the sweep's announcement (`helper.
announced`: a private directory) and answers each worker that connects with the same loop
the helper runs (`helper.answer_calls`), with its own client; a worker that cannot connect
(the trials ended, another node, a driver that serves none) starts its helper as before.

Only for a database store (SQLite, PostgreSQL, ...): a worker's calls to an MLflow server
fail within seconds when it is away (`store.tolerate_outages`, set in the helper's own
environment) so that the worker's spool takes over, and the driver's own calls keep MLflow's
longer retries; so a server's workers keep their helpers.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.tracking import helper


class DriverTracking:
    """Listening from creation; calls wait until `use` gives the client (the driver opens its
    store while Ray starts), and end with `close`."""

    def __init__(self, path: Path, tracking_uri: str) -> None:
        self.tracking_uri = tracking_uri
        self._client: Any = None
        self._ready = threading.Event()
        self._closed = threading.Event()
        self._connections: list[socket.socket] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen()
        self._listener.settimeout(0.5)  # to see `close` without relying on accept waking up
        threading.Thread(target=self._accept, name="nalu-sweep-tracking", daemon=True).start()

    def use(self, client: Any) -> None:
        """Answer the calls (those waiting and those to come) with ``client``."""
        self._client = client
        self._ready.set()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            connection.settimeout(None)
            self._connections.append(connection)
            threading.Thread(target=self._answer, args=(connection,), name="nalu-sweep-tracking-worker",
                             daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as receive, connection.makefile("wb") as send:
            while not self._ready.wait(0.5):
                if self._closed.is_set():
                    return
            helper.answer_calls(receive, send, {self.tracking_uri: self._client})

    def close(self) -> None:
        """Stop listening and end every connection: a worker's next call starts its helper."""
        self._closed.set()
        self._listener.close()
        for connection in self._connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serves(tracking_uri: str) -> bool:
    """Whether a driver answers its workers' calls for ``tracking_uri``: a database store."""
    return not tracking_uri.startswith(("http://", "https://")) and hasattr(socket, "AF_UNIX")


@contextmanager
def served(announcement: Path, tracking_uri: str, local: bool) -> Iterator[DriverTracking | None]:
    """While open, this driver answers the tracking calls of the workers of its own local Ray
    (``local``) for ``tracking_uri``, once `DriverTracking.use` has given it the client;
    None where it does not (`serves`), or where the socket cannot be made."""
    tracking = None
    if local and serves(tracking_uri):
        try:
            tracking = DriverTracking(announcement.parent / helper.DRIVER_SOCKET, tracking_uri)
        except OSError:  # e.g. a path too long for a Unix socket: the workers start their helpers
            tracking = None
    try:
        yield tracking
    finally:
        if tracking is not None:
            tracking.close()
