// dispatch.c: which kernel serves each linear layer on the GPU, and the options that follow from
// the model's size. Every threshold that decides a kernel is here; the figures behind them are in
// bench/NOTES.md.
#ifdef HAVE_GPU
#include "dispatch.h"

// From this many tokens a batch takes the tensor cores (a decode step, one token, streams the
// weights with fewer instructions on the GEMV: bench/kernel_bench --across-m).
#define TC_MIN_TOKENS 2
// From this many tokens the wgmma kernel (128-token tiles) beats mma.sync's (--across-m).
#define WGMMA_MIN_TOKENS 128
// Weights of at least this many rows take the GEMV's 4-rows-a-warp instance at M = 1 (NOTES 3).
#define TALL_ROWS 8192
// Models from this many weight bytes per token decode on the copy-engine GEMV: with PDL it
// streams the next layer's first tiles while the current kernel drains, which pays on the 7B
// shape and not on the smaller ones, whose layers are too short for its set-up (NOTES 22, 25).
#define COPY_GEMV_MIN_BYTES 4e9
// Models from this many weight bytes per token decode in one persistent kernel (INT8, sm_90a):
// it is ahead from the stories110m shape (0.11 GB) up and behind on stories42m (0.04 GB) and
// stories15m, whose steps are stage boundaries more than streaming (NOTES 46, 74).
#define MEGAKERNEL_MIN_BYTES 7e7
// Under this many weight bytes per token, kernels launch with PDL: the small models' steps are
// launch latency, which it hides; the 7B's register-fed GEMV lost with it (NOTES 8).
#define PDL_MAX_BYTES 1e9

static LinearCall as_plain(const LinearCall *c) {
    LinearCall p = *c;
    p.form = LINEAR_PLAIN;
    return p;
}

LinearKernel choose_linear(GpuCtx *g, const GpuOptions *opt, const LinearCall *c) {
    const Mat *w = c->w[0];
    if (w->h) return LINEAR_HGEMM;
    if (w->f) return LINEAR_SGEMM;
    if (opt->path == PATH_UNFUSED) return LINEAR_DEQUANT_SGEMM;
    const LinearCall plain = as_plain(c);
    if (c->M >= TC_MIN_TOKENS && opt->tensor_cores && gpu_linear_fits(g, LINEAR_MMA, &plain))
        return c->M >= WGMMA_MIN_TOKENS && gpu_linear_fits(g, LINEAR_WGMMA, &plain) ? LINEAR_WGMMA : LINEAR_MMA;
    if (opt->tma_gemv && gpu_linear_fits(g, LINEAR_GEMV_COPY, c)) return LINEAR_GEMV_COPY;
    if (c->form == LINEAR_PLAIN && w->rows >= TALL_ROWS && gpu_linear_fits(g, LINEAR_GEMV_TALL, c)) return LINEAR_GEMV_TALL;
    return LINEAR_GEMV;
}

int linear_has_epilogues(LinearKernel k) { return k == LINEAR_GEMV || k == LINEAR_GEMV_COPY; }

// The tall instance does not fold: with the norm its registers cost a block an SM (NOTES 24, 25).
int linear_folds_norm(LinearKernel k, const GpuOptions *opt) {
    return !opt->no_norm_fold && (k == LINEAR_GEMV || k == LINEAR_GEMV_COPY);
}

void resolve_gpu_options(GpuOptions *opt, double weight_bytes_per_token) {
    if (opt->tma_gemv == GPU_AUTO) opt->tma_gemv = weight_bytes_per_token >= COPY_GEMV_MIN_BYTES;
    opt->tma_gemv = opt->tma_gemv && gpu_has_sm90a();
    if (opt->pdl == GPU_AUTO) opt->pdl = weight_bytes_per_token < PDL_MAX_BYTES || opt->tma_gemv;
    if (opt->megakernel == GPU_AUTO) opt->megakernel = weight_bytes_per_token >= MEGAKERNEL_MIN_BYTES && gpu_has_sm90a();
    // tried on every INT8 model: it runs small models only (cuda/cluster_step.cuh's limits), and on
    // those it is ahead of the megakernel and of a kernel per matrix (NOTES 117, 118)
    if (opt->cluster_step == GPU_AUTO) opt->cluster_step = gpu_has_sm90a() ? GPU_WHERE_IT_FITS : 0;
}
#endif
