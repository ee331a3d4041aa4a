// model.c: checkpoint formats, their validation, and loading into a Weights struct.
// Every header field is checked, and the file size is compared with the size the header
// implies, before any weight is touched: a bad file gets one message, never a wild read.
#include "model.h"
#include "gguf.h"   // GGUF_MAGIC: a GGUF file given to run is refused by name
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

const char *const linear_names[7] = {"wq", "wk", "wv", "wo", "w1", "w2", "w3"};

const char *format_name(int format) {
    switch (format) {
    case FMT_V0: return "llama2.c v0 FP32";
    case FMT_V1: return "llama2.c v1 FP32";
    case FMT_V2: return "llama2.c v2 INT8";
    case FMT_Q8LM: return "Q8LM";
    }
    return "unknown";
}

// ----------------------------------------------------------------------------
// Config validation: limits are generous but keep every size product inside 64 bits.

void config_defaults(Config *c) {
    if (c->head_dim == 0 && c->n_heads > 0 && c->dim % c->n_heads == 0) c->head_dim = c->dim / c->n_heads;
    if (c->rope_theta == 0.0f) c->rope_theta = 10000.0f;
    if (c->norm_eps == 0.0f) c->norm_eps = 1e-5f;
}

// freq_i = theta^(-2i / head_dim), the expression llama2.c evaluates (same float operations, so
// FP32 results stay bit-identical to it); Llama 3.1 scaling as transformers computes it.
void rope_frequencies(const Config *c, float *freq) {
    const RopeScaling *r = &c->rope_scaling;
    for (int i = 0; i < c->head_dim / 2; i++) {
        float f = 1.0f / powf(c->rope_theta, (2 * i) / (float)c->head_dim);
        if (r->type == ROPE_LLAMA3) {
            const double wavelen = 2 * M_PI / f, low = r->original_context / r->low_freq_factor,
                         high = r->original_context / r->high_freq_factor;
            if (wavelen > low) f = f / r->factor;
            else if (wavelen >= high) {
                const double smooth = (r->original_context / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
                f = (float)((1 - smooth) * f / r->factor + smooth * f);
            }
        }
        freq[i] = f;
    }
}

// The fields beyond llama2.c's header: finite, positive, and a scaling that is a scaling.
static int validate_extensions(const Config *c, char *why) {
    const RopeScaling *r = &c->rope_scaling;
    if (!(c->rope_theta >= 1.0f && c->rope_theta <= 1e12f) || !(c->norm_eps > 0.0f && c->norm_eps < 1.0f)) {
        snprintf(why, ERR_LEN, "header field rope_theta = %g or norm_eps = %g is out of range", c->rope_theta, c->norm_eps);
        return -1;
    }
    if (c->qkv_bias != 0 && c->qkv_bias != 1) {
        snprintf(why, ERR_LEN, "header field qkv_bias = %d is not 0 or 1", c->qkv_bias);
        return -1;
    }
    if (r->type == ROPE_PLAIN) return 0;
    if (r->type != ROPE_LLAMA3 || !(r->factor >= 1.0f && r->factor <= 1e6f) || !(r->low_freq_factor > 0.0f) ||
        !(r->high_freq_factor > r->low_freq_factor && r->high_freq_factor < 1e6f) || r->original_context < 1) {
        snprintf(why, ERR_LEN, "header fields of the RoPE scaling (type %d, factor %g, low %g, high %g, original context %d) are invalid",
                 r->type, r->factor, r->low_freq_factor, r->high_freq_factor, r->original_context);
        return -1;
    }
    return 0;
}

int validate_config(const Config *c, char *why) {
    struct { const char *name; int value, lo, hi; } f[] = {
        {"dim", c->dim, 2, 1 << 16},         {"hidden_dim", c->hidden_dim, 1, 1 << 18},
        {"n_layers", c->n_layers, 1, 1024},  {"n_heads", c->n_heads, 1, 4096},
        {"n_kv_heads", c->n_kv_heads, 1, 4096}, {"vocab_size", c->vocab_size, 3, 1 << 22},
        {"seq_len", c->seq_len, 1, 1 << 20},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].value < f[i].lo || f[i].value > f[i].hi) {
            snprintf(why, ERR_LEN, "header field %s = %d is outside [%d, %d]", f[i].name, f[i].value, f[i].lo, f[i].hi);
            return -1;
        }
    if (c->head_dim == 0) {   // config_defaults found no head_dim and could not derive one
        snprintf(why, ERR_LEN, "header field dim = %d is not divisible by n_heads = %d", c->dim, c->n_heads);
        return -1;
    }
    if (c->n_heads % c->n_kv_heads) {
        snprintf(why, ERR_LEN, "header field n_heads = %d is not divisible by n_kv_heads = %d", c->n_heads, c->n_kv_heads);
        return -1;
    }
    if (c->head_dim < 2 || c->head_dim > 1024 || c->head_dim % 2 || (long)c->head_dim * c->n_heads > (1 << 18)) {
        snprintf(why, ERR_LEN, "head size %d is odd or outside [2, 1024] (RoPE rotates pairs), or n_heads x head size is over 2^18",
                 c->head_dim);
        return -1;
    }
    return validate_extensions(c, why);
}

