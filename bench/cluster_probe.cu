// bench/cluster_probe.cu: how fast a small model's whole decode step could go with its layers on
// one thread-block cluster of 16 SMs, the activations handed over in distributed shared memory,
// and its classifier on the other SMs (bench/NOTES.md 111).
// The megakernel's stages cost a block 3-4 us of its own chain on the small shapes, wherever the
// hand-over goes (NOTES 67, 69, 109); this is another structure, written to be short:
// - layers_kernel, one cluster of 16 blocks: every block keeps the whole activation vector a hop
//   reads in its own shared memory; a hop's writers store each output into all 16 blocks' copies
//   (st.shared::cluster) and then arrive on each block's mbarrier (release at cluster scope); a
//   hop starts with one wait on the block's own barrier, and no L2 access is on the chain;
// - a block's weights, norm weights and the attention's earlier key and value rows (none of which
//   depend on the step's activations) stream in the hops' order through a ring of 16 KB slots by
//   bulk copies from one producer warp, which never waits for an activation;
// - x is split into three int8 digits a group of 128 once a hop by each block (x to within about
//   1e-7 of its group's largest element, as the megakernel's MkX), a lane keeps its columns'
//   digits in registers, a row costs 12 dp4a a 16 columns, and a warp sums 8 rows at once (9
//   shuffles for the 8);
// - RMSNorm, RoPE, the KV store, SwiGLU and the residual adds are in the hops' epilogues;
// - classifier_kernel, on the other SMs, launched as the layers' programmatic dependent: its
//   blocks copy their rows of the classifier into shared memory while the layers run, wait for
//   them (griddepcontrol.wait), and take the logits and the greedy argmax (one 64-bit atomicMax a
//   block); the next step's layers_kernel is its dependent in turn, streams its first weights
//   while the classifier runs and reads the token and its embedding row once it has finished.
// A layer is five hops: QKV, the attention (a block a head, its earlier rows from the ring), the
// output projection, w1/w3, w2. Every position is the same one (the step's key and value rows
// are written over at each step). The first steps are checked against a reference of the same
// arithmetic on the host (logits, relative L2, and the greedy token); then 200 steps are timed
// (events, the launches included) and the last step's hops by block 0's %globaltimer.
// make bench/cluster_probe && ./bench/cluster_probe [position]
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <vector>
#include <algorithm>

#include "../kernels.cu"   // the cluster step's pieces (cuda/cluster_step.cuh), the PTX wrappers: one translation unit
#include "probe.h"         // CK

