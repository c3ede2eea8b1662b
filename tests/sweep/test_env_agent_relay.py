"""The runtime-env agent's stand-in (`env_agent_relay`): its port is written at once, the real
agent starts only with the raylet's first connection and gets every byte both ways, and both
end with the raylet. A stand-in "Ray agent" (an echo server that writes its port as Ray's
does) takes the real one's place; Ray's own goes through it in `test_ray_stop.py`."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from service.sweep import env_agent_relay

PORT_NAME = "runtime_env_agent_port"

FAKE_AGENT = textwrap.dedent("""
    import os, socket, sys, threading
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    with open(opts["marker"], "w") as f:
        f.write(" ".join(sys.argv[1:]))
    server = socket.create_server((opts["node-ip-address"], int(opts["runtime-env-agent-port"])))
    path = os.path.join(opts["session-dir"], "runtime_env_agent_port_" + opts["node-id"])
    with open(path, "w") as f:
        f.write(str(server.getsockname()[1]))

    def echo(conn):
        while data := conn.recv(4096):
            conn.sendall(b"echo:" + data)
        conn.close()

    while True:
        conn, _ = server.accept()
        threading.Thread(target=echo, args=(conn,), daemon=True).start()
    """)


def _wait_for(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    return check()


def _start(tmp_path: Path) -> tuple[subprocess.Popen, psutil.Process, Path]:
    """The relay under a stand-in raylet that holds its stdin, as Ray's raylet does."""
    agent = tmp_path / "fake_agent.py"
    agent.write_text(FAKE_AGENT)
    session, marker = tmp_path / "session", tmp_path / "agent_started"
    session.mkdir()
    args = ["--node-ip-address=127.0.0.1", "--node-id=n1", f"--session-dir={session}",
            "--runtime-env-agent-port=0", f"--marker={marker}",
            env_agent_relay.REAL_AGENT_FLAG + str(agent), env_agent_relay.PORT_NAME_FLAG + PORT_NAME]
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        f"relay = subprocess.Popen([sys.executable, {env_agent_relay.__file__!r}, *{args!r}], stdin=subprocess.PIPE)\n"
        "print(relay.pid, flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    return parent, psutil.Process(int(parent.stdout.readline())), marker


def test_the_port_comes_at_once_and_the_agent_with_the_first_connection(tmp_path):
    parent, relay, marker = _start(tmp_path)
    started = [relay]
    try:
        port_file = tmp_path / "session" / f"{PORT_NAME}_n1"
        port = _wait_for(lambda: env_agent_relay.read_port(str(port_file)))
        assert port, "the relay wrote no port"
        time.sleep(0.5)
        assert not marker.exists()  # nothing asked for a runtime environment: no agent
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(b"GET / HTTP/1.1\r\n\r\n")
            answer = b""
            while len(answer) < len(b"echo:GET / HTTP/1.1\r\n\r\n"):
                answer += conn.recv(4096)
        assert answer == b"echo:GET / HTTP/1.1\r\n\r\n"  # relayed both ways, byte for byte
        agent_args = marker.read_text().split()
        # the agent's own arguments, a port of its own, written in a folder of its own
        assert "--node-id=n1" in agent_args and "--runtime-env-agent-port=0" in agent_args
        (session_arg,) = [a for a in agent_args if a.startswith("--session-dir=")]
        assert Path(session_arg.split("=", 1)[1]).parent == tmp_path / "session"
        assert not any(a.startswith((env_agent_relay.REAL_AGENT_FLAG, env_agent_relay.PORT_NAME_FLAG))
                       for a in agent_args)
        (agent,) = relay.children()
        started.append(agent)
        parent.kill()  # the raylet ends: its pipe closes
        parent.wait()
        relay.wait(timeout=15)
        agent.wait(timeout=15)  # psutil.TimeoutExpired if either outlived the raylet
        assert not list((tmp_path / "session").glob("nalu_sweep_env_agent_*"))
    finally:  # only what this test started: this process's other children may be a session's Ray
        parent.kill()
        for p in started:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


def test_a_connection_while_the_agent_cannot_start_is_closed(tmp_path):
    """Where Ray's agent dies before it writes its port, the raylet sees the connection
    close (as with a dead agent) rather than wait forever."""
    agent = tmp_path / "dying_agent.py"
    agent.write_text("import sys; sys.exit(3)\n")
    relay = env_agent_relay.Relay("127.0.0.1", [sys.executable, str(agent)], str(tmp_path / "never"))
    left, right = socket.socketpair()
    started = time.monotonic()
    relay.serve(left)
    assert right.recv(10) == b""
    assert time.monotonic() - started < 20
    assert relay.agent is not None and relay.agent.returncode == 3
