/*
 * hook_cache.c — the response-cache adapter (cache/, docs/cache.md): last
 * in the chain, so auth, input filters and rate limits have run (a hit
 * still counts as a request) and the key is taken on the body as it would
 * be forwarded.
 *
 *   on_request   the policy and the key (cache_req_new), the exact lookup
 *                (in-process: at once; Redis: PENDING, resumed in
 *                gw_cache_looked_up); a hit is answered here, in the shape
 *                the client asked for;
 *   on_answer    the answer as the model sent it (before output filters
 *                and the limiter's usage strip) goes to the recorder;
 *   on_headers   X-Sluice-Cache: hit | miss | bypass, and Age on a hit;
 *   on_end       what was not the model's own clean answer is tainted, the
 *                rest stored (fire and forget).
 *
 * A hit is sent pre-rendered when no other hook looks at the answer; else
 * it goes through the same paths as an in-process answer
 * (gw_proxy_local_*), so output filters run on the replayed text and the
 * token budget is charged the stored usage when cache.charge_tokens says
 * so.
 *
 * The semantic lookup, after an exact miss for a model with it on: one POST
 * /v1/embeddings to cache.semantic.embed_model's pool on the gateway's own
 * upstream connections (keep-alive, breakers), within
 * cache.semantic.deadline; anything but a usable 200 in time and the
 * request simply goes upstream.
 */
#include <stdio.h>
#include <string.h>

#include "cache/cache.h"
#include "common/log.h"
#include "fallback/fallback.h"
#include "gateway/gw_flow.h"
#include "gateway/gw_conn.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_proxy.h"
#include "gateway/gw_req.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_types.h"
#include "gateway/gw_upstream.h"
#include "gateway/gw_worker.h"
#include "gateway/http1.h"

/* An embeddings answer is a few KB (a vector of floats as text). */
#define GW_CACHE_EMBED_MAX (1u << 20)

/* Process-wide: the stores and the semantic index outlive reloads (sizes
 * need a restart; policies come from each request's conf). */
static cache_t *gw_cache;

/* rt->hook_state[i] when some model of that conf caches: chat answers then
 * carry X-Sluice-Cache even when they bypass. */
static char gw_cache_on_marker;

typedef struct gw_cache_req {
    gw_req_t *r;
    cache_req_t *q;
    bool pending; /* a Redis lookup is out */
    bool hit;     /* answered from the cache: record nothing */
    bool sem_tried;
    /* the embeddings call */
    gw_srv_rt_t *srv;
    int admit;
    gw_upconn_t *up;
    struct event *timer;
    struct evbuffer *answer;
} gw_cache_req_t;

static gw_hook_rc_t gw_cache_after_lookup(gw_cache_req_t *s, bool async);
static void gw_cache_looked_up(void *arg, cache_req_t *q);

static int gw_cache_slot(void)
{
    return gw_hook_index(&gw_hook_cache);
}

static cache_worker_t *gw_cache_worker(gw_req_t *r)
{
    return r->c->w->hook_state[gw_cache_slot()];
}

/* Whether another hook reads the answer (filters, token budgets): then a
 * hit goes through them instead of out as stored. */
static bool gw_cache_others_look(const gw_req_t *r, bool stream)
{
    int self = gw_cache_slot();
    for (size_t i = 0; i < gw_nhooks; i++) {
        const gw_hook_t *hk = gw_hooks[i];
        if ((int)i == self || !(r->hooks.ran & (1u << i)) || !r->hooks.state[i])
            continue;
        if (stream && hk->on_event)
            return true;
        if (!stream && hk->on_body && (!hk->wants_body || hk->wants_body(r, r->hooks.state[i])))
            return true;
    }
    return false;
}

static int gw_cache_emit(void *arg, const char *data, size_t len)
{
    return gw_proxy_local_stream_event(arg, data, len);
}

