/* The native CPU step of `service.training.cpu_step`: whole training steps of the papers'
   model NAU (I -> 2) -> NMU (2 -> 1) with Adam, seed by seed, between two evaluations.

   Each seed runs its steps one after the other with its batch, weights, gradients and Adam
   state in cache: the batch drawn by the generator's own routine (`draw`, nalu_rng_sample of
   philox.c), the first layer and its weight gradient by the units' own kernels (`fwd`, `dw`:
   nalu_linear_fwd and nalu_linear_dw of units.c, whose addresses the caller hands over), and
   the rest here. Every number is the eager torch step's (`Trainer._step_eager`, where torch
   runs the same kernels or the torch ops of their order): the same float operations in the
   same order, each rounded (-ffp-contract=off, no FMA):

   - the NMU: f_a = w_a (z_0 - 1) + 1, f_c = w_c (z_1 - 1) + 1, y = f_a f_c (nalu_nmu2_fwd);
   - the task loss: the lane sum (eight lanes b mod 8 from 0, then the lane tree) of
     (y - t)^2 over the rows, divided by B (`lane_sum(...) / B`);
   - dy = (1 / B) (2 (y - t)); the NMU's weight gradient the lane sums over the rows of
     dy f_c a and dy f_a c, its input gradient dy f_c w_a, dy f_a w_c (nalu_nmu2_bwd);
   - the regulariser's gradient (λ / n) · local, local = ½((1 + d) sgn(a) − (1 − d) sgn(1 − a)),
     d = sgn(|1 − a| − |a|) (a = |W| for the NAU, times sgn(W); a = W for the NMU), added to
     the task's; a seed whose loss is not finite stops (alive = 0), a gradient of a stopped
     seed or one not finite is 0;
   - Adam (`BatchedOptimizer.step`): m += (1 − β1)(g − m); v = v β2 + ((1 − β2) g) g;
     p −= (m · fl(lr / bc1)) / (√v / fl(√bc2) + ε), bias corrections in double from the
     table or the running powers; then the clamps, NaN kept.

   Nothing depends on the other seeds, so a seed's numbers are the same alone or among any
   number of others. */
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef int (*nalu_draw_fn)(float *, const int64_t *, int64_t, int64_t, int64_t, int64_t, int64_t,
                            const float *, const float *, float, float *, int64_t, const int64_t *,
                            const int64_t *);
typedef int (*nalu_linear_fn)(float *, const float *, const float *, int64_t, int64_t, int64_t, int64_t,
                              int64_t, int64_t);

enum { OP_ADD = 0, OP_SUB = 1, OP_MUL = 2, OP_DIV = 3, OP_SQUARED = 4, OP_ROOT = 5 };

static inline float sgnf(float v) { return (float)((v > 0.0f) - (v < 0.0f)); }

