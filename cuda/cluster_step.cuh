// cluster_step.cuh: a small model's decode step with its layers on one thread-block cluster and
// its classifier on the other SMs (sm_90), then its host side. The design, its probe and what it
// measured: bench/NOTES.md 111, 112 and 114-118.
//   cs_layers_kernel      one cluster of 16 (or 8) blocks, a producer warp and kCsWarps consumer warps
//                         each: every block keeps the residual stream and the x of its hop in its
//                         own shared memory; a hop's writers send each output into every block's
//                         copy by st.async, whose bytes complete that block's mbarrier (armed by
//                         the block with the hop's bytes), so that a hop starts with one wait on
//                         the block's own barrier, no L2 and no release fence on the chain; a
//                         block with nothing to send in a hop sends every block a word, so that
//                         each hand-over counts every block
//   cs_classifier_kernel  the final norm, the logits and the greedy argmax on the SMs the cluster
//                         leaves, launched as the layers' programmatic dependent: its blocks copy
//                         their rows into shared memory while the layers run; the last block out
//                         feeds the token to the next step as argmax_kernel does
//   cs_pack_kernel        the linear layers' rows copied at load into records (a row's int8
//                         weights, its group scales, its bias) in the order the ring takes them
//   gpu_cluster_create, gpu_cluster_launch, gpu_cluster_positions, gpu_cluster_free
//
// A layer is five hops: q, k and v (the norm, biases, RoPE and the KV store in its epilogue), the
// attention (a block a head), the output projection (+ the residual), w1 and w3 (the norm and
// the SwiGLU), w2 (+ the residual). A block's weights, norm weights and the attention's earlier
// key and value rows (none depends on the step's activations) stream through a ring of 48 KB
// slots in the hops' order, by bulk copies from one producer lane that waits for no activation.
// A hop's x is split once by each block into three int8 digits a group of 128 (x to within about
// 1e-7 of its group's largest element, as the megakernel's MkX); a lane keeps its 16-column chunks'
// digits in registers, a row costs 12 dp4a a chunk, and a warp sums 8 rows in 9 shuffles.
// The attention holds a head's earlier rows in the ring at once: steps past kCsMaxPos positions
// (gpu_cluster_positions) run on another path over the same caches.
#include <cuda.h>           // CUtensorMap (cuTensorMapEncodeTiled through the runtime's driver entry point: no -lcuda)
#include <cudaTypedefs.h>   // PFN_cuTensorMapEncodeTiled_v12000

namespace {

constexpr int kCsWarps = 8, kCsConsumers = 32 * kCsWarps, kCsThreads = kCsConsumers + 32;
// CS_CLS_WARPS: the classifier's warps a block (12: fewer batches of its rows a warp than the
// layers' 8 give, where 16 would hold its registers to 128; NOTES 147).
#ifndef CS_CLS_WARPS
#define CS_CLS_WARPS 12
#endif
constexpr int kCsClsWarps = CS_CLS_WARPS, kCsClsThreads = 32 * kCsClsWarps;
// CS_MAX_CLUSTER (16, else 8: a measurement build): the most blocks a cluster takes.
#ifndef CS_MAX_CLUSTER
#define CS_MAX_CLUSTER 16
#endif
constexpr int kCsGroupMultiple = 16;   // the weights' group sizes it takes: multiples of a row's chunk
// CS_SLOT_KB: the ring's slots' size in KB, their number making the same 192 KB. Slots of 48 KB (4)
// give a hop fewer, larger pieces, so each warp waits for and releases fewer of them, where slots
// of 16 KB (12) held the larger shapes' hops back (NOTES 178; other sizes: measurement builds).
#ifndef CS_SLOT_KB
#define CS_SLOT_KB 48
#endif
constexpr int kCsRingKB = 192;
static_assert(kCsRingKB % CS_SLOT_KB == 0 && CS_SLOT_KB % 8 == 0, "the ring in whole slots of 8 KB multiples");
constexpr int kCsSlotBytes = CS_SLOT_KB * 1024, kCsSlots = kCsRingKB / CS_SLOT_KB, kCsGroup = 128, kCsMaxCluster = CS_MAX_CLUSTER;
static_assert(kCsMaxCluster == 16 || kCsMaxCluster == 8, "clusters of 16 or 8 blocks");
constexpr int kCsMaxDim = 1024, kCsMaxX = 1536, kCsMaxPos = 512, kCsMaxHops = 160, kCsMaxHead = 128;
// A lane's 16-column chunks of a hop's x, at most: the layers' kernel is built for 2 (x up to
// 1,024 wide) and 3 (up to kCsMaxX), and a model takes the fewer that hold its widest x, whose
// code is smaller and faster (NOTES 149); the classifier's x, the model's width, takes 2.
// (CS_WIDE_ONLY, a measurement build: every model takes 3, as before NOTES 149.)
constexpr int kCsChunks = kCsMaxX / 16 / 32, kCsFewChunks = kCsMaxDim / 16 / 32;
static_assert(kCsFewChunks < kCsChunks, "two forms of the layers' kernel");
// The three-chunk form's lanes take a hop's last chunks as items (CsLaneXOf's kTail; NOTES 150,
// 152). CS_NO_TAIL, a measurement build: without them.
#ifdef CS_NO_TAIL
constexpr bool kCsTailWide = false;
#else
constexpr bool kCsTailWide = true;
#endif
// CS_NO_MATH, a measurement build (wrong results): 1, a linear hop's rows' products not made
// (every output 0; the ring's pieces still waited for and released, the outputs still sent);
// 2, x not normed or staged either. What is left is the hops' structure: the hand-overs, the
// ring, the epilogues, the sends and the attention (bench/NOTES.md 185).
// The reciprocals of values the step makes (a staged group's step and its inverse, the softmax's
// denominator, SwiGLU's sigmoid, the norm's scale: cs_norm_by_last_warp) by the fast forms (within
// a few ulp), without the IEEE forms' range checks and branches, which cost the hops' chains more
// than their few ulp are worth (NOTES 153, 154). CS_IEEE_RCP, a measurement build: the IEEE forms.
#ifdef CS_IEEE_RCP
__device__ __forceinline__ float cs_rcp(float d) { return 1.0f / d; }
__device__ __forceinline__ float cs_div127(float m) { return m / 127.0f; }
#else
__device__ __forceinline__ float cs_rcp(float d) { return __fdividef(1.0f, d); }   // (d past 2^126: 0, the sigmoid's limit)
__device__ __forceinline__ float cs_div127(float m) { return m * (1.0f / 127.0f); }
#endif
constexpr int kCsPreload = 200 * 1024;         // a classifier block's rows held in shared memory
// The most rows of rec bytes a classifier block holds (a batch of 8 rows all held or none).
__host__ __device__ inline int cs_rows_held(int rec) { return kCsPreload / rec & ~7; }
constexpr int kCsClsChunk = 32768;   // a classifier block's rows copied in pieces of this many bytes
#ifndef CS_CLS_SPAN_PER_HOP
#define CS_CLS_SPAN_PER_HOP 500
#endif
// The classifier's row copies spread over this many ns for each hop of the layers (cs_copy_rows):
// well under a hop's time, so that they have landed before the layers end; 0 (a measurement
// build): all at once (NOTES 192).
constexpr unsigned kCsClsSpanPerHop = CS_CLS_SPAN_PER_HOP;

enum { CS_QKV, CS_ATTN, CS_RESID, CS_SWIGLU };
// A hop: a linear layer's rows split over the blocks (rows_per_block each, a multiple of 8, taken
// rows_per_piece a slot), or the attention (a block a head). Records: a row's int8 weights padded
// to 16 bytes, its FP32 group scales, then (QKV with biases, at bias_at) its bias; rec bytes each,
// a multiple of 16. SWIGLU's rows alternate w1's and w3's (2i, 2i + 1: row i of each).
struct CsHop {
    int kind, K, rows, rec, rows_per_block, rows_per_piece;
    int layer, group_chunks, bias_at;   // group_chunks: the weights' group size / 16; bias_at 0: no bias
    int expect;                         // the bytes a block's input barrier counts from the hop's sends (cs_hop_sends)
    unsigned idle_ranks;                // bit r: block r has nothing to send (no rows, or no head)
    float group_inv;                    // small_div_inverse(group_chunks): the lanes' scale index (CsLaneXOf::load)
    const unsigned char *w;
    const float *gamma;   // the norm's weights (K), or null
};

// Where a record's group scales start: after its K int8 weights padded to 16 bytes.
__host__ __device__ inline int cs_scales_at(int K) { return (K + 15) & ~15; }

static_assert(sizeof(CsHop) == 64, "a hop's fields: the layers' shared memory holds kCsMaxHops of them");
struct CsParams {
    int n_hops, cluster, dim, q_dim, kvd, n_heads, n_kv_heads, hs, seq, vocab;
    int per;   // a slot's rows of a head's keys (or values)
    float eps;
    const CsHop *hops;
    const int *inputs;   // the step's position, then its token
    const int8_t *emb_q;   // the embedding: INT8 rows with group scales, or FP32 rows
    const float *emb_s, *emb_f;
    int emb_stride, emb_groups, emb_gs;
    const float *rope_freq;   // (hs / 2)
    void *kcache, *vcache;    // (layers, seq, kvd) FP16 or FP32
    float *out;               // the last residual stream (dim): the classifier's x
    unsigned long long *trace;   // -DCS_TRACE: block 0's stamps (cs_stamp), else NULL
    unsigned long long *x_ready, launch;   // CsClsParams's
    CUtensorMap kmap, vmap;   // the caches as 2-D tensors (layers x seq rows of kvd), a box a slot of a head's rows
    float att_scale;          // 1 / sqrt(hs), as the per-matrix attention's
    int kv_group, key_shift;  // query heads a kv head; log2 of the rows a key row's first bank repeats after (cs_key_first)
    // small_div_inverse of per, kv_group and hs / 4: the step's divisors' reciprocals from the host,
    // where the device's own would stand at the start of each attention hop (NOTES 152)
    float per_inv, kv_group_inv, quads_inv;
    float hs_inv;   // small_div_inverse(hs): QKV's epilogue's place in a head (cs_qkv_epilogue)
};
struct CsClsParams {
    int dim, vocab, rec, rows_per_block, group_chunks;
    float eps;
    const unsigned char *w;    // the classifier's records
    const float *gamma, *x;    // the final norm's weights; x: CsParams::out
    float *logits;
    unsigned long long *best;  // [0]: the step's argmax key, [1]: the blocks done (both 0 between steps)
    int *inputs, *argmax;      // fed as argmax_kernel feeds them
    unsigned long long *step_tokens;
    unsigned long long *trace;   // -DCS_TRACE: the layers' trace + n_hops + 3, else NULL
    float group_inv;             // small_div_inverse(group_chunks)
    unsigned long long copy_span_ns;   // cs_copy_rows: the rows' copies spread over this from the block's start
#ifdef CS_TRACE
    unsigned long long *phases;   // block 0's %globaltimer at its phases (kCsClsPhases, after the ticks)
#endif
    // The classifier starts once x_ready holds its launch's number, which the layers' rank 0
    // stores there after it has written x, rather than once the layers' grid has ended (NOTES 166,
    // 195). launch counts the launches (never captured in a graph, whose replays would repeat it),
    // so a word from a step before is always smaller.
    unsigned long long *x_ready, launch;
};

// cs_layers_kernel's shared memory: the ring, the residual stream, two x buffers (a hop reads
// one and writes the other, or the residual), x's digits (where the attention keeps its warps'
// parts), the attention's scores, the barriers, the hops.
struct CsSmem {
    unsigned char ring[kCsSlots][kCsSlotBytes];
    float res[kCsMaxDim];
    float xb[2][kCsMaxX];
    uint32_t digits[3][kCsMaxX / 4];
    float u[kCsMaxX / kCsGroup];
    float scores[kCsMaxPos + 1];
    float rope_cos[kCsMaxHead / 2], rope_sin[kCsMaxHead / 2];   // the step's RoPE angles, pair i of a head
    int pos;
    float norm_scale;   // a normed hop's inverse RMS (cs_norm_by_last_warp)
    float token[kCsMaxCluster];   // a hop's word from each block with nothing else to send
    unsigned long long full[kCsSlots], empty[kCsSlots], xbar[2];
    CsHop hops[kCsMaxHops];   // the first n_hops are copied in (the launch sizes the rest away)
};
// Where a linear hop stages x's digits, free during the attention, which keeps its warps' parts
// there.
constexpr size_t kCsScratchAt = offsetof(CsSmem, digits), kCsScratchBytes = sizeof(CsSmem::digits);
// cs_classifier_kernel's: its rows, the norm's weights, x and its digits.
struct CsClsSmem {
    unsigned char rows[kCsPreload];
    float gamma[kCsMaxDim], x[kCsMaxDim];
    uint32_t digits[3][kCsMaxX / 4];
    float u[kCsMaxX / kCsGroup];
    unsigned long long best[kCsClsWarps];
    unsigned long long landed;
    float norm_scale;
};

__device__ __forceinline__ uint32_t cs_saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
// CS_POLL (a measurement build): the waits poll with test_wait, which never suspends the thread,
// instead of try_wait, which may.
#ifdef CS_POLL
#define CS_WAIT_OP "test_wait"
#else
#define CS_WAIT_OP "try_wait"
#endif
__device__ __forceinline__ bool cs_try(uint32_t a, int parity) {
    uint32_t done;
    asm volatile("{\n .reg .pred p;\n mbarrier." CS_WAIT_OP ".parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(a), "r"(parity) : "memory");
    return done;
}
__device__ __forceinline__ bool cs_try_cluster(uint32_t a, int parity) {
    uint32_t done;
    asm volatile("{\n .reg .pred p;\n mbarrier." CS_WAIT_OP ".parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(a), "r"(parity) : "memory");
    return done;
}
// CS_WATCHDOG (a build for a first run on a new GPU or a new schedule): a wait that has not ended
// after kCsHang cycles prints which wait it is and traps, so that the launch fails with an error
// where the default build would hang. (Not for compute-sanitizer's runs, which are far slower.)
enum CsWhere { CS_AT_FULL, CS_AT_EMPTY, CS_AT_HOP, CS_AT_LANDED };
#ifdef CS_WATCHDOG
constexpr long long kCsHang = 4000000000ll;   // about 2 s at the H200's clock
__device__ __noinline__ void cs_hung(int where, int n) {
    const char *what[] = {"a ring slot's copy (piece)", "a ring slot's release (piece)", "the input of hop", "the classifier's rows"};
    printf("cluster step: block %d thread %d waited too long for %s %d\n", blockIdx.x, threadIdx.x, what[where], n);
    __trap();
}
#endif
// Waits for the phase of parity `parity` of the mbarrier at a (kCluster: with cluster-scope
// acquire); where and n say which wait it is (CS_WATCHDOG).
template <bool kCluster = false>
__device__ __forceinline__ void cs_wait(uint32_t a, int parity, int where, int n) {
#ifdef CS_WATCHDOG
    const long long t0 = clock64();
    while (!(kCluster ? cs_try_cluster(a, parity) : cs_try(a, parity)))
        if (clock64() - t0 > kCsHang) cs_hung(where, n);
#else
    (void)where, (void)n;
    while (!(kCluster ? cs_try_cluster(a, parity) : cs_try(a, parity))) {}
#endif
}
__device__ __forceinline__ uint32_t cs_remote(uint32_t a, int rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
// An output (or 4 at a 16-byte aligned a) into block `rank`'s copy by st.async, whose bytes count
// towards that block's barrier bar (the next hop's input, armed by the block itself with the
// hop's bytes): no arrival and no release fence on the chain (NOTES 115).
__device__ __forceinline__ void cs_send(uint32_t a, uint32_t bar, int rank, float v) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(cs_remote(a, rank)),
                 "r"(__float_as_uint(v)), "r"(cs_remote(bar, rank))
                 : "memory");
}
__device__ __forceinline__ void cs_send4(uint32_t a, uint32_t bar, int rank, float v0, float v1, float v2, float v3) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(cs_remote(a, rank)),
                 "r"(__float_as_uint(v0)), "r"(__float_as_uint(v1)), "r"(__float_as_uint(v2)), "r"(__float_as_uint(v3)),
                 "r"(cs_remote(bar, rank))
                 : "memory");
}
// A box of a 2-D tensor (map: a __grid_constant__ parameter's) at column col and row row, counted
// against bar's expected bytes as bulk copies are (rows past the tensor land as zeros).
__device__ __forceinline__ void cs_copy_box(uint32_t dst, const CUtensorMap *map, int col, int row, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
                 "l"(map), "r"(col), "r"(row), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void cs_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ int cs_rank() {
    int r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cs_consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kCsConsumers) : "memory"); }

