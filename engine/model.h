// model.h: the one definition of every checkpoint format this project reads or writes,
// with its validation, and the in-memory weights that both executors (CPU and GPU) use.
// run.c, quantize.c and the tests all go through this; there is no second reader.
//
// Formats read:
//   llama2.c legacy v0  FP32: 7 x int32 header, weights, [freq_cis tables], [classifier]
//   llama2.c v1 "ak42"  FP32: 256-byte header, norms first, then the weights
//   llama2.c v2 "ak42"  INT8 (export.py): groups over the flattened tensor; read only where
//                       every row length is a multiple of the group size (then it is per-row)
//   Q8LM v1             INT8, this project's own format (README.md, "File format")
//   Q8LM v2             v1 + head_dim, RoPE frequencies, norm epsilon, q/k/v biases, special
//                       tokens, the tokenizer; INT8 or FP32 weights (imports of Hugging Face
//                       and GGUF models)
#ifndef MODEL_H
#define MODEL_H

#include <stddef.h>
#include <stdint.h>

#define LLAMA2C_MAGIC 0x616b3432u   // "ak42" as llama2.c's export.py writes it
#define Q8LM_MAGIC    0x4d4c3851u   // "Q8LM" in file byte order
#define Q8LM_VERSION  2             // the newest this engine writes and reads (and 1)
#define HEADER_BYTES  256           // v1, v2 and Q8LM headers are all padded to this
#define ROW_ALIGN     16            // INT8 rows are padded to a multiple of 16 bytes: 16-byte GPU loads
#define SECTION_ALIGN 64            // every tensor section of a Q8LM file starts 64-byte aligned
#define ERR_LEN       512
#define BOS           1             // llama2.c's models: token 1 begins a sequence; generating it ends one

enum { FMT_V0 = 0, FMT_V1 = 1, FMT_V2 = 2, FMT_Q8LM = 3 };

enum { ROPE_PLAIN = 0, ROPE_LLAMA3 = 1 };
// Llama 3.1's RoPE frequency scaling: wavelengths beyond original_context / low_freq_factor are
// stretched by factor, those under original_context / high_freq_factor kept, blended between.
typedef struct {
    int type;                // ROPE_PLAIN or ROPE_LLAMA3
    float factor, low_freq_factor, high_freq_factor;
    int original_context;    // original_max_position_embeddings
} RopeScaling;

typedef struct {
    int dim;        // transformer width
    int hidden_dim; // feed-forward width
    int n_layers;
    int n_heads;    // query heads
    int n_kv_heads; // key/value heads (grouped-query when fewer than n_heads)
    int vocab_size;
    int seq_len;    // context length
    // Beyond llama2.c's header (Q8LM v2); config_defaults() gives llama2.c's values where 0.
    int head_dim;        // width of one head (dim / n_heads in llama2.c's models)
    float rope_theta;    // RoPE base (10000)
    float norm_eps;      // RMSNorm epsilon (1e-5)
    int qkv_bias;        // 1: the q, k and v projections add a bias (Qwen2)
    RopeScaling rope_scaling;
} Config;

// A config of llama2.c's seven header fields; the rest 0, which config_defaults fills in.
#define LLAMA2C_CONFIG(d, h, l, nh, nkv, v, s) \
    {.dim = (d), .hidden_dim = (h), .n_layers = (l), .n_heads = (nh), .n_kv_heads = (nkv), .vocab_size = (v), .seq_len = (s)}
void config_defaults(Config *c);   // head_dim, rope_theta, norm_eps where 0: llama2.c's
static inline int q_dim_of(const Config *c) { return c->n_heads * c->head_dim; }      // all query heads
static inline int kv_width_of(const Config *c) { return c->n_kv_heads * c->head_dim; }   // all key/value heads
// RoPE: the rotation frequency of each pair (2i, 2i+1) of a head, i < head_dim / 2, scaling applied.
void rope_frequencies(const Config *c, float *freq);

// One linear weight W (rows = out, cols = in); y = W x. Either FP32 (f) or INT8 (q, s).
// INT8: q is (rows, stride), stride = cols rounded up to ROW_ALIGN, padding zero;
//       s is (rows, groups): one FP32 scale per gs consecutive weights along the input (cols),
//       the last group of a row may be short. w[r][c] = q[r*stride + c] * s[r*groups + c/gs].
typedef struct {
    int rows, cols;
    int stride;
    int gs, groups;
    const float  *f;
    const int8_t *q;
    const float  *s;
    const void   *h;   // FP16 (rows, cols) dense: set only by the GPU's --fp16 baseline
} Mat;