/* torch.clamp: NaN stays NaN */
static inline float clampf(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

static inline int is_finite(float v) { return (v - v) == 0.0f; }

/* ½((1 + d) sgn(a) − (1 − d) sgn(b)), d = sgn(|b| − |a|), b = 1 − a (`_MeanDistanceToBounds`) */
static inline float distance_local(float a) {
    const float b = 1.0f - a;
    const float d = sgnf(fabsf(b) - fabsf(a));
    return 0.5f * ((1.0f + d) * sgnf(a) - (1.0f - d) * sgnf(b));
}

static inline float lane_tree(const float l[8]) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

static inline float target(int op, float a, float b) {
    switch (op) {
    case OP_ADD: return a + b;
    case OP_SUB: return a - b;
    case OP_MUL: return a * b;
    case OP_DIV: return a / b;
    case OP_SQUARED: return a * a;
    default: return sqrtf(a);
    }
}

/* Elements from i0 of one parameter: its gradient (the task's gt plus the regulariser's,
   λ/n · local; the NAU's through |W|), masked (0 where the seed is stopped or the gradient
   not finite), Adam with the step's per-seed constants, then the clamp [lo, hi]. */
static void params_scalar(float *p, float *m, float *v, const float *gt, int64_t i0, int64_t n, int nau,
                          float lam_n, int on, float omb1, float b2, float omb2, float eps,
                          float step_size, float bc2_sqrt, float lo, float hi) {
    for (int64_t i = i0; i < n; i++) {
        const float w = p[i];
        const float reg = nau ? (lam_n * distance_local(fabsf(w))) * sgnf(w) : lam_n * distance_local(w);
        float gi = gt[i] + reg;
        gi = on && is_finite(gi) ? gi : 0.0f;
        float delta = gi - m[i];
        delta = delta * omb1;
        const float mi = m[i] + delta;
        float sq = gi * omb2;
        sq = sq * gi;
        const float vi = v[i] * b2 + sq;
        float denom = sqrtf(vi);
        denom = denom / bc2_sqrt;
        denom = denom + eps;
        float step = mi * step_size;
        step = step / denom;
        m[i] = mi;
        v[i] = vi;
        p[i] = clampf(w - step, lo, hi);
    }
}

/* Rows from b0: the NMU, the loss's lanes, dy and the NMU's gradients (lanes b mod 8). */
static void rows_scalar(const float *z, const float *sums, float *gx, int64_t b0, int64_t B, int64_t K, int op,
                        float wa, float wc, float inv_rows, float lanes[8], float sa[8], float sc[8]) {
    for (int64_t b = b0; b < B; b++) {
        const float a = z[2 * b] - 1.0f, c = z[2 * b + 1] - 1.0f;
        const float fa = wa * a + 1.0f, fc = wc * c + 1.0f;
        const float y = fa * fc;
        const float t = target(op, sums[b * K], K > 1 ? sums[b * K + 1] : 0.0f);
        const float d = y - t;
        lanes[b & 7] += d * d;
        const float gy = inv_rows * (2.0f * d);
        const float ga = gy * fc, gc = gy * fa;
        sa[b & 7] += ga * a;
        sc[b & 7] += gc * c;
        gx[2 * b] = ga * wa;
        gx[2 * b + 1] = gc * wc;
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2")))

AVX2 static inline __m256 sgn8(__m256 v) {  /* (v > 0) - (v < 0): 0 for NaN, as torch.sign */
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    return _mm256_sub_ps(_mm256_and_ps(_mm256_cmp_ps(v, zero, _CMP_GT_OQ), one),
                         _mm256_and_ps(_mm256_cmp_ps(v, zero, _CMP_LT_OQ), one));
}

AVX2 static inline __m256 abs8(__m256 v) {
    return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}

AVX2 static inline __m256 local8(__m256 a) {  /* distance_local */
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 b = _mm256_sub_ps(one, a);
    const __m256 d = sgn8(_mm256_sub_ps(abs8(b), abs8(a)));
    return _mm256_mul_ps(_mm256_set1_ps(0.5f), _mm256_sub_ps(_mm256_mul_ps(_mm256_add_ps(one, d), sgn8(a)),
                                                             _mm256_mul_ps(_mm256_sub_ps(one, d), sgn8(b))));
}

AVX2 static inline __m256 clamp8(__m256 v, __m256 lo, __m256 hi) {  /* clampf: NaN kept */
    v = _mm256_blendv_ps(v, lo, _mm256_cmp_ps(v, lo, _CMP_LT_OQ));
    return _mm256_blendv_ps(v, hi, _mm256_cmp_ps(v, hi, _CMP_GT_OQ));
}

/* [a0 c0 a1 c1 ... a7 c7] (16 floats at p) -> a, c */
AVX2 static inline void deinterleave8(const float *p, __m256 *a, __m256 *c) {
    const __m256 v0 = _mm256_loadu_ps(p), v1 = _mm256_loadu_ps(p + 8);
    *a = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0x88)), 0xD8));
    *c = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0xDD)), 0xD8));
}

AVX2 static inline void interleave8(float *p, __m256 a, __m256 c) {
    const __m256 a2 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(a), 0xD8));
    const __m256 c2 = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(c), 0xD8));
    _mm256_storeu_ps(p, _mm256_unpacklo_ps(a2, c2));
    _mm256_storeu_ps(p + 8, _mm256_unpackhi_ps(a2, c2));
}

AVX2 static inline __m256 target8(int op, __m256 a, __m256 b) {
    switch (op) {
    case OP_ADD: return _mm256_add_ps(a, b);
    case OP_SUB: return _mm256_sub_ps(a, b);
    case OP_MUL: return _mm256_mul_ps(a, b);
    case OP_DIV: return _mm256_div_ps(a, b);
    case OP_SQUARED: return _mm256_mul_ps(a, a);
    default: return _mm256_sqrt_ps(a);
    }
}

