// tokenizer_json.c: Hugging Face's tokenizer.json -> BpeSpec (bpe.h). Each component is read
// as the file declares it; a type or option this engine does not implement is refused with its
// name, never guessed at. Read: model (BPE: vocab, merges as "a b" or ["a", "b"], byte_fallback,
// ignore_merges, unk_token, fuse_unk), added_tokens, normalizer (Sequence, NFC, Prepend,
// Replace), pre_tokenizer (Sequence, Split with a known regex, ByteLevel, Digits, Metaspace),
// post_processor (TemplateProcessing, ByteLevel, Roberta/BertProcessing, Sequence) and decoder
// (Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace). truncation and padding
// are ignored: they shape batches, not the ids of one text (transformers turns them off too).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "json.h"
#include "model.h"   // ERR_LEN
#include "util.h"

#define MAX_JSON_BYTES ((size_t)1 << 30)

// The Split regexes this engine has scanners for, by their exact text.
static const struct {
    const char *regex;
    BpePattern pattern;
} known_patterns[] = {
    {"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", BPE_PAT_GPT2},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     BPE_PAT_LLAMA3},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     BPE_PAT_QWEN2},
    {"\\p{N}", BPE_PAT_DIGIT},
    {"\\p{N}{1,3}", BPE_PAT_DIGITS3},
};

static int fail(char *err, const char *what, const char *detail) {
    snprintf(err, ERR_LEN, "%.200s: %.280s", what, detail);
    return -1;
}

static BpeStr str_of(const JsonValue *v) { return (BpeStr){v->str, v->n}; }
static int is_str(const JsonValue *v) { return v && v->type == JSON_STRING; }
static int is_obj(const JsonValue *v) { return v && v->type == JSON_OBJECT; }
static int is_arr(const JsonValue *v) { return v && v->type == JSON_ARRAY; }
static int is_null(const JsonValue *v) { return !v || v->type == JSON_NULL; }

static int str_eq(const JsonValue *v, const char *s) { return is_str(v) && (size_t)v->n == strlen(s) && memcmp(v->str, s, v->n) == 0; }

static const char *type_of(const JsonValue *obj) {
    const JsonValue *t = json_get(obj, "type");
    return is_str(t) ? t->str : "(no type)";
}

// A boolean field: def when absent or null; -1 when it is something else.
static int get_bool(const JsonValue *obj, const char *key, int def) {
    const JsonValue *v = json_get(obj, key);
    if (is_null(v)) return def;
    return v->type == JSON_TRUE ? 1 : v->type == JSON_FALSE ? 0 : -1;
}

static int bool_field(const JsonValue *obj, const char *key, int def, int *out, const char *where, char *err) {
    *out = get_bool(obj, key, def);
    if (*out < 0) {
        char what[128];
        snprintf(what, sizeof what, "%s.%s", where, key);
        return fail(err, what, "is not true or false");
    }
    return 0;
}

// ---------------------------------------------------------------- model
// The id of key in the vocab object (a linear scan: once, for unk_token), or -1.
static int vocab_lookup(const JsonValue *vocab, const JsonValue *key) {
    for (int i = 0; i < vocab->n; i++)
        if (vocab->key_len[i] == key->n && memcmp(vocab->keys[i], key->str, key->n) == 0) return (int)vocab->items[i].number;
    return -1;
}

static int read_vocab(const JsonValue *vocab, BpeSpec *sp, char *err) {
    if (!is_obj(vocab)) return fail(err, "model.vocab", "is not an object of token -> id");
    int n = 0;
    for (int i = 0; i < vocab->n; i++) {
        if (!json_is_int(&vocab->items[i], 0, BPE_MAX_TOKENS - 1)) {
            snprintf(err, ERR_LEN, "model.vocab: \"%.60s\": the id is not an integer in [0, %d)", vocab->keys[i], BPE_MAX_TOKENS);
            return -1;
        }
        if ((int)vocab->items[i].number >= n) n = (int)vocab->items[i].number + 1;
    }
    BpeStr *v = xcalloc(n ? n : 1, sizeof(BpeStr));
    sp->vocab = v, sp->n_vocab = n;
    for (int i = 0; i < vocab->n; i++) {
        int id = (int)vocab->items[i].number;
        if (v[id].s) {
            snprintf(err, ERR_LEN, "model.vocab: id %d is given to \"%.60s\" and to \"%.60s\"", id, v[id].s, vocab->keys[i]);
            return -1;
        }
        v[id] = (BpeStr){vocab->keys[i], vocab->key_len[i]};
    }
    return 0;
}

