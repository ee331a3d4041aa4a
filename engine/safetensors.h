// safetensors.h: Hugging Face safetensors checkpoints, one file or the shards listed by
// model.safetensors.index.json. Each file is mmapped read-only and validated in full when opened:
//
//   u64 N (little-endian) | N bytes of JSON header | data
//   header: {"name": {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"key": "string", ...}}   (offsets count from the data's start)
//
// Checked: N within the file (and at most ST_MAX_HEADER), the header strict JSON, every dtype
// known, shapes of at most ST_MAX_DIMS integer dimensions whose product does not overflow, end -
// begin == product(shape) * dtype size, and the tensors tiling the data exactly: no overlap, no
// gap, no bytes after the last (as the reference reader requires). A sharded checkpoint must agree
// with its index: every listed tensor in its shard, no tensor in two shards or outside the index.
#ifndef SAFETENSORS_H
#define SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "half.h"   // f16_to_f32, bf16_to_f32

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER ((size_t)100 << 20)   // the reference reader's limit on N

// Every byte-sized dtype of the format; readers of floats take F32, F16 and BF16 only.
typedef enum { ST_F32, ST_F16, ST_BF16, ST_F64, ST_I64, ST_I32, ST_I16, ST_I8, ST_U64, ST_U32, ST_U16, ST_U8, ST_BOOL, ST_F8_E4M3, ST_F8_E5M2, ST_N_DTYPES } StDtype;

typedef struct {
    const char *name;
    StDtype dtype;
    int n_dims;                     // 0: a scalar
    int64_t shape[ST_MAX_DIMS];     // outermost first, as PyTorch: a linear weight is (out, in)
    int64_t numel;                  // product of shape
    const void *data;               // in the mmap; no alignment is promised (read through memcpy)
    size_t bytes;                   // numel * st_dtype_size(dtype)
    const char *file;               // the path of its file, for messages
} StTensor;

typedef struct {
    StTensor *tensors;      // n of them, sorted by name
    int n;
    struct StFile *files;   // n_files of them: the mappings and headers the tensors point into
    int n_files;
} SafeTensors;

// path: a .safetensors file, a .index.json, or a directory holding model.safetensors or else
// model.safetensors.index.json (shards beside it). 0, or -1 with "file: what is wrong" in err
// (ERR_LEN); on failure st holds nothing.
int  st_open(SafeTensors *st, const char *path, char *err);
void st_close(SafeTensors *st);
const StTensor *st_find(const SafeTensors *st, const char *name);   // NULL when absent
// Converts count elements of t from element `first` to float, exactly (F32, F16, BF16): 0, or -1
// with "file: tensor name: what" in err (another dtype, a range outside the tensor).
int st_read_floats(const StTensor *t, size_t first, size_t count, float *out, char *err);
const char *st_dtype_name(StDtype d);   // "BF16"
size_t st_dtype_size(StDtype d);        // bytes per element

#endif
