// import.c: Hugging Face directories and GGUF files as Sources (import.h). The config is read
// and checked first, then every tensor the config implies is looked up and its dtype and shape
// checked, so that a bad model is refused with one line before quantize writes anything.
#include "import.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "json.h"
#include "util.h"

#define CONFIG_MAX_BYTES (1 << 22)

static const char *const role_names[] = {"embedding", "wq", "wk", "wv", "wo", "w1", "w2", "w3",
                                         "attention norm", "feed-forward norm", "final norm", "classifier",
                                         "q bias", "k bias", "v bias"};
const char *role_name(Role r) { return role_names[r]; }

static int per_layer(Role r) { return r != R_EMBED && r != R_NORM_FINAL && r != R_CLS; }
static int is_vector(Role r) { return r >= R_NORM_ATT && r != R_CLS; }

void role_shape(const Config *c, Role r, int *rows, int *cols) {
    if (r >= R_WQ && r <= R_W3) return linear_shape(c, r - R_WQ + W_Q, rows, cols);
    *rows = 1;
    switch (r) {
    case R_EMBED: case R_CLS: *rows = c->vocab_size, *cols = c->dim; return;
    case R_BQ: *cols = q_dim_of(c); return;
    case R_BK: case R_BV: *cols = kv_width_of(c); return;
    default: *cols = c->dim; return;   // the norms
    }
}

// printf into err as "path: ..."
static int failf(const Source *s, char *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int failf(const Source *s, char *err, const char *fmt, ...) {
    char msg[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(err, ERR_LEN, "%.200s: %.300s", s->path, msg);
    return -1;
}

// ----------------------------------------------------------------------------
// Tensor names

static const char *const hf_names[] = {
    "model.embed_tokens.weight", "model.layers.%d.self_attn.q_proj.weight", "model.layers.%d.self_attn.k_proj.weight",
    "model.layers.%d.self_attn.v_proj.weight", "model.layers.%d.self_attn.o_proj.weight", "model.layers.%d.mlp.gate_proj.weight",
    "model.layers.%d.mlp.down_proj.weight", "model.layers.%d.mlp.up_proj.weight", "model.layers.%d.input_layernorm.weight",
    "model.layers.%d.post_attention_layernorm.weight", "model.norm.weight", "lm_head.weight",
    "model.layers.%d.self_attn.q_proj.bias", "model.layers.%d.self_attn.k_proj.bias", "model.layers.%d.self_attn.v_proj.bias",
};
static const char *const gguf_names[] = {
    "token_embd.weight", "blk.%d.attn_q.weight", "blk.%d.attn_k.weight", "blk.%d.attn_v.weight", "blk.%d.attn_output.weight",
    "blk.%d.ffn_gate.weight", "blk.%d.ffn_down.weight", "blk.%d.ffn_up.weight", "blk.%d.attn_norm.weight",
    "blk.%d.ffn_norm.weight", "output_norm.weight", "output.weight", "blk.%d.attn_q.bias", "blk.%d.attn_k.bias",
    "blk.%d.attn_v.bias",
};

static void tensor_name(const Source *s, Role r, int layer, char name[128]) {
    const char *fmt = s->is_gguf ? gguf_names[r] : hf_names[r];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    if (per_layer(r)) snprintf(name, 128, fmt, layer);
    else snprintf(name, 128, "%s", fmt);
#pragma GCC diagnostic pop
}

// ----------------------------------------------------------------------------
// RoPE order: engine row e of head h, e = h*hd + 2i + p, is Hugging Face's row h*hd + i + p*hd/2.

static int rotate_half_row(const Config *c, int e) {
    const int hd = c->head_dim, h = e / hd, j = e % hd;
    return h * hd + j / 2 + (j % 2) * (hd / 2);
}
static int reordered(const Source *s, Role r) {
    return s->neox_rope && (r == R_WQ || r == R_WK || r == R_BQ || r == R_BK);
}

// ----------------------------------------------------------------------------
// Hugging Face: config.json

typedef struct {
    const Source *s;
    const JsonValue *root;
    char *err;
    const char *file;
} ConfigReader;

static int cfg_fail(ConfigReader *cr, const char *key, const char *what) {
    return failf(cr->s, cr->err, "%s: %s %s", cr->file, key, what);
}

// An integer field in [lo, hi]; `fallback` where absent or null (-1: required).
static int cfg_int(ConfigReader *cr, const JsonValue *obj, const char *key, long lo, long hi, long fallback, int *out) {
    const JsonValue *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) {
        if (fallback < 0) return cfg_fail(cr, key, "is missing");
        *out = (int)fallback;
        return 0;
    }
    if (!json_is_int(v, lo, hi)) {
        char what[96];
        snprintf(what, sizeof what, "is not an integer in [%ld, %ld]", lo, hi);
        return cfg_fail(cr, key, what);
    }
    *out = (int)v->number;
    return 0;
}

static int cfg_float(ConfigReader *cr, const JsonValue *obj, const char *key, double fallback, float *out) {
    const JsonValue *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) {
        if (fallback < 0) return cfg_fail(cr, key, "is missing");
        *out = (float)fallback;
        return 0;
    }
    if (v->type != JSON_NUMBER || !isfinite(v->number) || !isfinite((float)v->number)) return cfg_fail(cr, key, "is not a finite number");
    *out = (float)v->number;
    return 0;
}

