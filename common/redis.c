/*
 * redis.c — the client behind redis.h: one hiredis async context at a time
 * on the worker's event_base, plus the deadline, reconnect and cancel logic
 * that hiredis 0.14 does not have.
 *
 * A call (sl_redis_call_t) has two owners that finish independently: its
 * caller (done when the callback has run, the deadline passed, or it was
 * cancelled: `user_done`) and hiredis (done when it hands back the reply
 * or, when the connection dies, a NULL reply: `in_hiredis`). The object is
 * freed when both are done, which is what makes a late reply harmless.
 *
 * While the caller is not done the call sits in exactly one queue of the
 * client: waitq (made while connecting, sent once AUTH/SELECT are through),
 * sentq (hiredis holds it) or doneq (its end is known — DOWN — and waits for
 * the `kick` event to run the callback, so that no callback ever runs inside
 * the call that queued it, nor inside hiredis's own teardown). A reply runs
 * the callback straight from hiredis's reply callback: hiredis frees the
 * reply when that returns, and we are on the event loop, not in a caller.
 *
 * The client never frees a hiredis context from inside a hiredis callback:
 * a drop decided there (failed AUTH) is deferred to the kick event.
 */
#include "common/redis.h"

#include <event2/event_struct.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include <ctype.h>
#include <event2/event.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utlist.h>

#include "common/log.h"
#include "common/metrics.h"

#define SL_REDIS_STALL_MIN_MS 1000

typedef enum { CALL_NONE = 0, CALL_WAITING, CALL_SENT, CALL_DONE } sl_redis_stage_t;

struct sl_redis_call {
    sl_redis_call_t *prev, *next; /* in waitq, sentq or doneq while the caller waits */
    sl_redis_t *r;
    sl_redis_cb cb;
    void *arg;
    struct event timer; /* the deadline (embedded: no allocation per call) */
    char *cmd;          /* formatted command; kept to the end for a script (NOSCRIPT retry) */
    int cmdlen;
    const sl_redis_script_t *script; /* borrowed; NULL for a plain command */
    sl_redis_stage_t stage;
    sl_redis_status_t status; /* the end waiting in doneq */
    bool user_done;           /* the caller will hear nothing more */
    bool in_hiredis;          /* hiredis holds a callback with this as privdata */
    bool retried;             /* NOSCRIPT reload already done */
};

struct sl_redis_script {
    char *lua;
    char sha[41];
};

typedef enum { CONN_DOWN = 0, CONN_CONNECTING, CONN_READY } sl_redis_conn_t;

enum {
    ERR_DOWN = 0,
    ERR_TIMEOUT,
    ERR_OVERLOAD,
    ERR_CONNECT,
    ERR_AUTH,
    ERR_STALL,
    ERR_NOSCRIPT,
    ERR_REPLY,
    ERR_NKINDS
};
static const char *const sl_redis_err_names[ERR_NKINDS] = {"down", "timeout", "overload", "connect",
                                                           "auth", "stall",   "noscript", "reply"};

struct sl_redis {
    struct event_base *base;
    char host[256];
    int port;
    char *user; /* NULL: AUTH with the password alone */
    char *password;
    int db;
    int64_t timeout_ms, reconnect_min_ms, reconnect_max_ms, connect_timeout_ms, stall_ms;
    int64_t slack_us;              /* libevent's timer clock may lag sl_now_ns() by this much */
    bool deadlines;                /* a deadline was promised: arm calls from the fresh clock */
    const struct timeval *call_tv; /* libevent common timeout for call deadlines */

    redisAsyncContext *ac; /* NULL while down */
    sl_redis_conn_t state;
    int handshake_left;    /* AUTH/SELECT replies still awaited */
    bool drop_requested;   /* drop the connection from the kick event */
    bool was_up;           /* for logging transitions once */
    int64_t backoff_ms;    /* next reconnect delay */
    uint64_t rng;          /* backoff jitter */
    int64_t last_reply_ms; /* last sign of life while calls were outstanding */
    size_t inflight;       /* calls hiredis holds (including abandoned ones) */
    int in_cb;             /* depth of caller callbacks running */

    sl_redis_call_t *waitq, *sentq, *doneq;
    struct event *kick, *reconnect_ev, *connect_ev;

    sl_mseries_t *err[ERR_NKINDS];
    sl_mseries_t *up;
    void (*on_state)(void *arg);
    void *state_arg;
};

static void sl_redis_conn_start(sl_redis_t *r);
static void sl_redis_conn_drop(sl_redis_t *r, const char *why);

