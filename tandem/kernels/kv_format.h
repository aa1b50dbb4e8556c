/* The KV cache's row formats (tandem/attention/kv_format.py holds the same arithmetic in torch):
 * a row is one token's keys or values for one KV head, D numbers, stored as float32, bfloat16,
 * float16, fp8 e4m3 (torch's float8_e4m3fn, saturating at +-448), fp8 e5m2, or q8_0 (per 32
 * numbers a float16 scale d = max|x| / 127 and 32 int8 round(x / d)). kv_store_row rounds as
 * torch's conversions do (to nearest, ties to even), so both paths write the same bytes, and
 * kv_vec widens LANES numbers of a row to float32 exactly, in registers. */
#ifndef TANDEM_KV_FORMAT_H
#define TANDEM_KV_FORMAT_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "f16.h"
#include "vec.h"

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

enum { KV_F32 = 0, KV_BF16 = 1, KV_F16 = 2, KV_FP8_E4M3 = 3, KV_FP8_E5M2 = 4, KV_Q8_0 = 5,
       KV_TYPES = 6 };

/* Bytes of a row of d numbers; 0 where the format does not take d (q8_0: multiples of 32). */
static inline int64_t kv_row_bytes(int type, int64_t d) {
    switch (type) {
    case KV_F32: return 4 * d;
    case KV_BF16: case KV_F16: return 2 * d;
    case KV_FP8_E4M3: case KV_FP8_E5M2: return d;
    case KV_Q8_0: return d % 32 ? 0 : d / 32 * 34;
    default: return 0;
    }
}

/* LANES bytes (signed or not) or 16-bit words at p widened to int32 lanes: by the instruction
 * where there is one (GCC's __builtin_convertvector does these a lane at a time). */
static inline __attribute__((always_inline)) vi widen8(const uint8_t *p, int is_signed) {
#if defined(__AVX512F__) && LANES == 16
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    return (vi)(is_signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b));
#elif defined(__AVX2__) && LANES == 8
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    return (vi)(is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
#else
    vi r;
    for (int l = 0; l < LANES; l++) r[l] = is_signed ? (int8_t)p[l] : p[l];
    return r;
#endif
}

static inline __attribute__((always_inline)) vi widen16(const uint8_t *p) {
#if defined(__AVX512F__) && LANES == 16
    return (vi)_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
#elif defined(__AVX2__) && LANES == 8
    return (vi)_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
#else
    vi r;
    for (int l = 0; l < LANES; l++) r[l] = p[2 * l] | p[2 * l + 1] << 8;
    return r;
#endif
}

static inline uint32_t f32_bits(float f) { uint32_t x; memcpy(&x, &f, 4); return x; }

/* To nearest, ties to even: torch's conversions (a NaN becomes torch's NaN of the format). */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
    return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1)) >> 16);
}

/* fp8 with `mbits` mantissa bits and exponent bias `bias`: subnormals below 2^(1 - bias), a
 * quantum of 2^(1 - bias - mbits) there; `top` the largest finite code's magnitude. e4m3
 * saturates there (torch's float8_e4m3fn); e5m2 goes to infinity past its rounding. */
static inline uint8_t f32_to_fp8(float f, int mbits, int bias, int saturate) {
    uint32_t x = f32_bits(f);
    uint8_t sign = (uint8_t)(x >> 24 & 0x80);
    float a = fabsf(f);
    if (a != a) return sign | 0x7F;
    int emax = saturate ? 15 : 30;  /* the largest finite biased exponent */
    float top = ldexpf(1.75f, emax - bias);  /* the largest finite value: 448, 57344 */
    if (a >= ldexpf(1.0f, 1 - bias)) {
        uint32_t b = x & 0x7FFFFFFFu, shift = 23 - mbits;
        b += (1u << (shift - 1)) - 1 + (b >> shift & 1);  /* to nearest, ties to even */
        int e = (int)(b >> 23) - 127 + bias;
        uint32_t m = b >> shift & ((1u << mbits) - 1);
        if (e > emax || (saturate && (a > top || (e == emax && m == (1u << mbits) - 1))))
            return sign | (saturate ? 0x7E : 0x7C);
        return sign | (uint8_t)(e << mbits | m);
    }
    return sign | (uint8_t)nearbyintf(ldexpf(a, bias - 1 + mbits));  /* may reach the normals */
}

