/*
 * test_sl_resp.c — common/sl_resp.c, what token accounting reads from a
 * Responses API event: response.usage's counts (nested: a top-level or
 * deeper "usage" is not it), the *.delta text's characters after
 * unescaping, nothing from JSON yajl refuses, and rl_stream_feed_responses
 * (ratelimit/) settling on the usage, else on the prompt and the deltas.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/sl.h"
#include "common/sl_resp.h"
#include "ratelimit/ratelimit.h"

#define S(lit) lit, sizeof(lit) - 1
#define BOTH   (SL_RESP_USAGE | SL_RESP_TEXT)

static void test_completed_usage(void **state)
{
    (void)state;
    sl_resp_ev_t e;
    static const char done[] =
        "{\"type\":\"response.completed\",\"sequence_number\":9,\"response\":{\"id\":\"r\","
        "\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":"
        "\"a \\\"usage\\\":{\\\"input_tokens\\\":99} b\"}]}],\"usage\":{\"input_tokens\":31,"
        "\"input_tokens_details\":{\"cached_tokens\":5,\"input_tokens\":77},\"output_tokens\":9,"
        "\"output_tokens_details\":{\"reasoning_tokens\":2},\"total_tokens\":40},\"user\":null}}";
    static const unsigned whats[] = {SL_RESP_USAGE, BOTH};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(sl_resp_event_read(S(done), whats[i], &e), 0);
        assert_true(e.usage && e.have_in && e.have_out && e.have_total);
        assert_int_equal(e.in, 31);
        assert_int_equal(e.out, 9);
        assert_int_equal(e.total, 40);
        assert_int_equal(sl_resp_usage_total(&e), 40);
        assert_false(e.delta);
    }
    /* without the total: input + output; the parse stops at the usage's end */
    assert_int_equal(sl_resp_event_read(S("{\"response\":{\"usage\":{\"output_tokens\":4,"
                                          "\"input_tokens\":6}} not json"),
                                        SL_RESP_USAGE, &e),
                     0);
    assert_int_equal(sl_resp_usage_total(&e), 10);
    /* SL_RESP_TEXT alone reports no usage */
    assert_int_equal(sl_resp_event_read(S(done), SL_RESP_TEXT, &e), 0);
    assert_false(e.usage);
    assert_int_equal(sl_resp_usage_total(&e), -1);
}

static void test_not_the_usage(void **state)
{
    (void)state;
    static const char *const none[] = {
        "{\"type\":\"response.created\",\"response\":{\"usage\":null}}",
        "{\"usage\":{\"input_tokens\":1,\"output_tokens\":2}}",
        "{\"item\":{\"usage\":{\"input_tokens\":1}},\"response\":{\"x\":{\"usage\":{"
        "\"input_tokens\":3}}}}",
        "{\"response\":[{\"usage\":{\"input_tokens\":1}}]}",
        "{\"response\":{\"usage\":{\"input_tokens\":-1,\"output_tokens\":2}}}",
        "{\"response\":{\"usage\":{\"input_tokens\":\"5\",\"output_tokens\":2.0}}}",
        "{\"response\":{\"usage\":{}}}",
    };
    for (size_t i = 0; i < sizeof(none) / sizeof(none[0]); i++) {
        sl_resp_ev_t e;
        assert_int_equal(sl_resp_event_read(none[i], strlen(none[i]), BOTH, &e), 0);
        if (sl_resp_usage_total(&e) != -1)
            fail_msg("a usage in %s", none[i]);
    }
    sl_resp_ev_t e;
    /* an object yajl refuses before the usage ends: nothing */
    assert_int_equal(
        sl_resp_event_read(S("{\"response\":{\"usage\":{\"input_tokens\":1,,}}}"), BOTH, &e), -1);
    assert_false(e.usage);
    assert_int_equal(
        sl_resp_event_read(S("{\"response\":{\"usage\":{\"input_tokens\":1"), BOTH, &e), -1);
    assert_int_equal(sl_resp_event_read(S("{\"response\":{\"usage\":{\"input_tokens\":"
                                          "99999999999999999999}}}"),
                                        BOTH, &e),
                     -1);
}

