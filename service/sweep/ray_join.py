"""Joining a running Ray cluster that uses Ray's token authentication, as Ray documents a
client does it.

A client sends the cluster's token when ``RAY_AUTH_MODE=token``; it reads the token from
``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH`` names, else ``~/.ray/auth_token``
(which a first local ``ray.init()`` writes: token authentication is on by default for local
clusters since Ray 2.59, and ``ray start --head`` turns it on whenever that token exists).
Ray turns the client's mode on by itself only for a cluster it finds on its own
(``ray.init()`` with no address): joined by an address (``--address``, ``RAY_ADDRESS``), a
client with the token at hand connected without it, and Ray retried the refusal for 20 s,
one raw log line a second. So:

- `use_token_when_given`: with ``RAY_AUTH_MODE`` unset and a token at hand, the process
  uses token mode (as Ray 2.61 does for every cluster). Ray reads the mode once, when it is
  imported: every ``nalu-sweep`` verb calls this first (the app's callback).
- `join_watched`: a cluster whose address is known is joined with Ray's log lines held
  back and watched, so that a refused token is one `UserError` within a second or two
  (`token_error`), not 20 s of Ray's retries; any other failure is Ray's, as before.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.errors import UserError

MODE_ENV, TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
ADDRESS_ENV = "RAY_ADDRESS"
# the signal that ends Ray's wait for a cluster that refused the token (Tune uses SIGUSR1)
WAKE = signal.SIGUSR2
# what a refused token looks like: Ray's exception, and the GCS's answer in Ray's log lines
REFUSED = ("AuthenticationError", "InvalidAuthToken", "Unauthenticated")


def default_token_file() -> Path:
    """Where ``ray start --head`` writes the token and a client reads it by default."""
    return Path.home() / ".ray" / "auth_token"


def token_source() -> str | None:
    """Where Ray would take this process's token from, in Ray's order, or None when there
    is none: ``RAY_AUTH_TOKEN``, the file ``RAY_AUTH_TOKEN_PATH`` names (Ray refuses to
    start when that file is unreadable: `check_token_path`), ``~/.ray/auth_token``."""
    if os.environ.get(TOKEN_ENV, "").strip():
        return f"${TOKEN_ENV}"
    if os.environ.get(TOKEN_PATH_ENV):
        return f"${TOKEN_PATH_ENV} ({os.environ[TOKEN_PATH_ENV]})"
    try:
        found = default_token_file().read_text().strip()
    except (OSError, UnicodeDecodeError, RuntimeError):  # RuntimeError: no home directory
        return None
    return str(default_token_file()) if found else None


def use_token_when_given() -> None:
    """Token mode for this process (and the Ray it may start) when ``RAY_AUTH_MODE`` is
    unset and a token is at hand; a mode the user set is kept. A cluster without
    authentication ignores a token, and a Ray started here would have turned token mode on
    by itself. Nothing once Ray is imported: Ray has read the mode then, and a mode set
    later would only keep Ray from turning it on itself for a cluster it finds."""
    if "ray" not in sys.modules and MODE_ENV not in os.environ and token_source() is not None:
        os.environ[MODE_ENV] = "token"


def check_token_path() -> None:
    """An unreadable or empty ``RAY_AUTH_TOKEN_PATH`` is an error now, in our words (Ray
    raises it from inside ``ray.init``)."""
    path = os.environ.get(TOKEN_PATH_ENV)
    if not path:
        return
    try:
        ok = bool(Path(path).read_text().strip())
    except (OSError, UnicodeDecodeError):
        ok = False
    if not ok:
        raise UserError(f"${TOKEN_PATH_ENV}={path!r}: Ray reads the cluster's token from this file, and it is "
                        "missing, unreadable or empty; point it at a copy of the head node's ~/.ray/auth_token "
                        f"(`ray get-auth-token` on the head prints the token), or unset it")


def refused(error: BaseException | None, log: str = "") -> bool:
    """Whether a failed ``ray.init`` was the cluster refusing this process's token: Ray's
    `AuthenticationError` anywhere in the exception's chain (Ray keeps only the text of the
    last attempt's), or the GCS's refusal in Ray's log lines."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if any(word in f"{type(error).__name__} {error}" for word in REFUSED):
            return True
        error = error.__cause__ or error.__context__
    return "InvalidAuthToken" in log


