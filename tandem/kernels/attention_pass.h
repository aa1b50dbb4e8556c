/* One pass of paged attention (cpu_attention.c): up to PASS_ROWS (query, head) rows of one
 * request against their keys, tile by tile (attention_tile.h; a KV head of many rows through
 * attention_wide.h) and chunk by chunk, and the passes a work item's queries are cut into.
 * attend_rows is compiled once per cache format and for the common head sizes. Included by
 * cpu_attention.c only. */
#ifndef TANDEM_ATTENTION_PASS_H
#define TANDEM_ATTENTION_PASS_H
#include <math.h>
#include <stdint.h>

#include "attention_q8.h"
#include "attention_tile.h"
#include "attention_wide.h"

/* The value sums of rows r0 .. r1 - 1 (one KV head's) for this tile: rows with the same keys
 * in groups of up to vg, each group's vectors cv at a time. */
static inline __attribute__((always_inline)) void head_values(
        pass_t *st, int r0, int r1, int64_t t0, int vg, const int cv, const int nv,
        const int type) {
    for (int i0 = r0; i0 < r1;) {
        int gn = 1;
        while (i0 + gn < r1 && gn < vg && st->a[i0 + gn] == st->a[i0]
               && st->b[i0 + gn] == st->b[i0])
            gn++;
        if (st->a[i0] <= st->b[i0]) {
#define VALUES(GN) tile_values(st, i0, GN, t0, e0, cv, nv, type)
            for (int e0 = 0; e0 < nv; e0 += cv) {
                if (gn == 1) VALUES(1);
                else if (gn == 2) VALUES(2);
                else if (gn == 3) VALUES(3);
                else VALUES(4);
            }
#undef VALUES
        }
        i0 += gn;
    }
}

/* Rows 0 .. nr - 1 (nr <= PASS_ROWS, each clipped to one chunk of keys; a row with lo > hi has
 * none there) against their keys, tile by tile, from a fresh state. The rows come in ng groups,
 * group h (rows gs[h] .. gs[h + 1] - 1) of KV head c->g + h. Leaves each row's partial in st: its
 * maximum st->m, the sum of its weights st->total, and its value sums (the chains added) in
 * st->acc's first nv vectors. wide (a constant): every group has WIDE_ROWS rows or more, and
 * goes through tiles widened by `widen_keys` and `widen` (attention_wide.h; type then plays no
 * part). */
