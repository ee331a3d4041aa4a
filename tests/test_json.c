// test_json.c: tests of engine/json.c and engine/safetensors.c. Prints one line per failed check
// and ends with "json: N passed, N failed"; exit 1 on any failure. Run from the repository root
// (the fixtures are tests/data/json and tests/data/safetensors, written by the latter's make.py).
//
//   JSON: valid documents, every class of error with its line and column, nesting at and past the
//         limit, escapes and UTF-8, numbers at the edges of a double, json_is_int's exactness, a
//         document the size of tokenizer.json
//   safetensors: the reference writer's files (one, sharded) read back exactly, F16/BF16 against
//         PyTorch's conversions and, exhaustively, against a formula; corrupted files the test
//         writes itself, each refused with one line naming the file
#define _GNU_SOURCE
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"
#include "model.h"   // ERR_LEN
#include "safetensors.h"
#include "util.h"

static int passed, failed;

static void check(int ok, int line, const char *fmt, ...) {
    if (ok) {
        passed++;
        return;
    }
    failed++;
    va_list ap;
    va_start(ap, fmt);
    printf("test_json.c:%d: FAIL ", line);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}
#define CHECK(cond, ...) check((cond), __LINE__, __VA_ARGS__)

// ---------------------------------------------------------------- JSON helpers
// Parses len bytes copied to a buffer of exactly that size (no NUL after it: a read past the end
// is a sanitizer's finding).
static int parse_n(const char *text, size_t len, Json *doc, char *err) {
    char *copy = malloc(len ? len : 1);
    memcpy(copy, text, len);
    err[0] = '\0';
    int rc = json_parse(copy, len, doc, err);
    free(copy);   // the tree must not point into the text
    return rc;
}

static int parse(const char *text, Json *doc, char *err) { return parse_n(text, strlen(text), doc, err); }

// ---------------------------------------------------------------- JSON: valid documents
static void test_valid(void) {
    char err[ERR_LEN];
    Json d;
    int rc = parse(" \t\r\n{\"a\": [1, 2.5, -3e2, true, false, null, \"x\"], \"b\": {}, \"c\": [], \"\": 0}\n", &d, err);
    CHECK(rc == 0, "valid document refused: %s", err);
    if (rc) return;
    const JsonValue *a = json_get(d.root, "a");
    CHECK(d.root->type == JSON_OBJECT && d.root->n == 4, "root: type %d, n %d", d.root->type, d.root->n);
    CHECK(a && a->type == JSON_ARRAY && a->n == 7, "a is not an array of 7");
    if (a && a->n == 7) {
        CHECK(a->items[0].type == JSON_NUMBER && a->items[0].number == 1, "a[0]");
        CHECK(a->items[1].number == 2.5 && a->items[2].number == -300, "a[1], a[2]: %g %g", a->items[1].number, a->items[2].number);
        CHECK(a->items[2].n == 4 && strcmp(a->items[2].str, "-3e2") == 0, "a number keeps its text");
        CHECK(a->items[3].type == JSON_TRUE && a->items[4].type == JSON_FALSE && a->items[5].type == JSON_NULL, "literals");
        CHECK(a->items[6].type == JSON_STRING && a->items[6].n == 1 && strcmp(a->items[6].str, "x") == 0, "a[6]");
    }
    const JsonValue *b = json_get(d.root, "b"), *c = json_get(d.root, "c"), *e = json_get(d.root, "");
    CHECK(b && b->type == JSON_OBJECT && b->n == 0 && !json_get(b, "x"), "empty object");
    CHECK(c && c->type == JSON_ARRAY && c->n == 0, "empty array");
    CHECK(e && e->type == JSON_NUMBER && e->number == 0, "the empty key");
    CHECK(!json_get(d.root, "d") && !json_get(a, "a") && !json_get(NULL, "a"), "json_get answers NULL for a missing key or a non-object");
    CHECK(d.root->keys && strcmp(d.root->keys[2], "c") == 0 && d.root->key_len[2] == 1, "keys in file order");
    json_free(&d);
    CHECK(!d.root && !d.arena, "json_free empties the document");
    json_free(&d);   // twice is harmless

    const char *scalars[] = {"0", "-0", "\"\"", "true", "null", "[[[]]]", "{\"a\":{\"b\":{}}}", "1E+2", "-0.0e-0", "\xEF\xBB\xBF[1]"};
    for (size_t i = 0; i < sizeof scalars / sizeof *scalars; i++) {
        CHECK(parse(scalars[i], &d, err) == 0, "%s refused: %s", scalars[i], err);
        json_free(&d);
    }
}

static void test_duplicates_and_keys(void) {
    char err[ERR_LEN];
    Json d;
    if (parse("{\"a\": 1, \"b\": 2, \"a\": 3, \"k\\u0000x\": 4}", &d, err)) { CHECK(0, "duplicates refused: %s", err); return; }
    const JsonValue *a = json_get(d.root, "a");
    CHECK(d.root->n == 4, "duplicates are kept: n %d", d.root->n);
    CHECK(a && a->number == 3, "json_get: the last duplicate wins");
    CHECK(!json_get(d.root, "k"), "a key with a NUL does not match its prefix");
    CHECK(d.root->key_len[3] == 3 && memcmp(d.root->keys[3], "k\0x", 4) == 0, "a key's NUL is kept with its length");
    json_free(&d);
}

