/*
 * ratelimit.h — per-user request limits and token budgets, per-address
 * limits, the max_tokens clamp and usage accounting, for the gateway to call
 * from a small adapter. Nothing here knows about gateway/ or HTTP framing.
 *
 * The flow of one request through the gateway:
 *   1. rl_client_ip()        the client's address (X-Forwarded-For only from
 *                            trusted_proxies), for endpoints without a user;
 *   2. rl_body_clamp()       clamps max_tokens in the JSON body, injects
 *                            stream_options.include_usage for streams;
 *      rl_body_prompt_tokens() + the clamped max_tokens = the reservation
 *      (over the gateway's scan, no tree: rl_chat_prompt_tokens(),
 *      rl_chat_prompt_tokens_json() with tools, rl_responses_prompt_tokens_in();
 *      prompt_json.c counts their compact JSON over the client's bytes);
 *   3. rl_check()            takes one request, a concurrency slot and the
 *                            reservation, or refuses with the limit hit:
 *                            answer rl_decision_status(), rl_format_headers()
 *                            and rl_error_body(); on success also send
 *                            rl_format_headers();
 *   4. while relaying:       rl_stream_feed() on each SSE event's data (drop
 *                            or rewrite what it says), or rl_usage_from_body()
 *                            for a plain response;
 *   5. at the end:           rl_ticket_settle(ticket, used tokens) — refunds
 *                            or charges the difference and frees the slot;
 *                            rl_ticket_release() when the request failed or
 *                            was cancelled before the upstream produced output.
 *
 * Arithmetic: GCRA (a token bucket kept as one "theoretical arrival time"
 * per limit). A limit of L per period P admits a burst of L, then one unit
 * every P/L; it never admits more than L at a period's edge (no fixed
 * windows). Token budgets are the same with a cost per request. The day is a
 * rolling 24 h, not a calendar day.
 *
 * Threads: rl_t is shared by all worker threads (the in-process store is
 * lock-striped and exact under concurrency). rl_worker_t belongs to one
 * worker thread and its event_base (it owns that thread's Redis client); a
 * ticket must be settled or released on the thread whose worker took it.
 */
#ifndef SL_RATELIMIT_H
#define SL_RATELIMIT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sl.h"
#include "common/sl_chat.h"

struct event_base;
struct conf_ratelimit;
struct conf_redis;

/* ---- pure arithmetic -------------------------------------------------------- */

/* GCRA state of one limit: the theoretical arrival time, in the clock's ns
 * (0 = never used). A bucket is full (fresh) when tat <= now. */
typedef struct rl_gcra_result {
    bool allowed;
    int64_t remaining; /* units that could still be taken now (after this one if allowed) */
    int64_t reset_ns;  /* until the bucket is full again */
    int64_t retry_ns;  /* when refused: until `cost` fits; -1 = never (cost > limit) */
} rl_gcra_result_t;

/* Takes `cost` units of a `limit` per `period_ns` limit at `now`; on
 * success advances *tat. limit > 0, cost >= 0. */
void rl_gcra_take(int64_t *tat, int64_t now, int64_t limit, int64_t period_ns, int64_t cost,
                  rl_gcra_result_t *out);
/* Gives back `n` units (a refund: the bucket cannot go above full), or
 * charges -n more when n < 0 (may go into debt: later takes wait). */
void rl_gcra_adjust(int64_t *tat, int64_t now, int64_t limit, int64_t period_ns, int64_t n);
/* The state of *tat without changing it (for headers). */
void rl_gcra_peek(int64_t tat, int64_t now, int64_t limit, int64_t period_ns,
                  rl_gcra_result_t *out);

#define RL_MINUTE_NS (60LL * 1000000000LL)
#define RL_DAY_NS    (86400LL * 1000000000LL)

/* ---- limits and decisions ----------------------------------------------------- */

