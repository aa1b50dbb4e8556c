/* The quantized matmul on weights interleaved 16 rows at a time (layout: cpu_quant_pack.c;
 * 16 lanes: quant_r16_vec.h). One vpdpbusd (AVX-512 VNNI; AVX2: vpmaddubsw + vpmaddwd on two
 * halves; NEON and plain C: sdot's operation on four quarters) multiplies 4 bytes of an x row,
 * broadcast, with the same 4 elements of 16 weight rows, so 16 outputs fill 16 lanes and a
 * block's sums stay integers (exact) until the block's scale: per (block of 32, 16 rows, x row)
 * 8 vpdpbusd, one convert and one or two FMAs, and no reduction across lanes.
 * Numerics, per output y = x . w, blocks in order, each output in its own lane.
 * 32-element types take x quantized per 32 (prepare_x: q, step dx, sums qs16 per 16):
 *   Q4_0  acc += float(sum u q - 8 qs32) * (d * dx)   Q5_0, Q8_0  the same with 16, 128
 *   Q4_1  acc += float(sum u q) * (d * dx);  acc += m * (dx * float(qs32))   Q5_1  the same
 * K-quants take x as prepare_xk leaves it (per 256 a step D, per 32 an integer e in 1..8: x =
 * D e q), so every scale goes into exact integer sums and the float work is once per 256:
 *   Q4_K  S = sum_j sc_j e_j (sum_j u q), M = sum_j mn_j e_j qs32_j (j: sub-blocks of 32);
 *         acc += float(S) * (d * D);  acc += float(M) * (-dmin * D)      Q5_K  the same
 *   Q6_K  S = sum_G sc_G e_G (sum_G u q - 32 qs16_G) (G: groups of 16); acc += float(S) * (d * D)
 * (each * and + one float32 rounding, FMAs fused). The integer sums stay within int32 (Q6_K's:
 * 256 * 32 * 127 * 128 * 8 < 2^31) and AVX2's 16-bit pair sums within int16 (vi_sdot). Every
 * output is computed by this one sequence whatever its batch, tile or thread, so a row's result
 * never depends on them, and the same on every kind of CPU (integer sums are exact on all).
 */
#include "quant_r16_vec.h"

#define RM 6 /* x rows a pass: 8 weight registers + RM accumulators + sums */
#ifndef CHUNK_ABOVE
#define CHUNK_ABOVE 16384 /* bytes of a group's row beyond which passes take turns (r16_pass) */
#endif
#define PF 6   /* K-quant blocks (2,304-3,360 bytes) are prefetched PF ahead, and */
#define PF32 4 /* 32-element ones (288-544 bytes) PF32 ahead. Weights read from memory (a model
                * larger than the L3), one x row, Intel Xeon 6/167, 2 threads: Q4_K/Q5_K/Q6_K at
                * 16 GB/s with PF 2, 20-21 GB/s with PF 4-8 (lower again at 12); Q4_1 and Q8_0 at
                * 23-27 GB/s with PF32 4, no better at 8 or 16. From the caches, PF 2 and 6 time
                * the same at 1, 9 and 16 x rows. */
#define INL static inline __attribute__((always_inline))

/* Eighth j of a K-quant block of bb bytes (2,304-3,360: 36-53 lines) into the cache, an eighth
 * per sub-block (Q4_K/Q5_K: a pair per pair of sub-blocks), at the pace they are read: a burst
 * of the whole block at its start fills the miss buffers and stalls the core at the prefetches.
 * A 32-element block (5-9 lines) is fetched at once. */
INL void prefetch_eighth(const uint8_t *block, int64_t bb, int j) {
    for (int64_t o = (j * bb / 8) & ~63; o < (j + 1) * bb / 8; o += 64)
        r16_prefetch(block + o);
}

/* Q8_0: sum over a block's 8 words w (vi_q8w of the words at p, half h) of q[w] . x[4w ..].
 * AVX2: one chain, kept in order by the empty asm (gcc re-associates it into a tree whose sums
 * spill); elsewhere two chains (vpdpbusd's latency), then one add. */
INL v16i q8_dot8(const v16i *W, const uint8_t *p, int h, const int8_t *x) {
    v16i s0 = vi_zero();
#if R16_HALVES == 2
    for (int w = 0; w < 8; w++) {
        s0 = vi_q8dot4(s0, W[w], p + 64 * w, h, x + 4 * w);
        __asm__("" : "+x"(s0));
    }
    return s0;
#else
    v16i s1 = vi_zero();
    for (int w = 0; w < 8; w += 2) {
        s0 = vi_q8dot4(s0, W[w], p + 64 * w, h, x + 4 * w);
        s1 = vi_q8dot4(s1, W[w + 1], p + 64 * w + 64, h, x + 4 * w + 4);
    }
    return vi_add(s0, s1);
#endif
}

