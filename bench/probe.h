// bench/probe.h: what the standalone probes (kv_read_probe.cu, mma_probe.cu) share.
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