void linear_shape(const Config *c, int which, int *rows, int *cols) {
    static const int out_is[7] = {3, 1, 1, 0, 2, 0, 2};   // 0 dim, 1 kv_dim, 2 hidden, 3 q_dim
    static const int in_is[7] = {0, 0, 0, 3, 0, 2, 0};
    int size[4] = {c->dim, kv_width_of(c), c->hidden_dim, q_dim_of(c)};
    *rows = size[out_is[which]];
    *cols = size[in_is[which]];
}

// ----------------------------------------------------------------------------
// Q8LM layout

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Appends a section of `bytes` at the next aligned offset, returns its offset.
static size_t section(size_t *end, size_t bytes) {
    size_t at = align_up(*end, SECTION_ALIGN);
    *end = at + bytes;
    return at;
}

// Appends the sections of `layers` stacked (rows, cols) matrices: INT8 q and s, or FP32 at q.
static void mat_sections(size_t *end, int layers, int rows, int cols, const Q8Spec *sp, size_t *q, size_t *s) {
    if (sp->fp32) {
        *q = section(end, (size_t)layers * rows * cols * sizeof(float));
        *s = 0;
        return;
    }
    *q = section(end, (size_t)layers * rows * round_up(cols, ROW_ALIGN));
    *s = section(end, (size_t)layers * rows * ceil_div(cols, sp->gs) * sizeof(float));
}

void q8_layout_spec(const Config *c, const Q8Spec *sp, Q8Layout *L) {
    size_t end = HEADER_BYTES, dim_floats = (size_t)c->n_layers * c->dim * sizeof(float);
    memset(L, 0, sizeof *L);
    mat_sections(&end, 1, c->vocab_size, c->dim, sp, &L->tok_q, &L->tok_s);
    L->rms_att = section(&end, dim_floats);
    L->rms_ffn = section(&end, dim_floats);
    L->rms_final = section(&end, (size_t)c->dim * sizeof(float));
    for (int w = W_Q; w <= W_3; w++) {
        int rows, cols;
        linear_shape(c, w, &rows, &cols);
        mat_sections(&end, c->n_layers, rows, cols, sp, &L->q[w], &L->s[w]);
    }
    if (!sp->shared) mat_sections(&end, 1, c->vocab_size, c->dim, sp, &L->cls_q, &L->cls_s);
    if (sp->version >= 2) {
        L->rope = section(&end, (size_t)c->head_dim / 2 * sizeof(float));
        for (int i = 0; i < 3 && c->qkv_bias; i++)
            L->bias[i] = section(&end, (size_t)c->n_layers * (i == 0 ? q_dim_of(c) : kv_width_of(c)) * sizeof(float));
        L->tokenizer = section(&end, sp->tokenizer_bytes);
    }
    L->total = align_up(end, SECTION_ALIGN);
}

