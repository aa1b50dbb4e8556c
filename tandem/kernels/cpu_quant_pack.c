/* Weights interleaved 16 rows at a time (cpu_quant_r16.c multiplies them), and rows of any
 * quantized table as float32 (tandem_q_rows: embedding gathers, the reference dequantization).
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
#include "quant_direct.h"
#include "quant_format.h"

/* Bytes of 16 interleaved rows of k elements; 0 where this build does not interleave `type`
 * (cpu_quant_r16.c reads it with AVX-512 VNNI, or AVX2 with FMA and F16C). */
int64_t tandem_q_r16_bytes(int type, int64_t k) {
    int64_t block = q_block(type), bb = q_r16_block_bytes(type);
    if (!R16_KERNEL || !bb || k <= 0 || k % block) return 0;
    return k / block * bb;
}

/* 4-byte words: word w of row r within a run of 64-byte vectors at v. */
static inline uint8_t *word(uint8_t *v, int64_t w, int r) { return v + 64 * w + 4 * r; }

/* Q5's fifth bits of 32 elements, bit e for element e <-> bit 8i + w for element 4w + i. */
static uint32_t q5_spread(uint32_t h) {
    uint32_t out = 0;
    for (int w = 0; w < 8; w++)
        for (int i = 0; i < 4; i++) out |= ((h >> (4 * w + i)) & 1u) << (8 * i + w);
    return out;
}
static uint32_t q5_gather(uint32_t hp) {
    uint32_t out = 0;
    for (int w = 0; w < 8; w++)
        for (int i = 0; i < 4; i++) out |= ((hp >> (8 * i + w)) & 1u) << (4 * w + i);
    return out;
}

/* A K-quant's d, dmin and 6-bit scales and mins (at p + 4) <-> bytes in the group block. */
static void k_heads(uint8_t *p, uint8_t *g, int r, int to_group) {
    if (to_group) {
        memcpy(g + 2 * r, p, 2), memcpy(g + 32 + 2 * r, p + 2, 2);
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            k_scale_min(p + 4, j, &sc, &mn);
            g[64 + 16 * j + r] = (uint8_t)sc, g[192 + 16 * j + r] = (uint8_t)mn;
        }
        return;
    }
    memcpy(p, g + 2 * r, 2), memcpy(p + 2, g + 32 + 2 * r, 2);
    const uint8_t *sc = g + 64 + r, *mn = g + 192 + r;  /* k_scale_min's packing, inverted */
    for (int j = 0; j < 4; j++) {
        p[4 + j] = (uint8_t)(sc[16 * j] | (sc[16 * (j + 4)] >> 4) << 6);
        p[8 + j] = (uint8_t)(mn[16 * j] | (mn[16 * (j + 4)] >> 4) << 6);
        p[12 + j] = (uint8_t)((sc[16 * (j + 4)] & 15) | (mn[16 * (j + 4)] & 15) << 4);
    }
}

/* One block of row r: original bytes p <-> group block g; to_group picks the direction. */
static void move_block(int type, uint8_t *p, uint8_t *g, int r, int to_group) {
#define MOVE(dst_in_group, src_in_block, n)                                   \
    do {                                                                      \
        if (to_group) memcpy((dst_in_group), (src_in_block), (n));           \
        else memcpy((src_in_block), (dst_in_group), (n));                    \
    } while (0)
    switch (type) {
    case T_Q4_0: case T_Q4_1: {
        int qs = type == T_Q4_0 ? 2 : 4;
        MOVE(g + 2 * r, p, 2);
        if (type == T_Q4_1) MOVE(g + 32 + 2 * r, p + 2, 2);
        for (int v = 0; v < 4; v++) MOVE(word(g + 16 * qs, v, r), p + qs + 4 * v, 4);
        break;
    }
    case T_Q5_0: case T_Q5_1: {
        const int one = type == T_Q5_0 ? 0 : 1;  /* Q5_1 has m after d */
        uint8_t *qh = g + 32 * (1 + one) + 4 * r;
        MOVE(g + 2 * r, p, 2);
        if (one) MOVE(g + 32 + 2 * r, p + 2, 2);
        uint32_t h, hp;
        if (to_group) {
            memcpy(&h, p + 2 + 2 * one, 4);
            hp = q5_spread(h);
            memcpy(qh, &hp, 4);
        } else {
            memcpy(&hp, qh, 4);
            h = q5_gather(hp);
            memcpy(p + 2 + 2 * one, &h, 4);
        }
        for (int v = 0; v < 4; v++)
            MOVE(word(g + 32 * (1 + one) + 64, v, r), p + 6 + 2 * one + 4 * v, 4);
        break;
    }
    case T_Q8_0:
        MOVE(g + 2 * r, p, 2);
        for (int v = 0; v < 8; v++) {  /* q + 128 (unsigned) where vpdpbusd reads it */
            uint8_t *w = word(g + 32, v, r), *q = p + 2 + 4 * v;
            const uint8_t flip = R16_Q8_SIGNED ? 0 : 0x80;
            for (int i = 0; i < 4; i++) {
                if (to_group) w[i] = q[i] ^ flip;
                else q[i] = w[i] ^ flip;
            }
        }
        break;
    case T_Q4_K:
        k_heads(p, g, r, to_group);
        for (int v = 0; v < 32; v++) MOVE(word(g + 320, v, r), p + 16 + 4 * v, 4);
        break;
    case T_Q5_K:  /* qh [32] at p + 16: byte l bit j is element 32 j + l's fifth bit */
        k_heads(p, g, r, to_group);
        for (int j = 0; j < 8; j++) {
            uint8_t *qh = g + 320 + 64 * j + 4 * r;
            uint32_t h = 0, hp;
            if (to_group) {
                for (int l = 0; l < 32; l++) h |= (uint32_t)((p[16 + l] >> j) & 1) << l;
                hp = q5_spread(h);
                memcpy(qh, &hp, 4);
            } else {
                memcpy(&hp, qh, 4);
                h = q5_gather(hp);
                for (int l = 0; l < 32; l++) p[16 + l] |= (uint8_t)(((h >> l) & 1) << j);
            }
        }
        for (int v = 0; v < 32; v++) MOVE(word(g + 832, v, r), p + 48 + 4 * v, 4);
        break;
    case T_Q6_K:
        MOVE(g + 2 * r, p + 208, 2);
        for (int s = 0; s < 16; s++) MOVE(g + 32 + 16 * s + r, p + 192 + s, 1);
        for (int v = 0; v < 32; v++) MOVE(word(g + 288, v, r), p + 4 * v, 4);
        for (int v = 0; v < 16; v++) MOVE(word(g + 288 + 2048, v, r), p + 128 + 4 * v, 4);
        break;
    }
#undef MOVE
}

