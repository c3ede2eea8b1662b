"""Ray's runtime-env agent behind a stand-in port that is ready at once.

A local head's raylet starts its first Python workers only once its runtime-env agent has
written its port to the session directory, and Ray's agent imports Ray and aiohttp before
it binds one: about 1.2 s of CPU on a 2-core machine, during which a sweep's prestarted
trial worker waited to start (issue 14). Yet a worker without a runtime environment never
calls the agent, and a local sweep's trials have none unless Ray Tune forwards variables
from the environment (AWS credentials, say).

This script stands in for the agent (`ray_head.raylet_command` runs it in place of Ray's
``main.py``): it binds the agent's port and writes it at once, and starts Ray's own agent
only when the raylet first connects (on a port of its own, written to a directory of its
own in the session's), relaying that connection and every later one to it byte for byte.
Nothing the agent does is left out: a trial with a runtime environment waits once for the
agent's start, as every worker did before; a sweep without one never starts it. It ends
with the raylet (the pipe on its stdin closes, as for `agent_stub`), taking the agent along.

Usage: the agent's own arguments, of which it reads ``--node-ip-address=``,
``--runtime-env-agent-port=``, ``--session-dir=`` and ``--node-id=``, plus
``--real-agent=PATH`` (Ray's script) and ``--port-name=NAME`` (the file Ray's agent writes).
Only the standard library: it runs before anything else.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

REAL_AGENT_FLAG, PORT_NAME_FLAG = "--real-agent=", "--port-name="
# the agent's options this replaces for Ray's own agent: its port and where it writes it
OWN_OPTIONS = ("--runtime-env-agent-port=", "--session-dir=")
# how long a relayed connection waits for Ray's agent to write its port
AGENT_START_TIMEOUT_S = 120.0


def _options(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)


def write_port(session_dir: str, node_id: str, name: str, port: int) -> None:
    """The port in the file Ray's `persist_port` would write, appearing whole."""
    path = os.path.join(session_dir, f"{name}_{node_id}")
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as f:
        f.write(str(port))
    os.replace(partial, path)


def read_port(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def agent_command(argv: list[str], private_dir: str) -> list[str]:
    """Ray's agent with this script's arguments, less its own flags, on a port of its own
    that it writes to ``private_dir``."""
    options = _options(argv)
    kept = [a for a in argv if not a.startswith((REAL_AGENT_FLAG, PORT_NAME_FLAG, *OWN_OPTIONS))]
    return [sys.executable, "-u", options[REAL_AGENT_FLAG[2:-1]], *kept,
            "--runtime-env-agent-port=0", f"--session-dir={private_dir}"]


class Relay:
    """Connections to the stand-in port passed through to Ray's agent, which starts with the
    first of them (`command`, in ``private_dir``)."""

    def __init__(self, host: str, command: list[str], port_file: str) -> None:
        self.host, self.command, self.port_file = host, command, port_file
        self.agent: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def start_agent(self) -> subprocess.Popen:
        with self._lock:
            if self.agent is None:
                self.agent = subprocess.Popen(self.command)  # its stdin: the raylet's pipe, as ours
            return self.agent

    def stop_agent(self) -> None:
        with self._lock:
            agent = self.agent
        if agent is not None and agent.poll() is None:
            agent.terminate()
            try:
                agent.wait(timeout=5)
            except subprocess.TimeoutExpired:
                agent.kill()

    def agent_port(self) -> int | None:
        agent = self.start_agent()
        deadline = time.monotonic() + AGENT_START_TIMEOUT_S
        while time.monotonic() < deadline:
            port = read_port(self.port_file)
            if port is not None:
                return port
            if agent.poll() is not None:
                return None
            time.sleep(0.02)
        return None

    def serve(self, conn: socket.socket) -> None:
        port = self.agent_port()
        if port is None:  # no agent: the raylet sees the connection close, as with a dead agent
            conn.close()
            return
        try:
            upstream = socket.create_connection((self.host, port))
        except OSError:
            conn.close()
            return
        answers = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
        answers.start()
        _pump(conn, upstream)
        answers.join()
        conn.close()
        upstream.close()


def _pump(source: socket.socket, target: socket.socket) -> None:
    """Copy until ``source`` ends, then end ``target``'s writing side, so that the other
    end sees the end too (`Relay.serve` closes both once both directions have ended)."""
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            target.sendall(data)
    except OSError:
        pass
    try:
        target.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _listener(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(64)
    return sock


def main(argv: list[str]) -> int:
    raylet_pid = os.getppid()
    options = _options(argv)
    host, name = options["node-ip-address"], options[PORT_NAME_FLAG[2:-1]]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the raylet's stop: take the agent along
    listener = _listener(host, int(options.get("runtime-env-agent-port") or 0))
    private_dir = tempfile.mkdtemp(prefix="nalu_sweep_env_agent_", dir=options["session-dir"])
    relay = Relay(host, agent_command(argv, private_dir),
                  os.path.join(private_dir, f"{name}_{options['node-id']}"))
    write_port(options["session-dir"], options["node-id"], name, listener.getsockname()[1])
    piped = stat.S_ISFIFO(os.fstat(0).st_mode)
    try:
        while os.getppid() == raylet_pid:
            readable, _, _ = select.select([listener, 0] if piped else [listener], [], [], 0.5)
            if 0 in readable and not os.read(0, 4096):
                break  # the raylet ended
            if listener in readable:
                conn, _ = listener.accept()
                threading.Thread(target=relay.serve, args=(conn,), daemon=True).start()
    finally:
        relay.stop_agent()
        shutil.rmtree(private_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
