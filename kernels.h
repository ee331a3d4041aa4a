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

typedef struct GpuCtx GpuCtx;   // stream, cuBLAS handle, device scratch

// 0 if a usable GPU is there, else -1 with the reason in why (ERR_LEN bytes).
int gpu_probe(char *why);
// Free and total device memory in bytes.
void gpu_mem_info(size_t *free_bytes, size_t *total_bytes);
// scratch_floats: the unfused path's dequantized-weight buffer (0 if unused).
GpuCtx *gpu_create(size_t scratch_floats);
void gpu_destroy(GpuCtx *g);
const char *gpu_name(void);
void *gpu_stream(GpuCtx *g);   // its cudaStream_t, for timing with events

void *gpu_alloc(size_t bytes);                                     // zero-filled
void gpu_free(void *p);
void gpu_upload(void *dst, const void *src, size_t bytes);         // synchronous
void gpu_download(GpuCtx *g, void *dst, const void *src, size_t bytes);   // waits for the stream
void gpu_sync(GpuCtx *g);

// Linear layers: y (M, N) = x (M, K) W^T, W (N, K) given as a Mat with device pointers;
// x rows are K floats apart, y rows N floats apart.
void gpu_matmul_q8_fused(GpuCtx *g, float *y, const float *x, int M, const Mat *w);   // INT8, dequant in registers
void gpu_dequant(GpuCtx *g, float *dst, const Mat *w);                                // INT8 -> FP32 (N, K) dense
void gpu_matmul_f32(GpuCtx *g, float *y, const float *x, int M, const float *W, int N, int K, int ldw);   // cuBLAS
void gpu_matmul_q8_unfused(GpuCtx *g, float *y, const float *x, int M, const Mat *w); // gpu_dequant + cuBLAS
// Tuning only (bench/kernel_bench): the M = 1 fused kernel with rows per warp in {1, 2, 4} and
// 16-byte chunks in flight per row in {2, 4, 8}; -1 if that combination is not built.
int gpu_matmul_q8_variant(GpuCtx *g, float *y, const float *x, const Mat *w, int rows_per_warp, int chunks);

// The rest of the forward pass.
void gpu_embed(GpuCtx *g, float *x, const int *tokens, int M, const Mat *emb);   // tokens: host ids, checked
void gpu_rmsnorm(GpuCtx *g, float *out, const float *in, const float *w, int M, int n);
void gpu_rope(GpuCtx *g, float *q, float *k, int M, int pos, int dim, int kv_dim, int head_size);
// out (M, n_heads * hs) = causal attention of q (M, n_heads * hs) at positions pos..pos+M-1 over
// the layer's caches (seq_len, n_kv_heads * hs), rows 0..pos+M-1 valid.
void gpu_attention(GpuCtx *g, float *out, const float *q, const float *key_cache, const float *value_cache, int M,
                   int pos, int n_heads, int n_kv_heads, int head_size);
int gpu_attention_max_len(void);         // longest context the attention kernel handles
int gpu_attention_max_head_size(void);   // and the largest head
void gpu_swiglu(GpuCtx *g, float *h, const float *gate, int n);   // h = silu(h) * gate
void gpu_add(GpuCtx *g, float *x, const float *y, int n);         // x += y
int gpu_argmax(GpuCtx *g, const float *v, int n);                 // first index of the maximum

#ifdef __cplusplus
}
#endif
#endif