void q8_layout(const Config *c, int gs, int shared, Q8Layout *L) {
    const Q8Spec v1 = {.version = 1, .gs = gs, .shared = shared};
    q8_layout_spec(c, &v1, L);
}

// Header: magic, then int32 fields: version, the 7 of Config, gs, shared, row_align; version 2
// adds head_dim, fp32, qkv_bias, rope_theta (f32), norm_eps (f32), bos, eos, eot, add_bos,
// chat_template, then tokenizer_bytes (u64) at V2_TOKENIZER_AT.
#define V2_TOKENIZER_AT 96
void q8_header_spec(unsigned char hdr[HEADER_BYTES], const Config *c, const Q8Spec *sp) {
    int32_t fields[] = {sp->version, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
                        c->vocab_size, c->seq_len, sp->gs, sp->shared, ROW_ALIGN};
    uint32_t magic = Q8LM_MAGIC;
    memset(hdr, 0, HEADER_BYTES);
    memcpy(hdr, &magic, 4);
    memcpy(hdr + 4, fields, sizeof fields);
    if (sp->version < 2) return;
    int32_t v2[] = {c->head_dim, sp->fp32, c->qkv_bias, 0, 0, sp->bos_id, sp->eos_id, sp->eot_id, sp->add_bos, sp->chat_template};
    memcpy(&v2[3], &c->rope_theta, 4);
    memcpy(&v2[4], &c->norm_eps, 4);
    memcpy(hdr + 48, v2, sizeof v2);
    const uint64_t tok = sp->tokenizer_bytes;
    memcpy(hdr + V2_TOKENIZER_AT, &tok, 8);
}

void q8_header(unsigned char hdr[HEADER_BYTES], const Config *c, int gs, int shared) {
    const Q8Spec v1 = {.version = 1, .gs = gs, .shared = shared};
    q8_header_spec(hdr, c, &v1);
}

// ----------------------------------------------------------------------------
// Quantization

// With SSE4.1 (x86-64-v3 here) GCC inlines roundf exactly; the baseline calls libm per weight,
// which made imports compute-bound (NOTES 37). The comparisons are fmaxf's and fminf's, NaN
// included (a NaN weight is ignored by the maximum and clamps to -127).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
void quantize_row(const float *w, int cols, int gs, int8_t *q, float *s) {
    for (int g = 0; g * gs < cols; g++) {
        int lo = g * gs, hi = lo + gs < cols ? lo + gs : cols;
        float amax = 0.0f;
        for (int j = lo; j < hi; j++) {
            const float a = fabsf(w[j]);
            amax = a > amax ? a : amax;
        }
        float scale = amax / 127.0f;
        s[g] = scale;
        for (int j = lo; j < hi; j++) {
            float v = scale > 0.0f ? roundf(w[j] / scale) : 0.0f;
            v = v > 127.0f ? 127.0f : v;
            v = v >= -127.0f ? v : -127.0f;
            q[j] = (int8_t)v;
        }
    }
}

// ----------------------------------------------------------------------------
// Loading

typedef struct {
    const char *path;
    const unsigned char *base;
    size_t bytes;
    char *err;
} Src;

static int fail(Src *f, const char *msg) {
    snprintf(f->err, ERR_LEN, "%.200s: %.300s", f->path, msg);
    return -1;
}

static int32_t read_i32(const unsigned char *p) { int32_t v; memcpy(&v, p, 4); return v; }

static void read_config(const unsigned char *p, Config *c) {
    c->dim = read_i32(p);
    c->hidden_dim = read_i32(p + 4);
    c->n_layers = read_i32(p + 8);
    c->n_heads = read_i32(p + 12);
    c->n_kv_heads = read_i32(p + 16);
    c->vocab_size = read_i32(p + 20);
    c->seq_len = read_i32(p + 24);
}

