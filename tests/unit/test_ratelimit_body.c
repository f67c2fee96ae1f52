/*
 * The max_tokens clamp and include_usage injection, prompt and text
 * estimates, usage from a response body, and the stream accounting that
 * strips the usage-only chunk the client did not ask for.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ratelimit/ratelimit.h"

static json_t *js(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    if (!j)
        fail_msg("bad test JSON: %s", e.text);
    return j;
}

static json_int_t geti(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    assert_true(json_is_integer(v));
    return json_integer_value(v);
}

static void test_clamp(void **state)
{
    (void)state;
    rl_clamp_t c;
    char err[128];
    /* none sent: the policy maximum */
    json_t *b = js("{\"model\":\"m\",\"messages\":[]}");
    assert_int_equal(rl_body_clamp(b, 2048, &c, err, sizeof(err)), 0);
    assert_int_equal(geti(b, "max_tokens"), 2048);
    assert_int_equal(c.max_tokens, 2048);
    assert_false(c.stream);
    assert_false(c.injected_usage);
    assert_null(json_object_get(b, "stream_options"));
    json_decref(b);
    /* below the maximum: kept */
    b = js("{\"max_tokens\":100}");
    assert_int_equal(rl_body_clamp(b, 2048, &c, err, sizeof(err)), 0);
    assert_int_equal(geti(b, "max_tokens"), 100);
    assert_int_equal(c.max_tokens, 100);
    json_decref(b);
    /* above: clamped */
    b = js("{\"max_tokens\":5000}");
    assert_int_equal(rl_body_clamp(b, 2048, &c, err, sizeof(err)), 0);
    assert_int_equal(geti(b, "max_tokens"), 2048);
    json_decref(b);
    /* max_completion_tokens alone: clamped, no max_tokens added */
    b = js("{\"max_completion_tokens\":9999}");
    assert_int_equal(rl_body_clamp(b, 2048, &c, err, sizeof(err)), 0);
    assert_int_equal(geti(b, "max_completion_tokens"), 2048);
    assert_null(json_object_get(b, "max_tokens"));
    assert_int_equal(c.max_tokens, 2048);
    json_decref(b);
    /* both: both clamped, the smaller counts */
    b = js("{\"max_tokens\":3000,\"max_completion_tokens\":500}");
    assert_int_equal(rl_body_clamp(b, 2048, &c, err, sizeof(err)), 0);
    assert_int_equal(geti(b, "max_tokens"), 2048);
    assert_int_equal(geti(b, "max_completion_tokens"), 500);
    assert_int_equal(c.max_tokens, 500);
    json_decref(b);
    /* null counts as absent */
    b = js("{\"max_tokens\":null}");
    assert_int_equal(rl_body_clamp(b, 64, &c, err, sizeof(err)), 0);
    assert_int_equal(geti(b, "max_tokens"), 64);
    json_decref(b);
    /* bad values: 400 material */
    const char *bad[] = {"{\"max_tokens\":\"100\"}",
                         "{\"max_tokens\":0}",
                         "{\"max_tokens\":-5}",
                         "{\"max_completion_tokens\":1.5}",
                         "{\"stream\":\"yes\"}",
                         "{\"stream\":true,\"stream_options\":3}",
                         "[1,2]"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        b = js(bad[i]);
        err[0] = '\0';
        if (rl_body_clamp(b, 2048, &c, err, sizeof(err)) != -1)
            fail_msg("accepted %s", bad[i]);
        assert_true(err[0] != '\0');
        json_decref(b);
    }
}

