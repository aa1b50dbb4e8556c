/* quant_r16_vec.h's lanes in plain C, for a CPU with none of its vector kinds (x86 without AVX2,
 * FMA and F16C; 32-bit Arm, POWER, RISC-V, ...): NEON's shape (4 lanes a vector, the 16 rows in
 * four passes) and its operations lane for lane, in GCC's vector extension, which the compiler
 * maps to the CPU's 128-bit vectors where it has them (SSE2, VSX, ...) and to scalar code
 * elsewhere. The same integer sums and the same IEEE float operations (fmaf: one rounding), so
 * the same bits as every other kind. Included by quant_r16_vec.h alone (INL is its). */
#ifndef TANDEM_QUANT_R16_C_H
#define TANDEM_QUANT_R16_C_H
#define R16_HALVES 4
typedef int32_t v16i __attribute__((vector_size(16))); /* a lane: 4 bytes of one row, or int32 */
typedef uint32_t r16_v4u __attribute__((vector_size(16)));
typedef uint16_t r16_v8u __attribute__((vector_size(16)));
typedef float v16f __attribute__((vector_size(16)));

INL v16i vi_load(const uint8_t *p, int h) {
    v16i v;
    memcpy(&v, p + 16 * h, 16);
    return v;
}
INL v16i vi_bytes(int8_t b) { return (v16i){0, 0, 0, 0} + (int32_t)(0x01010101u * (uint8_t)b); }
INL v16i vi_and(v16i a, v16i b) { return a & b; }
INL v16i vi_or(v16i a, v16i b) { return a | b; }
INL v16i vi_srl16(v16i a, int n) { return (v16i)((r16_v8u)a >> n); } /* within 16-bit halves */
INL v16i vi_sll16(v16i a, int n) { return (v16i)((r16_v8u)a << n); }
INL v16i vi_zero(void) { return (v16i){0, 0, 0, 0}; }
INL v16i vi_add(v16i a, v16i b) { return a + b; }
INL v16i vi_sub1(v16i a, int32_t b) { return a - b; }
INL v16i vi_mul(v16i a, v16i b) { return a * b; }
INL v16i vi_sub(v16i a, v16i b) { return a - b; }
INL v16i vi_sll32(v16i a, int n) { return (v16i)((r16_v4u)a << n); }
/* Byte i of each lane, sign-extended: moved to the top, then shifted down arithmetically. */
INL v16i vi_byte(v16i a, int i) { return (v16i)((r16_v4u)a << (24 - 8 * i)) >> 24; }
INL v16i vi_widen8(const uint8_t *p, int is_signed, int h) { /* bytes 4h .. 4h + 3 */
    p += 4 * h;
    if (is_signed) return (v16i){(int8_t)p[0], (int8_t)p[1], (int8_t)p[2], (int8_t)p[3]};
    return (v16i){p[0], p[1], p[2], p[3]};
}
/* acc + per lane the dot product of its 4 bytes of w with x's 4, both signed (as sdot: u <= 63,
 * or Q8_0's signed q). */
INL v16i vi_dot4(v16i acc, v16i w, const int8_t *x) {
    for (int i = 0; i < 4; i++) acc += vi_byte(w, i) * x[i];
    return acc;
}
INL v16i vi_scales(const uint8_t *p, int is_signed, int h) { return vi_widen8(p, is_signed, h); }
INL v16i vi_times(v16i m, int32_t e) { return m * e; }
/* As NEON's: lane l holds a[l] in its low 16 bits and b[l] in its high 16; vi_madd2 takes them
 * apart again and adds a[l] * ea + b[l] * eb, for two = ea | eb << 16. */
INL v16i vi_pairs(const uint8_t *a, const uint8_t *b, int is_signed, int h) {
    const v16i va = vi_widen8(a, is_signed, h), vb = vi_widen8(b, is_signed, h);
    return (va & 0xFFFF) | (v16i)((r16_v4u)vb << 16);
}
INL v16i vi_madd2(v16i acc, v16i pairs, int32_t two) {
    const v16i a = (v16i)((r16_v4u)pairs << 16) >> 16, b = pairs >> 16;
    return acc + a * (int16_t)(two & 0xFFFF) + b * (int16_t)((uint32_t)two >> 16);
}

INL v16f vf_zero(void) { return (v16f){0.0f, 0.0f, 0.0f, 0.0f}; }
INL v16f vf_set1(float f) { return (v16f){f, f, f, f}; }
INL v16f vf_cvt(v16i a) { return __builtin_convertvector(a, v16f); }
INL v16f vf_mul(v16f a, v16f b) { return a * b; }
INL v16f vf_add(v16f a, v16f b) { return a + b; }
INL v16f vf_fma(v16f a, v16f b, v16f c) { /* a * b + c, fused */
    for (int l = 0; l < 4; l++) c[l] = fmaf(a[l], b[l], c[l]);
    return c;
}
INL v16f vf_neg(v16f a) { return -a; }
INL v16f vf_half(const uint8_t *p, int h) { /* float16 4h .. 4h + 3, widened exactly */
    v16f v;
    for (int l = 0; l < 4; l++) v[l] = f16_at(p + 8 * h + 2 * l);
    return v;
}
INL v16f vf_loadu(const float *t) {
    v16f v;
    memcpy(&v, t, 16);
    return v;
}
INL void vf_storeu(float *t, v16f v) { memcpy(t, &v, 16); }
#endif
