// cpu.c: the CPU executor: C over the host weights, the reference every GPU result is tested
// against. The matmul's inner loops are in vec.c: the INT8 one dequantizes in registers, group by
// group (the CPU analogue of the fused kernel), so no FP32 copy of the weights exists beyond a
// few rows per thread. Matmuls split their rows, attention its (token, head) pairs, over a pool
// of threads (pool.h); each output is computed by one thread in one order, so the results do not
// depend on the thread count.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "pool.h"
#include "sampler.h"   // softmax, argmax_row
#include "util.h"
#include "vec.h"

// A prompt chunk of this many tokens or more takes the int8 x int8 matmul where it may
// (cpu_exec_int8_prefill): below it, packing the weights' tiles costs more than it saves.
#define INT8_ACT_MIN_TOKENS 16

// The CPU executor's own state (Exec.priv).
typedef struct {
    float *tiles;       // (threads, VEC_TILE_ROWS, max_cols): each thread's dequantized weight rows
    float *rope_freq;   // (head_dim / 2): rope_frequencies()
    float *rope_cs;     // (head_dim / 2, 2): cos and sin of one token's angles
    int int8_prefill;   // cpu_exec_int8_prefill: prompt chunks on int8 x int8 where the CPU has it
    int int8_step;      // this step takes it (cpu_begin)
    void *act;          // the step's quantized input (vec_act_q8_bytes), grown as needed
    size_t act_bytes;
    void *q8_scratch;   // (threads, q8_scratch_bytes): the int8 x int8 matmul's packed tiles
    size_t q8_scratch_bytes;
} CpuState;
#define CPU(e) ((CpuState *)(e)->priv)

// The widest input of a linear layer: the longest row a thread dequantizes.
static size_t max_cols(const Config *p) {
    int cols = p->dim > p->hidden_dim ? p->dim : p->hidden_dim;
    return (size_t)(cols > q_dim_of(p) ? cols : q_dim_of(p));
}

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
        ss += e->cfg.norm_eps;
        ss = 1.0f / sqrtf(ss);
        for (int j = 0; j < n; j++) out[(size_t)m * n + j] = w[j] * (ss * x[j]);
    }
}

// The input as plain rows: itself, or its RMSNorm in xb.
static const float *cpu_apply_norm(Exec *e, Input in, int M) {
    if (!in.norm_w) return in.x;
    cpu_rmsnorm(e, e->s.xb, in.x, in.norm_w, M);
    return e->s.xb;
}

// Up to three matmuls of one input (q, k and v; w1 and w3) as one job: their rows one after the
// other, so that a decode step waits for the pool once for them, not once each.
#define MAX_JOB_MATS 3
typedef struct {
    const float *in;
    int M, accumulate, n;
    const Mat *w[MAX_JOB_MATS];
    float *out[MAX_JOB_MATS];
    float *tiles;   // CpuState.tiles
    size_t tile_cols;
    const VecActQ8 *act;   // non-NULL: in quantized, for the int8 x int8 matmul
    char *q8_scratch;      // with act: CpuState.q8_scratch
    size_t q8_scratch_bytes;
} MatmulJob;

// Rows lo..hi of the job's rows: each matrix's share of them against all M inputs (each weight
// row is read once for all M: prefill batches share the weight traffic).
static void matmul_rows(void *ctx, int lo, int hi, int slot) {
    const MatmulJob *j = ctx;
    float *scratch = j->tiles + (size_t)slot * VEC_TILE_ROWS * j->tile_cols;
    for (int i = 0, first = 0; i < j->n && first < hi; first += j->w[i]->rows, i++) {
        const int a = lo > first ? lo - first : 0, b = hi - first < j->w[i]->rows ? hi - first : j->w[i]->rows;
        if (a < b && j->act) vec_matmul_q8q8_slice(j->w[i], j->act, j->out[i], j->accumulate, a, b, j->q8_scratch + slot * j->q8_scratch_bytes);
        else if (a < b) vec_matmul_slice(j->w[i], j->in, j->M, j->out[i], j->accumulate, a, b, scratch);
    }
}

static void quantize_tokens(void *ctx, int lo, int hi, int slot) {
    (void)slot;
    const MatmulJob *j = ctx;
    vec_quantize_act(j->in, j->act, lo, hi);
}

// Whether this step's matmuls of w take the int8 x int8 path: a prompt chunk (cpu_begin), INT8
// weights of one group size, a CPU that has it.
static int takes_int8(const Exec *e, int n, const Mat *const *w) {
    int ok = CPU(e)->int8_step;
    for (int i = 0; i < n && ok; i++) ok = vec_int8_act_supported(w[i]) && w[i]->gs == w[0]->gs;
    return ok;
}

