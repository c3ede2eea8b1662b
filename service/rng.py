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
  ``~/.cache/nalu-sweep``, see `service.native`) and called through ctypes; inside
  ``torch.compile`` it is the opaque op ``nalu_sweep::rng_uniform``.  ~0.3 ms for
  [100, 128, 100] on one thread (``torch.rand``: ~4.5 ms).
* Otherwise (CUDA, no C compiler, ``NALU_SWEEP_RNG_NATIVE=0`` or ``NALU_SWEEP_NATIVE=0``):
  the same function in int32 torch ops; fused by inductor/triton when compiled, in place
  when eager.

Training batches: `sample`
--------------------------
``sample(keys, counter, shape, intervals, row_sums)`` is ``uniform`` mapped onto a range
(a union of intervals, `map_to_intervals`, the formula of ``Range.from_uniform``) plus the
sums of runs of each row (the operands of the subset tasks). The C kernel does all three
in one pass, chunk by chunk in L1 (~0.4 ms for [100, 128, 100] with two sums, against
~1.2 ms for the draw, the map and two slice sums as separate torch passes); ``x`` is
bit-for-bit the torch formula, the sums are float32 in the kernel's own order. Inside
``torch.compile`` it is the op ``nalu_sweep::rng_sample``.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from service import native

__all__ = ["uniform", "uniform_into", "sample", "map_to_intervals", "native_available"]

_M1 = 0x7FEB352D
_M2 = 0x846CA68B - (1 << 32)  # as signed int32
_CG = 0x3C6EF372  # whitening constant of the increment word G
_CB = 0x1B873593  # whitening constant of the offset word B
_M3 = 0x9E3779B1 - (1 << 32)  # output multiplier (as signed int32)
_SCALE = 1.0 / 16777216.0  # 2**-24
_MAX_INTERVALS = 8  # NALU_MAX_INTERVALS of the kernel
_EAGER_BLOCK = 1 << 18  # elements per block of the eager torch-ops path

_ENV_NATIVE = "NALU_SWEEP_RNG_NATIVE"  # "0" forces the torch-ops path


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
#include <stddef.h>
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
#define NALU_MAX_INTERVALS 8
#define NALU_CHUNK 2048 /* numbers per chunk of `sample`: generated, mapped and summed in L1 */

/* x = s + lo[0] with s = u * total, then x = (s - off[k]) + lo[k] where s >= off[k], k >= 1:
   float32 with one rounding per operation, exactly `map_to_intervals` in torch. */
typedef struct { float total; int64_t n; float lo[NALU_MAX_INTERVALS]; float off[NALU_MAX_INTERVALS]; } nalu_map;

static inline uint32_t lb(uint32_t v) {
    v ^= v >> 16; v *= NALU_M1;
    v ^= v >> 15; v *= NALU_M2;
    v ^= v >> 16;
    return v;
}

static inline float map1(float u, const nalu_map *m) {
    if (!m) return u;
    const float s = u * m->total;
    float x = s + m->lo[0];
    for (int64_t k = 1; k < m->n; k++)
        if (s >= m->off[k]) x = (s - m->off[k]) + m->lo[k];
    return x;
}

/* o[i] for i in [from, to): element i of the stream (G, B), optionally mapped */
static void fill_portable(float *o, uint32_t g, uint32_t b, int64_t from, int64_t to, const nalu_map *m) {
    for (int64_t i = from; i < to; i++) {
        uint32_t x = lb(b + (uint32_t)i * g) * NALU_M3;
        x ^= x >> 16;
        o[i] = map1((float)(int32_t)(x >> 8) * NALU_SCALE, m);
    }
}

