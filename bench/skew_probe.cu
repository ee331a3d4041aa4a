// bench/skew_probe.cu: the megakernel's weight stream by itself, to measure what a grid-wide
// hand-over at each matrix's end costs it and what decides that cost (bench/NOTES.md 91). As in
// cuda/megakernel.cuh: one block an SM, four pipes of a producer warp and two consumer warps, ring
// slots of 16 KB (two a pipe), one copy in flight a pipe, bulk copies marked evict_first. The
// step: kLayers layers of a 7B's four matrices (QKV, output projection, w1/w3, w2). Variants:
//   hand-over   each block's consumers wait, at a matrix's start, until every block (or all but
//               `ignore`) has counted the matrix before done (a release add a block, polled by
//               an acquire load; `order`: either or both relaxed, to measure what the
//               ordering costs, or the polls relaxed and one fence after them),
//               then load x_bytes of an activation vector through L2, as the
//               megakernel's stages do; the producers never wait for it (the next matrix's
//               tiles stream into the ring)
//   stall       instead of a hand-over, the consumers stop for a fixed time at each matrix's start
//   claim       0: a block streams a contiguous 1/132 of each matrix (the megakernel's schedule;
//               `interleave`: every 132nd tile); C: each pipe claims C tiles at a time from the
//               matrix's counter (one claim ahead)
//   work        cycles a consumer warp group spends on a tile after it has landed (its math)
//   slots, tile bytes, in flight, prefetch (tiles asked of L2 while the ring is full)
// With claims each producer ends its share of a matrix with a marker slot (no copy), since the
// consumers cannot know how many tiles they get; static shares need none (a marker would take a
// slot at every matrix's end, which the megakernel's ring does not). Prints each variant's time
// a step, its rate against
// 4480 GB/s, the spread of the blocks' ends of each matrix (max - median / max - min, the median
// over layers, us) and, with hand-overs, the medians over blocks and matrices of the time from the
// last block's count to a block passing its wait, and from its own count to passing it (us). A
// wait that does not end within about a second is reported, not hung.
// make bench/skew_probe && ./bench/skew_probe [a part of the variants' names: only those] [blocks]
// (blocks: a block an SM on that many SMs, all by default: what one SM's stream reaches when fewer
// of them stream, as a cluster of 16 does)
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <vector>

#include "probe.h"   // CK

