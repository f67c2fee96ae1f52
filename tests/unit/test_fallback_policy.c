/*
 * The pure policies of fallback/: retry classification, backoff and
 * Retry-After, the retry budget (a simulated 50% and 100% 503 storm must
 * stay at <= 1.2 upstream requests per client request, single-threaded and
 * with threads sharing the budget), the circuit breaker's transitions, and
 * fault-injection decisions and header syntax. Injected clocks throughout.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/metrics.h"
#include "fallback/fallback.h"
#include "fallback/fb_internal.h"

static conf_fb_retry_t retry_conf(void)
{
    conf_fb_retry_t c = {.attempts = 1,
                         .backoff_ms = 100,
                         .backoff_max_ms = 2000,
                         .budget_percent = 20,
                         .budget_window_ms = 10000,
                         .budget_min = 0};
    return c;
}

static uint64_t xs(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* ---- classification, backoff, Retry-After -------------------------------- */

static void test_retryable(void **state)
{
    (void)state;
    fb_attempt_t a = {.failure = FB_FAIL_CONNECT};
    assert_true(fb_failure_retryable(&a));
    a.failure = FB_FAIL_FIRST_BYTE;
    assert_true(fb_failure_retryable(&a));
    a.failure = FB_FAIL_RESET;
    assert_true(fb_failure_retryable(&a));
    a.failure = FB_FAIL_OTHER;
    assert_false(fb_failure_retryable(&a));
    a.failure = FB_FAIL_STATUS;
    int yes[] = {500, 502, 503, 504, 599}, no[] = {200, 404, 429, 499, 501, 505, 600};
    for (size_t i = 0; i < SL_ARRAY_LEN(yes); i++) {
        a.status = yes[i];
        assert_true(fb_failure_retryable(&a));
    }
    for (size_t i = 0; i < SL_ARRAY_LEN(no); i++) {
        a.status = no[i];
        assert_false(fb_failure_retryable(&a));
    }
    a.status = 503;
    a.client_started = true;
    assert_false(fb_failure_retryable(&a));
}

static void test_backoff(void **state)
{
    (void)state;
    uint64_t s = 42;
    for (int n = 0; n < 8; n++) {
        int64_t full = SL_MIN(100LL << n, 2000);
        int64_t lo = INT64_MAX, hi = 0;
        for (int i = 0; i < 2000; i++) {
            int64_t d = fb_backoff_ms(100, 2000, n, xs(&s));
            assert_true(d >= full / 2 && d <= full);
            lo = SL_MIN(lo, d);
            hi = SL_MAX(hi, d);
        }
        /* jittered over the whole range, not a constant */
        assert_true(lo <= full / 2 + full / 20);
        assert_true(hi >= full - full / 20);
    }
    assert_int_equal(fb_backoff_ms(0, 2000, 3, 7), 0);
    assert_true(fb_backoff_ms(100, 2000, 60, 7) <= 2000); /* no overflow */
}

