/*
 * Unit tests of common/redis.c against a real redis-server started by the
 * test on its own port: replies, deadlines (DEBUG SLEEP, CLIENT PAUSE),
 * DOWN on a dropped connection, reconnection with backoff, AUTH/SELECT,
 * cancellation, EVALSHA with NOSCRIPT reload after SCRIPT FLUSH and after a
 * restart, and the stall detector. Waits run the event loop until a
 * condition holds or a deadline passes; timing bounds are asserted.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/redis.h"
#include "tests/unit/redis_server.h"

static rs_server_t srv;

typedef struct res {
    int calls;
    sl_redis_status_t status;
    int type;
    char str[128];
    long long integer;
    int64_t at_ms;
} res_t;

static void res_cb(void *arg, sl_redis_status_t st, struct redisReply *reply)
{
    res_t *r = arg;
    r->calls++;
    r->status = st;
    r->at_ms = sl_now_ms();
    r->type = reply ? reply->type : -1;
    r->str[0] = '\0';
    if (reply && reply->str)
        snprintf(r->str, sizeof(r->str), "%s", reply->str);
    r->integer = reply ? reply->integer : 0;
}

static bool res_done(void *arg)
{
    return ((res_t *)arg)->calls > 0;
}

static bool connected(void *arg)
{
    return sl_redis_connected(arg);
}

static bool disconnected(void *arg)
{
    return !sl_redis_connected(arg);
}

static bool no_inflight(void *arg)
{
    return sl_redis_inflight(arg) == 0;
}

static uint64_t errs(const char *kind)
{
    sl_metric_t *m =
        sl_metric_register("sluice_redis_errors_total", "", SL_METRIC_COUNTER, "kind", NULL, 0);
    return sl_counter_value(sl_metric_series1(m, kind));
}

static sl_redis_t *client(struct event_base *base, int64_t timeout_ms, const char *suffix)
{
    char url[256], err[256] = "";
    if (srv.password[0])
        snprintf(url, sizeof(url), "redis://:%s@127.0.0.1:%d%s", srv.password, srv.port,
                 suffix ? suffix : "");
    else
        snprintf(url, sizeof(url), "redis://127.0.0.1:%d%s", srv.port, suffix ? suffix : "");
    sl_redis_opts_t o = {.url = url, .timeout_ms = timeout_ms, .reconnect_max_ms = 400};
    sl_redis_t *r = sl_redis_new(base, &o, err, sizeof(err));
    assert_non_null(r);
    assert_true(rs_run_until(base, connected, r, 2000));
    return r;
}

static sl_redis_call_t *cmd(sl_redis_t *r, res_t *res, int argc, const char **argv)
{
    memset(res, 0, sizeof(*res));
    sl_redis_call_t *c = sl_redis_command(r, argc, argv, NULL, res_cb, res);
    assert_non_null(c);
    assert_int_equal(res->calls, 0); /* never inside the call that queued it */
    return c;
}

static int setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    sl_log_set_level(SL_LOG_ERROR);
    memset(&srv, 0, sizeof(srv));
    rs_start(&srv);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    rs_cleanup(&srv);
    return 0;
}

static void test_url(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    const char *bad[] = {"http://x",        "redis://",      "redis://:6379", "redis://h:0",
                         "redis://h:70000", "redis://h:12x", "redis://h/abc", "redis://pw@h",
                         "redis://[::1",    "redis://:@h:1", "rediss://h:1",  "redis://h:1/2/3"};
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++) {
        char err[128] = "";
        sl_redis_opts_t o = {.url = bad[i]};
        sl_redis_t *r = sl_redis_new(base, &o, err, sizeof(err));
        if (r)
            fail_msg("accepted %s", bad[i]);
        assert_true(err[0] != '\0');
        assert_int_equal(sl_redis_url_check(bad[i], err, sizeof(err)), -1);
    }
    const char *good[] = {"redis://127.0.0.1", "redis://:p%40ss@127.0.0.1:1/2",
                          "redis://user:pw@[::1]:6380/0", "redis://localhost:6379/"};
    for (size_t i = 0; i < SL_ARRAY_LEN(good); i++) {
        char err[128] = "";
        sl_redis_opts_t o = {.url = good[i]};
        sl_redis_t *r = sl_redis_new(base, &o, err, sizeof(err));
        if (!r)
            fail_msg("refused %s: %s", good[i], err);
        assert_int_equal(sl_redis_url_check(good[i], err, sizeof(err)), 0);
        sl_redis_free(r);
    }
    event_base_free(base);
}

