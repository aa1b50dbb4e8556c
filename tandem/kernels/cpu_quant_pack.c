/* Weights interleaved 16 rows at a time (cpu_quant_r16.c multiplies them), and rows of any
 * quantized table as float32 (tandem_q_rows: embedding gathers, the reference dequantization).
 * move_block is the one place in the kernels that reads a GGUF block's bytes: the kernel and
 * group_row read the layout it writes.
 *
 * The interleaved layout keeps a tensor's bytes, reordered (Q4_K's packed 6-bit scales are
 * stored one byte each: 148 bytes a row-block instead of 144). For 16 rows and one block
 * position ("a group block", 32 elements; K-quants 256), the quant bytes go 4 at a time: 64
 * bytes hold the same 4 bytes of each of the 16 rows (byte 4r + i: row r's byte i), so one
 * vpdpbusd against x's 4 bytes, broadcast, gives 16 rows' partial sums in 16 lanes, and a
 * block's integer sums stay in integers until its one scale. Layouts (bytes):
 *   Q4_0  [d 16 x f16][qs 4 x 64: qs bytes 4v..4v+3]                        288 = 16 x 18
 *   Q4_1  [d][m][qs as Q4_0]                                                320 = 16 x 20
 *   Q5_0  [d][qh' 64][qs as Q4_0]                                           352 = 16 x 22
 *   Q5_1  [d][m][qh' 64][qs as Q4_0]                                        384 = 16 x 24
 *   Q8_0  [d][qs 8 x 64: q, or q + 128 for vpdpbusd (R16_Q8_SIGNED 0)]      544 = 16 x 34
 *   Q4_K  [d][dmin][scale 8 x 16][min 8 x 16][qs 32 x 64]                 2368 = 16 x 148
 *   Q5_K  [d][dmin][scale][min][qh' 8 x 64: sub-block j's][qs 32 x 64]      2880 = 16 x 180
 *   Q6_K  [d][scale 16 x 16 (int8)][ql 32 x 64][qh 16 x 64]               3360 = 16 x 210
 * ([X 16 x 16]: X of group or sub-block g for row r at 16 g + r.) Q5's 32 fifth bits (qh, bit e
 * for element e; Q5_K: those of each sub-block of 32) are permuted per row so that the kernel
 * puts them in place by one shift:
 * qh' bit 8i + w = the fifth bit of the element in byte i of word w, which is element 4w + i
 * (words 0-3 the qs bytes' low nibbles, 4-7 their high nibbles). Rows past the tensor's end
 * are zero (scale 0: they add nothing and are never stored).
 */
#include "kernels.h"
#include "quant_format.h"

/* Bytes of 16 interleaved rows of k elements; 0 for a type that is never interleaved (F16,
 * BF16) or a k its blocks do not divide. */
int64_t tandem_q_r16_bytes(int type, int64_t k) {
    int64_t block = q_block(type), bb = q_r16_block_bytes(type);
    if (!bb || k <= 0 || k % block) return 0;
    return k / block * bb;
}

/* Byte b of a row's quant bytes (qs, or Q6_K's ql then qh, in the file's order) in a run of
 * 64-byte vectors at v: byte b % 4 of row r's word b / 4 (row r's 4 bytes of word w at 64 w +
 * 4 r). */
#define QBYTE(v, b, r) ((v)[64 * ((b) / 4) + 4 * (r) + (b) % 4])