typedef enum rl_limit {
    RL_LIMIT_NONE = 0,
    RL_LIMIT_REQUESTS,      /* per_user.requests_per_minute */
    RL_LIMIT_CONCURRENT,    /* per_user.concurrent */
    RL_LIMIT_TOKENS_MINUTE, /* per_user.tokens_per_minute */
    RL_LIMIT_TOKENS_DAY,    /* per_user.tokens_per_day */
    RL_LIMIT_IP_REQUESTS,   /* per_ip.requests_per_minute */
    RL_LIMIT_STORE,         /* Redis unavailable and on_store_error: deny */
    RL_LIMIT_KEYS,          /* a new key, and the in-process table holds max_keys live
                               keys (limit_value = max_keys) */
    RL_LIMIT_COUNT
} rl_limit_t;

/* "requests_per_minute", "concurrent", "tokens_per_minute", "tokens_per_day",
 * "ip_requests_per_minute", "store_unavailable", "max_keys" (the metric
 * label and the name the error body gives). */
const char *rl_limit_name(rl_limit_t l);

/* Resolved limits for one key (a user's after overrides, or an address's);
 * 0 = no limit. */
typedef struct rl_limits {
    int64_t requests_per_minute;
    int64_t concurrent;
    int64_t tokens_per_minute;
    int64_t tokens_per_day;
} rl_limits_t;

typedef struct rl_policy rl_policy_t;
typedef struct rl_proxies rl_proxies_t;

typedef struct rl_request {
    const rl_policy_t *policy; /* the limits to apply (the request's runtime's); NULL = the
                                  ones rl_new() was built with */
    const char *user;          /* the token's sub; NULL for an endpoint without a user */
    const char *client;        /* the token's client id, for "client:ID" overrides; may be NULL */
    const char *ip;            /* rl_client_ip()'s answer; the key when user is NULL */
    int64_t tokens;            /* reservation: prompt estimate + clamped max_tokens; 0 = none */
} rl_request_t;

typedef struct rl_decision {
    bool allowed;
    rl_limit_t limit;       /* refused: the limit hit; allowed: the one the headers describe
                               (requests, else tokens a minute, else a day; NONE = no headers) */
    int64_t limit_value;    /* X-RateLimit-Limit */
    int64_t remaining;      /* X-RateLimit-Remaining */
    int64_t reset_ms;       /* X-RateLimit-Reset: until that limit is fully replenished */
    int64_t retry_after_ms; /* refused: until a retry can pass; -1 = never (the request
                               costs more tokens than the whole budget) */
    bool store_error;       /* Redis failed; on_store_error decided */
} rl_decision_t;

/* 429, or 503 for RL_LIMIT_STORE. */
int rl_decision_status(const rl_decision_t *d);

/* Header lines "Name: value\r\n" for the answer: X-RateLimit-Limit,
 * -Remaining, -Reset (seconds, rounded up) when d->limit is not NONE, and
 * Retry-After (seconds, rounded up, so that a retry after exactly that long
 * passes) when refused. Returns the length written (NUL-terminated), or -1
 * when buf is too small (256 bytes always suffice). */
int rl_format_headers(const rl_decision_t *d, char *buf, size_t n) SL_WUR;

/* Where rl_format_headers_at wrote the limit's and the remaining count's
 * digits in buf (lengths 0: not written; they are written for every limit
 * but RL_LIMIT_NONE, _STORE and _KEYS), so that a caller adding other names
 * for the same numbers copies them instead of formatting them again. */
typedef struct rl_header_nums {
    size_t limit_off, limit_len;
    size_t remaining_off, remaining_len;
} rl_header_nums_t;

/* rl_format_headers, and where the numbers went into *at. */
int rl_format_headers_at(const rl_decision_t *d, char *buf, size_t n, rl_header_nums_t *at) SL_WUR;

/* The OpenAI-style error for a refusal: {"error": {"message": "...",
 * "type": "rate_limit_error", "param": null, "code": "rate_limit_exceeded",
 * "limit": "<rl_limit_name>"}}. Returns a malloc'd string (caller frees),
 * its length in *len; NULL on OOM. */
char *rl_error_body(const rl_decision_t *d, size_t *len) SL_WUR;

/* Milliseconds to whole seconds, rounded up (0 stays 0). */
int64_t rl_ms_to_s_ceil(int64_t ms);

/* ---- the limiter ------------------------------------------------------------------ */

