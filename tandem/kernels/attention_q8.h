/* A q8_0 cache's scores in integers (cpu_attention.c): each row's query quantized per block of
 * 32 numbers to int16 with a float32 scale dq = max|q| / 32767 (q8_queries), then per block b the
 * exact integer dot product i_b = sum q_i k_i of the query's int16 and the key's int8 numbers,
 * and the score sum_b float(i_b) (dk_b dq_b), the blocks added in order. An integer sum is exact
 * in any order, so however it is computed (VNNI's vpdpwssd, vpmaddwd, a scalar loop) a row gets
 * the same bits, on every CPU; and decodes, verifications and prefills all take their scores so,
 * so they get the same bits as each other. Two products a lane an instruction against one
 * float32 multiply-add, and no widening of the keys to float32: a prefill's attention
 * 1.24-1.47x faster on a Zen 4, a verification's 1.17-1.28x (benchmarks/LOG.md). The query's
 * rounding (2^-16 of its block's largest number) leaves the accuracy figures where the float32
 * products had them; int8 queries (llama.cpp's choice, vpdpbusd at twice the rate) moved
 * SmolLM2's mean log-probability change from 0.019 to 0.025 nats.
 * Where a KV head has 3 rows or more in a pass, its tile's keys are laid out once, transposed:
 * a dword (2 numbers) of LANES keys a vector, their scales beside them (q8_keys, q8_scores); a
 * decode's head of 1 or 2 rows reads its keys in place and sums each key's lanes instead
 * (q8_scores_rows: the layout cost 0.87-0.97x there). Exact integers either way, added by the
 * same expression (q8_term): the same bits. The values keep every format's float32 arithmetic.
 * Included by attention_pass.h only. */
#ifndef TANDEM_ATTENTION_Q8_H
#define TANDEM_ATTENTION_Q8_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention_tile.h"

#if defined(__AVX512VNNI__) && LANES == 16
#define Q8_SR 4        /* rows by key vectors of a block of scores */
#else
#define Q8_SR 2
#endif
#define Q8_SK 2
#define Q8_IN_PLACE 2  /* a KV head of at most these rows in a pass reads its keys in place */

static inline __attribute__((always_inline)) vi load_i(const int32_t *p) {
    vi v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline __attribute__((always_inline)) void store_i(int32_t *p, vi v) {
    memcpy(p, &v, sizeof v);
}

/* Rows 0 .. nr - 1's queries (D numbers) quantized to int16 into st->qq [PASS_ROWS][MAX_HEAD_DIM]
 * and their scales into st->qd [PASS_ROWS][MAX_HEAD_DIM / 32]. tandem/attention/kv_format.py's
 * `query` does the same in torch: dq = max|q| / 32767 in float32, q * (1 / dq) rounded to
 * nearest (ties to even). */
static void q8_queries(const row_t *rows, int nr, pass_t *st, int64_t d) {
    for (int r = 0; r < nr; r++)
        for (int64_t b = 0; b < d / 32; b++) {
            const float *x = rows[r].q + 32 * b;
            int16_t *o = st->qq + r * MAX_HEAD_DIM + 32 * b;
            float amax = 0.0f;
            int nan = 0;
            for (int i = 0; i < 32; i++) {
                amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
                nan |= x[i] != x[i];
            }
            const float dq = amax / 32767, id = dq > 0 ? 1.0f / dq : 0.0f;
            for (int i = 0; i < 32; i++) {
                float v = nearbyintf(x[i] * id);
                v = v > 32767 ? 32767 : v < -32767 ? -32767 : v;  /* a NaN query: 0, score NaN */
                o[i] = (int16_t)(v == v ? v : 0);
            }
            st->qd[r * (MAX_HEAD_DIM / 32) + b] = nan ? NAN : dq;
        }
}

/* LANES dwords (2 numbers each, widened to int16) of a q8_0 row from dword x0 on (16 a block
 * of 32 numbers, which follow the block's 2-byte scale). */
static inline __attribute__((always_inline)) vi q8_words(const uint8_t *row, int x0) {
    const uint8_t *p = row + x0 / 16 * 34 + 2 + x0 % 16 * 2;
#if defined(__AVX512BW__) && LANES == 16
    return (vi)_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p));
#elif defined(__AVX2__) && LANES == 8
    return (vi)_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
#else
    int16_t w[2 * LANES];
    for (int i = 0; i < 2 * LANES; i++) w[i] = (int8_t)p[i];
    vi v;
    memcpy(&v, w, sizeof v);
    return v;
#endif
}

