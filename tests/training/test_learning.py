"""End-to-end learning tests that can fail: the units must actually learn, to the SPEC's
success threshold (the ε = 1e-5-perturbed exact model), on every seed's own data.

A large learning rate finds the structure fast; the cosine decay then lets the zero
weights settle (under constant Adam steps they keep oscillating by about lr/10, far above
what the threshold tolerates)."""

from __future__ import annotations

import pytest

from service.config import RunConfig
from service.training import train


@pytest.mark.slow
def test_nau_learns_addition_on_the_arithmetic_task():
    cfg = RunConfig.model_validate({
        "task": {"kind": "arithmetic", "operation": "add", "eval_samples": 2000},
        "model": {"layers": [{"unit": "nau"}, {"unit": "nau"}]},
        "train": {"steps": 6000, "eval_every": 500,
                  "optimizer": {"lr": 0.3, "lr_schedule": "cosine"},
                  "regularizer": {"lambda_max": 1.0, "t_start": 1000, "t_end": 4000}},
        "seeds": 16, "device": "cpu",
    })
    result = train(cfg)
    # "most of 16": 48 of seeds 0-63 succeed under these settings (Philox initial weights),
    # 9 of seeds 0-15; the bound leaves room for a numerics change to move a seed or two
    # without hiding a unit that stopped learning
    assert result.aggregate.successes >= 8, result.aggregate
    assert result.aggregate.diverged == 0


@pytest.mark.slow
def test_nmu_learns_the_small_multiplication_problem():
    cfg = RunConfig.model_validate({
        "task": {"kind": "small_mul", "eval_samples": 2000},
        "model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]},
        "train": {"steps": 8000, "eval_every": 500,
                  "optimizer": {"lr": 0.01, "lr_schedule": "cosine"},
                  "regularizer": {"lambda_max": 1.0, "t_start": 1000, "t_end": 3000}},
        "seeds": 16, "device": "cpu",
    })
    result = train(cfg)
    assert result.aggregate.successes >= 10, result.aggregate
    # a success is a real extrapolating solution: near-zero sparsity error on those seeds
    solved = [s for s in result.seeds if s.success]
    assert all(s.sparsity_error < 1e-2 for s in solved)
