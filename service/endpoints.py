"""Probe the servers named on the command line before anything heavy starts.

An unreachable MLflow server is otherwise retried by the MLflow client for minutes (7
retries with exponential backoff, 120 s per request by default), and an unreachable Ray
GCS by Ray itself; a server that accepts the connection but never answers would hang
forever. Each probe here takes at most ``connect_timeout()`` seconds (default 5,
``$NALU_SWEEP_CONNECT_TIMEOUT``) and fails with one paragraph: what was unreachable, and
how to fix it.

- ``--tracking-uri http(s)://…``: a TCP connect and ``GET /health``; any HTTP answer counts.
- ``--tracking-uri`` / ``--optuna-storage`` of a database server (PostgreSQL, MySQL): a TCP
  connect to its host and port.
- ``--address host:port`` or ``ray://host:port``: a TCP connect.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time
from typing import Any, Callable
from urllib.parse import urlsplit

from service.errors import UserError
from service.formatting import redact

TIMEOUT_ENV = "NALU_SWEEP_CONNECT_TIMEOUT"
DEFAULT_TIMEOUT_S = 5.0
MAX_TIMEOUT_S = 60.0

TRACKING_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql", "databricks")
_DB_PORTS = {"postgresql": 5432, "postgres": 5432, "mysql": 3306, "mssql": 1433}
_RAY_CLIENT_PORT = 10001


class UnreachableError(UserError):
    """A server named on the command line does not answer."""


def connect_timeout() -> float:
    """Seconds each probe may take: ``$NALU_SWEEP_CONNECT_TIMEOUT`` or 5."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_TIMEOUT_S:
        raise UserError(f"${TIMEOUT_ENV}={raw!r}: a number of seconds, > 0 and ≤ {MAX_TIMEOUT_S:g}")
    return value


