"""Seed-batched optimisers with per-seed state.

Adam and RMSprop are elementwise, so torch's would already keep seeds apart; these own
versions add what torch's lack: a per-seed step count (bias correction restarts when one
seed is re-initialised) and `reset_seeds`, and they are plain tensor code that
torch.compile fuses into a few kernels.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from service.config import OptimizerConfig


class BatchedOptimizer:
    """Updates parameters ``[S, ...]`` in place from their ``.grad``."""

    def __init__(self, params: Sequence[Tensor], config: OptimizerConfig) -> None:
        self.params = list(params)
        self.config = config
        device = self.params[0].device
        num_seeds = self.params[0].shape[0]
        self.steps = torch.zeros(num_seeds, device=device)
        self.state: list[list[Tensor]] = [self._new_state(p) for p in self.params]

    def _new_state(self, p: Tensor) -> list[Tensor]:
        n = {"adam": 2, "rmsprop": 1, "sgd": 1}[self.config.name]
        return [torch.zeros_like(p) for _ in range(n)]

    def _per_seed(self, v: Tensor, like: Tensor) -> Tensor:
        return v.view(-1, *([1] * (like.dim() - 1)))

    @torch.no_grad()
    def step(self, grads: Sequence[Tensor], lr: Tensor | float | None = None) -> None:
        """One update from ``grads`` (same order as ``params``); ``lr`` overrides the
        configured rate (a learning-rate schedule)."""
        c = self.config
        lr = c.lr if lr is None else lr
        self.steps += 1
        if c.name == "adam":
            # per parameter: m ← lerp(m, g, 1 − β1); v ← β2 v + (1 − β2) g²;
            # p ← p − lr m / ((√(v / bc2) + ε) bc1), with per-seed bias corrections bc1, bc2.
            # The _foreach_ forms do exactly these operations, one call for all parameters.
            b1, b2 = c.betas
            bc1 = 1 - b1 ** self.steps
            bc2 = 1 - b2 ** self.steps
            ms = [st[0] for st in self.state]
            vs = [st[1] for st in self.state]
            grads = list(grads)
            torch._foreach_lerp_(ms, grads, 1 - b1)
            torch._foreach_mul_(vs, b2)
            torch._foreach_addcmul_(vs, grads, grads, value=1 - b2)
            denom = torch._foreach_div(vs, [self._per_seed(bc2, p) for p in self.params])
            torch._foreach_sqrt_(denom)
            torch._foreach_add_(denom, c.eps)
            torch._foreach_mul_(denom, [self._per_seed(bc1, p) for p in self.params])
            step = torch._foreach_mul(ms, lr)
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
        keep = (~mask).to(self.steps.dtype)
        self.steps.mul_(keep)
        for p, states in zip(self.params, self.state):
            for s in states:
                s.mul_(self._per_seed(keep, p))

    def state_dict(self) -> dict:
        return {"steps": self.steps.clone(), "state": [[s.clone() for s in st] for st in self.state]}

    def load_state_dict(self, state: dict) -> None:
        self.steps.copy_(state["steps"])
        for dst, src in zip(self.state, state["state"]):
            for d, s in zip(dst, src):
                d.copy_(s)
