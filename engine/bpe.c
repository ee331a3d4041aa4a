// bpe.c: the tokenizer behind bpe.h, in the order Hugging Face tokenizers runs it:
//   build      the spec's arrays -> hash maps (string -> id, (left, right) -> rank), two tries
//              of added tokens, a copy of the pipeline
//   added      added tokens split the text first (leftmost-longest, as its Aho-Corasick does)
//   normalize  NFC, Prepend, Replace
//   pre        the pre-tokenizer steps, each splitting pieces further; the regexes are scanners
//   model      BPE on one piece: a heap of candidate merges by (rank, position), as tokenizers'
//              Word::merge_all; O(m log m) for a piece of m characters
//   decode     token -> bytes through the decoder steps; a stream that holds back split UTF-8
#include "bpe.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"   // ERR_LEN
#include "unicode.h"
#include "util.h"

static void *xrealloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) {
        fprintf(stderr, "run: out of memory allocating %zu bytes\n", bytes);
        exit(1);
    }
    return q;
}

// Grows *p (elements of elem bytes, capacity *cap) to hold at least need.
static void reserve(void *p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    *(void **)p = xrealloc(*(void **)p, c * elem);
    *cap = c;
}

// ---------------------------------------------------------------- the tokenizer
typedef struct {
    int child, sibling;   // first child, next sibling (-1: none)
    int added;            // index into Bpe.added of the token ending here, or -1
    unsigned char byte;
} TrieNode;

typedef struct {
    TrieNode *node;
    size_t n, cap;
    int root[256];        // the first level, by byte: most text positions fail here at once
} Trie;

typedef struct {
    int id;
    BpeStr content;
    int special, lstrip, rstrip, single_word;
} Added;

struct Bpe {
    int n_tokens;             // ids are below this
    int n_vocab;              // the model's vocabulary: ids below this that are not holes
    BpeStr *vocab;            // (n_vocab) the model vocabulary's strings, as the file writes them
    BpeStr *str;              // (n_tokens) each id's string: the added token's content, else vocab's
    unsigned char *special;   // (n_tokens) a special added token
    char *arena;              // every string above
    int *vocab_slot;          // open addressing: model vocabulary string -> id (-1: empty)
    uint32_t vocab_mask;
    uint64_t *pair_key;       // open addressing: left << 32 | right (UINT64_MAX: empty) ...
    int *pair_rank, *pair_new;   // ... -> the merge's rank and the token it makes
    uint32_t pair_mask;
    int byte_level;           // a ByteLevel pre-tokenizer: pieces are seen in GPT-2's byte alphabet
    int byte_sym[256];        // byte-level: the id of each byte's alphabet character, or -1
    int byte_token[256];      // the id of "<0xXX>", or -1
    int alpha_byte[324];      // GPT-2 alphabet code point -> byte, or -1
    uint32_t byte_cp[256];    // byte -> GPT-2 alphabet code point
    int byte_fallback, ignore_merges, unk_id, fuse_unk;
    Added *added;
    int n_added;
    Trie raw_trie, norm_trie; // added tokens matched in the raw / the normalized text
    BpeNorm norm[BPE_MAX_STEPS];
    int n_norm;
    BpePre pre[BPE_MAX_STEPS];
    int n_pre;
    BpeDec dec[BPE_MAX_STEPS];
    int n_dec;
    int prefix[BPE_MAX_AFFIX], n_prefix, suffix[BPE_MAX_AFFIX], n_suffix;
    char *pieces;             // each token's decoded text (bpe_piece), not first then first:
    size_t *piece_at;         // (2 n_tokens) where in pieces
    int *piece_len;           // (2 n_tokens) and how long
    int max_piece;
};

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;   // FNV-1a
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ h >> 29;
}

static uint64_t hash_pair(uint64_t k) {
    k ^= k >> 33;   // murmur3's finalizer: ids differ in their low bits only
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    return k ^ k >> 33;
}

static uint32_t table_size(size_t n) {
    uint32_t size = 16;
    while (size < 2 * n) size *= 2;
    return size;
}

// The model vocabulary's id for s, or -1.
static int vocab_id(const Bpe *b, const char *s, size_t n) {
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & b->vocab_mask;; i = (i + 1) & b->vocab_mask) {
        int id = b->vocab_slot[i];
        if (id < 0) return -1;
        if ((size_t)b->vocab[id].len == n && memcmp(b->vocab[id].s, s, n) == 0) return id;
    }
}

// The slot of merge (l, r): where it is, or the empty slot where it would go.
static uint32_t pair_slot(const Bpe *b, int l, int r) {
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    uint32_t i = (uint32_t)hash_pair(key) & b->pair_mask;
    while (b->pair_key[i] != UINT64_MAX && b->pair_key[i] != key) i = (i + 1) & b->pair_mask;
    return i;
}

// The id that merging l and r makes (its rank in *rank), or -1.
static int pair_merge(const Bpe *b, int l, int r, int *rank) {
    uint32_t i = pair_slot(b, l, r);
    if (b->pair_key[i] == UINT64_MAX) return -1;
    *rank = b->pair_rank[i];
    return b->pair_new[i];
}

int bpe_n_tokens(const Bpe *b) { return b->n_tokens; }
int bpe_max_piece(const Bpe *b) { return b->max_piece; }
int bpe_is_special(const Bpe *b, int id) { return id >= 0 && id < b->n_tokens && b->special[id]; }

const char *bpe_token_str(const Bpe *b, int id, int *len) {
    if (id < 0 || id >= b->n_tokens || !b->str[id].s) return *len = 0, NULL;
    *len = b->str[id].len;
    return b->str[id].s;
}

int bpe_find(const Bpe *b, const char *s, size_t len) {
    for (int i = b->n_added - 1; i >= 0; i--)
        if ((size_t)b->added[i].content.len == len && memcmp(b->added[i].content.s, s, len) == 0) return b->added[i].id;
    return vocab_id(b, s, len);
}

void bpe_free(Bpe *b) {
    if (!b) return;
    free(b->vocab);
    free(b->str);
    free(b->special);
    free(b->arena);
    free(b->vocab_slot);
    free(b->pair_key);
    free(b->pair_rank);
    free(b->pair_new);
    free(b->added);
    free(b->raw_trie.node);
    free(b->norm_trie.node);
    free(b->pieces);
    free(b->piece_at);
    free(b->piece_len);
    free(b);
}

// ---------------------------------------------------------------- building
// Copies of every string the tokenizer keeps, in one allocation sized in advance.
typedef struct {
    char *base;
    size_t used, cap;
} Arena;

static BpeStr arena_copy(Arena *a, BpeStr s) {
    BpeStr out = {a->base + a->used, s.len};
    if (s.len) memcpy(a->base + a->used, s.s, s.len);
    a->used += (size_t)s.len + 1;   // NUL-terminated, for the caller's convenience
    a->base[a->used - 1] = '\0';
    return out;
}

static size_t steps_bytes(const BpeSpec *sp) {
    size_t n = 0;
    for (int i = 0; i < sp->n_norm; i++) n += (size_t)sp->norm[i].a.len + sp->norm[i].b.len + 2;
    for (int i = 0; i < sp->n_pre; i++) n += (size_t)sp->pre[i].replacement.len + 1;
    for (int i = 0; i < sp->n_dec; i++) n += (size_t)sp->dec[i].a.len + sp->dec[i].b.len + 2;
    return n;
}

static int build_fail(Bpe *b, char *err, const char *fmt, const char *what, long i) {
    snprintf(err, ERR_LEN, fmt, what, i);
    bpe_free(b);
    return -1;
}

static int check_str(BpeStr s, int may_be_empty) {
    return s.len >= 0 && s.len <= BPE_MAX_PIECE && (s.s || !s.len) && (may_be_empty || s.len > 0);
}

