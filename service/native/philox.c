/* Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3",
   SC 2011) for `service.seeding.generator`: U[0, 1) floats, optionally mapped onto a union of
   intervals and summed over runs of each row.

   One block: counter (c0, c1, c2, c3), key (k0, k1); ten rounds of
       (c0, c1, c2, c3) <- (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2), hi(M0 c0) ^ c3 ^ k1, lo(M0 c0))
   with M0 = 0xD2511F53, M1 = 0xCD9E8D57, the key bumped by (0x9E3779B9, 0xBB67AE85) between
   rounds; output the final (c0, c1, c2, c3).

   Stream layout (see generator.py): key = 64-bit hash of (master seed, stream name); c1 = the
   32-bit seed id; (c2, c3) = the 64-bit call counter (low, high); c0 = block index. Element i
   of a call is word (i mod 4) of block (i div 4); float = (word >> 8) * 2^-24.

   Every path (portable C, AVX2, AVX-512, the torch ops) computes the same integers; the floats
   are exact conversions and the float maps and sums use one fixed order of operations. */
#include <stdint.h>
#include <stddef.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NALU_X86 1
#endif

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
#define NALU_SCALE (1.0f / 16777216.0f)
#define NALU_MAX_INTERVALS 8
#define NALU_CHUNK 2048 /* numbers per chunk of `sample`: generated, mapped and summed in L1 */

/* One (key, seed id, counter): round keys and the constant counter words. */
typedef struct { uint32_t k0[10], k1[10]; uint32_t c1, c2, c3; } nalu_stream;

/* x = s + lo[0] with s = u * total, then x = (s - off[k]) + lo[k] where s >= off[k], k >= 1:
   float32 with one rounding per operation, exactly `map_to_intervals` in torch. */
typedef struct { float total; int64_t n; float lo[NALU_MAX_INTERVALS]; float off[NALU_MAX_INTERVALS]; } nalu_map;

static void stream_init(nalu_stream *st, const int64_t *key3, int64_t counter) {
    uint32_t k0 = (uint32_t)key3[0], k1 = (uint32_t)key3[1];
    for (int r = 0; r < 10; r++) { st->k0[r] = k0; st->k1[r] = k1; k0 += PHILOX_W0; k1 += PHILOX_W1; }
    st->c1 = (uint32_t)key3[2];
    st->c2 = (uint32_t)((uint64_t)counter & 0xFFFFFFFFu);
    st->c3 = (uint32_t)((uint64_t)counter >> 32);
}

static inline void philox_block(uint32_t w[4], uint32_t c0, const nalu_stream *st) {
    uint32_t x0 = c0, x1 = st->c1, x2 = st->c2, x3 = st->c3;
    for (int r = 0; r < 10; r++) {
        const uint64_t p0 = (uint64_t)PHILOX_M0 * x0, p1 = (uint64_t)PHILOX_M1 * x2;
        x0 = (uint32_t)(p1 >> 32) ^ x1 ^ st->k0[r];
        x2 = (uint32_t)(p0 >> 32) ^ x3 ^ st->k1[r];
        x1 = (uint32_t)p1;
        x3 = (uint32_t)p0;
    }
    w[0] = x0; w[1] = x1; w[2] = x2; w[3] = x3;
}

/* the raw words of blocks [b0, b0 + nb): out[4 * j + q] = word q of block b0 + j (tests) */
void nalu_philox_raw(uint32_t *out, const int64_t *key3, int64_t counter, int64_t b0, int64_t nb) {
    nalu_stream st;
    stream_init(&st, key3, counter);
    for (int64_t j = 0; j < nb; j++) philox_block(out + 4 * j, (uint32_t)(b0 + j), &st);
}

static inline float map1(float u, const nalu_map *m) {
    if (!m) return u;
    const float s = u * m->total;
    float x = s + m->lo[0];
    for (int64_t k = 1; k < m->n; k++)
        if (s >= m->off[k]) x = (s - m->off[k]) + m->lo[k];
    return x;
}