namespace {

constexpr int kPipes = 4, kGroupThreads = 64, kConsumers = kPipes * kGroupThreads, kThreads = kConsumers + 32 * kPipes;
// The ring: up to 192 KB a block, in tiles of 16 KB (3 slots a pipe at most) or 8 KB (6).
constexpr int kRingBytes = 196608, kMaxSlotsPerPipe = 6, kSlots = kPipes * kMaxSlotsPerPipe, kTileBytes = 16384;
constexpr int kLayers = 8, kMatrices = 4, kStages = kLayers * kMatrices, kEnd = -1;
// A 7B layer's matrices in 16 KB tiles: QKV 3 x 4096 x 4096, output 4096 x 4096, w1/w3 2 x 11008
// x 4096, w2 4096 x 11008 bytes.
constexpr int kTilesOf[kMatrices] = {3072, 1024, 5504, 2752};
constexpr const char *kNames[kMatrices] = {"QKV", "output", "w1/w3", "w2"};

// How a hand-over orders its memory (Probe::order; kCountRelaxed or kPollsRelaxed without
// kPollFence: wrong as a schedule, a measurement only).
enum HandOver {
    kCountRelaxed = 1,   // the count a relaxed add, not a release
    kPollsRelaxed = 2,   // the polls relaxed loads, not acquire
    kPollFence = 4,      // one fence.acq_rel.gpu after the polls
    kStoresAfter = 8,    // the block's own stores (its end's time, its tile count) after its count
    kHoldCopies = 16,    // no copy of a matrix's tiles until the block has counted the matrix before
                         // (so that none is in flight at its release)
};

struct Probe {
    const uint8_t *w;               // the step's tiles, stage after stage
    long long first_tile[kStages];  // each stage's first tile in w
    int tiles[kStages];
    int hand_over, claim, work, x_bytes, slots, in_flight;   // slots a pipe; copies in flight a pipe (1 or 2)
    int prefetch;      // tiles a pipe asks L2 for ahead of its ring while the ring is full (static only)
    int ignore;        // the hand-over waits for all blocks but this many (a bound, not a schedule)
    int interleave;    // static: block b takes tiles b, b + gridDim.x, ... instead of a contiguous share
    int stall;         // without hand-over: cycles the consumers stop for at each stage's start instead
    int tile_bytes;    // 16384 or 8192
    int order;         // the hand-over's ordering: HandOver bits (0: release add, acquire polls)
    unsigned *counters;             // (kStages) blocks done
    unsigned *claims;               // (kStages) tiles claimed
    unsigned *consumed;             // (kStages) tiles consumed (a check)
    const float *x;                 // the activation vector the consumers load after a hand-over
    float *sink;                    // (gridDim.x) what the consumers read, so that nothing is optimised out
    unsigned long long *ends;       // (kStages, gridDim.x) when each block finished each stage (ns)
    unsigned long long *passed;     // (kStages, gridDim.x) when each block's consumers passed the stage's hand-over (ns)
};

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint32_t bar, int n) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(n) : "memory"); }
__device__ __forceinline__ void mbar_arrive(uint32_t bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory"); }
// A wait that has not ended after about a second records where it was (Stuck, in host-mapped
// memory) and gives up, so that a schedule's bug shows as a message instead of a hung GPU.
struct Stuck {
    int what, block, thread, stage;
};
__device__ Stuck *g_stuck;
__device__ bool give_up(int what, int stage) {
    if (atomicCAS(&g_stuck->what, 0, what) == 0) g_stuck->block = blockIdx.x, g_stuck->thread = threadIdx.x, g_stuck->stage = stage;
    __threadfence_system();
    return true;
}
__device__ __forceinline__ bool stuck() { return *(volatile int *)&g_stuck->what != 0; }
__device__ __forceinline__ bool mbar_test(uint32_t bar, int parity) {
    uint32_t done;
    asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    return done;
}
__device__ __forceinline__ void prefetch_l2(const void *src, int bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity, int what, int stage) {
    for (long long i = 0;; i++) {
        uint32_t done;
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
        if (done) return;
        if ((i & 1023) == 1023 && (stuck() || (i > (1 << 20) && give_up(what, stage)))) return;
    }
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, int bytes, uint32_t bar, uint64_t policy) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(policy) : "memory");
}
__device__ __forceinline__ unsigned load_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned load_relaxed(const unsigned *p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory"); }

// A pipe's ring position: its slot (pipe + kPipes i) and that slot's phase parity.
struct Cursor {
    int n = 0, per_pipe;
    __device__ int slot(int pipe) const { return pipe + kPipes * (n % per_pipe); }
    __device__ int parity() const { return (n / per_pipe) & 1; }
};

// Static shares: pipe `pipe`'s tiles of a stage of T tiles are first, first + step, ... < end.
struct TileList {
    int first, end, step;
    __device__ int count() const { return first < end ? (end - first + step - 1) / step : 0; }
};
__device__ TileList static_list(const Probe &p, int T, int pipe) {
    if (p.interleave) return {(int)(blockIdx.x + gridDim.x * pipe), T, (int)gridDim.x * kPipes};
    return {(int)((long long)T * blockIdx.x / gridDim.x) + pipe, (int)((long long)T * (blockIdx.x + 1) / gridDim.x), kPipes};
}

// Producer lane 0 of pipe `pipe`: its tiles of every stage, and with claims a marker after each
// stage's (static shares need none: the consumers know their tiles, and the ring runs on across
// stages as the megakernel's does).
__device__ void produce(const Probe &p, int pipe, uint8_t *ring, int *header, uint64_t *full, uint64_t *empty) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    Cursor c;
    c.per_pipe = p.slots;
    // the slots of the last two copies issued and their parities ([0] the last); -1: none, or landed
    int last[2] = {-1, -1}, last_parity[2] = {0, 0};
    int list_end = 0, list_step = 1, prefetched = -1;   // the pipe's static list of the stage: tile, + step, ... < end
    auto put = [&](int s, int tile) {
        const int slot = c.slot(pipe);
        if (c.n >= p.slots && p.prefetch && tile != kEnd && !mbar_test(smem_u32(&empty[slot]), c.parity() ^ 1)) {
            // the ring is full: the next tiles of the list asked of L2 (each once)
            for (int k = 0, t = tile; k < p.prefetch && t < list_end; k++, t += list_step)
                if (t > prefetched) prefetch_l2(p.w + (p.first_tile[s] + t) * p.tile_bytes, p.tile_bytes), prefetched = t;
        }
        if (c.n >= p.slots) mbar_wait(smem_u32(&empty[slot]), c.parity() ^ 1, 1, s);
        for (int i = 0; i < 2; i++)
            if (slot == last[i]) last[i] = -1;   // its copy was used, so it landed (and a marker may rearm the slot)
        const int before = last[p.in_flight - 1];   // the copy in_flight before this one must have landed
        if (tile != kEnd && before >= 0) mbar_wait(smem_u32(&full[before]), last_parity[p.in_flight - 1], 2, s);
        header[slot] = tile == kEnd ? kEnd : s;
        if (tile == kEnd) {
            mbar_arrive(smem_u32(&full[slot]));
        } else {
            bulk_copy(smem_u32(ring + (size_t)slot * p.tile_bytes), p.w + (p.first_tile[s] + tile) * p.tile_bytes,
                      p.tile_bytes, smem_u32(&full[slot]), policy);
            last[1] = last[0], last_parity[1] = last_parity[0];
            last[0] = slot, last_parity[0] = c.parity();
        }
        c.n++;
    };
    for (int s = 0; s < kStages; s++) {
        const int T = p.tiles[s];
        if (p.claim == 0) {
            const TileList l = static_list(p, T, pipe);
            list_end = l.end, list_step = l.step, prefetched = -1;
            if (p.order & kHoldCopies)
                for (long long i = 0; s > 0 && *(volatile int *)&header[kSlots] < s - 1; i++)
                    if ((i & 1023) == 1023 && (stuck() || (i > (1 << 24) && give_up(5, s)))) break;
            for (int t = l.first; t < l.end; t += l.step) put(s, t);
        } else {
            unsigned next = atomicAdd(&p.claims[s], p.claim);
            for (;;) {
                const int at = (int)next;
                if (at >= T) break;
                next = atomicAdd(&p.claims[s], p.claim);   // one claim ahead: its answer is needed a chunk later
                for (int t = at; t < min(at + p.claim, T); t++) put(s, t);
            }
            put(s, kEnd);
        }
    }
}

