// sampling.cuh: the token of each row of logits, on the device, kernels then launchers.
//   argmax_kernel (gpu_argmax, gpu_argmax_rows, gpu_argmax_launch/fetch/wait: greedy, and the
//     pipelined decode that feeds the next step's input on the device)
//   sample_kernel (gpu_sample_rows): llama2.c's top-p and multinomial draws
namespace {

// The greedy token of the step at position pos fed on: the next step's input (token inputs[1] at
// position inputs[0]), and into mapped host memory as one 8-byte store, so that the host sees its
// position's mark and the token together (gpu_step_token_wait).
__device__ __forceinline__ void feed_step_token(int *inputs, unsigned long long *host_slots, int pos, int token) {
    inputs[0] = pos + 1, inputs[1] = token;
    const unsigned long long word = (unsigned long long)(unsigned)(pos + 1) << 32 | (unsigned)token;
    asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(host_slots + (pos & 1)), "l"(word) : "memory");
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
// took 32. Unaligned rows and the tail past n / 4 * 4:
// plain loads. Then the warps' bests meet. feed (one row only; else NULL): the result also becomes
// the next step's input, token inputs[1] at position inputs[0] + 1, so that greedy decode steps can
// be queued before the host has read the token, and goes to the host's slot of its position in
// feed, (position + 1) << 32 | token (gpu_step_token_wait), without a copy in the stream.
constexpr int kArgmaxThreads = 1024, kArgmaxBatch = 8;
static_assert(kArgmaxThreads == 32 * 32, "argmax_kernel: its warps' bests are one warp's lanes");
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(int *result, int *inputs, unsigned long long *feed, const float *__restrict__ v,
                                                                int n) {
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
        if (feed) feed_step_token(inputs, feed, inputs[0], *result);
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
// (Returning false whenever s did not exceed target sent a coin within rounding of a token's
// boundary to the nucleus's last token, far from it: bench/NOTES.md 33.)
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
    // v > 0: the search's sum from v exceeds target, so the crossing is among v's tokens even where
    // s, summed in another order, falls within rounding of target (then the last of them); v = 0:
    // the whole row does not exceed target.
    return value > 0.0f;
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

}  // namespace

extern "C" void gpu_argmax_launch(GpuCtx *g, const float *v, int n, int feed) {
    launch(g, "argmax_kernel", argmax_kernel, dim3(1), dim3(kArgmaxThreads), 0, g->argmax, g->inputs, feed ? g->step_tokens_dev : NULL, v,
           n);
}

// The first rows results of the argmax kernels queued, waited for.
static void argmax_results(GpuCtx *g, int rows, int *out) {
    CUDA_CHECK(cudaMemcpyAsync(g->argmax_rows_host, g->argmax, rows * sizeof(int), cudaMemcpyDeviceToHost, g->stream));
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    memcpy(out, g->argmax_rows_host, rows * sizeof(int));
}

extern "C" void gpu_argmax_rows(GpuCtx *g, const float *v, int rows, int n, int *out) {
    if (rows < 1 || rows > kMaxArgmaxRows) {
        fprintf(stderr, "run: argmax of %d rows (1 to %d)\n", rows, kMaxArgmaxRows);
        exit(1);
    }
    launch(g, "argmax_kernel", argmax_kernel, dim3(rows), dim3(kArgmaxThreads), 0, g->argmax, g->inputs, (unsigned long long *)NULL, v, n);
    argmax_results(g, rows, out);
}

extern "C" int gpu_argmax_result(GpuCtx *g) {
    int token;
    argmax_results(g, 1, &token);
    return token;
}

// No step's token in either slot (before a generation's first step is queued: a slot's old word
// would otherwise pass for a later step at the same position).
extern "C" void gpu_step_tokens_clear(GpuCtx *g) { g->step_tokens[0] = g->step_tokens[1] = 0; }

// The token of the greedy step at position pos (argmax_kernel with feed, or mk_step_argmax), read
// from mapped host memory as it lands, without a copy or an event in the stream; the stream is
// asked now and then whether it failed or ran dry without it.
extern "C" int gpu_step_token_wait(GpuCtx *g, int pos) {
    const volatile unsigned long long *slot = g->step_tokens + (pos & 1);
    for (unsigned spins = 1;; spins++) {
        const unsigned long long word = *slot;
        if ((unsigned)(word >> 32) == (unsigned)(pos + 1)) return (int)(unsigned)word;
        if (spins % 4096) continue;
        const cudaError_t e = cudaStreamQuery(g->stream);
        if (e == cudaErrorNotReady) continue;
        CUDA_CHECK(e);
        if ((unsigned)(*slot >> 32) == (unsigned)(pos + 1)) continue;   // landed just before the stream drained
        fprintf(stderr, "run: the decode step at position %d ended without its token\n", pos);
        exit(1);
    }
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
