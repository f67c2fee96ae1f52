/*
 * Unit tests of ratelimit/ with an injected clock: the GCRA arithmetic
 * (burst, spacing, refill, window edges, long idle), the in-process store
 * through rl_check (overrides, concurrency, token budgets with reserve /
 * settle / release, all-or-nothing, idle expiry and the size cap), per-IP
 * keys, the conf section, and the 429's headers and body.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/metrics.h"
#include "conf/conf.h"
#include "ratelimit/ratelimit.h"

#define S  1000000000LL
#define MS 1000000LL

static int64_t now_ns;
static int64_t clock_fn(void *arg)
{
    (void)arg;
    return now_ns;
}

/* ---- pure GCRA ---------------------------------------------------------------- */

static void test_gcra_burst_and_spacing(void **state)
{
    (void)state;
    int64_t tat = 0, t0 = 1000 * S;
    rl_gcra_result_t r;
    for (int i = 0; i < 10; i++) {
        rl_gcra_take(&tat, t0, 10, RL_MINUTE_NS, 1, &r);
        assert_true(r.allowed);
        assert_int_equal(r.remaining, 9 - i);
    }
    assert_int_equal(r.reset_ns, 60 * S);
    rl_gcra_take(&tat, t0, 10, RL_MINUTE_NS, 1, &r);
    assert_false(r.allowed);
    assert_int_equal(r.retry_ns, 6 * S); /* one every 6 s */
    assert_int_equal(r.remaining, 0);
    /* right to the nanosecond: just before is still refused */
    rl_gcra_take(&tat, t0 + 6 * S - 1, 10, RL_MINUTE_NS, 1, &r);
    assert_false(r.allowed);
    assert_int_equal(r.retry_ns, 1);
    rl_gcra_take(&tat, t0 + 6 * S, 10, RL_MINUTE_NS, 1, &r);
    assert_true(r.allowed);
    assert_int_equal(r.remaining, 0);
    /* refill: 30 s later 5 are back */
    rl_gcra_peek(tat, t0 + 36 * S, 10, RL_MINUTE_NS, &r);
    assert_int_equal(r.remaining, 5);
    /* long idle: a day later the whole burst, and no more */
    int64_t t1 = t0 + 86400 * S;
    for (int i = 0; i < 10; i++) {
        rl_gcra_take(&tat, t1, 10, RL_MINUTE_NS, 1, &r);
        assert_true(r.allowed);
    }
    rl_gcra_take(&tat, t1, 10, RL_MINUTE_NS, 1, &r);
    assert_false(r.allowed);
}

/* The fixed-window attack: a full burst just before a minute's edge and
 * another just after. GCRA lets the second one through only at the rate. */
static void test_gcra_no_double_burst(void **state)
{
    (void)state;
    int64_t tat = 0;
    rl_gcra_result_t r;
    int a = 0, b = 0;
    for (int i = 0; i < 10; i++) {
        rl_gcra_take(&tat, 59 * S + 900 * MS, 10, RL_MINUTE_NS, 1, &r);
        a += r.allowed;
    }
    for (int i = 0; i < 10; i++) {
        rl_gcra_take(&tat, 60 * S + 100 * MS, 10, RL_MINUTE_NS, 1, &r);
        b += r.allowed;
    }
    assert_int_equal(a, 10);
    assert_int_equal(b, 0);

    /* A flood every 100 ms for 10 minutes: the burst, then one every 6 s;
     * after the first minute no 60 s window holds more than 10. */
    tat = 0;
    static int64_t times[1000];
    int n = 0;
    for (int64_t t = 0; t < 600 * S; t += 100 * MS) {
        rl_gcra_take(&tat, t, 10, RL_MINUTE_NS, 1, &r);
        if (r.allowed)
            times[n++] = t;
    }
    assert_int_equal(n, 10 + 99);
    for (int i = 0; i < n; i++) {
        if (times[i] < 60 * S)
            continue;
        int in = 0;
        for (int j = i; j < n && times[j] < times[i] + 60 * S; j++)
            in++;
        assert_true(in <= 10);
    }
}

