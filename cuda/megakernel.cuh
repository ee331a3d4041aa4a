// megakernel.cuh: a whole decode step (one token) in one persistent kernel (sm_90a), then its
// host side. The decode path of INT8 models from about 70 MB of weights (engine/dispatch.c);
// bench/NOTES.md 41, 46, 49, 51, 56, 62, 63, 66, 69, 71, 72, 74, 75, 76, 81, 84, 86, 91, 94, 95, 97,
// 98, 99, 100, 101, 103, 104, 105, 108 and 109 have each design step and where the time goes.
//   mega_kernel                     one block per SM: pipes of a producer warp and consumer warps,
//                                   each pipe taking every kMkPipes-th tile of the block's ring;
//                                   compiled for any model (MkAnyShape) and, with only the paths
//                                   it takes, for heads and groups of 128 (MkShape128)
//   MkStage, MkParams               the schedule: stages (embedding, linear layers, attention and
//                                   its combine step) in the order of the step
//   mk_pack_kernel                  the linear stages' weights copied at load into the order and
//                                   MMA fragment layout the ring takes them (a tile: one copy)
//   mk_keep_residual, mk_flags      the schedule's hand-overs, set on the host: the residual
//                                   stream's rows a block keeps; the activations that go over
//                                   as tagged pairs of values instead of through counters
//   gpu_mega_create, gpu_mega_launch, gpu_mega_free
//
// The weights of a step do not depend on its activations, only the arithmetic does. So each
// block owns a fixed list of weight tiles, the same rows of the same matrices at every step, and
// its producer warps stream them (from a copy of the weights laid out in that order) through a
// ring of shared-memory slots with bulk copies (the copy engine), in the step's order, without
// ever waiting for an activation: only for a free slot. The next matrix's first tiles are then in
// flight while the current one finishes, in every block.
// Consumers wait where the arithmetic needs it: before a stage, until the stage before it has
// counted all its units done in a counter in global memory (no grid-wide barrier), or, where a
// linear stage's x is all written by the stage before it (the residual stream, the SwiGLU's
// output, the attention's), until each element of x it loads carries that stage's flag
// (mk_flags); a block with no unit in a stage goes straight on. Small work (the embedding row,
// attention and the combine of its splits) is spread over the blocks as units of its own stage
// (the combine: by the last split's block, mk_combine_if_last), or, in the kernel for heads of
// 128, up to kMkSliceRows positions by the QKV stage's units themselves, one head's slice of q,
// k and v each (mk_slice_qkv, mk_slice_attention); RMSNorm, RoPE, the KV store,
// biases, residual adds and SwiGLU are folded into the linear stages as in the per-matrix GEMVs.
// The greedy argmax is the step's last work (mk_unit_best, mk_step_argmax): no kernel runs between
// two steps, and the token reaches the host without a copy in the stream (bench/NOTES.md 105).
//
// Arithmetic: a stage stages its x once as three int8 digits an element in the weights' groups
// (MkX: x to within about 1e-7 of its group's largest element), so that a tile's products are
// int8 x int8 on the tensor cores (mma m16n8k32, exact in int32) and only each group's sums are
// scaled in FP32: a few instructions per 512 weights, where the per-matrix GEMV spends 3 a weight.
//
// Deadlock: every block is resident (one per SM, checked on the host), stages are worked in one
// order by every block, and a consumer waits only on earlier stages, whose units never wait on a
// later stage; a producer waits only on its own copies and its own block's consumers, which take
// tiles in the order the producers issued them.
//
// Memory: activations written by other SMs during the kernel are read through L2 (ld.global.cg:
// __ldcg), never through L1, which is not coherent; a stage's writes are published by a barrier of
// the block's consumers, then one thread's release add to the stage's counter (and read after an
// acquire load of the counter and a barrier); flagged elements go two to an 8-byte word with
// their writer's tag in their low bits (mk_store_pair), stored and loaded by single-copy atomic
// accesses at gpu scope.
//
// Build-time knobs (-D, as `make tune-variant TUNE_DEFS=...` passes them): MK_SLOTS (ring slots at
// most), MK_PIPES (producer/consumer pipes a block), MK_GROUP_WARPS (consumer warps a pipe),
// MK_COLS (tile columns), MK_BLOCKS (blocks an SM), MK_EVICT_FIRST, MK_ROPE_EARLY, MK_X_QUADS,
// MK_X_FIT, MK_MIN_CHUNK, MK_NO_CVT, MK_KEEP_RESIDUAL, MK_FLAGS, MK_FLAG_BACKOFF, MK_FLAGGED_QUADS,
// MK_IN_FLIGHT, MK_IN_FLIGHT_DEEP, MK_FAST_U, MK_GROUP_SELECT, MK_ATTN_WIDE, MK_REGS, MK_ACCS,
// MK_LAST_COMBINES, MK_ATTN_FLAGS, MK_L2_AHEAD, MK_X_PARTS, MK_UNIT_ROWS, MK_SLICES,
// MK_SLICE_BACKOFF; for measurement only,
// MK_STEP_CLOCK (%globaltimer at each step's kernel entry, after its consumers' PDL wait and when
// its last block is out: the gap between steps, printed at the end), MK_TRACE (per-stage
// timestamps, printed after the 101st launch of an ungraphed run, with the time the tile loops
// waited for their tiles; with MK_TRACE_MATH as well, each consumer warp's cycles in
// the tile loops and the units' barriers: MkWarpClock), MK_NO_MATH (the ring streamed, nothing
// computed), MK_NO_FINISH (no unit's rows finished), MK_NO_WAIT (no stage waits for the one
// before), MK_NO_COPY (no weights copied: the slots handed to the consumers as they are),
// MK_NO_ATTN (each attention unit writes its output, zeros, at once, and loads nothing),
// MK_NO_COMBINE (a head's splits never combined; with MK_FREE=wo) and MK_FREE (the hand-overs
// into the stages that the environment variable MK_FREE names not waited for, nor counted by
// the stages before them: mk_free), all wrong results; MK_GRID (the step on
// that many blocks at most, the other SMs idle), MK_L2_ROLES (the stages that ask L2 for their
// tiles past the ring: mk_ask_l2) and MK_PAD_SMEM (bytes of shared memory a block asks for beyond
// its own: the SM's carveout, and so its L1, for a ring and x unchanged).
// Ring slots at most (MK_SLOTS, default 20: five a pipe): as many as fit beside the largest x
// (gpu_mega_create takes a pipe's off until they fit). Slack for the stream while a block's
// consumers are between matrices; small slots give more of it in the same shared memory
// (bench/NOTES.md 91, 94). 16 were slower, and 24 too where x left room for them: they took the
// block past the SM's 196 KB carveout, and with it most of the L1 (bench/NOTES.md 103).
#ifndef MK_SLOTS
#define MK_SLOTS 20
#endif
#ifndef MK_PAD_SMEM
#define MK_PAD_SMEM 0
#endif
// MK_X_PARTS (default 2; 1: never): the most parts a long x is split into (mk_split_long_x; each
// part is a stage, and more than two cost more than the L1 they win: bench/NOTES.md 104).
#ifndef MK_X_PARTS
#define MK_X_PARTS 2
#endif

namespace {

// Pipes: a producer warp and a group of MK_GROUP_WARPS consumer warps each, taking every
// kMkPipes-th tile of the ring (one producer could not keep a block's ring full; four pipes of two
// consumer warps stream best: bench/NOTES.md 41, 46).
#ifndef MK_PIPES
#define MK_PIPES 4
#endif
#ifndef MK_GROUP_WARPS
#define MK_GROUP_WARPS 2
#endif
constexpr int kMkPipes = MK_PIPES, kMkGroupThreads = 32 * MK_GROUP_WARPS, kMkConsumers = kMkGroupThreads * kMkPipes;
constexpr int kMkConsumerWarps = kMkConsumers / 32, kMkThreads = kMkConsumers + 32 * kMkPipes;
#ifndef MK_BLOCKS
#define MK_BLOCKS 1
#endif
// MK_IN_FLIGHT (default 1; 0: as many as the pipe's slots): a producer copies a tile only once
// its tile MK_IN_FLIGHT before has landed. The bytes the grid has in flight are a queue in front
// of every L2 access: halved, the hand-overs at the stage boundaries wait less behind the weights'
// stream, which still keeps DRAM busy (bench/NOTES.md 66).
#ifndef MK_IN_FLIGHT
#define MK_IN_FLIGHT 1
#endif
// MK_IN_FLIGHT_DEEP (default 2; MK_IN_FLIGHT for the A/B): the copies a pipe keeps in flight for a
// stage's tiles past the ring's depth (a block's tiles of the stage from p.slots on), which it
// copies only after its consumers have begun the stage: its hand-over (x staged) is then behind it,
// and the next one's far ahead, so that more bytes in flight speed the stream without queueing
// in front of a hand-over's accesses (bench/NOTES.md 98).
#ifndef MK_IN_FLIGHT_DEEP
#define MK_IN_FLIGHT_DEEP 2
#endif
// MK_EVICT_FIRST (default on; 0 for the A/B): the weights' copies marked first to leave L2, so
// that the activations, norm weights and KV cache stay there (bench/NOTES.md 51).
#ifndef MK_EVICT_FIRST
#define MK_EVICT_FIRST 1
#endif
// Ring slots: a multiple of the pipes, so that a slot is always the same pipe's (its producer then
// reuses it only after its own consumers freed it, and no barrier wait can be two phases behind,
// which the parity waits could not tell from one); two a pipe at least.
constexpr int kMkMaxSlots = MK_SLOTS / MK_PIPES * MK_PIPES, kMkMinSlots = 2 * MK_PIPES, kMkBlocksPerSm = MK_BLOCKS;
// A tile: kMkRows rows (an integer MMA's 16) x kMkCols columns, held in the MMA's fragment order
// (MkPack): a consumer warp takes kMkSpan columns of it, kMkSteps MMA steps of 32, each step's 512
// bytes in one 16-byte load a lane. MK_COLS (default 512: 8 KB tiles; 1024 paid where the tile
// loop's every tile cost more, bench/NOTES.md 66, 91, 94).
#ifndef MK_COLS
#define MK_COLS 512
#endif
constexpr int kMkRows = 16, kMkCols = MK_COLS, kMkStepBytes = kMkRows * 32, kMkTileBytes = kMkRows * kMkCols;
constexpr int kMkSpan = kMkCols / (kMkGroupThreads / 32), kMkSteps = kMkSpan / 32;
static_assert(kMkSpan % 32 == 0, "a warp's columns: whole MMA steps");
static_assert(kMkCols % 128 == 0, "x staged a warp's 128 elements at a time, all within xpad or all past it");
// x staged in batches of float4 a consumer thread, its loads all in flight at once: as many as x
// needs up to MK_X_QUADS (a larger x without a norm: in one batch of MK_X_QUADS), else batches
// of 8 (with a norm, whose weights double the registers; 16 a batch were slower: bench/NOTES.md
// 51). MK_X_FIT 0: always batches of 8.
#ifndef MK_X_QUADS
#define MK_X_QUADS 12
#endif
#ifndef MK_X_FIT
#define MK_X_FIT 1
#endif
// Flagged x (MK_FLAGS, mk_flags): a thread sleeps MK_FLAG_BACKOFF ns before it loads again the
// elements not yet there (without, 132 blocks' polls slowed the small models: bench/NOTES.md 63),
// and holds at most MK_FLAGGED_QUADS of them a batch (two 8-byte words each).
#ifndef MK_FLAG_BACKOFF
#define MK_FLAG_BACKOFF 400
#endif
#ifndef MK_FLAGGED_QUADS
#define MK_FLAGGED_QUADS 4
#endif
// Attention rows per split: at least kMkMinChunk (more than one split costs the combine stage; 256
// against 512: bench/NOTES.md 62), at most kMkMaxChunk (a long context spread over more blocks;
// the last rule wins).
#ifndef MK_MIN_CHUNK
#define MK_MIN_CHUNK 256
#endif
constexpr int kMkMinChunk = MK_MIN_CHUNK, kMkMaxChunk = 1024;
// MK_LAST_COMBINES (default on; 0 for the A/B): a head's splits combined by the block whose split
// lands last, inside the attention stage, instead of by a combine stage after it: one hand-over
// fewer a layer where the attention splits (bench/NOTES.md 97).
#ifndef MK_LAST_COMBINES
#define MK_LAST_COMBINES 1
#endif
// MK_ATTN_FLAGS (default on, with MK_LAST_COMBINES; 0 for the A/B): the attention's output goes
// to the output projection flagged (mk_flags) instead of through the attention stage's count.
#ifndef MK_ATTN_FLAGS
#define MK_ATTN_FLAGS 1
#endif
// MK_SLICES (default on; 0 for the A/B: the heads-of-128 kernel's QKV stage in units of head
// slices, which take the attention of short contexts themselves, mk_slice_qkv and
// mk_slice_attention; bench/NOTES.md 108): a unit is
// one head's kMkSliceW dimensions of q, k and v; the head's kMkSliceLanes units exchange their
// parts of the scores of every row (tagged, in p.scores), and each finishes the softmax and its
// dimensions of the output. Up to kMkSliceRows rows (positions) a step; past them the step's
// attention stage runs as without.
#ifndef MK_SLICES
#define MK_SLICES 1
#endif
// MK_SLICE_BACKOFF: ns a thread sleeps before it loads again the parts of scores not yet there.
#ifndef MK_SLICE_BACKOFF
#define MK_SLICE_BACKOFF 64
#endif
constexpr int kMkSliceW = 32, kMkSliceLanes = kMkSliceW / 8, kMkSliceRows = 256;
constexpr int kMkSliceRowsAt = kMkConsumers / kMkSliceLanes, kMkSlicePasses = kMkSliceRows / kMkSliceRowsAt;
static_assert(kMkSliceRows % kMkSliceRowsAt == 0, "a slice's rows: whole passes of the block");
// An attention unit's shared memory: each consumer warp's running softmax (mk_attention_warps);
// the combine step's split weights.
constexpr int kMkAttnFloats = kMkConsumerWarps * (2 + kMaxHeadSize) > kMaxSplits ? kMkConsumerWarps * (2 + kMaxHeadSize) : kMaxSplits;
enum { MK_EMBED, MK_GEMV, MK_ATTENTION, MK_COMBINE };
// The consumers' paths compiled for one shape, the code of every other left out: the kernel's
// code is large, and with less of it the same step runs faster (bench/NOTES.md 95). kHs: the head
// size (the FP16 cache's wide attention); kGroupSteps: a weight group's MMA steps (mk_group_steps);
// kXQuads: the float4 a consumer thread holds a batch of x (mk_x_quads). 0 (kGroupSteps -1): any,
// chosen at run time.
template <int kHs, int kGroupSteps, int kXQuads>
struct MkShape {
    static constexpr int hs = kHs, group_steps = kGroupSteps, x_quads = kXQuads;
    // log2 of the group size where kGroupSteps tells it (groups narrower than a warp's columns), or 0
    static constexpr int gshift = kGroupSteps > 0 && kGroupSteps < kMkSteps ? 5 + (kGroupSteps >= 2) + (kGroupSteps >= 4) : 0;
};
using MkAnyShape = MkShape<0, -1, 0>;
// Heads of 128, groups of 128, x of 2,049-4,096 elements (Llama-2-7B's, Llama-3-8B's and their
// kin's; the longer w2's, flagged, in batches of 4 as well): mk_takes_shape128.
using MkShape128 = MkShape<128, 4, 4>;

struct MkStage {
    int kind;
    int units;          // EMBED, GEMV (fixed); ATTENTION and COMBINE: from the position
    int pair, norm;     // GEMV: w1 and w3 with the SwiGLU; RMSNorm folded (a.norm_w)
    Q8Args a;           // GEMV: a.tma_rows rows of one output a unit
    int units_of[3];    // GEMV: units of each output (in order)
    const unsigned char *pack;   // GEMV: its weights as MkPack records, in the ring's order
    int keep;           // GEMV adding to the residual stream: 1 its rows from L2, 2 from the block's kept copy
                        // (either way kept after), 0 not kept (mk_finish_kept)
    // Hand-overs with flags (MK_FLAGS, mk_flags): ll_in (GEMV): x's elements as tagged pairs
    // (mk_store_pair), written by stage ll_from; ll_out (GEMV, EMBED): where its output goes instead
    // of y (or x), tagged. Their writes' places in their buffers' writes of a step (ll_seq_*; prev:
    // the write whose values of ll_out a keep == 1 stage reads first), and how many writes each
    // buffer has a step (ll_writes_*): the tags (mk_tag).
    uint2 *ll_in, *ll_out;
    int ll_from;
    int ll_seq_in, ll_seq_out, ll_seq_prev, ll_writes_in, ll_writes_out;
    int ll_counted;     // GEMV with ll_in: waits for the stage before's count as well (mk_tags_reach)
    int wait, count;    // whether it waits for the stage before it; whether its units are counted
#ifdef MK_FREE
    int free_x;         // GEMV: x staged without waiting for its tags (mk_free)
#endif
    // EMBED: x (dim) = row inputs[1] of the embedding (INT8 with scales, or FP32)
    const int8_t *eq;
    const float *es, *ef;
    int estride, egroups, egs, dim;
    float *x;
    // ATTENTION: out, or the splits' partials, of q over the layer's caches; COMBINE: out
    const float *q;
    const void *kc, *vc;
    float *out;
    // GEMV (set on the host, read by mk_pack_kernel only): x is columns x_off .. x_off + a.K - 1 of
    // an x of x_len (mk_split_long_x; else 0 and a.K); the matrix's rows are src_stride bytes and
    // src_groups scales apart (a.stride and a.groups: the stage's own columns)
    int x_off, x_len, src_stride, src_groups;
    // QKV as head slices (mk_slice_qkv): slice: GEMV, the slice's width (its unit: the slice's q, k
    // and v rows, kMkSliceW each), 0 if not; ATTENTION: the same, its QKV's (last: the other
    // fields at their offsets without it, with which the small shapes measured faster than with
    // it next to kind; bench/NOTES.md 108). sl_q: q (n_heads * head size), for the attention stage
    // where the step's rows are too many for the slices; sl_out: the attention's output, flagged
    // (its tag: write sl_tag_seq of sl_tag_writes a step); sl_seq: the stage's place among the
    // step's sl_writes sliced stages (the scores' tags, mk_slice_tag).
    float *sl_q;
    uint2 *sl_out;
    int sl_tag_seq, sl_tag_writes, sl_seq, sl_writes;
    int slice;
};

// A classifier unit's first largest logit and its index (mk_unit_best).
struct MkBest {
    float v;
    int i;
};
struct MkParams {
    const MkStage *stages;
    int n_stages;
    unsigned *counters;    // (n_stages + 2 + n_heads): units done per stage, then blocks finished (zero between
                           // steps), then the step's epoch (mk_tag), then each head's splits counted
                           // (mk_combine_if_last; zero between steps)
    int *inputs;           // the step's position, then its token (the next step's, fed by the argmax)
    MkBest *best;          // (the classifier's units) each unit's largest logit, or NULL: no argmax
    int *argmax;           // the step's greedy token (as gpu_argmax's), with best
    unsigned long long *step_tokens;   // (2) mapped host memory: that token, (pos + 1) << 32 | token, in slot pos % 2
    float *part;           // (n_heads, kMaxSplits, 2 + head_size): the attention's partial results
    int n_heads, n_kv_heads, head_size;
    int slots;             // ring slots: a tile of weights (kMkTileBytes), then its group scales
    int slot_bytes;        // kMkTileBytes + the scales of kMkRows rows of the smallest group size
    int scratch_bytes;     // x staged for a linear stage (MkX), or one attention unit's floats
    int sums_floats;       // (consumer warps, rows) of a linear unit's row sums
    int keep_floats;       // the block's rows of the residual stream, kept (mk_finish_kept), rounded up to 4
    unsigned long long *trace;   // -DMK_TRACE: (blocks, n_stages, kMkStamps) %globaltimer stamps, else NULL
    unsigned long long *warp_trace;   // -DMK_TRACE_MATH: (blocks, n_stages, consumer warps, kMkWarpTimes) cycles (MkWarpClock)
    uint2 *scores;         // (n_heads, head_size / kMkSliceW, kMkSliceRows) the slices' partial scores, tagged (mk_slice_qkv), or NULL
};

// -DMK_TRACE (a build for measurement only): block thread 0's clock at a stage's start (k = 0),
// after its wait (1), after x is staged (2), at its end (3); within a linear stage when its first
// loads of x have landed (4: mk_stamp_after, ordered after the value `after`), when its digits are
// stored (5), when every consumer's tiles are done (6) and the rows finished (7); not stamps but
// durations: the time its tile loop waited for tiles to land (8), of it for each unit's first (9).
constexpr int kMkStamps = 10;
__device__ __forceinline__ unsigned long long &mk_trace_at(const MkParams &p, int stage, int k) {
    return p.trace[((size_t)blockIdx.x * p.n_stages + stage) * kMkStamps + k];
}
__device__ __forceinline__ void mk_stamp_after(const MkParams &p, int stage, int k, float after) {
#ifdef MK_TRACE
    if (threadIdx.x == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "f"(after));
        mk_trace_at(p, stage, k) = t;
    }
#else
    (void)p, (void)stage, (void)k, (void)after;
#endif
}
__device__ __forceinline__ void mk_stamp(const MkParams &p, int stage, int k) { mk_stamp_after(p, stage, k, 0.0f); }
__device__ __forceinline__ unsigned long long mk_clock() {
    unsigned long long t = 0;
#ifdef MK_TRACE
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
#endif
    return t;
}
// Adds d to duration k of the stage (thread 0; MK_TRACE).
__device__ __forceinline__ void mk_stamp_add(const MkParams &p, int stage, int k, unsigned long long d) {
#ifdef MK_TRACE
    if (threadIdx.x == 0) mk_trace_at(p, stage, k) += d;
#else
    (void)p, (void)stage, (void)k, (void)d;
#endif
}

