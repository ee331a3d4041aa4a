// tokenizer.h: llama2.c's tokenizer.bin: scored BPE merges over UTF-8 characters, with byte
// fallback to <0xXX> pieces and sentencepiece's dummy-prefix space. The file is validated in full
// when loaded (every length in bounds, every score finite, exactly the model's vocabulary).
#ifndef TOKENIZER_H
#define TOKENIZER_H

typedef struct {
    const char *str;
    int id;
} TokenIndex;

typedef struct {
    char **vocab;              // (vocab_size) NUL-terminated pieces
    float *scores;             // (vocab_size) merge priority
    TokenIndex *sorted;        // vocab sorted by string, for lookup
    int vocab_size;
    int max_token_length;
    int byte_token[256];       // id of "<0xXX>", or -1 where the vocab lacks it
    unsigned char byte_pieces[512];   // each byte as a one-character string
    char *data;                // the file
} Tokenizer;

// 0, or -1 with "path: what is wrong" in err (ERR_LEN).
int build_tokenizer(Tokenizer *t, const char *path, int vocab_size, char *err);
void free_tokenizer(Tokenizer *t);
// The number of whole entries the file holds, or -1 ("path: ...") where it ends inside one.
int tokenizer_file_entries(const char *path, char *err);
// Encodes text into tokens (room for strlen(text) + 2), BOS first if bos: 0, or -1 with the reason.
int encode(const Tokenizer *t, const char *text, int bos, int *tokens, int *n_tokens, char *err);
// The text of `token` following `prev` (a leading space is dropped after BOS; <0xXX> is the byte).
const char *decode(const Tokenizer *t, int prev, int token);
// Prints a piece to stdout unless it is a single unprintable byte.
void safe_print(const char *piece);
// The id of a piece, or -1.
int str_lookup(const char *str, const Tokenizer *t);
// Appends the tokens of one UTF-8 character: its piece, else its bytes' tokens (0, or -1).
int encode_char(const Tokenizer *t, const char *ch, int *tokens, int *n, char *err);

#endif
