// bench/split_probe.cu: TinyLlama's decode layers in NOTES 113's clustered, split-K form, to
// measure whether it could carry TinyLlama to its 60% of 4480 GB/s before the engine takes it.
// The grid is as many clusters of S blocks (16, 8 or 4) as the GPU holds at once, a producer warp
// and 8 consumer warps a block, as the engine's cluster step (cuda/cluster_step.cuh, whose pieces
// it uses: x's digits, a warp's 8 rows, their hand-over to every block of the cluster, the key
// rows' products). Each KV group's 8 query heads are shared by its clusters (the clusters dealt
// over the 4 groups). Cluster c takes, in each layer:
//   QKV    the rows of its query heads and of their KV head (the key and value rows made by each
//          cluster of the group; its first one stores them), RMSNorm and RoPE folded in; outputs
//          pushed into every block of the cluster (st.shared::cluster + mbarriers)
//   ATTN   a block a head of its heads (the earlier key and value rows streamed through the ring)
//   O      the output projection's columns of its heads for all 2,048 rows, split over its
//          blocks (the rows' scales a 64-column piece each, as a head's columns need not be whole
//          groups); each block adds its partial rows into the next residual stream in L2
//          (red.add.f32; cluster 0 adds the old residual), then counts (a release add)
//   -      every block waits for the count (the residual complete), loads it (a hand-over
//          through L2)
//   W13    w1/w3 rows of its share of the hidden width (whole groups of 128, dealt over the clusters),
//          RMSNorm folded in, SwiGLU pushed into every block of the cluster
//   W2     w2's columns of its hidden share for all 2,048 rows, added into the residual as O's
//   -      the second hand-over through L2 (before the next layer's QKV)
// So two hand-overs through L2 a layer and three within a cluster, where the megakernel has five
// through L2. The residual rotates over three buffers (a fast cluster's adds must not land in the
// vector a slow one still reads): R_h (h >= 1) in buffer (h - 1) % 3, zeroed while R_{h-1} is
// being made, two hand-overs after its last reader; R_0 is the step's embedding row.
// Weights are random INT8 with FP32 scales a group of 128 (every layer its own: 1 GB, past L2),
// the norms' weights 1, the caches head-major FP16 (earlier rows random). The first launch is
// checked against an FP64 host reference (the final residual stream, relative L2; and the step's
// key and value rows in the caches); then 200 launches are timed with events after 20, and one
// launch's phases by block 0's %globaltimer.
// make bench/split_probe && ./bench/split_probe [layers] [position] [blocks a cluster]
#define CS_WATCHDOG   // a wait that does not end prints which and traps (cluster_step.cuh)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../kernels.cu"   // the cluster step's pieces, the PTX wrappers: one translation unit
#include "probe.h"         // CK

