// forward.c: the whole model, once, for any executor (exec.h), and what both executors share:
// the KV cache geometry, the state's sizes, the weight bytes a step reads.
#include <stdio.h>
#include <stdlib.h>

#include "exec.h"

// Exits on ids outside the vocabulary and on steps outside the context or MAX_TOKENS.
static void check_step(const Exec *e, const int *tokens, const Step *st) {
    const Config *p = &e->cfg;
    const int span = st->layout == ONE_SEQUENCE ? st->M : 1;   // positions the step covers
    for (int m = 0; m < st->M; m++)
        if (tokens[m] < 0 || tokens[m] >= p->vocab_size) {
            fprintf(stderr, "run: token id %d is outside the vocabulary [0, %d)\n", tokens[m], p->vocab_size);
            exit(1);
        }
    if (st->M < 1 || st->M > MAX_TOKENS || st->pos < 0 || st->pos + span > p->seq_len) {
        fprintf(stderr, "run: forward of %d tokens at position %d: outside the context of %d\n", st->M, st->pos, p->seq_len);
        exit(1);
    }
}

// Each linear op receives its input with the RMSNorm before it (Input): the executor folds the
// norm into its matrix kernel or runs it first.
static const float *run_step(Exec *e, const int *tokens, const Step *st, int all_logits) {
    const Config *p = &e->cfg;
    const Weights *w = e->w;
    const Ops *o = e->ops;
    RunState *s = &e->s;
    const int dim = p->dim, M = st->M;
    check_step(e, tokens, st);
    if (o->begin && o->begin(e, tokens, st, all_logits) == STEP_ALREADY_RAN) return s->logits;
    o->embed(e, tokens, M);
    for (int l = 0; l < p->n_layers; l++) {
        // attention, with the residual add in the output projection
        o->qkv(e, l, normed(s->x, w->rms_att + (size_t)l * dim), st, &w->wq[l], &w->wk[l], &w->wv[l]);
        o->attention(e, l, st);
        o->matmul(e, s->x, plain(s->xb), M, &w->wo[l], 1);
        // feed-forward: x += w2(silu(w1 x) * w3 x)
        o->ffn_up(e, normed(s->x, w->rms_ffn + (size_t)l * dim), M, &w->w1[l], &w->w3[l]);
        o->matmul(e, s->x, plain(s->hb), M, &w->w2[l], 1);
    }
    const int first = all_logits ? 0 : M - 1;
    o->matmul(e, s->logits, normed(s->x + (size_t)first * dim, w->rms_final), M - first, &w->wcls, 0);
    if (o->end) o->end(e);
    return s->logits;
}

const float *forward(Exec *e, const int *tokens, int M, int pos, int all_logits) {
    const Step st = {ONE_SEQUENCE, M, pos};
    return run_step(e, tokens, &st, all_logits);
}

const float *forward_batch(Exec *e, const int *tokens, int B, int pos) {
    if (B > e->n_seqs) {
        fprintf(stderr, "run: a batch of %d sequences, the executor has caches for %d\n", B, e->n_seqs);
        exit(1);
    }
    const Step st = {ONE_TOKEN_PER_SEQUENCE, B, pos};
    return run_step(e, tokens, &st, 1);
}

// ----------------------------------------------------------------------------
// KV cache geometry

size_t kv_dim_of(const Config *p) { return (size_t)kv_width_of(p); }
size_t layer_rows_bytes(const Exec *e, int rows) { return (size_t)rows * kv_dim_of(&e->cfg) * e->kv_bytes; }
size_t seq_cache_elems(const Exec *e) { return (size_t)e->cfg.n_layers * e->cfg.seq_len * kv_dim_of(&e->cfg); }
void *layer_cache(const Exec *e, void *cache, int layer) {
    return (char *)cache + (size_t)layer * layer_rows_bytes(e, e->cfg.seq_len);
}

int token_pos(const Step *st, int m) { return st->layout == ONE_SEQUENCE ? st->pos + m : st->pos; }
size_t step_seq_stride(const Exec *e, const Step *st) { return st->layout == ONE_SEQUENCE ? 0 : seq_cache_elems(e); }
size_t cache_offset(const Exec *e, const Step *st, int layer, int m) {
    return m * step_seq_stride(e, st) + (size_t)layer * e->cfg.seq_len * kv_dim_of(&e->cfg);
}

