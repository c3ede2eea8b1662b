"""A local sweep's driver answers its trial workers' tracking calls itself
(`service.tracking.driver_tracking`): a worker of that sweep records its trial through the
driver's socket, with no helper process and no MLflow of its own; a call made before the
driver has its client waits for it; once the driver stops answering, the worker's next
call fails as a transient error and the one after starts a helper; an MLflow server's
workers, and a sweep on a cluster joined by address, keep their helpers."""

from __future__ import annotations

import threading
import time

import pytest

from service.tracking import driver_tracking, helper, store
from service.tracking.helper import HelperClient, TrackingCallError


def test_a_trial_is_recorded_through_the_driver_without_a_helper(tracking, record_trial, tmp_path):
    uri, client, _, parent = tracking
    with helper.announced(uri) as announcement, \
            driver_tracking.served(announcement, uri, local=True) as served:
        assert served is not None
        served.use(client)
        # what a worker of the sweep's own Ray inherits
        out = record_trial({helper.ANNOUNCEMENT_VAR: str(announcement)})
    assert out["children"] == [] and out["mlflow_imported"] is False  # no helper process, no MLflow
    assert out["again"] == out["run"] and out["resumed"] == 200  # found again by its trial key
    run = client.get_run(out["run"])
    assert run.info.run_name == "lr=0.1" and run.info.status == "FINISHED"
    assert run.data.tags[store.TAG_PARENT] == parent and run.data.tags[store.TAG_OUTCOME] == "completed"
    assert [(m.step, m.value) for m in client.get_metric_history(out["run"], "objective")] == [(100, 0.1), (200, 0.2)]
    assert [a.path for a in client.list_artifacts(out["run"], "plots")] == ["plots/curves.png"]
    assert not any((tmp_path / "spool").glob("*/journal.jsonl"))


def test_calls_wait_for_the_drivers_client_and_fall_back_to_a_helper_once_it_stops(tracking, monkeypatch):
    uri, client, experiment_id, parent = tracking
    with helper.announced(uri) as announcement, \
            driver_tracking.served(announcement, uri, local=True) as served:
        monkeypatch.setenv(helper.ANNOUNCEMENT_VAR, str(announcement))
        worker = HelperClient(uri)
        try:
            assert worker._connection is not None and worker._proc is None
            threading.Timer(1.0, served.use, args=(client,)).start()
            started = time.monotonic()
            run_id, _, _, _ = worker.find_or_create_run(experiment_id, parent, "k-wait", "waited", {})
            assert time.monotonic() - started >= 0.9  # answered once the driver had its client
            assert client.get_run(run_id).info.run_name == "waited"
        finally:
            served.close()
        with pytest.raises(TrackingCallError) as ended:
            worker.find_or_create_run(experiment_id, parent, "k-wait", "waited", {})
        assert ended.value.transient is True
    try:
        assert worker.find_or_create_run(experiment_id, parent, "k-wait", "waited", {})[0] == run_id
        assert worker._connection is None and worker._proc is not None  # a helper of its own now
    finally:
        worker._stop()


def test_a_server_or_a_joined_cluster_keeps_the_workers_helpers(tmp_path):
    with helper.announced("http://127.0.0.1:5000") as announcement, \
            driver_tracking.served(announcement, "http://127.0.0.1:5000", local=True) as served:
        assert served is None
        assert not (announcement.parent / helper.DRIVER_SOCKET).exists()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with helper.announced(uri) as announcement, driver_tracking.served(announcement, uri, local=False) as served:
        assert served is None
    with helper.announced(uri) as announcement, driver_tracking.served(announcement, uri, local=True) as served:
        socket_path = announcement.parent / helper.DRIVER_SOCKET
        assert served is not None and socket_path.exists()
        assert socket_path.parent.stat().st_mode & 0o077 == 0  # only its owner can connect
    assert not socket_path.exists()


def test_a_worker_of_another_store_or_after_the_trials_starts_its_helper(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with helper.announced(uri) as announcement, driver_tracking.served(announcement, uri, local=True):
        monkeypatch.setenv(helper.ANNOUNCEMENT_VAR, str(announcement))
        assert helper.driver_socket(uri) == str(announcement.parent / helper.DRIVER_SOCKET)
        assert helper.driver_socket(f"sqlite:///{tmp_path}/other.db") is None
    assert helper.driver_socket(uri) is None
