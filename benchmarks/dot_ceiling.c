/* The ceiling of attention's scores on an AVX2 CPU (docs/performance.md, issue 43): 64 rows x 64
 * keys x 64 dimensions held in L1, blocks of 2 rows by 4 keys, as attention_wide.h's scores;
 * float32 FMAs against int8 x int8 products by AVX2's sign trick (maddubs, then madd into int32;
 * a scale per block of 32, float accumulation: no int16 sums, since one pair of 127 x 127 fills
 * one), one thread. Prints both rates in multiply-adds a second and their ratio.
 *
 *   cc -O3 -march=native benchmarks/dot_ceiling.c -o dot_ceiling && ./dot_ceiling
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#define D 64
#define K 64
#define R 64
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
float qf[R][D] __attribute__((aligned(64))), kf[K][D] __attribute__((aligned(64))), sf[R][K];
int8_t qi[R][D] __attribute__((aligned(64))), ki[K][D] __attribute__((aligned(64)));
float qs[R][2], ks[K][2];
int main(void) {
    for (int i = 0; i < R; i++) for (int e = 0; e < D; e++) { qf[i][e] = rand() / (float)RAND_MAX - .5f; qi[i][e] = rand() % 255 - 127; }
    for (int i = 0; i < K; i++) for (int e = 0; e < D; e++) { kf[i][e] = rand() / (float)RAND_MAX - .5f; ki[i][e] = rand() % 255 - 127; }
    for (int i = 0; i < R; i++) qs[i][0] = qs[i][1] = 0.01f;
    for (int i = 0; i < K; i++) ks[i][0] = ks[i][1] = 0.02f;
    const int reps = 20000;
    double t0 = now();
    for (int rep = 0; rep < reps; rep++)
        for (int i = 0; i < R; i += 2)
            for (int j = 0; j < K; j += 4) {
                __m256 a[2][4] = {{0}};
                for (int e = 0; e < D; e += 8) {
                    __m256 k0 = _mm256_load_ps(&kf[j][e]), k1 = _mm256_load_ps(&kf[j + 1][e]), k2 = _mm256_load_ps(&kf[j + 2][e]), k3 = _mm256_load_ps(&kf[j + 3][e]);
                    for (int r = 0; r < 2; r++) {
                        __m256 q = _mm256_load_ps(&qf[i + r][e]);
                        a[r][0] = _mm256_fmadd_ps(q, k0, a[r][0]); a[r][1] = _mm256_fmadd_ps(q, k1, a[r][1]);
                        a[r][2] = _mm256_fmadd_ps(q, k2, a[r][2]); a[r][3] = _mm256_fmadd_ps(q, k3, a[r][3]);
                    }
                }
                for (int r = 0; r < 2; r++) for (int k = 0; k < 4; k++) { __m256 v = a[r][k]; float t[8]; _mm256_storeu_ps(t, v); sf[i + r][j + k] += t[0] + t[7]; }
            }
    double tf = now() - t0;
    t0 = now();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int rep = 0; rep < reps; rep++)
        for (int i = 0; i < R; i += 2)
            for (int j = 0; j < K; j += 4) {
                __m256 a[2][4] = {{0}};
                for (int b = 0; b < 2; b++) {  /* two blocks of 32 */
                    __m256i kk[4];
                    for (int k = 0; k < 4; k++) kk[k] = _mm256_load_si256((const __m256i *)&ki[j + k][b * 32]);
                    for (int r = 0; r < 2; r++) {
                        __m256i q = _mm256_load_si256((const __m256i *)&qi[i + r][b * 32]);
                        __m256i aq = _mm256_sign_epi8(q, q);
                        for (int k = 0; k < 4; k++) {
                            __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(kk[k], q)), ones);
                            a[r][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(qs[i + r][b] * ks[j + k][b]), a[r][k]);
                        }
                    }
                }
                for (int r = 0; r < 2; r++) for (int k = 0; k < 4; k++) { float t[8]; _mm256_storeu_ps(t, a[r][k]); sf[i + r][j + k] += t[0] + t[7]; }
            }
    double ti = now() - t0;
    double macs = (double)reps * R * K * D;
    printf("float32 FMA: %.1f G multiply-adds/s; int8 sign trick: %.1f (%.2fx)\n", macs / tf / 1e9, macs / ti / 1e9, tf / ti);
    return (int)sf[3][5] & 0;
}
