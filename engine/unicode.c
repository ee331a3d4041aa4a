// unicode.c: UTF-8, character classes by binary search of generated range tables, and NFC.
#include "unicode.h"

#include <stdlib.h>
#include <string.h>

#include "unicode_tables.h"
#include "util.h"

// ---------------------------------------------------------------- UTF-8
// The well-formed sequences (Unicode's Table 3-7): the second byte's range depends on the first,
// which rules out overlong forms, surrogates and code points past U+10FFFF.
int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char c = s[0];
    *cp = UNI_BAD | c;
    if (c < 0x80) return *cp = c, 1;
    int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0xC2 || c > 0xF4) return 1;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
    if (n < (size_t)len || s[1] < lo || s[1] > hi) return 1;
    uint32_t v = c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 1;
        v = v << 6 | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

int utf8_encode(uint32_t cp, unsigned char *out) {
    if (cp >= UNI_BAD) return out[0] = (unsigned char)(cp & 0xFF), 1;
    if (cp < 0x80) return out[0] = (unsigned char)cp, 1;
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | cp >> 6), out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | cp >> 12), out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | cp >> 18), out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F)), out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

// ---------------------------------------------------------------- classes
static int in_ranges(const UniRange *r, int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < r[mid].lo) hi = mid - 1;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return 1;
    }
    return 0;
}

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

// ASCII answers without a search: it is most of most text.
int uni_is_letter(uint32_t cp) {
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    return in_ranges(uni_letter, COUNT(uni_letter), cp);
}

int uni_is_number(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return in_ranges(uni_number, COUNT(uni_number), cp);
}

int uni_is_space(uint32_t cp) {
    if (cp < 0x80) return cp == ' ' || (cp >= '\t' && cp <= '\r');
    return in_ranges(uni_space, COUNT(uni_space), cp);
}

int uni_is_numeric(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return in_ranges(uni_rust_numeric, COUNT(uni_rust_numeric), cp);
}

int uni_is_word(uint32_t cp) {
    if (cp < 0x80) return cp == '_' || uni_is_letter(cp) || uni_is_number(cp);
    return in_ranges(uni_word, COUNT(uni_word), cp);
}

// ---------------------------------------------------------------- NFC
// Hangul syllables decompose and compose by arithmetic (Unicode 3.12), not by table.
enum { S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7, L_COUNT = 19, V_COUNT = 21,
       T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT, S_COUNT = L_COUNT * N_COUNT };

static uint32_t ccc(uint32_t cp) {
    if (cp < 0x300 || cp >= UNI_BAD) return 0;
    int lo = 0, hi = COUNT(uni_ccc) - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < uni_ccc[mid].lo) hi = mid - 1;
        else if (cp > uni_ccc[mid].hi) lo = mid + 1;
        else return uni_ccc[mid].ccc;
    }
    return 0;
}

static const UniDecomp *decomp_of(uint32_t cp) {
    int lo = 0, hi = COUNT(uni_decomp) - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < uni_decomp[mid].cp) hi = mid - 1;
        else if (cp > uni_decomp[mid].cp) lo = mid + 1;
        else return &uni_decomp[mid];
    }
    return NULL;
}

// The primary composite of a and b, or 0.
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE && b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    int lo = 0, hi = COUNT(uni_comp) - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const UniComp *c = &uni_comp[mid];
        if (a < c->a || (a == c->a && b < c->b)) hi = mid - 1;
        else if (a > c->a || b > c->b) lo = mid + 1;
        else return c->cp;
    }
    return 0;
}

// Appends the full canonical decomposition of cp (at most 4 code points for any cp).
static void decompose(uint32_t cp, uint32_t *out, size_t *n) {
    if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
        uint32_t s = cp - S_BASE;
        out[(*n)++] = L_BASE + s / N_COUNT;
        out[(*n)++] = V_BASE + s % N_COUNT / T_COUNT;
        if (s % T_COUNT) out[(*n)++] = T_BASE + s % T_COUNT;
        return;
    }
    const UniDecomp *d = cp >= 0xC0 && cp < UNI_BAD ? decomp_of(cp) : NULL;
    if (!d) {
        out[(*n)++] = cp;
        return;
    }
    decompose(d->a, out, n);
    if (d->b) decompose(d->b, out, n);
}

// Canonical ordering: each run of non-starters sorted by combining class, stably (insertion sort:
// runs are a few marks long).
static void reorder(uint32_t *cps, size_t n) {
    for (size_t i = 1; i < n; i++) {
        uint32_t c = cps[i], k = ccc(c);
        size_t j = i;
        while (k && j > 0 && ccc(cps[j - 1]) > k) cps[j] = cps[j - 1], j--;
        cps[j] = c;
    }
}

// Canonical composition: a character joins the last starter unless something between them has a
// combining class of 0 or as high as its own (it is blocked). After reordering, what lies between
// is sorted by class, so the last of it decides.
static size_t recompose(uint32_t *cps, size_t n) {
    size_t out = 0;
    long starter = -1;
    uint32_t last_ccc = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t c = cps[i], k = ccc(c);
        if (starter >= 0 && ((size_t)starter == out - 1 || (last_ccc && last_ccc < k))) {
            uint32_t comp = compose(cps[starter], c);
            if (comp) {
                cps[starter] = comp;
                continue;
            }
        }
        if (k == 0) starter = (long)out;
        last_ccc = k;
        cps[out++] = c;
    }
    return out;
}

char *uni_nfc(const char *s, size_t n, size_t *out_len) {
    const unsigned char *u = (const unsigned char *)s;
    uint32_t *cps = xcalloc(4 * n + 4, sizeof(uint32_t));
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += utf8_decode(u + i, n - i, &cp);
        decompose(cp, cps, &m);
    }
    reorder(cps, m);
    m = recompose(cps, m);
    unsigned char *out = xcalloc(4 * m + 1, 1);
    size_t len = 0;
    for (size_t i = 0; i < m; i++) len += utf8_encode(cps[i], out + len);
    free(cps);
    *out_len = len;
    return (char *)out;
}
