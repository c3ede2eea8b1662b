"""A native CPU kernel for the seed-batched linear map ``z = W x`` with few outputs.

Every additive layer of the papers' models is narrow: ``W [S, out, in]`` with ``out`` 1 or
2, applied to ``x [S, B, in]`` (``in`` = 100 on the arithmetic task). ``torch.bmm`` spends
~3 µs of set-up per seed on such tiny matrices (~0.3 ms per call at S = 100 on one CPU
thread, forward and weight gradient alike); this kernel streams over the rows instead
(~0.12 ms forward, ~0.15 ms weight gradient at S = 100).

The maths is that of ``torch.matmul`` in float32: only the order of the additions inside
each dot product differs (8-lane partial sums, then a fixed pairwise reduction), and each
seed's numbers are computed from that seed's data alone, whatever its batch mates.

`linear(x, w)` uses the kernel on CPU float32 tensors when it is built (see
`service.native`) and ``out`` is small, else ``torch.matmul``; under ``torch.compile`` the
kernel runs as the opaque custom ops ``nalu_sweep::linear_fwd`` / ``linear_dw``.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from service import native

MAX_OUT = 16
"""Widest ``out`` the kernel takes (it handles outputs in pairs; wider layers use bmm)."""

_C_SOURCE = r"""
#include <stdint.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

__attribute__((target("avx2,fma"))) static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

static const int32_t mask_tab[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

#define ACC4(c0, c1, load)                                                            \
    { __m256 x0 = load(r0 + k), x1 = load(r1 + k), x2 = load(r2 + k), x3 = load(r3 + k); \
      a00 = _mm256_fmadd_ps(x0, c0, a00); a01 = _mm256_fmadd_ps(x0, c1, a01);        \
      a10 = _mm256_fmadd_ps(x1, c0, a10); a11 = _mm256_fmadd_ps(x1, c1, a11);        \
      a20 = _mm256_fmadd_ps(x2, c0, a20); a21 = _mm256_fmadd_ps(x2, c1, a21);        \
      a30 = _mm256_fmadd_ps(x3, c0, a30); a31 = _mm256_fmadd_ps(x3, c1, a31); }
#define LOADU(p) _mm256_loadu_ps(p)
#define LOADM(p) _mm256_maskload_ps((p), tail)

/* z[s, b, o] = sum_i x[s, b, i] w[s, o, i]. x: rows of I contiguous floats, seed stride xs
   (0 for an evaluation set shared by all seeds), row stride xr; w, z contiguous. */
__attribute__((target("avx2,fma")))
static void fwd_avx2(float *z, const float *x, const float *w, int64_t S, int64_t B, int64_t O,
                     int64_t I, int64_t xs, int64_t xr) {
    const int64_t nv = I / 8, rem = I % 8;
    const __m256i tail = _mm256_loadu_si256((const __m256i *)(mask_tab + 8 - rem));
    for (int64_t s = 0; s < S; s++) {
        const float *xsd = x + s * xs, *ws = w + s * O * I;
        float *zs = z + s * B * O;
        for (int64_t o0 = 0; o0 < O; o0 += 2) {
            const int two = o0 + 1 < O;
            const float *w0 = ws + o0 * I, *w1 = ws + (o0 + two) * I;
            int64_t b = 0;
            for (; b + 4 <= B; b += 4) {  /* 4 rows x 2 outputs: 8 independent accumulators */
                const float *r0 = xsd + b * xr, *r1 = r0 + xr, *r2 = r1 + xr, *r3 = r2 + xr;
                __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
                __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
                int64_t k = 0;
                for (int64_t v = 0; v < nv; v++, k += 8) {
                    const __m256 c0 = _mm256_loadu_ps(w0 + k), c1 = _mm256_loadu_ps(w1 + k);
                    ACC4(c0, c1, LOADU)
                }
                if (rem) {
                    const __m256 c0 = LOADM(w0 + k), c1 = LOADM(w1 + k);
                    ACC4(c0, c1, LOADM)
                }
                float *zb = zs + b * O + o0;
                zb[0] = hsum8(a00); zb[O] = hsum8(a10); zb[2 * O] = hsum8(a20); zb[3 * O] = hsum8(a30);
                if (two) {
                    zb[1] = hsum8(a01); zb[O + 1] = hsum8(a11); zb[2 * O + 1] = hsum8(a21); zb[3 * O + 1] = hsum8(a31);
                }
            }
            for (; b < B; b++) {
                const float *r0 = xsd + b * xr;
                __m256 a00 = _mm256_setzero_ps(), a01 = a00;
                int64_t k = 0;
                for (int64_t v = 0; v < nv; v++, k += 8) {
                    const __m256 x0 = _mm256_loadu_ps(r0 + k);
                    a00 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w0 + k), a00);
                    a01 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w1 + k), a01);
                }
                if (rem) {
                    const __m256 x0 = LOADM(r0 + k);
                    a00 = _mm256_fmadd_ps(x0, LOADM(w0 + k), a00);
                    a01 = _mm256_fmadd_ps(x0, LOADM(w1 + k), a01);
                }
                zs[b * O + o0] = hsum8(a00);
                if (two) zs[b * O + o0 + 1] = hsum8(a01);
            }
        }
    }
}

/* One block of NV column vectors (the last one masked when has_tail) of two output rows,
   accumulated over all B rows in registers. */
