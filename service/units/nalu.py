"""Neural Arithmetic Logic Unit (Trask et al., 2018) and the variants of docs/domain/units.md.

``z = g ⊙ a + (1 − g) ⊙ m`` with ``a = W_a x`` the additive path (NAC+, ``W_a = tanh(Ŵ) ⊙
σ(M̂)``, or NAU, ``W_a`` clamped to [−1, 1]) and ``m`` the multiplicative path: NAC•
``exp(W_m log̃(x))`` (optionally times the iNALU sign ``Π_i (sign(x_i)|W_m,i| + 1 −
|W_m,i|)``) or an NMU ``Π_i (W_m,i x_i + 1 − W_m,i)``. ``add_unit: nau`` with ``mul_unit:
nmu`` is the gated NAU/NMU of the NAU paper.

- ``weights``: ``shared`` (W_m = W_a, the paper's NALU) or ``independent``.
- ``gate``: ``standard`` σ(G x); ``bias`` σ(G x + β); ``input_independent`` σ(β);
  ``temperature`` σ(τ(t) G x); ``gumbel`` σ(G x + L) with logistic noise
  L = log u − log(1 − u) (the difference of two Gumbels) added in training mode only.
- temperature (any gate; the default for ``temperature``): ``linear`` τ(t) rises from
  ``tau_start`` to ``tau_end`` between steps ``tau_t0`` and ``tau_t1`` and *multiplies* the
  pre-activation (σ(τ G x)); ``exponential`` is the Gumbel-softmax temperature
  T(t) = max(``tau_min``, exp(−``tau_rate``·t)), which *divides* it (σ((G x + L) / T)).
  Both sharpen the gate as training goes on.
- ``log`` (NAC• path): ``eps`` log(|x| + ε); ``safe`` log(|x − 1| + 1); ``relu``
  log(max(0, x − 1) + 1). The latter two equal log x for x ≥ 1 and avoid log 0.
- ``mul_unit``: ``nac_mul`` or ``nmu`` (needs independent weights: an NMU's W lives in [0, 1]).
- ``add_unit``: ``nac_add`` or ``nau`` (implies independent weights: an unset ``weights``
  becomes ``independent``, an explicit ``shared`` is an error).

An NAU or NMU path is what the unit of that name is: clamped after every optimiser step
(`clamp_`), with its sparsity regulariser; the layer's regulariser (and out-of-bounds
penalty) is the sum of its NAU and NMU paths' (each a mean over that path's weights). A
NAC path has none.

Init: NAC weights as `nac_init_range`; NAU U[−r, r] (`nau_init_range`); NMU U[0.25, 0.75];
G Xavier uniform; β = ``gate_bias_init``. A non-default initialisation replaces the
NAC/NAU/NMU weights' init only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from service.seeding import generator as rng
from service.seeding.init_stream import InitStream
from service.units import elementwise
from service.units.base import ExactMode, ForwardContext, Unit
from service.units.linear import linear_forward, xavier_uniform_
from service.units.nac import nac_init_range, nac_mul_forward, nac_weight, saturated_nac_params
from service.units.nau import nau_init_range, nau_oob_penalty, nau_regularizer
from service.units.nmu import (
    check_selection_weights,
    nmu_forward,
    nmu_init_,
    nmu_oob_penalty,
    nmu_regularizer,
)
from service.units.options import LogKind, NALUOptions
from service.units.registry import register

GATE_SATURATION = 100.0
"""|G| and |β| used by `load_exact_`; with τ ≥ 0.2 and inputs ≥ 1 the gate is 0/1 in float32."""

NOISE_STREAM_SHIFT = 40
"""Gumbel noise of unit stream s uses counter ``step + (s + 1) << 40``, never a data counter."""


def log_transform(x: Tensor, kind: LogKind, epsilon: float) -> Tensor:
    """The NAC• path's logarithm: ``eps``, ``safe`` or ``relu`` (see the module docstring)."""
    if kind == "eps":
        return torch.log(x.abs() + epsilon)
    if kind == "safe":
        return torch.log1p((x - 1).abs())
    return torch.log1p(torch.relu(x - 1))


def product_sign(x: Tensor, w: Tensor) -> Tensor:
    """iNALU sign recovery ``Π_i (sign(x_i)|w_i| + 1 − |w_i|)``: ``[S, B, out]``."""
    a = w.abs().unsqueeze(1)
    return (a * (torch.sign(x).unsqueeze(2) - 1) + 1).prod(-1)


