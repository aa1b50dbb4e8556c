/* The quantized matmul for a few rows of x (one decode step, a short verification): each weight
 * block is unpacked in registers, step by step, and multiplied at once, where cpu_quant.c's
 * batched path writes NR unpacked rows to a scratch first and reuses them across many x rows.
 * At one row of x that scratch round trip (u bytes, a lane scale per 4 elements) costs more than
 * the multiply-adds themselves.
 *
 * The arithmetic is the batched path's, operation for operation: the same u bytes (from the same
 * block layouts), the same lane scales a * ax, the same integer multiply-adds into the same lanes,
 * the same reduction (lanes_sum) and the same offsets (block_scales, offsets_dot in the caller).
 * So a row's result has the same bits whichever path ran it, and tandem_qlinear may choose by the
 * number of rows alone. Built only where the batched path has SIMD tiles (AVX-512 VNNI, AVX2).
 */
#include "quant_format.h"
#include "quant_direct.h"

#if STEP == 64 || (STEP == 32 && defined(__AVX2__))

/* 32 elements of a block as u bytes, in element order: those at element e0 (a multiple of 32) of
 * the block at p. With SIGNED_Q8, a Q8_0 block gives |q| and its signs in *sign. */
static inline __attribute__((always_inline)) __m256i u32_at(const int type, const uint8_t *p,
                                                            int e0, __m256i *sign) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    switch (type) {
    case T_Q4_0: case T_Q4_1: case T_Q5_0: case T_Q5_1: {
        int five = type == T_Q5_0 || type == T_Q5_1, off = type == T_Q4_0 ? 2 : type == T_Q4_1 ? 4
                                                       : type == T_Q5_0 ? 6 : 8;
        __m128i q = _mm_loadu_si128((const __m128i *)(p + off));
        __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), low4);
        if (five) {  /* element e's fifth bit: bit e of the 32-bit qh before the nibbles */
            uint32_t qh;
            memcpy(&qh, p + off - 4, 4);
#if STEP == 64
            u = _mm256_or_si256(u, _mm256_maskz_mov_epi8((__mmask32)qh, bit4));
#else
            const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
            const __m256i bits = _mm256_set1_epi64x(0x8040201008040201LL);
            __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread),
                                         bits);
            u = _mm256_or_si256(u, _mm256_and_si256(_mm256_cmpeq_epi8(b, bits), bit4));
#endif
        }
        return u;
    }
    case T_Q8_0: {
        __m256i q = _mm256_loadu_si256((const __m256i *)(p + 2));
        if (SIGNED_Q8) {
            *sign = q;
            return _mm256_abs_epi8(q);
        }
        return _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80));  /* q + 128 */
    }
    case T_Q4_K: case T_Q5_K: {  /* sub-block j: the low (j even) or high nibbles of 32 bytes */
        int j = e0 / 32;
        const uint8_t *qs = p + (type == T_Q4_K ? 16 : 48) + (j / 2) * 32;
        __m256i v = _mm256_loadu_si256((const __m256i *)qs);
        __m256i u = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(v, 4) : v, low4);
        if (type == T_Q5_K) {  /* fifth bit: bit j of qh[h] */
            __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 16));
            __m256i b = _mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1));
            u = _mm256_or_si256(u, _mm256_slli_epi16(b, 4));
        }
        return u;
    }
    default: {  /* T_Q6_K: quarter r of half n, low 4 bits from ql, high 2 from qh */
        int n = e0 / 128, r = e0 % 128 / 32;
        const uint8_t *ql = p + 64 * n + (r & 1) * 32, *qh = p + 128 + 32 * n;
        __m256i l = _mm256_loadu_si256((const __m256i *)ql);
        __m256i h = _mm256_loadu_si256((const __m256i *)qh);
        l = _mm256_and_si256(r >= 2 ? _mm256_srli_epi16(l, 4) : l, low4);
        h = _mm256_and_si256(_mm256_srli_epi16(h, 2 * r), _mm256_set1_epi8(3));
        return _mm256_or_si256(l, _mm256_slli_epi16(h, 4));
    }
    }
}

