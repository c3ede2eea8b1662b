"""A trial that crashes after a checkpoint is retried by real Ray Tune (`FailureConfig`) and
continues from its checkpoint: it does not start over, and it ends with the same final
parameters as an uninterrupted trial (slow: real Ray, Optuna, MLflow)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from service.search.loading import parse_space
from service.sweep import driver
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


@pytest.mark.slow
def test_a_retried_trial_continues_from_its_checkpoint(ray_address, tmp_path, monkeypatch, crashing_trainable):
    space = _space()
    marker = tmp_path / "crashed"
    # the first attempt dies right after reporting step CRASH_AT; its last checkpoint is at 200
    monkeypatch.setattr(driver, "make_trainable", crashing_trainable(marker, CRASH_AT))
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
    # in the Tune storage, every one kept (issue 34: a resume after a crash must find each
    # checkpoint Tune's last snapshot names): the first attempt's at 100 and 200, the retry's at
    # 300 (none at the trial's end)
    checkpoints = list((tmp_path / "runs" / "ckpt").glob("trial-*/checkpoint_*/trial_state.pt"))
    assert len(checkpoints) == 3, checkpoints


@pytest.mark.slow
def test_a_resume_after_a_crash_mid_checkpoints_reads_calm(ray_address, tmp_path, driver_killed_when, cli_process):
    """Issue 34, as a user tried it: a sweep whose trials checkpoint at every evaluation,
    its driver SIGKILLed while they do, then ``--resume``. Neither run prints a traceback,
    Tune's "Error handling checkpoint" (a checkpoint its last snapshot names, deleted since)
    or, more than once, its warning that it snapshots its state too often; and the resumed
    sweep completes every trial."""
    import yaml

    spec = {
        "name": "calm", "steps": 1500, "eval_every": 50, "seeds": 4, "checkpoint_every": 1,
        "task": {"kind": "small_mul", "eval_samples": 200, "threshold_samples": 10_000},
        "fixed": {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "device": "cpu", "compile": "off",
                  "train": {"batch_size": 32}},
        "params": {"lr": {"type": "categorical", "choices": [0.03, 0.05, 0.08], "target": "train.optimizer.lr"}},
        "trials": 3, "concurrency": 1, "scheduler": {"type": "none"}, "sampler": {"type": "grid"},
    }
    (tmp_path / "calm.yaml").write_text(yaml.safe_dump(spec))
    args = ["sweep", "calm.yaml"]
    checkpoints = tmp_path / "runs" / "calm"
    first = driver_killed_when(args, tmp_path, ray_address,
                               lambda: len(list(checkpoints.glob("trial-*/checkpoint_*"))) >= 6)
    resumed = cli_process([*args, "--resume"], tmp_path, ray_address)
    assert resumed.returncode == 0, resumed.stdout
    assert "sweep calm completed" in resumed.stdout and "3 completed" in resumed.stdout, resumed.stdout
    for out in (first, resumed.stdout):
        assert "Traceback" not in out and "Error handling checkpoint" not in out, out
        assert out.count("snapshotting has been triggered multiple times") <= 1, out