static void test_gcra_costs_and_adjust(void **state)
{
    (void)state;
    int64_t tat = 0, t0 = 10 * S;
    rl_gcra_result_t r;
    rl_gcra_take(&tat, t0, 1000, RL_MINUTE_NS, 600, &r);
    assert_true(r.allowed);
    assert_int_equal(r.remaining, 400);
    rl_gcra_take(&tat, t0, 1000, RL_MINUTE_NS, 600, &r);
    assert_false(r.allowed);
    assert_int_equal(r.retry_ns, 200 * 60 * MS); /* 200 tokens at 60 ms each */
    rl_gcra_take(&tat, t0, 1000, RL_MINUTE_NS, 1001, &r);
    assert_false(r.allowed);
    assert_int_equal(r.retry_ns, -1);
    /* refund 500 of the 600 */
    rl_gcra_adjust(&tat, t0, 1000, RL_MINUTE_NS, 500);
    rl_gcra_peek(tat, t0, 1000, RL_MINUTE_NS, &r);
    assert_int_equal(r.remaining, 900);
    /* refund more than taken: full, not above */
    rl_gcra_adjust(&tat, t0, 1000, RL_MINUTE_NS, 5000);
    rl_gcra_peek(tat, t0, 1000, RL_MINUTE_NS, &r);
    assert_int_equal(r.remaining, 1000);
    assert_int_equal(r.reset_ns, 0);
    /* a charge can go into debt (capped at a few periods) */
    rl_gcra_adjust(&tat, t0, 1000, RL_MINUTE_NS, -1500);
    rl_gcra_take(&tat, t0 + 30 * S, 1000, RL_MINUTE_NS, 1, &r);
    assert_false(r.allowed);
    assert_int_equal(r.retry_ns, 90 * S - 30 * S - 60 * S + 60 * MS);
    rl_gcra_adjust(&tat, t0, 1000, RL_MINUTE_NS, -1000000000000LL);
    rl_gcra_peek(tat, t0, 1000, RL_MINUTE_NS, &r);
    assert_true(r.reset_ns <= 5 * RL_MINUTE_NS);
}

/* ---- the limiter, in process ------------------------------------------------------- */

static conf_ratelimit_t base_conf(void)
{
    conf_ratelimit_t c;
    memset(&c, 0, sizeof(c));
    c.per_user.requests_per_minute = 10;
    c.per_ip.requests_per_minute = 60;
    c.max_tokens = 2048;
    c.max_keys = 100000;
    return c;
}

static rl_t *mk(const conf_ratelimit_t *c)
{
    char err[256] = "";
    rl_t *rl = rl_new(c, NULL, err, sizeof(err));
    if (!rl)
        fail_msg("rl_new: %s", err);
    rl_set_clock(rl, clock_fn, NULL);
    return rl;
}

/* A synchronous check (in-process answers RL_DONE). */
static bool chk(rl_worker_t *w, const char *user, const char *client, const char *ip,
                int64_t tokens, rl_decision_t *d, rl_ticket_t **t)
{
    rl_request_t req = {.user = user, .client = client, .ip = ip, .tokens = tokens};
    rl_ticket_t *tk = NULL;
    rl_check_rc_t rc = rl_check(w, &req, d, &tk, NULL, NULL, NULL);
    assert_int_equal(rc, RL_DONE);
    if (d->allowed)
        assert_non_null(tk);
    else
        assert_null(tk);
    if (t)
        *t = tk;
    else
        rl_ticket_settle(tk, tokens);
    return d->allowed;
}

static uint64_t limited(const char *name)
{
    sl_metric_t *m =
        sl_metric_register("sluice_ratelimited_total", "", SL_METRIC_COUNTER, "limit", NULL, 0);
    return sl_counter_value(sl_metric_series1(m, name));
}

