// kernels.cu: the GPU kernels of the engine and their launchers (interface: kernels.h).
//
// Defines, kernels first:
//   q8_matmul_kernel   fused INT8 dequant-GEMV/GEMM: y = x W^T with W read once as int8 + scales;
//                      up to three outputs per launch (q, k, v), or w1 and w3 with the SwiGLU, and
//                      optionally y += (the residual add)
//   dequant_kernel     INT8 -> FP32 copy of one weight (the --unfused baseline, then cuBLAS)
//   embed_kernel, rmsnorm_kernel, rope_store_kernel (KV cache FP16 or FP32),
//   attention_kernel + attention_combine_kernel (split over the sequence, flash-decoding style),
//   swiglu_kernel, argmax_kernel      the rest of the forward pass
//   sample_kernel      llama2.c's top-p / multinomial sampling of rows of logits
//   to_half_kernel     weights to FP16 for the cuBLAS FP16 baseline (--fp16)
// Every kernel is launched with programmatic dependent launch (PDL) allowed: it may start while the
// kernel before it drains, and waits (griddepcontrol.wait) before it touches anything that kernel
// writes or reads; the GEMV uses the time to pull its first weight bytes into L2.
// The step's position and token ids live in device memory (gpu_set_inputs), so that a decode
// step captured as a CUDA graph replays at any position.
// then the launchers: each takes the context's stream, sizes its grid with ceil_div, and checks
// the launch.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

// ----------------------------------------------------------------------------
// Checked calls

static void cuda_check(cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "run: CUDA error %s (%s) in %s at %s:%d\n", cudaGetErrorName(e), cudaGetErrorString(e), what, file, line);
    exit(1);
}
static void cublas_check(cublasStatus_t s, const char *what, const char *file, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "run: cuBLAS error %d in %s at %s:%d\n", (int)s, what, file, line);
    exit(1);
}
#define CUDA_CHECK(call) cuda_check((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) cublas_check((call), #call, __FILE__, __LINE__)

struct GpuCtx {
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_workspace;    // cuBLAS's own, so that it allocates nothing while a graph is captured
    float *scratch;          // (scratch_floats) dequantized weights for the unfused path
    size_t scratch_floats;
    int *inputs;             // (1 + kMaxTokens): the step's position, then its token ids
    int *argmax;             // (kMaxArgmaxRows) device results of gpu_argmax (the first) and gpu_argmax_rows
    int *argmax_rows_host;   // (kMaxArgmaxRows) pinned: gpu_argmax_rows's results
    int *argmax_host;        // (kArgmaxSlots) pinned: results fetched asynchronously
    cudaEvent_t argmax_fetched[2];
    int *inputs_host;        // pinned staging for inputs; reused once inputs_copied has passed
    cudaEvent_t inputs_copied;
    __half *x_half;          // (half_floats) activations converted for the FP16 cuBLAS path
    size_t half_floats;
    int pdl;                 // launch with programmatic dependent launch allowed
    int prefetch_bytes;      // the GEMV's L2 prefetch per row under PDL (RUN_PREFETCH_BYTES overrides)
    int late_release;        // the GEMV releases its dependents after its loop (RUN_PDL_LATE=1; an experiment)
    int gemv_tma;            // M = 1 through q8_gemv_tma_kernel where it applies (gpu_set_gemv_tma)
    int gemv_stages;         // its ring's tiles (RUN_GEMV_STAGES overrides)
    int gemv_blocks;         // its blocks per SM, where shared memory allows (RUN_GEMV_BLOCKS overrides)
    int sms;                 // the GPU's multiprocessors
};

static int wgmma_available(void);

struct GpuGraph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

namespace {

constexpr int kWarps = 8;            // 256 threads a block: two warps per scheduler of an SM
// Rows per warp and 16-byte chunks in flight per row, from bench/kernel_bench's sweep on the H200
// (M = 1, 7B and TinyLlama shapes): 2 rows x 2 chunks was fastest or within noise of it for up to
// 5632 rows; 4 rows x 2 chunks for 11008 and 32000 rows (fewer, longer-lived warps). More chunks
// in flight was slower everywhere: the registers cost occupancy, and 16+ warps per SM already
// keep enough bytes in flight.
constexpr int kRowsPerWarp = 2, kRowsPerWarpTall = 4, kTallRows = 8192;
constexpr int kChunksInFlight = 2;
constexpr int kMaxTokens = 4096;
constexpr int kMaxArgmaxRows = 64;   // gpu_argmax_rows: a --batch's sequences
constexpr size_t kBlasWorkspace = 32u << 20;
constexpr int kMaxSmem = 200 * 1024; // dynamic shared memory a block may ask for (H200: 227 KB)
// Bytes of each weight row the GEMV asks L2 for before the previous kernel has finished (PDL):
// 1 KB x 4096 rows = 4 MB for a 4096 x 4096 layer, well inside the 50 MB L2.
constexpr int kPrefetchBytes = 1024;

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum (or max) over the block; every thread gets the result. red: 32 floats of shared memory.
template <bool kMax>
__device__ float block_reduce(float v, float *red) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    v = kMax ? warp_max(v) : warp_sum(v);
    __syncthreads();   // red may still be read by a previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < n_warps ? red[lane] : (kMax ? -INFINITY : 0.0f);
    return kMax ? warp_max(v) : warp_sum(v);
}

// Programmatic dependent launch: wait until the previous kernel in the stream has completed and
// its writes are visible (a no-op when launched without PDL); then let the next kernel launch.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_release() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait_then_release() {
    pdl_wait();
    pdl_release();
}

// Pull one 128-byte line into L2 without waiting for it.
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// 16 weight bytes that are read exactly once: no L1 allocation, so they don't evict x.
__device__ __forceinline__ int4 load_stream(const int8_t *p) {
    int4 v;
    asm("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// Four int8 in a word to exact floats: each byte, biased by 128, is permuted into the low
// mantissa byte of 2^23 (0x4B000000), and one subtraction of 2^23 + 128 leaves the value.
// Two full-rate instructions per weight instead of a quarter-rate integer-to-float conversion.
__device__ __forceinline__ void int8x4_to_float(uint32_t word, float out[4]) {
    const uint32_t biased = word ^ 0x80808080u;
    const uint32_t two_23 = 0x4B000000u;
    const float bias = 8388736.0f;   // 2^23 + 128
    out[0] = __uint_as_float(__byte_perm(biased, two_23, 0x7440)) - bias;
    out[1] = __uint_as_float(__byte_perm(biased, two_23, 0x7441)) - bias;
    out[2] = __uint_as_float(__byte_perm(biased, two_23, 0x7442)) - bias;
    out[3] = __uint_as_float(__byte_perm(biased, two_23, 0x7443)) - bias;
}

// sum_j scale(w[j], j) * x[j] over one 16-weight chunk, x in registers; each word's four weights
// are converted right before their FMAs.
template <class Scale>
__device__ __forceinline__ float dot16_with(int4 w, const float x[16], Scale scale) {
    const uint32_t words[4] = {(uint32_t)w.x, (uint32_t)w.y, (uint32_t)w.z, (uint32_t)w.w};
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float f[4];
        int8x4_to_float(words[i], f);
#pragma unroll
        for (int j = 0; j < 4; j++) acc = fmaf(scale(f[j], 4 * i + j), x[4 * i + j], acc);
    }
    return acc;
}

// One scale for the chunk, applied by the caller to the partial sum.
__device__ __forceinline__ float dot16(int4 w, const float x[16]) {
    return dot16_with(w, x, [](float f, int) { return f; });
}

// For group sizes that are not a power-of-two multiple of 16: a scale per weight.
// k0: the chunk's first column; group indices past the row's last (padding) are clamped.
__device__ __forceinline__ float dot16_scaled(int4 w, const float x[16], const float *srow, int k0, int gs, int groups) {
    return dot16_with(w, x, [&](float f, int j) { return f * __ldg(srow + min((k0 + j) / gs, groups - 1)); });
}

// x[k0 .. k0+16) of one input row into registers, through L1 (every warp of the SM reads the same
// row, so it stays cached); zero past K. vec: the row is 16-byte aligned (K % 4 == 0).
__device__ __forceinline__ void load_x16(float out[16], const float *__restrict__ xrow, int k0, int K, bool vec) {
    if (vec && k0 + 16 <= K) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float4 v = __ldg(reinterpret_cast<const float4 *>(xrow + k0) + i);
            out[4 * i] = v.x, out[4 * i + 1] = v.y, out[4 * i + 2] = v.z, out[4 * i + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < 16; j++) out[j] = k0 + j < K ? __ldg(xrow + k0 + j) : 0.0f;
    }
}

// One launch may compute up to three outputs that share x and K (q, k and v), each over its own
// range of blocks; or, in pair mode, two weights row by row (w1 and w3) with the SwiGLU applied.
struct Q8Out {
    const int8_t *q;   // (N, stride)
    const float *s;    // (N, groups)
    float *y;          // (M, N)
    int N;
    int first_block;   // blockIdx.x where this output starts
};
// QKV launch only: RoPE applied to q and k in the epilogue, then k and v stored straight into
// the layer's KV cache rows pos..pos+M-1 instead of out[1].y and out[2].y.
struct RopeStore {
    const int *inputs;   // [0]: the position of token 0; NULL: no RoPE, plain outputs
    void *kc, *vc;       // (seq_len, kv_dim) the layer's caches, FP16 if kv_half else FP32
    int head_size, kv_half;
    size_t seq_stride;   // 0: token m at pos + m; else token m is sequence m's, at pos, caches this far apart
};
struct Q8Args {
    Q8Out out[3];
    const float *x;    // (M, K)
    int n_out, M, K, stride, groups, gs, group_shift;
    int accumulate;    // y += result instead of y = result
    const float *norm_w;  // non-NULL: x is the raw residual stream, RMSNorm'd on the fly with these (K) weights
    int prefetch_bytes;   // of each weight row, asked of L2 before the previous kernel ends (PDL)
    int late_release;     // PDL: let the next kernel launch after the main loop, not at the start
    int tma_rows, tma_stages;   // q8_gemv_tma_kernel: rows of each output per block, stages in its ring
    RopeStore rope;
};

// Rotates the pairs (v[r], v[r + 1]), r even, of rows row0 + r at position pos: the same
// operations as rope_store_kernel (and the CPU's RoPE).
template <int R>
__device__ __forceinline__ void rope_rows(float v[R], int row0, int pos, int head_size) {
#pragma unroll
    for (int r = 0; r + 1 < R; r += 2) {
        const float freq = 1.0f / powf(10000.0f, ((row0 + r) % head_size) / (float)head_size);
        float sn, cs;
        sincosf(pos * freq, &sn, &cs);
        const float v0 = v[r], v1 = v[r + 1];
        v[r] = v0 * cs - v1 * sn;
        v[r + 1] = v0 * sn + v1 * cs;
    }
}

// The finished outputs v of rows row0 .. row0 + R - 1 (row0 even) of output j for token m, by
// one thread: RoPE'd and stored into the KV cache (the QKV launch's k and v), or written to y
// (added to it when accumulating). Rows past N are dropped.
template <int R>
__device__ __forceinline__ void store_rows(const Q8Args &a, int j, const Q8Out &o, int row0, int m, float v[R]) {
    if (R % 2 == 0 && a.rope.inputs) {   // row0 is even: whole RoPE pairs
        const int pos = a.rope.inputs[0] + (a.rope.seq_stride ? 0 : m);
        if (j < 2) rope_rows<R>(v, row0, pos, a.rope.head_size);
        if (j > 0) {
            const size_t at = m * a.rope.seq_stride + (size_t)pos * o.N + row0;
            void *cache = j == 1 ? a.rope.kc : a.rope.vc;
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (row0 + r >= o.N) break;
                if (a.rope.kv_half) reinterpret_cast<__half *>(cache)[at + r] = __float2half_rn(v[r]);
                else reinterpret_cast<float *>(cache)[at + r] = v[r];
            }
            return;
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (row0 + r >= o.N) break;
        float *dst = o.y + (size_t)m * o.N + row0 + r;
        *dst = a.accumulate ? *dst + v[r] : v[r];
    }
}

// Which of a launch's outputs block blockIdx.x computes (pair mode: always 0, w1 and w3 together).
__device__ __forceinline__ int output_of_block(const Q8Args &a, bool pair) {
    return pair ? 0 : (a.n_out > 2 && blockIdx.x >= a.out[2].first_block) ? 2 : (a.n_out > 1 && blockIdx.x >= a.out[1].first_block) ? 1 : 0;
}

// 1 / rms of n values whose squares sum to sumsq: rmsnorm_kernel's factor (and the CPU's).
__device__ __forceinline__ float inv_rms_of(float sumsq, int n) { return 1.0f / sqrtf(sumsq / n + 1e-5f); }

// The folded RMSNorm on 16 x values from column k on: their squares added to sumsq, then x times
// the norm weights (the 1 / rms comes later, on the finished sums).
__device__ __forceinline__ void norm_x16(float xv[16], float &sumsq, const float *norm_w, int k, int K, bool vec_norm) {
    float gv[16];
    load_x16(gv, norm_w, k, K, vec_norm);
#pragma unroll
    for (int j = 0; j < 16; j++) sumsq = fmaf(xv[j], xv[j], sumsq), xv[j] *= gv[j];
}

// An output from its row sum(s) over the un-normalised input: times 1 / rms; in pair mode
// silu(w1 x) * (w3 x) from w1's sum and w3's.
__device__ __forceinline__ float finish_output(float sum, float sum3, float inv_rms, bool pair) {
    const float v = sum * inv_rms;
    return pair ? v * (1.0f / (1.0f + expf(-v))) * (sum3 * inv_rms) : v;
}