// CS_TRACE (a measurement build): %globaltimer stamps of one step, printed after the 101st launch
// (gpu_cluster_launch): the layers' block 0 when its consumers' PDL wait returns (0), when the
// embedding row is in (1), when each hop's input has arrived (2 + i) and the last hop's (2 +
// n_hops); the classifier's block 0 when its PDL wait returns (n_hops + 3), the last block out
// when the token is fed (n_hops + 4); then the ns that the layers' block 0 thread 0 spent in each
// hop waiting for the ring's copies (n_hops + 5 + i): where the weights' stream is behind.
__device__ __forceinline__ unsigned long long cs_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void cs_stamp(unsigned long long *trace, int k) {
#ifdef CS_TRACE
    trace[k] = cs_now();
#else
    (void)trace, (void)k;
#endif
}

// The greedy argmax's key: larger logits larger keys, of equal logits the first index; 0 (no
// key) for NaN and -inf, which argmax_kernel never takes either (its token is then 0).
__device__ __forceinline__ unsigned long long cs_key(float v, int i) {
    if (!(v > -INFINITY)) return 0ull;
    const unsigned b = __float_as_uint(v == 0.0f ? 0.0f : v), ordered = (b & 0x80000000u) ? ~b : b | 0x80000000u;
    return (unsigned long long)ordered << 32 | (0xffffffffu - (unsigned)i);
}
__host__ __device__ __forceinline__ int cs_token_of(unsigned long long key) { return key ? (int)(0xffffffffu - (unsigned)key) : 0; }

// CS_TRACE's ticks: every consumer warp's clock64 at points of each hop (lane 0 stores them), kCsTicks
// a warp a hop, [rank][hop][warp][tick] after the stamps: 0 the hop's input arrived; a linear hop's
// 1 the norm's weights landed, 2 x's digits staged, 3 the lane's digits loaded, 4 the warp's first
// batch's piece landed, 5 its 8 rows' products, 6 their sums, 7 the epilogue, 8 the outputs sent;
// the attention's (its first head) 1 the keys landed, 2 the scores, 3 their maximum, 4 the
// exponentials' sum, 5 the values landed, 6 the weighted sums, 7 the outputs sent; 9 the hop's
// work done, 10 its end (as 9 since the sends count on the receivers' barriers; before, the
// warp's arrival on them); 11 and 12 %globaltimer at 0 and 10; CS_TWICE's 13 its warps together
// before the first of x's two stagings, 14 that staging done (2: the second); a linear hop's 15
// and 16 the warp's second batch begun (its piece landed) and its outputs sent, 17 and 18 its third
// batch's. 0: not reached.
constexpr int kCsTicks = 19;
// CS_TRACE's stamps of the classifier's block 0 (thread 0), after the layers' ticks: 0 its x in (its
// rows landed, x read), 1 x's digits staged and the lane's loaded, 2 warp 0's rows done, 3 the
// block's rows and argmax done; 4 its entry, 5 its rows' copies all issued, 6 its wait for them
// to land over (after its PDL wait).
constexpr int kCsClsPhases = 7;
// CS_TRACE's stamps of block 0's ring pieces, after the classifier's phases, kCsPieceStamps a
// piece (its first kCsTracePieces of the step): %globaltimer when the producer found its slot free,
// when consumer thread 0 began to wait for it, when that wait ended, and when the producer's copy
// instruction had been issued; then what the piece is: 4 * its hop + its kind (CS_PIECE_...).
constexpr int kCsTracePieces = 4096, kCsPieceStamps = 5;
enum { CS_PIECE_GAMMA, CS_PIECE_ROWS, CS_PIECE_BOX, kCsPieceKinds };
// Where in the trace the classifier's phases begin (after the stamps and the ticks), and the pieces'.
__host__ __device__ inline size_t cs_phases_at(int n_hops, int cluster) {
    return 4 * (size_t)n_hops + 5 + (size_t)cluster * n_hops * kCsWarps * kCsTicks;
}
__host__ __device__ inline size_t cs_pieces_at(int n_hops, int cluster) { return cs_phases_at(n_hops, cluster) + kCsClsPhases; }
// CS_TRACE's last two words, after the pieces: the step before's token fed (n_hops + 4 of the
// launch before, copied by the layers' block 0 once its PDL wait has returned) and %globaltimer at
// the layers' block 0's entry: the boundary between two steps.
__host__ __device__ inline size_t cs_boundary_at(int n_hops, int cluster) {
    return cs_pieces_at(n_hops, cluster) + (size_t)kCsPieceStamps * kCsTracePieces;
}

// The ring as the consumers walk it: the block's piece n in slot n % kCsSlots, phase n / kCsSlots.
struct CsRing {
    CsSmem *s;
    int base;                     // the block's first piece of the hop
    unsigned long long *waited;   // -DCS_TRACE: the traced thread's ns in these waits, else NULL
    unsigned long long *mark;     // -DCS_TRACE: when the traced thread had x's digits (linear) or the softmax (attention)
    unsigned long long *ticks;    // -DCS_TRACE: this warp's ticks of the hop, else NULL
#ifdef CS_TRACE
    unsigned long long *pieces;   // block 0's thread 0: its pieces' stamps (kCsTracePieces), else NULL
#endif
    __device__ void stamp_mark() const {
#ifdef CS_TRACE
        if (mark) *mark = cs_now();
#endif
    }
    __device__ void tick(int k) const {
#ifdef CS_TRACE
        if (ticks && threadIdx.x % 32 == 0) ticks[k] = clock64();
#else
        (void)k;
#endif
    }
    __device__ unsigned char *at(int i) const { return s->ring[(base + i) % kCsSlots]; }   // (after a wait for it)
    __device__ unsigned char *wait(int i) const {
        const int n = base + i;
#ifdef CS_TRACE
        const unsigned long long t0 = waited ? cs_now() : 0;
#endif
        cs_wait(cs_saddr(&s->full[n % kCsSlots]), (n / kCsSlots) & 1, CS_AT_FULL, n);
#ifdef CS_TRACE
        if (waited) {
            const unsigned long long t1 = cs_now();
            *waited += t1 - t0;
            if (pieces && n < kCsTracePieces) pieces[kCsPieceStamps * n + 1] = t0, pieces[kCsPieceStamps * n + 2] = t1;
        }
#endif
        return at(i);
    }
    __device__ void release(int i) const { mbar_arrive(cs_saddr(&s->empty[(base + i) % kCsSlots])); }
};
// Who releases a ring slot: every consumer thread, its own reads released, as the megakernel's
// consumers do (compute-sanitizer's racecheck reported one lane a warp releasing for the others
// after __syncwarp: NOTES 115, 117).
constexpr int kCsReleasers = kCsConsumers;   // a ring slot's empty barrier's arrivals

// A linear hop's rows in this block.
__host__ __device__ __forceinline__ int cs_mine(const CsHop &h, int rank) {
    return max(0, min(h.rows_per_block, h.rows - rank * h.rows_per_block));
}

// The producer: the block's pieces in the hops' order. The earlier key and value rows are copied
// only after the kernels before have finished (the step before wrote the last of them).
template <typename KV>
__device__ void cs_produce(const CsParams &p, CsSmem *s, int rank) {
    if (threadIdx.x % 32) return;
    int n = 0, kp = -1;
    auto slot_for = [&](int bytes) {   // the next slot, free, armed for bytes
        const int slot = n % kCsSlots, round = n / kCsSlots;
        if (round > 0) cs_wait(cs_saddr(&s->empty[slot]), (round - 1) & 1, CS_AT_EMPTY, n);
#ifdef CS_TRACE
        if (p.trace && rank == 0 && n < kCsTracePieces) p.trace[cs_pieces_at(p.n_hops, p.cluster) + kCsPieceStamps * n] = cs_now();
#endif
        mbar_arrive_expect(cs_saddr(&s->full[slot]), bytes);
        n++;
        return slot;
    };
    auto issued = [&](int what) {   // (CS_TRACE: the last piece's copy instruction issued, and what it is)
#ifdef CS_TRACE
        if (p.trace && rank == 0 && n - 1 < kCsTracePieces) {
            unsigned long long *at = p.trace + cs_pieces_at(p.n_hops, p.cluster) + kCsPieceStamps * (n - 1);
            at[3] = cs_now(), at[4] = what;
        }
#else
        (void)what;
#endif
    };
    const int box_bytes = p.per * p.hs * (int)sizeof(KV);
    for (int i = 0; i < p.n_hops; i++) {
        const CsHop &h = s->hops[i];
        if (h.kind == CS_ATTN) {
            if (kp < 0) {
                pdl_wait();
                kp = (__ldcg(p.inputs) + p.per - 1) / p.per;
            }
            for (int head = rank; head < p.n_heads; head += p.cluster) {
                const int kvh = head / p.kv_group;
                for (int c = 0; c < 2; c++)
                    for (int j = 0; j < kp; j++) {   // a whole box: its rows past the step's position land too, unread
                        const int slot = slot_for(box_bytes);
                        cs_copy_box(cs_saddr(s->ring[slot]), c ? &p.vmap : &p.kmap, kvh * p.hs, h.layer * p.seq + j * p.per,
                                    cs_saddr(&s->full[slot]));
                        issued(4 * i + CS_PIECE_BOX);
                    }
            }
            continue;
        }
        if (h.gamma) {
            const int slot = slot_for(4 * h.K);
            bulk_copy_counted(cs_saddr(s->ring[slot]), h.gamma, 4 * h.K, cs_saddr(&s->full[slot]));
            issued(4 * i + CS_PIECE_GAMMA);
        }
        const int row0 = rank * h.rows_per_block, mine = cs_mine(h, rank);
        for (int r = 0; r < mine; r += h.rows_per_piece) {
            const int bytes = min(h.rows_per_piece, mine - r) * h.rec, slot = slot_for(bytes);
            bulk_copy_counted(cs_saddr(s->ring[slot]), h.w + (size_t)(row0 + r) * h.rec, bytes, cs_saddr(&s->full[slot]));
            issued(4 * i + CS_PIECE_ROWS);
        }
    }
}

// r (|r| <= 127.5) as three int8 digits, r ~ d0 + d1 / 254 + d2 / 254^2, into byte `byte` of d[0..2].
// Each plane's r is clamped to +-127 and then rounded by adds (kRoundMagic), not by the conversion
// unit, whose results the staging and the lanes' loads after it waited for (NOTES 163); the digit
// is the rounded sum's low byte. (Clamped before the rounding: the same digit as clamping the
// rounded r, NaN included.)
__device__ __forceinline__ void cs_put_digits(float r, int byte, uint32_t d[3]) {
#pragma unroll
    for (int pl = 0; pl < 3; pl++) {
        const RoundedByAdds q = round_by_adds(fminf(fmaxf(r, -127.0f), 127.0f));
        d[pl] |= q.low_byte << (8 * byte);
        r = (r - q.value) * 254.0f;
    }
}

// The norm's inverse RMS of x (K elements) into *scale_out, by one warp: each lane's elements
// (4 a group, the groups past K not read) summed in four chains, then one chain of 5 shuffles
// (NOTES 174; side by side sums a group ran 40 shuffles, and one group after another longer:
// NOTES 173). The last warp of the staging makes it before the staging's barrier: below kWarps
// groups it stages none of its own, so the scale costs the chain after the barrier one
// shared-memory read, where each warp summed the groups' partial sums there before (NOTES 154,
// 173).
__device__ __forceinline__ void cs_norm_by_last_warp(float *scale_out, const float *x, int K, float eps) {
    constexpr int kMaxGroups = kCsMaxDim / kCsGroup;
    const int lane = threadIdx.x % 32;
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int g = 0; g < kMaxGroups; g++) {
        const int k0 = g * kCsGroup + 4 * lane;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (g * kCsGroup < K) v = *reinterpret_cast<const float4 *>(x + k0);
        const float xk[4] = {k0 < K ? v.x : 0.0f, k0 + 1 < K ? v.y : 0.0f, k0 + 2 < K ? v.z : 0.0f, k0 + 3 < K ? v.w : 0.0f};
#pragma unroll
        for (int i = 0; i < 4; i++) a[i] = fmaf(xk[i], xk[i], a[i]);
    }
    float total = (a[0] + a[1]) + (a[2] + a[3]);
#pragma unroll
    for (int o = 16; o; o >>= 1) total += __shfl_xor_sync(~0u, total, o);
#ifdef CS_IEEE_RCP
    if (lane == 0) *scale_out = inv_rms_of(total, K, eps);
#else
    if (lane == 0) *scale_out = rsqrtf(__fdividef(total, (float)K) + eps);
#endif
}

