/* What the fused decoder stacks (cpu_decoder.c, cpu_decoder_gemma.c) share: one linear layer on
 * float32 weights or a quantized-weight descriptor, the row-wise kernels split over the threads,
 * the step's scratch buffers, and its sub-batches. */
#ifndef TANDEM_DECODER_SCRATCH_H
#define TANDEM_DECODER_SCRATCH_H
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"

/* One linear layer: w is float32 [n, k], or with `quantized` the descriptor of cpu_quant.c. */
static inline int stack_matmul(int quantized, const float *x, const float *w, const float *bias,
                               float *y, int64_t m, int64_t n, int64_t k, int threads) {
    if (quantized)
        return tandem_qlinear(x, (const int64_t *)w, bias, y, m, n, k, threads);
    return tandem_linear(x, w, bias, y, m, n, k, threads);
}

/* The row-wise kernels between the matmuls (norms, activations, rotary + KV write), split by
 * rows over the threads where a step has ROWWISE_MIN numbers or more: a verification's rows or
 * a prompt's; a decode's single row stays on one thread, since waking the other costs more than
 * its half of the row. Every kernel computes a row alone, so the split changes no bits. */
#define ROWWISE_MIN 16384

static inline int rowwise_threads(int64_t t, int64_t numbers, int threads) {
    if (threads <= 1 || numbers < ROWWISE_MIN) return 1;
    return t < threads ? (int)t : threads;
}

/* tandem_add_rms_norm (kernels.h) on t rows of dim, split by rows. */
static inline void stack_norm(const float *x, const float *delta, float *sum_out, float *normed,
                              const float *w, int64_t t, int64_t dim, float eps, int unit_offset,
                              int threads) {
    const int nt = rowwise_threads(t, t * dim, threads);
    if (nt == 1) {  /* one thread: no parallel region to enter */
        tandem_add_rms_norm(x, delta, sum_out, normed, w, t, dim, eps, unit_offset);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int p = 0; p < nt; p++) {
        const int64_t a = t * p / nt, n = t * (p + 1) / nt - a;
        tandem_add_rms_norm(x + a * dim, delta ? delta + a * dim : NULL,
                            sum_out ? sum_out + a * dim : NULL, normed + a * dim, w, n, dim, eps,
                            unit_offset);
    }
}

/* silu (gelu 0) or gelu-tanh (gelu 1) and mul (kernels.h) on t rows, split by rows. */
static inline void stack_act(int gelu, const float *gu, float *act, int64_t t, int64_t inter,
                             int threads) {
    const int nt = rowwise_threads(t, t * inter, threads);
    if (nt == 1) {
        if (gelu) tandem_gelu_tanh_and_mul(gu, act, t, inter);
        else tandem_silu_and_mul(gu, act, t, inter);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int p = 0; p < nt; p++) {
        const int64_t a = t * p / nt, n = t * (p + 1) / nt - a;
        if (gelu) tandem_gelu_tanh_and_mul(gu + a * 2 * inter, act + a * inter, n, inter);
        else tandem_silu_and_mul(gu + a * 2 * inter, act + a * inter, n, inter);
    }
}

/* tandem_rope_write_kv (kernels.h) on t rows, split by rows (each writes its own cache slots).
 * Returns 0 or -1, as the kernel. */
static inline int stack_rope(float *qkv, int64_t t, int64_t h, int64_t hkv, int64_t d,
                             const float *cos, const float *sin, const int64_t *slots,
                             void *k_cache, void *v_cache, const float *q_norm_w,
                             const float *k_norm_w, float eps, int unit_offset, int kv_type,
                             int threads) {
    const int64_t row = (h + 2 * hkv) * d;
    const int nt = rowwise_threads(t, t * row, threads);
    if (nt == 1)
        return tandem_rope_write_kv(qkv, t, h, hkv, d, cos, sin, slots, k_cache, v_cache,
                                    q_norm_w, k_norm_w, eps, unit_offset, kv_type);
    int rc = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(| : rc)
    for (int p = 0; p < nt; p++) {
        const int64_t a = t * p / nt, n = t * (p + 1) / nt - a;
        rc |= tandem_rope_write_kv(qkv + a * row, n, h, hkv, d, cos + a * d, sin + a * d,
                                   slots + a, k_cache, v_cache, q_norm_w, k_norm_w, eps,
                                   unit_offset, kv_type);
    }
    return rc;
}

