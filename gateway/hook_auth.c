/*
 * hook_auth.c — the auth adapter: first in the chain, before the body is
 * even parsed. Checks the bearer token and the request signature (auth/
 * decides; the nonce and revocation checks may go to Redis), sets the
 * request's user for rate limits and logs, and answers 401 (or 503 when
 * the stores are down and conf says deny) with WWW-Authenticate. Also
 * serves POST /v1/auth/token (rate-limited per client address) and the
 * admin listener's POST /admin/revoke.
 */
#include <stdio.h>
#include <string.h>

#include "auth/auth.h"
#include "common/log.h"
#include "common/redis.h"
#include "gateway/gw_conn.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_req.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_types.h"
#include "gateway/gw_worker.h"
#include "gateway/http1.h"
#include "ratelimit/ratelimit.h"

typedef struct gw_auth {
    gw_req_t *r;
    auth_pending_t *pending;
    rl_pending_t *rl_pending;
    rl_ticket_t *rl_ticket;
} gw_auth_t;

static void gw_auth_reply(gw_req_t *r, auth_http_reply_t *reply, const char *extra)
{
    char hdrs[512];
    size_t n = 0;
    if (reply->www_authenticate[0])
        n += (size_t)snprintf(hdrs, sizeof(hdrs), "WWW-Authenticate: %s\r\n",
                              reply->www_authenticate);
    snprintf(hdrs + n, sizeof(hdrs) - n, "%s%s", reply->headers, extra ? extra : "");
    gw_respond_json(r, reply->status, reply->body ? reply->body : "{}",
                    reply->body ? reply->body_len : 2, hdrs);
    auth_http_reply_clear(reply);
}

SL_COLD static void gw_auth_reject(gw_req_t *r, auth_reason_t reason)
{
    auth_http_reply_t reply;
    memset(&reply, 0, sizeof(reply));
    r->error_kind = auth_reason_str(reason);
    if (auth_reject_reply(reason, &reply) != 0) {
        gw_respond_oom(r);
        return;
    }
    gw_auth_reply(r, &reply, NULL);
}

static bool gw_auth_result(gw_req_t *r, const auth_result_t *res)
{
    if (res->reason != AUTH_OK) {
        gw_auth_reject(r, res->reason);
        return false;
    }
    if (res->authenticated) { /* every request: no format pass */
        size_t n = strnlen(res->claims.sub, sizeof(res->claims.sub));
        n = SL_MIN(n, sizeof(r->tx.user) - 1);
        memcpy(r->tx.user, res->claims.sub, n);
        r->tx.user[n] = '\0';
        gw_req_tx_mark(r, GW_REQ_TX_USER, true);
    }
    return true;
}

/* The state of a request waiting for Redis (the only one that has any). */
static gw_auth_t *gw_auth_state(gw_req_t *r)
{
    return r->hooks.state[gw_hook_index(&gw_hook_auth)];
}

static void gw_auth_checked(void *arg, const auth_result_t *res)
{
    gw_req_t *r = arg;
    gw_auth_t *s = gw_auth_state(r);
    if (s)
        s->pending = NULL;
    if (res->reason != AUTH_OK) {
        /* Answering ends the request and frees s: leave the chain first. */
        gw_hook_resume(r, GW_HOOK_DONE);
        gw_auth_reject(r, res->reason);
        return;
    }
    gw_auth_result(r, res);
    gw_hook_resume(r, GW_HOOK_NEXT);
}

/* By the name's id (set when the head was checked): no strlen and
 * classification of the name per lookup, four lookups per request. */
static void gw_auth_hdr(const gw_http_msg_t *m, gw_http_hn_t id, const char **v, size_t *len)
{
    const gw_http_header_t *h = gw_http_header_get(m, id);
    *v = h ? h->value : NULL;
    *len = h ? h->value_len : 0;
}

