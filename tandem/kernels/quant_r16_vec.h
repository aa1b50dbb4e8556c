/* 16 lanes, one per interleaved weight row, for cpu_quant_r16.c: one AVX-512 register, or, with
 * AVX2, 8 lanes a register in two passes over the rows (0-7, then 8-15: R16_HALVES; a load's h
 * picks the half, so 16 ymm registers hold one pass's weights and sums with few spills), or,
 * with Arm NEON or in plain C (any other CPU), 4 lanes a vector in four passes. Each lane's
 * operations are the same IEEE operations on every kind (convert, multiply, fused multiply-add;
 * integer sums exact), so every build gives a row the same bits. */
#ifndef TANDEM_QUANT_R16_VEC_H
#define TANDEM_QUANT_R16_VEC_H
#include "quant_format.h"

#define INL static inline __attribute__((always_inline))

/* One cache line at p into L1 (prefetcht0 on x86, prfm pldl1keep on Arm). */
INL void r16_prefetch(const void *p) { __builtin_prefetch(p, 0, 3); }

#if defined(Q_AVX512)
#define R16_HALVES 1
typedef __m512i v16i; /* 64 bytes, or 16 int32 */
typedef __m512 v16f;
INL v16i vi_load(const uint8_t *p, int h) { (void)h; return _mm512_loadu_si512(p); }
INL v16i vi_bytes(int8_t b) { return _mm512_set1_epi8(b); }
INL v16i vi_and(v16i a, v16i b) { return _mm512_and_si512(a, b); }
INL v16i vi_or(v16i a, v16i b) { return _mm512_or_si512(a, b); }
INL v16i vi_srl16(v16i a, int n) { return _mm512_srli_epi16(a, (unsigned)n); }
INL v16i vi_sll16(v16i a, int n) { return _mm512_slli_epi16(a, (unsigned)n); }
INL v16i vi_zero(void) { return _mm512_setzero_si512(); }
INL v16i vi_add(v16i a, v16i b) { return _mm512_add_epi32(a, b); }
INL v16i vi_sub1(v16i a, int32_t b) { return _mm512_sub_epi32(a, _mm512_set1_epi32(b)); }
INL v16i vi_mul(v16i a, v16i b) { return _mm512_mullo_epi32(a, b); }
INL v16i vi_sub(v16i a, v16i b) { return _mm512_sub_epi32(a, b); }
INL v16i vi_sll32(v16i a, int n) { return _mm512_slli_epi32(a, (unsigned)n); }
/* 16 int8 or uint8 at p, one a lane. */
INL v16i vi_widen8(const uint8_t *p, int is_signed, int h) {
    (void)h;
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    return is_signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
}
/* acc + per lane r: sum over i < 4 of w [4r + i] (unsigned) * x [i] (signed, the same 4 for
 * every lane). */
INL v16i vi_dot4(v16i acc, v16i w, const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(v));
}
/* K-quant multipliers (cpu_quant_r16.c): 16 int8 or uint8 scales at p, one a lane, in the form
 * vi_sdot takes (here int32); vi_times multiplies them by x's e (1-8). */
INL v16i vi_scales(const uint8_t *p, int is_signed, int h) { return vi_widen8(p, is_signed, h); }
INL v16i vi_times(v16i m, int32_t e) { return _mm512_mullo_epi32(m, _mm512_set1_epi32(e)); }
/* Lane l: the 16-bit pair (a[l], b[l]) of the 16 bytes at a and b; vi_madd2 adds
 * a[l] * ea + b[l] * eb to lane l, for two = ea | eb << 16 (int16 halves, as prepare_xk packs
 * them: one broadcast and one vpmaddwd). */
INL v16i vi_pairs(const uint8_t *a, const uint8_t *b, int is_signed, int h) {
    (void)h;
    const __m128i va = _mm_loadu_si128((const __m128i *)a);
    const __m128i vb = _mm_loadu_si128((const __m128i *)b);
    const __m256i ab = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(va, vb)),
                                               _mm_unpackhi_epi8(va, vb), 1);
    return is_signed ? _mm512_cvtepi8_epi16(ab) : _mm512_cvtepu8_epi16(ab);
}
INL v16i vi_madd2(v16i acc, v16i pairs, int32_t two) {
    return vi_add(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi32(two)));
}
INL v16f vf_zero(void) { return _mm512_setzero_ps(); }
INL v16f vf_set1(float f) { return _mm512_set1_ps(f); }
INL v16f vf_cvt(v16i a) { return _mm512_cvtepi32_ps(a); }
INL v16f vf_mul(v16f a, v16f b) { return _mm512_mul_ps(a, b); }
INL v16f vf_add(v16f a, v16f b) { return _mm512_add_ps(a, b); }
INL v16f vf_fma(v16f a, v16f b, v16f c) { return _mm512_fmadd_ps(a, b, c); }
INL v16f vf_neg(v16f a) { return _mm512_xor_ps(_mm512_set1_ps(-0.0f), a); }
INL v16f vf_half(const uint8_t *p, int h) { /* 16 float16 */
    (void)h;
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
INL v16f vf_load_n(const float *p, int n, int h) {
    (void)h;
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
}
INL void vf_store_n(float *p, v16f v, int n, int h) {
    (void)h;
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), v);
}

