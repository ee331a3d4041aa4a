// test_gguf.c: tests of the GGUF reader (engine/gguf.c), standalone.
//   test_gguf [DATA_DIR [REGRESSIONS_DIR]]
//                                   the fixtures of tests/data/gguf (make.py), corrupted files
//                                   built here, and the fuzzer's kept inputs (default
//                                   tests/fuzz/regressions/gguf): prints one line per failed
//                                   check, then "gguf: N passed, N failed"; exits 1 if any failed
//   test_gguf --model M.gguf REF    a real model against `make.py reference M.gguf REF`: every
//                                   tensor dequantized (checksummed, first and last rows compared
//                                   bitwise), every string array; prints the timings
//   test_gguf --dump M.gguf         lists the metadata and tensors
// Build: gcc -O1 -g -std=gnu11 -Wall -Wextra -Wshadow -Wno-unused-parameter
//        -fsanitize=address,undefined -Iengine tests/test_gguf.c engine/gguf.c engine/util.c -lm
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "model.h"   // ERR_LEN
#include "util.h"

static int n_pass, n_fail;
static char tmpdir[64] = "/tmp/test_gguf.XXXXXX";

__attribute__((format(printf, 3, 4))) static int check(int ok, const char *name, const char *fmt, ...) {
    if (ok) {
        n_pass++;
        return 1;
    }
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL %s: ", name);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    n_fail++;
    return 0;
}

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f)) {
        fprintf(stderr, "test_gguf: cannot write %s\n", path);
        exit(1);
    }
}

// ----------------------------------------------------------------------------
// The fixtures: each type's tensors against gguf-py's dequantization, bit for bit

// Every row of every tensor, in file order, against the concatenated reference floats; stops at
// the first difference.
static int compare_tensor(const char *name, const GgufTensor *t, const float *ref, size_t ref_floats, size_t *at) {
    char err[ERR_LEN];
    float *row = xcalloc(t->ne[0], sizeof *row);
    int ok = 1;
    for (int64_t r = 0; ok && r < t->rows; r++, *at += t->ne[0]) {
        if (*at + t->ne[0] > ref_floats) ok = check(0, name, "the reference ends before tensor %s row %lld", t->name, (long long)r);
        else ok = check(gguf_read_row(t, r, row, err) == 0, name, "%s", err);
        int64_t j = 0;
        while (ok && j < t->ne[0] && float_bits(row[j]) == float_bits(ref[*at + j])) j++;
        if (ok && j < t->ne[0])
            ok = check(0, name, "tensor %s row %lld [%lld]: 0x%08x (%g), gguf-py 0x%08x (%g)", t->name, (long long)r,
                       (long long)j, float_bits(row[j]), row[j], float_bits(ref[*at + j]), ref[*at + j]);
    }
    free(row);
    return ok;
}

static void compare_rows(const char *name, const Gguf *g, const float *ref, size_t ref_floats) {
    size_t at = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (!compare_tensor(name, &g->tensors[i], ref, ref_floats, &at)) return;
    check(at == ref_floats, name, "%zu floats read, the reference has %zu", at, ref_floats);
}

// a is (4, ne0), b.weight is (2, 2, ne0): make.py's shapes
static void check_shapes(const char *name, const Gguf *g, int type) {
    const GgufTensor *a = gguf_tensor(g, "a"), *b = gguf_tensor(g, "b.weight");
    if (!check(a && b, name, "tensors a and b.weight not found")) return;
    check(a->type == type && b->type == type, name, "types %s, %s", ggml_type_name(a->type), ggml_type_name(b->type));
    check(a->n_dims == 2 && b->n_dims == 3 && b->ne[1] == 2 && b->ne[2] == 2 && b->ne[3] == 1 && b->rows == 4, name,
          "shapes: a n_dims %d, b n_dims %d ne %lld %lld %lld", a->n_dims, b->n_dims, (long long)b->ne[0],
          (long long)b->ne[1], (long long)b->ne[2]);
    check(a->bytes == (size_t)a->rows * a->row_bytes && a->row_bytes == (size_t)(a->ne[0] / ggml_block_size(type) * ggml_type_size(type)),
          name, "a: %zu bytes, %zu per row", a->bytes, a->row_bytes);
    check((size_t)((const uint8_t *)a->data - (const uint8_t *)g->map) % g->alignment == 0, name, "a's data is not aligned");
}

// Q8_0's raw rows: the scales and int8 weights give the same floats as gguf_read_row.
static void check_q8_0_raw(const Gguf *g) {
    const GgufTensor *t = gguf_tensor(g, "a");
    char err[ERR_LEN];
    float *row = xcalloc(t->ne[0], sizeof *row), *scales = xcalloc(t->ne[0] / 32, sizeof *scales);
    int8_t *q = xcalloc(t->ne[0], 1);
    int ok = 1;
    for (int64_t r = 0; r < t->rows; r++) {
        gguf_read_row(t, r, row, err);
        ok &= gguf_read_row_q8_0(t, r, scales, q, err) == 0;
        for (int64_t j = 0; j < t->ne[0]; j++) ok &= float_bits(q[j] * scales[j / 32]) == float_bits(row[j]);
    }
    check(ok, "q8_0 raw rows", "scales * q differ from gguf_read_row");
    const GgufTensor *f = gguf_tensor(g, "b.weight");
    check(gguf_read_row_q8_0(f, 99, scales, q, err) == -1 && strstr(err, "row 99 is outside [0, 4)"), "q8_0 raw rows",
          "row 99 accepted or message \"%s\"", err);
    free(row);
    free(scales);
    free(q);
}

