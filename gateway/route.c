/*
 * route.c — what a complete request is for: the OpenAI endpoints that are
 * proxied, the ones sluice answers itself (/v1/models, health), and the
 * admin listener's endpoints. Unknown paths are 404, known paths with the
 * wrong method 405 (with Allow), all as JSON errors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fallback/fallback.h"
#include "gateway/gw_admin.h"
#include "gateway/gw_conn.h"
#include "gateway/gw_fallback.h"
#include "gateway/gw_flow.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_llm.h"
#include "gateway/gw_proxy.h"
#include "gateway/gw_req.h"
#include "gateway/gw_route.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_server.h"
#include "gateway/gw_sup.h"
#include "gateway/gw_trace.h"
#include "gateway/gw_types.h"
#include "gateway/http1.h"
#include "model/model.h"

static const char *const gw_route_names[GW_ROUTE_COUNT] = {
    "chat_completions", "completions", "embeddings", "models",    "health",      "auth_token",
    "requests",         "admin",       "other",      "responses", "passthrough",
};

const char *gw_route_name(gw_route_t r)
{
    return gw_route_names[r];
}

/* By length, then a compare the compiler inlines (a strcmp call was ~30
 * instructions a request). */
#define gw_method_is(m, lit)                                                                       \
    ((m)->method_len == sizeof(lit) - 1 && memcmp((m)->method, (lit), sizeof(lit) - 1) == 0)

static bool gw_method_get(const gw_http_msg_t *m)
{
    return gw_method_is(m, "GET") || gw_method_is(m, "HEAD");
}

/* ---- handlers --------------------------------------------------------------- */

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

static void gw_route_healthz(gw_req_t *r)
{
    static const char ok[] = "{\"status\":\"ok\"}";
    gw_respond_json(r, 200, ok, sizeof(ok) - 1, "Cache-Control: no-store\r\n");
}

static void gw_route_models_list(gw_req_t *r)
{
    gw_respond_json(r, 200, r->rt->models_json, r->rt->models_json_len, NULL);
}

