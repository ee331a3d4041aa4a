// linear.cuh: a linear layer on the kernel engine/dispatch.c chose (kernels.h LinearKernel).
//   gpu_linear_name, gpu_linear_fits, gpu_linear
//   matmul_f32, matmul_f16, matmul_q8_unfused   the cuBLAS baselines (FP32, --fp16, --unfused)

// Row-major y (M, N) = x (M, K) W^T is, column-major, y^T (N, M) = W_cm^T (N, K) x^T (K, M),
// where W_cm is W read column-major: (K, N) with leading dimension ldw.
static void matmul_f32(GpuCtx *g, float *y, const float *x, int M, const float *W, int N, int K, int ldw, int accumulate) {
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    if (M == 1) CUBLAS_CHECK(cublasSgemv(g->blas, CUBLAS_OP_T, K, N, &one, W, ldw, x, 1, &beta, y, 1));
    else CUBLAS_CHECK(cublasSgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, W, ldw, x, K, &beta, y, N));
}

// FP16 weights (N, K) dense, resident: the baseline a user without quantization runs. x is
// converted to FP16 first (cuBLAS takes one input type); FP32 accumulation and output.
static void matmul_f16(GpuCtx *g, float *y, const float *x, int M, const void *W, int N, int K, int accumulate) {
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    launch(g, "float_to_half_kernel", float_to_half_kernel, dim3(ceil_div_i((long long)M * K, 256)), dim3(256), 0, g->x_half,
           x, M * K);
    CUBLAS_CHECK(cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, W, CUDA_R_16F, K, g->x_half, CUDA_R_16F, K,
                              &beta, y, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The weight dequantized into the FP32 scratch, then cuBLAS: the unfused baseline.
static void matmul_q8_unfused(GpuCtx *g, float *y, const float *x, int M, const Mat *w, int accumulate) {
    launch_dequant(g, g->scratch, w);
    matmul_f32(g, y, x, M, g->scratch, w->rows, w->cols, w->cols, accumulate);
}

extern "C" const char *gpu_linear_name(LinearKernel k) {
    switch (k) {
    case LINEAR_GEMV: return "register-fed GEMV";
    case LINEAR_GEMV_TALL: return "register-fed GEMV (tall)";
    case LINEAR_GEMV_COPY: return "copy-engine GEMV";
    case LINEAR_MMA: return "mma.sync";
    case LINEAR_WGMMA: return "wgmma";
    case LINEAR_DEQUANT_SGEMM: return "dequant + cuBLAS FP32";
    case LINEAR_SGEMM: return "cuBLAS FP32";
    case LINEAR_HGEMM: return "cuBLAS FP16";
    default: return "?";
    }
}

// The GEMV kernels' arguments for a call: one output, q k v with biases, RoPE and the KV store,
// or w1 and w3 (pair mode).
static Q8Args linear_q8_args(const GpuCtx *g, const LinearCall *c) {
    const int n = c->form == LINEAR_PLAIN ? 1 : c->form == LINEAR_QKV_ROPE ? 3 : 2;
    float *y[3] = {c->y, NULL, NULL};
    Q8Args a = q8_args(c->x, c->M, n, c->w, y, c->form == LINEAR_PLAIN && c->accumulate);
    a.norm_w = c->norm_w, a.norm_eps = c->norm_eps;
    if (c->form != LINEAR_QKV_ROPE) return a;
    const QkvRope *r = &c->qkv;
    a.rope = (RopeStore){g->inputs, r->rope_freq, {r->bias[0], r->bias[1], r->bias[2]}, r->key_cache, r->value_cache,
                         r->head_size, r->kv_half, r->seq_stride};
    return a;
}

// The shapes a form needs: one K and group size for q, k and v; w1 and w3 of one shape.
static bool form_consistent(const LinearCall *c) {
    const int n = c->form == LINEAR_PLAIN ? 1 : c->form == LINEAR_QKV_ROPE ? 3 : 2;
    for (int j = 1; j < n; j++)
        if (!c->w[j] || !c->w[j]->q || c->w[j]->cols != c->w[0]->cols || c->w[j]->gs != c->w[0]->gs) return false;
    return c->form != LINEAR_SWIGLU || c->w[1]->rows == c->w[0]->rows;
}

extern "C" int gpu_linear_fits(GpuCtx *g, LinearKernel k, const LinearCall *c) {
    const Mat *w = c->w[0];
    const bool plain = c->form == LINEAR_PLAIN, q8 = w->q != NULL;
    if (c->M < 1 || (!plain && !(k == LINEAR_GEMV || k == LINEAR_GEMV_COPY))) return 0;
    if (q8 && !form_consistent(c)) return 0;
    switch (k) {
    case LINEAR_GEMV: return q8;
    case LINEAR_GEMV_TALL: return q8 && plain && c->M == 1 && group_shift(w->gs) >= 0;
    case LINEAR_GEMV_COPY: {
        if (!q8) return 0;
        const Q8Args a = linear_q8_args(g, c);
        return c->form == LINEAR_SWIGLU ? q8_tma_fits<true>(g, a) : q8_tma_fits<false>(g, a);
    }
    case LINEAR_MMA: return q8 && plain && tc_fits(g, w, c->M, false);
    case LINEAR_WGMMA: return q8 && plain && tc_fits(g, w, c->M, true);
    case LINEAR_DEQUANT_SGEMM: return q8 && plain && (size_t)w->rows * w->cols <= g->scratch_floats;
    case LINEAR_SGEMM: return w->f && plain;
    case LINEAR_HGEMM: return w->h && plain && (size_t)c->M * w->cols <= g->half_floats;
    default: return 0;
    }
}

extern "C" void gpu_linear(GpuCtx *g, LinearKernel k, const LinearCall *c) {
    const Mat *w = c->w[0];
    if (!gpu_linear_fits(g, k, c)) {
        fprintf(stderr, "run: internal error: the %s kernel cannot serve a %d x %d weight (group size %d) at M = %d\n",
                gpu_linear_name(k), w->rows, w->cols, w->gs, c->M);
        exit(1);
    }
    const bool pair = c->form == LINEAR_SWIGLU;
    switch (k) {
    case LINEAR_GEMV:
        if (pair) launch_q8_simt<true>(g, linear_q8_args(g, c));
        else launch_q8_simt<false>(g, linear_q8_args(g, c));
        break;
    case LINEAR_GEMV_TALL: launch_q8<1, true, false, kRowsPerWarpTall>(g, linear_q8_args(g, c)); break;
    case LINEAR_GEMV_COPY:
        if (pair) launch_q8_tma<true>(g, linear_q8_args(g, c));
        else launch_q8_tma<false>(g, linear_q8_args(g, c));
        break;
    case LINEAR_MMA: matmul_q8_mma_sync(g, c->y, c->x, c->M, w, c->accumulate); break;
    case LINEAR_WGMMA: matmul_q8_wgmma(g, c->y, c->x, c->M, w, c->accumulate); break;
    case LINEAR_DEQUANT_SGEMM: matmul_q8_unfused(g, c->y, c->x, c->M, w, c->accumulate); break;
    case LINEAR_SGEMM: matmul_f32(g, c->y, c->x, c->M, w->f, w->rows, w->cols, w->stride, c->accumulate); break;
    case LINEAR_HGEMM: matmul_f16(g, c->y, c->x, c->M, w->h, w->rows, w->cols, c->accumulate); break;
    default: break;
    }
}
