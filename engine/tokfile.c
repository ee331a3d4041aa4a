// tokfile.c: the tokenizer section of a Q8LM v2 checkpoint (layout in tokfile.h): chat formats,
// the writer, the validating reader, and the adapters from Hugging Face directories and GGUF files.
#include "tokfile.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json.h"
#include "model.h"
#include "util.h"

#define HOLE           0xFFFFFFFFu   // a vocabulary hole's length
#define MAX_JSON_BYTES ((size_t)1 << 30)
#define MAX_TEMPLATE   ((size_t)1 << 24)

// ---------------------------------------------------------------- chat formats
static const char *const chat_names[] = {"none", "chatml", "llama3", "llama2", "mistral"};
#define N_CHAT ((int)(sizeof chat_names / sizeof chat_names[0]))

const char *chat_name(int chat) { return chat >= 0 && chat < N_CHAT ? chat_names[chat] : "none"; }

int chat_from_name(const char *name) {
    for (int i = 0; name && i < N_CHAT; i++)
        if (!strcmp(name, chat_names[i])) return i;
    return -1;
}

int chat_from_template(const char *jinja) {
    if (!jinja) return CHAT_NONE;
    if (strstr(jinja, "<|im_start|>")) return CHAT_CHATML;
    if (strstr(jinja, "<|start_header_id|>")) return CHAT_LLAMA3;
    if (strstr(jinja, "[INST]")) return strstr(jinja, "<<SYS>>") ? CHAT_LLAMA2 : CHAT_MISTRAL;
    return CHAT_NONE;
}

// The literal after "<|im_start|>system" + newline at p (q the quote before it), up to
// "<|im_end|>", unescaped; NULL where the stretch is not one string literal.
static char *system_literal(const char *p, char q) {
    const char *end = strstr(p, "<|im_end|>");
    if (!end) return NULL;
    char *out = xcalloc((size_t)(end - p) + 1, 1), *o = out;
    for (; p < end; p++) {
        if (*p == q) break;   // the string closes: an expression, not a literal
        if (*p != '\\') {
            *o++ = *p;
            continue;
        }
        if (++p == end) break;
        *o++ = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p == 'r' ? '\r' : *p;
    }
    if (p < end) free(out), out = NULL;
    return out;
}

char *chat_default_system(const char *jinja) {
    static const char tag[] = "<|im_start|>system";
    for (const char *p = jinja ? strstr(jinja, tag) : NULL; p; p = strstr(p + 1, tag)) {
        if (p == jinja || (p[-1] != '\'' && p[-1] != '"')) continue;
        const char *after = p + strlen(tag);
        int nl = after[0] == '\n' ? 1 : after[0] == '\\' && after[1] == 'n' ? 2 : 0;
        char *s = nl ? system_literal(after + nl, p[-1]) : NULL;
        if (s) return s;
    }
    return NULL;
}

// ---------------------------------------------------------------- writer
typedef struct {
    unsigned char *p;
    size_t n, cap;
} Buf;

