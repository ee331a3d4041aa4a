// bench/copy_probe.cu: how long the cluster step's ring copies take by themselves (asked by
// bench/NOTES.md 135, whose late pieces NOTES 141 found to be the trace's rounding). A ring's
// pieces copied from global to shared memory all at once, each completing its own mbarrier, in
// one of two ways:
//   bulk     cp.async.bulk by one thread, as the cluster step's producer issues them (the copy
//            unit moves each piece)
//   16-byte  cp.async of 16 bytes by each lane of the warp, a piece's completion tracked by its
//            mbarrier (cp.async.mbarrier.arrive.noinc from every lane: the lane's earlier copies)
// For each configuration, on `blocks` blocks at once (1 SM, the cluster's 16, or every SM), each
// block copies n pieces of `bytes` from its own region of a buffer far larger than L2 (each
// launch reads bytes no launch before it read: from DRAM; or, marked L2, the bytes of the launch
// before), then thread 0 waits for each piece in turn and stamps %globaltimer. Prints, as the
// median over the blocks of the third of three launches (the first two warm the clocks): the
// first piece's landing, the last's, and the block's bytes over the last's landing (GB/s a block).
//
// Then a ring in steady state, as the cluster step runs it: 12 slots of 16 KB, a producer thread
// issuing a bulk copy as soon as its slot is free, a consumer thread waiting for each piece in
// turn, holding it `hold` ns (the step's consumers take about a microsecond a piece) and releasing
// it; 96 pieces a block, from DRAM. On 1 block, on 16 spread over the GPU, on 16 as one cluster
// (one GPC: the cluster step's layers), on as many clusters of 16 as fit, and on every SM. Prints
// the medians over the blocks of the block's rate (its bytes over its first issue to its last
// landing), of how long the pieces took from issue to landing (stamped where the consumer waited
// for them), and how many it waited for; and all the blocks' bytes over the first issue to the
// last landing.
// make bench/copy_probe && ./bench/copy_probe
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "probe.h"   // CK, median_of, need_sm90

namespace {

constexpr int kMaxCopies = 48, kStamps = kMaxCopies + 1, kSmemBytes = 192 * 1024;

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Whether the phase of parity `parity` of the mbarrier at bar has completed.
__device__ __forceinline__ bool bar_done(uint32_t bar, int parity) {
    uint32_t done;
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    return done;
}

// out[block][0]: when the copies were issued; [1 + i]: when piece i's barrier completed (each
// waited for in issue order, so a stamp is at least that piece's landing). One warp a block.
template <bool kLanes>
__global__ void copy_kernel(const unsigned char *src, size_t block_stride, int n, int bytes, unsigned long long *out) {
    extern __shared__ __align__(128) unsigned char slots[];
    __shared__ __align__(8) unsigned long long bar[kMaxCopies];
    const int lane = threadIdx.x;
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(&bar[0]);
    if (lane == 0) {
        for (int i = 0; i < n; i++) asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar0 + 8 * i), "r"(kLanes ? 32 : 1) : "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // the barriers' init, before the copies complete them
    }
    __syncwarp();
    const unsigned char *from = src + blockIdx.x * block_stride;
    const unsigned long long t0 = now_ns();
    for (int i = 0; i < n; i++) {
        const uint32_t dst = (uint32_t)__cvta_generic_to_shared(slots + (size_t)i * bytes);
        const unsigned char *piece = from + (size_t)i * bytes;
        if (kLanes) {
            for (int at = 16 * lane; at < bytes; at += 16 * 32)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + at), "l"(piece + at) : "memory");
            asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar0 + 8 * i) : "memory");
        } else if (lane == 0) {
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar0 + 8 * i), "r"(bytes) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                         "l"(piece), "r"(bytes), "r"(bar0 + 8 * i)
                         : "memory");
        }
    }
    if (lane == 0) {   // (the other lanes stay, their copies in flight, until the last has landed)
        unsigned long long *o = out + (size_t)blockIdx.x * kStamps;
        o[0] = t0;
        for (int i = 0; i < n; i++) {
            while (!bar_done(bar0 + 8 * i, 0)) {}
            o[1 + i] = now_ns();
        }
    }
    __syncwarp();
}