// One merge: "left right" (one space) or ["left", "right"].
static int read_merge(const JsonValue *m, BpeStr *out, int i, char *err) {
    if (is_arr(m) && m->n == 2 && is_str(&m->items[0]) && is_str(&m->items[1])) {
        out[0] = str_of(&m->items[0]), out[1] = str_of(&m->items[1]);
        return 0;
    }
    const char *space = is_str(m) ? memchr(m->str, ' ', m->n) : NULL;
    if (space && !memchr(space + 1, ' ', m->n - (space + 1 - m->str))) {
        out[0] = (BpeStr){m->str, (int)(space - m->str)};
        out[1] = (BpeStr){space + 1, (int)(m->n - (space + 1 - m->str))};
        return 0;
    }
    snprintf(err, ERR_LEN, "model.merges[%d]: neither \"left right\" with one space nor [\"left\", \"right\"]", i);
    return -1;
}

static int read_merges(const JsonValue *merges, BpeSpec *sp, char *err) {
    if (!is_arr(merges)) return fail(err, "model.merges", "is not an array");
    BpeStr *m = xcalloc(2 * (size_t)merges->n + 1, sizeof(BpeStr));
    sp->merges = m, sp->n_merges = merges->n;
    for (int i = 0; i < merges->n; i++)
        if (read_merge(&merges->items[i], m + 2 * i, i, err)) return -1;
    return 0;
}

// An optional string option that must be absent, null or "" (what this engine implements).
static int must_be_empty(const JsonValue *model, const char *key, char *err) {
    const JsonValue *v = json_get(model, key);
    if (is_null(v) || (is_str(v) && v->n == 0)) return 0;
    char what[64];
    snprintf(what, sizeof what, "model.%s", key);
    return fail(err, what, "is set: not supported");
}

static int read_model(const JsonValue *model, BpeSpec *sp, char *err) {
    if (!is_obj(model)) return fail(err, "model", "is missing or not an object");
    const JsonValue *type = json_get(model, "type"), *dropout = json_get(model, "dropout"), *unk = json_get(model, "unk_token");
    if (type && !str_eq(type, "BPE")) return fail(err, "model.type", "is not BPE: only BPE models are supported");
    if (!is_null(dropout) && !(dropout->type == JSON_NUMBER && dropout->number == 0))
        return fail(err, "model.dropout", "is set: BPE dropout makes encoding random, not supported");
    if (must_be_empty(model, "continuing_subword_prefix", err) || must_be_empty(model, "end_of_word_suffix", err)) return -1;
    if (read_vocab(json_get(model, "vocab"), sp, err) || read_merges(json_get(model, "merges"), sp, err)) return -1;
    if (bool_field(model, "byte_fallback", 0, &sp->byte_fallback, "model", err) ||
        bool_field(model, "ignore_merges", 0, &sp->ignore_merges, "model", err) ||
        bool_field(model, "fuse_unk", 0, &sp->fuse_unk, "model", err))
        return -1;
    if (!is_null(unk) && !is_str(unk)) return fail(err, "model.unk_token", "is not a string");
    sp->unk_id = is_str(unk) ? vocab_lookup(json_get(model, "vocab"), unk) : -1;
    return 0;
}

