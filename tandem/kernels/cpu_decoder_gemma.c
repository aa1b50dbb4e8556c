/* The whole Gemma 3 decoder stack of a step (decode, verification, prefill) in one call (see
 * tandem/models/gemma3_fused.py): the kernels of the layer-by-layer Python path, in its order,
 * on its buffers' shapes, so the result is bit-identical to it. A layer is
 *   x = x + post_attention_norm(attention(input_norm(x)))
 *   x = x + post_feedforward_norm(mlp(pre_feedforward_norm(x)))
 * with every norm scaling by (1 + w). Each residual add is done by the add+norm kernel of the
 * norm after it (the same float additions: a + b has the same bits in either order). A long step
 * runs in sub-batches (decoder_scratch.h's UBATCH).
 */
#include <stdint.h>
#include <stdlib.h>

#include "decoder_scratch.h"

/* Addresses per layer in `table` ([layers, LAYER_PTRS] int64), NULL (0) where absent. */
enum { IN_NORM, POST_ATTN_NORM, PRE_FF_NORM, POST_FF_NORM, QKV_W, QKV_B, O_W, GATE_UP_W,
       DOWN_W, Q_NORM, K_NORM, K_CACHE, V_CACHE, LAYER_PTRS };

#define P(l, i) ((float *)(intptr_t)table[(l) * LAYER_PTRS + (i)])

/* The stack on the rows of one sub-batch (tandem_gemma_stack's arguments, cut to them). */
static int gemma_rows(const float *x, float *out, int64_t t, const int64_t *dims, int64_t layers,
                      const int64_t *table, const int64_t *kinds, const float *final_norm,
                      float eps, float qk_eps, const float *cos_local, const float *sin_local,
                      const float *cos_global, const float *sin_global, const int64_t *slots,
                      const int64_t *requests, const int64_t *kv_slots, int64_t groups,
                      int64_t lmax, float scale, int threads) {
    int64_t hidden = dims[0], inter = dims[1], h = dims[2], hkv = dims[3], d = dims[4];
    int q = (int)dims[5], kv = (int)dims[6];
    int64_t qkv_n = (h + 2 * hkv) * d;
    stack_scratch sc;
    if (stack_scratch_alloc(&sc, t, hidden, qkv_n, h * d, inter)) return -1;
    float *stream = sc.stream, *normed = sc.normed, *qkv = sc.qkv, *attn = sc.attn, *gu = sc.gu;
    float *act = sc.act;
    float *block = out; /* each sublayer's normed output waits in `out` for the stream's add */
    int rc = 0;
    for (int64_t l = 0; l < layers && rc == 0; l++) {
        int64_t window = kinds[2 * l];
        int local = kinds[2 * l + 1] != 0;
        if (l == 0)  /* the stream starts as a copy of x */
            stack_norm(x, NULL, stream, normed, P(l, IN_NORM), t, hidden, eps, 1, threads);
        else
            stack_norm(stream, block, stream, normed, P(l, IN_NORM), t, hidden, eps, 1, threads);
        rc |= stack_matmul(q, normed, P(l, QKV_W), P(l, QKV_B), qkv, t, qkv_n, hidden, threads);
        rc |= stack_rope(qkv, t, h, hkv, d, local ? cos_local : cos_global,
                         local ? sin_local : sin_global, slots, P(l, K_CACHE), P(l, V_CACHE),
                         P(l, Q_NORM), P(l, K_NORM), qk_eps, 1, kv, threads);
        rc |= tandem_paged_attention(qkv, qkv_n, P(l, K_CACHE), P(l, V_CACHE), attn, requests,
                                     kv_slots, groups, lmax, h, hkv, d, scale, window, 0.0f, kv,
                                     threads);
        rc |= stack_matmul(q, attn, P(l, O_W), NULL, block, t, hidden, h * d, threads);
        /* normed in place (the kernel reads a row whole before writing it), then added to the
         * stream by the next norm's kernel */
        stack_norm(block, NULL, NULL, block, P(l, POST_ATTN_NORM), t, hidden, eps, 1, threads);
        stack_norm(stream, block, stream, normed, P(l, PRE_FF_NORM), t, hidden, eps, 1, threads);
        rc |= stack_matmul(q, normed, P(l, GATE_UP_W), NULL, gu, t, 2 * inter, hidden, threads);
        stack_act(1, gu, act, t, inter, threads);
        rc |= stack_matmul(q, act, P(l, DOWN_W), NULL, block, t, hidden, inter, threads);
        stack_norm(block, NULL, NULL, block, P(l, POST_FF_NORM), t, hidden, eps, 1, threads);
    }
    if (rc == 0)
        stack_norm(stream, block, stream, out, final_norm, t, hidden, eps, 1, threads);
    free(sc.buf);
    return rc ? -1 : 0;
}

/* x [t, hidden]: the embeddings (read only); out [t, hidden]: the final norm's output.
 * dims: hidden, intermediate, heads, kv heads, head size, 1 where the four weights of every
 * layer are quantized-weight descriptors (cpu_quant.c) instead of float32, and the KV caches'
 * row format (kv_format.h).
 * kinds [layers, 2]: each layer's sliding window (0: every key) and rope (1: the local tables
 * cos_local/sin_local, 0: the global ones; each [t, d]). q/k norms: in the table, or NULL for
 * none. slots [t]; requests [g, 3] and kv_slots [g, lmax]: every request of the step
 * (cpu_attention.c). Returns 0, or -1 (out unspecified) when a kernel refuses its sizes or memory
 * runs out. */
int tandem_gemma_stack(const float *x, float *out, int64_t t, const int64_t *dims,
                       int64_t layers, const int64_t *table, const int64_t *kinds,
                       const float *final_norm, float eps, float qk_eps,
                       const float *cos_local, const float *sin_local, const float *cos_global,
                       const float *sin_global, const int64_t *slots, const int64_t *requests,
                       const int64_t *kv_slots, int64_t groups, int64_t lmax, float scale,
                       int threads) {
    const int64_t hidden = dims[0], d = dims[4];
    STACK_UBATCHES(t, requests, groups,
                   gemma_rows(x + r0 * hidden, out + r0 * hidden, tb, dims, layers, table, kinds,
                              final_norm, eps, qk_eps, cos_local + r0 * d, sin_local + r0 * d,
                              cos_global + r0 * d, sin_global + r0 * d, slots + r0, sub,
                              kv_slots, groups, lmax, scale, threads));
}
