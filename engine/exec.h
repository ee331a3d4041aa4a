// exec.h: the executor interface. One model, two executors: an executor answers one question,
// "logits for these tokens", through a table of operations (Ops). forward() (forward.c) is the
// model written once against Ops; the CPU executor (cpu.c) reads the host weights directly, the
// GPU executor (gpu.c) uploads them once into a device mirror of the same Weights struct.
#ifndef EXEC_H
#define EXEC_H

#include <stddef.h>

#include "model.h"

#define MAX_TOKENS 512   // tokens per forward call: prompts are prefilled in chunks of this many
#define MAX_SEQS 64      // sequences decoded together (--batch)

// Which tokens a forward call runs, and so what its M means for positions and KV caches.
//   ONE_SEQUENCE: M tokens of sequence 0 at positions pos .. pos + M - 1 (a prompt chunk, or one
//     token of a decode step).
//   ONE_TOKEN_PER_SEQUENCE: token m is sequence m's, every one at position pos (a --batch step);
//     sequence m's KV caches lie m x seq_cache_elems after sequence 0's.
typedef enum { ONE_SEQUENCE, ONE_TOKEN_PER_SEQUENCE } StepLayout;
typedef struct {
    StepLayout layout;
    int M, pos;
} Step;

// A linear layer's input: rows of x, or rmsnorm(x) * norm_w where norm_w is given (the RMSNorm
// before the layer). The executor decides whether to fold the norm into the matrix kernel or to
// run it first, into its scratch.
typedef struct {
    const float *x;
    const float *norm_w;   // (dim) or NULL
} Input;
static inline Input plain(const float *x) { return (Input){x, NULL}; }
static inline Input normed(const float *x, const float *norm_w) { return (Input){x, norm_w}; }

// Activations and the KV cache; host memory for the CPU executor, device memory for the GPU's.
typedef struct {
    float *x;                         // (MAX_TOKENS, dim): residual stream
    float *xb;                        // (MAX_TOKENS, max(dim, q_dim)): normed input / attention output
    float *q;                         // (MAX_TOKENS, q_dim), q_dim = n_heads * head_dim
    float *k, *v;                     // (MAX_TOKENS, kv_dim): the new tokens' keys and values
    float *hb, *hb2;                  // (MAX_TOKENS, hidden_dim)
    float *att;                       // CPU: (threads, seq_len) scores of one head, a row per thread
    float *logits;                    // (MAX_TOKENS, vocab)
    // (n_seqs, layer, seq_len, kv_dim): FP32 on the CPU; on the GPU FP16, or FP32 with --kv-fp32.
    // seq_len is the executor's context (cfg.seq_len, which batch runs may shorten).
    void *key_cache, *value_cache;
} RunState;

// What a step starts with: the executor runs the ops forward() calls next, or it already ran the
// whole step itself (the GPU replaying a captured graph), and forward() calls nothing more.
typedef enum { RUN_THE_OPS, STEP_ALREADY_RAN } StepStart;

