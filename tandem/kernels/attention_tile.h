/* One tile of paged attention (cpu_attention.c): the tile's key and value rows in the cache's
 * format, widened in registers where they are used (kv_format.h's kv_vec), the scores of a
 * pass's rows against them, the running maximum and the weights, and the value sums, each in
 * the one order cpu_attention.c's comment gives; the tile asked of the memory first.
 * The types and sizes of a pass live here too. Included by cpu_attention.c only. */
#ifndef TANDEM_ATTENTION_TILE_H
#define TANDEM_ATTENTION_TILE_H
#include <math.h>
#include <stdint.h>

#include "kv_format.h"
#include "vec.h"
#include "vmath.h"

#define MAX_HEAD_DIM 512
#define NV_MAX (MAX_HEAD_DIM / LANES)
#define KEY_TILE 64     /* keys per tile; tiles start at multiples of KEY_TILE */
#define TILE_STRIDE (KEY_TILE + LANES)  /* a row's scores in the scratch (a block may overrun) */
#define PASS_ROWS 64    /* (query, head) rows in one pass over the keys */
#define CHUNK_KEYS 512  /* keys per chunk: chunks start at multiples of it (cpu_attention.c) */
#define SCORE_ROWS 4    /* rows whose scores are computed together (their queries in registers) */
#define VALUE_ROWS 4    /* rows whose value sums run together */
#define VALUE_ACCS (LANES == 16 ? 24 : 12)  /* vector registers for those sums */
#define VALUE_VECS 8    /* vectors of a row's sums added up at a time (of nv) */
#define QUERY_CHUNK 16  /* a work item's queries (a request of at most these may be split) */
#define WIDE_CHUNK 64   /* ... where a step has enough of them to keep every thread busy */

typedef struct {
    const float *q;  /* the row's query head [D] */
    float *o;        /* its output [D] */
    int64_t lo, hi;  /* the keys it attends: lo .. hi */
} row_t;

/* A pass's running state, per row: the maximum so far, the weights' sum, the rescale factor of
 * this tile, its keys in this tile (a > b: none), and the value sums (`split` chains of nv). */
typedef struct {
    float m[PASS_ROWS], total[PASS_ROWS], alpha[PASS_ROWS];
    float run_m[PASS_ROWS], run_t[PASS_ROWS];  /* the chunks folded so far (cpu_attention.c) */
    vf *run;                           /* [PASS_ROWS][nv]: their value sums */
    int64_t a[PASS_ROWS], b[PASS_ROWS];
    float s[PASS_ROWS * TILE_STRIDE];  /* row i's score (then weight) of key j: s[i][j - t0] */
    const uint8_t *k[KEY_TILE], *v[KEY_TILE];  /* one KV head's key and value rows */
    float *wide;                       /* [KEY_TILE][D]: a widened tile (attention_wide.h) */
    int16_t qq[PASS_ROWS * MAX_HEAD_DIM];  /* a q8_0 cache's queries, quantized (attention_q8.h) */
    float qd[PASS_ROWS * MAX_HEAD_DIM / 32];  /* their scales */
    vf acc[];                          /* [PASS_ROWS][2][nv] */
} pass_t;

/* One KV head's cache: rows of `rb` bytes in format `type` (kv_format.h) at cache slots. */
typedef struct {
    const char *k, *v;
    const int64_t *slots;
    int64_t hkv, g, rb;
    int type;
    int stream;  /* a decode or short verification of a cache that outgrows the caches */
} cache_t;

/* p[j - t0] pointed at the cache rows of keys a .. t1 of the tile at t0, KV head c->g + h, of
 * `base` (c->k or c->v). */
static inline void tile_rows(const uint8_t **p, const cache_t *c, const char *base, int64_t t0,
                             int64_t a, int64_t t1, int h) {
    for (int64_t j = a; j <= t1; j++)
        p[j - t0] = (const uint8_t *)base + (c->slots[j] * c->hkv + c->g + h) * c->rb;
}

/* Every cache line of keys a .. b's rows for KV heads c->g .. c->g + ng - 1 (side by side in
 * each key's slot), keys and values, asked of the memory at once, in address order, before the
 * tile's heads are computed, so that the heads read the tile from the caches. Read head by
 * head, a slot of 32 heads of 64 float16 numbers puts each row a 4 KB page apart, which the
 * hardware's prefetchers do not follow. Asking for the whole next tile while this one is
 * computed instead (into L1 or L2, spread over the heads, or in one burst) was slower: the
 * tile's own rows then wait behind it (benchmarks/LOG.md); a decode whose cache streams from
 * the memory asks for half a tile ahead instead (attention_pass.h's attend_rows). */