/* The 6-bit scale and min j of a Q4_K/Q5_K block (12 packed bytes). */
static inline void k_scale_min(const uint8_t *q, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | (q[j - 4] >> 6) << 4;
        *mn = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

/* Q5's fifth bits of 32 elements: bit e for element e -> bit 8i + w for element 4w + i. */
static uint32_t q5_spread(uint32_t h) {
    uint32_t out = 0;
    for (int w = 0; w < 8; w++)
        for (int i = 0; i < 4; i++) out |= ((h >> (4 * w + i)) & 1u) << (8 * i + w);
    return out;
}

/* One GGUF block p of row r into its place in the group block g. */
static void move_block(int type, const uint8_t *p, uint8_t *g, int r) {
    switch (type) {
    case T_Q4_0: case T_Q4_1: case T_Q5_0: case T_Q5_1: case T_Q8_0: {
        const int one = type == T_Q4_1 || type == T_Q5_1, five = type == T_Q5_0 || type == T_Q5_1;
        const int head = 32 * (1 + one); /* d (and m) of the 16 rows; then Q5's qh', the qs */
        memcpy(g + 2 * r, p, 2);
        if (one) memcpy(g + 32 + 2 * r, p + 2, 2);
        if (five) {
            uint32_t h;
            memcpy(&h, p + 2 + 2 * one, 4);
            h = q5_spread(h);
            memcpy(g + head + 4 * r, &h, 4);
        }
        const uint8_t *qs = p + 2 + 2 * one + 4 * five;
        for (int b = 0; b < (type == T_Q8_0 ? 32 : 16); b++) /* Q8_0: q + 128 for vpdpbusd */
            QBYTE(g + head + 64 * five, b, r) = (uint8_t)(type == T_Q8_0 && !R16_Q8_SIGNED
                                                           ? qs[b] ^ 0x80 : qs[b]);
        break;
    }
    case T_Q4_K: case T_Q5_K: {
        const int k5 = type == T_Q5_K; /* qh [32] at p + 16: byte l bit j, element 32 j + l's */
        memcpy(g + 2 * r, p, 2), memcpy(g + 32 + 2 * r, p + 2, 2);
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            k_scale_min(p + 4, j, &sc, &mn);
            g[64 + 16 * j + r] = (uint8_t)sc, g[192 + 16 * j + r] = (uint8_t)mn;
            if (k5) {
                uint32_t h = 0;
                for (int l = 0; l < 32; l++) h |= (uint32_t)((p[16 + l] >> j) & 1) << l;
                h = q5_spread(h);
                memcpy(g + 320 + 64 * j + 4 * r, &h, 4);
            }
        }
        for (int b = 0; b < 128; b++) QBYTE(g + (k5 ? 832 : 320), b, r) = p[16 + 32 * k5 + b];
        break;
    }
    case T_Q6_K: /* ql [128], qh [64], scales [16], d */
        memcpy(g + 2 * r, p + 208, 2);
        for (int s = 0; s < 16; s++) g[32 + 16 * s + r] = p[192 + s];
        for (int b = 0; b < 192; b++) QBYTE(g + 288, b, r) = p[b];
        break;
    }
}

/* rows [rows, row_bytes] of `type` -> dst [ceil(rows / 16), tandem_q_r16_bytes(type, k)]. */
int tandem_q_r16_pack(int type, const uint8_t *src, int64_t rows, int64_t row_bytes, int64_t k,
                      uint8_t *dst) {
    int64_t gbytes = tandem_q_r16_bytes(type, k), block = q_block(type);
    int64_t bb = q_r16_block_bytes(type), bytes = q_block_bytes(type);
    if (!gbytes || row_bytes != k / block * bytes || rows < 0) return -1;
    memset(dst, 0, (size_t)((rows + 15) / 16 * gbytes));
    for (int64_t row = 0; row < rows; row++)
        for (int64_t b = 0; b < k / block; b++)
            move_block(type, src + row * row_bytes + b * bytes, dst + row / 16 * gbytes + b * bb,
                       (int)(row % 16));
    return 0;
}

/* Row r of the group block g as float32, out [block]: each element a * u + b, with a and b
 * its block's (K-quants: sub-block's) scale and offset, as the kernel reads them; exact (a * u
 * is, and + b rounds once, as ggml's own dequantization). Q8_0 as u = q + 128, so every build
 * gives the same values. */
