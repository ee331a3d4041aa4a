// gguf.c: the GGUF reader (gguf.h): ggml's type table, FP16/BF16 conversion, dequantization of
// each supported block type, then the parser, which validates the whole file before use, and the
// metadata lookups.
#include "gguf.h"
#include "half.h"   // f16_to_f32, bf16_to_f32: exact (a signalling NaN comes back quiet)

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"   // ERR_LEN

// Dequantization must round as ggml's reference C does: x*d + m is two roundings, never one
// fused multiply-add (gcc contracts across statements with -std=gnu11 where FMA is available).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

// ----------------------------------------------------------------------------
// Scalars: little-endian fields at any alignment, FP16 and BF16

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t le32(const uint8_t *p) { return (uint32_t)le16(p) | (uint32_t)le16(p + 2) << 16; }
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

// ----------------------------------------------------------------------------
// Dequantization, one function per block type: nb blocks at b -> nb * block_size floats at y.
// The layouts are ggml's (ggml-common.h); d, m, dmin are FP16; QK_K = 256.

static void deq_f32(const uint8_t *b, float *y, int64_t nb) { memcpy(y, b, (size_t)nb * 4); }

static void deq_f16(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) y[i] = f16_to_f32(le16(b + 2 * i));
}

static void deq_bf16(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) y[i] = bf16_to_f32(le16(b + 2 * i));
}

// Q4_0 (18 bytes / 32): d, qs[16]. Weight j < 16 is the low nibble of qs[j], j + 16 the high one;
// w = (nibble - 8) * d.
static void deq_q4_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 18, y += 32) {
        float d = f16_to_f32(le16(b));
        for (int j = 0; j < 16; j++) {
            y[j] = ((b[2 + j] & 0x0f) - 8) * d;
            y[j + 16] = ((b[2 + j] >> 4) - 8) * d;
        }
    }
}

// Q4_1 (20 bytes / 32): d, m, qs[16]; nibbles as Q4_0, w = nibble * d + m.
static void deq_q4_1(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 20, y += 32) {
        float d = f16_to_f32(le16(b)), m = f16_to_f32(le16(b + 2));
        for (int j = 0; j < 16; j++) {
            y[j] = (b[4 + j] & 0x0f) * d + m;
            y[j + 16] = (b[4 + j] >> 4) * d + m;
        }
    }
}

// Q5_0 (22 bytes / 32): d, qh (u32: bit j is weight j's fifth bit), qs[16] as Q4_0;
// w = (q5 - 16) * d.
static void deq_q5_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 22, y += 32) {
        float d = f16_to_f32(le16(b));
        uint32_t qh = le32(b + 2);
        for (int j = 0; j < 16; j++) {
            int lo = (b[6 + j] & 0x0f) | ((qh >> j) & 1) << 4, hi = (b[6 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
            y[j] = (lo - 16) * d;
            y[j + 16] = (hi - 16) * d;
        }
    }
}

// Q5_1 (24 bytes / 32): d, m, qh, qs[16]; w = q5 * d + m.
static void deq_q5_1(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 24, y += 32) {
        float d = f16_to_f32(le16(b)), m = f16_to_f32(le16(b + 2));
        uint32_t qh = le32(b + 4);
        for (int j = 0; j < 16; j++) {
            int lo = (b[8 + j] & 0x0f) | ((qh >> j) & 1) << 4, hi = (b[8 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
            y[j] = lo * d + m;
            y[j + 16] = hi * d + m;
        }
    }
}

// Q8_0 (34 bytes / 32): d, int8 qs[32]; w = q * d.
static void deq_q8_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 34, y += 32) {
        float d = f16_to_f32(le16(b));
        for (int j = 0; j < 32; j++) y[j] = (int8_t)b[2 + j] * d;
    }
}

// Q4_K and Q5_K pack 8 six-bit scales and 8 six-bit mins, one pair per 32 weights, into 12 bytes:
// for j < 4 the scale is the low 6 bits of q[j] and the min those of q[j + 4]; for j >= 4 the low
// 4 bits are the nibbles of q[j + 4] (scale low, min high) and the top 2 the spare top bits of
// q[j - 4] (scale) and q[j] (min).
static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | (q[j - 4] >> 6) << 4;
        *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