static void test_type_fixture(const char *dir, const char *stem, int type) {
    char path[512], ref_path[512], err[ERR_LEN], name[64];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, stem);
    snprintf(ref_path, sizeof ref_path, "%s/%s.f32", dir, stem);
    snprintf(name, sizeof name, "fixture %s", stem);
    size_t ref_bytes;
    float *ref = (float *)read_file(ref_path, 1 << 22, &ref_bytes, err);
    Gguf g;
    if (!check(ref != NULL, name, "%s", err)) return;
    if (check(gguf_open(&g, path, err) == 0, name, "%s", err)) {
        check_shapes(name, &g, type);
        compare_rows(name, &g, ref, ref_bytes / 4);
        if (type == GGML_TYPE_Q8_0) check_q8_0_raw(&g);
        gguf_close(&g);
    }
    free(ref);
}

static void test_fixtures(const char *dir) {
    static const struct { const char *stem; int type; } fx[] = {
        {"f32", GGML_TYPE_F32},   {"f16", GGML_TYPE_F16},   {"bf16", GGML_TYPE_BF16}, {"q4_0", GGML_TYPE_Q4_0},
        {"q4_1", GGML_TYPE_Q4_1}, {"q5_0", GGML_TYPE_Q5_0}, {"q5_1", GGML_TYPE_Q5_1}, {"q8_0", GGML_TYPE_Q8_0},
        {"q4_k", GGML_TYPE_Q4_K}, {"q5_k", GGML_TYPE_Q5_K}, {"q6_k", GGML_TYPE_Q6_K},
    };
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) test_type_fixture(dir, fx[i].stem, fx[i].type);
}

// ----------------------------------------------------------------------------
// FP16 and BF16: all 65536 patterns against an independent computation

static float ref_half(uint16_t h) {
    int exp = (h >> 10) & 31, mant = h & 1023;
    float v = exp == 31 ? (mant ? NAN : INFINITY) : exp ? ldexpf((float)(mant + 1024), exp - 25) : ldexpf((float)mant, -24);
    return h >> 15 ? -v : v;
}

// A one-row tensor over a buffer, as gguf_open would build it.
static GgufTensor row_tensor(int type, const void *data, int64_t ne0, size_t row_bytes) {
    GgufTensor t = {"all_patterns", type, 1, {ne0, 1, 1, 1}, 1, row_bytes, data, row_bytes, "(memory)"};
    return t;
}

static void test_half_patterns(void) {
    uint8_t *bytes = xcalloc(65536, 2);
    float *out = xcalloc(65536, sizeof *out);
    char err[ERR_LEN];
    for (int h = 0; h < 65536; h++) bytes[2 * h] = h & 0xff, bytes[2 * h + 1] = h >> 8;
    GgufTensor t = row_tensor(GGML_TYPE_F16, bytes, 65536, 131072);
    int bad = -1;
    check(gguf_read_row(&t, 0, out, err) == 0, "f16 patterns", "%s", err);
    for (int h = 0; h < 65536 && bad < 0; h++) {
        float r = ref_half((uint16_t)h);
        // NaNs come back quiet with their payload, as ggml's conversions return them
        uint32_t want = isnan(r) ? ((uint32_t)(h & 0x8000) << 16 | 0x7fc00000 | (uint32_t)(h & 0x3ff) << 13) : float_bits(r);
        if (float_bits(out[h]) != want) bad = h;
    }
    check(bad < 0, "f16 patterns", "half 0x%04x gives 0x%08x", bad, bad < 0 ? 0 : float_bits(out[bad]));
    t = row_tensor(GGML_TYPE_BF16, bytes, 65536, 131072);
    check(gguf_read_row(&t, 0, out, err) == 0, "bf16 patterns", "%s", err);
    bad = -1;
    for (int h = 0; h < 65536 && bad < 0; h++)
        if (float_bits(out[h]) != (uint32_t)h << 16) bad = h;
    check(bad < 0, "bf16 patterns", "bf16 0x%04x gives 0x%08x", bad, bad < 0 ? 0 : float_bits(out[bad]));
    check(gguf_read_row(&t, 1, out, err) == -1 && strstr(err, "(memory): tensor all_patterns: row 1 is outside [0, 1)"),
          "row out of range", "message \"%s\"", err);
    check(gguf_read_row(&t, -1, out, err) == -1, "row out of range", "row -1 accepted");
    check(gguf_read_row_q8_0(&t, 0, out, (int8_t *)bytes, err) == -1 && strstr(err, "type BF16 cannot be read this way"),
          "q8_0 raw rows of BF16", "message \"%s\"", err);
    free(bytes);
    free(out);
}

// ----------------------------------------------------------------------------
// Metadata: meta.gguf has one entry of every value type (make.py)

static int str_is(GgufStr s, const char *want) { return s.s && s.len == strlen(want) && !memcmp(s.s, want, s.len); }

static void check_int(const Gguf *g, const char *key, int64_t want) {
    int64_t v = 0;
    check(gguf_kv_int(gguf_kv(g, key), 0, &v) == 0 && v == want, key, "%lld, expected %lld", (long long)v, (long long)want);
}