typedef struct {
    Mat tok_embedding;                  // (vocab, dim): row t is token t's embedding
    Mat *wq, *wk, *wv, *wo;             // per layer: (dim, dim), (kv_dim, dim), (kv_dim, dim), (dim, dim)
    Mat *w1, *w2, *w3;                  // per layer: (hidden, dim), (dim, hidden), (hidden, dim)
    Mat wcls;                           // (vocab, dim); the embedding's storage when shared
    const float *bq, *bk, *bv;          // (layer, q_dim), (layer, kv_dim), (layer, kv_dim): biases, or NULL
    const float *rope_freq;             // (head_dim / 2) RoPE frequencies as the file gives them, or NULL:
                                        // rope_frequencies(cfg)
    const float *rms_att, *rms_ffn;     // (layer, dim)
    const float *rms_final;             // (dim)
} Weights;

typedef struct {
    Config cfg;
    int format;             // FMT_*
    int quantized;          // 1: linear weights are INT8
    int gs;                 // group size (INT8 only)
    int shared_classifier;  // 1: the classifier is the token embedding
    Weights w;
    void *map;              // the file's bytes: mapped read-only, or read into memory (LOAD_RESIDENT)
    size_t map_bytes;
    void *region;           // the mapping that holds them (munmap'd by free_model)
    size_t region_bytes;
    void *owned;            // weights the loader repacked (llama2.c v2), or NULL
    size_t owned_bytes;
    int version;            // Q8LM: 1 or 2
    // Q8LM v2: the tokenizer and special tokens (-1: none)
    const unsigned char *tokenizer;   // tokenizer_bytes of the tokenizer section (tokenizer.h), or NULL
    size_t tokenizer_bytes;
    int bos_id, eos_id, eot_id, add_bos, chat_template;
} Model;

// Checkpoint loading: 0 on success, else -1 with "path: what is wrong" in err. LOAD_MAPPED maps
// the file (its pages read as touched, shared with the page cache); LOAD_RESIDENT reads it whole
// into memory of its own in huge pages where the system gives them (the CPU executor's weights
// stream faster: bench/NOTES.md 52), if the file takes at most three quarters of the memory
// available, else maps it. load_model: LOAD_MAPPED.
enum { LOAD_MAPPED, LOAD_RESIDENT };
int  load_model_as(const char *path, Model *m, int how, char *err);
int  load_model(const char *path, Model *m, char *err);
void free_model(Model *m);
int  validate_config(const Config *c, char *why);   // 0 if sane, else reason in why
const char *format_name(int format);

// What a Q8LM file holds beyond its Config: the writer's choices, and version 2's extras.
typedef struct {
    int version;              // 1 or 2
    int gs;                   // INT8 group size
    int fp32;                 // v2: FP32 weights (quantize --fp32) instead of INT8
    int shared;               // the classifier is the embedding
    size_t tokenizer_bytes;   // v2: the tokenizer section's size (0: none)
    int bos_id, eos_id, eot_id, add_bos, chat_template;   // v2: -1 where the model has none
} Q8Spec;

// Q8LM layout: where each section lies in a file for this config. Writer and reader share it.
// With FP32 weights (v2) each matrix is one (rows, cols) float section at *_q, *_s unused.
typedef struct {
    size_t tok_q, tok_s;                  // embedding
    size_t rms_att, rms_ffn, rms_final;
    size_t q[7], s[7];                    // wq wk wv wo w1 w2 w3: (layer, rows, stride), (layer, rows, groups)
    size_t cls_q, cls_s;                  // unshared classifier
    size_t rope;                          // v2: (head_dim / 2) RoPE frequencies
    size_t bias[3];                       // v2, qkv_bias: (layer, q_dim), (layer, kv_dim), (layer, kv_dim)
    size_t tokenizer;                     // v2: tokenizer_bytes
    size_t total;                         // file size
} Q8Layout;
void q8_layout_spec(const Config *c, const Q8Spec *spec, Q8Layout *L);
void q8_header_spec(unsigned char hdr[HEADER_BYTES], const Config *c, const Q8Spec *spec);
enum { W_Q, W_K, W_V, W_O, W_1, W_2, W_3 };
void q8_layout(const Config *c, int gs, int shared, Q8Layout *L);
void linear_shape(const Config *c, int which, int *rows, int *cols);   // which: W_Q..W_3
size_t fp32_linear_floats(const Config *c, int which);                 // all layers' elements
int alloc_layer_mats(Weights *w, int n_layers);   // the 7 per-layer Mat arrays: one block, owned by w->wq
extern const char *const linear_names[7];

// Quantization of one row: groups of gs along the row, scale = max|w| / 127,
// q = round(w / scale) clamped to [-127, 127]; an all-zero group gets scale 0.
void quantize_row(const float *w, int cols, int gs, int8_t *q, float *s);
static inline int round_up(int x, int a) { return (x + a - 1) / a * a; }
static inline int ceil_div(int x, int a) { return (x + a - 1) / a; }

// Header writers (quantize.c, tests)
void q8_header(unsigned char hdr[HEADER_BYTES], const Config *c, int gs, int shared);

#endif
