// test_run.c: unit and end-to-end tests, built against the engine's own sources (engine/*.c, the
// GPU kernels, cuda/testing.cu) under AddressSanitizer and UBSan.
// Prints one line per test: PASS, FAIL or SKIP; after each group a line "== group: N passed, N
// failed, N skipped (T s)"; then the totals; exits 1 if anything failed.
// Usage: test_run [--gpu-only] [--quick] [--gpu-part PART] [models-dir] (default: models),
// run from the repository root (it calls ./quantize). --gpu-only: the GPU groups alone;
// --gpu-part PART: one GPU group alone (instrumented runs in pieces): linear (the linear
// kernels), batch (batches and the too-large checkpoint), models (whole models), or one third of
// models: random, long (the context of 1300), real (the real checkpoints and the 7B shapes);
// --quick: without the 7B-shaped model and code15M, and whole models run 8 decode steps past
// their prefill (for the slow compute-sanitizer and valgrind runs); the skipped reported so.
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exec.h"
#include "model.h"
#include "reference.h"
#include "sampler.h"
#include "text.h"
#include "tokenizer.h"
#include "util.h"
#include "vec.h"
#include "ref_encode.h"
#ifdef HAVE_GPU
#include "dispatch.h"
#include "kernels.h"
#include "testing.h"
#endif

static int n_pass, n_fail, n_skip;
static char tmpdir[256] = "/tmp/q8test.XXXXXX";
static const char *models_dir = "models";
static int quick;   // --quick
static const char *gpu_part;   // --gpu-part: one of the GPU groups (NULL: all)
static int is_gpu_part(const char *name) {
    const char *parts[] = {"linear", "batch", "models", "random", "long", "real"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (!strcmp(name, parts[i])) return 1;
    return 0;
}
#define TEST_USAGE "usage: test_run [--gpu-only] [--quick] [--gpu-part linear|batch|models|random|long|real] [models-dir] | --fixtures DIR\n"

static void check(int ok, const char *name, const char *fmt, ...) {
    if (ok) {
        printf("PASS %s\n", name);
        n_pass++;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL %s: ", name);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    n_fail++;
}

static void skip(const char *name, const char *why) {
    printf("SKIP %s: %s\n", name, why);
    n_skip++;
}

// Runs a group of tests, then prints its counts and time.
static void run_group(const char *name, void (*group)(void)) {
    const int p = n_pass, f = n_fail, s = n_skip;
    const long t0 = time_in_us();
    group();
    printf("== %s: %d passed, %d failed, %d skipped (%.1f s)\n", name, n_pass - p, n_fail - f, n_skip - s,
           (time_in_us() - t0) / 1e6);
}

// ----------------------------------------------------------------------------
// Random numbers and small helpers

static unsigned long long rng_state = 0x853c49e6748fea9bull;
static float urand(void) { return (random_u32(&rng_state) >> 8) / 16777216.0f; }   // [0, 1)
// Uniform in [-sqrt(3), sqrt(3)): mean 0, variance 1, and cheap for the bulk inputs of the kernel
// checks (millions a run).
static float urand_unit(void) { return 1.7320508f * (2.0f * urand() - 1.0f); }
static float nrand(void) {
    float u1 = urand() + 1e-7f, u2 = urand();
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

static void *arena[4096];
static int n_arena;
static void *talloc(size_t bytes) {
    void *p = xcalloc(bytes ? bytes : 1, 1);
    arena[n_arena++] = p;
    return p;
}
static void arena_free(void) {
    while (n_arena) free(arena[--n_arena]);
}

// dir/name in one of 8 rotating buffers (a few paths are alive at once)
static char *join(const char *dir, const char *name) {
    static char buf[8][512];
    static int i;
    char *p = buf[i++ % 8];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}
static char *tpath(const char *name) { return join(tmpdir, name); }
static char *model_path(const char *name) { return join(models_dir, name); }

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int sh(const char *fmt, ...) {
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd);
}

// relative L2 error of a against the reference b; NaN stays NaN
static double rel_l2(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return sqrt(num / den);
}

// ----------------------------------------------------------------------------
// Quantizer

static void test_quantize_row(void) {
    int gss[] = {128, 64, 32, 8, 16, 7}, colss[] = {64, 172, 200, 1, 300, 4096};
    for (size_t a = 0; a < sizeof gss / sizeof gss[0]; a++)
        for (size_t b = 0; b < sizeof colss / sizeof colss[0]; b++) {
            int gs = gss[a], cols = colss[b], groups = ceil_div(cols, gs);
            float *w = talloc(cols * sizeof(float)), *s = talloc(groups * sizeof(float));
            int8_t *q = talloc(cols);
            for (int j = 0; j < cols; j++) w[j] = nrand() * (j / gs % 3 == 1 ? 1e-3f : 0.5f);
            int zero_group = groups > 1 ? 1 : -1;   // one all-zero group where there are several
            for (int j = 0; zero_group >= 0 && j < cols; j++)
                if (j / gs == zero_group) w[j] = 0.0f;
            for (int j = 0; j < cols; j++) q[j] = 0x55;   // poison
            for (int g = 0; g < groups; g++) s[g] = NAN;   // poison
            quantize_row(w, cols, gs, q, s);
            int ok = 1;
            char what[200] = "";
            for (int g = 0; g < groups && ok; g++) {
                int lo = g * gs, hi = lo + gs < cols ? lo + gs : cols, qmax = 0;
                for (int j = lo; j < hi; j++) {
                    double err = fabs((double)q[j] * s[g] - w[j]);
                    if (!(err <= s[g] * 0.5 * (1 + 1e-6) + 1e-30) || q[j] < -127) {
                        snprintf(what, sizeof what, "element %d: w %g q %d scale %g err %g", j, w[j], q[j], s[g], err);
                        ok = 0;
                        break;
                    }
                    qmax = abs(q[j]) > qmax ? abs(q[j]) : qmax;
                }
                if (ok && g == zero_group && !(s[g] == 0.0f && qmax == 0)) {
                    snprintf(what, sizeof what, "zero group %d has scale %g, max |q| %d", g, s[g], qmax);
                    ok = 0;
                }
                if (ok && g != zero_group && qmax != 127) {
                    snprintf(what, sizeof what, "group %d's largest weight maps to %d, not 127", g, qmax);
                    ok = 0;
                }
            }
            char name[64];
            snprintf(name, sizeof name, "quantize_row gs=%d cols=%d", gs, cols);
            check(ok, name, "%s", what);
        }
}

// ----------------------------------------------------------------------------
// A random model in memory, and a float64 reference forward over any Mat.

static Mat random_mat(int rows, int cols, int quantized, int gs, float std) {
    float *f = talloc((size_t)rows * cols * sizeof(float));
    for (size_t i = 0; i < (size_t)rows * cols; i++) f[i] = nrand() * std;
    Mat m = {rows, cols, cols, 0, 0, f, NULL, NULL, NULL};
    if (!quantized) return m;
    m = (Mat){rows, cols, round_up(cols, ROW_ALIGN), gs, ceil_div(cols, gs), NULL, NULL, NULL, NULL};
    int8_t *q = talloc((size_t)rows * m.stride);
    float *s = talloc((size_t)rows * m.groups * sizeof(float));
    for (int r = 0; r < rows; r++) quantize_row(f + (size_t)r * cols, cols, gs, q + (size_t)r * m.stride, s + (size_t)r * m.groups);
    m.q = q, m.s = s;
    return m;
}

static void random_model(Model *m, Config c, int quantized, int gs, int shared) {
    memset(m, 0, sizeof *m);
    config_defaults(&c);
    m->cfg = c;
    m->quantized = quantized;
    m->gs = gs;
    m->shared_classifier = shared;
    alloc_layer_mats(&m->w, c.n_layers);
    arena[n_arena++] = m->w.wq;
    m->w.tok_embedding = random_mat(c.vocab_size, c.dim, quantized, gs, 1.0f);
    Mat *dst[7] = {m->w.wq, m->w.wk, m->w.wv, m->w.wo, m->w.w1, m->w.w2, m->w.w3};
    for (int w = 0; w < 7; w++)
        for (int l = 0; l < c.n_layers; l++) {
            int rows, cols;
            linear_shape(&c, w, &rows, &cols);
            dst[w][l] = random_mat(rows, cols, quantized, gs, 1.0f / sqrtf(cols));
        }
    m->w.wcls = shared ? m->w.tok_embedding : random_mat(c.vocab_size, c.dim, quantized, gs, 1.0f / sqrtf(c.dim));
    float *norms = talloc(((size_t)2 * c.n_layers + 1) * c.dim * sizeof(float));
    for (size_t i = 0; i < ((size_t)2 * c.n_layers + 1) * c.dim; i++) norms[i] = 1.0f + 0.2f * nrand();
    m->w.rms_att = norms;
    m->w.rms_ffn = norms + (size_t)c.n_layers * c.dim;
    m->w.rms_final = norms + (size_t)2 * c.n_layers * c.dim;
    if (!c.qkv_bias) return;
    const size_t qd = (size_t)q_dim_of(&c), kvd = (size_t)kv_width_of(&c);
    float *b = talloc((size_t)c.n_layers * (qd + 2 * kvd) * sizeof(float));
    for (size_t i = 0; i < (size_t)c.n_layers * (qd + 2 * kvd); i++) b[i] = 0.5f * nrand();
    m->w.bq = b, m->w.bk = b + (size_t)c.n_layers * qd, m->w.bv = m->w.bk + (size_t)c.n_layers * kvd;
}

static double wval(const Mat *m, int r, int c) {
    if (m->f) return m->f[(size_t)r * m->stride + c];
    return (double)m->q[(size_t)r * m->stride + c] * m->s[(size_t)r * m->groups + c / m->gs];
}

static void ref_matvec(double *out, const double *x, const Mat *m) {
    for (int r = 0; r < m->rows; r++) {
        double acc = 0;
        for (int c = 0; c < m->cols; c++) acc += wval(m, r, c) * x[c];
        out[r] = acc;
    }
}

static void ref_rmsnorm(double *out, const double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    ss = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * ss * x[i];
}

// RoPE angle per position of pair i of a head, in double: theta^(-2i/hs), with Llama 3.1's scaling
// written from its definition (wavelength bands), independently of the engine's.
static double ref_rope_freq(const Config *c, int i) {
    const RopeScaling *r = &c->rope_scaling;
    double f = pow(c->rope_theta, -2.0 * i / c->head_dim);
    if (r->type != ROPE_LLAMA3) return f;
    double wavelen = 2 * M_PI / f, ratio = r->original_context / wavelen;   // periods within the original context
    if (ratio < r->low_freq_factor) return f / r->factor;                  // long wavelengths: stretched
    if (ratio > r->high_freq_factor) return f;                             // short: kept
    double t = (ratio - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
    return (1 - t) * f / r->factor + t * f;
}

static void ref_add(double *out, const float *b, int n) {
    for (int i = 0; i < n; i++) out[i] += b[i];
}

// Logits (T, vocab) of tokens[0..T) at positions 0..T-1, all in double.
static double *ref_forward(const Model *m, const int *tokens, int T) {
    const Config *c = &m->cfg;
    int D = c->dim, H = c->hidden_dim, hs = c->head_dim, qd = hs * c->n_heads, kvd = hs * c->n_kv_heads, kv_mul = c->n_heads / c->n_kv_heads;
    int wide = D > qd ? D : qd;
    double *x = talloc(D * 8.0), *xb = talloc(wide * 8.0), *q = talloc(qd * 8.0), *o = talloc(qd * 8.0);
    double *h1 = talloc(H * 8.0), *h3 = talloc(H * 8.0), *att = talloc(T * 8.0);
    double *K = talloc((size_t)c->n_layers * T * kvd * 8), *V = talloc((size_t)c->n_layers * T * kvd * 8);
    double *logits = talloc((size_t)T * c->vocab_size * 8);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < D; i++) x[i] = wval(&m->w.tok_embedding, tokens[t], i);
        for (int l = 0; l < c->n_layers; l++) {
            double *k = K + ((size_t)l * T + t) * kvd, *v = V + ((size_t)l * T + t) * kvd;
            ref_rmsnorm(xb, x, m->w.rms_att + (size_t)l * D, D, c->norm_eps);
            ref_matvec(q, xb, &m->w.wq[l]);
            ref_matvec(k, xb, &m->w.wk[l]);
            ref_matvec(v, xb, &m->w.wv[l]);
            if (m->w.bq) {
                ref_add(q, m->w.bq + (size_t)l * qd, qd);
                ref_add(k, m->w.bk + (size_t)l * kvd, kvd);
                ref_add(v, m->w.bv + (size_t)l * kvd, kvd);
            }
            for (int i = 0; i < qd; i += 2) {
                double ang = t * ref_rope_freq(c, (i % hs) / 2), cs = cos(ang), sn = sin(ang);
                double *vecs[2] = {q, k};
                for (int w = 0; w < (i < kvd ? 2 : 1); w++) {
                    double a = vecs[w][i], b = vecs[w][i + 1];
                    vecs[w][i] = a * cs - b * sn;
                    vecs[w][i + 1] = a * sn + b * cs;
                }
            }
            for (int h = 0; h < c->n_heads; h++) {
                double mx = -1e300, sum = 0;
                for (int u = 0; u <= t; u++) {
                    const double *ku = K + ((size_t)l * T + u) * kvd + (h / kv_mul) * hs;
                    double sc = 0;
                    for (int i = 0; i < hs; i++) sc += q[h * hs + i] * ku[i];
                    att[u] = sc / sqrt(hs);
                    mx = att[u] > mx ? att[u] : mx;
                }
                for (int u = 0; u <= t; u++) sum += att[u] = exp(att[u] - mx);
                for (int i = 0; i < hs; i++) {
                    double acc = 0;
                    for (int u = 0; u <= t; u++) acc += att[u] / sum * V[((size_t)l * T + u) * kvd + (h / kv_mul) * hs + i];
                    o[h * hs + i] = acc;
                }
            }
            ref_matvec(xb, o, &m->w.wo[l]);
            for (int i = 0; i < D; i++) x[i] += xb[i];
            ref_rmsnorm(xb, x, m->w.rms_ffn + (size_t)l * D, D, c->norm_eps);
            ref_matvec(h1, xb, &m->w.w1[l]);
            ref_matvec(h3, xb, &m->w.w3[l]);
            for (int i = 0; i < H; i++) h1[i] = h1[i] / (1 + exp(-h1[i])) * h3[i];
            ref_matvec(xb, h1, &m->w.w2[l]);
            for (int i = 0; i < D; i++) x[i] += xb[i];
        }
        ref_rmsnorm(xb, x, m->w.rms_final, D, c->norm_eps);
        ref_matvec(logits + (size_t)t * c->vocab_size, xb, &m->w.wcls);
    }
    return logits;
}

// Runs tokens through an executor: a batched prefill of `first` tokens, then one at a time.
// Returns the logits of every position, (T, vocab), copied to host memory.
// Prefill chunk of the tests: smaller than the engine's MAX_TOKENS, so that prompts of the small
// models cross chunk boundaries.
#define TEST_CHUNK 32
static int prefill_chunk = TEST_CHUNK;   // exec_logits' chunk; MAX_TOKENS where the wgmma kernel must run

static float *exec_logits(Exec *e, const int *tokens, int T, int first) {
    int V = e->cfg.vocab_size;
    float *out = talloc((size_t)T * V * sizeof(float));
    for (size_t i = 0; i < (size_t)T * V; i++) out[i] = NAN;   // poison
    for (int pos = 0; pos < T;) {
        int M = pos < first ? (first - pos < prefill_chunk ? first - pos : prefill_chunk) : 1;
        // single tokens go through the decode step (all_logits 0), which the GPU replays as a graph
        const float *l = e->ops->to_host(e, forward(e, tokens + pos, M, pos, M > 1), M);
        memcpy(out + (size_t)pos * V, l, (size_t)M * V * sizeof(float));
        pos += M;
    }
    return out;
}

// prompt[0..n) into sequence 0 at positions 0.., in chunks of TEST_CHUNK.
static void prefill_test_chunks(Exec *e, const int *prompt, int n) {
    for (int done = 0; done < n; done += TEST_CHUNK) forward(e, prompt + done, n - done < TEST_CHUNK ? n - done : TEST_CHUNK, done, 0);
}

// A batch of B sequences through an executor made for them (n_seqs = B): a shared prompt of n
// tokens prefilled into sequence 0 and copied, then `steps` batched decode steps, sequence b fed
// its own tokens tok[step][b]. Returns the logits of every step, (steps, B, vocab), in host memory.
static float *batch_logits(Exec *e, const int *prompt, int n, const int *tok, int B, int steps) {
    int V = e->cfg.vocab_size;
    float *out = talloc((size_t)steps * B * V * sizeof(float));
    prefill_test_chunks(e, prompt, n);
    e->ops->copy_cache(e, n);
    for (int st = 0; st < steps; st++) {
        const float *l = e->ops->to_host(e, forward_batch(e, tok + (size_t)st * B, B, n + st), B);
        memcpy(out + (size_t)st * B * V, l, (size_t)B * V * sizeof(float));
    }
    return out;
}

// The same, each sequence alone in a one-sequence executor: the reference for batch_logits.
static float *separate_logits(const Model *m, const int *prompt, int n, const int *tok, int B, int steps, int context) {
    int V = m->cfg.vocab_size;
    float *out = talloc((size_t)steps * B * V * sizeof(float));
    for (int b = 0; b < B; b++) {
        Exec e;
        cpu_exec_init(&e, m, 1, context);
        prefill_test_chunks(&e, prompt, n);
        for (int st = 0; st < steps; st++) {
            const float *l = forward(&e, &tok[(size_t)st * B + b], 1, n + st, 0);
            memcpy(out + ((size_t)st * B + b) * V, l, V * sizeof(float));
        }
        e.ops->release(&e);
    }
    return out;
}

// Random prompt (BOS first) and per-step tokens of a batch.
static void batch_tokens(int V, int *prompt, int n, int *tok, int count) {
    for (int i = 0; i < n; i++) prompt[i] = i == 0 ? BOS : (int)(random_u32(&rng_state) % V);
    for (int i = 0; i < count; i++) tok[i] = (int)(random_u32(&rng_state) % V);
}

// Top-p's reference: the candidates ordered by qsort with a total order (probability descending,
// then index), then the same cumulative walk as sample_topp.
static int cmp_prob_then_index(const void *a, const void *b) {
    const ProbIndex *x = a, *y = b;
    if (x->prob != y->prob) return x->prob > y->prob ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}
static int topp_ref(const float *p, int n, float topp, float coin) {
    ProbIndex *c = talloc(n * sizeof(ProbIndex));
    int n0 = 0;
    for (int i = 0; i < n; i++)
        if (p[i] >= (1.0f - topp) / (n - 1)) c[n0++] = (ProbIndex){p[i], i};
    qsort(c, n0, sizeof(ProbIndex), cmp_prob_then_index);
    float cum = 0.0f;
    int last = n0 - 1;
    for (int i = 0; i < n0; i++)
        if ((cum += c[i].prob) > topp) {
            last = i;
            break;
        }
    float r = coin * cum, cdf = 0.0f;
    for (int i = 0; i <= last; i++)
        if (r < (cdf += c[i].prob)) return c[i].index;
    return c[last].index;
}

// sample_topp (radix-sorted candidates) == the qsort reference on fresh distributions: flat
// (32000 logits of spread 0.1: nearly all kept), peaked (spread 3), with many exact ties (logits
// on a grid of 0.5), and tiny vocabularies; top-p 0.5, 0.9, 0.99; coins across [0, 1).
static void test_topp_sampling(void) {
    int ns[] = {2, 3, 17, 512, 32000};
    float spreads[] = {0.1f, 3.0f, -1.0f}, topps[] = {0.5f, 0.9f, 0.99f};
    char what[200] = "";
    int cases = 0, fail = 0;
    for (int ni = 0; ni < 5 && !fail; ni++)
        for (int si = 0; si < 3 && !fail; si++)
            for (int rep = 0; rep < 4 && !fail; rep++) {
                int n = ns[ni];
                float *p = talloc(n * sizeof(float));
                ProbIndex *pi = talloc(n * sizeof(ProbIndex)), *tmp = talloc(n * sizeof(ProbIndex));
                for (int i = 0; i < n; i++) p[i] = spreads[si] > 0 ? spreads[si] * nrand() : 0.5f * (int)(4 * urand());
                softmax(p, n);
                for (int ti = 0; ti < 3 && !fail; ti++)
                    for (int k = 0; k < 8 && !fail; k++, cases++) {
                        float coin = k == 0 ? 0.0f : k == 7 ? 0.99999994f : urand();
                        int got = sample_topp(p, n, topps[ti], pi, tmp, coin), want = topp_ref(p, n, topps[ti], coin);
                        if (got != want) {
                            snprintf(what, sizeof what, "n %d, spread %g, top-p %g, coin %g: token %d, reference %d", n,
                                     spreads[si], topps[ti], coin, got, want);
                            fail = 1;
                        }
                    }
            }
    check(!fail, "top-p sampling (radix sort) == qsort reference (flat, peaked, tied; n 2 to 32000)", "%s (%d cases)", what, cases);
    // a uniform distribution with top-p under 1 / n: every token is under the cutoff (1 - p) / (n - 1);
    // the set is then the first most probable token (no read before the candidates)
    int n = 32000, got = -1;
    float *p = talloc(n * sizeof(float));
    ProbIndex *pi = talloc(n * sizeof(ProbIndex)), *tmp = talloc(n * sizeof(ProbIndex));
    for (int i = 0; i < n; i++) p[i] = 1.0f / n;
    got = sample_topp(p, n, 1e-6f, pi, tmp, 0.5f);
    check(got == 0, "top-p 1e-6 over a uniform distribution: the first token", "token %d", got);
    arena_free();
}

static void test_cpu_batch(void) {
    Config c = LLAMA2C_CONFIG(64, 96, 2, 4, 2, 61, 48);
    for (int q = 0; q < 2; q++) {
        Model m;
        random_model(&m, c, q, 32, 1);
        int B = 5, n = 7, steps = 20, context = 30, prompt[7], tok[100];
        batch_tokens(c.vocab_size, prompt, n, tok, B * steps);
        Exec e;
        cpu_exec_init(&e, &m, B, context);
        float *got = batch_logits(&e, prompt, n, tok, B, steps), *ref = separate_logits(&m, prompt, n, tok, B, steps, 0);
        e.ops->release(&e);
        size_t bad = 0, total = (size_t)steps * B * c.vocab_size;
        for (size_t i = 0; i < total; i++) bad += !(got[i] == ref[i]);
        check(bad == 0, q ? "cpu batch of 5 sequences == each alone, bit for bit (int8)" : "cpu batch of 5 sequences == each alone, bit for bit (fp32)",
              "%zu of %zu logits differ", bad, total);
        arena_free();
    }
}

// y (M, N) vs the float64 reference: each element within rel * sum_k |w x| (1e-5 for FP32
// accumulation over up to 11008 terms), NaN (an unwritten output) fails. Returns the first
// failure or NULL.
static const char *check_ref(const float *y, const double *ref, const double *mag, int M, int N, double rel, char *what) {
    for (size_t i = 0; i < (size_t)M * N; i++)
        if (!(fabs(y[i] - ref[i]) <= rel * mag[i] + 1e-30)) {
            snprintf(what, 200, "M %d: y[%zu][%zu] = %g, reference %g (tolerance %.2e)", M, i / N, i % N, y[i], ref[i], rel * mag[i]);
            return what;
        }
    return NULL;
}

// The CPU matmul on every instruction set this CPU has (vec.c), awkward shapes: K not a multiple
// of the 16 lanes or of the group size, gs not a multiple of 16 (the dequantize-first path), rows
// not a multiple of the tile, M from 1 up. Each result against the float64 reference within
// 1e-5 x sum_k |w x|, outputs poisoned with NaN first; a slice split at an odd row and a token's
// row computed alone (M = 1) must give the same bits as the whole call.
static float *cpu_matmul_poisoned(const Mat *w, const float *x, int M, const float *y0, int split, float *scratch) {
    float *y = talloc((size_t)M * w->rows * sizeof(float));
    for (size_t i = 0; i < (size_t)M * w->rows; i++) y[i] = y0 ? y0[i] : NAN;
    vec_matmul_slice(w, x, M, y, y0 != NULL, 0, split, scratch);
    vec_matmul_slice(w, x, M, y, y0 != NULL, split, w->rows, scratch);
    return y;
}

// The first failure for this shape and M, or NULL.
static const char *cpu_matmul_failure(int N, int K, int gs, int M, char what[200]) {
    float *x = talloc((size_t)M * K * sizeof(float)), *y0 = talloc((size_t)M * N * sizeof(float));
    float *scratch = talloc((size_t)VEC_TILE_ROWS * K * sizeof(float));
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = urand_unit();
    for (size_t i = 0; i < (size_t)M * N; i++) y0[i] = urand_unit();
    const Mat w = random_mat(N, K, gs > 0, gs, 0.5f);
    double *wd = mat_to_f64(&w), *ref = talloc((size_t)M * N * sizeof(double)), *mag = talloc((size_t)M * N * sizeof(double));
    linear_ref_f64(wd, N, K, x, M, ref, mag);
    free(wd);
    const float *whole = cpu_matmul_poisoned(&w, x, M, NULL, N, scratch);
    const char *bad = check_ref(whole, ref, mag, M, N, 1e-5, what);   // names M
    const float *acc = cpu_matmul_poisoned(&w, x, M, y0, N, scratch);
    const float *split = cpu_matmul_poisoned(&w, x, M, NULL, N / 2 | 1, scratch);
    const float *alone = cpu_matmul_poisoned(&w, x + (size_t)(M - 1) * K, 1, NULL, N, scratch);
    const char *differs = NULL;
    for (size_t i = 0; i < (size_t)M * N && !bad && !differs; i++) {
        if (!(acc[i] == y0[i] + whole[i])) differs = "accumulating: y0 + W x differs from W x added to y0";
        if (!(split[i] == whole[i])) differs = "a slice split at an odd row gives other bits";
        if (i >= (size_t)(M - 1) * N && !(alone[i - (size_t)(M - 1) * N] == whole[i])) differs = "the last token alone (M = 1) gives other bits";
    }
    if (differs) snprintf(what, 200, "M %d: %s", M, differs), bad = what;
    return bad;
}

static void test_cpu_matmul_shape(int N, int K, int gs, const char *isa) {
    static const int Ms[] = {1, 2, 3, 4, 5, 9};
    char name[160], what[200];
    const char *bad = NULL;
    int M = 0;
    for (size_t i = 0; i < sizeof Ms / sizeof Ms[0] && !bad; i++) bad = cpu_matmul_failure(N, K, gs, M = Ms[i], what);
    char kind[16] = "fp32";
    if (gs) snprintf(kind, sizeof kind, "int8 gs %d", gs);
    snprintf(name, sizeof name, "cpu matmul %s: N %d K %d %s, M 1 to 9", isa, N, K, kind);
    check(!bad, name, "%s", bad);
}

// Attention's scores on this instruction set: att[t] = q . k_t / sqrt(n) for T keys in one call
// against the float64 reference within 1e-5 x sum |q k|, and bit for bit what each key gives alone
// (T = 1), which decode's scores are: a scores kernel that batches keys (as one summing 16 at a
// time by hsum16 did, bench/NOTES.md 50) must keep each key's bits; keys a stride apart wider
// than n, awkward n and T; att poisoned first.
static void test_cpu_scores(const char *isa) {
    static const int ns[] = {6, 16, 48, 50, 128}, Ts[] = {1, 15, 16, 17, 40};
    char name[160];
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof Ts / sizeof Ts[0]; b++) {
            const int n = ns[a], T = Ts[b];
            const size_t stride = (size_t)n + 3;
            float *q = talloc(n * sizeof(float)), *keys = talloc(T * stride * sizeof(float)), *att = talloc(T * sizeof(float));
            for (int i = 0; i < n; i++) q[i] = urand_unit();
            for (size_t i = 0; i < T * stride; i++) keys[i] = urand_unit();
            for (int t = 0; t < T; t++) att[t] = NAN;
            vec_scores(q, keys, stride, T, n, att);
            const char *bad = NULL;
            double err = 0.0;
            for (int t = 0; t < T && !bad; t++) {
                double ref = 0.0, mag = 0.0;
                for (int i = 0; i < n; i++) ref += (double)q[i] * keys[t * stride + i], mag += fabs((double)q[i] * keys[t * stride + i]);
                ref /= sqrt((double)n), mag /= sqrt((double)n);
                float alone = NAN;
                vec_scores(q, keys + t * stride, stride, 1, n, &alone);
                err = fabs(att[t] - ref);
                if (!(err <= 1e-5 * mag)) bad = "off the float64 reference";
                else if (!(att[t] == alone)) bad = "other bits than the key alone";
            }
            snprintf(name, sizeof name, "cpu attention scores %s: n %d, %d keys == float64 (1e-5) and each key alone", isa, n, T);
            check(!bad, name, "%s (error %.3e)", bad, err);
        }
}

