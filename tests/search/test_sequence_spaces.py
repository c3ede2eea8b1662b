"""The recurrent search spaces run as (Ray-less) sweeps at a tiny size: Optuna suggests,
each trial trains its seeds on the sequence task, and the objective comes back finite."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
import yaml

from service.search.assign import run_configs
from service.search.loading import parse_space
from service.search.sampler import suggest_params
from service.sweep.trial import run_trial

SPACES = Path(__file__).resolve().parents[2] / "search_spaces"
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _tiny(name: str):
    data = yaml.safe_load((SPACES / f"{name}.yaml").read_text())
    data["task"].update(eval_samples=16, reference_steps=20, test_lengths=[1, 3, 30])
    data.update(seeds=2, steps=20, eval_every=10, trials=3)
    data["scheduler"]["grace_period"] = 10
    return parse_space(data, source=f"{name}.yaml")


@pytest.mark.parametrize("name", ["sequential_sum", "sequential_product"])
def test_the_recurrent_space_runs_as_a_sweep(name):
    space = _tiny(name)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    cells = set()
    for index in range(3):
        trial = study.ask()
        params = suggest_params(trial, space)
        if index == 0:  # every cell gets tried: the NAU/NMU one, the NAC one and the LSTM
            params = {**params, "cell": "lstm"}
        cells.add(params["cell"])
        config = next(iter(run_configs(space, params).values()))
        assert config.task.kind == "sequential_digits" and config.layers()[-1].unit == params["cell"]
        reports: list[dict] = []
        progress = run_trial(params, space, reports.append)
        assert progress.completed
        value = progress.final_metrics["objective"]
        assert math.isfinite(value) and 0 <= value <= 1.1
        assert "success_rate_per_range.length_30" in progress.final_metrics
        assert 0 <= progress.final_metrics["longest_length_solved_median"] <= 30
        study.tell(trial, value)
    assert "lstm" in cells and len(cells) >= 2