// Every escape, raw UTF-8 of each length, surrogate pairs at both ends of the range, \u0000.
static void test_escapes(void) {
    char err[ERR_LEN];
    Json d;
    const char *text = "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u0041\\u00e9\\u20AC\\uD83D\\uDE00\\uD800\\uDC00\\uDBFF\\uDFFF\\u0000|\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\x7F\"";
    const char want[] = "\"\\/\b\f\n\r\tA\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xF0\x90\x80\x80\xF4\x8F\xBF\xBF\0|\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\x7F";
    if (parse(text, &d, err)) { CHECK(0, "escapes refused: %s", err); return; }
    CHECK(d.root->type == JSON_STRING && d.root->n == (int)sizeof want - 1, "unescaped length %d, want %d", d.root->n, (int)sizeof want - 1);
    CHECK(d.root->n == (int)sizeof want - 1 && memcmp(d.root->str, want, sizeof want) == 0, "unescaped bytes (NUL-terminated) differ");
    json_free(&d);
}

static void test_numbers(void) {
    static const struct { const char *text; double want; } ok[] = {
        {"0.1", 0.1}, {"1e308", 1e308}, {"-1.7976931348623157e308", -1.7976931348623157e308}, {"2.2250738585072014e-308", 2.2250738585072014e-308},
        {"4.9e-324", 4.9e-324}, {"1e-400", 0}, {"123456789012345678901234567890", 123456789012345678901234567890.0},
        {"9007199254740993", 9007199254740992.0}, {"0e99999999999999999999", 0}, {"-0", -0.0},
    };
    char err[ERR_LEN];
    Json d;
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        if (parse(ok[i].text, &d, err)) {
            CHECK(0, "%s refused: %s", ok[i].text, err);
            continue;
        }
        CHECK(d.root->number == ok[i].want && !signbit(d.root->number) == !signbit(ok[i].want), "%s read as %.17g", ok[i].text, d.root->number);
        json_free(&d);
    }
}