typedef struct rl rl_t;
typedef struct rl_worker rl_worker_t;
typedef struct rl_ticket rl_ticket_t;
typedef struct rl_pending rl_pending_t;

/* Builds the limiter from conf (both borrowed: copied as needed). redis may
 * be NULL or have a NULL url: in-process limits only. NULL on a bad value
 * (err says why). */
rl_t *rl_new(const struct conf_ratelimit *c, const struct conf_redis *redis, char *err,
             size_t errlen) SL_WUR;
/* After every worker is freed. */
void rl_free(rl_t *rl);

/* The limits alone (per_user, per_ip, overrides, trusted_proxies,
 * on_store_error), apart from the state: a reload builds a new policy while
 * the limiter's store (every key's bucket, in-process or in Redis) lives on,
 * so a user's usage is not reset. A bucket is one "theoretical arrival time"
 * per limit: under a changed limit it keeps its time debt (the time until
 * it is full again), so a user who had used half of the old period's
 * allowance has used half of the new one. Immutable once built; borrowed by
 * every check that names it, so it must outlive them (the gateway keeps it in
 * the refcounted runtime the request holds). NULL on a bad value. */
rl_policy_t *rl_policy_new(const struct conf_ratelimit *c, char *err, size_t errlen) SL_WUR;
void rl_policy_free(rl_policy_t *p);
void rl_policy_limits_for(const rl_policy_t *p, const char *user, const char *client,
                          rl_limits_t *out);
const rl_proxies_t *rl_policy_trusted_proxies(const rl_policy_t *p);
/* ratelimit.max_keys on a live limiter (a reload): a smaller table drops
 * its least recently used keys as new ones come. Thread-safe. */
void rl_set_max_keys(rl_t *rl, int64_t max_keys);

/* Test and bench hook: the monotonic clock (ns) of the in-process store.
 * Set before use. Default sl_now_ns. */
void rl_set_clock(rl_t *rl, int64_t (*now_ns)(void *arg), void *arg);

/* The limits that apply to a user (overrides: the user's, then
 * "client:ID"'s, then per_user), or to an address when user is NULL. */
void rl_limits_for(const rl_t *rl, const char *user, const char *client, rl_limits_t *out);

/* One per worker thread and event_base (Redis calls run on it). */
rl_worker_t *rl_worker_new(rl_t *rl, struct event_base *base, char *err, size_t errlen) SL_WUR;
/* Drops pending checks without calling back (worker shutdown). */
void rl_worker_free(rl_worker_t *w);
/* True when the worker's limits go to Redis now (configured and connected);
 * false with no Redis or while on_store_error decides (for /readyz). */
bool rl_worker_redis_up(const rl_worker_t *w);

typedef enum rl_check_rc {
    RL_ERROR = -1,  /* out of memory: treat as a store error */
    RL_DONE = 0,    /* decided now: *d filled; *ticket set when allowed */
    RL_PENDING = 1, /* the answer comes through cb; *pending can cancel it */
} rl_check_rc_t;

/* d: borrowed for the callback's duration. ticket: owned by the callee
 * (settle or release it) when d->allowed, NULL otherwise. */
typedef void (*rl_check_cb)(void *arg, const rl_decision_t *d, rl_ticket_t *ticket);

/* Checks and takes everything the request needs (a request, a concurrency
 * slot, the token reservation) at once: all or nothing. The in-process
 * store answers RL_DONE; Redis answers RL_PENDING, and cb runs later on
 * the worker's thread (never inside this call), exactly once unless
 * cancelled: the checks of one loop turn go to Redis as one call. A busy
 * key limited by requests alone may be answered RL_DONE from a unit the
 * worker leased from Redis earlier (ratelimit.redis_leases). When Redis is
 * not connected on_store_error decides at once. */
rl_check_rc_t rl_check(rl_worker_t *w, const rl_request_t *req, rl_decision_t *d,
                       rl_ticket_t **ticket, rl_check_cb cb, void *arg,
                       rl_pending_t **pending) SL_WUR;
/* The callback will not run; whatever Redis took for it is given back.
 * Valid until the callback has run. */
