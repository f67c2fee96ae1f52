/*
 * route.c — what a complete request is for: the OpenAI endpoints that are
 * proxied, the ones sluice answers itself (/v1/models, health), and the
 * admin listener's endpoints. Unknown paths are 404, known paths with the
 * wrong method 405 (with Allow), all as JSON errors.
 */
#include <stdio.h>
#include <string.h>

#include "fallback/fallback.h"
#include "gateway/gw_conn.h"
#include "gateway/gw_fallback.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_proxy.h"
#include "gateway/gw_req.h"
#include "gateway/gw_route.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_server.h"
#include "gateway/gw_sup.h"
#include "gateway/gw_types.h"
#include "gateway/http1.h"
#include "model/model.h"

static const char *const gw_route_names[GW_ROUTE_COUNT] = {
    "chat_completions", "completions", "embeddings", "models", "health",
    "auth_token",       "requests",    "admin",      "other",
};

const char *gw_route_name(gw_route_t r)
{
    return gw_route_names[r];
}

static bool gw_path_is(const char *p, size_t n, const char *lit)
{
    size_t l = strlen(lit);
    return n == l && memcmp(p, lit, l) == 0;
}

gw_route_t gw_route_of(const char *p, size_t n)
{
    if (gw_path_is(p, n, "/v1/chat/completions"))
        return GW_ROUTE_CHAT;
    if (gw_path_is(p, n, "/v1/completions"))
        return GW_ROUTE_COMPLETIONS;
    if (gw_path_is(p, n, "/v1/embeddings"))
        return GW_ROUTE_EMBEDDINGS;
    if (gw_path_is(p, n, "/v1/models") || (n > 11 && memcmp(p, "/v1/models/", 11) == 0))
        return GW_ROUTE_MODELS;
    if (gw_path_is(p, n, "/healthz") || gw_path_is(p, n, "/readyz"))
        return GW_ROUTE_HEALTH;
    if (gw_path_is(p, n, "/v1/auth/token"))
        return GW_ROUTE_AUTH_TOKEN;
    if (n > 13 && memcmp(p, "/v1/requests/", 13) == 0)
        return GW_ROUTE_REQUESTS;
    return GW_ROUTE_OTHER;
}

static bool gw_method_is(const gw_http_msg_t *m, const char *meth)
{
    return strcmp(m->method, meth) == 0;
}

static bool gw_method_get(const gw_http_msg_t *m)
{
    return gw_method_is(m, "GET") || gw_method_is(m, "HEAD");
}

/* /readyz: 200 when serving and every upstream has a server in service. */
static void gw_route_readyz(gw_req_t *r)
{
    bool ok = gw_server_ready();
    int64_t now = sl_now_ms();
    json_t *ups = json_object();
    for (size_t i = 0; i < r->rt->npools; i++) {
        const gw_pool_rt_t *p = &r->rt->pools[i];
        int in_service = 0;
        for (size_t k = 0; k < p->nservers; k++)
            if (fb_breaker_state(p->servers[k]->breaker, now) != FB_CIRCUIT_OPEN)
                in_service++;
        if (p->engine) /* the in-process model: loaded and warmed up */
            in_service = mdl_engine_ready(p->engine);
        if (!gw_sup_healthy(p->sup)) /* a supervised server still starting */
            in_service = 0;
        json_object_set_new(
            ups, p->name,
            json_pack("{s:i,s:i}", "servers", (int)p->nservers, "in_service", in_service));
        if (in_service == 0)
            ok = false;
    }
    json_t *o = json_pack("{s:s,s:o}", "status", ok ? "ready" : "not_ready", "upstreams", ups);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    gw_respond_json(r, ok ? 200 : 503, s, strlen(s), "Cache-Control: no-store\r\n");
    free(s);
}

static void gw_route_health(gw_req_t *r, const char *path, size_t n)
{
    if (gw_path_is(path, n, "/readyz")) {
        gw_route_readyz(r);
        return;
    }
    static const char ok[] = "{\"status\":\"ok\"}";
    gw_respond_json(r, 200, ok, sizeof(ok) - 1, "Cache-Control: no-store\r\n");
}

