/* Linear layers on GGUF-quantized weights, kept in their blocks (see tandem/layers/quantized.py).
 *
 * Every supported block type is read as one form: per element an unsigned integer u (4-8 bits),
 * per 16 elements a scale a and an offset b, the weight being a * u + b:
 *   Q4_0 u = nibble, b = -8d        Q4_1 u = nibble, b = m        Q8_0 u = q + 128, b = -128d
 *   Q5_0 u = 5 bits, b = -16d       Q5_1 u = 5 bits, b = m        (a = d for these)
 *   Q4_K/Q5_K u = 4/5 bits, a = d * scale, b = -dmin * min       Q6_K u = 6 bits, a = d * scale,
 *   b = -32 a.
 * (With AVX2 alone, Q8_0 keeps its signed q and b = 0: see below.)
 *
 * Each row of x is quantized to 8 bits per block of 32 (scale max|x| / 127, round to nearest
 * even; cpu_quant_x.c), as llama.cpp does, so a dot product is integer multiply-adds:
 *   w . x = sum over lanes of 4 elements: a * ax * (sum u q)   +   sum over 16s: b * ax * (sum q)
 * The integer sums are exact; the float sums run in one fixed order per output (lanes accumulate
 * chunk by chunk, then one reduction; the offsets' sum after), so a row's result never depends on
 * its batch, its tile or the thread count, and speculative verification gets the bits of plain
 * decoding.
 *
 * A tile of NR weight rows is unpacked once into a per-thread scratch (u, lane scales, offsets:
 * L1/L2-resident) and then multiplied with every row of x in tiles of MR rows, so batched steps
 * (prefill, many streams) pay the unpacking once. Up to DIRECT_ROWS rows of x (a decode step, a
 * short verification) cpu_quant_direct.c unpacks in registers instead, with the same arithmetic
 * (the block formats and shared numerics are in quant_format.h). The multiply-adds:
 *   AVX-512 VNNI: vpdpbusd, 64 elements a step (u unsigned, q signed: exact, no saturation);
 *   AVX2: vpmaddubsw + vpmaddwd, 32 a step. vpmaddubsw saturates at 16 bits, fine for u <= 63,
 *     so Q8_0 keeps signed q there and multiplies |q| by sign(q) x (the sign trick);
 *   otherwise: plain C over the same lanes (portable; Arm uses it).
 * F16 and BF16 rows (cpu_quant_half.c) are widened to float32 and multiplied with x unrounded.
 * Segments interleaved 16 rows at a time (Q_R16 in the descriptor: AVX-512 VNNI and AVX2 builds)
 * go to cpu_quant_r16.c for every row count, with numerics of their own (integer sums per block;
 * K-quants per 256, against x as prepare_xk leaves it).
 */
#include "kernels.h"
#include "quant_format.h"
#include "quant_direct.h"

#define XCHUNK 1024 /* rows of x prepared at a time: bounds the prepared copy's memory */
#define RGROUP 64   /* rows of x per work item, next to a block of NR weight rows */
/* Up to this many rows of x, weights are unpacked in registers (cpu_quant_direct.c): same bits,
 * no scratch. */
#if STEP == 64 || (STEP == 32 && defined(__AVX2__))
#define DIRECT_ROWS (2 * MR)
#else
#define DIRECT_ROWS 0
#endif

int64_t tandem_q_block(int type) { return q_block(type); }
int64_t tandem_q_block_bytes(int type) { return q_block_bytes(type); }

/* A weight row in the common form, over kp >= k elements (the tail zero): u [kp], s [kp]
 * (SIGNED_Q8 only), lane scales la [kp / 4], offsets b16 [GROUPS(kp)]. */
typedef struct {
    uint8_t *u;
    int8_t *s;
    float *la, *b16;
} row_form;

