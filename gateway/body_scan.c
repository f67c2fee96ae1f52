/*
 * body_scan.c — the request body in one yajl pass (see body_scan.h). yajl
 * validates and tokenizes; this file keeps a small stack of where the
 * parser is (top level, stream_options, messages[i], content[j]) and writes
 * down the values sluice decides on, with their byte spans for splices.
 *
 * Acceptance is jansson's (JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, big
 * integers as reals): where yajl is laxer than jansson the difference is
 * checked here and the body sent to the slow path (jansson) rather than
 * judged: yajl takes \v and \f as whitespace, decodes lone surrogates, has
 * no nesting limit and no duplicate-key check, accepts numbers beyond a
 * double and does not reject overlong or surrogate UTF-8 (its string
 * validation is off: PCRE2's UTF check runs instead, and only on a body
 * that has a byte >= 0x80).
 *
 * Each thread keeps its yajl handle between bodies (gw_scan_keep, a stream
 * of values: common/yheap.h); on a ~200-byte request yajl's tokens are
 * what is left (docs/gateway.md, "A small body").
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <uthash.h>
#include <yajl/yajl_parse.h>

#include "common/jshape.h"
#include "common/yheap.h"
#include "gateway/body_scan.h"
#include "ratelimit/ratelimit.h"

/* Deeper than this the scanner stops and jansson decides (its own limit is
 * 2048; real requests nest a handful of levels). */
#define GW_SCAN_DEPTH 256
/* Objects with more keys than this check duplicates through a hash. */
#define GW_SCAN_LINEAR_KEYS 24
/* 2^53: json_intake.c's bound for turning integral reals back into ints. */
#define GW_SCAN_EXACT 9007199254740992.0
/* A string literal as (pointer, length). */
#define GW_LIT_S(lit) lit, sizeof(lit) - 1

/* Decoded strings and splice texts: chunks that never move. */
struct gw_scan_arena {
    struct gw_scan_arena *next;
    size_t used, cap;
    char data[];
};

typedef enum gw_role {
    GW_R_OTHER = 0,
    GW_R_TOP,
    GW_R_SO,    /* the stream_options object */
    GW_R_MSGS,  /* the messages array */
    GW_R_MSG,   /* one message object */
    GW_R_PARTS, /* a message's content array */
    GW_R_PART,  /* one content part */
} gw_role_t;

typedef enum gw_key {
    GW_K_NONE = 0,
    GW_K_MODEL,
    GW_K_STREAM,
    GW_K_SO,
    GW_K_MAXT,
    GW_K_MAXCT,
    GW_K_MAXOT,
    GW_K_N,
    GW_K_INPUT,
    GW_K_INSTRUCTIONS,
    GW_K_MESSAGES,
    GW_K_TOOLS,
    GW_K_IU,
    GW_K_ROLE,
    GW_K_CONTENT,
    GW_K_NAME,
    GW_K_TOOL_CALLS,
    GW_K_TYPE,
    GW_K_TEXT,
    GW_K_IMAGE_URL,
} gw_key_t;

typedef struct gw_kent {
    UT_hash_handle hh;
    const char *p;
    size_t n;
} gw_kent_t;

typedef struct gw_frame {
    uint8_t role;
    bool obj;
    uint8_t key;   /* objects: the member whose value comes next */
    size_t keys0;  /* objects: first of its keys in the key stack */
    size_t idx;    /* GW_R_MSG: message index; GW_R_PART: part index */
    size_t count;  /* members or elements so far */
    gw_jfact_t *f; /* the fact this container is, if any */
    bool tc;       /* a message's tool_calls (idx: the message): its span recorded */
    gw_kent_t *hash;
} gw_frame_t;

/* One cut of the skeleton: yajl's offset of the first byte after it, and
 * the body bytes cut up to and including it. */
typedef struct gw_elide {
    size_t skel;
    size_t gone;
} gw_elide_t;

/* The holes a parse found for the shape it may leave (see "shapes"):
 * value spans in the body, and whether a recorded fact reads the value
 * (those are kept first when there are more than a shape holds); and the
 * texts that are a string's decoded copy (it had escapes), each with the
 * body offset of its string's interior, where a hit finds it again. */
#define GW_SHAPE_REC_MAX 128
typedef struct gw_shape_rec {
    bool ok; /* false: a string a shape cannot hold (see gw_shape_rec_str) */
    size_t n;
    sl_jspan_t hole[GW_SHAPE_REC_MAX];
    uint8_t kind[GW_SHAPE_REC_MAX];
    bool read[GW_SHAPE_REC_MAX];
    size_t ndec;
    const char *dec[SL_JSHAPE_MAX_HOLES];
    uint32_t dec_off[SL_JSHAPE_MAX_HOLES];
} gw_shape_rec_t;

typedef struct gw_scan_ctx {
    gw_body_scan_t *s;
    gw_shape_rec_t *rec; /* NULL: no shape is kept from this parse */
    yajl_handle h;
    const char *base; /* what yajl reads: the body, or its skeleton */
    size_t blen;
    const gw_elide_t *el; /* the skeleton's cuts, in order (none: base is the body) */
    size_t nel;
    size_t plain_len; /* blen, or 0 with a skeleton: gw_scan_plain's one compare */
    unsigned flags;
    gw_scan_rc_t rc;
    gw_frame_t st[GW_SCAN_DEPTH];
    int depth;
    gw_frame_t *top; /* st[depth - 1] (depth > 0) */
    sl_text_t *keys;
    size_t nkeys, keys_cap;
    sl_text_t key_inline[64];
} gw_scan_ctx_t;

/* The thread's yajl handle, kept between bodies (common/yheap.h): a body
 * that parsed whole and has only blanks after it leaves it between values;
 * a second value inside one body is trailing garbage to jansson, and
 * gw_scan_slot stops at it. */
static _Thread_local sl_ykeep_t gw_scan_keep;

#define GW_SCAN_CTX(ctx) ((gw_scan_ctx_t *)((sl_ykeep_t *)(ctx))->cur)

/* ---- arena ------------------------------------------------------------------- */

/* Grows an array that starts in the struct (inline, n0 elements). */
static int gw_grow(void **arr, size_t *cap, void *inline0, size_t n0, size_t elem)
{
    if (*cap == 0) {
        *arr = inline0;
        *cap = n0;
        return 0;
    }
    size_t ncap = *cap * 2;
    void *n = *arr == inline0 ? malloc(ncap * elem) : realloc(*arr, ncap * elem);
    if (!n)
        return -1;
    if (*arr == inline0)
        memcpy(n, inline0, *cap * elem);
    *arr = n;
    *cap = ncap;
    return 0;
}

static char *gw_arena_alloc(gw_body_scan_t *s, size_t n)
{
    if (GW_SCAN_INLINE_TEXT - s->text0_used >= n) {
        char *p = s->text0 + s->text0_used;
        s->text0_used += n;
        return p;
    }
    gw_scan_arena_t *a = s->arena;
    if (!a || a->cap - a->used < n) {
        size_t cap = n > 4000 ? n : 4000;
        gw_scan_arena_t *na = malloc(sizeof(*na) + cap);
        if (!na)
            return NULL;
        na->next = a;
        na->used = 0;
        na->cap = cap;
        s->arena = na;
        a = na;
    }
    char *p = a->data + a->used;
    a->used += n;
    return p;
}

const gw_jfact_t gw_jfact_absent = {.kind = SL_J_ABSENT};

/* A fact the scan is about to write (its kind at least): from now on
 * gw_body_fact reads it. */
static inline gw_jfact_t *gw_fact_w(gw_body_scan_t *s, gw_fact_id_t id)
{
    s->facts_set |= (uint16_t)(1u << id);
    return &s->fact[id];
}

gw_body_scan_t *gw_body_scan_new(void)
{
    return calloc(1, sizeof(gw_body_scan_t));
}

void gw_body_scan_reset(gw_body_scan_t *s)
{
    if (!s)
        return;
    /* Keep the newest chunk (the next request's strings fit it mostly). */
    gw_scan_arena_t *a = s->arena;
    if (a) {
        gw_scan_arena_t *o = a->next;
        while (o) {
            gw_scan_arena_t *n = o->next;
            free(o);
            o = n;
        }
        a->next = NULL;
        a->used = 0;
    }
    /* What the next scan and the readers look at, and no more (a memset of
     * the ~700 bytes before msgs0 was ~100 instructions a request): a
     * fact's other fields are read only for its kind and are written with
     * it; messages and parts are cleared as each is added (msg_new,
     * part_new), the inline arrays rewritten before they are read. */
    s->body = NULL;
    s->len = 0;
    s->facts_set = 0; /* every fact absent, none of their lines written */
    s->bigint = false;
    s->has_msgs = false;
    s->elided = 0;
    s->chat = (sl_chat_t){0};
    s->nparts = 0;
    s->nsplices = 0;
    s->text0_used = 0;
}

void gw_body_scan_free(gw_body_scan_t *s)
{
    if (!s)
        return;
    gw_scan_arena_t *a = s->arena;
    while (a) {
        gw_scan_arena_t *n = a->next;
        free(a);
        a = n;
    }
    if (s->msgs != s->msgs0)
        free(s->msgs);
    if (s->parts != s->parts0)
        free(s->parts);
    if (s->splices != s->splices0)
        free(s->splices);
    free(s);
}

/* ---- checks yajl does not make ------------------------------------------------- */

static pcre2_code *gw_utf_re;
static pthread_once_t gw_utf_once = PTHREAD_ONCE_INIT;

static void gw_utf_init(void)
{
    int err;
    PCRE2_SIZE eoff;
    gw_utf_re = pcre2_compile((PCRE2_SPTR) "", 0, PCRE2_UTF, &err, &eoff, NULL);
}

/* What one pass over the raw bytes tells the scanner before yajl runs. */
#define GW_BYTES_HIGH  0x1u /* a byte >= 0x80: the UTF-8 check must run */
#define GW_BYTES_VT_FF 0x2u /* a \v or \f: yajl's whitespace, not jansson's */

typedef unsigned char gw_v32 __attribute__((vector_size(32)));
typedef uint64_t gw_v4q __attribute__((vector_size(32)));

/* One 128-byte step of gw_scan_bytes at q (a macro: a vector argument
 * would change ABI between the two builds). \v is 11, \f 12: (byte - 11)
 * < 2, unsigned. */
#define GW_BYTES_STEP(q)                                                                           \
    do {                                                                                           \
        gw_v32 a_, b_, c_, d_;                                                                     \
        memcpy(&a_, (q), 32);                                                                      \
        memcpy(&b_, (q) + 32, 32);                                                                 \
        memcpy(&c_, (q) + 64, 32);                                                                 \
        memcpy(&d_, (q) + 96, 32);                                                                 \
        hi |= a_ | b_ | c_ | d_;                                                                   \
        vf |= (gw_v32)((a_ - k11) < k2) | (gw_v32)((b_ - k11) < k2) | (gw_v32)((c_ - k11) < k2) |  \
              (gw_v32)((d_ - k11) < k2);                                                           \
    } while (0)

/* Both facts in one pass, 128 bytes a step: this runs over every body, and
 * at a MiB the separate passes (two memchr and a word loop) cost ~0.1 us
 * per KiB beside yajl's ~0.6. Built twice (AVX2 and the baseline, picked
 * at load time): the AVX2 one is ~3x faster. The last < 128 bytes take
 * one more step from a zeroed copy (a NUL is neither fact): byte by byte
 * they cost a typical ~200-byte request ~800 instructions, the step ~60. */
__attribute__((target_clones("avx2", "default"))) static unsigned gw_scan_bytes(const char *p,
                                                                                size_t n)
{
    const gw_v32 k11 = (gw_v32){0} + 11, k2 = (gw_v32){0} + 2;
    gw_v32 hi = {0}, vf = {0};
    size_t i = 0;
    for (; i + 128 <= n; i += 128)
        GW_BYTES_STEP(p + i);
    if (i < n) {
        char last[128] = {0};
        memcpy(last, p + i, n - i);
        GW_BYTES_STEP(last);
    }
    gw_v4q h4 = (gw_v4q)hi & ((gw_v4q){0} + 0x8080808080808080ull), f4 = (gw_v4q)vf;
    bool h = (h4[0] | h4[1] | h4[2] | h4[3]) != 0, f = (f4[0] | f4[1] | f4[2] | f4[3]) != 0;
    return (h ? GW_BYTES_HIGH : 0) | (f ? GW_BYTES_VT_FF : 0);
}

