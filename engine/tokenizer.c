// tokenizer.c: llama2.c's tokenizer.bin (int max_token_length, then per token: float score,
// int len, len bytes). Scored BPE merges over UTF-8 characters, byte fallback <0xXX>.
#include "tokenizer.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"   // BOS, ERR_LEN
#include "util.h"

static int compare_tokens(const void *a, const void *b) {
    return strcmp(((const TokenIndex *)a)->str, ((const TokenIndex *)b)->str);
}

int str_lookup(const char *str, const Tokenizer *t) {
    TokenIndex key = {str, 0};
    const TokenIndex *res = bsearch(&key, t->sorted, t->vocab_size, sizeof(TokenIndex), compare_tokens);
    return res ? res->id : -1;
}

void free_tokenizer(Tokenizer *t) {
    if (t->vocab)
        for (int i = 0; i < t->vocab_size; i++) free(t->vocab[i]);
    free(t->vocab);
    free(t->scores);
    free(t->sorted);
    free(t->data);
    memset(t, 0, sizeof *t);
}

static int tok_fail(Tokenizer *t, char *err, const char *path, const char *msg, int i) {
    snprintf(err, ERR_LEN, "%.300s: token %d: %.150s", path, i, msg);
    free_tokenizer(t);
    return -1;
}

int tokenizer_file_entries(const char *path, char *err) {
    size_t bytes = 0, at = 4;
    char *data = read_file(path, (size_t)1 << 30, &bytes, err);
    if (!data) return -1;
    int n = 0;
    while (bytes >= 4 && bytes - at >= 8) {
        int len;
        memcpy(&len, data + at + 4, 4);
        if (len < 0 || bytes - at - 8 < (size_t)len) break;
        at += 8 + (size_t)len, n++;
    }
    free(data);
    if (bytes < 4 || at != bytes) {
        snprintf(err, ERR_LEN, "%.300s: ends inside an entry (truncated?)", path);
        return -1;
    }
    return n;
}

// Reads and validates the whole file: every length in bounds, every score finite, exactly
// vocab_size entries (a tokenizer for another vocabulary would decode garbage).
int build_tokenizer(Tokenizer *t, const char *path, int vocab_size, char *err) {
    memset(t, 0, sizeof *t);
    size_t bytes = 0, at = 4;
    if (!(t->data = read_file(path, (size_t)1 << 30, &bytes, err))) return -1;
    if (bytes < 4) return tok_fail(t, err, path, "file too short for the max_token_length field", -1);
    memcpy(&t->max_token_length, t->data, 4);
    if (t->max_token_length < 1 || t->max_token_length > 4096)
        return tok_fail(t, err, path, "header field max_token_length is not in [1, 4096]", -1);
    t->vocab_size = vocab_size;
    t->vocab = xcalloc(vocab_size, sizeof(char *));
    t->scores = xcalloc(vocab_size, sizeof(float));
    for (int i = 0; i < vocab_size; i++) {
        int len;
        if (bytes - at < 8) return tok_fail(t, err, path, "file ends before this entry (truncated, or a tokenizer for a smaller vocabulary)", i);
        memcpy(&t->scores[i], t->data + at, 4);
        memcpy(&len, t->data + at + 4, 4);
        at += 8;
        if (!isfinite(t->scores[i])) return tok_fail(t, err, path, "score is not finite", i);
        if (len < 0 || len > t->max_token_length) return tok_fail(t, err, path, "length is outside [0, max_token_length]", i);
        if (bytes - at < (size_t)len) return tok_fail(t, err, path, "file ends inside this entry's bytes (truncated)", i);
        t->vocab[i] = xcalloc(len + 1, 1);
        memcpy(t->vocab[i], t->data + at, len);
        at += len;
    }
    if (at != bytes) {
        snprintf(err, ERR_LEN, "%.300s: %zu bytes follow the model's %d entries: a tokenizer for a larger vocabulary?", path,
                 bytes - at, vocab_size);
        free_tokenizer(t);
        return -1;
    }
    t->sorted = xcalloc(vocab_size, sizeof(TokenIndex));
    for (int i = 0; i < vocab_size; i++) t->sorted[i] = (TokenIndex){t->vocab[i], i};
    qsort(t->sorted, vocab_size, sizeof(TokenIndex), compare_tokens);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_token[b] = str_lookup(name, t);
        t->byte_pieces[2 * b] = (unsigned char)b;
    }
    return 0;
}

