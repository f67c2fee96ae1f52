/*
 * The Redis variants of the queue and the idempotency store against a real
 * redis-server started by the test: two instances (two fb_queue_t / two
 * fb_idem_t, each with its own client) sharing one queue and one key
 * space; exactly-once delivery across them; retries and dead letters;
 * a dead worker's lease taken over through XAUTOCLAIM; the counters'
 * invariant; Redis killed (STORE_ERROR, then working again after a
 * restart). Waits run the event loop until a condition or a deadline.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/log.h"
#include "fallback/fallback.h"
#include "tests/unit/redis_server.h"

static rs_server_t srv;
static struct event_base *base;
static char url[128];
static _Atomic int64_t fake_now = 1800000000000LL;
/* An accept's first attempt: max(backoff, 2 x the Redis timeout), so that
 * the take-back of an accept answered too late comes first. */
#define FIRST_MS 1000

static int64_t clock_cb(void *arg)
{
    (void)arg;
    return atomic_load(&fake_now);
}

static conf_fb_queue_t qconf(void)
{
    conf_fb_queue_t c = {.enabled = true,
                         .store = CONF_QUEUE_STORE_REDIS,
                         .max_attempts = 3,
                         .max_age_ms = 3600000,
                         .backoff_ms = 100,
                         .backoff_max_ms = 1000,
                         .lease_ms = 60000,
                         .keep_ms = 86400000,
                         .max_pending = 1000};
    return c;
}

typedef struct inst {
    fb_queue_t *q;
    fb_qworker_t *w;
} inst_t;

static void inst_open(inst_t *in, const conf_fb_queue_t *c)
{
    char err[256];
    conf_redis_t r = {.url = url, .timeout_ms = 500};
    in->q = fb_queue_new(c, &r, err, sizeof(err));
    if (!in->q)
        fail_msg("%s", err);
    assert_true(fb_queue_is_redis(in->q));
    fb_queue_set_clock(in->q, clock_cb, NULL);
    in->w = fb_qworker_new(in->q, base, err, sizeof(err));
    assert_non_null(in->w);
}

static void inst_close(inst_t *in)
{
    fb_qworker_free(in->w);
    fb_queue_free(in->q);
}

typedef struct qans {
    int calls;
    fb_qres_t res;
} qans_t;

static void qcb(void *arg, fb_qres_t *res)
{
    qans_t *a = arg;
    a->calls++;
    a->res = *res; /* ours now */
}

static bool qdone(void *arg)
{
    return ((qans_t *)arg)->calls > 0;
}

static fb_qres_t wait_q(fb_rc_t rc, fb_qres_t *now, qans_t *a)
{
    if (rc == FB_DONE)
        return *now;
    assert_int_equal(rc, FB_PENDING);
    assert_true(rs_run_until(base, qdone, a, 3000));
    assert_int_equal(a->calls, 1);
    return a->res;
}

static fb_qres_t q_accept(inst_t *in, const char *user, const char *key, const char *body)
{
    fb_qaccept_t x = {.user = user,
                      .idem_key = key,
                      .route = "/v1/chat/completions",
                      .body = body,
                      .body_len = strlen(body)};
    qans_t a = {0};
    fb_qres_t r;
    return wait_q(fb_queue_accept(in->w, &x, &r, qcb, &a, NULL), &r, &a);
}

static fb_qres_t q_next(inst_t *in)
{
    qans_t a = {0};
    fb_qres_t r;
    return wait_q(fb_queue_next(in->w, &r, qcb, &a, NULL), &r, &a);
}

static fb_qres_t q_report(inst_t *in, const char *id, fb_qoutcome_t o, const char *result)
{
    qans_t a = {0};
    fb_qres_t r;
    return wait_q(
        fb_queue_report(in->w, id, o, result, result ? strlen(result) : 0, &r, qcb, &a, NULL), &r,
        &a);
}

static fb_qres_t q_lookup(inst_t *in, const char *id, const char *user)
{
    qans_t a = {0};
    fb_qres_t r;
    return wait_q(fb_queue_lookup(in->w, id, user, &r, qcb, &a, NULL), &r, &a);
}

/* Asks for the next due item until one comes (the pending entries list is
 * re-scanned once an entry is idle for 100 ms of Redis's time). */