static void test_delta_text(void **state)
{
    (void)state;
    sl_resp_ev_t e;
    /* "a\n\"é" + "€" (escaped): 4 ASCII, 2 others */
    assert_int_equal(sl_resp_event_read(S("{\"type\":\"response.output_text.delta\",\"item_id\":"
                                          "\"m\",\"delta\":\"a\\n\\\"\xc3\xa9\\u20ac!\"}"),
                                        BOTH, &e),
                     0);
    assert_true(e.delta);
    assert_int_equal(e.ascii, 4);
    assert_int_equal(e.other, 2);
    /* the type after the delta; tool-call arguments count */
    assert_int_equal(
        sl_resp_event_read(S("{\"delta\":\"{\\\"x\\\":1}\",\"type\":\"response.function_call_"
                             "arguments.delta\"}"),
                           BOTH, &e),
        0);
    assert_true(e.delta);
    assert_int_equal(e.ascii, 7);
    /* audio's base64, a done event's text, a delta that is not a string,
     * or no text asked for: nothing */
    static const char *const none[] = {
        "{\"type\":\"response.audio.delta\",\"delta\":\"QUJD\"}",
        "{\"type\":\"response.output_text.done\",\"text\":\"abc\"}",
        "{\"type\":\"response.output_text.delta\",\"delta\":{\"t\":\"abc\"}}",
        "{\"type\":\"response.output_text.deltas\",\"delta\":\"abc\"}",
        "{\"type\":\"x\",\"item\":{\"type\":\"y.delta\",\"delta\":\"abc\"}}",
    };
    for (size_t i = 0; i < sizeof(none) / sizeof(none[0]); i++) {
        assert_int_equal(sl_resp_event_read(none[i], strlen(none[i]), BOTH, &e), 0);
        if (e.delta || e.ascii || e.other)
            fail_msg("a delta in %s", none[i]);
    }
    assert_int_equal(sl_resp_event_read(S("{\"type\":\"response.output_text.delta\","
                                          "\"delta\":\"abc\"}"),
                                        SL_RESP_USAGE, &e),
                     0);
    assert_false(e.delta);
}

static void test_rl_stream(void **state)
{
    (void)state;
    static const char d1[] = "{\"type\":\"response.output_text.delta\",\"delta\":\"abcdefgh\"}";
    static const char d2[] = "{\"type\":\"response.output_text.delta\",\"delta\":\"xyz\"}";
    static const char item[] = "{\"type\":\"response.output_item.done\",\"item\":{\"content\":"
                               "[{\"type\":\"output_text\",\"text\":\"abcdefghxyz\"}]}}";
    static const char done[] = "{\"type\":\"response.completed\",\"response\":{\"usage\":{"
                               "\"input_tokens\":20,\"output_tokens\":3,\"total_tokens\":23}}}";
    rl_stream_t *s = rl_stream_new(false);
    assert_non_null(s);
    rl_stream_feed_responses(s, S(d1));
    rl_stream_feed_responses(s, S(d2));
    rl_stream_feed_responses(s, S(item));
    assert_int_equal(rl_stream_estimate(s), 3); /* 11 ASCII: the done text not again */
    rl_usage_t u;
    assert_int_equal(rl_stream_usage(s, &u), -1);
    assert_int_equal(rl_stream_settle_tokens(s, 50), 53); /* cut here */
    rl_stream_feed_responses(s, S(done));
    assert_int_equal(rl_stream_usage(s, &u), 0);
    assert_int_equal(u.prompt_tokens, 20);
    assert_int_equal(u.completion_tokens, 3);
    assert_int_equal(rl_stream_settle_tokens(s, 50), 23);
    rl_stream_free(s);
}

