// vec_kernels.h: the bodies of vec.c's kernels, included once per instruction set with
// ISA_NAME(x) naming that instance (vec.c). No include guard: that is the point.

// Loops over the tile's rows and tokens are unrolled so that its accumulators stay in registers.
#define UNROLL _Pragma("GCC unroll 16")

// Every helper gets the instance's suffix too.
#define load_f32 ISA_NAME(load_f32)
#define load_i8 ISA_NAME(load_i8)
#define tile_f32 ISA_NAME(tile_f32)
#define hsum16 ISA_NAME(hsum16)
#define hsum8 ISA_NAME(hsum8)
#define hsum_levels ISA_NAME(hsum_levels)
#define rows_q8 ISA_NAME(rows_q8)
#define dequant_rows ISA_NAME(dequant_rows)
#define store ISA_NAME(store)
#define tile_rows_f32 ISA_NAME(tile_rows_f32)
#define row_f32 ISA_NAME(row_f32)
#define splat ISA_NAME(splat)
#define f32v ISA_NAME(f32v)
#define i8v ISA_NAME(i8v)
#define i32v ISA_NAME(i32v)

typedef float f32v __attribute__((vector_size(LANES * sizeof(float))));
typedef int8_t i8v __attribute__((vector_size(LANES)));
typedef int32_t i32v __attribute__((vector_size(LANES * sizeof(int32_t))));

static inline __attribute__((always_inline)) f32v load_f32(const float *p) {
    f32v v;
    memcpy(&v, p, sizeof v);
    return v;
}
// LANES int8 widened to float. GCC scalarises the generic conversion, so where the instruction set is
// known the widening is spelled out: one vpmovsxbd.
static inline __attribute__((always_inline)) f32v load_i8(const int8_t *p) {
#if defined(__AVX512F__) && LANES == 16
    return (f32v)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#elif defined(__AVX2__) && LANES == 8
    return (f32v)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#else
    i8v b;
    memcpy(&b, p, sizeof b);
    return __builtin_convertvector(__builtin_convertvector(b, i32v), f32v);
#endif
}
// c + a * b, lane by lane: rounded once (a fused multiply-add) where the instruction set has one,
// else twice (a macro, as hsum is). Spelled out because vec.c is compiled without contraction:
// whether a compiler fuses a product into an add is its own choice (it differs between versions,
// tunings and optimisation levels), and two kernels that fuse differently give a token other bits
// in a tile than alone. The columns past the last whole vector (a few) are products and sums
// rounded apart: written as fmaf, their scalar loops cost the tiles' time (bench/NOTES.md 203).
#if defined(__AVX512F__) && LANES == 16
#define fmadd(a, b, c) ((f32v)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#elif defined(__AVX2__) && defined(__FMA__) && LANES == 8
#define fmadd(a, b, c) ((f32v)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#elif defined(__aarch64__) && LANES == 4
#define fmadd(a, b, c) ((f32v)vfmaq_f32((float32x4_t)(c), (float32x4_t)(a), (float32x4_t)(b)))
#elif defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define fmadd(a, b, c) ({                                                         \
    const f32v a_ = (a), b_ = (b), c_ = (c);                                     \
    f32v r_;                                                                     \
    UNROLL for (int l_ = 0; l_ < LANES; l_++) r_[l_] = __builtin_fmaf(a_[l_], b_[l_], c_[l_]); \
    r_;                                                                          \
})
#else
#define fmadd(a, b, c) ((a) * (b) + (c))
#endif
static inline __attribute__((always_inline)) f32v splat(float a) {
    f32v v;
    UNROLL for (int l = 0; l < LANES; l++) v[l] = a;
    return v;
}

