// vec.c: the CPU matmul: tiles of VEC_TILE_ROWS weight rows x TOKENS inputs (6 with AVX-512, 3
// with AVX2, else 4), vectors of 16 floats (8 with AVX2, 4 in the baseline).
//
//   FP32 weights, M = 1        row_f32: a row at a time, one sequential stream (decode)
//   FP32 weights, M > 1        tile_f32: each weight vector loaded once feeds T tokens' FMAs
//   INT8 weights, M < TOKENS   rows_q8: dequantization in registers: 16 int8 widened to float,
//                              times their group's scale, against x
//   INT8 weights, M >= TOKENS  the tile's rows dequantized once into the thread's scratch, then
//   (or gs not a multiple      tile_f32 over all M tokens (prefill is compute-bound: the
//    of 16)                    conversion is paid once per row, not once per token)
// Both INT8 paths round w = q * scale to float and then compute as the FP32 one does, so a token's
// outputs do not depend on how many tokens share its call (a prompt chunk, a --batch step).
//
// An output's lanes are summed in one fixed tree (hsum), then the columns past the last whole
// lane vector are added in order: the same arithmetic whatever the tile around it.
//
// The kernels (vec_kernels.h) are compiled once per instruction set: on x86-64 with GCC for
// x86-64-v4 (AVX-512), x86-64-v3 (AVX2 + FMA) and the baseline, the best one the CPU (and OS)
// supports chosen at the first call; elsewhere once, for the compiler's target (NEON on ARM).
#include "vec.h"

// No contraction of a product and a sum into a fused multiply-add by the compiler: the kernels
// fuse where they mean to (vec_kernels.h fmadd), and nowhere else, so that every compiler gives
// the same bits for a token alone and in a tile.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>   // GCC: each instance's #pragma target enables the intrinsics it uses
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#define ROWS VEC_TILE_ROWS
#define PREFETCH_INT8 16384   // bytes of INT8 weights rows_q8 asks for ahead of its loads

// Each instance's vectors are LANES floats (vec_kernels.h's f32v), a register's worth: 16 with
// AVX-512, 8 with AVX2, 4 in the baseline (SSE2, NEON). A wider vector has no register of its own,
// and GCC moves it through the stack at each step (bench/NOTES.md 202).
typedef float f32x8 __attribute__((vector_size(8 * sizeof(float))));
typedef float f32x4 __attribute__((vector_size(4 * sizeof(float))));
typedef float f32x2 __attribute__((vector_size(2 * sizeof(float))));

// The helpers pass 64-byte vectors by value; they are always inlined, so no call (and no ABI)
// ever carries one.
#pragma GCC diagnostic ignored "-Wpsabi"

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define ISA_NAME(x) CAT(x, ISA)

typedef struct {
    const char *name;
    void (*matmul_slice)(const Mat *w, const float *in, int M, float *out, int accumulate, int lo, int hi, float *scratch);
    void (*scores)(const float *q, const float *keys, size_t stride, int T, int n, float *att);
    void (*weighted_sum)(float *out, const float *att, const float *values, size_t stride, int T, int n);
    void (*exp_sub)(float *x, int n, float sub);
    void (*scores_block)(const float *q, size_t q_stride, int nq, const float *keys, size_t stride, const int *T, int n, float *att,
                         size_t att_stride);
    void (*weighted_sum_block)(float *out, size_t out_stride, const float *att, size_t att_stride, const int *T, int nq,
                               const float *values, size_t stride, int n);
} VecIsa;

// exp_sub's constants (those of glibc's expf): 32 / ln 2; 1.5 * 2^52, whose addition rounds to an
// integer in the low bits; the cubic for 2^(r/32); the exponent field from which expf leaves its
// main path (|x| >= 88); 2^(i/32), i < 32, correctly rounded.
#define EXP_INV_LN2_32 0x1.71547652b82fep+5
#define EXP_SHIFT 0x1.8p+52
#define EXP_C0 (0x1.c6af84b912394p-5 / 32 / 32 / 32)
#define EXP_C1 (0x1.ebfce50fac4f3p-3 / 32 / 32)
#define EXP_C2 (0x1.62e42ff0c52d6p-1 / 32)
#define EXP_ABSTOP_88 0x42bu