void rl_pending_cancel(rl_pending_t *p);

/* The request ended having used `used_tokens` (the upstream's usage, or an
 * estimate): the reservation is refunded or the difference charged, the
 * concurrency slot freed, the ticket freed. */
void rl_ticket_settle(rl_ticket_t *t, int64_t used_tokens);
/* The request failed or was cancelled before any output: everything taken
 * is given back except the request itself (it still counts toward
 * requests_per_minute). Frees the ticket. NULL is fine. */
void rl_ticket_release(rl_ticket_t *t);
int64_t rl_ticket_reserved(const rl_ticket_t *t);

/* Keys the in-process store holds now (for tests and /metrics). */
size_t rl_mem_keys(const rl_t *rl);
/* New keys the in-process store refused since start, every key it held
 * being live (also sluice_ratelimited_total{limit="max_keys"}). */
uint64_t rl_mem_keys_refused(const rl_t *rl);

/* ---- client address ------------------------------------------------------------ */

/* cidrs: "10.0.0.0/8", "fd00::/8", "192.0.2.7" (a host). NULL on a bad one. */
rl_proxies_t *rl_proxies_new(const char *const *cidrs, size_t n, char *err, size_t errlen) SL_WUR;
void rl_proxies_free(rl_proxies_t *p);
bool rl_proxies_contains(const rl_proxies_t *p, const char *ip);
/* The limiter's own list (from ratelimit.trusted_proxies). */
const rl_proxies_t *rl_trusted_proxies(const rl_t *rl);

/* The client's address: the peer, unless the peer is a trusted proxy; then
 * X-Forwarded-For (all its header lines joined with ",", or NULL) is read
 * from the right and the first address that is not a trusted proxy is the
 * client. If every hop is trusted, the left-most; if a hop is not an
 * address, the last trusted hop before it. IPv4-mapped IPv6 becomes IPv4.
 * Writes a canonical textual address into out (INET6_ADDRSTRLEN = 46
 * suffices). 0 ok, -1 when peer itself is not an address. */
int rl_client_ip(const rl_proxies_t *p, const char *peer, const char *xff, char *out,
                 size_t outlen) SL_WUR;

/* ---- request and response bodies ------------------------------------------------- */

typedef struct rl_clamp {
    int64_t max_tokens;    /* what the upstream will get */
    bool stream;           /* "stream": true */
    bool injected_usage;   /* stream_options.include_usage was added (or turned on) by us:
                              the usage-only chunk must not reach the client */
    bool added_max_tokens; /* max_tokens was absent and was added (nothing else changed
                              unless `modified`) */
    bool modified;         /* an existing value was changed, or usage injected */
} rl_clamp_t;

/* Clamps a chat-completions body in place: max_tokens and/or
 * max_completion_tokens become min(theirs, policy_max); without either,
 * max_tokens = policy_max is added. For "stream": true without
 * stream_options.include_usage: true, it is set (injected_usage). -1 with a
 * message (for a 400) when the body is not an object or a value has the
 * wrong type. */
int rl_body_clamp(json_t *body, int64_t policy_max, rl_clamp_t *out, char *err,
                  size_t errlen) SL_WUR;
/* The same; want_usage false leaves stream_options alone (nothing needs the
 * usage: no token budget is configured). */
int rl_body_clamp_ex(json_t *body, int64_t policy_max, bool want_usage, rl_clamp_t *out, char *err,
                     size_t errlen) SL_WUR;

/* Estimated prompt tokens of a chat-completions body (messages' text, names,
 * tools); see rl_estimate_text_tokens(). */
int64_t rl_body_prompt_tokens(const json_t *body);

/* The same two without a JSON tree, for the gateway's body scanner: the
 * facts in, the edits to make out (the caller splices them into the
 * client's bytes). Same checks, same messages, same rl_clamp_t. */
typedef struct rl_clamp_in {
    sl_jkind_t max_tokens_kind; /* SL_J_ABSENT when the key is not there */
    int64_t max_tokens;         /* SL_J_INT */
    sl_jkind_t max_completion_tokens_kind;
    int64_t max_completion_tokens;
    sl_jkind_t stream_kind;
    sl_jkind_t stream_options_kind;
    bool include_usage; /* stream_options.include_usage is true */
} rl_clamp_in_t;