// A block of queries (vec_scores_block, vec_weighted_sum_block: a prompt's tokens in the attention)
// against each query alone through vec_scores and vec_weighted_sum (decode's path), bit for bit:
// 1 to VEC_QUERIES queries attending to ragged row counts (T[i] = first + i, as a prompt's tokens
// do, and one query with fewer rows than the one before), awkward n, keys and values a stride
// apart wider than n; outputs poisoned first.
static void test_cpu_attention_block(const char *isa) {
    static const int ns[] = {6, 16, 20, 48, 50, 128}, firsts[] = {1, 4, 15, 17, 40};
    char name[200];
    const char *bad = NULL;
    int cases = 0;
    for (size_t a = 0; a < sizeof ns / sizeof ns[0] && !bad; a++)
        for (size_t b = 0; b < sizeof firsts / sizeof firsts[0] && !bad; b++)
            for (int nq = 1; nq <= VEC_QUERIES && !bad; nq++, cases++) {
                const int n = ns[a], stride = n + 3, rows = firsts[b] + VEC_QUERIES;
                int T[VEC_QUERIES];
                for (int i = 0; i < nq; i++) T[i] = firsts[b] + i;
                if (nq > 2) T[nq - 1] = T[nq - 2] - 1 > 0 ? T[nq - 2] - 1 : 1;   // not always increasing
                float *q = talloc((size_t)nq * n * sizeof(float)), *keys = talloc((size_t)rows * stride * sizeof(float));
                float *values = talloc((size_t)rows * stride * sizeof(float)), *att = talloc((size_t)nq * rows * sizeof(float));
                float *out = talloc((size_t)nq * n * sizeof(float)), *one = talloc((size_t)rows * sizeof(float)), *ref = talloc(n * sizeof(float));
                for (int i = 0; i < nq * n; i++) q[i] = urand_unit(), out[i] = NAN;
                for (int i = 0; i < rows * stride; i++) keys[i] = urand_unit(), values[i] = urand_unit();
                for (int i = 0; i < nq * rows; i++) att[i] = NAN;
                vec_scores_block(q, n, nq, keys, stride, T, n, att, rows);
                for (int i = 0; i < nq && !bad; i++) {
                    vec_scores(q + (size_t)i * n, keys, stride, T[i], n, one);
                    for (int t = 0; t < T[i]; t++)
                        if (!(att[(size_t)i * rows + t] == one[t])) bad = "scores: other bits than the query alone";
                }
                for (int i = 0; i < nq; i++)   // weights of a softmax's size
                    for (int t = 0; t < T[i]; t++) att[(size_t)i * rows + t] = urand() / T[i];
                vec_weighted_sum_block(out, n, att, rows, T, nq, values, stride, n);
                for (int i = 0; i < nq && !bad; i++) {
                    vec_weighted_sum(ref, att + (size_t)i * rows, values, stride, T[i], n);
                    for (int j = 0; j < n; j++)
                        if (!(out[(size_t)i * n + j] == ref[j])) bad = "weighted sums: other bits than the query alone";
                }
                if (bad) snprintf(name, sizeof name, "n %d, first %d, %d queries", n, firsts[b], nq);
            }
    char what[200];
    snprintf(what, sizeof what, "cpu attention of a block of queries %s == each query alone, bit for bit (n 6 to 128, 1 to %d queries)",
             isa, VEC_QUERIES);
    check(!bad, what, "%s: %s (%d cases)", name, bad, cases);
}

// vec_exp_sub against the platform's expf, bit for bit (where that is glibc's: the vector code
// does its operations), over a stride through every float's bits (specials, denormals, the edges
// of expf's main path included), in runs of lengths that leave a tail, with sub 0 and not.
static void test_cpu_exp(const char *isa) {
    char name[160];
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 27)
    enum { RUN = 1003 };
    static const float edges[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 88.0f, -88.0f, 0x1.62e42ep6f, 0x1.62e430p6f,
                                  -0x1.9fe368p6f, -0x1.9fe36ap6f, -0x1.9d1d9ep6f, -0x1.9d1da0p6f, 1e-40f, -1e-40f, 87.99f, -103.5f};
    float in[RUN], out[RUN];
    long differ = 0, n = 0;
    uint32_t first_bad = 0;
    for (uint64_t b = 0; b < (1ull << 32); b += (uint64_t)RUN * 4099) {
        for (int i = 0; i < RUN; i++) {
            const uint32_t u = (uint32_t)(b + (uint64_t)i * 4099);
            memcpy(&in[i], &u, 4);
            if (i < (int)(sizeof edges / sizeof edges[0]) && b == 0) in[i] = edges[i];
        }
        const float sub = (b / RUN) % 3 == 0 ? 0.0f : urand_unit() * 50.0f;
        memcpy(out, in, sizeof out);
        vec_exp_sub(out, RUN - (int)(b % 7), sub);
        for (int i = 0; i < RUN - (int)(b % 7); i++, n++) {
            const float ref = expf(in[i] - sub);
            if (!(memcmp(&ref, &out[i], 4) == 0 || (isnan(ref) && isnan(out[i]))) && differ++ == 0) memcpy(&first_bad, &in[i], 4);
        }
    }
    snprintf(name, sizeof name, "cpu exp %s: %ld inputs == glibc's expf bit for bit", isa, n);
    check(differ == 0 && n > 1000000, name, "%ld differ, the first at input bits 0x%08x", differ, first_bad);
#else
    snprintf(name, sizeof name, "cpu exp %s: == the platform's expf (glibc 2.27 or later only)", isa);
    skip(name, "the C library is not glibc 2.27 or later");
#endif
}

static void test_cpu_matmul(void) {
    static const int shapes[][3] = {   // N, K, gs (0: FP32)
        {1, 16, 16}, {7, 33, 16}, {13, 100, 32}, {33, 288, 64}, {5, 172, 64}, {9, 130, 128},
        {31, 257, 48}, {6, 40, 8}, {11, 77, 0}, {4, 288, 0}, {17, 15, 0},
    };
    int tested = 0;
    for (int i = 0; i < vec_isa_count(); i++) {
        if (vec_select_isa(i) != 0) continue;
        tested++;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            test_cpu_matmul_shape(shapes[s][0], shapes[s][1], shapes[s][2], vec_isa_name());
        test_cpu_scores(vec_isa_name());
        test_cpu_attention_block(vec_isa_name());
        test_cpu_exp(vec_isa_name());
        arena_free();
    }
    for (int i = 0; i < vec_isa_count(); i++)   // back to the best one
        if (vec_select_isa(i) == 0) break;
    check(tested > 0, "cpu matmul: at least one instruction set runs here", "none of %d", vec_isa_count());
}

// The int8 x int8 prefill matmul (vec_q8q8.c, CPUs with AVX512-VNNI): x quantized per token and
// block (each element within half a step of x), then the matmul
// against the float64 product of the weights with that quantized x, within 1e-5 x sum_k |w x|
// (only FP32 rounding of the group sums may differ: the products are exact integers); against
// the unquantized x within relative L2 5e-2 (the quantization's cost: x here has an element 8x the
// others' range in every 7, so its groups' steps are coarse; 1-2e-2 measured); outputs poisoned first,
// accumulating, a slice split at an odd row and the last token alone giving the same bits.
static const char *q8q8_failure(int N, int K, int gs, int M, char what[200]) {
    float *x = talloc((size_t)M * K * sizeof(float)), *y0 = talloc((size_t)M * N * sizeof(float));
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = urand_unit() * (i % 7 == 3 ? 8.0f : 1.0f);   // a few larger elements
    for (size_t i = 0; i < (size_t)M * N; i++) y0[i] = urand_unit();
    const Mat w = random_mat(N, K, 1, gs, 0.5f);
    const VecActQ8 a = vec_act_q8(M, K, gs, talloc(vec_act_q8_bytes(M, K, gs)));
    memset(a.q, 0x55, vec_act_q8_bytes(M, K, gs));   // poison
    if (a.kpad != round_up(K, 4) || a.blk < 4 || a.blk > VEC_ACT_BLOCK || gs % a.blk || a.blocks != ceil_div(K, a.blk))
        return snprintf(what, 200, "layout kpad %d blk %d blocks %d for K %d gs %d", a.kpad, a.blk, a.blocks, K, gs), what;
    vec_quantize_act(x, &a, 0, M);
    float *xd = talloc((size_t)M * K * sizeof(float));   // the quantized x, as the matmul sees it
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) {
            const float s = a.s[m * a.blocks + k / a.blk];
            const double d = ((int)a.q[(size_t)m * a.kpad + k] - 128) * (double)s;
            xd[(size_t)m * K + k] = (float)d;
            if (!(fabs(d - x[(size_t)m * K + k]) <= 0.5 * s * (1 + 1e-5) + 1e-30))
                return snprintf(what, 200, "M %d: x[%d][%d] = %g quantized to %g (step %g)", M, m, k, x[(size_t)m * K + k], d, s), what;
        }
    for (int m = 0; m < M; m++)
        for (int k = K; k < a.kpad; k++)
            if (a.q[(size_t)m * a.kpad + k] != 128) return snprintf(what, 200, "M %d: padding of token %d is not 128", M, m), what;
    double *wd = mat_to_f64(&w), *ref = talloc((size_t)M * N * sizeof(double)), *mag = talloc((size_t)M * N * sizeof(double));
    double *exact = talloc((size_t)M * N * sizeof(double)), *emag = talloc((size_t)M * N * sizeof(double));
    linear_ref_f64(wd, N, K, xd, M, ref, mag);
    linear_ref_f64(wd, N, K, x, M, exact, emag);
    free(wd);
    void *scratch = talloc(vec_q8q8_scratch_bytes(K, gs));
    float *y[4];
    const int splits[4] = {N, N, N / 2 | 1, N};
    for (int v = 0; v < 4; v++) {   // whole, accumulating, split, the last token alone
        const int Mv = v == 3 ? 1 : M;
        VecActQ8 av = a;
        if (v == 3) av.M = 1, av.q += (size_t)(M - 1) * a.kpad, av.s += (size_t)(M - 1) * a.blocks;
        y[v] = talloc((size_t)Mv * N * sizeof(float));
        for (size_t i = 0; i < (size_t)Mv * N; i++) y[v][i] = v == 1 ? y0[i] : NAN;
        vec_matmul_q8q8_slice(&w, &av, y[v], v == 1, 0, splits[v], scratch);
        vec_matmul_q8q8_slice(&w, &av, y[v], v == 1, splits[v], N, scratch);
    }
    const char *bad = check_ref(y[0], ref, mag, M, N, 1e-5, what);
    const double e = rel_l2(y[0], exact, (size_t)M * N);
    if (!bad && !(e <= 5e-2)) snprintf(what, 200, "M %d: relative L2 %.3e from the unquantized product", M, e), bad = what;
    for (size_t i = 0; i < (size_t)M * N && !bad; i++) {
        if (!(y[1][i] == y0[i] + y[0][i])) snprintf(what, 200, "M %d: accumulating differs", M), bad = what;
        else if (!(y[2][i] == y[0][i])) snprintf(what, 200, "M %d: a slice split at an odd row gives other bits", M), bad = what;
        else if (i >= (size_t)(M - 1) * N && !(y[3][i - (size_t)(M - 1) * N] == y[0][i]))
            snprintf(what, 200, "M %d: the last token alone gives other bits", M), bad = what;
    }
    return bad;
}