static int short_str(BpeStr s, int may_be_empty) { return check_str(s, may_be_empty) && s.len <= 64; }

// How many times longer a replacement can make a text.
static int growth(BpeStr a, BpeStr b) { return b.len > a.len ? (b.len + a.len - 1) / a.len : 1; }

// The steps' types and strings: short, patterns not empty; together the steps may make a text at
// most 64 times longer (NFC alone: 3).
static const char *check_steps(const BpeSpec *sp, long *at) {
    int grow = 1;
    for (int i = 0; i < sp->n_norm; i++) {
        const BpeNorm *s = &sp->norm[i];
        if (s->type < BPE_NORM_NFC || s->type > BPE_NORM_REPLACE) return *at = i, "normalizer step %s%ld: unknown type";
        if (!short_str(s->a, s->type != BPE_NORM_REPLACE) || !short_str(s->b, 1)) return *at = i, "normalizer step %s%ld: a string is too long, or the pattern empty";
        grow *= s->type == BPE_NORM_NFC ? 3 : s->type == BPE_NORM_REPLACE ? growth(s->a, s->b) : 2;
        if (grow > 64) return *at = i, "normalizer step %s%ld: the steps could make a text over 64 times longer";
    }
    for (int i = 0; i < sp->n_pre; i++) {
        const BpePre *s = &sp->pre[i];
        if (s->type < BPE_PRE_SPLIT || s->type > BPE_PRE_METASPACE) return *at = i, "pre-tokenizer step %s%ld: unknown type";
        if (s->type == BPE_PRE_SPLIT && (s->pattern < BPE_PAT_GPT2 || s->pattern > BPE_PAT_DIGITS3)) return *at = i, "pre-tokenizer step %s%ld: unknown pattern";
        if (s->type == BPE_PRE_METASPACE && (!short_str(s->replacement, 0) || s->prepend < BPE_PREPEND_NEVER || s->prepend > BPE_PREPEND_ALWAYS))
            return *at = i, "pre-tokenizer step %s%ld: Metaspace needs a replacement and a known prepend scheme";
    }
    grow = 1;
    for (int i = 0; i < sp->n_dec; i++) {
        const BpeDec *s = &sp->dec[i];
        if (s->type < BPE_DEC_BYTE_LEVEL || s->type > BPE_DEC_METASPACE) return *at = i, "decoder step %s%ld: unknown type";
        int needs_a = s->type == BPE_DEC_REPLACE || s->type == BPE_DEC_STRIP || s->type == BPE_DEC_METASPACE;
        if (!short_str(s->a, !needs_a) || !short_str(s->b, 1) || s->start < 0 || s->start > 64) return *at = i, "decoder step %s%ld: a string is too long, the pattern empty, or the strip count out of [0, 64]";
        grow *= s->type == BPE_DEC_REPLACE ? growth(s->a, s->b) : 1;
        if (grow > 64) return *at = i, "decoder step %s%ld: the steps could make a token over 64 times longer";
    }
    return NULL;
}

// Every count, length and id in range before anything is copied. Messages are formats of
// ("", a number): the count or index at fault.
static int check_spec(const BpeSpec *sp, char *err) {
    const char *bad = NULL;
    long at = -1;
    if (sp->n_vocab < 0 || sp->n_vocab > BPE_MAX_TOKENS || (sp->n_vocab && !sp->vocab)) bad = "vocabulary size %s%ld is out of range", at = sp->n_vocab;
    else if (sp->n_merges < 0 || (sp->n_merges && !sp->merges)) bad = "merge count %s%ld is out of range", at = sp->n_merges;
    else if (sp->n_added < 0 || (sp->n_added && !sp->added) || sp->n_added > BPE_MAX_TOKENS) bad = "added token count %s%ld is out of range", at = sp->n_added;
    else if (sp->n_norm < 0 || sp->n_norm > BPE_MAX_STEPS || sp->n_pre < 0 || sp->n_pre > BPE_MAX_STEPS || sp->n_dec < 0 ||
             sp->n_dec > BPE_MAX_STEPS || sp->n_prefix < 0 || sp->n_prefix > BPE_MAX_AFFIX || sp->n_suffix < 0 || sp->n_suffix > BPE_MAX_AFFIX)
        bad = "a step or affix count is out of range%s%.0ld", at = 0;
    else bad = check_steps(sp, &at);
    for (int i = 0; !bad && i < sp->n_vocab; i++)
        if (!check_str(sp->vocab[i], 1)) bad = "vocabulary token %s%ld: length out of range", at = i;
        else if (sp->scores && !sp->n_merges && !(sp->scores[i] > -1e30f && sp->scores[i] < 1e30f)) bad = "vocabulary token %s%ld: score not finite", at = i;
    for (int i = 0; !bad && i < 2 * sp->n_merges; i++)
        if (!check_str(sp->merges[i], 0)) bad = "merge %s%ld: a side is empty or too long", at = i / 2;
    for (int i = 0; !bad && i < sp->n_added; i++)
        if (!check_str(sp->added[i].content, 0) || sp->added[i].id < 0 || sp->added[i].id >= BPE_MAX_TOKENS)
            bad = "added token %s%ld: empty, too long, or its id out of range", at = i;
    if (bad) snprintf(err, ERR_LEN, bad, "", at);
    return bad ? -1 : 0;
}

static void gpt2_alphabet(Bpe *b) {
    int extra = 0;
    for (int i = 0; i < 324; i++) b->alpha_byte[i] = -1;
    for (int c = 0; c < 256; c++) {
        int printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174;
        b->byte_cp[c] = printable ? (uint32_t)c : (uint32_t)(256 + extra++);
        b->alpha_byte[b->byte_cp[c]] = c;
    }
}

static int is_byte_level(const BpeSpec *sp) {
    for (int i = 0; i < sp->n_pre; i++)
        if (sp->pre[i].type == BPE_PRE_BYTE_LEVEL) return 1;
    return 0;
}

static void build_strings(Bpe *b, const BpeSpec *sp) {
    size_t bytes = steps_bytes(sp) + 1;
    b->n_tokens = sp->n_vocab;
    for (int i = 0; i < sp->n_vocab; i++) bytes += (size_t)sp->vocab[i].len + 1;
    for (int i = 0; i < sp->n_added; i++) {
        bytes += (size_t)sp->added[i].content.len + 1;
        if (sp->added[i].id >= b->n_tokens) b->n_tokens = sp->added[i].id + 1;
    }
    Arena a = {xcalloc(bytes, 1), 0, bytes};
    b->arena = a.base;
    b->str = xcalloc(b->n_tokens ? b->n_tokens : 1, sizeof(BpeStr));
    b->special = xcalloc(b->n_tokens ? b->n_tokens : 1, 1);
    b->vocab = xcalloc(sp->n_vocab ? sp->n_vocab : 1, sizeof(BpeStr));
    for (int i = 0; i < sp->n_vocab; i++)
        if (sp->vocab[i].s) b->str[i] = b->vocab[i] = arena_copy(&a, sp->vocab[i]);
    b->added = xcalloc(sp->n_added ? sp->n_added : 1, sizeof(Added));
    for (int i = 0; i < sp->n_added; i++) {
        const BpeAdded *x = &sp->added[i];
        Added *y = &b->added[b->n_added++];
        *y = (Added){x->id, arena_copy(&a, x->content), x->special, x->lstrip, x->rstrip, x->single_word};
        b->str[x->id] = y->content;   // as tokenizers' id_to_token: the added token's content first
        b->special[x->id] |= (unsigned char)(x->special != 0);
    }
    memcpy(b->norm, sp->norm, sizeof b->norm);
    memcpy(b->pre, sp->pre, sizeof b->pre);
    memcpy(b->dec, sp->dec, sizeof b->dec);
    b->n_norm = sp->n_norm, b->n_pre = sp->n_pre, b->n_dec = sp->n_dec;
    for (int i = 0; i < b->n_norm; i++) b->norm[i].a = arena_copy(&a, b->norm[i].a), b->norm[i].b = arena_copy(&a, b->norm[i].b);
    for (int i = 0; i < b->n_pre; i++) b->pre[i].replacement = arena_copy(&a, b->pre[i].replacement);
    for (int i = 0; i < b->n_dec; i++) b->dec[i].a = arena_copy(&a, b->dec[i].a), b->dec[i].b = arena_copy(&a, b->dec[i].b);
}

