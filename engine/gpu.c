// gpu.c: the GPU executor (built when nvcc is there; kernels.h is its whole view of CUDA). The
// file is uploaded once, as it lies, and a device mirror of the Weights struct points into it.
// Each linear op asks dispatch.c which kernel serves it; a single token's decode step, and a
// batch's step, are captured once as CUDA graphs and replayed at every position.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "util.h"

#ifdef HAVE_GPU
#include "dispatch.h"
#include "kernels.h"

typedef struct {
    GpuCtx *ctx;
    Weights w;                  // device mirror of the model's Weights
    void *d_map, *d_owned;      // the uploaded file and the loader's repacked buffers
    void *d_half;               // --fp16: every linear weight as dense FP16, one block
    float *rope_freq;           // (head_dim / 2) RoPE frequencies: the file's, or rope_frequencies()
    float *att_part;            // the split attention's partial results
    const Model *model;         // host side, for translating pointers
    float *host_logits;         // (MAX_TOKENS, vocab)
    GpuOptions opt;
    GpuGraph *graph;            // the captured decode step, once made
    GpuGraph *batch_graph;      // the captured step of a batch (forward_batch) of batch_graph_B sequences
    int batch_graph_B;
    GpuGraph **capture_into;    // while a step is being captured: &graph or &batch_graph; else NULL
    GpuMega *mega;              // the decode step as one kernel (--megakernel), or NULL: per matrix
    GpuCluster *cluster;        // a small model's decode step on a thread-block cluster (--cluster-step), or NULL
    int cluster_now;            // this step is a decode step the cluster step runs (at a position it holds)
    MegaStage *record;          // while make_step_kernels runs the step: the ops append their stages here
    int recorded, record_cap;
    int decode_step;            // this step is one token's decode step (M = 1, last logits only)
    int argmax_ready;           // the step's argmax is queued (its kernel in the graph or after it, or the megakernel's)
    unsigned used[2];           // bit k: LinearKernel k served a call of one token [0], of more [1]
} GpuExec;

#define GPU(e) ((GpuExec *)(e)->priv)

// ----------------------------------------------------------------------------
// Linear layers: each call goes to the kernel dispatch.c chooses

static void run_linear(Exec *e, LinearKernel k, const LinearCall *c) {
    GPU(e)->used[c->M > 1] |= 1u << k;
    gpu_linear(GPU(e)->ctx, k, c);
}

// The input as plain rows: itself, or its RMSNorm written into xb by its own kernel.
static const float *gpu_op_apply_norm(Exec *e, Input in, int M) {
    if (!in.norm_w) return in.x;
    gpu_rmsnorm(GPU(e)->ctx, e->s.xb, in.x, in.norm_w, M, e->cfg.dim, e->cfg.norm_eps);
    return e->s.xb;
}

// The call's input: the norm folded into kernel k where it folds, else run first.
static void set_input(Exec *e, LinearCall *c, LinearKernel k, Input in) {
    const int fold = in.norm_w && linear_folds_norm(k, &GPU(e)->opt);
    c->x = fold ? in.x : gpu_op_apply_norm(e, in, c->M);
    c->norm_w = fold ? in.norm_w : NULL;
    c->norm_eps = e->cfg.norm_eps;
}

// While make_step_kernels records the decode step (GPU(e)->record): the op's stage appended instead of
// run. A linear stage keeps its norm (the megakernel folds every one).
static int record(Exec *e, MegaStage stage) {
    GpuExec *g = GPU(e);
    if (!g->record) return 0;
    if (g->recorded == g->record_cap) {
        fprintf(stderr, "run: internal error: the decode step has more stages than the megakernel's schedule holds\n");
        exit(1);
    }
    g->record[g->recorded++] = stage;
    return 1;
}
static int record_linear(Exec *e, LinearCall c) {
    c.norm_eps = e->cfg.norm_eps;
    return record(e, (MegaStage){.kind = MEGA_LINEAR, .linear = c});
}

static void gpu_op_matmul(Exec *e, float *out, Input in, int M, const Mat *w, int accumulate) {
    LinearCall c = {.form = LINEAR_PLAIN, .M = M, .x = in.x, .w = {w}, .y = out, .accumulate = accumulate, .norm_w = in.norm_w};
    if (record_linear(e, c)) return;
    const LinearKernel k = choose_linear(GPU(e)->ctx, &GPU(e)->opt, &c);
    set_input(e, &c, k, in);
    run_linear(e, k, &c);
}