static void test_roundtrip_and_select(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    sl_redis_t *r = client(base, 200, "/3");
    res_t res;
    const char *set[] = {"SET", "sl:k", "v1"};
    cmd(r, &res, 3, set);
    assert_true(rs_run_until(base, res_done, &res, 1000));
    assert_int_equal(res.status, SL_REDIS_OK);
    assert_string_equal(res.str, "OK");
    const char *get[] = {"GET", "sl:k"};
    cmd(r, &res, 2, get);
    assert_true(rs_run_until(base, res_done, &res, 1000));
    assert_int_equal(res.type, REDIS_REPLY_STRING);
    assert_string_equal(res.str, "v1");
    /* it went to database 3 */
    redisReply *rep = rs_cmd(&srv, "GET sl:k");
    assert_int_equal(rep->type, REDIS_REPLY_NIL);
    freeReplyObject(rep);
    redisContext *c = rs_connect(&srv);
    freeReplyObject(redisCommand(c, "SELECT 3"));
    rep = redisCommand(c, "GET sl:k");
    assert_string_equal(rep->str, "v1");
    freeReplyObject(rep);
    redisFree(c);
    /* a Redis error reply comes back as OK with an error reply, counted */
    uint64_t e0 = errs("reply");
    const char *bad[] = {"INCR", "sl:k"};
    cmd(r, &res, 2, bad);
    assert_true(rs_run_until(base, res_done, &res, 1000));
    assert_int_equal(res.status, SL_REDIS_OK);
    assert_int_equal(res.type, REDIS_REPLY_ERROR);
    assert_int_equal(errs("reply"), e0 + 1);
    assert_int_equal(sl_redis_inflight(r), 0);
    sl_redis_free(r);
    event_base_free(base);
}

/* Calls queued before the connection is up wait for it. */
static void test_queued_before_connect(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    char url[64], err[128];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", srv.port);
    sl_redis_opts_t o = {.url = url, .timeout_ms = 500};
    sl_redis_t *r = sl_redis_new(base, &o, err, sizeof(err));
    assert_non_null(r);
    assert_false(sl_redis_connected(r));
    res_t res[3];
    const char *ping[] = {"PING"};
    for (int i = 0; i < 3; i++)
        cmd(r, &res[i], 1, ping);
    assert_true(rs_run_until(base, res_done, &res[2], 1000));
    for (int i = 0; i < 3; i++) {
        assert_int_equal(res[i].calls, 1);
        assert_int_equal(res[i].status, SL_REDIS_OK);
        assert_string_equal(res[i].str, "PONG");
    }
    sl_redis_free(r);
    event_base_free(base);
}

/* DEBUG SLEEP / CLIENT PAUSE: the call times out at its deadline, the late
 * reply is dropped, and the next call works. The deadline is 300 ms and the
 * block 3 s, so that a loaded machine (or ASan) neither misses the next
 * call's deadline nor passes the "well before the block" bound (with a
 * 50 ms deadline and a 300 ms block both failed under load). A pause is
 * answered before the call is made (Redis surely holds it); a sleep has no
 * answer until it ends, so 200 ms of loop let it reach the server first. */
