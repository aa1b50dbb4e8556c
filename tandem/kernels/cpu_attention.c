/* Paged attention straight from the KV cache, for any number of queries per request: decode
 * (1), verification (1 + k), prefill chunks of any length, all requests of a step in one call.
 *
 * Request r owns flat query rows [req[r][0], req[r][0] + req[r][1]) and keys 0 .. req[r][2] - 1
 * at cache slots kv_slots[r][j]; its query i sits at position req[r][2] - req[r][1] + i and
 * attends keys j <= position (and j > position - window when window > 0). Scores are q.k * scale,
 * capped as softcap * tanh(score / softcap) when softcap > 0 (Gemma 2).
 *
 * The rule: each (query, head) row is computed whole, by one thread, in one order fixed by its
 * own keys. Keys go in tiles of KEY_TILE that start at multiples of KEY_TILE (a grid of the key
 * positions, the same for every row); per tile, in key order: the row's scores (lane-partial dot
 * products summed by vec.h's fixed tree), the running maximum, the weights exp(score - max),
 * their sum in lanes, and the value sums, after both are rescaled by exp(old max - new max).
 * None of it depends on which rows share a pass, on how a request's queries are cut into work
 * items or spread over threads, or on the other requests of the step. So a token's attention has
 * the same bits in plain decoding, in a verification of any length, in a prefill chunk of any
 * size, and when a preempted sequence is recomputed as one prefill.
 *
 * Speed: a pass takes up to PASS_ROWS rows that share one KV head (the query heads of one KV
 * head, of up to QUERY_CHUNK queries), so each tile of keys and values is read from memory once
 * for all of them and then from L1. Rows with the same keys (one query's heads) add up their
 * value rows together, and a row's value sums run as two interleaved chains where it has few
 * vectors, so the adds do not wait on each other. Work items (a request's queries, QUERY_CHUNK at
 * a time) spread over torch's OpenMP threads, so one long prefill uses every core.
 */
#include <stdint.h>
#include <stdlib.h>
#include <math.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels.h"
#include "vec.h"
#include "vmath.h"

#define MAX_HEAD_DIM 512
#define NV_MAX (MAX_HEAD_DIM / LANES)
#define KEY_TILE 64     /* keys per tile; tiles start at multiples of KEY_TILE */
#define TILE_STRIDE (KEY_TILE + LANES)  /* a row's scores in the scratch (a block may overrun) */
#define PASS_ROWS 64    /* (query, head) rows in one pass over the keys */
#define SCORE_ROWS 4    /* rows whose scores are computed together (their queries in registers) */
#define VALUE_ROWS 4    /* rows whose value sums run together */
#define VALUE_ACCS (LANES == 16 ? 24 : 12)  /* vector registers for those sums */
#define VALUE_VECS 8    /* vectors of a row's sums added up at a time (of nv) */
#define QUERY_CHUNK 16  /* a work item's queries */

typedef struct {
    const float *q;  /* the row's query head [D] */
    float *o;        /* its output [D] */
    int64_t lo, hi;  /* the keys it attends: lo .. hi */
} row_t;

/* A pass's running state, per row: the maximum so far, the weights' sum, the rescale factor of
 * this tile, its keys in this tile (a > b: none), and the value sums (`split` chains of nv). */
typedef struct {
    float m[PASS_ROWS], total[PASS_ROWS], alpha[PASS_ROWS];
    int64_t a[PASS_ROWS], b[PASS_ROWS];
    float s[PASS_ROWS * TILE_STRIDE];  /* row i's score (then weight) of key j: s[i][j - t0] */
    vf acc[];                          /* [PASS_ROWS][2][nv] */
} pass_t;

static inline int split_of(int nv) { return nv < 8 ? 2 : 1; }

/* Scores of rows 0 .. nr - 1 (nr <= SCORE_ROWS) for keys a .. b of the tile at t0, into
 * s[i * TILE_STRIDE + j - t0]. pf: prefetch the key rows a block ahead (the pass's first rows:
 * the others find them in L1). nv = D / LANES, a constant where inlined. */