__host__ __device__ __forceinline__ int ceil_div_dev(int a, int b) { return (a + b - 1) / b; }

// -DMK_TRACE_MATH (with MK_TRACE): each consumer warp's cycles in a linear stage's units, summed
// over them (lane 0 into p.warp_trace: (blocks, n_stages, consumer warps, kMkWarpTimes)): the
// unit's start (its sums zeroed, the barrier), the tile loop (from the start's barrier to its
// exit, the waits included), of it the waits for tiles to land, and the end (the last flush and
// the barrier after it, where a warp waits for the block's slowest); and the warp's tiles. Clock
// reads only around loops and barriers, which the compiler cannot move work across.
constexpr int kMkWarpTimes = 5;
struct MkWarpClock {
    enum { kStart, kLoop, kWaits, kEnd, kTiles };
#if defined(MK_TRACE) && defined(MK_TRACE_MATH)
    long long n[kMkWarpTimes] = {0, 0, 0, 0, 0}, at = 0, loop = 0, wait = 0;
    __device__ void start() { at = clock64(); }
    __device__ void started() { loop = clock64(), n[kStart] += loop - at; }
    __device__ void waiting() { wait = clock64(); }
    __device__ void waited() { n[kWaits] += clock64() - wait, n[kTiles]++; }
    __device__ void looped() { at = clock64(), n[kLoop] += at - loop; }
    __device__ void ended() { n[kEnd] += clock64() - at; }
    __device__ void add(const MkParams &p, int stage) const {
        if (threadIdx.x % 32) return;
        const size_t at_warp = ((size_t)blockIdx.x * p.n_stages + stage) * kMkConsumerWarps + threadIdx.x / 32;
        unsigned long long *e = p.warp_trace + at_warp * kMkWarpTimes;
        for (int k = 0; k < kMkWarpTimes; k++) e[k] += n[k];
    }
#else
    __device__ void start() {}
    __device__ void started() {}
    __device__ void waiting() {}
    __device__ void waited() {}
    __device__ void looped() {}
    __device__ void ended() {}
    __device__ void add(const MkParams &, int) const {}
#endif
};

__device__ __forceinline__ void consumer_sync() { Team<kMkConsumers>::sync(); }   // every warp but the producers

__device__ __forceinline__ unsigned load_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Splits of the attention at position pos: as many (head, split) units as the grid has blocks at
// most (more would give some blocks two units: the stage twice as long), each of kMkMinChunk rows
// or more, kMkMaxChunk or fewer (the last rule wins).
__device__ __forceinline__ int mk_splits(int pos, int n_heads) {
    const int rows = pos + 1;
    int s = min(max(1, (int)gridDim.x / n_heads), ceil_div_dev(rows, kMkMinChunk));
    s = max(s, ceil_div_dev(rows, kMkMaxChunk));
    return max(1, min(s, kMaxSplits));
}

__device__ __forceinline__ int mk_units(const MkStage &st, int splits, int n_heads) {
    if (st.kind == MK_ATTENTION) return n_heads * splits;
    if (st.kind == MK_COMBINE) return splits > 1 && !MK_LAST_COMBINES ? n_heads : 0;
    return st.units;
}

// This block's units of a stage: blockIdx.x, + gridDim.x, ...
__device__ __forceinline__ int my_units(int units) {
    return units > (int)blockIdx.x ? ceil_div_dev(units - blockIdx.x, gridDim.x) : 0;
}

// Unit u of a linear stage: its output, rows and tiles (as q8_gemv_tma_kernel's block).
__device__ TmaBlock mk_unit(const MkStage &st, int u) {
    TmaBlock b;
    b.j = 0;
    while (b.j < 2 && u >= st.units_of[b.j]) u -= st.units_of[b.j], b.j++;
    b.lrow0 = u * st.a.tma_rows;
    b.lrows = min(st.a.tma_rows, st.a.out[b.j].N - b.lrow0);
    b.prows = st.pair ? 2 * b.lrows : b.lrows;
    b.col_tiles = ceil_div_dev(st.a.stride, kMkCols);
    b.tiles = ceil_div_dev(b.prows, kMkRows) * b.col_tiles;
    return b;
}

// A unit's physical rows (pair mode: w1 r, w3 r, w1 r + 1, ...) in the row-major matrices.
// A sliced QKV unit's (mk_slice_rows): slice rows of q from q0, of k from q1, of v from q2.
struct MkRows {
    const int8_t *q0, *q1, *q2 = nullptr;   // row lrow0 of the output, or of w1 and of w3
    const float *s0, *s1, *s2 = nullptr;
    int stride, groups, pair, slice = 0;
    __device__ const int8_t *q(int p) const {
        if (slice) return (p < slice ? q0 : p < 2 * slice ? q1 : q2) + (size_t)(p % slice) * stride;
        return pair ? (p & 1 ? q1 : q0) + (size_t)(p >> 1) * stride : q0 + (size_t)p * stride;
    }
    __device__ const float *s(int p) const {
        if (slice) return (p < slice ? s0 : p < 2 * slice ? s1 : s2) + (size_t)(p % slice) * groups;
        return pair ? (p & 1 ? s1 : s0) + (size_t)(p >> 1) * groups : s0 + (size_t)p * groups;
    }
};
__device__ MkRows mk_rows(const MkStage &st, const TmaBlock &b) {
    MkRows r;
    r.pair = st.pair, r.stride = st.src_stride, r.groups = st.src_groups;
    const Q8Out &o0 = st.pair ? st.a.out[0] : st.a.out[b.j], &o1 = st.a.out[1];
    r.q0 = o0.q + (size_t)b.lrow0 * r.stride, r.s0 = o0.s + (size_t)b.lrow0 * r.groups;
    r.q1 = r.pair ? o1.q + (size_t)b.lrow0 * r.stride : r.q0, r.s1 = r.pair ? o1.s + (size_t)b.lrow0 * r.groups : r.s0;
    return r;
}

// Groups of a tile row in its slot's scales: a group size of kMkCols or more has one there.
__host__ __device__ __forceinline__ int mk_groups_a_row(int gs) { return gs < kMkCols ? kMkCols / gs : 1; }

// The MMA steps of 32 columns a weight group takes (0: groups of 16), at most a warp's kMkSteps.
__host__ __device__ __forceinline__ int mk_group_steps(int gs) { return gs == 16 ? 0 : gs / 32 < kMkSteps ? gs / 32 : kMkSteps; }

// A ring position: the tile's number in the step, its slot and how many times the ring has
// wrapped. Tile `count` belongs to pipe count % kMkPipes.
struct MkRing {
    int count = 0, slot = 0, round = 0;
    __device__ void next(int slots) {
        count++;
        if (++slot == slots) slot = 0, round++;
    }
    __device__ void skip(int n, int slots) {   // n tiles on, n >= 0
        count += n, slot += n;
        while (slot >= slots) slot -= slots, round++;
    }
    // (count is never negative; as unsigned, the remainder by a power of two is a mask, not the
    // signed remainder's shift and correction on every step of the loops: bench/NOTES.md 96)
    __device__ bool mine(int pipe) const { return (unsigned)count % kMkPipes == (unsigned)pipe; }
};

// ---------------------------------------------------------------- the weights in tile order
// A linear stage's weights as the ring takes them, written once at load (mk_pack_kernel) from the
// row-major matrices, so that a tile is one contiguous copy (a 16-row tile of row-major weights
// was 16 copies of a row piece each, which streamed slower: bench/NOTES.md 46, 49). Unit u's tile
// t (row tile t / col_tiles, column tile t % col_tiles) is record u * mk_tiles_a_unit + t, of
// mk_record_bytes: kMkTileBytes of weights in the MMA's fragment order, then the rows' group
// scales (kMkRows, mk_groups_a_row(gs)). Fragment order: step j (the tile's columns 32j .. 32j +
// 31) at j * kMkStepBytes, and in it lane 4g + c's 16 bytes as the A fragment's four registers of
// mk_imma: row g's 4 bytes at 8c of the step, row g + 8's 4 there, row g's 4 at 8c + 4, row g + 8's
// 4 there (one 16-byte load a step into the MMA's registers as they are). Rows past the unit's and
// columns past the row are zeros; a partial column tile's steps past the row are not copied.
__host__ __device__ __forceinline__ int mk_record_bytes(int gs) { return kMkTileBytes + kMkRows * mk_groups_a_row(gs) * 4; }
__host__ __device__ __forceinline__ int mk_tiles_a_unit(const MkStage &st) {
    const int rows = (st.pair ? 2 : 1) * st.a.tma_rows;
    return (rows + kMkRows - 1) / kMkRows * ((st.a.stride + kMkCols - 1) / kMkCols);
}
// Where unit u's tile t's record starts in the stage's pack; unit st.units's first: the pack's size.
__host__ __device__ __forceinline__ size_t mk_record_at(const MkStage &st, int u, int t) {
    return ((size_t)u * mk_tiles_a_unit(st) + t) * mk_record_bytes(st.a.gs);
}

// A sliced QKV unit's rows (mk_slice_qkv): its slice's rows of q, then of k, then of v, each
// kMkSliceW rows of the row-major matrix from the slice's first (head h's kv head is h's own).
__device__ MkRows mk_slice_rows(const MkStage &st, int u) {
    const int per_head = st.a.rope.head_size / st.slice, row0 = u / per_head * st.a.rope.head_size + u % per_head * st.slice;
    MkRows r;
    r.pair = 0, r.stride = st.src_stride, r.groups = st.src_groups;
    r.q0 = st.a.out[0].q + (size_t)row0 * r.stride, r.s0 = st.a.out[0].s + (size_t)row0 * r.groups;
    r.q1 = st.a.out[1].q + (size_t)row0 * r.stride, r.s1 = st.a.out[1].s + (size_t)row0 * r.groups;
    r.q2 = st.a.out[2].q + (size_t)row0 * r.stride, r.s2 = st.a.out[2].s + (size_t)row0 * r.groups;
    r.slice = st.slice;
    return r;
}

// Tile blockIdx.y of unit blockIdx.x of a linear stage into its record at dst.
__global__ void mk_pack_kernel(const MkStage st, unsigned char *dst) {
    pdl_wait();   // the matrices: written by whatever ran before
    const TmaBlock b = mk_unit(st, blockIdx.x);
    const int t = blockIdx.y, gs = st.a.gs;
    if (t >= b.tiles) return;   // the last unit's rows end sooner: records never copied
    const MkRows r = st.slice ? mk_slice_rows(st, blockIdx.x) : mk_rows(st, b);
    unsigned char *rec = dst + mk_record_at(st, blockIdx.x, t);
    const int p0 = t / b.col_tiles * kMkRows, c0 = t % b.col_tiles * kMkCols;
    for (int i = threadIdx.x; i < kMkTileBytes / 16; i += blockDim.x) {
        const int lane = i % 32, col = c0 + 32 * (i / 32) + 8 * (lane % 4);   // a multiple of 8: all in the row or none
        uint2 h[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int row = p0 + lane / 4 + 8 * k;
            h[k] = row < b.prows && col < st.a.stride ? *reinterpret_cast<const uint2 *>(r.q(row) + col) : make_uint2(0u, 0u);
        }
        *reinterpret_cast<uint4 *>(rec + 16 * i) = make_uint4(h[0].x, h[1].x, h[0].y, h[1].y);
    }
    const int per_row = mk_groups_a_row(gs), g0 = c0 / gs, n = min(st.a.groups, (min(c0 + kMkCols, st.a.stride) + gs - 1) / gs) - g0;
    float *scales = reinterpret_cast<float *>(rec + kMkTileBytes);
    for (int e = threadIdx.x; e < kMkRows * per_row; e += blockDim.x) {
        const int row = p0 + e / per_row, k = e % per_row;
        scales[e] = row < b.prows && k < n ? r.s(row)[g0 + k] : 0.0f;
    }
}

// ---------------------------------------------------------------- the producer warp
// The block's tiles of a step in order, every pipe's: where each one's record is.
struct MkCursor {
    int s = -1, u = 0, t = -1, tiles = 0, col_tiles = 1, stride = 0, record = 0;
    int in_stage = -1;   // the tile's place among the block's tiles of its stage
    const unsigned char *unit = nullptr;
    // To the next tile; false past the step's last.
    __device__ bool next(const MkParams &p) {
        in_stage++;
        while (++t >= tiles) {
            t = -1, tiles = 0;
            if (s >= 0 && (u += gridDim.x) < p.stages[s].units) {
                at_unit(p.stages[s]);
                continue;
            }
            do
                if (++s >= p.n_stages) return false;
            while (p.stages[s].kind != MK_GEMV || (int)blockIdx.x >= p.stages[s].units);
            u = blockIdx.x, in_stage = 0;
            at_unit(p.stages[s]);
        }
        return true;
    }
    __device__ void at_unit(const MkStage &st) {
        const TmaBlock b = mk_unit(st, u);
        tiles = b.tiles, col_tiles = b.col_tiles, stride = st.a.stride, record = mk_record_bytes(st.a.gs);
        unit = st.pack + mk_record_at(st, u, 0);
    }
    __device__ const unsigned char *weights() const { return unit + (size_t)t * record; }
    __device__ const unsigned char *scales() const { return weights() + kMkTileBytes; }
    __device__ int weight_bytes() const { return ceil_div_dev(min(kMkCols, stride - t % col_tiles * kMkCols), 32) * kMkStepBytes; }
    __device__ int scale_bytes() const { return record - kMkTileBytes; }
};

// Tiles past the ring asked of L2 (MK_L2_AHEAD of them, default 16; 0: none) by the classifier
// (the step's last stage) and w1/w3: when the consumers begin such a stage, its producers have
// filled the ring with the block's first p.slots tiles of it and copy no more until x is staged
// and those are freed; the next ones are asked of L2 (prefetch.global.L2, a line a thread) while
// x's loads are on their way. QKV, w2 and the output projection do not ask: asking there, the
// 7B's shapes were slower, and L2 prefetches through the copy engine slower still
// (bench/NOTES.md 49, 56, 99, 100, 101).
// MK_L2_ROLES (for measurement; default 3) names the stages that ask, a bit each: 1 the
// classifier, 2 w1/w3, 4 the others with a norm (QKV), 8 those without (w2, the output
// projection).
#ifndef MK_L2_AHEAD
#define MK_L2_AHEAD 16
#endif
#ifndef MK_L2_ROLES
#define MK_L2_ROLES 3
#endif
__device__ void mk_ask_l2(const MkParams &p, int stage) {
    const bool last = stage == p.n_stages - 1;
    const MkStage &st = p.stages[stage];
    const int role = last ? 1 : st.pair ? 2 : st.norm ? 4 : 8;
    if (!(MK_L2_ROLES & role)) return;
    if (mk_unit(st, blockIdx.x).tiles < p.slots + MK_L2_AHEAD) return;   // within the block's first unit
    const int bytes = MK_L2_AHEAD * mk_record_bytes(st.a.gs);
    const unsigned char *from = st.pack + mk_record_at(st, blockIdx.x, p.slots);
    for (int at = 128 * (int)threadIdx.x; at < bytes; at += 128 * kMkConsumers) prefetch_l2(from + at);
}

// Every tile of the block's units, in the step's order, into the next slot of the ring once the
// consumers have freed it: lane 0 arms the slot's barrier with the tile's bytes and copies its
// record in two pieces (the weights, only the steps within the row; the scales, to their place).
// A partial column tile leaves its slot's later steps as an earlier tile left them: the consumers
// multiply those bytes by x's digits past K, which mk_stage_x writes as zeros.
__device__ void mk_produce(const MkParams &p, uint32_t ring, uint32_t full, uint32_t empty) {
    const int pipe = (threadIdx.x - kMkConsumers) / 32;
    if (threadIdx.x % 32) return;
    MkRing at;
    const uint64_t policy = l2_policy(MK_EVICT_FIRST);
    for (MkCursor tile; tile.next(p); at.next(p.slots)) {
        if (!at.mine(pipe)) continue;
        const uint32_t bar = full + 8 * at.slot, dst = ring + at.slot * p.slot_bytes;
        const int in_flight = tile.in_stage >= p.slots ? MK_IN_FLIGHT_DEEP : MK_IN_FLIGHT;
        const int landed = at.count - min(in_flight, p.slots / kMkPipes) * kMkPipes;   // the pipe's copy that must have landed
        if (in_flight > 0 && landed >= 0) mbar_wait(full + 8 * (landed % p.slots), (landed / p.slots) & 1);
        if (at.round > 0) mbar_wait(empty + 8 * at.slot, (at.round - 1) & 1);
#ifdef MK_NO_COPY   // (a measurement build: the consumers' side alone, on whatever the slots hold)
        mbar_arrive_expect(bar, 0);
        (void)dst, (void)policy;
#else
        mbar_arrive_expect(bar, tile.weight_bytes() + tile.scale_bytes());
        bulk_copy_counted_hint(dst, tile.weights(), tile.weight_bytes(), bar, policy);
        bulk_copy_counted_hint(dst + kMkTileBytes, tile.scales(), tile.scale_bytes(), bar, policy);
#endif
    }
}

// ---------------------------------------------------------------- consumers
// x of a linear stage in shared memory as three int8 digits an element, in the weights' groups:
// x[k] = u[k / gs] * (d0[k] + d1[k] / 254 + d2[k] / 254^2) to within 1e-5 * u (u: the group's
// largest |x| / 127), so that a tile's products are int8 x int8, exact in int32 (IMMA), and only
// each group's sum is scaled in FP32 (bench/NOTES.md 46).
struct MkX {
    int8_t *d;     // (3, dpitch): the digits, zero from K to xpad
    float *u;      // (xpad / gs, rounded up to 4): u of each group
    float *m16;    // (xpad / 16): the largest |x| of each 16 elements while staging, for groups of
                   // more than 128 only (smaller ones find theirs by shuffles)
    int xpad;      // the row stride rounded up to whole tiles
    int dpitch;    // xpad + 32: digit g's bytes in other banks than digit g + 1's
};
// x's padded length (mk_x's xpad; mk_x_bytes and the host's shape check as well): the row stride
// rounded up to whole tiles.
__host__ __device__ __forceinline__ int mk_x_pad(int stride) { return ceil_div_dev(stride, kMkCols) * kMkCols; }
// Floats of MkX's u for groups of 2^gshift: a 16-byte multiple, so that m16 after them is aligned.
__host__ __device__ __forceinline__ int mk_x_units(int xpad, int gshift) { return ((((xpad - 1) >> gshift) + 1) + 3) & ~3; }
__device__ __forceinline__ MkX mk_x(unsigned char *scratch, int stride, int gshift) {
    MkX x;
    x.xpad = mk_x_pad(stride);
    x.dpitch = x.xpad + 32;
    x.d = reinterpret_cast<int8_t *>(scratch);
    x.u = reinterpret_cast<float *>(scratch + 3 * x.dpitch);
    x.m16 = x.u + mk_x_units(x.xpad, gshift);
    return x;
}
// The bytes of MkX for a row stride and group size 2^gshift (the larger x takes shared memory the
// ring's slots would otherwise have: bench/NOTES.md 98).
__host__ __device__ __forceinline__ int mk_x_bytes(int stride, int gshift) {
    const int xpad = mk_x_pad(stride);
    return 3 * (xpad + 32) + 4 * mk_x_units(xpad, gshift) + (gshift > 7 ? xpad / 4 : 0);
}

