/* Fused float32 CPU kernels for the per-layer work around the matmuls (see
 * tandem/kernels/cpu.py): residual add + RMSNorm, SiLU-and-mul, GELU-tanh-and-mul, and q/k norm
 * + rotary + KV-cache write. torch runs each as several tiny ops (RMSNorm alone is five inside
 * `F.rms_norm` on CPU), each costing microseconds of dispatch for nanoseconds of math; here each
 * is one call; and a row sum for the sampler. Paged attention lives in cpu_attention.c.
 *
 * Every reduction runs in a fixed order over explicit lanes (vec.h: 16 with AVX-512, 8
 * elsewhere), and every kernel computes a row alone, so a row's result does not depend on the
 * batch it is in: speculative verification and plain decoding compute identical bits. The
 * build turns off floating-point contraction (-ffp-contract=off) for the same reason.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "kernels.h"
#include "kv_format.h"
#include "vec.h"
#include "vmath.h"

#define MAX_HEAD_DIM 512

/* Sum of a[i] * b[i]: lane l sums the products i = l mod LANES in order, then hsum. */
static inline __attribute__((always_inline)) float dot(const float *a, const float *b, int64_t n) {
    vf acc = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) acc += load(a + i) * load(b + i);
    float lanes[LANES];
    store(lanes, acc);
    for (int l = 0; i + l < n; l++) lanes[l] += a[i + l] * b[i + l];
    return hsum(load(lanes));
}

/* sum_out = x (+ delta); normed = sum_out / rms(sum_out) * (w or 1 + w), row by row.
 * x, delta, sum_out, normed: [rows, dim] contiguous. sum_out may be x (in place), or NULL when
 * delta is NULL (normed = norm(x)). */
void tandem_add_rms_norm(const float *x, const float *delta, float *sum_out, float *normed,
                         const float *w, int64_t rows, int64_t dim, float eps, int unit_offset) {
    for (int64_t r = 0; r < rows; r++) {
        const float *s = x + r * dim;
        float *o = normed + r * dim;
        if (sum_out) {
            float *so = sum_out + r * dim;
            if (delta) {
                const float *dr = delta + r * dim;
                for (int64_t i = 0; i < dim; i++) so[i] = s[i] + dr[i];
            } else if (so != s) {
                memcpy(so, s, dim * sizeof(float));
            }
            s = so;
        }
        float inv = 1.0f / sqrtf(dot(s, s, dim) / (float)dim + eps);
        if (unit_offset)
            for (int64_t i = 0; i < dim; i++) o[i] = s[i] * inv * (1.0f + w[i]);
        else
            for (int64_t i = 0; i < dim; i++) o[i] = w[i] * (s[i] * inv);
    }
}

/* out[t, i] = silu(gu[t, i]) * gu[t, inter + i]; gu: [rows, 2 inter], out: [rows, inter]. */
void tandem_silu_and_mul(const float *gu, float *out, int64_t rows, int64_t inter) {
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
        int64_t i = 0;
        for (; i + LANES <= inter; i += LANES) {
            vf gv = load(g + i);
            store(o + i, gv / (1.0f + vexp(-gv)) * load(u + i));
        }
        for (; i < inter; i++) o[i] = g[i] / (1.0f + fast_exp(-g[i])) * u[i];
    }
}

/* out[t, i] = gelu_tanh(gu[t, i]) * gu[t, inter + i]; gu: [rows, 2 inter], out: [rows, inter].
 * gelu_tanh(x) = x (1 + tanh(u)) / 2 with u = sqrt(2 / pi) (x + 0.044715 x^3), computed as
 * x / (1 + exp(-2u)), the same function without tanh's cancellation near -1 (torch's own loses
 * bits there); elementwise, so a row's bits never depend on its batch. */
void tandem_gelu_tanh_and_mul(const float *gu, float *out, int64_t rows, int64_t inter) {
    /* -2u = x (c1 + c3 x^2): c1 = -2 sqrt(2 / pi), c3 = 0.044715 c1 */
    const float c1 = -1.5957691216057308f, c3 = -0.07135481627260025f;
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
        int64_t i = 0;
        for (; i + LANES <= inter; i += LANES) {
            vf x = load(g + i);
            store(o + i, x / (1.0f + vexp(x * (c1 + c3 * (x * x)))) * load(u + i));
        }
        for (; i < inter; i++) {
            float x = g[i];
            o[i] = x / (1.0f + fast_exp(x * (c1 + c3 * (x * x)))) * u[i];
        }
    }
}

