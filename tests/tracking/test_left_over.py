"""Journals a stopped trial leaves behind: the sweep's end sends them before it closes the
runs, an upload never stores a (metric, step) twice, what stays is named at the sweep's
end, and MLflow's own "View run" lines stay out of the output."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.sweep.driver import SweepOptions
from service.sweep.outcome import TuneTrial, record_end
from service.tracking import runs, spool, store

REPO = Path(__file__).resolve().parents[2]
KEYS = [f"metric_{i}" for i in range(12)] + ["objective"]  # 13 metrics a report, as a trial's


def _report(step: int) -> list[tuple[str, float, int, int]]:
    now = int(time.time() * 1000)
    return [(k, step / 1e4 + i, now, step) for i, k in enumerate(KEYS)]


def _pruned_trial(uri, client, experiment_id, parent, away, root: Path) -> str:
    """A trial run whose reports up to step 1000 arrived; its step-2000 report, outcome
    tags and status are journalled, never sent (the worker was stopped while it drained)."""
    trial = runs.TrialRun.open(uri, experiment_id, parent, "t1", "trial-t1", {"lr": 0.1})
    for step in (500, 1000):
        trial.outbox.log_metrics(_report(step))
    assert trial.flush(timeout_s=60)
    trial.outbox.close(timeout_s=60)
    stopped = spool.Outbox(away, trial.run_id, uri, root=root, backoff_s=(0.05, 0.2))
    stopped.log_metrics(_report(2000))
    stopped.set_tags({store.TAG_OUTCOME: "pruned"})
    stopped.set_status("FINISHED")
    assert not stopped.close(timeout_s=0.5)
    return trial.run_id


def _steps(client, run_id: str) -> dict[str, list[int]]:
    return {k: sorted(m.step for m in client.get_metric_history(run_id, k)) for k in KEYS}


def test_the_sweep_end_sends_a_stopped_trials_journal_and_removes_it(tmp_path, away, monkeypatch):
    root = tmp_path / "spool"
    monkeypatch.setenv(spool.SPOOL_ENV, str(root))
    uri = store.default_tracking_uri(tmp_path)
    client = store.client(uri)
    experiment_id = store.ensure_experiment(client, "left-over", uri)
    parent = runs.start_sweep_run(client, experiment_id, "left-over", space_file=None, spec_json="{}",
                                  spec_hash="abc", storage_path=str(tmp_path / "runs"), params={})
    run_id = _pruned_trial(uri, client, experiment_id, parent, away, root)
    last = {k: v for k, v, _, _ in _report(2000)} | {"step": 2000}
    options = SweepOptions(name="left-over", tracking_uri=uri, storage_path=str(tmp_path / "runs"))

    counts, _, outcome = record_end(client, options, experiment_id, parent, {"t1": TuneTrial("pruned", last)},
                                    "completed", planned=1)

    assert (outcome, counts["pruned"]) == ("completed", 1)
    assert not (root / run_id).exists()  # its writes reached the store: nothing left behind
    assert _steps(client, run_id) == {k: [500, 1000, 2000] for k in KEYS}
    assert spool.left_over_note(uri) is None


def test_an_upload_stores_each_metric_and_step_once(tmp_path, away, monkeypatch):
    """The sweep's end closed the stopped trial's run from Tune's last result (its step-2000
    points, timestamped then); the journal's own step-2000 points are left out."""
    root = tmp_path / "spool"
    monkeypatch.setenv(spool.SPOOL_ENV, str(root))
    uri = store.default_tracking_uri(tmp_path)
    client = store.client(uri)
    experiment_id = store.ensure_experiment(client, "upload-once", uri)
    parent = client.create_run(experiment_id).info.run_id
    run_id = _pruned_trial(uri, client, experiment_id, parent, away, root)
    time.sleep(0.01)  # the driver's points carry a later timestamp than the journal's
    runs.settle_trial_run(client, run_id, "pruned", {k: v for k, v, _, _ in _report(2000)}, 2000)

    note = spool.left_over_note(uri)
    assert note is not None and str(root / run_id) in note and spool.UPLOAD_HINT in note
    done = subprocess.run([sys.executable, "-m", "service.tracking.spool", "upload", str(root / run_id)],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert _steps(client, run_id) == {k: [500, 1000, 2000] for k in KEYS}
    assert not (root / run_id).exists()
    assert spool.main(["upload", str(tmp_path / "nowhere")]) == 2  # a clear error, no traceback


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A plain `mlflow server` on loopback with a SQLite store (MLflow prints its run links
    only for a tracking server)."""
    sys.path.insert(0, str(REPO / "tests" / "cluster"))
    import loopback_stack

    directory = tmp_path_factory.mktemp("server")
    port = loopback_stack.free_port()
    log = (directory / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--backend-store-uri", f"sqlite:///{directory / 'mlflow.db'}",
                             "--default-artifact-root", str(directory / "artifacts"), "--workers", "1"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=directory)
    uri = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        loopback_stack.wait_until(lambda: urllib.request.urlopen(f"{uri}/health", timeout=2).status == 200, 150,
                                  "mlflow server", directory / "server.log")
        yield uri
    finally:
        loopback_stack.stop_trees([proc])
        log.close()


@pytest.mark.slow
def test_uploading_to_a_server_prints_no_mlflow_run_links(mlflow_server, tmp_path, away):
    root = tmp_path / "spool"
    client = store.client(mlflow_server)
    experiment_id = store.ensure_experiment(client, "links", mlflow_server)
    run_id = client.create_run(experiment_id).info.run_id
    kept = spool.Outbox(away, run_id, mlflow_server, root=root, backoff_s=(0.05, 0.2))
    kept.log_metrics(_report(0))
    kept.set_status("FINISHED")
    assert not kept.close(timeout_s=0.5)
    env = {k: v for k, v in os.environ.items() if k != store.QUIET_RUN_LINKS_VAR}  # as a user's shell has it
    done = subprocess.run([sys.executable, "-m", "service.tracking.spool", "upload", str(root)],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**env, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{run_id}: uploaded" in done.stdout
    assert "View run" not in done.stdout + done.stderr and "View experiment" not in done.stdout + done.stderr
    assert client.get_run(run_id).info.status == "FINISHED"


@pytest.mark.slow
def test_a_sweep_leaves_no_journal_it_could_send_and_names_the_one_it_could_not(ray_address, tmp_path, away):
    """A real sweep whose ASHA prunes a trial (its worker is ended while its journal drains)
    leaves no journal of its own runs, and ends by naming a journal of its store that it
    cannot send (one kept while the server was away, of a run that is not its own)."""
    from typer.testing import CliRunner

    from service.cli import app

    uri = store.resolve_tracking_uri(None)  # the sweep's SQLite store in this test's directory
    client = store.client(uri)
    other = client.create_run(store.ensure_experiment(client, "elsewhere", uri)).info.run_id
    kept = spool.Outbox(away, other, uri, root=spool.spool_root(), backoff_s=(0.05, 0.2))
    kept.log_metrics(_report(0))
    assert not kept.close(timeout_s=0.5)

    smoke = str(REPO / "search_spaces" / "smoke.yaml")
    result = CliRunner().invoke(app, ["sweep", smoke, "--trials", "4", "--name", "left-over-e2e"])
    assert result.exit_code == 0, result.output
    assert f"tracking writes of run {other} did not reach MLflow and are kept in {spool.spool_root() / other}" \
        in result.output
    assert f"{spool.UPLOAD_HINT} {spool.spool_root() / other}" in result.output

    experiment = client.get_experiment_by_name("left-over-e2e")
    parent = runs.find_sweep_run(client, experiment.experiment_id, "left-over-e2e")
    trials = runs.trial_runs(client, experiment.experiment_id, parent.info.run_id)
    assert "pruned" in {t.data.tags[store.TAG_OUTCOME] for t in trials}
    assert not {t.info.run_id for t in trials} & spool.journalled_runs()
    for trial in trials:
        for key in trial.data.metrics:
            steps = [m.step for m in client.get_metric_history(trial.info.run_id, key)]
            assert len(steps) == len(set(steps)), (trial.info.run_name, key)
    assert spool.upload(spool.spool_root() / other)  # the named journal uploads, then goes
    assert spool.left_over_note(uri) is None