/* A chunk's scales a and offsets b per 16 elements, in registers: groups 0-7 in [0], 8-15 in [1]
 * (32-element blocks: chunks of 128, [0] only). Exactly block_scales' values (zero past k),
 * computed 8 at a time instead of one by one through memory: at one row of x, gathering the
 * scales cost more than the multiply-adds (measured 2.5x on a Q4_1 matmul, AMD EPYC Zen 4). */
typedef struct {
    __m256 a[2], b[2];
} chunk_sc;

/* 8 float16 values as float32 (exact). */
static inline __attribute__((always_inline)) __m256 widen8(__m128i h) {
#ifdef __F16C__
    return _mm256_cvtph_ps(h);
#else
    uint16_t v[8];
    memcpy(v, &h, 16);
    return _mm256_setr_ps(f16_to_f32(v[0]), f16_to_f32(v[1]), f16_to_f32(v[2]), f16_to_f32(v[3]),
                          f16_to_f32(v[4]), f16_to_f32(v[5]), f16_to_f32(v[6]), f16_to_f32(v[7]));
#endif
}

static inline __attribute__((always_inline)) __m256 perm8(__m256 v, int i0, int i1, int i2,
                                                          int i3, int i4, int i5, int i6, int i7) {
    return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(i0, i1, i2, i3, i4, i5, i6, i7));
}

/* 8 bytes (uint64, little-endian) as 8 floats; signed or unsigned bytes. */
static inline __attribute__((always_inline)) __m256 bytes8(uint64_t v, int is_signed) {
    __m128i b = _mm_cvtsi64_si128((long long)v);
    return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
}

static inline __attribute__((always_inline)) chunk_sc chunk_scales(
        const int type, const uint8_t *row, int64_t c0, int64_t k) {
    const int64_t bytes = q_block_bytes(type);
    chunk_sc r;
    r.a[1] = r.b[1] = _mm256_setzero_ps();
    if (q_block(type) == 32) {
        /* The first 4 bytes of the chunk's 4 blocks: d, then Q4_1/Q5_1's m (other types: quant
         * bytes, never used); zero past k. */
        int32_t w[4];
        for (int e = 0; e < 4; e++) {
            w[e] = 0;
            if (c0 + 32 * e < k) memcpy(&w[e], row + (c0 / 32 + e) * bytes, 4);
        }
        __m256 dm = widen8(_mm_setr_epi32(w[0], w[1], w[2], w[3]));  /* d0 m0 d1 m1 ... */
        __m256 d = perm8(dm, 0, 0, 2, 2, 4, 4, 6, 6);
        r.a[0] = d;
        if (type == T_Q4_1 || type == T_Q5_1)
            r.b[0] = perm8(dm, 1, 1, 3, 3, 5, 5, 7, 7);
        else if (SIGNED_Q8 && type == T_Q8_0)
            r.b[0] = _mm256_setzero_ps();
        else
            r.b[0] = _mm256_mul_ps(_mm256_set1_ps(type == T_Q4_0 ? -8.0f : type == T_Q5_0
                                                  ? -16.0f : -128.0f), d);
        return r;
    }
    const uint8_t *p = row + c0 / 256 * bytes;  /* K-quants: k is a whole number of blocks */
    if (type == T_Q6_K) {
        __m256 d = _mm256_set1_ps(f16_at(p + 208));
        uint64_t lo, hi;
        memcpy(&lo, p + 192, 8), memcpy(&hi, p + 200, 8);
        r.a[0] = _mm256_mul_ps(d, bytes8(lo, 1)), r.a[1] = _mm256_mul_ps(d, bytes8(hi, 1));
        r.b[0] = _mm256_mul_ps(_mm256_set1_ps(-32.0f), r.a[0]);
        r.b[1] = _mm256_mul_ps(_mm256_set1_ps(-32.0f), r.a[1]);
        return r;
    }
    /* Q4_K/Q5_K: k_scale_min's 6-bit scales and mins of the 8 sub-blocks, 4 bytes at a time. */
    uint32_t u0, u1, u2;
    memcpy(&u0, p + 4, 4), memcpy(&u1, p + 8, 4), memcpy(&u2, p + 12, 4);
    uint64_t sc = (uint64_t)(u0 & 0x3F3F3F3Fu)
                | (uint64_t)((u2 & 0x0F0F0F0Fu) | (u0 >> 6 & 0x03030303u) << 4) << 32;
    uint64_t mn = (uint64_t)(u1 & 0x3F3F3F3Fu)
                | (uint64_t)((u2 >> 4 & 0x0F0F0F0Fu) | (u1 >> 6 & 0x03030303u) << 4) << 32;
    __m256 a8 = _mm256_mul_ps(_mm256_set1_ps(f16_at(p)), bytes8(sc, 0));  /* per sub-block */
    __m256 b8 = _mm256_xor_ps(_mm256_set1_ps(-0.0f),  /* -(dmin * mn), the sign flipped */
                              _mm256_mul_ps(_mm256_set1_ps(f16_at(p + 2)), bytes8(mn, 0)));
    r.a[0] = perm8(a8, 0, 0, 1, 1, 2, 2, 3, 3), r.a[1] = perm8(a8, 4, 4, 5, 5, 6, 6, 7, 7);
    r.b[0] = perm8(b8, 0, 0, 1, 1, 2, 2, 3, 3), r.b[1] = perm8(b8, 4, 4, 5, 5, 6, 6, 7, 7);
    return r;
}

