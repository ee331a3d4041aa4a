// pool.h: a persistent pool of worker threads for the CPU executor. parallel_for splits [0, n)
// into one contiguous slice per thread (the caller's thread takes the first) and returns when all
// are done; a slice's work is whatever fn does with it, so the results do not depend on the
// number of threads when each output is computed by one slice.
#ifndef POOL_H
#define POOL_H

// Starts threads - 1 workers (once; later calls with another count are ignored). threads < 1: the
// CPUs this process may run on.
void pool_init(int threads);
int pool_threads(void);
// fn(ctx, lo, hi, slot) for the slices of [0, n); slot in [0, pool_threads()) names the thread's
// scratch. Under min_items items a slice, fewer threads take part (the hand-off costs more).
void parallel_for(int n, int min_items, void (*fn)(void *ctx, int lo, int hi, int slot), void *ctx);

#endif
