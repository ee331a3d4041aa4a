// gemv.cuh: the fused INT8 GEMVs, kernels then launchers.
//   q8_matmul_kernel     register-fed: any GPU, any M (up to 8 tokens a block), any group size
//   q8_gemv_tma_kernel   fed by the copy engine into a ring in shared memory: M = 1, sm_90a
//   Q8Args, q8_args      what one launch computes: up to three outputs of one K (q, k, v), or
//                        w1 and w3 in pair mode; epilogues store_rows (residual add; biases,
//                        RoPE + KV store) and finish_output (folded RMSNorm, SwiGLU)
//   launch_q8_simt, launch_q8 (the tall instance), q8_tma_fits, launch_q8_tma
// Tuning constants that bench/tune.sh overrides at build time (-D): Q8_PREFETCH_BYTES,
// Q8_TMA_STAGES, Q8_TMA_BLOCKS.
#ifndef Q8_PREFETCH_BYTES
#define Q8_PREFETCH_BYTES 1024
#endif
#ifndef Q8_TMA_STAGES
#define Q8_TMA_STAGES 2
#endif
#ifndef Q8_TMA_BLOCKS
#define Q8_TMA_BLOCKS 4
#endif

namespace {

constexpr int kWarps = 8;            // 256 threads a block: two warps per scheduler of an SM
// Rows per warp and 16-byte chunks in flight per row: from bench/kernel_bench's sweep (NOTES 3).
// More chunks in flight cost registers, so occupancy, without adding bytes in flight per SM; the
// tall weights (the dispatch's choice) run fewer, longer-lived warps.
constexpr int kRowsPerWarp = 2, kRowsPerWarpTall = 4;
constexpr int kChunksInFlight = 2;
// Bytes of each weight row the GEMV asks L2 for before the previous kernel has finished (PDL):
// a layer's first bytes then stream while that kernel drains; a few MB, well inside the L2.
constexpr int kPrefetchBytes = Q8_PREFETCH_BYTES;

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
// QKV launch only: the biases added, RoPE applied to q and k in the epilogue, then k and v stored
// straight into the layer's KV cache rows pos..pos+M-1 instead of out[1].y and out[2].y.
struct RopeStore {
    const int *inputs;      // [0]: the position of token 0; NULL: no RoPE, plain outputs
    const float *freq;      // (head_size / 2): pair (2i, 2i + 1) of a head turns by pos * freq[i]
    const float *bias[3];   // (out[j].N) added to output j before RoPE, or NULL
    void *kc, *vc;          // (seq_len, kv_dim) the layer's caches, FP16 if kv_half else FP32
    int head_size, kv_half;
    size_t seq_stride;      // 0: token m at pos + m; else token m is sequence m's, at pos, caches this far apart
};
struct Q8Args {
    Q8Out out[3];
    const float *x;    // (M, K)
    int n_out, M, K, stride, groups, gs, group_shift;
    int accumulate;    // y += result instead of y = result
    const float *norm_w;  // non-NULL: x is the raw residual stream, RMSNorm'd on the fly with these (K) weights
    float norm_eps;       // with norm_w: the RMSNorm's epsilon
    int prefetch_bytes;   // of each weight row, asked of L2 before the previous kernel ends (PDL)
    int tma_rows, tma_stages;   // q8_gemv_tma_kernel: rows of each output per block, stages in its ring
    RopeStore rope;
};

// A pair turned by the angle of cosine cs and sine sn.
__device__ __forceinline__ void rope_pair(float &v0, float &v1, float cs, float sn) {
    const float a = v0, b = v1;
    v0 = a * cs - b * sn;
    v1 = a * sn + b * cs;
}
// Rotates the pairs (v[r], v[r + 1]), r even, of rows row0 + r at position pos by pos * freq of
// the pair: the same operations as rope_store_kernel (and the CPU's RoPE).
template <int R>
__device__ __forceinline__ void rope_rows(float v[R], int row0, int pos, const float *freq, int head_size) {
#pragma unroll
    for (int r = 0; r + 1 < R; r += 2) {
        float sn, cs;
        sincosf(pos * __ldg(freq + (row0 + r) % head_size / 2), &sn, &cs);
        rope_pair(v[r], v[r + 1], cs, sn);
    }
}

// v[r] += bias[row0 + r] for the rows within N; nothing without a bias.
template <int R>
__device__ __forceinline__ void add_bias(float v[R], const float *bias, int row0, int N) {
    if (!bias) return;
#pragma unroll
    for (int r = 0; r < R; r++)
        if (row0 + r < N) v[r] += __ldg(bias + row0 + r);
}

// The finished outputs v of rows row0 .. row0 + R - 1 (row0 even) of output j for token m, by
// one thread: biased, RoPE'd and stored into the KV cache (the QKV launch's k and v; q to y), or
// written to y (added to it when accumulating). Rows past N are dropped. With turned (R = 2):
// turn is the pair's cosine and sine at position pos_at, computed before (the megakernel's blocks
// keep their rows').
template <int R>
__device__ __forceinline__ void store_rows(const Q8Args &a, int j, const Q8Out &o, int row0, int m, float v[R], bool turned = false,
                                           float2 turn = {}, int pos_at = 0) {
    if (R % 2 == 0 && a.rope.inputs) {   // row0 is even: whole RoPE pairs
        const int pos = turned ? pos_at : a.rope.inputs[0] + (a.rope.seq_stride ? 0 : m);
        add_bias<R>(v, a.rope.bias[j], row0, o.N);
        if (j < 2 && R == 2 && turned) {
            rope_pair(v[0], v[1], turn.x, turn.y);
        } else if (j < 2) {
            rope_rows<R>(v, row0, pos, a.rope.freq, a.rope.head_size);
        }
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
        *dst = a.accumulate ? __ldcg(dst) + v[r] : v[r];   // L2: other SMs may have written it in this kernel (megakernel)
    }
}

// Which of a launch's outputs block blockIdx.x computes (pair mode: always 0, w1 and w3 together).
__device__ __forceinline__ int output_of_block(const Q8Args &a, bool pair) {
    return pair ? 0 : (a.n_out > 2 && blockIdx.x >= a.out[2].first_block) ? 2 : (a.n_out > 1 && blockIdx.x >= a.out[1].first_block) ? 1 : 0;
}


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

// Blocks of q8_matmul_kernel an SM must hold, as ptxas is told (0: its own choice). The instance
// of the decode step's QKV launch (M = 1, norm folded, 2 rows a warp) took 95 registers at
// ptxas's choice once its epilogue added the biases: 2 blocks an SM, where it had held 3 (80
// registers, 4 bytes spilled). Held to 3, it takes 80 and spills nothing.
constexpr int q8_min_blocks(int R, int MT, bool shift, bool pair, bool norm) {
    return norm && shift && !pair && MT == 1 && R == kRowsPerWarp ? 3 : 0;
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
__global__ void __launch_bounds__(kWarps * 32, q8_min_blocks(R, MT, kShiftGroups, kPair, kNorm)) q8_matmul_kernel(const Q8Args a) {
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
    pdl_wait();
    pdl_release();
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
#pragma unroll
    for (int t = 0; t < MT; t++) {
        const float inv_rms = kNorm ? inv_rms_of(warp_sum(sumsq[t]), K, a.norm_eps) : 1.0f;
        float v[R];
#pragma unroll
        for (int r = 0; r < R; r++)   // pair mode: w3's sums follow w1's (RR - R + r is r + R then, and in bounds always)
            v[r] = finish_output(warp_sum(acc[t][r]), kPair ? warp_sum(acc[t][RR - R + r]) : 0.0f, inv_rms, kPair);
        if (lane == 0 && m0 + t < a.M) store_rows<R>(a, j, o, row0, m0 + t, v);
    }
}

// ----------------------------------------------------------------------------
// Fused dequant-GEMV at M = 1 fed by the copy engine (sm_90a): y (N) = W x, W int8 (N, stride).
//
//   grid.x: blocks of a.tma_rows rows of each output in turn (pair mode: those rows of w1 and of
//   w3, interleaved as the block's "physical" rows w1 r, w3 r, w1 r + 1, ...). 256 threads.
//   A block walks its physical rows in tiles of kTmaRows rows x kTmaCols bytes: one bulk copy per
//   row lands each tile in a ring of a.tma_stages tiles in shared memory, completing on the
//   stage's mbarrier, so that the ring's bytes are in flight per block without a register each,
//   which the register-fed kernel above cannot reach (its bytes in flight are its registers, so a
//   4096-row layer takes several DRAM round trips a warp).
//   The first tiles are asked for before griddepcontrol.wait: weights never depend on the kernel
//   before.
//   Thread i takes chunk i (16 bytes) of every row of a tile, so its 16 x values (from shared
//   memory, staged once per block: x4[sub * chunks + c] holds x[16c + 4sub .. + 4], so that a
//   warp's loads of one sub are consecutive) serve all kTmaRows rows. Its group scales are loaded
//   a tile ahead (each block's scale rows asked of L2 at the start). A warp sum per row when a row
//   tile is done, the 8 warps' sums added in the epilogue, which writes through store_rows.
constexpr int kTmaRows = 4, kTmaCols = 4096, kTmaTile = kTmaRows * kTmaCols;   // 256 chunks a row
constexpr int kTmaThreads = 256, kTmaWarps = kTmaThreads / 32;
// Ring stages and blocks per SM: the fastest end to end in the sweep of NOTES 22 (bench/tune.sh).
constexpr int kTmaStages = Q8_TMA_STAGES, kTmaBlocksPerSm = Q8_TMA_BLOCKS;
static_assert(kTmaCols / 16 == kTmaThreads, "one chunk of each tile row per thread");

// Shared memory of one block, in bytes: the ring, x, the stage barriers, the warps' row sums.
__host__ __device__ inline size_t tma_smem_bytes(int stages, int stride, int phys_rows) {
    return (size_t)stages * kTmaTile + (size_t)stride / 16 * 64 + 8 * stages + 4 * kTmaWarps * phys_rows;
}

struct TmaBlock {            // what one block reads: rows lrow0 .. lrow0 + lrows - 1 of output j
    int j, lrow0, lrows, prows, col_tiles, tiles;
};

// Row p's sum over the warps' partial sums (sums: (warps, prows)), warp by warp.
__device__ __forceinline__ float warps_row_sum(const float *sums, int warps, int prows, int p) {
    float s = 0.0f;
    for (int w = 0; w < warps; w++) s += sums[w * prows + p];
    return s;
}

// A block's rows of output o finished from its warps' row sums (sums: (warps, b.prows)) and
// stored: thread i of `threads` takes rows 2i and 2i + 1 (whole RoPE pairs); with turned, turn
// holds those rows' cosine and sine at pos_at (store_rows).
__device__ __forceinline__ void finish_block_rows(const Q8Args &a, const Q8Out &o, const TmaBlock &b, const float *sums, int warps,
                                                  int threads, float inv_rms, bool pair, bool turned = false, float2 turn = {},
                                                  int pos_at = 0) {
    for (int l = 2 * threadIdx.x; l < b.lrows; l += 2 * threads) {
        float v[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float s0 = 0.0f, s1 = 0.0f;
            const int p = pair ? 2 * (l + r) : l + r;
            if (l + r < b.lrows) {
                s0 = warps_row_sum(sums, warps, b.prows, p);
                if (pair) s1 = warps_row_sum(sums, warps, b.prows, p + 1);
            }
            v[r] = finish_output(s0, s1, inv_rms, pair);
        }
        store_rows<2>(a, b.j, o, b.lrow0 + l, 0, v, turned && l == 2 * (int)threadIdx.x, turn, pos_at);
    }
}

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
    return kNorm ? inv_rms_of(block_reduce<false>(sumsq, red), a.K, a.norm_eps) : 1.0f;
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
    finish_block_rows(a, o, b, sums, kTmaWarps, kTmaThreads, inv_rms, kPair);
}


}  // namespace

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
    a.prefetch_bytes = g->pdl ? kPrefetchBytes : 0;
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