/* ---- the skeleton ---------------------------------------------------------------
 *
 * A chat body is mostly long string interiors (message contents), and yajl
 * lexes every byte of them through a table (~0.6 us per KiB, most of what a
 * large body costs in user space). A run of bytes inside a string with no
 * '"', no '\\' and no byte < 0x20 is valid string content whatever it holds
 * (UTF-8 is checked apart, over the whole body, and yajl's string validation
 * is off): yajl need not see it. So one byte pass finds those runs, and yajl
 * parses a skeleton, the body with the long runs' middles cut out (a few
 * bytes of each end kept, so no string changes kind or becomes empty).
 * Every offset a callback records is mapped back to the body, and strings are
 * read from the body's bytes (a string with escapes and a cut: its pieces
 * between cuts decoded by yajl, the cut bytes copied as they are). yajl
 * still judges every token and the grammar;
 * the pass only tracks the string state ('"' toggles it, '\\' inside a string
 * escapes the next byte), which is the lexer's state as long as the lexer
 * has not failed, and a body it cannot follow (a control byte inside a
 * string, a string open at the end) gets no cuts: yajl reads it whole. */

/* Bodies shorter than this are read whole (the pass and the copy would
 * cost more than they save). */
#define GW_SKEL_BODY_MIN 4096
/* A run this long or longer is cut ... */
#define GW_SKEL_RUN_MIN 256
/* ... keeping this many of its bytes at each end. */
#define GW_SKEL_KEEP 4
/* Cuts found on the stack before any is allocated. */
#define GW_SKEL_INLINE_CUTS 32

typedef struct gw_cut {
    size_t a, b; /* body bytes [a, b) cut */
} gw_cut_t;

typedef struct gw_skel {
    size_t run_min, keep;
    gw_cut_t *cuts;
    size_t ncuts, cap;
    size_t gone;
    bool ok; /* false: no cuts (the pass could not follow, or OOM) */
    bool in, esc;
    size_t rs; /* the current run's start, inside a string */
    gw_cut_t cuts0[GW_SKEL_INLINE_CUTS];
} gw_skel_t;

/* The run [k->rs, j) ends: cut its middle when it is long enough. */
static void gw_skel_run_end(gw_skel_t *k, size_t j)
{
    if (j < k->rs || j - k->rs < k->run_min)
        return; /* short (or a \u escape cut short: yajl refuses it) */
    if (k->ncuts == k->cap &&
        gw_grow((void **)&k->cuts, &k->cap, k->cuts0, GW_SKEL_INLINE_CUTS, sizeof(*k->cuts)) != 0) {
        k->ok = false;
        return;
    }
    gw_cut_t *c = &k->cuts[k->ncuts++];
    c->a = k->rs + k->keep;
    c->b = j - k->keep;
    k->gone += c->b - c->a;
}

/* One byte at offset j that may change the string state. */
static inline void gw_skel_byte(gw_skel_t *k, unsigned char ch, size_t j)
{
    if (!k->in) {
        if (ch == '"') {
            k->in = true;
            k->rs = j + 1;
        }
        return;
    }
    if (k->esc) {
        k->esc = false;
        k->rs = ch == 'u' ? j + 5 : j + 1; /* \uXXXX: its digits are no run */
    } else if (ch == '\\') {
        gw_skel_run_end(k, j);
        k->esc = true;
    } else if (ch == '"') {
        gw_skel_run_end(k, j);
        k->in = false;
    } else if (ch < 0x20) {
        k->ok = false;
    }
}

/* Any byte of a gw_v32 set (a macro: a vector argument would change ABI
 * between the two builds of the pass). */
#define GW_V32_ANY(m)                                                                              \
    ((((gw_v4q)(m))[0] | ((gw_v4q)(m))[1] | ((gw_v4q)(m))[2] | ((gw_v4q)(m))[3]) != 0)

/* gw_scan_bytes's facts and, in the same pass, the runs to cut (into k):
 * a 64-byte block with no '"', '\\' or control byte leaves the string state
 * as it was, so only the other blocks are walked byte by byte. */
__attribute__((target_clones("avx2", "default"))) static unsigned
gw_scan_bytes_skel(const char *p, size_t n, gw_skel_t *k)
{
    const gw_v32 k11 = (gw_v32){0} + 11, k2 = (gw_v32){0} + 2, kq = (gw_v32){0} + '"',
                 kb = (gw_v32){0} + '\\', k20 = (gw_v32){0} + 0x20;
    gw_v32 hi = {0}, vf = {0};
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        gw_v32 a, b;
        memcpy(&a, p + i, 32);
        memcpy(&b, p + i + 32, 32);
        hi |= a | b;
        vf |= (gw_v32)((a - k11) < k2) | (gw_v32)((b - k11) < k2);
        gw_v32 m = (gw_v32)(a == kq) | (gw_v32)(a == kb) | (gw_v32)(a < k20) | (gw_v32)(b == kq) |
                   (gw_v32)(b == kb) | (gw_v32)(b < k20);
        if (!k->ok || (!k->esc && !GW_V32_ANY(m)))
            continue;
        for (size_t j = i; j < i + 64; j++)
            gw_skel_byte(k, (unsigned char)p[j], j);
    }
    unsigned h = 0, f = 0;
    for (size_t j = 0; j < sizeof(hi); j++) {
        h |= hi[j];
        f |= vf[j];
    }
    for (; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        h |= ch;
        f |= (unsigned char)(ch - 11) < 2;
        if (k->ok)
            gw_skel_byte(k, ch, i);
    }
    if (k->in)
        k->ok = false; /* a string still open: yajl judges the real bytes */
    return (h & 0x80 ? GW_BYTES_HIGH : 0) | (f ? GW_BYTES_VT_FF : 0);
}

/* The skeleton of body (k's cuts) into out (k->gone fewer bytes), and the
 * map of its offsets back to the body into el (k->ncuts entries). */
static void gw_skel_build(const gw_skel_t *k, const char *body, size_t len, char *out,
                          gw_elide_t *el)
{
    size_t at = 0, o = 0, gone = 0;
    for (size_t i = 0; i < k->ncuts; i++) {
        const gw_cut_t *c = &k->cuts[i];
        memcpy(out + o, body + at, c->a - at);
        o += c->a - at;
        gone += c->b - c->a;
        el[i].skel = o;
        el[i].gone = gone;
        at = c->b;
    }
    memcpy(out + o, body + at, len - at);
}

/* Strict UTF-8 (no overlongs, surrogates or beyond U+10FFFF), as jansson
 * wants it: PCRE2 checks the whole subject before matching the empty
 * pattern. Only for a body with a byte >= 0x80 (gw_scan_bytes). */
static int gw_scan_utf8_ok(const char *p, size_t n)
{
    pthread_once(&gw_utf_once, gw_utf_init);
    if (!gw_utf_re)
        return 0;
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md)
        return 0;
    int rc = pcre2_match(gw_utf_re, (PCRE2_SPTR)p, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}

static int gw_hex4(const char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return -1;
    }
    return v;
}

/* Surrogate escapes in a string's raw bytes (between its quotes) come in
 * high-low pairs: jansson refuses anything else, yajl would decode it. The
 * lexer already checked the escapes' syntax. */
static bool gw_scan_surrogates_ok(const char *p, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++) {
        if (p[i] != '\\')
            continue;
        if (p[i + 1] != 'u') {
            i++; /* a two-byte escape: skip its second byte */
            continue;
        }
        if (i + 6 > n)
            return false;
        int v = gw_hex4(p + i + 2);
        if (v < 0 || (v >= 0xDC00 && v <= 0xDFFF))
            return false;
        if (v >= 0xD800 && v <= 0xDBFF) {
            if (i + 12 > n || p[i + 6] != '\\' || p[i + 7] != 'u')
                return false;
            int lo = gw_hex4(p + i + 8);
            if (lo < 0xDC00 || lo > 0xDFFF)
                return false;
            i += 6;
        }
        i += 5;
    }
    return true;
}

/* ---- facts ------------------------------------------------------------------- */

static int gw_scan_stop(gw_scan_ctx_t *c, gw_scan_rc_t rc)
{
    c->rc = rc;
    return 0; /* yajl: cancel the parse */
}

/* The members the scanner records, by the object they are in: a switch on
 * the role and the key's length, then one compare of a constant length
 * (inlined: a table walk with memcmp cost ~100 instructions a key). */
#define GW_KEY_IS(lit) (memcmp(k, lit, sizeof(lit) - 1) == 0)

static gw_key_t gw_key_top(const char *k, size_t n)
{
    switch (n) {
    case 1:
        return k[0] == 'n' ? GW_K_N : GW_K_NONE;
    case 5:
        return GW_KEY_IS("model")   ? GW_K_MODEL
               : GW_KEY_IS("tools") ? GW_K_TOOLS
               : GW_KEY_IS("input") ? GW_K_INPUT
                                    : GW_K_NONE;
    case 6:
        return GW_KEY_IS("stream") ? GW_K_STREAM : GW_K_NONE;
    case 8:
        return GW_KEY_IS("messages") ? GW_K_MESSAGES : GW_K_NONE;
    case 10:
        return GW_KEY_IS("max_tokens") ? GW_K_MAXT : GW_K_NONE;
    case 12:
        return GW_KEY_IS("instructions") ? GW_K_INSTRUCTIONS : GW_K_NONE;
    case 14:
        return GW_KEY_IS("stream_options") ? GW_K_SO : GW_K_NONE;
    case 17:
        return GW_KEY_IS("max_output_tokens") ? GW_K_MAXOT : GW_K_NONE;
    case 21:
        return GW_KEY_IS("max_completion_tokens") ? GW_K_MAXCT : GW_K_NONE;
    default:
        return GW_K_NONE;
    }
}

static gw_key_t gw_key_of(gw_role_t role, const char *k, size_t n)
{
    switch (role) {
    case GW_R_TOP:
        return gw_key_top(k, n);
    case GW_R_SO:
        return n == 13 && GW_KEY_IS("include_usage") ? GW_K_IU : GW_K_NONE;
    case GW_R_MSG:
        if (n == 4)
            return GW_KEY_IS("role") ? GW_K_ROLE : GW_KEY_IS("name") ? GW_K_NAME : GW_K_NONE;
        if (n == 7)
            return GW_KEY_IS("content") ? GW_K_CONTENT : GW_K_NONE;
        return n == 10 && GW_KEY_IS("tool_calls") ? GW_K_TOOL_CALLS : GW_K_NONE;
    case GW_R_PART:
        if (n == 4)
            return GW_KEY_IS("type") ? GW_K_TYPE : GW_KEY_IS("text") ? GW_K_TEXT : GW_K_NONE;
        return n == 9 && GW_KEY_IS("image_url") ? GW_K_IMAGE_URL : GW_K_NONE;
    default:
        return GW_K_NONE; /* the common case (objects nothing is read from) */
    }
}
#undef GW_KEY_IS

/* Where a value goes: a top-level fact, a message's or a part's field.
 * Returns the fact (top level and stream_options) or NULL; *kind_out and
 * *text_out point at a message's/part's slots when it is one of those. */
typedef struct gw_slot {
    gw_jfact_t *f;
    sl_jkind_t *kind;
    sl_text_t *text;
    gw_role_t child; /* the role a container value takes */
    bool tc;         /* a message's tool_calls (the frame's message) */
} gw_slot_t;

static int gw_scan_msg_new(gw_scan_ctx_t *c, size_t *idx)
{
    gw_body_scan_t *s = c->s;
    if (s->chat.nmsgs == s->msgs_cap && gw_grow((void **)&s->msgs, &s->msgs_cap, s->msgs0,
                                                GW_SCAN_INLINE_MSGS, sizeof(*s->msgs)) != 0)
        return -1;
    *idx = s->chat.nmsgs++;
    memset(&s->msgs[*idx], 0, sizeof(s->msgs[*idx]));
    s->msgs[*idx].part0 = s->nparts;
    return 0;
}

