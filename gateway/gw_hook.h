/*
 * gw_hook.h — the hook chain: how the request path calls the policy modules
 * (auth/, ratelimit/, filters/, fallback/) without an `if` per module in
 * the proxy. Each module has one adapter file in gateway/ (hook_*.c) that
 * fills a gw_hook_t with the callbacks it needs; all are optional.
 *
 * Order of a proxied request:
 *   pre-route hooks' on_request    (auth: before the body is even parsed)
 *   body parsed as JSON, model routed
 *   post-route hooks' on_request   (filters, rate limits, idempotency)
 *   upstream request
 *   on_headers                     (extra response headers)
 *   on_event per SSE event, or on_body for a whole JSON answer
 *   on_end, exactly once for every hook whose on_request ran
 *
 * on_request may answer at once (GW_HOOK_DONE: it called gw_respond_*),
 * or go asynchronous (GW_HOOK_PENDING: it later calls gw_hook_resume() on
 * the same worker thread; if the client leaves meanwhile, on_cancel runs
 * instead and the resume must not happen).
 *
 * Events: a hook sees an event's data payload (the JSON after "data: ", or
 * "[DONE]") and answers PASS (unchanged), REPLACE (the payloads it pushed
 * go out instead; none = drop it) or STOP (the payloads it pushed go out,
 * then the stream ends and the upstream request is cancelled). When no
 * active hook has on_event, events are relayed untouched, with no copy.
 */
#ifndef GW_HOOK_H
#define GW_HOOK_H

#include <stdbool.h>
#include <stddef.h>

#include <event2/buffer.h>
#include <jansson.h>

typedef struct gw_req gw_req_t;

typedef enum gw_hook_rc {
    GW_HOOK_NEXT = 0, /* go on with the next hook */
    GW_HOOK_DONE,     /* the hook answered the request */
    GW_HOOK_PENDING,  /* it will call gw_hook_resume() */
} gw_hook_rc_t;

typedef enum gw_ev_rc {
    GW_EV_PASS = 0,
    GW_EV_REPLACE,
    GW_EV_STOP,
} gw_ev_rc_t;

/* Payloads a hook emits; each is malloc'd and owned by the list. */
typedef struct gw_payloads {
    char **data;
    size_t *len;
    size_t n, cap;
} gw_payloads_t;

/* Takes ownership of data (malloc'd). -1 on OOM (data is freed). */
int gw_payloads_push(gw_payloads_t *p, char *data, size_t len);
/* Copies data. */
int gw_payloads_push_copy(gw_payloads_t *p, const char *data, size_t len);
void gw_payloads_clear(gw_payloads_t *p);

typedef enum gw_end {
    GW_END_DONE = 0, /* a response was completed (any status) */
    GW_END_ABORTED,  /* the client left before the end */
} gw_end_t;

typedef struct gw_hook {
    const char *name;
    bool pre_route;
    gw_hook_rc_t (*on_request)(gw_req_t *r, void **state);
    void (*on_cancel)(gw_req_t *r, void *state);
    void (*on_headers)(gw_req_t *r, void *state, struct evbuffer *out);
    gw_ev_rc_t (*on_event)(gw_req_t *r, void *state, const char *data, size_t len,
                           gw_payloads_t *out);
    /* A whole JSON answer (2xx, application/json). May edit it and set
     * *modified. Non-zero = fail the request (502). */
    int (*on_body)(gw_req_t *r, void *state, json_t *body, bool *modified);
    /* Whether on_body is needed for this request (NULL: whenever there is
     * state). Gathering and parsing an answer is not free. */
    bool (*wants_body)(const gw_req_t *r, void *state);
    void (*on_end)(gw_req_t *r, void *state, gw_end_t how);
} gw_hook_t;

#define GW_MAX_HOOKS 8

/* Per-request hook bookkeeping (embedded in gw_req_t). */
typedef struct gw_hooks_req {
    void *state[GW_MAX_HOOKS];
    unsigned ran;  /* bit i: hook i's on_request ran (on_end owed) */
    unsigned next; /* the hook to run next */
    int pending;   /* index of the hook we wait for, or -1 */
    bool pre_done; /* the pre-route hooks are through */
    bool ended;    /* on_end ran */
} gw_hooks_req_t;

/* The hooks compiled in, in order. */
extern const gw_hook_t *const gw_hooks[];
extern const size_t gw_nhooks;

/* Runs the pre- or post-route hooks from where the chain stands. Returns
 * NEXT when all passed, DONE when one answered, PENDING when one waits. */
gw_hook_rc_t gw_hooks_run(gw_req_t *r, bool pre_route);
/* A pending hook is done: rc is NEXT (go on) or DONE (it answered). */
void gw_hook_resume(gw_req_t *r, gw_hook_rc_t rc);
/* The client left: cancel a pending hook. */
void gw_hooks_cancel(gw_req_t *r);
void gw_hooks_headers(gw_req_t *r, struct evbuffer *out);
/* True when some active hook filters events / wants whole JSON bodies. */
bool gw_hooks_want_events(const gw_req_t *r);
bool gw_hooks_want_body(const gw_req_t *r);
/* One event's data through the chain; out gets what to send. */
gw_ev_rc_t gw_hooks_event(gw_req_t *r, const char *data, size_t len, gw_payloads_t *out);
int gw_hooks_body(gw_req_t *r, json_t *body, bool *modified);
void gw_hooks_end(gw_req_t *r, gw_end_t how);

/* The adapters. */
extern const gw_hook_t gw_hook_auth;
extern const gw_hook_t gw_hook_filters;
extern const gw_hook_t gw_hook_ratelimit;
extern const gw_hook_t gw_hook_fallback;

/* What the adapters offer besides their hooks: handlers the route table
 * points at, and helpers other adapters share. */
struct rl_decision;
/* hook_ratelimit.c: fills r->client_ip (X-Forwarded-For from trusted proxies). */
void gw_rl_client_ip(gw_req_t *r);
/* hook_ratelimit.c: the 429 (or 503 when the store is down) for a refused
 * decision, with Retry-After and X-RateLimit-*. */
void gw_rl_respond_refusal(gw_req_t *r, const struct rl_decision *d);
/* hook_auth.c: the token endpoint and the admin revoke endpoint. */
void gw_auth_token_route(gw_req_t *r);
void gw_auth_token_cancel(gw_req_t *r);
void gw_auth_revoke_route(gw_req_t *r);
void gw_auth_revoke_cancel(gw_req_t *r);

#endif
