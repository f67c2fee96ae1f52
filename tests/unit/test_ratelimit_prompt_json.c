/*
 * The prompt estimates without a tree (ratelimit/prompt_json.c) against
 * their tree versions (ratelimit/body.c) on the gateway's own view of a
 * body: bodies generated from a fixed seed (strings with escapes, \/,
 * \u00e9, surrogate pairs, controls, raw CJK; numbers in every form jansson
 * rewrites; content parts, images, function_call items; tools with nested
 * schemas; random whitespace; duplicate keys), each scanned as the gateway
 * scans it (plain, skeleton, shape hit) and the scan's estimate, when the
 * scan gives one, equal to the tree's to the token.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gateway/body_scan.h"
#include "gateway/gw_hook.h"
#include "common/jshape.h"
#include "gateway/json_intake.h"
#include "ratelimit/ratelimit.h"

static json_t *intake(const char *b, size_t n)
{
    bool inexact;
    char msg[256];
    json_t *j = gw_json_intake(b, n, &inexact, msg, sizeof(msg));
    if (j && !json_is_object(j)) {
        json_decref(j);
        return NULL;
    }
    return j;
}

/* ---- a small generator ------------------------------------------------------ */

typedef struct gen {
    char *p;
    size_t n, cap;
    uint64_t rnd;
} gen_t;

static unsigned rnd(gen_t *g, unsigned m)
{
    g->rnd ^= g->rnd << 13;
    g->rnd ^= g->rnd >> 7;
    g->rnd ^= g->rnd << 17;
    return (unsigned)(g->rnd % m);
}

static void put(gen_t *g, const char *s)
{
    size_t k = strlen(s);
    if (g->n + k + 1 > g->cap) {
        g->cap = (g->n + k + 1) * 2;
        g->p = realloc(g->p, g->cap);
        assert_non_null(g->p);
    }
    memcpy(g->p + g->n, s, k + 1);
    g->n += k;
}

/* Blanks between tokens, sometimes. */
static void ws(gen_t *g)
{
    static const char *w[] = {"", "", "", " ", "\n  ", "\t", " \r\n "};
    put(g, w[rnd(g, 7)]);
}

static const char *pieces[] = {"hello",
                               " world",
                               "\\n",
                               "\\\"",
                               "\\\\",
                               "\\/",
                               "\\u00e9",
                               "\\u4e2d",
                               "\\ud83d\\ude00",
                               "\\u0001",
                               "\\u001f",
                               "\\t",
                               "\\b\\f\\r",
                               "caf\xc3\xa9",
                               "\xe4\xb8\xad\xe6\x96\x87",
                               "\xf0\x9f\x98\x80",
                               "a/b",
                               "\\u0041",
                               "\\u007f",
                               "\x7f",
                               "\\u0000",
                               "{\\\"k\\\": 1}",
                               "0123456789",
                               "input_image"};

static void str(gen_t *g)
{
    put(g, "\"");
    for (unsigned i = rnd(g, 5); i > 0; i--)
        put(g, pieces[rnd(g, sizeof(pieces) / sizeof(pieces[0]))]);
    put(g, "\"");
}

static void num(gen_t *g)
{
    static const char *nums[] = {"0",
                                 "-0",
                                 "1",
                                 "-17",
                                 "42",
                                 "0.1",
                                 "1.5",
                                 "-2.50",
                                 "1e5",
                                 "1.5E-3",
                                 "2E+2",
                                 "100.0",
                                 "3.14159265358979323846",
                                 "9007199254740993",
                                 "-0.0",
                                 "1e-999",
                                 "123456789012345678901234567890"};
    put(g, nums[rnd(g, sizeof(nums) / sizeof(nums[0]))]);
}

static void value(gen_t *g, int depth);

static void key(gen_t *g, const char *k)
{
    ws(g);
    put(g, "\"");
    put(g, k);
    put(g, "\"");
    ws(g);
    put(g, ":");
    ws(g);
}

