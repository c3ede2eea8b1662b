"""The engine's Triton kernels: many training steps of a two-layer model per launch, and its
evaluation, one program per seed.

The model is the papers' ``I → 2 → 1`` stack: a first layer of the additive kind (Linear,
regularised Linear, NAU, NAC+) and a second of any kind below. Each program keeps its seed's
parameters and Adam state in registers for all the steps of a launch and, per step, draws
its batch (`service.engine.philox.draw_rows`, the trainer's stream), computes the target,
the forward, the backward, the regulariser's gradient, Adam's update and the clamp, in
chunks of ``RB`` rows. Nothing is shared between programs, so a seed's trajectory does not
depend on which or how many seeds run beside it.

Every float operation is the one the torch path does, in float32 (divisions and square
roots correctly rounded, no fused multiply-add): only the order of the sums over the batch
and the inputs differs, which is why the contract against the torch path is a tolerance
(1e-5 relative over the steps; the chaotic NAC• within the torch path's own 1e-15 control).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

from service.engine.philox import draw_rows

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

# unit codes (`service.engine.coverage.UNIT_CODES` maps the registry's names onto them)
LINEAR = tl.constexpr(0)
NAU = tl.constexpr(1)
NAC_ADD = tl.constexpr(2)
REG_LINEAR = tl.constexpr(3)
NMU = tl.constexpr(4)
NAC_MUL = tl.constexpr(5)

SLOTS = 6  # per layer: parameter a, parameter b, Adam m and v of a, of b
HYPER = 8  # per seed: λ_max, t_start, t_end − t_start, 1 − β1, β2, 1 − β2, ε, operation code


if INTERPRETED:  # no libdevice here: float64 numpy rounded once (the CPU's correctly rounded values)
    @triton.jit
    def _exp(x):
        return tl.exp(x.to(tl.float64)).to(tl.float32)

    @triton.jit
    def _log(x):
        return tl.log(x.to(tl.float64)).to(tl.float32)

    @triton.jit
    def _tanh(x):
        e = tl.exp(-2.0 * tl.abs(x.to(tl.float64)))
        return (tl.where(x < 0, -1.0, 1.0) * ((1.0 - e) / (1.0 + e))).to(tl.float32)
else:  # CUDA's expf, logf, tanhf: the functions torch's CUDA kernels call
    @triton.jit
    def _exp(x):
        return libdevice.exp(x)

    @triton.jit
    def _log(x):
        return libdevice.log(x)

    @triton.jit
    def _tanh(x):
        return libdevice.tanh(x)


@triton.jit
def _sigmoid(x):
    return tl.div_rn(1.0, 1.0 + _exp(-x))


@triton.jit
def _sgn(x):
    return tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0))


@triton.jit
def effective(a, b, U: tl.constexpr):
    """(W, tanh Ŵ, σ(M̂)) of a layer's raw parameters: W = a, or tanh(a) σ(b) for NAC."""
    if U == NAC_ADD or U == NAC_MUL:
        th = _tanh(a)
        sg = _sigmoid(b)
        return th * sg, th, sg
    else:
        return a, a, b


@triton.jit
def _distance_grad(a, g_over_n):
    """Gradient of ``min(|a|, |1 − a|)`` scaled by ``λ / n`` (`units.base._MeanDistanceToBounds`)."""
    b = 1 - a
    d = _sgn(tl.abs(b) - tl.abs(a))
    local = 0.5 * ((1 + d) * _sgn(a) - (1 - d) * _sgn(b))
    return g_over_n * local


@triton.jit
def regulariser_grad(w, lam_over_n, U: tl.constexpr):
    """λ · dR/dW of a layer's sparsity regulariser (a mean over its n weights)."""
    if U == NAU:
        return _distance_grad(tl.abs(w), lam_over_n) * _sgn(w)
    elif U == NMU:
        return _distance_grad(w, lam_over_n)
    elif U == REG_LINEAR:
        r = 1 - tl.abs(w)
        return lam_over_n * (2 * w * r * r - 2 * w * w * r * _sgn(w))
    else:
        return w * 0.0


@triton.jit
def raw_grads(gw, th, sg, U: tl.constexpr):
    """Gradients of the raw parameters from that of W (NAC: through tanh(Ŵ) σ(M̂))."""
    if U == NAC_ADD or U == NAC_MUL:
        ga = (gw * sg) * (1 - th * th)
        gb = ((gw * th) * (1 - sg)) * sg
        return ga, gb
    else:
        return gw, gw * 0.0