// x (K elements, times gamma where given) as three int8 digits a group of 128 (digits[plane][k /
// 4], four a word; a plane kWords words), the groups dealt round the kWarps warps that stage, each
// group's step in u. With gamma, the norm's inverse RMS, made by the last warp into *scale (K up
// to kCsMaxDim), is returned to every consumer; without, 1. x and gamma must hold K's groups
// whole: their elements past K are read and dropped. Ends with the consumers' barrier (kBlock:
// the block's, all kWarps of it).
template <bool kBlock, int kWarps = kCsWarps, int kWords = kCsMaxX / 4>
__device__ float cs_stage_digits(uint32_t (*digits)[kWords], float *u, float *scale, const float *x, int K, const float *gamma,
                                 float eps) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, G = (K + kCsGroup - 1) / kCsGroup;
    for (int g = warp; g < G; g += kWarps) {
        float v[4], m = 0.0f;
        // x's and gamma's 4 elements a lane by one 16-byte load each (4-byte loads 16 bytes apart
        // took four wavefronts each: NOTES 175)
        const int k0 = g * kCsGroup + 4 * lane;
        const float4 xv = *reinterpret_cast<const float4 *>(x + k0);
        float4 gv = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
        if (gamma) gv = *reinterpret_cast<const float4 *>(gamma + k0);
        const float xs[4] = {xv.x, xv.y, xv.z, xv.w}, gs[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[i] = k0 + i < K ? (gamma ? xs[i] * gs[i] : xs[i]) : 0.0f;
            m = fmaxf(m, fabsf(v[i]));
        }
        // the warp's largest by one redux.sync on the bits, whose order is the floats' for m >= 0
        // (never NaN: fmaxf from 0 drops NaNs), where 5 rounds of shuffles stood on the staging's
        // chain (NOTES 174)
        m = __uint_as_float(__reduce_max_sync(~0u, __float_as_uint(m)));
        const float step = m > 0.0f ? cs_div127(m) : 1.0f, inv = cs_rcp(step);
        uint32_t d[3] = {0, 0, 0};
#pragma unroll
        for (int i = 0; i < 4; i++) cs_put_digits(v[i] * inv, i, d);
#pragma unroll
        for (int pl = 0; pl < 3; pl++) digits[pl][g * 32 + lane] = d[pl];
        if (lane == 0) u[g] = step;
    }
    if (gamma && warp == kWarps - 1) cs_norm_by_last_warp(scale, x, K, eps);
    if (kBlock) __syncthreads();
    else cs_consumers_sync();
    return gamma ? *scale : 1.0f;
}

// This lane's chunks of x (16 columns each: lane, lane + 32, ..., at most kChunks): their digits
// and steps, and where in a row's record each chunk's weights and group scale are.
// kTail: the tail items below.
template <int kChunks, bool kTail = false>
struct CsLaneXOf {
    static constexpr int kMaxChunks = kChunks;
    static constexpr bool kTailItems = kTail;
    uint4 d[kChunks][3];
    float u[kChunks];
    int chunks;
    int full;   // the chunks that cs_rows takes a lane a chunk of every row (kTail: below)
    // (kTail: when the chunks past the last full pass over the lanes are t <= 4, a pass of a lane
    // a chunk would leave 32 - t lanes idle; instead lane l < 8t takes the one (row, chunk) item
    // (l / t, full + l % t) of the warp's 8 rows; its chunk's digits, step and scale)
    int tail_row, tail_c, tail_scale;   // tail_row 8: no item
    uint4 tail_d[3];
    float tail_u;
    int woff[kChunks], soff[kChunks];   // a row's bytes to this lane's chunk j, and to that chunk's group scale
    // x as staged (cs_stage_digits): plane pl's words in digits[pl], a step a group of 8 chunks
    template <int kWords>
    __device__ void load(const uint32_t (*digits)[kWords], const float *u_of, int K, SmallDiv group_of) {
        auto digit = [=](int c, int pl) { return reinterpret_cast<const uint4 *>(digits[pl])[c]; };   // chunk c's plane pl
        auto step_of = [=](int c) { return u_of[c / 8]; };
        const int lane = threadIdx.x % 32;
        chunks = (K + 15) / 16;
        full = chunks;
        if constexpr (kTail) {
            const int t = chunks % 32;
            if (t <= 4) full = chunks - t;
            tail_row = 8, tail_c = 0, tail_scale = 0, tail_u = 0.0f;
            for (int pl = 0; pl < 3; pl++) tail_d[pl] = make_uint4(0, 0, 0, 0);
            if (full < chunks && lane < 8 * t) {
                // lane / t by a multiply (1 <= t <= 4, lane < 32: (lane * ceil(2^16 / t)) >> 16 is exact)
                tail_row = lane * (t == 3 ? 21846 : 65536 >> (t >> 1)) >> 16, tail_c = full + lane - tail_row * t;
                tail_u = step_of(tail_c), tail_scale = group_of(tail_c);
                for (int pl = 0; pl < 3; pl++) tail_d[pl] = digit(tail_c, pl);
            }
        }
#pragma unroll
        for (int j = 0; j < kChunks; j++) {
            const int c = lane + 32 * j;
            u[j] = c < full ? step_of(c) : 0.0f;
            const int group = group_of(min(c, chunks - 1));   // (a chunk past K: its row's last group, times 0)
            woff[j] = 16 * min(c, chunks - 1), soff[j] = cs_scales_at(K) + 4 * group;
#pragma unroll
            for (int pl = 0; pl < 3; pl++) d[j][pl] = c < full ? digit(c, pl) : make_uint4(0, 0, 0, 0);
        }
    }
};

__device__ __forceinline__ int cs_dot4(uint4 w, uint4 d) {
    int a = __dp4a((int)w.x, (int)d.x, 0);
    a = __dp4a((int)w.y, (int)d.y, a);
    a = __dp4a((int)w.z, (int)d.z, a);
    return __dp4a((int)w.w, (int)d.w, a);
}

// A chunk of a row (16 int8 weights) times x's chunk as its three digits: sum w . x / step.
__device__ __forceinline__ float cs_dot_digits(uint4 w, uint4 d0, uint4 d1, uint4 d2) {
    return (float)cs_dot4(w, d0) + (float)cs_dot4(w, d1) * (1.0f / 254.0f) + (float)cs_dot4(w, d2) * (1.0f / (254.0f * 254.0f));
}

// This lane's part of up to kRows rows' products (8, or 4: cs_resid_rows4; n rows, records rec
// bytes apart from first, in shared or global memory) into acc. Every load of a chunk's rows is
// asked for before its arithmetic, with no branch between them (rows past n read row n - 1's
// bytes, a lane past K its row's last chunk, both times 0 or dropped), so that the rows' latencies
// overlap (NOTES 115, 117).
template <int kRows = 8, class LaneX>
__device__ __forceinline__ void cs_rows(const unsigned char *first, int rec, int n, int K, const LaneX &x, float acc[kRows]) {
    static_assert(kRows == 8 || (kRows == 4 && !LaneX::kTailItems), "batches of 8 rows, or of 4 without tail items");
#pragma unroll
    for (int r = 0; r < kRows; r++) acc[r] = 0.0f;
    // each row's offset once a batch by adds (rows past n at row n - 1's), the lane's offsets to
    // its chunk and to its scale from CsLaneXOf::load: one add an address (NOTES 172)
    int off[kRows];
    off[0] = 0;
    const int last = (n - 1) * rec;
#pragma unroll
    for (int r = 1; r < kRows; r++) off[r] = min(off[r - 1] + rec, last);
#pragma unroll
    for (int j = 0; j < LaneX::kMaxChunks; j++) {
        if (32 * j >= x.full) break;   // (the warp's lanes alike)
        uint4 w[kRows];
        float scale[kRows];
        const unsigned char *wj = first + x.woff[j], *sj = first + x.soff[j];
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            w[r] = *reinterpret_cast<const uint4 *>(wj + off[r]);
            scale[r] = *reinterpret_cast<const float *>(sj + off[r]);
        }
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            const float sum = cs_dot_digits(w[r], x.d[j][0], x.d[j][1], x.d[j][2]);
            acc[r] += scale[r] * x.u[j] * sum;
        }
    }
    if constexpr (LaneX::kTailItems) {
        if (x.full < x.chunks) {   // (the warp's lanes alike) this lane's (row, chunk) item of the tail
            const int r = x.tail_row;
            float v = 0.0f;
            if (r < 8) {
                const unsigned char *at = first + (size_t)min(r, n - 1) * rec;
                const uint4 w = reinterpret_cast<const uint4 *>(at)[x.tail_c];
                v = reinterpret_cast<const float *>(at + cs_scales_at(K))[x.tail_scale] * x.tail_u * cs_dot_digits(w, x.tail_d[0], x.tail_d[1], x.tail_d[2]);
            }
#pragma unroll
            for (int q = 0; q < 8; q++) acc[q] += q == r ? v : 0.0f;
        }
    }
    if (n < kRows)   // (the warp's lanes alike: a full batch, the common case, skips it)
#pragma unroll
    for (int r = 0; r < kRows; r++)
        if (r >= n) acc[r] = 0.0f;
}

// Sums acc[r] over the warp's lanes for 8 rows at once: on return lanes 4r..4r+3 hold row r's.
__device__ __forceinline__ float cs_sum8(const float acc[8]) {
    const int lane = threadIdx.x % 32;
    float a4[4], a2[2];
    const bool b16 = lane & 16, b8 = lane & 8, b4 = lane & 4;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float keep = b16 ? acc[i + 4] : acc[i], send = b16 ? acc[i] : acc[i + 4];
        a4[i] = keep + __shfl_xor_sync(~0u, send, 16);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const float keep = b8 ? a4[i + 2] : a4[i], send = b8 ? a4[i] : a4[i + 2];
        a2[i] = keep + __shfl_xor_sync(~0u, send, 8);
    }
    float v = (b4 ? a2[1] : a2[0]) + __shfl_xor_sync(~0u, b4 ? a2[0] : a2[1], 4);
    v += __shfl_xor_sync(~0u, v, 2);
    return v + __shfl_xor_sync(~0u, v, 1);
}

// What QKV's epilogue does to row `row`'s finished sum v (other: its pair's): the bias, RoPE on
// q and k, and the KV store of k and v at the step's position (by one lane of the four).
template <typename KV>
__device__ __forceinline__ float cs_qkv_epilogue(const CsParams &p, const CsSmem *s, const CsHop &h, int row, bool valid, float v,
                                                 float other) {
    const int lane = threadIdx.x % 32;
    float out = v;
    if (row < p.q_dim + p.kvd) {   // RoPE: pair (2i, 2i + 1) of each head turns by pos * freq[i]
        const int e = row < p.q_dim ? row : row - p.q_dim, i = (e - p.hs * SmallDiv(p.hs_inv)(e)) / 2;   // (e below 2^12)
        const float cs = s->rope_cos[i], sn = s->rope_sin[i];
        out = (row & 1) ? other * sn + v * cs : v * cs - other * sn;
    }
    if (valid && row >= p.q_dim && lane % 4 == 0) {
        const int e = row - p.q_dim, is_v = e >= p.kvd, c = is_v ? e - p.kvd : e;
        KV *cache = static_cast<KV *>(is_v ? p.vcache : p.kcache);
        cache[((size_t)h.layer * p.seq + s->pos) * p.kvd + c] = (KV)out;
    }
    return out;
}

// The first of this warp's batches of kRows rows in a piece that starts at row r0 of the block's rows:
// a hop's batches dealt round the warps across its pieces (a slot holds 8 to 48 rows: dealt a
// piece at a time, the first warps would do all the work of the long rows).
template <int kRows = 8>
__device__ __forceinline__ int cs_first_batch(int r0) {
    static_assert((kCsWarps & (kCsWarps - 1)) == 0, "the warps a power of two (r0 >= 0: the modulo as a mask)");
    static_assert(kRows == 8 || kRows == 4, "batches of 8 or 4 rows");
    return kRows * ((threadIdx.x / 32 - (r0 >> (kRows == 8 ? 3 : 2))) & (kCsWarps - 1));
}

// The warp's 8 rows' outputs (lanes 4q..4q+3 hold row first + q's; n of them are rows) sent to
// every block's dst (lane d sends block d's copy); with pairs (SwiGLU: the even row holds the
// pair's output), one output a pair, at the even row / 2.
__device__ __forceinline__ void cs_share_rows8(uint32_t dst_at, uint32_t bar_at, float out, int first, int n, int cluster, bool pairs) {
    const int lane = threadIdx.x % 32;
    if (n >= 8) {   // 4 outputs a send (first a multiple of 8)
        float o[8];
#pragma unroll
        for (int q = 0; q < 8; q++) o[q] = __shfl_sync(~0u, out, 4 * q);
        if (lane >= cluster) return;
        if (!pairs) {
            cs_send4(dst_at + 4 * first, bar_at, lane, o[0], o[1], o[2], o[3]);
            cs_send4(dst_at + 4 * (first + 4), bar_at, lane, o[4], o[5], o[6], o[7]);
        } else {
            cs_send4(dst_at + 4 * (first / 2), bar_at, lane, o[0], o[2], o[4], o[6]);
        }
        return;
    }
#pragma unroll
    for (int q = 0; q < 8; q++) {
        const float o = __shfl_sync(~0u, out, 4 * q);
        if (lane >= cluster || q >= n) continue;
        if (!pairs) cs_send(dst_at + 4 * (first + q), bar_at, lane, o);
        else if (!(q & 1)) cs_send(dst_at + 4 * ((first + q) / 2), bar_at, lane, o);
    }
}