static void test_cpu_matmul_q8q8(void) {
    static const int shapes[][3] = {   // N, K, gs
        {1, 16, 16}, {7, 33, 16}, {13, 100, 32}, {33, 288, 64}, {17, 172, 64}, {9, 130, 128}, {31, 257, 48}, {6, 40, 8}, {40, 768, 128},
    };
    static const int Ms[] = {1, 3, 8, 9, 17, 33};
    if (!vec_has_int8_act()) {
        skip("cpu int8 x int8 prefill matmul", "this CPU has no AVX512-VNNI");
        return;
    }
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        char name[160], what[200];
        const char *bad = NULL;
        for (size_t i = 0; i < sizeof Ms / sizeof Ms[0] && !bad; i++) bad = q8q8_failure(shapes[sh][0], shapes[sh][1], shapes[sh][2], Ms[i], what);
        snprintf(name, sizeof name, "cpu int8 x int8 matmul: N %d K %d gs %d, M 1 to 33", shapes[sh][0], shapes[sh][1], shapes[sh][2]);
        check(!bad, name, "%s", bad);
        arena_free();
    }
}

static const Config small_shapes[] = {
    LLAMA2C_CONFIG(48, 172, 2, 6, 2, 67, 24),    // head size 8, grouped-query ratio 3, hidden not a multiple of any GS
    LLAMA2C_CONFIG(64, 100, 1, 4, 4, 50, 16),    // no grouping
    LLAMA2C_CONFIG(40, 56, 2, 5, 1, 33, 70),     // head size 8, ratio 5; a context longer than TEST_CHUNK
    // Hugging Face models' features: head_dim other than dim / n_heads, RoPE base and epsilon,
    // q/k/v biases (Qwen2), Llama 3.1's RoPE scaling with an original context shorter than ours
    {.dim = 48, .hidden_dim = 100, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 67, .seq_len = 40,
     .head_dim = 20, .rope_theta = 500000.0f, .norm_eps = 1e-6f, .qkv_bias = 1, .rope_scaling = {ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 16}},
    {.dim = 64, .hidden_dim = 96, .n_layers = 2, .n_heads = 8, .n_kv_heads = 1, .vocab_size = 50, .seq_len = 36,
     .head_dim = 6, .rope_theta = 1e6f, .qkv_bias = 1},
};

static void test_cpu_forward(void) {
    for (size_t si = 0; si < sizeof small_shapes / sizeof small_shapes[0]; si++)
        for (int quantized = 0; quantized <= 1; quantized++)
            for (int shared = 0; shared <= 1; shared++) {
                Config c = small_shapes[si];
                Model m;
                random_model(&m, c, quantized, quantized ? 32 : 0, shared);
                int T = c.seq_len, *tokens = talloc(T * sizeof(int));
                for (int t = 0; t < T; t++) tokens[t] = random_u32(&rng_state) % c.vocab_size;
                double *ref = ref_forward(&m, tokens, T);
                Exec e;
                cpu_exec_init(&e, &m, 1, 0);
                int first = T < 7 ? T : 7;
                float *got = exec_logits(&e, tokens, T, first);
                double err = rel_l2(got, ref, (size_t)T * c.vocab_size);
                char name[128];
                snprintf(name, sizeof name, "cpu forward vs float64 reference: shape %zu %s %s", si, quantized ? "int8 gs32" : "fp32",
                         shared ? "shared" : "unshared");
                check(err <= 1e-4, name, "relative L2 error %.3e > 1e-4", err);
                // batched prefill is the same computation as token by token
                float *seq = exec_logits(&e, tokens, T, 1);
                double diff = 0;
                for (size_t i = 0; i < (size_t)T * c.vocab_size; i++) diff = fmax(diff, fabs(seq[i] - got[i]));
                snprintf(name, sizeof name, "cpu batched prefill == sequential: shape %zu %s", si, quantized ? "int8" : "fp32");
                check(diff == 0.0, name, "max difference %.3e", diff);
                e.ops->release(&e);
                arena_free();
            }
}

// The int8 x int8 prefill in the CPU executor (cpu_exec_int8_prefill): a prompt of 16 tokens or
// more in one chunk within relative L2 2e-2 of the float64 reference (the exact path: 1e-4), and
// not equal to the exact path's logits (so it ran); one token at a time it is the exact path.
static void test_cpu_int8_prefill(void) {
    if (!vec_has_int8_act()) {
        skip("cpu int8 x int8 prefill in the executor", "this CPU has no AVX512-VNNI");
        return;
    }
    for (size_t si = 0; si < sizeof small_shapes / sizeof small_shapes[0]; si++) {
        Config c = small_shapes[si];
        Model m;
        random_model(&m, c, 1, 32, 0);
        const int T = c.seq_len;
        int *tokens = talloc(T * sizeof(int));
        for (int t = 0; t < T; t++) tokens[t] = random_u32(&rng_state) % c.vocab_size;
        double *ref = ref_forward(&m, tokens, T);
        Exec exact, fast;
        cpu_exec_init(&exact, &m, 1, 0);
        float *want = exec_logits(&exact, tokens, T, T), *seq = exec_logits(&exact, tokens, T, 1);
        exact.ops->release(&exact);
        cpu_exec_init(&fast, &m, 1, 0);
        cpu_exec_int8_prefill(&fast, 1);
        float *got = exec_logits(&fast, tokens, T, T), *got_seq = exec_logits(&fast, tokens, T, 1);
        fast.ops->release(&fast);
        const double err = rel_l2(got, ref, (size_t)T * c.vocab_size);
        double diff = 0, seq_diff = 0;
        for (size_t i = 0; i < (size_t)T * c.vocab_size; i++) diff = fmax(diff, fabs(got[i] - want[i])), seq_diff = fmax(seq_diff, fabs(got_seq[i] - seq[i]));
        char name[160];
        snprintf(name, sizeof name, "cpu int8 x int8 prefill of %d tokens vs float64 reference: shape %zu (relative L2 < 2e-2, not the exact path's bits)", T, si);
        check(err <= 2e-2 && diff > 0, name, "relative L2 error %.3e, max difference from the exact path %.3e", err, diff);
        printf("     (int8 x int8 prefill: relative L2 error %.2e)\n", err);
        snprintf(name, sizeof name, "cpu int8 x int8 prefill enabled, one token at a time == the exact path: shape %zu", si);
        check(seq_diff == 0.0, name, "max difference %.3e", seq_diff);
        arena_free();
    }
}

// ----------------------------------------------------------------------------
// Loaders: good files of every format, and each kind of bad one.

static int write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

static unsigned char *slurp(const char *path, size_t *n) {
    char err[ERR_LEN];
    char *d = read_file(path, (size_t)1 << 30, n, err);
    if (d) arena[n_arena++] = d;
    return (unsigned char *)d;
}

static void put_floats(unsigned char **p, const float *f, size_t n) {
    memcpy(*p, f, n * 4);
    *p += n * 4;
}

// The v1 and v2 layouts of llama2.c's export.py, written from a loaded FP32 model: fixtures only.
// Both start with the 256-byte header (v2 adds the group size) and the FP32 norms; returns the end.
static unsigned char *llama2c_header(unsigned char *buf, const Model *m, int version, int gs) {
    const Config *c = &m->cfg;
    size_t D = c->dim, L = c->n_layers;
    uint32_t magic = LLAMA2C_MAGIC;
    int32_t hdr[8] = {version, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size, c->seq_len};
    unsigned char *p = buf + HEADER_BYTES;
    memcpy(buf, &magic, 4), memcpy(buf + 4, hdr, 32);
    buf[36] = (unsigned char)m->shared_classifier;
    if (version == 2) memcpy(buf + 37, &gs, 4);
    put_floats(&p, m->w.rms_att, L * D), put_floats(&p, m->w.rms_ffn, L * D), put_floats(&p, m->w.rms_final, D);
    return p;
}

static size_t write_v1(const char *path, const Model *m) {
    const Config *c = &m->cfg;
    size_t D = c->dim, L = c->n_layers, n = HEADER_BYTES + 4 * ((2 * L + 1) * D + 2 * (size_t)c->vocab_size * D);
    for (int w = 0; w < 7; w++) n += 4 * fp32_linear_floats(c, w);
    unsigned char *buf = talloc(n), *p = llama2c_header(buf, m, 1, 0);
    put_floats(&p, m->w.tok_embedding.f, (size_t)c->vocab_size * D);
    const Mat *src[7] = {m->w.wq, m->w.wk, m->w.wv, m->w.wo, m->w.w1, m->w.w2, m->w.w3};
    for (int w = 0; w < 7; w++)
        for (size_t l = 0; l < L; l++) put_floats(&p, src[w][l].f, (size_t)src[w][l].rows * src[w][l].cols);
    if (!m->shared_classifier) put_floats(&p, m->w.wcls.f, (size_t)c->vocab_size * D);
    n = p - buf;
    return write_file(path, buf, n) ? 0 : n;
}

static void put_q80(unsigned char **p, const float *w, size_t n, int gs) {
    float *s = talloc(n / gs * 4);
    for (size_t g = 0; g < n / gs; g++) quantize_row(w + g * gs, gs, gs, (int8_t *)*p + g * gs, s + g);   // flattened groups
    *p += n;
    put_floats(p, s, n / gs);
}

static size_t write_v2(const char *path, const Model *m, int gs) {
    const Config *c = &m->cfg;
    size_t D = c->dim, L = c->n_layers, n = HEADER_BYTES + 4 * (2 * L + 1) * D + 10 * (size_t)c->vocab_size * D;
    for (int w = 0; w < 7; w++) n += 5 * fp32_linear_floats(c, w);
    unsigned char *buf = talloc(n), *p = llama2c_header(buf, m, 2, gs);
    put_q80(&p, m->w.tok_embedding.f, (size_t)c->vocab_size * D, gs);
    Mat *src[7] = {m->w.wq, m->w.wk, m->w.wv, m->w.wo, m->w.w1, m->w.w2, m->w.w3};
    for (int w = 0; w < 7; w++)
        for (size_t l = 0; l < L; l++) put_q80(&p, src[w][l].f, (size_t)src[w][l].rows * src[w][l].cols, gs);
    if (!m->shared_classifier) put_q80(&p, m->w.wcls.f, (size_t)c->vocab_size * D, gs);
    n = p - buf;
    return write_file(path, buf, n) ? 0 : n;
}

// max |a - b| over all linear weights of two models of one config
static double max_weight_diff(const Model *a, const Model *b) {
    double d = 0;
    const Config *c = &a->cfg;
    const Mat *ma[7] = {a->w.wq, a->w.wk, a->w.wv, a->w.wo, a->w.w1, a->w.w2, a->w.w3};
    const Mat *mb[7] = {b->w.wq, b->w.wk, b->w.wv, b->w.wo, b->w.w1, b->w.w2, b->w.w3};
    for (int w = 0; w < 7; w++)
        for (int l = 0; l < c->n_layers; l++)
            for (int r = 0; r < ma[w][l].rows; r++)
                for (int k = 0; k < ma[w][l].cols; k++) d = fmax(d, fabs(wval(&ma[w][l], r, k) - wval(&mb[w][l], r, k)));
    for (int r = 0; r < c->vocab_size; r++)
        for (int k = 0; k < c->dim; k++) {
            d = fmax(d, fabs(wval(&a->w.tok_embedding, r, k) - wval(&b->w.tok_embedding, r, k)));
            d = fmax(d, fabs(wval(&a->w.wcls, r, k) - wval(&b->w.wcls, r, k)));
        }
    return d;
}

// Expects load_model to refuse `bytes` written as a file, with a message naming the file, both
// mapped and read into memory (LOAD_RESIDENT), with the same message.
static void expect_refused(const char *name, const unsigned char *bytes, size_t n, const char *keyword) {
    char *path = tpath("bad.bin"), err[ERR_LEN] = "", err2[ERR_LEN] = "";
    Model m;
    write_file(path, bytes, n);
    int rc = load_model(path, &m, err);
    if (rc == 0) free_model(&m);
    int rc2 = load_model_as(path, &m, LOAD_RESIDENT, err2);
    if (rc2 == 0) free_model(&m);
    int ok = rc == -1 && strstr(err, path) == err && (!keyword || strstr(err, keyword)) && rc2 == -1 && !strcmp(err, err2);
    check(ok, name, "rc %d / %d, messages \"%s\" / \"%s\" (expected the path and \"%s\")", rc, rc2, err, err2, keyword ? keyword : "");
}

static void mutate_i32(const char *name, const unsigned char *good, size_t n, size_t at, int32_t value, const char *keyword) {
    unsigned char *bad = talloc(n);
    memcpy(bad, good, n);
    memcpy(bad + at, &value, 4);
    expect_refused(name, bad, n, keyword);
}

// What quantize reads (a GGUF file, a safetensors file, a Hugging Face directory) given to run: a
// line that says to convert it, not its bytes read as a llama2.c header. The same bytes with the
// safetensors header's length past the file stay a (nonsense) llama2.c header.
static void downloads_refused(const unsigned char *good, size_t n) {
    unsigned char *bad = talloc(n);
    memcpy(bad, good, n);
    memcpy(bad, "GGUF\3\0\0\0", 8);
    expect_refused("a GGUF file given to run says to convert it", bad, n, "GGUF file: convert it first");
    uint64_t json_bytes = 64;
    memcpy(bad, &json_bytes, 8);
    bad[8] = '{';
    expect_refused("a safetensors file given to run says to convert it", bad, n, "safetensors file: quantize reads the Hugging Face directory");
    json_bytes = n;   // 8 + n bytes: longer than the file
    memcpy(bad, &json_bytes, 8);
    char *path = tpath("bad.bin"), err[ERR_LEN] = "";
    Model m;
    write_file(path, bad, n);
    int rc = load_model(path, &m, err);
    if (rc == 0) free_model(&m);
    check(rc == -1 && !strstr(err, "safetensors"), "a header length past the file is not taken for safetensors",
          "rc %d, message \"%s\"", rc, err);
    rc = load_model(tmpdir, &m, err);
    if (rc == 0) free_model(&m);
    check(rc == -1 && strstr(err, tmpdir) == err && strstr(err, "a directory, not a checkpoint"),
          "a directory given to run says to convert it", "rc %d, message \"%s\"", rc, err);
}

// Cut points: inside the header, at its end, in the weights, one byte short; and one byte extra.
static void truncations(const char *fmt, const unsigned char *good, size_t n) {
    size_t cuts[] = {0, 3, 8, 27, 28, 100, 255, 256, n / 3, n / 2, n - 1};
    char name[128];
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        snprintf(name, sizeof name, "%s truncated to %zu of %zu bytes is refused", fmt, cuts[i], n);
        expect_refused(name, good, cuts[i], NULL);
    }
    unsigned char *longer = talloc(n + 1);
    memcpy(longer, good, n);
    snprintf(name, sizeof name, "%s with a trailing byte is refused", fmt);
    expect_refused(name, longer, n + 1, "header implies");
}

// Each impossible dimension, at the config's offset in the header.
static void bad_dims(const char *fmt, const unsigned char *good, size_t n, size_t cfg_at) {
    struct { const char *what; int field; int32_t value; const char *keyword; } cases[] = {
        {"dim 0", 0, 0, "dim"},
        {"dim -64", 0, -64, "dim"},
        {"hidden_dim 0", 1, 0, "hidden_dim"},
        {"n_layers 0", 2, 0, "n_layers"},
        {"n_layers 2^30", 2, 1 << 30, "n_layers"},
        {"n_heads 0", 3, 0, "n_heads"},
        {"dim not divisible by n_heads", 3, 3, "divisible by n_heads"},
        {"n_kv_heads 0", 4, 0, "n_kv_heads"},
        {"n_heads not divisible by n_kv_heads", 4, 3, "n_kv_heads"},
        {"odd head size", 3, 32, "odd"},
        {"vocab_size 2", 5, 2, "vocab_size"},
        {"vocab_size 2^30", 5, 1 << 30, "vocab_size"},
        {"seq_len 0", 6, 0, "seq_len"},
        {"seq_len -1", 6, -1, "seq_len"},
        {"a larger dimension than the file holds", 1, 4096, "header implies"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[160];
        snprintf(name, sizeof name, "%s with %s is refused", fmt, cases[i].what);
        mutate_i32(name, good, n, cfg_at + 4 * cases[i].field, cases[i].value, cases[i].keyword);
    }
}

// One small model in all four formats, in dir: v0.bin (FP32, written by ./quantize), v1.bin, v2.bin
// (gs 8), q8.bin (Q8LM gs 16). Config (dim 32, hidden 40, 2 layers, 4 heads, 2 kv heads, vocab 50
// unshared, seq 16): head size 8. Returns 0 and the loaded v0 model in m0; sizes in n1, n2.
static int write_fixtures(const char *dir, Model *m0, size_t *n1, size_t *n2) {
    char err[ERR_LEN];
    const char *v0 = join(dir, "v0.bin"), *q8 = join(dir, "q8.bin");
    if (sh("./quantize --synthetic 32,40,2,4,2,-50,16 --fp32 %s 2>/dev/null", v0) ||
        sh("./quantize %s %s -g 16 >/dev/null", v0, q8)) {
        check(0, "quantize writes the loader fixtures", "./quantize failed");
        return -1;
    }
    int rc = load_model(v0, m0, err);
    check(rc == 0 && m0->format == FMT_V0 && !m0->shared_classifier, "load llama2.c v0 (unshared, freq_cis tables)", "%s", err);
    if (rc) return -1;
    *n1 = write_v1(join(dir, "v1.bin"), m0), *n2 = write_v2(join(dir, "v2.bin"), m0, 8);
    return 0;
}

static void test_loaders(void) {
    const char *v0 = tpath("v0.bin"), *q8 = tpath("q8.bin"), *v1 = tpath("v1.bin"), *v2 = tpath("v2.bin");
    char err[ERR_LEN];
    Model m0, m;
    size_t n1, n2;
    if (write_fixtures(tmpdir, &m0, &n1, &n2)) return;
    int rc;
    rc = load_model(v1, &m, err);
    check(rc == 0 && m.format == FMT_V1 && max_weight_diff(&m0, &m) == 0.0, "load llama2.c v1: same weights as v0", "%s", err);
    if (rc == 0) free_model(&m);
    rc = load_model(q8, &m, err);
    double d = rc == 0 ? max_weight_diff(&m0, &m) : 1;
    check(rc == 0 && m.format == FMT_Q8LM && m.gs == 16 && d < 0.05, "load Q8LM gs 16: weights within quantization error", "%s %g", err, d);
    if (rc == 0) free_model(&m);
    rc = load_model(v2, &m, err);
    d = rc == 0 ? max_weight_diff(&m0, &m) : 1;
    check(rc == 0 && m.format == FMT_V2 && m.gs == 8 && d < 0.05, "load llama2.c v2 gs 8 (row-aligned groups)", "%s %g", err, d);
    if (rc == 0) free_model(&m);
    check(memory_available() > 0, "memory_available: the system says how much memory it could give", "0 bytes");
    const char *each[] = {v0, v1, q8, v2};
    for (int i = 0; i < 4; i++) {   // read into memory: the same weights as mapped, in 2 MB-aligned memory of its own
        Model mapped, resident;
        int rm = load_model(each[i], &mapped, err), rr = load_model_as(each[i], &resident, LOAD_RESIDENT, err);
        d = rm == 0 && rr == 0 ? max_weight_diff(&mapped, &resident) : 1;
        const int own = rr == 0 && (uintptr_t)resident.map % (2u << 20) == 0 && resident.map_bytes == mapped.map_bytes;
        check(rm == 0 && rr == 0 && d == 0.0 && own && resident.format == mapped.format, "LOAD_RESIDENT: same weights as mapped",
              "%s: %s, diff %g, at %p", each[i], err, d, rr == 0 ? resident.map : NULL);
        if (rm == 0) free_model(&mapped);
        if (rr == 0) free_model(&resident);
    }

    size_t n0, nq;
    unsigned char *b0 = slurp(v0, &n0), *bq = slurp(q8, &nq), *b1 = slurp(v1, &n1), *b2 = slurp(v2, &n2);
    if (!b0 || !bq || !b1 || !b2) {
        check(0, "read back the loader fixtures", "");
        free_model(&m0);
        return;
    }
    truncations("v0", b0, n0), truncations("v1", b1, n1), truncations("v2", b2, n2), truncations("Q8LM", bq, nq);
    bad_dims("v0", b0, n0, 0), bad_dims("v1", b1, n1, 8), bad_dims("v2", b2, n2, 8), bad_dims("Q8LM", bq, nq, 8);
    mutate_i32("v1 with version 3 is refused", b1, n1, 4, 3, "version");
    mutate_i32("Q8LM with version 3 is refused", bq, nq, 4, 3, "version");
    mutate_i32("Q8LM with group_size 0 is refused", bq, nq, 36, 0, "group_size");
    mutate_i32("Q8LM with group_size -8 is refused", bq, nq, 36, -8, "group_size");
    mutate_i32("Q8LM with a different group_size than its data is refused", bq, nq, 36, 32, "header implies");
    mutate_i32("Q8LM with shared_classifier 2 is refused", bq, nq, 40, 2, "shared_classifier");
    mutate_i32("Q8LM with row_align 8 is refused", bq, nq, 44, 8, "row_align");
    mutate_i32("Q8LM claiming a shared classifier (size mismatch) is refused", bq, nq, 40, 1, "header implies");
    mutate_i32("v2 with group_size 0 is refused", b2, n2, 37, 0, "group_size");
    mutate_i32("v2 whose groups straddle rows is refused", b2, n2, 37, 3, "straddle");
    unsigned char *wrong = talloc(n1);
    memcpy(wrong, b1, n1);
    wrong[0] ^= 0xFF;   // neither magic: read as a legacy header of nonsense
    expect_refused("v1 with a wrong magic is refused", wrong, n1, NULL);
    downloads_refused(b1, n1);
    free_model(&m0);
    arena_free();
}

// ----------------------------------------------------------------------------
// Tokenizer

static void round_trip(const Tokenizer *t, const char *tname, const char *text, int want_bytes) {
    int *tokens = talloc((strlen(text) + 3) * sizeof(int)), n = 0;
    char err[ERR_LEN] = "", *out = talloc(strlen(text) * 4 + 64), name[160];
    int rc = encode(t, text, 1, tokens, &n, err), byte_tokens = 0;
    for (int i = 1; rc == 0 && i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= t->vocab_size) rc = -1;
        else strcat(out, decode(t, tokens[i - 1], tokens[i]));
        for (int b = 0; b < 256 && rc == 0; b++) byte_tokens += tokens[i] == t->byte_token[b];
    }
    snprintf(name, sizeof name, "%s round trip (%zu bytes%s)", tname, strlen(text), want_bytes ? ", byte fallback" : "");
    check(rc == 0 && n > 0 && tokens[0] == BOS && !strcmp(out, text) && (!want_bytes || byte_tokens >= want_bytes), name,
          "rc %d (%s), %d tokens, first %d, %d byte tokens, decoded \"%s\"", rc, err, n, n ? tokens[0] : -1, byte_tokens, out);
}