/* ---- small helpers -------------------------------------------------------- */

static void sl_redis_count(sl_redis_t *r, int kind)
{
    sl_counter_add(r->err[kind], 1);
}

static sl_redis_call_t **sl_redis_queue(sl_redis_t *r, sl_redis_stage_t st)
{
    switch (st) {
    case CALL_WAITING:
        return &r->waitq;
    case CALL_SENT:
        return &r->sentq;
    case CALL_DONE:
        return &r->doneq;
    default:
        return NULL;
    }
}

static void sl_redis_call_move(sl_redis_call_t *c, sl_redis_stage_t to)
{
    sl_redis_call_t **q = sl_redis_queue(c->r, c->stage);
    if (q)
        DL_DELETE(*q, c);
    c->stage = to;
    q = sl_redis_queue(c->r, to);
    if (q)
        DL_APPEND(*q, c);
}

/* Frees the call once neither its caller nor hiredis needs it. */
static void sl_redis_call_release(sl_redis_call_t *c)
{
    if (!c->user_done || c->in_hiredis)
        return;
    event_del(&c->timer);
    if (c->cmd)
        redisFreeCommand(c->cmd);
    free(c);
}

/* Ends the call for its caller now: runs the callback (unless cancelled). */
static void sl_redis_call_finish(sl_redis_call_t *c, sl_redis_status_t st, redisReply *reply)
{
    sl_redis_t *r = c->r;
    sl_redis_call_move(c, CALL_NONE);
    c->user_done = true;
    event_del(&c->timer);
    if (st == SL_REDIS_DOWN)
        sl_redis_count(r, ERR_DOWN);
    else if (st == SL_REDIS_TIMEOUT) {
        sl_redis_count(r, ERR_TIMEOUT);
        char key[300];
        snprintf(key, sizeof(key), "redis %s:%d timeout", r->host, r->port);
        sl_log_limited(SL_LOG_WARN, key,
                       "redis %s:%d: no reply within %lld ms (the call's deadline)", r->host,
                       r->port, (long long)r->timeout_ms);
    } else if (reply && reply->type == REDIS_REPLY_ERROR)
        sl_redis_count(r, ERR_REPLY);
    r->in_cb++;
    c->cb(c->arg, st, st == SL_REDIS_OK ? reply : NULL);
    r->in_cb--;
    sl_redis_call_release(c);
}

/* Ends the call with `st` from the kick event, never from here. */
static void sl_redis_call_fail_later(sl_redis_call_t *c, sl_redis_status_t st)
{
    c->status = st;
    sl_redis_call_move(c, CALL_DONE);
    event_active(c->r->kick, EV_TIMEOUT, 0);
}

static void sl_redis_fail_waiting(sl_redis_t *r)
{
    while (r->waitq)
        sl_redis_call_fail_later(r->waitq, SL_REDIS_DOWN);
}

/* ---- sending and replies ------------------------------------------------- */

static bool sl_redis_is_noscript(const redisReply *reply)
{
    return reply->type == REDIS_REPLY_ERROR && reply->str &&
           strncmp(reply->str, "NOSCRIPT", 8) == 0;
}

static void sl_redis_reply_cb(redisAsyncContext *ac, void *reply, void *privdata);

/* Hands the call's command to hiredis; 0 ok, -1 when the context refuses. */
static int sl_redis_call_write(sl_redis_call_t *c)
{
    sl_redis_t *r = c->r;
    if (!r->ac || redisAsyncFormattedCommand(r->ac, sl_redis_reply_cb, c, c->cmd,
                                             (size_t)c->cmdlen) != REDIS_OK)
        return -1;
    if (r->inflight == 0)
        r->last_reply_ms = sl_now_ms(); /* the silence starts now, not at the last reply */
    r->inflight++;
    c->in_hiredis = true;
    return 0;
}

static void sl_redis_call_send(sl_redis_call_t *c)
{
    if (sl_redis_call_write(c) != 0) {
        sl_redis_call_fail_later(c, SL_REDIS_DOWN);
        return;
    }
    sl_redis_call_move(c, CALL_SENT);
    if (!c->script) {
        redisFreeCommand(c->cmd); /* hiredis has its own copy now */
        c->cmd = NULL;
    }
}

static void sl_redis_script_load_cb(redisAsyncContext *ac, void *reply, void *privdata)
{
    /* Nothing to do: a failed load shows up as NOSCRIPT on the EVALSHA
     * pipelined behind it, and that reply goes to the caller. */
    sl_redis_t *r = ac->data;
    if (reply)
        r->last_reply_ms = sl_now_ms();
    r->inflight--;
}