static int cfg_bool(const JsonValue *obj, const char *key, int fallback) {
    const JsonValue *v = json_get(obj, key);
    return v && v->type == JSON_TRUE ? 1 : v && v->type == JSON_FALSE ? 0 : fallback;
}

// rope_scaling (transformers 4) or rope_parameters (transformers 5): none, "default" or "llama3".
static int cfg_rope(ConfigReader *cr, Config *c) {
    const JsonValue *params = json_get(cr->root, "rope_parameters"), *scaling = json_get(cr->root, "rope_scaling");
    if (params && params->type != JSON_OBJECT && params->type != JSON_NULL) return cfg_fail(cr, "rope_parameters", "is not an object");
    if (scaling && scaling->type != JSON_OBJECT && scaling->type != JSON_NULL) return cfg_fail(cr, "rope_scaling", "is not an object");
    const JsonValue *theta_in = params && params->type == JSON_OBJECT && json_get(params, "rope_theta") ? params : cr->root;
    if (cfg_float(cr, theta_in, "rope_theta", 10000.0, &c->rope_theta)) return -1;
    const JsonValue *sc = scaling && scaling->type == JSON_OBJECT ? scaling : params && params->type == JSON_OBJECT ? params : NULL;
    if (!sc) return 0;
    const JsonValue *type = json_get(sc, "rope_type");
    if (!type) type = json_get(sc, "type");
    if (!type || type->type != JSON_STRING || !strcmp(type->str, "default")) return 0;
    if (strcmp(type->str, "llama3")) {
        char what[160];
        snprintf(what, sizeof what, "type \"%.40s\" is not supported (none, \"default\" and \"llama3\" are)", type->str);
        return cfg_fail(cr, sc == scaling ? "rope_scaling" : "rope_parameters", what);
    }
    RopeScaling *r = &c->rope_scaling;
    r->type = ROPE_LLAMA3;
    if (cfg_float(cr, sc, "factor", -1, &r->factor) || cfg_float(cr, sc, "low_freq_factor", -1, &r->low_freq_factor) ||
        cfg_float(cr, sc, "high_freq_factor", -1, &r->high_freq_factor) ||
        cfg_int(cr, sc, "original_max_position_embeddings", 1, 1 << 24, -1, &r->original_context))
        return -1;
    return 0;
}

// What this engine does not compute: refused by name.
static int cfg_unsupported(ConfigReader *cr, const Config *c) {
    const JsonValue *act = json_get(cr->root, "hidden_act");
    if (act && (act->type != JSON_STRING || strcmp(act->str, "silu"))) return cfg_fail(cr, "hidden_act", "is not \"silu\"");
    if (cfg_bool(cr->root, "attention_bias", 0) && strcmp(cr->s->arch, "Qwen2ForCausalLM"))
        return cfg_fail(cr, "attention_bias", "is true: biases on q, k, v and o are not supported");
    if (cfg_bool(cr->root, "mlp_bias", 0)) return cfg_fail(cr, "mlp_bias", "is true: feed-forward biases are not supported");
    const JsonValue *window = json_get(cr->root, "sliding_window");
    int sliding = !strcmp(cr->s->arch, "Qwen2ForCausalLM") ? cfg_bool(cr->root, "use_sliding_window", 0) : 1;
    if (sliding && window && window->type != JSON_NULL && !json_is_int(window, c->seq_len, 1L << 40)) {
        char what[160];
        snprintf(what, sizeof what, "is shorter than the context (max_position_embeddings %d): sliding-window attention is not supported",
                 c->seq_len);
        return cfg_fail(cr, "sliding_window", what);
    }
    return 0;
}

