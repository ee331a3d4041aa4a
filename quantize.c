// quantize.c: FP32 llama2.c checkpoints, Hugging Face directories and GGUF files -> group-wise
// symmetric INT8 (Q8LM, model.h), and synthetic checkpoints with seeded random weights for speed
// work.
//
//   quantize in.bin out.bin [-g GS]                         convert, printing the error per tensor
//   quantize <hf-dir | model.gguf> out.bin [-g GS] [--fp32] import (Q8LM v2; --fp32: FP32 weights)
//   quantize --synthetic NAME out.bin [--fp32] [-g GS] [--seed S]
//   quantize --help                                         the usage, on stdout
//
// out.bin is checked before any work: never the input, never a device, FIFO or directory (see
// check_output); a symbolic link is written through to its target.
//
// Work is split by rows over threads; each row is produced (read, or drawn from its own seeded
// generator, so the file does not depend on the thread count), then quantized straight into the
// memory-mapped output: no FP32 copy of a whole tensor exists, even for a 7B model.
#define _GNU_SOURCE   // sincosf
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "import.h"
#include "model.h"
#include "tokfile.h"

// The output is written to a temporary file beside it and renamed into place only when complete,
// so that a failure (a full disk, a signal) never leaves a truncated checkpoint under its name.
static char tmp_output[4200];

static void die(const char *msg) {
    fprintf(stderr, "quantize: %s\n", msg);
    if (tmp_output[0]) unlink(tmp_output);
    exit(1);
}

// ----------------------------------------------------------------------------
// One job: `rows` rows of length `cols`, from src (FP32 rows) or drawn from N(0, std^2),
// written as FP32 (dst_f) or INT8 (dst_q, dst_s, Q8LM's padded layout).

typedef struct {
    const char *name;            // tensor kind, for the report
    int rows, cols, gs;
    const float *src;            // (rows, cols) or NULL: from, else synthetic
    const Source *from;          // an imported model's tensor: role, layer
    Role role;
    int layer;
    unsigned long long seed;
    float *dst_f;                // (rows, cols)
    int8_t *dst_q;               // (rows, round_up(cols, 16))
    float *dst_s;                // (rows, ceil(cols / gs))
    double sum_sq_w, sum_sq_err, max_err;   // quantization error, filled in
} Job;

typedef struct {
    Job *jobs;
    int n_jobs;
    size_t total_rows;
    pthread_mutex_t lock;
    int next_job, next_row;      // the next chunk of rows to hand out
    size_t rows_done;
    int progress;                // print a progress line
} Work;

#define CHUNK_ROWS 64

// splitmix64: decorrelates the per-row seeds
static unsigned long long mix64(unsigned long long x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Box-Muller pairs from a xorshift64* stream: N(0, std^2)
static void normal_row(float *out, int n, unsigned long long seed, float std) {
    unsigned long long s = mix64(seed) | 1;
    for (int i = 0; i < n; i += 2) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        unsigned long long r = s * 0x2545F4914F6CDD1Dull;
        float u1 = ((r >> 40) + 1) / 16777217.0f, u2 = ((r >> 16) & 0xFFFFFF) / 16777216.0f;
        float rad = std * sqrtf(-2.0f * logf(u1)), s2, c2;
        sincosf(6.2831853f * u2, &s2, &c2);
        out[i] = rad * c2;
        if (i + 1 < n) out[i + 1] = rad * s2;
    }
}

// A GGUF Q8_0 row into groups of 32: its own scales and values, without loss. 1 if it was one.
static int copy_q8_0(Job *j, int r, int8_t *q, float *s) {
    char err[ERR_LEN];
    if (!j->from || j->gs != GGML_QK8_0) return 0;
    int rc = source_row_q8_0(j->from, j->role, j->layer, r, s, q, err);
    if (rc < 0) die(err);
    return rc;
}

