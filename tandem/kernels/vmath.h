/* Math on the kernels' float vectors (vec.h): exp, tanh for soft-capped attention scores (lane
 * by lane, so a value's result never depends on its neighbours), and a vector's largest lane. */
#ifndef TANDEM_VMATH_H
#define TANDEM_VMATH_H
#include "vec.h"

/* exp(x), a vector at a time: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by a degree-6 polynomial,
 * 2^n by the exponent bits. Relative error about 2e-7; x is clamped to [-87.3, 88.7] (so the
 * result is at least ~1e-38, never 0, and never inf). */
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

/* The largest lane (halves folded onto each other: a maximum has one value whatever the order). */
static inline __attribute__((always_inline)) float hmax(vf v) {
    float a[LANES];
    store(a, v);
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) a[l] = a[l + w] > a[l] ? a[l + w] : a[l];
    return a[0];
}

/* tanh(x) = sign(x) (1 - e) / (1 + e) with e = exp(-2|x|): never overflows (e <= 1), and its
 * absolute error stays near exp's (about 2e-7; the relative error grows as |x| -> 0, where a
 * soft-capped score is near 0 anyway). */
static inline __attribute__((always_inline)) vf vtanh(vf x) {
    vi neg = x < splat(0.0f);
    vf e = vexp(vselect(neg, x, -x) * 2.0f);
    vf t = (1.0f - e) / (1.0f + e);
    return vselect(neg, -t, t);
}
#endif