static int check_config(Src *f, Config *c) {
    char why[ERR_LEN];
    config_defaults(c);
    if (validate_config(c, why) == 0) return 0;
    return fail(f, why);
}

static int check_size(Src *f, size_t expected, const char *what) {
    if (f->bytes == expected) return 0;
    char msg[ERR_LEN];
    snprintf(msg, sizeof msg, "file is %zu bytes but its header implies %zu (%s)%s", f->bytes, expected, what,
             f->bytes < expected ? ": truncated?" : ": trailing data or wrong header");
    return fail(f, msg);
}

static Mat fp32_mat(const float *p, int rows, int cols) {
    Mat m = {rows, cols, cols, 0, 0, p, NULL, NULL, NULL};
    return m;
}

static Mat q8_mat(const int8_t *q, const float *s, int rows, int cols, int gs) {
    Mat m = {rows, cols, round_up(cols, ROW_ALIGN), gs, ceil_div(cols, gs), NULL, q, s, NULL};
    return m;
}

int alloc_layer_mats(Weights *w, int L) {
    Mat *all = calloc((size_t)7 * L, sizeof(Mat));
    if (!all) return -1;
    Mat **dst[7] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w1, &w->w2, &w->w3};
    for (int i = 0; i < 7; i++) *dst[i] = all + (size_t)i * L;
    return 0;
}

// FP32 linear weights: 7 stacked tensors in llama2.c's order, each (layer, rows, cols).
// v0 interleaves the norms; `order` gives where each tensor lies.
static void point_fp32_linears(Model *m, const float *const at[7]) {
    const Config *c = &m->cfg;
    Mat *dst[7] = {m->w.wq, m->w.wk, m->w.wv, m->w.wo, m->w.w1, m->w.w2, m->w.w3};
    for (int w = 0; w < 7; w++) {
        int rows, cols;
        linear_shape(c, w, &rows, &cols);
        for (int l = 0; l < c->n_layers; l++) dst[w][l] = fp32_mat(at[w] + (size_t)l * rows * cols, rows, cols);
    }
}

size_t fp32_linear_floats(const Config *c, int w) {
    int rows, cols;
    linear_shape(c, w, &rows, &cols);
    return (size_t)c->n_layers * rows * cols;
}

// llama2.c legacy: tok, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq_cis, [wcls]
static int load_v0(Src *f, Model *m) {
    if (f->bytes < 28) return fail(f, "file is shorter than the 28-byte legacy header");
    read_config(f->base, &m->cfg);
    Config *c = &m->cfg;
    m->shared_classifier = c->vocab_size > 0;
    if (c->vocab_size < 0) c->vocab_size = c->vocab_size == INT_MIN ? 0 : -c->vocab_size;   // 0: refused below
    if (check_config(f, c)) return -1;
    size_t Ld = (size_t)c->n_layers * c->dim, vd = (size_t)c->vocab_size * c->dim;
    size_t body = vd + 2 * Ld + c->dim, freq = (size_t)c->seq_len * c->head_dim;
    for (int w = 0; w < 7; w++) body += fp32_linear_floats(c, w);
    size_t with_freq = 28 + 4 * (body + freq + (m->shared_classifier ? 0 : vd));
    // freq_cis tables are optional only where nothing follows them
    if (!(m->shared_classifier && f->bytes == 28 + 4 * body) && check_size(f, with_freq, "legacy v0 FP32 layout"))
        return -1;
    if (alloc_layer_mats(&m->w, m->cfg.n_layers)) return fail(f, "out of memory");
    const float *p = (const float *)(f->base + 28);
    m->w.tok_embedding = fp32_mat(p, c->vocab_size, c->dim);
    p += vd;
    m->w.rms_att = p;
    p += Ld;
    const float *at[7];
    for (int w = 0; w < 7; w++) {
        if (w == W_1) { m->w.rms_ffn = p; p += Ld; }
        at[w] = p;
        p += fp32_linear_floats(c, w);
    }
    m->w.rms_final = p;
    p += c->dim + freq;
    point_fp32_linears(m, at);
    m->w.wcls = m->shared_classifier ? m->w.tok_embedding : fp32_mat(p, c->vocab_size, c->dim);
    return 0;
}

