// bench/mma_probe.cu: the latency and throughput of the integer MMA the megakernel's tiles use
// (mma.sync m16n8k32 s8 x s8 -> s32) and of the FP16 one (m16n8k16 f16 -> f32) for comparison,
// one block an SM, W warps, each warp C independent accumulators in turn (bench/NOTES.md 84):
// with C = 1 a warp's MMAs each wait for the one before (the latency), with more chains and warps
// the SM's tensor cores fill (the throughput). Prints cycles per MMA per warp and per SM, and
// the grid's dense operations per second.
// make bench/mma_probe && ./bench/mma_probe
#include <cstdint>
#include <cstdio>

#include "probe.h"   // CK

constexpr int kIters = 4096;

__device__ __forceinline__ void imma(int d[4], uint4 a, uint2 b) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b.x), "r"(b.y));
}
__device__ __forceinline__ void hmma(float d[4], uint4 a, uint2 b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b.x), "r"(b.y));
}

// kChains accumulators a warp, kIters rounds of one MMA each; block 0's thread 0 times its loop.
template <int kChains, bool kHalf>
__global__ void mma_loop(int *out, long long *cycles) {
    const uint4 a = make_uint4(threadIdx.x, threadIdx.x * 3u, 7u, 9u);
    const uint2 b = make_uint2(threadIdx.x ^ 5u, 11u);
    int d[kChains][4] = {};
    float f[kChains][4] = {};
    const long long t0 = clock64();
    for (int i = 0; i < kIters; i++) {
#pragma unroll
        for (int c = 0; c < kChains; c++) {
            if (kHalf) hmma(f[c], a, b);
            else imma(d[c], a, b);
        }
    }
    const long long t1 = clock64();
    int s = 0;
    for (int c = 0; c < kChains; c++) s += d[c][0] + d[c][1] + d[c][2] + d[c][3] + (int)f[c][0];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;   // keeps the MMAs
    if (threadIdx.x == 0 && blockIdx.x == 0) *cycles = t1 - t0;
}

template <int kChains, bool kHalf>
int measure(int sms, int warps, int *out, long long *cycles) {
    mma_loop<kChains, kHalf><<<sms, 32 * warps>>>(out, cycles);   // warm-up
    CK(cudaGetLastError());
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0));
    mma_loop<kChains, kHalf><<<sms, 32 * warps>>>(out, cycles);
    CK(cudaGetLastError());
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    long long c = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaMemcpy(&c, cycles, sizeof c, cudaMemcpyDeviceToHost));
    const double per_warp = (double)kIters * kChains, ops = kHalf ? 2.0 * 16 * 8 * 16 : 2.0 * 16 * 8 * 32;
    printf("%s %d chains, %2d warps an SM | %5.1f cycles an MMA a warp | %5.2f cycles an MMA an SM | %6.0f T ops/s\n",
           kHalf ? "f16 m16n8k16" : "s8 m16n8k32 ", kChains, warps, c / per_warp, c / (per_warp * warps),
           per_warp * warps * sms * ops / (ms * 1e-3) / 1e12);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return 0;
}

int main() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    printf("%s, %d SMs\n", prop.name, sms);
    int *out;
    long long *cycles;
    CK(cudaMalloc(&out, (size_t)sms * 1024 * sizeof(int)));
    CK(cudaMalloc(&cycles, sizeof(long long)));
    int bad = measure<1, false>(sms, 1, out, cycles) || measure<4, false>(sms, 1, out, cycles) ||
              measure<1, false>(sms, 8, out, cycles) || measure<4, false>(sms, 8, out, cycles) ||
              measure<8, false>(sms, 8, out, cycles) || measure<4, false>(sms, 16, out, cycles) ||
              measure<1, true>(sms, 1, out, cycles) || measure<4, true>(sms, 8, out, cycles);
    CK(cudaFree(out));
    CK(cudaFree(cycles));
    return bad;
}