// The job's input quantized into act, held in CpuState.act (grown to it), and each thread's
// scratch sized: the job then takes the int8 x int8 matmul.
static void quantize_input(Exec *e, MatmulJob *j, VecActQ8 *act) {
    CpuState *c = CPU(e);
    const Mat *w = j->w[0];
    const size_t need = vec_act_q8_bytes(j->M, w->cols, w->gs), scratch = vec_q8q8_scratch_bytes(w->cols, w->gs);
    if (need > c->act_bytes) free(c->act), c->act = xcalloc(need, 1), c->act_bytes = need;
    if (scratch > c->q8_scratch_bytes)
        free(c->q8_scratch), c->q8_scratch = xcalloc((size_t)pool_threads(), scratch), c->q8_scratch_bytes = scratch;
    *act = vec_act_q8(j->M, w->cols, w->gs, c->act);
    j->act = act, j->q8_scratch = c->q8_scratch, j->q8_scratch_bytes = c->q8_scratch_bytes;
    parallel_for(j->M, 4, quantize_tokens, j);
}

// Under this many multiply-adds a slice, handing work to another thread costs more than it saves.
#define MIN_SLICE_WORK 32768

// out[i] (M, w[i]->rows) = in W[i]^T (+= with accumulate) for n weights of one width: their rows
// split over the pool's threads; each output is one thread's, summed in the same order whatever
// the thread count.
static void cpu_matmuls(Exec *e, Input input, int M, int n, const Mat *const *w, float *const *out, int accumulate) {
    MatmulJob j = {cpu_apply_norm(e, input, M), M, accumulate, n, {0}, {0}, CPU(e)->tiles, max_cols(&e->cfg), NULL, NULL, 0};
    int rows = 0;
    for (int i = 0; i < n; i++) j.w[i] = w[i], j.out[i] = out[i], rows += w[i]->rows;
    VecActQ8 act;
    if (takes_int8(e, n, w)) quantize_input(e, &j, &act);
    const long per_row = (long)w[0]->cols * M;
    parallel_for(rows, (int)(MIN_SLICE_WORK / per_row + 1), matmul_rows, &j);
}

static void cpu_matmul(Exec *e, float *out, Input input, int M, const Mat *w, int accumulate) {
    cpu_matmuls(e, input, M, 1, &w, &out, accumulate);
}

// h = silu(h) * g over elements lo..hi, silu(x) = x * sigmoid(x).
typedef struct {
    float *h;
    const float *g;
} SwigluJob;
static void swiglu_range(void *ctx, int lo, int hi, int slot) {
    (void)slot;
    const SwigluJob *j = ctx;
    enum { CHUNK = 256 };
    float e[CHUNK];   // expf(-h), a chunk at a time by vec_exp_sub (-h - 0 is -h: the same expf)
    for (int c = lo; c < hi; c += CHUNK) {
        const int n = hi - c < CHUNK ? hi - c : CHUNK;
        for (int i = 0; i < n; i++) e[i] = -j->h[c + i];
        vec_exp_sub(e, n, 0.0f);
        for (int i = 0; i < n; i++) {
            float val = j->h[c + i];
            val *= (1.0f / (1.0f + e[i]));
            j->h[c + i] = val * j->g[c + i];
        }
    }
}

static void cpu_ffn_up(Exec *e, Input in, int M, const Mat *w1, const Mat *w3) {
    float *h = e->s.hb, *g = e->s.hb2;
    const Mat *const w[2] = {w1, w3};
    float *const out[2] = {h, g};
    cpu_matmuls(e, in, M, 2, w, out, 0);
    SwigluJob j = {h, g};
    parallel_for(M * w1->rows, 4096, swiglu_range, &j);   // expf: the threads share a prompt's
}

