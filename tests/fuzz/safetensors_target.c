// safetensors_target.c: libFuzzer target for st_open. The contract: every input is opened or
// refused with one line naming the file, never a crash, an out-of-bounds access, undefined
// behaviour or an exit. An opened checkpoint is read: every tensor found by name, its first and
// last bytes touched, its first and last elements converted when it holds floats.
//   first byte even: the rest is one .safetensors file (an in-memory file, as fuzz.c's)
//   first byte odd:  a sharded directory: u16 L, L bytes of model.safetensors.index.json, u16 M,
//                    M bytes of shard "1.safetensors", the rest shard "2.safetensors"
//   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iengine tests/fuzz/safetensors_target.c engine/safetensors.c engine/json.c engine/util.c -lm
#define _GNU_SOURCE
#include "harness.h"   // bytes_as_file; main for -DFUZZ_REPLAY
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model.h"   // ERR_LEN
#include "safetensors.h"

static void fail(const char *what) {
    fprintf(stderr, "safetensors_target: %s\n", what);
    abort();
}

static void write_all(int fd, const uint8_t *data, size_t size) {
    for (size_t at = 0; at < size;) {
        ssize_t n = write(fd, data + at, size - at);
        if (n <= 0) fail("cannot write the input");
        at += (size_t)n;
    }
}

static void write_file(const char *path, const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) fail("cannot write a shard");
}

// A u16 length at *data, then that many bytes (fewer if the input ends): the piece, advanced past.
static const uint8_t *take(const uint8_t **data, size_t *size, size_t *len) {
    const uint8_t *p;
    *len = *size >= 2 ? (size_t)((*data)[0] | (*data)[1] << 8) : 0;
    *data += *size >= 2 ? 2 : *size;
    *size -= *size >= 2 ? 2 : *size;
    if (*len > *size) *len = *size;
    p = *data;
    *data += *len, *size -= *len;
    return p;
}

static char dir[64], index_path[96], s1[96], s2[96];   // the sharded mode's directory (made once) and files

static void remove_dir(void) {
    unlink(index_path), unlink(s1), unlink(s2), rmdir(dir);
}

// In /dev/shm where there is one: files on a disk cost milliseconds each, 20x the parsing.
static void make_dir(void) {
    if (!mkdtemp(strcpy(dir, "/dev/shm/st_fuzz.XXXXXX")) && !mkdtemp(strcpy(dir, "/tmp/st_fuzz.XXXXXX"))) fail("mkdtemp");
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    snprintf(s1, sizeof s1, "%s/1.safetensors", dir);
    snprintf(s2, sizeof s2, "%s/2.safetensors", dir);
    atexit(remove_dir);
}

static void open_and_read(const char *path, const char *names) {
    SafeTensors st;
    char err[ERR_LEN] = "";
    if (st_open(&st, path, err) != 0) {
        if (!err[0] || !strstr(err, names) || strchr(err, '\n') || st.n || st.files) fail(err);
        return;
    }
    for (int i = 0; i < st.n; i++) {
        const StTensor *t = &st.tensors[i];
        volatile unsigned char sink;
        float f[2];
        if (st_find(&st, t->name) != t || t->bytes != (size_t)t->numel * st_dtype_size(t->dtype)) fail("a tensor's entry is inconsistent");
        if (t->bytes) sink = ((const unsigned char *)t->data)[0], sink = ((const unsigned char *)t->data)[t->bytes - 1];
        (void)sink;
        int floats = t->dtype == ST_F32 || t->dtype == ST_F16 || t->dtype == ST_BF16;
        if (t->numel && (st_read_floats(t, 0, 1, f, err) != 0) == floats) fail("st_read_floats of the first element");
        if (t->numel && (st_read_floats(t, t->numel - 1, 1, f + 1, err) != 0) == floats) fail("st_read_floats of the last element");
        if (st_read_floats(t, t->numel, 1, f, err) == 0) fail("st_read_floats past the end");
    }
    st_close(&st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int sharded = data[0] & 1;
    data++, size--;
    if (!sharded) {
        char path[64];
        int fd = memfd_create("fuzz-safetensors", 0);
        if (fd < 0) fail("memfd_create");
        write_all(fd, data, size);
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        open_and_read(path, path);
        close(fd);
        return 0;
    }
    if (!dir[0]) make_dir();
    size_t n_index, n1;
    const uint8_t *index_bytes = take(&data, &size, &n_index), *shard1 = take(&data, &size, &n1);
    write_file(index_path, index_bytes, n_index);
    write_file(s1, shard1, n1);
    write_file(s2, data, size);
    open_and_read(dir, dir);
    return 0;
}