static void test_requests_and_retry_after(void **state)
{
    (void)state;
    conf_ratelimit_t c = base_conf();
    rl_t *rl = mk(&c);
    char err[128];
    rl_worker_t *w = rl_worker_new(rl, NULL, err, sizeof(err));
    now_ns = 5000 * S + 250 * MS;
    rl_decision_t d;
    uint64_t l0 = limited("requests_per_minute");
    for (int i = 0; i < 10; i++) {
        assert_true(chk(w, "alice", NULL, NULL, 0, &d, NULL));
        assert_int_equal(d.limit, RL_LIMIT_REQUESTS);
        assert_int_equal(d.limit_value, 10);
        assert_int_equal(d.remaining, 9 - i);
    }
    assert_true(chk(w, "bob", NULL, NULL, 0, &d, NULL)); /* another user is served */
    now_ns += 1500 * MS;
    assert_false(chk(w, "alice", NULL, NULL, 0, &d, NULL));
    assert_int_equal(d.limit, RL_LIMIT_REQUESTS);
    assert_int_equal(d.retry_after_ms, 4500);
    assert_int_equal(limited("requests_per_minute"), l0 + 1);
    char h[256];
    int n = rl_format_headers(&d, h, sizeof(h));
    assert_true(n > 0);
    assert_string_equal(h, "X-RateLimit-Limit: 10\r\nX-RateLimit-Remaining: 0\r\n"
                           "X-RateLimit-Reset: 59\r\nRetry-After: 5\r\n");
    assert_int_equal(rl_decision_status(&d), 429);
    /* Retry-After is right to the second: 4 s later still refused, 5 s later served */
    now_ns += 4 * S;
    assert_false(chk(w, "alice", NULL, NULL, 0, &d, NULL));
    now_ns += 1 * S;
    assert_true(chk(w, "alice", NULL, NULL, 0, &d, NULL));
    /* headers of a success */
    n = rl_format_headers(&d, h, sizeof(h));
    assert_string_equal(h, "X-RateLimit-Limit: 10\r\nX-RateLimit-Remaining: 0\r\n"
                           "X-RateLimit-Reset: 60\r\n");
    assert_int_equal(rl_format_headers(&d, h, 10), -1);
    rl_worker_free(w);
    rl_free(rl);
}

/* sl_i64toa (every x-ratelimit-* number goes through it) against snprintf:
 * each power of ten and its neighbours, both signs, the extremes, and
 * random values of every length. */
static void test_i64toa_against_snprintf(void **state)
{
    (void)state;
    char got[32], want[32];
    int64_t v[200];
    size_t nv = 0;
    v[nv++] = INT64_MAX;
    v[nv++] = INT64_MIN;
    v[nv++] = INT64_MIN + 1;
    for (int64_t p = 1; nv + 6 <= 80; p *= 10) {
        int64_t e[] = {p - 1, p, p + 1, -(p - 1), -p, -(p + 1)};
        for (int i = 0; i < 6; i++)
            v[nv++] = e[i];
        if (p > INT64_MAX / 10)
            break;
    }
    unsigned seed = 64;
    for (int round = 0; round < 100000; round++) {
        int64_t x = round < (int)nv
                        ? v[round]
                        : (int64_t)(((uint64_t)rand_r(&seed) << 42) ^
                                    ((uint64_t)rand_r(&seed) << 21) ^ (uint64_t)rand_r(&seed)) >>
                              (rand_r(&seed) % 64);
        if (round >= (int)nv && rand_r(&seed) % 2)
            x = -x;
        size_t n = sl_i64toa(x, got);
        snprintf(want, sizeof want, "%lld", (long long)x);
        assert_string_equal(got, want);
        assert_int_equal(n, strlen(want));
    }
}