// The operations forward() is written against. Positions and token ids are passed on every call;
// the GPU executor keeps them in device memory (set by begin), so that a step captured as a CUDA
// graph replays at any position.
typedef struct Exec Exec;
typedef struct {
    const char *name;
    // Optional: called first with the step's tokens (checked ids).
    StepStart (*begin)(Exec *e, const int *tokens, const Step *st, int all_logits);
    void (*end)(Exec *e);                                               // optional: called last
    void (*embed)(Exec *e, const int *tokens, int M);                   // x = rows of the embedding
    // out (M, rows) = in (M, cols) W^T; with accumulate, out += that instead (the residual add)
    void (*matmul)(Exec *e, float *out, Input in, int M, const Mat *w, int accumulate);
    // q, k, v (the state's) = in W^T for the three attention weights of a layer, then RoPE on q
    // and k at the step's positions, and k and v stored in the layer's cache rows. (The GPU's fused
    // path does it all in one launch.)
    void (*qkv)(Exec *e, int layer, Input in, const Step *st, const Mat *wq, const Mat *wk, const Mat *wv);
    // hb = silu(in w1^T) * (in w3^T): the feed-forward's first half (one launch on the GPU)
    void (*ffn_up)(Exec *e, Input in, int M, const Mat *w1, const Mat *w3);
    void (*attention)(Exec *e, int layer, const Step *st);              // xb = attention of q over the cache
    // in as plain rows: the input itself, or its RMSNorm written into the executor's scratch (xb)
    const float *(*apply_norm)(Exec *e, Input in, int M);
    const float *(*to_host)(Exec *e, const float *logits, int rows);   // logits readable by the host
    int (*argmax)(Exec *e, const float *logits);                        // greedy token of one row
    void (*argmax_rows)(Exec *e, const float *logits, int rows, int *out);   // greedy tokens of rows (a batch)
    // Optional: sampled tokens of rows (at most MAX_SEQS) by llama2.c's procedure, coins[r] row r's
    // draw: 0, or -1 (nothing done) where the executor cannot and the host must.
    int (*sample_rows)(Exec *e, const float *logits, int rows, float temperature, float topp, const float *coins, int *out);
    // Optional: greedy decoding from logits (of position pos) on, pipelined by the executor itself.
    // Each token goes to on_token (non-zero stops with -1); stops after BOS or at position steps.
    // Returns the tokens generated, -1, or NOT_PIPELINED where the caller should loop itself.
    int (*decode_greedy)(Exec *e, const float *logits, int pos, int steps, int (*on_token)(void *ctx, int token), void *ctx);
    // Copies sequence 0's KV cache rows 0..rows-1 (every layer) to every other sequence: a prompt
    // prefilled once for a batch
    void (*copy_cache)(Exec *e, int rows);
    // Appends what the executor ran (for the statistics line), e.g. the linear kernels it chose.
    void (*describe_run)(const Exec *e, char *buf, size_t n);
    void (*release)(Exec *e);
} Ops;
#define NOT_PIPELINED -2

struct Exec {
    const Ops *ops;
    char desc[640];     // the path and its options, for the statistics line
    Config cfg;
    int kv_bytes;       // bytes per KV cache element: 4 (FP32) or 2 (FP16)
    int n_seqs;         // sequences with a KV cache each (--batch)
    const Weights *w;   // host weights (CPU) or their device mirror (GPU)
    RunState s;
    void *priv;         // executor-private state (GPU)
};

// forward runs tokens[0..M) of sequence 0 at positions pos..pos+M-1; forward_batch runs one token
// of each of B sequences, all at position pos (M <= MAX_TOKENS, B <= n_seqs, positions within the
// context; ids are checked). Both return the executor's logits buffer: M rows of vocab_size when
// all_logits (always for a batch), else one row, the last token's.
const float *forward(Exec *e, const int *tokens, int M, int pos, int all_logits);
const float *forward_batch(Exec *e, const int *tokens, int B, int pos);

// ---- shared by the executors (forward.c)

// KV cache geometry: a sequence's cache is n_layers blocks of seq_len rows of kv_dim elements,
// kv_bytes each.
size_t kv_dim_of(const Config *p);
size_t layer_rows_bytes(const Exec *e, int rows);   // one layer's first `rows` positions
size_t seq_cache_elems(const Exec *e);              // one sequence's whole cache, in elements
void *layer_cache(const Exec *e, void *cache, int layer);   // the layer's slice (sequence 0's)
// Token m's position, and the offset (elements) of its sequence's cache for a layer.
int token_pos(const Step *st, int m);
size_t cache_offset(const Exec *e, const Step *st, int layer, int m);
// Elements between two sequences' caches in this step's layout (0: one sequence).
size_t step_seq_stride(const Exec *e, const Step *st);

