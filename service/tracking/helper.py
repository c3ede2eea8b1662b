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
import sys
from typing import Any

from service.tracking import store
from service.tracking.helper_client import (  # the worker's side, named here as before
    ANNOUNCEMENT_VAR,
    DRIVER_SOCKET,
    HelperClient,
    TrackingCallError,
    announced,
    driver_socket,
    same_code_env,
    shared,
    use_announcement,
)

__all__ = ["ANNOUNCEMENT_VAR", "DRIVER_SOCKET", "HelperClient", "TrackingCallError", "announced",
           "answer_calls", "driver_socket", "same_code_env", "serve", "shared", "use_announcement"]


def _calls() -> dict[str, Any]:
    from service.tracking.runs import find_or_create_run, run_metrics
    from service.tracking.spool import send_write

    return {"find_or_create_run": find_or_create_run, "run_metrics": run_metrics, "send_write": send_write}


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
