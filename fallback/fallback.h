/*
 * fallback.h — the gateway-independent parts of the fallback chain: the
 * retry policy and its budget, the circuit breaker per upstream server,
 * template replies, the durable queue (journal or Redis stream), the
 * idempotency store and fault-injection decisions. Nothing here knows about
 * gateway/ or HTTP framing; the gateway calls these through a small adapter.
 * docs/fallback.md tells the design and the configuration.
 *
 * Where each part is called from in a proxied request:
 *   before forwarding   fb_fault_for_request() (abort / delay / go on);
 *                       fb_idem_begin() when Idempotency-Key is present;
 *                       fb_budget_on_request() once per client request;
 *   picking a server    fb_breaker_eligible() in the balancer's eligibility,
 *                       fb_breaker_acquire() on the server picked;
 *   each attempt's end  fb_breaker_report() (or fb_breaker_cancel());
 *   a failed attempt    fb_retry_decide() -> retry after delay_ms (maybe on
 *                       another server), or the next tier (local pool, then
 *                       fb_tmpl_render() and, when the model queues,
 *                       fb_queue_accept());
 *   after the answer    fb_idem_complete() / fb_idem_abort();
 *   resend worker       fb_queue_next(), then fb_queue_report();
 *   GET /v1/requests/ID fb_queue_lookup();
 *   a timer (~1 s)      fb_queue_maintain(); admin /metrics: fb_breakers_refresh().
 *
 * Clocks: every decision takes the time as an argument (monotonic ms for
 * retry, budget and breaker; wall ms for the queue, whose times survive a
 * restart) and randomness as an argument or an injected function, so the
 * pure cores are tested with fake clocks.
 *
 * Threads: budgets, breakers, the in-process idempotency store and the
 * journal queue are shared by all worker threads (small locks, atomics for
 * the lock-free reads). The *_worker objects belong to one worker thread and
 * its event_base: they own that thread's Redis client. Calls that may go to
 * Redis return fb_rc_t: FB_DONE (answered now, *res filled) or FB_PENDING
 * (the callback runs later on the worker's thread, never inside the call,
 * exactly once unless cancelled).
 */
#ifndef SL_FALLBACK_H
#define SL_FALLBACK_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sl.h"
#include "conf/conf.h"

struct event_base;

typedef enum fb_rc {
    FB_ERROR = -1,  /* out of memory or a bad argument */
    FB_DONE = 0,    /* answered now: *res is filled */
    FB_PENDING = 1, /* the answer comes through the callback; *call can cancel it */
} fb_rc_t;

/* A pending Redis call. Cancelling it means its callback never runs. Valid
 * until the callback has run. */
typedef struct fb_call fb_call_t;
void fb_call_cancel(fb_call_t *c);

/* The tiers, as labels of sluice_fallback_total{tier}. */
typedef enum fb_tier {
    FB_TIER_RETRY = 0, /* a retry was made */
    FB_TIER_LOCAL,     /* the local pool answered */
    FB_TIER_TEMPLATE,  /* the template was served */
    FB_TIER_QUEUE,     /* the request was queued */
    FB_TIER_COUNT
} fb_tier_t;
const char *fb_tier_name(fb_tier_t t);
/* Counts one use of a tier in sluice_fallback_total{tier}. */
void fb_count_tier(fb_tier_t t);

/* Registers every fallback metric (idempotent; the constructors call it). */
void fb_metrics_init(void);

/* ==== 1. retry policy and budget ============================================ */

typedef enum fb_failure {
    FB_FAIL_CONNECT = 0, /* connect refused / timed out, TLS handshake failed */
    FB_FAIL_STATUS,      /* the server answered a status >= 500 */
    FB_FAIL_FIRST_BYTE,  /* no byte of the answer within first_byte */
    FB_FAIL_RESET,       /* closed without a byte after the request went out */
    FB_FAIL_OTHER,       /* bad response, total timeout, cut mid-answer: never retried */
} fb_failure_t;