// Sizes of the RunState buffers, in floats; cache: one sequence's.
typedef struct {
    size_t x, xb, q, kv, hidden, logits, cache;
} StateSizes;
StateSizes state_sizes(const Config *p);
// kv_bytes: bytes per KV cache element (4: FP32, 2: FP16); n_seqs caches.
void alloc_state(RunState *s, const Config *p, int kv_bytes, int n_seqs, void *(*alloc)(size_t bytes));
// The model's config with the context shortened to `context` (1..seq_len; 0 keeps it).
Config exec_config(const Model *m, int context);
// The linear weights: the 7 per-layer arrays (one block) and the classifier.
int n_linear(const Config *c);
Mat *linear_at(Weights *w, const Config *c, int i);
// Calls copy(dst, src, bytes) for each layer's first rows of both caches, sequence 0 to the rest.
void for_each_cache_copy(Exec *e, int rows, void (*copy)(Exec *e, void *dst, const void *src, size_t bytes));
// q, k, v as three linear layers through the executor's own matmul, the input normed once.
void qkv_by_matmul(Exec *e, int layer, Input in, const Step *st, const Mat *wq, const Mat *wk, const Mat *wv);
// Weight bytes one decode step reads (scales included; the KV cache apart); fp16: the linear
// weights as the --fp16 path holds them.
size_t weight_bytes_per_token(const Model *m, int fp16);

// ---- the executors

// n_seqs KV caches of `context` positions (0: the model's).
void cpu_exec_init(Exec *e, const Model *m, int n_seqs, int context);
// Prompt chunks of INT8 models on the int8 x int8 matmul (vec.h: x quantized, an approximation)
// where the CPU has it (run --int8-prefill); off after cpu_exec_init (the reference arithmetic).
void cpu_exec_int8_prefill(Exec *e, int on);

typedef enum { PATH_FUSED, PATH_UNFUSED, PATH_FP16 } GpuPath;
#define GPU_AUTO -1            // an option the executor sets from the model's size (dispatch.c)
#define GPU_WHERE_IT_FITS 2    // a step kernel the executor tries, silently not used where it cannot run
typedef struct {
    GpuPath path;       // how INT8 linear layers run (FP32 checkpoints: cuBLAS FP32, or FP16 with PATH_FP16)
    int use_graph;      // capture each step (a decode step, a batch step) once as a CUDA graph, then replay it
    int kv_half;        // FP16 KV cache (else FP32)
    int pdl;            // programmatic dependent launch between kernels: 1, 0, or GPU_AUTO
    int tensor_cores;   // batches of tokens on the tensor-core kernels where the group size allows
    int n_seqs;         // KV caches for this many sequences (--batch; 0 = 1)
    int context;        // their length (0 = the model's seq_len)
    int tma_gemv;       // decode GEMVs fed by the copy engine (where the GPU has it): 1, 0, or GPU_AUTO
    int no_norm_fold;   // every RMSNorm as its own kernel (else folded into the GEMV after it)
    int host_sample;    // sampled tokens drawn on the host (else on the GPU)
    int megakernel;     // a decode step as one persistent kernel (INT8, fused path): 1, 0, or GPU_AUTO
    int cluster_step;   // a small model's decode step on one thread-block cluster (INT8, fused path): 1, 0, GPU_AUTO, or GPU_WHERE_IT_FITS
} GpuOptions;
// The defaults: what run does without options.
#define GPU_DEFAULTS                                                                                              \
    (GpuOptions) {                                                                                                \
        .path = PATH_FUSED, .use_graph = 1, .kv_half = 1, .pdl = GPU_AUTO, .tensor_cores = 1, .n_seqs = 0,        \
        .context = 0, .tma_gemv = GPU_AUTO, .no_norm_fold = 0, .host_sample = 0, .megakernel = GPU_AUTO,         \
        .cluster_step = GPU_AUTO                                                                                  \
    }
#define GPU_UNAVAILABLE -1   // gpu_exec_init: no usable GPU; the caller may use the CPU
#define GPU_TOO_SMALL -2     // the model does not fit; an error
// Uploads the model and allocates the state on the GPU: 0, or one of the codes above with the
// reason in why (ERR_LEN).
int gpu_exec_init(Exec *e, const Model *m, GpuOptions opt, char *why);
// 0 where a GPU this build can use is present, else GPU_UNAVAILABLE with the reason in why.
int gpu_usable(char *why);

#endif
