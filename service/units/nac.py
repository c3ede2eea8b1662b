"""Neural Accumulators (Trask et al., 2018): NAC+ (``nac_add``) and NAC• (``nac_mul``).

Both use ``W = tanh(Ŵ) ⊙ σ(M̂)``, which is biased towards {−1, 0, 1}.
NAC+: ``z = W x``; NAC•: ``z = exp(W log(|x| + ε))`` (ε = 1e-7 by default).
Reference init: Ŵ, M̂ ~ U[−r, r] with r such that ``fan · Var(tanh(Ŵ) σ(M̂)) = 2``,
``fan = max(fan_in + fan_out, 5)`` (see `nac_init_range`).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from service.seeding.init_stream import InitStream
from service.units import elementwise
from service.units.base import ExactMode, ForwardContext, Unit
from service.units.linear import linear_forward
from service.units.options import NACMulOptions
from service.units.registry import register

SATURATION = 20.0
"""|Ŵ|, |M̂| used by `load_exact_`: tanh(20) and σ(20) round to 1 in float32, σ(−20) ≈ 2e-9."""


def nac_weight_variance(r: float) -> float:
    """``Var(tanh(Ŵ) σ(M̂))`` for independent Ŵ, M̂ ~ U[−r, r].

    E[tanh Ŵ] = 0, so the variance is E[tanh² Ŵ] · E[σ² M̂], and both are closed forms:
    E[tanh²] = 1 − tanh(r)/r (tanh² = 1 − tanh') and
    E[σ²] = (r − tanh(r/2)) / (2r) (σ² = σ − σ', ∫_{−r}^{r} σ = r).
    """
    if r <= 0:
        return 0.0
    return (1.0 - math.tanh(r) / r) * (r - math.tanh(r / 2)) / (2.0 * r)


@functools.lru_cache(maxsize=None)
def nac_init_range(fan_in: int, fan_out: int) -> float:
    """The r with ``fan · Var(tanh(Ŵ) σ(M̂)) = 2`` for Ŵ, M̂ ~ U[−r, r], found by bisection.

    The variance rises monotonically from 0 towards 1/2, so a solution exists for any
    ``fan = max(fan_in + fan_out, 5) > 4``.
    """
    target = 2.0 / max(fan_in + fan_out, 5)
    lo, hi = 0.0, 1.0
    while nac_weight_variance(hi) < target:
        hi *= 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if nac_weight_variance(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def nac_weight(w_hat: Tensor, m_hat: Tensor) -> Tensor:
    """``tanh(Ŵ) ⊙ σ(M̂)``."""
    return elementwise.tanh(w_hat) * elementwise.sigmoid(m_hat)


def nac_mul_forward(log_x: Tensor, w: Tensor) -> Tensor:
    """``exp(W log x)`` given the already transformed ``log_x [S, B, in]``."""
    return torch.exp(linear_forward(log_x, w))


def saturated_nac_params(weights: Tensor) -> tuple[Tensor, Tensor]:
    """(Ŵ, M̂) whose ``tanh(Ŵ) σ(M̂)`` equals ``weights`` ∈ [−1, 1] (to float32 precision):
    0 -> (0, −20); ±1 -> (±20, 20); otherwise (atanh w, 20)."""
    if weights.abs().max() > 1:
        raise ValueError("NAC weights must lie in [-1, 1]")
    w = weights.to(torch.float64)
    w_hat = torch.where(
        w.abs() == 1, w.sign() * SATURATION, torch.atanh(w.clamp(-1 + 1e-12, 1 - 1e-12))
    )
    m_hat = torch.where(w == 0, -SATURATION, SATURATION)
    return w_hat.to(weights.dtype), m_hat.to(weights.dtype)


class _NACBase(Unit):
    """Parameters Ŵ (``w_hat``) and M̂ (``m_hat``), both ``[S, out, in]``; a non-default
    initialisation fills both."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.w_hat = self.seed_parameter(self.out_features, self.in_features)
        self.m_hat = self.seed_parameter(self.out_features, self.in_features)

    def init_seed_(self, k: int, generator: InitStream) -> None:
        r = nac_init_range(self.in_features, self.out_features)
        for p in (self.w_hat, self.m_hat):
            self.fill_weight_(p.data[k], generator, lambda w, g: g.uniform_(w, -r, r))

    def effective_weight(self) -> Tensor:
        return nac_weight(self.w_hat, self.m_hat)

    def weight_matrices(self) -> dict[str, Tensor]:
        return {"weight": self.effective_weight()}

    def _load(self, weights: Tensor) -> None:
        w_hat, m_hat = saturated_nac_params(weights)
        with torch.no_grad():
            self.w_hat.copy_(w_hat.to(self.w_hat).expand_as(self.w_hat))
            self.m_hat.copy_(m_hat.to(self.m_hat).expand_as(self.m_hat))


@register
class NACAdd(_NACBase):
    """``nac_add`` (NAC+): z = W x, W = tanh(Ŵ) σ(M̂). Exact for ``add``, W ∈ [−1, 1]."""

    name = "nac_add"

    def forward(self, x: Tensor, ctx: ForwardContext | None = None) -> Tensor:
        return linear_forward(x, self.effective_weight())

    def load_exact_(self, weights: Tensor, mode: ExactMode) -> None:
        if mode != "add":
            super().load_exact_(weights, mode)
        self._load(weights)


@register
class NACMul(_NACBase):
    """``nac_mul`` (NAC•): z = exp(W log(|x| + ε)). Exact for ``mul``, W ∈ [−1, 1], x > 0."""

    name = "nac_mul"
    Options = NACMulOptions

    def forward(self, x: Tensor, ctx: ForwardContext | None = None) -> Tensor:
        log_x = torch.log(x.abs() + self.options.epsilon)
        return nac_mul_forward(log_x, self.effective_weight())

    def load_exact_(self, weights: Tensor, mode: ExactMode) -> None:
        if mode != "mul":
            super().load_exact_(weights, mode)
        self._load(weights)
