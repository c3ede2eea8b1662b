/* Native CPU kernels of `service.units.kernels`: narrow linear layers and the two-input NMU.

   Every sum is added in an order the torch fallback of `service.units.kernels` repeats
   exactly (no FMA: a product is rounded, then added; -ffp-contract=off), so a run with and
   without these kernels gives the same bits:
   - linear forward, over the inputs: `lane_sum` (eight lanes i mod 8, sequential from 0.0f,
     then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)));
   - linear weight gradient, over the batch rows: sequential from 0.0f (AVX-512 where the
     CPU has it: one pass over each seed's rows, sixteen columns a vector; the same sums);
   - NMU weight gradient, over the batch rows: `lane_sum`; its input gradient, over the
     outputs: sequential from the first term. */
#include <stdint.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)) */
__attribute__((target("avx2,fma"))) static inline float hsum8(__m256 v) {
    const __m256 t = _mm256_hadd_ps(v, v);
    const __m256 u = _mm256_hadd_ps(t, t);
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)));
}

/* acc + a * b with the product rounded first (never fused) */
#define MADD(a, b, acc) _mm256_add_ps((acc), _mm256_mul_ps((a), (b)))

static const int32_t mask_tab[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

#define ACC4(c0, c1, load)                                                            \
    { __m256 x0 = load(r0 + k), x1 = load(r1 + k), x2 = load(r2 + k), x3 = load(r3 + k); \
      a00 = MADD(x0, c0, a00); a01 = MADD(x0, c1, a01);        \
      a10 = MADD(x1, c0, a10); a11 = MADD(x1, c1, a11);        \
      a20 = MADD(x2, c0, a20); a21 = MADD(x2, c1, a21);        \
      a30 = MADD(x3, c0, a30); a31 = MADD(x3, c1, a31); }
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
            /* an evaluation set shared by every seed (xs == 0; compute-bound, x stays in L1)
               reduces the 8 dot products of a block at once (below) and takes the last rows
               through the same block code (repeating the last row), so every row's number is
               the same whatever the row count, i.e. whatever the evaluation chunk */
            const int shared = xs == 0 && two;
            int64_t b = 0;
            for (; b + 4 <= B || (shared && b < B); b += 4) {  /* 4 rows x 2 outputs: 8 accumulators */
                const float *r0 = xsd + b * xr;
                const float *r1 = xsd + (b + 1 < B ? b + 1 : B - 1) * xr;
                const float *r2 = xsd + (b + 2 < B ? b + 2 : B - 1) * xr;
                const float *r3 = xsd + (b + 3 < B ? b + 3 : B - 1) * xr;
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
                if (shared || two) {
                    /* horizontal adds transpose-reduce the 8 accumulators into
                       [z(b, o0), z(b, o0 + 1), z(b + 1, o0), ..., z(b + 3, o0 + 1)]: each one
                       the same tree as hsum8's, a quarter of the instructions */
                    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a00, a01), _mm256_hadd_ps(a10, a11));
                    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a20, a21), _mm256_hadd_ps(a30, a31));
                    float t[8];
                    _mm256_storeu_ps(t, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                                                      _mm256_permute2f128_ps(u0, u1, 0x31)));
                    for (int r = 0; r < 4 && b + r < B; r++) { zb[r * O] = t[2 * r]; zb[r * O + 1] = t[2 * r + 1]; }
                    continue;
                }
                zb[0] = hsum8(a00); zb[O] = hsum8(a10); zb[2 * O] = hsum8(a20); zb[3 * O] = hsum8(a30);
            }
            for (; b < B; b++) {
                const float *r0 = xsd + b * xr;
                __m256 a00 = _mm256_setzero_ps(), a01 = a00;
                int64_t k = 0;
                for (int64_t v = 0; v < nv; v++, k += 8) {
                    const __m256 x0 = _mm256_loadu_ps(r0 + k);
                    a00 = MADD(x0, _mm256_loadu_ps(w0 + k), a00);
                    a01 = MADD(x0, _mm256_loadu_ps(w1 + k), a01);
                }
                if (rem) {
                    const __m256 x0 = LOADM(r0 + k);
                    a00 = MADD(x0, LOADM(w0 + k), a00);
                    a01 = MADD(x0, LOADM(w1 + k), a01);
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
            a0[j] = MADD(g0, xv, a0[j]);
            a1[j] = MADD(g1, xv, a1[j]);
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

/* The weight gradient in 512-bit vectors: up to DWZ_MAX vectors of columns of two output rows
   held in 2 * DWZ_MAX registers while the batch rows stream by once, in order (dw_avx2 passes
   over a seed's rows once per 48 columns, which at many seeds reads a batch that no longer
   fits in the cache from memory several times). Each element is the same sequential sum. */
#define DWZ_MAX 12

__attribute__((target("avx512f"), always_inline)) static inline void dwz_block(
        float *d0, float *d1, const float *g, const float *xb, int64_t B, int64_t O, int64_t xr,
        int two, const int NV, __mmask16 tail) {
    __m512 a0[DWZ_MAX], a1[DWZ_MAX];
    for (int j = 0; j < NV; j++) { a0[j] = _mm512_setzero_ps(); a1[j] = _mm512_setzero_ps(); }
    for (int64_t b = 0; b < B; b++) {
        const float *r = xb + b * xr;
        const __m512 g0 = _mm512_set1_ps(g[b * O]);
        const __m512 g1 = _mm512_set1_ps(two ? g[b * O + 1] : 0.0f);
        for (int j = 0; j < NV; j++) {
            const __m512 xv = j < NV - 1 ? _mm512_loadu_ps(r + 16 * j) : _mm512_maskz_loadu_ps(tail, r + 16 * j);
            a0[j] = _mm512_add_ps(a0[j], _mm512_mul_ps(g0, xv));  /* rounded product, then the sum */
            a1[j] = _mm512_add_ps(a1[j], _mm512_mul_ps(g1, xv));
        }
    }
    for (int j = 0; j < NV; j++) {
        const __mmask16 m = j < NV - 1 ? (__mmask16)0xFFFF : tail;
        _mm512_mask_storeu_ps(d0 + 16 * j, m, a0[j]);
        if (two) _mm512_mask_storeu_ps(d1 + 16 * j, m, a1[j]);
    }
}

__attribute__((target("avx512f")))
static void dw_avx512(float *dw, const float *g, const float *x, int64_t S, int64_t B, int64_t O,
                      int64_t I, int64_t xs, int64_t xr) {
    for (int64_t s = 0; s < S; s++) {
        const float *xsd = x + s * xs, *gs = g + s * B * O;
        float *dws = dw + s * O * I;
        for (int64_t o0 = 0; o0 < O; o0 += 2) {
            const int two = o0 + 1 < O;
            for (int64_t c0 = 0; c0 < I; c0 += 16 * DWZ_MAX) {
                const int64_t width = I - c0 < 16 * DWZ_MAX ? I - c0 : 16 * DWZ_MAX;
                const int nv = (int)((width + 15) / 16);
                const __mmask16 tail = (__mmask16)((1u << (width - 16 * (nv - 1))) - 1u);
                float *e0 = dws + o0 * I + c0, *e1 = dws + (o0 + two) * I + c0;
                const float *xb = xsd + c0, *go = gs + o0;
                switch (nv) {
#define NALU_DWZ(n) case n: dwz_block(e0, e1, go, xb, B, O, xr, two, n, tail); break;
                NALU_DWZ(12) NALU_DWZ(11) NALU_DWZ(10) NALU_DWZ(9) NALU_DWZ(8) NALU_DWZ(7)
                NALU_DWZ(6) NALU_DWZ(5) NALU_DWZ(4) NALU_DWZ(3) NALU_DWZ(2)
#undef NALU_DWZ
                default: dwz_block(e0, e1, go, xb, B, O, xr, two, 1, tail); break;
                }
            }
        }
    }
}

static int has_avx2_fma(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

static int has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}
#else
static int has_avx2_fma(void) { return 0; }
static int has_avx512(void) { return 0; }
#endif

static int units_cap = 2;

/* 1: AVX2 and FMA, 2: AVX-512 as well (the best the CPU has, at most the cap); 0: neither */
static int units_level(void) {
    if (!has_avx2_fma()) return 0;
    const int best = has_avx512() ? 2 : 1;
    return best < units_cap ? best : units_cap;
}

/* tests: cap the kernels' level (1 AVX2, 2 no cap); every level gives the same bits */
void nalu_units_force_isa(int level) { units_cap = level < 1 ? 1 : level > 2 ? 2 : level; }

int nalu_units_isa(void) { return units_level(); }

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
    const int level = units_level();
    if (level >= 2) { dw_avx512(dw, g, x, S, B, O, I, xs, xr); return 0; }
    if (level == 1) { dw_avx2(dw, g, x, S, B, O, I, xs, xr); return 0; }
#endif
    return -1;
}

int nalu_linear_isa(void) { return has_avx2_fma(); }

/* `nalu_rng_sample` of philox.c (its library hands its address over: this file never draws) */
typedef int (*nalu_draw_fn)(float *, const int64_t *, int64_t, int64_t, int64_t, int64_t, int64_t,
                            const float *, const float *, float, float *, int64_t, const int64_t *,
                            const int64_t *);

/* The training batch drawn and the first linear layer applied, `tile` seeds at a time: each
   tile's batch x [tile, rows, cols] is drawn by `draw` (the arguments after x are its own),
   then z = x w^T computed by nalu_linear_fwd's code while that tile is still in cache. The
   same per-seed routines as drawing every seed first and then applying the layer, so the
   same bits; at many seeds the layer no longer reads the whole batch back from memory.
   w [S, O, cols], z [S, rows, O] contiguous. 0 when done, -1 without AVX2/FMA. */
int nalu_sample_linear(void *draw_fn, int64_t tile, float *z, const float *w, int64_t O,
                       float *x, const int64_t *keys, int64_t S, int64_t counter, int64_t rows,
                       int64_t cols, int64_t n_iv, const float *lo, const float *off, float total,
                       float *sums, int64_t K, const int64_t *starts, const int64_t *ends) {
#if defined(__x86_64__) || defined(__i386__)
    if (!has_avx2_fma() || tile < 1) return -1;
    const nalu_draw_fn draw = (nalu_draw_fn)draw_fn;
    const int64_t n = rows * cols;
    for (int64_t s0 = 0; s0 < S; s0 += tile) {
        const int64_t t = S - s0 < tile ? S - s0 : tile;
        const int r = draw(x + s0 * n, keys + 3 * s0, t, counter, rows, cols, n_iv, lo, off, total,
                           K > 0 ? sums + s0 * rows * K : NULL, K, starts, ends);
        if (r != 0) return r;
        fwd_avx2(z + s0 * rows * O, x + s0 * n, w + s0 * O * cols, t, rows, O, cols, n, cols);
    }
    return 0;
#else
    return -1;
#endif
}

/* NMU with two inputs (portable C, float32, no contraction: the same operations as torch).
   f_i = w[s, o, i] * (x[s, b, i] - 1) + 1;  z[s, b, o] = f_0 * f_1.
   x: [S, B, 2] with seed stride xs, row stride xr and element stride xe; w: [S, O, 2]. */
void nalu_nmu2_fwd(float *z, const float *x, const float *w, int64_t S, int64_t B, int64_t O,
                   int64_t xs, int64_t xr, int64_t xe) {
    if (O == 1 && xr == 2 && xe == 1 && xs == 2 * B) {  /* the usual case: one contiguous loop */
        for (int64_t s = 0; s < S; s++) {
            const float wa = w[2 * s], wc = w[2 * s + 1];
            const float *xsd = x + s * xs;
            float *zs = z + s * B;
            for (int64_t b = 0; b < B; b++)
                zs[b] = (wa * (xsd[2 * b] - 1.0f) + 1.0f) * (wc * (xsd[2 * b + 1] - 1.0f) + 1.0f);
        }
        return;
    }
    for (int64_t s = 0; s < S; s++) {
        const float *ws = w + s * O * 2;
        for (int64_t b = 0; b < B; b++) {
            const float *xb = x + s * xs + b * xr;
            const float a = xb[0] - 1.0f, c = xb[xe] - 1.0f;
            float *zb = z + (s * B + b) * O;
            for (int64_t o = 0; o < O; o++)
                zb[o] = (ws[2 * o] * a + 1.0f) * (ws[2 * o + 1] * c + 1.0f);
        }
    }
}

static inline float lane_tree(const float l[8]) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* Gradients of nalu_nmu2_fwd for the upstream gradient g [S, B, O] (contiguous):
   gx [S, B, 2] (skipped when NULL) and gw [S, O, 2], both contiguous. With
   ga = g * (wc * c + 1), gc = g * (wa * a + 1) (a, c = the inputs minus 1):
   gw[o] = lane sums over b of ga * a and gc * c; gx = sums over o, first term first, of
   ga * wa and gc * wc. */
void nalu_nmu2_bwd(float *gx, float *gw, const float *g, const float *x, const float *w,
                   int64_t S, int64_t B, int64_t O, int64_t xs, int64_t xr, int64_t xe) {
    for (int64_t s = 0; s < S; s++) {
        const float *ws = w + s * O * 2, *xsd = x + s * xs;
        for (int64_t o = 0; o < O; o++) {
            const float wa = ws[2 * o], wc = ws[2 * o + 1];
            float sa[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            float sc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            for (int64_t b = 0; b < B; b++) {
                const float a = xsd[b * xr] - 1.0f, c = xsd[b * xr + xe] - 1.0f;
                const float gb = g[(s * B + b) * O + o];
                const float ga = gb * (wc * c + 1.0f), gc = gb * (wa * a + 1.0f);
                sa[b & 7] += ga * a;
                sc[b & 7] += gc * c;
                if (gx && O == 1) { gx[(s * B + b) * 2] = ga * wa; gx[(s * B + b) * 2 + 1] = gc * wc; }
            }
            gw[(s * O + o) * 2] = lane_tree(sa);
            gw[(s * O + o) * 2 + 1] = lane_tree(sc);
        }
        if (!gx || O == 1) continue;
        for (int64_t b = 0; b < B; b++) {
            const float a = xsd[b * xr] - 1.0f, c = xsd[b * xr + xe] - 1.0f;
            const float *gb = g + (s * B + b) * O;
            float gxa = 0.0f, gxc = 0.0f;
            for (int64_t o = 0; o < O; o++) {
                const float wa = ws[2 * o], wc = ws[2 * o + 1];
                const float ta = (gb[o] * (wc * c + 1.0f)) * wa, tc = (gb[o] * (wa * a + 1.0f)) * wc;
                gxa = o ? gxa + ta : ta;
                gxc = o ? gxc + tc : tc;
            }
            gx[(s * B + b) * 2] = gxa;
            gx[(s * B + b) * 2 + 1] = gxc;
        }
    }
}