// Fused dequant-GEMM: y (M, N) = x (M, K) W^T, W int8 (N, stride) with scales (N, groups).
//
//   grid.x: blocks of kWarps * R rows (of each output in turn);  grid.y: groups of MT tokens
//   Each warp takes R rows (pair mode: R rows of w1 and the same R rows of w3). Each lane walks
//   them in 16-byte chunks c = lane, lane + 32, ... (a warp reads 512 contiguous bytes of a row per
//   step), with kUnroll chunks per row and their scales in flight before the first is used. A
//   chunk's 16 int8 become floats in registers right before the FMAs, and its one group scale
//   multiplies the chunk's partial sum. A warp reduction gives each output. No dequantized weight
//   is ever stored, in shared or global memory.
//   kShiftGroups: gs is 16 * 2^group_shift, so chunk c lies in group c >> group_shift.
//   kNorm (a.norm_w: the RMSNorm before this layer, folded in): each warp sees every x element
//   of its tokens anyway, so it sums their squares on the way and multiplies x by the norm
//   weights; the 1 / rms factor, a per-token scalar, multiplies the finished sums. Saves the
//   norm's launch and its pass over x. (A template flag: as a run-time branch it cost the plain
//   M = 1 kernel 35 registers.)
template <int R, int kUnroll, int MT, bool kShiftGroups, bool kPair, bool kNorm>
__global__ void __launch_bounds__(kWarps * 32) q8_matmul_kernel(const Q8Args a) {
    const int j = output_of_block(a, kPair);
    const Q8Out o = j == 0 ? a.out[0] : j == 1 ? a.out[1] : a.out[2];
    constexpr int RR = kPair ? 2 * R : R;   // rows a warp reads
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = ((blockIdx.x - o.first_block) * kWarps + warp) * R, m0 = blockIdx.y * MT;
    if (row0 >= o.N) return;
    const int K = a.K, stride = a.stride, groups = a.groups;
    const bool vec_x = K % 4 == 0;
    const int8_t *qrow[RR];
    const float *srow[RR];
#pragma unroll
    for (int i = 0; i < RR; i++) {
        const Q8Out &src = kPair && i >= R ? a.out[1] : o;
        const int row = min(row0 + i % R, o.N - 1);   // rows past N repeat the last; never written
        qrow[i] = src.q + (size_t)row * stride;
        srow[i] = src.s + (size_t)row * groups;
    }
    // Weights do not depend on the previous kernel: start them towards L2 while it drains.
#pragma unroll
    for (int i = 0; i < RR; i++)
        for (int b = 128 * lane; b < min(stride, a.prefetch_bytes); b += 32 * 128) prefetch_l2(qrow[i] + b);
    // late_release: let the next kernel launch only once this block's loads are done (its blocks
    // are then placed as SMs free up, as without PDL, but their launch is still hidden); else at
    // once (its blocks wait on SMs that have room now, which may be few for a long GEMV).
    pdl_wait();
    if (!a.late_release) pdl_release();
    float acc[MT][RR], sumsq[MT];
#pragma unroll
    for (int t = 0; t < MT; t++) {
        sumsq[t] = 0.0f;
#pragma unroll
        for (int r = 0; r < RR; r++) acc[t][r] = 0.0f;
    }
    const bool vec_norm = kNorm && vec_x && (reinterpret_cast<uintptr_t>(a.norm_w) & 15) == 0;

    const int chunks = stride / 16;
    for (int c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
        // all loads of this step first (weights and their scales: each misses L1), then the math
        int4 w[kUnroll][RR];
        float scale[kUnroll][RR];
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const int c = c0 + 32 * u;
#pragma unroll
            for (int r = 0; r < RR; r++) {
                w[u][r] = c < chunks ? load_stream(qrow[r] + 16 * c) : make_int4(0, 0, 0, 0);
                scale[u][r] = kShiftGroups && c < chunks ? __ldg(srow[r] + (c >> a.group_shift)) : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const int c = c0 + 32 * u;
            if (c >= chunks) break;
#pragma unroll
            for (int t = 0; t < MT; t++) {
                if (m0 + t >= a.M) break;
                float xv[16];
                load_x16(xv, a.x + (size_t)(m0 + t) * K, 16 * c, K, vec_x);
                if (kNorm) norm_x16(xv, sumsq[t], a.norm_w, 16 * c, K, vec_norm);
#pragma unroll
                for (int r = 0; r < RR; r++) {
                    if (kShiftGroups) acc[t][r] = fmaf(scale[u][r], dot16(w[u][r], xv), acc[t][r]);
                    else acc[t][r] += dot16_scaled(w[u][r], xv, srow[r], 16 * c, a.gs, groups);
                }
            }
        }
    }
    if (a.late_release) pdl_release();
#pragma unroll
    for (int t = 0; t < MT; t++) {
        const float inv_rms = kNorm ? inv_rms_of(warp_sum(sumsq[t]), K) : 1.0f;
        float v[R];
#pragma unroll
        for (int r = 0; r < R; r++)   // pair mode: w3's sums follow w1's (RR - R + r is r + R then, and in bounds always)
            v[r] = finish_output(warp_sum(acc[t][r]), kPair ? warp_sum(acc[t][RR - R + r]) : 0.0f, inv_rms, kPair);
        if (lane == 0 && m0 + t < a.M) store_rows<R>(a, j, o, row0, m0 + t, v);
    }
}

// ----------------------------------------------------------------------------
// Fused dequant-GEMM on the tensor cores: y (M, N) = x16 (M, K) W^T with mma.sync m16n8k16
// (FP16 inputs, FP32 accumulation). x16 is the layer input converted to FP16 once; W stays int8.
//
//   block: 16 rows of W x (8 * kTiles) tokens; its 8 warps split K in 64-wide steps (warp w takes
//   steps w, w + 8, ...) and add their partial sums in shared memory at the end.
//   grid.x: token blocks (fastest, so the blocks that read the same rows run together and share
//   them through L2); grid.y: row blocks.
//   Per step, lane (g = lane / 4, t = lane % 4) loads 16 weight bytes of row g and of row g + 8,
//   bytes [16t, 16t + 16) of the step, and 16 x16 values of token g of each tile, the same k.
//   The mma's k axis is permuted so that its step s takes bytes 16t + 4s .. 16t + 4s + 3 of each
//   lane: A and B use the same permutation, which the dot product does not see, and every load is
//   16 contiguous bytes. int8 -> fp16 is exact (|q| <= 127); each 64-wide step lies in one group
//   (gs % 64 == 0), whose scale multiplies the step's partial sums in FP32.
//   Error: only x's rounding to FP16 (relative 2^-11 per element), so |y - exact| is at most about
//   4.9e-4 * sum_k |w x| plus FP32 accumulation.
constexpr int kMmaWarps = 8, kMmaStep = 64;

struct Q8MmaArgs {
    const int8_t *q;    // (N, stride)
    const float *s;     // (N, groups)
    const __half *x;    // (M, K)
    float *y;           // (M, N)
    int M, N, K, stride, groups, gs, accumulate;
};

// Two int8 (bytes lo, lo + 1 of word) to an exact half2: each biased byte goes into the low
// mantissa byte of 1024 (0x6400), then 1024 + 128 is subtracted.
__device__ __forceinline__ uint32_t int8x2_to_half2(uint32_t word, int hi) {
    const uint32_t biased = word ^ 0x80808080u;
    const uint32_t h = __byte_perm(biased, 0x64646464u, hi ? 0x5342u : 0x5140u);
    const __half2 v = __hsub2(*reinterpret_cast<const __half2 *>(&h), __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480)));
    return *reinterpret_cast<const uint32_t *>(&v);
}

// d += a (16 x 16, row) b (16 x 8, col), FP16 in, FP32 accumulate.
__device__ __forceinline__ void mma_16816(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16 x16 values of one token from k on (zero past K or past the last token), as 8 half2 words.
__device__ __forceinline__ void load_x16h(uint32_t out[8], const Q8MmaArgs &a, int token, int k) {
    if (token >= a.M) {   // padding tokens of the last tile: no per-element loop for them
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = 0;
        return;
    }
    if (k + 16 <= a.K && a.K % 8 == 0) {
        const uint4 *p = reinterpret_cast<const uint4 *>(a.x + (size_t)token * a.K + k);
        const uint4 v0 = __ldg(p), v1 = __ldg(p + 1);
        out[0] = v0.x, out[1] = v0.y, out[2] = v0.z, out[3] = v0.w, out[4] = v1.x, out[5] = v1.y, out[6] = v1.z, out[7] = v1.w;
        return;
    }
    for (int i = 0; i < 8; i++) {
        __half2 h = __halves2half2(__float2half(0.0f), __float2half(0.0f));
        if (k + 2 * i < a.K) h.x = a.x[(size_t)token * a.K + k + 2 * i];
        if (k + 2 * i + 1 < a.K) h.y = a.x[(size_t)token * a.K + k + 2 * i + 1];
        out[i] = *reinterpret_cast<const uint32_t *>(&h);
    }
}

// One 64-wide step's operands for one lane: 16 weight bytes of rows a and b, their group scales,
// and 16 x16 values of each token tile.
template <int kTiles>
struct MmaStep {
    int4 wa, wb;
    float sca, scb;
    uint32_t xw[kTiles][8];
};

template <int kTiles>
__device__ __forceinline__ void mma_load_step(MmaStep<kTiles> &o, const Q8MmaArgs &a, const int8_t *qa, const int8_t *qb,
                                              const float *sa, const float *sb, int step, int tok0, int t, int g) {
    const int k = step * kMmaStep + 16 * t;   // this lane's 16 weights of the step
    const bool in_row = k < a.stride;         // stride % 16 == 0: all 16 bytes or none
    o.wa = in_row ? load_stream(qa + k) : make_int4(0, 0, 0, 0);
    o.wb = in_row ? load_stream(qb + k) : make_int4(0, 0, 0, 0);
    const int group = min(step * kMmaStep / a.gs, a.groups - 1);
    o.sca = __ldg(sa + group), o.scb = __ldg(sb + group);
#pragma unroll
    for (int i = 0; i < kTiles; i++) load_x16h(o.xw[i], a, tok0 + 8 * i + g, k);
}

template <int kTiles>
__device__ __forceinline__ void mma_use_step(float acc[kTiles][4], const MmaStep<kTiles> &o) {
    const uint32_t wa_w[4] = {(uint32_t)o.wa.x, (uint32_t)o.wa.y, (uint32_t)o.wa.z, (uint32_t)o.wa.w};
    const uint32_t wb_w[4] = {(uint32_t)o.wb.x, (uint32_t)o.wb.y, (uint32_t)o.wb.z, (uint32_t)o.wb.w};
#pragma unroll
    for (int i = 0; i < kTiles; i++) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int s4 = 0; s4 < 4; s4++)
            mma_16816(d, int8x2_to_half2(wa_w[s4], 0), int8x2_to_half2(wb_w[s4], 0), int8x2_to_half2(wa_w[s4], 1),
                      int8x2_to_half2(wb_w[s4], 1), o.xw[i][2 * s4], o.xw[i][2 * s4 + 1]);
        acc[i][0] = fmaf(d[0], o.sca, acc[i][0]), acc[i][1] = fmaf(d[1], o.sca, acc[i][1]);
        acc[i][2] = fmaf(d[2], o.scb, acc[i][2]), acc[i][3] = fmaf(d[3], o.scb, acc[i][3]);
    }
}

// kUnroll steps' loads are issued before the first is used: at small M the kernel is a weight
// stream, and one step (1 KB per warp) in flight was too little to cover DRAM latency.
template <int kTiles, int kUnroll>
__device__ __forceinline__ void q8_mma_rows(const Q8MmaArgs &a, float (&part)[kMmaWarps][16][8 * kTiles], int row0) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int tok0 = blockIdx.x * 8 * kTiles;
    const int ra = min(row0 + g, a.N - 1), rb = min(row0 + g + 8, a.N - 1);   // past N: repeat the last, never written
    const int8_t *qa = a.q + (size_t)ra * a.stride, *qb = a.q + (size_t)rb * a.stride;
    const float *sa = a.s + (size_t)ra * a.groups, *sb = a.s + (size_t)rb * a.groups;
    float acc[kTiles][4];
#pragma unroll
    for (int i = 0; i < kTiles; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    const int steps = (a.stride + kMmaStep - 1) / kMmaStep;
    for (int first = warp; first < steps; first += kMmaWarps * kUnroll) {
        MmaStep<kTiles> st[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; u++)
            if (first + u * kMmaWarps < steps) mma_load_step(st[u], a, qa, qb, sa, sb, first + u * kMmaWarps, tok0, t, g);
#pragma unroll
        for (int u = 0; u < kUnroll; u++)
            if (first + u * kMmaWarps < steps) mma_use_step<kTiles>(acc, st[u]);
    }
    // D fragment: d0, d1 = (row g, tokens 2t, 2t + 1), d2, d3 = (row g + 8, the same tokens)
#pragma unroll
    for (int i = 0; i < kTiles; i++) {
        part[warp][g][8 * i + 2 * t] = acc[i][0], part[warp][g][8 * i + 2 * t + 1] = acc[i][1];
        part[warp][g + 8][8 * i + 2 * t] = acc[i][2], part[warp][g + 8][8 * i + 2 * t + 1] = acc[i][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * 8 * kTiles; i += blockDim.x) {
        const int r = i / (8 * kTiles), c = i % (8 * kTiles), row = row0 + r, token = tok0 + c;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kMmaWarps; w++) sum += part[w][r][c];
        if (row < a.N && token < a.M) {
            float *dst = a.y + (size_t)token * a.N + row;
            *dst = a.accumulate ? *dst + sum : sum;
        }
    }
}

// Grid: as many row blocks as stay resident (grid.y), each walking row blocks blockIdx.y,
// blockIdx.y + gridDim.y, ...: measured against one block per row block, 20.1 against 20.8 us on
// 11008 x 4096 at M <= 16, equal on the other shapes (bench/NOTES.md 13).
template <int kTiles, int kUnroll>
__global__ void __launch_bounds__(kMmaWarps * 32) q8_mma_kernel(const Q8MmaArgs a) {
    __shared__ float part[kMmaWarps][16][8 * kTiles];   // each warp's partial sums: rows x tokens
    pdl_wait_then_release();
    for (int rblk = blockIdx.y; rblk * 16 < a.N; rblk += gridDim.y) {
        __syncthreads();   // part is still being read for the previous row block
        q8_mma_rows<kTiles, kUnroll>(a, part, rblk * 16);
    }
}

// ----------------------------------------------------------------------------
// Fused dequant-GEMM on Hopper's warpgroup MMA (wgmma, sm_90a), for prefill-sized M:
// y (M, N) = x (M, K) W^T, W int8 dequantized in registers and fed as wgmma's A operand.
//
//   block: 128 rows of W x 128 tokens, two warpgroups of 64 rows; warp j of a warpgroup holds
//   16 rows, lane (g, t) rows g and g + 8 and their bytes [16t, 16t + 16) of each 64-wide step.
//   A ring of kWgStages stages in shared memory, kWgAhead steps loaded ahead, each stage holding
//   - the x tile (128 tokens x 64 k, FP16, 16 KB) that wgmma reads as B. xt, made by
//     x_to_tiles_kernel, holds x already in this layout, tile after tile: 128-byte swizzle (token
//     n's 16-byte chunk c at chunk c ^ (n % 8)), k permuted within each step the way the A
//     fragments take the weight bytes. So one bulk copy (the copy engine, completion counted on
//     an mbarrier) moves a tile, and no proxy fence is needed between the copy and the MMA;
//   - the W tile (128 rows x 64 bytes) and the rows' scales of the step's group, by cp.async;
//     each lane reads its 2 x 16 bytes from there with plain shared loads.
//   Scales: the group scale multiplies the weights in FP16 before the MMA (the accumulators stay
//   across groups); to keep them in FP16's normal range each row's scales are first multiplied by
//   a power of two putting the row's largest at [256, 512) (|q s'| <= 127 * 512 < 65504), and the
//   row's sums divided by it at the end, exactly.
//   Error: x, s' and q s' each rounded to FP16 (2^-11 relative): |y - exact| <= about
//   1.5e-3 * sum_k |w x|, plus FP32 accumulation.
constexpr int kWgRows = 128, kWgTokens = 128, kWgStages = 5, kWgAhead = kWgStages - 1;
constexpr int kWgXBytes = kWgTokens * kMmaStep * 2, kWgWBytes = kWgRows * kMmaStep, kWgSBytes = kWgRows * 4;
constexpr int kWgStageBytes = (kWgXBytes + kWgWBytes + kWgSBytes + 1023) / 1024 * 1024;
constexpr int kWgSmem = kWgStages * kWgStageBytes + 1024 + kWgStages * 8;   // + alignment slack, mbarriers