// What follows q, k and v of a layer: the layer's biases (if any), RoPE, its cache rows.
static QkvRope qkv_rope(Exec *e, int layer, const Step *st) {
    const Config *p = &e->cfg;
    const Weights *w = e->w;   // the device mirror
    QkvRope r = {.rope_freq = GPU(e)->rope_freq, .key_cache = layer_cache(e, e->s.key_cache, layer),
                 .value_cache = layer_cache(e, e->s.value_cache, layer), .head_size = p->head_dim,
                 .kv_half = GPU(e)->opt.kv_half, .seq_stride = step_seq_stride(e, st)};
    if (w->bq) {
        r.bias[0] = w->bq + (size_t)layer * q_dim_of(p);
        r.bias[1] = w->bk + (size_t)layer * kv_width_of(p);
        r.bias[2] = w->bv + (size_t)layer * kv_width_of(p);
    }
    return r;
}

// q, k, v in one launch with the biases, RoPE and the KV store in its epilogue where the chosen
// kernel has epilogues; else three linear calls and the kernel that does the rest.
static void gpu_op_qkv(Exec *e, int layer, Input in, const Step *st, const Mat *wq, const Mat *wk, const Mat *wv) {
    LinearCall c = {.form = LINEAR_QKV_ROPE, .M = st->M, .x = in.x, .w = {wq, wk, wv}, .y = e->s.q, .norm_w = in.norm_w};
    c.qkv = qkv_rope(e, layer, st);
    if (record_linear(e, c)) return;
    const LinearKernel k = choose_linear(GPU(e)->ctx, &GPU(e)->opt, &c);
    if (!linear_has_epilogues(k)) {
        qkv_by_matmul(e, layer, in, st, wq, wk, wv);
        gpu_rope_store(GPU(e)->ctx, e->s.q, e->s.k, e->s.v, st->M, q_dim_of(&e->cfg), kv_width_of(&e->cfg), &c.qkv);
        return;
    }
    set_input(e, &c, k, in);
    run_linear(e, k, &c);
}

// hb = silu(in w1^T) * (in w3^T): one launch with the SwiGLU in its epilogue, or two and a kernel.
static void gpu_op_ffn_up(Exec *e, Input in, int M, const Mat *w1, const Mat *w3) {
    LinearCall c = {.form = LINEAR_SWIGLU, .M = M, .x = in.x, .w = {w1, w3}, .y = e->s.hb, .norm_w = in.norm_w};
    if (record_linear(e, c)) return;
    const LinearKernel k = choose_linear(GPU(e)->ctx, &GPU(e)->opt, &c);
    if (!linear_has_epilogues(k)) {
        const Input x = plain(gpu_op_apply_norm(e, in, M));
        gpu_op_matmul(e, e->s.hb, x, M, w1, 0);
        gpu_op_matmul(e, e->s.hb2, x, M, w3, 0);
        gpu_swiglu(GPU(e)->ctx, e->s.hb, e->s.hb2, M * w1->rows);
        return;
    }
    set_input(e, &c, k, in);
    run_linear(e, k, &c);
}

// Appends a and b to buf (n bytes), cut short where it is full.
static void append(char *buf, size_t n, const char *a, const char *b) {
    const size_t at = strlen(buf);
    if (at + 1 < n) snprintf(buf + at, n - at, "%s%s", a, b);
}

// "decode <kernels>; batches <kernels>": the linear kernels this executor has chosen so far.
static void gpu_op_describe_run(const Exec *e, char *buf, size_t n) {
    static const char *const phase[2] = {"decode ", "batches "};
    buf[0] = '\0';
    for (int p = 0; p < 2; p++) {
        if (!GPU(e)->used[p]) continue;
        append(buf, n, buf[0] ? "; " : "linear kernels: ", phase[p]);
        for (int k = 0, first = 1; k < LINEAR_KERNELS; k++)
            if (GPU(e)->used[p] >> k & 1) {
                append(buf, n, first ? "" : " + ", gpu_linear_name(k));
                first = 0;
            }
    }
}

// ----------------------------------------------------------------------------
// The rest of the step

