"""The outbox of a trial run: writes are journalled, kept while the server is away (a
closed port), replayed in order by the next process, and never stored twice."""

from __future__ import annotations

import json
import time

import pytest

from service.tracking import runs, spool, store


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    """One SQLite store for the module (creating its tables costs seconds)."""
    directory = tmp_path_factory.mktemp("mlflow")
    uri = store.default_tracking_uri(directory)
    client = store.client(uri)
    experiment_id = store.ensure_experiment(client, "spool", uri)
    return uri, client, experiment_id


def _run(tracking) -> str:
    _, client, experiment_id = tracking
    return client.create_run(experiment_id).info.run_id


def _points(n: int, step0: int = 0, key: str = "loss") -> list[tuple[str, float, int, int]]:
    now = int(time.time() * 1000)
    return [(key, float(step0 + i) / 7, now, step0 + i) for i in range(n)]


def _stored(client, run_id: str, key: str = "loss") -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_writes_reach_the_store_in_order_and_the_spool_is_removed(tracking, tmp_path):
    _, client, _ = tracking
    run_id = _run(tracking)
    outbox = spool.Outbox(client, run_id, root=tmp_path)
    for k in range(5):
        outbox.log_metrics(_points(300, step0=300 * k))  # merged into batches of ≤ 1000 points
    outbox.log_params({"lr": "0.1"})
    outbox.set_tags({"phase": "done"})
    outbox.set_status("FINISHED")
    assert outbox.close(timeout_s=60)
    assert outbox.logged_points == outbox.sent_points == 1500
    assert _stored(client, run_id) == [(s, float(s) / 7) for s in range(1500)]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.1" and run.data.tags["phase"] == "done"
    assert not (tmp_path / run_id).exists()


def test_an_absent_server_keeps_every_write_and_the_next_process_sends_it(tracking, away, tmp_path):
    _, client, _ = tracking
    run_id = _run(tracking)
    artifacts = tmp_path / "files"
    (artifacts / "plots").mkdir(parents=True)
    (artifacts / "seeds.csv").write_text("seed,success\n0,True\n")
    (artifacts / "plots" / "curves.png").write_bytes(b"\x89PNG fake")

    first = spool.Outbox(away, run_id, root=tmp_path / "spool", backoff_s=(0.05, 0.2))
    first.log_metrics(_points(50))
    first.log_artifacts(artifacts)
    for path in sorted(artifacts.rglob("*"), reverse=True):  # the trial's temp dir goes away
        path.unlink() if path.is_file() else path.rmdir()
    first.set_tags({"nalu_sweep.outcome": "completed"})
    first.set_status("FINISHED")
    assert not first.close(timeout_s=1.0)  # patience out: nothing sent, nothing dropped
    assert first.sent_points == 0
    journal = tmp_path / "spool" / run_id / spool.JOURNAL
    assert journal.exists()
    assert [json.loads(line)["op"] for line in journal.read_text().splitlines()] == [
        "metrics", "artifacts", "tags", "status"]
    assert _stored(client, run_id) == []

    second = spool.Outbox(client, run_id, root=tmp_path / "spool")  # e.g. the retried trial
    assert second.replayed_points == 50
    assert second.close(timeout_s=60)
    assert _stored(client, run_id) == [(s, float(s) / 7) for s in range(50)]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["nalu_sweep.outcome"] == "completed"
    assert sorted(a.path for a in client.list_artifacts(run_id)) == ["plots", "seeds.csv"]
    assert not (tmp_path / "spool" / run_id).exists()


def test_only_unacknowledged_writes_are_replayed(tracking, away, tmp_path):
    """Half the points arrive, then the server goes away: the replay sends the other half
    once; each stored point is there exactly once."""
    _, client, _ = tracking
    run_id = _run(tracking)
    outbox = spool.Outbox(client, run_id, root=tmp_path, backoff_s=(0.05, 0.2))
    outbox.log_metrics(_points(400))
    assert outbox.drain(timeout_s=60)
    outbox.client = away
    outbox.log_metrics(_points(400, step0=400))
    assert not outbox.close(timeout_s=1.0)
    assert outbox.sent_points == 400

    replay = spool.Outbox(client, run_id, root=tmp_path)
    assert replay.replayed_points == 400
    assert replay.close(timeout_s=60)
    assert _stored(client, run_id) == [(s, float(s) / 7) for s in range(800)]


