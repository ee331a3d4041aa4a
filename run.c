// run.c: inference for Llama-2-style transformers with group-wise INT8 (or FP32) weights.
//
// One model, two executors. model.c turns a checkpoint into one Weights struct of host pointers
// into the mmap. An executor answers one question, "logits for M tokens at position pos", through
// a table of operations (Ops): the CPU executor below reads the host weights directly; the GPU
// executor (kernels.cu, behind kernels.h) uploads them once into a device mirror of the same struct.
// forward() is written once, against Ops; the GPU's fused and --unfused paths differ only in the
// operation that does a linear layer.
//
// Sections: executor interface | CPU executor | forward | GPU executor | tokenizer | sampler |
//           generation and perplexity | CLI
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model.h"
#ifdef HAVE_GPU
#include "kernels.h"
#endif

#define MAX_BATCH 64   // tokens per forward call: prompts are prefilled in chunks of this many
#define BOS 1          // llama2.c's tokenizer: 1 begins a sequence, 2 ends it

static long time_in_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000L + t.tv_nsec / 1000;
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n, size);
    if (!p) {
        fprintf(stderr, "run: out of memory allocating %zu bytes\n", n * size);
        exit(1);
    }
    return p;
}

// ----------------------------------------------------------------------------
// Executor interface

// Activations and the KV cache; host memory for the CPU executor, device memory for the GPU's.
typedef struct {
    float *x, *xb;                    // (MAX_BATCH, dim): residual stream, normed input / attention output
    float *q;                         // (MAX_BATCH, dim)
    float *k, *v;                     // (MAX_BATCH, kv_dim): the new tokens' keys and values
    float *hb, *hb2;                  // (MAX_BATCH, hidden_dim)
    float *att;                       // CPU: (seq_len) scores of one head
    float *logits;                    // (MAX_BATCH, vocab)
    float *key_cache, *value_cache;   // (layer, seq_len, kv_dim)
} RunState;

// The operations forward() is written against. Positions and token ids are passed on every call;
// the GPU executor keeps them in device memory (set by begin), so that a decode step captured as a
// CUDA graph replays at any position.
typedef struct Exec Exec;
typedef struct {
    const char *name;
    // Optional: called first; returns 1 if it ran the whole forward itself (a replayed graph).
    int (*begin)(Exec *e, const int *tokens, int M, int pos, int all_logits);
    void (*end)(Exec *e);   // optional: called last
    void (*embed)(Exec *e, const int *tokens, int M);                          // x = rows of the embedding
    void (*rmsnorm)(Exec *e, float *out, const float *in, const float *w, int M);   // rows of dim
    // out (M, rows) = in (M, cols) W^T; with accumulate, out += that instead (the residual add)
    void (*matmul)(Exec *e, float *out, const float *in, int M, const Mat *w, int accumulate);
    // q, k, v = in W^T for the three attention weights (one launch on the GPU)
    void (*qkv)(Exec *e, const float *in, int M, const Mat *wq, const Mat *wk, const Mat *wv);
    // hb = silu(in w1^T) * (in w3^T): the feed-forward's first half (one launch on the GPU)
    void (*ffn_up)(Exec *e, const float *in, int M, const Mat *w1, const Mat *w3);
    // RoPE on q and k of tokens at pos..pos+M-1, then k and v stored in the layer's cache rows
    void (*rope_store)(Exec *e, int layer, int M, int pos);
    void (*attention)(Exec *e, int layer, int M, int pos);                      // xb = attention of q over the cache
    const float *(*to_host)(Exec *e, const float *logits, int rows);           // logits readable by the host
    int (*argmax)(Exec *e, const float *logits);                                // greedy token of one row
    void (*release)(Exec *e);
} Ops;

struct Exec {
    const Ops *ops;
    Config cfg;
    const Weights *w;   // host weights (CPU) or their device mirror (GPU)
    RunState s;
    void *priv;         // executor-private state (GPU)
};

// ----------------------------------------------------------------------------
// CPU executor: plain C, the reference every GPU result is tested against.

static void cpu_embed(Exec *e, const int *tokens, int M) {
    const Mat *t = &e->w->tok_embedding;
    for (int m = 0; m < M; m++) {
        float *x = e->s.x + (size_t)m * t->cols;
        size_t row = (size_t)tokens[m];
        if (t->f) {
            memcpy(x, t->f + row * t->stride, t->cols * sizeof(float));
            continue;
        }
        for (int j = 0; j < t->cols; j++) x[j] = t->q[row * t->stride + j] * t->s[row * t->groups + j / t->gs];
    }
}

static void cpu_rmsnorm(Exec *e, float *out, const float *in, const float *w, int M) {
    int n = e->cfg.dim;
    for (int m = 0; m < M; m++) {
        const float *x = in + (size_t)m * n;
        float ss = 0.0f;
        for (int j = 0; j < n; j++) ss += x[j] * x[j];
        ss /= n;
        ss += 1e-5f;
        ss = 1.0f / sqrtf(ss);
        for (int j = 0; j < n; j++) out[(size_t)m * n + j] = w[j] * (ss * x[j]);
    }
}

// One output of an INT8 row: the dot product runs group by group, each group's integer weights
// against the input, then times the group's scale: dequantization in the inner loop, as the GPU's
// fused kernel does it, with no FP32 copy of the weights.
static float dot_q8(const int8_t *q, const float *s, int cols, int gs, const float *x) {
    float val = 0.0f;
    for (int lo = 0, g = 0; lo < cols; lo += gs, g++) {
        int hi = lo + gs < cols ? lo + gs : cols;
        float sum = 0.0f;
        for (int j = lo; j < hi; j++) sum += (float)q[j] * x[j];
        val += sum * s[g];
    }
    return val;
}

// Each weight row is read once for all M inputs (prefill batches share the weight traffic).
static void cpu_matmul(Exec *e, float *out, const float *in, int M, const Mat *w, int accumulate) {
    (void)e;
    int K = w->cols, N = w->rows;
    for (int r = 0; r < N; r++) {
        for (int m = 0; m < M; m++) {
            const float *x = in + (size_t)m * K;
            float val = 0.0f;
            if (w->f) {
                const float *row = w->f + (size_t)r * w->stride;
                for (int j = 0; j < K; j++) val += row[j] * x[j];
            } else {
                val = dot_q8(w->q + (size_t)r * w->stride, w->s + (size_t)r * w->groups, K, w->gs, x);
            }
            if (accumulate) out[(size_t)m * N + r] += val;
            else out[(size_t)m * N + r] = val;
        }
    }
}