// Token ids and the position go to device memory; the decode step runs as a replayed graph,
// whose last kernel is the greedy argmax (so that one int crosses to the host per token). So does
// a batch's step (one token of each of M sequences at one position): every launch in it reads the
// position and tokens from device memory too, and a generation's batches are all of one size
// (a graph for another size replaces it).
static void gpu_op_end(Exec *e);

// Whether a decode step is the megakernel or the cluster step and takes its own argmax (and
// feeds the next step).
static int mega_argmax(const GpuExec *g) { return g->cluster_now || (g->mega && gpu_mega_argmax(g->mega)); }

// Whether the cluster step runs a decode step at position pos.
static int cluster_runs(const GpuExec *g, int pos) { return g->cluster && pos < gpu_cluster_positions(g->cluster); }

// The decode step as the megakernel or the cluster step, then the argmax where the kernel does
// not take it (gpu_op_end, which also ends a capture).
static StepStart run_mega(Exec *e) {
    GpuExec *g = GPU(e);
    if (g->cluster_now) gpu_cluster_launch(g->ctx, g->cluster);
    else gpu_mega_launch(g->ctx, g->mega);
    gpu_op_end(e);
    return STEP_ALREADY_RAN;
}

static StepStart gpu_op_begin(Exec *e, const int *tokens, const Step *st, int all_logits) {
    GpuExec *g = GPU(e);
    if (g->record) return RUN_THE_OPS;   // make_step_kernels: nothing runs
    gpu_set_inputs(g->ctx, tokens, st->M, st->pos);
    const int batch_step = st->layout == ONE_TOKEN_PER_SEQUENCE;
    g->decode_step = st->M == 1 && !all_logits && !batch_step;
    g->cluster_now = g->decode_step && cluster_runs(g, st->pos);
    g->argmax_ready = 0;
    const StepStart ops = g->decode_step && (g->mega || g->cluster_now) ? STEP_ALREADY_RAN : RUN_THE_OPS;
    // the cluster step is launched, not replayed: a step's layers then start while the classifier
    // of the step queued before it runs (PDL), where a graph starts after the graph before it
    if (g->cluster_now || !g->opt.use_graph || !(g->decode_step || batch_step)) return ops == STEP_ALREADY_RAN ? run_mega(e) : ops;
    if (batch_step && g->batch_graph && g->batch_graph_B != st->M) {
        gpu_graph_free(g->batch_graph);
        g->batch_graph = NULL;
    }
    GpuGraph **slot = batch_step ? &g->batch_graph : &g->graph, *graph = *slot;
    if (graph) {
        gpu_graph_launch(g->ctx, graph);
        g->argmax_ready = g->decode_step;
        return STEP_ALREADY_RAN;
    }
    gpu_graph_begin(g->ctx);   // the ops below are recorded, not run
    g->capture_into = slot;
    if (batch_step) g->batch_graph_B = st->M;
    return ops == STEP_ALREADY_RAN ? run_mega(e) : ops;
}

static void gpu_op_end(Exec *e) {
    GpuExec *g = GPU(e);
    if (g->record) return;
    if (g->decode_step) {
        if (!mega_argmax(g)) gpu_argmax_launch(g->ctx, e->s.logits, e->cfg.vocab_size, 1);
        g->argmax_ready = 1;
    }
    if (!g->capture_into) return;
    GpuGraph **graph = g->capture_into;
    g->capture_into = NULL;
    *graph = gpu_graph_end(g->ctx);
    gpu_graph_launch(g->ctx, *graph);   // now run what was recorded
}

static void gpu_op_embed(Exec *e, const int *tokens, int M) {
    (void)tokens;   // already on the device (begin)
    if (record(e, (MegaStage){.kind = MEGA_EMBED, .embedding = &e->w->tok_embedding, .x = e->s.x})) return;
    gpu_embed(GPU(e)->ctx, e->s.x, M, &e->w->tok_embedding);
}

static void gpu_op_attention(Exec *e, int layer, const Step *st) {
    const Config *p = &e->cfg;
    if (record(e, (MegaStage){.kind = MEGA_ATTENTION, .q = e->s.q, .key_cache = layer_cache(e, e->s.key_cache, layer),
                              .value_cache = layer_cache(e, e->s.value_cache, layer), .out = e->s.xb}))
        return;
    gpu_attention(GPU(e)->ctx, e->s.xb, GPU(e)->att_part, e->s.q, layer_cache(e, e->s.key_cache, layer),
                  layer_cache(e, e->s.value_cache, layer), st->M, p->n_heads, p->n_kv_heads, p->head_dim, p->seq_len,
                  GPU(e)->opt.kv_half, step_seq_stride(e, st));
}