static void gw_route_model_one(gw_req_t *r)
{
    const gw_http_msg_t *msg = gw_http_msg(r->c->parser);
    static const char prefix[] = "/v1/models/"; /* the row's prefix */
    const gw_model_rt_t *m =
        gw_rt_model(r->rt, msg->target + sizeof(prefix) - 1, msg->path_len - (sizeof(prefix) - 1));
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

static void gw_route_metrics(gw_req_t *r)
{
    gw_hooks_metrics(r->c->w->srv);
    gw_llm_scrape(r->rt);
    size_t len = 0;
    char *text = sl_metrics_render(&len);
    if (!text) {
        gw_respond_oom(r);
        return;
    }
    gw_respond_body(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, len,
                    "Cache-Control: no-store\r\n");
    free(text);
}

/* ---- the route table -------------------------------------------------------- */

enum {
    GW_ON_MAIN = 1 << 0,  /* the main listener */
    GW_ON_ADMIN = 1 << 1, /* the admin listener */
};
enum {
    GW_M_GET = 1 << 0, /* GET and HEAD */
    GW_M_POST = 1 << 1,
    GW_M_DELETE = 1 << 2,
};

typedef struct gw_route_row {
    const char *path;
    size_t path_len;
    bool prefix;        /* path is a prefix, followed by a non-empty id */
    gw_route_t id;      /* metrics label, and what the hooks and the proxy look at */
    unsigned listeners; /* GW_ON_* */
    unsigned methods;   /* GW_M_*: the 405's Allow header too */
    bool hooks;         /* the pre-route hooks (auth) run first */
    void (*handler)(gw_req_t *r);
    const char *wrong_method; /* the 405's message */
} gw_route_row_t;

#define GW_ROUTE_EXACT(p)  (p), sizeof(p) - 1, false
#define GW_ROUTE_PREFIX(p) (p), sizeof(p) - 1, true

/* One row per route; the first match wins. Adding a route is a row here
 * (and, for a new label, a gw_route_t and its name above). */
static const gw_route_row_t gw_routes[] = {
    {GW_ROUTE_EXACT("/v1/chat/completions"), GW_ROUTE_CHAT, GW_ON_MAIN, GW_M_POST, true,
     gw_proxy_route, "Use POST for this endpoint."},
    {GW_ROUTE_EXACT("/v1/completions"), GW_ROUTE_COMPLETIONS, GW_ON_MAIN, GW_M_POST, true,
     gw_proxy_route, "Use POST for this endpoint."},
    {GW_ROUTE_EXACT("/v1/embeddings"), GW_ROUTE_EMBEDDINGS, GW_ON_MAIN, GW_M_POST, true,
     gw_proxy_route, "Use POST for this endpoint."},
    /* The Responses API: POST routed by its model like chat; retrieve,
     * delete and cancel carry no model (gw_proxy_route: the first model's
     * upstream, the one that stored the response). */
    {GW_ROUTE_EXACT("/v1/responses"), GW_ROUTE_RESPONSES, GW_ON_MAIN, GW_M_POST, true,
     gw_proxy_route, "Use POST for this endpoint."},
    {GW_ROUTE_PREFIX("/v1/responses/"), GW_ROUTE_RESPONSES, GW_ON_MAIN,
     GW_M_GET | GW_M_POST | GW_M_DELETE, true, gw_proxy_route,
     "Use GET, DELETE or POST .../cancel for this endpoint."},
    {GW_ROUTE_EXACT("/v1/models"), GW_ROUTE_MODELS, GW_ON_MAIN, GW_M_GET, true,
     gw_route_models_list, "Use GET for this endpoint."},
    {GW_ROUTE_PREFIX("/v1/models/"), GW_ROUTE_MODELS, GW_ON_MAIN, GW_M_GET, true,
     gw_route_model_one, "Use GET for this endpoint."},
    {GW_ROUTE_EXACT("/healthz"), GW_ROUTE_HEALTH, GW_ON_MAIN | GW_ON_ADMIN, GW_M_GET, false,
     gw_route_healthz, "Use GET for this endpoint."},
    {GW_ROUTE_EXACT("/readyz"), GW_ROUTE_HEALTH, GW_ON_MAIN | GW_ON_ADMIN, GW_M_GET, false,
     gw_route_readyz, "Use GET for this endpoint."},
    /* the token endpoint applies its own limit and checks (not the hooks) */
    {GW_ROUTE_EXACT("/v1/auth/token"), GW_ROUTE_AUTH_TOKEN, GW_ON_MAIN, GW_M_POST, false,
     gw_auth_token_route, "Use POST for this endpoint."},
    /* auth first: a queued answer is only its user's */
    {GW_ROUTE_PREFIX("/v1/requests/"), GW_ROUTE_REQUESTS, GW_ON_MAIN, GW_M_GET, true,
     gw_fb_requests_route, "Use GET for this endpoint."},
    {GW_ROUTE_EXACT("/metrics"), GW_ROUTE_ADMIN, GW_ON_ADMIN, GW_M_GET, false, gw_route_metrics,
     "Use GET for /metrics."},
    {GW_ROUTE_EXACT("/admin/revoke"), GW_ROUTE_ADMIN, GW_ON_ADMIN, GW_M_POST, false,
     gw_auth_revoke_route, "Use POST for /admin/revoke."},
    {GW_ROUTE_EXACT("/admin/state"), GW_ROUTE_ADMIN, GW_ON_ADMIN, GW_M_GET, false,
     gw_admin_state_route, "Use GET for /admin/state."},
    {GW_ROUTE_EXACT("/"), GW_ROUTE_ADMIN, GW_ON_ADMIN, GW_M_GET, false, gw_admin_status_page_route,
     "Use GET for the status page."},
};

static const gw_route_row_t *gw_route_find(const char *p, size_t n, unsigned listener)
{
    for (size_t i = 0; i < SL_ARRAY_LEN(gw_routes); i++) {
        const gw_route_row_t *row = &gw_routes[i];
        if (!(row->listeners & listener))
            continue;
        if (row->prefix ? n > row->path_len && memcmp(p, row->path, row->path_len) == 0
                        : n == row->path_len && memcmp(p, row->path, n) == 0)
            return row;
    }
    return NULL;
}

/* A path listed under passthrough: (exact, or under an entry ending in
 * '/'). */
static bool gw_route_passthrough(const conf_t *c, const char *p, size_t n)
{
    for (size_t i = 0; i < c->npassthrough; i++) {
        const char *e = c->passthrough[i];
        size_t el = strlen(e);
        if (el && e[el - 1] == '/' ? n > el && memcmp(p, e, el) == 0
                                   : n == el && memcmp(p, e, n) == 0)
            return true;
    }
    return false;
}

/* The client's trace, when it sent a valid traceparent, or a new one; the
 * upstream gets it with sluice's own span id (proxy.c), the access log its
 * trace id. */
static void gw_route_trace(gw_req_t *r, const gw_http_msg_t *m)
{
    const gw_http_header_t *h = gw_http_header_get(m, GW_HN_TRACEPARENT);
    uint8_t flags = 0;
    uint64_t rnd[3];
    gw_trace_random(rnd, 3);
    if (!h || !gw_trace_parse(h->value, h->value_len, r->trace_id, &flags)) {
        gw_trace_new_id(r->trace_id, rnd[0], rnd[1]);
        flags = 0; /* sluice records no spans: not sampled */
    }
    gw_trace_format(r->traceparent, sizeof(r->traceparent), r->trace_id, rnd[2], flags);
}

void gw_route_dispatch(gw_req_t *r)
{
    const gw_http_msg_t *m = gw_http_msg(r->c->parser);
    gw_route_trace(r, m);
    const char *path = m->target;
    size_t n = m->path_len;
    bool admin = r->c->admin;
    const gw_route_row_t *row = gw_route_find(path, n, admin ? GW_ON_ADMIN : GW_ON_MAIN);
    if (!row && !admin && gw_route_passthrough(r->rt->conf, path, n)) {
        /* A conf passthrough path: auth and limits, then the proxy (the
         * body's model picks the upstream when it names one). */
        r->route = GW_ROUTE_PASSTHROUGH;
        r->handler = gw_proxy_route;
        gw_proxy_start(r);
        return;
    }
    if (!row) {
        r->route = admin ? GW_ROUTE_ADMIN : GW_ROUTE_OTHER;
        if (admin) {
            gw_respond_error(r, 404, "invalid_request_error", "not_found", "Unknown admin path.");
            return;
        }
        char msg[160];
        snprintf(msg, sizeof(msg), "Unknown path: %.*s", (int)SL_MIN(n, 100), path);
        gw_respond_error(r, 404, "invalid_request_error", "not_found", msg);
        return;
    }
    r->route = row->id;
    bool ok = ((row->methods & GW_M_GET) && gw_method_get(m)) ||
              ((row->methods & GW_M_POST) && gw_method_is(m, "POST")) ||
              ((row->methods & GW_M_DELETE) && gw_method_is(m, "DELETE"));
    if (!ok) {
        char allow[64];
        snprintf(allow, sizeof(allow), "Allow: %s%s%s%s%s\r\n",
                 (row->methods & GW_M_GET) ? "GET, HEAD" : "",
                 (row->methods & GW_M_GET) && (row->methods & GW_M_POST) ? ", " : "",
                 (row->methods & GW_M_POST) ? "POST" : "",
                 (row->methods & GW_M_DELETE) && row->methods != GW_M_DELETE ? ", " : "",
                 (row->methods & GW_M_DELETE) ? "DELETE" : "");
        gw_respond_error_h(r, 405, "invalid_request_error", "method_not_allowed", row->wrong_method,
                           allow);
        return;
    }
    if (row->hooks) {
        r->handler = row->handler; /* called once the pre-route hooks passed */
        gw_proxy_start(r);
        return;
    }
    row->handler(r);
}
