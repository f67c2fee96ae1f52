/*
 * fallback_chain.c — the fallback chain after an attempt failed with
 * nothing sent to the client yet: retry (backoff, budget, another server),
 * then the local pool, then the template reply in the shape the client
 * asked for, stored in the durable queue when the model queues
 * (gw_fb_after_failure); and GET /v1/requests/{id} over that queue. The
 * hook itself (faults, idempotency) is hook_fallback.c; the journal thread
 * is fallback_journal.c.
 */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "fallback/fallback.h"
#include "gateway/gw_flow.h"
#include "gateway/gw_fallback.h"
#include "gateway/gw_proxy.h"
#include "gateway/gw_req.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_server.h"
#include "gateway/gw_types.h"
#include "gateway/gw_upstream.h"
#include "gateway/gw_worker.h"
#include "gateway/http1.h"

static const char *gw_fb_user(const gw_req_t *r)
{
    return gw_req_user(r);
}

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
    fb_reply_req_from_json(gw_req_json(r), &q);
    q.api = r->route == GW_ROUTE_CHAT ? FB_API_CHAT : FB_API_COMPLETIONS;
    q.include_usage = r->client_usage; /* not what a hook asked the upstream for */
    q.model = r->model->name;
    q.id = r->id;
    q.created = sl_wall_s();
    if (q.tools_required) {
        /* The client reads tool_calls and a template has none: a text answer
         * would end its tool loop as if done. A 503 it retries later instead
         * (a queued request is still resent; its id is in the header). */
        char extra[160] = "", hint[160];
        gw_fb_retry_headers(r, hint, sizeof(hint));
        int n = 0;
        if (!strstr(hint, "Retry-After:")) {
            int64_t s = (r->rt->conf->fallback.retry.backoff_max_ms + 999) / 1000;
            n = snprintf(extra, sizeof(extra), "Retry-After: %lld\r\n", (long long)(s > 0 ? s : 1));
        }
        if (gw_req_queued_id(r)[0] && n >= 0 && (size_t)n < sizeof(extra))
            snprintf(extra + n, sizeof(extra) - (size_t)n, "X-Sluice-Request-Id: %s\r\n",
                     gw_req_queued_id(r));
        gw_respond_error_h(r, 503, "server_error", "upstream_unavailable",
                           "No model server is available to call the required tools; retry later.",
                           extra);
        return;
    }
    const gw_http_header_t *al =
        gw_http_header_get(gw_http_msg(r->c->parser), GW_HN_ACCEPT_LANGUAGE);
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
    if (gw_req_queued_id(r)[0])
        snprintf(extra + n, sizeof(extra) - (size_t)n, "X-Sluice-Request-Id: %s\r\n",
                 gw_req_queued_id(r));
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
    if (res->status == FB_Q_OK) {
        snprintf(r->tx.queued_id, sizeof(r->tx.queued_id), "%s", res->id);
        gw_req_tx_mark(r, GW_REQ_TX_QUEUED_ID, true);
    } else {
        sl_warn("queue: request %s not stored: %s", r->id, fb_qstatus_name(res->status));
    }
    fb_qres_clear(res);
    gw_fb_template_respond(r);
}

/* Stores the request for a later resend (non-streamed: the stored answer
 * is a chat.completion), then answers with the template. */
static void gw_fb_template(gw_req_t *r)
{
    if (!gw_fb_model_queues(r)) {
        gw_fb_template_respond(r);
        return;
    }
    json_t *copy = json_deep_copy(gw_req_json(r));
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
    const gw_http_header_t *ik =
        gw_http_header_get(gw_http_msg(r->c->parser), GW_HN_IDEMPOTENCY_KEY);
    char key[FB_IDEM_KEY_MAX + 1] = "";
    if (ik && fb_idem_key_valid(ik->value, ik->value_len)) {
        memcpy(key, ik->value, ik->value_len);
        key[ik->value_len] = '\0';
    }
    if (!fb_queue_is_redis(r->c->w->srv->queue)) {
        /* The journal fsyncs before it answers: off the event loop. */
        if (gw_fb_journal_accept(r, key, body, gw_fb_queued) == 0) /* takes body */
            return;
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
            .retry_after = gw_req_retry_after(r)[0] ? gw_req_retry_after(r) : NULL,
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
    gw_req_tx_mark(r, GW_REQ_TX_RETRY_AFTER, false);
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
        gw_req_tx_mark(r, GW_REQ_TX_RETRY_AFTER, false);
        return false;
    }
    gw_fb_apply(r, action, delay);
    return true;
}

/* ---- retry hints for the client ------------------------------------------ */

/* A half-open server whose probe slots are all taken frees one when a
 * probe answers: a second is a fair guess, and short enough not to strand
 * a client. */
#define GW_FB_PROBE_WAIT_MS 1000

static int64_t gw_fb_pool_wait_ms(const gw_pool_rt_t *pool, int64_t now)
{
    if (!pool || pool->engine || pool->nservers == 0)
        return 0;
    int64_t best = -1;
    for (size_t i = 0; i < pool->nservers; i++) {
        int64_t w = fb_breaker_wait_ms(pool->servers[i]->breaker, now, GW_FB_PROBE_WAIT_MS);
        if (best < 0 || w < best)
            best = w;
    }
    return best > 0 ? best : 0;
}

const char *gw_fb_retry_headers(const gw_req_t *r, char *buf, size_t n)
{
    if (n == 0)
        return buf;
    buf[0] = '\0';
    if (!r->model)
        return buf; /* not a proxied request: nothing was tried */
    size_t used = 0;
    if (r->attempts > 1 || r->fallback) {
        int k = snprintf(buf, n, "x-should-retry: false\r\n");
        used = k > 0 ? SL_MIN((size_t)k, n - 1) : 0;
    }
    int64_t wait = gw_fb_pool_wait_ms(r->att.pool, sl_now_ms());
    if (wait > 0)
        snprintf(buf + used, n - used, "Retry-After: %lld\r\nretry-after-ms: %lld\r\n",
                 (long long)((wait + 999) / 1000), (long long)wait);
    return buf;
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