/* Words 0-3 the low nibbles of the 4 vectors at v, 4-7 their high nibbles (Q4_0/Q4_1: bytes
 * qs[4w..] hold elements 4w.. and 16 + 4w..). */
INL void nibbles4(const uint8_t *v, v16i *W, int h) {
    const v16i low4 = vi_bytes(0x0F);
    for (int w = 0; w < 4; w++) {
        v16i q = vi_load(v + 64 * w, h);
        W[w] = vi_and(q, low4);
        W[w + 4] = vi_and(vi_srl16(q, 4), low4);
    }
}

/* Q5's fifth bits (32 per lane at qh, permuted at load) ORed into the nibble words W of words
 * w0 .. w0 + n - 1: bit 8i + w of a lane goes to bit 4 of byte i of word w. */
INL void fifth_bits(v16i *W, const uint8_t *qh, int h, int w0, int n) {
    const v16i hb = vi_load(qh, h), bit4 = vi_bytes(0x10);
    for (int u = 0; u < n; u++) {
        const int w = w0 + u;
        W[u] = vi_or(W[u], vi_and(w <= 4 ? vi_sll16(hb, 4 - w) : vi_srl16(hb, w - 4), bit4));
    }
}

/* K-quant weight words held at once: AVX2 takes a sub-block's 8 in two halves of 4 (its 16
 * registers then hold the words and the sums of 6 x rows without spilling), the others all 8.
 * The integer sums are exact, so the split changes no bit. */
#define KW (R16_HALVES == 2 ? 4 : 8)

/* Row i's parts of a 256's prepare_xk records (quant_format.h), from the first row's at r. */
INL const int8_t *xk_q(const uint8_t *r, int i) { return (const int8_t *)(r + i * XK_BYTES); }
INL const int32_t *xk_w(const uint8_t *r, int i) {
    return (const int32_t *)(const void *)(r + i * XK_BYTES + XK_W);
}
INL const int32_t *xk_e(const uint8_t *r, int i) {
    return (const int32_t *)(const void *)(r + i * XK_BYTES + XK_E);
}
INL float xk_d(const uint8_t *r, int i) {
    return *(const float *)(const void *)(r + i * XK_BYTES + XK_D);
}

/* Sub-block j + odd of a Q4_K/Q5_K block g (odd: the high nibbles of the same bytes) against
 * mrt rows of x (records at xr): S [i] += sc_j e_j (sum u q). */
INL void k_sub(v16i *S, const uint8_t *g, const uint8_t *xr, const int mrt, const int h,
               const int k5, const int j0, const int odd) {
    const int j = j0 + odd;
    const uint8_t *v = g + (k5 ? 832 : 320) + 512 * (j0 / 2);
    const v16i low4 = vi_bytes(0x0F), sc = vi_scales(g + 64 + 16 * j, 0, h);
    for (int w0 = 0; w0 < 8; w0 += KW) {
        v16i W[KW];  /* loaded again for the high nibbles: held, they spilled */
        for (int w = 0; w < KW; w++) {
            v16i q = vi_load(v + 64 * (w0 + w), h);
            W[w] = vi_and(odd ? vi_srl16(q, 4) : q, low4);
        }
        if (k5) fifth_bits(W, g + 320 + 64 * j, h, w0, KW);
        for (int i = 0; i < mrt; i++)  /* pair sums: 16 bits for 8 or 4 words */
            S[i] = vi_sdot(S[i], W, KW, xk_q(xr, i) + 32 * j + 4 * w0,
                           vi_times(sc, xk_e(xr, i)[j]), k5 || KW < 8 ? 4 : 8);
    }
}

/* Sub-block j = 4n + r of a Q6_K block g (half n, quarter r, as ggml's order) against mrt rows of
 * x: S [i] += sum over its two 16-groups G of sc_G e_j (sum u q). */