// Four elements of x from k (zero past K), through L2: other SMs wrote them (norm weights too).
__device__ __forceinline__ float4 mk_load_x4(const float *x, int k, int K) {
    if (k + 4 <= K && (reinterpret_cast<uintptr_t>(x + k) & 15) == 0) return __ldcg(reinterpret_cast<const float4 *>(x + k));
    float4 v = {0.0f, 0.0f, 0.0f, 0.0f};
    if (k < K) v.x = __ldcg(x + k);
    if (k + 1 < K) v.y = __ldcg(x + k + 1);
    if (k + 2 < K) v.z = __ldcg(x + k + 2);
    if (k + 3 < K) v.w = __ldcg(x + k + 3);
    return v;
}

// Values handed over flagged, two to an 8-byte word (single-copy atomic): elements 2i and 2i + 1
// of a buffer in word i, each value's two low mantissa bits carrying half of its writer's 4-bit
// tag, so that a reader that sees the tag it expects in both halves sees the two values written
// with it, without a fence or a counter. A value so loses its two lowest bits (3 ulp at most),
// and a tag tells a write only from the 15 before it in the same buffer: the host flags a buffer
// only where every block reads it within 15 writes of what it saw before, or after a count
// (mk_tags_reach). Two values a word where a (value, flag) word once held one: half the bytes
// each x staged reads through L2.
__device__ __forceinline__ void mk_store_pair(uint2 *at, float a, float b, unsigned tag) {
    const unsigned long long lo = (__float_as_uint(a) & ~3u) | (tag & 3u), hi = (__float_as_uint(b) & ~3u) | (tag >> 2);
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(at), "l"(hi << 32 | lo) : "memory");
}
__device__ __forceinline__ unsigned long long mk_load_pair(const uint2 *at) {
    unsigned long long w;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w) : "l"(at));
    return w;
}
__device__ __forceinline__ bool mk_tag_is(unsigned long long w, unsigned tag) {
    return (((unsigned)w & 3u) | ((unsigned)(w >> 32) & 3u) << 2) == tag;
}
__device__ __forceinline__ float mk_lo(unsigned long long w) { return __uint_as_float((unsigned)w); }
__device__ __forceinline__ float mk_hi(unsigned long long w) { return __uint_as_float((unsigned)(w >> 32)); }
// w once its tag is `tag`: loaded again from `at` until it is.
__device__ __forceinline__ unsigned long long mk_settle(unsigned long long w, const uint2 *at, unsigned tag) {
    while (!mk_tag_is(w, tag)) w = mk_load_pair(at);
    return w;
}
// The tag of write `seq` of a buffer written `writes` times a step, in the step of this epoch
// (p.counters[n_stages + 1], one more each step): the buffer's writes counted from its zeros
// before the first (write -1, tag 0), modulo 16.
__device__ __forceinline__ unsigned mk_tag(unsigned epoch, int writes, int seq) { return (epoch * (unsigned)writes + (unsigned)seq + 1u) & 15u; }
// Four flagged elements of x from k (k a multiple of 4: two words), loaded by mk_issue_x4 with
// all of a batch in flight at once; words whose tags are not yet the stage's are loaded again,
// together (mk_stage_x).
struct MkFlagged4 {
    unsigned long long w[2];
};
// Two words by one 16-byte load: each 8-byte element of a vector access is a scalar access of its
// own (single-copy atomic), which is all a tag needs.
__device__ __forceinline__ void mk_load_pair2(const uint2 *at, unsigned long long &a, unsigned long long &b) {
    asm volatile("ld.relaxed.gpu.global.v2.b64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(at));
}
__device__ __forceinline__ MkFlagged4 mk_issue_x4(const uint2 *x, int k, int K, unsigned tag) {
    MkFlagged4 f;
    if (k + 4 <= K) {
        mk_load_pair2(x + k / 2, f.w[0], f.w[1]);
        return f;
    }
#pragma unroll
    for (int i = 0; i < 2; i++) f.w[i] = k + 2 * i < K ? mk_load_pair(x + k / 2 + i) : (unsigned long long)(tag >> 2) << 32 | (tag & 3u);
    return f;
}
// The four values (zero past K: a word's second value past an odd K is its writer's padding).
__device__ __forceinline__ float4 mk_values_x4(const MkFlagged4 &f, int k, int K) {
    return make_float4(k < K ? mk_lo(f.w[0]) : 0.0f, k + 1 < K ? mk_hi(f.w[0]) : 0.0f, k + 2 < K ? mk_lo(f.w[1]) : 0.0f,
                       k + 3 < K ? mk_hi(f.w[1]) : 0.0f);
}

// Integers and floats converted by adds, without the conversion instructions (F2I, I2F, FRND),
// which issue at an eighth of an add's rate (MK_NO_CVT, default on; bench/NOTES.md 62): t +
// 1.5 * 2^23 is t rounded to the nearest integer (ties to even, as rintf) for |t| < 2^22, held in
// the float's low bits.
// MK_FAST_U (default on; 0 for the A/B): x's group unit u = max * (1 / 127) and 1 / u by
// rcp.approx instead of a division and a correctly rounded reciprocal, both subroutines of many
// instructions on the boundary's path (other digits of the same x, the same bound on them:
// bench/NOTES.md 66).
#ifndef MK_FAST_U
#define MK_FAST_U 1
#endif
#ifndef MK_NO_CVT
#define MK_NO_CVT 1
#endif
// The three digits of v (in units of u: v * inv, |v * inv| <= 127) packed a byte each into d[3].
__device__ __forceinline__ void mk_digits(float v, float inv, int i, uint32_t d[3]) {
    float t = v * inv;
#pragma unroll
    for (int j = 0; j < 3; j++) {
        float r;
        if (MK_NO_CVT) {
            const RoundedByAdds a = round_by_adds(t);
            r = a.value;
            d[j] |= a.low_byte << (8 * i);
        } else {
            r = rintf(t);
            d[j] |= (uint32_t)((int)r & 0xff) << (8 * i);
        }
        t = (t - r) * 254.0f;
    }
}
// An int32 sum as a float: by an add where |d| < 2^22 (kSmall), else converted.
template <bool kSmall>
__device__ __forceinline__ float mk_float_of(int d) {
    if (MK_NO_CVT && kSmall) return __fsub_rn(__int_as_float(__float_as_int(kRoundMagic) + d), kRoundMagic);
    return (float)d;
}

// The digits of one float4 of x at k into xs, in units of u (its group's).
__device__ __forceinline__ void mk_store_digits(const MkX &xs, float4 v, float u, int k) {
#if MK_FAST_U
    float inv = 0.0f;   // rcp.approx: within an ulp or two of 1 / u, |v * inv| stays under 127.5
    if (u > 0.0f) asm("rcp.approx.f32 %0, %1;" : "=f"(inv) : "f"(u));
#else
    const float inv = u > 0.0f ? __frcp_rn(u) : 0.0f;   // 1 / u correctly rounded, as the division
#endif
    uint32_t d[3] = {0, 0, 0};
    mk_digits(v.x, inv, 0, d), mk_digits(v.y, inv, 1, d), mk_digits(v.z, inv, 2, d), mk_digits(v.w, inv, 3, d);
#pragma unroll
    for (int j = 0; j < 3; j++) *reinterpret_cast<uint32_t *>(xs.d + j * xs.dpitch + k) = d[j];
}

// Stages x (with a norm: times the norm weights) as MkX; returns 1 / rms of the raw x (1 without
// a norm). Each consumer thread holds kMkXQuads float4 of a batch, all loaded at once; a warp's
// float4 of one round are 128 consecutive elements, so that a group of up to 128 finds its
// largest element by shuffles (larger groups: through shared memory, two barriers a batch). Ends
// with a barrier.
template <bool norm, bool flagged, int kMkXQuads, int kGShift = 0>
__device__ float mk_stage_x(const MkParams &p, int stage, const MkX &xs, float *red, const Q8Args &a, const uint2 *xf, unsigned tag) {
    constexpr int kMkXBatch = 4 * kMkXQuads * kMkConsumers;
    const int K = a.K, gshift = kGShift ? kGShift : a.group_shift + 4, lane = threadIdx.x % 32, in_warp = gshift <= 7;
    float sumsq = 0.0f;
    for (int base = 0; base < xs.xpad; base += kMkXBatch) {
        float4 v[kMkXQuads], nw[kMkXQuads];   // x, and the norm weights in the same round of loads
        MkFlagged4 f[flagged ? kMkXQuads : 1];
#pragma unroll
        for (int i = 0; i < kMkXQuads; i++) {
            const int k = base + 4 * (threadIdx.x + i * kMkConsumers);
            if (flagged) f[i] = mk_issue_x4(xf, k, K, tag);
            else v[i] = mk_load_x4(a.x, k, K);
            if (norm) nw[i] = mk_load_x4(a.norm_w, k, K);
        }
        if (MK_L2_AHEAD && base == 0) mk_ask_l2(p, stage);   // while x's loads are on their way
#ifdef MK_FREE
        for (bool ready = !flagged || p.stages[stage].free_x; !ready;) {
#else
        for (bool ready = !flagged; !ready;) {   // each round the elements not there yet, all in flight
#endif
            ready = true;
#pragma unroll
            for (int i = 0; i < (flagged ? kMkXQuads : 0); i++)
#pragma unroll
                for (int j = 0; j < 2; j++) ready = ready && mk_tag_is(f[i].w[j], tag);
            if (ready) break;
            if (MK_FLAG_BACKOFF) __nanosleep(MK_FLAG_BACKOFF);
#pragma unroll
            for (int i = 0; i < (flagged ? kMkXQuads : 0); i++)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    if (!mk_tag_is(f[i].w[j], tag)) f[i].w[j] = mk_load_pair(xf + (base + 4 * (threadIdx.x + i * kMkConsumers)) / 2 + j);
        }
#pragma unroll
        for (int i = 0; i < (flagged ? kMkXQuads : 0); i++) v[i] = mk_values_x4(f[i], base + 4 * (threadIdx.x + i * kMkConsumers), K);
        if (base == 0) mk_stamp_after(p, stage, 4, v[0].x);
        // The largest |x| of each 16 (a lane's 4, then 4 lanes'), every quad's chain side by side
        // (no exit from the unrolled loops: rounds past xpad, alike for every thread, are skipped
        // by their stores only).
        float m[kMkXQuads];
#pragma unroll
        for (int i = 0; i < kMkXQuads; i++) {
            sumsq += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
            if (norm) v[i].x *= nw[i].x, v[i].y *= nw[i].y, v[i].z *= nw[i].z, v[i].w *= nw[i].w;
            m[i] = fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)), fmaxf(fabsf(v[i].z), fabsf(v[i].w)));
        }
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {   // on to the group's lanes where it is a warp's or less
            if (o > 2 && (!in_warp || o >= 1 << (gshift - 2))) break;
#pragma unroll
            for (int i = 0; i < kMkXQuads; i++) m[i] = fmaxf(m[i], __shfl_xor_sync(0xffffffffu, m[i], o));
        }
#pragma unroll
        for (int i = 0; i < kMkXQuads; i++) {
            const int k = base + 4 * (threadIdx.x + i * kMkConsumers);
            if (k >= xs.xpad) continue;
            if (in_warp) {
                const float u = MK_FAST_U ? m[i] * (1.0f / 127.0f) : m[i] / 127.0f;
                if ((lane & ((1 << (gshift - 2)) - 1)) == 0) xs.u[k >> gshift] = u;
                mk_store_digits(xs, v[i], u, k);
            } else if (lane % 4 == 0) {
                xs.m16[k / 16] = m[i];
            }
        }
        if (in_warp) continue;
        consumer_sync();
        const int end = min(xs.xpad, base + kMkXBatch);
        for (int g = (base >> gshift) + threadIdx.x; g << gshift < end; g += kMkConsumers) {   // each group's u
            float m = 0.0f;
            for (int j = g << gshift >> 4; j < min(end, (g + 1) << gshift) >> 4; j++) m = fmaxf(m, xs.m16[j]);
            xs.u[g] = m / 127.0f;
        }
        consumer_sync();
#pragma unroll
        for (int i = 0; i < kMkXQuads; i++) {
            const int k = base + 4 * (threadIdx.x + i * kMkConsumers);
            if (k >= xs.xpad) break;
            mk_store_digits(xs, v[i], xs.u[k >> gshift], k);
        }
    }
    mk_stamp(p, stage, 5);
    const float inv_rms = norm ? inv_rms_of(block_reduce<false, kMkConsumers>(sumsq, red), K, a.norm_eps) : 1.0f;
    consumer_sync();
    return inv_rms;
}

// The float4 a consumer thread holds a batch for an x of xpad elements (MK_X_QUADS, MK_X_FIT).
constexpr int kMkXMost = MK_X_QUADS > 8 ? MK_X_QUADS : 8;
__host__ __device__ __forceinline__ int mk_x_quads(int xpad, bool norm, bool flagged) {
    const int need = (xpad + 4 * kMkConsumers - 1) / (4 * kMkConsumers);
    if (MK_X_FIT && need <= 2) return 2;
    if (MK_X_FIT && need <= 4) return 4;
    if (MK_X_FIT && !norm && !flagged && need > 8 && need <= kMkXMost) return kMkXMost;
    return flagged ? MK_FLAGGED_QUADS : 8;
}
// mk_stage_x with mk_x_quads' batches (Shape's, where it fixes them, and its group size).
template <bool norm, bool flagged, typename Shape>
__device__ float mk_stage_x_fit(const MkParams &p, int stage, const MkX &xs, float *red, const Q8Args &a, const uint2 *xf, unsigned tag) {
    if constexpr (Shape::x_quads > 0) {
        return mk_stage_x<norm, flagged, Shape::x_quads, Shape::gshift>(p, stage, xs, red, a, xf, tag);
    } else {
        const int quads = mk_x_quads(xs.xpad, norm, flagged);
        if (quads == 2) return mk_stage_x<norm, flagged, 2>(p, stage, xs, red, a, xf, tag);
        if (quads == 4) return mk_stage_x<norm, flagged, 4>(p, stage, xs, red, a, xf, tag);
        if (quads == kMkXMost) return mk_stage_x<norm, flagged, kMkXMost>(p, stage, xs, red, a, xf, tag);
        return mk_stage_x<norm, flagged, flagged ? MK_FLAGGED_QUADS : 8>(p, stage, xs, red, a, xf, tag);
    }
}
// x of stage st: flagged (st.ll_in) or through its counter's wait, with or without a norm.
template <typename Shape>
__device__ float mk_stage_x_of(const MkParams &p, const MkStage &st, int stage, const MkX &xs, float *red, unsigned epoch) {
    const unsigned tag = mk_tag(epoch, st.ll_writes_in, st.ll_seq_in);
    if (st.ll_in) return st.norm ? mk_stage_x_fit<true, true, Shape>(p, stage, xs, red, st.a, st.ll_in, tag)
                                 : mk_stage_x_fit<false, true, Shape>(p, stage, xs, red, st.a, st.ll_in, tag);
    return st.norm ? mk_stage_x_fit<true, false, Shape>(p, stage, xs, red, st.a, nullptr, 0)
                   : mk_stage_x_fit<false, false, Shape>(p, stage, xs, red, st.a, nullptr, 0);
}

// d += a . b: a 16 x 32 int8 tile of weights (the A fragment's registers), b 32 x 8 int8 (x's
// digits in columns 0-2), in int32. Not volatile: the compiler may move the shared-memory loads of
// later steps before it.
__device__ __forceinline__ void mk_imma(int d[4], uint4 a, uint2 b) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b.x), "r"(b.y));
}

// MK_GROUP_SELECT (default on; 0 for the A/B): a group past the row's end is summed like the
// others, weighed 0 by its u, instead of skipped by a branch: the branch's reconvergence points
// split the unrolled steps, so that a group's MMAs and its sum no longer overlap the next group's
// loads and MMAs (bench/NOTES.md 71, 72). The sum adds exactly 0: x's digits there are zeros.
#ifndef MK_GROUP_SELECT
#define MK_GROUP_SELECT 1
#endif
// MK_ACCS (default 4; 1 for the A/B): a group's MMA steps summed in as many independent int32
// accumulators, added at the group's end (exact), so that its MMAs need not each wait for the one
// before (bench/NOTES.md 84).
#ifndef MK_ACCS
#define MK_ACCS 4
#endif

// A tile's view for one warp: lane (g = lane / 4, c = lane % 4) loads 8 bytes of rows g and g + 8
// at 8c of each step's 32 columns (the A fragment's bytes 4c.. and 16 + 4c.., a permutation of the
// step's columns that x's digits share: the B fragment's bytes of digit g, g < 3, at the same 8c),
// 16 bytes together in the slot's fragment order (MkPack). Lanes g >= 3 load digit 0 as well: the
// MMA's columns 3-7 are never read (mk_group_sum weighs them 0), so no lane needs a branch.
struct MkTile {
    const unsigned char *w;   // the lane's 16 bytes of the warp's first step
    const float *scales;      // (kMkRows, mk_groups_a_row(gs)) of the slot
    int per_row;
};

// A group's int32 sums (C fragment: columns 2c, 2c + 1 of rows g, g + 8) into this lane's row sums
// acc[0] (row g), acc[1] (row g + 8): digits 0 and 1 sit in lane c = 0, digit 2 in c = 1 (f: their
// weights in this lane); times the rows' scales and x's u. gi: the group's place in the tile row.
// kSmall: |d| < 2^22 (a group of 256 columns or fewer: 128 * 127 * 256 < 2^22).
template <bool kSmall>
__device__ __forceinline__ void mk_group_sum(float acc[2], const int d[4], const float f[2], const MkTile &t, int gi, float u, int g) {
    const float v0 = fmaf(mk_float_of<kSmall>(d[1]), f[1], mk_float_of<kSmall>(d[0]) * f[0]);
    const float v1 = fmaf(mk_float_of<kSmall>(d[3]), f[1], mk_float_of<kSmall>(d[2]) * f[0]);
    acc[0] = fmaf(t.scales[g * t.per_row + gi] * u, v0, acc[0]);
    acc[1] = fmaf(t.scales[(g + 8) * t.per_row + gi] * u, v1, acc[1]);
}

// This warp's kMkSpan columns of one tile (its first column c0 + kMkSpan * warp) into acc.
// kGroupSteps: MMA steps a group of x takes (1 for gs 32, 2 for 64, ..., kMkSteps for groups as
// wide as the warp's columns or wider); 0: gs 16, each step's halves (lanes c < 2 and c >= 2) two
// groups, two MMAs. A compile-time constant, so that the unrolled steps have no branches and
// their shared-memory loads are issued in chunks ahead of the MMAs that use them.
template <int kGroupSteps>
__device__ __forceinline__ void mk_tile_math(float acc[2], const MkTile &t, const MkX &xs, const float f[2], int c0, int k0,
                                             int stride, int gshift) {
    constexpr int kChunk = kMkSteps < 4 ? kMkSteps : 4;   // steps whose fragments are loaded together
    static_assert(kMkSteps % kChunk == 0 && kMkSteps % (kGroupSteps > 0 ? kGroupSteps : 1) == 0, "whole chunks and groups");
    constexpr int kAccs = kGroupSteps < MK_ACCS ? (kGroupSteps > 0 ? kGroupSteps : 1) : MK_ACCS;
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int8_t *digits = xs.d + (g < 3 ? g : 0) * xs.dpitch + k0 + 8 * c;
    int d[kAccs][4];
#pragma unroll
    for (int j0 = 0; j0 < kMkSteps; j0 += kChunk) {
        uint4 w[kChunk];
        uint2 b[kChunk];
#pragma unroll
        for (int i = 0; i < kChunk; i++) {
            w[i] = *reinterpret_cast<const uint4 *>(t.w + kMkStepBytes * (j0 + i));
            b[i] = *reinterpret_cast<const uint2 *>(digits + 32 * (j0 + i));
        }
#pragma unroll
        for (int i = 0; i < kChunk; i++) {
            const int j = j0 + i, k = k0 + 32 * j;   // the step's first column in the row
            if constexpr (kGroupSteps == 0) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const bool mine = (c >> 1) == h;
                    int e[4] = {0, 0, 0, 0};
                    mk_imma(e, w[i], make_uint2(mine ? b[i].x : 0u, mine ? b[i].y : 0u));
                    const int kh = k + 16 * h;
                    if (MK_GROUP_SELECT || kh < stride)
                        mk_group_sum<true>(acc, e, f, t, (kh >> 4) - (c0 >> 4), kh < stride ? xs.u[kh >> 4] : 0.0f, g);
                }
            } else {
                int *da = d[j % kGroupSteps % kAccs];
                if (j % kGroupSteps < kAccs) da[0] = da[1] = da[2] = da[3] = 0;
                mk_imma(da, w[i], b[i]);
                const int kg = k - 32 * (kGroupSteps - 1);   // the group's first column (of the warp's, for groups wider than it)
                const float u = kg < stride ? xs.u[kg >> gshift] : 0.0f;
                if (j % kGroupSteps == kGroupSteps - 1 && (MK_GROUP_SELECT || kg < stride)) {
#pragma unroll
                    for (int a = 1; a < kAccs; a++)
#pragma unroll
                        for (int r = 0; r < 4; r++) d[0][r] += d[a][r];
                    mk_group_sum<(kGroupSteps <= 8)>(acc, d[0], f, t, (kg >> gshift) - (c0 >> gshift), u, g);
                }
            }
        }
    }
}

