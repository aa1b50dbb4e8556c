/* The float32 multiply-add ceiling of this machine's cores: what a batched (16-row) decode step,
 * bound by arithmetic, is measured against in docs/performance.md. A virtual CPU can run far below
 * its model's datasheet figure (shared physical cores, clock), so it is measured, not assumed.
 *
 * 12 independent accumulator chains per thread (more than FMA latency x ports on any x86 core),
 * each `acc = acc * m + c` one fused multiply-add instruction, 256-bit (AVX2+FMA) or 512-bit
 * (AVX-512F) wide, on 1 and 2 threads; the best of 3 runs.
 *
 *   cc -O2 -fopenmp benchmarks/fma_peak.c -o fma_peak && ./fma_peak 256 [512]
 *
 * `objdump -d fma_peak | grep -c vfmadd` should count 24 (12 per width).
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHAINS 12
#define ITERS 100000000L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Written out, not looped: a loop over a[] left the chains in memory (two vfmadd in the binary
 * and a third of the rate). The empty asm keeps the compiler from folding the chains away. */
#define FMA12(f)                                                                         \
    do {                                                                                 \
        a[0] = f(a[0], m, c), a[1] = f(a[1], m, c), a[2] = f(a[2], m, c);               \
        a[3] = f(a[3], m, c), a[4] = f(a[4], m, c), a[5] = f(a[5], m, c);               \
        a[6] = f(a[6], m, c), a[7] = f(a[7], m, c), a[8] = f(a[8], m, c);               \
        a[9] = f(a[9], m, c), a[10] = f(a[10], m, c), a[11] = f(a[11], m, c);           \
    } while (0)

__attribute__((target("avx2,fma"))) static float chains256(long iters) {
    __m256 a[CHAINS], m = _mm256_set1_ps(1.0000001f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_ps((float)i);
    for (long n = 0; n < iters; n++) {
        FMA12(_mm256_fmadd_ps);
        __asm__ volatile("" : "+x"(a[0]), "+x"(a[1]), "+x"(a[2]), "+x"(a[3]), "+x"(a[4]),
                         "+x"(a[5]), "+x"(a[6]), "+x"(a[7]), "+x"(a[8]), "+x"(a[9]),
                         "+x"(a[10]), "+x"(a[11]));
    }
    float out[8], s = 0;
    for (int i = 1; i < CHAINS; i++) a[0] = _mm256_add_ps(a[0], a[i]);
    _mm256_storeu_ps(out, a[0]);
    for (int i = 0; i < 8; i++) s += out[i];
    return s;
}

__attribute__((target("avx512f"))) static float chains512(long iters) {
    __m512 a[CHAINS], m = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    for (long n = 0; n < iters; n++) {
        FMA12(_mm512_fmadd_ps);
        __asm__ volatile("" : "+v"(a[0]), "+v"(a[1]), "+v"(a[2]), "+v"(a[3]), "+v"(a[4]),
                         "+v"(a[5]), "+v"(a[6]), "+v"(a[7]), "+v"(a[8]), "+v"(a[9]),
                         "+v"(a[10]), "+v"(a[11]));
    }
    for (int i = 1; i < CHAINS; i++) a[0] = _mm512_add_ps(a[0], a[i]);
    return _mm512_reduce_add_ps(a[0]);
}

int main(int argc, char **argv) {
    float sink = 0;
    for (int arg = 1; arg < argc; arg++) {
        int bits = atoi(argv[arg]);
        if (bits != 256 && bits != 512) {
            fprintf(stderr, "fma_peak: widths are 256 or 512, got '%s'\n", argv[arg]);
            return 2;
        }
        for (int threads = 1; threads <= 2; threads++) {
            double best = 1e30;
            for (int run = 0; run < 3; run++) {
                double t0 = now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
                sink += bits == 256 ? chains256(ITERS) : chains512(ITERS);
                double dt = now() - t0;
                best = dt < best ? dt : best;
            }
            double flops = 2.0 * CHAINS * (bits / 32) * (double)ITERS * threads;
            printf("{\"bits\": %d, \"threads\": %d, \"gflops\": %.1f}\n", bits, threads,
                   flops / best / 1e9);
        }
    }
    return sink == 12345.0f;  /* uses the results; never true in practice */
}
