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
 * proxy ends the stream with an error event instead). This file is the
 * hook; the chain is fallback_chain.c, the journal thread
 * fallback_journal.c.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "fallback/fallback.h"
#include "gateway/gw_fallback.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_req.h"
#include "gateway/gw_rt.h"
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
    return gw_req_user(r);
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
    /* by id: gw_http_hn knows FB_FAULT_HEADER and FB_FAULT_ADMIN_HEADER */
    const gw_http_header_t *fh = gw_http_header_get(m, GW_HN_X_SLUICE_FAULT);
    const gw_http_header_t *ak = gw_http_header_get(m, GW_HN_X_SLUICE_ADMIN_KEY);
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
    const gw_http_header_t *ik = gw_http_header_get(m, GW_HN_IDEMPOTENCY_KEY);
    bool idem = ik && r->c->w->iw;
    if (!idem && fa.delay_ms <= 0)
        return GW_HOOK_NEXT;
    gw_fbh_t *s = sl_zalloc(sizeof(*s));
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
        return gw_req_queued_id(r)[0] != '\0';
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
                     gw_req_queued_id(r)[0] ? GW_FB_QID_PARAM : "", gw_req_queued_id(r));
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
    const char *tj = c->fallback.tmpl.json;
    if (tj) { /* the JSON modes' answer must parse as the object apps expect */
        json_t *j = json_loads(tj, 0, NULL);
        bool ok = json_is_object(j);
        json_decref(j);
        if (!ok) {
            snprintf(err, errlen, "%s: fallback.template.json: not a JSON object", gw_fbh_path(c));
            return -1;
        }
    }
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

/* A relayed upstream 5xx: the same retry hints as sluice's own 5xx
 * (gw_fb_retry_headers), except that the upstream's own Retry-After, when
 * it sent one, is relayed as it is and not doubled. */
static void gw_fbh_on_headers(gw_req_t *r, void *state, gw_sb_t *head)
{
    (void)state;
    if (r->att.upstatus < 500)
        return;
    char hint[160];
    gw_fb_retry_headers(r, hint, sizeof(hint));
    const gw_http_msg_t *m = r->att.up ? gw_http_msg(r->att.up->parser) : NULL;
    if (m && gw_http_header_find(m, "Retry-After")) {
        char *ra = strstr(hint, "Retry-After:");
        if (ra)
            *ra = '\0'; /* the hint's Retry-After and retry-after-ms come last */
    }
    gw_sb_str(head, hint);
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
    .on_headers = gw_fbh_on_headers,
};
