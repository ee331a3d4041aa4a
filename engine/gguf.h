// gguf.h: a reader for GGUF, llama.cpp's model format: versions 2 and 3, little-endian only.
// gguf_open maps the file read-only and validates all of it before returning: every string,
// array and tensor lies inside the file, no size product overflows, tensor offsets are aligned,
// row lengths are whole blocks, and every tensor has a type gguf_read_row decodes. Only keys,
// tensor names and an index of each string array are copied; values and tensor data stay in the map.
//
// File layout (all integers little-endian; str = u64 length + bytes, no NUL):
//   "GGUF", u32 version, u64 n_tensors, u64 n_kv
//   n_kv      x { str key, u32 value type, value }
//               value: a scalar, a str, or an ARRAY: u32 element type, u64 n, n elements
//   n_tensors x { str name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset }
//   padding up to a multiple of general.alignment (default 32), then the data section:
//   each tensor's offset is relative to its start, and a multiple of the alignment.
// Tensors are row-major with ne[0] fastest: ne[1]*ne[2]*ne[3] rows of ne[0] elements; a row of a
// quantized type is ne[0] / block_size blocks of type_size bytes (ggml's block layouts, in gguf.c).
// A linear weight stored as ne = {in, out} is (out, in): row r holds output r's weights.
#ifndef GGUF_H
#define GGUF_H

#include <stddef.h>
#include <stdint.h>

// Metadata value types
enum {
    GGUF_TYPE_UINT8 = 0, GGUF_TYPE_INT8 = 1, GGUF_TYPE_UINT16 = 2, GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4, GGUF_TYPE_INT32 = 5, GGUF_TYPE_FLOAT32 = 6, GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8, GGUF_TYPE_ARRAY = 9, GGUF_TYPE_UINT64 = 10, GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12, GGUF_TYPE_COUNT = 13
};

// Tensor types gguf_read_row decodes (ggml's numbering); ggml_type_name knows every other id too.
enum {
    GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1, GGML_TYPE_Q4_0 = 2, GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6, GGML_TYPE_Q5_1 = 7, GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q4_K = 12, GGML_TYPE_Q5_K = 13, GGML_TYPE_Q6_K = 14, GGML_TYPE_BF16 = 30,
};

#define GGUF_MAGIC             "GGUF"   // a file's first 4 bytes
#define GGUF_MAX_DIMS          4
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGML_QK8_0             32   // Q8_0: blocks of 32 weights, one FP16 scale each

// Bytes in the file (not NUL-terminated).
typedef struct {
    const char *s;
    uint64_t len;
} GgufStr;

// One metadata entry. For an ARRAY, elem_type and n describe its elements; for a scalar or a
// string elem_type = type and n = 1. `at` is, for numbers and bools, the first value's bytes in
// the map (little-endian, unaligned: read them with gguf_kv_int / gguf_kv_float or memcpy); for
// STRING (and arrays of strings), a GgufStr[n] index built at open.
typedef struct {
    const char *key;    // NUL-terminated
    int type;           // GGUF_TYPE_*
    int elem_type;
    uint64_t n;
    const void *at;
} GgufKV;

typedef struct {
    const char *name;   // NUL-terminated
    int type;           // GGML_TYPE_*
    int n_dims;         // as stored, 0..4; ne[] past n_dims are 1
    int64_t ne[GGUF_MAX_DIMS];
    int64_t rows;       // ne[1] * ne[2] * ne[3]
    size_t row_bytes;   // ne[0] / block_size * type_size
    const void *data;   // rows * row_bytes = bytes, in the map; aligned as the file is, no more
    size_t bytes;
    const char *path;   // the file, for messages
} GgufTensor;

// Names of keys or tensors with a hash index over them.
typedef struct {
    char **names;       // owned copies, in file order
    uint32_t *slot;     // open addressing: entry + 1, 0 = empty; mask + 1 slots, at least twice the entries
    size_t mask;
} GgufNames;

typedef struct {
    char *path;
    int version;            // 2 or 3
    uint32_t alignment;     // of the data section and of every tensor offset
    uint64_t n_kv, n_tensors;
    GgufKV *kv;             // in file order
    GgufTensor *tensors;    // in file order
    GgufNames kv_names, tensor_names;
    size_t data_offset;     // where the data section starts in the file
    void *map;
    size_t map_bytes;
} Gguf;

// 0 on success, else -1 with "path: what is wrong" in err (ERR_LEN); g is then empty.
int  gguf_open(Gguf *g, const char *path, char *err);
void gguf_close(Gguf *g);   // safe on a zeroed or closed Gguf

const GgufTensor *gguf_tensor(const Gguf *g, const char *name);   // NULL if absent
const GgufKV *gguf_kv(const Gguf *g, const char *key);            // NULL if absent

// Element i of an array (or i = 0 of a scalar) as a number: 0, or -1 where i is out of range or
// the type is not an integer (gguf_kv_int: U8..I64, not BOOL) or a float (gguf_kv_float: F32, F64).
int gguf_kv_int(const GgufKV *kv, uint64_t i, int64_t *out);   // UINT64 above INT64_MAX: -1
int gguf_kv_float(const GgufKV *kv, uint64_t i, double *out);
GgufStr gguf_kv_str(const GgufKV *kv, uint64_t i);             // {NULL, 0} if not a string

// Typed scalar lookups: 0, or -1 where the key is missing, an array, or of another type.
int gguf_get_u32(const Gguf *g, const char *key, uint32_t *out);   // any integer type, value in range
int gguf_get_f32(const Gguf *g, const char *key, float *out);      // FLOAT32, or FLOAT64 rounded
int gguf_get_bool(const Gguf *g, const char *key, int *out);       // 0 or 1
int gguf_get_str(const Gguf *g, const char *key, GgufStr *out);
// An array: its element type, length and `at` as in GgufKV (a GgufStr[n] for strings).
int gguf_get_array(const Gguf *g, const char *key, int *elem_type, uint64_t *n, const void **at);

// Row `row` (of t->rows) as t->ne[0] floats, exactly as ggml's dequantize_row_* computes them.
int gguf_read_row(const GgufTensor *t, int64_t row, float *out, char *err);
// A Q8_0 row as stored, for lossless import: ne[0] / 32 scales (the FP16 d, exactly) and ne[0]
// int8 q; weight j = scales[j / 32] * q[j].
int gguf_read_row_q8_0(const GgufTensor *t, int64_t row, float *scales, int8_t *q, char *err);

const char *ggml_type_name(int type);   // "Q4_K"; "unknown" past the ids ggml has used
const char *gguf_type_name(int type);   // "UINT32", "STRING", ...; "unknown" if not a type
int ggml_block_size(int type);          // elements per block; 0 for unknown or removed ids
int ggml_type_size(int type);           // bytes per block; 0 likewise

#endif
