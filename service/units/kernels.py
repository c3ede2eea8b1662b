"""The two hot layers of the papers' models, with native CPU kernels (``service/native/units.c``)
and a torch fallback that adds in exactly the kernels' order.

**Linear, few outputs.** Every additive layer of the papers' models is narrow: ``W [S,
out, in]`` with ``out`` 1 or 2, applied to ``x [S, B, in]`` (``in`` = 100 on the arithmetic
task). ``torch.bmm`` spends ~3 µs of set-up per seed on such tiny matrices (~0.3 ms per
call at S = 100 on one CPU thread, forward and weight gradient alike); the kernel streams
over the rows instead. Each seed's numbers are computed from that seed's data alone,
whatever its batch mates. `linear(x, w)` takes this path for CPU float32 operands with
``out <= MAX_OUT``, else ``torch.matmul``; under ``torch.compile`` the kernel runs as the
opaque ops ``nalu_sweep::linear_fwd`` / ``linear_dw``.

**NMU with two inputs** (eager only: compiled graphs use the torch formula of
`service.units.nmu`). The ~10 small tensor operations of the forward and backward become
one call each (~0.35 → ~0.05 ms at S = 100); the forward does the same float operations as
the torch formula.

**Native and fallback give the same bits.** Where the kernels cannot be had (no C
compiler, a CPU without AVX2/FMA, ``NALU_SWEEP_NATIVE=0``) the same layers run as torch ops
in the kernels' order of additions (`service.native.ordered.lane_sum`, sequential sums;
products rounded before they are added, never fused), so a trial retried on a node without
a compiler continues the same trajectory. Orders (the C file says the same):

* linear forward: ``lane_sum`` over the inputs;
* linear weight gradient: sequential over the batch rows, from 0.0 (the kernel takes
  AVX-512 where the CPU has it: the same sums, one pass over the rows);
* linear input gradient (torch ops on both paths): sequential over the outputs;
* NMU weight gradient: ``lane_sum`` over the batch rows; input gradient: sequential over
  the outputs.
"""

from __future__ import annotations

import ctypes
import importlib

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from service import native
from service.native.ordered import lane_sum

# the GPU's products (`service.units.seed_matmul`): imported where CUDA is, so the custom
# operator is registered before any step is compiled, and a CPU install needs no Triton
seed_matmul = importlib.import_module("service.units.seed_matmul") if torch.cuda.is_available() else None

MAX_OUT = 4
"""Widest ``out`` the kernel takes: it passes over the rows once per pair of outputs, so from
~8 outputs on ``bmm`` is faster (measured at S = 100, B = 128, in = 100 and 8)."""

def _setup(lib: ctypes.CDLL) -> ctypes.CDLL:
    args = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 6
    for fn in (lib.nalu_linear_fwd, lib.nalu_linear_dw):
        fn.restype = ctypes.c_int
        fn.argtypes = args
    lib.nalu_units_isa.restype = ctypes.c_int  # 1 AVX2 + FMA, 2 AVX-512 too (0: no native layers)
    lib.nalu_units_force_isa.restype = None  # tests: cap the level (the same bits on each)
    lib.nalu_units_force_isa.argtypes = [ctypes.c_int]
    lib.nalu_nmu2_fwd.restype = None
    lib.nalu_nmu2_fwd.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 6
    lib.nalu_nmu2_bwd.restype = None
    lib.nalu_nmu2_bwd.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 6
    lib.nalu_sample_linear.restype = ctypes.c_int  # `service.units.sampled_linear`
    lib.nalu_sample_linear.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
        ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_float),
        ctypes.c_float, ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64),
        ctypes.POINTER(ctypes.c_int64),
    ]
    return lib


def _lib() -> ctypes.CDLL | None:
    return native.load("units", _setup)


def native_library() -> ctypes.CDLL | None:
    """The compiled ``service/native/units.c`` (built on first use), or None."""
    return _lib()


@native.compile_time_constant
def native_available() -> bool:
    """Whether `linear` can use the native kernel on this machine (builds it on first use;
    it needs AVX2 and FMA)."""
    lib = _lib()
    return lib is not None and bool(lib.nalu_linear_isa())


def _fwd_native(x: Tensor, w: Tensor) -> Tensor:
    S, B, I = x.shape
    O = w.shape[1]
    z = torch.empty(S, B, O, dtype=torch.float32)
    _lib().nalu_linear_fwd(z.data_ptr(), x.data_ptr(), w.data_ptr(), S, B, O, I, x.stride(0), x.stride(1))
    return z