/* The rows of rows_scalar, eight at a time (row b in lane b mod 8, as the lane sums'). */
AVX2 static int64_t rows_avx2(const float *z, const float *sums, float *gx, int64_t B, int op, float wa,
                              float wc, float inv_rows, float lanes[8], float sa[8], float sc[8]) {
    const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f), ir = _mm256_set1_ps(inv_rows);
    const __m256 va = _mm256_set1_ps(wa), vc = _mm256_set1_ps(wc);
    __m256 l = _mm256_setzero_ps(), la = _mm256_setzero_ps(), lc = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= B; b += 8) {
        __m256 za, zc, ta, tb;
        deinterleave8(z + 2 * b, &za, &zc);
        deinterleave8(sums + 2 * b, &ta, &tb);
        const __m256 a = _mm256_sub_ps(za, one), c = _mm256_sub_ps(zc, one);
        const __m256 fa = _mm256_add_ps(_mm256_mul_ps(va, a), one), fc = _mm256_add_ps(_mm256_mul_ps(vc, c), one);
        const __m256 d = _mm256_sub_ps(_mm256_mul_ps(fa, fc), target8(op, ta, tb));
        l = _mm256_add_ps(l, _mm256_mul_ps(d, d));
        const __m256 gy = _mm256_mul_ps(ir, _mm256_mul_ps(two, d));
        const __m256 ga = _mm256_mul_ps(gy, fc), gc = _mm256_mul_ps(gy, fa);
        la = _mm256_add_ps(la, _mm256_mul_ps(ga, a));
        lc = _mm256_add_ps(lc, _mm256_mul_ps(gc, c));
        interleave8(gx + 2 * b, _mm256_mul_ps(ga, va), _mm256_mul_ps(gc, vc));
    }
    _mm256_storeu_ps(lanes, l);
    _mm256_storeu_ps(sa, la);
    _mm256_storeu_ps(sc, lc);
    return b;
}

/* The parameter loop of params_scalar, eight elements at a time; returns how many it did. */
AVX2 static int64_t params_avx2(float *p, float *m, float *v, const float *gt, int64_t n, int nau, float lam_n,
                                int on, float omb1, float b2, float omb2, float eps, float step_size,
                                float bc2_sqrt, float lo, float hi) {
    const __m256 vl = _mm256_set1_ps(lam_n), vo1 = _mm256_set1_ps(omb1), vb2 = _mm256_set1_ps(b2);
    const __m256 vo2 = _mm256_set1_ps(omb2), veps = _mm256_set1_ps(eps), vss = _mm256_set1_ps(step_size);
    const __m256 vbc = _mm256_set1_ps(bc2_sqrt), vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
    const __m256 zero = _mm256_setzero_ps();
    const __m256 keep = on ? _mm256_castsi256_ps(_mm256_set1_epi32(-1)) : zero;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 w = _mm256_loadu_ps(p + i);
        const __m256 reg = nau ? _mm256_mul_ps(_mm256_mul_ps(vl, local8(abs8(w))), sgn8(w))
                               : _mm256_mul_ps(vl, local8(w));
        __m256 g = _mm256_add_ps(_mm256_loadu_ps(gt + i), reg);
        g = _mm256_and_ps(g, _mm256_and_ps(keep, _mm256_cmp_ps(_mm256_sub_ps(g, g), zero, _CMP_EQ_OQ)));
        const __m256 mi = _mm256_add_ps(_mm256_loadu_ps(m + i), _mm256_mul_ps(_mm256_sub_ps(g, _mm256_loadu_ps(m + i)), vo1));
        const __m256 vi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), vb2), _mm256_mul_ps(_mm256_mul_ps(g, vo2), g));
        const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), vbc), veps);
        const __m256 step = _mm256_div_ps(_mm256_mul_ps(mi, vss), denom);
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(p + i, clamp8(_mm256_sub_ps(w, step), vlo, vhi));
    }
    return i;
}

static int has_avx2(void) { return __builtin_cpu_supports("avx2"); }
#else
static int64_t rows_avx2(const float *z, const float *sums, float *gx, int64_t B, int op, float wa,
                         float wc, float inv_rows, float lanes[8], float sa[8], float sc[8]) { return 0; }
static int64_t params_avx2(float *p, float *m, float *v, const float *gt, int64_t n, int nau, float lam_n,
                           int on, float omb1, float b2, float omb2, float eps, float step_size,
                           float bc2_sqrt, float lo, float hi) { return 0; }
static int has_avx2(void) { return 0; }
#endif

/* `n_steps` steps from `step0` for each of S seeds (a range of the run's: callers on several
   threads train disjoint ranges). Per seed s: keys [S, 3]; ops [S] its operation; w1, m1, v1
   [S, 2, I]; w2, m2, v2 [S, 1, 2]; alive [S] (bytes), diverged_at, opt_steps [S]; powers,
   betas [2, stride] double (the rows `stride` apart); lr [S] double; table [G, 2, L] double with group [S] and last [S];
   omb1, b2, omb2, eps, lam_max, t_start, span [S] float; reg_shape 0 linear, 1 constant.
   scratch: B (I + K + 4) + 2 I floats. Returns 0, or the draw's status. */