@triton.jit
def clamp(p, U: tl.constexpr):
    if U == NAU:
        return tl.minimum(tl.maximum(p, -1.0), 1.0)
    elif U == NMU:
        return tl.minimum(tl.maximum(p, 0.0), 1.0)
    else:
        return p


@triton.jit
def adam(p, g, m, v, step_size, bc2_sqrt, omb1, b2, omb2, eps):
    """`BatchedOptimizer.step`'s Adam: m ← lerp(m, g, 1 − β1), v ← β2 v + ((1 − β2) g) g,
    p ← p − (m · lr/bc1) / (√v / √bc2 + ε)."""
    m = tl.where(omb1 < 0.5, m + omb1 * (g - m), g - (g - m) * (1 - omb1))
    v = v * b2 + (g * omb2) * g
    denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    p = p - tl.div_rn(m * step_size, denom)
    return p, m, v


@triton.jit
def forward2(h0, h1, v0, v1, U2: tl.constexpr, eps2):
    """The second layer (2 → 1): (y, f0, f1) with the factors the backward needs."""
    if U2 == NMU:
        f0 = v0 * (h0 - 1.0) + 1.0
        f1 = v1 * (h1 - 1.0) + 1.0
        return f0 * f1, f0, f1
    elif U2 == NAC_MUL:
        f0 = _log(tl.abs(h0) + eps2)
        f1 = _log(tl.abs(h1) + eps2)
        return _exp(f0 * v0 + f1 * v1), f0, f1
    else:
        return h0 * v0 + h1 * v1, h0, h1


@triton.jit
def backward2(gy, y, h0, h1, f0, f1, v0, v1, U2: tl.constexpr, eps2):
    """(dv0, dv1, gh0, gh1): the second layer's weight gradients (summed over the rows) and
    its input gradients."""
    if U2 == NMU:
        g0 = gy * f1
        g1 = gy * f0
        return tl.sum(g0 * (h0 - 1.0), 0), tl.sum(g1 * (h1 - 1.0), 0), g0 * v0, g1 * v1
    elif U2 == NAC_MUL:
        gz = gy * y
        gh0 = tl.div_rn(gz * v0, tl.abs(h0) + eps2) * _sgn(h0)
        gh1 = tl.div_rn(gz * v1, tl.abs(h1) + eps2) * _sgn(h1)
        return tl.sum(gz * f0, 0), tl.sum(gz * f1, 0), gh0, gh1
    else:
        return tl.sum(gy * h0, 0), tl.sum(gy * h1, 0), gy * v0, gy * v1


@triton.jit
def target(x, cols, op, TGT: tl.constexpr, OP: tl.constexpr, A0: tl.constexpr, A1: tl.constexpr,
           B0: tl.constexpr, B1: tl.constexpr):
    """The task's target per row: ``a ∘ b`` of the two runs' sums (arithmetic, TGT 0) or
    ``(x1+x2+x3+x4)(x1+x2)`` (small_mul, TGT 1). ``OP`` the operation's code, or
    `PER_SEED_OP`: the seed's own code ``op`` (a pack of mixed operations; every operation
    computed as alone, the seed's chosen)."""
    if TGT == 1:
        x0 = tl.sum(tl.where(cols[None, :] == 0, x, 0.0), 1)
        x1 = tl.sum(tl.where(cols[None, :] == 1, x, 0.0), 1)
        x2 = tl.sum(tl.where(cols[None, :] == 2, x, 0.0), 1)
        x3 = tl.sum(tl.where(cols[None, :] == 3, x, 0.0), 1)
        b = x0 + x1
        return (b + x2 + x3) * b
    else:
        a = tl.sum(tl.where((cols[None, :] >= A0) & (cols[None, :] < A1), x, 0.0), 1)
        b = tl.sum(tl.where((cols[None, :] >= B0) & (cols[None, :] < B1), x, 0.0), 1)
        if OP == 6:
            t = tl.where(op == 0, a + b, a - b)
            t = tl.where(op == 2, a * b, t)
            t = tl.where(op == 3, tl.div_rn(a, b), t)
            t = tl.where(op == 4, a * a, t)
            return tl.where(op == 5, tl.sqrt_rn(a), t)
        elif OP == 0:
            return a + b
        elif OP == 1:
            return a - b
        elif OP == 2:
            return a * b
        elif OP == 3:
            return tl.div_rn(a, b)
        elif OP == 4:
            return a * a
        else:
            return tl.sqrt_rn(a)


