/* The quantized matmul on weights interleaved 16 rows at a time (layout: cpu_quant_pack.c),
 * AVX-512 VNNI. One vpdpbusd multiplies 4 bytes of an x row, broadcast, with the same 4
 * elements of 16 weight rows, so 16 outputs fill the 16 lanes of one register and a block's
 * sums stay integers (exact) until the block's scale: per (block of 32, 16 rows, x row) 8
 * vpdpbusd, one convert and one or two FMAs, where the row-major paths (cpu_quant.c,
 * cpu_quant_direct.c) take 4 lane-wise converts and FMAs per 16 elements of each row.
 *
 * Numerics, per output y = x . w (x quantized per 32 as in cpu_quant.c: q, step dx, integer
 * sums qs16 per 16), blocks in order, each output in its own lane (no reduction):
 *   Q4_0  acc += float(sum u q - 8 qs32) * (d * dx)         Q8_0  the same with 128
 *   Q4_1  acc += float(sum u q) * (d * dx);  acc += m * (dx * float(qs32))
 *   Q4_K  per sub-block j: acc += float(sum u q) * ((d * sc_j) * dx);
 *         acc += -(dmin * mn_j) * (dx * float(qs32))
 *   Q6_K  per sub-block of 32 (16-groups g, g + 1):
 *         acc += float(sc_g (sum_g u q - 32 qs16_g) + sc_g+1 (...)) * (d * dx)
 * (each * and + one float32 rounding, FMAs fused). Every output is computed by this one
 * sequence whatever its batch, tile or thread, so a row's result never depends on them.
 */
#include "quant_direct.h"
#include "quant_format.h"

#if R16_KERNEL

#define RM 6 /* x rows a pass: 8 weight registers + RM accumulators + sums */

static inline __attribute__((always_inline)) __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

static inline __attribute__((always_inline)) __m512 widen16(const uint8_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

static inline __attribute__((always_inline)) __m512 bytes16(const uint8_t *p, int is_signed) {
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    return _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b));
}

/* sum over 8 words w of W[w] . x[4w .. 4w + 3], in two chains (latency), then one add. */
static inline __attribute__((always_inline)) __m512i dot8(const __m512i *W, const int8_t *x) {
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (int w = 0; w < 8; w += 2) {
        s0 = _mm512_dpbusd_epi32(s0, W[w], bcast4(x + 4 * w));
        s1 = _mm512_dpbusd_epi32(s1, W[w + 1], bcast4(x + 4 * w + 4));
    }
    return _mm512_add_epi32(s0, s1);
}

/* dot4 of words 0-3 (x's first 16) and 4-7 (its second 16), apart: Q6_K's two scales. */
static inline __attribute__((always_inline)) void dot4x2(const __m512i *W, const int8_t *x,
                                                         __m512i *lo, __m512i *hi) {
    __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
    for (int w = 0; w < 4; w++) {
        a = _mm512_dpbusd_epi32(a, W[w], bcast4(x + 4 * w));
        b = _mm512_dpbusd_epi32(b, W[w + 4], bcast4(x + 16 + 4 * w));
    }
    *lo = a, *hi = b;
}

/* Low (hi = 0) or high nibbles of 4 or 8 vectors: words 0-3 the low nibbles of v[0..3], 4-7 the
 * high ones (Q4_0/Q4_1: bytes qs[4w..] hold elements 4w.. and 16 + 4w..). */
static inline __attribute__((always_inline)) void nibbles4(const uint8_t *v, __m512i *W) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    for (int w = 0; w < 4; w++) {
        __m512i q = _mm512_loadu_si512(v + 64 * w);
        W[w] = _mm512_and_si512(q, low4);
        W[w + 4] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
    }
}