/* One head in place: optional RMSNorm (weight w, eps, 1 + w when unit_offset), then rotary with
 * full-width tables: x'[d] = x[d] cos[d] + x[d +- D/2] sin[d] (sin already signed). */
static void norm_rotate(float *x, const float *cos, const float *sin, int64_t d,
                        const float *w, float eps, int unit_offset) {
    float tmp[MAX_HEAD_DIM];
    if (w) {
        float inv = 1.0f / sqrtf(dot(x, x, d) / (float)d + eps);
        for (int64_t i = 0; i < d; i++)
            x[i] = unit_offset ? x[i] * inv * (1.0f + w[i]) : w[i] * (x[i] * inv);
    }
    int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) {
        tmp[i] = x[i] * cos[i] + x[i + half] * sin[i];
        tmp[i + half] = x[i + half] * cos[i + half] + x[i] * sin[i + half];
    }
    memcpy(x, tmp, d * sizeof(float));
}

/* qkv [T, (H + 2 Hkv) D] (the fused projection's output) in place: q and k heads normalised
 * (when weights are given) and rotated; then k and v written to the caches [slots, Hkv, row] at
 * slots[t], each row in the cache's format kv_type (kv_format.h). cos, sin: [T, D]. Returns -1
 * if D is too large or the format does not take it (the caller checks first). */
int tandem_rope_write_kv(float *qkv, int64_t t_count, int64_t h, int64_t hkv, int64_t d,
                         const float *cos, const float *sin, const int64_t *slots,
                         void *k_cache, void *v_cache, const float *q_norm_w,
                         const float *k_norm_w, float eps, int unit_offset, int kv_type) {
    const int64_t rb = kv_row_bytes(kv_type, d);
    if (d > MAX_HEAD_DIM || d % 2 || rb == 0) return -1;
    int64_t row = (h + 2 * hkv) * d;
    for (int64_t t = 0; t < t_count; t++) {
        float *x = qkv + t * row;
        const float *c = cos + t * d, *s = sin + t * d;
        for (int64_t i = 0; i < h; i++) norm_rotate(x + i * d, c, s, d, q_norm_w, eps, unit_offset);
        for (int64_t i = h; i < h + hkv; i++)
            norm_rotate(x + i * d, c, s, d, k_norm_w, eps, unit_offset);
        for (int64_t i = 0; i < hkv; i++) {  /* each KV head's row in the cache's format */
            kv_store_row(kv_type, (char *)k_cache + (slots[t] * hkv + i) * rb, x + (h + i) * d, d);
            kv_store_row(kv_type, (char *)v_cache + (slots[t] * hkv + i) * rb,
                         x + (h + hkv + i) * d, d);
        }
    }
    return 0;
}

/* rows [n, d] float32 stored in the cache format kv_type into stored (n rows of its bytes), and
 * read back into loaded [n, d]: the kernels' two conversions, for the tests. -1 where the format
 * does not take d. */
int tandem_kv_rows(int kv_type, const float *rows, int64_t n, int64_t d, void *stored,
                   float *loaded) {
    const int64_t rb = kv_row_bytes(kv_type, d);
    if (rb == 0 || d % 16) return -1;
    for (int64_t r = 0; r < n; r++) {
        kv_store_row(kv_type, (char *)stored + r * rb, rows + r * d, d);
        kv_load_row(kv_type, (const char *)stored + r * rb, loaded + r * d, d);
    }
    return 0;
}

/* out[r] = the sum of x's row r [n] (rows contiguous, each n floats apart): lane l sums
 * elements l mod LANES of a span of SPAN floats, the span's lanes are summed by vec.h's fixed
 * tree, and the spans in double in order. Each row is summed by one thread in this one order, so
 * its bits never depend on how many rows are summed with it (torch's sum splits a single long
 * row over the threads, and so rounds it otherwise than the same row in a batch). */
#define SPAN 4096
void tandem_row_sum(const float *x, int64_t rows, int64_t n, float *out, int threads) {
#pragma omp parallel for num_threads(threads) if (rows > 1 && threads > 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * n;
        double total = 0.0;
        for (int64_t s = 0; s < n; s += SPAN) {
            int64_t end = s + SPAN < n ? s + SPAN : n, i = s;
            vf acc = {0};
            for (; i + LANES <= end; i += LANES) acc += load(row + i);
            float lanes[LANES];
            store(lanes, acc);
            for (int l = 0; i + l < end; l++) lanes[l] += row[i + l];
            total += (double)hsum(load(lanes));
        }
        out[r] = (float)total;
    }
}
