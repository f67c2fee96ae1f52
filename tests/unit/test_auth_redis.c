/* Unit tests of the Redis-backed checks against a real redis-server the
 * test starts on its own port: replays and revocations seen by a second
 * instance (own auth_t and stores, own connection), 100 concurrent copies
 * over two instances in two threads letting exactly one through, a late
 * Redis (CLIENT PAUSE), Redis killed (each on_store_error setting) and
 * restarted, and cancellation. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "common/redis.h"
#include "test_auth_util.h"
#include "tests/unit/redis_server.h"

static rs_server_t srv;

/* One sluice instance: its own stores, auth_t, loop and Redis client. */
typedef struct inst {
    tconf_t t;
    auth_stores_t *st;
    auth_t *a;
    struct event_base *base;
    sl_redis_t *r;
} inst_t;

static inst_t A, B;

static bool connected(void *arg)
{
    return sl_redis_connected(arg);
}

static bool disconnected(void *arg)
{
    return !sl_redis_connected(arg);
}

static void inst_open(inst_t *in, int nonces, int revocations, int64_t timeout_ms)
{
    tconf_default(&in->t);
    in->t.c.on_store_error.nonces = nonces;
    in->t.c.on_store_error.revocations = revocations;
    in->st = auth_stores_new(0, 0);
    in->a = t_auth(&in->t, in->st);
    assert_non_null(in->a);
    in->base = event_base_new();
    char url[64], err[128];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", srv.port);
    sl_redis_opts_t o = {.url = url, .timeout_ms = timeout_ms};
    in->r = sl_redis_new(in->base, &o, err, sizeof(err));
    assert_non_null(in->r);
    if (srv.pid > 0)
        assert_true(rs_run_until(in->base, connected, in->r, 2000));
}

static void inst_close(inst_t *in)
{
    sl_redis_free(in->r);
    event_base_free(in->base);
    auth_free(in->a);
    auth_stores_free(in->st);
    memset(in, 0, sizeof(*in));
}

typedef struct done {
    int calls;
    auth_result_t res;
    auth_http_reply_t reply;
} done_t;

static void on_check(void *arg, const auth_result_t *res)
{
    done_t *d = arg;
    d->calls++;
    d->res = *res;
}

static void on_reply(void *arg, auth_http_reply_t *reply)
{
    done_t *d = arg;
    d->calls++;
    d->reply = *reply; /* takes the body */
}

static bool is_done(void *arg)
{
    return ((done_t *)arg)->calls > 0;
}

/* The request path through Redis; waits for the answer. */
static auth_reason_t rcheck(inst_t *in, const auth_request_t *r, int64_t now)
{
    done_t d = {0};
    auth_pending_t *p = NULL;
    auth_status_t st = auth_check(in->a, in->r, r, now, &d.res, on_check, &d, &p);
    if (st == AUTH_DONE)
        return d.res.reason;
    assert_non_null(p);
    assert_true(rs_run_until(in->base, is_done, &d, 2000));
    assert_int_equal(d.calls, 1);
    return d.res.reason;
}

static auth_http_reply_t rrevoke(inst_t *in, const char *body, int64_t now)
{
    static const char admin[] = "Bearer " T_ADMIN_KEY;
    done_t d = {0};
    auth_pending_t *p = NULL;
    auth_status_t st = auth_admin_revoke(in->a, in->r, admin, strlen(admin), body, strlen(body),
                                         now, &d.reply, on_reply, &d, &p);
    if (st == AUTH_PENDING) {
        assert_true(rs_run_until(in->base, is_done, &d, 2000));
        assert_int_equal(d.calls, 1);
    }
    return d.reply;
}

static uint64_t fallbacks(const char *check, const char *action)
{
    sl_metric_t *m = sl_metric_register("sluice_auth_store_fallback_total", "", SL_METRIC_COUNTER,
                                        "check,action", NULL, 0);
    return sl_counter_value(sl_metric_series(m, (const char *[]){check, action}));
}

static int group_setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    rs_start(&srv);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    rs_cleanup(&srv);
    return 0;
}

static int setup(void **state)
{
    (void)state;
    freeReplyObject(rs_cmd(&srv, "FLUSHALL"));
    /* A deadline no test here is about except test_late_redis (which opens
     * its own 50 ms one): a real Redis on two loaded cores, or under ASan,
     * can take more than 50 ms to answer (a fresh server's script load
     * more), and a call that times out is a store error, not the answer
     * the test asserts. */
    inst_open(&A, CONF_STORE_ERROR_DENY, CONF_STORE_ERROR_DENY, 2000);
    inst_open(&B, CONF_STORE_ERROR_DENY, CONF_STORE_ERROR_DENY, 2000);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    inst_close(&A);
    inst_close(&B);
    return 0;
}