// The copy-engine GEMV's plan for a: rows per block (even: whole RoPE pairs) such that
// kTmaBlocksPerSm blocks an SM cover the outputs once, or fewer blocks an SM where their shared
// memory does not let that many fit; its stages, and the shared memory a block takes. false where
// it cannot run: not sm_90a, M > 1, a group size not 16 x 2^n, rows not 16-byte aligned, or x and
// the ring beyond a block's shared memory.
template <bool kPair, bool kNorm>
static bool tma_plan(GpuCtx *g, Q8Args *a, size_t *smem) {
    if (!sm90a_available() || a->M != 1 || a->group_shift < 0 || a->stride % 16) return false;
    for (int j = 0; j < (kPair ? 2 : a->n_out); j++)
        if (reinterpret_cast<uintptr_t>(a->out[j].q) % 16) return false;
    int rows = a->out[0].N;   // of all outputs; pair mode: w1's, each read together with w3's
    for (int j = 1; j < (kPair ? 1 : a->n_out); j++) rows += a->out[j].N;
    const int phys_per_row = kPair ? 2 : 1;
    a->tma_stages = kTmaStages;
    a->tma_rows = round_up(ceil_div_i(rows, (long long)g->sms * kTmaBlocksPerSm), 2);
    *smem = tma_smem_bytes(a->tma_stages, a->stride, phys_per_row * a->tma_rows);
    const int fit = *smem <= kMaxSmem ? tma_blocks_per_sm<kPair, kNorm>(*smem) : 0;
    if (fit < 1) return false;
    if (fit < kTmaBlocksPerSm) {
        a->tma_rows = round_up(ceil_div_i(rows, (long long)g->sms * fit), 2);
        *smem = tma_smem_bytes(a->tma_stages, a->stride, phys_per_row * a->tma_rows);
        if (*smem > kMaxSmem || tma_blocks_per_sm<kPair, kNorm>(*smem) < 1) return false;
    }
    return true;
}

