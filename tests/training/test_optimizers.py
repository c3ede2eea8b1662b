"""Batched optimisers match torch's for every seed, and keep per-seed state."""

from __future__ import annotations

import pytest
import torch

from service.config import OptimizerConfig
from service.training.optimizers import BatchedOptimizer


def _torch_optimizer(name: str, params, cfg: OptimizerConfig):
    if name == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=cfg.lr, alpha=cfg.alpha, eps=cfg.eps)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)


@pytest.mark.parametrize("name", ["adam", "rmsprop", "sgd"])
def test_each_seed_follows_torchs_optimizer(name):
    cfg = OptimizerConfig(name=name, lr=0.05)
    g = torch.Generator().manual_seed(0)
    start = torch.randn(3, 2, 4, generator=g)
    grads = [torch.randn(3, 2, 4, generator=g) for _ in range(10)]
    batched = start.clone()
    opt = BatchedOptimizer([batched], cfg)
    for gr in grads:
        opt.step([gr])
    for k in range(3):
        p = torch.nn.Parameter(start[k].clone())
        ref = _torch_optimizer(name, [p], cfg)
        for gr in grads:
            p.grad = gr[k].clone()
            ref.step()
        torch.testing.assert_close(batched[k], p.detach(), rtol=1e-4, atol=1e-5)


def test_reset_seeds_restarts_only_those_seeds():
    cfg = OptimizerConfig(name="adam", lr=0.1)
    p = torch.zeros(2, 1, 1)
    opt = BatchedOptimizer([p], cfg)
    for _ in range(5):
        opt.step([torch.ones(2, 1, 1)])
    opt.reset_seeds(torch.tensor([True, False]))
    assert opt.steps.tolist() == [0.0, 5.0]
    assert float(opt.state[0][0][0]) == 0.0 and float(opt.state[0][0][1]) != 0.0
    before = p.clone()
    opt.step([torch.ones(2, 1, 1)])
    # a fresh Adam's first step moves by exactly lr (bias-corrected m / sqrt(v) = 1)
    assert float(before[0] - p[0]) == pytest.approx(0.1, rel=1e-4)


@pytest.mark.parametrize("schedule", ["cosine", "exponential"])
def test_learning_rate_schedules_decay_from_lr_to_lr_min(schedule):
    cfg = OptimizerConfig(lr=0.1, lr_schedule=schedule, lr_min=1e-4)
    assert float(cfg.lr_at(torch.tensor(0.0), 100)) == pytest.approx(0.1)
    mid = float(cfg.lr_at(torch.tensor(50.0), 100))
    assert 1e-4 < mid < 0.1
    assert float(cfg.lr_at(torch.tensor(100.0), 100)) == pytest.approx(1e-4, rel=1e-3)
    assert OptimizerConfig(lr=0.1).lr_at(torch.tensor(50.0), 100) == 0.1
