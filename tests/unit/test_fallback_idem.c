/*
 * The in-process idempotency store: claim, 409 while in flight, replay
 * after completion, 422 on another body, per-user scoping, tokens (a stale
 * complete or abort changes nothing), answers too large to keep, TTLs with
 * an injected clock, the size cap, and races: many threads claiming one
 * key at once get exactly one PROCEED.
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

static _Atomic int64_t now_ms = 1000000;

static int64_t clock_cb(void *arg)
{
    (void)arg;
    return atomic_load(&now_ms);
}

static conf_fb_idem_t iconf(void)
{
    conf_fb_idem_t c = {.enabled = true,
                        .ttl_ms = 86400000,
                        .inflight_ttl_ms = 300000,
                        .max_entries = 1000,
                        .max_response_bytes = 1024};
    return c;
}

typedef struct ih {
    fb_idem_t *s;
    fb_idem_worker_t *w;
} ih_t;

static void ih_open(ih_t *h, const conf_fb_idem_t *c)
{
    char err[128];
    h->s = fb_idem_new(c, NULL, err, sizeof(err));
    assert_non_null(h->s);
    fb_idem_set_clock(h->s, clock_cb, NULL);
    h->w = fb_idem_worker_new(h->s, NULL, err, sizeof(err));
    assert_non_null(h->w);
}

static void ih_close(ih_t *h)
{
    fb_idem_worker_free(h->w);
    fb_idem_free(h->s);
}

static fb_idem_verdict_t begin(ih_t *h, const char *user, const char *key, const char *body,
                               fb_idem_result_t *out)
{
    fb_idem_result_t r;
    assert_int_equal(fb_idem_begin(h->w, user, key, body, strlen(body), &r, NULL, NULL, NULL),
                     FB_DONE);
    fb_idem_verdict_t v = r.verdict;
    if (out)
        *out = r;
    else
        fb_idem_result_clear(&r);
    return v;
}

static void test_lifecycle(void **state)
{
    (void)state;
    conf_fb_idem_t c = iconf();
    ih_t h;
    ih_open(&h, &c);
    uint64_t replays0 = sl_counter_value(fb_m.idem_replays);
    fb_idem_result_t r;
    assert_int_equal(begin(&h, "alice", "k1", "{\"a\":1}", &r), FB_IDEM_PROCEED);
    uint64_t tok = r.token;
    assert_true(tok != 0);
    /* a concurrent duplicate: 409 */
    assert_int_equal(begin(&h, "alice", "k1", "{\"a\":1}", NULL), FB_IDEM_IN_FLIGHT);
    /* the same key with another body: 422, even while in flight */
    assert_int_equal(begin(&h, "alice", "k1", "{\"a\":2}", NULL), FB_IDEM_MISMATCH);
    /* scoped to the user */
    assert_int_equal(begin(&h, "bob", "k1", "{\"a\":1}", NULL), FB_IDEM_PROCEED);
    assert_int_equal(begin(&h, NULL, "k1", "{\"a\":1}", NULL), FB_IDEM_PROCEED);
    /* a stale token changes nothing */
    fb_idem_complete(h.w, "alice", "k1", tok + 1, 200, "application/json", "{}", 2);
    fb_idem_abort(h.w, "alice", "k1", tok + 1);
    assert_int_equal(begin(&h, "alice", "k1", "{\"a\":1}", NULL), FB_IDEM_IN_FLIGHT);
    fb_idem_complete(h.w, "alice", "k1", tok, 200, "application/json", "{\"answer\":42}", 13);
    assert_int_equal(begin(&h, "alice", "k1", "{\"a\":1}", &r), FB_IDEM_REPLAY);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.content_type, "application/json");
    assert_int_equal(r.body_len, 13);
    assert_memory_equal(r.body, "{\"answer\":42}", 13);
    fb_idem_result_clear(&r);
    assert_int_equal(sl_counter_value(fb_m.idem_replays), replays0 + 1);
    assert_int_equal(begin(&h, "alice", "k1", "{\"a\":2}", NULL), FB_IDEM_MISMATCH);
    /* complete twice: the first answer stays */
    fb_idem_complete(h.w, "alice", "k1", tok, 500, "text/plain", "no", 2);
    assert_int_equal(begin(&h, "alice", "k1", "{\"a\":1}", &r), FB_IDEM_REPLAY);
    assert_int_equal(r.status, 200);
    fb_idem_result_clear(&r);

    /* abort frees the key for a retry with it */
    assert_int_equal(begin(&h, "carol", "k2", "b", &r), FB_IDEM_PROCEED);
    fb_idem_abort(h.w, "carol", "k2", r.token);
    assert_int_equal(begin(&h, "carol", "k2", "b2", &r), FB_IDEM_PROCEED);
    /* too large to keep: remembered, not replayed */
    char big[2048];
    memset(big, 'x', sizeof(big));
    fb_idem_complete(h.w, "carol", "k2", r.token, 200, "text/event-stream", big, sizeof(big));
    assert_int_equal(begin(&h, "carol", "k2", "b2", NULL), FB_IDEM_NOT_KEPT);

    /* key syntax */
    assert_false(fb_idem_key_valid("", 0));
    assert_false(fb_idem_key_valid("a b", 3));
    assert_false(fb_idem_key_valid("\x01", 1));
    char longk[300];
    memset(longk, 'k', sizeof(longk));
    assert_true(fb_idem_key_valid(longk, 255));
    assert_false(fb_idem_key_valid(longk, 256));
    assert_true(fb_idem_key_valid("3f0e-uuid:like/key", 18));
    fb_idem_result_t bad;
    assert_int_equal(fb_idem_begin(h.w, "u", "a b", "x", 1, &bad, NULL, NULL, NULL), FB_ERROR);
    ih_close(&h);
}