static void sums_portable(float *sums, const float *o, int64_t rows, int64_t cols,
                          int64_t K, const int64_t *starts, const int64_t *ends) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = o + r * cols;
        for (int64_t j = 0; j < K; j++) {
            float acc = 0.0f;
            for (int64_t i = starts[j]; i < ends[j]; i++) acc += row[i];
            sums[r * K + j] = acc;
        }
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
static inline __m256 map8(__m256 u, const nalu_map *m) {
    const __m256 s = _mm256_mul_ps(u, _mm256_set1_ps(m->total));
    __m256 x = _mm256_add_ps(s, _mm256_set1_ps(m->lo[0]));
    for (int64_t k = 1; k < m->n; k++) {
        const __m256 vo = _mm256_set1_ps(m->off[k]);
        const __m256 alt = _mm256_add_ps(_mm256_sub_ps(s, vo), _mm256_set1_ps(m->lo[k]));
        x = _mm256_blendv_ps(x, alt, _mm256_cmp_ps(s, vo, _CMP_GE_OQ));
    }
    return x;
}

__attribute__((target("avx2")))
static void fill_avx2(float *o, uint32_t g, uint32_t b, int64_t from, int64_t to, const nalu_map *m) {
    const __m256i m1 = _mm256_set1_epi32((int32_t)NALU_M1);
    const __m256i m2 = _mm256_set1_epi32((int32_t)NALU_M2);
    const __m256i m3 = _mm256_set1_epi32((int32_t)NALU_M3);
    const __m256 scale = _mm256_set1_ps(NALU_SCALE);
    /* two independent Weyl accumulators, lanes i .. i+7 and i+8 .. i+15 */
    __m256i x0 = _mm256_add_epi32(_mm256_set1_epi32((int32_t)(b + (uint32_t)from * g)),
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int32_t)g)));
    __m256i x1 = _mm256_add_epi32(x0, _mm256_set1_epi32((int32_t)(8u * g)));
    const __m256i step = _mm256_set1_epi32((int32_t)(16u * g));
    int64_t i = from;
    if (m && m->n == 1 && (m->total >= 1e-30f || m->total <= -1e-30f)) { /* one interval: x = u * total + lo, constants in registers */
        /* (k * 2^-24) * total == k * (2^-24 * total) exactly: both are k * total * 2^-24 rounded
           once, since scaling by a power of two is exact (total is checked to stay normal) */
        const __m256 vt = _mm256_set1_ps(m->total * NALU_SCALE), vl = _mm256_set1_ps(m->lo[0]);
        for (; i + 16 <= to; i += 16) {
            __m256i a = x0, c = x1;
            NALU_HASH8(a) NALU_HASH8(c)
            _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(a, 8)), vt), vl));
            _mm256_storeu_ps(o + i + 8, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c, 8)), vt), vl));
            x0 = _mm256_add_epi32(x0, step);
            x1 = _mm256_add_epi32(x1, step);
        }
    } else if (m) {
        const nalu_map mm = *m; /* a local copy: stores to o cannot alias it */
        for (; i + 16 <= to; i += 16) {
            __m256i a = x0, c = x1;
            NALU_HASH8(a) NALU_HASH8(c)
            _mm256_storeu_ps(o + i, map8(NALU_OUT8(a), &mm));
            _mm256_storeu_ps(o + i + 8, map8(NALU_OUT8(c), &mm));
            x0 = _mm256_add_epi32(x0, step);
            x1 = _mm256_add_epi32(x1, step);
        }
    } else {
        for (; i + 16 <= to; i += 16) {
            __m256i a = x0, c = x1;
            NALU_HASH8(a) NALU_HASH8(c)
            _mm256_storeu_ps(o + i, NALU_OUT8(a));
            _mm256_storeu_ps(o + i + 8, NALU_OUT8(c));
            x0 = _mm256_add_epi32(x0, step);
            x1 = _mm256_add_epi32(x1, step);
        }
    }
    fill_portable(o, g, b, i, to, m);
}

