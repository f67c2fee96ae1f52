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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completed_usage), cmocka_unit_test(test_not_the_usage),
        cmocka_unit_test(test_delta_text),      cmocka_unit_test(test_rl_stream),
        cmocka_unit_test(test_prompt_estimate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