struct Q8WgArgs {
    const int8_t *q;    // (N, stride)
    const float *s;     // (N, groups)
    const __half *xt;   // x tiles: (token blocks, steps, kWgXBytes), see above
    float *y;           // (M, N)
    int M, N, steps, stride, groups, gs, accumulate;
};

// The k order inside one 64-wide step: position 16 s + j holds k = perm(16 s + j), where lane t's
// A registers of MMA k-step s take its weight bytes 16t + 4s + {0, 1} (slots 2t, 2t + 1) and
// 16t + 4s + {2, 3} (slots 2t + 8, 2t + 9).
__host__ __device__ __forceinline__ int mma_k_perm(int pos) {
    const int s = pos / 16, j = pos % 16;
    return 16 * ((j & 7) >> 1) + 4 * s + ((j >> 3) << 1) + (j & 1);
}

// xt = x (M, K) as FP16 tiles for q8_wgmma_kernel: tile (token block b, step) at
// (b * steps + step) * 128 * 64 halves; in it token n, position p (chunk p / 8) at
// n * 64 + ((p / 8) ^ (n % 8)) * 8 + p % 8, holding x[128 b + n][64 step + perm(p)]; zero past
// M and K. One thread per output half.
__global__ void x_to_tiles_kernel(__half *__restrict__ xt, const float *__restrict__ x, int M, int K, int steps,
                                  size_t total) {
    pdl_wait_then_release();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int within = (int)(i % (kWgTokens * kMmaStep)), tile = (int)(i / (kWgTokens * kMmaStep));
    const int b = tile / steps, step = tile % steps, n = within / kMmaStep, slot = within % kMmaStep;
    const int p = ((slot / 8) ^ (n & 7)) * 8 + slot % 8;   // the swizzle is its own inverse
    const int token = b * kWgTokens + n, k = step * kMmaStep + mma_k_perm(p);
    xt[i] = __float2half_rn(token < M && k < K ? x[(size_t)token * K + k] : 0.0f);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_SM90A 1
#else
#define WG_SM90A 0
#endif

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory"); }

// mbarrier and bulk copy (the copy engine; its writes are in the async proxy that wgmma reads).
__device__ __forceinline__ void mbar_init(uint32_t bar) {
#if WG_SM90A
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
#endif
}
__device__ __forceinline__ void mbar_init_fence() {
#if WG_SM90A
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
// The barrier's one arrival for this phase, which then completes once `bytes` more have landed.
__device__ __forceinline__ void mbar_arrive_expect(uint32_t bar, int bytes) {
#if WG_SM90A
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
// A copy of `bytes` (a multiple of 16, both ends 16-aligned) counted against bar's expected bytes.
__device__ __forceinline__ void bulk_copy_counted(uint32_t dst, const void *src, int bytes, uint32_t bar) {
#if WG_SM90A
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
#endif
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, int bytes, uint32_t bar) {
    mbar_arrive_expect(bar, bytes);
    bulk_copy_counted(dst, src, bytes, bar);
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
#if WG_SM90A
    asm volatile(
        "{\n .reg .pred done;\n wait:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra wait;\n}" ::"r"(bar), "r"(parity) : "memory");
#endif
}

// Step `step`'s operands into the stage at `stage` (1024-aligned), by all 256 threads: the x tile
// by one bulk copy (thread 0), W rows (past N: the last repeated, never written; bytes past the
// stride: zero) and scales by cp.async.
__device__ __forceinline__ void wg_load_stage(uint32_t stage, uint32_t bar, const Q8WgArgs &a, int row0, int step) {
    if (threadIdx.x == 0)
        bulk_copy(stage, a.xt + ((size_t)blockIdx.x * a.steps + step) * (kWgXBytes / 2), kWgXBytes, bar);
    const uint32_t wtile = stage + kWgXBytes;
#pragma unroll
    for (int i = 0; i < kWgRows * 4 / 256; i++) {
        const int chunk = threadIdx.x + 256 * i, r = chunk / 4, c = chunk % 4;
        const int k = step * kMmaStep + 16 * c;
        const int8_t *src = a.q + (size_t)min(row0 + r, a.N - 1) * a.stride + (k < a.stride ? k : 0);
        cp_async_16(wtile + r * kMmaStep + 16 * c, src, k < a.stride ? 16 : 0);
    }
    if (threadIdx.x < kWgRows) {
        const int r = threadIdx.x, group = min(step * kMmaStep / a.gs, a.groups - 1);
        cp_async_4(wtile + kWgWBytes + 4 * r, a.s + (size_t)min(row0 + r, a.N - 1) * a.groups + group);
    }
}

// wgmma shared-memory descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

// d (64 x 128 per warpgroup, FP32) += A (64 x 16, FP16 registers) B (16 x 128, shared memory).
__device__ __forceinline__ void wgmma_64x128x16(float d[64], const uint32_t a[4], uint64_t desc) {
#if WG_SM90A
#define WG_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, 1, 1, 1, 0;"
        : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#undef WG_D8
#endif
}
__device__ __forceinline__ void wgmma_fence() {
#if WG_SM90A
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if WG_SM90A
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
// Waits for this warpgroup's MMAs. All of them: the A fragments live in registers the compiler
// may reuse once the asm statement that named them is past (a version that let one step's MMAs
// run into the next step computed wrong sums on the H200).
__device__ __forceinline__ void wgmma_wait_all() {
#if WG_SM90A
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#endif
}

// The power of two that puts a row's largest scale at [256, 512): max over its groups, the four
// lanes of a row each taking every fourth group.
__device__ __forceinline__ float wg_row_factor(const float *srow, int groups, int t) {
    float m = 0.0f;
    for (int i = t; i < groups; i += 4) m = fmaxf(m, fabsf(__ldg(srow + i)));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    if (!(m > 0.0f) || isinf(m)) return 1.0f;
    int e;
    frexpf(m, &e);   // m in [2^(e-1), 2^e)
    return ldexpf(1.0f, max(-120, min(120, 9 - e)));
}

// Two int8 of word (bytes lo, lo + 1) times an FP16 scale pair.
__device__ __forceinline__ uint32_t int8x2_scaled(uint32_t word, int hi, __half2 scale) {
    const uint32_t h = int8x2_to_half2(word, hi);
    const __half2 v = __hmul2(*reinterpret_cast<const __half2 *>(&h), scale);
    return *reinterpret_cast<const uint32_t *>(&v);
}

// One step for one warpgroup: the A fragments from the stage's W tile (block rows lra, lra + 8),
// scaled, then four wgmma k-steps on the stage's x tile.
__device__ __forceinline__ void wg_step(float (&acc)[64], uint32_t stage, int lra, int t, float fa, float fb) {
    const unsigned char *smem = (const unsigned char *)__cvta_shared_to_generic(stage);
    const int4 wa = *reinterpret_cast<const int4 *>(smem + kWgXBytes + lra * kMmaStep + 16 * t);
    const int4 wb = *reinterpret_cast<const int4 *>(smem + kWgXBytes + (lra + 8) * kMmaStep + 16 * t);
    const float *sc = reinterpret_cast<const float *>(smem + kWgXBytes + kWgWBytes);
    const __half2 sa2 = __float2half2_rn(sc[lra] * fa), sb2 = __float2half2_rn(sc[lra + 8] * fb);
    const uint32_t wa_w[4] = {(uint32_t)wa.x, (uint32_t)wa.y, (uint32_t)wa.z, (uint32_t)wa.w};
    const uint32_t wb_w[4] = {(uint32_t)wb.x, (uint32_t)wb.y, (uint32_t)wb.z, (uint32_t)wb.w};
    uint32_t frag[16];
#pragma unroll
    for (int s4 = 0; s4 < 4; s4++) {
        frag[4 * s4 + 0] = int8x2_scaled(wa_w[s4], 0, sa2), frag[4 * s4 + 1] = int8x2_scaled(wb_w[s4], 0, sb2);
        frag[4 * s4 + 2] = int8x2_scaled(wa_w[s4], 1, sa2), frag[4 * s4 + 3] = int8x2_scaled(wb_w[s4], 1, sb2);
    }
    wgmma_fence();
#pragma unroll
    for (int s4 = 0; s4 < 4; s4++) wgmma_64x128x16(acc, &frag[4 * s4], wg_desc(stage + 32 * s4));
    wgmma_commit();
    wgmma_wait_all();
}

__global__ void __launch_bounds__(256, 1) q8_wgmma_kernel(const Q8WgArgs a) {
    extern __shared__ unsigned char wg_smem[];
    const uint32_t ring = ((uint32_t)__cvta_generic_to_shared(wg_smem) + 1023) & ~1023u;
    const uint32_t bars = ring + kWgStages * kWgStageBytes;   // one mbarrier per stage (its x tile)
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int tok0 = blockIdx.x * kWgTokens, row_blk = blockIdx.y * kWgRows;
    const int lra = threadIdx.x / 32 * 16 + g, row0 = row_blk + lra;   // this lane's rows: row0, row0 + 8
    if (threadIdx.x < kWgStages) mbar_init(bars + 8 * threadIdx.x);
    mbar_init_fence();
    __syncthreads();
    pdl_wait_then_release();
    // kWgAhead stages in flight; the stage a step refills was read by the step before, whose MMAs
    // both warpgroups waited for before this step's barrier
#pragma unroll
    for (int st = 0; st < kWgAhead; st++) {
        if (st < a.steps) wg_load_stage(ring + st * kWgStageBytes, bars + 8 * st, a, row_blk, st);
        cp_async_commit();
    }
    const float fa = wg_row_factor(a.s + (size_t)min(row0, a.N - 1) * a.groups, a.groups, t);
    const float fb = wg_row_factor(a.s + (size_t)min(row0 + 8, a.N - 1) * a.groups, a.groups, t);
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;
    for (int step = 0; step < a.steps; step++) {
        const int slot = step % kWgStages;
        cp_async_wait<kWgAhead - 1>();   // this step's W and scales have landed (one group per step)
        mbar_wait(bars + 8 * slot, (step / kWgStages) & 1);   // and its x tile
        __syncthreads();
        if (step + kWgAhead < a.steps) {
            const int next = (step + kWgAhead) % kWgStages;
            wg_load_stage(ring + next * kWgStageBytes, bars + 8 * next, a, row_blk, step + kWgAhead);
        }
        cp_async_commit();
        wg_step(acc, ring + slot * kWgStageBytes, lra, t, fa, fb);
    }
    cp_async_wait<0>();
    // D fragment of warp j: acc[4i + {0, 1}] = (row g, tokens 8i + 2t + {0, 1}), acc[4i + {2, 3}] = row g + 8
    const float inv_a = 1.0f / fa, inv_b = 1.0f / fb;
#pragma unroll
    for (int i = 0; i < 64; i++) {
        const int row = row0 + (i & 2 ? 8 : 0), token = tok0 + 8 * (i / 4) + 2 * t + (i & 1);
        if (row < a.N && token < a.M) {
            const float v = acc[i] * (i & 2 ? inv_b : inv_a);
            float *dst = a.y + (size_t)token * a.N + row;
            *dst = a.accumulate ? *dst + v : v;
        }
    }
}

// ----------------------------------------------------------------------------
// Fused dequant-GEMV at M = 1 fed by the copy engine (sm_90a): y (N) = W x, W int8 (N, stride).
//
//   grid.x: blocks of a.tma_rows rows of each output in turn (pair mode: those rows of w1 and of
//   w3, interleaved as the block's "physical" rows w1 r, w3 r, w1 r + 1, ...). 256 threads.
//   A block walks its physical rows in tiles of kTmaRows rows x kTmaCols bytes: one bulk copy per
//   row lands each tile in a ring of a.tma_stages tiles in shared memory, completing on the
//   stage's mbarrier, so that ring's bytes (64 KB at 4 stages) are in flight per block without a
//   register each, which the register-fed kernel above cannot reach (its bytes in flight are
//   its registers: about 32 KB an SM, so a 4096-row layer takes several DRAM round trips a warp).
//   The first tiles are asked for before griddepcontrol.wait: weights never depend on the kernel
//   before.
//   Thread i takes chunk i (16 bytes) of every row of a tile, so its 16 x values (from shared
//   memory, staged once per block: x4[sub * chunks + c] holds x[16c + 4sub .. + 4], so that a
//   warp's loads of one sub are consecutive) serve all kTmaRows rows. Its group scales are loaded
//   a tile ahead (each block's scale rows asked of L2 at the start). A warp sum per row when a row
//   tile is done, the 8 warps' sums added in the epilogue, which writes through store_rows.
constexpr int kTmaRows = 4, kTmaCols = 4096, kTmaTile = kTmaRows * kTmaCols;   // 256 chunks a row
constexpr int kTmaThreads = 256, kTmaWarps = kTmaThreads / 32;
// Ring stages and blocks per SM, from a sweep on the H200 (bench/NOTES.md entry 21): 2 stages (32 KB
// in flight a block) x 4 blocks an SM decoded the 7B fastest (284.9 tok/s; 4 x 2: 269.1, 2 x 2: 204.9).
constexpr int kTmaStages = 2, kTmaBlocksPerSm = 4;
static_assert(kTmaCols / 16 == kTmaThreads, "one chunk of each tile row per thread");

// Shared memory of one block, in bytes: the ring, x, the stage barriers, the warps' row sums.
__host__ __device__ inline size_t tma_smem_bytes(int stages, int stride, int phys_rows) {
    return (size_t)stages * kTmaTile + (size_t)stride / 16 * 64 + 8 * stages + 4 * kTmaWarps * phys_rows;
}

struct TmaBlock {            // what one block reads: rows lrow0 .. lrow0 + lrows - 1 of output j
    int j, lrow0, lrows, prows, col_tiles, tiles;
};

__device__ __forceinline__ const int8_t *tma_qrow(const Q8Args &a, const Q8Out &o, bool pair, int lrow0, int p) {
    return pair ? a.out[p & 1].q + (size_t)(lrow0 + p / 2) * a.stride : o.q + (size_t)(lrow0 + p) * a.stride;
}
__device__ __forceinline__ const float *tma_srow(const Q8Args &a, const Q8Out &o, bool pair, int lrow0, int p) {
    return pair ? a.out[p & 1].s + (size_t)(lrow0 + p / 2) * a.groups : o.s + (size_t)(lrow0 + p) * a.groups;
}

// Tile `tile` (row tile tile / col_tiles, column tile tile % col_tiles) into `stage`, by one thread.
__device__ __forceinline__ void tma_issue(const Q8Args &a, const Q8Out &o, bool pair, const TmaBlock &b, uint32_t stage,
                                          uint32_t bar, int tile) {
    const int p0 = tile / b.col_tiles * kTmaRows, c0 = tile % b.col_tiles * kTmaCols;
    const int rows = min(kTmaRows, b.prows - p0), len = min(kTmaCols, a.stride - c0);
    mbar_arrive_expect(bar, rows * len);
    for (int t = 0; t < rows; t++) bulk_copy_counted(stage + t * kTmaCols, tma_qrow(a, o, pair, b.lrow0, p0 + t) + c0, len, bar);
}

// This thread's group scales for tile `tile` (0 for rows past the block's and chunks past the row).
__device__ __forceinline__ void tma_scales(float sc[kTmaRows], const Q8Args &a, const Q8Out &o, bool pair, const TmaBlock &b,
                                           int tile) {
    const int p0 = tile / b.col_tiles * kTmaRows, c = tile % b.col_tiles * kTmaThreads + threadIdx.x;
#pragma unroll
    for (int t = 0; t < kTmaRows; t++)
        sc[t] = p0 + t < b.prows && c < a.stride / 16 ? __ldg(tma_srow(a, o, pair, b.lrow0, p0 + t) + (c >> a.group_shift)) : 0.0f;
}

// x (K floats, zero to the stride) into x4, times the norm weights when folded; returns this
// block's 1 / rms (1 without a norm). Needs the previous kernel's output: after pdl_wait.
template <bool kNorm>
__device__ float tma_stage_x(float4 *x4, float *red, const Q8Args &a) {
    const int chunks = a.stride / 16;
    const bool vec_x = a.K % 4 == 0, vec_norm = kNorm && vec_x && (reinterpret_cast<uintptr_t>(a.norm_w) & 15) == 0;
    float sumsq = 0.0f;
    for (int c = threadIdx.x; c < chunks; c += kTmaThreads) {
        float xv[16];
        load_x16(xv, a.x, 16 * c, a.K, vec_x);
        if (kNorm) norm_x16(xv, sumsq, a.norm_w, 16 * c, a.K, vec_norm);
#pragma unroll
        for (int sub = 0; sub < 4; sub++)
            x4[sub * chunks + c] = make_float4(xv[4 * sub], xv[4 * sub + 1], xv[4 * sub + 2], xv[4 * sub + 3]);
    }
    return kNorm ? inv_rms_of(block_reduce<false>(sumsq, red), a.K) : 1.0f;
}

// One tile's chunks: acc[t] += scale * (row t's chunk . x's chunk), for this thread's chunk c.
__device__ __forceinline__ void tma_tile_math(float acc[kTmaRows], const unsigned char *stage, const float4 *x4, int chunks,
                                              int c, const float sc[kTmaRows], int rows) {
    if (c >= chunks) return;
    float xv[16];
#pragma unroll
    for (int sub = 0; sub < 4; sub++) {
        const float4 v = x4[sub * chunks + c];
        xv[4 * sub] = v.x, xv[4 * sub + 1] = v.y, xv[4 * sub + 2] = v.z, xv[4 * sub + 3] = v.w;
    }
#pragma unroll
    for (int t = 0; t < kTmaRows; t++) {
        if (t >= rows) break;
        const int4 w = *reinterpret_cast<const int4 *>(stage + t * kTmaCols + 16 * threadIdx.x);
        acc[t] = fmaf(sc[t], dot16(w, xv), acc[t]);
    }
}

template <bool kPair, bool kNorm>
__global__ void __launch_bounds__(kTmaThreads) q8_gemv_tma_kernel(const Q8Args a) {
    extern __shared__ __align__(128) unsigned char tma_smem[];
    __shared__ float red[32];
    TmaBlock b;
    b.j = output_of_block(a, kPair);
    const Q8Out o = b.j == 0 ? a.out[0] : b.j == 1 ? a.out[1] : a.out[2];
    b.lrow0 = (blockIdx.x - o.first_block) * a.tma_rows;
    b.lrows = min(a.tma_rows, o.N - b.lrow0);
    b.prows = kPair ? 2 * b.lrows : b.lrows;
    b.col_tiles = (a.stride + kTmaCols - 1) / kTmaCols;
    b.tiles = (b.prows + kTmaRows - 1) / kTmaRows * b.col_tiles;
    const int S = a.tma_stages, chunks = a.stride / 16, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t ring = (uint32_t)__cvta_generic_to_shared(tma_smem), bars = ring + S * kTmaTile + chunks * 64;
    float4 *x4 = reinterpret_cast<float4 *>(tma_smem + S * kTmaTile);
    float *sums = reinterpret_cast<float *>(tma_smem + S * kTmaTile + chunks * 64 + 8 * S);   // (warps, prows)
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) mbar_init(bars + 8 * s);
        mbar_init_fence();
        for (int i = 0; i < min(S, b.tiles); i++) tma_issue(a, o, kPair, b, ring + i * kTmaTile, bars + 8 * i, i);
    }
    for (int p = warp; p < b.prows; p += kTmaWarps)   // the block's scale rows towards L2
        for (int g = 32 * lane; g < a.groups; g += 32 * 32) prefetch_l2(tma_srow(a, o, kPair, b.lrow0, p) + g);
    pdl_wait();
    pdl_release();
    const float inv_rms = tma_stage_x<kNorm>(x4, red, a);
    __syncthreads();   // x4 and the barriers' initialisation visible to all
    float acc[kTmaRows] = {}, sc[kTmaRows], sc_next[kTmaRows];
    tma_scales(sc_next, a, o, kPair, b, 0);
    for (int i = 0; i < b.tiles; i++) {
        const int slot = i % S, rt = i / b.col_tiles, ct = i % b.col_tiles;
#pragma unroll
        for (int t = 0; t < kTmaRows; t++) sc[t] = sc_next[t];
        if (i + 1 < b.tiles) tma_scales(sc_next, a, o, kPair, b, i + 1);
        mbar_wait(bars + 8 * slot, (i / S) & 1);
        tma_tile_math(acc, tma_smem + slot * kTmaTile, x4, chunks, ct * kTmaThreads + threadIdx.x, sc,
                      min(kTmaRows, b.prows - rt * kTmaRows));
        if (ct == b.col_tiles - 1) {   // row tile done: this warp's sums of its rows
#pragma unroll
            for (int t = 0; t < kTmaRows; t++) {
                const float v = warp_sum(acc[t]);
                if (lane == 0 && rt * kTmaRows + t < b.prows) sums[warp * b.prows + rt * kTmaRows + t] = v;
                acc[t] = 0.0f;
            }
        }
        __syncthreads();   // every thread is done with the stage (and, last time, sums is complete)
        if (threadIdx.x == 0 && i + S < b.tiles) tma_issue(a, o, kPair, b, ring + slot * kTmaTile, bars + 8 * slot, i + S);
    }
    // Epilogue: thread i finishes rows 2i and 2i + 1 of the block (whole RoPE pairs).
    for (int l = 2 * threadIdx.x; l < b.lrows; l += 2 * kTmaThreads) {
        float v[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float s0 = 0.0f, s1 = 0.0f;
            const int p = kPair ? 2 * (l + r) : l + r;
            if (l + r < b.lrows)
                for (int w = 0; w < kTmaWarps; w++) s0 += sums[w * b.prows + p], s1 += kPair ? sums[w * b.prows + p + 1] : 0.0f;
            v[r] = finish_output(s0, s1, inv_rms, kPair);
        }
        store_rows<2>(a, b.j, o, b.lrow0 + l, 0, v);
    }
}

// dst (N, K) FP32, dense = W. One thread per 4 consecutive weights: a warp reads 128 contiguous
// bytes and writes 512, so both directions stay coalesced.
__global__ void dequant_kernel(float *__restrict__ dst, int N, int K, int stride, int groups, int gs,
                               const int8_t *__restrict__ q, const float *__restrict__ s) {
    pdl_wait_then_release();
    const int words = stride / 4;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * words) return;
    const int row = (int)(i / words), k0 = (int)(i % words) * 4;
    if (k0 >= K) return;
    float f[4];
    int8x4_to_float(__ldg(reinterpret_cast<const uint32_t *>(q + (size_t)row * stride) + k0 / 4), f);
    const float *srow = s + (size_t)row * groups;
    float *out = dst + (size_t)row * K + k0;
    if (K % 4 == 0 && gs % 4 == 0) {   // one group, one aligned 16-byte store
        const float sc = srow[k0 / gs];
        *reinterpret_cast<float4 *>(out) = make_float4(f[0] * sc, f[1] * sc, f[2] * sc, f[3] * sc);
        return;
    }
    for (int e = 0; e < 4 && k0 + e < K; e++) out[e] = f[e] * srow[(k0 + e) / gs];
}

// x (M, dim) = embedding rows of tokens; INT8 rows are dequantized, FP32 rows copied.
// tokens: the step's inputs (position first, then the ids).
__global__ void embed_kernel(float *__restrict__ x, const int *__restrict__ inputs, int dim, int stride, int groups,
                             int gs, const int8_t *__restrict__ q, const float *__restrict__ s, const float *__restrict__ f) {
    pdl_wait_then_release();
    const size_t row = (size_t)inputs[1 + blockIdx.x];
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        x[(size_t)blockIdx.x * dim + j] = f ? f[row * stride + j] : q[row * stride + j] * s[row * groups + j / gs];
}

// out = w * in / rms(in), one block per row of n.
__global__ void rmsnorm_kernel(float *__restrict__ out, const float *__restrict__ in, const float *__restrict__ w, int n) {
    __shared__ float red[32];
    pdl_wait_then_release();
    const float *x = in + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) ss += x[j] * x[j];
    ss = block_reduce<false>(ss, red);
    const float scale = inv_rms_of(ss, n);
    for (int j = threadIdx.x; j < n; j += blockDim.x) out[(size_t)blockIdx.x * n + j] = w[j] * (scale * x[j]);
}