static const int32_t nalu_mask_tab[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

__attribute__((target("avx2")))
static inline float hsum_avx2(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

__attribute__((target("avx2")))
static inline __m256 run_sum8(const float *row, int64_t a, int64_t e) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = a;
    for (; i + 8 <= e; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(row + i));
    if (i < e) {
        const __m256i msk = _mm256_loadu_si256((const __m256i *)(nalu_mask_tab + 8 - (e - i)));
        acc = _mm256_add_ps(acc, _mm256_maskload_ps(row + i, msk));
    }
    return acc;
}

/* Row sums: 8 rows at a time, their 8 lane-accumulators reduced together (a transpose by
   horizontal adds), the rest row by row. */
__attribute__((target("avx2")))
static void sums_avx2(float *sums, const float *o, int64_t rows, int64_t cols,
                      int64_t K, const int64_t *starts, const int64_t *ends) {
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8) {
        const float *row = o + r * cols;
        for (int64_t j = 0; j < K; j++) {
            const int64_t a = starts[j], e = ends[j];
            const __m256 t0 = _mm256_hadd_ps(run_sum8(row, a, e), run_sum8(row + cols, a, e));
            const __m256 t1 = _mm256_hadd_ps(run_sum8(row + 2 * cols, a, e), run_sum8(row + 3 * cols, a, e));
            const __m256 t2 = _mm256_hadd_ps(run_sum8(row + 4 * cols, a, e), run_sum8(row + 5 * cols, a, e));
            const __m256 t3 = _mm256_hadd_ps(run_sum8(row + 6 * cols, a, e), run_sum8(row + 7 * cols, a, e));
            const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
            const __m256 v = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
            float tmp[8];
            _mm256_storeu_ps(tmp, v);
            for (int q = 0; q < 8; q++) sums[(r + q) * K + j] = tmp[q];
        }
    }
    for (; r < rows; r++) {
        const float *row = o + r * cols;
        for (int64_t j = 0; j < K; j++) sums[r * K + j] = hsum_avx2(run_sum8(row, starts[j], ends[j]));
    }
}

static int nalu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? 1 : 0;
}
#else
static int nalu_has_avx2(void) { return 0; }
#endif

int nalu_rng_isa(void) { return nalu_has_avx2(); }

static void stream_words(uint32_t k, int64_t counter, uint32_t *g, uint32_t *b) {
    const uint32_t lo = (uint32_t)(counter & 0x7FFFFFFF);
    const uint32_t hi = (uint32_t)((counter >> 31) & 0x7FFFFFFF);
    *g = lb(lb(lb(k ^ NALU_CG) + hi) ^ lo) | 1u;
    *b = lb(lb(lb(k ^ NALU_CB) + hi) ^ lo);
}

void nalu_rng_uniform(float *out, const int64_t *keys, int64_t S, int64_t counter, int64_t n) {
    const int avx2 = nalu_has_avx2();
    for (int64_t s = 0; s < S; s++) {
        uint32_t g, b;
        stream_words((uint32_t)keys[s], counter, &g, &b);
        float *o = out + s * n;
#ifdef NALU_X86
        if (avx2) { fill_avx2(o, g, b, 0, n, NULL); continue; }
#endif
        (void)avx2;
        fill_portable(o, g, b, 0, n, NULL);
    }
}

/* out [S, rows, cols]: the stream mapped onto the intervals; sums [S, rows, K]: sums of each
   row's runs [starts[j], ends[j]), computed chunk by chunk while the chunk is in L1. */
