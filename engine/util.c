// util.c: checked allocation, whole-file reads, time.
#include "util.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "model.h"   // ERR_LEN

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n, size);
    if (!p) {
        fprintf(stderr, "run: out of memory allocating %zu bytes\n", n * size);
        exit(1);
    }
    return p;
}

char *read_file(const char *path, size_t max_bytes, size_t *bytes, char *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, ERR_LEN, "%.300s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *data = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) snprintf(err, ERR_LEN, "%.300s: cannot determine its size", path);
    else if ((size_t)n > max_bytes) snprintf(err, ERR_LEN, "%.300s: %ld bytes is more than the %zu allowed", path, n, max_bytes);
    else if (!(data = malloc(n + 1))) snprintf(err, ERR_LEN, "%.300s: out of memory", path);
    else if (fread(data, 1, n, f) != (size_t)n) {
        snprintf(err, ERR_LEN, "%.300s: read error", path);
        free(data);
        data = NULL;
    }
    fclose(f);
    if (data) {
        data[n] = '\0';
        *bytes = n;
    }
    return data;
}

long time_in_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000L + t.tv_nsec / 1000;
}

int copy_string(char *dst, size_t cap, const char *src) {
    const size_t len = strlen(src);
    if (cap == 0) return -1;
    if (len >= cap) return dst[0] = '\0', -1;
    memcpy(dst, src, len + 1);
    return 0;
}

#define RESIDENT_ALIGN ((size_t)2 << 20)
unsigned char *read_resident(int fd, size_t bytes, void **region, size_t *region_bytes) {
    const size_t span = (bytes + RESIDENT_ALIGN - 1) / RESIDENT_ALIGN * RESIDENT_ALIGN + RESIDENT_ALIGN;
    void *r = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return NULL;
    unsigned char *base = (unsigned char *)(((uintptr_t)r + RESIDENT_ALIGN - 1) & ~(uintptr_t)(RESIDENT_ALIGN - 1));
#ifdef MADV_HUGEPAGE
    (void)madvise(base, span - (size_t)(base - (unsigned char *)r), MADV_HUGEPAGE);   // a hint: without it, small pages
#endif
    for (size_t got = 0; got < bytes;) {
        const ssize_t n = pread(fd, base + got, bytes - got, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            if (n == 0) errno = EIO;   // the file shrank under us
            munmap(r, span);
            return NULL;
        }
        got += (size_t)n;
    }
    (void)mprotect(r, span, PROT_READ);   // read-only from here, as a mapped file is: a stray write faults
    *region = r, *region_bytes = span;
    return base;
}

size_t memory_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    if (kb) return (size_t)kb * 1024;
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);   // free pages only: an underestimate
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
}