// A row tile's sums of this warp (lanes c = 0, 1 of each row) stored as its row sums (sums:
// (consumer warps, prows), zeroed before the unit): a warp's tiles of a unit come in the order of
// their row tiles, so each row tile is flushed at most once a warp, and a store does what an add
// to the sums would, without waiting for a load of them.
__device__ __forceinline__ void mk_flush(float acc[2], float *sums, int rt, int prows) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float v = acc[h] + __shfl_xor_sync(0xffffffffu, acc[h], 1);
        const int row = rt * kMkRows + g + 8 * h;
        if (lane % 4 == 0 && row < prows) sums[warp * prows + row] = v;
        acc[h] = 0.0f;
    }
}

// RoPE's cosine and sine of this thread's rows in the block's QKV unit (MK_ROPE_EARLY, default
// on): the schedule gives a block the same unit of every layer's QKV stage and the step one
// position, so they are computed once a step, at its start, instead of in each layer's epilogue
// (a unit of the values: the position alone, which the epilogue would load).
#ifndef MK_ROPE_EARLY
#define MK_ROPE_EARLY 1
#endif
struct MkTurn {
    float2 cs_sn = {1.0f, 0.0f};
    int j = -1, lrow0 = -1, lrows = 0, head_size = 0, pos = 0;   // the unit it is of; j = -1: none
    const float *freq = nullptr;
    // Whether it holds this unit's rows (2 threadIdx.x, + 1) of stage st.
    __device__ bool of(const MkStage &st, const TmaBlock &b) const {
        return j >= 0 && b.j == j && b.lrow0 == lrow0 && b.lrows == lrows && st.a.rope.freq == freq && st.a.rope.head_size == head_size &&
               !st.a.rope.seq_stride;
    }
};
// Whether a sliced QKV stage's units take the attention at position pos (else the attention stage).
__device__ __forceinline__ bool mk_slice_now(int pos) { return pos + 1 <= kMkSliceRows; }
// Whether stage st is sliced in the kernel compiled for Shape (never in the any-shape kernel).
template <typename Shape>
__device__ __forceinline__ bool mk_sliced(const MkStage &st) {
    if constexpr (Shape::hs > 0) return st.slice != 0;
    return false;
}

// A sliced QKV unit's (mk_slice_attention): thread i < kMkSliceW turns the pair i % (kMkSliceW /
// 2) of q's slice (i < kMkSliceW / 2) or of k's; t.pos is the step's position either way.
template <typename Shape>
__device__ MkTurn mk_turn(const MkParams &p, int pos) {
    MkTurn t;
    int at = -1;   // this thread's pair's frequency in t.freq
    for (int s = 0; s < p.n_stages; s++) {
        const MkStage &st = p.stages[s];
        if (st.kind != MK_GEMV || !st.a.rope.inputs) continue;
        if (mk_sliced<Shape>(st)) {
            const int d = blockIdx.x % kMkSliceLanes * kMkSliceW + 2 * (threadIdx.x % (kMkSliceW / 2));
            t.pos = pos, t.freq = st.a.rope.freq;
            if ((int)blockIdx.x < st.units && threadIdx.x < kMkSliceW) at = d / 2;
            break;
        }
        if (!MK_ROPE_EARLY || st.a.rope.inputs != p.inputs) break;   // (a position other than the step's)
        if ((int)blockIdx.x >= st.units) continue;
        const TmaBlock b = mk_unit(st, blockIdx.x);
        t.j = b.j, t.lrow0 = b.lrow0, t.lrows = b.lrows, t.head_size = st.a.rope.head_size, t.freq = st.a.rope.freq, t.pos = pos;
        const int row = b.lrow0 + 2 * threadIdx.x;
        if (b.j < 2 && 2 * (int)threadIdx.x < b.lrows) at = row % t.head_size / 2;
        break;
    }
    if (at >= 0) sincosf(pos * __ldg(t.freq + at), &t.cs_sn.y, &t.cs_sn.x);
    return t;
}

// The block's rows of the residual stream, finished (as finish_block_rows with store_rows: the
// same operations) where the schedule keeps them (MK_KEEP_RESIDUAL, default on): every stage that
// adds to the stream gives each block the same rows (checked on the host), so a thread's pair of
// rows is the same in each, and their values are kept in shared memory (keep: (st.a.tma_rows))
// instead of read back from L2 in every such stage's epilogue.
#ifndef MK_KEEP_RESIDUAL
#define MK_KEEP_RESIDUAL 1
#endif
// With st.ll_out the rows are handed over flagged (tag; the first stage's values from before
// carry the tag prev), a pair a word (b.lrow0 is even).
__device__ void mk_finish_kept(const MkStage &st, const TmaBlock &b, const float *sums, float *keep, float inv_rms, unsigned tag,
                               unsigned prev) {
    const int l = 2 * threadIdx.x;   // one pair a thread: the host keeps at most 2 kMkConsumers rows
    if (l >= b.lrows) return;
    float *y = st.a.out[b.j].y + b.lrow0;
    uint2 *yf = st.ll_out + (b.lrow0 + l) / 2;
    float v[2] = {0.0f, 0.0f};
    if (st.keep == 2) {
        v[0] = keep[l], v[1] = keep[l + 1];
    } else if (st.ll_out) {
        const unsigned long long w = mk_settle(mk_load_pair(yf), yf, prev);
        v[0] = mk_lo(w), v[1] = mk_hi(w);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (l + r >= b.lrows) {
            v[r] = 0.0f;   // the word's padding past N
            continue;
        }
        if (st.keep != 2 && !st.ll_out) v[r] = __ldcg(y + l + r);
        v[r] += finish_output(warps_row_sum(sums, kMkConsumerWarps, b.prows, l + r), 0.0f, inv_rms, false);
        if (!st.ll_out) y[l + r] = v[r];
        keep[l + r] = v[r];
    }
    if (st.ll_out) mk_store_pair(yf, v[0], v[1], tag);
}

// A unit's rows handed over flagged (st.ll_out; outputs without RoPE or a residual add): the same
// operations as finish_block_rows with store_rows, a row a thread (two a thread doubled the
// finish's chain of shared-memory sums: bench/NOTES.md 75); an even lane stores its row and the
// next lane's as a word (b.lrow0 is even).
__device__ void mk_finish_flagged(const MkStage &st, const TmaBlock &b, const float *sums, float inv_rms, unsigned tag) {
    const bool pair = st.pair != 0;
    for (int base = 0; base < b.lrows; base += kMkConsumers) {   // alike for every thread: whole warps at the shuffle
        const int l = base + threadIdx.x;
        float v = 0.0f;   // past the unit's rows: the word's padding
        if (l < b.lrows) {
            const int p = pair ? 2 * l : l;
            const float s0 = warps_row_sum(sums, kMkConsumerWarps, b.prows, p);
            const float s1 = pair ? warps_row_sum(sums, kMkConsumerWarps, b.prows, p + 1) : 0.0f;
            v = finish_output(s0, s1, inv_rms, pair);
        }
        const float next = __shfl_down_sync(0xffffffffu, v, 1);
        if (l < b.lrows && l % 2 == 0) mk_store_pair(st.ll_out + (b.lrow0 + l) / 2, v, next, tag);
    }
}

// What a linear stage's tile loop needs, held in registers: the stage's fields are in global
// memory, which each barrier wait of the loop would otherwise load again.
struct MkLoop {
    unsigned char *smem;   // the ring's slots
    float *sums;           // (consumer warps, prows) of the unit
    MkX xs;
    uint32_t full, empty;
    float f[2];            // mk_group_sum's weights of this lane's digits
    int stage, stride, gshift, per_row, slots, slot_bytes;
};

// One of this warp's tiles (tile t of its unit, column tile ct) in its slot: waited for, its
// products added to acc, the slot freed.
template <int kGroupSteps>
__device__ __forceinline__ void mk_tile(const MkParams &p, const MkLoop &l, float acc[2], int slot, int round, int t, int ct,
                                        MkWarpClock &wc) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x % kMkGroupThreads / 32;
    const unsigned char *bytes = l.smem + slot * l.slot_bytes;
    const unsigned long long waiting = mk_clock();   // (MK_TRACE; else 0, and the stamps below nothing)
    wc.waiting();
    mbar_wait(l.full + 8 * slot, round & 1);
    wc.waited();
    const unsigned long long waited = mk_clock() - waiting;
    mk_stamp_add(p, l.stage, 8, waited);
    if (t < kMkPipes) mk_stamp_add(p, l.stage, 9, waited);
#ifndef MK_NO_MATH   // (a measurement build: the ring's streaming alone)
    const int c0 = ct * kMkCols, k0 = c0 + kMkSpan * warp;
    const MkTile tile = {bytes + kMkSteps * warp * kMkStepBytes + 16 * lane, reinterpret_cast<const float *>(bytes + kMkTileBytes),
                         l.per_row};
    if (k0 < l.stride) mk_tile_math<kGroupSteps>(acc, tile, l.xs, l.f, c0, k0, l.stride, l.gshift);
#else
    (void)ct, (void)lane, (void)warp, (void)bytes;
#endif
    mbar_arrive(l.empty + 8 * slot);   // this thread is done with the slot: its own reads released
}

// This warp's tiles of unit b into its row sums (mk_flush), in step with the producer's ring (at:
// past the unit's tiles on return). kGroupSteps: mk_tile_math's, so that the loop has no branch on
// the group size between tiles. kOwnTiles: the loop steps through the pipe's own tiles only, every
// kMkPipes-th; else through every tile of the unit, skipping the other pipes'. The first is faster
// on the long units of the compiled shape (MkShape128), the second on the small models' short
// units (bench/NOTES.md 101).
template <int kGroupSteps, bool kOwnTiles>
__device__ void mk_unit_tiles(const MkParams &p, const MkLoop &l, const TmaBlock &b, MkRing &at, MkWarpClock &wc) {
    const int pipe = threadIdx.x / kMkGroupThreads, slots = l.slots;
    float acc[2] = {0.0f, 0.0f};
    int cur = -1;   // the row tile acc holds
    if constexpr (kOwnTiles) {
        const int first = (pipe - at.count) & (kMkPipes - 1);   // the unit's first tile of this pipe
        int slot = at.slot + first, round = at.round;
        if (slot >= slots) slot -= slots, round++;
        // kMkPipes tiles on: drt row tiles and dct column tiles; the first tile's row and column
        // tile (by subtraction: no division on the path into the loop)
        int drt = 0, dct = kMkPipes, rt = 0, ct = first;
        while (dct >= b.col_tiles) dct -= b.col_tiles, drt++;
        while (ct >= b.col_tiles) ct -= b.col_tiles, rt++;
        for (int t = first; t < b.tiles; t += kMkPipes) {
            if (rt != cur) {
                if (cur >= 0) mk_flush(acc, l.sums, cur, b.prows);
                cur = rt;
            }
            mk_tile<kGroupSteps>(p, l, acc, slot, round, t, ct, wc);
            if ((slot += kMkPipes) >= slots) slot -= slots, round++;   // (slots: a multiple of kMkPipes)
            ct += dct, rt += drt;
            if (ct >= b.col_tiles) ct -= b.col_tiles, rt++;
        }
        at.skip(b.tiles, slots);   // past the unit's tiles, every pipe's
    } else {
        for (int t = 0, rt = 0, ct = 0; t < b.tiles; t++, at.next(slots), ct = ct + 1 == b.col_tiles ? (rt++, 0) : ct + 1) {
            if (!at.mine(pipe)) continue;
            if (rt != cur) {
                if (cur >= 0) mk_flush(acc, l.sums, cur, b.prows);
                cur = rt;
            }
            mk_tile<kGroupSteps>(p, l, acc, at.slot, at.round, t, ct, wc);
        }
    }
    wc.looped();   // from the start's barrier: the loop, waits included
    if (cur >= 0) mk_flush(acc, l.sums, cur, b.prows);
}

// mk_unit_tiles for the stage's group size (group_steps: mk_group_steps'; Shape's, where it fixes it).
template <typename Shape>
__device__ void mk_unit_tiles_gs(int group_steps, const MkParams &p, const MkLoop &l, const TmaBlock &b, MkRing &at, MkWarpClock &wc) {
    if constexpr (Shape::group_steps >= 0) {
        mk_unit_tiles<Shape::group_steps, true>(p, l, b, at, wc);
    } else {
        switch (group_steps) {
        case 0: mk_unit_tiles<0, false>(p, l, b, at, wc); break;
        case 1: mk_unit_tiles<1, false>(p, l, b, at, wc); break;
        case 2: mk_unit_tiles<2, false>(p, l, b, at, wc); break;
        case 4: mk_unit_tiles<(4 < kMkSteps ? 4 : kMkSteps), false>(p, l, b, at, wc); break;
        case 8: mk_unit_tiles<(8 < kMkSteps ? 8 : kMkSteps), false>(p, l, b, at, wc); break;
        default: mk_unit_tiles<kMkSteps, false>(p, l, b, at, wc); break;
        }
    }
}

// The block's consumers' first largest into thread 0's (best, best_i); red: 2 kMkConsumerWarps words.
__device__ void mk_block_best(float &best, int &best_i, float *red) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int *red_i = reinterpret_cast<int *>(red) + kMkConsumerWarps;
    warp_keep_max(best, best_i);
    if (lane == 0) red[warp] = best, red_i[warp] = best_i;
    consumer_sync();
    if (threadIdx.x == 0)
        for (int w = 1; w < kMkConsumerWarps; w++) keep_max(best, best_i, red[w], red_i[w]);
}

// The greedy argmax inside the step (where p.best is set): each classifier unit's first largest
// logit (mk_unit_best), then the last block out takes the first largest of those (mk_step_argmax)
// and does what argmax_kernel does with feed: the token into p.argmax and as the next step's
// input, at the next position. The same comparisons, so the same token: each thread scans its
// rows in index order keeping the strictly larger, then keep_max meets them (NaN never larger,
// 0 where nothing is larger than -inf). The token also goes to mapped host memory, so that the
// host waits for it without a copy in the stream (gpu_step_token_wait).
__device__ void mk_unit_best(const MkParams &p, const MkStage &st, const TmaBlock &b, int u, float *red) {
    const float *y = st.a.out[b.j].y + b.lrow0;
    float best = -INFINITY;
    int best_i = INT_MAX;
    for (int l = 2 * threadIdx.x; l < b.lrows; l += 2 * kMkConsumers)   // finish_block_rows's rows: this thread's own stores
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (l + r < b.lrows && y[l + r] > best) best = y[l + r], best_i = b.lrow0 + l + r;
    mk_block_best(best, best_i, red);
    if (threadIdx.x == 0) p.best[u] = {best, best_i};
}
// The step's token from the classifier units' bests, by the last block out (every other block has
// read the step's inputs by now).
__device__ void mk_step_argmax(const MkParams &p, int pos, float *red) {
    const MkStage &cls = p.stages[p.n_stages - 1];
    float best = -INFINITY;
    int best_i = INT_MAX;
    for (int u = threadIdx.x; u < cls.units; u += kMkConsumers) {
        const MkBest c = {__ldcg(&p.best[u].v), __ldcg(&p.best[u].i)};
        keep_max(best, best_i, c.v, c.i);
    }
    mk_block_best(best, best_i, red);
    if (threadIdx.x != 0) return;
    const int token = best_i < cls.a.out[0].N ? best_i : 0;
    *p.argmax = token;
    feed_step_token(p.inputs, p.step_tokens, pos, token);
}

// ---------------------------------------------------------------- QKV in head slices
// (MK_SLICES, mk_slice_qkv.) A sliced QKV unit u is head h = u / kMkSliceLanes's dimensions
// col .. col + kMkSliceW - 1 (col = h head_size + (u % kMkSliceLanes) kMkSliceW) of q, k and v:
// its rows finished (mk_slice_finish), then the attention of its slice of q over rows 0 .. pos of
// its slice of the caches (mk_slice_attention). The head's kMkSliceLanes units each write their
// part of every row's score, read the others' and so all hold the same scores; each finishes the
// softmax and its dimensions of the output. Where the step has more rows than kMkSliceRows, the
// rows are only finished, and the attention stage after runs as for unsliced stages.

// A stage's units at the step's position: mk_units', none for an attention stage whose sliced QKV
// stage took its work.
template <typename Shape>
__device__ __forceinline__ int mk_stage_units(const MkStage &st, int splits, int n_heads, int pos) {
    if (st.kind == MK_ATTENTION && mk_sliced<Shape>(st) && mk_slice_now(pos)) return 0;
    return mk_units(st, splits, n_heads);
}

// A slice's partial scores go over as a word a row: the score's bits, then a 32-bit tag, the
// count of the sliced stages before it since the buffer's zeros (epoch sl_writes + sl_seq + 1), so
// that no word from an earlier write, of this step or any before, reads as this one's.
__device__ __forceinline__ unsigned mk_slice_tag(const MkStage &st, unsigned epoch) {
    return epoch * (unsigned)st.sl_writes + (unsigned)st.sl_seq + 1u;
}
__device__ __forceinline__ void mk_store_score(uint2 *at, float v, unsigned tag) {
    const unsigned long long w = (unsigned long long)tag << 32 | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(at), "l"(w) : "memory");
}

// The first of a sliced unit's kMkSliceW dimensions in q (and in its head's kv head: its own) and
// the unit's index (b.lrow0: the unit's first of 3 kMkSliceW rows).
__device__ __forceinline__ int mk_slice_col(const MkParams &p, const TmaBlock &b, int *unit = nullptr) {
    const int u = b.lrow0 / (3 * kMkSliceW);
    if (unit) *unit = u;
    return u / kMkSliceLanes * p.head_size + u % kMkSliceLanes * kMkSliceW;
}

// The unit's rows finished (thread i < 3 kMkSliceW / 2: rows 2i and 2i + 1, of q, k or v; as
// store_rows): q into st.sl_q and q_own (kMkSliceW), k and v into the caches at the step's position.
__device__ void mk_slice_finish(const MkParams &p, const MkStage &st, const TmaBlock &b, const float *sums, float inv_rms,
                                const MkTurn &turn, float *q_own) {
    constexpr int W = kMkSliceW;
    if (threadIdx.x >= 3 * W / 2) return;
    const int hs = p.head_size, col = mk_slice_col(p, b);
    const int r = 2 * threadIdx.x, j = r / W, d = r % W;
    float v[2];
#pragma unroll
    for (int i = 0; i < 2; i++) v[i] = finish_output(warps_row_sum(sums, kMkConsumerWarps, b.prows, r + i), 0.0f, inv_rms, false);
    const float *bias = st.a.rope.bias[j];
    if (bias) v[0] += __ldg(bias + col + d), v[1] += __ldg(bias + col + d + 1);
    if (j < 2) rope_pair(v[0], v[1], turn.cs_sn.x, turn.cs_sn.y);
    if (j == 0) {
        st.sl_q[col + d] = v[0], st.sl_q[col + d + 1] = v[1];
        q_own[d] = v[0], q_own[d + 1] = v[1];
    } else {
        __half *cache = static_cast<__half *>(j == 1 ? st.a.rope.kc : st.a.rope.vc);
        *reinterpret_cast<__half2 *>(cache + (size_t)turn.pos * (p.n_kv_heads * hs) + col + d) = __floats2half2_rn(v[0], v[1]);
    }
}

