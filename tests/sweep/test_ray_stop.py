"""A local Ray as a sweep starts it: the lean head (`service.sweep.ray_head`) without the
autoscaler monitor, the API server and (unless ``--verbose``) the log monitor, and with a
stub in place of a minimal install's dashboard agent; Ray's usual
head with ``NALU_SWEEP_RAY_HEAD=full``, whose monitor `stop_ray` kills first rather than
wait a second on it. Either way `stop_ray` leaves no Ray process behind. And Tune's trials
start as plain Ray workers (`cluster.plain_trial_workers`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from service.sweep import head_waits

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import json, sys
    import psutil
    import ray
    from ray._private import node as ray_node, ray_constants, worker
    from service.sweep.cluster import init_ray, stop_ray
    from service.sweep.head_waits import ATTEMPTS_SETTING as ATTEMPTS, RETRY_MS_SETTING as RETRY_MS

    methods = {n: ray_node.Node.__dict__[n] for n in ("start_monitor", "start_api_server", "start_log_monitor")}
    assert init_ray(None, verbose=sys.argv[1] == "verbose")
    restored = all(ray_node.Node.__dict__[n] is m for n, m in methods.items())
    answer = ray.get(ray.remote(lambda: 6 * 7).remote())  # the cluster runs work
    node = worker._global_node
    procs = {kind: [info.process for info in infos] for kind, infos in node.all_processes.items()}
    monitor = procs.get(ray_constants.PROCESS_TYPE_MONITOR, [])
    raylet = psutil.Process(procs[ray_constants.PROCESS_TYPE_RAYLET][0].pid)
    def is_agent(cmd):  # not a worker, whose command line names the agents' ports
        title = cmd.split()[0] if cmd.split() else ""
        return (any(s in cmd for s in ("agent_stub.py", "env_agent_relay.py"))
                or (title.startswith("ray::") and title.endswith("Agent"))
                or any(s in cmd for s in ("dashboard/agent.py", "runtime_env/agent/main.py")))

    agents = {c.pid: " ".join(c.cmdline()) for c in raylet.children() if is_agent(" ".join(c.cmdline()))}
    # Ray's runtime-env agent: the raylet's child, or the relay's once something needed it
    env_agents = [c.pid for c in raylet.children(recursive=True)
                  if " ".join(c.cmdline()).split()[:1] == ["ray::RuntimeEnvAgent"]
                  or ("runtime_env/agent/main.py" in " ".join(c.cmdline())
                      and "env_agent_relay.py" not in " ".join(c.cmdline()))]
    raylet_env = {k: v for k, v in raylet.environ().items() if k in (RETRY_MS, ATTEMPTS)}
    at_shutdown = []
    real_shutdown = ray.shutdown

    def shutdown(*args, **kwargs):
        at_shutdown.extend(p.poll() for p in monitor)
        real_shutdown(*args, **kwargs)

    ray.shutdown = shutdown
    stop_ray()
    gone, left = psutil.wait_procs([psutil.Process(pid) for pid in agents if psutil.pid_exists(pid)], timeout=10)
    print(json.dumps({
        "agents": sorted(agents.values()), "agents_left": [p.pid for p in left], "env_agents": len(env_agents),
        "raylet_env": raylet_env, "aiohttp": "aiohttp" in sys.modules,
        "kinds": sorted(procs), "restored": restored, "answer": answer,
        "initialized": ray.is_initialized(), "monitor": at_shutdown,
        "alive": {kind: [p.pid for p in ps if psutil.pid_exists(p.pid) and p.poll() is None]
                  for kind, ps in procs.items()},
    }))
    """)


