/*
 * The Redis backend against a real redis-server on its own port: two
 * limiters (two sluice instances) sharing one limit, concurrency and token
 * budgets across them, NOSCRIPT, cancellation giving back what was taken,
 * and Redis killed and restarted under each on_store_error (allow, deny,
 * local), including the return to Redis on its own. Batching: checks made
 * in one turn of the loop go to Redis as one EVALSHA (counted by Redis's
 * INFO commandstats), each answer reaches its own request, an entry whose
 * key Redis cannot use fails alone, a deadline fails the whole batch once
 * per request. Waits run the event loop until a condition or a deadline.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/log.h"
#include "ratelimit/rl_internal.h"
#include "common/metrics.h"
#include "conf/conf.h"
#include "ratelimit/ratelimit.h"
#include "tests/unit/redis_server.h"

static rs_server_t srv;
static struct event_base *base;
static char url[128];

typedef struct inst {
    rl_t *rl;
    rl_worker_t *w;
} inst_t;

/* An instance whose Redis calls time out after deadline_ms. */
static void inst_new_ms(inst_t *in, const conf_ratelimit_t *c, int64_t deadline_ms)
{
    char err[256];
    conf_redis_t r = {.url = url, .timeout_ms = deadline_ms};
    in->rl = rl_new(c, &r, err, sizeof(err));
    assert_non_null(in->rl);
    in->w = rl_worker_new(in->rl, base, err, sizeof(err));
    assert_non_null(in->w);
}

/* The tests not about the deadline: a real Redis on two loaded cores (or
 * under ASan) can take more than the default 50 ms over a batch, and a
 * call that times out is a store error, not the decision the test asserts
 * (test_lease_not_when_idle failed so under ASan). */
static void inst_new(inst_t *in, const conf_ratelimit_t *c)
{
    inst_new_ms(in, c, 2000);
}

/* The product's default deadline, for the tests about it. */
static void inst_new_50(inst_t *in, const conf_ratelimit_t *c)
{
    inst_new_ms(in, c, 50);
}

static void inst_free(inst_t *in)
{
    rl_worker_free(in->w);
    rl_free(in->rl);
}

static bool up(void *arg)
{
    return rl_worker_redis_up(arg);
}

static bool down(void *arg)
{
    return !rl_worker_redis_up(arg);
}

typedef struct answer {
    int calls;
    rl_decision_t d;
    rl_ticket_t *t;
} answer_t;

static void answer_cb(void *arg, const rl_decision_t *d, rl_ticket_t *t)
{
    answer_t *a = arg;
    a->calls++;
    a->d = *d;
    a->t = t;
}

static bool answered(void *arg)
{
    return ((answer_t *)arg)->calls > 0;
}

/* One check, waited for. *pending_seen tells whether it went to Redis. */
static bool check(inst_t *in, const char *user, int64_t tokens, rl_decision_t *d, rl_ticket_t **t,
                  bool *async)
{
    rl_request_t req = {.user = user, .tokens = tokens};
    answer_t a = {0};
    rl_pending_t *p = NULL;
    rl_ticket_t *tk = NULL;
    rl_check_rc_t rc = rl_check(in->w, &req, &a.d, &tk, answer_cb, &a, &p);
    assert_int_not_equal(rc, RL_ERROR);
    if (async)
        *async = rc == RL_PENDING;
    if (rc == RL_PENDING) {
        assert_non_null(p);
        assert_int_equal(a.calls, 0); /* never inside rl_check */
        assert_true(rs_run_until(base, answered, &a, 2000));
        assert_int_equal(a.calls, 1);
        tk = a.t;
    }
    *d = a.d;
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

static uint64_t store_errors(const char *action)
{
    sl_metric_t *m = sl_metric_register("sluice_ratelimit_store_errors_total", "",
                                        SL_METRIC_COUNTER, "action", NULL, 0);
    return sl_counter_value(sl_metric_series1(m, action));
}

static int64_t mode(const char *name)
{
    sl_metric_t *m =
        sl_metric_register("sluice_ratelimit_redis_mode", "", SL_METRIC_GAUGE, "mode", NULL, 0);
    return sl_gauge_value(sl_metric_series1(m, name));
}

static conf_ratelimit_t conf0(void)
{
    conf_ratelimit_t c;
    memset(&c, 0, sizeof(c));
    c.max_tokens = 2048;
    c.max_keys = 10000;
    c.redis_leases = true; /* the default */
    return c;
}

static int setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    sl_log_set_level(SL_LOG_ERROR);
    memset(&srv, 0, sizeof(srv));
    rs_start(&srv);
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/2", srv.port);
    base = event_base_new();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    event_base_free(base);
    rs_cleanup(&srv);
    return 0;
}

static void test_shared_limit(void **state)
{
    (void)state;
    conf_ratelimit_t c = conf0();
    c.per_user.requests_per_minute = 10;
    inst_t a, b;
    inst_new(&a, &c);
    inst_new(&b, &c);
    assert_true(rs_run_until(base, up, a.w, 2000));
    assert_true(rs_run_until(base, up, b.w, 2000));
    rl_decision_t d;
    int ok = 0;
    bool async;
    for (int i = 0; i < 20; i++) {
        ok += check(i % 2 ? &b : &a, "shared", 0, &d, NULL, &async);
        assert_true(async);
        assert_false(d.store_error);
    }
    assert_int_equal(ok, 10);
    assert_true(mode("redis") >= 2);
    assert_int_equal(d.limit, RL_LIMIT_REQUESTS);
    assert_int_equal(d.limit_value, 10);
    assert_int_equal(d.remaining, 0);
    assert_true(d.retry_after_ms > 5000 && d.retry_after_ms <= 6000);
    /* another user is served */
    assert_true(check(&a, "other", 0, &d, NULL, NULL));
    assert_int_equal(d.remaining, 9);
    /* the script cache flushed under us: NOSCRIPT is handled */
    freeReplyObject(rs_cmd(&srv, "SCRIPT FLUSH"));
    assert_true(check(&b, "third", 0, &d, NULL, NULL));
    inst_free(&a);
    inst_free(&b);
}

