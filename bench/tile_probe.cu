// bench/tile_probe.cu: the megakernel consumers' tile arithmetic (mk_tile_math, the same code)
// timed on tiles in shared memory: alone, then with the megakernel's slot barriers, its ring of
// producer warps, and copies into the ring (the modes below); no x staging, no finish. One block
// an SM, the megakernel's pipes of consumer warps, each pipe taking its tiles of a unit in turn
// as a linear stage does. Prints cycles per tile per pipe (the slowest warp of the grid) and the
// rate an SM would consume weights at (GB/s an SM, and over the SMs against 4480 GB/s).
// make bench/tile_probe && ./bench/tile_probe
#include "../kernels.cu"   // mk_tile_math and its types: one translation unit

#include "probe.h"   // CK

namespace {

constexpr int kProbeSlots = 8, kProbeSlotsAPipe = kProbeSlots / kMkPipes, kProbeStride = 4096, kProbeRounds = 64;

// The slots' bytes, x's digits and scales: fixed pseudo-random values (the sums are not checked;
// the time of integer and float arithmetic does not depend on the values).
__device__ unsigned probe_hash(unsigned i) {
    i ^= i >> 16, i *= 0x7feb352du, i ^= i >> 15, i *= 0x846ca68bu, i ^= i >> 16;
    return i;
}

// Modes: 0, the tiles back to back (the compiler may start a tile's loads during the one
// before); 1, a compiler barrier between tiles; 2, a wait on a full barrier (its phase complete)
// before each tile and an arrival on an empty one after, as the megakernel's loop has; 3, the
// megakernel's ring: a producer warp a pipe hands each slot over through its full and empty
// barriers (two slots a pipe), without copies; 4, the same with each tile copied in by the copy
// engine (cp.async.bulk) from a few tiles of the block's own (20 MB in all, so from L2): the
// copies' writes into shared memory beside the consumers' loads.
constexpr int kProbeModes = 5;
constexpr const char *kModeNames[kProbeModes] = {"back to back", "compiler barrier", "slot barriers", "ring, no copies",
                                                 "ring, copies from L2"};
constexpr int kProbeThreads = kMkConsumers + 32 * kMkPipes, kSourceTiles = 8;

__device__ __forceinline__ uint32_t probe_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// Producer lane 0 of pipe `pipe`: n tiles into its slots (pipe, pipe + kMkPipes, ...) in turn.
__device__ void probe_produce(int pipe, int n, bool copy, const unsigned char *src, int record, unsigned char *ring, uint64_t *full,
                              uint64_t *empty) {
    for (int i = 0; i < n; i++) {
        const int slot = pipe + kMkPipes * (i % kProbeSlotsAPipe), round = i / kProbeSlotsAPipe;
        if (round > 0) mbar_wait(probe_smem(&empty[slot]), (round - 1) & 1);
        if (!copy) {
            mbar_arrive_expect(probe_smem(&full[slot]), 0);
            continue;
        }
        mbar_arrive_expect(probe_smem(&full[slot]), record);
        bulk_copy_counted_hint(probe_smem(ring + slot * record), src + (size_t)(i % kSourceTiles) * record, record, probe_smem(&full[slot]),
                               l2_policy(false));
    }
}

// log2 of the group size 32 * kGroupSteps (a power of 2): the kernel's and the host's.
template <int kGroupSteps>
__host__ __device__ constexpr int probe_gshift() {
    int shift = 0;
    while ((32 * kGroupSteps) >> (shift + 1)) shift++;
    return shift;
}

// kGroupSteps: as mk_tile_math's (4: groups of 128). pipes: how many pipes work (the others idle);
// tiles: a pipe's tiles a round (of a unit of rows x 4096: each pipe's tiles take column tiles
// pipe, pipe + kMkPipes, ... of the row in turn, as a linear stage's do).
template <int kGroupSteps>
__global__ void __launch_bounds__(kProbeThreads, 1) tile_loop(int pipes, int tiles, int mode, const unsigned char *src, float *sink,
                                                               long long *cycles) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ uint64_t bars[2];   // modes 1 and 2: full (completed once), empty (never completes)
    __shared__ uint64_t full[kProbeSlots], empty[kProbeSlots];   // modes 3 and 4
    constexpr int kGs = 32 * kGroupSteps;
    const int per_row = mk_groups_a_row(kGs), record = mk_record_bytes(kGs);
    unsigned char *ring = smem;
    const MkX xs = mk_x(smem + kProbeSlots * record, kProbeStride, probe_gshift<kGroupSteps>());
    for (int i = threadIdx.x; i < kProbeSlots * record / 4; i += blockDim.x) {
        const unsigned h = probe_hash(i + 977u * blockIdx.x);
        const int in_tile = (i * 4) % record;
        reinterpret_cast<unsigned *>(ring)[i] = in_tile < kMkTileBytes ? h : __float_as_uint(1.0f + (h & 1023u) / 1024.0f);
    }
    for (int i = threadIdx.x; i < 3 * xs.dpitch / 4; i += blockDim.x)
        reinterpret_cast<unsigned *>(xs.d)[i] = probe_hash(i + 31u) & 0x7f7f7f7fu;
    for (int i = threadIdx.x; i < xs.xpad / 16; i += blockDim.x) xs.u[i] = 0.5f + (probe_hash(i) & 255u) / 256.0f;
    if (threadIdx.x == 0) {
        mbar_init(probe_smem(&bars[0]), 1), mbar_init(probe_smem(&bars[1]), (1 << 20) - 1);
        for (int i = 0; i < kProbeSlots; i++) mbar_init(probe_smem(&full[i]), 1), mbar_init(probe_smem(&empty[i]), kMkGroupThreads);
        mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x == 0) mbar_arrive(probe_smem(&bars[0]));
    __syncthreads();
    const bool ring_mode = mode >= 3;
    if (threadIdx.x >= kMkConsumers) {
        const int pipe = (threadIdx.x - kMkConsumers) / 32;
        if (ring_mode && threadIdx.x % 32 == 0 && pipe < pipes)
            probe_produce(pipe, kProbeRounds * tiles, mode == 4, src + (size_t)blockIdx.x * kSourceTiles * record, record, ring, full,
                          empty);
        return;
    }
    const int lane = threadIdx.x % 32, pipe = threadIdx.x / kMkGroupThreads, warp = threadIdx.x % kMkGroupThreads / 32, c = lane % 4;
    const float f[2] = {c == 0 ? 1.0f : c == 1 ? 1.0f / (254.0f * 254.0f) : 0.0f, c == 0 ? 1.0f / 254.0f : 0.0f};
    const int col_tiles = kProbeStride / kMkCols, gshift = probe_gshift<kGroupSteps>();
    float acc[2] = {0.0f, 0.0f};
    if (pipe < pipes) {
        const long long t0 = clock64();
        for (int i = 0; i < kProbeRounds * tiles; i++) {
            const int t = i % tiles, c0 = (pipe + kMkPipes * t) % col_tiles * kMkCols;   // the unit's tile pipe + 4 t
            const int slot = pipe + kMkPipes * (i % kProbeSlotsAPipe);
            const unsigned char *s = ring + slot * record;
            const MkTile tile = {s + kMkSteps * warp * kMkStepBytes + 16 * lane, reinterpret_cast<const float *>(s + kMkTileBytes),
                                 per_row};
            if (mode == 1) asm volatile("" ::: "memory");
            if (mode == 2) mbar_wait(probe_smem(&bars[0]), 0);
            if (ring_mode) mbar_wait(probe_smem(&full[slot]), (i / kProbeSlotsAPipe) & 1);
            mk_tile_math<kGroupSteps>(acc, tile, xs, f, c0, c0 + kMkSpan * warp, kProbeStride, gshift);
            if (mode == 2) mbar_arrive(probe_smem(&bars[1]));
            if (ring_mode) mbar_arrive(probe_smem(&empty[slot]));
        }
        const long long t1 = clock64();
        if (lane == 0) cycles[blockIdx.x * kMkConsumerWarps + threadIdx.x / 32] = t1 - t0;
    }
    if (acc[0] + acc[1] == 1234.5f) sink[blockIdx.x] = acc[0];   // keeps the arithmetic
}