static void test_tokenizer_file(const char *file, int vocab) {
    Tokenizer t;
    char err[ERR_LEN], name[128];
    if (!file_exists(file)) {
        snprintf(name, sizeof name, "tokenizer %s", file);
        skip(name, "file not present (make models)");
        return;
    }
    int rc = build_tokenizer(&t, file, vocab, err);
    snprintf(name, sizeof name, "tokenizer %s loads with %d entries", file, vocab);
    check(rc == 0, name, "%s", err);
    if (rc) return;
    round_trip(&t, file, "Once upon a time, there was a little girl named Lily. She loved to play.", 0);
    round_trip(&t, file, "def f(x):\n    return {'a': x * 2}  # done\n", 0);
    round_trip(&t, file, "caf\xc3\xa9 \xf0\x9f\x98\x80!", 4);   // "café 😀!": the emoji has no token in either vocab
    round_trip(&t, file, "", 0);
    if (vocab == 32000) {
        // Llama 2's tokenizer: known ids (sentencepiece gives the same)
        int want[] = {1, 306, 4658, 278, 6593, 310, 2834, 338}, tokens[64], n = 0;
        rc = encode(&t, "I believe the meaning of life is", 1, tokens, &n, err);
        check(rc == 0 && n == 8 && !memcmp(tokens, want, sizeof want), "llama tokenizer: known token ids", "got %d tokens", n);
    }
    // a larger vocabulary than the file holds, and a smaller one
    Tokenizer t2;
    rc = build_tokenizer(&t2, file, vocab + 1, err);
    check(rc == -1 && strstr(err, "truncated"), "tokenizer refused for a larger model vocabulary", "%s", err);
    if (rc == 0) free_tokenizer(&t2);
    rc = build_tokenizer(&t2, file, vocab - 1, err);
    check(rc == -1 && strstr(err, "bytes follow"), "tokenizer refused for a smaller model vocabulary", "%s", err);
    if (rc == 0) free_tokenizer(&t2);
    free_tokenizer(&t);
    arena_free();
}

// encode() against llama2.c's own loop (ref_encode.h) on real text, UTF-8 and stray bytes, with
// both tokenizers: the same tokens, in the same order.
static void test_encode_reference(const char *file, int vocab) {
    char err[ERR_LEN], name[200];
    Tokenizer t;
    if (!file_exists(file)) {
        skip("encode == llama2.c's merge loop", "tokenizer not present");
        return;
    }
    if (build_tokenizer(&t, file, vocab, err)) {
        check(0, "encode == llama2.c's merge loop", "%s", err);
        return;
    }
    size_t n_story = 0, n_code = 0;
    char *story = read_file("tests/data/story.txt", 1 << 20, &n_story, err), *code = read_file("tests/data/code.txt", 1 << 20, &n_code, err);
    const char *texts[] = {story ? story : "", code ? code : "", "caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80 \xff\xfe \xc0\x80 end",
                           "   leading spaces and\ttabs\nand newlines  ", "a"};
    int worst = -1;
    for (int i = 0; i < 5; i++) {
        char *text = xcalloc(1501, 1);
        strncpy(text, texts[i], 1500);   // the reference is quadratic: 1500 bytes of each
        int *a = xcalloc(strlen(text) + 3, sizeof(int)), *b = xcalloc(strlen(text) + 3, sizeof(int)), na = 0;
        int ok_a = encode(&t, text, 1, a, &na, err) == 0, nb = reference_encode(&t, text, b, err);
        if (ok_a != (nb >= 0) || (ok_a && (na != nb || memcmp(a, b, na * sizeof(int))))) worst = i;
        free(text), free(a), free(b);
    }
    snprintf(name, sizeof name, "encode == llama2.c's merge loop on 5 texts (%s)", file);
    check(worst < 0, name, "text %d differs", worst);
    free(story), free(code);
    free_tokenizer(&t);
}

