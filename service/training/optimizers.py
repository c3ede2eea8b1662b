"""Seed-batched optimisers with per-seed state.

Adam and RMSprop are elementwise, so torch's would already keep seeds apart; these own
versions add what torch's lack: a per-seed step count (bias correction restarts when one
seed is re-initialised) and `reset_seeds`, and they are plain tensor code that
torch.compile fuses into a few kernels.
"""

from __future__ import annotations

import functools
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
    Adam's bias corrections ``1 − β^t`` are looked up per seed in a table computed once on
    the host with Python floats, exactly as torch's Adam computes them each step (a
    vectorised ``pow`` over seeds and a scalar one can differ by an ulp, which would make a
    seed's update depend on its neighbours). The table ends where ``1 − β^t`` rounds to 1 in
    float64 (t ≈ 37,000 for β2 = 0.999), or at `BIAS_TABLE_MAX` entries; past it, per-seed
    running products ``β^t`` in float64 take over (also exact per seed). They are cast to
    the parameters' dtype only as ``lr / (1 − β1^t)`` and ``√(1 − β2^t)``.
    """

    def __init__(self, params: Sequence[Tensor], config: OptimizerConfig) -> None:
        self.params = list(params)
        self.config = config
        device = self.params[0].device
        num_seeds = self.params[0].shape[0]
        self.steps = torch.zeros(num_seeds, dtype=torch.int64, device=device)
        # Adam: [β1^t, β2^t] per seed (float64); 1 at t = 0
        self.powers = torch.ones(2, num_seeds, dtype=torch.float64, device=device)
        self._betas = torch.tensor(config.betas, dtype=torch.float64, device=device).view(2, 1)
        self._bias_table = bias_correction_table(tuple(config.betas)).to(device)  # [2, L] float64
        self.state: list[list[Tensor]] = [self._new_state(p) for p in self.params]

    def _new_state(self, p: Tensor) -> list[Tensor]:
        n = {"adam": 2, "rmsprop": 1, "sgd": 1}[self.config.name]
        return [torch.zeros_like(p) for _ in range(n)]

    def _per_seed(self, v: Tensor, like: Tensor) -> Tensor:
        return v.to(like.dtype).view(-1, *([1] * (like.dim() - 1)))

    @torch.no_grad()
    def step(self, grads: Sequence[Tensor], lr: Tensor | float | None = None) -> None:
        """One update from ``grads`` (same order as ``params``); ``lr`` overrides the
        configured rate (a learning-rate schedule)."""
        c = self.config
        lr = c.lr if lr is None else lr
        self.steps += 1
        if c.name == "adam":
            # per parameter, as torch.optim.Adam: m ← lerp(m, g, 1 − β1);
            # v ← β2 v + (1 − β2) g²; p ← p − (lr / bc1) m / (√v / √bc2 + ε), with per-seed
            # bias corrections bc1 = 1 − β1^t, bc2 = 1 − β2^t computed in float64.
            b1, b2 = c.betas
            self.powers.mul_(self._betas)
            last = self._bias_table.shape[1] - 1
            looked_up = self._bias_table[:, self.steps.clamp(max=last)]  # [2, S] float64
            bc = torch.where(self.steps <= last, looked_up, 1 - self.powers)
            lr64 = lr.to(torch.float64) if isinstance(lr, Tensor) else lr
            step_size = lr64 / bc[0]
            bc2_sqrt = bc[1].sqrt()
            ms = [st[0] for st in self.state]
            vs = [st[1] for st in self.state]
            grads = list(grads)
            torch._foreach_lerp_(ms, grads, 1 - b1)
            torch._foreach_mul_(vs, b2)
            torch._foreach_addcmul_(vs, grads, grads, value=1 - b2)
            denom = torch._foreach_sqrt(vs)
            torch._foreach_div_(denom, [self._per_seed(bc2_sqrt, p) for p in self.params])
            torch._foreach_add_(denom, c.eps)
            step = torch._foreach_mul(ms, [self._per_seed(step_size, p) for p in self.params])
            torch._foreach_div_(step, denom)
            torch._foreach_sub_(self.params, step)
        elif c.name == "rmsprop":
            for p, g, (v,) in zip(self.params, grads, self.state):
                v.mul_(c.alpha).addcmul_(g, g, value=1 - c.alpha)
                p.sub_(lr * g / v.sqrt().add_(c.eps))
        else:
            for p, g, (buf,) in zip(self.params, grads, self.state):
                buf.mul_(c.momentum).add_(g)
                p.sub_(lr * buf)

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
