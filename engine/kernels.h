// kernels.h: the GPU kernels as the GPU executor (gpu.c, dispatch.c) sees them: its whole interface
// to CUDA. Tensors are device pointers in row-major layouts given per function; everything runs on
// the context's stream, and every CUDA and cuBLAS call and launch is checked (on failure: a message
// naming the call, file and line, then exit 1). No file, flag or tokenizer is known here.
#ifndef KERNELS_H
#define KERNELS_H

#include <stddef.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct GpuCtx GpuCtx;       // stream, cuBLAS handle, device scratch, the step's inputs
typedef struct GpuGraph GpuGraph;   // a captured forward step

// 0 if a usable GPU is there, else -1 with the reason in why (ERR_LEN bytes).
int gpu_probe(char *why);
// Free and total device memory in bytes.
void gpu_mem_info(size_t *free_bytes, size_t *total_bytes);
// scratch_floats: the unfused path's dequantized-weight buffer (0 if unused); half_floats: the
// FP16 path's converted input (0 if unused).
GpuCtx *gpu_create(size_t scratch_floats, size_t half_floats);
// Programmatic dependent launch for the kernels launched from now on (on by default).
void gpu_set_pdl(GpuCtx *g, int on);
// Whether this GPU runs the copy-engine GEMV and the wgmma kernel (compute capability 9.0, for
// which this build carries sm_90a machine code).
int gpu_has_sm90a(void);
void gpu_destroy(GpuCtx *g);
const char *gpu_name(void);

void *gpu_alloc(size_t bytes);                                     // zero-filled
void gpu_free(void *p);
void gpu_upload(void *dst, const void *src, size_t bytes);         // synchronous: after all queued work
void gpu_download(GpuCtx *g, void *dst, const void *src, size_t bytes);   // waits for the stream
void gpu_sync(GpuCtx *g);
void gpu_copy(GpuCtx *g, void *dst, const void *src, size_t bytes);   // device to device, on the stream

// The inputs of the next forward step, kept in device memory so that a captured step replays at
// any position: M token ids (checked by the caller) and the position of the first.
void gpu_set_inputs(GpuCtx *g, const int *tokens, int M, int pos);
// Capture: between begin and end, launches on the context's stream are recorded, not run.
void gpu_graph_begin(GpuCtx *g);
GpuGraph *gpu_graph_end(GpuCtx *g);
void gpu_graph_launch(GpuCtx *g, GpuGraph *graph);
void gpu_graph_free(GpuGraph *graph);

// ---- Linear layers. engine/dispatch.c chooses the kernel of each call (choose_linear); these run
// it. A call computes y (M, N) = x' (M, K) W^T for W = w[0] (N, K), a Mat of device pointers, where
// x' = x, or rmsnorm(x) * norm_w when norm_w (K floats) is given: the GEMV kernels fold the norm
// in (each warp sees all of x anyway: it sums the squares on the way and scales the finished sums).
typedef enum {
    LINEAR_GEMV,           // fused INT8 GEMV fed through registers: any GPU, any M, any group size
    LINEAR_GEMV_TALL,      // its instance with 4 rows a warp instead of 2, for tall weights at M = 1
    LINEAR_GEMV_COPY,      // fused INT8 GEMV fed by the copy engine (bulk copies into a ring in shared
                           // memory, on mbarriers): M = 1, compute capability 9.0
    LINEAR_MMA,            // fused INT8 GEMM on the tensor cores, mma.sync m16n8k16 (group size % 64 == 0)
    LINEAR_WGMMA,          // the same with wgmma, 128 rows x 128 tokens a block (sm_90a)
    LINEAR_DEQUANT_SGEMM,  // --unfused: the weight dequantized into FP32 scratch, then cuBLAS
    LINEAR_SGEMM,          // FP32 weights (Mat.f): cuBLAS
    LINEAR_HGEMM,          // FP16 weights (Mat.h, --fp16): cuBLAS, x converted to FP16 first
    LINEAR_KERNELS
} LinearKernel;
const char *gpu_linear_name(LinearKernel k);