static int hf_architecture(ConfigReader *cr, Source *s) {
    static const char *const known[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"};
    const JsonValue *a = json_get(cr->root, "architectures");
    if (!a || a->type != JSON_ARRAY || a->n != 1 || a->items[0].type != JSON_STRING)
        return cfg_fail(cr, "architectures", "is not a list of one name");
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(a->items[0].str, known[i])) {
            snprintf(s->arch, sizeof s->arch, "%s", known[i]);
            return 0;
        }
    char what[200];
    snprintf(what, sizeof what, "names \"%.60s\": supported are LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM",
             a->items[0].str);
    return cfg_fail(cr, "architectures", what);
}

static int hf_config_fields(ConfigReader *cr, Source *s) {
    Config *c = &s->cfg;
    const JsonValue *r = cr->root;
    if (hf_architecture(cr, s) || cfg_int(cr, r, "hidden_size", 2, 1 << 16, -1, &c->dim) ||
        cfg_int(cr, r, "intermediate_size", 1, 1 << 18, -1, &c->hidden_dim) ||
        cfg_int(cr, r, "num_hidden_layers", 1, 1024, -1, &c->n_layers) ||
        cfg_int(cr, r, "num_attention_heads", 1, 4096, -1, &c->n_heads) ||
        cfg_int(cr, r, "vocab_size", 3, 1 << 22, -1, &c->vocab_size) ||
        cfg_int(cr, r, "max_position_embeddings", 1, 1 << 30, -1, &c->seq_len))
        return -1;
    if (cfg_int(cr, r, "num_key_value_heads", 1, 4096, c->n_heads, &c->n_kv_heads) ||
        cfg_int(cr, r, "head_dim", 2, 1024, 0, &c->head_dim) || cfg_float(cr, r, "rms_norm_eps", 1e-6, &c->norm_eps) ||
        cfg_rope(cr, c))
        return -1;
    if (c->seq_len > (1 << 20)) c->seq_len = 1 << 20;   // positions past this are never run here
    c->qkv_bias = !strcmp(s->arch, "Qwen2ForCausalLM");
    s->neox_rope = 1;
    return cfg_unsupported(cr, c);
}

static int hf_config(Source *s, char *err) {
    char file[1100], why[ERR_LEN];
    snprintf(file, sizeof file, "%s/config.json", s->path);
    size_t bytes;
    char *text = read_file(file, CONFIG_MAX_BYTES, &bytes, why);
    if (!text) return failf(s, err, "config.json: %s", why);
    Json doc;
    if (json_parse(text, bytes, &doc, why)) {
        free(text);
        return failf(s, err, "config.json: %s", why);
    }
    ConfigReader cr = {s, doc.root, err, "config.json"};
    int rc = doc.root->type == JSON_OBJECT ? hf_config_fields(&cr, s) : cfg_fail(&cr, "the document", "is not an object");
    s->shared_classifier = cfg_bool(doc.root, "tie_word_embeddings", 0);
    json_free(&doc);
    free(text);
    return rc;
}

// ----------------------------------------------------------------------------
// GGUF: metadata

static int gguf_u32(const Source *s, const char *key, uint32_t lo, uint32_t hi, long fallback, int *out, char *err) {
    uint32_t v;
    if (!gguf_kv(&s->gguf, key)) {
        if (fallback < 0) return failf(s, err, "metadata %s is missing", key);
        *out = (int)fallback;
        return 0;
    }
    if (gguf_get_u32(&s->gguf, key, &v) || v < lo || v > hi)
        return failf(s, err, "metadata %s is not an integer in [%u, %u]", key, lo, hi);
    *out = (int)v;
    return 0;
}

static int gguf_f32(const Source *s, const char *key, float fallback, float *out, char *err) {
    if (!gguf_kv(&s->gguf, key)) {
        *out = fallback;
        return 0;
    }
    if (gguf_get_f32(&s->gguf, key, out) || !isfinite(*out)) return failf(s, err, "metadata %s is not a finite float", key);
    return 0;
}