/* NOSCRIPT: SCRIPT LOAD and the same EVALSHA again, pipelined (one more
 * round trip), under the deadline the call already has. */
static int sl_redis_script_retry(sl_redis_call_t *c)
{
    sl_redis_t *r = c->r;
    const char *argv[3] = {"SCRIPT", "LOAD", c->script->lua};
    if (!r->ac ||
        redisAsyncCommandArgv(r->ac, sl_redis_script_load_cb, NULL, 3, argv, NULL) != REDIS_OK)
        return -1;
    r->inflight++;
    return sl_redis_call_write(c);
}

static void sl_redis_reply_cb(redisAsyncContext *ac, void *reply_, void *privdata)
{
    sl_redis_call_t *c = privdata;
    sl_redis_t *r = c->r;
    redisReply *reply = reply_;
    (void)ac;
    c->in_hiredis = false;
    r->inflight--;
    if (reply)
        r->last_reply_ms = sl_now_ms();
    if (c->user_done) { /* late reply, or cancelled: drop it */
        sl_redis_call_release(c);
        return;
    }
    if (!reply) { /* connection gone (hiredis is tearing the context down) */
        sl_redis_call_fail_later(c, SL_REDIS_DOWN);
        return;
    }
    if (c->script && !c->retried && sl_redis_is_noscript(reply)) {
        c->retried = true;
        sl_redis_count(r, ERR_NOSCRIPT);
        if (sl_redis_script_retry(c) != 0)
            sl_redis_call_fail_later(c, SL_REDIS_DOWN);
        return;
    }
    sl_redis_call_finish(c, SL_REDIS_OK, reply);
}

/* ---- events ----------------------------------------------------------------- */

static void sl_redis_kick_cb(evutil_socket_t fd, short what, void *arg)
{
    sl_redis_t *r = arg;
    (void)fd;
    (void)what;
    if (r->drop_requested) {
        r->drop_requested = false;
        sl_redis_conn_drop(r, "handshake failed");
    }
    while (r->doneq)
        sl_redis_call_finish(r->doneq, r->doneq->status, NULL);
}

static void sl_redis_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    sl_redis_call_t *c = arg;
    sl_redis_t *r = c->r;
    (void)fd;
    (void)what;
    sl_redis_call_finish(c, c->stage == CALL_DONE ? c->status : SL_REDIS_TIMEOUT, NULL);
    /* A connection that has answered nothing for this long while holding
     * commands is as good as dead (a partition TCP will not notice for
     * minutes): drop it so that calls fail fast until a new one is up. */
    if (r->state == CONN_READY && r->inflight > 0 && sl_now_ms() - r->last_reply_ms > r->stall_ms) {
        sl_redis_count(r, ERR_STALL);
        sl_redis_conn_drop(r, "no reply within the stall limit");
    }
}

static void sl_redis_reconnect_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sl_redis_conn_start(arg);
}

static void sl_redis_connect_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    sl_redis_t *r = arg;
    (void)fd;
    (void)what;
    if (r->state == CONN_CONNECTING) {
        sl_redis_count(r, ERR_CONNECT);
        sl_redis_conn_drop(r, "connect timed out");
    }
}

/* ---- connection ------------------------------------------------------------- */

int64_t sl_redis_backoff_delay(int64_t backoff_ms, uint64_t rnd)
{
    /* Up to 25% jitter, so that every worker of every instance does not
     * knock on a restarted Redis in the same millisecond; taken off the
     * backoff, never added, so the documented cap bounds the time from
     * Redis being back to every client using it again (issue 15.8: the
     * jitter on top made the 5 s cap 6.25 s). */
    if (backoff_ms <= 0)
        return 0;
    return backoff_ms - (int64_t)(rnd % (uint64_t)(backoff_ms / 4 + 1));
}

static void sl_redis_schedule_reconnect(sl_redis_t *r)
{
    r->rng ^= r->rng << 13;
    r->rng ^= r->rng >> 7;
    r->rng ^= r->rng << 17;
    int64_t delay = sl_redis_backoff_delay(r->backoff_ms, r->rng);
    r->backoff_ms = SL_MIN(r->backoff_ms * 2, r->reconnect_max_ms);
    struct timeval tv = {.tv_sec = delay / 1000, .tv_usec = (delay % 1000) * 1000};
    evtimer_add(r->reconnect_ev, &tv);
}

