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
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model.h"
#ifdef HAVE_GPU
#include "kernels.h"
#endif

#define MAX_TOKENS 512   // tokens per forward call: prompts are prefilled in chunks of this many
#define MAX_SEQS 64      // sequences decoded together (--batch)
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
    float *x, *xb;                    // (MAX_TOKENS, dim): residual stream, normed input / attention output
    float *q;                         // (MAX_TOKENS, dim)
    float *k, *v;                     // (MAX_TOKENS, kv_dim): the new tokens' keys and values
    float *hb, *hb2;                  // (MAX_TOKENS, hidden_dim)
    float *att;                       // CPU: (seq_len) scores of one head
    float *logits;                    // (MAX_TOKENS, vocab)
    // (n_seqs, layer, seq_len, kv_dim): FP32 on the CPU; on the GPU FP16, or FP32 with --kv-fp32.
    // seq_len is the executor's context (cfg.seq_len, which batch runs may shorten).
    void *key_cache, *value_cache;
    // The current forward's layout: 0, its M tokens are one sequence at positions pos..pos+M-1
    // (cache 0); else token m is sequence m's, at position pos, its cache seq_stride elements
    // after sequence m - 1's (batched decode).
    size_t seq_stride;
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
    // q, k, v = in W^T for the three attention weights of a layer. The GPU's fused path does them
    // in one launch that also applies RoPE and stores k and v in the cache (its rope_store is NULL).
    void (*qkv)(Exec *e, int layer, const float *in, int M, const Mat *wq, const Mat *wk, const Mat *wv);
    // hb = silu(in w1^T) * (in w3^T): the feed-forward's first half (one launch on the GPU)
    void (*ffn_up)(Exec *e, const float *in, int M, const Mat *w1, const Mat *w3);
    // RoPE on q and k of tokens at pos..pos+M-1, then k and v stored in the layer's cache rows
    // (optional: NULL where qkv does it)
    void (*rope_store)(Exec *e, int layer, int M, int pos);
    void (*attention)(Exec *e, int layer, int M, int pos);                      // xb = attention of q over the cache
    const float *(*to_host)(Exec *e, const float *logits, int rows);           // logits readable by the host
    int (*argmax)(Exec *e, const float *logits);                                // greedy token of one row
    void (*argmax_rows)(Exec *e, const float *logits, int rows, int *out);     // greedy tokens of rows (a batch)
    // Optional: sampled tokens of rows (at most MAX_SEQS) by llama2.c's procedure, coins[r] row r's
    // draw; 0, or -1 (nothing done) where the executor cannot and the host must.
    int (*sample_rows)(Exec *e, const float *logits, int rows, float temperature, float topp, const float *coins, int *out);
    // Optional: greedy decoding from logits (of position pos) on, pipelined by the executor itself.
    // Each token goes to on_token (non-zero stops with -1); stops after BOS or at position steps.
    // Returns the tokens generated, -1, or NOT_PIPELINED where the caller should loop itself.
    int (*decode_greedy)(Exec *e, const float *logits, int pos, int steps, int (*on_token)(void *ctx, int token), void *ctx);
    // Copies sequence 0's KV cache rows 0..rows-1 (every layer) to every other sequence: a prompt
    // prefilled once for a batch
    void (*copy_cache)(Exec *e, int rows);
    void (*release)(Exec *e);
} Ops;
#define NOT_PIPELINED -2

