/* y [m, n] = x [m, k] @ w [n, k]^T (+ bias [n]): the float32 linear layers of decode and verify
 * steps on the CPU (see tandem/kernels/cpu.py and tandem/layers/matmul_choice.py).
 *
 * At a few to a few dozen rows, BLAS's small-matrix kernels leave much of the machine idle (on
 * the AMX Xeon MKL ran SmolLM2's layers at 8.5 GB/s for 16 rows, a third of what the memory
 * streams). Here each tile keeps MR rows of x times NR rows of w in registers, w's rows are read
 * from memory once and reused from L1 by every block of MR rows, and the rows of w a few tiles
 * ahead are prefetched into L2 while this one computes.
 *
 * Every output is one dot product computed the same way wherever it lands: lane l accumulates
 * x[i] * w[i] for i = l mod 16 in order (fused multiply-add where the CPU has it: this file is
 * built with -ffp-contract=fast, and every tile runs the same inlined code), then the fixed tree
 * of vec.h sums the lanes. So a row's result depends neither on how many rows share the call, nor
 * on the tile shape or thread count: plain decoding and speculative verification get the same bits.
 *
 * Threads: OpenMP over blocks of w's rows. The build links OpenMP only when the process's runtime
 * is GNU libgomp (torch's), so these loops run in torch's own thread pool instead of a second one
 * spinning against it (cpu_build.py).
 */
#include <stdint.h>
#include <string.h>

#include "vec.h"

/* AVX-512 holds a 16-lane vf in one of its 32 registers: a 4 x 4 tile of vf accumulators. Elsewhere
 * GCC spills arrays of vf through the stack, so each accumulator is kept as its two 8-lane halves
 * (lanes 0-7 and 8-15: the same lane sums), in a 2 x 2 tile that fits AVX2's 16 registers. */
#ifdef __AVX512F__
#define MR 4
#define NR 4
#define PARTS 1
typedef vf vh;
#else
#define MR 2
#define NR 2
#define PARTS 2
typedef vf8 vh;
#endif
#define PW (LANES / PARTS) /* lanes per part */
#define PREFETCH_AHEAD 4096 /* floats (16 KB) ahead in w: the best of 1-64 KB on the AMX Xeon */

static inline __attribute__((always_inline)) vh load_part(const float *p) {
    vh v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* y[i, j] for i < mr rows of x and j < nr rows of w. Rows j >= nr read w's row 0 (valid memory)
 * and are dropped. pf: where to prefetch from, NR cache lines per step of 16 (NULL: none). */
static inline __attribute__((always_inline)) void tile(
        const float *x, int64_t mr, const float *w, int64_t nr, int64_t k, const float *bias,
        float *y, int64_t n, const float *pf) {
    const float *wr[NR];
    for (int j = 0; j < NR; j++) wr[j] = w + (j < nr ? j : 0) * k;
    vh acc[MR][NR][PARTS];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++)
            for (int p = 0; p < PARTS; p++) acc[i][j][p] = (vh){0};
    for (int64_t c = 0; c < k; c += LANES) {
        if (pf) {
            for (int j = 0; j < NR; j++) __builtin_prefetch(pf + j * LANES, 0, 2);
            pf += NR * LANES;
        }
        for (int p = 0; p < PARTS; p++) {
            vh wv[NR];
            for (int j = 0; j < NR; j++) wv[j] = load_part(wr[j] + c + p * PW);
            for (int i = 0; i < MR && i < mr; i++) {
                vh xv = load_part(x + i * k + c + p * PW);
                for (int j = 0; j < NR; j++) acc[i][j][p] += xv * wv[j];
            }
        }
    }
    float sums[MR * NR];
#if PARTS == 1 && MR * NR == 16
    vf t[16];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) t[i * NR + j] = i < mr ? acc[i][j][0] : (vf){0};
    store(sums, reduce16(t));
#elif PARTS == 1
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) sums[i * NR + j] = i < mr ? hsum(acc[i][j][0]) : 0.0f;
#else
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++)
            sums[i * NR + j] = i < mr ? hsum8(acc[i][j][0] + acc[i][j][1]) : 0.0f;
#endif
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            y[i * n + j] = bias ? sums[i * NR + j] + bias[j] : sums[i * NR + j];
}

/* x [m, k], w [n, k], bias [n] or NULL, y [m, n], all contiguous. Returns -1 (nothing written)
 * unless k is a multiple of 16. */
int tandem_linear(const float *x, const float *w, const float *bias, float *y, int64_t m,
                  int64_t n, int64_t k, int threads) {
    if (k % LANES || m < 0 || n < 0) return -1;
    int64_t blocks = (n + NR - 1) / NR;
    /* Below ~256K multiply-adds a second thread costs more to wake than it saves. */
    int parallel = threads > 1 && m * n * k >= (1 << 18);
    (void)parallel;
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t n0 = b * NR, nr = n - n0 < NR ? n - n0 : NR;
        const float *wb = w + n0 * k, *bb = bias ? bias + n0 : NULL;
        for (int64_t m0 = 0; m0 < m; m0 += MR) {
            /* The first pass over this tile's rows of w pulls the next tiles' into L2. */
            const float *pf = m0 == 0 ? wb + PREFETCH_AHEAD : NULL;
            if (m - m0 >= MR)
                tile(x + m0 * k, MR, wb, nr, k, bb, y + m0 * n + n0, n, pf);
            else
                tile(x + m0 * k, m - m0, wb, nr, k, bb, y + m0 * n + n0, n, pf);
        }
    }
    return 0;
}