def test_a_write_sent_twice_is_stored_once(tracking, tmp_path):
    """The server took a batch but its answer was lost (no ``done`` line): the replay
    sends it again, with the same timestamps, and the SQL store keeps one copy."""
    from mlflow.entities import Metric

    _, client, _ = tracking
    run_id = _run(tracking)
    points = _points(120)
    client.log_batch(run_id, metrics=[Metric(k, v, ts, s) for k, v, ts, s in points])
    directory = tmp_path / run_id
    directory.mkdir()
    (directory / spool.JOURNAL).write_text(json.dumps({"seq": 1, "op": "metrics", "data": points}) + "\n"
                                           + '{"seq": 2, "op": "met')  # a line cut short by the crash
    replay = spool.Outbox(client, run_id, root=tmp_path)
    assert replay.replayed_points == 120
    assert replay.close(timeout_s=60)
    assert _stored(client, run_id) == [(s, float(s) / 7) for s in range(120)]


def test_upload_command_sends_a_kept_spool(tracking, away, tmp_path):
    uri, client, _ = tracking
    run_id = _run(tracking)
    kept = spool.Outbox(away, run_id, tracking_uri=uri, root=tmp_path, backoff_s=(0.05, 0.2))
    kept.log_metrics(_points(10))
    kept.set_status("FINISHED")
    assert not kept.close(timeout_s=0.5)
    assert spool.main(["upload", str(tmp_path)]) == 0
    assert len(_stored(client, run_id)) == 10
    assert client.get_run(run_id).info.status == "FINISHED"


def test_a_rejected_write_is_reported_not_retried_forever(tracking, tmp_path, caplog):
    _, client, _ = tracking
    run_id = _run(tracking)
    outbox = spool.Outbox(client, run_id, root=tmp_path)
    outbox.log_params({"lr": "0.1"})
    outbox.log_params({"lr": "0.2"})  # MLflow refuses to change a logged param (HTTP 400)
    outbox.log_metrics(_points(3))
    assert outbox.close(timeout_s=60)
    assert len(outbox.rejected) == 1 and "lr" in outbox.rejected[0][1]
    assert len(_stored(client, run_id)) == 3


def test_transient_errors_are_told_apart():
    import requests
    from mlflow.exceptions import MlflowException, RestException

    assert store.is_transient(MlflowException("API request to http://x failed with exception Max retries"))
    assert store.is_transient(requests.ConnectionError("refused"))
    assert store.is_transient(RestException({"error_code": "TEMPORARILY_UNAVAILABLE", "message": "503"}))
    assert store.is_transient(Exception("database is locked"))
    assert not store.is_transient(RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "x"}))
    assert not store.is_transient(RestException({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "x"}))
    assert not store.is_transient(TypeError("bug"))


def test_retry_waits_out_a_transient_error_only_with_patience():
    import requests

    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise requests.ConnectionError("refused")
        return "ok"

    with pytest.raises(requests.ConnectionError):
        store.retry(flaky)
    assert store.retry(flaky, patience_s=30) == "ok"
    with pytest.raises(ValueError):
        store.retry(lambda: (_ for _ in ()).throw(ValueError("bad")), patience_s=30)