// The model vocabulary's hash: ids in the vocabulary's id range, holes skipped. A string twice
// would leave one of its ids unreachable: refused.
static int build_vocab(Bpe *b, const BpeSpec *sp, char *err) {
    b->n_vocab = sp->n_vocab;
    uint32_t size = table_size((size_t)sp->n_vocab);
    b->vocab_mask = size - 1;
    b->vocab_slot = xcalloc(size, sizeof(int));
    memset(b->vocab_slot, 0xff, size * sizeof(int));
    for (int id = 0; id < sp->n_vocab; id++) {
        const BpeStr *s = &sp->vocab[id];
        if (!s->s) continue;
        uint32_t i = (uint32_t)hash_bytes(s->s, s->len) & b->vocab_mask;
        for (; b->vocab_slot[i] >= 0; i = (i + 1) & b->vocab_mask) {
            const BpeStr *t = &sp->vocab[b->vocab_slot[i]];
            if (t->len == s->len && memcmp(t->s, s->s, s->len) == 0) {
                snprintf(err, ERR_LEN, "vocabulary: token %d \"%.60s\" is also token %d", id, b->vocab[id].s, b->vocab_slot[i]);
                return -1;
            }
        }
        b->vocab_slot[i] = id;
    }
    return 0;
}

static void pair_tables(Bpe *b, size_t n) {
    uint32_t size = table_size(n);
    b->pair_mask = size - 1;
    b->pair_key = xcalloc(size, sizeof(uint64_t));
    memset(b->pair_key, 0xff, size * sizeof(uint64_t));
    b->pair_rank = xcalloc(size, sizeof(int));
    b->pair_new = xcalloc(size, sizeof(int));
}

// As tokenizers collects merges into a map, a pair listed twice keeps its later rank.
static void pair_put(Bpe *b, int l, int r, int rank, int id) {
    uint32_t i = pair_slot(b, l, r);
    b->pair_key[i] = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    b->pair_rank[i] = rank;
    b->pair_new[i] = id;
}

static int build_merges(Bpe *b, const BpeSpec *sp, char *err) {
    pair_tables(b, (size_t)sp->n_merges);
    char *cat = xcalloc(2 * BPE_MAX_PIECE + 1, 1);
    int rc = 0;
    for (int m = 0; m < sp->n_merges && !rc; m++) {
        BpeStr l = sp->merges[2 * m], r = sp->merges[2 * m + 1];
        int lid = vocab_id(b, l.s, l.len), rid = vocab_id(b, r.s, r.len);
        memcpy(cat, l.s, l.len);
        memcpy(cat + l.len, r.s, r.len);
        int id = vocab_id(b, cat, (size_t)l.len + r.len);
        if (lid < 0 || rid < 0 || id < 0) {
            const char *which = lid < 0 ? "its left side" : rid < 0 ? "its right side" : "the merged token";
            snprintf(err, ERR_LEN, "merge %d (\"%.40s\" \"%.40s\"): %s is not in the vocabulary", m, lid < 0 ? l.s : "",
                     lid < 0 ? "" : r.s, which);
            rc = -1;
        } else pair_put(b, lid, rid, m, id);
    }
    free(cat);
    return rc;
}

// Merges from scores, as transformers derives them for a GGUF "llama" file, which has none
// (generate_merges): every split of a token into two vocabulary tokens is a merge, ranked by the
// token's score, higher first; ties by the left side's length in characters, longer first, then
// the right side's; then token id, left id, right id. Splits fall at UTF-8 character boundaries.
typedef struct {
    float score;
    int lchars, rchars, id, l, r;
} ScoredMerge;

static int by_score(const void *x, const void *y) {
    const ScoredMerge *a = x, *b = y;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->lchars != b->lchars) return a->lchars > b->lchars ? -1 : 1;
    if (a->rchars != b->rchars) return a->rchars > b->rchars ? -1 : 1;
    if (a->id != b->id) return a->id < b->id ? -1 : 1;
    return a->l != b->l ? (a->l < b->l ? -1 : 1) : (a->r > b->r) - (a->r < b->r);
}

