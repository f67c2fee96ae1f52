/*
 * Unit tests of the in-process store's key cap (issue 21 item 1), with an
 * injected clock: max_keys holds for the whole table (not a share per
 * stripe); only keys whose state equals a fresh key's are dropped; when
 * every key is live a new key is refused (RL_LIMIT_KEYS: 429, Retry-After,
 * counted) instead of evicting someone, so N users over max_keys never get
 * more than their limit, however many passes they make.
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
#include "ratelimit/rl_internal.h"

#define S  1000000000LL
#define MS 1000000LL

static int64_t now_ns;
static int64_t clock_fn(void *arg)
{
    (void)arg;
    return now_ns;
}

static rl_t *mk(int64_t rpm, int64_t concurrent, int64_t max_keys)
{
    conf_ratelimit_t c;
    memset(&c, 0, sizeof(c));
    c.per_user.requests_per_minute = rpm;
    c.per_user.concurrent = concurrent;
    c.max_tokens = 2048;
    c.max_keys = max_keys;
    char err[256] = "";
    rl_t *rl = rl_new(&c, NULL, err, sizeof(err));
    if (!rl)
        fail_msg("rl_new: %s", err);
    rl_set_clock(rl, clock_fn, NULL);
    return rl;
}

/* One check; *t receives the ticket when asked for, else it is settled. */
static bool chk(rl_worker_t *w, const char *user, rl_decision_t *d, rl_ticket_t **t)
{
    rl_request_t req = {.user = user};
    rl_ticket_t *tk = NULL;
    assert_int_equal(rl_check(w, &req, d, &tk, NULL, NULL, NULL), RL_DONE);
    assert_true(d->allowed ? tk != NULL : tk == NULL);
    if (t)
        *t = tk;
    else
        rl_ticket_settle(tk, 0);
    return d->allowed;
}

static uint64_t limited(const char *name)
{
    sl_metric_t *m =
        sl_metric_register("sluice_ratelimited_total", "", SL_METRIC_COUNTER, "limit", NULL, 0);
    return sl_counter_value(sl_metric_series1(m, name));
}

static void user(char *buf, size_t n, int i)
{
    snprintf(buf, n, "user-%d", i);
}

/* The figure: max_keys 1024, 2 requests a minute, 3 passes over N
 * users within a second must allow 2 * min(N, 1024) — before, N = 900
 * allowed 2,125, N = 2,048 allowed 6,144 (eviction started at ~88% and
 * evicted users came back with a fresh burst). */
static void test_passes_never_exceed_the_limit(void **state)
{
    (void)state;
    static const int ns[] = {512, 900, 1000, 1024, 1025, 2048, 4096};
    for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
        int n = ns[k];
        rl_t *rl = mk(2, 0, 1024);
        char err[128];
        rl_worker_t *w = rl_worker_new(rl, NULL, err, sizeof(err));
        now_ns = 1000 * S;
        rl_decision_t d;
        char u[32];
        int allowed = 0, keys_refused = 0;
        int *per_user = calloc((size_t)n, sizeof(int));
        for (int pass = 0; pass < 3; pass++) {
            for (int i = 0; i < n; i++) {
                user(u, sizeof(u), i);
                now_ns += 100000; /* 0.1 ms apart: 3 passes of 4096 in 1.3 s */
                if (chk(w, u, &d, NULL)) {
                    allowed++;
                    per_user[i]++;
                } else if (d.limit == RL_LIMIT_KEYS) {
                    keys_refused++;
                }
            }
        }
        int expect = 2 * (n < 1024 ? n : 1024);
        if (allowed != expect)
            fail_msg("N=%d: %d allowed, expected %d", n, allowed, expect);
        for (int i = 0; i < n; i++)
            assert_true(per_user[i] <= 2);
        /* every user over the cap was refused on each of the 3 passes */
        assert_int_equal(keys_refused, 3 * (n > 1024 ? n - 1024 : 0));
        assert_int_equal(rl_mem_keys(rl), (size_t)(n < 1024 ? n : 1024));
        assert_int_equal(rl_mem_keys_refused(rl), (uint64_t)keys_refused);
        free(per_user);
        rl_worker_free(w);
        rl_free(rl);
    }
}

/* A refusal for a full table: 429, Retry-After (at least a second), no
 * X-RateLimit-* (they would describe no limit of this user's), its own
 * label in the metric and in the body; users already tracked go on. */