static void test_concurrency_and_tokens(void **state)
{
    (void)state;
    conf_ratelimit_t c = conf0();
    c.per_user.concurrent = 2;
    c.per_user.tokens_per_minute = 1000;
    inst_t a, b;
    inst_new(&a, &c);
    inst_new(&b, &c);
    assert_true(rs_run_until(base, up, a.w, 2000));
    assert_true(rs_run_until(base, up, b.w, 2000));
    rl_decision_t d;
    rl_ticket_t *t1, *t2, *t3;
    assert_true(check(&a, "cc", 600, &d, &t1, NULL));
    assert_int_equal(d.limit, RL_LIMIT_TOKENS_MINUTE);
    assert_int_equal(d.remaining, 400);
    /* tokens refused on the other instance, before the request starts */
    assert_false(check(&b, "cc", 600, &d, &t3, NULL));
    assert_int_equal(d.limit, RL_LIMIT_TOKENS_MINUTE);
    assert_true(d.retry_after_ms > 11000 && d.retry_after_ms <= 12000);
    assert_true(check(&b, "cc", 100, &d, &t2, NULL));
    /* two in flight: the third is refused whichever instance it hits */
    assert_false(check(&b, "cc", 1, &d, &t3, NULL));
    assert_int_equal(d.limit, RL_LIMIT_CONCURRENT);
    assert_int_equal(d.retry_after_ms, 1000);
    /* more than the whole budget: never */
    rl_ticket_settle(t2, 100); /* same connection as the next checks: ordered */
    assert_false(check(&b, "cc", 5000, &d, &t3, NULL));
    assert_int_equal(d.retry_after_ms, -1);
    /* settle the 600 with 100 used: 500 back, slot back */
    rl_ticket_settle(t1, 100);
    assert_true(check(&a, "cc", 600, &d, &t1, NULL));
    /* release gives back all of it */
    rl_ticket_release(t1);
    assert_true(check(&a, "cc", 600, &d, &t1, NULL));
    assert_true(check(&a, "cc", 100, &d, &t2, NULL));
    rl_ticket_settle(t1, 600);
    rl_ticket_settle(t2, 100);
    inst_free(&a);
    inst_free(&b);
}

static void test_cancel(void **state)
{
    (void)state;
    conf_ratelimit_t c = conf0();
    c.per_user.concurrent = 1;
    inst_t a;
    inst_new(&a, &c);
    assert_true(rs_run_until(base, up, a.w, 2000));
    rl_request_t req = {.user = "canceller"};
    answer_t ans = {0};
    rl_decision_t d;
    rl_ticket_t *t = NULL;
    rl_pending_t *p = NULL;
    assert_int_equal(rl_check(a.w, &req, &d, &t, answer_cb, &ans, &p), RL_PENDING);
    rl_pending_cancel(p);
    rs_run_for(base, 100);
    assert_int_equal(ans.calls, 0);
    /* the slot the script took for it was given back */
    assert_true(check(&a, "canceller", 0, &d, &t, NULL));
    rl_ticket_settle(t, 0);
    inst_free(&a);
}

/* Redis dies and comes back, under one on_store_error mode. */
static void store_error_case(int on_err, const char *action)
{
    conf_ratelimit_t c = conf0();
    c.per_user.requests_per_minute = 3;
    c.on_store_error = on_err;
    inst_t a;
    inst_new_50(&a, &c);
    assert_true(rs_run_until(base, up, a.w, 2000));
    rl_decision_t d;
    char user[32];
    snprintf(user, sizeof(user), "se-%s", action);
    assert_true(check(&a, user, 0, &d, NULL, NULL));
    assert_false(d.store_error);

    /* a check in flight when Redis dies (paused, then killed): the pause
     * is answered before the check is made, so Redis surely holds it */
    redisReply *pause = rs_cmd(&srv, "CLIENT PAUSE 2000");
    assert_non_null(pause);
    freeReplyObject(pause);
    uint64_t e0 = store_errors(action);
    rl_request_t req = {.user = user};
    answer_t ans = {0};
    rl_ticket_t *t = NULL;
    rl_pending_t *p = NULL;
    int64_t start = sl_now_ms();
    assert_int_equal(rl_check(a.w, &req, &d, &t, answer_cb, &ans, &p), RL_PENDING);
    assert_true(rs_run_until(base, answered, &ans, 1000));
    int64_t took = sl_now_ms() - start;
    assert_true(took >= 45 && took < 1000); /* the 50 ms deadline, not the pause */
    assert_true(ans.d.store_error);
    assert_int_equal(store_errors(action), e0 + 1);
    rl_ticket_settle(ans.t, 0);
    rs_kill(&srv);
    assert_true(rs_run_until(base, down, a.w, 2000));

    /* while down: decided at once, without waiting for Redis */
    int ok = 0;
    for (int i = 0; i < 6; i++) {
        bool async = true;
        ok += check(&a, user, 0, &d, NULL, &async);
        assert_false(async);
        assert_true(d.store_error);
    }
    assert_int_equal(store_errors(action), e0 + 7);
    assert_true(mode("degraded") >= 1);
    if (on_err == CONF_STORE_ERROR_ALLOW) {
        assert_int_equal(ok, 6);
    } else if (on_err == CONF_STORE_ERROR_DENY) {
        assert_int_equal(ok, 0);
        assert_int_equal(d.limit, RL_LIMIT_STORE);
        assert_int_equal(rl_decision_status(&d), 503);
    } else {
        /* this instance's own limit of 3, one of which the timed-out
         * check above took locally */
        assert_int_equal(ok, 2);
        assert_int_equal(d.limit, RL_LIMIT_REQUESTS);
    }

    /* Redis comes back (empty): the limiter returns to it on its own */
    rs_start(&srv);
    assert_true(rs_run_until(base, up, a.w, 7000));
    bool async = false;
    assert_true(check(&a, user, 0, &d, NULL, &async));
    assert_true(async);
    assert_false(d.store_error);
    assert_int_equal(d.remaining, 2);
    inst_free(&a);
}