typedef struct fb_attempt {
    fb_failure_t failure;
    int status;              /* FB_FAIL_STATUS: the upstream's status */
    bool client_started;     /* some byte of the answer went to the client already */
    int retries_done;        /* retries made so far (0 when the first try failed) */
    const char *retry_after; /* the failed answer's Retry-After (NUL-terminated) or NULL */
    bool other_server;       /* another server of the pool is eligible now */
    int64_t deadline_ms;     /* the request's total deadline (monotonic ms); 0 = none */
} fb_attempt_t;

typedef enum fb_retry_verdict {
    FB_RETRY = 0,            /* retry after delay_ms */
    FB_NO_RETRY_KIND,        /* not a retryable failure (or a 501/505 status) */
    FB_NO_RETRY_STARTED,     /* the client already got bytes of this answer */
    FB_NO_RETRY_ATTEMPTS,    /* retry.attempts are spent */
    FB_NO_RETRY_RETRY_AFTER, /* only the same server is left and it asked for a pause
                                longer than backoff_max */
    FB_NO_RETRY_DEADLINE,    /* the delay would pass the request's deadline */
    FB_NO_RETRY_BUDGET,      /* the retry budget is spent (counted) */
} fb_retry_verdict_t;
const char *fb_retry_verdict_name(fb_retry_verdict_t v);

typedef struct fb_retry_decision {
    fb_retry_verdict_t verdict;
    int64_t delay_ms;  /* FB_RETRY: wait this long before the next attempt */
    bool prefer_other; /* FB_RETRY: pick another server than the one that failed */
} fb_retry_decision_t;

/* Is this failure retryable at all (kind and status, nothing sent yet)? */
bool fb_failure_retryable(const fb_attempt_t *a);

/* Retry-After as a delay: "120" (seconds) or an HTTP-date (IMF-fixdate,
 * RFC 850 or asctime) relative to now_wall_ms. A date in the past is 0.
 * -1 when the value is neither. */
int64_t fb_retry_after_ms(const char *value, int64_t now_wall_ms);

/* The retry budget of one pool, shared by all worker threads: retries are
 * at most budget_percent of the requests seen over a sliding window
 * (budget_window, in 10 buckets), plus budget_min a window. A small lock
 * makes "check and take" exact across threads. */
typedef struct fb_budget fb_budget_t;
/* c: copied. upstream: the metrics label, copied. Never NULL (aborts on OOM:
 * startup and reload only). */
fb_budget_t *fb_budget_new(const conf_fb_retry_t *c, const char *upstream);
void fb_budget_free(fb_budget_t *b);
/* A reload: new parameters, the window's counts are kept. */
void fb_budget_configure(fb_budget_t *b, const conf_fb_retry_t *c);
/* One client request (its first attempt; retries are not requests). */
void fb_budget_on_request(fb_budget_t *b, int64_t now_ms);
/* Takes one retry when the budget allows it: true = taken and counted. */
bool fb_budget_take(fb_budget_t *b, int64_t now_ms);
/* The window's current counts (for tests and /metrics). */
void fb_budget_counts(fb_budget_t *b, int64_t now_ms, int64_t *requests, int64_t *retries);

/* The whole decision, in order: kind, client_started, attempts, delay
 * (backoff * 2^retries_done, jittered to [half, full] by rnd, capped at
 * backoff_max; a Retry-After counts only when the retry must go to the same
 * server: then delay = max(backoff, Retry-After) and a Retry-After above
 * backoff_max refuses), deadline, and last the budget (taken only when all
 * else says yes). Counts sluice_retries_total / _budget_exhausted_total
 * on b's upstream. b may be NULL (no budget: tests). */
void fb_retry_decide(const conf_fb_retry_t *c, fb_budget_t *b, const fb_attempt_t *a,
                     int64_t now_ms, int64_t now_wall_ms, uint64_t rnd, fb_retry_decision_t *d);

/* Exponential backoff with jitter, shared by retries and queue resends:
 * base * 2^n capped at max, then uniform in [half, full] by rnd. */
