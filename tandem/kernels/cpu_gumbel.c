/* The token a row of scores picks: its plain argmax (greedy rows, as torch.argmax picks), and
 * Gumbel-max sampling (tandem/sample/gumbel.py's gumbel_sample, the same noise and the same
 * choice) over a row's candidate columns: out[r] = argmax_v (scores[v] + g(keys[r], ids[v])),
 * ties to the lower column, g = -log(-log(u)) with u = (h + 1/2) / 2^32 and
 * h = lowbias32(lowbias32(id ^ lo) ^ hi).
 *
 * A column is skipped without its logarithms when its hash alone shows it cannot win: g rises
 * with h, so g(h) > m needs h >= H_MIN(m), and a table of H_MIN at margins rounded down to 1/8
 * nat (with a safety of 64 hashes, far above the rounding of the two logarithms) rejects almost
 * every column with a multiply-xor hash and one compare. Only a handful per row get the exact
 * double-precision noise and compete. Exactness: a column is skipped only if its value is
 * strictly below the running best, so the winner is the one the full computation would pick.
 * The logarithms are libm's (torch's may differ in the last bit): a choice could differ only
 * where two columns' values agree to ~1e-16, which no float32 scores meet.
 */#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "vec.h"

#define STEPS_PER_NAT 8
#define M_LO (-4.0)   /* below G_MIN (-3.13): every hash may win */
#define M_HI 23.0     /* above G_MAX (22.87): no hash can win */
#define TABLE ((23 + 4) * STEPS_PER_NAT + 1) /* (M_HI - M_LO) * STEPS_PER_NAT + 1, in integers */

static uint32_t H_MIN[TABLE];  /* h < H_MIN[b] => g(h) < M_LO + b / STEPS_PER_NAT */

static inline uint32_t h32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352DU;
    x ^= x >> 15;
    x *= 0x846CA68BU;
    return x ^ (x >> 16);
}

static inline uint32_t hash(uint64_t key, int64_t id) {
    return h32(h32((uint32_t)id ^ (uint32_t)key) ^ (uint32_t)(key >> 32));
}

static inline double gumbel(uint32_t h) {
    double u = ((double)h + 0.5) * (1.0 / 4294967296.0);
    return -log(-log(u));
}

static void init_table(void) {
    static int done;
    if (__atomic_load_n(&done, __ATOMIC_ACQUIRE))
        return;
    for (int b = 0; b < TABLE; b++) {
        double m = M_LO + (double)b / STEPS_PER_NAT;
        double h = 4294967296.0 * exp(-exp(-m)) - 0.5 - 64.0;  /* g(h) = m, less a safety */
        H_MIN[b] = h <= 0 ? 0 : h >= 4294967295.0 ? 0xFFFFFFFFU : (uint32_t)h;
    }
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);  /* idempotent: racing callers agree */
}

/* The first column of a row's maximum, or its first NaN (torch.argmax's choice): LANES columns
 * at a time, each lane keeping its first maximum (a strict >), then the lanes' greatest value at
 * its least column; a row with a NaN is scanned again for the first one (rare). */
static int64_t first_max(const float *s, int64_t n) {
    int64_t i = 1, best = 0;
    float top = s[0];
    if (n >= 2 * LANES) {
        vf bv = load(s);
        vi bi = __builtin_convertvector(iota(), vi), idx = bi, nan = bv != bv;
        for (i = LANES; i + LANES <= n; i += LANES) {
            const vf v = load(s + i);
            const vi gt = v > bv;
            idx += LANES;
            bv = vselect(gt, v, bv);
            bi = (gt & idx) | (~gt & bi);
            nan |= v != v;
        }
        int any = 0;
        for (int l = 0; l < LANES; l++) any |= nan[l];
        for (int64_t j = 0; any; j++)  /* the first NaN, among the columns read */
            if (s[j] != s[j]) return j;
        top = bv[0], best = bi[0];
        for (int l = 1; l < LANES; l++)
            if (bv[l] > top || (bv[l] == top && bi[l] < best)) top = bv[l], best = bi[l];
    } else if (top != top) {
        return 0;
    }
    for (; i < n; i++) {  /* the columns left (all of a short row) */
        if (s[i] != s[i]) return i;
        if (s[i] > top) top = s[i], best = i;
    }
    return best;
}

