/*
 * hook_fallback.c — the fallback adapter: how the degradation chain of
 * fallback/ is driven from the request path.
 *
 *   before forwarding   fault injection (drills: abort / delay, from conf or
 *                       an admin's X-Sluice-Fault header) and idempotency
 *                       (Idempotency-Key: 409 in flight, replay, 422) — the
 *                       hook, last in the chain;
 *   an attempt failed   with nothing sent to the client yet: retry (backoff,
 *                       budget, another server), then the local pool, then
 *                       the template reply in the shape the client asked
 *                       for, stored in the durable queue when the model
 *                       queues — gw_fb_after_failure();
 *   later               worker 0 resends queued requests when their model's
 *                       servers are back; GET /v1/requests/{id} answers
 *                       202 / 200 / 404.
 *
 * A failure after the first byte reached the client is never retried (the
 * proxy ends the stream with an error event instead).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "fallback/fallback.h"
#include "gateway/gw_fallback.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_proxy.h"
#include "gateway/gw_req.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_server.h"
#include "gateway/gw_types.h"
#include "gateway/gw_upstream.h"
#include "gateway/gw_worker.h"
#include "gateway/http1.h"

/* ---- the hook: faults and idempotency ---------------------------------- */

typedef struct gw_fbh {
    gw_req_t *r;
    struct event *delay_ev;
    int64_t delay_ms;
    fb_call_t *call;
    struct event *again_ev; /* asks again while the key is in flight */
    int inflight_tries;
    bool idem; /* this request owns an idempotency key */
    uint64_t token;
    char key[FB_IDEM_KEY_MAX + 1];
} gw_fbh_t;

/* Stored with a kept answer's content type when it was a queued template:
 * the id its replay hands out again. Never sent to a client. */
#define GW_FB_QID_PARAM ";sluice-request-id="

static const char *gw_fb_user(const gw_req_t *r)
{
    return r->user;
}

static void gw_fbh_delay_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_fbh_t *s = arg;
    gw_hook_resume(s->r, GW_HOOK_NEXT);
}

/* The last step before forwarding: an injected delay, if any. */
static gw_hook_rc_t gw_fbh_delay(gw_fbh_t *s)
{
    if (s->delay_ms <= 0)
        return GW_HOOK_NEXT;
    s->delay_ev = evtimer_new(s->r->c->w->base, gw_fbh_delay_cb, s);
    if (!s->delay_ev)
        return GW_HOOK_NEXT;
    struct timeval tv = {s->delay_ms / 1000, (s->delay_ms % 1000) * 1000};
    evtimer_add(s->delay_ev, &tv);
    return GW_HOOK_PENDING;
}

static gw_hook_rc_t gw_fbh_idem_verdict(gw_fbh_t *s, fb_idem_result_t *res, bool async);
static void gw_fbh_idem_cb(void *arg, fb_idem_result_t *res);

/* Claims the key (maybe through Redis). */
static gw_hook_rc_t gw_fbh_begin(gw_fbh_t *s, bool async)
{
    gw_req_t *r = s->r;
    fb_idem_result_t res;
    memset(&res, 0, sizeof(res));
    /* The body as the client sent it: the same key with another body is 422. */
    size_t blen = evbuffer_get_length(r->body);
    switch (fb_idem_begin(r->c->w->iw, gw_fb_user(r), s->key, evbuffer_pullup(r->body, -1), blen,
                          &res, gw_fbh_idem_cb, s, &s->call)) {
    case FB_PENDING:
        return GW_HOOK_PENDING;
    case FB_DONE:
        return gw_fbh_idem_verdict(s, &res, async);
    default:
        if (async)
            gw_hook_resume(r, GW_HOOK_DONE);
        gw_respond_oom(r);
        return GW_HOOK_DONE;
    }
}

static void gw_fbh_again_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_fbh_begin(arg, true);
}

