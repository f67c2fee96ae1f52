/*
 * usage_json.c — a JSON answer's usage from its bytes, without a tree: what
 * rl_usage_from_body() reads from jansson's tree of the same bytes (parsed
 * with flags 0), read by yajl's callbacks over the whole answer. Only the
 * top-level "usage" object's direct members are kept; the rest is tokens
 * that go by. The settlement of a token budget reads every non-streamed
 * answer this way (gateway/hook_ratelimit.c), where a tree of the answer
 * cost twice the whole proxy.
 *
 * Exactness: the figures are the tree's for every input. Where yajl and
 * jansson could disagree on whether the bytes are JSON at all, the tree is
 * asked instead (rl_usage_json_tree): yajl stopped with an error (jansson
 * also fails on every error yajl reports, but integer LLONG_MIN, which only
 * jansson reads, is among them), UTF-8 libunistring's u8_check refuses
 * (jansson wants it strict: no overlongs, surrogates, nothing beyond
 * U+10FFFF; yajl's check is looser), a raw form feed or vertical tab
 * (blanks to yajl only), a \u0000 (jansson refuses it without
 * JSON_ALLOW_NUL) or a \uD800-\uDFFF escape (jansson checks the surrogate
 * pairing, yajl decodes what it gets), and nesting deeper than
 * RL_UJ_DEPTH (jansson stops at 2048). Such answers are rare; each costs
 * one tree, as every answer did before.
 *
 * A stream's chunk is read the same way (rl_chunk_read_json), or, when it
 * has the shape of a chunk read so before on the thread, from that kept
 * shape without a parse ("kept shapes" below).
 */
#include <string.h>

#include <jansson.h>
#include <unistr.h>
#include <yajl/yajl_parse.h>

#include "common/jshape.h"
#include "common/yheap.h"
#include "ratelimit/rl_internal.h"

#define RL_UJ_DEPTH 1024 /* deeper: the tree decides (jansson's limit is 2048) */

enum { RL_UJ_PROMPT, RL_UJ_COMPLETION, RL_UJ_INPUT, RL_UJ_OUTPUT, RL_UJ_TOTAL, RL_UJ_N };

/* One member of the usage object as the tree would hold it: the last
 * occurrence of its key wins (jansson keeps the last of duplicate keys). */
typedef struct rl_uj_member {
    bool present, integer;
    long long v;
} rl_uj_member_t;

typedef struct rl_uj {
    yajl_handle h;
    size_t end;        /* where the document closed (0: not yet) */
    int depth;         /* 1: inside the top-level object */
    int member;        /* RL_UJ_* whose value comes next, -1 none */
    bool top_object;   /* the document is an object */
    bool usage_next;   /* the next value is the top-level "usage"'s */
    bool in_usage;     /* inside that object (its members at depth 2) */
    bool usage_object; /* the last top-level "usage" holds an object */
    bool too_deep;
    rl_uj_member_t m[RL_UJ_N];
} rl_uj_t;

static rl_uj_t *rl_uj_of(void *ctx)
{
    return ((sl_ykeep_t *)ctx)->cur;
}

/* Any value but an integer or a container's start. */
static int rl_uj_scalar(void *ctx)
{
    rl_uj_t *u = rl_uj_of(ctx);
    u->member = -1;
    u->usage_next = false;
    return 1;
}

static int rl_uj_bool(void *ctx, int v)
{
    (void)v;
    return rl_uj_scalar(ctx);
}

static int rl_uj_double(void *ctx, double v)
{
    (void)v;
    return rl_uj_scalar(ctx);
}

static int rl_uj_string(void *ctx, const unsigned char *s, size_t n)
{
    (void)s;
    (void)n;
    return rl_uj_scalar(ctx);
}

static int rl_uj_integer(void *ctx, long long v)
{
    rl_uj_t *u = rl_uj_of(ctx);
    if (u->member >= 0) {
        u->m[u->member].integer = true;
        u->m[u->member].v = v;
    }
    return rl_uj_scalar(ctx);
}