def _bounded(timeout_s: float, fn: Callable[[], Any]) -> Any:
    """``fn()`` in a daemon thread, given up after ``timeout_s`` (name resolution has no
    timeout of its own); its exception is re-raised here."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e

    thread = threading.Thread(target=target, name="nalu-sweep-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _reason(e: BaseException, timeout_s: float) -> str:
    if isinstance(e, (socket.timeout, TimeoutError)):
        return str(e) if "within" in str(e) else f"no answer within {timeout_s:g} s"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, socket.gaierror):
        return f"unknown host ({e.strerror or e})"
    if isinstance(e, ssl.SSLError):
        return f"TLS failed ({e.reason or e})"
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def _tcp(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s

    def connect() -> None:
        with socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic())):
            pass

    _bounded(timeout_s, connect)


def _http_answers(host: str, port: int, tls: bool, path: str, timeout_s: float) -> None:
    """Connect, send ``GET path`` and wait for the first bytes of an HTTP status line."""
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"the server accepted the connection but sent no answer within {timeout_s:g} s")
        return remaining

    def probe() -> None:
        sock = socket.create_connection((host, port), timeout=left())
        try:
            if tls:
                context = ssl.create_default_context()
                if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE
                sock = context.wrap_socket(sock, server_hostname=host)
            sock.settimeout(left())
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            answer = b""
            while len(answer) < 5:
                sock.settimeout(left())
                try:
                    chunk = sock.recv(64)
                except socket.timeout:
                    raise TimeoutError("the server accepted the connection but sent no answer within "
                                       f"{timeout_s:g} s") from None
                if not chunk:
                    break
                answer += chunk
            if not answer.startswith(b"HTTP/"):
                raise ConnectionError("it did not answer as an HTTP server" if answer
                                      else "it closed the connection without an answer")
        finally:
            sock.close()

    _bounded(timeout_s + 0.5, probe)


def _host_port(netloc_uri: str, default_port: int | None) -> tuple[str, int]:
    parts = urlsplit(netloc_uri)
    port = parts.port or default_port  # ValueError for a port that is not a number in range
    if not parts.hostname or port is None:
        raise ValueError("no host or port")
    return parts.hostname, port


def check_tracking_uri(uri: str, flag: str = "--tracking-uri") -> None:
    """An MLflow server or database server named by ``uri`` answers; an unknown scheme is
    an error. Local stores (``sqlite:///``, ``file://``) need no probe."""
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    base = scheme.split("+", 1)[0]
    if base not in TRACKING_SCHEMES:
        raise UserError(f"{flag} {redact(uri)!r}: not a tracking store MLflow can use; give an MLflow "
                        "server (http://host:5000), a database (sqlite:///mlflow.db, "
                        "postgresql://user@host/db), a directory, or leave it out for ./mlflow.db")
    if base in ("http", "https"):
        try:
            host, port = _host_port(uri, 443 if base == "https" else 80)
        except ValueError:
            raise UserError(f"{flag} {redact(uri)!r}: not a server address; write e.g. "
                            "http://mlflow.example:5000") from None
        path = urlsplit(uri).path.rstrip("/") + "/health"
        timeout = connect_timeout()
        try:
            _http_answers(host, port, base == "https", path, timeout)
        except (OSError, ValueError) as e:
            raise UnreachableError(
                f"cannot reach the MLflow tracking server at {redact(uri)} ({_reason(e, timeout)})"
                f"; start it (on this machine: nalu-sweep ui --tracking-uri sqlite:///mlflow.db --port {port}; "
                f"for a team, the authenticated server of docs/cluster.md), check the "
                f"address, raise ${TIMEOUT_ENV} for a slow network, or leave out {flag} to record "
                "into the embedded ./mlflow.db") from None
    elif base in _DB_PORTS:
        check_database_url(uri, flag, "the MLflow tracking database")


def check_database_url(url: str, flag: str = "--optuna-storage", what: str = "the Optuna study database") -> None:
    """A database server URL (``postgresql+psycopg://user:pass@host:5432/db``) answers a
    TCP connect; SQLite files need no probe."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    base = scheme.split("+", 1)[0]
    if base == "sqlite" or base not in _DB_PORTS:
        return
    try:
        host, port = _host_port(url, _DB_PORTS[base])
    except ValueError:
        raise UserError(f"{flag} {redact(url)!r}: not a database address; write e.g. "
                        f"{base}://user:password@host:{_DB_PORTS[base]}/name") from None
    timeout = connect_timeout()
    try:
        _tcp(host, port, timeout)
    except (OSError, ValueError) as e:
        raise UnreachableError(
            f"cannot reach {what} at {redact(url)} ({_reason(e, timeout)}); start the "
            f"database server, check the host, port and credentials, or leave out {flag}") from None


def parse_ray_address(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``host:port`` or ``ray://host[:port]``; ``None`` for ``auto``
    and ``local``; `UserError` for anything else."""
    text = address.strip()
    if text in ("auto", "local"):
        return None
    default = None
    if text.startswith("ray://"):
        default, text = _RAY_CLIENT_PORT, text.removeprefix("ray://")
    elif "://" in text:
        text = ""
    try:
        return _host_port(f"//{text}", default) if text and "/" not in text else _bad_address(address)
    except ValueError:
        return _bad_address(address)


def _bad_address(address: str) -> Any:
    raise UserError(f"--address {address!r}: not a Ray address; write host:port of the head node "
                    "(e.g. 10.0.0.5:6379), ray://host:10001 for Ray Client, or 'auto'")


def reachable(address: str) -> bool:
    """Whether a Ray address (``host:port``) answers a TCP connect within ``connect_timeout()``:
    a quiet `check_ray_address`, for an address Ray found rather than the user gave."""
    try:
        target = parse_ray_address(address)
    except UserError:
        return False
    if target is None:
        return False
    try:
        _tcp(*target, connect_timeout())
    except (OSError, ValueError):
        return False
    return True


def check_ray_address(address: str | None) -> None:
    """An explicit Ray address answers a TCP connect (Ray retries an unreachable GCS for
    minutes before it gives up)."""
    if not address:
        return
    target = parse_ray_address(address)
    if target is None:
        return
    timeout = connect_timeout()
    try:
        _tcp(*target, timeout)
    except (OSError, ValueError) as e:
        raise UnreachableError(
            f"cannot reach the Ray cluster at {address!r} ({_reason(e, timeout)}); start "
            "one with 'ray start --head', check the address and port, or leave out --address to "
            "run on a local Ray") from None