static inline __attribute__((always_inline)) void attend_rows(
        const row_t *rows, int nr, const int *gs, int ng, const cache_t *c, float scale,
        float softcap, pass_t *st, const int nv, const int type, const int wide,
        widen_fn widen, widen_fn widen_keys) {
    const int split = split_of(nv);
    int64_t lo = INT64_MAX, hi = -1;
    for (int i = 0; i < nr; i++) {
        if (rows[i].lo <= rows[i].hi) {
            lo = rows[i].lo < lo ? rows[i].lo : lo;
            hi = rows[i].hi > hi ? rows[i].hi : hi;
        }
        st->m[i] = -INFINITY;
        st->total[i] = 0.0f;
        for (int e = 0; e < 2 * nv; e++) st->acc[(size_t)i * 2 * nv + e] = (vf){0};
    }
    const int cv = nv < VALUE_VECS ? nv : VALUE_VECS;  /* the sums' vectors, a chunk at a time */
    int vg = VALUE_ACCS / (split * cv);
    vg = vg < 1 ? 1 : vg > VALUE_ROWS ? VALUE_ROWS : vg;
    /* A tile's steps: each head's scores and weights (phase A), each head's value sums (B).
     * From the caches, head by head, A then B, after a burst of the whole tile (tile_fetch).
     * Where the cache streams from the memory (cache_t.stream: a decode or short verification
     * of a long request), every head's A, then every head's B: the tile's keys were asked of
     * the memory during the last tile's B (at once for a pass's first tile), its values are
     * asked for during its A and the next tile's keys during its B, a head's share after each
     * head (stream_fetch), so the memory works while the core computes and no more than half
     * a tile is in flight beside the half being read (a whole next tile in flight evicted this
     * one). The burst left the memory idle while the heads were computed: one float16 query
     * of the 1.7B shape at 16,384 keys (134 MB a layer) took 1.5x the time on a Zen 4, and the
     * model's decode at depth 4,096 ran 1.15-1.3x slower (benchmarks/LOG.md). Each row's
     * arithmetic is the same in either order, so the same bits. One call site per step keeps
     * the code compiled per format and head size from doubling. */
    const int stream = c->stream;
    const int q8 = (wide ? c->type : type) == KV_Q8_0;  /* the wide pass takes every format */
    const int64_t first = lo - lo % KEY_TILE;
    for (int64_t t0 = first; t0 <= hi; t0 += KEY_TILE) {
        int64_t t1 = t0 + KEY_TILE - 1 < hi ? t0 + KEY_TILE - 1 : hi, a0 = t0 > lo ? t0 : lo;
        const int64_t n0 = t1 + 1, n1 = t1 + KEY_TILE < hi ? t1 + KEY_TILE : hi; /* next tile */
        if (!stream) tile_fetch(c, a0, t1, ng);
        else if (t0 == first) stream_fetch(c, c->k, a0, t1, ng, 0, 1);
        for (int step = 0; step < 2 * ng; step++) {
            const int values = stream ? step >= ng : step & 1;
            const int h = stream ? step % ng : step / 2, r0 = gs[h], r1 = gs[h + 1];
            if (values) {
                tile_rows(st->v, c, c->v, t0, a0, t1, h);
                if (stream && n0 <= n1) stream_fetch(c, c->k, n0, n1, ng, h, ng);
                if (wide) widen(st->v, st->wide, t0, a0, t1, nv);
                head_values(st, r0, r1, t0, vg, cv, nv, wide ? KV_F32 : type);
                continue;
            }
            tile_rows(st->k, c, c->k, t0, a0, t1, h);
            if (fetch_ahead(type) && !wide && !stream && t1 < hi)  /* next tile's rows, head h */
                head_fetch(c, n0, n1, h);
            if (q8 && r1 - r0 <= Q8_IN_PLACE) {  /* a q8_0 cache's scores (attention_q8.h) */
                q8_scores_rows(st, r0, r1, st->k, a0, t1, t0, scale, softcap,
                               st->s + r0 * TILE_STRIDE, nv * LANES / 32);
            } else if (q8) {  /* ... the tile laid out once for the head's rows */
                int32_t *kt = (int32_t *)st->wide;  /* [D / 2][KEY_TILE] */
                float *dk = st->wide + KEY_TILE * nv * LANES / 2;  /* [D / 32][KEY_TILE] */
                q8_keys(st->k, kt, dk, t0, a0, t1, nv * LANES / 32);
                q8_scores(st, r0, r1, kt, dk, a0, t1, t0, scale, softcap,
                          st->s + r0 * TILE_STRIDE, nv * LANES / 32);
            } else if (wide) {  /* the keys, then (B) the values, through one float32 buffer */
                widen_keys(st->k, st->wide, t0, a0, t1, nv);
                wide_scores(rows + r0, r1 - r0, st, a0, t1, t0, scale, softcap,
                            st->s + r0 * TILE_STRIDE, nv);
            } else {
                for (int i = r0; i < r1; i += SCORE_ROWS)
                    tile_scores(rows + i, r1 - i < SCORE_ROWS ? r1 - i : SCORE_ROWS, st->k, a0,
                                t1, t0, scale, softcap, st->s + i * TILE_STRIDE, nv, type);
            }
            if (stream) stream_fetch(c, c->v, a0, t1, ng, h, ng);
            for (int i = r0; i < r1; i++) {
                st->a[i] = rows[i].lo > t0 ? rows[i].lo : t0;
                st->b[i] = rows[i].hi < t1 ? rows[i].hi : t1;
                if (st->a[i] <= st->b[i]) tile_weights(st, i, t0);
            }
        }
    }
    if (split == 2)
        for (int i = 0; i < nr; i++) {
            vf *m = st->acc + (size_t)i * 2 * nv;
            for (int e = 0; e < nv; e++) m[e] += m[nv + e];
        }
}

/* attend_rows compiled for each cache format and for head sizes 64, 128 and 256 (unrolled);
 * WIDE, the pass of many rows a head, once per head size (only its widening knows the format). */
