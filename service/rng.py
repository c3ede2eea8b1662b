"""Counter-based uniform numbers, one independent stream per training seed.

``uniform(keys, counter, shape)`` is a pure function of (key, counter, element index): a
seed's data never depends on which other seeds share its batch, needs no generator state,
and is cheap on CPU or GPU, eager or inside ``torch.compile``.

The generator
-------------
32-bit wrapping arithmetic throughout; ``lb`` is the "lowbias32" integer hash
(xorshift-multiply, two multiplies, a bijection of the 32-bit words).

1. Per (key, counter), i.e. once per seed and call, two stream words, each from three
   ``lb`` rounds with its own whitening constant ``C_j``::

       hi, lo = (counter >> 31) & 0x7FFFFFFF, counter & 0x7FFFFFFF   (counters < 2**62)
       t_j    = lb(lb(lb(key ^ C_j) + hi) ^ lo)                       j in {G, B}
       G, B   = t_G | 1, t_B

   For a fixed key and ``hi``, B is a bijection of ``lo``: two steps of one seed never
   share a stream.  (G, B) has 63 bits: two (seed, counter) pairs share them with
   probability ~2**-63.
2. Element ``i`` (row-major over ``shape``) hashes a Weyl sequence with a random odd
   per-stream increment (the SplitMix construction, 32-bit)::

       x = lb(B + i * G) * M3;   x ^= x >> 16

   Adjacent elements differ at the hash input by a random odd G, not by 1; streams of
   other seeds or steps are other progressions, not shifted copies (that takes an equal G
   *and* an aligned B) nor permuted ones (as ``hash(i ^ key)`` streams are whenever two
   keys share their high bits).  The extra
   multiply-xorshift after ``lb`` removes the structure a bare ``lb`` keeps between
   inputs a small distance apart (visible in 2-D chi-square tests for rare increments
   such as G = 3); with it even G = 1, 3, 0x10001 pass those tests on 1e6-long streams.
3. Float: ``(x >> 8) * 2**-24``, exact; U[0, 1) with 24 random mantissa bits (0 possible,
   1 not).

Checked in ``tests/test_rng.py``: mean, variance and Kolmogorov-Smirnov on ~1e6 draws;
correlation between adjacent elements, adjacent seeds (keys k, k + 1) and adjacent steps
at the 1/sqrt(N) noise level, at counter 0, ~5e6 and with stream bits above 2**40.  A fast
hash for ML data, not a cryptographic generator; no stream is longer than 2**31 numbers.

Implementations, bit-for-bit identical
--------------------------------------
* CPU: a small C kernel (AVX2 when the CPU has it, else portable C) compiled once with the
  system C compiler (~1 s) into a per-user cache (``$NALU_SWEEP_CACHE`` or
  ``~/.cache/nalu-sweep``) and called through ctypes; inside ``torch.compile`` it is the
  opaque custom op ``nalu_sweep::rng_uniform``.  ~0.3 ms for [100, 128, 100] on one
  thread (``torch.rand``: ~4.5 ms).
* Otherwise (CUDA, no C compiler, or ``NALU_SWEEP_RNG_NATIVE=0``): the same function in
  int32 torch ops; fused by inductor/triton when compiled, in place when eager.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings

import torch

__all__ = ["uniform", "uniform_into", "native_available"]

_M1 = 0x7FEB352D
_M2 = 0x846CA68B - (1 << 32)  # as signed int32
_CG = 0x3C6EF372  # whitening constant of the increment word G
_CB = 0x1B873593  # whitening constant of the offset word B
_M3 = 0x9E3779B1 - (1 << 32)  # output multiplier (as signed int32)
_SCALE = 1.0 / 16777216.0  # 2**-24
_EAGER_BLOCK = 1 << 18  # elements per block of the eager torch-ops path

_ENV_NATIVE = "NALU_SWEEP_RNG_NATIVE"  # "0" forces the torch-ops path
_ENV_CACHE = "NALU_SWEEP_CACHE"  # where the compiled kernel is kept


# -- the torch-ops implementation (CUDA, fallback, reference) --------------------------------
def _lb(v: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int32 tensors; logical right shifts via masks."""
    v = v ^ ((v >> 16) & 0xFFFF)
    v = v * _M1
    v = v ^ ((v >> 15) & 0x1FFFF)
    v = v * _M2
    v = v ^ ((v >> 16) & 0xFFFF)
    return v


