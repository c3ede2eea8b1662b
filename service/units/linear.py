"""Plain linear layers: the unconstrained baseline and the regularised linear layer.

``linear``      z = W x, W free (Xavier-uniform init, as the reference code's linear layer).
``reg_linear``  z = W x, W free, with the sparsity regulariser R = mean(W² (1 − |W|)²),
                which is zero exactly at W ∈ {−1, 0, 1} (Madsen & Johansen 2019).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from service.seeding.init_stream import InitStream
from service.units import kernels
from service.units.base import ExactMode, ForwardContext, Unit
from service.units.registry import register


def xavier_uniform_(w: Tensor, generator: InitStream) -> Tensor:
    """U[−b, b] with b = √(6 / (fan_in + fan_out)) on one ``[out, in]`` slice."""
    bound = math.sqrt(6.0 / (w.shape[0] + w.shape[-1]))
    return generator.uniform_(w, -bound, bound)


def linear_forward(x: Tensor, w: Tensor) -> Tensor:
    """``x [S, B, in] @ w [S, out, in]ᵀ -> [S, B, out]``.

    On CPU with few outputs (the usual 1 or 2) a native kernel (`service.units.kernels`)
    computes it and its weight gradient ~2× faster than ``bmm``; otherwise it is computed
    as ``(w @ xᵀ)ᵀ`` so that autograd's weight gradient is ``gᵀ @ x`` in W's own layout
    (with a narrow ``out`` that is ~3× faster on CPU than ``xᵀ @ g``).

    In float64 (``RunConfig.dtype``, for differential tests) it is ``x @ wᵀ``, the operand
    order of ``torch.nn.functional.linear``, so a one-seed model adds the products of each
    dot product in the same order as a plain PyTorch model does: ``(w @ xᵀ)ᵀ`` can differ in
    the last bit, which NAC• (through its ``exp``) amplifies into trajectories parting
    within ~150 steps at lr 1e-2.
    """
    if x.dtype == torch.float64:
        return torch.matmul(x, w.transpose(-1, -2))
    return kernels.linear(x, w)


class _LinearBase(Unit):
    """One free matrix W ``[S, out, in]``; ``z = W x``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.weight = self.seed_parameter(self.out_features, self.in_features)

    def init_seed_(self, k: int, generator: InitStream) -> None:
        self.fill_weight_(self.weight.data[k], generator, xavier_uniform_)

    def forward(self, x: Tensor, ctx: ForwardContext | None = None) -> Tensor:
        return linear_forward(x, self.weight)

    def input_product_weight(self) -> Tensor:
        return self.weight

    def weight_matrices(self) -> dict[str, Tensor]:
        return {"weight": self.weight}

    def load_exact_(self, weights: Tensor, mode: ExactMode) -> None:
        if mode != "add":
            super().load_exact_(weights, mode)
        with torch.no_grad():
            self.weight.copy_(weights.to(self.weight).expand_as(self.weight))


@register
class Linear(_LinearBase):
    """``linear``: z = W x with W unconstrained; the baseline. Exact for ``add`` only."""

    name = "linear"


@register
class RegLinear(_LinearBase):
    """``reg_linear``: z = W x, W free, R = mean(W² (1 − |W|)²). Exact for ``add`` only."""

    name = "reg_linear"

    def regularizer(self) -> Tensor:
        w = self.weight
        return (w.square() * (1 - w.abs()).square()).flatten(1).mean(1)