def _start_and_stop(tmp_path: Path, verbose: bool, head: str | None = None) -> dict:
    """Runs in its own process: it starts (and stops) a Ray of its own, not the session's."""
    script = tmp_path / "stop.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("NALU_SWEEP_RAY_HEAD", None)
    if head is not None:
        env["NALU_SWEEP_RAY_HEAD"] = head
    result = subprocess.run([sys.executable, str(script), "verbose" if verbose else "quiet"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    state = json.loads(result.stdout.strip().splitlines()[-1])
    assert state["initialized"] is False
    assert state["restored"] is True  # Ray's own Node methods are back after the start
    assert state["answer"] == 42
    assert all(not pids for pids in state["alive"].values()), state["alive"]
    assert len(state["agents"]) == 2 and state["agents_left"] == []  # the raylet's two agents end with it
    return state


def test_the_lean_head_leaves_out_the_monitor_api_server_and_log_monitor(tmp_path):
    from ray._private import ray_constants

    state = _start_and_stop(tmp_path, verbose=False)
    kinds = set(state["kinds"])
    assert {ray_constants.PROCESS_TYPE_GCS_SERVER, ray_constants.PROCESS_TYPE_RAYLET} <= kinds
    assert not kinds & {ray_constants.PROCESS_TYPE_MONITOR, ray_constants.PROCESS_TYPE_DASHBOARD,
                        ray_constants.PROCESS_TYPE_LOG_MONITOR}, kinds
    # this project's Ray is a minimal install: its dashboard agent is the stub (and the task ran)
    assert sum("service/sweep/agent_stub.py" in a for a in state["agents"]) == 1, state["agents"]
    assert not any("DashboardAgent" in a for a in state["agents"]), state["agents"]
    # its runtime-env agent starts behind the relay, and only when something needs it (the task
    # has no runtime environment)
    assert sum("service/sweep/env_agent_relay.py" in a for a in state["agents"]) == 1, state["agents"]
    assert state["env_agents"] == 0
    # without Ray's fixed waits (`head_waits`): the raylet retries its store connection every
    # 100 ms, and the dashboard's dependencies were looked for, not imported
    assert state["raylet_env"] == head_waits.raylet_env(), state["raylet_env"]
    assert state["aiohttp"] is False


def test_with_verbose_the_log_monitor_forwards_the_workers_output(tmp_path):
    from ray._private import ray_constants

    kinds = set(_start_and_stop(tmp_path, verbose=True)["kinds"])
    assert ray_constants.PROCESS_TYPE_LOG_MONITOR in kinds
    assert not kinds & {ray_constants.PROCESS_TYPE_MONITOR, ray_constants.PROCESS_TYPE_DASHBOARD}, kinds


def test_the_full_head_is_stopped_whole_and_its_monitor_killed_first(tmp_path):
    from ray._private import ray_constants

    state = _start_and_stop(tmp_path, verbose=False, head="full")
    assert {ray_constants.PROCESS_TYPE_MONITOR, ray_constants.PROCESS_TYPE_DASHBOARD,
            ray_constants.PROCESS_TYPE_LOG_MONITOR} <= set(state["kinds"])
    assert state["monitor"] == [-9]  # SIGKILLed before ray.shutdown, not left to its SIGTERM and 1-s wait
    assert sum("DashboardAgent" in a for a in state["agents"]) == 1, state["agents"]  # Ray's own agents
    assert not any("env_agent_relay.py" in a for a in state["agents"]) and state["env_agents"] == 1
    assert state["raylet_env"] == {}  # and Ray's own waits


def test_the_usual_head_where_asked_or_where_ray_is_not_the_expected_one(monkeypatch):
    from ray._private import node as ray_node

    from service.sweep import ray_head

    original = {n: ray_node.Node.__dict__[n] for n in (ray_head.MONITOR, ray_head.API_SERVER, ray_head.LOG_MONITOR)}
    with ray_head.lean_head(verbose=False) as names:
        assert set(names) == set(original)
        assert all(ray_node.Node.__dict__[n] is not m for n, m in original.items())
    assert all(ray_node.Node.__dict__[n] is m for n, m in original.items())

    monkeypatch.setenv(ray_head.HEAD_ENV, "full")
    with ray_head.lean_head(verbose=False) as names:
        assert names == ()
        assert all(ray_node.Node.__dict__[n] is m for n, m in original.items())
    monkeypatch.delenv(ray_head.HEAD_ENV)

    monkeypatch.delattr(ray_node.Node, ray_head.LOG_MONITOR)  # a Ray whose Node is laid out otherwise
    with ray_head.lean_head(verbose=False) as names:
        assert names == ()
        assert ray_node.Node.__dict__[ray_head.MONITOR] is original[ray_head.MONITOR]


TRIAL_ENV_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import ray
    from ray import tune
    from service.sweep.cluster import init_ray, plain_trial_workers, stop_ray

    def trial(config):
        tune.report({"env": json.dumps(dict(ray.get_runtime_context().runtime_env)),
                     "forwarded": os.environ.get("AWS_ACCESS_KEY_ID", "")})

    assert init_ray(None, verbose=False)
    plain_trial_workers()  # as a sweep's driver does before its first trial
    try:
        grid = tune.Tuner(trial, run_config=tune.RunConfig(storage_path=sys.argv[1], verbose=0)).fit()
        import psutil
        from ray._private import ray_constants, worker
        raylet = psutil.Process(worker._global_node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid)
        env_agents = [c for c in raylet.children(recursive=True)
                      if " ".join(c.cmdline()).split()[:1] == ["ray::RuntimeEnvAgent"]]
        print(json.dumps({"env": grid[0].metrics["env"], "forwarded": grid[0].metrics["forwarded"],
                          "env_agents": len(env_agents)}))
    finally:
        stop_ray()
    """)


@pytest.mark.parametrize("forwarded", ["", "a-key"])
def test_tune_trials_start_as_plain_workers_and_forwarded_settings_still_arrive(tmp_path, forwarded):
    """Tune's PyTorch Lightning setting is dropped, so a trial's runtime environment is empty
    (no `setup_worker.py`, no runtime-env agent) unless Tune has something to forward; then
    the relay starts Ray's runtime-env agent, which builds it (`env_agent_relay`)."""
    script = tmp_path / "trial_env.py"
    script.write_text(TRIAL_ENV_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("AWS_ACCESS_KEY_ID", None)
    if forwarded:
        env["AWS_ACCESS_KEY_ID"] = forwarded
    result = subprocess.run([sys.executable, str(script), str(tmp_path / "tune")], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    env_vars = json.loads(out["env"]).get("env_vars") or {}
    assert "PL_DISABLE_FORK" not in env_vars
    assert env_vars == ({"AWS_ACCESS_KEY_ID": forwarded} if forwarded else {})
    assert out["forwarded"] == forwarded
    # Ray's runtime-env agent started, behind the relay, only for the trial that needed it
    assert out["env_agents"] == (1 if forwarded else 0)
