// sampler.h: llama2.c's sampler: its xorshift generator, softmax, multinomial and top-p draws,
// so that a seed gives llama2.c's text. Host memory only; the GPU's own sampling kernel follows
// the same procedure (kernels.h gpu_sample_rows).
#ifndef SAMPLER_H
#define SAMPLER_H

#include <stdint.h>

typedef struct {
    float prob;
    int index;
} ProbIndex;

typedef struct {
    int vocab_size;
    ProbIndex *probindex, *sort_tmp;   // (vocab_size) each: scratch for top-p
    float temperature, topp;           // temperature 0: greedy
    unsigned long long rng_state;
    float *scratch;                    // (vocab_size) logits the sampler may scale in place
} Sampler;

void build_sampler(Sampler *s, int vocab_size, float temperature, float topp, unsigned long long seed);
void free_sampler(Sampler *s);
// Next token from one row of logits (vocab_size) in host memory.
int sample_host(Sampler *s, const float *row);

unsigned int random_u32(unsigned long long *state);   // llama2.c's xorshift
float random_f32(unsigned long long *state);          // uniform in [0, 1)
void softmax(float *x, int n);
int argmax_row(const float *v, int n);                // the first index of the maximum
// The token where the running sum of probabilities (n) first exceeds coin (the last on rounding).
int sample_mult(const float *probabilities, int n, float coin);
// Top-p: from the smallest set of most probable tokens whose sum exceeds topp, equal
// probabilities by index. probindex, tmp: scratch of n each.
int sample_topp(const float *probabilities, int n, float topp, ProbIndex *probindex, ProbIndex *tmp, float coin);
// items (n, probabilities >= 0) largest first, equal ones in their given order, through tmp (n).
void sort_by_prob(ProbIndex *items, ProbIndex *tmp, int n);

#endif
