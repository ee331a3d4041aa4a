// bench/hop_probe.cu: how long a small model's decode step could take as a chain of dependent
// GEMVs on a persistent grid in which every warp owns whole output rows (bench/NOTES.md 109):
// its rows' weights are loaded into registers before it waits for x, x goes over as flagged
// words in global memory (a float and its writer's tag in one 8-byte word), a lane loads only
// the elements of x it multiplies, and nothing on the path waits at a block barrier (or, in a
// second form, x is staged once a block). The megakernel's stages on the small shapes cost
// their blocks' own chains (NOTES 67, 69); this measures the chain of this other structure,
// without its attention and classifier, and the hand-overs alone on grids of 8 to all SMs.
//
// A layer is five hops: QKV (RMSNorm folded in), a stand-in for the attention (a dim x dim GEMV
// over q: the hand-over it needs, not its work), the output projection, w1/w3 with SwiGLU
// (RMSNorm folded in), w2. Weights int8, row-major, one FP32 scale per 128 columns; every layer
// its own (the step's bytes as a model's, more than L2 holds for the SmolLM2 shape).
// make bench/hop_probe && ./bench/hop_probe
#include <cstdio>
#include <cstdint>
#include <vector>

#include "probe.h"   // CK

constexpr int kWarps = 8, kRowsAWarp = 2, kChunksALane = 3, kGroup = 128;   // a chunk: 16 columns
__host__ __device__ constexpr int groups_of(int K) { return (K + kGroup - 1) / kGroup; }

struct Hop {
    int outputs, K, pair, norm;   // pair: output i from rows 2i (w1) and 2i + 1 (w3), silu(a) b
    const uint4 *w;               // (rows, K) int8
    const float *scale;           // (rows, groups_of(K))
    const unsigned long long *x;  // K words: (tag << 32) | float bits
    unsigned long long *y;        // outputs words
};

__device__ __forceinline__ ulonglong2 load_words(const unsigned long long *p) {
    ulonglong2 v;
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void store_word(unsigned long long *p, unsigned long long v) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
    return v;
}
__device__ __forceinline__ float dot16(uint4 w, const float *x) {
    const int32_t q[4] = {(int32_t)w.x, (int32_t)w.y, (int32_t)w.z, (int32_t)w.w};
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; i++) s += (float)(int8_t)(q[i / 4] >> (8 * (i % 4))) * x[i];
    return s;
}

// x of a hop into shared memory (two buffers, alternating: one barrier a hop), each thread
// polling its words until they carry the hop's tag.
__device__ void stage_x(const unsigned long long *x, int K, unsigned want, int backoff, float *xs) {
    for (int i = 2 * threadIdx.x; i < K; i += 2 * blockDim.x) {
        for (;;) {
            const ulonglong2 v = load_words(x + i);
            if ((unsigned)(v.x >> 32) == want && (unsigned)(v.y >> 32) == want) {
                xs[i] = __uint_as_float((unsigned)v.x), xs[i + 1] = __uint_as_float((unsigned)v.y);
                break;
            }
            if (backoff) __nanosleep(backoff);
        }
    }
    __syncthreads();
}