static void test_meta_scalars(const Gguf *g) {
    uint32_t u = 0;
    float f = 0;
    double d = 0;
    int b = -1;
    GgufStr s = {NULL, 0};
    check_int(g, "t.u8", 200), check_int(g, "t.i8", -100), check_int(g, "t.u16", 60000), check_int(g, "t.i16", -30000);
    check_int(g, "t.u32", 4000000000), check_int(g, "t.i32", -2000000000), check_int(g, "t.i64", -(1ll << 40));
    int64_t v;
    check(gguf_kv_int(gguf_kv(g, "t.u64"), 0, &v) == -1, "t.u64", "2^63 + 5 read as int64 %lld", (long long)v);
    check(gguf_get_u32(g, "t.u32", &u) == 0 && u == 4000000000u, "get_u32", "t.u32 = %u", u);
    check(gguf_get_u32(g, "t.u8", &u) == 0 && u == 200, "get_u32 of a UINT8", "%u", u);
    check(gguf_get_u32(g, "t.i8", &u) == -1 && gguf_get_u32(g, "t.u64", &u) == -1 && gguf_get_u32(g, "t.i64", &u) == -1,
          "get_u32 out of range", "a negative or too large value accepted");
    check(gguf_get_u32(g, "t.f32", &u) == -1 && gguf_get_u32(g, "t.bool", &u) == -1 && gguf_get_u32(g, "t.i32s", &u) == -1 &&
          gguf_get_u32(g, "missing", &u) == -1, "get_u32 of other types", "a float, bool, array or missing key accepted");
    check(gguf_get_f32(g, "t.f32", &f) == 0 && f == 0.1f, "get_f32", "%g", f);
    check(gguf_get_f32(g, "t.f64", &f) == 0 && f == 0.1f, "get_f32 of a FLOAT64", "%g", f);
    check(gguf_kv_float(gguf_kv(g, "t.f64"), 0, &d) == 0 && d == 0.1, "kv_float of a FLOAT64", "%.17g", d);
    check(gguf_get_f32(g, "t.u8", &f) == -1, "get_f32 of an integer", "accepted");
    check(gguf_get_bool(g, "t.bool", &b) == 0 && b == 1 && gguf_get_bool(g, "t.u8", &b) == -1, "get_bool", "%d", b);
    check(gguf_get_str(g, "t.str", &s) == 0 && str_is(s, "h\xc3\xa9llo"), "get_str", "%.*s", (int)s.len, s.s);
    check(gguf_get_str(g, "t.empty_str", &s) == 0 && s.len == 0, "get_str of an empty string", "length %llu", (unsigned long long)s.len);
    check(gguf_get_str(g, "general.architecture", &s) == 0 && str_is(s, "llama"), "general.architecture", "%.*s", (int)s.len, s.s);
    check(gguf_get_str(g, "t.strs", &s) == -1 && gguf_get_str(g, "t.u8", &s) == -1, "get_str of others", "accepted");
}

static void test_meta_arrays(const Gguf *g) {
    int type = -1;
    uint64_t n = 0;
    const void *at = NULL;
    check(gguf_get_array(g, "t.strs", &type, &n, &at) == 0 && type == GGUF_TYPE_STRING && n == 4, "string array",
          "type %s, n %llu", gguf_type_name(type), (unsigned long long)n);
    const GgufStr *s = at;
    char xs[301];
    memset(xs, 'x', 300);
    xs[300] = '\0';
    check(s && str_is(s[0], "a") && s[1].len == 0 && str_is(s[2], "\xc4\xa0the") && str_is(s[3], xs), "string array elements",
          "differ");
    const GgufKV *kv = gguf_kv(g, "t.strs");
    check(str_is(gguf_kv_str(kv, 2), "\xc4\xa0the") && gguf_kv_str(kv, 4).s == NULL, "kv_str", "element 2 or 4 wrong");
    int64_t v[3] = {0};
    kv = gguf_kv(g, "t.i32s");
    check(kv && kv->n == 3 && gguf_kv_int(kv, 0, &v[0]) == 0 && gguf_kv_int(kv, 1, &v[1]) == 0 && gguf_kv_int(kv, 2, &v[2]) == 0 &&
          v[0] == 1 && v[1] == -2 && v[2] == 3 && gguf_kv_int(kv, 3, &v[0]) == -1, "int32 array", "%lld %lld %lld",
          (long long)v[0], (long long)v[1], (long long)v[2]);
    double d[2] = {0};
    kv = gguf_kv(g, "t.f32s");
    check(kv && gguf_kv_float(kv, 0, &d[0]) == 0 && gguf_kv_float(kv, 1, &d[1]) == 0 && d[0] == 0.5 && d[1] == -1.25,
          "float array", "%g %g", d[0], d[1]);
    check(gguf_get_array(g, "t.bools", &type, &n, &at) == 0 && type == GGUF_TYPE_BOOL && n == 2 &&
          !memcmp(at, "\x01\x00", 2), "bool array", "type %s", gguf_type_name(type));
    check(gguf_get_array(g, "t.u8", &type, &n, &at) == -1, "get_array of a scalar", "accepted");
}

static void test_meta(const char *dir) {
    char path[512], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/meta.gguf", dir);
    Gguf g;
    if (!check(gguf_open(&g, path, err) == 0, "meta.gguf", "%s", err)) return;
    check(g.version == 3 && g.alignment == 64 && g.data_offset % 64 == 0 && g.n_kv == 19 && g.n_tensors == 2, "meta.gguf header",
          "version %d, alignment %u, data at %zu, %llu keys, %llu tensors", g.version, g.alignment, g.data_offset,
          (unsigned long long)g.n_kv, (unsigned long long)g.n_tensors);
    test_meta_scalars(&g);
    test_meta_arrays(&g);
    const GgufTensor *w = gguf_tensor(&g, "w"), *v = gguf_tensor(&g, "v");
    float row[32];
    check(w && v && !gguf_tensor(&g, "x") && gguf_read_row(w, 1, row, err) == 0 && row[0] == 32 && row[31] == 63 &&
          ((const uint8_t *)v->data - (const uint8_t *)g.map) % 64 == 0, "meta.gguf tensors", "w, v wrong or misaligned");
    gguf_close(&g);
    gguf_close(&g);   // twice: harmless
}

