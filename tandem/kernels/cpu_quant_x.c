/* x rows prepared for the quantized kernels (cpu_quant.c calls both, for the segments that want
 * each): rounded to int8 with their steps and integer sums, once per call, so every weight row
 * multiplies the same integers. prepare_x is llama.cpp's Q8_0 rounding of activations;
 * prepare_xk feeds the interleaved K-quant kernel (cpu_quant_r16.c). */
#include "quant_format.h"
#include "quant_direct.h"

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

/* x rows quantized: q [kp] int8, lane scales xs [kp / 4], block sums xb [GROUPS(kp)] (ax * sum q)
 * and xi [GROUPS(kp)] (sum q, for interleaved weights). */
void prepare_x(const float *x, int64_t k, int64_t kp, int8_t *q, float *xs, float *xb,
               int32_t *xi) {
    for (int64_t c = 0; c < k; c += 32) {
        const float amax = amax32(x + c);
        float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int sum0 = 0, sum1 = 0;
        for (int j = 0; j < 32; j++) {
            int v = (int)nearbyintf(x[c + j] * id);
            v = v > 127 ? 127 : v < -127 ? -127 : v;
            q[c + j] = (int8_t)v;
            if (j < 16) sum0 += v; else sum1 += v;
        }
        for (int l = 0; l < 8; l++) xs[c / 4 + l] = d;
        xb[c / 16] = d * (float)sum0, xb[c / 16 + 1] = d * (float)sum1;
        xi[c / 16] = sum0, xi[c / 16 + 1] = sum1;
    }
    memset(q + k, 0, (size_t)(kp - k));
    for (int64_t l = k / 4; l < kp / 4; l++) xs[l] = 0.0f;
    for (int64_t g = k / 16; g < GROUPS(kp); g++) xb[g] = 0.0f, xi[g] = 0;
}

/* x rows for interleaved K-quant weights (cpu_quant_r16.c), whose every scale then goes into
 * the integer sums and one float step per 256 elements remains: per 256 a step D = max|x| /
 * (127 * 8), per 32 the smallest e in 1..8 with (max|x| over the 32) <= 127 D e, and q =
 * round(x / (D e)) (nearest even). A 32 of small values keeps a step up to 8x finer than the
 * 256's largest needs: llama.cpp's Q8_K (one step per 256, no e) measured 2.7x the KL of
 * steps per 32 on Gemma 3, this the same KL. Per 256 one record (quant_direct.h: q, D, e per
 * 32, and the words whose 16-bit halves are e * (sum q) of two neighbours, the multipliers of
 * the kernel's vpmaddwd pairs, made once per x row instead of once per weight block: [p] the
 * 32s 2p and 2p + 1 (Q4_K/Q5_K mins), [4 + j] the 16s 2j and 2j + 1 (Q6_K's offsets); each
 * within int16, 8 * 32 * 127), the next 256's cstride bytes on. k is a multiple of 256. */
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
            int sum0 = 0, sum1 = 0;
            for (int t = 0; t < 32; t++) {
                int v = (int)nearbyintf(x[c + 32 * j + t] * id);
                v = v > 127 ? 127 : v < -127 ? -127 : v;
                q[32 * j + t] = (int8_t)v;
                if (t < 16) sum0 += v; else sum1 += v;
            }
            ev[j] = e;
            es[2 * j] = e * sum0, es[2 * j + 1] = e * sum1;
        }
        for (int p = 0; p < 4; p++)
            w[p] = pair16(es[4 * p] + es[4 * p + 1], es[4 * p + 2] + es[4 * p + 3]);
        for (int j = 0; j < 8; j++) w[4 + j] = pair16(es[2 * j], es[2 * j + 1]);
        for (int u = 12; u < 16; u++) w[u] = 0;
    }
}