static void test_replay_across_instances(void **state)
{
    (void)state;
    char *tok = t_good_token("alice", "jti-r-1");
    treq_t q;
    treq_make(&q, A.a, tok, T_NOW, "redis-nonce-0000001");
    assert_int_equal(rcheck(&A, &q.r, T_NOW), AUTH_OK);
    assert_int_equal(rcheck(&A, &q.r, T_NOW), AUTH_R_SIG_REPLAY);
    assert_int_equal(rcheck(&B, &q.r, T_NOW + 5), AUTH_R_SIG_REPLAY);
    /* Nothing went to the in-process stores: Redis answered. */
    assert_int_equal(auth_stores_nonce_count(A.st) + auth_stores_nonce_count(B.st), 0);
    /* One key, kept for the rest of the window (+1 s of rounding). */
    unsigned char k[AUTH_NONCE_KEY_LEN];
    char hex[2 * AUTH_NONCE_KEY_LEN + 1];
    assert_int_equal(auth_nonce_key("jti-r-1", 7, q.nonce, strlen(q.nonce), k), 0);
    sl_hex(k, sizeof(k), hex);
    redisReply *rep = rs_cmd(&srv, "TTL sluice:nonce:%s", hex);
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
    assert_in_range(rep->integer, 295, 301);
    freeReplyObject(rep);
    /* Another nonce on B passes. */
    treq_make(&q, A.a, tok, T_NOW, "redis-nonce-0000002");
    assert_int_equal(rcheck(&B, &q.r, T_NOW), AUTH_OK);
    free(tok);
}

static void test_revoke_across_instances(void **state)
{
    (void)state;
    char *t1 = t_good_token("bob", "jti-b-1");
    char *t2 = t_good_token("bob", "jti-b-2");
    treq_t q;
    auth_http_reply_t r = rrevoke(&A, "{\"jti\":\"jti-b-1\"}", T_NOW + 10);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"store\":\"redis\""));
    auth_http_reply_clear(&r);
    /* B has never heard of it locally; Redis tells it. */
    assert_int_equal(auth_stores_revocation_count(B.st), 0);
    treq_make(&q, A.a, t1, T_NOW + 11, "redis-rev-nonce-001");
    assert_int_equal(rcheck(&B, &q.r, T_NOW + 11), AUTH_R_TOKEN_REVOKED);
    treq_make(&q, A.a, t2, T_NOW + 11, "redis-rev-nonce-002");
    assert_int_equal(rcheck(&B, &q.r, T_NOW + 11), AUTH_OK);
    /* The revoked token's request did not claim its nonce. */
    treq_make(&q, A.a, t1, T_NOW + 11, "redis-rev-nonce-001");
    redisReply *rep = rs_cmd(&srv, "DBSIZE");
    assert_int_equal(rep->integer, 2); /* rev:j:jti-b-1 and nonce 002 */
    freeReplyObject(rep);
    rep = rs_cmd(&srv, "TTL sluice:rev:j:jti-b-1");
    assert_in_range(rep->integer, 3600 + 60 - 5, 3600 + 60 + 1);
    freeReplyObject(rep);

    /* By sub: tokens issued up to the revocation, on every instance. */
    r = rrevoke(&B, "{\"sub\":\"bob\"}", T_NOW + 20);
    assert_int_equal(r.status, 200);
    auth_http_reply_clear(&r);
    treq_make(&q, A.a, t2, T_NOW + 21, "redis-rev-nonce-003");
    assert_int_equal(rcheck(&A, &q.r, T_NOW + 21), AUTH_R_TOKEN_REVOKED);
    char *pay = t_claims("bob", "jti-b-3", T_NOW + 21, T_NOW + 900);
    char *t3 = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET),
                          "{\"alg\":\"HS256\",\"kid\":\"k1\"}", pay);
    treq_make(&q, A.a, t3, T_NOW + 22, "redis-rev-nonce-004");
    assert_int_equal(rcheck(&A, &q.r, T_NOW + 22), AUTH_OK);
    /* An older revocation time never moves the cut-off back. */
    r = rrevoke(&A, "{\"sub\":\"bob\"}", T_NOW + 5);
    auth_http_reply_clear(&r);
    rep = rs_cmd(&srv, "GET sluice:rev:s:bob");
    assert_string_equal(rep->str, "1700000020");
    freeReplyObject(rep);
    free(pay);
    free(t3);
    free(t1);
    free(t2);
}

/* ---- 100 copies over two instances ------------------------------------------------ */

#define COPIES_PER 50

typedef struct racer {
    inst_t *in;
    const auth_request_t *req;
    pthread_barrier_t *go;
    done_t d[COPIES_PER];
    int ok, replay, other;
} racer_t;

