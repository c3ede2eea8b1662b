"""A trial worker's tracking through its helper process (`service.tracking.helper`): the
same run, params, metrics, tags, artifacts and status as with a client of its own, while
the worker's process never imports MLflow; errors come back judged transient or not, and
a helper that died is replaced by the next call."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from service.tracking import store
from service.tracking.helper import HelperClient, TrackingCallError

REPO = Path(__file__).resolve().parents[2]


def test_a_trial_is_recorded_through_the_helper_and_its_process_never_imports_mlflow(tracking, record_trial,
                                                                                     tmp_path):
    _, client, _, parent = tracking
    out = record_trial()
    assert len(out["children"]) == 1 and "service.tracking.helper" in out["children"][0]  # its helper
    assert out["mlflow_imported"] is False
    assert out["again"] == out["run"] and out["resumed"] == 200  # found again by its trial key
    run = client.get_run(out["run"])
    assert run.info.run_name == "lr=0.1" and run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.1"}
    assert run.data.tags[store.TAG_PARENT] == parent and run.data.tags["nalu_sweep.node"] == "here"
    assert run.data.tags[store.TAG_OUTCOME] == "completed" and run.data.tags[store.TAG_ATTEMPTS] == "2"
    assert [(m.step, m.value) for m in client.get_metric_history(out["run"], "objective")] == [(100, 0.1), (200, 0.2)]
    assert "mse" not in run.data.metrics  # non-finite points are not logged
    assert [a.path for a in client.list_artifacts(out["run"], "plots")] == ["plots/curves.png"]
    assert not any((tmp_path / "spool").glob("*/journal.jsonl"))  # everything arrived: no spool left


def test_an_error_in_the_helper_comes_back_judged(tracking):
    uri, _, _, parent = tracking
    helper = HelperClient(uri)
    try:
        with pytest.raises(TrackingCallError) as refused:
            helper.find_or_create_run("999999", parent, "k", "name", {})  # no such experiment
        assert refused.value.transient is False and not store.is_transient(refused.value)
        assert "999999" in str(refused.value)
        with pytest.raises(TrackingCallError) as unknown:
            helper.send_write("no-such-run", "tags", {"a": "b"}, "/nonexistent")
        assert unknown.value.transient is False
    finally:
        helper._stop()


def test_a_server_that_is_away_is_a_transient_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    helper = HelperClient(f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(TrackingCallError) as away:
            helper.find_or_create_run("1", "parent", "k", "name", {})
        assert away.value.transient is True and store.is_transient(away.value)
    finally:
        helper._stop()


def test_a_helper_that_died_is_a_transient_error_and_the_next_call_starts_another(tracking):
    uri, client, experiment_id, parent = tracking
    helper = HelperClient(uri)
    try:
        first = helper._proc
        first.kill()
        first.wait()
        run_id, last, attempts = helper.find_or_create_run(experiment_id, parent, "dead", "trial-dead", {})
        assert helper._proc is not first and helper._proc.poll() is None  # a new helper answered
        assert (last, attempts) == (None, None) and client.get_run(run_id).data.tags[store.TAG_TRIAL_KEY] == "dead"
        second = helper._proc
        second.kill()
        second.wait()
        second.poll = lambda: None  # not seen dead before the call: as if it died during it
        with pytest.raises(TrackingCallError) as died:
            helper.find_or_create_run(experiment_id, parent, "dead", "trial-dead", {})
        assert died.value.transient is True
        assert helper.find_or_create_run(experiment_id, parent, "dead", "trial-dead", {})[0] == run_id
    finally:
        helper._stop()


def test_the_helper_ends_with_its_worker(tracking, tmp_path):
    """A worker Ray kills (SIGKILL) leaves no helper behind: its pipe closes, the helper ends."""
    import psutil

    uri = tracking[0]
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from service.tracking import helper
        client = helper.shared({uri!r})
        print(client._proc.pid, flush=True)
        time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        pid = int(owner.stdout.readline())
        helper_process = psutil.Process(pid)
        owner.kill()
        owner.wait()
        helper_process.wait(timeout=60)  # psutil.TimeoutExpired if it outlived its worker
    finally:
        owner.kill()


PRESTART = textwrap.dedent("""
    import json, os, sys, time
    import psutil
    import ray
    from ray._private import ray_constants
    from service.sweep.cluster import init_ray, stop_ray
    from service.tracking import helper

    @ray.remote
    def worker_state():  # runs first in its worker: what the worker's setup hook left
        from service.tracking import helper
        me = psutil.Process()
        return {"helpers": sorted(helper._SHARED), "children": [" ".join(p.cmdline()) for p in me.children()],
                "loaded": sorted(m for m in ("torch", "ray.tune", "service.sweep.trial") if m in sys.modules),
                "pid": me.pid}

    mode, uri = sys.argv[1:3]
    with helper.announced(uri) as announcement:
        if mode == "trials ended":
            announcement.unlink()
        assert init_ray(None, verbose=False, helper_announcement=None if mode == "no sweep" else announcement,
                        warm_workers=1)
        try:
            raylet = psutil.Process(ray._private.worker._global_node.all_processes[
                ray_constants.PROCESS_TYPE_RAYLET][0].process.pid)
            waited = time.monotonic() + 5
            workers = []
            while not workers and time.monotonic() < waited:  # Ray forks them as the driver connects
                workers = [c.pid for c in raylet.children() if "agent" not in " ".join(c.cmdline()).lower()]
                time.sleep(0.1)
            state = ray.get(worker_state.remote())
        finally:
            stop_ray()
    hook = ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR
    state["driver_env"] = [k for k in (hook, helper.PRESTART_FILE) if k in os.environ]
    state["prestarted"] = state.pop("pid") in workers
    print(json.dumps(state))
    """)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["trials running", "trials ended", "no sweep"])
def test_a_local_rays_workers_start_their_helper_as_they_start(tracking, tmp_path, mode):
    """A sweep's local Ray: a worker started while the trials run has its helper for the
    sweep's store, Ray Tune, torch and the trial's code before its first task (Ray's
    worker-process setup hook, `worker_start`), and the driver's environment is as it was.
    One started after them (`validate` on the Ray a sweep kept), or by a Ray started without
    an announcement, starts none and loads nothing: its work records nothing. The warm
    worker asked for is started as the driver connects, and takes the first task."""
    uri = tracking[0]
    script = tmp_path / "prestart.py"
    script.write_text(PRESTART)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    result = subprocess.run([sys.executable, str(script), mode, uri], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    state = json.loads(result.stdout.strip().splitlines()[-1])
    assert state["driver_env"] == []
    helpers = [c for c in state["children"] if "service.tracking.helper" in c]
    assert state["prestarted"] is True  # the task ran on the worker Ray started as the driver connected
    if mode == "trials running":
        assert state["helpers"] == [uri]
        assert len(helpers) == 1 and helpers[0].endswith(uri)
        assert state["loaded"] == ["ray.tune", "service.sweep.trial", "torch"]  # the trial's code, loaded
    else:
        assert state["helpers"] == [] and helpers == [] and state["loaded"] == []


def test_the_announcement_is_private_and_gone_afterwards():
    """The URI may hold a server's credentials: the file is readable by its owner only."""
    from service.tracking import helper

    with helper.announced("http://user:secret@127.0.0.1:5000") as path:
        assert path.read_text() == "http://user:secret@127.0.0.1:5000"
        assert path.parent.stat().st_mode & 0o077 == 0
    assert not path.exists() and not path.parent.exists()


def test_prestart_never_raises(monkeypatch, tmp_path):
    """An exception in Ray's setup hook would end the worker: a helper that cannot start is
    left to the trial's first call."""
    from service.tracking import helper

    def broken(uri):
        raise OSError("no python here")

    monkeypatch.setattr(helper, "shared", broken)
    announcement = tmp_path / "tracking_uri"
    announcement.write_text("sqlite:////nowhere/mlflow.db")
    monkeypatch.setenv(helper.PRESTART_FILE, str(announcement))
    assert helper.prestart() is True  # the trials run; the helper is left to the first call
