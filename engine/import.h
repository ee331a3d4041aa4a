// import.h: the models people download, as quantize reads them: a Hugging Face directory
// (config.json + safetensors, LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM) or a
// GGUF file (architectures llama and qwen2). Opening validates the config and every tensor's
// presence, dtype and shape against it; then each weight is read row by row as float, in this
// engine's conventions:
//   - RoPE rotates adjacent pairs (2i, 2i+1) of a head (llama2.c's, and llama.cpp's converter's
//     order for "llama" GGUFs); Hugging Face rotates (i, i + head_dim/2), so the rows of wq and wk
//     (and their biases) are reordered on the way in: the model computes what the original does;
//   - linear weights are (out, in); the classifier is the embedding where none is stored.
// Nothing is held but the maps: a 7B import streams tensor by tensor.
#ifndef IMPORT_H
#define IMPORT_H

#include "gguf.h"
#include "model.h"
#include "safetensors.h"

// The tensors of a model, by role; the per-layer ones take a layer index.
typedef enum {
    R_EMBED, R_WQ, R_WK, R_WV, R_WO, R_W1, R_W2, R_W3,    // R_WQ..R_W3 follow W_Q..W_3
    R_NORM_ATT, R_NORM_FFN, R_NORM_FINAL, R_CLS, R_BQ, R_BK, R_BV,
} Role;

typedef struct {
    char path[1024];
    int is_gguf;
    Config cfg;
    int shared_classifier;   // no classifier stored: it is the embedding
    float *rope_freq;        // (head_dim / 2): the frequencies RoPE uses, scaling applied
    int neox_rope;           // 1: rows of wq/wk are in rotate-half order and get reordered
    // Hugging Face
    SafeTensors st;
    char arch[64];
    // GGUF
    Gguf gguf;
} Source;

// 0, or -1 with "path: what is wrong" (one line) in err; on failure s is closed.
int  source_open(Source *s, const char *path, char *err);
void source_close(Source *s);
// (rows, cols) of a role's tensor (cols 1 for vectors: norms, biases).
void role_shape(const Config *c, Role r, int *rows, int *cols);
// Row `row` of the role's tensor in layer `layer` (0 for the global ones), as floats; 0 or -1.
int source_row(const Source *s, Role r, int layer, int row, float *out, char *err);
// Where the role's tensor is stored as GGUF Q8_0, its row as scales (cols / 32) and int8 values;
// 1 when it did so, 0 when the tensor is another type, -1 on error.
int source_row_q8_0(const Source *s, Role r, int layer, int row, float *scales, int8_t *q, char *err);
const char *role_name(Role r);
int source_is_q8_0(const Source *s, Role r, int layer);   // the tensor is a GGUF Q8_0 matrix
size_t source_bytes(const Source *s);                     // the bytes of all its tensors

#endif