static void do_row(Job *j, int r, float *row, double acc[3]) {
    char why[ERR_LEN];
    if (j->src) memcpy(row, j->src + (size_t)r * j->cols, j->cols * sizeof(float));
    else if (j->from) {
        if (source_row(j->from, j->role, j->layer, r, row, why)) die(why);
    } else normal_row(row, j->cols, j->seed * 0x100000001ull + r, 0.02f);
    if (j->dst_f) {
        memcpy(j->dst_f + (size_t)r * j->cols, row, j->cols * sizeof(float));
        return;
    }
    int8_t *q = j->dst_q + (size_t)r * round_up(j->cols, ROW_ALIGN);
    float *s = j->dst_s + (size_t)r * ceil_div(j->cols, j->gs);
    if (!copy_q8_0(j, r, q, s)) quantize_row(row, j->cols, j->gs, q, s);
    for (int c = 0; c < j->cols; c++) {
        double err = fabs((double)q[c] * s[c / j->gs] - row[c]);
        acc[0] += (double)row[c] * row[c];
        acc[1] += err * err;
        if (err > acc[2]) acc[2] = err;
    }
}

static void *worker(void *arg) {
    Work *w = arg;
    int max_cols = 0;
    for (int i = 0; i < w->n_jobs; i++) max_cols = w->jobs[i].cols > max_cols ? w->jobs[i].cols : max_cols;
    float *row = malloc((max_cols + 1) * sizeof(float));
    if (!row) die("out of memory");
    for (;;) {
        pthread_mutex_lock(&w->lock);
        while (w->next_job < w->n_jobs && w->next_row >= w->jobs[w->next_job].rows) w->next_job++, w->next_row = 0;
        if (w->next_job == w->n_jobs) {
            pthread_mutex_unlock(&w->lock);
            break;
        }
        Job *j = &w->jobs[w->next_job];
        int lo = w->next_row, hi = lo + CHUNK_ROWS < j->rows ? lo + CHUNK_ROWS : j->rows;
        w->next_row = hi;
        pthread_mutex_unlock(&w->lock);

        double acc[3] = {0, 0, 0};
        for (int r = lo; r < hi; r++) do_row(j, r, row, acc);

        pthread_mutex_lock(&w->lock);
        j->sum_sq_w += acc[0];
        j->sum_sq_err += acc[1];
        if (acc[2] > j->max_err) j->max_err = acc[2];
        size_t before = w->rows_done;
        w->rows_done += hi - lo;
        if (w->progress && w->rows_done * 20 / w->total_rows != before * 20 / w->total_rows)
            fprintf(stderr, "\rquantize: %3zu%% of %zu rows", w->rows_done * 100 / w->total_rows, w->total_rows);
        pthread_mutex_unlock(&w->lock);
    }
    free(row);
    return NULL;
}

static void run_jobs(Job *jobs, int n_jobs) {
    Work w = {jobs, n_jobs, 0, PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, 0};
    size_t elements = 0;
    for (int i = 0; i < n_jobs; i++) {
        w.total_rows += jobs[i].rows;
        elements += (size_t)jobs[i].rows * jobs[i].cols;
    }
    w.progress = elements > ((size_t)64 << 20);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int n_threads = cpus < 1 ? 1 : cpus > 64 ? 64 : (int)cpus;
    pthread_t tid[64];
    for (int t = 0; t < n_threads; t++)
        if (pthread_create(&tid[t], NULL, worker, &w)) die("cannot start a thread");
    for (int t = 0; t < n_threads; t++) pthread_join(tid[t], NULL);
    if (w.progress) fprintf(stderr, "\n");
}

// ----------------------------------------------------------------------------
// The output path, checked once before any work. rename() replaces whatever is at the path: over
// the input it destroys the FP32 original, over a device node (/dev/null, as root), a FIFO or a
// socket it leaves a regular file in its place. So the output must be a regular file or missing,
// and not the input. A symbolic link is written through, as cp and compilers do: the temporary
// file goes beside the link's final target and replaces it, and the link stays a link.

#define MAX_LINK_HOPS 40   // the kernel's own limit before ELOOP

static const char *file_kind(mode_t m) {
    return S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device" : S_ISFIFO(m) ? "a FIFO"
         : S_ISSOCK(m) ? "a socket" : S_ISDIR(m) ? "a directory" : "a special file";
}

