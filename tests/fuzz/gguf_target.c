// gguf_target.c: libFuzzer target for the GGUF reader (engine/gguf.c). The contract under test:
// gguf_open on any bytes either succeeds or fails with one line naming the file, never a crash,
// an out-of-bounds read, undefined behaviour or an unbounded allocation; a file that opens can be
// read in full: every metadata value, every string, every row of every tensor.
// Built by `make tests/fuzz/fuzz_gguf` and run by `make fuzz` (tests/fuzz/fuzz.sh: gguf.dict, the
// corpus seeded with tests/data/gguf).
#define _GNU_SOURCE
#include "harness.h"   // bytes_as_file; main for -DFUZZ_REPLAY
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gguf.h"
#include "model.h"   // ERR_LEN

static void expect(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "gguf_target: %s\n", what);
        abort();
    }
}

// Every value of every entry, through the typed readers; strings are touched byte by byte.
static unsigned read_metadata(const Gguf *g) {
    unsigned sum = 0;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const GgufKV *kv = &g->kv[i];
        expect(gguf_kv(g, kv->key) == kv, "a key does not find its own entry");
        for (uint64_t k = 0; k < kv->n; k++) {
            int64_t v;
            double d;
            GgufStr s = gguf_kv_str(kv, k);
            if (gguf_kv_int(kv, k, &v) == 0) sum += (unsigned)v;
            if (gguf_kv_float(kv, k, &d) == 0) sum += d > 0;
            for (uint64_t b = 0; b < s.len; b++) sum += (uint8_t)s.s[b];
        }
        uint32_t u;
        float f;
        int b;
        GgufStr s;
        sum += gguf_get_u32(g, kv->key, &u) + gguf_get_f32(g, kv->key, &f) + gguf_get_bool(g, kv->key, &b) + gguf_get_str(g, kv->key, &s);
    }
    return sum;
}

static unsigned read_tensors(const Gguf *g) {
    unsigned sum = 0;
    char err[ERR_LEN];
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const GgufTensor *t = &g->tensors[i];
        expect(gguf_tensor(g, t->name) == t, "a tensor name does not find its own tensor");
        expect(t->rows >= 1 && t->ne[0] >= 1 && t->bytes == (size_t)t->rows * t->row_bytes, "inconsistent tensor sizes");
        float *row = malloc((size_t)t->ne[0] * sizeof *row), *scales = malloc((size_t)t->ne[0] / 32 * 4 + 4);
        int8_t *q = malloc((size_t)t->ne[0]);
        expect(row && scales && q, "out of memory");
        for (int64_t r = 0; r < t->rows; r++) {
            expect(gguf_read_row(t, r, row, err) == 0, "a row of a tensor that opened cannot be read");
            sum += row[0] > 0;
            if (t->type == GGML_TYPE_Q8_0) expect(gguf_read_row_q8_0(t, r, scales, q, err) == 0, "a Q8_0 row cannot be read raw");
        }
        expect(gguf_read_row(t, t->rows, row, err) == -1, "a row past the end was read");
        free(row);
        free(scales);
        free(q);
    }
    return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64], err[ERR_LEN] = "";
    int fd = bytes_as_file(data, size, path);
    Gguf g;
    if (gguf_open(&g, path, err) == 0) {
        volatile unsigned sink = read_metadata(&g) + read_tensors(&g);
        (void)sink;
        gguf_close(&g);
    } else {
        expect(!strncmp(err, path, strlen(path)) && !strncmp(err + strlen(path), ": ", 2) && !strchr(err, '\n'),
               "a refusal's message is not one line naming the file");
        expect(g.map == NULL && g.kv == NULL && g.tensors == NULL, "a refusal left the Gguf not empty");
    }
    close(fd);
    return 0;
}