int64_t fb_backoff_ms(int64_t base_ms, int64_t max_ms, int n, uint64_t rnd);

/* ==== 2. circuit breaker ======================================================== */

/* Values of sluice_circuit_state{upstream,server}. */
typedef enum fb_circuit_state {
    FB_CIRCUIT_CLOSED = 0,
    FB_CIRCUIT_HALF_OPEN = 1,
    FB_CIRCUIT_OPEN = 2,
} fb_circuit_state_t;
const char *fb_circuit_state_name(fb_circuit_state_t s);

typedef enum fb_admit {
    FB_ADMIT_NO = 0, /* open, or half-open with every probe slot taken */
    FB_ADMIT_YES,    /* closed: an ordinary request */
    FB_ADMIT_PROBE,  /* half-open: this request is a probe */
} fb_admit_t;

/* One server's breaker. Opens on `failures` consecutive failures or on
 * failure_percent over the window (with min_requests results in it), stays
 * open for cooldown, then lets `probes` requests through (half-open): all
 * succeeding closes it, one failing opens it again for another cooldown.
 * Thread-safe; reads are lock-free. */
typedef struct fb_breaker fb_breaker_t;
/* Labels copied. Never NULL (aborts on OOM). */
fb_breaker_t *fb_breaker_new(const conf_fb_circuit_t *c, const char *upstream, const char *server);
void fb_breaker_free(fb_breaker_t *b);
void fb_breaker_configure(fb_breaker_t *b, const conf_fb_circuit_t *c);
/* The state now: an open circuit whose cooldown has passed reads (and
 * becomes) half-open. Updates the gauge on a change. */
fb_circuit_state_t fb_breaker_state(fb_breaker_t *b, int64_t now_ms);
/* May this server be picked now (closed, or half-open with a free probe
 * slot)? For the balancer's eligibility; a pick must still acquire. */
bool fb_breaker_eligible(fb_breaker_t *b, int64_t now_ms);
/* Admits one request to the server picked. Every YES or PROBE must be
 * followed by exactly one fb_breaker_report() or fb_breaker_cancel(). */
fb_admit_t fb_breaker_acquire(fb_breaker_t *b, int64_t now_ms);
/* The admitted request's result: ok = an answer below 500 came. */
void fb_breaker_report(fb_breaker_t *b, fb_admit_t how, bool ok, int64_t now_ms);
/* The admitted request ended without a result (client gone, cancelled):
 * frees its probe slot, counts nothing. */
void fb_breaker_cancel(fb_breaker_t *b, fb_admit_t how);
/* The server asked for a pause (503 + Retry-After): open until until_ms
 * (then half-open as after a cooldown). Never shortens an open period. */
void fb_breaker_hold(fb_breaker_t *b, int64_t until_ms, int64_t now_ms);
/* Consecutive failures now (tests, logs). */
int fb_breaker_failures(fb_breaker_t *b);
/* How long until this server may be picked again: 0 when it may now, the
 * open period's remainder, or probe_wait_ms when half-open with every
 * probe slot taken (a probe's answer is what frees one). For the
 * Retry-After of an answer sent because no server could be picked. */
int64_t fb_breaker_wait_ms(fb_breaker_t *b, int64_t now_ms, int64_t probe_wait_ms);
/* Open: milliseconds until it turns half-open; 0 in any other state
 * (/admin/state's open_remaining_seconds). */
int64_t fb_breaker_open_remaining_ms(fb_breaker_t *b, int64_t now_ms);

/* The process-wide set of breakers, keyed by (upstream, server URL), so a
 * reload keeps each server's state. */
typedef struct fb_breakers fb_breakers_t;
fb_breakers_t *fb_breakers_new(void);
void fb_breakers_free(fb_breakers_t *r);
/* The breaker of that server, made on first use; reconfigured with c.
 * Valid as long as r. Never NULL. */
fb_breaker_t *fb_breakers_get(fb_breakers_t *r, const conf_fb_circuit_t *c, const char *upstream,
                              const char *server);