/* Per row of the step: the residual stream and a normed copy [hidden], qkv [qkv_n], the
 * attention output [attn_n], gate/up [2 inter] and the activation [inter]; buf owns them all. */
typedef struct {
    float *buf, *stream, *normed, *qkv, *attn, *gu, *act;
} stack_scratch;

/* 0, or -1 where memory runs out (then nothing is allocated). */
static inline int stack_scratch_alloc(stack_scratch *s, int64_t t, int64_t hidden, int64_t qkv_n,
                                      int64_t attn_n, int64_t inter) {
    size_t per_row = (size_t)(2 * hidden + qkv_n + attn_n + 3 * inter);
    s->buf = malloc(sizeof(float) * per_row * (size_t)(t > 0 ? t : 1));
    if (!s->buf) return -1;
    s->stream = s->buf, s->normed = s->stream + t * hidden, s->qkv = s->normed + t * hidden;
    s->attn = s->qkv + t * qkv_n, s->gu = s->attn + t * attn_n, s->act = s->gu + t * 2 * inter;
    return 0;
}

/* A step of 2 * UBATCH rows or more (a long prompt's chunk) runs in sub-batches of about UBATCH
 * rows, each through every layer before the next, as a prefill in chunks of that size would: a
 * sub-batch's activations (75 MB for 512 rows of a 1.7B Llama, against 600 MB for 4,096) stay
 * nearer the caches, and the matmuls' prepared rows of x within the L2 (llama.cpp's ubatch is
 * 512 too). Every kernel computes a row the same way in any batch, so a row has the same bits
 * split or not. A sub-batch's queries attend to the keys the earlier ones wrote, in every layer;
 * no request reads keys another writes in the same step (a block enters the prefix cache only
 * after its step), so the order between requests does not matter. */
#define UBATCH 512

static inline int64_t ubatch_count(int64_t t) { return t < 2 * UBATCH ? 1 : t / UBATCH; }

/* Sub-batch u of n of a step of t rows: its rows [*r0, *r1), and sub [g, 3] the step's requests
 * table req ([g, 3]: first row, rows, keys; cpu_attention.c) cut to them: a request's rows there
 * (none: 0 rows and 0 keys), counted from *r0, with its keys up to its last row there. */
static inline void ubatch_cut(const int64_t *req, int64_t g, int64_t t, int64_t n, int64_t u,
                              int64_t *sub, int64_t *r0, int64_t *r1) {
    *r0 = t * u / n, *r1 = t * (u + 1) / n;
    for (int64_t r = 0; r < g; r++) {
        const int64_t a = req[3 * r], b = a + req[3 * r + 1];
        const int64_t lo = a > *r0 ? a : *r0, hi = b < *r1 ? b : *r1;
        sub[3 * r] = hi > lo ? lo - *r0 : 0;
        sub[3 * r + 1] = hi > lo ? hi - lo : 0;
        sub[3 * r + 2] = hi > lo ? req[3 * r + 2] - (b - hi) : 0;
    }
}

/* Runs CALL (an expression of r0, the sub-batch's first row, tb, its rows, and sub, its
 * requests table) once per sub-batch of a step of T rows with requests REQ [G, 3], in order,
 * and returns 0 or the first -1. */
#define STACK_UBATCHES(T, REQ, G, CALL)                                                        \
    do {                                                                                       \
        const int64_t n_ = ubatch_count(T);                                                    \
        int64_t *cut_ = n_ > 1 ? malloc(sizeof(int64_t) * 3 * (size_t)((G) > 0 ? (G) : 1))     \
                               : NULL;                                                         \
        if (n_ > 1 && !cut_) return -1;                                                        \
        int rc_ = 0;                                                                           \
        for (int64_t u_ = 0; u_ < n_ && rc_ == 0; u_++) {                                      \
            int64_t r0 = 0, r1_ = (T);                                                         \
            if (n_ > 1) ubatch_cut((REQ), (G), (T), n_, u_, cut_, &r0, &r1_);                  \
            const int64_t tb = r1_ - r0;                                                       \
            const int64_t *sub = n_ > 1 ? cut_ : (REQ);                                        \
            rc_ = (CALL);                                                                      \
        }                                                                                      \
        free(cut_);                                                                            \
        return rc_;                                                                            \
    } while (0)

#endif
