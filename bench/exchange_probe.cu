// bench/exchange_probe.cu: what a hand-over between the blocks of one cluster of 16 costs, alone,
// in the forms a small model's layer could take in the cluster step (bench/NOTES.md 130). Each
// round every block waits for its input (its own mbarrier, completed by the bytes of the others'
// st.async, as cuda/cluster_step.cuh's hops do), makes its outputs from that input (an add or two
// each, so that every round depends on the one before) and sends them:
//   gather    each block makes D / 16 of D outputs and sends them to every block: the cluster
//             step's hop with its work left out (no x staged, no rows, no epilogue)
//   scatter   S of the 16 blocks each make a partial of all D outputs (a split-K matrix's, over
//             the block's own columns) and send each block its D / 16 slice; each block sums the
//             S partials of its slice and sends the sums to every block: two exchanges a round
//   all       all 16 blocks send their whole partial of D to every block, and every block sums
//             the 16 partials of all D: one exchange a round, 16 x D floats into each block
//   gather, fused   as gather, each thread sending the outputs it makes (no block barrier
//             between making and sending)
//   gather, one warp   as fused, by one warp of each block: no block barrier at all
//   reduce    S of the 16 blocks each send their whole partial of D to every block by one bulk
//             reduce-add copy a block (cp.reduce.async.bulk, shared::cta to shared::cluster), in
//             fixed point (64-bit words, or 32), which the copy engine adds into the receiver's
//             accumulator: no sums by the receiver, exact in any order; the other blocks add 16
//             bytes of zeros to each, so that every block takes part in every round
// Prints ns a round: (the time of 3000 rounds - that of 1000) / 2000, each the median of 5
// launches timed by events, so that the launch and the first round are left out. A wait that has
// not ended after about 2 s prints which and traps, so the launch fails instead of hanging.
// make bench/exchange_probe && ./bench/exchange_probe
#include <cstdint>
#include <cmath>
#include <cstdio>

#include "../kernels.cu"   // the cluster step's PTX wrappers (cs_send, cs_try_cluster, ...): one translation unit
#include "probe.h"         // CK, median_ms

