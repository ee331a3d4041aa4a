// json.c: the parser behind json.h. Recursive descent, one level of recursion per level of
// nesting (so at most JSON_MAX_DEPTH). The children of the arrays and objects still open wait on
// a scratch stack and move into the arena, contiguous, when their container closes: the arena
// only ever receives finished values, and a document costs a few large allocations however many
// values it holds (tokenizer.json: 400k values).
#include "json.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"   // ERR_LEN
#include "util.h"

// ---------------------------------------------------------------- arena
typedef struct Block {
    struct Block *next;   // the older blocks
    size_t used, cap;
    size_t pad;           // a 32-byte header keeps data 16-byte aligned
    unsigned char data[];
} Block;

#define MIN_BLOCK ((size_t)1 << 16)
#define MAX_GROWTH ((size_t)1 << 28)   // blocks after the first double up to this

static size_t round8(size_t n) { return (n + 7) & ~(size_t)7; }

static void arena_block(Block **arena, size_t cap) {
    Block *b = xcalloc(1, sizeof(Block) + cap);
    b->cap = cap;
    b->next = *arena;
    *arena = b;
}

// bytes (< SIZE_MAX / 4, which json_parse's size checks ensure) from the newest block, or from a
// new one twice its size: the number of blocks grows with the log of the document's size.
static void *arena_alloc(Block **arena, size_t bytes) {
    bytes = round8(bytes);   // keeps every JsonValue and pointer array aligned
    Block *b = *arena;
    if (b->cap - b->used < bytes) {
        size_t cap = b->cap < MAX_GROWTH ? 2 * b->cap : MAX_GROWTH;
        arena_block(arena, cap > bytes ? cap : bytes);
        b = *arena;
    }
    void *p = b->data + b->used;
    b->used += bytes;
    return p;
}

// Shortens the newest allocation p to bytes (a string is allocated at its escaped length).
static void arena_trim(Block *b, void *p, size_t bytes) {
    b->used = (size_t)((unsigned char *)p - b->data) + round8(bytes);
}

static void arena_free(Block *b) {
    while (b) {
        Block *next = b->next;
        free(b);
        b = next;
    }
}

// ---------------------------------------------------------------- parser state
typedef struct {
    const unsigned char *s;
    size_t len, pos;
    int depth;
    Block *arena;
    JsonValue *vals;         // children of the open containers, innermost last
    size_t n_vals, cap_vals;
    const char **keys;       // keys of the open objects' children, innermost last
    int *key_lens;
    size_t n_keys, cap_keys;
    char *err;
} Parser;

// realloc for the scratch stacks: doubles *cap; out of memory is a message and exit, as xcalloc.
static void *grow(void *p, size_t *cap, size_t elem) {
    size_t n = *cap ? 2 * *cap : 1024;
    if (n > SIZE_MAX / elem || !(p = realloc(p, n * elem))) {
        fprintf(stderr, "json: out of memory growing a stack to %zu entries\n", n);
        exit(1);
    }
    *cap = n;
    return p;
}

static void push_value(Parser *p, const JsonValue *v) {
    if (p->n_vals == p->cap_vals) p->vals = grow(p->vals, &p->cap_vals, sizeof *p->vals);
    p->vals[p->n_vals++] = *v;
}

static void push_key(Parser *p, const char *key, int len) {
    if (p->n_keys == p->cap_keys) {
        size_t cap = p->cap_keys;
        p->keys = grow(p->keys, &cap, sizeof *p->keys);
        p->key_lens = grow(p->key_lens, &p->cap_keys, sizeof *p->key_lens);
    }
    p->keys[p->n_keys] = key;
    p->key_lens[p->n_keys++] = len;
}

// ---------------------------------------------------------------- errors
// "line L, column C: what" for the byte at `at` (columns count UTF-8 characters); returns -1.
static int fail_at(Parser *p, size_t at, const char *fmt, ...) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < p->len; i++) {
        if (p->s[i] == '\n') line++, col = 1;
        else if ((p->s[i] & 0xC0) != 0x80) col++;
    }
    char what[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(p->err, ERR_LEN, "line %zu, column %zu: %.400s", line, col, what);
    return -1;
}

