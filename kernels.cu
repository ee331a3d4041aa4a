// kernels.cu: the GPU side of the engine, the one file nvcc compiles. Its interface is
// engine/kernels.h; the kernels and their launchers live in cuda/, one file per concern, each
// opening with the list of what it defines:
//   cuda/common.cuh        checked CUDA and cuBLAS calls, the context struct, launch() (every launch
//                          with programmatic dependent launch allowed, and checked), PTX wrappers
//   cuda/small.cuh         embedding, RMSNorm, SwiGLU, FP16 conversions
//   cuda/dequant.cuh       INT8 -> FP32 (the --unfused baseline)
//   cuda/gemv.cuh          the fused INT8 GEMVs: register-fed (any M) and copy-engine (M = 1, sm_90a),
//                          with their epilogues (residual add, QKV + RoPE + KV store, SwiGLU, RMSNorm)
//   cuda/tensor_core.cuh   the fused INT8 GEMMs on the tensor cores: mma.sync and wgmma (sm_90a)
//   cuda/attention.cuh     RoPE + KV store, split attention and its combine step
//   cuda/sampling.cuh      the greedy argmax and llama2.c's sampling
//   cuda/linear.cuh        gpu_linear: a linear layer on the chosen kernel; the cuBLAS baselines
//   cuda/megakernel.cuh    a whole decode step as one persistent kernel (sm_90a)
//   cuda/cluster_step.cuh  a small model's decode step: its layers on one thread-block cluster,
//                          its classifier on the other SMs (sm_90)
//   cuda/context.cuh       context, memory, the step's inputs, CUDA graphs
// Every kernel may start while the one before it drains (PDL), and waits (griddepcontrol.wait)
// before it touches anything that kernel writes or reads. The step's position and token ids live
// in device memory (gpu_set_inputs), so that a step captured as a CUDA graph replays at any
// position. Kernels know tensors, shapes and streams: never a file, a flag or a tokenizer.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#include "cuda/common.cuh"
#include "cuda/small.cuh"
#include "cuda/dequant.cuh"
#include "cuda/gemv.cuh"
#include "cuda/tensor_core.cuh"
#include "cuda/attention.cuh"
#include "cuda/sampling.cuh"
#include "cuda/linear.cuh"
#include "cuda/megakernel.cuh"
#include "cuda/cluster_step.cuh"
#include "cuda/context.cuh"