static void test_bad_tokenizers(void) {
    // a valid 4-entry tokenizer: max_token_length 3, entries "a" "b" "ab" "c"
    unsigned char good[256], *p = good;
    int32_t mtl = 3;
    memcpy(p, &mtl, 4), p += 4;
    const char *pieces[] = {"a", "b", "ab", "c"};
    for (int i = 0; i < 4; i++) {
        float score = (float)i;
        int32_t len = (int32_t)strlen(pieces[i]);
        memcpy(p, &score, 4), memcpy(p + 4, &len, 4), memcpy(p + 8, pieces[i], len);
        p += 8 + len;
    }
    size_t n = p - good;
    Tokenizer t;
    char err[ERR_LEN], *path = tpath("tok.bin");
    write_file(path, good, n);
    int rc = build_tokenizer(&t, path, 4, err);
    check(rc == 0, "tiny tokenizer loads", "%s", err);
    if (rc == 0) {
        int tokens[16], nt = 0;
        rc = encode(&t, "x", 1, tokens, &nt, err);   // no " ", no "x", no byte tokens
        check(rc == -1 && strstr(err, "byte token"), "encode refuses a character the vocab cannot express", "%s", err);
        free_tokenizer(&t);
    }
    struct { const char *what; size_t at; int32_t value; size_t len; } cases[] = {
        {"max_token_length 0", 0, 0, 0},
        {"max_token_length -1", 0, -1, 0},
        {"a negative length", 8, -1, 0},
        {"a length over max_token_length", 8, 4, 0},
        {"a NaN score", 4, 0x7fc00000, 0},
        {"an infinite score", 4, 0x7f800000, 0},
        {"truncated to 2 bytes", 0, 3, 2},
        {"truncated inside an entry", 0, 3, 14},
        {"truncated inside a piece", 0, 3, n - 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char bad[256];
        memcpy(bad, good, n);
        memcpy(bad + cases[i].at, &cases[i].value, 4);
        write_file(path, bad, cases[i].len ? cases[i].len : n);
        rc = build_tokenizer(&t, path, 4, err);
        char name[128];
        snprintf(name, sizeof name, "tokenizer with %s is refused", cases[i].what);
        check(rc == -1 && strstr(err, path) == err, name, "rc %d, \"%s\"", rc, err);
        if (rc == 0) free_tokenizer(&t);
    }
}

// ----------------------------------------------------------------------------
// End to end on real models: INT8 greedy text agrees with FP32's.

typedef struct {
    int *tokens, n;
} Collector;

static int collect_token(void *ctx, int token) {
    Collector *c = ctx;
    c->tokens[c->n++] = token;
    return 0;
}

// BOS, then n greedy tokens from it. Through the executor's pipelined decode where it has one
// (which stops after a BOS: the rest is left -1), else one forward and argmax per token.
static int *greedy_tokens(Exec *e, int n) {
    int *tokens = talloc((n + 1) * sizeof(int));
    tokens[0] = BOS;
    for (int i = 1; i <= n; i++) tokens[i] = -1;
    if (e->ops->decode_greedy) {
        Collector c = {tokens + 1, 0};
        int got = e->ops->decode_greedy(e, forward(e, tokens, 1, 0, 0), 0, n, collect_token, &c);
        if (got != NOT_PIPELINED) {
            if (got > c.n) tokens[got] = BOS;   // it stopped at a BOS
            return tokens;
        }
    }
    for (int pos = 0; pos < n; pos++) tokens[pos + 1] = e->ops->argmax(e, forward(e, &tokens[pos], 1, pos, 0));
    return tokens;
}

static void test_greedy_agreement(const char *file, int n_tokens, int must_agree) {
    char *fp32 = model_path(file), err[ERR_LEN], name[160];
    if (!file_exists(fp32)) {
        snprintf(name, sizeof name, "%s: INT8 greedy agrees with FP32", file);
        skip(name, "model not present (make models; code15M comes only from ../shared/models)");
        return;
    }
    Model m;
    if (load_model(fp32, &m, err)) {
        check(0, file, "%s", err);
        return;
    }
    Exec e;
    cpu_exec_init(&e, &m, 1, 0);
    int *ref = greedy_tokens(&e, n_tokens);
    e.ops->release(&e);
    free_model(&m);
    int gss[] = {128, 64, 32};
    for (int g = 0; g < 3; g++) {
        char *q8 = tpath("e2e_q8.bin");
        snprintf(name, sizeof name, "%s int8 gs %d: greedy agrees with fp32 for >= %d of %d tokens", file, gss[g], must_agree, n_tokens);
        if (sh("./quantize %s %s -g %d >/dev/null", fp32, q8, gss[g]) || load_model(q8, &m, err)) {
            check(0, name, "quantize or load failed: %s", err);
            continue;
        }
        cpu_exec_init(&e, &m, 1, 0);
        int *got = greedy_tokens(&e, n_tokens), agree = 0;
        while (agree < n_tokens && got[agree + 1] == ref[agree + 1]) agree++;
        check(agree >= must_agree, name, "agreed for %d tokens", agree);
        e.ops->release(&e);
        free_model(&m);
    }
    arena_free();
}

// ----------------------------------------------------------------------------
// GPU: each kernel against its CPU reference, then the executors end to end.
// Reported as skipped where there is no usable GPU.

// ----------------------------------------------------------------------------
// Synthetic checkpoints: seeded N(0, 0.02^2) weights, norms 1, the same file for the same seed.

static void test_synthetic(void) {
    const char *a = tpath("syn_a.bin"), *b = tpath("syn_b.bin"), *c = tpath("syn_c.bin"), *f = tpath("syn_f.bin");
    const char *shape = "96,200,2,6,3,-120,40";   // unshared classifier, grouped-query ratio 2
    int rc = sh("./quantize --synthetic %s %s 2>/dev/null && ./quantize --synthetic %s %s 2>/dev/null && "
                "./quantize --synthetic %s %s --seed 7 2>/dev/null && ./quantize --synthetic %s %s --fp32 2>/dev/null",
                shape, a, shape, b, shape, c, shape, f);
    check(rc == 0, "quantize --synthetic writes int8 and fp32 files", "exit %d", rc);
    if (rc) return;
    check(sh("cmp -s %s %s", a, b) == 0, "synthetic: the same seed gives the same file", "files differ");
    check(sh("cmp -s %s %s", a, c) != 0, "synthetic: another seed gives another file", "files are identical");
    char err[ERR_LEN];
    Model m;
    const char *files[2] = {a, f};
    for (int i = 0; i < 2; i++) {
        rc = load_model(files[i], &m, err);
        char name[96];
        snprintf(name, sizeof name, "synthetic %s: loads, weights have std 0.02, norms 1", i ? "fp32" : "int8");
        if (rc) {
            check(0, name, "%s", err);
            continue;
        }
        double ss = 0;
        size_t n = 0;
        for (int l = 0; l < m.cfg.n_layers; l++)
            for (int r = 0; r < m.w.w2[l].rows; r++)
                for (int k = 0; k < m.w.w2[l].cols; k++, n++) ss += wval(&m.w.w2[l], r, k) * wval(&m.w.w2[l], r, k);
        double std = sqrt(ss / n);
        int norms_one = m.w.rms_att[0] == 1.0f && m.w.rms_ffn[m.cfg.dim - 1] == 1.0f && m.w.rms_final[1] == 1.0f;
        check(std > 0.0195 && std < 0.0205 && norms_one && !m.shared_classifier && m.quantized == !i, name,
              "std %.5f, norms one %d, shared %d", std, norms_one, m.shared_classifier);
        free_model(&m);
    }
    sh("rm -f %s %s %s %s", a, b, c, f);
}

// ----------------------------------------------------------------------------
// Imports: tiny random models saved by transformers (and converted by llama.cpp's converter),
// quantize'd into Q8LM v2, against the logits transformers computed in float32
// (tests/fixtures/make_fixtures.py).

// `key N v1 .. vN` of a fixture's ref.txt into out (room for max); the count, or -1.
static int ref_ints(const char *ref_txt, const char *key, int *out, int max) {
    size_t n;
    const char *text = (const char *)slurp(ref_txt, &n);
    if (!text) return -1;
    size_t klen = strlen(key);
    for (const char *line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        if (strncmp(line, key, klen) || line[klen] != ' ') continue;
        char *end;
        long count = strtol(line + klen, &end, 10);
        if (count < 1 || count > max) return -1;
        for (long i = 0; i < count; i++) out[i] = (int)strtol(end, &end, 10);
        return (int)count;
    }
    return -1;
}

// The CPU logits of every position of ids, one token at a time after a prefill of 5.
static float *cpu_logits_of(const Model *m, const int *ids, int n) {
    Exec e;
    cpu_exec_init(&e, m, 1, 0);
    float *got = exec_logits(&e, ids, n, n < 5 ? n : 5);
    e.ops->release(&e);
    return got;
}

static double rel_l2_f(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    return sqrt(num / den);
}

// An import fixture: <input> quantized with [flags] into out (a Q8LM v2) and loaded, with the
// ids and transformers' float32 logits in refs (ref.txt's input_ids; logits.f32: (n_ids, V)).
// 0 where the fixture is missing (skipped) or anything fails (checked as name).
typedef struct {
    Model m;
    int ids[64], n_ids;
    const float *ref;
    size_t V;
} ImportFixture;
static int load_import(const char *input, const char *refs, const char *flags, const char *out, const char *name, ImportFixture *f) {
    char ref_txt[512], ref_bin[512], err[ERR_LEN];
    snprintf(ref_txt, sizeof ref_txt, "%s/ref.txt", refs);
    snprintf(ref_bin, sizeof ref_bin, "%s/logits.f32", refs);
    if (!file_exists(input) || !file_exists(ref_bin)) return skip(name, "fixture missing"), 0;
    if (sh("./quantize %s %s %s > %s 2>&1", input, out, flags, tpath("import.log"))) {
        size_t n;
        const char *log = (const char *)slurp(tpath("import.log"), &n);
        return check(0, name, "quantize failed: %.300s", log ? log : ""), 0;
    }
    if (load_model(out, &f->m, err)) return check(0, name, "%s", err), 0;
    f->n_ids = ref_ints(ref_txt, "input_ids", f->ids, 64);
    size_t ref_bytes = 0;
    f->ref = (const float *)slurp(ref_bin, &ref_bytes);
    f->V = (size_t)f->m.cfg.vocab_size;
    if (f->n_ids < 1 || !f->ref || ref_bytes != (size_t)f->n_ids * f->V * sizeof(float)) {
        free_model(&f->m);
        return check(0, name, "reference unreadable or of another size (%d ids, %zu bytes, vocab %zu)", f->n_ids, ref_bytes, f->V), 0;
    }
    return 1;
}

// quantize <input> [flags] into a temporary Q8LM v2, then its logits against refs/logits.f32.
static void test_import(const char *input, const char *refs, const char *flags, double tol, const char *label) {
    char name[256];
    snprintf(name, sizeof name, "import %s %s: cpu logits vs transformers float32", label, flags[0] ? flags : "(INT8)");
    ImportFixture f;
    if (!load_import(input, refs, flags, tpath("import.bin"), name, &f)) return;
    const float *got = cpu_logits_of(&f.m, f.ids, f.n_ids);
    const double err_l2 = rel_l2_f(got, f.ref, (size_t)f.n_ids * f.V);
    check(err_l2 <= tol, name, "relative L2 %.3e > %.1e", err_l2, tol);
    free_model(&f.m);
}

// Whether ids[0..n) holds want[0..m) at offset at.
static int ids_at(const int *ids, int n, int at, const int *want, int m) {
    return at >= 0 && at + m <= n && !memcmp(ids + at, want, (size_t)m * sizeof(int));
}

// The chat turns as -m chat feeds them (run.c: the first turn with the system prompt, the reply's
// end token, the next turn) against transformers' apply_chat_template over system, user,
// assistant, user (refs chat_ids): the reference must begin with our first turn and end with the
// end token and our second turn. The reply between them is the model's own tokens.
static void test_chat_format(const char *dir, const char *system) {
    char name[300], ref_txt[400], err[ERR_LEN];
    snprintf(name, sizeof name, "chat format of %s == apply_chat_template's ids", dir);
    snprintf(ref_txt, sizeof ref_txt, "%s/refs/ref.txt", dir);
    char *out = tpath("chat.bin");
    if (sh("./quantize %s %s > %s 2>&1", dir, out, tpath("import.log"))) return check(0, name, "quantize failed");
    int want[256], n_want = ref_ints(ref_txt, "chat_ids", want, 256);
    Model m;
    Text t;
    if (load_model(out, &m, err)) return check(0, name, "%s", err);
    if (n_want < 1 || text_open(&t, &m, NULL, err)) return free_model(&m), check(0, name, "no chat_ids in %s, or %s", ref_txt, err);
    char first[512], next[512];
    int *a = NULL, *b = NULL, na = 0, nb = 0, end = t.eot_id >= 0 ? t.eot_id : t.eos_id;
    const int ok = text_chat_turn(t.chat, 1, system, "What is a clock?", first, sizeof first) > 0 &&
                   text_chat_turn(t.chat, 0, system, "Who repairs it?", next, sizeof next) > 0 &&
                   !text_encode(&t, first, 1, &a, &na, err) && !text_encode(&t, next, 0, &b, &nb, err);
    check(ok && ids_at(want, n_want, 0, a, na) && ids_at(want, n_want, n_want - nb, b, nb) && na + nb + 1 < n_want &&
              want[n_want - nb - 1] == end,
          name, "%s format: first turn %d ids, next %d, end id %d, against %d reference ids", chat_name(t.chat), na, nb, end, n_want);
    free(a), free(b);
    text_close(&t);
    free_model(&m);
}

static void test_chat_formats(void) {
    static const char *const with_system[] = {"llama_basic", "llama3_scaled", "mistral", "qwen2"};
    char dir[256];
    for (size_t i = 0; i < sizeof with_system / sizeof with_system[0]; i++) {
        snprintf(dir, sizeof dir, "tests/fixtures/hf/%s", with_system[i]);
        test_chat_format(dir, "You are a helpful assistant.");
    }
    test_chat_format("tests/fixtures/hf/mistral_spm", NULL);   // Mistral v0.1's template refuses a system message
}

static void test_imports(void) {
    static const char *const hf[] = {"llama_basic", "llama3_scaled", "mistral", "qwen2", "llama_bf16", "qwen2_f16", "mistral_spm"};
    char dir[256], refs[300];
    for (size_t i = 0; i < sizeof hf / sizeof hf[0]; i++) {
        snprintf(dir, sizeof dir, "tests/fixtures/hf/%s", hf[i]);
        snprintf(refs, sizeof refs, "%s/refs", dir);
        test_import(dir, refs, "--fp32", 1e-4, hf[i]);
        // INT8: these random models turn the weights' ~0.5% rounding into several % of their small
        // logits; what INT8 does to real models is measured by perplexity (tests/run_tests.sh)
        test_import(dir, refs, "", 5e-2, hf[i]);
    }
    test_chat_formats();
    // transformers 4's form of the same config (rope_theta and rope_scaling, not rope_parameters)
    const char *legacy = tpath("legacy");
    if (!sh("mkdir -p %s && cp tests/fixtures/hf/llama3_scaled/config.legacy.json %s/config.json && "
            "cp tests/fixtures/hf/llama3_scaled/model.safetensors tests/fixtures/hf/llama3_scaled/tok* %s/", legacy, legacy, legacy))
        test_import(legacy, "tests/fixtures/hf/llama3_scaled/refs", "--fp32", 1e-4, "llama3_scaled, config.json of transformers 4");
    sh("rm -rf %s", legacy);
    static const char *const gguf[] = {"llama_basic.f32", "llama_basic.q8_0", "llama3_scaled.q8_0", "qwen2.f16"};
    for (size_t i = 0; i < sizeof gguf / sizeof gguf[0]; i++) {
        snprintf(dir, sizeof dir, "tests/fixtures/gguf/%s.gguf", gguf[i]);
        snprintf(refs, sizeof refs, "tests/fixtures/gguf/%s.refs", gguf[i]);
        if (!strcmp(gguf[i], "llama_basic.f32")) snprintf(refs, sizeof refs, "tests/fixtures/hf/llama_basic/refs");   // bit-identical
        test_import(dir, refs, "--fp32", 1e-4, gguf[i]);
        // INT8: Q8_0 keeps its own groups and scales, so it computes what the reference computes
        test_import(dir, refs, "", strstr(gguf[i], "q8_0") ? 1e-4 : 5e-2, gguf[i]);
    }
    arena_free();
}

// ----------------------------------------------------------------------------
// The CPU groups

static void test_cpu(void) {
    test_cpu_matmul();
    test_cpu_matmul_q8q8();
    test_cpu_int8_prefill();
    test_cpu_forward();
    test_cpu_batch();
    test_topp_sampling();
}
static void test_files(void) {
    test_loaders();
    test_synthetic();
}
static void test_tokenizers(void) {
    test_bad_tokenizers();
    test_tokenizer_file(model_path("tok512.bin"), 512);
    test_tokenizer_file("tokenizer.bin", 32000);
    test_encode_reference(model_path("tok512.bin"), 512);
    test_encode_reference("tokenizer.bin", 32000);
}
static void test_agreement(void) {
    test_greedy_agreement("stories260K.bin", 200, 40);
    if (quick) skip("code15M int8 greedy agreement", "--quick");
    else test_greedy_agreement("code15M.bin", 60, 40);
}

#define N_GPU_GROUPS 8   // test groups skipped as one each when there is no GPU
#ifdef HAVE_GPU

static GpuCtx *gctx;

static void *dev_put(const void *host, size_t bytes) {
    void *d = gpu_alloc(bytes);
    gpu_upload(d, host, bytes);
    return d;
}

static void dev_poison(float *d, size_t n) {
    float *nan = talloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    gpu_upload(d, nan, n * sizeof(float));
}

// The tensor-core kernels' bounds, relative to sum_k |w x|: mma.sync rounds only x to FP16
// (2^-11 = 4.88e-4 per element); wgmma also the scaled scale and the scaled weight (3 x 2^-11);
// plus FP32 accumulation.
#define MMA_REL_TOL 6e-4
#define WGMMA_REL_TOL 1.6e-3
// The RMSNorm epsilon of the norm-folded checks: large enough against x's mean square (1) that a
// kernel using any other value fails.
#define FOLD_EPS 0.25f

// The INT8 kernels, each with its tolerance relative to sum_k |w x|, and whether it folds a norm.
typedef struct {
    LinearKernel k;
    double tol;
    int folds;
} KernelCase;
static const KernelCase int8_kernels[] = {
    {LINEAR_GEMV, 1e-5, 1},      {LINEAR_GEMV_TALL, 1e-5, 1}, {LINEAR_GEMV_COPY, 1e-5, 1},
    {LINEAR_MMA, MMA_REL_TOL, 0}, {LINEAR_WGMMA, WGMMA_REL_TOL, 0}, {LINEAR_DEQUANT_SGEMM, 1e-5, 0},
};
#define N_INT8_KERNELS (int)(sizeof int8_kernels / sizeof int8_kernels[0])

static LinearCall plain_call(const Mat *d, const float *dx, float *dy, int M, int accumulate, const float *norm_w) {
    return (LinearCall){.form = LINEAR_PLAIN, .M = M, .x = dx, .w = {d}, .y = dy, .accumulate = accumulate, .norm_w = norm_w,
                        .norm_eps = FOLD_EPS};
}

// One kernel on one call, its output poisoned first, or (accumulate) set to y0 and y0 subtracted
// after: y (M, N) on the host.
static void run_kernel(LinearKernel k, const LinearCall *c, float *y, const float *y0, int N) {
    const size_t n = (size_t)c->M * N;
    if (y0) gpu_upload(c->y, y0, n * sizeof(float));
    else dev_poison(c->y, n);
    gpu_linear(gctx, k, c);
    gpu_download(gctx, y, c->y, n * sizeof(float));
    if (y0)
        for (size_t i = 0; i < n; i++) y[i] -= y0[i];   // includes y0's rounding
}

// x RMSNorm'd with g (epsilon FOLD_EPS) in float64, rounded to float: the input a folded norm must
// reproduce.
static float *normed_input(const float *x, const float *g, int M, int K) {
    float *xn = talloc((size_t)M * K * sizeof(float));
    for (int m = 0; m < M; m++) {
        double ss = 0;
        for (int k = 0; k < K; k++) ss += (double)x[(size_t)m * K + k] * x[(size_t)m * K + k];
        double inv = 1.0 / sqrt(ss / K + FOLD_EPS);
        for (int k = 0; k < K; k++) xn[(size_t)m * K + k] = (float)(x[(size_t)m * K + k] * inv * g[k]);
    }
    return xn;
}

// Device buffers for the linear checks, grown as needed and kept (an allocation synchronises the
// device); dev_scratch_free releases them.
static float *scratch_buf[3];
static size_t scratch_floats[3];
static float *dev_scratch(int slot, size_t floats) {
    if (floats > scratch_floats[slot]) {
        if (scratch_buf[slot]) gpu_free(scratch_buf[slot]);
        scratch_buf[slot] = gpu_alloc(floats * sizeof(float));
        scratch_floats[slot] = floats;
    }
    return scratch_buf[slot];
}
static void dev_scratch_free(void) {
    for (int i = 0; i < 3; i++) {
        if (scratch_buf[i]) gpu_free(scratch_buf[i]);
        scratch_buf[i] = NULL, scratch_floats[i] = 0;
    }
}

// Every INT8 kernel that fits (d: W on the device, wd: W in double) at M tokens against float64:
// plain, accumulating onto random y0, and, for the kernels that fold the RMSNorm, with a random
// norm folded in (for odd M its weights one float off 16-byte alignment: the scalar path).
// fails[i]: kernel i's first failure; ran[i]: set where it fit.
static void check_kernels_at(const Mat *d, const double *wd, int M, const char **fails, int *ran, char what[][200]) {
    const int N = d->rows, K = d->cols;
    float *x = talloc((size_t)M * K * sizeof(float)), *y = talloc((size_t)M * N * sizeof(float));
    float *y0 = talloc((size_t)M * N * sizeof(float)), *g = talloc((K + 1) * sizeof(float));
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = urand_unit();
    for (size_t i = 0; i < (size_t)M * N; i++) y0[i] = urand_unit();
    for (int k = 0; k <= K; k++) g[k] = nrand();
    double *ref = talloc((size_t)M * N * sizeof(double)), *mag = talloc((size_t)M * N * sizeof(double));
    double *nref = talloc((size_t)M * N * sizeof(double)), *nmag = talloc((size_t)M * N * sizeof(double));
    linear_ref_f64(wd, N, K, x, M, ref, mag);
    linear_ref_f64(wd, N, K, normed_input(x, g + M % 2, M, K), M, nref, nmag);
    float *dx = dev_scratch(0, (size_t)M * K), *dy = dev_scratch(1, (size_t)M * N), *dg = dev_scratch(2, K + 1);
    gpu_upload(dx, x, (size_t)M * K * sizeof(float));
    gpu_upload(dg, g, (K + 1) * sizeof(float));
    for (int i = 0; i < N_INT8_KERNELS; i++) {
        const KernelCase *kc = &int8_kernels[i];
        LinearCall c = plain_call(d, dx, dy, M, 0, NULL);
        if (!gpu_linear_fits(gctx, kc->k, &c)) continue;
        ran[i] = 1;
        run_kernel(kc->k, &c, y, NULL, N);
        if (!fails[i]) fails[i] = check_ref(y, ref, mag, M, N, kc->tol, what[i]);
        c.accumulate = 1;
        run_kernel(kc->k, &c, y, y0, N);
        if (!fails[i]) fails[i] = check_ref(y, ref, mag, M, N, kc->tol + 1e-5, what[i]);
        c = plain_call(d, dx, dy, M, 0, dg + M % 2);
        if (!kc->folds || !gpu_linear_fits(gctx, kc->k, &c)) continue;
        run_kernel(kc->k, &c, y, NULL, N);
        if (!fails[i]) fails[i] = check_ref(y, nref, nmag, M, N, 1e-5, what[i]);
    }
}

// The dequant kernel: exactly q * s.
static const char *check_dequant(const Mat *d, const Mat *h, char *what) {
    const int N = h->rows, K = h->cols;
    float *dq = gpu_alloc((size_t)N * K * sizeof(float)), *hq = talloc((size_t)N * K * sizeof(float));
    dev_poison(dq, (size_t)N * K);
    gpu_dequant(gctx, dq, d);
    gpu_download(gctx, hq, dq, (size_t)N * K * sizeof(float));
    gpu_free(dq);
    for (size_t i = 0; i < (size_t)N * K; i++)
        if (!(hq[i] == (float)wval(h, (int)(i / K), (int)(i % K)))) {
            snprintf(what, 200, "N %d: element %zu is %g, expected %g", N, i, hq[i], wval(h, (int)(i / K), (int)(i % K)));
            return what;
        }
    return NULL;
}

// A random INT8 weight on the device (d) and the host (h), and its values in double.
static double *device_weight(int N, int K, int gs, Mat *h, Mat *d) {
    *h = random_mat(N, K, 1, gs, 1.0f / sqrtf(K));
    *d = *h;
    d->q = dev_put(h->q, (size_t)N * h->stride), d->s = dev_put(h->s, (size_t)N * h->groups * sizeof(float));
    return mat_to_f64(h);
}

// The first index of the maximum of v (n), NaN never the maximum, 0 if nothing beats -inf: what
// argmax_kernel promises (the CPU's argmax_row where there is no NaN).
static int argmax_ref(const float *v, int n) {
    float best = -INFINITY;
    int best_i = 0;
    for (int i = 0; i < n; i++)
        if (v[i] > best) best = v[i], best_i = i;
    return best_i;
}

// gpu_argmax on fresh random rows: lengths around the kernel's float4 batches (32768 floats a
// pass) and odd tails, 16-byte aligned and not, the maximum tied at up to three places (the
// first must win), NaN and -inf sprinkled in, and rows of -inf only.
static void test_gpu_argmax(void) {
    int ns[] = {1, 2, 3, 5, 97, 1023, 4097, 31999, 32000, 32003, 32768, 40001, 200000};
    const char *fail = NULL;
    char what[200] = "";
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0] && !fail; ni++)
        for (int variant = 0; variant < 8 && !fail; variant++) {
            int n = ns[ni], offset = variant % 2;   // odd variants: one float off alignment
            float *v = talloc((n + 1) * sizeof(float)), *row = v + offset;
            for (int i = 0; i <= n; i++) v[i] = variant == 7 ? -INFINITY : nrand();
            if (variant >= 2 && variant < 7) {   // a maximum at 1 to 3 random places
                float top = 10.0f + urand();
                for (int t = 0; t < 1 + variant % 3; t++) row[random_u32(&rng_state) % n] = top;
            }
            if (variant >= 4 && variant < 7)   // NaN and -inf among the values
                for (int t = 0; t < 1 + n / 50; t++) row[random_u32(&rng_state) % n] = t % 2 ? NAN : -INFINITY;
            float *d = dev_put(v, (n + 1) * sizeof(float));
            int got = gpu_argmax(gctx, d + offset, n), want = argmax_ref(row, n);
            gpu_free(d);
            if (got != want) {
                snprintf(what, sizeof what, "n %d, variant %d: index %d, expected %d", n, variant, got, want);
                fail = what;
            }
        }
    check(!fail, "gpu argmax == first maximum (13 lengths x aligned, unaligned, ties, NaN, -inf only)", "%s", what);
    // gpu_argmax_rows: 1, 7 and 64 rows (a --batch) of 97, 32000 and 32003 floats (odd rows then
    // start off 16-byte alignment), each row's maximum tied at a random second place half the time
    int row_ns[] = {97, 32000, 32003}, row_counts[] = {1, 7, 64};
    for (int ni = 0; ni < 3 && !fail; ni++)
        for (int ri = 0; ri < 3 && !fail; ri++) {
            int n = row_ns[ni], rows = row_counts[ri], got[64];
            float *v = talloc((size_t)rows * n * sizeof(float));
            for (size_t i = 0; i < (size_t)rows * n; i++) v[i] = nrand();
            for (int r = 0; r < rows; r++) {
                float *row = v + (size_t)r * n, top = 10.0f + urand();
                row[random_u32(&rng_state) % n] = top;
                if (r % 2) row[random_u32(&rng_state) % n] = top;
            }
            float *d = dev_put(v, (size_t)rows * n * sizeof(float));
            for (int r = 0; r < rows; r++) got[r] = -1;
            gpu_argmax_rows(gctx, d, rows, n, got);
            gpu_free(d);
            for (int r = 0; r < rows && !fail; r++)
                if (got[r] != argmax_ref(v + (size_t)r * n, n)) {
                    snprintf(what, sizeof what, "%d rows of %d: row %d index %d, expected %d", rows, n, r, got[r],
                             argmax_ref(v + (size_t)r * n, n));
                    fail = what;
                }
        }
    check(!fail, "gpu argmax of 1, 7, 64 rows == each row's first maximum", "%s", what);
}

// llama2.c's sampling of row (n logits) with the sums in double: each token's exp(logit /
// temperature - max) in float as both samplers compute it, then the normalising sum and the
// running sums without rounding to speak of (the host's sequential float sums drift by 1e-5 and
// more of the total over long runs of equal values). The reference the device's tree sums and
// the host's sums both approximate. Returns the token; *ok whether `got` is it or within tol of
// it: moving the coin's point (or top-p) by at most tol in probability reaches it.
static int sample_exact(const float *row, int n, float temperature, float topp, float coin, int got, double tol, int *ok) {
    float *e = xcalloc(n, sizeof(float)), most = -INFINITY;
    ProbIndex *items = xcalloc(n, sizeof(ProbIndex)), *tmp = xcalloc(n, sizeof(ProbIndex));
    double *cdf = xcalloc(n, sizeof(double)), sum = 0, c = 0;
    for (int i = 0; i < n; i++) e[i] = row[i] / temperature, most = e[i] > most ? e[i] : most;
    for (int i = 0; i < n; i++) e[i] = expf(e[i] - most), sum += e[i];
    const int top_p = topp > 0 && topp < 1;
    int n0 = 0;
    for (int i = 0; i < n; i++)   // sorted by e: the order of the probabilities, equal ones by index
        if (!top_p || e[i] / sum >= (1.0f - topp) / (n - 1)) items[n0++] = (ProbIndex){e[i], i};
    if (top_p) sort_by_prob(items, tmp, n0);
    int last = n0 - 1, last_wide = n0 - 1, at = -1, token = -1;   // last_wide: the set for topp + tol
    for (int i = 0; i < n0; i++) {
        cdf[i] = c += items[i].prob / sum;
        if (top_p && last == n0 - 1 && c > topp) last = i;
        if (top_p && last_wide == n0 - 1 && c > topp + tol) last_wide = i;
        if (items[i].index == got) at = i;
    }
    const double r = top_p ? coin * cdf[last > 0 ? last : 0] : coin;
    for (int i = 0; i <= last && token < 0; i++)
        if (r < cdf[i]) token = items[i].index;
    if (n0 == 0) token = argmax_row(e, n);   // the host's flat-row case
    else if (token < 0) token = items[last].index;
    // Probabilities equal to within rounding (the device's expf and its float division by a tree
    // sum) may come in either order: got may stand anywhere among those equal to its own.
    int lo = at, hi = at;
    while (lo > 0 && fabsf(items[lo - 1].prob - items[at].prob) <= 1e-6f * items[at].prob) lo--;
    while (at >= 0 && hi + 1 < n0 && fabsf(items[hi + 1].prob - items[at].prob) <= 1e-6f * items[at].prob) hi++;
    *ok = got == token || (at >= 0 && lo <= last_wide && r >= (lo ? cdf[lo - 1] : 0.0) - tol && r < cdf[hi] + tol);
    free(e), free(items), free(tmp), free(cdf);
    return token;
}