static const float *gpu_op_to_host(Exec *e, const float *logits, int rows) {
    gpu_download(GPU(e)->ctx, GPU(e)->host_logits, logits, (size_t)rows * e->cfg.vocab_size * sizeof(float));
    return GPU(e)->host_logits;
}

// The decode step already took its argmax (its kernel, or the megakernel): only the result is waited for.
static int gpu_op_argmax(Exec *e, const float *logits) {
    GpuExec *g = GPU(e);
    if (g->argmax_ready && logits == e->s.logits) {
        g->argmax_ready = 0;
        return gpu_argmax_result(g->ctx);
    }
    return gpu_argmax(g->ctx, logits, e->cfg.vocab_size);
}

// A greedy batch's tokens: B ints cross to the host instead of B rows of logits.
static void gpu_op_argmax_rows(Exec *e, const float *logits, int rows, int *out) {
    gpu_argmax_rows(GPU(e)->ctx, logits, rows, e->cfg.vocab_size, out);
}

// Sampling on the device: one int a row crosses to the host instead of the row's logits.
static int gpu_op_sample_rows(Exec *e, const float *logits, int rows, float temperature, float topp, const float *coins,
                              int *out) {
    GpuExec *g = GPU(e);
    if (g->opt.host_sample || !gpu_sample_supported(e->cfg.vocab_size)) return -1;
    gpu_sample_rows(g->ctx, logits, rows, e->cfg.vocab_size, temperature, topp, coins, out);
    return 0;
}

// Queues the decode step at position pos, its token the one the step before feeds it: the
// cluster step's launches, or the step's graph; 0 where neither is there yet.
static int queue_fed_step(GpuExec *g, int pos) {
    if (cluster_runs(g, pos)) gpu_cluster_launch(g->ctx, g->cluster);
    else if (g->graph) gpu_graph_launch(g->ctx, g->graph);
    else return 0;
    return 1;
}

// Greedy decode with the step replayed as a graph (or the cluster step launched) whose argmax (its
// last kernel, or the megakernel's or cluster step's own) feeds the next step's input on the
// device and writes the token to host memory: step p + 1
// is queued before step p's token is read, so the GPU never waits for the host (printing, the
// next launch), and the stream holds nothing but the steps. A step queued past a BOS is computed
// and discarded.
static int gpu_op_decode_greedy(Exec *e, const float *logits, int pos, int steps, int (*on_token)(void *ctx, int token),
                                void *ctx) {
    GpuExec *g = GPU(e);
    if (!g->opt.use_graph) return NOT_PIPELINED;
    int next = gpu_op_argmax(e, logits), generated = 0, queued = 0;
    gpu_step_tokens_clear(g->ctx);   // (the stream is idle: gpu_op_argmax waited)
    for (;;) {
        pos++, generated++;
        if (next == BOS) break;
        if (on_token(ctx, next)) {
            generated = -1;
            break;
        }
        if (pos >= steps) break;
        // a step not queued (the first, and the first at positions past the cluster step's) takes
        // its inputs from the host (and captures its graph); the step after it, the token the
        // device feeds it; then this step's token, as it lands in host memory
        if (!queued) forward(e, &next, 1, pos, 0);
        queued = pos + 1 < steps && queue_fed_step(g, pos + 1);
        next = gpu_step_token_wait(g->ctx, pos);
    }
    g->argmax_ready = 0;
    gpu_sync(g->ctx);
    return generated;
}

static void device_copy(Exec *e, void *dst, const void *src, size_t bytes) { gpu_copy(GPU(e)->ctx, dst, src, bytes); }
static void gpu_op_copy_cache(Exec *e, int rows) { for_each_cache_copy(e, rows, device_copy); }

