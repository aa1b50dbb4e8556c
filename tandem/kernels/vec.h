/* The float vector the CPU kernels compute with (cpu_kernels.c, cpu_attention.c, cpu_gemm.c and
 * the others), and the fixed-order reductions that make a row's result independent of its batch.
 *
 * LANES is the CPU's own width: 16 floats with AVX-512, 8 elsewhere (AVX2, and NEON's register
 * pairs). Wider GCC vectors than the hardware's are lowered through the stack and general
 * registers, several times slower. A sum over lanes therefore pairs its terms by the machine's
 * width, and bits differ between CPU kinds; on one machine they never depend on the batch, the
 * tile or the thread count. */
#ifndef TANDEM_VEC_H
#define TANDEM_VEC_H
#include <stdint.h>
#include <string.h>

#ifdef __AVX512F__
#define LANES 16
#else
#define LANES 8
#endif

/* LANES floats as one value (GCC vector extension), one register of the CPU. */
typedef float vf __attribute__((vector_size(4 * LANES)));
typedef int32_t vi __attribute__((vector_size(4 * LANES)));

static inline __attribute__((always_inline)) vf load(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline __attribute__((always_inline)) void store(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline __attribute__((always_inline)) vf splat(float x) { return (vf){0} + x; }
static inline __attribute__((always_inline)) vf vselect(vi mask, vf a, vf b) { return (vf)((mask & (vi)a) | (~mask & (vi)b)); }

/* The lanes summed pairwise, in registers: lane l + lane l + LANES / 2, then + 4, + 2, + 1. */
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));
static inline __attribute__((always_inline)) float hsum8(vf8 a) {
    vf4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}
#define SH(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)

#if LANES == 16
static inline __attribute__((always_inline)) float hsum(vf v) {
    return hsum8(SH(v, v, 0, 1, 2, 3, 4, 5, 6, 7) + SH(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
}
static inline __attribute__((always_inline)) vf iota(void) {
    return (vf){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
}

/* LANES dot products at once: lane k of the result is the sum of t[k]'s lanes (t[k] holds the
 * partial sums of dot product k), reduced by a fixed tree of shuffles with hsum's pairing, so
 * each result depends on its own partials only, never on its neighbours or on which slot it
 * took: reduce_lanes and hsum give the same bits. Compiled for floats and for int32 lanes
 * (reduce_lanes_i: attention_q8.h's exact integer sums). */
#define REDUCE_LANES(NAME, T)                                                                  \
    static inline __attribute__((always_inline)) T NAME(T *t) {                                \
        T u[8], w[4], x[2];                                                                    \
        for (int i = 0; i < 8; i++)                                                            \
            u[i] = SH(t[2 * i], t[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21,  \
                      22, 23)                                                                  \
                 + SH(t[2 * i], t[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15,                    \
                      24, 25, 26, 27, 28, 29, 30, 31);                                         \
        for (int i = 0; i < 4; i++)                                                            \
            w[i] = SH(u[2 * i], u[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24,    \
                      25, 26, 27)                                                              \
                 + SH(u[2 * i], u[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15,                      \
                      20, 21, 22, 23, 28, 29, 30, 31);                                         \
        for (int i = 0; i < 2; i++)                                                            \
            x[i] = SH(w[2 * i], w[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24,    \
                      25, 28, 29)                                                              \
                 + SH(w[2 * i], w[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15,                      \
                      18, 19, 22, 23, 26, 27, 30, 31);                                         \
        return SH(x[0], x[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)        \
             + SH(x[0], x[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);       \
    }

/* Index lists of transpose's stages: lanes of (a, b) that swap bit S between row and lane. */
#define T_LO1 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30
#define T_HI1 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31
#define T_LO2 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define T_HI2 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define T_LO4 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define T_HI4 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define T_LO8 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define T_HI8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define T_LAST_STAGE T_STAGE(8)
#else
static inline __attribute__((always_inline)) float hsum(vf v) { return hsum8(v); }
static inline __attribute__((always_inline)) vf iota(void) { return (vf){0, 1, 2, 3, 4, 5, 6, 7}; }

/* As above for 8 lanes: the same pairing as hsum8. */
#define REDUCE_LANES(NAME, T)                                                                  \
    static inline __attribute__((always_inline)) T NAME(T *t) {                                \
        T u[4], w[2];                                                                          \
        for (int i = 0; i < 4; i++)                                                            \
            u[i] = SH(t[2 * i], t[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11)                        \
                 + SH(t[2 * i], t[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);                     \
        for (int i = 0; i < 2; i++)                                                            \
            w[i] = SH(u[2 * i], u[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13)                        \
                 + SH(u[2 * i], u[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15);                     \
        return SH(w[0], w[1], 0, 2, 4, 6, 8, 10, 12, 14)                                       \
             + SH(w[0], w[1], 1, 3, 5, 7, 9, 11, 13, 15);                                      \
    }

#define T_LO1 0, 8, 2, 10, 4, 12, 6, 14
#define T_HI1 1, 9, 3, 11, 5, 13, 7, 15
#define T_LO2 0, 1, 8, 9, 4, 5, 12, 13
#define T_HI2 2, 3, 10, 11, 6, 7, 14, 15
#define T_LO4 0, 1, 2, 3, 8, 9, 10, 11
#define T_HI4 4, 5, 6, 7, 12, 13, 14, 15
#define T_LAST_STAGE
#endif
REDUCE_LANES(reduce_lanes, vf)
REDUCE_LANES(reduce_lanes_i, vi)
#undef REDUCE_LANES

/* The LANES x LANES block m transposed in registers (lane x of m[k] to lane k of m[x]): one
 * stage per bit of the index, each swapping that bit between the row and the lane. For floats
 * (attention_wide16.h's keys) and int32 lanes (attention_q8.h's). */
#define T_STAGE(S)                                                                             \
    for (int r = 0; r < LANES; r++)                                                            \
        if (!(r & S)) {                                                                        \
            const __typeof__(m[0]) lo = SH(m[r], m[r | S], T_LO##S);                           \
            const __typeof__(m[0]) hi = SH(m[r], m[r | S], T_HI##S);                           \
            m[r] = lo, m[r | S] = hi;                                                          \
        }
static inline __attribute__((always_inline)) void transpose(vf *m) {
    T_STAGE(1) T_STAGE(2) T_STAGE(4) T_LAST_STAGE
}
static inline __attribute__((always_inline)) void transpose_i(vi *m) {
    T_STAGE(1) T_STAGE(2) T_STAGE(4) T_LAST_STAGE
}

#endif