// KV cache elements: FP16 (default) or FP32; loads return floats.
__device__ __forceinline__ void kv_store(float *p, float v) { *p = v; }
__device__ __forceinline__ void kv_store(__half *p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ float2 kv_load2(const float *p) { return __ldg(reinterpret_cast<const float2 *>(p)); }
__device__ __forceinline__ float2 kv_load2(const __half *p) {
    return __half22float2(__ldg(reinterpret_cast<const __half2 *>(p)));
}
// q . k over 16 bytes of k: 4 FP32 or 8 FP16 elements (16-byte aligned).
__device__ __forceinline__ float dot_16_bytes(const float *qs, const float *k) {
    const float4 v = __ldg(reinterpret_cast<const float4 *>(k));
    return qs[0] * v.x + qs[1] * v.y + qs[2] * v.z + qs[3] * v.w;
}
__device__ __forceinline__ float dot_16_bytes(const float *qs, const __half *k) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4 *>(k));
    const __half2 *h = reinterpret_cast<const __half2 *>(&raw);
    float sc = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float2 v = __half22float2(h[j]);
        sc += qs[2 * j] * v.x + qs[2 * j + 1] * v.y;
    }
    return sc;
}

// q . k over head_size (even) elements: 16-byte loads where head_size fills them (k is then
// 16-byte aligned), else pairs.
template <typename KV>
__device__ __forceinline__ float qk_dot(const float *qs, const KV *k, int hs) {
    constexpr int kPer16 = 16 / sizeof(KV);
    float sc = 0.0f;
    if (hs % kPer16 == 0) {
#pragma unroll 4
        for (int i = 0; i < hs; i += kPer16) sc += dot_16_bytes(qs + i, k + i);
        return sc;
    }
    for (int i = 0; i < hs; i += 2) {
        const float2 v = kv_load2(k + i);
        sc += qs[i] * v.x + qs[i + 1] * v.y;
    }
    return sc;
}

// RoPE on q (M, dim) and k (M, kv_dim), token m at position pos + m, one thread per pair; then
// the pair of k and of v goes into cache row pos + m. pos: inputs[0].
__device__ __forceinline__ void rotate_pair(float *v, int i, float cs, float sn) {
    const float v0 = v[i], v1 = v[i + 1];
    v[i] = v0 * cs - v1 * sn;
    v[i + 1] = v0 * sn + v1 * cs;
}

// seq_stride: 0, token m at pos + m of one cache; else token m is sequence m's, at pos, in a cache
// seq_stride elements after sequence m - 1's.
template <typename KV>
__global__ void rope_store_kernel(float *q, float *k, const float *__restrict__ v, KV *kc, KV *vc,
                                  const int *__restrict__ inputs, int dim, int kv_dim, int head_size, size_t seq_stride) {
    pdl_wait_then_release();
    const int i = 2 * (blockIdx.x * blockDim.x + threadIdx.x), m = blockIdx.y, pos = inputs[0] + (seq_stride ? 0 : m);
    kc += m * seq_stride, vc += m * seq_stride;
    if (i >= dim) return;
    const float freq = 1.0f / powf(10000.0f, (i % head_size) / (float)head_size);
    float sn, cs;
    sincosf(pos * freq, &sn, &cs);
    rotate_pair(q + (size_t)m * dim, i, cs, sn);
    if (i >= kv_dim) return;
    float *km = k + (size_t)m * kv_dim;
    rotate_pair(km, i, cs, sn);
    const size_t at = (size_t)pos * kv_dim + i;
    kv_store(kc + at, km[i]), kv_store(kc + at + 1, km[i + 1]);
    kv_store(vc + at, v[(size_t)m * kv_dim + i]), kv_store(vc + at + 1, v[(size_t)m * kv_dim + i + 1]);
}