def test_trial_run_counts_the_points_it_logged(tracking, tmp_path, monkeypatch):
    uri, client, experiment_id = tracking
    monkeypatch.setenv(spool.SPOOL_ENV, str(tmp_path))
    parent = client.create_run(experiment_id).info.run_id
    trial = runs.TrialRun.open(uri, experiment_id, parent, "k1", "trial-k1", {"lr": 0.1})
    for step in range(20):
        trial.log_metrics({"objective": 0.5, "success_rate": 0.25, "nan": float("nan")}, step)
    trial.close("completed")
    run = client.get_run(trial.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags[store.TAG_METRIC_POINTS] == "40"
    assert run.data.params == {"lr": "0.1"}
    assert list(tmp_path.iterdir()) == []


def test_a_retried_trial_skips_the_steps_its_dead_attempt_journalled(tracking, tmp_path, monkeypatch):
    """The first attempt died with its step-1500 point journalled but not yet stored (or
    still on its way through its helper); the retry resumes from the step-1000 checkpoint.
    Its reopened run replays that point and does not log step 1500 again: one point per step."""
    from mlflow.entities import Metric

    uri, client, experiment_id = tracking
    monkeypatch.setenv(spool.SPOOL_ENV, str(tmp_path))
    parent = client.create_run(experiment_id).info.run_id
    first = runs.TrialRun.open(uri, experiment_id, parent, "k2", "trial-k2", {"lr": 0.1})
    assert first.close("failed") is None and first.resumed_from_step is None
    now = int(time.time() * 1000)
    points = [["objective", step / 1e4, now, step] for step in (0, 500, 1000, 1500)]
    client.log_batch(first.run_id, metrics=[Metric(*p) for p in points[:3]])  # what arrived
    (tmp_path / first.run_id).mkdir()
    (tmp_path / first.run_id / spool.JOURNAL).write_text("\n".join(json.dumps(line) for line in (
        {"seq": 1, "op": "metrics", "data": points[:3]}, {"done": 1},
        {"seq": 2, "op": "metrics", "data": points[3:]})) + "\n")  # the point on its way

    again = runs.TrialRun.open(uri, experiment_id, parent, "k2", "trial-k2", {"lr": 0.1})
    assert again.run_id == first.run_id
    assert again.resumed_from_step == 1500
    for step in (1500, 2000):  # recomputed from the step-1000 checkpoint
        again.log_metrics({"objective": step / 1e4}, step)
    again.close("completed")
    assert [m.step for m in sorted(client.get_metric_history(again.run_id, "objective"),
                                   key=lambda m: m.step)] == [0, 500, 1000, 1500, 2000]


def test_no_empty_spool_folder_is_left_behind(tracking, tmp_path):
    """A trial stopped while it closed its spool (a pruned one) can leave its run folder
    without files; the next run that closes cleans such folders, keeps real journals."""
    _, client, _ = tracking
    root = tmp_path / "spool"
    (root / "pruned-run" / "artifacts").mkdir(parents=True)  # what a stopped trial left
    (root / "kept-run").mkdir()
    (root / "kept-run" / spool.JOURNAL).write_text("{}\n")  # unsent writes: never deleted
    run_id = _run(tracking)
    outbox = spool.Outbox(client, run_id, root=root)
    outbox.set_tags({"phase": "pruned"})
    assert outbox.close(timeout_s=60)
    assert sorted(p.name for p in root.iterdir()) == ["kept-run"]


def _outbox_lifecycles(root: str, n: int) -> None:
    """What the trials of one machine do to the spool, ``n`` times: a run's folder made
    with its journal (`Outbox`), its meta and an artifact copied in, then deleted (`close`)."""
    import shutil
    from pathlib import Path

    from service.tracking import journal

    figures = Path(root).parent / "figures"
    (figures / "plots").mkdir(parents=True)
    (figures / "plots" / "a.png").write_bytes(b"png")
    for i in range(n):
        directory = Path(root) / f"run-{i % 5}"
        journal._make_run_directory(directory, directory / spool.JOURNAL)
        (directory / spool.META).write_text("{}")
        shutil.copytree(figures, directory / "artifacts" / str(i))
        shutil.rmtree(directory, ignore_errors=True)


def test_cleaning_the_spool_is_safe_beside_processes_that_fill_and_empty_it(tmp_path):
    """The sweep's driver cleans the spool (`remove_empty`, when its own outbox closes)
    while trial workers make and delete their runs' folders: neither side sees a folder
    vanish under it (a FileNotFoundError ended a sweep that had finished every trial)."""
    import multiprocessing

    root = tmp_path / "spool"
    root.mkdir()
    (root / "kept-run").mkdir()
    (root / "kept-run" / spool.JOURNAL).write_text("{}\n")
    worker = multiprocessing.get_context("spawn").Process(target=_outbox_lifecycles, args=(str(root), 3000))
    worker.start()
    cleanings = 0
    while worker.is_alive() or cleanings == 0:
        spool.remove_empty(root)
        cleanings += 1
    worker.join()
    assert worker.exitcode == 0
    spool.remove_empty(root)
    assert sorted(p.name for p in root.iterdir()) == ["kept-run"]
    spool.remove_empty(tmp_path / "gone")  # a spool that does not exist: nothing to do