static int gguf_config(Source *s, char *err) {
    Config *c = &s->cfg;
    GgufStr arch;
    if (gguf_get_str(&s->gguf, "general.architecture", &arch)) return failf(s, err, "metadata general.architecture is missing");
    if (!(arch.len == 5 && !memcmp(arch.s, "llama", 5)) && !(arch.len == 5 && !memcmp(arch.s, "qwen2", 5)))
        return failf(s, err, "metadata general.architecture is \"%.*s\": supported are llama and qwen2", (int)(arch.len < 40 ? arch.len : 40), arch.s);
    memcpy(s->arch, arch.s, 5);
    char k[160];
#define KEY(name) (snprintf(k, sizeof k, "%.8s.%s", s->arch, name), k)
    if (gguf_u32(s, KEY("embedding_length"), 2, 1 << 16, -1, &c->dim, err) ||
        gguf_u32(s, KEY("feed_forward_length"), 1, 1 << 18, -1, &c->hidden_dim, err) ||
        gguf_u32(s, KEY("block_count"), 1, 1024, -1, &c->n_layers, err) ||
        gguf_u32(s, KEY("attention.head_count"), 1, 4096, -1, &c->n_heads, err) ||
        gguf_u32(s, KEY("attention.head_count_kv"), 1, 4096, c->n_heads, &c->n_kv_heads, err) ||
        gguf_u32(s, KEY("context_length"), 1, 1u << 30, -1, &c->seq_len, err) ||
        gguf_u32(s, KEY("attention.key_length"), 2, 1024, 0, &c->head_dim, err) ||
        gguf_f32(s, KEY("attention.layer_norm_rms_epsilon"), 1e-5f, &c->norm_eps, err) ||
        gguf_f32(s, KEY("rope.freq_base"), 10000.0f, &c->rope_theta, err))
        return -1;
    GgufStr scaling;
    if (!gguf_get_str(&s->gguf, KEY("rope.scaling.type"), &scaling) && !(scaling.len == 4 && !memcmp(scaling.s, "none", 4)))
        return failf(s, err, "metadata %s is \"%.*s\": RoPE scaling other than llama3's frequency table is not supported", k,
                     (int)(scaling.len < 40 ? scaling.len : 40), scaling.s);
#undef KEY
    if (c->seq_len > (1 << 20)) c->seq_len = 1 << 20;
    const GgufTensor *embd = gguf_tensor(&s->gguf, "token_embd.weight");
    if (!embd || embd->n_dims != 2 || embd->ne[1] < 3 || embd->ne[1] > (1 << 22))
        return failf(s, err, "tensor token_embd.weight is missing or not (vocab, dim)");
    c->vocab_size = (int)embd->ne[1];
    c->qkv_bias = !strcmp(s->arch, "qwen2");
    s->neox_rope = !strcmp(s->arch, "qwen2");   // llama.cpp's converter reordered llama's rows already
    s->shared_classifier = gguf_tensor(&s->gguf, "output.weight") == NULL;
    return 0;
}

// ----------------------------------------------------------------------------
// Tensors: every one the config implies, of a readable type and the config's shape.

static int check_tensor(const Source *s, Role r, int layer, char *err) {
    char name[128];
    tensor_name(s, r, layer, name);
    int rows, cols;
    role_shape(&s->cfg, r, &rows, &cols);
    long long want[2] = {rows, cols}, got[2];
    int dims;
    if (s->is_gguf) {
        const GgufTensor *t = gguf_tensor(&s->gguf, name);
        if (!t) return failf(s, err, "tensor %s is missing", name);
        dims = t->n_dims, got[0] = t->ne[dims > 1 ? 1 : 0], got[1] = t->ne[0];
        if (dims == 1) got[0] = 1;
    } else {
        const StTensor *t = st_find(&s->st, name);
        if (!t) return failf(s, err, "tensor %s is missing", name);
        if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16)
            return failf(s, err, "tensor %s: dtype %s (supported: F32, F16, BF16)", name, st_dtype_name(t->dtype));
        dims = t->n_dims, got[0] = dims == 2 ? t->shape[0] : 1, got[1] = dims >= 1 && dims <= 2 ? t->shape[dims - 1] : 0;
    }
    if (dims != (is_vector(r) ? 1 : 2) || got[0] != want[0] || got[1] != want[1])
        return failf(s, err, "tensor %s: shape (%lld, %lld) in %d dimensions disagrees with the config, which implies (%lld, %lld)",
                     name, got[0], got[1], dims, want[0], want[1]);
    return 0;
}

static int check_tensors(Source *s, char *err) {
    for (Role r = R_EMBED; r <= R_BV; r++) {
        if ((r == R_CLS && s->shared_classifier) || (r >= R_BQ && !s->cfg.qkv_bias)) continue;
        for (int l = 0; l < (per_layer(r) ? s->cfg.n_layers : 1); l++)
            if (check_tensor(s, r, l, err)) return -1;
    }
    return 0;
}