int nalu_rng_sample(float *out, const int64_t *keys, int64_t S, int64_t counter, int64_t rows, int64_t cols,
                    int64_t n_iv, const float *lo, const float *off, float total,
                    float *sums, int64_t K, const int64_t *starts, const int64_t *ends) {
    if (n_iv < 1 || n_iv > NALU_MAX_INTERVALS || cols < 1) return -1;
    nalu_map m;
    m.total = total; m.n = n_iv;
    for (int64_t k = 0; k < n_iv; k++) { m.lo[k] = lo[k]; m.off[k] = off[k]; }
    const int avx2 = nalu_has_avx2();
    const int64_t n = rows * cols;
    int64_t chunk_rows = cols >= NALU_CHUNK ? 1 : NALU_CHUNK / cols;
    if (chunk_rows > 8) chunk_rows -= chunk_rows % 8;  /* whole groups of 8 rows for the sums */
    for (int64_t s = 0; s < S; s++) {
        uint32_t g, b;
        stream_words((uint32_t)keys[s], counter, &g, &b);
        float *o = out + s * n;
        float *su = sums ? sums + s * rows * K : NULL;
        for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
            const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
#ifdef NALU_X86
            if (avx2) {
                fill_avx2(o, g, b, r0 * cols, r1 * cols, &m);
                if (K > 0) sums_avx2(su + r0 * K, o + r0 * cols, r1 - r0, cols, K, starts, ends);
                continue;
            }
#endif
            fill_portable(o, g, b, r0 * cols, r1 * cols, &m);
            if (K > 0) sums_portable(su + r0 * K, o + r0 * cols, r1 - r0, cols, K, starts, ends);
        }
    }
    (void)avx2;
    return 0;
}
"""

_lib_state: dict[str, object] = {}  # "fn", "sample": ctypes functions or None; "avx2"; "error"


def _setup(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.nalu_rng_uniform.restype = None
    lib.nalu_rng_uniform.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    lib.nalu_rng_sample.restype = ctypes.c_int
    lib.nalu_rng_sample.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
        ctypes.c_int64, ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_float), ctypes.c_float,
        ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64),
    ]
    return lib


def _lib() -> ctypes.CDLL | None:
    """The compiled kernel library, or None when it cannot be had (built once per process)."""
    if "lib" not in _lib_state:
        lib = native.load("rng", _C_SOURCE, _setup, env=_ENV_NATIVE)
        if lib is not None:
            _lib_state["avx2"] = bool(lib.nalu_rng_isa())
            _lib_state["fn"] = lib.nalu_rng_uniform
        else:
            _lib_state["fn"] = None
            _lib_state["error"] = native.errors.get("rng", "disabled")
        _lib_state["lib"] = lib
    return _lib_state["lib"]  # type: ignore[return-value]


def _native_fn():
    _lib()
    return _lib_state["fn"]


@torch.compiler.assume_constant_result
def native_available() -> bool:
    """Whether CPU draws use the compiled C kernel (builds it on first use)."""
    return _lib() is not None


def _fill_native(out: torch.Tensor, keys: torch.Tensor, counter: int, n: int) -> None:
    keys = keys.to(torch.int64).contiguous()
    _native_fn()(out.data_ptr(), keys.data_ptr(), keys.numel(), int(counter), n)


# The ops run inside compiled graphs. Declared with `torch.library.Library` (~6 µs a call)
# rather than `torch.library.custom_op` (~25 µs): they need no autograd and no Python-side
# argument processing.
OPS = torch.library.Library("nalu_sweep", "FRAGMENT")
OPS.define("rng_uniform(Tensor keys, Tensor counter, int n) -> Tensor")
OPS.define("rng_sample(Tensor keys, Tensor counter, int rows, int cols, float[] lows, float[] highs, "
           "int[] starts, int[] ends) -> (Tensor, Tensor)")


def _rng_uniform_op(keys: torch.Tensor, counter: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.empty(keys.shape[0], n, dtype=torch.float32)
    _fill_native(out, keys, int(counter), n)
    return out


OPS.impl("rng_uniform", _rng_uniform_op, "CPU")


@torch.library.register_fake("nalu_sweep::rng_uniform")
def _(keys: torch.Tensor, counter: torch.Tensor, n: int) -> torch.Tensor:
    return keys.new_empty((keys.shape[0], n), dtype=torch.float32)


# -- intervals and row sums -------------------------------------------------------------------
Intervals = tuple[tuple[float, float], ...]


def _interval_constants(intervals: Intervals) -> tuple[float, list[float], list[float]]:
    """(total length, lower ends, start offsets) as the float32 values the maps use."""
    lengths = [hi - lo for lo, hi in intervals]
    offsets, acc = [0.0], 0.0
    for length in lengths[:-1]:
        acc += length
        offsets.append(acc)
    return sum(lengths), [lo for lo, _ in intervals], offsets


def map_to_intervals(u: torch.Tensor, intervals: Intervals) -> torch.Tensor:
    """Map U[0, 1) numbers onto a union of disjoint intervals ``((lo, hi), ...)``, each
    getting its share of the total length: ``s = u · Σ lengths``, ``x = s + lo_0``, and
    ``x = (s − offset_k) + lo_k`` where ``s ≥ offset_k`` (``offset_k`` = the lengths before
    interval k). The native `sample` computes exactly these float operations."""
    if len(intervals) == 1:
        lo, hi = intervals[0]
        return u * (hi - lo) + lo
    total, lows, offsets = _interval_constants(intervals)
    s = u * total
    out = s + lows[0]
    for lo, offset in zip(lows[1:], offsets[1:]):
        out = torch.where(s >= offset, s - offset + lo, out)
    return out


@functools.lru_cache(maxsize=64)
def _sample_args(intervals: Intervals, runs: tuple[tuple[int, int], ...]) -> tuple:
    """The kernel's constant arguments for a range and its runs (ctypes arrays, cached)."""
    if len(intervals) > _MAX_INTERVALS:
        raise ValueError(f"sample: at most {_MAX_INTERVALS} intervals")
    total, lows, offsets = _interval_constants(intervals)
    k = len(runs)
    lo_arr = (ctypes.c_float * len(lows))(*lows)
    off_arr = (ctypes.c_float * len(offsets))(*offsets)
    starts = (ctypes.c_int64 * max(k, 1))(*[a for a, _ in runs])
    ends = (ctypes.c_int64 * max(k, 1))(*[e for _, e in runs])
    return len(lows), lo_arr, off_arr, total, k, starts, ends