// llama2.c v1: header, rms_att, rms_ffn, rms_final, tok, wq, wk, wv, wo, w1, w2, w3, [wcls]
static int load_v1(Src *f, Model *m) {
    Config *c = &m->cfg;
    m->shared_classifier = f->base[36];
    if (check_config(f, c)) return -1;
    if (m->shared_classifier > 1) return fail(f, "header field shared_classifier is not 0 or 1");
    size_t Ld = (size_t)c->n_layers * c->dim, vd = (size_t)c->vocab_size * c->dim;
    size_t floats = 2 * Ld + c->dim + vd + (m->shared_classifier ? 0 : vd);
    for (int w = 0; w < 7; w++) floats += fp32_linear_floats(c, w);
    if (check_size(f, HEADER_BYTES + 4 * floats, "llama2.c v1 FP32 layout")) return -1;
    if (alloc_layer_mats(&m->w, m->cfg.n_layers)) return fail(f, "out of memory");
    const float *p = (const float *)(f->base + HEADER_BYTES);
    m->w.rms_att = p;
    m->w.rms_ffn = p + Ld;
    m->w.rms_final = p + 2 * Ld;
    p += 2 * Ld + c->dim;
    m->w.tok_embedding = fp32_mat(p, c->vocab_size, c->dim);
    p += vd;
    const float *at[7];
    for (int w = 0; w < 7; w++) { at[w] = p; p += fp32_linear_floats(c, w); }
    point_fp32_linears(m, at);
    m->w.wcls = m->shared_classifier ? m->w.tok_embedding : fp32_mat(p, c->vocab_size, c->dim);
    return 0;
}

// llama2.c v2 stores each (rows, cols) tensor as q (rows*cols int8) then s (rows*cols/gs f32),
// groups running over the flattened tensor. Copies one into this project's padded per-row layout.
static Mat repack_v2(const unsigned char **p, int rows, int cols, int gs, int8_t **q_out, float **s_out) {
    size_t n = (size_t)rows * cols;
    const int8_t *q = (const int8_t *)*p;
    const unsigned char *s = *p + n;
    int stride = round_up(cols, ROW_ALIGN), groups = cols / gs;
    Mat m = q8_mat(*q_out, *s_out, rows, cols, gs);
    for (int r = 0; r < rows; r++) {
        memcpy(*q_out + (size_t)r * stride, q + (size_t)r * cols, cols);
        memcpy(*s_out + (size_t)r * groups, s + (size_t)r * groups * 4, (size_t)groups * 4);
    }
    *q_out += (size_t)rows * stride;
    *s_out += (size_t)rows * groups;
    *p = s + n / gs * 4;
    return m;
}

