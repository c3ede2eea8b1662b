"""The end of a sweep is recorded even when the tracking server is away at that moment:
the driver waits for it (with backoff, up to the spool's patience), and when it never
comes back it says so in one clear error instead of a traceback."""

from __future__ import annotations

import socket
import time

import pytest
import requests

from service.errors import UserError
from service.sweep.driver import SweepOptions
from service.sweep.outcome import TuneTrial, record_end
from service.tracking import runs, spool, store


class AwayFor:
    """A real MLflow client whose server is away for its next ``n`` calls (each fails as
    an unreachable server does), then back."""

    def __init__(self, client, n: int) -> None:
        self._client, self.left = client, n

    def __getattr__(self, name):
        method = getattr(self._client, name)

        def call(*args, **kwargs):
            if self.left > 0:
                self.left -= 1
                raise requests.ConnectionError("Connection refused")
            return method(*args, **kwargs)

        return call


def _sweep(tmp_path, name: str):
    uri = store.default_tracking_uri(tmp_path)
    client = store.client(uri)
    experiment_id = store.ensure_experiment(client, name, uri)
    parent = runs.start_sweep_run(client, experiment_id, name, space_file=None, spec_json="{}",
                                  spec_hash="h", storage_path=str(tmp_path), params={})
    child = client.create_run(experiment_id, tags={
        store.TAG_PARENT: parent, store.TAG_ROLE: "trial", store.TAG_TRIAL_KEY: "t1",
        store.TAG_SWEEP: name, store.TAG_OUTCOME: "running"}).info.run_id
    return uri, client, experiment_id, parent, child


def test_a_server_away_at_the_end_is_waited_for(tmp_path, monkeypatch):
    monkeypatch.setenv(spool.PATIENCE_ENV, "60")
    uri, client, experiment_id, parent, child = _sweep(tmp_path, "end")
    flaky = AwayFor(client, 3)
    trials = {"t1": TuneTrial("done", {"objective": 0.75, "training_iteration": 2})}
    counts, best, outcome = record_end(flaky, SweepOptions("end", uri, str(tmp_path)), experiment_id,
                                        parent, trials, "completed", planned=1)
    assert flaky.left == 0
    assert (counts["completed"], best, outcome) == (1, 0.75, "completed")
    assert client.get_run(child).info.status == "FINISHED"
    finished = client.get_run(parent)
    assert finished.info.status == "FINISHED"
    assert finished.data.tags[store.TAG_OUTCOME] == "completed"
    assert finished.data.metrics["trials_completed"] == 1


def test_a_server_that_stays_away_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(spool.PATIENCE_ENV, "2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"http://user:secret@127.0.0.1:{port}"
    began = time.monotonic()
    with pytest.raises(UserError) as error:
        record_end(store.client(uri), SweepOptions("end", uri, str(tmp_path)), "1", "p", {}, "completed",
                    planned=1)
    assert time.monotonic() - began < 15
    message = str(error.value)
    assert "did not answer for 2 s" in message and "--resume" in message
    assert "secret" not in message


def test_a_trial_run_again_after_a_resume_keeps_the_result_it_had(tmp_path):
    """A trial whose worker finished it just before the driver died is run again by the
    resumed sweep; when the scheduler stops that repeat, its run (which holds the final
    parameters' digest of the finished training) stays completed."""
    uri, client, experiment_id, parent, child = _sweep(tmp_path, "again")
    client.log_metric(child, "objective", 0.5, step=1000)
    client.set_tag(child, store.TAG_PARAMS_SHA256, "abc")  # trained to the end by attempt 1
    other = client.create_run(experiment_id, tags={
        store.TAG_PARENT: parent, store.TAG_ROLE: "trial", store.TAG_TRIAL_KEY: "t2",
        store.TAG_SWEEP: "again", store.TAG_OUTCOME: "running"}).info.run_id
    stopped = {"objective": 0.25, "step": 500.0}
    trials = {"t1": TuneTrial("pruned", stopped), "t2": TuneTrial("pruned", stopped)}
    counts, best, _ = record_end(client, SweepOptions("again", uri, str(tmp_path)), experiment_id, parent,
                                 trials, "completed", planned=2)
    assert client.get_run(child).data.tags[store.TAG_OUTCOME] == "completed"
    assert client.get_run(other).data.tags[store.TAG_OUTCOME] == "pruned"
    assert (counts["completed"], counts["pruned"], best) == (1, 1, 0.5)