// kElems consecutive cache elements as loaded: 16 bytes (kElems = 16 / sizeof(KV), 16-byte
// aligned) or a pair (kElems = 2), kept as raw words until used (FP16 converted at the FMA, so
// that a batch of rows in flight costs 4 registers a row, not 8).
template <typename KV, int kElems>
struct KvUnit {
    static constexpr int kWords = kElems * (int)sizeof(KV) / 4;
    static_assert(kWords == 1 || kWords == 2 || kWords == 4, "a unit is 4, 8 or 16 bytes");
    uint32_t w[kWords];
};
template <typename KV, int kElems>
__device__ __forceinline__ void kv_unit_load(KvUnit<KV, kElems> &u, const KV *p) {
    if constexpr (KvUnit<KV, kElems>::kWords == 4) {
        const uint4 r = __ldg(reinterpret_cast<const uint4 *>(p));
        u.w[0] = r.x, u.w[1] = r.y, u.w[2] = r.z, u.w[3] = r.w;
    } else if constexpr (KvUnit<KV, kElems>::kWords == 2) {
        const uint2 r = __ldg(reinterpret_cast<const uint2 *>(p));
        u.w[0] = r.x, u.w[1] = r.y;
    } else {
        u.w[0] = __ldg(reinterpret_cast<const unsigned int *>(p));
    }
}
// acc += a * unit, element by element.
template <typename KV, int kElems>
__device__ __forceinline__ void kv_unit_fma(float acc[kElems], float a, const KvUnit<KV, kElems> &u) {
    if constexpr (sizeof(KV) == 4) {
#pragma unroll
        for (int e = 0; e < kElems; e++) acc[e] = fmaf(a, __uint_as_float(u.w[e]), acc[e]);
    } else {
#pragma unroll
        for (int j = 0; j < kElems / 2; j++) {
            const float2 v = __half22float2(*reinterpret_cast<const __half2 *>(&u.w[j]));
            acc[2 * j] = fmaf(a, v.x, acc[2 * j]), acc[2 * j + 1] = fmaf(a, v.y, acc[2 * j + 1]);
        }
    }
}

// The attention's weighted sum of value rows t0..t1-1 (weights att[t - t0]) for one head, v its
// row 0, split over the block so that many loads are in flight: a row's hs elements are units of
// kElems, one thread per unit, and the block's threads form groups of hs / kElems threads, group g
// taking rows t0 + g, t0 + g + groups, ... with kAttnBatch rows' loads issued before their FMAs.
// Each group's sums go to vacc (groups, hs); the caller adds the groups after a barrier.
// (A warp per row, a pair per lane, 4 rows in flight, took one round trip to memory for every
// 32 rows a warp had: 8 for 256 rows, the largest part of the kernel's time at 7B and 15M shapes.
// In the SASS for sm_90a the pair path issues all 8 loads first; the 16-byte path 2 or 3 before
// the first conversion, then the rest: ptxas's choice, at 48 registers.)
constexpr int kAttnBatch = 8;
template <typename KV, int kElems>
__device__ __forceinline__ int weighted_values(float *vacc, const float *att, const KV *v, int kv_dim, int t0, int t1,
                                               int hs) {
    const int units = hs / kElems, groups = blockDim.x / units, g = threadIdx.x / units, u = threadIdx.x % units;
    if (g >= groups) return groups;
    float acc[kElems];
#pragma unroll
    for (int e = 0; e < kElems; e++) acc[e] = 0.0f;
    for (int t = t0 + g; t < t1; t += kAttnBatch * groups) {
        KvUnit<KV, kElems> val[kAttnBatch];
        float a[kAttnBatch];
#pragma unroll
        for (int b = 0; b < kAttnBatch; b++) {   // loads first, without branches: rows past t1 (never
            const int row = t + b * groups;      // written) read row t1 - 1 again, with weight 0
            a[b] = row < t1 ? att[row - t0] : 0.0f;
            kv_unit_load(val[b], v + (size_t)min(row, t1 - 1) * kv_dim + u * kElems);
        }
#pragma unroll
        for (int b = 0; b < kAttnBatch; b++) kv_unit_fma(acc, a[b], val[b]);
    }
#pragma unroll
    for (int e = 0; e < kElems; e++) vacc[g * hs + u * kElems + e] = acc[e];
    return groups;
}

// Attention of token m (at pos + m) over cache rows 0..pos+m, split along the sequence
// (flash-decoding): block (h, s, m) takes rows [s * chunk, s * chunk + chunk) of head h, so that a
// long context spreads over n_heads * splits blocks instead of n_heads. Each block: scores (a
// thread per row, 16-byte loads along its key), their max, exp and sum, then the exp-weighted sum
// of value rows (weighted_values). With one split it writes out directly; else it leaves (max,
// sum, unnormalised head vector) in part for attention_combine_kernel. Splits past the last row
// record an empty partial.
//   out (M, n_heads * hs); part (M, n_heads, splits, 2 + hs); dynamic shared memory (floats,
//   sized in gpu_attention): q (hs), the value groups' sums (kAttnValueFloats), scores (chunk).
constexpr int kAttnThreads = 256, kMaxHeadSize = 256, kAttnChunk = 256, kMaxSplits = 64, kOneSplitLen = 1024;
// Rows per split for one token (decode): the position grows one row a step, and a short one in a
// long context leaves most blocks of 256-row splits empty and the rest long chains; 64-row splits
// spread it over 4x the blocks. Measured on the H200 (7B, context 4096, bench/NOTES.md 28): decode
// 301.9 / 279.3 tok/s over 256 / 2048 positions against 298.8 / 266.5 with 256 rows; 128 rows
// 301.0 / 278.2. Prefill keeps 256: there every token's splits are blocks too (5701 against
// 9860 tok/s for a 450-token prompt with 64).
constexpr int kAttnChunkDecode = 64;
constexpr int kAttnValueFloats = kAttnThreads * 8;   // groups x hs <= threads x kElems <= threads x 8
template <typename KV>
__global__ void __launch_bounds__(kAttnThreads)
attention_kernel(float *__restrict__ out, float *__restrict__ part, const float *__restrict__ q, const KV *__restrict__ kc,
                 const KV *__restrict__ vc, const int *__restrict__ inputs, int n_heads, int n_kv_heads, int head_size,
                 int chunk, size_t seq_stride) {
    extern __shared__ float4 smem4[];
    __shared__ float red[32];
    float *qs = reinterpret_cast<float *>(smem4), *vacc = qs + head_size, *att = vacc + kAttnValueFloats;
    const int h = blockIdx.x, split = blockIdx.y, splits = gridDim.y, m = blockIdx.z;
    pdl_wait_then_release();
    kc += m * seq_stride, vc += m * seq_stride;   // a batch: token m's own sequence (rope_store_kernel)
    const int last = inputs[0] + (seq_stride ? 0 : m), t0 = split * chunk, t1 = min(last + 1, t0 + chunk), dim = n_heads * head_size;
    const int kv_dim = n_kv_heads * head_size, kv_off = (h / (n_heads / n_kv_heads)) * head_size;
    float *my_part = part + (((size_t)m * n_heads + h) * splits + split) * (2 + head_size);
    if (t0 >= t1) {   // past the last row: an empty partial (weight 0 in the combine)
        for (int i = threadIdx.x; i < 2 + head_size; i += blockDim.x) my_part[i] = i == 0 ? -INFINITY : 0.0f;
        return;
    }
    for (int i = threadIdx.x; i < head_size; i += blockDim.x) qs[i] = q[(size_t)m * dim + h * head_size + i];
    __syncthreads();
    const float inv_sqrt = 1.0f / sqrtf((float)head_size);
    float mx = -INFINITY;
    for (int t = t0 + threadIdx.x; t < t1; t += blockDim.x) {
        const float sc = qk_dot(qs, kc + (size_t)t * kv_dim + kv_off, head_size) * inv_sqrt;
        att[t - t0] = sc;
        mx = fmaxf(mx, sc);
    }
    mx = block_reduce<true>(mx, red);
    float sum = 0.0f;
    for (int t = t0 + threadIdx.x; t < t1; t += blockDim.x) {
        const float e = expf(att[t - t0] - mx);
        att[t - t0] = e;
        sum += e;
    }
    sum = block_reduce<false>(sum, red);   // its barriers also publish att
    constexpr int kPer16 = 16 / sizeof(KV);
    const int groups = head_size % kPer16 == 0 ? weighted_values<KV, kPer16>(vacc, att, vc + kv_off, kv_dim, t0, t1, head_size)
                                               : weighted_values<KV, 2>(vacc, att, vc + kv_off, kv_dim, t0, t1, head_size);
    __syncthreads();
    for (int d = threadIdx.x; d < head_size; d += blockDim.x) {
        float total = 0.0f;
        for (int g = 0; g < groups; g++) total += vacc[g * head_size + d];
        if (splits == 1) out[(size_t)m * dim + h * head_size + d] = total / sum;
        else my_part[2 + d] = total;
    }
    if (splits > 1 && threadIdx.x == 0) my_part[0] = mx, my_part[1] = sum;
}

// out[m, h] = sum_s e^(max_s - M) acc_s / sum_s e^(max_s - M) sum_s, M = max_s max_s: the splits'
// partial softmaxes rescaled to one. Block (h, m). Each split's max and sum are read once (thread
// s) and its weight e^(max_s - M) kept in shared memory; then a thread per dimension sums over the
// splits, its loads independent of each other. (Before: every thread walked the splits three
// times, each walk a chain of dependent loads: 7.0-7.5 us a layer under ncu on the 7B at 16 splits.)
constexpr int kCombineThreads = 128;
__global__ void __launch_bounds__(kCombineThreads) attention_combine_kernel(float *__restrict__ out, const float *__restrict__ part,
                                                                            int n_heads, int head_size, int splits) {
    __shared__ float weight[kMaxSplits], red[32];
    pdl_wait_then_release();
    const int h = blockIdx.x, m = blockIdx.y, stride = 2 + head_size;
    const float *p = part + ((size_t)m * n_heads + h) * splits * stride;
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < splits; s += blockDim.x) mx = fmaxf(mx, p[s * stride]);
    const float gmax = block_reduce<true>(mx, red);
    float total = 0.0f;
    for (int s = threadIdx.x; s < splits; s += blockDim.x) {
        const float w = expf(p[s * stride] - gmax);
        weight[s] = w;
        total += p[s * stride + 1] * w;
    }
    total = block_reduce<false>(total, red);   // its barriers also publish weight
    for (int d = threadIdx.x; d < head_size; d += blockDim.x) {
        float acc = 0.0f;
#pragma unroll 8
        for (int s = 0; s < splits; s++) acc += p[s * stride + 2 + d] * weight[s];
        out[(size_t)m * n_heads * head_size + h * head_size + d] = acc / total;
    }
}

__global__ void swiglu_kernel(float *h, const float *__restrict__ g, int n) {
    pdl_wait_then_release();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = h[i];
        h[i] = v * (1.0f / (1.0f + expf(-v))) * g[i];
    }
}

// (value, index) pairs: keep the larger value, of equal values the lower index (as the CPU's
// argmax_row, which keeps the first maximum). NaN is never larger; index n stands for none yet.
__device__ __forceinline__ void keep_max(float &best, int &best_i, float v, int i) {
    if (v > best || (v == best && i < best_i)) best = v, best_i = i;
}
__device__ __forceinline__ void warp_keep_max(float &best, int &best_i) {
    for (int o = 16; o > 0; o >>= 1) keep_max(best, best_i, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, best_i, o));
}

// Block r of kArgmaxThreads: the first index of the maximum of row r of v (rows of n floats), 0
// if none is larger than -inf, into result[r]. Each thread scans float4s i, i + threads, ... in
// index order (strictly larger replaces, so its first maximum stays), kArgmaxBatch of them loaded
// before any compare: 32000 logits are then one round trip to memory, where a load per compare
// took 32 (11.4 against 4.0 us under ncu on the H200). Unaligned rows and the tail past n / 4 * 4:
// plain loads. Then the warps' bests meet. feed (one row only): the result also becomes the next
// step's input, token inputs[1] at position inputs[0] + 1, so that greedy decode steps can be
// queued before the host has read the token.
constexpr int kArgmaxThreads = 1024, kArgmaxBatch = 8;
static_assert(kArgmaxThreads == 32 * 32, "argmax_kernel: its warps' bests are one warp's lanes");
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(int *result, int *inputs, int feed, const float *__restrict__ v, int n) {
    __shared__ float warp_best[32];
    __shared__ int warp_best_i[32];
    pdl_wait_then_release();
    v += (size_t)blockIdx.x * n, result += blockIdx.x;
    const int n4 = (reinterpret_cast<uintptr_t>(v) & 15) ? 0 : n / 4;
    float best = -INFINITY;
    int best_i = n;
    for (int i0 = threadIdx.x; i0 < n4; i0 += kArgmaxBatch * kArgmaxThreads) {
        float4 x[kArgmaxBatch];
#pragma unroll
        for (int b = 0; b < kArgmaxBatch; b++) {
            const int i = i0 + b * kArgmaxThreads;
            x[b] = i < n4 ? __ldg(reinterpret_cast<const float4 *>(v) + i) : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
        }
#pragma unroll
        for (int b = 0; b < kArgmaxBatch; b++) {
            const int i = 4 * (i0 + b * kArgmaxThreads);
            if (x[b].x > best) best = x[b].x, best_i = i;
            if (x[b].y > best) best = x[b].y, best_i = i + 1;
            if (x[b].z > best) best = x[b].z, best_i = i + 2;
            if (x[b].w > best) best = x[b].w, best_i = i + 3;
        }
    }
    for (int i = 4 * n4 + threadIdx.x; i < n; i += kArgmaxThreads)
        if (v[i] > best) best = v[i], best_i = i;
    warp_keep_max(best, best_i);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) warp_best[warp] = best, warp_best_i[warp] = best_i;
    __syncthreads();
    if (warp > 0) return;
    best = warp_best[lane], best_i = warp_best_i[lane];   // kArgmaxThreads / 32 == 32 warps
    warp_keep_max(best, best_i);
    if (lane == 0) {
        *result = best_i < n ? best_i : 0;
        if (feed) inputs[0] += 1, inputs[1] = *result;
    }
}

// ----------------------------------------------------------------------------
// Sampling on the device: llama2.c's procedure (run.c sample_host), one block per row, so that a
// sampled step sends one int a sequence to the host instead of a row of logits. The row's
// probabilities stay in registers, thread t holding indices [t * kPer, (t + 1) * kPer); top-p
// needs no sort: the token where the running sum in descending order (equal probabilities by
// index) first exceeds a target is found by a binary search over the probabilities' bits
// (non-negative floats order as their bits), each step a compare and add per register and a block
// sum. Sums are in a fixed tree order, so a seed gives the same tokens every run; they are closer
// to exact than the host's sequential ones, and the two differ only where the coin or top-p falls
// within rounding of a token's boundary.