// Follows path's chain of symbolic links to the file it finally names, which need not exist yet
// (realpath() refuses a link to a missing file); target is path itself where path is no link.
// 0, or -1 with the reason in err.
static int link_target(const char *path, char target[PATH_MAX], char *err) {
    char link[PATH_MAX], next[PATH_MAX];
    struct stat st;
    if (snprintf(target, PATH_MAX, "%s", path) >= PATH_MAX) {
        snprintf(err, ERR_LEN, "%.300s...: path too long", path);
        return -1;
    }
    for (int hop = 0; lstat(target, &st) == 0 && S_ISLNK(st.st_mode); hop++) {
        if (hop == MAX_LINK_HOPS) {
            snprintf(err, ERR_LEN, "%.300s: too many levels of symbolic links", path);
            return -1;
        }
        ssize_t n = readlink(target, link, sizeof link - 1);
        if (n < 0) {
            snprintf(err, ERR_LEN, "%.300s: cannot follow the symbolic link: %s", path, strerror(errno));
            return -1;
        }
        link[n] = '\0';
        // a relative link is relative to the directory that holds it
        const char *slash = strrchr(target, '/');
        int dir_len = link[0] == '/' || !slash ? 0 : (int)(slash - target + 1);
        if (snprintf(next, sizeof next, "%.*s%s", dir_len, target, link) >= (int)sizeof next) {
            snprintf(err, ERR_LEN, "%.300s: the symbolic link's target path is too long", path);
            return -1;
        }
        memcpy(target, next, sizeof next);
    }
    return 0;
}