// ----------------------------------------------------------------------------
// Hand-built files: a tiny writer, valid variants, and corruptions each refused with one line

typedef struct {
    uint8_t b[4096];
    size_t n;
} Buf;

static void put(Buf *f, const void *p, size_t n) {
    if (f->n + n > sizeof f->b) abort();
    memcpy(f->b + f->n, p, n);
    f->n += n;
}
static void u32(Buf *f, uint32_t v) { put(f, &v, 4); }
static void u64(Buf *f, uint64_t v) { put(f, &v, 8); }
static void str(Buf *f, const char *s) { u64(f, strlen(s)); put(f, s, strlen(s)); }
static void zeros(Buf *f, size_t n) { while (n--) put(f, "", 1); }
static void pad(Buf *f, size_t a) { zeros(f, (a - f->n % a) % a); }

static void header(Buf *f, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    put(f, "GGUF", 4);
    u32(f, version);
    u64(f, n_tensors);
    u64(f, n_kv);
}
static void kv_u32(Buf *f, const char *key, uint32_t v) { str(f, key), u32(f, GGUF_TYPE_UINT32), u32(f, v); }
static void tinfo(Buf *f, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset) {
    str(f, name);
    u32(f, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) u64(f, ne[d]);
    u32(f, type);
    u64(f, offset);
}

// One tensor and no metadata: the info, padding to 32, then `data` zero bytes.
static void one_tensor(Buf *f, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset, size_t data) {
    header(f, 3, 1, 0);
    tinfo(f, "blk.0.attn_q.weight", n_dims, ne, type, offset);
    pad(f, 32);
    zeros(f, data);
}

static const uint64_t NE_64x2[] = {64, 2};   // Q8_0: 2 rows of 2 blocks, 136 bytes

static void good_q8(Buf *f) { one_tensor(f, 2, NE_64x2, GGML_TYPE_Q8_0, 0, 136); }
static void good_v2(Buf *f) { good_q8(f), f->b[4] = 2; }
static void good_empty(Buf *f) { header(f, 3, 0, 0); }
static void good_scalar(Buf *f) { one_tensor(f, 0, NULL, GGML_TYPE_F32, 0, 4); }
static void good_empty_arrays(Buf *f) {
    header(f, 3, 0, 2);
    str(f, "a"), u32(f, GGUF_TYPE_ARRAY), u32(f, GGUF_TYPE_STRING), u64(f, 0);
    str(f, "b"), u32(f, GGUF_TYPE_ARRAY), u32(f, GGUF_TYPE_UINT32), u64(f, 0);
}
// alignment 1: the F32 rows are misaligned in memory and must still read
static void good_align1(Buf *f) {
    static const uint64_t ne[] = {3, 2};
    header(f, 3, 2, 1);
    kv_u32(f, "general.alignment", 1);
    tinfo(f, "x", 2, ne, GGML_TYPE_F32, 1);
    tinfo(f, "y", 1, ne, GGML_TYPE_F16, 27);
    zeros(f, (4 - (f->n + 1) % 4) % 4);   // x's data at a file offset of 1 mod 4
    zeros(f, 1);
    for (int i = 0; i < 6; i++) { float v = (float)i; put(f, &v, 4); }
    zeros(f, 2), put(f, "\x00\x3c\x00\xc0\x00\x7c", 6);   // y: 1, -2, inf
}