// ---------------------------------------------------------------- JSON: errors
// Each bad text is refused with err == "line L, column C: ..." holding `what`.
static void test_invalid(void) {
    static const struct { const char *text; int len; const char *where, *what; } bad[] = {
        {"", 0, "line 1, column 1: ", "no JSON value"},
        {" \n\t ", -1, "line 2, column 3: ", "no JSON value"},
        {"[1,]", -1, "line 1, column 4: ", "trailing comma before ']'"},
        {"{\"a\":1,}", -1, "line 1, column 8: ", "trailing comma before '}'"},
        {"[1 2]", -1, "line 1, column 4: ", "expected ',' or ']' after an array element, found '2'"},
        {"{\"a\" 1}", -1, "line 1, column 6: ", "expected ':' after the key"},
        {"{\"a\":1 \"b\":2}", -1, "line 1, column 8: ", "expected ',' or '}' after an object member"},
        {"{1:2}", -1, "line 1, column 2: ", "expected a string key, found '1'"},
        {"{'a':1}", -1, "line 1, column 2: ", "expected a string key"},
        {"[1] x", -1, "line 1, column 5: ", "expected the end of the input after the value, found 'x'"},
        {"{}{}", -1, "line 1, column 3: ", "end of the input after the value"},
        {"truex", -1, "line 1, column 5: ", "end of the input after the value"},
        {"[", -1, "line 1, column 2: ", "expected a value, found the end of the input"},
        {"{", -1, "line 1, column 2: ", "expected a string key, found the end of the input"},
        {"{\"a\":", -1, "line 1, column 6: ", "expected a value"},
        {"[1,2", -1, "line 1, column 5: ", "',' or ']'"},
        {"]", -1, "line 1, column 1: ", "expected a value, found ']'"},
        {"01", -1, "line 1, column 1: ", "cannot start with 0 followed by digits"},
        {"-01", -1, "line 1, column 2: ", "cannot start with 0"},
        {"1.", -1, "line 1, column 3: ", "a digit must follow the decimal point"},
        {"1.e5", -1, "line 1, column 3: ", "decimal point"},
        {".5", -1, "line 1, column 1: ", "expected a value, found '.'"},
        {"+1", -1, "line 1, column 1: ", "expected a value, found '+'"},
        {"-", -1, "line 1, column 2: ", "a digit must follow '-'"},
        {"-a", -1, "line 1, column 2: ", "a digit must follow '-'"},
        {"1e", -1, "line 1, column 3: ", "exponent"},
        {"1e+", -1, "line 1, column 4: ", "exponent"},
        {"0x10", -1, "line 1, column 2: ", "end of the input after the value"},
        {"tru", -1, "line 1, column 1: ", "expected a value"},
        {"nul", -1, "line 1, column 1: ", "expected a value"},
        {"True", -1, "line 1, column 1: ", "expected a value, found 'T'"},
        {"NaN", -1, "line 1, column 1: ", "expected a value"},
        {"-Infinity", -1, "line 1, column 2: ", "a digit must follow '-'"},
        {"1e309", -1, "line 1, column 1: ", "the number 1e309 is too large for a double"},
        {"[-1e309]", -1, "line 1, column 2: ", "too large for a double"},
        {"1797693134862315708145274237317043567981e270", -1, "line 1, column 1: ", "too large for a double"},
        {"\"abc", -1, "line 1, column 1: ", "string without a closing '\"'"},
        {"\"abc\\\"", -1, "line 1, column 1: ", "without a closing"},
        {"\"a\x01z\"", -1, "line 1, column 3: ", "control character 0x01"},
        {"\"a\tb\"", -1, "line 1, column 3: ", "control character 0x09"},
        {"\"a\nb\"", -1, "line 1, column 3: ", "control character 0x0A"},
        {"\"\\x\"", -1, "line 1, column 2: ", "invalid escape: backslash followed by 'x'"},
        {"\"\\U0041\"", -1, "line 1, column 2: ", "invalid escape"},
        {"\"\\u12\"", -1, "line 1, column 2: ", "four hex digits"},
        {"\"\\u12G4\"", -1, "line 1, column 2: ", "four hex digits"},
        {"\"\\uD800\"", -1, "line 1, column 2: ", "lone high surrogate \\uD800"},
        {"\"ab\\uD800\\u0041\"", -1, "line 1, column 4: ", "lone high surrogate"},
        {"\"\\uD800\\uD800\"", -1, "line 1, column 2: ", "lone high surrogate"},
        {"\"\\uDBFF\\\\uDC00\"", -1, "line 1, column 2: ", "lone high surrogate"},
        {"\"\\uDC00\"", -1, "line 1, column 2: ", "lone low surrogate \\uDC00"},
        {"\"\\uDFFF\\uD800\"", -1, "line 1, column 2: ", "lone low surrogate"},
        {"\"\xC0\xAF\"", -1, "line 1, column 2: ", "invalid UTF-8 in a string (byte 0xC0)"},
        {"\"\xC1\xBF\"", -1, "line 1, column 2: ", "invalid UTF-8"},
        {"\"\xE0\x80\xAF\"", -1, "line 1, column 2: ", "invalid UTF-8"},
        {"\"\xF0\x80\x80\xAF\"", -1, "line 1, column 2: ", "invalid UTF-8"},
        {"\"\xED\xA0\x80\"", -1, "line 1, column 2: ", "invalid UTF-8 in a string (byte 0xED)"},
        {"\"\xF4\x90\x80\x80\"", -1, "line 1, column 2: ", "invalid UTF-8"},
        {"\"\xF5\x80\x80\x80\"", -1, "line 1, column 2: ", "invalid UTF-8"},
        {"\"a\x80\"", -1, "line 1, column 3: ", "invalid UTF-8 in a string (byte 0x80)"},
        {"\"\xE2\x82\"", -1, "line 1, column 2: ", "invalid UTF-8"},
        {"\"\xFF\"", -1, "line 1, column 2: ", "invalid UTF-8"},
        {"\"\xC3\"", -1, "line 1, column 2: ", "invalid UTF-8"},
        {"\xC3\xA9", -1, "line 1, column 1: ", "expected a value, found byte 0xC3"},
        {"\xEF\xBB\xBF", -1, "line 1, column 2: ", "no JSON value"},
        {"[1,\0 2]", 7, "line 1, column 4: ", "expected a value, found byte 0x00"},
        {"[1]\0", 4, "line 1, column 4: ", "end of the input after the value, found byte 0x00"},
        {"[1]", 2, "line 1, column 3: ", "',' or ']'"},   // len stops before the bracket
        {"{\n  \"a\": [1,\n    2,,\n]}", -1, "line 3, column 7: ", "expected a value, found ','"},
        {"[\"\xC3\xA9\xE2\x82\xAC\", x]", -1, "line 1, column 8: ", "found 'x'"},   // columns count characters
        {"\r\n\r\n  @", -1, "line 3, column 3: ", "found '@'"},
    };
    char err[ERR_LEN];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        Json d = {(JsonValue *)1, (void *)1};   // must come back empty
        size_t len = bad[i].len < 0 ? strlen(bad[i].text) : (size_t)bad[i].len;
        int rc = parse_n(bad[i].text, len, &d, err);
        CHECK(rc == -1 && !d.root && !d.arena, "case %zu (%s) accepted", i, bad[i].text);
        CHECK(strncmp(err, bad[i].where, strlen(bad[i].where)) == 0 && strstr(err, bad[i].what), "case %zu: error \"%s\", want \"%s...%s\"", i,
              err, bad[i].where, bad[i].what);
        CHECK(!strchr(err, '\n'), "case %zu: error is more than one line", i);
    }
}

// n opening brackets (alternating [ and {"k": when mixed) and, if closed, their closers.
static char *nested(int n, int mixed, int closed, size_t *len) {
    char *s = xcalloc((size_t)n * 10 + 2, 1), *p = s;
    for (int i = 0; i < n; i++) p += sprintf(p, mixed && i % 2 ? "{\"k\":" : "[");
    if (closed) {
        *p++ = '0';
        for (int i = n - 1; i >= 0; i--) *p++ = mixed && i % 2 ? '}' : ']';
    }
    *len = (size_t)(p - s);
    return s;
}

static void test_depth(void) {
    char err[ERR_LEN];
    Json d;
    size_t len;
    for (int mixed = 0; mixed <= 1; mixed++) {
        char *ok = nested(JSON_MAX_DEPTH, mixed, 1, &len);
        CHECK(parse_n(ok, len, &d, err) == 0, "%d levels (mixed %d) refused: %s", JSON_MAX_DEPTH, mixed, err);
        const JsonValue *v = d.root;
        int depth = 0;
        while (v && (v->type == JSON_ARRAY || v->type == JSON_OBJECT) && v->n == 1) v = &v->items[0], depth++;
        CHECK(depth == JSON_MAX_DEPTH && v && v->type == JSON_NUMBER, "walked %d levels down to the number", depth);
        json_free(&d);
        free(ok);
        char *deep = nested(JSON_MAX_DEPTH + 1, mixed, 1, &len);
        CHECK(parse_n(deep, len, &d, err) == -1 && strstr(err, "nested deeper than 128 levels"), "%d levels: \"%s\"", JSON_MAX_DEPTH + 1, err);
        free(deep);
    }
    char *huge = nested(100000, 0, 0, &len);
    CHECK(parse_n(huge, len, &d, err) == -1 && strcmp(err, "line 1, column 129: arrays and objects nested deeper than 128 levels") == 0,
          "100000 '[': \"%s\"", err);
    free(huge);
}