INL void q6_sub(v16i *S, const uint8_t *g, const uint8_t *xr, const int mrt, const int h,
                const int n, const int r) {
    const int j = 4 * n + r;
    const uint8_t *ql = g + 288, *qh = g + 288 + 2048;
    const v16i low4 = vi_bytes(0x0F), high2 = vi_bytes(0x30);
    /* words 0-3: elements 0-15 (group 2j, its scale sc0), 4-7: 16-31 (2j + 1) */
    const v16i sc0 = vi_scales(g + 32 + 32 * j, 1, h), sc1 = vi_scales(g + 48 + 32 * j, 1, h);
    for (int w0 = 0; w0 < 8; w0 += KW) {
        v16i W[KW];
        for (int u = 0; u < KW; u++) {
            const int w = w0 + u;
            v16i l = vi_load(ql + 64 * (16 * n + 8 * (r & 1) + w), h);
            /* quarter r's 2 high bits (bits 2r, 2r + 1 of each qh byte) to bits 4-5: one
             * shift within 16-bit lanes (none for r = 2), then the mask drops what crossed */
            const v16i qb = vi_load(qh + 64 * (8 * n + w), h);
            const v16i hb = r < 2 ? vi_sll16(qb, 4 - 2 * r) : r == 2 ? qb : vi_srl16(qb, 2);
            W[u] = vi_or(vi_and(r >= 2 ? vi_srl16(l, 4) : l, low4), vi_and(hb, high2));
        }
        for (int i = 0; i < mrt; i++) {
            const int8_t *x = xk_q(xr, i) + 32 * j;
            const int32_t ex = xk_e(xr, i)[j];
            for (int u = 0; u < KW; u += 4)
                S[i] = vi_sdot(S[i], W + u, 4, x + 4 * (w0 + u), vi_times(w0 + u ? sc1 : sc0, ex),
                               2);
        }
    }
}

