// dequant.cuh: INT8 -> FP32, dense: the --unfused baseline's first step (then cuBLAS), and a test
// of the scales' layout on its own.
//   dequant_kernel, launch_dequant
namespace {

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

}  // namespace

static void launch_dequant(GpuCtx *g, float *dst, const Mat *w) {
    const size_t words = (size_t)w->rows * (w->stride / 4);
    launch(g, "dequant_kernel", dequant_kernel, dim3(ceil_div_i(words, 256)), dim3(256), 0, dst, w->rows, w->cols, w->stride,
           w->groups, w->gs, w->q, w->s);
}