static int utf8_chars(const char *s, int n) {
    int c = 0;
    for (int i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static void build_scored_merges(Bpe *b, const BpeSpec *sp) {
    ScoredMerge *m = NULL;
    size_t n = 0, cap = 0;
    for (int id = 0; id < sp->n_vocab; id++) {
        const BpeStr s = b->vocab[id];
        for (int cut = 1; s.s && cut < s.len; cut++) {
            if (((unsigned char)s.s[cut] & 0xC0) == 0x80) continue;
            int l = vocab_id(b, s.s, cut), r = vocab_id(b, s.s + cut, s.len - cut);
            if (l < 0 || r < 0) continue;
            reserve(&m, &cap, n + 1, sizeof *m);
            m[n++] = (ScoredMerge){sp->scores[id], utf8_chars(s.s, cut), utf8_chars(s.s + cut, s.len - cut), id, l, r};
        }
    }
    if (n) qsort(m, n, sizeof *m, by_score);   // m is NULL when no merge was found
    pair_tables(b, n);
    for (size_t i = 0; i < n; i++) pair_put(b, m[i].l, m[i].r, (int)i, m[i].id);
    free(m);
}

static void trie_init(Trie *t) {
    for (int i = 0; i < 256; i++) t->root[i] = -1;
}

static int trie_node(Trie *t, unsigned char byte) {
    reserve(&t->node, &t->cap, t->n + 1, sizeof(TrieNode));
    t->node[t->n] = (TrieNode){-1, -1, -1, byte};
    return (int)t->n++;
}

// The child of node (-1: the root) for byte, made where there is none.
static int trie_child(Trie *t, int node, unsigned char byte) {
    if (node < 0) {
        if (t->root[byte] < 0) t->root[byte] = trie_node(t, byte);
        return t->root[byte];
    }
    int c = t->node[node].child;
    while (c >= 0 && t->node[c].byte != byte) c = t->node[c].sibling;
    if (c < 0) {
        c = trie_node(t, byte);
        t->node[c].sibling = t->node[node].child;
        t->node[node].child = c;
    }
    return c;
}

static void trie_add(Trie *t, const char *s, size_t n, int added) {
    int node = -1;
    for (size_t i = 0; i < n; i++) node = trie_child(t, node, (unsigned char)s[i]);
    t->node[node].added = added;   // a content listed twice: the later token
}

static char *normalize(const Bpe *b, const char *s, size_t n, size_t *out_len);

// Non-normalized added tokens are matched in the raw text; normalized ones by what the
// normalizer makes of their content, in the normalized text (tokenizers' two tries).
static void build_tries(Bpe *b, const BpeSpec *sp) {
    trie_init(&b->raw_trie);
    trie_init(&b->norm_trie);
    for (int i = 0; i < b->n_added; i++) {
        const BpeStr c = b->added[i].content;
        if (!sp->added[i].normalized) {
            trie_add(&b->raw_trie, c.s, c.len, i);
            continue;
        }
        size_t len;
        char *norm = normalize(b, c.s, c.len, &len);
        if (len) trie_add(&b->norm_trie, norm, len, i);
        free(norm);
    }
}

static int id_ok(const Bpe *b, int id) { return id >= 0 && id < b->n_tokens && b->str[id].s; }

static void build_bytes(Bpe *b) {
    gpt2_alphabet(b);
    for (int c = 0; c < 256; c++) {
        char name[8];
        unsigned char sym[4];
        snprintf(name, sizeof name, "<0x%02X>", c);
        b->byte_token[c] = vocab_id(b, name, 6);
        b->byte_sym[c] = vocab_id(b, (const char *)sym, utf8_encode(b->byte_cp[c], sym));
    }
}

static char *piece_text(const Bpe *b, int id, int first, size_t *n);

// Every token's text through the decoder, in the middle of a text and at its start, once: a
// decoded token is then a copy.
static void build_pieces(Bpe *b) {
    size_t max = 1, len = 0, cap = 0;
    b->piece_at = xcalloc(2 * (size_t)b->n_tokens + 1, sizeof(size_t));
    b->piece_len = xcalloc(2 * (size_t)b->n_tokens + 1, sizeof(int));
    for (int id = 0; id < b->n_tokens; id++)
        for (int first = 0; first < 2 && b->str[id].s; first++) {
            size_t n;
            char *text = piece_text(b, id, first, &n);
            reserve(&b->pieces, &cap, len + n + 1, 1);
            memcpy(b->pieces + len, text, n);
            b->piece_at[2 * id + first] = len, b->piece_len[2 * id + first] = (int)n;
            len += n;
            if (n > max) max = n;
            free(text);
        }
    b->max_piece = (int)max;
}

Bpe *bpe_build(const BpeSpec *sp, char *err) {
    if (check_spec(sp, err)) return NULL;
    Bpe *b = xcalloc(1, sizeof(Bpe));
    b->byte_level = is_byte_level(sp);
    b->byte_fallback = sp->byte_fallback, b->ignore_merges = sp->ignore_merges, b->fuse_unk = sp->fuse_unk;
    build_strings(b, sp);
    if (build_vocab(b, sp, err)) return bpe_free(b), NULL;
    if (sp->n_merges == 0 && sp->scores) build_scored_merges(b, sp);
    else if (build_merges(b, sp, err)) return bpe_free(b), NULL;
    b->unk_id = id_ok(b, sp->unk_id) ? sp->unk_id : -1;
    for (int i = 0; i < sp->n_prefix + sp->n_suffix; i++) {
        int id = i < sp->n_prefix ? sp->prefix[i] : sp->suffix[i - sp->n_prefix];
        if (!id_ok(b, id)) return build_fail(b, err, "post-processor: id %s%ld is not a token", "", id), NULL;
    }
    memcpy(b->prefix, sp->prefix, sizeof b->prefix), b->n_prefix = sp->n_prefix;
    memcpy(b->suffix, sp->suffix, sizeof b->suffix), b->n_suffix = sp->n_suffix;
    build_bytes(b);
    build_tries(b, sp);
    build_pieces(b);
    return b;
}

// ---------------------------------------------------------------- encoding: working state
typedef struct {
    size_t at, len;   // bytes in Pieces.buf
    int id;           // an added token's id (no bytes), or -1 for text
    int orig0;        // the piece begins at the text's first byte (Metaspace's prepend "first")
} Piece;

typedef struct {
    char *buf;
    size_t len, cap;
    Piece *p;
    size_t n, cap_p;
} Pieces;

typedef struct {
    int id, prev, next, alive;
} Sym;

typedef struct {
    int rank, pos, new_id;
} Cand;

typedef struct {
    const Bpe *b;
    int flags;
    int *ids, cap, n;          // the output
    Pieces pa, pb;             // piece lists, one step's input and output
    uint32_t *cps;             // one piece's characters ...
    size_t *offs;              // ... their byte offsets (n + 1) ...
    unsigned char *cls;        // ... and classes
    size_t cap_cps, cap_offs, cap_cls;
    Sym *sym;
    Cand *heap;
    size_t cap_sym, cap_heap;
    char *key;                 // a piece in GPT-2's alphabet
    size_t cap_key;
} Enc;

static void emit(Enc *e, int id) {
    if (e->n < e->cap) e->ids[e->n] = id;
    if (e->n < INT32_MAX) e->n++;
}

static void put_bytes(Pieces *P, const char *s, size_t n) {
    reserve(&P->buf, &P->cap, P->len + n + 1, 1);
    memcpy(P->buf + P->len, s, n);
    P->len += n;
}

// Opens a piece at the buffer's end: bytes put after this belong to it until close_piece.
static void open_piece(Pieces *P, int orig0) {
    reserve(&P->p, &P->cap_p, P->n + 1, sizeof(Piece));
    P->p[P->n] = (Piece){P->len, 0, -1, orig0};
}

// Closes the open piece; an empty one is dropped, as tokenizers drops empty splits.
static void close_piece(Pieces *P) {
    Piece *q = &P->p[P->n];
    q->len = P->len - q->at;
    if (q->len) P->n++;
}

static void add_text(Pieces *P, const char *s, size_t n, int orig0) {
    open_piece(P, orig0);
    put_bytes(P, s, n);
    close_piece(P);
}

static void add_token(Pieces *P, int id) {
    reserve(&P->p, &P->cap_p, P->n + 1, sizeof(Piece));
    P->p[P->n++] = (Piece){P->len, 0, id, 0};
}

// ---------------------------------------------------------------- normalizers
// s with every a replaced by b (a not empty), in a new allocation.
static char *replace_all(const char *s, size_t n, BpeStr a, BpeStr b, size_t *out_len) {
    size_t count = 0;
    for (size_t i = 0; i + a.len <= n;)
        if (memcmp(s + i, a.s, a.len) == 0) count++, i += a.len;
        else i++;
    char *out = xcalloc(n + count * (size_t)b.len + 1, 1);
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (i + a.len <= n && memcmp(s + i, a.s, a.len) == 0) {
            memcpy(out + o, b.s, b.len), o += b.len, i += a.len;
        } else out[o++] = s[i++];
    }
    *out_len = o;
    return out;
}

static char *prepend(const char *s, size_t n, BpeStr a, size_t *out_len) {
    if (!n) return *out_len = 0, xcalloc(1, 1);
    char *out = xcalloc(n + a.len + 1, 1);
    memcpy(out, a.s, a.len);
    memcpy(out + a.len, s, n);
    *out_len = n + a.len;
    return out;
}

// The normalizer's steps over s, in a new allocation.
static char *normalize(const Bpe *b, const char *s, size_t n, size_t *out_len) {
    char *cur = xcalloc(n + 1, 1);
    memcpy(cur, s, n);
    for (int i = 0; i < b->n_norm; i++) {
        const BpeNorm *st = &b->norm[i];
        char *next = st->type == BPE_NORM_NFC       ? uni_nfc(cur, n, &n)
                     : st->type == BPE_NORM_PREPEND ? prepend(cur, n, st->a, &n)
                                                    : replace_all(cur, n, st->a, st->b, &n);
        free(cur);
        cur = next;
    }
    *out_len = n;
    return cur;
}

// ---------------------------------------------------------------- pre-tokenizer scanners
enum { C_L = 1, C_N = 2, C_S = 4, C_NL = 8, C_NUM = 16 };   // letter, number, space, \r or \n, is_numeric

static unsigned char classify(uint32_t cp) {
    unsigned char c = 0;
    if (uni_is_letter(cp)) c |= C_L;
    if (uni_is_number(cp)) c |= C_N;
    if (uni_is_numeric(cp)) c |= C_NUM;
    if (uni_is_space(cp)) c |= C_S;
    if (cp == '\r' || cp == '\n') c |= C_NL;
    return c;
}

// Decodes a piece into e->cps / e->offs / e->cls: its character count.
static size_t decode_piece(Enc *e, const char *s, size_t n) {
    reserve(&e->cps, &e->cap_cps, n + 1, sizeof(uint32_t));
    reserve(&e->offs, &e->cap_offs, n + 1, sizeof(size_t));
    reserve(&e->cls, &e->cap_cls, n + 1, 1);
    size_t m = 0;
    for (size_t i = 0; i < n; m++) {
        e->offs[m] = i;
        i += utf8_decode((const unsigned char *)s + i, n - i, &e->cps[m]);
        e->cls[m] = classify(e->cps[m]);
    }
    e->offs[m] = n;
    return m;
}

static int is_other(unsigned char c) { return !(c & (C_L | C_N | C_S)); }

static size_t run(const unsigned char *cls, size_t i, size_t n, unsigned char mask) {
    while (i < n && (cls[i] & mask)) i++;
    return i;
}

static size_t run_other(const unsigned char *cls, size_t i, size_t n) {
    while (i < n && is_other(cls[i])) i++;
    return i;
}

// \s+(?!\S)|\s+ at a whitespace character: the run, less its last character when a
// non-space follows it (that one goes with the next piece), but at least one character.
static size_t spaces(const unsigned char *cls, size_t i, size_t n) {
    size_t j = run(cls, i, n, C_S);
    return j == n || j - 1 == i ? j : j - 1;
}

static int lower_is(uint32_t c, char want) { return c < 0x80 && (char)(c | 0x20) == want; }

// 's|'t|'re|'ve|'m|'ll|'d after the apostrophe at i: the match's end, or 0. Case-insensitive
// (Llama 3's (?i:...)) lets S also be U+017F LONG S, which case-folds to s.
static size_t contraction(const uint32_t *c, size_t i, size_t n, int fold) {
    if (c[i] != '\'' || i + 1 >= n) return 0;
    uint32_t x = fold && c[i + 1] < 0x80 ? c[i + 1] | 0x20 : c[i + 1];
    if (x == 's' || x == 't' || x == 'm' || x == 'd' || (fold && x == 0x17F)) return i + 2;
    if (i + 2 >= n) return 0;
    uint32_t y = c[i + 2];
    if (!fold && ((x == 'r' && y == 'e') || (x == 'v' && y == 'e') || (x == 'l' && y == 'l'))) return i + 3;
    if (fold && ((x == 'r' && lower_is(y, 'e')) || (x == 'v' && lower_is(y, 'e')) || (x == 'l' && lower_is(y, 'l'))))
        return i + 3;
    return 0;
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
static size_t match_gpt2(const uint32_t *c, const unsigned char *cls, size_t i, size_t n) {
    size_t j = contraction(c, i, n, 0);
    if (j) return j;
    size_t s = c[i] == ' ' && i + 1 < n ? i + 1 : i;   // the optional space
    if (cls[s] & C_L) return run(cls, s, n, C_L);
    if (cls[s] & C_N) return run(cls, s, n, C_N);
    if (is_other(cls[s])) return run_other(cls, s, n);
    return spaces(cls, i, n);
}

// Llama 3 (max_digits 3) and Qwen2 (1):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
static size_t match_llama3(const uint32_t *c, const unsigned char *cls, size_t i, size_t n, size_t max_digits) {
    size_t j = contraction(c, i, n, 1);
    if (j) return j;
    if (!(cls[i] & (C_NL | C_L | C_N)) && i + 1 < n && (cls[i + 1] & C_L)) return run(cls, i + 1, n, C_L);
    if (cls[i] & C_L) return run(cls, i, n, C_L);
    if (cls[i] & C_N) {
        for (j = i; j < n && j - i < max_digits && (cls[j] & C_N); j++) {}
        return j;
    }
    size_t s = c[i] == ' ' && i + 1 < n ? i + 1 : i;
    if (is_other(cls[s])) return run(cls, run_other(cls, s, n), n, C_NL);
    // \s*[\r\n]+: through the last \r or \n of the whitespace run, if it has one
    size_t end = run(cls, i, n, C_S), last_nl = n;
    for (j = i; j < end; j++)
        if (cls[j] & C_NL) last_nl = j;
    return last_nl < n ? last_nl + 1 : spaces(cls, i, n);
}

// \p{N} and \p{N}{1,3} as Isolated splits: a match, or the gap up to the next one.
static size_t match_digits(const unsigned char *cls, size_t i, size_t n, size_t max) {
    size_t j = i;
    if (cls[i] & C_N) {
        while (j < n && j - i < max && (cls[j] & C_N)) j++;
        return j;
    }
    while (j < n && !(cls[j] & C_N)) j++;
    return j;
}

static size_t match(const Enc *e, BpePattern pat, size_t i, size_t n) {
    switch (pat) {
    case BPE_PAT_GPT2: return match_gpt2(e->cps, e->cls, i, n);
    case BPE_PAT_LLAMA3: return match_llama3(e->cps, e->cls, i, n, 3);
    case BPE_PAT_QWEN2: return match_llama3(e->cps, e->cls, i, n, 1);
    case BPE_PAT_DIGIT: return match_digits(e->cls, i, n, 1);
    case BPE_PAT_DIGITS3: return match_digits(e->cls, i, n, 3);
    }
    return n;
}

// Splits one piece by a pattern into out.
static void split_piece(Enc *e, Pieces *out, const char *s, size_t n, int orig0, BpePattern pat) {
    size_t m = decode_piece(e, s, n);
    for (size_t i = 0; i < m;) {
        size_t j = match(e, pat, i, m);
        add_text(out, s + e->offs[i], e->offs[j] - e->offs[i], orig0 && i == 0);
        i = j;
    }
}

// Digits: each is_numeric character alone (individual), or runs of them, and the runs between.
static void split_digits(Enc *e, Pieces *out, const char *s, size_t n, int orig0, int individual) {
    size_t m = decode_piece(e, s, n);
    for (size_t i = 0; i < m;) {
        int num = (e->cls[i] & C_NUM) != 0;
        size_t j = i + 1;
        if (!num || !individual)
            while (j < m && ((e->cls[j] & C_NUM) != 0) == num) j++;
        add_text(out, s + e->offs[i], e->offs[j] - e->offs[i], orig0 && i == 0);
        i = j;
    }
}

static void byte_level_piece(Enc *e, Pieces *out, const char *s, size_t n, int orig0, const BpePre *st) {
    if (!st->add_prefix_space || s[0] == ' ') {
        if (st->use_regex) split_piece(e, out, s, n, orig0, BPE_PAT_GPT2);
        else add_text(out, s, n, orig0);
        return;
    }
    char *spaced = xcalloc(n + 1, 1);
    spaced[0] = ' ';
    memcpy(spaced + 1, s, n);
    if (st->use_regex) split_piece(e, out, spaced, n + 1, orig0, BPE_PAT_GPT2);
    else add_text(out, spaced, n + 1, orig0);
    free(spaced);
}

// Metaspace: " " -> replacement; the replacement before the piece as the scheme says, unless it
// starts with one; then, with split, a new piece before each replacement.
static void metaspace_piece(Pieces *out, const char *s, size_t n, int orig0, const BpePre *st) {
    const BpeStr r = st->replacement, space = {" ", 1};
    size_t len;
    char *t = replace_all(s, n, space, r, &len);
    int starts = len >= (size_t)r.len && memcmp(t, r.s, r.len) == 0;
    int pre = !starts && (st->prepend == BPE_PREPEND_ALWAYS || (st->prepend == BPE_PREPEND_FIRST && orig0));
    open_piece(out, orig0);
    if (pre) put_bytes(out, r.s, r.len);
    for (size_t i = 0; i < len;) {
        int at_r = st->split && i + r.len <= len && memcmp(t + i, r.s, r.len) == 0;
        if (at_r && (i > 0 || pre)) {
            close_piece(out);
            open_piece(out, 0);
        }
        size_t step = at_r ? (size_t)r.len : 1;
        put_bytes(out, t + i, step);
        i += step;
    }
    close_piece(out);
    free(t);
}

// One pre-tokenizer step over every text piece of in, into out (emptied first).
static void pre_step(Enc *e, const BpePre *st, const Pieces *in, Pieces *out) {
    out->len = out->n = 0;
    for (size_t k = 0; k < in->n; k++) {
        const Piece *p = &in->p[k];
        const char *s = in->buf + p->at;
        if (p->id >= 0) add_token(out, p->id);
        else if (st->type == BPE_PRE_SPLIT) split_piece(e, out, s, p->len, p->orig0, st->pattern);
        else if (st->type == BPE_PRE_DIGITS) split_digits(e, out, s, p->len, p->orig0, st->individual);
        else if (st->type == BPE_PRE_BYTE_LEVEL) byte_level_piece(e, out, s, p->len, p->orig0, st);
        else metaspace_piece(out, s, p->len, p->orig0, st);
    }
}

// ---------------------------------------------------------------- the model: BPE on one piece
static int cand_less(const Cand *a, const Cand *b) { return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos; }

static void heap_push(Cand *h, size_t *n, Cand c) {
    size_t i = (*n)++;
    while (i > 0 && cand_less(&c, &h[(i - 1) / 2])) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
    h[i] = c;
}

static Cand heap_pop(Cand *h, size_t *n) {
    Cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c])) c++;
        if (!cand_less(&h[c], &last)) break;
        h[i] = h[c], i = c;
    }
    h[i] = last;
    return top;
}

