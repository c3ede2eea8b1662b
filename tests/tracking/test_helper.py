"""A trial worker's tracking through its helper process (`service.tracking.helper`): the
same run, params, metrics, tags, artifacts and status as with a client of its own, while
the worker's process never imports MLflow; errors come back judged transient or not, and
a helper that died is replaced by the next call."""

from __future__ import annotations

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
    assert out["latest"] == {"objective": 0.2}  # read through the helper: the value at the last step
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
        run_id, last, attempts, _ = helper.find_or_create_run(experiment_id, parent, "dead", "trial-dead", {})
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


def test_the_announcement_is_private_and_gone_afterwards():
    """The URI may hold a server's credentials: the file is readable by its owner only."""
    from service.tracking import helper

    with helper.announced("http://user:secret@127.0.0.1:5000") as path:
        assert path.read_text() == "http://user:secret@127.0.0.1:5000"
        assert path.parent.stat().st_mode & 0o077 == 0
    assert not path.exists() and not path.parent.exists()