/* What fb_idem_begin() said. async: we are in a callback and the chain
 * waits for gw_hook_resume(). Returns NEXT to go on, DONE when answered,
 * PENDING when something more runs first. */
static gw_hook_rc_t gw_fbh_idem_verdict(gw_fbh_t *s, fb_idem_result_t *res, bool async)
{
    gw_req_t *r = s->r;
    if (res->verdict == FB_IDEM_IN_FLIGHT && s->inflight_tries < 4 && s->again_ev) {
        /* The first request with this key may have just ended, its answer
         * still on its way into the store (another worker, another Redis
         * connection): ask again shortly before answering 409. */
        s->inflight_tries++;
        fb_idem_result_clear(res);
        struct timeval tv = {0, 50000};
        evtimer_add(s->again_ev, &tv);
        return GW_HOOK_PENDING;
    }
    if (res->verdict == FB_IDEM_PROCEED) {
        s->idem = true;
        s->token = res->token;
        r->capture = evbuffer_new();
        r->capture_max = (size_t)r->rt->conf->fallback.idempotency.max_response_bytes;
        fb_idem_result_clear(res);
        gw_hook_rc_t rc = gw_fbh_delay(s);
        if (async && rc == GW_HOOK_NEXT)
            gw_hook_resume(r, GW_HOOK_NEXT);
        return rc;
    }
    /* Answering ends the request (and frees s): leave the chain first. */
    if (async)
        gw_hook_resume(r, GW_HOOK_DONE);
    switch (res->verdict) {
    case FB_IDEM_REPLAY: {
        r->error_kind = "idempotent_replay";
        /* A queued template's id rides in the stored content type (see
         * gw_fbh_on_end): the replay hands it out again. */
        char ctype[64] = "application/json", extra[128];
        const char *qid = NULL;
        if (res->content_type) {
            snprintf(ctype, sizeof(ctype), "%s", res->content_type);
            char *semi = strstr(ctype, GW_FB_QID_PARAM);
            if (semi) {
                *semi = '\0';
                qid = res->content_type + (semi - ctype) + strlen(GW_FB_QID_PARAM);
            }
        }
        int n = snprintf(extra, sizeof(extra), "Idempotent-Replayed: true\r\n");
        if (qid && *qid)
            snprintf(extra + n, sizeof(extra) - (size_t)n, "X-Sluice-Request-Id: %.40s\r\n", qid);
        gw_respond_body(r, res->status, ctype, res->body ? res->body : "", res->body_len, extra);
        break;
    }
    case FB_IDEM_IN_FLIGHT:
        gw_respond_error(r, 409, "invalid_request_error", "idempotency_key_in_use",
                         "A request with this Idempotency-Key is being served now.");
        break;
    case FB_IDEM_NOT_KEPT:
        gw_respond_error(r, 409, "invalid_request_error", "idempotency_key_used",
                         "This Idempotency-Key was used; its answer was too large to keep.");
        break;
    case FB_IDEM_MISMATCH:
        gw_respond_error(r, 422, "invalid_request_error", "idempotency_key_reused",
                         "This Idempotency-Key was used with a different request body.");
        break;
    default:
        gw_respond_error(r, 503, "server_error", "store_unavailable",
                         "The idempotency store is unavailable.");
        break;
    }
    fb_idem_result_clear(res);
    return GW_HOOK_DONE;
}

static void gw_fbh_idem_cb(void *arg, fb_idem_result_t *res)
{
    gw_fbh_t *s = arg;
    s->call = NULL;
    gw_fbh_idem_verdict(s, res, true);
}