static gw_hook_rc_t gw_auth_on_request(gw_req_t *r, void **state)
{
    const auth_t *a = r->rt->auth;
    if (!a)
        return GW_HOOK_NEXT; /* auth is off (no keys configured) */
    const gw_http_msg_t *m = gw_http_msg(r->c->parser);
    auth_request_t q;
    memset(&q, 0, sizeof(q));
    gw_auth_hdr(m, GW_HN_AUTHORIZATION, &q.authorization, &q.authorization_len);
    gw_auth_hdr(m, GW_HN_X_SLUICE_TIMESTAMP, &q.timestamp, &q.timestamp_len);
    gw_auth_hdr(m, GW_HN_X_SLUICE_NONCE, &q.nonce, &q.nonce_len);
    gw_auth_hdr(m, GW_HN_X_SLUICE_SIGNATURE, &q.signature, &q.signature_len);
    q.method = m->method;
    q.method_len = m->method_len;
    q.path = m->target;
    q.path_len = m->target_len;
    q.body_len = evbuffer_get_length(r->body);
    q.body = q.body_len ? (const void *)evbuffer_pullup(r->body, -1) : (const void *)"";
    auth_result_t res;
    auth_pending_t *pending = NULL;
    switch (auth_check(a, r->c->w->redis, &q, sl_wall_s(), &res, gw_auth_checked, r, &pending)) {
    case AUTH_PENDING: {
        /* Only a request waiting for Redis needs state (to cancel the
         * wait): the in-process checks answer at once, with no allocation. */
        gw_auth_t *s = sl_zalloc(sizeof(*s));
        if (!s) {
            auth_pending_cancel(pending);
            gw_respond_oom(r);
            return GW_HOOK_DONE;
        }
        s->r = r;
        s->pending = pending;
        *state = s;
        return GW_HOOK_PENDING;
    }
    default:
        return gw_auth_result(r, &res) ? GW_HOOK_NEXT : GW_HOOK_DONE;
    }
}

static void gw_auth_on_cancel(gw_req_t *r, void *state)
{
    (void)r;
    gw_auth_t *s = state;
    if (s && s->pending) {
        auth_pending_cancel(s->pending);
        s->pending = NULL;
    }
}

static void gw_auth_on_end(gw_req_t *r, void *state, gw_end_t how)
{
    (void)r;
    (void)how;
    gw_auth_t *s = state;
    if (!s)
        return;
    if (s->pending)
        auth_pending_cancel(s->pending);
    free(s);
}

/* ---- lifecycle ------------------------------------------------------------ */

static const char *gw_conf_path(const conf_t *c)
{
    return c->path ? c->path : "conf";
}

/* The process-wide stores the tick keeps up (borrowed from the shared
 * state, which outlives the maintenance timer). Main thread only. */
static auth_stores_t *gw_auth_stores;

/* The verifier, per runtime, on the process-wide stores (borrowed). */
static int gw_auth_rt_build(gw_rt_t *rt, gw_shared_t *sh, char *err, size_t errlen)
{
    const conf_t *c = rt->conf;
    gw_auth_stores = sh->auth_stores;
    if (!auth_conf_enabled(&c->auth))
        return 0;
    char e[512];
    rt->auth = auth_new(&c->auth, sh->auth_stores, e, sizeof(e));
    if (!rt->auth) {
        snprintf(err, errlen, "%s: auth: %s", gw_conf_path(c), e);
        return -1;
    }
    return 0;
}

static void gw_auth_rt_free(gw_rt_t *rt)
{
    auth_free(rt->auth);
    rt->auth = NULL;
}

/* Each thread's own Redis client for the nonce and revocation stores. */
static int gw_auth_worker_init(gw_worker_t *w)
{
    const conf_redis_t *rc = &w->rt->conf->redis;
    /* With Redis configured, whether auth is on or not at start: a reload
     * may turn it on, and its nonces must then be shared, not per process. */
    if (!rc->url)
        return 0;
    char err[256];
    sl_redis_opts_t o = {.url = rc->url, .timeout_ms = rc->timeout_ms};
    w->redis = sl_redis_new(w->base, &o, err, sizeof(err));
    if (!w->redis) {
        sl_error("worker %d: redis: %s", w->id, err);
        return -1;
    }
    return 0;
}

static void gw_auth_worker_fini(gw_worker_t *w)
{
    sl_redis_free(w->redis);
    w->redis = NULL;
}

/* The nonce store's upkeep: tables a peak left mostly empty shrink (their
 * memory goes back) even when no signed request comes to do it. */
static void gw_auth_tick(gw_server_t *s)
{
    (void)s;
    if (gw_auth_stores)
        auth_stores_maintain(gw_auth_stores, sl_wall_s());
}

const gw_hook_t gw_hook_auth = {
    .name = "auth",
    .tick = gw_auth_tick,
    .rt_build = gw_auth_rt_build,
    .rt_free = gw_auth_rt_free,
    .worker_init = gw_auth_worker_init,
    .worker_fini = gw_auth_worker_fini,
    .on_request = gw_auth_on_request,
    .on_cancel = gw_auth_on_cancel,
    .on_end = gw_auth_on_end,
};

