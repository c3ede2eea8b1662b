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
``NALU_SWEEP_RAY_HEAD=full``, Ray's usual head starts instead.

Three more changes to that head's raylet (`raylet_command`), on its command line:

* the **dashboard agent** of a minimal Ray install (``--minimal``: no dashboard dependencies,
  so it loads no module) is replaced by `agent_stub`, which writes the agent's ports as
  "not in use" at once: the raylet registers its node only when the agent has written
  them, about 2 s after it started the agent on a 2-core machine, while the agent imported
  Ray. A full install's agent (metrics, logs) is left as it is;
* the **runtime-env agent** starts behind `env_agent_relay`, which writes the agent's port
  at once (the raylet starts no Python worker before it is written: about 1.3 s later with
  Ray's agent, which imports Ray first) and starts Ray's agent only when the raylet first
  asks it for a runtime environment, relaying to it; a sweep whose trials need none
  never starts it;
* it **prestarts** ``warm_workers`` Python workers when the driver connects (Ray's default
  would be one per CPU), which a sweep's trials take as their actors' workers: started
  during Tune's set-up, they have imported Ray (and what their setup hook imports) when
  the first trial needs them. Without warm workers none is prestarted.

And it starts without three of Ray's fixed waits (`head_waits`): the driver polls for the
node's registration every 20 ms rather than every second, the raylet retries its
object-store connection every 100 ms rather than every second, and the dashboard's
dependencies are looked for rather than imported."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from service.sweep import agent_stub, env_agent_relay, head_waits

# ``full``: start every process of Ray's usual head (the escape hatch, should a Ray
# release make the lean head misbehave)
HEAD_ENV = "NALU_SWEEP_RAY_HEAD"
MONITOR, API_SERVER, LOG_MONITOR = "start_monitor", "start_api_server", "start_log_monitor"
# the raylet's options this rewrites, and Ray's system setting that turns prestarting on
AGENT_OPTION, PRESTART_OPTION = "--dashboard_agent_command=", "--num_prestart_python_workers="
AGENT_SCRIPT = os.path.join("dashboard", "agent.py")
ENV_AGENT_OPTION = "--runtime_env_agent_command="
ENV_AGENT_SCRIPT = os.path.join("runtime_env", "agent", "main.py")
PRESTART_SETTING = "RAY_prestart_worker_first_driver"


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


def _agent_port_names() -> list[str] | None:
    """The files the dashboard agent writes its ports to, then the one the runtime-env agent
    writes its port to."""
    try:
        from ray import _raylet
    except ImportError:
        return None
    names = [getattr(_raylet, n, None) for n in ("METRICS_AGENT_PORT_NAME", "METRICS_EXPORT_PORT_NAME",
                                                 "DASHBOARD_AGENT_LISTEN_PORT_NAME", "RUNTIME_ENV_AGENT_PORT_NAME")]
    return names if all(isinstance(n, str) and n for n in names) else None


def raylet_command(command: list[str], warm_workers: int, port_names: list[str] | None,
                   env_agent_port_name: str | None = None) -> tuple[list[str], bool]:
    """The raylet's ``command`` with a minimal dashboard agent replaced by `agent_stub` (where
    ``port_names``, the files Ray's agent writes, are known), the runtime-env agent started
    behind `env_agent_relay` (where ``env_agent_port_name``, its file, is known) and
    ``warm_workers`` workers to prestart (no more than Ray's own count, one per CPU); returns
    it and whether prestarting is to be turned on. An option not found as expected is left
    as it is."""
    out, prestart = [], False
    for arg in command:
        if arg.startswith(AGENT_OPTION) and port_names:
            agent = shlex.split(arg[len(AGENT_OPTION):])
            scripts = [i for i, a in enumerate(agent) if a.endswith(AGENT_SCRIPT)]
            if "--minimal" in agent and len(scripts) == 1:
                agent[scripts[0]] = str(Path(agent_stub.__file__).resolve())
                agent.append(agent_stub.PORT_NAMES_FLAG + ",".join(port_names))
                arg = AGENT_OPTION + subprocess.list2cmdline(agent)
        elif arg.startswith(ENV_AGENT_OPTION) and env_agent_port_name:
            agent = shlex.split(arg[len(ENV_AGENT_OPTION):])
            scripts = [i for i, a in enumerate(agent) if a.endswith(ENV_AGENT_SCRIPT)]
            if len(scripts) == 1:
                real = agent[scripts[0]]
                agent[scripts[0]] = str(Path(env_agent_relay.__file__).resolve())
                agent += [env_agent_relay.REAL_AGENT_FLAG + real, env_agent_relay.PORT_NAME_FLAG + env_agent_port_name]
                arg = ENV_AGENT_OPTION + subprocess.list2cmdline(agent)
        elif arg.startswith(PRESTART_OPTION) and arg[len(PRESTART_OPTION):].isdigit():
            count = min(warm_workers, int(arg[len(PRESTART_OPTION):]))  # Ray's own: one per CPU
            if count > 0:
                arg, prestart = f"{PRESTART_OPTION}{count}", True
        out.append(arg)
    return out, prestart


@contextmanager
def _rewritten_raylet(warm_workers: int) -> Iterator[None]:
    """While open, the raylet Ray starts runs `raylet_command`'s command; restored on exit."""
    try:
        from ray._private import ray_constants, services
    except ImportError:
        yield
        return
    original = services.__dict__.get("start_ray_process")
    raylet = getattr(ray_constants, "PROCESS_TYPE_RAYLET", None)
    if not callable(original) or not raylet:
        yield
        return
    port_names = _agent_port_names()

    def start_ray_process(command, process_type, *args, **kwargs):
        if process_type == raylet:
            command, prestart = raylet_command(list(command), warm_workers, port_names and port_names[:3],
                                               port_names and port_names[3])
            env = head_waits.raylet_env()
            if prestart:  # otherwise the raylet reads what the environment says (`init_ray`: off)
                env[PRESTART_SETTING] = "1"
            kwargs["env_updates"] = {**(kwargs.get("env_updates") or {}), **env}
        return original(command, process_type, *args, **kwargs)

    services.start_ray_process = start_ray_process
    try:
        yield
    finally:
        services.start_ray_process = original


@contextmanager
def lean_head(verbose: bool, warm_workers: int = 0) -> Iterator[tuple[str, ...]]:
    """While open, a head node `ray.init` starts leaves out the processes of
    `skipped_starts`, and its raylet runs `raylet_command`'s command (``warm_workers``
    workers prestarted); yields the names of the replaced methods (empty when Ray's usual
    head starts). Everything is restored on exit, whatever happens."""
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
        with _rewritten_raylet(warm_workers) if names else nullcontext(), \
                head_waits.without_fixed_waits() if names else nullcontext():
            yield names
    finally:
        for n, method in saved.items():
            setattr(Node, n, method)