namespace {

// The probe's kernels do the engine's cluster step's arithmetic with its own pieces (x's digits,
// a warp's 8 rows and their hand-over, the classifier's block); they differ in where the hops
// come from (constant memory), the caches tried head-major too, waits that trap, and the timing.
constexpr long long kHang = 4000000000ll;   // cycles a wait may take before the probe gives up

enum { HOP_QKV, HOP_ATTN, HOP_RESID, HOP_SWIGLU };
// A hop: a linear layer's rows (each a record of the row's int8 weights padded to 16 bytes, then
// its FP32 scales, padded to 16 bytes) split over the blocks, or the attention (a block a head).
struct Hop {
    int kind, K, rows, rec, rows_per_block, rows_per_piece, norm, layer;
    const unsigned char *w;     // the rows' records
    const float *gamma;         // the norm's weights, or null
    int first[kCsMaxCluster], count[kCsMaxCluster];   // each block's pieces of the hop, in the ring's order
};
__constant__ Hop c_hops[kCsMaxHops];
__constant__ float c_inv_freq[64];   // RoPE's 10000^(-2i / hs), the host's floats (the reference takes the same)

struct Params {
    int n_hops, step, cluster;   // cluster: the blocks of the cluster (at most kCsMaxCluster)
    int dim, kvd, heads, kv_heads, hs, pos, seq, vocab;
    const float *embedding;            // (vocab, dim)
    unsigned long long *best;          // [2]: step s's classifier's argmax key in best[s & 1]
    float *out;                        // the last residual stream (dim), the classifier's x
    int engine_layout;                 // the caches (layers, seq, kv_dim) as the engine's, else (layers, kv heads, seq, hs)
    __half *kcache, *vcache;
    CUtensorMap kmap, vmap;            // engine_layout: the caches as 2-D tensors (layers x seq rows of kv_dim), a box a slot of a head's rows
    unsigned long long *stamps;        // block 0's %globaltimer: the first hop's start, each hop's, the end
    long long *cycles, *waits;         // block 0's clock64 at the same points; thread 0's cycles in the ring's waits a hop
};

// layers_kernel's shared memory: the ring, the residual stream, two x buffers (a hop reads one
// and writes the other, or the residual), x's digits, and scratch.
struct Smem {
    unsigned char ring[kCsSlots][kCsSlotBytes];
    float res[kCsMaxDim];
    float xb[2][kCsMaxX];
    uint32_t digits[3][kCsMaxX / 4];
    float u[kCsMaxX / kCsGroup], ss[kCsMaxX / kCsGroup];
    float scores[kCsMaxPos + 1];
    float part[4 * 128];
    float red[2][kCsWarps];
    long long waited;   // thread 0's cycles in the ring's waits this hop
    unsigned long long full[kCsSlots], empty[kCsSlots], xbar[2];
};

// A wait that gives up (the kernel traps, the probe reports the launch's error) instead of hanging.
__device__ __noinline__ void hung(int where) {
    printf("cluster_probe: block %d thread %d waited too long at %d\n", blockIdx.x, threadIdx.x, where);
    __trap();
}
__device__ __forceinline__ void bar_wait(uint32_t a, int parity, int where) {
    const long long t0 = clock64();
    while (!cs_try(a, parity))
        if (clock64() - t0 > kHang) hung(where);
}
__device__ __forceinline__ void bar_wait_cluster(uint32_t a, int parity) {
    const long long t0 = clock64();
    while (!cs_try_cluster(a, parity))
        if (clock64() - t0 > kHang) hung(-1);
}
__device__ __forceinline__ unsigned long long now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The ring as the consumers walk it: piece i in slot i % kCsSlots, phase i / kCsSlots.
struct Ring {
    Smem *s;
    int base;   // the block's first piece of the hop
    __device__ unsigned char *at(int i) const { return s->ring[(base + i) % kCsSlots]; }   // (after a wait for it)
    __device__ unsigned char *wait(int i) const {
        const int n = base + i;
        const long long t0 = clock64();
        bar_wait(cs_saddr(&s->full[n % kCsSlots]), (n / kCsSlots) & 1, n);
        if (threadIdx.x == 0) s->waited += clock64() - t0;   // (read by block 0's stamps)
        return at(i);
    }
    __device__ void release(int i) const {   // by one lane a warp
        mbar_arrive(cs_saddr(&s->empty[(base + i) % kCsSlots]));
    }
};

// The block's pieces in the hops' order, from the hops' records (constant memory: no load of a
// piece's address on the producer's path): a linear hop's norm weights, then its rows a slot at a
// time; the attention's key rows, then value rows, of each of its heads.
__device__ void produce(const Params &p, Smem *s, int rank) {
    if (threadIdx.x % 32) return;
    int n = 0;
    auto slot_for = [&](int bytes) {   // the next slot, free, armed for bytes
        const int slot = n % kCsSlots, round = n / kCsSlots;
        if (round > 0) bar_wait(cs_saddr(&s->empty[slot]), (round - 1) & 1, 100000 + n);
        mbar_arrive_expect(cs_saddr(&s->full[slot]), bytes);
        n++;
        return slot;
    };
    auto put = [&](const void *src, int bytes) {
        const int slot = slot_for(bytes);
        bulk_copy_counted(cs_saddr(s->ring[slot]), src, bytes, cs_saddr(&s->full[slot]));
    };
    const int per = kCsSlotBytes / (2 * p.hs), kp = (p.pos + per - 1) / per;
    const size_t layer_cache = (size_t)p.kv_heads * p.seq * p.hs;
    for (int i = 0; i < p.n_hops; i++) {
        const Hop &h = c_hops[i];
        if (h.kind == HOP_ATTN) {
            for (int head = rank; head < p.heads; head += p.cluster) {
                const int kvh = head / (p.heads / p.kv_heads);
                for (int c = 0; c < 2; c++) {
                    const __half *cache = (c ? p.vcache : p.kcache) + h.layer * layer_cache + (size_t)kvh * p.seq * p.hs;
                    for (int j = 0; j < kp; j++) {
                        if (!p.engine_layout) {
                            put(cache + (size_t)j * per * p.hs, min(per, p.pos - j * per) * 2 * p.hs);
                            continue;
                        }
                        // a whole box: its rows past the step's position (the next positions, the next
                        // layer's, or zeros past the tensor) land too, and are not read
                        const int slot = slot_for(per * 2 * p.hs);
                        cs_copy_box(cs_saddr(s->ring[slot]), c ? &p.vmap : &p.kmap, kvh * p.hs, h.layer * p.seq + j * per,
                                    cs_saddr(&s->full[slot]));
                    }
                }
            }
        } else {
            if (h.norm) put(h.gamma, 4 * h.K);
            const int row0 = rank * h.rows_per_block, mine = max(0, min(h.rows_per_block, h.rows - row0));
            for (int r = 0; r < mine; r += h.rows_per_piece) put(h.w + (size_t)(row0 + r) * h.rec, min(h.rows_per_piece, mine - r) * h.rec);
        }
    }
}

// A linear hop's rows of this block. Output o of the hop goes to every block's dst[o] (dst: the
// next x buffer, or the residual stream), each block's copy written by lane `rank` of a warp.
__device__ void linear_hop(const Params &p, Smem *s, const Hop &h, int rank, const float *x, float *dst, int layer) {
    const int lane = threadIdx.x % 32;
    const Ring ring = {s, h.first[rank]};
    int piece = 0;
    const float *gamma = nullptr;
    if (h.norm) gamma = reinterpret_cast<const float *>(ring.wait(piece++));
    const float inv_rms = cs_stage_digits<false>(s->digits, s->u, s->ss, x, h.K, gamma, 1e-5f);
    if (h.norm && lane == 0) ring.release(0);
    CsLaneX lx;
    lx.load(s->digits, s->u, h.K, kCsGroup / 16);
    const int row0 = rank * h.rows_per_block, mine = max(0, min(h.rows_per_block, h.rows - row0));
    const uint32_t dst_at = cs_saddr(dst);
    for (int r0 = 0; r0 < mine; r0 += h.rows_per_piece, piece++) {
        const unsigned char *bytes = ring.wait(piece);
        const int in_piece = min(h.rows_per_piece, mine - r0);
        for (int b = cs_first_batch(r0); b < in_piece; b += 8 * kCsWarps) {   // 8 rows a warp at once
            float acc[8];
            cs_rows8(bytes + (size_t)b * h.rec, h.rec, in_piece - b, h.K, lx, acc);
            const float v = cs_sum8(acc) * inv_rms;
            const int r = lane / 4, row = row0 + r0 + b + r;   // the row this lane's v is
            const bool valid = b + r < in_piece;
            const float other = __shfl_xor_sync(~0u, v, 4);     // the pair's other row (rows 8-aligned)
            float out = v;
            if (h.kind == HOP_SWIGLU) {
                out = (r & 1) ? 0.0f : v / (1.0f + __expf(-v)) * other;
            } else if (h.kind == HOP_RESID) {
                out = valid ? s->res[row] + v : 0.0f;
            } else if (h.kind == HOP_QKV && row < p.dim + p.kvd) {   // RoPE on q and k
                const int j = (row < p.dim ? row : row - p.dim) % p.hs, i = j & ~1;
                float sn, cs;
                sincosf(p.pos * c_inv_freq[i / 2], &sn, &cs);
                out = (r & 1) ? other * sn + v * cs : v * cs - other * sn;
            }
            if (h.kind == HOP_QKV && valid && row >= p.dim && lane % 4 == 0) {   // the KV store
                const int e = row - p.dim, is_v = e >= p.kvd, c = is_v ? e - p.kvd : e;
                __half *cache = is_v ? p.vcache : p.kcache;
                const size_t at = p.engine_layout ? ((size_t)layer * p.seq + p.pos) * p.kvd + c
                                                  : (((size_t)layer * p.kv_heads + c / p.hs) * p.seq + p.pos) * p.hs + c % p.hs;
                cache[at] = __float2half(out);
            }
            cs_share_rows8(dst_at, out, row0 + r0 + b, in_piece - b, p.cluster, h.kind == HOP_SWIGLU);
        }
        __syncwarp();
        if (lane == 0) ring.release(piece);
    }
}

// The attention of the block's heads: q, k and v of the step in x (q, then k, then v), the
// earlier rows of the head's kv head from the ring (its key rows' pieces, then its value rows').
__device__ void attention_hop(const Params &p, Smem *s, const Hop &h, int rank, const float *x, float *dst) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, per = kCsSlotBytes / (2 * p.hs), P = p.pos;
    const int kp = (P + per - 1) / per;
    const Ring ring = {s, h.first[rank]};
    const uint32_t dst_at = cs_saddr(dst);
    const float scale = rsqrtf((float)p.hs);
    for (int head = rank, nth = 0; head < p.heads; head += p.cluster, nth++) {
        const int kvh = head / (p.heads / p.kv_heads), base = 2 * kp * nth;
        const float *q = x + head * p.hs;
        // scores: a thread a position (the step's own from x); every key piece waited for first, so
        // that no wait sits in the loop
        for (int i = 0; i < kp; i++) ring.wait(base + i);
        float m = -INFINITY;
        for (int t = threadIdx.x; t <= P; t += kCsConsumers) {
            float sc = 0.0f;
            if (t < P) {
                const int row = t % per;
                sc = cs_dot_key(q, reinterpret_cast<const __half *>(ring.at(base + t / per)) + (size_t)row * p.hs, p.hs, row);
            } else {
                const float *k = x + p.dim + kvh * p.hs;
                for (int i = 0; i < p.hs; i++) sc += q[i] * k[i];
            }
            sc *= scale;
            s->scores[t] = sc;
            m = fmaxf(m, sc);
        }
        m = warp_max(m);
        if (lane == 0) s->red[0][warp] = m;
        cs_consumers_sync();
        m = s->red[0][0];
        for (int w = 1; w < kCsWarps; w++) m = fmaxf(m, s->red[0][w]);
        if (lane == 0)
            for (int i = 0; i < kp; i++) ring.release(base + i);
        float sum = 0.0f;
        for (int t = threadIdx.x; t <= P; t += kCsConsumers) {
            const float e = __expf(s->scores[t] - m);
            s->scores[t] = e;
            sum += e;
        }
        sum = warp_sum(sum);
        if (lane == 0) s->red[1][warp] = sum;
        cs_consumers_sync();
        sum = 0.0f;
        for (int w = 0; w < kCsWarps; w++) sum += s->red[1][w];
        // the weighted sum of the value rows: a thread a dimension and a quarter of the positions
        for (int i = 0; i < kp; i++) ring.wait(base + kp + i);
        for (int e = threadIdx.x; e < 4 * p.hs; e += kCsConsumers) {
            const int d = e % p.hs, part = e / p.hs;
            float a = 0.0f;
            for (int t = part; t < P; t += 4) {
                const __half *v = reinterpret_cast<const __half *>(ring.at(base + kp + t / per) + (size_t)(t % per) * 2 * p.hs);
                a += s->scores[t] * __half2float(v[d]);
            }
            if (part == 0) a += s->scores[P] * x[p.dim + p.kvd + kvh * p.hs + d];
            s->part[e] = a;
        }
        cs_consumers_sync();
        if (lane == 0)
            for (int i = 0; i < kp; i++) ring.release(base + kp + i);
        for (int d = warp; d < p.hs; d += kCsWarps) {
            const float o = (s->part[d] + s->part[p.hs + d] + s->part[2 * p.hs + d] + s->part[3 * p.hs + d]) / sum;
            if (lane < p.cluster) cs_store_remote(cs_remote(dst_at + 4 * (head * p.hs + d), lane), o);
        }
        cs_consumers_sync();   // part and scores free for the next head
    }
}