// The byte at `at`, for a message: 'x', byte 0xNN, or the end of the input.
static const char *describe(const Parser *p, size_t at, char buf[16]) {
    if (at >= p->len) return "the end of the input";
    unsigned char c = p->s[at];
    if (c >= 0x20 && c < 0x7F) snprintf(buf, 16, "'%c'", c);
    else snprintf(buf, 16, "byte 0x%02X", c);
    return buf;
}

static int expected(Parser *p, const char *what) {
    char buf[16];
    return fail_at(p, p->pos, "expected %s, found %s", what, describe(p, p->pos, buf));
}

// ---------------------------------------------------------------- scalars
static void skip_ws(Parser *p) {
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static int at_char(const Parser *p, char c) { return p->pos < p->len && p->s[p->pos] == (unsigned char)c; }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int parse_literal(Parser *p, JsonValue *v, const char *word, JsonType type) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) return expected(p, "a value (true, false, null, a number, a string, [ or {)");
    *v = (JsonValue){.type = type};
    p->pos += n;
    return 0;
}

static size_t skip_digits(const Parser *p, size_t at) {
    while (at < p->len && is_digit(p->s[at])) at++;
    return at;
}

// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?: the end of the number starting at p->pos, or 0.
static size_t number_end(Parser *p) {
    size_t at = p->pos;
    if (p->s[at] == '-') at++;
    if (at >= p->len || !is_digit(p->s[at])) return fail_at(p, at, "a digit must follow '-'"), 0;
    if (p->s[at] == '0' && at + 1 < p->len && is_digit(p->s[at + 1])) return fail_at(p, at, "a number cannot start with 0 followed by digits"), 0;
    at = skip_digits(p, at);
    if (at < p->len && p->s[at] == '.') {
        size_t end = skip_digits(p, at + 1);
        if (end == at + 1) return fail_at(p, end, "a digit must follow the decimal point"), 0;
        at = end;
    }
    if (at < p->len && (p->s[at] == 'e' || p->s[at] == 'E')) {
        at++;
        if (at < p->len && (p->s[at] == '+' || p->s[at] == '-')) at++;
        size_t end = skip_digits(p, at);
        if (end == at) return fail_at(p, at, "a digit must follow the exponent's 'e'"), 0;
        at = end;
    }
    return at;
}

// The number's text is kept (NUL-terminated, for strtod and json_is_int). Underflow reads as the
// nearest double (0 or a subnormal); overflow to infinity is refused.
static int parse_number(Parser *p, JsonValue *v) {
    size_t start = p->pos, end = number_end(p);
    if (!end) return -1;
    size_t n = end - start;
    if (n > INT_MAX - 1) return fail_at(p, start, "a number of more than %d characters", INT_MAX - 1);
    char *text = arena_alloc(&p->arena, n + 1), *stop;
    memcpy(text, p->s + start, n);
    text[n] = '\0';
    double x = strtod(text, &stop);
    if (stop != text + n) return fail_at(p, start, "strtod did not read the number %.40s (a locale with another decimal point?)", text);
    if (isinf(x)) return fail_at(p, start, "the number %.40s%s is too large for a double", text, n > 40 ? "..." : "");
    *v = (JsonValue){.type = JSON_NUMBER, .n = (int)n, .number = x, .str = text};
    p->pos = end;
    return 0;
}

// ---------------------------------------------------------------- strings
// The length of the valid UTF-8 sequence at s (avail bytes), or 0. Unicode's table 3-7: no
// overlong forms (C0, C1, E0 80-9F, F0 80-8F), no surrogates (ED A0-BF), nothing past U+10FFFF.
static int utf8_len(const unsigned char *s, size_t avail) {
    unsigned char c = s[0], lo = 0x80, hi = 0xBF;   // lo, hi: the second byte's range
    size_t n;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return 0;
    if (avail < n || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return (int)n;
}

static int utf8_encode(unsigned cp, char *out) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) return out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | (cp >> 6 & 0x3F)), out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18), out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F)), out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// Four hex digits at `at` (before end) as *cp: 0, or -1.
static int hex4(const Parser *p, size_t at, size_t end, unsigned *cp) {
    if (end - at < 4) return -1;
    *cp = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p->s[at + i];
        int d = is_digit(c) ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
        if (d < 0) return -1;
        *cp = *cp << 4 | (unsigned)d;
    }
    return 0;
}