// Consumer warp group `pipe`: each stage's hand-over (thread 0 polls, every consumer loads its
// part of x), then its pipe's tiles (static: as many as its list holds; claims: until the
// marker), then the block's count.
__device__ void consume(const Probe &p, int pipe, const uint8_t *ring, const int *header, uint64_t *full,
                        uint64_t *empty) {
    const int t = threadIdx.x, lane = t % kGroupThreads;
    Cursor c;
    c.per_pipe = p.slots;
    uint32_t acc = 0;
    for (int s = 0; s < kStages; s++) {
        if (p.stall && s > 0) {
            if (t == 0)
                for (const long long t0 = clock64(); clock64() - t0 < p.stall;) {}
            consumer_sync();
        }
        if (p.hand_over && s > 0) {
            if (t == 0) {
                for (long long i = 0; (p.order & kPollsRelaxed ? load_relaxed(p.counters + s - 1) : load_acquire(p.counters + s - 1)) < gridDim.x - p.ignore; i++)
                    if ((i & 1023) == 1023 && (stuck() || (i > (1 << 20) && give_up(4, s)))) break;
                if (p.order & kPollFence) asm volatile("fence.acq_rel.gpu;" ::: "memory");
            }
            consumer_sync();
            if (t == 0) p.passed[(size_t)s * gridDim.x + blockIdx.x] = now_ns();
            for (int i = t; i < p.x_bytes / 16; i += kConsumers) acc ^= __float_as_uint(__ldcg(reinterpret_cast<const float4 *>(p.x) + i).x);
        }
        unsigned tiles = 0;
        const int expected = p.claim ? -1 : static_list(p, p.tiles[s], pipe).count();
        for (bool end = expected == 0; !end; c.n++) {
            const int slot = c.slot(pipe);
            mbar_wait(smem_u32(&full[slot]), c.parity(), 3, s);
            end = header[slot] == kEnd || (int)tiles + 1 == expected;   // a marker, or the list's last tile
            if (header[slot] != kEnd) {
                const long long t0 = clock64();
                const uint4 *tile = reinterpret_cast<const uint4 *>(ring + (size_t)slot * p.tile_bytes);
                for (int i = lane; i < p.tile_bytes / 16; i += kGroupThreads) acc ^= tile[i].x ^ tile[i].w;
                while (clock64() - t0 < p.work) {}
                tiles++;
            }
            mbar_arrive(smem_u32(&empty[slot]));   // a marker's slot too: its producer reuses it
        }
        const bool stores_after = p.order & kStoresAfter;   // the block's own stores after its count, none before
        if (!stores_after && lane == 0 && tiles) atomicAdd(p.consumed + s, tiles);
        consumer_sync();
        if (t == 0) {
            const unsigned long long end = now_ns();
            if (!stores_after) p.ends[(size_t)s * gridDim.x + blockIdx.x] = end;
            if (p.order & kCountRelaxed) asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(p.counters + s) : "memory");
            else asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p.counters + s) : "memory");
            if (stores_after) p.ends[(size_t)s * gridDim.x + blockIdx.x] = end;
            *(volatile int *)&header[kSlots] = s;   // counted: the producers may copy again (kHoldCopies)
        }
        if (stores_after && lane == 0 && tiles) atomicAdd(p.consumed + s, tiles);
    }
    if (acc == 0x12345678u) p.sink[blockIdx.x] = 1.0f;
}

