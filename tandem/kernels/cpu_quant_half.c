/* Weight rows in F16 or BF16 (GGUF's half-precision tensors) against float32 x, for cpu_quant.c:
 * the weights stay 2 bytes each, half of float32's traffic, and are widened in registers (exact:
 * every F16 and BF16 value is a float32) right before the multiply-add. x is not rounded here.
 *
 * Each output is one fixed sum: lane l of a vector accumulator takes the elements c + l, c + LANES
 * + l, ... in order (a fused multiply-add each), then lanes_sum. The same code runs at any number
 * of x rows, so a row never depends on its batch, its tile or the thread count.
 */
#include "quant_direct.h"
#include "quant_format.h"

#if STEP == 64
#define LANES 16
#define HALF_SIMD 1
#elif STEP == 32 && defined(__AVX2__) && defined(__F16C__)
#define LANES 8
#define HALF_SIMD 1
#else
#define LANES 8
#define HALF_SIMD 0
#endif

#if HALF_SIMD
/* LANES weights of `type` at p, widened to float32. */
static inline __attribute__((always_inline))
#if LANES == 16
__m512 widen(const int type, const uint8_t *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (type == T_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#else
__m256 widen(const int type, const uint8_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (type == T_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#endif
}
#endif

static inline __attribute__((always_inline)) void half_tile(
        const int type, const uint8_t *w0, int64_t row_bytes, int nr, const float *x,
        int64_t mr, int64_t k, float *out) {
    const uint8_t *rows[NR];
    for (int j = 0; j < NR; j++) rows[j] = w0 + (j < nr ? j : 0) * row_bytes;
#if HALF_SIMD
#if LANES == 16
    __m512 acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = _mm512_setzero_ps();
#else
    __m256 acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = _mm256_setzero_ps();
#endif
    for (int64_t c = 0; c < k; c += LANES) {
#if LANES == 16
        __m512 w[NR];
#else
        __m256 w[NR];
#endif
        for (int j = 0; j < NR; j++) w[j] = widen(type, rows[j] + 2 * c);
        for (int i = 0; i < MR && i < mr; i++) {
#if LANES == 16
            __m512 xv = _mm512_loadu_ps(x + i * k + c);
            for (int j = 0; j < NR; j++) acc[i][j] = _mm512_fmadd_ps(w[j], xv, acc[i][j]);
#else
            __m256 xv = _mm256_loadu_ps(x + i * k + c);
            for (int j = 0; j < NR; j++) acc[i][j] = _mm256_fmadd_ps(w[j], xv, acc[i][j]);
#endif
        }
    }
    for (int i = 0; i < MR && i < mr; i++)
        for (int j = 0; j < NR; j++) out[i * NR + j] = lanes_sum(acc[i][j]);
#else
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float lanes[LANES] = {0};
            for (int64_t c = 0; c < k; c += LANES)
                for (int l = 0; l < LANES; l++)
                    lanes[l] += half_at(type, rows[j] + 2 * (c + l)) * x[i * k + c + l];
            out[i * NR + j] = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
                            + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
        }
#endif
}

static void half_tile_f16(const uint8_t *w0, int64_t rb, int nr, const float *x, int64_t mr,
                          int64_t k, float *out) {
    half_tile(T_F16, w0, rb, nr, x, mr, k, out);
}

static void half_tile_bf16(const uint8_t *w0, int64_t rb, int nr, const float *x, int64_t mr,
                           int64_t k, float *out) {
    half_tile(T_BF16, w0, rb, nr, x, mr, k, out);
}

int q_half(int type, const uint8_t *w0, int64_t row_bytes, int nr, const float *x, int64_t mr,
           int64_t k, float *out) {
    if (k % 16 || !is_half(type)) return -1;
    for (int64_t i0 = 0; i0 < mr; i0 += MR) {  /* the caller's tile may be taller than MR */
        int64_t rows = mr - i0 < MR ? mr - i0 : MR;
        if (type == T_F16) half_tile_f16(w0, row_bytes, nr, x + i0 * k, rows, k, out + i0 * NR);
        else half_tile_bf16(w0, row_bytes, nr, x + i0 * k, rows, k, out + i0 * NR);
    }
    return 0;
}