static gw_hook_rc_t gw_fbh_on_request(gw_req_t *r, void **state)
{
    if (r->route != GW_ROUTE_CHAT && r->route != GW_ROUTE_COMPLETIONS &&
        r->route != GW_ROUTE_EMBEDDINGS)
        return GW_HOOK_NEXT;
    const conf_t *conf = r->rt->conf;
    const gw_http_msg_t *m = gw_http_msg(r->c->parser);
    const gw_http_header_t *fh = gw_http_header_find(m, FB_FAULT_HEADER);
    const gw_http_header_t *ak = gw_http_header_find(m, FB_FAULT_ADMIN_HEADER);
    bool admin_ok =
        ak && r->rt->admin_key &&
        sl_ct_equal(ak->value, ak->value_len, r->rt->admin_key, strlen(r->rt->admin_key));
    fb_fault_action_t fa;
    char err[160];
    switch (fb_fault_for_request(&conf->fault, &r->model->conf->fault, fh ? fh->value : NULL,
                                 fh ? fh->value_len : 0, admin_ok, gw_worker_rand(r->c->w), &fa,
                                 err, sizeof(err))) {
    case FB_FAULT_BAD_HEADER:
        gw_respond_error(r, 400, "invalid_request_error", "invalid_fault_header", err);
        return GW_HOOK_DONE;
    case FB_FAULT_FORBIDDEN:
        gw_respond_error(r, 403, "permission_error", "forbidden",
                         "X-Sluice-Fault needs a valid X-Sluice-Admin-Key.");
        return GW_HOOK_DONE;
    default:
        break;
    }
    if (fa.abort)
        r->fault_status = fa.status;
    const gw_http_header_t *ik = gw_http_header_find(m, "Idempotency-Key");
    bool idem = ik && r->c->w->iw;
    if (!idem && fa.delay_ms <= 0)
        return GW_HOOK_NEXT;
    gw_fbh_t *s = calloc(1, sizeof(*s));
    if (!s) {
        gw_respond_oom(r);
        return GW_HOOK_DONE;
    }
    s->r = r;
    s->delay_ms = fa.delay_ms;
    *state = s;
    if (!idem)
        return gw_fbh_delay(s);
    if (!fb_idem_key_valid(ik->value, ik->value_len)) {
        gw_respond_error(r, 400, "invalid_request_error", "invalid_idempotency_key",
                         "Idempotency-Key must be 1 to 255 visible ASCII characters.");
        return GW_HOOK_DONE;
    }
    memcpy(s->key, ik->value, ik->value_len);
    s->key[ik->value_len] = '\0';
    s->again_ev = evtimer_new(r->c->w->base, gw_fbh_again_cb, s);
    return gw_fbh_begin(s, false);
}

static void gw_fbh_on_cancel(gw_req_t *r, void *state)
{
    (void)r;
    gw_fbh_t *s = state;
    if (!s)
        return;
    if (s->call) {
        fb_call_cancel(s->call);
        s->call = NULL;
    }
    if (s->delay_ev)
        evtimer_del(s->delay_ev);
    if (s->again_ev)
        evtimer_del(s->again_ev);
}

/* The answer is worth keeping for a replay: the request ended with a real
 * answer (or a queued template, whose id the replay hands out again). */
static bool gw_fbh_keep(const gw_req_t *r, gw_end_t how)
{
    if (how != GW_END_DONE || r->status >= 500 || r->status == 0)
        return false;
    if (r->fallback && strcmp(r->fallback, "template") == 0)
        return r->queued_id[0] != '\0';
    if (r->error_kind && strcmp(r->error_kind, "idempotent_replay") != 0)
        return r->att.upstatus >= 400 && r->att.upstatus < 500; /* the upstream's own 4xx */
    return true;
}