static bool all_done(void *arg)
{
    racer_t *x = arg;
    for (int i = 0; i < COPIES_PER; i++)
        if (!x->d[i].calls)
            return false;
    return true;
}

static void *racer_main(void *arg)
{
    racer_t *x = arg;
    auth_pending_t *p;
    memset(x->d, 0, sizeof(x->d));
    pthread_barrier_wait(x->go);
    for (int i = 0; i < COPIES_PER; i++) {
        if (auth_check(x->in->a, x->in->r, x->req, T_NOW, &x->d[i].res, on_check, &x->d[i], &p) ==
            AUTH_DONE)
            x->d[i].calls = 1;
    }
    rs_run_until(x->in->base, all_done, x, 5000);
    x->ok = x->replay = x->other = 0;
    for (int i = 0; i < COPIES_PER; i++) {
        auth_reason_t r = x->d[i].calls == 1 ? x->d[i].res.reason : AUTH_R__COUNT;
        x->ok += r == AUTH_OK;
        x->replay += r == AUTH_R_SIG_REPLAY;
        x->other += r != AUTH_OK && r != AUTH_R_SIG_REPLAY;
    }
    return NULL;
}

static void test_concurrent_two_instances(void **state)
{
    (void)state;
    char *tok = t_good_token("carol", "jti-c-1");
    for (int round = 0; round < 5; round++) {
        treq_t q;
        char nonce[40];
        snprintf(nonce, sizeof(nonce), "redis-race-nonce-%03d", round);
        treq_make(&q, A.a, tok, T_NOW, nonce);
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, 2);
        static racer_t xa, xb;
        xa = (racer_t){.in = &A, .req = &q.r, .go = &go};
        xb = (racer_t){.in = &B, .req = &q.r, .go = &go};
        pthread_t ta, tb;
        assert_int_equal(pthread_create(&ta, NULL, racer_main, &xa), 0);
        assert_int_equal(pthread_create(&tb, NULL, racer_main, &xb), 0);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        pthread_barrier_destroy(&go);
        assert_int_equal(xa.other + xb.other, 0);
        assert_int_equal(xa.ok + xb.ok, 1);
        assert_int_equal(xa.replay + xb.replay, 2 * COPIES_PER - 1);
    }
    free(tok);
}

/* A reopened with the product's default 50 ms deadline: where a call's
 * deadline comes into what the test asserts, whatever Redis's pace. */
static void a_with_default_deadline(void)
{
    inst_close(&A);
    inst_open(&A, CONF_STORE_ERROR_DENY, CONF_STORE_ERROR_DENY, 50);
}

static void test_cancel(void **state)
{
    (void)state;
    a_with_default_deadline(); /* a cancelled call's deadline passes too */
    char *tok = t_good_token("dan", "jti-d-1");
    treq_t q;
    treq_make(&q, A.a, tok, T_NOW, "redis-cancel-nonce-1");
    done_t d = {0};
    auth_pending_t *p = NULL;
    assert_int_equal(auth_check(A.a, A.r, &q.r, T_NOW, &d.res, on_check, &d, &p), AUTH_PENDING);
    auth_pending_cancel(p);
    rs_run_for(A.base, 100);
    assert_int_equal(d.calls, 0);
    static const char admin[] = "Bearer " T_ADMIN_KEY;
    assert_int_equal(auth_admin_revoke(A.a, A.r, admin, strlen(admin), "{\"sub\":\"x\"}", 11, T_NOW,
                                       &d.reply, on_reply, &d, &p),
                     AUTH_PENDING);
    auth_pending_cancel(p);
    rs_run_for(A.base, 100);
    assert_int_equal(d.calls, 0);
    auth_pending_cancel(NULL);
    free(tok);
}

static void test_late_redis(void **state)
{
    (void)state;
    a_with_default_deadline(); /* the one this test is about */
    char *tok = t_good_token("erin", "jti-e-1");
    treq_t q;
    treq_make(&q, A.a, tok, T_NOW, "redis-late-nonce-001");
    uint64_t before = fallbacks("revocations", "deny");
    /* Answered before our call is sent, so Redis is surely paused then.
     * Paused for long (the next test's FLUSHALL waits the rest out): a
     * loaded machine can keep this process off the CPU for more than a
     * short pause, and Redis's answer after it is AUTH_OK. */
    redisReply *pause = rs_cmd(&srv, "CLIENT PAUSE 2000");
    assert_non_null(pause);
    freeReplyObject(pause);
    int64_t t0 = sl_now_ms();
    assert_int_equal(rcheck(&A, &q.r, T_NOW), AUTH_R_STORE_UNAVAILABLE);
    assert_true(sl_now_ms() - t0 < 1500); /* the 50 ms deadline, not Redis's 2000 */
    assert_int_equal(fallbacks("revocations", "deny"), before + 1);
    free(tok);
}