static void test_store_error_allow(void **state)
{
    (void)state;
    store_error_case(CONF_STORE_ERROR_ALLOW, "allow");
}

static void test_store_error_deny(void **state)
{
    (void)state;
    store_error_case(CONF_STORE_ERROR_DENY, "deny");
}

static void test_store_error_local(void **state)
{
    (void)state;
    store_error_case(CONF_STORE_ERROR_LOCAL, "local");
}

/* ---- batching ---------------------------------------------------------------- */

/* EVALSHA calls Redis has run since the last CONFIG RESETSTAT. */
static long long evalsha_calls(void)
{
    redisReply *r = rs_cmd(&srv, "INFO commandstats");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    long long n = 0;
    const char *p = strstr(r->str, "cmdstat_evalsha:calls=");
    if (p)
        n = strtoll(p + strlen("cmdstat_evalsha:calls="), NULL, 10);
    freeReplyObject(r);
    return n;
}

static void reset_stats(void)
{
    freeReplyObject(rs_cmd(&srv, "CONFIG RESETSTAT"));
    assert_int_equal(evalsha_calls(), 0);
}

#define NB 100

typedef struct many {
    answer_t a[NB];
    int n;
} many_t;

static bool all_answered(void *arg)
{
    many_t *m = arg;
    for (int i = 0; i < m->n; i++)
        if (m->a[i].calls == 0)
            return false;
    return true;
}

/* n checks queued in the same turn of the loop (no loop run in between). */
static void check_many(inst_t *in, many_t *m, const char *const *users, int n, rl_pending_t **ps)
{
    memset(m, 0, sizeof(*m));
    m->n = n;
    for (int i = 0; i < n; i++) {
        rl_request_t req = {.user = users[i]};
        rl_decision_t d;
        rl_ticket_t *t = NULL;
        rl_pending_t *p = NULL;
        assert_int_equal(rl_check(in->w, &req, &d, &t, answer_cb, &m->a[i], &p), RL_PENDING);
        assert_non_null(p);
        if (ps)
            ps[i] = p;
    }
    for (int i = 0; i < n; i++)
        assert_int_equal(m->a[i].calls, 0); /* never inside rl_check */
}

static void many_settle(many_t *m)
{
    for (int i = 0; i < m->n; i++) {
        assert_true(m->a[i].calls <= 1);
        rl_ticket_settle(m->a[i].t, 0);
    }
}

static void test_batch_one_round_trip(void **state)
{
    (void)state;
    conf_ratelimit_t c = conf0();
    c.per_user.requests_per_minute = 3;
    inst_t a;
    inst_new(&a, &c);
    assert_true(rs_run_until(base, up, a.w, 2000));
    /* 5 users, 4 checks each, interleaved: u0 u1 .. u4 u0 u1 .. */
    static const char *const names[5] = {"bt-0", "bt-1", "bt-2", "bt-3", "bt-4"};
    const char *users[20];
    for (int i = 0; i < 20; i++)
        users[i] = names[i % 5];
    reset_stats();
    many_t m;
    check_many(&a, &m, users, 20, NULL);
    assert_true(rs_run_until(base, all_answered, &m, 2000));
    assert_int_equal(evalsha_calls(), 1); /* 20 requests, one round trip */
    /* each answer is its own request's: round r of every user leaves 2-r */
    for (int i = 0; i < 20; i++) {
        const rl_decision_t *d = &m.a[i].d;
        int round = i / 5;
        assert_int_equal(m.a[i].calls, 1);
        assert_false(d->store_error);
        assert_int_equal(d->limit, RL_LIMIT_REQUESTS);
        if (round < 3) {
            assert_true(d->allowed);
            assert_int_equal(d->remaining, 2 - round);
        } else {
            assert_false(d->allowed);
            assert_int_equal(d->remaining, 0);
            assert_true(d->retry_after_ms > 19000 && d->retry_after_ms <= 20000);
        }
    }
    many_settle(&m);

    /* more than one batch's worth in one turn: split in RL_BATCH_MAX */
    const char *more[NB];
    char bufs[NB][16];
    for (int i = 0; i < NB; i++) {
        snprintf(bufs[i], sizeof(bufs[i]), "bm-%d", i);
        more[i] = bufs[i];
    }
    reset_stats();
    check_many(&a, &m, more, NB, NULL);
    assert_true(rs_run_until(base, all_answered, &m, 2000));
    assert_int_equal(evalsha_calls(), (NB + RL_BATCH_MAX - 1) / RL_BATCH_MAX);
    for (int i = 0; i < NB; i++) {
        assert_true(m.a[i].d.allowed);
        assert_int_equal(m.a[i].d.remaining, 2);
    }
    many_settle(&m);

    /* one at a time (the loop runs between them): one call each */
    reset_stats();
    rl_decision_t d;
    for (int i = 0; i < 3; i++)
        assert_true(check(&a, "bt-seq", 0, &d, NULL, NULL));
    assert_int_equal(evalsha_calls(), 3);
    inst_free(&a);
}