static void test_retry_after(void **state)
{
    (void)state;
    /* Sun, 06 Nov 1994 08:49:37 GMT = 784111777 */
    int64_t now = 784111777LL * 1000 - 30000; /* 30 s before */
    assert_int_equal(fb_retry_after_ms("120", now), 120000);
    assert_int_equal(fb_retry_after_ms(" 0 ", now), 0);
    assert_int_equal(fb_retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", now), 30000);
    assert_int_equal(fb_retry_after_ms("Sunday, 06-Nov-94 08:49:37 GMT", now), 30000);
    assert_int_equal(fb_retry_after_ms("Sun Nov  6 08:49:37 1994", now), 30000);
    assert_int_equal(fb_retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", now + 60000), 0);
    assert_int_equal(fb_retry_after_ms("soon", now), -1);
    assert_int_equal(fb_retry_after_ms("", now), -1);
    assert_int_equal(fb_retry_after_ms("-5", now), -1);
    assert_int_equal(fb_retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT trailing", now), -1);
    assert_true(fb_retry_after_ms("99999999999999999999", now) > 86400000LL * 365);
    assert_int_equal(fb_retry_after_ms(NULL, now), -1);
}

static void test_decide(void **state)
{
    (void)state;
    conf_fb_retry_t c = retry_conf();
    fb_retry_decision_t d;
    fb_attempt_t a = {.failure = FB_FAIL_STATUS, .status = 503, .other_server = true};
    fb_retry_decide(&c, NULL, &a, 1000, 0, 5, &d);
    assert_int_equal(d.verdict, FB_RETRY);
    assert_true(d.prefer_other);
    assert_true(d.delay_ms >= 50 && d.delay_ms <= 100);

    a.retries_done = 1;
    fb_retry_decide(&c, NULL, &a, 1000, 0, 5, &d);
    assert_int_equal(d.verdict, FB_NO_RETRY_ATTEMPTS);
    a.retries_done = 0;

    a.client_started = true;
    fb_retry_decide(&c, NULL, &a, 1000, 0, 5, &d);
    assert_int_equal(d.verdict, FB_NO_RETRY_STARTED);
    a.client_started = false;

    a.failure = FB_FAIL_OTHER;
    fb_retry_decide(&c, NULL, &a, 1000, 0, 5, &d);
    assert_int_equal(d.verdict, FB_NO_RETRY_KIND);
    a.failure = FB_FAIL_STATUS;

    /* Retry-After from the only server: honoured when short, refusal when long. */
    a.other_server = false;
    a.retry_after = "1";
    fb_retry_decide(&c, NULL, &a, 1000, 0, 5, &d);
    assert_int_equal(d.verdict, FB_RETRY);
    assert_int_equal(d.delay_ms, 1000);
    assert_false(d.prefer_other);
    a.retry_after = "3";
    fb_retry_decide(&c, NULL, &a, 1000, 0, 5, &d);
    assert_int_equal(d.verdict, FB_NO_RETRY_RETRY_AFTER);
    /* ... but another server does not wait for it */
    a.other_server = true;
    fb_retry_decide(&c, NULL, &a, 1000, 0, 5, &d);
    assert_int_equal(d.verdict, FB_RETRY);
    assert_true(d.delay_ms <= 100);

    /* deadline */
    a.retry_after = NULL;
    a.deadline_ms = 1050;
    fb_retry_decide(&c, NULL, &a, 1000, 0, UINT64_MAX, &d); /* delay 100 */
    assert_int_equal(d.verdict, FB_NO_RETRY_DEADLINE);
    a.deadline_ms = 5000;
    fb_retry_decide(&c, NULL, &a, 1000, 0, UINT64_MAX, &d);
    assert_int_equal(d.verdict, FB_RETRY);

    c.attempts = 0;
    fb_retry_decide(&c, NULL, &a, 1000, 0, 5, &d);
    assert_int_equal(d.verdict, FB_NO_RETRY_ATTEMPTS);
    assert_string_equal(fb_retry_verdict_name(FB_NO_RETRY_BUDGET), "budget");
}

/* ---- the budget --------------------------------------------------------------- */

static void test_budget_exact(void **state)
{
    (void)state;
    conf_fb_retry_t c = retry_conf();
    fb_budget_t *b = fb_budget_new(&c, "exact");
    int64_t t = 100000;
    assert_false(fb_budget_take(b, t)); /* no requests: no retries */
    for (int i = 0; i < 4; i++)
        fb_budget_on_request(b, t);
    assert_false(fb_budget_take(b, t)); /* 20% of 4 < 1 */
    fb_budget_on_request(b, t);
    assert_true(fb_budget_take(b, t)); /* 20% of 5 = 1 */
    assert_false(fb_budget_take(b, t));
    int64_t req, ret;
    fb_budget_counts(b, t, &req, &ret);
    assert_int_equal(req, 5);
    assert_int_equal(ret, 1);
    /* The window slides: 10 s later everything has aged out. */
    fb_budget_counts(b, t + 10000, &req, &ret);
    assert_int_equal(req, 0);
    assert_int_equal(ret, 0);
    fb_budget_counts(b, t + 9000, &req, &ret);
    assert_int_equal(req, 5);

    /* budget_min lets a quiet pool retry */
    c.budget_min = 2;
    fb_budget_configure(b, &c);
    int64_t t2 = t + 60000;
    fb_budget_on_request(b, t2);
    assert_true(fb_budget_take(b, t2));
    assert_true(fb_budget_take(b, t2));
    assert_false(fb_budget_take(b, t2));
    fb_budget_free(b);
}

/* A caller whose clock read is older than the window's latest add (it read
 * the clock, then waited for the owner's lock while another thread added)
 * must neither reset the newer bucket its stale time maps to nor read a
 * window that ends before it. Both happened before the window kept its
 * latest time, and let two threads retry past the budget. */
static void test_window_stale_clock(void **state)
{
    (void)state;
    fb_window_t w;
    fb_window_init(&w, 10000); /* ten 1 s buckets */
    int64_t a, b;
    fb_window_add(&w, 25000, 0, 1);   /* bucket 25, slot 5 */
    fb_window_sum(&w, 15000, &a, &b); /* stale: window 6..15 would miss it */
    assert_int_equal(b, 1);
    fb_window_add(&w, 15000, 1, 0); /* stale: slot 5 again, epoch 15 */
    fb_window_sum(&w, 25000, &a, &b);
    assert_int_equal(a, 1);
    assert_int_equal(b, 1); /* not reset by the stale add */
    /* a sum at a later time is a read only: the window stays */
    fb_window_sum(&w, 40000, &a, &b);
    assert_int_equal(a + b, 0);
    fb_window_sum(&w, 25999, &a, &b);
    assert_int_equal(a + b, 2);
    /* time moves on with the adds */
    fb_window_add(&w, 36000, 1, 0);
    fb_window_sum(&w, 25000, &a, &b);
    assert_int_equal(a, 1); /* only bucket 36's; 25 aged out */
    assert_int_equal(b, 0);
}

typedef struct storm {
    fb_budget_t *b;
    conf_fb_retry_t c;
    int fail_percent;
    int clients;
    _Atomic int64_t *clock; /* shared simulated time (ms) */
    uint64_t seed;
    int64_t upstream, client, retries, max_window_excess; /* retries/requests, 1/1000 */
} storm_t;

/* One client request: a first attempt, then retries while the policy says
 * so; each attempt fails with probability fail_percent. */
static void *storm_run(void *arg)
{
    storm_t *s = arg;
    uint64_t r = s->seed;
    for (int i = 0; i < s->clients; i++) {
        /* 200 client requests a second overall: 5 ms each */
        int64_t now = atomic_fetch_add(s->clock, 5);
        fb_budget_on_request(s->b, now);
        s->client++;
        int retries = 0;
        for (;;) {
            s->upstream++;
            bool fail = (int)(xs(&r) % 100) < s->fail_percent;
            if (!fail)
                break;
            fb_attempt_t a = {.failure = FB_FAIL_STATUS,
                              .status = 503,
                              .retries_done = retries,
                              .other_server = true};
            fb_retry_decision_t d;
            fb_retry_decide(&s->c, s->b, &a, now, 0, xs(&r), &d);
            if (d.verdict != FB_RETRY)
                break;
            retries++;
            s->retries++;
        }
        /* At every moment the window's retries stay near 20% of its
         * requests: each retry was checked against the window of its own
         * moment, so once the oldest bucket ages out at most that bucket's
         * share (20% of a tenth) can be over. In thousandths. */
        int64_t req, ret;
        fb_budget_counts(s->b, now, &req, &ret);
        if (req >= 100 && ret * 1000 / req > s->max_window_excess)
            s->max_window_excess = ret * 1000 / req;
    }
    return NULL;
}

static void storm_check(int fail_percent, int attempts, int threads)
{
    conf_fb_retry_t c = retry_conf();
    c.attempts = attempts;
    fb_budget_t *b = fb_budget_new(&c, "storm");
    _Atomic int64_t clock = 1000000;
    storm_t st[4];
    pthread_t th[4];
    for (int i = 0; i < threads; i++) {
        st[i] = (storm_t){.b = b,
                          .c = c,
                          .fail_percent = fail_percent,
                          .clients = 40000 / threads,
                          .clock = &clock,
                          .seed = 0x9E3779B97F4A7C15ULL * (uint64_t)(i + 1)};
        assert_int_equal(pthread_create(&th[i], NULL, storm_run, &st[i]), 0);
    }
    int64_t up = 0, cl = 0, re = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        up += st[i].upstream;
        cl += st[i].client;
        re += st[i].retries;
        if (st[i].max_window_excess > 225)
            fail_msg("a window held %lld/1000 retries per request",
                     (long long)st[i].max_window_excess);
    }
    double amp = (double)up / (double)cl;
    printf("  %d%% storm, attempts %d, %d thread(s): %lld client, %lld upstream, %.4f per "
           "client request\n",
           fail_percent, attempts, threads, (long long)cl, (long long)up, amp);
    assert_true(amp <= 1.2);
    /* The budget was used, not just never reached: without it a 50% storm
     * gives 1.5 (attempts 1) and more. */
    assert_true(amp >= 1.19);
    assert_int_equal(up, cl + re);
    fb_budget_free(b);
}

static void test_storm_50(void **state)
{
    (void)state;
    storm_check(50, 1, 1);
    storm_check(50, 3, 1);
}

static void test_storm_100(void **state)
{
    (void)state;
    storm_check(100, 1, 1);
    storm_check(100, 5, 1);
}

static void test_storm_threads(void **state)
{
    (void)state;
    storm_check(50, 1, 4);
    storm_check(100, 2, 2);
}

/* Below the budget the policy retries every retryable failure: 10% failing
 * gives ~1.1, not capped. */
static void test_storm_light(void **state)
{
    (void)state;
    conf_fb_retry_t c = retry_conf();
    fb_budget_t *b = fb_budget_new(&c, "light");
    _Atomic int64_t clock = 1000000;
    storm_t st = {
        .b = b, .c = c, .fail_percent = 10, .clients = 20000, .clock = &clock, .seed = 77};
    storm_run(&st);
    double amp = (double)st.upstream / (double)st.client;
    assert_true(amp > 1.08 && amp < 1.12);
    /* every failed first try was retried (none refused) */
    int64_t refused = (int64_t)(st.client * 0.1) - st.retries;
    assert_true(refused < st.client / 100);
    fb_budget_free(b);
}

/* ---- circuit breaker ------------------------------------------------------------- */

static conf_fb_circuit_t circuit_conf(void)
{
    conf_fb_circuit_t c = {.failures = 5,
                           .failure_percent = 50,
                           .min_requests = 20,
                           .window_ms = 10000,
                           .cooldown_ms = 30000,
                           .probes = 2};
    return c;
}

static int64_t gauge_of(const char *up, const char *srv)
{
    const char *l[2] = {up, srv};
    return sl_gauge_value(sl_metric_series(fb_m.circuit_state, l));
}

static void test_breaker_consecutive(void **state)
{
    (void)state;
    conf_fb_circuit_t c = circuit_conf();
    fb_breaker_t *b = fb_breaker_new(&c, "main", "http://a");
    int64_t t = 1000;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(fb_breaker_acquire(b, t), FB_ADMIT_YES);
        fb_breaker_report(b, FB_ADMIT_YES, false, t);
    }
    assert_int_equal(fb_breaker_failures(b), 4);
    /* a success resets the run */
    fb_breaker_report(b, FB_ADMIT_YES, true, t);
    assert_int_equal(fb_breaker_failures(b), 0);
    for (int i = 0; i < 4; i++)
        fb_breaker_report(b, FB_ADMIT_YES, false, t);
    assert_int_equal(fb_breaker_state(b, t), FB_CIRCUIT_CLOSED);
    fb_breaker_report(b, FB_ADMIT_YES, false, t);
    assert_int_equal(fb_breaker_state(b, t), FB_CIRCUIT_OPEN);
    assert_int_equal(gauge_of("main", "http://a"), FB_CIRCUIT_OPEN);
    assert_false(fb_breaker_eligible(b, t));
    assert_int_equal(fb_breaker_acquire(b, t + 29999), FB_ADMIT_NO);

    /* cooldown over: half-open, two probes and no more */
    int64_t h = t + 30000;
    assert_int_equal(fb_breaker_state(b, h), FB_CIRCUIT_HALF_OPEN);
    assert_int_equal(gauge_of("main", "http://a"), FB_CIRCUIT_HALF_OPEN);
    assert_true(fb_breaker_eligible(b, h));
    assert_int_equal(fb_breaker_acquire(b, h), FB_ADMIT_PROBE);
    assert_int_equal(fb_breaker_acquire(b, h), FB_ADMIT_PROBE);
    assert_int_equal(fb_breaker_acquire(b, h), FB_ADMIT_NO);
    assert_false(fb_breaker_eligible(b, h));
    /* a cancelled probe frees its slot */
    fb_breaker_cancel(b, FB_ADMIT_PROBE);
    assert_true(fb_breaker_eligible(b, h));
    assert_int_equal(fb_breaker_acquire(b, h), FB_ADMIT_PROBE);
    /* one probe fails: open again, for a whole cooldown from now */
    fb_breaker_report(b, FB_ADMIT_PROBE, true, h + 10);
    fb_breaker_report(b, FB_ADMIT_PROBE, false, h + 20);
    assert_int_equal(fb_breaker_state(b, h + 20), FB_CIRCUIT_OPEN);
    assert_int_equal(fb_breaker_state(b, h + 20 + 29999), FB_CIRCUIT_OPEN);
    int64_t h2 = h + 20 + 30000;
    assert_int_equal(fb_breaker_state(b, h2), FB_CIRCUIT_HALF_OPEN);
    /* both probes succeed: closed */
    assert_int_equal(fb_breaker_acquire(b, h2), FB_ADMIT_PROBE);
    assert_int_equal(fb_breaker_acquire(b, h2), FB_ADMIT_PROBE);
    fb_breaker_report(b, FB_ADMIT_PROBE, true, h2);
    assert_int_equal(fb_breaker_state(b, h2), FB_CIRCUIT_HALF_OPEN);
    fb_breaker_report(b, FB_ADMIT_PROBE, true, h2);
    assert_int_equal(fb_breaker_state(b, h2), FB_CIRCUIT_CLOSED);
    assert_int_equal(gauge_of("main", "http://a"), FB_CIRCUIT_CLOSED);
    assert_int_equal(fb_breaker_acquire(b, h2), FB_ADMIT_YES);
    assert_int_equal(fb_breaker_failures(b), 0);
    fb_breaker_free(b);
}

static void test_breaker_ratio(void **state)
{
    (void)state;
    conf_fb_circuit_t c = circuit_conf();
    c.failures = 0; /* ratio only */
    fb_breaker_t *b = fb_breaker_new(&c, "main", "http://b");
    int64_t t = 50000;
    /* alternate ok / fail: 50% — opens once 20 results are in */
    for (int i = 0; i < 19; i++)
        fb_breaker_report(b, FB_ADMIT_YES, i % 2 == 1, t + i);
    assert_int_equal(fb_breaker_state(b, t + 19), FB_CIRCUIT_CLOSED);
    fb_breaker_report(b, FB_ADMIT_YES, false, t + 19); /* 10 of 20 */
    assert_int_equal(fb_breaker_state(b, t + 19), FB_CIRCUIT_OPEN);
    fb_breaker_free(b);

    /* 40% failing never opens it; old results leave the window */
    b = fb_breaker_new(&c, "main", "http://c");
    for (int i = 0; i < 1000; i++)
        fb_breaker_report(b, FB_ADMIT_YES, i % 5 >= 2, t + i * 37);
    assert_int_equal(fb_breaker_state(b, t + 37000), FB_CIRCUIT_CLOSED);
    /* results of requests admitted before opening do not count once open */
    fb_breaker_hold(b, t + 100000, t + 37000);
    assert_int_equal(fb_breaker_state(b, t + 37001), FB_CIRCUIT_OPEN);
    fb_breaker_report(b, FB_ADMIT_YES, true, t + 37002);
    assert_int_equal(fb_breaker_state(b, t + 37003), FB_CIRCUIT_OPEN);
    /* hold never shortens */
    fb_breaker_hold(b, t + 40000, t + 37004);
    assert_int_equal(fb_breaker_state(b, t + 99999), FB_CIRCUIT_OPEN);
    assert_int_equal(fb_breaker_state(b, t + 100000), FB_CIRCUIT_HALF_OPEN);
    fb_breaker_free(b);
}

static void test_breaker_registry(void **state)
{
    (void)state;
    conf_fb_circuit_t c = circuit_conf();
    fb_breakers_t *r = fb_breakers_new();
    fb_breaker_t *a = fb_breakers_get(r, &c, "main", "http://x:1");
    fb_breaker_t *a2 = fb_breakers_get(r, &c, "main", "http://x:1");
    fb_breaker_t *other = fb_breakers_get(r, &c, "local", "http://x:1");
    assert_ptr_equal(a, a2);
    assert_ptr_not_equal(a, other);
    for (int i = 0; i < 5; i++)
        fb_breaker_report(a, FB_ADMIT_YES, false, 10);
    assert_int_equal(fb_breakers_refresh(r, 11), 1);
    /* a reload with a shorter cooldown keeps the state, applies the new pace */
    c.cooldown_ms = 1000;
    assert_ptr_equal(fb_breakers_get(r, &c, "main", "http://x:1"), a);
    assert_int_equal(fb_breaker_state(a, 12), FB_CIRCUIT_OPEN);
    /* the gauge follows a lazy open -> half-open on refresh */
    assert_int_equal(fb_breakers_refresh(r, 30010), 0);
    assert_int_equal(gauge_of("main", "http://x:1"), FB_CIRCUIT_HALF_OPEN);
    fb_breakers_free(r);
}

/* Many threads in half-open: exactly `probes` are admitted. */
typedef struct probe_race {
    fb_breaker_t *b;
    _Atomic int probes, yes;
    pthread_barrier_t *bar;
} probe_race_t;

static void *probe_thread(void *arg)
{
    probe_race_t *p = arg;
    pthread_barrier_wait(p->bar);
    for (int i = 0; i < 1000; i++) {
        fb_admit_t a = fb_breaker_acquire(p->b, 100000);
        if (a == FB_ADMIT_PROBE)
            atomic_fetch_add(&p->probes, 1);
        if (a == FB_ADMIT_YES)
            atomic_fetch_add(&p->yes, 1);
    }
    return NULL;
}

static void test_breaker_threads(void **state)
{
    (void)state;
    conf_fb_circuit_t c = circuit_conf();
    c.probes = 3;
    fb_breaker_t *b = fb_breaker_new(&c, "main", "http://race");
    for (int i = 0; i < 5; i++)
        fb_breaker_report(b, FB_ADMIT_YES, false, 0);
    assert_int_equal(fb_breaker_state(b, 1), FB_CIRCUIT_OPEN);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 4);
    probe_race_t p = {.b = b, .bar = &bar};
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, probe_thread, &p);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&p.probes), 3);
    assert_int_equal(atomic_load(&p.yes), 0);
    pthread_barrier_destroy(&bar);
    fb_breaker_free(b);
}