namespace xp {

constexpr int kC = 16, kThreads = 256, kMaxD = 1024, kShareMax = kMaxD / kC;
enum Form { GATHER, SCATTER, ALL, GATHER_FUSED, GATHER_WARP, REDUCE64, REDUCE32 };

struct Smem {
    float in[2][kMaxD];                  // a round's gathered input (round parity)
    float part[2][kC][kShareMax];        // scatter: the sources' partials of this block's slice
    float all[2][kC][kMaxD];             // all: every block's whole partial
    long long acc[2][kMaxD];             // reduce: the sum of the round's partials (fixed point; REDUCE32 its first half as 32-bit words)
    long long mine[2][kMaxD];            // reduce: this block's partial, the copy's source (round parity: a source is rewritten
                                         // two rounds on, after every copy that read it has landed)
    long long zeros[2];                  // reduce: what a block without a partial adds
    unsigned long long bar[2], pbar[2];  // in's, all's and acc's barrier; part's
};
// reduce's fixed point: a value v is the word v x kFix (2^32, 64-bit words) or v x kFix32 (2^16, 32-bit).
constexpr float kFix = 4294967296.0f, kFix32 = 65536.0f;

__device__ __forceinline__ void send1(uint32_t a, uint32_t bar, int rank, float v) { cs_send(a, bar, rank, v); }
__device__ __forceinline__ void send4(uint32_t a, uint32_t bar, int rank, float4 v) { cs_send4(a, bar, rank, v.x, v.y, v.z, v.w); }
// Waits for the phase of parity `parity` with cluster-scope acquire (the senders are other
// blocks), as the cluster step's hops wait for their inputs (cta: with the default cta-scope
// acquire instead, which the memory model does not make enough for other blocks' stores: a
// measurement of what the scope costs); traps after about 2 s.
__device__ void wait(uint32_t bar, int parity, int round, bool cta) {
    const long long t0 = clock64();
    while (!(cta ? cs_try(bar, parity) : cs_try_cluster(bar, parity)))
        if (clock64() - t0 > 4000000000ll) {
            printf("exchange_probe: block %d thread %d waited too long in round %d\n", blockIdx.x, threadIdx.x, round);
            __trap();
        }
}

// Sends n consecutive floats of src (this block's, shared) at offset `at` of every block's dst
// (or only block `to`, when to >= 0), 4 a send where n and at allow it; the block's threads
// share the sends, each sending what it has read.
__device__ void send_run(const float *src, float *dst, int at, int n, uint32_t bar, int to) {
    const int dests = to >= 0 ? 1 : kC;
    if (n % 4 == 0 && at % 4 == 0) {
        for (int i = threadIdx.x; i < n / 4 * dests; i += kThreads) {
            const int q = i % (n / 4), d = to >= 0 ? to : i / (n / 4);
            send4(cs_saddr(dst + at + 4 * q), bar, d, *reinterpret_cast<const float4 *>(src + 4 * q));
        }
    } else {
        for (int i = threadIdx.x; i < n * dests; i += kThreads) {
            const int q = i % n, d = to >= 0 ? to : i / n;
            send1(cs_saddr(dst + at + q), bar, d, src[q]);
        }
    }
}

// Sends src's D floats (this block's, shared) in slices of D / 16, slice o to block o's dst, 4 a
// send where the slices allow it; the block's threads share the sends in one pass.
__device__ void send_slices(const float *src, int D, float *dst, uint32_t bar) {
    const int share = D / kC;
    if (share % 4 == 0) {
        for (int q = threadIdx.x; q < D / 4; q += kThreads) {
            const int o = 4 * q / share;
            send4(cs_saddr(dst + 4 * q - o * share), bar, o, *reinterpret_cast<const float4 *>(src + 4 * q));
        }
    } else {
        for (int i = threadIdx.x; i < D; i += kThreads) send1(cs_saddr(dst + i % share), bar, i / share, src[i]);
    }
}

// One bulk reduce-add of `bytes` from this block's src into block `rank`'s dst (both shared,
// 16-byte aligned), counted towards that block's barrier bar as a copy's bytes are.
template <bool k64>
__device__ __forceinline__ void reduce_into(uint32_t dst, const void *src, int bytes, uint32_t bar, int rank) {
    if (k64)
        asm volatile("cp.reduce.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes.add.u64 [%0], [%1], %2, [%3];" ::"r"(
                         cs_remote(dst, rank)),
                     "r"(cs_saddr(src)), "r"(bytes), "r"(cs_remote(bar, rank))
                     : "memory");
    else
        asm volatile("cp.reduce.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes.add.u32 [%0], [%1], %2, [%3];" ::"r"(
                         cs_remote(dst, rank)),
                     "r"(cs_saddr(src)), "r"(bytes), "r"(cs_remote(bar, rank))
                     : "memory");
}

// This block's partial (mine[from], written by its threads) added into every block's acc[to] by
// one copy each from threads 0-15 (a block that is not one of the S senders adds 16 bytes of zeros).
template <bool k64>
__device__ void reduce_send(Smem *s, int from, int to, int D, int S, int rank) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // the generic writes, before the copies read or add to them
    __syncthreads();
    if (threadIdx.x < kC) {
        const uint32_t dst = cs_saddr(s->acc[to]), bar = cs_saddr(&s->bar[to]);
        if (rank < S) reduce_into<k64>(dst, s->mine[from], D * (k64 ? 8 : 4), bar, threadIdx.x);
        else reduce_into<k64>(dst, s->zeros, 16, bar, threadIdx.x);
    }
}
// v in reduce's fixed point, at mine[b][i].
template <bool k64>
__device__ __forceinline__ void put_mine(Smem *s, int b, int i, float v) {
    if (k64) s->mine[b][i] = __float2ll_rn(v * kFix);
    else reinterpret_cast<int *>(s->mine[b])[i] = __float2int_rn(v * kFix32);
}