typedef struct rl_clamp_edits {
    int64_t max_tokens;            /* > 0: set (or add) max_tokens to this */
    int64_t max_completion_tokens; /* > 0: set max_completion_tokens to this */
    bool include_usage;            /* make stream_options.include_usage true */
} rl_clamp_edits_t;

int rl_clamp_plan(const rl_clamp_in_t *in, int64_t policy_max, bool want_usage, rl_clamp_t *out,
                  rl_clamp_edits_t *edits, char *err, size_t errlen) SL_WUR;
/* rl_body_prompt_tokens() over the scanned messages, without tool calls
 * and tools (rl_chat_prompt_tokens_json counts those). */
int64_t rl_chat_prompt_tokens(const sl_chat_t *chat);

/* rl_body_prompt_tokens() over the scanned messages, tool calls and tools
 * included: their compact JSON counted over the client's bytes
 * (chat->tools, each message's tool_calls), equal to json_dumps' count
 * (prompt_json.c says why). 0, or -1 when it cannot be had that way (a span
 * not recorded, chat->bigint, a real too long to read, yajl out of memory):
 * the caller counts from the tree. */
int rl_chat_prompt_tokens_json(const sl_chat_t *chat, int64_t *out) SL_WUR;

/* The compact JSON of the value whose text is p[0..n), estimated as
 * rl_estimate_text_tokens() over json_dumps(JSON_COMPACT | JSON_ENCODE_ANY)
 * of jansson's parse of it (in a body without integers beyond int64). -1:
 * not one JSON value, or out of memory. */
int rl_json_dump_tokens(const char *p, size_t n, int64_t *out) SL_WUR;

/* This thread's kept counts of tools arrays (prompt_json.c: the count of
 * a chat or Responses request's tools kept beside its exact bytes, for the
 * same array sent again): forgotten (tests); off (on at start): every
 * array walked, none kept (tests compare the two ways); counts taken from
 * a kept one so far. */
void rl_tools_counts_clear(void);
void rl_tools_counts_enable(bool on);
uint64_t rl_tools_count_hits(void);

/* A conservative token estimate for text whose real count never came:
 * ceil(ASCII bytes / 4) + one token per non-ASCII character. English runs
 * about 4 characters a token; CJK about one or more a character; so this
 * overestimates rather than lets a budget be overrun. */
int64_t rl_estimate_text_tokens(const char *s, size_t n);

typedef struct rl_usage {
    int64_t prompt_tokens;
    int64_t completion_tokens;
    int64_t total_tokens; /* prompt + completion when the upstream left it out */
} rl_usage_t;

/* The "usage" object of a non-streamed response: chat's prompt_tokens /
 * completion_tokens, else the Responses API's input_tokens / output_tokens
 * (into prompt / completion). 0 found, -1 absent/bad. */
int rl_usage_from_body(const json_t *body, rl_usage_t *u) SL_WUR;
/* The same from a JSON answer's bytes data[0..len) (borrowed), without a
 * tree: for every input exactly what rl_usage_from_body() reads from
 * json_loadb(data, len, 0)'s tree (-1 when that fails), the tree built only
 * for bytes where yajl and jansson might disagree (ratelimit/usage_json.c). */
int rl_usage_from_json(const char *data, size_t len, rl_usage_t *u) SL_WUR;

/* What rl_stream_feed() reads from jansson's tree of one chat chunk (a JSON
 * object), read from its bytes: the characters of its choices' text
 * (rl_estimate_text_tokens' two counts), its top-level usage, whether its
 * choices is an empty array. -1: bytes the tree may read otherwise (not
 * whole JSON, odd escapes or UTF-8, deep): ask the tree. A chunk with the
 * shape of one read before on this thread (no usage) is read from that
 * shape, without a parse (usage_json.c, "kept shapes"): the same figures. */
