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

/* x for the interleaved K-quants (prepare_xk): per 256 elements of a row one record of XK_BYTES:
 * q [256] int8, the 16 pair words (int32) at XK_W, e [8] (int32) at XK_E, D (float) at XK_D.
 * A 256's records for consecutive x rows lie XK_BYTES apart, so a kernel reaches each row's by a
 * constant offset from one pointer (x rows kp apart took a register, or a spill, each); the next
 * 256's lie `cstride` bytes on. */
#define XK_BYTES 384
#define XK_W 256
#define XK_E 320
#define XK_D 352

/* cpu_quant_r16.c: 16 interleaved rows (one group of tandem_q_r16_pack's layout at grp, nr of
 * them real) against mr rows of prepared x: 32-element types (xq, xs, and xi: x's integer sums
 * per 16), K-quant types the records at xk (cstride apart per 256):
 * y [i * ldy + j] (+ bias [j]) for i < mr, j < nr. Only where R16_KERNEL. */
void q_r16(int type, const uint8_t *grp, int nr, const int8_t *xq, const float *xs,
           const int32_t *xi, const uint8_t *xk, int64_t cstride, int64_t mr, int64_t k,
           int64_t kp, int64_t gp, const float *bias, float *y, int64_t ldy);

/* cpu_quant_x.c: one row of x [k] rounded for the kernels: per 32 (q [kp], kp >= k, the tail
 * zero; lane steps xs [kp / 4], step * sum and sum per 16 in xb, xi [GROUPS(kp)]), or for
 * interleaved K-quants per 256 with sub-steps, into its records (k a multiple of 256). */
void prepare_x(const float *x, int64_t k, int64_t kp, int8_t *q, float *xs, float *xb,
               int32_t *xi);
void prepare_xk(const float *x, int64_t k, uint8_t *rec, int64_t cstride);

#endif