static int gw_scan_part_new(gw_scan_ctx_t *c, size_t *idx)
{
    gw_body_scan_t *s = c->s;
    if (s->nparts == s->parts_cap && gw_grow((void **)&s->parts, &s->parts_cap, s->parts0,
                                             GW_SCAN_INLINE_PARTS, sizeof(*s->parts)) != 0)
        return -1;
    *idx = s->nparts++;
    memset(&s->parts[*idx], 0, sizeof(s->parts[*idx]));
    return 0;
}

/* Finds the slot the value about to be reported fills. -1: OOM, 1: a value
 * after the document (the caller stops: jansson decides). */
static inline __attribute__((always_inline)) int gw_scan_slot(gw_scan_ctx_t *c, sl_jkind_t kind,
                                                              gw_slot_t *slot)
{
    memset(slot, 0, sizeof(*slot));
    gw_body_scan_t *s = c->s;
    if (c->depth == 0) {
        /* yajl parses a stream of values (gw_scan_keep): a second one
         * after the body's is trailing garbage to jansson */
        if (s->facts_set & (1u << GW_F_TOP))
            return 1;
        slot->f = gw_fact_w(s, GW_F_TOP);
        slot->f->kind = kind;
        slot->child = kind == SL_J_OBJECT ? GW_R_TOP : GW_R_OTHER;
        return 0;
    }
    gw_frame_t *fr = c->top;
    fr->count += !fr->obj;
    switch ((gw_role_t)fr->role) {
    case GW_R_TOP:
        switch ((gw_key_t)fr->key) {
        case GW_K_MODEL:
            slot->f = gw_fact_w(s, GW_F_MODEL);
            break;
        case GW_K_STREAM:
            slot->f = gw_fact_w(s, GW_F_STREAM);
            break;
        case GW_K_SO:
            slot->f = gw_fact_w(s, GW_F_STREAM_OPTIONS);
            slot->child = GW_R_SO;
            break;
        case GW_K_MAXT:
            slot->f = gw_fact_w(s, GW_F_MAX_TOKENS);
            break;
        case GW_K_MAXCT:
            slot->f = gw_fact_w(s, GW_F_MAX_COMPLETION_TOKENS);
            break;
        case GW_K_MAXOT:
            slot->f = gw_fact_w(s, GW_F_MAX_OUTPUT_TOKENS);
            break;
        case GW_K_N:
            slot->f = gw_fact_w(s, GW_F_N);
            break;
        case GW_K_INPUT:
            slot->f = gw_fact_w(s, GW_F_INPUT);
            break;
        case GW_K_INSTRUCTIONS:
            slot->f = gw_fact_w(s, GW_F_INSTRUCTIONS);
            break;
        case GW_K_MESSAGES:
            if (c->flags & GW_SCAN_MSGS) {
                slot->kind = &s->chat.messages_kind;
                slot->child = GW_R_MSGS;
            }
            break;
        case GW_K_TOOLS:
            slot->kind = &s->chat.tools_kind;
            slot->f = gw_fact_w(s, GW_F_TOOLS); /* its span: the estimate counts its JSON */
            break;
        default:
            break;
        }
        break;
    case GW_R_SO:
        if (fr->key == GW_K_IU)
            slot->f = gw_fact_w(s, GW_F_INCLUDE_USAGE);
        break;
    case GW_R_MSGS: {
        size_t i;
        if (gw_scan_msg_new(c, &i) != 0)
            return -1;
        s->msgs[i].kind = kind;
        slot->child = GW_R_MSG;
        break;
    }
    case GW_R_MSG: {
        sl_chat_msg_t *m = &s->msgs[fr->idx];
        switch ((gw_key_t)fr->key) {
        case GW_K_ROLE:
            slot->kind = &m->role_kind;
            slot->text = &m->role;
            break;
        case GW_K_CONTENT:
            slot->kind = &m->content_kind;
            slot->text = &m->content;
            slot->child = GW_R_PARTS;
            break;
        case GW_K_NAME:
            slot->kind = &m->name_kind;
            slot->text = &m->name;
            break;
        case GW_K_TOOL_CALLS:
            slot->kind = &m->tool_calls_kind;
            slot->tc = true;
            break;
        default:
            break;
        }
        break;
    }
    case GW_R_PARTS: {
        size_t i;
        if (gw_scan_part_new(c, &i) != 0)
            return -1;
        s->parts[i].kind = kind;
        s->msgs[fr->idx].nparts++;
        slot->child = GW_R_PART;
        break;
    }
    case GW_R_PART: {
        sl_chat_part_t *p = &s->parts[fr->idx];
        switch ((gw_key_t)fr->key) {
        case GW_K_TYPE:
            slot->kind = &p->type_kind;
            slot->text = &p->type;
            break;
        case GW_K_TEXT:
            slot->kind = &p->text_kind;
            slot->text = &p->text;
            break;
        case GW_K_IMAGE_URL:
            p->image_url = true;
            break;
        default:
            break;
        }
        break;
    }
    default:
        break;
    }
    if (slot->kind)
        *slot->kind = kind;
    if (slot->f) {
        slot->f->kind = kind;
    }
    /* Only the roles below a container that is itself recorded matter. */
    if (slot->child == GW_R_PARTS && kind != SL_J_ARRAY)
        slot->child = GW_R_OTHER;
    if ((slot->child == GW_R_MSG || slot->child == GW_R_PART || slot->child == GW_R_SO ||
         slot->child == GW_R_TOP) &&
        kind != SL_J_OBJECT)
        slot->child = GW_R_OTHER;
    if (slot->child == GW_R_MSGS && kind != SL_J_ARRAY)
        slot->child = GW_R_OTHER;
    return 0;
}

/* The token just reported ends at yajl's bytes consumed (an offset in
 * what yajl reads). */
static size_t gw_scan_pos(gw_scan_ctx_t *c)
{
    return yajl_get_bytes_consumed(c->h);
}

/* The body offset of the byte at offset x of what yajl reads. */
static size_t gw_scan_at(const gw_scan_ctx_t *c, size_t x)
{
    if (c->nel == 0 || x < c->el[0].skel)
        return x;
    size_t lo = 0, hi = c->nel; /* the last cut at or before x */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->el[mid].skel <= x)
            lo = mid;
        else
            hi = mid;
    }
    return x + c->el[lo].gone;
}

/* The body offset an exclusive end x (> 0) of what yajl reads stands for. */
static size_t gw_scan_end(const gw_scan_ctx_t *c, size_t x)
{
    return gw_scan_at(c, x - 1) + 1;
}

static int gw_scan_scalar(gw_scan_ctx_t *c, sl_jkind_t kind, size_t off, size_t end)
{
    gw_slot_t slot;
    int sr = gw_scan_slot(c, kind, &slot);
    if (sr != 0)
        return gw_scan_stop(c, sr < 0 ? GW_SCAN_OOM : GW_SCAN_SLOW);
    if (slot.f) {
        slot.f->off = off;
        slot.f->end = end;
    }
    return 1;
}

/* A value the kept shape may leave as a hole (jshape.h): a string's
 * interior (off, n bytes) or an integer token, in the body; read: a fact
 * or a message's field is its value (recomputed from the new span on a
 * hit). Past GW_SHAPE_REC_MAX the values stay shape bytes. */
static inline void gw_shape_rec_add(gw_scan_ctx_t *c, size_t off, size_t n, uint8_t kind, bool read)
{
    gw_shape_rec_t *r = c->rec;
    if (r->n == GW_SHAPE_REC_MAX)
        return;
    r->hole[r->n] = (sl_jspan_t){(uint32_t)off, (uint32_t)n};
    r->kind[r->n] = kind;
    r->read[r->n] = read;
    r->n++;
}

/* A string or key a shape cannot hold: no shape from this body. */
static inline void gw_shape_rec_off(gw_scan_ctx_t *c)
{
    if (c->rec) {
        c->rec->ok = false;
        c->rec = NULL;
    }
}

/* A role's or a part's type: a word policies match, so shape bytes. */
static inline bool gw_scan_word(const gw_scan_ctx_t *c)
{
    const gw_frame_t *fr = c->top;
    return fr && ((fr->role == GW_R_MSG && fr->key == GW_K_ROLE) ||
                  (fr->role == GW_R_PART && fr->key == GW_K_TYPE));
}

static int gw_cb_null(void *ctx)
{
    gw_scan_ctx_t *c = GW_SCAN_CTX(ctx);
    size_t end = gw_scan_end(c, gw_scan_pos(c));
    return gw_scan_scalar(c, SL_J_NULL, end - 4, end);
}

static int gw_cb_bool(void *ctx, int v)
{
    gw_scan_ctx_t *c = GW_SCAN_CTX(ctx);
    size_t end = gw_scan_end(c, gw_scan_pos(c));
    return gw_scan_scalar(c, v ? SL_J_TRUE : SL_J_FALSE, end - (v ? 4 : 5), end);
}

/* An integral token of at most 18 digits fits an int64 whatever they are:
 * read here, where strtoll (and errno) cost ~130 instructions a number.
 * yajl checked the token's grammar (-?digits, no leading zero); false: a
 * real ('.', 'e', 'E') or a longer integer, for strtoll/strtod. */
static inline bool gw_scan_short_int(const char *p, size_t n, int64_t *out)
{
    size_t i = n > 0 && p[0] == '-';
    if (n - i > 18)
        return false;
    int64_t v = 0;
    for (size_t j = i; j < n; j++) {
        unsigned d = (unsigned)(unsigned char)p[j] - '0';
        if (d > 9)
            return false;
        v = v * 10 + (int64_t)d;
    }
    *out = i ? -v : v;
    return true;
}

/* A token gw_scan_short_int does not read: a real, or an integer of 19
 * digits or more. -1: beyond a double (jansson: numeric overflow). */
static int gw_scan_number_long(gw_body_scan_t *s, const char *p, size_t n, int64_t *iv,
                               sl_jkind_t *kind)
{
    bool integral = true; /* a number token of a few bytes: one look at each */
    for (size_t i = 0; i < n && integral; i++)
        integral = p[i] != '.' && p[i] != 'e' && p[i] != 'E';
    *kind = SL_J_REAL;
    errno = 0;
    if (integral) {
        char *e;
        long long v = strtoll(p, &e, 10);
        if (errno == 0 && e == p + n) {
            *iv = v;
            *kind = SL_J_INT;
            return 0;
        }
        s->bigint = true; /* jansson: the whole body again, as reals */
    }
    errno = 0;
    double d = strtod(p, NULL);
    if (errno == ERANGE && (d == HUGE_VAL || d == -HUGE_VAL))
        return -1;
    return 0;
}

static int gw_cb_number(void *ctx, const char *p, size_t n)
{
    gw_scan_ctx_t *c = GW_SCAN_CTX(ctx);
    int64_t iv = 0;
    sl_jkind_t kind = SL_J_INT;
    /* The token is followed by a delimiter inside the body (the document
     * is an object, so a '}' comes later): strtoll/strtod stop there. */
    if (p < c->base || p + n >= c->base + c->blen)
        return gw_scan_stop(c, GW_SCAN_SLOW);
    bool short_int = gw_scan_short_int(p, n, &iv);
    if (!short_int && gw_scan_number_long(c->s, p, n, &iv, &kind) != 0)
        return gw_scan_stop(c, GW_SCAN_SLOW); /* jansson: numeric overflow */
    gw_slot_t slot;
    int sr = gw_scan_slot(c, kind, &slot);
    if (sr != 0)
        return gw_scan_stop(c, sr < 0 ? GW_SCAN_OOM : GW_SCAN_SLOW);
    /* reals stay shape bytes: a real's kind and value are not re-read */
    if (c->rec && short_int)
        gw_shape_rec_add(c, (size_t)(p - c->base), n, SL_JHOLE_INT, slot.f != NULL);
    if (slot.f) {
        slot.f->off = gw_scan_at(c, (size_t)(p - c->base));
        slot.f->end = slot.f->off + n;
        slot.f->i = iv;
    }
    return 1;
}

