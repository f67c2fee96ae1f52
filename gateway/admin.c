/*
 * admin.c — what an operator's browser or script asks the admin listener:
 * GET /admin/state, a JSON snapshot of the live runtime (pools, servers,
 * breakers, the queue, the limiter, the engines, reloads; the schema is
 * docs/metrics.md's), and GET /, the embedded status page that polls it.
 * Both run on the main thread, built at request time (nothing cached).
 */
#include <stdlib.h>
#include <string.h>

#include "common/status_page.h"
#include "common/version.h"
#include "fallback/fallback.h"
#include "gateway/gw_admin.h"
#include "gateway/gw_llm.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_req.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_server.h"
#include "gateway/gw_sup.h"
#include "model/model.h"
#include "ratelimit/ratelimit.h"

/* Engine tokens/s over the last 10 s, from the engine's running total
 * sampled at each /admin/state (main thread only; a page polls every 2 s).
 * A few engines at most: a small fixed table, the oldest slot reused. */
#define GW_ADMIN_TPS_ENGINES 8
#define GW_ADMIN_TPS_SAMPLES 16
static struct gw_admin_tps {
    const void *engine;
    int64_t t_ms[GW_ADMIN_TPS_SAMPLES];
    uint64_t tokens[GW_ADMIN_TPS_SAMPLES];
    size_t n, next;
    int64_t used_ms;
} gw_admin_tps[GW_ADMIN_TPS_ENGINES];

static double gw_admin_tokens_per_second(const void *engine, uint64_t tokens, int64_t now)
{
    struct gw_admin_tps *e = NULL, *oldest = &gw_admin_tps[0];
    for (size_t i = 0; i < GW_ADMIN_TPS_ENGINES && !e; i++) {
        if (gw_admin_tps[i].engine == engine)
            e = &gw_admin_tps[i];
        else if (gw_admin_tps[i].used_ms < oldest->used_ms)
            oldest = &gw_admin_tps[i];
    }
    if (!e) {
        e = oldest;
        memset(e, 0, sizeof(*e));
        e->engine = engine;
    }
    e->used_ms = now;
    e->t_ms[e->next] = now;
    e->tokens[e->next] = tokens;
    e->next = (e->next + 1) % GW_ADMIN_TPS_SAMPLES;
    if (e->n < GW_ADMIN_TPS_SAMPLES)
        e->n++;
    /* the oldest sample still inside the window */
    size_t first = (e->next + GW_ADMIN_TPS_SAMPLES - e->n) % GW_ADMIN_TPS_SAMPLES;
    for (size_t k = 0; k < e->n; k++) {
        size_t i = (first + k) % GW_ADMIN_TPS_SAMPLES;
        if (now - e->t_ms[i] <= 10000) {
            if (now == e->t_ms[i] || tokens < e->tokens[i])
                return 0.0;
            return (double)(tokens - e->tokens[i]) * 1e3 / (double)(now - e->t_ms[i]);
        }
    }
    return 0.0;
}

static json_t *gw_admin_time(double t)
{
    return t > 0 ? json_real(t) : json_null();
}

static json_t *gw_admin_server(const gw_pool_rt_t *p, gw_srv_rt_t *s, int64_t now)
{
    fb_circuit_state_t st = fb_breaker_state(s->breaker, now);
    json_t *breaker =
        json_pack("{s:s,s:f,s:i}", "state", fb_circuit_state_name(st), "open_remaining_seconds",
                  (double)fb_breaker_open_remaining_ms(s->breaker, now) / 1e3,
                  "consecutive_failures", fb_breaker_failures(s->breaker));
    /* Both counts are kept across workers as atomics (the pools
     * themselves belong to each worker's loop). */
    json_t *conns =
        json_pack("{s:i,s:i}", "active", atomic_load(&s->active), "idle", atomic_load(&s->idle));
    json_t *sup = p->sup ? json_pack("{s:b,s:I}", "up", gw_sup_healthy(p->sup), "restarts",
                                     (json_int_t)gw_sup_restarts(p->sup))
                         : json_null();
    return json_pack("{s:s,s:i,s:b,s:o,s:o,s:o}", "url", s->url, "weight", s->weight, "in_service",
                     gw_llm_server_in_service(p, s, now), "breaker", breaker, "connections", conns,
                     "supervised", sup);
}

