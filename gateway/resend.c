/*
 * resend.c — worker 0 resends the requests the durable queue holds once
 * their model's servers are back: a small HTTP client on the gateway's own
 * upstream connections (keep-alive pool, TLS, breakers), one non-streamed
 * chat completion per item, its answer reported to the queue (delivered,
 * retry later, or rejected). Ticks every 250 ms; takes items only while a
 * queued model has a server its breaker lets through, so an outage does
 * not burn attempts.
 */
#include <stdio.h>
#include <string.h>
#include <event2/buffer.h>

#include "common/log.h"
#include "fallback/fallback.h"
#include "gateway/gw_fallback.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_server.h"
#include "gateway/gw_types.h"
#include "gateway/gw_upstream.h"
#include "gateway/gw_worker.h"
#include "gateway/http1.h"

#define GW_RESEND_TICK_MS    250
#define GW_RESEND_PARALLEL   8
#define GW_RESEND_MAX_ANSWER (8u << 20)

typedef struct gw_resend gw_resend_t;

typedef struct gw_resender {
    gw_worker_t *w;
    struct event *tick;
    int inflight;
    fb_call_t *next_call; /* a queue_next waiting for Redis */
    bool draining_tick;   /* inside gw_resend_tick (no recursion through reports) */
    gw_resend_t *list;    /* in flight, for shutdown */
} gw_resender_t;

struct gw_resend {
    gw_resender_t *rs;
    gw_resend_t *next, **pprev;
    fb_qitem_t *item;
    gw_rt_t *rt;
    gw_srv_rt_t *srv;
    int admit;
    gw_upconn_t *up;
    struct evbuffer *answer;
    struct event *timer;
    fb_call_t *call;
    bool reporting;
};

static void gw_resend_free(gw_resend_t *j)
{
    if (j->pprev) {
        *j->pprev = j->next;
        if (j->next)
            j->next->pprev = j->pprev;
    }
    if (j->up)
        gw_upstream_release(j->up, false);
    if (j->call)
        fb_call_cancel(j->call);
    if (j->timer)
        event_free(j->timer);
    if (j->answer)
        evbuffer_free(j->answer);
    fb_qitem_free(j->item);
    gw_rt_unref(j->rt);
    j->rs->inflight--;
    free(j);
}

static void gw_resend_tick(evutil_socket_t fd, short what, void *arg);

static void gw_resend_reported(void *arg, fb_qres_t *res)
{
    gw_resend_t *j = arg;
    gw_resender_t *rs = j->rs;
    j->call = NULL;
    bool ok = res->status == FB_Q_OK || res->status == FB_Q_STALE;
    if (!ok)
        sl_warn("resend %s: report: %s", j->item->id, fb_qstatus_name(res->status));
    fb_qres_clear(res);
    gw_resend_free(j);
    /* A slot is free: the next due item goes now, not at the next tick. */
    if (ok && !rs->draining_tick)
        gw_resend_tick(-1, 0, rs);
}

/* The attempt's end: tell the breaker and the queue. */
static void gw_resend_end(gw_resend_t *j, fb_qoutcome_t o, bool server_ok, bool reusable)
{
    if (j->reporting)
        return;
    j->reporting = true;
    if (j->timer)
        evtimer_del(j->timer);
    if (j->srv && j->admit != FB_ADMIT_NO) {
        fb_breaker_report(j->srv->breaker, (fb_admit_t)j->admit, server_ok, sl_now_ms());
        j->admit = FB_ADMIT_NO;
    }
    if (j->up) {
        gw_upconn_t *u = j->up;
        j->up = NULL;
        gw_upstream_release(u, reusable);
    }
    size_t len = j->answer ? evbuffer_get_length(j->answer) : 0;
    const void *data = len ? evbuffer_pullup(j->answer, -1) : NULL;
    fb_qres_t res;
    memset(&res, 0, sizeof(res));
    fb_rc_t rc = fb_queue_report(j->rs->w->qw, j->item->id, o, data, o == FB_QO_DELIVERED ? len : 0,
                                 &res, gw_resend_reported, j, &j->call);
    if (rc == FB_PENDING)
        return;
    gw_resend_reported(j, &res);
}

static int gw_resend_body_cb(void *arg, const char *p, size_t n)
{
    gw_resend_t *j = arg;
    if (evbuffer_get_length(j->answer) + n > GW_RESEND_MAX_ANSWER)
        return -1;
    return evbuffer_add(j->answer, p, n);
}

