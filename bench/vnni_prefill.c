// vnni_prefill.c: a measurement for the CPU prefill's next step (bench/NOTES.md 45), not part of
// the engine. One thread, one prefill-shaped matmul y (M, N) = x (M, K) W^T, W int8 with a scale
// per group of gs weights:
//   A: the FP32 tile of engine/vec_kernels.h (4 rows x 4 tokens, 16-float vectors) on weights
//      dequantized beforehand (the engine's prefill without its dequantization);
//   B: int8 x int8 with AVX512-VNNI (vpdpbusd): x quantized per token and group to u8 (x + 128)
//      with a scale, 4 rows x 2 tokens, the u8 offset taken off per lane (a vpdpbusd of 128s with
//      the weights), each group's int32 sums converted and scaled into FP32 accumulators.
// The x quantization here is plain scalar C (timed apart; it is O(M K), the matmul O(M N K)).
//   gcc -O3 -march=native bench/vnni_prefill.c -o /tmp/vnni_prefill -lm && /tmp/vnni_prefill K GS
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void fp32_tiles(const float *w, const float *x, float *y, int M, int N, int K) {
    for (int r0 = 0; r0 < N; r0 += 4)
        for (int t0 = 0; t0 < M; t0 += 4) {
            __m512 acc[4][4];
            for (int r = 0; r < 4; r++)
                for (int t = 0; t < 4; t++) acc[r][t] = _mm512_setzero_ps();
            for (int k = 0; k < K; k += 16) {
                __m512 wv[4];
                for (int r = 0; r < 4; r++) wv[r] = _mm512_loadu_ps(w + (size_t)(r0 + r) * K + k);
                for (int t = 0; t < 4; t++) {
                    const __m512 xv = _mm512_loadu_ps(x + (size_t)(t0 + t) * K + k);
                    for (int r = 0; r < 4; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
                }
            }
            for (int r = 0; r < 4; r++)
                for (int t = 0; t < 4; t++) y[(size_t)(t0 + t) * N + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
        }
}

// x (M, K) -> xu (M, K) u8 = round(x / xs) + 128, xs (M, G) = max|x| / 127 per group of gs
static void quantize_x(const float *x, uint8_t *xu, float *xs, int M, int K, int gs) {
    const int G = K / gs;
    for (int m = 0; m < M; m++)
        for (int g = 0; g < G; g++) {
            float amax = 0;
            for (int j = 0; j < gs; j++) amax = fmaxf(amax, fabsf(x[(size_t)m * K + g * gs + j]));
            const float s = amax / 127.0f, inv = s > 0 ? 1.0f / s : 0;
            xs[m * G + g] = s;
            for (int j = 0; j < gs; j++) xu[(size_t)m * K + g * gs + j] = (uint8_t)(lrintf(x[(size_t)m * K + g * gs + j] * inv) + 128);
        }
}

static void vnni_tiles(const int8_t *q, const float *ws, const uint8_t *xu, const float *xs, float *y, int M, int N, int K,
                       int gs) {
    const int G = K / gs;
    const __m512i k128 = _mm512_set1_epi8((char)0x80);
    for (int r0 = 0; r0 < N; r0 += 4)
        for (int t0 = 0; t0 < M; t0 += 2) {
            __m512 accf[4][2];
            for (int r = 0; r < 4; r++)
                for (int t = 0; t < 2; t++) accf[r][t] = _mm512_setzero_ps();
            for (int g = 0; g < G; g++) {
                __m512i acc[4][2], corr[4];
                for (int r = 0; r < 4; r++) {
                    corr[r] = _mm512_setzero_si512();
                    for (int t = 0; t < 2; t++) acc[r][t] = _mm512_setzero_si512();
                }
                for (int k = g * gs; k < (g + 1) * gs; k += 64) {
                    __m512i wv[4];
                    for (int r = 0; r < 4; r++) {
                        wv[r] = _mm512_loadu_si512(q + (size_t)(r0 + r) * K + k);
                        corr[r] = _mm512_dpbusd_epi32(corr[r], k128, wv[r]);
                    }
                    for (int t = 0; t < 2; t++) {
                        const __m512i xv = _mm512_loadu_si512(xu + (size_t)(t0 + t) * K + k);
                        for (int r = 0; r < 4; r++) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], xv, wv[r]);
                    }
                }
                for (int r = 0; r < 4; r++)
                    for (int t = 0; t < 2; t++) {
                        const __m512 d = _mm512_set1_ps(ws[(size_t)(r0 + r) * G + g] * xs[(t0 + t) * G + g]);
                        accf[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][t], corr[r])), d, accf[r][t]);
                    }
            }
            for (int r = 0; r < 4; r++)
                for (int t = 0; t < 2; t++) y[(size_t)(t0 + t) * N + r0 + r] = _mm512_reduce_add_ps(accf[r][t]);
        }
}

int main(int argc, char **argv) {
    const int N = 288, K = argc > 1 ? atoi(argv[1]) : 768, M = 256, gs = argc > 2 ? atoi(argv[2]) : 64, G = gs > 0 ? K / gs : 0;
    if (K <= 0 || K > (1 << 16) || gs <= 0 || gs % 64 || K % gs) {   // B steps 64 weights at a time within a group
        fprintf(stderr, "vnni_prefill: K (%d, at most 65536) must be a multiple of GS (%d), GS a multiple of 64\n", K, gs);
        return 1;
    }
    int8_t *q = aligned_alloc(64, (size_t)N * K);
    float *ws = malloc(sizeof(float) * N * G), *w = aligned_alloc(64, sizeof(float) * N * K), *x = aligned_alloc(64, sizeof(float) * M * K);
    float *y0 = malloc(sizeof(float) * M * N), *y1 = malloc(sizeof(float) * M * N), *xs = malloc(sizeof(float) * M * G);
    uint8_t *xu = aligned_alloc(64, (size_t)M * K);
    srand(1);
    for (size_t i = 0; i < (size_t)N * K; i++) q[i] = (int8_t)(rand() % 255 - 127);
    for (int i = 0; i < N * G; i++) ws[i] = 0.001f + (rand() % 1000) * 1e-5f;
    for (int r = 0; r < N; r++)
        for (int k = 0; k < K; k++) w[(size_t)r * K + k] = q[(size_t)r * K + k] * ws[r * G + k / gs];
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = (rand() / (float)RAND_MAX - 0.5f) * 2;
    double best_a = 1e9, best_b = 1e9, best_q = 1e9;
    for (int rep = 0; rep < 20; rep++) {
        double t = now();
        fp32_tiles(w, x, y0, M, N, K);
        best_a = fmin(best_a, now() - t);
        t = now();
        quantize_x(x, xu, xs, M, K, gs);
        best_q = fmin(best_q, now() - t);
        t = now();
        vnni_tiles(q, ws, xu, xs, y1, M, N, K, gs);
        best_b = fmin(best_b, now() - t);
    }
    double num = 0, den = 0;
    for (int i = 0; i < M * N; i++) num += (y1[i] - y0[i]) * (y1[i] - y0[i]), den += y0[i] * y0[i];
    const double macs = (double)M * N * K;
    printf("K %d gs %d: fp32 tiles %.1f us (%.1f GMAC/s); vnni %.1f us (%.1f GMAC/s) + x quantization %.1f us: %.2fx; rel L2 %.2e\n",
           K, gs, best_a * 1e6, macs / best_a / 1e9, best_b * 1e6, macs / best_b / 1e9, best_q * 1e6, best_a / (best_b + best_q),
           sqrt(num / den));
    return 0;
}
