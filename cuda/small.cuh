// small.cuh: the rest of the forward pass's small kernels, then their launchers.
//   embed_kernel (gpu_embed), rmsnorm_kernel (gpu_rmsnorm), swiglu_kernel (gpu_swiglu),
//   to_half_kernel (gpu_to_half: the --fp16 baseline's weights), float_to_half_kernel (x for
//   the tensor cores and cuBLAS FP16)
namespace {

// x (M, dim) = embedding rows of tokens; INT8 rows are dequantized, FP32 rows copied.
// tokens: the step's inputs (position first, then the ids).
__global__ void embed_kernel(float *__restrict__ x, const int *__restrict__ inputs, int dim, int stride, int groups,
                             int gs, const int8_t *__restrict__ q, const float *__restrict__ s, const float *__restrict__ f) {
    pdl_wait_then_release();
    const size_t row = (size_t)inputs[1 + blockIdx.x];
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        x[(size_t)blockIdx.x * dim + j] = f ? f[row * stride + j] : q[row * stride + j] * s[row * groups + j / gs];
}

// out = w * in / rms(in), eps added to the mean square; one block per row of n.
__global__ void rmsnorm_kernel(float *__restrict__ out, const float *__restrict__ in, const float *__restrict__ w, int n,
                               float eps) {
    __shared__ float red[32];
    pdl_wait_then_release();
    const float *x = in + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) ss += x[j] * x[j];
    ss = block_reduce<false>(ss, red);
    const float scale = inv_rms_of(ss, n, eps);
    for (int j = threadIdx.x; j < n; j += blockDim.x) out[(size_t)blockIdx.x * n + j] = w[j] * (scale * x[j]);
}

__global__ void swiglu_kernel(float *h, const float *__restrict__ g, int n) {
    pdl_wait_then_release();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = h[i];
        h[i] = v * (1.0f / (1.0f + expf(-v))) * g[i];
    }
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

}  // namespace

extern "C" void gpu_to_half(GpuCtx *g, void *dst, const Mat *w) {
    launch(g, "to_half_kernel", to_half_kernel, dim3(ceil_div_i((long long)w->rows * w->cols, 256)), dim3(256), 0,
           (__half *)dst, w->rows, w->cols, w->stride, w->groups, w->gs, w->q, w->s, w->f);
}

extern "C" void gpu_embed(GpuCtx *g, float *x, int M, const Mat *emb) {
    launch(g, "embed_kernel", embed_kernel, dim3(M), dim3(256), 0, x, (const int *)g->inputs, emb->cols, emb->stride,
           emb->groups, emb->gs, emb->q, emb->s, emb->f);
}

extern "C" void gpu_rmsnorm(GpuCtx *g, float *out, const float *in, const float *w, int M, int n, float eps) {
    launch(g, "rmsnorm_kernel", rmsnorm_kernel, dim3(M), dim3(256), 0, out, in, w, n, eps);
}

extern "C" void gpu_swiglu(GpuCtx *g, float *h, const float *gate, int n) {
    launch(g, "swiglu_kernel", swiglu_kernel, dim3(ceil_div_i(n, 256)), dim3(256), 0, h, gate, n);
}
