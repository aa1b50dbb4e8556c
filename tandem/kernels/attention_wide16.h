/* A tile's keys for attention_wide.h's wide pass with AVX-512 (16 lanes), transposed: widen_t
 * widens keys to float32 into a buffer a key per lane, and wide_scores takes 16 keys' scores a
 * vector, so that vec.h's tree over a product's lanes (reduce_lanes: 30 shuffles and 15 adds
 * for 16 scores) becomes 15 vector adds in the same order: the same bits. On a Zen 5 the kernel
 * of a 1,024-token prefill ran 1.13-1.21x faster than with attention_wide.h's row-major scores;
 * with 8 lanes (AVX2) 0.95-0.97x, so there the tree's 12 shuffles a vector stay
 * (benchmarks/LOG.md). Included by attention_wide.h only. */
#ifndef TANDEM_ATTENTION_WIDE16_H
#define TANDEM_ATTENTION_WIDE16_H
#include <stdint.h>

#include "attention_tile.h"

#define WIDE_SR 2  /* rows by key vectors of a block of scores: the chains, the tree's partial */
#define WIDE_SK 2  /* sums and the operands fit the 32 registers */

/* Keys a .. t1 of the tile at t0 (rows[j - t0] in format `type`) widened to float32 exactly and
 * stored transposed: kt[x * KEY_TILE + j - t0] is element x of key j, in the LANES-aligned
 * columns that cover a .. t1 (columns of no key there hold 0). A transposed tile gives
 * wide_scores LANES keys' partial sums in the lanes of one vector. rows[] stays on the cache. */
#define WIDEN_T(TYPE)                                                                          \
    static void widen_t_##TYPE(const uint8_t **rows, float *kt, int64_t t0, int64_t a,         \
                               int64_t t1, int nv) {                                           \
        for (int64_t c0 = (a - t0) & ~(int64_t)(LANES - 1); c0 <= t1 - t0; c0 += LANES)        \
            for (int e = 0; e < nv; e++) {                                                     \
                vf m[LANES];                                                                   \
                for (int k = 0; k < LANES; k++) {                                              \
                    const int64_t j = t0 + c0 + k;                                             \
                    m[k] = j >= a && j <= t1 ? kv_vec(TYPE, rows[j - t0], e) : (vf){0};        \
                }                                                                              \
                transpose(m);                                                                  \
                for (int x = 0; x < LANES; x++)                                                \
                    store(kt + (e * LANES + x) * KEY_TILE + c0, m[x]);                         \
            }                                                                                  \
    }
WIDEN_T(KV_F32)
WIDEN_T(KV_BF16)
WIDEN_T(KV_F16)
WIDEN_T(KV_FP8_E4M3)
WIDEN_T(KV_FP8_E5M2)
#undef WIDEN_T

static widen_fn widen_keys_of(int type) {
    switch (type) {
    case KV_F32: return widen_t_KV_F32;
    case KV_BF16: return widen_t_KV_BF16;
    case KV_F16: return widen_t_KV_F16;
    case KV_FP8_E4M3: return widen_t_KV_FP8_E4M3;
    case KV_FP8_E5M2: return widen_t_KV_FP8_E5M2;
    default: return NULL;  /* q8_0: integer scores (attention_q8.h) */
    }
}