// Every hop of the step in order; tags epoch + hop + 1. kBlockX: x staged once a block
// (stage_x), else every warp polls the words its lanes multiply.
template <bool kPrefetch, bool kBlockX>
__global__ void __launch_bounds__(kWarps * 32, 1) hop_kernel(const Hop *hops, int n_hops, unsigned epoch, int backoff) {
    __shared__ __align__(16) float xs[2][32 * kChunksALane * 16];
    const int lane = threadIdx.x % 32, gw = blockIdx.x * kWarps + threadIdx.x / 32, warps = gridDim.x * kWarps;
    for (int h = 0; h < n_hops; h++) {
        const Hop hp = hops[h];
        const int chunks = hp.K / 16, per = hp.pair ? 2 : 1;
        const unsigned tag = epoch + h + 1;
        uint4 w[kRowsAWarp][2][kChunksALane];
        float sc[kRowsAWarp][2][kChunksALane];
        auto load_w = [&]() {
#pragma unroll
            for (int r = 0; r < kRowsAWarp; r++)
#pragma unroll
                for (int p = 0; p < 2; p++)
#pragma unroll
                    for (int j = 0; j < kChunksALane; j++) {
                        const int o = gw + r * warps, c = lane + 32 * j;
                        if (o < hp.outputs && p < per && c < chunks) {
                            const size_t row = (size_t)o * per + p;
                            w[r][p][j] = __ldg(hp.w + row * chunks + c);
                            sc[r][p][j] = __ldg(hp.scale + row * groups_of(hp.K) + c * 16 / kGroup);
                        }
                    }
        };
        if (kPrefetch) load_w();
        // x: this lane's chunks, polled until every word carries the hop's tag
        float x[kChunksALane][16];
        if (kBlockX) {
            stage_x(hp.x, hp.K, epoch + h, backoff, xs[h % 2]);
#pragma unroll
            for (int j = 0; j < kChunksALane; j++)
#pragma unroll
                for (int i = 0; i < 16; i++) x[j][i] = lane + 32 * j < chunks ? xs[h % 2][16 * (lane + 32 * j) + i] : 0.0f;
        }
        while (!kBlockX) {
            bool ok = true;
#pragma unroll
            for (int j = 0; j < kChunksALane; j++) {
                const int c = lane + 32 * j;
                if (c >= chunks) continue;
#pragma unroll
                for (int q = 0; q < 8; q++) {
                    const ulonglong2 v = load_words(hp.x + 16 * c + 2 * q);
                    ok = ok && (unsigned)(v.x >> 32) == epoch + h && (unsigned)(v.y >> 32) == epoch + h;
                    x[j][2 * q] = __uint_as_float((unsigned)v.x), x[j][2 * q + 1] = __uint_as_float((unsigned)v.y);
                }
            }
            if (__all_sync(~0u, ok)) break;
            if (backoff) __nanosleep(backoff);
        }
        if (!kPrefetch) load_w();
        float inv = 1.0f;
        if (hp.norm) {
            float ss = 0.0f;
#pragma unroll
            for (int j = 0; j < kChunksALane; j++)
#pragma unroll
                for (int i = 0; i < 16; i++) ss += lane + 32 * j < chunks ? x[j][i] * x[j][i] : 0.0f;
            inv = rsqrtf(warp_sum(ss) / hp.K + 1e-5f);
        }
#pragma unroll
        for (int r = 0; r < kRowsAWarp; r++) {
            const int o = gw + r * warps;
            if (o >= hp.outputs) break;   // (the same for the whole warp)
            float a[2] = {0.0f, 0.0f};
#pragma unroll
            for (int p = 0; p < 2; p++)
#pragma unroll
                for (int j = 0; j < kChunksALane; j++)
                    if (p < per && lane + 32 * j < chunks) a[p] += sc[r][p][j] * dot16(w[r][p][j], x[j]);
            a[0] = warp_sum(a[0]) * inv;
            if (hp.pair) a[1] = warp_sum(a[1]) * inv, a[0] = a[0] / (1.0f + __expf(-a[0])) * a[1];
            if (lane == 0) store_word(hp.y + o, (unsigned long long)tag << 32 | __float_as_uint(tanhf(a[0])));
        }
    }
}

// The hand-overs alone: each hop stages x a block (stage_x) and every warp writes its outputs, a
// function of one element of x each, without weights or sums; on any number of blocks.
__global__ void __launch_bounds__(kWarps * 32, 1) handover_kernel(const Hop *hops, int n_hops, unsigned epoch, int backoff) {
    __shared__ __align__(16) float xs[2][32 * kChunksALane * 16];
    const int lane = threadIdx.x % 32, gw = blockIdx.x * kWarps + threadIdx.x / 32, warps = gridDim.x * kWarps;
    for (int h = 0; h < n_hops; h++) {
        const Hop hp = hops[h];
        stage_x(hp.x, hp.K, epoch + h, backoff, xs[h % 2]);
        const unsigned long long tag = (unsigned long long)(epoch + h + 1) << 32;
        for (int o = gw * 32 + lane; o < hp.outputs; o += warps * 32)
            store_word(hp.y + o, tag | __float_as_uint(0.5f * xs[h % 2][o % hp.K]));
    }
}

// x of hop 0 with tag epoch (written by the host between launches: the step's embedding row).
__global__ void seed_kernel(unsigned long long *x, int n, unsigned epoch) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = (unsigned long long)epoch << 32 | __float_as_uint(0.01f * (i % 17) - 0.08f);
}

struct Shape {
    const char *name;
    int dim, hidden, layers, qkv;
};