// RoPE frequencies: from the config; a GGUF's rope_freqs tensor (llama.cpp's form of Llama 3.1's
// scaling) divides each.
static int rope_table(Source *s, char *err) {
    const int half = s->cfg.head_dim / 2;
    s->rope_freq = xcalloc(half, sizeof(float));
    rope_frequencies(&s->cfg, s->rope_freq);
    const GgufTensor *t = s->is_gguf ? gguf_tensor(&s->gguf, "rope_freqs.weight") : NULL;
    if (!t) return 0;
    float *factors = xcalloc(t->ne[0] > 0 ? t->ne[0] : 1, sizeof(float));
    int bad = t->n_dims != 1 || t->ne[0] != half || gguf_read_row(t, 0, factors, err);
    for (int i = 0; i < half && !bad; i++) bad = !(factors[i] > 0 && isfinite(factors[i]));
    for (int i = 0; i < half && !bad; i++) s->rope_freq[i] /= factors[i];
    free(factors);
    return bad ? failf(s, err, "tensor rope_freqs.weight is not %d positive factors", half) : 0;
}

// ----------------------------------------------------------------------------

static int open_as(Source *s, char *err) {
    struct stat st;
    if (stat(s->path, &st) != 0) return failf(s, err, "cannot open: %s", strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        char why[ERR_LEN];
        if (hf_config(s, err)) return -1;
        if (st_open(&s->st, s->path, why)) return snprintf(err, ERR_LEN, "%s", why), -1;
        if (s->shared_classifier == 0 && !st_find(&s->st, hf_names[R_CLS])) s->shared_classifier = 1;   // tied, not saved
        return 0;
    }
    s->is_gguf = 1;
    if (gguf_open(&s->gguf, s->path, err)) return -1;
    return gguf_config(s, err);
}

int source_open(Source *s, const char *path, char *err) {
    memset(s, 0, sizeof *s);
    if (copy_string(s->path, sizeof s->path, path))   // never a truncated path: it could name another file
        return snprintf(err, ERR_LEN, "%.200s...: the path is longer than %zu bytes", path, sizeof s->path - 1), -1;
    char why[ERR_LEN];
    int rc = open_as(s, err);
    if (!rc) {
        config_defaults(&s->cfg);
        if (validate_config(&s->cfg, why)) rc = failf(s, err, "%s", why);
    }
    if (!rc) rc = check_tensors(s, err);
    if (!rc) rc = rope_table(s, err);
    if (rc) source_close(s);
    return rc;
}

void source_close(Source *s) {
    st_close(&s->st);
    gguf_close(&s->gguf);
    free(s->rope_freq);
    s->rope_freq = NULL;
}

// ----------------------------------------------------------------------------
// Rows

int source_row(const Source *s, Role r, int layer, int row, float *out, char *err) {
    char name[128];
    tensor_name(s, r, layer, name);
    int rows, cols;
    role_shape(&s->cfg, r, &rows, &cols);
    const int src_row = reordered(s, r) && !is_vector(r) ? rotate_half_row(&s->cfg, row) : row;
    if (s->is_gguf) {
        if (gguf_read_row(gguf_tensor(&s->gguf, name), src_row, out, err)) return -1;
    } else if (st_read_floats(st_find(&s->st, name), (size_t)src_row * cols, cols, out, err)) {
        return -1;
    }
    if (reordered(s, r) && is_vector(r)) {   // a bias: its elements are the rows
        float *copy = xcalloc(cols, sizeof(float));
        memcpy(copy, out, cols * sizeof(float));
        for (int e = 0; e < cols; e++) out[e] = copy[rotate_half_row(&s->cfg, e)];
        free(copy);
    }
    return 0;
}

int source_row_q8_0(const Source *s, Role r, int layer, int row, float *scales, int8_t *q, char *err) {
    if (!source_is_q8_0(s, r, layer)) return 0;
    char name[128];
    tensor_name(s, r, layer, name);
    const GgufTensor *t = gguf_tensor(&s->gguf, name);
    const int src_row = reordered(s, r) ? rotate_half_row(&s->cfg, row) : row;
    return gguf_read_row_q8_0(t, src_row, scales, q, err) ? -1 : 1;
}

int source_is_q8_0(const Source *s, Role r, int layer) {
    if (!s->is_gguf || is_vector(r)) return 0;
    char name[128];
    tensor_name(s, r, layer, name);
    const GgufTensor *t = gguf_tensor(&s->gguf, name);
    return t && t->type == GGML_TYPE_Q8_0;
}

size_t source_bytes(const Source *s) {
    size_t bytes = 0;
    if (s->is_gguf)
        for (uint64_t i = 0; i < s->gguf.n_tensors; i++) bytes += s->gguf.tensors[i].bytes;
    else
        for (int i = 0; i < s->st.n; i++) bytes += s->st.tensors[i].bytes;
    return bytes;
}
