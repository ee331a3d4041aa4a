// run.c: generation with a Llama-2-style transformer of group-wise INT8 (or FP32) weights: the
// prompt prefilled in batches, then decoding (pipelined on the GPU when greedy), --batch (many
// sequences of one prompt, each linear layer one GEMM), perplexity, and the command line.
// The model, its executors and the tokenizer are in engine/ (README.md, "Architecture").
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <stddef.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "exec.h"
#include "model.h"
#include "pool.h"
#include "sampler.h"
#include "text.h"
#include "util.h"
#include "vec.h"   // vec_has_int8_act: --int8-prefill's message

// ----------------------------------------------------------------------------
// Sampling on the executor where it can

// Rows of logits sampled on the executor where it can, each row's coin drawn from its sampler as
// sample_host draws it (none for a row marked in skip, whose token is unused): 0, or -1 with the
// samplers untouched. The samplers share one temperature (> 0) and top-p.
static int sample_on_executor(Exec *e, Sampler *samplers, int rows, const int *skip, const float *logits, int *out) {
    float coins[MAX_SEQS] = {0};
    unsigned long long saved[MAX_SEQS];
    if (!e->ops->sample_rows || rows > MAX_SEQS) return -1;
    for (int r = 0; r < rows; r++) {
        saved[r] = samplers[r].rng_state;
        coins[r] = skip && skip[r] ? 0.0f : random_f32(&samplers[r].rng_state);
    }
    if (e->ops->sample_rows(e, logits, rows, samplers[0].temperature, samplers[0].topp, coins, out) == 0) return 0;
    for (int r = 0; r < rows; r++) samplers[r].rng_state = saved[r];
    return -1;
}

// Next token from one row of logits, on the executor where it can (greedy always).
static int sample(Sampler *s, Exec *e, const float *logits) {
    if (s->temperature == 0.0f) return e->ops->argmax(e, logits);
    int token;
    if (sample_on_executor(e, s, 1, NULL, logits, &token) == 0) return token;
    return sample_host(s, e->ops->to_host(e, logits, 1));
}

// ----------------------------------------------------------------------------
// Generation and perplexity

typedef struct {
    int prompt_tokens, generated;
    double prefill_s, decode_s;
    double kv_bytes;   // KV cache bytes the decode steps read (keys and values of every position)
} GenStats;

// KV cache bytes the attention of one token at position pos reads: keys and values of positions
// 0..pos in every layer.
static double kv_bytes_at(const Exec *e, int pos) { return 2.0 * e->cfg.n_layers * layer_rows_bytes(e, pos + 1); }

// Flushes stdout: 0, or -1 with the reason in err if it is gone (a closed pipe).
static int flush_stdout(char *err) {
    if (fflush(stdout) == 0 && !ferror(stdout)) return 0;
    snprintf(err, ERR_LEN, "writing the output failed: %s", strerror(errno));
    return -1;
}

// Prints a piece of text, then flush_stdout.
static int emit(const char *piece, char *err) {
    fputs(piece, stdout);
    return flush_stdout(err);
}

// Runs tokens[0..n) at positions pos.. in chunks of MAX_TOKENS; returns the last token's logits.
static const float *prefill(Exec *e, const int *tokens, int n, int pos) {
    const float *logits = NULL;
    for (int done = 0; done < n; done += MAX_TOKENS) {
        int M = n - done < MAX_TOKENS ? n - done : MAX_TOKENS;
        logits = forward(e, tokens + done, M, pos + done, 0);
    }
    return logits;
}

// Prints each token of a decode as it comes (text.h's stream).
typedef struct {
    TextStream ts;
    char *err;
    int last;    // the last token generated (an end-of-turn token is not printed, but kept)
} Printer;

static int print_token(void *ctx, int token) {
    Printer *p = ctx;
    p->last = token;
    return emit(text_stream_next(&p->ts, token), p->err);
}

// Samples from logits (of position pos) on, one forward per token, until a token that ends the
// text (text_is_end: BOS for llama2.c's models, EOS or end of turn for others) or position steps.
// Returns the tokens generated, or -1 if printing failed.
static int decode_loop(Exec *e, Sampler *sampler, const float *logits, int pos, int steps, Printer *pr) {
    int generated = 0;
    while (pos < steps) {
        int next = sample(sampler, e, logits);
        pos++;
        generated++;
        pr->last = next;
        if (text_is_end(pr->ts.t, next)) break;
        if (print_token(pr, next)) return -1;
        if (pos < steps) logits = forward(e, &next, 1, pos, 0);
    }
    return generated;
}

