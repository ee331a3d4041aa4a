// bench/stage_probe.cu: the cluster step's staging of x's digits (cs_stage_digits) and each lane's
// load of its digits (CsLaneX::load), the engine's own code, by themselves in a loop in one block,
// so that what the hop's trace gives them (0.7-0.85 us and 0.2-0.4, NOTES 124 and 129) can be set
// against what their own chains take (bench/NOTES.md 131). One block of the cluster step's 8
// consumer warps (and its producer warp, idle, or waiting on an mbarrier as the producer waits for
// free ring slots); each round begins with the consumers' barrier, as a hop does:
//   mode 0   the round's barrier alone
//   mode 1   + x's digits staged, without a norm (the output projection's and w2's hops)
//   mode 2   + with the norm (QKV's and w1/w3's): the sums of squares and the inverse RMS
//   mode 3   + each lane's digits, steps and scale indices loaded, as a linear hop's rows use them
//            (every value loaded feeds the round's result, so that the compiler keeps every load)
// Prints ns a round: (the time of 3000 rounds - that of 1000) / 2000, each the median of 5 launches
// timed by events, launch and first round left out. With K and MODE, runs that mode alone (5
// launches of 1000 rounds), for a profiler (NOTES 134):
//   ncu --set full --kernel-name regex:stage_kernel --launch-skip 2 --launch-count 1 ./bench/stage_probe 576 2
// make bench/stage_probe && ./bench/stage_probe [K MODE]
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "../kernels.cu"   // cs_stage_digits, CsLaneX and their constants: one translation unit
#include "probe.h"         // CK

namespace {

// `rounds` rounds of mode kMode at K columns (groups of 128 of the weights' scales: 8 chunks);
// waiting_producer: the producer warp waits on an mbarrier until the consumers are done, else it
// leaves at once. sink: a value a thread, so that the rounds' results are used.
template <int kMode>
__global__ void __launch_bounds__(kCsThreads, 1) stage_kernel(int K, int rounds, bool waiting_producer, float *sink) {
    __shared__ __align__(16) uint32_t digits[3][kCsMaxX / 4];
    __shared__ float u[kCsMaxX / kCsGroup], ss[kCsMaxX / kCsGroup];
    __shared__ __align__(16) float x[2][kCsMaxX], gamma[kCsMaxX];
    __shared__ __align__(8) unsigned long long done;
    for (int i = threadIdx.x; i < kCsMaxX; i += kCsThreads) {
        x[0][i] = 0.01f * (float)((i * 37) % 101 - 50), x[1][i] = 0.02f * (float)((i * 53) % 97 - 48);
        gamma[i] = 1.0f + 0.001f * (float)(i % 13);
    }
    if (threadIdx.x == 0) mbar_init(cs_saddr(&done), 1), mbar_init_fence();
    __syncthreads();
    if (threadIdx.x >= kCsConsumers) {   // the producer warp
        if (waiting_producer) cs_wait(cs_saddr(&done), 0, CS_AT_EMPTY, 0);
        return;
    }
    float acc = 0.0f;
    for (int r = 0; r < rounds; r++) {
        cs_consumers_sync();   // as each hop begins
        if (kMode >= 1) acc += cs_stage_digits<false>(digits, u, ss, x[r & 1], K, kMode >= 2 ? gamma : nullptr, 1e-5f);
        if (kMode >= 3) {
            CsLaneXOf<kCsChunks> lx;
            lx.load(digits, u, K, SmallDiv(small_div_inverse(8)));
            uint32_t bits = 0;   // every value loaded is used, so that none of the loads is left out
#pragma unroll
            for (int j = 0; j < kCsChunks; j++) {
                acc += lx.u[j] + (float)lx.scale[j];
#pragma unroll
                for (int pl = 0; pl < 3; pl++) bits ^= lx.d[j][pl].x ^ lx.d[j][pl].y ^ lx.d[j][pl].z ^ lx.d[j][pl].w;
            }
            acc += (float)(int)bits;
        }
    }
    cs_consumers_sync();
    if (threadIdx.x == 0) mbar_arrive(cs_saddr(&done));   // the producer's wait ends
    sink[threadIdx.x] = acc;
}

using Kernel = void (*)(int, int, bool, float *);

// The median ms of 5 launches of `rounds` rounds; -1 on an error (printed).
float time_rounds(Kernel k, int K, int rounds, bool waiting_producer, float *sink) {
    char what[64];
    snprintf(what, sizeof what, "stage_probe: K %d, %d rounds", K, rounds);
    return median_ms([&] {
        k<<<1, kCsThreads>>>(K, rounds, waiting_producer, sink);
        return cudaGetLastError();
    }, 5, what);
}

}  // namespace

int main(int argc, char **argv) {
    cudaDeviceProp prop;
    if (need_sm90("stage_probe", "the cluster step's mbarriers", &prop)) return 1;
    float *sink;
    CK(cudaMalloc(&sink, kCsThreads * sizeof(float)));
    const Kernel kernels[] = {stage_kernel<0>, stage_kernel<1>, stage_kernel<2>, stage_kernel<3>};
    if (argc != 1 && argc != 3) {
        fprintf(stderr, "usage: %s [K MODE]\n", argv[0]);
        return 2;
    }
    if (argc == 3) {   // one mode at one K, for a profiler: ./bench/stage_probe K MODE
        const int K = atoi(argv[1]), m = atoi(argv[2]);
        if (K < 1 || K > kCsMaxX || m < 0 || m > 3) {
            fprintf(stderr, "stage_probe: K 1 to %d and MODE 0 to 3, got %s %s\n", kCsMaxX, argv[1], argv[2]);
            return 2;
        }
        const float ms = time_rounds(kernels[m], K, 1000, false, sink);
        if (ms < 0.0f) return 1;
        printf("K %d mode %d: 1000 rounds %.3f ms\n", K, m, ms);
        return 0;
    }
    printf("%s, one block of %d threads; ns a round (3000 rounds - 1000, medians of 5)\n", prop.name, kCsThreads);
    const char *modes[] = {"the barrier alone", "+ digits staged, no norm", "+ with the norm", "+ each lane's digits loaded"};
    const int Ks[] = {288, 576, 768, 1536};
    for (int producer = 0; producer < 2; producer++) {
        printf("the producer warp %s:\n", producer ? "waiting on an mbarrier" : "gone");
        for (int K : Ks) {
            printf("  K %4d:", K);
            for (int m = 0; m < 4; m++) {
                const float a = time_rounds(kernels[m], K, 1000, producer, sink), b = time_rounds(kernels[m], K, 3000, producer, sink);
                if (a < 0.0f || b < 0.0f) return 1;
                printf("  %s %.1f;", modes[m], (b - a) * 1e6f / 2000.0f);
            }
            printf("\n");
        }
    }
    CK(cudaFree(sink));
    return 0;
}