/* o[i] for i in [from, to): element i of the stream, optionally mapped */
static void fill_portable(float *o, const nalu_stream *st, int64_t from, int64_t to, const nalu_map *m) {
    uint32_t w[4];
    for (int64_t i = from; i < to;) {
        philox_block(w, (uint32_t)(i >> 2), st);
        for (int q = (int)(i & 3); q < 4 && i < to; q++, i++)
            o[i] = map1((float)(int32_t)(w[q] >> 8) * NALU_SCALE, m);
    }
}

/* Sum of row[a .. e) in the one order every path uses: eight lanes, lane l accumulating
   row[a + l], row[a + 8 + l], ... from 0.0f, then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). */
static float lane_sum_portable(const float *row, int64_t a, int64_t e) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t i = a; i < e; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += i + l < e ? row[i + l] : 0.0f;
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static void sums_portable(float *sums, const float *o, int64_t rows, int64_t cols,
                          int64_t K, const int64_t *starts, const int64_t *ends) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < K; j++) sums[r * K + j] = lane_sum_portable(o + r * cols, starts[j], ends[j]);
}

#ifdef NALU_X86
/* Rounds 0 and 1 of (c1, c2, c3) are the same for every block of a call: their words, done
   once in scalar, for the vector forms below. */
typedef struct { uint32_t lo1_0, x3_1, x3_1k, c3k; } nalu_rounds01;

static nalu_rounds01 rounds01(const nalu_stream *st) {
    /* round 0: x0 = hi(M1 c2) ^ c1 ^ k0[0], x1 = lo(M1 c2) (same for all blocks);
       x2 = hi(M0 c0) ^ c3 ^ k1[0], x3 = lo(M0 c0) (per block) */
    const uint64_t p1 = (uint64_t)PHILOX_M1 * st->c2;
    const uint32_t x0 = (uint32_t)(p1 >> 32) ^ st->c1 ^ st->k0[0], x1 = (uint32_t)p1;
    /* round 1: p0 = M0 x0 is the same for all blocks: x2' = hi(p0) ^ x3 ^ k1[1], x3' = lo(p0);
       x0' = hi(M1 x2) ^ x1 ^ k0[1], x1' = lo(M1 x2) */
    const uint64_t p0 = (uint64_t)PHILOX_M0 * x0;
    nalu_rounds01 c;
    c.lo1_0 = x1 ^ st->k0[1];
    c.x3_1 = (uint32_t)p0;                        /* x3 after round 1 */
    c.x3_1k = (uint32_t)(p0 >> 32) ^ st->k1[1];   /* ^ x3 of round 0 */
    c.c3k = st->c3 ^ st->k1[0];
    return c;
}

/* Four blocks per vector, one per 64-bit lane (a word in the low half, garbage in the high half that
   _mm256_mul_epu32 ignores). */
typedef struct { __m256i k0[10], k1[10], m0, m1, c3k, lo1_0, x3_1, x3_1k; } nalu_vstream;

__attribute__((target("avx2")))
static void vstream_init(nalu_vstream *v, const nalu_stream *st) {
    for (int r = 0; r < 10; r++) {
        v->k0[r] = _mm256_set1_epi64x(st->k0[r]);
        v->k1[r] = _mm256_set1_epi64x(st->k1[r]);
    }
    v->m0 = _mm256_set1_epi64x(PHILOX_M0);
    v->m1 = _mm256_set1_epi64x(PHILOX_M1);
    const nalu_rounds01 c = rounds01(st);
    v->lo1_0 = _mm256_set1_epi64x(c.lo1_0);
    v->x3_1 = _mm256_set1_epi64x(c.x3_1);
    v->x3_1k = _mm256_set1_epi64x(c.x3_1k);
    v->c3k = _mm256_set1_epi64x(c.c3k);
}