/* One group (16 rows) against mrt <= RM rows of x: acc [i] += every block's terms. */
INL void group_tile(const int type, const int mrt, const int h, const uint8_t *grp,
                    const int8_t *xq, const float *xs, const int32_t *xi, const uint8_t *xk,
                    int64_t cstride, int64_t k, int64_t kp, int64_t gp, v16f *acc) {
    const int64_t block = q_block(type), bb = q_r16_block_bytes(type);
    const int q5 = type == T_Q5_0 || type == T_Q5_1;
    for (int64_t b = 0; b < k / block; b++) {
        const uint8_t *g = grp + b * bb;
        const int64_t e0 = b * block;
        for (int64_t o = 0; o < bb && h == 0 && block == 32; o += 64)  /* PF32 blocks ahead */
            r16_prefetch(g + PF32 * bb + o);
        if (block == 32) {
            v16f d = vf_half(g, h), m = vf_zero();
            v16i W[8];
            if (type == T_Q8_0)  /* q, or u = q + 128 (R16_Q8_SIGNED 0) */
                for (int w = 0; w < 8; w++) W[w] = vi_q8w(g + 32 + 64 * w, h);
            else {  /* after d (and m): Q5's permuted fifth bits, then the nibbles */
                const int64_t off = type == T_Q4_1 || type == T_Q5_1 ? 64 : 32;
                nibbles4(g + off + (q5 ? 64 : 0), W, h);
                if (q5) fifth_bits(W, g + off, h, 0, 8);
            }
            if (type == T_Q4_1 || type == T_Q5_1) m = vf_half(g + 32, h);
            for (int i = 0; i < mrt; i++) {
                const float dx = xs[i * (kp / 4) + e0 / 4];
                const int32_t qs = xi[i * gp + e0 / 16] + xi[i * gp + e0 / 16 + 1];
                /* the same integer either way; u <= 15 or 31 sums in 16 bits on AVX2 */
                v16i s = type == T_Q8_0 ? q8_dot8(W, g + 32, h, xq + i * kp + e0)
                                        : vi_dot8g(W, xq + i * kp + e0, q5 ? 4 : 8);
                if (type == T_Q4_0) s = vi_sub1(s, 8 * qs);
                if (type == T_Q5_0) s = vi_sub1(s, 16 * qs);
                if (type == T_Q8_0 && !R16_Q8_SIGNED) s = vi_sub1(s, 128 * qs);
                acc[i] = vf_fma(vf_cvt(s), vf_mul(d, vf_set1(dx)), acc[i]);
                if (type == T_Q4_1 || type == T_Q5_1)
                    acc[i] = vf_fma(m, vf_set1(dx * (float)qs), acc[i]);
            }
        } else if (type == T_Q4_K || type == T_Q5_K) {
            const int k5 = type == T_Q5_K;  /* + sub-block j's fifth bits at 320 + 64 j */
            const uint8_t *xr = xk + b * cstride;  /* x row i's record: xr + i * XK_BYTES */
            v16i S[RM];  /* sum over sub-blocks j of sc_j e_j (sum u q): exact */
            for (int i = 0; i < mrt; i++) S[i] = vi_zero();
            for (int j = 0; j < 8; j += 2) {  /* qs bytes 32(j / 2)..: j even low, odd high */
                if (h == 0)  /* this pair's eighths of the block PF ahead */
                    prefetch_eighth(g + PF * bb, bb, j), prefetch_eighth(g + PF * bb, bb, j + 1);
                k_sub(S, g, xr, mrt, h, k5, j, 0);  /* two calls: the nibble's half a constant */
                k_sub(S, g, xr, mrt, h, k5, j, 1);
            }
            v16i mins[4];  /* lane pairs (mn_2p, mn_2p+1) */
            for (int p = 0; p < 4; p++)
                mins[p] = vi_pairs(g + 192 + 32 * p, g + 208 + 32 * p, 0, h);
            v16f d = vf_half(g, h), dmin = vf_neg(vf_half(g + 32, h));
            for (int i = 0; i < mrt; i++) {
                const int32_t *ew = xk_w(xr, i);  /* prepare_xk's pairs of e (sum q) */
                v16i M = vi_zero();  /* sum over j of mn_j e_j (sum q) */
                for (int p = 0; p < 4; p++) M = vi_madd2(M, mins[p], ew[p]);
                const float D = xk_d(xr, i);  /* x's step for the 256 */
                acc[i] = vf_fma(vf_cvt(S[i]), vf_mul(d, vf_set1(D)), acc[i]);
                acc[i] = vf_fma(vf_cvt(M), vf_mul(dmin, vf_set1(D)), acc[i]);
            }
        } else {  /* T_Q6_K: sub-block j = elements 32j..: half n, quarter r (as ggml's order) */
            const uint8_t *xr = xk + b * cstride;
            v16i S[RM];  /* sum over 16-groups G of sc_G e (sum u q): exact */
            for (int i = 0; i < mrt; i++) S[i] = vi_zero();
            for (int n = 0; n < 2; n++) {  /* four calls: the quarter r a constant in each */
                if (h == 0) prefetch_eighth(g + PF * bb, bb, 4 * n);
                q6_sub(S, g, xr, mrt, h, n, 0);
                if (h == 0) prefetch_eighth(g + PF * bb, bb, 4 * n + 1);
                q6_sub(S, g, xr, mrt, h, n, 1);
                if (h == 0) prefetch_eighth(g + PF * bb, bb, 4 * n + 2);
                q6_sub(S, g, xr, mrt, h, n, 2);
                if (h == 0) prefetch_eighth(g + PF * bb, bb, 4 * n + 3);
                q6_sub(S, g, xr, mrt, h, n, 3);
            }
            v16i scs[8];  /* lane pairs (sc_2j, sc_2j+1) */
            for (int j = 0; j < 8; j++) scs[j] = vi_pairs(g + 32 + 32 * j, g + 48 + 32 * j, 1, h);
            v16f d = vf_half(g, h);
            for (int i = 0; i < mrt; i++) {
                const int32_t *ew = xk_w(xr, i);
                v16i O = vi_zero();  /* sum over G of sc_G e (sum q): u's offset of 32 */
                for (int j = 0; j < 8; j++) O = vi_madd2(O, scs[j], ew[4 + j]);
                const float D = xk_d(xr, i);
                acc[i] = vf_fma(vf_cvt(vi_sub(S[i], vi_sll32(O, 5))), vf_mul(d, vf_set1(D)),
                                acc[i]);
            }
        }
    }
}

/* One pass's sums (+ bias) stored: lanes of half h, mrt rows of y. */
INL void store_pass(const v16f *acc, const int mrt, int nr, const int h, const float *bias,
                    float *y, int64_t ldy) {
    v16f bv = bias ? vf_load_n(bias, nr, h) : vf_zero();
    for (int i = 0; i < mrt; i++)
        vf_store_n(y + i * ldy, bias ? vf_add(acc[i], bv) : acc[i], nr, h);
}

