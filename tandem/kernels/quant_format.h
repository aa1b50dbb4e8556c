/* What the quantized kernel files share: the instruction set they are built for, the GGUF block
 * types (elements and bytes per block, and per block of the interleaved layout), and their entries
 * into each other (cpu_quant.c calls the others). Where each byte of a block lies is said once,
 * in cpu_quant_pack.c (GGUF's block -> the interleaved layout). */
#ifndef TANDEM_QUANT_FORMAT_H
#define TANDEM_QUANT_FORMAT_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "f16.h"

/* The build's vector kind: AVX-512 with VNNI, AVX2 with FMA and F16C, Arm NEON, or none (plain
 * C, any other CPU). Each reads the interleaved layout (quant_r16_vec.h) with the same bits. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define Q_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define Q_AVX2 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define Q_NEON 1
#endif

/* In a descriptor's type: the rows are interleaved 16 at a time (cpu_quant_pack.c). */
#define Q_R16 0x100
/* Interleaved Q8_0 holds u = q + 128 where vpdpbusd reads it (it takes 0-255 against signed x),
 * elsewhere the file's signed q (AVX2's vpsignb, Arm's sdot and plain C take it as it is). */
#ifdef Q_AVX512
#define R16_Q8_SIGNED 0
#else
#define R16_Q8_SIGNED 1
#endif

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
 * a row more, their scales and mins unpacked); 0 for a type never interleaved (F16, BF16). A
 * constant wherever the type is, so the kernel's offsets fold. */
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

/* The F16 or BF16 value stored little-endian at p, as float32 (exact). */
static inline float half_at(int type, const uint8_t *p) {
    uint16_t v = (uint16_t)(p[0] | p[1] << 8);
    if (type == T_F16) return f16_to_f32(v);
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* cpu_quant_half.c: F16/BF16 weight rows (nr <= HALF_ROWS of them, row_bytes apart from w0, in
 * GGUF's order) against float32 x [mr, k] (k a multiple of 16): y [i * ldy + j] (+ bias [j]).
 * Returns -1 for another type or k. */
#define HALF_ROWS 4
int q_half(int type, const uint8_t *w0, int64_t row_bytes, int nr, const float *x, int64_t mr,
           int64_t k, const float *bias, float *y, int64_t ldy);

/* x for the interleaved K-quants (prepare_xk): per 256 elements of a row one record of XK_BYTES:
 * q [256] int8, the 16 pair words (int32) at XK_W, e [8] (int32) at XK_E, D (float) at XK_D.
 * A 256's records for consecutive x rows lie XK_BYTES apart, so a kernel reaches each row's by a
 * constant offset from one pointer (x rows kp apart took a register, or a spill, each); the next
 * 256's lie `cstride` bytes on. */
#define XK_BYTES 384
#define XK_W 256
#define XK_E 320
#define XK_D 352

/* cpu_quant_r16.c: 16 interleaved rows (one group of tandem_q_r16_pack's layout at grp, nr of
 * them real) against mr rows of prepared x: 32-element types the rows of prepare_x (xq kp
 * apart, xs kp / 4 apart, xi gp apart), K-quant types the records at xk (cstride apart per
 * 256): y [i * ldy + j] (+ bias [j]) for i < mr, j < nr. */
void q_r16(int type, const uint8_t *grp, int nr, const int8_t *xq, const float *xs,
           const int32_t *xi, const uint8_t *xk, int64_t cstride, int64_t mr, int64_t k,
           int64_t kp, int64_t gp, const float *bias, float *y, int64_t ldy);

/* cpu_quant_x.c: one row of x [k] rounded for the kernels: per 32 to int8 q [k], the 32's step
 * at xs [c / 4] (xs [k / 4], where cpu_quant_r16.c reads it) and the integer sums per 16 xi
 * [k / 16] (k a multiple of 32); or, for the K-quants, per 256 with sub-steps, into its records
 * (k a multiple of 256). */
void prepare_x(const float *x, int64_t k, int8_t *q, float *xs, int32_t *xi);
void prepare_xk(const float *x, int64_t k, uint8_t *rec, int64_t cstride);

#endif