/* Rows w0 + j * row_bytes (j < nr) against x rows xq [mr, kp] (mr <= mrd, a tile of mrd x rows
 * by nrd weight rows; mrd at most max(MR, 3), so the accumulators stay in registers):
 * out [i * NR + j] as cpu_quant.c's tile() gives it, off [i * NR + j] as offsets_dot gives it
 * (rows' offsets against the x rows' block sums xb [mr, gp]). The tile's shape changes which
 * outputs are computed together, never an output's own sums. */
static inline __attribute__((always_inline)) void direct(
        const int type, const int mrd, const int nrd, const uint8_t *w0, int64_t row_bytes,
        int nr, const int8_t *xq, const float *xs, const float *xb, int64_t mr, int64_t k,
        int64_t kp, int64_t gp, float *out, float *off) {
    const int64_t block = q_block(type), bytes = q_block_bytes(type);
    /* Elements whose scales are read at once: whole blocks, and 8 groups of 16 (offsets_dot's
     * step, so the offsets go 8 partial sums at a time in its order). gp * 16 is a multiple. */
    const int64_t chunk = block > 128 ? block : 128;
    const int sgn = SIGNED_Q8 && type == T_Q8_0;
    const uint8_t *rows[NR];
    for (int j = 0; j < nrd; j++) rows[j] = w0 + (j < nr ? j : 0) * row_bytes;
    /* The next tile's bytes (rows are contiguous), a tile ahead: short rows (576 elements of
     * Q8_0 are 612 bytes) give the hardware prefetcher too little to lock on to; measured 2x on
     * SmolLM2's Q8_0 LM head at one thread (AMD EPYC, Zen 4). A small tile's are asked for at
     * once; a large tile's (long rows: 4096 elements of Q4_K are 2304 bytes) chunk by chunk, at
     * the pace they are read (a burst of 144 lines measured 1.5x slower on a Qwen3-8B-shaped
     * Q4_K matmul, 2 threads). */
    const int64_t ahead = nrd * row_bytes;
    const int spread = ahead > 4096;
    if (!spread)
        for (int64_t o = 0; o < ahead; o += 64)
            _mm_prefetch((const char *)(w0 + ahead + o), _MM_HINT_T0);
    __m256 part[2 * MR][NR];  /* offsets_dot's 8 partial sums; [mrd][nrd] used (mrd <= 2 MR) */
    for (int i = 0; i < mrd; i++)
        for (int j = 0; j < nrd; j++) part[i][j] = _mm256_setzero_ps();
#if STEP == 64
    __m512 acc[2 * MR][NR];
    for (int i = 0; i < mrd; i++)
        for (int j = 0; j < nrd; j++) acc[i][j] = _mm512_setzero_ps();
#else
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2 * MR][NR];
    for (int i = 0; i < mrd; i++)
        for (int j = 0; j < nrd; j++) acc[i][j] = _mm256_setzero_ps();
