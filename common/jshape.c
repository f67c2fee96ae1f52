/*
 * jshape.c — a JSON text's shape kept and matched (see jshape.h). Matching
 * is a compare of the bytes between holes and one run per hole: a string
 * hole runs to the first byte that is '"', '\' or a control byte (16 at a
 * time with SSE2), and only a '"' ends it well; an escaped-string hole goes
 * on past each escape it allows, out of line (most strings have none).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/jshape.h"

/* The first byte of p[i..n) that is '"', '\' or < 0x20, or n. */
static size_t jshape_str_end(const char *p, size_t i, size_t n)
{
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\');
    const __m128i ctl = _mm_set1_epi8(0x1f);
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(p + i));
        /* unsigned v <= 0x1f: min(v, 0x1f) == v */
        __m128i low = _mm_cmpeq_epi8(_mm_min_epu8(v, ctl), v);
        __m128i hit =
            _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)), low);
        int m = _mm_movemask_epi8(hit);
        if (m)
            return i + (size_t)__builtin_ctz((unsigned)m);
    }
#endif
    for (; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"' || c == '\\' || c < 0x20)
            return i;
    }
    return n;
}

size_t sl_jshape_str_end(const char *p, size_t i, size_t n)
{
    return jshape_str_end(p, i, n);
}

/* The value of 4 hex digits at p, or -1. */
static int jshape_hex4(const char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = (unsigned char)p[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return -1;
        v = v << 4 | d;
    }
    return v;
}

/* The end of an escaped string's interior from its escape at p[i] (a '\\')
 * on: its closing '"', or the first byte that is no part of one as jshape.h
 * allows it for kind (a control byte, a bad escape, a surrogate half ESTR
 * or a lone one JSTR refuses), or n. Out of line: most strings have no
 * escape, and jshape_string_end's inline run finds their end. */
static __attribute__((noinline)) size_t jshape_estr_end(const char *p, size_t e, size_t n,
                                                        uint8_t kind)
{
    for (;;) {
        if (e + 1 < n && memchr("\"\\/bfnrt", p[e + 1], 8)) {
            e = jshape_str_end(p, e + 2, n);
        } else {
            /* \uXXXX, not 0000: parsers differ about a NUL; surrogate
             * halves (D800-DFFF) differ too (jansson refuses a lone one,
             * yajl does not), so ESTR takes none and JSTR a high one then
             * a low one */
            int v = e + 5 < n && p[e + 1] == 'u' ? jshape_hex4(p + e + 2) : -1;
            if (v <= 0)
                return e;
            if (v >= 0xD800 && v <= 0xDFFF) {
                if (kind != SL_JHOLE_JSTR || v > 0xDBFF || e + 11 >= n || p[e + 6] != '\\' ||
                    p[e + 7] != 'u')
                    return e;
                int lo = jshape_hex4(p + e + 8);
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return e;
                e += 6;
            }
            e = jshape_str_end(p, e + 6, n);
        }
        if (e == n || p[e] != '\\')
            return e;
    }
}

/* The end of a string hole's interior of kind at p[i..n) (see
 * jshape_str_end, jshape_estr_end); *esc set when it holds an escape. */
static inline size_t jshape_string_end(const char *p, size_t i, size_t n, uint8_t kind, bool *esc)
{
    size_t e = jshape_str_end(p, i, n);
    if (e == n || p[e] != '\\' || kind == SL_JHOLE_STR)
        return e;
    *esc = true;
    return jshape_estr_end(p, e, n, kind);
}

/* The end of an integer token at p[i..n) as jshape.h allows it, or 0. */
static size_t jshape_int_end(const char *p, size_t i, size_t n)
{
    if (i < n && p[i] == '-')
        i++;
    if (i >= n || p[i] < '0' || p[i] > '9')
        return 0;
    if (p[i] == '0')
        return i + 1; /* a following digit fails the shape's next byte */
    size_t d0 = i;
    while (i < n && p[i] >= '0' && p[i] <= '9')
        i++;
    return i - d0 <= SL_JSHAPE_INT_DIGITS ? i : 0;
}

