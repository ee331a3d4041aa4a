// context.cuh: the context and device memory (host code; after the kernel files, whose kernels'
// attributes gpu_create sets).
//   gpu_probe, gpu_name, gpu_mem_info, gpu_create, gpu_destroy, gpu_set_pdl, gpu_has_sm90a
//   gpu_alloc, gpu_free, gpu_upload, gpu_download, gpu_copy, gpu_sync
//   gpu_set_inputs (the step's position and tokens), gpu_graph_* (capture and replay)

// Why there is no usable GPU: no driver at all (a machine without an NVIDIA GPU), no device, or a
// driver older than this build's runtime.
extern "C" int gpu_probe(char *why) {
    int n = 0, driver = 0, runtime = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    cudaGetLastError();
    if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
        snprintf(why, ERR_LEN, "no NVIDIA GPU driver was found");
        return -1;
    }
    if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0)) {
        snprintf(why, ERR_LEN, "no NVIDIA GPU was found");
        return -1;
    }
    CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    if (e == cudaErrorInsufficientDriver || driver < runtime) {
        snprintf(why, ERR_LEN, "the driver supports CUDA %d.%d, this build needs %d.%d", driver / 1000, driver % 1000 / 10,
                 runtime / 1000, runtime % 1000 / 10);
        return -1;
    }
    if (e != cudaSuccess) {
        snprintf(why, ERR_LEN, "no usable CUDA device: %s", cudaGetErrorString(e));
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
    CUDA_CHECK(cudaHostAlloc(&g->step_tokens, 2 * sizeof(unsigned long long), cudaHostAllocMapped));
    CUDA_CHECK(cudaHostGetDevicePointer((void **)&g->step_tokens_dev, g->step_tokens, 0));
    gpu_step_tokens_clear(g);
    CUDA_CHECK(cudaMallocHost(&g->argmax_rows_host, kMaxArgmaxRows * sizeof(int)));
    CUDA_CHECK(cudaMallocHost(&g->inputs_host, (1 + kMaxTokens) * sizeof(int)));
    CUDA_CHECK(cudaEventCreateWithFlags(&g->inputs_copied, cudaEventDisableTiming));
    g->half_floats = half_floats;
    if (half_floats) CUDA_CHECK(cudaMalloc(&g->x_half, half_floats * sizeof(__half)));
    CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
    CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
    if (sm90a_available()) {   // the kernels that take more than 48 KB of shared memory
        CUDA_CHECK(cudaFuncSetAttribute(q8_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kWgSmem));
        CUDA_CHECK(cudaFuncSetAttribute(q8_gemv_tma_kernel<false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
        CUDA_CHECK(cudaFuncSetAttribute(q8_gemv_tma_kernel<false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
        CUDA_CHECK(cudaFuncSetAttribute(q8_gemv_tma_kernel<true, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
        CUDA_CHECK(cudaFuncSetAttribute(q8_gemv_tma_kernel<true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
    }
    g->pdl = 1;
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&g->sms, cudaDevAttrMultiProcessorCount, dev));
    return g;
}

extern "C" void gpu_destroy(GpuCtx *g) {
    if (!g) return;
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    CUDA_CHECK(cudaFree(g->scratch));
    CUDA_CHECK(cudaFree(g->inputs));
    CUDA_CHECK(cudaFree(g->blas_workspace));
    CUDA_CHECK(cudaFree(g->argmax));
    CUDA_CHECK(cudaFreeHost(g->step_tokens));
    CUDA_CHECK(cudaFreeHost(g->argmax_rows_host));
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

extern "C" void gpu_set_pdl(GpuCtx *g, int on) { g->pdl = on; }

extern "C" int gpu_has_sm90a(void) { return sm90a_available(); }

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