#endif
    for (int64_t c0 = 0; c0 < gp * 16; c0 += chunk) {
        chunk_sc sc[NR];
        for (int j = 0; j < nrd; j++) sc[j] = chunk_scales(type, rows[j], c0, k);
        if (spread)
            for (int j = 0; j < nrd; j++)
                for (int64_t o = c0 / block * bytes; o < (c0 + chunk) / block * bytes; o += 64)
                    _mm_prefetch((const char *)(rows[j] + ahead + o), _MM_HINT_T0);
        for (int64_t c = c0; c < c0 + chunk && c < kp; c += STEP) {
            const int64_t g = (c - c0) / 16;
#if STEP == 64
            __m512i u[NR];
            __m512 wa[NR];
            for (int j = 0; j < nrd; j++) {
                __m256i unused, lo, hi = _mm256_setzero_si256();
                const uint8_t *blk = rows[j] + c / block * bytes;
                lo = u32_at(type, blk, (int)(c % block), &unused);
                if (c + 32 < k)
                    hi = u32_at(type, block == 32 ? blk + bytes : blk, (int)((c + 32) % block),
                                &unused);
                u[j] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                wa[j] = _mm512_permutexvar_ps(  /* groups g..g + 3: 4 lanes each */
                    _mm512_add_epi32(_mm512_set1_epi32((int)(g % 8)), _mm512_setr_epi32(
                        0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)),
                    _mm512_castps256_ps512(sc[j].a[g / 8]));
            }
            for (int i = 0; i < mrd && i < mr; i++) {
                __m512i xv = _mm512_loadu_si512(xq + i * kp + c);
                __m512 xsv = _mm512_loadu_ps(xs + i * (kp / 4) + c / 4);
                for (int j = 0; j < nrd; j++) {
                    __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[j], xv);
                    acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(wa[j], xsv),
                                                acc[i][j]);
                }
            }
#else
            __m256i u[NR], s[NR];
            __m256 wa[NR];
            for (int j = 0; j < nrd; j++) {
                u[j] = u32_at(type, rows[j] + c / block * bytes, (int)(c % block), &s[j]);
                wa[j] = _mm256_permutevar8x32_ps(sc[j].a[g / 8], _mm256_add_epi32(  /* g, g + 1 */
                    _mm256_set1_epi32((int)(g % 8)), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1)));
            }
            for (int i = 0; i < mrd && i < mr; i++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + i * kp + c));
                __m256 xsv = _mm256_loadu_ps(xs + i * (kp / 4) + c / 4);
                for (int j = 0; j < nrd; j++) {
                    __m256i pairs = _mm256_maddubs_epi16(u[j], sgn ? _mm256_sign_epi8(xv, s[j])
                                                                   : xv);
                    __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                    acc[i][j] = _mm256_fmadd_ps(f, _mm256_mul_ps(wa[j], xsv), acc[i][j]);
                }
            }
#endif
        }
    }
    /* The offsets in a pass of their own (the scales decoded again: cheap, once a chunk), so
     * their partial sums take no registers from the tile's accumulators. */
    if (!sgn)
        for (int64_t c0 = 0; c0 < gp * 16; c0 += chunk) {
            chunk_sc sc[NR];
            for (int j = 0; j < nrd; j++) sc[j] = chunk_scales(type, rows[j], c0, k);
            /* p[l] += b16[g + l] * xb[g + l], a product then a sum, as offsets_dot */
            for (int64_t h = 0; h < chunk / 16; h += 8)
                for (int i = 0; i < mrd && i < mr; i++) {
                    __m256 xbv = _mm256_loadu_ps(xb + i * gp + c0 / 16 + h);
                    for (int j = 0; j < nrd; j++)
                        part[i][j] = _mm256_add_ps(part[i][j],
                                                   _mm256_mul_ps(sc[j].b[h / 8], xbv));
                }
        }
    for (int i = 0; i < mrd && i < mr; i++)
        for (int j = 0; j < nrd; j++) {
            out[i * NR + j] = lanes_sum(acc[i][j]);
            float p[8];
            _mm256_storeu_ps(p, part[i][j]);
            off[i * NR + j] = ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
        }
}