static fb_qitem_t *q_next_wait(inst_t *in, int64_t ms)
{
    int64_t deadline = sl_now_ms() + ms;
    while (sl_now_ms() < deadline) {
        fb_qres_t r = q_next(in);
        if (r.status == FB_Q_OK) {
            fb_qitem_t *it = r.item;
            r.item = NULL;
            fb_qres_clear(&r);
            return it;
        }
        assert_int_equal(r.status, FB_Q_NONE);
        rs_run_for(base, 20);
    }
    return NULL;
}

static void q_stats(inst_t *in, fb_qstats_t *st)
{
    assert_int_equal(fb_queue_maintain(in->q, in->w), 0);
    rs_run_for(base, 50); /* fire and forget: let the reply land */
    fb_queue_stats(in->q, st);
    assert_int_equal(st->accepted, st->delivered + st->dead + st->pending);
}

static void flush(void)
{
    redisReply *r = rs_cmd(&srv, "FLUSHALL");
    assert_non_null(r);
    freeReplyObject(r);
}

static void test_queue_two_instances(void **state)
{
    (void)state;
    flush();
    conf_fb_queue_t c = qconf();
    inst_t a, b;
    inst_open(&a, &c);
    inst_open(&b, &c);
    fb_qres_t r = q_accept(&a, "alice", "idem-1", "{\"model\":\"m\"}");
    assert_int_equal(r.status, FB_Q_OK);
    char id[64];
    strcpy(id, r.id);
    fb_qres_t l = q_lookup(&b, id, "alice");
    assert_int_equal(l.status, FB_Q_PENDING);
    assert_int_equal(l.next_ms, atomic_load(&fake_now) + FIRST_MS);
    assert_int_equal(q_lookup(&b, id, "bob").status, FB_Q_UNKNOWN);
    assert_int_equal(q_lookup(&b, "q0123", "alice").status, FB_Q_UNKNOWN);
    /* not due yet */
    fb_qres_t n = q_next(&b);
    assert_int_equal(n.status, FB_Q_NONE);
    atomic_fetch_add(&fake_now, FIRST_MS);
    fb_qitem_t *it = q_next_wait(&b, 3000);
    assert_non_null(it);
    assert_string_equal(it->id, id);
    assert_string_equal(it->user, "alice");
    assert_string_equal(it->idem_key, "idem-1");
    assert_string_equal(it->route, "/v1/chat/completions");
    assert_string_equal(it->body, "{\"model\":\"m\"}");
    assert_int_equal(it->attempts, 0);
    fb_qitem_free(it);
    /* leased: the other instance does not get it */
    assert_null(q_next_wait(&a, 300));
    assert_int_equal(q_report(&b, id, FB_QO_DELIVERED, "{\"object\":\"chat.completion\"}").status,
                     FB_Q_OK);
    assert_int_equal(q_report(&a, id, FB_QO_DELIVERED, "{\"again\":1}").status, FB_Q_STALE);
    l = q_lookup(&a, id, "alice");
    assert_int_equal(l.status, FB_Q_DELIVERED);
    assert_string_equal(l.result, "{\"object\":\"chat.completion\"}");
    fb_qres_clear(&l);
    fb_qstats_t st;
    q_stats(&a, &st);
    assert_int_equal(st.accepted, 1);
    assert_int_equal(st.delivered, 1);
    assert_int_equal(st.pending, 0);
    /* the stream holds nothing once delivered */
    redisReply *x = rs_cmd(&srv, "XLEN sluice:q:stream");
    assert_int_equal(x->integer, 0);
    freeReplyObject(x);
    inst_close(&a);
    inst_close(&b);
}