def _sample_native(x: torch.Tensor, sums: torch.Tensor, keys: torch.Tensor, counter: int,
                   intervals: Intervals, runs: tuple[tuple[int, int], ...]) -> None:
    cols = x.shape[-1]
    n_iv, lo_arr, off_arr, total, k, starts, ends = _sample_args(intervals, runs)
    if keys.dtype != torch.int64 or not keys.is_contiguous():
        keys = keys.to(torch.int64).contiguous()
    _lib_state["lib"].nalu_rng_sample(
        x.data_ptr(), keys.data_ptr(), keys.shape[0], counter, x[0].numel() // cols, cols,
        n_iv, lo_arr, off_arr, total, sums.data_ptr() if k else None, k, starts, ends,
    )


def _rng_sample_op(keys: torch.Tensor, counter: torch.Tensor, rows: int, cols: int,
                   lows: list[float], highs: list[float], starts: list[int], ends: list[int]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.empty(keys.shape[0], rows, cols, dtype=torch.float32)
    sums = torch.empty(keys.shape[0], rows, len(starts), dtype=torch.float32)
    _sample_native(x, sums, keys, int(counter), tuple(zip(lows, highs)), tuple(zip(starts, ends)))
    return x, sums


OPS.impl("rng_sample", _rng_sample_op, "CPU")


@torch.library.register_fake("nalu_sweep::rng_sample")
def _(keys, counter, rows, cols, lows, highs, starts, ends):
    return (keys.new_empty((keys.shape[0], rows, cols), dtype=torch.float32),
            keys.new_empty((keys.shape[0], rows, len(starts)), dtype=torch.float32))


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


def sample(
    keys: torch.Tensor,
    counter: torch.Tensor | int,
    shape: tuple[int, ...],
    intervals: Intervals = ((0.0, 1.0),),
    row_sums: tuple[tuple[int, int], ...] = (),
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x = map_to_intervals(uniform(keys, counter, shape), intervals)`` (bit-for-bit) and the
    sums of runs of its last dimension: ``sums[..., j] = x[..., a_j:e_j].sum(-1)`` for
    ``row_sums = ((a_0, e_0), ...)``, shape ``[S, *shape[:-1], len(row_sums)]``.

    The native CPU kernel writes x and its sums in one pass (no U[0, 1) temporary, the sums
    while each row is in cache; the sums are float32 in the kernel's own order, so they may
    differ from torch's ``sum`` in the last bits). ``out = (x, sums)``: contiguous float32
    buffers to fill instead of allocating (eager only; ignored when compiling or off CPU).
    """
    if torch.compiler.is_compiling():  # dynamo traces the checks into constants
        shape, intervals, row_sums, rows, cols = _sample_plan.__wrapped__(shape, intervals, row_sums)
    else:
        try:
            shape, intervals, row_sums, rows, cols = _sample_plan(shape, intervals, row_sums)
        except TypeError:  # lists somewhere: not hashable
            shape, intervals, row_sums, rows, cols = _sample_plan.__wrapped__(shape, intervals, row_sums)
    S = keys.shape[0]
    n = rows * cols
    sums_shape = (S, *shape[:-1], len(row_sums))
    if (keys.device.type == "cpu" and S > 0 and n > 0 and len(intervals) <= _MAX_INTERVALS
            and native_available()):
        if torch.compiler.is_compiling():
            c = torch.as_tensor(counter, dtype=torch.int64)
            x, sums = torch.ops.nalu_sweep.rng_sample(
                keys, c, rows, cols, [lo for lo, _ in intervals], [hi for _, hi in intervals],
                [a for a, _ in row_sums], [e for _, e in row_sums])
            return x.view(S, *shape), sums.view(sums_shape)
        if out is not None and _usable_buffers(out, (S, *shape), sums_shape):
            x, sums = out
        else:
            x = torch.empty((S, *shape), dtype=torch.float32)
            sums = torch.empty(sums_shape, dtype=torch.float32)
        _sample_native(x, sums, keys, int(counter), intervals, row_sums)
        return x, sums
    x = map_to_intervals(uniform(keys, counter, shape), intervals)
    if row_sums:
        sums = torch.stack([x[..., a:e].sum(-1) for a, e in row_sums], -1)
    else:
        sums = x.new_empty(sums_shape)
    return x, sums


@functools.lru_cache(maxsize=256)
def _sample_plan(shape, intervals, row_sums) -> tuple:
    """Checked, normalised arguments of `sample`: (shape, intervals, row_sums, rows, cols)."""
    shape = tuple(int(d) for d in shape)
    intervals = tuple((float(lo), float(hi)) for lo, hi in intervals)
    row_sums = tuple((int(a), int(e)) for a, e in row_sums)
    if not shape:
        raise ValueError("sample: shape needs at least one dimension (the row)")
    if not intervals:
        raise ValueError("sample: at least one interval")
    cols = shape[-1]
    for a, e in row_sums:
        if not 0 <= a < e <= cols:
            raise ValueError(f"sample: row sum range [{a}, {e}) is not inside rows of {cols}")
    n = _numel(shape)
    if n >= 1 << 31:
        raise ValueError(f"sample: {n} numbers per seed is more than the 2**31 one stream holds")
    return shape, intervals, row_sums, (n // cols if cols else 0), cols


def _usable_buffers(out: tuple[torch.Tensor, torch.Tensor], x_shape: tuple[int, ...],
                    sums_shape: tuple[int, ...]) -> bool:
    return all(
        b.device.type == "cpu" and b.dtype == torch.float32 and b.is_contiguous() and tuple(b.shape) == shape
        for b, shape in zip(out, (x_shape, sums_shape))
    )