// The host's own sampling (run.c sample_topp / sample_mult: sequential float sums) of the same row.
static int sample_host_row(const float *row, int n, float temperature, float topp, float coin) {
    float *p = xcalloc(n, sizeof(float));
    ProbIndex *items = xcalloc(n, sizeof(ProbIndex)), *tmp = xcalloc(n, sizeof(ProbIndex));
    for (int i = 0; i < n; i++) p[i] = row[i] / temperature;
    softmax(p, n);
    const int token = topp > 0 && topp < 1 ? sample_topp(p, n, topp, items, tmp, coin) : sample_mult(p, n, coin);
    free(p), free(items), free(tmp);
    return token;
}

// gpu_sample_rows against llama2.c's procedure with exact sums: row lengths from 1 to
// gpu_sample_supported's limit, peaked and flat rows, rows of many equal logits (ties taken by
// index), one token holding nearly all the mass; temperatures below and above 1; top-p off (0, 1),
// moderate and near 1; 16 rows a launch, and one launch of 64. Every token must be within 1e-5 of
// the exact choice in probability (the device's sums are trees of float adds), and at least 99% of
// them equal to it. The host's own float sampling of the same rows and coins is counted too (its
// sequential sums drift on long flat rows). A row with a NaN must still give an index inside it.
static void test_gpu_sample(void) {
    int ns[] = {1, 2, 97, 512, 4099, 32000, 32768}, trials = 0, equal = 0, host_equal = 0;
    float temps[] = {0.6f, 1.0f, 1.5f}, topps[] = {0.0f, 0.5f, 0.9f, 0.99f, 1.0f};
    const char *fail = NULL;
    char what[240] = "";
    if (!gpu_sample_supported(32768) || gpu_sample_supported(32769) || gpu_sample_supported(0)) {
        snprintf(what, sizeof what, "gpu_sample_supported: 32768 %d, 32769 %d, 0 %d", gpu_sample_supported(32768),
                 gpu_sample_supported(32769), gpu_sample_supported(0));
        fail = what;
    }
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0] && !fail; ni++)
        for (int kind = 0; kind < 4 && !fail; kind++)
            for (int ti = 0; ti < 3 && !fail; ti++)
                for (int pi = 0; pi < 5 && !fail; pi++) {
                    const int n = ns[ni], rows = ni == 5 && kind == 0 && ti == 1 && pi == 2 ? 64 : 16;
                    float *v = xcalloc((size_t)rows * n, sizeof(float)), coins[64];
                    int got[64];
                    for (int r = 0; r < rows; r++) {
                        float *row = v + (size_t)r * n;
                        for (int i = 0; i < n; i++)
                            row[i] = kind == 0 ? 4.0f * nrand() : kind == 1 ? 0.05f * nrand()
                                   : kind == 2 ? (float)(random_u32(&rng_state) % 4) : nrand();
                        if (kind == 3) row[random_u32(&rng_state) % n] = 30.0f;
                        coins[r] = urand();
                        got[r] = -1;
                    }
                    float *d = dev_put(v, (size_t)rows * n * sizeof(float));
                    gpu_sample_rows(gctx, d, rows, n, temps[ti], topps[pi], coins, got);
                    gpu_free(d);
                    for (int r = 0; r < rows && !fail; r++) {
                        const float *row = v + (size_t)r * n;
                        int ok = 0, exact = got[r] >= 0 && got[r] < n ? sample_exact(row, n, temps[ti], topps[pi], coins[r], got[r], 1e-5, &ok) : -1;
                        trials++;
                        equal += got[r] == exact;
                        host_equal += sample_host_row(row, n, temps[ti], topps[pi], coins[r]) == exact;
                        if (!ok) {
                            snprintf(what, sizeof what, "n %d, row kind %d, temperature %g, top-p %g, coin %.7f: token %d, expected %d (%s)",
                                     n, kind, temps[ti], topps[pi], coins[r], got[r], exact, exact < 0 ? "out of range" : "not within 1e-5");
                            fail = what;
                        }
                    }
                    free(v);
                }
    if (!fail && !(equal >= 0.99 * trials)) {
        snprintf(what, sizeof what, "%d of %d tokens equal to the exact choice", equal, trials);
        fail = what;
    }
    for (int t = 0; t < 2 && !fail; t++) {   // NaN in the row: any token inside it
        const int n = 1000;
        float *v = talloc(n * sizeof(float)), coin = urand();
        int got = -1;
        for (int i = 0; i < n; i++) v[i] = nrand();
        v[random_u32(&rng_state) % n] = NAN;
        float *d = dev_put(v, n * sizeof(float));
        gpu_sample_rows(gctx, d, 1, n, 1.0f, t ? 0.9f : 1.0f, &coin, &got);
        gpu_free(d);
        if (got < 0 || got >= n) {
            snprintf(what, sizeof what, "a row with a NaN, top-p %s: token %d", t ? "0.9" : "off", got);
            fail = what;
        }
    }
    char name[240];
    snprintf(name, sizeof name, "gpu sampling == llama2.c's with exact sums (device %d, host %d of %d equal; 7 lengths x 4 kinds x 3 temperatures x 5 top-p)",
             equal, host_equal, trials);
    check(!fail, name, "%s", what);
}

// Whether kernel k must fit at least one of a sweep's calls of group size gs on this GPU.
static int must_fit(LinearKernel k, int gs) {
    const int pow2 = gs % 16 == 0 && (gs & (gs - 1)) == 0;
    if (k == LINEAR_MMA) return gs % 64 == 0;
    if (k == LINEAR_WGMMA) return gs % 64 == 0 && gpu_has_sm90a();
    if (k == LINEAR_GEMV_COPY) return pow2 && gpu_has_sm90a();
    if (k == LINEAR_GEMV_TALL) return pow2;
    return 1;
}

// Every INT8 linear kernel against a float64 reference on random data, over K = 64, 172, 4096,
// 200, 11008 (not multiples of the group size or the tiles too), group sizes 32, 64, 128 and 8
// (scales per weight), N = 1, 37, 130 and M from 1 up to 512 (257 for K = 11008: the FP16 x
// scratch); each where it fits (gpu_linear_fits): plain, accumulating and with the norm folded.
static void test_gpu_linear(void) {
    int Ks[] = {64, 172, 4096, 200, 11008}, gss[] = {32, 64, 128, 8}, Ns[] = {1, 37, 130};
    int Ms[] = {1, 3, 33, 2, 7, 16, 100, 257, 4, 8, 32, 64, 128, 256, 512};
    // --quick (instrumented runs): the first three K and M, every group size and N
    for (size_t ki = 0; ki < (quick ? 3 : sizeof Ks / sizeof Ks[0]); ki++)
        for (size_t gi = 0; gi < sizeof gss / sizeof gss[0]; gi++) {
            const int K = Ks[ki], gs = gss[gi];
            char what[N_INT8_KERNELS + 1][200], name[200];
            const char *fails[N_INT8_KERNELS] = {0}, *fail_dequant = NULL;
            int ran[N_INT8_KERNELS] = {0};
            for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
                Mat h, d;
                double *wd = device_weight(Ns[ni], K, gs, &h, &d);
                if (!fail_dequant) fail_dequant = check_dequant(&d, &h, what[N_INT8_KERNELS]);
                for (size_t mi = 0; mi < (quick ? 3 : sizeof Ms / sizeof Ms[0]); mi++)
                    if (!(Ms[mi] > 257 && K > 4096)) check_kernels_at(&d, wd, Ms[mi], fails, ran, what);
                free(wd);
                gpu_free((void *)d.q), gpu_free((void *)d.s);
                arena_free();
            }
            for (int i = 0; i < N_INT8_KERNELS; i++) {
                const LinearKernel k = int8_kernels[i].k;
                snprintf(name, sizeof name, "gpu %s K=%d gs=%d, N 1/37/130 x M 1..%d where it fits: plain, accumulating%s, vs float64 (%.0e sum|w x|)",
                         gpu_linear_name(k), K, gs, quick ? 33 : K > 4096 ? 257 : 512, int8_kernels[i].folds ? ", norm folded" : "",
                         int8_kernels[i].tol);
                if (!must_fit(k, gs)) snprintf(name, sizeof name, "gpu %s K=%d gs=%d: reported unsupported", gpu_linear_name(k), K, gs);
                if (ran[i] != must_fit(k, gs)) check(0, name, ran[i] ? "ran, where it must not fit" : "never fit a call");
                else check(!fails[i], name, "%s", fails[i]);
            }
            snprintf(name, sizeof name, "gpu dequant kernel K=%d gs=%d == q * s exactly", K, gs);
            check(!fail_dequant, name, "%s", fail_dequant);
        }
    // layer-sized shapes at M = 1, every kernel that fits
    int big[][2] = {{4096, 4096}, {11008, 4096}, {4096, 11008}, {256, 2048}};
    for (int b = 0; b < 4; b++) {
        Mat h, d;
        double *wd = device_weight(big[b][0], big[b][1], 128, &h, &d);
        char what[N_INT8_KERNELS][200], name[160];
        const char *fails[N_INT8_KERNELS] = {0};
        int ran[N_INT8_KERNELS] = {0};
        check_kernels_at(&d, wd, 1, fails, ran, what);
        for (int i = 0; i < N_INT8_KERNELS; i++) {
            if (!ran[i]) continue;
            snprintf(name, sizeof name, "gpu %s %dx%d gs 128, M = 1, vs float64", gpu_linear_name(int8_kernels[i].k), big[b][0], big[b][1]);
            check(!fails[i], name, "%s", fails[i]);
        }
        free(wd);
        gpu_free((void *)d.q), gpu_free((void *)d.s);
        arena_free();
    }
}

// A random model written as llama2.c v1 FP32, its Q8LM quantization (gs), and optionally the
// llama2.c v2 INT8 form (row-aligned groups of v2_gs): real files, so the GPU executor uploads them.
// random_model_files: where > 0, the classifier's rows repeat with this period (and row 1, BOS's,
// is zeros), so that a step's largest logit is tied in every stretch of rows.
static int tied_classifier_period, bos_row_zero;

static void random_model_files(Config c, int shared, int gs, int v2_gs, char *fp32, char *q8, char *v2) {
    Model m;
    random_model(&m, c, 0, 0, shared);
    for (size_t i = 0; i < (size_t)c.vocab_size * c.dim; i++) ((float *)m.w.tok_embedding.f)[i] *= 0.3f;
    const Mat *cls = &m.w.wcls;
    for (int r = 1; (tied_classifier_period > 0 || bos_row_zero) && !shared && r < c.vocab_size; r++) {
        float *row = (float *)cls->f + (size_t)r * cls->stride;
        if (r == 1) memset(row, 0, c.dim * sizeof(float));
        else if (tied_classifier_period > 0 && r >= tied_classifier_period)
            memcpy(row, cls->f + (size_t)(r % tied_classifier_period) * cls->stride, c.dim * sizeof(float));
    }
    write_v1(fp32, &m);
    if (v2) write_v2(v2, &m, v2_gs);
    sh("./quantize %s %s -g %d >/dev/null", fp32, q8, gs);
    arena_free();
}

// Layers of one (rows, cols) FP32 matrix (w[0 .. layers)) into a Q8LM v2 image b: FP32 rows at q_at
// (gs 0), or INT8 rows of stride round_up(cols, ROW_ALIGN) at q_at and their scales at s_at.
static void put_mats(unsigned char *b, size_t q_at, size_t s_at, const Mat *w, int layers, int gs) {
    for (int l = 0; l < layers; l++) {
        const int rows = w[l].rows, cols = w[l].cols, stride = round_up(cols, ROW_ALIGN), groups = gs ? ceil_div(cols, gs) : 0;
        const size_t n = (size_t)rows * cols;
        if (!gs) {
            memcpy(b + q_at + l * n * sizeof(float), w[l].f, n * sizeof(float));
            continue;
        }
        int8_t *q = (int8_t *)(b + q_at) + (size_t)l * rows * stride;
        float *sc = (float *)(b + s_at) + (size_t)l * rows * groups;
        for (int r = 0; r < rows; r++) quantize_row(w[l].f + (size_t)r * cols, cols, gs, q + (size_t)r * stride, sc + (size_t)r * groups);
    }
}

// A random model (FP32, random_model) as a Q8LM v2 file, the form imports take: FP32 weights (gs 0)
// or INT8 in groups of gs, with head_dim, RoPE base, epsilon, biases, and the RoPE frequencies
// of rope_frequencies() (Llama 3.1's scaling is in the table). 0, or -1 if the write failed.
static int write_q8lm_v2(const char *path, const Model *m, int gs) {
    const Config *c = &m->cfg;
    const Weights *w = &m->w;
    const Q8Spec sp = {.version = 2, .gs = gs ? gs : 32, .fp32 = !gs, .shared = m->shared_classifier,
                       .bos_id = BOS, .eos_id = -1, .eot_id = -1, .add_bos = 1};
    Q8Layout L;
    q8_layout_spec(c, &sp, &L);
    unsigned char *b = talloc(L.total);
    q8_header_spec(b, c, &sp);
    const size_t norms = (size_t)c->n_layers * c->dim * sizeof(float);
    memcpy(b + L.rms_att, w->rms_att, norms);
    memcpy(b + L.rms_ffn, w->rms_ffn, norms);
    memcpy(b + L.rms_final, w->rms_final, c->dim * sizeof(float));
    put_mats(b, L.tok_q, L.tok_s, &w->tok_embedding, 1, gs);
    const Mat *per_layer[7] = {w->wq, w->wk, w->wv, w->wo, w->w1, w->w2, w->w3};
    for (int i = W_Q; i <= W_3; i++) put_mats(b, L.q[i], L.s[i], per_layer[i], c->n_layers, gs);
    if (!sp.shared) put_mats(b, L.cls_q, L.cls_s, &w->wcls, 1, gs);
    rope_frequencies(c, (float *)(b + L.rope));
    const float *bias[3] = {w->bq, w->bk, w->bv};
    for (int i = 0; i < 3 && c->qkv_bias; i++)
        memcpy(b + L.bias[i], bias[i], (size_t)c->n_layers * (i ? kv_width_of(c) : q_dim_of(c)) * sizeof(float));
    return write_file(path, b, L.total);
}

// Hugging Face models' features: the CPU's small_shapes 3 and 4 (head_dim 20 and 6, not dim /
// n_heads; RoPE bases 5e5 and 1e6, Llama 3.1's scaling; epsilon 1e-6; q/k/v biases), and a wider
// one (q_dim 192 over dim 128) whose epsilon, 0.05 against a mean square of about 0.1, fails any
// kernel that uses another, and whose INT8 weights (GS 64) take the tensor cores.
static const Config hf_shapes[] = {
    {.dim = 48, .hidden_dim = 100, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 67, .seq_len = 40,
     .head_dim = 20, .rope_theta = 500000.0f, .norm_eps = 1e-6f, .qkv_bias = 1, .rope_scaling = {ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 16}},
    {.dim = 64, .hidden_dim = 96, .n_layers = 2, .n_heads = 8, .n_kv_heads = 1, .vocab_size = 50, .seq_len = 36,
     .head_dim = 6, .rope_theta = 1e6f, .qkv_bias = 1},
    {.dim = 128, .hidden_dim = 172, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 97, .seq_len = 200,
     .head_dim = 48, .rope_theta = 1e6f, .norm_eps = 0.05f, .qkv_bias = 1, .rope_scaling = {ROPE_LLAMA3, 4.0f, 1.0f, 4.0f, 64}},
};

// A random model of shape c (the embedding scaled as random_model_files does) as Q8LM v2 files: FP32
// at fp32 (unless NULL), INT8 in groups of gs at q8. 0, or -1 if a write failed.
static int hf_model_files(Config c, int shared, int gs, const char *fp32, const char *q8) {
    Model m;
    random_model(&m, c, 0, 0, shared);
    for (size_t i = 0; i < (size_t)c.vocab_size * c.dim; i++) ((float *)m.w.tok_embedding.f)[i] *= 0.3f;
    const int rc = (fp32 && write_q8lm_v2(fp32, &m, 0)) || write_q8lm_v2(q8, &m, gs) ? -1 : 0;
    arena_free();
    return rc;
}


// The GPU configurations compared with the CPU. Tolerances on the logits' relative L2 error:
// 1e-4 where only FP32 summation order differs; FP16 KV cache: K and V rounded to FP16 (unit
// roundoff 4.9e-4); FP16 weights and inputs: every product's factors rounded so.
// Options spelled out: every switch off unless named (PATH_FUSED is 0).
#define GPU_RUN(...) ((GpuOptions){__VA_ARGS__})
typedef struct {
    const char *how;
    GpuOptions opt;
    double tol;
    int same_as;       // -1, or the run whose logits this one must equal bit for bit (within same_tol)
    int int8_only;     // the --unfused path exists for INT8 weights only
    double same_tol;   // 0: bit for bit; else the relative L2 difference allowed from run same_as
} GpuRun;
static const GpuRun gpu_runs[] = {
    {"graph", GPU_RUN(.use_graph = 1, .pdl = 1), 1e-4, -1, 0, 0},
    {"no graph", GPU_RUN(.pdl = 1), 1e-4, 0, 0, 0},
    {"graph, no PDL", GPU_RUN(.use_graph = 1), 1e-4, 0, 0, 0},
    {"unfused, graph", GPU_RUN(.path = PATH_UNFUSED, .use_graph = 1, .pdl = 1), 1e-4, -1, 1, 0},
    {"unfused, no graph", GPU_RUN(.path = PATH_UNFUSED, .pdl = 1), 1e-4, 3, 1, 0},
    {"FP16 KV cache", GPU_RUN(.use_graph = 1, .kv_half = 1, .pdl = 1), 3e-3, -1, 0, 0},
    {"tensor-core prefill", GPU_RUN(.use_graph = 1, .pdl = 1, .tensor_cores = 1), 3e-3, -1, 0, 0},
    {"FP16 weights (--fp16)", GPU_RUN(.path = PATH_FP16, .use_graph = 1, .kv_half = 1, .pdl = 1), 1e-2, -1, 0, 0},
    {"no norm folding", GPU_RUN(.use_graph = 1, .pdl = 1, .no_norm_fold = 1), 1e-4, -1, 0, 0},
    // where the GPU has no copy engine for it, these run the register-fed GEMV again
    {"copy-engine GEMV, graph", GPU_RUN(.use_graph = 1, .pdl = 1, .tma_gemv = 1), 1e-4, -1, 0, 0},
    {"copy-engine GEMV, no graph, no PDL", GPU_RUN(.tma_gemv = 1), 1e-4, 9, 0, 0},
    // the decode step in one kernel (INT8): x as int8 digits (products exact in int32, each group's
    // sum scaled in FP32) and the attention split otherwise, so near the copy-engine GEMV, not equal
    {"megakernel, graph", GPU_RUN(.use_graph = 1, .pdl = 1, .megakernel = 1), 1e-4, 9, 0, 1e-5},
    {"megakernel, no graph, no PDL", GPU_RUN(.megakernel = 1), 1e-4, 11, 0, 0},
    // against the per-matrix FP16 cache: the same cache up to a key or value rounded the other way
    // to FP16 (each path's sums differ in their last bits), well within either's error from the CPU
    {"megakernel, FP16 KV cache", GPU_RUN(.use_graph = 1, .kv_half = 1, .pdl = 1, .megakernel = 1), 3e-3, 5, 0, 1e-3},
    // a small model's step on a thread-block cluster (INT8, up to 512 positions; launched, not a
    // graph: the other steps' graphs as the runs above): x in int8 digits as the megakernel's, the
    // attention unsplit
    {"cluster step, PDL", GPU_RUN(.use_graph = 1, .pdl = 1, .cluster_step = 1), 1e-4, 9, 0, 1e-5},
    {"cluster step, no graph, no PDL", GPU_RUN(.cluster_step = 1), 1e-4, 14, 0, 0},
    {"cluster step, FP16 KV cache", GPU_RUN(.use_graph = 1, .kv_half = 1, .pdl = 1, .cluster_step = 1), 3e-3, 5, 0, 1e-3},
};

// The megakernel compiled for a shape that the model of compare_executors must take with an FP16
// cache (its description's words), or NULL; and words that every megakernel run's description
// must hold, or NULL.
static const char *mega_shape_expected, *mega_words_expected;

