/*
 * test_gw_clients.c — what the openai SDKs read from sluice's answers:
 * OpenAI's x-ratelimit-* names with the reset as a Go duration, the
 * retry-after-ms beside Retry-After, and the breaker's remaining wait.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <jansson.h>
#include <zlib.h>

#include "conf/conf.h"
#include "fallback/fallback.h"
#include "gateway/gw_gzip.h"
#include "gateway/gw_hook.h"
#include "ratelimit/ratelimit.h"

static void test_duration(void **st)
{
    (void)st;
    char b[48];
    assert_string_equal(gw_rl_duration(0, b, sizeof(b)), "0s");
    assert_string_equal(gw_rl_duration(-5, b, sizeof(b)), "0s");
    assert_string_equal(gw_rl_duration(20, b, sizeof(b)), "20ms");
    assert_string_equal(gw_rl_duration(999, b, sizeof(b)), "999ms");
    assert_string_equal(gw_rl_duration(1000, b, sizeof(b)), "1s");
    assert_string_equal(gw_rl_duration(1500, b, sizeof(b)), "1.5s");
    assert_string_equal(gw_rl_duration(1020, b, sizeof(b)), "1.02s");
    assert_string_equal(gw_rl_duration(360000, b, sizeof(b)), "6m0s");
    assert_string_equal(gw_rl_duration(361500, b, sizeof(b)), "6m1.5s");
    assert_string_equal(gw_rl_duration(3600000, b, sizeof(b)), "1h0m0s");
    assert_string_equal(gw_rl_duration(86399000, b, sizeof(b)), "23h59m59s");
}

static void test_headers_requests_refused(void **st)
{
    (void)st;
    rl_decision_t d = {.allowed = false,
                       .limit = RL_LIMIT_REQUESTS,
                       .limit_value = 10,
                       .remaining = -1,
                       .reset_ms = 59000,
                       .retry_after_ms = 4200};
    char b[512];
    int n = gw_rl_format_headers(&d, b, sizeof(b));
    assert_int_equal(n, (int)strlen(b));
    assert_non_null(strstr(b, "x-ratelimit-limit-requests: 10\r\n"));
    assert_non_null(strstr(b, "x-ratelimit-remaining-requests: 0\r\n"));
    assert_non_null(strstr(b, "x-ratelimit-reset-requests: 59s\r\n"));
    assert_non_null(strstr(b, "Retry-After: 5\r\n"));
    assert_non_null(strstr(b, "retry-after-ms: 4200\r\n"));
    assert_non_null(strstr(b, "X-RateLimit-Limit: 10\r\n")); /* deprecated, kept */
    assert_null(strstr(b, "-tokens"));
}

static void test_headers_tokens_allowed(void **st)
{
    (void)st;
    rl_decision_t d = {.allowed = true,
                       .limit = RL_LIMIT_TOKENS_MINUTE,
                       .limit_value = 40000,
                       .remaining = 39000,
                       .reset_ms = 1500,
                       .retry_after_ms = 0};
    char b[512];
    assert_true(gw_rl_format_headers(&d, b, sizeof(b)) > 0);
    assert_non_null(strstr(b, "x-ratelimit-limit-tokens: 40000\r\n"));
    assert_non_null(strstr(b, "x-ratelimit-remaining-tokens: 39000\r\n"));
    assert_non_null(strstr(b, "x-ratelimit-reset-tokens: 1.5s\r\n"));
    assert_null(strstr(b, "etry-after")); /* allowed: no retry hint */
    assert_null(strstr(b, "-requests"));
    /* Too small a buffer is refused, not truncated. */
    assert_int_equal(gw_rl_format_headers(&d, b, 100), -1);
}

static void test_headers_concurrent(void **st)
{
    (void)st;
    rl_decision_t d = {.allowed = false,
                       .limit = RL_LIMIT_CONCURRENT,
                       .limit_value = 2,
                       .remaining = 0,
                       .reset_ms = 0,
                       .retry_after_ms = 1000};
    char b[512];
    assert_true(gw_rl_format_headers(&d, b, sizeof(b)) > 0);
    assert_null(strstr(b, "x-ratelimit-"));
    assert_non_null(strstr(b, "retry-after-ms: 1000\r\n"));
}