// A residual hop whose block has at most 4 rows a warp (stories15m's output projection and w2: 24
// rows, 3 batches of 8 on 3 of the 8 warps) takes batches of 4 rows, so that 6 warps each run a
// chain half as long (bench/NOTES.md 187). Two-chunk form only (no tail items). CS_NO_ROWS4, a
// measurement build: batches of 8 there too.
// Sums acc[r] over the warp's lanes for 4 rows: on return lanes 8r..8r+7 hold row r's.
__device__ __forceinline__ float cs_sum4(const float acc[4]) {
    const int lane = threadIdx.x % 32;
    float a2[2];
    const bool b16 = lane & 16, b8 = lane & 8;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const float keep = b16 ? acc[i + 2] : acc[i], send = b16 ? acc[i] : acc[i + 2];
        a2[i] = keep + __shfl_xor_sync(~0u, send, 16);
    }
    float v = (b8 ? a2[1] : a2[0]) + __shfl_xor_sync(~0u, b8 ? a2[0] : a2[1], 8);
    v += __shfl_xor_sync(~0u, v, 4);
    v += __shfl_xor_sync(~0u, v, 2);
    return v + __shfl_xor_sync(~0u, v, 1);
}
// The warp's 4 rows' outputs (lanes 8q..8q+7 hold row first + q's; n of them are rows) sent to
// every block's dst, as cs_share_rows8 (no pairs: residual hops only).
__device__ __forceinline__ void cs_share_rows4(uint32_t dst_at, uint32_t bar_at, float out, int first, int n, int cluster) {
    const int lane = threadIdx.x % 32;
    float o[4];
#pragma unroll
    for (int q = 0; q < 4; q++) o[q] = __shfl_sync(~0u, out, 8 * q);
    if (lane >= cluster) return;
    if (n >= 4) {   // first a multiple of 4: one 16-byte send
        cs_send4(dst_at + 4 * first, bar_at, lane, o[0], o[1], o[2], o[3]);
        return;
    }
#pragma unroll
    for (int q = 0; q < 4; q++)
        if (q < n) cs_send(dst_at + 4 * (first + q), bar_at, lane, o[q]);
}
// A linear hop's batch of rows (cs_rows), the one place CS_NO_MATH leaves their products out, so
// that every loop over a hop's batches takes it; the classifier's rows are not a hop's and keep them.
template <int kRows, class LaneX>
__device__ __forceinline__ void cs_hop_rows(const unsigned char *first, int rec, int n, int K, const LaneX &x, float acc[kRows]) {
#ifdef CS_NO_MATH
    for (int r = 0; r < kRows; r++) acc[r] = 0.0f;   // (a measurement build: the rows' products not made)
    (void)first, (void)rec, (void)n, (void)K, (void)x;
#else
    cs_rows<kRows>(first, rec, n, K, x, acc);
#endif
}
// cs_linear_hop's loop over a residual hop's pieces in batches of 4 rows. (Its own function: one
// loop templated on the batch's rows for both made slower code: bench/NOTES.md 188.)
template <class LaneX>
__device__ int cs_resid_rows4(const CsHop &h, CsSmem *s, int rank, const CsRing &ring, const LaneX &lx, float inv_rms, int piece,
                              uint32_t dst_at, uint32_t bar_at, int cluster) {
    const int lane = threadIdx.x % 32, row0 = rank * h.rows_per_block, mine = cs_mine(h, rank);
    int batch = 0;
    for (int r0 = 0; r0 < mine; r0 += h.rows_per_piece, piece++) {
        const int in_piece = min(h.rows_per_piece, mine - r0), first = cs_first_batch<4>(r0);
        const unsigned char *bytes = ring.wait(piece);
        for (int b = first; b < in_piece; b += 4 * kCsWarps) {
            if (batch == 0) ring.tick(4);
            float acc[4];
            cs_hop_rows<4>(bytes + (size_t)b * h.rec, h.rec, in_piece - b, h.K, lx, acc);
            if (batch == 0) ring.tick(5);
            const int r = lane / 8, row = row0 + r0 + b + r;
            const bool valid = b + r < in_piece;
            float v = cs_sum4(acc) * inv_rms;
            if (batch == 0) ring.tick(6);
            if (h.bias_at && valid) v += *reinterpret_cast<const float *>(bytes + (size_t)(b + r) * h.rec + h.bias_at);
            const float out = valid ? s->res[row] + v : 0.0f;
            if (batch == 0) ring.tick(7);
            cs_share_rows4(dst_at, bar_at, out, row0 + r0 + b, in_piece - b, cluster);
            if (batch == 0) ring.tick(8);
            batch++;
        }
        __syncwarp();
        ring.release(piece);
    }
    return piece;
}

// A linear hop's rows of this block (pieces from ring.base on). Output o of the hop goes to every
// block's dst[o] (dst: the next x buffer, or the residual stream), each block's copy written by
// lane `rank` of a warp. Returns the pieces it took.
template <typename KV, int kChunks>
__device__ int cs_linear_hop(const CsParams &p, CsSmem *s, const CsHop &h, int rank, const CsRing &ring, const float *x, float *dst,
                             uint32_t bar_at) {
    const int lane = threadIdx.x % 32;
    if (h.idle_ranks >> rank & 1) {   // no rows (its word sent): x not staged, nothing read that the next hop's senders may write
        if (!h.gamma) return 0;
        ring.wait(0);
        ring.release(0);
        return 1;
    }
    int piece = 0;
    const float *gamma = nullptr;
    if (h.gamma) gamma = reinterpret_cast<const float *>(ring.wait(piece++));
    ring.tick(1);
    CsLaneXOf<kChunks, kCsTailWide && kChunks == kCsChunks> lx;
    float inv_rms;
#ifdef CS_TWICE
    // (a measurement build, with CS_TRACE: x's digits staged twice by the same machine code, the
    // warps together before the first pass; if a phase's cost is its code's fetch, the second pass
    // is the cheaper one)
    cs_consumers_sync();
    ring.tick(13);
#pragma unroll 1
    for (int pass = 0; pass < 2; pass++) {
        inv_rms = cs_stage_digits<false>(s->digits, s->u, &s->norm_scale, x, h.K, gamma, p.eps);
        if (pass == 0) ring.tick(14);
    }
#elif CS_NO_MATH >= 2
    inv_rms = 1.0f;   // (a measurement build: x neither normed nor staged)
    (void)gamma;
#else
    inv_rms = cs_stage_digits<false>(s->digits, s->u, &s->norm_scale, x, h.K, gamma, p.eps);
#endif
    ring.tick(2);
    if (h.gamma) ring.release(0);
#if !(CS_NO_MATH >= 2)
    lx.load(s->digits, s->u, h.K, SmallDiv(h.group_inv));
#endif
    ring.stamp_mark();
    ring.tick(3);
    int batch = 0;   // the warp's batches so far (CS_TRACE ticks its first three)
    const int row0 = rank * h.rows_per_block, mine = cs_mine(h, rank);
    const uint32_t dst_at = cs_saddr(dst);
#ifndef CS_NO_ROWS4
    if constexpr (!decltype(lx)::kTailItems)
        if (h.kind == CS_RESID && h.rows_per_block <= 4 * kCsWarps) return cs_resid_rows4(h, s, rank, ring, lx, inv_rms, piece, dst_at, bar_at, p.cluster);
#endif
    for (int r0 = 0; r0 < mine; r0 += h.rows_per_piece, piece++) {
        const int in_piece = min(h.rows_per_piece, mine - r0), first = cs_first_batch(r0);
        const unsigned char *bytes = ring.wait(piece);
        for (int b = first; b < in_piece; b += 8 * kCsWarps) {   // 8 rows a warp at once
            if (batch == 0) ring.tick(4);
            else if (batch < 3) ring.tick(13 + 2 * batch);
            float acc[8];
            cs_hop_rows<8>(bytes + (size_t)b * h.rec, h.rec, in_piece - b, h.K, lx, acc);
            if (batch == 0) ring.tick(5);
            const int r = lane / 4, row = row0 + r0 + b + r;   // the row this lane's sum is
            const bool valid = b + r < in_piece;
            float v = cs_sum8(acc) * inv_rms;
            if (batch == 0) ring.tick(6);
            if (h.bias_at && valid) v += *reinterpret_cast<const float *>(bytes + (size_t)(b + r) * h.rec + h.bias_at);
            const float other = __shfl_xor_sync(~0u, v, 4);   // the pair's other row (rows 8-aligned)
            float out = v;
            if (h.kind == CS_SWIGLU) out = (r & 1) ? 0.0f : v * cs_rcp(1.0f + expf(-v)) * other;
            else if (h.kind == CS_RESID) out = valid ? s->res[row] + v : 0.0f;
            else if (h.kind == CS_QKV) out = cs_qkv_epilogue<KV>(p, s, h, row, valid, v, other);
            if (batch == 0) ring.tick(7);
            cs_share_rows8(dst_at, bar_at, out, row0 + r0 + b, in_piece - b, p.cluster, h.kind == CS_SWIGLU);
            if (batch == 0) ring.tick(8);
            else if (batch < 3) ring.tick(14 + 2 * batch);
            batch++;
        }
        __syncwarp();
        ring.release(piece);
    }
    return piece;
}

// The attention in warp slices (NOTES 116, 117). The positions [0, P] are dealt in contiguous
// slices to the kCsWarps warps; each warp takes its slice's scores, their maximum and the exponentials'
// sum by shuffles (no barrier), then its part of the weighted sum of the value rows (a lane a pair
// of dimensions, every position of the slice); after one barrier, a thread a (block, 4 dimensions)
// combines the warps' parts as flash-decoding combines its splits and sends them by one st.async.
constexpr int kCsPartStride = kCsMaxHead + 4;   // a warp's part: hs sums, its maximum, its sum (16-byte rows)
static_assert(kCsScratchBytes >= sizeof(float) * kCsWarps * kCsPartStride && kCsScratchAt % 16 == 0,
              "the warps' parts fit, aligned, where a linear hop stages x");

// 4 elements of a key or value row as floats (FP16: 8 bytes, FP32: 16; k 4-element aligned).
__device__ __forceinline__ float4 cs_load4(const __half *k) {
    const uint2 u = *reinterpret_cast<const uint2 *>(k);
    const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&u.x)), b = __half22float2(*reinterpret_cast<const __half2 *>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 cs_load4(const float *k) { return *reinterpret_cast<const float4 *>(k); }
__device__ __forceinline__ float2 cs_load2(const __half *v) { return __half22float2(*reinterpret_cast<const __half2 *>(v)); }
__device__ __forceinline__ float2 cs_load2(const float *v) { return *reinterpret_cast<const float2 *>(v); }
// The warp's largest of v (never NaN) by one redux.sync on its bits made signed-ordered (a
// negative's magnitude bits flipped), where 5 rounds of shuffles stood (NOTES 175).
__device__ __forceinline__ float cs_warp_max(float v) {
    const int b = __float_as_int(v), top = __reduce_max_sync(~0u, b >= 0 ? b : b ^ 0x7fffffff);
    return __int_as_float(top >= 0 ? top : top ^ 0x7fffffff);
}

// The step's own position's weight in a warp's slice of the positions [t0, t1): its exponential
// where the slice holds P (the last, t1 == P + 1), else 0; its value row is the step's own.
__device__ __forceinline__ float cs_own_weight(const float *scores, int t0, int t1, int P) {
    return t0 < t1 && t1 == P + 1 ? scores[P] : 0.0f;
}

// q . k over a key row (hs elements, 4 a load), the row's 4-element units taken from unit `first`
// on (cs_key_first): a warp's lanes take consecutive rows, and rows whose first units would share a
// bank (every kBanks / gcd(hs / 4, kBanks)-th, kBanks the units a wavefront of 128 bytes holds)
// start at different units, wrapping round to unit 0: one loop whose length is the same in every
// lane (two loops, from first and then to it, ran as long as their longest lanes: NOTES 160). Two
// sums, so that the loads of the unrolled loop run ahead of one chain of adds.
template <typename KV>
__device__ __forceinline__ float cs_dot_key4(const float *q, const KV *k, int hs, int first) {
    const int n = hs / 4;
    float a = 0.0f, b = 0.0f;
    auto unit = [&](int u) {
        const float4 qv = *reinterpret_cast<const float4 *>(q + 4 * u), kv = cs_load4(k + 4 * u);
        a = fmaf(qv.x, kv.x, a), b = fmaf(qv.y, kv.y, b), a = fmaf(qv.z, kv.z, a), b = fmaf(qv.w, kv.w, b);
    };
#pragma unroll 4
    for (int i = 0, u = first; i < n; i++, u = u + 1 == n ? 0 : u + 1) unit(u);
    return a + b;
}
// The rows a key row's first bank repeats after, as a shift: kBanks / gcd(hs / 4, kBanks) rows.
template <typename KV>
__host__ __device__ inline int cs_key_shift(int hs) {
    const int banks = 128 / (4 * (int)sizeof(KV)), low = (hs / 4) & -(hs / 4);
    int shift = 0;
    while (shift < 5 && (low << shift) < banks) shift++;   // (low 0, a head under 4 wide: no loop for ever)
    return shift;
}
// A lane's key rows' first unit for cs_dot_key4, without a division at run time (NOTES 142): a
// warp's consecutive lanes take consecutive rows, so the lane's number stands for its row's (rows
// that start in the same bank are 2^key_shift apart, and start at units lane >> key_shift, mod
// hs / 4).
__device__ __forceinline__ int cs_key_first(const CsParams &p, int lane) {
    const int n = p.hs / 4, r = lane >> p.key_shift;
    return r - n * SmallDiv(p.quads_inv)(r);
}
// q . the step's own key row k (in x, FP32), each element rounded as the cache holds it.
template <typename KV>
__device__ __forceinline__ float cs_dot_own4(const float *q, const float *k, int hs) {
    float a = 0.0f, b = 0.0f;
#pragma unroll 4
    for (int u = 0; u < hs / 4; u++) {
        const float4 qv = *reinterpret_cast<const float4 *>(q + 4 * u), kv = *reinterpret_cast<const float4 *>(k + 4 * u);
        a = fmaf(qv.x, (float)(KV)kv.x, a), b = fmaf(qv.y, (float)(KV)kv.y, b);
        a = fmaf(qv.z, (float)(KV)kv.z, a), b = fmaf(qv.w, (float)(KV)kv.w, b);
    }
    return a + b;
}

// The attention of the block's heads at the step's position P, in warp slices (see above): q, k
// and v of the step in x, the earlier rows of the head's kv head from the ring (kp pieces of its
// key rows, then kp of its value rows). Returns the pieces it took.
template <typename KV>
__device__ int cs_attention_hop(const CsParams &p, CsSmem *s, int rank, const CsRing &ring, const float *x, float *dst,
                                uint32_t bar_at) {
    const SmallDiv piece_of(p.per_inv);   // t / p.per (t below 2^12)
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, P = s->pos, kp = piece_of(P + p.per - 1);
    const float scale = p.att_scale;
    const int first = cs_key_first(p, lane);
    const int slice = (P + kCsWarps) / kCsWarps, t0 = min(warp * slice, P + 1), t1 = min(t0 + slice, P + 1);   // the warp's [t0, t1)
    float(*part)[kCsPartStride] = reinterpret_cast<float(*)[kCsPartStride]>(reinterpret_cast<unsigned char *>(s) + kCsScratchAt);
    const uint32_t dst_at = cs_saddr(dst);
    int nth = 0;
    for (int head = rank; head < p.n_heads; head += p.cluster, nth++) {
        const int kvh = SmallDiv(p.kv_group_inv)(head), base = 2 * kp * nth;
        const float *q = x + head * p.hs, *own_v = x + p.q_dim + p.kvd + kvh * p.hs;
        for (int i = 0; i < kp; i++) ring.wait(base + i);
        if (nth == 0) ring.tick(1);
        float m = -INFINITY;
        // the slice's scores: a lane a position (the step's own from x, as the cache holds it)
        for (int t = t0 + lane; t < t1; t += 32) {
            float sc;
            if (t < P) {
                const int piece = piece_of(t), row = t - piece * p.per;
                sc = cs_dot_key4(q, reinterpret_cast<const KV *>(ring.at(base + piece)) + (size_t)row * p.hs, p.hs, first);
            } else {
                sc = cs_dot_own4<KV>(q, x + p.q_dim + kvh * p.hs, p.hs);
            }
            s->scores[t] = sc *= scale;
            m = fmaxf(m, sc);
        }
        if (nth == 0) ring.tick(2);
        m = cs_warp_max(m);   // (-inf for an empty slice: its sum and parts are 0)
        if (nth == 0) ring.tick(3);
        __syncwarp();
        for (int i = 0; i < kp; i++) ring.release(base + i);
        float sum = 0.0f;
        for (int t = t0 + lane; t < t1; t += 32) {
            const float e = __expf(s->scores[t] - m);   // (ex2.approx of x log2(e), x <= 0: NOTES 175)
            s->scores[t] = e;
            sum += e;
        }
        sum = warp_sum(sum);
        __syncwarp();   // the slice's exponentials, to every lane of the warp
        ring.stamp_mark();
        if (nth == 0) ring.tick(4);
        for (int i = 0; i < kp; i++) ring.wait(base + kp + i);
        if (nth == 0) ring.tick(5);
        // the slice's weighted sum of the value rows, in runs of consecutive rows of a piece
        // Heads up to 64 wide: a lane 4 dimensions, the warp's lanes in G groups of L = hs / 4 (G
        // 2, 4 or 8: as many as 32 lanes hold), each group every G-th position of a run, the
        // groups' sums added by shuffles: a chain G times shorter than a lane a pair of every
        // position's dimensions (NOTES 177). Wider heads: a lane a pair of dimensions, and the
        // pair 64 dimensions on.
        if (p.hs <= 64) {
            const int L = p.hs / 4, G = L <= 4 ? 8 : L <= 8 ? 4 : 2, g = SmallDiv(p.quads_inv)(lane), c = lane - g * L;
            float4 o4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (g < G)
                for (int t = t0, end = min(t1, P); t < end;) {
                    const int piece = piece_of(t), row = t - piece * p.per, run = min(end - t, p.per - row);
                    const KV *v = reinterpret_cast<const KV *>(ring.at(base + kp + piece)) + (size_t)row * p.hs + 4 * c;
                    const float *e = s->scores + t;
#pragma unroll 4
                    for (int r = g; r < run; r += G) {
                        const float w = e[r];
                        const float4 vv = cs_load4(v + (size_t)r * p.hs);
                        o4.x = fmaf(w, vv.x, o4.x), o4.y = fmaf(w, vv.y, o4.y), o4.z = fmaf(w, vv.z, o4.z), o4.w = fmaf(w, vv.w, o4.w);
                    }
                    t += run;
                }
            for (int sh = G / 2; sh >= 1; sh /= 2) {
                o4.x += __shfl_down_sync(~0u, o4.x, sh * L), o4.y += __shfl_down_sync(~0u, o4.y, sh * L);
                o4.z += __shfl_down_sync(~0u, o4.z, sh * L), o4.w += __shfl_down_sync(~0u, o4.w, sh * L);
            }
            const float e_own = cs_own_weight(s->scores, t0, t1, P);
            if (lane < L) {
                const float *ov = own_v + 4 * c;
                o4.x = fmaf(e_own, (float)(KV)ov[0], o4.x), o4.y = fmaf(e_own, (float)(KV)ov[1], o4.y);
                o4.z = fmaf(e_own, (float)(KV)ov[2], o4.z), o4.w = fmaf(e_own, (float)(KV)ov[3], o4.w);
                *reinterpret_cast<float4 *>(&part[warp][4 * c]) = o4;
            }
        } else {
            float2 o[kCsMaxHead / 64] = {};
            for (int t = t0, end = min(t1, P); t < end;) {
                const int piece = piece_of(t), row = t - piece * p.per, run = min(end - t, p.per - row);
                const KV *v = reinterpret_cast<const KV *>(ring.at(base + kp + piece)) + (size_t)row * p.hs;
                const float *e = s->scores + t;
#pragma unroll 4
                for (int r = 0; r < run; r++, v += p.hs) {
                    const float w = e[r];
#pragma unroll
                    for (int j = 0; j < kCsMaxHead / 64; j++)
                        if (2 * (lane + 32 * j) < p.hs) {
                            const float2 vv = cs_load2(v + 2 * (lane + 32 * j));
                            o[j].x = fmaf(w, vv.x, o[j].x), o[j].y = fmaf(w, vv.y, o[j].y);
                        }
                }
                t += run;
            }
            const float e_own = cs_own_weight(s->scores, t0, t1, P);
#pragma unroll
            for (int j = 0; j < kCsMaxHead / 64; j++) {
                const int d = 2 * (lane + 32 * j);
                if (d >= p.hs) continue;
                o[j].x = fmaf(e_own, (float)(KV)own_v[d], o[j].x), o[j].y = fmaf(e_own, (float)(KV)own_v[d + 1], o[j].y);
                *reinterpret_cast<float2 *>(&part[warp][d]) = o[j];
            }
        }
        if (lane == 0) part[warp][kCsMaxHead] = m, part[warp][kCsMaxHead + 1] = sum;
        __syncwarp();
        for (int i = 0; i < kp; i++) ring.release(base + kp + i);
        cs_consumers_sync();
        if (nth == 0) ring.tick(6);
        // the warps' parts combined, 4 dimensions for one block a thread
        float f[kCsWarps], mx = -INFINITY, den = 0.0f;
#pragma unroll
        for (int w = 0; w < kCsWarps; w++) mx = fmaxf(mx, part[w][kCsMaxHead]);
#pragma unroll
        for (int w = 0; w < kCsWarps; w++) {
            f[w] = __expf(part[w][kCsMaxHead] - mx);   // (ex2.approx, as the slices' exponentials: NOTES 177)
            den = fmaf(f[w], part[w][kCsMaxHead + 1], den);
        }
        const float inv = cs_rcp(den);
        const int quads = p.hs / 4;
        const SmallDiv block_of(p.quads_inv);   // (t below 16 x 32)
        for (int t = threadIdx.x; t < p.cluster * quads; t += kCsConsumers) {
            const int to = block_of(t), d = 4 * (t - to * quads);
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int w = 0; w < kCsWarps; w++) {
                const float4 pw = *reinterpret_cast<const float4 *>(&part[w][d]);
                a.x = fmaf(f[w], pw.x, a.x), a.y = fmaf(f[w], pw.y, a.y), a.z = fmaf(f[w], pw.z, a.z), a.w = fmaf(f[w], pw.w, a.w);
            }
            cs_send4(dst_at + 4 * (head * p.hs + d), bar_at, to, a.x * inv, a.y * inv, a.z * inv, a.w * inv);
        }
        if (nth == 0) ring.tick(7);
        // scores and parts free for the next head (after the last, the next hop's first barrier
        // comes before any write of them or of x's staging)
        if (head + p.cluster < p.n_heads) cs_consumers_sync();
    }
    return 2 * kp * nth;
}