/* Rounds 0 and 1 of four blocks (c as four 64-bit lanes): x0..x3 after round 1 */
#define NALU_ROUNDS01(C, X0, X1, X2, X3) {                                                 \
    const __m256i p0 = _mm256_mul_epu32(C, v->m0);                                            \
    const __m256i y2 = _mm256_xor_si256(_mm256_srli_epi64(p0, 32), v->c3k);                  \
    const __m256i p1 = _mm256_mul_epu32(y2, v->m1);                                           \
    X0 = _mm256_xor_si256(_mm256_srli_epi64(p1, 32), v->lo1_0); X1 = p1;                      \
    X2 = _mm256_xor_si256(p0, v->x3_1k); X3 = v->x3_1; }
#define NALU_ROUND(R, X0, X1, X2, X3) {                                                    \
    const __m256i p0 = _mm256_mul_epu32(X0, v->m0), p1 = _mm256_mul_epu32(X2, v->m1);         \
    X0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), X1), v->k0[R]);         \
    X2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), X3), v->k1[R]);         \
    X1 = p1; X3 = p0; }
/* the low words of x0..x3 of blocks c .. c + 3 as 16 numbers in element order */
#define NALU_PACK(X0, X1, X2, X3, OUT0, OUT1) {                                            \
    const __m256i a = _mm256_blend_epi32(X0, _mm256_slli_epi64(X1, 32), 0xAA);                \
    const __m256i b = _mm256_blend_epi32(X2, _mm256_slli_epi64(X3, 32), 0xAA);                \
    const __m256i lo = _mm256_unpacklo_epi64(a, b), hi = _mm256_unpackhi_epi64(a, b);         \
    OUT0 = _mm256_permute2x128_si256(lo, hi, 0x20);                                           \
    OUT1 = _mm256_permute2x128_si256(lo, hi, 0x31); }

/* 48 numbers: blocks c .. c + 11, three independent chains of four blocks interleaved (three
   hide the multiply latency best here: 2 and 4 were 15% and 3% slower) */
__attribute__((target("avx2"), always_inline))
static inline void philox12(const nalu_vstream *v, __m256i c, __m256i w[6]) {
    __m256i a0, a1, a2, a3, b0, b1, b2, b3, d0, d1, d2, d3;
    const __m256i c4 = _mm256_add_epi64(c, _mm256_set1_epi64x(4));
    const __m256i c8 = _mm256_add_epi64(c, _mm256_set1_epi64x(8));
    NALU_ROUNDS01(c, a0, a1, a2, a3)
    NALU_ROUNDS01(c4, b0, b1, b2, b3)
    NALU_ROUNDS01(c8, d0, d1, d2, d3)
    for (int r = 2; r < 10; r++) {
        NALU_ROUND(r, a0, a1, a2, a3)
        NALU_ROUND(r, b0, b1, b2, b3)
        NALU_ROUND(r, d0, d1, d2, d3)
    }
    NALU_PACK(a0, a1, a2, a3, w[0], w[1])
    NALU_PACK(b0, b1, b2, b3, w[2], w[3])
    NALU_PACK(d0, d1, d2, d3, w[4], w[5])
}

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
static void fill_avx2(float *o, const nalu_stream *st, int64_t from, int64_t to, const nalu_map *m) {
    nalu_vstream vs;
    const nalu_vstream *v = &vs;
    vstream_init(&vs, st);
    int64_t i = (from + 3) & ~(int64_t)3;  /* first whole block */
    if (i > to) i = to;
    fill_portable(o, st, from, i, m);
    __m256i c = _mm256_add_epi64(_mm256_set1_epi64x(i >> 2), _mm256_setr_epi64x(0, 1, 2, 3));
    const __m256 scale = _mm256_set1_ps(NALU_SCALE);
    const int one = m && m->n == 1 && (m->total >= 1e-30f || m->total <= -1e-30f);
    /* one interval: x = u * total + lo with (k * 2^-24) * total == k * (2^-24 * total) exactly
       (scaling by a power of two is exact; total is checked to stay normal) */
    const __m256 vt = _mm256_set1_ps(one ? m->total * NALU_SCALE : NALU_SCALE);
    const __m256 vl = _mm256_set1_ps(one ? m->lo[0] : 0.0f);
    const nalu_map mm = m ? *m : (nalu_map){0}; /* a local copy: stores to o cannot alias it */
    const __m256i twelve = _mm256_set1_epi64x(12);
    while (i < to) {
        __m256i w[6];
        philox12(v, c, w);
        c = _mm256_add_epi64(c, twelve);
        float tail[48];
        float *dst = i + 48 <= to ? o + i : tail;  /* a last partial group goes through tail */
        for (int q = 0; q < 6; q++) {
            const __m256 f = _mm256_cvtepi32_ps(_mm256_srli_epi32(w[q], 8));
            if (one || !m)  /* u = k * 2^-24 (+ 0.0f: exact, as u is never -0) */
                _mm256_storeu_ps(dst + 8 * q, _mm256_add_ps(_mm256_mul_ps(f, vt), vl));
            else
                _mm256_storeu_ps(dst + 8 * q, map8(_mm256_mul_ps(f, scale), &mm));
        }
        if (dst == tail) {
            for (int64_t q = 0; q < to - i; q++) o[i + q] = tail[q];
            break;
        }
        i += 48;
    }
}