static void gw_resend_on_read(void *owner)
{
    gw_resend_t *j = owner;
    gw_upconn_t *u = j->up;
    struct evbuffer *in = bufferevent_get_input(u->bev);
    while (j->up == u) {
        gw_http_state_t st = gw_http_feed_evbuffer(u->parser, in, NULL, gw_resend_body_cb, j);
        if (st == GW_HTTP_NEED_MORE) {
            return;
        } else if (st == GW_HTTP_HEAD) {
            continue; /* nothing to do with the head: on to the body */
        } else if (st == GW_HTTP_DONE) {
            const gw_http_msg_t *m = gw_http_msg(u->parser);
            int s = m->status;
            bool keep = m->keep_alive;
            if (s >= 200 && s < 300)
                gw_resend_end(j, FB_QO_DELIVERED, true, keep);
            else if (s >= 400 && s < 500 && s != 408 && s != 429)
                gw_resend_end(j, FB_QO_REJECTED, true, keep);
            else
                gw_resend_end(j, FB_QO_RETRY, s < 500, keep);
            return;
        } else if (st == GW_HTTP_ERROR) {
            gw_resend_end(j, FB_QO_RETRY, false, false);
            return;
        }
    }
}

static void gw_resend_on_event(void *owner, short what)
{
    gw_resend_t *j = owner;
    if (what & BEV_EVENT_CONNECTED)
        return;
    if ((what & BEV_EVENT_EOF) && j->up) {
        gw_resend_on_read(j);
        if (j->reporting)
            return;
        if (gw_http_feed_eof(j->up->parser, gw_resend_body_cb, j) == GW_HTTP_DONE) {
            int s = gw_http_msg(j->up->parser)->status;
            gw_resend_end(j, s >= 200 && s < 300 ? FB_QO_DELIVERED : FB_QO_RETRY, s < 500, false);
            return;
        }
    }
    gw_resend_end(j, FB_QO_RETRY, false, false);
}

static void gw_resend_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_resend_end(arg, FB_QO_RETRY, false, false);
}

static void gw_resend_start(gw_resender_t *rs, fb_qitem_t *item)
{
    gw_worker_t *w = rs->w;
    gw_resend_t *j = calloc(1, sizeof(*j));
    if (!j) {
        fb_qitem_free(item);
        return;
    }
    rs->inflight++;
    j->rs = rs;
    j->item = item;
    j->rt = gw_rt_ref(w->rt);
    j->admit = FB_ADMIT_NO;
    j->next = rs->list;
    if (rs->list)
        rs->list->pprev = &j->next;
    rs->list = j;
    j->pprev = &rs->list;
    j->answer = evbuffer_new();
    j->timer = evtimer_new(w->base, gw_resend_timeout, j);
    const gw_model_rt_t *m = gw_rt_model(j->rt, item->route, strlen(item->route));
    if (!m || !j->answer || !j->timer) {
        /* The model is gone from the conf: nothing will ever take it. */
        gw_resend_end(j, m ? FB_QO_RETRY : FB_QO_REJECTED, true, false);
        return;
    }
    int64_t now = sl_now_ms();
    j->srv = gw_upstream_pick(w, m->pool, NULL, now, &j->admit);
    if (!j->srv) {
        gw_resend_end(j, FB_QO_RETRY, true, false);
        return;
    }
    j->up = gw_upstream_get(w, j->srv, true);
    if (!j->up) {
        gw_resend_end(j, FB_QO_RETRY, true, false);
        return;
    }
    j->up->owner = j;
    j->up->on_read = gw_resend_on_read;
    j->up->on_event = gw_resend_on_event;
    struct evbuffer *out = bufferevent_get_output(j->up->bev);
    evbuffer_add_printf(out,
                        "POST %s/chat/completions HTTP/1.1\r\nHost: %s\r\n"
                        "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                        "X-Request-Id: %s\r\nX-Sluice-Resend: %d\r\n",
                        j->srv->base_path, j->srv->host_header, item->body_len, item->id,
                        item->attempts + 1);
    if (m->pool->auth_header)
        evbuffer_add(out, m->pool->auth_header, m->pool->auth_header_len);
    if (item->idem_key)
        evbuffer_add_printf(out, "Idempotency-Key: %s\r\n", item->idem_key);
    evbuffer_add(out, GW_LIT("\r\n"));
    evbuffer_add(out, item->body, item->body_len);
    gw_wio_added(&j->up->wio);
    int64_t ms = m->pool->conf->total_timeout_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(j->timer, &tv);
    gw_upstream_arm(j->up);
}

