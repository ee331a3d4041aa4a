// bench/copy_probe.cu: how long the cluster step's ring copies take by themselves (bench/NOTES.md
// 135: in the step, the pieces that the consumers waited for had landed 7-24 us after their
// issue). A ring's pieces copied from global to shared memory all at once, each completing its
// own mbarrier, in one of two ways:
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
            uint32_t done = 0;
            while (!done)
                asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}"
                             : "=r"(done) : "r"(bar0 + 8 * i) : "memory");
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
    const int blocks[] = {1, 16, prop.multiProcessorCount < 1024 ? prop.multiProcessorCount : 1024};
    struct Config {
        int n, bytes;
        bool lanes, from_l2;
    };
    const Config configs[] = {{1, 16384, false, false}, {4, 16384, false, false}, {12, 16384, false, false}, {12, 16384, false, true},
                              {48, 4096, false, false}, {1, 16384, true, false},  {12, 16384, true, false}, {12, 16384, true, true}};
    for (int b : blocks)
        for (const Config &k : configs)
            if (run(buf, buf_bytes, &cursor, b, k.n, k.bytes, k.lanes, k.from_l2, out)) return 1;
    CK(cudaFree(buf));
    CK(cudaFree(out));
    return 0;
}
