/*
 * ac.c — the Aho-Corasick automaton over folded word bytes.
 *
 * Built in three passes so that 100,000 words load in a fraction of a second:
 * sort the words, insert them into a trie in sorted order (each node's
 * children then arrive in increasing byte order, so appending keeps them
 * sorted), and renumber the nodes in breadth-first order. After renumbering
 * the children of a node are consecutive ids, so a node needs no edge array:
 * its children are ids first[n]..first[n+1]-1, each carrying its label. The
 * shallowest nodes (the root and its near descendants, where text spends
 * most steps) get complete 256-entry transition rows.
 * Failure links are computed in the same BFS order (parents before
 * children). Matching is the textbook walk: follow failure links until an
 * edge exists; the words ending at a state are the node's own word and the
 * chain of "dictionary suffix" links.
 */
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define AC_SKIP_X86 1
#endif

#include "filters/flt_internal.h"

struct flt_ac {
    size_t n;          /* nodes; id 0 is the root */
    size_t nwords;     /* distinct words */
    uint32_t *first;   /* n+1: children of i are first[i]..first[i+1]-1 */
    uint32_t *fail;    /* failure link */
    int32_t *out_rule; /* rule of the word ending exactly here, or -1 */
    int32_t *out_link; /* next node on the failure chain with a word, or -1 */
    uint16_t *depth;   /* bytes from the root = length of a word ending here */
    uint16_t *hold;    /* depth of the first node on the failure chain (itself
                          included) that has children: the live partial match */
    unsigned char *label;
    uint32_t *dense; /* ndense rows of 256: complete transitions (failure
                        links folded in, ASCII case too) of the shallowest
                        nodes, with the AC_D_* flags in the high bits */
    size_t ndense;
    /* The skip's tables (ac_skip): per low and high nibble of a first byte
     * and of a second byte, the buckets (bits) of the word beginnings it
     * may belong to; each 16-byte table twice, one per AVX2 lane. */
    unsigned char skip[4][32];
    bool skip_avx2; /* the CPU has AVX2: the skip runs (else every byte steps) */
};

/* Flags of a dense entry, so that a scan for "any word, any non-ASCII?"
 * (flt_ac_ascii_run, over every prompt and answer) costs one load and one
 * test per byte: the target state has a word ending in it (its own or on
 * its dictionary-suffix chain), or the byte is not ASCII. Node ids stay
 * below them (flt_ac_new refuses more nodes). */
#define AC_D_OUT   0x80000000u
#define AC_D_HIGH  0x40000000u
#define AC_D_STATE 0x3fffffffu

/* Nodes 0..FLT_AC_DENSE-1 (the shallowest, as ids are breadth-first) get a
 * full transition row: that is where text spends most steps, and a row
 * replaces a child search plus failure-link hops with one load. 1 MiB at most. */
#define FLT_AC_DENSE 1024

static int ac_word_cmp(const void *pa, const void *pb)
{
    const flt_ac_word_t *a = pa, *b = pb;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->s, b->s, n);
    if (c)
        return c;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return a->action - b->action; /* strongest first among duplicates */
}