/* Some model that queues has a server in service now. */
static bool gw_resend_worthwhile(const gw_worker_t *w)
{
    int64_t now = sl_now_ms();
    for (size_t i = 0; i < w->rt->nmodels; i++) {
        const gw_model_rt_t *m = &w->rt->models[i];
        if (gw_upstream_any_eligible(m->pool, now))
            return true;
    }
    return false;
}

static void gw_resend_next_cb(void *arg, fb_qres_t *res)
{
    gw_resender_t *rs = arg;
    rs->next_call = NULL;
    fb_qitem_t *item = res->item;
    res->item = NULL;
    bool got = res->status == FB_Q_OK && item;
    fb_qres_clear(res);
    if (got) {
        gw_resend_start(rs, item);
        gw_resend_tick(-1, 0, rs); /* more may be due */
    }
}

static void gw_resend_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_resender_t *rs = arg;
    gw_worker_t *w = rs->w;
    if (w->draining || !w->qw || rs->next_call || rs->inflight >= GW_RESEND_PARALLEL ||
        !gw_resend_worthwhile(w))
        return;
    fb_qres_t res;
    memset(&res, 0, sizeof(res));
    rs->draining_tick = true;
    fb_rc_t rc = fb_queue_next(w->qw, &res, gw_resend_next_cb, rs, &rs->next_call);
    if (rc == FB_DONE)
        gw_resend_next_cb(rs, &res);
    rs->draining_tick = false;
}

int gw_fb_worker_init(gw_worker_t *w)
{
    gw_server_t *s = w->srv;
    char err[256];
    if (w->is_main)
        return 0;
    if (s->queue) {
        w->qw = fb_qworker_new(s->queue, w->base, err, sizeof(err));
        if (!w->qw) {
            sl_error("worker %d: queue: %s", w->id, err);
            return -1;
        }
    }
    if (s->idem) {
        w->iw = fb_idem_worker_new(s->idem, w->base, err, sizeof(err));
        if (!w->iw) {
            sl_error("worker %d: idempotency: %s", w->id, err);
            return -1;
        }
    }
    if (w->id == 0 && w->qw) {
        gw_resender_t *rs = calloc(1, sizeof(*rs));
        if (!rs)
            return -1;
        rs->w = w;
        rs->tick = event_new(w->base, -1, EV_PERSIST, gw_resend_tick, rs);
        struct timeval tv = {0, GW_RESEND_TICK_MS * 1000};
        event_add(rs->tick, &tv);
        w->resender = rs;
    }
    return 0;
}

void gw_fb_worker_fini(gw_worker_t *w)
{
    gw_resender_t *rs = w->resender;
    if (rs) {
        while (rs->list) {
            gw_resend_t *j = rs->list;
            if (j->call) {
                fb_call_cancel(j->call);
                j->call = NULL;
            }
            gw_resend_free(j);
        }
        if (rs->next_call)
            fb_call_cancel(rs->next_call);
        event_free(rs->tick);
        free(rs);
        w->resender = NULL;
    }
    fb_qworker_free(w->qw);
    w->qw = NULL;
    fb_idem_worker_free(w->iw);
    w->iw = NULL;
}

/* ---- process-wide ------------------------------------------------------------ */

static bool gw_fb_any_queue(const conf_t *c)
{
    for (size_t i = 0; i < c->nmodels; i++) {
        if (c->models[i].queue == CONF_QUEUE_ON)
            return true;
        if (c->models[i].queue == CONF_QUEUE_INHERIT && c->fallback.queue.enabled)
            return true;
    }
    return false;
}

int gw_fb_server_init(gw_server_t *s, const conf_t *c, char *err, size_t errlen)
{
    if (gw_fb_any_queue(c)) {
        s->queue = fb_queue_new(&c->fallback.queue, &c->redis, err, errlen);
        if (!s->queue)
            return -1;
    }
    if (c->fallback.idempotency.enabled) {
        s->idem = fb_idem_new(&c->fallback.idempotency, &c->redis, err, errlen);
        if (!s->idem)
            return -1;
    }
    return 0;
}

void gw_fb_server_fini(gw_server_t *s)
{
    fb_queue_free(s->queue);
    s->queue = NULL;
    fb_idem_free(s->idem);
    s->idem = NULL;
}

void gw_fb_maintain(gw_server_t *s)
{
    if (s->queue && fb_queue_maintain(s->queue, NULL) != 0)
        sl_warn("queue maintenance failed (I/O error)");
}

void gw_fb_metrics_refresh(gw_server_t *s)
{
    fb_breakers_refresh(s->shared->breakers, sl_now_ms());
}