static void group_row(int type, const uint8_t *g, int r, float *out) {
    switch (type) {
    case T_Q4_0: case T_Q4_1: case T_Q5_0: case T_Q5_1: case T_Q8_0: {
        const int one = type == T_Q4_1 || type == T_Q5_1, five = type == T_Q5_0 || type == T_Q5_1;
        const int head = 32 * (1 + one);
        const float d = f16_at(g + 2 * r);
        const float b = one ? f16_at(g + 32 + 2 * r) : type == T_Q4_0 ? -8.0f * d
                      : type == T_Q5_0 ? -16.0f * d : -128.0f * d;
        const uint8_t *v = g + head + 64 * five;
        uint32_t h = 0; /* Q5: element e's fifth bit at bit 8 (e % 4) + e / 4 */
        if (five) memcpy(&h, g + head + 4 * r, 4);
        for (int e = 0; e < 32; e++) {
            const int u = type == T_Q8_0 ? QBYTE(v, e, r) ^ (R16_Q8_SIGNED ? 0x80 : 0)
                        : (QBYTE(v, e % 16, r) >> (4 * (e / 16)) & 15)
                          | (int)(h >> (8 * (e % 4) + e / 4) & 1) << 4;
            out[e] = d * (float)u + b;
        }
        break;
    }
    case T_Q4_K: case T_Q5_K: {
        const int k5 = type == T_Q5_K;
        const float d = f16_at(g + 2 * r), dmin = f16_at(g + 32 + 2 * r);
        for (int j = 0; j < 8; j++) { /* sub-block j: nibble j % 2 of bytes 32 (j / 2) .. */
            const float a = d * (float)g[64 + 16 * j + r], b = -(dmin * (float)g[192 + 16 * j + r]);
            uint32_t h = 0;
            if (k5) memcpy(&h, g + 320 + 64 * j + 4 * r, 4);
            const uint8_t *v = g + (k5 ? 832 : 320);
            for (int l = 0; l < 32; l++) {
                const int u = (QBYTE(v, 32 * (j / 2) + l, r) >> (4 * (j % 2)) & 15)
                              | (int)(h >> (8 * (l % 4) + l / 4) & 1) << 4;
                out[32 * j + l] = a * (float)u + b;
            }
        }
        break;
    }
    case T_Q6_K: { /* element 128 n + 32 q + l: ql byte 64 n + 32 (q % 2) + l, nibble q / 2, and
                    * bits 2q of qh byte 32 n + l */
        const float d = f16_at(g + 2 * r);
        for (int e = 0; e < 256; e++) {
            const int n = e / 128, q = e % 128 / 32, l = e % 32;
            const float a = d * (float)(int8_t)g[32 + 16 * (e / 16) + r];
            const int u = (QBYTE(g + 288, 64 * n + 32 * (q % 2) + l, r) >> (4 * (q / 2)) & 15)
                          | (QBYTE(g + 288, 128 + 32 * n + l, r) >> (2 * q) & 3) << 4;
            out[e] = a * (float)u + -32.0f * a;
        }
        break;
    }
    }
}

/* Rows `ids` [count] of a [rows, k] weight of `type` (row_bytes each) as float32, out [count, k]:
 * the embedding lookup of a quantized table, and the reference dequantization. With Q_R16 in
 * the type the rows are interleaved (tandem_q_r16_pack) and read in place; in GGUF's order each
 * block is first moved to a group block of its own, so both layouts give the same values. */
int tandem_q_rows(int type, const uint8_t *data, int64_t row_bytes, const int64_t *ids,
                  int64_t count, int64_t k, float *out) {
    const int r16 = (type & Q_R16) != 0;
    type &= ~Q_R16;
    const int64_t block = q_block(type), bytes = q_block_bytes(type), bb = q_r16_block_bytes(type);
    if (!block || k % block || row_bytes != k / block * bytes || (r16 && !bb)) return -1;
    uint8_t g[16 * 210]; /* a GGUF row's block as row 0 of a group block (Q6_K's is the largest) */
    for (int64_t n = 0; n < count; n++) {
        float *o = out + n * k;
        for (int64_t b = 0; b < k / block; b++) {
            if (is_half(type)) {
                o[b] = half_at(type, data + ids[n] * row_bytes + 2 * b);
            } else if (r16) {
                group_row(type, data + (ids[n] / 16 * (k / block) + b) * bb, (int)(ids[n] % 16),
                          o + b * block);
            } else {
                move_block(type, data + ids[n] * row_bytes + b * bytes, g, 0);
                group_row(type, g, 0, o + b * block);
            }
        }
    }
    return 0;
}
