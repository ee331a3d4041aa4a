// attention.cuh: RoPE with the KV store, and attention over the KV cache (FP16 or FP32 elements),
// kernels then launchers.
//   rope_store_kernel (gpu_rope_store)                 biases, RoPE and the KV store, where the QKV
//                                                      GEMV's epilogue does not
//   attention_kernel, attention_combine_kernel         split along the sequence (flash-decoding),
//     (gpu_attention, gpu_attention_part_floats)       the splits' partial softmaxes then combined
namespace {

// KV cache elements: FP16 (default) or FP32; loads return floats.
__device__ __forceinline__ void kv_store(float *p, float v) { *p = v; }
__device__ __forceinline__ void kv_store(__half *p, float v) { *p = __float2half_rn(v); }
// Loads of the cache go through L2 (ld.global.cg), never a possibly stale L1 line: in the
// megakernel (megakernel.cuh) other SMs write the step's own rows while the kernel runs.
__device__ __forceinline__ float2 kv_load2(const float *p) { return __ldcg(reinterpret_cast<const float2 *>(p)); }
__device__ __forceinline__ float2 kv_load2(const __half *p) {
    const unsigned int raw = __ldcg(reinterpret_cast<const unsigned int *>(p));
    return __half22float2(*reinterpret_cast<const __half2 *>(&raw));
}
// q . k over 16 bytes of k: 4 FP32 or 8 FP16 elements (16-byte aligned).
__device__ __forceinline__ float dot_16_bytes(const float *qs, const float *k) {
    const float4 v = __ldcg(reinterpret_cast<const float4 *>(k));
    return qs[0] * v.x + qs[1] * v.y + qs[2] * v.z + qs[3] * v.w;
}
__device__ __forceinline__ float dot_16_bytes(const float *qs, const __half *k) {
    const uint4 raw = __ldcg(reinterpret_cast<const uint4 *>(k));
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

// The pair (v[i], v[i + 1]) plus the bias's pair (none where bias is NULL).
__device__ __forceinline__ float2 biased_pair(const float *v, const float *bias, int i) {
    float2 p = make_float2(v[i], v[i + 1]);
    if (bias) p.x += __ldg(bias + i), p.y += __ldg(bias + i + 1);
    return p;
}
// A pair rotated by the angle whose cosine and sine are cs and sn.
__device__ __forceinline__ float2 rotated(float2 p, float cs, float sn) {
    return make_float2(p.x * cs - p.y * sn, p.x * sn + p.y * cs);
}

// Biases, RoPE and the KV store (QkvRope) on q (M, q_dim), k and v (M, kv_dim), token m at
// position pos + m (r.seq_stride 0; else token m is sequence m's, at pos, in caches seq_stride
// elements after sequence m - 1's), one thread per pair: q's pair biased and rotated in place,
// k's and v's into cache row pos. pos: inputs[0].
template <typename KV>
__global__ void rope_store_kernel(float *q, float *k, const float *__restrict__ v, const QkvRope r,
                                  const int *__restrict__ inputs, int q_dim, int kv_dim) {
    pdl_wait_then_release();
    const int i = 2 * (blockIdx.x * blockDim.x + threadIdx.x), m = blockIdx.y, pos = inputs[0] + (r.seq_stride ? 0 : m);
    if (i >= q_dim) return;
    float sn, cs;
    sincosf(pos * __ldg(r.rope_freq + i % r.head_size / 2), &sn, &cs);
    float *qm = q + (size_t)m * q_dim;
    const float2 qr = rotated(biased_pair(qm, r.bias[0], i), cs, sn);
    qm[i] = qr.x, qm[i + 1] = qr.y;
    if (i >= kv_dim) return;
    const float2 kr = rotated(biased_pair(k + (size_t)m * kv_dim, r.bias[1], i), cs, sn);
    const float2 vr = biased_pair(v + (size_t)m * kv_dim, r.bias[2], i);
    const size_t at = m * r.seq_stride + (size_t)pos * kv_dim + i;
    KV *kc = static_cast<KV *>(r.key_cache), *vc = static_cast<KV *>(r.value_cache);
    kv_store(kc + at, kr.x), kv_store(kc + at + 1, kr.y);
    kv_store(vc + at, vr.x), kv_store(vc + at + 1, vr.y);
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
        const uint4 r = __ldcg(reinterpret_cast<const uint4 *>(p));
        u.w[0] = r.x, u.w[1] = r.y, u.w[2] = r.z, u.w[3] = r.w;
    } else if constexpr (KvUnit<KV, kElems>::kWords == 2) {
        const uint2 r = __ldcg(reinterpret_cast<const uint2 *>(p));
        u.w[0] = r.x, u.w[1] = r.y;
    } else {
        u.w[0] = __ldcg(reinterpret_cast<const unsigned int *>(p));
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
                                               int hs, int threads) {
    const int units = hs / kElems, groups = threads / units, g = threadIdx.x / units, u = threadIdx.x % units;
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
// spread it over 4x the blocks (bench/NOTES.md 28). Prefill keeps 256: there every token's splits
// are blocks too, and finer splits were slower.
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
    const int groups = head_size % kPer16 == 0
                           ? weighted_values<KV, kPer16>(vacc, att, vc + kv_off, kv_dim, t0, t1, head_size, blockDim.x)
                           : weighted_values<KV, 2>(vacc, att, vc + kv_off, kv_dim, t0, t1, head_size, blockDim.x);
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
// times, each walk a chain of dependent loads; bench/NOTES.md 28.)
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


}  // namespace

extern "C" void gpu_rope_store(GpuCtx *g, float *q, float *k, const float *v, int M, int q_dim, int kv_dim, const QkvRope *r) {
    dim3 grid(ceil_div_i(q_dim / 2, 128), M);
    if (r->kv_half)
        launch(g, "rope_store_kernel", rope_store_kernel<__half>, grid, dim3(128), 0, q, k, v, *r, (const int *)g->inputs,
               q_dim, kv_dim);
    else
        launch(g, "rope_store_kernel", rope_store_kernel<float>, grid, dim3(128), 0, q, k, v, *r, (const int *)g->inputs,
               q_dim, kv_dim);
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