// Q4_K (144 bytes / 256): d, dmin, scales[12], qs[128]. Each 32 bytes of qs hold 64 weights: the
// low nibbles the first 32 (sub-block 2k), the high ones the next (2k + 1);
// w = (d * scale) * nibble - dmin * min.
static void deq_q4_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 144) {
        float d = f16_to_f32(le16(b)), dmin = f16_to_f32(le16(b + 2));
        const uint8_t *q = b + 16;
        for (int k = 0; k < 4; k++, q += 32, y += 64) {
            int sc0, m0, sc1, m1;
            scale_min_k4(2 * k, b + 4, &sc0, &m0);
            scale_min_k4(2 * k + 1, b + 4, &sc1, &m1);
            float d0 = d * sc0, min0 = dmin * m0, d1 = d * sc1, min1 = dmin * m1;
            for (int l = 0; l < 32; l++) y[l] = d0 * (q[l] & 0x0f) - min0;
            for (int l = 0; l < 32; l++) y[l + 32] = d1 * (q[l] >> 4) - min1;
        }
    }
}

// Q5_K (176 bytes / 256): d, dmin, scales[12], qh[32], qs[128]; as Q4_K with a fifth bit from
// qh[l]: bit 2k for the low nibbles of chunk k, bit 2k + 1 for the high ones.
static void deq_q5_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 176) {
        float d = f16_to_f32(le16(b)), dmin = f16_to_f32(le16(b + 2));
        const uint8_t *qh = b + 16, *q = b + 48;
        for (int k = 0; k < 4; k++, q += 32, y += 64) {
            int sc0, m0, sc1, m1;
            scale_min_k4(2 * k, b + 4, &sc0, &m0);
            scale_min_k4(2 * k + 1, b + 4, &sc1, &m1);
            float d0 = d * sc0, min0 = dmin * m0, d1 = d * sc1, min1 = dmin * m1;
            for (int l = 0; l < 32; l++) y[l] = d0 * ((q[l] & 0x0f) | ((qh[l] >> (2 * k)) & 1) << 4) - min0;
            for (int l = 0; l < 32; l++) y[l + 32] = d1 * ((q[l] >> 4) | ((qh[l] >> (2 * k + 1)) & 1) << 4) - min1;
        }
    }
}

// Q6_K (210 bytes / 256): ql[128], qh[64], int8 scales[16], d. Each half of 128 weights takes 64
// bytes of ql and 32 of qh: weight l + 32 s (s = 0..3, l < 32) has low 4 bits from ql[l + 32 (s & 1)]
// (low nibble for s < 2, high for s >= 2), high 2 bits from qh[l] bits 2s..2s+1, and the scale
// scales[l / 16 + 2 s]; w = (d * scale) * (q6 - 32).
static void deq_q6_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 210) {
        float d = f16_to_f32(le16(b + 208));
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, y += 128)
            for (int s = 0; s < 4; s++)
                for (int l = 0; l < 32; l++) {
                    int lo = s < 2 ? ql[l + 32 * s] & 0x0f : ql[l + 32 * (s - 2)] >> 4;
                    int q6 = (lo | ((qh[l] >> (2 * s)) & 3) << 4) - 32;
                    y[l + 32 * s] = d * sc[l / 16 + 2 * s] * q6;
                }
    }
}

// ----------------------------------------------------------------------------
// ggml's types: every id ggml has used, with its block shape; `deq` set where we decode it.

typedef void (*DequantFn)(const uint8_t *blocks, float *y, int64_t nb);
typedef struct {
    const char *name;
    int block, size;   // elements and bytes per block; 0 for ids ggml removed
    DequantFn deq;
} TypeInfo;

