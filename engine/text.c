// text.c: one interface over llama2.c's tokenizer and the checkpoint's BPE tokenizer (text.h).
#include "text.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

// llama2.c's tokenizer.bin: exactly the model's vocabulary, or fewer entries (synthetic models of
// larger vocabularies run with tokenizer.bin: ids past its end print nothing).
static int open_llama2c(Text *t, const Model *m, const char *path, char *err) {
    int n = m->cfg.vocab_size;
    if (build_tokenizer(&t->sp, path, n, err) == 0) return t->n_tokens = n, 0;
    char why[ERR_LEN];
    int entries = tokenizer_file_entries(path, why);
    if (entries < 3 || entries >= n) return -1;   // err from build_tokenizer says why
    if (build_tokenizer(&t->sp, path, entries, err)) return -1;
    fprintf(stderr, "run: %s has %d tokens, the model %d: ids from %d on print nothing\n", path, entries, n, entries);
    return t->n_tokens = entries, 0;
}

int text_open(Text *t, const Model *m, const char *path, char *err) {
    memset(t, 0, sizeof *t);
    t->bos_id = m->bos_id, t->eos_id = m->eos_id, t->eot_id = m->eot_id, t->chat = m->chat_template;
    if (!m->tokenizer) {
        t->bos_id = BOS, t->eos_id = -1, t->eot_id = -1, t->chat = CHAT_NONE;
        return open_llama2c(t, m, path, err);
    }
    if (tokfile_load(m->tokenizer, m->tokenizer_bytes, &t->tf, err)) return -1;
    t->n_tokens = bpe_n_tokens(t->tf.bpe);
    return 0;
}

void text_close(Text *t) {
    if (t->tf.bpe) tokfile_free(&t->tf);
    else free_tokenizer(&t->sp);
    memset(t, 0, sizeof *t);
}

int text_encode(const Text *t, const char *s, int first, int **ids, int *n, char *err) {
    const size_t len = strlen(s);
    if (!t->tf.bpe) {
        *ids = xcalloc(len + 3, sizeof(int));
        return encode(&t->sp, s, first, *ids, n, err);
    }
    const int flags = first ? BPE_ADD_SPECIAL : 0;
    int cap = (int)(len < (1u << 28) ? len + 16 : 1u << 28);
    *ids = xcalloc(cap, sizeof(int));
    *n = bpe_encode(t->tf.bpe, s, len, flags, *ids, cap);
    if (*n > cap) {   // added tokens can make more ids than bytes: once more with room
        free(*ids);
        cap = *n;
        *ids = xcalloc(cap, sizeof(int));
        *n = bpe_encode(t->tf.bpe, s, len, flags, *ids, cap);
    }
    return 0;
}

int text_is_end(const Text *t, int id) {
    if (!t->tf.bpe) return id == BOS;
    return id == t->eos_id || id == t->eot_id;
}

void text_stream_init(TextStream *s, const Text *t, int prev) {
    memset(s, 0, sizeof *s);
    s->t = t, s->prev = prev;
    if (t->tf.bpe) {
        bpe_stream_init(&s->bs, t->tf.bpe, 1);
        s->buf = xcalloc(BPE_STREAM_CAP(t->tf.bpe) + 1, 1);
    }
}

const char *text_stream_next(TextStream *s, int id) {
    const Text *t = s->t;
    if (!t->tf.bpe) {
        const char *piece = id < t->n_tokens ? decode(&t->sp, s->prev, id) : "";
        s->prev = id;
        // one unprintable byte prints nothing (llama2.c's safe_printf)
        if (piece[0] && !piece[1] && !(isprint((unsigned char)piece[0]) || isspace((unsigned char)piece[0]))) return "";
        return piece;
    }
    int n = id >= 0 && id < t->n_tokens ? bpe_stream_next(&s->bs, id, s->buf) : 0;
    s->buf[n] = '\0';
    return s->buf;
}

const char *text_stream_flush(TextStream *s) {
    if (!s->t->tf.bpe) return "";
    int n = bpe_stream_flush(&s->bs, s->buf);
    s->buf[n] = '\0';
    return s->buf;
}

void text_stream_free(TextStream *s) { free(s->buf); }

// ----------------------------------------------------------------------------
// Chat formats, as the models' own chat templates lay a conversation out (add_generation_prompt:
// each turn ends where the assistant's reply begins). The reply's own end token (EOS or end of
// turn) is fed back before the next turn's text.

typedef struct {
    const char *system_first;   // %s: the system prompt; before the first user turn
    const char *first;          // %s: the user's text: the first turn
    const char *next;           // %s: later turns
} ChatFormat;

static const ChatFormat formats[] = {
    [CHAT_CHATML] = {"<|im_start|>system\n%s<|im_end|>\n", "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n",
                     "\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n"},
    [CHAT_LLAMA3] = {"<|start_header_id|>system<|end_header_id|>\n\n%s<|eot_id|>",
                     "<|start_header_id|>user<|end_header_id|>\n\n%s<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
                     "<|start_header_id|>user<|end_header_id|>\n\n%s<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
    [CHAT_LLAMA2] = {"<<SYS>>\n%s\n<</SYS>>\n\n", "[INST] %s%s [/INST]", "<s>[INST] %s [/INST]"},
    [CHAT_MISTRAL] = {"%s\n\n", "[INST] %s%s [/INST]", "[INST] %s [/INST]"},
};

int text_chat_turn(int chat, int first, const char *system, const char *user, char *out, size_t cap) {
    if (chat <= CHAT_NONE || chat > CHAT_MISTRAL) return -1;
    const ChatFormat *f = &formats[chat];
    int n;
    if (!first) return (n = snprintf(out, cap, f->next, user)) < 0 || (size_t)n >= cap ? -1 : n;
    char sys[8192] = "";
    if (system && system[0] && snprintf(sys, sizeof sys, f->system_first, system) >= (int)sizeof sys) return -1;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    if (chat == CHAT_LLAMA2 || chat == CHAT_MISTRAL) n = snprintf(out, cap, f->first, sys, user);   // the system inside [INST]
    else {
        const int head = snprintf(out, cap, "%s", sys);
        if (head < 0 || (size_t)head >= cap) return -1;
        const int rest = snprintf(out + head, cap - head, f->first, user);
        n = rest < 0 ? -1 : head + rest;
    }
#pragma GCC diagnostic pop
    return n < 0 || (size_t)n >= cap ? -1 : n;
}