// ---------------------------------------------------------------- added tokens
static int read_added(const JsonValue *added, BpeSpec *sp, char *err) {
    if (is_null(added)) return 0;
    if (!is_arr(added)) return fail(err, "added_tokens", "is not an array");
    BpeAdded *a = xcalloc(added->n ? added->n : 1, sizeof(BpeAdded));
    sp->added = a, sp->n_added = added->n;
    for (int i = 0; i < added->n; i++) {
        const JsonValue *t = &added->items[i], *id = json_get(t, "id"), *content = json_get(t, "content");
        char what[64];
        snprintf(what, sizeof what, "added_tokens[%d]", i);
        if (!json_is_int(id, 0, BPE_MAX_TOKENS - 1) || !is_str(content) || content->n == 0)
            return fail(err, what, "needs an id in range and a non-empty content");
        a[i].id = (int)id->number, a[i].content = str_of(content);
        if (bool_field(t, "special", 0, &a[i].special, what, err) || bool_field(t, "lstrip", 0, &a[i].lstrip, what, err) ||
            bool_field(t, "rstrip", 0, &a[i].rstrip, what, err) || bool_field(t, "normalized", !a[i].special, &a[i].normalized, what, err) ||
            bool_field(t, "single_word", 0, &a[i].single_word, what, err))
            return -1;
    }
    return 0;
}

// ---------------------------------------------------------------- pipeline components
// A Replace's or Split's pattern: {"String": s} (or {"Regex": r} where regex_ok), in *out.
static int read_pattern(const JsonValue *obj, const char *where, const JsonValue **out, int *is_regex, char *err) {
    const JsonValue *p = json_get(obj, "pattern"), *s = json_get(p, "String"), *r = json_get(p, "Regex");
    *out = is_str(s) ? s : r;
    *is_regex = !is_str(s);
    if (!is_str(*out)) return fail(err, where, "pattern is neither {\"String\": ...} nor {\"Regex\": ...}");
    return 0;
}

static int add_norm(BpeSpec *sp, BpeNorm n, char *err) {
    if (sp->n_norm == BPE_MAX_STEPS) return fail(err, "normalizer", "has too many steps");
    sp->norm[sp->n_norm++] = n;
    return 0;
}

static int read_normalizer(const JsonValue *n, BpeSpec *sp, int depth, char *err) {
    if (is_null(n)) return 0;
    const char *type = type_of(n);
    if (depth > 4) return fail(err, "normalizer", "Sequences nested too deep");
    if (!strcmp(type, "Sequence")) {
        const JsonValue *list = json_get(n, "normalizers");
        if (!is_arr(list)) return fail(err, "normalizer", "Sequence without a normalizers array");
        for (int i = 0; i < list->n; i++)
            if (read_normalizer(&list->items[i], sp, depth + 1, err)) return -1;
        return 0;
    }
    if (!strcmp(type, "NFC")) return add_norm(sp, (BpeNorm){BPE_NORM_NFC, {"", 0}, {"", 0}}, err);
    if (!strcmp(type, "Prepend")) {
        const JsonValue *p = json_get(n, "prepend");
        if (!is_str(p)) return fail(err, "normalizer", "Prepend without a prepend string");
        return add_norm(sp, (BpeNorm){BPE_NORM_PREPEND, str_of(p), {"", 0}}, err);
    }
    if (!strcmp(type, "Replace")) {
        const JsonValue *pat, *content = json_get(n, "content");
        int regex;
        if (read_pattern(n, "normalizer: Replace", &pat, &regex, err)) return -1;
        if (regex || !is_str(content) || pat->n == 0) return fail(err, "normalizer", "Replace: only a non-empty String pattern and a content string are supported");
        return add_norm(sp, (BpeNorm){BPE_NORM_REPLACE, str_of(pat), str_of(content)}, err);
    }
    char msg[160];
    snprintf(msg, sizeof msg, "type %.60s is not supported", type);
    return fail(err, "normalizer", msg);
}

static int add_pre(BpeSpec *sp, BpePre p, char *err) {
    if (sp->n_pre == BPE_MAX_STEPS) return fail(err, "pre_tokenizer", "has too many steps");
    if (sp->n_pre && sp->pre[sp->n_pre - 1].type == BPE_PRE_BYTE_LEVEL) return fail(err, "pre_tokenizer", "a step after ByteLevel is not supported");
    sp->pre[sp->n_pre++] = p;
    return 0;
}