void gw_route_models(gw_req_t *r)
{
    const gw_http_msg_t *msg = gw_http_msg(r->c->parser);
    const char *path = msg->target;
    size_t n = msg->path_len;
    if (n == 10) { /* /v1/models */
        gw_respond_json(r, 200, r->rt->models_json, r->rt->models_json_len, NULL);
        return;
    }
    const gw_model_rt_t *m = gw_rt_model(r->rt, path + 11, n - 11);
    if (!m) {
        gw_respond_error(r, 404, "invalid_request_error", "model_not_found",
                         "The model does not exist.");
        return;
    }
    json_t *o = json_pack("{s:s,s:s,s:i,s:s}", "id", m->name, "object", "model", "created", 0,
                          "owned_by", "sluice");
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    gw_respond_json(r, 200, s, strlen(s), NULL);
    free(s);
}

static void gw_route_admin(gw_req_t *r, const gw_http_msg_t *m, const char *path, size_t n)
{
    r->route = GW_ROUTE_ADMIN;
    if (gw_path_is(path, n, "/metrics")) {
        if (!gw_method_get(m)) {
            gw_respond_error(r, 405, "invalid_request_error", "method_not_allowed",
                             "Use GET for /metrics.");
            return;
        }
        gw_hooks_metrics(r->c->w->srv);
        size_t len = 0;
        char *text = sl_metrics_render(&len);
        if (!text) {
            gw_respond_oom(r);
            return;
        }
        /* Reuse the JSON writer with another content type. */
        gw_conn_t *c = r->c;
        struct evbuffer *out = bufferevent_get_output(c->bev);
        if (c->w->draining)
            c->close_after = true;
        evbuffer_add_printf(out,
                            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; "
                            "charset=utf-8\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n"
                            "%s\r\n",
                            len, c->close_after ? "Connection: close\r\n" : "");
        if (!gw_method_is(m, "HEAD"))
            evbuffer_add(out, text, len);
        free(text);
        r->status = 200;
        gw_conn_req_done(c);
        return;
    }
    if (gw_route_of(path, n) == GW_ROUTE_HEALTH) {
        r->route = GW_ROUTE_HEALTH;
        if (!gw_method_get(m)) {
            gw_respond_error(r, 405, "invalid_request_error", "method_not_allowed", "Use GET.");
            return;
        }
        gw_route_health(r, path, n);
        return;
    }
    if (gw_path_is(path, n, "/admin/revoke")) {
        if (!gw_method_is(m, "POST")) {
            gw_respond_error(r, 405, "invalid_request_error", "method_not_allowed",
                             "Use POST for /admin/revoke.");
            return;
        }
        gw_auth_revoke_route(r);
        return;
    }
    gw_respond_error(r, 404, "invalid_request_error", "not_found", "Unknown admin path.");
}

void gw_route_dispatch(gw_req_t *r)
{
    const gw_http_msg_t *m = gw_http_msg(r->c->parser);
    const char *path = m->target;
    size_t n = m->path_len;
    if (r->c->admin) {
        gw_route_admin(r, m, path, n);
        return;
    }
    r->route = gw_route_of(path, n);
    switch (r->route) {
    case GW_ROUTE_CHAT:
    case GW_ROUTE_COMPLETIONS:
    case GW_ROUTE_EMBEDDINGS:
        if (!gw_method_is(m, "POST")) {
            gw_respond_error(r, 405, "invalid_request_error", "method_not_allowed",
                             "Use POST for this endpoint.");
            return;
        }
        gw_proxy_start(r);
        return;
    case GW_ROUTE_REQUESTS:
        if (!gw_method_get(m)) {
            gw_respond_error(r, 405, "invalid_request_error", "method_not_allowed",
                             "Use GET for this endpoint.");
            return;
        }
        gw_proxy_start(r); /* auth first: a queued answer is only its user's */
        return;
    case GW_ROUTE_AUTH_TOKEN:
        if (!gw_method_is(m, "POST")) {
            gw_respond_error(r, 405, "invalid_request_error", "method_not_allowed",
                             "Use POST for this endpoint.");
            return;
        }
        gw_auth_token_route(r);
        return;
    case GW_ROUTE_MODELS:
    case GW_ROUTE_HEALTH:
        if (!gw_method_get(m)) {
            gw_respond_error(r, 405, "invalid_request_error", "method_not_allowed",
                             "Use GET for this endpoint.");
            return;
        }
        if (r->route == GW_ROUTE_MODELS)
            gw_proxy_start(r); /* the pre-route hooks (auth) guard it too */
        else
            gw_route_health(r, path, n);
        return;
    default:
        break;
    }
    char msg[160];
    snprintf(msg, sizeof(msg), "Unknown path: %.*s", (int)SL_MIN(n, 100), path);
    gw_respond_error(r, 404, "invalid_request_error", "not_found", msg);
}