static void bad_magic(Buf *f) { good_q8(f), f->b[0] = 'X'; }
static void version1(Buf *f) { good_q8(f), f->b[4] = 1; }
static void version4(Buf *f) { good_q8(f), f->b[4] = 4; }
static void big_endian(Buf *f) { good_q8(f), f->b[4] = 0, f->b[7] = 3; }
static void empty_file(Buf *f) { (void)f; }
static void short_magic(Buf *f) { put(f, "GGU", 3); }
static void n_dims5(Buf *f) { static const uint64_t ne[] = {32, 1, 1, 1, 1}; one_tensor(f, 5, ne, GGML_TYPE_F32, 0, 128); }
static void huge_strings(Buf *f) { header(f, 3, 0, 1), str(f, "k"), u32(f, GGUF_TYPE_ARRAY), u32(f, GGUF_TYPE_STRING), u64(f, 1ull << 60); }
static void huge_u8s(Buf *f) { header(f, 3, 0, 1), str(f, "k"), u32(f, GGUF_TYPE_ARRAY), u32(f, GGUF_TYPE_UINT8), u64(f, 1ull << 62); }
static void string_past_eof(Buf *f) { header(f, 3, 0, 1), str(f, "k"), u32(f, GGUF_TYPE_STRING), u64(f, 1000), put(f, "short", 5); }
static void key_past_eof(Buf *f) { header(f, 3, 0, 1), u64(f, 1ull << 63), put(f, "key", 3), zeros(f, 8); }
static void offset_out(Buf *f) { one_tensor(f, 2, NE_64x2, GGML_TYPE_Q8_0, 4096, 136); }
static void offset_wraps(Buf *f) { one_tensor(f, 2, NE_64x2, GGML_TYPE_Q8_0, ~0ull - 31, 136); }
static void data_short(Buf *f) { one_tensor(f, 2, NE_64x2, GGML_TYPE_Q8_0, 0, 135); }
static void misaligned(Buf *f) { one_tensor(f, 2, NE_64x2, GGML_TYPE_Q8_0, 16, 200); }
static void q3_k(Buf *f) { static const uint64_t ne[] = {256, 1}; one_tensor(f, 2, ne, 11, 0, 110); }
static void type99(Buf *f) { one_tensor(f, 2, NE_64x2, 99, 0, 512); }
static void removed_type(Buf *f) { one_tensor(f, 2, NE_64x2, 31, 0, 512); }
static void partial_block(Buf *f) { static const uint64_t ne[] = {48, 1}; one_tensor(f, 2, ne, GGML_TYPE_Q8_0, 0, 68); }
static void ne_overflow(Buf *f) {
    static const uint64_t ne[] = {1ull << 32, 1ull << 32, 1ull << 32};
    one_tensor(f, 3, ne, GGML_TYPE_F32, 0, 64);
}
static void row_overflow(Buf *f) { static const uint64_t ne[] = {1ull << 62}; one_tensor(f, 1, ne, GGML_TYPE_F32, 0, 64); }
static void dim_zero(Buf *f) { static const uint64_t ne[] = {32, 0}; one_tensor(f, 2, ne, GGML_TYPE_F32, 0, 128); }
static void dim_2_63(Buf *f) { static const uint64_t ne[] = {1ull << 63}; one_tensor(f, 1, ne, GGML_TYPE_F32, 0, 64); }
static void nested(Buf *f) { header(f, 3, 0, 1), str(f, "k"), u32(f, GGUF_TYPE_ARRAY), u32(f, GGUF_TYPE_ARRAY), u64(f, 1), zeros(f, 12); }
static void value_type13(Buf *f) { header(f, 3, 0, 1), str(f, "k"), u32(f, 13), zeros(f, 8); }
static void elem_type200(Buf *f) { header(f, 3, 0, 1), str(f, "k"), u32(f, GGUF_TYPE_ARRAY), u32(f, 200), u64(f, 1), zeros(f, 8); }
static void dup_key(Buf *f) { header(f, 3, 0, 2), kv_u32(f, "k", 1), kv_u32(f, "k", 2); }
static void newline_key(Buf *f) { header(f, 3, 0, 2), kv_u32(f, "a\nb\x7f", 1), kv_u32(f, "a\nb\x7f", 2); }
static void nul_key(Buf *f) { header(f, 3, 0, 1), u64(f, 3), put(f, "a\0b", 3), u32(f, GGUF_TYPE_UINT8), zeros(f, 1); }
static void dup_tensor(Buf *f) {
    static const uint64_t ne[] = {8};
    header(f, 3, 2, 0), tinfo(f, "t", 1, ne, GGML_TYPE_F32, 0), tinfo(f, "t", 1, ne, GGML_TYPE_F32, 32), pad(f, 32), zeros(f, 64);
}
static void align0(Buf *f) { header(f, 3, 0, 1), kv_u32(f, "general.alignment", 0); }
static void align3(Buf *f) { header(f, 3, 0, 1), kv_u32(f, "general.alignment", 3); }
static void align_str(Buf *f) { header(f, 3, 0, 1), str(f, "general.alignment"), u32(f, GGUF_TYPE_STRING), str(f, "32"); }
static void many_tensors(Buf *f) { header(f, 3, 1ull << 40, 0), zeros(f, 64); }
static void many_kvs(Buf *f) { header(f, 3, 0, 1ull << 63), zeros(f, 64); }
static void no_data(Buf *f) { static const uint64_t ne[] = {1}; header(f, 3, 1, 0), tinfo(f, "t", 1, ne, GGML_TYPE_F32, 0); }