// Resolves out (NULL in: --synthetic) into target, the path to write and rename over, and refuses
// the input itself (same device and inode: a hard link or a symbolic link counts) and any file that
// is not regular. A target that cannot be examined is left to create_output, which names the error.
// 0, or -1 with the reason in err.
static int check_output(const char *in, const char *out, char target[PATH_MAX], char *err) {
    struct stat so, si;
    if (link_target(out, target, err)) return -1;
    if (stat(target, &so) != 0) return 0;
    if (in && stat(in, &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
        snprintf(err, ERR_LEN, "%.200s: is the input file %.200s (same device and inode); choose another output", out, in);
        return -1;
    }
    if (!S_ISREG(so.st_mode)) {
        int linked = strcmp(out, target) != 0;   // name where the link leads too
        snprintf(err, ERR_LEN, "%.200s%s%.200s: is %s, not a regular file; refusing to replace it", out,
                 linked ? " -> " : "", linked ? target : "", file_kind(so.st_mode));
        return -1;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Output files: sized, then mapped and filled in place.

typedef struct {
    unsigned char *base;
    size_t bytes;
} OutFile;

// Creates path's temporary file with all its blocks allocated up front (posix_fallocate), so that
// a full disk is an error here and not a SIGBUS when a mapped page is first written.
static OutFile create_output(const char *path, size_t bytes) {
    char msg[ERR_LEN];
    if (snprintf(tmp_output, sizeof tmp_output, "%s.tmpXXXXXX", path) >= (int)sizeof tmp_output) {
        tmp_output[0] = '\0';   // a truncated name could land in another directory
        snprintf(msg, sizeof msg, "%.300s...: path too long", path);
        die(msg);
    }
    int fd = mkstemp(tmp_output);
    if (fd < 0) {
        tmp_output[0] = '\0';
        snprintf(msg, sizeof msg, "%.300s: cannot create a file there: %s", path, strerror(errno));
        die(msg);
    }
    int e = posix_fallocate(fd, 0, (off_t)bytes);
    if (e != 0 || fchmod(fd, 0644) != 0) {
        snprintf(msg, sizeof msg, "%.300s: cannot allocate %zu bytes: %s", path, bytes, strerror(e ? e : errno));
        close(fd);
        die(msg);
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(msg, sizeof msg, "%s: cannot map for writing: %s", path, strerror(errno));
        die(msg);
    }
    return (OutFile){p, bytes};
}

static void close_output(OutFile *o, const char *path) {
    char msg[ERR_LEN];
    if (msync(o->base, o->bytes, MS_SYNC) != 0 || munmap(o->base, o->bytes) != 0) {
        snprintf(msg, sizeof msg, "%.300s: write failed: %s", path, strerror(errno));
        die(msg);
    }
    if (rename(tmp_output, path) != 0) {
        snprintf(msg, sizeof msg, "%.300s: cannot rename %.150s into place: %s", path, tmp_output, strerror(errno));
        die(msg);
    }
    tmp_output[0] = '\0';
}

static void fill_floats(float *p, size_t n, float v) {
    for (size_t i = 0; i < n; i++) p[i] = v;
}

// Jobs that fill a Q8LM file. src: the FP32 model, or NULL for synthetic weights.
// Returns the number of jobs; jobs needs room for 2 + 7 * n_layers.
static int q8_jobs(const Config *c, int gs, int shared, const Weights *src, unsigned char *base, const Q8Layout *L,
                   unsigned long long seed, Job *jobs) {
    int n = 0;
    jobs[n++] = (Job){"tok_embedding", c->vocab_size, c->dim, gs, src ? src->tok_embedding.f : NULL, NULL, 0, 0, seed + 1, NULL,
                      (int8_t *)(base + L->tok_q), (float *)(base + L->tok_s), 0, 0, 0};
    Mat *const per_layer[7] = {src ? src->wq : 0, src ? src->wk : 0, src ? src->wv : 0, src ? src->wo : 0,
                               src ? src->w1 : 0, src ? src->w2 : 0, src ? src->w3 : 0};
    for (int w = W_Q; w <= W_3; w++) {
        int rows, cols;
        linear_shape(c, w, &rows, &cols);
        for (int l = 0; l < c->n_layers; l++)
            jobs[n++] = (Job){linear_names[w], rows, cols, gs, src ? per_layer[w][l].f : NULL, NULL, 0, 0, seed + 2 + (unsigned long long)w * 4096 + l,
                              NULL, (int8_t *)(base + L->q[w]) + (size_t)l * rows * round_up(cols, ROW_ALIGN),
                              (float *)(base + L->s[w]) + (size_t)l * rows * ceil_div(cols, gs), 0, 0, 0};
    }
    if (!shared)
        jobs[n++] = (Job){"wcls", c->vocab_size, c->dim, gs, src ? src->wcls.f : NULL, NULL, 0, 0, seed + 3, NULL,
                          (int8_t *)(base + L->cls_q), (float *)(base + L->cls_s), 0, 0, 0};
    return n;
}

static void write_q8(const char *path, const Config *c, int gs, int shared, const Weights *src, unsigned long long seed,
                     Job *jobs, int *n_jobs) {
    Q8Layout L;
    q8_layout(c, gs, shared, &L);
    OutFile o = create_output(path, L.total);
    q8_header(o.base, c, gs, shared);
    size_t Ld = (size_t)c->n_layers * c->dim;
    if (src) {
        memcpy(o.base + L.rms_att, src->rms_att, Ld * sizeof(float));
        memcpy(o.base + L.rms_ffn, src->rms_ffn, Ld * sizeof(float));
        memcpy(o.base + L.rms_final, src->rms_final, c->dim * sizeof(float));
    } else {
        fill_floats((float *)(o.base + L.rms_att), Ld, 1.0f);
        fill_floats((float *)(o.base + L.rms_ffn), Ld, 1.0f);
        fill_floats((float *)(o.base + L.rms_final), c->dim, 1.0f);
    }
    *n_jobs = q8_jobs(c, gs, shared, src, o.base, &L, seed, jobs);
    run_jobs(jobs, *n_jobs);
    close_output(&o, path);
}

// Synthetic FP32 in llama2.c's legacy v0 layout (what its run.c reads), norms 1, weights N(0, 0.02^2).
// The freq_cis tables (zeros) are written only where the unshared classifier follows them.
static void write_fp32_synthetic(const char *path, const Config *c, int shared, unsigned long long seed) {
    size_t Ld = (size_t)c->n_layers * c->dim, vd = (size_t)c->vocab_size * c->dim;
    size_t floats = vd + 2 * Ld + c->dim + (shared ? 0 : vd + (size_t)c->seq_len * (c->dim / c->n_heads));
    size_t lin[7];
    for (int w = 0; w < 7; w++) {
        int rows, cols;
        linear_shape(c, w, &rows, &cols);
        lin[w] = (size_t)c->n_layers * rows * cols;
        floats += lin[w];
    }
    OutFile o = create_output(path, 28 + floats * 4);
    int32_t hdr[7] = {c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, shared ? c->vocab_size : -c->vocab_size, c->seq_len};
    memcpy(o.base, hdr, 28);
    float *p = (float *)(o.base + 28);
    Job jobs[10];
    int n = 0;
    jobs[n++] = (Job){"tok_embedding", c->vocab_size, c->dim, 0, NULL, NULL, 0, 0, seed + 1, p, NULL, NULL, 0, 0, 0};
    p += vd;
    fill_floats(p, Ld, 1.0f);   // rms_att
    p += Ld;
    for (int w = W_Q; w <= W_3; w++) {
        if (w == W_1) { fill_floats(p, Ld, 1.0f); p += Ld; }   // rms_ffn
        int rows, cols;
        linear_shape(c, w, &rows, &cols);
        jobs[n++] = (Job){linear_names[w], (int)(lin[w] / cols), cols, 0, NULL, NULL, 0, 0, seed + 2 + (unsigned long long)w * 4096, p, NULL, NULL, 0, 0, 0};
        p += lin[w];
    }
    fill_floats(p, c->dim, 1.0f);   // rms_final
    p += c->dim;
    if (!shared) jobs[n++] = (Job){"wcls", c->vocab_size, c->dim, 0, NULL, NULL, 0, 0, seed + 3, p + (size_t)c->seq_len * (c->dim / c->n_heads), NULL, NULL, 0, 0, 0};
    run_jobs(jobs, n);
    close_output(&o, path);
}

// ----------------------------------------------------------------------------
// Imports (Hugging Face, GGUF) -> Q8LM v2: matrices through the jobs, vectors here.

// A vector tensor (norms, biases) of every layer into dst, (layers, n) floats.
static void copy_vectors(const Source *src, Role r, int layers, float *dst) {
    char err[ERR_LEN];
    int rows, cols;
    role_shape(&src->cfg, r, &rows, &cols);
    for (int l = 0; l < layers; l++)
        if (source_row(src, r, l, 0, dst + (size_t)l * cols, err)) die(err);
}

static Job import_job(const Source *src, Role r, int layer, const Q8Spec *sp, unsigned char *base, size_t q_at, size_t s_at) {
    int rows, cols;
    role_shape(&src->cfg, r, &rows, &cols);
    const size_t q_layer = sp->fp32 ? (size_t)rows * cols * sizeof(float) : (size_t)rows * round_up(cols, ROW_ALIGN);
    const size_t s_layer = sp->fp32 ? 0 : (size_t)rows * ceil_div(cols, sp->gs) * sizeof(float);
    Job j = {.name = r == R_EMBED ? "tok_embedding" : r == R_CLS ? "wcls" : linear_names[r - R_WQ], .rows = rows, .cols = cols,
             .gs = sp->gs, .from = src, .role = r, .layer = layer};
    if (sp->fp32) j.dst_f = (float *)(base + q_at + layer * q_layer);
    else j.dst_q = (int8_t *)(base + q_at + layer * q_layer), j.dst_s = (float *)(base + s_at + layer * s_layer);
    return j;
}

// Returns the number of jobs; jobs needs room for 2 + 7 * n_layers.
static int import_jobs(const Source *src, const Q8Spec *sp, unsigned char *base, const Q8Layout *L, Job *jobs) {
    int n = 0;
    jobs[n++] = import_job(src, R_EMBED, 0, sp, base, L->tok_q, L->tok_s);
    for (int w = W_Q; w <= W_3; w++)
        for (int l = 0; l < src->cfg.n_layers; l++) jobs[n++] = import_job(src, R_WQ + w, l, sp, base, L->q[w], L->s[w]);
    if (!sp->shared) jobs[n++] = import_job(src, R_CLS, 0, sp, base, L->cls_q, L->cls_s);
    return n;
}

// tokenizer: the tokenizer section (sp->tokenizer_bytes of it)
static size_t write_import(const char *path, const Source *src, const Q8Spec *sp, const unsigned char *tokenizer, Job *jobs,
                           int *n_jobs) {
    const Config *c = &src->cfg;
    Q8Layout L;
    q8_layout_spec(c, sp, &L);
    OutFile o = create_output(path, L.total);
    q8_header_spec(o.base, c, sp);
    copy_vectors(src, R_NORM_ATT, c->n_layers, (float *)(o.base + L.rms_att));
    copy_vectors(src, R_NORM_FFN, c->n_layers, (float *)(o.base + L.rms_ffn));
    copy_vectors(src, R_NORM_FINAL, 1, (float *)(o.base + L.rms_final));
    memcpy(o.base + L.rope, src->rope_freq, (size_t)c->head_dim / 2 * sizeof(float));
    for (int i = 0; i < 3 && c->qkv_bias; i++) copy_vectors(src, R_BQ + i, c->n_layers, (float *)(o.base + L.bias[i]));
    memcpy(o.base + L.tokenizer, tokenizer, sp->tokenizer_bytes);
    *n_jobs = import_jobs(src, sp, o.base, &L, jobs);
    run_jobs(jobs, *n_jobs);
    close_output(&o, path);
    return L.total;
}

// Hugging Face directories and GGUF files are imported; anything else is a llama2.c checkpoint.
static int is_import(const char *path) {
    struct stat st;
    unsigned char magic[4] = {0};
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return 1;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    return n == 4 && !memcmp(magic, GGUF_MAGIC, 4);
}

// ----------------------------------------------------------------------------
// Report: per tensor kind (all layers together) and overall.

static void report(const Job *jobs, int n_jobs, size_t in_bytes, size_t out_bytes) {
    const char *names[] = {"tok_embedding", "wq", "wk", "wv", "wo", "w1", "w2", "w3", "wcls"};
    double all_w = 0, all_err = 0, all_max = 0;
    size_t all_n = 0;
    printf("%-14s %12s %14s %14s\n", "tensor", "weights", "rms err/rms", "max err/rms");
    for (int k = 0; k < 9; k++) {
        double sw = 0, se = 0, mx = 0;
        size_t n = 0;
        for (int i = 0; i < n_jobs; i++)
            if (!strcmp(jobs[i].name, names[k])) {
                sw += jobs[i].sum_sq_w, se += jobs[i].sum_sq_err, n += (size_t)jobs[i].rows * jobs[i].cols;
                mx = jobs[i].max_err > mx ? jobs[i].max_err : mx;
            }
        if (!n) continue;
        double rms = sqrt(sw / n);
        printf("%-14s %12zu %14.3e %14.3e\n", names[k], n, rms > 0 ? sqrt(se / n) / rms : 0.0, rms > 0 ? mx / rms : 0.0);
        all_w += sw, all_err += se, all_n += n, all_max = mx > all_max ? mx : all_max;
    }
    double rms = sqrt(all_w / all_n);
    printf("%-14s %12zu %14.3e %14.3e\n", "all", all_n, rms > 0 ? sqrt(all_err / all_n) / rms : 0.0, rms > 0 ? all_max / rms : 0.0);
    printf("size: %zu bytes -> %zu bytes (%.2fx the input's size)\n", in_bytes, out_bytes, (double)out_bytes / in_bytes);
}

// ----------------------------------------------------------------------------
// CLI

static const struct { const char *name; Config c; int shared; } presets[] = {
    {"llama2-7b", LLAMA2C_CONFIG(4096, 11008, 32, 32, 32, 32000, 4096), 0},
    {"tinyllama-1.1b", LLAMA2C_CONFIG(2048, 5632, 22, 32, 4, 32000, 2048), 0},
    {"stories15m", LLAMA2C_CONFIG(288, 768, 6, 6, 6, 32000, 256), 1},
    {"stories110m", LLAMA2C_CONFIG(768, 2048, 12, 12, 12, 32000, 1024), 1},
    {"smollm2-135m", LLAMA2C_CONFIG(576, 1536, 30, 9, 3, 49152, 2048), 1},
    {"llama3-8b", LLAMA2C_CONFIG(4096, 14336, 32, 32, 8, 128256, 8192), 0},
};

// NAME is a preset or "dim,hidden,layers,heads,kv_heads,vocab,seq_len" (a negative vocab: an
// unshared classifier, as in llama2.c's header). 0, or -1 with the reason in err.
static int parse_shape(const char *name, Config *c, int *shared, char *err) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(name, presets[i].name)) {
            *c = presets[i].c;
            *shared = presets[i].shared;
            config_defaults(c);
            return 0;
        }
    int v[7], used = 0;
    if (sscanf(name, "%d,%d,%d,%d,%d,%d,%d%n", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &used) != 7 || name[used]) {
        snprintf(err, ERR_LEN, "--synthetic: \"%.100s\" is neither a preset (llama2-7b, tinyllama-1.1b, stories15m, "
                               "stories110m, smollm2-135m, llama3-8b) nor dim,hidden,layers,heads,kv_heads,vocab,seq_len", name);
        return -1;
    }
    *c = (Config)LLAMA2C_CONFIG(v[0], v[1], v[2], v[3], v[4], v[5] == INT_MIN ? 0 : v[5] < 0 ? -v[5] : v[5], v[6]);
    *shared = v[5] > 0;
    char why[ERR_LEN];
    config_defaults(c);
    if (validate_config(c, why)) {
        snprintf(err, ERR_LEN, "--synthetic %.100s: %.380s", name, why);
        return -1;
    }
    return 0;
}

static int parse_int(const char *flag, const char *s, int lo, int hi, int *out, char *err) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        snprintf(err, ERR_LEN, "%s expects an integer in [%d, %d], got \"%.100s\"", flag, lo, hi, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

typedef struct {
    const char *in, *out;     // in: NULL for --synthetic
    const char *synthetic;    // the shape's name as given
    Config cfg;               // --synthetic: the shape
    int shared, gs, fp32, seed;
    int gs_given;             // -g was given (else a GGUF of Q8_0 imports with its own groups of 32)
} QuantizeArgs;

#define ARGS_USAGE -2   // parse_quantize_args: not understood; the usage text on stderr, exit 1
#define ARGS_HELP  -3   // --help or -h: the usage text on stdout, exit 0

// 0, or -1 (a bad value: the reason in err), ARGS_USAGE (err says what was not understood) or
// ARGS_HELP. Never prints or exits (the fuzzer calls it): main acts on the code.
static int parse_quantize_args(int argc, char **argv, QuantizeArgs *a, char *err) {
    const char *pos[2] = {NULL, NULL};
    int n_pos = 0;
    *a = (QuantizeArgs){NULL, NULL, NULL, {0}, 0, 128, 0, 1234, 0};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            snprintf(err, ERR_LEN, "%s: the usage was asked for", f);   // a non-zero return says why
            return ARGS_HELP;
        } else if (!strcmp(f, "--fp32")) a->fp32 = 1;
        else if (!strcmp(f, "-g") && v) rc = parse_int(f, argv[++i], 1, 1 << 20, &a->gs, err), a->gs_given = 1;
        else if (!strcmp(f, "--seed") && v) rc = parse_int(f, argv[++i], 0, 1 << 30, &a->seed, err);
        else if (!strcmp(f, "--synthetic") && v) a->synthetic = argv[++i];
        else if (f[0] == '-' || n_pos == 2) {
            snprintf(err, ERR_LEN, "\"%.100s\" is not understood here", f);
            return ARGS_USAGE;
        } else pos[n_pos++] = f;
        if (rc) return rc;
    }
    if (n_pos != (a->synthetic ? 1 : 2)) {
        snprintf(err, ERR_LEN, "%s expected, %d given", a->synthetic ? "one output file" : "an input and an output file", n_pos);
        return ARGS_USAGE;
    }
    if (a->synthetic) {
        a->out = pos[0];
        return parse_shape(a->synthetic, &a->cfg, &a->shared, err);
    }
    a->in = pos[0], a->out = pos[1];
    return 0;
}