// The step's token (the step before's classifier's argmax) and its embedding row into the
// residual stream; the argmax key this step's classifier takes set to its least.
__device__ void embed(const Params &p, Smem *s) {
    const unsigned long long key = __ldcg(p.best + ((p.step + 1) & 1));
    const int token = min(max(cs_token_of(key), 0), p.vocab - 1);   // (a wrong key reads a wrong row, not past the table)
    const float *row = p.embedding + (size_t)token * p.dim;
    for (int i = threadIdx.x; i < p.dim; i += kCsConsumers) s->res[i] = __ldcg(row + i);
    if (threadIdx.x == 0 && cs_rank() == 0) p.best[p.step & 1] = 0ull;
    cs_consumers_sync();
}

__global__ void __launch_bounds__(kCsThreads, 1) layers_kernel(const __grid_constant__ Params p) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    Smem *s = reinterpret_cast<Smem *>(smem_raw);
    const int rank = cs_rank();
    pdl_release();   // the classifier's blocks may start copying their rows
    if (threadIdx.x == 0) {
        for (int i = 0; i < kCsSlots; i++) mbar_init(cs_saddr(&s->full[i]), 1), mbar_init(cs_saddr(&s->empty[i]), kCsWarps);
        for (int i = 0; i < 2; i++) mbar_init(cs_saddr(&s->xbar[i]), p.cluster * kCsWarps);
        mbar_init_fence();
    }
    cs_cluster_sync();   // every block's barriers initialised before any arrives on them
    if (threadIdx.x >= kCsConsumers) {
        produce(p, s, rank);   // weights only: no wait for the kernel before
    } else {
        pdl_wait();   // the step before's classifier: the token
        embed(p, s);
        const int lane = threadIdx.x % 32;
        unsigned phases = 0;   // bit j: the parity xbar[j] waits for next
        const bool stamp = rank == 0 && threadIdx.x == 0;
        if (stamp) p.stamps[0] = now(), p.cycles[0] = clock64();
        for (int i = 0, layer = 0; i < p.n_hops; i++) {
            const Hop &h = c_hops[i];
            if (i > 0) {
                bar_wait_cluster(cs_saddr(&s->xbar[i & 1]), (phases >> (i & 1)) & 1);
                phases ^= 1u << (i & 1);
            }
            if (stamp) p.stamps[1 + i] = now(), p.cycles[1 + i] = clock64(), s->waited = 0;
            const float *x = h.kind == HOP_QKV || h.kind == HOP_SWIGLU ? s->res : s->xb[i & 1];
            float *dst = h.kind == HOP_RESID ? s->res : s->xb[(i + 1) & 1];
            if (h.kind == HOP_ATTN) attention_hop(p, s, h, rank, x, dst);
            else linear_hop(p, s, h, rank, x, dst, layer);
            layer += h.kind == HOP_SWIGLU;
            if (stamp) p.waits[i] = s->waited;
            __syncwarp();
            if (lane < p.cluster) cs_arrive_remote(cs_remote(cs_saddr(&s->xbar[(i + 1) & 1]), lane));
        }
        bar_wait_cluster(cs_saddr(&s->xbar[p.n_hops & 1]), (phases >> (p.n_hops & 1)) & 1);
        if (stamp) p.stamps[1 + p.n_hops] = now(), p.cycles[1 + p.n_hops] = clock64();
        if (rank == 0)
            for (int i = threadIdx.x; i < p.dim; i += kCsConsumers) p.out[i] = s->res[i];
    }
    __syncwarp();
    cs_cluster_sync();   // no block leaves while another may still write its shared memory
}

