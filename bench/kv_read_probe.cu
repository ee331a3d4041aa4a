// bench/kv_read_probe.cu: how fast one block an SM reads a 7B-shaped FP16 KV cache (32 heads x
// 128 elements, S positions, keys and values) the way the megakernel's attention does, against
// other ways (bench/NOTES.md 70). Block (head, split of 4) has W warps; warp w takes rows
// t0 + w, + W, ..., R rows a batch, all their loads in flight together:
//   pairs: a lane loads 4 bytes at elements 2 lane and 2 lane + 64 of a row (the megakernel's)
//   wide:  a lane loads 16 bytes, 16 lanes a row, so a warp reads two rows a load
// Layouts: position-major (t, h, d), as the engine stores the cache, or head-major (h, t, d).
// Each variant reads two copies in turn (L2 holds neither) 40 times in one launch.
// make bench/kv_read_probe && ./bench/kv_read_probe
#include <cstdio>
#include <cuda_fp16.h>

#include "probe.h"   // CK

constexpr int kHeads = 32, kHeadSize = 128, kSplits = 4, kPositions = 3584, kReps = 40;

struct Cache {
    const __half *k, *v;
};

// Element 0 of row t of head h.
template <bool kHeadMajor>
__device__ __forceinline__ size_t row_at(int t, int h, int S) {
    return kHeadMajor ? ((size_t)h * S + t) * kHeadSize : ((size_t)t * kHeads + h) * kHeadSize;
}

// A warp's rows [t0, t1) by 4-byte pairs; returns a value of every byte read.
template <int R, int W, bool kHeadMajor>
__device__ float read_pairs(Cache c, int h, int t0, int t1, int S) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float acc = 0.0f;
    for (int t = t0 + warp; t < t1; t += W * R) {
        unsigned k[R][2], v[R][2];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const size_t row = row_at<kHeadMajor>(min(t + W * r, t1 - 1), h, S);
#pragma unroll
            for (int i = 0; i < 2; i++) {
                k[r][i] = __ldcg(reinterpret_cast<const unsigned *>(c.k + row + 2 * lane + 64 * i));
                v[r][i] = __ldcg(reinterpret_cast<const unsigned *>(c.v + row + 2 * lane + 64 * i));
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) acc += __int_as_float(k[r][0] ^ v[r][0] ^ k[r][1] ^ v[r][1]);
    }
    return acc;
}

// A warp's rows [t0, t1) by 16-byte loads, two rows a load.
template <int R, int W, bool kHeadMajor>
__device__ float read_wide(Cache c, int h, int t0, int t1, int S) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = lane / 16, part = lane % 16;
    float acc = 0.0f;
    for (int t = t0 + 2 * warp + half; t - half < t1; t += 2 * W * R) {
        uint4 k[R], v[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const size_t row = row_at<kHeadMajor>(min(t + 2 * W * r, t1 - 1), h, S);
            k[r] = __ldcg(reinterpret_cast<const uint4 *>(c.k + row) + part);
            v[r] = __ldcg(reinterpret_cast<const uint4 *>(c.v + row) + part);
        }
#pragma unroll
        for (int r = 0; r < R; r++) acc += __int_as_float(k[r].x ^ v[r].y ^ k[r].z ^ v[r].w);
    }
    return acc;
}

template <int R, int W, bool kWide, bool kHeadMajor>
__global__ void __launch_bounds__(32 * W) read_cache(Cache c0, Cache c1, int reps, float *out) {
    const int h = blockIdx.x / kSplits, chunk = kPositions / kSplits, t0 = blockIdx.x % kSplits * chunk;
    float acc = 0.0f;
    for (int rep = 0; rep < reps; rep++) {
        const Cache c = rep % 2 ? c1 : c0;
        acc += kWide ? read_wide<R, W, kHeadMajor>(c, h, t0, t0 + chunk, kPositions)
                     : read_pairs<R, W, kHeadMajor>(c, h, t0, t0 + chunk, kPositions);
    }
    if (acc == 1.25f) out[blockIdx.x * 32 * W + threadIdx.x] = acc;   // (never: keeps the loads)
}

template <int R, int W, bool kWide, bool kHeadMajor>
int measure(const Cache c[2], float *out) {
    cudaEvent_t start, stop;
    CK(cudaEventCreate(&start));
    CK(cudaEventCreate(&stop));
    read_cache<R, W, kWide, kHeadMajor><<<kHeads * kSplits, 32 * W>>>(c[0], c[1], 2, out);   // warm-up
    CK(cudaGetLastError());
    CK(cudaEventRecord(start));
    read_cache<R, W, kWide, kHeadMajor><<<kHeads * kSplits, 32 * W>>>(c[0], c[1], kReps, out);
    CK(cudaGetLastError());
    CK(cudaEventRecord(stop));
    CK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CK(cudaEventElapsedTime(&ms, start, stop));
    const double bytes = 2.0 * kPositions * kHeads * kHeadSize * sizeof(__half), us = ms * 1e3 / kReps;
    printf("%-13s %2d warps, %2d rows a batch, %-5s loads: %6.2f us a read of %.1f MB, %5.0f GB/s\n",
           kHeadMajor ? "head-major" : "position-major", W, kWide ? 2 * R : R, kWide ? "16 B" : "4 B", us, bytes / 1e6,
           bytes / us / 1e3);
    CK(cudaEventDestroy(start));
    CK(cudaEventDestroy(stop));
    return 0;
}

int main() {
    const size_t n = (size_t)kPositions * kHeads * kHeadSize;
    Cache c[2];
    float *out = NULL;
    for (int i = 0; i < 2; i++) {
        __half *k = NULL, *v = NULL;
        CK(cudaMalloc(&k, n * sizeof(__half)));
        CK(cudaMalloc(&v, n * sizeof(__half)));
        CK(cudaMemset(k, 1, n * sizeof(__half)));
        CK(cudaMemset(v, 2, n * sizeof(__half)));
        c[i] = {k, v};
    }
    CK(cudaMalloc(&out, (size_t)kHeads * kSplits * 512 * sizeof(float)));
    for (int round = 0; round < 2; round++) {
        int rc = measure<8, 8, false, false>(c, out);
        rc |= measure<16, 8, false, false>(c, out);
        rc |= measure<8, 8, true, false>(c, out);
        rc |= measure<16, 8, true, false>(c, out);
        rc |= measure<8, 8, false, true>(c, out);
        rc |= measure<8, 12, false, false>(c, out);
        rc |= measure<8, 16, false, false>(c, out);
        rc |= measure<8, 16, true, false>(c, out);
        if (rc) return 1;
    }
    return 0;
}
