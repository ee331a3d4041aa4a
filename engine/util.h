// util.h: what every part of the engine needs: checked allocation, reading a whole file, time.
#ifndef UTIL_H
#define UTIL_H

#include <stddef.h>

// calloc that never returns NULL: out of memory is a message and exit 1.
void *xcalloc(size_t n, size_t size);
// The file's bytes, NUL-terminated, at most max_bytes; NULL with "path: reason" in err (ERR_LEN).
char *read_file(const char *path, size_t max_bytes, size_t *bytes, char *err);
long time_in_us(void);   // a monotonic clock

#endif
