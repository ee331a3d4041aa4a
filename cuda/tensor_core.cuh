// tensor_core.cuh: the fused INT8 GEMMs on the tensor cores (batches of tokens: prefill, --batch),
// kernels then launchers.
//   q8_mma_kernel       mma.sync m16n8k16, x in FP16, W int8 converted exactly in registers
//   x_to_tiles_kernel   x as FP16 tiles in wgmma's swizzled layout
//   q8_wgmma_kernel     wgmma m64n128k16 (sm_90a): W as the A operand from registers, x tiles by
//                       bulk copy through a 5-stage shared-memory ring
//   tc_fits, matmul_q8_mma_sync, matmul_q8_wgmma
namespace {

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
// blockIdx.y + gridDim.y, ...: no slower than one block per row block, faster on the tallest
// shape at small M (bench/NOTES.md 13).
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

}  // namespace

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

// Whether the tensor-core kernels take w with M tokens: INT8 weights whose groups hold whole 64-wide
// steps, rows within grid.y's 65535 row blocks of 16, and x (either kernel's layout) within the
// FP16 scratch; wgmma also needs sm_90a.
static bool tc_fits(const GpuCtx *g, const Mat *w, int M, bool wgmma) {
    const size_t x_half_need = (size_t)round_up(M, kWgTokens) * round_up(w->cols, kMmaStep);
    return w->q && w->gs % kMmaStep == 0 && w->rows <= 65535 * 16 && x_half_need <= g->half_floats &&
           (!wgmma || sm90a_available());
}

static void matmul_q8_mma_sync(GpuCtx *g, float *y, const float *x, int M, const Mat *w, int accumulate) {
    launch(g, "float_to_half_kernel", float_to_half_kernel, dim3(ceil_div_i((long long)M * w->cols, 256)), dim3(256), 0,
           g->x_half, x, M * w->cols);
    const Q8MmaArgs a = {w->q, w->s, g->x_half, y, M, w->rows, w->cols, w->stride, w->groups, w->gs, accumulate};
    // over 32 tokens: blocks of 32 side by side, faster than one block of all the tokens per row
    // block (NOTES 17)
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