// The step's position and token (after the kernels before have finished), its embedding row into
// the residual stream, the step's RoPE angles (sincosf(pos * freq), as the per-matrix path's).
__device__ void cs_embed(const CsParams &p, CsSmem *s) {
    const int pos = __ldcg(p.inputs), token = min(max(__ldcg(p.inputs + 1), 0), p.vocab - 1);   // (ids checked by the host)
    const size_t row = (size_t)token * p.emb_stride;
    for (int i = threadIdx.x; i < p.dim; i += kCsConsumers)
        s->res[i] = p.emb_f ? __ldg(p.emb_f + row + i) : __ldg(p.emb_q + row + i) * __ldg(p.emb_s + (size_t)token * p.emb_groups + i / p.emb_gs);
    for (int i = threadIdx.x; i < p.hs / 2; i += kCsConsumers) sincosf(pos * __ldg(p.rope_freq + i), &s->rope_sin[i], &s->rope_cos[i]);
    if (threadIdx.x == 0) s->pos = pos;
    cs_consumers_sync();
}

template <typename KV, int kChunks>
__device__ void cs_consume(const CsParams &p, CsSmem *s, int rank) {
    const bool stamp = p.trace && rank == 0 && threadIdx.x == 0;
    pdl_wait();   // the step's inputs: the step before's classifier, or the host's copy
    if (stamp) cs_stamp(p.trace, 0);
#ifdef CS_TRACE
    if (stamp) p.trace[cs_boundary_at(p.n_hops, p.cluster)] = p.trace[p.n_hops + 4];
#endif
    cs_embed(p, s);
    if (stamp) cs_stamp(p.trace, 1);
    unsigned phases = 0;   // bit j: the parity xbar[j] waits for next
    int piece = 0;         // the block's pieces of the hops before
    for (int i = 0; i < p.n_hops; i++) {
        // the hop's fields read into registers before its input's wait, off the chain that starts
        // when the input lands (NOTES 144)
        const CsHop h = s->hops[i];
        if (i > 0) {
            cs_wait<true>(cs_saddr(&s->xbar[i & 1]), (phases >> (i & 1)) & 1, CS_AT_HOP, i);
            phases ^= 1u << (i & 1);
        }
        if (stamp) cs_stamp(p.trace, 2 + i);
        const float *x = h.kind == CS_QKV || h.kind == CS_SWIGLU ? s->res : s->xb[i & 1];
        float *dst = h.kind == CS_RESID ? s->res : s->xb[(i + 1) & 1];
        unsigned long long waited = 0;
#ifdef CS_TRACE
        unsigned long long mark = 0, *ticks = p.trace + 4 * p.n_hops + 5 + ((size_t)(rank * p.n_hops + i) * kCsWarps + threadIdx.x / 32) * kCsTicks;
        if (threadIdx.x % 32 < kCsTicks) ticks[threadIdx.x % 32] = 0;
        __syncwarp();
        const unsigned long long start_ns = cs_now();
        const CsRing ring = {s, piece, stamp ? &waited : nullptr, stamp ? &mark : nullptr, ticks,
                             stamp ? p.trace + cs_pieces_at(p.n_hops, p.cluster) : nullptr};
#else
        const CsRing ring = {s, piece, stamp ? &waited : nullptr, nullptr, nullptr};
#endif
        ring.tick(0);
        const uint32_t bar_at = cs_saddr(&s->xbar[(i + 1) & 1]);   // the next hop's input's
        // every warp here before the next input's barrier is armed: no warp arrives on its barriers,
        // so without this one could fall two of their phases behind, past what a parity tells
        cs_consumers_sync();
        // Every block takes part in every hand-over: one with nothing to send sends each block a
        // word after its own input has all landed, so that no block's next hop (whose senders may
        // write where this hop's input was) starts before every block's input is in, and no
        // input barrier's phase ends on the next hop's bytes (NOTES 140, 143).
        if ((h.idle_ranks >> rank & 1) && threadIdx.x < p.cluster) cs_send(cs_saddr(&s->token[rank]), bar_at, threadIdx.x, 0.0f);
        if (threadIdx.x == 0) mbar_arrive_expect(bar_at, h.expect);   // (its phase before completed before any block could start this hop)
        piece += h.kind == CS_ATTN ? cs_attention_hop<KV>(p, s, rank, ring, x, dst, bar_at)
                                   : cs_linear_hop<KV, kChunks>(p, s, h, rank, ring, x, dst, bar_at);
        ring.tick(9);
#ifdef CS_TRACE
        if (stamp) p.trace[p.n_hops + 5 + i] = waited, p.trace[2 * p.n_hops + 5 + i] = mark, p.trace[3 * p.n_hops + 5 + i] = cs_now();
#endif
        ring.tick(10);
#ifdef CS_TRACE
        if (threadIdx.x % 32 == 0) ticks[11] = start_ns, ticks[12] = cs_now();
#endif
    }
    cs_wait<true>(cs_saddr(&s->xbar[p.n_hops & 1]), (phases >> (p.n_hops & 1)) & 1, CS_AT_HOP, p.n_hops);
    if (stamp) cs_stamp(p.trace, 2 + p.n_hops);
    if (rank == 0) {
        for (int i = threadIdx.x; i < p.dim; i += kCsConsumers) p.out[i] = s->res[i];
        cs_consumers_sync();   // every consumer's part of x written, before the release that publishes them
        if (threadIdx.x == 0) asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p.x_ready), "l"(p.launch) : "memory");
    }
    asm volatile("fence.proxy.async.global;" ::: "memory");   // the KV stores, before the next step's copies read them
}

template <typename KV, int kChunks>
__global__ void __launch_bounds__(kCsThreads, 1) cs_layers_kernel(const __grid_constant__ CsParams p) {
    extern __shared__ __align__(128) unsigned char cs_smem[];
    CsSmem *s = reinterpret_cast<CsSmem *>(cs_smem);
    const int rank = cs_rank();
#ifdef CS_TRACE
    if (p.trace && rank == 0 && threadIdx.x == 0) p.trace[cs_boundary_at(p.n_hops, p.cluster) + 1] = cs_now();
#endif
    pdl_release();   // the classifier's blocks may start copying their rows
    const int words = p.n_hops * (int)sizeof(CsHop) / 4;
    for (int i = threadIdx.x; i < words; i += kCsThreads) reinterpret_cast<int *>(s->hops)[i] = __ldg(reinterpret_cast<const int *>(p.hops) + i);
    if (threadIdx.x == 0) {
        for (int i = 0; i < kCsSlots; i++) mbar_init(cs_saddr(&s->full[i]), 1), mbar_init(cs_saddr(&s->empty[i]), kCsReleasers);
        for (int i = 0; i < 2; i++) mbar_init(cs_saddr(&s->xbar[i]), 1);   // the block's own arrival with the hop's bytes
        mbar_init_fence();
    }
    cs_cluster_sync();   // the hops copied and every block's barriers initialised before any arrives on them
    if (threadIdx.x >= kCsConsumers) cs_produce<KV>(p, s, rank);
    else cs_consume<KV, kChunks>(p, s, rank);
    __syncwarp();
    cs_cluster_sync();   // no block leaves while another may still write its shared memory
}

// The classifier on the SMs the layers leave: a block's rows copied in while the layers run
// (those past kCsPreload read from global memory), then the final norm, the logits and the
// block's argmax into the step's key; the last block out takes the token and feeds it.
__device__ void cs_feed_if_last(const CsClsParams &c, unsigned long long best) {
    if (best) atomicMax(c.best, best);
    // the blocks' count by one acquire-release add: it orders this block's maximum before it and
    // the last block's exchange after it, where two fences stood (NOTES 177)
    unsigned long long done;
    asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], 1;" : "=l"(done) : "l"(c.best + 1) : "memory");
    if (done != gridDim.x - 1) return;
    const int token = cs_token_of(atomicExch(c.best, 0ull)), pos = __ldcg(c.inputs);
    c.best[1] = 0ull;   // (the next step's blocks start after this kernel has finished)
    *c.argmax = token;
    feed_step_token(c.inputs, c.step_tokens, pos, token);
    if (c.trace) cs_stamp(c.trace, 1);
}

// CS_TRACE: block 0's thread 0 stamps the classifier's phase k (kCsClsPhases).
__device__ __forceinline__ void cs_cls_phase(const CsClsParams &c, int k) {
#ifdef CS_TRACE
    if (c.trace && blockIdx.x == 0 && threadIdx.x == 0) cs_stamp(c.phases, k);
#else
    (void)c, (void)k;
#endif
}

