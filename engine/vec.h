// vec.h: the CPU executor's inner loops: a matmul slice over FP32 or INT8 weights, written once with
// GCC/Clang vector extensions. On x86-64 (GCC) each is compiled for AVX-512, AVX2+FMA and the SSE2
// baseline and the best the CPU supports is used; on ARM the same source becomes NEON.
//
// Each output is the same sequence of operations whatever the slice boundaries, the thread count
// or the number of tokens beside it in a tile, so results do not depend on how work is split
// (they do depend on the instruction set: FMA rounds once where SSE2 rounds twice).
#ifndef VEC_H
#define VEC_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

#define VEC_TILE_ROWS 4   // weight rows a tile reads together (and the scratch rows per thread)

// out[m][r] (+)= W[r] . in[m] for rows lo..hi of w and the M input rows in (M, w->cols); out is
// (M, w->rows). scratch: VEC_TILE_ROWS * w->cols floats of the calling thread (INT8 prefill
// dequantizes a tile's rows into it once for all M tokens).
void vec_matmul_slice(const Mat *w, const float *in, int M, float *out, int accumulate, int lo, int hi, float *scratch);

// Attention of one query: att[t] = (q . k_t) / sqrt(n) for t < T, k_t = keys + t * stride (each
// dot in the matmul's lane order);
void vec_scores(const float *q, const float *keys, size_t stride, int T, int n, float *att);
// out (n) = sum over t < T, in order, of att[t] * v_t, v_t = values + t * stride.
void vec_weighted_sum(float *out, const float *att, const float *values, size_t stride, int T, int n);
// Several queries of one head at once (a prompt's consecutive tokens, at most VEC_QUERIES): for
// i < nq, att[i * att_stride + t] = (q_i . k_t) / sqrt(n) for t < T[i], q_i = q + i * q_stride,
// with vec_scores's arithmetic for each (the same bits), a tile of keys against the queries
// reading each key row once for all of them (the matmul's tiles).
#define VEC_QUERIES 6
void vec_scores_block(const float *q, size_t q_stride, int nq, const float *keys, size_t stride, const int *T, int n, float *att,
                      size_t att_stride);
// out_i (out + i * out_stride) = vec_weighted_sum of att_i (att + i * att_stride) over T[i] rows, for
// i < nq, each value row read once for all of them (the same bits).
void vec_weighted_sum_block(float *out, size_t out_stride, const float *att, size_t att_stride, const int *T, int nq,
                            const float *values, size_t stride, int n);
// x[i] = expf(x[i] - sub) for i < n: with AVX2 or AVX-512 several at a time by glibc's expf's own
// operations (the same bits as the platform's expf where that is glibc's; the tests compare), else
// expf itself.
void vec_exp_sub(float *x, int n, float sub);

// ---- The int8 x int8 prefill (x86-64 with AVX512-VNNI): an approximation, not the reference.
// The activations are quantized per token and block of VEC_ACT_BLOCK elements (fewer where the
// weights' gs is not a multiple of it) to int8 (x / s rounded, s = the block's largest |x| / 127;
// kept + 128 as u8 for vpdpbusd), so the products are exact int32 sums and only each block's sum
// is scaled in FP32 (by the weights' group scale times s); weights 16 rows at a time, their 4-byte
// columns interleaved, so that one vector's lanes are 16 rows' sums. x's rounding is the error
// (bench/NOTES.md 45, 47); each output depends on its row and token only.
#define VEC_ACT_BLOCK 32   // as llama.cpp's Q8 activations: larger blocks cost accuracy (bench/NOTES.md 47)
typedef struct {
    uint8_t *q;   // (M, kpad): round(x / s) + 128; 128 (zero) past K
    float *s;     // (M, blocks): s of each block
    int M, K, kpad, gs;
    int blk, blocks;   // elements a block (VEC_ACT_BLOCK, or the largest power of two dividing gs
                       // below it: a block lies in one group), ceil(K / blk) blocks
} VecActQ8;
// The layout of M tokens of width K, for weights of group size gs, in buf (vec_act_q8_bytes of
// it; NULL: the sizes alone).
VecActQ8 vec_act_q8(int M, int K, int gs, void *buf);
// Whether the CPU has it; and w is INT8 with gs a multiple of 4 too.
int vec_has_int8_act(void);
int vec_int8_act_supported(const Mat *w);
// Bytes of VecActQ8's q and s for M tokens of w's input; a thread's scratch for the matmul.
size_t vec_act_q8_bytes(int M, int K, int gs);
size_t vec_q8q8_scratch_bytes(int K, int gs);
// a: from vec_act_q8 with a buffer; quantizes tokens lo..hi of x (M, K) into it.
void vec_quantize_act(const float *x, const VecActQ8 *a, int lo, int hi);
// out[m][r] (+)= W[r] . x[m] for rows lo..hi of w against a's M tokens; scratch: a thread's
// vec_q8q8_scratch_bytes.
void vec_matmul_q8q8_slice(const Mat *w, const VecActQ8 *a, float *out, int accumulate, int lo, int hi, void *scratch);

// The instruction set in use, e.g. "x86-64-v4 (AVX-512)". Tests run every one the CPU has:
// vec_select_isa(i) for i < vec_isa_count() (0, or -1 where the CPU lacks it; not thread-safe).
const char *vec_isa_name(void);
int vec_isa_count(void);
int vec_select_isa(int i);

#endif
