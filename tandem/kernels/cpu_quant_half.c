/* Weight rows in F16 or BF16 (GGUF's half-precision tensors) against float32 x, for cpu_quant.c:
 * the weights stay 2 bytes each, half of float32's traffic, and are widened in registers (exact:
 * every F16 and BF16 value is a float32) right before the multiply-add. x is not rounded here.
 *
 * Each output is one fixed sum: lane l of a vector accumulator takes the elements c + l, c + LANES
 * + l, ... in order (a fused multiply-add each), then one fixed reduction (lanes_sum). Tiles of MR
 * x rows by HALF_ROWS weight rows share each widened weight vector; the same code runs at any
 * number of x rows, so a row never depends on its batch, its tile or the thread count.
 */
#include "quant_format.h"

#define NR HALF_ROWS
#if defined(Q_AVX512)
#define LANES 16
#define MR 4
#elif defined(Q_AVX2)
#define LANES 8
#define MR 2
#else
#define LANES 8
#define MR 1
#endif

#if defined(Q_AVX512)
/* LANES weights of `type` at p, widened to float32. */
static inline __attribute__((always_inline)) __m512 widen(const int type, const uint8_t *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (type == T_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
/* A lane accumulator reduced to one float, in one fixed order. */
static inline float lanes_sum(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    return (q[0] + q[2]) + (q[1] + q[3]);
}
#define VEC __m512
#define VZERO _mm512_setzero_ps
#define VLOADX _mm512_loadu_ps
#define VFMA _mm512_fmadd_ps
#elif defined(Q_AVX2)
static inline __attribute__((always_inline)) __m256 widen(const int type, const uint8_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (type == T_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline float lanes_sum(__m256 v) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    return (q[0] + q[2]) + (q[1] + q[3]);
}
#define VEC __m256
#define VZERO _mm256_setzero_ps
#define VLOADX _mm256_loadu_ps
#define VFMA _mm256_fmadd_ps
#endif

static inline __attribute__((always_inline)) void half_tile(
        const int type, const uint8_t *w0, int64_t row_bytes, int nr, const float *x,
        int64_t mr, int64_t k, float *out /* [MR][NR] */) {
    const uint8_t *rows[NR];
    for (int j = 0; j < NR; j++) rows[j] = w0 + (j < nr ? j : 0) * row_bytes;
#ifdef VEC
    VEC acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = VZERO();
    for (int64_t c = 0; c < k; c += LANES) {
        VEC w[NR];
        for (int j = 0; j < NR; j++) w[j] = widen(type, rows[j] + 2 * c);
        for (int i = 0; i < MR && i < mr; i++) {
            VEC xv = VLOADX(x + i * k + c);
            for (int j = 0; j < NR; j++) acc[i][j] = VFMA(w[j], xv, acc[i][j]);
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
           int64_t k, const float *bias, float *y, int64_t ldy) {
    if (k % 16 || !is_half(type)) return -1;
    for (int64_t i0 = 0; i0 < mr; i0 += MR) {
        const int64_t rows = mr - i0 < MR ? mr - i0 : MR;
        float out[MR * NR];
        if (type == T_F16) half_tile_f16(w0, row_bytes, nr, x + i0 * k, rows, k, out);
        else half_tile_bf16(w0, row_bytes, nr, x + i0 * k, rows, k, out);
        for (int64_t i = 0; i < rows; i++)
            for (int j = 0; j < nr; j++)
                y[(i0 + i) * ldy + j] = bias ? out[i * NR + j] + bias[j] : out[i * NR + j];
    }
    return 0;
}