static bool jshape_hole_ok(const char *p, size_t n, sl_jspan_t h, uint8_t kind)
{
    size_t off = h.off, end = (size_t)h.off + h.len;
    if (end > n)
        return false;
    bool esc = false;
    if (kind == SL_JHOLE_STR || kind == SL_JHOLE_ESTR || kind == SL_JHOLE_JSTR)
        return off > 0 && p[off - 1] == '"' && jshape_string_end(p, off, n, kind, &esc) == end &&
               end < n && p[end] == '"';
    /* a whole number token: after a blank or a structural byte, before one */
    if (kind == SL_JHOLE_INT)
        return h.len > 0 && (off == 0 || memchr(" \t\r\n:,[", p[off - 1], 7)) &&
               jshape_int_end(p, off, n) == end && (end == n || memchr(" \t\r\n,]}", p[end], 7));
    return false;
}

/* p's n bytes into sh's storage (grown when short); -1: out of memory,
 * sh emptied. */
static int jshape_store(sl_jshape_t *sh, const char *p, size_t n)
{
    if (n > sh->cap) {
        char *b = realloc(sh->bytes, n);
        if (!b) {
            sl_jshape_clear(sh);
            return -1;
        }
        sh->bytes = b;
        sh->cap = n;
    }
    memcpy(sh->bytes, p, n);
    return 0;
}

int sl_jshape_set(sl_jshape_t *sh, const char *p, size_t n, const sl_jspan_t *holes,
                  const uint8_t *kinds, size_t nholes)
{
    sh->len = 0;
    sh->nholes = 0;
    if (n == 0 || n > SL_JSHAPE_MAX_BYTES || nholes > SL_JSHAPE_MAX_HOLES)
        return 1;
    size_t prev = 0;
    for (size_t i = 0; i < nholes; i++) {
        if (holes[i].off < prev || !jshape_hole_ok(p, n, holes[i], kinds[i]))
            return 1;
        prev = (size_t)holes[i].off + holes[i].len;
        /* two holes need a byte of the shape between them */
        if (i + 1 < nholes && holes[i + 1].off == prev)
            return 1;
    }
    if (jshape_store(sh, p, n) != 0)
        return -1;
    memcpy(sh->hole, holes, nholes * sizeof(*holes));
    memcpy(sh->kind, kinds, nholes);
    sh->nholes = nholes;
    sh->len = n;
    return 0;
}

int sl_jshape_set_text(sl_jshape_t *sh, const char *p, size_t n)
{
    sh->len = 0;
    sh->nholes = 0;
    if (n == 0 || n > SL_JSHAPE_MAX_TEXT)
        return 1;
    if (jshape_store(sh, p, n) != 0)
        return -1;
    sh->len = n;
    return 0;
}

void sl_jshape_clear(sl_jshape_t *sh)
{
    free(sh->bytes);
    sh->bytes = NULL;
    sh->len = sh->cap = 0;
    sh->nholes = 0;
}

/* a[0..n) == b[0..n): a shape's literals between holes are mostly a key
 * or two (under 17 bytes), compared here with two loads each side, not a
 * memcmp call (~100 a stream); longer ones, memcmp. */
static inline bool jshape_eq(const char *a, const char *b, size_t n)
{
    uint64_t x, y, z, w;
    if (n > 16)
        return memcmp(a, b, n) == 0;
    if (n >= 8) {
        memcpy(&x, a, 8), memcpy(&y, b, 8), memcpy(&z, a + n - 8, 8), memcpy(&w, b + n - 8, 8);
        return x == y && z == w;
    }
    if (n >= 4) {
        uint32_t x4, y4, z4, w4;
        memcpy(&x4, a, 4), memcpy(&y4, b, 4), memcpy(&z4, a + n - 4, 4), memcpy(&w4, b + n - 4, 4);
        return x4 == y4 && z4 == w4;
    }
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            return false;
    return true;
}

/* p against sh: all of p, or (used != NULL) p's first *used bytes; *escm
 * gets a bit per hole with an escape in it. */