INL void r16_pass(const int type, const int mrt, const uint8_t *grp, int nr, const int8_t *xq,
                  const float *xs, const int32_t *xi, const uint8_t *xk, int64_t cstride,
                  int64_t k, int64_t kp, int64_t gp, const float *bias, float *y, int64_t ldy) {
    /* With several passes (AVX2, NEON, C) over a long row (a group's bytes past CHUNK_ABOVE) the
     * passes take turns every 256 elements, so a pass after the first finds the block in L1
     * (passes over the whole row would re-read it from L2). A short row stays in L1 anyway, and
     * with one pass (AVX-512) there is nothing to share: both go whole, sparing the turns'
     * overhead. Each lane's sums go in block order either way: the same bits. */
    const int64_t block = q_block(type), bb = q_r16_block_bytes(type);
    const int K = block == 256;
    if (R16_HALVES > 1 && k / block * bb > CHUNK_ABOVE) {
        v16f acc[R16_HALVES][RM];
        for (int h = 0; h < R16_HALVES; h++)
            for (int i = 0; i < mrt; i++) acc[h][i] = vf_zero();
        for (int64_t c = 0; c < k; c += 256) {
            const int64_t len = k - c < 256 ? k - c : 256;
            for (int h = 0; h < R16_HALVES && 16 / R16_HALVES * h < nr; h++)
                group_tile(type, mrt, h, grp + c / block * bb, xq + c, xs + c / 4, xi + c / 16,
                           K ? xk + c / 256 * cstride : NULL, cstride, len, kp, gp, acc[h]);
        }
        for (int h = 0; h < R16_HALVES && 16 / R16_HALVES * h < nr; h++)
            store_pass(acc[h], mrt, nr, h, bias, y, ldy);
        return;
    }
    for (int h = 0; h < R16_HALVES && 16 / R16_HALVES * h < nr; h++) {
        v16f acc[RM];
        for (int i = 0; i < mrt; i++) acc[i] = vf_zero();
        group_tile(type, mrt, h, grp, xq, xs, xi, xk, cstride, k, kp, gp, acc);
        store_pass(acc, mrt, nr, h, bias, y, ldy);
    }
}

/* One copy per type and pass height (1-RM x rows), the switches folded away. */
#define R16_FOR(T)                                                                          \
    static void r16_##T(const uint8_t *grp, int nr, const int8_t *xq, const float *xs,      \
                        const int32_t *xi, const uint8_t *xk, int64_t cs, int64_t mr,       \
                        int64_t k, int64_t kp, int64_t gp, const float *bias, float *y,     \
                        int64_t ldy) {                                                      \
        for (int64_t i0 = 0; i0 < mr; i0 += RM) {                                           \
            const int8_t *q = xq + i0 * kp;                                                 \
            const float *s = xs + i0 * (kp / 4);                                            \
            const int32_t *t = xi + i0 * gp;                                                \
            const uint8_t *r = xk ? xk + i0 * XK_BYTES : NULL;                              \
            float *o = y + i0 * ldy;                                                        \
            switch (mr - i0 < RM ? mr - i0 : RM) {                                          \
            case 1: r16_pass(T, 1, grp, nr, q, s, t, r, cs, k, kp, gp, bias, o, ldy); break; \
            case 2: r16_pass(T, 2, grp, nr, q, s, t, r, cs, k, kp, gp, bias, o, ldy); break; \
            case 3: r16_pass(T, 3, grp, nr, q, s, t, r, cs, k, kp, gp, bias, o, ldy); break; \
            case 4: r16_pass(T, 4, grp, nr, q, s, t, r, cs, k, kp, gp, bias, o, ldy); break; \
            case 5: r16_pass(T, 5, grp, nr, q, s, t, r, cs, k, kp, gp, bias, o, ldy); break; \
            default: r16_pass(T, RM, grp, nr, q, s, t, r, cs, k, kp, gp, bias, o, ldy);      \
            }                                                                               \
        }                                                                                   \
    }
R16_FOR(T_Q4_0) R16_FOR(T_Q4_1) R16_FOR(T_Q5_0) R16_FOR(T_Q5_1) R16_FOR(T_Q8_0)
R16_FOR(T_Q4_K) R16_FOR(T_Q5_K) R16_FOR(T_Q6_K)

void q_r16(int type, const uint8_t *grp, int nr, const int8_t *xq, const float *xs,
           const int32_t *xi, const uint8_t *xk, int64_t cstride, int64_t mr, int64_t k,
           int64_t kp, int64_t gp, const float *bias, float *y, int64_t ldy) {
#define R16_CASE(T)                                                                   \
    case T: r16_##T(grp, nr, xq, xs, xi, xk, cstride, mr, k, kp, gp, bias, y, ldy); break;
    switch (type) {
    R16_CASE(T_Q4_0) R16_CASE(T_Q4_1) R16_CASE(T_Q5_0) R16_CASE(T_Q5_1) R16_CASE(T_Q8_0)
    R16_CASE(T_Q4_K) R16_CASE(T_Q5_K) R16_CASE(T_Q6_K)
    }
#undef R16_CASE
}