static void test_breaker_wait(void **st)
{
    (void)st;
    conf_fb_circuit_t c = {.failures = 2, .window_ms = 10000, .cooldown_ms = 30000, .probes = 1};
    fb_breaker_t *b = fb_breaker_new(&c, "up", "s1");
    assert_non_null(b);
    int64_t now = 1000000;
    assert_int_equal(fb_breaker_wait_ms(b, now, 1000), 0);
    for (int i = 0; i < 2; i++) {
        fb_admit_t a = fb_breaker_acquire(b, now);
        fb_breaker_report(b, a, false, now);
    }
    assert_int_equal(fb_breaker_wait_ms(b, now, 1000), 30000);
    assert_int_equal(fb_breaker_wait_ms(b, now + 29000, 1000), 1000);
    /* Cooldown over: half-open with a free probe slot. */
    assert_int_equal(fb_breaker_wait_ms(b, now + 30000, 1000), 0);
    fb_admit_t probe = fb_breaker_acquire(b, now + 30000);
    assert_int_equal(probe, FB_ADMIT_PROBE);
    /* The one probe is out: the next may go when it answers. */
    assert_int_equal(fb_breaker_wait_ms(b, now + 30001, 1000), 1000);
    fb_breaker_cancel(b, probe);
    fb_breaker_free(b);
}

static void test_template_shapes(void **st)
{
    (void)st;
    json_t *b = json_loads("{\"model\":\"m\",\"n\":500,\"response_format\":{\"type\":"
                           "\"json_schema\"},\"tools\":[{}],\"tool_choice\":\"required\"}",
                           0, NULL);
    fb_reply_req_t q;
    memset(&q, 0, sizeof(q));
    fb_reply_req_from_json(b, &q);
    assert_int_equal(q.n, FB_REPLY_MAX_N);
    assert_true(q.json_mode);
    assert_true(q.tools_required);
    json_decref(b);
    b = json_loads("{\"tool_choice\":\"required\",\"n\":0}", 0, NULL);
    memset(&q, 0, sizeof(q));
    fb_reply_req_from_json(b, &q);
    assert_false(q.tools_required); /* no tools: nothing is required */
    assert_int_equal(q.n, 1);
    assert_false(q.json_mode);
    json_decref(b);

    conf_fb_template_t c = {.enabled = true, .text = "busy \"now\""};
    fb_tmpl_t *t = fb_tmpl_new(&c);
    assert_non_null(t);
    fb_reply_req_t r = {.api = FB_API_CHAT, .model = "m", .id = "x", .n = 2, .json_mode = true};
    size_t n = 0;
    char *s = fb_tmpl_render(t, &r, NULL, 0, &n);
    assert_non_null(s);
    json_t *o = json_loads(s, 0, NULL);
    assert_int_equal(json_array_size(json_object_get(o, "choices")), 2);
    const char *content = json_string_value(json_object_get(
        json_object_get(json_array_get(json_object_get(o, "choices"), 1), "message"), "content"));
    json_t *inner = json_loads(content, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(inner, "error")), "unavailable");
    assert_string_equal(json_string_value(json_object_get(inner, "message")), "busy \"now\"");
    json_decref(inner);
    json_decref(o);
    free(s);
    fb_tmpl_free(t);
}

static void test_gzip(void **st)
{
    (void)st;
    assert_true(gw_gzip_accepted("gzip", 4));
    assert_true(gw_gzip_accepted("deflate, gzip;q=0.5, br", 24));
    assert_true(gw_gzip_accepted("br, *", 5));
    assert_true(gw_gzip_accepted("X-GZIP", 6));
    assert_false(gw_gzip_accepted("gzip;q=0", 8));
    assert_false(gw_gzip_accepted("gzip;q=0.000, *", 15)); /* gzip refused by name */
    assert_false(gw_gzip_accepted("identity", 8));
    assert_false(gw_gzip_accepted("gzipx", 5));
    assert_false(gw_gzip_accepted("", 0));
    char in[4096];
    for (size_t i = 0; i < sizeof(in); i++)
        in[i] = "{\"choices\":[]}"[i % 14];
    size_t n = 0;
    unsigned char *gz = gw_gzip(in, sizeof(in), 6, &n);
    assert_non_null(gz);
    assert_true(n > 18 && n < sizeof(in) / 4);
    assert_int_equal(gz[0], 0x1f); /* the gzip magic, not zlib's header */
    assert_int_equal(gz[1], 0x8b);
    char back[4096];
    z_stream z;
    memset(&z, 0, sizeof(z));
    assert_int_equal(inflateInit2(&z, 15 + 16), Z_OK);
    z.next_in = gz;
    z.avail_in = (uInt)n;
    z.next_out = (Bytef *)back;
    z.avail_out = sizeof(back);
    assert_int_equal(inflate(&z, Z_FINISH), Z_STREAM_END);
    assert_int_equal(z.total_out, sizeof(in));
    inflateEnd(&z);
    assert_memory_equal(back, in, sizeof(in));
    free(gz);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_duration),
        cmocka_unit_test(test_headers_requests_refused),
        cmocka_unit_test(test_headers_tokens_allowed),
        cmocka_unit_test(test_headers_concurrent),
        cmocka_unit_test(test_breaker_wait),
        cmocka_unit_test(test_template_shapes),
        cmocka_unit_test(test_gzip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