// Whether the megakernel can run an INT8 model: group sizes 16 x 2^n, rows of 16-byte multiples.
static int mega_expected(const Model *m) {
    const Mat *w[] = {&m->w.wq[0], &m->w.wo[0], &m->w.w1[0], &m->w.w2[0], &m->w.wcls};
    int ok = m->quantized;
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        int gs = w[i]->gs;
        while (gs > 16 && gs % 2 == 0) gs /= 2;
        ok = ok && gs == 16 && w[i]->stride % 16 == 0;
    }
    return ok;
}

// Whether the cluster step can run an INT8 model (cuda/cluster_step.cuh's limits): groups of a
// multiple of gpu_cluster_group_multiple(), a width of at most 1024 (a multiple of 4), q, k and v
// together and the hidden width at most 1536 each, heads of at most 128 whose cache rows are whole
// 16-byte units, at most 32 layers, and a GPU with thread-block clusters.
static int cluster_expected(const Model *m, int kv_half) {
    const Config *c = &m->cfg;
    const Mat *w[] = {&m->w.wq[0], &m->w.wk[0], &m->w.wo[0], &m->w.w1[0], &m->w.w2[0], &m->w.wcls};
    const int hs = c->head_dim, kv_dim = c->n_kv_heads * hs;
    int ok = m->quantized && gpu_has_sm90a() && c->dim <= 1024 && c->dim % 4 == 0 && q_dim_of(c) + 2 * kv_dim <= 1536 &&
             c->hidden_dim <= 1536 && hs <= 128 && hs * (kv_half ? 2 : 4) % 16 == 0 && c->n_layers <= 32;
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) ok = ok && w[i]->gs % gpu_cluster_group_multiple() == 0;
    return ok && m->w.wv[0].gs == m->w.wq[0].gs && m->w.w3[0].gs == m->w.w1[0].gs;
}

// The executor's path, without its options ("gpu int8 fused").
static const char *path_of(const Exec *e) {
    static char path[160];
    snprintf(path, sizeof path, "%.*s", (int)strcspn(e->desc, ";"), e->desc);
    return path;
}

// Both executors over one file: logits of every position (batched prefill of `first`, then one by
// one) must agree within each run's tolerance; then the greedy continuation must be identical
// (FP32 KV cache and weights only: FP16 rounding may legitimately flip a near tie).
static void compare_executors(const char *label, const char *file, int T, int first, int greedy_n) {
    char err[ERR_LEN], name[240];
    // instrumented runs: the prefill and 8 decode steps take every kernel and launch mode
    if (quick && T > first + 8) T = first + 8, greedy_n = greedy_n < 8 ? greedy_n : 8;
    Model m;
    if (load_model(file, &m, err)) {
        check(0, label, "%s", err);
        return;
    }
    int *tokens = talloc(T * sizeof(int));
    for (int t = 0; t < T; t++) tokens[t] = t == 0 ? BOS : (int)(random_u32(&rng_state) % m.cfg.vocab_size);
    Exec cpu;
    cpu_exec_init(&cpu, &m, 1, 0);
    float *ref = exec_logits(&cpu, tokens, T, first);
    int *ref_greedy = greedy_n ? greedy_tokens(&cpu, greedy_n) : NULL;
    float *logits[sizeof gpu_runs / sizeof gpu_runs[0]] = {0};
    cpu.ops->release(&cpu);
    for (size_t r = 0; r < sizeof gpu_runs / sizeof gpu_runs[0]; r++) {
        const GpuRun *run = &gpu_runs[r];
        if (run->int8_only && !m.quantized) continue;
        Exec g;
        int rc = gpu_exec_init(&g, &m, run->opt, err);
        snprintf(name, sizeof name, "%s: %s (%s) logits == cpu (relative L2 < %.0e, %d positions)", label,
                 rc ? "gpu" : path_of(&g), run->how, run->tol, T);
        if (rc) {
            check(0, name, "gpu_exec_init: %s", err);
            continue;
        }
        if (run->opt.megakernel && mega_expected(&m) && !strstr(g.desc, "megakernel")) {
            snprintf(name, sizeof name, "%s: %s (%s) runs the megakernel", label, path_of(&g), run->how);
            check(0, name, "it fell back: %s", g.desc);
        }
        if (run->opt.cluster_step && cluster_expected(&m, run->opt.kv_half) && !strstr(g.desc, "cluster step")) {
            snprintf(name, sizeof name, "%s: %s (%s) runs the cluster step", label, path_of(&g), run->how);
            check(0, name, "it fell back: %s", g.desc);
        }
        if (run->opt.megakernel && run->opt.kv_half && mega_shape_expected) {
            snprintf(name, sizeof name, "%s: %s (%s) runs the megakernel compiled for %s", label, path_of(&g), run->how, mega_shape_expected);
            check(strstr(g.desc, mega_shape_expected) != NULL, name, "it runs: %s", g.desc);
        }
        if (run->opt.megakernel && mega_words_expected) {
            snprintf(name, sizeof name, "%s: %s (%s) runs the megakernel with %s", label, path_of(&g), run->how, mega_words_expected);
            check(strstr(g.desc, mega_words_expected) != NULL, name, "it runs: %s", g.desc);
        }
        float *got = logits[r] = exec_logits(&g, tokens, T, first);
        double e = rel_l2_f(got, ref, (size_t)T * m.cfg.vocab_size);
        check(e < run->tol, name, "relative L2 error %.3e", e);
        printf("     (%s: relative L2 error %.2e)\n", run->how, e);
        if (greedy_n && run->tol <= 1e-4) {
            int *gg = greedy_tokens(&g, greedy_n), same = 0;
            while (same < greedy_n && gg[same + 1] == ref_greedy[same + 1]) {
                if (gg[same + 1] == BOS) same = greedy_n - 1;   // both stop here (the pipelined decode does)
                same++;
            }
            snprintf(name, sizeof name, "%s: %s (%s) greedy text == cpu for %d tokens", label, path_of(&g), run->how, greedy_n);
            check(same == greedy_n, name, "first difference at token %d", same);
        }
        if (run->same_as >= 0 && logits[run->same_as] && run->same_tol > 0) {
            const double d = rel_l2_f(got, logits[run->same_as], (size_t)T * m.cfg.vocab_size);
            snprintf(name, sizeof name, "%s: %s (%s) == (%s) within relative L2 %.0e", label, path_of(&g), run->how,
                     gpu_runs[run->same_as].how, run->same_tol);
            check(d <= run->same_tol, name, "relative L2 difference %.3e", d);
        } else if (run->same_as >= 0 && logits[run->same_as]) {
            double d = 0;
            for (size_t i = 0; i < (size_t)T * m.cfg.vocab_size; i++) d = fmax(d, fabs(got[i] - logits[run->same_as][i]));
            snprintf(name, sizeof name, "%s: %s (%s) == (%s) bit for bit", label, path_of(&g), run->how,
                     gpu_runs[run->same_as].how);
            check(d == 0.0, name, "max difference %.3e", d);
        }
        g.ops->release(&g);
    }
    free_model(&m);
    arena_free();
}

// A batch of 12 sequences on the GPU against the CPU's batch (which equals each sequence alone):
// the per-sequence caches and positions in RoPE, the KV store and attention, the cache copy.
// q8: an INT8 model of a context of at least 40; label: a prefix for the tests' names.
static void batch_vs_cpu(const char *label, const char *q8) {
    char err[ERR_LEN];
    Model m;
    if (load_model(q8, &m, err)) {
        check(0, "gpu batch: load", "%s", err);
        return;
    }
    const Config c = m.cfg;
    int B = 12, n = 9, steps = 15, context = 40, prompt[9], tok[12 * 15];
    batch_tokens(c.vocab_size, prompt, n, tok, B * steps);
    Exec cpu;
    cpu_exec_init(&cpu, &m, B, context);
    float *ref = batch_logits(&cpu, prompt, n, tok, B, steps);
    cpu.ops->release(&cpu);
    const GpuRun runs[] = {
        {"batch, FP32 KV, SIMT", GPU_RUN(.use_graph = 1, .pdl = 1, .n_seqs = B, .context = context), 1e-4, -1, 0, 0},
        {"batch, unfused", GPU_RUN(.path = PATH_UNFUSED, .use_graph = 1, .pdl = 1, .n_seqs = B, .context = context), 1e-4, -1, 0, 0},
        {"batch, FP16 KV, tensor cores",
         GPU_RUN(.use_graph = 1, .kv_half = 1, .pdl = 1, .tensor_cores = 1, .n_seqs = B, .context = context), 3e-3, -1, 0, 0},
        {"batch, FP16 KV, tensor cores, no graph",
         GPU_RUN(.kv_half = 1, .pdl = 1, .tensor_cores = 1, .n_seqs = B, .context = context), 3e-3, -1, 0, 0},
        {"batch, unfused, no graph", GPU_RUN(.path = PATH_UNFUSED, .pdl = 1, .n_seqs = B, .context = context), 1e-4, -1, 0, 0},
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        Exec g;
        char name[200];
        snprintf(name, sizeof name, "gpu %s%s: 12 sequences x 15 steps == cpu batch (relative L2 < %.0e)", label, runs[r].how,
                 runs[r].tol);
        if (gpu_exec_init(&g, &m, runs[r].opt, err)) {
            check(0, name, "gpu_exec_init: %s", err);
            continue;
        }
        float *got = batch_logits(&g, prompt, n, tok, B, steps);
        double e = rel_l2_f(got, ref, (size_t)steps * B * c.vocab_size);
        check(e < runs[r].tol, name, "relative L2 error %.3e", e);
        g.ops->release(&g);
    }
    free_model(&m);
    arena_free();
}

static void test_gpu_batch(void) {
    const Config c = LLAMA2C_CONFIG(128, 172, 2, 8, 4, 97, 80);
    char *fp32 = tpath("b32.bin"), *q8 = tpath("b8.bin");
    random_model_files(c, 1, 64, 0, fp32, q8, NULL);
    batch_vs_cpu("", q8);
    // biases, RoPE frequencies, head_dim and epsilon through every batch path (tensor cores: GS 64)
    if (hf_model_files(hf_shapes[2], 1, 64, NULL, q8)) check(0, "gpu batch, Hugging Face features: write", "%s", q8);
    else batch_vs_cpu("Hugging Face features, ", q8);
}

// Random models: grouped-query ratios 1, 2, 4, 8; awkward widths; prefill of 7 then decode.
static void test_gpu_random_models(void) {
    int ratios[] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) {
        Config c = LLAMA2C_CONFIG(128, 172, 2, 8, 8 / ratios[i], 97, 80);
        char label[96], *fp32 = tpath("r32.bin"), *q8 = tpath("r8.bin"), *v2 = tpath("rv2.bin");
        random_model_files(c, i % 2, 32, 4, fp32, q8, i == 0 ? v2 : NULL);
        snprintf(label, sizeof label, "random model gqa ratio %d fp32", ratios[i]);
        compare_executors(label, fp32, 70, 7, 0);
        snprintf(label, sizeof label, "random model gqa ratio %d int8 gs32", ratios[i]);
        compare_executors(label, q8, 70, 7, 0);
        if (i == 0) compare_executors("random model llama2.c v2 int8 gs4 (per-element scales)", v2, 70, 7, 0);
    }
    // head sizes 12 (FP16 cache: the attention's value sum by pairs; FP32: 3 units of 16 bytes a
    // row, 85 groups), 48 (stories15m's: 6 FP16 units, 42 groups, 252 of 256 threads), and 192 and
    // 256, past 128 (the megakernel's attention: 3 and 4 element pairs a lane)
    Config odd_heads[] = {LLAMA2C_CONFIG(96, 172, 2, 8, 4, 97, 80), LLAMA2C_CONFIG(192, 172, 2, 4, 2, 97, 80),
                          LLAMA2C_CONFIG(384, 172, 2, 2, 1, 97, 80), LLAMA2C_CONFIG(256, 172, 2, 1, 1, 97, 80)};
    for (size_t i = 0; i < sizeof odd_heads / sizeof odd_heads[0]; i++) {
        char label[96], *fp32 = tpath("h32.bin"), *q8 = tpath("h8.bin");
        random_model_files(odd_heads[i], 0, 32, 0, fp32, q8, NULL);
        snprintf(label, sizeof label, "random model head size %d int8 gs32", odd_heads[i].dim / odd_heads[i].n_heads);
        compare_executors(label, q8, 70, 7, 0);
    }
    // wide hidden layers for the cluster step's two forms of the layers' kernel, two and three
    // 16-column chunks a lane (groups of 32 that do not divide x):
    // - hidden 700 and 1,100 (dim 320, grouped-query ratio 5): x up to 1,024 wide and past it, w2's
    //   last chunk a lane in part;
    // - the three-chunk form's tail items (chunks past its last full pass over the lanes, 1 to 4 of
    //   them, as (row, chunk) items): dim 560 (35 chunks: 3 past the pass) with hidden 1,048 (66:
    //   2, the last one half past K), heads of 80 on one kv head; dim 64 (4 chunks, every one an
    //   item) with hidden 1,040 (65: 1)
    // - rows of x's chunks that fill part of a pass: dim 288 (18 chunks, stories15m's shape, six
    //   heads of 48), dim 272 with hidden 520 (17 chunks; 33, one past the first pass), 17 heads
    //   of 16 on one kv head
    const Config wide[] = {LLAMA2C_CONFIG(320, 700, 2, 5, 1, 97, 80), LLAMA2C_CONFIG(320, 1100, 2, 5, 1, 97, 80),
                           LLAMA2C_CONFIG(560, 1048, 2, 7, 1, 97, 80), LLAMA2C_CONFIG(64, 1040, 2, 4, 2, 97, 80),
                           LLAMA2C_CONFIG(288, 768, 2, 6, 6, 97, 80),  LLAMA2C_CONFIG(272, 520, 2, 17, 1, 97, 80)};
    for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++) {
        char label[96], *fp32 = tpath("w32.bin"), *q8 = tpath("w8.bin");
        const Config *c = &wide[i];
        random_model_files(*c, 0, 32, 0, fp32, q8, NULL);
        snprintf(label, sizeof label, "random model dim %d, hidden %d, gqa ratio %d int8 gs32", c->dim, c->hidden_dim,
                 c->n_heads / c->n_kv_heads);
        compare_executors(label, q8, 70, 7, 0);
    }
    // the cluster step's classifier at groups wider than 32: x 928 wide (58 chunks of 16: a second
    // pass over the lanes; 15 groups of 64, the last 32) over 26,003 rows, more than a classifier
    // block holds in shared memory (on 116 blocks: 232 rows a block, 200 held, 32 read from global
    // memory; the last block with rows 19 of them); stories15m's 288 (the last group 32 of 128)
    // over 3,001 rows; groups of 192 (not a multiple of 128, x's digits' groups) on x 448 wide
    const struct {
        Config c;
        int gs;
    } cls[] = {{LLAMA2C_CONFIG(928, 96, 1, 29, 1, 26003, 80), 64}, {LLAMA2C_CONFIG(288, 96, 2, 6, 6, 3001, 80), 128},
               {LLAMA2C_CONFIG(448, 96, 2, 7, 7, 3001, 80), 192}};
    for (size_t i = 0; i < sizeof cls / sizeof cls[0]; i++) {
        char label[96], *fp32 = tpath("c32.bin"), *q8 = tpath("c8.bin");
        random_model_files(cls[i].c, 0, cls[i].gs, 0, fp32, q8, NULL);
        snprintf(label, sizeof label, "random model dim %d, vocabulary %d, int8 gs%d", cls[i].c.dim, cls[i].c.vocab_size, cls[i].gs);
        compare_executors(label, q8, 70, 7, 0);
    }
    // a vocabulary of 70,001: the megakernel's classifier in units of at most 256 rows, up to three
    // a block (over 132 blocks)
    Config vocab = LLAMA2C_CONFIG(64, 96, 2, 4, 2, 70001, 80);
    char *vocab32 = tpath("v32.bin"), *vocab8 = tpath("v8.bin");
    random_model_files(vocab, 0, 32, 0, vocab32, vocab8, NULL);
    compare_executors("random model, vocabulary 70001, int8 gs32", vocab8, 70, 7, 0);
    // the same with the classifier's rows repeating every 7: the largest logit tied in every unit,
    // so each greedy token must be the first of the tied (the megakernel meets its units' bests as
    // argmax_kernel meets its threads')
    tied_classifier_period = 7;
    random_model_files(vocab, 0, 32, 0, vocab32, vocab8, NULL);
    tied_classifier_period = 0;
    compare_executors("random model, vocabulary 70001, classifier rows tied every 7, int8 gs32", vocab8, 70, 7, 20);
    // heads of 128, groups of 128, x of 2,049-4,096 elements a stage: with an FP16 cache, the
    // megakernel compiled for that shape (MkShape128), grouped-query ratio 3
    Config shaped = LLAMA2C_CONFIG(2304, 2560, 2, 18, 6, 97, 80);
    char *fp32 = tpath("s32.bin"), *q8 = tpath("s8.bin");
    random_model_files(shaped, 0, 128, 0, fp32, q8, NULL);
    mega_shape_expected = "heads of 128, groups of 128";
    compare_executors("random model, heads of 128, dim 2304, int8 gs128", q8, 70, 7, 0);
    // heads of 128, each its own kv head, dim 2560: the QKV stage in head slices that take the
    // attention themselves up to 256 positions; decoded from 250 to past them, where the attention
    // stage takes it again
    Config sliced = LLAMA2C_CONFIG(2560, 2560, 1, 20, 20, 97, 300);
    random_model_files(sliced, 0, 128, 0, fp32, q8, NULL);
    mega_shape_expected = "heads of 128, groups of 128, QKV in head slices";
    compare_executors("random model, heads of 128 in slices, dim 2560, int8 gs128", q8, 70, 7, 0);
    compare_executors("random model, heads of 128 in slices, dim 2560, context 300, int8 gs128", q8, 300, 250, 0);
    // and with groups of 64, which the kernel for heads of 128 does not take: the megakernel's
    // schedule made again without the slices (mega_expected: it must still run)
    random_model_files(sliced, 0, 64, 0, fp32, q8, NULL);
    mega_shape_expected = NULL;
    compare_executors("random model, heads of 128 not in slices, dim 2560, int8 gs64", q8, 70, 7, 0);
    mega_shape_expected = "heads of 128, groups of 128";
    // the same with a hidden size of 10,000: w2's x (19.5 tiles) too long for the shared memory
    // under the SM's second-largest carveout, so w2 split into 2 stages of 10 and 9.5 tiles of its
    // columns, the first adding to the kept rows only; two layers, so that the next layer's
    // stages take the sum (166M weights)
    Config long_x = LLAMA2C_CONFIG(2304, 10000, 2, 18, 6, 97, 80);
    random_model_files(long_x, 0, 128, 0, fp32, q8, NULL);
    mega_words_expected = "the longest x in 2 stages of its columns";
    compare_executors("random model, w2 in 2 stages of its columns, dim 2304, hidden 10000, int8 gs128", q8, 70, 7, 0);
    // and with groups of 64 and an odd hidden size (the any-shape kernel; the second part's x ends
    // inside a flagged word and inside a short group)
    Config odd_x = LLAMA2C_CONFIG(2304, 9999, 1, 18, 6, 97, 80);
    random_model_files(odd_x, 0, 64, 0, fp32, q8, NULL);
    mega_shape_expected = NULL;
    compare_executors("random model, w2 in 2 stages of its columns, dim 2304, hidden 9999, int8 gs64", q8, 70, 7, 0);
    mega_shape_expected = mega_words_expected = NULL;
}