static inline void tile_fetch(const cache_t *c, int64_t a, int64_t b, int ng) {
    const int64_t per_key = ng * c->rb;
    for (int64_t j = a; j <= b; j++) {
        const char *k = c->k + (c->slots[j] * c->hkv + c->g) * c->rb;
        const char *v = c->v + (k - c->k);
        for (int64_t l = 0; l < per_key; l += 64) {
            __builtin_prefetch(k + l, 0, 2);
            __builtin_prefetch(v + l, 0, 2);
        }
    }
}

/* KV head c->g + h's rows of keys a .. b, keys and values, asked of the memory. A q8_0 decode
 * below cache_t.stream's size (above it, attend_rows streams every format) asks for the next
 * tile's rows so, head by head while this tile's heads are computed, on top of tile_fetch's
 * burst: a q8_0 row takes more instructions a byte to widen than a 16-bit one, so
 * after a burst its tile's compute left the memory idle longer. On a Zen 5 a q8_0 decode at
 * depth 4,096 went from 17.9-19.1 to 23.3-24.1 tok/s (the 1.7B shape; the kernel alone at depth
 * 16,384 1.44-1.67x, natively and held to AVX2); 16-bit caches lost 2-7% and fp8 gained 1-5%
 * the same way, so they keep the burst alone (fetch_ahead; benchmarks/LOG.md). */
static inline int fetch_ahead(int type) { return type == KV_Q8_0; }
static inline void head_fetch(const cache_t *c, int64_t a, int64_t b, int h) {
    for (int64_t j = a; j <= b; j++) {
        const int64_t off = (c->slots[j] * c->hkv + c->g + h) * c->rb;
        for (int64_t l = 0; l < c->rb; l += 64) {
            __builtin_prefetch(c->k + off + l, 0, 2);
            __builtin_prefetch(c->v + off + l, 0, 2);
        }
    }
}

/* Part `part` of `parts` of the cache lines of keys a .. b's rows for KV heads c->g ..
 * c->g + ng - 1, of the keys (base c->k) or the values (c->v), asked of the memory in address
 * order: a streaming decode asks for the next half tile so, a head's share after each head's
 * compute (attention_pass.h's attend_rows). */
static inline void stream_fetch(const cache_t *c, const char *base, int64_t a, int64_t b, int ng,
                                int part, int parts) {
    const int64_t per_key = ng * c->rb, lines = (per_key + 63) / 64, n = (b - a + 1) * lines;
    const int64_t l0 = n * part / parts, l1 = n * (part + 1) / parts;
    int64_t j = a + l0 / lines, at = l0 % lines * 64;  /* one division a call, not a line */
    const char *row = base + (c->slots[j] * c->hkv + c->g) * c->rb;
    for (int64_t l = l0; l < l1; l++) {
        __builtin_prefetch(row + at, 0, 2);
        if ((at += 64) == lines * 64 && l + 1 < l1) {
            at = 0;
            row = base + (c->slots[++j] * c->hkv + c->g) * c->rb;
        }
    }
}

static inline int split_of(int nv) { return nv < 8 ? 2 : 1; }

/* Scores of rows 0 .. nr - 1 (nr <= SCORE_ROWS) for keys a .. b of the tile at t0 (key rows
 * krow[j - t0] in format `type`, widened once for the nr rows), into
 * s[i * TILE_STRIDE + j - t0]. nv = D / LANES and type are constants where inlined. */
static inline __attribute__((always_inline)) void tile_scores(
        const row_t *rows, int nr, const uint8_t *const *krow, int64_t a, int64_t b, int64_t t0,
        float scale, float softcap, float *s, const int nv, const int type) {
    vf qv[SCORE_ROWS][NV_MAX];
    for (int i = 0; i < nr; i++)
        for (int e = 0; e < nv; e++) qv[i][e] = load(rows[i].q + e * LANES);
    for (int64_t j = a; j <= b; j += LANES) {
        vf t[SCORE_ROWS][LANES];  /* t[i][k]: row i's partial sums for key j + k */
        for (int k = 0; k < LANES; k++) {
            if (j + k <= b) {
                const uint8_t *kj = krow[j + k - t0];
                vf kv[NV_MAX];
                for (int e = 0; e < nv; e++) kv[e] = kv_vec(type, kj, e);
                for (int i = 0; i < nr; i++) {
                    vf acc = {0};
                    for (int e = 0; e < nv; e++) acc += qv[i][e] * kv[e];
                    t[i][k] = acc;
                }
            } else {
                for (int i = 0; i < nr; i++) t[i][k] = (vf){0};
            }
        }
        for (int i = 0; i < nr; i++) {
            vf sc = reduce_lanes(t[i]) * scale;
            if (softcap > 0.0f) sc = vtanh(sc / softcap) * softcap;
            store(s + i * TILE_STRIDE + (j - t0), sc);
        }
    }
}