// A sliced unit's key and value rows, each thread's of every pass (mk_slice_attention's layout):
// the rows before the step's loaded as soon as the unit's tiles are done (MK_SLICE_KV_EARLY,
// default on), so that their loads overlap the rows' finish and its barriers; the step's own row
// after the finish has stored it (bench/NOTES.md 110).
#ifndef MK_SLICE_KV_EARLY
#define MK_SLICE_KV_EARLY 1
#endif
struct MkSliceKV {
    uint4 k[kMkSlicePasses], v[kMkSlicePasses];
    // rows t of this thread's passes with t < pos (before), t == pos (the step's own) or both
    __device__ void load(const MkParams &p, const MkStage &st, const TmaBlock &b, int pos, bool before, bool own) {
        const int col = mk_slice_col(p, b), kv_dim = p.n_kv_heads * p.head_size, c = threadIdx.x % 32 % kMkSliceLanes, at = threadIdx.x / kMkSliceLanes;
        const __half *kc = static_cast<const __half *>(st.a.rope.kc) + col + 8 * c, *vc = static_cast<const __half *>(st.a.rope.vc) + col + 8 * c;
#pragma unroll
        for (int i = 0; i < kMkSlicePasses; i++) {
            const int t = i * kMkSliceRowsAt + at;
            if (t < pos ? before : t == pos && own)
                k[i] = __ldcg(reinterpret_cast<const uint4 *>(kc + (size_t)t * kv_dim)), v[i] = __ldcg(reinterpret_cast<const uint4 *>(vc + (size_t)t * kv_dim));
        }
    }
};

// A warp's running softmaxes (each lane group's largest score m, weight sum l and its 8 weighted
// sums acc), the groups kLanes lanes apart merged into lanes 0 .. kLanes - 1.
template <int kLanes>
__device__ __forceinline__ void mk_warp_softmax_merge(float &m, float &l, float acc[8]) {
#pragma unroll
    for (int o = kLanes; o < 32; o <<= 1) {
        const float mo = __shfl_xor_sync(0xffffffffu, m, o), lo = __shfl_xor_sync(0xffffffffu, l, o);
        const float mx = fmaxf(m, mo), base = mx == -INFINITY ? 0.0f : mx, a = expf(m - base), b = expf(mo - base);
        l = l * a + lo * b;
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] = acc[i] * a + __shfl_xor_sync(0xffffffffu, acc[i], o) * b;
        m = mx;
    }
}

// The slice's attention (q_own: its q; sm: (warps, 2 + kMkSliceW); kv: the rows before the step's, where
// MK_SLICE_KV_EARLY loaded them).
// A row t a lane group of kMkSliceLanes lanes in each pass, lane c its dimensions 8c .. 8c + 7, and
// slice c's part of the row's score from the exchange; every key and value row of the block's
// passes in flight together. The lanes' running softmaxes are merged by shuffles, then the warps'
// in shared memory (mk_attention_wide's steps), and the slice's output goes to the output
// projection flagged.
__device__ void mk_slice_attention(const MkParams &p, const MkStage &st, const TmaBlock &b, const MkTurn &turn, unsigned epoch,
                                   const float *q_own, float *sm, MkSliceKV &kv) {
    constexpr int W = kMkSliceW;
    int u;
    const int col = mk_slice_col(p, b, &u), hs = p.head_size, h = u / kMkSliceLanes, sl = u % kMkSliceLanes, pos = turn.pos;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, c = lane % kMkSliceLanes, at = threadIdx.x / kMkSliceLanes;
    kv.load(p, st, b, pos, !MK_SLICE_KV_EARLY, true);   // the step's row: its writes are the block's own, before the barrier
    const uint4 *k = kv.k, *v = kv.v;
    float q[8];
#pragma unroll
    for (int j = 0; j < 8; j++) q[j] = q_own[8 * c + j];
    uint2 *scores = p.scores + (size_t)h * kMkSliceLanes * kMkSliceRows;   // (kMkSliceLanes, kMkSliceRows): the head's
    const unsigned tag = mk_slice_tag(st, epoch);
    float part[kMkSlicePasses];
#pragma unroll
    for (int i = 0; i < kMkSlicePasses; i++) {
        const int t = i * kMkSliceRowsAt + at;
        float dot = 0.0f;
        if (t <= pos) {
            const __half2 *kh = reinterpret_cast<const __half2 *>(&k[i]);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float2 e = __half22float2(kh[j]);
                dot += q[2 * j] * e.x + q[2 * j + 1] * e.y;
            }
        }
        dot += __shfl_xor_sync(0xffffffffu, dot, 1);   // the group's lanes: the same sum in each
        dot += __shfl_xor_sync(0xffffffffu, dot, 2);
        part[i] = dot;
        if (c == sl && t <= pos) mk_store_score(scores + sl * kMkSliceRows + t, dot, tag);
    }
    unsigned long long w[kMkSlicePasses];   // lane c: slice c's part (its own: part)
#pragma unroll
    for (int i = 0; i < kMkSlicePasses; i++) {
        const int t = i * kMkSliceRowsAt + at;
        w[i] = c != sl && t <= pos ? mk_load_pair(scores + c * kMkSliceRows + t) : (unsigned long long)tag << 32;
    }
    for (;;) {   // the parts not there yet, loaded again together
        bool ready = true;
#pragma unroll
        for (int i = 0; i < kMkSlicePasses; i++) ready = ready && (unsigned)(w[i] >> 32) == tag;
        if (ready) break;
        if (MK_SLICE_BACKOFF) __nanosleep(MK_SLICE_BACKOFF);
#pragma unroll
        for (int i = 0; i < kMkSlicePasses; i++)
            if ((unsigned)(w[i] >> 32) != tag) w[i] = mk_load_pair(scores + c * kMkSliceRows + i * kMkSliceRowsAt + at);
    }
    const float inv_sqrt = 1.0f / sqrtf((float)hs);
    float sc[kMkSlicePasses], m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kMkSlicePasses; i++) {   // slices 0 + 1, 2 + 3, then both: the same order in every lane and block
        float s = c == sl ? part[i] : __uint_as_float((unsigned)w[i]);
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        sc[i] = i * kMkSliceRowsAt + at <= pos ? s * inv_sqrt : -INFINITY;
        m = fmaxf(m, sc[i]);
    }
    const float base = m == -INFINITY ? 0.0f : m;   // a group with no row: every weight 0, no NaN
    float l = 0.0f, acc[8];
#pragma unroll
    for (int j = 0; j < 8; j++) acc[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < kMkSlicePasses; i++) {
        const int t = i * kMkSliceRowsAt + at;
        const float e = expf(sc[i] - base);
        l += e;
        if (t <= pos) {
            const __half2 *vh = reinterpret_cast<const __half2 *>(&v[i]);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float2 x = __half22float2(vh[j]);
                acc[2 * j] = fmaf(e, x.x, acc[2 * j]), acc[2 * j + 1] = fmaf(e, x.y, acc[2 * j + 1]);
            }
        }
    }
    mk_warp_softmax_merge<kMkSliceLanes>(m, l, acc);   // the warp's row groups into lanes 0 .. kMkSliceLanes - 1
    float *mine = sm + warp * (2 + W);
    if (lane == 0) mine[0] = m, mine[1] = l;
    if (lane < kMkSliceLanes)
#pragma unroll
        for (int j = 0; j < 8; j++) mine[2 + 8 * lane + j] = acc[j];
    consumer_sync();
    if (threadIdx.x >= W / 2) return;
    const int d = 2 * threadIdx.x;   // a pair a thread (mk_attention_merge's sums)
    float top = -INFINITY;
    for (int x = 0; x < kMkConsumerWarps; x++) top = fmaxf(top, sm[x * (2 + W)]);
    float total = 0.0f, sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int x = 0; x < kMkConsumerWarps; x++) {   // a warp without rows: m = -inf, weight 0
        const float wx = expf(sm[x * (2 + W)] - top);
        total += sm[x * (2 + W) + 1] * wx;
        sum[0] += sm[x * (2 + W) + 2 + d] * wx, sum[1] += sm[x * (2 + W) + 3 + d] * wx;
    }
    mk_store_pair(st.sl_out + (col + d) / 2, sum[0] / total, sum[1] / total, mk_tag(epoch, st.sl_tag_writes, st.sl_tag_seq));
}

// A sliced unit after its tile loop (scratch: the stage's x area, which its tiles no longer read).
__device__ void mk_slice_unit(const MkParams &p, const MkStage &st, const TmaBlock &b, const float *sums, float inv_rms, const MkTurn &turn,
                              unsigned epoch, float *scratch, MkSliceKV &kv) {
    float *q_own = scratch, *sm = scratch + kMkSliceW;
    mk_slice_finish(p, st, b, sums, inv_rms, turn, q_own);
    if (!mk_slice_now(turn.pos)) return;
    consumer_sync();   // q_own, and the caches' row at the step's position
    mk_slice_attention(p, st, b, turn, epoch, q_own, sm, kv);
}

// Whether unit b of stage st was sliced and so finished by mk_slice_unit (the branch is left out of
// the any-shape kernel, whose code even a branch never taken makes slower).
template <typename Shape>
__device__ __forceinline__ bool mk_slice_finished(const MkParams &p, const MkStage &st, const TmaBlock &b, const float *sums, float inv_rms,
                                                  const MkTurn &turn, unsigned epoch, const MkX &xs, MkSliceKV &kv) {
    if constexpr (Shape::hs > 0) {
        if (!st.slice) return false;
        mk_slice_unit(p, st, b, sums, inv_rms, turn, epoch, reinterpret_cast<float *>(xs.d), kv);
        return true;
    }
    return false;
}

// A linear stage's units of this block; at: the ring's position, in step with the producer's.
template <typename Shape>
__device__ void mk_linear(const MkParams &p, const MkStage &st, MkRing &at, unsigned char *smem, uint32_t full, uint32_t empty,
                          float *red, const MkTurn turn, unsigned epoch) {
    MkLoop l;
    l.smem = smem, l.full = full, l.empty = empty;
    const int gshift = Shape::gshift ? Shape::gshift : st.a.group_shift + 4;
    l.xs = mk_x(smem + p.slots * p.slot_bytes, st.a.stride, gshift);
    l.sums = reinterpret_cast<float *>(smem + p.slots * p.slot_bytes + p.scratch_bytes);
    const int c = threadIdx.x % 4;
    l.f[0] = c == 0 ? 1.0f : c == 1 ? 1.0f / (254.0f * 254.0f) : 0.0f, l.f[1] = c == 0 ? 1.0f / 254.0f : 0.0f;
    l.stage = int(&st - p.stages), l.stride = st.a.stride, l.gshift = gshift, l.per_row = mk_groups_a_row(st.a.gs);
    l.slots = p.slots, l.slot_bytes = p.slot_bytes;
    const int group_steps = mk_group_steps(st.a.gs), stage = l.stage;
    const bool pair = st.pair != 0;
    const float inv_rms = mk_stage_x_of<Shape>(p, st, stage, l.xs, red, epoch);
    mk_stamp(p, stage, 2);
    for (int u = blockIdx.x; u < st.units; u += gridDim.x) {
        const TmaBlock b = mk_unit(st, u);
        MkWarpClock wc;   // (MK_TRACE_MATH; else nothing)
        wc.start();
        for (int e = threadIdx.x; e < kMkConsumerWarps * b.prows; e += kMkConsumers) l.sums[e] = 0.0f;
        consumer_sync();
        wc.started();
        mk_unit_tiles_gs<Shape>(group_steps, p, l, b, at, wc);
        MkSliceKV kv;   // (a sliced unit's, in the kernel compiled for Shape)
        if constexpr (Shape::hs > 0)
            if (MK_SLICE_KV_EARLY && st.slice && mk_slice_now(turn.pos)) kv.load(p, st, b, turn.pos, true, false);
        consumer_sync();   // sums complete
        wc.ended();
        wc.add(p, stage);
        mk_stamp(p, stage, 6);
#ifndef MK_NO_FINISH   // (a measurement build: nothing stored; only with MK_FLAGS=0, or it waits forever)
        float *sums = l.sums;
        if (st.keep)
            mk_finish_kept(st, b, sums, sums + p.sums_floats, inv_rms, mk_tag(epoch, st.ll_writes_out, st.ll_seq_out),
                           mk_tag(epoch, st.ll_writes_out, st.ll_seq_prev));
        else if (st.ll_out)
            mk_finish_flagged(st, b, sums, inv_rms, mk_tag(epoch, st.ll_writes_out, st.ll_seq_out));
        else if (!mk_slice_finished<Shape>(p, st, b, sums, inv_rms, turn, epoch, l.xs, kv))
            finish_block_rows(st.a, st.a.out[b.j], b, sums, kMkConsumerWarps, kMkConsumers, inv_rms, pair, turn.of(st, b), turn.cs_sn,
                              turn.pos);
#else
        (void)pair;
#endif
        if (p.best && stage == p.n_stages - 1) mk_unit_best(p, st, b, u, red);
        consumer_sync();   // sums free for the next unit
        mk_stamp(p, stage, 7);
    }
}

// Element j of the embedding's row (zero past dim).
__device__ __forceinline__ float mk_embed_at(const MkStage &st, size_t row, int j) {
    if (j >= st.dim) return 0.0f;
    return st.ef ? st.ef[row * st.estride + j] : st.eq[row * st.estride + j] * st.es[row * st.egroups + j / st.egs];
}
// Two elements a thread (a word when flagged).
__device__ void mk_embed(const MkParams &p, const MkStage &st, unsigned tag) {
    const size_t row = (size_t)__ldcg(p.inputs + 1);
    for (int u = blockIdx.x; u < st.units; u += gridDim.x) {
        const int j = 2 * (u * kMkConsumers + threadIdx.x);
        if (j >= st.dim) continue;
        const float v0 = mk_embed_at(st, row, j), v1 = mk_embed_at(st, row, j + 1);
        if (st.ll_out) {
            mk_store_pair(st.ll_out + j / 2, v0, v1, tag);
        } else {
            st.x[j] = v0;
            if (j + 1 < st.dim) st.x[j + 1] = v1;
        }
    }
}

// The step's attention: its position, and splits of its rows of chunk rows each.
struct MkAttnStep {
    int pos, splits, chunk;
    unsigned tag;   // the output's tag, where it goes flagged (st.ll_out)
};

// Elements i, i + 1 of the attention's output (i even): flagged where st.ll_out.
__device__ __forceinline__ void mk_attn_out(const MkStage &st, int i, float a, float b, unsigned tag) {
    if (st.ll_out) mk_store_pair(st.ll_out + i / 2, a, b, tag);
    else st.out[i] = a, st.out[i + 1] = b;
}

// The warps' running softmaxes of an attention unit (sm: (warps, 2 + head size): m, l, the
// weighted sum; a warp without rows: m = -inf, l = 0) merged into out (one split) or the unit's
// partial. Starts and ends with a barrier.
__device__ void mk_attention_merge(const MkParams &p, const MkStage &st, int h, const MkAttnStep &at, const float *sm, float *my_part) {
    const int hs = p.head_size, splits = at.splits;
    consumer_sync();
    float top = -INFINITY;
    for (int w = 0; w < kMkConsumerWarps; w++) top = fmaxf(top, sm[w * (2 + hs)]);
    float weight[kMkConsumerWarps], total = 0.0f;
#pragma unroll
    for (int w = 0; w < kMkConsumerWarps; w++) {   // a warp without rows: m = -inf, weight 0
        weight[w] = expf(sm[w * (2 + hs)] - top);
        total += sm[w * (2 + hs) + 1] * weight[w];
    }
    for (int d = 2 * threadIdx.x; d < hs; d += 2 * kMkConsumers) {   // a pair a thread (the head size is even)
        float sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int w = 0; w < kMkConsumerWarps; w++)
            sum[0] += sm[w * (2 + hs) + 2 + d] * weight[w], sum[1] += sm[w * (2 + hs) + 3 + d] * weight[w];
        if (splits == 1) mk_attn_out(st, h * hs + d, sum[0] / total, sum[1] / total, at.tag);
        else my_part[2 + d] = sum[0], my_part[3 + d] = sum[1];
    }
    if (splits > 1 && threadIdx.x == 0) my_part[0] = top, my_part[1] = total;
    consumer_sync();   // shared memory free for the next unit
}

// An attention unit's head h, its rows [t0, t1) and where its partial goes; a unit past the last
// row writes an empty partial (weight 0 in the combine) and has no rows.
struct MkAttnUnit {
    int h, t0, t1, kv_dim, kv_off;
    float *part;
};
__device__ MkAttnUnit mk_attn_unit(const MkParams &p, int unit, const MkAttnStep &at) {
    const int hs = p.head_size, split = unit % at.splits;
    MkAttnUnit a;
    a.h = unit / at.splits, a.t0 = split * at.chunk, a.t1 = min(at.pos + 1, a.t0 + at.chunk);
    a.kv_dim = p.n_kv_heads * hs, a.kv_off = a.h / (p.n_heads / p.n_kv_heads) * hs;
    a.part = p.part + ((size_t)a.h * at.splits + split) * (2 + hs);
    if (a.t0 >= a.t1)
        for (int i = threadIdx.x; i < 2 + hs; i += kMkConsumers) a.part[i] = i == 0 ? -INFINITY : 0.0f;
    return a;
}

// Attention unit (head h, split): rows [split * chunk, min(pos + 1, ...)) of the head's cache;
// with one split straight into out, else a partial (its largest score, the sum of exp(score -
// that), the exp-weighted sum of value rows) into p.part for the combine stage. Warp w takes rows
// t0 + w, + kMkConsumerWarps, ..., kRows of them at a time, all their key and value loads in
// flight together; a lane holds the head's element pairs 2 lane + 64 i, i < kPairs (head size up
// to 64 kPairs). Each warp keeps a running softmax of its rows, and the warps' are merged in
// shared memory at the end: one barrier, where a thread a row with block reductions for the
// maximum and the sum took several (bench/NOTES.md 56).
template <typename KV, int kPairs>
__device__ void mk_attention_warps(const MkParams &p, const MkStage &st, int unit, const MkAttnStep &at, float *sm) {
    const int hs = p.head_size, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const MkAttnUnit au = mk_attn_unit(p, unit, at);
    const int h = au.h, t0 = au.t0, t1 = au.t1, kv_dim = au.kv_dim;
    if (t0 >= t1) return;
    const KV *kc = static_cast<const KV *>(st.kc) + au.kv_off, *vc = static_cast<const KV *>(st.vc) + au.kv_off;
    constexpr int kRows = 16 / kPairs;   // the keys' and values' registers: 64 a lane
    float2 q[kPairs], acc[kPairs];
#pragma unroll
    for (int i = 0; i < kPairs; i++) {
        const int d = 2 * lane + 64 * i;
        q[i] = d < hs ? __ldcg(reinterpret_cast<const float2 *>(st.q + h * hs + d)) : make_float2(0.0f, 0.0f);
        acc[i] = make_float2(0.0f, 0.0f);
    }
    const float inv_sqrt = 1.0f / sqrtf((float)hs);
    float m = -INFINITY, l = 0.0f;
    for (int t = t0 + warp; t < t1; t += kMkConsumerWarps * kRows) {
        float2 k[kRows][kPairs], v[kRows][kPairs];
#pragma unroll
        for (int r = 0; r < kRows; r++) {   // rows past t1 read row t1 - 1 again, then count nothing
            const size_t row = (size_t)min(t + r * kMkConsumerWarps, t1 - 1) * kv_dim;
#pragma unroll
            for (int i = 0; i < kPairs; i++) {
                const int d = 2 * lane + 64 * i;
                k[r][i] = d < hs ? kv_load2(kc + row + d) : make_float2(0.0f, 0.0f);
                v[r][i] = d < hs ? kv_load2(vc + row + d) : make_float2(0.0f, 0.0f);
            }
        }
        float sc[kRows], mx = m;
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < kPairs; i++) dot += q[i].x * k[r][i].x + q[i].y * k[r][i].y;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            sc[r] = t + r * kMkConsumerWarps < t1 ? dot * inv_sqrt : -INFINITY;
            mx = fmaxf(mx, sc[r]);
        }
        const float rescale = expf(m - mx);   // 0 the first time (m = -inf)
        l *= rescale;
#pragma unroll
        for (int i = 0; i < kPairs; i++) acc[i].x *= rescale, acc[i].y *= rescale;
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            const float e = expf(sc[r] - mx);
            l += e;