struct Exec {
    const Ops *ops;
    char desc[160];     // the path and its options, for the statistics line
    Config cfg;
    int kv_bytes;       // bytes per KV cache element: 4 (FP32) or 2 (FP16)
    int n_seqs;         // sequences with a KV cache each (--batch)
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
static void qkv_by_matmul(Exec *e, int layer, const float *in, int M, const Mat *wq, const Mat *wk, const Mat *wv) {
    (void)layer;
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

// KV cache geometry: a sequence's cache is n_layers blocks of seq_len rows of kv_dim elements,
// kv_bytes each.
static size_t kv_dim_of(const Config *p) { return (size_t)p->dim / p->n_heads * p->n_kv_heads; }
// Bytes of one layer's first `rows` positions, and of one sequence's whole cache.
static size_t layer_rows_bytes(const Exec *e, int rows) { return (size_t)rows * kv_dim_of(&e->cfg) * e->kv_bytes; }
static size_t seq_cache_bytes(const Exec *e) { return e->cfg.n_layers * layer_rows_bytes(e, e->cfg.seq_len); }
// The layer's slice of a KV cache (sequence 0's).
static void *layer_cache(const Exec *e, void *cache, int layer) {
    return (char *)cache + (size_t)layer * layer_rows_bytes(e, e->cfg.seq_len);
}

// Token m's position and the offset (elements) of its sequence's cache for a layer, in the
// current forward's layout (RunState.seq_stride).
static int token_pos(const Exec *e, int pos, int m) { return e->s.seq_stride ? pos : pos + m; }
static size_t cache_offset(const Exec *e, int layer, int m) {
    return (e->s.seq_stride ? m * e->s.seq_stride : 0) + (size_t)layer * e->cfg.seq_len * kv_dim_of(&e->cfg);
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
            float val = token_pos(e, pos, m) * freq, fcr = cosf(val), fci = sinf(val);
            for (int v = 0; v < (i < kv_dim ? 2 : 1); v++) {
                float *vec = v == 0 ? q : k;
                float v0 = vec[i], v1 = vec[i + 1];
                vec[i] = v0 * fcr - v1 * fci;
                vec[i + 1] = v0 * fci + v1 * fcr;
            }
        }
    }
    for (int m = 0; m < M; m++) {
        size_t at = cache_offset(e, layer, m) + (size_t)token_pos(e, pos, m) * kv_dim;
        memcpy((float *)e->s.key_cache + at, e->s.k + (size_t)m * kv_dim, kv_dim * sizeof(float));
        memcpy((float *)e->s.value_cache + at, e->s.v + (size_t)m * kv_dim, kv_dim * sizeof(float));
    }
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
    float *att = e->s.att;
    for (int m = 0; m < M; m++) {
        int last = token_pos(e, pos, m);
        size_t loff = cache_offset(e, layer, m);
        for (int h = 0; h < p->n_heads; h++) {
            const float *q = e->s.q + (size_t)m * p->dim + h * head_size;
            for (int t = 0; t <= last; t++) {
                const float *k = (const float *)e->s.key_cache + loff + (size_t)t * kv_dim + (h / kv_mul) * head_size;
                float score = 0.0f;
                for (int i = 0; i < head_size; i++) score += q[i] * k[i];
                att[t] = score / sqrtf(head_size);
            }
            softmax(att, last + 1);
            float *xb = e->s.xb + (size_t)m * p->dim + h * head_size;
            memset(xb, 0, head_size * sizeof(float));
            for (int t = 0; t <= last; t++) {
                const float *v = (const float *)e->s.value_cache + loff + (size_t)t * kv_dim + (h / kv_mul) * head_size;
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
static void cpu_argmax_rows(Exec *e, const float *logits, int rows, int *out) {
    for (int r = 0; r < rows; r++) out[r] = argmax_row(logits + (size_t)r * e->cfg.vocab_size, e->cfg.vocab_size);
}

// Calls copy(dst, src, bytes) for each layer's first rows of both caches, sequence 0 to the rest.
static void for_each_cache_copy(Exec *e, int rows, void (*copy)(Exec *e, void *dst, const void *src, size_t bytes)) {
    for (int b = 1; b < e->n_seqs; b++)
        for (int l = 0; l < e->cfg.n_layers; l++) {
            const char *k = layer_cache(e, e->s.key_cache, l), *v = layer_cache(e, e->s.value_cache, l);
            copy(e, (char *)k + b * seq_cache_bytes(e), k, layer_rows_bytes(e, rows));
            copy(e, (char *)v + b * seq_cache_bytes(e), v, layer_rows_bytes(e, rows));
        }
}
static void host_copy(Exec *e, void *dst, const void *src, size_t bytes) {
    (void)e;
    memcpy(dst, src, bytes);
}
static void cpu_copy_cache(Exec *e, int rows) { for_each_cache_copy(e, rows, host_copy); }

static void cpu_release(Exec *e) {
    RunState *s = &e->s;
    void *bufs[] = {s->x, s->xb, s->q, s->k, s->v, s->hb, s->hb2, s->att, s->logits, s->key_cache, s->value_cache};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

static const Ops cpu_ops = {"cpu", NULL, NULL, cpu_embed, cpu_rmsnorm, cpu_matmul, qkv_by_matmul, cpu_ffn_up,
                            cpu_rope_store, cpu_attention, cpu_to_host, cpu_argmax, cpu_argmax_rows, NULL, NULL, cpu_copy_cache, cpu_release};

// Sizes of the RunState buffers, in floats, shared by both executors' allocations.
typedef struct {
    size_t x, kv, hidden, logits, cache;
} StateSizes;

// cache: one sequence's; n_seqs of them are allocated.
static StateSizes state_sizes(const Config *p) {
    size_t kv_dim = kv_dim_of(p);
    return (StateSizes){(size_t)MAX_TOKENS * p->dim, MAX_TOKENS * kv_dim, (size_t)MAX_TOKENS * p->hidden_dim,
                        (size_t)MAX_TOKENS * p->vocab_size, (size_t)p->n_layers * p->seq_len * kv_dim};
}

// kv_bytes: bytes per KV cache element (4: FP32, 2: FP16); n_seqs caches.
static void alloc_state(RunState *s, const Config *p, int kv_bytes, int n_seqs, void *(*alloc)(size_t bytes)) {
    StateSizes z = state_sizes(p);
    z.cache *= n_seqs;
    s->x = alloc(z.x * sizeof(float)), s->xb = alloc(z.x * sizeof(float)), s->q = alloc(z.x * sizeof(float));
    s->k = alloc(z.kv * sizeof(float)), s->v = alloc(z.kv * sizeof(float));
    s->hb = alloc(z.hidden * sizeof(float)), s->hb2 = alloc(z.hidden * sizeof(float));
    s->logits = alloc(z.logits * sizeof(float));
    s->key_cache = alloc(z.cache * kv_bytes), s->value_cache = alloc(z.cache * kv_bytes);
}

static void *host_alloc(size_t bytes) { return xcalloc(bytes, 1); }

// The executor's config: the model's, with the context shortened to `context` (1..seq_len; 0
// keeps it) so that many sequences' KV caches fit.
static Config exec_config(const Model *m, int context) {
    Config c = m->cfg;
    if (context > 0 && context < c.seq_len) c.seq_len = context;
    return c;
}

// n_seqs KV caches of `context` positions (0: the model's).
static void cpu_exec_init(Exec *e, const Model *m, int n_seqs, int context) {
    memset(e, 0, sizeof *e);
    e->ops = &cpu_ops;
    snprintf(e->desc, sizeof e->desc, "cpu");
    e->cfg = exec_config(m, context);
    e->w = &m->w;
    e->kv_bytes = sizeof(float);
    e->n_seqs = n_seqs;
    alloc_state(&e->s, &e->cfg, e->kv_bytes, n_seqs, host_alloc);
    e->s.att = xcalloc(e->cfg.seq_len, sizeof(float));
}

// The linear weights: the 7 per-layer arrays (one block) and the classifier.
static int n_linear(const Config *c) { return 7 * c->n_layers + 1; }
static Mat *linear_at(Weights *w, const Config *c, int i) { return i < 7 * c->n_layers ? &w->wq[i] : &w->wcls; }

// ----------------------------------------------------------------------------
// forward: the whole model, once, for any executor.
// forward runs tokens[0..M) of sequence 0 at positions pos..pos+M-1; forward_batch runs one
// token of each of B sequences, all at position pos (M <= MAX_TOKENS, B <= n_seqs, positions
// within the context; ids are checked). Both return the executor's logits buffer: M rows of
// vocab_size when all_logits (always for a batch), else one row, the last token's.

static const float *run_layers(Exec *e, const int *tokens, int M, int pos, int all_logits) {
    const Config *p = &e->cfg;
    const Weights *w = e->w;
    const Ops *o = e->ops;
    RunState *s = &e->s;
    int dim = p->dim, span = s->seq_stride ? 1 : M;   // positions the call covers
    for (int m = 0; m < M; m++)
        if (tokens[m] < 0 || tokens[m] >= p->vocab_size) {
            fprintf(stderr, "run: token id %d is outside the vocabulary [0, %d)\n", tokens[m], p->vocab_size);
            exit(1);
        }
    if (M < 1 || M > MAX_TOKENS || pos < 0 || pos + span > p->seq_len) {
        fprintf(stderr, "run: forward of %d tokens at position %d: outside the context of %d\n", M, pos, p->seq_len);
        exit(1);
    }
    if (o->begin && o->begin(e, tokens, M, pos, all_logits)) return s->logits;
    o->embed(e, tokens, M);
    for (int l = 0; l < p->n_layers; l++) {
        // attention, with the residual add in the output projection
        o->rmsnorm(e, s->xb, s->x, w->rms_att + (size_t)l * dim, M);
        o->qkv(e, l, s->xb, M, &w->wq[l], &w->wk[l], &w->wv[l]);
        if (o->rope_store) o->rope_store(e, l, M, pos);
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

static const float *forward(Exec *e, const int *tokens, int M, int pos, int all_logits) {
    e->s.seq_stride = 0;
    return run_layers(e, tokens, M, pos, all_logits);
}

static const float *forward_batch(Exec *e, const int *tokens, int B, int pos) {
    const Config *p = &e->cfg;
    if (B > e->n_seqs) {
        fprintf(stderr, "run: a batch of %d sequences, the executor has caches for %d\n", B, e->n_seqs);
        exit(1);
    }
    e->s.seq_stride = (size_t)p->n_layers * p->seq_len * kv_dim_of(p);
    const float *logits = run_layers(e, tokens, B, pos, 1);
    e->s.seq_stride = 0;
    return logits;
}

// ----------------------------------------------------------------------------
// GPU executor (built when nvcc is there): kernels.h is its whole interface.

typedef enum { PATH_FUSED, PATH_UNFUSED, PATH_FP16 } GpuPath;
typedef struct {
    GpuPath path;   // how INT8 linear layers run (FP32 checkpoints: cuBLAS FP32, or FP16 with PATH_FP16)
    int use_graph;  // capture the decode step (M = 1) once as a CUDA graph, then replay it
    int kv_half;    // FP16 KV cache (else FP32)
    int pdl;        // programmatic dependent launch between kernels: 1, 0, or PDL_AUTO
    int tensor_cores;   // batches of more than TC_MIN_TOKENS tokens on the tensor-core kernel
    int n_seqs;         // KV caches for this many sequences (--batch; 0 = 1)
    int context;        // their length (0 = the model's seq_len)
    int tma_gemv;       // decode GEMVs fed by the copy engine (where the GPU has it): 1, 0, or TMA_AUTO
} GpuOptions;
// Measured on the H200 (bench/NOTES.md): PDL speeds up small models' decode, whose kernels are
// short (stories15m +25%), and slows the 7B's with the register-fed GEMV (-7%); AUTO takes it for
// models under PDL_AUTO_BYTES of weights per token, and wherever the copy-engine GEMV runs.
#define PDL_AUTO -1
#define PDL_AUTO_BYTES 1000000000.0
// The copy-engine GEMV (with PDL) decodes the 7B shape 12% faster than the register-fed one
// (284.9 against 254.2 tok/s), and the smaller models slower (TinyLlama, 1.07 GB of weights per
// token: 808 against 845; stories110m 2231 against 3140): their layers are too short for its
// set-up. AUTO takes it from TMA_AUTO_BYTES of weights per token, between the two measured sizes.
#define TMA_AUTO -1
#define TMA_AUTO_BYTES 4000000000.0
#define GPU_UNAVAILABLE -1   // gpu_exec_init: no usable GPU; the caller may use the CPU
#define GPU_TOO_SMALL -2     // the model does not fit; an error

#ifdef HAVE_GPU
static size_t weight_bytes_per_token(const Model *m, int fp16);   // (generation section)

typedef struct {
    GpuCtx *ctx;
    Weights w;                  // device mirror of the model's Weights
    void *d_map, *d_owned;      // the uploaded file and the loader's repacked buffers
    void *d_half;               // --fp16: every linear weight as dense FP16, one block
    float *att_part;            // the split attention's partial results
    const Model *model;         // host side, for translating pointers
    float *host_logits;         // (MAX_TOKENS, vocab)
    GpuOptions opt;
    GpuGraph *graph;            // the captured decode step, once made
    GpuGraph *batch_graph;      // the captured step of a batch (forward_batch) of batch_graph_B sequences
    int batch_graph_B;
    GpuGraph **capture_into;    // while a step is being captured: &graph or &batch_graph; else NULL
    int decode_step;            // this forward is one token's decode step (M = 1, last logits only)
    int argmax_ready;           // the step's argmax kernel has run (in the graph or after it)
    // The fused path's RMSNorm, held back so that the next SIMT GEMV folds it in (its input is
    // then `in`, normalised on the fly): out = rmsnorm(in) * w, M rows; w NULL when none is held.
    struct { float *out; const float *in, *w; int M; } norm;
    int no_norm_fold;           // RUN_NO_NORM_FOLD=1: every RMSNorm as its own kernel (comparison)
    int host_sample;            // RUN_HOST_SAMPLE=1: sampled tokens on the host (comparison)
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

// Runs the held-back RMSNorm, if any, as its own kernel.
static void flush_norm(Exec *e) {
    GpuExec *g = GPU(e);
    if (!g->norm.w) return;
    gpu_rmsnorm(g->ctx, g->norm.out, g->norm.in, g->norm.w, g->norm.M, e->cfg.dim);
    g->norm.w = NULL;
}
// The fused path's rmsnorm: held back for the GEMV that reads `out` next.
static void gpu_op_rmsnorm_held(Exec *e, float *out, const float *in, const float *w, int M) {
    GpuExec *g = GPU(e);
    flush_norm(e);
    if (g->no_norm_fold) {
        gpu_rmsnorm(g->ctx, out, in, w, M, e->cfg.dim);
        return;
    }
    g->norm.out = out, g->norm.in = in, g->norm.w = w, g->norm.M = M;
}
// For a SIMT GEMV about to read *in (M rows): the held RMSNorm's weights if it produces exactly
// that input, *in then replaced by the norm's own input; else NULL, the norm (if any) run first.
static const float *take_norm(Exec *e, const float **in, int M) {
    GpuExec *g = GPU(e);
    const float *w = g->norm.w;
    if (!w || g->norm.out != *in || g->norm.M != M) {
        flush_norm(e);
        return NULL;
    }
    *in = g->norm.in;
    g->norm.w = NULL;
    return w;
}

// Token ids and the position go to device memory; the decode step runs as a replayed graph,
// whose last kernel is the greedy argmax (so that one int crosses to the host per token). So does
// a batch's step (one token of each of M sequences at one position): every launch in it reads the
// position and tokens from device memory too, and a generation's batches are all of one size
// (a graph for another size replaces it).
static int gpu_op_begin(Exec *e, const int *tokens, int M, int pos, int all_logits) {
    GpuExec *g = GPU(e);
    gpu_set_inputs(g->ctx, tokens, M, pos);
    g->decode_step = M == 1 && !all_logits && !e->s.seq_stride;
    const int batch_step = e->s.seq_stride != 0;
    g->argmax_ready = 0;
    if (!g->opt.use_graph || !(g->decode_step || batch_step)) return 0;
    if (batch_step && g->batch_graph && g->batch_graph_B != M) {
        gpu_graph_free(g->batch_graph);
        g->batch_graph = NULL;
    }
    GpuGraph *graph = batch_step ? g->batch_graph : g->graph;
    if (graph) {
        gpu_graph_launch(g->ctx, graph);
        g->argmax_ready = g->decode_step;
        return 1;
    }
    gpu_graph_begin(g->ctx);   // the ops below are recorded, not run
    g->capture_into = batch_step ? &g->batch_graph : &g->graph;
    if (batch_step) g->batch_graph_B = M;
    return 0;
}

static void gpu_op_end(Exec *e) {
    GpuExec *g = GPU(e);
    flush_norm(e);
    if (g->decode_step) {
        gpu_argmax_launch(g->ctx, e->s.logits, e->cfg.vocab_size, 1);
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
    gpu_embed(GPU(e)->ctx, e->s.x, M, &e->w->tok_embedding);
}
static void gpu_op_rmsnorm(Exec *e, float *out, const float *in, const float *w, int M) {
    gpu_rmsnorm(GPU(e)->ctx, out, in, w, M, e->cfg.dim);
}
// The paths differ only here: how a linear layer is done.
// Batches of more than TC_MIN_TOKENS tokens (prefill, --batch) take the tensor-core kernels where the
// group size allows; a single token (decode) the SIMT GEMV, which streams the weights with fewer
// instructions (measured: bench/kernel_bench --across-m, fused against fused-tc).
#define TC_MIN_TOKENS 1
static int use_tensor_cores(const Exec *e, int M, const Mat *w) {
    return M > TC_MIN_TOKENS && GPU(e)->opt.tensor_cores && gpu_matmul_q8_mma_supported(w);
}

static void gpu_linear(Exec *e, float *out, const float *in, int M, const Mat *w, int acc, int fused) {
    GpuCtx *c = GPU(e)->ctx;
    if (fused && !w->h && !w->f && !use_tensor_cores(e, M, w)) {   // the SIMT GEMV: folds a held norm
        if (!gpu_fold_norm_pays(c, M, w)) flush_norm(e);
        const float *norm_w = take_norm(e, &in, M);
        gpu_matmul_q8_fused_norm(c, out, in, M, w, acc, norm_w);
        return;
    }
    flush_norm(e);
    if (w->h) gpu_matmul_f16(c, out, in, M, w->h, w->rows, w->cols, acc);
    else if (w->f) gpu_matmul_f32(c, out, in, M, w->f, w->rows, w->cols, w->stride, acc);
    else if (fused) gpu_matmul_q8_mma(c, out, in, M, w, acc);
    else gpu_matmul_q8_unfused(c, out, in, M, w, acc);
}
static void gpu_op_matmul_fused(Exec *e, float *out, const float *in, int M, const Mat *w, int acc) {
    gpu_linear(e, out, in, M, w, acc, 1);
}
static void gpu_op_matmul_unfused(Exec *e, float *out, const float *in, int M, const Mat *w, int acc) {
    gpu_linear(e, out, in, M, w, acc, 0);
}
static void gpu_op_rope_store(Exec *e, int layer, int M, int pos);
static void gpu_op_qkv_rope_fused(Exec *e, int layer, const float *in, int M, const Mat *wq, const Mat *wk, const Mat *wv) {
    if (use_tensor_cores(e, M, wq)) {   // prefill: three tensor-core launches, then RoPE + store
        flush_norm(e);
        qkv_by_matmul(e, layer, in, M, wq, wk, wv);
        gpu_op_rope_store(e, layer, M, 0);
        return;
    }
    const float *norm_w = take_norm(e, &in, M);
    gpu_matmul_q8_qkv_rope(GPU(e)->ctx, e->s.q, in, M, wq, wk, wv, layer_cache(e, e->s.key_cache, layer),
                           layer_cache(e, e->s.value_cache, layer), e->cfg.dim / e->cfg.n_heads, GPU(e)->opt.kv_half,
                           e->s.seq_stride, norm_w);
}
static void gpu_op_ffn_up_separate(Exec *e, const float *in, int M, const Mat *w1, const Mat *w3);
static void gpu_op_ffn_up_fused(Exec *e, const float *in, int M, const Mat *w1, const Mat *w3) {
    if (use_tensor_cores(e, M, w1)) {   // prefill
        flush_norm(e);
        gpu_op_ffn_up_separate(e, in, M, w1, w3);
        return;
    }
    const float *norm_w = take_norm(e, &in, M);
    gpu_matmul_q8_swiglu(GPU(e)->ctx, e->s.hb, in, M, w1, w3, norm_w);
}
static void gpu_op_ffn_up_separate(Exec *e, const float *in, int M, const Mat *w1, const Mat *w3) {
    e->ops->matmul(e, e->s.hb, in, M, w1, 0);
    e->ops->matmul(e, e->s.hb2, in, M, w3, 0);
    gpu_swiglu(GPU(e)->ctx, e->s.hb, e->s.hb2, M * w1->rows);
}
static void gpu_op_rope_store(Exec *e, int layer, int M, int pos) {
    const Config *p = &e->cfg;
    flush_norm(e);
    int head_size = p->dim / p->n_heads, kv_dim = head_size * p->n_kv_heads;
    (void)pos;   // on the device (begin)
    gpu_rope_store(GPU(e)->ctx, e->s.q, e->s.k, e->s.v, layer_cache(e, e->s.key_cache, layer),
                   layer_cache(e, e->s.value_cache, layer), M, p->dim, kv_dim, head_size, GPU(e)->opt.kv_half, e->s.seq_stride);
}
static void gpu_op_attention(Exec *e, int layer, int M, int pos) {
    const Config *p = &e->cfg;
    flush_norm(e);
    (void)pos;   // on the device (begin)
    gpu_attention(GPU(e)->ctx, e->s.xb, GPU(e)->att_part, e->s.q, layer_cache(e, e->s.key_cache, layer),
                  layer_cache(e, e->s.value_cache, layer), M, p->n_heads, p->n_kv_heads, p->dim / p->n_heads, p->seq_len,
                  GPU(e)->opt.kv_half, e->s.seq_stride);
}
static const float *gpu_op_to_host(Exec *e, const float *logits, int rows) {
    gpu_download(GPU(e)->ctx, GPU(e)->host_logits, logits, (size_t)rows * e->cfg.vocab_size * sizeof(float));
    return GPU(e)->host_logits;
}
// The decode step already ran the argmax kernel: only its result is waited for.
static int gpu_op_argmax(Exec *e, const float *logits) {
    GpuExec *g = GPU(e);
    if (g->argmax_ready && logits == e->s.logits) {
        g->argmax_ready = 0;
        gpu_argmax_fetch(g->ctx, 0);
        return gpu_argmax_wait(g->ctx, 0);
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
    if (g->host_sample || !gpu_sample_supported(e->cfg.vocab_size)) return -1;
    gpu_sample_rows(g->ctx, logits, rows, e->cfg.vocab_size, temperature, topp, coins, out);
    return 0;
}

// Greedy decode with the step replayed as a graph whose argmax feeds the next step's input on the
// device: step p + 1 is queued before step p's token is read, so the GPU never waits for the host
// (printing, the next launch). A step queued past a BOS is computed and discarded.
static int gpu_op_decode_greedy(Exec *e, const float *logits, int pos, int steps, int (*on_token)(void *ctx, int token),
                                void *ctx) {
    GpuExec *g = GPU(e);
    if (!g->opt.use_graph) return NOT_PIPELINED;
    int next = gpu_op_argmax(e, logits), generated = 0;
    for (int slot = 0;; slot ^= 1) {
        pos++, generated++;
        if (next == BOS) break;
        if (on_token(ctx, next)) {
            generated = -1;
            break;
        }
        if (pos >= steps) break;
        if (generated == 1) {   // the first step takes its inputs from the host (and captures the graph)
            forward(e, &next, 1, pos, 0);
            gpu_argmax_fetch(g->ctx, slot);
        }
        if (pos + 1 < steps) {   // the step after, on the token the device feeds it
            gpu_graph_launch(g->ctx, g->graph);
            gpu_argmax_fetch(g->ctx, slot ^ 1);
        }
        next = gpu_argmax_wait(g->ctx, slot);
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
    void *bufs[] = {s->x, s->xb, s->q, s->k, s->v, s->hb, s->hb2, s->logits, s->key_cache, s->value_cache, g->att_part};
    gpu_sync(g->ctx);
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gpu_free(bufs[i]);
    if (g->graph) gpu_graph_free(g->graph);
    if (g->batch_graph) gpu_graph_free(g->batch_graph);
    gpu_free(g->d_map);
    if (g->d_owned) gpu_free(g->d_owned);
    if (g->d_half) gpu_free(g->d_half);
    free(g->w.wq);
    free(g->host_logits);
    gpu_destroy(g->ctx);
    free(g);
}

static const Ops gpu_fused_ops = {"gpu int8 fused", gpu_op_begin, gpu_op_end, gpu_op_embed, gpu_op_rmsnorm_held,
                                  gpu_op_matmul_fused, gpu_op_qkv_rope_fused, gpu_op_ffn_up_fused, NULL,
                                  gpu_op_attention, gpu_op_to_host, gpu_op_argmax, gpu_op_argmax_rows, gpu_op_sample_rows, gpu_op_decode_greedy, gpu_op_copy_cache, gpu_op_release};
static const Ops gpu_unfused_ops = {"gpu int8 unfused (dequant + cuBLAS)", gpu_op_begin, gpu_op_end, gpu_op_embed,
                                    gpu_op_rmsnorm, gpu_op_matmul_unfused, qkv_by_matmul, gpu_op_ffn_up_separate,
                                    gpu_op_rope_store, gpu_op_attention, gpu_op_to_host, gpu_op_argmax, gpu_op_argmax_rows, gpu_op_sample_rows, gpu_op_decode_greedy, gpu_op_copy_cache, gpu_op_release};
static const Ops gpu_fp32_ops = {"gpu fp32 cuBLAS", gpu_op_begin, gpu_op_end, gpu_op_embed, gpu_op_rmsnorm,
                                 gpu_op_matmul_fused, qkv_by_matmul, gpu_op_ffn_up_separate, gpu_op_rope_store,
                                 gpu_op_attention, gpu_op_to_host, gpu_op_argmax, gpu_op_argmax_rows, gpu_op_sample_rows, gpu_op_decode_greedy, gpu_op_copy_cache, gpu_op_release};
static const Ops gpu_fp16_ops = {"gpu fp16 cuBLAS (weights converted at load)", gpu_op_begin, gpu_op_end, gpu_op_embed,
                                 gpu_op_rmsnorm, gpu_op_matmul_fused, qkv_by_matmul, gpu_op_ffn_up_separate,
                                 gpu_op_rope_store, gpu_op_attention, gpu_op_to_host, gpu_op_argmax, gpu_op_argmax_rows, gpu_op_sample_rows, gpu_op_decode_greedy, gpu_op_copy_cache, gpu_op_release};

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

// Uploads the model once (the file as it lies, plus any repacked buffers) and allocates the
// activations and KV cache on the GPU. Checks that it all fits before allocating any of it.
static int gpu_exec_init(Exec *e, const Model *m, GpuOptions opt, char *why) {
    const Config cfg = exec_config(m, opt.context), *p = &cfg;
    int head_size = p->dim / p->n_heads, kv_bytes = opt.kv_half ? 2 : 4, n_seqs = opt.n_seqs > 0 ? opt.n_seqs : 1;
    if (gpu_probe(why)) return GPU_UNAVAILABLE;
    if (head_size > gpu_attention_max_head_size()) {
        snprintf(why, ERR_LEN, "head size %d is beyond the GPU attention kernel's %d", head_size, gpu_attention_max_head_size());
        return GPU_UNAVAILABLE;
    }
    StateSizes z = state_sizes(p);
    size_t all_elems, largest = largest_mat(m, &all_elems);
    size_t part = gpu_attention_part_floats(MAX_TOKENS, p->n_heads, head_size, p->seq_len);
    size_t weights = m->map_bytes + m->owned_bytes + (opt.path == PATH_FP16 ? all_elems * 2 : 0);
    size_t kv = 2 * z.cache * kv_bytes * n_seqs;
    size_t acts = (3 * z.x + 2 * z.kv + 2 * z.hidden + z.logits + part) * sizeof(float);
    size_t scratch = m->quantized && opt.path == PATH_UNFUSED ? largest : 0, free_b, total_b;
    size_t half_in = (size_t)MAX_TOKENS * round_up(p->dim > p->hidden_dim ? p->dim : p->hidden_dim, 64);   // FP16 inputs: --fp16, tensor cores (K padded to 64)
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
    const double weight_bytes = weight_bytes_per_token(m, opt.path == PATH_FP16);
    GpuExec *g = xcalloc(1, sizeof(GpuExec));
    g->model = m;
    g->ctx = gpu_create(scratch, half_in);
    opt.tma_gemv = gpu_set_gemv_tma(g->ctx, opt.tma_gemv == TMA_AUTO ? weight_bytes >= TMA_AUTO_BYTES : opt.tma_gemv);
    if (opt.pdl == PDL_AUTO) opt.pdl = weight_bytes < PDL_AUTO_BYTES || opt.tma_gemv;
    g->opt = opt;
    gpu_set_pdl(g->ctx, opt.pdl);
    g->no_norm_fold = getenv("RUN_NO_NORM_FOLD") && !strcmp(getenv("RUN_NO_NORM_FOLD"), "1");
    g->host_sample = getenv("RUN_HOST_SAMPLE") && !strcmp(getenv("RUN_HOST_SAMPLE"), "1");
    g->d_map = gpu_alloc(m->map_bytes);
    gpu_upload(g->d_map, m->map, m->map_bytes);
    if (m->owned_bytes) {
        g->d_owned = gpu_alloc(m->owned_bytes);
        gpu_upload(g->d_owned, m->owned, m->owned_bytes);
    }
    mirror_weights(g, m);
    if (opt.path == PATH_FP16) make_half_weights(g, p, all_elems);
    g->att_part = gpu_alloc(part * sizeof(float));
    g->host_logits = xcalloc(z.logits, sizeof(float));
    memset(e, 0, sizeof *e);
    e->ops = opt.path == PATH_FP16 ? &gpu_fp16_ops : !m->quantized ? &gpu_fp32_ops
           : opt.path == PATH_UNFUSED ? &gpu_unfused_ops : &gpu_fused_ops;
    snprintf(e->desc, sizeof e->desc, "%s; %s, %s, FP%d KV cache%s", e->ops->name, opt.use_graph ? "CUDA graph" : "no graph",
             opt.pdl ? "PDL" : "no PDL", 8 * kv_bytes,
             opt.tma_gemv && e->ops == &gpu_fused_ops ? ", copy-engine GEMV" : "");
    e->cfg = *p;
    e->kv_bytes = kv_bytes;
    e->n_seqs = n_seqs;
    e->w = &g->w;
    e->priv = g;
    alloc_state(&e->s, p, kv_bytes, n_seqs, gpu_alloc);
    return 0;
}
#else
static int gpu_exec_init(Exec *e, const Model *m, GpuOptions opt, char *why) {
    (void)e, (void)m, (void)opt;
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

// The token whose piece is a's then b's, or -1. buf: room for two pieces.
static int merge_of(const Tokenizer *t, int a, int b, char *buf) {
    snprintf(buf, (size_t)t->max_token_length * 2 + 3, "%s%s", t->vocab[a], t->vocab[b]);
    return str_lookup(buf, t);
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
    // Merges, highest score first (the first such pair on ties), as llama2.c does. merge[i] is the
    // token that merges tokens[i] and tokens[i + 1] (or -1): each pair is looked up once, and after
    // a merge only the two pairs it changed, instead of every pair on every pass.
    int *merge = xcalloc(n, sizeof(int));
    for (int i = 0; i + 1 < n; i++) merge[i] = merge_of(t, tokens[i], tokens[i + 1], buf);
    for (;;) {
        float best_score = -1e10f;
        int best_idx = -1;
        for (int i = 0; i + 1 < n; i++)
            if (merge[i] >= 0 && t->scores[merge[i]] > best_score) best_score = t->scores[merge[i]], best_idx = i;
        if (best_idx < 0) break;
        tokens[best_idx] = merge[best_idx];
        memmove(tokens + best_idx + 1, tokens + best_idx + 2, (n - best_idx - 2) * sizeof(int));
        if (n - best_idx - 3 > 0) memmove(merge + best_idx + 1, merge + best_idx + 2, (n - best_idx - 3) * sizeof(int));
        n--;
        if (best_idx > 0) merge[best_idx - 1] = merge_of(t, tokens[best_idx - 1], tokens[best_idx], buf);
        if (best_idx + 1 < n) merge[best_idx] = merge_of(t, tokens[best_idx], tokens[best_idx + 1], buf);
    }
    free(merge);
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
    ProbIndex *probindex, *sort_tmp;   // (vocab_size) each: scratch for top-p
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

// The sort key of a probability >= 0: its bits inverted, so that ascending keys are descending
// probabilities (the bits of non-negative floats order as their values).
static uint32_t prob_key(float prob) {
    uint32_t bits;
    memcpy(&bits, &prob, sizeof bits);
    return ~bits;
}

// Sorts items (n, probabilities >= 0) largest first, equal ones in their given order: a stable
// LSD radix sort, a byte of the key per pass, through tmp (n); the four bytes' histograms in one
// read, and a pass whose byte is the same for every item (the exponent, in a flat distribution)
// skipped. Linear time: where top-p keeps nearly every token (flat distributions, such as random
// weights' at -t 0.8) qsort took about 2.5-3.5 ms a token over 32000 candidates.
static void sort_by_prob(ProbIndex *items, ProbIndex *tmp, int n) {
    if (n < 2) return;
    int count[4][256] = {{0}};
    for (int i = 0; i < n; i++) {
        const uint32_t key = prob_key(items[i].prob);
        for (int b = 0; b < 4; b++) count[b][(key >> 8 * b) & 255]++;
    }
    ProbIndex *src = items, *dst = tmp;
    for (int b = 0; b < 4; b++) {
        if (count[b][(prob_key(src[0].prob) >> 8 * b) & 255] == n) continue;   // one bucket: nothing moves
        int start[256];
        for (int d = 0, sum = 0; d < 256; d++) start[d] = sum, sum += count[b][d];
        for (int i = 0; i < n; i++) dst[start[(prob_key(src[i].prob) >> 8 * b) & 255]++] = src[i];
        ProbIndex *t = src;
        src = dst, dst = t;
    }
    if (src != items) memcpy(items, src, (size_t)n * sizeof *items);
}

// Samples from the smallest set of tokens whose probability exceeds topp, the tokens in
// descending probability (equal ones by index). Tokens under (1 - topp) / (n - 1) cannot be in
// that set and are dropped before the sort. probindex, tmp: n each.
static int sample_topp(const float *probabilities, int n, float topp, ProbIndex *probindex, ProbIndex *tmp, float coin) {
    int n0 = 0;
    const float cutoff = (1.0f - topp) / (n - 1);
    for (int i = 0; i < n; i++)
        if (probabilities[i] >= cutoff) probindex[n0++] = (ProbIndex){probabilities[i], i};
    // none: a flat distribution and topp under 1 / n, whose set is the most probable token alone
    if (n0 == 0) return argmax_row(probabilities, n);
    sort_by_prob(probindex, tmp, n0);
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
    s->sort_tmp = xcalloc(vocab_size, sizeof(ProbIndex));
    s->scratch = xcalloc(vocab_size, sizeof(float));
}

static void free_sampler(Sampler *s) {
    free(s->probindex);
    free(s->sort_tmp);
    free(s->scratch);
}

// Next token from one row of logits in host memory.
static int sample_host(Sampler *s, const float *row) {
    if (s->temperature == 0.0f) return argmax_row(row, s->vocab_size);
    float *p = s->scratch;
    memcpy(p, row, s->vocab_size * sizeof(float));
    for (int q = 0; q < s->vocab_size; q++) p[q] /= s->temperature;
    softmax(p, s->vocab_size);
    float coin = random_f32(&s->rng_state);
    if (s->topp <= 0 || s->topp >= 1) return sample_mult(p, s->vocab_size, coin);
    return sample_topp(p, s->vocab_size, s->topp, s->probindex, s->sort_tmp, coin);
}

// Rows of logits sampled on the executor where it can, each row's coin drawn from its sampler as
// sample_host draws it (none for a row marked in skip, whose token is unused): 0, or -1 with the
// samplers untouched. The samplers share one temperature (> 0) and top-p.
static int sample_on_executor(Exec *e, Sampler *samplers, int rows, const int *skip, const float *logits, int *out) {
    float coins[MAX_SEQS];
    unsigned long long saved[MAX_SEQS];
    if (!e->ops->sample_rows || rows > MAX_SEQS) return -1;
    for (int r = 0; r < rows; r++) {
        saved[r] = samplers[r].rng_state;
        coins[r] = skip && skip[r] ? 0.0f : random_f32(&samplers[r].rng_state);
    }
    if (e->ops->sample_rows(e, logits, rows, samplers[0].temperature, samplers[0].topp, coins, out) == 0) return 0;
    for (int r = 0; r < rows; r++) samplers[r].rng_state = saved[r];
    return -1;
}

// Next token from one row of logits, on the executor where it can (greedy always).
static int sample(Sampler *s, Exec *e, const float *logits) {
    if (s->temperature == 0.0f) return e->ops->argmax(e, logits);
    int token;
    if (sample_on_executor(e, s, 1, NULL, logits, &token) == 0) return token;
    return sample_host(s, e->ops->to_host(e, logits, 1));
}

// ----------------------------------------------------------------------------
// Generation and perplexity

typedef struct {
    int prompt_tokens, generated;
    double prefill_s, decode_s;
    double kv_bytes;   // KV cache bytes the decode steps read (keys and values of every position)
} GenStats;

static size_t mat_bytes(const Mat *m) {
    return m->f ? (size_t)m->rows * m->stride * sizeof(float)
                : (size_t)m->rows * m->stride + (size_t)m->rows * m->groups * sizeof(float);
}

// Weight bytes one decode step must read: every linear weight and norm, the classifier, and one
// embedding row; fp16: the linear weights as the FP16 path holds them. (Scales included; the KV
// cache is counted separately.)
static size_t weight_bytes_per_token(const Model *m, int fp16) {
    const Weights *w = &m->w;
    const Mat *e = &w->tok_embedding;
    size_t bytes = (mat_bytes(e) / e->rows) + ((size_t)2 * m->cfg.n_layers + 1) * m->cfg.dim * sizeof(float);
    for (int i = 0; i < n_linear(&m->cfg); i++) {
        const Mat *l = linear_at((Weights *)w, &m->cfg, i);
        bytes += fp16 ? (size_t)l->rows * l->cols * 2 : mat_bytes(l);
    }
    return bytes;
}

// KV cache bytes the attention of one token at position pos reads: keys and values of positions
// 0..pos in every layer.
static double kv_bytes_at(const Exec *e, int pos) { return 2.0 * e->cfg.n_layers * layer_rows_bytes(e, pos + 1); }

// Flushes stdout: 0, or -1 with the reason in err if it is gone (a closed pipe).
static int flush_stdout(char *err) {
    if (fflush(stdout) == 0 && !ferror(stdout)) return 0;
    snprintf(err, ERR_LEN, "writing the output failed: %s", strerror(errno));
    return -1;
}

// Prints a piece of text, then flush_stdout.
static int emit(const char *piece, char *err) {
    safe_print(piece);
    return flush_stdout(err);
}

// Runs tokens[0..n) at positions pos.. in chunks of MAX_TOKENS; returns the last token's logits.
static const float *prefill(Exec *e, const int *tokens, int n, int pos) {
    const float *logits = NULL;
    for (int done = 0; done < n; done += MAX_TOKENS) {
        int M = n - done < MAX_TOKENS ? n - done : MAX_TOKENS;
        logits = forward(e, tokens + done, M, pos + done, 0);
    }
    return logits;
}

// Prints each token of a pipelined decode after the one before it.
typedef struct {
    const Tokenizer *tok;
    int prev;
    char *err;
} Printer;

static int print_token(void *ctx, int token) {
    Printer *p = ctx;
    int rc = emit(decode(p->tok, p->prev, token), p->err);
    p->prev = token;
    return rc;
}

// Samples from logits (of position pos) on, one forward per token, until BOS or position steps.
// Returns the tokens generated, or -1 if printing failed.
static int decode_loop(Exec *e, Sampler *sampler, const float *logits, int pos, int steps, Printer *pr) {
    int generated = 0;
    while (pos < steps) {
        int next = sample(sampler, e, logits);
        pos++;
        generated++;
        if (next == BOS) break;
        if (print_token(pr, next)) return -1;
        if (pos < steps) logits = forward(e, &next, 1, pos, 0);
    }
    return generated;
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
    for (int i = 1; i < n; i++)
        if (emit(decode(tok, tokens[i - 1], tokens[i]), err)) goto fail;
    int generated = NOT_PIPELINED;
    Printer pr = {tok, tokens[n - 1], err};
    if (sampler->temperature == 0.0f && e->ops->decode_greedy)
        generated = e->ops->decode_greedy(e, logits, n - 1, steps, print_token, &pr);
    if (generated == NOT_PIPELINED) generated = decode_loop(e, sampler, logits, n - 1, steps, &pr);
    if (generated < 0) goto fail;
    double kv_bytes = 0;   // the decode steps ran at positions n .. n + generated - 2
    for (int pos = n; pos < n - 1 + generated; pos++) kv_bytes += kv_bytes_at(e, pos);
    if (emit("\n", err)) goto fail;
    *st = (GenStats){n, generated, (t1 - t0) / 1e6, (time_in_us() - t1) / 1e6, kv_bytes};
    free(tokens);
    return 0;
fail:
    free(tokens);
    return -1;
}

// --batch: B sequences from one prompt, each with its own sampler (seeds s, s + 1, ...) and KV
// cache, decoded together: a step is one forward of B tokens, so each linear layer is one M = B
// GEMM over weights read once. The prompt is prefilled once, into sequence 0's cache, whose rows
// are then copied to the others. Sequences that produce BOS stop (their slot keeps running, its
// output unused); each sequence's text is printed when all are done. st->generated counts the
// steps (tokens per sequence).
static int generate_batch(Exec *e, const Tokenizer *tok, Sampler *samplers, int B, const char *prompt, int steps,
                          GenStats *st, char *err) {
    int *tokens = xcalloc(strlen(prompt) + 3, sizeof(int)), n = 0, V = e->cfg.vocab_size;
    int *out = xcalloc((size_t)B * (steps + 1), sizeof(int)), *next = xcalloc(B, sizeof(int));
    int *count = xcalloc(B, sizeof(int)), *stopped = xcalloc(B, sizeof(int));   // tokens so far; produced BOS
    int status = -1, step = 0;
    if (encode(tok, prompt, 1, tokens, &n, err)) goto done;
    if (n > steps) {
        snprintf(err, ERR_LEN, "the prompt is %d tokens but -n allows only %d positions", n, steps);
        goto done;
    }
    long t0 = time_in_us();
    const float *host = e->ops->to_host(e, prefill(e, tokens, n, 0), 1);
    e->ops->copy_cache(e, n);
    long t1 = time_in_us();
    int live = B, greedy = 1;   // greedy: every sequence takes the argmax, done where the logits are
    for (int b = 0; b < B; b++) next[b] = sample_host(&samplers[b], host);   // all from the prompt's last row
    for (int b = 0; b < B; b++) greedy = greedy && samplers[b].temperature == 0.0f;
    for (int pos = n; live > 0; pos++) {
        step++;
        for (int b = 0; b < B; b++) {
            if (stopped[b]) continue;
            if (next[b] == BOS) stopped[b] = 1, live--;
            else out[(size_t)b * (steps + 1) + count[b]++] = next[b];
        }
        if (live == 0 || pos >= steps) break;
        const float *logits = forward_batch(e, next, B, pos);   // a stopped slot runs BOS, unused
        if (greedy) {
            e->ops->argmax_rows(e, logits, B, next);
        } else if (sample_on_executor(e, samplers, B, stopped, logits, next)) {
            host = e->ops->to_host(e, logits, B);
            for (int b = 0; b < B; b++)
                if (!stopped[b]) next[b] = sample_host(&samplers[b], host + (size_t)b * V);
        }
        for (int b = 0; b < B; b++) next[b] = stopped[b] ? BOS : next[b];
    }
    long t2 = time_in_us();
    for (int b = 0; b < B; b++) {
        const int *seq = out + (size_t)b * (steps + 1);
        printf("[sequence %d]\n", b);
        for (int i = 1; i < n; i++) safe_print(decode(tok, tokens[i - 1], tokens[i]));
        for (int i = 0; i < count[b]; i++) safe_print(decode(tok, i ? seq[i - 1] : tokens[n - 1], seq[i]));
        if (emit("\n", err)) goto done;
    }
    *st = (GenStats){n, step, (t1 - t0) / 1e6, (t2 - t1) / 1e6, 0};
    status = 0;
done:
    free(tokens), free(out), free(next), free(count), free(stopped);
    return status;
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
        for (int done = 0; done < len; done += MAX_TOKENS) {
            int M = len - done < MAX_TOKENS ? len - done : MAX_TOKENS;
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

// Everything the command line sets, parsed without side effects (the fuzzer calls this).
typedef struct {
    const char *checkpoint, *prompt, *tokenizer, *ppl_file, *device;
    float temperature, topp;
    long steps, seed, batch;
    GpuOptions gpu;
} CliArgs;

#define CLI_USAGE -2   // parse_cli: not a usable command line; print the usage text

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out, char *err) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        snprintf(err, ERR_LEN, "%s expects an integer in [%ld, %ld], got \"%.100s\"", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *flag, const char *s, float lo, float hi, float *out, char *err) {
    char *end;
    float v = strtof(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) {
        snprintf(err, ERR_LEN, "%s expects a number in [%g, %g], got \"%.100s\"", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

// 0, or -1 (a bad value: the reason in err) or CLI_USAGE (err says what was not understood).
static int parse_cli(int argc, char **argv, CliArgs *a, char *err) {
    *a = (CliArgs){NULL, "", NULL, NULL, "gpu", 1.0f, 0.9f, 256, 0, 1, {PATH_FUSED, 1, 1, PDL_AUTO, 1, 0, 0, TMA_AUTO}};
    if (argc < 2 || argv[1][0] == '-') {
        snprintf(err, ERR_LEN, "the first argument must be the checkpoint");
        return CLI_USAGE;
    }
    a->checkpoint = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(f, "--unfused")) { a->gpu.path = PATH_UNFUSED; continue; }
        if (!strcmp(f, "--fp16")) { a->gpu.path = PATH_FP16; continue; }
        if (!strcmp(f, "--no-graph")) { a->gpu.use_graph = 0; continue; }
        if (!strcmp(f, "--kv-fp32")) { a->gpu.kv_half = 0; continue; }
        if (!strcmp(f, "--no-pdl")) { a->gpu.pdl = 0; continue; }
        if (!strcmp(f, "--pdl")) { a->gpu.pdl = 1; continue; }
        if (!strcmp(f, "--tma-gemv")) { a->gpu.tma_gemv = 1; continue; }
        if (!strcmp(f, "--no-tma-gemv")) { a->gpu.tma_gemv = 0; continue; }
        if (!strcmp(f, "--no-tc")) { a->gpu.tensor_cores = 0; continue; }
        if (!v) {
            snprintf(err, ERR_LEN, "option \"%.100s\" is unknown or lacks its value", f);
            return CLI_USAGE;
        }
        if (!strcmp(f, "-p") || !strcmp(f, "-i")) a->prompt = v;
        else if (!strcmp(f, "-n")) rc = parse_long(f, v, 0, INT_MAX, &a->steps, err);
        else if (!strcmp(f, "-t")) rc = parse_float(f, v, 0.0f, FLT_MAX, &a->temperature, err);
        else if (!strcmp(f, "--top-p")) rc = parse_float(f, v, 0.0f, 1.0f, &a->topp, err);
        else if (!strcmp(f, "-s")) rc = parse_long(f, v, 0, LONG_MAX, &a->seed, err);
        else if (!strcmp(f, "--batch")) rc = parse_long(f, v, 1, MAX_SEQS, &a->batch, err);
        else if (!strcmp(f, "-z")) a->tokenizer = v;
        else if (!strcmp(f, "--ppl")) a->ppl_file = v;
        else if (!strcmp(f, "--device")) a->device = v;
        else {
            snprintf(err, ERR_LEN, "unknown option \"%.100s\"", f);
            return CLI_USAGE;
        }
        if (rc) return rc;
        i++;
    }
    if (a->batch > 1 && a->ppl_file) {
        snprintf(err, ERR_LEN, "--batch generates; it does not apply to --ppl");
        return -1;
    }
    if (strcmp(a->device, "cpu") && strcmp(a->device, "gpu")) {
        snprintf(err, ERR_LEN, "--device expects cpu or gpu, got \"%.100s\"", a->device);
        return -1;
    }
    return 0;
}

#ifndef RUN_NO_MAIN
static void usage(const char *why) {
    fprintf(stderr,
            "run: %s\n"
            "Usage:   run <checkpoint> [options]\n"
            "Example: run models/stories260K_q8.bin -z models/tok512.bin -p \"Once upon a time\"\n"
            "Options:\n"
            "  -p, -i <string>  prompt (default: empty)\n"
            "  -n <int>         positions to run, prompt included (default 256; 0 = the context length)\n"
            "  -t <float>       temperature in [0, inf) (default 1.0; 0 = greedy)\n"
            "  --top-p <float>  top-p (nucleus) sampling in [0, 1] (default 0.9; 0 or 1 = off)\n"
            "  -s <int>         random seed (default: time)\n"
            "  --batch <int>    decode this many sequences (1 to 64) from the prompt together, seeds s, s+1, ...\n"
            "  -z <string>      tokenizer (default: tokenizer.bin beside the binary)\n"
            "  --device cpu|gpu where to run (default gpu; falls back to cpu with a message)\n"
            "  --unfused        GPU: separate dequant kernel + cuBLAS instead of the fused kernels\n"
            "  --fp16           GPU: weights converted to FP16 at load, cuBLAS (the unquantized baseline)\n"
            "  --kv-fp32        GPU: FP32 KV cache (default FP16)\n"
            "  --no-graph       GPU: launch every kernel from the host instead of replaying a CUDA graph\n"
            "  --no-tc          GPU: prefill batches on the SIMT kernel instead of the tensor cores\n"
            "  --pdl, --no-pdl  GPU: programmatic dependent launch (a kernel starts while the last drains)\n"
            "                   on or off (default: on for models under 1 GB of weights per token, and with\n"
            "                   the copy-engine GEMV)\n"
            "  --tma-gemv, --no-tma-gemv  GPU: decode GEMVs fed by the copy engine (H100/H200) on or off\n"
            "                   (default: on for models of 4 GB of weights per token and more)\n"
            "  --ppl <file>     print the perplexity of the text in <file> instead of generating\n",
            why);
    exit(1);
}

static void die(const char *msg) {
    fprintf(stderr, "run: %s\n", msg);
    exit(1);
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

static void print_stats(const GenStats *st, const Model *model, const Exec *e, const CliArgs *a, const char *path_name) {
    int decoded = st->generated > 0 ? st->generated - 1 : 0;   // the first sample came from prefill
    double tps = st->decode_s > 0 ? decoded / st->decode_s : 0.0;
    double gb_w = weight_bytes_per_token(model, !strcmp(a->device, "gpu") && a->gpu.path == PATH_FP16) / 1e9;
    double gb_kv = decoded > 0 ? st->kv_bytes / decoded / 1e9 : 0.0;
    fprintf(stderr,
            "prompt %d tokens, generated %d; prefill %.1f tok/s, decode %.1f tok/s; weights %.3f GB/token, "
            "KV cache %.3f GB/token (FP%d), %.1f GB/s effective; device %s, path %s, %s\n",
            st->prompt_tokens, st->generated, st->prefill_s > 0 ? st->prompt_tokens / st->prefill_s : 0.0, tps, gb_w, gb_kv,
            8 * e->kv_bytes, (gb_w + gb_kv) * tps, a->device, path_name, format_name(model->format));
}

int main(int argc, char **argv) {
    CliArgs a;
    char default_tok[4200], err[ERR_LEN];
    int rc = parse_cli(argc, argv, &a, err);
    if (rc == CLI_USAGE) usage(err);
    if (rc) die(err);
    signal(SIGPIPE, SIG_IGN);   // a closed stdout becomes a write error with a message, not a kill
    if (!a.tokenizer) {
        default_tokenizer(default_tok, sizeof default_tok, argv[0]);
        a.tokenizer = default_tok;
    }

    Model model;
    if (load_model(a.checkpoint, &model, err)) die(err);
    Tokenizer tok;
    if (build_tokenizer(&tok, a.tokenizer, model.cfg.vocab_size, err)) die(err);
    if (a.steps > model.cfg.seq_len) {
        snprintf(err, ERR_LEN, "-n %ld is beyond the context of %s (seq_len %d)", a.steps, a.checkpoint, model.cfg.seq_len);
        die(err);
    }
    if (a.steps == 0) a.steps = model.cfg.seq_len;
    if (a.batch > 1) a.gpu.n_seqs = (int)a.batch, a.gpu.context = (int)a.steps;   // caches only as long as -n

    Exec exec;
    const char *path_name = model.quantized ? "int8" : "fp32";
    if (!strcmp(a.device, "gpu")) {
        rc = gpu_exec_init(&exec, &model, a.gpu, err);
        if (rc == GPU_TOO_SMALL) die(err);
        if (rc == 0) {
            path_name = exec.desc;
        } else {
            fprintf(stderr, "run: GPU unavailable (%s); using the CPU\n", err);
            a.device = "cpu";
        }
    }
    if (!strcmp(a.device, "cpu")) {
        if (a.gpu.path != PATH_FUSED) fprintf(stderr, "run: --unfused and --fp16 apply to the GPU only; ignored on the CPU\n");
        cpu_exec_init(&exec, &model, a.gpu.n_seqs > 0 ? a.gpu.n_seqs : 1, a.gpu.context);
    }

    int status = 0;
    if (a.ppl_file) {
        size_t bytes;
        double ppl;
        int n_pred;
        char *text = read_file(a.ppl_file, (size_t)64 << 20, &bytes, err);
        if (!text || perplexity(&exec, &tok, text, &ppl, &n_pred, err)) {
            fprintf(stderr, "run: %s\n", err);
            status = 1;
        } else {
            printf("perplexity %.4f over %d predicted tokens (%s, %s %s)\n", ppl, n_pred, a.ppl_file, a.device, path_name);
            if (flush_stdout(err)) {
                fprintf(stderr, "run: %s\n", err);
                status = 1;
            }
        }
        free(text);
    } else {
        int B = (int)a.batch;
        Sampler *samplers = xcalloc(B, sizeof(Sampler));
        unsigned long long seed = a.seed > 0 ? (unsigned long long)a.seed : (unsigned long long)time(NULL);
        for (int b = 0; b < B; b++) build_sampler(&samplers[b], model.cfg.vocab_size, a.temperature, a.topp, seed + b);
        GenStats st;
        rc = B > 1 ? generate_batch(&exec, &tok, samplers, B, a.prompt, (int)a.steps, &st, err)
                   : generate(&exec, &tok, samplers, a.prompt, (int)a.steps, &st, err);
        if (rc) {
            fprintf(stderr, "run: %s\n", err);
            status = 1;
        } else if (B > 1) {
            int steps = st.generated > 0 ? st.generated - 1 : 0;   // decode steps after the prefill's sample
            double per_seq = st.decode_s > 0 ? steps / st.decode_s : 0.0;
            fprintf(stderr, "batch %d: prompt %d tokens, %d steps; prefill %.1f tok/s; decode %.1f tok/s aggregate, %.1f tok/s "
                            "per sequence; device %s, path %s\n",
                    B, st.prompt_tokens, st.generated, st.prefill_s > 0 ? st.prompt_tokens / st.prefill_s : 0.0, B * per_seq, per_seq,
                    a.device, path_name);
        } else {
            print_stats(&st, &model, &exec, &a, path_name);
        }
        for (int b = 0; b < B; b++) free_sampler(&samplers[b]);
        free(samplers);
    }
    exec.ops->release(&exec);
    free_tokenizer(&tok);
    free_model(&model);
    return status;
}
#endif