/* ---- fault injection ----------------------------------------------------------- */

static void test_fault_parse(void **state)
{
    (void)state;
    fb_fault_spec_t s;
    char err[128];
    const char *h = "abort=503;delay=2s";
    assert_int_equal(fb_fault_parse(h, strlen(h), &s, err, sizeof(err)), 0);
    assert_int_equal(s.abort_status, 503);
    assert_int_equal(s.abort_percent, 100);
    assert_int_equal(s.delay_ms, 2000);
    assert_int_equal(s.delay_percent, 100);
    h = " abort=429@30 ; delay=250ms@5 ";
    assert_int_equal(fb_fault_parse(h, strlen(h), &s, err, sizeof(err)), 0);
    assert_int_equal(s.abort_status, 429);
    assert_int_equal(s.abort_percent, 30);
    assert_int_equal(s.delay_ms, 250);
    assert_int_equal(s.delay_percent, 5);
    h = "delay=1s";
    assert_int_equal(fb_fault_parse(h, strlen(h), &s, err, sizeof(err)), 0);
    assert_int_equal(s.abort_percent, 0);
    const char *bad[] = {"",
                         "abort",
                         "abort=",
                         "abort=200",
                         "abort=5033",
                         "abort=50x",
                         "abort=503@101",
                         "abort=503@",
                         "abort=503@x",
                         "delay=2y",
                         "delay=11m",
                         "boom=1",
                         "abort=503;abort=502",
                         ";;",
                         "abort=503;delay"};
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++)
        if (fb_fault_parse(bad[i], strlen(bad[i]), &s, err, sizeof(err)) == 0)
            fail_msg("accepted \"%s\"", bad[i]);
}