// \uXXXX at *at (the backslash), with its low surrogate if it is a high one, appended as UTF-8.
static int unescape_u(Parser *p, size_t *at, size_t end, char *dst, size_t *n) {
    unsigned cp, low;
    if (hex4(p, *at + 2, end, &cp)) return fail_at(p, *at, "\\u must be followed by four hex digits");
    if (cp >= 0xDC00 && cp <= 0xDFFF) return fail_at(p, *at, "lone low surrogate \\u%04X (no high surrogate before it)", cp);
    *at += 6;
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (end - *at < 2 || p->s[*at] != '\\' || p->s[*at + 1] != 'u' || hex4(p, *at + 2, end, &low) || low < 0xDC00 || low > 0xDFFF)
            return fail_at(p, *at - 6, "lone high surrogate \\u%04X (not followed by a low surrogate \\uDC00-\\uDFFF)", cp);
        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);   // the pair's code point
        *at += 6;
    }
    *n += utf8_encode(cp, dst + *n);
    return 0;
}

static int unescape(Parser *p, size_t *at, size_t end, char *dst, size_t *n) {
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    unsigned char c = p->s[*at + 1];   // before end: the scan for the closing quote skipped it
    const char *k = c ? memchr(from, c, 8) : NULL;
    if (k) {
        dst[(*n)++] = to[k - from];
        *at += 2;
        return 0;
    }
    if (c == 'u') return unescape_u(p, at, end, dst, n);
    char buf[16];
    return fail_at(p, *at, "invalid escape: backslash followed by %s", describe(p, *at + 1, buf));
}

// The closing quote of the string opening at `open`: an escaped character is never one.
static size_t string_end(const Parser *p, size_t open) {
    for (size_t at = open + 1; at < p->len; at++) {
        if (p->s[at] == '"') return at;
        if (p->s[at] == '\\') at++;
    }
    return 0;
}

// A string at p->pos, unescaped into the arena: escapes only shorten, so its raw length is room.
static int parse_string(Parser *p, const char **out, int *out_len) {
    size_t open = p->pos, end = string_end(p, open), n = 0, at = open + 1;
    if (!end) return fail_at(p, open, "string without a closing '\"'");
    if (end - open > INT_MAX) return fail_at(p, open, "a string of more than %d bytes", INT_MAX - 1);
    char *dst = arena_alloc(&p->arena, end - open);
    while (at < end) {
        unsigned char c = p->s[at];
        int k;
        if (c >= 0x20 && c < 0x80 && c != '\\') {   // most bytes: copied as they are
            dst[n++] = (char)c, at++;
        } else if (c == '\\') {
            if (unescape(p, &at, end, dst, &n)) return -1;
        } else if (c < 0x20) {
            return fail_at(p, at, "control character 0x%02X in a string (it must be escaped)", c);
        } else if (!(k = utf8_len(p->s + at, end - at))) {
            return fail_at(p, at, "invalid UTF-8 in a string (byte 0x%02X)", c);
        } else {
            memcpy(dst + n, p->s + at, k);
            n += k, at += k;
        }
    }
    dst[n] = '\0';
    arena_trim(p->arena, dst, n + 1);
    *out = dst;
    *out_len = (int)n;
    p->pos = end + 1;
    return 0;
}

// ---------------------------------------------------------------- arrays and objects
static int parse_value(Parser *p, JsonValue *v);

