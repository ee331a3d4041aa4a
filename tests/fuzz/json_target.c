// json_target.c: libFuzzer target for json_parse on arbitrary bytes. The contract: every input is
// accepted or refused with one "line L, column C: ..." message, never a crash, an out-of-bounds
// access, undefined behaviour or an exit. An accepted document is walked (every string
// NUL-terminated at its length, every number finite, every key found by json_get), written back
// as JSON and parsed again: the second tree must equal the first.
//   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iengine tests/fuzz/json_target.c engine/json.c engine/util.c -lm
#include "harness.h"   // bytes_as_file; main for -DFUZZ_REPLAY
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "model.h"   // ERR_LEN

static void fail(const char *what) {
    fprintf(stderr, "json_target: %s\n", what);
    abort();
}

// ---------------------------------------------------------------- checks of one tree
static void walk(const JsonValue *v) {
    switch (v->type) {
    case JSON_STRING:
        if (v->n < 0 || v->str[v->n] != '\0') fail("a string is not NUL-terminated at its length");
        break;
    case JSON_NUMBER:
        if (!isfinite(v->number) || !v->str || (int)strlen(v->str) != v->n) fail("a number is not finite or lost its text");
        if (json_is_int(v, 0, 0) && v->number != 0) fail("json_is_int says 0 for a number that is not");
        break;
    case JSON_OBJECT:
        for (int i = 0; i < v->n; i++) {
            if (v->keys[i][v->key_len[i]] != '\0') fail("a key is not NUL-terminated at its length");
            if ((size_t)v->key_len[i] == strlen(v->keys[i]) && !json_get(v, v->keys[i])) fail("json_get misses a key");
        }
        // fall through
    case JSON_ARRAY:
        for (int i = 0; i < v->n; i++) walk(&v->items[i]);
        break;
    default:
        break;
    }
}

// ---------------------------------------------------------------- writing it back
typedef struct { char *s; size_t n, cap; } Buf;

static void put(Buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = 2 * (b->n + n + 1);
        if (!(b->s = realloc(b->s, b->cap))) fail("out of memory");
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
}

// Control characters and '"' '\\' escaped; other bytes (valid UTF-8, the parser checked) as they are.
static void put_string(Buf *b, const char *s, int n) {
    put(b, "\"", 1);
    for (int i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c < 0x20 || c == '"' || c == '\\') put(b, esc, snprintf(esc, sizeof esc, "\\u%04x", c));
        else put(b, (const char *)&c, 1);
    }
    put(b, "\"", 1);
}

static void put_value(Buf *b, const JsonValue *v) {
    static const char *const literal[] = {"null", "false", "true"};
    switch (v->type) {
    case JSON_NULL: case JSON_FALSE: case JSON_TRUE: put(b, literal[v->type], strlen(literal[v->type])); break;
    case JSON_NUMBER: put(b, v->str, v->n); break;
    case JSON_STRING: put_string(b, v->str, v->n); break;
    case JSON_ARRAY: case JSON_OBJECT:
        put(b, v->type == JSON_ARRAY ? "[" : "{", 1);
        for (int i = 0; i < v->n; i++) {
            if (i) put(b, ",", 1);
            if (v->type == JSON_OBJECT) put_string(b, v->keys[i], v->key_len[i]), put(b, ":", 1);
            put_value(b, &v->items[i]);
        }
        put(b, v->type == JSON_ARRAY ? "]" : "}", 1);
        break;
    }
}

static int same(const JsonValue *a, const JsonValue *b) {
    if (a->type != b->type || a->n != b->n) return 0;
    if (a->type == JSON_NUMBER) return memcmp(&a->number, &b->number, sizeof(double)) == 0 && strcmp(a->str, b->str) == 0;
    if (a->type == JSON_STRING) return memcmp(a->str, b->str, a->n) == 0;
    for (int i = 0; (a->type == JSON_ARRAY || a->type == JSON_OBJECT) && i < a->n; i++) {
        if (a->type == JSON_OBJECT && (a->key_len[i] != b->key_len[i] || memcmp(a->keys[i], b->keys[i], a->key_len[i]))) return 0;
        if (!same(&a->items[i], &b->items[i])) return 0;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[ERR_LEN] = "";
    Json doc, again;
    if (json_parse((const char *)data, size, &doc, err) != 0) {
        if (strncmp(err, "line ", 5) != 0 || !strstr(err, ", column ") || strchr(err, '\n') || doc.root) fail(err);
        return 0;
    }
    walk(doc.root);
    Buf b = {0};
    put_value(&b, doc.root);
    if (json_parse(b.s, b.n, &again, err) != 0) fail(err);
    if (!same(doc.root, again.root)) fail("the document written back parses to another tree");
    json_free(&again);
    json_free(&doc);
    free(b.s);
    return 0;
}