// What one launch computes: one product (PLAIN); q, k and v of a layer with RoPE and the KV store
// in the epilogue (QKV_ROPE); w1 and w3 with the SwiGLU (SWIGLU). The epilogue forms run on
// LINEAR_GEMV and LINEAR_GEMV_COPY only.
typedef enum { LINEAR_PLAIN, LINEAR_QKV_ROPE, LINEAR_SWIGLU } LinearForm;
// QKV_ROPE: the biases added to q, k and v where given, then RoPE at the step's positions
// (gpu_set_inputs) applied to q and k, then k and v stored into rows pos..pos+M-1 of the layer's
// caches (seq_len, kv_dim) instead of being written out (q_dim = n_heads * head_size, kv_dim =
// n_kv_heads * head_size). Pair (2i, 2i + 1) of every head turns by pos * rope_freq[i].
// seq_stride (here and for gpu_rope_store and gpu_attention): 0, the M tokens are one sequence at
// pos..pos+M-1; else token m is sequence m's (a batch step), at pos, its caches seq_stride elements
// after sequence m - 1's.
typedef struct {
    const float *bias[3];            // (q_dim), (kv_dim), (kv_dim): q, k, v biases, or NULL: none
    const float *rope_freq;          // (head_size / 2)
    void *key_cache, *value_cache;   // FP16 elements if kv_half, else FP32
    int head_size, kv_half;
    size_t seq_stride;
} QkvRope;
typedef struct {
    LinearForm form;
    int M;
    const float *x;          // (M, K)
    const Mat *w[3];         // PLAIN: w[0]; QKV_ROPE: wq, wk, wv (one K and group size); SWIGLU: w1, w3
    float *y;                // (M, N): the product; QKV_ROPE: q; SWIGLU: silu(x' w1^T) * (x' w3^T)
    int accumulate;          // PLAIN: y += x' W^T instead (the residual add)
    const float *norm_w;     // (K) or NULL: the RMSNorm folded in (GEMV kernels)
    float norm_eps;          // with norm_w: the RMSNorm's epsilon
    QkvRope qkv;             // QKV_ROPE only
} LinearCall;
// Whether kernel k can serve the call on this GPU: the weights' type, M, the group size, alignment,
// shared memory and scratch.
int gpu_linear_fits(GpuCtx *g, LinearKernel k, const LinearCall *c);
// Runs the call on kernel k (an internal error, exit 1, where k does not fit it). Error bounds,
// against exact arithmetic: the SIMT and cuBLAS FP32 kernels, FP32 summation only. LINEAR_MMA
// rounds x to FP16: at most about 4.9e-4 * sum_k |w x| per output. LINEAR_WGMMA also applies the
// group scale in FP16 (each row's scales first shifted by a power of two into FP16's range):
// about 1.5e-3 * sum_k |w x|. LINEAR_HGEMM: weights and x in FP16.
void gpu_linear(GpuCtx *g, LinearKernel k, const LinearCall *c);
void gpu_to_half(GpuCtx *g, void *dst, const Mat *w);   // dst (rows, cols) FP16 = W (for LINEAR_HGEMM)

// The rest of the forward pass; tokens and position come from gpu_set_inputs.
void gpu_embed(GpuCtx *g, float *x, int M, const Mat *emb);   // x (M, dim) = embedding rows
// out (M, n) = w * in / sqrt(mean(in^2) + eps), row by row
void gpu_rmsnorm(GpuCtx *g, float *out, const float *in, const float *w, int M, int n, float eps);
// What a QKV_ROPE call's epilogue does (QkvRope), as a kernel of its own after three PLAIN calls:
// q (M, q_dim) biased and rotated in place; k and v (M, kv_dim) biased, k rotated, both stored at
// rows pos..pos+M-1 of the layer's caches (k and v themselves are left as they were).
void gpu_rope_store(GpuCtx *g, float *q, float *k, const float *v, int M, int q_dim, int kv_dim, const QkvRope *r);
// out (M, n_heads * hs) = causal attention of q (M, n_heads * hs) at positions pos..pos+M-1 over
// the layer's caches (seq_len, n_kv_heads * hs), split along the sequence; part: scratch of
// gpu_attention_part_floats(M, ...) floats for the splits' partial results.
void gpu_attention(GpuCtx *g, float *out, float *part, const float *q, const void *key_cache, const void *value_cache,
                   int M, int n_heads, int n_kv_heads, int head_size, int seq_len, int kv_half, size_t seq_stride);
