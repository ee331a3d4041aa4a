// tokfile_target.c: libFuzzer target for the tokenizer section of a Q8LM v2 checkpoint
// (engine/tokfile.h): tokfile_load on arbitrary bytes. The contract: every input either loads or
// is refused with a one-line "tokenizer section: ..." message, never a crash, an out-of-bounds
// access or undefined behaviour; a section that loads has a known chat format, and encodes a
// text (the input's last bytes) into ids in [0, bpe_n_tokens) that decode without overflow.
//
// Build and run (from the repository root; seed the corpus with sections of the fixtures, e.g.
// what tokfile_from_source writes for tests/fixtures/hf/* and tests/fixtures/gguf/*.gguf):
//   clang -g -O1 -std=gnu11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iengine
//       -o fuzz_tokfile tests/fuzz/tokfile_target.c engine/tokfile.c engine/import.c engine/bpe.c
//       engine/tokenizer_json.c engine/unicode.c engine/json.c engine/safetensors.c engine/gguf.c
//       engine/model.c engine/util.c -lm
//   ./fuzz_tokfile -max_total_time=60 -max_len=65536 corpus/
#include "harness.h"   // bytes_as_file; main for -DFUZZ_REPLAY
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "model.h"
#include "tokfile.h"
#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    TokFile t;
    char err[ERR_LEN] = "";
    if (tokfile_load(data, size, &t, err)) {
        if (strncmp(err, "tokenizer section: ", 19) || strchr(err, '\n')) abort();
        return 0;
    }
    if (!t.bpe || t.chat < CHAT_NONE || t.chat > CHAT_MISTRAL || chat_from_name(chat_name(t.chat)) != t.chat) abort();
    const size_t len = size < 64 ? size : 64;
    const char *text = (const char *)data + size - len;
    int n = bpe_encode(t.bpe, text, len, BPE_ADD_SPECIAL, NULL, 0);
    int *ids = xcalloc(n ? n : 1, sizeof(int));
    if (n < 0 || bpe_encode(t.bpe, text, len, BPE_ADD_SPECIAL, ids, n) != n) abort();
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= bpe_n_tokens(t.bpe)) abort();
    size_t cap = (size_t)n * bpe_max_piece(t.bpe) * 3 + 16;
    char *out = xcalloc(cap, 1);
    if (bpe_decode(t.bpe, ids, n, 0, out, cap) >= cap) abort();
    free(out);
    free(ids);
    tokfile_free(&t);
    return 0;
}
