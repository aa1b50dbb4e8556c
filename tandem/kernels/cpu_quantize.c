/* Float32 rows -> GGUF blocks (Q8_0, Q4_0, Q4_K, Q6_K): quantizing a float checkpoint at load
 * (tandem/layers/quantized.py), tensor by tensor, so a model never exists in float32 whole.
 *
 * Q8_0 and Q4_0 follow ggml's reference rounding (scale from the largest magnitude). Q4_K takes
 * each 32-element sub-block's own range (min clipped at 0, as the format stores -min >= 0),
 * then the super-block's two 6-bit scale codes from the largest of those, and rounds every
 * element with the stored (float16-rounded) scales; ggml's iterative search for the best scales
 * is not done, so errors are somewhat larger than llama-quantize's. The kernels in
 * cpu_quant.c read what this writes like any file's blocks.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "f16.h"
#include "kernels.h"

static void put_f16(uint8_t *p, float f) {
    uint16_t h = f32_to_f16(f);
    p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}

static void q8_0(const float *x, uint8_t *p) { /* 32 -> 34 bytes */
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(p, d);
    for (int j = 0; j < 32; j++) p[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

static void q4_0(const float *x, uint8_t *p) { /* 32 -> 18 bytes */
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
    float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(p, d);
    for (int j = 0; j < 16; j++) {
        int a = (int)(x[j] * id + 8.5f), b = (int)(x[j + 16] * id + 8.5f);
        a = a > 15 ? 15 : a < 0 ? 0 : a, b = b > 15 ? 15 : b < 0 ? 0 : b;
        p[2 + j] = (uint8_t)(a | b << 4);
    }
}

static int code6(float v, float step) { /* v / step rounded to 0..63 */
    int c = step > 0.0f ? (int)nearbyintf(v / step) : 0;
    return c > 63 ? 63 : c < 0 ? 0 : c;
}

static void q4_k(const float *x, uint8_t *p) { /* 256 -> 144 bytes */
    float scale[8], mins[8], max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        float lo = 0.0f, hi = 0.0f;
        for (int l = 0; l < 32; l++) lo = fminf(lo, x[32 * j + l]), hi = fmaxf(hi, x[32 * j + l]);
        scale[j] = (hi - lo) / 15.0f, mins[j] = -lo;
        max_scale = fmaxf(max_scale, scale[j]), max_min = fmaxf(max_min, mins[j]);
    }
    float d = max_scale / 63.0f, dmin = max_min / 63.0f;
    put_f16(p, d), put_f16(p + 2, dmin);
    float dq = f16_at(p);
    float mq = f16_at(p + 2);
    int sc[8], mn[8];
    for (int j = 0; j < 8; j++) sc[j] = code6(scale[j], dq), mn[j] = code6(mins[j], mq);
    uint8_t *s = p + 4;
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | (mn[j + 4] & 0xF) << 4);
    }
    uint8_t *qs = p + 16;
    memset(qs, 0, 128);
    for (int j = 0; j < 8; j++) {
        float a = dq * (float)sc[j], m = mq * (float)mn[j];
        for (int l = 0; l < 32; l++) {
            int q = a > 0.0f ? (int)nearbyintf((x[32 * j + l] + m) / a) : 0;
            q = q > 15 ? 15 : q < 0 ? 0 : q;
            qs[(j / 2) * 32 + l] |= (uint8_t)(j % 2 ? q << 4 : q);
        }
    }
}

/* 256 -> 210 bytes: ql [128] (low 4 bits), qh [64] (high 2), int8 scales [16] per 16
 * elements, d (float16). Each 16's step puts its largest magnitude at -32 (as ggml's reference,
 * without its search), or, where a value of the other sign would round past 31, that value at
 * 31.5; coded as d * sc with d = the largest step / -128 and |sc| rounded up, so the step never
 * shrinks below what the 16 need: every element is within half a step; u = q + 32. Element
 * order as ggml's: in each half of 128, ql [l] and ql [l + 32] hold elements l, l + 32 (low
 * nibbles) and l + 64, l + 96 (high), and qh [l] their high bits at 0, 2, 4, 6. */
static void q6_k(const float *x, uint8_t *p) {
    float sc[16], big = 0.0f;
    for (int g = 0; g < 16; g++) {
        float ext = 0.0f, opp = 0.0f;  /* the largest magnitude, and the largest of other sign */
        for (int l = 0; l < 16; l++)
            if (fabsf(x[16 * g + l]) > fabsf(ext)) ext = x[16 * g + l];
        for (int l = 0; l < 16; l++) {
            const float v = x[16 * g + l];
            if (v * ext < 0.0f && fabsf(v) > opp) opp = fabsf(v);
        }
        const float step = fmaxf(fabsf(ext) / 32.0f, opp / 31.5f);  /* q in -32..31 unclipped */
        sc[g] = ext > 0.0f ? -step : step;
        if (fabsf(sc[g]) > fabsf(big)) big = sc[g];
    }
    put_f16(p + 208, big / -128.0f);
    const float d = f16_at(p + 208);
    uint8_t *ql = p, *qh = p + 128, u[256];
    int8_t *scales = (int8_t *)(p + 192);
    for (int g = 0; g < 16; g++) {  /* |code| rounded up: no element of the 16 is clipped */
        const float r = d != 0.0f ? sc[g] / d : 0.0f;
        int c = (int)ceilf(fabsf(r));
        c = r < 0.0f ? -(c > 128 ? 128 : c) : (c > 127 ? 127 : c);
        scales[g] = (int8_t)c;
        const float a = d * (float)c;
        for (int l = 0; l < 16; l++) {
            int q = a != 0.0f ? (int)nearbyintf(x[16 * g + l] / a) : 0;
            q = q > 31 ? 31 : q < -32 ? -32 : q;
            u[16 * g + l] = (uint8_t)(q + 32);
        }
    }
    for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *v = u + 128 * n + l;  /* elements l, l + 32, l + 64, l + 96 */
            ql[64 * n + l] = (uint8_t)((v[0] & 0xF) | (v[64] & 0xF) << 4);
            ql[64 * n + l + 32] = (uint8_t)((v[32] & 0xF) | (v[96] & 0xF) << 4);
            qh[32 * n + l] = (uint8_t)(v[0] >> 4 | (v[32] >> 4) << 2 | (v[64] >> 4) << 4
                                       | (v[96] >> 4) << 6);
        }
}

/* x [rows, k] -> out [rows, k / block * block bytes] in ggml type `type` (8 Q8_0, 2 Q4_0,
 * 12 Q4_K, 14 Q6_K). Returns -1 (nothing written) for another type or a k the blocks do not
 * divide. */
int tandem_quantize(const float *x, int64_t rows, int64_t k, int type, uint8_t *out,
                    int threads) {
    if ((type != 8 && type != 2 && type != 12 && type != 14) || rows < 0) return -1;
    const int64_t block = tandem_q_block(type), bytes = tandem_q_block_bytes(type);
    if (k % block) return -1;
    int64_t row_bytes = k / block * bytes;
    (void)threads;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && rows > 16)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < k; c += block) {
            const float *src = x + r * k + c;
            uint8_t *dst = out + r * row_bytes + c / block * bytes;
            if (type == 8) q8_0(src, dst);
            else if (type == 2) q4_0(src, dst);
            else if (type == 12) q4_k(src, dst);
            else q6_k(src, dst);
        }
    return 0;
}