#pragma unroll
            for (int i = 0; i < kPairs; i++) acc[i].x = fmaf(e, v[r][i].x, acc[i].x), acc[i].y = fmaf(e, v[r][i].y, acc[i].y);
        }
        m = mx;
    }
    float *mine = sm + warp * (2 + hs);   // (warps, 2 + hs): m, l, the weighted sum
    if (lane == 0) mine[0] = m, mine[1] = l;
#pragma unroll
    for (int i = 0; i < kPairs; i++) {
        const int d = 2 * lane + 64 * i;
        if (d < hs) mine[2 + d] = acc[i].x, mine[3 + d] = acc[i].y;
    }
    mk_attention_merge(p, st, h, at, sm, au.part);
}

// An attention unit as mk_attention_warps, over an FP16 cache of head size kHs (32, 64, 128 or
// 256) by 16-byte loads (MK_ATTN_WIDE, default on): kLanes lanes a row, 8 elements each, so that
// a warp loads kRowsAt rows at once and kBatch of those of the keys and of the values are in
// flight together (pairs a lane, 4-byte loads, read the cache slower: bench/NOTES.md 70, 72). Each
// group of kLanes lanes keeps a running softmax of its rows; the warp's groups are merged by
// shuffles, then the warps' in shared memory.
#ifndef MK_ATTN_WIDE
#define MK_ATTN_WIDE 1
#endif
template <int kHs>
__device__ void mk_attention_wide(const MkParams &p, const MkStage &st, int unit, const MkAttnStep &at, float *sm) {
    constexpr int kLanes = kHs / 8, kRowsAt = 32 / kLanes, kBatch = 8, kStep = kRowsAt * kBatch;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int sub = lane / kLanes, d0 = lane % kLanes * 8;   // the lane's row in each kRowsAt, its 8 elements
    const MkAttnUnit au = mk_attn_unit(p, unit, at);
    const int h = au.h, t0 = au.t0, t1 = au.t1, kv_dim = au.kv_dim;
    if (t0 >= t1) return;
    const __half *kc = static_cast<const __half *>(st.kc) + au.kv_off + d0, *vc = static_cast<const __half *>(st.vc) + au.kv_off + d0;
    float q[8], acc[8];
    const float4 *q4 = reinterpret_cast<const float4 *>(st.q + h * kHs + d0);
    const float4 qa = __ldcg(q4), qb = __ldcg(q4 + 1);
    q[0] = qa.x, q[1] = qa.y, q[2] = qa.z, q[3] = qa.w, q[4] = qb.x, q[5] = qb.y, q[6] = qb.z, q[7] = qb.w;
#pragma unroll
    for (int i = 0; i < 8; i++) acc[i] = 0.0f;
    const float inv_sqrt = 1.0f / sqrtf((float)kHs);
    float m = -INFINITY, l = 0.0f;
    for (int t = t0 + warp * kStep; t < t1; t += kMkConsumerWarps * kStep) {
        uint4 k[kBatch], v[kBatch];
#pragma unroll
        for (int r = 0; r < kBatch; r++) {   // rows past t1 read row t1 - 1 again, then count nothing
            const size_t row = (size_t)min(t + r * kRowsAt + sub, t1 - 1) * kv_dim;
            k[r] = __ldcg(reinterpret_cast<const uint4 *>(kc + row));
            v[r] = __ldcg(reinterpret_cast<const uint4 *>(vc + row));
        }
        float sc[kBatch], mx = m;
#pragma unroll
        for (int r = 0; r < kBatch; r++) {
            const __half2 *kh = reinterpret_cast<const __half2 *>(&k[r]);
            float dot = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float2 e = __half22float2(kh[j]);
                dot += q[2 * j] * e.x + q[2 * j + 1] * e.y;
            }
#pragma unroll
            for (int o = kLanes / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            sc[r] = t + r * kRowsAt + sub < t1 ? dot * inv_sqrt : -INFINITY;
            mx = fmaxf(mx, sc[r]);
        }
        const float base = mx == -INFINITY ? 0.0f : mx;   // a group with no row yet: every weight 0, no NaN
        const float rescale = expf(m - base);
        l *= rescale;
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] *= rescale;
#pragma unroll
        for (int r = 0; r < kBatch; r++) {
            const float e = expf(sc[r] - base);
            const __half2 *vh = reinterpret_cast<const __half2 *>(&v[r]);
            l += e;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float2 x = __half22float2(vh[j]);
                acc[2 * j] = fmaf(e, x.x, acc[2 * j]), acc[2 * j + 1] = fmaf(e, x.y, acc[2 * j + 1]);
            }
        }
        m = mx;
    }
    mk_warp_softmax_merge<kLanes>(m, l, acc);   // the warp's row groups into lanes 0 .. kLanes - 1
    float *mine = sm + warp * (2 + kHs);
    if (lane == 0) mine[0] = m, mine[1] = l;
    if (lane < kLanes)
#pragma unroll
        for (int i = 0; i < 8; i++) mine[2 + d0 + i] = acc[i];
    mk_attention_merge(p, st, h, at, sm, au.part);
}

// (MK_NO_ATTN, a measurement build with MK_FREE: the attention's outputs written at once, as zeros)
#ifdef MK_NO_ATTN
__device__ void mk_no_attention(const MkParams &p, const MkStage &st, int unit, const MkAttnStep &at) {
    const MkAttnUnit au = mk_attn_unit(p, unit, at);
    const int hs = p.head_size;
    for (int d = 2 * threadIdx.x; d < hs; d += 2 * kMkConsumers) {
        if (at.splits == 1) mk_attn_out(st, au.h * hs + d, 0.0f, 0.0f, at.tag);
        else au.part[2 + d] = 0.0f, au.part[3 + d] = 0.0f;
    }
    if (at.splits > 1 && threadIdx.x == 0) au.part[0] = 0.0f, au.part[1] = 1.0f;
}
#endif
// mk_attention_warps for the head size: pairs a lane as few as it takes.
template <typename KV, typename Shape>
__device__ void mk_attention_by_warps(const MkParams &p, const MkStage &st, int unit, const MkAttnStep &at, float *sm) {
    static_assert(kMaxHeadSize <= 256, "head sizes up to 4 pairs a lane");
    static_assert(!Shape::hs || (MK_ATTN_WIDE && sizeof(KV) == 2), "a shape's head size: the FP16 cache's wide attention");
    if constexpr (Shape::hs > 0) {
        mk_attention_wide<Shape::hs>(p, st, unit, at, sm);
    } else {
        if (MK_ATTN_WIDE && sizeof(KV) == 2) {
            switch (p.head_size) {
            case 32: return mk_attention_wide<32>(p, st, unit, at, sm);
            case 64: return mk_attention_wide<64>(p, st, unit, at, sm);
            case 128: return mk_attention_wide<128>(p, st, unit, at, sm);
            case 256: return mk_attention_wide<256>(p, st, unit, at, sm);
            default: break;
            }
        }
        if (p.head_size <= 64) mk_attention_warps<KV, 1>(p, st, unit, at, sm);
        else if (p.head_size <= 128) mk_attention_warps<KV, 2>(p, st, unit, at, sm);
        else mk_attention_warps<KV, 4>(p, st, unit, at, sm);
    }
}

// Combine unit h: the splits' partial softmaxes of head h rescaled to one (attention_combine_kernel).
__device__ void mk_combine_unit(const MkParams &p, const MkStage &st, int h, const MkAttnStep &at, float *weight, float *red) {
    const int splits = at.splits;
    const int stride = 2 + p.head_size;
    const float *part = p.part + (size_t)h * splits * stride;
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < splits; s += kMkConsumers) mx = fmaxf(mx, __ldcg(part + s * stride));
    const float gmax = block_reduce<true, kMkConsumers>(mx, red);
    float total = 0.0f;
    for (int s = threadIdx.x; s < splits; s += kMkConsumers) {
        const float w = expf(__ldcg(part + s * stride) - gmax);
        weight[s] = w;
        total += __ldcg(part + s * stride + 1) * w;
    }
    total = block_reduce<false, kMkConsumers>(total, red);   // its barriers also publish weight
    for (int d = 2 * threadIdx.x; d < p.head_size; d += 2 * kMkConsumers) {
        float acc[2] = {0.0f, 0.0f};
        for (int s = 0; s < splits; s++) {
            const float2 v = __ldcg(reinterpret_cast<const float2 *>(part + s * stride + 2 + d));
            acc[0] += v.x * weight[s], acc[1] += v.y * weight[s];
        }
        mk_attn_out(st, h * p.head_size + d, acc[0] / total, acc[1] / total, at.tag);
    }
    consumer_sync();
}

// After attention unit `unit` of the layer's attention `layer` (0, 1, ... in the step) with more
// than one split: its block counts the split in its head's counter (p.counters[n_stages + 2 +
// h], zero at the step's start), and the block that counts the head's last split of the layer
// combines them (MK_LAST_COMBINES). Every split of the layer before was counted before any of
// this layer's (the attention waits for this layer's QKV, which comes after the layer before's
// output projection, whose x is every head's output, each written after its head's last split
// was counted), so the last is the one that finds (layer + 1) * splits - 1 before it. The count
// is a release (the partial's writes, through the barrier) and an acquire (the other splits'
// partials, for the combine's loads after the barrier).
__device__ void mk_combine_if_last(const MkParams &p, const MkStage &st, int unit, const MkAttnStep &at, int layer, float *weight,
                                   float *red) {
    __shared__ int last;
    const int h = unit / at.splits;
    consumer_sync();   // every thread's writes of the partial
    if (threadIdx.x == 0) {
        unsigned before;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(p.counters + p.n_stages + 2 + h) : "memory");
        last = before + 1 == (unsigned)((layer + 1) * at.splits);
    }
    consumer_sync();
    if (last) mk_combine_unit(p, st, h, at, weight, red);
}

// Waits until stage `stage` has counted `units` units done (thread 0 polls), then a barrier.
__device__ void mk_wait(const MkParams &p, int stage, int units) {
#ifdef MK_NO_WAIT   // (a measurement build: with MK_FLAGS=0, MK_NO_MATH and MK_NO_FINISH, the weights' stream alone)
    return;
#endif
    if (threadIdx.x == 0)
        while (load_acquire(p.counters + stage) < (unsigned)units) {}
    consumer_sync();
}

// -DMK_STEP_CLOCK (a build for measurement only): %globaltimer at a step's kernel entry (k = 0, block
// 0), after its consumers' PDL wait (1, block 0) and when its last block is out (2), for the last
// kMkClockSteps steps by epoch; gpu_mega_free prints the steps' period, span and gap between.
constexpr int kMkClockSteps = 4096;
#ifdef MK_STEP_CLOCK
__device__ unsigned long long mk_clock_log[3][kMkClockSteps];
#endif
__device__ __forceinline__ void mk_step_clock(const MkParams &p, int k) {
#ifdef MK_STEP_CLOCK
    if (threadIdx.x != 0 || (k < 2 && blockIdx.x != 0)) return;
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    mk_clock_log[k][__ldcg(p.counters + p.n_stages + 1) % kMkClockSteps] = t;
#else
    (void)p, (void)k;
#endif
}

// Adds n to a stage's count, after (release) every write this thread has seen: the consumers'
// writes of the stage, through the barrier before it.
__device__ __forceinline__ void mk_count(unsigned *counter, unsigned n) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(counter), "r"(n) : "memory");
}

template <typename KV, typename Shape>
__device__ void mk_consume(const MkParams &p, unsigned char *smem, uint32_t full, uint32_t empty, float *red) {
    pdl_wait();   // the step's inputs and the caches: after the kernels before have finished
    mk_step_clock(p, 1);
    const int pos = __ldcg(p.inputs), splits = mk_splits(pos, p.n_heads);
    float *scratch = reinterpret_cast<float *>(smem + p.slots * p.slot_bytes);
    MkRing at;   // the ring's position, in step with the producer's
    const MkTurn turn = mk_turn<Shape>(p, pos);
    const unsigned epoch = __ldcg(p.counters + p.n_stages + 1);
    int before = -1, before_units = 0;   // the last stage with units
    for (int s = 0, layer = 0; s < p.n_stages; layer += p.stages[s].kind == MK_ATTENTION, s++) {
        const MkStage &st = p.stages[s];
        const int units = mk_stage_units<Shape>(st, splits, p.n_heads, pos), mine = my_units(units);
        if (mine > 0) {
            mk_stamp(p, s, 0);
            if (before >= 0 && st.wait) mk_wait(p, before, before_units);
            mk_stamp(p, s, 1);
            if (st.kind == MK_GEMV) mk_linear<Shape>(p, st, at, smem, full, empty, red, turn, epoch);
            else if (st.kind == MK_EMBED) mk_embed(p, st, mk_tag(epoch, st.ll_writes_out, st.ll_seq_out));
            else {
                const MkAttnStep step = {pos, splits, ceil_div_dev(pos + 1, splits), mk_tag(epoch, st.ll_writes_out, st.ll_seq_out)};
                for (int u = blockIdx.x; u < units; u += gridDim.x) {
                    if (st.kind != MK_ATTENTION) {
                        mk_combine_unit(p, st, u, step, scratch, red);
                        continue;
                    }
#ifdef MK_NO_ATTN
                    mk_no_attention(p, st, u, step);
#else
                    mk_attention_by_warps<KV, Shape>(p, st, u, step, scratch);
#endif
#ifndef MK_NO_COMBINE   // (a measurement build: the splits' partials never combined; with MK_FREE=wo)
                    if (MK_LAST_COMBINES && splits > 1) mk_combine_if_last(p, st, u, step, layer, scratch, red);
#endif
                }
            }
            if (st.count) {
                consumer_sync();   // every thread's writes of this stage, before the count
                if (threadIdx.x == 0) mk_count(p.counters + s, (unsigned)mine);
            }
            mk_stamp(p, s, 3);
        }
        if (units > 0) before = s, before_units = units;
    }
    __shared__ int last_out;
    if (threadIdx.x == 0) {
        __threadfence();   // this block's writes (p.best among them) before its count
        last_out = atomicAdd(p.counters + p.n_stages, 1u) == gridDim.x - 1;
    }
    consumer_sync();
    if (!last_out) return;
    mk_step_clock(p, 2);
    __threadfence();   // every block's writes, seen through its count, before the loads below
    if (p.best) mk_step_argmax(p, pos, red);
    if (threadIdx.x == 0) {   // the last block out resets the counters for the next step
        for (int s = 0; s <= p.n_stages; s++) p.counters[s] = 0;
        for (int h = 0; h < p.n_heads; h++) p.counters[p.n_stages + 2 + h] = 0;
        p.counters[p.n_stages + 1]++;   // the next step's epoch
        __threadfence();
    }
}

// Registers moved from the producers to the consumers (MK_REGS, default on; sm_90a's setmaxnreg,
// a warpgroup at a time; bench/NOTES.md 81): the producer warpgroup keeps kMkProducerRegs a thread
// and the consumer warpgroups take the rest of the block's, kMkRegs a thread, where the launch
// gives every thread the same share of the SM's register file, kMkLaunchRegs (at which the
// consumers' code spilled). A consumer's setmaxnreg.inc waits until the producers' registers are
// back in the block's pool: the host checks that the kernel was compiled to kMkLaunchRegs, so that
// the pool holds them all (gpu_mega_create).
#ifndef MK_REGS
#define MK_REGS 1
#endif
constexpr int kMkProducerThreads = kMkThreads - kMkConsumers;   // setmaxnreg: one warpgroup, after the consumers'
constexpr int kMkProducerRegs = 40, kMkLaunchRegs = 65536 / kMkThreads / 8 * 8;
constexpr int kMkRegs = MK_REGS && kMkBlocksPerSm == 1 && kMkConsumers % 128 == 0 && kMkProducerThreads == 128
                            ? ((kMkLaunchRegs * kMkThreads - kMkProducerRegs * kMkProducerThreads) / kMkConsumers) / 8 * 8 : 0;
__device__ __forceinline__ void mk_give_registers() {   // by the producer warpgroup
#if WG_SM90A
    if (kMkRegs) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kMkProducerRegs));
#endif
}
__device__ __forceinline__ void mk_take_registers() {   // by each consumer warpgroup
#if WG_SM90A
    if (kMkRegs) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kMkRegs));
#endif
}
template <typename KV, typename Shape>
__global__ void __launch_bounds__(kMkThreads, kMkBlocksPerSm) mega_kernel(const MkParams p) {
    extern __shared__ __align__(128) unsigned char mk_smem[];
    __shared__ float red[32];
    mk_step_clock(p, 0);
    const uint32_t ring = (uint32_t)__cvta_generic_to_shared(mk_smem);
    const uint32_t full = ring + p.slots * p.slot_bytes + p.scratch_bytes + 4 * (p.sums_floats + p.keep_floats), empty = full + 8 * p.slots;
    if (threadIdx.x == 0) {   // full: the producer's arrival with the tile's bytes
        for (int s = 0; s < p.slots; s++) mbar_init(full + 8 * s, 1), mbar_init(empty + 8 * s, kMkGroupThreads);
        mbar_init_fence();
    }
    __syncthreads();   // the only block-wide barrier: the ring's barriers initialised
    if (threadIdx.x >= kMkConsumers) {
        mk_give_registers();
        mk_produce(p, ring, full, empty);   // weights only: no wait for the kernel before
    } else {
        mk_take_registers();
        mk_consume<KV, Shape>(p, mk_smem, full, empty, red);
    }
    pdl_release();
}

}  // namespace

constexpr int kMkFlagBufs = 8;
struct GpuMega {
    MkParams p;
    uint2 *flag_bufs[kMkFlagBufs];   // the flagged copies of x handed over (mk_flags)
    int n_flag_bufs;
    MkStage *stages;   // device copy of p.stages
    unsigned char *pack;   // the linear stages' weights in tile order (MkPack), a copy of the matrices'
    size_t pack_bytes;
    size_t smem;
    int blocks;
    void (*kernel)(MkParams);   // mega_kernel for the KV cache's type and, where the model has it, a compiled shape (MkShape)
    const char *shape;          // that shape, or NULL
    bool sliced;                // QKV in head slices (mk_slice_qkv)
    int x_parts;                // the most parts an x is staged in (mk_split_long_x)
    float *part_rows;           // the first parts' output, read by no one (mk_part_rows), or NULL
    int *kinds;        // host: each stage's MK_* (the trace report)
};

// Units of a linear stage of a.tma_rows rows, each output's own (set in st, returned).
static int mk_units_of(MkStage *st, int n_out) {
    st->units = 0;
    for (int j = 0; j < 3; j++) st->units += st->units_of[j] = j < n_out ? ceil_div_i(st->a.out[j].N, st->a.tma_rows) : 0;
    return st->units;
}

// A linear unit's rows at most (MK_UNIT_ROWS): its row sums take kMkConsumerWarps floats a row of
// shared memory, which a large vocabulary's classifier would otherwise take from the ring, or
// from the room under the SM's carveout step (bench/NOTES.md 98, 104).
#ifndef MK_UNIT_ROWS
#define MK_UNIT_ROWS 256
#endif
constexpr int kMkUnitRows = MK_UNIT_ROWS;

// The linear stage of a call (M = 1, INT8): rows a unit such that the units of all outputs
// cover the grid once, or twice, ... where a unit would have more than kMkUnitRows. false (with
// why) where the megakernel cannot run it.
static bool mk_linear_stage(GpuCtx *g, const LinearCall *c, int blocks, MkStage *st, char *why) {
    const Mat *w = c->w[0];
    if (c->M != 1 || !w->q || !form_consistent(c)) return snprintf(why, ERR_LEN, "a linear layer is not INT8 at M = 1"), false;
    st->kind = MK_GEMV;
    st->a = linear_q8_args(g, c);
    st->pair = c->form == LINEAR_SWIGLU, st->norm = c->norm_w != NULL;
    Q8Args &a = st->a;
    st->x_off = 0, st->x_len = a.K, st->src_stride = a.stride, st->src_groups = a.groups;
    if (a.group_shift < 0 || a.stride % 16) return snprintf(why, ERR_LEN, "group size %d or row stride %d", a.gs, a.stride), false;
    const int n_out = st->pair ? 1 : a.n_out;
    for (int j = 0; j < (st->pair ? 2 : a.n_out); j++)
        if (reinterpret_cast<uintptr_t>(a.out[j].q) % 16) return snprintf(why, ERR_LEN, "weights not 16-byte aligned"), false;
    int rows = 0;
    for (int j = 0; j < n_out; j++) rows += a.out[j].N;
    const int per_row = st->pair ? 2 : 1;
    for (int per_block = 1;; per_block++) {   // units a block: one, or more where a unit would have too many rows
        a.tma_rows = round_up(ceil_div_i(rows, blocks * per_block), 2);
        for (;; a.tma_rows += 2) {   // QKV: each output's units round up on their own
            if (mk_units_of(st, n_out) <= blocks * per_block) break;
        }
        // then whole tiles a unit (the records' rows past a unit's are zeros, read as the others):
        // as many tiles a unit, the same or fewer units
        a.tma_rows = round_up(a.tma_rows * per_row, kMkRows) / per_row;
        mk_units_of(st, n_out);
        if (a.tma_rows * per_row <= kMkUnitRows) return true;
    }
}

