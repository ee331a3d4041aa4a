// bpe.h: Hugging Face-compatible BPE tokenizers: byte-level (GPT-2, Llama 3, Qwen2, SmolLM2) and
// SentencePiece-style (Llama 2, TinyLlama, Mistral: "▁" for space, dummy prefix, <0xXX> byte
// fallback). For any UTF-8 text, bpe_encode gives the ids of Hugging Face tokenizers'
// Tokenizer.encode(text).ids (transformers' tokenizer(text).input_ids): added tokens first, then
// normalizer, pre-tokenizer, BPE model and post-processor, each as the file declares it.
//
// A tokenizer is built from a BpeSpec: plain arrays (vocabulary, merges, added tokens) plus the
// pipeline's steps. bpe_spec_from_json fills one from tokenizer.json; a GGUF reader fills one from
// its tokenizer.ggml.* metadata and bpe_spec_gguf_pipeline (see there). bpe_build copies what it
// needs, so the spec's strings may be freed after it.
//
// Regexes are not run: a Split pre-tokenizer's pattern must be one of the known ones (BpePattern,
// recognised by its exact text), each a hand-written scanner equal to the regex; anything else is
// refused, as are components this file does not list.
#ifndef BPE_H
#define BPE_H

#include <stddef.h>

#include "json.h"

#define BPE_MAX_STEPS    8          // normalizer, pre-tokenizer and decoder steps, each
#define BPE_MAX_AFFIX    8          // ids the post-processor adds before / after the text
#define BPE_MAX_TOKENS   (1 << 21)  // ids are below this (a bound on memory; vocabularies reach 262k)
#define BPE_MAX_PIECE    4096       // bytes in one vocabulary or added token

typedef struct {
    const char *s;   // not NUL-terminated; NULL with len 0 for a hole in the id space
    int len;
} BpeStr;

// ---------------------------------------------------------------- the spec
typedef enum {
    BPE_NORM_NFC = 1,
    BPE_NORM_PREPEND,   // a before the text, unless the text is empty (Llama 2's "▁")
    BPE_NORM_REPLACE,   // every a by b (Llama 2's " " -> "▁")
} BpeNormType;
typedef struct {
    BpeNormType type;
    BpeStr a, b;
} BpeNorm;

typedef enum {
    BPE_PAT_GPT2 = 1,   // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    BPE_PAT_LLAMA3,     // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
    BPE_PAT_QWEN2,      // Llama 3's with \p{N} for \p{N}{1,3}: each digit alone
    BPE_PAT_DIGIT,      // \p{N}: each number character alone
    BPE_PAT_DIGITS3,    // \p{N}{1,3}: numbers in runs of up to three
} BpePattern;

typedef enum { BPE_PREPEND_NEVER, BPE_PREPEND_FIRST, BPE_PREPEND_ALWAYS } BpePrependScheme;

typedef enum {
    BPE_PRE_SPLIT = 1,    // pattern; behaviour Isolated: every match and every gap is a piece
    BPE_PRE_DIGITS,       // Rust is_numeric characters: each alone (individual) or in runs
    BPE_PRE_BYTE_LEVEL,   // " " before each piece (add_prefix_space) that lacks one, GPT-2 split
                          // (use_regex); makes the model byte-level: it sees GPT-2's byte alphabet
    BPE_PRE_METASPACE,    // " " -> replacement, prepend it (prepend), split before each (split)
} BpePreType;
typedef struct {
    BpePreType type;
    BpePattern pattern;            // SPLIT
    int individual;                // DIGITS
    int add_prefix_space;          // BYTE_LEVEL
    int use_regex;                 // BYTE_LEVEL
    BpeStr replacement;            // METASPACE: one character, usually "▁"
    BpePrependScheme prepend;      // METASPACE; FIRST: only a piece at the very start of the text
    int split;                     // METASPACE
} BpePre;

