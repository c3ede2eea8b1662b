"""A trial that crashes after a checkpoint is retried by real Ray Tune (`FailureConfig`) and
continues from its checkpoint: it does not start over, and it ends with the same final
parameters as an uninterrupted trial (slow: real Ray, Optuna, MLflow)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from service.search.loading import parse_space
from service.sweep import driver
from service.sweep.trainable import TRAINABLE_NAME
from service.sweep.trial import params_digest, run_trial
from service.tracking import runs, store

STEPS, EVAL_EVERY, CRASH_AT = 400, 50, 250


def _space():
    return parse_space({
        "name": "ckpt", "steps": STEPS, "eval_every": EVAL_EVERY, "seeds": 4, "checkpoint_every": 2,
        "task": {"kind": "small_mul", "eval_samples": 200, "threshold_samples": 10_000},
        "fixed": {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "device": "cpu", "compile": "off",
                  "train": {"batch_size": 32, "regularizer": {"lambda_max": 0.1, "t_start": 100, "t_end": 300}}},
        "params": {"lr": {"type": "categorical", "choices": [0.05], "target": "train.optimizer.lr"}},
        "trials": 1, "concurrency": 1, "scheduler": "none", "retries": 1,
    })


def _flaky_trainable(marker: Path):
    """`make_trainable`, but the first attempt of a trial dies (an exception out of the
    trainable, as a crashing worker's) right after reporting step `CRASH_AT`; the last
    checkpoint before it is the one at step 200."""

    def make(settings):
        def nalu_sweep_trial(config):
            from unittest import mock

            import ray.tune

            from service.sweep.trainable import execute_trial

            if marker.exists():
                return execute_trial(config, settings)
            real_report = ray.tune.report

            def report(metrics, *, checkpoint=None):
                real_report(metrics, checkpoint=checkpoint)
                if metrics["step"] >= CRASH_AT:
                    marker.write_text(str(metrics["step"]))
                    raise RuntimeError("injected fault after a checkpoint")

            with mock.patch.object(ray.tune, "report", report):
                execute_trial(config, settings)

        nalu_sweep_trial.__name__ = TRAINABLE_NAME
        return nalu_sweep_trial

    return make


@pytest.mark.slow
def test_a_retried_trial_continues_from_its_checkpoint(ray_address, tmp_path, monkeypatch):
    space = _space()
    marker = tmp_path / "crashed"
    monkeypatch.setattr(driver, "make_trainable", _flaky_trainable(marker))
    iterations = []
    tune_trials = driver.tune_trials

    def spy(grid, board, total_steps):  # Tune's own view of the trial at the end of `fit`
        iterations.extend(r.metrics.get("training_iteration") for r in grid or [])
        return tune_trials(grid, board, total_steps)

    monkeypatch.setattr(driver, "tune_trials", spy)
    options = driver.SweepOptions(name="ckpt", tracking_uri=store.resolve_tracking_uri(None),
                                       storage_path=str(tmp_path / "runs"))
    summary = driver.run_sweep(space, options, Console(file=io.StringIO()))
    assert marker.read_text() == str(float(CRASH_AT)), "the fault was not injected"
    assert summary.outcome == "completed" and summary.trials["completed"] == 1, summary

    client = store.client(options.tracking_uri)
    (child,) = runs.trial_runs(client, summary.experiment_id, summary.parent_run_id)
    tags = child.data.tags
    assert tags[store.TAG_ATTEMPTS] == "2" and tags[store.TAG_OUTCOME] == "completed"
    assert tags[store.TAG_RESUMED_FROM] == "200"  # the retry started at the checkpoint, not at 0
    assert store.TAG_ERROR in tags  # the first attempt's failure is on record
    history = client.get_metric_history(child.info.run_id, "objective")
    assert sorted(m.step for m in history) == list(range(0, STEPS + 1, EVAL_EVERY))  # each once

    reference = run_trial({"lr": 0.05}, space, lambda m: None)  # uninterrupted, same setting
    assert reference.final_metrics["objective"] == child.data.metrics["objective"]
    assert tags[store.TAG_PARAMS_SHA256] == params_digest(reference.results)
    # Tune restored its iteration count with the checkpoint: ASHA's rungs stay aligned
    assert iterations == [STEPS // EVAL_EVERY]
    checkpoints = list((tmp_path / "runs" / "ckpt").glob("trial-*/checkpoint_*/trial_state.pt"))
    assert 1 <= len(checkpoints) <= 2, checkpoints  # in the Tune storage; only the latest kept
