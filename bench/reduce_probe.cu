// bench/reduce_probe.cu: what a hand-over to every block costs when its data is a sum of partial
// rows added in L2 by the blocks that made them (a split-K output or down projection adding
// into the residual stream), against a hand-over that only counts (bench/NOTES.md 113).
//
// A persistent grid of B blocks (one an SM), R rounds, each a hand-over of a vector of D floats:
//   count   each block counts the round (a release add), polls the count until every block has,
//           then loads the vector (the floor: no data added)
//   red     each block adds its slice of partial rows with vector reductions (red.add.v4.f32),
//           then counts; polls; loads the vector
//   bulk    the same slice from shared memory by one bulk reduce-add copy (cp.reduce.async.bulk),
//           waited for, then counted; polls; loads
// The blocks form A groups (the clusters of the design); each group's blocks split the D rows
// between them, so each element gets A additions a round (A = B: every block adds all D rows).
// The vector rotates over three buffers: round r adds into buffer r % 3, and a block zeroes
// buffer (r + 1) % 3 before it counts round r (its last readers counted round r - 1 before).
// Optionally every block also streams a large buffer through a ring of bulk copies with one more
// warp, so that the hand-overs run under DRAM's queue as a decode step's do. Each partial row is a
// multiple of 2^-10 and small, so every sum is exact whatever the order: a checking pass compares
// each block's loaded vector with the exact sum at every round. A poll that does not end within
// about a second prints which and traps (the launch fails with an error instead of hanging).
// make bench/reduce_probe && ./bench/reduce_probe
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>

#include "probe.h"   // CK

namespace {

constexpr int kThreads = 256, kSlots = 4, kSlotBytes = 32768, kMaxD = 4096;
constexpr long long kGiveUp = 2000000000ll;   // cycles a poll may take (about 1 s)
enum Mode { kCount, kRed, kBulk };

struct Probe {
    float *buf[3];            // (D) each
    unsigned *count;          // the blocks' counts, all rounds (zeroed before a launch)
    const uint8_t *stream;    // streamed by the extra warp (stream_bytes), or NULL
    long long stream_bytes;
    int mode, groups, D, rounds, check;
    int *bad;                 // the elements that differed in the checking launch
    float *sink;              // (gridDim.x) so that the loads stay
};

// Block b's partial row i at round r: a small multiple of 2^-10 (sums exact in FP32).
__host__ __device__ float partial(int b, int i, int r) { return (float)((7 * b + 3 * i + 5 * r) % 17 - 8) * (1.0f / 1024.0f); }

// Block b's slice of the rows: group g's blocks split D between them.
struct Slice {
    int first, n;
};
__device__ Slice slice_of(int b, int B, int groups, int D) {
    const int per_group = B / groups, j = b % per_group, n = (D / 4 + per_group - 1) / per_group * 4;
    const int first = j * n;
    return {first, max(0, min(n, D - first))};
}

__device__ __forceinline__ unsigned load_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void count_release(unsigned *p) { asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory"); }
__device__ __forceinline__ void red_add4(float *p, float4 v) {
    asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
__device__ __forceinline__ uint32_t saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __noinline__ void hung(const char *what, int n) {
    printf("reduce_probe: block %d thread %d waited too long for %s %d\n", blockIdx.x, threadIdx.x, what, n);
    __trap();
}
// Waits for the phase of parity `parity` of the mbarrier at a (or traps after about a second).
__device__ void slot_wait(uint32_t a, int parity, int n) {
    const long long t0 = clock64();
    for (;;) {
        uint32_t done;
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done) : "r"(a), "r"(parity) : "memory");
        if (done) return;
        if (clock64() - t0 > kGiveUp) hung("the stream's copy", n);
    }
}
// The consumers' barrier (the streaming warp never takes part).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kThreads) : "memory"); }

// The extra warp's stream: 32 KB copies into a ring of kSlots, each slot's next copy issued once
// its last has landed, until the consumers set *stop; every copy landed before it returns.
__device__ void stream_until(const Probe &p, uint8_t *ring, unsigned long long *full, volatile int *stop) {
    if (threadIdx.x % 32) return;
    const long long per_block = p.stream_bytes / gridDim.x / kSlotBytes * kSlotBytes;
    const uint8_t *mine = p.stream + per_block * blockIdx.x;
    long long at = 0;
    int issued = 0;
    for (; !*stop; issued++) {
        const int slot = issued % kSlots;
        if (issued >= kSlots) slot_wait(saddr(&full[slot]), (issued / kSlots - 1) & 1, issued - kSlots);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(&full[slot])), "r"(kSlotBytes) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(saddr(ring + slot * kSlotBytes)),
                     "l"(mine + at), "r"(kSlotBytes), "r"(saddr(&full[slot]))
                     : "memory");
        at = at + kSlotBytes < per_block ? at + kSlotBytes : 0;
    }
    for (int k = issued > kSlots ? issued - kSlots : 0; k < issued; k++)   // the copies still in flight
        slot_wait(saddr(&full[k % kSlots]), (k / kSlots) & 1, k);
}

