// pool.c: worker threads that sleep on a condition variable between jobs; a job is published
// with a generation number, each worker runs its slice and counts itself done.
#define _GNU_SOURCE   // sched_getaffinity
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_THREADS 256

static struct {
    int threads;                 // 0: not started
    pthread_t ids[MAX_THREADS];  // the workers, 1..threads-1
    int stop;                    // workers leave (pool_stop, at exit)
    pthread_mutex_t lock;
    pthread_cond_t start, done;
    unsigned long generation;    // bumped for each job
    int pending;                 // workers still running the current job
    int n, parts;                // the job: [0, n) in parts slices
    void (*fn)(void *ctx, int lo, int hi, int slot);
    void *ctx;
} pool = {0, {0}, 0, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, NULL, NULL};

static void run_slice(int part) {
    const int lo = (int)((long long)pool.n * part / pool.parts), hi = (int)((long long)pool.n * (part + 1) / pool.parts);
    if (lo < hi) pool.fn(pool.ctx, lo, hi, part);
}

static void *worker(void *arg) {
    const int slot = (int)(long)arg;
    unsigned long seen = 0;
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        while (pool.generation == seen && !pool.stop) pthread_cond_wait(&pool.start, &pool.lock);
        if (pool.stop) break;
        seen = pool.generation;
        const int mine = slot < pool.parts;
        pthread_mutex_unlock(&pool.lock);
        if (mine) run_slice(slot);
        pthread_mutex_lock(&pool.lock);
        if (mine && --pool.pending == 0) pthread_cond_signal(&pool.done);
    }
    pthread_mutex_unlock(&pool.lock);
    return NULL;
}

// At exit: the workers leave and are joined, so that no thread outlives the program's own state.
static void pool_stop(void) {
    pthread_mutex_lock(&pool.lock);
    pool.stop = 1;
    pthread_cond_broadcast(&pool.start);
    pthread_mutex_unlock(&pool.lock);
    for (int t = 1; t < pool.threads; t++) pthread_join(pool.ids[t], NULL);
}

static int cpus_available(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    return 1;
}

void pool_init(int threads) {
    if (pool.threads) return;
    if (threads < 1) threads = cpus_available();
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    pool.threads = 1;
    for (int t = 1; t < threads; t++) {
        if (pthread_create(&pool.ids[t], NULL, worker, (void *)(long)t)) break;   // fewer threads: still correct
        pool.threads++;
    }
    if (pool.threads > 1) atexit(pool_stop);
}

int pool_threads(void) {
    pool_init(0);
    return pool.threads;
}

void parallel_for(int n, int min_items, void (*fn)(void *ctx, int lo, int hi, int slot), void *ctx) {
    int parts = pool_threads();
    if (min_items > 0 && n / min_items < parts) parts = n / min_items > 1 ? n / min_items : 1;
    if (parts <= 1) {
        if (n > 0) fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&pool.lock);
    pool.n = n, pool.parts = parts, pool.fn = fn, pool.ctx = ctx;
    pool.pending = parts - 1;
    pool.generation++;
    pthread_cond_broadcast(&pool.start);
    pthread_mutex_unlock(&pool.lock);
    run_slice(0);
    pthread_mutex_lock(&pool.lock);
    while (pool.pending > 0) pthread_cond_wait(&pool.done, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
}