// The linear stages' weights copied into tile order (MkPack) in one allocation, each stage's pack
// pointer set. false (with why) where the GPU's memory has no room for the copy.
static bool mk_pack(GpuCtx *g, MkStage *stages, int n, unsigned char **pack, size_t *bytes, char *why) {
    *bytes = 0;
    for (int s = 0; s < n; s++)
        if (stages[s].kind == MK_GEMV) *bytes += mk_record_at(stages[s], stages[s].units, 0);
    // room for the copy and a margin: the schedule's own buffers and the step's graph come after it
    constexpr size_t kMargin = 256u << 20;
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const cudaError_t e = *bytes + kMargin <= free_bytes ? cudaMalloc(pack, *bytes) : cudaErrorMemoryAllocation;
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();   // not sticky: clear it for the calls after
        snprintf(why, ERR_LEN, "its copy of the weights in tile order (%.2f GB) does not fit the GPU's free memory (%.2f GB)", *bytes / 1e9,
                 free_bytes / 1e9);
        return false;
    }
    CUDA_CHECK(e);
    size_t at = 0;
    for (int s = 0; s < n; s++) {
        MkStage &st = stages[s];
        if (st.kind != MK_GEMV) continue;
        st.pack = *pack + at;
        launch(g, "mk_pack_kernel", mk_pack_kernel, dim3(st.units, mk_tiles_a_unit(st)), dim3(256), 0, st, *pack + at);
        at += mk_record_at(st, st.units, 0);
    }
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    return true;
}

// Whether stage t writes x (len: how many elements, can: whether it can write them flagged).
static bool mk_writes(const MkStage &t, const float *x, int *len, bool *can) {
    if (t.kind == MK_EMBED) return *len = t.dim, *can = true, t.x == x;
    if (t.kind == MK_ATTENTION) return *len = t.dim, *can = MK_ATTN_FLAGS && MK_LAST_COMBINES, t.out == x;
    if (t.kind != MK_GEMV) return *len = 0, *can = false, t.out == x;
    for (int j = 0; j < 3; j++)
        if (t.a.out[j].y == x) {
            *len = t.a.out[j].N;
            *can = !t.a.rope.inputs && (t.pair || t.a.n_out == 1) && (!t.a.accumulate || t.keep);
            return true;
        }
    return false;
}

// Whether each block can keep its rows of the residual stream (mk_finish_kept): every linear
// stage that adds to an output adds to the same one, in the same units, one a block at most, of
// 2 kMkConsumers rows at most, without biases or RoPE; no other stage writes it after the first
// such stage. Sets the stages' keep; returns the floats kept a block (0: none).
static int mk_keep_residual(MkStage *st, int n, int blocks) {
    const MkStage *first = NULL;
    for (int s = 0; s < n; s++)
        if (st[s].kind == MK_GEMV && st[s].a.accumulate) {
            first = &st[s];
            break;
        }
    if (!MK_KEEP_RESIDUAL || !first) return 0;
    const float *y = first->a.out[0].y;
    for (int s = 0; s < n; s++) {
        const MkStage &t = st[s];
        if (t.kind == MK_GEMV && t.a.accumulate) {
            const bool same = !t.pair && t.a.n_out == 1 && t.a.out[0].y == y && !t.a.rope.inputs && t.units == first->units &&
                              t.a.tma_rows == first->a.tma_rows && t.units <= blocks && t.a.tma_rows <= 2 * kMkConsumers;
            if (!same) return 0;
            continue;
        }
        int len = 0;
        bool can = false;
        if (mk_writes(t, y, &len, &can) && &t > first) return 0;
    }
    for (int s = 0; s < n; s++)
        if (st[s].kind == MK_GEMV && st[s].a.accumulate) st[s].keep = &st[s] == first ? 1 : 2;
    return round_up(first->a.tma_rows, 4);
}

// Hand-overs with flags (MK_FLAGS, default on; bench/NOTES.md 63). Where a linear stage's x is
// written whole by the stage right before it (the residual stream by the output projection, w2 or
// the embedding; the SwiGLU's output by w1/w3; the attention's output by the attention,
// MK_ATTN_FLAGS), its elements go over tagged (mk_store_pair): the stage reads x as soon as each
// element is there instead of after the stage before has counted (a fence, an atomic and a poll:
// round trips to L2 behind the weights' stream), and the stage before does not count. A buffer
// goes over flagged only if every stage that writes it can (the embedding; a linear stage without
// RoPE of one output or the pair; a kept residual add; the attention, where the last split
// combines) and writes all of it, only linear stages read it, none before the step's first
// write, and its tags reach (mk_tags_reach). Each such buffer gets a flagged copy (bufs, at most
// kMkFlagBufs); stages' wait and count are set.
#ifndef MK_FLAGS
#define MK_FLAGS 1
#endif
// The whole x that linear stage t reads a part of (mk_split_long_x), or all of.
static const float *mk_x_whole(const MkStage &t) { return t.a.x - t.x_off; }
// Whether stage t reads its x from the flagged buffer buf (at its part's place in it).
static bool mk_reads_flagged(const MkStage &t, const uint2 *buf) { return t.ll_in && t.ll_in - t.x_off / 2 == buf; }
// Whether stage `from` is the one right before linear stage s, or before only the parts of s's x
// that come first (mk_split_long_x: those write no other stage's input, only the block's kept rows).
static bool mk_written_before(const MkStage *st, int s, int from) {
    int b = s - 1;
    while (b > from && st[b].kind == MK_GEMV && st[b].x_len == st[s].x_len && mk_x_whole(st[b]) == mk_x_whole(st[s]) &&
           st[b].x_off < st[s].x_off)
        b--;
    return b == from;
}
// Whether x can go over flagged (above).
static bool mk_flaggable(const MkStage *st, int n, const float *x, int len) {
    bool written = false;
    for (int s = 0; s < n; s++) {
        const MkStage &t = st[s];
        int wlen = 0;
        bool can = false;
        if (t.kind == MK_ATTENTION && (t.q == x || t.kc == x || t.vc == x)) return false;
        if (t.kind == MK_GEMV && mk_x_whole(t) == x && !written) return false;
        if (mk_writes(t, x, &wlen, &can)) {
            if (!can || wlen != len || (t.kind == MK_GEMV && t.a.accumulate && !written)) return false;   // adds to x: reads it
            written = true;
        }
    }
    return true;
}
// Whether the 4-bit tags of buffer buf tell every block's reads apart: each block's read of it
// (x staged, or a kept add's first rows) at most 15 writes after the last write it saw all of (x
// staged: every word) or, for its kept rows, wrote itself. A step is a launch, so at its start a
// block has seen all of the step before's writes (before the first step, the buffer's zeros:
// write -1). A block reads in the stages where it has a unit, which the schedule fixes, and its
// reads are ordered by its barriers and its own stores, so that none sees an older write of a word
// than one the block saw or made before. A stage whose reads would be out of reach but whose x is
// written by the stage right before it (the classifier, in blocks with no unit in any stage that
// reads x before it) waits for that stage's count as well (ll_counted), after which its reads see
// that write.
static bool mk_tags_reach(MkStage *st, int n, const uint2 *buf, int blocks) {
    for (int b = 0; b < blocks; b++) {
        long long seen = -1, own = -1;   // own: the block's last write of its kept rows, which its own reads see
        for (int s = 0; s < n; s++) {
            MkStage &t = st[s];
            const bool reads = mk_reads_flagged(t, buf), reads_prev = t.ll_out == buf && t.keep == 1;
            if (t.kind != MK_GEMV || b >= t.units) continue;
            if (reads || reads_prev) {
                const long long want = reads ? t.ll_seq_in : t.ll_seq_prev;
                const long long base = reads ? seen : (seen > own ? seen : own);
                const bool reach = want >= base && want - base <= 15;
                if (!reach && !(reads && t.ll_from == s - 1)) return false;
                if (!reach) t.ll_counted = 1;
                if (reads) seen = want;
            }
            if (t.ll_out == buf && t.keep) own = t.ll_seq_out;
        }
    }
    return true;
}
// A stage counts its units where the stage after it waits for them (the last stage always does).
static void mk_counts_from_waits(MkStage *st, int n) {
    for (int s = 0; s + 1 < n; s++) st[s].count = st[s + 1].wait;
}
static int mk_flags(MkStage *st, int n, uint2 **bufs, int blocks) {
    int n_bufs = 0, n_refused = 0;
    const float *refused[kMkFlagBufs];
    for (int s = 0; s < n; s++) st[s].wait = st[s].count = 1;
    for (int r = 0; MK_FLAGS && r < n && n_bufs < kMkFlagBufs && n_refused < kMkFlagBufs; r++) {
        if (st[r].kind != MK_GEMV) continue;
        const float *x = mk_x_whole(st[r]);
        bool tried = false;
        for (int i = 0; i < n_refused; i++) tried = tried || refused[i] == x;
        if (st[r].ll_in || tried || !mk_flaggable(st, n, x, st[r].x_len)) continue;
        uint2 *buf = NULL;
        const size_t words = ((size_t)st[r].x_len + 1) / 2;
        CUDA_CHECK(cudaMalloc(&buf, words * sizeof(uint2)));
        CUDA_CHECK(cudaMemset(buf, 0, words * sizeof(uint2)));   // tag 0: write -1's
        int writes = 0;
        for (int s = 0, last = -1; s < n; s++) {
            int wlen = 0;
            bool can = false;
            if (st[s].kind == MK_GEMV && mk_x_whole(st[s]) == x)
                st[s].ll_in = buf + st[s].x_off / 2, st[s].ll_from = last, st[s].ll_seq_in = writes - 1;
            if (mk_writes(st[s], x, &wlen, &can)) {
                st[s].ll_out = buf, st[s].ll_seq_prev = writes - 1, st[s].ll_seq_out = writes++;
                last = s;
            }
        }
        for (int s = 0; s < n; s++) {
            if (mk_reads_flagged(st[s], buf)) st[s].ll_writes_in = writes;
            if (st[s].ll_out == buf) st[s].ll_writes_out = writes;
        }
        if (mk_tags_reach(st, n, buf, blocks)) {
            bufs[n_bufs++] = buf;
            continue;
        }
        for (int s = 0; s < n; s++) {   // counted instead
            if (mk_reads_flagged(st[s], buf)) st[s].ll_in = NULL, st[s].ll_counted = 0;
            if (st[s].ll_out == buf) st[s].ll_out = NULL;
        }
        CUDA_CHECK(cudaFree(buf));
        refused[n_refused++] = x;
    }
    for (int s = 0; s < n; s++)
        if (st[s].ll_in && mk_written_before(st, s, st[s].ll_from) && !st[s].ll_counted) st[s].wait = 0;
    mk_counts_from_waits(st, n);
    return n_bufs;
}

#ifdef MK_FREE
// A measurement build: what the waits into some stages cost. The environment variable MK_FREE
// names stages by their role in a layer (qkv, attn, combine, wo, w13, w2, cls; or all), and those
// stages neither wait for a count nor for x's tags: every block goes on with whatever the buffers
// hold; a stage before one that no longer waits does not count. The stages' other work, and every
// other wait, stay as they are.
static const char *mk_role(const MkStage *st, int s, int n) {
    const MkStage &t = st[s];
    if (t.kind == MK_ATTENTION) return "attn";
    if (t.kind == MK_COMBINE) return "combine";
    if (t.kind != MK_GEMV) return "embed";
    if (t.pair) return "w13";
    if (t.x_len > t.a.K) return "w2";   // a part of it (mk_split_long_x)
    int last = n - 1;
    while (last > 0 && st[last].kind != MK_GEMV) last--;
    if (s == last) return "cls";
    for (int b = s - 1; b >= 0; b--) {   // the nearest linear or attention stage before it
        if (st[b].kind == MK_ATTENTION || st[b].kind == MK_COMBINE) return "wo";
        if (st[b].kind == MK_GEMV) return st[b].pair ? "w2" : "qkv";
    }
    return "qkv";
}
static void mk_free(MkStage *st, int n) {
    const char *names = getenv("MK_FREE");
    if (!names || !*names) return;
    int freed = 0;
    for (int s = 0; s < n; s++) {
        const char *role = mk_role(st, s, n), *at = strstr(names, role);
        const size_t len = strlen(role);
        if (strcmp(names, "all") && !(at && (at == names || at[-1] == ',') && (at[len] == ',' || !at[len]))) continue;
        st[s].wait = 0, st[s].free_x = st[s].kind == MK_GEMV, freed++;
    }
    mk_counts_from_waits(st, n);   // a stage no one waits for any more does not count
    fprintf(stderr, "megakernel: MK_FREE=%s: %d stages not waited for (wrong results)\n", names, freed);
}
#endif

// Whether kernel runs a block of smem bytes an SM, each with the registers it takes (else why).
static bool mk_kernel_fits(void (*kernel)(MkParams), size_t smem, char *why) {
    int per_sm = 0;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kMkThreads, smem));
    if (per_sm < kMkBlocksPerSm) return snprintf(why, ERR_LEN, "a block of %zu bytes of shared memory does not fit an SM", smem), false;
    cudaFuncAttributes attr = {};
    CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    // (else the consumers would wait for registers the block does not have)
    if (kMkRegs && attr.numRegs * kMkThreads < kMkRegs * kMkConsumers + kMkProducerRegs * kMkProducerThreads)
        return snprintf(why, ERR_LEN, "it was compiled to %d registers a thread, too few to give its consumers %d", attr.numRegs, kMkRegs), false;
    return true;
}
// Whether every stage takes MkShape128's paths (flags set: x's batches depend on them).
static bool mk_takes_shape128(const MkStage *st, int n, MegaAttention at) {
    if (!at.kv_half || at.head_size != MkShape128::hs || !MK_ATTN_WIDE) return false;
    for (int s = 0; s < n; s++) {
        if (st[s].kind != MK_GEMV) continue;
        const int quads = mk_x_quads(mk_x_pad(st[s].a.stride), st[s].norm, st[s].ll_in != NULL);
        if (mk_group_steps(st[s].a.gs) != MkShape128::group_steps || quads != MkShape128::x_quads)
            return false;
    }
    return true;
}

static size_t mk_smem_bytes(const MkParams &p) {
    return (size_t)p.slots * p.slot_bytes + p.scratch_bytes + 4 * ((size_t)p.sums_floats + p.keep_floats) + 16 * (size_t)p.slots;
}

// The shared memory areas the stages set: x's staging area (or an attention unit's floats), a
// unit's row sums, a ring slot.
static void mk_size_areas(const MkStage *st, int n, MkParams *p) {
    p->scratch_bytes = kMkAttnFloats * 4, p->sums_floats = 0, p->slot_bytes = kMkTileBytes;
    for (int s = 0; s < n; s++) {
        const MkStage &t = st[s];
        if (t.kind != MK_GEMV) continue;
        const int x_bytes = mk_x_bytes(t.a.stride, t.a.group_shift + 4), sums = kMkConsumerWarps * (t.pair ? 2 : 1) * t.a.tma_rows;
        const int slot_bytes = mk_record_bytes(t.a.gs);
        p->scratch_bytes = x_bytes > p->scratch_bytes ? x_bytes : p->scratch_bytes;
        p->sums_floats = sums > p->sums_floats ? sums : p->sums_floats;
        p->slot_bytes = slot_bytes > p->slot_bytes ? slot_bytes : p->slot_bytes;
    }
    p->scratch_bytes = round_up(p->scratch_bytes, 128);
    p->slot_bytes = round_up(p->slot_bytes, 128);
}

// The SM's shared memory carveout below its largest (sm_90: 196 KB, then 228 KB): a block past it
// leaves the SM 28 KB of L1, and the step runs slower (bench/NOTES.md 103).
constexpr int kMkCarveoutStep = 196 * 1024;

// Whether linear stage t is one of the first parts of a split x (they add to the block's kept rows
// only: mk_split_long_x).
static bool mk_adds_kept_only(const MkStage &t) { return t.kind == MK_GEMV && t.x_off + t.a.K < t.x_len; }

// The parts of stage t's columns whose x staging areas are each at most room bytes, and the
// columns a part (whole tiles and groups): 1 where t's x fits whole; 2 .. MK_X_PARTS; 0 where none
// do, or t is not a residual add without a norm (w2).
static int mk_x_parts(const MkStage &t, int room, int *cols) {
    if (t.kind != MK_GEMV || round_up(mk_x_bytes(t.a.stride, t.a.group_shift + 4), 128) <= room) return 1;
    if (t.pair || t.norm || t.a.n_out != 1 || !t.a.accumulate || t.a.rope.inputs) return 0;
    const int unit = t.a.gs > kMkCols ? t.a.gs : kMkCols, units = ceil_div_i(t.a.stride, unit);
    for (int k = 2; k <= MK_X_PARTS && k <= units; k++) {
        *cols = ceil_div_i(units, k) * unit;
        if (round_up(mk_x_bytes(*cols, t.a.group_shift + 4), 128) <= room && (k - 1) * *cols < t.a.K) return k;
    }
    return 0;
}

// Where a linear stage's x takes the block, with the deepest ring, past the carveout step, each
// residual add's x that does (w2's) is split into the fewest parts of its columns that bring the
// block within it: each part a linear stage of its own over the same rows, the first ones adding
// to the block's kept rows only (their output: a row no one reads, mk_part_rows), the last storing
// the sum. The consumers' code stays as it is: x staged in parts within one stage grew the
// kernels' code and was slower (bench/NOTES.md 103). Needs the kept rows (mk_keep_residual);
// else, or where any x too long cannot be split, the stages as they are. Returns the stages (st,
// or a new array in its place: *n, p's areas and *parts, the most a stage was split into, set).
static MkStage *mk_split_long_x(MkStage *st, int *n, MkParams *p, int blocks, int *parts) {
    MkParams deep = *p;
    deep.slots = kMkMaxSlots;
    const int room = kMkCarveoutStep / kMkBlocksPerSm - 1024 - (int)(mk_smem_bytes(deep) - p->scratch_bytes);
    if (MK_X_PARTS < 2 || !p->keep_floats || p->scratch_bytes <= room || round_up(kMkAttnFloats * 4, 128) > room) return st;
    MkStage *out = (MkStage *)calloc((size_t)*n * MK_X_PARTS, sizeof(MkStage));
    int m = 0, cols = 0;
    for (int s = 0; s < *n; s++) {
        const int k = mk_x_parts(st[s], room, &cols);
        if (!k) return free(out), *parts = 1, st;
        for (int i = 0; i < k; i++) {
            MkStage t = st[s];
            if (k > 1) {
                const int off = i * cols, end = i + 1 < k ? off + cols : st[s].a.stride;
                t.x_off = off, t.a.x += off, t.a.out[0].q += off, t.a.out[0].s += off / t.a.gs;
                t.a.stride = end - off, t.a.K = (end < st[s].a.K ? end : st[s].a.K) - off, t.a.groups = ceil_div_i(t.a.K, t.a.gs);
                *parts = k > *parts ? k : *parts;
            }
            t.keep = 0;
            out[m++] = t;
        }
    }
    mk_keep_residual(out, m, blocks);
    bool kept = true;
    for (int s = 0; s < m; s++) kept = kept && (!mk_adds_kept_only(out[s]) || out[s].keep == 2);
    if (!kept) return free(out), *parts = 1, st;
    free(st);
    *n = m;
    mk_size_areas(out, m, p);
    return out;
}

// The first parts' output (mk_split_long_x): a row of the largest's length, written and never
// read; their stages' y set to it. NULL where there are none.
static float *mk_part_rows(MkStage *st, int n) {
    int rows = 0;
    for (int s = 0; s < n; s++)
        if (mk_adds_kept_only(st[s]) && st[s].a.out[0].N > rows) rows = st[s].a.out[0].N;
    if (!rows) return NULL;
    float *part_rows = NULL;
    CUDA_CHECK(cudaMalloc(&part_rows, (size_t)rows * sizeof(float)));
    for (int s = 0; s < n; s++)
        if (mk_adds_kept_only(st[s])) st[s].a.out[0].y = part_rows;
    return part_rows;
}