// One configuration: three launches, each from a new region (from_l2: the last launch's region
// again, read once more); prints the third's medians over the blocks.
int run(const unsigned char *buf, size_t buf_bytes, size_t *cursor, int blocks, int n, int bytes, bool lanes, bool from_l2,
        unsigned long long *out_dev) {
    const size_t stride = (size_t)n * bytes, span = stride * blocks;
    static unsigned long long out[1024 * kStamps];
    size_t at = *cursor;
    for (int launch = 0; launch < 3; launch++) {
        if (!(from_l2 && launch > 0)) {
            if (*cursor + span > buf_bytes) *cursor = 0;
            at = *cursor, *cursor += span;
        }
        if (lanes) copy_kernel<true><<<blocks, 32, kSmemBytes>>>(buf + at, stride, n, bytes, out_dev);
        else copy_kernel<false><<<blocks, 32, kSmemBytes>>>(buf + at, stride, n, bytes, out_dev);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
    }
    CK(cudaMemcpy(out, out_dev, (size_t)blocks * kStamps * sizeof(out[0]), cudaMemcpyDeviceToHost));
    static double first[1024], last[1024], rate[1024];
    for (int b = 0; b < blocks; b++) {
        const unsigned long long *o = out + (size_t)b * kStamps;
        first[b] = (double)(o[1] - o[0]), last[b] = (double)(o[n] - o[0]);
        rate[b] = (double)n * bytes / last[b];   // bytes a ns: GB/s
    }
    printf("  %3d block%s, %-7s %2d pieces of %5d bytes%s: first landed %7.2f us, last %7.2f us, %7.1f GB/s a block\n", blocks,
           blocks > 1 ? "s" : " ", lanes ? "16-byte" : "bulk", n, bytes, from_l2 ? " (L2)" : "     ", median_of(first, blocks) / 1e3,
           median_of(last, blocks) / 1e3, median_of(rate, blocks));
    return 0;
}

// The steady ring: warp 0's lane 0 produces, warp 1's lane 0 consumes. out[block][piece][3]: the
// issue, the consumer's wait's start and its end (the landing, where the wait waited).
constexpr int kRingSlots = 12, kRingBytes = 16384, kRingPieces = 96;
__global__ void ring_kernel(const unsigned char *src, int hold_ns, unsigned long long *out) {
    extern __shared__ __align__(128) unsigned char slots[];
    __shared__ __align__(8) unsigned long long full[kRingSlots], empty[kRingSlots];
    const uint32_t full0 = (uint32_t)__cvta_generic_to_shared(&full[0]), empty0 = (uint32_t)__cvta_generic_to_shared(&empty[0]);
    if (threadIdx.x == 0) {
        for (int i = 0; i < kRingSlots; i++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(full0 + 8 * i) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(empty0 + 8 * i) : "memory");
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x % 32) return;
    const unsigned char *from = src + (size_t)blockIdx.x * kRingPieces * kRingBytes;
    unsigned long long *o = out + (size_t)blockIdx.x * kRingPieces * 3;
    for (int n = 0; n < kRingPieces; n++) {
        const int slot = n % kRingSlots, round = n / kRingSlots;
        if (threadIdx.x == 0) {   // the producer
            if (round > 0)
                while (!bar_done(empty0 + 8 * slot, (round - 1) & 1)) {}
            o[3 * n] = now_ns();
            const uint32_t dst = (uint32_t)__cvta_generic_to_shared(slots + (size_t)slot * kRingBytes);
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(full0 + 8 * slot), "r"(kRingBytes) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                         "l"(from + (size_t)n * kRingBytes), "r"(kRingBytes), "r"(full0 + 8 * slot)
                         : "memory");
        } else {   // the consumer
            const unsigned long long t0 = now_ns();
            while (!bar_done(full0 + 8 * slot, round & 1)) {}
            const unsigned long long t1 = now_ns();
            o[3 * n + 1] = t0, o[3 * n + 2] = t1;
            while (now_ns() < t1 + (unsigned long long)hold_ns) {}
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(empty0 + 8 * slot) : "memory");
        }
    }
}

// One steady-ring configuration (`cluster` 0: no cluster), from a new region of the buffer.
int run_ring(const unsigned char *buf, size_t buf_bytes, size_t *cursor, int blocks, int cluster, int hold_ns, unsigned long long *out_dev) {
    const size_t span = (size_t)blocks * kRingPieces * kRingBytes;
    if (*cursor + span > buf_bytes) *cursor = 0;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = dim3(blocks), cfg.blockDim = dim3(64), cfg.dynamicSmemBytes = kRingSlots * kRingBytes;
    attr[0].id = cudaLaunchAttributeClusterDimension, attr[0].val.clusterDim.x = cluster, attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr, cfg.numAttrs = cluster ? 1 : 0;
    for (int launch = 0; launch < 2; launch++) {   // the second launch, from new bytes, is the one printed
        CK(cudaLaunchKernelEx(&cfg, ring_kernel, buf + *cursor, hold_ns, out_dev));
        CK(cudaDeviceSynchronize());
        *cursor += span;
        if (*cursor + span > buf_bytes) *cursor = 0;
    }
    static unsigned long long out[1024 * kRingPieces * 3];
    CK(cudaMemcpy(out, out_dev, (size_t)blocks * kRingPieces * 3 * sizeof(out[0]), cudaMemcpyDeviceToHost));
    static double rate[1024], flight[1024], waited[1024];
    unsigned long long first = ~0ull, last = 0;   // of all blocks
    for (int b = 0; b < blocks; b++) {
        const unsigned long long *o = out + (size_t)b * kRingPieces * 3;
        first = first < o[0] ? first : o[0];
        last = last > o[3 * (kRingPieces - 1) + 2] ? last : o[3 * (kRingPieces - 1) + 2];
        double sum = 0.0;
        int n_waited = 0;
        for (int n = 0; n < kRingPieces; n++)
            if (o[3 * n + 2] > o[3 * n + 1] + 64) sum += (double)(o[3 * n + 2] - o[3 * n]), n_waited++;   // a wait that waited
        rate[b] = (double)kRingPieces * kRingBytes / (double)(o[3 * (kRingPieces - 1) + 2] - o[0]);
        flight[b] = n_waited ? sum / n_waited : 0.0, waited[b] = n_waited;
    }
    char shape[32];
    if (cluster) snprintf(shape, sizeof(shape), "%d cluster%s of %d", blocks / cluster, blocks / cluster > 1 ? "s" : "", cluster);
    else snprintf(shape, sizeof(shape), "%d blocks", blocks);
    printf("  %-17s held %4d ns a piece: %6.1f GB/s a block (%7.1f GB/s in all, from the first issue to the last landing); waited for "
           "%4.1f of %d pieces, landed %6.2f us after issue\n", shape, hold_ns, median_of(rate, blocks),
           (double)blocks * kRingPieces * kRingBytes / (double)(last - first), median_of(waited, blocks), kRingPieces,
           median_of(flight, blocks) / 1e3);
    return 0;
}

}  // namespace

