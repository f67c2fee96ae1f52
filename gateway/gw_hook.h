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
 * Besides the request, a hook has a whole lifecycle (all optional, HAProxy's
 * flt_ops is the model), so that the process, the worker and the runtime
 * loop over the table instead of naming modules:
 *   check          the conf, before a runtime is built (start, -t, reload)
 *   rt_build/rt_free      its compiled state in each runtime (gw_rt_t)
 *   process_init/_fini    process-wide state that outlives reloads
 *   worker_init/_fini     per-thread handles, on every worker thread
 *   worker_tick    each worker tick, on its thread (per-thread caches)
 *   process_stop   the workers stopped; end the hook's own threads
 *   tick           once a second on the main thread
 *   metrics        before /metrics is rendered (refresh gauges)
 * A failing _init or _build fills err and returns -1; _fini and _free are
 * called for every hook, built or not, so they must be NULL-safe.
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

#include "conf/conf.h"
#include "gateway/gw_types.h"
#include "gateway/sb.h"

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

/* Payloads a hook emits; each is malloc'd and owned by the list. The first
 * GW_PAYLOADS_INLINE live in the list itself: an event's one payload (two
 * when a [DONE] flushes held text) costs no list allocation (issue #16,
 * full-sse). No pointer into the list itself, so a list may be copied by
 * value (moved); read entries with gw_payloads_at(). */
#define GW_PAYLOADS_INLINE 4
typedef struct gw_payload {
    char *data;
    size_t len;
} gw_payload_t;

typedef struct gw_payloads {
    gw_payload_t in[GW_PAYLOADS_INLINE]; /* while n <= GW_PAYLOADS_INLINE */
    gw_payload_t *ext;                   /* all of them past that (cap entries) */
    size_t n, cap;
} gw_payloads_t;

/* An empty list (only the counters: the inline slots need no zeroing). */
static inline void gw_payloads_init(gw_payloads_t *p)
{
    p->ext = NULL;
    p->n = p->cap = 0;
}

/* Entry i (< n); borrowed, valid until the list changes. */
static inline gw_payload_t *gw_payloads_at(gw_payloads_t *p, size_t i)
{
    return &(p->ext ? p->ext : p->in)[i];
}

/* Takes ownership of data (malloc'd). -1 on OOM (data is freed). */
int gw_payloads_push(gw_payloads_t *p, char *data, size_t len);
/* Copies data. */
int gw_payloads_push_copy(gw_payloads_t *p, const char *data, size_t len);
/* Frees what the list holds and empties it. */
void gw_payloads_free(gw_payloads_t *p);
/* gw_payloads_free when anything was pushed: inline, since the hook chain
 * clears a few empty lists per hook and event (~9 calls a streamed event). */
static inline void gw_payloads_clear(gw_payloads_t *p)
{
    if (p->n || p->ext)
        gw_payloads_free(p);
}

typedef enum gw_end {
    GW_END_DONE = 0, /* a response was completed (any status) */
    GW_END_ABORTED,  /* the client left before the end */
} gw_end_t;