static const struct {
    const char *name;
    void (*build)(Buf *);
    const char *expect;   // in the message; NULL: the file opens
} cases[] = {
    {"valid Q8_0", good_q8, NULL},
    {"version 2", good_v2, NULL},
    {"no tensors, no metadata", good_empty, NULL},
    {"0-d tensor", good_scalar, NULL},
    {"empty arrays", good_empty_arrays, NULL},
    {"alignment 1", good_align1, NULL},
    {"bad magic", bad_magic, "not a GGUF file: it starts with 58 47 55 46"},
    {"version 1", version1, "GGUF version 1 is not supported (versions 2 and 3 are)"},
    {"version 4", version4, "GGUF version 4 is not supported"},
    {"big-endian", big_endian, "big-endian GGUF (version field 0x03000000)"},
    {"empty file", empty_file, "truncated: the header needs 4 bytes at offset 0, the file has 0"},
    {"3-byte file", short_magic, "truncated"},
    {"n_dims 5", n_dims5, "tensor blk.0.attn_q.weight: n_dims = 5, at most 4"},
    {"2^60 strings", huge_strings, "metadata key k: 1152921504606846976 array elements cannot fit"},
    {"2^62 bytes", huge_u8s, "array elements cannot fit"},
    {"string past EOF", string_past_eof, "truncated: metadata key k needs 1000 bytes at offset"},
    {"key length 2^63", key_past_eof, "truncated: metadata entry 0 needs 9223372036854775808 bytes"},
    {"offset past EOF", offset_out, "tensor blk.0.attn_q.weight: 136 bytes at offset 4096 run past the end"},
    {"offset near 2^64", offset_wraps, "run past the end of the data section"},
    {"data one byte short", data_short, "136 bytes at offset 0 run past the end of the data section (135 bytes)"},
    {"misaligned offset", misaligned, "offset 16 is not a multiple of the alignment 32"},
    {"Q3_K", q3_k, "tensor blk.0.attn_q.weight: type Q3_K is not supported "
                   "(supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)"},
    {"type 99", type99, "type id 99 is unknown"},
    {"removed type 31", removed_type, "type Q4_0_4_4 is not supported"},
    {"partial block", partial_block, "row length ne[0] = 48 is not a multiple of Q8_0's block size 32"},
    {"ne product overflow", ne_overflow, "its dimensions imply more bytes than the file holds"},
    {"row bytes overflow", row_overflow, "its dimensions imply more bytes than the file holds"},
    {"dimension 0", dim_zero, "dimension 1 is 0, not in [1, 2^63)"},
    {"dimension 2^63", dim_2_63, "dimension 0 is 9223372036854775808"},
    {"nested array", nested, "metadata key k: arrays of arrays are not supported"},
    {"value type 13", value_type13, "metadata key k: value type 13 is unknown"},
    {"element type 200", elem_type200, "value type 200 is unknown"},
    {"duplicate key", dup_key, "metadata key k appears twice"},
    {"newline in a key", newline_key, "metadata key a?b? appears twice"},
    {"NUL in a key", nul_key, "metadata key 0: its name contains a NUL byte"},
    {"duplicate tensor", dup_tensor, "tensor t appears twice"},
    {"alignment 0", align0, "general.alignment is not a power of two"},
    {"alignment 3", align3, "general.alignment is not a power of two"},
    {"alignment a string", align_str, "general.alignment is not a power of two"},
    {"2^40 tensors", many_tensors, "1099511627776 tensor infos cannot fit"},
    {"2^63 keys", many_kvs, "metadata entries cannot fit"},
    {"data section past EOF", no_data, "truncated: the data section would start at offset"},
};

// A refusal: rc -1, one line that names the file, the expected words in it, g left empty.
static void expect_refusal(const char *name, const char *path, int rc, const Gguf *g, const char *err, const char *expect) {
    size_t plen = strlen(path);
    check(rc == -1, name, "opened, expected \"%s\"", expect);
    check(!strncmp(err, path, plen) && !strncmp(err + plen, ": ", 2) && !strchr(err, '\n') && strstr(err, expect), name,
          "message \"%s\", expected \"%s\"", err, expect);
    check(g->map == NULL && g->kv == NULL && g->tensors == NULL && g->path == NULL, name, "the Gguf is not empty after a refusal");
}

static void test_case(size_t i) {
    Buf f = {.n = 0};
    char path[128], err[ERR_LEN] = "";
    float row[64];
    cases[i].build(&f);
    snprintf(path, sizeof path, "%s/case%zu.gguf", tmpdir, i);
    write_bytes(path, f.b, f.n);
    Gguf g;
    int rc = gguf_open(&g, path, err);
    if (cases[i].expect) expect_refusal(cases[i].name, path, rc, &g, err, cases[i].expect);
    else if (check(rc == 0, cases[i].name, "%s", err)) {
        for (uint64_t t = 0; t < g.n_tensors; t++)
            for (int64_t r = 0; r < g.tensors[t].rows; r++) check(gguf_read_row(&g.tensors[t], r, row, err) == 0, cases[i].name, "%s", err);
        gguf_close(&g);
    }
    unlink(path);
}

static void test_align1_values(void) {
    Buf f = {.n = 0};
    char path[128], err[ERR_LEN];
    float x[3], y[3];
    good_align1(&f);
    snprintf(path, sizeof path, "%s/align1.gguf", tmpdir);
    write_bytes(path, f.b, f.n);
    Gguf g;
    if (!check(gguf_open(&g, path, err) == 0, "alignment 1 values", "%s", err)) return;
    check(gguf_read_row(gguf_tensor(&g, "x"), 1, x, err) == 0 && x[0] == 3 && x[2] == 5 &&
          gguf_read_row(gguf_tensor(&g, "y"), 0, y, err) == 0 && y[0] == 1 && y[1] == -2 && isinf(y[2]),
          "alignment 1 values", "x[1] = %g %g %g, y = %g %g %g", x[0], x[1], x[2], y[0], y[1], y[2]);
    gguf_close(&g);
    unlink(path);
}

// Every prefix of a valid file that cuts into its tensors' data is refused.
static void test_truncations(const char *dir, const char *stem) {
    char src[512], path[128], err[ERR_LEN], name[64];
    size_t bytes;
    snprintf(src, sizeof src, "%s/%s.gguf", dir, stem);
    snprintf(path, sizeof path, "%s/cut.gguf", tmpdir);
    snprintf(name, sizeof name, "%s.gguf truncated", stem);
    char *data = read_file(src, 1 << 22, &bytes, err);
    Gguf g;
    if (!check(data && gguf_open(&g, src, err) == 0, name, "%s", err)) return free(data);
    size_t end = 0;   // the end of the last tensor's bytes; what follows is padding
    for (uint64_t t = 0; t < g.n_tensors; t++) {
        size_t e = (size_t)((const uint8_t *)g.tensors[t].data - (const uint8_t *)g.map) + g.tensors[t].bytes;
        end = e > end ? e : end;
    }
    gguf_close(&g);
    int opened = -1, bad_msg = -1;
    write_bytes(path, data, end);
    for (size_t cut = end; cut-- > 0;) {   // shortened in place: one write, no rewrites
        if (truncate(path, (off_t)cut)) exit(1);
        if (gguf_open(&g, path, err) == 0) opened = (int)cut, gguf_close(&g);
        else if (strncmp(err, path, strlen(path)) || strchr(err, '\n')) bad_msg = (int)cut;
    }
    check(opened < 0 && bad_msg < 0, name, "cut at %d opened, or at %d gave \"%s\"", opened, bad_msg, err);
    unlink(path);
    free(data);
}