static void deadline_case(const char *blocker, bool answered_at_once)
{
    struct event_base *base = event_base_new();
    sl_redis_t *r = client(base, 300, NULL);
    redisContext *blk = NULL;
    if (answered_at_once) {
        redisReply *rep = rs_cmd(&srv, blocker);
        assert_non_null(rep);
        freeReplyObject(rep);
    } else {
        blk = rs_send_nowait(&srv, blocker);
        assert_non_null(blk);
        rs_run_for(base, 200);
    }
    uint64_t t0 = errs("timeout");
    res_t res;
    const char *ping[] = {"PING"};
    int64_t start = sl_now_ms();
    cmd(r, &res, 1, ping);
    assert_true(rs_run_until(base, res_done, &res, 3000));
    int64_t took = res.at_ms - start;
    assert_int_equal(res.status, SL_REDIS_TIMEOUT);
    /* Well before the 3 s block. The lower bound has slack: deadlines
     * sit in a libevent common-timeout queue judged against the loop's
     * cached time, and under ASan one fired 48 ms after this fresh clock
     * read (49 was the bound of a 50 ms deadline, which then failed 2 runs
     * in 5). */
    assert_true(took >= 290 && took < 2000);
    assert_int_equal(errs("timeout"), t0 + 1);
    assert_int_equal(sl_redis_inflight(r), 1); /* the late reply is still due */
    rs_run_for(base, 30);
    assert_int_equal(res.calls, 1); /* exactly once */
    /* the server wakes: the late reply is dropped, nothing runs twice */
    assert_true(rs_run_until(base, no_inflight, r, 5000));
    assert_int_equal(res.calls, 1);
    assert_true(sl_redis_connected(r));
    cmd(r, &res, 1, ping);
    assert_true(rs_run_until(base, res_done, &res, 1000));
    assert_int_equal(res.status, SL_REDIS_OK);
    if (blk)
        redisFree(blk);
    sl_redis_free(r);
    event_base_free(base);
}

static void test_deadline_debug_sleep(void **state)
{
    (void)state;
    deadline_case("DEBUG SLEEP 3", false);
}

static void test_deadline_client_pause(void **state)
{
    (void)state;
    deadline_case("CLIENT PAUSE 3000", true);
}

/* A deadline promised late in a long loop turn holds: the call made after
 * it cannot time out before it (its timer counts from the fresh clock, not
 * from the turn's cached start, 80 ms older). */
typedef struct late_turn {
    sl_redis_t *r;
    res_t res;
    int64_t promised_us;
} late_turn_t;

static void late_turn_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    late_turn_t *lt = arg;
    int64_t until = sl_now_ms() + 80;
    while (sl_now_ms() < until) /* the turn's work: the cached time goes stale */
        ;
    lt->promised_us = sl_redis_deadline_us(lt->r);
    const char *ping[] = {"PING"};
    cmd(lt->r, &lt->res, 1, ping);
}

static void test_deadline_after_a_long_turn(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    late_turn_t lt = {.r = client(base, 50, NULL)};
    /* answered: Redis holds the pause before the call is made (sent
     * without waiting, 20 ms of loop is no promise that it got there) */
    redisReply *pause = rs_cmd(&srv, "CLIENT PAUSE 400");
    assert_non_null(pause);
    freeReplyObject(pause);
    struct timeval now = {0, 0};
    assert_int_equal(event_base_once(base, -1, EV_TIMEOUT, late_turn_cb, &lt, &now), 0);
    assert_true(rs_run_until(base, res_done, &lt.res, 1000));
    assert_int_equal(lt.res.status, SL_REDIS_TIMEOUT);
    /* at_ms is whole ms, the promise in µs: compare in ms, rounded down */
    assert_true(lt.res.at_ms >= lt.promised_us / 1000);
    assert_true(rs_run_until(base, no_inflight, lt.r, 1000));
    sl_redis_free(lt.r);
    event_base_free(base);
}

