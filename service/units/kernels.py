"""Native CPU kernels for the two hot layers of the papers' models.

**Linear, few outputs.** Every additive layer of the papers' models is narrow: ``W [S,
out, in]`` with ``out`` 1 or 2, applied to ``x [S, B, in]`` (``in`` = 100 on the arithmetic
task). ``torch.bmm`` spends ~3 µs of set-up per seed on such tiny matrices (~0.3 ms per
call at S = 100 on one CPU thread, forward and weight gradient alike); this kernel
streams over the rows instead (~0.12 ms forward, ~0.15 ms weight gradient at S = 100).
The maths is that of ``torch.matmul`` in float32: only the order of the additions inside
each dot product differs (8-lane partial sums, then a fixed pairwise reduction), and each
seed's numbers are computed from that seed's data alone, whatever its batch mates.
`linear(x, w)` uses it on CPU float32 tensors when it is built (see `service.native`; it
needs AVX2 and FMA) and ``out`` is small, else ``torch.matmul``; under ``torch.compile``
it runs as the opaque ops ``nalu_sweep::linear_fwd`` / ``linear_dw``.

**NMU with two inputs** (eager only: inductor fuses the torch formula just as well). The
~10 small tensor operations of the forward and backward become one call each (~0.35 →
~0.05 ms at S = 100); the forward does the same float operations as the torch formula, so
its outputs are identical.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from service import native

MAX_OUT = 4
"""Widest ``out`` the kernel takes: it passes over the rows once per pair of outputs, so from
~8 outputs on ``bmm`` is faster (measured at S = 100, B = 128, in = 100 and 8)."""

def _setup(lib: ctypes.CDLL) -> ctypes.CDLL:
    args = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 6
    for fn in (lib.nalu_linear_fwd, lib.nalu_linear_dw):
        fn.restype = ctypes.c_int
        fn.argtypes = args
    lib.nalu_nmu2_fwd.restype = None
    lib.nalu_nmu2_fwd.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 6
    lib.nalu_nmu2_bwd.restype = None
    lib.nalu_nmu2_bwd.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 6
    return lib


def _lib() -> ctypes.CDLL | None:
    return native.load("units", _setup)


@torch.compiler.assume_constant_result
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


# Ops for compiled graphs, declared with `torch.library.Library` (a few µs a call, against
# ~25 µs for `torch.library.custom_op`); autograd is `_NativeLinear`'s, around them.
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


class _NativeLinear(torch.autograd.Function):
    """``z = (w @ xᵀ)ᵀ`` by the kernel; gradients: ``dw`` by the kernel, ``dx = g @ w``."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor) -> Tensor:
        x = _rows_contiguous(x)
        ctx.save_for_backward(x, w)
        if torch.compiler.is_compiling():
            return torch.ops.nalu_sweep.linear_fwd(x, w)
        return _fwd_native(x, w)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, Tensor | None]:
        x, w = ctx.saved_tensors
        gx = torch.matmul(g, w) if ctx.needs_input_grad[0] else None
        gw = None
        if ctx.needs_input_grad[1]:
            if torch.compiler.is_compiling():
                gw = torch.ops.nalu_sweep.linear_dw(g, x)
            else:
                gw = _dw_native(g, x)
        return gx, gw


def usable(x: Tensor, w: Tensor) -> bool:
    """Whether `linear` takes the native path for these operands."""
    return (
        x.device.type == "cpu" and w.device.type == "cpu"
        and x.dtype == torch.float32 and w.dtype == torch.float32
        and x.dim() == 3 and w.dim() == 3 and w.is_contiguous()
        and x.shape[0] == w.shape[0] and x.shape[2] == w.shape[2]
        and 1 <= w.shape[1] <= MAX_OUT and x.shape[1] >= 1 and x.shape[2] >= 1
        and native_available()
    )


def linear(x: Tensor, w: Tensor) -> Tensor:
    """``x [S, B, in]``, ``w [S, out, in]`` -> ``[S, B, out]``, natively where `usable`."""
    if usable(x, w):
        return _NativeLinear.apply(x, w)
    return torch.matmul(w, x.transpose(-1, -2)).transpose(-1, -2)


# -- NMU with two inputs, eager CPU ------------------------------------------------------------
def nmu2_usable(x: Tensor, w: Tensor) -> bool:
    """Whether `nmu2` runs natively: eager (inductor fuses the torch formula better), CPU
    float32, ``x [S, B, 2]``, contiguous ``w [S, out, 2]``."""
    return (
        not torch.compiler.is_compiling()
        and x.device.type == "cpu" and w.device.type == "cpu"
        and x.dtype == torch.float32 and w.dtype == torch.float32
        and x.dim() == 3 and w.dim() == 3 and w.is_contiguous()
        and x.shape[0] == w.shape[0] and x.shape[2] == 2 and w.shape[2] == 2
        and _lib() is not None
    )


class _NativeNMU2(torch.autograd.Function):
    """`nmu2` by the kernel: forward and both gradients (first order only)."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor) -> Tensor:
        S, B, _ = x.shape
        O = w.shape[1]
        z = torch.empty(S, B, O, dtype=torch.float32)
        _lib().nalu_nmu2_fwd(z.data_ptr(), x.data_ptr(), w.data_ptr(), S, B, O, *x.stride())
        ctx.save_for_backward(x, w)
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, Tensor | None]:
        x, w = ctx.saved_tensors
        S, B, _ = x.shape
        O = w.shape[1]
        g = g.contiguous()
        gx = torch.empty(S, B, 2, dtype=torch.float32) if ctx.needs_input_grad[0] else None
        gw = torch.empty(S, O, 2, dtype=torch.float32)
        _lib().nalu_nmu2_bwd(gx.data_ptr() if gx is not None else None, gw.data_ptr(), g.data_ptr(),
                             x.data_ptr(), w.data_ptr(), S, B, O, *x.stride())
        return gx, (gw if ctx.needs_input_grad[1] else None)


def nmu2(x: Tensor, w: Tensor) -> Tensor:
    """``Π_i (w_oi (x_i − 1) + 1)`` over two inputs by the native kernel (see `nmu2_usable`)."""
    return _NativeNMU2.apply(x, w)