static const int32_t nalu_mask_tab[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

/* the lane tree of lane_sum_portable: ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)) */
__attribute__((target("avx2")))
static inline float hsum_avx2(__m256 v) {
    const __m256 t = _mm256_hadd_ps(v, v);
    const __m256 u = _mm256_hadd_ps(t, t);
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)));
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
   horizontal adds, the same tree as hsum_avx2), the rest row by row. */
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

/* The same blocks eight to a 512-bit vector (one per 64-bit lane, as above), three chains of
   eight interleaved: 96 numbers a group, a round's two three-way XORs one instruction each.
   The integers are those of every other path; the floats the same exact operations (mul, then
   add: -ffp-contract=off keeps AVX-512's FMA out). */
typedef struct { __m512i k0[10], k1[10], m0, m1, c3k, lo1_0, x3_1, x3_1k; } nalu_zstream;

__attribute__((target("avx512f")))
static void zstream_init(nalu_zstream *v, const nalu_stream *st) {
    for (int r = 0; r < 10; r++) {
        v->k0[r] = _mm512_set1_epi64(st->k0[r]);
        v->k1[r] = _mm512_set1_epi64(st->k1[r]);
    }
    v->m0 = _mm512_set1_epi64(PHILOX_M0);
    v->m1 = _mm512_set1_epi64(PHILOX_M1);
    const nalu_rounds01 c = rounds01(st);
    v->lo1_0 = _mm512_set1_epi64(c.lo1_0);
    v->x3_1 = _mm512_set1_epi64(c.x3_1);
    v->x3_1k = _mm512_set1_epi64(c.x3_1k);
    v->c3k = _mm512_set1_epi64(c.c3k);
}

#define NALU_ZROUNDS01(C, X0, X1, X2, X3) {                                                \
    const __m512i p0 = _mm512_mul_epu32(C, v->m0);                                            \
    const __m512i y2 = _mm512_xor_si512(_mm512_srli_epi64(p0, 32), v->c3k);                  \
    const __m512i p1 = _mm512_mul_epu32(y2, v->m1);                                           \
    X0 = _mm512_xor_si512(_mm512_srli_epi64(p1, 32), v->lo1_0); X1 = p1;                      \
    X2 = _mm512_xor_si512(p0, v->x3_1k); X3 = v->x3_1; }
/* 0x96: a ^ b ^ c */
#define NALU_ZROUND(R, X0, X1, X2, X3) {                                                   \
    const __m512i p0 = _mm512_mul_epu32(X0, v->m0), p1 = _mm512_mul_epu32(X2, v->m1);         \
    X0 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), X1, v->k0[R], 0x96);            \
    X2 = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), X3, v->k1[R], 0x96);            \
    X1 = p1; X3 = p0; }