static void test_cancel(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    sl_redis_t *r = client(base, 200, NULL);
    res_t a, b;
    const char *ping[] = {"PING"};
    sl_redis_call_t *ca = cmd(r, &a, 1, ping);
    cmd(r, &b, 1, ping);
    sl_redis_call_cancel(ca);
    assert_true(rs_run_until(base, res_done, &b, 1000));
    assert_true(rs_run_until(base, no_inflight, r, 1000));
    rs_run_for(base, 250); /* past a's deadline too */
    assert_int_equal(a.calls, 0);
    assert_int_equal(b.calls, 1);
    sl_redis_free(r);

    /* cancelling a call whose DOWN is already decided: nothing runs */
    char url[64], err[128];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", rs_free_port());
    sl_redis_opts_t o = {.url = url, .timeout_ms = 50};
    r = sl_redis_new(base, &o, err, sizeof(err));
    assert_true(rs_run_until(base, disconnected, r, 1000));
    rs_run_for(base, 20);
    ca = cmd(r, &a, 1, ping);
    sl_redis_call_cancel(ca);
    rs_run_for(base, 80);
    assert_int_equal(a.calls, 0);
    sl_redis_free(r);
    event_base_free(base);
}

/* Kill the server under a pending call: DOWN at once (not at the deadline);
 * calls while it is down end with DOWN fast; it comes back on its own. */
static void test_down_and_reconnect(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    sl_redis_t *r = client(base, 2000, NULL);
    /* a pause answered (held before the PING is sent), not a DEBUG SLEEP
     * sent without waiting: 20 ms of loop is no promise it got there */
    redisReply *pause = rs_cmd(&srv, "CLIENT PAUSE 5000");
    assert_non_null(pause);
    freeReplyObject(pause);
    res_t res;
    const char *ping[] = {"PING"};
    cmd(r, &res, 1, ping);
    rs_run_for(base, 20);
    assert_int_equal(res.calls, 0);
    uint64_t d0 = errs("down");
    int64_t start = sl_now_ms();
    rs_kill(&srv);
    assert_true(rs_run_until(base, res_done, &res, 1000));
    assert_int_equal(res.status, SL_REDIS_DOWN);
    /* from the dropped connection, not the 2 s deadline: under half of it
     * (200 ms failed 1 run in 3 under ASan at load 14) */
    assert_true(res.at_ms - start < 1000);
    assert_int_equal(errs("down"), d0 + 1);
    assert_false(sl_redis_connected(r));

    /* while down: DOWN without waiting out the 2 s deadline */
    for (int i = 0; i < 3; i++) {
        start = sl_now_ms();
        cmd(r, &res, 1, ping);
        assert_true(rs_run_until(base, res_done, &res, 1000));
        assert_int_equal(res.status, SL_REDIS_DOWN);
        assert_true(res.at_ms - start < 1000);
        rs_run_for(base, 150);
    }
    /* backoff grows 100, 200, 400 (cap 400 + 25% jitter): attempts are
     * counted; over ~1 s down we expect a handful, not hundreds */
    uint64_t c0 = errs("connect");
    rs_run_for(base, 1000);
    uint64_t attempts = errs("connect") - c0;
    assert_true(attempts >= 2 && attempts <= 5);

    rs_start(&srv);
    start = sl_now_ms();
    assert_true(rs_run_until(base, connected, r, 2000));
    assert_true(sl_now_ms() - start < 700); /* within the backoff cap (400 + 25%) */
    cmd(r, &res, 1, ping);
    assert_true(rs_run_until(base, res_done, &res, 1000));
    assert_int_equal(res.status, SL_REDIS_OK);
    sl_redis_free(r);
    event_base_free(base);
}

/* The on_state hook: called once per transition (up, lost, up again),
 * with sl_redis_connected() already telling the new state and before the
 * sluice_redis_connected gauge moves; never for failed reconnect attempts. */
typedef struct states {
    int calls;
    bool seen[8];
    double gauge_at_call[8];
    sl_redis_t *r;
} states_t;

static double up_gauge(void)
{
    sl_metric_t *m =
        sl_metric_register("sluice_redis_connected", "", SL_METRIC_GAUGE, NULL, NULL, 0);
    return (double)sl_gauge_value(sl_metric_series0(m));
}

static void state_cb(void *arg)
{
    states_t *st = arg;
    if (st->calls < 8) {
        st->seen[st->calls] = sl_redis_connected(st->r);
        st->gauge_at_call[st->calls] = up_gauge();
    }
    st->calls++;
}

static bool state_calls_2(void *arg)
{
    return ((states_t *)arg)->calls >= 2;
}