/* A key Redis cannot use (another type under the limiter's name) fails its
 * own entry; the batch's other entries are answered from Redis. */
static void test_batch_one_failing_entry(void **state)
{
    (void)state;
    conf_ratelimit_t c = conf0();
    c.per_user.requests_per_minute = 5;
    c.on_store_error = CONF_STORE_ERROR_DENY;
    inst_t a;
    inst_new(&a, &c);
    assert_true(rs_run_until(base, up, a.w, 2000));
    redisContext *rc = rs_connect(&srv); /* the limiter's database is 2 */
    assert_non_null(rc);
    freeReplyObject(redisCommand(rc, "SELECT 2"));
    freeReplyObject(redisCommand(rc, "SET sl:rl:{u:bf-bad} not-a-hash"));
    redisFree(rc);
    static const char *const users[4] = {"bf-ok1", "bf-bad", "bf-ok2", "bf-ok1"};
    uint64_t e0 = store_errors("deny");
    reset_stats();
    many_t m;
    check_many(&a, &m, users, 4, NULL);
    assert_true(rs_run_until(base, all_answered, &m, 2000));
    assert_int_equal(evalsha_calls(), 1);
    assert_true(m.a[0].d.allowed && !m.a[0].d.store_error);
    assert_int_equal(m.a[0].d.remaining, 4);
    assert_false(m.a[1].d.allowed);
    assert_true(m.a[1].d.store_error);
    assert_int_equal(m.a[1].d.limit, RL_LIMIT_STORE);
    assert_true(m.a[2].d.allowed && !m.a[2].d.store_error);
    assert_int_equal(m.a[2].d.remaining, 4);
    assert_true(m.a[3].d.allowed && !m.a[3].d.store_error);
    assert_int_equal(m.a[3].d.remaining, 3);
    assert_int_equal(store_errors("deny"), e0 + 1);
    many_settle(&m);
    inst_free(&a);
}

/* Redis stalls with a batch in flight: every check of it ends once, at the
 * deadline, through on_store_error; a check cancelled meanwhile does not
 * call back; one cancelled before its batch was sent never reaches Redis. */
static void test_batch_timeout(void **state)
{
    (void)state;
    conf_ratelimit_t c = conf0();
    c.per_user.requests_per_minute = 100;
    c.on_store_error = CONF_STORE_ERROR_ALLOW;
    inst_t a;
    inst_new_50(&a, &c);
    assert_true(rs_run_until(base, up, a.w, 2000));

    /* cancelled in the turn it was made: nothing is sent */
    reset_stats();
    rl_request_t req = {.user = "bto-c"};
    answer_t ans = {0};
    rl_decision_t d;
    rl_ticket_t *t = NULL;
    rl_pending_t *p = NULL;
    assert_int_equal(rl_check(a.w, &req, &d, &t, answer_cb, &ans, &p), RL_PENDING);
    rl_pending_cancel(p);
    rs_run_for(base, 50);
    assert_int_equal(ans.calls, 0);
    assert_int_equal(evalsha_calls(), 0);

    /* answered before the batch is made: Redis surely holds it */
    redisReply *pause = rs_cmd(&srv, "CLIENT PAUSE 1500");
    assert_non_null(pause);
    freeReplyObject(pause);
    uint64_t e0 = store_errors("allow");
    static const char *const users[6] = {"bto-0", "bto-1", "bto-2", "bto-0", "bto-3", "bto-4"};
    rl_pending_t *ps[6];
    many_t m;
    int64_t start = sl_now_ms();
    check_many(&a, &m, users, 6, ps);
    rs_run_for(base, 5); /* the batch is on its way */
    rl_pending_cancel(ps[2]);
    m.a[2].calls = 1; /* not expected: all_answered skips it */
    assert_true(rs_run_until(base, all_answered, &m, 1000));
    int64_t took = sl_now_ms() - start;
    assert_true(took >= 45 && took < 1000); /* the 50 ms deadline, once for all */
    m.a[2].calls = 0;
    for (int i = 0; i < 6; i++) {
        if (i == 2)
            continue;
        assert_int_equal(m.a[i].calls, 1);
        assert_true(m.a[i].d.allowed);
        assert_true(m.a[i].d.store_error);
    }
    assert_int_equal(store_errors("allow"), e0 + 5);
    many_settle(&m);
    /* the late reply (the pause ends: a PING waits it out) is dropped;
     * nothing calls back twice, and the cancelled check still gets nothing */
    assert_true(rs_ping(&srv));
    rs_run_for(base, 100);
    for (int i = 0; i < 6; i++)
        assert_int_equal(m.a[i].calls, i == 2 ? 0 : 1);
    /* and Redis serves the next batch */
    assert_true(rs_run_until(base, up, a.w, 2000));
    assert_true(check(&a, "bto-0", 0, &d, NULL, NULL));
    assert_false(d.store_error);
    inst_free(&a);
}

/* ---- leased local quotas ------------------------------------------------------ */

/* Request units Redis counts as taken for a user now (its GCRA time ahead of
 * Redis's clock, in units of 60 s / rpm), read from the hash itself. */