// The prompt's ids: 0, or -1 with err where it is empty with no BOS to start from, or too long.
static int prompt_ids(const Text *t, const char *prompt, int steps, int context, int **tokens, int *n, char *err) {
    if (text_encode(t, prompt, 1, tokens, n, err)) return -1;
    if (*n == 0) {
        if (t->bos_id < 0) {
            snprintf(err, ERR_LEN, "the prompt is empty and this model has no BOS token to begin with: give -p");
            return -1;
        }
        (*tokens)[(*n)++] = t->bos_id;
    }
    if (*n > context) {
        snprintf(err, ERR_LEN, "the prompt is %d tokens, longer than the model's context of %d", *n, context);
        return -1;
    }
    if (*n > steps) {
        snprintf(err, ERR_LEN, "the prompt is %d tokens but -n allows only %d positions", *n, steps);
        return -1;
    }
    return 0;
}

// Echoes the prompt's text: llama2.c's models from the token after BOS, others all of it (special
// tokens print nothing).
static int echo_prompt(Printer *pr, const int *tokens, int n) {
    const int from = pr->ts.t->tf.bpe ? 0 : 1;
    for (int i = from; i < n; i++)
        if (print_token(pr, tokens[i])) return -1;
    return 0;
}

// llama2.c's generate: `steps` positions in all, prompt included; stops early at BOS.
// The prompt is echoed as it is consumed.
static int generate(Exec *e, const Text *text, Sampler *sampler, const char *prompt, int steps, GenStats *st,
                    char *err) {
    int *tokens = NULL, n = 0;
    Printer pr = {.err = err};
    text_stream_init(&pr.ts, text, -1);
    if (prompt_ids(text, prompt, steps, e->cfg.seq_len, &tokens, &n, err)) goto fail;
    pr.ts.prev = tokens[0];
    long t0 = time_in_us();
    const float *logits = prefill(e, tokens, n, 0);
    e->ops->to_host(e, logits, 1);   // waits for the device: prefill time is complete
    long t1 = time_in_us();
    if (echo_prompt(&pr, tokens, n)) goto fail;
    int generated = NOT_PIPELINED;
    // the executor's pipelined loop stops at BOS only: llama2.c's models
    if (sampler->temperature == 0.0f && e->ops->decode_greedy && !text->tf.bpe)
        generated = e->ops->decode_greedy(e, logits, n - 1, steps, print_token, &pr);
    if (generated == NOT_PIPELINED) generated = decode_loop(e, sampler, logits, n - 1, steps, &pr);
    if (generated < 0 || emit(text_stream_flush(&pr.ts), err)) goto fail;
    double kv_bytes = 0;   // the decode steps ran at positions n .. n + generated - 2
    for (int pos = n; pos < n - 1 + generated; pos++) kv_bytes += kv_bytes_at(e, pos);
    if (emit("\n", err)) goto fail;
    *st = (GenStats){n, generated, (t1 - t0) / 1e6, (time_in_us() - t1) / 1e6, kv_bytes};
    free(tokens);
    text_stream_free(&pr.ts);
    return 0;
fail:
    free(tokens);
    text_stream_free(&pr.ts);
    return -1;
}

