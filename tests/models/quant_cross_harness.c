/* The quantized matmul (tandem/kernels/cpu_quant*.c) outside Python, for a build for another
 * CPU (tests/models/test_quant_cross_arm.py builds this for Arm and runs it under qemu-user):
 *   harness TYPE K N M THREADS WEIGHTS X BIAS OUT
 * reads N rows of GGUF blocks of TYPE (N * row bytes), M x K float32 rows of x and N float32 of
 * bias, interleaves the rows as the loader does (tandem_q_r16_pack), and writes y [M, N]
 * float32 to OUT. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels.h"

#define R16 0x100

static void *read_all(const char *path, size_t bytes) {
    FILE *f = fopen(path, "rb");
    void *buf = malloc(bytes ? bytes : 1);
    if (!f || !buf || fread(buf, 1, bytes, f) != bytes) {
        fprintf(stderr, "cannot read %zu bytes from %s\n", bytes, path);
        exit(1);
    }
    fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    if (argc != 10) {
        fprintf(stderr, "usage: %s TYPE K N M THREADS WEIGHTS X BIAS OUT\n", argv[0]);
        return 1;
    }
    const int type = atoi(argv[1]), threads = atoi(argv[5]);
    const int64_t k = atoll(argv[2]), n = atoll(argv[3]), m = atoll(argv[4]);
    const int64_t row_bytes = k / tandem_q_block(type) * tandem_q_block_bytes(type);
    const int64_t group_bytes = tandem_q_r16_bytes(type, k);
    if (group_bytes == 0) {
        fprintf(stderr, "type %d rows of %lld elements are never interleaved\n", type,
                (long long)k);
        return 1;
    }
    uint8_t *rows = read_all(argv[6], (size_t)(n * row_bytes));
    float *x = read_all(argv[7], sizeof(float) * (size_t)(m * k));
    float *bias = read_all(argv[8], sizeof(float) * (size_t)n);
    uint8_t *packed = malloc((size_t)((n + 15) / 16 * group_bytes));
    float *y = malloc(sizeof(float) * (size_t)(m * n));
    if (!packed || !y || tandem_q_r16_pack(type, rows, n, row_bytes, k, packed) != 0) {
        fprintf(stderr, "packing failed\n");
        return 1;
    }
    const int64_t desc[5] = {1, type | R16, n, (int64_t)(intptr_t)packed, row_bytes};
    if (tandem_qlinear(x, desc, bias, y, m, n, k, threads) != 0) {
        fprintf(stderr, "tandem_qlinear refused the layout\n");
        return 1;
    }
    FILE *out = fopen(argv[9], "wb");
    if (!out || fwrite(y, sizeof(float), (size_t)(m * n), out) != (size_t)(m * n)) return 1;
    fclose(out);
    return 0;
}
