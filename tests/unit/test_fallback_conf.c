/*
 * The fallback: and fault: sections of the conf: the issue's shape loads
 * with the values it says, defaults, per-model fault and queue, the checks
 * across keys (backoff vs backoff_max, fallback.local naming an upstream,
 * the Redis store needing redis.url), and that what the conf yields builds
 * the fallback objects (template, budget, breaker, fault resolution).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "conf/conf.h"
#include "fallback/fallback.h"

static const char base_yaml[] = "listen: [ { address: 127.0.0.1:8080 } ]\n"
                                "upstreams:\n"
                                "  main: { servers: [ { url: \"http://127.0.0.1:8000\" } ] }\n"
                                "  local:\n"
                                "    servers: [ { url: \"http://127.0.0.1:8081\" } ]\n";

static conf_t *load(const char *extra, char *err, size_t errlen)
{
    char buf[8192];
    snprintf(buf, sizeof(buf), "%s%s", base_yaml, extra);
    return conf_load_string(buf, strlen(buf), "t.yaml", err, errlen);
}

static void test_issue_shape(void **state)
{
    (void)state;
    char err[512];
    conf_t *c = load("fallback:\n"
                     "  retry: { attempts: 1, backoff: 100ms, budget_percent: 20 }\n"
                     "  circuit: { failures: 5, cooldown: 30s }\n"
                     "  local: { upstream: local }\n"
                     "  template: { text: \"我现在网络不太顺畅，稍后再试试吧。\", texts: { en: "
                     "\"The network is not\n"
                     "              stable right now, please try again shortly.\" } }\n"
                     "  queue: { enabled: true, dir: var/queue, max_attempts: 20, max_age: 24h }\n"
                     "fault: { abort_percent: 0, abort_status: 503, delay_percent: 0, delay: 0s }\n"
                     "models:\n"
                     "  chat-model: { upstream: main, queue: off, fault: { abort_percent: 30 } }\n"
                     "  other: { upstream: main }\n",
                     err, sizeof(err));
    if (!c)
        fail_msg("%s", err);
    const conf_fallback_t *f = &c->fallback;
    assert_int_equal(f->retry.attempts, 1);
    assert_int_equal(f->retry.backoff_ms, 100);
    assert_int_equal(f->retry.backoff_max_ms, 2000);
    assert_int_equal(f->retry.budget_percent, 20);
    assert_int_equal(f->retry.budget_window_ms, 10000);
    assert_int_equal(f->circuit.failures, 5);
    assert_int_equal(f->circuit.cooldown_ms, 30000);
    assert_int_equal(f->circuit.failure_percent, 50);
    assert_int_equal(f->circuit.probes, 1);
    assert_string_equal(f->local.upstream, "local");
    assert_true(f->tmpl.enabled);
    assert_string_equal(f->tmpl.text, "我现在网络不太顺畅，稍后再试试吧。");
    assert_int_equal(f->tmpl.ntexts, 1);
    assert_string_equal(f->tmpl.texts[0].key, "en");
    assert_string_equal(f->tmpl.texts[0].value,
                        "The network is not stable right now, please try again shortly.");
    assert_true(f->queue.enabled);
    assert_int_equal(f->queue.store, CONF_QUEUE_STORE_AUTO);
    assert_string_equal(f->queue.dir, "var/queue");
    assert_int_equal(f->queue.max_attempts, 20);
    assert_int_equal(f->queue.max_age_ms, 86400000);
    assert_int_equal(f->queue.keep_ms, 86400000);
    assert_true(f->idempotency.enabled);
    assert_int_equal(f->idempotency.ttl_ms, 86400000);
    assert_int_equal(c->fault.abort_status, 503);
    assert_true(c->fault.header);

    const conf_model_t *m = conf_model_find(c, "chat-model");
    assert_int_equal(m->queue, CONF_QUEUE_OFF);
    assert_int_equal(m->fault.abort_percent, 30);
    assert_int_equal(m->fault.abort_status, -1);
    fb_fault_spec_t s;
    fb_fault_resolve(&c->fault, &m->fault, &s);
    assert_int_equal(s.abort_percent, 30);
    assert_int_equal(s.abort_status, 503);
    const conf_model_t *o = conf_model_find(c, "other");
    assert_int_equal(o->queue, CONF_QUEUE_INHERIT);
    fb_fault_resolve(&c->fault, &o->fault, &s);
    assert_int_equal(s.abort_percent, 0);

    /* the objects build from it */
    fb_tmpl_t *t = fb_tmpl_new(&f->tmpl);
    assert_non_null(t);
    assert_string_equal(fb_tmpl_pick(t, "en-US", 5, NULL),
                        "The network is not stable right now, please try again shortly.");
    fb_tmpl_free(t);
    fb_budget_free(fb_budget_new(&f->retry, "main"));
    fb_breaker_free(fb_breaker_new(&f->circuit, "main", "http://127.0.0.1:8000"));
    conf_free(c);
}