// The candidate merge of the symbol at pos with its next, onto the heap, if the pair merges.
static void push_pair(Enc *e, size_t *nh, int pos) {
    const Sym *s = e->sym;
    int rank, id;
    if (pos < 0 || s[pos].next < 0) return;
    if ((id = pair_merge(e->b, s[pos].id, s[s[pos].next].id, &rank)) >= 0) heap_push(e->heap, nh, (Cand){rank, pos, id});
}

static int add_sym(Enc *e, int n, int id) {
    e->sym[n] = (Sym){id, n - 1, -1, 1};
    if (n > 0) e->sym[n - 1].next = n;
    return n + 1;
}

// One character that is not in the vocabulary: its bytes' <0xXX> tokens if all exist (byte
// fallback); else the unknown token, which tokenizers keeps pending until a known character or
// the end (a run of them is one with fuse_unk); else nothing.
static int unknown_char(Enc *e, int n, const unsigned char *ch, int len, int *pending_unk) {
    const Bpe *b = e->b;
    int all = b->byte_fallback;
    for (int k = 0; k < len && all; k++) all = b->byte_token[ch[k]] >= 0;
    if (all) {
        for (int k = 0; k < len; k++) n = add_sym(e, n, b->byte_token[ch[k]]);
        return n;
    }
    if (b->unk_id < 0) return n;
    if (*pending_unk && !b->fuse_unk) n = add_sym(e, n, b->unk_id);
    *pending_unk = 1;
    return n;
}

