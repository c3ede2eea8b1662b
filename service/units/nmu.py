"""Neural Multiplication Unit (Madsen & Johansen, ICLR 2020).

``z_o = Π_i (W_oi x_i + 1 − W_oi)``: W_oi = 1 selects x_i into the product, W_oi = 0
replaces it by 1. W is kept in [0, 1] by clamping in place after every optimiser step;
``R = mean(min(|W|, |1 − W|))`` (the reference form: its gradient is 0 at W = 0 and W = 1, so
it does not push a weight on its bound outward); reference init ``W ~ U[0.25, 0.75]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from service.native.ordered import tree_prod
from service.seeding.init_stream import InitStream
from service.units import kernels
from service.units.base import ExactMode, ForwardContext, Unit, mean_distance_to_bounds
from service.units.registry import register

NMU_INIT_LOW, NMU_INIT_HIGH = 0.25, 0.75


def nmu_forward(x: Tensor, w: Tensor) -> Tensor:
    """``x [S, B, in]``, ``w [S, out, in]`` -> ``Π_i (w x_i + 1 − w)`` ``[S, B, out]``.

    Builds the factors ``[S, B, out, in]`` and multiplies them over ``in``. With two inputs
    (the papers' hidden size) the product is one multiplication and its gradient is the
    other factor (`_Product2`; eager on CPU a native kernel, `kernels.nmu2`), instead of
    ``prod``'s generic backward (cumulative products): the same numbers forward, a cheaper
    backward.
    """
    if w.shape[-1] == 2 and x.shape[-1] == 2:
        if kernels.nmu2_usable(x, w):
            return kernels.nmu2(x, w)
        return _Product2.apply(x, w)
    factors = kernels.per_row(w, x.shape[1]) * (x.unsqueeze(2) - 1) + 1
    # on a GPU the product in an order fixed by ``in`` alone (`tree_prod`)
    return tree_prod(factors) if factors.is_cuda else factors.prod(-1)


class _Product2(torch.autograd.Function):
    """NMU with two inputs: ``z = f_0 f_1``, ``f_i = w_i (x_i − 1) + 1``, all ``[S, B, out]``."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor) -> Tensor:
        xm1 = x - 1  # [S, B, 2]
        a, b = xm1[..., 0:1], xm1[..., 1:2]  # [S, B, 1]
        wa, wb = w[..., 0].unsqueeze(1), w[..., 1].unsqueeze(1)  # [S, 1, out]
        fa, fb = wa * a + 1, wb * b + 1  # [S, B, out]
        ctx.save_for_backward(xm1, w, fa, fb)
        return fa * fb

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, Tensor | None]:
        xm1, w, fa, fb = ctx.saved_tensors
        ga, gb = g * fb, g * fa  # dz/df_a = f_b, dz/df_b = f_a
        gx = gw = None
        if ctx.needs_input_grad[0]:
            gx = torch.cat([(ga * w[..., 0].unsqueeze(1)).sum(2, keepdim=True),
                            (gb * w[..., 1].unsqueeze(1)).sum(2, keepdim=True)], -1)
        if ctx.needs_input_grad[1]:
            # summed over the rows; on a GPU in an order fixed by the rows alone (`row_sum`)
            rows = kernels.row_sum if g.is_cuda else (lambda t: t.sum(1))
            gw = torch.stack([rows(ga * xm1[..., 0:1]), rows(gb * xm1[..., 1:2])], -1)
        return gx, gw


def nmu_regularizer(w: Tensor) -> Tensor:
    """``mean(min(|W|, |1 − W|))`` per seed (gradient 0 at W = 0 and W = 1)."""
    return mean_distance_to_bounds(w)


def nmu_oob_penalty(w: Tensor) -> Tensor:
    """``mean(relu(−W) + relu(W − 1))``: how far weights lie outside [0, 1], per seed."""
    return (torch.relu(-w) + torch.relu(w - 1)).flatten(1).mean(1)


def nmu_init_(w: Tensor, generator: InitStream) -> Tensor:
    return generator.uniform_(w, NMU_INIT_LOW, NMU_INIT_HIGH)


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

    def init_seed_(self, k: int, generator: InitStream) -> None:
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