// A classifier block's held rows copied in by its warp 0 (lane 0 issues), in pieces spread evenly
// over c.copy_span_ns from the block's start, each block's pieces a fraction of the spacing after
// the block before's; 0: all at once. Every block copying at once as the step starts holds the
// layers' first hops back (NOTES 191, 192). The whole warp keeps the time: a lane left alone in a
// loop while the others wait on the layers (PDL) is not run until that wait is over (NOTES 192).
__device__ void cs_copy_rows(const CsClsParams &c, CsClsSmem *s, int row0, int held) {
    const int bytes = held * c.rec, pieces = (bytes + kCsClsChunk - 1) / kCsClsChunk, lane = threadIdx.x % 32;
    const unsigned long long t0 = __shfl_sync(~0u, cs_now(), 0), apart = pieces ? c.copy_span_ns / pieces : 0;
    const unsigned long long first = apart * blockIdx.x / gridDim.x;
    for (int i = 0; i < pieces; i++) {
        if (apart)
            while (__shfl_sync(~0u, cs_now(), 0) - t0 < first + i * apart) __nanosleep(64);
        const int at = i * kCsClsChunk;
        if (lane == 0) bulk_copy_counted(cs_saddr(s->rows + at), c.w + (size_t)row0 * c.rec + at, min(kCsClsChunk, bytes - at), cs_saddr(&s->landed));
    }
}

// The classifier's work in one block (s: its shared memory): the rows copied in while the layers
// run, then, once they have finished, the logits of the block's rows; returns the block's argmax
// key to thread 0 (the others: their warp's).
__device__ unsigned long long cs_block_logits(const CsClsParams &c, CsClsSmem *s) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int row0 = blockIdx.x * c.rows_per_block, mine = max(0, min(c.rows_per_block, c.vocab - row0));
    const int held = min(mine, cs_rows_held(c.rec));
    cs_cls_phase(c, 4);
    if (threadIdx.x == 0) {
        mbar_init(cs_saddr(&s->landed), 1);
        mbar_init_fence();
        mbar_arrive_expect(cs_saddr(&s->landed), held * c.rec + 4 * c.dim);
        bulk_copy_counted(cs_saddr(s->gamma), c.gamma, 4 * c.dim, cs_saddr(&s->landed));
    }
    pdl_release();   // the next step's layers may start streaming
    if (warp == 0) cs_copy_rows(c, s, row0, held);   // (lane 0 initialised the barrier and copies)
    cs_cls_phase(c, 5);
    // The layers' x, as their rank 0 publishes it (their grid may not have ended). Thread 0 polls
    // alone while the block's other threads wait at its barrier, which a lone lane's loop does not
    // hold up as griddepcontrol.wait does (NOTES 192). It cannot wait forever: this grid starts
    // only once every layers block has run its launch_dependents, so all of them are resident
    // (or, without PDL, once they have ended).
    if (threadIdx.x == 0) {
        unsigned long long ready = 0;
        while (ready < c.launch) asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(ready) : "l"(c.x_ready) : "memory");
    }
    if (c.trace && blockIdx.x == 0 && threadIdx.x == 0) cs_stamp(c.trace, 0);
    __syncthreads();   // the barrier initialised
    cs_wait(cs_saddr(&s->landed), 0, CS_AT_LANDED, 0);
    cs_cls_phase(c, 6);
    for (int i = threadIdx.x; i < c.dim; i += kCsClsThreads) s->x[i] = __ldcg(c.x + i);
    __syncthreads();
    cs_cls_phase(c, 0);
    const float inv_rms = cs_stage_digits<true, kCsClsWarps>(s->digits, s->u, &s->norm_scale, s->x, c.dim, s->gamma, c.eps);
    CsLaneXOf<kCsFewChunks> lx;
    lx.load(s->digits, s->u, c.dim, SmallDiv(c.group_inv));
    cs_cls_phase(c, 1);
    unsigned long long best = 0;
    for (int b = 8 * warp; b < mine; b += 8 * kCsClsWarps) {
        float acc[8];
        // two calls, so that the held rows come through a pointer the compiler knows is shared
        // memory (LDS, 32-bit addresses) and the others through a global one (LDG): one call on a
        // pointer that may be either loads every row by generic loads, more slowly (NOTES 190)
        if (b < held) cs_rows(s->rows + (size_t)b * c.rec, c.rec, min(8, mine - b), c.dim, lx, acc);
        else cs_rows(c.w + (size_t)(row0 + b) * c.rec, c.rec, min(8, mine - b), c.dim, lx, acc);
        const float v = cs_sum8(acc) * inv_rms;
        const int row = b + lane / 4;
        if (lane % 4 == 0 && row < mine) {
            c.logits[row0 + row] = v;
            best = max(best, cs_key(v, row0 + row));
        }
    }
    cs_cls_phase(c, 2);
#pragma unroll
    for (int o = 16; o; o >>= 1) best = max(best, __shfl_xor_sync(~0u, best, o));
    if (lane == 0) s->best[warp] = best;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < kCsClsWarps; w++) best = max(best, s->best[w]);
    cs_cls_phase(c, 3);
    return best;
}

__global__ void __launch_bounds__(kCsClsThreads, 1) cs_classifier_kernel(const CsClsParams c) {
    extern __shared__ __align__(128) unsigned char cs_smem[];
    const unsigned long long best = cs_block_logits(c, reinterpret_cast<CsClsSmem *>(cs_smem));
    // this grid ends after the layers' (the next step's layers wait for it); every block waits
    // before its count, where only the last block out waiting after it gained nothing (NOTES 200)
    if (threadIdx.x == 0) pdl_wait();
    if (threadIdx.x == 0) cs_feed_if_last(c, best);
}

// Records of rows from up to three matrices (one after another, or w1's and w3's alternating):
// block r writes record r.
struct CsPackSrc {
    const int8_t *q[3];
    const float *s[3], *bias[3];
    int rows[3], stride[3], groups[3];
};
__global__ void cs_pack_kernel(unsigned char *out, CsPackSrc src, int interleave, int K, int rec, int bias_at) {
    int r = blockIdx.x, j = 0;
    if (interleave) j = r & 1, r >>= 1;
    else
        while (j < 2 && r >= src.rows[j]) r -= src.rows[j], j++;
    const int scales_at = cs_scales_at(K), groups = src.groups[j];
    unsigned char *rec_out = out + (size_t)blockIdx.x * rec;
    for (int i = threadIdx.x; i < rec; i += blockDim.x) {
        unsigned char byte = 0;
        if (i < K) byte = (unsigned char)src.q[j][(size_t)r * src.stride[j] + i];
        else if (i >= scales_at && i < scales_at + 4 * groups) {
            const float v = src.s[j][(size_t)r * groups + (i - scales_at) / 4];
            byte = reinterpret_cast<const unsigned char *>(&v)[(i - scales_at) % 4];
        } else if (bias_at && i >= bias_at && i < bias_at + 4) {
            const float v = src.bias[j][r];
            byte = reinterpret_cast<const unsigned char *>(&v)[i - bias_at];
        }
        rec_out[i] = byte;
    }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Host side: the schedule from the recorded step (the same MegaStage list the megakernel takes).

constexpr int kCsBestWords = 3;   // CsClsParams::best's two, then x_ready (0: no launch yet)

struct GpuCluster {
    CsParams p;
    CsClsParams c;
    CsHop *hops;               // device copy of the hops
    unsigned char *pack;       // every linear layer's records, the classifier's last
    size_t pack_bytes, smem, cls_smem;
    int cls_blocks, positions;
    unsigned long long *best;  // CsClsParams::best
    void (*layers)(CsParams);
    unsigned long long launches;   // the launches so far (CsClsParams::launch)
};

namespace {

// What a linear stage of the recorded step must be for its hop (else why).
static bool cs_linear_ok(const MegaStage &m, LinearForm form, const float *x, const float *y, int accumulate, bool norm, char *why) {
    const LinearCall &c = m.linear;
    const int n_w = form == LINEAR_QKV_ROPE ? 3 : form == LINEAR_SWIGLU ? 2 : 1;
    if (m.kind != MEGA_LINEAR || c.form != form || c.M != 1 || c.x != x || (y && c.y != y) || c.accumulate != accumulate ||
        (c.norm_w != NULL) != norm)
        return snprintf(why, ERR_LEN, "its stages are not the layers it runs"), false;
    for (int j = 0; j < n_w; j++) {
        const Mat *w = c.w[j];
        if (!w->q || w->gs % kCsGroupMultiple || w->cols != c.w[0]->cols || w->gs != c.w[0]->gs)
            return snprintf(why, ERR_LEN, "a linear layer is not INT8 in groups of a multiple of %d", kCsGroupMultiple), false;
    }
    return true;
}

// A linear hop of the stage's matrices: its norm's weights (copied: the bulk copies want 16-byte
// alignment, which a file's layout need not give) and its records packed at *at in the pack (or,
// with pack NULL, only their bytes counted).
static CsHop cs_hop(const LinearCall &c, int kind, int cluster, unsigned char *pack, size_t *at, int layer, GpuCtx *g) {
    const int n_w = kind == CS_QKV ? 3 : kind == CS_SWIGLU ? 2 : 1, K = c.w[0]->cols, groups = c.w[0]->groups;
    const bool bias = kind == CS_QKV && c.qkv.bias[0];
    CsHop h = {};
    h.kind = kind, h.K = K, h.layer = layer, h.group_chunks = c.w[0]->gs / 16, h.group_inv = small_div_inverse(h.group_chunks);
    if (c.norm_w) {
        if (pack) CUDA_CHECK(cudaMemcpyAsync(pack + *at, c.norm_w, 4 * (size_t)K, cudaMemcpyDeviceToDevice, g->stream));
        h.gamma = pack ? reinterpret_cast<const float *>(pack + *at) : c.norm_w;
        *at += round_up(4 * K, 16);
    }
    for (int j = 0; j < n_w; j++) h.rows += c.w[j]->rows;
    h.bias_at = bias ? cs_scales_at(K) + 4 * groups : 0;
    h.rec = cs_scales_at(K) + round_up(4 * groups + (bias ? 4 : 0), 16);
    h.rows_per_block = round_up(ceil_div_i(h.rows, cluster), 8);
    h.rows_per_piece = kCsSlotBytes / h.rec & ~7;
    if (pack) {
        CsPackSrc src = {};
        for (int j = 0; j < n_w; j++) {
            const Mat *w = c.w[j];
            src.q[j] = w->q, src.s[j] = w->s, src.bias[j] = bias ? c.qkv.bias[j] : NULL;
            src.rows[j] = w->rows, src.stride[j] = w->stride, src.groups[j] = w->groups;
        }
        h.w = pack + *at;
        launch(g, "cs_pack_kernel", cs_pack_kernel, dim3(h.rows), dim3(128), 0, pack + *at, src, (int)(kind == CS_SWIGLU), K, h.rec, h.bias_at);
    }
    *at += (size_t)h.rows * h.rec;
    return h;
}

// Each hop's bytes into a block's input barrier (its outputs, as each block's copy, and a word from
// each block with nothing to send) and those blocks: no rows, or no head.
static void cs_hop_sends(CsHop *hops, const CsParams &p) {
    for (int i = 0; i < p.n_hops; i++) {
        CsHop &h = hops[i];
        h.idle_ranks = 0;
        for (int r = 0; r < p.cluster; r++)
            if (h.kind == CS_ATTN ? r >= p.n_heads : cs_mine(h, r) == 0) h.idle_ranks |= 1u << r;
        h.expect = 4 * (h.kind == CS_ATTN ? p.q_dim : h.kind == CS_SWIGLU ? h.rows / 2 : h.rows);
        h.expect += 4 * __builtin_popcount(h.idle_ranks);
    }
}

// The recorded step's hops (pack NULL: only checked and counted; else packed), their records'
// bytes in *bytes; false with why where the step is not what the kernel runs.
// The caches must be one block of layers x seq_len rows (the first sequence's), as the tensor
// maps take them.
static bool cs_hops(GpuCtx *g, const MegaStage *st, int n, MegaAttention at, int cluster, unsigned char *pack, CsHop *hops, size_t *bytes,
                    char *why) {
    const int layers = (n - 2) / 5;
    const size_t layer_bytes = (size_t)at.seq_len * at.n_kv_heads * at.head_size * (at.kv_half ? 2 : 4);
    if (n < 7 || (n - 2) % 5 || st[0].kind != MEGA_EMBED) return snprintf(why, ERR_LEN, "its stages are not the layers it runs"), false;
    if (5 * layers > kCsMaxHops) return snprintf(why, ERR_LEN, "%d layers, more than its %d", layers, kCsMaxHops / 5), false;
    float *res = st[0].x;
    *bytes = 0;
    for (int l = 0; l < layers; l++) {
        const MegaStage *s = st + 1 + 5 * l;
        const LinearCall &qkv = s[0].linear;
        const float *att_out = s[1].out, *hidden = s[3].linear.y;
        if (!cs_linear_ok(s[0], LINEAR_QKV_ROPE, res, NULL, 0, true, why)) return false;
        if (s[1].kind != MEGA_ATTENTION || s[1].q != qkv.y || s[1].key_cache != qkv.qkv.key_cache || s[1].value_cache != qkv.qkv.value_cache ||
            qkv.qkv.seq_stride)
            return snprintf(why, ERR_LEN, "its stages are not the layers it runs"), false;
        const QkvRope &r = qkv.qkv, &r0 = st[1].linear.qkv;
        if ((const char *)r.key_cache != (const char *)r0.key_cache + l * layer_bytes ||
            (const char *)r.value_cache != (const char *)r0.value_cache + l * layer_bytes || r.kv_half != at.kv_half ||
            r.head_size != at.head_size || r.rope_freq != r0.rope_freq)
            return snprintf(why, ERR_LEN, "its caches are not one block of layers"), false;
        if (!cs_linear_ok(s[2], LINEAR_PLAIN, att_out, res, 1, false, why) || !cs_linear_ok(s[3], LINEAR_SWIGLU, res, NULL, 0, true, why) ||
            !cs_linear_ok(s[4], LINEAR_PLAIN, hidden, res, 1, false, why))
            return false;
        hops[5 * l + 0] = cs_hop(qkv, CS_QKV, cluster, pack, bytes, l, g);
        hops[5 * l + 1] = CsHop{};
        hops[5 * l + 1].kind = CS_ATTN, hops[5 * l + 1].layer = l;
        hops[5 * l + 2] = cs_hop(s[2].linear, CS_RESID, cluster, pack, bytes, l, g);
        hops[5 * l + 3] = cs_hop(s[3].linear, CS_SWIGLU, cluster, pack, bytes, l, g);
        hops[5 * l + 4] = cs_hop(s[4].linear, CS_RESID, cluster, pack, bytes, l, g);
    }
    if (!cs_linear_ok(st[n - 1], LINEAR_PLAIN, res, NULL, 0, true, why)) return false;
    return true;
}

// The layers' kernel for a model: its cache's type, and a lane's chunks of x as few as hold the
// widest x of a hop (the model's width, the output projection's q, w2's hidden width).
static void (*cs_layers_for(const MegaStage *st, MegaAttention at))(CsParams) {
    const int widest = max(st[1].linear.w[0]->cols, max(at.n_heads * at.head_size, st[4].linear.w[0]->rows));
    bool few = widest <= 16 * 32 * kCsFewChunks;   // (a chunk a lane: 16 columns x 32 lanes a pass)
#ifdef CS_WIDE_ONLY
    few = false;
#endif
    if (at.kv_half) return few ? cs_layers_kernel<__half, kCsFewChunks> : cs_layers_kernel<__half, kCsChunks>;
    return few ? cs_layers_kernel<float, kCsFewChunks> : cs_layers_kernel<float, kCsChunks>;
}

// The shapes the kernels hold (else why): widths, heads, each hop's records.
static bool cs_shape_fits(const MegaStage *st, int n, MegaAttention at, const CsHop *hops, char *why) {
    const LinearCall &qkv = st[1].linear, &w13 = st[4].linear;
    const int dim = qkv.w[0]->cols, q_dim = at.n_heads * at.head_size, kvd = at.n_kv_heads * at.head_size, hidden = w13.w[0]->rows;
    const int esize = at.kv_half ? 2 : 4;
    if (dim > kCsMaxDim || q_dim + 2 * kvd > kCsMaxX || hidden > kCsMaxX)
        return snprintf(why, ERR_LEN, "width %d, q, k and v %d or hidden %d past its %d, %d and %d", dim, q_dim + 2 * kvd, hidden, kCsMaxDim,
                        kCsMaxX, kCsMaxX), false;
    if (dim % 4) return snprintf(why, ERR_LEN, "width %d (it takes multiples of 4)", dim), false;
    if (at.head_size < 16 / esize || at.head_size > kCsMaxHead || at.head_size * esize % 16)   // (so q_dim and kvd are even: RoPE's pairs)
        return snprintf(why, ERR_LEN, "head size %d (it takes multiples of %d up to %d)", at.head_size, 16 / esize, kCsMaxHead), false;
    if (at.n_heads % at.n_kv_heads) return snprintf(why, ERR_LEN, "%d heads over %d kv heads", at.n_heads, at.n_kv_heads), false;
    const Mat *wo = st[3].linear.w[0], *w2 = st[5].linear.w[0];
    const bool biases = qkv.qkv.bias[0] || qkv.qkv.bias[1] || qkv.qkv.bias[2];
    if (qkv.w[0]->rows != q_dim || qkv.w[1]->rows != kvd || qkv.w[2]->rows != kvd || w13.w[1]->rows != hidden || wo->cols != q_dim ||
        wo->rows != dim || w2->cols != hidden || w2->rows != dim || (biases && !(qkv.qkv.bias[0] && qkv.qkv.bias[1] && qkv.qkv.bias[2])) ||
        st[n - 1].linear.w[0]->cols != dim || st[0].embedding->cols != dim || (!st[0].embedding->q && !st[0].embedding->f))
        return snprintf(why, ERR_LEN, "its stages are not the layers it runs"), false;
    for (int i = 0; i < n - 2; i++)
        if (hops[i].kind != CS_ATTN && hops[i].rows_per_piece < 8)
            return snprintf(why, ERR_LEN, "a row of %d columns is past its slots' %d bytes / 8", hops[i].K, kCsSlotBytes), false;
    return true;
}

// The caches as 2-D tensors (layers x seq rows of kvd elements), a box of per rows of a head.
static bool cs_cache_map(CUtensorMap *map, const void *cache, MegaAttention at, int layers, int per, char *why) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult found;
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (!fn || found != cudaDriverEntryPointSuccess) return snprintf(why, ERR_LEN, "the driver has no cuTensorMapEncodeTiled"), false;
    const int esize = at.kv_half ? 2 : 4, kvd = at.n_kv_heads * at.head_size;
    const cuuint64_t dims[2] = {(cuuint64_t)kvd, (cuuint64_t)layers * at.seq_len}, strides[1] = {(cuuint64_t)kvd * esize};
    const cuuint32_t box[2] = {(cuuint32_t)at.head_size, (cuuint32_t)per}, steps[2] = {1, 1};
    const CUresult r = ((PFN_cuTensorMapEncodeTiled_v12000)fn)(
        map, at.kv_half ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<void *>(cache), dims, strides, box,
        steps, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return snprintf(why, ERR_LEN, "cuTensorMapEncodeTiled: error %d", (int)r), false;
    return true;
}

// The largest cluster (16, else 8) of blocks of smem bytes this GPU places, leaving SMs for the
// classifier; 0 where none.
static int cs_cluster_size(GpuCtx *g, void (*kernel)(CsParams), size_t smem) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    for (int size = kCsMaxCluster; size >= 8; size /= 2) {
        if (g->sms <= size) continue;
        cudaLaunchAttribute attr;
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = size, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(size), cfg.blockDim = dim3(kCsThreads), cfg.dynamicSmemBytes = smem, cfg.attrs = &attr, cfg.numAttrs = 1;
        int clusters = 0;
        const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();   // a size the GPU does not take: try the next
            continue;
        }
        if (clusters >= 1) return size;
    }
    return 0;
}