static void test_paths(void) {
    Gguf g;
    char err[ERR_LEN];
    check(gguf_open(&g, "/nonexistent/x.gguf", err) == -1 && strstr(err, "/nonexistent/x.gguf: cannot open"), "missing file",
          "message \"%s\"", err);
    check(gguf_open(&g, tmpdir, err) == -1 && strstr(err, "not a regular file"), "a directory", "message \"%s\"", err);
    check(!strcmp(ggml_type_name(14), "Q6_K") && !strcmp(ggml_type_name(35), "TQ2_0") && !strcmp(ggml_type_name(16), "IQ2_XXS") &&
          !strcmp(ggml_type_name(26), "I32") && !strcmp(ggml_type_name(-1), "unknown") && !strcmp(ggml_type_name(1000), "unknown"),
          "ggml_type_name", "names wrong");
    check(ggml_block_size(GGML_TYPE_Q4_K) == 256 && ggml_type_size(GGML_TYPE_Q4_K) == 144 && ggml_type_size(GGML_TYPE_Q6_K) == 210 &&
          ggml_type_size(GGML_TYPE_Q5_1) == 24 && ggml_block_size(4) == 0, "block sizes", "wrong");
    check(!strcmp(gguf_type_name(GGUF_TYPE_FLOAT64), "FLOAT64") && !strcmp(gguf_type_name(13), "unknown"), "gguf_type_name", "wrong");
}

static void test_built(const char *dir) {
    if (!mkdtemp(tmpdir)) {
        fprintf(stderr, "test_gguf: cannot create a temporary directory\n");
        exit(1);
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_case(i);
    test_align1_values();
    test_truncations(dir, "meta");
    test_truncations(dir, "q6_k");
    test_paths();
    rmdir(tmpdir);
}

// The fuzzer's kept inputs: each opens and reads in full, or is refused with one line.
static void test_regressions(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    if (!check(d != NULL, "fuzz regressions", "cannot open %s", dir)) return;
    while ((e = readdir(d))) {
        char path[600], err[ERR_LEN] = "";
        float *row;
        Gguf g;
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        n++;
        if (gguf_open(&g, path, err)) {
            check(!strncmp(err, path, strlen(path)) && !strchr(err, '\n'), e->d_name, "message \"%s\"", err);
            continue;
        }
        for (uint64_t t = 0; t < g.n_tensors; t++) {
            row = xcalloc(g.tensors[t].ne[0], sizeof *row);
            for (int64_t r = 0; r < g.tensors[t].rows; r++) check(gguf_read_row(&g.tensors[t], r, row, err) == 0, e->d_name, "%s", err);
            free(row);
        }
        gguf_close(&g);
    }
    closedir(d);
    check(n > 0, "fuzz regressions", "none in %s", dir);
}

// ----------------------------------------------------------------------------
// A real model (--model, --dump)

static void print_kv(const GgufKV *kv) {
    int64_t i;
    double d;
    GgufStr s = gguf_kv_str(kv, 0);
    printf("  %-40s %-8s", kv->key, gguf_type_name(kv->type));
    if (kv->type == GGUF_TYPE_ARRAY) printf(" %llu x %s, first:", (unsigned long long)kv->n, gguf_type_name(kv->elem_type));
    if (s.s) {
        printf(" \"");
        for (uint64_t k = 0; k < s.len && k < 72; k++) putchar(s.s[k] == '\n' ? '|' : s.s[k]);
        printf(s.len > 72 ? "...\" (%llu bytes)" : "\"", (unsigned long long)s.len);
    } else if (gguf_kv_int(kv, 0, &i) == 0) printf(" %lld", (long long)i);
    else if (gguf_kv_float(kv, 0, &d) == 0) printf(" %g", d);
    else if (kv->elem_type == GGUF_TYPE_BOOL && kv->n) printf(" %s", *(const uint8_t *)kv->at ? "true" : "false");
    printf("\n");
}

static int dump(const char *path) {
    Gguf g;
    char err[ERR_LEN];
    if (gguf_open(&g, path, err)) return fprintf(stderr, "%s\n", err), 1;
    printf("%s: GGUF v%d, %llu keys, %llu tensors, alignment %u, data at %zu\n", path, g.version,
           (unsigned long long)g.n_kv, (unsigned long long)g.n_tensors, g.alignment, g.data_offset);
    for (uint64_t i = 0; i < g.n_kv; i++) print_kv(&g.kv[i]);
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const GgufTensor *t = &g.tensors[i];
        printf("  %-32s %-5s %d-d %6lld x %-6lld %10zu bytes at %zu\n", t->name, ggml_type_name(t->type), t->n_dims,
               (long long)t->ne[0], (long long)t->rows, t->bytes, (size_t)((const uint8_t *)t->data - (const uint8_t *)g.map));
    }
    gguf_close(&g);
    return 0;
}

// Reads n bytes from the reference file or fails the run.
static void rd(FILE *f, void *p, size_t n) {
    if (fread(p, 1, n, f) != n) {
        fprintf(stderr, "test_gguf: the reference file is short\n");
        exit(1);
    }
}