// --batch: B sequences from one prompt, each with its own sampler (seeds s, s + 1, ...) and KV
// cache, decoded together: a step is one forward of B tokens, so each linear layer is one M = B
// GEMM over weights read once. The prompt is prefilled once, into sequence 0's cache, whose rows
// are then copied to the others. Sequences that produce BOS stop (their slot keeps running, its
// output unused); each sequence's text is printed when all are done. st->generated counts the
// steps (tokens per sequence).
static int generate_batch(Exec *e, const Text *text, Sampler *samplers, int B, const char *prompt, int steps,
                          GenStats *st, char *err) {
    int *tokens = NULL, n = 0, V = e->cfg.vocab_size;
    int *out = xcalloc((size_t)B * (steps + 1), sizeof(int)), *next = xcalloc(B, sizeof(int));
    int *count = xcalloc(B, sizeof(int)), *stopped = xcalloc(B, sizeof(int));   // tokens so far; produced BOS
    int status = -1, step = 0;
    if (prompt_ids(text, prompt, steps, e->cfg.seq_len, &tokens, &n, err)) goto done;
    long t0 = time_in_us();
    const float *host = e->ops->to_host(e, prefill(e, tokens, n, 0), 1);
    e->ops->copy_cache(e, n);
    long t1 = time_in_us();
    int live = B, greedy = 1;   // greedy: every sequence takes the argmax, done where the logits are
    for (int b = 0; b < B; b++) next[b] = sample_host(&samplers[b], host);   // all from the prompt's last row
    for (int b = 0; b < B; b++) greedy = greedy && samplers[b].temperature == 0.0f;
    for (int pos = n; live > 0; pos++) {
        step++;
        for (int b = 0; b < B; b++) {
            if (stopped[b]) continue;
            if (text_is_end(text, next[b])) stopped[b] = 1, live--;
            else out[(size_t)b * (steps + 1) + count[b]++] = next[b];
        }
        if (live == 0 || pos >= steps) break;
        const float *logits = forward_batch(e, next, B, pos);   // a stopped slot runs its end token, unused
        if (greedy) {
            e->ops->argmax_rows(e, logits, B, next);
        } else if (sample_on_executor(e, samplers, B, stopped, logits, next)) {
            host = e->ops->to_host(e, logits, B);
            for (int b = 0; b < B; b++)
                if (!stopped[b]) next[b] = sample_host(&samplers[b], host + (size_t)b * V);
        }
        for (int b = 0; b < B; b++) next[b] = stopped[b] ? tokens[0] : next[b];
    }
    long t2 = time_in_us();
    for (int b = 0; b < B; b++) {
        const int *seq = out + (size_t)b * (steps + 1);
        printf("[sequence %d]\n", b);
        Printer pr = {.err = err};
        text_stream_init(&pr.ts, text, tokens[0]);
        int bad = echo_prompt(&pr, tokens, n);
        for (int i = 0; i < count[b] && !bad; i++) bad = print_token(&pr, seq[i]);
        bad = bad || emit(text_stream_flush(&pr.ts), err) || emit("\n", err);
        text_stream_free(&pr.ts);
        if (bad) goto done;
    }
    *st = (GenStats){n, step, (t1 - t0) / 1e6, (t2 - t1) / 1e6, 0};
    status = 0;
done:
    free(tokens), free(out), free(next), free(count), free(stopped);
    return status;
}

// ----------------------------------------------------------------------------
// Chat: one user turn per line of standard input, in the model's chat format; the KV cache is kept
// across turns, so only each new turn is prefilled. -n bounds the whole conversation's positions.

#define CHAT_LINE_BYTES (1 << 16)

// The ids of one turn: the last reply's end token (pending, unless -1), then the turn's text.
static int turn_ids(const Text *t, int chat, int first, const char *system, const char *line, int pending, int **ids, int *n,
                    char *err) {
    char *turn = xcalloc(2 * CHAT_LINE_BYTES, 1);
    int rc = text_chat_turn(chat, first, system, line, turn, 2 * CHAT_LINE_BYTES) < 0 ? -1 : 0;
    if (rc) snprintf(err, ERR_LEN, "a chat turn is too long (at most %d bytes)", CHAT_LINE_BYTES);
    int *text_ids = NULL, m = 0;
    if (!rc) rc = text_encode(t, turn, first, &text_ids, &m, err);
    free(turn);
    if (rc) return free(text_ids), -1;
    *ids = xcalloc(m + 1, sizeof(int));
    *n = 0;
    if (pending >= 0) (*ids)[(*n)++] = pending;
    memcpy(*ids + *n, text_ids, m * sizeof(int));
    *n += m;
    free(text_ids);
    return 0;
}

// Reads one line of standard input without its line ending: 1, or 0 at the end of input.
static int read_turn(char *line) {
    if (isatty(STDIN_FILENO)) fputs("User: ", stdout), fflush(stdout);
    if (!fgets(line, CHAT_LINE_BYTES, stdin)) return 0;
    line[strcspn(line, "\r\n")] = '\0';
    return 1;
}

// The reply to a turn prefilled up to position pos - 1: streamed, ended by the model's end token
// (returned in *pending, to be run before the next turn) or by -n. Returns the next free position,
// or -1 if printing failed.
static int reply(Exec *e, const Text *t, Sampler *s, const float *logits, int pos, int steps, int *pending, char *err) {
    Printer pr = {.err = err, .last = -1};
    text_stream_init(&pr.ts, t, -1);
    int rc = emit("Assistant: ", err);
    const int generated = rc ? -1 : decode_loop(e, s, logits, pos - 1, steps, &pr);
    rc = generated < 0 || emit(text_stream_flush(&pr.ts), err) || emit("\n", err);
    text_stream_free(&pr.ts);
    *pending = generated > 0 && text_is_end(t, pr.last) ? pr.last : -1;
    return rc ? -1 : pos - 1 + generated;
}