static inline __attribute__((always_inline)) void tile_scores(
        const row_t *rows, int nr, const float *k_cache, const int64_t *slots, int64_t hkv,
        int64_t g, int64_t a, int64_t b, int64_t t0, float scale, float softcap, float *s,
        int pf, const int nv) {
    int64_t d = nv * LANES;
    vf qv[SCORE_ROWS][NV_MAX];
    for (int i = 0; i < nr; i++)
        for (int e = 0; e < nv; e++) qv[i][e] = load(rows[i].q + e * LANES);
    for (int64_t j = a; j <= b; j += LANES) {
        vf t[SCORE_ROWS][LANES];  /* t[i][k]: row i's partial sums for key j + k */
        for (int k = 0; k < LANES; k++) {
            if (j + k <= b) {
                const float *kj = k_cache + (slots[j + k] * hkv + g) * d;
                if (pf && j + k + LANES <= b)  /* the row a block ahead */
                    for (int e = 0; e < nv; e++)  /* each 64-byte line */
                        __builtin_prefetch(k_cache + (slots[j + k + LANES] * hkv + g) * d
                                           + e * LANES);
                vf kv[NV_MAX];
                for (int e = 0; e < nv; e++) kv[e] = load(kj + e * LANES);
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
 * keys a .. b in this tile: each value row loaded once for all. A row's sum runs in key order as
 * `split` chains (even keys to the first, odd keys to the second where a row has few vectors),
 * rescaled by alpha first. gn, cv and nv are constants where inlined, so the sums stay in
 * registers. */
static inline __attribute__((always_inline)) void tile_values(
        pass_t *st, int i0, const int gn, int64_t t0, const float *v_cache, const int64_t *slots,
        int64_t hkv, int64_t g, int pf, int e0, const int cv, const int nv) {
    const int split = split_of(nv);
    int64_t d = nv * LANES, a = st->a[i0], b = st->b[i0];
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
        const float *vj = v_cache + (slots[J] * hkv + g) * d + e0 * LANES;                     \
        if (pf && (J) + 8 <= b) /* a few value rows ahead */                                   \
            for (int e = 0; e < cv; e++)                                                       \
                __builtin_prefetch(v_cache + (slots[(J) + 8] * hkv + g) * d + (e0 + e) * LANES);\
        vf vv[VALUE_VECS];                                                                     \
        for (int e = 0; e < cv; e++) vv[e] = load(vj + e * LANES);                             \
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

/* Rows 0 .. nr - 1 (nr <= PASS_ROWS, all of KV head g) against their keys, tile by tile. */
static inline __attribute__((always_inline)) void attend_rows(
        const row_t *rows, int nr, const float *k_cache, const float *v_cache,
        const int64_t *slots, int64_t hkv, int64_t g, float scale, float softcap, pass_t *st,
        const int nv) {
    const int split = split_of(nv);
    int64_t lo = rows[0].lo, hi = rows[0].hi;
    for (int i = 0; i < nr; i++) {
        lo = rows[i].lo < lo ? rows[i].lo : lo;
        hi = rows[i].hi > hi ? rows[i].hi : hi;
        st->m[i] = -INFINITY;
        st->total[i] = 0.0f;
        for (int e = 0; e < 2 * nv; e++) st->acc[(size_t)i * 2 * nv + e] = (vf){0};
    }
    const int cv = nv < VALUE_VECS ? nv : VALUE_VECS;  /* the sums' vectors, a chunk at a time */
    int vg = VALUE_ACCS / (split * cv);
    vg = vg < 1 ? 1 : vg > VALUE_ROWS ? VALUE_ROWS : vg;
    for (int64_t t0 = lo - lo % KEY_TILE; t0 <= hi; t0 += KEY_TILE) {
        int64_t t1 = t0 + KEY_TILE - 1 < hi ? t0 + KEY_TILE - 1 : hi, a0 = t0 > lo ? t0 : lo;
        for (int i = 0; i < nr; i += SCORE_ROWS)
            tile_scores(rows + i, nr - i < SCORE_ROWS ? nr - i : SCORE_ROWS, k_cache, slots, hkv,
                        g, a0, t1, t0, scale, softcap, st->s + i * TILE_STRIDE, i == 0, nv);
        for (int i = 0; i < nr; i++) {
            st->a[i] = rows[i].lo > t0 ? rows[i].lo : t0;
            st->b[i] = rows[i].hi < t1 ? rows[i].hi : t1;
            if (st->a[i] <= st->b[i]) tile_weights(st, i, t0);
        }
        for (int i0 = 0; i0 < nr;) {
            int gn = 1;
            while (i0 + gn < nr && gn < vg && st->a[i0 + gn] == st->a[i0]
                   && st->b[i0 + gn] == st->b[i0])
                gn++;
            if (st->a[i0] <= st->b[i0]) {
#define VALUES(GN) tile_values(st, i0, GN, t0, v_cache, slots, hkv, g, i0 == 0, e0, cv, nv)
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
    for (int i = 0; i < nr; i++) {
        const vf *m = st->acc + (size_t)i * 2 * nv;
        const vf inv = splat(1.0f / st->total[i]);
        for (int e = 0; e < nv; e++)
            store(rows[i].o + e * LANES, (split == 2 ? m[e] + m[nv + e] : m[e]) * inv);
    }
}

static void attend_pass(const row_t *rows, int nr, const float *k_cache, const float *v_cache,
                        const int64_t *slots, int64_t hkv, int64_t g, float scale, float softcap,
                        pass_t *st, int nv) {
#define ATTEND(NV) attend_rows(rows, nr, k_cache, v_cache, slots, hkv, g, scale, softcap, st, NV)
    if (nv == 64 / LANES) ATTEND(64 / LANES);  /* head sizes 64, 128 and 256, unrolled */
    else if (nv == 128 / LANES) ATTEND(128 / LANES);
    else if (nv == 256 / LANES) ATTEND(256 / LANES);
    else ATTEND(nv);
#undef ATTEND
}

/* Queries i0 .. i1 - 1 of one request (its first query at flat row q0, qlen queries, slen keys
 * at `slots`), every head: for each KV head, its rows PASS_ROWS at a time in (query, head)
 * order. */
static void attend_queries(const float *q, int64_t q_stride, const float *k_cache,
                           const float *v_cache, float *out, int64_t q0, int64_t i0, int64_t i1,
                           int64_t qlen, int64_t slen, const int64_t *slots, int64_t h,
                           int64_t hkv, int64_t d, float scale, int64_t window, float softcap,
                           pass_t *st) {
    int64_t rep = h / hkv;
    int nv = (int)(d / LANES);
    row_t rows[PASS_ROWS];
    for (int64_t g = 0; g < hkv; g++) {
        int nr = 0;
        for (int64_t i = i0; i < i1; i++) {
            int64_t pos = slen - qlen + i;
            int64_t lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
            for (int64_t hd = g * rep; hd < (g + 1) * rep; hd++) {
                rows[nr++] = (row_t){q + (q0 + i) * q_stride + hd * d,
                                     out + ((q0 + i) * h + hd) * d, lo, pos};
                if (nr == PASS_ROWS) {
                    attend_pass(rows, nr, k_cache, v_cache, slots, hkv, g, scale, softcap, st,
                                nv);
                    nr = 0;
                }
            }
        }
        if (nr) attend_pass(rows, nr, k_cache, v_cache, slots, hkv, g, scale, softcap, st, nv);
    }
}

/* q: [T, q_stride] with head hd at hd * D; out: [T, H, D]; req: [num_reqs, 3]; kv_slots:
 * [num_reqs, lmax]. Query heads g * rep .. g * rep + rep - 1 share KV head g. D must be a
 * multiple of 16 (the same sizes on every CPU). A request with no queries reads nothing. Returns
 * -1 (nothing written) on sizes it does not take or no memory. */
int tandem_paged_attention(const float *q, int64_t q_stride, const float *k_cache,
                           const float *v_cache, float *out, const int64_t *req,
                           const int64_t *kv_slots, int64_t num_reqs, int64_t lmax, int64_t h,
                           int64_t hkv, int64_t d, float scale, int64_t window, float softcap,
                           int threads) {
    if (d > MAX_HEAD_DIM || d % 16 || hkv <= 0 || h % hkv || num_reqs < 0) return -1;
    int nt = threads > 1 ? threads : 1;
    int64_t work = 0;
    /* one pass state per thread, its value sums at 64-byte alignment */
    size_t pass_bytes = (sizeof(pass_t) + sizeof(vf) * 2 * PASS_ROWS * (size_t)(d / LANES)
                         + 63) / 64 * 64;
    int64_t *first = malloc(sizeof(int64_t) * (size_t)(num_reqs + 1));  /* r's first item */
    char *state = aligned_alloc(64, pass_bytes * (size_t)nt);
    if (!first || !state) {
        free(first);
        free(state);
        return -1;
    }
    first[0] = 0;
    for (int64_t r = 0; r < num_reqs; r++) {
        first[r + 1] = first[r] + (req[3 * r + 1] + QUERY_CHUNK - 1) / QUERY_CHUNK;
        work += req[3 * r + 1] * req[3 * r + 2];
    }
    int64_t items = first[num_reqs];
    /* Below ~64k multiply-adds a second thread costs more to wake than it saves. */
    int parallel = nt > 1 && items > 1 && work * h * d >= (1 << 16);
    (void)parallel;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (parallel)
    for (int64_t it = 0; it < items; it++) {
#ifdef _OPENMP
        pass_t *st = (pass_t *)(state + pass_bytes * (size_t)omp_get_thread_num());
#else
        pass_t *st = (pass_t *)state;
#endif
        int64_t a = 0, b = num_reqs - 1;  /* the item's request: the last r with first[r] <= it */
        while (a < b) {
            int64_t mid = (a + b + 1) / 2;
            if (first[mid] <= it) a = mid;
            else b = mid - 1;
        }
        int64_t qlen = req[3 * a + 1], i0 = (it - first[a]) * QUERY_CHUNK;
        int64_t i1 = i0 + QUERY_CHUNK < qlen ? i0 + QUERY_CHUNK : qlen;
        attend_queries(q, q_stride, k_cache, v_cache, out, req[3 * a], i0, i1, qlen,
                       req[3 * a + 2], kv_slots + a * lmax, h, hkv, d, scale, window, softcap,
                       st);
    }
    free(first);
    free(state);
    return 0;
}
