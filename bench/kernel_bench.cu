// kernel_bench.cu: one linear layer at M = 1 on Llama-2-7B and TinyLlama shapes, through every
// path the engine has and the references it is judged against:
//   fused     the kernel the engine's dispatch picks at M = 1 (the copy-engine GEMV on sm_90a):
//             int8 + scales read once, dequantized in registers, launched plainly (each launch
//             waits for the last to end), as the read kernel is
//   +PDL      the same with programmatic dependent launch, as the engine runs it: a launch starts
//             and prefetches its first weight bytes while the one before drains
//   read      a pure streaming read of the same weight and scale bytes (16-byte loads), one kernel
//   fp16      cuBLAS GemmEx on resident FP16 weights (what a user runs without quantization)
//   fp32      cuBLAS SGEMV on resident FP32 weights
//   unfused   LINEAR_DEQUANT_SGEMM: dequant kernel to FP32 scratch, then SGEMV
//   reg-fed   the engine's pick without the copy engine (the register-fed GEMV, its tall instance
//             from the dispatch's row threshold)
// Each variant cycles through enough copies of its weights that L2 (60 MB) serves none of them;
// times are the median over 15 runs of 40 back-to-back launches (CUDA events), random data.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

extern "C" {
#include "dispatch.h"
}
#include "testing.h"

static void ck(cudaError_t e, const char *what) {
    if (e != cudaSuccess) { fprintf(stderr, "kernel_bench: %s: %s\n", what, cudaGetErrorString(e)); exit(1); }
}
#define CK(call) ck((call), #call)
#define CB(call) do { cublasStatus_t s_ = (call); if (s_ != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "%s: %d\n", #call, (int)s_); exit(1); } } while (0)

// Fills n bytes with a hash of the index: random-looking, reproducible, never all zero.
__global__ void fill_random(uint32_t *p, size_t n_words, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_words; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 0x9E3779B1u ^ seed;
        h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12, h *= 0x297A2D39u, h ^= h >> 15;
        p[i] = h;
    }
}
// Turns random words into floats in [-0.5, 0.5) (scales, activations) or halves.
__global__ void words_to_float(float *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (reinterpret_cast<uint32_t *>(p)[i] >> 8) / 16777216.0f - 0.5f;
}
__global__ void float_to_half(__half *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) dst[i] = __float2half(src[i]);
}

// The pure read: every 16-byte word once, xor-folded so the loads cannot be dropped.
__global__ void read_kernel(const int4 *__restrict__ p, size_t n16, int *sink) {
    int acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x) {
        int4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x7fffffff) *sink = acc;   // practically never; keeps the loads
}

static void *dev_random(size_t bytes, uint32_t seed) {
    void *p;
    CK(cudaMalloc(&p, bytes));
    fill_random<<<1024, 256>>>((uint32_t *)p, bytes / 4, seed);
    CK(cudaGetLastError());
    return p;
}
static float *dev_floats(size_t n, uint32_t seed) {
    float *p = (float *)dev_random(n * 4, seed);
    words_to_float<<<1024, 256>>>(p, n);
    CK(cudaGetLastError());
    return p;
}

typedef void (*LaunchFn)(int copy, void *ctx);

// Median microseconds of one launch: 15 runs of 40 launches, each launch on the next copy.
static double time_us(LaunchFn fn, void *ctx, int copies, cudaStream_t st) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a)), CK(cudaEventCreate(&b));
    for (int i = 0; i < 20; i++) fn(i % copies, ctx);
    std::vector<double> runs;
    int c = 0;
    for (int r = 0; r < 15; r++) {
        CK(cudaEventRecord(a, st));
        for (int i = 0; i < 40; i++) fn(c++ % copies, ctx);
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        runs.push_back(ms * 1000.0 / 40);
    }
    std::sort(runs.begin(), runs.end());
    CK(cudaEventDestroy(a)), CK(cudaEventDestroy(b));
    return runs[runs.size() / 2];
}

struct Case {
    GpuCtx *g;
    cublasHandle_t blas;
    cudaStream_t stream;
    int N, K, sms;
    std::vector<Mat> q8;
    std::vector<float *> f32;
    std::vector<__half *> f16;
    float *x, *y;
    __half *x16, *y16;
    int *sink;
};

