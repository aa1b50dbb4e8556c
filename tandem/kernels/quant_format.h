/* The GGUF block formats the quantized kernels read (cpu_quant.c, cpu_quant_direct.c), and the
 * numerics both multiply with: which instructions (STEP elements a step, tiles of MR x rows by
 * NR weight rows), each block as (u, scale a and offset b per 16), and the offsets' fixed-order
 * sum. Both files include it and are built with the same flags (no contraction), so the two ways
 * of multiplying give the same bits. */
#ifndef TANDEM_QUANT_FORMAT_H
#define TANDEM_QUANT_FORMAT_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "f16.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define STEP 64
#define MR 4
#define NR 4
#define SIGNED_Q8 0
#elif defined(__AVX2__)
#include <immintrin.h>
#define STEP 32
#define MR 2
#define NR 4
#define SIGNED_Q8 1
#else
#define STEP 32
#define MR 1
#define NR 4
#define SIGNED_Q8 0
#endif

/* In a descriptor's type: the rows are interleaved 16 at a time (cpu_quant_pack.c), which only
 * the AVX-512 VNNI, AVX2 (with FMA and F16C) and Arm NEON builds read (cpu_quant_r16.c). */
#define Q_R16 0x100
#if STEP == 64 || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)) \
    || (defined(__aarch64__) && defined(__ARM_NEON))
#define R16_KERNEL 1
#else
#define R16_KERNEL 0
#endif
/* Interleaved Q8_0 holds u = q + 128 where vpdpbusd reads it (it takes 0-255 against signed x),
 * elsewhere the file's signed q (AVX2's vpsignb and Arm's sdot take it as it is). */
#define R16_Q8_SIGNED (STEP != 64)

enum { T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13,
       T_Q6_K = 14, T_F16 = 1, T_BF16 = 30 };
/* F16 and BF16 are float formats (cpu_quant_half.c multiplies them with float x): "blocks" of 1. */
static inline int is_half(int type) { return type == T_F16 || type == T_BF16; }
static inline int64_t q_block(int type) { /* elements per block; 0: not a type of this file */
    switch (type) {
    case T_Q4_0: case T_Q4_1: case T_Q5_0: case T_Q5_1: case T_Q8_0: return 32;
    case T_Q4_K: case T_Q5_K: case T_Q6_K: return 256;
    case T_F16: case T_BF16: return 1;
    default: return 0;
    }
}

static inline int64_t q_block_bytes(int type) {
    switch (type) {
    case T_Q4_0: return 18; case T_Q4_1: return 20; case T_Q5_0: return 22; case T_Q5_1: return 24;
    case T_Q8_0: return 34; case T_Q4_K: return 144; case T_Q5_K: return 176; case T_Q6_K: return 210;
    case T_F16: case T_BF16: return 2;
    default: return 0;
    }
}

/* Bytes of one block of 16 interleaved rows (cpu_quant_pack.c's layout: K-quants keep 4 bytes
 * a row more, their scales and mins unpacked); a constant wherever the type is, so the kernel's
 * offsets fold. */
static inline int64_t q_r16_block_bytes(int type) {
    switch (type) {
    case T_Q4_0: return 16 * 18;
    case T_Q4_1: return 16 * 20;
    case T_Q5_0: return 16 * 22;
    case T_Q5_1: return 16 * 24;
    case T_Q8_0: return 16 * 34;
    case T_Q4_K: return 16 * 148;
    case T_Q5_K: return 16 * 180;
    case T_Q6_K: return 16 * 210;
    default: return 0;
    }
}

