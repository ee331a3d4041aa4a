// reference.c: float64 linear layers for the tests, split over threads by rows of W.
#include "reference.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

double *mat_to_f64(const Mat *m) {
    double *w = malloc((size_t)m->rows * m->cols * sizeof(double));
    if (!w) abort();
    for (int r = 0; r < m->rows; r++)
        for (int c = 0; c < m->cols; c++)
            w[(size_t)r * m->cols + c] = m->f ? m->f[(size_t)r * m->stride + c]
                                              : (double)m->q[(size_t)r * m->stride + c] * m->s[(size_t)r * m->groups + c / m->gs];
    return w;
}

typedef struct {
    const double *w, *x;   // (N, K), (M, K)
    int N, K, M, r0, r1;   // this thread's rows of W
    double *ref, *mag;
} Slice;

static void *slice_ref(void *arg) {
    const Slice *s = arg;
    for (int r = s->r0; r < s->r1; r++) {
        const double *wr = s->w + (size_t)r * s->K;
        for (int m = 0; m < s->M; m++) {
            const double *xm = s->x + (size_t)m * s->K;
            double sum = 0, abs_sum = 0;
            for (int k = 0; k < s->K; k++) {
                const double t = wr[k] * xm[k];
                sum += t, abs_sum += fabs(t);
            }
            s->ref[(size_t)m * s->N + r] = sum, s->mag[(size_t)m * s->N + r] = abs_sum;
        }
    }
    return NULL;
}

void linear_ref_f64(const double *w, int N, int K, const float *x, int M, double *ref, double *mag) {
    double *xd = malloc((size_t)M * K * sizeof(double));
    if (!xd) abort();
    for (size_t i = 0; i < (size_t)M * K; i++) xd[i] = x[i];
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int n = cpus < 1 ? 1 : cpus > 64 ? 64 : (int)cpus;
    if ((double)N * K * M < 1e6) n = 1;   // not worth a thread
    if (n > N) n = N;
    pthread_t tid[64];
    Slice sl[64];
    for (int t = 0; t < n; t++) {
        sl[t] = (Slice){w, xd, N, K, M, (int)((long long)N * t / n), (int)((long long)N * (t + 1) / n), ref, mag};
        if (t > 0 && pthread_create(&tid[t], NULL, slice_ref, &sl[t])) abort();
    }
    slice_ref(&sl[0]);
    for (int t = 1; t < n; t++) pthread_join(tid[t], NULL);
    free(xd);
}