static void test_ttl_and_cap(void **state)
{
    (void)state;
    conf_fb_idem_t c = iconf();
    c.max_entries = 16;
    ih_t h;
    ih_open(&h, &c);
    /* an in-flight claim nobody completes expires after inflight_ttl */
    assert_int_equal(begin(&h, "u", "crash", "b", NULL), FB_IDEM_PROCEED);
    atomic_fetch_add(&now_ms, 299999);
    assert_int_equal(begin(&h, "u", "crash", "b", NULL), FB_IDEM_IN_FLIGHT);
    atomic_fetch_add(&now_ms, 1);
    fb_idem_result_t r;
    assert_int_equal(begin(&h, "u", "crash", "b", &r), FB_IDEM_PROCEED);
    /* a completed answer lives ttl from completion */
    fb_idem_complete(h.w, "u", "crash", r.token, 200, "application/json", "{}", 2);
    atomic_fetch_add(&now_ms, 86399999);
    assert_int_equal(begin(&h, "u", "crash", "b", NULL), FB_IDEM_REPLAY);
    atomic_fetch_add(&now_ms, 1);
    assert_int_equal(begin(&h, "u", "crash", "b", NULL), FB_IDEM_PROCEED);

    /* the cap: the oldest goes first, counted */
    uint64_t ev0 = sl_counter_value(fb_m.idem_evicted);
    for (int i = 0; i < 40; i++) {
        char k[16];
        snprintf(k, sizeof(k), "k%d", i);
        assert_int_equal(begin(&h, "u", k, "b", NULL), FB_IDEM_PROCEED);
        assert_true(fb_idem_count(h.s) <= 16);
    }
    assert_int_equal(fb_idem_count(h.s), 16);
    assert_true(sl_counter_value(fb_m.idem_evicted) - ev0 >= 24);
    assert_int_equal(begin(&h, "u", "k39", "b", NULL), FB_IDEM_IN_FLIGHT); /* newest kept */
    assert_int_equal(begin(&h, "u", "k0", "b", NULL), FB_IDEM_PROCEED);    /* oldest gone */
    ih_close(&h);
}

typedef struct race {
    ih_t *h;
    pthread_barrier_t *bar;
    int rounds;
    _Atomic int proceed, in_flight, replay, other;
    _Atomic uint64_t tokens[200];
} race_t;

static void *racer(void *arg)
{
    race_t *r = arg;
    for (int i = 0; i < r->rounds; i++) {
        char k[32];
        snprintf(k, sizeof(k), "race-%d", i);
        pthread_barrier_wait(r->bar);
        fb_idem_result_t res;
        assert_int_equal(fb_idem_begin(r->h->w, "u", k, "{}", 2, &res, NULL, NULL, NULL), FB_DONE);
        switch (res.verdict) {
        case FB_IDEM_PROCEED:
            atomic_fetch_add(&r->proceed, 1);
            atomic_store(&r->tokens[i], res.token);
            break;
        case FB_IDEM_IN_FLIGHT:
            atomic_fetch_add(&r->in_flight, 1);
            break;
        default:
            atomic_fetch_add(&r->other, 1);
        }
        pthread_barrier_wait(r->bar);
        /* the winner's completion is visible to all, then everyone replays */
        if (res.verdict == FB_IDEM_PROCEED)
            fb_idem_complete(r->h->w, "u", k, res.token, 200, "application/json", k, strlen(k));
        pthread_barrier_wait(r->bar);
        fb_idem_result_t again;
        assert_int_equal(fb_idem_begin(r->h->w, "u", k, "{}", 2, &again, NULL, NULL, NULL),
                         FB_DONE);
        if (again.verdict == FB_IDEM_REPLAY && again.body_len == strlen(k) &&
            memcmp(again.body, k, strlen(k)) == 0)
            atomic_fetch_add(&r->replay, 1);
        fb_idem_result_clear(&again);
    }
    return NULL;
}

static void test_races(void **state)
{
    (void)state;
    conf_fb_idem_t c = iconf();
    ih_t h;
    ih_open(&h, &c);
    enum { T = 8, ROUNDS = 200 };
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, T);
    race_t r = {.h = &h, .bar = &bar, .rounds = ROUNDS};
    pthread_t th[T];
    for (int i = 0; i < T; i++)
        pthread_create(&th[i], NULL, racer, &r);
    for (int i = 0; i < T; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&r.proceed), ROUNDS);
    assert_int_equal(atomic_load(&r.in_flight), ROUNDS * (T - 1));
    assert_int_equal(atomic_load(&r.other), 0);
    assert_int_equal(atomic_load(&r.replay), ROUNDS * T);
    pthread_barrier_destroy(&bar);
    ih_close(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lifecycle),
        cmocka_unit_test(test_ttl_and_cap),
        cmocka_unit_test(test_races),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