def _dw_native(g: Tensor, x: Tensor) -> Tensor:
    S, B, I = x.shape
    O = g.shape[2]
    g = g.contiguous()
    dw = torch.empty(S, O, I, dtype=torch.float32)
    _lib().nalu_linear_dw(dw.data_ptr(), g.data_ptr(), x.data_ptr(), S, B, O, I, x.stride(0), x.stride(1))
    return dw


_FWD_CHUNK = 1 << 20  # accumulators per chunk of rows of the torch forward (bounds its memory)


def _fwd_torch(x: Tensor, w: Tensor) -> Tensor:
    """The kernel's forward in torch ops: ``lane_sum`` over the inputs of ``x · w``, the
    eight lanes accumulated group by group (no ``[S, B, O, I]`` product tensor)."""
    S, B, I = x.shape
    O = w.shape[1]
    full, rest = divmod(I, 8)

    def groups(t: Tensor) -> list[Tensor]:  # [..., I] -> views [..., 8] (the last one padded)
        out = list(t[..., :8 * full].unflatten(-1, (full, 8)).unbind(-2)) if full else []
        return out + ([F.pad(t[..., 8 * full:], (0, 8 - rest))] if rest else [])

    wg = [v.unsqueeze(1) for v in groups(w)]  # [S, 1, O, 8]
    rows = max(1, _FWD_CHUNK // max(1, S * O * 8))
    parts = []
    for b in range(0, B, rows):
        xg = [v.unsqueeze(2) for v in groups(x[:, b:b + rows])]  # [S, r, 1, 8]
        acc = xg[0] * wg[0] + 0.0  # [S, r, O, 8]; the kernels' lanes start from 0.0
        for xk, wk in zip(xg[1:], wg[1:]):
            acc = acc + xk * wk
        parts.append(lane_sum(acc))  # one group of eight: just the lane tree
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def _dw_torch(g: Tensor, x: Tensor) -> Tensor:
    """The kernel's weight gradient in torch ops: sequential over the rows, from 0.0."""
    gt = g.transpose(1, 2)  # [S, O, B]
    dw = x.new_zeros(x.shape[0], g.shape[2], x.shape[2])
    for b in range(x.shape[1]):
        dw = dw + gt[:, :, b:b + 1] * x[:, b:b + 1, :]
    return dw


def _dx(g: Tensor, w: Tensor) -> Tensor:
    """``g @ w`` (``[S, B, O] x [S, O, I]``), sequential over the few outputs: the same bits
    on every machine (a BLAS may pick its kernel, and so its order, by CPU)."""
    dx = g[:, :, 0:1] * w[:, 0:1, :]
    for o in range(1, w.shape[1]):
        dx = dx + g[:, :, o:o + 1] * w[:, o:o + 1, :]
    return dx


# Ops for compiled graphs, declared with `torch.library.Library` (a few µs a call, against
# ~25 µs for `torch.library.custom_op`); autograd is `_Linear`'s, around them.
OPS = torch.library.Library("nalu_sweep", "FRAGMENT")
OPS.define("linear_fwd(Tensor x, Tensor w) -> Tensor")
OPS.define("linear_dw(Tensor g, Tensor x) -> Tensor")
OPS.impl("linear_fwd", lambda x, w: _fwd_native(_rows_contiguous(x), w.contiguous()), "CPU")
OPS.impl("linear_dw", lambda g, x: _dw_native(g, _rows_contiguous(x)), "CPU")


@torch.library.register_fake("nalu_sweep::linear_fwd")
def _(x, w):
    return x.new_empty((x.shape[0], x.shape[1], w.shape[1]))


@torch.library.register_fake("nalu_sweep::linear_dw")
def _(g, x):
    return x.new_empty((x.shape[0], g.shape[2], x.shape[2]))


def _rows_contiguous(x: Tensor) -> Tensor:
    """``x`` itself when its rows are contiguous (any seed and row strides), else a copy."""
    if x.stride(-1) == 1 or x.shape[-1] == 1:
        return x
    return x.contiguous()


class _Linear(torch.autograd.Function):
    """``z = (w @ xᵀ)ᵀ`` and ``dw`` by the kernel, or by torch ops in its order when it
    cannot be had; ``dx`` by `_dx` on both paths."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor) -> Tensor:
        x = _rows_contiguous(x)
        ctx.save_for_backward(x, w)
        if not native_available():
            return _fwd_torch(x, w)
        if torch.compiler.is_compiling():
            return torch.ops.nalu_sweep.linear_fwd(x, w)
        return _fwd_native(x, w)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, Tensor | None]:
        x, w = ctx.saved_tensors
        gx = _dx(g, w) if ctx.needs_input_grad[0] else None
        gw = weight_gradient(g, x) if ctx.needs_input_grad[1] else None
        return gx, gw


def weight_gradient(g: Tensor, x: Tensor) -> Tensor:
    """`linear`'s weight gradient ``[S, O, I]`` for the gradient ``g [S, B, O]`` of its output
    and its input ``x`` (rows contiguous): by the kernel, or by torch ops in its order."""
    if not native_available():
        return _dw_torch(g, x)
    if torch.compiler.is_compiling():
        return torch.ops.nalu_sweep.linear_dw(g, x)
    return _dw_native(g, x)


def usable(x: Tensor, w: Tensor) -> bool:
    """Whether `linear` takes the kernel's path (the kernel, or torch ops in its order) for
    these operands; it does not depend on whether the kernel could be built."""
    return (
        x.device.type == "cpu" and w.device.type == "cpu"
        and x.dtype == torch.float32 and w.dtype == torch.float32
        and x.dim() == 3 and w.dim() == 3 and w.is_contiguous()
        and x.shape[0] == w.shape[0] and x.shape[2] == w.shape[2]
        and 1 <= w.shape[1] <= MAX_OUT and x.shape[1] >= 1 and x.shape[2] >= 1
    )


def seed_products(a: Tensor, b: Tensor) -> Tensor:
    """``a [S, M, K] @ b [S, K, N]``, a seed's numbers whatever its batch mates: on a GPU in
    float32 by `seed_matmul.seed_mm`, else ``torch.bmm``, whose products are the same for
    every batch of two seeds or more but not for one (on a CPU, ``[1, 10, 16] @ [1, 16,
    40]`` parted in the last bit from the same seed among others: an LSTM's ``w_hh``
    gradient), so one seed is computed as a batch of two and the copy dropped."""
    if seed_matmul is not None and seed_matmul.use_on(a, b):
        return torch.ops.nalu_sweep.seed_mm(a, b)
    if a.shape[0] == 1:
        return torch.bmm(a.expand(2, -1, -1), b.expand(2, -1, -1))[:1]
    return torch.bmm(a, b)


def row_sum(g: Tensor) -> Tensor:
    """``g [S, B, O]`` summed over its rows -> ``[S, O]``, each seed from its own rows in an
    order fixed by ``B`` alone: sequential from 0.0 on a CPU (the linear kernel's weight
    gradient against ones), by `seed_matmul.seed_mm` on a GPU. A plain ``g.sum(1)`` is
    what autograd does for a bias broadcast over the rows, and compiled, its reduction
    order followed the seed count (a one-seed MLP's bias parted from the same seed among 16
    by 7e-9 after 60 steps)."""
    if g.dtype != torch.float32:
        return g.sum(1)
    ones = g.new_ones(g.shape[0], g.shape[1], 1)
    if seed_matmul is not None and seed_matmul.use_on(g):
        return torch.ops.nalu_sweep.seed_mm(g.transpose(1, 2), ones)[..., 0]
    if g.device.type != "cpu":
        return g.sum(1)
    if not native_available():
        return _dw_torch(g, ones)[..., 0]
    if torch.compiler.is_compiling():
        return torch.ops.nalu_sweep.linear_dw(g, ones)[..., 0]
    return _dw_native(g, ones)[..., 0]


class _RowBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, b: Tensor) -> Tensor:
        return h + b.unsqueeze(1)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor, Tensor]:
        return g, row_sum(g)


class _PerRow(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p: Tensor, rows: int) -> Tensor:
        ctx.shape = p.shape
        return p.unsqueeze(1).expand(p.shape[0], rows, *p.shape[1:]).contiguous()

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor, None]:
        return row_sum(g.flatten(2)).view(ctx.shape), None


def per_row(p: Tensor, rows: int) -> Tensor:
    """``p [S, ...]`` as seen by each of ``rows`` batch rows, ``[S, 1 or rows, ...]``: on a
    GPU materialised, so that its gradient is summed over the rows by `row_sum` (a fixed
    order) instead of by the broadcast's reduction (an order set by the seed count)."""
    if p.is_cuda and p.dtype == torch.float32:
        return _PerRow.apply(p, rows)
    return p.unsqueeze(1)


def add_bias(h: Tensor, b: Tensor) -> Tensor:
    """``h [S, B, O] + b [S, O]`` (one bias per seed, broadcast over the rows), whose bias
    gradient is `row_sum`'s."""
    return _RowBias.apply(h, b)


def linear(x: Tensor, w: Tensor) -> Tensor:
    """``x [S, B, in]``, ``w [S, out, in]`` -> ``[S, B, out]``, by `_Linear` where `usable`,
    by `seed_products` on a GPU."""
    if usable(x, w):
        return _Linear.apply(x, w)
    if x.dim() == 3 and w.dim() == 3:
        if seed_matmul is not None and seed_matmul.use_on(x, w):
            return torch.ops.nalu_sweep.seed_mm(x, w.transpose(1, 2))
        if x.shape[0] == w.shape[0]:
            return seed_products(w, x.transpose(1, 2)).transpose(1, 2)
    return torch.matmul(w, x.transpose(-1, -2)).transpose(-1, -2)


# -- NMU with two inputs, eager CPU ------------------------------------------------------------
def nmu2_usable(x: Tensor, w: Tensor) -> bool:
    """Whether `nmu2` runs (natively, or by torch ops in the kernel's order): eager (inductor
    fuses the torch formula better), CPU float32, ``x [S, B, 2]``, contiguous ``w [S, out, 2]``.
    It does not depend on whether the kernel could be built."""
    return (
        not torch.compiler.is_compiling()
        and x.device.type == "cpu" and w.device.type == "cpu"
        and x.dtype == torch.float32 and w.dtype == torch.float32
        and x.dim() == 3 and w.dim() == 3 and w.is_contiguous()
        and x.shape[0] == w.shape[0] and x.shape[2] == 2 and w.shape[2] == 2
    )


def _nmu2_factors(x: Tensor, w: Tensor) -> tuple[Tensor, ...]:
    """``a, c`` (inputs minus 1, ``[S, B, 1]``), ``wa, wc`` (``[S, 1, O]``) and the factors
    ``fa = wa a + 1``, ``fc = wc c + 1`` (``[S, B, O]``)."""
    a, c = x[..., 0:1] - 1.0, x[..., 1:2] - 1.0
    wa, wc = w[..., 0].unsqueeze(1), w[..., 1].unsqueeze(1)
    return a, c, wa, wc, wa * a + 1.0, wc * c + 1.0


def _nmu2_bwd_torch(g: Tensor, x: Tensor, w: Tensor, need_gx: bool) -> tuple[Tensor | None, Tensor]:
    """`nalu_nmu2_bwd` in torch ops, in its order."""
    a, c, wa, wc, fa, fc = _nmu2_factors(x, w)
    ga, gc = g * fc, g * fa  # [S, B, O]
    gw = torch.stack([lane_sum(ga * a, 1), lane_sum(gc * c, 1)], -1)  # [S, O, 2]
    gx = None
    if need_gx:
        ta, tc = ga * wa, gc * wc
        gxa, gxc = ta[..., 0], tc[..., 0]
        for o in range(1, w.shape[1]):
            gxa, gxc = gxa + ta[..., o], gxc + tc[..., o]
        gx = torch.stack([gxa, gxc], -1)
    return gx, gw


class _NMU2(torch.autograd.Function):
    """`nmu2`: forward and both gradients (first order only) by the kernel, or by torch ops
    in its order."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor) -> Tensor:
        ctx.save_for_backward(x, w)
        if not native_available():
            *_, fa, fc = _nmu2_factors(x, w)
            return fa * fc
        S, B, _ = x.shape
        O = w.shape[1]
        z = torch.empty(S, B, O, dtype=torch.float32)
        _lib().nalu_nmu2_fwd(z.data_ptr(), x.data_ptr(), w.data_ptr(), S, B, O, *x.stride())
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, Tensor | None]:
        x, w = ctx.saved_tensors
        if not native_available():
            gx, gw = _nmu2_bwd_torch(g, x, w, ctx.needs_input_grad[0])
            return gx, (gw if ctx.needs_input_grad[1] else None)
        S, B, _ = x.shape
        O = w.shape[1]
        g = g.contiguous()
        gx = torch.empty(S, B, 2, dtype=torch.float32) if ctx.needs_input_grad[0] else None
        gw = torch.empty(S, O, 2, dtype=torch.float32)
        _lib().nalu_nmu2_bwd(gx.data_ptr() if gx is not None else None, gw.data_ptr(), g.data_ptr(),
                             x.data_ptr(), w.data_ptr(), S, B, O, *x.stride())
        return gx, (gw if ctx.needs_input_grad[1] else None)


def nmu2(x: Tensor, w: Tensor) -> Tensor:
    """``Π_i (w_oi (x_i − 1) + 1)`` over two inputs (see `nmu2_usable`)."""
    return _NMU2.apply(x, w)
