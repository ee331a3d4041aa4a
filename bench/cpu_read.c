// cpu_read: how fast this machine's CPU threads can read a file's bytes, held as the CPU executor
// holds a checkpoint (read into memory in 2 MB pages: read_resident): the ceiling of a decode step
// that reads every weight once (bench/cpu.sh prints it beside the engines; bench/NOTES.md 50, 52).
//   cpu_read FILE [THREADS [REPEATS]]
// Each thread sums its contiguous slice of the file's bytes as floats, in 16 independent lanes (the
// compiler vectorizes them); all threads start together; a repeat's time runs from the first
// thread's start to the last one's end.
// Prints the median and best GB/s over the repeats, after one untimed pass.
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

enum { LANES = 16, MAX_THREADS = 256, MAX_REPEATS = 1000 };

typedef struct {
    const float *p;
    size_t n;                    // floats of this thread's slice
    pthread_barrier_t *start;
    float sum;                   // kept so the reads are not optimised away
    double t0, t1;               // when the thread began and ended its slice
} Slice;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *read_slice(void *arg) {
    Slice *s = arg;
    float acc[LANES] = {0};
    pthread_barrier_wait(s->start);
    s->t0 = now();
    for (size_t i = 0; i + LANES <= s->n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += s->p[i + l];
    for (int l = 0; l < LANES; l++) s->sum += acc[l];
    s->t1 = now();
    return NULL;
}

// One pass over n floats by `threads` threads; returns seconds from the first thread's start to
// the last one's end.
static double pass(const float *p, size_t n, int threads, float *sink) {
    pthread_t ids[MAX_THREADS];
    Slice s[MAX_THREADS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    const size_t per = n / threads / LANES * LANES;
    for (int t = 0; t < threads; t++) {
        s[t] = (Slice){p + t * per, t == threads - 1 ? n - t * per : per, &start, 0.0f, 0.0, 0.0};
        if (pthread_create(&ids[t], NULL, read_slice, &s[t])) {
            fprintf(stderr, "cpu_read: cannot start thread %d\n", t);
            exit(1);
        }
    }
    double t0 = 0.0, t1 = 0.0;
    for (int t = 0; t < threads; t++) {
        pthread_join(ids[t], NULL);
        *sink += s[t].sum;
        t0 = t == 0 || s[t].t0 < t0 ? s[t].t0 : t0, t1 = s[t].t1 > t1 ? s[t].t1 : t1;
    }
    pthread_barrier_destroy(&start);
    return t1 - t0;
}

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: cpu_read FILE [THREADS [REPEATS]]\n");
        return 1;
    }
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const int threads = argc > 2 ? atoi(argv[2]) : (int)cpus, repeats = argc > 3 ? atoi(argv[3]) : 20;
    if (threads < 1 || threads > MAX_THREADS || repeats < 1 || repeats > MAX_REPEATS) {
        fprintf(stderr, "cpu_read: threads 1 to %d, repeats 1 to %d\n", MAX_THREADS, MAX_REPEATS);
        return 1;
    }
    const int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size < (off_t)(LANES * sizeof(float) * threads)) {
        fprintf(stderr, "cpu_read: %s: cannot open, not a regular file, or too small\n", argv[1]);
        return 1;
    }
    void *region;
    size_t region_bytes;
    const float *p = (const float *)read_resident(fd, (size_t)st.st_size, &region, &region_bytes);
    if (!p) {
        fprintf(stderr, "cpu_read: %s: cannot read into memory\n", argv[1]);
        return 1;
    }
    const size_t n = (size_t)st.st_size / sizeof(float);
    float sink = 0.0f;
    pass(p, n, threads, &sink);
    double gbs[MAX_REPEATS];
    for (int r = 0; r < repeats; r++) gbs[r] = n * sizeof(float) / pass(p, n, threads, &sink) / 1e9;
    qsort(gbs, repeats, sizeof gbs[0], by_value);
    printf("read %.1f MB with %d threads: median %.1f GB/s, best %.1f (%d repeats; checksum %g)\n", n * sizeof(float) / 1e6,
           threads, gbs[repeats / 2], gbs[repeats - 1], repeats, (double)sink);
    return 0;
}