template <bool kPair>
static bool q8_tma_fits(GpuCtx *g, Q8Args a) {
    size_t smem;
    return a.norm_w ? tma_plan<kPair, true>(g, &a, &smem) : tma_plan<kPair, false>(g, &a, &smem);
}

template <bool kPair, bool kNorm>
static void launch_q8_tma_norm(GpuCtx *g, Q8Args a) {
    size_t smem = 0;
    tma_plan<kPair, kNorm>(g, &a, &smem);   // the caller checked that it fits
    launch(g, "q8_gemv_tma_kernel", q8_gemv_tma_kernel<kPair, kNorm>, dim3(assign_blocks(&a, a.tma_rows, kPair)),
           dim3(kTmaThreads), smem, a);
}
template <bool kPair>
static void launch_q8_tma(GpuCtx *g, const Q8Args &a) {
    if (a.norm_w) launch_q8_tma_norm<kPair, true>(g, a);
    else launch_q8_tma_norm<kPair, false>(g, a);
}

// The register-fed kernel (any GPU, any M, any group size).
template <bool kPair>
static void launch_q8_simt(GpuCtx *g, const Q8Args &a) {
    if (a.group_shift >= 0) launch_q8_tokens<true, kPair>(g, a);
    else launch_q8_tokens<false, kPair>(g, a);
}