static void unpack_row(int type, const uint8_t *row, int64_t k, int64_t kp, row_form r) {
    int64_t block = q_block(type), bytes = q_block_bytes(type);
    float a16[16];
    for (int64_t c = 0, blk = 0; c < k; c += block, blk++) {
        unpack_block(type, row + blk * bytes, r.u + c, r.s ? r.s + c : NULL, a16, r.b16 + c / 16);
        for (int64_t g = 0; g < block / 16; g++) {  /* 4 lanes of 4 elements per scale */
            v4f v = {a16[g], a16[g], a16[g], a16[g]};
            memcpy(r.la + c / 4 + 4 * g, &v, 16);
        }
    }
    memset(r.u + k, 0, (size_t)(kp - k));
    if (r.s) memset(r.s + k, 0, (size_t)(kp - k));
    for (int64_t l = k / 4; l < kp / 4; l++) r.la[l] = 0.0f;
    for (int64_t g = k / 16; g < GROUPS(kp); g++) r.b16[g] = 0.0f;
}

/* y[i, j] (i < mr rows of x, j < nr weight rows) = the lanes' part of the dot products. */
static inline __attribute__((always_inline)) void tile(
        const int8_t *xq, const float *xs, int64_t mr, const row_form *w, int nr, int sgn,
        int64_t kp, float *out /* [MR][NR] */) {
#if STEP == 64
    __m512 acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = _mm512_setzero_ps();
    (void)sgn;
    for (int64_t c = 0; c < kp; c += STEP) {
        __m512i wv[NR];
        __m512 wa[NR];
        for (int j = 0; j < NR; j++) {
            wv[j] = _mm512_loadu_si512(w[j < nr ? j : 0].u + c);
            wa[j] = _mm512_loadu_ps(w[j < nr ? j : 0].la + c / 4);
        }
        for (int i = 0; i < MR && i < mr; i++) {
            __m512i xv = _mm512_loadu_si512(xq + i * kp + c);
            __m512 xsv = _mm512_loadu_ps(xs + i * (kp / 4) + c / 4);
            for (int j = 0; j < NR; j++) {
                __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[j], xv);
                acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(wa[j], xsv),
                                            acc[i][j]);
            }
        }
    }
    for (int i = 0; i < MR && i < mr; i++)
        for (int j = 0; j < NR; j++) out[i * NR + j] = lanes_sum(acc[i][j]);
#elif STEP == 32 && defined(__AVX2__)
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = _mm256_setzero_ps();
    for (int64_t c = 0; c < kp; c += STEP) {
        __m256i wv[NR], ws[NR];
        for (int j = 0; j < NR; j++) {
            wv[j] = _mm256_loadu_si256((const __m256i *)(w[j < nr ? j : 0].u + c));
            if (sgn) ws[j] = _mm256_loadu_si256((const __m256i *)(w[j < nr ? j : 0].s + c));
        }
        for (int i = 0; i < MR && i < mr; i++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + i * kp + c));
            __m256 xsv = _mm256_loadu_ps(xs + i * (kp / 4) + c / 4);
            for (int j = 0; j < NR; j++) {
                __m256i pairs = _mm256_maddubs_epi16(wv[j], sgn ? _mm256_sign_epi8(xv, ws[j]) : xv);
                __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                __m256 wa = _mm256_loadu_ps(w[j < nr ? j : 0].la + c / 4);
                acc[i][j] = _mm256_fmadd_ps(f, _mm256_mul_ps(wa, xsv), acc[i][j]);
            }
        }
    }
    for (int i = 0; i < MR && i < mr; i++)
        for (int j = 0; j < NR; j++) out[i * NR + j] = lanes_sum(acc[i][j]);
#else
    (void)sgn;
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float lanes[8] = {0};
            const uint8_t *u = w[j].u;
            const int8_t *q = xq + i * kp;
            for (int64_t c = 0; c < kp; c += 32)
                for (int l = 0; l < 8; l++) {
                    int64_t e = c + 4 * l;
                    int32_t sum = u[e] * q[e] + u[e + 1] * q[e + 1] + u[e + 2] * q[e + 2]
                                + u[e + 3] * q[e + 3];
                    lanes[l] += (float)sum * (w[j].la[e / 4] * xs[i * (kp / 4) + e / 4]);
                }
            out[i * NR + j] = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
                            + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
        }
#endif
}

/* One weight segment: `rows` rows of `type`, each `row_bytes` long, from `data` (r16: in
 * groups of 16 interleaved rows, cpu_quant_pack.c). */
typedef struct {
    int type, r16;
    int64_t rows, row_bytes;
    const uint8_t *data;
} segment;

#define MAX_SEGMENTS 8