/* Brings every breaker's state (and gauge) up to now, before /metrics is
 * rendered; returns how many are open. (/readyz asks fb_breaker_state() of
 * each server of the current pools: a server removed by a reload keeps its
 * breaker here.) */
size_t fb_breakers_refresh(fb_breakers_t *r, int64_t now_ms);

/* ==== 3. template replies ======================================================= */

typedef enum fb_api {
    FB_API_CHAT = 0,    /* /v1/chat/completions: chat.completion(.chunk) */
    FB_API_COMPLETIONS, /* /v1/completions: text_completion */
} fb_api_t;

typedef struct fb_reply_req {
    fb_api_t api;
    bool stream;         /* "stream": true -> SSE */
    bool include_usage;  /* stream_options.include_usage -> a final usage chunk */
    const char *model;   /* echoed in "model" (borrowed); NULL = "" */
    const char *id;      /* completion id suffix, e.g. the request id (borrowed) */
    int64_t created;     /* "created", wall seconds */
    int n;               /* choices asked for ("n"); 0 = 1, at most FB_REPLY_MAX_N */
    bool json_mode;      /* response_format json_object / json_schema: content is JSON */
    bool tools_required; /* tool_choice "required" or a named function: no text will do */
} fb_reply_req_t;

/* The most choices a template reply carries (a larger n gets this many). */
#define FB_REPLY_MAX_N 64

/* Fills q->stream, q->include_usage, q->model (borrowed from body), q->n,
 * q->json_mode and q->tools_required from a parsed request body; api, id
 * and created are the caller's. */
void fb_reply_req_from_json(const json_t *body, fb_reply_req_t *q);

/* The reply in exactly the shape asked for: a chat.completion (or
 * text_completion) JSON with usage zeros and finish_reason "stop", or the
 * SSE bytes of chunks (role, content, finish_reason "stop", the usage chunk
 * when asked) ending in "data: [DONE]". malloc'd (caller frees), length in
 * *len; NULL on OOM. */
char *fb_reply_render(const fb_reply_req_t *q, const char *text, size_t *len) SL_WUR;
/* "application/json" or "text/event-stream" for q. */
const char *fb_reply_content_type(const fb_reply_req_t *q);

/* The configured texts (copied from c). NULL on OOM. */
typedef struct fb_tmpl fb_tmpl_t;
fb_tmpl_t *fb_tmpl_new(const conf_fb_template_t *c) SL_WUR;
void fb_tmpl_free(fb_tmpl_t *t);
/* The text for an Accept-Language value (may be NULL): tags in q order
 * (q=0 excluded, ties in header order), each matched exactly, then by
 * dropping subtags ("en-US" -> "en"), case-insensitively; "*" or nothing
 * matching = the default text. *lang (may be NULL) gets the configured tag
 * chosen, or NULL for the default. Borrowed from t. */
const char *fb_tmpl_pick(const fb_tmpl_t *t, const char *accept_language, size_t len,
                         const char **lang);
/* fb_tmpl_pick + fb_reply_render; counts sluice_fallback_total{tier="template"}.
 * In a JSON mode the content is the configured JSON object, or
 * {"error":"unavailable","message":<the text>}. */
char *fb_tmpl_render(const fb_tmpl_t *t, const fb_reply_req_t *q, const char *accept_language,
                     size_t al_len, size_t *len) SL_WUR;

/* ==== 4. durable queue ============================================================ */

/* Ids are "q" + 32 lowercase hex digits (128 random bits). */
#define FB_QUEUE_ID_LEN 33

typedef struct fb_queue fb_queue_t;
typedef struct fb_qworker fb_qworker_t;

/* What fb_queue_next() hands the resend worker (owned by the receiver). */
typedef struct fb_qitem {
    char id[FB_QUEUE_ID_LEN + 1];
    char *user;     /* "" when the request had no user */
    char *idem_key; /* NULL when none: a resend carries it, so a duplicate is not generated */
    char *route;    /* what the caller stored, e.g. "/v1/chat/completions" */
    char *body;     /* the request body to resend, as accepted */
    size_t body_len;
    int attempts;        /* resends made before this one */
    int64_t accepted_ms; /* wall ms */
} fb_qitem_t;
void fb_qitem_free(fb_qitem_t *it);