/* Answers r from the hit. r (and s) may be gone when this returns. */
static void gw_cache_answer(gw_cache_req_t *s)
{
    gw_req_t *r = s->r;
    cache_req_t *q = s->q;
    const cache_entry_t *e = cache_req_entry(q);
    bool stream = cache_req_stream(q), usage = cache_req_include_usage(q);
    s->hit = true;
    r->error_kind = NULL;
    if (cache_req_charge_tokens(q)) {
        /* The limiter settles a ticket with the answer's usage only when an
         * answer was produced; a hit's is the stored one. */
        r->att.t_sent_ns = r->att.t_first_byte_ns = sl_now_ns();
    }
    if (!gw_cache_others_look(r, stream)) {
        size_t len = 0;
        const char *body = cache_entry_rendered(e, stream, usage, &len);
        if (body) {
            gw_proxy_local_answer(r, stream ? "text/event-stream" : "application/json", body, len,
                                  "");
            return;
        }
    }
    cache_replay_opts_t o = {.include_usage = usage};
    if (stream) {
        gw_proxy_local_stream_begin(r);
        (void)cache_entry_sse(e, &o, gw_cache_emit, r);
        gw_proxy_local_stream_end(r, NULL, NULL);
        return;
    }
    json_t *j = cache_entry_json(e, &o);
    if (!j) {
        gw_respond_oom(r);
        return;
    }
    gw_proxy_local_body(r, j);
    json_decref(j);
}

/* ---- the embeddings call ------------------------------------------------- */

/* Ends the call: the connection back to its pool (or closed), the breaker
 * told (outcome 1 ok, 0 failed, -1 neither: our deadline or the client
 * left), the timer stopped. */
static void gw_cache_embed_end(gw_cache_req_t *s, int outcome, bool reusable)
{
    if (s->timer)
        evtimer_del(s->timer);
    if (s->srv && s->admit != FB_ADMIT_NO) {
        if (outcome >= 0)
            fb_breaker_report(s->srv->breaker, (fb_admit_t)s->admit, outcome == 1, sl_now_ms());
        else
            fb_breaker_cancel(s->srv->breaker, (fb_admit_t)s->admit);
        s->admit = FB_ADMIT_NO;
    }
    if (s->up) {
        gw_upconn_t *u = s->up;
        s->up = NULL;
        gw_upstream_release(u, reusable);
    }
}

static void gw_cache_embed_free(gw_cache_req_t *s)
{
    gw_cache_embed_end(s, -1, false);
    if (s->timer)
        event_free(s->timer);
    s->timer = NULL;
    if (s->answer)
        evbuffer_free(s->answer);
    s->answer = NULL;
}

/* The call is over (ok: a 200 with its body in s->answer): look the vector
 * up, or go upstream. The hook is pending throughout. */
static void gw_cache_embed_done(gw_cache_req_t *s, bool ok)
{
    if (ok) {
        size_t len = evbuffer_get_length(s->answer);
        ok = cache_req_embed_answer(s->q, (const char *)evbuffer_pullup(s->answer, -1), len) == 0;
    }
    if (!ok) {
        gw_hook_resume(s->r, GW_HOOK_NEXT);
        return;
    }
    switch (cache_lookup(gw_cache_worker(s->r), s->q, sl_wall_ms(), gw_cache_looked_up, s)) {
    case CACHE_PENDING:
        s->pending = true;
        return;
    case CACHE_DONE:
        (void)gw_cache_after_lookup(s, true);
        return;
    default:
        gw_hook_resume(s->r, GW_HOOK_NEXT);
    }
}

static int gw_cache_embed_body_cb(void *arg, const char *p, size_t n)
{
    gw_cache_req_t *s = arg;
    if (evbuffer_get_length(s->answer) + n > GW_CACHE_EMBED_MAX)
        return -1;
    return evbuffer_add(s->answer, p, n);
}

/* Reads the answer; false when the call ended (s may be gone then). */
static bool gw_cache_embed_read(gw_cache_req_t *s)
{
    gw_upconn_t *u = s->up;
    struct evbuffer *in = bufferevent_get_input(u->bev);
    for (;;) {
        gw_http_state_t st = gw_http_feed_evbuffer(u->parser, in, NULL, gw_cache_embed_body_cb, s);
        if (st == GW_HTTP_NEED_MORE)
            return true;
        if (st == GW_HTTP_HEAD)
            continue;
        if (st == GW_HTTP_DONE) {
            const gw_http_msg_t *m = gw_http_msg(u->parser);
            int status = m->status;
            gw_cache_embed_end(s, status < 500, m->keep_alive);
            gw_cache_embed_done(s, status == 200);
            return false;
        }
        gw_cache_embed_end(s, 0, false);
        gw_cache_embed_done(s, false);
        return false;
    }
}

