"""A recurrent search space as a real sweep (Ray Tune, Optuna, MLflow; slow)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from service.cli import app
from service.tracking import runs, store

SPACES = Path(__file__).resolve().parents[2] / "search_spaces"
runner = CliRunner()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sequential_sum", "sequential_product"])
def test_the_recurrent_space_runs_as_a_ray_sweep(ray_address, tmp_path, name):
    data = yaml.safe_load((SPACES / f"{name}.yaml").read_text())
    data["task"].update(eval_samples=16, reference_steps=20)
    data["scheduler"]["grace_period"] = 10
    data.update(eval_every=10)
    space = tmp_path / f"{name}.yaml"
    space.write_text(yaml.safe_dump(data, allow_unicode=True))
    result = runner.invoke(app, ["sweep", str(space), "--trials", "2", "--seeds", "2", "--steps", "20",
                                 "--name", f"{name}-e2e"])
    assert result.exit_code == 0, result.output
    client = store.client(store.resolve_tracking_uri(None))
    experiment = client.get_experiment_by_name(f"{name}-e2e")
    parent = runs.find_sweep_run(client, experiment.experiment_id, f"{name}-e2e")
    children = runs.trial_runs(client, experiment.experiment_id, parent.info.run_id)
    assert len(children) == 2
    longest = max(data["task"]["test_lengths"])
    for child in children:
        assert child.data.params["task.kind"] == "sequential_digits"
        assert f"success_rate_per_range.length_{longest}" in child.data.metrics
        assert "objective" in child.data.metrics
