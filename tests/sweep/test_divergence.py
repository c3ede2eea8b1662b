"""Diverging seeds inside a sweep (real Ray, Optuna and MLflow): an NPU with a learning
rate of 30-1000 sends most seeds to NaN/inf within a few hundred steps. They are counted
as diverged, the trial and the sweep finish, and Optuna only ever receives finite values."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.tracking import runs, store

NAME = "diverging"
SPACE = f"""
name: {NAME}
task: {{kind: small_mul, eval_samples: 200, threshold_samples: 1000}}
fixed:
  model: {{layers: [{{unit: nau}}, {{unit: npu}}]}}
  train: {{batch_size: 32, clip: {{mode: none}}}}
  device: cpu
  compile: "off"
params:
  lr: {{type: loguniform, low: 30.0, high: 1000.0, target: train.optimizer.lr}}
seeds: 4
steps: 200
eval_every: 100
trials: 2
concurrency: 2
scheduler: none
resources: {{cpus: 1, gpus: 0}}
retries: 0
sampler: {{type: random, seed: 0}}
"""


@pytest.mark.slow
def test_diverging_seeds_are_recorded_and_optuna_gets_finite_values(ray_address, tmp_path):
    import optuna

    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    study_url = f"sqlite:///{tmp_path / 'optuna.db'}"
    result = CliRunner().invoke(app, ["sweep", str(space), "--optuna-storage", study_url])
    assert result.exit_code == 0, result.output
    assert f"sweep {NAME} completed" in result.output

    client = store.client(store.resolve_tracking_uri(None))
    experiment = client.get_experiment_by_name(NAME)
    parent = runs.find_sweep_run(client, experiment.experiment_id, NAME)
    children = runs.trial_runs(client, experiment.experiment_id, parent.info.run_id)
    assert len(children) == 2
    diverged = 0
    for child in children:
        assert child.info.status == "FINISHED" and child.data.tags[store.TAG_OUTCOME] == "completed"
        metrics = child.data.metrics
        assert metrics["n_seeds"] == 4 and 0 <= metrics["diverged"] <= 4
        diverged += metrics["diverged"]
        assert math.isfinite(metrics["objective"])
        history = client.get_metric_history(child.info.run_id, "objective")
        assert len(history) >= 2 and all(math.isfinite(m.value) for m in history)
    assert diverged >= 2, "the NPU at lr ≥ 30 no longer diverges: pick a harsher setting"

    study = optuna.load_study(study_name=NAME, storage=study_url)
    assert len(study.trials) == 2
    for trial in study.trials:
        assert trial.state == optuna.trial.TrialState.COMPLETE, trial
        assert math.isfinite(trial.value)
        assert all(math.isfinite(v) for v in trial.intermediate_values.values())
    objectives = sorted(c.data.metrics["objective"] for c in children)
    assert sorted(t.value for t in study.trials) == pytest.approx(objectives)
