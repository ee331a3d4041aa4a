// vec_q8q8.c: the CPU prefill's int8 x int8 matmul (vec.h; x86-64 with AVX512-VNNI, GCC or Clang).
//
//   vec_quantize_act       x (M, K) -> u8 (x / s rounded + 128) and s per token and group
//   vec_matmul_q8q8_slice  rows lo..hi of an INT8 matrix against all M quantized tokens
//
// A tile is 16 weight rows against 8 tokens. Its rows are packed once (for all M tokens) so that
// 4-byte column j of the 16 rows is one 64-byte vector: packed[j][row][4]. Then, per 4 columns,
// one vpdpbusd of that vector with the token's 4 bytes broadcast adds 16 rows x 4 products into
// 16 int32 lanes, one lane a row: no horizontal sums, and the tile's 8 tokens reuse each loaded
// vector. At a block's end each token's lanes are corrected for x's +128 (128 x the rows' block
// sums of w, from one vpdpbusd of 128s a column per tile), converted and scaled by the rows' group
// scales times the token's block scale: an output's arithmetic depends on its row and token only.
#include "vec.h"

#include <math.h>
#include <string.h>

#define TILE_ROWS 16   // a vector's int32 lanes
#define TILE_TOKENS 8

// A block: the largest power of two that divides gs, VEC_ACT_BLOCK at most (it lies in one group).
static int act_block(int gs) {
    int b = VEC_ACT_BLOCK;
    while (gs % b) b /= 2;
    return b;
}

VecActQ8 vec_act_q8(int M, int K, int gs, void *buf) {
    VecActQ8 a = {.M = M, .K = K, .kpad = (K + 3) / 4 * 4, .gs = gs, .blk = act_block(gs)};
    a.blocks = (K + a.blk - 1) / a.blk;
    a.q = buf, a.s = buf ? (float *)(a.q + (size_t)M * a.kpad) : NULL;
    return a;
}

size_t vec_act_q8_bytes(int M, int K, int gs) {
    const VecActQ8 a = vec_act_q8(M, K, gs, NULL);
    return (size_t)M * a.kpad + (size_t)M * a.blocks * sizeof(float);
}

// packed (kpad / 4, 16, 4) bytes, corr (blocks, 16) int32, scales (blocks, 16) floats
size_t vec_q8q8_scratch_bytes(int K, int gs) {
    const VecActQ8 a = vec_act_q8(1, K, gs, NULL);
    return (size_t)a.kpad * TILE_ROWS + (size_t)a.blocks * TILE_ROWS * (sizeof(int32_t) + sizeof(float));
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

int vec_has_int8_act(void) {
    static int cpu = -1;   // the CPU's answer, asked once
    if (cpu < 0) {
        __builtin_cpu_init();
        cpu = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    }
    return cpu;
}

int vec_int8_act_supported(const Mat *w) { return vec_has_int8_act() && !w->f && w->gs % 4 == 0; }

// Token m's blocks: s = max |x| / 127, q = round(x / s) + 128 (x = 0: s = 0, q = 128), 16 at a time.
VNNI static void quantize_token(const float *x, int K, int blk, uint8_t *q, float *s) {
    for (int k0 = 0, g = 0; k0 < K; k0 += blk, g++) {
        const int n = K - k0 < blk ? K - k0 : blk;
        __m512 amax = _mm512_setzero_ps();
        for (int j = 0; j < n; j += 16) {
            const __mmask16 m = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
            amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_maskz_loadu_ps(m, x + k0 + j)));
        }
        const float mx = _mm512_reduce_max_ps(amax), inv = mx > 0.0f ? 127.0f / mx : 0.0f;
        s[g] = mx / 127.0f;
        for (int j = 0; j < n; j += 16) {
            const __mmask16 m = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
            const __m512i v = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + k0 + j), _mm512_set1_ps(inv))),
                                               _mm512_set1_epi32(128));
            _mm_mask_storeu_epi8(q + k0 + j, m, _mm512_cvtepi32_epi8(v));
        }
    }
}

void vec_quantize_act(const float *x, const VecActQ8 *a, int lo, int hi) {
    for (int m = lo; m < hi; m++) {
        uint8_t *q = a->q + (size_t)m * a->kpad;
        quantize_token(x + (size_t)m * a->K, a->K, a->blk, q, a->s + (size_t)m * a->blocks);
        memset(q + a->K, 128, (size_t)(a->kpad - a->K));
    }
}