static void gw_cache_embed_on_read(void *owner)
{
    (void)gw_cache_embed_read(owner);
}

static void gw_cache_embed_on_event(void *owner, short what)
{
    gw_cache_req_t *s = owner;
    if (what & BEV_EVENT_CONNECTED)
        return;
    if ((what & BEV_EVENT_EOF) && !gw_cache_embed_read(s))
        return;
    gw_cache_embed_end(s, 0, false);
    gw_cache_embed_done(s, false);
}

/* Past cache.semantic.deadline: the request goes upstream. The server is
 * not blamed: the deadline is ours, far below any upstream timeout. */
static void gw_cache_embed_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_cache_req_t *s = arg;
    gw_cache_embed_end(s, -1, false);
    gw_cache_embed_done(s, false);
}

/* Starts the embeddings call: true when it is out (the hook waits). */
static bool gw_cache_embed_start(gw_cache_req_t *s)
{
    gw_req_t *r = s->r;
    gw_worker_t *w = r->c->w;
    const char *name = cache_req_embed_model(s->q);
    const gw_model_rt_t *m = name ? gw_rt_model(r->rt, name, strlen(name)) : NULL;
    if (!m || !m->pool || m->pool->engine)
        return false;
    size_t blen = 0;
    char *body = cache_req_embed_body(s->q, &blen);
    if (!body)
        return false;
    if (m->alias) { /* the upstream knows the model by its served name */
        json_t *j = json_loadb(body, blen, 0, NULL);
        free(body);
        body = NULL;
        if (j && json_object_set_new(j, "model", json_string(m->served)) == 0)
            body = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        if (!body)
            return false;
        blen = strlen(body);
    }
    s->admit = FB_ADMIT_NO;
    if (!s->answer)
        s->answer = evbuffer_new();
    if (!s->timer)
        s->timer = evtimer_new(w->base, gw_cache_embed_timeout, s);
    s->srv =
        s->answer && s->timer ? gw_upstream_pick(w, m->pool, NULL, sl_now_ms(), &s->admit) : NULL;
    s->up = s->srv ? gw_upstream_get(w, s->srv, true) : NULL;
    if (!s->up) {
        if (s->srv)
            fb_breaker_cancel(s->srv->breaker, (fb_admit_t)s->admit);
        s->admit = FB_ADMIT_NO;
        free(body);
        return false;
    }
    s->up->owner = s;
    s->up->on_read = gw_cache_embed_on_read;
    s->up->on_event = gw_cache_embed_on_event;
    struct evbuffer *out = bufferevent_get_output(s->up->bev);
    evbuffer_add_printf(out,
                        "POST /v1/embeddings HTTP/1.1\r\nHost: %s\r\n"
                        "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                        "X-Request-Id: %s\r\n",
                        s->srv->host_header, blen, r->id);
    if (m->pool->auth_header)
        evbuffer_add(out, m->pool->auth_header, m->pool->auth_header_len);
    evbuffer_add(out, GW_LIT("\r\n"));
    evbuffer_add(out, body, blen);
    gw_wio_added(&s->up->wio);
    free(body);
    int64_t ms = cache_req_embed_deadline_ms(s->q);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(s->timer, &tv);
    gw_upstream_arm(s->up);
    return true;
}

/* ---- lookups ---------------------------------------------------------------- */

/* A lookup answered. async: we are in a callback while the hook waits, so
 * the chain must be resumed. Returns what on_request returns. */
static gw_hook_rc_t gw_cache_after_lookup(gw_cache_req_t *s, bool async)
{
    gw_req_t *r = s->r;
    if (cache_req_state(s->q) == CACHE_HIT) {
        /* Answering ends the request: leave the chain first. */
        if (async)
            gw_hook_resume(r, GW_HOOK_DONE);
        gw_cache_answer(s);
        return GW_HOOK_DONE;
    }
    if (!s->sem_tried && cache_req_semantic(s->q)) {
        s->sem_tried = true;
        if (gw_cache_embed_start(s))
            return GW_HOOK_PENDING;
    }
    if (async)
        gw_hook_resume(r, GW_HOOK_NEXT);
    return GW_HOOK_NEXT;
}

static void gw_cache_looked_up(void *arg, cache_req_t *q)
{
    (void)q;
    gw_cache_req_t *s = arg;
    s->pending = false;
    (void)gw_cache_after_lookup(s, true);
}