#define ATTEND_SIZES(NAME, TYPE, WIDE, WIDEN, WIDEN_K)                                         \
    static void attend_##NAME(const row_t *rows, int nr, const int *gs, int ng,                \
                              const cache_t *c, float scale, float softcap, pass_t *st,        \
                              int nv) {                                                        \
        const float sc = scale, cap = softcap;                                                 \
        const widen_fn w = WIDEN;                                                              \
        const widen_fn wk = WIDEN_K;                                                           \
        if (nv == 64 / LANES)                                                                  \
            attend_rows(rows, nr, gs, ng, c, sc, cap, st, 64 / LANES, TYPE, WIDE, w, wk);      \
        else if (nv == 128 / LANES)                                                            \
            attend_rows(rows, nr, gs, ng, c, sc, cap, st, 128 / LANES, TYPE, WIDE, w, wk);     \
        else if (nv == 256 / LANES)                                                            \
            attend_rows(rows, nr, gs, ng, c, sc, cap, st, 256 / LANES, TYPE, WIDE, w, wk);     \
        else attend_rows(rows, nr, gs, ng, c, sc, cap, st, nv, TYPE, WIDE, w, wk);             \
    }
ATTEND_SIZES(KV_F32, KV_F32, 0, NULL, NULL)
ATTEND_SIZES(KV_BF16, KV_BF16, 0, NULL, NULL)
ATTEND_SIZES(KV_F16, KV_F16, 0, NULL, NULL)
ATTEND_SIZES(KV_FP8_E4M3, KV_FP8_E4M3, 0, NULL, NULL)
ATTEND_SIZES(KV_FP8_E5M2, KV_FP8_E5M2, 0, NULL, NULL)
ATTEND_SIZES(KV_Q8_0, KV_Q8_0, 0, NULL, NULL)
ATTEND_SIZES(WIDE, KV_F32, 1, widen_of(c->type), widen_keys_of(c->type))
#undef ATTEND_SIZES

/* Every group of WIDE_ROWS rows or more (a prefill's or a long verification's pass): the wide
 * copy; else the cache format's own (a decode: a head's query heads, read in place). */
static void attend_pass(const row_t *rows, int nr, const int *gs, int ng, const cache_t *c,
                        float scale, float softcap, pass_t *st, int nv) {
    int fewest = PASS_ROWS;
    for (int h = 0; h < ng; h++) fewest = gs[h + 1] - gs[h] < fewest ? gs[h + 1] - gs[h] : fewest;
    if (fewest >= WIDE_ROWS) {
        attend_WIDE(rows, nr, gs, ng, c, scale, softcap, st, nv);
        return;
    }
    switch (c->type) {
    case KV_F32: attend_KV_F32(rows, nr, gs, ng, c, scale, softcap, st, nv); return;
    case KV_BF16: attend_KV_BF16(rows, nr, gs, ng, c, scale, softcap, st, nv); return;
    case KV_F16: attend_KV_F16(rows, nr, gs, ng, c, scale, softcap, st, nv); return;
    case KV_FP8_E4M3: attend_KV_FP8_E4M3(rows, nr, gs, ng, c, scale, softcap, st, nv); return;
    case KV_FP8_E5M2: attend_KV_FP8_E5M2(rows, nr, gs, ng, c, scale, softcap, st, nv); return;
    default: attend_KV_Q8_0(rows, nr, gs, ng, c, scale, softcap, st, nv); return;
    }
}

/* Where a request's chunk partials go when its chunks run as separate work items. */
typedef struct {
    float *m, *t;  /* [rows, chunks] */
    vf *a;         /* [rows, chunks, nv] */
    int64_t chunks;
} parts_t;

/* One pass: rows 0 .. nr - 1 (groups gs of KV heads c->g ..) against the key chunks. chunk < 0:
 * every chunk in order, each folded into the rows' running state, then the outputs; chunk >= 0:
 * that chunk alone, its partials into parts (row index[r]). */