#elif defined(Q_AVX2) /* 8 lanes a register, the 16 rows in two passes (0-7, then 8-15) */
#define R16_HALVES 2
typedef __m256i v16i;
typedef __m256 v16f;
INL v16i vi_load(const uint8_t *p, int h) {
    return _mm256_loadu_si256((const __m256i *)(p + 32 * h));
}
INL v16i vi_bytes(int8_t b) { return _mm256_set1_epi8(b); }
INL v16i vi_and(v16i a, v16i b) { return _mm256_and_si256(a, b); }
INL v16i vi_or(v16i a, v16i b) { return _mm256_or_si256(a, b); }
INL v16i vi_srl16(v16i a, int n) { return _mm256_srli_epi16(a, n); }
INL v16i vi_sll16(v16i a, int n) { return _mm256_slli_epi16(a, n); }
INL v16i vi_zero(void) { return _mm256_setzero_si256(); }
INL v16i vi_add(v16i a, v16i b) { return _mm256_add_epi32(a, b); }
INL v16i vi_sub1(v16i a, int32_t b) { return _mm256_sub_epi32(a, _mm256_set1_epi32(b)); }
INL v16i vi_mul(v16i a, v16i b) { return _mm256_mullo_epi32(a, b); }
INL v16i vi_sub(v16i a, v16i b) { return _mm256_sub_epi32(a, b); }
INL v16i vi_sll32(v16i a, int n) { return _mm256_slli_epi32(a, n); }
INL v16i vi_widen8(const uint8_t *p, int is_signed, int h) {
    __m128i b = _mm_loadl_epi64((const __m128i *)(p + 8 * h));
    return is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
}
/* Q8_0 (signed q) by the sign trick: vpmaddubsw of |q| (vi_q8w, once for all of a pass's x
 * rows) with x carrying q's signs (vpsignb, q read again as its memory operand: the 8 words'
 * |q| and q together would not fit 16 registers), then vpmaddwd; exact, a pair within int16
 * for |q| <= 128 and |x| <= 127 (prepare_x's rounding). */
INL v16i vi_q8w(const uint8_t *p, int h) { return _mm256_abs_epi8(vi_load(p, h)); }
INL v16i vi_q8dot4(v16i acc, v16i a, const uint8_t *p, int h, const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    const __m256i sx = _mm256_sign_epi8(_mm256_set1_epi32(v), vi_load(p, h));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, sx),
                                                   _mm256_set1_epi16(1)));
}
/* K-quant multipliers, as above, but in 16 bits in both halves of a lane: vpmaddwd multiplies
 * vpmaddubsw's pair sums by them instead of by 1, so a scale costs no instruction here. */
INL v16i vi_scales(const uint8_t *p, int is_signed, int h) {
    const v16i v = vi_widen8(p, is_signed, h);
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)),
                           _mm256_slli_epi32(v, 16));
}
INL v16i vi_times(v16i m, int32_t e) { return _mm256_mullo_epi16(m, _mm256_set1_epi16((short)e)); }
/* acc + m * (sum over words w < n of W[w] . x[4w ..]), the multiplier inside vpmaddwd: the
 * pair sums of `group` words add up in 16 bits first (one vpmaddwd per group), exact while
 * group * 2 * u * 127 stays within int16: group 8 for u <= 15, 4 for u <= 31, 2 for u <= 63;
 * m (|sc e| <= 1024) within int16 too. */