static void test_prompt_estimate(void **state)
{
    (void)state;
    json_t *b = json_loads("{\"instructions\":\"abcdefgh\",\"input\":\"abcd\"}", 0, NULL);
    assert_int_equal(rl_responses_prompt_tokens(b), 3 + 2 + 4 + 1);
    json_decref(b);
    b = json_loads("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":"
                   "\"abcdefgh\"},{\"type\":\"input_image\",\"image_url\":\"https://x/y.png\"}]},"
                   "{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":\"abcd\"},"
                   "{\"role\":\"assistant\",\"content\":\"ab\"}]}",
                   0, NULL);
    assert_non_null(b);
    assert_int_equal(rl_responses_prompt_tokens(b), 3 + (4 + 2 + 85) + (4 + 1) + (4 + 1));
    json_decref(b);
    /* an item with no text member: its compact JSON (41 bytes: 11) */
    b = json_loads("{\"input\":[{\"type\":\"function_call\",\"arguments\":\"{}\"}]}", 0, NULL);
    assert_int_equal(rl_responses_prompt_tokens(b), 3 + 4 + 11);
    json_decref(b);
}

/* ---- sl_resp_usage_read against sl_resp_event_read ----------------------
 *
 * Usage events made from a few forms (usage after or before the output,
 * with details, duplicate counts, a "usage" nested in an output item, a
 * second response, none, null), their values drawn from lists that hold
 * what the kept shapes must not vouch for (escapes, \u, CJK, UTF-8 yajl
 * refuses or takes, control bytes, negative, -0, 18 and 19 digits, reals,
 * strings), some cut short or with a byte changed: in the order drawn (so
 * the shapes learnt from earlier events are tried on later ones), every
 * read must give what yajl's read gives, and many must come from a shape. */

static const char *const gen_forms[] = {
    /* 0: the bench's form, usage last */
    "{\"type\":\"response.completed\",\"sequence_number\":%I,\"response\":{\"id\":\"%S\","
    "\"object\":\"response\",\"created_at\":%I,\"status\":\"completed\",\"model\":\"%S\","
    "\"output\":[{\"id\":\"%S\",\"type\":\"message\",\"content\":[{\"type\":\"output_text\","
    "\"text\":\"%S\",\"annotations\":[]}]}],\"usage\":{\"input_tokens\":%I,\"output_tokens\":%I,"
    "\"total_tokens\":%I}}}",
    /* 1: usage before the output, details and more after it */
    "{\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":%I,"
    "\"input_tokens_details\":{\"cached_tokens\":%I},\"output_tokens\":%I,"
    "\"output_tokens_details\":{\"reasoning_tokens\":%I},\"total_tokens\":%I},\"output\":[{"
    "\"content\":[{\"text\":\"%S\"}]}],\"temperature\":1.0,\"user\":null},\"sequence_number\":%I}",
    /* 2: a count twice, and a string count */
    "{\"response\":{\"id\":\"%S\",\"usage\":{\"input_tokens\":%I,\"input_tokens\":%I,"
    "\"output_tokens\":%I,\"total_tokens\":%I,\"note\":\"%S\"}},\"type\":\"response.incomplete\"}",
    /* 3: a "usage" inside an output item first, then the response's */
    "{\"type\":\"response.completed\",\"response\":{\"output\":[{\"type\":\"x\",\"usage\":{"
    "\"input_tokens\":%I},\"text\":\"%S\"}],\"usage\":{\"input_tokens\":%I,\"output_tokens\":%I}}}",
    /* 4: two responses (the first one's usage counts, unless negative) */
    "{\"response\":{\"usage\":{\"input_tokens\":%I,\"output_tokens\":%I}},\"response\":{"
    "\"usage\":{\"input_tokens\":%I,\"total_tokens\":%I}},\"x\":\"%S\"}",
    /* 5: no usage, a null one, a top-level one */
    "{\"type\":\"response.completed\",\"usage\":{\"input_tokens\":%I},\"response\":{\"usage\":"
    "null,\"output\":[{\"text\":\"%S\"}]}}",
    /* 6: blanks, a usage with reals and strings */
    "{ \"response\" : { \"output\" : [ \"%S\" , %I ] , \"usage\" : { \"input_tokens\" : %I ,"
    " \"output_tokens\" : %S , \"total_tokens\" : %I } } }",
};