def _stream_words(keys: torch.Tensor, counter: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-seed increment G (odd) and offset B, int32 ``[S]`` each."""
    k = keys.to(torch.int32)
    lo = (counter & 0x7FFF_FFFF).to(torch.int32)
    hi = ((counter >> 31) & 0x7FFF_FFFF).to(torch.int32)
    t = torch.stack([k ^ _CG, k ^ _CB])  # [2, S]: both words in one pass
    t = _lb(_lb(_lb(t) + hi) ^ lo)
    return t[0] | 1, t[1]


def _uniform_torch(keys: torch.Tensor, counter: torch.Tensor, n: int) -> torch.Tensor:
    """``[S, n]`` by torch ops: functional when compiled; in place, in blocks of rows with
    one small scratch buffer, when eager (~3x faster than allocating per op)."""
    g, b = _stream_words(keys, counter)
    idx = torch.arange(n, dtype=torch.int32, device=keys.device)
    if torch.compiler.is_compiling():
        x = _lb(idx * g.unsqueeze(1) + b.unsqueeze(1)) * _M3
        x = x ^ ((x >> 16) & 0xFFFF)
        return ((x >> 8) & 0xFFFFFF).to(torch.float32) * _SCALE
    x = idx * g.unsqueeze(1)
    x += b.unsqueeze(1)
    block = _EAGER_BLOCK if x.device.type == "cpu" else x.numel()  # GPUs: one block
    rows = max(1, min(x.shape[0], block // max(n, 1)))
    scratch = torch.empty(rows * n, dtype=torch.int32, device=x.device)
    for r in range(0, x.shape[0], rows):
        xb = x[r:r + rows]
        t = scratch[: xb.numel()].view_as(xb)
        for shift, mask, mult in ((16, 0xFFFF, _M1), (15, 0x1FFFF, _M2), (16, 0xFFFF, _M3), (16, 0xFFFF, None)):
            torch.bitwise_right_shift(xb, shift, out=t)
            t &= mask
            xb ^= t
            if mult is not None:
                xb *= mult
        torch.bitwise_right_shift(xb, 8, out=t)
        t &= 0xFFFFFF
        xb.view(torch.float32).copy_(t)  # the floats take the place of their words
    out = x.view(torch.float32)
    out *= _SCALE
    return out


# -- the C kernel ----------------------------------------------------------------------------
_C_SOURCE = r"""
#include <stdint.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NALU_X86 1
#endif

#define NALU_M1 0x7FEB352Du
#define NALU_M2 0x846CA68Bu
#define NALU_CG 0x3C6EF372u
#define NALU_CB 0x1B873593u
#define NALU_M3 0x9E3779B1u
#define NALU_SCALE (1.0f / 16777216.0f)

static inline uint32_t lb(uint32_t v) {
    v ^= v >> 16; v *= NALU_M1;
    v ^= v >> 15; v *= NALU_M2;
    v ^= v >> 16;
    return v;
}

static void fill_portable(float *o, uint32_t g, uint32_t b, int64_t from, int64_t n) {
    for (int64_t i = from; i < n; i++) {
        uint32_t x = lb(b + (uint32_t)i * g) * NALU_M3;
        x ^= x >> 16;
        o[i] = (float)(int32_t)(x >> 8) * NALU_SCALE;
    }
}

#ifdef NALU_X86
#define NALU_HASH8(v) \
    v = _mm256_xor_si256(v, _mm256_srli_epi32(v, 16)); v = _mm256_mullo_epi32(v, m1); \
    v = _mm256_xor_si256(v, _mm256_srli_epi32(v, 15)); v = _mm256_mullo_epi32(v, m2); \
    v = _mm256_xor_si256(v, _mm256_srli_epi32(v, 16)); v = _mm256_mullo_epi32(v, m3); \
    v = _mm256_xor_si256(v, _mm256_srli_epi32(v, 16));
#define NALU_OUT8(v) _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 8)), scale)

__attribute__((target("avx2")))
static void fill_avx2(float *o, uint32_t g, uint32_t b, int64_t n) {
    const __m256i m1 = _mm256_set1_epi32((int32_t)NALU_M1);
    const __m256i m2 = _mm256_set1_epi32((int32_t)NALU_M2);
    const __m256i m3 = _mm256_set1_epi32((int32_t)NALU_M3);
    const __m256 scale = _mm256_set1_ps(NALU_SCALE);
    /* two independent Weyl accumulators, lanes i .. i+7 and i+8 .. i+15 */
    __m256i x0 = _mm256_add_epi32(_mm256_set1_epi32((int32_t)b),
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int32_t)g)));
    __m256i x1 = _mm256_add_epi32(x0, _mm256_set1_epi32((int32_t)(8u * g)));
    const __m256i step = _mm256_set1_epi32((int32_t)(16u * g));
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = x0, c = x1;
        NALU_HASH8(a) NALU_HASH8(c)
        _mm256_storeu_ps(o + i, NALU_OUT8(a));
        _mm256_storeu_ps(o + i + 8, NALU_OUT8(c));
        x0 = _mm256_add_epi32(x0, step);
        x1 = _mm256_add_epi32(x1, step);
    }
    if (i + 8 <= n) {
        NALU_HASH8(x0)
        _mm256_storeu_ps(o + i, NALU_OUT8(x0));
        i += 8;
    }
    fill_portable(o, g, b, i, n);
}

