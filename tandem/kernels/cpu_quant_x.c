/* x rows prepared for the quantized kernels (cpu_quant.c calls both, for the segments that want
 * each): rounded to int8 with their steps and integer sums, once per call, so every weight row
 * multiplies the same integers. prepare_x is llama.cpp's Q8_0 rounding of activations;
 * prepare_xk feeds the interleaved K-quant kernel (cpu_quant_r16.c). */
#include "quant_format.h"

#if defined(__AVX2__)
#include <immintrin.h>
/* max |x| over 32, 8 lanes at a time: MAXPS (a, m) is `a > m ? a : m` (a NaN never taken, as
 * the scalar loop below), and the lanes' maxima meet in any order (max is exact). */
static inline float amax32(const float *x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < 32; j += 8)
        m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

/* q [32] = x [32] * id rounded to the nearest integer (ties to even: cvtps2dq in the default
 * rounding mode, as nearbyintf), clamped to +-127 (a NaN's INT_MIN to -127, as x86's scalar
 * conversion gives); *sum0, *sum1 the sums of q's halves. The scalar loop's results. */
static inline void round32(const float *x, float id, int8_t *q, int *sum0, int *sum1) {
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
    __m256i v[4];
    for (int j = 0; j < 4; j++) {
        const __m256i t = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), vid));
        v[j] = _mm256_max_epi32(_mm256_min_epi32(t, hi), lo);
    }
    /* packs interleave 128-bit lanes: 32-bit groups 0 4 1 5 2 6 3 7 restore element order */
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]),
                                         _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256((__m256i *)q,
                        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    /* both halves' sums at once (integers: any order): lanes 0 and 1 of r */
    __m256i h = _mm256_hadd_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
    h = _mm256_hadd_epi32(h, h);
    const __m128i r = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    *sum0 = _mm_cvtsi128_si32(r), *sum1 = _mm_extract_epi32(r, 1);
}
#else
/* max |x| over 32: a compare, inlined (fmaxf stayed a libm call per element here);
 * the same result, a NaN ignored as fmaxf ignores it. */
static inline float amax32(const float *x) {
    float m = 0.0f;
    for (int j = 0; j < 32; j++) {
        const float a = fabsf(x[j]);
        m = a > m ? a : m;
    }
    return m;
}

/* round32 as above, an element at a time (the reference: the vector code gives its results). */
static inline void round32(const float *x, float id, int8_t *q, int *sum0, int *sum1) {
    int s0 = 0, s1 = 0;
    for (int j = 0; j < 32; j++) {
        int v = (int)nearbyintf(x[j] * id);
        v = v > 127 ? 127 : v < -127 ? -127 : v;
        q[j] = (int8_t)v;
        if (j < 16) s0 += v; else s1 += v;
    }
    *sum0 = s0, *sum1 = s1;
}
#endif

/* A row of x quantized per 32 (for the 32-element types): q [k] int8, the step of the 32 at
 * element c in xs [c / 4], and the integer sums per 16 xi [k / 16]. */
void prepare_x(const float *x, int64_t k, int8_t *q, float *xs, int32_t *xi) {
    for (int64_t c = 0; c < k; c += 32) {
        const float amax = amax32(x + c);
        float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int sum0, sum1;
        round32(x + c, id, q + c, &sum0, &sum1);
        xs[c / 4] = d;
        xi[c / 16] = sum0, xi[c / 16 + 1] = sum1;
    }
}

/* x rows for interleaved K-quant weights (cpu_quant_r16.c), whose every scale then goes into
 * the integer sums and one float step per 256 elements remains: per 256 a step D = max|x| /
 * (127 * 8), per 32 the smallest e in 1..8 with (max|x| over the 32) <= 127 D e, and q =
 * round(x / (D e)) (nearest even). A 32 of small values keeps a step up to 8x finer than the
 * 256's largest needs (one step per 256, llama.cpp's Q8_K, rounds it as coarsely as the
 * largest), so the error stays that of steps per 32 (benchmarks/LOG.md). Per 256 one record
 * (quant_format.h: q, D, e per 32, and the words whose 16-bit halves are e * (sum q) of two
 * neighbours, the multipliers of the kernel's vpmaddwd pairs, made once per x row instead of
 * once per weight block: [p] the 32s 2p and 2p + 1 (Q4_K/Q5_K mins), [4 + j] the 16s 2j and
 * 2j + 1 (Q6_K's offsets); each within int16, 8 * 32 * 127), the next 256's cstride bytes on.
 * k is a multiple of 256. */
static inline int32_t pair16(int32_t lo, int32_t hi) {
    return (int32_t)(((uint32_t)hi << 16) | ((uint32_t)lo & 0xFFFFu));
}

void prepare_xk(const float *x, int64_t k, uint8_t *rec, int64_t cstride) {
    for (int64_t c = 0; c < k; c += 256, rec += cstride) {
        int8_t *q = (int8_t *)rec;
        int32_t *w = (int32_t *)(rec + XK_W), *ev = (int32_t *)(rec + XK_E);
        float m32[8], amax = 0.0f;
        for (int j = 0; j < 8; j++) {
            m32[j] = amax32(x + c + 32 * j);
            amax = m32[j] > amax ? m32[j] : amax;
        }
        const float D = amax / 1016.0f;
        *(float *)(rec + XK_D) = D;
        int32_t es[16];  /* e * (sum q) per 16 */
        for (int j = 0; j < 8; j++) {
            int e = D > 0.0f ? (int)ceilf(m32[j] / (127.0f * D)) : 1;
            e = e < 1 ? 1 : e > 8 ? 8 : e;
            const float id = D > 0.0f ? 1.0f / (D * (float)e) : 0.0f;
            int sum0, sum1;
            round32(x + c + 32 * j, id, q + 32 * j, &sum0, &sum1);
            ev[j] = e;
            es[2 * j] = e * sum0, es[2 * j + 1] = e * sum1;
        }
        for (int p = 0; p < 4; p++)
            w[p] = pair16(es[4 * p] + es[4 * p + 1], es[4 * p + 2] + es[4 * p + 3]);
        for (int j = 0; j < 8; j++) w[4 + j] = pair16(es[2 * j], es[2 * j + 1]);
        for (int u = 12; u < 16; u++) w[u] = 0;
    }
}