static void gpu_op_release(Exec *e) {
    GpuExec *g = GPU(e);
    RunState *s = &e->s;
    void *bufs[] = {s->x, s->xb, s->q, s->k, s->v, s->hb, s->hb2, s->logits, s->key_cache, s->value_cache, g->att_part,
                    g->rope_freq};
    gpu_sync(g->ctx);
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gpu_free(bufs[i]);
    if (g->graph) gpu_graph_free(g->graph);
    gpu_mega_free(g->mega);
    if (g->cluster) gpu_cluster_free(g->cluster);
    if (g->batch_graph) gpu_graph_free(g->batch_graph);
    gpu_free(g->d_map);
    if (g->d_owned) gpu_free(g->d_owned);
    if (g->d_half) gpu_free(g->d_half);
    free(g->w.wq);
    free(g->host_logits);
    gpu_destroy(g->ctx);
    free(g);
}

// Every path (fused, --unfused, --fp16, FP32 weights) runs these ops: they differ only in the
// kernels dispatch.c chooses for the linear layers.
static const Ops gpu_ops = {
    .name = "gpu",
    .begin = gpu_op_begin,
    .end = gpu_op_end,
    .embed = gpu_op_embed,
    .matmul = gpu_op_matmul,
    .qkv = gpu_op_qkv,
    .ffn_up = gpu_op_ffn_up,
    .attention = gpu_op_attention,
    .apply_norm = gpu_op_apply_norm,
    .to_host = gpu_op_to_host,
    .argmax = gpu_op_argmax,
    .argmax_rows = gpu_op_argmax_rows,
    .sample_rows = gpu_op_sample_rows,
    .decode_greedy = gpu_op_decode_greedy,
    .copy_cache = gpu_op_copy_cache,
    .describe_run = gpu_op_describe_run,
    .release = gpu_op_release,
};

// ----------------------------------------------------------------------------
// Upload

// The device address of a host pointer into the model's mapped file or its owned buffers.
static const void *device_ptr(const GpuExec *g, const void *host) {
    const char *h = host, *map = g->model->map, *owned = g->model->owned;
    if (!host) return NULL;
    if (h >= map && h < map + g->model->map_bytes) return (char *)g->d_map + (h - map);
    if (owned && h >= owned && h < owned + g->model->owned_bytes) return (char *)g->d_owned + (h - owned);
    fprintf(stderr, "run: internal error: a weight lies outside the model's buffers\n");
    exit(1);
}

static Mat device_mat(const GpuExec *g, const Mat *m) {
    Mat d = *m;
    d.f = device_ptr(g, m->f);
    d.q = device_ptr(g, m->q);
    d.s = device_ptr(g, m->s);
    return d;
}

// Largest linear weight, and all of them together, in elements (the unfused and FP16 paths).
static size_t largest_mat(const Model *m, size_t *all_elems) {
    size_t most = 0;
    *all_elems = 0;
    for (int i = 0; i < n_linear(&m->cfg); i++) {
        const Mat *w = linear_at((Weights *)&m->w, &m->cfg, i);
        size_t n = (size_t)w->rows * w->cols;
        most = n > most ? n : most;
        *all_elems += n;
    }
    return most;
}

static void mirror_weights(GpuExec *g, const Model *m) {
    const Weights *h = &m->w;
    Weights *d = &g->w;
    if (alloc_layer_mats(d, m->cfg.n_layers)) {
        fprintf(stderr, "run: out of memory\n");
        exit(1);
    }
    d->tok_embedding = device_mat(g, &h->tok_embedding);
    d->wcls = device_mat(g, &h->wcls);
    for (int i = 0; i < 7 * m->cfg.n_layers; i++) d->wq[i] = device_mat(g, &h->wq[i]);
    d->rms_att = device_ptr(g, h->rms_att);
    d->rms_ffn = device_ptr(g, h->rms_ffn);
    d->rms_final = device_ptr(g, h->rms_final);
    d->bq = device_ptr(g, h->bq), d->bk = device_ptr(g, h->bk), d->bv = device_ptr(g, h->bv);
    d->rope_freq = device_ptr(g, h->rope_freq);
}

// The RoPE frequency table on the device: the file's, or rope_frequencies() of the config (for
// llama2.c's models exactly what its expression computes).
static float *upload_rope_freq(const Model *m, const Config *p) {
    const size_t bytes = (size_t)p->head_dim / 2 * sizeof(float);
    float *host = xcalloc(1, bytes), *dev = gpu_alloc(bytes);
    if (m->w.rope_freq) memcpy(host, m->w.rope_freq, bytes);
    else rope_frequencies(p, host);
    gpu_upload(dev, host, bytes);
    free(host);
    return dev;
}