/* x's element e broadcast to every lane (a load, never an arithmetic splat: -0 stays -0). */
static inline __attribute__((always_inline)) vf bcast(const float *x) {
    const vf v = {*x};
    return SH(v, v, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
}

/* tile_scores for nr rows against the transposed tile in st->wide (widen_t): LANES keys a
 * vector, so that lane l of the partial sum of vector position p (the sum over the vectors e,
 * from 0, of q[e LANES + p] k[e LANES + p]) is one product chain of key l, and reduce_lanes'
 * tree over p is a tree of vector adds, in its order: u_p = s_p + s_{p + LANES/2}, then
 * u_p + u_{p + LANES/4}, ...; the same bits as tile_scores, without its shuffles. Blocks of WIDE_SR rows by WIDE_SK key
 * vectors; the positions p in the tree's order, so that few partials are live at once. */
static inline __attribute__((always_inline)) void wide_scores(
        const row_t *rows, int nr, const pass_t *st, int64_t a, int64_t b, int64_t t0,
        float scale, float softcap, float *s, const int nv) {
    const float *kt = st->wide;
    const int64_t c0 = (a - t0) & ~(int64_t)(LANES - 1), c1 = b - t0;
    for (int i = 0; i < nr; i += WIDE_SR) {
        const float *qp[WIDE_SR];  /* past nr: the last row again, its results dropped */
        for (int r = 0; r < WIDE_SR; r++) qp[r] = rows[i + r < nr ? i + r : nr - 1].q;
        for (int64_t c = c0; c <= c1; c += LANES * WIDE_SK) {
            int64_t cc[WIDE_SK];  /* key vectors past c1: the first again, results dropped */
            for (int g = 0; g < WIDE_SK; g++) cc[g] = c + g * LANES <= c1 ? c + g * LANES : c;
#define U(P, OUT)                                                                              \
            do {                                                                               \
                vf lo[WIDE_SR][WIDE_SK], hi[WIDE_SR][WIDE_SK];                                 \
                for (int r = 0; r < WIDE_SR; r++)                                              \
                    for (int g = 0; g < WIDE_SK; g++) lo[r][g] = hi[r][g] = (vf){0};           \
                for (int e = 0; e < nv; e++) {                                                 \
                    const float *k0 = kt + (e * LANES + (P)) * KEY_TILE;                       \
                    const float *k1 = k0 + LANES / 2 * KEY_TILE;                               \
                    for (int r = 0; r < WIDE_SR; r++) {                                        \
                        const vf q0 = bcast(qp[r] + e * LANES + (P));                          \
                        const vf q1 = bcast(qp[r] + e * LANES + (P) + LANES / 2);              \
                        for (int g = 0; g < WIDE_SK; g++) {                                    \
                            lo[r][g] += q0 * load(k0 + cc[g]);                                 \
                            hi[r][g] += q1 * load(k1 + cc[g]);                                 \
                        }                                                                      \
                    }                                                                          \
                }                                                                              \
                for (int r = 0; r < WIDE_SR; r++)                                              \
                    for (int g = 0; g < WIDE_SK; g++) OUT[r][g] = lo[r][g] + hi[r][g];         \
            } while (0)
#define ADD(X, Y, OUT)                                                                         \
            for (int r = 0; r < WIDE_SR; r++)                                                  \
                for (int g = 0; g < WIDE_SK; g++) OUT[r][g] = X[r][g] + Y[r][g]
            vf u0[WIDE_SR][WIDE_SK], u1[WIDE_SR][WIDE_SK], w0[WIDE_SR][WIDE_SK],
                w1[WIDE_SR][WIDE_SK], x0[WIDE_SR][WIDE_SK];
            vf y0[WIDE_SR][WIDE_SK];
            U(0, u0); U(4, u1); ADD(u0, u1, w0);
            U(2, u0); U(6, u1); ADD(u0, u1, w1); ADD(w0, w1, x0);
            U(1, u0); U(5, u1); ADD(u0, u1, w0);
            U(3, u0); U(7, u1); ADD(u0, u1, w1); ADD(w0, w1, y0);
            ADD(x0, y0, x0);
#undef U
#undef ADD
            for (int r = 0; r < WIDE_SR && i + r < nr; r++)
                for (int g = 0; g < WIDE_SK && c + g * LANES <= c1; g++) {
                    vf sc = x0[r][g] * scale;
                    if (softcap > 0.0f) sc = vtanh(sc / softcap) * softcap;
                    store(s + (i + r) * TILE_STRIDE + c + g * LANES, sc);
                }
        }
    }
}

#endif