def token_error(where: str) -> UserError:
    """The one paragraph for a cluster that refused this process's token: what was sent
    (or that nothing was), and how to give the cluster's token."""
    source, mode = token_source(), os.environ.get(MODE_ENV, "").strip().lower()
    give = (f"`ray get-auth-token` on the head node prints its token; then `export {TOKEN_ENV}=<token>` "
            f"here, or copy the head's ~/.ray/auth_token to this machine's (or point {TOKEN_PATH_ENV} at a copy)")
    if source is None:
        what = f"this machine has no token (no ${TOKEN_ENV}, ${TOKEN_PATH_ENV} or ~/.ray/auth_token): {give}"
    elif mode != "token":
        what = (f"{MODE_ENV}={mode or '(unset)'} here, so the token in {source} was not sent: unset {MODE_ENV} or "
                f"set it to token (before Ray is imported), and check the token is the cluster's ({give})")
    else:
        what = f"refused the token in {source}, which is not this cluster's: {give}"
    return UserError(f"cannot join {where}: it uses Ray's token authentication and {what}")


def join_target(address: str | None) -> str | None:
    """The ``host:port`` a plain ``ray.init(address)`` would join, when known without
    connecting: ``address``, else ``RAY_ADDRESS``, else the cluster ``ray start --head``
    recorded for ``ray.init()`` to find (`recorded_cluster`). None for ``auto``, ``local``,
    Ray Client (``ray://``) and when nothing is known: Ray then resolves it itself."""
    given = address or os.environ.get(ADDRESS_ENV, "").strip() or recorded_cluster()
    if not given or given in ("auto", "local") or "://" in given:
        return None
    return given


def recorded_cluster() -> str | None:
    """The address ``ray start --head`` left in Ray's temp directory (``$RAY_TMPDIR``, else
    ``$TMPDIR``, else /tmp, then ``ray/ray_current_cluster``) for ``ray.init()`` to find.
    That file is Ray's own, not an API: when it is missing or reads differently this is None,
    and the join takes Ray's own path (a refused token is then reported after Ray's 20 s)."""
    base = os.environ.get("RAY_TMPDIR") or (sys.platform.startswith("linux") and os.environ.get("TMPDIR")) or "/tmp"
    try:
        text = (Path(base) / "ray" / "ray_current_cluster").read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    host, sep, port = text.rpartition(":")
    return text if sep and host and port.isdigit() else None


@contextmanager
def _held_stderr() -> Iterator[Callable[[], str]]:
    """File descriptor 2 (where Ray's C++ core writes its log lines) appended to a temp file
    for the block; yields a function that reads what was written so far (from any thread)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryDirectory(prefix="nalu-sweep-ray-") as folder:
        path = Path(folder) / "stderr"
        writer = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(writer, 2)
        os.close(writer)
        try:
            yield lambda: path.read_bytes().decode(errors="replace")
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


class _Refused(Exception):
    """Raised in the main thread, inside ``ray.init``'s wait, once the cluster refused the token."""


def join_watched(where: str, init: Callable[..., Any], verbose: bool, **kwargs: Any) -> None:
    """``init(**kwargs)`` (``ray.init`` joining the cluster `join_target` named) with Ray's log
    lines held back and watched: the cluster's first refusal of the token is `token_error` at
    once. Ray's wait (it retries for 20 s, one attempt a second) is ended by a signal to this
    process's main thread (``_thread.interrupt_main``, handled only during the wait); off the
    main thread the refusal is reported when Ray gives up. The held lines are written out
    afterwards, unless they were the refusal's (then only with ``verbose``)."""
    main = threading.current_thread() is threading.main_thread()
    finished, refusal = threading.Event(), threading.Event()
    armed = [main]

    def stop_the_wait(signum: int, frame: Any) -> None:
        if armed[0] and refusal.is_set():
            raise _Refused

    error: BaseException | None = None
    with _held_stderr() as held:
        def watch() -> None:
            while not finished.wait(0.1):
                if "InvalidAuthToken" in held():
                    refusal.set()
                    if main:
                        _thread.interrupt_main(WAKE)
                    return

        previous = signal.signal(WAKE, stop_the_wait) if main else None
        watcher = threading.Thread(target=watch, name="nalu-sweep-ray-token", daemon=True)
        watcher.start()
        try:
            init(**kwargs)
        except Exception as e:  # noqa: BLE001 - a refused token (`_Refused` included) is reported below, the rest re-raised
            error = e
        finally:
            armed[0] = False
            finished.set()
            watcher.join()
            if main:
                signal.signal(WAKE, previous)
            log = held()
    denied = refusal.is_set() or refused(error, log)
    if verbose or not denied:
        sys.stderr.write(log)
        sys.stderr.flush()
    if error is None:
        return
    if denied:
        raise token_error(where) from None
    raise error