typedef struct gw_hook {
    const char *name; /* also the prefix of its lifecycle errors */
    /* lifecycle */
    int (*check)(const conf_t *c, char *err, size_t errlen);
    int (*rt_build)(gw_rt_t *rt, gw_shared_t *sh, char *err, size_t errlen);
    void (*rt_free)(gw_rt_t *rt);
    int (*process_init)(gw_server_t *s, const conf_t *c, char *err, size_t errlen);
    void (*process_stop)(gw_server_t *s);
    void (*process_fini)(gw_server_t *s);
    void (*tick)(gw_server_t *s);
    void (*metrics)(gw_server_t *s);
    /* The thread's own errors are logged by the hook; -1 stops the start. */
    int (*worker_init)(gw_worker_t *w);
    void (*worker_fini)(gw_worker_t *w);
    /* On the worker's thread, each tick of that worker: give back memory
     * kept for reuse (all: all of it, after a peak and as the thread ends). */
    void (*worker_tick)(gw_worker_t *w, bool all);
    /* the request */
    gw_hook_rc_t (*on_request)(gw_req_t *r, void **state);
    void (*on_cancel)(gw_req_t *r, void *state);
    /* Appends header lines ("Name: value\r\n") to the answer's head. */
    void (*on_headers)(gw_req_t *r, void *state, gw_sb_t *head);
    gw_ev_rc_t (*on_event)(gw_req_t *r, void *state, const char *data, size_t len,
                           gw_payloads_t *out);
    /* A whole JSON answer (2xx, application/json). May edit it and set
     * *modified. Non-zero = fail the request (502). */
    int (*on_body)(gw_req_t *r, void *state, json_t *body, bool *modified);
    /* The same on the answer's bytes, for a hook that can do without the
     * tree (parsing it is most of a filtered answer's cost): 0 done, *out
     * a new answer (malloc'd, taken over) or NULL for unchanged; 1 wants
     * the tree after all (nothing done yet: on_body runs instead); -1 fail
     * the request (502). Used only when every hook reading this answer has
     * one (gw_hooks_body_bytes). */
    int (*on_body_raw)(gw_req_t *r, void *state, const char *data, size_t len, char **out,
                       size_t *outlen);
    /* Whether on_body is needed for this request (NULL: whenever there is
     * state). Gathering and parsing an answer is not free. */
    bool (*wants_body)(const gw_req_t *r, void *state);
    /* Whether on_event can do anything for this request's stream (NULL:
     * whenever there is state). Asked once, when the streamed answer's head
     * came (all on_request done): a hook whose on_event would only PASS
     * is then left out of every event's dispatch. */
    bool (*wants_events)(const gw_req_t *r, void *state);
    /* Sees the answer as it came, before any hook's on_event / on_body
     * changed it (a recorder: the cache): each event's payload (body NULL)
     * or a whole JSON answer (data NULL). Read-only; wants_body gates it. */
    void (*on_answer)(gw_req_t *r, void *state, const char *data, size_t len, const json_t *body);
    void (*on_end)(gw_req_t *r, void *state, gw_end_t how);
} gw_hook_t;

/* The hook table: one line per policy module, in chain order, the
 * pre-route hooks first (hooks.c checks both at compile time). Each names
 * the gw_hook_<name> its adapter (hook_<name>.c) defines. */
#define GW_HOOK_PRE_ROUTE  1 /* before the body is parsed and routed */
#define GW_HOOK_POST_ROUTE 0
#define GW_HOOK_TABLE(X)                                                                           \
    X(auth, GW_HOOK_PRE_ROUTE)                                                                     \
    X(filters, GW_HOOK_POST_ROUTE)                                                                 \
    X(ratelimit, GW_HOOK_POST_ROUTE)                                                               \
    X(fallback, GW_HOOK_POST_ROUTE)                                                                \
    X(cache, GW_HOOK_POST_ROUTE)                                                                   \
    X(llm, GW_HOOK_POST_ROUTE)

#define GW_HOOK_EXTERN(name, when) extern const gw_hook_t gw_hook_##name;
GW_HOOK_TABLE(GW_HOOK_EXTERN)
#undef GW_HOOK_EXTERN

/* Per-request hook bookkeeping (embedded in gw_req_t). */
typedef struct gw_hooks_req {
    void *state[GW_MAX_HOOKS];
    unsigned ran; /* bit i: hook i's on_request ran (on_end owed) */
    /* The hooks an event goes through, in table order: those with state
     * whose on_answer runs (ans) and whose on_event is wanted (ev). Built
     * once per streamed answer (gw_hooks_events_begin), so a stream's
     * thousands of events visit only them (issue #16, full-sse). */
    unsigned char ev[GW_MAX_HOOKS], ans[GW_MAX_HOOKS];
    unsigned char nev, nans;
    unsigned next; /* the hook to run next */
    int pending;   /* index of the hook we wait for, or -1 */
    bool pre_done; /* the pre-route hooks are through */
    bool ended;    /* on_end ran */
} gw_hooks_req_t;

/* The hooks compiled in, in order, and which of them run before routing. */
extern const gw_hook_t *const gw_hooks[];
extern const bool gw_hook_pre_route[];
extern const size_t gw_nhooks;

/* h's place in the table: its slot in rt->hook_state[] and w->hook_state[]
 * (a new module keeps its state there, not in new fields). -1: not in it. */
int gw_hook_index(const gw_hook_t *h);