/* The connection is no longer usable (r->ac already detached): wait for
 * the backoff. Calls still waiting for it end with DOWN. */
static void sl_redis_conn_down(sl_redis_t *r, const char *why)
{
    bool was_ready = r->state == CONN_READY;
    if (was_ready) {
        sl_warn("redis %s:%d: connection lost (%s)", r->host, r->port, why);
    } else {
        /* Every worker's client retries on its own: one key for them all,
         * so a Redis that stays down costs one line per interval. */
        char key[300];
        snprintf(key, sizeof(key), "redis %s:%d connect", r->host, r->port);
        sl_log_limited(SL_LOG_WARN, key, "redis %s:%d: cannot connect (%s); retrying with backoff",
                       r->host, r->port, why);
        r->was_up = false;
    }
    r->state = CONN_DOWN;
    r->drop_requested = false;
    evtimer_del(r->connect_ev);
    if (was_ready) { /* the owner's view first: connected 0 means every owner knows */
        if (r->on_state)
            r->on_state(r->state_arg);
        sl_gauge_add(r->up, -1);
    }
    sl_redis_fail_waiting(r);
    if (!r->reconnect_ev)
        return;
    sl_redis_schedule_reconnect(r);
}

/* Our own decision to drop the connection; never from a hiredis callback. */
static void sl_redis_conn_drop(sl_redis_t *r, const char *why)
{
    redisAsyncContext *ac = r->ac;
    if (!ac)
        return;
    r->ac = NULL; /* hiredis's onDisconnect for it will see it is not ours */
    sl_redis_conn_down(r, why);
    redisAsyncFree(ac); /* pending calls get a NULL reply -> DOWN via doneq */
}

static void sl_redis_ready(sl_redis_t *r)
{
    r->state = CONN_READY;
    r->backoff_ms = r->reconnect_min_ms;
    r->last_reply_ms = sl_now_ms();
    evtimer_del(r->connect_ev);
    if (r->on_state)
        r->on_state(r->state_arg);
    sl_gauge_add(r->up, 1);
    if (!r->was_up)
        sl_info("redis %s:%d: connected", r->host, r->port);
    r->was_up = true;
    while (r->waitq)
        sl_redis_call_send(r->waitq);
}

static void sl_redis_handshake_cb(redisAsyncContext *ac, void *reply_, void *privdata)
{
    sl_redis_t *r = ac->data;
    redisReply *reply = reply_;
    const char *what = privdata;
    r->inflight--;
    if (!reply || ac != r->ac || r->drop_requested)
        return; /* the connection is going away; its own path handles it */
    if (reply->type == REDIS_REPLY_ERROR) {
        char key[300];
        snprintf(key, sizeof(key), "redis %s:%d auth", r->host, r->port);
        sl_log_limited(SL_LOG_ERROR, key, "redis %s:%d: %s failed: %s", r->host, r->port, what,
                       reply->str);
        sl_redis_count(r, ERR_AUTH);
        r->drop_requested = true; /* cannot free the context from inside its callback */
        event_active(r->kick, EV_TIMEOUT, 0);
        return;
    }
    if (--r->handshake_left == 0)
        sl_redis_ready(r);
}

static int sl_redis_handshake_send(sl_redis_t *r, const char *what, int argc, const char **argv)
{
    if (redisAsyncCommandArgv(r->ac, sl_redis_handshake_cb, (void *)what, argc, argv, NULL) !=
        REDIS_OK)
        return -1;
    r->inflight++;
    r->handshake_left++;
    return 0;
}

static void sl_redis_on_connect(const redisAsyncContext *cac, int status)
{
    sl_redis_t *r = cac->data;
    if (cac != r->ac)
        return;
    if (status != REDIS_OK) {
        /* hiredis frees the context when this returns. */
        r->ac = NULL;
        sl_redis_count(r, ERR_CONNECT);
        sl_redis_conn_down(r, cac->errstr[0] ? cac->errstr : "connect failed");
        return;
    }
    r->handshake_left = 0;
    r->last_reply_ms = sl_now_ms();
    int rc = 0;
    if (r->password) {
        const char *argv[3] = {"AUTH", r->user ? r->user : r->password, r->password};
        rc |= sl_redis_handshake_send(r, "AUTH", r->user ? 3 : 2, argv);
    }
    if (r->db != 0) {
        char db[16];
        snprintf(db, sizeof(db), "%d", r->db);
        const char *argv[2] = {"SELECT", db};
        rc |= sl_redis_handshake_send(r, "SELECT", 2, argv);
    }
    if (rc != 0) {
        r->drop_requested = true;
        event_active(r->kick, EV_TIMEOUT, 0);
        return;
    }
    if (r->handshake_left == 0)
        sl_redis_ready(r);
}

