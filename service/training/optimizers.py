"""Seed-batched optimisers with per-seed state.

Adam and RMSprop are elementwise, so torch's would already keep seeds apart; these own
versions add what torch's lack: a per-seed step count (bias correction restarts when one
seed is re-initialised) and `reset_seeds`, and they are plain tensor code that
torch.compile fuses into a few kernels.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import torch
from torch import Tensor

from service.config import OptimizerConfig


BIAS_TABLE_MAX = 1 << 18
"""Most entries of an Adam bias-correction table (2 MiB per β in float64)."""


@functools.lru_cache(maxsize=16)
def bias_correction_table(betas: tuple[float, float]) -> Tensor:
    """``[2, L]`` float64: ``1 − β**t`` for t = 0 … L − 1 as Python computes it (the value
    torch.optim.Adam uses), up to the first t where both round to 1 (or `BIAS_TABLE_MAX`)."""
    rows: list[list[float]] = [[], []]
    t = 0
    while t < BIAS_TABLE_MAX:
        values = [1 - b ** t for b in betas]
        for row, v in zip(rows, values):
            row.append(v)
        if t > 0 and all(v == 1.0 for v in values):
            break
        t += 1
    return torch.tensor(rows, dtype=torch.float64)


class BatchedOptimizer:
    """Updates parameters ``[S, ...]`` in place from their ``.grad``.

    Every operation is elementwise or per seed, and none depends on how many seeds share
    the tensors: a seed's update is bit-identical alone and among any number of others.
    The continuous settings (lr, lr_min, betas, eps, momentum, alpha) are per-seed rows
    (``per_seed``: one `OptimizerConfig` per seed, all of ``config``'s kind and schedule),
    so seeds of several configurations can train as one pack
    (`service.training.seed_settings`); each row holds the value a scalar operand of the
    parameters' dtype would have.

    Adam's bias corrections ``1 − β^t`` are looked up per seed in a table computed once on
    the host with Python floats, exactly as torch's Adam computes them each step (a
    vectorised ``pow`` over seeds and a scalar one can differ by an ulp, which would make a
    seed's update depend on its neighbours). A table ends where ``1 − β^t`` rounds to 1 in
    float64 (t ≈ 37,000 for β2 = 0.999), or at `BIAS_TABLE_MAX` entries; past its own end a
    seed uses per-seed running products ``β^t`` in float64 (also exact per seed). They are
    cast to the parameters' dtype only as ``lr / (1 − β1^t)`` and ``√(1 − β2^t)``.
    """

    def __init__(self, params: Sequence[Tensor], config: OptimizerConfig,
                 per_seed: Sequence[OptimizerConfig] | None = None) -> None:
        self.params = list(params)
        self.config = config
        device = self.params[0].device
        num_seeds = self.params[0].shape[0]
        rows = list(per_seed) if per_seed is not None else [config] * num_seeds
        if len(rows) != num_seeds:
            raise ValueError(f"{len(rows)} per-seed optimiser settings for {num_seeds} seeds")
        dtype = self.params[0].dtype

        def row(value, dt=dtype) -> Tensor:  # [S]: each Python float rounded once to dt
            return torch.tensor([value(c) for c in rows], dtype=torch.float64).to(device, dt)

        self.steps = torch.zeros(num_seeds, dtype=torch.int64, device=device)
        # Adam: [β1^t, β2^t] per seed (float64); 1 at t = 0
        self.powers = torch.ones(2, num_seeds, dtype=torch.float64, device=device)
        self._betas = torch.stack([row(lambda c: c.betas[0], torch.float64),
                                   row(lambda c: c.betas[1], torch.float64)])  # [2, S]
        self.lr64 = row(lambda c: c.lr, torch.float64)
        self.lr = row(lambda c: c.lr)
        self.lr_min = row(lambda c: c.lr_min)
        self._half_range = row(lambda c: 0.5 * (c.lr - c.lr_min))  # cosine schedule
        self._ratio = row(lambda c: c.lr_min / c.lr)  # exponential schedule
        self._one_minus_b1 = row(lambda c: 1 - c.betas[0])
        self._b2 = row(lambda c: c.betas[1])
        self._one_minus_b2 = row(lambda c: 1 - c.betas[1])
        self._eps = row(lambda c: c.eps)
        self._alpha = row(lambda c: c.alpha)
        self._one_minus_alpha = row(lambda c: 1 - c.alpha)
        self._momentum = row(lambda c: c.momentum)
        # one bias-correction table per distinct (β1, β2); each seed reads its own
        groups = sorted({tuple(c.betas) for c in rows})
        tables = [bias_correction_table(g) for g in groups]
        width = max(t.shape[1] for t in tables)
        padded = torch.ones(len(tables), 2, width, dtype=torch.float64)
        for i, t in enumerate(tables):
            padded[i, :, :t.shape[1]] = t
        self._bias_table = padded.to(device)  # [G, 2, L] float64
        group_of = {g: i for i, g in enumerate(groups)}
        self._group = torch.tensor([group_of[tuple(c.betas)] for c in rows], dtype=torch.int64, device=device)
        self._last = torch.tensor([tables[group_of[tuple(c.betas)]].shape[1] - 1 for c in rows],
                                  dtype=torch.int64, device=device)
        self.state: list[list[Tensor]] = [self._new_state(p) for p in self.params]
        # the constant rows viewed against each parameter once, not every step
        self._adam_rows = [self._rows(self.params, v)
                           for v in (self._one_minus_b1, self._b2, self._one_minus_b2, self._eps)]

    def _new_state(self, p: Tensor) -> list[Tensor]:
        n = {"adam": 2, "rmsprop": 1, "sgd": 1}[self.config.name]
        return [torch.zeros_like(p) for _ in range(n)]

    def _per_seed(self, v: Tensor, like: Tensor) -> Tensor:
        return v.to(like.dtype).view(-1, *([1] * (like.dim() - 1)))

    def lr_at(self, step: Tensor, total_steps: int) -> Tensor | None:
        """Each seed's learning rate at ``step`` under the shared schedule ``[S]`` (the
        parameters' dtype), or None for a constant rate (`step` then uses its rows)."""
        schedule = self.config.lr_schedule
        if schedule == "constant":
            return None
        p = (step.to(self.lr.dtype) / max(1, total_steps)).clamp(0.0, 1.0)
        if schedule == "cosine":
            return self.lr_min + self._half_range * (1 + torch.cos(math.pi * p))
        return self.lr * self._ratio ** p

    @torch.no_grad()
    def step(self, grads: Sequence[Tensor], lr: Tensor | float | None = None) -> None:
        """One update from ``grads`` (same order as ``params``); ``lr`` overrides the
        configured rates (a scalar, or ``[S]`` from `lr_at`)."""
        c = self.config
        self.steps += 1
        grads = list(grads)
        if c.name == "adam":
            # per parameter, torch.optim.Adam's update: m ← m + (1 − β1)(g − m) (its lerp,
            # unfused: eager torch fuses lerp's multiply and add, compiled code does not);
            # v ← β2 v + ((1 − β2) g) g; p ← p − (lr / bc1) m / (√v / √bc2 + ε), with per-seed
            # bias corrections bc1 = 1 − β1^t, bc2 = 1 − β2^t computed in float64. Every
            # operation one correctly rounded IEEE operation, so the eager step and the native
            # CPU step (`service.training.cpu_step`) give the same bits.
            self.powers.mul_(self._betas)
            index = torch.minimum(self.steps, self._last)
            looked_up = self._bias_table[self._group, :, index].T  # [2, S] float64
            bc = torch.where(self.steps <= self._last, looked_up, 1 - self.powers)
            if lr is None:
                lr64 = self.lr64
            else:
                lr64 = lr.to(torch.float64) if isinstance(lr, Tensor) else lr
            step_size = lr64 / bc[0]
            bc2_sqrt = bc[1].sqrt()
            ms = [st[0] for st in self.state]
            vs = [st[1] for st in self.state]
            per = functools.partial(self._rows, self.params)
            one_minus_b1, b2, one_minus_b2, eps = self._adam_rows
            delta = torch._foreach_sub(grads, ms)
            torch._foreach_mul_(delta, one_minus_b1)
            torch._foreach_add_(ms, delta)
            torch._foreach_mul_(vs, b2)
            sq = torch._foreach_mul(grads, one_minus_b2)
            torch._foreach_mul_(sq, grads)
            torch._foreach_add_(vs, sq)
            # √v in float64, rounded once: torch's float32 sqrt on a CPU is MKL's, which is
            # not always the correctly rounded root (one in five on AMD's Zen 4)
            roots = torch._foreach_sqrt([v.to(torch.float64) for v in vs])
            denom = [r.to(v.dtype) for r, v in zip(roots, vs)]
            torch._foreach_div_(denom, per(bc2_sqrt))
            torch._foreach_add_(denom, eps)
            step = torch._foreach_mul(ms, per(step_size))
            torch._foreach_div_(step, denom)
            torch._foreach_sub_(self.params, step)
            return
        rate = self.lr if lr is None else lr
        for p, g, (buf,) in zip(self.params, grads, self.state):
            r = self._per_seed(rate, p) if isinstance(rate, Tensor) and rate.dim() else rate
            if c.name == "rmsprop":
                buf.mul_(self._per_seed(self._alpha, p)).addcmul_(g * self._per_seed(self._one_minus_alpha, p), g)
                p.sub_(r * g / buf.sqrt().add_(self._per_seed(self._eps, p)))
            else:
                buf.mul_(self._per_seed(self._momentum, p)).add_(g)
                p.sub_(r * buf)

    def _rows(self, like: Sequence[Tensor], v: Tensor) -> list[Tensor]:
        """``v [S]`` viewed against each tensor of ``like`` (cast to its dtype)."""
        return [self._per_seed(v, t) for t in like]

    @torch.no_grad()
    def reset_seeds(self, mask: Tensor) -> None:
        """Forget the state of the seeds where ``mask [S]`` is true (after re-initialising)."""
        self.steps.masked_fill_(mask, 0)
        self.powers.masked_fill_(mask.view(1, -1), 1.0)
        for p, states in zip(self.params, self.state):
            for s in states:
                s.masked_fill_(mask.view(-1, *([1] * (p.dim() - 1))), 0.0)

    def state_dict(self) -> dict:
        return {"steps": self.steps.clone(), "powers": self.powers.clone(),
                "state": [[s.clone() for s in st] for st in self.state]}

    def load_state_dict(self, state: dict) -> None:
        self.steps.copy_(state["steps"])
        self.powers.copy_(state["powers"])
        for dst, src in zip(self.state, state["state"]):
            for d, s in zip(dst, src):
                d.copy_(s)