// This block's part of round r: its partial rows added into buffer r % 3 (red, bulk), buffer
// (r + 1) % 3 zeroed where this block is round r's zeroer, then its count.
__device__ void give(const Probe &p, float *part, int r, int B) {
    const Slice sl = slice_of(blockIdx.x, B, p.groups, p.D);
    float *dst = p.buf[r % 3];
    if (p.mode == kRed)
        for (int i = 4 * threadIdx.x; i < sl.n; i += 4 * kThreads) {
            const int e = sl.first + i;
            red_add4(dst + e, make_float4(partial(blockIdx.x, e, r), partial(blockIdx.x, e + 1, r), partial(blockIdx.x, e + 2, r),
                                          partial(blockIdx.x, e + 3, r)));
        }
    if (p.mode == kBulk) {
        for (int i = threadIdx.x; i < sl.n; i += kThreads) part[i] = partial(blockIdx.x, sl.first + i, r);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // the rows, before the copy reads them
    }
    if (r % B == (int)blockIdx.x)
        for (int i = threadIdx.x; i < p.D; i += kThreads) p.buf[(r + 1) % 3][i] = 0.0f;
    consumers_sync();
    if (threadIdx.x) return;
    if (p.mode == kBulk && sl.n > 0) {
        asm volatile("fence.proxy.async.global;" ::: "memory");   // the zeroing seen before, ordered before the adds
        asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst + sl.first), "r"(saddr(part)),
                     "r"(4 * sl.n)
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group 0;" ::: "memory");
        asm volatile("fence.proxy.async.global;" ::: "memory");
    }
    count_release(p.count);
}

// Waits until every block has counted round r, then loads buffer r % 3 (and checks it).
__device__ float take(const Probe &p, float *x, int r, int B) {
    if (threadIdx.x == 0) {
        const unsigned want = (unsigned)B * (r + 1);
        const long long t0 = clock64();
        while (load_acquire(p.count) < want)
            if (clock64() - t0 > kGiveUp) hung("the count of round", r);
    }
    consumers_sync();
    const float *src = p.buf[r % 3];
    float acc = 0.0f;
    for (int i = threadIdx.x; i < p.D; i += kThreads) {
        const float v = __ldcg(src + i);
        x[i] = v, acc += v;
        if (p.check) {
            float want = 0.0f;
            if (p.mode != kCount)
                for (int g = 0, per = B / p.groups; g < p.groups; g++)
                    for (int j = 0; j < per; j++) {
                        const Slice sl = slice_of(g * per + j, B, p.groups, p.D);
                        if (i >= sl.first && i < sl.first + sl.n) want += partial(g * per + j, i, r);
                    }
            if (!(v == want)) atomicAdd(p.bad, 1);
        }
    }
    return acc;   // (x is next written after give's barrier)
}