static int load_v2(Src *f, Model *m) {
    Config *c = &m->cfg;
    m->shared_classifier = f->base[36];
    m->gs = read_i32(f->base + 37);
    m->quantized = 1;
    if (check_config(f, c)) return -1;
    if (m->shared_classifier > 1) return fail(f, "header field shared_classifier is not 0 or 1");
    if (m->gs < 1 || m->gs > (1 << 20)) return fail(f, "header field group_size is not in [1, 2^20]");
    // Shapes of the quantized tensors, in file order: tok, then wq..w3 per layer, [wcls].
    int L = c->n_layers, n_tensors = 1 + 7 * L + !m->shared_classifier;
    size_t bytes = HEADER_BYTES + 4 * ((2 * (size_t)L + 1) * c->dim), q_bytes = 0, s_bytes = 0;
    for (int t = 0; t < n_tensors; t++) {
        int rows = c->vocab_size, cols = c->dim;
        if (t > 0 && t <= 7 * L) linear_shape(c, (t - 1) / L, &rows, &cols);
        if (cols % m->gs) {
            char msg[ERR_LEN];
            snprintf(msg, sizeof msg,
                     "llama2.c v2 groups of %d run over the flattened tensor and straddle rows of length %d; "
                     "this engine needs per-row groups: re-quantize the FP32 checkpoint with ./quantize",
                     m->gs, cols);
            return fail(f, msg);
        }
        size_t n = (size_t)rows * cols;
        bytes += n + n / m->gs * 4;
        q_bytes += (size_t)rows * round_up(cols, ROW_ALIGN);
        s_bytes += n / m->gs * 4;
    }
    if (check_size(f, bytes, "llama2.c v2 INT8 layout")) return -1;
    if (alloc_layer_mats(&m->w, m->cfg.n_layers)) return fail(f, "out of memory");
    if (!(m->owned = malloc(q_bytes + s_bytes))) return fail(f, "out of memory for the repacked weights");
    m->owned_bytes = q_bytes + s_bytes;
    int8_t *q = m->owned;
    float *s = (float *)((unsigned char *)m->owned + q_bytes);   // q_bytes is a multiple of 16
    const float *norms = (const float *)(f->base + HEADER_BYTES);
    m->w.rms_att = norms;
    m->w.rms_ffn = norms + (size_t)L * c->dim;
    m->w.rms_final = norms + 2 * (size_t)L * c->dim;
    const unsigned char *p = (const unsigned char *)(m->w.rms_final + c->dim);
    m->w.tok_embedding = repack_v2(&p, c->vocab_size, c->dim, m->gs, &q, &s);
    Mat *dst[7] = {m->w.wq, m->w.wk, m->w.wv, m->w.wo, m->w.w1, m->w.w2, m->w.w3};
    for (int w = 0; w < 7; w++) {
        int rows, cols;
        linear_shape(c, w, &rows, &cols);
        for (int l = 0; l < L; l++) dst[w][l] = repack_v2(&p, rows, cols, m->gs, &q, &s);
    }
    m->w.wcls = m->shared_classifier ? m->w.tok_embedding : repack_v2(&p, c->vocab_size, c->dim, m->gs, &q, &s);
    return 0;
}

// Version 2's header fields into the config and spec; 0 or -1.
static int read_v2_header(Src *f, Model *m, Q8Spec *sp) {
    const unsigned char *h = f->base;
    Config *c = &m->cfg;
    c->head_dim = read_i32(h + 48);
    sp->fp32 = read_i32(h + 52);
    c->qkv_bias = read_i32(h + 56);
    memcpy(&c->rope_theta, h + 60, 4);
    memcpy(&c->norm_eps, h + 64, 4);
    int *ids[5] = {&m->bos_id, &m->eos_id, &m->eot_id, &m->add_bos, &m->chat_template};
    for (int i = 0; i < 5; i++) *ids[i] = read_i32(h + 68 + 4 * i);
    uint64_t tok;
    memcpy(&tok, h + V2_TOKENIZER_AT, 8);
    if (sp->fp32 != 0 && sp->fp32 != 1) return fail(f, "header field fp32 is not 0 or 1");
    if (c->head_dim < 1) return fail(f, "header field head_dim is not positive");
    for (int i = 0; i < 3; i++)
        if (*ids[i] < -1 || *ids[i] >= c->vocab_size) return fail(f, "header field bos/eos/eot id is outside the vocabulary");
    if (tok > f->bytes) return fail(f, "header field tokenizer_bytes is larger than the file");
    sp->tokenizer_bytes = (size_t)tok;
    sp->bos_id = m->bos_id, sp->eos_id = m->eos_id, sp->eot_id = m->eot_id, sp->add_bos = m->add_bos, sp->chat_template = m->chat_template;
    return 0;
}

