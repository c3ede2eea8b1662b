"""Batched optimisers match torch's for every seed, and keep per-seed state."""

from __future__ import annotations

import math

import numpy as np
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


def _run_both(name: str, dtype: torch.dtype, steps: int, num_seeds: int = 3):
    """(batched result [S, 2, 4], torch's result per seed [S, 2, 4]) after ``steps`` steps."""
    cfg = OptimizerConfig(name=name, lr=0.05)
    g = torch.Generator().manual_seed(0)
    start = torch.randn(num_seeds, 2, 4, generator=g, dtype=dtype)
    grads = [torch.randn(num_seeds, 2, 4, generator=g, dtype=dtype) for _ in range(steps)]
    batched = start.clone()
    opt = BatchedOptimizer([batched], cfg)
    for gr in grads:
        opt.step([gr])
    refs = []
    for k in range(num_seeds):
        p = torch.nn.Parameter(start[k].clone())
        ref = _torch_optimizer(name, [p], cfg)
        for gr in grads:
            p.grad = gr[k].clone()
            ref.step()
        refs.append(p.detach())
    return batched, torch.stack(refs)


@pytest.mark.parametrize("name", ["adam", "rmsprop", "sgd"])
def test_each_seed_follows_torchs_optimizer(name):
    """In float64 every seed follows torch's optimiser to rounding (Adam's bias correction
    is float64 like torch's Python floats; the running products β^t differ from ``β ** t``
    by a few ulps), over 300 steps."""
    batched, ref = _run_both(name, torch.float64, 300)
    torch.testing.assert_close(batched, ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("steps", [1, 300])
def test_adam_float32_is_torchs_update_correctly_rounded(steps):
    """Float32 Adam is torch.optim.Adam's update with every operation one correctly rounded
    IEEE operation (numpy's float32 arithmetic, each step written out): ``m + (1 − β1)(g − m)``
    for torch's lerp, ``√v`` rounded once (torch's float32 sqrt on a CPU is MKL's, not always
    the correctly rounded root, and its lerp fuses a multiply and an add), the bias
    corrections float64, cast as ``lr / bc1`` and ``√bc2``: no 6.5e-6 (relative) shortfall
    at step 1 from a float32 ``1 − β^t``. So torch's own Adam agrees to an ulp or two a step."""
    batched, ref = _run_both("adam", torch.float32, steps)
    cfg = OptimizerConfig(name="adam", lr=0.05)
    g = torch.Generator().manual_seed(0)
    p = torch.randn(3, 2, 4, generator=g).numpy()
    grads = [torch.randn(3, 2, 4, generator=g).numpy() for _ in range(steps)]
    f = np.float32
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t, gr in enumerate(grads, 1):
        m = m + (gr - m) * f(1 - cfg.betas[0])
        v = v * f(cfg.betas[1]) + (gr * f(1 - cfg.betas[1])) * gr
        bc1, bc2 = 1 - cfg.betas[0] ** t, 1 - cfg.betas[1] ** t
        denom = np.sqrt(v.astype(np.float64)).astype(np.float32) / f(math.sqrt(bc2)) + f(cfg.eps)
        p = p - (m * f(cfg.lr / bc1)) / denom
    assert np.array_equal(batched.numpy(), p)
    torch.testing.assert_close(batched, ref, rtol=2e-6 * steps, atol=1e-7 * steps)


@pytest.mark.parametrize("name", ["adam", "rmsprop", "sgd"])
@pytest.mark.parametrize("shape", [(1, 3), (2, 100), (5, 7)])
def test_seed_update_does_not_depend_on_the_number_of_seeds(name, shape):
    """A seed's parameters and state after 20 steps are bit-identical alone and among
    S = 32, 100 and 1000 seeds (vectorised and scalar loops, tails at other positions),
    with gradients of very different scales and a learning-rate tensor."""
    cfg = OptimizerConfig(name=name, lr=0.05)
    for num_seeds in (32, 100, 1000):
        g = torch.Generator().manual_seed(num_seeds)
        start = torch.randn(num_seeds, *shape, generator=g)
        scales = 10.0 ** torch.randint(-4, 4, (num_seeds, 1, 1), generator=g)
        grads = [torch.randn(num_seeds, *shape, generator=g) * scales for _ in range(20)]
        together = start.clone()
        opt = BatchedOptimizer([together], cfg)
        for gr in grads:
            opt.step([gr], torch.tensor(0.01))
        for k in (0, 5, num_seeds - 1):
            alone = start[k:k + 1].clone()
            one = BatchedOptimizer([alone], cfg)
            for gr in grads:
                one.step([gr[k:k + 1]], torch.tensor(0.01))
            assert torch.equal(together[k:k + 1], alone)
            for a, b in zip(opt.state[0], one.state[0]):
                assert torch.equal(a[k:k + 1], b)
            assert torch.equal(opt.powers[:, k:k + 1], one.powers)


def test_reset_seeds_restarts_only_those_seeds():
    cfg = OptimizerConfig(name="adam", lr=0.1)
    p = torch.zeros(2, 1, 1)
    opt = BatchedOptimizer([p], cfg)
    for _ in range(5):
        opt.step([torch.ones(2, 1, 1)])
    opt.reset_seeds(torch.tensor([True, False]))
    assert opt.steps.tolist() == [0, 5]
    assert opt.powers[:, 0].tolist() == [1.0, 1.0] and opt.powers[0, 1] == math.prod([0.9] * 5)
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