/* rows [rows, row_bytes] of `type` -> dst [ceil(rows / 16), tandem_q_r16_bytes(type, k)]. */
int tandem_q_r16_pack(int type, const uint8_t *src, int64_t rows, int64_t row_bytes, int64_t k,
                      uint8_t *dst) {
    int64_t gbytes = tandem_q_r16_bytes(type, k), block = q_block(type);
    int64_t bb = q_r16_block_bytes(type), bytes = q_block_bytes(type);
    if (!gbytes || row_bytes != k / block * bytes || rows < 0) return -1;
    int64_t groups = (rows + 15) / 16;
    memset(dst, 0, (size_t)(groups * gbytes));
    uint8_t tmp[256];
    for (int64_t row = 0; row < rows; row++)
        for (int64_t b = 0; b < k / block; b++) {
            memcpy(tmp, src + row * row_bytes + b * bytes, (size_t)bytes);
            move_block(type, tmp, dst + row / 16 * gbytes + b * bb, (int)(row % 16), 1);
        }
    return 0;
}

/* Row `row` of an interleaved tensor back in its blocks: out [row bytes]. */
static void unpack_r16_row(int type, const uint8_t *data, int64_t row, int64_t k, uint8_t *out) {
    int64_t block = q_block(type), bb = q_r16_block_bytes(type), bytes = q_block_bytes(type);
    const uint8_t *g = data + row / 16 * tandem_q_r16_bytes(type, k);
    for (int64_t b = 0; b < k / block; b++) {
        memset(out + b * bytes, 0, (size_t)bytes);
        move_block(type, out + b * bytes, (uint8_t *)(g + b * bb), (int)(row % 16), 0);
    }
}

/* Rows `ids` [count] of a [rows, k] weight of `type` (row_bytes each) as float32, out [count, k]:
 * the embedding lookup of a quantized table, and the reference dequantization. Exact: each
 * element is a * u + b with a * u exact in float32 (as ggml's own dequantization). With
 * Q_R16 in the type, the rows are interleaved (tandem_q_r16_pack): each is first put back in
 * its blocks, so both layouts give the same values. */
int tandem_q_rows(int type, const uint8_t *data, int64_t row_bytes, const int64_t *ids,
                  int64_t count, int64_t k, float *out) {
    int r16 = (type & Q_R16) != 0;
    type &= ~Q_R16;
    int64_t block = q_block(type), bytes = q_block_bytes(type);
    if (!block || k % block || row_bytes != k / block * bytes
        || (r16 && !tandem_q_r16_bytes(type, k)))
        return -1;
    init_tables();
    uint8_t u[256];
    int8_t s[256];
    float a[16], b[16];
    uint8_t *plain = r16 ? malloc((size_t)row_bytes) : NULL;
    if (r16 && !plain) return -1;
    for (int64_t r = 0; r < count; r++) {
        const uint8_t *row = data + ids[r] * row_bytes;
        if (r16) unpack_r16_row(type, data, ids[r], k, plain), row = plain;
        float *o = out + r * k;
        if (is_half(type)) {
            for (int64_t e = 0; e < k; e++) o[e] = half_at(type, row + 2 * e);
            continue;
        }
        for (int64_t c = 0; c < k; c += block) {
            unpack_block(type, row + c / block * bytes, u, s, a, b);
            for (int64_t e = 0; e < block; e++) {
                float v = SIGNED_Q8 && type == T_Q8_0 ? a[e / 16] * (float)s[e]
                                                      : a[e / 16] * (float)u[e] + b[e / 16];
                o[c + e] = v;
            }
        }
    }
    free(plain);
    return 0;
}