static void sl_redis_on_disconnect(const redisAsyncContext *cac, int status)
{
    sl_redis_t *r = cac->data;
    (void)status;
    if (cac != r->ac)
        return;   /* one we dropped ourselves */
    r->ac = NULL; /* hiredis frees it when this returns */
    sl_redis_conn_down(r, cac->errstr[0] ? cac->errstr : "closed");
}

/* ---- the event-loop adapter ------------------------------------------------
 *
 * hiredis's own libevent adapter arms EV_WRITE for every command and disarms
 * it once written: two epoll_ctl and a loop turn per call. Once connected,
 * this one writes on the next activation of a plain event (no syscall but
 * the write); only a write the kernel does not take whole, or the connect
 * itself, waits for EV_WRITE. */

typedef struct sl_redis_ev {
    redisAsyncContext *ac;
    struct event *rev, *wev; /* read (persistent), write (while the kernel is full) */
    struct event *kick;      /* "write now", once the current callbacks are done */
    bool want_write;
    bool in_flush;
    bool rearm; /* hiredis asked to write again during a flush: the kernel is full */
    bool *gone; /* set by sl_rev_cleanup: the flush's write failed and freed us */
} sl_redis_ev_t;

static void sl_rev_read(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sl_redis_ev_t *e = arg;
    redisAsyncHandleRead(e->ac);
}

static void sl_rev_write(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sl_redis_ev_t *e = arg;
    redisAsyncHandleWrite(e->ac);
}

static void sl_rev_kick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sl_redis_ev_t *e = arg;
    if (!e->want_write)
        return;
    bool gone = false;
    e->gone = &gone;
    e->in_flush = true;
    e->rearm = false;
    redisAsyncHandleWrite(e->ac); /* calls delWrite when all is out, addWrite if not */
    if (gone)
        return; /* the write failed: hiredis freed the context, and e with it */
    e->gone = NULL;
    e->in_flush = false;
    if (e->rearm)
        event_add(e->wev, NULL);
}

static void sl_rev_add_read(void *p)
{
    sl_redis_ev_t *e = p;
    event_add(e->rev, NULL);
}

static void sl_rev_del_read(void *p)
{
    sl_redis_ev_t *e = p;
    event_del(e->rev);
}

static void sl_rev_add_write(void *p)
{
    sl_redis_ev_t *e = p;
    e->want_write = true;
    if (!(e->ac->c.flags & REDIS_CONNECTED)) {
        event_add(e->wev, NULL); /* the connect completes on writability */
        return;
    }
    if (e->in_flush) {
        e->rearm = true;
        return;
    }
    event_active(e->kick, EV_TIMEOUT, 0);
}

static void sl_rev_del_write(void *p)
{
    sl_redis_ev_t *e = p;
    e->want_write = false;
    e->rearm = false;
    event_del(e->wev);
}

static void sl_rev_cleanup(void *p)
{
    sl_redis_ev_t *e = p;
    if (e->gone)
        *e->gone = true;
    event_free(e->rev);
    event_free(e->wev);
    event_free(e->kick);
    free(e);
}

static int sl_redis_attach(redisAsyncContext *ac, struct event_base *base)
{
    if (ac->ev.data)
        return -1;
    sl_redis_ev_t *e = calloc(1, sizeof(*e));
    if (!e)
        return -1;
    e->ac = ac;
    int fd = ac->c.fd;
    e->rev = event_new(base, fd, EV_READ | EV_PERSIST, sl_rev_read, e);
    e->wev = event_new(base, fd, EV_WRITE, sl_rev_write, e);
    e->kick = event_new(base, -1, 0, sl_rev_kick, e);
    if (!e->rev || !e->wev || !e->kick) {
        if (e->rev)
            event_free(e->rev);
        if (e->wev)
            event_free(e->wev);
        if (e->kick)
            event_free(e->kick);
        free(e);
        return -1;
    }
    ac->ev.addRead = sl_rev_add_read;
    ac->ev.delRead = sl_rev_del_read;
    ac->ev.addWrite = sl_rev_add_write;
    ac->ev.delWrite = sl_rev_del_write;
    ac->ev.cleanup = sl_rev_cleanup;
    ac->ev.data = e;
    /* The connect completes on writability (as hiredis's own adapter does,
     * watch both from the start). */
    e->want_write = true;
    event_add(e->rev, NULL);
    event_add(e->wev, NULL);
    return 0;
}

