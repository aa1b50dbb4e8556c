/* A KV head's many rows against one tile (cpu_attention.c): where every head of a pass has
 * WIDE_ROWS rows or more (verification, prefill), attend_rows widens each tile's keys, then its
 * values, to float32 once into a buffer (a widening function per format, here), computes the
 * scores in register blocks of rows by keys (wide_scores, here), and the weights and value sums
 * as for any tile. The numbers are the cache's own (widened exactly) and every sum runs in the
 * order of attention_tile.h's functions, so each row has the bits it has in a decode, where a
 * tile is widened in registers row group by row group. attention_pass.h compiles such a pass
 * once per head size, not per cache format: only the widening knows the format (and a q8_0
 * cache's keys go to attention_q8.h's integer scores instead, as in every pass). */
#ifndef TANDEM_ATTENTION_WIDE_H
#define TANDEM_ATTENTION_WIDE_H
#include <stdint.h>

#include "attention_tile.h"

#define WIDE_ROWS 8  /* a KV head's rows from which its tile is widened once for all of them */

/* Rows a .. t1 of the tile at t0 (rows[j - t0], keys or values, in format `type`) widened to
 * float32 exactly (kv_vec) into buf [KEY_TILE][D], and rows[] pointed at them, so that the
 * scores or the value sums read them as a float32 cache. Each key is converted once, not once
 * per row group (for q8_0 three instructions a vector, which outnumbered the value sums'
 * multiply-adds); the keys and then the values go through one buffer, so that the tile's
 * working set stays in L1. Copying a float32 tile pays too: a head's rows in the cache lie a
 * slot apart (8 KB for 32 heads of 64), and 64 of them share a few L1 sets. */
typedef void (*widen_fn)(const uint8_t **rows, float *buf, int64_t t0, int64_t a, int64_t t1,
                         int nv);
#define WIDEN(TYPE)                                                                            \
    static void widen_##TYPE(const uint8_t **rows, float *buf, int64_t t0, int64_t a,           \
                             int64_t t1, int nv) {                                             \
        for (int64_t j = a; j <= t1; j++) {                                                    \
            float *w = buf + (j - t0) * nv * LANES;                                            \
            for (int e = 0; e < nv; e++) store(w + e * LANES, kv_vec(TYPE, rows[j - t0], e));  \
            rows[j - t0] = (const uint8_t *)w;                                                 \
        }                                                                                      \
    }
WIDEN(KV_F32)
WIDEN(KV_BF16)
WIDEN(KV_F16)
WIDEN(KV_FP8_E4M3)
WIDEN(KV_FP8_E5M2)
WIDEN(KV_Q8_0)
#undef WIDEN

static widen_fn widen_of(int type) {
    switch (type) {
    case KV_F32: return widen_KV_F32;
    case KV_BF16: return widen_KV_BF16;
    case KV_F16: return widen_KV_F16;
    case KV_FP8_E4M3: return widen_KV_FP8_E4M3;
    case KV_FP8_E5M2: return widen_KV_FP8_E5M2;
    default: return widen_KV_Q8_0;
    }
}

#if LANES == 16
#include "attention_wide16.h"  /* the keys transposed: widen_keys_of, wide_scores */
#else
#define WIDE_SR 2  /* rows by keys of a block of scores: accumulators and operands in registers */
#define WIDE_SK 4

/* The keys' widening of the wide pass: as the values', a row a key. */
static widen_fn widen_keys_of(int type) { return widen_of(type); }

/* tile_scores for nr rows against the tile's widened key rows (st->k): blocks of WIDE_SR rows
 * by WIDE_SK keys, each (row, key) product summed over the vectors from 0 in order and its
 * lanes by reduce_lanes, as tile_scores does, with a block's queries and keys in registers (6
 * loads per 8 multiply-adds on AVX2, against tile_scores' 5 per 4). nv is a constant where
 * inlined. */
static inline __attribute__((always_inline)) void wide_scores(
        const row_t *rows, int nr, const pass_t *st, int64_t a, int64_t b, int64_t t0,
        float scale, float softcap, float *s, const int nv) {
    const uint8_t *const *krow = st->k;
    for (int i = 0; i < nr; i += WIDE_SR) {
        const float *qp[WIDE_SR];  /* past nr: the last row again, its results dropped */
        for (int r = 0; r < WIDE_SR; r++) qp[r] = rows[i + r < nr ? i + r : nr - 1].q;
        for (int64_t j = a; j <= b; j += LANES) {
            vf t[WIDE_SR][LANES];  /* keys past b: key b again, their scores never read */
            for (int k0 = 0; k0 < LANES; k0 += WIDE_SK) {
                const float *kp[WIDE_SK];
                for (int k = 0; k < WIDE_SK; k++)
                    kp[k] = (const float *)krow[(j + k0 + k <= b ? j + k0 + k : b) - t0];
                vf acc[WIDE_SR][WIDE_SK];
                for (int r = 0; r < WIDE_SR; r++)
                    for (int k = 0; k < WIDE_SK; k++) acc[r][k] = (vf){0};
                for (int e = 0; e < nv; e++) {
                    vf kv[WIDE_SK];
                    for (int k = 0; k < WIDE_SK; k++) kv[k] = load(kp[k] + e * LANES);
                    for (int r = 0; r < WIDE_SR; r++) {
                        const vf qv = load(qp[r] + e * LANES);
                        for (int k = 0; k < WIDE_SK; k++) acc[r][k] += qv * kv[k];
                    }
                }
                for (int r = 0; r < WIDE_SR; r++)
                    for (int k = 0; k < WIDE_SK; k++) t[r][k0 + k] = acc[r][k];
            }
            for (int r = 0; r < WIDE_SR && i + r < nr; r++) {
                vf sc = reduce_lanes(t[r]) * scale;
                if (softcap > 0.0f) sc = vtanh(sc / softcap) * softcap;
                store(s + (i + r) * TILE_STRIDE + (j - t0), sc);
            }
        }
    }
}
#endif

#endif