#ifndef QUANTIZE_NO_MAIN
static void print_usage(FILE *to) {
    fprintf(to, "Usage: quantize in.bin out.bin [-g GS]\n"
                "       quantize <hugging-face-dir | model.gguf> out.bin [-g GS] [--fp32]\n"
                "       quantize --synthetic NAME out.bin [--fp32] [-g GS] [--seed S]\n"
                "       quantize --help\n"
                "  GS: group size along the input dimension (default 128; a GGUF whose weights are all Q8_0:\n"
                "      32, its own groups and scales, without loss)\n"
                "  --fp32: the imported model with FP32 weights (the unquantized reference)\n"
                "  NAME: llama2-7b | tinyllama-1.1b | stories15m | stories110m | smollm2-135m | llama3-8b |\n"
                "        dim,hidden,layers,heads,kv_heads,vocab,seq_len\n"
                "  out.bin is replaced only when complete, and only if it is a regular file or missing and not\n"
                "  in.bin; a symbolic link is written through to its target\n");
}

// target: a->out checked and resolved (check_output)
static int write_synthetic(const QuantizeArgs *a, const char *target) {
    unsigned long long seed = (unsigned long long)a->seed << 20;
    if (a->fp32) {
        write_fp32_synthetic(target, &a->cfg, a->shared, seed);
    } else {
        Job *jobs = calloc(2 + 7 * (size_t)a->cfg.n_layers, sizeof(Job));
        int n_jobs;
        if (!jobs) die("out of memory");
        write_q8(target, &a->cfg, a->gs, a->shared, NULL, seed, jobs, &n_jobs);
        free(jobs);
    }
    fprintf(stderr, "quantize: wrote %s (%s, seed %d, %s)\n", a->out, a->synthetic, a->seed, a->fp32 ? "FP32 llama2.c v0" : "INT8 Q8LM");
    return 0;
}