// RoPE: rotate each pair (2i, 2i+1) of every head by pos * freq_i (rope_frequencies: for
// llama2.c's models the same operations as llama2.c, so FP32 results match it bit for bit); keys
// only cover kv_dim. Then the new keys and values go into the cache rows pos..pos+M-1.
static void cpu_rope_store(Exec *e, int layer, const Step *st) {
    const Config *p = &e->cfg;
    const int q_dim = q_dim_of(p), kv_dim = kv_width_of(p), hd = p->head_dim;
    float *cs = CPU(e)->rope_cs;   // (head_dim / 2, 2): one token's cos and sin, shared by its heads
    for (int m = 0; m < st->M; m++) {
        float *q = e->s.q + (size_t)m * q_dim, *k = e->s.k + (size_t)m * kv_dim;
        for (int i = 0; i < hd / 2; i++) {
            const float val = token_pos(st, m) * CPU(e)->rope_freq[i];
            cs[2 * i] = cosf(val), cs[2 * i + 1] = sinf(val);
        }
        for (int i = 0; i < q_dim; i += 2) {
            const float fcr = cs[i % hd], fci = cs[i % hd + 1];
            for (int v = 0; v < (i < kv_dim ? 2 : 1); v++) {
                float *vec = v == 0 ? q : k;
                float v0 = vec[i], v1 = vec[i + 1];
                vec[i] = v0 * fcr - v1 * fci;
                vec[i + 1] = v0 * fci + v1 * fcr;
            }
        }
    }
    for (int m = 0; m < st->M; m++) {
        size_t at = cache_offset(e, st, layer, m) + (size_t)token_pos(st, m) * kv_dim;
        memcpy((float *)e->s.key_cache + at, e->s.k + (size_t)m * kv_dim, kv_dim * sizeof(float));
        memcpy((float *)e->s.value_cache + at, e->s.v + (size_t)m * kv_dim, kv_dim * sizeof(float));
    }
}

// out (M, n) += bias (n) on every row.
static void add_bias(float *out, const float *bias, int M, int n) {
    for (int m = 0; m < M; m++)
        for (int i = 0; i < n; i++) out[(size_t)m * n + i] += bias[i];
}

// Causal grouped-query attention: token m (at pos + m) attends to cache positions 0..pos+m;
// query head h reads key/value head h / (n_heads / n_kv_heads).
typedef struct {
    Exec *e;
    const Step *st;
    int layer;
} AttentionJob;

// Tokens an attention item takes: a block of a prompt's consecutive tokens (their scores and
// weighted sums read each key and value row once for all of them: vec_scores_block), or one
// token of a sequence each.
static int queries_an_item(const Step *st) { return st->layout == ONE_SEQUENCE ? VEC_QUERIES : 1; }

// Items lo..hi of (head, block of tokens), head-major: a prompt's later tokens attend to more rows,
// so that token-major halves gave one thread about three times the other's work (and a head's
// keys are read by its tokens one after another); slot's own VEC_QUERIES rows of scores.
static void attention_heads(void *ctx, int lo, int hi, int slot) {
    const AttentionJob *j = ctx;
    Exec *e = j->e;
    const Config *p = &e->cfg;
    const int head_size = p->head_dim, q_dim = q_dim_of(p), kv_dim = kv_width_of(p), kv_mul = p->n_heads / p->n_kv_heads;
    const int per = queries_an_item(j->st), blocks = (j->st->M + per - 1) / per, seq_len = e->cfg.seq_len;
    float *att = e->s.att + (size_t)slot * VEC_QUERIES * seq_len;
    for (int item = lo; item < hi; item++) {
        const int h = item / blocks, m0 = item % blocks * per, nq = j->st->M - m0 < per ? j->st->M - m0 : per;
        const size_t head = cache_offset(e, j->st, j->layer, m0) + (size_t)(h / kv_mul) * head_size;   // row 0's in the caches
        const float *q = e->s.q + (size_t)m0 * q_dim + h * head_size;
        const float *keys = (const float *)e->s.key_cache + head, *values = (const float *)e->s.value_cache + head;
        float *out = e->s.xb + (size_t)m0 * q_dim + h * head_size;
        int T[VEC_QUERIES];
        for (int i = 0; i < nq; i++) T[i] = token_pos(j->st, m0 + i) + 1;
        if (nq == 1) {
            vec_scores(q, keys, kv_dim, T[0], head_size, att);
            softmax(att, T[0]);
            vec_weighted_sum(out, att, values, kv_dim, T[0], head_size);
            continue;
        }
        vec_scores_block(q, q_dim, nq, keys, kv_dim, T, head_size, att, seq_len);
        for (int i = 0; i < nq; i++) softmax(att + (size_t)i * seq_len, T[i]);
        vec_weighted_sum_block(out, q_dim, att, seq_len, T, nq, values, kv_dim, head_size);
    }
}

// (head, block of tokens) items split over the pool's threads.
static void cpu_attention(Exec *e, int layer, const Step *st) {
    AttentionJob j = {e, st, layer};
    const int per = queries_an_item(st);
    const long per_item = 2L * per * (token_pos(st, st->M - 1) + 1) * e->cfg.head_dim;
    parallel_for((st->M + per - 1) / per * e->cfg.n_heads, (int)(MIN_SLICE_WORK / per_item + 1), attention_heads, &j);
}