static void test_queue_retries(void **state)
{
    (void)state;
    flush();
    conf_fb_queue_t c = qconf();
    inst_t a;
    inst_open(&a, &c);
    fb_qres_t r = q_accept(&a, "u", NULL, "{}");
    char id[64];
    strcpy(id, r.id);
    atomic_fetch_add(&fake_now, FIRST_MS);
    for (int n = 1; n <= 2; n++) {
        fb_qitem_t *it = q_next_wait(&a, 3000);
        assert_non_null(it);
        assert_int_equal(it->attempts, n - 1);
        assert_null(it->idem_key);
        fb_qitem_free(it);
        assert_int_equal(q_report(&a, id, FB_QO_RETRY, NULL).status, FB_Q_OK);
        fb_qres_t l = q_lookup(&a, id, "u");
        assert_int_equal(l.status, FB_Q_PENDING);
        int64_t full = SL_MIN(100LL << (n - 1), 1000), d = l.next_ms - atomic_load(&fake_now);
        assert_true(d >= full / 2 && d <= full);
        atomic_store(&fake_now, l.next_ms);
    }
    fb_qitem_t *it = q_next_wait(&a, 3000);
    assert_non_null(it);
    fb_qitem_free(it);
    /* third failure of max_attempts 3: dead */
    assert_int_equal(q_report(&a, id, FB_QO_RETRY, NULL).status, FB_Q_OK);
    assert_int_equal(q_lookup(&a, id, "u").status, FB_Q_DEAD);
    /* rejected: dead at once; max_age: dead on the next look */
    r = q_accept(&a, "u", NULL, "{}");
    strcpy(id, r.id);
    atomic_fetch_add(&fake_now, FIRST_MS);
    it = q_next_wait(&a, 3000);
    fb_qitem_free(it);
    assert_int_equal(q_report(&a, id, FB_QO_REJECTED, NULL).status, FB_Q_OK);
    assert_int_equal(q_lookup(&a, id, "u").status, FB_Q_DEAD);
    r = q_accept(&a, "u", NULL, "{}");
    strcpy(id, r.id);
    atomic_fetch_add(&fake_now, 3600000);
    assert_null(q_next_wait(&a, 300));
    assert_int_equal(q_lookup(&a, id, "u").status, FB_Q_DEAD);
    fb_qstats_t st;
    q_stats(&a, &st);
    assert_int_equal(st.accepted, 3);
    assert_int_equal(st.dead, 3);
    /* max_pending */
    inst_close(&a);
    c.max_pending = 1;
    inst_open(&a, &c);
    assert_int_equal(q_accept(&a, "u", NULL, "1").status, FB_Q_OK);
    assert_int_equal(q_accept(&a, "u", NULL, "2").status, FB_Q_FULL);
    inst_close(&a);
}

/* A worker takes an item and dies; after its lease another instance's scan
 * claims the entry (XAUTOCLAIM) and delivers it. */
static void test_queue_takeover_and_exactly_once(void **state)
{
    (void)state;
    flush();
    conf_fb_queue_t c = qconf();
    c.lease_ms = 1000;
    inst_t a, b;
    inst_open(&a, &c);
    inst_open(&b, &c);
    enum { N = 60 };
    char ids[N][64];
    for (int i = 0; i < N; i++) {
        fb_qres_t r = q_accept(i % 2 ? &a : &b, "u", NULL, "{}");
        assert_int_equal(r.status, FB_Q_OK);
        strcpy(ids[i], r.id);
    }
    atomic_fetch_add(&fake_now, FIRST_MS);
    fb_qitem_t *lost = q_next_wait(&a, 3000);
    assert_non_null(lost);
    inst_close(&a); /* "dies" holding a lease */
    int delivered[N] = {0}, got = 0, lost_seen = 0;
    int64_t deadline = sl_now_ms() + 15000;
    while (got < N && sl_now_ms() < deadline) {
        fb_qitem_t *it = q_next_wait(&b, 500);
        if (!it) {
            atomic_fetch_add(&fake_now, 500); /* the lease runs out in our clock */
            continue;
        }
        for (int i = 0; i < N; i++)
            if (strcmp(ids[i], it->id) == 0) {
                fb_qres_t r = q_report(&b, it->id, FB_QO_DELIVERED, "{}");
                if (r.status == FB_Q_OK) {
                    delivered[i]++;
                    got++;
                }
                lost_seen += strcmp(it->id, lost->id) == 0;
            }
        fb_qitem_free(it);
    }
    assert_int_equal(got, N);
    assert_int_equal(lost_seen, 1);
    for (int i = 0; i < N; i++)
        assert_int_equal(delivered[i], 1);
    fb_qitem_free(lost);
    fb_qstats_t st;
    q_stats(&b, &st);
    assert_int_equal(st.accepted, N);
    assert_int_equal(st.delivered, N);
    assert_int_equal(st.pending, 0);
    inst_close(&b);
}

