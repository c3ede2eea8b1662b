"""Neural Power Units (Heim et al., NeurIPS 2020): ``npu`` and ``real_npu``.

A relevance gate ĝ ∈ [0, 1] per input replaces irrelevant inputs by 1:
``r = ĝ (|x| + ε) + (1 − ĝ)`` (ε keeps log r finite at x = 0), ``k = ĝ π [x < 0]``;
NPU: ``z = exp(W_re log r − W_im k) ⊙ cos(W_re k + W_im log r)`` (the real part of the
complex power ``Π_i x_i^{W_re + i W_im}``); RealNPU drops W_im:
``z = exp(W_re log r) ⊙ cos(W_re k)``.
ĝ is clamped to [0, 1] after each step (and in the forward). Regulariser: the L1 penalty
``mean |W|`` over W_re (and W_im). Reference init: W_re Xavier uniform, W_im = 0, ĝ = 0.5;
a non-default initialisation replaces W_re's only (W_im = 0 keeps the start real).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from service.seeding.init_stream import InitStream
from service.units.base import ExactMode, ForwardContext, Unit
from service.units.linear import linear_forward, xavier_uniform_
from service.units.options import NPUOptions
from service.units.registry import register

GATE_INIT = 0.5


class _NPUBase(Unit):
    Options = NPUOptions
    options: NPUOptions
    imaginary: bool = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.w_re = self.seed_parameter(self.out_features, self.in_features)
        if self.imaginary:
            self.w_im = self.seed_parameter(self.out_features, self.in_features)
        self.gate = self.seed_parameter(self.in_features)

    def init_seed_(self, k: int, generator: InitStream) -> None:
        self.fill_weight_(self.w_re.data[k], generator, xavier_uniform_)
        if self.imaginary:
            self.w_im.data[k].zero_()
        self.gate.data[k].fill_(GATE_INIT)

    def _weights(self) -> list[Tensor]:
        return [self.w_re, self.w_im] if self.imaginary else [self.w_re]

    def forward(self, x: Tensor, ctx: ForwardContext | None = None) -> Tensor:
        g = self.gate.clamp(0.0, 1.0).unsqueeze(1)
        log_r = torch.log(g * (x.abs() + self.options.epsilon) + (1 - g))
        k = g * (x < 0).to(x.dtype) * math.pi
        if self.imaginary:
            magnitude = linear_forward(log_r, self.w_re) - linear_forward(k, self.w_im)
            angle = linear_forward(k, self.w_re) + linear_forward(log_r, self.w_im)
        else:
            magnitude = linear_forward(log_r, self.w_re)
            angle = linear_forward(k, self.w_re)
        return torch.exp(magnitude) * torch.cos(angle)

    def regularizer(self) -> Tensor:
        """L1 penalty ``mean |W|`` over the power weights."""
        return torch.cat([w.flatten(1) for w in self._weights()], dim=1).abs().mean(1)

    def oob_penalty(self) -> Tensor:
        g = self.gate
        return (torch.relu(-g) + torch.relu(g - 1)).mean(1)

    def clamp_(self) -> None:
        with torch.no_grad():
            self.gate.clamp_(0.0, 1.0)

    def weight_matrices(self) -> dict[str, Tensor]:
        names = ["re", "im"] if self.imaginary else ["re"]
        return dict(zip(names, self._weights()))

    def load_exact_(self, weights: Tensor, mode: ExactMode) -> None:
        if mode != "mul":
            raise NotImplementedError(
                f"unit {self.name!r} cannot represent {mode!r}: it computes products of powers")
        with torch.no_grad():
            self.w_re.copy_(weights.to(self.w_re).expand_as(self.w_re))
            if self.imaginary:
                self.w_im.zero_()
            self.gate.fill_(1.0)


@register
class NPU(_NPUBase):
    """``npu``: complex-weighted power unit. Parameters ``w_re``, ``w_im`` ``[S, out, in]``,
    ``gate`` ``[S, in]``. Exact for ``mul`` (any real exponents, x > 0)."""

    name = "npu"
    imaginary = True


@register
class RealNPU(_NPUBase):
    """``real_npu``: the NPU without W_im. Parameters ``w_re`` ``[S, out, in]``, ``gate``
    ``[S, in]``. Exact for ``mul`` (any real exponents, x > 0)."""

    name = "real_npu"
    imaginary = False