static void test_error_body(void **state)
{
    (void)state;
    rl_decision_t d = {.allowed = false,
                       .limit = RL_LIMIT_TOKENS_DAY,
                       .limit_value = 200000,
                       .retry_after_ms = 7201500};
    size_t len = 0;
    char *b = rl_error_body(&d, &len);
    assert_non_null(b);
    assert_int_equal(strlen(b), len);
    json_t *j = json_loads(b, 0, NULL);
    assert_non_null(j);
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "rate_limit_error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "rate_limit_exceeded");
    assert_string_equal(json_string_value(json_object_get(e, "limit")), "tokens_per_day");
    assert_true(json_is_null(json_object_get(e, "param")));
    const char *msg = json_string_value(json_object_get(e, "message"));
    assert_non_null(strstr(msg, "tokens_per_day"));
    assert_non_null(strstr(msg, "7202s"));
    json_decref(j);
    free(b);
    d.limit = RL_LIMIT_STORE;
    assert_int_equal(rl_decision_status(&d), 503);
    b = rl_error_body(&d, NULL);
    j = json_loads(b, 0, NULL);
    assert_non_null(j);
    e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "server_error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "store_unavailable");
    assert_string_equal(json_string_value(json_object_get(e, "limit")), "store_unavailable");
    json_decref(j);
    free(b);
}

static void test_overrides(void **state)
{
    (void)state;
    conf_ratelimit_t c = base_conf();
    c.per_user.concurrent = 4;
    conf_rl_override_t o[3] = {
        {.name = "vip-user", .limits = {100, -1, -1, -1}},
        {.name = "client:ios", .limits = {20, 1, -1, -1}},
        {.name = "unlimited", .limits = {0, 0, -1, -1}},
    };
    c.overrides = o;
    c.noverrides = 3;
    rl_t *rl = mk(&c);
    rl_limits_t l;
    rl_limits_for(rl, "vip-user", "ios", &l); /* the user's beats the client's */
    assert_int_equal(l.requests_per_minute, 100);
    assert_int_equal(l.concurrent, 4); /* not set: per_user's */
    rl_limits_for(rl, "someone", "ios", &l);
    assert_int_equal(l.requests_per_minute, 20);
    assert_int_equal(l.concurrent, 1);
    rl_limits_for(rl, "someone", "android", &l);
    assert_int_equal(l.requests_per_minute, 10);
    rl_limits_for(rl, NULL, NULL, &l);
    assert_int_equal(l.requests_per_minute, 60);
    assert_int_equal(l.concurrent, 0);

    char err[128];
    rl_worker_t *w = rl_worker_new(rl, NULL, err, sizeof(err));
    now_ns = 100 * S;
    rl_decision_t d;
    int ok = 0;
    for (int i = 0; i < 150; i++)
        ok += chk(w, "vip-user", NULL, NULL, 0, &d, NULL);
    assert_int_equal(ok, 100);
    ok = 0;
    for (int i = 0; i < 500; i++)
        ok += chk(w, "unlimited", NULL, NULL, 0, &d, NULL);
    assert_int_equal(ok, 500);
    assert_int_equal(d.limit, RL_LIMIT_NONE);
    char h[64];
    assert_int_equal(rl_format_headers(&d, h, sizeof(h)), 0); /* nothing to say */

    /* a duplicate override is refused */
    conf_rl_override_t dup[2] = {{.name = "x", .limits = {1, -1, -1, -1}},
                                 {.name = "x", .limits = {2, -1, -1, -1}}};
    c.overrides = dup;
    c.noverrides = 2;
    assert_null(rl_new(&c, NULL, err, sizeof(err)));
    rl_worker_free(w);
    rl_free(rl);
}

static void test_concurrency(void **state)
{
    (void)state;
    conf_ratelimit_t c = base_conf();
    c.per_user.requests_per_minute = 0;
    c.per_user.concurrent = 2;
    rl_t *rl = mk(&c);
    char err[128];
    rl_worker_t *w = rl_worker_new(rl, NULL, err, sizeof(err));
    now_ns = 7 * S;
    rl_decision_t d;
    rl_ticket_t *a, *b, *x;
    assert_true(chk(w, "u", NULL, NULL, 0, &d, &a));
    assert_true(chk(w, "u", NULL, NULL, 0, &d, &b));
    assert_false(chk(w, "u", NULL, NULL, 0, &d, &x));
    assert_int_equal(d.limit, RL_LIMIT_CONCURRENT);
    assert_int_equal(d.retry_after_ms, 1000);
    rl_ticket_release(a);
    assert_true(chk(w, "u", NULL, NULL, 0, &d, &a));
    rl_ticket_settle(a, 0);
    rl_ticket_settle(b, 0);
    assert_true(chk(w, "u", NULL, NULL, 0, &d, &a));
    assert_true(chk(w, "u", NULL, NULL, 0, &d, &b));
    rl_ticket_settle(a, 0);
    rl_ticket_settle(b, 0);
    rl_worker_free(w);
    rl_free(rl);
}