// ---------------------------------------------------------------- JSON: json_is_int
static int is_int_text(const char *text, long long lo, long long hi) {
    char err[ERR_LEN];
    Json d;
    if (parse(text, &d, err)) {
        CHECK(0, "%s refused: %s", text, err);
        return -1;
    }
    int r = json_is_int(d.root, lo, hi);
    json_free(&d);
    return r;
}

static void test_is_int(void) {
    static const struct { const char *text; long long lo, hi; int want; } cases[] = {
        {"0", 0, 0, 1}, {"-0", 0, 0, 1}, {"-0.0e5", 0, 0, 1}, {"0.000e999", 0, 0, 1}, {"5", 5, 5, 1}, {"5", 6, 10, 0}, {"5", 0, 4, 0},
        {"5", 5, 4, 0}, {"1.0", 1, 1, 1}, {"1e3", 1000, 1000, 1}, {"1E+3", 1000, 1000, 1}, {"1.5", LLONG_MIN, LLONG_MAX, 0},
        {"1.50e1", 15, 15, 1}, {"1.25e1", LLONG_MIN, LLONG_MAX, 0}, {"10e-1", 1, 1, 1}, {"100e-2", 1, 1, 1}, {"101e-2", LLONG_MIN, LLONG_MAX, 0},
        {"1e-400", LLONG_MIN, LLONG_MAX, 0}, {"-17", -17, -17, 1}, {"-17", -16, 0, 0}, {"0.1e1", 1, 1, 1}, {"0.01e1", LLONG_MIN, LLONG_MAX, 0},
        {"9007199254740993", 9007199254740993LL, 9007199254740993LL, 1}, {"9007199254740993", 9007199254740992LL, 9007199254740992LL, 0},
        {"9007199254740992", 9007199254740992LL, 9007199254740992LL, 1}, {"9223372036854775807", LLONG_MAX, LLONG_MAX, 1},
        {"9223372036854775808", LLONG_MIN, LLONG_MAX, 0}, {"-9223372036854775808", LLONG_MIN, LLONG_MIN, 1}, {"-9223372036854775809", LLONG_MIN, LLONG_MAX, 0},
        {"92233720368547758.07e2", LLONG_MAX, LLONG_MAX, 1}, {"1e18", 1000000000000000000LL, 1000000000000000000LL, 1}, {"1e19", LLONG_MIN, LLONG_MAX, 0},
        {"18446744073709551616", LLONG_MIN, LLONG_MAX, 0}, {"12345678900000000000000e-13", 1234567890, 1234567890, 1},
        {"123456789012345678901234567890e-20", LLONG_MIN, LLONG_MAX, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int r = is_int_text(cases[i].text, cases[i].lo, cases[i].hi);
        CHECK(r == cases[i].want, "json_is_int(%s, %lld, %lld) = %d, want %d", cases[i].text, cases[i].lo, cases[i].hi, r, cases[i].want);
    }
    JsonValue s = {.type = JSON_STRING, .str = "5", .n = 1}, n3 = {.type = JSON_NUMBER, .number = 3}, n35 = {.type = JSON_NUMBER, .number = 3.5},
              big = {.type = JSON_NUMBER, .number = 1e300};
    CHECK(!json_is_int(&s, 0, 10) && !json_is_int(NULL, 0, 10), "json_is_int of a string or NULL");
    CHECK(json_is_int(&n3, 3, 3) && !json_is_int(&n35, 0, 10) && !json_is_int(&big, LLONG_MIN, LLONG_MAX), "json_is_int of numbers made by hand");
}

// ---------------------------------------------------------------- JSON: files
static void test_config(void) {
    char err[ERR_LEN];
    size_t bytes;
    char *text = read_file("tests/data/json/config.json", 1 << 20, &bytes, err);
    Json d;
    if (!text) { CHECK(0, "%s", err); return; }
    if (json_parse(text, bytes, &d, err)) {
        free(text);
        { CHECK(0, "config.json: %s", err); return; }
    }
    free(text);
    const JsonValue *eos = json_get(d.root, "eos_token_id"), *rope = json_get(d.root, "rope_scaling");
    CHECK(json_is_int(json_get(d.root, "hidden_size"), 1, 1 << 20) && json_get(d.root, "hidden_size")->number == 2048, "hidden_size");
    CHECK(!json_is_int(json_get(d.root, "rms_norm_eps"), LLONG_MIN, LLONG_MAX) && json_get(d.root, "rms_norm_eps")->number == 1e-05, "rms_norm_eps");
    CHECK(json_is_int(json_get(d.root, "rope_theta"), 500000, 500000), "rope_theta 500000.0 is an integer");
    CHECK(eos && eos->type == JSON_ARRAY && eos->n == 3 && json_is_int(&eos->items[2], 128009, 128009), "eos_token_id");
    CHECK(rope && json_get(rope, "rope_type") && strcmp(json_get(rope, "rope_type")->str, "llama3") == 0, "rope_scaling.rope_type");
    CHECK(json_get(d.root, "tie_word_embeddings")->type == JSON_TRUE, "tie_word_embeddings");
    json_free(&d);
}

// A document shaped like Llama 3's tokenizer.json: a 128000-entry object and a 280000-entry array.
static void test_large(void) {
    size_t cap = 16 << 20, len = 0;
    char *s = xcalloc(cap, 1), err[ERR_LEN];
    len += sprintf(s + len, "{\"model\": {\"vocab\": {");
    for (int i = 0; i < 128000; i++) len += sprintf(s + len, "%s\"tok\\u00e9%d\": %d", i ? ", " : "", i, i);
    len += sprintf(s + len, "}, \"merges\": [");
    for (int i = 0; i < 280000; i++) len += sprintf(s + len, "%s\"a%d b\"", i ? ", " : "", i);
    len += sprintf(s + len, "]}}");
    Json d;
    long t0 = time_in_us();
    int rc = json_parse(s, len, &d, err);
    long us = time_in_us() - t0;
    free(s);
    if (rc) { CHECK(0, "large document refused: %s", err); return; }
    const JsonValue *vocab = json_get(json_get(d.root, "model"), "vocab"), *merges = json_get(json_get(d.root, "model"), "merges");
    CHECK(vocab && vocab->n == 128000 && merges && merges->n == 280000, "large document: counts");
    if (vocab && vocab->n == 128000) {
        int bad = 0;
        for (int i = 0; i < vocab->n; i++) {
            char want[32];
            int k = sprintf(want, "tok\xC3\xA9%d", i);
            bad += vocab->key_len[i] != k || strcmp(vocab->keys[i], want) || !json_is_int(&vocab->items[i], i, i);
        }
        CHECK(!bad, "large document: %d vocab entries wrong", bad);
    }
    CHECK(merges && merges->n == 280000 && strcmp(merges->items[279999].str, "a279999 b") == 0, "large document: last merge");
    printf("json: parsed a %.1f MB tokenizer-shaped document in %.1f ms\n", len / 1e6, us / 1e3);
    json_free(&d);
}

// ---------------------------------------------------------------- safetensors: fixtures
static int bits_equal(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

// The named half tensor read through st_read_floats equals, bit for bit, the F32 tensor `expect`.
static void expect_floats(const SafeTensors *st, const char *name, const char *expect) {
    const StTensor *t = st_find(st, name), *e = st_find(st, expect);
    char err[ERR_LEN];
    if (!t || !e) { CHECK(0, "%s or %s missing", name, expect); return; }
    CHECK(t->numel == e->numel && e->dtype == ST_F32, "%s: %lld elements, expectation %lld", name, (long long)t->numel, (long long)e->numel);
    if (t->numel != e->numel) return;
    float *got = xcalloc(t->numel + 1, sizeof(float)), *want = xcalloc(t->numel + 1, sizeof(float));
    CHECK(st_read_floats(t, 0, t->numel, got, err) == 0 && st_read_floats(e, 0, e->numel, want, err) == 0, "%s: %s", name, err);
    for (int64_t i = 0; i < t->numel; i++) {
        uint32_t g, w;
        memcpy(&g, &got[i], 4), memcpy(&w, &want[i], 4);
        CHECK(g == w, "%s[%lld]: 0x%08x, PyTorch says 0x%08x", name, (long long)i, g, w);
    }
    // A window in the middle reads the same elements.
    if (t->numel > 10) {
        CHECK(st_read_floats(t, 3, 7, got, err) == 0 && bits_equal(got, want + 3, 7), "%s: elements [3, 10)", name);
    }
    free(got);
    free(want);
}

static void test_single(void) {
    const char *dir = "tests/data/safetensors/single", *file = "tests/data/safetensors/single/model.safetensors";
    char err[ERR_LEN];
    SafeTensors st;
    for (int by_file = 1; by_file >= 0; by_file--) {   // the file, then the directory (kept open)
        if (st_open(&st, by_file ? file : dir, err)) { CHECK(0, "%s", err); return; }
        CHECK(st.n == 8 && st.n_files == 1, "single: %d tensors in %d files", st.n, st.n_files);
        for (int i = 1; i < st.n; i++) CHECK(strcmp(st.tensors[i - 1].name, st.tensors[i].name) < 0, "tensors sorted by name");
        if (by_file) st_close(&st);
    }
    const StTensor *f16 = st_find(&st, "f16"), *bf16 = st_find(&st, "bf16"), *sc = st_find(&st, "scalar"), *em = st_find(&st, "empty"),
                   *i64 = st_find(&st, "i64"), *f32 = st_find(&st, "f32");
    CHECK(f16 && f16->dtype == ST_F16 && f16->n_dims == 2 && f16->shape[0] == 8 && f16->shape[1] == 8 && f16->bytes == 128, "f16's entry");
    CHECK(bf16 && bf16->dtype == ST_BF16 && bf16->n_dims == 3 && bf16->shape[2] == 8 && bf16->numel == 64, "bf16's entry");
    CHECK(sc && sc->n_dims == 0 && sc->numel == 1 && sc->bytes == 4, "a scalar: no dimensions, one element");
    CHECK(em && em->n_dims == 2 && em->shape[0] == 0 && em->numel == 0 && em->bytes == 0, "an empty tensor");
    CHECK(f16 && strcmp(f16->file, "tests/data/safetensors/single/model.safetensors") == 0, "the tensor's file: %s", f16 ? f16->file : "");
    CHECK(!st_find(&st, "f1") && !st_find(&st, "f16.") && !st_find(&st, ""), "st_find of absent names");
    expect_floats(&st, "f16", "f16.as_f32");
    expect_floats(&st, "bf16", "bf16.as_f32");
    float buf[16];
    if (f32) {
        CHECK(st_read_floats(f32, 0, 15, buf, err) == 0 && memcmp(buf, f32->data, 60) == 0, "F32 reads as it is stored");
        CHECK(st_read_floats(f32, 15, 0, buf, err) == 0, "an empty read at the end");
        CHECK(st_read_floats(f32, 14, 2, buf, err) == -1 && strstr(err, "model.safetensors: tensor f32: elements [14, 14 + 2) are outside its 15"),
              "a read past the end: \"%s\"", err);
        CHECK(st_read_floats(f32, SIZE_MAX, 2, buf, err) == -1 && st_read_floats(f32, 1, SIZE_MAX, buf, err) == -1, "reads whose end overflows");
    }
    if (i64) CHECK(st_read_floats(i64, 0, 1, buf, err) == -1 && strstr(err, "tensor i64: dtype I64 cannot be read as floats"), "I64: \"%s\"", err);
    if (em) CHECK(st_read_floats(em, 0, 0, buf, err) == 0, "an empty tensor reads nothing");
    st_close(&st);
    CHECK(st.n == 0 && !st.tensors && !st.files, "st_close empties it");
}

static void test_sharded(void) {
    const char *paths[] = {"tests/data/safetensors/sharded", "tests/data/safetensors/sharded/", "tests/data/safetensors/sharded/model.safetensors.index.json"};
    char err[ERR_LEN];
    for (int p = 0; p < 3; p++) {
        SafeTensors st;
        if (st_open(&st, paths[p], err)) {
            CHECK(0, "%s", err);
            continue;
        }
        CHECK(st.n == 6 && st.n_files == 2, "sharded: %d tensors in %d files", st.n, st.n_files);
        const StTensor *emb = st_find(&st, "model.embed_tokens.weight"), *norm = st_find(&st, "model.norm.weight");
        CHECK(emb && strcmp(emb->file, "tests/data/safetensors/sharded/model-00001-of-00002.safetensors") == 0, "embed_tokens' file: %s",
              emb ? emb->file : "");
        CHECK(norm && strstr(norm->file, "model-00002-of-00002.safetensors") && norm->numel == 4, "norm's entry");
        expect_floats(&st, "model.embed_tokens.weight", "expect.model.embed_tokens.weight");
        expect_floats(&st, "model.layers.0.mlp.up_proj.weight", "expect.model.layers.0.mlp.up_proj.weight");
        st_close(&st);
    }
}

// Every one of the 65536 F16 values against sign * 2^(e-15) * (1 + m/1024) (subnormals: m * 2^-24;
// NaNs quiet with their payload, as F16C and PyTorch convert them), and every BF16 value against
// its float bits.
static void test_half_exhaustive(void) {
    int bad16 = 0, badbf = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        int sign = h >> 15, e = h >> 10 & 31, m = h & 1023;
        float got = f16_to_f32((uint16_t)h);
        uint32_t gbits;
        memcpy(&gbits, &got, 4);
        if (e == 31 && m) bad16 += gbits != ((uint32_t)sign << 31 | 0x7FC00000u | (uint32_t)m << 13);   // NaN: quiet, payload kept
        else {
            double mag = e == 31 ? INFINITY : e == 0 ? ldexp(m, -24) : ldexp(1 + m / 1024.0, e - 15);
            double want = sign ? -mag : mag;
            bad16 += (double)got != want || !signbit(got) != !signbit(want);
        }
        float b = bf16_to_f32((uint16_t)h);
        uint32_t bbits;
        memcpy(&bbits, &b, 4);
        badbf += bbits != h << 16;
    }
    CHECK(!bad16, "f16_to_f32: %d of 65536 values wrong", bad16);
    CHECK(!badbf, "bf16_to_f32: %d of 65536 values wrong", badbf);
}

// ---------------------------------------------------------------- safetensors: corrupted files
static char tmp[64];   // the test's temporary directory

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f)) {
        printf("test_json.c: cannot write %s\n", path);
        exit(1);
    }
}

