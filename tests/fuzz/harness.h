// harness.h: what every fuzz target shares. The input as an anonymous in-memory file (the
// loaders take paths, as the programs do); and, with -DFUZZ_REPLAY (gcc builds without libFuzzer,
// for the normal test run), a main that runs each file named on the command line through the
// target once, where a finding aborts under the sanitizers. A target that needs setup first
// defines REPLAY_INIT as its LLVMFuzzerInitialize before including this.
#ifndef FUZZ_HARNESS_H
#define FUZZ_HARNESS_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE   // memfd_create
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static inline int bytes_as_file(const uint8_t *data, size_t size, char path[64]) {
    int fd = memfd_create("fuzz-input", 0);
    if (fd < 0) abort();
    for (size_t at = 0; at < size;) {
        ssize_t n = write(fd, data + at, size - at);
        if (n <= 0) abort();
        at += (size_t)n;
    }
    snprintf(path, 64, "/proc/self/fd/%d", fd);
    return fd;
}

#ifdef FUZZ_REPLAY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
#ifdef REPLAY_INIT
int REPLAY_INIT(int *argc, char ***argv);
#endif
int main(int argc, char **argv) {
#ifdef REPLAY_INIT
    REPLAY_INIT(&argc, &argv);
#endif
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        uint8_t *data = malloc((size_t)1 << 24);
        size_t size = f && data ? fread(data, 1, (size_t)1 << 24, f) : 0;
        if (!f || !data || ferror(f)) {
            fprintf(stderr, "%s: cannot read\n", argv[i]);
            if (f) fclose(f);
            free(data);
            return 1;
        }
        fclose(f);
        LLVMFuzzerTestOneInput(data, size);
        free(data);
    }
    printf("replayed %d inputs\n", argc - 1);
    return 0;
}
#endif

#endif