static gw_hook_rc_t gw_cache_on_request(gw_req_t *r, void **state)
{
    int slot = gw_cache_slot();
    cache_worker_t *w = r->c->w->hook_state[slot];
    if (r->route != GW_ROUTE_CHAT || !w || !r->rt->hook_state[slot] || !r->model)
        return GW_HOOK_NEXT;
    const gw_http_msg_t *m = gw_http_msg(r->c->parser);
    const gw_http_header_t *cc = gw_http_header_find(m, "Cache-Control");
    /* Two client names for one model share answers; one name served by
     * two upstreams does not. */
    char key_model[512];
    snprintf(key_model, sizeof(key_model), "%s/%s", r->model->pool ? r->model->pool->name : "",
             r->model->served ? r->model->served : r->model->name);
    char ccv[256] = "";
    if (cc)
        snprintf(ccv, sizeof(ccv), "%.*s", (int)SL_MIN(cc->value_len, sizeof(ccv) - 1), cc->value);
    cache_req_in_t in = {
        .conf = r->rt->conf,
        .body = gw_req_json(r),
        .model = r->model->name,
        .key_model = key_model,
        .sub = gw_req_user(r)[0] ? gw_req_user(r) : NULL,
        .cache_control = cc ? ccv : NULL,
    };
    cache_req_t *q = cache_req_new(gw_cache, &in);
    if (!q)
        return GW_HOOK_NEXT; /* out of memory: the cache simply stays out of it */
    if (cache_req_state(q) == CACHE_BYPASS && !cache_req_storing(q)) {
        cache_req_free(q); /* nothing to record: events are relayed untouched */
        return GW_HOOK_NEXT;
    }
    gw_cache_req_t *s = sl_zalloc(sizeof(*s));
    if (!s) {
        cache_req_free(q);
        return GW_HOOK_NEXT;
    }
    s->r = r;
    s->q = q;
    *state = s;
    if (cache_req_state(q) == CACHE_BYPASS)
        return GW_HOOK_NEXT; /* no-cache: the fresh answer is stored */
    switch (cache_lookup(w, q, sl_wall_ms(), gw_cache_looked_up, s)) {
    case CACHE_PENDING:
        s->pending = true;
        return GW_HOOK_PENDING;
    case CACHE_DONE:
        return gw_cache_after_lookup(s, false);
    default:
        return GW_HOOK_NEXT; /* out of memory: a miss */
    }
}

static void gw_cache_on_cancel(gw_req_t *r, void *state)
{
    (void)r;
    gw_cache_req_t *s = state;
    if (!s)
        return;
    if (s->pending) {
        cache_lookup_cancel(s->q);
        s->pending = false;
    }
    gw_cache_embed_end(s, -1, false);
}

static void gw_cache_on_headers(gw_req_t *r, void *state, gw_sb_t *head)
{
    gw_cache_req_t *s = state;
    if (!s) {
        int slot = gw_cache_slot();
        if (r->route == GW_ROUTE_CHAT && r->rt->hook_state[slot] && r->c->w->hook_state[slot])
            gw_sb_lit(head, "X-Sluice-Cache: bypass\r\n");
        return;
    }
    gw_sb_lit(head, "X-Sluice-Cache: ");
    gw_sb_str(head, cache_req_header(s->q));
    gw_sb_lit(head, "\r\n");
    if (s->hit) {
        char age[40];
        int n = snprintf(age, sizeof(age), "Age: %lld\r\n",
                         (long long)cache_req_age_s(s->q, sl_wall_ms()));
        gw_sb_add(head, age, (size_t)n);
    }
}

static void gw_cache_on_answer(gw_req_t *r, void *state, const char *data, size_t len,
                               const json_t *body)
{
    (void)r;
    gw_cache_req_t *s = state;
    if (s->hit || !cache_req_storing(s->q))
        return;
    if (body)
        cache_req_record_body(s->q, body);
    else
        cache_req_record_event(s->q, data, len);
}

static bool gw_cache_wants_body(const gw_req_t *r, void *state)
{
    (void)r;
    const gw_cache_req_t *s = state;
    return !s->hit && cache_req_storing(s->q);
}