namespace {

constexpr int kD = 2048, kHidden = 5632, kHeads = 32, kKvHeads = 4, kHs = 64, kG = 128, kMaxBlocks = 132, kMaxClusters = 32;
constexpr int kSlot = 8 * (kD + 64), kSlots = 11;       // a slot: 8 rows of K = 2,048 (int8 + 16 scales)
constexpr int kKvRows = 16384 / (kHs * 2);              // a piece of a head's cache rows
constexpr int kMaxPos = 512, kMaxHpc = 8, kMaxHid = 8 * kG, kPhases = 11;
constexpr long long kHang = 4000000000ll;               // cycles a count may take before the probe traps
enum { M_QKV, M_O, M_W13, M_W2 };

// One matrix's records for one block in a layer: rows of rec bytes (the row's int8 columns, padded
// to 16, then its FP32 scales, one a 16 gc columns, padded to 16) at off in the layer's pack,
// per_piece a slot; the block's first row row0 (of the cluster's rows, or of the output's).
struct Mat {
    long long off;
    int rows, rec, per_piece, K, row0, gc;
};
struct BlockPlan {
    Mat m[4];
};
// A cluster's share: query heads [head0, head0 + heads) of KV head kvh (store: it writes the
// step's key and value rows), hidden groups [hid0, hid0 + hid_groups).
struct ClusterPlan {
    int head0, heads, kvh, store, hid0, hid_groups;
};
__constant__ BlockPlan c_plan[kMaxBlocks];
__constant__ ClusterPlan c_cluster[kMaxClusters];
__constant__ float c_cos[kHs / 2], c_sin[kHs / 2];   // RoPE at the step's position (the host's floats)

struct Params {
    int S, B, layers, pos, seq, trace;   // B: the blocks, S a cluster
    const unsigned char *pack;   // every layer's records, layer_bytes each
    long long layer_bytes;
    __half *kcache, *vcache;     // (layers, kv heads, seq, hs)
    const float *emb;            // R_0
    float *rbuf[3];              // the residual stream's buffers
    unsigned *count;             // blocks' counts, never reset: R_h is complete at base + B h
    unsigned *arrived;           // (the first launch) every block counts in at its start: all resident?
    unsigned base;
    float *out;                  // R_{2 layers}
    unsigned long long *stamps;  // (layers, kPhases) block 0's %globaltimer in the traced launch
};

struct Smem {
    unsigned char ring[kSlots][kSlot];
    float res[kD];                       // the residual stream of the last hand-over through L2
    float ones[kD];                      // the norms' weights
    float qkv[kMaxHpc * kHs + 2 * kHs];  // the cluster's q rows, then k, then v
    float att[kMaxHpc * kHs];
    float hid[kMaxHid];
    uint32_t digits[3][kD / 4];
    float u[kD / kG], ss[kD / kG];
    float scores[kMaxPos + 1];
    float part[4 * kHs];
    float red[2][kCsWarps];
    unsigned long long full[kSlots], empty[kSlots], xbar[2];
};

// The ring as the consumers walk it: the block's piece n in slot n % kSlots, phase n / kSlots.
struct Ring {
    Smem *s;
    int base;
    __device__ unsigned char *at(int i) const { return s->ring[(base + i) % kSlots]; }
    __device__ unsigned char *wait(int i) const {
        const int n = base + i;
        cs_wait(cs_saddr(&s->full[n % kSlots]), (n / kSlots) & 1, CS_AT_FULL, n);
        return at(i);
    }
    __device__ void release(int i) const { mbar_arrive(cs_saddr(&s->empty[(base + i) % kSlots])); }
};

__device__ __forceinline__ int kv_pieces(const Params &p) { return (p.pos + kKvRows - 1) / kKvRows; }

// The producer: the block's pieces in the hops' order (no piece waits for an activation).
__device__ void produce(const Params &p, Smem *s, int rank, int c) {
    if (threadIdx.x % 32) return;
    const BlockPlan &pl = c_plan[blockIdx.x];
    int n = 0;
    auto copy = [&](const void *src, int bytes) {
        const int slot = n % kSlots, round = n / kSlots;
        if (round > 0) cs_wait(cs_saddr(&s->empty[slot]), (round - 1) & 1, CS_AT_EMPTY, n);
        mbar_arrive_expect(cs_saddr(&s->full[slot]), bytes);
        bulk_copy_counted(cs_saddr(s->ring[slot]), src, bytes, cs_saddr(&s->full[slot]));
        n++;
    };
    auto stream = [&](const unsigned char *layer, const Mat &m) {
        for (int r = 0; r < m.rows; r += m.per_piece) copy(layer + m.off + (long long)r * m.rec, min(m.per_piece, m.rows - r) * m.rec);
    };
    for (int l = 0; l < p.layers; l++) {
        const unsigned char *layer = p.pack + l * p.layer_bytes;
        stream(layer, pl.m[M_QKV]);
        if (rank < c_cluster[c].heads) {
            const size_t head = ((size_t)l * kKvHeads + c_cluster[c].kvh) * p.seq * kHs;
            for (int cache = 0; cache < 2; cache++)
                for (int j = 0; j < kv_pieces(p); j++)
                    copy((cache ? p.vcache : p.kcache) + head + (size_t)j * kKvRows * kHs, min(kKvRows, p.pos - j * kKvRows) * kHs * 2);
        }
        stream(layer, pl.m[M_O]);
        stream(layer, pl.m[M_W13]);
        stream(layer, pl.m[M_W2]);
    }
}

__device__ __noinline__ void count_hung(unsigned want, unsigned seen) {
    printf("split_probe: block %d waited too long for the count %u (at %u)\n", blockIdx.x, want, seen);
    __trap();
}
// Every block's count up to want, then R (D floats) into s->res.
__device__ void take_residual(const Params &p, Smem *s, unsigned want, const float *R) {
    if (threadIdx.x == 0) {
        const long long t0 = clock64();
        unsigned seen;
        for (;;) {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(p.count) : "memory");
            if ((int)(seen - want) >= 0) break;
            if (clock64() - t0 > kHang) count_hung(want, seen);
        }
    }
    cs_consumers_sync();
    for (int i = threadIdx.x; i < kD; i += kCsConsumers) s->res[i] = __ldcg(R + i);
    cs_consumers_sync();
}

// A linear hop of matrix kM over x (digits of m.K elements; QKV and W13 normed): the block's rows
// from the ring, each batch's outputs pushed into the cluster (QKV, W13) or added into R (O, W2).
template <int kM>
__device__ int linear_hop(const Params &p, Smem *s, const Mat &m, const Ring &ring, const float *x, int l, int c, float *R) {
    const int lane = threadIdx.x % 32;
    const bool norm = kM == M_QKV || kM == M_W13;
    const float inv_rms = cs_stage_digits<false, kD / 4>(s->digits, s->u, s->ss, x, m.K, norm ? s->ones : nullptr, 1e-5f);
    CsLaneXOf<kD / 16 / 32> lx;
    lx.load(s->digits, s->u, m.K, m.gc);
    const ClusterPlan &cp = c_cluster[c];
    const int row0 = m.row0, q_rows = cp.heads * kHs;
    int piece = 0;
    for (int r0 = 0; r0 < m.rows; r0 += m.per_piece, piece++) {
        const unsigned char *bytes = ring.wait(piece);
        const int in_piece = min(m.per_piece, m.rows - r0);
        for (int b = cs_first_batch(r0); b < in_piece; b += 8 * kCsWarps) {
            float acc[8];
            cs_rows8(bytes + (size_t)b * m.rec, m.rec, in_piece - b, m.K, lx, acc);
            const int r = lane / 4, row = row0 + r0 + b + r, first = row0 + r0 + b;
            const bool valid = b + r < in_piece;
            const float v = cs_sum8(acc) * inv_rms, other = __shfl_xor_sync(~0u, v, 4);
            if (kM == M_QKV) {   // row: the cluster's q rows, then k, then v
                float out = v;
                if (row < q_rows + kHs) {
                    const int i = row % kHs / 2;
                    out = (row & 1) ? other * c_sin[i] + v * c_cos[i] : v * c_cos[i] - other * c_sin[i];
                }
                if (valid && row >= q_rows && lane % 4 == 0 && cp.store) {
                    const int e = row - q_rows, is_v = e >= kHs;
                    __half *cache = is_v ? p.vcache : p.kcache;
                    cache[(((size_t)l * kKvHeads + cp.kvh) * p.seq + p.pos) * kHs + e % kHs] = __float2half(out);
                }
                cs_share_rows8(cs_saddr(s->qkv), out, first, in_piece - b, p.S, false);
            } else if (kM == M_W13) {   // rows 2i, 2i + 1: w1's and w3's row i of the cluster's share
                const float out = (r & 1) ? 0.0f : v * (1.0f / (1.0f + expf(-v))) * other;
                cs_share_rows8(cs_saddr(s->hid), out, first, in_piece - b, p.S, true);
            } else if (valid && lane % 4 == 0) {
                asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;" ::"l"(R + row), "f"(v + (c == 0 ? s->res[row] : 0.0f)) : "memory");
            }
        }
        __syncwarp();
        if (lane == 0) ring.release(piece);
    }
    return piece;
}