#if defined(__x86_64__)
// 2^(i/32), read only by the exp of the instances with AVX2 or AVX-512 (GCC's v3 and v4, or a
// clang build for such a -march)
__attribute__((unused)) static const double exp2_32[32] = {
    0x1.0000000000000p+0, 0x1.059b0d3158574p+0, 0x1.0b5586cf9890fp+0, 0x1.11301d0125b51p+0, 0x1.172b83c7d517bp+0,
    0x1.1d4873168b9aap+0, 0x1.2387a6e756238p+0, 0x1.29e9df51fdee1p+0, 0x1.306fe0a31b715p+0, 0x1.371a7373aa9cbp+0,
    0x1.3dea64c123422p+0, 0x1.44e086061892dp+0, 0x1.4bfdad5362a27p+0, 0x1.5342b569d4f82p+0, 0x1.5ab07dd485429p+0,
    0x1.6247eb03a5585p+0, 0x1.6a09e667f3bcdp+0, 0x1.71f75e8ec5f74p+0, 0x1.7a11473eb0187p+0, 0x1.82589994cce13p+0,
    0x1.8ace5422aa0dbp+0, 0x1.93737b0cdc5e5p+0, 0x1.9c49182a3f090p+0, 0x1.a5503b23e255dp+0, 0x1.ae89f995ad3adp+0,
    0x1.b7f76f2fb5e47p+0, 0x1.c199bdd85529cp+0, 0x1.cb720dcef9069p+0, 0x1.d5818dcfba487p+0, 0x1.dfc97337b9b5fp+0,
    0x1.ea4afa2a490dap+0, 0x1.f50765b6e4540p+0,
};
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define X86_CLONES 1

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
#define ISA v4
#define LANES 16
#define TOKENS 6   // 24 accumulators of the 32 registers: faster prefill than 4 (bench/NOTES.md 53)
#include "vec_kernels.h"
#undef TOKENS
#undef LANES
#undef ISA
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
#define ISA v3
#define LANES 8
#define TOKENS 3   // 12 accumulators, the tile's 4 rows and x: 17 of the 16 registers
#include "vec_kernels.h"
#undef TOKENS
#undef LANES
#undef ISA
#pragma GCC pop_options
#endif

#define ISA base
#define LANES 4   // one SSE2 or NEON register
#define TOKENS 4
#include "vec_kernels.h"
#undef TOKENS
#undef LANES
#undef ISA

#if defined(__x86_64__)
#define VEC_BASE_NAME "x86-64 (SSE2)"
#elif defined(__aarch64__)
#define VEC_BASE_NAME "aarch64 (NEON)"
#else
#define VEC_BASE_NAME "portable C"
#endif

static const VecIsa isas[] = {
#ifdef X86_CLONES
    {"x86-64-v4 (AVX-512)", matmul_slice_v4, scores_v4, weighted_sum_v4, exp_sub_v4, scores_block_v4, weighted_sum_block_v4},
    {"x86-64-v3 (AVX2, FMA)", matmul_slice_v3, scores_v3, weighted_sum_v3, exp_sub_v3, scores_block_v3, weighted_sum_block_v3},
#endif
    {VEC_BASE_NAME, matmul_slice_base, scores_base, weighted_sum_base, exp_sub_base, scores_block_base, weighted_sum_block_base},
};
#define N_ISAS ((int)(sizeof isas / sizeof isas[0]))

static int supported(int i) {
#ifdef X86_CLONES
    __builtin_cpu_init();
    if (i == 0) return __builtin_cpu_supports("x86-64-v4");
    if (i == 1) return __builtin_cpu_supports("x86-64-v3");
#endif
    return i == N_ISAS - 1;
}

static const VecIsa *current;

static const VecIsa *isa(void) {
    if (!current)
        for (int i = 0; i < N_ISAS && !current; i++)
            if (supported(i)) current = &isas[i];
    return current;
}

const char *vec_isa_name(void) { return isa()->name; }

int vec_select_isa(int i) {
    if (i < 0 || i >= N_ISAS || !supported(i)) return -1;
    current = &isas[i];
    return 0;
}

int vec_isa_count(void) { return N_ISAS; }

void vec_matmul_slice(const Mat *w, const float *in, int M, float *out, int accumulate, int lo, int hi, float *scratch) {
    isa()->matmul_slice(w, in, M, out, accumulate, lo, hi, scratch);
}
void vec_scores(const float *q, const float *keys, size_t stride, int T, int n, float *att) {
    isa()->scores(q, keys, stride, T, n, att);
}
void vec_weighted_sum(float *out, const float *att, const float *values, size_t stride, int T, int n) {
    isa()->weighted_sum(out, att, values, stride, T, n);
}
void vec_exp_sub(float *x, int n, float sub) { isa()->exp_sub(x, n, sub); }
void vec_scores_block(const float *q, size_t q_stride, int nq, const float *keys, size_t stride, const int *T, int n, float *att,
                      size_t att_stride) {
    isa()->scores_block(q, q_stride, nq, keys, stride, T, n, att, att_stride);
}
void vec_weighted_sum_block(float *out, size_t out_stride, const float *att, size_t att_stride, const int *T, int nq,
                            const float *values, size_t stride, int n) {
    isa()->weighted_sum_block(out, out_stride, att, att_stride, T, nq, values, stride, n);
}
