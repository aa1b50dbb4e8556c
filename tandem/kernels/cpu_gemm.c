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
 * x[i] * w[i] for i = l mod LANES in order (fused multiply-add where the CPU has it: this file is
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

#include "kernels.h"
#include "vec.h"

/* A tile of MR x NR accumulators, one register each, plus NR rows of w and one of x: 4 x 4 in
 * AVX-512's 32 registers, 2 x 4 in AVX2's 16. One reduce_lanes sums a whole tile. */
#if LANES == 16
#define MR 4
#define NR 4
#else
#define MR 2
#define NR 4
#endif
/* Holds v in a register from here on. Left to itself, GCC folded each load of w into the
 * multiply-adds that use it, so with AVX2 every row of x read w again: 10 loads for 8 FMAs
 * instead of 6, and the 16- and 32-row matmuls ran 1.17x and 1.3x slower (the same bits: only
 * where the operand comes from changes). Only where a vf is one register (AVX and up). */
#ifdef __AVX__
#define IN_REGISTER(v) __asm__("" : "+v"(v))
#else
#define IN_REGISTER(v) (void)(v)
#endif
#define PREFETCH_AHEAD 4096 /* floats (16 KB) ahead in w: the best of 1-64 KB on the AMX Xeon */

/* y[i, j] for i < mr rows of x and j < nr rows of w. Rows j >= nr read w's row 0 (valid memory)
 * and are dropped. pf: where to prefetch from, as many floats per step as the tile reads (NULL:
 * none). */
static inline __attribute__((always_inline)) void tile(
        const float *x, int64_t mr, const float *w, int64_t nr, int64_t k, const float *bias,
        float *y, int64_t n, const float *pf) {
    const float *wr[NR];
    for (int j = 0; j < NR; j++) wr[j] = w + (j < nr ? j : 0) * k;
    vf acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = (vf){0};
    for (int64_t c = 0; c < k; c += LANES) {
        if (pf) {
            for (int l = 0; l < NR * LANES; l += 16) __builtin_prefetch(pf + l, 0, 2);  /* lines */
            pf += NR * LANES;
        }
        vf wv[NR];
        for (int j = 0; j < NR; j++) wv[j] = load(wr[j] + c);
        for (int j = 0; j < NR; j++) IN_REGISTER(wv[j]);
        for (int i = 0; i < MR && i < mr; i++) {
            vf xv = load(x + i * k + c);
            for (int j = 0; j < NR; j++) acc[i][j] += xv * wv[j];
        }
    }
    float sums[MR * NR];
    vf t[MR * NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) t[i * NR + j] = i < mr ? acc[i][j] : (vf){0};
    store(sums, reduce_lanes(t));
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            y[i * n + j] = bias ? sums[i * NR + j] + bias[j] : sums[i * NR + j];
}

/* x [m, k], w [n, k], bias [n] or NULL, y [m, n], all contiguous. Returns -1 (nothing written)
 * unless k is a multiple of 16. */
int tandem_linear(const float *x, const float *w, const float *bias, float *y, int64_t m,
                  int64_t n, int64_t k, int threads) {
    if (k % 16 || m < 0 || n < 0) return -1;  /* 16: the same layers on every CPU */
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

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* clflushopt where the CPU has it (CPUID.7.0:EBX bit 23), whatever the build's target:
 * clflush serializes each line, 50x slower on the AMX Xeon (300 vs 6 ms for 113 MB). */
__attribute__((target("clflushopt"))) static void flush_lines_opt(const char *c,
                                                                   const char *end) {
    for (; c < end; c += 64) __builtin_ia32_clflushopt(c);
    __builtin_ia32_mfence();
}

static int has_clflushopt(void) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b >> 23 & 1);
}
#endif

/* Evicts [p, p + bytes) from every cache level (x86 clflushopt or clflush, Arm dc civac): the
 * start-up timing of layers/matmul_choice.py times a matmul with its weight in memory, as a
 * model larger than the caches streams each weight every step. Returns -1 (nothing done) on
 * other machines. */
int tandem_evict(const void *p, int64_t bytes) {
    const char *c = (const char *)((uintptr_t)p & ~(uintptr_t)63), *end = (const char *)p + bytes;
#if defined(__x86_64__) || defined(__i386__)
    static int opt = -1;
    if (opt < 0) opt = has_clflushopt();
    if (opt) {
        flush_lines_opt(c, end);
        return 0;
    }
    for (; c < end; c += 64) __builtin_ia32_clflush(c);
    __builtin_ia32_mfence();
    return 0;
#elif defined(__aarch64__)
    for (; c < end; c += 64) __asm__ volatile("dc civac, %0" : : "r"(c) : "memory");
    __asm__ volatile("dsb ish" : : : "memory");
    return 0;
#else
    (void)c, (void)end;
    return -1;
#endif
}