static void test_full_refusal_answer(void **state)
{
    (void)state;
    rl_t *rl = mk(10, 0, 64);
    char err[128];
    rl_worker_t *w = rl_worker_new(rl, NULL, err, sizeof(err));
    now_ns = 50 * S;
    rl_decision_t d;
    char u[32];
    for (int i = 0; i < 64; i++) {
        user(u, sizeof(u), i);
        assert_true(chk(w, u, &d, NULL));
    }
    uint64_t l0 = limited("max_keys");
    assert_false(chk(w, "newcomer", &d, NULL));
    assert_int_equal(d.limit, RL_LIMIT_KEYS);
    assert_int_equal(d.limit_value, 64);
    assert_int_equal(rl_decision_status(&d), 429);
    /* the oldest key of its stripe has had 1 of 10/min: idle 6 s later */
    assert_true(d.retry_after_ms >= 1000 && d.retry_after_ms <= 6000);
    assert_int_equal(limited("max_keys"), l0 + 1);
    char h[256];
    assert_true(rl_format_headers(&d, h, sizeof(h)) > 0);
    assert_null(strstr(h, "X-RateLimit"));
    assert_non_null(strstr(h, "Retry-After: "));
    size_t len = 0;
    char *body = rl_error_body(&d, &len);
    assert_non_null(body);
    assert_non_null(strstr(body, "\"code\":\"rate_limit_exceeded\""));
    assert_non_null(strstr(body, "\"limit\":\"max_keys\""));
    assert_non_null(strstr(body, "max_keys 64"));
    free(body);
    /* a tracked user is not affected */
    assert_true(chk(w, "user-3", &d, NULL));
    assert_int_equal(d.limit, RL_LIMIT_REQUESTS);
    rl_worker_free(w);
    rl_free(rl);
}

/* Keys equivalent to fresh ones go at no cost: once the old keys' buckets
 * are full again, new keys take their place, and the old users, coming
 * back, get exactly what a fresh key gets (nothing more, nothing less). */
static void test_idle_keys_make_room(void **state)
{
    (void)state;
    rl_t *rl = mk(2, 0, 256);
    char err[128];
    rl_worker_t *w = rl_worker_new(rl, NULL, err, sizeof(err));
    now_ns = 10 * S;
    rl_decision_t d;
    char u[32];
    for (int i = 0; i < 256; i++) {
        user(u, sizeof(u), i);
        assert_true(chk(w, u, &d, NULL)); /* 1 of 2/min: idle 30 s later */
    }
    assert_false(chk(w, "new-0", &d, NULL));
    assert_int_equal(d.limit, RL_LIMIT_KEYS);
    now_ns += 29 * S; /* still live */
    assert_false(chk(w, "new-0", &d, NULL));
    now_ns += 1 * S + 1; /* every old key idle now */
    for (int i = 0; i < 256; i++) {
        snprintf(u, sizeof(u), "new-%d", i);
        assert_true(chk(w, u, &d, NULL));
        assert_true(chk(w, u, &d, NULL));
        assert_false(chk(w, u, &d, NULL)); /* 2/min holds for the new ones */
        assert_int_equal(d.limit, RL_LIMIT_REQUESTS);
    }
    assert_int_equal(rl_mem_keys(rl), 256);
    rl_worker_free(w);
    rl_free(rl);
}

/* The stripe (of 64) a user's key falls in: its hash's high bits (mem.c). */
static unsigned stripe_of(const char *u)
{
    char key[RL_KEY_MAX + 1];
    size_t n = rl_key_make('u', u, key);
    return (rl_mem_hash(key, n) >> 20) % 64;
}

/* A user with one request at a time leaves its key idle after each: its
 * next check finds the key (not dropped and made again) and answers as a
 * fresh key would; an idle key of the same stripe that is not asked for
 * still goes when the stripe is passed over. */