// Is every linear weight (and the embedding) of this GGUF stored as Q8_0?
static int all_q8_0(const Source *src) {
    if (!src->is_gguf) return 0;
    for (Role r = R_EMBED; r <= R_CLS; r++) {
        if (r >= R_NORM_ATT && r <= R_NORM_FINAL) continue;
        if (r == R_CLS && src->shared_classifier) continue;
        for (int l = 0; l < (r >= R_WQ && r <= R_W3 ? src->cfg.n_layers : 1); l++)
            if (!source_is_q8_0(src, r, l)) return 0;
    }
    return 1;
}

static int import(const QuantizeArgs *a, const char *target) {
    char err[ERR_LEN];
    Source src;
    if (source_open(&src, a->in, err)) die(err);
    unsigned char *tokenizer = NULL;
    size_t tokenizer_bytes = 0;
    TokInfo info;
    if (tokfile_from_source(&src, &tokenizer, &tokenizer_bytes, &info, err)) die(err);
    Q8Spec sp = {.version = 2, .gs = a->gs, .fp32 = a->fp32, .shared = src.shared_classifier, .tokenizer_bytes = tokenizer_bytes,
                 .bos_id = info.bos_id, .eos_id = info.eos_id, .eot_id = info.eot_id, .add_bos = info.add_bos, .chat_template = info.chat};
    if (!a->gs_given && !a->fp32 && all_q8_0(&src)) sp.gs = GGML_QK8_0;
    Job *jobs = calloc(2 + 7 * (size_t)src.cfg.n_layers, sizeof(Job));
    int n_jobs;
    if (!jobs) die("out of memory");
    size_t out_bytes = write_import(target, &src, &sp, tokenizer, jobs, &n_jobs);
    printf("%s (%s) -> %s (Q8LM v2, %s)\n", a->in, src.is_gguf ? "GGUF" : "Hugging Face", a->out,
           sp.fp32 ? "FP32" : sp.gs == GGML_QK8_0 && all_q8_0(&src) ? "INT8, Q8_0's groups of 32 kept" : "INT8");
    printf("tokenizer: chat format %s, bos %d, eos %d, end of turn %d\n", chat_name(info.chat),
           info.bos_id, info.eos_id, info.eot_id);
    if (!sp.fp32) report(jobs, n_jobs, source_bytes(&src), out_bytes);
    free(jobs);
    free(tokenizer);
    source_close(&src);
    return 0;
}