typedef enum fb_qstatus {
    FB_Q_OK = 0,      /* accept: stored durably (id set); report: recorded */
    FB_Q_NONE,        /* next: nothing is due */
    FB_Q_FULL,        /* accept: max_pending requests wait already */
    FB_Q_PENDING,     /* lookup: not delivered yet (202) */
    FB_Q_DELIVERED,   /* lookup: the stored answer is in result (200) */
    FB_Q_DEAD,        /* lookup: dead-lettered (max_attempts, max_age, or rejected) */
    FB_Q_UNKNOWN,     /* lookup: unknown, expired, or another user's (404) */
    FB_Q_STALE,       /* report: the item was already delivered or dead: nothing changed */
    FB_Q_STORE_ERROR, /* I/O error, or Redis down or late: nothing is promised */
} fb_qstatus_t;
const char *fb_qstatus_name(fb_qstatus_t s);

typedef struct fb_qres {
    fb_qstatus_t status;
    char id[FB_QUEUE_ID_LEN + 1]; /* accept: the new id */
    fb_qitem_t *item;             /* next: the due item (the receiver frees it) */
    char *result;                 /* lookup DELIVERED: the stored answer (receiver frees) */
    size_t result_len;
    int64_t next_ms; /* lookup PENDING: wall ms of the next attempt (a Retry-After hint) */
} fb_qres_t;
/* Frees what res holds and zeroes it. */
void fb_qres_clear(fb_qres_t *res);

/* res: the receiver owns its contents (clear it). */
typedef void (*fb_queue_cb)(void *arg, fb_qres_t *res);

typedef struct fb_qaccept {
    const char *user;     /* NULL = "" */
    const char *idem_key; /* may be NULL */
    const char *route;
    const void *body;
    size_t body_len;
} fb_qaccept_t;

typedef enum fb_qoutcome {
    FB_QO_DELIVERED = 0, /* the upstream answered: result is the stored answer */
    FB_QO_RETRY,         /* a transient failure: resend later (or dead letter at max) */
    FB_QO_REJECTED,      /* a permanent failure (4xx): dead letter now */
} fb_qoutcome_t;

typedef struct fb_qstats {
    int64_t accepted, delivered, dead, pending; /* accepted = delivered + dead + pending */
    int64_t oldest_pending_ms;                  /* wall ms of the oldest pending; 0 = none */
} fb_qstats_t;

/* The store per c->store (auto: Redis when redis->url is set). The journal
 * opens c->dir (made if missing; locked against a second process), replays
 * it and truncates a torn tail. NULL with err on failure. */
fb_queue_t *fb_queue_new(const conf_fb_queue_t *c, const conf_redis_t *redis, char *err,
                         size_t errlen) SL_WUR;
void fb_queue_free(fb_queue_t *q);
/* Test hooks (set before use): the wall clock in ms, and the random source
 * for ids and jitter (must fill n bytes; default OpenSSL's RAND_bytes). */
void fb_queue_set_clock(fb_queue_t *q, int64_t (*now_ms)(void *arg), void *arg);
void fb_queue_set_random(fb_queue_t *q, void (*fill)(void *arg, void *buf, size_t n), void *arg);
/* true: the Redis stream; false: the journal. */
bool fb_queue_is_redis(const fb_queue_t *q);

/* One per worker thread and event_base (its Redis client). */
fb_qworker_t *fb_qworker_new(fb_queue_t *q, struct event_base *base, char *err,
                             size_t errlen) SL_WUR;
/* Drops pending calls without calling back. */
void fb_qworker_free(fb_qworker_t *w);

/* Stores the request durably before answering: the journal writes and
 * fdatasyncs (group commit: concurrent accepts share one fdatasync).
 * Status OK (id set), FULL, or STORE_ERROR. Blocking for the journal. */