#define QK_K 256
static const TypeInfo types[] = {
    [0] = {"F32", 1, 4, deq_f32},           [1] = {"F16", 1, 2, deq_f16},
    [2] = {"Q4_0", 32, 18, deq_q4_0},       [3] = {"Q4_1", 32, 20, deq_q4_1},
    [4] = {"Q4_2", 0, 0, NULL},             [5] = {"Q4_3", 0, 0, NULL},
    [6] = {"Q5_0", 32, 22, deq_q5_0},       [7] = {"Q5_1", 32, 24, deq_q5_1},
    [8] = {"Q8_0", 32, 34, deq_q8_0},       [9] = {"Q8_1", 32, 40, NULL},
    [10] = {"Q2_K", QK_K, 84, NULL},        [11] = {"Q3_K", QK_K, 110, NULL},
    [12] = {"Q4_K", QK_K, 144, deq_q4_k},   [13] = {"Q5_K", QK_K, 176, deq_q5_k},
    [14] = {"Q6_K", QK_K, 210, deq_q6_k},   [15] = {"Q8_K", QK_K, 292, NULL},
    [16] = {"IQ2_XXS", QK_K, 66, NULL},     [17] = {"IQ2_XS", QK_K, 74, NULL},
    [18] = {"IQ3_XXS", QK_K, 98, NULL},     [19] = {"IQ1_S", QK_K, 50, NULL},
    [20] = {"IQ4_NL", 32, 18, NULL},        [21] = {"IQ3_S", QK_K, 110, NULL},
    [22] = {"IQ2_S", QK_K, 82, NULL},       [23] = {"IQ4_XS", QK_K, 136, NULL},
    [24] = {"I8", 1, 1, NULL},              [25] = {"I16", 1, 2, NULL},
    [26] = {"I32", 1, 4, NULL},             [27] = {"I64", 1, 8, NULL},
    [28] = {"F64", 1, 8, NULL},             [29] = {"IQ1_M", QK_K, 56, NULL},
    [30] = {"BF16", 1, 2, deq_bf16},        [31] = {"Q4_0_4_4", 0, 0, NULL},
    [32] = {"Q4_0_4_8", 0, 0, NULL},        [33] = {"Q4_0_8_8", 0, 0, NULL},
    [34] = {"TQ1_0", QK_K, 54, NULL},       [35] = {"TQ2_0", QK_K, 66, NULL},
    [36] = {"IQ4_NL_4_4", 0, 0, NULL},      [37] = {"IQ4_NL_4_8", 0, 0, NULL},
    [38] = {"IQ4_NL_8_8", 0, 0, NULL},      [39] = {"MXFP4", 32, 17, NULL},
    [40] = {"NVFP4", 64, 36, NULL},         [41] = {"Q1_0", 128, 18, NULL},
};
#define N_TYPES (int)(sizeof types / sizeof types[0])
#define SUPPORTED "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K"

static const TypeInfo *type_info(int type) { return type >= 0 && type < N_TYPES ? &types[type] : NULL; }
const char *ggml_type_name(int type) { return type_info(type) ? types[type].name : "unknown"; }
int ggml_block_size(int type) { return type_info(type) ? types[type].block : 0; }
int ggml_type_size(int type) { return type_info(type) ? types[type].size : 0; }

const char *gguf_type_name(int type) {
    static const char *const names[GGUF_TYPE_COUNT] = {
        "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
        "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64"};
    return type >= 0 && type < GGUF_TYPE_COUNT ? names[type] : "unknown";
}