// The classifier on the SMs the layers leave (the engine's block, cs_block_logits): the block's
// argmax into step's key.
__global__ void __launch_bounds__(kCsConsumers, 1) classifier_kernel(const CsClsParams c, int step) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const unsigned long long best = cs_block_logits(c, reinterpret_cast<CsClsSmem *>(smem_raw));
    if (threadIdx.x == 0) atomicMax(c.best + (step & 1), best);
}

// ---------------------------------------------------------------------------------------------
// Host: the model's shapes, random weights, the reference, the timing.

struct Shape {
    const char *name;
    int dim, hidden, layers, heads, kv_heads, vocab;
};

struct HostMat {   // rows x K int8 with a scale a group of 128, and its device records
    int rows, K, G, rec;
    std::vector<int8_t> w;
    std::vector<float> scale;
    unsigned char *dev = nullptr;
};

static uint32_t rng = 12345u;
static float frand() {   // uniform in [-1, 1)
    rng = rng * 1664525u + 1013904223u;
    return (rng >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

static std::vector<void *> owned;   // device buffers, freed at the end
template <typename T>
static int dev_copy(T **d, const T *h, size_t n) {
    CK(cudaMalloc(d, n * sizeof(T)));
    owned.push_back(*d);
    if (h) CK(cudaMemcpy(*d, h, n * sizeof(T), cudaMemcpyHostToDevice));
    return 0;
}

static int make_mat(HostMat &m, int rows, int K, float gain) {
    m.rows = rows, m.K = K, m.G = (K + kCsGroup - 1) / kCsGroup;
    m.rec = ((K + 15) & ~15) + ((4 * m.G + 15) & ~15);
    m.w.resize((size_t)rows * K), m.scale.resize((size_t)rows * m.G);
    for (auto &v : m.w) v = (int8_t)lrintf(127.0f * frand());
    for (auto &v : m.scale) v = gain / (127.0f * sqrtf((float)K)) * (1.0f + 0.25f * frand());
    std::vector<unsigned char> recs((size_t)rows * m.rec, 0);
    for (int r = 0; r < rows; r++) {
        memcpy(&recs[(size_t)r * m.rec], &m.w[(size_t)r * K], K);
        memcpy(&recs[(size_t)r * m.rec + ((K + 15) & ~15)], &m.scale[(size_t)r * m.G], 4 * m.G);
    }
    return dev_copy(&m.dev, recs.data(), recs.size());
}
static void ref_matvec(const HostMat &m, const std::vector<float> &x, std::vector<float> &y) {
    y.assign(m.rows, 0.0f);
    for (int r = 0; r < m.rows; r++) {
        double a = 0.0;
        for (int k = 0; k < m.K; k++) a += (double)m.w[(size_t)r * m.K + k] * m.scale[(size_t)r * m.G + k / kCsGroup] * x[k];
        y[r] = (float)a;
    }
}
static void rms(const std::vector<float> &x, const std::vector<float> &g, std::vector<float> &y) {
    double ss = 0.0;
    for (float v : x) ss += (double)v * v;
    const float inv = 1.0f / sqrtf((float)(ss / x.size()) + 1e-5f);
    y.resize(x.size());
    for (size_t i = 0; i < x.size(); i++) y[i] = x[i] * inv * g[i];
}
static std::vector<float> random_vec(size_t n, float base, float spread) {
    std::vector<float> v(n);
    for (auto &e : v) e = base + spread * frand();
    return v;
}

struct Layer {
    HostMat qkv, wo, w13, w2;   // w13: rows 2i (w1) and 2i + 1 (w3) interleaved
    std::vector<float> g_att, g_ffn;
    float *d_g_att = nullptr, *d_g_ffn = nullptr;
};
struct Model {
    Shape sh;
    int hs, kvd, pos, seq;
    std::vector<Layer> layers;
    HostMat cls;
    std::vector<float> g_final, embedding;
    std::vector<__half> kc, vc;   // (layers, kv heads, seq, hs)
    size_t layer_cache;
};

static int make_model(Model &m, const Shape &sh, int pos) {
    m.sh = sh, m.hs = sh.dim / sh.heads, m.kvd = m.hs * sh.kv_heads, m.pos = pos, m.seq = pos + 1;
    m.layers.resize(sh.layers);
    for (auto &l : m.layers) {
        if (make_mat(l.qkv, sh.dim + 2 * m.kvd, sh.dim, 1.0f) || make_mat(l.wo, sh.dim, sh.dim, 0.5f) ||
            make_mat(l.w13, 2 * sh.hidden, sh.dim, 1.0f) || make_mat(l.w2, sh.dim, sh.hidden, 0.5f))
            return 1;
        l.g_att = random_vec(sh.dim, 1.0f, 0.2f), l.g_ffn = random_vec(sh.dim, 1.0f, 0.2f);
        if (dev_copy(&l.d_g_att, l.g_att.data(), sh.dim) || dev_copy(&l.d_g_ffn, l.g_ffn.data(), sh.dim)) return 1;
    }
    if (make_mat(m.cls, sh.vocab, sh.dim, 4.0f)) return 1;
    m.g_final = random_vec(sh.dim, 1.0f, 0.2f), m.embedding = random_vec((size_t)sh.vocab * sh.dim, 0.0f, 1.0f);
    m.layer_cache = (size_t)sh.kv_heads * m.seq * m.hs;
    m.kc.resize(sh.layers * m.layer_cache), m.vc.resize(sh.layers * m.layer_cache);
    for (size_t i = 0; i < m.kc.size(); i++) m.kc[i] = __float2half(frand()), m.vc[i] = __float2half(frand());
    return 0;
}

static float inv_freq(int i, int hs) { return powf(10000.0f, -(float)(2 * i) / hs); }

// The reference step: token in, logits out (positions before pos from the caches, pos's own rows
// from the step).
static void ref_step(const Model &m, int token, std::vector<float> &logits) {
    const Shape &sh = m.sh;
    const int dim = sh.dim, hs = m.hs, kvd = m.kvd, pos = m.pos;
    std::vector<float> x(m.embedding.begin() + (size_t)token * dim, m.embedding.begin() + (size_t)(token + 1) * dim);
    std::vector<float> xn, y, att(dim), hb(sh.hidden);
    for (int l = 0; l < sh.layers; l++) {
        const Layer &ly = m.layers[l];
        rms(x, ly.g_att, xn);
        ref_matvec(ly.qkv, xn, y);
        for (int i = 0; i < dim + kvd; i += 2) {
            const int j = (i < dim ? i : i - dim) % hs;
            const float f = pos * inv_freq(j / 2, hs), c = cosf(f), sn = sinf(f), a = y[i], b = y[i + 1];
            y[i] = a * c - b * sn, y[i + 1] = a * sn + b * c;
        }
        for (int h = 0; h < sh.heads; h++) {
            const int kvh = h / (sh.heads / sh.kv_heads);
            const __half *kh = &m.kc[l * m.layer_cache + (size_t)kvh * m.seq * hs], *vh = &m.vc[l * m.layer_cache + (size_t)kvh * m.seq * hs];
            std::vector<double> sc(pos + 1);
            double mx = -1e30;
            for (int t = 0; t <= pos; t++) {
                double a = 0.0;
                for (int i = 0; i < hs; i++) a += (double)y[h * hs + i] * (t < pos ? __half2float(kh[(size_t)t * hs + i]) : y[dim + kvh * hs + i]);
                sc[t] = a / sqrt((double)hs), mx = std::max(mx, sc[t]);
            }
            double sum = 0.0;
            for (auto &v : sc) v = exp(v - mx), sum += v;
            for (int i = 0; i < hs; i++) {
                double a = 0.0;
                for (int t = 0; t <= pos; t++) a += sc[t] * (t < pos ? __half2float(vh[(size_t)t * hs + i]) : y[dim + kvd + kvh * hs + i]);
                att[h * hs + i] = (float)(a / sum);
            }
        }
        ref_matvec(ly.wo, att, y);
        for (int i = 0; i < dim; i++) x[i] += y[i];
        rms(x, ly.g_ffn, xn);
        ref_matvec(ly.w13, xn, y);
        for (int i = 0; i < sh.hidden; i++) hb[i] = y[2 * i] / (1.0f + expf(-y[2 * i])) * y[2 * i + 1];
        ref_matvec(ly.w2, hb, y);
        for (int i = 0; i < dim; i++) x[i] += y[i];
    }
    rms(x, m.g_final, xn);
    ref_matvec(m.cls, xn, logits);
}

// The hops and, per block, its pieces in the ring's order (as produce() walks them).
static int make_hops(const Model &m, int C, std::vector<Hop> &hops, size_t *bytes) {
    const Shape &sh = m.sh;
    std::vector<int> n(C, 0);
    auto add_linear = [&](int kind, const HostMat &w, const float *gamma, int layer) {
        Hop h = {};
        h.kind = kind, h.K = w.K, h.rows = w.rows, h.rec = w.rec, h.norm = gamma != nullptr, h.layer = layer, h.w = w.dev, h.gamma = gamma;
        h.rows_per_block = ((w.rows + C - 1) / C + 7) & ~7;
        h.rows_per_piece = kCsSlotBytes / w.rec & ~7;
        for (int b = 0; b < C; b++) {
            const int mine = std::max(0, std::min(h.rows_per_block, w.rows - b * h.rows_per_block));
            h.first[b] = n[b], h.count[b] = (gamma ? 1 : 0) + (mine + h.rows_per_piece - 1) / h.rows_per_piece, n[b] += h.count[b];
        }
        *bytes += (size_t)w.rows * w.rec;
        hops.push_back(h);
    };
    const int per = kCsSlotBytes / (2 * m.hs), kp = (m.pos + per - 1) / per;
    for (int l = 0; l < sh.layers; l++) {
        const Layer &ly = m.layers[l];
        add_linear(HOP_QKV, ly.qkv, ly.d_g_att, l);
        Hop a = {};
        a.kind = HOP_ATTN, a.layer = l;
        for (int b = 0; b < C; b++) {
            const int heads = b < sh.heads ? (sh.heads - b + C - 1) / C : 0;
            a.first[b] = n[b], a.count[b] = 2 * kp * heads, n[b] += a.count[b];
        }
        hops.push_back(a);
        add_linear(HOP_RESID, ly.wo, nullptr, l);
        add_linear(HOP_SWIGLU, ly.w13, ly.d_g_ffn, l);
        add_linear(HOP_RESID, ly.w2, nullptr, l);
    }
    if ((int)hops.size() > kCsMaxHops || sh.dim > kCsMaxDim || sh.hidden > kCsMaxX || sh.dim + 2 * m.kvd > kCsMaxX || m.pos > kCsMaxPos ||
        m.pos < 1 || sh.dim % 4 || sh.dim % sh.heads || m.hs % 8 || m.hs > 128 || sh.heads % sh.kv_heads || kCsSlotBytes / (2 * m.hs) * 2 * m.hs % 16 ||
        kp > kCsSlots || C > kCsMaxCluster ||
        std::any_of(hops.begin(), hops.end(), [](const Hop &h) { return h.kind != HOP_ATTN && h.rows_per_piece < 8; })) {
        fprintf(stderr, "%s: the shape does not fit the probe\n", sh.name);
        return 1;
    }
    return 0;
}

// The model's buffers on the device (its matrices' records are in HostMat::dev).
struct DevModel {
    __half *kc, *vc, *kc_engine, *vc_engine;   // head-major, and the engine's (layers, seq, kv_dim)
    float *emb, *out, *logits, *g_final;
    unsigned long long *best;
};

// The caches as 2-D tensors (layers x seq rows of kv_dim halves) for boxes of per rows of a head.
static int cache_map(CUtensorMap *map, __half *cache, const Model &m) {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (!fn || found != cudaDriverEntryPointSuccess) {
        fprintf(stderr, "cuTensorMapEncodeTiled: not found in the driver\n");
        return 1;
    }
    const cuuint64_t dims[2] = {(cuuint64_t)m.kvd, (cuuint64_t)m.sh.layers * m.seq}, strides[1] = {(cuuint64_t)m.kvd * 2};
    const cuuint32_t box[2] = {(cuuint32_t)m.hs, (cuuint32_t)(kCsSlotBytes / (2 * m.hs))}, steps[2] = {1, 1};
    if (box[1] > 256) {   // (a box is at most 256 rows)
        fprintf(stderr, "%s: a slot holds %u rows of a head, more than a box's 256\n", m.sh.name, box[1]);
        return 1;
    }
    const CUresult r = ((PFN_cuTensorMapEncodeTiled_v12000)fn)(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, cache, dims, strides, box, steps,
                                                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                                               CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled: error %d\n", (int)r);
        return 1;
    }
    return 0;
}

// The step with its layers on a cluster of C blocks, the caches in the engine's layout or
// head-major: checked, then timed.
static int run_config(const Model &m, const DevModel &d, int C, int engine_layout) {
    const Shape &sh = m.sh;
    const int dim = sh.dim, pos = m.pos;
    std::vector<Hop> hops;
    size_t bytes = (size_t)sh.vocab * m.cls.rec;
    unsigned long long *d_stamps;
    long long *d_cycles, *d_waits;
    if (make_hops(m, C, hops, &bytes)) return 1;
    if (dev_copy(&d_stamps, (const unsigned long long *)nullptr, hops.size() + 2) ||
        dev_copy(&d_cycles, (const long long *)nullptr, hops.size() + 2) || dev_copy(&d_waits, (const long long *)nullptr, hops.size()))
        return 1;
    std::vector<float> freqs(m.hs / 2);
    for (int i = 0; i < m.hs / 2; i++) freqs[i] = inv_freq(i, m.hs);
    CK(cudaMemcpyToSymbol(c_inv_freq, freqs.data(), freqs.size() * sizeof(float)));
    const char *layout = engine_layout ? "caches (seq, kv_dim)" : "caches head-major";
    __half *d_kc = engine_layout ? d.kc_engine : d.kc, *d_vc = engine_layout ? d.vc_engine : d.vc;
    CK(cudaMemcpyToSymbol(c_hops, hops.data(), hops.size() * sizeof(Hop)));

    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int cls_blocks = sms - C;
    if (cls_blocks < 1) {
        fprintf(stderr, "%s: %d SMs leave none for the classifier\n", sh.name, sms);
        return 1;
    }
    Params p = {(int)hops.size(), 0, C, dim, m.kvd, sh.heads, sh.kv_heads, m.hs, pos, m.seq, sh.vocab, d.emb, d.best, d.out,
                engine_layout, d_kc, d_vc, {}, {}, d_stamps, d_cycles, d_waits};
    if (engine_layout && (cache_map(&p.kmap, d_kc, m) || cache_map(&p.vmap, d_vc, m))) return 1;
    CsClsParams c = {};   // (no feed: the probe's steps take their token from the key, embed)
    c.dim = dim, c.vocab = sh.vocab, c.rec = m.cls.rec, c.rows_per_block = (sh.vocab + cls_blocks - 1) / cls_blocks;
    c.group_chunks = kCsGroup / 16, c.eps = 1e-5f, c.w = m.cls.dev, c.gamma = d.g_final, c.x = d.out, c.logits = d.logits, c.best = d.best;
    const size_t smem = sizeof(Smem), cls_smem = sizeof(CsClsSmem);
    CK(cudaFuncSetAttribute(layers_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CK(cudaFuncSetAttribute(layers_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CK(cudaFuncSetAttribute(classifier_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cls_smem));
    cudaLaunchAttribute pdl;
    pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    pdl.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t lcfg = {}, ccfg = {};
    cudaLaunchAttribute lattrs[2];
    lattrs[0] = pdl;
    lattrs[1].id = cudaLaunchAttributeClusterDimension;
    lattrs[1].val.clusterDim.x = C, lattrs[1].val.clusterDim.y = 1, lattrs[1].val.clusterDim.z = 1;
    lcfg.gridDim = dim3(C), lcfg.blockDim = dim3(kCsThreads), lcfg.dynamicSmemBytes = smem, lcfg.attrs = lattrs, lcfg.numAttrs = 2;
    ccfg.gridDim = dim3(cls_blocks), ccfg.blockDim = dim3(kCsConsumers), ccfg.dynamicSmemBytes = cls_smem, ccfg.attrs = &pdl, ccfg.numAttrs = 1;
    cudaStream_t stream;
    CK(cudaStreamCreate(&stream));
    lcfg.stream = ccfg.stream = stream;
    int clusters = 0;
    CK(cudaOccupancyMaxActiveClusters(&clusters, layers_kernel, &lcfg));
    if (clusters < 1) {
        fprintf(stderr, "%s: a cluster of %d blocks with %zu bytes of shared memory each does not fit this GPU\n", sh.name, C, smem);
        return 1;
    }
    auto launch_step = [&](int step) -> int {
        p.step = step;
        CK(cudaLaunchKernelEx(&lcfg, layers_kernel, p));
        CK(cudaLaunchKernelEx(&ccfg, classifier_kernel, c, step));
        return 0;
    };

    // the first steps checked against the reference, each from the token the GPU took before
    int token = 1;
    std::vector<unsigned long long> best0 = {0ull, (unsigned long long)(0xffffffffu - (unsigned)token)};
    CK(cudaMemcpy(d.best, best0.data(), 16, cudaMemcpyHostToDevice));
    std::vector<float> ref, got(sh.vocab);
    for (int step = 0; step < 3; step++) {
        CK(cudaMemset(d.logits, 0xff, 4 * (size_t)sh.vocab));   // NaN until the classifier writes them
        if (launch_step(step)) return 1;
        CK(cudaStreamSynchronize(stream));
        unsigned long long key = 0;
        CK(cudaMemcpy(got.data(), d.logits, 4 * (size_t)sh.vocab, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(&key, d.best + (step & 1), 8, cudaMemcpyDeviceToHost));
        ref_step(m, token, ref);
        double num = 0.0, den = 0.0;
        int ref_best = 0;
        for (int i = 0; i < sh.vocab; i++) {
            num += (double)(got[i] - ref[i]) * (got[i] - ref[i]), den += (double)ref[i] * ref[i];
            if (ref[i] > ref[ref_best]) ref_best = i;
        }
        const double rel = sqrt(num / den);
        const int took = cs_token_of(key);
        const bool ok = rel <= 1e-4 && took >= 0 && took < sh.vocab && ref[took] >= ref[ref_best] - 1e-4f * fabsf(ref[ref_best]);
        printf("%-14s cluster of %2d, %s, check, step %d: token %d, logits' relative L2 against the host's %.3g, greedy %d (host %d): %s\n",
               sh.name, C, layout, step, token, rel, took, ref_best, ok ? "ok" : "WRONG");
        if (!ok) return 1;
        token = took;
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int reps = 200;
    for (int step = 3; step < 3 + 20 + reps; step++) {
        if (step == 3 + 20) CK(cudaEventRecord(e0, stream));
        if (launch_step(step)) return 1;
    }
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    float ms = 0.0f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    std::vector<unsigned long long> st(hops.size() + 2);
    std::vector<long long> cy(hops.size() + 2), wt(hops.size());
    CK(cudaMemcpy(st.data(), d_stamps, 8 * st.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(cy.data(), d_cycles, 8 * cy.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(wt.data(), d_waits, 8 * wt.size(), cudaMemcpyDeviceToHost));
    // the same steps replayed as the engine replays its step: a graph (of two steps, so that each
    // launch's key parity is fixed in it), 100 replays after 10
    cudaGraph_t graph;
    cudaGraphExec_t replay;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    if (launch_step(0) || launch_step(1)) return 1;
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaGraphInstantiate(&replay, graph, 0));
    for (int r = -10; r < 100; r++) {
        if (r == 0) CK(cudaEventRecord(e0, stream));
        CK(cudaGraphLaunch(replay, stream));
    }
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    float graph_ms = 0.0f;
    CK(cudaEventElapsedTime(&graph_ms, e0, e1));
    const double graph_us = 1e3 * graph_ms / 200;
    CK(cudaGraphExecDestroy(replay));
    CK(cudaGraphDestroy(graph));
    // a hop's time by block 0's clock64, in us at the SM clock the two timers give for the layers
    const double inside = (st[hops.size() + 1] - st[0]) / 1e3, step_us = 1e3 * ms / reps;
    const double cycles_an_us = (double)(cy[hops.size() + 1] - cy[0]) / inside;
    double kind_us[4] = {0, 0, 0, 0}, kind_wait[4] = {0, 0, 0, 0};
    int kind_n[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < hops.size(); i++) {
        const int k = hops[i].kind;
        kind_us[k] += (cy[i + 2] - cy[i + 1]) / cycles_an_us, kind_wait[k] += wt[i] / cycles_an_us, kind_n[k]++;
    }
    printf("%-14s cluster of %2d, %s, %2d layers, position %d, %.1f MB of weights with the classifier: %.2f us a step (%.0f tok/s; 200 "
           "steps launched from the host, events), %.2f us (%.0f tok/s) replayed as graphs of two steps; the layers %.2f us in block 0 "
           "(%.2f a layer, %.2f a hop)\n",
           sh.name, C, layout, sh.layers, pos, bytes / 1e6, step_us, 1e6 / step_us, graph_us, 1e6 / graph_us, inside, inside / sh.layers,
           inside / hops.size());
    printf("%-14s cluster of %2d, %s, us a hop (block 0, from its input's arrival to the next's, the last step's mean over the layers; "
           "in brackets its thread 0's waits for the ring; SM clock %.0f MHz): QKV %.2f (%.2f), attention %.2f (%.2f), output "
           "projection and w2 %.2f (%.2f), w1/w3 %.2f (%.2f)\n",
           sh.name, C, layout, cycles_an_us, kind_us[HOP_QKV] / kind_n[HOP_QKV], kind_wait[HOP_QKV] / kind_n[HOP_QKV],
           kind_us[HOP_ATTN] / kind_n[HOP_ATTN], kind_wait[HOP_ATTN] / kind_n[HOP_ATTN], kind_us[HOP_RESID] / kind_n[HOP_RESID],
           kind_wait[HOP_RESID] / kind_n[HOP_RESID], kind_us[HOP_SWIGLU] / kind_n[HOP_SWIGLU], kind_wait[HOP_SWIGLU] / kind_n[HOP_SWIGLU]);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaStreamDestroy(stream));
    return 0;
}

static int run_shape(const Shape &sh, int pos) {
    Model m;
    if (make_model(m, sh, pos)) return 1;
    DevModel d;
    std::vector<__half> kc_engine(m.kc.size()), vc_engine(m.vc.size());   // (layers, seq, kv_dim)
    for (int l = 0; l < sh.layers; l++)
        for (int h = 0; h < sh.kv_heads; h++)
            for (int t = 0; t < m.seq; t++)
                for (int i = 0; i < m.hs; i++) {
                    const size_t from = l * m.layer_cache + ((size_t)h * m.seq + t) * m.hs + i, to = ((size_t)l * m.seq + t) * m.kvd + h * m.hs + i;
                    kc_engine[to] = m.kc[from], vc_engine[to] = m.vc[from];
                }
    if (dev_copy(&d.kc, m.kc.data(), m.kc.size()) || dev_copy(&d.vc, m.vc.data(), m.vc.size()) ||
        dev_copy(&d.kc_engine, kc_engine.data(), kc_engine.size()) || dev_copy(&d.vc_engine, vc_engine.data(), vc_engine.size()) ||
        dev_copy(&d.emb, m.embedding.data(), m.embedding.size()) || dev_copy(&d.out, (const float *)nullptr, sh.dim) ||
        dev_copy(&d.logits, (const float *)nullptr, (size_t)sh.vocab) || dev_copy(&d.g_final, m.g_final.data(), sh.dim) ||
        dev_copy(&d.best, (const unsigned long long *)nullptr, 2))
        return 1;
    for (int engine_layout : {1, 0})
        for (int C : {16, 8})
            if (run_config(m, d, C, engine_layout)) return 1;
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    const int pos = argc > 1 ? atoi(argv[1]) : 256;
    if (pos < 1 || pos > kCsMaxPos) {   // (before the caches are sized by it)
        fprintf(stderr, "usage: cluster_probe [position]: a position from 1 to %d, not '%s'\n", kCsMaxPos, argv[1]);
        return 1;
    }
    const Shape shapes[] = {{"stories15m", 288, 768, 6, 6, 6, 32000}, {"smollm2-135m", 576, 1536, 30, 9, 3, 49152}};
    int rc = 0;
    for (const Shape &s : shapes)
        if (run_shape(s, pos)) {
            rc = 1;
            break;
        }
    for (void *d : owned) cudaFree(d);
    return rc;
}
