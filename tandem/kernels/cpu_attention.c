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
 * The cache holds its rows in its format (kv_format.h: float32, 16-bit, fp8 or q8_0), read
 * once, in that type, and widened to float32 exactly in registers where they are used
 * (attention_tile.h), so the arithmetic above is the same for every format, on the values the
 * cache holds; but a q8_0 cache's scores are integer dot products of its int8 keys and the
 * query quantized per block to int16, times both scales (attention_q8.h), in every kind of pass.
 *
 * Speed: a pass takes up to PASS_ROWS rows: the rows of as many consecutive KV heads as fit
 * (for a decode, every head of the query), else one KV head's rows (its query heads, of up to
 * QUERY_CHUNK queries) PASS_ROWS at a time; so each tile of keys and values is read from memory
 * once for all of them, then from the caches. Where a KV head has WIDE_ROWS rows or more
 * (verification, prefill), its tile is widened to float32 once into a buffer and its scores
 * computed in register blocks of rows by keys (attention_wide.h): the same numbers in the same
 * order, so the same bits, at 1.3-1.7x the speed on a 1,024-token prefill (docs/performance.md).
 * Before a tile's heads are computed, all its cache lines are prefetched at once in address
 * order (a key's heads lie side by side in its slot, so a decode streams whole slots; read head
 * by head, 32 heads of 64 float16 numbers put each row a 4 KB page apart, which the hardware
 * prefetchers do not follow: without the fetch, 1.7x slower at depth 4,096 for float16 and 1.6x
 * for q8_0; a q8_0 decode also asks for the next tile head by head: attention_tile.h's
 * head_fetch). A decode or short verification whose layer of keys and values outgrows the
 * caches (STREAM_BYTES, STREAM_ROWS) streams instead: every head's scores, then every head's
 * value sums, with the next half tile asked for meanwhile (attention_pass.h's attend_rows),
 * 1.15-1.3x faster at depth 4,096 on the 1.7B shape, the same bits. Rows with the same keys
 * (one query's heads) add up their value rows together, and a row's value sums run as two
 * interleaved chains where it has few vectors, so the adds do not wait on each other. Work
 * items (a request's queries, QUERY_CHUNK or, in long prompts, WIDE_CHUNK at a time) spread
 * over torch's OpenMP threads, so one long prefill uses every core.
 */
#include <stdint.h>
#include <stdlib.h>
#include <math.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "attention_pass.h"
#include "kernels.h"

typedef struct {
    int64_t r, i0, i1, chunk;  /* request, its queries i0 .. i1 - 1, one key chunk (or -1: all) */
    int64_t g0, g1;            /* its KV heads g0 .. g1 - 1 */
} item_t;

/* Where a step has fewer work items than this per thread, each is cut by KV heads too: a
 * verification or a decode of one request at a depth within a chunk or two (a single item, or a
 * full chunk beside a short one) would otherwise leave threads idle. */
#define ITEMS_PER_THREAD 4

/* A request of up to STREAM_ROWS rows a KV head (a decode, a short verification: few
 * multiply-adds a byte of cache) whose layer of keys and values takes at least STREAM_BYTES
 * runs in phases that stream the cache (attention_pass.h's attend_rows). Below that size, read
 * from the L2 or a shared L3, a tile asked for in one burst is 5-10% faster; above those rows
 * (a Qwen3-8B-shaped verification of 9: 36 rows a KV head) the compute hides the burst, and
 * the phases cost 5% (benchmarks/LOG.md). */
#define STREAM_BYTES ((int64_t)4 << 20)
#define STREAM_ROWS 16

/* A scratch of at least `bytes`, 64-byte aligned, kept by the calling thread from one call to
 * the next (the passes' state is a few hundred KB: allocated afresh, it would be mapped and
 * faulted in again every layer of every step). which: one of the call's two scratches. */
static void *scratch(int which, size_t bytes) {
    static __thread void *buf[2];
    static __thread size_t cap[2];
    if (cap[which] < bytes) {
        free(buf[which]);
        buf[which] = aligned_alloc(64, (bytes + 63) / 64 * 64);
        cap[which] = buf[which] ? bytes : 0;
    }
    return buf[which];
}

/* q: [T, q_stride] with head hd at hd * D; out: [T, H, D]; req: [num_reqs, 3]; kv_slots:
 * [num_reqs, lmax]; the caches [slots, Hkv] rows of D numbers in format kv_type (kv_format.h).
 * Query heads g * rep .. g * rep + rep - 1 share KV head g. D must be a multiple of 16 (the
 * same sizes on every CPU). A request with no queries reads nothing. Returns -1 (nothing
 * written) on sizes or formats it does not take, or no memory.
 *
 * Work items: a request's queries QUERY_CHUNK (or WIDE_CHUNK) at a time, each over all its
 * key chunks; where that leaves threads idle (a few long requests: decoding at depth), a
 * request of at most QUERY_CHUNK queries runs one item per key chunk instead (flash-decoding),
 * and its chunks' partials are folded afterwards in chunk order: the same folds, in the same
 * order, as one item would do, so the same bits. Still fewer than ITEMS_PER_THREAD items a
 * thread: each is cut by KV heads too. */
int tandem_paged_attention(const float *q, int64_t q_stride, const void *k_cache,
                           const void *v_cache, float *out, const int64_t *req,
                           const int64_t *kv_slots, int64_t num_reqs, int64_t lmax, int64_t h,
                           int64_t hkv, int64_t d, float scale, int64_t window, float softcap,
                           int kv_type, int threads) {
    if (d > MAX_HEAD_DIM || d % 16 || hkv <= 0 || h % hkv || num_reqs < 0
        || kv_row_bytes(kv_type, d) == 0)
        return -1;
    const int nt = threads > 1 ? threads : 1;
    const int64_t nv = d / LANES;
    int64_t work = 0, plain = 0, wide = 0, split_rows = 0, max_items = 0;
    for (int64_t r = 0; r < num_reqs; r++) {
        work += req[3 * r + 1] * req[3 * r + 2];
        plain += (req[3 * r + 1] + QUERY_CHUNK - 1) / QUERY_CHUNK;
        wide += (req[3 * r + 1] + WIDE_CHUNK - 1) / WIDE_CHUNK;
        max_items += (req[3 * r + 1] + QUERY_CHUNK - 1) / QUERY_CHUNK
                     + (req[3 * r + 2] + CHUNK_KEYS - 1) / CHUNK_KEYS;
    }
    const int spread = nt > 1 && plain < 2 * nt;  /* threads would idle: split long requests */
    /* Long prompts go WIDE_CHUNK queries an item: a KV head's widened tile then serves 4x the
     * rows (attention_wide.h), 1.2x faster on a 2,048-token prefill; shorter steps keep
     * QUERY_CHUNK, so that every thread has work. Neither changes a row's bits. */
    const int64_t qc = wide >= 4 * nt ? WIDE_CHUNK : QUERY_CHUNK;
    item_t *items = malloc(sizeof(item_t) * (size_t)(max_items + 1));
    int64_t *part_at = malloc(sizeof(int64_t) * (size_t)(num_reqs + 1));  /* r's first part */
    int64_t n = 0;
    if (!items || !part_at) {
        free(items);
        free(part_at);
        return -1;
    }
    for (int64_t r = 0; r < num_reqs; r++) {
        const int64_t qlen = req[3 * r + 1], slen = req[3 * r + 2];
        const int64_t chunks = (slen + CHUNK_KEYS - 1) / CHUNK_KEYS;
        part_at[r] = split_rows;
        if (spread && qlen > 0 && qlen <= QUERY_CHUNK && chunks > 1) {
            for (int64_t ck = 0; ck < chunks; ck++)  /* a chunk without a row's keys: m = -inf */
                items[n++] = (item_t){r, 0, qlen, ck, 0, hkv};
            split_rows += qlen * h * chunks;
        } else {
            for (int64_t i0 = 0; i0 < qlen; i0 += qc)
                items[n++] = (item_t){r, i0, i0 + qc < qlen ? i0 + qc : qlen, -1, 0, hkv};
        }
    }
    part_at[num_reqs] = split_rows;
    /* Too few items for the threads: each becomes `pieces` items of consecutive KV heads (in
     * place, from the last, so the order stays item by item, then head by head). A row is
     * still computed whole by one thread, so its bits do not change. */
    const int64_t want = n > 0 ? (ITEMS_PER_THREAD * nt + n - 1) / n : 1;
    const int64_t pieces = nt > 1 && n < ITEMS_PER_THREAD * nt ? (want < hkv ? want : hkv) : 1;
    if (pieces > 1) {
        item_t *more = realloc(items, sizeof(item_t) * (size_t)(n * pieces));
        if (!more) {
            free(items), free(part_at);
            return -1;
        }
        items = more;
        for (int64_t it = n - 1; it >= 0; it--)
            for (int64_t p = pieces - 1; p >= 0; p--) {
                items[it * pieces + p] = items[it];
                items[it * pieces + p].g0 = hkv * p / pieces;
                items[it * pieces + p].g1 = hkv * (p + 1) / pieces;
            }
        n *= pieces;
    }
    /* one pass state per thread: its value sums and the running sums */
    const size_t pass_bytes = (sizeof(pass_t) + sizeof(vf) * (3 * PASS_ROWS + KEY_TILE)
                               * (size_t)nv + 63) / 64 * 64;
    char *state = scratch(0, pass_bytes * (size_t)nt);
    vf *pa = scratch(1, sizeof(vf) * (size_t)(split_rows * nv) + sizeof(float) * 2
                        * (size_t)split_rows + 64);
    if (!state || !pa) {
        free(items), free(part_at);
        return -1;
    }
    float *pm = (float *)(pa + split_rows * nv);  /* [2, split rows]: maxima, then sums */
    for (int t = 0; t < nt; t++) {
        pass_t *st = (pass_t *)(state + pass_bytes * (size_t)t);
        st->run = st->acc + 2 * PASS_ROWS * nv;
        st->wide = (float *)(st->run + PASS_ROWS * nv);
    }
    const cache_t cache = {(const char *)k_cache, (const char *)v_cache, NULL, hkv, 0,
                           kv_row_bytes(kv_type, d), kv_type, 0};
    /* Below ~64k multiply-adds a second thread costs more to wake than it saves. */
    const int parallel = nt > 1 && n > 1 && work * h * d >= (1 << 16);
    (void)parallel;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (parallel)
    for (int64_t it = 0; it < n; it++) {
#ifdef _OPENMP
        pass_t *st = (pass_t *)(state + pass_bytes * (size_t)omp_get_thread_num());
#else
        pass_t *st = (pass_t *)state;
#endif
        const item_t w = items[it];
        const int64_t qlen = req[3 * w.r + 1], slen = req[3 * w.r + 2];
        const int64_t at = part_at[w.r], chunks = (slen + CHUNK_KEYS - 1) / CHUNK_KEYS;
        const parts_t parts = {pm + at, pm + split_rows + at, pa + at * nv, chunks};
        cache_t c = cache;
        c.slots = kv_slots + w.r * lmax;
        c.stream = qlen * (h / hkv) <= STREAM_ROWS && slen * hkv * c.rb * 2 >= STREAM_BYTES;
        attend_queries(q, q_stride, &c, out, req[3 * w.r], w.i0, w.i1, w.g0, w.g1, qlen, slen,
                       h, d, scale, window, softcap, w.chunk, &parts, st);
    }
    /* The split requests' rows: their chunks' partials folded in chunk order. */
#pragma omp parallel for num_threads(nt) schedule(static) if (parallel && split_rows > 0)
    for (int64_t r = 0; r < num_reqs; r++) {
        const int64_t qlen = req[3 * r + 1], slen = req[3 * r + 2];
        const int64_t chunks = (slen + CHUNK_KEYS - 1) / CHUNK_KEYS;
        if (part_at[r + 1] == part_at[r]) continue;
        vf acc[NV_MAX];
        for (int64_t row = 0; row < qlen * h; row++) {
            const int64_t base = part_at[r] + row * chunks;
            float m = -INFINITY, t = 0.0f;
            for (int64_t e = 0; e < nv; e++) acc[e] = (vf){0};
            for (int64_t ck = 0; ck < chunks; ck++)
                fold(&m, &t, acc, pm[base + ck], pm[split_rows + base + ck],
                     pa + (base + ck) * nv, (int)nv);
            float *o = out + (req[3 * r] * h + row) * d;  /* row = query * h + head */
            const vf inv = splat(1.0f / t);
            for (int64_t e = 0; e < nv; e++) store(o + e * LANES, acc[e] * inv);
        }
    }
    free(items), free(part_at);
    return 0;
}