typedef struct rl_chunk_read {
    int64_t ascii, other;
    bool got_usage, choices_empty;
    rl_usage_t usage;
} rl_chunk_read_t;
int rl_chunk_read_json(const char *data, size_t len, rl_chunk_read_t *out) SL_WUR;
/* The same read from jansson's tree of the chunk: what rl_stream_feed()
 * uses when rl_chunk_read_json() asks for the tree, and what that read is
 * held to (tests/unit/test_ratelimit_usage_json.c, fuzz_usage_json). */
void rl_chunk_read_tree(const json_t *j, rl_chunk_read_t *out);
/* This thread's kept chunk shapes: forgotten (tests); off (on at start):
 * rl_chunk_read_json() reads every chunk the full way and keeps none
 * (tests compare the two ways); chunks read from a shape so far. */
void rl_chunk_shapes_clear(void);
void rl_chunk_shapes_enable(bool on);
uint64_t rl_chunk_shape_hits(void);

/* Estimated prompt tokens of a Responses API body (POST /v1/responses):
 * instructions, input (a string: one user message; an array of items:
 * each item's content string or parts, a function_call_output's output, any
 * other item's compact JSON) and tools, as rl_body_prompt_tokens counts a
 * chat body. */
int64_t rl_responses_prompt_tokens(const json_t *body);

/* The same without a tree, from the scanner's facts: texts decoded, JSON
 * texts as the client sent them (spans of the body, no integer beyond
 * int64 in it). */
typedef struct rl_resp_in {
    sl_jkind_t instructions_kind; /* SL_J_ABSENT when not there */
    sl_text_t instructions;       /* decoded, when a string */
    sl_jkind_t input_kind;
    sl_text_t input;      /* decoded, when a string */
    sl_text_t input_json; /* its JSON text, when an array */
    sl_jkind_t tools_kind;
    sl_text_t tools_json; /* its JSON text, when there */
    bool bigint;          /* an integer beyond int64 in the body: -1 */
} rl_resp_in_t;
/* 0, or -1 (a JSON text missing or not walked: count from the tree). */
int rl_responses_prompt_tokens_in(const rl_resp_in_t *in, int64_t *out) SL_WUR;

/* Per-stream accounting. */
typedef struct rl_stream rl_stream_t;

typedef enum rl_chunk_action {
    RL_CHUNK_FORWARD = 0, /* send the event as it came */
    RL_CHUNK_DROP,        /* the usage-only chunk we injected: do not send it */
    RL_CHUNK_REWRITE,     /* send *out instead (the same chunk without "usage") */
} rl_chunk_action_t;

/* strip: the clamp injected include_usage (rl_clamp_t.injected_usage). */
rl_stream_t *rl_stream_new(bool strip) SL_WUR;
void rl_stream_free(rl_stream_t *s);
/* One SSE event's data (the JSON after "data: ", or "[DONE]"). Notes the
 * usage when present and counts the streamed text (delta content,
 * reasoning, tool-call arguments) for the estimate. *out (REWRITE only) is
 * malloc'd; the caller frees it. Bad JSON is forwarded untouched. */
rl_chunk_action_t rl_stream_feed(rl_stream_t *s, const char *data, size_t len, char **out,
                                 size_t *outlen);
/* A Responses API stream's event data (its own shapes: nothing is dropped
 * or rewritten): response.completed's response.usage (read without a
 * tree, common/sl_resp.h) is the usage, and each *.delta event's text is
 * counted for the estimate. */
void rl_stream_feed_responses(rl_stream_t *s, const char *data, size_t len);
/* rl_stream_feed's strip alone, for a caller that keeps no count: what a
 * stream with strip on does with this event (nothing is noted). */
rl_chunk_action_t rl_chunk_strip_usage(const char *data, size_t len, char **out, size_t *outlen);
/* 0 and the upstream's usage if it came; -1 otherwise. */
int rl_stream_usage(const rl_stream_t *s, rl_usage_t *u) SL_WUR;
/* Completion tokens estimated from the streamed text. */
int64_t rl_stream_estimate(const rl_stream_t *s);
/* What to settle: the usage's total when it came, else prompt_estimate +
 * rl_stream_estimate(). */
int64_t rl_stream_settle_tokens(const rl_stream_t *s, int64_t prompt_estimate);

#endif