INL v16i vi_sdot(v16i acc, const v16i *W, int n, const int8_t *x, v16i m, int group) {
    v16i s0 = vi_zero(), s1 = vi_zero();
    for (int g = 0; g < n; g += group) {
        __m256i p = _mm256_setzero_si256();
        for (int w = g; w < g + group; w++) {
            int32_t v;
            memcpy(&v, x + 4 * w, 4);
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(W[w], _mm256_set1_epi32(v)));
        }
        if ((g / group) & 1) s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(p, m));
        else s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(p, m));
    }
    return vi_add(acc, vi_add(s0, s1));
}
/* As on AVX-512, with the pair sums of `group` words added in 16 bits first (vi_sdot). */
INL v16i vi_dot8g(const v16i *W, const int8_t *x, int group) {
    return vi_sdot(vi_zero(), W, 8, x, _mm256_set1_epi16(1), group);
}
INL v16i vi_pairs(const uint8_t *a, const uint8_t *b, int is_signed, int h) {
    const __m128i ab = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(a + 8 * h)),
                                         _mm_loadl_epi64((const __m128i *)(b + 8 * h)));
    return is_signed ? _mm256_cvtepi8_epi16(ab) : _mm256_cvtepu8_epi16(ab);
}
INL v16i vi_madd2(v16i acc, v16i pairs, int32_t two) {
    return vi_add(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi32(two)));
}
INL v16f vf_zero(void) { return _mm256_setzero_ps(); }
INL v16f vf_set1(float f) { return _mm256_set1_ps(f); }
INL v16f vf_cvt(v16i a) { return _mm256_cvtepi32_ps(a); }
INL v16f vf_mul(v16f a, v16f b) { return _mm256_mul_ps(a, b); }
INL v16f vf_add(v16f a, v16f b) { return _mm256_add_ps(a, b); }
INL v16f vf_fma(v16f a, v16f b, v16f c) { return _mm256_fmadd_ps(a, b, c); }
INL v16f vf_neg(v16f a) { return _mm256_xor_ps(_mm256_set1_ps(-0.0f), a); }
INL v16f vf_half(const uint8_t *p, int h) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * h)));
}
INL v16f vf_loadu(const float *t) { return _mm256_loadu_ps(t); }
INL void vf_storeu(float *t, v16f v) { _mm256_storeu_ps(t, v); }

#elif defined(Q_NEON) /* 4 lanes a register, the 16 rows in four passes (rows 4h .. 4h + 3) */
#include <arm_neon.h>
#define R16_HALVES 4
typedef int32x4_t v16i;
typedef float32x4_t v16f;
INL v16i vi_load(const uint8_t *p, int h) { return vreinterpretq_s32_u8(vld1q_u8(p + 16 * h)); }
INL v16i vi_bytes(int8_t b) { return vreinterpretq_s32_s8(vdupq_n_s8(b)); }
INL v16i vi_and(v16i a, v16i b) { return vandq_s32(a, b); }
INL v16i vi_or(v16i a, v16i b) { return vorrq_s32(a, b); }
INL v16i vi_srl16(v16i a, int n) { /* a shift by a register: n need not be a constant */
    return vreinterpretq_s32_u16(vshlq_u16(vreinterpretq_u16_s32(a), vdupq_n_s16((int16_t)-n)));
}
INL v16i vi_sll16(v16i a, int n) {
    return vreinterpretq_s32_u16(vshlq_u16(vreinterpretq_u16_s32(a), vdupq_n_s16((int16_t)n)));
}
INL v16i vi_zero(void) { return vdupq_n_s32(0); }
INL v16i vi_add(v16i a, v16i b) { return vaddq_s32(a, b); }
INL v16i vi_sub1(v16i a, int32_t b) { return vsubq_s32(a, vdupq_n_s32(b)); }
INL v16i vi_mul(v16i a, v16i b) { return vmulq_s32(a, b); }
INL v16i vi_sub(v16i a, v16i b) { return vsubq_s32(a, b); }
INL v16i vi_sll32(v16i a, int n) { return vshlq_s32(a, vdupq_n_s32(n)); }
INL v16i vi_widen8(const uint8_t *p, int is_signed, int h) { /* bytes 4h .. 4h + 3 */
    uint32_t v;
    memcpy(&v, p + 4 * h, 4);
    const uint8x8_t b = vreinterpret_u8_u32(vdup_n_u32(v));
    return is_signed ? vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u8(b))))
                     : vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(b))));
}
/* acc + per lane the dot product of its 4 bytes of w with x's 4 (both taken as signed: u <= 63,
 * or Q8_0's signed q): sdot where the CPU has it (Armv8.2 dotprod), else widening multiplies
 * and pairwise adds (a product fits int16), the same integer either way. */
INL v16i vi_dot4(v16i acc, v16i w, const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    const int8x16_t xv = vreinterpretq_s8_s32(vdupq_n_s32(v)), ws = vreinterpretq_s8_s32(w);
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, ws, xv);
#else
    const int16x8_t lo = vmull_s8(vget_low_s8(ws), vget_low_s8(xv)), hi = vmull_high_s8(ws, xv);
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
#endif
}
INL v16i vi_scales(const uint8_t *p, int is_signed, int h) { return vi_widen8(p, is_signed, h); }
INL v16i vi_times(v16i m, int32_t e) { return vmulq_n_s32(m, e); }
/* Lane l: a[l] in the low 16 bits, b[l] in the high 16 (each sign- or zero-extended from its
 * byte); vi_madd2 takes lanes and multipliers apart again and adds a[l] * ea + b[l] * eb. */