// q, k, v as three linear layers through the executor's own matmul (every executor but the GPU's
// fused one, which does them in one launch).
static void qkv_by_matmul(Exec *e, const float *in, int M, const Mat *wq, const Mat *wk, const Mat *wv) {
    e->ops->matmul(e, e->s.q, in, M, wq, 0);
    e->ops->matmul(e, e->s.k, in, M, wk, 0);
    e->ops->matmul(e, e->s.v, in, M, wv, 0);
}

static void cpu_ffn_up(Exec *e, const float *in, int M, const Mat *w1, const Mat *w3) {
    float *h = e->s.hb, *g = e->s.hb2;
    cpu_matmul(e, h, in, M, w1, 0);
    cpu_matmul(e, g, in, M, w3, 0);
    for (size_t i = 0; i < (size_t)M * w1->rows; i++) {
        float val = h[i];
        val *= (1.0f / (1.0f + expf(-val)));   // silu(x) = x * sigmoid(x)
        h[i] = val * g[i];
    }
}

// RoPE: rotate each pair (2i, 2i+1) of every head by pos * 10000^(-2i/head_size); keys only cover
// kv_dim. Same operations as llama2.c, so FP32 results match it bit for bit. Then the new keys
// and values go into the cache rows pos..pos+M-1.
static void cpu_rope_store(Exec *e, int layer, int M, int pos) {
    const Config *p = &e->cfg;
    int dim = p->dim, head_size = dim / p->n_heads, kv_dim = head_size * p->n_kv_heads;
    for (int m = 0; m < M; m++) {
        float *q = e->s.q + (size_t)m * dim, *k = e->s.k + (size_t)m * kv_dim;
        for (int i = 0; i < dim; i += 2) {
            int head_dim = i % head_size;
            float freq = 1.0f / powf(10000.0f, head_dim / (float)head_size);
            float val = (pos + m) * freq, fcr = cosf(val), fci = sinf(val);
            for (int v = 0; v < (i < kv_dim ? 2 : 1); v++) {
                float *vec = v == 0 ? q : k;
                float v0 = vec[i], v1 = vec[i + 1];
                vec[i] = v0 * fcr - v1 * fci;
                vec[i + 1] = v0 * fci + v1 * fcr;
            }
        }
    }
    size_t at = ((size_t)layer * p->seq_len + pos) * kv_dim;
    memcpy(e->s.key_cache + at, e->s.k, (size_t)M * kv_dim * sizeof(float));
    memcpy(e->s.value_cache + at, e->s.v, (size_t)M * kv_dim * sizeof(float));
}

static void softmax(float *x, int n) {
    float max_val = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > max_val) max_val = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max_val);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= sum;
}

// Causal grouped-query attention: token m (at pos + m) attends to cache positions 0..pos+m;
// query head h reads key/value head h / (n_heads / n_kv_heads).
static void cpu_attention(Exec *e, int layer, int M, int pos) {
    const Config *p = &e->cfg;
    int head_size = p->dim / p->n_heads, kv_dim = head_size * p->n_kv_heads, kv_mul = p->n_heads / p->n_kv_heads;
    size_t loff = (size_t)layer * p->seq_len * kv_dim;
    float *att = e->s.att;
    for (int m = 0; m < M; m++) {
        int last = pos + m;
        for (int h = 0; h < p->n_heads; h++) {
            const float *q = e->s.q + (size_t)m * p->dim + h * head_size;
            for (int t = 0; t <= last; t++) {
                const float *k = e->s.key_cache + loff + (size_t)t * kv_dim + (h / kv_mul) * head_size;
                float score = 0.0f;
                for (int i = 0; i < head_size; i++) score += q[i] * k[i];
                att[t] = score / sqrtf(head_size);
            }
            softmax(att, last + 1);
            float *xb = e->s.xb + (size_t)m * p->dim + h * head_size;
            memset(xb, 0, head_size * sizeof(float));
            for (int t = 0; t <= last; t++) {
                const float *v = e->s.value_cache + loff + (size_t)t * kv_dim + (h / kv_mul) * head_size;
                for (int i = 0; i < head_size; i++) xb[i] += att[t] * v[i];
            }
        }
    }
}

static const float *cpu_to_host(Exec *e, const float *logits, int rows) {
    (void)e, (void)rows;
    return logits;
}