void for_each_cache_copy(Exec *e, int rows, void (*copy)(Exec *e, void *dst, const void *src, size_t bytes)) {
    const size_t seq_bytes = seq_cache_elems(e) * e->kv_bytes;
    for (int b = 1; b < e->n_seqs; b++)
        for (int l = 0; l < e->cfg.n_layers; l++) {
            const char *k = layer_cache(e, e->s.key_cache, l), *v = layer_cache(e, e->s.value_cache, l);
            copy(e, (char *)k + b * seq_bytes, k, layer_rows_bytes(e, rows));
            copy(e, (char *)v + b * seq_bytes, v, layer_rows_bytes(e, rows));
        }
}

// ----------------------------------------------------------------------------
// State, weights

StateSizes state_sizes(const Config *p) {
    size_t kv_dim = kv_dim_of(p);
    const size_t wide = (size_t)(p->dim > q_dim_of(p) ? p->dim : q_dim_of(p));   // xb holds either
    return (StateSizes){(size_t)MAX_TOKENS * p->dim,         MAX_TOKENS * wide,
                        (size_t)MAX_TOKENS * q_dim_of(p),    MAX_TOKENS * kv_dim,
                        (size_t)MAX_TOKENS * p->hidden_dim,  (size_t)MAX_TOKENS * p->vocab_size,
                        (size_t)p->n_layers * p->seq_len * kv_dim};
}

void alloc_state(RunState *s, const Config *p, int kv_bytes, int n_seqs, void *(*alloc)(size_t bytes)) {
    StateSizes z = state_sizes(p);
    z.cache *= n_seqs;
    s->x = alloc(z.x * sizeof(float)), s->xb = alloc(z.xb * sizeof(float)), s->q = alloc(z.q * sizeof(float));
    s->k = alloc(z.kv * sizeof(float)), s->v = alloc(z.kv * sizeof(float));
    s->hb = alloc(z.hidden * sizeof(float)), s->hb2 = alloc(z.hidden * sizeof(float));
    s->logits = alloc(z.logits * sizeof(float));
    s->key_cache = alloc(z.cache * kv_bytes), s->value_cache = alloc(z.cache * kv_bytes);
}

Config exec_config(const Model *m, int context) {
    Config c = m->cfg;
    if (context > 0 && context < c.seq_len) c.seq_len = context;
    return c;
}

int n_linear(const Config *c) { return 7 * c->n_layers + 1; }
Mat *linear_at(Weights *w, const Config *c, int i) { return i < 7 * c->n_layers ? &w->wq[i] : &w->wcls; }

void qkv_by_matmul(Exec *e, int layer, Input in, const Step *st, const Mat *wq, const Mat *wk, const Mat *wv) {
    (void)layer;
    const Input x = plain(e->ops->apply_norm(e, in, st->M));
    e->ops->matmul(e, e->s.q, x, st->M, wq, 0);
    e->ops->matmul(e, e->s.k, x, st->M, wk, 0);
    e->ops->matmul(e, e->s.v, x, st->M, wv, 0);
}

static size_t mat_bytes(const Mat *m) {
    return m->f ? (size_t)m->rows * m->stride * sizeof(float)
                : (size_t)m->rows * m->stride + (size_t)m->rows * m->groups * sizeof(float);
}

// Every linear weight and norm, the classifier, and one embedding row.
size_t weight_bytes_per_token(const Model *m, int fp16) {
    const Weights *w = &m->w;
    const Mat *e = &w->tok_embedding;
    size_t bytes = (mat_bytes(e) / e->rows) + ((size_t)2 * m->cfg.n_layers + 1) * m->cfg.dim * sizeof(float);
    for (int i = 0; i < n_linear(&m->cfg); i++) {
        const Mat *l = linear_at((Weights *)w, &m->cfg, i);
        bytes += fp16 ? (size_t)l->rows * l->cols * 2 : mat_bytes(l);
    }
    return bytes;
}