// Pairwise: lanes i and i + w for w = LANES / 2, ..., 2, 1 (halves added as vectors). Macros, not
// functions: a 64-byte vector argument draws an ABI note on SSE2, and through a pointer the
// accumulators would leave the registers.
#define hsum_x4(h4) ({                                                                                        \
    const f32x4 h4_ = (h4);                                                                                  \
    const f32x2 h2_ = __builtin_shufflevector(h4_, h4_, 0, 1) + __builtin_shufflevector(h4_, h4_, 2, 3);       \
    h2_[0] + h2_[1];                                                                                         \
})
#define hsum_x8(h8) ({                                                                                        \
    const f32x8 h8_ = (h8);                                                                                  \
    hsum_x4(__builtin_shufflevector(h8_, h8_, 0, 1, 2, 3) + __builtin_shufflevector(h8_, h8_, 4, 5, 6, 7));   \
})
#if LANES == 4
#define hsum(v) hsum_x4((f32x4)(v))
#elif LANES == 8
#define hsum(v) hsum_x8((f32x8)(v))
#else
#define hsum(v) ({                                                                                           \
    const f32v hv_ = (v);                                                                                    \
    hsum_x8(__builtin_shufflevector(hv_, hv_, 0, 1, 2, 3, 4, 5, 6, 7) +                                        \
            __builtin_shufflevector(hv_, hv_, 8, 9, 10, 11, 12, 13, 14, 15));                                  \
})
#endif