static void test_defaults(void **state)
{
    (void)state;
    char err[512];
    conf_t *c = load("", err, sizeof(err));
    assert_non_null(c);
    assert_string_equal(c->fallback.tmpl.text, "我现在网络不太顺畅，稍后再试试吧。");
    assert_false(c->fallback.queue.enabled);
    assert_null(c->fallback.local.upstream);
    assert_int_equal(c->fault.abort_percent, 0);
    assert_int_equal(c->fault.delay_ms, 0);
    conf_free(c);
}

static void expect_error(const char *extra, const char *want)
{
    char err[512];
    conf_t *c = load(extra, err, sizeof(err));
    if (c)
        fail_msg("accepted: %s", extra);
    if (!strstr(err, want))
        fail_msg("error \"%s\" lacks \"%s\"", err, want);
}

static void test_errors(void **state)
{
    (void)state;
    expect_error("fallback: { local: { upstream: nope } }\n",
                 "fallback.local.upstream: no upstream named \"nope\"");
    expect_error("fallback: { queue: { store: redis } }\n", "redis needs redis.url");
    expect_error("fallback: { retry: { backoff: 5s, backoff_max: 1s } }\n",
                 "fallback.retry.backoff: longer than backoff_max");
    expect_error("fallback: { queue: { backoff: 10m, backoff_max: 1m } }\n",
                 "fallback.queue.backoff: longer than backoff_max");
    expect_error("fallback: { retry: { budget_percent: 101 } }\n", "budget_percent");
    expect_error("fault: { abort_status: 200 }\n", "abort_status");
    expect_error("fault: { abort_percent: 150 }\n", "abort_percent");
    expect_error("models: { m: { upstream: main, fault: { abort_status: 302 } } }\n",
                 "abort_status: expected 400..599");
    expect_error("models: { m: { upstream: main, queue: maybe } }\n", "queue");
    expect_error("fallback: { template: { texts: [ a ] } }\n", "texts");
    expect_error("fallback: { surprise: 1 }\n", "surprise");
    char err[512];
    conf_t *c = load("redis: { url: \"redis://127.0.0.1:6379\" }\n"
                     "fallback: { queue: { store: redis, enabled: true } }\n",
                     err, sizeof(err));
    if (!c)
        fail_msg("%s", err);
    assert_int_equal(c->fallback.queue.store, CONF_QUEUE_STORE_REDIS);
    conf_free(c);
}

static void test_reload_flags(void **state)
{
    (void)state;
    char err[512];
    conf_t *a = load("fallback: { queue: { dir: var/q1 } }\n", err, sizeof(err));
    conf_t *b = load("fallback: { queue: { dir: var/q2 } }\n", err, sizeof(err));
    assert_int_equal(conf_reload_check(a, b, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "fallback.queue.dir"));
    conf_free(b);
    b = load("fallback: { template: { text: other }, retry: { attempts: 2 } }\n"
             "fault: { abort_percent: 5 }\n",
             err, sizeof(err));
    assert_int_equal(conf_reload_check(a, b, err, sizeof(err)), -1); /* the queue dir differs */
    conf_free(a);
    a = load("fallback: { queue: { dir: var/queue } }\n", err, sizeof(err));
    if (conf_reload_check(a, b, err, sizeof(err)) != 0)
        fail_msg("template/retry/fault should reload: %s", err);
    conf_free(a);
    conf_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_issue_shape),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_reload_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