// The piece's characters as symbols: byte-level, each byte's alphabet character; else each
// UTF-8 character (a bad byte alone).
static int initial_symbols(Enc *e, const unsigned char *s, size_t len) {
    const Bpe *b = e->b;
    int n = 0, pending_unk = 0;
    for (size_t i = 0; i < len;) {
        unsigned char ch[4];
        int clen, id;
        if (b->byte_level) {
            clen = utf8_encode(b->byte_cp[s[i]], ch);
            id = b->byte_sym[s[i++]];
        } else {
            uint32_t cp;
            clen = utf8_decode(s + i, len - i, &cp);
            memcpy(ch, s + i, clen);
            id = vocab_id(b, (const char *)s + i, clen);
            i += clen;
        }
        if (id < 0) {
            n = unknown_char(e, n, ch, clen, &pending_unk);
            continue;
        }
        if (pending_unk) n = add_sym(e, n, b->unk_id), pending_unk = 0;
        n = add_sym(e, n, id);
    }
    return pending_unk ? add_sym(e, n, b->unk_id) : n;
}

// ignore_merges: the whole piece, if it is one vocabulary token (in the alphabet for byte-level).
static int whole_piece(Enc *e, const char *s, size_t len) {
    const Bpe *b = e->b;
    if (!b->byte_level) return vocab_id(b, s, len);
    reserve(&e->key, &e->cap_key, 2 * len + 1, 1);
    size_t k = 0;
    for (size_t i = 0; i < len; i++) k += utf8_encode(b->byte_cp[(unsigned char)s[i]], (unsigned char *)e->key + k);
    return vocab_id(b, e->key, k);
}

// Merges the lowest-ranked adjacent pair, leftmost first, until none is left. A heap entry whose
// pair has changed since it was pushed is stale and skipped, as in tokenizers' Word::merge_all.
static void bpe_piece_encode(Enc *e, const char *s, size_t len) {
    int id;
    if (e->b->ignore_merges && (id = whole_piece(e, s, len)) >= 0) return emit(e, id);
    // symbols: at most 2 a byte (byte-level's alphabet characters falling back to bytes); the heap:
    // the first pairs, then at most 2 for each merge
    reserve(&e->sym, &e->cap_sym, 2 * len + 1, sizeof(Sym));
    reserve(&e->heap, &e->cap_heap, 6 * len + 1, sizeof(Cand));
    int n = initial_symbols(e, (const unsigned char *)s, len);
    size_t nh = 0;
    for (int i = 0; i + 1 < n; i++) push_pair(e, &nh, i);
    Sym *sym = e->sym;
    while (nh) {
        Cand c = heap_pop(e->heap, &nh);
        int rank, next = sym[c.pos].next;
        if (!sym[c.pos].alive || next < 0 || pair_merge(e->b, sym[c.pos].id, sym[next].id, &rank) != c.new_id) continue;
        sym[c.pos].id = c.new_id;
        sym[next].alive = 0;
        sym[c.pos].next = sym[next].next;
        if (sym[next].next >= 0) sym[sym[next].next].prev = c.pos;
        push_pair(e, &nh, sym[c.pos].prev);
        push_pair(e, &nh, c.pos);
    }
    for (int i = 0; i < n && i >= 0; i = sym[i].next) emit(e, sym[i].id);
}

// ---------------------------------------------------------------- added tokens
typedef struct {
    size_t start, end;
    int added;   // index into Bpe.added, or -1 for text between
} Seg;

typedef struct {
    Seg *s;
    size_t n, cap;
} Segs;

static void add_seg(Segs *S, size_t start, size_t end, int added) {
    reserve(&S->s, &S->cap, S->n + 1, sizeof(Seg));
    S->s[S->n++] = (Seg){start, end, added};
}

// The longest added token starting at s[i], its index (length in *len), or -1.
static int trie_match(const Trie *t, const unsigned char *s, size_t i, size_t n, size_t *len) {
    int node = t->root[s[i]], best = -1;
    for (size_t j = i + 1; node >= 0; j++) {
        if (t->node[node].added >= 0) best = t->node[node].added, *len = j - i;
        if (j == n) break;
        for (node = t->node[node].child; node >= 0 && t->node[node].byte != s[j];) node = t->node[node].sibling;
    }
    return best;
}

// The character ending at s[end] (end > 0); where it starts in *start.
static uint32_t char_before(const unsigned char *s, size_t end, size_t *start) {
    size_t i = end - 1;
    for (int k = 0; k < 3 && i > 0 && (s[i] & 0xC0) == 0x80; k++) i--;
    uint32_t cp;
    if (i + utf8_decode(s + i, end - i, &cp) != end) return *start = end - 1, UNI_BAD | s[end - 1];
    *start = i;
    return cp;
}