static void gw_fbh_on_end(gw_req_t *r, void *state, gw_end_t how)
{
    gw_fbh_t *s = state;
    /* The local tier is counted when it served the answer. */
    if (how == GW_END_DONE && r->fallback && strcmp(r->fallback, "local") == 0 &&
        r->status >= 200 && r->status < 500)
        fb_count_tier(FB_TIER_LOCAL);
    if (!s)
        return;
    gw_fbh_on_cancel(r, s);
    if (s->delay_ev)
        event_free(s->delay_ev);
    if (s->again_ev)
        event_free(s->again_ev);
    if (s->idem && r->c->w->iw) {
        if (gw_fbh_keep(r, how) && r->capture) {
            size_t len = evbuffer_get_length(r->capture);
            char ctype[128];
            snprintf(ctype, sizeof(ctype), "%s%s%s", r->ctype ? r->ctype : "application/json",
                     r->queued_id[0] ? GW_FB_QID_PARAM : "", r->queued_id);
            fb_idem_complete(r->c->w->iw, gw_fb_user(r), s->key, s->token, r->status, ctype,
                             len ? evbuffer_pullup(r->capture, -1) : (const void *)"", len);
        } else {
            fb_idem_abort(r->c->w->iw, gw_fb_user(r), s->key, s->token);
        }
    }
    free(s);
}

/* ---- lifecycle ------------------------------------------------------------ */

static const char *gw_fbh_path(const conf_t *c)
{
    return c->path ? c->path : "conf";
}

static int gw_fbh_check(const conf_t *c, char *err, size_t errlen)
{
    const char *local = c->fallback.local.upstream;
    if (!local)
        return 0;
    for (size_t k = 0; k < c->nupstreams; k++)
        if (strcmp(c->upstreams[k].name, local) == 0)
            return 0;
    snprintf(err, errlen, "%s: fallback.local.upstream: no upstream named \"%s\"", gw_fbh_path(c),
             local);
    return -1;
}

/* Templates, and the local tier's pool (check made sure it exists). */
static int gw_fbh_rt_build(gw_rt_t *rt, gw_shared_t *sh, char *err, size_t errlen)
{
    (void)sh;
    const conf_t *c = rt->conf;
    if (c->fallback.tmpl.enabled) {
        rt->tmpl = fb_tmpl_new(&c->fallback.tmpl);
        if (!rt->tmpl) {
            snprintf(err, errlen, "%s: fallback.template: cannot build", gw_fbh_path(c));
            return -1;
        }
    }
    if (c->fallback.local.upstream)
        for (size_t k = 0; k < rt->npools; k++)
            if (strcmp(rt->pools[k].name, c->fallback.local.upstream) == 0)
                rt->local = &rt->pools[k];
    return 0;
}

static void gw_fbh_rt_free(gw_rt_t *rt)
{
    fb_tmpl_free(rt->tmpl);
    rt->tmpl = NULL;
}

static void gw_fbh_process_stop(gw_server_t *s)
{
    (void)s;
    gw_fb_queue_thread_stop();
}

const gw_hook_t gw_hook_fallback = {
    .name = "fallback",
    .check = gw_fbh_check,
    .rt_build = gw_fbh_rt_build,
    .rt_free = gw_fbh_rt_free,
    .process_init = gw_fb_server_init,
    .process_stop = gw_fbh_process_stop,
    .process_fini = gw_fb_server_fini,
    .tick = gw_fb_maintain,
    .metrics = gw_fb_metrics_refresh,
    .worker_init = gw_fb_worker_init,
    .worker_fini = gw_fb_worker_fini,
    .on_request = gw_fbh_on_request,
    .on_cancel = gw_fbh_on_cancel,
    .on_end = gw_fbh_on_end,
};

/* ---- the chain after a failed attempt ------------------------------------- */

static bool gw_fb_template_route(const gw_req_t *r)
{
    return r->route == GW_ROUTE_CHAT || r->route == GW_ROUTE_COMPLETIONS;
}

void gw_fb_attempt_end(gw_req_t *r, int outcome)
{
    if (r->att.admit == FB_ADMIT_NO || !r->att.server)
        return;
    fb_admit_t how = (fb_admit_t)r->att.admit;
    r->att.admit = FB_ADMIT_NO;
    if (outcome < 0)
        fb_breaker_cancel(r->att.server->breaker, how);
    else
        fb_breaker_report(r->att.server->breaker, how, outcome > 0, sl_now_ms());
}

