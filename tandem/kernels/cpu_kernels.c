/* Fused float32 CPU kernels for the decode step (see tandem/kernels/cpu.py).
 *
 * torch runs the small per-layer work of a decode step as many tiny ops (RMSNorm alone is five
 * inside `F.rms_norm` on CPU), each costing microseconds of dispatch for nanoseconds of math, and
 * paged attention as two gathers, a mask and an SDPA call. These kernels do the same math in one
 * call each, reading the paged KV cache in place.
 *
 * Every reduction runs in a fixed order over explicit lanes (vec.h: 16 with AVX-512, 8
 * elsewhere), so a row's result does not depend on the batch it is in or on how many queries
 * share its request: speculative verification and plain decoding compute identical bits. The
 * build turns off floating-point contraction (-ffp-contract=off) for the same reason.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels.h"
#include "vec.h"

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

/* exp(x), a vector at a time: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by a degree-6 polynomial, 2^n by
 * the exponent bits. Relative error about 2e-7; x is clamped to [-87.3, 88.7] (so the result is
 * at least ~1e-38, never 0, and never inf). */
static inline __attribute__((always_inline)) vf vexp(vf x) {
    x = vselect(x < splat(-87.3f), splat(-87.3f), x);
    x = vselect(x > splat(88.7f), splat(88.7f), x);
    vf y = x * 1.44269504088896341f + 0.5f;
    vf n = __builtin_convertvector(__builtin_convertvector(y, vi), vf);  /* trunc(y) */
    n += __builtin_convertvector(n > y, vf);                             /* floor(y): -1 if above */
    vf r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    vf p = splat(1.0f / 720.0f);
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
    return p * (vf)bits;
}

static inline __attribute__((always_inline)) float fast_exp(float x) {
    float a[LANES] = {0};
    a[0] = x;
    store(a, vexp(load(a)));
    return a[0];
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
 * (when weights are given) and rotated; then k and v written to the caches [slots, Hkv, D] at
 * slots[t]. cos, sin: [T, D]. Returns -1 if D is too large (the caller checks first). */
int tandem_rope_write_kv(float *qkv, int64_t t_count, int64_t h, int64_t hkv, int64_t d,
                         const float *cos, const float *sin, const int64_t *slots,
                         float *k_cache, float *v_cache, const float *q_norm_w,
                         const float *k_norm_w, float eps, int unit_offset) {
    if (d > MAX_HEAD_DIM || d % 2) return -1;
    int64_t row = (h + 2 * hkv) * d;
    for (int64_t t = 0; t < t_count; t++) {
        float *x = qkv + t * row;
        const float *c = cos + t * d, *s = sin + t * d;
        for (int64_t i = 0; i < h; i++) norm_rotate(x + i * d, c, s, d, q_norm_w, eps, unit_offset);
        for (int64_t i = h; i < h + hkv; i++)
            norm_rotate(x + i * d, c, s, d, k_norm_w, eps, unit_offset);
        memcpy(k_cache + slots[t] * hkv * d, x + h * d, hkv * d * sizeof(float));
        memcpy(v_cache + slots[t] * hkv * d, x + (h + hkv) * d, hkv * d * sizeof(float));
    }
    return 0;
}

/* Query heads h0 .. h0 + nh - 1 (nh <= MAX_HEADS, all of KV head g, contiguous in q) against
 * keys lo .. hi: each key and value row is loaded once for all of them. p: [nh, stride] scratch
 * for the softmax weights. Head i's scores and sums run in the same order whatever nh is.
 * nv = D / LANES, a constant where inlined, so the loops unroll into registers. */
#define MAX_HEADS 8
static inline __attribute__((always_inline)) void attend_heads(
        const float *qh, const float *k_cache, const float *v_cache, const int64_t *slots,
        int64_t hkv, int64_t g, int64_t lo, int64_t hi, float scale, float *p, int64_t stride,
        float *o, int nh, const int nv) {
    int64_t d = nv * LANES;
    vf qv[MAX_HEADS][MAX_HEAD_DIM / LANES];
    for (int i = 0; i < nh; i++)
        for (int e = 0; e < nv; e++) qv[i][e] = load(qh + i * d + e * LANES);
    vf mx[MAX_HEADS];
    for (int i = 0; i < nh; i++) mx[i] = splat(-INFINITY);
    for (int64_t j = lo; j <= hi; j += LANES) {
        vf t[MAX_HEADS][LANES];  /* t[i][k]: head i's partial sums for key j + k */
        for (int k = 0; k < LANES; k++) {
            if (j + k <= hi) {
                const float *kj = k_cache + (slots[j + k] * hkv + g) * d;
                if (j + k + LANES <= hi)  /* the row a block ahead: hide the cache's latency */
                    for (int e = 0; e < nv; e++)  /* each 64-byte line */
                        __builtin_prefetch(k_cache + (slots[j + k + LANES] * hkv + g) * d
                                           + e * LANES);
                vf kv[MAX_HEAD_DIM / LANES];
                for (int e = 0; e < nv; e++) kv[e] = load(kj + e * LANES);
                for (int i = 0; i < nh; i++) {
                    vf acc = {0};
                    for (int e = 0; e < nv; e++) acc += qv[i][e] * kv[e];
                    t[i][k] = acc;
                }
            } else {
                for (int i = 0; i < nh; i++) t[i][k] = (vf){0};
            }
        }
        vi live = __builtin_convertvector(iota() + (float)j, vi) <= (int32_t)hi;
        for (int i = 0; i < nh; i++) {
            vf sc = reduce_lanes(t[i]) * scale;
            store(p + i * stride + j, sc);
            mx[i] = vselect(live & (sc > mx[i]), sc, mx[i]);
        }
    }
    float total[MAX_HEADS];
    for (int i = 0; i < nh; i++) {
        float m = mx[i][0];
        for (int l = 1; l < LANES; l++) m = mx[i][l] > m ? mx[i][l] : m;
        float *pi = p + i * stride;
        /* LANES keys at a time; the last block's lanes past hi are never summed. */
        for (int64_t j = lo; j <= hi; j += LANES) store(pi + j, vexp(load(pi + j) - m));
        total[i] = 0.0f;
        for (int64_t j = lo; j <= hi; j++) total[i] += pi[j];
    }
    /* One head at a time: its nv sums stay in registers (all heads' sums together spilled to
     * the stack, a load and a store per multiply-add); each head after the first finds the
     * value rows in L1. Each sum still runs over j in order: the same bits. */
    for (int i = 0; i < nh; i++) {
        const float *pi = p + i * stride;
        vf acc[MAX_HEAD_DIM / LANES];
        for (int e = 0; e < nv; e++) acc[e] = (vf){0};
        for (int64_t j = lo; j <= hi; j++) {
            const float *vj = v_cache + (slots[j] * hkv + g) * d;
            if (i == 0 && j + 8 <= hi)
                for (int e = 0; e < nv; e++)  /* each 64-byte line */
                    __builtin_prefetch(v_cache + (slots[j + 8] * hkv + g) * d + e * LANES);
            const vf pj = splat(pi[j]);
            for (int e = 0; e < nv; e++) acc[e] += pj * load(vj + e * LANES);
        }
        const vf inv = splat(1.0f / total[i]);
        for (int e = 0; e < nv; e++) store(o + i * d + e * LANES, acc[e] * inv);
    }
}

static void attend_group(const float *qh, const float *k_cache, const float *v_cache,
                         const int64_t *slots, int64_t hkv, int64_t g, int64_t lo, int64_t hi,
                         float scale, float *p, int64_t stride, float *o, int nh, int nv) {
#define ATTEND(NV) attend_heads(qh, k_cache, v_cache, slots, hkv, g, lo, hi, scale, p, stride, \
                                o, nh, NV)
    if (nv == 64 / LANES) ATTEND(64 / LANES);  /* head sizes 64 and 128, unrolled */
    else if (nv == 128 / LANES) ATTEND(128 / LANES);
    else ATTEND(nv);
#undef ATTEND
}

