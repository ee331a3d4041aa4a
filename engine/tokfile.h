// tokfile.h: the tokenizer section of a Q8LM v2 checkpoint: everything run needs to tokenize and
// chat, self-contained (no JSON at run time). quantize builds it from an import source
// (tokfile_from_source); run loads it (tokfile_load), validating every byte.
//
// Section layout (little-endian; u32/i32 4 bytes, f32 IEEE; str = u32 len + len bytes, no NUL;
// a vocabulary hole is len 0xFFFFFFFF with no bytes):
//   "Q8TK", u32 version (1)
//   u32 chat                        CHAT_*
//   u32 has_system, str system      has_system 0 or 1; the str is present only when 1
//   u32 byte_fallback, u32 ignore_merges, u32 fuse_unk   (each 0 or 1)
//   i32 unk_id                      -1: none
//   u32 n_vocab,  n_vocab x str     token id i's string as the file writes it (holes allowed)
//   u32 n_merges, 2 * n_merges x str   left, right of each merge, by rank
//   u32 has_scores, n_vocab x f32 (only when has_scores is 1)
//   u32 n_added,  n_added x { i32 id, u32 flags (1 special, 2 lstrip, 4 rstrip, 8 normalized,
//                             16 single_word), str content }
//   u32 n_norm (<= BPE_MAX_STEPS), each { u32 type, str a, str b }
//   u32 n_pre  (<= BPE_MAX_STEPS), each { u32 type, u32 pattern, u32 individual, u32 add_prefix_space,
//                                         u32 use_regex, str replacement, u32 prepend, u32 split }
//   u32 n_dec  (<= BPE_MAX_STEPS), each { u32 type, str a, str b, i32 start, u32 drop_first }
//   u32 n_prefix (<= BPE_MAX_AFFIX), i32 ids; u32 n_suffix (<= BPE_MAX_AFFIX), i32 ids
//   and nothing after: the section's size is exactly this.
// The fields are BpeSpec's (bpe.h), one for one; bpe_build then checks what they mean.
//
// Default system prompt: a ChatML template's built-in one. The rule: at each "<|im_start|>system"
// that directly follows a quote (' or ") and is directly followed by a newline (a real one, or the
// two characters \n of a Jinja string escape), the text up to the next "<|im_end|>" is the prompt,
// if that stretch holds no unescaped closing quote (so it is one string literal, not an expression).
// Jinja escapes \n \t \r \\ \' \" are undone. The first such occurrence wins; none: NULL.
#ifndef TOKFILE_H
#define TOKFILE_H

#include <stddef.h>

#include "bpe.h"
#include "import.h"

#define TOKFILE_MAGIC   "Q8TK"
#define TOKFILE_VERSION 1

enum { CHAT_NONE = 0, CHAT_CHATML = 1, CHAT_LLAMA3 = 2, CHAT_LLAMA2 = 3, CHAT_MISTRAL = 4 };
const char *chat_name(int chat);            // "chatml", "llama3", "llama2", "mistral", "none"
int chat_from_name(const char *name);       // -1 if unknown
// Recognises a chat_template: "<|im_start|>" -> CHATML, "<|start_header_id|>" -> LLAMA3, "[INST]"
// with "<<SYS>>" -> LLAMA2, "[INST]" -> MISTRAL, else (or NULL) CHAT_NONE.
int chat_from_template(const char *jinja);

typedef struct {
    int bos_id, eos_id, eot_id;   // -1 where none. eos: HF tokenizer_config.json eos_token, else
                                  // generation_config.json eos_token_id (int, or a list's first);
                                  // GGUF tokenizer.ggml.eos_token_id. eot: GGUF tokenizer.ggml.eot_token_id
                                  // where present, else the chat format's end of turn (<|im_end|>
                                  // for ChatML, <|eot_id|> for Llama 3) where the vocabulary has it, else eos.
    int add_bos;                  // the post-processor begins with BOS (BPE_ADD_SPECIAL adds it)
    int chat;                     // CHAT_*
} TokInfo;

// The section for an import source: allocated bytes (free()) and the ids for the header.
// 0, or -1 with "path: what is wrong" (one line) in err.
// HF: tokenizer.json (required), tokenizer_config.json (bos/eos tokens as strings or {"content": ...},
// chat_template as a string or a list of {name, template} taking "default", else chat_template.jinja),
// generation_config.json (bos/eos_token_id int or list, where tokenizer_config.json names none).
// GGUF: tokenizer.ggml.* (model, pre, tokens, merges, token_type, scores, bos/eos/eot/unknown ids,
// add_bos_token, add_eos_token, add_space_prefix) and tokenizer.chat_template.
int tokfile_from_source(const Source *s, unsigned char **bytes, size_t *n_bytes, TokInfo *info, char *err);

// The tokenizer a section describes. The bytes are untrusted: every length and count is checked
// against n_bytes; a bad section is 0 / -1 with "tokenizer section: what is wrong" in err.
typedef struct {
    Bpe *bpe;
    int chat;                // CHAT_* recorded in the section
    char *default_system;    // the chat template's built-in system prompt (NUL-terminated), or NULL
} TokFile;
int tokfile_load(const unsigned char *bytes, size_t n_bytes, TokFile *t, char *err);
void tokfile_free(TokFile *t);   // safe on a zeroed or freed TokFile

// The serialization alone (tokfile_from_source uses it): the section for a spec, chat kind and
// default system prompt (or NULL). Allocated; *n_bytes its size.
unsigned char *tokfile_write(const BpeSpec *sp, int chat, const char *default_system, size_t *n_bytes);
// The default system prompt of a template by the rule above: allocated, or NULL.
char *chat_default_system(const char *jinja);

#endif