// The attention of head (cluster's head `rank`) at position P: q, k and v from s->qkv, the earlier
// rows from the ring (kp pieces of keys, then kp of values); the output pushed into the cluster.
__device__ int attention_hop(const Params &p, Smem *s, const Ring &ring, int rank, int c) {
    const int heads = c_cluster[c].heads;
    if (rank >= heads) return 0;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, P = p.pos, kp = kv_pieces(p);
    const float *q = s->qkv + rank * kHs, *k_own = s->qkv + heads * kHs, *v_own = k_own + kHs;
    for (int i = 0; i < kp; i++) ring.wait(i);
    float m = -INFINITY;
    for (int t = threadIdx.x; t <= P; t += kCsConsumers) {
        float sc = 0.0f;
        if (t < P) sc = cs_dot_key(q, reinterpret_cast<const __half *>(ring.at(t / kKvRows)) + (size_t)(t % kKvRows) * kHs, kHs, t % kKvRows);
        else
            for (int i = 0; i < kHs; i++) sc += q[i] * __half2float(__float2half(k_own[i]));
        sc *= 0.125f;   // 1 / sqrt(64)
        s->scores[t] = sc;
        m = fmaxf(m, sc);
    }
    m = cs_consumers_max(m, s->red[0]);
    if (lane == 0)
        for (int i = 0; i < kp; i++) ring.release(i);
    const float sum = cs_exp_sum(s->scores, P + 1, m, s->red[1]);
    for (int i = 0; i < kp; i++) ring.wait(kp + i);
    {
        const int d = threadIdx.x % kHs, part = threadIdx.x / kHs;   // 4 parts of the positions
        float a = 0.0f;
        for (int t = part; t < P; t += 4)
            a += s->scores[t] * __half2float(reinterpret_cast<const __half *>(ring.at(kp + t / kKvRows))[(size_t)(t % kKvRows) * kHs + d]);
        if (part == 0) a += s->scores[P] * __half2float(__float2half(v_own[d]));
        s->part[threadIdx.x] = a;
    }
    cs_consumers_sync();
    if (lane == 0)
        for (int i = 0; i < kp; i++) ring.release(kp + i);
    const uint32_t dst = cs_saddr(s->att);
    for (int d = warp; d < kHs; d += kCsWarps) {
        const float o = (s->part[d] + s->part[kHs + d] + s->part[2 * kHs + d] + s->part[3 * kHs + d]) / sum;
        if (lane < p.S) cs_store_remote(cs_remote(dst + 4 * (rank * kHs + d), lane), o);
    }
    return 2 * kp;
}

// The end of a hop whose outputs went into the cluster: every warp arrives on every block's
// barrier j % 2; the next hop waits on its own (xbar phase bits in *phases).
__device__ void cluster_hand_over(Smem *s, int j, int S) {
    __syncwarp();
    const int lane = threadIdx.x % 32;
    if (lane < S) cs_arrive_remote(cs_remote(cs_saddr(&s->xbar[j & 1]), lane));
}
__device__ void cluster_wait(Smem *s, int j, unsigned *phases) {
    cs_wait<true>(cs_saddr(&s->xbar[j & 1]), (*phases >> (j & 1)) & 1, CS_AT_HOP, j);
    *phases ^= 1u << (j & 1);
}
// The end of a hop whose outputs were added into R_h: the zeroing of R_{h+1}'s buffer (by one
// block), the block's barrier, its count.
__device__ void count_stage(const Params &p, int h) {
    if (h % p.B == (int)blockIdx.x)
        for (int i = threadIdx.x; i < kD; i += kCsConsumers) p.rbuf[h % 3][i] = 0.0f;
    cs_consumers_sync();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p.count) : "memory");
}

__device__ __forceinline__ void stamp(const Params &p, int l, int k) {
    if (p.trace && blockIdx.x == 0 && threadIdx.x == 0) p.stamps[l * kPhases + k] = cs_now();
}