static void run_pass(const row_t *rows, const int64_t *index, int nr, const int *gs, int ng,
                     const cache_t *c, float scale, float softcap, int64_t chunk,
                     const parts_t *parts, pass_t *st, int nv) {
    row_t clip[PASS_ROWS];
    int64_t c0 = chunk, c1 = chunk;  /* the chunks of this pass's keys */
    if (chunk < 0) {
        c0 = rows[0].lo / CHUNK_KEYS;
        c1 = rows[nr - 1].hi / CHUNK_KEYS;
        for (int r = 0; r < nr; r++) {
            c0 = rows[r].lo / CHUNK_KEYS < c0 ? rows[r].lo / CHUNK_KEYS : c0;
            c1 = rows[r].hi / CHUNK_KEYS > c1 ? rows[r].hi / CHUNK_KEYS : c1;
            st->run_m[r] = -INFINITY;
            st->run_t[r] = 0.0f;
            for (int e = 0; e < nv; e++) st->run[(size_t)r * nv + e] = (vf){0};
        }
    }
    if (c->type == KV_Q8_0) q8_queries(rows, nr, st, (int64_t)nv * LANES);
    for (int64_t ck = c0; ck <= c1; ck++) {
        const int64_t ka = ck * CHUNK_KEYS, kb = ka + CHUNK_KEYS - 1;
        for (int r = 0; r < nr; r++) {
            clip[r] = rows[r];
            clip[r].lo = rows[r].lo > ka ? rows[r].lo : ka;
            clip[r].hi = rows[r].hi < kb ? rows[r].hi : kb;
        }
        attend_pass(clip, nr, gs, ng, c, scale, softcap, st, nv);
        for (int r = 0; r < nr; r++) {
            const vf *a = st->acc + (size_t)r * 2 * nv;
            if (chunk < 0) {
                fold(&st->run_m[r], &st->run_t[r], st->run + (size_t)r * nv, st->m[r],
                     st->total[r], a, nv);
            } else {  /* this chunk's partial, folded later (tandem_paged_attention) */
                const int64_t at = index[r] * parts->chunks + ck;
                parts->m[at] = st->m[r];
                parts->t[at] = st->total[r];
                for (int e = 0; e < nv; e++) parts->a[at * nv + e] = a[e];
            }
        }
    }
    if (chunk < 0)
        for (int r = 0; r < nr; r++) {
            const vf inv = splat(1.0f / st->run_t[r]);
            for (int e = 0; e < nv; e++)
                store(rows[r].o + e * LANES, st->run[(size_t)r * nv + e] * inv);
        }
}

/* Queries i0 .. i1 - 1 of one request (its first query at flat row q0, qlen queries, slen keys
 * at `slots`), the heads of KV heads ga .. gb - 1, in passes of up to PASS_ROWS (query, head)
 * rows: where one KV head's rows (its query heads of every query) fit, a pass takes the rows of
 * as many consecutive KV heads as fit it; else one KV head's rows PASS_ROWS at a time. Rows go
 * in (KV head, query, head) order. chunk as in run_pass. */
static void attend_queries(const float *q, int64_t q_stride, const cache_t *cache0, float *out,
                           int64_t q0, int64_t i0, int64_t i1, int64_t ga, int64_t gb,
                           int64_t qlen, int64_t slen, int64_t h, int64_t d, float scale,
                           int64_t window, float softcap, int64_t chunk, const parts_t *parts,
                           pass_t *st) {
    const int64_t hkv = cache0->hkv, rep = h / hkv, per_head = (i1 - i0) * rep;
    const int nv = (int)(d / LANES);
    const int64_t span = per_head <= PASS_ROWS ? PASS_ROWS / per_head : 1;
    row_t rows[PASS_ROWS];
    int64_t index[PASS_ROWS];  /* each row's (query, head) number within the item */
    int gs[PASS_ROWS + 1];
    for (int64_t g0 = ga; g0 < gb; g0 += span) {
        const int64_t g1 = g0 + span < gb ? g0 + span : gb;
        cache_t c = *cache0;
        c.g = g0;
        int nr = 0, ng = 0;
        gs[0] = 0;
        for (int64_t g = g0; g < g1; g++) {
            for (int64_t i = i0; i < i1; i++) {
                const int64_t pos = slen - qlen + i;
                const int64_t lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
                for (int64_t hd = g * rep; hd < (g + 1) * rep; hd++) {
                    index[nr] = (i - i0) * h + hd;
                    rows[nr++] = (row_t){q + (q0 + i) * q_stride + hd * d,
                                         out + ((q0 + i) * h + hd) * d, lo, pos};
                    if (nr == PASS_ROWS && span == 1) {  /* one KV head's rows, a pass at a time */
                        gs[1] = nr;
                        run_pass(rows, index, nr, gs, 1, &c, scale, softcap, chunk, parts, st,
                                 nv);
                        nr = 0;
                    }
                }
            }
            gs[++ng] = nr;
        }
        if (nr > 0)
            run_pass(rows, index, nr, gs, span == 1 ? 1 : ng, &c, scale, softcap, chunk, parts,
                     st, nv);
    }
}
#endif
