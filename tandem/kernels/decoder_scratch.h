/* What the fused decoder stacks (cpu_decoder.c, cpu_decoder_gemma.c) share: one linear layer on
 * float32 weights or a quantized-weight descriptor, and the step's scratch buffers. */
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

#endif