__device__ void consume(const Params &p, Smem *s, int rank, int c) {
    const BlockPlan &pl = c_plan[blockIdx.x];
    unsigned phases = 0;
    int piece = 0, j = 0;
    auto within_cluster = [&](int l, int k) {   // a hop's outputs handed over in the cluster (phases k, k + 1)
        cluster_hand_over(s, j, p.S);
        stamp(p, l, k);
        cluster_wait(s, j++, &phases);
        stamp(p, l, k + 1);
    };
    for (int l = 0; l < p.layers; l++) {
        const int h = 2 * l + 1;   // O makes R_h, W2 R_{h+1}
        stamp(p, l, 0);
        take_residual(p, s, p.base + p.B * (h - 1), l == 0 ? p.emb : p.rbuf[(h - 2) % 3]);
        stamp(p, l, 1);
        piece += linear_hop<M_QKV>(p, s, pl.m[M_QKV], Ring{s, piece}, s->res, l, c, nullptr);
        within_cluster(l, 2);
        piece += attention_hop(p, s, Ring{s, piece}, rank, c);
        within_cluster(l, 4);
        piece += linear_hop<M_O>(p, s, pl.m[M_O], Ring{s, piece}, s->att, l, c, p.rbuf[(h - 1) % 3]);
        count_stage(p, h);
        stamp(p, l, 6);
        take_residual(p, s, p.base + p.B * h, p.rbuf[(h - 1) % 3]);
        stamp(p, l, 7);
        piece += linear_hop<M_W13>(p, s, pl.m[M_W13], Ring{s, piece}, s->res, l, c, nullptr);
        within_cluster(l, 8);
        piece += linear_hop<M_W2>(p, s, pl.m[M_W2], Ring{s, piece}, s->hid, l, c, p.rbuf[h % 3]);
        count_stage(p, h + 1);
        stamp(p, l, 10);
    }
    if (blockIdx.x == 0) {   // the step's result, then R_1's buffer zeroed for the next launch
        const int last = 2 * p.layers;
        take_residual(p, s, p.base + p.B * last, p.rbuf[(last - 1) % 3]);
        for (int i = threadIdx.x; i < kD; i += kCsConsumers) p.out[i] = s->res[i], p.rbuf[0][i] = 0.0f;
    }
}

__global__ void __launch_bounds__(kCsThreads, 1) split_kernel(const Params p) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    Smem *s = reinterpret_cast<Smem *>(smem_raw);
    const int rank = cs_rank(), c = blockIdx.x / p.S;
    for (int i = threadIdx.x; i < kD; i += kCsThreads) s->ones[i] = 1.0f;
    if (threadIdx.x == 0) {
        for (int i = 0; i < kSlots; i++) mbar_init(cs_saddr(&s->full[i]), 1), mbar_init(cs_saddr(&s->empty[i]), kCsWarps);
        for (int i = 0; i < 2; i++) mbar_init(cs_saddr(&s->xbar[i]), p.S * kCsWarps);
        mbar_init_fence();
    }
    if (p.arrived && threadIdx.x == 0) {   // every block must be resident at once (they wait for each other's counts)
        atomicAdd(p.arrived, 1u);
        const long long t0 = clock64();
        while (*(volatile unsigned *)p.arrived < (unsigned)p.B)
            if (clock64() - t0 > kHang) {
                printf("split_probe: block %d: the grid's blocks are not all resident at once\n", blockIdx.x);
                __trap();
            }
    }
    __syncthreads();   // (the cluster barrier below is warp-aligned)
    cs_cluster_sync();
    if (threadIdx.x >= kCsConsumers) produce(p, s, rank, c);
    else consume(p, s, rank, c);
    __syncwarp();
    cs_cluster_sync();   // no block leaves while another may still write its shared memory
}

// ---------------------------------------------------------------------------------------------
// Host: the model, the plan, the reference, the runs.

struct Rng {
    uint64_t x;
    uint32_t next() {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        return (uint32_t)(x >> 11);
    }
    float uniform() { return (next() & 0xffffff) / 16777216.0f; }   // [0, 1)
};

// A matrix of rows x K: int8 weights and a scale a group of 128 columns.
struct HostMat {
    int rows, K;
    std::vector<int8_t> q;
    std::vector<float> s;
    void make(int r, int k, Rng &g) {
        rows = r, K = k;
        q.resize((size_t)r * k), s.resize((size_t)r * (k / kG));
        for (auto &w : q) w = (int8_t)((int)(g.next() % 255) - 127);
        for (auto &v : s) v = (0.5f + g.uniform()) / (127.0f * sqrtf((float)k));
    }
    float w(int r, int k) const { return q[(size_t)r * K + k] * s[(size_t)r * (K / kG) + k / kG]; }
};
struct Layer {
    HostMat wq, wk, wv, wo, w1, w3, w2;
};

// Record bytes of a row of K columns with a scale a piece of sc columns; the row's columns [k0,
// k0 + K) and their scales (k0 and sc: multiples of 64 within groups of 128) into dst.
int rec_of(int K, int sc) { return ((K + 15) & ~15) + ((4 * ((K + sc - 1) / sc) + 15) & ~15); }
void put_record(unsigned char *dst, const HostMat &m, int row, int k0, int K, int sc) {
    memset(dst, 0, rec_of(K, sc));
    memcpy(dst, &m.q[(size_t)row * m.K + k0], K);
    float *scales = reinterpret_cast<float *>(dst + ((K + 15) & ~15));
    for (int j = 0; j * sc < K; j++) scales[j] = m.s[(size_t)row * (m.K / kG) + (k0 + j * sc) / kG];
}