INL v16i vi_pairs(const uint8_t *a, const uint8_t *b, int is_signed, int h) {
    const v16i va = vi_widen8(a, is_signed, h), vb = vi_widen8(b, is_signed, h);
    return vorrq_s32(vandq_s32(va, vdupq_n_s32(0xFFFF)), vshlq_n_s32(vb, 16));
}
INL v16i vi_madd2(v16i acc, v16i pairs, int32_t two) {
    const v16i a = vshrq_n_s32(vshlq_n_s32(pairs, 16), 16), b = vshrq_n_s32(pairs, 16);
    const int32_t ea = (int16_t)(two & 0xFFFF), eb = (int16_t)((uint32_t)two >> 16);
    return vmlaq_n_s32(vmlaq_n_s32(acc, a, ea), b, eb);
}
INL v16f vf_zero(void) { return vdupq_n_f32(0.0f); }
INL v16f vf_set1(float f) { return vdupq_n_f32(f); }
INL v16f vf_cvt(v16i a) { return vcvtq_f32_s32(a); }
INL v16f vf_mul(v16f a, v16f b) { return vmulq_f32(a, b); }
INL v16f vf_add(v16f a, v16f b) { return vaddq_f32(a, b); }
INL v16f vf_fma(v16f a, v16f b, v16f c) { return vfmaq_f32(c, a, b); } /* a * b + c, fused */
INL v16f vf_neg(v16f a) { return vnegq_f32(a); }
INL v16f vf_half(const uint8_t *p, int h) { /* float16 4h .. 4h + 3, widened exactly */
    const uint16x4_t bits = vld1_u16((const uint16_t *)(const void *)(p + 8 * h));
    return vcvt_f32_f16(vreinterpret_f16_u16(bits));
}
INL v16f vf_loadu(const float *t) { return vld1q_f32(t); }
INL void vf_storeu(float *t, v16f v) { vst1q_f32(t, v); }

#else /* plain C (any other CPU): NEON's 4 lanes and operations */
#include "quant_r16_c.h"
#endif

#if R16_HALVES > 1 /* AVX2, NEON, C: L lanes a register, through a buffer (no masked moves) */
#define R16_LANES (16 / R16_HALVES)
/* Lanes L h .. of the first n (<= 16) floats at p, the rest zero; and the same lanes stored. */
INL v16f vf_load_n(const float *p, int n, int h) {
    float t[R16_LANES] = {0};
    const int c = n - R16_LANES * h, len = c < R16_LANES ? c : R16_LANES;
    if (c > 0) memcpy(t, p + R16_LANES * h, sizeof(float) * (size_t)len);
    return vf_loadu(t);
}
INL void vf_store_n(float *p, v16f v, int n, int h) {
    float t[R16_LANES];
    const int c = n - R16_LANES * h, len = c < R16_LANES ? c : R16_LANES;
    vf_storeu(t, v);
    if (c > 0) memcpy(p + R16_LANES * h, t, sizeof(float) * (size_t)len);
}
#endif

#if R16_HALVES != 2 /* AVX-512, NEON, C: the dot products land in int32 lanes */
/* sum over words w < n (even) of W[w] . x[4w .. 4w + 3], in two chains (latency). */
INL v16i vi_dotn(const v16i *W, int n, const int8_t *x) {
    v16i s0 = vi_zero(), s1 = vi_zero();
    for (int w = 0; w < n; w += 2) {
        s0 = vi_dot4(s0, W[w], x + 4 * w);
        s1 = vi_dot4(s1, W[w + 1], x + 4 * w + 4);
    }
    return vi_add(s0, s1);
}
/* acc + m * (the same sum), one multiply after (vpdpbusd and sdot take no multiplier); and the
 * sum over 8 words for unsigned u <= 15 (group 8) or 31 (group 4). The group matters to AVX2
 * alone (its 16-bit pair sums). */
INL v16i vi_sdot(v16i acc, const v16i *W, int n, const int8_t *x, v16i m, int group) {
    (void)group;
    return vi_add(acc, vi_mul(vi_dotn(W, n, x), m));
}
INL v16i vi_dot8g(const v16i *W, const int8_t *x, int group) {
    (void)group;
    return vi_dotn(W, 8, x);
}
/* Q8_0's words as stored (u = q + 128 for vpdpbusd, whose caller takes 128 sum x off a block's
 * sum; signed q for sdot) and their dot with 4 bytes of x: vi_dot4 as it is. */
INL v16i vi_q8w(const uint8_t *p, int h) { return vi_load(p, h); }
INL v16i vi_q8dot4(v16i acc, v16i a, const uint8_t *p, int h, const int8_t *x) {
    (void)p, (void)h;
    return vi_dot4(acc, a, x);
}
#endif

#undef INL
#endif
