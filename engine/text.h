// text.h: the model's tokenizer, whichever kind it has: llama2.c's tokenizer.bin (given with -z,
// for llama2.c checkpoints and Q8LM v1) or the BPE tokenizer a Q8LM v2 checkpoint carries
// (tokfile.h). Encoding a prompt, streaming decoding, the tokens that end a reply, and the chat
// format.
#ifndef TEXT_H
#define TEXT_H

#include "bpe.h"
#include "model.h"
#include "tokenizer.h"
#include "tokfile.h"

typedef struct {
    Tokenizer sp;          // llama2.c's, where bpe is NULL
    TokFile tf;            // the checkpoint's: tf.bpe
    int n_tokens;          // ids the tokenizer knows (may be fewer than the model's vocabulary)
    int bos_id, eos_id, eot_id;   // -1: none. llama2.c's models end a sequence by generating BOS
    int chat;              // CHAT_* of the checkpoint (CHAT_NONE for llama2.c's)
} Text;

// The checkpoint's own tokenizer, else the file at path (llama2.c's format). 0, or -1 with err.
int  text_open(Text *t, const Model *m, const char *path, char *err);
void text_close(Text *t);
// Ids of `s` into a new array (*ids, free()), *n of them: as a prompt (first: with BOS where the
// model adds one) or as a continuation (nothing added). 0, or -1 with err.
int text_encode(const Text *t, const char *s, int first, int **ids, int *n, char *err);
// Does generating this id end the reply?
int text_is_end(const Text *t, int id);

// Streaming decoding: each token's text as it comes, valid UTF-8, a character split over tokens
// printed once, whole; special tokens print nothing.
typedef struct {
    const Text *t;
    int prev;              // llama2.c's decoding depends on the previous token
    BpeStream bs;
    char *buf;             // BPE_STREAM_CAP bytes
} TextStream;
void text_stream_init(TextStream *s, const Text *t, int prev);
const char *text_stream_next(TextStream *s, int id);   // NUL-terminated, valid until the next call
const char *text_stream_flush(TextStream *s);
void text_stream_free(TextStream *s);

// The text of one chat turn in the model's format (CHAT_*): the first turn with the system prompt
// (NULL or "": none), later ones after the reply's end token. Its length, or -1 if it does not fit
// in cap bytes or chat is CHAT_NONE.
int text_chat_turn(int chat, int first, const char *system, const char *user, char *out, size_t cap);

#endif