__attribute__((target("avx2,fma"), always_inline)) static inline void dw_block(
        float *d0, float *d1, const float *g, const float *xb, int64_t B, int64_t O, int64_t xr,
        int two, const int NV, int has_tail, __m256i tail) {
    __m256 a0[6], a1[6];
    const int full = NV - has_tail;
    for (int j = 0; j < NV; j++) { a0[j] = _mm256_setzero_ps(); a1[j] = _mm256_setzero_ps(); }
    for (int64_t b = 0; b < B; b++) {
        const float *r = xb + b * xr;
        const __m256 g0 = _mm256_set1_ps(g[b * O]);
        const __m256 g1 = _mm256_set1_ps(two ? g[b * O + 1] : 0.0f);
        for (int j = 0; j < NV; j++) {
            const __m256 xv = j < full ? _mm256_loadu_ps(r + 8 * j) : _mm256_maskload_ps(r + 8 * j, tail);
            a0[j] = _mm256_fmadd_ps(g0, xv, a0[j]);
            a1[j] = _mm256_fmadd_ps(g1, xv, a1[j]);
        }
    }
    for (int j = 0; j < NV; j++) {
        if (j < full) {
            _mm256_storeu_ps(d0 + 8 * j, a0[j]);
            if (two) _mm256_storeu_ps(d1 + 8 * j, a1[j]);
        } else {
            _mm256_maskstore_ps(d0 + 8 * j, tail, a0[j]);
            if (two) _mm256_maskstore_ps(d1 + 8 * j, tail, a1[j]);
        }
    }
}

/* dw[s, o, i] = sum_b g[s, b, o] x[s, b, i]; g contiguous [S, B, O]. */
__attribute__((target("avx2,fma")))
static void dw_avx2(float *dw, const float *g, const float *x, int64_t S, int64_t B, int64_t O,
                    int64_t I, int64_t xs, int64_t xr) {
    const int64_t nvt = (I + 7) / 8, rem = I % 8;
    const __m256i tail = _mm256_loadu_si256((const __m256i *)(mask_tab + 8 - (rem ? rem : 8)));
    for (int64_t s = 0; s < S; s++) {
        const float *xsd = x + s * xs, *gs = g + s * B * O;
        float *dws = dw + s * O * I;
        for (int64_t o0 = 0; o0 < O; o0 += 2) {
            const int two = o0 + 1 < O;
            for (int64_t v0 = 0; v0 < nvt; v0 += 6) {
                const int64_t nv = nvt - v0 < 6 ? nvt - v0 : 6;
                const int ht = v0 + nv == nvt && rem;
                float *e0 = dws + o0 * I + v0 * 8, *e1 = dws + (o0 + two) * I + v0 * 8;
                const float *xb = xsd + v0 * 8, *go = gs + o0;
                switch (nv) {
                case 6: dw_block(e0, e1, go, xb, B, O, xr, two, 6, ht, tail); break;
                case 5: dw_block(e0, e1, go, xb, B, O, xr, two, 5, ht, tail); break;
                case 4: dw_block(e0, e1, go, xb, B, O, xr, two, 4, ht, tail); break;
                case 3: dw_block(e0, e1, go, xb, B, O, xr, two, 3, ht, tail); break;
                case 2: dw_block(e0, e1, go, xb, B, O, xr, two, 2, ht, tail); break;
                default: dw_block(e0, e1, go, xb, B, O, xr, two, 1, ht, tail); break;
                }
            }
        }
    }
}

static int has_avx2_fma(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#else
static int has_avx2_fma(void) { return 0; }
#endif

/* Both return 0 when done, -1 when the CPU lacks AVX2/FMA (the caller then uses torch). */
int nalu_linear_fwd(float *z, const float *x, const float *w, int64_t S, int64_t B, int64_t O,
                    int64_t I, int64_t xs, int64_t xr) {
#if defined(__x86_64__) || defined(__i386__)
    if (has_avx2_fma()) { fwd_avx2(z, x, w, S, B, O, I, xs, xr); return 0; }
#endif
    return -1;
}

int nalu_linear_dw(float *dw, const float *g, const float *x, int64_t S, int64_t B, int64_t O,
                   int64_t I, int64_t xs, int64_t xr) {
#if defined(__x86_64__) || defined(__i386__)
    if (has_avx2_fma()) { dw_avx2(dw, g, x, S, B, O, I, xs, xr); return 0; }
#endif
    return -1;
}

int nalu_linear_isa(void) { return has_avx2_fma(); }
"""


def _setup(lib: ctypes.CDLL) -> ctypes.CDLL | None:
    args = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 6
    for fn in (lib.nalu_linear_fwd, lib.nalu_linear_dw):
        fn.restype = ctypes.c_int
        fn.argtypes = args
    return lib if lib.nalu_linear_isa() else None  # no AVX2/FMA: torch is as good


def _lib() -> ctypes.CDLL | None:
    return native.load("linear", _C_SOURCE, _setup)


@torch.compiler.assume_constant_result
def native_available() -> bool:
    """Whether `linear` can use the native kernel on this machine (builds it on first use)."""
    return _lib() is not None


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


@torch.library.custom_op("nalu_sweep::linear_fwd", mutates_args=(), device_types="cpu")
def _linear_fwd_op(x: Tensor, w: Tensor) -> Tensor:
    return _fwd_native(_rows_contiguous(x), w.contiguous())


@_linear_fwd_op.register_fake
def _(x, w):
    return x.new_empty((x.shape[0], x.shape[1], w.shape[1]))


@torch.library.custom_op("nalu_sweep::linear_dw", mutates_args=(), device_types="cpu")
def _linear_dw_op(g: Tensor, x: Tensor) -> Tensor:
    return _dw_native(g, _rows_contiguous(x))


@_linear_dw_op.register_fake
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