static void test_state_hook(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    char url[256], err[256] = "";
    if (srv.password[0])
        snprintf(url, sizeof(url), "redis://:%s@127.0.0.1:%d", srv.password, srv.port);
    else
        snprintf(url, sizeof(url), "redis://127.0.0.1:%d", srv.port);
    states_t st = {0};
    sl_redis_opts_t o = {.url = url,
                         .timeout_ms = 2000,
                         .reconnect_max_ms = 200,
                         .on_state = state_cb,
                         .state_arg = &st};
    double g0 = up_gauge();
    sl_redis_t *r = sl_redis_new(base, &o, err, sizeof(err));
    assert_non_null(r);
    st.r = r;
    assert_int_equal(st.calls, 0); /* never from inside sl_redis_new */
    assert_true(rs_run_until(base, connected, r, 2000));
    assert_int_equal(st.calls, 1);
    assert_true(st.seen[0]);
    assert_true(st.gauge_at_call[0] == g0); /* the hook runs before the gauge counts it */
    assert_true(up_gauge() == g0 + 1);

    rs_kill(&srv);
    assert_true(rs_run_until(base, state_calls_2, &st, 1000));
    assert_false(st.seen[1]);
    assert_true(st.gauge_at_call[1] == g0 + 1);
    assert_true(up_gauge() == g0);
    uint64_t c0 = errs("connect");
    rs_run_for(base, 600); /* failed attempts while down: no calls */
    assert_true(errs("connect") - c0 >= 2);
    assert_int_equal(st.calls, 2);

    rs_start(&srv);
    assert_true(rs_run_until(base, connected, r, 2000));
    assert_int_equal(st.calls, 3);
    assert_true(st.seen[2]);
    sl_redis_free(r); /* freeing is not a transition the owner hears of */
    assert_int_equal(st.calls, 3);
    assert_true(up_gauge() == g0);
    event_base_free(base);
}

static const char *lua_echo = "return {KEYS[1], ARGV[1], redis.call('INCR', KEYS[1])}";

typedef struct sres {
    int calls;
    sl_redis_status_t st;
    long long n;
    char k[32], a[32];
} sres_t;

static void sres_cb(void *arg, sl_redis_status_t st, struct redisReply *reply)
{
    sres_t *o = arg;
    o->calls++;
    o->st = st;
    if (reply && reply->type == REDIS_REPLY_ARRAY && reply->elements == 3) {
        snprintf(o->k, sizeof(o->k), "%s", reply->element[0]->str);
        snprintf(o->a, sizeof(o->a), "%s", reply->element[1]->str);
        o->n = reply->element[2]->integer;
    } else if (reply) {
        snprintf(o->k, sizeof(o->k), "type %d %s", reply->type, reply->str ? reply->str : "");
    }
}

static bool sres_done(void *arg)
{
    return ((sres_t *)arg)->calls > 0;
}

static long long evalsha_once(struct event_base *base, sl_redis_t *r, const sl_redis_script_t *s)
{
    sres_t o = {0};
    const char *argv[] = {"sl:counter", "hello"};
    assert_non_null(sl_redis_evalsha(r, s, 1, 2, argv, NULL, sres_cb, &o));
    assert_int_equal(o.calls, 0);
    assert_true(rs_run_until(base, sres_done, &o, 1000));
    if (o.st != SL_REDIS_OK || strcmp(o.a, "hello") != 0)
        fail_msg("evalsha: status %d, %s", o.st, o.k);
    assert_string_equal(o.k, "sl:counter");
    return o.n;
}