/* The child of s labelled c, or 0. */
static inline uint32_t ac_child(const flt_ac_t *ac, uint32_t s, unsigned char c)
{
    uint32_t lo = ac->first[s], hi = ac->first[s + 1];
    if (hi - lo <= 8) {
        for (uint32_t i = lo; i < hi; i++)
            if (ac->label[i] == c)
                return i;
        return 0;
    }
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (ac->label[mid] < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (lo < ac->first[s + 1] && ac->label[lo] == c) ? lo : 0;
}

static inline uint32_t ac_step(const flt_ac_t *ac, uint32_t s, unsigned char c)
{
    c = flt_lower[c];
    for (;;) {
        if (s < ac->ndense)
            return ac->dense[(size_t)s << 8 | c] & AC_D_STATE;
        uint32_t t = ac_child(ac, s, c);
        if (t)
            return t;
        if (s == FLT_AC_ROOT)
            return FLT_AC_ROOT;
        s = ac->fail[s];
    }
}

uint32_t flt_ac_step(const flt_ac_t *ac, uint32_t s, unsigned char c)
{
    return ac_step(ac, s, c);
}

/* The skip: from the root, text in which no word can begin needs no step.
 * A word of two or more bytes begins where the byte pair is the first two
 * (folded) bytes of some word; a one-byte word's byte is such a pair with
 * any second byte. With no such pair starting in [i, j) and the state the
 * root at i, the state at j is the root or a depth-1 node whose pair with
 * s[j] is no word's beginning: stepping s[j] from the root gives the same
 * state, and no word ended in between. So the automaton only runs from the
 * positions this finds, and over the last byte (it has no pair).
 *
 * The pair test is Teddy's (Hyperscan): each first byte's bucket is its low
 * nibble mod 8, and a byte pair may begin a word of bucket b when bit b is
 * set in all four nibble tables: a superset of the real pairs (the step
 * that follows is the exact test), 32 positions per AVX2 round. */
#define AC_SKIP_NONE SIZE_MAX /* a byte >= 0x80: the run is not clean */

static void ac_skip_build(flt_ac_t *ac)
{
    memset(ac->skip, 0, sizeof ac->skip);
    for (uint32_t v = ac->first[0]; v < ac->first[1]; v++) {
        unsigned char a = ac->label[v];
        if (a >= 0x80)
            continue; /* a byte >= 0x80 ends every clean run anyway */
        unsigned char bit = (unsigned char)(1u << (a & 7));
        for (unsigned c1 = 0; c1 < 0x80; c1++) {
            if (flt_lower[c1] != a)
                continue;
            for (unsigned lane = 0; lane < 32; lane += 16) {
                ac->skip[0][lane + (c1 & 15)] |= bit;
                ac->skip[1][lane + (c1 >> 4)] |= bit;
            }
        }
        bool any = ac->out_rule[v] >= 0; /* a one-byte word: any second byte */
        for (unsigned c2 = 0; c2 < 256; c2++) {
            bool hit = any;
            for (uint32_t w = ac->first[v]; !hit && w < ac->first[v + 1]; w++)
                hit = ac->label[w] == flt_lower[c2];
            if (!hit)
                continue;
            for (unsigned lane = 0; lane < 32; lane += 16) {
                ac->skip[2][lane + (c2 & 15)] |= bit;
                ac->skip[3][lane + (c2 >> 4)] |= bit;
            }
        }
    }
#ifdef AC_SKIP_X86
    __builtin_cpu_init();
    ac->skip_avx2 = __builtin_cpu_supports("avx2");
#endif
}

#ifdef AC_SKIP_X86
/* The 32 positions of p (33 bytes read) where a word may begin, as bits;
 * false when one of the bytes is >= 0x80. */
__attribute__((target("avx2"))) static inline bool ac_pairs32(const unsigned char *p,
                                                              const __m256i t[4], uint32_t *c)
{
    const __m256i nib = _mm256_set1_epi8(0x0f);
    __m256i a = _mm256_loadu_si256((const __m256i *)p);
    __m256i b = _mm256_loadu_si256((const __m256i *)(p + 1));
    if (_mm256_movemask_epi8(_mm256_or_si256(a, b)))
        return false;
    __m256i m =
        _mm256_and_si256(_mm256_shuffle_epi8(t[0], _mm256_and_si256(a, nib)),
                         _mm256_shuffle_epi8(t[1], _mm256_and_si256(_mm256_srli_epi16(a, 4), nib)));
    m = _mm256_and_si256(m, _mm256_shuffle_epi8(t[2], _mm256_and_si256(b, nib)));
    m = _mm256_and_si256(m,
                         _mm256_shuffle_epi8(t[3], _mm256_and_si256(_mm256_srli_epi16(b, 4), nib)));
    *c = ~(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(m, _mm256_setzero_si256()));
    return true;
}

/* The first position in [i, n-1) where a word may begin, else n-1 (the
 * last byte, which has no pair); AC_SKIP_NONE at a byte >= 0x80, with
 * *high the start of the round that has it (the byte is there or in the 32
 * after): no word may begin before *high, so the root at *high is the
 * state a step over every byte would give for what follows. i < n, and
 * every byte of s[0, i) is below 0x80 (flt_ac_ascii_scan has stepped or
 * skipped it). */
__attribute__((target("avx2"))) static size_t
ac_skip_avx2(const flt_ac_t *ac, const unsigned char *s, size_t i, size_t n, size_t *high)
{
    const __m256i t[4] = {_mm256_loadu_si256((const __m256i *)ac->skip[0]),
                          _mm256_loadu_si256((const __m256i *)ac->skip[1]),
                          _mm256_loadu_si256((const __m256i *)ac->skip[2]),
                          _mm256_loadu_si256((const __m256i *)ac->skip[3])};
    uint32_t c;
    while (i + 1 < n) {
        size_t left = n - 1 - i; /* positions with a pair */
        if (left >= 32) {
            if (!ac_pairs32(s + i, t, &c))
                goto none;
            if (c)
                return i + (size_t)__builtin_ctz(c);
            i += 32;
            continue;
        }
        if (n >= 33) {
            /* the text's end: its last 32 positions, of which the first
             * back are passed already (their bytes are clean: see above) */
            size_t back = 32 - left;
            if (!ac_pairs32(s + i - back, t, &c))
                goto none;
            c &= ~((1u << back) - 1);
            return c ? i - back + (size_t)__builtin_ctz(c) : n - 1;
        }
        /* a text shorter than 33 bytes: a copy, zeros past it */
        unsigned char pad[64];
        memset(pad, 0, sizeof pad);
        memcpy(pad, s + i, left + 1);
        if (!ac_pairs32(pad, t, &c))
            goto none;
        c &= (1u << left) - 1;
        return c ? i + (size_t)__builtin_ctz(c) : n - 1;
    }
    return n - 1;
none:
    *high = i;
    return AC_SKIP_NONE;
}
#endif

/* ac_skip_avx2's answer, or i (no skip) on a CPU without AVX2. */
static inline size_t ac_skip(const flt_ac_t *ac, const unsigned char *s, size_t i, size_t n,
                             size_t *high)
{
#ifdef AC_SKIP_X86
    if (ac->skip_avx2)
        return ac_skip_avx2(ac, s, i, n, high);
#endif
    (void)ac, (void)s, (void)n, (void)high;
    return i;
}

flt_ac_run_t flt_ac_ascii_scan(const flt_ac_t *ac, uint32_t *state, const unsigned char *s,
                               size_t n, size_t *at)
{
    /* one loop with the step inlined: this runs over every prompt and
     * answer text, most of which match nothing */
    uint32_t st = *state;
    /* in locals: nothing stored in the loop, but the compiler cannot know
     * that ac_step leaves them alone, and reloads them every byte */
    const uint32_t *dense = ac->dense;
    const uint32_t ndense = ac->ndense;
    size_t i = 0;
    while (i < n) {
        if (st == FLT_AC_ROOT) {
            i = ac_skip(ac, s, i, n, at);
            if (i == AC_SKIP_NONE) {
                *state = FLT_AC_ROOT; /* at *at, the skip's round */
                return FLT_AC_RUN_HIGH;
            }
        }
        /* one step at least (a candidate, or the last byte), then on until
         * the state is the root again */
        do {
            if (st < ndense) {
                uint32_t x = dense[(size_t)st << 8 | s[i]];
                if (x & (AC_D_OUT | AC_D_HIGH)) {
                    if (x & AC_D_HIGH)
                        goto high;
                    return FLT_AC_RUN_WORD;
                }
                st = x;
                continue;
            }
            if (s[i] >= 0x80)
                goto high;
            st = ac_step(ac, st, s[i]);
            if (ac->out_rule[st] >= 0 || ac->out_link[st] >= 0)
                return FLT_AC_RUN_WORD;
        } while (++i < n && st != FLT_AC_ROOT);
    }
    *state = st;
    return FLT_AC_RUN_CLEAN;
high:
    *state = st;
    *at = i;
    return FLT_AC_RUN_HIGH;
}

bool flt_ac_ascii_run(const flt_ac_t *ac, uint32_t *state, const unsigned char *s, size_t n)
{
    uint32_t st = *state;
    size_t at;
    if (flt_ac_ascii_scan(ac, &st, s, n, &at) != FLT_AC_RUN_CLEAN)
        return false;
    *state = st;
    return true;
}

bool flt_ac_clean_from(const flt_ac_t *ac, uint32_t st, const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t j = sl_ascii_end(s, i, n);
        if (!flt_ac_ascii_run(ac, &st, s + i, j - i))
            return false;
        /* ac_step lowers the byte, as the dense rows do: the same states
         * as a step over every byte */
        for (; j < n && s[j] >= 0x80; j++) {
            st = ac_step(ac, st, s[j]);
            if (ac->out_rule[st] >= 0 || ac->out_link[st] >= 0)
                return false;
        }
        i = j;
    }
    return true;
}