// --fp16: every linear weight converted once to dense FP16 (the FP16 baseline; the INT8 or FP32
// originals stay for the embedding lookup).
static void make_half_weights(GpuExec *g, const Config *c, size_t all_elems) {
    g->d_half = gpu_alloc(all_elems * 2);
    size_t at = 0;
    for (int i = 0; i < n_linear(c); i++) {
        Mat *w = linear_at(&g->w, c, i);
        w->h = (char *)g->d_half + at * 2;
        gpu_to_half(g->ctx, (void *)w->h, w);
        at += (size_t)w->rows * w->cols;
    }
    gpu_sync(g->ctx);
}

// The decode step's schedule for the megakernel and the cluster step: forward() run once with the
// ops recording their stages (the embedding row; per layer q, k and v with the norm, biases, RoPE
// and KV store, attention, the output projection + residual, w1 and w3 with the SwiGLU, w2 +
// residual; the classifier): the same calls, on the same buffers, as the per-matrix path's
// decode step. Each asked for that cannot run here says why (the cluster step tried by default does
// not), and the step runs a kernel per matrix or the megakernel.
static void make_step_kernels(Exec *e, int mega, int cluster) {
    const Config *p = &e->cfg;
    GpuExec *g = GPU(e);
    g->record_cap = 2 + 5 * p->n_layers, g->recorded = 0;
    g->record = xcalloc((size_t)g->record_cap, sizeof(MegaStage));
    const int token = 0;
    forward(e, &token, 1, 0, 0);
    const MegaAttention at = {p->n_heads, p->n_kv_heads, p->head_dim, p->seq_len, g->opt.kv_half};
    char no[ERR_LEN];
    if (mega && !(g->mega = gpu_mega_create(g->ctx, g->record, g->recorded, at, no)))
        fprintf(stderr, "run: the decode step runs a kernel per matrix: the megakernel cannot run here (%s)\n", no);
    if (cluster && !(g->cluster = gpu_cluster_create(g->ctx, g->record, g->recorded, at, no)) && cluster != GPU_WHERE_IT_FITS)
        fprintf(stderr, "run: the decode step runs without the cluster step: it cannot run here (%s)\n", no);
    free(g->record);
    g->record = NULL;
}

// "gpu int8 fused; CUDA graph, PDL, FP16 KV cache, copy-engine GEMV": the path and its options.
static void describe_path(Exec *e, const Model *m, const GpuOptions *o) {
    const char *path = o->path == PATH_FP16 ? "gpu fp16 cuBLAS (weights converted at load)"
                     : !m->quantized         ? "gpu fp32 cuBLAS"
                     : o->path == PATH_UNFUSED ? "gpu int8 unfused (dequant + cuBLAS)"
                                               : "gpu int8 fused";
    const int fused = m->quantized && o->path == PATH_FUSED;
    char mega[448] = "";
    if (GPU(e)->mega) {
        strcpy(mega, "; decode megakernel: ");
        gpu_mega_describe(GPU(e)->mega, mega + strlen(mega), sizeof mega - strlen(mega));
    }
    if (GPU(e)->cluster) {
        const size_t at = strlen(mega);
        snprintf(mega + at, sizeof mega - at, "; decode cluster step: ");
        gpu_cluster_describe(GPU(e)->cluster, mega + strlen(mega), sizeof mega - strlen(mega));
    }
    snprintf(e->desc, sizeof e->desc, "%s; %s, %s, FP%d KV cache%s%s%s", path, o->use_graph ? "CUDA graph" : "no graph",
             o->pdl ? "PDL" : "no PDL", 8 * e->kv_bytes, o->tma_gemv && fused ? ", copy-engine GEMV" : "",
             o->no_norm_fold && fused ? ", no norm folding" : "", mega);
}

// The widest input of a linear layer (dim, hidden_dim or q_dim: wo's).
static int widest_input(const Config *p) {
    const int w = p->dim > p->hidden_dim ? p->dim : p->hidden_dim;
    return w > q_dim_of(p) ? w : q_dim_of(p);
}

