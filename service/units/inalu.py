"""Improved NALU (iNALU, Schlör et al., 2020).

Independent NAC weights for the two paths, ``W = tanh(Ŵ) σ(M̂)`` each;
``a = W_a x``; ``m = exp(min(W_m log(max(|x|, ε)), ω))`` (ω = 20 stops overflow);
sign recovery ``s = Π_i (sign(x_i)|W_m,i| + 1 − |W_m,i|)``;
input-independent gate ``g = σ(G)``, G ``[S, out]``; ``z = g a + (1 − g) m s``.

Regulariser (pulls every parameter away from 0 towards saturation, where the weights and
the gate are discrete): ``R = mean_p max(min(−p, p) + t, 0) / t = mean_p relu(t − |p|) / t``
over all of Ŵ_a, M̂_a, Ŵ_m, M̂_m and G, with t = ``reg_threshold`` (20). R is 1 at p = 0
and 0 once |p| ≥ t. iNALU switches it on once the loss is small: that is the λ(t) schedule.
Gradient clipping and reinitialisation on plateaus are trainer options (docs/guide/run.md).
"""

from __future__ import annotations

import torch
from torch import Tensor

from service.seeding.init_stream import InitStream
from service.units import elementwise
from service.units.base import ExactMode, ForwardContext, Unit
from service.units.linear import linear_forward
from service.units.nac import nac_init_range, nac_weight, saturated_nac_params
from service.units.nalu import GATE_SATURATION, product_sign
from service.units.options import INALUOptions
from service.units.registry import register


@register
class INALU(Unit):
    """``inalu``. Parameters ``add_w_hat``, ``add_m_hat``, ``mul_w_hat``, ``mul_m_hat``
    ``[S, out, in]`` and ``gate`` ``[S, out]``. Exact for ``add`` and ``mul`` (x > 0)."""

    name = "inalu"
    Options = INALUOptions
    options: INALUOptions

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        shape = (self.out_features, self.in_features)
        self.add_w_hat = self.seed_parameter(*shape)
        self.add_m_hat = self.seed_parameter(*shape)
        self.mul_w_hat = self.seed_parameter(*shape)
        self.mul_m_hat = self.seed_parameter(*shape)
        self.gate = self.seed_parameter(self.out_features)

    def _nac_params(self) -> list[Tensor]:
        return [self.add_w_hat, self.add_m_hat, self.mul_w_hat, self.mul_m_hat]

    def init_seed_(self, k: int, generator: InitStream) -> None:
        r = nac_init_range(self.in_features, self.out_features)
        for p in self._nac_params():
            self.fill_weight_(p.data[k], generator, lambda w, g: g.uniform_(w, -r, r))
        self.gate.data[k].fill_(self.options.gate_init)

    def forward(self, x: Tensor, ctx: ForwardContext | None = None) -> Tensor:
        o = self.options
        a = linear_forward(x, nac_weight(self.add_w_hat, self.add_m_hat))
        w_mul = nac_weight(self.mul_w_hat, self.mul_m_hat)
        log_x = torch.log(x.abs().clamp_min(o.epsilon))
        m = torch.exp(linear_forward(log_x, w_mul).clamp_max(o.omega)) * product_sign(x, w_mul)
        g = elementwise.sigmoid(self.gate).unsqueeze(1)
        return g * a + (1 - g) * m

    def regularizer(self) -> Tensor:
        t = self.options.reg_threshold
        p = torch.cat([q.flatten(1) for q in self._nac_params()] + [self.gate], dim=1)
        return (torch.relu(t - p.abs()) / t).mean(1)

    def weight_matrices(self) -> dict[str, Tensor]:
        return {
            "add": nac_weight(self.add_w_hat, self.add_m_hat),
            "mul": nac_weight(self.mul_w_hat, self.mul_m_hat),
        }

    def load_exact_(self, weights: Tensor, mode: ExactMode) -> None:
        if mode not in ("add", "mul"):
            super().load_exact_(weights, mode)
        target = (self.add_w_hat, self.add_m_hat) if mode == "add" else (
            self.mul_w_hat, self.mul_m_hat)
        with torch.no_grad():
            for p, v in zip(target, saturated_nac_params(weights)):
                p.copy_(v.to(p).expand_as(p))
            self.gate.fill_(GATE_SATURATION if mode == "add" else -GATE_SATURATION)