static void put(Buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p) fprintf(stderr, "out of memory (%zu bytes)\n", cap), exit(1);
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_u32(Buf *b, uint32_t v) {
    unsigned char le[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
    put(b, le, 4);
}

static void put_str(Buf *b, BpeStr s) {
    put_u32(b, (uint32_t)s.len);
    put(b, s.s, (size_t)s.len);
}

unsigned char *tokfile_write(const BpeSpec *sp, int chat, const char *sys, size_t *n_bytes) {
    Buf b = {0};
    put(&b, TOKFILE_MAGIC, 4);
    put_u32(&b, TOKFILE_VERSION);
    put_u32(&b, (uint32_t)chat);
    put_u32(&b, sys != NULL);
    if (sys) put_str(&b, (BpeStr){sys, (int)strlen(sys)});
    put_u32(&b, sp->byte_fallback != 0), put_u32(&b, sp->ignore_merges != 0), put_u32(&b, sp->fuse_unk != 0);
    put_u32(&b, (uint32_t)sp->unk_id);
    put_u32(&b, (uint32_t)sp->n_vocab);
    for (int i = 0; i < sp->n_vocab; i++)
        if (sp->vocab[i].s) put_str(&b, sp->vocab[i]);
        else put_u32(&b, HOLE);
    put_u32(&b, (uint32_t)sp->n_merges);
    for (int i = 0; i < 2 * sp->n_merges; i++) put_str(&b, sp->merges[i]);
    put_u32(&b, sp->scores != NULL);
    for (int i = 0; sp->scores && i < sp->n_vocab; i++) {
        uint32_t bits;
        memcpy(&bits, &sp->scores[i], 4);
        put_u32(&b, bits);
    }
    put_u32(&b, (uint32_t)sp->n_added);
    for (int i = 0; i < sp->n_added; i++) {
        const BpeAdded *a = &sp->added[i];
        put_u32(&b, (uint32_t)a->id);
        put_u32(&b, (a->special != 0) | (a->lstrip != 0) << 1 | (a->rstrip != 0) << 2 | (a->normalized != 0) << 3 | (a->single_word != 0) << 4);
        put_str(&b, a->content);
    }
    put_u32(&b, (uint32_t)sp->n_norm);
    for (int i = 0; i < sp->n_norm; i++) put_u32(&b, sp->norm[i].type), put_str(&b, sp->norm[i].a), put_str(&b, sp->norm[i].b);
    put_u32(&b, (uint32_t)sp->n_pre);
    for (int i = 0; i < sp->n_pre; i++) {
        const BpePre *p = &sp->pre[i];
        put_u32(&b, p->type), put_u32(&b, p->pattern), put_u32(&b, p->individual != 0);
        put_u32(&b, p->add_prefix_space != 0), put_u32(&b, p->use_regex != 0), put_str(&b, p->replacement);
        put_u32(&b, p->prepend), put_u32(&b, p->split != 0);
    }
    put_u32(&b, (uint32_t)sp->n_dec);
    for (int i = 0; i < sp->n_dec; i++) {
        const BpeDec *d = &sp->dec[i];
        put_u32(&b, d->type), put_str(&b, d->a), put_str(&b, d->b), put_u32(&b, (uint32_t)d->start), put_u32(&b, d->drop_first != 0);
    }
    put_u32(&b, (uint32_t)sp->n_prefix);
    for (int i = 0; i < sp->n_prefix; i++) put_u32(&b, (uint32_t)sp->prefix[i]);
    put_u32(&b, (uint32_t)sp->n_suffix);
    for (int i = 0; i < sp->n_suffix; i++) put_u32(&b, (uint32_t)sp->suffix[i]);
    *n_bytes = b.n;
    return b.p;
}

// ---------------------------------------------------------------- reader
// Reads walk the bytes; the first fault is kept in what (a field name) and every later read gives 0.
typedef struct {
    const unsigned char *p;
    size_t n, at;
    const char *what;      // the field that did not fit, or NULL
    const char *why;       // "runs past the end", "is out of range", ...
} Rd;

static int fault(Rd *r, const char *what, const char *why) {
    if (!r->what) r->what = what, r->why = why;
    return 0;
}

static uint32_t get_u32(Rd *r, const char *what) {
    if (r->what) return 0;
    if (r->n - r->at < 4) return fault(r, what, "runs past the end");
    const unsigned char *q = r->p + r->at;
    r->at += 4;
    return (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
}

static int get_flag(Rd *r, const char *what) {
    uint32_t v = get_u32(r, what);
    return v <= 1 ? (int)v : fault(r, what, "is not 0 or 1");
}

// An id: -1 (none) or in [0, BPE_MAX_TOKENS); bpe_build checks it against the vocabulary.
static int get_id(Rd *r, const char *what) {
    int32_t v = (int32_t)get_u32(r, what);
    return v >= -1 && v < BPE_MAX_TOKENS ? v : fault(r, what, "is out of range");
}

// A string pointing into the bytes; hole_ok: len HOLE is {NULL, 0}.
static BpeStr get_str(Rd *r, const char *what, int hole_ok) {
    uint32_t len = get_u32(r, what);
    if (r->what) return (BpeStr){NULL, 0};
    if (len == HOLE && hole_ok) return (BpeStr){NULL, 0};
    if (len > BPE_MAX_PIECE) return fault(r, what, "length is out of range"), (BpeStr){NULL, 0};
    if (r->n - r->at < len) return fault(r, what, "runs past the end"), (BpeStr){NULL, 0};
    BpeStr s = {(const char *)r->p + r->at, (int)len};
    r->at += len;
    return s;
}

// A count of items each at least min_bytes long, bounded by what is left and by max.
static int get_count(Rd *r, const char *what, uint32_t max, size_t min_bytes) {
    uint32_t n = get_u32(r, what);
    if (r->what) return 0;
    if (n > max || (size_t)n * min_bytes > r->n - r->at) return fault(r, what, "is too large for the section");
    return (int)n;
}

static void get_steps(Rd *r, BpeSpec *sp) {
    sp->n_norm = get_count(r, "normalizer step count", BPE_MAX_STEPS, 12);
    for (int i = 0; i < sp->n_norm; i++) {
        sp->norm[i].type = (BpeNormType)get_u32(r, "normalizer type");
        sp->norm[i].a = get_str(r, "normalizer string", 0), sp->norm[i].b = get_str(r, "normalizer string", 0);
    }
    sp->n_pre = get_count(r, "pre-tokenizer step count", BPE_MAX_STEPS, 32);
    for (int i = 0; i < sp->n_pre; i++) {
        BpePre *p = &sp->pre[i];
        p->type = (BpePreType)get_u32(r, "pre-tokenizer type"), p->pattern = (BpePattern)get_u32(r, "pre-tokenizer pattern");
        p->individual = get_flag(r, "pre-tokenizer flag"), p->add_prefix_space = get_flag(r, "pre-tokenizer flag");
        p->use_regex = get_flag(r, "pre-tokenizer flag"), p->replacement = get_str(r, "pre-tokenizer string", 0);
        p->prepend = (BpePrependScheme)get_u32(r, "pre-tokenizer prepend scheme"), p->split = get_flag(r, "pre-tokenizer flag");
        if (p->prepend > BPE_PREPEND_ALWAYS) fault(r, "pre-tokenizer prepend scheme", "is out of range");
    }
    sp->n_dec = get_count(r, "decoder step count", BPE_MAX_STEPS, 20);
    for (int i = 0; i < sp->n_dec; i++) {
        BpeDec *d = &sp->dec[i];
        d->type = (BpeDecType)get_u32(r, "decoder type");
        d->a = get_str(r, "decoder string", 0), d->b = get_str(r, "decoder string", 0);
        int32_t start = (int32_t)get_u32(r, "decoder strip count");
        d->start = start >= 0 && start <= BPE_MAX_PIECE ? start : fault(r, "decoder strip count", "is out of range");
        d->drop_first = get_flag(r, "decoder flag");
    }
    sp->n_prefix = get_count(r, "post-processor prefix count", BPE_MAX_AFFIX, 4);
    for (int i = 0; i < sp->n_prefix; i++) sp->prefix[i] = get_id(r, "post-processor id");
    sp->n_suffix = get_count(r, "post-processor suffix count", BPE_MAX_AFFIX, 4);
    for (int i = 0; i < sp->n_suffix; i++) sp->suffix[i] = get_id(r, "post-processor id");
}

// The spec's arrays (allocated) and scalars; strings point into r's bytes.
static void get_spec(Rd *r, BpeSpec *sp) {
    sp->byte_fallback = get_flag(r, "byte_fallback"), sp->ignore_merges = get_flag(r, "ignore_merges");
    sp->fuse_unk = get_flag(r, "fuse_unk"), sp->unk_id = get_id(r, "unk_id");
    sp->n_vocab = get_count(r, "vocabulary size", BPE_MAX_TOKENS, 4);
    BpeStr *vocab = xcalloc(sp->n_vocab ? sp->n_vocab : 1, sizeof(BpeStr));
    for (int i = 0; i < sp->n_vocab; i++) vocab[i] = get_str(r, "vocabulary token", 1);
    sp->vocab = vocab;
    sp->n_merges = get_count(r, "merge count", BPE_MAX_TOKENS * 8u, 8);   // 8: two strings of a u32 length
    BpeStr *merges = xcalloc(2 * (size_t)sp->n_merges + 1, sizeof(BpeStr));
    for (int i = 0; i < 2 * sp->n_merges; i++) merges[i] = get_str(r, "merge", 0);
    sp->merges = merges;
    if (get_flag(r, "has_scores")) {
        if ((size_t)sp->n_vocab * 4 > r->n - r->at) fault(r, "scores", "run past the end");
        float *scores = xcalloc(sp->n_vocab ? sp->n_vocab : 1, sizeof(float));
        for (int i = 0; i < sp->n_vocab; i++) {
            uint32_t bits = get_u32(r, "scores");
            memcpy(&scores[i], &bits, 4);
        }
        sp->scores = scores;
    }
    sp->n_added = get_count(r, "added token count", BPE_MAX_TOKENS, 12);
    BpeAdded *added = xcalloc(sp->n_added ? sp->n_added : 1, sizeof(BpeAdded));
    for (int i = 0; i < sp->n_added; i++) {
        added[i].id = get_id(r, "added token id");
        uint32_t f = get_u32(r, "added token flags");
        if (f > 31) fault(r, "added token flags", "are out of range");
        added[i].special = f & 1, added[i].lstrip = f >> 1 & 1, added[i].rstrip = f >> 2 & 1;
        added[i].normalized = f >> 3 & 1, added[i].single_word = f >> 4 & 1;
        added[i].content = get_str(r, "added token", 0);
    }
    sp->added = added;
    get_steps(r, sp);
}

static void free_spec(BpeSpec *sp) {
    free((void *)sp->vocab), free((void *)sp->merges), free((void *)sp->scores), free((void *)sp->added);
}

// Control characters (a token's text quoted by bpe_build) as '?': messages stay one line.
static void one_line(char *err) {
    for (unsigned char *p = (unsigned char *)err; *p; p++)
        if (*p < 0x20 || *p == 0x7f) *p = '?';
}

int tokfile_load(const unsigned char *bytes, size_t n_bytes, TokFile *t, char *err) {
    memset(t, 0, sizeof *t);
    if (!bytes || n_bytes < 8 || memcmp(bytes, TOKFILE_MAGIC, 4)) {
        snprintf(err, ERR_LEN, "tokenizer section: no \"%s\" magic (%zu bytes)", TOKFILE_MAGIC, n_bytes);
        return -1;
    }
    Rd r = {.p = bytes, .n = n_bytes, .at = 4};
    uint32_t version = get_u32(&r, "version");
    if (version != TOKFILE_VERSION) {
        snprintf(err, ERR_LEN, "tokenizer section: version %u, this engine reads version %d", version, TOKFILE_VERSION);
        return -1;
    }
    uint32_t chat = get_u32(&r, "chat format");
    if (chat >= N_CHAT) fault(&r, "chat format", "is not one this engine knows");
    BpeStr sys = {NULL, 0};
    if (get_flag(&r, "has_system")) sys = get_str(&r, "default system prompt", 0);
    BpeSpec sp = {0};
    get_spec(&r, &sp);
    if (!r.what && r.at != r.n) fault(&r, "the section", "has bytes after its end");
    char why[ERR_LEN];
    if (r.what) snprintf(err, ERR_LEN, "tokenizer section: %s %s (at byte %zu of %zu)", r.what, r.why, r.at, r.n);
    else if (!(t->bpe = bpe_build(&sp, why))) snprintf(err, ERR_LEN, "tokenizer section: %.480s", why);
    free_spec(&sp);
    if (!t->bpe) return one_line(err), -1;
    t->chat = (int)chat;
    if (sys.s) {
        t->default_system = xcalloc((size_t)sys.len + 1, 1);
        memcpy(t->default_system, sys.s, (size_t)sys.len);
    }
    return 0;
}

void tokfile_free(TokFile *t) {
    bpe_free(t->bpe);
    free(t->default_system);
    memset(t, 0, sizeof *t);
}

// ---------------------------------------------------------------- from a source: shared
// The header's ids and the section, once the spec is built.
static int finish(const BpeSpec *sp, const char *jinja, TokInfo *info, unsigned char **bytes, size_t *n_bytes,
                  const char *path, char *err) {
    char why[ERR_LEN];
    Bpe *b = bpe_build(sp, why);
    if (!b) return snprintf(err, ERR_LEN, "%.250s: tokenizer: %.240s", path, why), one_line(err), -1;
    const int n = bpe_n_tokens(b);
    info->chat = chat_from_template(jinja);
    if (info->eot_id < 0) {   // a GGUF's own eot_token_id comes first
        const char *tag = info->chat == CHAT_CHATML ? "<|im_end|>" : info->chat == CHAT_LLAMA3 ? "<|eot_id|>" : NULL;
        info->eot_id = tag ? bpe_find(b, tag, strlen(tag)) : -1;
    }
    if (info->eot_id < 0) info->eot_id = info->eos_id;
    info->add_bos = sp->n_prefix > 0 && info->bos_id >= 0 && sp->prefix[0] == info->bos_id;
    bpe_free(b);
    const int ids[3] = {info->bos_id, info->eos_id, info->eot_id};
    static const char *const names[3] = {"bos", "eos", "eot"};
    for (int i = 0; i < 3; i++)
        if (ids[i] < -1 || ids[i] >= n) return snprintf(err, ERR_LEN, "%.300s: %s token id %d is not a token (%d)", path, names[i], ids[i], n), -1;
    char *sys = info->chat == CHAT_CHATML ? chat_default_system(jinja) : NULL;
    *bytes = tokfile_write(sp, info->chat, sys, n_bytes);
    free(sys);
    return 0;
}

// ---------------------------------------------------------------- from a Hugging Face directory
// A JSON file beside the model: 0 with doc->root NULL when the file is absent (and not required).
static int load_json(const char *dir, const char *name, int required, Json *doc, char *err) {
    char path[1200], why[ERR_LEN];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    memset(doc, 0, sizeof *doc);
    if (!required && access(path, F_OK) != 0) return 0;
    size_t n;
    char *text = read_file(path, MAX_JSON_BYTES, &n, err);
    if (!text) return -1;
    int rc = json_parse(text, n, doc, why);
    free(text);
    if (rc) snprintf(err, ERR_LEN, "%.300s: %.200s", path, why);
    return rc;
}

// A special token as tokenizer_config.json writes it ("<s>" or {"content": "<s>", ...}): its id, or -1.
static int special_id(const Bpe *b, const JsonValue *v) {
    if (v && v->type == JSON_OBJECT) v = json_get(v, "content");
    return v && v->type == JSON_STRING ? bpe_find(b, v->str, (size_t)v->n) : -1;
}

// generation_config.json's bos/eos_token_id: an int, or a list's first; -1 otherwise.
static int config_id(const JsonValue *v) {
    if (v && v->type == JSON_ARRAY) v = v->n ? &v->items[0] : NULL;
    return v && json_is_int(v, 0, BPE_MAX_TOKENS - 1) ? (int)v->number : -1;
}

// The chat template: tokenizer_config.json's (a string, or the "default" of a list of
// {name, template}), else chat_template.jinja; allocated, or NULL.
static char *hf_template(const char *dir, const JsonValue *cfg, char *err, int *bad) {
    const JsonValue *t = json_get(cfg, "chat_template"), *list = t && t->type == JSON_ARRAY ? t : NULL;
    for (int i = 0; list && i < list->n; i++) {
        const JsonValue *name = json_get(&list->items[i], "name");
        if (name && name->type == JSON_STRING && !strcmp(name->str, "default")) t = json_get(&list->items[i], "template");
    }
    if (t && t->type == JSON_STRING) return strdup(t->str);
    char path[1200];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (access(path, F_OK) != 0) return NULL;
    size_t n;
    char *text = read_file(path, MAX_TEMPLATE, &n, err);
    *bad = text == NULL;
    return text;
}

static int from_hf(const Source *s, unsigned char **bytes, size_t *n_bytes, TokInfo *info, char *err) {
    Json tok, cfg, gen;
    BpeSpec sp;
    char why[ERR_LEN], path[1200];
    snprintf(path, sizeof path, "%s/tokenizer.json", s->path);
    if (load_json(s->path, "tokenizer.json", 1, &tok, err)) return -1;
    if (bpe_spec_from_json(tok.root, &sp, why)) {
        snprintf(err, ERR_LEN, "%.300s: %.200s", path, why);
        return json_free(&tok), -1;
    }
    int rc = -1, bad = 0;
    char *jinja = NULL;
    Bpe *b = bpe_build(&sp, why);
    if (!b) snprintf(err, ERR_LEN, "%.300s: %.200s", path, why), one_line(err);
    else if (load_json(s->path, "tokenizer_config.json", 0, &cfg, err) == 0) {
        if (load_json(s->path, "generation_config.json", 0, &gen, err) == 0) {
            info->bos_id = special_id(b, json_get(cfg.root, "bos_token"));
            info->eos_id = special_id(b, json_get(cfg.root, "eos_token"));
            if (info->bos_id < 0) info->bos_id = config_id(json_get(gen.root, "bos_token_id"));
            if (info->eos_id < 0) info->eos_id = config_id(json_get(gen.root, "eos_token_id"));
            jinja = hf_template(s->path, cfg.root, err, &bad);
            if (!bad) rc = finish(&sp, jinja, info, bytes, n_bytes, path, err);
            json_free(&gen);
        }
        json_free(&cfg);
    }
    free(jinja);
    bpe_free(b);
    bpe_spec_free(&sp);
    json_free(&tok);
    return rc;
}

// ---------------------------------------------------------------- from a GGUF file
typedef struct {
    BpeSpec sp;
    BpeStr *vocab, *merges;
    BpeAdded *added;
    float *scores;
    char *jinja;
} GgufTok;

static void gguf_tok_free(GgufTok *g) {
    free(g->vocab), free(g->merges), free(g->added), free(g->scores), free(g->jinja);
}

static int gerr(const Source *s, char *err, const char *what) {
    snprintf(err, ERR_LEN, "%.250s: %.250s", s->path, what);
    return -1;
}

// A NUL-terminated copy of a string key into out (cap bytes), "" when absent.
static void gguf_cstr(const Gguf *g, const char *key, char *out, size_t cap) {
    GgufStr v = {NULL, 0};
    gguf_get_str(g, key, &v);
    snprintf(out, cap, "%.*s", v.len < cap ? (int)v.len : (int)cap - 1, v.s ? v.s : "");
}

static int gguf_id(const Gguf *g, const char *key) {
    uint32_t v;
    return gguf_get_u32(g, key, &v) == 0 && v < BPE_MAX_TOKENS ? (int)v : -1;
}

static int gguf_flag(const Gguf *g, const char *key, int dflt) {
    int v;
    return gguf_get_bool(g, key, &v) == 0 ? v : dflt;
}

static int gguf_strings(const Source *s, const char *key, const GgufStr **out, uint64_t *n, char *err) {
    int type;
    const void *at;
    if (gguf_get_array(&s->gguf, key, &type, n, &at)) return *n = 0, 1;   // absent
    if (type != GGUF_TYPE_STRING || *n > BPE_MAX_TOKENS) return snprintf(err, ERR_LEN, "%.300s: %s is not an array of at most %d strings", s->path, key, BPE_MAX_TOKENS), -1;
    *out = at;
    return 0;
}

static int gguf_vocab(const Source *s, GgufTok *t, char *err) {
    const GgufStr *tok = NULL, *mer = NULL;
    uint64_t n, nm;
    int rc = gguf_strings(s, "tokenizer.ggml.tokens", &tok, &n, err);
    if (rc) return rc < 0 ? -1 : gerr(s, err, "no tokenizer.ggml.tokens");
    if ((rc = gguf_strings(s, "tokenizer.ggml.merges", &mer, &nm, err)) < 0) return -1;
    t->vocab = xcalloc(n ? n : 1, sizeof(BpeStr)), t->merges = xcalloc(2 * nm + 1, sizeof(BpeStr));
    for (uint64_t i = 0; i < n; i++) {
        if (tok[i].len > BPE_MAX_PIECE) return gerr(s, err, "a tokenizer.ggml.tokens string is too long");
        t->vocab[i] = (BpeStr){tok[i].s, (int)tok[i].len};
    }
    for (uint64_t i = 0; i < nm; i++) {   // "left right", cut at the first space after the first byte
        const char *sp = mer[i].len > 1 ? memchr(mer[i].s + 1, ' ', mer[i].len - 1) : NULL;
        if (!sp || mer[i].len > 2 * BPE_MAX_PIECE) return gerr(s, err, "a tokenizer.ggml.merges string is not \"left right\"");
        t->merges[2 * i] = (BpeStr){mer[i].s, (int)(sp - mer[i].s)};
        t->merges[2 * i + 1] = (BpeStr){sp + 1, (int)(mer[i].len - (uint64_t)(sp - mer[i].s) - 1)};
    }
    t->sp.vocab = t->vocab, t->sp.n_vocab = (int)n, t->sp.merges = t->merges, t->sp.n_merges = (int)nm;
    return 0;
}

// token_type 3 (CONTROL) and 4 (USER_DEFINED) are added tokens; scores for a "llama" vocabulary without merges.
static int gguf_added_scores(const Source *s, GgufTok *t, int llama, char *err) {
    const int n = t->sp.n_vocab;
    const GgufKV *kv = gguf_kv(&s->gguf, "tokenizer.ggml.token_type");
    if (kv && (kv->type != GGUF_TYPE_ARRAY || kv->n != (uint64_t)n)) return gerr(s, err, "tokenizer.ggml.token_type is not one integer per token");
    t->added = xcalloc(n ? n : 1, sizeof(BpeAdded));
    for (int i = 0; kv && i < n; i++) {
        int64_t type;
        if (gguf_kv_int(kv, (uint64_t)i, &type)) return gerr(s, err, "tokenizer.ggml.token_type is not one integer per token");
        if (type == 3 || type == 4) t->added[t->sp.n_added++] = (BpeAdded){.id = i, .content = t->vocab[i], .special = type == 3};
    }
    t->sp.added = t->added;
    kv = gguf_kv(&s->gguf, "tokenizer.ggml.scores");
    if (!llama || t->sp.n_merges || !kv) return 0;
    if (kv->type != GGUF_TYPE_ARRAY || kv->n != (uint64_t)n) return gerr(s, err, "tokenizer.ggml.scores is not one number per token");
    t->scores = xcalloc(n ? n : 1, sizeof(float));
    for (int i = 0; i < n; i++) {
        double v;
        if (gguf_kv_float(kv, (uint64_t)i, &v) || !isfinite(v)) return gerr(s, err, "tokenizer.ggml.scores is not one finite number per token");
        t->scores[i] = (float)v;
    }
    t->sp.scores = t->scores;
    return 0;
}

// llama.cpp's pre-tokenizers that set ignore_merges (llama-vocab.cpp: the Llama 3 family).
static int gguf_ignores_merges(const char *pre) {
    static const char *const names[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(pre, names[i])) return 1;
    return 0;
}

static int from_gguf(const Source *s, unsigned char **bytes, size_t *n_bytes, TokInfo *info, char *err) {
    const Gguf *g = &s->gguf;
    GgufTok t = {0};
    char model[64], pre[64], why[ERR_LEN];
    gguf_cstr(g, "tokenizer.ggml.model", model, sizeof model);
    gguf_cstr(g, "tokenizer.ggml.pre", pre, sizeof pre);
    const int llama = !strcmp(model, "llama");
    int rc = -1;
    if (gguf_vocab(s, &t, err) || gguf_added_scores(s, &t, llama, err)) goto done;
    if (bpe_spec_gguf_pipeline(&t.sp, model, pre[0] ? pre : NULL, gguf_flag(g, "tokenizer.ggml.add_space_prefix", 1), why)) {
        gerr(s, err, why);
        goto done;
    }
    t.sp.byte_fallback = t.sp.fuse_unk = llama;
    t.sp.ignore_merges = gguf_ignores_merges(pre);
    t.sp.unk_id = gguf_id(g, "tokenizer.ggml.unknown_token_id");
    info->bos_id = gguf_id(g, "tokenizer.ggml.bos_token_id");
    info->eos_id = gguf_id(g, "tokenizer.ggml.eos_token_id");
    info->eot_id = gguf_id(g, "tokenizer.ggml.eot_token_id");
    if (gguf_flag(g, "tokenizer.ggml.add_bos_token", llama) && info->bos_id >= 0) t.sp.prefix[t.sp.n_prefix++] = info->bos_id;
    if (gguf_flag(g, "tokenizer.ggml.add_eos_token", 0) && info->eos_id >= 0) t.sp.suffix[t.sp.n_suffix++] = info->eos_id;
    GgufStr tmpl = {NULL, 0};
    if (gguf_get_str(g, "tokenizer.chat_template", &tmpl) == 0 && tmpl.len < MAX_TEMPLATE) {
        t.jinja = xcalloc(tmpl.len + 1, 1);
        memcpy(t.jinja, tmpl.s, tmpl.len);
    }
    rc = finish(&t.sp, t.jinja, info, bytes, n_bytes, s->path, err);
done:
    gguf_tok_free(&t);
    return rc;
}

int tokfile_from_source(const Source *s, unsigned char **bytes, size_t *n_bytes, TokInfo *info, char *err) {
    *bytes = NULL, *n_bytes = 0;
    *info = (TokInfo){.bos_id = -1, .eos_id = -1, .eot_id = -1};
    return s->is_gguf ? from_gguf(s, bytes, n_bytes, info, err) : from_hf(s, bytes, n_bytes, info, err);
}