// A matrix of a Q8LM file: INT8 (q at q_at, scales at s_at) or FP32 (at q_at).
static Mat q8lm_mat(const unsigned char *b, size_t q_at, size_t s_at, int rows, int cols, const Q8Spec *sp) {
    if (sp->fp32) return fp32_mat((const float *)(b + q_at), rows, cols);
    return q8_mat((const int8_t *)(b + q_at), (const float *)(b + s_at), rows, cols, sp->gs);
}

static void point_q8lm(Model *m, const Q8Layout *L, const Q8Spec *sp) {
    const Config *c = &m->cfg;
    const unsigned char *b = m->map;
    m->w.tok_embedding = q8lm_mat(b, L->tok_q, L->tok_s, c->vocab_size, c->dim, sp);
    m->w.rms_att = (const float *)(b + L->rms_att);
    m->w.rms_ffn = (const float *)(b + L->rms_ffn);
    m->w.rms_final = (const float *)(b + L->rms_final);
    Mat *dst[7] = {m->w.wq, m->w.wk, m->w.wv, m->w.wo, m->w.w1, m->w.w2, m->w.w3};
    for (int w = 0; w < 7; w++) {
        int rows, cols;
        linear_shape(c, w, &rows, &cols);
        const Mat one = q8lm_mat(b, 0, 0, rows, cols, sp);
        const size_t q_layer = sp->fp32 ? (size_t)rows * cols * sizeof(float) : (size_t)rows * one.stride;
        for (int l = 0; l < c->n_layers; l++)
            dst[w][l] = q8lm_mat(b, L->q[w] + l * q_layer, L->s[w] + l * (size_t)rows * one.groups * sizeof(float), rows, cols, sp);
    }
    m->w.wcls = sp->shared ? m->w.tok_embedding : q8lm_mat(b, L->cls_q, L->cls_s, c->vocab_size, c->dim, sp);
    if (sp->version < 2) return;
    m->w.rope_freq = (const float *)(b + L->rope);
    if (c->qkv_bias)
        m->w.bq = (const float *)(b + L->bias[0]), m->w.bk = (const float *)(b + L->bias[1]), m->w.bv = (const float *)(b + L->bias[2]);
    m->tokenizer = sp->tokenizer_bytes ? b + L->tokenizer : NULL;
    m->tokenizer_bytes = sp->tokenizer_bytes;
}

static int load_q8lm(Src *f, Model *m) {
    Config *c = &m->cfg;
    Q8Spec sp = {.version = read_i32(f->base + 4), .gs = read_i32(f->base + 36), .shared = read_i32(f->base + 40)};
    int row_align = read_i32(f->base + 44);
    m->bos_id = BOS, m->eos_id = -1, m->eot_id = -1, m->add_bos = 1, m->chat_template = 0;   // llama2.c's conventions
    if (sp.version != 1 && sp.version != 2) {
        char msg[ERR_LEN];
        snprintf(msg, sizeof msg, "header field version = %d, this engine reads Q8LM versions 1 and 2", sp.version);
        return fail(f, msg);
    }
    if (sp.version == 2 && read_v2_header(f, m, &sp)) return -1;
    if (check_config(f, c)) return -1;
    if (!sp.fp32 && (sp.gs < 1 || sp.gs > (1 << 20))) return fail(f, "header field group_size is not in [1, 2^20]");
    if (sp.shared != 0 && sp.shared != 1) return fail(f, "header field shared_classifier is not 0 or 1");
    if (row_align != ROW_ALIGN) return fail(f, "header field row_align is not 16");
    m->version = sp.version, m->shared_classifier = sp.shared, m->quantized = !sp.fp32, m->gs = sp.fp32 ? 0 : sp.gs;
    Q8Layout L;
    q8_layout_spec(c, &sp, &L);
    if (check_size(f, L.total, "Q8LM layout")) return -1;
    if (alloc_layer_mats(&m->w, m->cfg.n_layers)) return fail(f, "out of memory");
    point_q8lm(m, &L, &sp);
    return 0;
}