// kind: CHAT_* (the checkpoint's or --template's); system: -y, else the template's own (or NULL).
static int chat(Exec *e, const Text *t, Sampler *s, int kind, const char *system, int steps, char *err) {
    if (!t->tf.bpe) {
        snprintf(err, ERR_LEN, "-m chat needs a checkpoint that carries its tokenizer: import the model with ./quantize");
        return -1;
    }
    if (kind <= CHAT_NONE) {
        snprintf(err, ERR_LEN, "the checkpoint has no chat format this engine knows: choose one with --template (chatml, llama3, "
                               "llama2, mistral)");
        return -1;
    }
    if (!system) system = t->tf.default_system;
    char *line = xcalloc(CHAT_LINE_BYTES, 1);
    int pos = 0, pending = -1, status = 0;
    for (int first = 1; status == 0 && read_turn(line); ) {
        if (!line[0]) continue;
        int *ids = NULL, n = 0;
        if (turn_ids(t, kind, first, system, line, pending, &ids, &n, err)) status = -1;
        else if (pos + n >= steps) {
            fprintf(stderr, "run: the conversation has reached %d of its %d positions (-n); it ends here\n", pos, steps);
            free(ids);
            break;
        } else {
            const float *logits = prefill(e, ids, n, pos);
            pos = reply(e, t, s, logits, pos + n, steps, &pending, err);
            status = pos < 0 ? -1 : 0;
            if (status == 0 && pending < 0) {   // the reply ran into -n: no room for another turn
                fprintf(stderr, "run: the conversation has reached its %d positions (-n); it ends here\n", steps);
                free(ids);
                break;
            }
        }
        free(ids);
        first = 0;
    }
    free(line);
    return status;
}

// Negative log-likelihood (natural log) of `target` under one row of logits, in double.
static double nll(const float *logits, int n, int target) {
    double max = logits[0], sum = 0.0;
    for (int i = 1; i < n; i++) max = logits[i] > max ? logits[i] : max;
    for (int i = 0; i < n; i++) sum += exp(logits[i] - max);
    return log(sum) + max - logits[target];
}

// Teacher-forced perplexity of a text: the token stream (BOS first) is cut into windows of the
// context; each window starts at position 0 with the last token of the one before, so every token
// after the first is predicted exactly once. Returns exp(mean NLL).
static int perplexity(Exec *e, const Text *tok, const char *text, double *ppl, int *n_predicted, char *err) {
    int V = e->cfg.vocab_size, window = e->cfg.seq_len;
    if (window < 2) {
        snprintf(err, ERR_LEN, "a context of %d position cannot predict anything", window);
        return -1;
    }
    int *tokens = NULL, n = 0;
    if (text_encode(tok, text, 1, &tokens, &n, err)) {
        free(tokens);
        return -1;
    }
    if (n < 2) {
        snprintf(err, ERR_LEN, "the text is too short: it gives %d tokens, perplexity needs 2", n);
        free(tokens);
        return -1;
    }
    double total = 0.0;
    for (int start = 0; start + 1 < n; start += window - 1) {
        int len = n - start < window ? n - start : window;
        for (int done = 0; done < len; done += MAX_TOKENS) {
            int M = len - done < MAX_TOKENS ? len - done : MAX_TOKENS;
            const float *logits = e->ops->to_host(e, forward(e, tokens + start + done, M, done, 1), M);
            for (int m = 0; m < M; m++)
                if (done + m + 1 < len) total += nll(logits + (size_t)m * V, V, tokens[start + done + m + 1]);
        }
    }
    *n_predicted = n - 1;
    *ppl = exp(total / (n - 1));
    free(tokens);
    return 0;
}

// ----------------------------------------------------------------------------
// CLI

// Everything the command line sets, parsed without side effects (the fuzzer calls this).
typedef struct {
    const char *checkpoint, *prompt, *tokenizer, *ppl_file, *device;
    const char *mode;            // "generate" or "chat" (-m)
    const char *system_prompt;   // -y: chat's system prompt
    const char *chat_template;   // --template: chat format by name (else the checkpoint's)
    const char *tokenize_file;   // --tokenize: print the ids of this file's text and exit
    float temperature, topp;
    long steps, seed, batch;   // seed 0: the time
    long threads;              // CPU threads (0: the CPUs this process may use)
    int int8_prefill;          // --int8-prefill: CPU prompts of INT8 models on int8 x int8
    GpuOptions gpu;
} CliArgs;

