// dispatch.h: the decisions of the GPU executor, each made in one place (dispatch.c): which kernel
// serves a linear layer, and the options that follow from the model's size.
#ifndef DISPATCH_H
#define DISPATCH_H

#include "exec.h"
#include "kernels.h"

// The kernel for a linear call under the options: by the weights' type, the path, M and what the
// GPU's kernels fit. A call whose kernel cannot do its epilogue form (linear_has_epilogues) is
// done by the caller as PLAIN calls and separate kernels.
LinearKernel choose_linear(GpuCtx *g, const GpuOptions *opt, const LinearCall *c);
int linear_has_epilogues(LinearKernel k);   // QKV_ROPE and SWIGLU in the kernel's own epilogue
// Whether k folds the RMSNorm before the layer into its loop (else the norm runs first).
int linear_folds_norm(LinearKernel k, const GpuOptions *opt);
// GPU_AUTO options set from the weight bytes one token reads (pdl, tma_gemv).
void resolve_gpu_options(GpuOptions *opt, double weight_bytes_per_token);

#endif