#if LANES == 16
// hsum's first three levels for n vectors (n / 8 left): each level merges two vectors' halves into
// one (two permutes and an add).
static inline __attribute__((always_inline)) void hsum_levels(const f32v *v, int n, f32v *out) {
    f32v a[8], b[4];
    UNROLL for (int j = 0; j < n / 2; j++)
        a[j] = __builtin_shufflevector(v[2 * j], v[2 * j + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(v[2 * j], v[2 * j + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    UNROLL for (int j = 0; j < n / 4; j++)
        b[j] = __builtin_shufflevector(a[2 * j], a[2 * j + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
               __builtin_shufflevector(a[2 * j], a[2 * j + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    UNROLL for (int j = 0; j < n / 8; j++)
        out[j] = __builtin_shufflevector(b[2 * j], b[2 * j + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
                 __builtin_shufflevector(b[2 * j], b[2 * j + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
}

// sums[i] = hsum(v[i]) for 16 vectors at once, by the same additions: at each level of hsum's tree
// two vectors' halves are merged into one (two permutes and an add), so that the 16 sums take 45
// instructions where 16 hsums take about 130 (as many as a 288-long dot product's loop, in a
// prefill tile's epilogue: bench/NOTES.md 50). Level by level: lanes i and
// i + 8 of vectors 2j and 2j + 1 into one vector's halves; then within each half lanes i and
// i + 4; then i and i + 2; then i and i + 1. Lane L of the last holds v[L bit-reversed]'s sum.
static inline __attribute__((always_inline)) void hsum16(const f32v v[16], float sums[16]) {
    f32v c[2];
    hsum_levels(v, 16, c);
    const f32v d = __builtin_shufflevector(c[0], c[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
                   __builtin_shufflevector(c[0], c[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    static const unsigned char bit_reversed[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    UNROLL for (int l = 0; l < 16; l++) sums[bit_reversed[l]] = d[l];
}

// sums[i] = hsum(v[i]) for 8 vectors: hsum16's first three levels on half as many vectors, then
// its last level within the one vector left (lanes 2i and 2i + 1): the same additions. Lane i of
// the result holds v[order[i]]'s sum.
static inline __attribute__((always_inline)) void hsum8(const f32v v[8], float sums[8]) {
    f32v c;
    hsum_levels(v, 8, &c);
    const f32x8 d = __builtin_shufflevector(c, c, 0, 2, 4, 6, 8, 10, 12, 14) + __builtin_shufflevector(c, c, 1, 3, 5, 7, 9, 11, 13, 15);
    static const unsigned char order[8] = {0, 4, 2, 6, 1, 5, 3, 7};
    UNROLL for (int l = 0; l < 8; l++) sums[order[l]] = d[l];
}
#endif

// res[r][t] = w[r] . x[t] over K, for ROWS rows and T tokens (T a constant where inlined).
static inline __attribute__((always_inline)) void tile_f32(const float *const w[ROWS], const float *const x[TOKENS], int T, int K, float res[ROWS][TOKENS]) {
    f32v acc[ROWS * TOKENS];   // (row, token) at row * TOKENS + token
    UNROLL for (int r = 0; r < ROWS; r++)
        UNROLL for (int t = 0; t < T; t++) acc[r * TOKENS + t] = (f32v){0};
    int k = 0;
    for (; k + LANES <= K; k += LANES) {
        f32v wv[ROWS];
        UNROLL for (int r = 0; r < ROWS; r++) wv[r] = load_f32(w[r] + k);
        UNROLL for (int t = 0; t < T; t++) {
            const f32v xv = load_f32(x[t] + k);
            UNROLL for (int r = 0; r < ROWS; r++) acc[r * TOKENS + t] = fmadd(wv[r], xv, acc[r * TOKENS + t]);
        }
    }
    float sums[ROWS * TOKENS];   // whole tiles: 16 (then 8) at a time by hsum16 (hsum8), the rest one by one (the same bits)
#if LANES == 16
    if (T == TOKENS) {
        int i = 0;
        for (; i + 16 <= ROWS * TOKENS; i += 16) hsum16(acc + i, sums + i);
        if (i + 8 <= ROWS * TOKENS) hsum8(acc + i, sums + i), i += 8;
        UNROLL for (; i < ROWS * TOKENS; i++) sums[i] = hsum(acc[i]);
    } else
#endif
        UNROLL for (int r = 0; r < ROWS; r++)
            UNROLL for (int t = 0; t < T; t++) sums[r * TOKENS + t] = hsum(acc[r * TOKENS + t]);
    for (int r = 0; r < ROWS; r++)
        UNROLL for (int t = 0; t < T; t++) {
            float s = sums[r * TOKENS + t];
            for (int j = k; j < K; j++) s += w[r][j] * x[t][j];
            res[r][t] = s;
        }
}

// One row against one token: tile_f32's arithmetic for that (row, token), the same accumulator and
// sum, with the row streamed alone and no software prefetch: decode reads FP32 weights faster as
// one sequential stream than as tiles of 4 interleaved rows (bench/NOTES.md 42).
static inline __attribute__((always_inline)) float row_f32(const float *w, const float *x, int K) {
    f32v acc = {0};
    int k = 0;
    for (; k + LANES <= K; k += LANES) acc = fmadd(load_f32(w + k), load_f32(x + k), acc);
    float s = hsum(acc);
    for (int j = k; j < K; j++) s += w[j] * x[j];
    return s;
}

// res[r] = W[r] . x for ROWS INT8 rows q[r] with scales s[r], dequantized in registers: each
// vector of LANES lies in one group (gs a multiple of LANES), w = q * scale is rounded to float as
// dequant_rows rounds it, then multiplied with x as tile_f32 does: bit for bit the same result.
static inline __attribute__((always_inline)) void rows_q8(const int8_t *const q[ROWS], const float *const s[ROWS], int K, int gs, const float *x, float res[ROWS]) {
    f32v acc[ROWS];
    UNROLL for (int r = 0; r < ROWS; r++) acc[r] = (f32v){0};
    int k = 0;
    for (int g = 0, group_end = gs; k + LANES <= K; k += LANES) {
        if (k == group_end) g++, group_end += gs;
        const f32v xv = load_f32(x + k);
        UNROLL for (int r = 0; r < ROWS; r++) __builtin_prefetch(q[r] + k + PREFETCH_INT8);
        UNROLL for (int r = 0; r < ROWS; r++) {
            const f32v wv = load_i8(q[r] + k) * s[r][g];
            acc[r] = fmadd(wv, xv, acc[r]);
        }
    }
    UNROLL for (int r = 0; r < ROWS; r++) {
        float sum = hsum(acc[r]);
        for (int j = k; j < K; j++) {
            const float w = q[r][j] * s[r][j / gs];
            sum += w * x[j];
        }
        res[r] = sum;
    }
}

// Rows r0 .. r0 + ROWS - 1 of an INT8 matrix as floats, w[r][c] = q[r][c] * s[r][c / gs].
static inline __attribute__((always_inline)) void dequant_rows(const Mat *w, const int rows[ROWS], float *dst) {
    for (int i = 0; i < ROWS; i++) {
        const int8_t *q = w->q + (size_t)rows[i] * w->stride;
        const float *s = w->s + (size_t)rows[i] * w->groups;
        float *d = dst + (size_t)i * w->cols;
        for (int lo = 0, g = 0; lo < w->cols; lo += w->gs, g++) {
            const int hi = lo + w->gs < w->cols ? lo + w->gs : w->cols;
            for (int c = lo; c < hi; c++) d[c] = q[c] * s[g];   // rounded to float, as rows_q8 does
        }
    }
}

static inline __attribute__((always_inline)) void store(float *out, size_t at, float v, int accumulate) {
    if (accumulate) out[at] += v;
    else out[at] = v;
}

// One tile of rows (the last tile repeats its last row: computed, not stored) against the tokens
// in groups of up to TOKENS (likewise padded with the group's first token).
static inline __attribute__((always_inline)) void tile_rows_f32(const float *const wr[ROWS], int nr, const int rows[ROWS], const float *in, int M, int K,
                          float *out, int N, int accumulate) {
    if (M == 1) {
        for (int r = 0; r < nr; r++) store(out, rows[r], row_f32(wr[r], in, K), accumulate);
        return;
    }
    for (int t0 = 0; t0 < M; t0 += TOKENS) {
        const int nt = M - t0 < TOKENS ? M - t0 : TOKENS;
        const float *x[TOKENS];
        for (int t = 0; t < TOKENS; t++) x[t] = in + (size_t)(t0 + (t < nt ? t : 0)) * K;
        float res[ROWS][TOKENS];
        if (nt == 1) tile_f32(wr, x, 1, K, res);
        else tile_f32(wr, x, TOKENS, K, res);
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < nt; t++) store(out, (size_t)(t0 + t) * N + rows[r], res[r][t], accumulate);
    }
}

static void ISA_NAME(matmul_slice)(const Mat *w, const float *in, int M, float *out, int accumulate, int lo, int hi, float *scratch) {
    const int K = w->cols, N = w->rows;
    for (int r0 = lo; r0 < hi; r0 += ROWS) {
        const int nr = hi - r0 < ROWS ? hi - r0 : ROWS;
        int rows[ROWS];
        for (int i = 0; i < ROWS; i++) rows[i] = r0 + (i < nr ? i : nr - 1);
        if (!w->f && M < TOKENS && w->gs % LANES == 0) {
            const int8_t *q[ROWS];
            const float *s[ROWS];
            for (int i = 0; i < ROWS; i++) q[i] = w->q + (size_t)rows[i] * w->stride, s[i] = w->s + (size_t)rows[i] * w->groups;
            for (int m = 0; m < M; m++) {
                float res[ROWS];
                rows_q8(q, s, K, w->gs, in + (size_t)m * K, res);
                for (int r = 0; r < nr; r++) store(out, (size_t)m * N + rows[r], res[r], accumulate);
            }
            continue;
        }
        const float *wr[ROWS];
        if (w->f) {
            for (int i = 0; i < ROWS; i++) wr[i] = w->f + (size_t)rows[i] * w->stride;
        } else {
            dequant_rows(w, rows, scratch);
            for (int i = 0; i < ROWS; i++) wr[i] = scratch + (size_t)i * K;
        }
        tile_rows_f32(wr, nr, rows, in, M, K, out, N, accumulate);
    }
}

static float ISA_NAME(dot)(const float *x, const float *y, int n) {
    f32v acc = {0};
    int k = 0;
    for (; k + LANES <= n; k += LANES) acc = fmadd(load_f32(x + k), load_f32(y + k), acc);
    float s = hsum(acc);
    for (; k < n; k++) s += x[k] * y[k];
    return s;
}

// att[t] = (q . k_t) / sqrt(n), k_t = keys + t * stride: dot's arithmetic for each, in one call.
// (16 keys at a time with hsum16 measured slower: the keys' rows are read 16 at once, not one
// after another; bench/NOTES.md 50.)
static void ISA_NAME(scores)(const float *q, const float *keys, size_t stride, int T, int n, float *att) {
    const float root = sqrtf((float)n);
    for (int t = 0; t < T; t++) att[t] = ISA_NAME(dot)(q, keys + (size_t)t * stride, n) / root;
}

// out = sum over t < T, in order, of att[t] * v_t (v_t = values + t * stride), each element
// out = out + a * v from zero, with up to WSUM_VECS vectors of out held in registers across all t
// (one call: no load and store of out, no call, per t).
#define WSUM_VECS 8
static void ISA_NAME(weighted_sum)(float *out, const float *att, const float *values, size_t stride, int T, int n) {
    int c0 = 0;
    for (; c0 + LANES <= n; c0 += WSUM_VECS * LANES) {
        const int nv = (n - c0) / LANES < WSUM_VECS ? (n - c0) / LANES : WSUM_VECS;
        f32v acc[WSUM_VECS];
        UNROLL for (int i = 0; i < WSUM_VECS; i++) acc[i] = (f32v){0};
        for (int t = 0; t < T; t++) {
            const float *v = values + (size_t)t * stride + c0;
            const float a = att[t];
            UNROLL for (int i = 0; i < WSUM_VECS; i++)
                if (i < nv) acc[i] = fmadd(splat(a), load_f32(v + i * LANES), acc[i]);
        }
        UNROLL for (int i = 0; i < WSUM_VECS; i++)
            if (i < nv) memcpy(out + c0 + i * LANES, &acc[i], sizeof acc[i]);
        if (nv < WSUM_VECS) {
            c0 += nv * LANES;
            break;
        }
    }
    for (int j = c0; j < n; j++) {   // the columns past the last whole vector
        float s = 0.0f;
        for (int t = 0; t < T; t++) s += att[t] * values[(size_t)t * stride + j];
        out[j] = s;
    }
}
#undef WSUM_VECS

// Rows of queries i0 .. i0 + TOKENS - 1 of a block (their q, or their scores: row i at base + i *
// stride; past nq: query i0 again, computed, not stored); returns the fewest rows any of them
// attends to, *most the most.
static inline __attribute__((always_inline)) int ISA_NAME(query_group)(const float *base, size_t stride, int i0, int nq, const int *T,
                                                                      const float *x[TOKENS], int *most) {
    int common = T[i0];
    *most = T[i0];
    for (int i = 0; i < TOKENS; i++) {
        const int at = i0 + i < nq ? i0 + i : i0;
        x[i] = base + (size_t)at * stride;
        common = T[at] < common ? T[at] : common, *most = T[at] > *most ? T[at] : *most;
    }
    return common;
}

// vec_scores_block: ROWS keys x TOKENS queries a tile (tile_f32, which is dot's arithmetic for each
// pair), then each query's keys past the tiles one at a time.
static void ISA_NAME(scores_block)(const float *q, size_t q_stride, int nq, const float *keys, size_t stride, const int *T, int n,
                                   float *att, size_t att_stride) {
    const float root = sqrtf((float)n);
    for (int i0 = 0; i0 < nq; i0 += TOKENS) {
        const int ni = nq - i0 < TOKENS ? nq - i0 : TOKENS;
        const float *x[TOKENS];
        int most;
        const int common = ISA_NAME(query_group)(q, q_stride, i0, nq, T, x, &most);
        int t0 = 0;
        for (; t0 + ROWS <= common; t0 += ROWS) {
            const float *w[ROWS];
            UNROLL for (int r = 0; r < ROWS; r++) w[r] = keys + (size_t)(t0 + r) * stride;
            float res[ROWS][TOKENS];
            tile_f32(w, x, TOKENS, n, res);
            for (int i = 0; i < ni; i++)
                UNROLL for (int r = 0; r < ROWS; r++) att[(size_t)(i0 + i) * att_stride + t0 + r] = res[r][i] / root;
        }
        for (int i = 0; i < ni; i++)
            for (int t = t0; t < T[i0 + i]; t++)
                att[(size_t)(i0 + i) * att_stride + t] = ISA_NAME(dot)(x[i], keys + (size_t)t * stride, n) / root;
    }
}

// vec_weighted_sum_block: weighted_sum's accumulation for each query (per lane, in order of t),
// WSB_VECS vectors of columns for all TOKENS queries at a time, so that each value row's vectors
// are loaded once for them; rows every query attends to without a test, the rest with one.
#if defined(__AVX512F__)
#define WSB_VECS 4   // 24 accumulators of the 32 registers with 6 queries
#elif LANES == 8
#define WSB_VECS 4   // 12 accumulators of the 16 registers with 3 queries
#else
#define WSB_VECS 2
#endif
static void ISA_NAME(weighted_sum_block)(float *out, size_t out_stride, const float *att, size_t att_stride, const int *T, int nq,
                                         const float *values, size_t stride, int n) {
    for (int i0 = 0; i0 < nq; i0 += TOKENS) {
        const int ni = nq - i0 < TOKENS ? nq - i0 : TOKENS;
        const float *a[TOKENS];
        int most;
        const int common = ISA_NAME(query_group)(att, att_stride, i0, nq, T, a, &most);
        int c0 = 0;
        for (; c0 + LANES <= n;) {
            const int nv = (n - c0) / LANES < WSB_VECS ? (n - c0) / LANES : WSB_VECS;
            f32v acc[TOKENS][WSB_VECS];
            UNROLL for (int i = 0; i < TOKENS; i++)
                UNROLL for (int v = 0; v < WSB_VECS; v++) acc[i][v] = (f32v){0};
            for (int t = 0; t < most; t++) {
                const float *row = values + (size_t)t * stride + c0;
                f32v vv[WSB_VECS];
                UNROLL for (int v = 0; v < WSB_VECS; v++) vv[v] = v < nv ? load_f32(row + v * LANES) : (f32v){0};
                UNROLL for (int i = 0; i < TOKENS; i++) {
                    if (t >= common && (i >= ni || t >= T[i0 + i])) continue;
                    const float w = a[i][t];
                    UNROLL for (int v = 0; v < WSB_VECS; v++)
                        if (v < nv) acc[i][v] = fmadd(splat(w), vv[v], acc[i][v]);
                }
            }
            for (int i = 0; i < ni; i++)
                UNROLL for (int v = 0; v < WSB_VECS; v++)
                    if (v < nv) memcpy(out + (size_t)(i0 + i) * out_stride + c0 + v * LANES, &acc[i][v], sizeof acc[i][v]);
            c0 += nv * LANES;
        }
        for (int i = 0; i < ni; i++)   // the columns past the last whole vector, as weighted_sum
            for (int j = c0; j < n; j++) {
                float s = 0.0f;
                for (int t = 0; t < T[i0 + i]; t++) s += a[i][t] * values[(size_t)t * stride + j];
                out[(size_t)(i0 + i) * out_stride + j] = s;
            }
    }
}
#undef WSB_VECS

// x[i] = expf(x[i] - sub), i < n, with the operations of glibc's expf (2.27 on; its FMA variant,
// the one glibc runs where the CPU has FMA, which every instance with vector code here has), in
// double precision, VEXP lanes at a time: x * 32 / ln 2 = k + r, |r| <= 1/2; 2^(k/32) from the
// table's 2^(i/32), i = k mod 32, with k / 32 added to its exponent; 2^(r/32) by a cubic. Lanes
// outside glibc's main path (|x| >= 88 by its exponent test, infinities, NaN) take expf itself.
// So the results are expf's bit for bit (the tests check it against the platform's expf).
#if defined(__AVX512F__)
#define VEXP 8
#define vexp_d __m512d
#define vexp_i __m512i
#define vexp_set(v) _mm512_set1_pd(v)
#define vexp_seti(v) _mm512_set1_epi64(v)
#define vexp_f __m256   // VEXP floats
#define vexp_loadf(p, sub) _mm256_sub_ps(_mm256_loadu_ps(p), _mm256_set1_ps(sub))
#define vexp_storef(p, v) _mm256_storeu_ps(p, v)
#define vexp_widen(v) _mm512_cvtps_pd(v)
#define vexp_special(v) _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(v), 20), _mm256_set1_epi32(0x7ff)), _mm256_set1_epi32(EXP_ABSTOP_88 - 1))))
#define vexp_narrow(p, y) _mm256_storeu_ps(p, _mm512_cvtpd_ps(y))
#define vexp_fma(a, b, c) _mm512_fmadd_pd(a, b, c)
#define vexp_fms(a, b, c) _mm512_fmsub_pd(a, b, c)
#define vexp_gather(idx) _mm512_i64gather_epi64(idx, (const void *)exp2_32, 8)
#define vexp_slli(v, n) _mm512_slli_epi64(v, n)
#define vexp_addi(a, b) _mm512_add_epi64(a, b)   // intrinsics: wrapping, where + on the vector type is signed
#define vexp_subi(a, b) _mm512_sub_epi64(a, b)
#define vexp_andi(a, b) _mm512_and_si512(a, b)
#define vexp_ibits(v) _mm512_castpd_si512(v)
#define vexp_dbits(v) _mm512_castsi512_pd(v)
#elif defined(__AVX2__) && defined(__FMA__)
#define VEXP 4
#define vexp_d __m256d
#define vexp_i __m256i
#define vexp_set(v) _mm256_set1_pd(v)
#define vexp_seti(v) _mm256_set1_epi64x(v)
#define vexp_f __m128
#define vexp_loadf(p, sub) _mm_sub_ps(_mm_loadu_ps(p), _mm_set1_ps(sub))
#define vexp_storef(p, v) _mm_storeu_ps(p, v)
#define vexp_widen(v) _mm256_cvtps_pd(v)
#define vexp_special(v) _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(_mm_and_si128(_mm_srli_epi32(_mm_castps_si128(v), 20), _mm_set1_epi32(0x7ff)), _mm_set1_epi32(EXP_ABSTOP_88 - 1))))
#define vexp_narrow(p, y) _mm_storeu_ps(p, _mm256_cvtpd_ps(y))
#define vexp_fma(a, b, c) _mm256_fmadd_pd(a, b, c)
#define vexp_fms(a, b, c) _mm256_fmsub_pd(a, b, c)
#define vexp_gather(idx) _mm256_i64gather_epi64((const long long *)exp2_32, idx, 8)
#define vexp_slli(v, n) _mm256_slli_epi64(v, n)
#define vexp_addi(a, b) _mm256_add_epi64(a, b)
#define vexp_subi(a, b) _mm256_sub_epi64(a, b)
#define vexp_andi(a, b) _mm256_and_si256(a, b)
#define vexp_ibits(v) _mm256_castpd_si256(v)
#define vexp_dbits(v) _mm256_castsi256_pd(v)
#endif

static void ISA_NAME(exp_sub)(float *x, int n, float sub) {
    int i = 0;
#ifdef VEXP
    const vexp_d inv_ln2_32 = vexp_set(EXP_INV_LN2_32), shift = vexp_set(EXP_SHIFT), one = vexp_set(1.0);
    const vexp_d c0 = vexp_set(EXP_C0), c1 = vexp_set(EXP_C1), c2 = vexp_set(EXP_C2);
    for (; i + VEXP <= n; i += VEXP) {
        const vexp_f xf = vexp_loadf(x + i, sub);   // x - sub in float, as expf(x[i] - sub) has it
        const int special = vexp_special(xf);       // lanes off glibc's main path
        const vexp_d xd = vexp_widen(xf);
        vexp_d kd = vexp_fma(inv_ln2_32, xd, shift);   // k in the low bits: z + 1.5 * 2^52 rounded
        const vexp_i ki = vexp_ibits(kd);
        kd = kd - shift;
        const vexp_d r = vexp_fms(inv_ln2_32, xd, kd);
        const vexp_i idx = vexp_andi(ki, vexp_seti(31));
        const vexp_d s = vexp_dbits(vexp_addi(vexp_gather(idx), vexp_slli(vexp_subi(ki, idx), 47)));   // 2^(i/32) * 2^(k div 32)
        const vexp_d z = vexp_fma(r, c0, c1), r2 = r * r;
        vexp_d y = vexp_fma(r, c2, one);
        y = vexp_fma(z, r2, y);
        vexp_narrow(x + i, y * s);
        if (special) {
            float d[VEXP];
            vexp_storef(d, xf);
            for (int l = 0; l < VEXP; l++)
                if (special >> l & 1) x[i + l] = expf(d[l]);
        }
    }
#endif
    for (; i < n; i++) x[i] = expf(x[i] - sub);
}
#ifdef VEXP
#undef VEXP
#undef vexp_d
#undef vexp_i
#undef vexp_set
#undef vexp_f
#undef vexp_loadf
#undef vexp_storef
#undef vexp_special
#undef vexp_seti
#undef vexp_widen
#undef vexp_narrow
#undef vexp_fma
#undef vexp_fms
#undef vexp_gather
#undef vexp_slli
#undef vexp_addi
#undef vexp_subi
#undef vexp_andi
#undef vexp_ibits
#undef vexp_dbits
#endif

#undef UNROLL
#undef load_f32
#undef load_i8
#undef tile_f32
#undef hsum16
#undef hsum8
#undef hsum_levels
#undef rows_q8
#undef dequant_rows
#undef store
#undef tile_rows_f32
#undef row_f32
#undef fmadd
#undef splat
#undef hsum
#undef hsum_x8
#undef hsum_x4
#undef f32v
#undef i8v
#undef i32v
