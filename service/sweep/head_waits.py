"""The lean head's start without three of Ray's fixed waits (Ray 2.60, measured on a 2-core
machine; `ray_head` applies them only where it starts the lean head itself).

* **The node's registration is polled every 20 ms**, not every second: `ray.init` asks the
  GCS for its new node through a call that, while the raylet has not registered yet (it
  waits for its agents), sleeps a whole second before it asks again, so the driver
  connects on average half a second after the node is up (0.7–1.0 s in most starts).
  `registered_node` asks the GCS itself until the node is alive, then lets Ray's call
  find it at once.
* **The raylet retries its object-store connection every 100 ms**, not every second: it
  connects to the store its own thread is still starting, and in about a third of starts
  the first try comes too early and costs a full second. The number of tries goes up as
  the interval goes down, so the patience stays Ray's 10 s (`raylet_env`; the workers
  inherit it). A user's own setting of either is left alone.
* **The check for the dashboard's dependencies looks for them** before it imports them:
  Ray imports them to decide whether the raylet's dashboard agent is minimal, and
  where aiohttp is installed (MLflow brings it) but the rest is not, the driver spends
  0.3–0.7 s importing it for an ImportError. Where one of them is missing the answer is
  that ImportError without the imports; where all are there, Ray's own check runs.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

RETRY_MS_SETTING = "RAY_raylet_client_connect_timeout_milliseconds"
ATTEMPTS_SETTING = "RAY_raylet_client_num_connect_attempts"
RETRY_MS, ATTEMPTS = 100, 100  # Ray's own: 1000 ms × 10
POLL_S, PATIENCE_S = 0.02, 30.0  # Ray waits 30 s for its node's registration
OPTIONAL_DEPS = "ray.dashboard.optional_deps"


def raylet_env() -> dict[str, str]:
    """The raylet's connection retry settings, or none where the user set either."""
    if RETRY_MS_SETTING in os.environ or ATTEMPTS_SETTING in os.environ:
        return {}
    return {RETRY_MS_SETTING: str(RETRY_MS), ATTEMPTS_SETTING: str(ATTEMPTS)}


def missing_dependency(module: str = OPTIONAL_DEPS) -> str | None:
    """The first top-level package ``module`` imports that is not installed, or None (also
    where its source cannot be read: then nothing is known to be missing)."""
    try:
        spec = importlib.util.find_spec(module)
        with open(spec.origin, encoding="utf-8") as f:  # type: ignore[union-attr]
            tree = ast.parse(f.read())
    except Exception:  # noqa: BLE001 - no answer here: Ray's own check decides
        return None
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    for name in dict.fromkeys(names):
        if importlib.util.find_spec(name) is None:
            return name
    return None


def _dependency_check(original: Callable[[], ImportError | None]) -> Callable[[], ImportError | None]:
    def get_dashboard_dependency_error() -> ImportError | None:
        name = missing_dependency()
        if name is not None:
            return ModuleNotFoundError(f"No module named {name!r}", name=name)
        return original()

    return get_dashboard_dependency_error


def registered_node(gcs_address: str, node_id: str, alive: Callable[[], bool] | None = None,
                    patience_s: float = PATIENCE_S) -> bool:
    """Wait, asking every `POLL_S`, until the GCS at ``gcs_address`` lists ``node_id`` as
    alive; False if it did not within ``patience_s`` or could not be asked."""
    if alive is None:
        try:
            from ray._private import services, state

            accessor = state.GlobalState()  # the private handle Ray's own lookup uses
            accessor._initialize_global_state(services._get_gcs_client_options(gcs_address))
        except Exception:  # noqa: BLE001 - Ray's own wait decides
            return False

        def alive() -> bool:
            return any(n.get("NodeID") == node_id and n.get("Alive") for n in accessor.node_table())

    deadline = time.monotonic() + patience_s
    while True:
        try:
            found = alive()
        except Exception:  # noqa: BLE001 - the GCS not answering yet is asked again
            found = False
        if found:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)


def _node_lookup(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_node(gcs_address, node_id, *args, **kwargs):
        registered_node(gcs_address, node_id)
        return original(gcs_address, node_id, *args, **kwargs)

    return get_node


@contextmanager
def without_fixed_waits() -> Iterator[bool]:
    """While open, Ray's node lookup and dependency check are the ones above; yields whether
    they are (not where Ray's layout differs). Restored on exit, whatever happens."""
    try:
        from ray._private import services, utils
    except ImportError:
        yield False
        return
    lookup = services.__dict__.get("get_node")
    check = utils.__dict__.get("get_dashboard_dependency_error")
    if not callable(lookup) or not callable(check):
        yield False
        return
    services.get_node = _node_lookup(lookup)
    utils.get_dashboard_dependency_error = _dependency_check(check)
    try:
        yield True
    finally:
        services.get_node = lookup
        utils.get_dashboard_dependency_error = check
