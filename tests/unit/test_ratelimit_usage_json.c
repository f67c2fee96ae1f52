/*
 * rl_usage_from_json (the answer's usage read without a tree) against
 * rl_usage_from_body over jansson's tree of the same bytes (json_loadb
 * flags 0, as the gateway parses an answer): the same result and the same
 * figures for fixed odd answers and for generated ones (usage members in
 * any order, duplicated, negative, huge, real, strings, null; "usage"
 * nested elsewhere, twice at the top, not an object; escapes and UTF-8
 * jansson refuses; deep nesting; trailing bytes; cut answers). A chat
 * chunk's read (rl_chunk_read_json) likewise against the tree's, and read
 * from the thread's kept shapes against the full read, over generated
 * streams.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ratelimit/ratelimit.h"

static int nfound, nnone;

/* Both reads of data[0..len): equal. */
static void same(const char *data, size_t len)
{
    rl_usage_t a, b;
    memset(&a, 0, sizeof(a));
    json_t *j = json_loadb(data, len, 0, NULL);
    int ra = j ? rl_usage_from_body(j, &a) : -1;
    json_decref(j);
    int rb = rl_usage_from_json(data, len, &b);
    if (ra != rb || (ra == 0 && (a.prompt_tokens != b.prompt_tokens ||
                                 a.completion_tokens != b.completion_tokens ||
                                 a.total_tokens != b.total_tokens)))
        fail_msg("tree %d (%lld %lld %lld) vs bytes %d (%lld %lld %lld) on: %.*s", ra,
                 (long long)a.prompt_tokens, (long long)a.completion_tokens,
                 (long long)a.total_tokens, rb, (long long)b.prompt_tokens,
                 (long long)b.completion_tokens, (long long)b.total_tokens,
                 (int)(len > 300 ? 300 : len), data);
    if (ra == 0)
        nfound++;
    else
        nnone++;
}

static void same_s(const char *s)
{
    same(s, strlen(s));
}