static const char *const gen_strs[] = {
    "tok tok tok ",
    "",
    "a \\\"q\\\" b\\n\\t\\\\",
    "caf\\u00e9",
    "\\ud83d\\ude00",
    "\xe6\x95\x8f\xe6\x84\x9f",
    "caf\xc3\xa9",
    "\xed\xa0\x80",
    "\xc0\xaf",
    "\xf8\x88\x80\x80\x80",
    "\xc3(",
    "\xe6\x95",
    "\x01",
    "\\ud800",
    "\\u0000",
    "\\q",
    "x\\",
    "\"usage\":{\"input_tokens\":5}",
    "\\\"usage\\\":{\\\"input_tokens\\\":5}",
    "\xf0\x9f\x98\x80 ok",
};

static const char *const gen_ints[] = {
    "0",
    "7",
    "31",
    "1700000000",
    "-1",
    "-0",
    "123456789012345678",
    "1234567890123456789",
    "99999999999999999999",
    "9.5",
    "1e3",
    "\"5\"",
    "null",
    "007",
    "-",
};

static uint64_t gen_rand(uint64_t *x)
{
    *x = *x * 6364136223846793005u + 1442695040888963407u;
    return *x >> 33;
}

/* One event of form f, its values drawn (mostly the plain first ones, so
 * one form's events share a shape), into b (NUL-terminated); its length. */
static size_t gen_event(uint64_t *x, size_t f, char *b, size_t cap)
{
    const char *t = gen_forms[f];
    size_t n = 0;
    while (*t && n + 64 < cap) {
        if (t[0] == '%' && (t[1] == 'S' || t[1] == 'I')) {
            bool odd = gen_rand(x) % 8 == 0;
            const char *v;
            if (t[1] == 'S')
                v = gen_strs[odd ? gen_rand(x) % SL_ARRAY_LEN(gen_strs) : gen_rand(x) % 2];
            else
                v = gen_ints[odd ? gen_rand(x) % SL_ARRAY_LEN(gen_ints) : gen_rand(x) % 4];
            size_t vl = strlen(v);
            if (n + vl + 64 >= cap)
                break;
            memcpy(b + n, v, vl);
            n += vl;
            t += 2;
        } else {
            b[n++] = *t++;
        }
    }
    uint64_t r = gen_rand(x) % 16;
    if (r == 0 && n > 1) /* cut short */
        n = 1 + gen_rand(x) % (n - 1);
    else if (r == 1 && n > 0) /* one byte changed */
        b[gen_rand(x) % n] = "\"{}[],:\\ 0-a\x80"[gen_rand(x) % 14];
    b[n] = '\0';
    return n;
}

static bool ev_same(const sl_resp_ev_t *a, const sl_resp_ev_t *b)
{
    return a->usage == b->usage && a->have_in == b->have_in && a->have_out == b->have_out &&
           a->have_total == b->have_total && a->in == b->in && a->out == b->out &&
           a->total == b->total && a->delta == b->delta && a->ascii == b->ascii &&
           a->other == b->other;
}