// Uploads the model once (the file as it lies, plus any repacked buffers) and allocates the
// activations and KV cache on the GPU. Checks that it all fits before allocating any of it.
int gpu_exec_init(Exec *e, const Model *m, GpuOptions opt, char *why) {
    const Config cfg = exec_config(m, opt.context), *p = &cfg;
    int head_size = p->head_dim, kv_bytes = opt.kv_half ? 2 : 4, n_seqs = opt.n_seqs > 0 ? opt.n_seqs : 1;
    if (gpu_usable(why)) return GPU_UNAVAILABLE;
    if (head_size > gpu_attention_max_head_size()) {
        snprintf(why, ERR_LEN, "head size %d is beyond the GPU attention kernel's %d", head_size, gpu_attention_max_head_size());
        return GPU_UNAVAILABLE;
    }
    StateSizes z = state_sizes(p);
    size_t all_elems, largest = largest_mat(m, &all_elems);
    size_t part = gpu_attention_part_floats(MAX_TOKENS, p->n_heads, head_size, p->seq_len);
    size_t weights = m->map_bytes + m->owned_bytes + (opt.path == PATH_FP16 ? all_elems * 2 : 0);
    size_t kv = 2 * z.cache * kv_bytes * n_seqs;
    size_t acts = (z.x + z.xb + z.q + 2 * z.kv + 2 * z.hidden + z.logits + part) * sizeof(float);
    size_t scratch = m->quantized && opt.path == PATH_UNFUSED ? largest : 0, free_b, total_b;
    size_t half_in = (size_t)MAX_TOKENS * round_up(widest_input(p), 64);   // FP16 inputs: --fp16, tensor cores (K padded to 64)
    size_t need = weights + kv + acts + scratch * sizeof(float) + half_in * 2 + ((size_t)512 << 20);   // + cuBLAS, context
    gpu_mem_info(&free_b, &total_b);
    if (need > free_b) {
        snprintf(why, ERR_LEN,
                 "the model needs %.2f GiB on the GPU (weights %.2f, KV cache %.2f, activations and scratch %.2f, "
                 "reserve 0.50) but %s has %.2f GiB free of %.2f",
                 need / 1073741824.0, weights / 1073741824.0, kv / 1073741824.0,
                 (acts + scratch * sizeof(float) + half_in * 2) / 1073741824.0, gpu_name(), free_b / 1073741824.0,
                 total_b / 1073741824.0);
        return GPU_TOO_SMALL;
    }
    resolve_gpu_options(&opt, (double)weight_bytes_per_token(m, opt.path == PATH_FP16));
    GpuExec *g = xcalloc(1, sizeof(GpuExec));
    g->model = m;
    g->ctx = gpu_create(scratch, half_in);
    g->opt = opt;
    gpu_set_pdl(g->ctx, opt.pdl);
    g->d_map = gpu_alloc(m->map_bytes);
    gpu_upload(g->d_map, m->map, m->map_bytes);
    if (m->owned_bytes) {
        g->d_owned = gpu_alloc(m->owned_bytes);
        gpu_upload(g->d_owned, m->owned, m->owned_bytes);
    }
    mirror_weights(g, m);
    g->rope_freq = upload_rope_freq(m, p);
    if (opt.path == PATH_FP16) make_half_weights(g, p, all_elems);
    g->att_part = gpu_alloc(part * sizeof(float));
    g->host_logits = xcalloc(z.logits, sizeof(float));
    memset(e, 0, sizeof *e);
    e->ops = &gpu_ops;
    e->cfg = *p;
    e->kv_bytes = kv_bytes;
    e->n_seqs = n_seqs;
    e->w = &g->w;
    e->priv = g;
    alloc_state(&e->s, p, kv_bytes, n_seqs, gpu_alloc);
    const int fused_int8 = m->quantized && opt.path == PATH_FUSED;
    if (fused_int8 && (opt.megakernel || opt.cluster_step)) make_step_kernels(e, opt.megakernel, opt.cluster_step);
    describe_path(e, m, &opt);
    return 0;
}

int gpu_usable(char *why) { return gpu_probe(why) ? GPU_UNAVAILABLE : 0; }
#else
int gpu_exec_init(Exec *e, const Model *m, GpuOptions opt, char *why) {
    (void)e, (void)m, (void)opt;
    return gpu_usable(why);
}
int gpu_usable(char *why) {
    snprintf(why, ERR_LEN, "this build has no GPU support (nvcc was not found at build time)");
    return GPU_UNAVAILABLE;
}
#endif