static void cs_free(GpuCluster *c) {
    if (!c) return;
    if (c->hops) CUDA_CHECK(cudaFree(c->hops));
    if (c->pack) CUDA_CHECK(cudaFree(c->pack));
    if (c->best) CUDA_CHECK(cudaFree(c->best));
    if (c->p.trace) CUDA_CHECK(cudaFree(c->p.trace));
    free(c);   // (aligned_alloc's)
}

// The records' copy on the device (false with why where the GPU's memory has no room for it).
static bool cs_alloc_pack(GpuCluster *c, char *why) {
    constexpr size_t kMargin = 256u << 20;   // the schedule's own buffers and the step's graph come after it
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const cudaError_t e = c->pack_bytes + kMargin <= free_bytes ? cudaMalloc(&c->pack, c->pack_bytes) : cudaErrorMemoryAllocation;
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        c->pack = NULL;
        return snprintf(why, ERR_LEN, "its copy of the weights (%.2f GB) does not fit the GPU's free memory (%.2f GB)", c->pack_bytes / 1e9,
                        free_bytes / 1e9), false;
    }
    CUDA_CHECK(e);
    return true;
}

// The classifier's launch: its records after the layers', a share of the rows a block.
static bool cs_classifier(GpuCtx *g, GpuCluster *c, const LinearCall &cls, size_t at, int optin, char *why) {
    c->cls_blocks = g->sms - c->p.cluster;
    size_t end = at;
    const CsHop h = cs_hop(cls, CS_RESID, 1, c->pack, &end, 0, g);   // (the records as a hop's, one block's rows)
    CsClsParams &k = c->c;
    k.dim = h.K, k.vocab = h.rows, k.rec = h.rec, k.group_chunks = h.group_chunks, k.group_inv = h.group_inv, k.eps = cls.norm_eps;
    k.rows_per_block = round_up(ceil_div_i(h.rows, c->cls_blocks), 8);
    k.w = h.w, k.gamma = h.gamma, k.x = c->p.out, k.logits = cls.y;
    c->cls_smem = sizeof(CsClsSmem);
    if (c->cls_smem > (size_t)optin) return snprintf(why, ERR_LEN, "its classifier's %zu bytes of shared memory", c->cls_smem), false;
    CUDA_CHECK(cudaFuncSetAttribute(cs_classifier_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c->cls_smem));
    return true;
}

static GpuCluster *cs_create(GpuCtx *g, const MegaStage *st, int n, MegaAttention at, char *why) {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    // (the mbarrier and bulk-copy wrappers are empty in other machine code: common.cuh)
    if (!sm90a_available()) return snprintf(why, ERR_LEN, "it needs compute capability 9.0 (sm_90a)"), (GpuCluster *)NULL;
    if (n < 7 || n > 2 + kCsMaxHops) return snprintf(why, ERR_LEN, "%d layers (it takes 1 to %d)", (n - 2) / 5, kCsMaxHops / 5), (GpuCluster *)NULL;
    // (the tensor maps in it want their 64-byte alignment, more than calloc's)
    GpuCluster *c = (GpuCluster *)aligned_alloc(alignof(GpuCluster), sizeof(GpuCluster));   // (a size its multiple)
    if (!c) return snprintf(why, ERR_LEN, "out of memory"), (GpuCluster *)NULL;
    memset((void *)c, 0, sizeof(GpuCluster));
    CsHop hops[kCsMaxHops];
    CsParams &p = c->p;
    p.n_hops = n - 2;
    c->smem = offsetof(CsSmem, hops) + (size_t)p.n_hops * sizeof(CsHop);
    c->layers = cs_layers_for(st, at);
    if (c->smem > (size_t)optin) return snprintf(why, ERR_LEN, "its %zu bytes of shared memory", c->smem), cs_free(c), (GpuCluster *)NULL;
    p.cluster = cs_cluster_size(g, c->layers, c->smem);
    if (!p.cluster) return snprintf(why, ERR_LEN, "this GPU places no cluster of 8 or 16 of its blocks"), cs_free(c), (GpuCluster *)NULL;
    if (!cs_hops(g, st, n, at, p.cluster, NULL, hops, &c->pack_bytes, why) || !cs_shape_fits(st, n, at, hops, why))
        return cs_free(c), (GpuCluster *)NULL;
    const LinearCall &cls = st[n - 1].linear, &qkv = st[1].linear;
    size_t cls_at = c->pack_bytes;
    {
        size_t cls_bytes = cls_at;
        cs_hop(cls, CS_RESID, 1, NULL, &cls_bytes, 0, g);
        c->pack_bytes = cls_bytes;
    }
    if (!cs_alloc_pack(c, why)) return cs_free(c), (GpuCluster *)NULL;
    size_t at_bytes = 0;
    cs_hops(g, st, n, at, p.cluster, c->pack, hops, &at_bytes, why);
    const int esize = at.kv_half ? 2 : 4;
    p.dim = qkv.w[0]->cols, p.q_dim = at.n_heads * at.head_size, p.kvd = at.n_kv_heads * at.head_size;
    p.n_heads = at.n_heads, p.n_kv_heads = at.n_kv_heads, p.hs = at.head_size, p.seq = at.seq_len, p.vocab = cls.w[0]->rows;
    p.per = kCsSlotBytes / (at.head_size * esize) < 256 ? kCsSlotBytes / (at.head_size * esize) : 256;
    p.att_scale = 1.0f / sqrtf((float)at.head_size), p.kv_group = at.n_heads / at.n_kv_heads;
    p.per_inv = small_div_inverse(p.per), p.kv_group_inv = small_div_inverse(p.kv_group), p.quads_inv = small_div_inverse(at.head_size / 4);
    p.key_shift = at.kv_half ? cs_key_shift<__half>(at.head_size) : cs_key_shift<float>(at.head_size);
    p.eps = qkv.norm_eps, p.inputs = g->inputs, p.rope_freq = qkv.qkv.rope_freq;
    const Mat *emb = st[0].embedding;
    p.emb_q = emb->q, p.emb_s = emb->s, p.emb_f = emb->q ? NULL : emb->f;
    p.emb_stride = emb->stride, p.emb_groups = emb->groups, p.emb_gs = emb->gs > 0 ? emb->gs : 1;
    p.hs_inv = small_div_inverse(p.hs);
    p.kcache = qkv.qkv.key_cache, p.vcache = qkv.qkv.value_cache, p.out = const_cast<float *>(cls.x);
    const int layers = p.n_hops / 5;
    // a step at position P reads P earlier rows of a head: at most kCsSlots pieces (all in the ring
    // at once) and kCsMaxPos scores
    c->positions = at.seq_len < kCsMaxPos + 1 ? at.seq_len : kCsMaxPos + 1;
    if (c->positions > kCsSlots * p.per + 1) c->positions = kCsSlots * p.per + 1;
    if (!cs_cache_map(&p.kmap, p.kcache, at, layers, p.per, why) || !cs_cache_map(&p.vmap, p.vcache, at, layers, p.per, why) ||
        !cs_classifier(g, c, cls, cls_at, optin, why))
        return cs_free(c), (GpuCluster *)NULL;
    cs_hop_sends(hops, p);
    CUDA_CHECK(cudaMalloc(&c->hops, p.n_hops * sizeof(CsHop)));
    CUDA_CHECK(cudaMemcpyAsync(c->hops, hops, p.n_hops * sizeof(CsHop), cudaMemcpyHostToDevice, g->stream));
    p.hops = c->hops;
    CUDA_CHECK(cudaMalloc(&c->best, kCsBestWords * sizeof(unsigned long long)));
    CUDA_CHECK(cudaMemsetAsync(c->best, 0, kCsBestWords * sizeof(unsigned long long), g->stream));
    p.x_ready = c->c.x_ready = c->best + 2;
    c->c.copy_span_ns = (unsigned long long)p.n_hops * kCsClsSpanPerHop;
    c->c.best = c->best, c->c.inputs = g->inputs, c->c.argmax = g->argmax, c->c.step_tokens = g->step_tokens_dev;
#ifdef CS_TRACE
    const size_t trace_words = cs_boundary_at(p.n_hops, p.cluster) + 2;   // the stamps, ticks, phases, pieces and the boundary
    CUDA_CHECK(cudaMalloc(&p.trace, trace_words * sizeof(unsigned long long)));
    CUDA_CHECK(cudaMemsetAsync(p.trace, 0, trace_words * sizeof(unsigned long long), g->stream));
    c->c.trace = p.trace + p.n_hops + 3, c->c.phases = p.trace + cs_phases_at(p.n_hops, p.cluster);
#endif
    CUDA_CHECK(cudaStreamSynchronize(g->stream));   // the records packed, the hops copied (from the stack), best zeroed
    return c;
}

}  // namespace

extern "C" GpuCluster *gpu_cluster_create(GpuCtx *g, const MegaStage *stages, int n, MegaAttention at, char *why) {
    return cs_create(g, stages, n, at, why);
}

