// util.h: what every part of the engine needs: checked allocation, reading a whole file, time.
#ifndef UTIL_H
#define UTIL_H

#include <stddef.h>

// calloc that never returns NULL: out of memory is a message and exit 1.
void *xcalloc(size_t n, size_t size);
// The file's bytes, NUL-terminated, at most max_bytes; NULL with "path: reason" in err (ERR_LEN).
char *read_file(const char *path, size_t max_bytes, size_t *bytes, char *err);
long time_in_us(void);   // a monotonic clock
// src copied into dst (cap bytes, NUL-terminated); -1 where it does not fit (dst then empty).
int copy_string(char *dst, size_t cap, const char *src);
// The first `bytes` of open file fd read into an anonymous mapping of their own at a 2 MB
// boundary, with huge pages asked for (Linux: MADV_HUGEPAGE): a stream over the weights then
// takes a TLB entry per 2 MB instead of per 4 KB (bench/NOTES.md 52). Returns their start, or
// NULL with errno set; *region, *region_bytes: the whole mapping, for munmap.
unsigned char *read_resident(int fd, size_t bytes, void **region, size_t *region_bytes);
// Bytes of memory the system could give this process now without swapping (MemAvailable), 0
// where it cannot tell.
size_t memory_available(void);

#endif