/* A worker keeps settled tickets for its next checks (rl_ticket_get): a
 * reused one carries nothing of its last check. Here the reused ticket is
 * one that held a slot of "u" with a reservation; the next check has no key
 * (nothing to count): a stale key or limits would count it against "u"
 * and reserve its tokens. */
static void test_ticket_reuse(void **state)
{
    (void)state;
    conf_ratelimit_t c = base_conf();
    c.per_user.requests_per_minute = 0;
    c.per_user.concurrent = 2;
    c.per_user.tokens_per_minute = 100000;
    rl_t *rl = mk(&c);
    char err[128];
    rl_worker_t *w = rl_worker_new(rl, NULL, err, sizeof(err));
    now_ns = 11 * S;
    rl_decision_t d;
    rl_ticket_t *a, *b, *x;
    assert_true(chk(w, "u", NULL, NULL, 500, &d, &a));
    assert_true(chk(w, "u", NULL, NULL, 500, &d, &b));
    assert_int_equal(rl_ticket_reserved(b), 500);
    rl_ticket_settle(b, 500); /* b is a spare now; a still holds a slot */
    /* no user, no address: nothing to count, nothing reserved */
    rl_request_t req = {.tokens = 7};
    assert_int_equal(rl_check(w, &req, &d, &x, NULL, NULL, NULL), RL_DONE);
    assert_true(d.allowed);
    assert_int_equal(d.limit, RL_LIMIT_NONE);
    assert_int_equal(rl_ticket_reserved(x), 0);
    rl_ticket_settle(x, 0);
    /* "u" still holds a's slot: one more, then refused */
    assert_true(chk(w, "u", NULL, NULL, 0, &d, &b));
    assert_false(chk(w, "u", NULL, NULL, 0, &d, &x));
    assert_int_equal(d.limit, RL_LIMIT_CONCURRENT);
    /* many in flight: more than the worker keeps, all given back */
    rl_ticket_t *many[100];
    rl_ticket_settle(b, 0);
    rl_ticket_settle(a, 0);
    for (int i = 0; i < 100; i++) {
        char u[16];
        snprintf(u, sizeof(u), "v%d", i);
        assert_true(chk(w, u, NULL, NULL, 1, &d, &many[i]));
        assert_int_equal(rl_ticket_reserved(many[i]), 1);
    }
    for (int i = 0; i < 100; i++)
        rl_ticket_settle(many[i], 1);
    assert_true(chk(w, "u", NULL, NULL, 0, &d, &a));
    assert_true(chk(w, "u", NULL, NULL, 0, &d, &b));
    rl_ticket_settle(a, 0);
    rl_ticket_settle(b, 0);
    rl_worker_free(w);
    rl_free(rl);
}

