"""The raylet of a sweep's lean local head (`ray_head.raylet_command`): a minimal install's
dashboard agent replaced by `agent_stub`, which writes the agent's ports as "not in use" and
lives as long as the raylet; the runtime-env agent behind `env_agent_relay`; the workers to
prestart for the first trials. (The head
started for real: `test_ray_stop.py`.)"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.sweep import agent_stub, env_agent_relay
from service.sweep.ray_head import (
    AGENT_OPTION,
    ENV_AGENT_OPTION,
    PRESTART_OPTION,
    raylet_command,
)

PORTS = ["metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port"]
AGENT = ["/usr/bin/python3", "-u", "/site/ray/dashboard/agent.py", "--node-id=abc", "--session-dir=/tmp/s",
         "--logging-format=%(asctime)s\t%(message)s"]


def _raylet(agent: list[str], prestart: int = 2) -> list[str]:
    return ["/site/ray/core/src/ray/raylet/raylet", "--node_ip_address=127.0.0.1",
            AGENT_OPTION + subprocess.list2cmdline(agent), f"{PRESTART_OPTION}{prestart}", "--head"]


def _agent(command: list[str]) -> list[str]:
    (arg,) = [a for a in command if a.startswith(AGENT_OPTION)]
    return shlex.split(arg[len(AGENT_OPTION):])


def test_a_minimal_agent_is_replaced_by_the_stub_and_its_arguments_kept():
    command, prestart = raylet_command(_raylet([*AGENT, "--minimal", "--head"]), 0, PORTS)
    agent = _agent(command)
    assert agent[2] == str(Path(agent_stub.__file__).resolve())
    assert agent[:2] == AGENT[:2] and agent[3:-1] == [*AGENT[3:], "--minimal", "--head"]  # a tab survives quoting
    assert agent[-1] == agent_stub.PORT_NAMES_FLAG + ",".join(PORTS)
    assert f"{PRESTART_OPTION}2" in command and prestart is False  # no warm workers: Ray's count, turned off


def test_a_full_agent_or_an_unknown_layout_is_left_as_it_is():
    full = _raylet(AGENT)  # ray[default]: its agent serves metrics and logs
    assert raylet_command(full, 0, PORTS)[0] == full
    minimal = _raylet([*AGENT, "--minimal"])
    assert raylet_command(minimal, 0, None)[0] == minimal  # port names unknown
    other = _raylet(["/usr/bin/python3", "/site/ray/agent_v2.py", "--minimal"])
    assert raylet_command(other, 0, PORTS)[0] == other


ENV_AGENT = ["/usr/bin/python3", "-u", "/site/ray/_private/runtime_env/agent/main.py", "--node-id=abc",
             "--runtime-env-agent-port=0", "--session-dir=/tmp/s"]


def test_the_runtime_env_agent_starts_behind_the_relay_with_its_arguments():
    raylet = [*_raylet([*AGENT, "--minimal"]), ENV_AGENT_OPTION + subprocess.list2cmdline(ENV_AGENT)]
    command, _ = raylet_command(raylet, 0, PORTS, "runtime_env_agent_port")
    (arg,) = [a for a in command if a.startswith(ENV_AGENT_OPTION)]
    agent = shlex.split(arg[len(ENV_AGENT_OPTION):])
    assert agent[:2] == ENV_AGENT[:2] and agent[2] == str(Path(env_agent_relay.__file__).resolve())
    assert agent[3:] == [*ENV_AGENT[3:], env_agent_relay.REAL_AGENT_FLAG + ENV_AGENT[2],
                         env_agent_relay.PORT_NAME_FLAG + "runtime_env_agent_port"]
    assert raylet_command(raylet, 0, PORTS, None)[0][-1] == raylet[-1]  # its port file unknown: Ray's agent
    other = [*raylet[:-1], ENV_AGENT_OPTION + "/usr/bin/python3 /site/ray/env_agent_v2.py"]
    assert raylet_command(other, 0, PORTS, "runtime_env_agent_port")[0][-1] == other[-1]


def test_warm_workers_are_prestarted_up_to_rays_own_count():
    command, prestart = raylet_command(_raylet([*AGENT, "--minimal"], prestart=16), 3, PORTS)
    assert prestart is True and f"{PRESTART_OPTION}3" in command and f"{PRESTART_OPTION}16" not in command
    command, prestart = raylet_command(_raylet([*AGENT, "--minimal"], prestart=2), 8, PORTS)
    assert prestart is True and f"{PRESTART_OPTION}2" in command  # never more than one per CPU
    command, prestart = raylet_command(_raylet([*AGENT, "--minimal"], prestart=0), 8, PORTS)
    assert prestart is False and f"{PRESTART_OPTION}0" in command


def test_the_stub_writes_the_ports_and_ends_with_its_raylet(tmp_path):
    """Run under a stand-in raylet that holds the stub's stdin, as Ray's does: the files
    appear (``-1``, whole) at once, and the stub ends when its raylet does."""
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        f"stub = subprocess.Popen([sys.executable, {agent_stub.__file__!r}, '--node-id=n1', "
        f"'--session-dir={tmp_path}', '--minimal', '{agent_stub.PORT_NAMES_FLAG}{','.join(PORTS)}'], "
        "stdin=subprocess.PIPE)\n"
        "print(stub.pid, flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    import psutil

    try:
        stub = psutil.Process(int(parent.stdout.readline()))
        deadline = time.monotonic() + 30
        while len(list(tmp_path.iterdir())) < len(PORTS) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}_n1" for n in PORTS)
        assert all((tmp_path / f"{n}_n1").read_text() == "-1" for n in PORTS)
        assert stub.status() != psutil.STATUS_ZOMBIE  # still waiting for its raylet
        parent.kill()
        parent.wait()
        stub.wait(timeout=10)  # psutil.TimeoutExpired if it outlived its raylet
    finally:
        parent.kill()


@pytest.mark.parametrize("script", [agent_stub, env_agent_relay], ids=["agent_stub", "env_agent_relay"])
def test_the_stand_ins_import_nothing_but_the_standard_library(script):
    """They run before Ray's node registers: importing Ray (or the project) would cost what
    they save."""
    code = (f"import sys; sys.argv = ['x']; import runpy; before = set(sys.modules)\n"
            f"runpy.run_path({script.__file__!r}, run_name='not_main')\n"
            "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in ('ray', 'service', 'psutil')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": ""})
    assert out.stdout.strip() == "[]"