static json_t *gw_admin_pool(const gw_pool_rt_t *p, int64_t now)
{
    json_t *servers = json_array();
    int in = 0;
    for (size_t k = 0; k < p->nservers; k++) {
        in += gw_llm_server_in_service(p, p->servers[k], now);
        json_array_append_new(servers, gw_admin_server(p, p->servers[k], now));
    }
    json_t *o = json_pack("{s:s,s:s}", "name", p->name, "kind", p->engine ? "engine" : "servers");
    if (p->engine) {
        mdl_engine_info_t info;
        mdl_engine_info(p->engine, &info);
        json_object_set_new(o, "servers_total", json_integer(1));
        json_object_set_new(o, "servers_in_service", json_integer(mdl_engine_ready(p->engine)));
        json_object_set_new(o, "servers", servers);
        json_object_set_new(
            o, "engine",
            json_pack("{s:i,s:i,s:i,s:f}", "queue", info.queued, "busy", info.running, "threads",
                      info.threads, "tokens_per_second",
                      gw_admin_tokens_per_second(p->engine, info.tokens_generated, now)));
        return o;
    }
    json_object_set_new(
        o, "balance",
        json_string(p->conf->balance == CONF_BALANCE_LEAST_CONN ? "least_conn" : "round_robin"));
    json_object_set_new(o, "servers_total", json_integer((json_int_t)p->nservers));
    json_object_set_new(o, "servers_in_service", json_integer(in));
    json_object_set_new(o, "servers", servers);
    return o;
}

static json_t *gw_admin_state(gw_server_t *srv, const gw_rt_t *rt)
{
    int64_t now = sl_now_ms();
    double wall = (double)sl_wall_ms() / 1e3;
    const gw_reload_state_t *rs = &gw_reload_state;
    json_t *reload =
        json_pack("{s:I,s:o,s:f,s:s,s:o}", "generation", (json_int_t)rs->generation, "last_time",
                  gw_admin_time(rs->last_time), "last_success_time", rs->last_success,
                  "last_result", rs->last_ok ? "ok" : "error", "last_error",
                  rs->last_error[0] ? json_string(rs->last_error) : json_null());
    json_t *pools = json_array();
    for (size_t i = 0; i < rt->npools; i++)
        json_array_append_new(pools, gw_admin_pool(&rt->pools[i], now));
    json_t *models = json_array();
    for (size_t i = 0; i < rt->nmodels; i++) {
        const gw_model_rt_t *m = &rt->models[i];
        int q = m->conf->queue;
        bool queued = srv->queue && (q == CONF_QUEUE_INHERIT ? rt->conf->fallback.queue.enabled
                                                             : q != CONF_QUEUE_OFF);
        json_array_append_new(
            models,
            json_pack("{s:s,s:s,s:o,s:b}", "name", m->name, "upstream", m->pool->name, "local",
                      rt->local ? json_string(rt->local->name) : json_null(), "queue", queued));
    }
    json_t *o = json_pack("{s:s,s:s,s:f,s:f,s:f,s:b,s:o,s:o,s:o}", "object", "sluice.state",
                          "version", sl_version(), "now", wall, "uptime_seconds",
                          (double)(sl_now_ns() - rs->started_ns) / 1e9, "started_time",
                          rs->started_time, "draining", atomic_load(&srv->draining), "reload",
                          reload, "pools", pools, "models", models);
    if (srv->queue) {
        fb_qstats_t qs;
        fb_queue_stats(srv->queue, &qs);
        double oldest = qs.oldest_pending_ms > 0 && qs.pending > 0
                            ? (double)(sl_wall_ms() - qs.oldest_pending_ms) / 1e3
                            : 0.0;
        bool redis =
            rt->conf->fallback.queue.store == CONF_QUEUE_STORE_REDIS ||
            (rt->conf->fallback.queue.store == CONF_QUEUE_STORE_AUTO && rt->conf->redis.url);
        json_object_set_new(o, "queue",
                            json_pack("{s:s,s:I,s:f,s:I,s:I,s:I}", "store",
                                      redis ? "redis" : "journal", "depth", (json_int_t)qs.pending,
                                      "oldest_pending_seconds", oldest < 0 ? 0.0 : oldest,
                                      "accepted", (json_int_t)qs.accepted, "delivered",
                                      (json_int_t)qs.delivered, "dead", (json_int_t)qs.dead));
    }
    if (srv->rl) {
        const char *store = rt->conf->redis.url ? "redis" : "memory";
        json_object_set_new(o, "ratelimit",
                            json_pack("{s:s,s:s,s:I}", "store", store, "mode", store,
                                      "keys_tracked", (json_int_t)rl_mem_keys(srv->rl)));
    }
    return o;
}

void gw_admin_state_route(gw_req_t *r)
{
    gw_server_t *srv = r->c->w->srv;
    json_t *o = gw_admin_state(srv, r->rt);
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(15)) : NULL;
    json_decref(o);
    if (!s) {
        gw_respond_oom(r);
        return;
    }
    gw_respond_json(r, 200, s, strlen(s), "Cache-Control: no-store\r\n");
    free(s);
}

void gw_admin_status_page_route(gw_req_t *r)
{
    gw_respond_body(r, 200, "text/html; charset=utf-8", (const char *)sl_status_page,
                    sl_status_page_len, "Cache-Control: no-store\r\n");
}