#define CLI_USAGE -2   // parse_cli: not a usable command line; print the usage text
#define CLI_HELP -3    // parse_cli: -h or --help; print the usage text on stdout

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out, char *err) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        snprintf(err, ERR_LEN, "%s expects an integer in [%ld, %ld], got \"%.100s\"", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *flag, const char *s, float lo, float hi, float *out, char *err) {
    char *end;
    float v = strtof(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) {
        snprintf(err, ERR_LEN, "%s expects a number in [%g, %g], got \"%.100s\"", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

// The switches: each sets one field of the GPU options to a value.
typedef struct {
    const char *flag;
    size_t field;   // offsetof(GpuOptions, ...)
    int value;
} Switch;
static const Switch switches[] = {
    {"--unfused", offsetof(GpuOptions, path), PATH_UNFUSED},     {"--fp16", offsetof(GpuOptions, path), PATH_FP16},
    {"--no-graph", offsetof(GpuOptions, use_graph), 0},          {"--kv-fp32", offsetof(GpuOptions, kv_half), 0},
    {"--no-pdl", offsetof(GpuOptions, pdl), 0},                  {"--pdl", offsetof(GpuOptions, pdl), 1},
    {"--tma-gemv", offsetof(GpuOptions, tma_gemv), 1},           {"--no-tma-gemv", offsetof(GpuOptions, tma_gemv), 0},
    {"--no-tc", offsetof(GpuOptions, tensor_cores), 0},          {"--no-norm-fold", offsetof(GpuOptions, no_norm_fold), 1},
    {"--host-sample", offsetof(GpuOptions, host_sample), 1},     {"--megakernel", offsetof(GpuOptions, megakernel), 1},
    {"--no-megakernel", offsetof(GpuOptions, megakernel), 0},    {"--cluster-step", offsetof(GpuOptions, cluster_step), 1},
    {"--no-cluster-step", offsetof(GpuOptions, cluster_step), 0},
};

static int set_switch(GpuOptions *o, const char *f) {
    for (size_t i = 0; i < sizeof switches / sizeof switches[0]; i++)
        if (!strcmp(f, switches[i].flag)) {
            int *field = (int *)((char *)o + switches[i].field);
            *field = switches[i].value;
            return 1;
        }
    return 0;
}

// One option with a value; 0, -1 (a bad value) or CLI_USAGE (not an option).
static int set_option(CliArgs *a, const char *f, const char *v, char *err) {
    if (!strcmp(f, "-p") || !strcmp(f, "-i")) a->prompt = v;
    else if (!strcmp(f, "-n")) return parse_long(f, v, 0, INT_MAX, &a->steps, err);
    else if (!strcmp(f, "-t")) return parse_float(f, v, 0.0f, FLT_MAX, &a->temperature, err);
    else if (!strcmp(f, "--top-p")) return parse_float(f, v, 0.0f, 1.0f, &a->topp, err);
    else if (!strcmp(f, "-s")) return parse_long(f, v, 0, LONG_MAX, &a->seed, err);
    else if (!strcmp(f, "--batch")) return parse_long(f, v, 1, MAX_SEQS, &a->batch, err);
    else if (!strcmp(f, "--threads")) return parse_long(f, v, 1, 256, &a->threads, err);
    else if (!strcmp(f, "-z")) a->tokenizer = v;
    else if (!strcmp(f, "--ppl")) a->ppl_file = v;
    else if (!strcmp(f, "--device")) a->device = v;
    else if (!strcmp(f, "-m")) a->mode = v;
    else if (!strcmp(f, "-y")) a->system_prompt = v;
    else if (!strcmp(f, "--template")) a->chat_template = v;
    else if (!strcmp(f, "--tokenize")) a->tokenize_file = v;
    else {
        snprintf(err, ERR_LEN, "unknown option \"%.100s\"", f);
        return CLI_USAGE;
    }
    return 0;
}

// 0, CLI_HELP (-h or --help anywhere), -1 (a bad value: the reason in err) or CLI_USAGE (err says
// what was not understood).
static int parse_cli(int argc, char **argv, CliArgs *a, char *err) {
    *a = (CliArgs){.prompt = "", .device = "gpu", .mode = "generate", .temperature = 1.0f, .topp = 0.9f, .steps = 256, .batch = 1, .gpu = GPU_DEFAULTS};
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            snprintf(err, ERR_LEN, "%s asks for the usage", argv[i]);
            return CLI_HELP;
        }
    if (argc < 2 || argv[1][0] == '-') {
        snprintf(err, ERR_LEN, "the first argument must be the checkpoint");
        return CLI_USAGE;
    }
    a->checkpoint = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (set_switch(&a->gpu, f)) continue;
        if (!strcmp(f, "--int8-prefill")) {
            a->int8_prefill = 1;
            continue;
        }
        if (!v) {
            snprintf(err, ERR_LEN, "option \"%.100s\" is unknown or lacks its value", f);
            return CLI_USAGE;
        }
        const int rc = set_option(a, f, v, err);
        if (rc) return rc;
        i++;
    }
    if (a->batch > 1 && a->ppl_file) {
        snprintf(err, ERR_LEN, "--batch generates; it does not apply to --ppl");
        return -1;
    }
    if (strcmp(a->mode, "generate") && strcmp(a->mode, "chat")) {
        snprintf(err, ERR_LEN, "-m expects generate or chat, got \"%.100s\"", a->mode);
        return -1;
    }
    if (a->chat_template && chat_from_name(a->chat_template) <= CHAT_NONE) {
        snprintf(err, ERR_LEN, "--template \"%.60s\" is not one of chatml, llama3, llama2, mistral", a->chat_template);
        return -1;
    }
    if (!strcmp(a->mode, "chat") && (a->batch > 1 || a->ppl_file)) {
        snprintf(err, ERR_LEN, "-m chat does not combine with --batch or --ppl");
        return -1;
    }
    if (strcmp(a->device, "cpu") && strcmp(a->device, "gpu")) {
        snprintf(err, ERR_LEN, "--device expects cpu or gpu, got \"%.100s\"", a->device);
        return -1;
    }
    return 0;
}

#ifndef RUN_NO_MAIN
static const char usage_text[] =
    "Usage:   run <checkpoint> [options]\n"
    "Example: run models/stories260K_q8.bin -z models/tok512.bin -p \"Once upon a time\"\n"
    "Options:\n"
    "  -p, -i <string>  prompt (default: empty)\n"
    "  -n <int>         positions to run, prompt included (default 256; 0 = the context length)\n"
    "  -t <float>       temperature in [0, inf) (default 1.0; 0 = greedy)\n"
    "  --top-p <float>  top-p (nucleus) sampling in [0, 1] (default 0.9; 0 or 1 = off)\n"
    "  -s <int>         random seed (default: time)\n"
    "  -z <string>      tokenizer for llama2.c checkpoints (default: tokenizer.bin beside the binary;\n"
    "                   imported models carry their own)\n"
    "  -m <string>      mode: generate (default) or chat: one user turn per line of standard input\n"
    "  -y <string>      chat: the system prompt (default: the model's own, if its template has one)\n"
    "  --template <string>  chat format: chatml, llama3, llama2 or mistral (default: the model's)\n"
    "  --tokenize <file>    print the ids of the file's text, as the model sees it as a prompt\n"
    "  --batch <int>    decode this many sequences (1 to 64) from the prompt together, seeds s, s+1, ...\n"
    "  --ppl <file>     print the perplexity of the text in <file> instead of generating\n"
    "  --device cpu|gpu where to run (default gpu; without a usable GPU: a message, then the CPU)\n"
    "  --threads <int>  CPU: threads (1 to 256; default: the CPUs this process may use)\n"
    "  --int8-prefill   CPU: prompts of INT8 models multiply int8 by int8, the activations quantized\n"
    "                   per 32 (AVX512-VNNI CPUs): faster, less exact (default: FP32 activations)\n"
    "  --unfused        GPU: separate dequant kernel + cuBLAS instead of the fused kernels\n"
    "  --fp16           GPU: weights converted to FP16 at load, cuBLAS (the unquantized baseline)\n"
    "  --kv-fp32        GPU: FP32 KV cache (default FP16)\n"
    "  --no-graph       GPU: launch every kernel from the host instead of replaying a CUDA graph\n"
    "  --no-tc          GPU: batches of tokens on the SIMT kernel instead of the tensor cores\n"
    "  --pdl, --no-pdl  GPU: programmatic dependent launch (a kernel starts while the last drains)\n"
    "                   on or off (default: on under 1 GB of weights per token, and with the\n"
    "                   copy-engine GEMV)\n"
    "  --tma-gemv, --no-tma-gemv  GPU: decode GEMVs fed by the copy engine (H100/H200) on or off\n"
    "                   (default: on from 4 GB of weights per token)\n"
    "  --no-norm-fold   GPU: every RMSNorm as a kernel of its own, not folded into the next GEMV\n"
    "  --host-sample    GPU: draw sampled tokens on the host (the logits cross to it), not the GPU\n"
    "  --megakernel, --no-megakernel  GPU: a decode step of an INT8 model as one persistent kernel\n"
    "                   (H100/H200) or a kernel per matrix (default: one kernel from 70 MB of weights;\n"
    "                   it keeps a second copy of the weights on the GPU, in the order it reads them)\n"
    "  --cluster-step, --no-cluster-step  GPU: a small INT8 model's decode step with its layers on\n"
    "                   one cluster of 16 SMs and its classifier on the others (H100/H200;\n"
    "                   default: on where the model fits it; up to 512 positions, then the other\n"
    "                   path; it keeps a second copy of the weights on the GPU)\n"
    "  -h, --help       this text\n";

static void usage(const char *why) {
    fprintf(stderr, "run: %s\n%s", why, usage_text);
    exit(1);
}

static void die(const char *msg) {
    fprintf(stderr, "run: %s\n", msg);
    exit(1);
}

// tokenizer.bin in the directory of the running binary
static void default_tokenizer(char *path, size_t n, const char *argv0) {
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) exe[len] = '\0';
    else snprintf(exe, sizeof exe, "%s", argv0);
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    snprintf(path, n, "%s/tokenizer.bin", slash ? exe : ".");
}