int main(int argc, char **argv) {
    QuantizeArgs a;
    char err[ERR_LEN], target[PATH_MAX];
    int rc = parse_quantize_args(argc, argv, &a, err);
    if (rc == ARGS_HELP) {
        print_usage(stdout);
        return 0;
    }
    if (rc == ARGS_USAGE) {
        fprintf(stderr, "quantize: %s\n", err);
        print_usage(stderr);
        return 1;
    }
    if (rc || check_output(a.in, a.out, target, err)) die(err);
    // over a file-size limit, writes fail with EFBIG (reported) instead of killing the process
    signal(SIGXFSZ, SIG_IGN);
    if (a.synthetic) return write_synthetic(&a, target);
    if (is_import(a.in)) return import(&a, target);
    if (a.fp32) die("--fp32 applies to --synthetic and to Hugging Face and GGUF inputs");
    Model m;
    if (load_model(a.in, &m, err)) die(err);
    if (m.quantized) {
        fprintf(stderr, "quantize: %s: already INT8 (%s); give an FP32 checkpoint\n", a.in, format_name(m.format));
        free_model(&m);
        return 1;
    }
    Job *jobs = calloc(2 + 7 * (size_t)m.cfg.n_layers, sizeof(Job));
    int n_jobs;
    if (!jobs) die("out of memory");
    write_q8(target, &m.cfg, a.gs, m.shared_classifier, &m.w, 0, jobs, &n_jobs);
    Q8Layout L;
    q8_layout(&m.cfg, a.gs, m.shared_classifier, &L);
    printf("%s (%s) -> %s (Q8LM, group size %d)\n", a.in, format_name(m.format), a.out, a.gs);
    report(jobs, n_jobs, m.map_bytes, L.total);
    free(jobs);
    free_model(&m);
    return 0;
}
#endif