static int rl_uj_member_of(const unsigned char *k, size_t n)
{
    static const struct {
        const char *name;
        size_t n;
    } names[RL_UJ_N] = {
        [RL_UJ_PROMPT] = {"prompt_tokens", 13}, [RL_UJ_COMPLETION] = {"completion_tokens", 17},
        [RL_UJ_INPUT] = {"input_tokens", 12},   [RL_UJ_OUTPUT] = {"output_tokens", 13},
        [RL_UJ_TOTAL] = {"total_tokens", 12},
    };
    for (int i = 0; i < RL_UJ_N; i++)
        if (n == names[i].n && memcmp(k, names[i].name, n) == 0)
            return i;
    return -1;
}

static int rl_uj_key(void *ctx, const unsigned char *k, size_t n)
{
    rl_uj_t *u = rl_uj_of(ctx);
    u->member = -1;
    if (u->depth == 1) {
        u->usage_next = n == 5 && memcmp(k, "usage", 5) == 0;
        if (u->usage_next) { /* a later "usage" replaces the earlier one */
            u->usage_object = false;
            memset(u->m, 0, sizeof(u->m));
        }
    } else if (u->depth == 2 && u->in_usage) {
        u->member = rl_uj_member_of(k, n);
        if (u->member >= 0)
            u->m[u->member] = (rl_uj_member_t){.present = true};
    }
    return 1;
}

static int rl_uj_open(void *ctx, bool map)
{
    rl_uj_t *u = rl_uj_of(ctx);
    if (++u->depth > RL_UJ_DEPTH) {
        u->too_deep = true;
        return 0;
    }
    if (u->depth == 1)
        u->top_object = map;
    else if (u->depth == 2 && u->usage_next && map)
        u->in_usage = u->usage_object = true;
    u->member = -1;
    u->usage_next = false;
    return 1;
}

static int rl_uj_start_map(void *ctx)
{
    return rl_uj_open(ctx, true);
}

static int rl_uj_start_array(void *ctx)
{
    return rl_uj_open(ctx, false);
}

static int rl_uj_close(void *ctx)
{
    rl_uj_t *u = rl_uj_of(ctx);
    if (u->depth == 2)
        u->in_usage = false;
    if (--u->depth == 0 && !u->end) /* the first value's end: what follows is judged */
        u->end = yajl_get_bytes_consumed(u->h);
    return 1;
}

static const yajl_callbacks rl_uj_cbs = {
    .yajl_null = rl_uj_scalar,
    .yajl_boolean = rl_uj_bool,
    .yajl_integer = rl_uj_integer,
    .yajl_double = rl_uj_double,
    .yajl_string = rl_uj_string,
    .yajl_start_map = rl_uj_start_map,
    .yajl_map_key = rl_uj_key,
    .yajl_end_map = rl_uj_close,
    .yajl_start_array = rl_uj_start_array,
    .yajl_end_array = rl_uj_close,
};

static _Thread_local sl_ykeep_t rl_uj_keep;

/* A \u escape jansson may refuse where yajl decodes: \u0000 and the
 * surrogates' range (a pairing jansson checks). Conservative: an escaped
 * backslash followed by 'u' also counts. */
static bool rl_uj_odd_escape(const char *p, size_t n)
{
    const char *end = p + n;
    const char *q = p;
    while ((q = memmem(q, (size_t)(end - q), "\\u", 2)) != NULL) {
        q += 2;
        if (end - q < 4)
            return true; /* not JSON: the tree says so */
        if ((q[0] == 'd' || q[0] == 'D') && q[1] && strchr("89abcdefABCDEF", q[1]))
            return true;
        if (memcmp(q, "0000", 4) == 0)
            return true;
    }
    return false;
}

/* Bytes the two parsers might read differently: UTF-8 jansson refuses
 * (u8_check is as strict), an escape it may refuse, and a form feed or
 * vertical tab, which yajl takes as blanks between tokens and jansson
 * refuses (inside a string both refuse them raw). */
static bool rl_uj_odd_bytes(const char *p, size_t n)
{
    return memchr(p, '\f', n) || memchr(p, '\v', n) || u8_check((const uint8_t *)p, n) != NULL ||
           rl_uj_odd_escape(p, n);
}

/* The tree's answer, for bytes where the two parsers might disagree. */
static int rl_usage_json_tree(const char *data, size_t len, rl_usage_t *u)
{
    memset(u, 0, sizeof(*u));
    json_t *j = json_loadb(data, len, 0, NULL);
    if (!j)
        return -1;
    int rc = rl_usage_from_body(j, u);
    json_decref(j);
    return rc;
}