static void test_redis_down_then_back(void **state)
{
    (void)state;
    char *tok = t_good_token("fay", "jti-f-1");
    rs_kill(&srv);
    /* A and B notice the dropped connection before the server comes back. */
    assert_true(rs_run_until(A.base, disconnected, A.r, 2000));
    assert_true(rs_run_until(B.base, disconnected, B.r, 2000));
    static const struct {
        int nonces, revocations;
        auth_reason_t first;
    } cases[] = {
        {CONF_STORE_ERROR_DENY, CONF_STORE_ERROR_DENY, AUTH_R_STORE_UNAVAILABLE},
        {CONF_STORE_ERROR_ALLOW, CONF_STORE_ERROR_DENY, AUTH_R_STORE_UNAVAILABLE},
        {CONF_STORE_ERROR_DENY, CONF_STORE_ERROR_ALLOW, AUTH_R_STORE_UNAVAILABLE},
        {CONF_STORE_ERROR_ALLOW, CONF_STORE_ERROR_ALLOW, AUTH_OK},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        inst_t in;
        memset(&in, 0, sizeof(in));
        inst_open(&in, cases[i].nonces, cases[i].revocations, 50);
        uint64_t nd = fallbacks("nonces", "deny"), na = fallbacks("nonces", "allow");
        uint64_t rd = fallbacks("revocations", "deny"), ra = fallbacks("revocations", "allow");
        treq_t q;
        char nonce[40];
        snprintf(nonce, sizeof(nonce), "redis-down-nonce-%03zu", i);
        treq_make(&q, in.a, tok, T_NOW, nonce);
        assert_int_equal(rcheck(&in, &q.r, T_NOW), cases[i].first);
        bool rev_allow = cases[i].revocations == CONF_STORE_ERROR_ALLOW;
        bool non_allow = cases[i].nonces == CONF_STORE_ERROR_ALLOW;
        assert_int_equal(fallbacks("revocations", "deny"), rd + !rev_allow);
        assert_int_equal(fallbacks("revocations", "allow"), ra + rev_allow);
        /* The nonce policy is consulted only once revocations allowed. */
        assert_int_equal(fallbacks("nonces", "deny"), nd + (rev_allow && !non_allow));
        assert_int_equal(fallbacks("nonces", "allow"), na + (rev_allow && non_allow));
        if (cases[i].first == AUTH_OK) {
            /* Allowed through, but this instance's own stores still see a
             * replay and its own revocations. */
            assert_int_equal(rcheck(&in, &q.r, T_NOW), AUTH_R_SIG_REPLAY);
            assert_int_equal(auth_revoke_sub(in.a, "fay", T_NOW + 1), 0);
            treq_make(&q, in.a, tok, T_NOW + 1, "redis-down-nonce-xyz");
            assert_int_equal(rcheck(&in, &q.r, T_NOW + 1), AUTH_R_TOKEN_REVOKED);
        }
        /* A revocation with Redis down: 503, yet kept on this instance. */
        auth_http_reply_t r = rrevoke(&in, "{\"jti\":\"jti-f-1\"}", T_NOW);
        assert_int_equal(r.status, 503);
        assert_non_null(strstr(r.body, "store_unavailable"));
        auth_http_reply_clear(&r);
        assert_true(auth_stores_revocation_count(in.st) >= 1);
        /* ... where it is enforced at once, whatever the policy. */
        treq_make(&q, in.a, tok, T_NOW + 2, "redis-down-nonce-rev");
        assert_int_equal(rcheck(&in, &q.r, T_NOW + 2), AUTH_R_TOKEN_REVOKED);
        inst_close(&in);
    }

    /* Back: the client reconnects by itself and Redis answers again (the
     * scripts are loaded anew on the fresh server). */
    rs_start(&srv);
    assert_true(rs_run_until(A.base, connected, A.r, 5000));
    assert_true(rs_run_until(B.base, connected, B.r, 5000));
    treq_t q;
    treq_make(&q, A.a, tok, T_NOW, "redis-back-nonce-001");
    assert_int_equal(rcheck(&A, &q.r, T_NOW), AUTH_OK);
    assert_int_equal(rcheck(&B, &q.r, T_NOW), AUTH_R_SIG_REPLAY);
    free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_replay_across_instances, setup, teardown),
        cmocka_unit_test_setup_teardown(test_revoke_across_instances, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_two_instances, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_late_redis, setup, teardown),
        cmocka_unit_test_setup_teardown(test_redis_down_then_back, setup, teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