/* One group (16 rows) against mrt <= RM rows of x: acc [i] += every block's terms. */
static inline __attribute__((always_inline)) void group_tile(
        const int type, const int mrt, const uint8_t *grp, const int8_t *xq, const float *xs,
        const int32_t *xi, int64_t k, int64_t kp, int64_t gp, __m512 *acc) {
    const int64_t block = q_block(type), bb = q_r16_block_bytes(type);
    const __m512i low4 = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(3);
    for (int64_t b = 0; b < k / block; b++) {
        const uint8_t *g = grp + b * bb;
        const int64_t e0 = b * block;
        if (block == 32) {
            __m512 d = widen16(g), m = _mm512_setzero_ps();
            __m512i W[8];
            if (type == T_Q8_0)
                for (int w = 0; w < 8; w++) W[w] = _mm512_loadu_si512(g + 32 + 64 * w);
            else
                nibbles4(g + (type == T_Q4_1 ? 64 : 32), W);
            if (type == T_Q4_1) m = widen16(g + 32);
            for (int i = 0; i < mrt; i++) {
                const int8_t *x = xq + i * kp + e0;
                const float dx = xs[i * (kp / 4) + e0 / 4];
                const int32_t qs = xi[i * gp + e0 / 16] + xi[i * gp + e0 / 16 + 1];
                __m512i s = dot8(W, x);
                if (type != T_Q4_1)
                    s = _mm512_sub_epi32(s, _mm512_set1_epi32((type == T_Q8_0 ? 128 : 8) * qs));
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),
                                         _mm512_mul_ps(d, _mm512_set1_ps(dx)), acc[i]);
                if (type == T_Q4_1)
                    acc[i] = _mm512_fmadd_ps(m, _mm512_set1_ps(dx * (float)qs), acc[i]);
            }
        } else if (type == T_Q4_K) {
            __m512 d = widen16(g), dmin = widen16(g + 32);
            for (int p = 0; p < 4; p++) {  /* qs bytes 32p..: sub-block 2p low, 2p + 1 high */
                __m512i V[8];
                for (int w = 0; w < 8; w++) V[w] = _mm512_loadu_si512(g + 320 + 512 * p + 64 * w);
                for (int h = 0; h < 2; h++) {
                    const int j = 2 * p + h;
                    __m512i W[8];
                    for (int w = 0; w < 8; w++)
                        W[w] = _mm512_and_si512(h ? _mm512_srli_epi16(V[w], 4) : V[w], low4);
                    __m512 a = _mm512_mul_ps(d, bytes16(g + 64 + 16 * j, 0));
                    __m512 bm = _mm512_xor_ps(_mm512_set1_ps(-0.0f),  /* -(dmin * mn) */
                                              _mm512_mul_ps(dmin, bytes16(g + 192 + 16 * j, 0)));
                    for (int i = 0; i < mrt; i++) {
                        const int64_t e = e0 + 32 * j;
                        const float dx = xs[i * (kp / 4) + e / 4];
                        const int32_t qs = xi[i * gp + e / 16] + xi[i * gp + e / 16 + 1];
                        __m512i s = dot8(W, xq + i * kp + e);
                        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s),
                                                 _mm512_mul_ps(a, _mm512_set1_ps(dx)), acc[i]);
                        acc[i] = _mm512_fmadd_ps(bm, _mm512_set1_ps(dx * (float)qs), acc[i]);
                    }
                }
            }
        } else {  /* T_Q6_K: sub-block j = elements 32j..: half n, quarter r (as ggml's order) */
            __m512 d = widen16(g);
            const uint8_t *ql = g + 288, *qh = g + 288 + 2048;
            for (int j = 0; j < 8; j++) {
                const int n = j / 4, r = j % 4;
                __m512i W[8];
                for (int w = 0; w < 8; w++) {
                    __m512i l = _mm512_loadu_si512(ql + 64 * (16 * n + 8 * (r & 1) + w));
                    __m512i hb = _mm512_loadu_si512(qh + 64 * (8 * n + w));
                    l = _mm512_and_si512(r >= 2 ? _mm512_srli_epi16(l, 4) : l, low4);
                    hb = _mm512_and_si512(_mm512_srli_epi16(hb, 2 * r), two);
                    W[w] = _mm512_or_si512(l, _mm512_slli_epi16(hb, 4));
                }
                /* words 0-3: elements 0-15 (group 2j), 4-7: 16-31 (group 2j + 1) */
                __m512i sc0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(g + 32 + 32 * j)));
                __m512i sc1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(g + 48 + 32 * j)));
                for (int i = 0; i < mrt; i++) {
                    const int64_t e = e0 + 32 * j;
                    const float dx = xs[i * (kp / 4) + e / 4];
                    __m512i lo, hi;
                    dot4x2(W, xq + i * kp + e, &lo, &hi);
                    lo = _mm512_sub_epi32(lo, _mm512_set1_epi32(32 * xi[i * gp + e / 16]));
                    hi = _mm512_sub_epi32(hi, _mm512_set1_epi32(32 * xi[i * gp + e / 16 + 1]));
                    __m512i t = _mm512_add_epi32(_mm512_mullo_epi32(lo, sc0),
                                                 _mm512_mullo_epi32(hi, sc1));
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t),
                                             _mm512_mul_ps(d, _mm512_set1_ps(dx)), acc[i]);
                }
            }
        }
    }
}