// reduce's round r (b = r & 1): the accumulated input read and zeroed, this block's partial
// (each sender: input / S + 0.001, so that the sum grows slowly and stays in range) written in
// fixed point and sent.
template <bool k64>
__device__ void reduce_round(Smem *s, int b, int D, int S, int rank) {
    long long *acc = s->acc[b];
    int *acc32 = reinterpret_cast<int *>(acc);
    for (int i = threadIdx.x; i < D; i += kThreads) {
        const float v = k64 ? (float)acc[i] * (1.0f / kFix) : (float)acc32[i] * (1.0f / kFix32);
        if (k64) acc[i] = 0;
        else acc32[i] = 0;
        put_mine<k64>(s, b, i, v / S + 0.001f);
    }
    reduce_send<k64>(s, b, b ^ 1, D, S, rank);
}

// reduce's round 0 input: the starting outputs / S from each sender (as round -1's partial, mine[1]).
template <bool k64>
__device__ void reduce_first(Smem *s, const float *out, int D, int S, int rank) {
    for (int i = threadIdx.x; i < D; i += kThreads) put_mine<k64>(s, 1, i, out[i] / S);
    reduce_send<k64>(s, 1, 0, D, S, rank);
}

// Gather's round made and sent by the same threads (`threads` of them from thread 0): each makes
// the outputs it sends, 4 a send where the slice allows it, so that no barrier stands between.
__device__ void gather_fused(Smem *s, int b, int D, int first, int share, int threads) {
    const float *x = s->in[b];
    const uint32_t bar = cs_saddr(&s->bar[b ^ 1]);
    auto make = [&](int j) { return 0.5f * (x[j] + x[(j + 1) % D]); };
    if (share % 4 == 0) {
        for (int i = threadIdx.x; i < share / 4 * kC; i += threads) {
            const int j = first + 4 * (i % (share / 4)), d = i / (share / 4);
            send4(cs_saddr(&s->in[b ^ 1][j]), bar, d, make_float4(make(j), make(j + 1), make(j + 2), make(j + 3)));
        }
    } else {
        for (int i = threadIdx.x; i < share * kC; i += threads) {
            const int j = first + i % share;
            send1(cs_saddr(&s->in[b ^ 1][j]), bar, i / share, make(j));
        }
    }
}