/* A string token's raw bytes [*off, *end) in the body, and whether it had
 * escapes (then p is yajl's decoded copy). *cut: a skeleton's cut is inside
 * it (then yajl's decoded copy lacks the cut bytes). */
typedef struct gw_span {
    size_t off, end; /* in the body */
    size_t so, se;   /* in what yajl read */
    bool escaped, cut;
} gw_span_t;

static int gw_scan_string_span(gw_scan_ctx_t *c, const char *p, size_t n, gw_span_t *sp)
{
    const char *b = c->base;
    size_t so, se;
    if (p >= b && p < b + c->blen) {
        so = (size_t)(p - b) - 1;
        se = so + n + 2;
        sp->escaped = false;
    } else {
        /* Escaped: yajl hands out its decoded copy. The token ends at the
         * bytes consumed; it starts at the nearest quote before that not
         * escaped (a quote inside a valid string always is). Cuts hold no
         * '\\' or '"': the skeleton's bytes tell the same. */
        sp->escaped = true;
        se = gw_scan_pos(c);
        if (se < 2 || se > c->blen || b[se - 1] != '"')
            return -1;
        size_t i = se - 1;
        while (i > 0) {
            i--;
            if (b[i] != '"')
                continue;
            size_t bs = 0;
            while (bs < i && b[i - 1 - bs] == '\\')
                bs++;
            if (bs % 2 == 0)
                break;
        }
        if (b[i] != '"')
            return -1;
        so = i;
        if (!gw_scan_surrogates_ok(b + so + 1, se - so - 2))
            return -1;
    }
    sp->so = so;
    sp->se = se;
    if (c->nel == 0) { /* no skeleton: yajl's offsets are the body's */
        sp->off = so;
        sp->end = se;
        sp->cut = false;
        return 0;
    }
    sp->off = gw_scan_at(c, so);
    sp->end = gw_scan_end(c, se);
    sp->cut = sp->end - sp->off != se - so;
    return 0;
}

/* gw_scan_decode's state: the output, and the cuts to put between the
 * decoded pieces. */
typedef struct gw_dec {
    const gw_scan_ctx_t *c;
    char *o;
    size_t n, cap;
    size_t cut, ncut; /* the next cut (index in c->el), cuts left */
    bool ok;
} gw_dec_t;

/* One piece decoded: onto the output, then the cut after it, copied from
 * the body. */
static int gw_dec_string(void *ctx, const unsigned char *p, size_t n)
{
    gw_dec_t *d = ctx;
    if (d->cap - d->n < n)
        return 0;
    memcpy(d->o + d->n, p, n);
    d->n += n;
    if (d->ncut == 0)
        return 1;
    const gw_elide_t *e = &d->c->el[d->cut];
    size_t gone = e->gone - (d->cut ? e[-1].gone : 0);
    size_t after = e->skel + e->gone; /* the body offset after the cut */
    if (d->cap - d->n < gone)
        return 0;
    memcpy(d->o + d->n, d->c->s->body + after - gone, gone);
    d->n += gone;
    d->cut++;
    d->ncut--;
    return 1;
}

/* A string with escapes and a cut inside, into the arena. yajl's decoded
 * copy of the skeleton's string lacks the cut bytes, and where they would
 * fall in it is not known; so the skeleton's pieces between the cuts go to
 * one yajl parse as a sequence of strings (a cut never splits an escape,
 * nor a surrogate pair: those were checked whole on the skeleton), and
 * each cut's bytes, plain text, are copied from the body after its piece. */
static int gw_scan_decode(gw_scan_ctx_t *c, const gw_span_t *sp, sl_text_t *t)
{
    gw_dec_t d = {c, gw_arena_alloc(c->s, sp->end - sp->off), 0, sp->end - sp->off, 0, 0, false};
    if (!d.o)
        return -1;
    size_t lo = 0, hi = c->nel; /* the first cut after the opening quote */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->el[mid].skel <= sp->so)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t last = sp->se - 1, ncut = 0;
    while (lo + ncut < c->nel && c->el[lo + ncut].skel < last)
        ncut++;
    d.cut = lo;
    d.ncut = ncut;
    /* "piece" "piece" ...: the string's bytes and 3 per piece */
    size_t qn = sp->se - sp->so + 3 * (ncut + 1);
    char few[1024];
    char *q = qn <= sizeof(few) ? few : malloc(qn);
    if (!q)
        return -1;
    size_t qa = 0, pos = sp->so + 1;
    for (size_t i = 0; i <= ncut; i++) {
        size_t to = i < ncut ? c->el[lo + i].skel : last;
        q[qa++] = '"';
        memcpy(q + qa, c->base + pos, to - pos);
        qa += to - pos;
        q[qa++] = '"';
        q[qa++] = ' ';
        pos = to;
    }
    static const yajl_callbacks cbs = {.yajl_string = gw_dec_string};
    sl_yheap_t heap;
    yajl_alloc_funcs af = sl_yheap_funcs(&heap);
    yajl_handle h = yajl_alloc(&cbs, &af, &d);
    int rc = -1;
    if (h) {
        yajl_config(h, yajl_dont_validate_strings, 1);
        yajl_config(h, yajl_allow_multiple_values, 1);
        if (yajl_parse(h, (const unsigned char *)q, qa) == yajl_status_ok &&
            yajl_complete_parse(h) == yajl_status_ok && d.ncut == 0 && d.n < d.cap)
            rc = 0;
        yajl_free(h);
    }
    if (q != few)
        free(q);
    if (rc != 0)
        return -1;
    d.o[d.n] = '\0';
    t->p = d.o;
    t->len = d.n;
    return 0;
}

/* The text of the string [off, end) of the body, yajl's p/n its decoded
 * copy when escaped. */
static int gw_scan_text(gw_scan_ctx_t *c, const char *p, size_t n, const gw_span_t *sp,
                        sl_text_t *t)
{
    if (!sp->escaped) {
        t->p = c->s->body + sp->off + 1;
        t->len = sp->end - sp->off - 2;
        return 0;
    }
    if (sp->cut)
        return gw_scan_decode(c, sp, t);
    char *d = gw_arena_alloc(c->s, n + 1);
    if (!d)
        return -1;
    memcpy(d, p, n);
    d[n] = '\0';
    t->p = d;
    t->len = n;
    return 0;
}

/* The common string: no escapes (yajl hands out the body's own bytes)
 * and no skeleton, so yajl's offsets are the body's. */
static inline bool gw_scan_plain(const gw_scan_ctx_t *c, const char *p)
{
    return (uintptr_t)p - (uintptr_t)c->base < c->plain_len; /* below base: wraps, large */
}

/* The slot a string value goes to: a fact's span set to [off, end), and
 * *t where its text is kept (NULL: not kept). 1, or gw_scan_stop's 0. */
static inline __attribute__((always_inline)) int gw_scan_string_slot(gw_scan_ctx_t *c, size_t off,
                                                                     size_t end, sl_text_t **t)
{
    gw_slot_t slot;
    int sr = gw_scan_slot(c, SL_J_STRING, &slot);
    if (sr != 0)
        return gw_scan_stop(c, sr < 0 ? GW_SCAN_OOM : GW_SCAN_SLOW);
    *t = slot.f ? &slot.f->s : slot.text;
    if (slot.f) {
        slot.f->off = off;
        slot.f->end = end;
    }
    return 1;
}

/* A string value with escapes (sp: not cut: shapes are kept only without
 * a skeleton) as a hole like any other; t: its decoded text, when a fact
 * reads it (NULL: none does), which a hit decodes again from the new
 * bytes. A word with an escape would have to be shape bytes that are not
 * its text: no shape. */
static void gw_shape_rec_str(gw_scan_ctx_t *c, const gw_span_t *sp, const sl_text_t *t)
{
    gw_shape_rec_t *r = c->rec;
    if (sp->cut || gw_scan_word(c) || (t && r->ndec == SL_JSHAPE_MAX_HOLES)) {
        gw_shape_rec_off(c);
        return;
    }
    if (t) {
        r->dec[r->ndec] = t->p;
        r->dec_off[r->ndec++] = (uint32_t)(sp->off + 1);
    }
    gw_shape_rec_add(c, sp->off + 1, sp->end - sp->off - 2, SL_JHOLE_JSTR, t != NULL);
}

/* gw_cb_string for the other strings (escaped, or read from a skeleton):
 * out of line, so the common one keeps a small frame. */
static __attribute__((noinline)) int gw_cb_string_span(gw_scan_ctx_t *c, const char *p, size_t n)
{
    gw_span_t sp;
    if (gw_scan_string_span(c, p, n, &sp) != 0)
        return gw_scan_stop(c, GW_SCAN_SLOW);
    sl_text_t *t;
    int sr = gw_scan_string_slot(c, sp.off, sp.end, &t);
    if (sr != 1)
        return sr;
    if (t && gw_scan_text(c, p, n, &sp, t) != 0)
        return gw_scan_stop(c, GW_SCAN_OOM);
    if (c->rec)
        gw_shape_rec_str(c, &sp, t);
    return 1;
}

static int gw_cb_string(void *ctx, const unsigned char *up, size_t n)
{
    gw_scan_ctx_t *c = GW_SCAN_CTX(ctx);
    const char *p = (const char *)up;
    if (!gw_scan_plain(c, p))
        return gw_cb_string_span(c, p, n);
    size_t off = (size_t)(p - c->base) - 1; /* the quotes' span */
    sl_text_t *t;
    int sr = gw_scan_string_slot(c, off, off + n + 2, &t);
    if (sr != 1)
        return sr;
    if (t) {
        t->p = p; /* the body's own bytes */
        t->len = n;
    }
    /* a role or a part's type is a word policies match: shape bytes; any
     * other string a hole that may hold escapes on a hit */
    if (c->rec && !gw_scan_word(c))
        gw_shape_rec_add(c, off + 1, n, SL_JHOLE_JSTR, t != NULL);
    return 1;
}

static inline __attribute__((always_inline)) int gw_scan_push(gw_scan_ctx_t *c, bool obj)
{
    if (c->depth == 0 && !obj)
        return gw_scan_stop(c, GW_SCAN_SLOW); /* not an object: jansson's words */
    gw_slot_t slot;
    int sr = gw_scan_slot(c, obj ? SL_J_OBJECT : SL_J_ARRAY, &slot);
    if (sr != 0)
        return gw_scan_stop(c, sr < 0 ? GW_SCAN_OOM : GW_SCAN_SLOW);
    if (c->depth == GW_SCAN_DEPTH)
        return gw_scan_stop(c, GW_SCAN_SLOW);
    gw_body_scan_t *s = c->s;
    gw_frame_t *fr = &c->st[c->depth];
    memset(fr, 0, sizeof(*fr));
    fr->obj = obj;
    fr->role = (uint8_t)slot.child;
    fr->keys0 = c->nkeys;
    fr->f = slot.f;
    if (slot.f)
        slot.f->off = gw_scan_at(c, gw_scan_pos(c) - 1);
    if (slot.tc) {
        /* the span's start; its length at the close (gw_scan_pop) */
        fr->tc = true;
        fr->idx = c->st[c->depth - 1].idx;
        s->msgs[fr->idx].tool_calls.p = s->body + gw_scan_at(c, gw_scan_pos(c) - 1);
    } else if (slot.child == GW_R_MSG) {
        fr->idx = s->chat.nmsgs - 1;
    } else if (slot.child == GW_R_PART) {
        fr->idx = s->nparts - 1;
    } else if (slot.child == GW_R_PARTS) {
        fr->idx = c->st[c->depth - 1].idx; /* the message's */
    }
    c->depth++;
    c->top = fr;
    return 1;
}

static void gw_scan_hash_free(gw_frame_t *fr)
{
    gw_kent_t *e, *tmp;
    HASH_ITER(hh, fr->hash, e, tmp)
    {
        HASH_DEL(fr->hash, e);
        free(e);
    }
}