size_t gpu_attention_part_floats(int M, int n_heads, int head_size, int seq_len);
int gpu_attention_max_head_size(void);   // the largest head the attention kernel handles
void gpu_swiglu(GpuCtx *g, float *h, const float *gate, int n);   // h = silu(h) * gate
int gpu_argmax(GpuCtx *g, const float *v, int n);                 // first index of the maximum
// out[r] = gpu_argmax of row r of v (rows x n, rows 1..64), waited for.
void gpu_argmax_rows(GpuCtx *g, const float *v, int rows, int n, int *out);
// The same in parts: the kernel (may be captured in a graph; feed: the result also becomes the
// next step's input, token at position + 1, and goes to host memory for gpu_step_token_wait),
// then its result (or a megakernel's: gpu_mega_argmax), waited for.
void gpu_argmax_launch(GpuCtx *g, const float *v, int n, int feed);
int gpu_argmax_result(GpuCtx *g);
// A fed step's token (argmax_kernel's, or a megakernel's that takes the argmax itself:
// gpu_mega_argmax) as it lands in host memory: the wait for the step at position pos, and the
// slots cleared before a generation's first step.
void gpu_step_tokens_clear(GpuCtx *g);
int gpu_step_token_wait(GpuCtx *g, int pos);
// llama2.c's sampling of rows of logits (rows x n, rows 1..64) on the device: softmax of logits /
// temperature (> 0), then top-p where 0 < topp < 1, else multinomial over the whole row; coins[r]
// is row r's uniform draw in [0, 1) from its sampler. out[r]: the token, waited for. Supported for
// rows of up to 32768 logits (gpu_sample_supported), the row in the registers of one block.
int gpu_sample_supported(int n);
void gpu_sample_rows(GpuCtx *g, const float *logits, int rows, int n, float temperature, float topp, const float *coins,
                     int *out);

// ---- The decode step of one token as one persistent kernel (cuda/megakernel.cuh, sm_90a): its
// stages in the step's order, each run once its predecessor is complete. The kernel's schedule is
// fixed once made; the position and token come from gpu_set_inputs at every launch.
typedef enum { MEGA_EMBED, MEGA_LINEAR, MEGA_ATTENTION } MegaKind;
typedef struct {
    MegaKind kind;
    LinearCall linear;                     // LINEAR: a call of one token, INT8 weights (any form)
    const Mat *embedding;                  // EMBED: x (dim) = the row of the step's token
    float *x;
    const float *q;                        // ATTENTION: out (n_heads * head_size) = attention of q
    const void *key_cache, *value_cache;   // (n_heads * head_size) over the layer's caches
    float *out;
} MegaStage;
typedef struct {
    int n_heads, n_kv_heads, head_size, seq_len, kv_half;
} MegaAttention;
typedef struct GpuMega GpuMega;
// The kernel for this schedule, or NULL with the reason in why where it cannot run it (the GPU,
// a weight's type or layout, shared memory).
GpuMega *gpu_mega_create(GpuCtx *g, const MegaStage *stages, int n, MegaAttention at, char *why);
void gpu_mega_launch(GpuCtx *g, const GpuMega *m);
void gpu_mega_describe(const GpuMega *m, char *buf, size_t n);
int gpu_mega_argmax(const GpuMega *m);   // the step's greedy argmax taken in the kernel (no argmax_kernel)
void gpu_mega_free(GpuMega *m);

// ---- The decode step of a small model on one thread-block cluster (cuda/cluster_step.cuh,
// sm_90a): the layers on a cluster of 16 or 8 SMs, the activations handed over in their shared
// memory, the classifier and the greedy argmax on the other SMs (two kernels, launched from the
// host at every step as each other's programmatic dependents). It takes the same recorded stages as
// gpu_mega_create, always takes the argmax (as gpu_mega_argmax) and writes the logits. It runs
// the steps at positions below gpu_cluster_positions only: past them its attention does not
// hold a head's earlier rows.
typedef struct GpuCluster GpuCluster;
GpuCluster *gpu_cluster_create(GpuCtx *g, const MegaStage *stages, int n, MegaAttention at, char *why);
void gpu_cluster_launch(GpuCtx *g, const GpuCluster *c);
int gpu_cluster_positions(const GpuCluster *c);
int gpu_cluster_group_multiple(void);   // the weights' group sizes it takes are multiples of this
void gpu_cluster_describe(const GpuCluster *c, char *buf, size_t n);
void gpu_cluster_free(GpuCluster *c);

#ifdef __cplusplus
}
#endif
#endif