/* Row i's keys a .. b of this tile: the new maximum, its scores turned into weights in place,
 * their sum added to the rescaled total (lane l sums keys a + l, a + l + LANES, ...), and the
 * factor that rescales the earlier value sums (1 where the maximum did not move). Blocks of
 * LANES keys; the last one's lanes past b are masked (weights are positive: adding +0 to a lane
 * changes nothing). */
static inline __attribute__((always_inline)) void tile_weights(pass_t *st, int i, int64_t t0) {
    int64_t a = st->a[i], b = st->b[i], j;
    float *w = st->s + i * TILE_STRIDE - t0;  /* w[j]: key j */
    const vi lane = __builtin_convertvector(iota(), vi);
    vf mx = splat(st->m[i]);
    for (j = a; j <= b; j += LANES) {
        vf x = load(w + j);
        mx = vselect((lane <= (int32_t)(b - j)) & (x > mx), x, mx);
    }
    float m = hmax(mx);
    float alpha = m == st->m[i] ? 1.0f : st->m[i] == -INFINITY ? 0.0f : fast_exp(st->m[i] - m);
    st->alpha[i] = alpha;
    st->m[i] = m;
    vf tv = {0};
    for (j = a; j <= b; j += LANES) {
        vf x = vexp(load(w + j) - m);
        store(w + j, x);
        tv += vselect(lane <= (int32_t)(b - j), x, (vf){0});
    }
    st->total[i] = st->total[i] * alpha + hsum(tv);
}

/* Vectors e0 .. e0 + cv - 1 of the value sums of rows i0 .. i0 + gn - 1, which have the same
 * keys a .. b in this tile: each value row loaded (and widened from format `type`) once for
 * all. A row's sum runs in key order as `split` chains (even keys to the first, odd keys to the
 * second where a row has few vectors), rescaled by alpha first. gn, cv, nv and type are
 * constants where inlined, so the sums stay in registers. */
static inline __attribute__((always_inline)) void tile_values(
        pass_t *st, int i0, const int gn, int64_t t0, int e0, const int cv, const int nv,
        const int type) {
    const int split = split_of(nv);
    int64_t a = st->a[i0], b = st->b[i0];
    vf acc[VALUE_ROWS][2][VALUE_VECS];
    const float *w[VALUE_ROWS];
    for (int r = 0; r < gn; r++) {
        vf *m = st->acc + (size_t)(i0 + r) * 2 * nv + e0;
        const vf al = splat(st->alpha[i0 + r]);
        for (int c = 0; c < split; c++)
            for (int e = 0; e < cv; e++) acc[r][c][e] = m[c * nv + e] * al;
        w[r] = st->s + (i0 + r) * TILE_STRIDE - t0;
    }
#define ADD(J, C) do {                                                                         \
        const uint8_t *vj = st->v[(J) - t0];                                                   \
        vf vv[VALUE_VECS];                                                                     \
        for (int e = 0; e < cv; e++) vv[e] = kv_vec(type, vj, e0 + e);                         \
        for (int r = 0; r < gn; r++) {                                                         \
            const vf pj = splat(w[r][J]);                                                      \
            for (int e = 0; e < cv; e++) acc[r][C][e] += pj * vv[e];                           \
        }                                                                                      \
    } while (0)
    int64_t j = a;
    if (split == 2) {
        if (j <= b && (j & 1)) { ADD(j, 1); j++; }
        for (; j + 1 <= b; j += 2) { ADD(j, 0); ADD(j + 1, 1); }
        if (j <= b) ADD(j, 0);
    } else {
        for (; j <= b; j++) ADD(j, 0);
    }
#undef ADD
    for (int r = 0; r < gn; r++) {
        vf *m = st->acc + (size_t)(i0 + r) * 2 * nv + e0;
        for (int c = 0; c < split; c++)
            for (int e = 0; e < cv; e++) m[c * nv + e] = acc[r][c][e];
    }
}

/* A chunk's partial (m, t, a [nv]) folded into a row's running (*M, *T, A): both rescaled to the
 * larger maximum. One compiled copy (noinline) serves every caller, so the rounding of the fold
 * is the same whether a row's chunks ran in one thread or in several. */
static __attribute__((noinline)) void fold(float *M, float *T, vf *A, float m, float t,
                                           const vf *a, int nv) {
    if (m == -INFINITY) return;  /* no keys of the row in this chunk */
    if (*M == -INFINITY) {       /* the row's first chunk: its partial as it is */
        *M = m, *T = t;
        for (int e = 0; e < nv; e++) A[e] = a[e];
        return;
    }
    const float top = m > *M ? m : *M;
    const float sa = fast_exp(*M - top), sb = fast_exp(m - top);
    *T = *T * sa + t * sb;
    const vf va = splat(sa), vb = splat(sb);
    for (int e = 0; e < nv; e++) A[e] = A[e] * va + a[e] * vb;
    *M = top;
}
#endif
