/* Linear layers on GGUF-quantized weights, kept in their blocks (see tandem/layers/quantized.py):
 * y [m, n] = x [m, k] @ W^T (+ bias) with W in row segments, each of one type, in output order
 * (a Q4_K_M file's fused q/k/v mixes Q5_0 and Q8_0 rows):
 *   Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K  interleaved 16 rows at a time (layout:
 *     cpu_quant_pack.c), multiplied by cpu_quant_r16.c with integer multiply-adds against x
 *     rounded to int8 (cpu_quant_x.c: per 32 as llama.cpp rounds activations for Q8_0; per 256
 *     with an integer sub-step per 32 for the K-quants), each output in its own lane;
 *   F16 BF16  in GGUF's rows, widened to float32 against x unrounded (cpu_quant_half.c).
 * x is rounded once per call, each row alone. Work items are (a group of 16 interleaved rows, or
 * HALF_ROWS half-precision rows) x (RGROUP rows of x), spread over the threads; every output is
 * computed by one fixed sequence whatever its item, so a row's result never depends on its
 * batch, its place in it or the thread count, and speculative verification gets the bits of
 * plain decoding.
 */
#include "kernels.h"
#include "quant_format.h"

#define XCHUNK 1024 /* rows of x prepared at a time: bounds the prepared copy's memory */
#define RGROUP 64   /* rows of x per work item, next to a group of weight rows */
#define MAX_SEGMENTS 8

int64_t tandem_q_block(int type) { return q_block(type); }
int64_t tandem_q_block_bytes(int type) { return q_block_bytes(type); }

/* One weight segment: `rows` rows of `type`, each `row_bytes` long in GGUF's blocks, from `data`
 * (r16: in groups of 16 interleaved rows, cpu_quant_pack.c). */
typedef struct {
    int type, r16;
    int64_t rows, row_bytes;
    const uint8_t *data;
} segment;

/* The descriptor's segments, checked: the block types interleaved, F16/BF16 in rows. */
static int read_segments(const int64_t *desc, int64_t n, int64_t k, segment *seg, int64_t *count) {
    int64_t nseg = desc[0], total = 0;
    if (nseg < 1 || nseg > MAX_SEGMENTS) return -1;
    for (int64_t s = 0; s < nseg; s++) {
        const int64_t *d = desc + 1 + 4 * s;
        int r16 = (d[0] & Q_R16) != 0, type = (int)(d[0] & ~(int64_t)Q_R16);
        seg[s] = (segment){type, r16, d[1], d[3], (const uint8_t *)(intptr_t)d[2]};
        int64_t block = q_block(type);
        if (!block || k % block || seg[s].row_bytes != k / block * q_block_bytes(type)
            || (is_half(type) ? r16 || k % 16 : !r16 || !tandem_q_r16_bytes(type, k)))
            return -1;
        total += seg[s].rows;
    }
    *count = nseg;
    return total == n ? 0 : -1;
}

/* y [m, n] = x [m, k] @ W^T (+ bias [n]) with W [n, k] described by desc: the segment count,
 * then per segment (ggml type, with Q_R16 where interleaved; rows; data address; bytes per row
 * in GGUF's blocks), stacked in output order. Returns -1 (nothing written) for a layout it does
 * not take (k not a multiple of the blocks, an unknown type, rows not adding up to n, no
 * memory). */
int tandem_qlinear(const float *x, const int64_t *desc, const float *bias, float *y, int64_t m,
                   int64_t n, int64_t k, int threads) {
    segment seg[MAX_SEGMENTS];
    int64_t nseg, blocks = 0, first[MAX_SEGMENTS + 1];
    if (m < 0 || k <= 0 || k % 32 || read_segments(desc, n, k, seg, &nseg)) return -1;
    if (m == 0) return 0;
    int x32 = 0, xk = 0; /* x wanted as prepare_x (32-element types), as prepare_xk (K-quants) */
    for (int64_t s = 0; s < nseg; s++) {  /* work items of 16 interleaved rows, or HALF_ROWS */
        int64_t unit = seg[s].r16 ? 16 : HALF_ROWS;
        first[s] = blocks, blocks += (seg[s].rows + unit - 1) / unit;
        x32 |= q_block(seg[s].type) == 32, xk |= q_block(seg[s].type) == 256;
    }
    first[nseg] = blocks;
    /* Per x row: q [k], xs [k / 4], xi [k / 16]; then prepare_xk's records (XK_BYTES per 256),
     * a 256's for consecutive rows side by side, the next 256's cstride on. */
    const int64_t xrows = m < XCHUNK ? m : XCHUNK, cstride = xrows * XK_BYTES;
    const size_t per_row = (x32 ? (size_t)(k + k + k / 4) : 0)
                         + (xk ? (size_t)(k / 256 * XK_BYTES) : 0);
    uint8_t *xbuf = malloc((size_t)xrows * per_row + 1); /* + 1: F16/BF16 alone need none */
    if (!xbuf) return -1;
    int8_t *xq = (int8_t *)xbuf;
    float *xs = (float *)(xbuf + (x32 ? xrows * k : 0));
    int32_t *xi = (int32_t *)(xs + (x32 ? xrows * (k / 4) : 0));
    uint8_t *xkr = (uint8_t *)(xi + (x32 ? xrows * (k / 16) : 0));
    int parallel = threads > 1 && m * n * k >= (1 << 18);
    (void)parallel;
    for (int64_t m0 = 0; m0 < m; m0 += XCHUNK) {
        const int64_t mc = m - m0 < XCHUNK ? m - m0 : XCHUNK;
        /* Work items: (group of weight rows, RGROUP x rows), group-major. */
        const int64_t groups = (mc + RGROUP - 1) / RGROUP, items = blocks * groups;
#pragma omp parallel num_threads(threads) if (parallel)
        {
#pragma omp for schedule(static)
            for (int64_t i = 0; i < mc; i++) {
                const float *row = x + (m0 + i) * k;
                if (x32) prepare_x(row, k, xq + i * k, xs + i * (k / 4), xi + i * (k / 16));
                if (xk) prepare_xk(row, k, xkr + i * XK_BYTES, cstride);
            }
#pragma omp for schedule(static)
            for (int64_t item = 0; item < items; item++) {
                const int64_t bi = item / groups, g0 = (item % groups) * RGROUP;
                int64_t s = 0;
                while (first[s + 1] <= bi) s++;
                const int64_t unit = seg[s].r16 ? 16 : HALF_ROWS, r0 = (bi - first[s]) * unit;
                const int64_t nr = seg[s].rows - r0 < unit ? seg[s].rows - r0 : unit;
                const int64_t g1 = mc - g0 < RGROUP ? mc : g0 + RGROUP;
                int64_t col = r0;
                for (int64_t t = 0; t < s; t++) col += seg[t].rows;
                if (seg[s].r16)
                    q_r16(seg[s].type, seg[s].data + r0 / 16 * tandem_q_r16_bytes(seg[s].type, k),
                          (int)nr, xq + g0 * k, xs + g0 * (k / 4), xi + g0 * (k / 16),
                          q_block(seg[s].type) == 256 ? xkr + g0 * XK_BYTES : NULL, cstride,
                          g1 - g0, k, k, k / 16, bias ? bias + col : NULL,
                          y + (m0 + g0) * n + col, n);
                else
                    q_half(seg[s].type, seg[s].data + r0 * seg[s].row_bytes, seg[s].row_bytes,
                           (int)nr, x + (m0 + g0) * k, g1 - g0, k, bias ? bias + col : NULL,
                           y + (m0 + g0) * n + col, n);
            }
        }
    }
    free(xbuf);
    return 0;
}