static int read_split(const JsonValue *p, BpeSpec *sp, char *err) {
    const JsonValue *pat;
    int regex, invert;
    if (read_pattern(p, "pre_tokenizer: Split", &pat, &regex, err) || bool_field(p, "invert", 0, &invert, "pre_tokenizer.Split", err)) return -1;
    if (!str_eq(json_get(p, "behavior"), "Isolated") || invert)
        return fail(err, "pre_tokenizer", "Split: only behavior Isolated without invert is supported");
    for (size_t i = 0; regex && i < sizeof known_patterns / sizeof known_patterns[0]; i++)
        if (str_eq(pat, known_patterns[i].regex)) return add_pre(sp, (BpePre){.type = BPE_PRE_SPLIT, .pattern = known_patterns[i].pattern}, err);
    snprintf(err, ERR_LEN, "pre_tokenizer: Split pattern \"%.60s\"%s is not one this engine has a scanner for", pat->str, pat->n > 60 ? "..." : "");
    return -1;
}

// Metaspace's prepend_scheme, or the older add_prefix_space (true: always).
static int read_prepend(const JsonValue *m, const char *where, BpePrependScheme *out, char *err) {
    const JsonValue *scheme = json_get(m, "prepend_scheme");
    int add;
    if (is_null(scheme)) {
        if (bool_field(m, "add_prefix_space", 1, &add, where, err)) return -1;
        *out = add ? BPE_PREPEND_ALWAYS : BPE_PREPEND_NEVER;
        return 0;
    }
    if (str_eq(scheme, "always")) *out = BPE_PREPEND_ALWAYS;
    else if (str_eq(scheme, "first")) *out = BPE_PREPEND_FIRST;
    else if (str_eq(scheme, "never")) *out = BPE_PREPEND_NEVER;
    else return fail(err, where, "prepend_scheme is not always, first or never");
    return 0;
}

static int read_metaspace(const JsonValue *p, BpeSpec *sp, char *err) {
    BpePre m = {.type = BPE_PRE_METASPACE};
    const JsonValue *r = json_get(p, "replacement");
    if (!is_str(r) || r->n == 0) return fail(err, "pre_tokenizer", "Metaspace without a replacement");
    m.replacement = str_of(r);
    if (read_prepend(p, "pre_tokenizer.Metaspace", &m.prepend, err) || bool_field(p, "split", 1, &m.split, "pre_tokenizer.Metaspace", err)) return -1;
    return add_pre(sp, m, err);
}

static int read_pre(const JsonValue *p, BpeSpec *sp, int depth, char *err) {
    if (is_null(p)) return 0;
    const char *type = type_of(p);
    if (depth > 4) return fail(err, "pre_tokenizer", "Sequences nested too deep");
    if (!strcmp(type, "Sequence")) {
        const JsonValue *list = json_get(p, "pretokenizers");
        if (!is_arr(list)) return fail(err, "pre_tokenizer", "Sequence without a pretokenizers array");
        for (int i = 0; i < list->n; i++)
            if (read_pre(&list->items[i], sp, depth + 1, err)) return -1;
        return 0;
    }
    if (!strcmp(type, "Split")) return read_split(p, sp, err);
    if (!strcmp(type, "Metaspace")) return read_metaspace(p, sp, err);
    BpePre s = {0};
    if (!strcmp(type, "ByteLevel")) {
        s.type = BPE_PRE_BYTE_LEVEL;
        if (bool_field(p, "add_prefix_space", 1, &s.add_prefix_space, "pre_tokenizer.ByteLevel", err) ||
            bool_field(p, "use_regex", 1, &s.use_regex, "pre_tokenizer.ByteLevel", err))
            return -1;
        return add_pre(sp, s, err);
    }
    if (!strcmp(type, "Digits")) {
        s.type = BPE_PRE_DIGITS;
        if (bool_field(p, "individual_digits", 0, &s.individual, "pre_tokenizer.Digits", err)) return -1;
        return add_pre(sp, s, err);
    }
    char msg[160];
    snprintf(msg, sizeof msg, "type %.60s is not supported", type);
    return fail(err, "pre_tokenizer", msg);
}

static int add_dec(BpeSpec *sp, BpeDec d, char *err) {
    if (sp->n_dec == BPE_MAX_STEPS) return fail(err, "decoder", "has too many steps");
    sp->dec[sp->n_dec++] = d;
    return 0;
}