// Bytes of one value of a fixed-size metadata type; 0 for STRING and ARRAY.
static int value_size(int type) {
    static const int8_t size[GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return size[type];
}

// A name as messages show it: at most 100 bytes, control bytes as '?', so that every message
// stays one line whatever bytes a key or tensor name holds.
static const char *shown(const char *name, char buf[101]) {
    size_t i = 0;
    for (; name[i] && i < 100; i++) buf[i] = (uint8_t)name[i] < 0x20 || name[i] == 0x7f ? '?' : name[i];
    buf[i] = '\0';
    return buf;
}

// ----------------------------------------------------------------------------
// Reading rows

static int row_check(const GgufTensor *t, int64_t row, int type, char *err) {
    const TypeInfo *ti = type_info(t->type);
    char name[101];
    if (!ti || !ti->deq || (type >= 0 && t->type != type)) {
        snprintf(err, ERR_LEN, "%.200s: tensor %s: type %s cannot be read this way", t->path, shown(t->name, name),
                 ggml_type_name(t->type));
        return -1;
    }
    if (row < 0 || row >= t->rows) {
        snprintf(err, ERR_LEN, "%.200s: tensor %s: row %lld is outside [0, %lld)", t->path, shown(t->name, name),
                 (long long)row, (long long)t->rows);
        return -1;
    }
    return 0;
}

int gguf_read_row(const GgufTensor *t, int64_t row, float *out, char *err) {
    if (row_check(t, row, -1, err)) return -1;
    const TypeInfo *ti = &types[t->type];
    ti->deq((const uint8_t *)t->data + (size_t)row * t->row_bytes, out, t->ne[0] / ti->block);
    return 0;
}

int gguf_read_row_q8_0(const GgufTensor *t, int64_t row, float *scales, int8_t *q, char *err) {
    if (row_check(t, row, GGML_TYPE_Q8_0, err)) return -1;
    const uint8_t *b = (const uint8_t *)t->data + (size_t)row * t->row_bytes;
    for (int64_t i = 0; i < t->ne[0] / GGML_QK8_0; i++, b += 34) {
        scales[i] = f16_to_f32(le16(b));
        memcpy(q + i * GGML_QK8_0, b + 2, GGML_QK8_0);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Parsing: a cursor over the mapped file that refuses to step past its end

typedef struct {
    const uint8_t *p;   // the mapped file
    size_t size, at;    // its size; the read position
    const char *path;
    char *err;
    char what[160];     // what is being read, for messages: "metadata key general.name"
} Cur;

__attribute__((format(printf, 2, 3))) static int fail(Cur *c, const char *fmt, ...) {
    char msg[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->err, ERR_LEN, "%.200s: %.300s", c->path, msg);
    return -1;
}

// The next n bytes, or NULL (and a message) where the file ends first.
static const uint8_t *take(Cur *c, uint64_t n) {
    if (n > c->size - c->at) {
        fail(c, "truncated: %s needs %llu bytes at offset %zu, the file has %zu", c->what, (unsigned long long)n, c->at,
             c->size);
        return NULL;
    }
    c->at += n;
    return c->p + c->at - n;
}

static int read_u32(Cur *c, uint32_t *v) {
    const uint8_t *q = take(c, 4);
    if (q) *v = le32(q);
    return q ? 0 : -1;
}

static int read_u64(Cur *c, uint64_t *v) {
    const uint8_t *q = take(c, 8);
    if (q) *v = le64(q);
    return q ? 0 : -1;
}

static int read_str(Cur *c, GgufStr *s) {
    uint64_t n;
    const uint8_t *q;
    if (read_u64(c, &n) || !(q = take(c, n))) return -1;
    s->s = (const char *)q;
    s->len = n;
    return 0;
}

// Refuses a count of items of at least min_bytes each that cannot fit in the rest of the file:
// allocations sized by counts then stay below the file's size.
static int check_count(Cur *c, uint64_t n, uint64_t min_bytes, const char *items) {
    if (n <= (c->size - c->at) / min_bytes) return 0;
    return fail(c, "%s: %llu %s cannot fit in the %zu bytes left in the file", c->what, (unsigned long long)n, items,
                c->size - c->at);
}

// ----------------------------------------------------------------------------
// Names (keys, tensor names): NUL-terminated copies with a hash index

static uint64_t hash_name(const char *s) {   // FNV-1a
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int names_init(GgufNames *nm, uint64_t n) {
    size_t slots = 8;
    while (slots < 2 * n) slots *= 2;
    nm->names = calloc(n ? n : 1, sizeof *nm->names);
    nm->slot = calloc(slots, sizeof *nm->slot);
    nm->mask = slots - 1;
    return nm->names && nm->slot ? 0 : -1;
}

// The slot that holds `name`, or the empty slot where it would go.
static size_t names_slot(const GgufNames *nm, const char *name) {
    size_t s = hash_name(name) & nm->mask;
    while (nm->slot[s] && strcmp(nm->names[nm->slot[s] - 1], name)) s = (s + 1) & nm->mask;
    return s;
}

static int64_t names_find(const GgufNames *nm, const char *name) {
    if (!nm->slot) return -1;
    uint32_t e = nm->slot[names_slot(nm, name)];
    return e ? (int64_t)e - 1 : -1;
}

// Copies s as entry i; refuses a NUL inside it and a name seen before.
static int names_add(Cur *c, GgufNames *nm, uint64_t i, GgufStr s, const char *kind, const char **out) {
    if (memchr(s.s, 0, s.len)) return fail(c, "%s %llu: its name contains a NUL byte", kind, (unsigned long long)i);
    if (!(nm->names[i] = malloc(s.len + 1))) return fail(c, "out of memory");
    memcpy(nm->names[i], s.s, s.len);
    nm->names[i][s.len] = '\0';
    size_t slot = names_slot(nm, nm->names[i]);
    char name[101];
    if (nm->slot[slot]) return fail(c, "%s %s appears twice", kind, shown(nm->names[i], name));
    nm->slot[slot] = (uint32_t)i + 1;
    *out = nm->names[i];
    return 0;
}

static void names_free(GgufNames *nm, uint64_t n) {
    for (uint64_t i = 0; nm->names && i < n; i++) free(nm->names[i]);
    free(nm->names);
    free(nm->slot);
}

// ----------------------------------------------------------------------------
// Header and metadata

static int read_header(Cur *c, Gguf *g) {
    snprintf(c->what, sizeof c->what, "the header");
    const uint8_t *h = take(c, 4);
    uint32_t v;
    if (!h) return -1;
    if (memcmp(h, GGUF_MAGIC, 4))
        return fail(c, "not a GGUF file: it starts with %02x %02x %02x %02x, not \"GGUF\"", h[0], h[1], h[2], h[3]);
    if (read_u32(c, &v)) return -1;
    if (v == 0x02000000 || v == 0x03000000)
        return fail(c, "big-endian GGUF (version field 0x%08x); only little-endian files are supported", v);
    if (v != 2 && v != 3) return fail(c, "GGUF version %u is not supported (versions 2 and 3 are)", v);
    g->version = (int)v;
    if (read_u64(c, &g->n_tensors) || read_u64(c, &g->n_kv)) return -1;
    // a key-value pair takes at least 13 bytes (key length, type, a u8), a tensor info 24
    if (check_count(c, g->n_kv, 13, "metadata entries") || check_count(c, g->n_tensors, 24, "tensor infos")) return -1;
    if (g->n_kv > INT32_MAX || g->n_tensors > INT32_MAX) return fail(c, "more than 2^31 metadata entries or tensors");
    return 0;
}

static int read_strings(Cur *c, GgufKV *kv) {
    GgufStr *s = calloc(kv->n ? kv->n : 1, sizeof *s);
    if (!s) return fail(c, "out of memory for %llu strings", (unsigned long long)kv->n);
    kv->at = s;
    for (uint64_t i = 0; i < kv->n; i++)
        if (read_str(c, &s[i])) return -1;
    return 0;
}

// A value of kv->type: a scalar, a string, or an array of either (arrays of arrays are refused).
static int read_value(Cur *c, GgufKV *kv) {
    uint32_t elem = (uint32_t)kv->type;
    kv->n = 1;
    if (kv->type == GGUF_TYPE_ARRAY && (read_u32(c, &elem) || read_u64(c, &kv->n))) return -1;
    if (elem >= GGUF_TYPE_COUNT) return fail(c, "%s: value type %u is unknown", c->what, elem);
    if (elem == GGUF_TYPE_ARRAY) return fail(c, "%s: arrays of arrays are not supported", c->what);
    kv->elem_type = (int)elem;
    int size = value_size(kv->elem_type);
    if (check_count(c, kv->n, size ? (uint64_t)size : 8, "array elements")) return -1;
    if (kv->elem_type == GGUF_TYPE_STRING) return read_strings(c, kv);
    kv->at = take(c, kv->n * (uint64_t)size);
    return kv->at ? 0 : -1;
}

static int read_kv(Cur *c, Gguf *g, uint64_t i) {
    GgufKV *kv = &g->kv[i];
    GgufStr key;
    uint32_t type;
    snprintf(c->what, sizeof c->what, "metadata entry %llu", (unsigned long long)i);
    if (read_str(c, &key) || names_add(c, &g->kv_names, i, key, "metadata key", &kv->key)) return -1;
    char name[101];
    snprintf(c->what, sizeof c->what, "metadata key %s", shown(kv->key, name));
    if (read_u32(c, &type)) return -1;
    if (type >= GGUF_TYPE_COUNT) return fail(c, "%s: value type %u is unknown", c->what, type);
    kv->type = kv->elem_type = (int)type;
    return read_value(c, kv);
}

static int read_kvs(Cur *c, Gguf *g) {
    if (!(g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv)) || names_init(&g->kv_names, g->n_kv))
        return fail(c, "out of memory");
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (read_kv(c, g, i)) return -1;
    return 0;
}

static int read_alignment(Cur *c, Gguf *g) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!gguf_kv(g, "general.alignment")) return 0;
    uint32_t a;
    if (gguf_get_u32(g, "general.alignment", &a) || a == 0 || (a & (a - 1)))
        return fail(c, "metadata key general.alignment is not a power of two that fits in 32 bits");
    g->alignment = a;
    return 0;
}

// ----------------------------------------------------------------------------
// Tensor infos

static int read_dims(Cur *c, GgufTensor *t) {
    uint32_t n_dims;
    if (read_u32(c, &n_dims)) return -1;
    if (n_dims > GGUF_MAX_DIMS) return fail(c, "%s: n_dims = %u, at most %d are supported", c->what, n_dims, GGUF_MAX_DIMS);
    t->n_dims = (int)n_dims;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (int d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        if (read_u64(c, &ne)) return -1;
        if (ne == 0 || ne > INT64_MAX)
            return fail(c, "%s: dimension %d is %llu, not in [1, 2^63)", c->what, d, (unsigned long long)ne);
        t->ne[d] = (int64_t)ne;
    }
    return 0;
}

// The type must be one we decode; rows must be whole blocks; no size product may overflow.
static int size_tensor(Cur *c, GgufTensor *t, uint32_t type) {
    const TypeInfo *ti = type < (uint32_t)N_TYPES ? &types[type] : NULL;
    if (!ti) return fail(c, "%s: type id %u is unknown", c->what, type);
    if (!ti->deq) return fail(c, "%s: type %s is not supported (supported: " SUPPORTED ")", c->what, ti->name);
    t->type = (int)type;
    if (t->ne[0] % ti->block)
        return fail(c, "%s: row length ne[0] = %lld is not a multiple of %s's block size %d", c->what,
                    (long long)t->ne[0], ti->name, ti->block);
    uint64_t rows = 1, row_bytes, bytes;
    int overflow = __builtin_mul_overflow((uint64_t)t->ne[0] / ti->block, (uint64_t)ti->size, &row_bytes);
    for (int d = 1; d < GGUF_MAX_DIMS; d++) overflow |= __builtin_mul_overflow(rows, (uint64_t)t->ne[d], &rows);
    overflow |= __builtin_mul_overflow(rows, row_bytes, &bytes);
    if (overflow || bytes > c->size) return fail(c, "%s: its dimensions imply more bytes than the file holds", c->what);
    t->rows = (int64_t)rows;
    t->row_bytes = (size_t)row_bytes;
    t->bytes = (size_t)bytes;
    return 0;
}

static int read_tensor_info(Cur *c, Gguf *g, uint64_t i, uint64_t *offset) {
    GgufTensor *t = &g->tensors[i];
    GgufStr name;
    uint32_t type;
    t->path = g->path;
    snprintf(c->what, sizeof c->what, "tensor info %llu", (unsigned long long)i);
    if (read_str(c, &name) || names_add(c, &g->tensor_names, i, name, "tensor", &t->name)) return -1;
    char shown_name[101];
    snprintf(c->what, sizeof c->what, "tensor %s", shown(t->name, shown_name));
    if (read_dims(c, t) || read_u32(c, &type) || read_u64(c, offset)) return -1;
    return size_tensor(c, t, type);
}

// Points the tensor into the data section: its offset aligned, its bytes inside the file.
static int place_tensor(Cur *c, Gguf *g, GgufTensor *t, uint64_t offset) {
    size_t avail = c->size - g->data_offset;
    char name[101];
    if (offset % g->alignment)
        return fail(c, "tensor %s: offset %llu is not a multiple of the alignment %u", shown(t->name, name),
                    (unsigned long long)offset, g->alignment);
    if (offset > avail || t->bytes > avail - offset)
        return fail(c, "tensor %s: %zu bytes at offset %llu run past the end of the data section (%zu bytes)",
                    shown(t->name, name), t->bytes, (unsigned long long)offset, avail);
    t->data = c->p + g->data_offset + offset;
    return 0;
}

static int read_tensors(Cur *c, Gguf *g) {
    uint64_t *offset = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *offset);
    int rc = 0;
    if (!offset || !(g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors)) ||
        names_init(&g->tensor_names, g->n_tensors))
        rc = fail(c, "out of memory");
    for (uint64_t i = 0; rc == 0 && i < g->n_tensors; i++) rc = read_tensor_info(c, g, i, &offset[i]);
    g->data_offset = (c->at + g->alignment - 1) / g->alignment * g->alignment;
    if (rc == 0 && g->n_tensors && g->data_offset > c->size)
        rc = fail(c, "truncated: the data section would start at offset %zu, the file has %zu", g->data_offset, c->size);
    for (uint64_t i = 0; rc == 0 && i < g->n_tensors; i++) rc = place_tensor(c, g, &g->tensors[i], offset[i]);
    free(offset);
    return rc;
}