static const float *cpu_to_host(Exec *e, const float *logits, int rows) {
    (void)e, (void)rows;
    return logits;
}

static int cpu_argmax(Exec *e, const float *logits) { return argmax_row(logits, e->cfg.vocab_size); }
static void cpu_argmax_rows(Exec *e, const float *logits, int rows, int *out) {
    for (int r = 0; r < rows; r++) out[r] = argmax_row(logits + (size_t)r * e->cfg.vocab_size, e->cfg.vocab_size);
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
    free(CPU(e)->tiles);
    free(CPU(e)->act);
    free(CPU(e)->q8_scratch);
    free(CPU(e)->rope_freq);
    free(CPU(e)->rope_cs);
    free(e->priv);
}

// "cpu kernels x86-64-v4 (AVX-512), 2 threads[, int8 x int8 prefill (AVX512-VNNI)]"
static void cpu_describe_run(const Exec *e, char *buf, size_t n) {
    const int int8 = CPU(e)->int8_prefill && vec_has_int8_act();
    snprintf(buf, n, "cpu kernels %s, %d thread%s%s", vec_isa_name(), pool_threads(), pool_threads() > 1 ? "s" : "",
             int8 ? ", int8 x int8 prefill (AVX512-VNNI)" : "");
}

static void cpu_qkv(Exec *e, int layer, Input in, const Step *st, const Mat *wq, const Mat *wk, const Mat *wv) {
    const Config *p = &e->cfg;
    const Weights *w = e->w;
    const Mat *const mats[3] = {wq, wk, wv};
    float *const out[3] = {e->s.q, e->s.k, e->s.v};
    cpu_matmuls(e, in, st->M, 3, mats, out, 0);
    if (w->bq) {
        add_bias(e->s.q, w->bq + (size_t)layer * q_dim_of(p), st->M, q_dim_of(p));
        add_bias(e->s.k, w->bk + (size_t)layer * kv_width_of(p), st->M, kv_width_of(p));
        add_bias(e->s.v, w->bv + (size_t)layer * kv_width_of(p), st->M, kv_width_of(p));
    }
    cpu_rope_store(e, layer, st);
}

// A prompt chunk long enough takes the int8 x int8 matmul, where enabled.
static StepStart cpu_begin(Exec *e, const int *tokens, const Step *st, int all_logits) {
    (void)tokens, (void)all_logits;
    CpuState *c = CPU(e);
    c->int8_step = c->int8_prefill && st->layout == ONE_SEQUENCE && st->M >= INT8_ACT_MIN_TOKENS;
    return RUN_THE_OPS;
}

void cpu_exec_int8_prefill(Exec *e, int on) { CPU(e)->int8_prefill = on; }

static const Ops cpu_ops = {
    .name = "cpu",
    .begin = cpu_begin,
    .embed = cpu_embed,
    .matmul = cpu_matmul,
    .qkv = cpu_qkv,
    .ffn_up = cpu_ffn_up,
    .attention = cpu_attention,
    .apply_norm = cpu_apply_norm,
    .to_host = cpu_to_host,
    .argmax = cpu_argmax,
    .argmax_rows = cpu_argmax_rows,
    .copy_cache = cpu_copy_cache,
    .describe_run = cpu_describe_run,
    .release = cpu_release,
};

static void *host_alloc(size_t bytes) { return xcalloc(bytes, 1); }

void cpu_exec_init(Exec *e, const Model *m, int n_seqs, int context) {
    memset(e, 0, sizeof *e);
    e->ops = &cpu_ops;
    snprintf(e->desc, sizeof e->desc, "cpu");
    e->cfg = exec_config(m, context);
    e->w = &m->w;
    e->kv_bytes = sizeof(float);
    e->n_seqs = n_seqs;
    alloc_state(&e->s, &e->cfg, e->kv_bytes, n_seqs, host_alloc);
    e->s.att = xcalloc((size_t)e->cfg.seq_len * VEC_QUERIES * pool_threads(), sizeof(float));   // VEC_QUERIES rows a thread
    CpuState *c = e->priv = xcalloc(1, sizeof(CpuState));
    c->tiles = xcalloc((size_t)pool_threads() * VEC_TILE_ROWS * max_cols(&e->cfg), sizeof(float));
    c->rope_freq = xcalloc((size_t)e->cfg.head_dim / 2, sizeof(float));
    c->rope_cs = xcalloc((size_t)e->cfg.head_dim, sizeof(float));
    if (m->w.rope_freq) memcpy(c->rope_freq, m->w.rope_freq, (size_t)e->cfg.head_dim / 2 * sizeof(float));
    else rope_frequencies(&e->cfg, c->rope_freq);
}

