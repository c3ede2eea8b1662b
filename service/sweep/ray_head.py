"""A local Ray head without the processes a sweep never uses.

`ray.init` on a fresh machine starts, besides the GCS and the raylet (which starts its two
agents), three Python processes that each import Ray (1–2 s of CPU apiece) and that a
sweep's own local cluster does not need:

* the **autoscaler monitor**: a local cluster has a fixed size;
* the **API server** (``dashboard.py``): with ``include_dashboard=False`` it loads only
  Ray's usage-statistics module, and usage statistics are off; `ray.init` waits until it
  has registered, on the critical path of every sweep;
* the **log monitor**: it forwards the workers' output to the driver, which only
  ``--verbose`` asks for (``log_to_driver``); without it the workers still write their logs
  to the session's files.

`ray.init` has no option to leave them out (``ray start`` has ``--no-monitor`` and
``--include-log-monitor`` but always starts the API server, and a cluster it starts
outlives the sweep), so `lean_head` replaces the three `Node` methods that start them for
the duration of one `ray.init`. It is used only when this process starts the head itself
(no ``--address``); `ray.shutdown` then stops everything the head did start. Where Ray's
internals differ from what this expects (another Ray release), or where
``NALU_SWEEP_RAY_HEAD=full``, Ray's usual head starts instead."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

# ``full``: start every process of Ray's usual head (the escape hatch, should a Ray
# release make the lean head misbehave)
HEAD_ENV = "NALU_SWEEP_RAY_HEAD"
MONITOR, API_SERVER, LOG_MONITOR = "start_monitor", "start_api_server", "start_log_monitor"


def skipped_starts(verbose: bool) -> tuple[str, ...]:
    """The `Node` methods `lean_head` replaces: the log monitor stays when the workers'
    output is forwarded (``--verbose``)."""
    if os.environ.get(HEAD_ENV, "").strip().lower() == "full":
        return ()
    return (MONITOR, API_SERVER) if verbose else (MONITOR, API_SERVER, LOG_MONITOR)


def _skip_api_server(node, *, include_dashboard=None, raise_on_failure=False) -> None:
    node._webui_url = ""  # what Ray records for a head whose dashboard is left out


def _skip(node) -> None:
    return None


@contextmanager
def lean_head(verbose: bool) -> Iterator[tuple[str, ...]]:
    """While open, a head node `ray.init` starts leaves out the processes of
    `skipped_starts`; yields the names of the replaced methods (empty when Ray's usual head
    starts). The methods are restored on exit, whatever happens."""
    try:
        from ray._private.node import Node
    except ImportError:  # another Ray layout: its usual head
        yield ()
        return
    names = skipped_starts(verbose)
    saved = {n: Node.__dict__[n] for n in names if callable(Node.__dict__.get(n))}
    if len(saved) != len(names):  # not the Ray this was written for: leave its head whole
        names, saved = (), {}
    for n in names:
        setattr(Node, n, _skip_api_server if n == API_SERVER else _skip)
    try:
        yield names
    finally:
        for n, method in saved.items():
            setattr(Node, n, method)
