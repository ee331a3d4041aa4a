// bench/copy_probe.cu: how long the cluster step's ring copies take by themselves: bulk copies
// (cp.async.bulk, global to shared, each completing its own mbarrier) of a ring's pieces, issued
// all at once by one thread of a block, as the producer issues them when slots free up
// (bench/NOTES.md 135: in the step, the pieces that the consumers waited for had landed 7-24 us
// after their issue). For each configuration, on `blocks` blocks at once (1 SM, the cluster's 16,
// or every SM), each block's thread 0 issues n copies of `bytes` from its own region of a buffer
// far larger than L2 (each launch reads bytes no launch before it read: from DRAM), then waits
// for each in turn and stamps %globaltimer. Prints, as the median over the blocks of the third of
// three launches (the first two warm the clocks): the first copy's landing, the last's, and the
// block's bytes over the last's landing (GB/s a block); then the same copies again, from L2.
// make bench/copy_probe && ./bench/copy_probe
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "probe.h"   // CK, need_sm90

namespace {

constexpr int kMaxCopies = 12, kStamps = kMaxCopies + 1;

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// out[block][0]: when the copies were issued; [1 + i]: when copy i's barrier completed (each
// waited for in issue order, so a stamp is at least that copy's landing).
__global__ void copy_kernel(const unsigned char *src, size_t block_stride, int n, int bytes, unsigned long long *out) {
    extern __shared__ __align__(128) unsigned char slots[];
    __shared__ __align__(8) unsigned long long bar[kMaxCopies];
    if (threadIdx.x != 0) return;
    uint32_t bar_at[kMaxCopies];
    for (int i = 0; i < n; i++) {
        bar_at[i] = (uint32_t)__cvta_generic_to_shared(&bar[i]);
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_at[i]) : "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // the barriers' init, before the copies complete them
    const unsigned char *from = src + blockIdx.x * block_stride;
    const unsigned long long t0 = now_ns();
    for (int i = 0; i < n; i++) {
        const uint32_t dst = (uint32_t)__cvta_generic_to_shared(slots + (size_t)i * bytes);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_at[i]), "r"(bytes) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                     "l"(from + (size_t)i * bytes), "r"(bytes), "r"(bar_at[i])
                     : "memory");
    }
    unsigned long long *o = out + (size_t)blockIdx.x * kStamps;
    o[0] = t0;
    for (int i = 0; i < n; i++) {
        uint32_t done = 0;
        while (!done)
            asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}"
                         : "=r"(done) : "r"(bar_at[i]) : "memory");
        o[1 + i] = now_ns();
    }
}

double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            const double t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    return v[n / 2];
}

// One configuration: three launches, each from a new region (from_l2: the last launch's region
// again, read once more); prints the third's medians over the blocks.
int run(const unsigned char *buf, size_t buf_bytes, size_t *cursor, int blocks, int n, int bytes, bool from_l2,
        unsigned long long *out_dev) {
    const size_t stride = (size_t)n * bytes, span = stride * blocks;
    static unsigned long long out[1024 * kStamps];
    size_t at = *cursor;
    for (int launch = 0; launch < 3; launch++) {
        if (!(from_l2 && launch > 0)) {
            if (*cursor + span > buf_bytes) *cursor = 0;
            at = *cursor, *cursor += span;
        }
        copy_kernel<<<blocks, 32, (size_t)kMaxCopies * bytes>>>(buf + at, stride, n, bytes, out_dev);
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
    printf("  %3d block%s, %2d copies of %5d bytes%s: first landed %7.2f us, last %7.2f us, %7.1f GB/s a block\n", blocks,
           blocks > 1 ? "s" : " ", n, bytes, from_l2 ? " (L2)" : "     ", median(first, blocks) / 1e3, median(last, blocks) / 1e3,
           median(rate, blocks));
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
    CK(cudaFuncSetAttribute(copy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxCopies * 16384));
    printf("%s (%d SMs): bulk copies from one thread a block, each to its own mbarrier (the third of three launches)\n", prop.name,
           prop.multiProcessorCount);
    size_t cursor = 0;
    const int blocks[] = {1, 16, prop.multiProcessorCount < 1024 ? prop.multiProcessorCount : 1024};
    for (int b : blocks) {
        for (int n : {1, 4, 12})
            if (run(buf, buf_bytes, &cursor, b, n, 16384, false, out)) return 1;
        if (run(buf, buf_bytes, &cursor, b, 12, 16384, true, out)) return 1;
        if (run(buf, buf_bytes, &cursor, b, 12, 4096, false, out)) return 1;
    }
    CK(cudaFree(buf));
    CK(cudaFree(out));
    return 0;
}