static void sl_redis_conn_start(sl_redis_t *r)
{
    r->state = CONN_CONNECTING;
    redisAsyncContext *ac = redisAsyncConnect(r->host, r->port);
    if (!ac || ac->err) {
        char why[128];
        snprintf(why, sizeof(why), "%s", ac ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac); /* never connected: no callbacks to run */
        sl_redis_count(r, ERR_CONNECT);
        sl_redis_conn_down(r, why);
        return;
    }
    ac->data = r;
    if (sl_redis_attach(ac, r->base) != 0) {
        redisAsyncFree(ac);
        sl_redis_count(r, ERR_CONNECT);
        sl_redis_conn_down(r, "cannot attach to the event loop");
        return;
    }
    redisAsyncSetConnectCallback(ac, sl_redis_on_connect);
    redisAsyncSetDisconnectCallback(ac, sl_redis_on_disconnect);
    (void)redisEnableKeepAlive(&ac->c);
    r->ac = ac;
    struct timeval tv = {.tv_sec = r->connect_timeout_ms / 1000,
                         .tv_usec = (r->connect_timeout_ms % 1000) * 1000};
    evtimer_add(r->connect_ev, &tv);
}

/* ---- URL ----------------------------------------------------------------- */

static int sl_redis_unescape(const char *s, size_t n, char **out)
{
    char *o = malloc(n + 1);
    if (!o)
        return -1;
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '%' && i + 2 < n && isxdigit((unsigned char)s[i + 1]) &&
            isxdigit((unsigned char)s[i + 2])) {
            char hex[3] = {s[i + 1], s[i + 2], 0};
            o[j++] = (char)strtol(hex, NULL, 16);
            i += 2;
        } else {
            o[j++] = s[i];
        }
    }
    o[j] = '\0';
    *out = o;
    return 0;
}

/* redis://[[user]:password@]host[:port][/db]; host may be [v6]. */
static int sl_redis_parse_url(sl_redis_t *r, const char *url, char *err, size_t errlen)
{
    const char *p = url;
    if (!url || strncmp(p, "redis://", 8) != 0) {
        snprintf(err, errlen, "redis url must start with redis:// (rediss:// is not supported)");
        return -1;
    }
    p += 8;
    const char *end = p + strcspn(p, "/");
    const char *at = memrchr(p, '@', (size_t)(end - p));
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (!colon) {
            snprintf(err, errlen, "redis url: credentials must be [user]:password@");
            return -1;
        }
        if (colon > p && sl_redis_unescape(p, (size_t)(colon - p), &r->user) != 0)
            return -1;
        if (sl_redis_unescape(colon + 1, (size_t)(at - colon - 1), &r->password) != 0)
            return -1;
        if (r->password[0] == '\0') {
            snprintf(err, errlen, "redis url: empty password");
            return -1;
        }
        p = at + 1;
    }
    const char *hend;
    if (*p == '[') {
        hend = memchr(p, ']', (size_t)(end - p));
        if (!hend) {
            snprintf(err, errlen, "redis url: unclosed [ in host");
            return -1;
        }
        p++;
    } else {
        hend = p + strcspn(p, ":/");
    }
    size_t hlen = (size_t)(hend - p);
    if (hlen == 0 || hlen >= sizeof(r->host)) {
        snprintf(err, errlen, "redis url: bad host");
        return -1;
    }
    memcpy(r->host, p, hlen);
    r->host[hlen] = '\0';
    p = hend + (*hend == ']');
    r->port = 6379;
    if (*p == ':') {
        char *e;
        long port = strtol(p + 1, &e, 10);
        if (e == p + 1 || port < 1 || port > 65535 || (*e && *e != '/')) {
            snprintf(err, errlen, "redis url: bad port");
            return -1;
        }
        r->port = (int)port;
        p = e;
    }
    r->db = 0;
    if (*p == '/' && p[1]) {
        char *e;
        long db = strtol(p + 1, &e, 10);
        if (e == p + 1 || *e || db < 0 || db > 1000000) {
            snprintf(err, errlen, "redis url: bad database number");
            return -1;
        }
        r->db = (int)db;
    } else if (*p && strcmp(p, "/") != 0) {
        snprintf(err, errlen, "redis url: unexpected \"%s\"", p);
        return -1;
    }
    return 0;
}

/* ---- public API -------------------------------------------------------------- */

