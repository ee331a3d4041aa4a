// kernels.h: the GPU kernels as run.c sees them; this header is the executor's whole interface
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
void gpu_destroy(GpuCtx *g);
const char *gpu_name(void);
void *gpu_stream(GpuCtx *g);   // its cudaStream_t, for timing with events

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

// Linear layers: y (M, N) = x (M, K) W^T, W (N, K) given as a Mat with device pointers; x rows
// are K floats apart, y rows N. accumulate: y += x W^T instead (the residual add, fused).
void gpu_matmul_q8_fused(GpuCtx *g, float *y, const float *x, int M, const Mat *w, int accumulate);
// RMSNorm folded in (this and the two below): norm_w non-NULL means x is the un-normalised
// residual stream and the layer's input is rmsnorm(x) * norm_w (K weights), done on the fly.
void gpu_matmul_q8_fused_norm(GpuCtx *g, float *y, const float *x, int M, const Mat *w, int accumulate, const float *norm_w);
// Whether a norm folded into that launch costs no more than its own kernel (else the caller runs it first).
int gpu_fold_norm_pays(GpuCtx *g, int M, const Mat *w);
// The attention's q, k, v (three INT8 weights of one K) in one launch, with RoPE applied at the
// step's positions to q and k in the epilogue, and k, v stored into rows pos..pos+M-1 of the
// layer's caches (seq_len, kv_dim), FP16 if kv_half: gpu_rope_store's work without its launch.
// q (M, dim) is written.
void gpu_matmul_q8_qkv_rope(GpuCtx *g, float *q, const float *x, int M, const Mat *wq, const Mat *wk, const Mat *wv,
                            void *key_cache, void *value_cache, int head_size, int kv_half, size_t seq_stride,
                            const float *norm_w);
// h (M, N) = silu(x w1^T) * (x w3^T): both INT8 weights in one launch, the SwiGLU in its epilogue.
void gpu_matmul_q8_swiglu(GpuCtx *g, float *h, const float *x, int M, const Mat *w1, const Mat *w3, const float *norm_w);
// The same product on the tensor cores (mma.sync, FP16 inputs, FP32 accumulation): x converted to
// FP16 once into the context's half scratch (half_floats >= M * K), W int8 dequantized exactly to
// FP16 in registers, each 64-wide step's partial sums scaled in FP32. Error: x's rounding to FP16,
// at most about 4.9e-4 * sum_k |w x| per output. Needs gs % 64 == 0 (supported() says).
// From 128 tokens on (and on compute capability 9.0), a wgmma kernel takes over: the group scale is
// then applied to the weights in FP16 (each row's scales first shifted by a power of two into
// FP16's range), so its bound is about 1.5e-3 * sum_k |w x|.
int gpu_matmul_q8_mma_supported(const Mat *w);
void gpu_matmul_q8_mma(GpuCtx *g, float *y, const float *x, int M, const Mat *w, int accumulate);
// The same with the kernel chosen: TC_AUTO (by M, as above), TC_MMA_SYNC or TC_WGMMA (tests, bench).
enum { TC_AUTO, TC_MMA_SYNC, TC_WGMMA };
void gpu_matmul_q8_tc(GpuCtx *g, float *y, const float *x, int M, const Mat *w, int accumulate, int kernel);
void gpu_dequant(GpuCtx *g, float *dst, const Mat *w);   // INT8 -> FP32 (N, K) dense
void gpu_matmul_f32(GpuCtx *g, float *y, const float *x, int M, const float *W, int N, int K, int ldw, int accumulate);
void gpu_matmul_q8_unfused(GpuCtx *g, float *y, const float *x, int M, const Mat *w, int accumulate);   // dequant + cuBLAS
// The FP16 baseline: W (N, K) dense FP16 resident in device memory, cuBLAS GEMM, FP32 output.
void gpu_matmul_f16(GpuCtx *g, float *y, const float *x, int M, const void *W, int N, int K, int accumulate);
void gpu_to_half(GpuCtx *g, void *dst, const Mat *w);   // dst (rows, cols) FP16 = W
// At M = 1 on compute capability 9.0 the fused products above run a GEMV fed by the copy engine
// (bulk copies into a ring in shared memory) where it applies: on (gpu_create's default) or off
// (the register-fed kernel everywhere, as on other GPUs). Returns whether it is now used.
int gpu_set_gemv_tma(GpuCtx *g, int on);
// Tuning only (bench/kernel_bench): the M = 1 fused kernel with rows per warp in {1, 2, 4} and
// 16-byte chunks in flight per row in {2, 4, 8}; -1 if that combination is not built.
int gpu_matmul_q8_variant(GpuCtx *g, float *y, const float *x, const Mat *w, int rows_per_warp, int chunks);

// The rest of the forward pass; tokens and position come from gpu_set_inputs.
void gpu_embed(GpuCtx *g, float *x, int M, const Mat *emb);   // x (M, dim) = embedding rows
void gpu_rmsnorm(GpuCtx *g, float *out, const float *in, const float *w, int M, int n);
// RoPE on q (M, dim) and k (M, kv_dim), then k and v (M, kv_dim) stored at rows pos..pos+M-1 of
// the layer's caches (seq_len, kv_dim), FP16 elements when kv_half, else FP32.
// seq_stride (here and for the attention): 0, the M tokens are one sequence at pos..pos+M-1;
// else token m is sequence m's (a batch of sequences), at pos, its caches seq_stride elements
// after sequence m - 1's.
void gpu_rope_store(GpuCtx *g, float *q, float *k, const float *v, void *key_cache, void *value_cache, int M, int dim,
                    int kv_dim, int head_size, int kv_half, size_t seq_stride);
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
// next step's input, token at position + 1), an asynchronous copy of its result into one of two
// host slots, and the wait for that slot.
void gpu_argmax_launch(GpuCtx *g, const float *v, int n, int feed);
void gpu_argmax_fetch(GpuCtx *g, int slot);
int gpu_argmax_wait(GpuCtx *g, int slot);
// llama2.c's sampling of rows of logits (rows x n, rows 1..64) on the device: softmax of logits /
// temperature (> 0), then top-p where 0 < topp < 1, else multinomial over the whole row; coins[r]
// is row r's uniform draw in [0, 1) from its sampler. out[r]: the token, waited for. Supported for
// rows of up to 32768 logits (gpu_sample_supported), the row in the registers of one block.
int gpu_sample_supported(int n);
void gpu_sample_rows(GpuCtx *g, const float *logits, int rows, int n, float temperature, float topp, const float *coins,
                     int *out);

#ifdef __cplusplus
}
#endif
#endif