static void test_fault_decide(void **state)
{
    (void)state;
    fb_fault_spec_t s = {
        .abort_percent = 30, .abort_status = 503, .delay_percent = 10, .delay_ms = 2000};
    uint64_t r = 99;
    int aborts = 0, delays = 0, n = 100000;
    for (int i = 0; i < n; i++) {
        fb_fault_action_t a;
        fb_fault_decide(&s, xs(&r), &a);
        aborts += a.abort;
        delays += a.delay_ms == 2000;
        if (a.abort)
            assert_int_equal(a.status, 503);
    }
    assert_true(aborts > n * 29 / 100 && aborts < n * 31 / 100);
    assert_true(delays > n * 9 / 100 && delays < n * 11 / 100);
    s.abort_percent = 0;
    s.delay_percent = 100;
    s.delay_ms = 0;
    fb_fault_action_t a;
    fb_fault_decide(&s, 1, &a);
    assert_false(a.abort);
    assert_int_equal(a.delay_ms, 0);

    /* conf: the model's set fields win, the rest is the root's */
    conf_fault_t root = {.abort_percent = 5,
                         .abort_status = 503,
                         .delay_percent = 0,
                         .delay_ms = 1000,
                         .header = true};
    conf_fault_t model = {
        .abort_percent = 100, .abort_status = -1, .delay_percent = -1, .delay_ms = 0};
    fb_fault_spec_t out;
    fb_fault_resolve(&root, &model, &out);
    assert_int_equal(out.abort_percent, 100);
    assert_int_equal(out.abort_status, 503);
    assert_int_equal(out.delay_percent, 0);
    assert_int_equal(out.delay_ms, 1000);

    /* the request: header only with the admin key; counted */
    char err[128];
    const char *l[2] = {"abort", "header"};
    sl_mseries_t *m = sl_metric_series(fb_m.faults, l);
    uint64_t before = sl_counter_value(m);
    const char *h = "abort=502";
    assert_int_equal(
        fb_fault_for_request(&root, NULL, h, strlen(h), false, 1, &a, err, sizeof(err)),
        FB_FAULT_FORBIDDEN);
    assert_int_equal(fb_fault_for_request(&root, NULL, h, strlen(h), true, 1, &a, err, sizeof(err)),
                     FB_FAULT_OK);
    assert_true(a.abort);
    assert_int_equal(a.status, 502);
    assert_int_equal(a.source, FB_FAULT_FROM_HEADER);
    assert_int_equal(sl_counter_value(m), before + 1);
    assert_int_equal(fb_fault_for_request(&root, NULL, "abort=2", 7, true, 1, &a, err, sizeof(err)),
                     FB_FAULT_BAD_HEADER);
    root.header = false;
    assert_int_equal(fb_fault_for_request(&root, NULL, h, strlen(h), true, 1, &a, err, sizeof(err)),
                     FB_FAULT_FORBIDDEN);
    /* no header: the conf's (model) spec */
    assert_int_equal(fb_fault_for_request(&root, &model, NULL, 0, false, 1, &a, err, sizeof(err)),
                     FB_FAULT_OK);
    assert_true(a.abort);
    assert_int_equal(a.source, FB_FAULT_FROM_CONF);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_retryable),           cmocka_unit_test(test_backoff),
        cmocka_unit_test(test_retry_after),         cmocka_unit_test(test_decide),
        cmocka_unit_test(test_budget_exact),        cmocka_unit_test(test_storm_50),
        cmocka_unit_test(test_storm_100),           cmocka_unit_test(test_storm_threads),
        cmocka_unit_test(test_window_stale_clock),  cmocka_unit_test(test_storm_light),
        cmocka_unit_test(test_breaker_consecutive), cmocka_unit_test(test_breaker_ratio),
        cmocka_unit_test(test_breaker_registry),    cmocka_unit_test(test_breaker_threads),
        cmocka_unit_test(test_fault_parse),         cmocka_unit_test(test_fault_decide),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
