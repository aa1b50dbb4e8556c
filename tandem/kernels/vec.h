/* The 16-lane float vector the CPU kernels compute with (cpu_kernels.c, cpu_gemm.c), and the
 * fixed-order reductions that make their results independent of the CPU's vector width. */
#ifndef TANDEM_VEC_H
#define TANDEM_VEC_H
#include <stdint.h>
#include <string.h>

#define LANES 16

/* 16 floats as one value (GCC vector extension): the compiler maps it to whatever registers the
 * CPU has (one AVX-512 register, two AVX2 ones, ...), with the same lane arithmetic on each. */
typedef float vf __attribute__((vector_size(4 * LANES)));
typedef int32_t vi __attribute__((vector_size(4 * LANES)));

static inline __attribute__((always_inline)) vf load(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline __attribute__((always_inline)) void store(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline __attribute__((always_inline)) vf splat(float x) { return (vf){0} + x; }
static inline __attribute__((always_inline)) vf vselect(vi mask, vf a, vf b) { return (vf)((mask & (vi)a) | (~mask & (vi)b)); }

/* The 16 lanes summed pairwise, in registers: lane l + lane l + 8, then + 4, + 2, + 1. hsum8
 * is that sum from its second step, for code that keeps the two 8-lane halves apart. */
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));
static inline __attribute__((always_inline)) float hsum8(vf8 a) {
    vf4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}
static inline __attribute__((always_inline)) float hsum(vf v) {
    return hsum8(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7)
                 + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
}

/* Sixteen dot products at once: lane k of the result is the sum of t[k]'s lanes (t[k] holds the
 * 16 partial sums of dot product k), reduced by a fixed tree of shuffles with hsum's pairing, so
 * each result depends on its own partials only, never on its neighbours or on which of the 16
 * slots it took: reduce16 and hsum give the same bits. */
#define SH(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
static inline __attribute__((always_inline)) vf reduce16(vf *t) {
    vf u[8], w[4], x[2];
    for (int i = 0; i < 8; i++)
        u[i] = SH(t[2 * i], t[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
             + SH(t[2 * i], t[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15,
                  24, 25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; i++)
        w[i] = SH(u[2 * i], u[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27)
             + SH(u[2 * i], u[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15,
                  20, 21, 22, 23, 28, 29, 30, 31);
    for (int i = 0; i < 2; i++)
        x[i] = SH(w[2 * i], w[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29)
             + SH(w[2 * i], w[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15,
                  18, 19, 22, 23, 26, 27, 30, 31);
    return SH(x[0], x[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
         + SH(x[0], x[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

#endif
