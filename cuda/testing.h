// testing.h: GPU entry points that only the tests and benchmarks use (cuda/testing.cu, linked
// into them beside kernels.o; not part of the engine's binaries).
#ifndef TESTING_H
#define TESTING_H

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

void gpu_dequant(GpuCtx *g, float *dst, const Mat *w);   // dst (N, K) FP32, dense = W, exactly q * s
// The register-fed GEMV at M = 1 with rows per warp in {1, 2, 4} and 16-byte chunks in flight per
// row in {2, 4, 8} (bench/kernel_bench's sweep); -1 for a group size not 16 x 2^n.
int gpu_matmul_q8_variant(GpuCtx *g, float *y, const float *x, const Mat *w, int rows_per_warp, int chunks);
// The pairs c, d below 2^12 (d from 1) where SmallDiv's c / d is not the quotient; one in *c, *d.
int gpu_small_div_mismatches(GpuCtx *g, int *c, int *d);
void *gpu_stream(GpuCtx *g);   // the context's cudaStream_t, for timing with events

#ifdef __cplusplus
}
#endif
#endif