__global__ void __launch_bounds__(kThreads + 32, 1) reduce_kernel(Probe p) {
    extern __shared__ __align__(128) uint8_t smem[];
    uint8_t *ring = smem;
    float *part = reinterpret_cast<float *>(smem + kSlots * kSlotBytes), *x = part + kMaxD;
    __shared__ unsigned long long full[kSlots];
    __shared__ int stop;
    if (threadIdx.x == 0) {
        for (int i = 0; i < kSlots; i++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&full[i])) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        stop = 0;
    }
    __syncthreads();
    if (threadIdx.x >= kThreads) {
        if (p.stream) stream_until(p, ring, full, &stop);
        return;
    }
    const int B = gridDim.x;
    float acc = 0.0f;
    for (int r = 0; r < p.rounds; r++) {
        give(p, part, r, B);
        acc += take(p, x, r, B);
    }
    if (threadIdx.x == 0) *(volatile int *)&stop = 1;
    if (acc == 1.2345f) p.sink[blockIdx.x] = acc;
}

int run(const char *name, Probe p, int blocks, size_t smem, int reps, double *us) {
    float ms_best = 1e30f;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int k = 0; k <= reps; k++) {
        p.check = k == 0;   // the first launch checks every element of every round; the others are timed
        CK(cudaMemset(p.count, 0, sizeof(unsigned)));
        for (int i = 0; i < 3; i++) CK(cudaMemset(p.buf[i], 0, kMaxD * sizeof(float)));
        CK(cudaMemset(p.bad, 0, sizeof(int)));
        CK(cudaEventRecord(a));
        reduce_kernel<<<blocks, kThreads + 32, smem>>>(p);
        CK(cudaGetLastError());
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        int bad;
        CK(cudaMemcpy(&bad, p.bad, sizeof bad, cudaMemcpyDeviceToHost));
        if (bad) return fprintf(stderr, "%s: %d elements loaded were not the exact sums\n", name, bad), 1;
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (k > 0 && ms < ms_best) ms_best = ms;
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    *us = ms_best * 1e3 / p.rounds;
    return 0;
}

int probe_main() {
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const size_t smem = kSlots * kSlotBytes + 2 * kMaxD * sizeof(float);
    CK(cudaFuncSetAttribute(reduce_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, reduce_kernel, kThreads + 32, smem));
    if (per_sm < 1) return fprintf(stderr, "reduce_probe: the kernel does not fit an SM\n"), 1;
    Probe p = {};
    for (int i = 0; i < 3; i++) CK(cudaMalloc(&p.buf[i], kMaxD * sizeof(float)));
    CK(cudaMalloc(&p.count, sizeof(unsigned)));
    CK(cudaMalloc(&p.bad, sizeof(int)));
    CK(cudaMalloc(&p.sink, sms * sizeof(float)));
    const long long stream_bytes = 1ll << 30;   // far past L2
    uint8_t *stream;
    CK(cudaMalloc(&stream, stream_bytes));
    CK(cudaMemset(stream, 0x5a, stream_bytes));
    p.stream_bytes = stream_bytes, p.rounds = 2000;
    printf("reduce_probe: us a hand-over (best of 5 launches of %d rounds; the first launch checks every sum)\n", p.rounds);
    printf("%-6s %6s %6s %6s %8s %12s\n", "mode", "blocks", "groups", "D", "stream", "us a round");
    const char *names[] = {"count", "red", "bulk"};
    const int block_counts[] = {128, 64, 16};
    for (int streamed = 0; streamed < 2; streamed++)
        for (int B : block_counts) {
            if (B > sms) continue;
            for (int D : {2048, 576})
                for (int mode = kCount; mode <= kBulk; mode++)
                    for (int groups : {B / 16 > 0 ? B / 16 : 1, B}) {
                        if (mode == kCount && groups != B) continue;   // (no data: groups do not matter)
                        p.mode = mode, p.groups = groups, p.D = D, p.stream = streamed ? stream : nullptr;
                        double us;
                        if (run(names[mode], p, B, smem, 5, &us)) return 1;
                        printf("%-6s %6d %6d %6d %8s %12.3f\n", names[mode], B, groups, D, streamed ? "yes" : "no", us);
                    }
        }
    return 0;
}

}  // namespace

int main() { return probe_main(); }