// One launch: `rounds` rounds of form f over D outputs (S sources for SCATTER). out: scratch
// for a block's own outputs before they are sent (so that a thread sends what it wrote itself
// after a barrier, never another's half-written value).
__global__ void __launch_bounds__(kThreads, 1) exchange_kernel(int f, int D, int S, bool cta, int rounds, float *sink) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem *s = reinterpret_cast<Smem *>(smem_raw);
    __shared__ __align__(16) float out[kMaxD];
    const int rank = cs_rank(), share = D / kC, first = rank * share;
    const bool reduce = f == REDUCE64 || f == REDUCE32;
    const int in_bytes = f == ALL ? kC * D * 4 : reduce ? S * D * (f == REDUCE64 ? 8 : 4) + (kC - S) * 16 : D * 4, part_bytes = S * share * 4;
    if (threadIdx.x == 0) {
        for (int i = 0; i < 2; i++) mbar_init(cs_saddr(&s->bar[i])), mbar_init(cs_saddr(&s->pbar[i]));
        mbar_init_fence();
        mbar_arrive_expect(cs_saddr(&s->bar[0]), in_bytes);
    }
    for (int i = threadIdx.x; i < D; i += kThreads) out[i] = 1.0f + 0.001f * (i % 7);
    for (int i = threadIdx.x; i < 2 * kMaxD; i += kThreads) s->acc[i / kMaxD][i % kMaxD] = 0;
    if (threadIdx.x < 2) s->zeros[threadIdx.x] = 0;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    cs_cluster_sync();   // every block's barriers initialised before any sends
    // round 0's input: every block's starting outputs
    __syncthreads();
    if (f == ALL) send_run(out, &s->all[0][rank][0], 0, D, cs_saddr(&s->bar[0]), -1);
    else if (f == REDUCE64) reduce_first<true>(s, out, D, S, rank);
    else if (f == REDUCE32) reduce_first<false>(s, out, D, S, rank);
    else send_run(out + first, s->in[0], first, share, cs_saddr(&s->bar[0]), -1);
    const bool one_warp = f == GATHER_WARP;
    for (int r = 0; r < rounds && !(one_warp && threadIdx.x >= 32); r++) {
        const int b = r & 1;
        wait(cs_saddr(&s->bar[b]), (r >> 1) & 1, r, cta);
        if (one_warp) __syncwarp();
        else __syncthreads();   // every thread past this phase before the next one is armed
        if (threadIdx.x == 0) {
            mbar_arrive_expect(cs_saddr(&s->bar[b ^ 1]), in_bytes);
            if (f == SCATTER) mbar_arrive_expect(cs_saddr(&s->pbar[b]), part_bytes);
        }
        if (f == REDUCE64) {
            reduce_round<true>(s, b, D, S, rank);
        } else if (f == REDUCE32) {
            reduce_round<false>(s, b, D, S, rank);
        } else if (f == GATHER_FUSED || one_warp) {
            gather_fused(s, b, D, first, share, one_warp ? 32 : kThreads);
        } else if (f == GATHER) {   // its slice of the next input from this one
            for (int i = threadIdx.x; i < share; i += kThreads) out[first + i] = 0.5f * (s->in[b][first + i] + s->in[b][(first + i + 1) % D]);
            __syncthreads();
            send_run(out + first, s->in[b ^ 1], first, share, cs_saddr(&s->bar[b ^ 1]), -1);
        } else if (f == SCATTER) {
            if (rank < S) {   // a source: its partial of every output, each slice to its block
                for (int i = threadIdx.x; i < D; i += kThreads) out[i] = s->in[b][i] * (0.5f + 0.01f * rank) / S;
                __syncthreads();
                send_slices(out, D, &s->part[b][rank][0], cs_saddr(&s->pbar[b]));
            }
            wait(cs_saddr(&s->pbar[b]), (r >> 1) & 1, r, cta);
            __syncthreads();
            for (int i = threadIdx.x; i < share; i += kThreads) {   // the slice's sum, then to every block
                float v = s->in[b][first + i];
                for (int src = 0; src < S; src++) v += s->part[b][src][i];
                out[first + i] = 0.5f * v;
            }
            __syncthreads();
            send_run(out + first, s->in[b ^ 1], first, share, cs_saddr(&s->bar[b ^ 1]), -1);
        } else {   // ALL: the 16 partials summed, every output, then this block's partial to every block
            for (int i = threadIdx.x; i < D; i += kThreads) {
                float v = 0.0f;
                for (int src = 0; src < kC; src++) v += s->all[b][src][i];
                out[i] = v * (0.0625f + 0.001f * rank);
            }
            __syncthreads();
            send_run(out, &s->all[b ^ 1][rank][0], 0, D, cs_saddr(&s->bar[b ^ 1]), -1);
        }
    }
    if (!(one_warp && threadIdx.x >= 32)) wait(cs_saddr(&s->bar[rounds & 1]), (rounds >> 1) & 1, rounds, cta);
    if (threadIdx.x == 0 && rank == 0)
        *sink = f == ALL        ? s->all[rounds & 1][0][0]
                : f == REDUCE64 ? (float)s->acc[rounds & 1][0] / kFix
                : f == REDUCE32 ? (float)reinterpret_cast<int *>(s->acc[rounds & 1])[0] / kFix32
                                : s->in[rounds & 1][0];
    cs_cluster_sync();   // no block leaves while another may still send into it
}

// The median ms of 5 launches of `rounds` rounds; -1 on an error (printed).
float time_rounds(int f, int D, int S, bool cta, int rounds, float *sink) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(kC), cfg.blockDim = dim3(kThreads), cfg.dynamicSmemBytes = sizeof(Smem);
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = kC, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
    cfg.attrs = &attr, cfg.numAttrs = 1;
    char what[80];
    snprintf(what, sizeof what, "exchange_probe: form %d, D %d, S %d, %d rounds", f, D, S, rounds);
    return median_ms([&] { return cudaLaunchKernelEx(&cfg, exchange_kernel, f, D, S, cta, rounds, sink); }, 5, what);
}

}  // namespace xp