static double redis_used(const char *user, int64_t rpm)
{
    redisContext *rc = rs_connect(&srv);
    assert_non_null(rc);
    freeReplyObject(redisCommand(rc, "SELECT 2"));
    redisReply *h = redisCommand(rc, "HGET sl:rl:{u:%s} r", user);
    redisReply *tm = redisCommand(rc, "TIME");
    assert_non_null(h);
    assert_non_null(tm);
    assert_int_equal(h->type, REDIS_REPLY_STRING);
    double tat = strtod(h->str, NULL);
    double now = strtod(tm->element[0]->str, NULL) * 1e6 + strtod(tm->element[1]->str, NULL);
    freeReplyObject(h);
    freeReplyObject(tm);
    redisFree(rc);
    return tat > now ? (tat - now) / (60e6 / (double)rpm) : 0;
}

typedef struct turns {
    int sent, allowed, local;
    answer_t a[32];
    int n;
} turns_t;

static bool turn_answered(void *arg)
{
    turns_t *tt = arg;
    for (int i = 0; i < tt->n; i++)
        if (tt->a[i].calls == 0)
            return false;
    return true;
}

/* One turn of the loop with n checks of one user under pol (NULL: the
 * limiter's own); returns those allowed. */
static int turn_pol(inst_t *in, const rl_policy_t *pol, const char *user, int n, turns_t *tt,
                    int64_t rpm)
{
    memset(tt->a, 0, sizeof(tt->a));
    tt->n = 0;
    int ok = 0;
    for (int i = 0; i < n; i++) {
        rl_request_t req = {.policy = pol, .user = user};
        rl_decision_t d;
        rl_ticket_t *t = NULL;
        rl_pending_t *p = NULL;
        answer_t *a = &tt->a[tt->n];
        rl_check_rc_t rc = rl_check(in->w, &req, &d, &t, answer_cb, a, &p);
        assert_int_not_equal(rc, RL_ERROR);
        if (rc == RL_DONE) { /* a leased unit: decided here */
            assert_true(d.allowed);
            assert_false(d.store_error);
            assert_int_equal(d.limit, RL_LIMIT_REQUESTS);
            assert_int_equal(d.limit_value, rpm);
            assert_true(d.remaining >= 0 && d.remaining <= rpm);
            rl_ticket_settle(t, 0);
            tt->local++;
            ok++;
        } else {
            tt->n++;
        }
    }
    assert_true(rs_run_until(base, turn_answered, tt, 2000));
    for (int i = 0; i < tt->n; i++) {
        assert_int_equal(tt->a[i].calls, 1);
        assert_false(tt->a[i].d.store_error);
        ok += tt->a[i].d.allowed;
        rl_ticket_settle(tt->a[i].t, 0);
    }
    tt->sent += n;
    tt->allowed += ok;
    return ok;
}

static int turn(inst_t *in, const char *user, int n, turns_t *tt, int64_t rpm)
{
    return turn_pol(in, NULL, user, n, tt, rpm);
}

/* A busy key with a big limit: most checks are decided from a lease, a
 * fraction of them reach Redis; what is leased and not spent goes back. */
static void test_lease_hot_key(void **state)
{
    (void)state;
    const int64_t rpm = 6400;
    conf_ratelimit_t c = conf0();
    c.per_user.requests_per_minute = rpm;
    inst_t a;
    inst_new(&a, &c);
    assert_true(rs_run_until(base, up, a.w, 2000));
    reset_stats();
    turns_t tt = {0};
    int64_t t0 = sl_now_ms();
    for (int i = 0; i < 20; i++)
        assert_int_equal(turn(&a, "lease-hot", 32, &tt, rpm), 32);
    long long calls = evalsha_calls();
    printf("lease: %d checks, %d from a lease, %lld EVALSHA\n", tt.sent, tt.local, calls);
    assert_true(tt.local >= tt.sent / 2);
    assert_true(calls * 8 < tt.sent);
    /* Redis has counted every allowed request, plus units still leased */
    double used = redis_used("lease-hot", rpm);
    double refill = (double)(sl_now_ms() - t0) / (60e3 / (double)rpm) + 2;
    assert_true(used >= tt.allowed - refill);
    assert_true(used <= tt.allowed + RL_LEASE_MAX + 1);
    /* after the lease's time the units not spent go back */
    rs_run_for(base, RL_LEASE_TTL_MS + 2 * RL_LEASE_SWEEP_MS);
    /* the bucket refilled one every 9.4 ms since the start (never dry) */
    refill = (double)(sl_now_ms() - t0) / (60e3 / (double)rpm);
    double after = redis_used("lease-hot", rpm);
    printf("lease: Redis counts %.1f used with the lease held, %.1f after (allowed less "
           "refill %.1f)\n",
           used, after, tt.allowed - refill);
    assert_true(after > 0);
    /* slack: the first script ran a little after t0 (up to ~280 ms on a
     * loaded machine); a lease not given back would be up to 64 more */
    assert_true(after <= tt.allowed - refill + 30);
    inst_free(&a);
}

/* One request at a time never leases (each is one round trip, exact
 * remaining) until it is busy (more than RL_LEASE_START checks within the
 * lease time); nor does a busy key with ratelimit.redis_leases off. */