#ifdef CS_TRACE
// ns from stamp a to stamp b (%globaltimer, or clock64), signed: the difference taken in 64 bits
// first (a stamp as a double rounds to 256 ns).
static double cs_ns(unsigned long long a, unsigned long long b) { return (double)(long long)(b - a); }
static void cs_ticks_report(const GpuCluster *c, const CsHop *hops);
// The traced step's first n ring pieces (stamps t, kCsPieceStamps a piece) of each kind, those
// that thread 0 waited for, and the first few of those: which hop, how long their slot had been
// free before the wait, and how long from then to their landing.
static void cs_pieces_by_kind(const unsigned long long *t, int n) {
    constexpr int S = kCsPieceStamps;
    int of_kind[kCsPieceKinds] = {}, waited_kind[kCsPieceKinds] = {}, listed = 0;
    const char *kind_name[kCsPieceKinds] = {"norm weights", "rows", "key/value boxes"};
    fprintf(stderr, "cluster step trace, block 0's waited-for pieces (piece: hop, kind, free before the wait, landed after free, us):");
    for (int i = 0; i < n; i++) {
        const int what = (int)t[S * i + 4], kind = what % 4;
        if (kind >= kCsPieceKinds) continue;
        of_kind[kind]++;
        if (t[S * i + 2] - t[S * i + 1] <= 64) continue;
        waited_kind[kind]++;
        if (listed++ < 24)
            fprintf(stderr, " %d: %d %c %.2f %.2f;", i, what / 4, "nrb"[kind], cs_ns(t[S * i], t[S * i + 1]) / 1e3,
                    cs_ns(t[S * i], t[S * i + 2]) / 1e3);
    }
    fprintf(stderr, "\ncluster step trace, block 0's pieces by kind (waited for / all):");
    for (int k = 0; k < kCsPieceKinds; k++) fprintf(stderr, " %s %d / %d", kind_name[k], waited_kind[k], of_kind[k]);
    fprintf(stderr, "\n");
}
// Block 0's ring pieces in the traced step: of those that thread 0 waited for (over 64 ns), how
// long before the wait the producer had found the slot free and how long the copy took from there
// (the wait's end: it landed then); for all, how far ahead of their use their slots were free, and
// how long the producer took from a slot free to its copy issued.
static void cs_pieces_report(const GpuCluster *c) {
    constexpr int S = kCsPieceStamps;
    static unsigned long long t[S * kCsTracePieces];
    CUDA_CHECK(cudaMemcpy(t, c->p.trace + cs_pieces_at(c->p.n_hops, c->p.cluster), sizeof(t), cudaMemcpyDeviceToHost));
    int n = 0, waited = 0;
    double lead_all = 0, waited_us = 0, lead = 0, flight = 0, flight_min = 1e30, flight_max = 0, issue = 0, issue_max = 0;
    for (int i = 0; i < kCsTracePieces && t[S * i] && t[S * i + 1] && t[S * i + 2] && t[S * i + 3]; i++, n++) {
        // ns from the slot's freeing to the wait's start, its end, the copy's issue
        const double need = cs_ns(t[S * i], t[S * i + 1]), got = cs_ns(t[S * i], t[S * i + 2]), sent = cs_ns(t[S * i], t[S * i + 3]);
        lead_all += need, issue += sent, issue_max = std::max(issue_max, sent);
        if (got - need <= 64) continue;
        waited++, waited_us += (got - need) / 1e3, lead += need;
        flight += got, flight_min = std::min(flight_min, got), flight_max = std::max(flight_max, got);
    }
    if (!n) return;
    fprintf(stderr, "cluster step trace, block 0's ring pieces: %d, slots free a mean of %.2f us before thread 0 waited for them, copies "
            "issued %.2f us after the slot was free (mean; at most %.2f); it waited on %d (%.2f us in all)", n, lead_all / n / 1e3,
            issue / n / 1e3, issue_max / 1e3, waited, waited_us);
    if (waited)
        fprintf(stderr, ", those free %.2f us before the wait (mean) and landed %.2f us after (mean; %.2f to %.2f)",
                lead / waited / 1e3, flight / waited / 1e3, flight_min / 1e3, flight_max / 1e3);
    fprintf(stderr, "\n");
    cs_pieces_by_kind(t, n);
}
// The 101st launch's stamps (cs_stamp), in us: the layers' phases, each kind of hop's mean (from
// its input's arrival to the next hop's), the classifier's.
static void cs_trace_report(GpuCtx *g, const GpuCluster *c) {
    const int n = c->p.n_hops;
    unsigned long long t[4 * kCsMaxHops + 5];
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    CUDA_CHECK(cudaMemcpy(t, c->p.trace, (4 * n + 5) * sizeof(t[0]), cudaMemcpyDeviceToHost));
    double kind_us[4] = {0, 0, 0, 0}, ring_us[4] = {0, 0, 0, 0}, first_us[4] = {0, 0, 0, 0}, work_us[4] = {0, 0, 0, 0};
    int kind_n[4] = {0, 0, 0, 0};
    CsHop hops[kCsMaxHops];
    CUDA_CHECK(cudaMemcpy(hops, c->hops, n * sizeof(CsHop), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) {
        const int k = hops[i].kind;
        kind_us[k] += (t[3 + i] - t[2 + i]) / 1e3, ring_us[k] += t[n + 5 + i] / 1e3, kind_n[k]++;
        if (t[2 * n + 5 + i]) first_us[k] += cs_ns(t[2 + i], t[2 * n + 5 + i]) / 1e3;   // (attention: block 0 has a head)
        work_us[k] += cs_ns(t[2 + i], t[3 * n + 5 + i]) / 1e3;
    }
    fprintf(stderr, "cluster step trace, block 0's own part of each hop (us, QKV / attention / output projection and w2 / w1/w3): "
            "to x's digits (linear) or the softmax (attention) %.2f / %.2f / %.2f / %.2f; to its outputs sent %.2f / %.2f / %.2f / %.2f\n",
            first_us[CS_QKV] / kind_n[CS_QKV], first_us[CS_ATTN] / kind_n[CS_ATTN], first_us[CS_RESID] / kind_n[CS_RESID],
            first_us[CS_SWIGLU] / kind_n[CS_SWIGLU], work_us[CS_QKV] / kind_n[CS_QKV], work_us[CS_ATTN] / kind_n[CS_ATTN],
            work_us[CS_RESID] / kind_n[CS_RESID], work_us[CS_SWIGLU] / kind_n[CS_SWIGLU]);
    fprintf(stderr,
            "cluster step trace (us): embedding %.2f; layers %.2f (%.2f a layer): QKV %.2f, attention %.2f, output projection and w2 "
            "%.2f, w1/w3 %.2f a hop (of them block 0's waits for the ring %.2f, %.2f, %.2f, %.2f); layers' end to the classifier's "
            "wait done %.2f, the classifier to the token fed %.2f\n",
            (t[1] - t[0]) / 1e3, (t[2 + n] - t[1]) / 1e3, (t[2 + n] - t[1]) / 1e3 / (n / 5), kind_us[CS_QKV] / kind_n[CS_QKV],
            kind_us[CS_ATTN] / kind_n[CS_ATTN], kind_us[CS_RESID] / kind_n[CS_RESID], kind_us[CS_SWIGLU] / kind_n[CS_SWIGLU],
            ring_us[CS_QKV] / kind_n[CS_QKV], ring_us[CS_ATTN] / kind_n[CS_ATTN], ring_us[CS_RESID] / kind_n[CS_RESID],
            ring_us[CS_SWIGLU] / kind_n[CS_SWIGLU], cs_ns(t[2 + n], t[n + 3]) / 1e3, cs_ns(t[n + 3], t[n + 4]) / 1e3);
    // where in the step the ring's waits fall (NOTES 135): block 0's, a layer at a time
    fprintf(stderr, "cluster step trace, block 0's waits for the ring by layer, us (the layer's time):");
    for (int first = 0; first < n; first += 5) {
        const int end = first + 5 < n ? first + 5 : n;
        double waited = 0;
        for (int i = first; i < end; i++) waited += t[n + 5 + i] / 1e3;
        fprintf(stderr, " %.2f (%.2f)", waited, (t[2 + end] - t[2 + first]) / 1e3);
    }
    fprintf(stderr, "\n");
    cs_pieces_report(c);
    unsigned long long ph[kCsClsPhases];
    CUDA_CHECK(cudaMemcpy(ph, c->c.phases, sizeof(ph), cudaMemcpyDeviceToHost));
    auto since = [&](unsigned long long a, unsigned long long b) { return cs_ns(a, b) / 1e3; };
    fprintf(stderr,
            "cluster step trace, the classifier's block 0 (us): from its wait done to its x in %.2f, x's digits staged and each "
            "lane's loaded %.2f, warp 0's rows %.2f, the block's rows and argmax %.2f; from there to the token fed (by the last "
            "block out) %.2f\n",
            since(t[n + 3], ph[0]), since(ph[0], ph[1]), since(ph[1], ph[2]), since(ph[2], ph[3]), since(ph[3], t[n + 4]));
    fprintf(stderr, "cluster step trace, the classifier's block 0 (us): entered %.2f before the layers' end, its rows' copies issued %.2f "
            "after it entered, their wait over %.2f after its PDL wait\n", since(ph[4], t[2 + n]), since(ph[4], ph[5]), since(t[n + 3], ph[6]));
    unsigned long long edge[2];   // the step before's token fed, the layers' entry
    CUDA_CHECK(cudaMemcpy(edge, c->p.trace + cs_boundary_at(n, c->p.cluster), sizeof(edge), cudaMemcpyDeviceToHost));
    if (edge[0])
        fprintf(stderr, "cluster step trace, between steps (us): the step before's token fed to the layers' PDL wait done %.2f (their "
                "block 0 entered %.2f before the token), then the embedding %.2f\n", since(edge[0], t[0]), since(edge[1], edge[0]),
                since(t[0], t[1]));
    cs_ticks_report(c, hops);
}
#endif

#ifdef CS_TRACE
// The 101st launch's ticks (kCsTicks), each kind of hop's mean over its hops, in ns (clock64 cycles
// at the rate the stamps' %globaltimer gives): from a warp's input to each of its ticks, for the mean
// warp and for each block's last warp to end the hop; then from a hop's first input to its last
// warp's end anywhere in the cluster, and from that end to the next hop's inputs (the hand-over).
static void cs_ticks_report(const GpuCluster *c, const CsHop *hops) {
    const int n = c->p.n_hops, R = c->p.cluster;
    const int shown[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 14, 15, 16, 17, 18};   // the phases' ticks, CS_TWICE's, the later batches
    const size_t words = (size_t)R * n * kCsWarps * kCsTicks;
    unsigned long long *t = (unsigned long long *)malloc(words * sizeof(unsigned long long));
    if (!t) return;
    CUDA_CHECK(cudaMemcpy(t, c->p.trace + 4 * n + 5, words * sizeof(t[0]), cudaMemcpyDeviceToHost));
    auto at = [&](int r, int i, int w) { return t + ((size_t)(r * n + i) * kCsWarps + w) * kCsTicks; };
    double cyc = 0, ns = 0;
    unsigned long long odd = 0, all = 0;   // %globaltimer stamps not a multiple of 32 ns: its resolution
    for (int r = 0; r < R; r++)
        for (int i = 0; i < n; i++)
            for (int w = 0; w < kCsWarps; w++) {
                const unsigned long long *k = at(r, i, w);
                if (k[0] && k[10]) cyc += (double)(k[10] - k[0]), ns += (double)(k[12] - k[11]);
                odd += (k[11] % 32 != 0) + (k[12] % 32 != 0), all += 2;
            }
    const double ns_a_cycle = cyc > 0 ? ns / cyc : 0;
    fprintf(stderr, "cluster step ticks: %.3f GHz by %%globaltimer; %llu of %llu of its stamps off a 32 ns step\n", 1 / ns_a_cycle, odd, all);
    const char *names[4] = {"QKV", "attention", "output projection and w2", "w1/w3"};
    for (int kind = 0; kind < 4; kind++) {
        double mean[kCsTicks] = {0}, crit[kCsTicks] = {0}, span = 0, gap = 0;
        int mean_n[kCsTicks] = {0}, crit_n[kCsTicks] = {0}, spans = 0, gaps = 0;
        for (int i = 0; i < n; i++) {
            if (hops[i].kind != kind) continue;
            unsigned long long first = ~0ull, last = 0;
            for (int r = 0; r < R; r++) {
                int slow = -1;
                for (int w = 0; w < kCsWarps; w++) {
                    const unsigned long long *k = at(r, i, w);
                    if (!k[0]) continue;
                    for (int j : shown)
                        if (k[j]) mean[j] += (double)(k[j] - k[0]), mean_n[j]++;
                    first = k[11] < first ? k[11] : first, last = k[12] > last ? k[12] : last;
                    if (slow < 0 || k[12] > at(r, i, slow)[12]) slow = w;
                }
                if (slow < 0) continue;
                const unsigned long long *k = at(r, i, slow);
                for (int j : shown)
                    if (k[j]) crit[j] += (double)(k[j] - k[0]), crit_n[j]++;
            }
            if (!last) continue;
            span += (double)(last - first), spans++;
            if (i + 1 < n)
                for (int r = 0; r < R; r++) {
                    unsigned long long next = ~0ull;
                    for (int w = 0; w < kCsWarps; w++)
                        if (at(r, i + 1, w)[11]) next = at(r, i + 1, w)[11] < next ? at(r, i + 1, w)[11] : next;
                    if (next != ~0ull) gap += cs_ns(last, next), gaps++;
                }
        }
        fprintf(stderr, "cluster step ticks, %s: first input to the last warp's end %.0f ns, from there to the next inputs %.0f ns; "
                "from a warp's input to its tick 1..10, 13..18, ns, the mean warp (of those that reach it):", names[kind], spans ? span / spans : 0, gaps ? gap / gaps : 0);
        for (int j : shown) fprintf(stderr, " %.0f", mean_n[j] ? mean[j] / mean_n[j] * ns_a_cycle : -1.0);
        fprintf(stderr, "; each block's last warp:");
        for (int j : shown) fprintf(stderr, " %.0f", crit_n[j] ? crit[j] / crit_n[j] * ns_a_cycle : -1.0);
        fprintf(stderr, "\n");
    }
    free(t);
}
#endif

extern "C" void gpu_cluster_launch(GpuCtx *g, const GpuCluster *c) {
    cudaLaunchAttribute attrs[2];
    attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[0].val.programmaticStreamSerializationAllowed = g->pdl;
    attrs[1].id = cudaLaunchAttributeClusterDimension;
    attrs[1].val.clusterDim.x = c->p.cluster, attrs[1].val.clusterDim.y = 1, attrs[1].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(c->p.cluster), cfg.blockDim = dim3(kCsThreads), cfg.dynamicSmemBytes = c->smem, cfg.stream = g->stream;
    cfg.attrs = attrs, cfg.numAttrs = 2;
    CsParams p = c->p;
    CsClsParams cls = c->c;
    p.launch = cls.launch = ++const_cast<GpuCluster *>(c)->launches;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, c->layers, p));
    launch(g, "cs_classifier_kernel", cs_classifier_kernel, dim3(c->cls_blocks), dim3(kCsClsThreads), c->cls_smem, cls);
#ifdef CS_TRACE
    if (c->launches == 101) cs_trace_report(g, c);   // (never captured: it may wait for the stream)
#endif
}

extern "C" int gpu_cluster_positions(const GpuCluster *c) { return c->positions; }

extern "C" int gpu_cluster_group_multiple(void) { return kCsGroupMultiple; }

extern "C" void gpu_cluster_describe(const GpuCluster *c, char *buf, size_t n) {
    snprintf(buf, n, "layers on a cluster of %d blocks (%zu KB shared memory each), the classifier on %d, positions up to %d, a %.2f GB copy",
             c->p.cluster, c->smem / 1024, c->cls_blocks, c->positions - 1, c->pack_bytes / 1e9);
}

extern "C" void gpu_cluster_free(GpuCluster *c) { cs_free(c); }