template <int kGroupSteps>
int run_case(int sms, int khz, int pipes, int tiles, int mode, const unsigned char *src, float *sink, long long *cycles, long long *host) {
    const int smem = kProbeSlots * mk_record_bytes(32 * kGroupSteps) + mk_x_bytes(kProbeStride, probe_gshift<kGroupSteps>());
    CK(cudaFuncSetAttribute(tile_loop<kGroupSteps>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaMemset(cycles, 0, sizeof(long long) * sms * kMkConsumerWarps));
    tile_loop<kGroupSteps><<<sms, kProbeThreads, smem>>>(pipes, tiles, mode, src, sink, cycles);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(host, cycles, sizeof(long long) * sms * kMkConsumerWarps, cudaMemcpyDeviceToHost));
    long long most = 0;
    for (int i = 0; i < sms * kMkConsumerWarps; i++) most = host[i] > most ? host[i] : most;
    const double per_tile = (double)most / (kProbeRounds * tiles);   // a pipe's cycles a tile (its slowest warp, any SM)
    const double gbs_sm = pipes * (double)kMkTileBytes / (per_tile / (khz * 1e3)) / 1e9;
    printf("%-22s group %4d  pipes %d  tiles %2d   %7.0f cycles a tile a pipe   %6.1f GB/s an SM   %6.0f GB/s over %d SMs"
           " (%5.1f%% of 4480)\n",
           kModeNames[mode], kGroupSteps * 32, pipes, tiles, per_tile, gbs_sm, gbs_sm * sms, sms, 100.0 * gbs_sm * sms / 4480.0);
    return 0;
}

int probe_main() {
    int sms = 0, khz = 0;   // khz: the SM clock
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
    float *sink = nullptr;
    long long *cycles = nullptr;
    CK(cudaMalloc(&sink, sizeof(float) * sms));
    CK(cudaMalloc(&cycles, sizeof(long long) * sms * kMkConsumerWarps));
    long long *host = (long long *)malloc(sizeof(long long) * sms * kMkConsumerWarps);
    if (!host) return 1;
    printf("tile %d x %d int8, %d pipes of %d consumer warps; kMkSteps %d a warp\n", kMkRows, kMkCols, kMkPipes, MK_GROUP_WARPS, kMkSteps);
    unsigned char *src = nullptr;   // kSourceTiles records a block of the largest (group 32): its copies' source
    const size_t src_bytes = (size_t)sms * kSourceTiles * mk_record_bytes(32);
    CK(cudaMalloc(&src, src_bytes));
    CK(cudaMemset(src, 0x3c, src_bytes));
    for (int mode = 0; mode < kProbeModes; mode++) {
        for (int pipes = 1; pipes <= kMkPipes; pipes *= 2)
            if (run_case<4>(sms, khz, pipes, 8, mode, src, sink, cycles, host)) return 1;
        if (run_case<1>(sms, khz, kMkPipes, 8, mode, src, sink, cycles, host) ||
            run_case<2>(sms, khz, kMkPipes, 8, mode, src, sink, cycles, host))
            return 1;
    }
    free(host);
    return 0;
}

}  // namespace

int main(int argc, char **) {
    if (argc > 1) return fprintf(stderr, "usage: tile_probe (no arguments)\n"), 1;
    return probe_main();
}