@triton.jit(do_not_specialize=["step0", "n_steps", "table_len"])
def train_kernel(keys_ptr, l1_ptr, l2_ptr, flags_ptr, hyper_ptr, opt_steps_ptr, table_ptr,
                 group_ptr, table_len, step0, n_steps, lo, scale, eps2,
                 B: tl.constexpr, I: tl.constexpr, IP: tl.constexpr, JOIN: tl.constexpr,
                 RB: tl.constexpr, TGT: tl.constexpr, OP: tl.constexpr, A0: tl.constexpr,
                 A1: tl.constexpr, B0: tl.constexpr, B1: tl.constexpr, U1: tl.constexpr,
                 U2: tl.constexpr, REG: tl.constexpr):
    """``n_steps`` training steps from ``step0`` for seed ``program_id(0)``.

    ``l1 [S, 6, 2, IP]`` and ``l2 [S, 6, 2]`` (float32): per layer the raw parameters a, b and
    Adam's m, v of each (`SLOTS`); ``flags [S, 2]`` int64 (alive, diverged_at); ``hyper
    [S, 8]`` float32 (`HYPER`); ``opt_steps [S]`` the optimiser's step count at ``step0``;
    ``table [G, L, 2]`` float32 Adam's ``lr / (1 − β1^t)`` and ``√(1 − β2^t)`` per t for
    seed group ``group[s]`` (`service.engine.layout.adam_table`). ``REG``: 0 a linear
    λ(t) warm-up, 1 a constant λ from t_start.
    """
    s = tl.program_id(0).to(tl.int64)
    kp = keys_ptr + 3 * s
    cols = tl.arange(0, IP)
    cm = cols < I
    p1 = l1_ptr + s * (6 * 2 * IP)
    a10 = tl.load(p1 + 0 * IP + cols, mask=cm, other=0.0)
    a11 = tl.load(p1 + 1 * IP + cols, mask=cm, other=0.0)
    b10 = tl.load(p1 + 2 * IP + cols, mask=cm, other=0.0)
    b11 = tl.load(p1 + 3 * IP + cols, mask=cm, other=0.0)
    ma10 = tl.load(p1 + 4 * IP + cols, mask=cm, other=0.0)
    ma11 = tl.load(p1 + 5 * IP + cols, mask=cm, other=0.0)
    va10 = tl.load(p1 + 6 * IP + cols, mask=cm, other=0.0)
    va11 = tl.load(p1 + 7 * IP + cols, mask=cm, other=0.0)
    mb10 = tl.load(p1 + 8 * IP + cols, mask=cm, other=0.0)
    mb11 = tl.load(p1 + 9 * IP + cols, mask=cm, other=0.0)
    vb10 = tl.load(p1 + 10 * IP + cols, mask=cm, other=0.0)
    vb11 = tl.load(p1 + 11 * IP + cols, mask=cm, other=0.0)
    p2 = l2_ptr + s * 12
    a20 = tl.load(p2 + 0)
    a21 = tl.load(p2 + 1)
    b20 = tl.load(p2 + 2)
    b21 = tl.load(p2 + 3)
    ma20 = tl.load(p2 + 4)
    ma21 = tl.load(p2 + 5)
    va20 = tl.load(p2 + 6)
    va21 = tl.load(p2 + 7)
    mb20 = tl.load(p2 + 8)
    mb21 = tl.load(p2 + 9)
    vb20 = tl.load(p2 + 10)
    vb21 = tl.load(p2 + 11)
    alive = tl.load(flags_ptr + 2 * s)
    diverged_at = tl.load(flags_ptr + 2 * s + 1)
    hp = hyper_ptr + 8 * s
    lam_max = tl.load(hp + 0)
    t_start = tl.load(hp + 1)
    span = tl.load(hp + 2)
    omb1 = tl.load(hp + 3)
    b2 = tl.load(hp + 4)
    omb2 = tl.load(hp + 5)
    eps = tl.load(hp + 6)
    op = tl.load(hp + 7).to(tl.int32)  # the seed's operation code (read where OP is per seed)
    opt_t = tl.load(opt_steps_ptr + s)
    table = table_ptr + tl.load(group_ptr + s) * table_len * 2
    n1 = 2.0 * I

    it = 0
    while it < n_steps:  # not range(): Triton 3.6's interpreter cannot loop to a runtime bound
        step = step0.to(tl.int64) + it
        it += 1
        w10, th10, sg10 = effective(a10, b10, U1)
        w11, th11, sg11 = effective(a11, b11, U1)
        v0, th20, sg20 = effective(a20, b20, U2)
        v1, th21, sg21 = effective(a21, b21, U2)
        gw10 = tl.zeros((IP,), tl.float32)
        gw11 = tl.zeros((IP,), tl.float32)
        gv0 = tl.sum(gw10, 0) * 0.0
        gv1 = gv0
        loss = gv0
        for r0 in range(0, B, RB):
            rows = r0 + tl.arange(0, RB)
            rm = rows < B
            x = tl.where(rm[:, None], draw_rows(kp, step, rows, I, IP, JOIN, lo, scale), 0.0)
            t = target(x, cols, op, TGT, OP, A0, A1, B0, B1)
            h0 = tl.sum(x * w10[None, :], 1)
            h1 = tl.sum(x * w11[None, :], 1)
            y, f0, f1 = forward2(h0, h1, v0, v1, U2, eps2)
            d = tl.where(rm, y - t, 0.0)
            loss += tl.sum(d * d, 0)
            gy = d * (2.0 / B)
            d0, d1, gh0, gh1 = backward2(gy, y, h0, h1, f0, f1, v0, v1, U2, eps2)
            gv0 += d0
            gv1 += d1
            gw10 += tl.sum(gh0[:, None] * x, 0)
            gw11 += tl.sum(gh1[:, None] * x, 0)
        task_loss = tl.div_rn(loss, B * 1.0)
        tf = step.to(tl.float32)
        if REG == 1:
            lam = tl.where(tf >= t_start, lam_max, 0.0)
        else:
            lam = lam_max * tl.minimum(tl.maximum(tl.div_rn(tf - t_start, span), 0.0), 1.0)
        gw10 += regulariser_grad(w10, tl.div_rn(lam, n1), U1)
        gw11 += regulariser_grad(w11, tl.div_rn(lam, n1), U1)
        gv0 += regulariser_grad(v0, tl.div_rn(lam, 2.0), U2)
        gv1 += regulariser_grad(v1, tl.div_rn(lam, 2.0), U2)
        finite = (task_loss - task_loss) == 0
        diverged_at = tl.where((alive != 0) & ~finite, step, diverged_at)
        alive = tl.where(finite, alive, 0)
        ok = alive != 0
        ga10, gb10 = raw_grads(gw10, th10, sg10, U1)
        ga11, gb11 = raw_grads(gw11, th11, sg11, U1)
        ga20, gb20 = raw_grads(gv0, th20, sg20, U2)
        ga21, gb21 = raw_grads(gv1, th21, sg21, U2)
        opt_t += 1
        tix = tl.minimum(opt_t, table_len - 1)
        step_size = tl.load(table + 2 * tix)
        bc2_sqrt = tl.load(table + 2 * tix + 1)
        ga10 = tl.where(ok & (ga10 - ga10 == 0) & cm, ga10, 0.0)
        ga11 = tl.where(ok & (ga11 - ga11 == 0) & cm, ga11, 0.0)
        a10, ma10, va10 = adam(a10, ga10, ma10, va10, step_size, bc2_sqrt, omb1, b2, omb2, eps)
        a11, ma11, va11 = adam(a11, ga11, ma11, va11, step_size, bc2_sqrt, omb1, b2, omb2, eps)
        a10 = clamp(a10, U1)
        a11 = clamp(a11, U1)
        ga20 = tl.where(ok & (ga20 - ga20 == 0), ga20, 0.0)
        ga21 = tl.where(ok & (ga21 - ga21 == 0), ga21, 0.0)
        a20, ma20, va20 = adam(a20, ga20, ma20, va20, step_size, bc2_sqrt, omb1, b2, omb2, eps)
        a21, ma21, va21 = adam(a21, ga21, ma21, va21, step_size, bc2_sqrt, omb1, b2, omb2, eps)
        a20 = clamp(a20, U2)
        a21 = clamp(a21, U2)
        if U1 == NAC_ADD:
            gb10 = tl.where(ok & (gb10 - gb10 == 0) & cm, gb10, 0.0)
            gb11 = tl.where(ok & (gb11 - gb11 == 0) & cm, gb11, 0.0)
            b10, mb10, vb10 = adam(b10, gb10, mb10, vb10, step_size, bc2_sqrt, omb1, b2, omb2, eps)
            b11, mb11, vb11 = adam(b11, gb11, mb11, vb11, step_size, bc2_sqrt, omb1, b2, omb2, eps)
        if U2 == NAC_ADD or U2 == NAC_MUL:
            gb20 = tl.where(ok & (gb20 - gb20 == 0), gb20, 0.0)
            gb21 = tl.where(ok & (gb21 - gb21 == 0), gb21, 0.0)
            b20, mb20, vb20 = adam(b20, gb20, mb20, vb20, step_size, bc2_sqrt, omb1, b2, omb2, eps)
            b21, mb21, vb21 = adam(b21, gb21, mb21, vb21, step_size, bc2_sqrt, omb1, b2, omb2, eps)

    tl.store(p1 + 0 * IP + cols, a10, mask=cm)
    tl.store(p1 + 1 * IP + cols, a11, mask=cm)
    tl.store(p1 + 2 * IP + cols, b10, mask=cm)
    tl.store(p1 + 3 * IP + cols, b11, mask=cm)
    tl.store(p1 + 4 * IP + cols, ma10, mask=cm)
    tl.store(p1 + 5 * IP + cols, ma11, mask=cm)
    tl.store(p1 + 6 * IP + cols, va10, mask=cm)
    tl.store(p1 + 7 * IP + cols, va11, mask=cm)
    tl.store(p1 + 8 * IP + cols, mb10, mask=cm)
    tl.store(p1 + 9 * IP + cols, mb11, mask=cm)
    tl.store(p1 + 10 * IP + cols, vb10, mask=cm)
    tl.store(p1 + 11 * IP + cols, vb11, mask=cm)
    tl.store(p2 + 0, a20)
    tl.store(p2 + 1, a21)
    tl.store(p2 + 2, b20)
    tl.store(p2 + 3, b21)
    tl.store(p2 + 4, ma20)
    tl.store(p2 + 5, ma21)
    tl.store(p2 + 6, va20)
    tl.store(p2 + 7, va21)
    tl.store(p2 + 8, mb20)
    tl.store(p2 + 9, mb21)
    tl.store(p2 + 10, vb20)
    tl.store(p2 + 11, vb21)
    tl.store(flags_ptr + 2 * s, alive)
    tl.store(flags_ptr + 2 * s + 1, diverged_at)
    tl.store(opt_steps_ptr + s, opt_t)