// make.py's checksum over a tensor: sum of bits[i] * (2 i + 1) mod 2^64.
static uint64_t tensor_checksum(const GgufTensor *t, float *row) {
    uint64_t sum = 0, i = 0;
    char err[ERR_LEN];
    for (int64_t r = 0; r < t->rows; r++) {
        if (gguf_read_row(t, r, row, err)) return 0;
        for (int64_t j = 0; j < t->ne[0]; j++, i++) sum += (uint64_t)float_bits(row[j]) * (2 * i + 1);
    }
    return sum;
}

static void model_tensor(FILE *ref, const Gguf *g) {
    char name[256] = "", err[ERR_LEN];
    uint32_t len, n_rows;
    uint64_t want, ne0, r;
    rd(ref, &len, 4);
    if (len >= sizeof name) exit(1);
    rd(ref, name, len);
    rd(ref, &want, 8), rd(ref, &ne0, 8), rd(ref, &n_rows, 4);
    const GgufTensor *t = gguf_tensor(g, name);
    float *row = xcalloc(ne0, sizeof *row), *want_row = xcalloc(ne0, sizeof *row);
    if (check(t && (uint64_t)t->ne[0] == ne0, name, "missing or ne[0] differs")) {
        uint64_t sum = tensor_checksum(t, row);
        check(sum == want, name, "checksum %016llx, gguf-py %016llx", (unsigned long long)sum, (unsigned long long)want);
    }
    for (uint32_t k = 0; k < n_rows; k++) {
        rd(ref, &r, 8), rd(ref, want_row, ne0 * 4);
        if (t)
            check(gguf_read_row(t, (int64_t)r, row, err) == 0 && !memcmp(row, want_row, ne0 * 4), name, "row %llu differs",
                  (unsigned long long)r);
    }
    free(row);
    free(want_row);
}

static uint64_t fnv_strings(const GgufKV *kv) {
    uint64_t h = 14695981039346656037ull;
    for (uint64_t i = 0; i < kv->n; i++) {
        GgufStr s = gguf_kv_str(kv, i);
        for (int b = 0; b < 8; b++) h = (h ^ ((s.len >> (8 * b)) & 0xff)) * 1099511628211ull;
        for (uint64_t k = 0; k < s.len; k++) h = (h ^ (uint8_t)s.s[k]) * 1099511628211ull;
    }
    return h;
}

static void model_array(FILE *ref, const Gguf *g) {
    char key[256] = "";
    uint32_t len;
    uint64_t n, want;
    rd(ref, &len, 4);
    if (len >= sizeof key) exit(1);
    rd(ref, key, len);
    rd(ref, &n, 8), rd(ref, &want, 8);
    const GgufKV *kv = gguf_kv(g, key);
    check(kv && kv->n == n && fnv_strings(kv) == want, key, "string array differs from gguf-py's");
}

// Opening, and dequantizing every tensor into one row buffer: the reader's cost alone.
static void model_timings(const char *path) {
    Gguf g;
    char err[ERR_LEN];
    long t0 = time_in_us();
    if (!check(gguf_open(&g, path, err) == 0, "open", "%s", err)) return;
    long t1 = time_in_us();
    double weights = 0, sink = 0;
    float *row = xcalloc(1 << 20, sizeof *row);
    for (uint64_t i = 0; i < g.n_tensors; i++)
        for (int64_t r = 0; r < g.tensors[i].rows; r++) {
            gguf_read_row(&g.tensors[i], r, row, err);
            sink += row[0];
        }
    long t2 = time_in_us();
    for (uint64_t i = 0; i < g.n_tensors; i++) weights += (double)g.tensors[i].rows * g.tensors[i].ne[0];
    printf("%s: open %.1f ms; dequantized %.1fM weights (%zu bytes mapped) in %.1f ms (%.2f GB/s of floats)%s\n", path,
           (t1 - t0) / 1e3, weights / 1e6, g.map_bytes, (t2 - t1) / 1e3, weights * 4 / (t2 - t1) / 1e3, sink == 12345 ? " " : "");
    free(row);
    gguf_close(&g);
}

static int model(const char *path, const char *ref_path) {
    model_timings(path);
    Gguf g;
    char err[ERR_LEN];
    FILE *ref = fopen(ref_path, "rb");
    uint32_t n;
    if (!check(ref && gguf_open(&g, path, err) == 0, "open", "%s or %s", err, ref_path)) return 1;
    rd(ref, &n, 4);
    check(n == g.n_tensors, "tensor count", "%u in the reference, %llu here", n, (unsigned long long)g.n_tensors);
    for (uint32_t i = 0; i < n; i++) model_tensor(ref, &g);
    rd(ref, &n, 4);
    for (uint32_t i = 0; i < n; i++) model_array(ref, &g);
    fclose(ref);
    gguf_close(&g);
    printf("gguf model: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail > 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--dump")) return dump(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "--model")) return model(argv[2], argv[3]);
    if (argc > 3 || (argc >= 2 && argv[1][0] == '-')) {
        fprintf(stderr, "usage: test_gguf [DATA_DIR [REGRESSIONS_DIR]] | --model M.gguf REF.bin | --dump M.gguf\n");
        return 2;
    }
    const char *dir = argc >= 2 ? argv[1] : "tests/data/gguf";
    test_fixtures(dir);
    test_half_patterns();
    test_meta(dir);
    test_built(dir);
    test_regressions(argc == 3 ? argv[2] : "tests/fuzz/regressions/gguf");
    printf("gguf: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail > 0;
}
