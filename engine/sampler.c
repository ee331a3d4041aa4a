// sampler.c: llama2.c's sampler, exactly (xorshift generator, top-p procedure), so that a seed
// reproduces llama2.c's text; the top-p candidates ordered by a radix sort instead of qsort.
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "util.h"
#include "vec.h"

// x = softmax(x), in place: max subtracted, exp, normalised by the sum.
void softmax(float *x, int n) {
    float max_val = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > max_val) max_val = x[i];
    vec_exp_sub(x, n, max_val);   // expf(x[i] - max_val), several at a time
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += x[i];
    for (int i = 0; i < n; i++) x[i] /= sum;
}

int argmax_row(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

unsigned int random_u32(unsigned long long *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (*state * 0x2545F4914F6CDD1Dull) >> 32;
}

float random_f32(unsigned long long *state) { return (random_u32(state) >> 8) / 16777216.0f; }

int sample_mult(const float *probabilities, int n, float coin) {
    float cdf = 0.0f;
    for (int i = 0; i < n; i++) {
        cdf += probabilities[i];
        if (coin < cdf) return i;
    }
    return n - 1;   // rounding
}

// The sort key of a probability >= 0: its bits inverted, so that ascending keys are descending
// probabilities (the bits of non-negative floats order as their values).
static uint32_t prob_key(float prob) {
    uint32_t bits;
    memcpy(&bits, &prob, sizeof bits);
    return ~bits;
}

// Sorts items (n, probabilities >= 0) largest first, equal ones in their given order: a stable
// LSD radix sort, a byte of the key per pass, through tmp (n); the four bytes' histograms in one
// read, and a pass whose byte is the same for every item (the exponent, in a flat distribution)
// skipped. Linear time: where top-p keeps nearly every token (flat distributions, such as random
// weights' at -t 0.8) qsort took milliseconds a token over 32000 candidates (bench/NOTES.md).
void sort_by_prob(ProbIndex *items, ProbIndex *tmp, int n) {
    if (n < 2) return;
    int count[4][256] = {{0}};
    for (int i = 0; i < n; i++) {
        const uint32_t key = prob_key(items[i].prob);
        for (int b = 0; b < 4; b++) count[b][(key >> 8 * b) & 255]++;
    }
    ProbIndex *src = items, *dst = tmp;
    for (int b = 0; b < 4; b++) {
        if (count[b][(prob_key(src[0].prob) >> 8 * b) & 255] == n) continue;   // one bucket: nothing moves
        int start[256];
        for (int d = 0, sum = 0; d < 256; d++) start[d] = sum, sum += count[b][d];
        for (int i = 0; i < n; i++) dst[start[(prob_key(src[i].prob) >> 8 * b) & 255]++] = src[i];
        ProbIndex *t = src;
        src = dst, dst = t;
    }
    if (src != items) memcpy(items, src, (size_t)n * sizeof *items);
}

// Samples from the smallest set of tokens whose probability exceeds topp, the tokens in
// descending probability (equal ones by index). Tokens under (1 - topp) / (n - 1) cannot be in
// that set and are dropped before the sort. probindex, tmp: n each.
int sample_topp(const float *probabilities, int n, float topp, ProbIndex *probindex, ProbIndex *tmp, float coin) {
    int n0 = 0;
    const float cutoff = (1.0f - topp) / (n - 1);
    for (int i = 0; i < n; i++)
        if (probabilities[i] >= cutoff) probindex[n0++] = (ProbIndex){probabilities[i], i};
    // none: a flat distribution and topp under 1 / n, whose set is the most probable token alone
    if (n0 == 0) return argmax_row(probabilities, n);
    sort_by_prob(probindex, tmp, n0);
    float cumulative_prob = 0.0f;
    int last_idx = n0 - 1;
    for (int i = 0; i < n0; i++) {
        cumulative_prob += probindex[i].prob;
        if (cumulative_prob > topp) {
            last_idx = i;
            break;
        }
    }
    float r = coin * cumulative_prob, cdf = 0.0f;
    for (int i = 0; i <= last_idx; i++) {
        cdf += probindex[i].prob;
        if (r < cdf) return probindex[i].index;
    }
    return probindex[last_idx].index;
}

void build_sampler(Sampler *s, int vocab_size, float temperature, float topp, unsigned long long seed) {
    s->vocab_size = vocab_size;
    s->temperature = temperature;
    s->topp = topp;
    s->rng_state = seed;
    s->probindex = xcalloc(vocab_size, sizeof(ProbIndex));
    s->sort_tmp = xcalloc(vocab_size, sizeof(ProbIndex));
    s->scratch = xcalloc(vocab_size, sizeof(float));
}

void free_sampler(Sampler *s) {
    free(s->probindex);
    free(s->sort_tmp);
    free(s->scratch);
}

// Next token from one row of logits in host memory.
int sample_host(Sampler *s, const float *row) {
    if (s->temperature == 0.0f) return argmax_row(row, s->vocab_size);
    float *p = s->scratch;
    memcpy(p, row, s->vocab_size * sizeof(float));
    for (int q = 0; q < s->vocab_size; q++) p[q] /= s->temperature;
    softmax(p, s->vocab_size);
    float coin = random_f32(&s->rng_state);
    if (s->topp <= 0 || s->topp >= 1) return sample_mult(p, s->vocab_size, coin);
    return sample_topp(p, s->vocab_size, s->topp, s->probindex, s->sort_tmp, coin);
}