int main() {
    using namespace xp;
    cudaDeviceProp prop;
    if (need_sm90("exchange_probe", "thread-block clusters, st.async", &prop)) return 1;
    CK(cudaFuncSetAttribute(exchange_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sizeof(Smem)));
    CK(cudaFuncSetAttribute(exchange_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    float *sink;
    CK(cudaMalloc(&sink, sizeof(float)));
    printf("%s, one cluster of %d blocks of %d threads; ns a round (3000 rounds - 1000, medians of 5)\n", prop.name, kC, kThreads);
    struct Case { int f, D, S; bool cta; const char *what; };
    const Case cases[] = {
        {GATHER, 288, 0, false, "gather, D 288 (stories15m's dim)"},
        {GATHER, 576, 0, false, "gather, D 576 (the SmolLM2 shape's dim)"},
        {GATHER, 1024, 0, false, "gather, D 1024"},
        {GATHER, 576, 0, true, "gather, D 576, cta-scope waits"},
        {GATHER_FUSED, 288, 0, false, "gather, fused, D 288"},
        {GATHER_FUSED, 576, 0, false, "gather, fused, D 576"},
        {GATHER_WARP, 288, 0, false, "gather, one warp, D 288"},
        {GATHER_WARP, 576, 0, false, "gather, one warp, D 576"},
        {SCATTER, 288, 6, false, "scatter from 6 blocks, D 288 (stories15m's heads)"},
        {SCATTER, 576, 9, false, "scatter from 9 blocks, D 576 (the SmolLM2 shape's heads)"},
        {SCATTER, 576, 16, false, "scatter from 16 blocks, D 576"},
        {SCATTER, 576, 9, true, "scatter from 9 blocks, D 576, cta-scope waits"},
        {ALL, 288, 16, false, "all from 16 blocks, D 288"},
        {ALL, 576, 16, false, "all from 16 blocks, D 576"},
        {REDUCE64, 288, 16, false, "reduce, 64-bit, from 16 blocks, D 288"},
        {REDUCE64, 576, 16, false, "reduce, 64-bit, from 16 blocks, D 576"},
        {REDUCE64, 1024, 16, false, "reduce, 64-bit, from 16 blocks, D 1024"},
        {REDUCE64, 288, 6, false, "reduce, 64-bit, from 6 blocks, D 288 (stories15m's heads)"},
        {REDUCE64, 576, 9, false, "reduce, 64-bit, from 9 blocks, D 576 (the SmolLM2 shape's heads)"},
        {REDUCE32, 288, 16, false, "reduce, 32-bit, from 16 blocks, D 288"},
        {REDUCE32, 576, 16, false, "reduce, 32-bit, from 16 blocks, D 576"},
        {REDUCE32, 1024, 16, false, "reduce, 32-bit, from 16 blocks, D 1024"},
    };
    int wrong = 0;   // sums that came out wrong: a non-zero exit, the timings beside them mean nothing
    for (const Case &c : cases) {
        const float a = time_rounds(c.f, c.D, c.S, c.cta, 1000, sink), b = time_rounds(c.f, c.D, c.S, c.cta, 3000, sink);
        if (a < 0.0f || b < 0.0f) return 1;
        printf("  %-58s %8.1f ns a round (1000 rounds %.3f ms, 3000 %.3f ms)\n", c.what, (b - a) * 1e6f / 2000.0f, a, b);
        if (c.f == REDUCE64 || c.f == REDUCE32) {   // the sum's first element after 3000 rounds: 1 + 3000 x 0.001 S (less the roundings)
            float got = 0.0f;
            CK(cudaMemcpy(&got, sink, sizeof got, cudaMemcpyDeviceToHost));
            const float want = 1.0f + 3000 * 0.001f * c.S;
            const bool ok = fabsf(got - want) <= 0.01f * want;
            printf("  %-58s first output %.4f, %.4f expected%s\n", "", got, want, ok ? "" : " (WRONG)");
            wrong += !ok;
        }
    }
    CK(cudaFree(sink));
    if (wrong) fprintf(stderr, "exchange_probe: %d reduce sums wrong\n", wrong);
    return wrong ? 1 : 0;
}
