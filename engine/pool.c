// pool.c: worker threads that take parts of jobs. A job's parts are claimed one at a time from a
// single atomic word (generation, parts, next part), by the workers and by the caller alike: a
// worker that the OS has descheduled holds no part it has not claimed, and the caller does the
// rest itself instead of waiting for it. A decode step hands out dozens of jobs a millisecond,
// so idle threads first spin on that word for a while (waking a sleeping thread costs more than
// a job's gap: bench/NOTES.md 36) and only then sleep on a condition variable.
#define _GNU_SOURCE   // sched_getaffinity
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_THREADS 256

// The claim word: generation (32 bits) | parts (16) | next part to hand out (16).
#define CLAIM(gen, parts, next) ((uint64_t)(gen) << 32 | (uint64_t)(parts) << 16 | (uint64_t)(next))
#define CLAIM_GEN(c) ((uint32_t)((c) >> 32))
#define CLAIM_PARTS(c) ((int)((c) >> 16 & 0xffff))
#define CLAIM_NEXT(c) ((int)((c) & 0xffff))

static struct {
    int threads;                 // 0: not started
    pthread_t ids[MAX_THREADS];  // the workers, 1..threads-1
    int stop;                    // workers leave (pool_stop, at exit)
    pthread_mutex_t lock;
    pthread_cond_t start, done;
    _Atomic uint64_t claim;      // see CLAIM
    atomic_int finished;         // parts of the current job done
    // The current job, written before its claim word is published; read only by a thread that
    // holds one of its parts, and the job cannot change before all its parts are done.
    int n;
    void (*fn)(void *ctx, int lo, int hi, int slot);
    void *ctx;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .start = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};

// Spin iterations before sleeping: long enough to cover the gap between a step's jobs, short
// enough not to matter where threads outnumber cores.
#define SPIN_LIMIT 2000

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

// Part p of n items in `parts`: with more parts than threads, the first pool.threads parts share
// TAIL_FROM of the items (one contiguous slice a thread) and the rest the tail in TAIL_PARTS small
// parts a thread, claimed by whichever thread is free first (on a shared host one core is often
// slower for a while: bench/NOTES.md 55); else equal parts.
#define TAIL_FROM 0.875
#define TAIL_PARTS 4
static void part_range(int n, int parts, int p, int *lo, int *hi) {
    const int T = pool.threads;
    if (parts <= T) {
        *lo = (int)((long long)n * p / parts), *hi = (int)((long long)n * (p + 1) / parts);
        return;
    }
    const int head = (int)(n * TAIL_FROM), tails = parts - T;
    if (p < T) *lo = (int)((long long)head * p / T), *hi = (int)((long long)head * (p + 1) / T);
    else *lo = head + (int)((long long)(n - head) * (p - T) / tails), *hi = head + (int)((long long)(n - head) * (p - T + 1) / tails);
}

// Claims and runs parts of generation gen until none is left; slot names the thread's scratch.
static void run_parts(uint32_t gen, int slot) {
    uint64_t c = atomic_load_explicit(&pool.claim, memory_order_acquire);
    while (CLAIM_GEN(c) == gen && CLAIM_NEXT(c) < CLAIM_PARTS(c)) {
        if (!atomic_compare_exchange_weak_explicit(&pool.claim, &c, c + 1, memory_order_acq_rel, memory_order_acquire))
            continue;   // c now holds the word as it is
        const int part = CLAIM_NEXT(c), parts = CLAIM_PARTS(c);
        int lo, hi;
        part_range(pool.n, parts, part, &lo, &hi);
        if (lo < hi) pool.fn(pool.ctx, lo, hi, slot);
        if (atomic_fetch_add_explicit(&pool.finished, 1, memory_order_acq_rel) + 1 == parts) {
            pthread_mutex_lock(&pool.lock);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.lock);
        }
        c = atomic_load_explicit(&pool.claim, memory_order_acquire);
    }
}

// A generation other than `seen`, or 0 when the pool stops.
static uint32_t wait_for_job(uint32_t seen) {
    for (int i = 0; i < SPIN_LIMIT; i++) {
        const uint32_t g = CLAIM_GEN(atomic_load_explicit(&pool.claim, memory_order_acquire));
        if (g != seen) return g;
        cpu_relax();
    }
    pthread_mutex_lock(&pool.lock);
    while (CLAIM_GEN(atomic_load(&pool.claim)) == seen && !pool.stop) pthread_cond_wait(&pool.start, &pool.lock);
    const uint32_t g = pool.stop ? 0 : CLAIM_GEN(atomic_load(&pool.claim));
    pthread_mutex_unlock(&pool.lock);
    return g;
}

static void *worker(void *arg) {
    const int slot = (int)(long)arg;
    uint32_t seen = 0;
    while ((seen = wait_for_job(seen)) != 0) run_parts(seen, slot);
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

// Publishes a job of `parts` parts (its fields first, then the claim word) and wakes sleepers.
static uint32_t publish(int n, int parts, void (*fn)(void *ctx, int lo, int hi, int slot), void *ctx) {
    pthread_mutex_lock(&pool.lock);
    pool.n = n, pool.fn = fn, pool.ctx = ctx;
    atomic_store_explicit(&pool.finished, 0, memory_order_relaxed);
    uint32_t gen = CLAIM_GEN(atomic_load(&pool.claim)) + 1;
    if (gen == 0) gen = 1;   // 0 means "stopped" to a waiting worker
    atomic_store_explicit(&pool.claim, CLAIM(gen, parts, 0), memory_order_release);
    pthread_cond_broadcast(&pool.start);
    pthread_mutex_unlock(&pool.lock);
    return gen;
}

void parallel_for(int n, int min_items, void (*fn)(void *ctx, int lo, int hi, int slot), void *ctx) {
    // one contiguous slice a thread (a late thread's is claimed by the others; 4 parts a thread read
    // slower: bench/NOTES.md 50), and a tail of small parts where the job is large enough
    int parts = pool_threads();
    if (min_items > 0 && n / min_items < parts) parts = n / min_items > 1 ? n / min_items : 1;
    else if ((n - (int)(n * TAIL_FROM)) / (pool_threads() * TAIL_PARTS) >= (min_items > 0 ? min_items : 1))
        parts = pool_threads() * (1 + TAIL_PARTS);   // the slices, then a tail of small parts
    if (pool_threads() == 1 || parts <= 1) {
        if (n > 0) fn(ctx, 0, n, 0);
        return;
    }
    run_parts(publish(n, parts, fn, ctx), 0);
    for (int i = 0; i < SPIN_LIMIT && atomic_load_explicit(&pool.finished, memory_order_acquire) < parts; i++) cpu_relax();
    pthread_mutex_lock(&pool.lock);
    while (atomic_load(&pool.finished) < parts) pthread_cond_wait(&pool.done, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
}