static void test_idle_key_asked_for_stays(void **state)
{
    (void)state;
    rl_t *rl = mk(60, 1, 64), *fresh = mk(60, 1, 64);
    char err[128];
    rl_worker_t *w = rl_worker_new(rl, NULL, err, sizeof(err));
    rl_worker_t *wf = rl_worker_new(fresh, NULL, err, sizeof(err));
    char b[32];
    for (int i = 0;; i++) { /* another user of user-a's stripe */
        user(b, sizeof(b), i);
        if (stripe_of(b) == stripe_of("user-a"))
            break;
    }
    rl_decision_t d, df;
    now_ns = 10 * S;
    assert_true(chk(w, "user-a", &d, NULL)); /* 1 of 60/min: idle 1 s later */
    now_ns += 2 * S;
    assert_int_equal(rl_mem_keys(rl), 1);
    assert_true(chk(w, "user-a", &d, NULL));
    assert_true(chk(wf, "user-a", &df, NULL));
    assert_int_equal(d.limit, df.limit);
    assert_int_equal(d.limit_value, df.limit_value);
    assert_int_equal(d.remaining, df.remaining);
    assert_int_equal(d.reset_ms, df.reset_ms);
    assert_int_equal(rl_mem_keys(rl), 1);
    now_ns += 2 * S; /* user-a idle again: b's check drops it */
    assert_true(chk(w, b, &d, NULL));
    assert_int_equal(rl_mem_keys(rl), 1);
    assert_true(chk(w, "user-a", &d, NULL)); /* back as a fresh key */
    assert_int_equal(d.remaining, 59);
    assert_int_equal(rl_mem_keys(rl), 2);
    rl_worker_free(wf);
    rl_worker_free(w);
    rl_free(fresh);
    rl_free(rl);
}

/* A key holding a concurrency slot is live even with its buckets full:
 * dropping it would lose the slot's accounting. */
static void test_slot_holders_stay(void **state)
{
    (void)state;
    rl_t *rl = mk(0, 1, 64);
    char err[128];
    rl_worker_t *w = rl_worker_new(rl, NULL, err, sizeof(err));
    now_ns = 10 * S;
    rl_decision_t d;
    rl_ticket_t *held[64];
    char u[32];
    for (int i = 0; i < 64; i++) {
        user(u, sizeof(u), i);
        assert_true(chk(w, u, &d, &held[i]));
    }
    now_ns += 3600 * S;
    assert_false(chk(w, "late", &d, NULL));
    assert_int_equal(d.limit, RL_LIMIT_KEYS);
    /* user-5 still holds its slot: a second request is refused for it */
    assert_false(chk(w, "user-5", &d, NULL));
    assert_int_equal(d.limit, RL_LIMIT_CONCURRENT);
    /* one finishes: its key is idle now and makes room */
    rl_ticket_settle(held[7], 0);
    held[7] = NULL;
    assert_true(chk(w, "late", &d, NULL));
    for (int i = 0; i < 64; i++)
        rl_ticket_settle(held[i], 0);
    rl_worker_free(w);
    rl_free(rl);
}

/* The idle key that makes room may be in any stripe: a full table looks
 * at every stripe's LRU end before refusing. */
static void test_room_found_in_any_stripe(void **state)
{
    (void)state;
    rl_t *rl = mk(2, 0, 512);
    char err[128];
    rl_worker_t *w = rl_worker_new(rl, NULL, err, sizeof(err));
    now_ns = 10 * S;
    rl_decision_t d;
    char u[32];
    /* 8 keys idle 30 s later, then 504 that stay live (2 of 2/min) */
    for (int i = 0; i < 8; i++) {
        snprintf(u, sizeof(u), "short-%d", i);
        assert_true(chk(w, u, &d, NULL));
    }
    now_ns += 29 * S;
    for (int i = 0; i < 504; i++) {
        user(u, sizeof(u), i);
        assert_true(chk(w, u, &d, NULL));
        assert_true(chk(w, u, &d, NULL));
    }
    now_ns += 2 * S; /* the 8 are idle; the 504 are not */
    int in = 0;
    for (int i = 0; i < 20; i++) {
        snprintf(u, sizeof(u), "new-%d", i);
        in += chk(w, u, &d, NULL);
    }
    assert_int_equal(in, 8);
    assert_int_equal(rl_mem_keys(rl), 512);
    rl_worker_free(w);
    rl_free(rl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_passes_never_exceed_the_limit),
        cmocka_unit_test(test_full_refusal_answer),
        cmocka_unit_test(test_idle_keys_make_room),
        cmocka_unit_test(test_slot_holders_stay),
        cmocka_unit_test(test_idle_key_asked_for_stays),
        cmocka_unit_test(test_room_found_in_any_stripe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
