"""Define-by-run with Optuna alone (no Ray): conditional parameters, dependency order, and
the mapping of flat parameter names onto the nested run config."""

from __future__ import annotations

import pickle
from pathlib import Path

import optuna
import pytest

from service.config import RunConfig
from service.search.assign import run_configs
from service.search.loading import load_space, parse_space
from service.search.sampler import DefineByRun, suggest_params

SPACES = Path(__file__).resolve().parents[2] / "search_spaces"
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _space(params: dict, **extra):
    data = {
        "name": "t", "task": {"kind": "small_mul", "eval_samples": 100}, "steps": 100, "eval_every": 50,
        "fixed": {"model": {"layers": [{"unit": "nalu"}, {"unit": "nalu"}]}},
        "params": params, **extra,
    }
    return parse_space(data)


GATES = {
    "gate": {"type": "categorical", "choices": ["standard", "temperature", "bias"],
             "target": "model.layers.*.options.gate"},
    # listed before the parameter it depends on: must still be suggested after it
    "tau_end": {"type": "uniform", "low": 1.0, "high": 5.0, "target": "model.layers.*.options.tau_end",
                "when": {"tau_schedule": "linear"}},
    "tau_schedule": {"type": "categorical", "choices": ["linear", "exponential"],
                     "target": "model.layers.*.options.tau_schedule", "when": {"gate": "temperature"}},
    "gate_bias_init": {"type": "uniform", "low": -2.0, "high": 2.0,
                       "target": "model.layers.1.options.gate_bias_init", "when": {"gate": ["bias"]}},
    "lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1, "target": "train.optimizer.lr"},
    "batch_size": {"type": "int", "low": 16, "high": 256, "log": True, "target": "train.batch_size"},
}


def test_dependency_order():
    order = _space(GATES).order()
    assert order.index("gate") < order.index("tau_schedule") < order.index("tau_end")


def test_conditional_parameters_exist_only_when_their_condition_holds():
    space = _space(GATES)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=3, n_startup_trials=5))
    seen = set()

    def objective(trial):
        params = suggest_params(trial, space)
        assert params == trial.params  # exactly what Optuna recorded
        seen.add(params["gate"])
        assert ("tau_schedule" in params) == (params["gate"] == "temperature")
        assert ("tau_end" in params) == (params.get("tau_schedule") == "linear")
        assert ("gate_bias_init" in params) == (params["gate"] == "bias")
        return params["lr"]

    study.optimize(objective, n_trials=30)
    assert seen == {"standard", "temperature", "bias"}


def test_values_land_at_their_target_paths():
    space = _space(GATES)
    configs = run_configs(space, {"gate": "temperature", "tau_schedule": "linear", "tau_end": 3.5,
                                  "lr": 0.02, "batch_size": 64})
    (config,) = configs.values()
    assert isinstance(config, RunConfig)
    assert [layer.options["gate"] for layer in config.layers()] == ["temperature", "temperature"]
    assert all(layer.options["tau_end"] == 3.5 for layer in config.layers())
    assert config.train.optimizer.lr == 0.02 and config.train.batch_size == 64
    assert config.train.steps == 100 and config.train.eval_every == 50
    assert config.task.kind == "small_mul"


def test_inactive_values_are_ignored():
    """A value whose condition does not hold (e.g. from an edited config) is dropped."""
    (config,) = run_configs(_space(GATES), {"gate": "standard", "tau_schedule": "linear",
                                            "lr": 0.01, "batch_size": 32}).values()
    assert "tau_schedule" not in config.layers()[0].options


def test_preset_choices_set_several_fields():
    space = load_space(SPACES / "optimizer_study.yaml")
    for label, unit in (("nac", "nac_add"), ("nalu", "nalu")):
        (config,) = run_configs(space, {"model": label, "optimizer": "adam", "lr": 1e-3,
                                        "batch_size": 64, "clip": "none"}).values()
        assert [layer.unit for layer in config.layers()] == [unit, unit]


def test_task_reference_model_is_used_when_no_layers_are_fixed():
    space = parse_space({
        "name": "t", "task": {"kind": "arithmetic", "operation": "add"}, "steps": 10, "eval_every": 5,
        "params": {"init": {"type": "categorical", "choices": ["zeros", "ones"], "target": "model.layers.*.init"}},
    })
    (config,) = run_configs(space, {"init": "ones"}).values()
    assert [(layer.unit, layer.init) for layer in config.layers()] == [("nau", "ones"), ("nau", "ones")]


def test_several_tasks_give_one_config_each():
    space = load_space(SPACES / "nalu_gates.yaml")
    study = optuna.create_study()
    configs = run_configs(space, suggest_params(study.ask(), space))
    assert set(configs) == {"small_mul", "arithmetic_mul", "arithmetic_add"}
    assert {c.task.kind for c in configs.values()} == {"small_mul", "arithmetic"}


@pytest.mark.parametrize("path", sorted(SPACES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_suggestion_of_a_shipped_space_is_a_valid_run_config(path):
    space = load_space(path)
    sampler = optuna.samplers.RandomSampler(seed=0)
    if space.sampler.type == "grid":
        sampler = optuna.samplers.GridSampler(space.grid(), seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for _ in range(25):
        trial = study.ask()
        config = next(iter(run_configs(space, suggest_params(trial, space)).values()))
        assert isinstance(config, RunConfig)
        assert config.seeds == space.seeds and config.train.steps == space.steps
        study.tell(trial, 0.0)


def test_define_by_run_function_pickles():
    """OptunaSearch pickles its state (with the space function) to resume a sweep."""
    fn = pickle.loads(pickle.dumps(DefineByRun(_space(GATES))))
    trial = optuna.create_study().ask()
    assert fn(trial) is None and "gate" in trial.params


def test_seeded_tpe_repeats_its_suggestions():
    space = _space(GATES)

    def run():
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=7))
        out = []
        for _ in range(12):
            trial = study.ask()
            params = suggest_params(trial, space)
            out.append(params)
            study.tell(trial, params["lr"])
        return out

    assert run() == run()