// QKV as head slices (MK_SLICES; mk_slice_attention): every QKV stage (the linear stages with
// RoPE) of a model whose heads the heads-of-128 kernel takes, each head its own kv head, in
// kMkSliceLanes slices a head, where the grid has a block for each slice (a slice's block waits
// in its unit for the head's other slices), each QKV stage followed by its attention. All or none;
// returns whether. The first output's rows stand for the units' (mk_unit); the pack takes each
// unit's rows from the three matrices (mk_slice_rows).
static bool mk_slice_qkv(MkStage *st, int n, MegaAttention at, int blocks) {
    const int per_head = at.head_size / kMkSliceW, q_dim = at.n_heads * at.head_size;
    if (!MK_SLICES || !MK_ATTN_FLAGS || !MK_LAST_COMBINES || !at.kv_half || at.head_size != MkShape128::hs || per_head != kMkSliceLanes ||
        at.n_kv_heads != at.n_heads || at.n_heads * per_head > blocks)
        return false;
    int sliced = 0;
    for (int s = 0; s < n; s++) {
        const MkStage &t = st[s];
        if (t.kind != MK_GEMV || !t.a.rope.inputs) continue;
        const bool fits = !t.pair && t.a.n_out == 3 && s + 1 < n && st[s + 1].kind == MK_ATTENTION && st[s + 1].q == t.a.out[0].y &&
                          st[s + 1].kc == t.a.rope.kc && st[s + 1].vc == t.a.rope.vc && t.a.rope.head_size == at.head_size &&
                          !t.a.rope.seq_stride && t.a.out[0].N == q_dim && t.a.out[1].N == q_dim && t.a.out[2].N == q_dim;
        if (!fits) return false;
        sliced++;
    }
    for (int s = 0, seq = 0; s < n; s++) {
        MkStage &t = st[s];
        if (t.kind != MK_GEMV || !t.a.rope.inputs) continue;
        t.slice = st[s + 1].slice = kMkSliceW;
        t.sl_q = t.a.out[0].y, t.sl_seq = seq++, t.sl_writes = sliced;
        t.a.tma_rows = 3 * kMkSliceW, t.units = t.units_of[0] = at.n_heads * per_head, t.units_of[1] = t.units_of[2] = 0;
        t.a.out[0].N = 3 * q_dim;
    }
    return sliced > 0;
}
// The sliced stages' output (the attention stage's, flagged: mk_flags); false where it is not.
static bool mk_slice_outputs(MkStage *st, int n) {
    for (int s = 0; s + 1 < n; s++) {
        if (st[s].kind != MK_GEMV || !st[s].slice) continue;
        const MkStage &att = st[s + 1];
        if (!att.ll_out) return false;
        st[s].sl_out = att.ll_out, st[s].sl_tag_seq = att.ll_seq_out, st[s].sl_tag_writes = att.ll_writes_out;
    }
    return true;
}

// The megakernel of a recorded step, its QKV stages in head slices if may_slice and mk_slice_qkv
// takes them; NULL with the reason in why where it cannot run.
static GpuMega *mk_create(GpuCtx *g, const MegaStage *stages, int n, MegaAttention at, bool may_slice, char *why) {
    if (!sm90a_available()) return snprintf(why, ERR_LEN, "it needs compute capability 9.0 (sm_90a)"), (GpuMega *)NULL;
    if (at.head_size > kMaxHeadSize || at.head_size % 2 || at.n_heads % at.n_kv_heads || at.seq_len > kMkMaxChunk * kMaxSplits)
        return snprintf(why, ERR_LEN, "head size %d or context %d", at.head_size, at.seq_len), (GpuMega *)NULL;
    int dev = 0, optin = 0, sm_smem = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
#ifdef MK_GRID   // (a measurement build: the step on MK_GRID blocks at most)
    const int blocks = (g->sms < MK_GRID ? g->sms : MK_GRID) * kMkBlocksPerSm;
#else
    const int blocks = g->sms * kMkBlocksPerSm;
#endif
    optin = optin < sm_smem / kMkBlocksPerSm - 1024 ? optin : sm_smem / kMkBlocksPerSm - 1024;   // 1 KB an SM's blocks each keep
    MkStage *host = (MkStage *)calloc(2 * (size_t)n, sizeof(MkStage));
    MkParams p = {};
    int count = 0;
    for (int s = 0; s < n; s++) {
        const MegaStage *m = &stages[s];
        MkStage *st = &host[count++];
        if (m->kind == MEGA_LINEAR) {
            if (!mk_linear_stage(g, &m->linear, blocks, st, why)) return free(host), (GpuMega *)NULL;
        } else if (m->kind == MEGA_EMBED) {
            const Mat *e = m->embedding;
            st->kind = MK_EMBED, st->units = ceil_div_i(e->cols, 2 * kMkConsumers);
            st->eq = e->q, st->es = e->s, st->ef = e->f, st->estride = e->stride, st->egroups = e->groups, st->egs = e->gs;
            st->dim = e->cols, st->x = m->x;
        } else {   // attention (then its combine step, where the last split does not combine)
            st->kind = MK_ATTENTION, st->q = m->q, st->kc = m->key_cache, st->vc = m->value_cache, st->out = m->out;
            st->dim = at.n_heads * at.head_size;
            if (!MK_LAST_COMBINES) {
                MkStage *c = &host[count++];
                c->kind = MK_COMBINE, c->out = m->out;
            }
        }
    }
    const bool sliced = may_slice && mk_slice_qkv(host, count, at, blocks);
    p.keep_floats = mk_keep_residual(host, count, blocks);
    mk_size_areas(host, count, &p);
    int x_parts = 1;
    host = mk_split_long_x(host, &count, &p, blocks, &x_parts);
    p.n_stages = count, p.n_heads = at.n_heads, p.n_kv_heads = at.n_kv_heads, p.head_size = at.head_size;
    p.inputs = g->inputs;
    for (p.slots = kMkMaxSlots; p.slots >= kMkMinSlots && mk_smem_bytes(p) + 1024 > (size_t)optin; p.slots -= kMkPipes) {}
    if (p.slots < kMkMinSlots) {
        free(host);
        snprintf(why, ERR_LEN, "its shared memory (x of %d bytes, row sums of %d) leaves no room for %d ring slots", p.scratch_bytes,
                 4 * p.sums_floats, kMkMinSlots);
        return NULL;
    }
    GpuMega *mg = (GpuMega *)calloc(1, sizeof(GpuMega));
    mg->smem = mk_smem_bytes(p) + MK_PAD_SMEM, mg->blocks = blocks;
    mg->kernel = at.kv_half ? mega_kernel<__half, MkAnyShape> : mega_kernel<float, MkAnyShape>;
    if (!mk_kernel_fits(mg->kernel, mg->smem, why)) return free(host), free(mg), (GpuMega *)NULL;
    if (!mk_pack(g, host, count, &mg->pack, &mg->pack_bytes, why)) return free(host), free(mg), (GpuMega *)NULL;
    mg->x_parts = x_parts, mg->part_rows = mk_part_rows(host, count);
    mg->n_flag_bufs = mk_flags(host, count, mg->flag_bufs, blocks);
    char not_shaped[ERR_LEN];   // (a kernel that fits for the shape or not: the generic one runs the step either way)
    if (mk_takes_shape128(host, count, at) && mk_kernel_fits(mega_kernel<__half, MkShape128>, mg->smem, not_shaped))
        mg->kernel = mega_kernel<__half, MkShape128>, mg->shape = "heads of 128, groups of 128";
    if (sliced && (!mg->shape || !mk_slice_outputs(host, count))) {   // the slices need both: the schedule again without them
        for (int i = 0; i < mg->n_flag_bufs; i++) CUDA_CHECK(cudaFree(mg->flag_bufs[i]));
        if (mg->part_rows) CUDA_CHECK(cudaFree(mg->part_rows));
        CUDA_CHECK(cudaFree(mg->pack));
        free(host), free(mg);
        return mk_create(g, stages, n, at, false, why);
    }
    mg->sliced = sliced;
#ifdef MK_FREE
    mk_free(host, count);
#endif
    CUDA_CHECK(cudaMalloc(&mg->stages, count * sizeof(MkStage)));
    CUDA_CHECK(cudaMemcpy(mg->stages, host, count * sizeof(MkStage), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMalloc(&p.counters, (count + 2 + at.n_heads) * sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(p.counters, 0, (count + 2 + at.n_heads) * sizeof(unsigned)));
    CUDA_CHECK(cudaMalloc(&p.part, (size_t)at.n_heads * kMaxSplits * (2 + at.head_size) * sizeof(float)));
    if (sliced) {   // tags 0: before any write
        const size_t bytes = (size_t)at.n_heads * kMkSliceLanes * kMkSliceRows * sizeof(uint2);
        CUDA_CHECK(cudaMalloc(&p.scores, bytes));
        CUDA_CHECK(cudaMemset(p.scores, 0, bytes));
    }
#ifdef MK_TRACE
    CUDA_CHECK(cudaMalloc(&p.trace, (size_t)blocks * count * kMkStamps * 8));
#ifdef MK_TRACE_MATH
    CUDA_CHECK(cudaMalloc(&p.warp_trace, (size_t)blocks * count * kMkConsumerWarps * kMkWarpTimes * 8));
#endif
#endif
    p.stages = mg->stages;
    const MkStage *cls = &host[count - 1];   // the classifier, where the step's argmax can be taken
    if (cls->kind == MK_GEMV && cls->a.n_out == 1 && !cls->pair) {
        CUDA_CHECK(cudaMalloc(&p.best, cls->units * sizeof(MkBest)));
        p.argmax = g->argmax;
        p.step_tokens = g->step_tokens_dev;
    }
    mg->p = p;
    mg->kinds = (int *)calloc(count, sizeof(int));
    for (int s = 0; s < count; s++) mg->kinds[s] = host[s].kind;
    free(host);
    return mg;
}

extern "C" GpuMega *gpu_mega_create(GpuCtx *g, const MegaStage *stages, int n, MegaAttention at, char *why) {
    return mk_create(g, stages, n, at, true, why);
}

#ifdef MK_TRACE
// After the 100th launch: per stage, over the blocks that worked in it, the mean time of each
// phase between the stamps (wait, x's first loads, its digits, the staging's barrier, the tiles,
// the rows' finish, the count) and when the stage's first block started and its last ended, from
// the kernel's start.
// A linear stage's spread over the blocks: each block's tiles (x staged to tiles done), when its
// tiles were done, and the five blocks done last.
static int mk_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static void mk_trace_skew(const unsigned long long *t, const GpuMega *m, int s, unsigned long long t0) {
    double dur[1024], done[1024], sorted[1024];
    int ids[1024], nb = 0;
    for (int b = 0; b < m->blocks && nb < 1024; b++) {
        const unsigned long long *e = t + ((size_t)b * m->p.n_stages + s) * kMkStamps;
        if (!e[2] || !e[6] || e[0] < t0) continue;
        dur[nb] = (e[6] - e[2]) / 1e3, done[nb] = (e[6] - t0) / 1e3, ids[nb++] = b;
    }
    if (nb < 5) return;
    memcpy(sorted, dur, nb * sizeof(double));
    qsort(sorted, nb, sizeof(double), mk_cmp_double);
    double lo = 1e30, hi = 0;
    for (int i = 0; i < nb; i++) lo = fmin(lo, done[i]), hi = fmax(hi, done[i]);
    fprintf(stderr, "skew: %3d tiles min %.2f med %.2f max %.2f | done spread %.2f | last:", s, sorted[0], sorted[nb / 2], sorted[nb - 1],
            hi - lo);
    for (int k = 0; k < 5; k++) {
        int at = 0;
        for (int i = 1; i < nb; i++) if (done[i] > done[at]) at = i;
        fprintf(stderr, " %d (%.2f)", ids[at], done[at] - lo), done[at] = -1.0;
    }
    fprintf(stderr, "\n");
}
#ifdef MK_TRACE_MATH
// The linear stages of the first layers, each consumer warp's mean over the blocks (MkWarpClock):
// cycles a tile of the loop, of them waiting for tiles; the unit's start and end, and its tiles.
static void mk_trace_warps(const GpuMega *m) {
    const size_t n = (size_t)m->blocks * m->p.n_stages * kMkConsumerWarps * kMkWarpTimes;
    unsigned long long *t = (unsigned long long *)malloc(n * 8);
    if (!t) return;
    CUDA_CHECK(cudaMemcpy(t, m->p.warp_trace, n * 8, cudaMemcpyDeviceToHost));
    fprintf(stderr, "warps: stage | each consumer warp: loop cycles a tile / of it waits a tile / start / end (cycles, mean over blocks)"
                    " / tiles\n");
    for (int s = 0; s < m->p.n_stages && s < 16; s++) {
        if (m->kinds[s] != MK_GEMV) continue;
        fprintf(stderr, "warps: %3d |", s);
        for (int w = 0; w < kMkConsumerWarps; w++) {
            double sum[kMkWarpTimes] = {0};
            int nb = 0;
            for (int b = 0; b < m->blocks; b++) {
                const unsigned long long *e = t + (((size_t)b * m->p.n_stages + s) * kMkConsumerWarps + w) * kMkWarpTimes;
                if (!e[MkWarpClock::kTiles]) continue;
                nb++;
                for (int k = 0; k < kMkWarpTimes; k++) sum[k] += (double)e[k];
            }
            const double tiles = nb ? sum[MkWarpClock::kTiles] : 1;
            fprintf(stderr, " %5.0f/%4.0f/%4.0f/%5.0f/%4.1f", sum[MkWarpClock::kLoop] / tiles, sum[MkWarpClock::kWaits] / tiles,
                    nb ? sum[MkWarpClock::kStart] / nb : 0, nb ? sum[MkWarpClock::kEnd] / nb : 0, nb ? tiles / nb : 0);
        }
        fprintf(stderr, "\n");
    }
    free(t);
}
#endif
static void mk_trace_report(GpuCtx *g, const GpuMega *m) {
    const size_t n = (size_t)m->blocks * m->p.n_stages * kMkStamps;
    unsigned long long *t = (unsigned long long *)malloc(n * 8);
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    CUDA_CHECK(cudaMemcpy(t, m->p.trace, n * 8, cudaMemcpyDeviceToHost));
    unsigned long long t0 = ~0ull;
    for (size_t i = 0; i < n; i++) if (t[i] && t[i] < t0 && i % kMkStamps < 8) t0 = t[i];   // 8, 9: durations
    const char *durations = "tiles' waits, the first's (us, mean)";
    fprintf(stderr, "trace: stage kind blocks | wait x-loads x-digits x-sync tiles finish count (us, mean) | first start, last end (us)"
                    " | %s\n", durations);
    for (int s = 0; s < m->p.n_stages; s++) {
        double sum[7] = {0}, first = 1e30, last = 0, waits[2] = {0, 0};
        int nb = 0;
        for (int b = 0; b < m->blocks; b++) {
            const unsigned long long *e = t + ((size_t)b * m->p.n_stages + s) * kMkStamps;
            if (!e[0] || !e[3] || e[0] < t0) continue;
            nb++;
            const int order[8] = {0, 1, 4, 5, 2, 6, 7, 3};   // the stamps in time order; a missing one counts 0
            unsigned long long prev = e[0];
            for (int i = 1; i < 8; i++) {
                const unsigned long long at = e[order[i]];
                if (at >= prev) sum[i - 1] += (at - prev) / 1e3, prev = at;
            }
            first = fmin(first, (e[0] - t0) / 1e3), last = fmax(last, (e[3] - t0) / 1e3);
            waits[0] += e[8] / 1e3, waits[1] += e[9] / 1e3;
        }
        if (nb)
            fprintf(stderr, "trace: %3d %d %3d | %6.2f %6.2f %6.2f %6.2f %6.2f %6.2f %6.2f | %8.2f %8.2f | %6.2f %6.2f\n", s,
                    m->kinds[s], nb, sum[0] / nb, sum[1] / nb, sum[2] / nb, sum[3] / nb, sum[4] / nb, sum[5] / nb, sum[6] / nb, first, last,
                    waits[0] / nb, waits[1] / nb);
        if (s < 16 && m->kinds[s] == MK_GEMV) mk_trace_skew(t, m, s, t0);
    }
    free(t);
#ifdef MK_TRACE_MATH
    mk_trace_warps(m);
#endif
}
#endif

extern "C" void gpu_mega_launch(GpuCtx *g, const GpuMega *m) {
#ifdef MK_TRACE
    static int launches = 0;
    if (launches == 100) CUDA_CHECK(cudaMemset(m->p.trace, 0, (size_t)m->blocks * m->p.n_stages * kMkStamps * 8));
#ifdef MK_TRACE_MATH
    if (launches == 100)
        CUDA_CHECK(cudaMemset(m->p.warp_trace, 0, (size_t)m->blocks * m->p.n_stages * kMkConsumerWarps * kMkWarpTimes * 8));
#endif
#endif
    launch(g, "mega_kernel", m->kernel, dim3(m->blocks), dim3(kMkThreads), m->smem, m->p);
#ifdef MK_TRACE
    if (++launches == 101) mk_trace_report(g, m);
#endif
}

// Whether the step takes its greedy argmax itself, as argmax_kernel with feed would (mk_step_argmax).
extern "C" int gpu_mega_argmax(const GpuMega *m) { return m->p.best != NULL; }

extern "C" void gpu_mega_describe(const GpuMega *m, char *buf, size_t n) {
    char parts[64] = "";
    if (m->x_parts > 1) snprintf(parts, sizeof parts, ", the longest x in %d stages of its columns", m->x_parts);
    snprintf(buf, n, "%d blocks, %d stages, %d ring slots of %d KB, %zu KB shared memory%s, a %.2f GB copy in tile order%s%s%s", m->blocks,
             m->p.n_stages, m->p.slots, m->p.slot_bytes / 1024, m->smem / 1024, parts, m->pack_bytes / 1e9,
             m->shape ? ", compiled for " : "", m->shape ? m->shape : "", m->sliced ? ", QKV in head slices" : "");
}

#ifdef MK_STEP_CLOCK
static int mk_cmp_ull(const void *a, const void *b) {
    const unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}
// The medians over the steps recorded (those after the first 8), in us.
static void mk_report_step_clock(void) {
    static unsigned long long log[3][kMkClockSteps], d[4][kMkClockSteps];
    CUDA_CHECK(cudaMemcpyFromSymbol(log, mk_clock_log, sizeof log));
    int n = 0;
    for (int e = 8; e + 1 < kMkClockSteps; e++) {
        if (!log[0][e] || !log[0][e + 1] || !log[2][e]) continue;
        d[0][n] = log[0][e + 1] - log[0][e], d[1][n] = log[2][e] - log[0][e], d[2][n] = log[1][e] - log[0][e];
        d[3][n] = log[0][e + 1] - log[2][e], n++;
    }
    if (!n) return;
    const char *name[4] = {"period", "entry to last block out", "entry to the consumers' PDL wait done", "last block out to the next entry"};
    for (int k = 0; k < 4; k++) {
        qsort(d[k], n, sizeof d[k][0], mk_cmp_ull);
        fprintf(stderr, "step clock: %s %.2f us (median of %d steps)\n", name[k], d[k][n / 2] / 1000.0, n);
    }
}
#endif
extern "C" void gpu_mega_free(GpuMega *m) {
    if (!m) return;
#ifdef MK_STEP_CLOCK
    mk_report_step_clock();
#endif
    CUDA_CHECK(cudaFree(m->stages));
    CUDA_CHECK(cudaFree(m->pack));
    CUDA_CHECK(cudaFree(m->p.counters));
    CUDA_CHECK(cudaFree(m->p.part));
    if (m->p.scores) CUDA_CHECK(cudaFree(m->p.scores));
    CUDA_CHECK(cudaFree(m->p.best));
    for (int i = 0; i < m->n_flag_bufs; i++) CUDA_CHECK(cudaFree(m->flag_bufs[i]));
    if (m->part_rows) CUDA_CHECK(cudaFree(m->part_rows));
    if (m->p.trace) CUDA_CHECK(cudaFree(m->p.trace));
    if (m->p.warp_trace) CUDA_CHECK(cudaFree(m->p.warp_trace));
    free(m->kinds);
    free(m);
}