static inline void kv_store_row(int type, void *dst, const float *x, int64_t d) {
    uint8_t *o = (uint8_t *)dst;
    switch (type) {
    case KV_F32: memcpy(o, x, (size_t)d * 4); return;
    case KV_BF16:
        for (int64_t i = 0; i < d; i++) {
            uint16_t h = f32_to_bf16(x[i]);
            memcpy(o + 2 * i, &h, 2);
        }
        return;
    case KV_F16: {
        int64_t i = 0;
#if defined(__AVX512F__)
        for (; i + 16 <= d; i += 16)  /* the same rounding: to nearest, ties to even */
            _mm256_storeu_si256((__m256i *)(o + 2 * i),
                                _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#elif defined(__F16C__) && defined(__AVX__)
        for (; i + 8 <= d; i += 8)
            _mm_storeu_si128((__m128i *)(o + 2 * i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
        for (; i < d; i++) {
            uint16_t h = f32_to_f16(x[i]);
            memcpy(o + 2 * i, &h, 2);
        }
        return;
    }
    case KV_FP8_E4M3: for (int64_t i = 0; i < d; i++) o[i] = f32_to_fp8(x[i], 3, 7, 1); return;
    case KV_FP8_E5M2: for (int64_t i = 0; i < d; i++) o[i] = f32_to_fp8(x[i], 2, 15, 0); return;
    case KV_Q8_0:
        for (int64_t b = 0; b < d / 32; b++, o += 34) {
            const float *xb = x + 32 * b;
            vf mx = {0};
            for (int i = 0; i < 32; i += LANES) {
                vf a = load(xb + i);
                a = vselect(a < 0, -a, a);
                mx = vselect(a > mx, a, mx);
            }
            float amax = 0.0f;
            for (int l = 0; l < LANES; l++) amax = mx[l] > amax ? mx[l] : amax;
            uint16_t h = f32_to_f16(amax / 127);
            memcpy(o, &h, 2);
            const float dv = f16_to_f32(h), id = dv > 0 ? 1.0f / dv : 0.0f;
            const vf magic = splat(12582912.0f);  /* 1.5 * 2^23: adding it rounds to an integer,
                                                     to nearest, ties to even (|x| < 2^22) */
            for (int i = 0; i < 32; i += LANES) {
                vf q = (load(xb + i) * id + magic) - magic;
                q = vselect(q > 127, splat(127), vselect(q < -127, splat(-127), q));
                const vi qi = __builtin_convertvector(q, vi);
#if defined(__AVX512F__) && LANES == 16
                _mm_storeu_si128((__m128i *)(o + 2 + i), _mm512_cvtepi32_epi8((__m512i)qi));
#else
                for (int l = 0; l < LANES; l++) o[2 + i + l] = (uint8_t)(int8_t)qi[l];
#endif
            }
        }
        return;
    }
}


/* LANES fp8 codes -> float32: sign, then the exponent and mantissa moved into float32's fields
 * and rebiased; subnormal codes as their integer mantissa times the quantum. */
static inline __attribute__((always_inline)) vf fp8_to_f32(vi v, int mbits, int bias) {
    vi sign = (v & 0x80) << 24, em = v & 0x7F;
    vi normal = sign | ((em << (23 - mbits)) + ((127 - bias) << 23));
    vf sub = __builtin_convertvector(em, vf) * ldexpf(1.0f, 1 - bias - mbits);
    vi subbits = sign | (vi)sub;
    vi is_sub = em < (1 << mbits);
    vi out = (is_sub & subbits) | (~is_sub & normal);
    if (mbits == 3) {  /* e4m3: code 0x7F is its NaN */
        vi nan = em == 0x7F;
        out = (nan & (sign | 0x7FC00000)) | (~nan & out);
    } else {           /* e5m2: the top exponent is infinity and NaN, as float32's */
        vi top = em >= 0x7C;
        out = (top & (sign | 0x7F800000 | (em & 3) << 21)) | (~top & out);
    }
    return (vf)out;
}

/* Numbers e * LANES .. e * LANES + LANES - 1 of a row of `type` at s, widened to float32 exactly,
 * in registers (a q8_0 block of 32 holds 32 / LANES of them). type is a constant where inlined. */
static inline __attribute__((always_inline)) vf kv_vec(int type, const uint8_t *s, int64_t e) {
    const int64_t n = e * LANES;
    switch (type) {
    case KV_F32: return load((const float *)s + n);
    case KV_BF16: return (vf)(widen16(s + 2 * n) << 16);
    case KV_F16: {
#if defined(__AVX512F__) && LANES == 16
        return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 2 * n)));
#elif defined(__F16C__) && defined(__AVX__) && LANES == 8
        return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 2 * n)));
#else
        vf r;
        for (int l = 0; l < LANES; l++) r[l] = f16_at(s + 2 * (n + l));
        return r;
#endif
    }
    case KV_FP8_E4M3: return fp8_to_f32(widen8(s + n, 0), 3, 7);
    case KV_FP8_E5M2: return fp8_to_f32(widen8(s + n, 0), 2, 15);
    default: {  /* KV_Q8_0: the block's int8 numbers times its scale */
        const uint8_t *blk = s + n / 32 * 34;
        return __builtin_convertvector(widen8(blk + 2 + n % 32, 1), vf) * splat(f16_at(blk));
    }
    }
}

/* Row src (d numbers of `type`, d a multiple of LANES) widened to float32 into out [d]. */
static inline void kv_load_row(int type, const void *src, float *out, int64_t d) {
    for (int64_t e = 0; e < d / LANES; e++) store(out + e * LANES, kv_vec(type, src, e));
}
#endif
