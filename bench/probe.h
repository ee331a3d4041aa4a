// bench/probe.h: what the standalone probes share: a checked CUDA call, a median launch time.
#pragma once
#include <cstdio>

// A CUDA call that must succeed, in a function returning int: else its error and return 1.
#define CK(x)                                                                      \
    do {                                                                           \
        cudaError_t e_ = (x);                                                      \
        if (e_ != cudaSuccess) {                                                   \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));               \
            return 1;                                                              \
        }                                                                          \
    } while (0)

// The median of v[0..n) (n >= 1), sorted in place (insertion sort: a handful to a few hundred values).
template <class T>
T median_of(T *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            const T t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    return v[n / 2];
}

// The median ms of `times` runs of launch() (which returns the launch's cudaError_t) between two
// events; -1 on an error, printed after `what`.
template <class Launch>
float median_ms(Launch launch, int times, const char *what) {
    cudaEvent_t e0, e1;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) return -1.0f;
    float ms[16];
    times = times < 1 ? 1 : times > 16 ? 16 : times;
    for (int i = 0; i < times; i++) {
        cudaError_t e = cudaEventRecord(e0);
        if (e == cudaSuccess) e = launch();
        if (e == cudaSuccess) e = cudaEventRecord(e1);
        if (e == cudaSuccess) e = cudaEventSynchronize(e1);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms[i], e0, e1);
        if (e != cudaSuccess) {
            fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
            return -1.0f;
        }
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return median_of(ms, times);
}

// The current device's properties into *prop; 1, with a line naming the probe and what it needs,
// where the device is below sm_90 (or cannot be read), else 0.
inline int need_sm90(const char *probe, const char *needs, cudaDeviceProp *prop) {
    int dev = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(prop, dev));
    if (prop->major >= 9) return 0;
    fprintf(stderr, "%s: needs sm_90 (%s); this GPU is sm_%d%d\n", probe, needs, prop->major, prop->minor);
    return 1;
}