static void object(gen_t *g, int depth)
{
    static const char *keys[] = {"type", "name",     "description", "properties", "items",
                                 "enum", "required", "k\\u00e9y",   "a\\/b",      "x"};
    put(g, "{");
    unsigned n = rnd(g, 4);
    for (unsigned i = 0; i < n; i++) {
        if (i)
            put(g, ",");
        key(g, keys[rnd(g, sizeof(keys) / sizeof(keys[0]))]); /* duplicates, sometimes */
        value(g, depth + 1);
        ws(g);
    }
    put(g, "}");
}

static void array(gen_t *g, int depth)
{
    put(g, "[");
    unsigned n = rnd(g, 4);
    for (unsigned i = 0; i < n; i++) {
        if (i)
            put(g, ",");
        ws(g);
        value(g, depth + 1);
        ws(g);
    }
    put(g, "]");
}

static void value(gen_t *g, int depth)
{
    switch (depth > 4 ? rnd(g, 5) : rnd(g, 7)) {
    case 0:
        str(g);
        break;
    case 1:
        num(g);
        break;
    case 2:
        put(g, rnd(g, 2) ? "true" : "null");
        break;
    case 3:
    case 4:
        str(g);
        break;
    case 5:
        object(g, depth);
        break;
    default:
        array(g, depth);
        break;
    }
}

/* A function tool with a nested parameter schema. */
static void tool(gen_t *g)
{
    put(g, "{");
    key(g, "type");
    put(g, "\"function\",");
    key(g, "function");
    put(g, "{");
    key(g, "name");
    str(g);
    put(g, ",");
    key(g, "parameters");
    put(g, "{\"type\":\"object\",\"properties\":{\"loc\":{\"type\":\"string\",\"description\":");
    str(g);
    put(g, "},\"n\":{\"type\":\"number\",\"minimum\":");
    num(g);
    put(g, "},\"more\":");
    value(g, 2);
    put(g, "},\"required\":[\"loc\"]}}");
    ws(g);
    put(g, "}");
}

static void tools(gen_t *g)
{
    switch (rnd(g, 5)) {
    case 0:
        value(g, 1); /* anything */
        break;
    default:
        put(g, "[");
        for (unsigned i = 0, n = rnd(g, 3); i < n; i++) {
            if (i)
                put(g, ",");
            ws(g);
            tool(g);
        }
        put(g, "]");
        break;
    }
}

/* One content part of a Responses message. */
static void resp_part(gen_t *g)
{
    switch (rnd(g, 6)) {
    case 0:
        put(g, "{\"type\":\"input_text\",\"text\":");
        str(g);
        put(g, "}");
        break;
    case 1:
        put(g, "{\"type\":\"input_image\",\"image_url\":\"https://x/y.png\"}");
        break;
    case 2:
        put(g, "{\"type\":\"input_file\",\"file_id\":");
        str(g);
        put(g, "}");
        break;
    case 3:
        put(g, "{\"text\":");
        value(g, 3); /* a text that is not a string, sometimes */
        ws(g);
        put(g, ",\"type\":");
        str(g);
        put(g, "}");
        break;
    default:
        value(g, 3);
        break;
    }
}

