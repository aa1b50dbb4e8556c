/* y [m, n] = x [m, k] @ w [n, k]^T (+ bias [n]): every float32 linear layer on the CPU, at any
 * number of rows: decode, verification, prefill (see tandem/kernels/cpu.py and
 * tandem/layers/matmul_choice.py).
 *
 * Each tile keeps MR rows of x times NR rows of w in registers; w's rows are read from memory
 * once per block of x's rows and reused from L1 by every MR rows of it, and the rows of w a few
 * tiles ahead are prefetched into L2 while this one computes. At a few rows this streams the
 * weights at the memory's speed, where BLAS's small-matrix kernels leave much of the machine idle.
 *
 * Every output is one dot product computed the same way wherever it lands: lane l accumulates
 * x[i] * w[i] for i = l mod LANES in order (fused multiply-add where the CPU has it: this file is
 * built with -ffp-contract=fast, and every tile runs the same inlined code), then the fixed tree
 * of vec.h sums the lanes. So a row's result depends neither on how many rows share the call, nor
 * on the tile shape, the row blocks or the thread count: plain decoding, speculative
 * verification and prefill get the same bits for the same row.
 *
 * Threads: OpenMP over runs of w's rows. The build links OpenMP only when the process's runtime
 * is GNU libgomp (torch's), so these loops run in torch's own thread pool instead of a second one
 * spinning against it (cpu_build.py).
 */
#include <stdint.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

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
/* Holds v in a register from here on. Left to itself, GCC folds each load of w into the
 * multiply-adds that use it, so with AVX2 every row of x reads w again: 10 loads for 8 FMAs
 * instead of 6 (the same bits: only where the operand comes from changes). Only where a vf is
 * one register (AVX and up). */
#ifdef __AVX__
#define IN_REGISTER(v) __asm__("" : "+v"(v))
#else
#define IN_REGISTER(v) (void)(v)
#endif
#define PREFETCH_AHEAD 4096 /* floats (16 KB) ahead in w: far enough to cover memory's latency */
#define X_BLOCK_BYTES (256 * 1024) /* rows of x a thread keeps in L2 across its tiles */

/* LANES floats from p, of which the first n (< LANES) are real and the rest zero. */
static inline __attribute__((always_inline)) vf load_part(const float *p, int64_t n) {
    float a[LANES] = {0};
    memcpy(a, p, (size_t)n * sizeof(float));
    return load(a);
}

/* y[i, j] for i < mr rows of x and j < nr rows of w. Rows j >= nr read w's row 0 (valid memory)
 * and are dropped. pf: where to prefetch from, as many floats per step as the tile reads (NULL:
 * none). A last partial block of k is read zero-padded, so it adds nothing but its own terms. */
static inline __attribute__((always_inline)) void tile(
        const float *x, int64_t mr, const float *w, int64_t nr, int64_t k, const float *bias,
        float *y, int64_t n, const float *pf) {
    const float *wr[NR];
    for (int j = 0; j < NR; j++) wr[j] = w + (j < nr ? j : 0) * k;
    vf acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = (vf){0};
    int64_t c = 0;
    for (; c + LANES <= k; c += LANES) {
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
    if (c < k) {
        vf wv[NR];
        for (int j = 0; j < NR; j++) wv[j] = load_part(wr[j] + c, k - c);
        for (int i = 0; i < MR && i < mr; i++) {
            vf xv = load_part(x + i * k + c, k - c);
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

/* x [m, k], w [n, k], bias [n] or NULL, y [m, n], all contiguous; any sizes. Each thread takes an
 * equal run of w's row tiles and goes over x a block of rows at a time (a block sized to stay
 * in L2 while every tile of the run meets it), so many rows (prefill) do not stream x again
 * for each tile. The blocking changes where a dot product runs, never its order. */
int tandem_linear(const float *x, const float *w, const float *bias, float *y, int64_t m,
                  int64_t n, int64_t k, int threads) {
    if (m < 0 || n < 0 || k <= 0) return -1;
    int64_t blocks = (n + NR - 1) / NR;
    int64_t mb = (X_BLOCK_BYTES / (k * (int64_t)sizeof(float))) / MR * MR;
    mb = mb < MR ? MR : mb;
    /* Below ~256K multiply-adds a second thread costs more to wake than it saves. */
    int parallel = threads > 1 && m * n * k >= (1 << 18);
    int nt = parallel ? threads : 1;
#pragma omp parallel num_threads(nt) if (parallel)
    {
#ifdef _OPENMP
        int64_t id = omp_get_thread_num(), count = omp_get_num_threads();
#else
        int64_t id = 0, count = 1;
#endif
        int64_t b0 = blocks * id / count, b1 = blocks * (id + 1) / count;
        for (int64_t mb0 = 0; mb0 < m; mb0 += mb) {
            int64_t mb1 = mb0 + mb < m ? mb0 + mb : m;
            for (int64_t b = b0; b < b1; b++) {
                int64_t n0 = b * NR, nr = n - n0 < NR ? n - n0 : NR;
                const float *wb = w + n0 * k, *bb = bias ? bias + n0 : NULL;
                for (int64_t m0 = mb0; m0 < mb1; m0 += MR) {
                    /* The first pass over this tile's rows of w pulls the next tiles' into L2. */
                    const float *pf = m0 == mb0 ? wb + PREFETCH_AHEAD : NULL;
                    if (mb1 - m0 >= MR)
                        tile(x + m0 * k, MR, wb, nr, k, bb, y + m0 * n + n0, n, pf);
                    else
                        tile(x + m0 * k, mb1 - m0, wb, nr, k, bb, y + m0 * n + n0, n, pf);
                }
            }
        }
    }
    return 0;
}

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* clflushopt where the CPU has it (CPUID.7.0:EBX bit 23), whatever the build's target:
 * clflush serializes each line. */
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
