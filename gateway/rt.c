/*
 * rt.c — the runtime: everything the request path needs that is derived
 * from one conf_t (parsed server URLs and resolved addresses, API key
 * headers, TLS contexts, the model table, the /v1/models body). Built on
 * the main thread at start and on reload — name resolution and file reads
 * happen here, never on a worker — then shared read-only by all workers
 * and freed when its last reference goes.
 */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "auth/auth.h"
#include "common/log.h"
#include "fallback/fallback.h"
#include "gateway/body_scan.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_sup.h"
#include "gateway/gw_tls.h"
#include "gateway/gw_types.h"

static _Atomic uint64_t gw_rt_generations;

static int gw_srv_build(gw_srv_rt_t *s, const conf_server_t *cs, const char *path, char *err,
                        size_t errlen)
{
    s->url = sl_xstrdup(cs->url);
    s->weight = (int)cs->weight;
    /* The conf loader has parsed and checked the URL (scheme, host, port,
     * base path): one parser, so -t and the runtime cannot disagree. */
    s->https = cs->https;
    s->host = sl_xstrdup(cs->host);
    s->port = cs->port;
    s->base_path = sl_xstrdup(cs->base_path);
    if (!s->host[0]) {
        snprintf(err, errlen, "%s:%d: bad server url \"%s\"", path, cs->line, cs->url);
        return -1;
    }
    char portbuf[8];
    snprintf(portbuf, sizeof(portbuf), "%d", s->port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(s->host, portbuf, &hints, &ai);
    if (rc != 0 || !ai) {
        snprintf(err, errlen, "%s:%d: cannot resolve %s: %s", path, cs->line, s->host,
                 gai_strerror(rc));
        return -1;
    }
    memcpy(&s->addr, ai->ai_addr, ai->ai_addrlen);
    s->addrlen = ai->ai_addrlen;
    freeaddrinfo(ai);
    bool v6 = strchr(s->host, ':') != NULL;
    bool dflt = s->port == (s->https ? 443 : 80);
    size_t n = strlen(s->host) + 16;
    s->host_header = sl_xmalloc(n);
    if (dflt)
        snprintf(s->host_header, n, v6 ? "[%s]" : "%s", s->host);
    else
        snprintf(s->host_header, n, v6 ? "[%s]:%d" : "%s:%d", s->host, s->port);
    s->host_header_len = strlen(s->host_header);
    s->base_path_len = strlen(s->base_path);
    return 0;
}

/* The retry budget of an upstream, by name, kept across reloads. */
static struct fb_budget *gw_shared_budget(gw_shared_t *sh, const char *name,
                                          const conf_fb_retry_t *c)
{
    for (size_t i = 0; i < sh->nbudgets; i++) {
        if (strcmp(sh->budgets[i].name, name) == 0) {
            fb_budget_configure(sh->budgets[i].budget, c);
            return sh->budgets[i].budget;
        }
    }
    struct gw_budget_slot *b = realloc(sh->budgets, (sh->nbudgets + 1) * sizeof(*b));
    if (!b)
        return NULL;
    sh->budgets = b;
    b[sh->nbudgets].name = sl_xstrdup(name);
    b[sh->nbudgets].budget = fb_budget_new(c, name);
    return b[sh->nbudgets++].budget;
}

gw_shared_t *gw_shared_new(void)
{
    gw_shared_t *sh = sl_xcalloc(1, sizeof(*sh));
    sh->auth_stores = auth_stores_new(0, 0);
    if (sh->auth_stores) /* the start: replays of earlier requests are refused */
        auth_stores_set_started(sh->auth_stores, sl_wall_s());
    sh->breakers = fb_breakers_new();
    if (!sh->auth_stores || !sh->breakers) {
        gw_shared_free(sh);
        return NULL;
    }
    return sh;
}

void gw_shared_free(gw_shared_t *sh)
{
    if (!sh)
        return;
    gw_engines_free(sh);
    auth_stores_free(sh->auth_stores);
    fb_breakers_free(sh->breakers);
    for (size_t i = 0; i < sh->nbudgets; i++) {
        free(sh->budgets[i].name);
        fb_budget_free(sh->budgets[i].budget);
    }
    free(sh->budgets);
    free(sh);
}

static int gw_pool_build(gw_rt_t *rt, gw_shared_t *sh, gw_pool_rt_t *p, const conf_upstream_t *cu,
                         size_t *next_srv, char *err, size_t errlen)
{
    const char *path = rt->conf->path ? rt->conf->path : "conf";
    p->conf = cu;
    p->name = cu->name;
    /* The pool's breakers: fallback.circuit, with this upstream's own
     * max_fails / eject when it sets them. */
    p->circuit = rt->conf->fallback.circuit;
    if (cu->max_fails > 0)
        p->circuit.failures = cu->max_fails;
    if (cu->eject_ms > 0)
        p->circuit.cooldown_ms = cu->eject_ms;
    p->budget = gw_shared_budget(sh, cu->name, &rt->conf->fallback.retry);
    if (!p->budget) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (cu->engine.model) {
        p->engine = gw_engine_get(sh, cu, err, errlen);
        if (!p->engine)
            return -1;
    }
    p->sup = cu->ncommand ? gw_sup_find(cu->name) : NULL;
    p->nservers = cu->nservers;
    p->servers = sl_xcalloc(cu->nservers, sizeof(*p->servers));
    bool any_https = false;
    for (size_t i = 0; i < cu->nservers; i++) {
        gw_srv_rt_t *s = &rt->servers[*next_srv];
        s->index = (*next_srv)++;
        s->pool = p;
        p->servers[i] = s;
        if (gw_srv_build(s, &cu->servers[i], path, err, errlen) != 0)
            return -1;
        s->breaker = fb_breakers_get(sh->breakers, &p->circuit, cu->name, s->url);
        any_https |= s->https;
        const char *vn[2] = {cu->name, "false"}, *vr[2] = {cu->name, "true"};
        s->m_conn_new = sl_metric_series(gw_m.up_conns, vn);
        s->m_conn_reused = sl_metric_series(gw_m.up_conns, vr);
        s->m_idle = sl_metric_series1(gw_m.up_idle, cu->name);
        s->m_idle_closed = sl_metric_series1(gw_m.up_idle_closed, cu->name);
    }
    if (cu->api_key_env) {
        const char *key = getenv(cu->api_key_env);
        if (!key || !*key) {
            snprintf(err, errlen,
                     "%s:%d: upstreams.%s.api_key_env: environment variable %s is not set", path,
                     cu->line, cu->name, cu->api_key_env);
            return -1;
        }
        if (strpbrk(key, "\r\n")) {
            snprintf(err, errlen, "%s:%d: upstreams.%s.api_key_env: %s holds a line break", path,
                     cu->line, cu->name, cu->api_key_env);
            return -1;
        }
        size_t n = strlen(key) + 32;
        p->auth_header = sl_xmalloc(n);
        p->auth_header_len =
            (size_t)snprintf(p->auth_header, n, "Authorization: Bearer %s\r\n", key);
    }
    if (any_https) {
        char e[256];
        p->ssl_ctx = gw_tls_client_ctx(cu->tls_ca_file, e, sizeof(e));
        if (!p->ssl_ctx) {
            snprintf(err, errlen, "%s:%d: upstreams.%s.tls: %s", path, cu->line, cu->name, e);
            return -1;
        }
    }
    p->m_ttfb = sl_metric_series1(gw_m.up_ttfb, cu->name);
    return 0;
}

static void gw_models_json_build(gw_rt_t *rt)
{
    json_t *data = json_array();
    for (size_t i = 0; i < rt->nmodels; i++)
        json_array_append_new(data,
                              json_pack("{s:s,s:s,s:i,s:s}", "id", rt->models[i].name, "object",
                                        "model", "created", 0, "owned_by", "sluice"));
    json_t *o = json_pack("{s:s,s:o}", "object", "list", "data", data);
    rt->models_json = json_dumps(o, JSON_COMPACT);
    rt->models_json_len = strlen(rt->models_json);
    json_decref(o);
}

static void gw_rt_destroy(gw_rt_t *rt)
{
    for (size_t i = 0; i < rt->npools; i++) {
        gw_engine_put(rt->shared, rt->pools[i].engine);
        free(rt->pools[i].servers);
        free(rt->pools[i].auth_header);
        SSL_CTX_free(rt->pools[i].ssl_ctx);
    }
    for (size_t i = 0; i < rt->nservers; i++) {
        free(rt->servers[i].url);
        free(rt->servers[i].host);
        free(rt->servers[i].base_path);
        free(rt->servers[i].host_header);
    }
    if (rt->listen_ssl)
        for (size_t i = 0; i < rt->conf->nlisten; i++)
            SSL_CTX_free(rt->listen_ssl[i]);
    free(rt->listen_ssl);
    gw_hooks_rt_free(rt);
    if (rt->intent)
        pcre2_code_free(rt->intent);
    free(rt->admin_key);
    free(rt->pools);
    free(rt->servers);
    for (size_t i = 0; rt->models && i < rt->nmodels; i++)
        free(rt->models[i].served_json);
    free(rt->models);
    free(rt->models_json);
    conf_free(rt->conf);
    free(rt);
}

gw_rt_t *gw_rt_new(conf_t *c, gw_shared_t *sh, char *err, size_t errlen)
{
    gw_rt_t *rt = sl_xcalloc(1, sizeof(*rt));
    atomic_init(&rt->refs, 1);
    rt->generation = atomic_fetch_add(&gw_rt_generations, 1) + 1;
    rt->conf = c;
    rt->shared = sh;
    rt->npools = c->nupstreams;
    rt->pools = sl_xcalloc(c->nupstreams, sizeof(*rt->pools));
    for (size_t i = 0; i < c->nupstreams; i++)
        rt->nservers += c->upstreams[i].nservers;
    rt->servers = sl_xcalloc(rt->nservers, sizeof(*rt->servers));
    size_t next = 0;
    for (size_t i = 0; i < c->nupstreams; i++)
        if (gw_pool_build(rt, sh, &rt->pools[i], &c->upstreams[i], &next, err, errlen) != 0)
            goto fail;
    rt->nmodels = c->nmodels;
    rt->models = sl_xcalloc(c->nmodels, sizeof(*rt->models));
    for (size_t i = 0; i < c->nmodels; i++) {
        const conf_model_t *cm = &c->models[i];
        gw_model_rt_t *m = &rt->models[i];
        m->name = cm->name;
        m->conf = cm;
        m->served = cm->served ? cm->served : cm->name;
        m->alias = strcmp(m->served, m->name) != 0;
        m->name_len = strlen(m->name);
        m->served_len = strlen(m->served);
        m->gen = rt->generation;
        char q[256];
        size_t qn;
        if (gw_json_quote(m->served, m->served_len, q, sizeof(q), &qn) == 0) {
            m->served_json = sl_xmalloc(qn);
            memcpy(m->served_json, q, qn);
            m->served_json_len = qn;
        }
        for (size_t k = 0; k < rt->npools; k++)
            if (strcmp(rt->pools[k].name, cm->upstream) == 0)
                m->pool = &rt->pools[k];
        if (!m->pool) {
            snprintf(err, errlen, "%s:%d: models.%s.upstream: no upstream named \"%s\"",
                     c->path ? c->path : "conf", cm->line, cm->name, cm->upstream);
            goto fail;
        }
    }
    rt->listen_ssl = sl_xcalloc(c->nlisten, sizeof(*rt->listen_ssl));
    for (size_t i = 0; i < c->nlisten; i++) {
        const conf_listen_t *l = &c->listen[i];
        if (!l->tls_cert)
            continue;
        char e[512];
        rt->listen_ssl[i] = gw_tls_server_ctx(l->tls_cert, l->tls_key, e, sizeof(e));
        if (rt->listen_ssl[i])
            gw_tls_server_alpn(rt->listen_ssl[i], l->protocols, l->nprotocols);
        if (!rt->listen_ssl[i]) {
            snprintf(err, errlen, "%s:%d: listen %s: %s", c->path ? c->path : "conf", l->line,
                     l->address, e);
            goto fail;
        }
    }
    /* The policy modules' compiled state (auth verifier, filter rules,
     * templates, ...): each hook checks the conf, then builds its part. */
    if (gw_hooks_check(c, err, errlen) != 0 || gw_hooks_rt_build(rt, sh, err, errlen) != 0)
        goto fail;
    if (c->routing.auto_model)
        rt->auto_model = gw_rt_model(rt, c->routing.auto_model, strlen(c->routing.auto_model));
    if (c->routing.intent) {
        int ec;
        PCRE2_SIZE off;
        rt->intent = pcre2_compile((PCRE2_SPTR)c->routing.intent, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &ec, &off, NULL);
        if (!rt->intent) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(ec, msg, sizeof(msg));
            snprintf(err, errlen, "%s: routing.intent: %s at offset %zu",
                     c->path ? c->path : "conf", (const char *)msg, (size_t)off);
            goto fail;
        }
        pcre2_jit_compile(rt->intent, PCRE2_JIT_COMPLETE);
    }
    if (c->auth.admin_key_env && getenv(c->auth.admin_key_env))
        rt->admin_key = sl_xstrdup(getenv(c->auth.admin_key_env));
    gw_models_json_build(rt);
    return rt;
fail:
    gw_rt_destroy(rt);
    return NULL;
}

gw_rt_t *gw_rt_ref(gw_rt_t *rt)
{
    atomic_fetch_add_explicit(&rt->refs, 1, memory_order_relaxed);
    return rt;
}

void gw_rt_unref(gw_rt_t *rt)
{
    if (rt && atomic_fetch_sub_explicit(&rt->refs, 1, memory_order_acq_rel) == 1)
        gw_rt_destroy(rt);
}

const char *gw_rt_v1_rest(const char *target, size_t len)
{
    return GW_PREFIX(target, len, "/v1/") ? target + 3 : NULL;
}

const gw_model_rt_t *gw_rt_model(const gw_rt_t *rt, const char *name, size_t len)
{
    for (size_t i = 0; i < rt->nmodels; i++)
        if (rt->models[i].name_len == len && memcmp(rt->models[i].name, name, len) == 0)
            return &rt->models[i];
    return NULL;
}
