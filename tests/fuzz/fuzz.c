// fuzz.c: libFuzzer targets for every parser of untrusted input, built with clang under
// AddressSanitizer and UBSan against the engine's own sources (run.c and quantize.c are included
// with their main() left out). One file, one target per build: -DFUZZ_<NAME>.
//
//   FUZZ_MODEL           load_model on arbitrary bytes (llama2.c v0/v1/v2, Q8LM); a model that
//                        loads is then run for two tokens on the CPU executor
//   FUZZ_TOKENIZER       build_tokenizer on arbitrary bytes for a vocabulary size taken from the
//                        input; a tokenizer that loads encodes a text and decodes every piece
//   FUZZ_ENCODE          encode() of arbitrary bytes (invalid UTF-8, embedded NULs, long input)
//                        with the real 32000-token tokenizer, then decode of every token
//   FUZZ_RUN_ARGS        run's command-line parsing
//   FUZZ_QUANTIZE_ARGS   quantize's command-line parsing, including --synthetic shapes
//
// The contract under test: every input either succeeds or fails with a message, never a crash,
// an out-of-bounds access, undefined behaviour or an exit.
#define _GNU_SOURCE
#if defined(FUZZ_ENCODE)
#define REPLAY_INIT LLVMFuzzerInitialize   // the replay loads the tokenizer first too
#endif
#include "harness.h"   // bytes_as_file; main for -DFUZZ_REPLAY
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(FUZZ_QUANTIZE_ARGS)
#define QUANTIZE_NO_MAIN
#define PROGRAM "quantize"
#include "../../quantize.c"
#else
#define PROGRAM "run"
#define RUN_NO_MAIN
#include "../../run.c"
#include "../ref_encode.h"
#endif

// A failure must say which file it was about.
static void expect_message(const char *err, const char *path) {
    if (!err[0] || !strstr(err, path)) {
        fprintf(stderr, "error message \"%s\" does not name %s\n", err, path);
        abort();
    }
}

// argv from the input: NUL-separated arguments after a fixed program name (at most 32).
static int split_args(const uint8_t *data, size_t size, char *buf, char **argv, const char *prog) {
    int argc = 0;
    argv[argc++] = (char *)prog;
    memcpy(buf, data, size);
    buf[size] = '\0';
    for (char *p = buf; p <= buf + size && argc < 32; p += strlen(p) + 1) argv[argc++] = p;
    argv[argc] = NULL;
    return argc;
}

#if defined(FUZZ_MODEL)
// Small models only: the forward's cost and the KV cache grow with the header's dimensions.
static int small_enough(const Config *c) {
    double cache = (double)c->n_layers * c->seq_len * c->dim, acts = (double)MAX_TOKENS * (c->vocab_size + c->hidden_dim + c->dim);
    return cache < 1e6 && acts < 3.2e7 && (double)c->n_layers * c->dim * c->hidden_dim < 1e7;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64], err[ERR_LEN] = "";
    int fd = bytes_as_file(data, size, path);
    Model m;
    if (load_model(path, &m, err) == 0) {
        if (small_enough(&m.cfg)) {
            Exec e;
            cpu_exec_init(&e, &m, 1, 0);
            int tokens[2] = {BOS, m.cfg.vocab_size - 1};
            forward(&e, tokens, 1, 0, 0);
            if (m.cfg.seq_len > 1) forward(&e, tokens + 1, 1, 1, 0);
            e.ops->release(&e);
        }
        free_model(&m);
    } else {
        expect_message(err, path);
    }
    close(fd);
    return 0;
}

#elif defined(FUZZ_TOKENIZER)
// Input: a 2-byte vocabulary size (1..4096), then the tokenizer file.
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int vocab = 1 + (data[0] | data[1] << 8) % 4096;
    char path[64], err[ERR_LEN] = "";
    int fd = bytes_as_file(data + 2, size - 2, path);
    Tokenizer t;
    if (build_tokenizer(&t, path, vocab, err) == 0) {
        int tokens[64], n = 0;
        if (encode(&t, "Once upon a time \xe2\x9c\x93 \xff", 1, tokens, &n, err) == 0)
            for (int i = 1; i < n; i++) decode(&t, tokens[i - 1], tokens[i]);
        for (int i = 0; i < vocab; i++) decode(&t, i == 0 ? 0 : BOS, i);
        free_tokenizer(&t);
    } else {
        expect_message(err, path);
    }
    close(fd);
    return 0;
}

#elif defined(FUZZ_ENCODE)
static Tokenizer tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    char err[ERR_LEN];
    (void)argc, (void)argv;
    const char *path = getenv("FUZZ_TOKENIZER_FILE") ? getenv("FUZZ_TOKENIZER_FILE") : "tokenizer.bin";
    if (build_tokenizer(&tok, path, 32000, err)) {
        fprintf(stderr, "fuzz_encode: %s\n", err);
        exit(1);
    }
    return 0;
}

// Each NUL-separated piece is one text (a prompt cannot hold a NUL either). The result must equal
// llama2.c's own loop's (tests/ref_encode.h).
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1), err[ERR_LEN];
    int *tokens = malloc((size + 3) * sizeof(int)), *ref = malloc((size + 3) * sizeof(int)), n = 0, n_ref = 0;
    memcpy(text, data, size);
    text[size] = '\0';
    for (char *p = text; p <= text + size; p += strlen(p) + 1) {
        if (encode(&tok, p, 1, tokens, &n, err) != 0) continue;
        if (n > (int)strlen(p) + 2) abort();   // the caller's buffer holds strlen + 2 (+1 spare)
        for (int i = 1; i < n; i++) decode(&tok, tokens[i - 1], tokens[i]);
        n_ref = reference_encode(&tok, p, ref, err);
        if (n_ref != n || memcmp(ref, tokens, n * sizeof(int))) {
            fprintf(stderr, "encode differs from the reference merges (%d vs %d tokens)\n", n, n_ref);
            abort();
        }
    }
    free(text);
    free(tokens);
    free(ref);
    return 0;
}

#elif defined(FUZZ_RUN_ARGS) || defined(FUZZ_QUANTIZE_ARGS)
// The program's own parser (run's or quantize's): 0, or non-zero with the reason in err.
static int parse_args(int argc, char **argv, char *err) {
#if defined(FUZZ_RUN_ARGS)
    CliArgs a;
    return parse_cli(argc, argv, &a, err);
#else
    QuantizeArgs a;
    return parse_quantize_args(argc, argv, &a, err);
#endif
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *buf = malloc(size + 1), *argv[34], err[ERR_LEN] = "";
    int argc = split_args(data, size, buf, argv, PROGRAM);
    if (parse_args(argc, argv, err) != 0 && !err[0]) abort();   // a refusal says why
    free(buf);
    return 0;
}
#else
#error "define one FUZZ_<TARGET>"
#endif