/* One copy of direct() per type and row count, its switches folded away and its loops over x
 * rows unrolled (a tile with a run-time row count kept its accumulators in memory: 8 rows took
 * 2x the time of 4 + 4): 1-3 rows at once, more MR at a time, each pass reading the blocks
 * again (Qwen3-8B-shaped Q4_K gate/up, 2 threads, Zen 4: 8 rows 12.4 -> 6.3 ms, 5 rows 5.5 ->
 * 4.1 ms, 1 row 1.2 ms). */
#define DIRECT_FOR(T)                                                                         \
    static void direct_##T(const uint8_t *w0, int64_t rb, int nr, const int8_t *xq,           \
                           const float *xs, const float *xb, int64_t mr, int64_t k, int64_t kp, \
                           int64_t gp, float *out, float *off) {                              \
        switch (mr) {                                                                         \
        case 1: direct(T, 1, NR, w0, rb, nr, xq, xs, xb, 1, k, kp, gp, out, off); return;     \
        case 2: direct(T, 2, NR, w0, rb, nr, xq, xs, xb, 2, k, kp, gp, out, off); return;     \
        case 3: direct(T, 3, NR, w0, rb, nr, xq, xs, xb, 3, k, kp, gp, out, off); return;     \
        default:                                                                              \
            direct(T, MR, NR, w0, rb, nr, xq, xs, xb, mr < MR ? mr : MR, k, kp, gp, out, off); \
            if (mr > MR)                                                                      \
                direct_##T(w0, rb, nr, xq + MR * kp, xs + MR * (kp / 4), xb + MR * gp,        \
                           mr - MR, k, kp, gp, out + MR * NR, off + MR * NR);                 \
        }                                                                                     \
    }
DIRECT_FOR(T_Q4_0) DIRECT_FOR(T_Q4_1) DIRECT_FOR(T_Q5_0) DIRECT_FOR(T_Q5_1) DIRECT_FOR(T_Q8_0)
DIRECT_FOR(T_Q4_K) DIRECT_FOR(T_Q5_K) DIRECT_FOR(T_Q6_K)

int q_direct(int type, const uint8_t *w0, int64_t row_bytes, int nr, const int8_t *xq,
             const float *xs, const float *xb, int64_t mr, int64_t k, int64_t kp, int64_t gp,
             float *out, float *off) {
    switch (type) {
    case T_Q4_0: direct_T_Q4_0(w0, row_bytes, nr, xq, xs, xb, mr, k, kp, gp, out, off); return 0;
    case T_Q4_1: direct_T_Q4_1(w0, row_bytes, nr, xq, xs, xb, mr, k, kp, gp, out, off); return 0;
    case T_Q5_0: direct_T_Q5_0(w0, row_bytes, nr, xq, xs, xb, mr, k, kp, gp, out, off); return 0;
    case T_Q5_1: direct_T_Q5_1(w0, row_bytes, nr, xq, xs, xb, mr, k, kp, gp, out, off); return 0;
    case T_Q8_0: direct_T_Q8_0(w0, row_bytes, nr, xq, xs, xb, mr, k, kp, gp, out, off); return 0;
    case T_Q4_K: direct_T_Q4_K(w0, row_bytes, nr, xq, xs, xb, mr, k, kp, gp, out, off); return 0;
    case T_Q5_K: direct_T_Q5_K(w0, row_bytes, nr, xq, xs, xb, mr, k, kp, gp, out, off); return 0;
    case T_Q6_K: direct_T_Q6_K(w0, row_bytes, nr, xq, xs, xb, mr, k, kp, gp, out, off); return 0;
    default: return -1;
    }
}

#else

int q_direct(int type, const uint8_t *w0, int64_t row_bytes, int nr, const int8_t *xq,
             const float *xs, const float *xb, int64_t mr, int64_t k, int64_t kp, int64_t gp,
             float *out, float *off) {
    (void)type, (void)w0, (void)row_bytes, (void)nr, (void)xq, (void)xs, (void)xb, (void)mr;
    (void)k, (void)kp, (void)gp, (void)out, (void)off;
    return -1;  /* no SIMD tiles here: the caller keeps to the batched path */
}

#endif