bool flt_ac_clean(const flt_ac_t *ac, const unsigned char *s, size_t n)
{
    return flt_ac_clean_from(ac, FLT_AC_ROOT, s, n);
}

bool flt_ac_ascii_clean(const flt_ac_t *ac, const unsigned char *s, size_t n)
{
    uint32_t st = FLT_AC_ROOT;
    return flt_ac_ascii_run(ac, &st, s, n);
}

unsigned flt_ac_depth(const flt_ac_t *ac, uint32_t state)
{
    return ac->hold[state];
}

int32_t flt_ac_out_first(const flt_ac_t *ac, uint32_t state)
{
    return ac->out_rule[state] >= 0 ? (int32_t)state : ac->out_link[state];
}

int32_t flt_ac_out_next(const flt_ac_t *ac, int32_t node)
{
    return ac->out_link[node];
}

unsigned flt_ac_out_len(const flt_ac_t *ac, int32_t node)
{
    return ac->depth[node];
}

int flt_ac_out_rule(const flt_ac_t *ac, int32_t node)
{
    return ac->out_rule[node];
}

size_t flt_ac_nodes(const flt_ac_t *ac)
{
    return ac->n;
}

size_t flt_ac_words(const flt_ac_t *ac)
{
    return ac->nwords;
}

void flt_ac_free(flt_ac_t *ac)
{
    if (!ac)
        return;
    free(ac->first);
    free(ac->fail);
    free(ac->out_rule);
    free(ac->out_link);
    free(ac->depth);
    free(ac->hold);
    free(ac->label);
    free(ac->dense);
    free(ac);
}