// The grid's shape: C clusters of S blocks, each cluster's share (ClusterPlan).
struct Config {
    int S, C;
    ClusterPlan cl[kMaxClusters];
};
// The clusters dealt over the KV groups (group g takes clusters [g C / 4, (g + 1) C / 4)), each
// group's 8 query heads over its clusters, the 44 hidden groups over all of them.
Config config_of(int S, int C) {
    Config k = {};
    k.S = S, k.C = C;
    const int per_group = kHeads / kKvHeads, hidden_groups = kHidden / kG;
    for (int g = 0; g < kKvHeads; g++) {
        const int c0 = g * C / kKvHeads, n = (g + 1) * C / kKvHeads - c0;
        for (int i = 0; i < n; i++) {
            ClusterPlan &cp = k.cl[c0 + i];
            cp.kvh = g, cp.store = i == 0;
            cp.head0 = g * per_group + i * per_group / n, cp.heads = (i + 1) * per_group / n - i * per_group / n;
        }
    }
    for (int c = 0; c < C; c++) k.cl[c].hid0 = c * hidden_groups / C, k.cl[c].hid_groups = (c + 1) * hidden_groups / C - c * hidden_groups / C;
    return k;
}

// Cluster c's rows of a matrix (in the order its blocks take them), as (matrix, row, first column,
// columns) for each; the scales' piece of the matrix's records.
struct RowRef {
    const HostMat *m;
    int row, k0, K;
};
std::vector<RowRef> rows_of(const Config &k, const Layer &L, int mat, int c) {
    const ClusterPlan &cp = k.cl[c];
    std::vector<RowRef> v;
    if (mat == M_QKV) {
        for (int i = 0; i < cp.heads * kHs; i++) v.push_back({&L.wq, cp.head0 * kHs + i, 0, kD});
        for (int i = 0; i < kHs; i++) v.push_back({&L.wk, cp.kvh * kHs + i, 0, kD});
        for (int i = 0; i < kHs; i++) v.push_back({&L.wv, cp.kvh * kHs + i, 0, kD});
    } else if (mat == M_O) {
        for (int i = 0; i < kD; i++) v.push_back({&L.wo, i, cp.head0 * kHs, cp.heads * kHs});
    } else if (mat == M_W13) {
        for (int i = cp.hid0 * kG; i < (cp.hid0 + cp.hid_groups) * kG; i++) v.push_back({&L.w1, i, 0, kD}), v.push_back({&L.w3, i, 0, kD});
    } else {
        for (int i = 0; i < kD; i++) v.push_back({&L.w2, i, cp.hid0 * kG, cp.hid_groups * kG});
    }
    return v;
}
int scale_cols_of(int mat) { return mat == M_O ? kHs : kG; }

// The plan (each block's Mat of each matrix, the same in every layer; its rows a multiple of 8,
// the cluster's last blocks taking fewer) and, with pack, one layer's records. Returns the layer's
// bytes, or -1 where a shape does not hold.
long long plan_layer(const Config &k, const Layer &L, BlockPlan *plan, std::vector<unsigned char> *pack) {
    long long at = 0;
    for (int b = 0; b < k.C * k.S; b++)
        for (int mat = 0; mat < 4; mat++) {
            const std::vector<RowRef> rows = rows_of(k, L, mat, b / k.S);
            const int n = (int)rows.size(), per = ((n + k.S - 1) / k.S + 7) & ~7, rank = b % k.S, K = rows[0].K, sc = scale_cols_of(mat);
            Mat &m = plan[b].m[mat];
            m.row0 = std::min(n, rank * per), m.rows = std::min(per, n - m.row0), m.rec = rec_of(K, sc), m.K = K, m.gc = sc / 16;
            m.off = at, m.per_piece = kSlot / m.rec & ~7;
            if (m.per_piece < 8 || K > kD || rows[0].k0 % kHs) return -1;
            if (pack) {
                pack->resize(at + (size_t)m.rows * m.rec);
                for (int r = 0; r < m.rows; r++) {
                    const RowRef &x = rows[(size_t)m.row0 + r];
                    put_record(pack->data() + at + (size_t)r * m.rec, *x.m, x.row, x.k0, x.K, sc);
                }
            }
            at += (long long)m.rows * m.rec;
        }
    return at;
}

