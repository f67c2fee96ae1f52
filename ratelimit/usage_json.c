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
 * U+10FFFF; yajl's check is looser), a \u0000 (jansson refuses it without
 * JSON_ALLOW_NUL) or a \uD800-\uDFFF escape (jansson checks the surrogate
 * pairing, yajl decodes what it gets), and nesting deeper than
 * RL_UJ_DEPTH (jansson stops at 2048). Such answers are rare; each costs
 * one tree, as every answer did before.
 */
#include <string.h>

#include <jansson.h>
#include <unistr.h>
#include <yajl/yajl_parse.h>

#include "common/yheap.h"
#include "ratelimit/ratelimit.h"

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
    if (u8_check((const uint8_t *)data, len) != NULL || rl_uj_odd_escape(data, len))
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