/* The lifecycle, over the table (forward; _fini/_free in reverse order). */
int gw_hooks_check(const conf_t *c, char *err, size_t errlen);
int gw_hooks_rt_build(gw_rt_t *rt, gw_shared_t *sh, char *err, size_t errlen);
void gw_hooks_rt_free(gw_rt_t *rt);
int gw_hooks_process_init(gw_server_t *s, const conf_t *c, char *err, size_t errlen);
void gw_hooks_process_stop(gw_server_t *s);
void gw_hooks_process_fini(gw_server_t *s);
void gw_hooks_tick(gw_server_t *s);
void gw_hooks_metrics(gw_server_t *s);
int gw_hooks_worker_init(gw_worker_t *w);
void gw_hooks_worker_fini(gw_worker_t *w);
void gw_hooks_worker_tick(gw_worker_t *w, bool all);

/* Runs the pre- or post-route hooks from where the chain stands. Returns
 * NEXT when all passed, DONE when one answered, PENDING when one waits. */
gw_hook_rc_t gw_hooks_run(gw_req_t *r, bool pre_route);
/* A pending hook is done: rc is NEXT (go on) or DONE (it answered). */
void gw_hook_resume(gw_req_t *r, gw_hook_rc_t rc);
/* The client left: cancel a pending hook. */
void gw_hooks_cancel(gw_req_t *r);
void gw_hooks_headers(gw_req_t *r, gw_sb_t *head);
/* At a streamed answer's head (again for each attempt's): lists the hooks
 * its events go through; true when there is any (else events are relayed
 * untouched). */
bool gw_hooks_events_begin(gw_req_t *r);
/* True when some active hook wants whole JSON bodies. */
bool gw_hooks_want_body(const gw_req_t *r);
/* One event's data through the chain; out gets what to send. */
gw_ev_rc_t gw_hooks_event(gw_req_t *r, const char *data, size_t len, gw_payloads_t *out);
int gw_hooks_body(gw_req_t *r, json_t *body, bool *modified);
/* A whole JSON answer as bytes: through the hooks' on_body_raw when every
 * hook that reads it has one, else parsed and through gw_hooks_body (an
 * answer that is not JSON then goes through no hook, as before). *edited:
 * the new answer (malloc'd, *elen bytes) or NULL. -1: refuse it. */
int gw_hooks_body_bytes(gw_req_t *r, const char *data, size_t len, char **edited, size_t *elen);
void gw_hooks_end(gw_req_t *r, gw_end_t how);

/* What the adapters offer besides their hooks: handlers the route table
 * points at, and helpers other adapters share. */
struct rl_decision;
/* hook_ratelimit.c: the limits of runtime rt (per runtime: a reload swaps them). */
struct rl_policy;
const struct rl_policy *gw_rl_policy(const gw_rt_t *rt);
/* hook_ratelimit.c: fills r->client_ip (X-Forwarded-For from trusted proxies). */
void gw_rl_client_ip(gw_req_t *r);
/* hook_ratelimit.c: the 429 (or 503 when the store is down) for a refused
 * decision, with Retry-After and X-RateLimit-*. */
void gw_rl_respond_refusal(gw_req_t *r, const struct rl_decision *d);
/* Does the ratelimit hook estimate prompts (a token budget is configured)? */
bool gw_rl_budgets_on(const gw_req_t *r);
/* hook_ratelimit.c: a Responses body's prompt estimate from the scanner's
 * facts, without a tree (rl_responses_prompt_tokens_in); 0 and *out, or -1
 * when the body needs the tree (the caller counts from it). */
struct gw_body_scan;
int gw_rl_resp_scan_tokens(const struct gw_body_scan *b, int64_t *out);
/* hook_ratelimit.c: a duration the way OpenAI's x-ratelimit-reset-* write
 * it (Go's time.Duration: "20ms", "1.5s", "6m0s", "1h0m0s"). Returns buf. */
const char *gw_rl_duration(int64_t ms, char *buf, size_t n);
/* hook_ratelimit.c: every rate-limit header line of a decision into buf:
 * OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens} for the
 * limit it describes, the deprecated X-RateLimit-* trio, and when refused
 * Retry-After (seconds) and retry-after-ms (what the openai SDKs read
 * first). Returns the length, or -1 when buf is too small (512 suffice). */
int gw_rl_format_headers(const struct rl_decision *d, char *buf, size_t n);
/* hook_auth.c: the token endpoint and the admin revoke endpoint. */
void gw_auth_token_route(gw_req_t *r);
void gw_auth_revoke_route(gw_req_t *r);

#endif