static int read_segments(const int64_t *desc, int64_t n, int64_t k, segment *seg, int64_t *count) {
    int64_t nseg = desc[0], total = 0;
    if (nseg < 1 || nseg > MAX_SEGMENTS) return -1;
    for (int64_t s = 0; s < nseg; s++) {
        const int64_t *d = desc + 1 + 4 * s;
        int r16 = (d[0] & Q_R16) != 0, type = (int)(d[0] & ~(int64_t)Q_R16);
        seg[s] = (segment){type, r16, d[1], d[3], (const uint8_t *)(intptr_t)d[2]};
        int64_t block = q_block(type);
        if (!block || k % block || seg[s].row_bytes != k / block * q_block_bytes(type)
            || (is_half(type) && k % 16) || (r16 && !tandem_q_r16_bytes(type, k)))
            return -1;
        total += seg[s].rows;
    }
    *count = nseg;
    return total == n ? 0 : -1;
}

/* y [m, n] = x [m, k] @ W^T (+ bias [n]) with W [n, k] described by desc: the segment count,
 * then per segment (ggml type, rows, data address, bytes per row), stacked in output order.
 * Returns -1 (nothing written) for a layout it does not take (k not a multiple of the blocks,
 * an unknown type, rows not adding up to n, no memory). */

int tandem_qlinear(const float *x, const int64_t *desc, const float *bias, float *y, int64_t m,
                   int64_t n, int64_t k, int threads) {
    segment seg[MAX_SEGMENTS];
    int64_t nseg, blocks = 0, first[MAX_SEGMENTS + 1];
    if (m < 0 || k <= 0 || k % 32 || read_segments(desc, n, k, seg, &nseg)) return -1;
    init_tables();
    if (m == 0) return 0;
    for (int64_t s = 0; s < nseg; s++) {  /* work items of NR rows, or of 16 interleaved */
        int64_t unit = seg[s].r16 ? 16 : NR;
        first[s] = blocks, blocks += (seg[s].rows + unit - 1) / unit;
    }
    first[nseg] = blocks;
    int64_t kp = (k + STEP - 1) / STEP * STEP, xrows = m < XCHUNK ? m : XCHUNK;
    int64_t gp = GROUPS(kp);
    int kx = 0, plain = 0;  /* x wanted as prepare_xk (interleaved K-quants), prepare_x */
    for (int64_t s = 0; s < nseg; s++) {
        if (seg[s].r16 && q_block(seg[s].type) == 256) kx = 1;
        else plain = 1;
    }
    /* q, xs (kp/4), xb, xi; then prepare_xk's records (XK_BYTES per row and 256) */
    const int64_t cstride = xrows * XK_BYTES;  /* from one 256's records to the next's */
    size_t per_row = (size_t)(kp + kp + 8 * gp) + (kx ? (size_t)(k / 256 * XK_BYTES) : 0);
    uint8_t *xbuf = malloc((size_t)xrows * per_row);
    if (!xbuf) return -1;
    int8_t *xq = (int8_t *)xbuf;
    float *xs = (float *)(xbuf + xrows * kp), *xb = xs + xrows * (kp / 4);
    int32_t *xi = (int32_t *)(xb + xrows * gp);
    uint8_t *xk = (uint8_t *)(xi + xrows * gp);
    int parallel = threads > 1 && m * n * k >= (1 << 18), failed = 0;
    int direct = m <= DIRECT_ROWS;
    (void)parallel;
    for (int64_t m0 = 0; m0 < m; m0 += XCHUNK) {
        int64_t mc = m - m0 < XCHUNK ? m - m0 : XCHUNK;
        /* Work items: (block of NR weight rows, group of RGROUP x rows), block-major, so a
         * thread's run of items mostly reuses the block it has unpacked. */
        int64_t groups = (mc + RGROUP - 1) / RGROUP, items = blocks * groups;
#pragma omp parallel num_threads(threads) if (parallel)
        {
#pragma omp for schedule(static)
            for (int64_t i = 0; i < mc; i++) {
                if (plain)
                    prepare_x(x + (m0 + i) * k, k, kp, xq + i * kp, xs + i * (kp / 4),
                              xb + i * gp, xi + i * gp);
                if (kx)
                    prepare_xk(x + (m0 + i) * k, k, xk + i * XK_BYTES, cstride);
            }
            /* Per thread: NR rows in the common form (none when direct). */
            size_t per_row = (size_t)(kp + (SIGNED_Q8 ? kp : 0) + kp + 4 * gp);
            uint8_t *wbuf = direct ? NULL : malloc(per_row * NR);
            row_form w[NR];
            if (!direct && !wbuf) {
#pragma omp atomic write
                failed = 1;
            } else if (!direct) {
                for (int j = 0; j < NR; j++) {
                    uint8_t *base = wbuf + j * per_row;
                    w[j].u = base;
                    w[j].s = SIGNED_Q8 ? (int8_t *)(base + kp) : NULL;
                    w[j].la = (float *)(base + kp + (SIGNED_Q8 ? kp : 0));
                    w[j].b16 = w[j].la + kp / 4;
                }
            }
            int64_t unpacked = -1;
#pragma omp for schedule(static)
            for (int64_t item = 0; item < items; item++) {
                if (!direct && !wbuf) continue;
                int64_t bi = item / groups, g0 = (item % groups) * RGROUP;
                int64_t s = 0;
                while (first[s + 1] <= bi) s++;
                int64_t unit = seg[s].r16 ? 16 : NR, r0 = (bi - first[s]) * unit;
                int64_t nr = seg[s].rows - r0 < unit ? seg[s].rows - r0 : unit, col = r0;
                for (int64_t t = 0; t < s; t++) col += seg[t].rows;
                int64_t g1 = mc - g0 < RGROUP ? mc : g0 + RGROUP;
                if (seg[s].r16) {
                    const int K = q_block(seg[s].type) == 256;
                    q_r16(seg[s].type, seg[s].data + r0 / 16 * tandem_q_r16_bytes(seg[s].type, k),
                          (int)nr, xq + g0 * kp, xs + g0 * (kp / 4), xi + g0 * gp,
                          K ? xk + g0 * XK_BYTES : NULL, cstride, g1 - g0, k, kp, gp,
                          bias ? bias + col : NULL, y + (m0 + g0) * n + col, n);
                    continue;
                }
                int sgn = SIGNED_Q8 && seg[s].type == T_Q8_0, half = is_half(seg[s].type);
                int offsets = !sgn && !half;
                if (bi != unpacked && !direct && !half) {
                    for (int j = 0; j < nr; j++) {
                        row_form r = w[j];
                        if (!sgn) r.s = NULL;
                        unpack_row(seg[s].type, seg[s].data + (r0 + j) * seg[s].row_bytes, k, kp, r);
                    }
                    unpacked = bi;
                }
                const int64_t tile_rows = direct ? DIRECT_ROWS : MR;
                for (int64_t i0 = g0; i0 < g1; i0 += tile_rows) {
                    int64_t mr = g1 - i0 < tile_rows ? g1 - i0 : tile_rows;
                    float out[2 * MR * NR], off[2 * MR * NR];
                    if (half)
                        q_half(seg[s].type, seg[s].data + r0 * seg[s].row_bytes, seg[s].row_bytes,
                               (int)nr, x + (m0 + i0) * k, mr, k, out);
                    else if (direct)
                        q_direct(seg[s].type, seg[s].data + r0 * seg[s].row_bytes,
                                 seg[s].row_bytes, (int)nr, xq + i0 * kp, xs + i0 * (kp / 4),
                                 xb + i0 * gp, mr, k, kp, gp, out, off);
                    else if (sgn) /* two inlined copies: no test of sgn inside the loop */
                        tile(xq + i0 * kp, xs + i0 * (kp / 4), mr, w, (int)nr, 1, kp, out);
                    else
                        tile(xq + i0 * kp, xs + i0 * (kp / 4), mr, w, (int)nr, 0, kp, out);
                    for (int64_t i = 0; i < mr; i++)
                        for (int64_t j = 0; j < nr; j++) {
                            float v = out[i * NR + j];
                            if (offsets)
                                v += direct ? off[i * NR + j]
                                            : offsets_dot(w[j].b16, xb + (i0 + i) * gp, gp);
                            if (bias) v += bias[col + j];
                            y[(m0 + i0 + i) * n + col + j] = v;
                        }
                }
            }
            free(wbuf);
        }
    }
    free(xbuf);
    return failed ? -1 : 0;
}