static bool gw_fb_model_queues(const gw_req_t *r)
{
    if (!r->c->w->qw || r->route != GW_ROUTE_CHAT)
        return false;
    switch (r->model->conf->queue) {
    case CONF_QUEUE_ON:
        return true;
    case CONF_QUEUE_OFF:
        return false;
    default:
        return r->rt->conf->fallback.queue.enabled;
    }
}

/* The template in the shape the client asked for. */
static void gw_fb_template_respond(gw_req_t *r)
{
    fb_reply_req_t q;
    memset(&q, 0, sizeof(q));
    fb_reply_req_from_json(r->json, &q);
    q.api = r->route == GW_ROUTE_CHAT ? FB_API_CHAT : FB_API_COMPLETIONS;
    q.include_usage = r->client_usage; /* not what a hook asked the upstream for */
    q.model = r->model->name;
    q.id = r->id;
    q.created = sl_wall_s();
    const gw_http_header_t *al = gw_http_header_find(gw_http_msg(r->c->parser), "Accept-Language");
    size_t len = 0;
    char *body =
        fb_tmpl_render(r->rt->tmpl, &q, al ? al->value : NULL, al ? al->value_len : 0, &len);
    if (!body) {
        gw_respond_oom(r);
        return;
    }
    char extra[200];
    int n = snprintf(extra, sizeof(extra), "X-Sluice-Fallback: template\r\n%s",
                     q.stream ? "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n" : "");
    if (r->queued_id[0])
        snprintf(extra + n, sizeof(extra) - (size_t)n, "X-Sluice-Request-Id: %s\r\n", r->queued_id);
    r->fallback = "template";
    gw_respond_body(r, 200, fb_reply_content_type(&q), body, len, extra);
    free(body);
}

static void gw_fb_call_cancel(gw_req_t *r, void *call)
{
    (void)r;
    fb_call_cancel(call);
}

static void gw_fb_queued(void *arg, fb_qres_t *res)
{
    gw_req_t *r = arg;
    gw_req_wait_done(r);
    if (res->status == FB_Q_OK)
        snprintf(r->queued_id, sizeof(r->queued_id), "%s", res->id);
    else
        sl_warn("queue: request %s not stored: %s", r->id, fb_qstatus_name(res->status));
    fb_qres_clear(res);
    gw_fb_template_respond(r);
}

/* ---- journal accepts off the event loop ---------------------------------------
 *
 * The journal writes and fdatasyncs before an accept returns (milliseconds
 * on a slow disk). One thread does that for every worker; the answer comes
 * back through the worker's mailbox. A client that leaves meanwhile only
 * unhooks itself: its request is stored all the same (and delivered). */

struct gw_qjob {
    struct gw_qjob *next;
    gw_worker_t *w;
    gw_req_t *r; /* NULL once the request left (worker thread only) */
    char *user, *key, *route, *body;
    fb_qres_t res;
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_t thread;
    bool running, stop;
    gw_qjob_t *head, **tail;
} gw_qthread = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void gw_qjob_free(gw_qjob_t *j)
{
    if (!j)
        return;
    fb_qres_clear(&j->res);
    free(j->user);
    free(j->key);
    free(j->route);
    free(j->body);
    free(j);
}

/* Takes ownership of body. */
static gw_qjob_t *gw_qjob_new(gw_req_t *r, const char *key, char *body)
{
    gw_qjob_t *j = calloc(1, sizeof(*j));
    if (!j) {
        free(body);
        return NULL;
    }
    j->w = r->c->w;
    j->r = r;
    j->body = body;
    j->user = strdup(gw_fb_user(r));
    j->key = key[0] ? strdup(key) : NULL;
    j->route = strdup(r->model->name);
    if (!j->user || !j->route || (key[0] && !j->key)) {
        gw_qjob_free(j);
        return NULL;
    }
    return j;
}