static void test_evalsha_noscript(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    sl_redis_script_t *s = sl_redis_script_new(lua_echo);
    assert_non_null(s);
    assert_int_equal(strlen(sl_redis_script_sha(s)), 40);
    redisReply *rep = rs_cmd(&srv, "SCRIPT LOAD %s", lua_echo);
    assert_string_equal(rep->str, sl_redis_script_sha(s)); /* our SHA is Redis's */
    freeReplyObject(rep);
    freeReplyObject(rs_cmd(&srv, "SCRIPT FLUSH"));
    freeReplyObject(rs_cmd(&srv, "DEL sl:counter"));

    sl_redis_t *r = client(base, 200, NULL);
    uint64_t n0 = errs("noscript");
    assert_int_equal(evalsha_once(base, r, s), 1); /* NOSCRIPT, loaded, retried */
    assert_int_equal(errs("noscript"), n0 + 1);
    assert_int_equal(evalsha_once(base, r, s), 2); /* by SHA now */
    assert_int_equal(errs("noscript"), n0 + 1);
    freeReplyObject(rs_cmd(&srv, "SCRIPT FLUSH"));
    assert_int_equal(evalsha_once(base, r, s), 3);
    assert_int_equal(errs("noscript"), n0 + 2);

    /* after a restart the script cache is empty (and the data gone) */
    rs_kill(&srv);
    assert_true(rs_run_until(base, disconnected, r, 1000));
    rs_start(&srv);
    assert_true(rs_run_until(base, connected, r, 2000));
    assert_int_equal(evalsha_once(base, r, s), 1);
    assert_int_equal(errs("noscript"), n0 + 3);
    assert_int_equal(sl_redis_inflight(r), 0);

    /* several pipelined calls hitting NOSCRIPT at once all succeed */
    freeReplyObject(rs_cmd(&srv, "SCRIPT FLUSH"));
    sres_t o[4] = {0};
    const char *argv[] = {"sl:counter", "hello"};
    for (int i = 0; i < 4; i++)
        assert_non_null(sl_redis_evalsha(r, s, 1, 2, argv, NULL, sres_cb, &o[i]));
    assert_true(rs_run_until(base, sres_done, &o[3], 1000));
    for (int i = 0; i < 4; i++) {
        assert_int_equal(o[i].st, SL_REDIS_OK);
        assert_string_equal(o[i].a, "hello");
    }
    sl_redis_free(r);
    sl_redis_script_free(s);
    event_base_free(base);
}

static void test_auth(void **state)
{
    (void)state;
    rs_kill(&srv);
    snprintf(srv.password, sizeof(srv.password), "s3cret@:x");
    rs_start(&srv);
    struct event_base *base = event_base_new();
    char url[128], err[128];
    /* the right password (percent-encoded in the URL) */
    snprintf(url, sizeof(url), "redis://:s3cret%%40%%3Ax@127.0.0.1:%d/1", srv.port);
    sl_redis_opts_t o = {.url = url, .timeout_ms = 200};
    sl_redis_t *r = sl_redis_new(base, &o, err, sizeof(err));
    assert_true(rs_run_until(base, connected, r, 2000));
    res_t res;
    const char *ping[] = {"PING"};
    cmd(r, &res, 1, ping);
    assert_true(rs_run_until(base, res_done, &res, 1000));
    assert_string_equal(res.str, "PONG");
    sl_redis_free(r);

    /* a wrong one: never ready, calls end DOWN, counted as auth */
    uint64_t a0 = errs("auth");
    snprintf(url, sizeof(url), "redis://:wrong@127.0.0.1:%d", srv.port);
    o.url = url;
    r = sl_redis_new(base, &o, err, sizeof(err));
    cmd(r, &res, 1, ping);
    assert_true(rs_run_until(base, res_done, &res, 1000));
    assert_int_equal(res.status, SL_REDIS_DOWN);
    assert_false(sl_redis_connected(r));
    assert_true(errs("auth") >= a0 + 1);
    sl_redis_free(r);
    event_base_free(base);

    rs_kill(&srv);
    srv.password[0] = '\0';
    rs_start(&srv);
}

/* A server that answers nothing for longer than the stall limit (1 s at a
 * 50 ms deadline): the connection is dropped and made again. The pause is
 * answered before the first PING (sent without waiting, 20 ms of loop did
 * not always get it to Redis first: under ASan at load the first PING was
 * answered, 1 run in 10); the bounds are taken from clock reads on the
 * safe side of the events they stand for (t_conn before the client's last
 * reply, its handshake; t_pause before the pause began). */