static void test_queue_redis_down(void **state)
{
    (void)state;
    flush();
    conf_fb_queue_t c = qconf();
    inst_t a;
    inst_open(&a, &c);
    assert_int_equal(q_accept(&a, "u", NULL, "{}").status, FB_Q_OK);
    sl_log_set_level(SL_LOG_ERROR);
    rs_kill(&srv);
    assert_int_equal(q_accept(&a, "u", NULL, "{}").status, FB_Q_STORE_ERROR);
    assert_int_equal(q_lookup(&a, "q00000000000000000000000000000000", "u").status,
                     FB_Q_STORE_ERROR);
    rs_start(&srv);
    /* back on its own after the client's reconnect backoff */
    int64_t deadline = sl_now_ms() + 5000;
    fb_qstatus_t s = FB_Q_STORE_ERROR;
    while (s != FB_Q_OK && sl_now_ms() < deadline) {
        s = q_accept(&a, "u", NULL, "{}").status;
        if (s != FB_Q_OK)
            rs_run_for(base, 50);
    }
    assert_int_equal(s, FB_Q_OK);
    sl_log_set_level(SL_LOG_INFO);
    inst_close(&a);
}

/* ---- idempotency ------------------------------------------------------------------ */

typedef struct iinst {
    fb_idem_t *s;
    fb_idem_worker_t *w;
} iinst_t;

static void iinst_open(iinst_t *in)
{
    char err[256];
    conf_fb_idem_t c = {.enabled = true,
                        .ttl_ms = 60000,
                        .inflight_ttl_ms = 60000,
                        .max_entries = 100,
                        .max_response_bytes = 64};
    conf_redis_t r = {.url = url, .timeout_ms = 500};
    in->s = fb_idem_new(&c, &r, err, sizeof(err));
    assert_non_null(in->s);
    in->w = fb_idem_worker_new(in->s, base, err, sizeof(err));
    assert_non_null(in->w);
}

static void iinst_close(iinst_t *in)
{
    fb_idem_worker_free(in->w);
    fb_idem_free(in->s);
}

typedef struct ians {
    int calls;
    fb_idem_result_t res;
} ians_t;

static void icb(void *arg, fb_idem_result_t *res)
{
    ians_t *a = arg;
    a->calls++;
    a->res = *res;
}

static bool idone(void *arg)
{
    return ((ians_t *)arg)->calls > 0;
}

static fb_idem_result_t i_begin(iinst_t *in, const char *user, const char *key, const char *body)
{
    ians_t a = {0};
    fb_idem_result_t r;
    fb_rc_t rc = fb_idem_begin(in->w, user, key, body, strlen(body), &r, icb, &a, NULL);
    assert_int_equal(rc, FB_PENDING);
    assert_true(rs_run_until(base, idone, &a, 3000));
    return a.res;
}

