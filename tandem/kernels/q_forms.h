/* GGUF blocks and x rows in the one form the quantized matmul (cpu_quant.c) multiplies.
 *
 * Every supported block type is read as: per element an unsigned integer u (4-8 bits), per 16
 * elements a scale a and an offset b, the weight being a * u + b:
 *   Q4_0 u = nibble, b = -8d        Q4_1 u = nibble, b = m        Q8_0 u = q + 128, b = -128d
 *   Q5_0 u = 5 bits, b = -16d       Q5_1 u = 5 bits, b = m        (a = d for these)
 *   Q4_K/Q5_K u = 4/5 bits, a = d * scale, b = -dmin * min       Q6_K u = 6 bits, a = d * scale,
 *   b = -32 a.
 * (With SIGNED_Q8, AVX2's form, Q8_0 keeps its signed q and b = 0.) A row of x becomes int8 per
 * block of 32 with its scales and block sums (prepare_x).
 *
 * Included by cpu_quant.c alone, after it defines SIGNED_Q8 for the instruction set: static
 * functions, compiled with that file's flags into its translation unit, so the unpacking inlines
 * into the matmul's loops.
 */
#ifndef TANDEM_Q_FORMS_H
#define TANDEM_Q_FORMS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "f16.h"
#include "kernels.h"

enum { T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13,
       T_Q6_K = 14 };