static int64_t row_argmax(const float *s, int64_t vocab, uint64_t key, const int64_t *ids) {
    const int64_t top = first_max(s, vocab);  /* the start: the largest score skips the most */
    int64_t best_col = top;
    double best = (double)s[top] + gumbel(hash(key, ids ? ids[top] : top));
    for (int64_t v = 0; v < vocab; v++) {
        double m = best - (double)s[v];  /* the noise v needs to reach the best */
        if (!(m < M_HI) || v == top)
            continue;                     /* -inf scores too */
        uint32_t h = hash(key, ids ? ids[v] : v);
        if (m > M_LO && h < H_MIN[(int)((m - M_LO) * STEPS_PER_NAT)])
            continue;                     /* g(h) < the margin rounded down <= m */
        double value = (double)s[v] + gumbel(h);
        if (value > best || (value == best && v < best_col))
            best = value, best_col = v;
    }
    return best_col;
}

/* The columns of each row of probs [rows, vocab] that can win its Gumbel-max (the selection of
 * sample/gumbel.py's gumbel_sample): a column whose probability is below the top column's times
 * exp(g(top) - G_MAX) loses to the top whatever its noise (less a margin of 1e-3 in the
 * exponent, far above the rounding of the logarithms); a row with a NaN keeps its NaN columns
 * only (its first NaN wins, as in the whole row's argmax). ids [vocab] int64 or NULL: the token
 * whose noise a column reads. Writes each row's candidates in column order into cols (room for
 * rows * vocab), row after row, and start [rows + 1]: row r's are start[r] .. start[r + 1] - 1. */
void tandem_gumbel_candidates(const float *probs, int64_t rows, int64_t vocab,
                              const int64_t *keys, const int64_t *ids, int64_t *start,
                              int64_t *cols) {
    init_table();
    const double g_max = -log(-log1p(-0.5 / 4294967296.0));  /* g at the largest uniform */
    int64_t c = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *p = probs + r * vocab;
        start[r] = c;
        const int64_t top = first_max(p, vocab);
        float floor_p = INFINITY;  /* a NaN row: its NaN columns only */
        if (p[top] == p[top]) {
            const double g = gumbel(hash((uint64_t)keys[r], ids ? ids[top] : top));
            floor_p = (float)exp(log((double)p[top]) + g - g_max - 1e-3);
        }
        const vf fl = splat(floor_p);
        int64_t v = 0;
        for (; v + LANES <= vocab; v += LANES) {
            const vf x = load(p + v);
            const vi hit = (x >= fl) | (x != x);
            int any = 0;
            for (int l = 0; l < LANES; l++) any |= hit[l];
            if (any)
                for (int l = 0; l < LANES; l++)
                    if (hit[l]) cols[c++] = v + l;
        }
        for (; v < vocab; v++)
            if (p[v] >= floor_p || p[v] != p[v]) cols[c++] = v;
    }
    start[rows] = c;
}

/* The Gumbel-max of each row over its candidate columns (the columns that can win, as
 * sample/gumbel.py's gumbel_sample selects them: its answer is the whole row's): row r's
 * candidates are i = start[r] .. start[r + 1] - 1, in ascending column order, with scores[i]
 * float32 (-inf where forbidden, one finite per row at least), ids[i] the token whose noise it
 * reads (a TLI draft's columns read their target twins') and cols[i] its column; keys [rows]
 * int64 (64-bit noise keys); out[r] = the winning cols[i] (0 for a row without candidates). */
void tandem_gumbel_argmax_sparse(const float *scores, const int64_t *start, const int64_t *ids,
                                 const int64_t *cols, int64_t rows, const int64_t *keys,
                                 int64_t *out, int threads) {
    init_table();
#pragma omp parallel for num_threads(threads) if (rows > 1 && threads > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t a = start[r], n = start[r + 1] - a;
        out[r] = n > 0 ? cols[a + row_argmax(scores + a, n, (uint64_t)keys[r], ids + a)] : 0;
    }
}

/* scores [rows, vocab] float32 -> out [rows] int64: each row's first maximal column. */
void tandem_argmax(const float *scores, int64_t rows, int64_t vocab, int64_t *out, int threads) {
#pragma omp parallel for num_threads(threads) if (rows > 1 && threads > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) out[r] = first_max(scores + r * vocab, vocab);
}