constexpr int kSampleThreads = 1024, kSampleMaxPer = 32;   // rows of up to 32768 logits
constexpr float kSamplePad = -0.0f;   // past the row: adds nothing to a sum, equals no probability's bits

struct SampleArgs {
    const float *logits;   // (rows, n)
    int *result;           // (rows)
    int n;
    float temperature, topp;
    float coin[kMaxArgmaxRows];   // each row's uniform draw in [0, 1)
};

// A place in the descending order: a probability's bits, and how many tokens of that value (in
// index order) come before it.
struct ProbRank {
    uint32_t bits;
    int rank;
};

// The block's sum of the probabilities whose bits are at least t (every thread gets it). The pads'
// bits (0x80000000) pass every t, and add -0.
template <int kPer>
__device__ float sum_from(const float (&p)[kPer], uint32_t t, float *red) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; j++) s += __float_as_uint(p[j]) >= t ? p[j] : 0.0f;
    return block_reduce<false>(s, red);
}

// The bits of the largest probability v whose tokens, with every larger one, sum to more than
// target (0 where none does): the value at which the descending running sum crosses target.
// hi: bits no probability reaches.
template <int kPer>
__device__ uint32_t crossing_value(const float (&p)[kPer], float target, uint32_t hi, float *red) {
    uint32_t lo = 0;   // sum_from(hi) <= target; sum_from(lo) > target, or lo = 0
    while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (sum_from(p, mid, red) > target) lo = mid;
        else hi = mid;
    }
    return lo;
}

// The block's sum of the probabilities above value bits v, and the number equal to it.
template <int kPer>
__device__ void above_and_ties(const float (&p)[kPer], uint32_t v, float *red, float *above, int *ties) {
    float s = 0.0f, t = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; j++) {
        const uint32_t b = __float_as_uint(p[j]);
        s += b > v && b != __float_as_uint(kSamplePad) ? p[j] : 0.0f;
        t += b == v ? 1.0f : 0.0f;
    }
    *above = block_reduce<false>(s, red);
    *ties = (int)block_reduce<false>(t, red);   // exact: n < 2^24
}

// Where the descending running sum first exceeds target, and that sum (*cum, added a token at a
// time through the tied ones, as the host does). false where the whole row does not exceed it.
template <int kPer>
__device__ bool locate(const float (&p)[kPer], float target, uint32_t hi, float *red, ProbRank *at, float *cum) {
    const uint32_t v = crossing_value(p, target, hi, red);
    const float value = __uint_as_float(v);
    float above;
    int ties;
    above_and_ties(p, v, red, &above, &ties);
    if (ties == 0) return false;
    int rank = 0;
    if (ties > 64 && value > 0.0f) {   // skip most of a long run of ties (a flat row), then step
        const float skip = floorf((target - above) / value) - 2.0f;
        rank = skip < 0.0f ? 0 : skip > (float)(ties - 1) ? ties - 1 : (int)skip;
    }
    float s = above + value * (float)(rank + 1);
    while (rank < ties - 1 && !(s > target)) s += value, rank++;
    *at = ProbRank{v, rank}, *cum = s;
    return s > target;
}

// Exclusive prefix sum over the block in thread order (deterministic: warp scans, then the warps'
// totals added in order). red: 32 floats.
__device__ float block_exclusive_scan(float x, float *red) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float inclusive = x;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float up = __shfl_up_sync(0xffffffffu, inclusive, o);
        if (lane >= o) inclusive += up;
    }
    const float before_lane = __shfl_up_sync(0xffffffffu, inclusive, 1);
    __syncthreads();   // red may still be read by a previous call
    if (lane == 31) red[warp] = inclusive;
    __syncthreads();
    float before = lane == 0 ? 0.0f : before_lane;
    for (int w = 0; w < warp; w++) before += red[w];
    return before;
}

// The index of the token of probability bits at.bits that comes at.rank-th (from 0) among those
// equal to it, in index order; 0 if there is none (a row with NaN). found: shared.
template <int kPer>
__device__ int tie_index(const float (&p)[kPer], ProbRank at, float *red, int *found) {
    float mine = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; j++) mine += __float_as_uint(p[j]) == at.bits ? 1.0f : 0.0f;
    if (threadIdx.x == 0) *found = 0;
    int before = (int)block_exclusive_scan(mine, red);   // exact: counts < 2^24
#pragma unroll
    for (int j = 0; j < kPer; j++)
        if (__float_as_uint(p[j]) == at.bits && before++ == at.rank) *found = threadIdx.x * kPer + j;
    __syncthreads();
    return *found;
}

// llama2.c's sample_topp: the smallest set of most probable tokens whose sum exceeds topp, then the
// token where the running sum in that order first exceeds coin times the set's sum.
template <int kPer>
__device__ int sample_nucleus(const float (&p)[kPer], int n, float topp, float coin, uint32_t hi, float *red, int *found) {
    ProbRank last;   // the set's last token
    float cum;
    if (!locate(p, topp, hi, red, &last, &cum)) {
        // rounding: the row sums to no more than topp; the host then keeps every token of at least
        // (1 - topp) / (n - 1), the last of them the smallest, its last tie
        const float cutoff = (1.0f - topp) / (n - 1);
        float least = INFINITY;
#pragma unroll
        for (int j = 0; j < kPer; j++) least = p[j] >= cutoff ? fminf(least, p[j]) : least;
        least = -block_reduce<true>(-least, red);
        float above;
        int ties;
        above_and_ties(p, __float_as_uint(least), red, &above, &ties);
        last = ProbRank{__float_as_uint(least), ties > 0 ? ties - 1 : 0};
        cum = above + least * (float)ties;
    }
    ProbRank at;
    float unused;
    const bool inside = locate(p, coin * cum, hi, red, &at, &unused) &&
                        (at.bits > last.bits || (at.bits == last.bits && at.rank <= last.rank));
    return tie_index(p, inside ? at : last, red, found);
}

// llama2.c's sample_mult: the first token, in index order, where the running sum exceeds coin (the
// last if rounding leaves none).
template <int kPer>
__device__ int sample_in_order(const float (&p)[kPer], int n, float coin, float *red, int *found) {
    float mine = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; j++) mine += p[j];   // pads add -0
    float cdf = block_exclusive_scan(mine, red);
    if (threadIdx.x == 0) *found = INT_MAX;
    __syncthreads();
    bool crossed = false;
#pragma unroll
    for (int j = 0; j < kPer; j++) {
        cdf += p[j];
        if (!crossed && coin < cdf) crossed = true, atomicMin(found, threadIdx.x * kPer + j);
    }
    __syncthreads();
    return *found < n ? *found : n - 1;
}

// Block r: a token sampled from row r of the logits (n <= kSampleThreads * kPer) at the temperature
// (> 0), with top-p where 0 < topp < 1, else from the whole distribution.
template <int kPer>
__global__ void __launch_bounds__(kSampleThreads) sample_kernel(SampleArgs a) {
    __shared__ float red[32];
    __shared__ int found;
    pdl_wait_then_release();
    const int n = a.n, first = threadIdx.x * kPer;
    const float *logits = a.logits + (size_t)blockIdx.x * n;
    float p[kPer], most = -INFINITY;   // softmax as the host's: logits / temperature, max, exp, sum, divide
#pragma unroll
    for (int j = 0; j < kPer; j++) {
        p[j] = first + j < n ? logits[first + j] / a.temperature : -INFINITY;
        most = fmaxf(most, p[j]);
    }
    most = block_reduce<true>(most, red);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; j++) {
        p[j] = first + j < n ? expf(p[j] - most) : 0.0f;
        sum += p[j];
    }
    sum = block_reduce<false>(sum, red);
#pragma unroll
    for (int j = 0; j < kPer; j++) p[j] = first + j < n ? p[j] / sum : kSamplePad;
    // the most probable token's probability is 1 / sum (its exp is 1): nothing's bits pass it
    const uint32_t hi = __float_as_uint(1.0f / sum) + 1;
    const float coin = a.coin[blockIdx.x];
    const int token = a.topp > 0.0f && a.topp < 1.0f ? sample_nucleus(p, n, a.topp, coin, hi, red, &found)
                                                     : sample_in_order(p, n, coin, red, &found);
    if (threadIdx.x == 0) a.result[blockIdx.x] = token;
}

// dst (N, K) FP16 dense = W (INT8 dequantized, or FP32 rounded): the FP16 baseline's weights.
__global__ void to_half_kernel(__half *__restrict__ dst, int N, int K, int stride, int groups, int gs,
                               const int8_t *__restrict__ q, const float *__restrict__ s, const float *__restrict__ f) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * K) return;
    const size_t row = i / K, col = i % K;
    dst[i] = __float2half_rn(f ? f[row * stride + col] : q[row * stride + col] * s[row * groups + col / gs]);
}

__global__ void float_to_half_kernel(__half *__restrict__ dst, const float *__restrict__ src, int n) {
    pdl_wait_then_release();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __float2half_rn(src[i]);
}

int ceil_div_i(long long a, long long b) { return (int)((a + b - 1) / b); }

}  // namespace

// Launches a kernel on the context's stream, with programmatic dependent launch allowed unless
// switched off (gpu_set_pdl), and checks the launch.
template <typename... Params, typename... Args>
static void launch(GpuCtx *g, const char *name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   Args... args) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = g->pdl;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = g->stream;
    cfg.attrs = &attr, cfg.numAttrs = 1;
    cuda_check(cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...), name, __FILE__, __LINE__);
}

// ----------------------------------------------------------------------------
// Context and memory

extern "C" int gpu_probe(char *why) {
    int n = 0, driver = 0, runtime = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(why, ERR_LEN, "no usable CUDA device: %s", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        cudaGetLastError();
        return -1;
    }
    CUDA_CHECK(cudaDriverGetVersion(&driver));
    CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    if (driver < runtime) {
        snprintf(why, ERR_LEN, "the driver supports CUDA %d.%d, this build needs %d.%d", driver / 1000, driver % 1000 / 10,
                 runtime / 1000, runtime % 1000 / 10);
        return -1;
    }
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    if (p.major < 9) {
        snprintf(why, ERR_LEN, "%s has compute capability %d.%d; this build has code for 9.0 (Hopper) and newer", p.name,
                 p.major, p.minor);
        return -1;
    }
    return 0;
}

extern "C" const char *gpu_name(void) {
    static cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    return p.name;
}

extern "C" void gpu_mem_info(size_t *free_bytes, size_t *total_bytes) { CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes)); }

extern "C" GpuCtx *gpu_create(size_t scratch_floats, size_t half_floats) {
    GpuCtx *g = (GpuCtx *)calloc(1, sizeof(GpuCtx));
    if (!g) {
        fprintf(stderr, "run: out of memory\n");
        exit(1);
    }
    CUDA_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&g->blas));
    CUBLAS_CHECK(cublasSetStream(g->blas, g->stream));
    CUBLAS_CHECK(cublasSetMathMode(g->blas, CUBLAS_DEFAULT_MATH));   // true FP32, no TF32
    CUDA_CHECK(cudaMalloc(&g->blas_workspace, kBlasWorkspace));
    CUBLAS_CHECK(cublasSetWorkspace(g->blas, g->blas_workspace, kBlasWorkspace));
    g->scratch_floats = scratch_floats;
    if (scratch_floats) CUDA_CHECK(cudaMalloc(&g->scratch, scratch_floats * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&g->inputs, (1 + kMaxTokens) * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&g->argmax, kMaxArgmaxRows * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&g->argmax_host, 2 * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&g->argmax_rows_host, kMaxArgmaxRows * sizeof(int)));
    for (int i = 0; i < 2; i++) CUDA_CHECK(cudaEventCreateWithFlags(&g->argmax_fetched[i], cudaEventDisableTiming));
    CUDA_CHECK(cudaMallocHost(&g->inputs_host, (1 + kMaxTokens) * sizeof(int)));
    CUDA_CHECK(cudaEventCreateWithFlags(&g->inputs_copied, cudaEventDisableTiming));
    g->half_floats = half_floats;
    if (half_floats) CUDA_CHECK(cudaMalloc(&g->x_half, half_floats * sizeof(__half)));
    CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
    CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
    g->pdl = 1;
    g->prefetch_bytes = getenv("RUN_PREFETCH_BYTES") ? atoi(getenv("RUN_PREFETCH_BYTES")) : kPrefetchBytes;
    g->late_release = getenv("RUN_PDL_LATE") && atoi(getenv("RUN_PDL_LATE"));
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&g->sms, cudaDevAttrMultiProcessorCount, dev));
    const char *stages = getenv("RUN_GEMV_STAGES");
    g->gemv_stages = stages && atoi(stages) >= 2 && atoi(stages) <= 8 ? atoi(stages) : kTmaStages;
    const char *blocks = getenv("RUN_GEMV_BLOCKS");
    g->gemv_blocks = blocks && atoi(blocks) >= 1 && atoi(blocks) <= 8 ? atoi(blocks) : kTmaBlocksPerSm;
    gpu_set_gemv_tma(g, 1);
    return g;
}

extern "C" void gpu_destroy(GpuCtx *g) {
    if (!g) return;
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    CUDA_CHECK(cudaFree(g->scratch));
    CUDA_CHECK(cudaFree(g->inputs));
    CUDA_CHECK(cudaFree(g->blas_workspace));
    CUDA_CHECK(cudaFree(g->argmax));
    CUDA_CHECK(cudaFreeHost(g->argmax_host));
    CUDA_CHECK(cudaFreeHost(g->argmax_rows_host));
    for (int i = 0; i < 2; i++) CUDA_CHECK(cudaEventDestroy(g->argmax_fetched[i]));
    CUDA_CHECK(cudaFreeHost(g->inputs_host));
    CUDA_CHECK(cudaEventDestroy(g->inputs_copied));
    CUDA_CHECK(cudaFree(g->x_half));
    CUBLAS_CHECK(cublasDestroy(g->blas));
    CUDA_CHECK(cudaStreamDestroy(g->stream));
    free(g);
}

// Zero-filled. cudaMemset runs on the legacy stream, which the context's (non-blocking) stream
// does not wait for: without the synchronize, the first kernels on the context's stream could
// write the buffer before the zero fill lands, and lose what they wrote (the KV caches at the
// first prefill, the FP16 weights converted at load).
extern "C" void *gpu_alloc(size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    CUDA_CHECK(cudaMemset(p, 0, bytes ? bytes : 1));
    CUDA_CHECK(cudaDeviceSynchronize());
    return p;
}

extern "C" void gpu_free(void *p) { CUDA_CHECK(cudaFree(p)); }

