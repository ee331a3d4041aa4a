// testing.cu: what only the tests and benchmarks need from the GPU side (testing.h): the dequant
// kernel alone, the register-fed GEMV's other tunings, SmallDiv over every pair it promises, the
// context's stream. The same kernel sources as kernels.cu, in a translation unit of their own.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testing.h"

#include "common.cuh"
#include "dequant.cuh"
#include "gemv.cuh"

extern "C" void gpu_dequant(GpuCtx *g, float *dst, const Mat *w) { launch_dequant(g, dst, w); }

extern "C" void *gpu_stream(GpuCtx *g) { return g->stream; }

// SmallDiv(d)(c), and SmallDiv of the host's inverse of d (host_inv[d - 1]), against c / d for
// d = blockIdx.x + 1 and every c below 2^12: the pairs where either differs counted in out[0], one
// such pair in out[1] as c * 4096 + d (c 0 where only the two reciprocals differ).
__global__ void small_div_kernel(int *out, const float *host_inv) {
    pdl_wait();
    const int d = blockIdx.x + 1;
    const SmallDiv div(d), by_host(host_inv[d - 1]);
    if (threadIdx.x == 0 && __float_as_uint(div.inv) != __float_as_uint(by_host.inv)) atomicAdd(out, 1), atomicExch(out + 1, d);
    for (int c = threadIdx.x; c < 4096; c += blockDim.x)
        if (div(c) != c / d || by_host(c) != c / d) atomicAdd(out, 1), atomicExch(out + 1, c * 4096 + d);
}

extern "C" int gpu_small_div_mismatches(GpuCtx *g, int *c, int *d) {
    static float inv[4095];
    for (int d = 1; d <= 4095; d++) inv[d - 1] = small_div_inverse(d);
    int *out, host[2];
    float *dev_inv;
    CUDA_CHECK(cudaMalloc(&out, sizeof host));
    CUDA_CHECK(cudaMalloc(&dev_inv, sizeof inv));
    CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof host, g->stream));
    CUDA_CHECK(cudaMemcpyAsync(dev_inv, inv, sizeof inv, cudaMemcpyHostToDevice, g->stream));
    launch(g, "small_div_kernel", small_div_kernel, dim3(4095), dim3(256), 0, out, (const float *)dev_inv);
    CUDA_CHECK(cudaMemcpyAsync(host, out, sizeof host, cudaMemcpyDeviceToHost, g->stream));
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    CUDA_CHECK(cudaFree(out));
    CUDA_CHECK(cudaFree(dev_inv));
    *c = host[1] / 4096, *d = host[1] % 4096;
    return host[0];
}

extern "C" int gpu_matmul_q8_variant(GpuCtx *g, float *y, const float *x, const Mat *w, int rows_per_warp, int chunks) {
    Q8Args a = q8_args(x, 1, 1, &w, &y, 0);
    if (a.group_shift < 0) return -1;
    switch (rows_per_warp * 10 + chunks) {
    case 12: launch_q8<1, true, false, 1, 2>(g, a); return 0;
    case 14: launch_q8<1, true, false, 1, 4>(g, a); return 0;
    case 18: launch_q8<1, true, false, 1, 8>(g, a); return 0;
    case 22: launch_q8<1, true, false, 2, 2>(g, a); return 0;
    case 24: launch_q8<1, true, false, 2, 4>(g, a); return 0;
    case 28: launch_q8<1, true, false, 2, 8>(g, a); return 0;
    case 42: launch_q8<1, true, false, 4, 2>(g, a); return 0;
    case 44: launch_q8<1, true, false, 4, 4>(g, a); return 0;
    case 48: launch_q8<1, true, false, 4, 8>(g, a); return 0;
    }
    return -1;
}

