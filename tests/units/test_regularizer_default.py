"""The default regulariser schedule is the reference's scaled to the run (docs/domain/units.md), and
the schedule a run actually uses is recorded: in `result.json`, the trial's MLflow params,
and stated explicitly by every shipped search space."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.config import RunConfig
from service.search.assign import run_configs
from service.search.loading import load_space
from service.search.targets import searched_values
from service.sweep.logged_params import regularizer_params
from service.units.schedule import RegularizerSchedule

SPACES = Path(__file__).resolve().parents[2] / "search_spaces"
NAU_NMU = {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}
NAU_NAU = {"layers": [{"unit": "nau"}, {"unit": "nau"}]}
GATED = {"layers": [{"unit": "nalu", "options": {"weights": "independent", "mul_unit": "nmu"}},
                    {"unit": "nalu", "options": {"weights": "independent", "mul_unit": "nmu"}}]}
NALU = {"layers": [{"unit": "nalu"}, {"unit": "nalu"}]}


def config(model: dict, steps: int, **train) -> RunConfig:
    return RunConfig.model_validate({"task": {"kind": "arithmetic", "operation": "mul"},
                                     "model": model, "train": {"steps": steps, **train}})


@pytest.mark.parametrize("model, expected", [
    (NAU_NMU, (10.0, 1_000_000, 2_000_000)),
    (GATED, (10.0, 1_000_000, 2_000_000)),
    (NAU_NAU, (0.01, 5_000, 50_000)),
    (NALU, (0.01, 5_000, 50_000)),
])
def test_default_is_the_reference_schedule_on_a_reference_length_run(model, expected):
    s = config(model, 5_000_000).regularizer()
    assert (s.shape, s.lambda_max, s.t_start, s.t_end) == ("linear", *expected)


@pytest.mark.parametrize("model, expected", [
    (NAU_NMU, (10.0, 10_000, 20_000)),  # 20% → 40% of 50,000 steps
    (GATED, (10.0, 10_000, 20_000)),
    (NAU_NAU, (0.01, 50, 500)),  # 0.1% → 1%
])
def test_default_is_scaled_to_the_run(model, expected):
    s = config(model, 50_000).regularizer()
    assert (s.lambda_max, s.t_start, s.t_end) == expected


@pytest.mark.parametrize("steps", [1, 2, 7, 99, 1000, 12_345, 50_000, 999_999, 5_000_000, 10**9])
@pytest.mark.parametrize("model", [NAU_NMU, NAU_NAU])
def test_default_reaches_lambda_max_within_every_run(model, steps):
    """The failure of issue 12: an NMU model got λ from step 1e6 whatever the run length."""
    s = config(model, steps).regularizer()
    assert 0 <= s.t_start < s.t_end <= max(steps, 1)
    assert float(s.value(s.t_end)) == pytest.approx(s.lambda_max)
    assert float(s.value(max(s.t_start - 1, 0))) == 0.0


def test_an_explicit_schedule_is_kept():
    explicit = {"lambda_max": 3.0, "t_start": 7, "t_end": 9, "shape": "constant"}
    cfg = config(NAU_NMU, 50_000, regularizer=explicit)
    assert cfg.regularizer() == RegularizerSchedule(**explicit)


@pytest.mark.parametrize("partial", [{"lambda_max": 5.0}, {"t_start": 100, "t_end": 200},
                                     {"shape": "linear", "lambda_max": 1.0, "t_start": 10}])
def test_a_schedule_is_given_whole(partial):
    """No hidden 5e6-step defaults: a partial schedule is an error, not t_start = 1e6."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="Field required|give t_start and t_end"):
        config(NAU_NMU, 50_000, regularizer=partial)


def test_a_constant_schedule_needs_no_end():
    cfg = config(NAU_NMU, 50_000, regularizer={"shape": "constant", "lambda_max": 1.0, "t_start": 10})
    assert float(cfg.regularizer().value(9)) == 0.0 and float(cfg.regularizer().value(10)) == 1.0


def test_lambda_max_zero_turns_the_regulariser_off_without_times():
    cfg = config(NAU_NMU, 50_000, regularizer={"lambda_max": 0})
    assert float(cfg.regularizer().value(40_000)) == 0.0


def test_result_json_records_the_effective_schedule():
    from service.training import Trainer

    cfg = RunConfig.model_validate({
        "task": {"kind": "small_mul"}, "model": NAU_NMU, "seeds": 2, "device": "cpu", "compile": "off",
        "train": {"steps": 20, "eval_every": 10, "batch_size": 8}})
    data = Trainer(cfg).run().to_dict()
    assert data["regularizer"] == {"shape": "linear", "lambda_max": 10.0, "t_start": 4, "t_end": 8, "oob": 0.0}
    assert data["config"]["train"]["regularizer"] is None


SHIPPED = sorted(SPACES.glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_spaces_state_their_schedule_and_trials_log_it(path):
    space = load_space(path)
    params = searched_values(space)
    for name, cfg in run_configs(space, params).items():
        assert cfg.train.regularizer is not None, f"{path.name}: task {name} relies on the default schedule"
    logged = regularizer_params(run_configs(space, params))
    tasks = space.task_configs()
    prefix = "regularizer." if len(tasks) == 1 else f"regularizer.{next(iter(tasks))}."
    first = next(iter(run_configs(space, params).values())).regularizer()
    assert logged[prefix + "lambda_max"] == first.lambda_max
    assert logged[prefix + "t_start"] == first.t_start and logged[prefix + "t_end"] == first.t_end
    assert logged[prefix + "source"] == "config"


def test_trial_params_of_a_default_schedule_are_the_scaled_reference():
    data = {"name": "x", "task": {"kind": "small_mul"}, "fixed": {"model": NAU_NMU},
            "params": {"lr": {"type": "loguniform", "low": 1e-3, "high": 1e-2, "target": "train.optimizer.lr"}},
            "seeds": 2, "steps": 30_000, "eval_every": 1000, "trials": 1}
    from service.search.loading import parse_space

    space = parse_space(data)
    logged = regularizer_params(run_configs(space, searched_values(space)))
    assert logged == {"regularizer.shape": "linear", "regularizer.lambda_max": 10.0, "regularizer.t_start": 6000,
                      "regularizer.t_end": 12000, "regularizer.oob": 0.0, "regularizer.source": "reference_scaled"}