fb_rc_t fb_queue_accept(fb_qworker_t *w, const fb_qaccept_t *in, fb_qres_t *res, fb_queue_cb cb,
                        void *arg, fb_call_t **call) SL_WUR;
/* The next due request (oldest due first), leased to the caller for
 * `lease`: status OK with res->item, or NONE. Dead-letters what passed
 * max_age on the way. */
fb_rc_t fb_queue_next(fb_qworker_t *w, fb_qres_t *res, fb_queue_cb cb, void *arg,
                      fb_call_t **call) SL_WUR;
/* The result of a resend of item `id`. DELIVERED stores result (fsynced)
 * exactly once: a second report of a delivered or dead item is STALE. */
fb_rc_t fb_queue_report(fb_qworker_t *w, const char *id, fb_qoutcome_t o, const void *result,
                        size_t result_len, fb_qres_t *res, fb_queue_cb cb, void *arg,
                        fb_call_t **call) SL_WUR;
/* GET /v1/requests/{id} for `user` (NULL = ""): PENDING, DELIVERED (with
 * result), DEAD, or UNKNOWN (also for another user's id). */
fb_rc_t fb_queue_lookup(fb_qworker_t *w, const char *id, const char *user, fb_qres_t *res,
                        fb_queue_cb cb, void *arg, fb_call_t **call) SL_WUR;
/* Journal: dead-letters pending items past max_age, forgets ended ones past
 * keep, compacts the file when it holds mostly dead weight, and updates the
 * gauges. Redis: refreshes the counters from Redis (async, fire and forget)
 * when w is given. 0 ok, -1 I/O error. */
int fb_queue_maintain(fb_queue_t *q, fb_qworker_t *w);
/* A consistent snapshot (journal) or the last counters seen (Redis). */
void fb_queue_stats(fb_queue_t *q, fb_qstats_t *st);
/* Journal only: its file size in bytes (tests; compaction). */
int64_t fb_queue_journal_bytes(fb_queue_t *q);

/* ==== 5. idempotency ================================================================ */

typedef enum fb_idem_verdict {
    FB_IDEM_PROCEED = 0, /* first use: go on, then complete or abort with res->token */
    FB_IDEM_IN_FLIGHT,   /* the same key is being served now: 409 */
    FB_IDEM_REPLAY,      /* completed: send res->status / content_type / body again */
    FB_IDEM_MISMATCH,    /* the key was used with another body: 422 */
    FB_IDEM_NOT_KEPT,    /* completed, but the answer was too large to keep: 409 */
    FB_IDEM_STORE_ERROR, /* Redis down or late */
} fb_idem_verdict_t;
const char *fb_idem_verdict_name(fb_idem_verdict_t v);

typedef struct fb_idem_result {
    fb_idem_verdict_t verdict;
    uint64_t token;     /* PROCEED: proves ownership to complete / abort */
    int status;         /* REPLAY */
    char *content_type; /* REPLAY, malloc'd */
    char *body;         /* REPLAY, malloc'd */
    size_t body_len;
} fb_idem_result_t;
void fb_idem_result_clear(fb_idem_result_t *r);

/* res: the receiver owns its contents. */
typedef void (*fb_idem_cb)(void *arg, fb_idem_result_t *res);

typedef struct fb_idem fb_idem_t;
typedef struct fb_idem_worker fb_idem_worker_t;

/* Keys are 1..255 visible ASCII characters (the gateway answers 400
 * otherwise). */
#define FB_IDEM_KEY_MAX 255
bool fb_idem_key_valid(const char *key, size_t len);

/* In-process when redis is NULL or has no url; else Redis (shared by
 * instances). NULL with err on a bad value. */
fb_idem_t *fb_idem_new(const conf_fb_idem_t *c, const conf_redis_t *redis, char *err,
                       size_t errlen) SL_WUR;
void fb_idem_free(fb_idem_t *s);
/* Test hook: the monotonic clock in ms for TTLs (in-process store). */
void fb_idem_set_clock(fb_idem_t *s, int64_t (*now_ms)(void *arg), void *arg);
/* Entries held now (in-process store). */
size_t fb_idem_count(fb_idem_t *s);