@register
class NALU(Unit):
    """``nalu``: z = g a + (1 − g) m with the variants of `NALUOptions`.

    Parameters (``[S, out, in]`` unless noted): ``add_w_hat``, ``add_m_hat`` (NAC+, also the
    NAC• path when shared) or ``nau_weight`` (NAU); ``mul_w_hat``, ``mul_m_hat``
    (independent NAC•) or ``mul_weight`` (NMU); ``gate_weight`` G (not for
    input_independent); ``gate_bias`` β ``[S, out]`` (bias and input_independent). Exact
    for ``add`` and ``mul`` with positive inputs (the gate is saturated through G and β).
    """

    name = "nalu"
    Options = NALUOptions
    options: NALUOptions

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self._shared = o.weights == "shared"
        self._nmu = o.mul_unit == "nmu"
        self._nau = o.add_unit == "nau"
        self._gate = o.gate
        self._temperature = o.temperature
        self._log: LogKind = o.log
        self._sign = o.sign_correction and not self._nmu
        shape = (self.out_features, self.in_features)
        if self._nau:
            self.nau_weight = self.seed_parameter(*shape)
        else:
            self.add_w_hat = self.seed_parameter(*shape)
            self.add_m_hat = self.seed_parameter(*shape)
        if self._nmu:
            self.mul_weight = self.seed_parameter(*shape)
        elif not self._shared:
            self.mul_w_hat = self.seed_parameter(*shape)
            self.mul_m_hat = self.seed_parameter(*shape)
        if self._gate != "input_independent":
            self.gate_weight = self.seed_parameter(*shape)
        if self._gate in ("bias", "input_independent"):
            self.gate_bias = self.seed_parameter(self.out_features)

    # -- init -------------------------------------------------------------------------
    def init_seed_(self, k: int, generator: InitStream) -> None:
        r = nac_init_range(self.in_features, self.out_features)

        def nac_init(w: Tensor, g: InitStream) -> Tensor:
            return g.uniform_(w, -r, r)

        if self._nau:
            r_nau = nau_init_range(self.in_features, self.out_features)
            self.fill_weight_(self.nau_weight.data[k], generator,
                              lambda w, g: g.uniform_(w, -r_nau, r_nau))
        nac = [] if self._nau else [self.add_w_hat, self.add_m_hat]
        if not self._shared and not self._nmu:
            nac += [self.mul_w_hat, self.mul_m_hat]
        for p in nac:
            self.fill_weight_(p.data[k], generator, nac_init)
        if self._nmu:
            self.fill_weight_(self.mul_weight.data[k], generator, nmu_init_)
        if self._gate != "input_independent":
            xavier_uniform_(self.gate_weight.data[k], generator)
        if self._gate in ("bias", "input_independent"):
            self.gate_bias.data[k].fill_(self.options.gate_bias_init)

    # -- the maths ----------------------------------------------------------------------
    def add_weight(self) -> Tensor:
        """The additive path's effective W (NAC+ weight or NAU weight)."""
        if self._nau:
            return self.nau_weight
        return nac_weight(self.add_w_hat, self.add_m_hat)

    def mul_weight_matrix(self) -> Tensor:
        """The multiplicative path's effective W (NAC• weight or NMU weight)."""
        if self._nmu:
            return self.mul_weight
        if self._shared:
            return self.add_weight()
        return nac_weight(self.mul_w_hat, self.mul_m_hat)

    def gate_value(self, x: Tensor, ctx: ForwardContext | None) -> Tensor:
        """g ``[S, B or 1, out]``."""
        if self._gate == "input_independent":
            pre = self.gate_bias.unsqueeze(1)
        else:
            pre = linear_forward(x, self.gate_weight)
            if self._gate == "bias":
                pre = pre + self.gate_bias.unsqueeze(1)
            if self._gate == "gumbel" and self.training and ctx is not None:
                pre = pre + self._logistic_noise(ctx, x.shape[1])
        if self._temperature != "none":
            pre = pre * self.gate_sharpness(self.step_of(ctx, x.device))
        return elementwise.sigmoid(pre)  # batch-independent (torch.sigmoid is not)

    def on_seed_variants(self) -> None:
        """Per-seed rows of the temperature schedule (the scalars of `gate_sharpness`)."""
        rows = self.seed_rows
        self._tau_rows = (rows("tau_start"), rows("", lambda o: o.tau_end - o.tau_start),
                          rows("tau_t0"), rows("", lambda o: float(o.tau_t1 - o.tau_t0)),
                          rows("", lambda o: -o.tau_rate), rows("tau_min"))

    def gate_sharpness(self, step: Tensor) -> Tensor:
        """The factor on the gate pre-activation at ``step``: τ(t) for the linear schedule,
        1 / T(t) for the exponential one; per seed ``[S, 1, 1]`` once the unit has per-seed
        options (`set_seed_variants`, as every trainer sets), else a 0-d tensor."""
        o = self.options
        t = step.to(torch.float32)
        if self.seed_options is not None:
            start, delta, t0, span, neg_rate, floor = self._tau_rows
            if self._temperature == "linear":
                value = start + delta * ((t - t0) / span).clamp(0.0, 1.0)
            else:
                value = 1.0 / torch.maximum(torch.exp(neg_rate * t), floor)
            return value.view(-1, 1, 1)
        if self._temperature == "linear":
            p = ((t - o.tau_t0) / float(o.tau_t1 - o.tau_t0)).clamp(0.0, 1.0)
            return o.tau_start + (o.tau_end - o.tau_start) * p
        return 1.0 / torch.exp(-o.tau_rate * t).clamp_min(o.tau_min)

    def _logistic_noise(self, ctx: ForwardContext, batch: int) -> Tensor:
        if ctx.noise_keys is None:
            raise ValueError("a gumbel gate needs ForwardContext.noise_keys in training mode")
        counter = ctx.step + ((self.noise_stream + 1) << NOISE_STREAM_SHIFT)
        u = rng.uniform(ctx.noise_keys, counter, (batch, self.out_features))
        u = u.clamp(1e-7, 1 - 1e-7)  # torch.logit(u, eps=1e-7), with MKL's log: batch-independent
        return torch.log(u / (1 - u))

    def forward(self, x: Tensor, ctx: ForwardContext | None = None) -> Tensor:
        w_add = self.add_weight()
        a = linear_forward(x, w_add)
        if self._nmu:
            m = nmu_forward(x, self.mul_weight)
        else:
            w_mul = w_add if self._shared else nac_weight(self.mul_w_hat, self.mul_m_hat)
            m = nac_mul_forward(log_transform(x, self._log, self.options.epsilon), w_mul)
            if self._sign:
                m = m * product_sign(x, w_mul)
        g = self.gate_value(x, ctx)
        return g * a + (1 - g) * m

    # -- regularisers and constraints ------------------------------------------------------
    def regularizer(self) -> Tensor:
        """The NAU path's ``mean(min(|W|, |1 − |W||))`` plus the NMU path's ``mean(min(|W|,
        |1 − W|))`` (the reference forms), each over its own weights; a NAC path adds nothing."""
        return self._sum_over_paths(nau_regularizer, nmu_regularizer)

    def oob_penalty(self) -> Tensor:
        return self._sum_over_paths(nau_oob_penalty, nmu_oob_penalty)

    def _sum_over_paths(self, on_nau, on_nmu) -> Tensor:
        """``on_nau(W_add)`` for an NAU add path plus ``on_nmu(W_mul)`` for an NMU mul path
        (per seed ``[S]``); zeros when neither path is one."""
        terms = ([on_nau(self.nau_weight)] if self._nau else []) + (
            [on_nmu(self.mul_weight)] if self._nmu else [])
        if not terms:
            return self._zeros()
        return terms[0] if len(terms) == 1 else terms[0] + terms[1]

    def clamp_(self) -> None:
        with torch.no_grad():
            if self._nau:
                self.nau_weight.clamp_(-1.0, 1.0)
            if self._nmu:
                self.mul_weight.clamp_(0.0, 1.0)

    def weight_matrices(self) -> dict[str, Tensor]:
        if self._shared:
            return {"weight": self.add_weight()}
        return {"add": self.add_weight(), "mul": self.mul_weight_matrix()}

    def load_exact_(self, weights: Tensor, mode: ExactMode) -> None:
        if mode not in ("add", "mul"):
            super().load_exact_(weights, mode)
        if mode == "add" and self._nau:
            if weights.abs().max() > 1:
                raise ValueError("NAU weights must lie in [-1, 1]")
            target = self.nau_weight
        elif mode == "add" or (mode == "mul" and self._shared):
            target = (self.add_w_hat, self.add_m_hat)
        elif self._nmu:
            check_selection_weights(weights)
            target = self.mul_weight
        else:
            target = (self.mul_w_hat, self.mul_m_hat)
        with torch.no_grad():
            if isinstance(target, Tensor):  # an NAU or NMU path holds W itself
                target.copy_(weights.to(target).expand_as(target))
            else:
                for p, v in zip(target, saturated_nac_params(weights)):
                    p.copy_(v.to(p).expand_as(p))
            sign = 1.0 if mode == "add" else -1.0
            if self._gate != "input_independent":
                self.gate_weight.fill_(sign * GATE_SATURATION)
            if self._gate in ("bias", "input_independent"):
                self.gate_bias.fill_(sign * GATE_SATURATION)

    def extra_repr(self) -> str:
        o = self.options
        return (f"{self.in_features}->{self.out_features}, S={self.num_seeds}, "
                f"weights={o.weights}, gate={o.gate}, temperature={o.temperature}, "
                f"log={o.log}, add_unit={o.add_unit}, mul_unit={o.mul_unit}, "
                f"sign_correction={o.sign_correction}")