sl_redis_t *sl_redis_new(struct event_base *base, const sl_redis_opts_t *opts, char *err,
                         size_t errlen)
{
    sl_redis_t *r = sl_xcalloc(1, sizeof(*r));
    r->base = base;
    if (sl_redis_parse_url(r, opts->url, err, errlen) != 0) {
        free(r->user);
        free(r->password);
        free(r);
        return NULL;
    }
    r->timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms : 50;
    r->reconnect_min_ms = opts->reconnect_min_ms > 0 ? opts->reconnect_min_ms : 100;
    r->reconnect_max_ms = opts->reconnect_max_ms > 0 ? opts->reconnect_max_ms : 5000;
    r->reconnect_max_ms = SL_MAX(r->reconnect_max_ms, r->reconnect_min_ms);
    r->connect_timeout_ms = opts->connect_timeout_ms > 0 ? opts->connect_timeout_ms : 1000;
    r->on_state = opts->on_state;
    r->state_arg = opts->state_arg;
    r->stall_ms = SL_MAX(SL_REDIS_STALL_MIN_MS, 10 * r->timeout_ms);
    /* libevent times events on CLOCK_MONOTONIC_COARSE unless told to be
     * precise: up to one tick behind CLOCK_MONOTONIC; 1 ms more for the
     * rounding of a timeval. */
    struct timespec res = {0, 10000000};
    (void)clock_getres(CLOCK_MONOTONIC_COARSE, &res);
    r->slack_us = (int64_t)res.tv_sec * 1000000 + res.tv_nsec / 1000 + 1000;
    r->backoff_ms = r->reconnect_min_ms;
    r->rng = (uint64_t)sl_now_ns() ^ (uint64_t)(uintptr_t)r;
    r->rng |= 1;

    struct timeval tv = {.tv_sec = r->timeout_ms / 1000, .tv_usec = (r->timeout_ms % 1000) * 1000};
    r->call_tv = event_base_init_common_timeout(base, &tv);
    r->kick = event_new(base, -1, 0, sl_redis_kick_cb, r);
    r->reconnect_ev = evtimer_new(base, sl_redis_reconnect_cb, r);
    r->connect_ev = evtimer_new(base, sl_redis_connect_timeout_cb, r);
    if (!r->call_tv || !r->kick || !r->reconnect_ev || !r->connect_ev) {
        snprintf(err, errlen, "redis: cannot create events");
        sl_redis_free(r);
        return NULL;
    }

    sl_metric_t *m =
        sl_metric_register("sluice_redis_errors_total", "Redis client troubles, by kind.",
                           SL_METRIC_COUNTER, "kind", NULL, 0);
    for (int k = 0; k < ERR_NKINDS; k++)
        r->err[k] = sl_metric_series1(m, sl_redis_err_names[k]);
    r->up = sl_metric_gauge0("sluice_redis_connected",
                             "Redis client connections that are up (one per worker).");

    sl_redis_conn_start(r);
    return r;
}

void sl_redis_free(sl_redis_t *r)
{
    if (!r)
        return;
    if (r->in_cb > 0) {
        sl_error("sl_redis_free called from inside one of its callbacks");
        abort();
    }
    /* Nobody hears about pending calls any more. */
    sl_redis_call_t *qs[3] = {r->waitq, r->sentq, r->doneq};
    r->waitq = r->sentq = r->doneq = NULL;
    for (int i = 0; i < 3; i++) {
        sl_redis_call_t *c, *tmp;
        DL_FOREACH_SAFE(qs[i], c, tmp)
        {
            c->stage = CALL_NONE;
            c->user_done = true;
            sl_redis_call_release(c);
        }
    }
    if (r->ac) {
        redisAsyncContext *ac = r->ac;
        r->ac = NULL;
        if (r->state == CONN_READY)
            sl_gauge_add(r->up, -1);
        r->state = CONN_DOWN;
        redisAsyncFree(ac); /* NULL replies release the calls it held */
    }
    if (r->kick)
        event_free(r->kick);
    if (r->reconnect_ev)
        event_free(r->reconnect_ev);
    if (r->connect_ev)
        event_free(r->connect_ev);
    free(r->user);
    free(r->password);
    free(r);
}

int sl_redis_url_check(const char *url, char *err, size_t errlen)
{
    sl_redis_t tmp = {0};
    int rc = sl_redis_parse_url(&tmp, url, err, errlen);
    free(tmp.user);
    free(tmp.password);
    return rc;
}

