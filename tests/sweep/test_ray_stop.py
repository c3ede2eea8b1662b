"""`stop_ray` stops a local Ray without Ray's one-second wait on its autoscaler monitor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_a_local_ray_is_stopped_whole_and_its_monitor_killed_first(tmp_path):
    """Runs in its own process: it starts (and stops) a Ray of its own, not the session's."""
    script = tmp_path / "stop.py"
    script.write_text(textwrap.dedent("""
        import json
        import psutil
        import ray
        from ray._private import ray_constants, worker
        from service.sweep.cluster import init_ray, stop_ray

        assert init_ray(None, verbose=False)
        node = worker._global_node
        procs = {kind: [info.process for info in infos] for kind, infos in node.all_processes.items()}
        monitor = procs[ray_constants.PROCESS_TYPE_MONITOR]
        at_shutdown = []
        real_shutdown = ray.shutdown

        def shutdown(*args, **kwargs):
            at_shutdown.extend(p.poll() for p in monitor)
            real_shutdown(*args, **kwargs)

        ray.shutdown = shutdown
        stop_ray()
        print(json.dumps({
            "initialized": ray.is_initialized(),
            "monitor": at_shutdown,
            "alive": {kind: [p.pid for p in ps if psutil.pid_exists(p.pid) and p.poll() is None]
                      for kind, ps in procs.items()},
        }))
        """))
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=180, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    state = json.loads(result.stdout.strip().splitlines()[-1])
    assert state["initialized"] is False
    assert state["monitor"] == [-9]  # SIGKILLed before ray.shutdown, not left to its SIGTERM and 1-s wait
    assert all(not pids for pids in state["alive"].values()), state["alive"]