// cudaMemcpy runs on the legacy stream, which the contexts' (non-blocking) streams are not ordered
// against, either way: the first synchronize lets every kernel queued before finish reading dst
// (without it a test's poisoned input landed before the previous call's last kernel read it); the
// second, because a copy from pageable memory may return before its last DMA lands, lets the
// kernels queued after see the data.
extern "C" void gpu_upload(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());
}

extern "C" void gpu_download(GpuCtx *g, void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g->stream));
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
}

extern "C" void *gpu_stream(GpuCtx *g) { return g->stream; }

extern "C" void gpu_set_pdl(GpuCtx *g, int on) { g->pdl = on; }

// Through pinned staging (an asynchronous copy, no driver-side bounce buffer): the staging is
// rewritten only after the previous copy from it has run.
extern "C" void gpu_set_inputs(GpuCtx *g, const int *tokens, int M, int pos) {
    if (M < 1 || M > kMaxTokens) {
        fprintf(stderr, "run: gpu_set_inputs: %d tokens in one step, 1 to %d allowed\n", M, kMaxTokens);
        exit(1);
    }
    CUDA_CHECK(cudaEventSynchronize(g->inputs_copied));
    g->inputs_host[0] = pos;
    memcpy(g->inputs_host + 1, tokens, M * sizeof(int));
    CUDA_CHECK(cudaMemcpyAsync(g->inputs, g->inputs_host, (1 + M) * sizeof(int), cudaMemcpyHostToDevice, g->stream));
    CUDA_CHECK(cudaEventRecord(g->inputs_copied, g->stream));
}

extern "C" void gpu_graph_begin(GpuCtx *g) {
    CUDA_CHECK(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal));
}

extern "C" GpuGraph *gpu_graph_end(GpuCtx *g) {
    GpuGraph *graph = (GpuGraph *)calloc(1, sizeof(GpuGraph));
    if (!graph) {
        fprintf(stderr, "run: out of memory\n");
        exit(1);
    }
    CUDA_CHECK(cudaStreamEndCapture(g->stream, &graph->graph));
    CUDA_CHECK(cudaGraphInstantiate(&graph->exec, graph->graph, 0));
    return graph;
}

extern "C" void gpu_graph_launch(GpuCtx *g, GpuGraph *graph) { CUDA_CHECK(cudaGraphLaunch(graph->exec, g->stream)); }

extern "C" void gpu_graph_free(GpuGraph *graph) {
    CUDA_CHECK(cudaGraphExecDestroy(graph->exec));
    CUDA_CHECK(cudaGraphDestroy(graph->graph));
    free(graph);
}

extern "C" void gpu_sync(GpuCtx *g) { CUDA_CHECK(cudaStreamSynchronize(g->stream)); }

extern "C" void gpu_copy(GpuCtx *g, void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g->stream));
}

// ----------------------------------------------------------------------------
// Linear layers

// Sets each output's first block; returns the blocks along x.
static int assign_blocks(Q8Args *a, int rows_per_block, int pair) {
    int blocks = 0;
    for (int j = 0; j < (pair ? 1 : a->n_out); j++) {
        a->out[j].first_block = blocks;
        blocks += ceil_div_i(a->out[j].N, rows_per_block);
    }
    return blocks;
}

template <int MT, bool kShift, bool kPair, int R = kRowsPerWarp, int U = kChunksInFlight>
static void launch_q8(GpuCtx *g, Q8Args a) {
    dim3 grid(assign_blocks(&a, kWarps * R, kPair), ceil_div_i(a.M, MT));
    a.prefetch_bytes = g->pdl ? g->prefetch_bytes : 0;
    a.late_release = g->late_release;
    if (a.norm_w) launch(g, "q8_matmul_kernel", q8_matmul_kernel<R, U, MT, kShift, kPair, true>, grid, dim3(kWarps * 32), 0, a);
    else launch(g, "q8_matmul_kernel", q8_matmul_kernel<R, U, MT, kShift, kPair, false>, grid, dim3(kWarps * 32), 0, a);
}

// Tokens per block: the power of two covering M, at most 8 (their accumulators are registers);
// larger M takes several blocks along y, each streaming the weights again (from L2 when they fit).
template <bool kShift, bool kPair>
static void launch_q8_tokens(GpuCtx *g, const Q8Args &a) {
    if (a.M == 1) launch_q8<1, kShift, kPair>(g, a);
    else if (a.M == 2) launch_q8<2, kShift, kPair>(g, a);
    else if (a.M <= 4) launch_q8<4, kShift, kPair>(g, a);
    else launch_q8<8, kShift, kPair>(g, a);
}

static int group_shift(int gs) {   // log2(gs / 16), or -1 where gs is not 16 * 2^n
    int shift = 0;
    while ((16 << shift) < gs) shift++;
    return (16 << shift) == gs ? shift : -1;
}

// Arguments for n weights of one shape along K (checked) and their outputs.
static Q8Args q8_args(const float *x, int M, int n, const Mat *const *w, float *const *y, int accumulate) {
    Q8Args a;
    memset(&a, 0, sizeof a);
    for (int j = 0; j < n; j++) {
        if (w[j]->cols != w[0]->cols || w[j]->gs != w[0]->gs) {
            fprintf(stderr, "run: fused matmul: weights of %d and %d columns (group sizes %d, %d) in one launch\n",
                    w[0]->cols, w[j]->cols, w[0]->gs, w[j]->gs);
            exit(1);
        }
        a.out[j] = (Q8Out){w[j]->q, w[j]->s, y[j], w[j]->rows, 0};
    }
    a.x = x, a.n_out = n, a.M = M, a.K = w[0]->cols, a.stride = w[0]->stride, a.groups = w[0]->groups;
    a.gs = w[0]->gs, a.group_shift = group_shift(a.gs), a.accumulate = accumulate;
    return a;
}

// Blocks of q8_gemv_tma_kernel an SM holds with `smem` bytes each (cached: asked once per size).
template <bool kPair, bool kNorm>
static int tma_blocks_per_sm(size_t smem) {
    static size_t cached_smem = 0;
    static int cached = 0;
    if (smem != cached_smem) {
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&cached, q8_gemv_tma_kernel<kPair, kNorm>, kTmaThreads, smem));
        cached_smem = smem;
    }
    return cached;
}

// The copy-engine GEMV where it applies (M = 1, group size 16 x 2^n, compute capability 9.0, x
// and the ring within the shared memory a block may have); false: the caller launches another.
// Rows per block: even (RoPE pairs), so that the blocks fill the GPU once.
template <bool kPair, bool kNorm>
static bool launch_q8_tma_norm(GpuCtx *g, Q8Args a) {
    if (!g->gemv_tma || a.M != 1 || a.group_shift < 0 || a.stride % 16) return false;
    for (int j = 0; j < (kPair ? 2 : a.n_out); j++)
        if (reinterpret_cast<uintptr_t>(a.out[j].q) % 16) return false;
    int rows = a.out[0].N;   // of all outputs; pair mode: w1's, each read together with w3's
    for (int j = 1; j < (kPair ? 1 : a.n_out); j++) rows += a.out[j].N;
    const int phys_per_row = kPair ? 2 : 1;
    a.tma_stages = g->gemv_stages;
    // gemv_blocks blocks an SM; fewer where their shared memory does not let that many fit
    a.tma_rows = round_up(ceil_div_i(rows, (long long)g->sms * g->gemv_blocks), 2);
    size_t smem = tma_smem_bytes(a.tma_stages, a.stride, phys_per_row * a.tma_rows);
    const int fit = smem <= kMaxSmem ? tma_blocks_per_sm<kPair, kNorm>(smem) : 0;
    if (fit < 1) return false;
    if (fit < g->gemv_blocks) {
        a.tma_rows = round_up(ceil_div_i(rows, (long long)g->sms * fit), 2);
        smem = tma_smem_bytes(a.tma_stages, a.stride, phys_per_row * a.tma_rows);
        if (smem > kMaxSmem || tma_blocks_per_sm<kPair, kNorm>(smem) < 1) return false;
    }
    launch(g, "q8_gemv_tma_kernel", q8_gemv_tma_kernel<kPair, kNorm>, dim3(assign_blocks(&a, a.tma_rows, kPair)),
           dim3(kTmaThreads), smem, a);
    return true;
}
template <bool kPair>
static bool launch_q8_tma(GpuCtx *g, const Q8Args &a) {
    return a.norm_w ? launch_q8_tma_norm<kPair, true>(g, a) : launch_q8_tma_norm<kPair, false>(g, a);
}