bool sl_redis_connected(const sl_redis_t *r)
{
    return r && r->state == CONN_READY;
}

int64_t sl_redis_deadline_us(sl_redis_t *r)
{
    r->deadlines = true;
    return sl_now_ns() / 1000 + r->timeout_ms * 1000 - r->slack_us;
}

size_t sl_redis_inflight(const sl_redis_t *r)
{
    return r ? r->inflight : 0;
}

static sl_redis_call_t *sl_redis_call_new(sl_redis_t *r, char *cmd, int cmdlen,
                                          const sl_redis_script_t *s, sl_redis_cb cb, void *arg)
{
    sl_redis_call_t *c = calloc(1, sizeof(*c));
    if (!c) {
        redisFreeCommand(cmd);
        return NULL;
    }
    c->r = r;
    c->cb = cb;
    c->arg = arg;
    c->cmd = cmd;
    c->cmdlen = cmdlen;
    c->script = s;
    evtimer_assign(&c->timer, r->base, sl_redis_timer_cb, c);
    /* Once sl_redis_deadline_us() has promised a deadline on this client,
     * a call's deadline counts from now, not from the start of this loop
     * turn (libevent's cached time, older by the turn's work so far). The
     * clients that never ask (rate limits, auth, cache: one call a request)
     * skip the clock read and the base's lock. */
    if (r->deadlines)
        event_base_update_cache_time(r->base);
    evtimer_add(&c->timer, r->call_tv);
    if (r->inflight >= SL_REDIS_MAX_INFLIGHT) {
        sl_redis_count(r, ERR_OVERLOAD);
        sl_redis_call_fail_later(c, SL_REDIS_DOWN);
    } else if (r->state == CONN_READY) {
        sl_redis_call_send(c);
    } else if (r->state == CONN_CONNECTING) {
        sl_redis_call_move(c, CALL_WAITING);
    } else {
        sl_redis_call_fail_later(c, SL_REDIS_DOWN);
    }
    return c;
}

sl_redis_call_t *sl_redis_command(sl_redis_t *r, int argc, const char **argv, const size_t *argvlen,
                                  sl_redis_cb cb, void *arg)
{
    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, argc, argv, argvlen);
    if (len < 0)
        return NULL;
    return sl_redis_call_new(r, cmd, len, NULL, cb, arg);
}

void sl_redis_call_cancel(sl_redis_call_t *c)
{
    if (!c || c->user_done)
        return;
    sl_redis_call_move(c, CALL_NONE);
    c->user_done = true;
    event_del(&c->timer);
    sl_redis_call_release(c);
}

/* ---- scripts ---------------------------------------------------------------- */

sl_redis_script_t *sl_redis_script_new(const char *lua)
{
    sl_redis_script_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->lua = strdup(lua);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (!s->lua || EVP_Digest(lua, strlen(lua), md, &mdlen, EVP_sha1(), NULL) != 1 || mdlen != 20) {
        sl_redis_script_free(s);
        return NULL;
    }
    sl_hex(md, mdlen, s->sha);
    return s;
}

void sl_redis_script_free(sl_redis_script_t *s)
{
    if (!s)
        return;
    free(s->lua);
    free(s);
}

const char *sl_redis_script_sha(const sl_redis_script_t *s)
{
    return s->sha;
}

sl_redis_call_t *sl_redis_evalsha(sl_redis_t *r, const sl_redis_script_t *s, int nkeys, int argc,
                                  const char **argv, const size_t *argvlen, sl_redis_cb cb,
                                  void *arg)
{
    if (argc < 0 || nkeys < 0 || nkeys > argc)
        return NULL;
    const char **av = malloc(sizeof(*av) * (size_t)(argc + 3));
    size_t *al = malloc(sizeof(*al) * (size_t)(argc + 3));
    char nk[16];
    snprintf(nk, sizeof(nk), "%d", nkeys);
    char *cmd = NULL;
    int len = -1;
    if (av && al) {
        av[0] = "EVALSHA";
        al[0] = 7;
        av[1] = s->sha;
        al[1] = 40;
        av[2] = nk;
        al[2] = strlen(nk);
        for (int i = 0; i < argc; i++) {
            av[i + 3] = argv[i];
            al[i + 3] = argvlen ? argvlen[i] : strlen(argv[i]);
        }
        len = redisFormatCommandArgv(&cmd, argc + 3, av, al);
    }
    free(av);
    free(al);
    if (len < 0)
        return NULL;
    return sl_redis_call_new(r, cmd, len, s, cb, arg);
}
