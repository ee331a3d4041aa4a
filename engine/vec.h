// vec.h: the CPU executor's inner loops: a matmul slice over FP32 or INT8 weights, written once with
// GCC/Clang vector extensions. On x86-64 (GCC) each is compiled for AVX-512, AVX2+FMA and the SSE2
// baseline and the best the CPU supports is used; on ARM the same source becomes NEON.
//
// Each output is the same sequence of operations whatever the slice boundaries, the thread count
// or the number of tokens beside it in a tile, so results do not depend on how work is split
// (they do depend on the instruction set: FMA rounds once where SSE2 rounds twice).
#ifndef VEC_H
#define VEC_H

#include "model.h"

#define VEC_TILE_ROWS 4   // weight rows a tile reads together (and the scratch rows per thread)

// out[m][r] (+)= W[r] . in[m] for rows lo..hi of w and the M input rows in (M, w->cols); out is
// (M, w->rows). scratch: VEC_TILE_ROWS * w->cols floats of the calling thread (INT8 prefill
// dequantizes a tile's rows into it once for all M tokens).
void vec_matmul_slice(const Mat *w, const float *in, int M, float *out, int accumulate, int lo, int hi, float *scratch);

// x . y over n floats (attention's q . k), the same lane order as the matmul.
float vec_dot(const float *x, const float *y, int n);
// y += a * x over n floats (attention's weighted sum of values).
void vec_axpy(float *y, float a, const float *x, int n);

// The instruction set in use, e.g. "x86-64-v4 (AVX-512)". Tests run every one the CPU has:
// vec_select_isa(i) for i < vec_isa_count() (0, or -1 where the CPU lacks it; not thread-safe).
const char *vec_isa_name(void);
int vec_isa_count(void);
int vec_select_isa(int i);

#endif
