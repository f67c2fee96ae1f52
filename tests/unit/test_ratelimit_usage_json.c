/*
 * rl_usage_from_json (the answer's usage read without a tree) against
 * rl_usage_from_body over jansson's tree of the same bytes (json_loadb
 * flags 0, as the gateway parses an answer): the same result and the same
 * figures for fixed odd answers and for generated ones (usage members in
 * any order, duplicated, negative, huge, real, strings, null; "usage"
 * nested elsewhere, twice at the top, not an object; escapes and UTF-8
 * jansson refuses; deep nesting; trailing bytes; cut answers).
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

static void put(buf_t *b, const char *s)
{
    size_t k = strlen(s);
    if (b->n + k < sizeof(b->b)) {
        memcpy(b->b + b->n, s, k);
        b->n += k;
    }
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_usage_json_fixed),
        cmocka_unit_test(test_usage_json_deep),
        cmocka_unit_test(test_usage_json_generated),
        cmocka_unit_test(test_chunk_json_generated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