// ----------------------------------------------------------------------------
// Open and close

static int map_file(Gguf *g, const char *path, char *err) {
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0) {
        snprintf(err, ERR_LEN, "%.300s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        snprintf(err, ERR_LEN, "%.300s: not a regular file", path);
        return -1;
    }
    g->map_bytes = (size_t)st.st_size;
    if (g->map_bytes > 0 && (g->map = mmap(NULL, g->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED) {
        g->map = NULL;
        close(fd);
        snprintf(err, ERR_LEN, "%.300s: cannot mmap: %s", path, strerror(errno));
        return -1;
    }
    close(fd);
    return 0;
}

int gguf_open(Gguf *g, const char *path, char *err) {
    memset(g, 0, sizeof *g);
    if (map_file(g, path, err)) return -1;
    Cur c = {g->map, g->map_bytes, 0, path, err, ""};
    if (!(g->path = strdup(path))) {
        gguf_close(g);
        return fail(&c, "out of memory");
    }
    if (read_header(&c, g) || read_kvs(&c, g) || read_alignment(&c, g) || read_tensors(&c, g)) {
        gguf_close(g);
        return -1;
    }
    return 0;
}

void gguf_close(Gguf *g) {
    for (uint64_t i = 0; g->kv && i < g->n_kv; i++)
        if (g->kv[i].elem_type == GGUF_TYPE_STRING) free((void *)g->kv[i].at);
    free(g->kv);
    free(g->tensors);
    names_free(&g->kv_names, g->n_kv);
    names_free(&g->tensor_names, g->n_tensors);
    if (g->map) munmap(g->map, g->map_bytes);
    free(g->path);
    memset(g, 0, sizeof *g);
}

// ----------------------------------------------------------------------------
// Lookups

const GgufTensor *gguf_tensor(const Gguf *g, const char *name) {
    int64_t i = names_find(&g->tensor_names, name);
    return i < 0 ? NULL : &g->tensors[i];
}

const GgufKV *gguf_kv(const Gguf *g, const char *key) {
    int64_t i = names_find(&g->kv_names, key);
    return i < 0 ? NULL : &g->kv[i];
}

int gguf_kv_int(const GgufKV *kv, uint64_t i, int64_t *out) {
    if (!kv || i >= kv->n) return -1;
    const uint8_t *p = kv->at;
    switch (kv->elem_type) {
    case GGUF_TYPE_UINT8: *out = p[i]; return 0;
    case GGUF_TYPE_INT8: *out = (int8_t)p[i]; return 0;
    case GGUF_TYPE_UINT16: *out = le16(p + 2 * i); return 0;
    case GGUF_TYPE_INT16: *out = (int16_t)le16(p + 2 * i); return 0;
    case GGUF_TYPE_UINT32: *out = le32(p + 4 * i); return 0;
    case GGUF_TYPE_INT32: *out = (int32_t)le32(p + 4 * i); return 0;
    case GGUF_TYPE_INT64: *out = (int64_t)le64(p + 8 * i); return 0;
    case GGUF_TYPE_UINT64:
        if (le64(p + 8 * i) > INT64_MAX) return -1;
        *out = (int64_t)le64(p + 8 * i);
        return 0;
    }
    return -1;
}

int gguf_kv_float(const GgufKV *kv, uint64_t i, double *out) {
    if (!kv || i >= kv->n) return -1;
    const uint8_t *p = kv->at;
    if (kv->elem_type == GGUF_TYPE_FLOAT32) *out = bits_to_f32(le32(p + 4 * i));
    else if (kv->elem_type == GGUF_TYPE_FLOAT64) {
        uint64_t bits = le64(p + 8 * i);
        memcpy(out, &bits, 8);
    } else return -1;
    return 0;
}

GgufStr gguf_kv_str(const GgufKV *kv, uint64_t i) {
    GgufStr none = {NULL, 0};
    if (!kv || i >= kv->n || kv->elem_type != GGUF_TYPE_STRING) return none;
    return ((const GgufStr *)kv->at)[i];
}

// A scalar (not an array) entry of the key, or NULL.
static const GgufKV *scalar(const Gguf *g, const char *key) {
    const GgufKV *kv = gguf_kv(g, key);
    return kv && kv->type != GGUF_TYPE_ARRAY ? kv : NULL;
}

int gguf_get_u32(const Gguf *g, const char *key, uint32_t *out) {
    int64_t v;
    if (gguf_kv_int(scalar(g, key), 0, &v) || v < 0 || v > UINT32_MAX) return -1;
    *out = (uint32_t)v;
    return 0;
}

int gguf_get_f32(const Gguf *g, const char *key, float *out) {
    double v;
    if (gguf_kv_float(scalar(g, key), 0, &v)) return -1;
    *out = (float)v;
    return 0;
}

int gguf_get_bool(const Gguf *g, const char *key, int *out) {
    const GgufKV *kv = scalar(g, key);
    if (!kv || kv->type != GGUF_TYPE_BOOL) return -1;
    *out = *(const uint8_t *)kv->at != 0;
    return 0;
}

int gguf_get_str(const Gguf *g, const char *key, GgufStr *out) {
    const GgufKV *kv = scalar(g, key);
    if (!kv || kv->type != GGUF_TYPE_STRING) return -1;
    *out = gguf_kv_str(kv, 0);
    return 0;
}

int gguf_get_array(const Gguf *g, const char *key, int *elem_type, uint64_t *n, const void **at) {
    const GgufKV *kv = gguf_kv(g, key);
    if (!kv || kv->type != GGUF_TYPE_ARRAY) return -1;
    *elem_type = kv->elem_type;
    *n = kv->n;
    *at = kv->at;
    return 0;
}