fb_idem_worker_t *fb_idem_worker_new(fb_idem_t *s, struct event_base *base, char *err,
                                     size_t errlen) SL_WUR;
void fb_idem_worker_free(fb_idem_worker_t *w);

/* Claims (user, key) for this body, or says why not. The key is scoped to
 * the user: another user's same key is another entry. */
fb_rc_t fb_idem_begin(fb_idem_worker_t *w, const char *user, const char *key, const void *body,
                      size_t body_len, fb_idem_result_t *res, fb_idem_cb cb, void *arg,
                      fb_call_t **call) SL_WUR;
/* The request that got PROCEED finished: its answer is kept for ttl (a
 * larger than max_response_bytes answer is remembered as NOT_KEPT). Fire
 * and forget (a failure is counted and the in-flight mark expires). */
void fb_idem_complete(fb_idem_worker_t *w, const char *user, const char *key, uint64_t token,
                      int status, const char *content_type, const void *body, size_t len);
/* The request that got PROCEED failed before an answer: the key is free
 * again (a retry with it proceeds). Fire and forget. */
void fb_idem_abort(fb_idem_worker_t *w, const char *user, const char *key, uint64_t token);

/* ==== 6. fault injection ============================================================= */

#define FB_FAULT_HEADER       "X-Sluice-Fault"
#define FB_FAULT_ADMIN_HEADER "X-Sluice-Admin-Key"

typedef struct fb_fault_spec {
    int abort_percent; /* 0..100 */
    int abort_status;  /* 400..599 */
    int delay_percent; /* 0..100 */
    int64_t delay_ms;
} fb_fault_spec_t;

typedef enum fb_fault_source {
    FB_FAULT_FROM_NONE = 0,
    FB_FAULT_FROM_CONF,   /* the root fault: or the model's */
    FB_FAULT_FROM_HEADER, /* the request's X-Sluice-Fault */
} fb_fault_source_t;

typedef struct fb_fault_action {
    bool abort;       /* answer `status` instead of forwarding (through the fallback chain) */
    int status;       /* abort's status */
    int64_t delay_ms; /* hold the request this long first; 0 = none */
    fb_fault_source_t source;
} fb_fault_action_t;

/* The spec for a model: its fault: fields where set, else the root's. */
void fb_fault_resolve(const conf_fault_t *root, const conf_fault_t *model, fb_fault_spec_t *out);

/* X-Sluice-Fault: `abort=STATUS[@PERCENT]` and/or `delay=DURATION[@PERCENT]`,
 * separated by ';' (spaces allowed), e.g. "abort=503;delay=2s" or
 * "abort=503@30; delay=500ms@10". PERCENT defaults to 100; DURATION as in
 * the conf (250ms, 2s, 1m; at most 10m). 0 ok, -1 with the reason in err. */
int fb_fault_parse(const char *v, size_t len, fb_fault_spec_t *out, char *err,
                   size_t errlen) SL_WUR;

/* Pure: abort and delay are drawn independently from rnd's two halves. */
void fb_fault_decide(const fb_fault_spec_t *s, uint64_t rnd, fb_fault_action_t *a);

typedef enum fb_fault_rc {
    FB_FAULT_OK = 0,     /* *a says what to do (maybe nothing) */
    FB_FAULT_BAD_HEADER, /* an admin's header that does not parse: 400 */
    FB_FAULT_FORBIDDEN,  /* the header without a valid admin key (or header: false): 403 */
} fb_fault_rc_t;

/* The decision for one request: the header (when present, honoured only
 * with admin_ok and root->header) replaces the conf's spec. Counts
 * sluice_faults_injected_total{kind,source}. model may be NULL; header
 * may be NULL (absent). */
fb_fault_rc_t fb_fault_for_request(const conf_fault_t *root, const conf_fault_t *model,
                                   const char *header, size_t hlen, bool admin_ok, uint64_t rnd,
                                   fb_fault_action_t *a, char *err, size_t errlen);

#endif