static void test_budgets(void **state)
{
    (void)state;
    conf_ratelimit_t c = base_conf();
    c.per_user.requests_per_minute = 1000;
    c.per_user.tokens_per_minute = 1000;
    c.per_user.tokens_per_day = 3000;
    rl_t *rl = mk(&c);
    char err[128];
    rl_worker_t *w = rl_worker_new(rl, NULL, err, sizeof(err));
    now_ns = 1000 * S;
    rl_decision_t d;
    rl_ticket_t *a, *b;
    /* reserve 600, then another 600 does not fit: refused before it starts */
    assert_true(chk(w, "u", NULL, NULL, 600, &d, &a));
    assert_int_equal(rl_ticket_reserved(a), 600);
    assert_false(chk(w, "u", NULL, NULL, 600, &d, &b));
    assert_int_equal(d.limit, RL_LIMIT_TOKENS_MINUTE);
    assert_int_equal(d.retry_after_ms, 12000); /* 200 tokens at 60 ms each */
    assert_int_equal(d.remaining, 400);
    /* the refused request took nothing: requests_per_minute untouched */
    assert_true(chk(w, "u", NULL, NULL, 0, &d, &b));
    assert_int_equal(d.limit, RL_LIMIT_REQUESTS);
    assert_int_equal(d.remaining, 998);
    rl_ticket_settle(b, 0);
    /* settle the first with 100 used: 500 refunded, so 600 fits now */
    rl_ticket_settle(a, 100);
    assert_true(chk(w, "u", NULL, NULL, 600, &d, &a));
    /* release (failed upstream): all 600 back */
    rl_ticket_release(a);
    assert_true(chk(w, "u", NULL, NULL, 900, &d, &a));
    /* usage above the reservation is charged */
    rl_ticket_settle(a, 950);
    assert_false(chk(w, "u", NULL, NULL, 100, &d, &b));
    assert_int_equal(d.limit, RL_LIMIT_TOKENS_MINUTE);
    /* a request larger than the whole budget can never fit */
    now_ns += 3600 * S;
    assert_false(chk(w, "u", NULL, NULL, 1001, &d, &b));
    assert_int_equal(d.retry_after_ms, -1);
    char h[256];
    assert_true(rl_format_headers(&d, h, sizeof(h)) > 0);
    assert_null(strstr(h, "Retry-After"));
    char *body = rl_error_body(&d, NULL);
    assert_non_null(strstr(body, "never fit"));
    free(body);
    /* the day budget: 3000 a rolling day; 100 + 150 + 950 + 1000*... used */
    now_ns += 3600 * S;
    int ok = 0;
    for (int i = 0; i < 10; i++) {
        now_ns += 61 * S; /* the minute budget is never the limit */
        if (chk(w, "u", NULL, NULL, 1000, &d, NULL))
            ok++;
        else
            break;
    }
    assert_int_equal(d.limit, RL_LIMIT_TOKENS_DAY);
    assert_true(ok >= 1 && ok <= 2);
    /* when two limits refuse, the answer is the longer wait */
    assert_false(chk(w, "u", NULL, NULL, 1000, &d, NULL));
    assert_int_equal(d.limit, RL_LIMIT_TOKENS_DAY);
    assert_true(d.retry_after_ms > 60000);
    rl_worker_free(w);
    rl_free(rl);
}

static void test_ip_keys(void **state)
{
    (void)state;
    conf_ratelimit_t c = base_conf();
    c.per_ip.requests_per_minute = 2;
    rl_t *rl = mk(&c);
    char err[128];
    rl_worker_t *w = rl_worker_new(rl, NULL, err, sizeof(err));
    now_ns = 50 * S;
    rl_decision_t d;
    assert_true(chk(w, NULL, NULL, "192.0.2.1", 500, &d, NULL));
    assert_int_equal(d.limit, RL_LIMIT_IP_REQUESTS);
    assert_true(chk(w, NULL, NULL, "192.0.2.1", 0, &d, NULL));
    assert_false(chk(w, NULL, NULL, "192.0.2.1", 0, &d, NULL));
    assert_int_equal(d.limit, RL_LIMIT_IP_REQUESTS);
    assert_int_equal(d.retry_after_ms, 30000);
    assert_true(chk(w, NULL, NULL, "192.0.2.2", 0, &d, NULL));
    /* one /64 is one client */
    assert_true(chk(w, NULL, NULL, "2001:db8:1:2::1", 0, &d, NULL));
    assert_true(chk(w, NULL, NULL, "2001:db8:1:2:ffff::9", 0, &d, NULL));
    assert_false(chk(w, NULL, NULL, "2001:db8:1:2:aaaa:bbbb:cccc:dddd", 0, &d, NULL));
    assert_true(chk(w, NULL, NULL, "2001:db8:1:3::1", 0, &d, NULL));
    /* neither user nor address: nothing to key on, allowed */
    assert_true(chk(w, NULL, NULL, NULL, 0, &d, NULL));
    rl_worker_free(w);
    rl_free(rl);
}