static int argmax_row(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

static int cpu_argmax(Exec *e, const float *logits) { return argmax_row(logits, e->cfg.vocab_size); }

static void cpu_release(Exec *e) {
    RunState *s = &e->s;
    float *bufs[] = {s->x, s->xb, s->q, s->k, s->v, s->hb, s->hb2, s->att, s->logits, s->key_cache, s->value_cache};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

static const Ops cpu_ops = {"cpu", NULL, NULL, cpu_embed, cpu_rmsnorm, cpu_matmul, qkv_by_matmul, cpu_ffn_up,
                            cpu_rope_store, cpu_attention, cpu_to_host, cpu_argmax, cpu_release};

// Sizes of the RunState buffers, in floats, shared by both executors' allocations.
typedef struct {
    size_t x, kv, hidden, logits, cache;
} StateSizes;

static StateSizes state_sizes(const Config *p) {
    size_t kv_dim = (size_t)p->dim / p->n_heads * p->n_kv_heads;
    return (StateSizes){(size_t)MAX_BATCH * p->dim, MAX_BATCH * kv_dim, (size_t)MAX_BATCH * p->hidden_dim,
                        (size_t)MAX_BATCH * p->vocab_size, (size_t)p->n_layers * p->seq_len * kv_dim};
}

static void alloc_state(RunState *s, const Config *p, void *(*alloc)(size_t bytes)) {
    StateSizes z = state_sizes(p);
    s->x = alloc(z.x * sizeof(float)), s->xb = alloc(z.x * sizeof(float)), s->q = alloc(z.x * sizeof(float));
    s->k = alloc(z.kv * sizeof(float)), s->v = alloc(z.kv * sizeof(float));
    s->hb = alloc(z.hidden * sizeof(float)), s->hb2 = alloc(z.hidden * sizeof(float));
    s->logits = alloc(z.logits * sizeof(float));
    s->key_cache = alloc(z.cache * sizeof(float)), s->value_cache = alloc(z.cache * sizeof(float));
}

static void *host_alloc(size_t bytes) { return xcalloc(bytes, 1); }

static void cpu_exec_init(Exec *e, const Model *m) {
    memset(e, 0, sizeof *e);
    e->ops = &cpu_ops;
    e->cfg = m->cfg;
    e->w = &m->w;
    alloc_state(&e->s, &m->cfg, host_alloc);
    e->s.att = xcalloc(m->cfg.seq_len, sizeof(float));
}

// ----------------------------------------------------------------------------
// forward: the whole model, once, for any executor.
// Runs tokens[0..M) at positions pos..pos+M-1 (M <= MAX_BATCH, pos + M <= seq_len, ids checked
// by the caller). Returns the executor's logits buffer: M rows of vocab_size when all_logits,
// else one row, the last token's.

static const float *forward(Exec *e, const int *tokens, int M, int pos, int all_logits) {
    const Config *p = &e->cfg;
    const Weights *w = e->w;
    const Ops *o = e->ops;
    RunState *s = &e->s;
    int dim = p->dim;
    for (int m = 0; m < M; m++)
        if (tokens[m] < 0 || tokens[m] >= p->vocab_size) {
            fprintf(stderr, "run: token id %d is outside the vocabulary [0, %d)\n", tokens[m], p->vocab_size);
            exit(1);
        }
    if (M < 1 || M > MAX_BATCH || pos < 0 || pos + M > p->seq_len) {
        fprintf(stderr, "run: forward of %d tokens at position %d: outside the context of %d\n", M, pos, p->seq_len);
        exit(1);
    }
    if (o->begin && o->begin(e, tokens, M, pos, all_logits)) return s->logits;
    o->embed(e, tokens, M);
    for (int l = 0; l < p->n_layers; l++) {
        // attention, with the residual add in the output projection
        o->rmsnorm(e, s->xb, s->x, w->rms_att + (size_t)l * dim, M);
        o->qkv(e, s->xb, M, &w->wq[l], &w->wk[l], &w->wv[l]);
        o->rope_store(e, l, M, pos);
        o->attention(e, l, M, pos);
        o->matmul(e, s->x, s->xb, M, &w->wo[l], 1);
        // feed-forward: x += w2(silu(w1 x) * w3 x)
        o->rmsnorm(e, s->xb, s->x, w->rms_ffn + (size_t)l * dim, M);
        o->ffn_up(e, s->xb, M, &w->w1[l], &w->w3[l]);
        o->matmul(e, s->x, s->hb, M, &w->w2[l], 1);
    }
    int first = all_logits ? 0 : M - 1;
    o->rmsnorm(e, s->xb, s->x + (size_t)first * dim, w->rms_final, M - first);
    o->matmul(e, s->logits, s->xb, M - first, &w->wcls, 0);
    if (o->end) o->end(e);
    return s->logits;
}

// ----------------------------------------------------------------------------
// GPU executor (built when nvcc is there): kernels.h is its whole interface.

typedef enum { PATH_FUSED, PATH_UNFUSED } GpuPath;
#define GPU_UNAVAILABLE -1   // gpu_exec_init: no usable GPU; the caller may use the CPU
#define GPU_TOO_SMALL -2     // the model does not fit; an error

#ifdef HAVE_GPU
typedef struct {
    GpuCtx *ctx;
    Weights w;                  // device mirror of the model's Weights
    void *d_map, *d_owned;      // the uploaded file and the loader's repacked buffers
    const Model *model;         // host side, for translating pointers
    float *host_logits;         // (MAX_BATCH, vocab)
    int use_graph;              // capture the decode step (M = 1) once, then replay it
    GpuGraph *graph;            // the captured decode step, once made
    int capturing;
} GpuExec;

#define GPU(e) ((GpuExec *)(e)->priv)

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

// Token ids and the position go to device memory; the decode step runs as a replayed graph.
static int gpu_op_begin(Exec *e, const int *tokens, int M, int pos, int all_logits) {
    GpuExec *g = GPU(e);
    gpu_set_inputs(g->ctx, tokens, M, pos);
    if (!g->use_graph || M != 1 || all_logits) return 0;
    if (g->graph) {
        gpu_graph_launch(g->ctx, g->graph);
        return 1;
    }
    gpu_graph_begin(g->ctx);   // the ops below are recorded, not run
    g->capturing = 1;
    return 0;
}

static void gpu_op_end(Exec *e) {
    GpuExec *g = GPU(e);
    if (!g->capturing) return;
    g->capturing = 0;
    g->graph = gpu_graph_end(g->ctx);
    gpu_graph_launch(g->ctx, g->graph);   // now run what was recorded
}

static void gpu_op_embed(Exec *e, const int *tokens, int M) {
    (void)tokens;   // already on the device (begin)
    gpu_embed(GPU(e)->ctx, e->s.x, M, &e->w->tok_embedding);
}
static void gpu_op_rmsnorm(Exec *e, float *out, const float *in, const float *w, int M) {
    gpu_rmsnorm(GPU(e)->ctx, out, in, w, M, e->cfg.dim);
}

// The paths differ only here: how a linear layer is done.
static void gpu_linear(Exec *e, float *out, const float *in, int M, const Mat *w, int acc, int fused) {
    GpuCtx *c = GPU(e)->ctx;
    if (w->f) gpu_matmul_f32(c, out, in, M, w->f, w->rows, w->cols, w->stride, acc);
    else if (fused) gpu_matmul_q8_fused(c, out, in, M, w, acc);
    else gpu_matmul_q8_unfused(c, out, in, M, w, acc);
}
static void gpu_op_matmul_fused(Exec *e, float *out, const float *in, int M, const Mat *w, int acc) {
    gpu_linear(e, out, in, M, w, acc, 1);
}
static void gpu_op_matmul_unfused(Exec *e, float *out, const float *in, int M, const Mat *w, int acc) {
    gpu_linear(e, out, in, M, w, acc, 0);
}
static void gpu_op_qkv_fused(Exec *e, const float *in, int M, const Mat *wq, const Mat *wk, const Mat *wv) {
    gpu_matmul_q8_fused3(GPU(e)->ctx, e->s.q, e->s.k, e->s.v, in, M, wq, wk, wv);
}
static void gpu_op_ffn_up_fused(Exec *e, const float *in, int M, const Mat *w1, const Mat *w3) {
    gpu_matmul_q8_swiglu(GPU(e)->ctx, e->s.hb, in, M, w1, w3);
}
static void gpu_op_ffn_up_separate(Exec *e, const float *in, int M, const Mat *w1, const Mat *w3) {
    e->ops->matmul(e, e->s.hb, in, M, w1, 0);
    e->ops->matmul(e, e->s.hb2, in, M, w3, 0);
    gpu_swiglu(GPU(e)->ctx, e->s.hb, e->s.hb2, M * w1->rows);
}
static void gpu_op_rope_store(Exec *e, int layer, int M, int pos) {
    const Config *p = &e->cfg;
    int head_size = p->dim / p->n_heads, kv_dim = head_size * p->n_kv_heads;
    size_t loff = (size_t)layer * p->seq_len * kv_dim;
    (void)pos;   // on the device (begin)
    gpu_rope_store(GPU(e)->ctx, e->s.q, e->s.k, e->s.v, e->s.key_cache + loff, e->s.value_cache + loff, M, p->dim, kv_dim,
                   head_size);
}
static void gpu_op_attention(Exec *e, int layer, int M, int pos) {
    const Config *p = &e->cfg;
    int head_size = p->dim / p->n_heads;
    size_t loff = (size_t)layer * p->seq_len * head_size * p->n_kv_heads;
    (void)pos;   // on the device (begin)
    gpu_attention(GPU(e)->ctx, e->s.xb, e->s.q, e->s.key_cache + loff, e->s.value_cache + loff, M, p->n_heads,
                  p->n_kv_heads, head_size, p->seq_len);
}
static const float *gpu_op_to_host(Exec *e, const float *logits, int rows) {
    gpu_download(GPU(e)->ctx, GPU(e)->host_logits, logits, (size_t)rows * e->cfg.vocab_size * sizeof(float));
    return GPU(e)->host_logits;
}
static int gpu_op_argmax(Exec *e, const float *logits) { return gpu_argmax(GPU(e)->ctx, logits, e->cfg.vocab_size); }

static void gpu_op_release(Exec *e) {
    GpuExec *g = GPU(e);
    RunState *s = &e->s;
    float *bufs[] = {s->x, s->xb, s->q, s->k, s->v, s->hb, s->hb2, s->logits, s->key_cache, s->value_cache};
    gpu_sync(g->ctx);
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gpu_free(bufs[i]);
    if (g->graph) gpu_graph_free(g->graph);
    gpu_free(g->d_map);
    if (g->d_owned) gpu_free(g->d_owned);
    free(g->w.wq);
    free(g->host_logits);
    gpu_destroy(g->ctx);
    free(g);
}

static const Ops gpu_fused_ops = {"gpu int8 fused", gpu_op_begin, gpu_op_end, gpu_op_embed, gpu_op_rmsnorm,
                                  gpu_op_matmul_fused, gpu_op_qkv_fused, gpu_op_ffn_up_fused, gpu_op_rope_store,
                                  gpu_op_attention, gpu_op_to_host, gpu_op_argmax, gpu_op_release};
static const Ops gpu_unfused_ops = {"gpu int8 unfused (dequant + cuBLAS)", gpu_op_begin, gpu_op_end, gpu_op_embed,
                                    gpu_op_rmsnorm, gpu_op_matmul_unfused, qkv_by_matmul, gpu_op_ffn_up_separate,
                                    gpu_op_rope_store, gpu_op_attention, gpu_op_to_host, gpu_op_argmax, gpu_op_release};
static const Ops gpu_fp32_ops = {"gpu fp32 cuBLAS", gpu_op_begin, gpu_op_end, gpu_op_embed, gpu_op_rmsnorm,
                                 gpu_op_matmul_fused, qkv_by_matmul, gpu_op_ffn_up_separate, gpu_op_rope_store,
                                 gpu_op_attention, gpu_op_to_host, gpu_op_argmax, gpu_op_release};

// Largest linear weight, in elements: the unfused path's scratch.
static size_t largest_mat(const Model *m) {
    size_t most = (size_t)m->w.wcls.rows * m->w.wcls.cols;
    const Mat *all = m->w.wq;   // the 7 per-layer arrays are one block
    for (int i = 0; i < 7 * m->cfg.n_layers; i++) most = (size_t)all[i].rows * all[i].cols > most ? (size_t)all[i].rows * all[i].cols : most;
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
}

// Uploads the model once (the file as it lies, plus any repacked buffers) and allocates the
// activations and KV cache on the GPU. Checks that it all fits before allocating any of it.
// use_graph: replay the decode step as a CUDA graph (0 runs every kernel from the host).
static int gpu_exec_init(Exec *e, const Model *m, GpuPath path, int use_graph, char *why) {
    const Config *p = &m->cfg;
    if (gpu_probe(why)) return GPU_UNAVAILABLE;
    if (p->seq_len > gpu_attention_max_len() || p->dim / p->n_heads > gpu_attention_max_head_size()) {
        snprintf(why, ERR_LEN, "seq_len %d or head size %d is beyond the GPU attention kernel's %d and %d", p->seq_len,
                 p->dim / p->n_heads, gpu_attention_max_len(), gpu_attention_max_head_size());
        return GPU_UNAVAILABLE;
    }
    StateSizes z = state_sizes(p);
    size_t weights = m->map_bytes + m->owned_bytes, kv = 2 * z.cache * sizeof(float);
    size_t acts = (3 * z.x + 2 * z.kv + 2 * z.hidden + z.logits) * sizeof(float);
    size_t scratch = m->quantized && path == PATH_UNFUSED ? largest_mat(m) : 0, free_b, total_b;
    size_t need = weights + kv + acts + scratch * sizeof(float) + ((size_t)512 << 20);   // + cuBLAS and context
    gpu_mem_info(&free_b, &total_b);
    if (need > free_b) {
        snprintf(why, ERR_LEN,
                 "the model needs %.2f GiB on the GPU (weights %.2f, KV cache %.2f, activations and scratch %.2f, "
                 "reserve 0.50) but %s has %.2f GiB free of %.2f",
                 need / 1073741824.0, weights / 1073741824.0, kv / 1073741824.0,
                 (acts + scratch * sizeof(float)) / 1073741824.0, gpu_name(), free_b / 1073741824.0, total_b / 1073741824.0);
        return GPU_TOO_SMALL;
    }
    GpuExec *g = xcalloc(1, sizeof(GpuExec));
    g->model = m;
    g->use_graph = use_graph;
    g->ctx = gpu_create(scratch);
    g->d_map = gpu_alloc(m->map_bytes);
    gpu_upload(g->d_map, m->map, m->map_bytes);
    if (m->owned_bytes) {
        g->d_owned = gpu_alloc(m->owned_bytes);
        gpu_upload(g->d_owned, m->owned, m->owned_bytes);
    }
    mirror_weights(g, m);
    g->host_logits = xcalloc(z.logits, sizeof(float));
    memset(e, 0, sizeof *e);
    e->ops = !m->quantized ? &gpu_fp32_ops : path == PATH_UNFUSED ? &gpu_unfused_ops : &gpu_fused_ops;
    e->cfg = *p;
    e->w = &g->w;
    e->priv = g;
    alloc_state(&e->s, p, gpu_alloc);
    return 0;
}
#else
static int gpu_exec_init(Exec *e, const Model *m, GpuPath path, int use_graph, char *why) {
    (void)e, (void)m, (void)path, (void)use_graph;
    snprintf(why, ERR_LEN, "this build has no GPU support (nvcc was not found at build time)");
    return GPU_UNAVAILABLE;
}
#endif

// ----------------------------------------------------------------------------
// Tokenizer: llama2.c's tokenizer.bin (int max_token_length, then per token: float score,
// int len, len bytes). Scored BPE merges over UTF-8 characters, byte fallback <0xXX>.

typedef struct {
    const char *str;
    int id;
} TokenIndex;

typedef struct {
    char **vocab;              // (vocab_size) NUL-terminated pieces
    float *scores;             // (vocab_size) merge priority
    TokenIndex *sorted;        // vocab sorted by string, for lookup
    int vocab_size;
    int max_token_length;
    int byte_token[256];       // id of "<0xXX>", or -1 where the vocab lacks it
    unsigned char byte_pieces[512];   // each byte as a one-character string
    char *data;                // the file
} Tokenizer;

static int compare_tokens(const void *a, const void *b) {
    return strcmp(((const TokenIndex *)a)->str, ((const TokenIndex *)b)->str);
}

static int str_lookup(const char *str, const Tokenizer *t) {
    TokenIndex key = {str, 0};
    const TokenIndex *res = bsearch(&key, t->sorted, t->vocab_size, sizeof(TokenIndex), compare_tokens);
    return res ? res->id : -1;
}

static void free_tokenizer(Tokenizer *t) {
    if (t->vocab)
        for (int i = 0; i < t->vocab_size; i++) free(t->vocab[i]);
    free(t->vocab);
    free(t->scores);
    free(t->sorted);
    free(t->data);
    memset(t, 0, sizeof *t);
}

static char *read_file(const char *path, size_t max_bytes, size_t *bytes, char *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, ERR_LEN, "%.300s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *data = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) snprintf(err, ERR_LEN, "%.300s: cannot determine its size", path);
    else if ((size_t)n > max_bytes) snprintf(err, ERR_LEN, "%.300s: %ld bytes is more than the %zu allowed", path, n, max_bytes);
    else if (!(data = malloc(n + 1))) snprintf(err, ERR_LEN, "%.300s: out of memory", path);
    else if (fread(data, 1, n, f) != (size_t)n) {
        snprintf(err, ERR_LEN, "%.300s: read error", path);
        free(data);
        data = NULL;
    }
    fclose(f);
    if (data) {
        data[n] = '\0';
        *bytes = n;
    }
    return data;
}

static int tok_fail(Tokenizer *t, char *err, const char *path, const char *msg, int i) {
    snprintf(err, ERR_LEN, "%.300s: token %d: %.150s", path, i, msg);
    free_tokenizer(t);
    return -1;
}

// Reads and validates the whole file: every length in bounds, every score finite, exactly
// vocab_size entries (a tokenizer for another vocabulary would decode garbage).
static int build_tokenizer(Tokenizer *t, const char *path, int vocab_size, char *err) {
    memset(t, 0, sizeof *t);
    size_t bytes = 0, at = 4;
    if (!(t->data = read_file(path, (size_t)1 << 30, &bytes, err))) return -1;
    if (bytes < 4) return tok_fail(t, err, path, "file too short for the max_token_length field", -1);
    memcpy(&t->max_token_length, t->data, 4);
    if (t->max_token_length < 1 || t->max_token_length > 4096)
        return tok_fail(t, err, path, "header field max_token_length is not in [1, 4096]", -1);
    t->vocab_size = vocab_size;
    t->vocab = xcalloc(vocab_size, sizeof(char *));
    t->scores = xcalloc(vocab_size, sizeof(float));
    for (int i = 0; i < vocab_size; i++) {
        int len;
        if (bytes - at < 8) return tok_fail(t, err, path, "file ends before this entry (truncated, or a tokenizer for a smaller vocabulary)", i);
        memcpy(&t->scores[i], t->data + at, 4);
        memcpy(&len, t->data + at + 4, 4);
        at += 8;
        if (!isfinite(t->scores[i])) return tok_fail(t, err, path, "score is not finite", i);
        if (len < 0 || len > t->max_token_length) return tok_fail(t, err, path, "length is outside [0, max_token_length]", i);
        if (bytes - at < (size_t)len) return tok_fail(t, err, path, "file ends inside this entry's bytes (truncated)", i);
        t->vocab[i] = xcalloc(len + 1, 1);
        memcpy(t->vocab[i], t->data + at, len);
        at += len;
    }
    if (at != bytes) {
        snprintf(err, ERR_LEN, "%.300s: %zu bytes follow the model's %d entries: a tokenizer for a larger vocabulary?", path,
                 bytes - at, vocab_size);
        free_tokenizer(t);
        return -1;
    }
    t->sorted = xcalloc(vocab_size, sizeof(TokenIndex));
    for (int i = 0; i < vocab_size; i++) t->sorted[i] = (TokenIndex){t->vocab[i], i};
    qsort(t->sorted, vocab_size, sizeof(TokenIndex), compare_tokens);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_token[b] = str_lookup(name, t);
        t->byte_pieces[2 * b] = (unsigned char)b;
    }
    return 0;
}

// The text of `token` following `prev`: a leading space is dropped after BOS, and byte tokens
// <0xXX> become the byte itself.
static const char *decode(const Tokenizer *t, int prev, int token) {
    const char *piece = t->vocab[token];
    if (prev == BOS && piece[0] == ' ') piece++;
    unsigned char byte_val;
    if (sscanf(piece, "<0x%02hhX>", &byte_val) == 1 && strlen(piece) == 6) piece = (const char *)t->byte_pieces + byte_val * 2;
    return piece;
}

// Prints a piece unless it is a single unprintable byte (control codes would garble a terminal).
static void safe_print(const char *piece) {
    if (!piece || !piece[0]) return;
    if (!piece[1] && !(isprint((unsigned char)piece[0]) || isspace((unsigned char)piece[0]))) return;
    fputs(piece, stdout);
}

// Appends the tokens of one UTF-8 character (or stray byte): the piece if the vocab has it,
// else its bytes as byte tokens.
static int encode_char(const Tokenizer *t, const char *ch, int *tokens, int *n, char *err) {
    int id = str_lookup(ch, t);
    if (id >= 0) {
        tokens[(*n)++] = id;
        return 0;
    }
    for (const unsigned char *c = (const unsigned char *)ch; *c; c++) {
        if (t->byte_token[*c] < 0) {
            snprintf(err, ERR_LEN, "the tokenizer has neither the character nor the byte token <0x%02X> for it", *c);
            return -1;
        }
        tokens[(*n)++] = t->byte_token[*c];
    }
    return 0;
}

// Encodes text into tokens (room for strlen(text) + 2): BOS if asked, a leading space as
// sentencepiece's dummy prefix, characters, then the highest-scored merges until none applies.
static int encode(const Tokenizer *t, const char *text, int bos, int *tokens, int *n_tokens, char *err) {
    char *buf = xcalloc((size_t)t->max_token_length * 2 + 3, 1);
    int n = 0;
    if (bos) tokens[n++] = BOS;
    if (text[0] && encode_char(t, " ", tokens, &n, err)) goto fail;
    size_t len = 0;
    for (const char *c = text; *c; c++) {
        if ((*c & 0xC0) != 0x80) len = 0;   // a new UTF-8 character starts
        buf[len++] = *c;
        buf[len] = '\0';
        if ((c[1] & 0xC0) == 0x80 && len < 4) continue;   // continuation bytes follow
        if (encode_char(t, buf, tokens, &n, err)) goto fail;
        len = 0;
    }
    for (;;) {
        float best_score = -1e10f;
        int best_id = -1, best_idx = -1;
        for (int i = 0; i + 1 < n; i++) {
            snprintf(buf, (size_t)t->max_token_length * 2 + 3, "%s%s", t->vocab[tokens[i]], t->vocab[tokens[i + 1]]);
            int id = str_lookup(buf, t);
            if (id >= 0 && t->scores[id] > best_score) {
                best_score = t->scores[id];
                best_id = id;
                best_idx = i;
            }
        }
        if (best_idx < 0) break;
        tokens[best_idx] = best_id;
        memmove(tokens + best_idx + 1, tokens + best_idx + 2, (n - best_idx - 2) * sizeof(int));
        n--;
    }
    free(buf);
    *n_tokens = n;
    return 0;
fail:
    free(buf);
    return -1;
}

// ----------------------------------------------------------------------------
// Sampler: llama2.c's, exactly (xorshift generator, top-p procedure), so that a seed reproduces
// llama2.c's text.

typedef struct {
    float prob;
    int index;
} ProbIndex;

typedef struct {
    int vocab_size;
    ProbIndex *probindex;   // (vocab_size) scratch for top-p
    float temperature, topp;
    unsigned long long rng_state;
    float *scratch;         // (vocab_size) logits the sampler may scale in place
} Sampler;

static unsigned int random_u32(unsigned long long *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (*state * 0x2545F4914F6CDD1Dull) >> 32;
}

static float random_f32(unsigned long long *state) { return (random_u32(state) >> 8) / 16777216.0f; }

static int sample_mult(const float *probabilities, int n, float coin) {
    float cdf = 0.0f;
    for (int i = 0; i < n; i++) {
        cdf += probabilities[i];
        if (coin < cdf) return i;
    }
    return n - 1;   // rounding
}

static int compare_prob(const void *a, const void *b) {
    float pa = ((const ProbIndex *)a)->prob, pb = ((const ProbIndex *)b)->prob;
    return pa > pb ? -1 : pa < pb ? 1 : 0;
}

// Samples from the smallest set of tokens whose probability exceeds topp. Tokens under
// (1 - topp) / (n - 1) cannot be in that set and are dropped before the sort.
static int sample_topp(const float *probabilities, int n, float topp, ProbIndex *probindex, float coin) {
    int n0 = 0;
    const float cutoff = (1.0f - topp) / (n - 1);
    for (int i = 0; i < n; i++)
        if (probabilities[i] >= cutoff) probindex[n0++] = (ProbIndex){probabilities[i], i};
    qsort(probindex, n0, sizeof(ProbIndex), compare_prob);
    float cumulative_prob = 0.0f;
    int last_idx = n0 - 1;
    for (int i = 0; i < n0; i++) {
        cumulative_prob += probindex[i].prob;
        if (cumulative_prob > topp) {
            last_idx = i;
            break;
        }
    }
    float r = coin * cumulative_prob, cdf = 0.0f;
    for (int i = 0; i <= last_idx; i++) {
        cdf += probindex[i].prob;
        if (r < cdf) return probindex[i].index;
    }
    return probindex[last_idx].index;
}

static void build_sampler(Sampler *s, int vocab_size, float temperature, float topp, unsigned long long seed) {
    s->vocab_size = vocab_size;
    s->temperature = temperature;
    s->topp = topp;
    s->rng_state = seed;
    s->probindex = xcalloc(vocab_size, sizeof(ProbIndex));
    s->scratch = xcalloc(vocab_size, sizeof(float));
}

static void free_sampler(Sampler *s) {
    free(s->probindex);
    free(s->scratch);
}

// Next token from one row of logits (on the executor). Greedy stays on the executor.
static int sample(Sampler *s, Exec *e, const float *logits) {
    if (s->temperature == 0.0f) return e->ops->argmax(e, logits);
    float *p = s->scratch;
    memcpy(p, e->ops->to_host(e, logits, 1), s->vocab_size * sizeof(float));
    for (int q = 0; q < s->vocab_size; q++) p[q] /= s->temperature;
    softmax(p, s->vocab_size);
    float coin = random_f32(&s->rng_state);
    if (s->topp <= 0 || s->topp >= 1) return sample_mult(p, s->vocab_size, coin);
    return sample_topp(p, s->vocab_size, s->topp, s->probindex, coin);
}

// ----------------------------------------------------------------------------
// Generation and perplexity

typedef struct {
    int prompt_tokens, generated;
    double prefill_s, decode_s;
} GenStats;

static size_t mat_bytes(const Mat *m) {
    return m->f ? (size_t)m->rows * m->stride * sizeof(float)
                : (size_t)m->rows * m->stride + (size_t)m->rows * m->groups * sizeof(float);
}

// Weight bytes one decode step must read: every linear weight and norm, the classifier, and one
// embedding row. (Scales included; the KV cache is not.)
static size_t weight_bytes_per_token(const Model *m) {
    const Weights *w = &m->w;
    const Mat *e = &w->tok_embedding;
    size_t bytes = mat_bytes(&w->wcls) + (mat_bytes(e) / e->rows) + ((size_t)2 * m->cfg.n_layers + 1) * m->cfg.dim * sizeof(float);
    for (int i = 0; i < 7 * m->cfg.n_layers; i++) bytes += mat_bytes(&w->wq[i]);   // the 7 per-layer arrays are one block
    return bytes;
}

// Runs tokens[0..n) at positions pos.. in chunks of MAX_BATCH; returns the last token's logits.
static const float *prefill(Exec *e, const int *tokens, int n, int pos) {
    const float *logits = NULL;
    for (int done = 0; done < n; done += MAX_BATCH) {
        int M = n - done < MAX_BATCH ? n - done : MAX_BATCH;
        logits = forward(e, tokens + done, M, pos + done, 0);
    }
    return logits;
}

// llama2.c's generate: `steps` positions in all, prompt included; stops early at BOS.
// The prompt is echoed as it is consumed.
static int generate(Exec *e, const Tokenizer *tok, Sampler *sampler, const char *prompt, int steps, GenStats *st,
                    char *err) {
    int *tokens = xcalloc(strlen(prompt) + 3, sizeof(int)), n = 0;
    if (encode(tok, prompt, 1, tokens, &n, err)) goto fail;
    if (n > e->cfg.seq_len) {
        snprintf(err, ERR_LEN, "the prompt is %d tokens, longer than the model's context of %d", n, e->cfg.seq_len);
        goto fail;
    }
    if (n > steps) {
        snprintf(err, ERR_LEN, "the prompt is %d tokens but -n allows only %d positions", n, steps);
        goto fail;
    }
    long t0 = time_in_us();
    const float *logits = prefill(e, tokens, n, 0);
    e->ops->to_host(e, logits, 1);   // waits for the device: prefill time is complete
    long t1 = time_in_us();
    for (int i = 1; i < n; i++) safe_print(decode(tok, tokens[i - 1], tokens[i]));
    fflush(stdout);
    int token = tokens[n - 1], generated = 0;
    for (int pos = n - 1; pos < steps;) {
        int next = sample(sampler, e, logits);
        pos++;
        generated++;
        if (next == BOS) break;
        safe_print(decode(tok, token, next));
        fflush(stdout);
        token = next;
        if (pos < steps) logits = forward(e, &token, 1, pos, 0);
    }
    printf("\n");
    *st = (GenStats){n, generated, (t1 - t0) / 1e6, (time_in_us() - t1) / 1e6};
    free(tokens);
    return 0;
fail:
    free(tokens);
    return -1;
}

// Negative log-likelihood (natural log) of `target` under one row of logits, in double.
static double nll(const float *logits, int n, int target) {
    double max = logits[0], sum = 0.0;
    for (int i = 1; i < n; i++) max = logits[i] > max ? logits[i] : max;
    for (int i = 0; i < n; i++) sum += exp(logits[i] - max);
    return log(sum) + max - logits[target];
}

// Teacher-forced perplexity of a text: the token stream (BOS first) is cut into windows of the
// context; each window starts at position 0 with the last token of the one before, so every token
// after the first is predicted exactly once. Returns exp(mean NLL).
static int perplexity(Exec *e, const Tokenizer *tok, const char *text, double *ppl, int *n_predicted, char *err) {
    int V = e->cfg.vocab_size, window = e->cfg.seq_len;
    if (window < 2) {
        snprintf(err, ERR_LEN, "a context of %d position cannot predict anything", window);
        return -1;
    }
    int *tokens = xcalloc(strlen(text) + 3, sizeof(int)), n = 0;
    if (encode(tok, text, 1, tokens, &n, err)) {
        free(tokens);
        return -1;
    }
    if (n < 2) {
        snprintf(err, ERR_LEN, "the text is too short: it gives %d tokens, perplexity needs 2", n);
        free(tokens);
        return -1;
    }
    double total = 0.0;
    for (int start = 0; start + 1 < n; start += window - 1) {
        int len = n - start < window ? n - start : window;
        for (int done = 0; done < len; done += MAX_BATCH) {
            int M = len - done < MAX_BATCH ? len - done : MAX_BATCH;
            const float *logits = e->ops->to_host(e, forward(e, tokens + start + done, M, done, 1), M);
            for (int m = 0; m < M; m++)
                if (done + m + 1 < len) total += nll(logits + (size_t)m * V, V, tokens[start + done + m + 1]);
        }
    }
    *n_predicted = n - 1;
    *ppl = exp(total / (n - 1));
    free(tokens);
    return 0;
}

// ----------------------------------------------------------------------------
// CLI

#ifndef RUN_NO_MAIN
static void usage(void) {
    fprintf(stderr,
            "Usage:   run <checkpoint> [options]\n"
            "Example: run models/stories260K_q8.bin -z models/tok512.bin -p \"Once upon a time\"\n"
            "Options:\n"
            "  -p, -i <string>  prompt (default: empty)\n"
            "  -n <int>         positions to run, prompt included (default 256; 0 = the context length)\n"
            "  -t <float>       temperature in [0, inf) (default 1.0; 0 = greedy)\n"
            "  --top-p <float>  top-p (nucleus) sampling in [0, 1] (default 0.9; 0 or 1 = off)\n"
            "  -s <int>         random seed (default: time)\n"
            "  -z <string>      tokenizer (default: tokenizer.bin beside the binary)\n"
            "  --device cpu|gpu where to run (default gpu; falls back to cpu with a message)\n"
            "  --unfused        GPU: separate dequant kernel + cuBLAS instead of the fused kernels\n"
            "  --no-graph       GPU: launch every kernel from the host instead of replaying a CUDA graph\n"
            "  --ppl <file>     print the perplexity of the text in <file> instead of generating\n");
    exit(1);
}

static void die(const char *msg) {
    fprintf(stderr, "run: %s\n", msg);
    exit(1);
}

static long parse_int(const char *flag, const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "run: %s expects an integer in [%ld, %ld], got \"%s\"\n", flag, lo, hi, s);
        exit(1);
    }
    return v;
}