/* The trie as first built, in insertion (DFS) order. */
typedef struct ac_trie {
    int32_t *child, *sib, *last; /* first child, next sibling, last child */
    int32_t *rule;
    int8_t *action;
    uint16_t *depth;
    unsigned char *label;
    size_t n;
} ac_trie_t;

static void ac_trie_free(ac_trie_t *t)
{
    free(t->child);
    free(t->sib);
    free(t->last);
    free(t->rule);
    free(t->action);
    free(t->depth);
    free(t->label);
}

static int ac_trie_build(ac_trie_t *t, flt_ac_word_t *w, size_t n, size_t cap, size_t *nwords)
{
    t->child = malloc(cap * sizeof *t->child);
    t->sib = malloc(cap * sizeof *t->sib);
    t->last = malloc(cap * sizeof *t->last);
    t->rule = malloc(cap * sizeof *t->rule);
    t->action = malloc(cap * sizeof *t->action);
    t->depth = malloc(cap * sizeof *t->depth);
    t->label = malloc(cap);
    if (!t->child || !t->sib || !t->last || !t->rule || !t->action || !t->depth || !t->label)
        return -1;
    t->n = 1;
    t->child[0] = t->sib[0] = t->last[0] = t->rule[0] = -1;
    t->action[0] = 0;
    t->depth[0] = 0;
    t->label[0] = 0;
    int32_t path[FLT_MAX_WORD_BYTES + 1];
    path[0] = 0;
    const flt_ac_word_t *prev = NULL;
    *nwords = 0;
    for (size_t i = 0; i < n; i++) {
        const flt_ac_word_t *cur = &w[i];
        size_t lcp = 0;
        if (prev) {
            size_t m = prev->len < cur->len ? prev->len : cur->len;
            while (lcp < m && prev->s[lcp] == cur->s[lcp])
                lcp++;
        }
        for (size_t j = lcp; j < cur->len; j++) {
            int32_t p = path[j], v = (int32_t)t->n++;
            t->child[v] = t->sib[v] = t->last[v] = t->rule[v] = -1;
            t->action[v] = 0;
            t->depth[v] = (uint16_t)(j + 1);
            t->label[v] = (unsigned char)cur->s[j];
            /* sorted input: the new label is larger than any existing child */
            if (t->last[p] < 0)
                t->child[p] = v;
            else
                t->sib[t->last[p]] = v;
            t->last[p] = v;
            path[j + 1] = v;
        }
        int32_t end = path[cur->len];
        if (t->rule[end] < 0) {
            t->rule[end] = cur->rule;
            t->action[end] = (int8_t)cur->action;
            (*nwords)++;
        } /* else a duplicate: the sort put the strongest action first */
        prev = cur;
    }
    return 0;
}