static int read_strip(const JsonValue *d, BpeSpec *sp, char *err) {
    const JsonValue *content = json_get(d, "content"), *start = json_get(d, "start"), *stop = json_get(d, "stop");
    if (!is_str(content) || content->n == 0 || !json_is_int(start, 0, 64) || !json_is_int(stop, 0, 0))
        return fail(err, "decoder", "Strip: needs a content character, start in [0, 64] and stop 0 (stripping the end is not supported)");
    return add_dec(sp, (BpeDec){.type = BPE_DEC_STRIP, .a = str_of(content), .start = (int)start->number}, err);
}

static int read_decoder(const JsonValue *d, BpeSpec *sp, int depth, char *err) {
    if (is_null(d)) return 0;
    const char *type = type_of(d);
    if (depth > 4) return fail(err, "decoder", "Sequences nested too deep");
    if (!strcmp(type, "Sequence")) {
        const JsonValue *list = json_get(d, "decoders");
        if (!is_arr(list)) return fail(err, "decoder", "Sequence without a decoders array");
        for (int i = 0; i < list->n; i++)
            if (read_decoder(&list->items[i], sp, depth + 1, err)) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return add_dec(sp, (BpeDec){.type = BPE_DEC_BYTE_LEVEL}, err);
    if (!strcmp(type, "ByteFallback")) return add_dec(sp, (BpeDec){.type = BPE_DEC_BYTE_FALLBACK}, err);
    if (!strcmp(type, "Fuse")) return add_dec(sp, (BpeDec){.type = BPE_DEC_FUSE}, err);
    if (!strcmp(type, "Strip")) return read_strip(d, sp, err);
    if (!strcmp(type, "Replace")) {
        const JsonValue *pat, *content = json_get(d, "content");
        int regex;
        if (read_pattern(d, "decoder: Replace", &pat, &regex, err)) return -1;
        if (regex || !is_str(content) || pat->n == 0) return fail(err, "decoder", "Replace: only a non-empty String pattern and a content string are supported");
        return add_dec(sp, (BpeDec){.type = BPE_DEC_REPLACE, .a = str_of(pat), .b = str_of(content)}, err);
    }
    if (!strcmp(type, "Metaspace")) {
        const JsonValue *r = json_get(d, "replacement");
        BpePrependScheme scheme;
        if (!is_str(r) || r->n == 0) return fail(err, "decoder", "Metaspace without a replacement");
        if (read_prepend(d, "decoder.Metaspace", &scheme, err)) return -1;
        return add_dec(sp, (BpeDec){.type = BPE_DEC_METASPACE, .a = str_of(r), .drop_first = scheme != BPE_PREPEND_NEVER}, err);
    }
    char msg[160];
    snprintf(msg, sizeof msg, "type %.60s is not supported", type);
    return fail(err, "decoder", msg);
}

// ---------------------------------------------------------------- post-processor
static int add_affix(BpeSpec *sp, int after, int id, char *err) {
    int *n = after ? &sp->n_suffix : &sp->n_prefix;
    if (*n == BPE_MAX_AFFIX) return fail(err, "post_processor", "adds too many tokens");
    (after ? sp->suffix : sp->prefix)[(*n)++] = id;
    return 0;
}

// TemplateProcessing's single template: special tokens before the sequence $A are the prefix,
// those after it the suffix; each names an entry of special_tokens, whose ids it adds.
static int read_template(const JsonValue *p, BpeSpec *sp, char *err) {
    const JsonValue *single = json_get(p, "single"), *specials = json_get(p, "special_tokens");
    if (!is_arr(single)) return fail(err, "post_processor", "TemplateProcessing without a single template");
    int after = 0;
    for (int i = 0; i < single->n; i++) {
        const JsonValue *item = &single->items[i], *tok = json_get(item, "SpecialToken");
        if (is_obj(json_get(item, "Sequence"))) {
            if (after) return fail(err, "post_processor", "TemplateProcessing: the single template has two sequences");
            after = 1;
            continue;
        }
        const JsonValue *name = json_get(tok, "id"), *entry = NULL;
        for (int k = 0; is_str(name) && is_obj(specials) && k < specials->n; k++)
            if (specials->key_len[k] == name->n && memcmp(specials->keys[k], name->str, name->n) == 0) entry = &specials->items[k];
        const JsonValue *ids = json_get(entry, "ids");
        if (!is_arr(ids)) return fail(err, "post_processor", "TemplateProcessing: a special token of the template has no ids in special_tokens");
        for (int k = 0; k < ids->n; k++) {
            if (!json_is_int(&ids->items[k], 0, BPE_MAX_TOKENS - 1)) return fail(err, "post_processor", "TemplateProcessing: an id out of range");
            if (add_affix(sp, after, (int)ids->items[k].number, err)) return -1;
        }
    }
    return 0;
}

// Roberta / BertProcessing: cls = ["<s>", 0] before, sep = ["</s>", 2] after.
static int read_cls_sep(const JsonValue *p, BpeSpec *sp, char *err) {
    const JsonValue *cls = json_get(p, "cls"), *sep = json_get(p, "sep");
    if (!is_arr(cls) || cls->n != 2 || !json_is_int(&cls->items[1], 0, BPE_MAX_TOKENS - 1) || !is_arr(sep) || sep->n != 2 ||
        !json_is_int(&sep->items[1], 0, BPE_MAX_TOKENS - 1))
        return fail(err, "post_processor", "cls / sep are not [token, id]");
    return add_affix(sp, 0, (int)cls->items[1].number, err) || add_affix(sp, 1, (int)sep->items[1].number, err) ? -1 : 0;
}

static int read_post(const JsonValue *p, BpeSpec *sp, int depth, char *err) {
    if (is_null(p)) return 0;
    const char *type = type_of(p);
    if (depth > 4) return fail(err, "post_processor", "Sequences nested too deep");
    if (!strcmp(type, "Sequence")) {
        const JsonValue *list = json_get(p, "processors");
        if (!is_arr(list)) return fail(err, "post_processor", "Sequence without a processors array");
        for (int i = 0; i < list->n; i++)
            if (read_post(&list->items[i], sp, depth + 1, err)) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return 0;   // it only trims offsets
    if (!strcmp(type, "TemplateProcessing")) return read_template(p, sp, err);
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) return read_cls_sep(p, sp, err);
    char msg[160];
    snprintf(msg, sizeof msg, "type %.60s is not supported", type);
    return fail(err, "post_processor", msg);
}

// ---------------------------------------------------------------- whole file
void bpe_spec_free(BpeSpec *sp) {
    free((void *)sp->vocab);
    free((void *)sp->merges);
    free((void *)sp->added);
    memset(sp, 0, sizeof *sp);
}

int bpe_spec_from_json(const JsonValue *root, BpeSpec *sp, char *err) {
    memset(sp, 0, sizeof *sp);
    sp->unk_id = -1;
    int rc = -1;
    if (!is_obj(root)) fail(err, "tokenizer.json", "is not a JSON object");
    else if (read_model(json_get(root, "model"), sp, err) || read_added(json_get(root, "added_tokens"), sp, err)) {
    } else if (read_normalizer(json_get(root, "normalizer"), sp, 0, err) || read_pre(json_get(root, "pre_tokenizer"), sp, 0, err)) {
    } else if (read_post(json_get(root, "post_processor"), sp, 0, err) || read_decoder(json_get(root, "decoder"), sp, 0, err)) {
    } else rc = 0;
    if (rc) bpe_spec_free(sp);
    return rc;
}

Bpe *bpe_from_tokenizer_json(const char *path, char *err) {
    size_t bytes;
    char *text = read_file(path, MAX_JSON_BYTES, &bytes, err), why[ERR_LEN];
    if (!text) return NULL;
    Json doc;
    BpeSpec sp;
    Bpe *b = NULL;
    int parsed = json_parse(text, bytes, &doc, why) == 0;
    free(text);
    if (parsed && bpe_spec_from_json(doc.root, &sp, why) == 0) {
        b = bpe_build(&sp, why);
        bpe_spec_free(&sp);
    }
    if (parsed) json_free(&doc);
    if (!b) snprintf(err, ERR_LEN, "%.200s: %.300s", path, why);
    return b;
}