static void test_usage_shapes_same(void **state)
{
    (void)state;
    sl_resp_shapes_clear();
    uint64_t x = 42, hits0 = sl_resp_shape_hits();
    size_t usages = 0;
    char b[2048];
    for (int it = 0; it < 60000; it++) {
        /* runs of one form, as one server's stream after stream */
        size_t f = (size_t)(it / 50 + gen_rand(&x) % 3 / 2) % SL_ARRAY_LEN(gen_forms);
        size_t n = gen_event(&x, f, b, sizeof(b));
        sl_resp_ev_t want, got;
        int rw = sl_resp_event_read(b, n, SL_RESP_USAGE, &want);
        int rg = sl_resp_usage_read(b, n, &got);
        if (rw != rg || !ev_same(&want, &got))
            fail_msg("event %d (form %zu): yajl %d usage %d in %lld/%d out %lld/%d total %lld/%d; "
                     "shapes %d usage %d in %lld/%d out %lld/%d total %lld/%d\n%s",
                     it, f, rw, want.usage, (long long)want.in, want.have_in, (long long)want.out,
                     want.have_out, (long long)want.total, want.have_total, rg, got.usage,
                     (long long)got.in, got.have_in, (long long)got.out, got.have_out,
                     (long long)got.total, got.have_total, b);
        usages += want.usage;
    }
    uint64_t hits = sl_resp_shape_hits() - hits0;
    /* the shapes answered most usages (a test that never hits one is none) */
    if (hits < usages / 3 || usages < 10000)
        fail_msg("%llu of %zu usages from a shape", (unsigned long long)hits, usages);
    sl_resp_shapes_clear();
}

/* A usage event too long for a shape (a long answer's repeated text) is
 * read by yajl and takes no slot: the shape kept from a short one stays. */
static void test_usage_shape_kept_past_long(void **state)
{
    (void)state;
    sl_resp_shapes_clear();
    /* not the short events' form (a shape learnt from a short event serves
     * long ones of its form: the bound is on the learning) */
    static const char pre[] =
        "{\"type\":\"response.completed\",\"response\":{\"big\":1,\"output\":[{\"text\":\"";
    static const char post[] = "\"}],\"usage\":{\"input_tokens\":3,\"output_tokens\":4}}}";
    size_t tl = 9000, n = sizeof(pre) - 1 + tl + sizeof(post) - 1;
    char *big = malloc(n + 1);
    assert_non_null(big);
    memcpy(big, pre, sizeof(pre) - 1);
    memset(big + sizeof(pre) - 1, 'a', tl);
    memcpy(big + sizeof(pre) - 1 + tl, post, sizeof(post));
    sl_resp_ev_t e;
    assert_int_equal(
        sl_resp_usage_read(S("{\"type\":\"response.completed\",\"response\":{\"output\":"
                             "[{\"text\":\"hi\"}],\"usage\":{\"input_tokens\":1,"
                             "\"output_tokens\":2}}}"),
                           &e),
        0);
    /* a second form: both slots full */
    assert_int_equal(sl_resp_usage_read(S("{\"response\":{\"usage\":{\"total_tokens\":5}}}"), &e),
                     0);
    for (int i = 0; i < 64; i++) {
        assert_int_equal(sl_resp_usage_read(big, n, &e), 0);
        assert_true(e.usage && e.in == 3 && e.out == 4);
    }
    uint64_t h = sl_resp_shape_hits();
    assert_int_equal(
        sl_resp_usage_read(S("{\"type\":\"response.completed\",\"response\":{\"output\":"
                             "[{\"text\":\"hello\"}],\"usage\":{\"input_tokens\":15,"
                             "\"output_tokens\":26}}}"),
                           &e),
        0);
    assert_int_equal(sl_resp_shape_hits(), h + 1);
    assert_true(e.usage && e.in == 15 && e.out == 26);
    assert_int_equal(sl_resp_usage_read(S("{\"response\":{\"usage\":{\"total_tokens\":7}}}"), &e),
                     0);
    assert_int_equal(sl_resp_shape_hits(), h + 2);
    assert_true(e.usage && e.total == 7);
    free(big);
    sl_resp_shapes_clear();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completed_usage),
        cmocka_unit_test(test_not_the_usage),
        cmocka_unit_test(test_delta_text),
        cmocka_unit_test(test_rl_stream),
        cmocka_unit_test(test_prompt_estimate),
        cmocka_unit_test(test_usage_shapes_same),
        cmocka_unit_test(test_usage_shape_kept_past_long),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
