/* The register paths, for cpu_quant.c. cpu_quant_direct.c: a tile of NR weight rows (one type,
 * row_bytes apart from w0) by mr <= 2 MR rows of prepared x (xq, xs, xb), unpacked in
 * registers.
 * out [i * NR + j] gets what tile() gives the same rows, off [i * NR + j] what offsets_dot gives
 * them. Returns -1 where it has no SIMD path. */
#ifndef TANDEM_QUANT_DIRECT_H
#define TANDEM_QUANT_DIRECT_H
#include <stdint.h>

int q_direct(int type, const uint8_t *w0, int64_t row_bytes, int nr, const int8_t *xq,
             const float *xs, const float *xb, int64_t mr, int64_t k, int64_t kp, int64_t gp,
             float *out, float *off);

/* cpu_quant_half.c: the same for F16/BF16 rows against float32 x [mr, k] (any mr, k a multiple
 * of 16); no offsets. Returns -1 for another type or k. */
int q_half(int type, const uint8_t *w0, int64_t row_bytes, int nr, const float *x, int64_t mr,
           int64_t k, float *out);

#endif
