// json.h: a strict RFC 8259 JSON parser for untrusted files (config.json, tokenizer.json,
// safetensors headers). The whole document becomes a tree of JsonValue in one arena (a few large
// blocks, freed together); nothing points into the input text, which may be freed after parsing.
//
// Refused, each with "line L, column C: what": empty input, trailing garbage or commas, nesting
// deeper than JSON_MAX_DEPTH, invalid UTF-8 (overlong forms, surrogates, past U+10FFFF), lone
// surrogate \u escapes, raw control characters in strings, numbers outside the grammar (leading
// zeros, "1.", ".5", "+1") and numbers too large for a double. Duplicate keys are kept; json_get
// answers with the last, as most parsers do. A UTF-8 byte order mark at the start is skipped.
#ifndef JSON_H
#define JSON_H

#include <stddef.h>

#define JSON_MAX_DEPTH 128   // arrays and objects nested deeper are refused (the parser recurses once a level)

typedef enum { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;
typedef struct JsonValue JsonValue;
struct JsonValue {
    JsonType type;
    int n;               // ARRAY/OBJECT: element count; STRING: byte length (may contain NUL via \u0000); NUMBER: length of str
    double number;       // NUMBER (as strtod would read it; also set for integers)
    const char *str;     // STRING: unescaped UTF-8, NUL-terminated; NUMBER: its text as written (json_is_int reads it)
    const char **keys;   // OBJECT: n keys (unescaped, NUL-terminated), in file order
    const int *key_len;  // OBJECT: their byte lengths
    JsonValue *items;    // ARRAY elements / OBJECT values, n of them
};
typedef struct { JsonValue *root; void *arena; } Json;

// Parses len bytes of text. 0, or -1 with "line L, column C: what" in err (ERR_LEN); the caller
// prefixes the file name. Columns count UTF-8 characters from 1. On failure doc is empty.
int json_parse(const char *text, size_t len, Json *doc, char *err);
void json_free(Json *doc);
// NULL when obj is not an object or lacks key (last duplicate wins). A linear scan: to visit a
// large object, walk keys/items instead.
const JsonValue *json_get(const JsonValue *obj, const char *key);
// 1 when v is a NUMBER holding an integer in [lo, hi], decided exactly from the number's text
// (9007199254740993 is not 9007199254740992; 1.0, 1e3 and -0 are integers).
int json_is_int(const JsonValue *v, long long lo, long long hi);

#endif