/* Keys a .. t1 of the tile at t0 (q8_0 rows krow[j - t0], nb blocks) laid out for q8_scores:
 * kt[x * KEY_TILE + j - t0] holds dword x of key j (numbers 2x, 2x + 1 as int16),
 * dk[b * KEY_TILE + j - t0] its block b's scale, in the LANES-aligned columns that cover a .. t1
 * (columns of no key: zero numbers, zero scales). LANES x LANES dwords transposed in registers. */
static __attribute__((noinline)) void q8_keys(const uint8_t *const *krow, int32_t *kt,
                                              float *dk, int64_t t0, int64_t a, int64_t t1,
                                              int nb) {
    const int nd = nb * 16;
    for (int64_t c0 = (a - t0) & ~(int64_t)(LANES - 1); c0 <= t1 - t0; c0 += LANES) {
        for (int x0 = 0; x0 < nd; x0 += LANES) {
            vi m[LANES];
            for (int k = 0; k < LANES; k++) {
                const int64_t j = t0 + c0 + k;
                m[k] = j >= a && j <= t1 ? q8_words(krow[j - t0], x0) : (vi){0};
            }
            transpose_i(m);
            for (int x = 0; x < LANES; x++) store_i(kt + (x0 + x) * KEY_TILE + c0, m[x]);
        }
        for (int b = 0; b < nb; b++)
            for (int k = 0; k < LANES; k++) {
                const int64_t j = t0 + c0 + k;
                dk[b * KEY_TILE + c0 + k] = j >= a && j <= t1 ? f16_at(krow[j - t0] + 34 * b)
                                                              : 0.0f;
            }
    }
}

/* acc + the dot products of 2 int16 numbers a lane: kv (LANES keys' dword) by qb (one query
 * dword in every lane). Exact: a block's sum stays below 32 x 32767 x 127 < 2^31. */
static inline __attribute__((always_inline)) vi dot2(vi acc, vi kv, vi qb) {
#if defined(__AVX512VNNI__) && LANES == 16
    return (vi)_mm512_dpwssd_epi32((__m512i)acc, (__m512i)kv, (__m512i)qb);
#elif defined(__AVX512BW__) && LANES == 16
    return acc + (vi)_mm512_madd_epi16((__m512i)kv, (__m512i)qb);
#elif defined(__AVX2__) && LANES == 8
    return acc + (vi)_mm256_madd_epi16((__m256i)kv, (__m256i)qb);
#else
    for (int l = 0; l < LANES; l++)
        acc[l] += (int32_t)(int16_t)kv[l] * (int16_t)qb[l]
                  + (int32_t)(int16_t)(kv[l] >> 16) * (int16_t)(qb[l] >> 16);
    return acc;
#endif
}

/* sum + a block's integer dot products (LANES keys) times the keys' scales dk and the query's
 * dq: the one expression both layouts below add a block with, so the same rounding. */
static inline __attribute__((always_inline)) vf q8_term(vf sum, vi dot, vf dk, vf dq) {
    return sum + __builtin_convertvector(dot, vf) * (dk * dq);
}

/* Scores of pass rows i .. i + rn - 1 (their quantized queries in st) for gk key vectors from
 * column c (kt, dk as q8_keys left them) into s (row i's scores, TILE_STRIDE apart). */
static inline __attribute__((always_inline)) void q8_block(
        const pass_t *st, int i, const int rn, const int32_t *kt, const float *dk, int64_t c,
        const int gk, int nb, float scale, float softcap, float *s) {
    vf sum[4][Q8_SK];  /* rn <= Q8_SR <= 4 */
    for (int r = 0; r < rn; r++)
        for (int g = 0; g < gk; g++) sum[r][g] = (vf){0};
    for (int b = 0; b < nb; b++) {
        vi acc[4][Q8_SK];
        for (int r = 0; r < rn; r++)
            for (int g = 0; g < gk; g++)
                acc[r][g] = (vi){0};
        for (int x = 16 * b; x < 16 * b + 16; x++) {
            vi kv[Q8_SK];
            for (int g = 0; g < gk; g++) kv[g] = load_i(kt + x * KEY_TILE + c + g * LANES);
            for (int r = 0; r < rn; r++) {
                int32_t w;
                memcpy(&w, st->qq + (i + r) * MAX_HEAD_DIM + 2 * x, 4);
                const vi qb = (vi){0} + w;
                for (int g = 0; g < gk; g++) acc[r][g] = dot2(acc[r][g], kv[g], qb);
            }
        }
        for (int r = 0; r < rn; r++) {
            const vf dq = splat(st->qd[(i + r) * (MAX_HEAD_DIM / 32) + b]);
            for (int g = 0; g < gk; g++)
                sum[r][g] = q8_term(sum[r][g], acc[r][g], load(dk + b * KEY_TILE + c + g * LANES),
                                    dq);
        }
    }
    for (int r = 0; r < rn; r++)
        for (int g = 0; g < gk; g++) {
            vf sc = sum[r][g] * scale;
            if (softcap > 0.0f) sc = vtanh(sc / softcap) * softcap;
            store(s + r * TILE_STRIDE + c + g * LANES, sc);
        }
}