__global__ void __launch_bounds__(kThreads, 1) skew_kernel(Probe p) {
    extern __shared__ __align__(1024) uint8_t ring[];
    __shared__ uint64_t full[kSlots], empty[kSlots];
    __shared__ int header[kSlots + 1];   // each slot's stage or kEnd; then the stage the block counted last
    if (threadIdx.x == 0) {
        header[kSlots] = -1;
        for (int i = 0; i < kSlots; i++) mbar_init(smem_u32(&full[i]), 1), mbar_init(smem_u32(&empty[i]), kGroupThreads);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x >= kConsumers) {
        const int warp = (threadIdx.x - kConsumers) / 32;
        if (threadIdx.x % 32 == 0) produce(p, warp, ring, header, full, empty);
    } else {
        consume(p, threadIdx.x / kGroupThreads, ring, header, full, empty);
    }
}

struct Variant {
    const char *name;
    int hand_over, claim, work, x_bytes, slots = 2, in_flight = 1, prefetch = 0, ignore = 0, interleave = 0, stall = 0,
        tile_bytes = kTileBytes, order = 0;
};

const Stuck *g_host_stuck;

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

// Runs a variant `reps` times after a warm-up; prints its median time a step and the spreads.
int run_variant(const Variant &v, Probe p, int blocks, int reps, long long step_bytes) {
    p.hand_over = v.hand_over, p.claim = v.claim, p.work = v.work, p.x_bytes = v.x_bytes, p.slots = v.slots, p.in_flight = v.in_flight;
    p.stall = v.stall, p.tile_bytes = v.tile_bytes, p.order = v.order;
    if (p.slots * kPipes * p.tile_bytes > kRingBytes) return fprintf(stderr, "%s: the ring does not fit\n", v.name), 1;
    long long tiles = 0;   // the stages' tiles at this size
    for (int s = 0; s < kStages; s++) p.first_tile[s] = tiles, p.tiles[s] = kTilesOf[s % kMatrices] * (kTileBytes / p.tile_bytes), tiles += p.tiles[s];
    p.prefetch = v.prefetch, p.ignore = v.ignore, p.interleave = v.interleave;
    const size_t smem = kRingBytes;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<double> ms;
    std::vector<unsigned long long> ends((size_t)kStages * blocks), passed(ends.size());
    std::vector<double> seen, stopped;   // a hand-over: the last count to a block passing; a block's own end to passing
    std::vector<std::vector<double>> spread(kMatrices), range(kMatrices);
    for (int r = 0; r <= reps; r++) {
        CK(cudaMemset(p.counters, 0, kStages * sizeof(unsigned)));
        CK(cudaMemset(p.claims, 0, kStages * sizeof(unsigned)));
        CK(cudaMemset(p.consumed, 0, kStages * sizeof(unsigned)));
        CK(cudaEventRecord(a));
        skew_kernel<<<blocks, kThreads, smem>>>(p);
        CK(cudaGetLastError());
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float t;
        CK(cudaEventElapsedTime(&t, a, b));
        if (const Stuck *k = g_host_stuck; k->what)
            return fprintf(stderr, "%s: wait %d (1 empty, 2 in flight, 3 full, 4 count, 5 held) of block %d thread %d at stage %d did not end\n",
                           v.name, k->what, k->block, k->thread, k->stage), 1;
        unsigned consumed[kStages];
        CK(cudaMemcpy(consumed, p.consumed, sizeof consumed, cudaMemcpyDeviceToHost));
        for (int s = 0; s < kStages; s++)
            if (consumed[s] != (unsigned)p.tiles[s]) return fprintf(stderr, "%s: stage %d consumed %u of %d tiles\n", v.name, s, consumed[s], p.tiles[s]), 1;
        if (r == 0) continue;   // the warm-up
        ms.push_back(t);
        CK(cudaMemcpy(ends.data(), p.ends, ends.size() * sizeof(ends[0]), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(passed.data(), p.passed, passed.size() * sizeof(passed[0]), cudaMemcpyDeviceToHost));
        for (int s = 1; p.hand_over && s < kStages; s++) {
            const unsigned long long *e = &ends[(size_t)(s - 1) * blocks], *q = &passed[(size_t)s * blocks];
            const unsigned long long last = *std::max_element(e, e + blocks);
            for (int b = 0; b < blocks; b++) seen.push_back((double)(long long)(q[b] - last) * 1e-3), stopped.push_back((q[b] - e[b]) * 1e-3);
        }
        for (int s = 0; s < kStages; s++) {
            std::vector<double> e(ends.begin() + (size_t)s * blocks, ends.begin() + (size_t)(s + 1) * blocks);
            std::sort(e.begin(), e.end());
            spread[s % kMatrices].push_back((e.back() - e[blocks / 2]) * 1e-3);
            range[s % kMatrices].push_back((e.back() - e.front()) * 1e-3);
        }
    }
    const double t = median(ms) * 1e-3, gbs = step_bytes / t * 1e-9;
    printf("%-48s %6.1f us %7.0f GB/s %5.1f%% (%.1f GB/s a block)", v.name, t * 1e6, gbs, 100.0 * gbs / 4480.0, gbs / blocks);
    for (int m = 0; m < kMatrices; m++) printf("  %s %.2f/%.2f", kNames[m], median(spread[m]), median(range[m]));
    if (v.hand_over) printf("  hand-over %.2f, stopped %.2f", median(seen), median(stopped));
    printf("\n");
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return 0;
}

int probe_main(const char *only, int blocks) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    Stuck *stuck;
    CK(cudaHostAlloc(&stuck, sizeof(Stuck), cudaHostAllocMapped));
    *stuck = {};
    Stuck *stuck_dev;
    CK(cudaHostGetDevicePointer(&stuck_dev, stuck, 0));
    CK(cudaMemcpyToSymbol(g_stuck, &stuck_dev, sizeof stuck_dev));
    g_host_stuck = stuck;
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const size_t smem = kRingBytes;
    CK(cudaFuncSetAttribute(skew_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, skew_kernel, kThreads, smem));
    if (per_sm < 1) return fprintf(stderr, "skew_probe: the kernel does not fit an SM\n"), 1;
    if (blocks > sms) return fprintf(stderr, "skew_probe: %d blocks, more than the GPU's %d SMs\n", blocks, sms), 1;
    if (blocks > 0) sms = blocks;   // (from here on: the blocks of the grid)
    Probe p = {};
    long long step_bytes = 0;
    for (int s = 0; s < kStages; s++) step_bytes += (long long)kTilesOf[s % kMatrices] * kTileBytes;
    uint8_t *w;
    CK(cudaMalloc(&w, step_bytes));
    CK(cudaMemset(w, 0x5a, step_bytes));
    p.w = w;
    CK(cudaMalloc(&p.counters, kStages * sizeof(unsigned)));
    CK(cudaMalloc(&p.claims, kStages * sizeof(unsigned)));
    CK(cudaMalloc(&p.consumed, kStages * sizeof(unsigned)));
    CK(cudaMalloc(&p.ends, (size_t)kStages * sms * sizeof(unsigned long long)));
    CK(cudaMalloc(&p.passed, (size_t)kStages * sms * sizeof(unsigned long long)));
    CK(cudaMalloc(&p.sink, sms * sizeof(float)));
    float *x;
    CK(cudaMalloc(&x, 65536));
    CK(cudaMemset(x, 0x3c, 65536));
    p.x = x;
    printf("%d blocks, %d layers of a 7B's matrices: %.1f MB a step; spreads max-median/max-min of the blocks' ends, us\n",
           sms, kLayers, step_bytes * 1e-6);
    // work: about a 16 KB tile a microsecond a pipe (the megakernel's consumers, bench/NOTES.md 84)
    const int work = 2000, us = 1980;   // us: cycles a microsecond at the H200's SM clock
    const Variant variants[] = {
        // name, hand-over, claim, work, x bytes, slots a pipe, in flight, prefetch, ignore, interleave, stall, tile bytes, order
        {"static, no hand-over", 0, 0, 0, 0},
        {"static, no hand-over, work", 0, 0, work, 0},
        {"static, hand-over, work 0", 1, 0, 0, 0},
        {"static, hand-over, work / 2", 1, 0, work / 2, 0},
        {"static, hand-over, work", 1, 0, work, 0},
        {"static, hand-over, work x 1.5", 1, 0, work * 3 / 2, 0},
        {"static, hand-over + x 16 KB, work", 1, 0, work, 16384},
        {"static, hand-over + x 44 KB, work", 1, 0, work, 45056},
        {"static, hand-over relaxed, work 0", 1, 0, 0, 0, 2, 1, 0, 0, 0, 0, kTileBytes, kCountRelaxed | kPollsRelaxed},
        {"static, hand-over relaxed, work", 1, 0, work, 0, 2, 1, 0, 0, 0, 0, kTileBytes, kCountRelaxed | kPollsRelaxed},
        {"static, hand-over, count relaxed, work", 1, 0, work, 0, 2, 1, 0, 0, 0, 0, kTileBytes, kCountRelaxed},
        {"static, hand-over, polls relaxed, work", 1, 0, work, 0, 2, 1, 0, 0, 0, 0, kTileBytes, kPollsRelaxed},
        {"static, hand-over, polls relaxed + fence, work", 1, 0, work, 0, 2, 1, 0, 0, 0, 0, kTileBytes, kPollsRelaxed | kPollFence},
        {"static, hand-over relaxed + fence, work", 1, 0, work, 0, 2, 1, 0, 0, 0, 0, kTileBytes, kCountRelaxed | kPollsRelaxed | kPollFence},
        {"static, hand-over, no store before the count, work", 1, 0, work, 0, 2, 1, 0, 0, 0, 0, kTileBytes, kStoresAfter},
        {"static, hand-over, copies held until counted, work", 1, 0, work, 0, 2, 1, 0, 0, 0, 0, kTileBytes, kHoldCopies},
        {"static, hand-over, copies held until counted, 8 KB x 6", 1, 0, work / 2, 0, 6, 1, 0, 0, 0, 0, 8192, kHoldCopies},
        {"static, hand-over, no store before the count, 2 in flight", 1, 0, work, 0, 2, 2, 0, 0, 0, 0, kTileBytes, kStoresAfter},
        {"static, hand-over, no store before the count, 8 KB x 6", 1, 0, work / 2, 0, 6, 1, 0, 0, 0, 0, 8192, kStoresAfter},
        {"static, no hand-over, work, stall 0.5 us", 0, 0, work, 0, 2, 1, 0, 0, 0, us / 2},
        {"static, no hand-over, work, stall 1 us", 0, 0, work, 0, 2, 1, 0, 0, 0, us},
        {"static, no hand-over, work, stall 2 us", 0, 0, work, 0, 2, 1, 0, 0, 0, 2 * us},
        {"static, no hand-over, work, stall 4 us", 0, 0, work, 0, 2, 1, 0, 0, 0, 4 * us},
        {"static, no hand-over, work, stall 2 us, 3 slots", 0, 0, work, 0, 3, 1, 0, 0, 0, 2 * us},
        {"static, hand-over, work, 4 not waited for", 1, 0, work, 0, 2, 1, 0, 4},
        {"static, hand-over, work, 13 not waited for", 1, 0, work, 0, 2, 1, 0, 13},
        {"static, hand-over, work, 33 not waited for", 1, 0, work, 0, 2, 1, 0, 33},
        {"interleaved, no hand-over, work", 0, 0, work, 0, 2, 1, 0, 0, 1},
        {"interleaved, hand-over, work", 1, 0, work, 0, 2, 1, 0, 0, 1},
        {"claim 1, no hand-over, work", 0, 1, work, 0},
        {"claim 1, hand-over, work", 1, 1, work, 0},
        {"claim 2, hand-over, work", 1, 2, work, 0},
        {"claim 4, hand-over, work", 1, 4, work, 0},
        {"claim 1, hand-over, work, 3 slots", 1, 1, work, 0, 3},
        {"static, hand-over, work, 2 in flight", 1, 0, work, 0, 2, 2},
        {"static, hand-over, work, L2 ahead 1", 1, 0, work, 0, 2, 1, 1},
        {"static, hand-over, work, L2 ahead 2", 1, 0, work, 0, 2, 1, 2},
        {"static, hand-over, work, L2 ahead 4", 1, 0, work, 0, 2, 1, 4},
        {"static, hand-over, work, 3 slots", 1, 0, work, 0, 3},
        {"static, hand-over + x 44 KB, work, 3 slots", 1, 0, work, 45056, 3},
        {"static, hand-over, work, 3 slots, 2 in flight", 1, 0, work, 0, 3, 2},
        {"static, hand-over, work, 3 slots, L2 ahead 2", 1, 0, work, 0, 3, 1, 2},
        {"static, hand-over, work, 8 KB x 4 a pipe", 1, 0, work / 2, 0, 4, 1, 0, 0, 0, 0, 8192},
        {"static, hand-over, work, 8 KB x 5 a pipe", 1, 0, work / 2, 0, 5, 1, 0, 0, 0, 0, 8192},
        {"static, hand-over, work, 8 KB x 6 a pipe", 1, 0, work / 2, 0, 6, 1, 0, 0, 0, 0, 8192},
        {"static, hand-over, work, 8 KB x 6, 2 in flight", 1, 0, work / 2, 0, 6, 2, 0, 0, 0, 0, 8192},
        {"static, hand-over + x 44 KB, work, 8 KB x 5", 1, 0, work / 2, 45056, 5, 1, 0, 0, 0, 0, 8192},
    };
    bool any = false;
    for (const Variant &v : variants) any = any || strstr(v.name, only);
    if (!any) return fprintf(stderr, "skew_probe: no variant's name contains \"%s\"\n", only), 1;
    for (int round = 0; round < 2; round++)
        for (const Variant &v : variants)
            if (strstr(v.name, only) && run_variant(v, p, sms, 5, step_bytes)) return 1;
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    const int blocks = argc > 2 ? atoi(argv[2]) : 0;
    if (argc > 3 || (argc > 2 && blocks < 1)) return fprintf(stderr, "usage: skew_probe [a part of the variants' names] [blocks]\n"), 1;
    return probe_main(argc > 1 ? argv[1] : "", blocks);
}
