// reference.h: the float64 reference every linear kernel is tested against, computed on all the
// machine's cores (tests/reference.c is built without sanitizers: plain loops over the tests'
// own arrays).
#ifndef REFERENCE_H
#define REFERENCE_H

#include "model.h"

// W (rows, cols) as doubles: q * s for INT8, f for FP32. Free with free().
double *mat_to_f64(const Mat *m);
// ref (M, N) = x (M, K) W^T in double, and mag (M, N) = sum_k |w x|, the scale of a kernel's
// rounding error. w: (N, K) doubles.
void linear_ref_f64(const double *w, int N, int K, const float *x, int M, double *ref, double *mag);

#endif