typedef enum {
    BPE_DEC_BYTE_LEVEL = 1,   // GPT-2 alphabet -> bytes (a token with other characters: as written)
    BPE_DEC_REPLACE,          // every a by b
    BPE_DEC_BYTE_FALLBACK,    // a token "<0xXX>" is the byte XX
    BPE_DEC_FUSE,             // later steps see one string (Strip then acts on the text's start)
    BPE_DEC_STRIP,            // up to `start` leading a (one character) from each string
    BPE_DEC_METASPACE,        // a -> " ", except in the first token, where a is dropped (drop_first)
} BpeDecType;
typedef struct {
    BpeDecType type;
    BpeStr a, b;
    int start;                // STRIP
    int drop_first;           // METASPACE: prepend_scheme is not "never"
} BpeDec;

typedef struct {
    int id;
    BpeStr content;
    int special;       // skipped by decode with skip_special, and by BPE_SPLIT_SPECIAL
    int lstrip, rstrip;   // the match takes the whitespace before / after it
    int normalized;    // matched in the normalized text (else in the raw text)
    int single_word;   // only where no word character (\w) touches it
} BpeAdded;

typedef struct {
    // model: BPE over the vocabulary, merges in rank order
    const BpeStr *vocab;     // (n_vocab) token id i's string as the file writes it (byte-level:
    int n_vocab;             //   GPT-2 alphabet); holes allowed
    const BpeStr *merges;    // (2 * n_merges): left, right of each merge, by rank
    int n_merges;
    const float *scores;     // (n_vocab) or NULL: with no merges, merges come from scores as
                             //   transformers' SentencePiece conversion makes them (GGUF "llama")
    int byte_fallback;       // an unknown character becomes its bytes' <0xXX> tokens
    int ignore_merges;       // a piece that is a whole vocabulary token is that token
    int unk_id;              // else an unknown character becomes this (-1: it is dropped)
    int fuse_unk;            // consecutive unknowns become one
    // added tokens: matched in the text before anything else; ids may be in the vocabulary or past it
    const BpeAdded *added;
    int n_added;
    // pipeline
    BpeNorm norm[BPE_MAX_STEPS];
    int n_norm;
    BpePre pre[BPE_MAX_STEPS];
    int n_pre;
    BpeDec dec[BPE_MAX_STEPS];
    int n_dec;
    // post-processor (TemplateProcessing's single sequence; GGUF add_bos/add_eos)
    int prefix[BPE_MAX_AFFIX], n_prefix;
    int suffix[BPE_MAX_AFFIX], n_suffix;
} BpeSpec;

// ---------------------------------------------------------------- the tokenizer
typedef struct Bpe Bpe;   // opaque (bpe.c); read-only once built: any number of threads may use one

// Builds the tokenizer: NULL with "what is wrong" in err (ERR_LEN) when the spec is inconsistent
// (a merge of tokens not in the vocabulary, an id out of range, a duplicate id, ...).
Bpe *bpe_build(const BpeSpec *spec, char *err);
void bpe_free(Bpe *b);

// tokenizer.json, whole: NULL with "path: what is wrong" in err.
Bpe *bpe_from_tokenizer_json(const char *path, char *err);
// The spec a parsed tokenizer.json declares, pointing into doc (keep doc until bpe_build); the
// arrays it allocates are freed by bpe_spec_free. 0, or -1 with "what is wrong" in err.
int bpe_spec_from_json(const JsonValue *root, BpeSpec *spec, char *err);
void bpe_spec_free(BpeSpec *spec);