/* Paged attention for requests with a few queries each (decode, verification), straight from
 * the cache. Request r owns flat query rows [req[r][0], req[r][0] + req[r][1]) and keys
 * 0 .. req[r][2] - 1 at cache slots kv_slots[r][j]; its query i sits at position
 * req[r][2] - req[r][1] + i and attends keys j <= position (and j > position - window when
 * window > 0). q: [T, q_stride] with head hd at hd * D; out: [T, H, D]. Query heads
 * g * rep .. g * rep + rep - 1 share KV head g. D must be a multiple of 16. Requests are spread
 * over `threads` OpenMP threads (in torch's pool; one request is computed by one thread, so its
 * bits do not depend on the split). Returns -1 on bad sizes or no memory. */
int tandem_paged_attention(const float *q, int64_t q_stride, const float *k_cache,
                           const float *v_cache, float *out, const int64_t *req,
                           const int64_t *kv_slots, int64_t num_reqs, int64_t lmax, int64_t h,
                           int64_t hkv, int64_t d, float scale, int64_t window, int threads) {
    if (d > MAX_HEAD_DIM || d % 16 || h % hkv) return -1;  /* 16: the same sizes on every CPU */
    int64_t rep = h / hkv, stride = lmax + LANES;
    int nt = threads > 1 ? threads : 1;
    /* softmax weights, one scratch per thread */
    float *p = malloc(sizeof(float) * (size_t)(nt * MAX_HEADS * stride));
    if (!p) return -1;
    /* Below ~64k multiply-adds a second thread costs more to wake than it saves. (The bound was
     * 1M: 16 SmolLM2 streams ran on one core below 114 positions; 16 x (64 + 64) tokens held to
     * AVX2, bounds alternating 4 rounds: 1M 453, 256k 468, 64k 465, 16k 475 tok/s.
     * Splitting one request's heads over the threads made one stream 1-3% slower: its
     * attention is ~10 us a layer, near a fork's cost, and both cores then read its keys.) */
    int parallel = nt > 1 && num_reqs > 1 && num_reqs * lmax * h * d >= (1 << 16);
    (void)parallel;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (parallel)
    for (int64_t r = 0; r < num_reqs; r++) {
#ifdef _OPENMP
        float *pr = p + (size_t)omp_get_thread_num() * MAX_HEADS * stride;
#else
        float *pr = p;
#endif
        int64_t q0 = req[3 * r], qlen = req[3 * r + 1], slen = req[3 * r + 2];
        const int64_t *slots = kv_slots + r * lmax;
        for (int64_t i = 0; i < qlen; i++) {
            int64_t pos = slen - qlen + i;
            int64_t lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
            int64_t hd = 0;
            while (hd < h) {
                /* Heads hd .. hd + nh - 1: up to MAX_HEADS of one KV head's query heads. */
                int64_t g = hd / rep, left = (g + 1) * rep - hd;
                int nh = (int)(left < MAX_HEADS ? left : MAX_HEADS);
                attend_group(q + (q0 + i) * q_stride + hd * d, k_cache, v_cache, slots, hkv, g,
                             lo, pos, scale, pr, stride, out + ((q0 + i) * h + hd) * d, nh,
                             (int)(d / LANES));
                hd += nh;
            }
        }
    }
    free(p);
    return 0;
}