/* The 6-bit scale and min j of a Q4_K/Q5_K block (12 packed bytes). */
static inline void k_scale_min(const uint8_t *q, int j, int *sc, int *mn) {
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
static inline void init_high5(void) {
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

/* A block's scale a and offset b per 16 elements, a [block / 16] and b [block / 16] (b = 0 for
 * Q8_0 with SIGNED_Q8). One definition for both ways of multiplying: the same bits. */
static inline void block_scales(int type, const uint8_t *p, float *a, float *b) {
    switch (type) {
    case T_Q4_0: case T_Q4_1: case T_Q5_0: case T_Q5_1: case T_Q8_0: {
        float d = f16_at(p);
        float off = type == T_Q4_0 ? -8.0f * d : type == T_Q5_0 ? -16.0f * d
                  : type == T_Q8_0 ? (SIGNED_Q8 ? 0.0f : -128.0f * d) : f16_at(p + 2);
        a[0] = a[1] = d, b[0] = b[1] = off;
        break;
    }
    case T_Q4_K: case T_Q5_K: {
        float d = f16_at(p), dmin = f16_at(p + 2);
        for (int j = 0; j < 8; j++) {
            int scale, mn;
            k_scale_min(p + 4, j, &scale, &mn);
            a[2 * j] = a[2 * j + 1] = d * (float)scale;
            b[2 * j] = b[2 * j + 1] = -(dmin * (float)mn);
        }
        break;
    }
    case T_Q6_K: {
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = f16_at(p + 208);
        for (int g = 0; g < 16; g++) a[g] = d * (float)sc[g], b[g] = -32.0f * a[g];
        break;
    }
    }
}

/* One block of `type` -> u [block], a and b [block / 16]. For Q8_0 with SIGNED_Q8, u gets |q|
 * and s the signed q. Byte work in 16-byte vectors: at one row of x, unpacking is most of a
 * matmul's instructions. */
static inline void unpack_block(int type, const uint8_t *p, uint8_t *u, int8_t *s, float *a, float *b) {
    switch (type) {
    case T_Q4_0: case T_Q4_1:
        nibbles(p + (type == T_Q4_0 ? 2 : 4), u, u + 16);
        break;
    case T_Q5_0: case T_Q5_1: {
        const uint8_t *qh = p + (type == T_Q5_0 ? 2 : 4);
        nibbles(qh + 4, u, u + 16);
        uint64_t high[4] = {HIGH5[qh[0]], HIGH5[qh[1]], HIGH5[qh[2]], HIGH5[qh[3]]};
        uint8_t hb[32];
        memcpy(hb, high, 32);  /* byte e: bit e of the 32-bit qh, as 16 */
        st(u, ld(u) | ld(hb)), st(u + 16, ld(u + 16) | ld(hb + 16));
        break;
    }
    case T_Q8_0:
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
        break;
    case T_Q4_K: case T_Q5_K: {
        const uint8_t *qh = p + 16, *qs = p + (type == T_Q4_K ? 16 : 48);
        for (int j = 0; j < 8; j += 2) { /* sub-blocks j and j + 1: 32 bytes, low and high */
            nibbles(qs + j * 16, u + j * 32, u + (j + 1) * 32);
            nibbles(qs + j * 16 + 16, u + j * 32 + 16, u + (j + 1) * 32 + 16);
        }
        if (type == T_Q5_K)
            for (int j = 0; j < 8; j++)
                for (int h = 0; h < 32; h += 16)
                    st(u + j * 32 + h, ld(u + j * 32 + h) | ((ld(qh + h) >> j) & 1) << 4);
        break;
    }
    case T_Q6_K: {
        const uint8_t *ql = p, *qh = p + 128;
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
        break;
    }
    }
    block_scales(type, p, a, b);
}

/* The F16 or BF16 value stored little-endian at p, as float32 (exact). */
static inline float half_at(int type, const uint8_t *p) {
    uint16_t v = (uint16_t)(p[0] | p[1] << 8);
    if (type == T_F16) return f16_to_f32(v);
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Offsets and block sums are kept for a whole number of 8 groups of 16 (offsets_dot's step). */
#define GROUPS(kp) (((kp) / 16 + 7) / 8 * 8)

static inline void init_tables(void) {
    static int done;
    if (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) {  /* idempotent: racing callers agree */
        init_high5();
        __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
    }
}

/* sum over g of b16[g] * xb[g] (groups a multiple of 8), in a fixed order (8 partial sums,
 * then a fixed tree). */
static inline float offsets_dot(const float *b16, const float *xb, int64_t groups) {
    float p[8] = {0};
    for (int64_t g = 0; g < groups; g += 8)
        for (int l = 0; l < 8; l++) p[l] += b16[g + l] * xb[g + l];
    return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

/* A lane accumulator reduced to one float, in one fixed order. */
#if STEP == 64
static inline float lanes_sum(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    return (q[0] + q[2]) + (q[1] + q[3]);
}
#elif defined(__AVX2__)
static inline float lanes_sum(__m256 v) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    return (q[0] + q[2]) + (q[1] + q[3]);
}
#endif

#endif