/* Why an answer that reached the client is not the model's own clean one. */
static unsigned gw_cache_taints(const gw_req_t *r)
{
    unsigned t = 0;
    if (r->fallback || r->routed_local)
        t |= CACHE_TAINT_FALLBACK;
    if (r->status < 200 || r->status >= 300 || r->att.upstatus < 200 || r->att.upstatus >= 300)
        t |= CACHE_TAINT_ERROR;
    if (r->error_kind) {
        if (strcmp(r->error_kind, "content_filter") == 0 ||
            strcmp(r->error_kind, "stopped_by_hook") == 0)
            t |= CACHE_TAINT_FILTERED;
        else if (strstr(r->error_kind, "truncated") || strstr(r->error_kind, "timeout"))
            t |= CACHE_TAINT_TRUNCATED;
        else
            t |= CACHE_TAINT_ERROR;
    }
    return t;
}

static void gw_cache_on_end(gw_req_t *r, void *state, gw_end_t how)
{
    gw_cache_req_t *s = state;
    if (!s)
        return;
    gw_cache_on_cancel(r, s);
    if (how == GW_END_DONE && !s->hit && cache_req_storing(s->q)) {
        unsigned t = gw_cache_taints(r);
        if (t)
            cache_req_taint(s->q, t);
        (void)cache_store(gw_cache_worker(r), s->q, sl_wall_ms());
    }
    gw_cache_embed_free(s);
    cache_req_free(s->q);
    free(s);
}

/* ---- lifecycle ------------------------------------------------------------ */

static bool gw_cache_any(const conf_t *c)
{
    if (c->cache.enabled)
        return true;
    for (size_t i = 0; i < c->nmodels; i++)
        if (c->models[i].cache.enabled == CONF_CACHE_ON)
            return true;
    return false;
}

/* What cache_new checks at start, for -t and reloads too. */
static int gw_cache_check(const conf_t *c, char *err, size_t errlen)
{
    const char *em = c->cache.semantic.embed_model;
    if (!em || conf_model_find(c, em))
        return 0;
    snprintf(err, errlen, "%s: cache.semantic.embed_model: no model named \"%s\" under models",
             c->path ? c->path : "conf", em);
    return -1;
}

static int gw_cache_rt_build(gw_rt_t *rt, gw_shared_t *sh, char *err, size_t errlen)
{
    (void)sh;
    (void)err;
    (void)errlen;
    bool any = gw_cache_any(rt->conf);
    rt->hook_state[gw_cache_slot()] = any ? &gw_cache_on_marker : NULL;
    if (any && !gw_cache && rt->generation > 1)
        sl_warn("cache: turned on by a reload: it starts with the next restart");
    return 0;
}

static int gw_cache_process_init(gw_server_t *s, const conf_t *c, char *err, size_t errlen)
{
    (void)s;
    if (!gw_cache_any(c))
        return 0; /* no store, no Redis client: turning the cache on needs a restart */
    gw_cache = cache_new(c, err, errlen);
    return gw_cache ? 0 : -1;
}

static void gw_cache_process_fini(gw_server_t *s)
{
    (void)s;
    cache_free(gw_cache);
    gw_cache = NULL;
}

/* The request workers' handles (the admin listener serves no chat). */
static int gw_cache_worker_init(gw_worker_t *w)
{
    if (w->is_main || !gw_cache)
        return 0;
    char err[256];
    cache_worker_t *cw = cache_worker_new(gw_cache, w->base, err, sizeof(err));
    if (!cw) {
        sl_error("worker %d: cache: %s", w->id, err);
        return -1;
    }
    w->hook_state[gw_cache_slot()] = cw;
    return 0;
}

static void gw_cache_worker_fini(gw_worker_t *w)
{
    int slot = gw_cache_slot();
    cache_worker_free(w->hook_state[slot]);
    w->hook_state[slot] = NULL;
}

const gw_hook_t gw_hook_cache = {
    .name = "cache",
    .check = gw_cache_check,
    .rt_build = gw_cache_rt_build,
    .process_init = gw_cache_process_init,
    .process_fini = gw_cache_process_fini,
    .worker_init = gw_cache_worker_init,
    .worker_fini = gw_cache_worker_fini,
    .on_request = gw_cache_on_request,
    .on_cancel = gw_cache_on_cancel,
    .on_headers = gw_cache_on_headers,
    .on_answer = gw_cache_on_answer,
    .wants_body = gw_cache_wants_body,
    .on_end = gw_cache_on_end,
};