// The reference: the step in FP64 (weights as stored, x exact), R_0 -> R_{2 layers}; the step's key
// and value rows (layers, kv heads, 2, hs) into *kv.
std::vector<double> reference(const std::vector<Layer> &layers, const std::vector<float> &emb, const std::vector<__half> &kc,
                              const std::vector<__half> &vc, int pos, int seq, const float *cosv, const float *sinv, std::vector<double> *kv) {
    std::vector<double> R(emb.begin(), emb.end()), xn(kD), qkv(kD + 2 * kKvHeads * kHs), att(kD), hid(kHidden);
    auto norm = [&](std::vector<double> &out) {
        double ss = 0;
        for (double v : R) ss += v * v;
        const double inv = 1.0 / sqrt(ss / kD + 1e-5);
        for (int i = 0; i < kD; i++) out[i] = R[i] * inv;
    };
    auto gemv = [](const HostMat &m, const double *x, int row) {
        double a = 0;
        for (int k = 0; k < m.K; k++) a += (double)m.w(row, k) * x[k];
        return a;
    };
    auto half_of = [](double v) { return (double)__half2float(__float2half((float)v)); };
    for (size_t l = 0; l < layers.size(); l++) {
        const Layer &L = layers[l];
        norm(xn);
        for (int i = 0; i < kD; i++) qkv[i] = gemv(L.wq, xn.data(), i);
        for (int i = 0; i < kKvHeads * kHs; i++) qkv[kD + i] = gemv(L.wk, xn.data(), i), qkv[kD + kKvHeads * kHs + i] = gemv(L.wv, xn.data(), i);
        for (int i = 0; i < kD + kKvHeads * kHs; i += 2) {   // RoPE on q and k
            const int f = i % kHs / 2;
            const double a = qkv[i], b = qkv[i + 1];
            qkv[i] = a * cosv[f] - b * sinv[f], qkv[i + 1] = b * cosv[f] + a * sinv[f];
        }
        for (int h = 0; h < kKvHeads; h++)
            for (int d = 0; d < kHs; d++) {
                const size_t at = (((size_t)l * kKvHeads + h) * 2) * kHs + d;
                (*kv)[at] = qkv[kD + h * kHs + d], (*kv)[at + kHs] = qkv[kD + kKvHeads * kHs + h * kHs + d];
            }
        for (int h = 0; h < kHeads; h++) {
            const int kvh = h / (kHeads / kKvHeads);
            const double *q = &qkv[h * kHs], *k_own = &qkv[kD + kvh * kHs], *v_own = &qkv[kD + kKvHeads * kHs + kvh * kHs];
            std::vector<double> sc(pos + 1);
            double m = -1e300, sum = 0;
            for (int t = 0; t <= pos; t++) {
                double a = 0;
                for (int d = 0; d < kHs; d++)
                    a += q[d] * (t < pos ? (double)__half2float(kc[(((size_t)l * kKvHeads + kvh) * seq + t) * kHs + d]) : half_of(k_own[d]));
                sc[t] = a / 8.0, m = std::max(m, sc[t]);
            }
            for (int t = 0; t <= pos; t++) sc[t] = exp(sc[t] - m), sum += sc[t];
            for (int d = 0; d < kHs; d++) {
                double a = 0;
                for (int t = 0; t <= pos; t++)
                    a += sc[t] * (t < pos ? (double)__half2float(vc[(((size_t)l * kKvHeads + kvh) * seq + t) * kHs + d]) : half_of(v_own[d]));
                att[h * kHs + d] = a / sum;
            }
        }
        for (int i = 0; i < kD; i++) R[i] += gemv(L.wo, att.data(), i);
        norm(xn);
        for (int i = 0; i < kHidden; i++) {
            const double a = gemv(L.w1, xn.data(), i), b = gemv(L.w3, xn.data(), i);
            hid[i] = a / (1.0 + exp(-a)) * b;
        }
        for (int i = 0; i < kD; i++) R[i] += gemv(L.w2, hid.data(), i);
    }
    return R;
}

// What block 0 stamps: the name of the stretch from stamp k to stamp k + 1.
const char *kPhaseNames[kPhases - 1] = {"R loaded", "QKV", "QKV hand-over", "attention", "its hand-over", "O + count",
                                        "R loaded", "W13", "W13 hand-over", "W2 + count"};

// The residual stream the device made against the reference's: relative L2.
double off_by(const float *out, const std::vector<double> &ref) {
    double num = 0, den = 0;
    for (int i = 0; i < kD; i++) num += (out[i] - ref[i]) * (out[i] - ref[i]), den += ref[i] * ref[i];
    return sqrt(num / den);
}

// The steps' inputs and the references, made once for every shape.
struct Model {
    int layers, pos, seq;
    std::vector<Layer> w;
    std::vector<float> emb;
    __half *kc, *vc;   // the device's caches
    std::vector<double> ref, kv;
    double bytes;      // a layer's INT8 weights and scales as the model holds them
};

