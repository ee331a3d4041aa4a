// common.cuh: what every kernel file shares (included first by kernels.cu).
//   cuda_check, cublas_check (CUDA_CHECK, CUBLAS_CHECK)   every call checked: file, line, exit 1
//   GpuCtx, GpuGraph                                      the context: stream, cuBLAS, scratch, inputs
//   sm90a_available                                       whether the sm_90a kernels can run
//   warp_sum, warp_max, block_reduce                      reductions
//   SmallDiv, small_div_inverse                           c / d for small c and d without a division
//   pdl_wait, pdl_release                                 programmatic dependent launch
//   prefetch_l2, load_stream, int8x4_to_float             weight streaming and int8 conversion
//   cp_async_*, mbar_*, bulk_copy                         asynchronous copies into shared memory
//   launch                                                every launch: PDL attribute, checked

static inline void cuda_check(cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "run: CUDA error %s (%s) in %s at %s:%d\n", cudaGetErrorName(e), cudaGetErrorString(e), what, file, line);
    exit(1);
}
static inline void cublas_check(cublasStatus_t s, const char *what, const char *file, int line) {
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
    int *argmax_rows_host;   // (kMaxArgmaxRows) pinned: the argmax's results as the host reads them
    unsigned long long *step_tokens;   // (2) pinned and mapped: the greedy token of the step at position p,
                                       // (p + 1) << 32 | token, in slot p % 2 (gpu_step_token_wait)
    unsigned long long *step_tokens_dev;   // the same memory, as the device addresses it
    int *inputs_host;        // pinned staging for inputs; reused once inputs_copied has passed
    cudaEvent_t inputs_copied;
    __half *x_half;          // (half_floats) activations converted to FP16 (tensor cores, --fp16)
    size_t half_floats;
    int pdl;                 // launch with programmatic dependent launch allowed
    int sms;                 // the GPU's multiprocessors
};

struct GpuGraph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

// The copy-engine GEMV and the wgmma kernel need sm_90a machine code, which this build carries
// for compute capability 9.0 only.
static inline bool sm90a_available(void) {
    static int available = -1;
    if (available < 0) {
        int dev = 0, major = 0, minor = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        available = major == 9 && minor == 0;
    }
    return available;
}

namespace {

constexpr int kMaxTokens = 4096;     // token ids a step's inputs hold
constexpr int kMaxArgmaxRows = 64;   // gpu_argmax_rows: a --batch's sequences
constexpr size_t kBlasWorkspace = 32u << 20;
constexpr int kMaxSmem = 200 * 1024; // dynamic shared memory a block may ask for (H200: 227 KB)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The threads that work together on a piece of work: the whole block (kThreads = 0), or its
// first kThreads (a whole number of warps), which meet at named barrier 1 (the megakernel's
// consumers, while its producer warps go on).
template <int kThreads>
struct Team {
    __device__ static int size() { return kThreads ? kThreads : blockDim.x; }
    __device__ static void sync() {
        if constexpr (kThreads > 0) asm volatile("bar.sync 1, %0;" ::"n"(kThreads) : "memory");
        else __syncthreads();
    }
};

// Sum (or max) over the team (by default the block); every thread of it gets the result. red: 32
// floats of shared memory.
template <bool kMax, int kThreads = 0>
__device__ float block_reduce(float v, float *red) {
    using T = Team<kThreads>;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = T::size() / 32;
    v = kMax ? warp_max(v) : warp_sum(v);
    T::sync();   // red may still be read by a previous call
    if (lane == 0) red[warp] = v;
    T::sync();
    v = lane < n_warps ? red[lane] : (kMax ? -INFINITY : 0.0f);
    return kMax ? warp_max(v) : warp_sum(v);
}

// 1.5 x 2^23 (bits 0x4B400000): t + kRoundMagic is t rounded to the nearest integer (ties to
// even, as rintf) for |t| < 2^22, held in the sum's low mantissa bits, and the sum less
// kRoundMagic is that integer as a float, exactly. Adds in place of the conversion instructions
// (FRND, F2I, I2F), which issue at an eighth of an add's rate (bench/NOTES.md 62, 163).
constexpr float kRoundMagic = 12582912.0f;
// t (|t| < 2^22) rounded by those adds: the integer as a float, and its low byte (as the integer's
// two's complement has it), which is the sum's.
struct RoundedByAdds {
    float value;
    uint32_t low_byte;
};
__device__ __forceinline__ RoundedByAdds round_by_adds(float t) {
    const float sum = __fadd_rn(t, kRoundMagic);
    return {__fsub_rn(sum, kRoundMagic), __float_as_uint(sum) & 0xffu};
}

// c / d by the reciprocal, exact for c and d below 2^12: (c + 1/2) / d lies at least 1 / (2 d) from
// an integer, and the two roundings move it by under 2^-22 of itself (tests/test_run.c checks every
// pair below 2^12 on the GPU; a larger d than c gives 0). A division at run time is a chain of a
// dozen integer instructions (bench/NOTES.md 120, 124, 142).
// The reciprocal can also come from the host (small_div_inverse: the same value, 1 / d rounded
// to nearest in both), so that a kernel's constant divisors cost it no reciprocal of its own.
struct SmallDiv {
    float inv;
    __device__ explicit SmallDiv(int d) : inv(0.0f) { inv = __frcp_rn((float)d); }
    __device__ explicit SmallDiv(float inv_d) : inv(inv_d) {}   // inv_d: small_div_inverse(d)
    __device__ int operator()(int c) const { return (int)(((float)c + 0.5f) * inv); }
};
static __host__ __device__ inline float small_div_inverse(int d) { return 1.0f / (float)d; }

// 1 / rms of n values whose squares sum to sumsq, eps added to the mean square: rmsnorm_kernel's
// factor (and the CPU's).
__device__ __forceinline__ float inv_rms_of(float sumsq, int n, float eps) { return 1.0f / sqrtf(sumsq / n + eps); }

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
// A barrier whose phase completes after `arrivals` arrivals (and the bytes they expect).
__device__ __forceinline__ void mbar_init(uint32_t bar, int arrivals = 1) {
#if WG_SM90A
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
#endif
}
// One arrival, no bytes.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if WG_SM90A
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
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
// The same with an L2 eviction policy (createpolicy's 64-bit descriptor: l2_policy).
__device__ __forceinline__ void bulk_copy_counted_hint(uint32_t dst, const void *src, int bytes, uint32_t bar, uint64_t policy) {
#if WG_SM90A
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(policy) : "memory");
#endif
}
// A policy for all the bytes a copy reads: evict_first (first to leave L2), else evict_normal (as
// with no hint).
__device__ __forceinline__ uint64_t l2_policy(bool evict_first) {
    uint64_t policy = 0;
#if WG_SM90A
    if (evict_first) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    else asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
#endif
    return policy;
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
