// ref_encode.h: the reference encode() is tested against: llama2.c's tokenizer loop as it is,
// every pair of tokens looked up again on every merge pass (run.c looks each pair up once).
// Included after run.c by tests/test_run.c and tests/fuzz/fuzz.c.
#ifndef REF_ENCODE_H
#define REF_ENCODE_H

// tokens (room for strlen(text) + 2): BOS, the dummy-prefix space, each UTF-8 character (or
// stray byte) alone, then the highest-scored merge (the first on ties) until none applies.
// Returns the count, or -1 (reason in err) where a character has no token.
static int reference_encode(const Tokenizer *t, const char *text, int *tokens, char *err) {
    char ch[8], *buf = xcalloc((size_t)t->max_token_length * 2 + 3, 1);
    int n = 0;
    size_t len = 0;
    tokens[n++] = BOS;
    if (text[0] && encode_char(t, " ", tokens, &n, err)) goto fail;
    for (const char *c = text; *c; c++) {
        if ((*c & 0xC0) != 0x80) len = 0;
        ch[len++] = *c;
        ch[len] = '\0';
        if ((c[1] & 0xC0) == 0x80 && len < 4) continue;
        if (encode_char(t, ch, tokens, &n, err)) goto fail;
        len = 0;
    }
    for (;;) {
        float best_score = -1e10f;
        int best_id = -1, best_idx = -1;
        for (int i = 0; i + 1 < n; i++) {
            snprintf(buf, (size_t)t->max_token_length * 2 + 3, "%s%s", t->vocab[tokens[i]], t->vocab[tokens[i + 1]]);
            int id = str_lookup(buf, t);
            if (id >= 0 && t->scores[id] > best_score) best_score = t->scores[id], best_id = id, best_idx = i;
        }
        if (best_idx < 0) break;
        tokens[best_idx] = best_id;
        memmove(tokens + best_idx + 1, tokens + best_idx + 2, (n - best_idx - 2) * sizeof(int));
        n--;
    }
    free(buf);
    return n;
fail:
    free(buf);
    return -1;
}

#endif