/* ---- POST /v1/auth/token -------------------------------------------------- */

/* Requests to the token endpoint keep their state here (not a hook: the
 * chain does not run for it). */
typedef struct gw_token_req {
    gw_req_t *r;
    rl_pending_t *pending;
} gw_token_req_t;

static void gw_token_issue(gw_req_t *r)
{
    auth_http_reply_t reply;
    memset(&reply, 0, sizeof(reply));
    size_t len = evbuffer_get_length(r->body);
    const char *body = len ? (const char *)evbuffer_pullup(r->body, -1) : "";
    if (auth_token_endpoint(r->rt->auth, body, len, sl_wall_s(), &reply) != 0) {
        gw_respond_oom(r);
        return;
    }
    gw_auth_reply(r, &reply, "Cache-Control: no-store\r\nPragma: no-cache\r\n");
}

static void gw_token_limit_answer(gw_req_t *r, const rl_decision_t *d, rl_ticket_t *ticket)
{
    /* The request itself is what is limited: nothing to settle later. */
    rl_ticket_release(ticket);
    if (d->allowed) {
        gw_token_issue(r);
        return;
    }
    gw_rl_respond_refusal(r, d);
}

static void gw_token_limited(void *arg, const rl_decision_t *d, rl_ticket_t *ticket)
{
    gw_req_t *r = arg;
    gw_req_wait_done(r);
    gw_token_limit_answer(r, d, ticket);
}

static void gw_token_wait_cancel(gw_req_t *r, void *pending)
{
    (void)r;
    rl_pending_cancel(pending);
}

void gw_auth_token_route(gw_req_t *r)
{
    if (!r->rt->auth) {
        gw_respond_error(r, 404, "invalid_request_error", "not_found",
                         "Token issuance is not configured.");
        return;
    }
    gw_worker_t *w = r->c->w;
    if (!w->rlw || !r->rt->conf->ratelimit.per_ip.requests_per_minute) {
        gw_token_issue(r);
        return;
    }
    gw_rl_client_ip(r);
    rl_request_t q = {
        .policy = gw_rl_policy(r->rt), .user = NULL, .client = NULL, .ip = gw_req_client_ip(r)};
    rl_decision_t d;
    rl_ticket_t *ticket = NULL;
    rl_pending_t *pending = NULL;
    switch (rl_check(w->rlw, &q, &d, &ticket, gw_token_limited, r, &pending)) {
    case RL_PENDING:
        gw_req_wait(r, gw_token_wait_cancel, pending);
        return;
    case RL_DONE:
        gw_token_limit_answer(r, &d, ticket);
        return;
    default:
        gw_respond_oom(r);
        return;
    }
}

/* ---- POST /admin/revoke ---------------------------------------------------- */

static void gw_revoke_done(void *arg, auth_http_reply_t *reply)
{
    gw_req_t *r = arg;
    gw_req_wait_done(r);
    gw_auth_reply(r, reply, "Cache-Control: no-store\r\n");
}

static void gw_revoke_wait_cancel(gw_req_t *r, void *pending)
{
    (void)r;
    auth_pending_cancel(pending);
}

void gw_auth_revoke_route(gw_req_t *r)
{
    if (!r->rt->auth) {
        gw_respond_error(r, 404, "invalid_request_error", "not_found",
                         "Revocation is not configured.");
        return;
    }
    const gw_http_msg_t *m = gw_http_msg(r->c->parser);
    const gw_http_header_t *az = gw_http_header_find(m, "Authorization");
    size_t len = evbuffer_get_length(r->body);
    const char *body = len ? (const char *)evbuffer_pullup(r->body, -1) : "";
    auth_http_reply_t reply;
    memset(&reply, 0, sizeof(reply));
    auth_pending_t *pending = NULL;
    auth_status_t st = auth_admin_revoke(r->rt->auth, r->c->w->redis, az ? az->value : NULL,
                                         az ? az->value_len : 0, body, len, sl_wall_s(), &reply,
                                         gw_revoke_done, r, &pending);
    if (st == AUTH_PENDING) {
        gw_req_wait(r, gw_revoke_wait_cancel, pending);
        return;
    }
    gw_auth_reply(r, &reply, "Cache-Control: no-store\r\n");
}