static inline __attribute__((always_inline)) int gw_scan_pop(gw_scan_ctx_t *c)
{
    gw_frame_t *fr = c->top;
    c->top = --c->depth > 0 ? fr - 1 : NULL;
    if (fr->f) {
        fr->f->end = gw_scan_end(c, gw_scan_pos(c));
        fr->f->close = fr->f->end - 1;
        fr->f->members = fr->count;
    }
    if (fr->tc) {
        sl_text_t *t = &c->s->msgs[fr->idx].tool_calls;
        t->len = gw_scan_end(c, gw_scan_pos(c)) - (size_t)(t->p - c->s->body);
    }
    c->nkeys = fr->keys0;
    gw_scan_hash_free(fr);
    return 1;
}

static int gw_cb_start_map(void *ctx)
{
    return gw_scan_push(GW_SCAN_CTX(ctx), true);
}

static int gw_cb_end_map(void *ctx)
{
    return gw_scan_pop(GW_SCAN_CTX(ctx));
}

static int gw_cb_start_array(void *ctx)
{
    return gw_scan_push(GW_SCAN_CTX(ctx), false);
}

static int gw_cb_end_array(void *ctx)
{
    return gw_scan_pop(GW_SCAN_CTX(ctx));
}

/* A key seen before in this object: jansson (JSON_REJECT_DUPLICATES)
 * refuses the body. -1 OOM, 1 duplicate, 0 new. */
static int gw_scan_key_dup(gw_scan_ctx_t *c, gw_frame_t *fr, sl_text_t k)
{
    size_t have = c->nkeys - fr->keys0;
    if (have < GW_SCAN_LINEAR_KEYS && !fr->hash) {
        for (size_t i = fr->keys0; i < c->nkeys; i++)
            if (c->keys[i].len == k.len && memcmp(c->keys[i].p, k.p, k.len) == 0)
                return 1;
    } else {
        if (!fr->hash) { /* the keys so far into the hash, once */
            for (size_t i = fr->keys0; i < c->nkeys; i++) {
                gw_kent_t *e = malloc(sizeof(*e));
                if (!e)
                    return -1;
                e->p = c->keys[i].p;
                e->n = c->keys[i].len;
                HASH_ADD_KEYPTR(hh, fr->hash, e->p, e->n, e);
            }
        }
        gw_kent_t *e;
        HASH_FIND(hh, fr->hash, k.p, k.len, e);
        if (e)
            return 1;
        e = malloc(sizeof(*e));
        if (!e)
            return -1;
        e->p = k.p;
        e->n = k.len;
        HASH_ADD_KEYPTR(hh, fr->hash, e->p, e->n, e);
    }
    if (c->nkeys == c->keys_cap) {
        size_t cap = c->keys_cap * 2;
        sl_text_t *nk = c->keys == c->key_inline ? malloc(cap * sizeof(*nk))
                                                 : realloc(c->keys, cap * sizeof(*nk));
        if (!nk)
            return -1;
        if (c->keys == c->key_inline)
            memcpy(nk, c->key_inline, sizeof(c->key_inline));
        c->keys = nk;
        c->keys_cap = cap;
    }
    c->keys[c->nkeys++] = k;
    return 0;
}

/* A key that is not the body's own bytes (escaped, or read from a
 * skeleton) into *k: 1, or yajl's cancel (0) with c->rc set. Out of line,
 * so the common key keeps a small frame. */
static __attribute__((noinline)) int gw_scan_key_text(gw_scan_ctx_t *c, sl_text_t *k)
{
    gw_span_t sp;
    const char *p = k->p;
    size_t n = k->len;
    gw_shape_rec_off(c);
    if (gw_scan_string_span(c, p, n, &sp) != 0)
        return gw_scan_stop(c, GW_SCAN_SLOW);
    if (gw_scan_text(c, p, n, &sp, k) != 0)
        return gw_scan_stop(c, GW_SCAN_OOM);
    if (sp.escaped && memchr(k->p, '\0', k->len))
        return gw_scan_stop(c, GW_SCAN_SLOW); /* jansson: NUL in a key */
    return 1;
}

static int gw_cb_map_key(void *ctx, const unsigned char *up, size_t n)
{
    gw_scan_ctx_t *c = GW_SCAN_CTX(ctx);
    sl_text_t k = {(const char *)up, n};
    if (!gw_scan_plain(c, k.p) && gw_scan_key_text(c, &k) == 0)
        return 0;
    gw_frame_t *fr = c->top;
    switch (gw_scan_key_dup(c, fr, k)) {
    case 0:
        break;
    case 1:
        return gw_scan_stop(c, GW_SCAN_SLOW);
    default:
        return gw_scan_stop(c, GW_SCAN_OOM);
    }
    fr->count++;
    fr->key = (uint8_t)gw_key_of((gw_role_t)fr->role, k.p, k.len);
    return 1;
}

static const yajl_callbacks gw_scan_cbs = {
    .yajl_null = gw_cb_null,
    .yajl_boolean = gw_cb_bool,
    .yajl_number = gw_cb_number,
    .yajl_string = gw_cb_string,
    .yajl_start_map = gw_cb_start_map,
    .yajl_map_key = gw_cb_map_key,
    .yajl_end_map = gw_cb_end_map,
    .yajl_start_array = gw_cb_start_array,
    .yajl_end_array = gw_cb_end_array,
};

/* Big-integer bodies: jansson holds every number as it comes back from
 * json_intake.c's second pass (integral reals below 2^53 are integers,
 * everything else a real). */
static void gw_scan_bigint_fact(gw_jfact_t *f, const char *body)
{
    if (f->kind == SL_J_INT &&
        (f->i >= (int64_t)GW_SCAN_EXACT || f->i <= -(int64_t)GW_SCAN_EXACT)) {
        f->kind = SL_J_REAL;
    } else if (f->kind == SL_J_REAL) {
        double d = strtod(body + f->off, NULL);
        if (d == floor(d) && fabs(d) < GW_SCAN_EXACT) {
            f->kind = SL_J_INT;
            f->i = (int64_t)d;
        }
    }
}

/* The parse itself, over base (the body, or its skeleton with el mapping
 * its offsets back). */
static gw_scan_rc_t gw_body_scan_run(gw_body_scan_t *s, const char *base, size_t blen,
                                     const gw_elide_t *el, size_t nel, unsigned flags,
                                     gw_shape_rec_t *rec)
{
    const char *body = s->body;
    size_t len = s->len;
    gw_scan_ctx_t c;
    c.s = s;
    c.rec = rec;
    c.base = base;
    c.blen = blen;
    c.el = el;
    c.nel = nel;
    c.plain_len = nel == 0 ? blen : 0;
    c.flags = flags;
    c.rc = GW_SCAN_OK;
    c.depth = 0;
    c.top = NULL;
    c.keys = c.key_inline;
    c.nkeys = 0;
    c.keys_cap = SL_ARRAY_LEN(c.key_inline);
    c.h = sl_ykeep_take(&gw_scan_keep, &gw_scan_cbs, false);
    if (!c.h)
        return GW_SCAN_OOM;
    gw_scan_keep.cur = &c;
    yajl_status st = yajl_parse(c.h, (const unsigned char *)c.base, c.blen);
    /* The document closed (its '}' reported at depth 0): yajl is between
     * values, and the tail check below judges what follows. Open: yajl
     * says what is missing. */
    if (st == yajl_status_ok && !(c.depth == 0 && gw_body_fact(s, GW_F_TOP)->kind == SL_J_OBJECT &&
                                  gw_body_fact(s, GW_F_TOP)->end))
        st = yajl_complete_parse(c.h);
    gw_scan_keep.cur = NULL;
    while (c.depth > 0) /* a parse stopped inside containers */
        gw_scan_hash_free(&c.st[--c.depth]);
    if (c.keys != c.key_inline)
        free(c.keys);
    /* yajl leaves an unfinished token after the document (`{} "x`) to
     * more input that never comes: only whitespace may follow. */
    bool tail_ok = st == yajl_status_ok && gw_body_fact(s, GW_F_TOP)->kind == SL_J_OBJECT;
    for (size_t i = gw_body_fact(s, GW_F_TOP)->end; tail_ok && i < len; i++)
        tail_ok = body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r';
    sl_ykeep_put(&gw_scan_keep, c.h, tail_ok);
    if (st != yajl_status_ok) {
        gw_scan_rc_t rc = c.rc == GW_SCAN_OK ? GW_SCAN_SLOW : c.rc;
        gw_body_scan_reset(s);
        return rc;
    }
    if (!tail_ok) {
        gw_body_scan_reset(s);
        return GW_SCAN_SLOW;
    }
    if (s->bigint) {
        static const gw_fact_id_t nums[] = {GW_F_STREAM,
                                            GW_F_MAX_TOKENS,
                                            GW_F_MAX_COMPLETION_TOKENS,
                                            GW_F_MAX_OUTPUT_TOKENS,
                                            GW_F_N,
                                            GW_F_INCLUDE_USAGE,
                                            GW_F_MODEL,
                                            GW_F_INPUT};
        for (size_t i = 0; i < SL_ARRAY_LEN(nums); i++)
            if (s->facts_set & (1u << nums[i]))
                gw_scan_bigint_fact(&s->fact[nums[i]], body);
    }
    if (flags & GW_SCAN_MSGS) {
        s->has_msgs = true;
        s->chat.msgs = s->msgs;
        s->chat.parts = s->parts;
    }
    return GW_SCAN_OK;
}

/* ---- shapes -----------------------------------------------------------------------
 *
 * Clients send bodies of one shape again and again (the same SDK, the same
 * app: only the prompt, the model, max_tokens change). After a parse on the
 * normal path (a body below GW_SKEL_BODY_MIN, no skeleton, no escape in a
 * key or a word, no integer beyond 18 digits), the thread keeps the body as
 * a shape (common/jshape.h) with holes over the values whose facts are
 * recomputed from a new span: string interiors (SL_JHOLE_JSTR: escapes
 * allowed, surrogate escapes in pairs only) and integer tokens (re-read),
 * and a copy of the result with every text pointer as an offset (a decoded
 * text as its hole's). A message's role and a part's type are words
 * policies match: shape bytes, as keys, booleans, null and reals are. A
 * later body with the shape (and the same GW_SCAN_MSGS) gets the kept
 * result, each offset moved by the holes before it changing length, without
 * the parse: jshape.h says why everything the parse found holds again. A
 * text whose hole now holds an escape is decoded from the new bytes by yajl,
 * as the parse decodes it (gw_shape_decode); one without is the body's
 * bytes. The byte pass and the UTF-8 check ran before the shapes, on every
 * body. A body that matches no kept shape costs the compares that failed,
 * then the parse, then its shape kept in place of the least recently used (the thread's
 * sl_jshape_cache_t, common/jshape.h). */

/* Shapes a thread keeps, and the most messages and parts one may hold. */
#define GW_SHAPE_SLOTS 4
/* After this many misses in a row a thread tries (and keeps) a shape for
 * one body in this many only: a client whose every body is a new shape (a
 * conversation growing by a message a request) would otherwise pay the
 * failed compares and the keeping (~3,900 instructions on #16's body) on
 * every request. A run of one shape again hits within 2 x this. */
#define GW_SHAPE_BACKOFF 16
#define GW_SHAPE_MSGS    32
#define GW_SHAPE_PARTS   32

/* The facts of gw_body_scan_t, each moved the same way. */
#define GW_SHAPE_NFACTS     GW_F_COUNT
#define GW_SHAPE_FACT(s, i) (&(s)->fact[i])

/* A slot's data beside its shape (sl_jshape_cache_t). */
typedef struct gw_shape {
    unsigned key; /* the flags the result depends on (GW_SCAN_MSGS) */
    /* the result over the shape's text, offsets and text pointers encoded
     * (GW_SHAPE_X) */
    gw_jfact_t fact[GW_SHAPE_NFACTS];
    uint8_t
        present[GW_SHAPE_NFACTS]; /* the facts not absent (the reset cleared the others' bits) */
    size_t npresent;
    sl_jkind_t messages_kind, tools_kind;
    bool has_msgs;
    size_t nmsgs, nparts;
    sl_chat_msg_t msgs[GW_SHAPE_MSGS];
    sl_chat_part_t parts[GW_SHAPE_PARTS];
} gw_shape_t;