static void test_usage_json_fixed(void **state)
{
    (void)state;
    const char *cases[] = {
        "{\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":30,"
        "\"total_tokens\":42}}",
        "{\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}",
        "{\"usage\":{\"input_tokens\":5,\"output_tokens\":6,\"total_tokens\":20}}",
        "{\"usage\":{\"prompt_tokens\":null,\"input_tokens\":5,\"output_tokens\":6}}",
        "{\"usage\":{\"input_tokens\":5,\"total_tokens\":9}}",
        "{\"usage\":{\"prompt_tokens\":-5,\"completion_tokens\":-6}}",
        "{\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6.0}}",
        "{\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":\"6\",\"total_tokens\":3}}",
        "{\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"prompt_tokens\":7}}",
        "{\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2},\"usage\":null}",
        "{\"usage\":null,\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}",
        "{\"usage\":{\"completion_tokens\":9223372036854775807,\"prompt_tokens\":1}}",
        "{\"usage\":{\"completion_tokens\":9223372036854775808}}",
        "{\"usage\":{\"completion_tokens\":-9223372036854775808}}",
        "{\"usage\":{\"completion_tokens\":1},\"x\":-9223372036854775808}",
        "{\"usage\":{\"completion_tokens\":1},\"x\":1e999}",
        "{\"usage\":{\"completion_tokens\":1},\"x\":1e-999}",
        "{\"usage\":{\"completion_tokens\":-0}}",
        "{\"choices\":[{\"usage\":{\"completion_tokens\":4}}]}",
        "{\"a\":{\"usage\":{\"completion_tokens\":4}},\"usage\":{\"total_tokens\":3}}",
        "{\"usage\":{\"x\":{\"completion_tokens\":4},\"total_tokens\":3}}",
        "{\"usage\":{\"completion_tokens\":[4]}}",
        "[{\"usage\":{\"completion_tokens\":4}}]",
        "{\"usage\":{\"completion_tokens\":4}} ",
        "{\"usage\":{\"completion_tokens\":4}} x",
        "{\"usage\":{\"completion_tokens\":4}}{}",
        "{\"usage\":{\"completion_tokens\":4}",
        "{\"usage\":{\"completion_tokens\":4}}\n\r\t",
        " \n{\"usage\":{\"completion_tokens\":4}}",
        "{\"c\":\"a\\u0000b\",\"usage\":{\"completion_tokens\":4}}",
        "{\"c\":\"\\ud800\",\"usage\":{\"completion_tokens\":4}}",
        "{\"c\":\"\\udc00\",\"usage\":{\"completion_tokens\":4}}",
        "{\"c\":\"\\ud800\\u0041\",\"usage\":{\"completion_tokens\":4}}",
        "{\"c\":\"\\ud83d\\ude00\",\"usage\":{\"completion_tokens\":4}}",
        "{\"c\":\"\\\\ud800\",\"usage\":{\"completion_tokens\":4}}",
        "{\"c\":\"\\u00e9\",\"usage\":{\"completion_tokens\":4}}",
        "{\"c\":\"\xc3\xa9\",\"usage\":{\"completion_tokens\":4}}",
        "{\"c\":\"\xc0\xaf\",\"usage\":{\"completion_tokens\":4}}",
        "{\"c\":\"\xed\xa0\x80\",\"usage\":{\"completion_tokens\":4}}",
        "{\"c\":\"\xf4\x90\x80\x80\",\"usage\":{\"completion_tokens\":4}}",
        "{\"c\":\"\x01\",\"usage\":{\"completion_tokens\":4}}",
        "{\"c\":\"\x7f\",\"usage\":{\"completion_tokens\":4}}",
        "{\"c\":01,\"usage\":{\"completion_tokens\":4}}",
        "{\"usage\":{\"completion_tokens\":4},}",
        "{\"us\\u0061ge\":{\"completion_tokens\":4}}",
        "{\"usage\":{\"completion_\\u0074okens\":4}}",
        "{\"usage\":{\"completion_tokens\":\f4}}",
        "{\"usage\":{\"completion_tokens\":4}}\v",
        "{\"usage\":{}}",
        "{}",
        "",
        "   ",
        "null",
        "42",
        "not json",
        "<html>502</html>",
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        same_s(cases[i]);
    /* a sum beyond int64 saturates in both reads (it overflowed: UBSan) */
    rl_usage_t u;
    static const char huge[] = "{\"usage\":{\"prompt_tokens\":2,"
                               "\"completion_tokens\":9223372036854775807}}";
    assert_int_equal(rl_usage_from_json(huge, sizeof(huge) - 1, &u), 0);
    assert_int_equal(u.total_tokens, INT64_MAX);
    /* a NUL byte inside the bytes (jansson stops at it as bad input) */
    static const char nul[] = "{\"usage\":{\"completion_tokens\":4}}\0";
    same(nul, sizeof(nul) - 1);
    same(nul, sizeof(nul));
}

static void test_usage_json_deep(void **state)
{
    (void)state;
    /* nesting past jansson's limit (2048) and past this read's (1024) */
    size_t depths[] = {1000, 1030, 2047, 2048, 2049, 3000};
    for (size_t d = 0; d < sizeof(depths) / sizeof(depths[0]); d++) {
        size_t n = depths[d];
        char *b = malloc(2 * n + 64);
        assert_non_null(b);
        size_t o = (size_t)sprintf(b, "{\"usage\":{\"completion_tokens\":4},\"x\":");
        for (size_t i = 1; i < n - 1; i++)
            b[o++] = '[';
        for (size_t i = 1; i < n - 1; i++)
            b[o++] = ']';
        b[o++] = '}';
        same(b, o);
        free(b);
    }
}

/* ---- generated answers ---------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static unsigned rnd(unsigned n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)(rng % n);
}

typedef struct {
    char b[4096];
    size_t n;
} buf_t;

/* Appends s to the cap bytes at b (n used) when it fits, a byte kept for a
 * terminator; else leaves them as they are. */
static void append(char *b, size_t cap, size_t *n, const char *s)
{
    size_t k = strlen(s);
    if (*n + k < cap) {
        memcpy(b + *n, s, k);
        *n += k;
    }
}

static void put(buf_t *b, const char *s)
{
    append(b->b, sizeof(b->b), &b->n, s);
}

static const char *ws(void)
{
    static const char *w[] = {"", "", "", " ", "\n  ", "\t"};
    return w[rnd(6)];
}

static void value(buf_t *b, int depth);

static void gen_usage_obj(buf_t *b)
{
    static const char *keys[] = {"prompt_tokens",        "completion_tokens", "total_tokens",
                                 "input_tokens",         "output_tokens",     "other",
                                 "prompt_tokens_details"};
    static const char *vals[] = {"0",
                                 "7",
                                 "12",
                                 "-3",
                                 "-0",
                                 "1.5",
                                 "2.0",
                                 "1e2",
                                 "\"9\"",
                                 "null",
                                 "true",
                                 "{}",
                                 "[]",
                                 "42",
                                 "9223372036854775807",
                                 "-9223372036854775807",
                                 "100000"};
    put(b, "{");
    unsigned n = rnd(7);
    for (unsigned i = 0; i < n; i++) {
        if (i)
            put(b, ",");
        put(b, ws());
        put(b, "\"");
        put(b, keys[rnd(7)]);
        put(b, "\":");
        put(b, ws());
        if (rnd(8) == 0)
            value(b, 3);
        else
            put(b, vals[rnd(sizeof(vals) / sizeof(vals[0]))]);
    }
    put(b, "}");
}

static void gen_string(buf_t *b)
{
    static const char *s[] = {"\"hi\"",
                              "\"a\\nb\"",
                              "\"\\u00e9\"",
                              "\"\xc3\xa9t\xc3\xa9\"",
                              "\"\\ud83d\\ude00\"",
                              "\"\\\"q\\\"\"",
                              "\"usage\"",
                              "\"\\u0000\"",
                              "\"\\ud800\"",
                              "\"\xc0\xaf\"",
                              "\"\xe4\xb8\xad\"",
                              "\"\\\\u\""};
    unsigned k = rnd(40);
    put(b, s[k < 30 ? k % 7 : k - 30 < 12 ? k - 30 : 0]);
}

static void value(buf_t *b, int depth)
{
    unsigned k = depth > 3 ? rnd(4) : rnd(7);
    switch (k) {
    case 0:
        gen_string(b);
        break;
    case 1:
        put(b, rnd(2) ? "3" : "-1.25");
        break;
    case 2:
        put(b, rnd(2) ? "null" : "false");
        break;
    case 3:
        put(b, "[]");
        break;
    case 4:
    case 5: {
        put(b, "{");
        unsigned n = rnd(4);
        for (unsigned i = 0; i < n; i++) {
            if (i)
                put(b, ",");
            put(b, rnd(3) == 0 ? "\"usage\":" : "\"k\":");
            if (rnd(3) == 0)
                gen_usage_obj(b);
            else
                value(b, depth + 1);
        }
        put(b, "}");
        break;
    }
    default:
        put(b, "[");
        value(b, depth + 1);
        put(b, ",");
        value(b, depth + 1);
        put(b, "]");
    }
}

static void gen_answer(buf_t *b)
{
    b->n = 0;
    put(b, ws());
    put(b, "{");
    unsigned n = 1 + rnd(6);
    for (unsigned i = 0; i < n; i++) {
        if (i)
            put(b, ",");
        put(b, ws());
        unsigned k = rnd(10);
        if (k < 5) {
            put(b, "\"usage\":");
            put(b, ws());
            if (rnd(6))
                gen_usage_obj(b);
            else
                value(b, 1);
        } else {
            put(b, k == 5 ? "\"choices\":" : k == 6 ? "\"id\":" : "\"object\":");
            value(b, 1);
        }
    }
    put(b, ws());
    put(b, "}");
    switch (rnd(16)) {
    case 0:
        put(b, " x");
        break;
    case 1:
        put(b, "{}");
        break;
    case 2:
        if (b->n > 2)
            b->n = rnd((unsigned)b->n); /* cut */
        break;
    default:
        put(b, ws());
    }
}

static void test_usage_json_generated(void **state)
{
    (void)state;
    nfound = nnone = 0;
    buf_t b;
    for (int i = 0; i < 50000; i++) {
        gen_answer(&b);
        same(b.b, b.n);
    }
    /* the generator reaches both outcomes, many times */
    assert_true(nfound > 5000);
    assert_true(nnone > 5000);
}

/* ---- a chat stream's chunk: rl_chunk_read_json vs the tree ------------------ */

/* The tree's reading (rl_chunk_read_tree: the stream accounting's path when
 * the read without a tree asks for it, and what it was before). */
static int ref_chunk(const char *d, size_t n, rl_chunk_read_t *r)
{
    memset(r, 0, sizeof(*r));
    json_t *j = json_loadb(d, n, 0, NULL);
    if (!j)
        return -1;
    rl_chunk_read_tree(j, r);
    json_decref(j);
    return 0;
}

static int nchunk_fast, nchunk_slow;

static void same_chunk(const char *d, size_t n)
{
    rl_chunk_read_t a, b;
    int ra = ref_chunk(d, n, &a);
    int rb = rl_chunk_read_json(d, n, &b);
    if (rb != 0) {
        nchunk_slow++;
        return; /* the tree reads it */
    }
    nchunk_fast++;
    if (ra != 0 || a.ascii != b.ascii || a.other != b.other || a.got_usage != b.got_usage ||
        a.choices_empty != b.choices_empty ||
        (a.got_usage && (a.usage.prompt_tokens != b.usage.prompt_tokens ||
                         a.usage.completion_tokens != b.usage.completion_tokens ||
                         a.usage.total_tokens != b.usage.total_tokens)))
        fail_msg("tree %d (%lld %lld u%d %lld e%d) vs bytes (%lld %lld u%d %lld e%d) on: %.*s", ra,
                 (long long)a.ascii, (long long)a.other, a.got_usage,
                 (long long)a.usage.total_tokens, a.choices_empty, (long long)b.ascii,
                 (long long)b.other, b.got_usage, (long long)b.usage.total_tokens, b.choices_empty,
                 (int)(n > 400 ? 400 : n), d);
}

static void gen_text_value(buf_t *b)
{
    if (rnd(5) == 0)
        value(b, 3);
    else
        gen_string(b);
}

static void gen_dm(buf_t *b)
{
    static const char *keys[] = {
        "\"content\":", "\"reasoning_content\":", "\"role\":", "\"tool_calls\":"};
    put(b, "{");
    unsigned n = rnd(4);
    for (unsigned i = 0; i < n; i++) {
        if (i)
            put(b, ",");
        unsigned k = rnd(4);
        put(b, keys[k]);
        if (k == 3 && rnd(5)) {
            put(b, "[");
            unsigned m = rnd(3);
            for (unsigned t = 0; t < m; t++) {
                if (t)
                    put(b, ",");
                if (rnd(6) == 0) {
                    value(b, 4);
                    continue;
                }
                put(b, "{\"index\":0,\"function\":");
                if (rnd(6) == 0) {
                    value(b, 4);
                } else {
                    put(b, "{\"name\":");
                    gen_text_value(b);
                    put(b, ",\"arguments\":");
                    gen_text_value(b);
                    if (rnd(4) == 0) {
                        put(b, ",\"name\":");
                        gen_text_value(b);
                    }
                    put(b, "}");
                }
                if (rnd(5) == 0)
                    put(b, ",\"function\":{\"arguments\":\"{}\"}");
                put(b, "}");
            }
            put(b, "]");
        } else {
            gen_text_value(b);
        }
    }
    put(b, "}");
}

static void gen_choices(buf_t *b)
{
    put(b, "[");
    unsigned n = rnd(3);
    for (unsigned i = 0; i < n; i++) {
        if (i)
            put(b, ",");
        if (rnd(8) == 0) {
            value(b, 3);
            continue;
        }
        put(b, "{\"index\":0");
        unsigned m = 1 + rnd(3);
        for (unsigned k = 0; k < m; k++) {
            unsigned w = rnd(6);
            put(b, w < 3    ? ",\"delta\":"
                   : w == 3 ? ",\"message\":"
                   : w == 4 ? ",\"text\":"
                            : ",\"x\":");
            if (w < 4 && rnd(6))
                gen_dm(b);
            else
                gen_text_value(b);
        }
        put(b, "}");
    }
    put(b, "]");
}

static void gen_chunk(buf_t *b)
{
    b->n = 0;
    put(b, "{\"id\":\"c\"");
    unsigned n = 1 + rnd(4);
    for (unsigned i = 0; i < n; i++) {
        unsigned k = rnd(8);
        if (k < 4) {
            put(b, ",\"choices\":");
            if (rnd(8) == 0)
                value(b, 2);
            else
                gen_choices(b);
        } else if (k < 6) {
            put(b, ",\"usage\":");
            if (rnd(5))
                gen_usage_obj(b);
            else
                value(b, 2);
        } else {
            put(b, ",\"object\":");
            value(b, 2);
        }
    }
    put(b, "}");
    if (rnd(20) == 0)
        put(b, " x");
    else if (rnd(20) == 0 && b->n > 2)
        b->n = rnd((unsigned)b->n);
}

static void test_chunk_json_generated(void **state)
{
    (void)state;
    static const char *fixed[] = {
        "{\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}",
        "{\"choices\":[{\"delta\":{\"content\":\"h\xc3\xa9llo\"}}]}",
        "{\"choices\":[{\"delta\":null,\"message\":{\"content\":\"x\"}}]}",
        "{\"choices\":[{\"message\":{\"content\":\"x\"},\"text\":\"yy\"}]}",
        "{\"choices\":[{\"delta\":{\"content\":\"a\",\"content\":\"bcd\"}}],\"choices\":[{\"d"
        "elta\":{\"content\":\"zz\"}}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":"
        "\"{\\\"a\\\":1}\"}},7,{\"function\":[]}]}}]}",
        "{\"choices\":[{\"delta\":{\"content\":\"\\ud83d\\ude00\"}}]}",
        "{\"choices\":[{\"delta\":{\"content\":\"\\u00e9\\n\"}}]}",
        "{\"choices\":[1,null,{}]}",
        "{\"choices\":{}}",
    };
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        same_chunk(fixed[i], strlen(fixed[i]));
    buf_t b;
    for (int i = 0; i < 50000; i++) {
        gen_chunk(&b);
        same_chunk(b.b, b.n);
    }
    /* most go without a tree; some (odd bytes) to it */
    assert_true(nchunk_fast > 25000);
    assert_true(nchunk_slow > 500);
}

/* ---- a chat stream's chunks read from kept shapes ---------------------------
 *
 * Generated streams (several servers' styles interleaved, each stream its
 * own id and created) whose chunks vary their text (ASCII, raw UTF-8,
 * escapes, surrogate pairs, lone surrogates, \u0000, invalid UTF-8, a raw
 * control byte), carry a usage now and then, and change shape (whitespace,
 * keys, types, duplicates). Each chunk goes through rl_stream_feed twice:
 * shapes on (read from a kept shape when one fits) and off (the full read:
 * yajl, else the tree); the actions, the rewritten bytes and the stream's
 * estimate and usage must be the same, as must each chunk's read (either
 * way: rl_chunk_read_json, or the tree when it asks for it). The shape path
 * must have read the chunks with escapes, pairs and UTF-8 text many times. */

enum { TX_ESC = 1, TX_PAIR = 2, TX_UTF8 = 4, TX_BAD = 8 };

typedef struct {
    char b[2048];
    size_t n;
    unsigned tags;
} sbuf_t;

static void sput(sbuf_t *b, const char *s)
{
    append(b->b, sizeof(b->b), &b->n, s);
}

/* A string's interior: pieces of ASCII words, UTF-8, escapes and odd ones. */
static void gen_text(sbuf_t *b)
{
    static const char *words[] = {"tok ", "Hello", " world", "", "a", ".", "1234", "x y z "};
    static const struct {
        const char *s;
        unsigned tag;
    } odd[] = {
        {"h\xc3\xa9llo", TX_UTF8},
        {"\xe4\xb8\xad\xe6\x96\x87", TX_UTF8},
        {"\xf0\x9f\x98\x80", TX_UTF8},
        {"\\n", TX_ESC},
        {"\\\"", TX_ESC},
        {"\\\\", TX_ESC},
        {"\\/", TX_ESC},
        {"\\t\\r\\b\\f", TX_ESC},
        {"\\u00e9", TX_ESC},
        {"\\u0041", TX_ESC},
        {"\\u007f", TX_ESC},
        {"\\u0080", TX_ESC},
        {"\\u4E2d", TX_ESC},
        {"\\u0001", TX_ESC},
        {"\\\\u0000", TX_ESC},
        {"\\\\ud800", TX_ESC},
        {"\\ud83d\\ude00", TX_PAIR},
        {"\\uD83D\\uDE00", TX_PAIR},
        {"\\udbff\\udfff", TX_PAIR},
        {"\\ud800", TX_BAD},
        {"\\udc00", TX_BAD},
        {"\\ud800\\u0041", TX_BAD},
        {"\\u0000", TX_BAD},
        {"\\x", TX_BAD},
        {"\\u12", TX_BAD},
        {"\xc0\xaf", TX_BAD},
        {"\xed\xa0\x80", TX_BAD},
        {"\xff", TX_BAD},
        {"\xc3", TX_BAD},
        {"\xf4\x90\x80\x80", TX_BAD},
        {"\x01", TX_BAD},
        {"\x7f", 0},
        {"\xef\xbf\xbf", TX_UTF8},
    };
    unsigned n = rnd(4);
    for (unsigned i = 0; i < n; i++) {
        if (rnd(3)) {
            sput(b, words[rnd(sizeof(words) / sizeof(words[0]))]);
        } else {
            unsigned k = rnd(sizeof(odd) / sizeof(odd[0]));
            sput(b, odd[k].s);
            b->tags |= odd[k].tag;
        }
    }
}

/* A server's way of writing its chunks. */
typedef struct {
    const char *sep;   /* between members: "," or ", " */
    const char *colon; /* ":" or ": " */
    bool fp, usage_null, logprobs;
} style_t;

static const style_t styles[] = {
    {",", ":", false, false, true},
    {",", ":", true, true, true},
    {", ", ": ", false, false, false},
    {",", ":", false, true, false},
};

/* "key":value with the style's colon. */
static void skv(sbuf_t *b, const style_t *st, const char *k, const char *v)
{
    sput(b, "\"");
    sput(b, k);
    sput(b, "\"");
    sput(b, st->colon);
    sput(b, v);
}

/* "key":"TEXT" */
static void stext(sbuf_t *b, const style_t *st, const char *k)
{
    skv(b, st, k, "\"");
    gen_text(b);
    sput(b, "\"");
}

static void gen_choice(sbuf_t *b, const style_t *st, unsigned kind, unsigned index)
{
    char idx[16];
    snprintf(idx, sizeof(idx), "%u", index);
    sput(b, "{");
    skv(b, st, "index", idx);
    sput(b, st->sep);
    switch (kind) {
    case 0: /* the role chunk */
        skv(b, st, "delta", "{");
        skv(b, st, "role", "\"assistant\"");
        sput(b, st->sep);
        stext(b, st, "content");
        sput(b, "}");
        break;
    case 1:
    case 2:
    case 3:
        skv(b, st, "delta", "{");
        stext(b, st, "content");
        sput(b, "}");
        break;
    case 4:
        skv(b, st, "delta", "{");
        stext(b, st, "reasoning_content");
        sput(b, "}");
        break;
    case 5: /* a tool call's start, then its arguments */
        skv(b, st, "delta",
            "{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\","
            "\"function\":{");
        stext(b, st, "name");
        sput(b, st->sep);
        stext(b, st, "arguments");
        sput(b, "}}]}");
        break;
    case 6:
        skv(b, st, "delta", "{\"tool_calls\":[{\"index\":0,\"function\":{");
        stext(b, st, "arguments");
        sput(b, "}}]}");
        break;
    case 7: /* legacy completions */
        stext(b, st, "text");
        break;
    case 8: /* the finish */
        skv(b, st, "delta", "{}");
        sput(b, st->sep);
        skv(b, st, "finish_reason", "\"stop\"");
        break;
    case 9: /* a duplicate: the last one counts */
        skv(b, st, "delta", "{");
        stext(b, st, "content");
        sput(b, st->sep);
        stext(b, st, "content");
        sput(b, "}");
        break;
    case 10: /* another type */
        skv(b, st, "delta", "{\"content\":null}");
        break;
    case 11: /* message, then a delta null */
        skv(b, st, "message", "{");
        stext(b, st, "content");
        sput(b, "}");
        sput(b, st->sep);
        skv(b, st, "delta", rnd(2) ? "null" : "{}");
        break;
    default: /* a tool call with an integer argument-ish and a nested object */
        skv(b, st, "delta", "{\"content\":\"\",\"x\":{\"y\":[1,-2,0,3.5,true]}}");
        break;
    }
    if (kind != 8) {
        sput(b, st->sep);
        skv(b, st, "finish_reason", "null");
    }
    if (st->logprobs) {
        sput(b, st->sep);
        skv(b, st, "logprobs", "null");
    }
    sput(b, "}");
}

/* One chunk of stream (id, created) in style st. */
static void gen_stream_chunk(sbuf_t *b, const style_t *st, unsigned id, long long created)
{
    char v[64];
    b->n = 0;
    b->tags = 0;
    sput(b, "{");
    snprintf(v, sizeof(v), "\"chatcmpl-%u\"", id);
    skv(b, st, "id", v);
    sput(b, st->sep);
    skv(b, st, "object", "\"chat.completion.chunk\"");
    sput(b, st->sep);
    snprintf(v, sizeof(v), "%lld", created);
    skv(b, st, "created", v);
    sput(b, st->sep);
    skv(b, st, "model", rnd(8) ? "\"m-1\"" : "\"m\\u002d1\"");
    if (st->fp) {
        sput(b, st->sep);
        skv(b, st, "system_fingerprint", "\"fp_44709d6fcb\"");
    }
    sput(b, st->sep);
    unsigned k = rnd(40);
    bool usage = k >= 36;
    if (k == 36 || k == 37) {
        skv(b, st, "choices", "[]");
    } else {
        skv(b, st, "choices", "[");
        gen_choice(b, st, usage ? 1 : k % 13, 0);
        if (rnd(16) == 0) {
            sput(b, ",");
            gen_choice(b, st, 1 + rnd(4), 1);
        }
        sput(b, "]");
    }
    if (usage) {
        snprintf(v, sizeof(v),
                 "{\"prompt_tokens\":%u,\"completion_tokens\":%u,\"total_tokens\":%u}", rnd(50),
                 rnd(300), rnd(400));
        sput(b, st->sep);
        skv(b, st, "usage", k == 39 ? "{\"prompt_tokens\":3}" : v);
    } else if (st->usage_null) {
        sput(b, st->sep);
        skv(b, st, "usage", "null");
    }
    sput(b, "}");
    if (rnd(64) == 0)
        sput(b, rnd(2) ? " " : "\n");
    if (rnd(200) == 0 && b->n > 2)
        b->n = rnd((unsigned)b->n); /* cut */
}

/* The read as rl_chunk_feed takes it: rl_chunk_read_json, else the tree
 * (-1: the tree does not load). */
static int eff_read(const char *d, size_t n, rl_chunk_read_t *r)
{
    if (rl_chunk_read_json(d, n, r) == 0)
        return 0;
    return ref_chunk(d, n, r);
}

static void same_read(const rl_chunk_read_t *a, const rl_chunk_read_t *b, int ra, int rb,
                      const char *d, size_t n)
{
    if (ra != rb ||
        (ra == 0 && (a->ascii != b->ascii || a->other != b->other || a->got_usage != b->got_usage ||
                     a->choices_empty != b->choices_empty ||
                     (a->got_usage && (a->usage.prompt_tokens != b->usage.prompt_tokens ||
                                       a->usage.completion_tokens != b->usage.completion_tokens ||
                                       a->usage.total_tokens != b->usage.total_tokens)))))
        fail_msg("shape %d (%lld %lld u%d e%d) vs full %d (%lld %lld u%d e%d) on: %.*s", ra,
                 (long long)a->ascii, (long long)a->other, a->got_usage, a->choices_empty, rb,
                 (long long)b->ascii, (long long)b->other, b->got_usage, b->choices_empty,
                 (int)(n > 600 ? 600 : n), d);
}

/* One chunk both ways: its read, and the two streams' feeds. */
static void both_ways(rl_stream_t *on, rl_stream_t *off, const char *d, size_t n)
{
    rl_chunk_read_t a, b;
    rl_chunk_shapes_enable(true);
    int ra = eff_read(d, n, &a);
    rl_chunk_shapes_enable(false);
    int rb = eff_read(d, n, &b);
    same_read(&a, &b, ra, rb, d, n);
    char *o1, *o2;
    size_t l1, l2;
    rl_chunk_shapes_enable(true);
    rl_chunk_action_t x1 = rl_stream_feed(on, d, n, &o1, &l1);
    rl_chunk_shapes_enable(false);
    rl_chunk_action_t x2 = rl_stream_feed(off, d, n, &o2, &l2);
    rl_chunk_shapes_enable(true);
    if (x1 != x2 || l1 != l2 || (l1 && memcmp(o1, o2, l1) != 0))
        fail_msg("shape action %d vs full %d on: %.*s", x1, x2, (int)(n > 600 ? 600 : n), d);
    free(o1);
    free(o2);
    assert_int_equal(rl_stream_estimate(on), rl_stream_estimate(off));
    rl_usage_t u1, u2;
    int r1 = rl_stream_usage(on, &u1), r2 = rl_stream_usage(off, &u2);
    assert_int_equal(r1, r2);
    if (r1 == 0) {
        assert_int_equal(u1.total_tokens, u2.total_tokens);
        assert_int_equal(u1.completion_tokens, u2.completion_tokens);
    }
}

static void test_chunk_shapes_streams(void **state)
{
    (void)state;
    rl_chunk_shapes_clear();
    rl_chunk_shapes_enable(true);
    enum { NS = 3 };
    struct {
        rl_stream_t *on, *off;
        const style_t *st;
        unsigned id, left;
        long long created;
    } sv[NS] = {{0}};
    unsigned next_id = 1;
    unsigned hits_tag[16] = {0}, nbad = 0, nchunks = 0;
    sbuf_t b;
    for (int i = 0; i < 60000; i++) {
        unsigned w = rnd(NS);
        if (sv[w].left == 0) { /* a new stream on this slot */
            rl_stream_free(sv[w].on);
            rl_stream_free(sv[w].off);
            bool strip = rnd(2);
            sv[w].on = rl_stream_new(strip);
            sv[w].off = rl_stream_new(strip);
            assert_non_null(sv[w].on);
            assert_non_null(sv[w].off);
            sv[w].st = &styles[rnd(sizeof(styles) / sizeof(styles[0]))];
            sv[w].id = next_id++;
            sv[w].created = 1700000000LL + rnd(1000000) * (rnd(50) ? 1 : 100000000000LL);
            sv[w].left = 1 + rnd(40);
        }
        sv[w].left--;
        gen_stream_chunk(&b, sv[w].st, sv[w].id, sv[w].created);
        uint64_t h0 = rl_chunk_shape_hits();
        both_ways(sv[w].on, sv[w].off, b.b, b.n);
        nchunks++;
        if (rl_chunk_shape_hits() > h0) {
            for (unsigned t = 0; t < 4; t++)
                if (b.tags >> t & 1)
                    hits_tag[t]++;
            if (b.tags & TX_BAD)
                nbad++;
        }
    }
    for (unsigned w = 0; w < NS; w++) {
        rl_stream_free(sv[w].on);
        rl_stream_free(sv[w].off);
    }
    /* the shape path read most chunks, those with escapes, pairs and UTF-8
     * among them, and some with text the rules refuse elsewhere (a "\\u"
     * escaped, a lone surrogate in no counted hole...) went the full way */
    uint64_t hits = rl_chunk_shape_hits();
    print_message("chunks %u, shape hits %llu (esc %u pair %u utf8 %u bad %u)\n", nchunks,
                  (unsigned long long)hits, hits_tag[0], hits_tag[1], hits_tag[2], nbad);
    assert_true(hits > nchunks / 2);
    assert_true(hits_tag[0] > 1000);
    assert_true(hits_tag[1] > 200);
    assert_true(hits_tag[2] > 1000);
    rl_chunk_shapes_clear();
}

/* Fixed sequences: a shape learned, then the same shape with a text the
 * shape path must decode or refuse exactly as the full read. */
static void test_chunk_shapes_fixed(void **state)
{
    (void)state;
    static const char *texts[] = {
        "abc",
        "h\xc3\xa9",
        "\\u00e9\\n",
        "\\ud83d\\ude00x",
        "\\ud800",
        "\\udc00\\u0041",
        "\\u0000",
        "\\\\ud800",
        "\xc0\xaf",
        "\xed\xa0\x80",
        "\\u007f\\u0080",
        "\\\"\\\\\\/",
        "\xf0\x9f\x98\x80",
        "\\u0041\\u00411",
        "",
    };
    static const char *fmt[] = {
        "{\"id\":\"c1\",\"created\":17,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"},"
        "\"finish_reason\":null}]}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"name\":\"%s\",\"arguments\":"
        "\"x%sy\"}}]}}]}",
        "{\"choices\":[{\"text\":\"%s\",\"delta\":{\"content\":\"%s\",\"reasoning_content\":"
        "\"%s\"}}],\"usage\":null}",
        "{\"choices\":[],\"x\":\"%s\"}",
    };
    rl_stream_t *on = rl_stream_new(true), *off = rl_stream_new(true);
    assert_non_null(on);
    assert_non_null(off);
    for (size_t f = 0; f < sizeof(fmt) / sizeof(fmt[0]); f++) {
        rl_chunk_shapes_clear();
        uint64_t h0 = rl_chunk_shape_hits();
        for (size_t t = 0; t < sizeof(texts) / sizeof(texts[0]); t++) {
            char d[512];
            int n = snprintf(d, sizeof(d), fmt[f], texts[t], texts[t], texts[t]);
            both_ways(on, off, d, (size_t)n);
        }
        /* the first text taught the shape; most later ones had it */
        assert_true(rl_chunk_shape_hits() - h0 >= 8);
    }
    /* a usage chunk is never read from a shape: one with the same bytes
     * but the usage's taught nothing */
    rl_chunk_shapes_clear();
    static const char u[] =
        "{\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}";
    both_ways(on, off, u, sizeof(u) - 1);
    both_ways(on, off, u, sizeof(u) - 1);
    assert_int_equal(rl_chunk_shape_hits(), 0);
    rl_stream_free(on);
    rl_stream_free(off);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_usage_json_fixed),     cmocka_unit_test(test_usage_json_deep),
        cmocka_unit_test(test_usage_json_generated), cmocka_unit_test(test_chunk_json_generated),
        cmocka_unit_test(test_chunk_shapes_fixed),   cmocka_unit_test(test_chunk_shapes_streams),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