static int nalu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? 1 : 0;
}
#else
static int nalu_has_avx2(void) { return 0; }
#endif

int nalu_rng_isa(void) { return nalu_has_avx2(); }

void nalu_rng_uniform(float *out, const int64_t *keys, int64_t S, int64_t counter, int64_t n) {
    const int avx2 = nalu_has_avx2();
    const uint32_t lo = (uint32_t)(counter & 0x7FFFFFFF);
    const uint32_t hi = (uint32_t)((counter >> 31) & 0x7FFFFFFF);
    for (int64_t s = 0; s < S; s++) {
        const uint32_t k = (uint32_t)keys[s];
        const uint32_t g = lb(lb(lb(k ^ NALU_CG) + hi) ^ lo) | 1u;
        const uint32_t b = lb(lb(lb(k ^ NALU_CB) + hi) ^ lo);
        float *o = out + s * n;
#ifdef NALU_X86
        if (avx2) { fill_avx2(o, g, b, n); continue; }
#endif
        (void)avx2;
        fill_portable(o, g, b, 0, n);
    }
}
"""

_lib_lock = threading.Lock()
_lib_state: dict[str, object] = {}  # "fn": ctypes function or None, "error": why not


def _cache_dir() -> str:
    base = os.environ.get(_ENV_CACHE)
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "nalu-sweep")
    try:
        os.makedirs(base, exist_ok=True)
        if os.access(base, os.W_OK):
            return base
    except OSError:
        pass
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    base = os.path.join(tempfile.gettempdir(), f"nalu-sweep-{uid}")
    os.makedirs(base, exist_ok=True)
    return base


def _build() -> ctypes.CDLL:
    if sys.platform == "win32":
        raise RuntimeError("the native kernel is built with a Unix C compiler only")
    cc = shlex.split(os.environ.get("CC") or "") or [shutil.which("cc") or shutil.which("gcc") or "gcc"]
    if not shutil.which(cc[0]):
        raise RuntimeError(f"no C compiler {cc[0]!r} found (set CC)")
    flags = ["-O3", "-shared", "-fPIC"]  # portable: no -march=native; AVX2 is chosen at run time
    tag = hashlib.sha256("\0".join([_C_SOURCE, *cc, *flags, platform.machine()]).encode()).hexdigest()[:16]
    d = _cache_dir()
    so = os.path.join(d, f"rng-{tag}.so")
    if not os.path.exists(so):
        fd, src = tempfile.mkstemp(suffix=".c", dir=d)
        tmp_so = src[:-2] + ".so"
        try:
            with os.fdopen(fd, "w") as f:
                f.write(_C_SOURCE)
            proc = subprocess.run([*cc, *flags, src, "-o", tmp_so], capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"{cc[0]} failed: {proc.stderr.strip()[-2000:]}")
            os.replace(tmp_so, so)  # atomic: concurrent builders never see a partial file
        finally:
            for p in (src, tmp_so):
                if os.path.exists(p):
                    os.unlink(p)
    return ctypes.CDLL(so)


def _native_fn():
    """The ctypes kernel, or None when it cannot be had (built/loaded once per process)."""
    if "fn" in _lib_state:
        return _lib_state["fn"]
    with _lib_lock:
        if "fn" not in _lib_state:
            fn = None
            try:
                if os.environ.get(_ENV_NATIVE, "1") != "0":
                    lib = _build()
                    fn = lib.nalu_rng_uniform
                    fn.restype = None
                    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
                    _lib_state["avx2"] = bool(lib.nalu_rng_isa())
            except Exception as e:  # no compiler, read-only disk, exotic platform: torch ops
                _lib_state["error"] = repr(e)
                warnings.warn(f"service.rng: native CPU kernel unavailable, using torch ops ({e})", RuntimeWarning)
                fn = None
            _lib_state["fn"] = fn
    return _lib_state["fn"]


@torch.compiler.assume_constant_result
def native_available() -> bool:
    """Whether CPU draws use the compiled C kernel (builds it on first use)."""
    return _native_fn() is not None


def _fill_native(out: torch.Tensor, keys: torch.Tensor, counter: int, n: int) -> None:
    keys = keys.to(torch.int64).contiguous()
    _native_fn()(out.data_ptr(), keys.data_ptr(), keys.numel(), int(counter), n)


@torch.library.custom_op("nalu_sweep::rng_uniform", mutates_args=(), device_types="cpu")
def _rng_uniform_op(keys: torch.Tensor, counter: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.empty(keys.shape[0], n, dtype=torch.float32)
    _fill_native(out, keys, int(counter), n)
    return out


@_rng_uniform_op.register_fake
def _(keys: torch.Tensor, counter: torch.Tensor, n: int) -> torch.Tensor:
    return keys.new_empty((keys.shape[0], n), dtype=torch.float32)


# -- public API ------------------------------------------------------------------------------
def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def uniform(keys: torch.Tensor, counter: torch.Tensor | int, shape: tuple[int, ...]) -> torch.Tensor:
    """U[0, 1) float32 of shape ``[S, *shape]`` for per-seed ``keys`` ``[S]`` at ``counter``.

    ``counter`` is usually the training step (a 0-d int64 tensor so a compiled step is not
    re-traced), possibly with stream bits above 2**31; distinct (key, counter) pairs give
    independent-looking streams.  Row ``k`` depends only on ``keys[k]``, ``counter`` and
    ``shape``.
    """
    shape = tuple(int(d) for d in shape)
    n = _numel(shape)
    if n >= 1 << 31:
        raise ValueError(f"uniform: {n} numbers per seed is more than the 2**31 one stream holds")
    S = keys.shape[0]
    if keys.device.type == "cpu" and S > 0 and n > 0 and native_available():
        if torch.compiler.is_compiling():
            c = torch.as_tensor(counter, dtype=torch.int64)
            return torch.ops.nalu_sweep.rng_uniform(keys, c, n).view(S, *shape)
        out = torch.empty(S, n, dtype=torch.float32)
        _fill_native(out, keys, int(counter), n)
        return out.view(S, *shape)
    c = torch.as_tensor(counter, dtype=torch.int64, device=keys.device)
    return _uniform_torch(keys, c, n).view(S, *shape)


def uniform_into(out: torch.Tensor, keys: torch.Tensor, counter: torch.Tensor | int) -> torch.Tensor:
    """Write ``uniform(keys, counter, out.shape[1:])`` into ``out`` (float32 ``[S, ...]``) and
    return it; on CPU with the native kernel no temporary is allocated (eager only)."""
    if out.dtype != torch.float32 or out.shape[0] != keys.shape[0]:
        raise ValueError("uniform_into: out must be float32 with one row per key")
    n = _numel(tuple(out.shape[1:]))
    if (out.device.type == "cpu" and keys.device.type == "cpu" and out.is_contiguous()
            and n > 0 and not torch.compiler.is_compiling() and native_available()):
        _fill_native(out, keys, int(counter), n)
        return out
    out.copy_(uniform(keys, counter, tuple(out.shape[1:])))
    return out