static void test_include_usage(void **state)
{
    (void)state;
    rl_clamp_t c;
    char err[128];
    json_t *b = js("{\"stream\":true}");
    assert_int_equal(rl_body_clamp(b, 2048, &c, err, sizeof(err)), 0);
    assert_true(c.stream);
    assert_true(c.injected_usage);
    assert_true(
        json_is_true(json_object_get(json_object_get(b, "stream_options"), "include_usage")));
    json_decref(b);
    /* the client asked: not injected, nothing to strip */
    b = js("{\"stream\":true,\"stream_options\":{\"include_usage\":true}}");
    assert_int_equal(rl_body_clamp(b, 2048, &c, err, sizeof(err)), 0);
    assert_false(c.injected_usage);
    json_decref(b);
    /* the client said false: we still need it, and strip it */
    b = js("{\"stream\":true,\"stream_options\":{\"include_usage\":false,\"x\":1}}");
    assert_int_equal(rl_body_clamp(b, 2048, &c, err, sizeof(err)), 0);
    assert_true(c.injected_usage);
    json_t *so = json_object_get(b, "stream_options");
    assert_true(json_is_true(json_object_get(so, "include_usage")));
    assert_int_equal(geti(so, "x"), 1);
    json_decref(b);
    /* stream false or null: no stream_options */
    b = js("{\"stream\":false}");
    assert_int_equal(rl_body_clamp(b, 2048, &c, err, sizeof(err)), 0);
    assert_false(c.stream);
    assert_null(json_object_get(b, "stream_options"));
    json_decref(b);
}

static void test_estimates(void **state)
{
    (void)state;
    assert_int_equal(rl_estimate_text_tokens("", 0), 0);
    assert_int_equal(rl_estimate_text_tokens("abcd", 4), 1);
    assert_int_equal(rl_estimate_text_tokens("hello world", 11), 3);
    const char *cjk = "\xe4\xbd\xa0\xe5\xa5\xbd"; /* two characters */
    assert_int_equal(rl_estimate_text_tokens(cjk, strlen(cjk)), 2);
    json_t *b = js("{\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},"
                   "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"abcdefgh\"},"
                   "{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}");
    /* 3 + (4 + 4) + (4 + 2 + 85) */
    assert_int_equal(rl_body_prompt_tokens(b), 102);
    json_decref(b);
    b = js("{}");
    assert_int_equal(rl_body_prompt_tokens(b), 3);
    json_decref(b);
}

static void test_usage_body(void **state)
{
    (void)state;
    rl_usage_t u;
    json_t *b = js("{\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":30,"
                   "\"total_tokens\":42}}");
    assert_int_equal(rl_usage_from_body(b, &u), 0);
    assert_int_equal(u.prompt_tokens, 12);
    assert_int_equal(u.completion_tokens, 30);
    assert_int_equal(u.total_tokens, 42);
    json_decref(b);
    b = js("{\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}");
    assert_int_equal(rl_usage_from_body(b, &u), 0);
    assert_int_equal(u.total_tokens, 11);
    json_decref(b);
    const char *none[] = {"{}", "{\"usage\":null}", "{\"usage\":{\"prompt_tokens\":3}}",
                          "{\"usage\":[1]}"};
    for (size_t i = 0; i < sizeof(none) / sizeof(none[0]); i++) {
        b = js(none[i]);
        assert_int_equal(rl_usage_from_body(b, &u), -1);
        json_decref(b);
    }
}

#define FEED(s, lit, out, n) rl_stream_feed((s), (lit), strlen(lit), (out), (n))

static void test_stream_strip(void **state)
{
    (void)state;
    rl_stream_t *s = rl_stream_new(true);
    char *out;
    size_t n;
    rl_usage_t u;
    assert_int_equal(FEED(s,
                          "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
                          "\"content\":\"Hello\"}}],\"usage\":null}",
                          &out, &n),
                     RL_CHUNK_FORWARD);
    assert_null(out);
    assert_int_equal(FEED(s, "{\"choices\":[{\"delta\":{\"content\":\" world!!\"}}]}", &out, &n),
                     RL_CHUNK_FORWARD);
    assert_int_equal(rl_stream_usage(s, &u), -1);
    assert_int_equal(rl_stream_estimate(s), 4); /* 13 ASCII bytes */
    /* the usage-only chunk we injected: dropped, its usage kept */
    assert_int_equal(FEED(s,
                          "{\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,"
                          "\"completion_tokens\":3,\"total_tokens\":12}}",
                          &out, &n),
                     RL_CHUNK_DROP);
    assert_int_equal(FEED(s, "[DONE]", &out, &n), RL_CHUNK_FORWARD);
    assert_int_equal(rl_stream_usage(s, &u), 0);
    assert_int_equal(u.total_tokens, 12);
    assert_int_equal(rl_stream_settle_tokens(s, 500), 12);
    rl_stream_free(s);

    /* usage riding on a chunk with choices: rewritten without it */
    s = rl_stream_new(true);
    assert_int_equal(FEED(s,
                          "{\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":"
                          "{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}",
                          &out, &n),
                     RL_CHUNK_REWRITE);
    assert_non_null(out);
    assert_int_equal(strlen(out), n);
    assert_null(strstr(out, "usage"));
    json_t *j = js(out);
    assert_non_null(json_object_get(j, "choices"));
    json_decref(j);
    free(out);
    rl_stream_free(s);

    /* the client asked for usage: everything forwarded */
    s = rl_stream_new(false);
    assert_int_equal(FEED(s,
                          "{\"choices\":[],\"usage\":{\"prompt_tokens\":1,"
                          "\"completion_tokens\":2}}",
                          &out, &n),
                     RL_CHUNK_FORWARD);
    assert_int_equal(rl_stream_usage(s, &u), 0);
    assert_int_equal(u.total_tokens, 3);
    rl_stream_free(s);
}

