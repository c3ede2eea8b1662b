"""MLflow bookkeeping without Ray: the embedded store, parent/child runs, reuse of a trial's
run on retry or resume, closing runs a crash left RUNNING, reconciling with Tune."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from service.tracking import runs, spool, store
from service.tracking.store import TAG_ATTEMPTS, TAG_OUTCOME, TAG_PARENT, TAG_TRIAL_KEY


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    """One SQLite store for the module (creating its tables costs seconds)."""
    directory = tmp_path_factory.mktemp("mlflow")
    uri = store.default_tracking_uri(directory)
    client = store.client(uri)
    return uri, client, directory


def _sweep(tracking, name):
    uri, client, _ = tracking
    experiment_id = store.ensure_experiment(client, name, uri)
    parent = runs.start_sweep_run(client, experiment_id, name, space_file=None, spec_json="{}",
                                  spec_hash="abc", storage_path="/tmp/x", params={"trials": 2})
    return experiment_id, parent


def test_default_store_is_an_absolute_sqlite_file_in_the_working_directory(tmp_path):
    uri = store.resolve_tracking_uri(None)
    assert uri == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert uri.startswith("sqlite:////")
    assert store.resolve_tracking_uri("sqlite:///rel.db") == f"sqlite:///{tmp_path.resolve() / 'rel.db'}"
    assert store.resolve_tracking_uri("http://mlflow:5000") == "http://mlflow:5000"
    assert store.artifact_root(uri) == (tmp_path.resolve() / "mlruns").as_uri()


def test_experiment_gets_an_absolute_artifact_location(tracking):
    uri, client, directory = tracking
    experiment_id = store.ensure_experiment(client, "located", uri)
    assert store.ensure_experiment(client, "located", uri) == experiment_id
    location = client.get_experiment(experiment_id).artifact_location
    assert location == (directory.resolve() / "mlruns" / "located").as_uri()


def test_parent_run_carries_tags_and_the_spec(tracking):
    uri, client, _ = tracking
    experiment_id, parent = _sweep(tracking, "tagged")
    run = client.get_run(parent)
    assert run.data.tags[store.TAG_SWEEP] == "tagged"
    assert run.data.tags[store.TAG_SPACE_HASH] == "abc"
    assert store.TAG_GIT_COMMIT in run.data.tags
    assert [a.path for a in client.list_artifacts(parent, "search_space")] == ["search_space/resolved_spec.json"]
    assert runs.find_sweep_run(client, experiment_id, "tagged").info.run_id == parent


def test_a_retried_trial_reuses_its_run_and_skips_steps_already_logged(tracking):
    uri, client, _ = tracking
    experiment_id, parent = _sweep(tracking, "retry")
    first = runs.TrialRun.open(uri, experiment_id, parent, "t1", "trial-t1", {"lr": 0.1})
    for step in (0, 100, 200):
        first.log_metrics({"objective": step / 1000, "success_rate": 0.0}, step)
    first.close("failed")
    assert client.get_run(first.run_id).info.status == "FAILED"

    again = runs.TrialRun.open(uri, experiment_id, parent, "t1", "trial-t1", {"lr": 0.1})
    assert again.run_id == first.run_id
    for step in (0, 100, 200, 300):
        again.log_metrics({"objective": step / 1000}, step)
    again.close("completed")

    children = runs.trial_runs(client, experiment_id, parent)
    assert len(children) == 1
    run = children[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags[TAG_ATTEMPTS] == "2" and run.data.tags[TAG_OUTCOME] == "completed"
    assert run.data.tags[TAG_PARENT] == parent and run.data.tags[TAG_TRIAL_KEY] == "t1"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "objective")] == [0, 100, 200, 300]


def test_a_run_created_by_an_attempt_killed_before_its_first_write_gets_its_params_when_reopened(tracking):
    """A driver killed right after it created a worker's run (the answer never reached the
    worker) leaves the run without params; the resumed trial's reopen logs them, and a
    param the run holds keeps its value."""
    uri, client, _ = tracking
    experiment_id, parent = _sweep(tracking, "created-then-killed")
    run_id, last, attempts, unlogged = runs.find_or_create_run(client, experiment_id, parent, "k", "trial-k", {},
                                                               {"lr": "0.1", "seeds": "4"})
    assert (last, attempts, unlogged) == (None, None, {"lr": "0.1", "seeds": "4"})  # nothing logged: killed
    client.log_param(run_id, "seeds", "4")  # one had arrived

    again = runs.TrialRun.open(uri, experiment_id, parent, "k", "trial-k", {"lr": 0.1, "seeds": 4})
    assert again.run_id == run_id
    again.close("completed")
    assert client.get_run(run_id).data.params == {"lr": "0.1", "seeds": "4"}


def test_runs_left_running_by_a_crash_are_closed(tracking):
    uri, client, _ = tracking
    experiment_id, parent = _sweep(tracking, "crash")
    done = runs.TrialRun.open(uri, experiment_id, parent, "a", "trial-a", {})
    done.close("pruned")
    stuck = runs.TrialRun.open(uri, experiment_id, parent, "b", "trial-b", {})
    assert runs.close_stale_trial_runs(client, experiment_id, parent) == [stuck.run_id]
    run = client.get_run(stuck.run_id)
    assert run.info.status == "KILLED" and run.data.tags[TAG_OUTCOME] == "interrupted"
    assert client.get_run(done.run_id).info.status == "FINISHED"


def test_a_resume_first_sends_what_dead_workers_journalled(tracking, tmp_path, monkeypatch):
    """The killed driver's workers died with writes journalled on this machine but not
    sent: a pruned member's last point and its close, another trial's last point. The
    resume sends them before it closes what is still open: the pruned run stays pruned,
    with its point; the other is closed as interrupted, with its point; a run without a
    journal is closed as before."""
    from service.tracking.store import Outcome

    uri, client, _ = tracking
    monkeypatch.setenv(spool.SPOOL_ENV, str(tmp_path))
    experiment_id, parent = _sweep(tracking, "journalled")
    pruned, cut, bare = (runs.find_or_create_run(client, experiment_id, parent, key, f"trial-{key}", {})[0]
                         for key in ("p", "c", "b"))
    now = int(time.time() * 1000)
    for run_id, close in ((pruned, True), (cut, False)):
        (tmp_path / run_id).mkdir()
        lines = [{"seq": 1, "op": "metrics", "data": [["objective", 0.1, now, 50]]}, {"done": 1},
                 {"seq": 2, "op": "metrics", "data": [["objective", 0.2, now, 100]]}]
        if close:
            lines += [{"seq": 3, "op": "tags", "data": {TAG_OUTCOME: Outcome.PRUNED}},
                      {"seq": 4, "op": "status", "data": "FINISHED"}]
        (tmp_path / run_id / spool.JOURNAL).write_text("".join(json.dumps(line) + "\n" for line in lines))

    assert sorted(runs.close_stale_trial_runs(client, experiment_id, parent, uri)) == sorted([cut, bare])
    states = {r: (client.get_run(r).info.status, client.get_run(r).data.tags[TAG_OUTCOME]) for r in (pruned, cut, bare)}
    assert states == {pruned: ("FINISHED", "pruned"), cut: ("KILLED", "interrupted"), bare: ("KILLED", "interrupted")}
    for run_id in (pruned, cut):  # the point that was on its way arrived; the one sent is not doubled
        assert [(m.step, m.value) for m in client.get_metric_history(run_id, "objective")] == [(100, 0.2)]
    assert list(tmp_path.iterdir()) == []  # the journals were sent in full


def test_after_fit_mlflow_is_made_to_agree_with_tune(tracking):
    from service.sweep.outcome import TuneTrial, settle_trial_runs

    uri, client, _ = tracking
    experiment_id, parent = _sweep(tracking, "settle")
    stopped = runs.TrialRun.open(uri, experiment_id, parent, "p", "trial-p", {})
    stopped.log_metrics({"objective": 0.0}, 0)
    stopped.flush()
    phantom = runs.TrialRun.open(uri, experiment_id, parent, "x", "trial-x", {})
    runs.close_stale_trial_runs(client, experiment_id, parent)  # as a resume does
    tune = {"p": TuneTrial("pruned", {"objective": 0.25, "success_rate": 0.5, "step": 500.0, "pid": 7})}
    settle_trial_runs(client, experiment_id, parent, tune, complete=True)

    left = {r.data.tags[TAG_TRIAL_KEY]: r for r in runs.trial_runs(client, experiment_id, parent)}
    assert set(left) == {"p"}  # the phantom (unknown to Tune) is gone
    run = left["p"]
    assert run.info.status == "FINISHED" and run.data.tags[TAG_OUTCOME] == "pruned"
    assert run.data.metrics["success_rate"] == 0.5 and "pid" not in run.data.metrics
    assert client.get_run(phantom.run_id).info.lifecycle_stage == "deleted"


def test_git_commit_is_a_hash_or_unknown(tmp_path):
    assert store.git_commit(tmp_path) == "unknown"
    commit = store.git_commit(Path(__file__).parent)
    assert commit == "unknown" or len(commit.removesuffix("+dirty")) == 40
