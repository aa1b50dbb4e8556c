/* The functions the CPU kernel library exports (loaded through ctypes by tandem/kernels/cpu.py,
 * whose cpu_build.SIGNATURES mirror these), declared once so every file that defines or calls
 * one is checked against the same signature. */
#ifndef TANDEM_KERNELS_H
#define TANDEM_KERNELS_H
#include <stdint.h>

/* cpu_kernels.c */
void tandem_add_rms_norm(const float *x, const float *delta, float *sum_out, float *normed,
                         const float *w, int64_t rows, int64_t dim, float eps, int unit_offset);
void tandem_silu_and_mul(const float *gu, float *out, int64_t rows, int64_t inter);
void tandem_gelu_tanh_and_mul(const float *gu, float *out, int64_t rows, int64_t inter);
int tandem_rope_write_kv(float *qkv, int64_t t_count, int64_t h, int64_t hkv, int64_t d,
                         const float *cos, const float *sin, const int64_t *slots,
                         void *k_cache, void *v_cache, const float *q_norm_w,
                         const float *k_norm_w, float eps, int unit_offset, int kv_type);
int tandem_kv_rows(int kv_type, const float *rows, int64_t n, int64_t d, void *stored,
                   float *loaded);
void tandem_row_sum(const float *x, int64_t rows, int64_t n, float *out, int threads);

/* cpu_attention.c */
int tandem_paged_attention(const float *q, int64_t q_stride, const void *k_cache,
                           const void *v_cache, float *out, const int64_t *req,
                           const int64_t *kv_slots, int64_t num_reqs, int64_t lmax, int64_t h,
                           int64_t hkv, int64_t d, float scale, int64_t window, float softcap,
                           int kv_type, int threads);

/* cpu_gemm.c */
int tandem_linear(const float *x, const float *w, const float *bias, float *y, int64_t m,
                  int64_t n, int64_t k, int threads);
int tandem_evict(const void *p, int64_t bytes);

/* cpu_decoder.c */
int tandem_llama_stack(const float *x, float *out, int64_t t, const int64_t *dims,
                       int64_t layers, const int64_t *table, const float *final_norm,
                       float eps, float qk_eps, int qk_unit_offset, const float *cos,
                       const float *sin, const int64_t *slots, const int64_t *requests,
                       const int64_t *kv_slots, int64_t groups, int64_t lmax, float scale,
                       int threads);

/* cpu_decoder_gemma.c */
int tandem_gemma_stack(const float *x, float *out, int64_t t, const int64_t *dims,
                       int64_t layers, const int64_t *table, const int64_t *kinds,
                       const float *final_norm, float eps, float qk_eps,
                       const float *cos_local, const float *sin_local, const float *cos_global,
                       const float *sin_global, const int64_t *slots, const int64_t *requests,
                       const int64_t *kv_slots, int64_t groups, int64_t lmax, float scale,
                       int threads);

/* cpu_quant.c */
int64_t tandem_q_block(int type);
int64_t tandem_q_block_bytes(int type);
int tandem_qlinear(const float *x, const int64_t *desc, const float *bias, float *y, int64_t m,
                   int64_t n, int64_t k, int threads);

/* cpu_quant_pack.c */
int tandem_q_rows(int type, const uint8_t *data, int64_t row_bytes, const int64_t *ids,
                  int64_t count, int64_t k, float *out);
int64_t tandem_q_r16_bytes(int type, int64_t k);
int tandem_q_r16_pack(int type, const uint8_t *src, int64_t rows, int64_t row_bytes, int64_t k,
                      uint8_t *dst);

/* cpu_quantize.c */
int tandem_quantize(const float *x, int64_t rows, int64_t k, int type, uint8_t *out, int threads);

/* cpu_gumbel.c */
void tandem_argmax(const float *scores, int64_t rows, int64_t vocab, int64_t *out, int threads);
void tandem_gumbel_candidates(const float *probs, int64_t rows, int64_t vocab,
                              const int64_t *keys, const int64_t *ids, int64_t *start,
                              int64_t *cols);
void tandem_gumbel_argmax_sparse(const float *scores, const int64_t *start, const int64_t *ids,
                                 const int64_t *cols, int64_t rows, const int64_t *keys,
                                 int64_t *out, int threads);

#endif