/* The figures of a usage object read whole, as rl_usage_from_body has them. */
static int rl_uj_figures(const rl_uj_t *s, rl_usage_t *u)
{
    if (!s->top_object || !s->usage_object)
        return -1;
    const rl_uj_member_t *p = &s->m[RL_UJ_PROMPT], *c = &s->m[RL_UJ_COMPLETION];
    const rl_uj_member_t *t = &s->m[RL_UJ_TOTAL];
    if (!p->present && !c->present) {
        p = &s->m[RL_UJ_INPUT];
        c = &s->m[RL_UJ_OUTPUT];
    }
    if (!c->integer && !t->integer)
        return -1;
    u->prompt_tokens = p->integer ? SL_MAX(p->v, 0) : 0;
    u->completion_tokens = c->integer ? SL_MAX(c->v, 0) : 0;
    if (t->integer)
        u->total_tokens = SL_MAX(t->v, 0);
    else if (__builtin_add_overflow(u->prompt_tokens, u->completion_tokens, &u->total_tokens))
        u->total_tokens = INT64_MAX; /* as rl_usage_parse: a huge sum saturates */
    return 0;
}

int rl_usage_from_json(const char *data, size_t len, rl_usage_t *u)
{
    memset(u, 0, sizeof(*u));
    size_t i = 0;
    while (i < len && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r'))
        i++;
    if (i == len || data[i] != '{')
        return -1; /* the tree: not JSON, or not an object (no member) */
    if (rl_uj_odd_bytes(data, len))
        return rl_usage_json_tree(data, len, u);
    rl_uj_t s = {.member = -1};
    s.h = sl_ykeep_take(&rl_uj_keep, &rl_uj_cbs, false);
    if (!s.h)
        return rl_usage_json_tree(data, len, u);
    rl_uj_keep.cur = &s;
    yajl_status st = yajl_parse(s.h, (const unsigned char *)data, len);
    /* The object closed: yajl is between values (a kept handle takes the
     * next answer as a new one) and only blanks may follow; open: yajl
     * says what is missing. */
    if (st == yajl_status_ok && !s.end)
        st = yajl_complete_parse(s.h);
    rl_uj_keep.cur = NULL;
    bool whole = st == yajl_status_ok && s.end > 0;
    for (size_t k = s.end; whole && k < len; k++)
        whole = data[k] == ' ' || data[k] == '\t' || data[k] == '\n' || data[k] == '\r';
    sl_ykeep_put(&rl_uj_keep, s.h, whole);
    if (!whole || s.too_deep)
        return rl_usage_json_tree(data, len, u);
    return rl_uj_figures(&s, u);
}

/* ---- a chat stream's chunk ---------------------------------------------------
 *
 * What rl_stream_feed() reads from jansson's tree of one chunk, read the
 * same way: the text of choices[*] (delta, else message: content,
 * reasoning_content, tool_calls[*].function name and arguments; the
 * choice's text) and the top-level usage. The last of a duplicated key
 * wins at every level, as in the tree. The chunk whose usage must be cut
 * out of a chunk with choices (a rewrite) goes to the tree. */

enum {
    RL_SJ_NONE,
    RL_SJ_TOP,
    RL_SJ_CHOICES,
    RL_SJ_CHOICE,
    RL_SJ_DM,
    RL_SJ_TCS,
    RL_SJ_TC,
    RL_SJ_FN,
    RL_SJ_USAGE
};

/* The key whose value comes next, in its container's role. */
enum { RL_SK_OTHER, RL_SK_CONTENT, RL_SK_REASONING, RL_SK_TEXT, RL_SK_NAME, RL_SK_ARGS };

typedef struct rl_cnt {
    int64_t a, o; /* ASCII bytes, other characters (UTF-8 lead bytes) */
    uint64_t m;   /* learning a shape: the holes (bit i: hole i) counted here */
} rl_cnt_t;

typedef struct rl_dm {
    rl_cnt_t content, reasoning, tools;
} rl_dm_t;

#define RL_SJ_ROLES 8

/* A learning read's record of the chunk's holes (below, "kept shapes"). */
typedef struct rl_cs_rec {
    const char *data;
    size_t nh;
    bool bad; /* beyond the bounds, or a hole counted twice: not kept */
    sl_jspan_t hole[SL_JSHAPE_MAX_HOLES];
    uint8_t kind[SL_JSHAPE_MAX_HOLES];
} rl_cs_rec_t;

typedef struct rl_sj {
    rl_uj_t u; /* the usage, as for an answer (its depth unused) */
    int depth; /* 1: the chunk object */
    int next;  /* the role of the container the pending key's value opens */
    int skey;  /* RL_SK_* of the pending key's string value */
    uint8_t role[RL_SJ_ROLES + 1];
    bool choices_array;
    int64_t choices_n;
    rl_cnt_t total; /* the last "choices"' committed choices */
    bool has_delta;
    rl_dm_t d, m; /* the current choice's delta and message */
    rl_cnt_t text;
    bool in_delta; /* the RL_SJ_DM being read is the delta (else the message) */
    rl_cnt_t fname, fargs;
    rl_cs_rec_t *rec; /* learning: the holes recorded, else NULL */
} rl_sj_t;

static rl_sj_t *rl_sj_of(void *ctx)
{
    return ((sl_ykeep_t *)ctx)->cur;
}

static int rl_sj_role(const rl_sj_t *s)
{
    return s->depth >= 1 && s->depth <= RL_SJ_ROLES ? s->role[s->depth] : RL_SJ_NONE;
}

static rl_dm_t *rl_sj_dm(rl_sj_t *s)
{
    return s->in_delta ? &s->d : &s->m;
}

static void rl_sj_add(rl_sj_t *s, rl_cnt_t *c, const rl_cnt_t *x)
{
    c->a += x->a;
    c->o += x->o;
    if (c->m & x->m) /* a hole twice in a sum: no mask stands for it */
        s->rec->bad = true;
    c->m |= x->m;
}

/* ---- learning a shape: the holes, as yajl reads them --------------------------
 *
 * Every string value is a hole (SL_JHOLE_JSTR) and every integer that fits
 * one (SL_JHOLE_INT): values of another stream (id, created, model) and the
 * text alike. Where a value ends is where yajl stopped (its callback comes
 * with the token read); an integer's start is after the digits and '-'
 * before that, a string's is after the '"' before it that no odd run of
 * '\\' escapes. sl_jshape_set checks each span again. */

static int rl_cs_rec_hole(rl_cs_rec_t *r, size_t off, size_t len, uint8_t kind)
{
    if (r->nh == SL_JSHAPE_MAX_HOLES || off + len > UINT32_MAX) {
        r->bad = true;
        return -1;
    }
    r->hole[r->nh] = (sl_jspan_t){(uint32_t)off, (uint32_t)len};
    r->kind[r->nh] = kind;
    return (int)r->nh++;
}

/* The string value yajl just read: its hole's index, or -1. */
static int rl_cs_rec_str(rl_cs_rec_t *r, yajl_handle h)
{
    size_t e = yajl_get_bytes_consumed(h);
    if (e == 0 || r->data[e - 1] != '"') {
        r->bad = true;
        return -1;
    }
    size_t close = e - 1, q = close;
    for (;;) {
        const char *f = q ? memrchr(r->data, '"', q) : NULL;
        if (!f) {
            r->bad = true;
            return -1;
        }
        q = (size_t)(f - r->data);
        size_t bs = 0;
        while (bs < q && r->data[q - 1 - bs] == '\\')
            bs++;
        if (bs % 2 == 0)
            break;
    }
    return rl_cs_rec_hole(r, q + 1, close - q - 1, SL_JHOLE_JSTR);
}

/* The integer yajl just read (it stopped after its last digit): a hole
 * when it fits one, else the shape's own bytes. */
static void rl_cs_rec_int(rl_cs_rec_t *r, yajl_handle h)
{
    size_t e = yajl_get_bytes_consumed(h), b = e;
    while (b > 0 && ((r->data[b - 1] >= '0' && r->data[b - 1] <= '9') || r->data[b - 1] == '-'))
        b--;
    size_t digits = e - b - (e > b && r->data[b] == '-');
    if (digits > 0 && digits <= SL_JSHAPE_INT_DIGITS)
        (void)rl_cs_rec_hole(r, b, e - b, SL_JHOLE_INT);
}

static int rl_sj_value(rl_sj_t *s)
{
    if (rl_sj_role(s) == RL_SJ_CHOICES)
        s->choices_n++;
    if (s->depth == 1) /* the usage member's value is not an object */
        s->u.usage_next = false;
    s->u.member = -1;
    s->next = RL_SJ_NONE;
    s->skey = RL_SK_OTHER;
    return 1;
}

static int rl_sj_scalar(void *ctx)
{
    return rl_sj_value(rl_sj_of(ctx));
}

static int rl_sj_bool(void *ctx, int v)
{
    (void)v;
    return rl_sj_scalar(ctx);
}

static int rl_sj_double(void *ctx, double v)
{
    (void)v;
    return rl_sj_scalar(ctx);
}

static int rl_sj_integer(void *ctx, long long v)
{
    rl_sj_t *s = rl_sj_of(ctx);
    if (s->rec)
        rl_cs_rec_int(s->rec, s->u.h);
    if (s->u.member >= 0) {
        s->u.m[s->u.member].integer = true;
        s->u.m[s->u.member].v = v;
    }
    return rl_sj_value(s);
}

static int rl_sj_string(void *ctx, const unsigned char *t, size_t n)
{
    rl_sj_t *s = rl_sj_of(ctx);
    rl_cnt_t c = {0, 0, 0};
    sl_text_chars((const char *)t, n, &c.a, &c.o);
    if (s->rec) {
        int hole = rl_cs_rec_str(s->rec, s->u.h);
        if (hole >= 0)
            c.m = (uint64_t)1 << hole;
    }
    switch (s->skey) {
    case RL_SK_CONTENT:
        rl_sj_dm(s)->content = c;
        break;
    case RL_SK_REASONING:
        rl_sj_dm(s)->reasoning = c;
        break;
    case RL_SK_TEXT:
        s->text = c;
        break;
    case RL_SK_NAME:
        s->fname = c;
        break;
    case RL_SK_ARGS:
        s->fargs = c;
        break;
    default:
        break;
    }
    return rl_sj_value(s);
}

static int rl_sj_key(void *ctx, const unsigned char *k, size_t n)
{
    rl_sj_t *s = rl_sj_of(ctx);
    s->next = RL_SJ_NONE;
    s->skey = RL_SK_OTHER;
    s->u.member = -1;
#define RL_SJ_IS(lit) (n == sizeof(lit) - 1 && memcmp(k, lit, n) == 0)
    switch (rl_sj_role(s)) {
    case RL_SJ_TOP:
        s->u.usage_next = RL_SJ_IS("usage");
        if (s->u.usage_next) {
            s->u.usage_object = false;
            memset(s->u.m, 0, sizeof(s->u.m));
            s->next = RL_SJ_USAGE;
        } else if (RL_SJ_IS("choices")) {
            s->total = (rl_cnt_t){0, 0, 0};
            s->choices_array = false;
            s->choices_n = 0;
            s->next = RL_SJ_CHOICES;
        }
        break;
    case RL_SJ_USAGE:
        s->u.member = rl_uj_member_of(k, n);
        if (s->u.member >= 0)
            s->u.m[s->u.member] = (rl_uj_member_t){.present = true};
        break;
    case RL_SJ_CHOICE:
        if (RL_SJ_IS("delta")) {
            s->has_delta = true;
            s->in_delta = true;
            s->d = (rl_dm_t){0};
            s->next = RL_SJ_DM;
        } else if (RL_SJ_IS("message")) {
            s->in_delta = false;
            s->m = (rl_dm_t){0};
            s->next = RL_SJ_DM;
        } else if (RL_SJ_IS("text")) {
            s->text = (rl_cnt_t){0, 0, 0};
            s->skey = RL_SK_TEXT;
        }
        break;
    case RL_SJ_DM:
        if (RL_SJ_IS("content")) {
            rl_sj_dm(s)->content = (rl_cnt_t){0, 0, 0};
            s->skey = RL_SK_CONTENT;
        } else if (RL_SJ_IS("reasoning_content")) {
            rl_sj_dm(s)->reasoning = (rl_cnt_t){0, 0, 0};
            s->skey = RL_SK_REASONING;
        } else if (RL_SJ_IS("tool_calls")) {
            rl_sj_dm(s)->tools = (rl_cnt_t){0, 0, 0};
            s->next = RL_SJ_TCS;
        }
        break;
    case RL_SJ_TC:
        if (RL_SJ_IS("function")) {
            s->fname = s->fargs = (rl_cnt_t){0, 0, 0};
            s->next = RL_SJ_FN;
        }
        break;
    case RL_SJ_FN:
        if (RL_SJ_IS("name")) {
            s->fname = (rl_cnt_t){0, 0, 0};
            s->skey = RL_SK_NAME;
        } else if (RL_SJ_IS("arguments")) {
            s->fargs = (rl_cnt_t){0, 0, 0};
            s->skey = RL_SK_ARGS;
        }
        break;
    default:
        break;
    }
#undef RL_SJ_IS
    return 1;
}

static int rl_sj_open(void *ctx, bool map)
{
    rl_sj_t *s = rl_sj_of(ctx);
    int parent = rl_sj_role(s), next = s->next, role = RL_SJ_NONE;
    if (++s->depth > RL_UJ_DEPTH) {
        s->u.too_deep = true;
        return 0;
    }
    if (s->depth == 1) {
        role = map ? RL_SJ_TOP : RL_SJ_NONE;
        s->u.top_object = map;
    } else if (parent == RL_SJ_CHOICES) {
        s->choices_n++;
        if (map) {
            role = RL_SJ_CHOICE;
            s->has_delta = false;
            s->d = s->m = (rl_dm_t){0};
            s->text = (rl_cnt_t){0, 0, 0};
        }
    } else if (parent == RL_SJ_TCS) {
        if (map) {
            role = RL_SJ_TC;
            s->fname = s->fargs = (rl_cnt_t){0, 0, 0};
        }
    } else if (next == RL_SJ_CHOICES && !map) {
        role = RL_SJ_CHOICES;
        s->choices_array = true;
    } else if (next == RL_SJ_TCS && !map) {
        role = RL_SJ_TCS;
    } else if (next == RL_SJ_USAGE && map) {
        role = RL_SJ_USAGE;
        s->u.usage_object = true;
    } else if ((next == RL_SJ_DM || next == RL_SJ_FN) && map) {
        role = next;
    }
    if (s->depth <= RL_SJ_ROLES)
        s->role[s->depth] = (uint8_t)role;
    s->u.usage_next = false;
    s->u.member = -1;
    s->next = RL_SJ_NONE;
    s->skey = RL_SK_OTHER;
    return 1;
}

static int rl_sj_start_map(void *ctx)
{
    return rl_sj_open(ctx, true);
}

static int rl_sj_start_array(void *ctx)
{
    return rl_sj_open(ctx, false);
}

static int rl_sj_close(void *ctx)
{
    rl_sj_t *s = rl_sj_of(ctx);
    int role = rl_sj_role(s);
    if (role == RL_SJ_CHOICE) {
        const rl_dm_t *dm = s->has_delta ? &s->d : &s->m;
        rl_sj_add(s, &s->total, &dm->content);
        rl_sj_add(s, &s->total, &dm->reasoning);
        rl_sj_add(s, &s->total, &s->text);
        rl_sj_add(s, &s->total, &dm->tools);
    } else if (role == RL_SJ_TC) {
        rl_dm_t *dm = rl_sj_dm(s);
        rl_sj_add(s, &dm->tools, &s->fname);
        rl_sj_add(s, &dm->tools, &s->fargs);
    }
    if (--s->depth == 0 && !s->u.end)
        s->u.end = yajl_get_bytes_consumed(s->u.h);
    s->next = RL_SJ_NONE;
    s->skey = RL_SK_OTHER;
    return 1;
}

static const yajl_callbacks rl_sj_cbs = {
    .yajl_null = rl_sj_scalar,
    .yajl_boolean = rl_sj_bool,
    .yajl_integer = rl_sj_integer,
    .yajl_double = rl_sj_double,
    .yajl_string = rl_sj_string,
    .yajl_start_map = rl_sj_start_map,
    .yajl_map_key = rl_sj_key,
    .yajl_end_map = rl_sj_close,
    .yajl_start_array = rl_sj_start_array,
    .yajl_end_array = rl_sj_close,
};

static _Thread_local sl_ykeep_t rl_sj_keep;

/* The yajl read of a chunk; rec, when set, records its holes. */
static int rl_chunk_read_yajl(const char *data, size_t len, rl_chunk_read_t *out, rl_cs_rec_t *rec,
                              uint64_t *counted)
{
    memset(out, 0, sizeof(*out));
    size_t i = 0;
    while (i < len && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r'))
        i++;
    if (i == len || data[i] != '{' || rl_uj_odd_bytes(data, len))
        return -1; /* the first value must be the object (yajl reads several) */
    rl_sj_t s = {.u = {.member = -1}, .rec = rec};
    s.u.h = sl_ykeep_take(&rl_sj_keep, &rl_sj_cbs, false);
    if (!s.u.h)
        return -1;
    rl_sj_keep.cur = &s;
    yajl_status st = yajl_parse(s.u.h, (const unsigned char *)data, len);
    if (st == yajl_status_ok && !s.u.end)
        st = yajl_complete_parse(s.u.h);
    rl_sj_keep.cur = NULL;
    bool whole = st == yajl_status_ok && s.u.end > 0;
    for (size_t k = s.u.end; whole && k < len; k++)
        whole = data[k] == ' ' || data[k] == '\t' || data[k] == '\n' || data[k] == '\r';
    sl_ykeep_put(&rl_sj_keep, s.u.h, whole);
    if (!whole || s.u.too_deep || !s.u.top_object)
        return -1; /* not a chunk object: the tree says what it is */
    out->ascii = s.total.a;
    out->other = s.total.o;
    out->got_usage = rl_uj_figures(&s.u, &out->usage) == 0;
    out->choices_empty = s.choices_array && s.choices_n == 0;
    *counted = s.total.m;
    return 0;
}

/* ---- kept shapes ------------------------------------------------------------
 *
 * A stream's chunks differ from each other (and from another stream's of
 * the same server) only in their values: after the read above took a chunk
 * without a usage, the thread keeps its bytes as a shape (common/jshape.h)
 * whose holes are its string values and integers, with which holes its
 * count sums (a mask: the text's strings) and whether its choices is an
 * empty array. A later chunk with that shape is that chunk's JSON with
 * other values: the same keys, structure and value types (jshape.h says
 * why), so the read above would walk it the same way: the same strings
 * counted, no usage (that depends on the keys and the types alone), the
 * same choices. What the odd-bytes rules would see differs only in the
 * holes: control bytes are no hole's; the UTF-8 check is u8_check on the
 * string holes (UTF-8 is whole between ASCII quotes, so the shape's own
 * bytes stay as they passed); an escape a hole may hold is one both
 * parsers decode alike (jshape's JSTR: no \u0000, surrogates in pairs
 * only), so where the full read would ask the tree for it (a pair, or a
 * "\\u" it takes for one), the tree's counts are the decoded ones here. A
 * counted string with escapes is decoded as it is counted (rl_cs_count).
 * A chunk with a usage, or bytes the rules refuse, or no kept shape, is
 * read the full way. */

#define RL_CS_SLOTS 8
#define RL_CS_RUN   8
#define RL_CS_EVERY 16

typedef struct rl_cshape {
    uint64_t counted; /* holes whose text is counted */
    bool choices_empty;
} rl_cshape_t;

static _Thread_local sl_jshape_cache_t rl_cs =
    SL_JSHAPE_CACHE_INIT(RL_CS_SLOTS, RL_CS_RUN, RL_CS_EVERY, sizeof(rl_cshape_t), NULL);
static _Thread_local bool rl_cs_off;

void rl_chunk_shapes_clear(void)
{
    sl_jshape_cache_clear(&rl_cs);
}

void rl_chunk_shapes_enable(bool on)
{
    rl_cs_off = !on;
}

uint64_t rl_chunk_shape_hits(void)
{
    return rl_cs.st.hits;
}

/* Whether p[0..n) is all ASCII (8 bytes at a time). */
/* The two counts of a string's interior p[0..n) whose escapes jshape
 * vouched for (JSTR), decoded: one ASCII byte for each escape of one and
 * for \u0001-\u007f, one other character for any other \u (BMP) and for a
 * surrogate pair (one character beyond it). */
static void rl_cs_count_esc(const char *p, size_t n, int64_t *a, int64_t *o)
{
    size_t i = 0;
    while (i < n) {
        const char *b = memchr(p + i, '\\', n - i);
        size_t run = b ? (size_t)(b - p) - i : n - i;
        sl_text_chars(p + i, run, a, o);
        i += run;
        if (i == n)
            break;
        if (p[i + 1] != 'u') {
            (*a)++;
            i += 2;
            continue;
        }
        const char *h = p + i + 2;
        if (h[0] == '0' && h[1] == '0' && h[2] >= '0' && h[2] <= '7')
            (*a)++;
        else
            (*o)++;
        i += (h[0] | 0x20) == 'd' && memchr("89abAB", h[1], 6) ? 12 : 6;
    }
}

/* Whether data ends with the shape's bytes after its last hole: a cheap
 * first test for a shape of another chunk. */
static bool rl_cs_tail(const sl_jshape_t *sh, const char *data, size_t n)
{
    size_t t = sh->nholes ? sh->len - (sh->hole[sh->nholes - 1].off + sh->hole[sh->nholes - 1].len)
                          : sh->len;
    return t <= n && memcmp(data + n - t, sh->bytes + sh->len - t, t) == 0;
}

/* Whether every string hole got in data is UTF-8 as u8_check takes it. */
static bool rl_cs_utf8(const sl_jshape_t *sh, const char *data, const sl_jspan_t *got)
{
    for (size_t i = 0; i < sh->nholes; i++) {
        const char *p = data + got[i].off;
        if (sh->kind[i] != SL_JHOLE_INT && !sl_ascii_all(p, got[i].len) &&
            u8_check((const uint8_t *)p, got[i].len) != NULL)
            return false;
    }
    return true;
}

/* true: data has a kept shape, *out what the full read gives. The slot
 * of the last hit first: a stream's chunks repeat one shape. */
static bool rl_cs_find(const char *data, size_t len, rl_chunk_read_t *out)
{
    sl_jshape_cache_t *c = &rl_cs;
    sl_jspan_t got[SL_JSHAPE_MAX_HOLES];
    uint64_t esc;
    for (unsigned k = 0, i = c->last; k < c->nslots; k++, i = (i + 1) % c->nslots) {
        const sl_jshape_slot_t *sl = &c->slot[i];
        if (sl_jshape_empty(&sl->sh) || !rl_cs_tail(&sl->sh, data, len) ||
            !sl_jshape_match_esc(&sl->sh, data, len, got, &esc))
            continue;
        if (!rl_cs_utf8(&sl->sh, data, got))
            break; /* the full read's rules decide */
        const rl_cshape_t *d = sl->data;
        memset(out, 0, sizeof(*out));
        for (uint64_t m = d->counted; m; m &= m - 1) {
            unsigned h = (unsigned)__builtin_ctzll(m);
            if (esc >> h & 1)
                rl_cs_count_esc(data + got[h].off, got[h].len, &out->ascii, &out->other);
            else
                sl_text_chars(data + got[h].off, got[h].len, &out->ascii, &out->other);
        }
        out->choices_empty = d->choices_empty;
        sl_jshape_cache_hit(c, i);
        return true;
    }
    sl_jshape_cache_miss(c);
    return false;
}

/* A chunk the full read took (no usage): its shape kept. */
static void rl_cs_learn(const char *data, size_t len, const rl_cs_rec_t *r,
                        const rl_chunk_read_t *rd, uint64_t counted)
{
    sl_jshape_cache_t *c = &rl_cs;
    if (r->bad || rd->got_usage || len > SL_JSHAPE_MAX_BYTES)
        return;
    int i = sl_jshape_cache_take(c);
    if (i < 0)
        return;
    *(rl_cshape_t *)c->slot[i].data = (rl_cshape_t){counted, rd->choices_empty};
    if (sl_jshape_cache_set(c, (unsigned)i, data, len, r->hole, r->kind, r->nh) != 0)
        return; /* the slot stays empty: it matches nothing */
}

int rl_chunk_read_json(const char *data, size_t len, rl_chunk_read_t *out)
{
    uint64_t counted = 0;
    if (rl_cs_off)
        return rl_chunk_read_yajl(data, len, out, NULL, &counted);
    if (rl_cs_find(data, len, out))
        return 0;
    /* a text no shape can hold neither asks the gate nor records */
    if (len > SL_JSHAPE_MAX_BYTES || !sl_jshape_cache_gate(&rl_cs))
        return rl_chunk_read_yajl(data, len, out, NULL, &counted);
    rl_cs_rec_t rec = {.data = data};
    int rc = rl_chunk_read_yajl(data, len, out, &rec, &counted);
    if (rc == 0)
        rl_cs_learn(data, len, &rec, out, counted);
    return rc;
}
