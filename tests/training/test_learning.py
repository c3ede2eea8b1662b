"""End-to-end learning tests that can fail: the units must actually learn."""

from __future__ import annotations

import pytest

from service.config import RunConfig
from service.training import train


@pytest.mark.slow
def test_nau_learns_addition_on_the_arithmetic_task():
    cfg = RunConfig.model_validate({
        "task": {"kind": "arithmetic", "operation": "add", "eval_samples": 1000},
        "model": {"layers": [{"unit": "nau"}, {"unit": "nau"}]},
        "train": {"steps": 3000, "eval_every": 500, "optimizer": {"lr": 1e-2},
                  "regularizer": {"lambda_max": 0.01, "t_start": 500, "t_end": 2000}},
        "seeds": 16, "device": "cpu",
    })
    result = train(cfg)
    assert result.aggregate.successes >= 12, result.aggregate


@pytest.mark.slow
def test_nmu_learns_the_small_multiplication_problem():
    cfg = RunConfig.model_validate({
        "task": {"kind": "small_mul", "eval_samples": 1000},
        "model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]},
        "train": {"steps": 5000, "eval_every": 500, "optimizer": {"lr": 1e-2},
                  "regularizer": {"lambda_max": 1.0, "t_start": 1000, "t_end": 4000}},
        "seeds": 16, "device": "cpu",
    })
    result = train(cfg)
    assert result.aggregate.successes >= 11, result.aggregate