static void test_memory_bounds(void **state)
{
    (void)state;
    conf_ratelimit_t c = base_conf();
    c.max_keys = 64 * 4;
    rl_t *rl = mk(&c);
    char err[128];
    rl_worker_t *w = rl_worker_new(rl, NULL, err, sizeof(err));
    now_ns = 10 * S;
    rl_decision_t d;
    char u[32];
    /* the cap is the whole table's: exactly max_keys live keys fit, the
     * rest are refused (never evicted: test_ratelimit_keys.c has more) */
    int allowed = 0;
    for (int i = 0; i < 5000; i++) {
        snprintf(u, sizeof(u), "user-%d", i);
        allowed += chk(w, u, NULL, NULL, 0, &d, NULL);
    }
    assert_int_equal(allowed, 256);
    assert_int_equal(rl_mem_keys(rl), 256);
    rl_worker_free(w);
    rl_free(rl);

    /* idle keys go away: 1000 keys, a minute of quiet, then 300 new ones */
    c.max_keys = 100000;
    rl = mk(&c);
    w = rl_worker_new(rl, NULL, err, sizeof(err));
    for (int i = 0; i < 1000; i++) {
        snprintf(u, sizeof(u), "old-%d", i);
        assert_true(chk(w, u, NULL, NULL, 0, &d, NULL));
    }
    assert_int_equal(rl_mem_keys(rl), 1000);
    now_ns += 7 * S; /* one request at 10/min is forgotten after 6 s */
    for (int i = 0; i < 3000; i++) {
        snprintf(u, sizeof(u), "new-%d", i);
        assert_true(chk(w, u, NULL, NULL, 0, &d, NULL));
    }
    /* each access drops up to two idle keys at the LRU end of its stripe */
    assert_int_equal(rl_mem_keys(rl), 3000);
    rl_worker_free(w);
    rl_free(rl);
    /* long keys are hashed, still distinct and still limited */
    c.per_user.requests_per_minute = 1;
    rl = mk(&c);
    w = rl_worker_new(rl, NULL, err, sizeof(err));
    char big1[1000], big2[1000];
    memset(big1, 'a', sizeof(big1) - 1);
    big1[sizeof(big1) - 1] = '\0';
    memcpy(big2, big1, sizeof(big1));
    big2[500] = 'b';
    assert_true(chk(w, big1, NULL, NULL, 0, &d, NULL));
    assert_false(chk(w, big1, NULL, NULL, 0, &d, NULL));
    assert_true(chk(w, big2, NULL, NULL, 0, &d, NULL));
    rl_worker_free(w);
    rl_free(rl);
}

static void test_from_conf(void **state)
{
    (void)state;
    const char *y =
        "listen: [{address: \"127.0.0.1:8080\"}]\n"
        "upstreams: {main: {servers: [{url: \"http://127.0.0.1:8000\"}]}}\n"
        "models: {m: {upstream: main}}\n"
        "ratelimit:\n"
        "  per_user: { requests_per_minute: 10, concurrent: 4, tokens_per_minute: 20000, "
        "tokens_per_day: 200000 }\n"
        "  per_ip:   { requests_per_minute: 60 }\n"
        "  max_tokens: 2048\n"
        "  on_store_error: allow\n"
        "  overrides: { \"vip-user\": { requests_per_minute: 100 } }\n"
        "  trusted_proxies: [10.0.0.0/8]\n";
    char err[256];
    conf_t *conf = conf_load_string(y, strlen(y), "t.yaml", err, sizeof(err));
    if (!conf)
        fail_msg("%s", err);
    rl_t *rl = rl_new(&conf->ratelimit, &conf->redis, err, sizeof(err));
    assert_non_null(rl);
    rl_limits_t l;
    rl_limits_for(rl, "vip-user", NULL, &l);
    assert_int_equal(l.requests_per_minute, 100);
    assert_int_equal(l.tokens_per_minute, 20000);
    assert_int_equal(l.tokens_per_day, 200000);
    assert_true(rl_proxies_contains(rl_trusted_proxies(rl), "10.1.2.3"));
    assert_false(rl_proxies_contains(rl_trusted_proxies(rl), "11.1.2.3"));
    rl_free(rl);
    conf_free(conf);
}