// "; linear kernels: ..." where the executor says what it ran.
static void print_run(const Exec *e) {
    char what[300];
    e->ops->describe_run(e, what, sizeof what);
    fprintf(stderr, "%s%s\n", what[0] ? "; " : "", what);
}

static void print_stats(const GenStats *st, const Model *model, const Exec *e, const CliArgs *a, const char *path_name) {
    int decoded = st->generated > 0 ? st->generated - 1 : 0;   // the first sample came from prefill
    double tps = st->decode_s > 0 ? decoded / st->decode_s : 0.0;
    double gb_w = weight_bytes_per_token(model, !strcmp(a->device, "gpu") && a->gpu.path == PATH_FP16) / 1e9;
    double gb_kv = decoded > 0 ? st->kv_bytes / decoded / 1e9 : 0.0;
    fprintf(stderr,
            "prompt %d tokens, generated %d; prefill %.1f tok/s, decode %.1f tok/s; weights %.3f GB/token, "
            "KV cache %.3f GB/token (FP%d), %.1f GB/s effective; device %s, path %s, %s",
            st->prompt_tokens, st->generated, st->prefill_s > 0 ? st->prompt_tokens / st->prefill_s : 0.0, tps, gb_w, gb_kv,
            8 * e->kv_bytes, (gb_w + gb_kv) * tps, a->device, path_name, format_name(model->format));
    print_run(e);
}

