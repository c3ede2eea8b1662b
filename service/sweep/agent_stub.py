"""Ray's dashboard agent as a minimal Ray install runs it, without importing Ray.

The raylet of a local head starts a dashboard agent and registers its node (what `ray.init`
waits for) only once the agent has written its ports to the session directory. Where Ray is
installed without its dashboard dependencies (``--minimal`` in the agent's command, as for
this project's `ray[tune]`), the agent loads no module at all: it imports Ray (1–2 s of
CPU), writes ``-1`` ("not in use") for each port and waits for the raylet to end. This
script does the same in a few milliseconds (`ray_head.lean_head` runs it in the agent's
place). It must import nothing but the standard library: it runs before anything else.

Usage (the raylet appends nothing): the agent's own arguments, of which it reads
``--session-dir=`` and ``--node-id=``, plus ``--stub-port-names=a,b,c``.
"""

from __future__ import annotations

import os
import select
import stat
import sys
import time

PORT_NAMES_FLAG = "--stub-port-names="
NOT_IN_USE = "-1"


def _options(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)


def write_ports(session_dir: str, node_id: str, names: list[str]) -> None:
    """``-1`` for each port, as Ray's `persist_port` names the files; each appears whole."""
    for name in names:
        path = os.path.join(session_dir, f"{name}_{node_id}")
        partial = f"{path}.{os.getpid()}.partial"
        with open(partial, "w") as f:
            f.write(NOT_IN_USE)
        os.replace(partial, path)


def wait_for_raylet(raylet_pid: int) -> None:
    """Until the raylet ends: its end of our stdin closes (the pipe it checks agents by), or
    this process is handed to another parent."""
    piped = stat.S_ISFIFO(os.fstat(0).st_mode)
    while os.getppid() == raylet_pid:
        if not piped:
            time.sleep(0.5)
            continue
        readable, _, _ = select.select([0], [], [], 0.5)
        if readable and not os.read(0, 4096):
            return


def main(argv: list[str]) -> int:
    raylet_pid = os.getppid()
    options = _options(argv)
    names = [n for n in options.get(PORT_NAMES_FLAG[2:-1], "").split(",") if n]
    write_ports(options["session-dir"], options["node-id"], names)
    wait_for_raylet(raylet_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