// Moves the children above `base` (and their keys above key_base) into the arena as v's.
static int close_container(Parser *p, JsonValue *v, JsonType type, size_t open, size_t base, size_t key_base) {
    size_t n = p->n_vals - base;
    if (n > INT_MAX) return fail_at(p, open, "more than %d elements", INT_MAX);
    *v = (JsonValue){.type = type, .n = (int)n};
    if (n) {
        v->items = arena_alloc(&p->arena, n * sizeof(JsonValue));
        memcpy(v->items, p->vals + base, n * sizeof(JsonValue));
    }
    if (n && type == JSON_OBJECT) {
        const char **keys = arena_alloc(&p->arena, n * sizeof(char *));
        int *lens = arena_alloc(&p->arena, n * sizeof(int));
        memcpy(keys, p->keys + key_base, n * sizeof(char *));
        memcpy(lens, p->key_lens + key_base, n * sizeof(int));
        v->keys = keys, v->key_len = lens;
    }
    p->n_vals = base, p->n_keys = key_base;
    return 0;
}

// After an element: 1 at the closing bracket, 0 at a comma followed by another element, -1.
// what: the message's "expected ..." when neither follows.
static int next_element(Parser *p, char close, const char *what) {
    skip_ws(p);
    if (at_char(p, close)) return p->pos++, 1;
    if (!at_char(p, ',')) return expected(p, what);
    p->pos++;
    skip_ws(p);
    if (at_char(p, close)) return fail_at(p, p->pos, "trailing comma before '%c'", close);
    return 0;
}

static int parse_array(Parser *p, JsonValue *v) {
    size_t open = p->pos++, base = p->n_vals;
    skip_ws(p);
    int done = at_char(p, ']') ? (p->pos++, 1) : 0;
    while (!done) {
        JsonValue item;
        if (parse_value(p, &item)) return -1;
        push_value(p, &item);
        if ((done = next_element(p, ']', "',' or ']' after an array element")) < 0) return -1;
    }
    return close_container(p, v, JSON_ARRAY, open, base, p->n_keys);
}

static int parse_member(Parser *p) {
    const char *key;
    int key_len;
    JsonValue item;
    if (!at_char(p, '"')) return expected(p, "a string key");
    if (parse_string(p, &key, &key_len)) return -1;
    skip_ws(p);
    if (!at_char(p, ':')) return expected(p, "':' after the key");
    p->pos++;
    if (parse_value(p, &item)) return -1;
    push_key(p, key, key_len);
    push_value(p, &item);
    return 0;
}

static int parse_object(Parser *p, JsonValue *v) {
    size_t open = p->pos++, base = p->n_vals, key_base = p->n_keys;
    skip_ws(p);
    int done = at_char(p, '}') ? (p->pos++, 1) : 0;
    while (!done) {
        if (parse_member(p)) return -1;
        if ((done = next_element(p, '}', "',' or '}' after an object member")) < 0) return -1;
    }
    return close_container(p, v, JSON_OBJECT, open, base, key_base);
}

static int parse_container(Parser *p, JsonValue *v) {
    if (p->depth == JSON_MAX_DEPTH) return fail_at(p, p->pos, "arrays and objects nested deeper than %d levels", JSON_MAX_DEPTH);
    p->depth++;
    int rc = at_char(p, '[') ? parse_array(p, v) : parse_object(p, v);
    p->depth--;
    return rc;
}

static int parse_value(Parser *p, JsonValue *v) {
    skip_ws(p);
    unsigned char c = p->pos < p->len ? p->s[p->pos] : 0;
    switch (c) {
    case '[': case '{': return parse_container(p, v);
    case '"': *v = (JsonValue){.type = JSON_STRING}; return parse_string(p, &v->str, &v->n);
    case 't': return parse_literal(p, v, "true", JSON_TRUE);
    case 'f': return parse_literal(p, v, "false", JSON_FALSE);
    case 'n': return parse_literal(p, v, "null", JSON_NULL);
    default:
        if (c == '-' || is_digit(c)) return parse_number(p, v);
        return expected(p, "a value");
    }
}