static void print_batch_stats(const GenStats *st, int B, const Exec *e, const CliArgs *a, const char *path_name) {
    int steps = st->generated > 0 ? st->generated - 1 : 0;   // decode steps after the prefill's sample
    double per_seq = st->decode_s > 0 ? steps / st->decode_s : 0.0;
    fprintf(stderr, "batch %d: prompt %d tokens, %d steps; prefill %.1f tok/s; decode %.1f tok/s aggregate, %.1f tok/s "
                    "per sequence; device %s, path %s",
            B, st->prompt_tokens, st->generated, st->prefill_s > 0 ? st->prompt_tokens / st->prefill_s : 0.0, B * per_seq,
            per_seq, a->device, path_name);
    print_run(e);
}

// The executor --device asks for: the GPU, or the CPU (also where no GPU is usable, with a
// message). Returns the path's description.
static const char *make_executor(Exec *exec, const Model *model, CliArgs *a) {
    char err[ERR_LEN];
    if (!strcmp(a->device, "gpu")) {
        const int rc = gpu_exec_init(exec, model, a->gpu, err);
        if (rc == GPU_TOO_SMALL) die(err);
        if (rc == 0) {
            if (a->int8_prefill) fprintf(stderr, "run: --int8-prefill applies to the CPU only; ignored on the GPU\n");
            return exec->desc;
        }
        fprintf(stderr, "run: no usable GPU (%s); running on the CPU\n", err);
        a->device = "cpu";
    }
    if (a->gpu.path != PATH_FUSED) fprintf(stderr, "run: --unfused and --fp16 apply to the GPU only; ignored on the CPU\n");
    pool_init((int)a->threads);
    cpu_exec_init(exec, model, a->gpu.n_seqs > 0 ? a->gpu.n_seqs : 1, a->gpu.context);
    cpu_exec_int8_prefill(exec, a->int8_prefill);
    if (a->int8_prefill && !model->quantized) fprintf(stderr, "run: --int8-prefill applies to INT8 models; %s is FP32\n", a->checkpoint);
    else if (a->int8_prefill && !vec_has_int8_act()) fprintf(stderr, "run: --int8-prefill: this CPU has no AVX512-VNNI; prompts keep FP32 activations\n");
    return model->quantized ? "int8" : "fp32";
}

static int run_perplexity(Exec *exec, const Text *tok, const CliArgs *a, const char *path_name) {
    char err[ERR_LEN];
    size_t bytes;
    double ppl;
    int n_pred, status = 0;
    char *text = read_file(a->ppl_file, (size_t)64 << 20, &bytes, err);
    if (!text || perplexity(exec, tok, text, &ppl, &n_pred, err)) {
        fprintf(stderr, "run: %s\n", err);
        status = 1;
    } else {
        printf("perplexity %.4f over %d predicted tokens (%s, %s %s)\n", ppl, n_pred, a->ppl_file, a->device, path_name);
        if (flush_stdout(err)) fprintf(stderr, "run: %s\n", err), status = 1;
    }
    free(text);
    return status;
}