int main() {
    cudaDeviceProp prop;
    if (need_sm90("copy_probe", "cp.async.bulk", &prop)) return 1;
    const size_t buf_bytes = (size_t)4 << 30;   // far past L2: launches move through it
    unsigned char *buf;
    unsigned long long *out;
    CK(cudaMalloc(&buf, buf_bytes));
    CK(cudaMemset(buf, 1, buf_bytes));
    CK(cudaMalloc(&out, 1024 * kStamps * sizeof(unsigned long long)));
    CK(cudaFuncSetAttribute(copy_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    CK(cudaFuncSetAttribute(copy_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    printf("%s (%d SMs): a ring's pieces copied at once into one block's shared memory, each to its own mbarrier (the third of three "
           "launches; medians over the blocks)\n", prop.name, prop.multiProcessorCount);
    size_t cursor = 0;
    const int sms = prop.multiProcessorCount < 1024 ? prop.multiProcessorCount : 1024;   // (the stamps' room)
    const int blocks[] = {1, 16, sms};
    struct Config {
        int n, bytes;
        bool lanes, from_l2;
    };
    const Config configs[] = {{1, 16384, false, false}, {4, 16384, false, false}, {12, 16384, false, false}, {12, 16384, false, true},
                              {48, 4096, false, false}, {1, 16384, true, false},  {12, 16384, true, false}, {12, 16384, true, true}};
    for (int b : blocks)
        for (const Config &k : configs)
            if (run(buf, buf_bytes, &cursor, b, k.n, k.bytes, k.lanes, k.from_l2, out)) return 1;
    unsigned long long *ring_out;
    CK(cudaMalloc(&ring_out, (size_t)1024 * kRingPieces * 3 * sizeof(unsigned long long)));
    CK(cudaFuncSetAttribute(ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingSlots * kRingBytes));
    CK(cudaFuncSetAttribute(ring_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    printf("%s: a ring of %d slots of %d bytes in steady state, %d pieces a block from DRAM (medians over the blocks)\n", prop.name,
           kRingSlots, kRingBytes, kRingPieces);
    // as many clusters of 16 as fit at once (the GPCs with 16 SMs or more)
    cudaLaunchConfig_t probe = {};
    cudaLaunchAttribute cl;
    probe.gridDim = dim3(16 * 8), probe.blockDim = dim3(64), probe.dynamicSmemBytes = kRingSlots * kRingBytes;
    cl.id = cudaLaunchAttributeClusterDimension, cl.val.clusterDim.x = 16, cl.val.clusterDim.y = 1, cl.val.clusterDim.z = 1;
    probe.attrs = &cl, probe.numAttrs = 1;
    int many_clusters = 0;
    CK(cudaOccupancyMaxActiveClusters(&many_clusters, ring_kernel, &probe));
    if (many_clusters < 1) {
        fprintf(stderr, "copy_probe: no cluster of 16 fits this GPU\n");
        return 1;
    }
    const int holds[] = {0, 1000};
    for (int hold : holds) {
        struct Shape {
            int blocks, cluster;
        };
        const Shape shapes[] = {{1, 0}, {16, 0}, {16, 16}, {16 * many_clusters, 16}, {sms, 0}};
        for (const Shape &sh : shapes)
            if (run_ring(buf, buf_bytes, &cursor, sh.blocks, sh.cluster, hold, ring_out)) return 1;
    }
    CK(cudaFree(ring_out));
    CK(cudaFree(buf));
    CK(cudaFree(out));
    return 0;
}