/* tile_scores for a q8_0 cache: pass rows r0 .. r1 - 1 against keys a .. b of the tile at t0
 * (kt, dk from q8_keys), into s[i * TILE_STRIDE + j - t0] (s: row r0's; the LANES-aligned
 * columns around a .. b are written). One compiled copy for every caller. */
static __attribute__((noinline)) void q8_scores(const pass_t *st, int r0, int r1,
                                                const int32_t *kt, const float *dk, int64_t a,
                                                int64_t b, int64_t t0, float scale,
                                                float softcap, float *s, int nb) {
    const int64_t c0 = (a - t0) & ~(int64_t)(LANES - 1), c1 = b - t0;
    for (int i = r0; i < r1; i += Q8_SR) {
        const int rn = r1 - i < Q8_SR ? r1 - i : Q8_SR;
        float *si = s + (i - r0) * TILE_STRIDE;
        for (int64_t c = c0; c <= c1; c += LANES * Q8_SK) {
            const int gk = c + LANES <= c1 ? 2 : 1;
#define BLOCK(RN, GK) q8_block(st, i, RN, kt, dk, c, GK, nb, scale, softcap, si)
#if Q8_SR == 4
#define BLOCKS(GK)                                                                             \
            if (rn == 4) BLOCK(4, GK);                                                         \
            else if (rn == 1) BLOCK(1, GK);                                                    \
            else if (rn == 2) BLOCK(2, GK);                                                    \
            else BLOCK(3, GK)
#else
#define BLOCKS(GK)                                                                             \
            if (rn == 2) BLOCK(2, GK);                                                         \
            else BLOCK(1, GK)
#endif
            if (gk == 2) BLOCKS(2);
            else BLOCKS(1);
#undef BLOCKS
#undef BLOCK
        }
    }
}
/* The dot product of block b of a q8_0 key row and of a quantized query (int16 [32]), in lanes
 * (their sum is the block's). */
static inline __attribute__((always_inline)) vi q8_row_dot(const uint8_t *row, int b,
                                                          const int16_t *q) {
    vi acc = {0};
    for (int x0 = 16 * b; x0 < 16 * b + 16; x0 += LANES) {
        vi qv;
        memcpy(&qv, q + 2 * (x0 - 16 * b), sizeof qv);
        acc = dot2(acc, q8_words(row, x0), qv);
    }
    return acc;
}

/* q8_scores for a pass of few rows a KV head (a decode, a short verification), the keys read
 * in place: per row, block and key an integer dot product in lanes, their lane sums (vec.h's reduce_lanes_i)
 * giving LANES keys' block sums a vector, added as q8_scores adds them (q8_term): the same
 * bits, without laying out a tile that one or two rows would read. */
static __attribute__((noinline)) void q8_scores_rows(const pass_t *st, int r0, int r1,
                                                     const uint8_t *const *krow, int64_t a,
                                                     int64_t b, int64_t t0, float scale,
                                                     float softcap, float *s, int nb) {
    for (int64_t c = (a - t0) & ~(int64_t)(LANES - 1); c <= b - t0; c += LANES) {
        float dk[MAX_HEAD_DIM / 32][LANES];
        for (int k = 0; k < LANES; k++) {
            const int64_t j = t0 + c + k;
            for (int bb = 0; bb < nb; bb++)
                dk[bb][k] = j >= a && j <= b ? f16_at(krow[j - t0] + 34 * bb) : 0.0f;
        }
        for (int r = r0; r < r1; r++) {
            vf sum = {0};
            for (int bb = 0; bb < nb; bb++) {
                const int16_t *q = st->qq + r * MAX_HEAD_DIM + 32 * bb;
                vi t[LANES];
                for (int k = 0; k < LANES; k++) {
                    const int64_t j = t0 + c + k;
                    t[k] = j >= a && j <= b ? q8_row_dot(krow[j - t0], bb, q) : (vi){0};
                }
                sum = q8_term(sum, reduce_lanes_i(t), load(dk[bb]),
                              splat(st->qd[r * (MAX_HEAD_DIM / 32) + bb]));
            }
            vf sc = sum * scale;
            if (softcap > 0.0f) sc = vtanh(sc / softcap) * softcap;
            store(s + (r - r0) * TILE_STRIDE + c, sc);
        }
    }
}
#endif