static bool jshape_match_in(const sl_jshape_t *sh, const char *p, size_t n, sl_jspan_t *out,
                            size_t *used, uint64_t *escm)
{
    uint64_t m = 0;
    if (sh->len == 0 || n > UINT32_MAX)
        return false;
    size_t tp = 0, dp = 0; /* in the shape, in p */
    for (size_t i = 0; i < sh->nholes; i++) {
        size_t lit = sh->hole[i].off - tp;
        if (n - dp < lit || !jshape_eq(p + dp, sh->bytes + tp, lit))
            return false;
        dp += lit;
        tp = (size_t)sh->hole[i].off + sh->hole[i].len;
        size_t e;
        if (sh->kind[i] != SL_JHOLE_INT) {
            bool esc = false;
            e = jshape_string_end(p, dp, n, sh->kind[i], &esc);
            if (e == n || p[e] != '"')
                return false; /* an escape, a control byte or no end */
            if (esc)
                m |= (uint64_t)1 << i;
        } else {
            e = jshape_int_end(p, dp, n);
            if (e == 0)
                return false;
        }
        out[i].off = (uint32_t)dp;
        out[i].len = (uint32_t)(e - dp);
        dp = e;
    }
    size_t lit = sh->len - tp;
    if (used) { /* the shape must end in its own byte: an integer could go on */
        if (lit == 0 || n - dp < lit || !jshape_eq(p + dp, sh->bytes + tp, lit))
            return false;
        *used = dp + lit;
        *escm = m;
        return true;
    }
    if (n - dp != lit || !jshape_eq(p + dp, sh->bytes + tp, lit))
        return false;
    *escm = m;
    return true;
}

bool sl_jshape_match(const sl_jshape_t *sh, const char *p, size_t n, sl_jspan_t *out)
{
    uint64_t m;
    return jshape_match_in(sh, p, n, out, NULL, &m);
}

bool sl_jshape_match_esc(const sl_jshape_t *sh, const char *p, size_t n, sl_jspan_t *out,
                         uint64_t *esc)
{
    return jshape_match_in(sh, p, n, out, NULL, esc);
}

bool sl_jshape_match_prefix(const sl_jshape_t *sh, const char *p, size_t n, sl_jspan_t *out,
                            size_t *used)
{
    uint64_t m;
    return jshape_match_in(sh, p, n, out, used, &m);
}

int64_t sl_jshape_int(const char *p, size_t n)
{
    size_t i = 0;
    bool neg = n > 0 && p[0] == '-';
    if (neg)
        i++;
    int64_t v = 0;
    for (; i < n; i++)
        v = v * 10 + (p[i] - '0');
    return neg ? -v : v;
}

/* ---- a thread's cache of shapes ---------------------------------------------- */

static void sl_jshape_cache_exit(void *p)
{
    sl_jshape_cache_t *c = p;
    sl_jshape_cache_clear(c);
    c->listed = false;
}

/* c on the thread's exit list; -1: it cannot be. */
static int sl_jshape_cache_list(sl_jshape_cache_t *c)
{
    if (sl_thread_at_exit(sl_jshape_cache_exit, c) != 0)
        return -1;
    c->listed = true;
    return 0;
}

int sl_jshape_cache_take(sl_jshape_cache_t *c)
{
    if (!c->listed && sl_jshape_cache_list(c) != 0)
        return -1;
    unsigned v = 0;
    for (unsigned i = 0; i < c->nslots; i++) {
        if (sl_jshape_empty(&c->slot[i].sh)) {
            v = i;
            break;
        }
        if (c->slot[i].used < c->slot[v].used)
            v = i;
    }
    sl_jshape_slot_t *s = &c->slot[v];
    s->sh.len = 0; /* matches nothing until set */
    s->sh.nholes = 0;
    if (c->dsz && !s->data && !(s->data = calloc(1, c->dsz)))
        return -1;
    s->used = ++c->tick;
    c->last = v;
    return (int)v;
}

int sl_jshape_cache_set(sl_jshape_cache_t *c, unsigned i, const char *p, size_t n,
                        const sl_jspan_t *holes, const uint8_t *kinds, size_t nholes)
{
    int rc = sl_jshape_set(&c->slot[i].sh, p, n, holes, kinds, nholes);
    if (rc == 0)
        c->st.learns++;
    return rc;
}

int sl_jshape_cache_set_text(sl_jshape_cache_t *c, unsigned i, const char *p, size_t n)
{
    int rc = sl_jshape_set_text(&c->slot[i].sh, p, n);
    if (rc == 0)
        c->st.learns++;
    return rc;
}

void sl_jshape_cache_clear(sl_jshape_cache_t *c)
{
    for (unsigned i = 0; i < SL_JSHAPE_CACHE_SLOTS; i++) {
        sl_jshape_slot_t *s = &c->slot[i];
        sl_jshape_clear(&s->sh);
        if (s->data && c->drop)
            c->drop(s->data);
        free(s->data);
        s->data = NULL;
        s->used = 0;
    }
    c->tick = 0;
    c->run = c->skip = c->last = 0;
    memset(&c->st, 0, sizeof(c->st));
}