static float parse_float(const char *flag, const char *s, float lo, float hi) {
    char *end;
    float v = strtof(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "run: %s expects a number in [%g, %g], got \"%s\"\n", flag, lo, hi, s);
        exit(1);
    }
    return v;
}

// tokenizer.bin in the directory of the running binary
static void default_tokenizer(char *path, size_t n, const char *argv0) {
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) exe[len] = '\0';
    else snprintf(exe, sizeof exe, "%s", argv0);
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    snprintf(path, n, "%s/tokenizer.bin", slash ? exe : ".");
}

int main(int argc, char **argv) {
    if (argc < 2 || argv[1][0] == '-') usage();
    const char *checkpoint = argv[1], *prompt = "", *tokenizer_path = NULL, *ppl_file = NULL, *device = "gpu";
    float temperature = 1.0f, topp = 0.9f;
    long steps = 256, seed = 0;
    int unfused = 0, no_graph = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--unfused")) { unfused = 1; continue; }
        if (!strcmp(a, "--no-graph")) { no_graph = 1; continue; }
        if (!v) usage();
        if (!strcmp(a, "-p") || !strcmp(a, "-i")) prompt = v;
        else if (!strcmp(a, "-n")) steps = parse_int(a, v, 0, INT_MAX);
        else if (!strcmp(a, "-t")) temperature = parse_float(a, v, 0.0f, FLT_MAX);
        else if (!strcmp(a, "--top-p")) topp = parse_float(a, v, 0.0f, 1.0f);
        else if (!strcmp(a, "-s")) seed = parse_int(a, v, 0, LONG_MAX);
        else if (!strcmp(a, "-z")) tokenizer_path = v;
        else if (!strcmp(a, "--ppl")) ppl_file = v;
        else if (!strcmp(a, "--device")) device = v;
        else usage();
        i++;
    }
    if (strcmp(device, "cpu") && strcmp(device, "gpu")) die("--device expects cpu or gpu");
    char default_tok[4200], err[ERR_LEN];
    if (!tokenizer_path) {
        default_tokenizer(default_tok, sizeof default_tok, argv[0]);
        tokenizer_path = default_tok;
    }

    Model model;
    if (load_model(checkpoint, &model, err)) die(err);
    Tokenizer tok;
    if (build_tokenizer(&tok, tokenizer_path, model.cfg.vocab_size, err)) die(err);
    if (steps == 0 || steps > model.cfg.seq_len) steps = model.cfg.seq_len;

    Exec exec;
    const char *path_name = model.quantized ? "int8" : "fp32";
    if (!strcmp(device, "gpu")) {
        int rc = gpu_exec_init(&exec, &model, unfused ? PATH_UNFUSED : PATH_FUSED, !no_graph, err);
        if (rc == GPU_TOO_SMALL) die(err);
        if (rc == 0) {
            path_name = exec.ops->name;
        } else {
            fprintf(stderr, "run: GPU unavailable (%s); using the CPU\n", err);
            device = "cpu";
        }
    }
    if (!strcmp(device, "cpu")) {
        if (unfused) fprintf(stderr, "run: --unfused applies to the GPU only; ignored on the CPU\n");
        cpu_exec_init(&exec, &model);
    }

    int status = 0;
    if (ppl_file) {
        size_t bytes;
        double ppl;
        int n_pred;
        char *text = read_file(ppl_file, (size_t)64 << 20, &bytes, err);
        if (!text || perplexity(&exec, &tok, text, &ppl, &n_pred, err)) {
            fprintf(stderr, "run: %s\n", err);
            status = 1;
        } else {
            printf("perplexity %.4f over %d predicted tokens (%s, %s %s)\n", ppl, n_pred, ppl_file, device, path_name);
        }
        free(text);
    } else {
        Sampler sampler;
        build_sampler(&sampler, model.cfg.vocab_size, temperature, topp, seed > 0 ? (unsigned long long)seed : (unsigned long long)time(NULL));
        GenStats st;
        if (generate(&exec, &tok, &sampler, prompt, (int)steps, &st, err)) {
            fprintf(stderr, "run: %s\n", err);
            status = 1;
        } else {
            int decoded = st.generated > 0 ? st.generated - 1 : 0;   // the first sample came from prefill
            double decode_tps = st.decode_s > 0 ? decoded / st.decode_s : 0.0, gb = weight_bytes_per_token(&model) / 1e9;
            fprintf(stderr,
                    "prompt %d tokens, generated %d; prefill %.1f tok/s, decode %.1f tok/s; weights %.3f GB/token, "
                    "%.1f GB/s effective; device %s, path %s, %s\n",
                    st.prompt_tokens, st.generated, st.prefill_s > 0 ? st.prompt_tokens / st.prefill_s : 0.0, decode_tps, gb,
                    gb * decode_tps, device, path_name, format_name(model.format));
        }
        free_sampler(&sampler);
    }
    exec.ops->release(&exec);
    free_tokenizer(&tok);
    free_model(&model);
    return status;
}
#endif
