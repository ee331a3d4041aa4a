// safetensors.c: the reader behind safetensors.h. Files are mapped, headers parsed with json.c
// and kept (tensor names point into them), then every field is checked before st_open returns.
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"
#include "model.h"   // ERR_LEN
#include "util.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader copies it as it is"
#endif

#define MAX_INDEX_BYTES ((size_t)64 << 20)
#define MAX_DIM ((long long)1 << 53)   // dimensions and offsets: integers a double holds exactly

struct StFile {
    char *path;
    unsigned char *map;            // the whole file
    size_t size;
    const unsigned char *data;     // after the header
    size_t data_bytes;
    Json header;
};

static const struct { const char *name; size_t size; } dtypes[ST_N_DTYPES] = {
    [ST_F32] = {"F32", 4},       [ST_F16] = {"F16", 2},         [ST_BF16] = {"BF16", 2},      [ST_F64] = {"F64", 8},
    [ST_I64] = {"I64", 8},       [ST_I32] = {"I32", 4},         [ST_I16] = {"I16", 2},        [ST_I8] = {"I8", 1},
    [ST_U64] = {"U64", 8},       [ST_U32] = {"U32", 4},         [ST_U16] = {"U16", 2},        [ST_U8] = {"U8", 1},
    [ST_BOOL] = {"BOOL", 1},     [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *st_dtype_name(StDtype d) { return (unsigned)d < ST_N_DTYPES ? dtypes[d].name : "?"; }
size_t st_dtype_size(StDtype d) { return (unsigned)d < ST_N_DTYPES ? dtypes[d].size : 0; }

// Names come from untrusted headers: a control character (a newline in a tensor's name) becomes
// '?', so a message stays one line.
static int one_line(char *err) {
    for (unsigned char *c = (unsigned char *)err; *c; c++)
        if (*c < 0x20 || *c == 0x7F) *c = '?';
    return -1;
}

// "file: what"; returns -1.
static int file_fail(char *err, const char *file, const char *fmt, ...) {
    char what[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(err, ERR_LEN, "%.250s: %.250s", file, what);
    return one_line(err);
}

// "file: tensor name: what"; returns -1.
static int tensor_fail(char *err, const char *file, const char *name, const char *fmt, ...) {
    char what[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(err, ERR_LEN, "%.200s: tensor %.120s: %.180s", file, name, what);
    return one_line(err);
}

// ---------------------------------------------------------------- one file
// Maps path. open_name: how a failure to open it is reported ("dir/x.index.json: shard x").
static int map_file(struct StFile *f, const char *open_name, char *err) {
    struct stat sb;
    int fd = open(f->path, O_RDONLY);
    if (fd < 0) return file_fail(err, open_name, "%s", strerror(errno));
    int rc = -1;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) file_fail(err, f->path, "not a regular file");
    else if (sb.st_size < 8) file_fail(err, f->path, "%lld bytes, too short for the 8-byte header length", (long long)sb.st_size);
    else if ((f->map = mmap(NULL, sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED) f->map = NULL, file_fail(err, f->path, "mmap: %s", strerror(errno));
    else f->size = (size_t)sb.st_size, rc = 0;
    close(fd);
    return rc;
}

// The header length, the header as a JSON object, and where the data lies.
static int read_header(struct StFile *f, char *err) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | f->map[i];
    if (n > f->size - 8) return file_fail(err, f->path, "header length %llu runs past the file's end (%zu bytes)", (unsigned long long)n, f->size);
    if (n > ST_MAX_HEADER) return file_fail(err, f->path, "header length %llu is more than the %zu allowed", (unsigned long long)n, ST_MAX_HEADER);
    char why[ERR_LEN];
    if (json_parse((const char *)f->map + 8, n, &f->header, why)) return file_fail(err, f->path, "header: %s", why);
    if (f->header.root->type != JSON_OBJECT) return file_fail(err, f->path, "header: not a JSON object");
    f->data = f->map + 8 + n;
    f->data_bytes = f->size - 8 - n;
    return 0;
}

static int parse_dtype(const JsonValue *v, StDtype *d) {
    for (int i = 0; v && v->type == JSON_STRING && i < ST_N_DTYPES; i++)
        if (strcmp(v->str, dtypes[i].name) == 0) return *d = (StDtype)i, 0;
    return -1;
}

// shape: up to ST_MAX_DIMS integers in [0, 2^53], their product (and its bytes) without overflow.
static int parse_shape(const JsonValue *v, StTensor *t, const char *file, char *err) {
    if (!v || v->type != JSON_ARRAY) return tensor_fail(err, file, t->name, "\"shape\" is missing or not an array");
    if (v->n > ST_MAX_DIMS) return tensor_fail(err, file, t->name, "shape has %d dimensions, more than %d", v->n, ST_MAX_DIMS);
    t->n_dims = v->n;
    t->numel = 1;
    for (int i = 0; i < v->n; i++) {
        if (!json_is_int(&v->items[i], 0, MAX_DIM)) return tensor_fail(err, file, t->name, "shape[%d] is not an integer in [0, 2^53]", i);
        t->shape[i] = (int64_t)v->items[i].number;
        if (__builtin_mul_overflow(t->numel, t->shape[i], &t->numel)) return tensor_fail(err, file, t->name, "the shape's product overflows");
    }
    if (__builtin_mul_overflow((uint64_t)t->numel, (uint64_t)dtypes[t->dtype].size, &t->bytes))
        return tensor_fail(err, file, t->name, "the shape's size in bytes overflows");
    return 0;
}

// data_offsets [begin, end]: within the data, end - begin the shape's bytes.
static int parse_offsets(const JsonValue *v, StTensor *t, const struct StFile *f, char *err) {
    if (!v || v->type != JSON_ARRAY || v->n != 2 || !json_is_int(&v->items[0], 0, MAX_DIM) || !json_is_int(&v->items[1], 0, MAX_DIM))
        return tensor_fail(err, f->path, t->name, "\"data_offsets\" is not [begin, end] of integers in [0, 2^53]");
    size_t begin = (size_t)v->items[0].number, end = (size_t)v->items[1].number;
    if (begin > end) return tensor_fail(err, f->path, t->name, "data_offsets [%zu, %zu] end before they begin", begin, end);
    if (end > f->data_bytes)
        return tensor_fail(err, f->path, t->name, "data_offsets [%zu, %zu] beyond the file's %zu data bytes", begin, end, f->data_bytes);
    if (end - begin != t->bytes)
        return tensor_fail(err, f->path, t->name, "data_offsets [%zu, %zu] hold %zu bytes, but %s of %lld elements take %zu", begin, end,
                           end - begin, dtypes[t->dtype].name, (long long)t->numel, t->bytes);
    t->data = f->data + begin;
    return 0;
}

// One header entry: {"dtype", "shape", "data_offsets"} (other fields are ignored, as the reference reader does).
static int parse_tensor(const char *name, int name_len, const JsonValue *v, const struct StFile *f, StTensor *t, char *err) {
    *t = (StTensor){.name = name, .file = f->path};
    if ((size_t)name_len != strlen(name)) return tensor_fail(err, f->path, name, "the name holds a NUL byte");
    if (v->type != JSON_OBJECT) return tensor_fail(err, f->path, name, "not an object of dtype, shape and data_offsets");
    const JsonValue *dtype = json_get(v, "dtype");
    if (parse_dtype(dtype, &t->dtype))
        return tensor_fail(err, f->path, name, "dtype %.40s is not one of F32 F16 BF16 F64 I64 I32 I16 I8 U64 U32 U16 U8 BOOL F8_E4M3 F8_E5M2",
                           dtype && dtype->type == JSON_STRING ? dtype->str : "(missing, or not a string)");
    if (parse_shape(json_get(v, "shape"), t, f->path, err)) return -1;
    return parse_offsets(json_get(v, "data_offsets"), t, f, err);
}

static int check_metadata(const JsonValue *v, const struct StFile *f, char *err) {
    int ok = v->type == JSON_OBJECT;
    for (int i = 0; ok && i < v->n; i++) ok = v->items[i].type == JSON_STRING;
    if (!ok) return file_fail(err, f->path, "__metadata__ is not an object of strings");
    return 0;
}

typedef struct { size_t begin, end; int i; } Span;   // one tensor's bytes in its file's data

static int by_offset(const void *a, const void *b) {
    const Span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

// The file's n tensors t must tile its data: sorted by offset, each begins where the last ended.
static int check_tiling(const struct StFile *f, const StTensor *t, int n, char *err) {
    Span *s = xcalloc(n ? n : 1, sizeof(Span));
    int rc = 0;
    for (int i = 0; i < n; i++) {
        size_t begin = (size_t)((const unsigned char *)t[i].data - f->data);
        s[i] = (Span){begin, begin + t[i].bytes, i};
    }
    qsort(s, n, sizeof(Span), by_offset);
    size_t at = 0;   // where the next tensor must begin
    for (int i = 0; i < n && !rc; i++) {
        const char *name = t[s[i].i].name;
        if (s[i].begin < at)
            rc = tensor_fail(err, f->path, name, "data_offsets [%zu, %zu] overlap tensor %.100s's [%zu, %zu]", s[i].begin, s[i].end,
                             t[s[i - 1].i].name, s[i - 1].begin, s[i - 1].end);
        else if (s[i].begin > at)
            rc = tensor_fail(err, f->path, name, "data_offsets [%zu, %zu] leave the bytes [%zu, %zu) before them unused", s[i].begin, s[i].end, at, s[i].begin);
        at = s[i].end;
    }
    if (!rc && at != f->data_bytes) rc = file_fail(err, f->path, "%zu bytes after the last tensor's data belong to no tensor", f->data_bytes - at);
    free(s);
    return rc;
}

// Appends the file's tensors to st->tensors, each checked.
static int read_tensors(SafeTensors *st, const struct StFile *f, char *err) {
    const JsonValue *h = f->header.root;
    if (h->n > INT32_MAX - st->n) return file_fail(err, f->path, "too many tensors");
    StTensor *all = realloc(st->tensors, ((size_t)st->n + h->n + 1) * sizeof(StTensor));
    if (!all) return file_fail(err, f->path, "out of memory for %d tensors", st->n + h->n);
    st->tensors = all;
    StTensor *mine = all + st->n;
    int n = 0;
    for (int i = 0; i < h->n; i++) {
        if (strcmp(h->keys[i], "__metadata__") == 0 && h->key_len[i] == 12) {
            if (check_metadata(&h->items[i], f, err)) return -1;
        } else if (parse_tensor(h->keys[i], h->key_len[i], &h->items[i], f, &mine[n++], err)) {
            return -1;
        }
    }
    if (check_tiling(f, mine, n, err)) return -1;
    st->n += n;
    return 0;
}

// Maps, parses and checks the file at path as st->files[st->n_files++] (room is there).
static int add_file(SafeTensors *st, const char *path, const char *open_name, char *err) {
    struct StFile *f = &st->files[st->n_files++];
    f->path = xcalloc(strlen(path) + 1, 1);
    strcpy(f->path, path);
    if (map_file(f, open_name, err) || read_header(f, err)) return -1;
    return read_tensors(st, f, err);
}

// ---------------------------------------------------------------- the whole checkpoint
static int by_name(const void *a, const void *b) { return strcmp(((const StTensor *)a)->name, ((const StTensor *)b)->name); }

// Sorts by name for st_find; a name twice is an error (which of the two would be meant?).
static int sort_tensors(SafeTensors *st, char *err) {
    qsort(st->tensors, st->n, sizeof(StTensor), by_name);
    for (int i = 1; i < st->n; i++) {
        const StTensor *a = &st->tensors[i - 1], *b = &st->tensors[i];
        if (strcmp(a->name, b->name) != 0) continue;
        if (a->file == b->file) return tensor_fail(err, a->file, a->name, "appears twice in the header");
        return tensor_fail(err, a->file, a->name, "also in %.200s", b->file);
    }
    return 0;
}

static char *join_path(const char *dir, const char *name) {
    size_t n = strlen(dir);
    char *p = xcalloc(n + strlen(name) + 2, 1);
    sprintf(p, "%s%s%s", dir, n && dir[n - 1] != '/' ? "/" : "", name);
    return p;
}

static int open_one(SafeTensors *st, const char *path, char *err) {
    st->files = xcalloc(1, sizeof(struct StFile));
    if (add_file(st, path, path, err)) return -1;
    return sort_tensors(st, err);
}

// A shard name from the index: a plain file name beside it (no directories, no "..").
static int bad_shard_name(const JsonValue *v) {
    return v->type != JSON_STRING || v->n == 0 || (size_t)v->n != strlen(v->str) || strchr(v->str, '/') || !strcmp(v->str, ".") || !strcmp(v->str, "..");
}

static int by_string(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

// The distinct shard names of weight_map, sorted (sorting, not pairwise comparison: an index may
// list a million entries).
static int shard_names(const JsonValue *map, const char *index, const char ***names, int *n, char *err) {
    *names = xcalloc(map->n, sizeof(char *));
    *n = 0;
    for (int i = 0; i < map->n; i++) {
        if (bad_shard_name(&map->items[i])) return tensor_fail(err, index, map->keys[i], "weight_map's shard is not a file name (a string without '/')");
        (*names)[i] = map->items[i].str;
    }
    qsort(*names, map->n, sizeof(char *), by_string);
    for (int i = 0; i < map->n; i++)
        if (i == 0 || strcmp((*names)[i], (*names)[*n - 1]) != 0) (*names)[(*n)++] = (*names)[i];
    return 0;
}

// Every tensor of weight_map is in the shard it names, once; every tensor of the shards is listed.
static int check_map(const SafeTensors *st, const JsonValue *map, const char *index, const char *dir, char *err) {
    char *listed = xcalloc(st->n ? st->n : 1, 1);
    int rc = 0;
    for (int i = 0; i < map->n && !rc; i++) {
        const StTensor *t = st_find(st, map->keys[i]);
        char *want = join_path(dir, map->items[i].str);
        if (!t || (size_t)map->key_len[i] != strlen(map->keys[i])) rc = tensor_fail(err, index, map->keys[i], "not in shard %.150s", map->items[i].str);
        else if (strcmp(t->file, want) != 0) rc = tensor_fail(err, index, t->name, "listed in shard %.100s but found in %.150s", map->items[i].str, t->file);
        else if (listed[t - st->tensors]++) rc = tensor_fail(err, index, t->name, "listed twice in weight_map");
        free(want);
    }
    for (int i = 0; i < st->n && !rc; i++)
        if (!listed[i]) rc = tensor_fail(err, st->tensors[i].file, st->tensors[i].name, "not listed in %.200s's weight_map", index);
    free(listed);
    return rc;
}

// The index's shards, each mapped and checked, then the index checked against them.
static int open_index_json(SafeTensors *st, const char *index, const Json *doc, char *err) {
    const JsonValue *map = json_get(doc->root, "weight_map");
    if (!map || map->type != JSON_OBJECT || map->n == 0) return file_fail(err, index, "weight_map is missing, empty or not an object");
    const char **names;
    int n, rc = 0;
    size_t dir_len = strrchr(index, '/') ? (size_t)(strrchr(index, '/') - index) + 1 : 0;
    char *dir = xcalloc(dir_len + 1, 1);
    memcpy(dir, index, dir_len);
    if (shard_names(map, index, &names, &n, err) == 0) {
        st->files = xcalloc(n, sizeof(struct StFile));
        for (int i = 0; i < n && !rc; i++) {
            char *path = join_path(dir, names[i]), open_name[ERR_LEN];
            snprintf(open_name, sizeof open_name, "%.250s: shard %.200s", index, names[i]);
            rc = add_file(st, path, open_name, err);
            free(path);
        }
        if (!rc) rc = sort_tensors(st, err);
        if (!rc) rc = check_map(st, map, index, dir, err);
    } else {
        rc = -1;
    }
    free(names);
    free(dir);
    return rc;
}

static int open_index(SafeTensors *st, const char *index, char *err) {
    size_t bytes;
    char *text = read_file(index, MAX_INDEX_BYTES, &bytes, err), why[ERR_LEN];
    if (!text) return -1;
    Json doc;
    int rc = json_parse(text, bytes, &doc, why);
    free(text);
    if (rc) return file_fail(err, index, "%s", why);
    rc = open_index_json(st, index, &doc, err);
    json_free(&doc);
    return rc;
}

// A directory: model.safetensors if it is there (as transformers prefers), else the index.
static int open_dir(SafeTensors *st, const char *dir, char *err) {
    char *single = join_path(dir, "model.safetensors"), *index = join_path(dir, "model.safetensors.index.json");
    int rc;
    if (access(single, F_OK) == 0) rc = open_one(st, single, err);
    else if (access(index, F_OK) == 0) rc = open_index(st, index, err);
    else rc = file_fail(err, dir, "holds neither model.safetensors nor model.safetensors.index.json");
    free(single);
    free(index);
    return rc;
}

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && strcmp(s + n - k, tail) == 0;
}

int st_open(SafeTensors *st, const char *path, char *err) {
    struct stat sb;
    int rc;
    memset(st, 0, sizeof *st);
    if (stat(path, &sb) != 0) return file_fail(err, path, "%s", strerror(errno));
    if (S_ISDIR(sb.st_mode)) rc = open_dir(st, path, err);
    else if (ends_with(path, ".json")) rc = open_index(st, path, err);
    else rc = open_one(st, path, err);
    if (rc) st_close(st);
    return rc;
}

void st_close(SafeTensors *st) {
    for (int i = 0; i < st->n_files; i++) {
        struct StFile *f = &st->files[i];
        if (f->map) munmap(f->map, f->size);
        json_free(&f->header);
        free(f->path);
    }
    free(st->files);
    free(st->tensors);
    memset(st, 0, sizeof *st);
}

const StTensor *st_find(const SafeTensors *st, const char *name) {
    StTensor key = {.name = name};
    return st->n ? bsearch(&key, st->tensors, st->n, sizeof(StTensor), by_name) : NULL;
}

int st_read_floats(const StTensor *t, size_t first, size_t count, float *out, char *err) {
    if (first > (size_t)t->numel || count > (size_t)t->numel - first)
        return tensor_fail(err, t->file, t->name, "elements [%zu, %zu + %zu) are outside its %lld", first, first, count, (long long)t->numel);
    const unsigned char *src = (const unsigned char *)t->data + first * dtypes[t->dtype].size;
    uint16_t h;
    switch (t->dtype) {
    case ST_F32: memcpy(out, src, count * sizeof(float)); return 0;
    case ST_F16: for (size_t i = 0; i < count; i++) memcpy(&h, src + 2 * i, 2), out[i] = f16_to_f32(h); return 0;
    case ST_BF16: for (size_t i = 0; i < count; i++) memcpy(&h, src + 2 * i, 2), out[i] = bf16_to_f32(h); return 0;
    default: return tensor_fail(err, t->file, t->name, "dtype %s cannot be read as floats (F32, F16 and BF16 can)", dtypes[t->dtype].name);
    }
}