static void test_stream_estimate(void **state)
{
    (void)state;
    rl_stream_t *s = rl_stream_new(true);
    char *out;
    size_t n;
    /* no usage ever comes: count content, reasoning and tool arguments */
    assert_int_equal(FEED(s, " {\"choices\":[{\"delta\":{\"content\":\"abcdefgh\"}}]}", &out, &n),
                     RL_CHUNK_FORWARD);
    assert_int_equal(
        FEED(s, "{\"choices\":[{\"delta\":{\"reasoning_content\":\"abcd\"}}]}", &out, &n),
        RL_CHUNK_FORWARD);
    assert_int_equal(FEED(s,
                          "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":"
                          "{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]}}]}",
                          &out, &n),
                     RL_CHUNK_FORWARD);
    /* 8 + 4 + 1 + 7 ASCII = 20 -> 5 */
    assert_int_equal(rl_stream_estimate(s), 5);
    /* bad JSON and comments are forwarded untouched and count nothing */
    assert_int_equal(FEED(s, "{not json", &out, &n), RL_CHUNK_FORWARD);
    assert_int_equal(FEED(s, "", &out, &n), RL_CHUNK_FORWARD);
    assert_int_equal(rl_stream_estimate(s), 5);
    rl_usage_t u;
    assert_int_equal(rl_stream_usage(s, &u), -1);
    assert_int_equal(rl_stream_settle_tokens(s, 100), 105);
    rl_stream_free(s);
}

#define STRIP(lit, out, n) rl_chunk_strip_usage((lit), strlen(lit), (out), (n))

/* The strip with no stream state (the LLM metrics' hook): the same
 * decisions as a strip stream's, event by event. */
static void test_chunk_strip_usage(void **state)
{
    (void)state;
    char *out;
    size_t n;
    assert_int_equal(STRIP("{\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}", &out, &n),
                     RL_CHUNK_FORWARD);
    assert_null(out);
    assert_int_equal(STRIP("{\"choices\":[],\"usage\":{\"prompt_tokens\":9,"
                           "\"completion_tokens\":3,\"total_tokens\":12}}",
                           &out, &n),
                     RL_CHUNK_DROP);
    assert_null(out);
    assert_int_equal(STRIP("{\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":"
                           "{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}",
                           &out, &n),
                     RL_CHUNK_REWRITE);
    assert_non_null(out);
    assert_int_equal(strlen(out), n);
    assert_null(strstr(out, "usage"));
    assert_non_null(strstr(out, "\"content\":\"x\""));
    free(out);
    /* a usage that is no usage object, bad JSON, [DONE]: as they came */
    assert_int_equal(STRIP("{\"choices\":[],\"usage\":null}", &out, &n), RL_CHUNK_FORWARD);
    assert_int_equal(STRIP("{\"choices\":[],\"usage\":{", &out, &n), RL_CHUNK_FORWARD);
    assert_int_equal(STRIP("[DONE]", &out, &n), RL_CHUNK_FORWARD);
    assert_null(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clamp),
        cmocka_unit_test(test_include_usage),
        cmocka_unit_test(test_estimates),
        cmocka_unit_test(test_usage_body),
        cmocka_unit_test(test_stream_strip),
        cmocka_unit_test(test_stream_estimate),
        cmocka_unit_test(test_chunk_strip_usage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