// The text of `token` following `prev`: a leading space is dropped after BOS, and byte tokens
// <0xXX> become the byte itself.
const char *decode(const Tokenizer *t, int prev, int token) {
    const char *piece = t->vocab[token];
    if (prev == BOS && piece[0] == ' ') piece++;
    unsigned char byte_val;
    if (sscanf(piece, "<0x%02hhX>", &byte_val) == 1 && strlen(piece) == 6) piece = (const char *)t->byte_pieces + byte_val * 2;
    return piece;
}

// Prints a piece unless it is a single unprintable byte (control codes would garble a terminal).
void safe_print(const char *piece) {
    if (!piece || !piece[0]) return;
    if (!piece[1] && !(isprint((unsigned char)piece[0]) || isspace((unsigned char)piece[0]))) return;
    fputs(piece, stdout);
}

// Appends the tokens of one UTF-8 character (or stray byte): the piece if the vocab has it,
// else its bytes as byte tokens.
int encode_char(const Tokenizer *t, const char *ch, int *tokens, int *n, char *err) {
    int id = str_lookup(ch, t);
    if (id >= 0) {
        tokens[(*n)++] = id;
        return 0;
    }
    for (const unsigned char *c = (const unsigned char *)ch; *c; c++) {
        if (t->byte_token[*c] < 0) {
            snprintf(err, ERR_LEN, "the tokenizer has neither the character nor the byte token <0x%02X> for it", *c);
            return -1;
        }
        tokens[(*n)++] = t->byte_token[*c];
    }
    return 0;
}

// The token whose piece is a's then b's, or -1. buf: room for two pieces.
static int merge_of(const Tokenizer *t, int a, int b, char *buf) {
    snprintf(buf, (size_t)t->max_token_length * 2 + 3, "%s%s", t->vocab[a], t->vocab[b]);
    return str_lookup(buf, t);
}

// Encodes text into tokens (room for strlen(text) + 2): BOS if asked, a leading space as
// sentencepiece's dummy prefix, characters, then the highest-scored merges until none applies.
int encode(const Tokenizer *t, const char *text, int bos, int *tokens, int *n_tokens, char *err) {
    char *buf = xcalloc((size_t)t->max_token_length * 2 + 3, 1);
    int n = 0;
    if (bos) tokens[n++] = BOS;
    if (text[0] && encode_char(t, " ", tokens, &n, err)) goto fail;
    size_t len = 0;
    for (const char *c = text; *c; c++) {
        if ((*c & 0xC0) != 0x80) len = 0;   // a new UTF-8 character starts
        buf[len++] = *c;
        buf[len] = '\0';
        if ((c[1] & 0xC0) == 0x80 && len < 4) continue;   // continuation bytes follow
        if (encode_char(t, buf, tokens, &n, err)) goto fail;
        len = 0;
    }
    // Merges, highest score first (the first such pair on ties), as llama2.c does. merge[i] is the
    // token that merges tokens[i] and tokens[i + 1] (or -1): each pair is looked up once, and after
    // a merge only the two pairs it changed, instead of every pair on every pass.
    int *merge = xcalloc(n, sizeof(int));
    for (int i = 0; i + 1 < n; i++) merge[i] = merge_of(t, tokens[i], tokens[i + 1], buf);
    for (;;) {
        float best_score = -1e10f;
        int best_idx = -1;
        for (int i = 0; i + 1 < n; i++)
            if (merge[i] >= 0 && t->scores[merge[i]] > best_score) best_score = t->scores[merge[i]], best_idx = i;
        if (best_idx < 0) break;
        tokens[best_idx] = merge[best_idx];
        memmove(tokens + best_idx + 1, tokens + best_idx + 2, (n - best_idx - 2) * sizeof(int));
        if (n - best_idx - 3 > 0) memmove(merge + best_idx + 1, merge + best_idx + 2, (n - best_idx - 3) * sizeof(int));
        n--;
        if (best_idx > 0) merge[best_idx - 1] = merge_of(t, tokens[best_idx - 1], tokens[best_idx], buf);
        if (best_idx + 1 < n) merge[best_idx] = merge_of(t, tokens[best_idx], tokens[best_idx + 1], buf);
    }
    free(merge);
    free(buf);
    *n_tokens = n;
    return 0;
fail:
    free(buf);
    return -1;
}