// Where the whitespace that ends at s[end] begins, or floor, whichever is later.
static size_t space_run_back(const unsigned char *s, size_t end, size_t floor) {
    size_t start;
    while (end > floor && uni_is_space(char_before(s, end, &start))) end = start;
    return end < floor ? floor : end;
}

static size_t space_run(const unsigned char *s, size_t i, size_t n) {
    while (i < n) {
        uint32_t cp;
        int len = utf8_decode(s + i, n - i, &cp);
        if (!uni_is_space(cp)) break;
        i += len;
    }
    return i;
}

static int word_at(const unsigned char *s, size_t i, size_t n) {
    uint32_t cp;
    return i < n && (utf8_decode(s + i, n - i, &cp), uni_is_word(cp));
}

// Splits s by the trie's tokens as tokenizers' AddedVocabulary::find_matches does: leftmost-
// longest, non-overlapping; a match that is skipped (a special token under BPE_SPLIT_SPECIAL, a
// single_word token touching a word) is not searched again for shorter ones; lstrip / rstrip
// take the whitespace around a match (not what an earlier match took).
static void find_added(const Enc *e, const Trie *t, const unsigned char *s, size_t n, Segs *out) {
    const Bpe *b = e->b;
    size_t done = 0;
    out->n = 0;
    for (size_t i = 0; i < n;) {
        size_t len = 0;
        int a = trie_match(t, s, i, n, &len);
        if (a < 0) {
            i++;
            continue;
        }
        const Added *x = &b->added[a];
        size_t start = i, stop = i + len;
        i = stop;
        if ((e->flags & BPE_SPLIT_SPECIAL) && x->special) continue;
        size_t before;
        if (x->single_word && ((start > 0 && uni_is_word(char_before(s, start, &before))) || word_at(s, stop, n))) continue;
        if (x->lstrip) start = space_run_back(s, start, done);
        if (x->rstrip) stop = space_run(s, stop, n);
        if (done < start) add_seg(out, done, start, -1);
        add_seg(out, start, stop, a);
        done = i = stop;
    }
    if (done < n) add_seg(out, done, n, -1);
}

// ---------------------------------------------------------------- encoding
// One stretch of text between raw-matched added tokens: normalized, split by the normalized
// added tokens, pre-tokenized, each piece through the model.
static void encode_text(Enc *e, const char *s, size_t n, int at_start) {
    const Bpe *b = e->b;
    size_t len;
    char *norm = normalize(b, s, n, &len);
    Segs segs = {0};
    find_added(e, &b->norm_trie, (const unsigned char *)norm, len, &segs);
    Pieces *in = &e->pa, *out = &e->pb;
    in->len = in->n = 0;
    for (size_t k = 0; k < segs.n; k++) {
        const Seg *g = &segs.s[k];
        if (g->added >= 0) add_token(in, b->added[g->added].id);
        else add_text(in, norm + g->start, g->end - g->start, at_start && g->start == 0);
    }
    for (int i = 0; i < b->n_pre; i++) {
        pre_step(e, &b->pre[i], in, out);
        Pieces *t = in;
        in = out, out = t;
    }
    for (size_t k = 0; k < in->n; k++) {
        if (in->p[k].id >= 0) emit(e, in->p[k].id);
        else bpe_piece_encode(e, in->buf + in->p[k].at, in->p[k].len);
    }
    free(segs.s);
    free(norm);
}

int bpe_encode(const Bpe *b, const char *text, size_t len, int flags, int *ids, int cap) {
    Enc e = {.b = b, .flags = flags, .ids = ids, .cap = cap};
    if (flags & BPE_ADD_SPECIAL)
        for (int i = 0; i < b->n_prefix; i++) emit(&e, b->prefix[i]);
    Segs segs = {0};
    find_added(&e, &b->raw_trie, (const unsigned char *)text, len, &segs);
    for (size_t k = 0; k < segs.n; k++) {
        const Seg *g = &segs.s[k];
        if (g->added >= 0) emit(&e, b->added[g->added].id);
        else encode_text(&e, text + g->start, g->end - g->start, g->start == 0);
    }
    if (flags & BPE_ADD_SPECIAL)
        for (int i = 0; i < b->n_suffix; i++) emit(&e, b->suffix[i]);
    free(segs.s);
    free(e.pa.buf), free(e.pa.p), free(e.pb.buf), free(e.pb.p);
    free(e.cps), free(e.offs), free(e.cls), free(e.sym), free(e.heap), free(e.key);
    return e.n;
}

// ---------------------------------------------------------------- decoding
// The token's string after the ByteLevel decoder: each alphabet character's byte, or the
// string unchanged if a character is not in the alphabet.
static int byte_level_decode(const Bpe *b, const char *s, int n, char *out) {
    int o = 0;
    for (int i = 0; i < n;) {
        uint32_t cp;
        i += utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (cp >= 324 || b->alpha_byte[cp] < 0) return memcpy(out, s, n), n;
        out[o++] = (char)b->alpha_byte[cp];
    }
    return o;
}