int nalu_cpu_train(void *draw_fn, void *fwd_fn, void *dw_fn, const int64_t *keys, int64_t S,
                   int64_t stride, int64_t step0, int64_t n_steps, int64_t B, int64_t I, int64_t n_iv,
                   const float *lo, const float *off, float total, int64_t K, const int64_t *starts,
                   const int64_t *ends, const int64_t *ops, float *w1, float *m1, float *v1, float *w2,
                   float *m2, float *v2, uint8_t *alive, int64_t *diverged_at, int64_t *opt_steps,
                   double *powers, const double *betas, const double *lr, const double *table,
                   int64_t L, const int64_t *group, const int64_t *last, const float *omb1,
                   const float *b2, const float *omb2, const float *eps, int64_t reg_shape,
                   const float *lam_max, const float *t_start, const float *span, float *scratch) {
    const nalu_draw_fn draw = (nalu_draw_fn)draw_fn;
    const nalu_linear_fn fwd = (nalu_linear_fn)fwd_fn, dw = (nalu_linear_fn)dw_fn;
    float *x = scratch, *sums = x + B * I, *z = sums + B * K, *gx = z + 2 * B, *g1 = gx + 2 * B;
    const float inv_rows = 1.0f / (float)B;
    const int64_t n1 = 2 * I;
    const int vec = has_avx2();
    for (int64_t s = 0; s < S; s++) {
        float *p1 = w1 + s * n1, *pm1 = m1 + s * n1, *pv1 = v1 + s * n1;
        float *p2 = w2 + s * 2, *pm2 = m2 + s * 2, *pv2 = v2 + s * 2;
        const int64_t grp = group[s];
        const int op = (int)ops[s];
        for (int64_t it = 0; it < n_steps; it++) {
            const int64_t step = step0 + it;
            int r = draw(x, keys + 3 * s, 1, step, B, I, n_iv, lo, off, total, sums, K, starts, ends);
            if (r != 0) return r;
            r = fwd(z, x, p1, 1, B, 2, I, B * I, I);
            if (r != 0) return r;
            /* the NMU, the loss and the NMU's gradients */
            const float wa = p2[0], wc = p2[1];
            float lanes[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            float sa[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            float sc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            const int64_t b0 = vec && K == 2 ? rows_avx2(z, sums, gx, B, op, wa, wc, inv_rows, lanes, sa, sc) : 0;
            rows_scalar(z, sums, gx, b0, B, K, op, wa, wc, inv_rows, lanes, sa, sc);
            const float loss = lane_tree(lanes) / (float)B;
            r = dw(g1, gx, x, 1, B, 2, I, B * I, I);
            if (r != 0) return r;
            float g2[2] = {lane_tree(sa), lane_tree(sc)};
            /* λ(t) (`SeedSchedule.value`) and the regularisers' gradients */
            const float tf = (float)step;
            float lam;
            if (reg_shape == 1) {
                lam = tf >= t_start[s] ? lam_max[s] : 0.0f;
            } else {
                const float pr = clampf((tf - t_start[s]) / span[s], 0.0f, 1.0f);
                lam = lam_max[s] * pr;
            }
            const float lam1 = lam / (float)n1, lam2 = lam / 2.0f;
            /* divergence: the loss of this step (`Trainer._update_eager`) */
            if (!is_finite(loss)) {
                if (alive[s]) diverged_at[s] = step;
                alive[s] = 0;
            }
            const int on = alive[s] != 0;
            /* Adam's per-seed constants (`BatchedOptimizer.step`) */
            const int64_t t = ++opt_steps[s];
            powers[s] *= betas[s];
            powers[stride + s] *= betas[stride + s];
            double bc1, bc2;
            if (t <= last[s]) {
                const int64_t idx = t < last[s] ? t : last[s];
                bc1 = table[(grp * 2) * L + idx];
                bc2 = table[(grp * 2 + 1) * L + idx];
            } else {
                bc1 = 1.0 - powers[s];
                bc2 = 1.0 - powers[stride + s];
            }
            const float step_size = (float)(lr[s] / bc1), bc2_sqrt = (float)sqrt(bc2);
            const int64_t i0 = vec ? params_avx2(p1, pm1, pv1, g1, n1, 1, lam1, on, omb1[s], b2[s], omb2[s], eps[s],
                                                 step_size, bc2_sqrt, -1.0f, 1.0f) : 0;
            params_scalar(p1, pm1, pv1, g1, i0, n1, 1, lam1, on, omb1[s], b2[s], omb2[s], eps[s], step_size,
                          bc2_sqrt, -1.0f, 1.0f);
            params_scalar(p2, pm2, pv2, g2, 0, 2, 0, lam2, on, omb1[s], b2[s], omb2[s], eps[s], step_size,
                          bc2_sqrt, 0.0f, 1.0f);
        }
    }
    return 0;
}