// One of the engine's linear calls (M tokens, y = x W^T) on kernel k.
static void linear(GpuCtx *g, LinearKernel k, float *y, const float *x, int M, const Mat *w) {
    LinearCall c = {};
    c.form = LINEAR_PLAIN, c.M = M, c.x = x, c.w[0] = w, c.y = y;
    gpu_linear(g, k, &c);
}
// The kernel the engine's dispatch picks for y = x W^T at M tokens, with the copy-engine GEMV
// allowed (tma 1) or not.
static LinearKernel engine_kernel(GpuCtx *g, const Mat *w, int M, int tma) {
    GpuOptions opt = GPU_DEFAULTS;
    opt.tma_gemv = tma;
    LinearCall c = {};
    c.form = LINEAR_PLAIN, c.M = M, c.w[0] = w;
    return choose_linear(g, &opt, &c);
}
static LinearKernel fused_kernel, regfed_kernel;   // the M = 1 columns' kernels, per shape
static void run_fused(int c, void *p) { Case *k = (Case *)p; linear(k->g, fused_kernel, k->y, k->x, 1, &k->q8[c]); }
static void run_regfed(int c, void *p) { Case *k = (Case *)p; linear(k->g, regfed_kernel, k->y, k->x, 1, &k->q8[c]); }
static int variant_r, variant_u;
static void run_variant(int c, void *p) {
    Case *k = (Case *)p;
    if (gpu_matmul_q8_variant(k->g, k->y, k->x, &k->q8[c], variant_r, variant_u)) exit(1);
}
static void run_unfused(int c, void *p) { Case *k = (Case *)p; linear(k->g, LINEAR_DEQUANT_SGEMM, k->y, k->x, 1, &k->q8[c]); }
static void run_read(int c, void *p) {
    Case *k = (Case *)p;
    // q and s of a copy are one allocation (s right after q): read both in one kernel
    size_t bytes = (size_t)k->N * k->q8[c].stride + (size_t)k->N * k->q8[c].groups * 4;
    read_kernel<<<k->sms * 8, 256, 0, k->stream>>>((const int4 *)k->q8[c].q, bytes / 16, k->sink);
    CK(cudaGetLastError());
}
static void run_fp32(int c, void *p) {
    Case *k = (Case *)p;
    Mat w = {k->N, k->K, k->K, 0, 0, k->f32[c], NULL, NULL, NULL};
    linear(k->g, LINEAR_SGEMM, k->y, k->x, 1, &w);
}
static void run_fp16(int c, void *p) {
    Case *k = (Case *)p;
    const float one = 1.0f, zero = 0.0f;
    CB(cublasGemmEx(k->blas, CUBLAS_OP_T, CUBLAS_OP_N, k->N, 1, k->K, &one, k->f16[c], CUDA_R_16F, k->K, k->x16, CUDA_R_16F,
                    k->K, &zero, k->y16, CUDA_R_16F, k->N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// --profile N K [M]: one fused and one unfused layer of that shape, once each, for Nsight Compute
// (bench/ncu.sh): no rotation, no timing.
// M > 1: also the tensor-core kernels (mma.sync, wgmma) at M tokens.
static int profile_once(int N, int K, int M, int gs) {
    Case k;
    k.N = N, k.K = K;
    k.g = gpu_create((size_t)N * K, (size_t)round_up(M, 128) * round_up(K, 64));
    int stride = (K + 15) / 16 * 16, groups = (K + gs - 1) / gs;
    size_t q_bytes = (size_t)N * stride, s_bytes = (size_t)N * groups * 4;
    int8_t *q = (int8_t *)dev_random(q_bytes + s_bytes, 7);
    float *s = (float *)(q + q_bytes);
    words_to_float<<<1024, 256>>>(s, s_bytes / 4);
    Mat m = {N, K, stride, gs, groups, NULL, q, s, NULL};
    k.x = dev_floats((size_t)M * K, 3);
    CK(cudaMalloc(&k.y, (size_t)M * N * 4));
    CK(cudaDeviceSynchronize());
    linear(k.g, engine_kernel(k.g, &m, 1, 1), k.y, k.x, 1, &m);
    linear(k.g, LINEAR_DEQUANT_SGEMM, k.y, k.x, 1, &m);
    LinearCall tc = {};
    tc.form = LINEAR_PLAIN, tc.M = M, tc.x = k.x, tc.w[0] = &m, tc.y = k.y;
    if (M > 1 && gpu_linear_fits(k.g, LINEAR_MMA, &tc)) gpu_linear(k.g, LINEAR_MMA, &tc);
    if (M > 1 && gpu_linear_fits(k.g, LINEAR_WGMMA, &tc)) gpu_linear(k.g, LINEAR_WGMMA, &tc);
    gpu_sync(k.g);
    printf("profiled %d x %d, M %d: int8 %zu bytes, scales %zu bytes\n", N, K, M, q_bytes, s_bytes);
    return 0;
}

// ----------------------------------------------------------------------------
// --across-m: one 7B layer shape at M = 1 .. 512 through every path:
//   simt      LINEAR_GEMV (register-fed, up to 8 tokens per block)
//   mma       LINEAR_MMA, mma.sync (x converted to FP16 inside, counted): the engine's at M = 2 .. 127
//   wgmma     LINEAR_WGMMA (x converted and permuted inside, counted): the engine's at M >= 128
//   deq+f32   dequant kernel to FP32 + cuBLAS SGEMM (the engine's --unfused)
//   deq+f16   dequant kernel to FP16 + cuBLAS FP16 GEMM
//   f16       cuBLAS on resident FP16 weights (x converted to FP16 inside, counted)
//   bf16      cuBLAS on resident BF16 weights (x already BF16: the GEMM alone)
//   f32       cuBLAS on resident FP32 weights
//   deq       the dequant kernel alone
//   tiled     a textbook shared-memory tiled FP32 GEMM on dequantized weights
// Rows: time (us), TFLOP/s (2 M N K / time), GB/s (the weight bytes the path reads + x + y).

// y (M, N) = x (M, K) W^T, W FP32 (N, K): 32 x 32 output tiles, 32-wide K tiles in shared memory,
// one output per thread. The kernel every CUDA course writes first.
__global__ void tiled_gemm(float *y, const float *x, const float *W, int M, int N, int K) {
    __shared__ float xs[32][33], ws[32][33];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;   // 32 x 32 threads
    const int m = blockIdx.y * 32 + ty, n = blockIdx.x * 32 + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += 32) {
        xs[ty][tx] = m < M && k0 + tx < K ? x[(size_t)m * K + k0 + tx] : 0.0f;
        const int wn = blockIdx.x * 32 + ty;
        ws[ty][tx] = wn < N && k0 + tx < K ? W[(size_t)wn * K + k0 + tx] : 0.0f;
        __syncthreads();
        for (int kk = 0; kk < 32; kk++) acc += xs[ty][kk] * ws[tx][kk];
        __syncthreads();
    }
    if (m < M && n < N) y[(size_t)m * N + n] = acc;
}

__global__ void float_to_bf16(__nv_bfloat16 *dst, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) dst[i] = __float2bfloat16(src[i]);
}

struct MCase {
    GpuCtx *g;
    cublasHandle_t blas;   // on the context's stream
    int N, K, M;
    std::vector<Mat> q8;
    std::vector<float *> f32;
    std::vector<__half *> f16;
    std::vector<__nv_bfloat16 *> bf16;
    float *x, *y, *deq32;
    __half *deq16;
    __nv_bfloat16 *x_bf16, *y_bf16_out;
};

static void m_fused(int c, void *p) { MCase *k = (MCase *)p; linear(k->g, LINEAR_GEMV, k->y, k->x, k->M, &k->q8[c]); }
static void m_mma(int c, void *p) { MCase *k = (MCase *)p; linear(k->g, LINEAR_MMA, k->y, k->x, k->M, &k->q8[c]); }
static void m_wgmma(int c, void *p) { MCase *k = (MCase *)p; linear(k->g, LINEAR_WGMMA, k->y, k->x, k->M, &k->q8[c]); }
static void m_deq32(int c, void *p) { MCase *k = (MCase *)p; linear(k->g, LINEAR_DEQUANT_SGEMM, k->y, k->x, k->M, &k->q8[c]); }
static void m_half(MCase *k, const void *h) {   // cuBLAS on FP16 weights h (N, K)
    Mat w = {k->N, k->K, k->K, 0, 0, NULL, NULL, NULL, h};
    linear(k->g, LINEAR_HGEMM, k->y, k->x, k->M, &w);
}
static void m_deq16(int c, void *p) {
    MCase *k = (MCase *)p;
    gpu_to_half(k->g, k->deq16, &k->q8[c]);
    m_half(k, k->deq16);
}
static void m_f16(int c, void *p) { MCase *k = (MCase *)p; m_half(k, k->f16[c]); }
static void m_bf16(int c, void *p) {
    MCase *k = (MCase *)p;
    const float one = 1.0f, zero = 0.0f;
    CB(cublasGemmEx(k->blas, CUBLAS_OP_T, CUBLAS_OP_N, k->N, k->M, k->K, &one, k->bf16[c], CUDA_R_16BF, k->K, k->x_bf16,
                    CUDA_R_16BF, k->K, &zero, k->y, CUDA_R_32F, k->N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
static void m_f32(int c, void *p) {
    MCase *k = (MCase *)p;
    Mat w = {k->N, k->K, k->K, 0, 0, k->f32[c], NULL, NULL, NULL};
    linear(k->g, LINEAR_SGEMM, k->y, k->x, k->M, &w);
}
static void m_deq(int c, void *p) { MCase *k = (MCase *)p; gpu_dequant(k->g, k->deq32, &k->q8[c]); }
static void m_tiled(int c, void *p) {
    MCase *k = (MCase *)p;
    gpu_dequant(k->g, k->deq32, &k->q8[c]);
    dim3 grid((k->N + 31) / 32, (k->M + 31) / 32);
    tiled_gemm<<<grid, 1024, 0, (cudaStream_t)gpu_stream(k->g)>>>(k->y, k->x, k->deq32, k->M, k->N, k->K);
    CK(cudaGetLastError());
}

static int across_m(int gs, const char *csv_path) {
    const int shapes[][2] = {{4096, 4096}, {11008, 4096}, {4096, 11008}};
    const int Ms[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
    struct Path { const char *name; LaunchFn fn; int weight_bytes; } paths[] = {
        {"simt", m_fused, 1}, {"mma", m_mma, 1}, {"wgmma", m_wgmma, 1}, {"deq+f32", m_deq32, 9}, {"deq+f16", m_deq16, 5},
        {"f16", m_f16, 2}, {"bf16", m_bf16, 2}, {"f32", m_f32, 4}, {"deq", m_deq, 5}, {"tiled", m_tiled, 9}};
    FILE *csv = fopen(csv_path, "w");
    if (!csv) { fprintf(stderr, "kernel_bench: cannot write %s\n", csv_path); return 1; }
    fprintf(csv, "shape,M,path,us,tflops,gbs\n");
    for (auto &sh : shapes) {
        MCase k;
        k.N = sh[0], k.K = sh[1];
        size_t n = (size_t)k.N * k.K;
        k.g = gpu_create(n, (size_t)512 * k.K);
        CB(cublasCreate(&k.blas));
        CB(cublasSetStream(k.blas, (cudaStream_t)gpu_stream(k.g)));
        int stride = (k.K + 15) / 16 * 16, groups = (k.K + gs - 1) / gs;
        size_t q_bytes = (size_t)k.N * stride, s_bytes = (size_t)k.N * groups * 4;
        int copies = 3;   // rotated: 3 x 45 MB int8 (and 3 x 90 MB FP16) is past the 50 MB L2
        for (int c = 0; c < copies; c++) {
            int8_t *q = (int8_t *)dev_random(q_bytes + s_bytes, 7 + c);
            float *sc = (float *)(q + q_bytes);
            words_to_float<<<1024, 256>>>(sc, s_bytes / 4);
            k.q8.push_back(Mat{k.N, k.K, stride, gs, groups, NULL, q, sc, NULL});
            k.f32.push_back(dev_floats(n, 100 + c));
            __half *h;
            __nv_bfloat16 *b;
            CK(cudaMalloc(&h, n * 2));
            CK(cudaMalloc(&b, n * 2));
            float_to_half<<<1024, 256>>>(h, k.f32[c], n);
            float_to_bf16<<<1024, 256>>>(b, k.f32[c], n);
            k.f16.push_back(h);
            k.bf16.push_back(b);
        }
        k.x = dev_floats((size_t)512 * k.K, 3);
        CK(cudaMalloc(&k.y, (size_t)512 * k.N * 4));
        CK(cudaMalloc(&k.deq32, n * 4));
        CK(cudaMalloc(&k.deq16, n * 2));
        CK(cudaMalloc(&k.x_bf16, (size_t)512 * k.K * 2));
        float_to_bf16<<<1024, 256>>>(k.x_bf16, k.x, (size_t)512 * k.K);
        CK(cudaDeviceSynchronize());
        printf("\n%d x %d, group size %d: us | TFLOP/s | GB/s (weight bytes as read + x + y)\n%5s", k.N, k.K, gs, "M");
        for (auto &p : paths) printf(" | %-22s", p.name);
        printf(" | fused: f16/fused bf16/fused (fused = the engine's kernel at this M)\n");
        const char *max_m = getenv("BENCH_MAX_M");   // a shorter table, for A/B runs
        for (int M : Ms) {
            if (max_m && M > atoi(max_m)) break;
            k.M = M;
            printf("%5d", M);
            double t_fused = 0, t_f16 = 0, t_bf16 = 0;
            const char *engine = M == 1 ? "simt" : M < 128 ? "mma" : "wgmma";   // run.c / kernels.cu dispatch
            for (auto &p : paths) {
                double us = time_us(p.fn, &k, copies, (cudaStream_t)gpu_stream(k.g));
                double flops = 2.0 * M * n, bytes = (double)n * p.weight_bytes + (double)M * (k.K + k.N) * 4;
                printf(" | %7.1f %6.1f %7.0f", us, flops / us / 1e6, bytes / us / 1e3);
                fprintf(csv, "%dx%d,%d,%s,%.2f,%.3f,%.1f\n", k.N, k.K, M, p.name, us, flops / us / 1e6, bytes / us / 1e3);
                if (!strcmp(p.name, engine)) t_fused = us;
                if (!strcmp(p.name, "f16")) t_f16 = us;
                if (!strcmp(p.name, "bf16")) t_bf16 = us;
            }
            printf(" | %-5s %5.2fx %5.2fx\n", engine, t_f16 / t_fused, t_bf16 / t_fused);
        }
        for (int c = 0; c < copies; c++) {
            CK(cudaFree((void *)k.q8[c].q)), CK(cudaFree(k.f32[c])), CK(cudaFree(k.f16[c])), CK(cudaFree(k.bf16[c]));
        }
        CK(cudaFree(k.x)), CK(cudaFree(k.y)), CK(cudaFree(k.deq32)), CK(cudaFree(k.deq16)), CK(cudaFree(k.x_bf16));
        CB(cublasDestroy(k.blas));
        gpu_destroy(k.g);
    }
    fclose(csv);
    printf("\n(the same figures: %s)\n", csv_path);
    return 0;
}

int main(int argc, char **argv) {
    if ((argc == 4 || argc == 5) && !strcmp(argv[1], "--profile")) {
        const int N = atoi(argv[2]), K = atoi(argv[3]), M = argc == 5 ? atoi(argv[4]) : 1;
        if (N < 1 || K < 1 || M < 1 || N > 65536 || K > 65536 || M > 512) {
            fprintf(stderr, "kernel_bench: --profile N K [M]: N and K 1 to 65536, M 1 to 512, got %s %s %s\n", argv[2], argv[3],
                    argc == 5 ? argv[4] : "1");
            return 2;
        }
        char why[ERR_LEN];
        if (gpu_probe(why)) { fprintf(stderr, "kernel_bench: %s\n", why); return 1; }
        return profile_once(N, K, M, 128);
    }
    if (argc >= 2 && !strcmp(argv[1], "--across-m")) {
        char why[ERR_LEN];
        if (gpu_probe(why)) { fprintf(stderr, "kernel_bench: %s\n", why); return 1; }
        return across_m(128, argc >= 3 ? argv[2] : "bench/out/across_m.csv");
    }
    int gs = argc > 1 ? atoi(argv[1]) : 128;
    const int shapes[][2] = {{4096, 4096}, {11008, 4096}, {4096, 11008}, {32000, 4096},
                             {2048, 2048}, {256, 2048},   {5632, 2048},  {2048, 5632}};
    char why[ERR_LEN];
    if (gpu_probe(why)) { fprintf(stderr, "kernel_bench: %s\n", why); return 1; }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs; M = 1, group size %d; median of 15 x 40 launches, weights rotated past L2\n", prop.name,
           prop.multiProcessorCount, gs);
    printf("fused: the copy-engine GEMV where the GPU has it; reg-fed: the register-fed GEMV, launched plainly\n");
    printf("%-12s %9s | %8s %7s | %8s %7s | %8s %7s | %6s | %8s %7s | %8s | %8s | %s\n", "N x K", "MB int8", "fused us",
           "GB/s", "+PDL us", "GB/s", "read us", "GB/s", "f/read", "fp16 us", "GB/s", "fp32 us", "unfus us",
           "fp16/fused, fp16/+PDL | reg-fed us");
    for (auto &sh : shapes) {
        Case k;
        k.N = sh[0], k.K = sh[1], k.sms = prop.multiProcessorCount;
        size_t n = (size_t)k.N * k.K;
        k.g = gpu_create(n, 0);
        CB(cublasCreate(&k.blas));
        CK(cudaStreamCreate(&k.stream));
        CB(cublasSetStream(k.blas, k.stream));
        int stride = (k.K + 15) / 16 * 16, groups = (k.K + gs - 1) / gs;
        size_t q_bytes = (size_t)k.N * stride, s_bytes = (size_t)k.N * groups * 4;
        int copies8 = (int)std::max<size_t>(3, (512u << 20) / q_bytes), copies32 = (int)std::max<size_t>(2, (512u << 20) / (n * 4));
        int copies16 = (int)std::max<size_t>(2, (512u << 20) / (n * 2));
        for (int c = 0; c < copies8; c++) {
            int8_t *q = (int8_t *)dev_random(q_bytes + s_bytes, 7 + c);
            float *s = (float *)(q + q_bytes);
            words_to_float<<<1024, 256>>>(s, s_bytes / 4);
            Mat m = {k.N, k.K, stride, gs, groups, NULL, q, s, NULL};
            k.q8.push_back(m);
        }
        for (int c = 0; c < copies32; c++) k.f32.push_back(dev_floats(n, 100 + c));
        for (int c = 0; c < copies16; c++) {
            __half *h;
            CK(cudaMalloc(&h, n * 2));
            float_to_half<<<1024, 256>>>(h, k.f32[c % copies32], n);
            k.f16.push_back(h);
        }
        k.x = dev_floats(k.K, 3);
        CK(cudaMalloc(&k.y, k.N * 4));
        CK(cudaMalloc(&k.x16, k.K * 2));
        CK(cudaMalloc(&k.y16, k.N * 2));
        float_to_half<<<64, 256>>>(k.x16, k.x, k.K);
        CK(cudaMalloc(&k.sink, 4));
        CK(cudaDeviceSynchronize());
        cudaStream_t gst = (cudaStream_t)gpu_stream(k.g);   // the gpu_* launchers' stream: time them there
        fused_kernel = engine_kernel(k.g, &k.q8[0], 1, 1), regfed_kernel = engine_kernel(k.g, &k.q8[0], 1, 0);
        gpu_set_pdl(k.g, 0);
        double fused = time_us(run_fused, &k, copies8, gst), unfused = time_us(run_unfused, &k, copies8, gst);
        gpu_set_pdl(k.g, 1);
        double fused_pdl = time_us(run_fused, &k, copies8, gst);
        double rd = time_us(run_read, &k, copies8, k.stream), f32 = time_us(run_fp32, &k, copies32, gst);
        double f16 = time_us(run_fp16, &k, copies16, k.stream);
        gpu_set_pdl(k.g, 0);
        double regfed = time_us(run_regfed, &k, copies8, gst);   // the engine's kernel without the copy engine
        double fused_bytes = q_bytes + s_bytes + k.K * 4.0 + k.N * 4.0;
        if (getenv("SWEEP")) {   // rows per warp x chunks in flight, microseconds
            printf("  sweep %5dx%-6d:", k.N, k.K);
            for (int r : {1, 2, 4})
                for (int u : {2, 4, 8}) {
                    variant_r = r, variant_u = u;
                    printf(" r%du%d %.1f", r, u, time_us(run_variant, &k, copies8, gst));
                }
            printf("\n");
        }
        printf("%5dx%-6d %9.1f | %8.1f %7.0f | %8.1f %7.0f | %8.1f %7.0f | %6.2f | %8.1f %7.0f | %8.1f | %8.1f | %.2fx %.2fx | %8.1f\n",
               k.N, k.K, q_bytes / 1e6, fused, fused_bytes / fused / 1e3, fused_pdl, fused_bytes / fused_pdl / 1e3, rd,
               (q_bytes + s_bytes) / rd / 1e3, fused / rd, f16, n * 2.0 / f16 / 1e3, f32, unfused, f16 / fused, f16 / fused_pdl,
               regfed);
        for (auto &m : k.q8) CK(cudaFree((void *)m.q));
        for (auto p : k.f32) CK(cudaFree(p));
        for (auto p : k.f16) CK(cudaFree(p));
        CK(cudaFree(k.x)), CK(cudaFree(k.y)), CK(cudaFree(k.x16)), CK(cudaFree(k.y16)), CK(cudaFree(k.sink));
        CB(cublasDestroy(k.blas));
        CK(cudaStreamDestroy(k.stream));
        gpu_destroy(k.g);
    }
    return 0;
}