// Rows r0 .. r0 + nr - 1 of w into the tile's layout (rows past nr: zero), each block's scales
// (its group's) and corr[b][row] = 128 x the row's sum over block b (what x's +128 adds).
VNNI static void pack_tile(const Mat *w, int r0, int nr, int kpad, int blk, int blocks, uint8_t *packed, int32_t *corr, float *scales) {
    const int words = kpad / 4;
    for (int i = 0; i < TILE_ROWS; i++) {
        const int8_t *row = w->q + (size_t)(r0 + (i < nr ? i : 0)) * w->stride;   // padding: zero to the stride
        uint32_t *dst = (uint32_t *)packed + i;
        for (int j = 0; j < words; j++) {
            uint32_t v = 0;
            if (i < nr) memcpy(&v, row + 4 * j, 4);
            dst[(size_t)j * TILE_ROWS] = v;
        }
        for (int b = 0; b < blocks; b++) scales[b * TILE_ROWS + i] = i < nr ? w->s[(size_t)(r0 + i) * w->groups + b * blk / w->gs] : 0.0f;
    }
    const __m512i k128 = _mm512_set1_epi8((char)0x80);
    for (int g = 0; g < blocks; g++) {
        const int j0 = g * blk / 4, j1 = (g + 1) * blk / 4 < words ? (g + 1) * blk / 4 : words;
        __m512i c = _mm512_setzero_si512();
        for (int j = j0; j < j1; j++) c = _mm512_dpbusd_epi32(c, k128, _mm512_loadu_si512(packed + (size_t)j * 64));
        _mm512_storeu_si512(corr + g * TILE_ROWS, c);
    }
}

// The tile's 16 rows against tokens t[0..TILE_TOKENS) (a short last block repeats a token: its
// results are computed, not stored); res[t] holds the 16 rows' outputs for token t.
VNNI static void tile_kernel(const uint8_t *packed, const int32_t *corr, const float *scales, const VecActQ8 *a, const int t[TILE_TOKENS],
                             __m512 res[TILE_TOKENS]) {
    const uint8_t *xq[TILE_TOKENS];
    const float *xs[TILE_TOKENS];
    for (int i = 0; i < TILE_TOKENS; i++) {
        xq[i] = a->q + (size_t)t[i] * a->kpad, xs[i] = a->s + (size_t)t[i] * a->blocks;
        res[i] = _mm512_setzero_ps();
    }
    const int words = a->kpad / 4;
    for (int g = 0; g < a->blocks; g++) {
        const int j0 = g * a->blk / 4, j1 = (g + 1) * a->blk / 4 < words ? (g + 1) * a->blk / 4 : words;
        __m512i acc[TILE_TOKENS];
        for (int i = 0; i < TILE_TOKENS; i++) acc[i] = _mm512_setzero_si512();
        for (int j = j0; j < j1; j++) {
            const __m512i wv = _mm512_loadu_si512(packed + (size_t)j * 64);
            for (int i = 0; i < TILE_TOKENS; i++) {
                int32_t x4;
                memcpy(&x4, xq[i] + 4 * j, 4);
                acc[i] = _mm512_dpbusd_epi32(acc[i], _mm512_set1_epi32(x4), wv);
            }
        }
        const __m512i c = _mm512_loadu_si512(corr + g * TILE_ROWS);
        const __m512 sw = _mm512_loadu_ps(scales + g * TILE_ROWS);
        for (int i = 0; i < TILE_TOKENS; i++) {
            const __m512 sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i], c));
            res[i] = _mm512_fmadd_ps(sum, _mm512_mul_ps(sw, _mm512_set1_ps(xs[i][g])), res[i]);
        }
    }
}

VNNI void vec_matmul_q8q8_slice(const Mat *w, const VecActQ8 *a, float *out, int accumulate, int lo, int hi, void *scratch) {
    const int N = w->rows;
    uint8_t *packed = scratch;
    int32_t *corr = (int32_t *)(packed + (size_t)a->kpad * TILE_ROWS);
    float *scales = (float *)(corr + (size_t)a->blocks * TILE_ROWS);
    for (int r0 = lo; r0 < hi; r0 += TILE_ROWS) {
        const int nr = hi - r0 < TILE_ROWS ? hi - r0 : TILE_ROWS;
        const __mmask16 rows = (__mmask16)((1u << nr) - 1);
        pack_tile(w, r0, nr, a->kpad, a->blk, a->blocks, packed, corr, scales);
        for (int t0 = 0; t0 < a->M; t0 += TILE_TOKENS) {
            const int nt = a->M - t0 < TILE_TOKENS ? a->M - t0 : TILE_TOKENS;
            int t[TILE_TOKENS];
            for (int i = 0; i < TILE_TOKENS; i++) t[i] = t0 + (i < nt ? i : 0);
            __m512 res[TILE_TOKENS];
            tile_kernel(packed, corr, scales, a, t, res);
            for (int i = 0; i < nt; i++) {
                float *o = out + (size_t)(t0 + i) * N + r0;
                const __m512 v = accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(rows, o), res[i]) : res[i];
                _mm512_mask_storeu_ps(o, rows, v);
            }
        }
    }
}
#else
int vec_has_int8_act(void) { return 0; }
int vec_int8_act_supported(const Mat *w) {
    (void)w;
    return 0;
}
void vec_quantize_act(const float *x, const VecActQ8 *a, int lo, int hi) { (void)x, (void)a, (void)lo, (void)hi; }
void vec_matmul_q8q8_slice(const Mat *w, const VecActQ8 *a, float *out, int accumulate, int lo, int hi, void *scratch) {
    (void)w, (void)a, (void)out, (void)accumulate, (void)lo, (void)hi, (void)scratch;
}
#endif