static int hex_digit(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

// "<0xXX>" -> the byte (tokenizers accepts either case of hex digit).
static int byte_fallback_decode(const char *s, int n, char *out) {
    if (n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && hex_digit(s[3]) >= 0 && hex_digit(s[4]) >= 0) {
        out[0] = (char)(hex_digit(s[3]) * 16 + hex_digit(s[4]));
        return 1;
    }
    memcpy(out, s, n);
    return n;
}

static int strip_start(const char *s, int n, BpeStr a, int count, char *out) {
    int i = 0;
    for (int k = 0; k < count && i + a.len <= n && memcmp(s + i, a.s, a.len) == 0; k++) i += a.len;
    memcpy(out, s + i, n - i);
    return n - i;
}

// One decoder step over s (n bytes), into a new allocation: its length in *n. fused: a Fuse or
// ByteLevel step came before, so this string is the text's start when first.
static char *decode_step(const Bpe *b, const BpeDec *d, const char *s, size_t *n, int first, int *fused) {
    static const BpeStr none = {"", 0}, space = {" ", 1};
    if (d->type == BPE_DEC_REPLACE) return replace_all(s, *n, d->a, d->b, n);
    if (d->type == BPE_DEC_METASPACE) return replace_all(s, *n, d->a, d->drop_first && (first || *fused) ? none : space, n);
    char *out = xcalloc(*n + 1, 1);
    int len = (int)*n;
    if (d->type == BPE_DEC_BYTE_LEVEL) len = byte_level_decode(b, s, len, out), *fused = 1;
    else if (d->type == BPE_DEC_BYTE_FALLBACK) len = byte_fallback_decode(s, len, out);
    else if (d->type == BPE_DEC_STRIP && (!*fused || first)) len = strip_start(s, len, d->a, d->start, out);
    else memcpy(out, s, len), *fused |= d->type == BPE_DEC_FUSE;
    *n = (size_t)len;
    return out;
}

// The token's text through every decoder step, in a new allocation.
static char *piece_text(const Bpe *b, int id, int first, size_t *n) {
    int fused = 0;
    *n = (size_t)b->str[id].len;
    char *cur = xcalloc(*n + 1, 1);
    memcpy(cur, b->str[id].s, *n);
    for (int i = 0; i < b->n_dec; i++) {
        char *next = decode_step(b, &b->dec[i], cur, n, first, &fused);
        free(cur);
        cur = next;
    }
    return cur;
}

int bpe_piece(const Bpe *b, int id, int first, char *out) {
    if (!id_ok(b, id)) return 0;
    int k = 2 * id + (first != 0);
    memcpy(out, b->pieces + b->piece_at[k], b->piece_len[k]);
    return b->piece_len[k];
}

// ---------------------------------------------------------------- streaming
void bpe_stream_init(BpeStream *s, const Bpe *b, int skip_special) {
    memset(s, 0, sizeof *s);
    s->bpe = b;
    s->skip_special = skip_special;
}

static int put_replacement(char *out) { return memcpy(out, "\xEF\xBF\xBD", 3), 3; }

// The length of the valid UTF-8 sequence at d[i] (n bytes in all), 0 where it is still
// incomplete at the end, or -(the maximal invalid subsequence's length).
static int utf8_status(const unsigned char *d, size_t i, size_t n) {
    unsigned char c = d[i];
    if (c < 0x80) return 1;
    if (c < 0xC2 || c > 0xF4) return -1;
    int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    for (int k = 1; k < len; k++) {
        if (i + k >= n) return 0;
        unsigned char x = d[i + k];
        if (x < (k == 1 ? lo : 0x80) || x > (k == 1 ? hi : 0xBF)) return -k;
    }
    return len;
}

// Valid sequences of d (n bytes) to out, invalid ones as U+FFFD; an incomplete one at the end is
// held. out may overlap d from below as long as it stays 3 bytes per byte read behind it.
static int emit_utf8(BpeStream *s, const unsigned char *d, size_t n, char *out) {
    int o = 0;
    for (size_t i = 0; i < n;) {
        int st = utf8_status(d, i, n);
        if (st == 0) {
            s->n_held = (int)(n - i);
            memmove(s->held, d + i, n - i);
            return o;
        }
        if (st < 0) o += put_replacement(out + o), i += -st;
        else memmove(out + o, d + i, st), o += st, i += st;
    }
    s->n_held = 0;
    return o;
}

int bpe_stream_next(BpeStream *s, int id, char *out) {
    const Bpe *b = s->bpe;
    if (!id_ok(b, id) || (s->skip_special && b->special[id])) return 0;
    size_t base = 3 * ((size_t)b->max_piece + 8);   // the bytes go here, the text to the front
    unsigned char *d = (unsigned char *)out + base;
    memcpy(d, s->held, s->n_held);
    int n = bpe_piece(b, id, !s->started, (char *)d + s->n_held);
    if (b->str[id].len) s->started = 1;
    return emit_utf8(s, d, (size_t)s->n_held + n, out);
}

int bpe_stream_flush(BpeStream *s, char *out) {
    int o = s->n_held ? put_replacement(out) : 0;
    s->n_held = 0;
    return o;
}

size_t bpe_decode(const Bpe *b, const int *ids, int n, int skip_special, char *out, size_t cap) {
    BpeStream s;
    bpe_stream_init(&s, b, skip_special);
    char *buf = xcalloc(BPE_STREAM_CAP(b), 1);
    size_t len = 0;
    for (int i = 0; i <= n; i++) {
        int k = i < n ? bpe_stream_next(&s, ids[i], buf) : bpe_stream_flush(&s, buf);
        if (len < cap) memcpy(out + len, buf, (size_t)k < cap - len ? (size_t)k : cap - len);
        len += k;
    }
    if (cap) out[len < cap ? len : cap - 1] = '\0';
    free(buf);
    return len;
}

// ---------------------------------------------------------------- GGUF's pipelines
// llama.cpp's tokenizer.ggml.pre names, by the regex list llama-vocab.cpp runs for each, and the
// tokenizers pipeline equal to it.
static const struct {
    const char *name;
    BpePattern split;   // a Split before ByteLevel, 0 for none
    int digits;         // Digits(individual_digits) before ByteLevel (\p{N} first, then GPT-2's regex)
    int nfc;            // Qwen2's tokenizer.json normalizes to NFC
} gguf_pre[] = {
    {"default", 0, 0, 0},        {"gpt-2", 0, 0, 0},          {"gpt2", 0, 0, 0},          {"mpt", 0, 0, 0},
    {"olmo", 0, 0, 0},           {"jais", 0, 0, 0},           {"llama-bpe", BPE_PAT_LLAMA3, 0, 0},
    {"llama3", BPE_PAT_LLAMA3, 0, 0}, {"llama-v3", BPE_PAT_LLAMA3, 0, 0}, {"smaug-bpe", BPE_PAT_LLAMA3, 0, 0},
    {"dbrx", BPE_PAT_LLAMA3, 0, 0}, {"qwen2", BPE_PAT_QWEN2, 0, 1}, {"stablelm2", BPE_PAT_QWEN2, 0, 0},
    {"deepseek-r1-qwen", BPE_PAT_QWEN2, 0, 1}, {"smollm", 0, 1, 0}, {"starcoder", 0, 1, 0},
    {"refact", 0, 1, 0},         {"command-r", 0, 1, 0},      {"codeshell", 0, 1, 0},     {"exaone", 0, 1, 0},
    {"minerva-7b", 0, 1, 0},
};

static const BpeStr META = {"\xE2\x96\x81", 3}, SPACE = {" ", 1};   // "▁"

// SentencePiece as Llama 2's tokenizer.json has it: "▁" before the text (add_space_prefix),
// spaces as "▁", no pre-tokenizer; decoded back with the first space stripped.
static void gguf_llama(BpeSpec *sp, int add_space_prefix) {
    if (add_space_prefix) sp->norm[sp->n_norm++] = (BpeNorm){BPE_NORM_PREPEND, META, {"", 0}};
    sp->norm[sp->n_norm++] = (BpeNorm){BPE_NORM_REPLACE, SPACE, META};
    sp->dec[sp->n_dec++] = (BpeDec){.type = BPE_DEC_REPLACE, .a = META, .b = SPACE};
    sp->dec[sp->n_dec++] = (BpeDec){.type = BPE_DEC_BYTE_FALLBACK};
    sp->dec[sp->n_dec++] = (BpeDec){.type = BPE_DEC_FUSE};
    if (add_space_prefix) sp->dec[sp->n_dec++] = (BpeDec){.type = BPE_DEC_STRIP, .a = SPACE, .start = 1};
}

int bpe_spec_gguf_pipeline(BpeSpec *sp, const char *model, const char *pre, int add_space_prefix, char *err) {
    sp->n_norm = sp->n_pre = sp->n_dec = 0;
    if (model && !strcmp(model, "llama")) return gguf_llama(sp, add_space_prefix), 0;
    if (!model || strcmp(model, "gpt2")) {
        snprintf(err, ERR_LEN, "tokenizer.ggml.model \"%.60s\" is not gpt2 or llama", model ? model : "(none)");
        return -1;
    }
    for (size_t i = 0; i < sizeof gguf_pre / sizeof gguf_pre[0]; i++) {
        if (strcmp(gguf_pre[i].name, pre ? pre : "default")) continue;
        if (gguf_pre[i].nfc) sp->norm[sp->n_norm++] = (BpeNorm){.type = BPE_NORM_NFC};
        if (gguf_pre[i].split) sp->pre[sp->n_pre++] = (BpePre){.type = BPE_PRE_SPLIT, .pattern = gguf_pre[i].split};
        if (gguf_pre[i].digits) sp->pre[sp->n_pre++] = (BpePre){.type = BPE_PRE_DIGITS, .individual = 1};
        sp->pre[sp->n_pre++] = (BpePre){.type = BPE_PRE_BYTE_LEVEL, .use_regex = !gguf_pre[i].split};
        sp->dec[sp->n_dec++] = (BpeDec){.type = BPE_DEC_BYTE_LEVEL};
        return 0;
    }
    snprintf(err, ERR_LEN, "tokenizer.ggml.pre \"%.60s\" is not a pre-tokenizer this engine knows", pre);
    return -1;
}