static void test_stall(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    int64_t t_conn = sl_now_ms();
    sl_redis_t *r = client(base, 50, NULL);
    int64_t t_pause = sl_now_ms();
    redisReply *pause = rs_cmd(&srv, "CLIENT PAUSE 1500");
    assert_non_null(pause);
    freeReplyObject(pause);
    uint64_t s0 = errs("stall");
    const char *ping[] = {"PING"};
    int64_t start = sl_now_ms();
    while (errs("stall") == s0 && sl_now_ms() - start < 1400) {
        res_t res;
        cmd(r, &res, 1, ping);
        assert_true(rs_run_until(base, res_done, &res, 1000));
        assert_int_not_equal(res.status, SL_REDIS_OK);
    }
    int64_t at = sl_now_ms() - start;
    assert_int_equal(errs("stall"), s0 + 1);
    /* not before the stall limit since the last reply; well before the
     * pause ends (the loop above saw no answer while it held) */
    assert_true(sl_now_ms() - t_conn >= 1000 && at < 1450);
    assert_int_equal(sl_redis_inflight(r), 0); /* abandoned with the connection */
    /* a new connection is made (the server accepts while paused) and
     * commands work again once the pause is over */
    assert_true(rs_run_until(base, connected, r, 2000));
    res_t res = {0};
    while (res.status != SL_REDIS_OK || res.calls == 0) {
        assert_true(sl_now_ms() - start < 3000);
        cmd(r, &res, 1, ping);
        assert_true(rs_run_until(base, res_done, &res, 1000));
    }
    assert_true(sl_now_ms() - t_pause >= 1450);
    sl_redis_free(r);
    event_base_free(base);
}

/* Freeing with calls in every state runs no callback and leaks nothing
 * (the sanitizer build checks the latter). */
static void test_free_pending(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    sl_redis_t *r = client(base, 500, NULL);
    redisReply *pause = rs_cmd(&srv, "CLIENT PAUSE 200"); /* answered: held */
    assert_non_null(pause);
    freeReplyObject(pause);
    res_t res[4];
    const char *ping[] = {"PING"};
    for (int i = 0; i < 4; i++)
        cmd(r, &res[i], 1, ping);
    rs_run_for(base, 10);
    sl_redis_free(r);
    rs_run_for(base, 30);
    for (int i = 0; i < 4; i++)
        assert_int_equal(res[i].calls, 0);
    event_base_free(base);
    /* make sure the server is awake for whoever comes next */
    assert_true(rs_ping(&srv));
}

/* Issue 15.8: the reconnect wait never exceeds the backoff (its cap is the
 * documented 5 s), and the jitter still spreads the workers out. */
static void test_backoff_delay_bounded(void **state)
{
    (void)state;
    int64_t lo = INT64_MAX, hi = 0;
    for (uint64_t rnd = 0; rnd < 5000; rnd++) {
        int64_t d = sl_redis_backoff_delay(5000, rnd * 2654435761u);
        assert_true(d <= 5000);
        assert_true(d >= 3750);
        lo = d < lo ? d : lo;
        hi = d > hi ? d : hi;
    }
    assert_true(hi - lo > 1000); /* jitter over most of the quarter */
    assert_int_equal(sl_redis_backoff_delay(100, 0), 100);
    assert_int_equal(sl_redis_backoff_delay(100, 25), 75);
    assert_int_equal(sl_redis_backoff_delay(0, 7), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_url),
        cmocka_unit_test(test_backoff_delay_bounded),
        cmocka_unit_test(test_roundtrip_and_select),
        cmocka_unit_test(test_queued_before_connect),
        cmocka_unit_test(test_deadline_debug_sleep),
        cmocka_unit_test(test_deadline_client_pause),
        cmocka_unit_test(test_deadline_after_a_long_turn),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_evalsha_noscript),
        cmocka_unit_test(test_down_and_reconnect),
        cmocka_unit_test(test_state_hook),
        cmocka_unit_test(test_auth),
        cmocka_unit_test(test_stall),
        cmocka_unit_test(test_free_pending),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