@triton.jit(do_not_specialize=["n"])
def eval_kernel(x_ptr, y_ptr, yrow_ptr, l1_ptr, l2_ptr, out_ptr, n, eps2, I: tl.constexpr,
                IP: tl.constexpr, EB: tl.constexpr, U1: tl.constexpr, U2: tl.constexpr):
    """``out[s]`` = seed s's MSE (float64) on the shared inputs ``x [n, I]`` against its
    targets ``y[yrow[s]]`` of ``y [T, n]`` (T > 1 in a pack of mixed operations): errors
    in float32 as the model computes them, squared and summed in float64."""
    s = tl.program_id(0).to(tl.int64)
    y_ptr += tl.load(yrow_ptr + s).to(tl.int64) * n
    cols = tl.arange(0, IP)
    cm = cols < I
    p1 = l1_ptr + s * (6 * 2 * IP)
    w10, _a, _b = effective(tl.load(p1 + cols, mask=cm, other=0.0),
                            tl.load(p1 + 2 * IP + cols, mask=cm, other=0.0), U1)
    w11, _c, _d = effective(tl.load(p1 + IP + cols, mask=cm, other=0.0),
                            tl.load(p1 + 3 * IP + cols, mask=cm, other=0.0), U1)
    p2 = l2_ptr + s * 12
    v0, _e, _f = effective(tl.load(p2 + 0), tl.load(p2 + 2), U2)
    v1, _g, _h = effective(tl.load(p2 + 1), tl.load(p2 + 3), U2)
    acc = tl.zeros((EB,), tl.float64)
    r0 = 0
    while r0 < n:
        rows = r0 + tl.arange(0, EB)
        r0 += EB
        rm = rows < n
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * I + cols[None, :], mask=rm[:, None] & cm[None, :], other=0.0)
        h0 = tl.sum(x * w10[None, :], 1)
        h1 = tl.sum(x * w11[None, :], 1)
        y, _f0, _f1 = forward2(h0, h1, v0, v1, U2, eps2)
        e = (y - tl.load(y_ptr + rows, mask=rm, other=0.0)).to(tl.float64)
        acc += tl.where(rm, e * e, 0.0)
    tl.store(out_ptr + s, tl.sum(acc, 0) / n.to(tl.float64))