// The step's key and value rows in the device's caches against the reference's (FP16 rounding).
bool kv_stored(const Model &md) {
    std::vector<__half> row(kHs);
    for (int l = 0; l < md.layers; l++)
        for (int h = 0; h < kKvHeads; h++)
            for (int c = 0; c < 2; c++) {
                const size_t at = (((size_t)l * kKvHeads + h) * md.seq + md.pos) * kHs;
                if (cudaMemcpy(row.data(), (c ? md.vc : md.kc) + at, kHs * 2, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
                for (int d = 0; d < kHs; d++) {
                    const double want = md.kv[(((size_t)l * kKvHeads + h) * 2 + c) * kHs + d], got = __half2float(row[d]);
                    if (!(fabs(got - want) <= 2e-3 * std::max(1.0, fabs(want)))) {
                        printf("  the step's %s row of layer %d, KV head %d, element %d: %g stored, %g the reference's\n", c ? "value" : "key", l, h,
                               d, got, want);
                        return false;
                    }
                }
            }
    return true;
}

int run_config(const Model &md, int S, int C) {
    const Config k = config_of(S, C);
    const int B = C * S;
    for (int c = 0; c < C; c++)   // (the attention takes a block a head; the cluster's buffers their largest)
        if (k.cl[c].heads > S || k.cl[c].heads > kMaxHpc || k.cl[c].hid_groups * kG > kMaxHid)
            return printf("%d clusters of %d: cluster %d's %d heads and %d hidden groups do not fit; not run\n", C, S, c, k.cl[c].heads,
                          k.cl[c].hid_groups), 0;
    BlockPlan plan[kMaxBlocks];
    const long long layer_bytes = plan_layer(k, md.w[0], plan, nullptr);
    if (layer_bytes < 0) return printf("%d clusters of %d: a matrix's rows do not fit the plan; not run\n", C, S), 1;
    unsigned char *pack;
    CK(cudaMalloc(&pack, (size_t)layer_bytes * md.layers));
    for (int l = 0; l < md.layers; l++) {
        std::vector<unsigned char> bytes;
        plan_layer(k, md.w[l], plan, &bytes);
        CK(cudaMemcpy(pack + (size_t)l * layer_bytes, bytes.data(), layer_bytes, cudaMemcpyHostToDevice));
    }
    CK(cudaMemcpyToSymbol(c_plan, plan, sizeof plan));
    CK(cudaMemcpyToSymbol(c_cluster, k.cl, sizeof k.cl));
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = S, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(B), cfg.blockDim = dim3(kCsThreads), cfg.dynamicSmemBytes = sizeof(Smem), cfg.attrs = &attr, cfg.numAttrs = 1;
    Params p = {};
    p.S = S, p.B = B, p.layers = md.layers, p.pos = md.pos, p.seq = md.seq, p.pack = pack, p.layer_bytes = layer_bytes;
    p.kcache = md.kc, p.vcache = md.vc;
    float *emb_d, *out_d;
    CK(cudaMalloc(&emb_d, kD * 4));
    CK(cudaMemcpy(emb_d, md.emb.data(), kD * 4, cudaMemcpyHostToDevice));
    p.emb = emb_d;
    for (int i = 0; i < 3; i++) {
        CK(cudaMalloc(&p.rbuf[i], kD * 4));
        CK(cudaMemset(p.rbuf[i], 0, kD * 4));
    }
    CK(cudaMalloc(&p.count, 4));
    CK(cudaMemset(p.count, 0, 4));
    unsigned *arrived;
    CK(cudaMalloc(&arrived, 4));
    CK(cudaMemset(arrived, 0, 4));
    for (__half *cache : {md.kc, md.vc})   // the step's rows poisoned (FP16 NaN): this shape must store them
        CK(cudaMemset2D(cache + (size_t)md.pos * kHs, (size_t)md.seq * kHs * 2, 0xff, kHs * 2, (size_t)md.layers * kKvHeads));
    CK(cudaMalloc(&out_d, kD * 4));
    p.out = out_d;
    CK(cudaMalloc(&p.stamps, (size_t)md.layers * kPhases * 8));
    const int warm = 20, timed = 200;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> out(kD);
    double worst = 0;
    auto check = [&](int launch) {   // the launch's residual stream against the reference (1e-3: broken)
        if (cudaMemcpy(out.data(), out_d, kD * 4, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
        const double rel = off_by(out.data(), md.ref);
        worst = std::max(worst, rel);
        if (!(rel <= 1e-3)) printf("%d clusters of %d: launch %d's residual stream is %.3g (relative L2) from the reference\n", C, S, launch, rel);
        return rel <= 1e-3;
    };
    for (int launch = 0; launch < warm + timed; launch++) {
        if (launch == warm) CK(cudaEventRecord(a));
        p.base = (unsigned)launch * B * 2 * md.layers;
        p.trace = launch == warm + timed / 2, p.arrived = launch == 0 ? arrived : nullptr;
        CK(cudaLaunchKernelEx(&cfg, split_kernel, p));
        if (launch == 0) {
            CK(cudaDeviceSynchronize());
            if (!check(launch) || !kv_stored(md)) return 1;
        }
    }
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    if (!check(warm + timed - 1)) return 1;
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    const double us = ms * 1e3 / timed, model_rate = md.bytes * md.layers / us * 1e-3;
    printf("%d clusters of %d (%d SMs), %d layers at position %d: %.1f us a step, %.2f a layer; the model's %.1f MB a layer at %.0f GB/s "
           "(%.1f%% of 4480; the probe's records %.1f MB); residual within %.2g of the reference (%s 1e-5)\n",
           C, S, B, md.layers, md.pos, us, us / md.layers, md.bytes / 1e6, model_rate, model_rate / 44.8, layer_bytes / 1e6, worst,
           worst <= 1e-5 ? "within" : "PAST");
    std::vector<unsigned long long> t((size_t)md.layers * kPhases);
    CK(cudaMemcpy(t.data(), p.stamps, t.size() * 8, cudaMemcpyDeviceToHost));
    printf("  block 0's phases, us, mean over layers 1..%d of the traced launch:", md.layers - 1);
    for (int ph = 0; ph + 1 < kPhases; ph++) {
        double sum = 0;
        for (int l = 1; l < md.layers; l++) sum += (double)(long long)(t[(size_t)l * kPhases + ph + 1] - t[(size_t)l * kPhases + ph]);
        printf(" %s %.2f;", kPhaseNames[ph], sum / (md.layers - 1) / 1e3);
    }
    double layer_us = 0;
    for (int l = 1; l < md.layers; l++) layer_us += (double)(long long)(t[(size_t)l * kPhases] - t[(size_t)(l - 1) * kPhases]);
    printf(" a layer %.2f\n", layer_us / (md.layers - 1) / 1e3);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaFree(pack));
    CK(cudaFree(emb_d));
    CK(cudaFree(out_d));
    for (int i = 0; i < 3; i++) CK(cudaFree(p.rbuf[i]));
    CK(cudaFree(p.count));
    CK(cudaFree(arrived));
    CK(cudaFree(p.stamps));
    return 0;
}

// The most clusters of S blocks the GPU holds at once (0 where none).
int clusters_that_fit(int S) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = S, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(S), cfg.blockDim = dim3(kCsThreads), cfg.dynamicSmemBytes = sizeof(Smem), cfg.attrs = &attr, cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, split_kernel, &cfg) != cudaSuccess) n = 0, (void)cudaGetLastError();
    return n;
}