static int run_generation(Exec *exec, const Text *tok, const Model *model, const CliArgs *a, const char *path_name) {
    char err[ERR_LEN];
    const int B = (int)a->batch;
    Sampler *samplers = xcalloc(B, sizeof(Sampler));
    const unsigned long long seed = a->seed > 0 ? (unsigned long long)a->seed : (unsigned long long)time(NULL);
    for (int b = 0; b < B; b++) build_sampler(&samplers[b], model->cfg.vocab_size, a->temperature, a->topp, seed + b);
    GenStats st;
    const int is_chat = !strcmp(a->mode, "chat");
    const int kind = a->chat_template ? chat_from_name(a->chat_template) : tok->chat;
    const int rc = is_chat ? chat(exec, tok, samplers, kind, a->system_prompt, (int)a->steps, err)
                   : B > 1 ? generate_batch(exec, tok, samplers, B, a->prompt, (int)a->steps, &st, err)
                           : generate(exec, tok, samplers, a->prompt, (int)a->steps, &st, err);
    if (rc) fprintf(stderr, "run: %s\n", err);
    else if (is_chat) ;
    else if (B > 1) print_batch_stats(&st, B, exec, a, path_name);
    else print_stats(&st, model, exec, a, path_name);
    for (int b = 0; b < B; b++) free_sampler(&samplers[b]);
    free(samplers);
    return rc ? 1 : 0;
}

// --tokenize: the ids of a file's text as a prompt, on one line.
static int run_tokenize(const Text *t, const char *path) {
    char err[ERR_LEN];
    size_t bytes;
    int *ids = NULL, n = 0;
    char *text = read_file(path, (size_t)256 << 20, &bytes, err);
    if (!text || text_encode(t, text, 1, &ids, &n, err)) {
        fprintf(stderr, "run: %s\n", err);
        free(text);
        return 1;
    }
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids), free(text);
    if (flush_stdout(err)) return fprintf(stderr, "run: %s\n", err), 1;
    return 0;
}

// The model's tokenizer: its own (Q8LM v2 imports), else -z or tokenizer.bin beside the binary.
static void open_text(Text *t, const Model *m, const CliArgs *a, const char *argv0) {
    char path[4200], err[ERR_LEN];
    if (m->tokenizer && a->tokenizer) die("the checkpoint carries its own tokenizer; -z is for llama2.c checkpoints");
    if (a->tokenizer) snprintf(path, sizeof path, "%s", a->tokenizer);
    else default_tokenizer(path, sizeof path, argv0);
    if (text_open(t, m, path, err)) die(err);
}

int main(int argc, char **argv) {
    CliArgs a;
    char err[ERR_LEN];
    int rc = parse_cli(argc, argv, &a, err);
    if (rc == CLI_HELP) return fputs(usage_text, stdout) == EOF || fflush(stdout) ? 1 : 0;
    if (rc == CLI_USAGE) usage(err);
    if (rc) die(err);
    signal(SIGPIPE, SIG_IGN);   // a closed stdout becomes a write error with a message, not a kill
    // the CPU executor reads the file into memory of its own (its weights stream faster from huge
    // pages); the GPU uploads it from the mapping (make_executor says why a GPU run falls back)
    const int on_cpu = !a.tokenize_file && (!strcmp(a.device, "cpu") || gpu_usable(err) != 0);
    Model model;
    if (load_model_as(a.checkpoint, &model, on_cpu ? LOAD_RESIDENT : LOAD_MAPPED, err)) die(err);
    Text tok;
    open_text(&tok, &model, &a, argv[0]);
    if (a.tokenize_file) {
        const int status = run_tokenize(&tok, a.tokenize_file);
        text_close(&tok), free_model(&model);
        return status;
    }
    if (a.steps > model.cfg.seq_len) {
        snprintf(err, ERR_LEN, "-n %ld is beyond the context of %s (seq_len %d)", a.steps, a.checkpoint, model.cfg.seq_len);
        die(err);
    }
    if (a.steps == 0) a.steps = model.cfg.seq_len;
    if (a.batch > 1) a.gpu.n_seqs = (int)a.batch, a.gpu.context = (int)a.steps;   // caches only as long as -n
    // models of long contexts (imports: 8k to 128k positions) get a KV cache as long as -n
    if (!a.ppl_file && model.cfg.seq_len > 4096) a.gpu.context = (int)a.steps;
    Exec exec;
    const char *path_name = make_executor(&exec, &model, &a);
    const int status = a.ppl_file ? run_perplexity(&exec, &tok, &a, path_name) : run_generation(&exec, &tok, &model, &a, path_name);
    exec.ops->release(&exec);
    text_close(&tok);
    free_model(&model);
    return status;
}
#endif