/* the low words of x0..x3 of eight blocks as 32 numbers in element order */
#define NALU_ZPACK(X0, X1, X2, X3, OUT0, OUT1) {                                           \
    const __m512i a = _mm512_mask_blend_epi32(0xAAAA, X0, _mm512_slli_epi64(X1, 32));         \
    const __m512i b = _mm512_mask_blend_epi32(0xAAAA, X2, _mm512_slli_epi64(X3, 32));         \
    OUT0 = _mm512_permutex2var_epi64(a, _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11), b);      \
    OUT1 = _mm512_permutex2var_epi64(a, _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15), b); }

__attribute__((target("avx512f")))
static inline __m512 map16(__m512 u, const nalu_map *m) {
    const __m512 s = _mm512_mul_ps(u, _mm512_set1_ps(m->total));
    __m512 x = _mm512_add_ps(s, _mm512_set1_ps(m->lo[0]));
    for (int64_t k = 1; k < m->n; k++) {
        const __m512 vo = _mm512_set1_ps(m->off[k]);
        const __m512 alt = _mm512_add_ps(_mm512_sub_ps(s, vo), _mm512_set1_ps(m->lo[k]));
        x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(s, vo, _CMP_GE_OQ), x, alt);
    }
    return x;
}

/* 2 * nw vectors of numbers w (32 * nw numbers) as floats at dst */
__attribute__((target("avx512f"), always_inline))
static inline void store_z(float *dst, const __m512i *w, int nw, int one, __m512 vt, __m512 vl,
                           const nalu_map *m) {
    for (int q = 0; q < 2 * nw; q++) {
        const __m512 f = _mm512_cvtepi32_ps(_mm512_srli_epi32(w[q], 8));
        if (one)  /* as fill_avx2 */
            _mm512_storeu_ps(dst + 16 * q, _mm512_add_ps(_mm512_mul_ps(f, vt), vl));
        else
            _mm512_storeu_ps(dst + 16 * q, map16(_mm512_mul_ps(f, _mm512_set1_ps(NALU_SCALE)), m));
    }
}

__attribute__((target("avx512f")))
static void fill_avx512(float *o, const nalu_stream *st, int64_t from, int64_t to, const nalu_map *m) {
    nalu_zstream vs;
    const nalu_zstream *v = &vs;
    zstream_init(&vs, st);
    int64_t i = (from + 3) & ~(int64_t)3;  /* first whole block */
    if (i > to) i = to;
    fill_portable(o, st, from, i, m);
    __m512i c = _mm512_add_epi64(_mm512_set1_epi64(i >> 2), _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
    const int one = !m || (m->n == 1 && (m->total >= 1e-30f || m->total <= -1e-30f));
    const __m512 vt = _mm512_set1_ps(m && one ? m->total * NALU_SCALE : NALU_SCALE);
    const __m512 vl = _mm512_set1_ps(m && one ? m->lo[0] : 0.0f);
    const nalu_map mm = m ? *m : (nalu_map){0}; /* a local copy: stores to o cannot alias it */
    const __m512i eight = _mm512_set1_epi64(8);
    for (; i + 96 <= to; i += 96) {  /* whole groups: three chains */
        __m512i a0, a1, a2, a3, b0, b1, b2, b3, d0, d1, d2, d3, w[6];
        const __m512i c8 = _mm512_add_epi64(c, eight), c16 = _mm512_add_epi64(c8, eight);
        NALU_ZROUNDS01(c, a0, a1, a2, a3)
        NALU_ZROUNDS01(c8, b0, b1, b2, b3)
        NALU_ZROUNDS01(c16, d0, d1, d2, d3)
        for (int r = 2; r < 10; r++) {
            NALU_ZROUND(r, a0, a1, a2, a3)
            NALU_ZROUND(r, b0, b1, b2, b3)
            NALU_ZROUND(r, d0, d1, d2, d3)
        }
        NALU_ZPACK(a0, a1, a2, a3, w[0], w[1])
        NALU_ZPACK(b0, b1, b2, b3, w[2], w[3])
        NALU_ZPACK(d0, d1, d2, d3, w[4], w[5])
        c = _mm512_add_epi64(c16, eight);
        store_z(o + i, w, 3, one, vt, vl, &mm);
    }
    while (i < to) {  /* the rest, eight blocks at a time, a last partial one through tail */
        __m512i a0, a1, a2, a3, w[2];
        NALU_ZROUNDS01(c, a0, a1, a2, a3)
        for (int r = 2; r < 10; r++) NALU_ZROUND(r, a0, a1, a2, a3)
        NALU_ZPACK(a0, a1, a2, a3, w[0], w[1])
        c = _mm512_add_epi64(c, eight);
        float tail[32];
        float *dst = i + 32 <= to ? o + i : tail;
        store_z(dst, w, 1, one, vt, vl, &mm);
        if (dst == tail) {
            for (int64_t q = 0; q < to - i; q++) o[i + q] = tail[q];
            break;
        }
        i += 32;
    }
}

static int nalu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? 1 : 0;
}