/* The worker: the accept is done. */
static void gw_qjob_done(void *arg)
{
    gw_qjob_t *j = arg;
    gw_req_t *r = j->r;
    if (r)
        gw_fb_queued(r, &j->res); /* clears r's wait */
    gw_qjob_free(j);
}

static void *gw_qthread_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&gw_qthread.lock);
    for (;;) {
        while (!gw_qthread.head && !gw_qthread.stop)
            pthread_cond_wait(&gw_qthread.cond, &gw_qthread.lock);
        gw_qjob_t *j = gw_qthread.head;
        if (!j)
            break; /* stopping, and nothing left */
        gw_qthread.head = j->next;
        if (!gw_qthread.head)
            gw_qthread.tail = &gw_qthread.head;
        pthread_mutex_unlock(&gw_qthread.lock);
        fb_qaccept_t in = {
            .user = j->user,
            .idem_key = j->key,
            .route = j->route,
            .body = j->body,
            .body_len = strlen(j->body),
        };
        /* The journal store answers at once (FB_DONE); only the queue is
         * touched, under its own lock. */
        if (fb_queue_accept(j->w->qw, &in, &j->res, NULL, NULL, NULL) != FB_DONE)
            j->res.status = FB_Q_STORE_ERROR;
        if (gw_worker_post(j->w, gw_qjob_done, j) != 0)
            gw_qjob_free(j); /* out of memory: the request keeps waiting; nothing leaks */
        pthread_mutex_lock(&gw_qthread.lock);
    }
    pthread_mutex_unlock(&gw_qthread.lock);
    return NULL;
}

static int gw_qthread_push(gw_qjob_t *j)
{
    pthread_mutex_lock(&gw_qthread.lock);
    if (!gw_qthread.running) {
        gw_qthread.tail = &gw_qthread.head;
        gw_qthread.stop = false;
        if (pthread_create(&gw_qthread.thread, NULL, gw_qthread_main, NULL) != 0) {
            pthread_mutex_unlock(&gw_qthread.lock);
            return -1;
        }
        gw_qthread.running = true;
    }
    *gw_qthread.tail = j;
    gw_qthread.tail = &j->next;
    pthread_cond_signal(&gw_qthread.cond);
    pthread_mutex_unlock(&gw_qthread.lock);
    return 0;
}

void gw_fb_queue_thread_stop(void)
{
    pthread_mutex_lock(&gw_qthread.lock);
    bool running = gw_qthread.running;
    gw_qthread.stop = true;
    pthread_cond_signal(&gw_qthread.cond);
    pthread_mutex_unlock(&gw_qthread.lock);
    if (running)
        pthread_join(gw_qthread.thread, NULL); /* finishes what was queued */
    gw_qthread.running = false;
}

/* The client left: the accept completes anyway, and nobody is told. */
static void gw_qjob_wait_cancel(gw_req_t *r, void *job)
{
    (void)r;
    ((gw_qjob_t *)job)->r = NULL;
}

/* Stores the request for a later resend (non-streamed: the stored answer
 * is a chat.completion), then answers with the template. */