// ---------------------------------------------------------------- API
int json_parse(const char *text, size_t len, Json *doc, char *err) {
    Parser p = {.s = (const unsigned char *)text, .len = len, .err = err};
    JsonValue root;
    memset(doc, 0, sizeof *doc);
    if (len > SIZE_MAX / 8) return snprintf(err, ERR_LEN, "line 1, column 1: %zu bytes is too long", len), -1;
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) p.pos = 3;   // RFC 8259 lets a parser skip a BOM
    skip_ws(&p);
    if (p.pos == len) return fail_at(&p, p.pos, "no JSON value (the input is empty or only whitespace)");
    // Most documents fit the first block: strings take about their length, values 48 bytes each.
    arena_block(&p.arena, len + len / 2 + MIN_BLOCK);
    int rc = parse_value(&p, &root);
    skip_ws(&p);
    if (rc == 0 && p.pos < len) rc = expected(&p, "the end of the input after the value");
    if (rc == 0) {
        doc->root = arena_alloc(&p.arena, sizeof root);
        *doc->root = root;
        doc->arena = p.arena;
    } else {
        arena_free(p.arena);
    }
    free(p.vals);
    free(p.keys);
    free(p.key_lens);
    return rc;
}

void json_free(Json *doc) {
    arena_free(doc->arena);
    doc->arena = NULL;
    doc->root = NULL;
}

const JsonValue *json_get(const JsonValue *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT) return NULL;
    size_t len = strlen(key);
    for (int i = obj->n - 1; i >= 0; i--)   // from the end: the last duplicate wins
        if ((size_t)obj->key_len[i] == len && memcmp(obj->keys[i], key, len) == 0) return &obj->items[i];
    return NULL;
}

// ---------------------------------------------------------------- exact integers
// The number text t (valid JSON grammar) as an integer: its sign and magnitude (< 10^19), or -1
// when it has a fractional part or is at least 10^19. Its digits, integer part then fraction, are
// taken with trailing zeros moved into the exponent: value = digits[first..last] * 10^e.
static int text_integer(const char *t, int *neg, unsigned long long *mag) {
    *neg = *t == '-';
    t += *neg;
    const char *ip = t, *fp = t;
    size_t n_int = strspn(ip, "0123456789"), n_frac = 0;
    t += n_int;
    if (*t == '.') fp = ++t, n_frac = strspn(fp, "0123456789"), t += n_frac;
    long long exp = 0;
    if (*t == 'e' || *t == 'E') {
        int eneg = *++t == '-';
        t += *t == '-' || *t == '+';
        for (; is_digit(*t); t++)
            if (exp < 1000000000000LL) exp = exp * 10 + (*t - '0');   // beyond any text's length
        if (eneg) exp = -exp;
    }
    size_t total = n_int + n_frac, first = 0, last = total;
#define DIGIT(i) ((i) < n_int ? ip[i] : fp[(i) - n_int])
    while (first < total && DIGIT(first) == '0') first++;
    *mag = 0;
    if (first == total) return 0;   // zero, however written
    while (DIGIT(last - 1) == '0') last--;
    long long e = exp - (long long)n_frac + (long long)(total - last);
    if (e < 0) return -1;                                 // a fractional part remains
    if ((long long)(last - first) + e > 19) return -1;    // at least 10^19
    for (size_t i = first; i < last; i++) *mag = *mag * 10 + (unsigned)(DIGIT(i) - '0');
    for (; e > 0; e--) *mag *= 10;   // 19 digits at most: below 2^64
#undef DIGIT
    return 0;
}

// Numbers not made by json_parse (no text): exact only up to 2^53.
static int double_is_int(double x, long long lo, long long hi) {
    if (!(x >= -0x1p53 && x <= 0x1p53) || x != (double)(long long)x) return 0;
    return (long long)x >= lo && (long long)x <= hi;
}

int json_is_int(const JsonValue *v, long long lo, long long hi) {
    int neg;
    unsigned long long mag;
    if (!v || v->type != JSON_NUMBER || lo > hi) return 0;
    if (!v->str) return double_is_int(v->number, lo, hi);
    if (text_integer(v->str, &neg, &mag)) return 0;
    if (!neg) return mag <= (unsigned long long)LLONG_MAX && (long long)mag >= lo && (long long)mag <= hi;
    if (mag > (unsigned long long)LLONG_MAX + 1) return 0;
    long long x = mag == (unsigned long long)LLONG_MAX + 1 ? LLONG_MIN : -(long long)mag;
    return x >= lo && x <= hi;
}