// Random models with Hugging Face models' features (hf_shapes, as Q8LM v2 files) on every GPU
// option, FP32 and INT8, against the CPU: prefill of 7 then decode; the wide one's prefill in one
// chunk of 150 (the wgmma kernel, then the separate bias + RoPE kernel), the rest decoded.
static void test_gpu_hf_models(void) {
    for (size_t i = 0; i < sizeof hf_shapes / sizeof hf_shapes[0]; i++) {
        Config c = hf_shapes[i];
        config_defaults(&c);
        char shape[120], label[160], *fp32 = tpath("hf32.bin"), *q8 = tpath("hf8.bin");
        const int gs = i == 2 ? 64 : 32, T = i == 2 ? 180 : c.seq_len, first = i == 2 ? 150 : 7;
        if (hf_model_files(c, (int)i % 2, gs, fp32, q8)) {
            check(0, "gpu Hugging Face features: write the models", "%s, %s", fp32, q8);
            continue;
        }
        prefill_chunk = i == 2 ? MAX_TOKENS : TEST_CHUNK;
        snprintf(shape, sizeof shape, "random model, head_dim %d (q_dim %d, dim %d), RoPE %g%s, eps %g, biases", c.head_dim,
                 q_dim_of(&c), c.dim, c.rope_theta, c.rope_scaling.type == ROPE_LLAMA3 ? " scaled" : "", c.norm_eps);
        snprintf(label, sizeof label, "%s: fp32", shape);
        compare_executors(label, fp32, T, first, 0);
        snprintf(label, sizeof label, "%s: int8 gs%d", shape, gs);
        compare_executors(label, q8, T, first, 0);
        prefill_chunk = TEST_CHUNK;
    }
}

// A context of 1300: the attention splits into six blocks of 256 rows per head (the last
// partial, the later ones empty early on); 1040 tokens prefilled in chunks, then 60 decoded.
static void test_gpu_long_context(void) {
    Config c = LLAMA2C_CONFIG(64, 96, 2, 4, 2, 97, 1300);
    char *fp32 = tpath("long32.bin"), *q8 = tpath("long8.bin");
    random_model_files(c, 1, 32, 0, fp32, q8, NULL);
    compare_executors("random model, context 1300 (split attention) int8 gs32", q8, 1100, 1040, 0);
    // the same shape at GS 64, prefilled in chunks of MAX_TOKENS: the tensor-core run takes the
    // wgmma kernel (chunks of 512), mma.sync (the last, 16), partial row and K tiles
    random_model_files(c, 1, 64, 0, fp32, q8, NULL);
    prefill_chunk = MAX_TOKENS;
    compare_executors("random model, context 1300, int8 gs64, prefill chunks of 512", q8, 1100, 1040, 0);
    prefill_chunk = TEST_CHUNK;
    // head size 128, context 600: one split of 600 rows, whose value sum takes several batches a
    // thread (16 groups of FP16 units: 128 rows a batch; 8 of FP32: 64), the last one partial
    Config wide = LLAMA2C_CONFIG(256, 96, 2, 2, 1, 97, 600);
    random_model_files(wide, 1, 64, 0, fp32, q8, NULL);
    compare_executors("random model, head size 128, context 600 int8 gs64", q8, 600, 530, 0);
    // head size 64, 4 heads over 2 kv heads, context 1300: the megakernel's wide attention (FP16
    // cache) with a kv head's rows shared by two heads, six splits, the last one partial and
    // holding the step's own row
    Config gqa = LLAMA2C_CONFIG(256, 96, 2, 4, 2, 97, 1300);
    random_model_files(gqa, 1, 64, 0, fp32, q8, NULL);
    compare_executors("random model, head size 64, gqa ratio 2, context 1300 int8 gs64", q8, 1100, 1040, 0);
}

// The cluster step up to the positions its attention holds (512), then the other path on the same
// caches: on a context of 600, every position's logits decoded from 508 on (across 513, the first
// past them) against the CPU; and the pipelined greedy text from the start for 560 tokens (520
// --quick) against the CPU's, twice on one executor: the graph of the steps past 512 captured on
// the way, then replayed right after a cluster step (per matrix, and the megakernel). The
// classifier's row for BOS is zeros, so that the greedy text does not stop at a BOS.
static void test_gpu_cluster_step(void) {
    Config c = LLAMA2C_CONFIG(256, 96, 2, 4, 2, 97, 600);
    char *fp32 = tpath("cl32.bin"), *q8 = tpath("cl8.bin"), err[ERR_LEN], name[200];
    bos_row_zero = 1;
    random_model_files(c, 0, 64, 0, fp32, q8, NULL);
    bos_row_zero = 0;
    compare_executors("random model, context 600, decoded across the cluster step's 512 positions, int8 gs64", q8, 530, 508, 0);
    Model m;
    if (load_model(q8, &m, err)) {
        check(0, "gpu cluster step: load", "%s", err);
        return;
    }
    const int n = quick ? 520 : 560;
    Exec cpu;
    cpu_exec_init(&cpu, &m, 1, 0);
    const int *ref = greedy_tokens(&cpu, n);
    cpu.ops->release(&cpu);
    const GpuRun runs[] = {
        {"cluster step, then per matrix", GPU_RUN(.use_graph = 1, .pdl = 1, .cluster_step = 1), 0, -1, 0, 0},
        {"cluster step, then the megakernel", GPU_RUN(.use_graph = 1, .pdl = 1, .cluster_step = 1, .megakernel = 1), 0, -1, 0, 0},
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        Exec g;
        snprintf(name, sizeof name, "gpu %s: greedy text == cpu for %d tokens, across 512 positions", runs[r].how, n);
        if (gpu_exec_init(&g, &m, runs[r].opt, err)) {
            check(0, name, "gpu_exec_init: %s", err);
            continue;
        }
        if (cluster_expected(&m, 0) && !strstr(g.desc, "cluster step")) check(0, name, "the cluster step fell back: %s", g.desc);
        for (int again = 0; again < 2; again++) {
            const int *got = greedy_tokens(&g, n);
            int same = 0;
            while (same < n && got[same + 1] == ref[same + 1] && ref[same + 1] != BOS) same++;
            check(same == n, name, "%s run: first difference (or a BOS) at token %d", again ? "second" : "first", same);
        }
        g.ops->release(&g);
    }
    free_model(&m);
    arena_free();
}

// Sampled generation on stories260K with the tokens sampled on the device against the same run
// sampling on the host (--host-sample): identical logits either way, so identical text unless a
// coin falls within rounding of a token's boundary (the test fails if one ever does for these
// seeds). One sequence with top-p and without, and a --batch of 4.
static void test_gpu_sampled_text(void) {
    const char *q8 = model_path("stories260K_q8.bin"), *tok = model_path("tok512.bin");
    const char *flags[] = {"-t 0.8 -s 11", "-t 1.0 --top-p 0 -s 12", "-t 0.9 --top-p 0.95 -s 13 --batch 4 -p Once"};
    if (!file_exists(q8) || !file_exists(tok)) {
        skip("gpu sampled text", "models/stories260K_q8.bin or models/tok512.bin not present");
        return;
    }
    for (int f = 0; f < 3; f++) {
        char *dev = tpath("sample_dev.txt"), *host = tpath("sample_host.txt"), name[160];
        int a = sh("./run %s -z %s -n 200 %s > %s 2>/dev/null", q8, tok, flags[f], dev);
        int b = sh("./run %s -z %s -n 200 %s --host-sample > %s 2>/dev/null", q8, tok, flags[f], host);
        size_t la = 0, lb = 0;
        char err[ERR_LEN];
        char *ta = read_file(dev, 1 << 20, &la, err), *tb = read_file(host, 1 << 20, &lb, err);
        snprintf(name, sizeof name, "gpu sampled text (%s) == the same run sampling on the host", flags[f]);
        check(a == 0 && b == 0 && ta && tb && la > 100 && la == lb && !memcmp(ta, tb, la), name,
              "exit %d / %d, %zu / %zu bytes", a, b, la, lb);
        free(ta), free(tb);
    }
}

// The real checkpoints, and two layers of Llama-2-7B's shapes.
static void test_gpu_real_models(void) {
    char *q8 = tpath("stories_q8.bin");
    if (file_exists(model_path("stories260K.bin")) && !sh("./quantize %s %s >/dev/null", model_path("stories260K.bin"), q8)) {
        compare_executors("stories260K fp32", model_path("stories260K.bin"), 200, 33, 200);
        compare_executors("stories260K int8 gs128", q8, 200, 33, 200);
    } else {
        skip("gpu stories260K", "models/stories260K.bin not present");
    }
    q8 = tpath("code_q8.bin");
    if (quick) {
        skip("gpu code15M and the 7B-shaped model", "--quick");
        return;
    }
    if (file_exists(model_path("code15M.bin")) && !sh("./quantize %s %s -g 64 >/dev/null", model_path("code15M.bin"), q8)) {
        compare_executors("code15M int8 gs64", q8, 100, 40, 60);
    } else {
        skip("gpu code15M", "models/code15M.bin not present");
    }
    // Llama-2-7B layer shapes, two layers (random weights): what the speed figures run on
    q8 = tpath("l7b2.bin");
    if (!sh("./quantize --synthetic 4096,11008,2,32,32,-32000,64 %s 2>/dev/null", q8))
        compare_executors("synthetic 7B shapes x 2 layers int8 gs128", q8, 6, 4, 0);
    else check(0, "synthetic 7B shapes x 2 layers", "./quantize --synthetic failed");
    sh("rm -f %s", q8);
}

// A checkpoint larger than the GPU's memory: a Q8LM header for 176 GB of weights over a sparse
// file (no disk blocks behind it). The executor and ./run must refuse it with the sizes, before
// allocating anything.
static void test_gpu_too_small(void) {
    Config c = LLAMA2C_CONFIG(8192, 28672, 200, 64, 8, 32000, 4096);
    config_defaults(&c);   // head_dim: the layout needs it, as the loader derives it
    Q8Layout L;
    q8_layout(&c, 128, 0, &L);
    unsigned char hdr[HEADER_BYTES];
    q8_header(hdr, &c, 128, 0);
    char *path = tpath("huge.bin"), err[ERR_LEN] = "";
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(hdr, 1, sizeof hdr, f) == sizeof hdr && fflush(f) == 0 && ftruncate(fileno(f), (off_t)L.total) == 0;
    if (f) fclose(f);
    struct stat st;
    int fd = open(path, O_RDONLY);   // the size through an open descriptor, as load_model sees it
    ok = ok && fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size == L.total;
    if (fd >= 0) close(fd);
    if (!ok) {   // some filesystems cap a file's size (and some report it whole by path only)
        skip("gpu: a 176 GB checkpoint is refused", "the temporary directory's filesystem cannot hold a sparse file of that size");
        return;
    }
    Model m;
    if (load_model(path, &m, err)) {
        check(0, "gpu: a 176 GB checkpoint is refused", "the sparse file does not load: %s", err);
        return;
    }
    Exec e;
    GpuOptions opt = GPU_DEFAULTS;
    int rc = gpu_exec_init(&e, &m, opt, err);
    check(rc == GPU_TOO_SMALL && strstr(err, "GiB"), "gpu: a 176 GB checkpoint is refused (larger than GPU memory)",
          "rc %d: %s", rc, err);
    if (rc == 0) e.ops->release(&e);
    free_model(&m);
    rc = sh("./run %s -z tokenizer.bin -n 8 > %s 2> %s", path, tpath("huge.out"), tpath("huge.err"));
    size_t n = 0;
    char *msg = read_file(tpath("huge.err"), 4096, &n, err);
    check(WIFEXITED(rc) && WEXITSTATUS(rc) == 1 && msg && strstr(msg, "GiB") && strstr(msg, "needs"), "./run: a 176 GB checkpoint exits 1 with the sizes",
          "exit %d: %s", rc, msg ? msg : err);
    free(msg);
    sh("rm -f %s", path);
}

// The GPU's logits of every position of ids (a prefill of 5, then one at a time), or NULL with
// gpu_exec_init's reason in err.
static float *gpu_logits_of(const Model *m, GpuOptions opt, const int *ids, int n, char *err) {
    Exec e;
    if (gpu_exec_init(&e, m, opt, err)) return NULL;
    float *got = exec_logits(&e, ids, n, n < 5 ? n : 5);
    e.ops->release(&e);
    return got;
}

// An import fixture on the GPU: quantize <input> [flags] into Q8LM v2 as test_import does, then
// the GPU's logits of the fixture's ids against transformers' (refs/logits.f32): with an FP32 KV
// cache (FP32 weights on cuBLAS, INT8 on the fused GEMVs; only summation order apart from the
// CPU's) within tol[0], with the defaults (FP16 KV cache, tensor-core prefill) within tol[1].
// Then every GPU option against the CPU on the same file, on random tokens (compare_executors).
static void test_gpu_import(const char *input, const char *refs, const char *flags, const double tol[2], const char *label) {
    const char *kind = flags[0] ? flags : "(INT8)";
    char name[300], err[ERR_LEN];
    snprintf(name, sizeof name, "gpu import %s %s", label, kind);
    char *out = tpath("gpu_import.bin");
    ImportFixture f;
    if (!load_import(input, refs, flags, out, name, &f)) return;
    const GpuRun runs[2] = {
        {"FP32 KV cache", GPU_RUN(.use_graph = 1, .pdl = 1), tol[0], -1, 0, 0},
        {"defaults: FP16 KV cache, tensor-core prefill", GPU_DEFAULTS, tol[1], -1, 0, 0},
    };
    for (int r = 0; r < 2; r++) {
        snprintf(name, sizeof name, "gpu import %s %s (%s): logits vs transformers float32 (relative L2 < %.0e)", label, kind,
                 runs[r].how, runs[r].tol);
        const float *got = gpu_logits_of(&f.m, runs[r].opt, f.ids, f.n_ids, err);
        if (!got) {
            check(0, name, "gpu_exec_init: %s", err);
            continue;
        }
        const double e = rel_l2_f(got, f.ref, (size_t)f.n_ids * f.V);
        check(e < runs[r].tol, name, "relative L2 %.3e", e);
        printf("     (relative L2 %.2e)\n", e);
    }
    free_model(&f.m);
    snprintf(name, sizeof name, "import %s %s", label, kind);
    compare_executors(name, out, 40, 7, 0);
}

// The fixtures of test_imports on the GPU. Tolerances against transformers: FP32 weights, and INT8
// from Q8_0 (the file's own values), 1e-3 with an FP32 KV cache (the CPU's: 1e-4; measured on the
// H200 under 1e-6), 3e-3 with FP16 K and V (measured under 8e-4); INT8 of float weights 5e-2, the
// CPU's (these random models turn its rounding into several % of their small logits).
static void test_gpu_imports(void) {
    static const char *const hf[] = {"llama_basic", "llama3_scaled", "mistral", "qwen2", "llama_bf16", "qwen2_f16", "mistral_spm"};
    static const char *const gguf[] = {"llama_basic.f32", "llama_basic.q8_0", "llama3_scaled.q8_0", "qwen2.f16"};
    const double exact[2] = {1e-3, 3e-3}, int8[2] = {5e-2, 5e-2};
    char dir[256], refs[300];
    for (size_t i = 0; i < sizeof hf / sizeof hf[0]; i++) {
        snprintf(dir, sizeof dir, "tests/fixtures/hf/%s", hf[i]);
        snprintf(refs, sizeof refs, "%s/refs", dir);
        test_gpu_import(dir, refs, "--fp32", exact, hf[i]);
        test_gpu_import(dir, refs, "", int8, hf[i]);
    }
    for (size_t i = 0; i < sizeof gguf / sizeof gguf[0]; i++) {
        snprintf(dir, sizeof dir, "tests/fixtures/gguf/%s.gguf", gguf[i]);
        snprintf(refs, sizeof refs, "tests/fixtures/gguf/%s.refs", gguf[i]);
        if (!strcmp(gguf[i], "llama_basic.f32")) snprintf(refs, sizeof refs, "tests/fixtures/hf/llama_basic/refs");   // bit-identical
        test_gpu_import(dir, refs, "--fp32", exact, gguf[i]);
        test_gpu_import(dir, refs, "", strstr(gguf[i], "q8_0") ? exact : int8, gguf[i]);
    }
    arena_free();
}

// SmallDiv (the cluster step's index arithmetic) is the quotient for every pair below 2^12, by the
// device's reciprocal and by the host's (small_div_inverse), and the two reciprocals are the same.
static void test_gpu_small_div(void) {
    int c = 0, d = 0;
    const int bad = gpu_small_div_mismatches(gctx, &c, &d);
    check(bad == 0, "gpu SmallDiv: c / d by the reciprocal, the device's or the host's, every c, d below 2^12",
          "%d pairs differ, e.g. %d / %d (0 / d: the reciprocals differ)", bad, c, d);
}

static void test_gpu_kernels(void) {
    gctx = gpu_create((size_t)11008 * 130, (size_t)11008 * 384);
    test_gpu_small_div();
    test_gpu_linear();
    dev_scratch_free();
    test_gpu_argmax();
    test_gpu_sample();
    gpu_destroy(gctx);
}
static void test_gpu_batches(void) {
    test_gpu_too_small();
    test_gpu_batch();
}
static void test_gpu_real(void) {
    test_gpu_real_models();
    test_gpu_sampled_text();
}

static void test_gpu(void) {
    char why[ERR_LEN];
    if (gpu_probe(why)) {
        for (int i = 0; i < N_GPU_GROUPS; i++) {
            char name[32];
            snprintf(name, sizeof name, "gpu test group %d", i + 1);
            skip(name, why);
        }
        return;
    }
    printf("GPU: %s\n", gpu_name());
    // "models": the last six groups (instrumented, they run as parts of their own too)
    const int models = !gpu_part || !strcmp(gpu_part, "models");
    if (!gpu_part || !strcmp(gpu_part, "linear")) run_group("gpu linear kernels, argmax, sampling", test_gpu_kernels);
    if (!gpu_part || !strcmp(gpu_part, "batch")) run_group("gpu batches, a checkpoint too large", test_gpu_batches);
    if (models || !strcmp(gpu_part, "random")) run_group("gpu random models", test_gpu_random_models);
    if (models || !strcmp(gpu_part, "random")) run_group("gpu random models with Hugging Face features", test_gpu_hf_models);
    if (models || !strcmp(gpu_part, "long")) run_group("gpu long contexts", test_gpu_long_context);
    if (models || !strcmp(gpu_part, "long")) run_group("gpu cluster step across its positions", test_gpu_cluster_step);
    if (models || !strcmp(gpu_part, "real")) run_group("gpu real models", test_gpu_real);
    if (models || !strcmp(gpu_part, "real")) run_group("gpu imports: Hugging Face and GGUF", test_gpu_imports);
}
#else
static void test_gpu(void) {
    for (int i = 0; i < N_GPU_GROUPS; i++) {
        char name[32];
        snprintf(name, sizeof name, "gpu test group %d", i + 1);
        skip(name, "this build has no GPU support (nvcc not found)");
    }
}
#endif

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--fixtures")) {   // the fuzzers' seed checkpoints
        Model m0;
        size_t n1, n2;
        if (write_fixtures(argv[2], &m0, &n1, &n2)) return 1;
        free_model(&m0);
        arena_free();
        return 0;
    }
    int gpu_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--gpu-only")) gpu_only = 1;
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--gpu-part") && i + 1 < argc && is_gpu_part(argv[i + 1]))
            gpu_part = argv[++i];
        else if (argv[i][0] == '-') {
            fprintf(stderr, "test_run: unknown option %s\n%s", argv[i], TEST_USAGE);
            return 2;
        } else models_dir = argv[i];
    }
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);   // each line as it is printed, also into a pipe
    if (!gpu_only) {
        run_group("quantizer", test_quantize_row);
        run_group("cpu forward, batches, sampling", test_cpu);
        run_group("loaders, synthetic checkpoints", test_files);
        run_group("tokenizers", test_tokenizers);
        run_group("greedy agreement int8 vs fp32", test_agreement);
        run_group("imports: Hugging Face and GGUF", test_imports);
    }
    test_gpu();
    sh("rm -rf %s", tmpdir);
    printf("%d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
    return n_fail ? 1 : 0;
}