/* The thread's shapes: the gate backs off after GW_SHAPE_BACKOFF misses in
 * a row to one body in GW_SHAPE_BACKOFF (gw_shape_turn). */
static _Thread_local sl_jshape_cache_t gw_shapes = SL_JSHAPE_CACHE_INIT(
    GW_SHAPE_SLOTS, GW_SHAPE_BACKOFF, GW_SHAPE_BACKOFF, sizeof(gw_shape_t), NULL);

void gw_body_scan_shapes_clear(void)
{
    sl_jshape_cache_clear(&gw_shapes);
}

/* Whether this body is one to try (see GW_SHAPE_BACKOFF); one not tried
 * is counted a miss. While the gate is open nothing is counted here: a
 * tried body that misses is (gw_shape_try), so a hit costs one compare. */
static inline bool gw_shape_turn(unsigned flags)
{
    if ((flags & GW_SCAN_SHAPE_TEST) || sl_jshape_cache_open(&gw_shapes) ||
        sl_jshape_cache_gate(&gw_shapes))
        return true;
    sl_jshape_cache_miss(&gw_shapes);
    return false;
}

gw_shape_stats_t gw_body_scan_shape_stats(void)
{
    return (gw_shape_stats_t){.hits = gw_shapes.st.hits, .misses = gw_shapes.st.misses};
}

/* Offsets in a kept result are encoded with what a hit needs to move them:
 * the offset x in the shape's text (bits 0-31), how many holes start
 * before x (bits 32-47: x moves as the end of the last of them) and
 * whether a hole starts at x (bit 48: its new length is the text's, its
 * new value the integer's). So a hit moves each in two instructions
 * instead of a search. */
#define GW_SHAPE_X(e)    ((e)&0xffffffffu)
#define GW_SHAPE_IDX(e)  (((e) >> 32) & 0xffffu)
#define GW_SHAPE_HOLE(e) (((e) >> 48) & 1u)