static void gw_fb_template(gw_req_t *r)
{
    if (!gw_fb_model_queues(r)) {
        gw_fb_template_respond(r);
        return;
    }
    json_t *copy = json_deep_copy(r->json);
    char *body = NULL;
    if (copy) {
        json_object_set_new(copy, "stream", json_false());
        json_object_del(copy, "stream_options");
        body = json_dumps(copy, JSON_COMPACT);
        json_decref(copy);
    }
    if (!body) {
        gw_fb_template_respond(r);
        return;
    }
    const gw_http_header_t *ik = gw_http_header_find(gw_http_msg(r->c->parser), "Idempotency-Key");
    char key[FB_IDEM_KEY_MAX + 1] = "";
    if (ik && fb_idem_key_valid(ik->value, ik->value_len)) {
        memcpy(key, ik->value, ik->value_len);
        key[ik->value_len] = '\0';
    }
    if (!fb_queue_is_redis(r->c->w->srv->queue)) {
        /* The journal fsyncs before it answers: off the event loop. */
        gw_qjob_t *j = gw_qjob_new(r, key, body); /* takes body */
        if (j) /* before the push: the thread may be done at once */
            gw_req_wait(r, gw_qjob_wait_cancel, j);
        if (j && gw_qthread_push(j) == 0)
            return;
        gw_req_wait_done(r);
        gw_qjob_free(j);
        sl_warn("queue: request %s not stored: out of memory", r->id);
        gw_fb_template_respond(r);
        return;
    }
    fb_qaccept_t in = {
        .user = gw_fb_user(r),
        .idem_key = key[0] ? key : NULL,
        .route = r->model->name, /* the resend routes by the client-facing model */
        .body = body,
        .body_len = strlen(body),
    };
    fb_qres_t res;
    memset(&res, 0, sizeof(res));
    fb_call_t *call = NULL;
    fb_rc_t rc = fb_queue_accept(r->c->w->qw, &in, &res, gw_fb_queued, r, &call);
    free(body);
    if (rc == FB_PENDING) {
        gw_req_wait(r, gw_fb_call_cancel, call);
        return;
    }
    if (rc == FB_DONE) {
        gw_fb_queued(r, &res);
        return;
    }
    gw_fb_template_respond(r);
}

int gw_fb_decide(gw_req_t *r, int failure, int status, int64_t *delay_ms)
{
    const conf_t *conf = r->rt->conf;
    int64_t now = sl_now_ms();
    *delay_ms = 0;
    /* A retry needs a server to go to: with every breaker of the pool open
     * the next tier answers at once, and the budget is not spent. */
    if (!r->att.pool->engine && gw_upstream_any_eligible(r->att.pool, now)) {
        fb_attempt_t a = {
            .failure = (fb_failure_t)failure,
            .status = status,
            .client_started = r->head_sent,
            .retries_done = r->retries,
            .retry_after = r->retry_after[0] ? r->retry_after : NULL,
            .other_server = gw_upstream_other_eligible(r->att.pool, r->att.server, now),
            .deadline_ms = r->att.deadline_total_ms,
        };
        fb_retry_decision_t d;
        fb_retry_decide(&conf->fallback.retry, r->att.pool->budget, &a, now, sl_wall_ms(),
                        gw_worker_rand(r->c->w), &d);
        if (d.verdict == FB_RETRY) {
            *delay_ms = d.delay_ms;
            return d.prefer_other ? GW_FB_RETRY_ELSEWHERE : GW_FB_RETRY;
        }
    }
    if (r->head_sent)
        return GW_FB_NONE;
    if (r->routed_local && r->att.pool != r->model->pool)
        return GW_FB_MAIN;
    if (r->rt->local && !r->tried_local)
        return GW_FB_LOCAL;
    if (r->rt->tmpl && gw_fb_template_route(r))
        return GW_FB_TEMPLATE;
    return GW_FB_NONE;
}

/* Moves r to another pool for its next attempt. */
static void gw_fb_switch_pool(gw_req_t *r, gw_pool_rt_t *pool)
{
    int64_t now = sl_now_ms();
    r->att.pool = pool;
    r->retries = 0;
    r->avoid = NULL;
    r->att.deadline_total_ms = now + pool->conf->total_timeout_ms;
    fb_budget_on_request(pool->budget, now);
    gw_proxy_next_attempt(r, 0);
}

void gw_fb_apply(gw_req_t *r, int action, int64_t delay_ms)
{
    r->retry_after[0] = '\0';
    switch (action) {
    case GW_FB_RETRY:
    case GW_FB_RETRY_ELSEWHERE:
        r->retries++;
        r->avoid = action == GW_FB_RETRY_ELSEWHERE ? r->att.server : NULL;
        gw_proxy_next_attempt(r, delay_ms);
        return;
    case GW_FB_MAIN:
        /* Routed to the small model first: the model's own upstream is its
         * fallback. */
        r->routed_local = false;
        gw_fb_switch_pool(r, r->model->pool);
        return;
    case GW_FB_LOCAL:
        r->tried_local = true;
        r->fallback = "local";
        gw_fb_switch_pool(r, r->rt->local);
        return;
    case GW_FB_TEMPLATE:
        gw_fb_template(r);
        return;
    default:
        return;
    }
}