static inline __attribute__((always_inline)) void r16_pass(
        const int type, const int mrt, const uint8_t *grp, int nr, const int8_t *xq,
        const float *xs, const int32_t *xi, int64_t k, int64_t kp, int64_t gp, const float *bias,
        float *y, int64_t ldy) {
    __m512 acc[RM];
    for (int i = 0; i < mrt; i++) acc[i] = _mm512_setzero_ps();
    group_tile(type, mrt, grp, xq, xs, xi, k, kp, gp, acc);
    const __mmask16 keep = (__mmask16)((1u << nr) - 1);
    __m512 bv = bias ? _mm512_maskz_loadu_ps(keep, bias) : _mm512_setzero_ps();
    for (int i = 0; i < mrt; i++) {
        __m512 v = bias ? _mm512_add_ps(acc[i], bv) : acc[i];
        _mm512_mask_storeu_ps(y + i * ldy, keep, v);
    }
}

/* One copy per type and pass height (1-RM x rows), the switches folded away. */
#define R16_FOR(T)                                                                          \
    static void r16_##T(const uint8_t *grp, int nr, const int8_t *xq, const float *xs,      \
                        const int32_t *xi, int64_t mr, int64_t k, int64_t kp, int64_t gp,   \
                        const float *bias, float *y, int64_t ldy) {                         \
        for (int64_t i0 = 0; i0 < mr; i0 += RM) {                                           \
            const int8_t *q = xq + i0 * kp;                                                 \
            const float *s = xs + i0 * (kp / 4);                                            \
            const int32_t *t = xi + i0 * gp;                                                \
            float *o = y + i0 * ldy;                                                        \
            switch (mr - i0 < RM ? mr - i0 : RM) {                                          \
            case 1: r16_pass(T, 1, grp, nr, q, s, t, k, kp, gp, bias, o, ldy); break;      \
            case 2: r16_pass(T, 2, grp, nr, q, s, t, k, kp, gp, bias, o, ldy); break;      \
            case 3: r16_pass(T, 3, grp, nr, q, s, t, k, kp, gp, bias, o, ldy); break;      \
            case 4: r16_pass(T, 4, grp, nr, q, s, t, k, kp, gp, bias, o, ldy); break;      \
            case 5: r16_pass(T, 5, grp, nr, q, s, t, k, kp, gp, bias, o, ldy); break;      \
            default: r16_pass(T, RM, grp, nr, q, s, t, k, kp, gp, bias, o, ldy); break;    \
            }                                                                               \
        }                                                                                   \
    }
R16_FOR(T_Q4_0) R16_FOR(T_Q4_1) R16_FOR(T_Q8_0) R16_FOR(T_Q4_K) R16_FOR(T_Q6_K)

void q_r16(int type, const uint8_t *grp, int nr, const int8_t *xq, const float *xs,
           const int32_t *xi, int64_t mr, int64_t k, int64_t kp, int64_t gp, const float *bias,
           float *y, int64_t ldy) {
    switch (type) {
    case T_Q4_0: r16_T_Q4_0(grp, nr, xq, xs, xi, mr, k, kp, gp, bias, y, ldy); break;
    case T_Q4_1: r16_T_Q4_1(grp, nr, xq, xs, xi, mr, k, kp, gp, bias, y, ldy); break;
    case T_Q8_0: r16_T_Q8_0(grp, nr, xq, xs, xi, mr, k, kp, gp, bias, y, ldy); break;
    case T_Q4_K: r16_T_Q4_K(grp, nr, xq, xs, xi, mr, k, kp, gp, bias, y, ldy); break;
    case T_Q6_K: r16_T_Q6_K(grp, nr, xq, xs, xi, mr, k, kp, gp, bias, y, ldy); break;
    }
}

#else

void q_r16(int type, const uint8_t *grp, int nr, const int8_t *xq, const float *xs,
           const int32_t *xi, int64_t mr, int64_t k, int64_t kp, int64_t gp, const float *bias,
           float *y, int64_t ldy) {
    /* never called: tandem_q_r16_bytes is 0 in this build, so nothing is interleaved */
    (void)type, (void)grp, (void)nr, (void)xq, (void)xs, (void)xi, (void)mr, (void)k, (void)kp;
    (void)gp, (void)bias, (void)y, (void)ldy;
}

#endif