// A model as downloaded (GGUF, or a safetensors file: 8 bytes of header length, then its JSON)
// is quantize's input, not run's: say so, rather than read its bytes as a llama2.c header.
static int refuse_download(Src *f) {
    if (f->bytes >= 4 && !memcmp(f->base, GGUF_MAGIC, 4))
        return fail(f, "a GGUF file: convert it first with `quantize FILE.gguf OUT.bin`, then run OUT.bin");
    uint64_t json_bytes = 0;
    if (f->bytes >= 9) memcpy(&json_bytes, f->base, 8);
    if (f->bytes >= 9 && f->base[8] == '{' && json_bytes <= f->bytes - 8)
        return fail(f, "a safetensors file: quantize reads the Hugging Face directory that holds it and its config.json (`quantize DIR OUT.bin`)");
    return 0;
}

static int load_mapped(Src *f, Model *m) {
    if (refuse_download(f)) return -1;
    if (f->bytes < 8) return fail(f, "file is too short to hold any checkpoint header");
    uint32_t magic;
    memcpy(&magic, f->base, 4);
    if (magic == Q8LM_MAGIC || magic == LLAMA2C_MAGIC) {
        if (f->bytes < HEADER_BYTES) return fail(f, "file is shorter than its 256-byte header");
        read_config(f->base + 8, &m->cfg);
    }
    if (magic == Q8LM_MAGIC) { m->format = FMT_Q8LM; return load_q8lm(f, m); }
    if (magic != LLAMA2C_MAGIC) { m->format = FMT_V0; return load_v0(f, m); }
    int version = read_i32(f->base + 4);
    if (version == 1) { m->format = FMT_V1; return load_v1(f, m); }
    if (version == 2) { m->format = FMT_V2; return load_v2(f, m); }
    char msg[ERR_LEN];
    snprintf(msg, sizeof msg, "header field version = %d: llama2.c versions 1 (FP32) and 2 (INT8) are supported", version);
    return fail(f, msg);
}

int load_model_as(const char *path, Model *m, int how, char *err) {
    memset(m, 0, sizeof *m);
    Src f = {path, NULL, 0, err};
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        snprintf(err, ERR_LEN, "%.300s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    int stat_ok = fstat(fd, &st) == 0;
    if (!stat_ok || !S_ISREG(st.st_mode)) {
        close(fd);
        if (stat_ok && S_ISDIR(st.st_mode))
            return fail(&f, "a directory, not a checkpoint: a Hugging Face model is converted first with `quantize DIR OUT.bin`, then run OUT.bin");
        return fail(&f, "not a regular file");
    }
    f.bytes = (size_t)st.st_size;
    // in memory only with room to spare (a quarter of what is available left over); else mapped,
    // where the page cache can hold what fits and drop the rest
    if (how == LOAD_RESIDENT && f.bytes > memory_available() / 4 * 3) how = LOAD_MAPPED;
    if (f.bytes > 0 && how == LOAD_RESIDENT) {
        unsigned char *base = read_resident(fd, f.bytes, &m->region, &m->region_bytes);
        if (!base) {
            char msg[ERR_LEN];
            snprintf(msg, sizeof msg, "cannot read into memory: %s", strerror(errno));
            close(fd);
            return fail(&f, msg);
        }
        m->map = base;
        m->map_bytes = f.bytes;
        f.base = base;
    } else if (f.bytes > 0) {
        void *map = mmap(NULL, f.bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            close(fd);
            return fail(&f, "cannot mmap");
        }
        m->map = m->region = map;
        m->map_bytes = m->region_bytes = f.bytes;
        f.base = map;
    }
    close(fd);
    if (load_mapped(&f, m) != 0) {
        free_model(m);
        return -1;
    }
    return 0;
}

int load_model(const char *path, Model *m, char *err) { return load_model_as(path, m, LOAD_MAPPED, err); }

void free_model(Model *m) {
    if (m->region) munmap(m->region, m->region_bytes);
    free(m->w.wq);   // the block of all per-layer Mats
    free(m->owned);
    memset(m, 0, sizeof *m);
}