// A safetensors file: the header length (hlen, or the header's own length when hlen < 0), the
// header, data_bytes zero bytes of data.
static void write_st(const char *path, const char *header, long long hlen, size_t data_bytes) {
    size_t h = strlen(header), n = 8 + h + data_bytes;
    unsigned char *buf = xcalloc(n, 1);
    uint64_t len = hlen < 0 ? h : (uint64_t)hlen;
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(len >> 8 * i);
    memcpy(buf + 8, header, h);
    write_bytes(path, buf, n);
    free(buf);
}

static char *tmp_path(const char *name) {
    static char paths[4][256];
    static int k;
    char *p = paths[k++ % 4];
    snprintf(p, 256, "%s/%s", tmp, name);
    return p;
}

// st_open(path) fails with one line holding both `names` (the file) and `what`.
static void expect_refused(const char *path, const char *names, const char *what, int line) {
    SafeTensors st;
    char err[ERR_LEN] = "";
    int rc = st_open(&st, path, err);
    if (rc == 0) st_close(&st);
    check(rc == -1 && st.n == 0 && !st.files, line, "%s accepted", path);
    check(strstr(err, names) && strstr(err, what) && !strchr(err, '\n'), line, "error \"%s\", want \"%s\" and \"%s\"", err, names, what);
}
#define REFUSED(path, names, what) expect_refused((path), (names), (what), __LINE__)