static size_t gw_shape_enc(const sl_jspan_t *hole, size_t nh, size_t x)
{
    size_t lo = 0, hi = nh; /* how many holes start before x */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (hole[mid].off < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t at = lo < nh && hole[lo].off == x;
    return x | (lo << 32) | (at << 48);
}

/* A text's pointer into body encoded (NULL stays NULL: a string's interior
 * never starts at 0); a decoded copy (rec's) as its string's interior, which
 * must be a hole (a hit decodes the hole's bytes again). -1: neither. */
static int gw_shape_text_save(sl_text_t *t, const char *body, size_t len, const sl_jspan_t *hole,
                              size_t nh, const gw_shape_rec_t *rec)
{
    if (!t->p)
        return 0;
    for (size_t i = 0; i < rec->ndec; i++) {
        if (t->p != rec->dec[i])
            continue;
        size_t e = gw_shape_enc(hole, nh, rec->dec_off[i]);
        if (!GW_SHAPE_HOLE(e))
            return -1; /* stays shape bytes: they are not its text */
        t->p = (const char *)(uintptr_t)e;
        return 0;
    }
    uintptr_t o = (uintptr_t)t->p - (uintptr_t)body;
    if (o == 0 || o > len || t->len > len - o)
        return -1;
    t->p = (const char *)(uintptr_t)gw_shape_enc(hole, nh, o);
    return 0;
}

/* A JSON text's span (a message's tool_calls): both ends encoded (p the
 * start's, len the end's), as a fact's; holes inside it move its end. */
static void gw_shape_span_save(sl_text_t *t, const char *body, const sl_jspan_t *hole, size_t nh)
{
    if (!t->p)
        return;
    size_t off = (size_t)(t->p - body);
    t->p = (const char *)(uintptr_t)gw_shape_enc(hole, nh, off);
    t->len = gw_shape_enc(hole, nh, off + t->len);
}

static void gw_shape_fact_save(gw_jfact_t *f, const sl_jspan_t *hole, size_t nh)
{
    if (f->kind == SL_J_ABSENT)
        return;
    f->off = gw_shape_enc(hole, nh, f->off);
    f->end = gw_shape_enc(hole, nh, f->end);
    if (f->kind == SL_J_OBJECT || f->kind == SL_J_ARRAY) /* close shares i and s's bytes */
        f->close = gw_shape_enc(hole, nh, f->close);
}

/* A hit: the scan filled, the new body, its holes' spans, which hold an
 * escape (bit k: hole k), and how far each offset after the k first holes
 * moves (mv[k]). */
typedef struct gw_shape_map {
    gw_body_scan_t *s;
    const char *body;
    const sl_jspan_t *nw;
    uint64_t esc;
    size_t ndec; /* texts to decode (a hole is one text's at most) */
    sl_text_t *dec[SL_JSHAPE_MAX_HOLES];
    uint8_t dec_hole[SL_JSHAPE_MAX_HOLES];
    ptrdiff_t mv[SL_JSHAPE_MAX_HOLES + 1];
} gw_shape_map_t;

/* Decoded strings on a hit. yajl (the parse's own decoder) decodes the
 * escapes: each run of escapes in a hole (a surrogate pair is one run; runs
 * closer than GW_SHAPE_DEC_GAP are one) goes to it as a string of its own,
 * all of a hit's as one stream, "run" "run" ..., on a handle the thread
 * keeps (common/yheap.h); the bytes between the runs, which yajl would copy
 * as they are (its UTF-8 check is off, as in the parse), are copied here.
 * yajl costs ~300 instructions a call, ~450 a string token and ~15 a byte
 * in one: each hole whole, a call each, was ~4,600 on bench/lib.sh's
 * escaped body. */
#define GW_SHAPE_DEC_RUNS 32
#define GW_SHAPE_DEC_GAP  32

typedef struct gw_shape_dtext {
    const char *src; /* the hole's bytes */
    size_t len, at;  /* src copied up to at */
    char *o;
    size_t n;
} gw_shape_dtext_t;

typedef struct gw_shape_run {
    size_t a, b; /* bytes [a, b) of its text's src */
    uint8_t text;
} gw_shape_run_t;

typedef struct gw_shape_dec {
    gw_shape_dtext_t *t;
    const gw_shape_run_t *run; /* this batch's */
    size_t nrun, next;
} gw_shape_dec_t;

static _Thread_local sl_ykeep_t gw_shape_dec_keep;

/* One run decoded: its text's bytes before it, then what yajl made of it
 * (never longer than its bytes, so the text's room of src's length holds
 * it all). */
static int gw_shape_dec_string(void *ctx, const unsigned char *p, size_t n)
{
    gw_shape_dec_t *d = ((sl_ykeep_t *)ctx)->cur;
    if (d->next == d->nrun)
        return 0;
    const gw_shape_run_t *r = &d->run[d->next++];
    gw_shape_dtext_t *t = &d->t[r->text];
    size_t plain = r->a - t->at;
    if (t->len - t->n < plain + n)
        return 0;
    memcpy(t->o + t->n, t->src + t->at, plain);
    memcpy(t->o + t->n + plain, p, n);
    t->n += plain + n;
    t->at = r->b;
    return 1;
}

static int gw_shape_dec_other(void *ctx)
{
    (void)ctx;
    return 0; /* only a string is ours */
}

/* A batch of runs as "run" "run" ... through the kept handle. */
static bool gw_shape_dec_runs(gw_shape_dtext_t *t, const gw_shape_run_t *run, size_t nrun)
{
    static const yajl_callbacks cbs = {
        .yajl_null = gw_shape_dec_other,
        .yajl_string = gw_shape_dec_string,
        .yajl_start_map = gw_shape_dec_other,
        .yajl_start_array = gw_shape_dec_other,
    };
    size_t qn = 0;
    for (size_t i = 0; i < nrun; i++)
        qn += run[i].b - run[i].a + 3;
    char few[512];
    char *q = qn <= sizeof(few) ? few : malloc(qn);
    if (!q)
        return false;
    size_t w = 0;
    for (size_t i = 0; i < nrun; i++) {
        q[w++] = '"';
        memcpy(q + w, t[run[i].text].src + run[i].a, run[i].b - run[i].a);
        w += run[i].b - run[i].a;
        q[w++] = '"';
        q[w++] = ' ';
    }
    gw_shape_dec_t d = {t, run, nrun, 0};
    yajl_handle y = sl_ykeep_take(&gw_shape_dec_keep, &cbs, false);
    bool ok = false;
    if (y) {
        gw_shape_dec_keep.cur = &d;
        ok = yajl_parse(y, (const unsigned char *)q, w) == yajl_status_ok && d.next == nrun;
        gw_shape_dec_keep.cur = NULL;
        sl_ykeep_put(&gw_shape_dec_keep, y, ok);
    }
    if (q != few)
        free(q);
    return ok;
}

/* The end of the run of escapes at src[j] (a '\\'), gaps shorter than
 * GW_SHAPE_DEC_GAP included; the match checked the escapes. */
static size_t gw_shape_run_end(const char *src, size_t len, size_t j)
{
    for (;;) {
        while (j < len && src[j] == '\\')
            j += j + 1 < len && src[j + 1] == 'u' ? 6 : 2;
        if (j >= len)
            return len;
        size_t g = j;
        while (g < len && g - j < GW_SHAPE_DEC_GAP && src[g] != '\\')
            g++;
        if (g >= len || src[g] != '\\')
            return j;
        j = g;
    }
}

/* t (s's, loaded from kept, e's) is to be decoded when it is a hole that
 * holds an escape now; a hole is one text's at most, so m->dec holds them
 * all. */
static void gw_shape_dec_mark(gw_shape_map_t *m, const sl_text_t *kept, sl_text_t *t)
{
    size_t e = (uintptr_t)kept->p;
    if (!kept->p || !GW_SHAPE_HOLE(e) || !(m->esc >> GW_SHAPE_IDX(e) & 1))
        return;
    if (m->ndec < SL_JSHAPE_MAX_HOLES) {
        m->dec[m->ndec] = t;
        m->dec_hole[m->ndec] = (uint8_t)GW_SHAPE_IDX(e);
    }
    m->ndec++;
}

/* The texts of a hit (s, from kept shape e) whose holes hold an escape
 * decoded from the new bytes into the scan's arena: exactly the parse's
 * texts, as yajl decodes them there too (jshape's JSTR match took only
 * escapes jansson takes, surrogates in pairs only: the parse's
 * gw_scan_surrogates_ok). -1: out of memory, or yajl refused (the parse
 * decides). Out of line and after the loads: the common hit has no escape,
 * and pays one test. */
static __attribute__((noinline)) int gw_shape_decode(gw_shape_map_t *m, gw_body_scan_t *s,
                                                     const gw_shape_t *e)
{
    m->ndec = 0;
    for (size_t j = 0; j < e->npresent; j++) {
        size_t i = e->present[j];
        if (e->fact[i].kind == SL_J_STRING)
            gw_shape_dec_mark(m, &e->fact[i].s, &GW_SHAPE_FACT(s, i)->s);
    }
    for (size_t i = 0; i < e->nmsgs; i++) {
        gw_shape_dec_mark(m, &e->msgs[i].role, &s->msgs[i].role);
        gw_shape_dec_mark(m, &e->msgs[i].content, &s->msgs[i].content);
        gw_shape_dec_mark(m, &e->msgs[i].name, &s->msgs[i].name);
    }
    for (size_t i = 0; i < e->nparts; i++) {
        gw_shape_dec_mark(m, &e->parts[i].type, &s->parts[i].type);
        gw_shape_dec_mark(m, &e->parts[i].text, &s->parts[i].text);
    }
    if (m->ndec > SL_JSHAPE_MAX_HOLES)
        return -1;
    gw_shape_dtext_t t[SL_JSHAPE_MAX_HOLES];
    gw_shape_run_t run[GW_SHAPE_DEC_RUNS];
    size_t nrun = 0;
    for (size_t k = 0; k < m->ndec; k++) {
        const sl_jspan_t *h = &m->nw[m->dec_hole[k]];
        t[k] = (gw_shape_dtext_t){m->body + h->off, h->len, 0, gw_arena_alloc(m->s, h->len + 1), 0};
        if (!t[k].o)
            return -1;
        for (size_t i = 0;;) {
            const char *b = i < t[k].len ? memchr(t[k].src + i, '\\', t[k].len - i) : NULL;
            if (!b)
                break;
            size_t a = (size_t)(b - t[k].src);
            i = gw_shape_run_end(t[k].src, t[k].len, a);
            run[nrun++] = (gw_shape_run_t){a, i, (uint8_t)k};
            if (nrun == GW_SHAPE_DEC_RUNS) {
                if (!gw_shape_dec_runs(t, run, nrun))
                    return -1;
                nrun = 0;
            }
        }
    }
    if (nrun > 0 && !gw_shape_dec_runs(t, run, nrun))
        return -1;
    for (size_t k = 0; k < m->ndec; k++) { /* each text's bytes after its last run */
        memcpy(t[k].o + t[k].n, t[k].src + t[k].at, t[k].len - t[k].at);
        t[k].n += t[k].len - t[k].at;
        t[k].o[t[k].n] = '\0';
        m->dec[k]->p = t[k].o;
        m->dec[k]->len = t[k].n;
    }
    return 0;
}

static inline size_t gw_shape_pos(const gw_shape_map_t *m, size_t e)
{
    return (size_t)((ptrdiff_t)GW_SHAPE_X(e) + m->mv[GW_SHAPE_IDX(e)]);
}

static inline void gw_shape_text_load(const gw_shape_map_t *m, sl_text_t *t)
{
    if (!t->p)
        return;
    size_t e = (uintptr_t)t->p;
    t->p = m->body + gw_shape_pos(m, e);
    if (GW_SHAPE_HOLE(e))
        t->len = m->nw[GW_SHAPE_IDX(e)].len;
}

static inline void gw_shape_span_load(const gw_shape_map_t *m, sl_text_t *t)
{
    if (!t->p)
        return;
    size_t off = gw_shape_pos(m, (uintptr_t)t->p);
    t->len = gw_shape_pos(m, t->len) - off;
    t->p = m->body + off;
}

static inline void gw_shape_fact_load(const gw_shape_map_t *m, gw_jfact_t *f)
{
    if (f->kind == SL_J_ABSENT)
        return;
    size_t e = f->off;
    f->off = gw_shape_pos(m, e);
    if (f->kind == SL_J_INT && GW_SHAPE_HOLE(e)) {
        const sl_jspan_t *h = &m->nw[GW_SHAPE_IDX(e)];
        f->i = sl_jshape_int(m->body + h->off, h->len);
    }
    f->end = gw_shape_pos(m, f->end);
    if (f->kind == SL_J_OBJECT || f->kind == SL_J_ARRAY) /* close shares i and s's bytes */
        f->close = gw_shape_pos(m, f->close);
    if (f->kind == SL_J_STRING)
        gw_shape_text_load(m, &f->s);
}

/* The kept result e (shape sh) into s, moved to the new body's hole spans nw
 * (esc: those with an escape). -1: out of memory (or a decode that failed). */
static int gw_shape_load(gw_body_scan_t *s, const sl_jshape_t *sh, const gw_shape_t *e,
                         const sl_jspan_t *nw, uint64_t esc)
{
    while (s->msgs_cap < e->nmsgs)
        if (gw_grow((void **)&s->msgs, &s->msgs_cap, s->msgs0, GW_SCAN_INLINE_MSGS,
                    sizeof(*s->msgs)) != 0)
            return -1;
    while (s->parts_cap < e->nparts)
        if (gw_grow((void **)&s->parts, &s->parts_cap, s->parts0, GW_SCAN_INLINE_PARTS,
                    sizeof(*s->parts)) != 0)
            return -1;
    gw_shape_map_t m;
    m.s = s;
    m.body = s->body;
    m.nw = nw;
    m.esc = esc;
    m.mv[0] = 0;
    for (size_t k = 0; k < sh->nholes; k++)
        m.mv[k + 1] =
            (ptrdiff_t)(nw[k].off + nw[k].len) - (ptrdiff_t)(sh->hole[k].off + sh->hole[k].len);
    for (size_t j = 0; j < e->npresent; j++) {
        size_t i = e->present[j];
        gw_jfact_t *f = gw_fact_w(s, (gw_fact_id_t)i);
        *f = e->fact[i];
        gw_shape_fact_load(&m, f);
    }
    s->chat.messages_kind = e->messages_kind;
    s->chat.tools_kind = e->tools_kind;
    s->chat.nmsgs = e->nmsgs;
    s->nparts = e->nparts;
    if (e->nmsgs)
        memcpy(s->msgs, e->msgs, e->nmsgs * sizeof(*s->msgs));
    for (size_t i = 0; i < e->nmsgs; i++) {
        gw_shape_text_load(&m, &s->msgs[i].role);
        gw_shape_text_load(&m, &s->msgs[i].content);
        gw_shape_text_load(&m, &s->msgs[i].name);
        gw_shape_span_load(&m, &s->msgs[i].tool_calls);
    }
    if (e->nparts)
        memcpy(s->parts, e->parts, e->nparts * sizeof(*s->parts));
    for (size_t i = 0; i < e->nparts; i++) {
        gw_shape_text_load(&m, &s->parts[i].type);
        gw_shape_text_load(&m, &s->parts[i].text);
    }
    if (e->has_msgs) {
        s->has_msgs = true;
        s->chat.msgs = s->msgs;
        s->chat.parts = s->parts;
    }
    return esc ? gw_shape_decode(&m, s, e) : 0;
}

/* s's body answered from a kept shape: true, s filled as the parse would. */
static bool gw_shape_try(gw_body_scan_t *s, unsigned key)
{
    sl_jshape_cache_t *c = &gw_shapes;
    sl_jspan_t nw[SL_JSHAPE_MAX_HOLES];
    uint64_t esc;
    for (unsigned i = 0; i < GW_SHAPE_SLOTS; i++) {
        const sl_jshape_t *sh = &c->slot[i].sh;
        const gw_shape_t *e = c->slot[i].data;
        if (sl_jshape_empty(sh) || e->key != key ||
            !sl_jshape_match_esc(sh, s->body, s->len, nw, &esc))
            continue;
        if (gw_shape_load(s, sh, e, nw, esc) != 0) {
            const char *body = s->body;
            size_t len = s->len;
            gw_body_scan_reset(s); /* the parse decides (and runs out too) */
            s->body = body;
            s->len = len;
            return false;
        }
        sl_jshape_cache_hit(c, i);
        return true;
    }
    sl_jshape_cache_miss(c);
    if (sl_jshape_cache_open(c))
        (void)sl_jshape_cache_gate(c); /* a yes: the learn that follows counts */
    return false;
}

/* The holes kept of rec's: the values a fact reads first, then the others
 * in the room left, in body order. */
static size_t gw_shape_holes(const gw_shape_rec_t *rec, sl_jspan_t *hole, uint8_t *kind)
{
    size_t nread = 0;
    for (size_t i = 0; i < rec->n; i++)
        nread += rec->read[i];
    size_t room = nread < SL_JSHAPE_MAX_HOLES ? SL_JSHAPE_MAX_HOLES - nread : 0;
    size_t n = 0, others = 0;
    for (size_t i = 0; i < rec->n && n < SL_JSHAPE_MAX_HOLES; i++) {
        if (!rec->read[i] && others++ >= room)
            continue;
        hole[n] = rec->hole[i];
        kind[n++] = rec->kind[i];
    }
    return n;
}

/* s's result (a parse on the normal path that said OK) kept as a shape
 * with rec's holes. Nothing kept when it does not fit the bounds. */
static void gw_shape_keep(const gw_body_scan_t *s, unsigned key, const gw_shape_rec_t *rec)
{
    if (!rec->ok || s->bigint || s->elided || s->chat.nmsgs > GW_SHAPE_MSGS ||
        s->nparts > GW_SHAPE_PARTS || s->len > SL_JSHAPE_MAX_BYTES)
        return;
    sl_jspan_t hole[SL_JSHAPE_MAX_HOLES];
    uint8_t kind[SL_JSHAPE_MAX_HOLES];
    size_t nh = gw_shape_holes(rec, hole, kind);
    sl_jshape_cache_t *c = &gw_shapes;
    int slot = sl_jshape_cache_take(c);
    if (slot < 0)
        return;
    gw_shape_t *e = c->slot[slot].data;
    int bad = 0;
    e->npresent = 0;
    for (size_t i = 0; i < GW_SHAPE_NFACTS; i++) {
        e->fact[i] = *gw_body_fact(s, (gw_fact_id_t)i);
        if (e->fact[i].kind != SL_J_ABSENT)
            e->present[e->npresent++] = (uint8_t)i;
        gw_shape_fact_save(&e->fact[i], hole, nh);
        if (e->fact[i].kind == SL_J_STRING) /* others' s is stale */
            bad |= gw_shape_text_save(&e->fact[i].s, s->body, s->len, hole, nh, rec);
    }
    e->messages_kind = s->chat.messages_kind;
    e->tools_kind = s->chat.tools_kind;
    e->has_msgs = s->has_msgs;
    e->nmsgs = s->chat.nmsgs;
    e->nparts = s->nparts;
    for (size_t i = 0; i < e->nmsgs; i++) {
        e->msgs[i] = s->msgs[i];
        bad |= gw_shape_text_save(&e->msgs[i].role, s->body, s->len, hole, nh, rec);
        bad |= gw_shape_text_save(&e->msgs[i].content, s->body, s->len, hole, nh, rec);
        bad |= gw_shape_text_save(&e->msgs[i].name, s->body, s->len, hole, nh, rec);
        gw_shape_span_save(&e->msgs[i].tool_calls, s->body, hole, nh);
    }
    for (size_t i = 0; i < e->nparts; i++) {
        e->parts[i] = s->parts[i];
        bad |= gw_shape_text_save(&e->parts[i].type, s->body, s->len, hole, nh, rec);
        bad |= gw_shape_text_save(&e->parts[i].text, s->body, s->len, hole, nh, rec);
    }
    e->key = key;
    /* the slot stays empty (it matches nothing) when bad or a set fails */
    if (!bad && sl_jshape_cache_set(c, (unsigned)slot, s->body, s->len, hole, kind, nh) != 0)
        return;
}

gw_scan_rc_t gw_body_scan(gw_body_scan_t *s, const char *body, size_t len, unsigned flags)
{
    gw_body_scan_reset(s);
    s->body = body;
    s->len = len;
    gw_skel_t k;
    k.ok = false;
    k.cuts = NULL;
    k.ncuts = k.cap = k.gone = 0;
    if (!(flags & GW_SCAN_NO_SKEL) && (len >= GW_SKEL_BODY_MIN || (flags & GW_SCAN_SKEL_TEST))) {
        k.ok = true;
        k.in = k.esc = false;
        k.rs = 0;
        k.run_min = flags & GW_SCAN_SKEL_TEST ? 3 : GW_SKEL_RUN_MIN;
        k.keep = flags & GW_SCAN_SKEL_TEST ? 1 : GW_SKEL_KEEP;
    }
    unsigned bytes = k.ok ? gw_scan_bytes_skel(body, len, &k) : gw_scan_bytes(body, len);
    gw_scan_rc_t rc = GW_SCAN_SLOW;
    gw_elide_t *el = NULL;
    /* yajl takes \v and \f for whitespace; jansson does not (inside a
     * string both refuse them raw). */
    if (!(bytes & GW_BYTES_VT_FF) && (!(bytes & GW_BYTES_HIGH) || gw_scan_utf8_ok(body, len))) {
        /* Worth it when yajl skips a share of the bytes: copying a skeleton
         * nearly as long as the body (many strings just past the run
         * minimum) would cost more than the few bytes skipped save. */
        if (k.ok && k.ncuts > 0 && (k.gone >= (len - k.gone) / 8 || (flags & GW_SCAN_SKEL_TEST))) {
            /* one allocation: the map, then the skeleton (a failed one:
             * yajl reads the body) */
            el = malloc(k.ncuts * sizeof(*el) + (len - k.gone));
            if (el)
                gw_skel_build(&k, body, len, (char *)(el + k.ncuts), el);
        }
        /* the shapes: small bodies on the normal path (see "shapes") */
        bool shape =
            !k.ok && len < GW_SKEL_BODY_MIN && !(flags & GW_SCAN_NO_SHAPE) && gw_shape_turn(flags);
        gw_shape_rec_t recb, *rec = NULL;
        if (shape && gw_shape_try(s, flags & GW_SCAN_MSGS)) {
            rc = GW_SCAN_OK;
        } else if (el) {
            rc = gw_body_scan_run(s, (const char *)(el + k.ncuts), len - k.gone, el, k.ncuts, flags,
                                  NULL);
        } else {
            if (shape) {
                rec = &recb;
                rec->ok = true;
                rec->n = 0;
                rec->ndec = 0;
            }
            rc = gw_body_scan_run(s, body, len, NULL, 0, flags, rec);
        }
        if (rc == GW_SCAN_OK && el)
            s->elided = k.gone;
        if (rc == GW_SCAN_OK && rec)
            gw_shape_keep(s, flags & GW_SCAN_MSGS, rec);
    }
    if (rc == GW_SCAN_OK) {
        /* the estimate's view of tools (body.c counts only these kinds) */
        if (gw_body_fact(s, GW_F_TOOLS)->kind != SL_J_ABSENT)
            s->chat.tools =
                (sl_text_t){body + gw_body_fact(s, GW_F_TOOLS)->off,
                            gw_body_fact(s, GW_F_TOOLS)->end - gw_body_fact(s, GW_F_TOOLS)->off};
        s->chat.bigint = s->bigint;
    }
    if (k.cuts != k.cuts0)
        free(k.cuts);
    free(el);
    return rc;
}

void gw_body_scan_clamp_in(const gw_body_scan_t *s, rl_clamp_in_t *in)
{
    *in = (rl_clamp_in_t){
        .max_tokens_kind = gw_body_fact(s, GW_F_MAX_TOKENS)->kind,
        .max_tokens = gw_body_fact(s, GW_F_MAX_TOKENS)->i,
        .max_completion_tokens_kind = gw_body_fact(s, GW_F_MAX_COMPLETION_TOKENS)->kind,
        .max_completion_tokens = gw_body_fact(s, GW_F_MAX_COMPLETION_TOKENS)->i,
        .stream_kind = gw_body_fact(s, GW_F_STREAM)->kind,
        .stream_options_kind = gw_body_fact(s, GW_F_STREAM_OPTIONS)->kind,
        .include_usage = gw_body_fact(s, GW_F_INCLUDE_USAGE)->kind == SL_J_TRUE,
    };
}

/* ---- splices --------------------------------------------------------------------- */

int gw_json_quote(const char *v, size_t n, char *buf, size_t cap, size_t *outlen)
{
    bool plain = true;
    for (size_t i = 0; i < n && plain; i++) {
        unsigned char ch = (unsigned char)v[i];
        plain = ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\';
    }
    if (plain) {
        if (n + 2 > cap)
            return -1;
        buf[0] = '"';
        memcpy(buf + 1, v, n);
        buf[n + 1] = '"';
        *outlen = n + 2;
        return 0;
    }
    json_t *j = json_stringn(v, n);
    if (!j)
        return -1;
    size_t need = json_dumpb(j, buf, cap, JSON_ENCODE_ANY);
    json_decref(j);
    if (need == 0 || need > cap)
        return -1;
    *outlen = need;
    return 0;
}

static gw_splice_t *gw_splice_add(gw_body_scan_t *s, const char *key)
{
    if (key) {
        for (size_t i = 0; i < s->nsplices; i++)
            if (s->splices[i].key && strcmp(s->splices[i].key, key) == 0)
                return &s->splices[i];
    }
    if (s->nsplices == s->splices_cap && gw_grow((void **)&s->splices, &s->splices_cap, s->splices0,
                                                 GW_SCAN_INLINE_SPLICES, sizeof(*s->splices)) != 0)
        return NULL;
    gw_splice_t *sp = &s->splices[s->nsplices++];
    memset(sp, 0, sizeof(*sp));
    sp->key = key;
    return sp;
}

/* Members added to the top-level object so far (for the comma rule). */
static size_t gw_splice_added(const gw_body_scan_t *s, size_t at)
{
    size_t n = 0;
    for (size_t i = 0; i < s->nsplices; i++)
        n += s->splices[i].del == 0 && s->splices[i].off == at;
    return n;
}

static int gw_splice_text(gw_body_scan_t *s, gw_splice_t *sp, const char *a, size_t alen,
                          const char *b, size_t blen)
{
    char *t = gw_arena_alloc(s, alen + blen);
    if (!t)
        return -1;
    memcpy(t, a, alen);
    memcpy(t + alen, b, blen);
    sp->text = t;
    sp->len = alen + blen;
    return 0;
}

/* sp's text is the member "key":val. Keys are ours (model, max_tokens,
 * stream_options...): plain names, no escaping, at most GW_SPLICE_KEY_MAX
 * bytes. Built with memcpy: snprintf's format machinery was ~1,300
 * instructions on every streamed request's critical path (two members). */
#define GW_SPLICE_KEY_MAX 76

static int gw_splice_member(gw_body_scan_t *s, gw_splice_t *sp, const char *key, const char *val,
                            size_t vlen)
{
    size_t klen = strlen(key);
    if (klen > GW_SPLICE_KEY_MAX)
        return -1;
    char *t = gw_arena_alloc(s, klen + 3 + vlen);
    if (!t)
        return -1;
    t[0] = '"';
    memcpy(t + 1, key, klen);
    memcpy(t + 1 + klen, "\":", 2);
    memcpy(t + 3 + klen, val, vlen);
    sp->text = t;
    sp->len = klen + 3 + vlen;
    return 0;
}

int gw_body_set(gw_body_scan_t *s, const char *key, const gw_jfact_t *f, const char *val,
                size_t vlen)
{
    bool existed = false;
    for (size_t i = 0; i < s->nsplices; i++)
        existed = existed || (s->splices[i].key && strcmp(s->splices[i].key, key) == 0);
    gw_splice_t *sp = gw_splice_add(s, key);
    if (!sp)
        return -1;
    if (existed && sp->del == 0) /* an added member set again: rewrite it, keeping its comma */
        return gw_splice_member(s, sp, key, val, vlen);
    if (existed || (f && f->kind != SL_J_ABSENT)) {
        sp->off = f->off;
        sp->del = f->end - f->off;
        return gw_splice_text(s, sp, val, vlen, "", 0);
    }
    sp->off = gw_body_fact(s, GW_F_TOP)->close;
    sp->del = 0;
    sp->comma = gw_body_fact(s, GW_F_TOP)->members +
                    gw_splice_added(s, gw_body_fact(s, GW_F_TOP)->close) - 1 >
                0;
    return gw_splice_member(s, sp, key, val, vlen);
}

int gw_body_set_include_usage(gw_body_scan_t *s)
{
    static const char key[] = "stream_options";
    const gw_jfact_t *so = gw_body_fact(s, GW_F_STREAM_OPTIONS);
    if (so->kind == SL_J_OBJECT) {
        const gw_jfact_t *iu = gw_body_fact(s, GW_F_INCLUDE_USAGE);
        if (iu->kind == SL_J_TRUE)
            return 0;
        gw_splice_t *sp = gw_splice_add(s, NULL);
        if (!sp)
            return -1;
        if (iu->kind != SL_J_ABSENT) {
            sp->off = iu->off;
            sp->del = iu->end - iu->off;
            if (gw_splice_text(s, sp, GW_LIT_S("true"), "", 0) != 0)
                return -1;
        } else {
            sp->off = so->close;
            sp->comma = so->members > 0;
            if (gw_splice_text(s, sp, GW_LIT_S("\"include_usage\":true"), "", 0) != 0)
                return -1;
        }
        gw_fact_w(s, GW_F_INCLUDE_USAGE)->kind =
            SL_J_TRUE; /* what the body says now (a second call: no-op) */
        return 0;
    }
    if (gw_body_set(s, key, so, GW_LIT_S("{\"include_usage\":true}")) != 0)
        return -1;
    gw_fact_w(s, GW_F_INCLUDE_USAGE)->kind = SL_J_TRUE;
    gw_fact_w(s, GW_F_STREAM_OPTIONS)->kind = SL_J_OBJECT;
    return 0;
}

static int gw_splice_cmp(const void *a, const void *b)
{
    const gw_splice_t *x = a, *y = b;
    if (x->off != y->off)
        return x->off < y->off ? -1 : 1;
    /* Same offset: replacements first, then insertions in the order made
     * (their pointer order in the array). */
    if ((x->del == 0) != (y->del == 0))
        return x->del == 0 ? 1 : -1;
    uintptr_t i = (uintptr_t)x->key, j = (uintptr_t)y->key;
    return i < j ? -1 : i > j;
}

int gw_body_splice_walk(const gw_body_scan_t *s, gw_body_piece_fn piece, void *arg)
{
    gw_splice_t few[8];
    gw_splice_t *sorted =
        s->nsplices <= SL_ARRAY_LEN(few) ? few : malloc(s->nsplices * sizeof(*sorted));
    if (!sorted)
        return -1;
    memcpy(sorted, s->splices, s->nsplices * sizeof(*sorted));
    /* qsort is not stable: order by (offset, kind, index in the array). */
    for (size_t i = 0; i < s->nsplices; i++)
        sorted[i].key = (const char *)(uintptr_t)i;
    if (sorted != few) {
        qsort(sorted, s->nsplices, sizeof(*sorted), gw_splice_cmp);
    } else {
        /* The usual two or three edits: insertion sort, the same total
         * order without qsort's setup (~200 instructions a request). */
        for (size_t i = 1; i < s->nsplices; i++) {
            gw_splice_t x = sorted[i];
            size_t j = i;
            for (; j > 0 && gw_splice_cmp(&sorted[j - 1], &x) > 0; j--)
                sorted[j] = sorted[j - 1];
            sorted[j] = x;
        }
    }
    int rc = 0;
    size_t at = 0;
    for (size_t i = 0; i < s->nsplices && rc == 0; i++) {
        const gw_splice_t *sp = &sorted[i];
        if (sp->off > at)
            rc = piece(arg, s->body + at, sp->off - at, true);
        if (rc == 0 && sp->comma)
            rc = piece(arg, ",", 1, false);
        if (rc == 0 && sp->len)
            rc = piece(arg, sp->text, sp->len, false);
        at = sp->off + sp->del;
    }
    if (rc == 0 && s->len > at)
        rc = piece(arg, s->body + at, s->len - at, true);
    if (sorted != few)
        free(sorted);
    return rc;
}

typedef struct gw_splice_buf {
    char *o;
    size_t n;
} gw_splice_buf_t;

static int gw_splice_copy(void *arg, const char *p, size_t n, bool body)
{
    (void)body;
    gw_splice_buf_t *b = arg;
    memcpy(b->o + b->n, p, n);
    b->n += n;
    return 0;
}

int gw_body_splice_apply_buf(const gw_body_scan_t *s, char *buf, size_t cap, char **out,
                             size_t *outlen)
{
    size_t total = s->len;
    for (size_t i = 0; i < s->nsplices; i++)
        total += s->splices[i].len + 1;
    gw_splice_buf_t b = {total + 1 <= cap ? buf : malloc(total + 1), 0};
    if (!b.o)
        return -1;
    if (gw_body_splice_walk(s, gw_splice_copy, &b) != 0) {
        if (b.o != buf)
            free(b.o);
        return -1;
    }
    b.o[b.n] = '\0';
    *out = b.o;
    *outlen = b.n;
    return 0;
}

int gw_body_splice_apply(const gw_body_scan_t *s, char **out, size_t *outlen)
{
    return gw_body_splice_apply_buf(s, NULL, 0, out, outlen);
}