static void resp_item(gen_t *g)
{
    switch (rnd(g, 7)) {
    case 0:
        put(g, "{\"role\":\"user\",\"content\":");
        str(g);
        put(g, "}");
        break;
    case 1:
        put(g, "{\"role\":\"user\",");
        ws(g);
        put(g, "\"content\":[");
        for (unsigned i = 0, n = rnd(g, 4); i < n; i++) {
            if (i)
                put(g, ",");
            ws(g);
            resp_part(g);
        }
        put(g, "]}");
        break;
    case 2:
        put(g, "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":");
        str(g);
        put(g, ",\"arguments\":");
        str(g);
        put(g, "}");
        break;
    case 3:
        put(g, "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":");
        value(g, 2);
        put(g, "}");
        break;
    case 4:
        put(g, "{\"content\":");
        value(g, 2);
        put(g, ",\"output\":");
        str(g);
        put(g, "}");
        break;
    default:
        value(g, 1);
        break;
    }
}

static void resp_body(gen_t *g)
{
    put(g, "{\"model\":\"m\",");
    if (rnd(g, 3)) {
        key(g, "instructions");
        rnd(g, 4) ? str(g) : value(g, 1);
        put(g, ",");
    }
    key(g, "input");
    switch (rnd(g, 6)) {
    case 0:
        str(g);
        break;
    case 1:
        value(g, 1);
        break;
    default:
        put(g, "[");
        for (unsigned i = 0, n = rnd(g, 5); i < n; i++) {
            if (i)
                put(g, ",");
            ws(g);
            resp_item(g);
        }
        put(g, "]");
        break;
    }
    if (rnd(g, 2)) {
        put(g, ",");
        key(g, "tools");
        tools(g);
    }
    if (rnd(g, 8) == 0) {
        put(g, ",");
        key(g, "input"); /* a duplicate key: the tree decides */
        str(g);
    }
    ws(g);
    put(g, "}");
}

static void chat_body(gen_t *g)
{
    put(g, "{\"model\":\"m\",\"messages\":[");
    for (unsigned i = 0, n = 1 + rnd(g, 4); i < n; i++) {
        if (i)
            put(g, ",");
        ws(g);
        switch (rnd(g, 4)) {
        case 0:
            put(g, "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\","
                   "\"type\":\"function\",\"function\":{\"name\":");
            str(g);
            put(g, ",\"arguments\":");
            str(g);
            put(g, "}}]}");
            break;
        case 1:
            put(g, "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":");
            str(g);
            put(g, ",\"tool_calls\":");
            value(g, 2);
            put(g, "}");
            break;
        default:
            put(g, "{\"role\":\"user\",\"content\":");
            str(g);
            put(g, "}");
            break;
        }
    }
    put(g, "]");
    if (rnd(g, 4)) {
        put(g, ",");
        key(g, "tools");
        tools(g);
    }
    ws(g);
    put(g, "}");
}

/* ---- the comparisons -------------------------------------------------------- */

/* The product's own conversion of the scanner's facts (hook_ratelimit.c). */
static int64_t resp_scan(const gw_body_scan_t *b, bool *ok)
{
    int64_t n = -1;
    *ok = gw_rl_resp_scan_tokens(b, &n) == 0;
    return n;
}

static int64_t chat_scan(const gw_body_scan_t *b, bool *ok)
{
    int64_t n = -1;
    *ok = b->has_msgs && rl_chat_prompt_tokens_json(&b->chat, &n) == 0;
    return n;
}

/* The scanner's ways through a body: yajl over the body, over a skeleton,
 * and a kept shape's hit (the same body scanned again). */
static const unsigned scan_ways[] = {GW_SCAN_MSGS | GW_SCAN_NO_SKEL | GW_SCAN_NO_SHAPE,
                                     GW_SCAN_MSGS | GW_SCAN_SKEL_TEST | GW_SCAN_NO_SHAPE,
                                     GW_SCAN_MSGS | GW_SCAN_NO_SKEL | GW_SCAN_SHAPE_TEST};

typedef struct tally {
    size_t counted; /* the scan's estimate (way 0) */
    size_t tree;    /* scanned, the estimate left to the tree (a big integer) */
    size_t refused; /* jansson refused the body (duplicate keys): so did the scan */
    size_t hits;    /* variants answered from the body's kept shape */
} tally_t;

/* b with every "hello" inside its strings made "hello, hello" (the piece
 * occurs only there): the same shape, other string lengths. */
static char *variant(const char *b)
{
    size_t n = strlen(b);
    char *o = malloc(n * 3 + 1);
    assert_non_null(o);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (strncmp(b + i, "hello", 5) == 0) {
            memcpy(o + k, "hello, hello", 12);
            k += 12;
            i += 5;
        } else {
            o[k++] = b[i++];
        }
    }
    o[k] = '\0';
    return o;
}

/* n bodies of one kind: the scan's estimate (when it gives one) equal to
 * the tree's. */
static tally_t differ(void (*body)(gen_t *), int64_t (*tree)(const json_t *),
                      int64_t (*scan)(const gw_body_scan_t *, bool *), unsigned n, uint64_t seed)
{
    gen_t g = {.rnd = seed};
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    tally_t t = {0};
    for (unsigned i = 0; i < n; i++) {
        g.n = 0;
        body(&g);
        json_t *j = intake(g.p, g.n);
        if (!j) { /* refused: no estimate is ever made */
            if (gw_body_scan(s, g.p, g.n, scan_ways[0]) == GW_SCAN_OK)
                fail_msg("body %u: jansson refuses it, the scan does not: %s", i, g.p);
            t.refused++;
            continue;
        }
        int64_t want = tree(j);
        json_decref(j);
        /* a body of the same shape, its strings longer: scanned after
         * this one, a kept shape's hit moves every span (way 2) */
        char *v = variant(g.p);
        json_t *vj = intake(v, strlen(v));
        assert_non_null(vj);
        int64_t vwant = tree(vj);
        json_decref(vj);
        for (size_t w = 0; w < sizeof(scan_ways) / sizeof(scan_ways[0]); w++) {
            for (int again = 0; again < 1 + (w == 2); again++) {
                gw_scan_rc_t rc = gw_body_scan(s, g.p, g.n, scan_ways[w]);
                if (rc != GW_SCAN_OK)
                    continue;
                bool ok;
                int64_t got = scan(s, &ok);
                t.tree += w == 0 && !ok;
                /* only a big integer leaves it to the tree: a span cut
                 * short would fail the walk and hide there */
                if (ok == s->bigint)
                    fail_msg("body %u (way %zu): scan's way %s, bigint %d: %s", i, w,
                             ok ? "counted" : "failed", s->bigint, g.p);
                if (!ok)
                    continue;
                t.counted += w == 0;
                if (got != want)
                    fail_msg("body %u (way %zu): scan %lld, tree %lld: %s", i, w, (long long)got,
                             (long long)want, g.p);
            }
        }
        gw_shape_stats_t before = gw_body_scan_shape_stats();
        if (gw_body_scan(s, v, strlen(v), scan_ways[2]) == GW_SCAN_OK) {
            t.hits += gw_body_scan_shape_stats().hits > before.hits;
            bool ok;
            int64_t got = scan(s, &ok);
            if (ok == s->bigint)
                fail_msg("variant %u: scan's way %s, bigint %d: %s", i, ok ? "counted" : "failed",
                         s->bigint, v);
            if (ok && got != vwant)
                fail_msg("variant %u: scan %lld, tree %lld: %s", i, (long long)got,
                         (long long)vwant, v);
        }
        free(v);
    }
    gw_body_scan_free(s);
    free(g.p);
    print_message("%zu bodies counted by the scan, %zu left to the tree, %zu refused, %zu shape "
                  "hits\n",
                  t.counted, t.tree, t.refused, t.hits);
    return t;
}

static void test_responses_differential(void **state)
{
    (void)state;
    tally_t t = differ(resp_body, rl_responses_prompt_tokens, resp_scan, 4000, 0x9e3779b97f4a7c15u);
    /* most bodies go the scan's way; big integers the tree's; duplicate
     * keys are refused by both */
    assert_true(t.counted > 2500);
    assert_true(t.tree > 50);
    assert_true(t.refused > 100);
    assert_true(t.hits > 500);
}

static void test_chat_tools_differential(void **state)
{
    (void)state;
    tally_t t = differ(chat_body, rl_body_prompt_tokens, chat_scan, 4000, 0x2545f4914f6cdd1du);
    assert_true(t.counted > 2500);
    assert_true(t.tree > 50);
    assert_true(t.hits > 500);
}

/* Known values: what each rewrite jansson makes costs, by hand. */
static void test_dump_tokens_known(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        int64_t ascii, other; /* of json_dumps' compact text */
    } cases[] = {
        {"[ 1 , 2 ]", 5, 0},           /* [1,2] */
        {"{\"a\" : \"\\/\"}", 9, 0},   /* {"a":"/"} */
        {"\"\\u00e9\"", 2, 1},         /* "é" */
        {"\"\\ud83d\\ude00x\"", 3, 1}, /* "😀x" */
        {"\"\\u0001\"", 8, 0},         /* "\u0001" */
        {"\"\\n\\t\"", 6, 0},          /* "\n\t" */
        {"[-0, 0.1, 1e5]", 32, 0},     /* [0,0.10000000000000001,100000.0] */
        {"{\"k\":[true,false,null]}", 23, 0},
        {"\"\xe4\xb8\xad\xe6\x96\x87\"", 2, 2},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int64_t got;
        assert_int_equal(rl_json_dump_tokens(cases[i].json, strlen(cases[i].json), &got), 0);
        int64_t want = (cases[i].ascii + 3) / 4 + cases[i].other;
        if (got != want)
            fail_msg("%s: %lld, want %lld", cases[i].json, (long long)got, (long long)want);
        /* and jansson agrees */
        json_t *v = json_loadb(cases[i].json, strlen(cases[i].json),
                               JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        assert_non_null(v);
        char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        assert_int_equal(rl_estimate_text_tokens(t, strlen(t)), want);
        free(t);
        json_decref(v);
    }
    int64_t got;
    assert_int_equal(rl_json_dump_tokens("[1", 2, &got), -1);
    assert_int_equal(rl_json_dump_tokens("1 2", 3, &got), -1);
    assert_int_equal(rl_json_dump_tokens(NULL, 0, &got), -1);
}

/* Responses bodies by hand, the scan's estimate against the tree's: the
 * cases the generator reaches rarely. */
static void test_responses_cases(void **state)
{
    (void)state;
    static const char *bodies[] = {
        /* a part's type read as strcmp reads it: up to a NUL */
        "{\"input\":[{\"content\":[{\"type\":\"input_image\\u0000x\",\"u\":1}]}]}",
        "{\"input\":[{\"content\":[{\"type\":\"input_imagex\",\"u\":1}]}]}",
        "{\"input\":[{\"content\":[{\"type\":\"input_image\"}]}]}",
        /* content of any kind stops the item's JSON from counting */
        "{\"input\":[{\"content\":null,\"output\":\"a long output text\"}]}",
        "{\"input\":[{\"content\":{\"text\":\"x\"}}]}",
        "{\"input\":[{\"output\":7,\"call_id\":\"c\"}]}",
        /* items and parts that are not objects */
        "{\"input\":[\"abc\",[1,2],null,{\"content\":[\"p\",[\"q\"],{\"text\":5}]}]}",
        /* nested items: only the top level's content counts */
        "{\"input\":[{\"x\":{\"content\":\"deep\",\"output\":\"o\"}}]}",
        "{\"instructions\":\"caf\\u00e9\",\"input\":\"\\ud83d\\ude00 x\",\"tools\":null}",
        "{\"instructions\":5,\"input\":{\"content\":\"x\"},\"tools\":\"t\\/\"}",
        "{\"input\":[],\"tools\":-0}",
        "{\"input\":[],\"tools\":1.0}",
    };
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        json_t *j = intake(bodies[i], strlen(bodies[i]));
        assert_non_null(j);
        int64_t want = rl_responses_prompt_tokens(j);
        json_decref(j);
        assert_int_equal(gw_body_scan(s, bodies[i], strlen(bodies[i]), scan_ways[0]), GW_SCAN_OK);
        bool ok;
        int64_t got = resp_scan(s, &ok);
        assert_true(ok);
        if (got != want)
            fail_msg("%s: scan %lld, tree %lld", bodies[i], (long long)got, (long long)want);
    }
    gw_body_scan_free(s);
}

/* The chat view without its spans (a sl_chat_t not from the scanner):
 * the tree decides. */
static void test_chat_no_span(void **state)
{
    (void)state;
    sl_chat_msg_t m = {.kind = SL_J_OBJECT, .tool_calls_kind = SL_J_ARRAY};
    sl_chat_t c = {.messages_kind = SL_J_ARRAY, .msgs = &m, .nmsgs = 1};
    int64_t n;
    assert_int_equal(rl_chat_prompt_tokens_json(&c, &n), -1);
    m.tool_calls = (sl_text_t){"[]", 2};
    assert_int_equal(rl_chat_prompt_tokens_json(&c, &n), 0);
    assert_int_equal(n, 3 + 4 + 1);
    c.bigint = true;
    assert_int_equal(rl_chat_prompt_tokens_json(&c, &n), -1);
}

/* ---- the thread's kept counts of tools arrays ------------------------------- */

/* The estimate of a chat request with no messages and tools t[0..n): with
 * the thread's kept counts (kept) or walked (the reference). *rc the call's. */
static int64_t chat_tools(const char *t, size_t n, bool kept, int *rc)
{
    sl_chat_t c = {.messages_kind = SL_J_ARRAY, .tools_kind = SL_J_ARRAY, .tools = {t, n}};
    int64_t v = -1;
    rl_tools_counts_enable(kept);
    *rc = rl_chat_prompt_tokens_json(&c, &v);
    rl_tools_counts_enable(true);
    return *rc == 0 ? v : -1;
}

/* t counted both ways: the same answer (a count or a refusal). */
static int64_t same(const char *t, size_t n)
{
    int rc_walk, rc_kept;
    int64_t want = chat_tools(t, n, false, &rc_walk);
    int64_t got = chat_tools(t, n, true, &rc_kept);
    if (rc_walk != rc_kept || got != want)
        fail_msg("tools of %zu bytes: kept %d/%lld, walked %d/%lld: %.*s", n, rc_kept,
                 (long long)got, rc_walk, (long long)want, (int)(n > 300 ? 300 : n), t);
    return want;
}

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Get the "
    "weather at a place.\",\"parameters\":{\"type\":\"object\",\"properties\":{\"location\":{"
    "\"type\":\"string\"},\"n\":{\"type\":\"number\",\"minimum\":0.1}},\"required\":["
    "\"location\"]}}}]";

/* TOOLS with the bytes at the first "0.1" made r (three bytes). */
static char *tools_with(const char *r)
{
    char *t = strdup(TOOLS);
    assert_non_null(t);
    memcpy(strstr(t, "0.1"), r, 3);
    return t;
}

/* The same array again, and arrays one byte apart (at the start, inside,
 * at the end) or of the same length with other bytes: each the walk's
 * count, and the repeats counted from the kept one. */
static void test_tools_counts_fixed(void **state)
{
    (void)state;
    rl_tools_counts_clear();
    size_t n = strlen(TOOLS);
    int64_t base = same(TOOLS, n);
    uint64_t h0 = rl_tools_count_hits();
    for (int i = 0; i < 10; i++)
        assert_int_equal(same(TOOLS, n), base);
    assert_int_equal(rl_tools_count_hits(), h0 + 10);

    /* one byte apart, the same length: 0.1 is "0.10000000000000001", 0.5
     * "0.5", 100 "100" */
    char *b = tools_with("0.5"), *c = tools_with("100");
    int64_t vb = same(b, n), vc = same(c, n);
    assert_true(vb != base && vc != base); /* else this could not fail */
    assert_int_equal(same(TOOLS, n), base);
    assert_int_equal(same(b, n), vb);
    assert_int_equal(same(c, n), vc);

    /* the byte apart first, then last: "[0.1]" against "[0.5]", then an
     * array whose last byte makes it no JSON (refused both ways) */
    /* [0.10000000000000001,"x"]: 25 bytes, 7 tokens; [0.5,"x"]: 9, 3 */
    assert_int_equal(same("[0.1,\"x\"]", 9), same("[0.5,\"x\"]", 9) + 4);
    assert_int_equal(same("[0.5,\"x\"]", 9), 3 + 3);
    char *e = strdup(TOOLS);
    assert_non_null(e);
    e[n - 1] = '}';
    assert_int_equal(same(TOOLS, n), base); /* kept now, whatever was pushed out */
    int rc;
    assert_int_equal(chat_tools(e, n, true, &rc), -1);
    assert_int_equal(rc, -1);
    assert_int_equal(same(e, n), -1);
    assert_int_equal(same(TOOLS, n), base);
    /* its prefix, one byte short: no JSON either */
    assert_int_equal(same(TOOLS, n - 1), -1);
    /* a blank after it: longer, the same count */
    char *sp = malloc(n + 2);
    assert_non_null(sp);
    memcpy(sp, TOOLS, n);
    memcpy(sp + n, " ", 2);
    assert_int_equal(same(sp, n + 1), base);

    /* the Responses API's tools: the same array (b, counted again for
     * chat: five arrays since pushed it out), the same count */
    assert_int_equal(same(b, n), vb);
    rl_resp_in_t in = {.tools_kind = SL_J_ARRAY, .tools_json = {b, n}};
    int64_t r0, r1;
    uint64_t h1 = rl_tools_count_hits();
    assert_int_equal(rl_responses_prompt_tokens_in(&in, &r0), 0);
    rl_tools_counts_enable(false);
    assert_int_equal(rl_responses_prompt_tokens_in(&in, &r1), 0);
    rl_tools_counts_enable(true);
    assert_int_equal(r0, r1);
    assert_int_equal(rl_tools_count_hits(), h1 + 1);

    /* longer than a kept text: walked every time, never kept */
    size_t bn = SL_JSHAPE_MAX_TEXT + 100;
    char *big = malloc(bn + 1);
    assert_non_null(big);
    memset(big, ' ', bn);
    memcpy(big, TOOLS, n);
    big[bn] = '\0';
    uint64_t h2 = rl_tools_count_hits();
    assert_int_equal(same(big, bn), base);
    assert_int_equal(same(big, bn), base);
    assert_int_equal(rl_tools_count_hits(), h2);
    free(big);
    free(sp);
    free(e);
    free(b);
    free(c);
    rl_tools_counts_clear();
}

/* Three arrays in turn fit the slots: after each is walked once, every
 * later one is a hit. */
static void test_tools_counts_hits(void **state)
{
    (void)state;
    rl_tools_counts_clear();
    char *t[3] = {tools_with("0.5"), tools_with("100"), tools_with("1e5")};
    size_t n = strlen(TOOLS);
    for (int i = 0; i < 300; i++)
        same(t[i % 3], n);
    assert_int_equal(rl_tools_count_hits(), 300 - 3);
    for (int i = 0; i < 3; i++)
        free(t[i]);
    rl_tools_counts_clear();
}

/* Many distinct arrays, far more than the slots (evictions all the way):
 * 625 of the same length from TOOLS with four numbers each one of five
 * three-byte tokens of different counts, and generated arrays of every
 * kind, drawn at random and in runs; each time the walk's count. */
static void test_tools_counts_many(void **state)
{
    (void)state;
    static const char *nums[] = {"0.1", "0.5", "100", "1e5", "-17"};
    rl_tools_counts_clear();
    gen_t g = {.rnd = 0x5851f42d4c957f2du};
    enum { NGEN = 60 };
    char *gen[NGEN];
    size_t glen[NGEN];
    for (int i = 0; i < NGEN; i++) {
        g.n = 0;
        tools(&g);
        gen[i] = strdup(g.p);
        assert_non_null(gen[i]);
        glen[i] = g.n;
    }
    char quad[512];
    int k = snprintf(quad, sizeof(quad), "[{\"a\":%s,\"b\":[%s,{\"c\":%s}],\"d\":%s}]", "0.1",
                     "0.1", "0.1", "0.1");
    assert_true(k > 0 && (size_t)k < sizeof(quad));
    size_t counted = 0;
    for (int i = 0; i < 20000; i++) {
        unsigned pick = rnd(&g, 4);
        if (pick == 0) { /* a generated array */
            unsigned j =
                rnd(&g, 8) ? rnd(&g, 6) : rnd(&g, NGEN); /* a few often, all now and then */
            counted += same(gen[j], glen[j]) >= 0;
        } else { /* one of the 625 of one length */
            char t[512];
            snprintf(t, sizeof(t), "[{\"a\":%s,\"b\":[%s,{\"c\":%s}],\"d\":%s}]", nums[rnd(&g, 5)],
                     nums[pick == 1 ? 0 : rnd(&g, 5)], nums[rnd(&g, 5)], nums[rnd(&g, 5)]);
            assert_int_equal(strlen(t), (size_t)k);
            counted += same(t, (size_t)k) >= 0;
        }
    }
    print_message("%zu of 20000 counted, %llu from a kept count\n", counted,
                  (unsigned long long)rl_tools_count_hits());
    assert_true(counted > 15000);
    assert_true(rl_tools_count_hits() > 300); /* and evictions: far more misses */
    for (int i = 0; i < NGEN; i++)
        free(gen[i]);
    free(g.p);
    rl_tools_counts_clear();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dump_tokens_known),
        cmocka_unit_test(test_chat_no_span),
        cmocka_unit_test(test_responses_cases),
        cmocka_unit_test(test_responses_differential),
        cmocka_unit_test(test_chat_tools_differential),
        cmocka_unit_test(test_tools_counts_fixed),
        cmocka_unit_test(test_tools_counts_hits),
        cmocka_unit_test(test_tools_counts_many),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