/* The 6-bit scale and min j of a Q4_K/Q5_K block (12 packed bytes). */
static void k_scale_min(const uint8_t *q, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | (q[j - 4] >> 6) << 4;
        *mn = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

/* 16 bytes as one value (GCC vector extension: SSE2 or NEON, any x86-64 or Arm machine). */
typedef uint8_t v16u __attribute__((vector_size(16)));
typedef int8_t v16s __attribute__((vector_size(16)));
typedef float v4f __attribute__((vector_size(16)));
static inline __attribute__((always_inline)) v16u ld(const uint8_t *p) { v16u v; memcpy(&v, p, 16); return v; }
static inline __attribute__((always_inline)) void st(uint8_t *p, v16u v) { memcpy(p, &v, 16); }

/* HIGH5[byte] = eight bytes, byte i 16 where bit i of `byte` is set: a Q5 block's fifth bits. */
static uint64_t HIGH5[256];
static void init_high5(void) {
    for (int v = 0; v < 256; v++) {
        uint64_t r = 0;
        for (int i = 0; i < 8; i++) r |= (uint64_t)(v >> i & 1) << (8 * i + 4);
        HIGH5[v] = r;
    }
}

static inline __attribute__((always_inline)) void nibbles(const uint8_t *q, uint8_t *lo, uint8_t *hi) {
    v16u v = ld(q);
    st(lo, v & 0xF), st(hi, v >> 4);
}

/* One block of `type` -> u [block], a and b [block / 16]. For Q8_0 with SIGNED_Q8, u gets |q|
 * and s the signed q. Byte work in 16-byte vectors: at one row of x, unpacking is most of a
 * matmul's instructions. */
static void unpack_block(int type, const uint8_t *p, uint8_t *u, int8_t *s, float *a, float *b) {
    switch (type) {
    case T_Q4_0: case T_Q4_1: {
        nibbles(p + (type == T_Q4_0 ? 2 : 4), u, u + 16);
        float d = f16_at(p), off = type == T_Q4_0 ? -8.0f * d : f16_at(p + 2);
        a[0] = a[1] = d, b[0] = b[1] = off;
        break;
    }
    case T_Q5_0: case T_Q5_1: {
        const uint8_t *qh = p + (type == T_Q5_0 ? 2 : 4);
        nibbles(qh + 4, u, u + 16);
        uint64_t high[4] = {HIGH5[qh[0]], HIGH5[qh[1]], HIGH5[qh[2]], HIGH5[qh[3]]};
        uint8_t hb[32];
        memcpy(hb, high, 32);  /* byte e: bit e of the 32-bit qh, as 16 */
        st(u, ld(u) | ld(hb)), st(u + 16, ld(u + 16) | ld(hb + 16));
        float d = f16_at(p), off = type == T_Q5_0 ? -16.0f * d : f16_at(p + 2);
        a[0] = a[1] = d, b[0] = b[1] = off;
        break;
    }
    case T_Q8_0: {
        float d = f16_at(p);
        a[0] = a[1] = d;
        for (int h = 0; h < 32; h += 16) {
            v16s q;
            memcpy(&q, p + 2 + h, 16);
            if (SIGNED_Q8) {
                v16s neg = q >> 7;  /* -1 where q < 0 */
                memcpy(s + h, &q, 16);
                st(u + h, (v16u)((q ^ neg) - neg));
            } else {
                st(u + h, (v16u)q ^ 0x80);  /* q + 128 */
            }
        }
        b[0] = b[1] = SIGNED_Q8 ? 0.0f : -128.0f * d;
        break;
    }
    case T_Q4_K: case T_Q5_K: {
        float d = f16_at(p), dmin = f16_at(p + 2);
        const uint8_t *sc = p + 4, *qh = p + 16, *qs = p + (type == T_Q4_K ? 16 : 48);
        for (int j = 0; j < 8; j += 2) { /* sub-blocks j and j + 1: 32 bytes, low and high */
            nibbles(qs + j * 16, u + j * 32, u + (j + 1) * 32);
            nibbles(qs + j * 16 + 16, u + j * 32 + 16, u + (j + 1) * 32 + 16);
        }
        if (type == T_Q5_K)
            for (int j = 0; j < 8; j++)
                for (int h = 0; h < 32; h += 16)
                    st(u + j * 32 + h, ld(u + j * 32 + h) | ((ld(qh + h) >> j) & 1) << 4);
        for (int j = 0; j < 8; j++) {
            int scale, mn;
            k_scale_min(sc, j, &scale, &mn);
            a[2 * j] = a[2 * j + 1] = d * (float)scale;
            b[2 * j] = b[2 * j + 1] = -(dmin * (float)mn);
        }
        break;
    }
    case T_Q6_K: {
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = f16_at(p + 208);
        for (int n = 0; n < 2; n++, ql += 64, qh += 32) {
            uint8_t *y = u + n * 128;
            for (int h = 0; h < 32; h += 16) {
                v16u l0 = ld(ql + h), l1 = ld(ql + 32 + h), hh = ld(qh + h);
                st(y + h, (l0 & 0xF) | (hh & 3) << 4);
                st(y + 32 + h, (l1 & 0xF) | (hh >> 2 & 3) << 4);
                st(y + 64 + h, (l0 >> 4) | (hh >> 4 & 3) << 4);
                st(y + 96 + h, (l1 >> 4) | (hh >> 6 & 3) << 4);
            }
        }
        for (int g = 0; g < 16; g++) a[g] = d * (float)sc[g], b[g] = -32.0f * a[g];
        break;
    }
    }
}

/* Offsets and block sums are kept for a whole number of 8 groups of 16 (offsets_dot's step). */
#define GROUPS(kp) (((kp) / 16 + 7) / 8 * 8)

/* A weight row in the common form, over kp >= k elements (the tail zero): u [kp], s [kp]
 * (SIGNED_Q8 only), lane scales la [kp / 4], offsets b16 [GROUPS(kp)]. */
typedef struct {
    uint8_t *u;
    int8_t *s;
    float *la, *b16;
} row_form;

static void unpack_row(int type, const uint8_t *row, int64_t k, int64_t kp, row_form r) {
    int64_t block = tandem_q_block(type), bytes = tandem_q_block_bytes(type);
    float a16[16];
    for (int64_t c = 0, blk = 0; c < k; c += block, blk++) {
        unpack_block(type, row + blk * bytes, r.u + c, r.s ? r.s + c : NULL, a16, r.b16 + c / 16);
        for (int64_t g = 0; g < block / 16; g++) {  /* 4 lanes of 4 elements per scale */
            v4f v = {a16[g], a16[g], a16[g], a16[g]};
            memcpy(r.la + c / 4 + 4 * g, &v, 16);
        }
    }
    memset(r.u + k, 0, (size_t)(kp - k));
    if (r.s) memset(r.s + k, 0, (size_t)(kp - k));
    for (int64_t l = k / 4; l < kp / 4; l++) r.la[l] = 0.0f;
    for (int64_t g = k / 16; g < GROUPS(kp); g++) r.b16[g] = 0.0f;
}

/* x rows quantized: q [kp] int8, lane scales xs [kp / 4], block sums xb [GROUPS(kp)] (ax * sum q). */
static void prepare_x(const float *x, int64_t k, int64_t kp, int8_t *q, float *xs, float *xb) {
    for (int64_t c = 0; c < k; c += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[c + j]));
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
    }
    memset(q + k, 0, (size_t)(kp - k));
    for (int64_t l = k / 4; l < kp / 4; l++) xs[l] = 0.0f;
    for (int64_t g = k / 16; g < GROUPS(kp); g++) xb[g] = 0.0f;
}

#endif