// The normalizer, pre-tokenizer, decoder and byte-level choice that a GGUF file's
// tokenizer.ggml.model ("gpt2" or "llama") and tokenizer.ggml.pre ("default", "gpt-2",
// "llama-bpe", "llama3", "qwen2", "smollm", "starcoder", ...) stand for, as Hugging Face
// tokenizers would run them (llama.cpp's regex lists, taken as the equivalent tokenizers
// pipeline). add_space_prefix: tokenizer.ggml.add_space_prefix (llama; default 1). 0, or -1 with
// err naming the unknown name.
//
// The GGUF adapter fills the rest: vocab = tokenizer.ggml.tokens (id = index); merges = each
// tokenizer.ggml.merges string cut at its first space after the first byte; scores =
// tokenizer.ggml.scores for "llama" files without merges; byte_fallback = fuse_unk = 1 for
// "llama"; unk_id = tokenizer.ggml.unknown_token_id or -1; added = every token whose tokenizer.ggml.token_type is 3
// (CONTROL: special = 1) or 4 (USER_DEFINED: special = 0), normalized = 0; prefix = {bos} when
// tokenizer.ggml.add_bos_token (default: 1 for "llama", 0 for "gpt2"), suffix = {eos} when
// tokenizer.ggml.add_eos_token.
int bpe_spec_gguf_pipeline(BpeSpec *spec, const char *model, const char *pre, int add_space_prefix, char *err);

// ---------------------------------------------------------------- encoding
enum {
    BPE_ADD_SPECIAL = 1,     // the post-processor's ids (BOS ...): add_special_tokens=True
    BPE_SPLIT_SPECIAL = 2,   // special added tokens in the text are plain text (encode_special_tokens)
};
// Encodes len bytes of text (any bytes: invalid UTF-8 is one character per bad byte) into ids,
// writing at most cap of them; returns how many there are (call again with more room if that is
// more than cap). O(n log n) in the text's length.
int bpe_encode(const Bpe *b, const char *text, size_t len, int flags, int *ids, int cap);

// ---------------------------------------------------------------- decoding
int bpe_n_tokens(const Bpe *b);                        // ids are 0 .. this - 1
int bpe_is_special(const Bpe *b, int id);              // a special added token
int bpe_find(const Bpe *b, const char *s, size_t len);  // an added or vocabulary token's id, or -1
// The token's string as the file writes it (NULL for a hole or an id out of range).
const char *bpe_token_str(const Bpe *b, int id, int *len);
int bpe_max_piece(const Bpe *b);                       // the longest bpe_piece, in bytes

// The bytes token id stands for through the decoder (GPT-2 alphabet -> bytes, "▁" -> " ",
// <0xXX> -> the byte), first: it begins the text (the decoder's Strip / Metaspace then drop its
// leading space). Writes at most bpe_max_piece bytes to out; returns the count (0 for a bad id).
int bpe_piece(const Bpe *b, int id, int first, char *out);

// Streaming: the text of each token as it comes, as valid UTF-8. A character split across tokens
// (byte fallback, byte-level pieces) is held back until complete and printed once; bytes that can
// never form one become U+FFFD, one per maximal invalid subsequence (Rust's from_utf8_lossy).
typedef struct {
    const Bpe *bpe;
    int skip_special;        // special added tokens print nothing
    int started;             // a token has been printed: no more leading-space stripping
    int n_held;
    unsigned char held[4];   // an incomplete UTF-8 sequence so far
} BpeStream;
#define BPE_STREAM_CAP(b) (4 * (bpe_max_piece(b) + 8))   // out's room for one call

void bpe_stream_init(BpeStream *s, const Bpe *b, int skip_special);
// The text completed by token id, into out (room for BPE_STREAM_CAP): its length.
int bpe_stream_next(BpeStream *s, int id, char *out);
// What is still held at the end of the text (as U+FFFD): its length (at most 3 bytes).
int bpe_stream_flush(BpeStream *s, char *out);

// The text of n ids as Hugging Face's Tokenizer.decode gives it (but for invalid byte sequences
// from <0xXX> tokens: one U+FFFD per maximal invalid subsequence, not per byte), into out (at most
// cap bytes, NUL-terminated when there is room); returns its full length.
size_t bpe_decode(const Bpe *b, const int *ids, int n, int skip_special, char *out, size_t cap);

#endif