extern "C" int gpu_set_gemv_tma(GpuCtx *g, int on) {
    g->gemv_tma = on && wgmma_available();
    if (g->gemv_tma) {
        CUDA_CHECK(cudaFuncSetAttribute(q8_gemv_tma_kernel<false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
        CUDA_CHECK(cudaFuncSetAttribute(q8_gemv_tma_kernel<false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
        CUDA_CHECK(cudaFuncSetAttribute(q8_gemv_tma_kernel<true, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
        CUDA_CHECK(cudaFuncSetAttribute(q8_gemv_tma_kernel<true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
    }
    return g->gemv_tma;
}

// The register-fed kernel (any GPU, any M, any group size).
template <bool kPair>
static void launch_q8_simt(GpuCtx *g, const Q8Args &a) {
    if (a.group_shift >= 0) launch_q8_tokens<true, kPair>(g, a);
    else launch_q8_tokens<false, kPair>(g, a);
}

template <bool kPair>
static void launch_q8_any(GpuCtx *g, const Q8Args &a) {
    if (!launch_q8_tma<kPair>(g, a)) launch_q8_simt<kPair>(g, a);
}

extern "C" void gpu_matmul_q8_fused(GpuCtx *g, float *y, const float *x, int M, const Mat *w, int accumulate) {
    gpu_matmul_q8_fused_norm(g, y, x, M, w, accumulate, NULL);
}

// The register-fed kernel's instance for tall weights at M = 1 (4 rows a warp) needs 124 registers
// with the norm folded in, 80 without: 2 blocks an SM instead of 3. Measured on stories15m
// (32000 x 288 classifier, H200): 8845 tok/s with the final norm as its own kernel, 8640 folded.
static bool takes_tall_simt(const GpuCtx *g, int M, const Mat *w) {
    const bool copy_engine = g->gemv_tma && w->stride % 16 == 0;   // launch_q8_tma_norm's first checks
    return M == 1 && group_shift(w->gs) >= 0 && w->rows >= kTallRows && !copy_engine;
}
extern "C" int gpu_fold_norm_pays(GpuCtx *g, int M, const Mat *w) { return !takes_tall_simt(g, M, w); }

extern "C" void gpu_matmul_q8_fused_norm(GpuCtx *g, float *y, const float *x, int M, const Mat *w, int accumulate,
                                         const float *norm_w) {
    Q8Args a = q8_args(x, M, 1, &w, &y, accumulate);
    a.norm_w = norm_w;
    if (launch_q8_tma<false>(g, a)) return;
    if (takes_tall_simt(g, M, w)) launch_q8<1, true, false, kRowsPerWarpTall>(g, a);
    else launch_q8_simt<false>(g, a);
}

extern "C" void gpu_matmul_q8_qkv_rope(GpuCtx *g, float *q, const float *x, int M, const Mat *wq, const Mat *wk,
                                       const Mat *wv, void *key_cache, void *value_cache, int head_size, int kv_half,
                                       size_t seq_stride, const float *norm_w) {
    static_assert(kRowsPerWarp % 2 == 0, "RoPE pairs must not straddle warps");
    const Mat *w[3] = {wq, wk, wv};
    float *y[3] = {q, NULL, NULL};
    Q8Args a = q8_args(x, M, 3, w, y, 0);
    a.rope = (RopeStore){g->inputs, key_cache, value_cache, head_size, kv_half, seq_stride};
    a.norm_w = norm_w;
    launch_q8_any<false>(g, a);
}

extern "C" void gpu_matmul_q8_swiglu(GpuCtx *g, float *h, const float *x, int M, const Mat *w1, const Mat *w3,
                                     const float *norm_w) {
    const Mat *w[2] = {w1, w3};
    float *y[2] = {h, NULL};
    if (w1->rows != w3->rows) {
        fprintf(stderr, "run: fused SwiGLU: w1 has %d rows, w3 %d\n", w1->rows, w3->rows);
        exit(1);
    }
    Q8Args a = q8_args(x, M, 2, w, y, 0);
    a.norm_w = norm_w;
    launch_q8_any<true>(g, a);
}

// Tuning: the M = 1 kernel with other rows per warp (1, 2, 4) and chunks in flight (2, 4, 8),
// for bench/kernel_bench's sweep. Returns -1 for a combination that is not built.
extern "C" int gpu_matmul_q8_variant(GpuCtx *g, float *y, const float *x, const Mat *w, int rows_per_warp, int chunks) {
    Q8Args a = q8_args(x, 1, 1, &w, &y, 0);
    if (a.group_shift < 0) return -1;
    switch (rows_per_warp * 10 + chunks) {
    case 12: launch_q8<1, true, false, 1, 2>(g, a); return 0;
    case 14: launch_q8<1, true, false, 1, 4>(g, a); return 0;
    case 18: launch_q8<1, true, false, 1, 8>(g, a); return 0;
    case 22: launch_q8<1, true, false, 2, 2>(g, a); return 0;
    case 24: launch_q8<1, true, false, 2, 4>(g, a); return 0;
    case 28: launch_q8<1, true, false, 2, 8>(g, a); return 0;
    case 42: launch_q8<1, true, false, 4, 2>(g, a); return 0;
    case 44: launch_q8<1, true, false, 4, 4>(g, a); return 0;
    case 48: launch_q8<1, true, false, 4, 8>(g, a); return 0;
    }
    return -1;
}

extern "C" void gpu_dequant(GpuCtx *g, float *dst, const Mat *w) {
    const size_t words = (size_t)w->rows * (w->stride / 4);
    launch(g, "dequant_kernel", dequant_kernel, dim3(ceil_div_i(words, 256)), dim3(256), 0, dst, w->rows, w->cols, w->stride,
           w->groups, w->gs, w->q, w->s);
}

// Row-major y (M, N) = x (M, K) W^T is, column-major, y^T (N, M) = W_cm^T (N, K) x^T (K, M),
// where W_cm is W read column-major: (K, N) with leading dimension ldw.
extern "C" void gpu_matmul_f32(GpuCtx *g, float *y, const float *x, int M, const float *W, int N, int K, int ldw,
                               int accumulate) {
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    if (M == 1) CUBLAS_CHECK(cublasSgemv(g->blas, CUBLAS_OP_T, K, N, &one, W, ldw, x, 1, &beta, y, 1));
    else CUBLAS_CHECK(cublasSgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, W, ldw, x, K, &beta, y, N));
}

// FP16 weights (N, K) dense, resident: the baseline a user without quantization runs. x is
// converted to FP16 first (cuBLAS takes one input type); FP32 accumulation and output.
extern "C" void gpu_matmul_f16(GpuCtx *g, float *y, const float *x, int M, const void *W, int N, int K, int accumulate) {
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    if ((size_t)M * K > g->half_floats) {
        fprintf(stderr, "run: FP16 input scratch holds %zu values, %d x %d needed\n", g->half_floats, M, K);
        exit(1);
    }
    launch(g, "float_to_half_kernel", float_to_half_kernel, dim3(ceil_div_i((long long)M * K, 256)), dim3(256), 0, g->x_half,
           x, M * K);
    CUBLAS_CHECK(cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, W, CUDA_R_16F, K, g->x_half, CUDA_R_16F, K,
                              &beta, y, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

extern "C" void gpu_to_half(GpuCtx *g, void *dst, const Mat *w) {
    launch(g, "to_half_kernel", to_half_kernel, dim3(ceil_div_i((long long)w->rows * w->cols, 256)), dim3(256), 0,
           (__half *)dst, w->rows, w->cols, w->stride, w->groups, w->gs, w->q, w->s, w->f);
}

// Token tiles of 8 per block: the power of two covering M, at most 4 (32 tokens a block); the
// fewer tiles, the more steps each warp keeps in flight (registers: kTiles * kUnroll x fragments).
// grid.y: the row blocks, at most as many as stay resident at once (the rest are walked by them).
template <int kTiles, int kUnroll>
static void launch_q8_mma(GpuCtx *g, const Q8MmaArgs &a) {
    static int resident = 0;   // per kernel instance
    if (!resident) {
        int per_sm = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, q8_mma_kernel<kTiles, kUnroll>, kMmaWarps * 32, 0));
        resident = g->sms * (per_sm > 0 ? per_sm : 1);
    }
    const int token_blocks = ceil_div_i(a.M, 8 * kTiles), row_blocks = ceil_div_i(a.N, 16);
    const int per_token_block = max(1, resident / token_blocks);
    dim3 grid(token_blocks, min(row_blocks, per_token_block));
    launch(g, "q8_mma_kernel", q8_mma_kernel<kTiles, kUnroll>, grid, dim3(kMmaWarps * 32), 0, a);
}

// grid.y holds the row blocks: at most 65535 of 16 rows
extern "C" int gpu_matmul_q8_mma_supported(const Mat *w) {
    return w->q && w->gs % kMmaStep == 0 && w->rows <= 65535 * 16;
}

// wgmma needs sm_90a machine code, which this build carries for compute capability 9.0 only.
static int wgmma_available(void) {
    static int available = -1;
    if (available < 0) {
        int dev = 0, major = 0, minor = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        available = major == 9 && minor == 0;
        if (available) CUDA_CHECK(cudaFuncSetAttribute(q8_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kWgSmem));
    }
    return available;
}

static void matmul_q8_mma_sync(GpuCtx *g, float *y, const float *x, int M, const Mat *w, int accumulate) {
    launch(g, "float_to_half_kernel", float_to_half_kernel, dim3(ceil_div_i((long long)M * w->cols, 256)), dim3(256), 0,
           g->x_half, x, M * w->cols);
    const Q8MmaArgs a = {w->q, w->s, g->x_half, y, M, w->rows, w->cols, w->stride, w->groups, w->gs, accumulate};
    // over 32 tokens: blocks of 32 side by side (at M = 64, 27.1 us on 4096 x 4096 against 31.2
    // with one 64-token block per row block; 67.4 against 81.4 on 11008 x 4096)
    if (M <= 8) launch_q8_mma<1, 4>(g, a);
    else if (M <= 16) launch_q8_mma<2, 2>(g, a);
    else launch_q8_mma<4, 1>(g, a);
}

static void matmul_q8_wgmma(GpuCtx *g, float *y, const float *x, int M, const Mat *w, int accumulate) {
    const int steps = ceil_div_i(w->cols, kMmaStep), token_blocks = ceil_div_i(M, kWgTokens);
    const size_t total = (size_t)token_blocks * steps * kWgTokens * kMmaStep;
    launch(g, "x_to_tiles_kernel", x_to_tiles_kernel, dim3(ceil_div_i((long long)total, 256)), dim3(256), 0, g->x_half, x,
           M, w->cols, steps, total);
    const Q8WgArgs a = {w->q, w->s, g->x_half, y, M, w->rows, steps, w->stride, w->groups, w->gs, accumulate};
    launch(g, "q8_wgmma_kernel", q8_wgmma_kernel, dim3(token_blocks, ceil_div_i(w->rows, kWgRows)), dim3(256), kWgSmem, a);
}

// From this many tokens on, the wgmma kernel (128-token tiles) beats mma.sync's (measured: bench
// kernel_bench --across-m, columns mma and wgmma).
#define WGMMA_MIN_TOKENS 128

extern "C" void gpu_matmul_q8_tc(GpuCtx *g, float *y, const float *x, int M, const Mat *w, int accumulate, int kernel) {
    const size_t x_half_need = (size_t)round_up(M, kWgTokens) * round_up(w->cols, kMmaStep);   // either kernel's x
    if (!gpu_matmul_q8_mma_supported(w) || x_half_need > g->half_floats) {
        fprintf(stderr, "run: tensor-core matmul: group size %d (needs a multiple of %d) or %d x %d inputs (scratch %zu)\n",
                w->gs, kMmaStep, M, w->cols, g->half_floats);
        exit(1);
    }
    if (kernel == TC_AUTO) kernel = M >= WGMMA_MIN_TOKENS && wgmma_available() ? TC_WGMMA : TC_MMA_SYNC;
    if (kernel == TC_WGMMA && !wgmma_available()) {
        fprintf(stderr, "run: the wgmma kernel needs a GPU of compute capability 9.0\n");
        exit(1);
    }
    if (kernel == TC_WGMMA) matmul_q8_wgmma(g, y, x, M, w, accumulate);
    else matmul_q8_mma_sync(g, y, x, M, w, accumulate);
}

extern "C" void gpu_matmul_q8_mma(GpuCtx *g, float *y, const float *x, int M, const Mat *w, int accumulate) {
    gpu_matmul_q8_tc(g, y, x, M, w, accumulate, TC_AUTO);
}

extern "C" void gpu_matmul_q8_unfused(GpuCtx *g, float *y, const float *x, int M, const Mat *w, int accumulate) {
    if ((size_t)w->rows * w->cols > g->scratch_floats) {
        fprintf(stderr, "run: unfused scratch holds %zu floats, a %d x %d weight needs more\n", g->scratch_floats, w->rows, w->cols);
        exit(1);
    }
    gpu_dequant(g, g->scratch, w);
    gpu_matmul_f32(g, y, x, M, g->scratch, w->rows, w->cols, w->cols, accumulate);
}

// ----------------------------------------------------------------------------
// The rest of the forward pass

extern "C" void gpu_embed(GpuCtx *g, float *x, int M, const Mat *emb) {
    launch(g, "embed_kernel", embed_kernel, dim3(M), dim3(256), 0, x, (const int *)g->inputs, emb->cols, emb->stride,
           emb->groups, emb->gs, emb->q, emb->s, emb->f);
}

extern "C" void gpu_rmsnorm(GpuCtx *g, float *out, const float *in, const float *w, int M, int n) {
    launch(g, "rmsnorm_kernel", rmsnorm_kernel, dim3(M), dim3(256), 0, out, in, w, n);
}

extern "C" void gpu_rope_store(GpuCtx *g, float *q, float *k, const float *v, void *key_cache, void *value_cache, int M,
                               int dim, int kv_dim, int head_size, int kv_half, size_t seq_stride) {
    dim3 grid(ceil_div_i(dim / 2, 128), M);
    if (kv_half)
        launch(g, "rope_store_kernel", rope_store_kernel<__half>, grid, dim3(128), 0, q, k, v, (__half *)key_cache,
               (__half *)value_cache, (const int *)g->inputs, dim, kv_dim, head_size, seq_stride);
    else
        launch(g, "rope_store_kernel", rope_store_kernel<float>, grid, dim3(128), 0, q, k, v, (float *)key_cache,
               (float *)value_cache, (const int *)g->inputs, dim, kv_dim, head_size, seq_stride);
}

extern "C" int gpu_attention_max_head_size(void) { return kMaxHeadSize; }

// Rows per split for M tokens: all of them up to a context of kOneSplitLen (one block per head is
// enough there, and the combine kernel is saved); else kAttnChunk (one token: kAttnChunkDecode),
// or more where that would need over kMaxSplits splits. Fixed by seq_len, not by the position, so
// that a captured step replays at every position (splits past it are empty).
static int attention_chunk(int seq_len, int M) {
    const int rows = M == 1 ? kAttnChunkDecode : kAttnChunk;
    if (seq_len <= kOneSplitLen) return seq_len;   // short contexts: no combine launch
    return seq_len <= rows * kMaxSplits ? rows : ceil_div_i(seq_len, kMaxSplits);
}

// Enough for up to M tokens, and for one token's finer splits.
extern "C" size_t gpu_attention_part_floats(int M, int n_heads, int head_size, int seq_len) {
    const size_t batch = (size_t)M * ceil_div_i(seq_len, attention_chunk(seq_len, M)),
                 one = (size_t)ceil_div_i(seq_len, attention_chunk(seq_len, 1));
    return (batch > one ? batch : one) * n_heads * (2 + head_size);
}

extern "C" void gpu_attention(GpuCtx *g, float *out, float *part, const float *q, const void *key_cache,
                              const void *value_cache, int M, int n_heads, int n_kv_heads, int head_size, int seq_len,
                              int kv_half, size_t seq_stride) {
    const int chunk = attention_chunk(seq_len, M), splits = ceil_div_i(seq_len, chunk);
    const size_t smem = (size_t)(head_size + kAttnValueFloats + chunk) * sizeof(float);
    if (head_size > kMaxHeadSize || smem > kMaxSmem) {
        fprintf(stderr, "run: attention: head size %d (at most %d) or context %d too large\n", head_size, kMaxHeadSize, seq_len);
        exit(1);
    }
    dim3 grid(n_heads, splits, M);
    if (kv_half)
        launch(g, "attention_kernel", attention_kernel<__half>, grid, dim3(kAttnThreads), smem, out, part, q,
               (const __half *)key_cache, (const __half *)value_cache, (const int *)g->inputs, n_heads, n_kv_heads, head_size,
               chunk, seq_stride);
    else
        launch(g, "attention_kernel", attention_kernel<float>, grid, dim3(kAttnThreads), smem, out, part, q,
               (const float *)key_cache, (const float *)value_cache, (const int *)g->inputs, n_heads, n_kv_heads, head_size,
               chunk, seq_stride);
    if (splits > 1)
        launch(g, "attention_combine_kernel", attention_combine_kernel, dim3(n_heads, M), dim3(kCombineThreads), 0, out,
               (const float *)part, n_heads, head_size, splits);
}

extern "C" void gpu_swiglu(GpuCtx *g, float *h, const float *gate, int n) {
    launch(g, "swiglu_kernel", swiglu_kernel, dim3(ceil_div_i(n, 256)), dim3(256), 0, h, gate, n);
}

extern "C" void gpu_argmax_launch(GpuCtx *g, const float *v, int n, int feed) {
    launch(g, "argmax_kernel", argmax_kernel, dim3(1), dim3(kArgmaxThreads), 0, g->argmax, g->inputs, feed, v, n);
}

extern "C" void gpu_argmax_rows(GpuCtx *g, const float *v, int rows, int n, int *out) {
    if (rows < 1 || rows > kMaxArgmaxRows) {
        fprintf(stderr, "run: argmax of %d rows (1 to %d)\n", rows, kMaxArgmaxRows);
        exit(1);
    }
    launch(g, "argmax_kernel", argmax_kernel, dim3(rows), dim3(kArgmaxThreads), 0, g->argmax, g->inputs, 0, v, n);
    CUDA_CHECK(cudaMemcpyAsync(g->argmax_rows_host, g->argmax, rows * sizeof(int), cudaMemcpyDeviceToHost, g->stream));
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    memcpy(out, g->argmax_rows_host, rows * sizeof(int));
}

extern "C" void gpu_argmax_fetch(GpuCtx *g, int slot) {
    CUDA_CHECK(cudaMemcpyAsync(g->argmax_host + slot, g->argmax, sizeof(int), cudaMemcpyDeviceToHost, g->stream));
    CUDA_CHECK(cudaEventRecord(g->argmax_fetched[slot], g->stream));
}

extern "C" int gpu_argmax_wait(GpuCtx *g, int slot) {
    CUDA_CHECK(cudaEventSynchronize(g->argmax_fetched[slot]));
    return g->argmax_host[slot];
}

extern "C" int gpu_argmax(GpuCtx *g, const float *v, int n) {
    int token;
    gpu_argmax_rows(g, v, 1, n, &token);
    return token;
}

extern "C" int gpu_sample_supported(int n) { return n >= 1 && n <= kSampleThreads * kSampleMaxPer; }

extern "C" void gpu_sample_rows(GpuCtx *g, const float *logits, int rows, int n, float temperature, float topp,
                                const float *coins, int *out) {
    if (rows < 1 || rows > kMaxArgmaxRows || !gpu_sample_supported(n) || !(temperature > 0.0f)) {
        fprintf(stderr, "run: sampling %d rows (1 to %d) of %d logits (at most %d) at temperature %g\n", rows,
                kMaxArgmaxRows, n, kSampleThreads * kSampleMaxPer, temperature);
        exit(1);
    }
    SampleArgs a = {logits, g->argmax, n, temperature, topp, {0}};
    memcpy(a.coin, coins, rows * sizeof(float));
    const dim3 grid(rows), block(kSampleThreads);
    const int per = ceil_div_i(n, kSampleThreads);   // registers a thread: the power of two covering it
    if (per <= 1) launch(g, "sample_kernel", sample_kernel<1>, grid, block, 0, a);
    else if (per <= 2) launch(g, "sample_kernel", sample_kernel<2>, grid, block, 0, a);
    else if (per <= 4) launch(g, "sample_kernel", sample_kernel<4>, grid, block, 0, a);
    else if (per <= 8) launch(g, "sample_kernel", sample_kernel<8>, grid, block, 0, a);
    else if (per <= 16) launch(g, "sample_kernel", sample_kernel<16>, grid, block, 0, a);
    else launch(g, "sample_kernel", sample_kernel<kSampleMaxPer>, grid, block, 0, a);
    CUDA_CHECK(cudaMemcpyAsync(g->argmax_rows_host, g->argmax, rows * sizeof(int), cudaMemcpyDeviceToHost, g->stream));
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    memcpy(out, g->argmax_rows_host, rows * sizeof(int));
}