bool gw_fb_after_failure(gw_req_t *r, int failure, int status)
{
    int64_t delay = 0;
    int action = gw_fb_decide(r, failure, status, &delay);
    if (action == GW_FB_NONE) {
        r->retry_after[0] = '\0';
        return false;
    }
    gw_fb_apply(r, action, delay);
    return true;
}

/* ---- GET /v1/requests/{id} ------------------------------------------------- */

static void gw_fb_lookup_answer(gw_req_t *r, fb_qres_t *res)
{
    const char *id = gw_http_msg(r->c->parser)->target + 13;
    switch (res->status) {
    case FB_Q_DELIVERED:
        gw_respond_body(r, 200, "application/json", res->result ? res->result : "{}",
                        res->result ? res->result_len : 2, NULL);
        break;
    case FB_Q_PENDING: {
        /* The id asked for (ids are [a-z0-9], checked by the lookup). */
        int idlen = (int)SL_MIN(gw_http_msg(r->c->parser)->path_len - 13, 40);
        int64_t wait_s = (res->next_ms - sl_wall_ms() + 999) / 1000;
        char extra[64], body[160];
        snprintf(extra, sizeof(extra), "Retry-After: %lld\r\n",
                 (long long)(wait_s > 0 ? wait_s : 1));
        int n = snprintf(body, sizeof(body),
                         "{\"id\":\"%.*s\",\"object\":\"request\","
                         "\"status\":\"pending\"}",
                         idlen, id);
        gw_respond_body(r, 202, "application/json", body, (size_t)n, extra);
        break;
    }
    case FB_Q_DEAD:
        gw_respond_error(r, 404, "invalid_request_error", "request_failed",
                         "The request could not be delivered and was given up.");
        break;
    case FB_Q_STORE_ERROR:
        gw_respond_error(r, 503, "server_error", "store_unavailable",
                         "The request store is unavailable.");
        break;
    default:
        gw_respond_error(r, 404, "invalid_request_error", "not_found",
                         "No such request (or it expired).");
        break;
    }
    fb_qres_clear(res);
}

static void gw_fb_lookup_cb(void *arg, fb_qres_t *res)
{
    gw_req_t *r = arg;
    gw_req_wait_done(r);
    gw_fb_lookup_answer(r, res);
}

void gw_fb_requests_route(gw_req_t *r)
{
    const gw_http_msg_t *m = gw_http_msg(r->c->parser);
    if (!r->c->w->qw) {
        gw_respond_error(r, 404, "invalid_request_error", "not_found",
                         "No request queue is configured.");
        return;
    }
    char id[64];
    static const char prefix[] = "/v1/requests/"; /* the route's prefix */
    size_t n = m->path_len - (sizeof(prefix) - 1);
    if (n == 0 || n >= sizeof(id)) {
        gw_respond_error(r, 404, "invalid_request_error", "not_found", "No such request.");
        return;
    }
    memcpy(id, m->target + sizeof(prefix) - 1, n);
    id[n] = '\0';
    fb_qres_t res;
    memset(&res, 0, sizeof(res));
    fb_call_t *call = NULL;
    fb_rc_t rc = fb_queue_lookup(r->c->w->qw, id, gw_fb_user(r), &res, gw_fb_lookup_cb, r, &call);
    if (rc == FB_PENDING) {
        gw_req_wait(r, gw_fb_call_cancel, call);
        return;
    }
    if (rc == FB_DONE) {
        gw_fb_lookup_answer(r, &res);
        return;
    }
    gw_respond_oom(r);
}