/* libgcc's check includes the OS's support for the 512-bit state (XCR0) */
static int nalu_has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? 1 : 0;
}
#else
static int nalu_has_avx2(void) { return 0; }
static int nalu_has_avx512(void) { return 0; }
#endif

static int isa_cap = 2;

/* The instruction set the draws use: 0 portable C, 1 AVX2, 2 AVX-512 (the best the CPU has,
   at most the cap). Every level gives the same bits. */
int nalu_rng_isa(void) {
    const int best = nalu_has_avx512() ? 2 : nalu_has_avx2() ? 1 : 0;
    return best < isa_cap ? best : isa_cap;
}

/* tests: cap the level (0 portable C, 1 AVX2, 2 no cap) */
void nalu_rng_force_isa(int level) { isa_cap = level < 0 ? 0 : level > 2 ? 2 : level; }

/* tests: 1 makes every call take the portable C path, 0 lifts any cap */
void nalu_rng_force_portable(int on) { isa_cap = on ? 0 : 2; }

/* one seed's elements [from, to) at the level isa */
static void fill_isa(int isa, float *o, const nalu_stream *st, int64_t from, int64_t to, const nalu_map *m) {
#ifdef NALU_X86
    if (isa >= 2) { fill_avx512(o, st, from, to, m); return; }
    if (isa == 1) { fill_avx2(o, st, from, to, m); return; }
#endif
    (void)isa;
    fill_portable(o, st, from, to, m);
}

void nalu_rng_uniform(float *out, const int64_t *keys, int64_t S, int64_t counter, int64_t n) {
    const int isa = nalu_rng_isa();
    for (int64_t s = 0; s < S; s++) {
        nalu_stream st;
        stream_init(&st, keys + 3 * s, counter);
        fill_isa(isa, out + s * n, &st, 0, n, NULL);
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
    const int isa = nalu_rng_isa();
    const int64_t n = rows * cols;
    int64_t chunk_rows = cols >= NALU_CHUNK ? 1 : NALU_CHUNK / cols;
    if (chunk_rows > 8) chunk_rows -= chunk_rows % 8;  /* whole groups of 8 rows for the sums */
    for (int64_t s = 0; s < S; s++) {
        nalu_stream st;
        stream_init(&st, keys + 3 * s, counter);
        float *o = out + s * n;
        float *su = sums ? sums + s * rows * K : NULL;
        for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
            const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
            fill_isa(isa, o, &st, r0 * cols, r1 * cols, &m);
            if (K <= 0) continue;
#ifdef NALU_X86
            if (isa >= 1) { sums_avx2(su + r0 * K, o + r0 * cols, r1 - r0, cols, K, starts, ends); continue; }
#endif
            sums_portable(su + r0 * K, o + r0 * cols, r1 - r0, cols, K, starts, ends);
        }
    }
    return 0;
}