static void test_lease_not_when_idle(void **state)
{
    (void)state;
    conf_ratelimit_t c = conf0();
    c.per_user.requests_per_minute = 6400;
    inst_t a;
    inst_new(&a, &c);
    assert_true(rs_run_until(base, up, a.w, 2000));
    reset_stats();
    rl_decision_t d;
    for (int i = 0; i < 5; i++) {
        bool async = false;
        assert_true(check(&a, "lease-seq", 0, &d, NULL, &async));
        assert_true(async);
        /* GCRA gives a unit back every 9.4 ms at 6400/min: on a slow run
         * (ASan, a loaded machine) the checks can be that far apart */
        assert_true(d.remaining >= 6400 - 1 - i && d.remaining <= 6400 - 1);
    }
    assert_int_equal(evalsha_calls(), 5);
    inst_free(&a);

    c.redis_leases = false;
    inst_new(&a, &c);
    assert_true(rs_run_until(base, up, a.w, 2000));
    reset_stats();
    turns_t tt = {0};
    for (int i = 0; i < 5; i++)
        assert_int_equal(turn(&a, "lease-off", 32, &tt, 6400), 32);
    assert_int_equal(tt.local, 0);
    assert_int_equal(evalsha_calls(), 5); /* one batch per turn */
    inst_free(&a);
}

/* Two instances hammer one key near its limit: leases never let more than
 * the limit through (the units are taken in Redis first), and what one
 * instance leased and did not spend comes back for the other. */
static void test_lease_exact_at_limit(void **state)
{
    (void)state;
    const int64_t rpm = 640; /* leases of at most 10 */
    conf_ratelimit_t c = conf0();
    c.per_user.requests_per_minute = rpm;
    inst_t a, b;
    inst_new(&a, &c);
    inst_new(&b, &c);
    assert_true(rs_run_until(base, up, a.w, 2000));
    assert_true(rs_run_until(base, up, b.w, 2000));
    turns_t ta = {0}, tb = {0};
    int64_t t0 = sl_now_ms();
    int idle = 0;
    while (idle < 3) {
        int ok = turn(&a, "lease-lim", 16, &ta, rpm) + turn(&b, "lease-lim", 16, &tb, rpm);
        idle = ok ? 0 : idle + 1;
        assert_true(ta.sent + tb.sent < 4000);
    }
    double per_ms = (double)rpm / 60e3;
    int total = ta.allowed + tb.allowed;
    printf("lease at the limit: %d allowed (%d, %d; %d, %d from leases) of %d\n", total, ta.allowed,
           tb.allowed, ta.local, tb.local, ta.sent + tb.sent);
    assert_true(ta.local + tb.local > 0);
    assert_true(total <= rpm + (double)(sl_now_ms() - t0) * per_ms + 1);
    assert_true(total >= rpm - 2 * 2 * 10); /* < 2 leases held per limiter */
    /* leftovers go back; then the two use up exactly what is left */
    rs_run_for(base, RL_LEASE_TTL_MS + 2 * RL_LEASE_SWEEP_MS);
    idle = 0;
    while (idle < 3) {
        int ok = turn(&b, "lease-lim", 16, &tb, rpm) + turn(&a, "lease-lim", 16, &ta, rpm);
        idle = ok ? 0 : idle + 1;
        assert_true(ta.sent + tb.sent < 8000);
    }
    total = ta.allowed + tb.allowed;
    double bound = rpm + (double)(sl_now_ms() - t0) * per_ms + 1;
    printf("then: %d allowed, bound %.1f\n", total, bound);
    assert_true(total >= rpm);
    assert_true(total <= bound);
    inst_free(&a);
    inst_free(&b);
}

/* A reload changes the limit: units leased under the old one are not spent
 * under the new one; they go back, and leases start again under the new. */
static void test_lease_reload(void **state)
{
    (void)state;
    conf_ratelimit_t c = conf0();
    c.per_user.requests_per_minute = 6400;
    inst_t a;
    inst_new(&a, &c);
    assert_true(rs_run_until(base, up, a.w, 2000));
    turns_t tt = {0};
    int64_t t0 = sl_now_ms();
    for (int i = 0; i < 6; i++)
        assert_int_equal(turn(&a, "lease-rl", 32, &tt, 6400), 32);
    assert_true(tt.local > 0);
    char err[256];
    conf_ratelimit_t c2 = c;
    c2.per_user.requests_per_minute = 12800;
    rl_policy_t *p2 = rl_policy_new(&c2, err, sizeof(err));
    assert_non_null(p2);
    /* the first check under the new limit goes to Redis */
    rl_request_t req = {.policy = p2, .user = "lease-rl"};
    answer_t ans = {0};
    rl_decision_t d;
    rl_ticket_t *t = NULL;
    rl_pending_t *p = NULL;
    assert_int_equal(rl_check(a.w, &req, &d, &t, answer_cb, &ans, &p), RL_PENDING);
    assert_true(rs_run_until(base, answered, &ans, 2000));
    assert_true(ans.d.allowed);
    assert_int_equal(ans.d.limit_value, 12800);
    rl_ticket_settle(ans.t, 0);
    /* then leases again, under the new limit (turn_pol checks limit_value) */
    turns_t t2 = {0};
    for (int i = 0; i < 6; i++)
        assert_int_equal(turn_pol(&a, p2, "lease-rl", 32, &t2, 12800), 32);
    assert_true(t2.local > 0);
    /* and what is not spent goes back: Redis counts what was allowed */
    rs_run_for(base, RL_LEASE_TTL_MS + 2 * RL_LEASE_SWEEP_MS);
    /* in units of the new limit: an old unit (6400/min) counts 2; the
     * bucket refilled one every 4.7 ms since the start (it never ran dry) */
    double consumed = 2.0 * tt.allowed + t2.allowed + 1;
    double refill = (double)(sl_now_ms() - t0) * 12800.0 / 60000.0;
    double used = redis_used("lease-rl", 12800);
    printf("lease across a reload: %d + %d allowed, Redis counts %.1f, allowed less "
           "refill %.1f\n",
           tt.allowed, t2.allowed + 1, used, consumed - refill);
    assert_true(used > 0);
    assert_true(used <= consumed - refill + 30); /* the slack: as in test_lease_hot_key */
    inst_free(&a);
    rl_policy_free(p2);
}