static int run_shape(Shape s, int sms) {
    std::vector<Hop> hops;
    std::vector<void *> owned;
    unsigned long long *x0 = nullptr;
    CK(cudaMalloc(&x0, s.dim * 8));
    owned.push_back(x0);
    const unsigned long long *x = x0;
    size_t bytes = 0;
    auto add = [&](int outputs, int K, int pair, int norm) -> int {
        const size_t rows = (size_t)outputs * (pair ? 2 : 1);
        void *w, *sc, *y;
        CK(cudaMalloc(&w, rows * K));
        CK(cudaMalloc(&sc, rows * groups_of(K) * 4));
        CK(cudaMalloc(&y, (size_t)outputs * 8));
        CK(cudaMemset(w, 0x35, rows * K));   // (any bytes: the time does not depend on them)
        CK(cudaMemset(sc, 0x3b, rows * groups_of(K) * 4));
        CK(cudaMemset(y, 0, (size_t)outputs * 8));
        owned.push_back(w), owned.push_back(sc), owned.push_back(y);
        hops.push_back({outputs, K, pair, norm, (const uint4 *)w, (const float *)sc, x, (unsigned long long *)y});
        x = (const unsigned long long *)y, bytes += rows * K;
        return 0;
    };
    for (int l = 0; l < s.layers; l++) {
        if (add(s.qkv, s.dim, 0, 1)) return 1;
        if (add(s.dim, s.dim, 0, 0)) return 1;   // the attention's stand-in, over q
        if (add(s.dim, s.dim, 0, 0)) return 1;   // output projection
        if (add(s.hidden, s.dim, 1, 1)) return 1;
        if (add(s.dim, s.hidden, 0, 0)) return 1;
    }
    for (const Hop &h : hops)
        if (h.outputs > kRowsAWarp * sms * kWarps || h.K / 16 > 32 * kChunksALane || h.K % 16) {
            fprintf(stderr, "%s: a hop of %d outputs, K %d does not fit the probe\n", s.name, h.outputs, h.K);
            return 1;
        }
    Hop *dh = nullptr;
    CK(cudaMalloc(&dh, hops.size() * sizeof(Hop)));
    CK(cudaMemcpy(dh, hops.data(), hops.size() * sizeof(Hop), cudaMemcpyHostToDevice));
    const int n = (int)hops.size();
    unsigned epoch = 0;
    // us a step of launch(epoch) (launches each step's kernel), over 200 steps after 20 unmeasured;
    // the step's x seeded before each
    auto time_steps = [&](auto launch, double *step_us) -> int {
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        const int reps = 200;
        for (int rep = -20; rep < reps; rep++) {
            seed_kernel<<<8, 256>>>(x0, s.dim, epoch);
            if (rep == 0) CK(cudaEventRecord(e0));
            launch(epoch);
            CK(cudaGetLastError());
            epoch += n + 1;
        }
        float ms = 0.0f;
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
        *step_us = 1e3 * ms / reps;
        return 0;
    };
    double step_us = 0.0;
    for (int variant = 0; variant < 3; variant++)
        for (int backoff : {0, 100, 400}) {
            const bool prefetch = variant != 1, block_x = variant == 2;
            auto launch = [&](unsigned ep) {
                if (block_x) hop_kernel<true, true><<<sms, kWarps * 32>>>(dh, n, ep, backoff);
                else if (prefetch) hop_kernel<true, false><<<sms, kWarps * 32>>>(dh, n, ep, backoff);
                else hop_kernel<false, false><<<sms, kWarps * 32>>>(dh, n, ep, backoff);
            };
            if (time_steps(launch, &step_us)) return 1;
            printf("%-14s %2d layers %3d hops, x %s, weights loaded %s, backoff %3d ns: %7.2f us a step (launch included), "
                   "%5.2f us a hop, %6.2f us a layer; %.1f MB of weights, %.0f GB/s\n",
                   s.name, s.layers, n, block_x ? "staged a block" : "polled a warp", prefetch ? "before the wait" : "after it", backoff,
                   step_us, step_us / n, step_us / s.layers, bytes / 1e6, bytes / step_us / 1e3);
        }
    for (int blocks : {sms, 64, 32, 16, 8}) {
        if (time_steps([&](unsigned ep) { handover_kernel<<<blocks, kWarps * 32>>>(dh, n, ep, 0); }, &step_us)) return 1;
        printf("%-14s %2d layers %3d hops, the hand-overs alone (no weights) on %3d blocks: %7.2f us a step, %5.2f us a hop\n", s.name,
               s.layers, n, blocks, step_us, step_us / n);
    }
    for (void *p : owned) CK(cudaFree(p));
    CK(cudaFree(dh));
    return 0;
}

int main() {
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const Shape shapes[] = {{"smollm2-135m", 576, 1536, 30, 576 + 2 * 192}, {"stories15m", 288, 768, 6, 3 * 288}};
    for (const Shape &s : shapes)
        if (run_shape(s, sms)) return 1;
    return 0;
}