/* A reload builds a new policy while the limiter's state stays: a user's
 * used share of the bucket is kept under the new limit, a new override
 * applies, and a ticket taken under the old policy settles after it is gone. */
static void test_policy_swap_keeps_state(void **state)
{
    (void)state;
    conf_ratelimit_t c = base_conf();
    c.per_user.concurrent = 2;
    rl_t *rl = mk(&c);
    char err[128];
    rl_worker_t *w = rl_worker_new(rl, NULL, err, sizeof(err));
    assert_non_null(w);
    now_ns = 9000 * S;
    rl_decision_t d;
    assert_true(chk(w, "alice", NULL, NULL, 0, &d, NULL));
    rl_ticket_t *held = NULL;
    assert_true(chk(w, "alice", NULL, NULL, 0, &d, &held)); /* 2 of 10 used: 12 s of 60 */
    conf_ratelimit_t c2 = base_conf();
    c2.per_user.requests_per_minute = 4; /* 15 s a request */
    c2.per_user.concurrent = 2;
    conf_rl_override_t o = {.name = "bob", .limits = {100, -1, -1, -1}};
    c2.overrides = &o;
    c2.noverrides = 1;
    rl_policy_t *p2 = rl_policy_new(&c2, err, sizeof(err));
    assert_non_null(p2);
    rl_request_t req = {.policy = p2, .user = "alice"};
    rl_ticket_t *t = NULL;
    assert_int_equal(rl_check(w, &req, &d, &t, NULL, NULL, NULL), RL_DONE);
    assert_true(d.allowed);
    assert_int_equal(d.limit_value, 4);
    assert_int_equal(d.remaining, 2); /* (60 - 12 - 15) / 15; a reset bucket: 3 */
    rl_ticket_settle(t, 0);
    /* the held slot counts under the new policy too: concurrent 2 */
    rl_ticket_t *t2 = NULL;
    now_ns += 60 * S;
    assert_int_equal(rl_check(w, &req, &d, &t2, NULL, NULL, NULL), RL_DONE);
    assert_true(d.allowed);
    assert_int_equal(rl_check(w, &req, &d, &t, NULL, NULL, NULL), RL_DONE);
    assert_false(d.allowed);
    assert_null(t);
    rl_ticket_settle(t2, 0);
    assert_int_equal(d.limit, RL_LIMIT_CONCURRENT);
    rl_limits_t l;
    rl_policy_limits_for(p2, "bob", NULL, &l);
    assert_int_equal(l.requests_per_minute, 100);
    assert_int_equal(l.concurrent, 2);  /* -1: per_user's */
    rl_limits_for(rl, "bob", NULL, &l); /* rl_new's own policy is unchanged */
    assert_int_equal(l.requests_per_minute, 10);
    rl_policy_free(p2); /* the old runtime goes: its tickets still settle */
    rl_ticket_settle(held, 0);
    rl_policy_free(NULL);
    rl_worker_free(w);
    rl_free(rl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gcra_burst_and_spacing),
        cmocka_unit_test(test_gcra_no_double_burst),
        cmocka_unit_test(test_gcra_costs_and_adjust),
        cmocka_unit_test(test_requests_and_retry_after),
        cmocka_unit_test(test_i64toa_against_snprintf),
        cmocka_unit_test(test_error_body),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_concurrency),
        cmocka_unit_test(test_ticket_reuse),
        cmocka_unit_test(test_budgets),
        cmocka_unit_test(test_ip_keys),
        cmocka_unit_test(test_memory_bounds),
        cmocka_unit_test(test_from_conf),
        cmocka_unit_test(test_policy_swap_keeps_state),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