/* The clock of the lease tests that must not see time pass (no unit
 * expires, every lease is spent "fast"): what is left is arrival order. */
static int64_t frozen_ns;

static int64_t frozen_clock(void *arg)
{
    (void)arg;
    return frozen_ns;
}

static uint64_t decided(const char *by)
{
    sl_metric_t *m = sl_metric_register("sluice_ratelimit_redis_checks_total", "",
                                        SL_METRIC_COUNTER, "by", NULL, 0);
    return sl_counter_value(sl_metric_series1(m, by));
}

#define TR_ROUNDS 15
#define TR_EACH   40

/* Answers to checks made one per turn (those not decided at once). */
typedef struct trickle {
    answer_t a[2 * RL_LEASE_MAX];
    int n;
} trickle_t;

static bool trickle_answered(void *arg)
{
    trickle_t *tr = arg;
    for (int i = 0; i < tr->n; i++)
        if (tr->a[i].calls == 0)
            return false;
    return true;
}

/* EVALSHA calls n requests of one leased key may make: a few for the
 * first check and ask, one per doubling up to RL_LEASE_MAX, then one per
 * half lease. */
static long long lease_call_bound(int n)
{
    int log2cap = 0;
    while ((1 << log2cap) < RL_LEASE_MAX)
        log2cap++;
    return 3 + log2cap + (n + RL_LEASE_MAX / 2) / (RL_LEASE_MAX / 2 + 1);
}

/* A busy key whose requests come one per loop turn while Redis is stopped
 * (SIGSTOP: no reply can come between them), then Redis answers; 15 such
 * rounds of 40. Every request arriving while the lease is empty and its
 * ask is out used to make a Redis call of its own (one per turn: 600
 * requests, 177 EVALSHA); it now waits for the ask, so the calls are
 * bounded by the lease sizes alone (docs/ratelimit.md, "Leases"): at most
 * 3 + log2(RL_LEASE_MAX) + N / (RL_LEASE_MAX / 2 + 1) for N requests. */
static void test_lease_calls_bounded_by_requests(void **state)
{
    (void)state;
    const int64_t rpm = 64000; /* leases of 64; 600 never near half the bucket */
    conf_ratelimit_t c = conf0();
    c.per_user.requests_per_minute = rpm;
    inst_t a;
    inst_new(&a, &c);
    frozen_ns = sl_now_ns();
    rl_set_clock(a.rl, frozen_clock, NULL);
    assert_true(rs_run_until(base, up, a.w, 2000));
    reset_stats();
    uint64_t by_redis = decided("redis"), by_lease = decided("lease");
    int local = 0, allowed = 0;
    for (int r = 0; r < TR_ROUNDS; r++) {
        trickle_t tr;
        memset(&tr, 0, sizeof(tr));
        assert_int_equal(kill(srv.pid, SIGSTOP), 0);
        for (int i = 0; i < TR_EACH; i++) {
            rl_request_t req = {.user = "lease-trickle"};
            rl_decision_t d;
            rl_ticket_t *t = NULL;
            rl_pending_t *p = NULL;
            rl_check_rc_t rc = rl_check(a.w, &req, &d, &t, answer_cb, &tr.a[tr.n], &p);
            if (rc == RL_DONE && d.allowed) {
                rl_ticket_settle(t, 0);
                local++;
                allowed++;
            } else if (rc == RL_PENDING) {
                tr.n++;
            }
            /* the turn ends: this turn's batch, if any, goes out (a reply
             * Redis wrote before it stopped may come in too) */
            event_base_loop(base, EVLOOP_NONBLOCK);
        }
        assert_int_equal(kill(srv.pid, SIGCONT), 0);
        assert_true(rs_run_until(base, trickle_answered, &tr, 2000));
        for (int i = 0; i < tr.n; i++) {
            assert_int_equal(tr.a[i].calls, 1);
            assert_true(tr.a[i].d.allowed);
            assert_false(tr.a[i].d.store_error);
            assert_int_equal(tr.a[i].d.limit_value, rpm);
            allowed++;
            rl_ticket_settle(tr.a[i].t, 0);
        }
    }
    const int n = TR_ROUNDS * TR_EACH;
    long long calls = evalsha_calls();
    uint64_t dr = decided("redis") - by_redis, dl = decided("lease") - by_lease;
    long long bound = lease_call_bound(n);
    printf("lease, one request a turn: %d requests, %d at once from a lease, %llu by Redis, "
           "%llu from leases, %lld EVALSHA (bound %lld)\n",
           n, local, (unsigned long long)dr, (unsigned long long)dl, calls, bound);
    assert_int_equal(allowed, n); /* none refused, none failed, none lost */
    assert_int_equal(dr + dl, n); /* every request counted once */
    assert_true(dr <= 2);         /* the first, and the first ask */
    assert_true(calls <= bound);
    inst_free(&a);
}

/* The same key's requests one at a time, each waiting for its answer (the
 * most a loaded machine can spread a burst): the old rule leased only when
 * checks of a key overlapped, so this made one Redis call per request
 * (200). A key with more than RL_LEASE_START checks within the lease time
 * leases anyway, and the calls are bounded as above. */
