"""Neural Addition Unit (Madsen & Johansen, ICLR 2020).

``z = W x`` with W kept in [−1, 1] by clamping in place after every optimiser step (the
reference behaviour; the forward sees the clamped W). Sparsity regulariser
``R = mean(min(|W|, |1 − |W||))`` (the reference form: its gradient is 0 at |W| = 1, so it
does not push a weight on its bound outward); reference init ``W ~ U[−r, r]``,
``r = min(0.5, √3 · √(2 / (fan_in + fan_out)))``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from service.seeding.init_stream import InitStream
from service.units.base import ExactMode, ForwardContext, Unit, mean_distance_to_bounds
from service.units.linear import linear_forward
from service.units.registry import register


def nau_init_range(fan_in: int, fan_out: int) -> float:
    """``min(0.5, √3 · √(2 / (fan_in + fan_out)))`` (the NAU reference init bound)."""
    return min(0.5, math.sqrt(3.0) * math.sqrt(2.0 / (fan_in + fan_out)))


def nau_regularizer(w: Tensor) -> Tensor:
    """``mean(min(|W|, |1 − |W||))`` per seed (gradient 0 at |W| = 1)."""
    return mean_distance_to_bounds(w.abs())


def nau_oob_penalty(w: Tensor) -> Tensor:
    """``mean(relu(|W| − 1))``: how far weights lie outside [−1, 1], per seed."""
    return torch.relu(w.abs() - 1).flatten(1).mean(1)


@register
class NAU(Unit):
    """``nau``: z = W x, W ∈ [−1, 1]. Exact for ``add`` with W ∈ [−1, 1]."""

    name = "nau"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.weight = self.seed_parameter(self.out_features, self.in_features)

    def init_seed_(self, k: int, generator: InitStream) -> None:
        r = nau_init_range(self.in_features, self.out_features)
        self.fill_weight_(
            self.weight.data[k], generator, lambda w, g: g.uniform_(w, -r, r)
        )

    def forward(self, x: Tensor, ctx: ForwardContext | None = None) -> Tensor:
        return linear_forward(x, self.weight)

    def input_product_weight(self) -> Tensor:
        return self.weight

    def regularizer(self) -> Tensor:
        return nau_regularizer(self.weight)

    def oob_penalty(self) -> Tensor:
        return nau_oob_penalty(self.weight)

    def clamp_(self) -> None:
        with torch.no_grad():
            self.weight.clamp_(-1.0, 1.0)

    def weight_matrices(self) -> dict[str, Tensor]:
        return {"weight": self.weight}

    def load_exact_(self, weights: Tensor, mode: ExactMode) -> None:
        if mode != "add":
            super().load_exact_(weights, mode)
        if weights.abs().max() > 1:
            raise ValueError("NAU weights must lie in [-1, 1]")
        with torch.no_grad():
            self.weight.copy_(weights.to(self.weight).expand_as(self.weight))