int probe_main(int layers, int pos, int only) {
    CK(cudaFuncSetAttribute(split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sizeof(Smem)));
    CK(cudaFuncSetAttribute(split_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    const int sizes[] = {8, 4, 16};   // (16 last: the non-portable size; a trap there loses no other shape)
    int fit[3], runnable = 0;
    printf("split_probe: TinyLlama's layers (dim %d, hidden %d, %d heads, %d kv heads) as clusters adding into the residual in L2; "
           "%zu bytes of shared memory a block; clusters the GPU holds at once:",
           kD, kHidden, kHeads, kKvHeads, sizeof(Smem));
    for (int i = 0; i < 3; i++) {
        fit[i] = std::min(clusters_that_fit(sizes[i]), std::min(kMaxClusters, kMaxBlocks / sizes[i]));
        printf(" %d of %d;", fit[i], sizes[i]);
        if (only && sizes[i] != only) fit[i] = 0;
        runnable += fit[i] >= kKvHeads;
    }
    printf("\n");
    if (!runnable) return printf("split_probe: no shape of at least %d clusters fits\n", kKvHeads), 1;
    Model md;
    md.layers = layers, md.pos = pos, md.seq = pos + 1;
    Rng g = {0x9e3779b97f4a7c15ull};
    md.w.resize(layers);
    for (Layer &L : md.w) {
        L.wq.make(kD, kD, g), L.wk.make(kKvHeads * kHs, kD, g), L.wv.make(kKvHeads * kHs, kD, g), L.wo.make(kD, kD, g);
        L.w1.make(kHidden, kD, g), L.w3.make(kHidden, kD, g), L.w2.make(kD, kHidden, g);
    }
    md.bytes = 0;
    for (const HostMat *m : {&md.w[0].wq, &md.w[0].wk, &md.w[0].wv, &md.w[0].wo, &md.w[0].w1, &md.w[0].w3, &md.w[0].w2})
        md.bytes += (double)m->q.size() + 4.0 * m->s.size();
    md.emb.resize(kD);
    for (float &v : md.emb) v = 2.0f * g.uniform() - 1.0f;
    const size_t cache_n = (size_t)layers * kKvHeads * md.seq * kHs;
    std::vector<__half> kc(cache_n), vc(cache_n);
    for (size_t i = 0; i < cache_n; i++) kc[i] = __float2half(2.0f * g.uniform() - 1.0f), vc[i] = __float2half(2.0f * g.uniform() - 1.0f);
    float cosv[kHs / 2], sinv[kHs / 2];
    for (int i = 0; i < kHs / 2; i++) {
        const float f = 1.0f / powf(10000.0f, 2.0f * i / kHs), angle = pos * f;
        cosv[i] = cosf(angle), sinv[i] = sinf(angle);
    }
    CK(cudaMemcpyToSymbol(c_cos, cosv, sizeof cosv));
    CK(cudaMemcpyToSymbol(c_sin, sinv, sizeof sinv));
    CK(cudaMalloc(&md.kc, cache_n * 2));
    CK(cudaMalloc(&md.vc, cache_n * 2));
    CK(cudaMemcpy(md.kc, kc.data(), cache_n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(md.vc, vc.data(), cache_n * 2, cudaMemcpyHostToDevice));
    md.kv.resize((size_t)layers * kKvHeads * 2 * kHs);
    md.ref = reference(md.w, md.emb, kc, vc, pos, md.seq, cosv, sinv, &md.kv);
    int failed = 0;
    for (int i = 0; i < 3; i++)
        if (fit[i] >= kKvHeads) failed |= run_config(md, sizes[i], fit[i]);
    return failed;
}

}  // namespace

int main(int argc, char **argv) {
    const int layers = argc > 1 ? atoi(argv[1]) : 22, pos = argc > 2 ? atoi(argv[2]) : 256, only = argc > 3 ? atoi(argv[3]) : 0;
    if (argc > 4 || layers < 2 || layers > 64 || pos < 1 || pos > kMaxPos || (only && only != 4 && only != 8 && only != 16))
        return fprintf(stderr, "usage: split_probe [layers, 2-64] [position, 1-%d] [blocks a cluster: 4, 8 or 16; all by default]\n", kMaxPos), 2;
    return probe_main(layers, pos, only);
}