flt_ac_t *flt_ac_new(flt_ac_word_t *words, size_t n)
{
    size_t cap = 1;
    for (size_t i = 0; i < n; i++) {
        if (words[i].len == 0 || words[i].len > FLT_MAX_WORD_BYTES)
            return NULL;
        cap += words[i].len;
    }
    if (cap > AC_D_STATE - 2) /* ids must stay clear of the dense flags */
        return NULL;
    if (n)
        qsort(words, n, sizeof *words, ac_word_cmp);

    flt_ac_t *ac = calloc(1, sizeof *ac);
    ac_trie_t t = {0};
    uint32_t *queue = NULL;
    if (!ac || ac_trie_build(&t, words, n, cap, &ac->nwords) != 0)
        goto fail;
    size_t N = t.n;
    ac->n = N;
    queue = malloc(N * sizeof *queue);
    ac->first = malloc((N + 1) * sizeof *ac->first);
    ac->fail = calloc(N, sizeof *ac->fail);
    ac->out_rule = malloc(N * sizeof *ac->out_rule);
    ac->out_link = malloc(N * sizeof *ac->out_link);
    ac->depth = malloc(N * sizeof *ac->depth);
    ac->hold = malloc(N * sizeof *ac->hold);
    ac->label = malloc(N);
    if (!queue || !ac->first || !ac->fail || !ac->out_rule || !ac->out_link || !ac->depth ||
        !ac->hold || !ac->label)
        goto fail;

    /* Renumber breadth-first: queue position = new id. */
    size_t head = 0, tail = 1;
    queue[0] = 0;
    while (head < tail) {
        uint32_t u = queue[head];
        ac->first[head] = (uint32_t)tail;
        ac->label[head] = t.label[u];
        ac->depth[head] = t.depth[u];
        ac->out_rule[head] = t.rule[u];
        head++;
        for (int32_t c = t.child[u]; c >= 0; c = t.sib[c])
            queue[tail++] = (uint32_t)c;
    }
    ac->first[N] = (uint32_t)N;
    ac_trie_free(&t);
    memset(&t, 0, sizeof t);
    free(queue);
    queue = NULL;

    ac->out_link[0] = -1;
    ac->hold[0] = 0;
    for (uint32_t u = 0; u < N; u++) {
        /* fail[u] is shallower, so its hold is already known */
        ac->hold[u] = ac->first[u + 1] > ac->first[u] ? ac->depth[u] : ac->hold[ac->fail[u]];
        for (uint32_t v = ac->first[u]; v < ac->first[u + 1]; v++) {
            uint32_t f = u == 0 ? 0 : flt_ac_step(ac, ac->fail[u], ac->label[v]);
            ac->fail[v] = f;
            ac->out_link[v] = ac->out_rule[f] >= 0 ? (int32_t)f : ac->out_link[f];
        }
    }
    /* dense rows last: flt_ac_step above ran without them */
    size_t nd = N < FLT_AC_DENSE ? N : FLT_AC_DENSE;
    ac->dense = malloc(nd * 256 * sizeof *ac->dense);
    if (!ac->dense)
        goto fail;
    for (size_t u = 0; u < nd; u++) {
        for (unsigned c = 0; c < 256; c++) {
            /* ac_step lowers the byte before this lookup; the ascii run
             * does not: both see the same state */
            uint32_t next = ac_child(ac, (uint32_t)u, flt_lower[c]);
            if (!next && u) /* fail[u] < u: its row is done */
                next = ac->dense[(size_t)ac->fail[u] << 8 | c] & AC_D_STATE;
            if (ac->out_rule[next] >= 0 || ac->out_link[next] >= 0)
                next |= AC_D_OUT;
            if (c >= 0x80)
                next |= AC_D_HIGH;
            ac->dense[u << 8 | c] = next;
        }
    }
    ac->ndense = nd;
    ac_skip_build(ac);
    return ac;

fail:
    ac_trie_free(&t);
    free(queue);
    flt_ac_free(ac);
    return NULL;
}