// A one-tensor header as a string.
#define T1(dtype, shape, offsets) "{\"a\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":" offsets "}}"

static void test_corrupt_files(void) {
    static const struct { const char *header; size_t data; const char *what; } bad[] = {
        {T1("F32", "[2]", "[0,8]"), 4, "tensor a: data_offsets [0, 8] beyond the file's 4 data bytes"},
        {T1("F32", "[3]", "[0,8]"), 8, "tensor a: data_offsets [0, 8] hold 8 bytes, but F32 of 3 elements take 12"},
        {T1("BF16", "[2,2]", "[0,4]"), 4, "hold 4 bytes, but BF16 of 4 elements take 8"},
        {T1("F32", "[-1]", "[0,4]"), 4, "tensor a: shape[0] is not an integer in [0, 2^53]"},
        {T1("F32", "[1.5]", "[0,4]"), 4, "shape[0] is not an integer"},
        {T1("F32", "[\"1\"]", "[0,4]"), 4, "shape[0] is not an integer"},
        {T1("F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]"), 4, "shape has 9 dimensions, more than 8"},
        {T1("F32", "[4294967296,4294967296,4294967296]", "[0,4]"), 4, "the shape's product overflows"},
        {T1("F32", "[2147483648,2147483648]", "[0,4]"), 4, "the shape's size in bytes overflows"},
        {T1("F32", "{}", "[0,4]"), 4, "\"shape\" is missing or not an array"},
        {T1("F4", "[1]", "[0,4]"), 4, "tensor a: dtype F4 is not one of"},
        {T1("f32", "[1]", "[0,4]"), 4, "dtype f32 is not one of"},
        {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype (missing, or not a string)"},
        {T1("F32", "[1]", "[0]"), 4, "\"data_offsets\" is not [begin, end]"},
        {T1("F32", "[1]", "[0,4,4]"), 4, "\"data_offsets\" is not [begin, end]"},
        {T1("F32", "[1]", "[-4,0]"), 4, "\"data_offsets\" is not [begin, end]"},
        {T1("F32", "[0]", "[8,4]"), 8, "data_offsets [8, 4] end before they begin"},
        {T1("F32", "[1]", "[0,4]"), 8, "4 bytes after the last tensor's data belong to no tensor"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
         "data_offsets [4, 12] overlap tensor a's [0, 8]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12,
         "tensor b: data_offsets [8, 12] leave the bytes [4, 8) before them unused"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
         "tensor a: appears twice in the header"},
        {"{\"a\":5}", 0, "tensor a: not an object of dtype, shape and data_offsets"},
        {"{\"a\\u0000b\":" "{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, "the name holds a NUL byte"},
        {"{\"x\\ny\":{\"dtype\":\"F\\r32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, "tensor x?y: dtype F?32 is not one of"},   // one line
        {"{\"__metadata__\":{\"format\":1}}", 0, "__metadata__ is not an object of strings"},
        {"{\"__metadata__\":[]}", 0, "__metadata__ is not an object of strings"},
        {"[]", 0, "header: not a JSON object"},
        {"{bad", 0, "header: line 1, column 2: expected a string key, found 'b'"},
        {"{\"a\":\"\xFF\"}", 0, "header: line 1, column 7: invalid UTF-8"},
        {"", 0, "header: line 1, column 1: no JSON value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char name[32];
        snprintf(name, sizeof name, "bad%02zu.safetensors", i);
        char *path = tmp_path(name);
        write_st(path, bad[i].header, -1, bad[i].data);
        expect_refused(path, path, bad[i].what, __LINE__);   // the file name tells the case
    }
    // Valid edge cases: no tensors at all; padding spaces after the header (the writer pads to 8).
    SafeTensors st;
    char err[ERR_LEN];
    write_st(tmp_path("empty.safetensors"), "{}", -1, 0);
    CHECK(st_open(&st, tmp_path("empty.safetensors"), err) == 0 && st.n == 0, "a file without tensors: %s", err);
    st_close(&st);
    write_st(tmp_path("pad.safetensors"), "{\"__metadata__\":{\"format\":\"pt\"},\"z\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}    ", -1, 3);
    CHECK(st_open(&st, tmp_path("pad.safetensors"), err) == 0 && st.n == 1 && st.tensors[0].bytes == 3, "a padded header: %s", err);
    st_close(&st);
}

// Truncations of the real fixture, and header lengths that lie.
static void test_truncated(void) {
    size_t n;
    char err[ERR_LEN], *whole = read_file("tests/data/safetensors/single/model.safetensors", 1 << 20, &n, err);
    if (!whole) { CHECK(0, "%s", err); return; }
    uint64_t hlen;
    memcpy(&hlen, whole, 8);
    char *path = tmp_path("cut.safetensors");
    write_bytes(path, whole, 0);
    REFUSED(path, path, "0 bytes, too short for the 8-byte header length");
    write_bytes(path, whole, 5);
    REFUSED(path, path, "5 bytes, too short for the 8-byte header length");
    write_bytes(path, whole, 8 + hlen / 2);
    REFUSED(path, path, "runs past the file's end");
    write_bytes(path, whole, 8 + hlen);
    REFUSED(path, path, "beyond the file's 0 data bytes");
    write_bytes(path, whole, n - 10);
    REFUSED(path, path, "beyond the file's");
    memcpy(whole, "\xff\xff\xff\xff\xff\xff\xff\xff", 8);
    write_bytes(path, whole, n);
    REFUSED(path, path, "header length 18446744073709551615 runs past the file's end");
    free(whole);
    write_st(path, "{}", 200 << 20, 0);   // a header longer than the 100 MB the format allows (a sparse file)
    CHECK(truncate(path, 8 + (200 << 20) + 2) == 0, "truncate %s", path);
    REFUSED(path, path, "is more than the 104857600 allowed");
    REFUSED(tmp_path("no-such.safetensors"), "no-such.safetensors", "No such file or directory");
    REFUSED(tmp, tmp, "holds neither model.safetensors nor model.safetensors.index.json");
    REFUSED(tmp_path("."), tmp, "holds neither");
}

// A sharded directory `name` under tmp: the index text, and shards given as (name, header, data).
static char *make_sharded(const char *name, const char *index, int n_shards, const char *const shards[][2], const size_t *data) {
    static char dir[256];
    char path[512];
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    write_bytes(path, index, strlen(index));
    for (int i = 0; i < n_shards; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, shards[i][0]);
        write_st(path, shards[i][1], -1, data[i]);
    }
    return dir;
}

#define SH_A "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}"
#define SH_B "{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}"

static void test_corrupt_shards(void) {
    static const struct { const char *index; int n; const char *what, *names; } bad[] = {
        {"{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}", 1, "/model.safetensors.index.json: shard s2.safetensors: No such file or directory", NULL},
        {"{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\",\"c\":\"s1.safetensors\"}}", 2, "index.json: tensor c: not in shard s1.safetensors", NULL},
        {"{\"weight_map\":{\"a\":\"s2.safetensors\",\"b\":\"s2.safetensors\"}}", 2, "index.json: tensor a: not in shard s2.safetensors", NULL},
        {"{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\",\"z\":\"s2.safetensors\"}}", 2, "tensor b: listed in shard s1.safetensors but found in", NULL},
        {"{\"weight_map\":{\"a\":\"s\\n1.safetensors\"}}", 2, "index.json: shard s?1.safetensors: No such file or directory", NULL},   // one line
        {"{\"weight_map\":{\"a\":\"../s1.safetensors\"}}", 2, "tensor a: weight_map's shard is not a file name", NULL},
        {"{\"weight_map\":{\"a\":\"\"}}", 2, "weight_map's shard is not a file name", NULL},
        {"{\"weight_map\":{\"a\":1}}", 2, "weight_map's shard is not a file name", NULL},
        {"{\"weight_map\":{}}", 2, "weight_map is missing, empty or not an object", NULL},
        {"{\"metadata\":{}}", 2, "weight_map is missing, empty or not an object", NULL},
        {"{\"weight_map\":{\"a\":\"s1.safetensors\",}}", 2, "index.json: line 1, column 37: trailing comma", NULL},
        {"{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\",\"a\":\"s1.safetensors\"}}", 2, "tensor a: listed twice in weight_map", NULL},
    };
    const char *const shards[2][2] = {{"s1.safetensors", SH_A}, {"s2.safetensors", SH_B}};
    const size_t data[2] = {4, 4};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char name[16];
        snprintf(name, sizeof name, "sh%02zu", i);
        char *dir = make_sharded(name, bad[i].index, bad[i].n, shards, data);
        expect_refused(dir, bad[i].names ? bad[i].names : dir, bad[i].what, __LINE__);   // shNN: case NN
    }
    // The exact message for a missing shard, as the brief of this reader gives it.
    SafeTensors st;
    char err[ERR_LEN], want[ERR_LEN];
    char *dir = make_sharded("missing", "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00002-of-00002.safetensors\"}}", 0, shards, data);
    write_st(tmp_path("missing/model-00001-of-00002.safetensors"), SH_A, -1, 4);
    snprintf(want, sizeof want, "%s/model.safetensors.index.json: shard model-00002-of-00002.safetensors: No such file or directory", dir);
    CHECK(st_open(&st, dir, err) == -1 && strcmp(err, want) == 0, "missing shard: \"%s\"", err);
    // A shard holding a tensor the index does not list.
    const char *const extra[1][2] = {{"s1.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"x\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[4,8]}}"}};
    const size_t extra_data[1] = {8};
    dir = make_sharded("extra", "{\"weight_map\":{\"a\":\"s1.safetensors\"}}", 1, extra, extra_data);
    REFUSED(dir, "/extra/s1.safetensors: tensor x: not listed in", "model.safetensors.index.json's weight_map");
    // The same tensor in two shards.
    const char *const twice[2][2] = {{"s1.safetensors", SH_A}, {"s2.safetensors", SH_A}};
    dir = make_sharded("twice", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}", 2, twice, data);
    REFUSED(dir, "/s1.safetensors: tensor a: also in", "/s2.safetensors");
    // A good one, to show the harness itself does not refuse everything.
    dir = make_sharded("good", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}", 2, shards, data);
    CHECK(st_open(&st, dir, err) == 0 && st.n == 2 && st_find(&st, "b") && strstr(st_find(&st, "b")->file, "good/s2.safetensors"), "good shards: %s", err);
    st_close(&st);
}

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw) { return remove(path); }

// The temporary directory and everything in it (children first).
static void remove_tree(const char *dir) {
    if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) printf("test_json.c: could not remove %s\n", dir);
}

int main(void) {
    test_valid();
    test_duplicates_and_keys();
    test_escapes();
    test_numbers();
    test_invalid();
    test_depth();
    test_is_int();
    test_config();
    test_large();
    test_half_exhaustive();
    test_single();
    test_sharded();
    strcpy(tmp, "/tmp/test_json.XXXXXX");
    if (!mkdtemp(tmp)) return printf("test_json.c: cannot make a temporary directory\n"), 1;
    test_corrupt_files();
    test_truncated();
    test_corrupt_shards();
    remove_tree(tmp);
    printf("json: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