static void test_idem_redis(void **state)
{
    (void)state;
    flush();
    iinst_t a, b;
    iinst_open(&a);
    iinst_open(&b);
    fb_idem_result_t r = i_begin(&a, "alice", "k1", "{\"x\":1}");
    assert_int_equal(r.verdict, FB_IDEM_PROCEED);
    uint64_t tok = r.token;
    assert_int_equal(i_begin(&b, "alice", "k1", "{\"x\":1}").verdict, FB_IDEM_IN_FLIGHT);
    assert_int_equal(i_begin(&b, "alice", "k1", "{\"x\":2}").verdict, FB_IDEM_MISMATCH);
    assert_int_equal(i_begin(&b, "bob", "k1", "{\"x\":1}").verdict, FB_IDEM_PROCEED);
    fb_idem_complete(a.w, "alice", "k1", tok + 1, 200, "application/json", "{}", 2); /* stale */
    rs_run_for(base, 30);
    assert_int_equal(i_begin(&b, "alice", "k1", "{\"x\":1}").verdict, FB_IDEM_IN_FLIGHT);
    fb_idem_complete(a.w, "alice", "k1", tok, 201, "application/json", "{\"answer\":1}", 12);
    rs_run_for(base, 30);
    r = i_begin(&b, "alice", "k1", "{\"x\":1}");
    assert_int_equal(r.verdict, FB_IDEM_REPLAY);
    assert_int_equal(r.status, 201);
    assert_string_equal(r.content_type, "application/json");
    assert_int_equal(r.body_len, 12);
    assert_string_equal(r.body, "{\"answer\":1}");
    fb_idem_result_clear(&r);
    /* abort frees; too large is not kept */
    r = i_begin(&a, "carol", "k2", "b");
    fb_idem_abort(a.w, "carol", "k2", r.token);
    rs_run_for(base, 30);
    r = i_begin(&b, "carol", "k2", "b");
    assert_int_equal(r.verdict, FB_IDEM_PROCEED);
    char big[100];
    memset(big, 'y', sizeof(big));
    fb_idem_complete(b.w, "carol", "k2", r.token, 200, "text/plain", big, sizeof(big));
    rs_run_for(base, 30);
    assert_int_equal(i_begin(&a, "carol", "k2", "b").verdict, FB_IDEM_NOT_KEPT);

    /* both instances claim one key at once: exactly one proceeds */
    for (int round = 0; round < 20; round++) {
        char k[32];
        snprintf(k, sizeof(k), "race-%d", round);
        ians_t x = {0}, y = {0};
        fb_idem_result_t rx, ry;
        assert_int_equal(fb_idem_begin(a.w, "u", k, "{}", 2, &rx, icb, &x, NULL), FB_PENDING);
        assert_int_equal(fb_idem_begin(b.w, "u", k, "{}", 2, &ry, icb, &y, NULL), FB_PENDING);
        assert_true(rs_run_until(base, idone, &x, 3000));
        assert_true(rs_run_until(base, idone, &y, 3000));
        int proceed = (x.res.verdict == FB_IDEM_PROCEED) + (y.res.verdict == FB_IDEM_PROCEED);
        int inflight = (x.res.verdict == FB_IDEM_IN_FLIGHT) + (y.res.verdict == FB_IDEM_IN_FLIGHT);
        assert_int_equal(proceed, 1);
        assert_int_equal(inflight, 1);
    }
    /* Redis down: a store error, not a guess */
    sl_log_set_level(SL_LOG_ERROR);
    rs_kill(&srv);
    assert_int_equal(i_begin(&a, "u", "k9", "{}").verdict, FB_IDEM_STORE_ERROR);
    rs_start(&srv);
    sl_log_set_level(SL_LOG_INFO);
    iinst_close(&a);
    iinst_close(&b);
}

/* A complete or an abort is fired and forgotten; the client's next request
 * with the key may come on the same worker right after. Redis runs one
 * connection's commands in order, so the next begin must see the complete
 * (or the abort) — also when the script cache is empty (a fresh or
 * restarted Redis: the first call of a script is NOSCRIPT and is sent
 * again after its reply, which must not let a later call overtake it). */
static void test_idem_redis_next_begin_sees_the_end(void **state)
{
    (void)state;
    flush();
    iinst_t a;
    iinst_open(&a);
    for (int round = 0; round < 2; round++) {
        redisReply *fr = rs_cmd(&srv, "SCRIPT FLUSH");
        assert_non_null(fr);
        freeReplyObject(fr);
        char k[32];
        snprintf(k, sizeof(k), "order-%d", round);
        fb_idem_result_t r = i_begin(&a, "dana", k, "{}");
        assert_int_equal(r.verdict, FB_IDEM_PROCEED);
        if (round == 0)
            fb_idem_complete(a.w, "dana", k, r.token, 200, "application/json", "{\"ok\":1}", 8);
        else
            fb_idem_abort(a.w, "dana", k, r.token);
        /* no loop turn in between: the next begin is queued right behind */
        fb_idem_result_t r2 = i_begin(&a, "dana", k, "{}");
        assert_int_equal(r2.verdict, round == 0 ? FB_IDEM_REPLAY : FB_IDEM_PROCEED);
        fb_idem_result_clear(&r2);
    }
    iinst_close(&a);
}

static int setup(void **state)
{
    (void)state;
    rs_start(&srv);
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/0", srv.port);
    base = event_base_new();
    return base ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    event_base_free(base);
    rs_cleanup(&srv);
    return 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queue_two_instances),
        cmocka_unit_test(test_queue_retries),
        cmocka_unit_test(test_queue_takeover_and_exactly_once),
        cmocka_unit_test(test_queue_redis_down),
        cmocka_unit_test(test_idem_redis),
        cmocka_unit_test(test_idem_redis_next_begin_sees_the_end),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
