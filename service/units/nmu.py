"""Neural Multiplication Unit (Madsen & Johansen, ICLR 2020).

``z_o = Π_i (W_oi x_i + 1 − W_oi)``: W_oi = 1 selects x_i into the product, W_oi = 0
replaces it by 1. W is kept in [0, 1] by clamping in place after every optimiser step;
``R = mean(min(W, 1 − W))``; reference init ``W ~ U[0.25, 0.75]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from service.units.base import ExactMode, ForwardContext, Unit
from service.units.registry import register

NMU_INIT_LOW, NMU_INIT_HIGH = 0.25, 0.75


def nmu_forward(x: Tensor, w: Tensor) -> Tensor:
    """``x [S, B, in]``, ``w [S, out, in]`` -> ``Π_i (w x_i + 1 − w)`` ``[S, B, out]``.

    Builds ``[S, B, out, in]`` and reduces over ``in`` (cheap for the usual 2-input NMU).
    """
    return (w.unsqueeze(1) * (x.unsqueeze(2) - 1) + 1).prod(-1)


def nmu_regularizer(w: Tensor) -> Tensor:
    """``mean(min(W, 1 − W))`` per seed."""
    return torch.minimum(w, 1 - w).flatten(1).mean(1)


def nmu_oob_penalty(w: Tensor) -> Tensor:
    """``mean(relu(−W) + relu(W − 1))``: how far weights lie outside [0, 1], per seed."""
    return (torch.relu(-w) + torch.relu(w - 1)).flatten(1).mean(1)


def nmu_init_(w: Tensor, generator: torch.Generator) -> Tensor:
    return w.uniform_(NMU_INIT_LOW, NMU_INIT_HIGH, generator=generator)


def check_selection_weights(weights: Tensor) -> None:
    """An NMU computes ``Π x_i^{W_i}`` exactly only for W ∈ {0, 1}."""
    if not bool(((weights == 0) | (weights == 1)).all()):
        raise ValueError("an NMU represents prod_i x_i ** W_i exactly only for W in {0, 1}")


@register
class NMU(Unit):
    """``nmu``: z_o = Π_i (W_oi x_i + 1 − W_oi), W ∈ [0, 1]. Exact for ``mul``, W ∈ {0, 1}."""

    name = "nmu"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.weight = self.seed_parameter(self.out_features, self.in_features)

    def init_seed_(self, k: int, generator: torch.Generator) -> None:
        self.fill_weight_(self.weight.data[k], generator, nmu_init_)

    def forward(self, x: Tensor, ctx: ForwardContext | None = None) -> Tensor:
        return nmu_forward(x, self.weight)

    def regularizer(self) -> Tensor:
        return nmu_regularizer(self.weight)

    def oob_penalty(self) -> Tensor:
        return nmu_oob_penalty(self.weight)

    def clamp_(self) -> None:
        with torch.no_grad():
            self.weight.clamp_(0.0, 1.0)

    def weight_matrices(self) -> dict[str, Tensor]:
        return {"weight": self.weight}

    def load_exact_(self, weights: Tensor, mode: ExactMode) -> None:
        if mode != "mul":
            super().load_exact_(weights, mode)
        check_selection_weights(weights)
        with torch.no_grad():
            self.weight.copy_(weights.to(self.weight).expand_as(self.weight))