static void test_lease_one_at_a_time_busy(void **state)
{
    (void)state;
    const int64_t rpm = 64000;
    conf_ratelimit_t c = conf0();
    c.per_user.requests_per_minute = rpm;
    inst_t a;
    inst_new(&a, &c);
    frozen_ns = sl_now_ns();
    rl_set_clock(a.rl, frozen_clock, NULL);
    assert_true(rs_run_until(base, up, a.w, 2000));
    reset_stats();
    uint64_t by_redis = decided("redis"), by_lease = decided("lease");
    const int n = 200;
    for (int i = 0; i < n; i++) {
        rl_decision_t d;
        assert_true(check(&a, "lease-seq-busy", 0, &d, NULL, NULL));
        assert_int_equal(d.limit_value, rpm);
    }
    long long calls = evalsha_calls();
    uint64_t dr = decided("redis") - by_redis, dl = decided("lease") - by_lease;
    long long bound = RL_LEASE_START + lease_call_bound(n);
    printf("lease, one request at a time: %d requests, %llu by Redis, %llu from leases, %lld "
           "EVALSHA (bound %lld)\n",
           n, (unsigned long long)dr, (unsigned long long)dl, calls, bound);
    assert_int_equal(dr + dl, n);
    assert_true(dr <= RL_LEASE_START + 1);
    assert_true(calls <= bound);
    inst_free(&a);
}

static bool all_but_3(void *arg)
{
    const many_t *m = arg;
    for (int i = 0; i < m->n; i++)
        if (i != 3 && m->a[i].calls == 0)
            return false;
    return true;
}

/* Checks that wait for the lease ask in flight: one cancelled is dropped
 * when the ask comes back (no callback; its unit stays in the lease); when
 * the ask's batch misses its deadline, each of the others gets
 * on_store_error once, as its own Redis check would have. */
static void test_lease_waiters_cancel_and_deadline(void **state)
{
    (void)state;
    const int64_t rpm = 64000;
    conf_ratelimit_t c = conf0();
    c.per_user.requests_per_minute = rpm;
    inst_t a;
    inst_new_50(&a, &c);
    frozen_ns = sl_now_ns();
    rl_set_clock(a.rl, frozen_clock, NULL);
    assert_true(rs_run_until(base, up, a.w, 2000));
    /* six checks in one turn: the second asks for a lease, the last four
     * wait for it */
    many_t m;
    const char *users[6] = {"lease-w", "lease-w", "lease-w", "lease-w", "lease-w", "lease-w"};
    rl_pending_t *ps[6];
    uint64_t lease0 = decided("lease");
    check_many(&a, &m, users, 6, ps);
    rl_pending_cancel(ps[3]);
    assert_true(rs_run_until(base, all_but_3, &m, 2000));
    rs_run_for(base, 20); /* nothing more comes for the cancelled one */
    for (int i = 0; i < 6; i++) {
        if (i == 3) {
            assert_int_equal(m.a[i].calls, 0);
            continue;
        }
        assert_int_equal(m.a[i].calls, 1);
        assert_true(m.a[i].d.allowed);
        assert_false(m.a[i].d.store_error);
        rl_ticket_settle(m.a[i].t, 0);
    }
    assert_int_equal(decided("lease") - lease0, 3); /* the three that waited */
    /* spend what the lease holds, then wait behind an ask Redis cannot
     * answer in time */
    uint64_t allow0 = store_errors("allow");
    uint64_t at_once = 0;
    int done_ok = 0;
    trickle_t w;
    memset(&w, 0, sizeof(w));
    assert_int_equal(kill(srv.pid, SIGSTOP), 0);
    for (int i = 0; i < 2 * RL_LEASE_MAX; i++) {
        rl_request_t req = {.user = "lease-w"};
        rl_decision_t d;
        rl_ticket_t *t = NULL;
        rl_pending_t *p = NULL;
        rl_check_rc_t rc = rl_check(a.w, &req, &d, &t, answer_cb, &w.a[w.n], &p);
        if (rc == RL_DONE) {
            done_ok += d.allowed;
            at_once += d.store_error; /* the client already gave up on Redis */
            rl_ticket_settle(t, 0);
        } else if (rc == RL_PENDING) {
            w.n++;
        }
        event_base_loop(base, EVLOOP_NONBLOCK);
    }
    bool all = rs_run_until(base, trickle_answered, &w, 2000);
    assert_int_equal(kill(srv.pid, SIGCONT), 0);
    assert_true(all);
    assert_int_equal(done_ok + w.n, 2 * RL_LEASE_MAX);
    assert_true(w.n > 1);
    for (int i = 0; i < w.n; i++) {
        assert_int_equal(w.a[i].calls, 1);
        assert_true(w.a[i].d.allowed);
        assert_true(w.a[i].d.store_error);
        rl_ticket_settle(w.a[i].t, 0);
    }
    assert_int_equal(store_errors("allow") - allow0, (uint64_t)w.n + at_once);
    assert_true(rs_run_until(base, up, a.w, 3000));
    inst_free(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_limit),
        cmocka_unit_test(test_concurrency_and_tokens),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_store_error_allow),
        cmocka_unit_test(test_store_error_deny),
        cmocka_unit_test(test_store_error_local),
        cmocka_unit_test(test_batch_one_round_trip),
        cmocka_unit_test(test_batch_one_failing_entry),
        cmocka_unit_test(test_batch_timeout),
        cmocka_unit_test(test_lease_hot_key),
        cmocka_unit_test(test_lease_not_when_idle),
        cmocka_unit_test(test_lease_exact_at_limit),
        cmocka_unit_test(test_lease_reload),
        cmocka_unit_test(test_lease_calls_bounded_by_requests),
        cmocka_unit_test(test_lease_waiters_cancel_and_deadline),
        cmocka_unit_test(test_lease_one_at_a_time_busy),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
