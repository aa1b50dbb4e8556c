/* The whole Llama-family decoder stack of a step (decode, verification, prefill) in one call (see
 * tandem/models/llama_fused.py): the same kernels, in the same order, on the same buffers' shapes
 * as the layer-by-layer Python path, so the result is bit-identical to it, without its ~100
 * Python-level calls per layer. A long step runs in sub-batches (decoder_scratch.h's UBATCH).
 */
#include <stdint.h>
#include <stdlib.h>

#include "decoder_scratch.h"

/* Addresses per layer in `table` ([layers, LAYER_PTRS] int64), NULL (0) where absent. */
enum { IN_NORM, POST_NORM, QKV_W, QKV_B, O_W, GATE_UP_W, DOWN_W, Q_NORM, K_NORM, K_CACHE,
       V_CACHE, LAYER_PTRS };

#define P(l, i) ((float *)(intptr_t)table[(l) * LAYER_PTRS + (i)])

/* The stack on the rows of one sub-batch (tandem_llama_stack's arguments, cut to them). */
static int llama_rows(const float *x, float *out, int64_t t, const int64_t *dims, int64_t layers,
                      const int64_t *table, const float *final_norm, float eps, float qk_eps,
                      int qk_unit_offset, const float *cos, const float *sin,
                      const int64_t *slots, const int64_t *requests, const int64_t *kv_slots,
                      int64_t groups, int64_t lmax, float scale, int threads) {
    int64_t hidden = dims[0], inter = dims[1], h = dims[2], hkv = dims[3], d = dims[4];
    int q = (int)dims[5], kv = (int)dims[6];
    int64_t qkv_n = (h + 2 * hkv) * d;
    stack_scratch sc;
    if (stack_scratch_alloc(&sc, t, hidden, qkv_n, h * d, inter)) return -1;
    float *stream = sc.stream, *normed = sc.normed, *qkv = sc.qkv, *attn = sc.attn, *gu = sc.gu;
    float *act = sc.act;
    float *mlp = out; /* each layer's MLP output waits in `out` for the next layer's add */
    int rc = 0;
    for (int64_t l = 0; l < layers && rc == 0; l++) {
        if (l == 0)
            stack_norm(x, NULL, stream, normed, P(l, IN_NORM), t, hidden, eps, 0, threads);
        else
            stack_norm(stream, mlp, stream, normed, P(l, IN_NORM), t, hidden, eps, 0, threads);
        rc |= stack_matmul(q, normed, P(l, QKV_W), P(l, QKV_B), qkv, t, qkv_n, hidden, threads);
        rc |= stack_rope(qkv, t, h, hkv, d, cos, sin, slots, P(l, K_CACHE), P(l, V_CACHE),
                         P(l, Q_NORM), P(l, K_NORM), qk_eps, qk_unit_offset, kv, threads);
        rc |= tandem_paged_attention(qkv, qkv_n, P(l, K_CACHE), P(l, V_CACHE), attn, requests,
                                     kv_slots, groups, lmax, h, hkv, d, scale, 0, 0.0f, kv,
                                     threads);
        rc |= stack_matmul(q, attn, P(l, O_W), NULL, normed, t, hidden, h * d, threads);
        /* normed holds the attention block's output; the stream absorbs it, normed gets the
         * norm (the kernel reads each row before writing it). */
        stack_norm(stream, normed, stream, normed, P(l, POST_NORM), t, hidden, eps, 0, threads);
        rc |= stack_matmul(q, normed, P(l, GATE_UP_W), NULL, gu, t, 2 * inter, hidden, threads);
        stack_act(0, gu, act, t, inter, threads);
        rc |= stack_matmul(q, act, P(l, DOWN_W), NULL, mlp, t, hidden, inter, threads);
    }
    if (rc == 0)
        stack_norm(stream, mlp, stream, out, final_norm, t, hidden, eps, 0, threads);
    free(sc.buf);
    return rc ? -1 : 0;
}

/* x [t, hidden]: the embeddings (read only); out [t, hidden]: the final norm's output.
 * dims: hidden, intermediate, heads, kv heads, head size, 1 where the four weights of every
 * layer are quantized-weight descriptors (cpu_quant.c) instead of float32, and the KV caches'
 * row format (kv_format.h). cos, sin: [t, d];
 * slots [t]; requests [g, 3] and kv_slots [g, lmax]: every request of the step (cpu_attention.c).
 * Returns 0, or -1 (out unspecified) when a kernel refuses its sizes or memory runs out. */
int tandem_llama_stack(const float *x, float *out, int64_t t, const int64_t *dims,
                       int64_t layers, const int64_t *table, const float *final_norm,
                       float eps, float qk_eps, int qk_unit_offset, const float *cos,
                       const float *sin, const int64_t *slots, const int64_t *requests,
                       const int64_t *kv_slots, int64_t groups, int64_t lmax, float scale,
                       int threads) {
    const int64_t hidden = dims[0], d = dims[4];
    STACK_UBATCHES(t, requests, groups,
                   llama_rows(x + r0 * hidden, out + r0 * hidden, tb, dims, layers, table,
                              final_norm, eps, qk_eps, qk_unit_offset, cos + r0 * d,
                              sin + r0 * d, slots + r0, sub, kv_slots, groups, lmax, scale,
                              threads));
}
