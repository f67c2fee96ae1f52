/*
 * conf.h — sluice's configuration: the typed tree every module reads, and
 * the one table of keys (conf_keys.c) that drives parsing, defaults, bounds,
 * `sluice -t`, the README's reference and reload.
 *
 * conf/ is the bottom layer: it includes nothing from the other modules.
 * Each module reads its own section (a `const conf_xxx_t *`); the structs
 * below are plain data, immutable once conf_load() returns. A reload builds
 * a whole new conf_t; the old one is freed when the last request holding it
 * ends (refcounting is the gateway's business, not conf's).
 *
 * Units: every duration is in milliseconds (*_ms), every size in bytes.
 * YAML accepts "250ms", "10s", "5m", "1h", "1d" and "16k", "1m", "1g"
 * (binary multiples), plus plain integers (ms / bytes).
 */
#ifndef SL_CONF_H
#define SL_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/sl.h"

/* ---- listeners ---------------------------------------------------------- */

/* Longest host kept from an address or URL (a DNS name is at most 253). */
#define CONF_HOST_MAX 256

typedef struct conf_listen {
    char *address;  /* "127.0.0.1:8080", "[::1]:8080", "0.0.0.0:8443" */
    char *tls_cert; /* tls: { cert, key } — both or neither; relative paths */
    char *tls_key;  /* are relative to sluice's working directory */
    int line;       /* line of this item in the file, for later errors */
    /* Derived from address by the loader (not keys of their own): */
    char host[CONF_HOST_MAX]; /* "127.0.0.1", "::1" (brackets removed) */
    int port;                 /* 1..65535 */
    char **protocols;         /* ALPN on a TLS listener: "h2", "http/1.1"; none = both */
    size_t nprotocols;
    bool h2c; /* plain listener: HTTP/2 with prior knowledge (the preface) */
} conf_listen_t;

/* http2: the h2 connections' settings (gateway/h2.c) */
typedef struct conf_http2 {
    int64_t max_concurrent_streams;
    int64_t initial_window;  /* bytes, per stream */
    int64_t max_header_list; /* bytes, decoded header list per stream */
    int64_t max_frame;       /* bytes */
    int64_t idle_timeout_ms; /* a connection with no open stream */
    int64_t reset_burst;     /* client stream resets allowed at once ... */
    int64_t reset_rate;      /* ... and refilled per second (CVE-2023-44487) */
} conf_http2_t;

typedef struct conf_admin {
    char *address; /* default 127.0.0.1:9090; "off" disables */
    /* Derived from address: host "" and port 0 when "off". */
    char host[CONF_HOST_MAX];
    int port;
} conf_admin_t;

/* ---- client-side limits ------------------------------------------------- */

typedef struct conf_limits {
    int64_t request_line_bytes;   /* 8k    -> 414 */
    int64_t header_bytes;         /* 16k   -> 431 */
    int64_t header_lines;         /* 100   -> 431 */
    int64_t max_body_bytes;       /* 1m    -> 413 */
    int64_t header_timeout_ms;    /* 10s   -> 408 */
    int64_t body_timeout_ms;      /* 30s   -> 408 */
    int64_t keepalive_timeout_ms; /* 60s idle between requests */
    int64_t send_timeout_ms;      /* 60s: a client that reads nothing for this long is cut */
    int64_t max_connections;      /* per worker; over it accept pauses */
    int64_t keepalive_requests;   /* requests per client connection, then close */
} conf_limits_t;

/* ---- upstreams ---------------------------------------------------------- */

typedef enum conf_balance {
    CONF_BALANCE_ROUND_ROBIN = 0,
    CONF_BALANCE_LEAST_CONN,
} conf_balance_t;

/* Longest base path kept from a server URL ("/openai/v1"). */
#define CONF_BASE_PATH_MAX 256

typedef struct conf_server {
    char *url;      /* http[s]://host[:port][/base/path] */
    int64_t weight; /* 1..1000, default 1 */
    int line;
    /* Derived from url by the loader: */
    bool https;
    char host[CONF_HOST_MAX]; /* brackets removed from an IPv6 literal */
    int port;                 /* explicit, or 80 / 443 */
    /* The URL's path, normalised: starts with '/', no trailing '/', no
     * query or fragment; "/v1" when the URL has none. The client's path
     * /v1/REST goes upstream as base_path + /REST (docs/conf-reference.md). */
    char base_path[CONF_BASE_PATH_MAX];
} conf_server_t;

/* An upstream of kind engine: the in-process GGUF model (model/). */
typedef struct conf_engine {
    char *model;         /* GGUF file; NULL = not an engine (servers: instead) */
    int64_t threads;     /* compute threads, 1 (the proxy keeps a core) */
    int64_t context;     /* tokens per sequence, 4096 */
    int64_t max_queue;   /* requests waiting behind the running one, 8; over it: next tier */
    char *system_prompt; /* default system message (cached state); NULL = Qwen's own */
    int64_t max_batch;   /* requests generated at once, 8 */
} conf_engine_t;

typedef struct conf_upstream {
    char *name; /* the map key under upstreams: */
    int line;
    conf_server_t *servers;
    size_t nservers;
    int balance;                   /* conf_balance_t */
    char *api_key_env;             /* env var holding the upstream API key; NULL = none */
    char *tls_ca_file;             /* tls: { ca_file } for https:// servers; NULL = the
                                      system's default store; relative to the cwd */
    int64_t keepalive;             /* idle keep-alive connections per server per worker, 10000 */
    int64_t keepalive_timeout_ms;  /* an idle one closes after this, 4s */
    int64_t connect_timeout_ms;    /* timeouts: { connect: 2s, */
    int64_t first_byte_timeout_ms; /*             first_byte: 15s, */
    int64_t total_timeout_ms;      /*             total: 60s } */
    int64_t max_fails;    /* breaker: consecutive failures; 0 = fallback.circuit.failures */
    int64_t eject_ms;     /* breaker: open this long; 0 = fallback.circuit.cooldown */
    conf_engine_t engine; /* engine: { model, ... } instead of servers */
    char **command;       /* a model server sluice starts and supervises; NULL = none */
    size_t ncommand;
} conf_upstream_t;

/* ---- routing simple requests to the local model ------------------------- */

typedef struct conf_routing {
    bool local_first;         /* requests matching the rules go to fallback.local first */
    int64_t max_prompt_chars; /* ... when the prompt has at most this many code points, 400 */
    int64_t max_turns;        /* ... and at most this many user turns, 2 */
    char *intent;             /* ... or the last user message matches this PCRE2; NULL = none */
    char *auto_model;         /* model "auto": local when the rules match, else this model */
} conf_routing_t;

/* ---- fault injection (fallback/), global and per model ----------------- */

/* Envoy-style drills. At the root every field has a value; under a model
 * -1 (delay: 0) means "not set here: the root's value". */
typedef struct conf_fault {
    int64_t abort_percent; /* requests answered abort_status instead of forwarded, 0..100 */
    int64_t abort_status;  /* 503 */
    int64_t delay_percent; /* requests held for delay before forwarding, 0..100 */
    int64_t delay_ms;      /* 0 */
    bool header;           /* root only: honour X-Sluice-Fault with the admin key, true */
} conf_fault_t;

/* models.<name>.queue: whether template-answered requests are queued. */
typedef enum conf_queue_mode {
    CONF_QUEUE_INHERIT = 0, /* fallback.queue.enabled decides */
    CONF_QUEUE_ON,
    CONF_QUEUE_OFF,
} conf_queue_mode_t;

/* ---- response cache (cache/), global and per model ---------------------- */

typedef enum conf_cache_mode {
    CONF_CACHE_INHERIT = 0, /* cache: decides */
    CONF_CACHE_ON,
    CONF_CACHE_OFF,
} conf_cache_mode_t;

typedef enum conf_cache_scope {
    CONF_CACHE_SCOPE_INHERIT = 0, /* models only: cache.scope */
    CONF_CACHE_SCOPE_USER,        /* the token's sub is part of the key */
    CONF_CACHE_SCOPE_GLOBAL,
} conf_cache_scope_t;

/* models.<name>.cache: unset (inherit / 0 / NULL) = the cache: value. */
typedef struct conf_model_cache {
    int enabled;              /* conf_cache_mode_t */
    int semantic;             /* conf_cache_mode_t */
    int scope;                /* conf_cache_scope_t */
    int64_t ttl_ms;           /* 0 = cache.ttl */
    int64_t max_entry_bytes;  /* 0 = cache.max_entry_bytes */
    char *max_temperature;    /* NULL = cache.max_temperature */
    double max_temperature_v; /* derived from max_temperature when set */
} conf_model_cache_t;

typedef struct conf_cache_semantic {
    bool enabled;           /* default for models, false */
    char *embed_model;      /* a key under models serving /v1/embeddings; NULL = off */
    char *threshold;        /* cosine bound, "0.95" */
    double threshold_v;     /* derived */
    int64_t deadline_ms;    /* the embedding call's deadline, 50ms */
    int64_t max_entries;    /* per partition, 10000 */
    int64_t max_partitions; /* 1024 */
    int64_t max_bytes;      /* memory of the whole index, 256m */
    bool multi_turn;        /* embed requests with several user turns too, false */
} conf_cache_semantic_t;

typedef struct conf_cache {
    bool enabled;             /* default for models, false */
    int64_t ttl_ms;           /* 1h */
    int scope;                /* 0 user, 1 global (no inherit here), user */
    char *max_temperature;    /* "0" */
    double max_temperature_v; /* derived */
    int64_t max_entry_bytes;  /* 256k */
    int64_t max_bytes;        /* in-process store, 64m */
    bool charge_tokens;       /* a hit charges the token budget its usage, true */
    conf_cache_semantic_t semantic;
} conf_cache_t;

/* ---- models (routing) --------------------------------------------------- */

typedef struct conf_model {
    char *name; /* the map key: the name clients send */
    int line;
    char *upstream;     /* must name an upstream */
    char *served;       /* the upstream's served name (alias target); NULL = same as name */
    conf_fault_t fault; /* per-model drill; -1 fields = the root fault's */
    int queue;          /* conf_queue_mode_t */
    conf_model_cache_t cache;
    int64_t default_max_tokens; /* max_tokens added when the client sends none; 0 = the cap */
} conf_model_t;

/* ---- SSE relay ---------------------------------------------------------- */

typedef struct conf_sse {
    int64_t ping_interval_ms; /* 0 = off; ": ping" before the first event */
    int64_t max_event_bytes;  /* an event larger than this fails the stream, 1m */
    int64_t buffer_bytes;     /* per-stream high watermark toward the client, 256k */
} conf_sse_t;

/* ---- gzip of answers ------------------------------------------------------ */

typedef struct conf_gzip {
    bool enabled;      /* true: when the client's Accept-Encoding allows */
    int64_t min_bytes; /* answers smaller than this go as they are, 1k */
    int64_t level;     /* zlib level 1..9, 6 */
} conf_gzip_t;

/* ---- logging ------------------------------------------------------------ */

typedef struct conf_log {
    char *access; /* "stdout", "off", or a file path */
    char *level;  /* debug | info | warn | error */
    /* sl_log_limited: one line per key per interval, 10s */
    int64_t repeat_interval_ms;
    char *error; /* "stderr" or a file path (the error log; SIGUSR1 reopens it) */
    int user;    /* conf_log_user_t: the token's sub in the access log */
} conf_log_t;

typedef enum conf_log_user {
    CONF_LOG_USER_HASH = 0, /* HMAC-SHA256 of the sub (default) */
    CONF_LOG_USER_PLAIN,
    CONF_LOG_USER_OFF,
} conf_log_user_t;

/* ---- rate limits and token budgets (ratelimit/) -------------------------- */

/* One set of limits; 0 = no limit. In an override, -1 = not set there (the
 * per_user value applies). */
typedef struct conf_rl_limits {
    int64_t requests_per_minute;
    int64_t concurrent; /* requests in flight at once */
    int64_t tokens_per_minute;
    int64_t tokens_per_day;
} conf_rl_limits_t;

typedef struct conf_rl_override {
    char *name; /* the map key: a user (the token's sub), or "client:ID" */
    int line;
    conf_rl_limits_t limits;
} conf_rl_override_t;

typedef enum conf_store_error {
    CONF_STORE_ERROR_ALLOW = 0, /* Redis down or late: let the request through (counted) */
    CONF_STORE_ERROR_DENY,      /* refuse it */
    CONF_STORE_ERROR_LOCAL,     /* decide with this instance's in-process limits */
} conf_store_error_t;

typedef struct conf_ratelimit {
    conf_rl_limits_t per_user;
    conf_rl_limits_t per_ip; /* only requests_per_minute is a key here */
    int64_t max_tokens;      /* the max_tokens clamp, 2048 */
    int on_store_error;      /* conf_store_error_t */
    conf_rl_override_t *overrides;
    size_t noverrides;
    char **trusted_proxies; /* CIDRs whose X-Forwarded-For is believed */
    size_t ntrusted_proxies;
    int64_t max_keys;  /* in-process table size cap (users + IPs), 100000 */
    bool redis_leases; /* leased local quotas for busy request-only keys, true */
} conf_ratelimit_t;

/* ---- redis (shared state across instances) ------------------------------ */

typedef struct conf_redis {
    char *url;          /* redis://[:password@]host[:port][/db]; NULL = no Redis */
    int64_t timeout_ms; /* per-call deadline, 50ms */
} conf_redis_t;

/* ---- tokens and request signatures (auth/) ------------------------------- */

typedef enum conf_auth_alg {
    CONF_AUTH_HS256 = 0,
    CONF_AUTH_RS256,
    CONF_AUTH_ES256,
} conf_auth_alg_t;

typedef struct conf_auth_key {
    char *kid;        /* unique among keys */
    int alg;          /* conf_auth_alg_t, pinned: a token's header must name it */
    char *secret_env; /* HS256: env var of the secret (>= 32 bytes; "base64url:..." decoded) */
    char *public_key; /* RS256/ES256: PEM public key file */
    int line;
} conf_auth_key_t;

typedef struct conf_auth_client {
    char *id;
    char *secret_env; /* env var of the client secret (>= 16 bytes) */
    int line;
} conf_auth_client_t;

typedef struct conf_auth_tokens {
    char *issuer;            /* NULL = iss not checked; minted tokens carry it */
    char *audience;          /* NULL = aud not checked */
    int64_t ttl_ms;          /* minted tokens, 15m */
    int64_t max_lifetime_ms; /* cap on exp - iat, 1h */
    int64_t leeway_ms;       /* clock skew on exp/nbf/iat, 30s, at most 60s */
    conf_auth_key_t *keys;   /* none = auth is off */
    size_t nkeys;
} conf_auth_tokens_t;

typedef struct conf_auth_signing {
    bool required;            /* true */
    char *secret_env;         /* env var of the signing secret (>= 32 bytes) */
    int64_t window_ms;        /* +- on X-Sluice-Timestamp, 300s */
    int64_t nonce_memory;     /* bytes for the in-process nonce store, 128m */
    bool refuse_before_start; /* refuse timestamps not after the store's start, true */
} conf_auth_signing_t;

typedef struct conf_auth_store_error {
    int nonces;      /* conf_store_error_t (allow | deny), deny */
    int revocations; /* conf_store_error_t (allow | deny), deny */
} conf_auth_store_error_t;

typedef struct conf_auth {
    bool required; /* a token is needed on the guarded routes, true */
    conf_auth_tokens_t tokens;
    conf_auth_client_t *clients;
    size_t nclients;
    conf_auth_signing_t signing;
    char *admin_key_env; /* env var of the admin bearer key; NULL = revoke API off */
    conf_auth_store_error_t on_store_error;
} conf_auth_t;

/* ---- content filters (filters/) ----------------------------------------- */

/* Enum orders match filters/filters.h (flt_action_t and friends). */
typedef enum conf_filter_action {
    CONF_FILTER_BLOCK = 0, /* prompt: 400 content_filter; answer: stop the stream */
    CONF_FILTER_MASK,      /* replace the match with filters.mask */
    CONF_FILTER_LOG,       /* count it only */
} conf_filter_action_t;

typedef struct conf_filter_words {
    char *file; /* UTF-8 word list, one per line, `#` comments; relative to the cwd */
    int action; /* conf_filter_action_t */
    char *name; /* rule name in metrics; NULL = the file's base name */
    int line;
} conf_filter_words_t;

typedef struct conf_filter_regex {
    char *name;    /* rule name in metrics, unique */
    char *pattern; /* PCRE2, UTF mode, must not match the empty string */
    int action;    /* conf_filter_action_t */
    int line;
} conf_filter_regex_t;

typedef struct conf_filters_input {
    int64_t max_chars;      /* per user message, code points; 8000; 0 = no limit */
    int on_overflow;        /* 0 reject, 1 truncate */
    int64_t keep_turns;     /* last N user turns; 10; 0 = all */
    char *system_prompt;    /* NULL = none */
    int system_prompt_mode; /* 0 prepend, 1 replace */
} conf_filters_input_t;

typedef struct conf_filters_regex_limits {
    int64_t match;      /* pcre2 match limit, 100000 */
    int64_t depth;      /* pcre2 depth limit, 10000 */
    int64_t heap_bytes; /* pcre2 heap limit, 4m */
    int on_limit;       /* 0 match (the rule's action), 1 nomatch */
} conf_filters_regex_limits_t;

typedef struct conf_filters {
    conf_filters_input_t input;
    conf_filter_words_t *words;
    size_t nwords;
    conf_filter_regex_t *regex;
    size_t nregex;
    char *mask;  /* "***" */
    bool output; /* filter answers too, true */
    conf_filters_regex_limits_t regex_limits;
    int64_t holdback_max; /* bytes of answer text held per choice at most, 4k */
} conf_filters_t;

/* ---- generic shapes for later sections ---------------------------------- */

/* A string -> string map (YAML mapping of scalars), kept in file order, as
 * `conf_kv_t *x; size_t nx;`. A list of strings is `char **x; size_t nx;`. */
typedef struct conf_kv {
    char *key;
    char *value;
    int line;
} conf_kv_t;

/* ---- the fallback chain (fallback/) ------------------------------------- */

typedef struct conf_fb_retry {
    int64_t attempts;         /* retries after the first try, 1; 0 = none */
    int64_t backoff_ms;       /* first retry's delay, doubled per retry, jittered; 100ms */
    int64_t backoff_max_ms;   /* cap on a delay, Retry-After included; 2s */
    int64_t budget_percent;   /* retries <= this % of requests in the window; 20 */
    int64_t budget_window_ms; /* the sliding window; 10s */
    int64_t budget_min;       /* retries a window always allows (quiet hours); 0 */
} conf_fb_retry_t;

typedef struct conf_fb_circuit {
    int64_t failures;        /* consecutive failures that open it; 5; 0 = off */
    int64_t failure_percent; /* failure ratio over the window that opens it; 50; 0 = off */
    int64_t min_requests;    /* ... once the window holds this many results; 20 */
    int64_t window_ms;       /* 10s */
    int64_t cooldown_ms;     /* open this long, then half-open; 30s */
    int64_t probes;          /* half-open: requests let through; all must succeed; 1 */
} conf_fb_circuit_t;

typedef struct conf_fb_local {
    char *upstream; /* pool standing in for the on-device model; NULL = no local tier */
} conf_fb_local_t;

typedef struct conf_fb_template {
    bool enabled;     /* true */
    char *text;       /* the default text */
    conf_kv_t *texts; /* language tag ("en", "en-GB") -> text, chosen by Accept-Language */
    size_t ntexts;
    char *json; /* JSON modes' content (a JSON object); NULL = {"error":"unavailable",...} */
} conf_fb_template_t;

typedef enum conf_queue_store {
    CONF_QUEUE_STORE_AUTO = 0, /* redis when redis.url is set, else journal */
    CONF_QUEUE_STORE_JOURNAL,
    CONF_QUEUE_STORE_REDIS,
} conf_queue_store_t;

typedef struct conf_fb_queue {
    bool enabled;           /* false */
    int store;              /* conf_queue_store_t */
    char *dir;              /* journal directory, "var/queue" */
    int64_t max_attempts;   /* resends, then dead letter; 20 */
    int64_t max_age_ms;     /* a request not delivered by then is dead-lettered; 24h */
    int64_t backoff_ms;     /* first resend's delay, doubled per attempt; 1s */
    int64_t backoff_max_ms; /* 5m */
    int64_t lease_ms;       /* a taken item is another worker's again after this; 2m */
    int64_t keep_ms;        /* results (and dead letters) kept after they end; 24h */
    int64_t max_pending;    /* accepts beyond this are refused; 100000 */
} conf_fb_queue_t;

typedef struct conf_fb_idem {
    bool enabled;               /* true */
    int64_t ttl_ms;             /* a completed key is replayed this long; 24h */
    int64_t inflight_ttl_ms;    /* an in-flight mark is forgotten after this; 5m */
    int64_t max_entries;        /* in-process table cap; 100000 */
    int64_t max_response_bytes; /* larger answers are not kept for replay; 1m */
} conf_fb_idem_t;

typedef struct conf_fallback {
    conf_fb_retry_t retry;
    conf_fb_circuit_t circuit;
    conf_fb_local_t local;
    conf_fb_template_t tmpl; /* the YAML key `template` */
    conf_fb_queue_t queue;
    conf_fb_idem_t idempotency;
} conf_fallback_t;

/* ---- the whole file ----------------------------------------------------- */

struct conf_index; /* where each key was set (conf.c), for conf_locate() */

typedef struct conf {
    char *path; /* the file it came from */
    struct conf_index *index;
    char **include; /* include: patterns of the main file (conf.d/NAME.yaml) */
    size_t ninclude;

    conf_listen_t *listen;
    size_t nlisten;
    conf_admin_t admin;
    int64_t workers;             /* "auto" = 0 = number of cores */
    int64_t shutdown_timeout_ms; /* SIGTERM drain deadline, 30s */
    conf_limits_t limits;
    conf_upstream_t *upstreams;
    size_t nupstreams;
    conf_model_t *models;
    size_t nmodels;
    conf_sse_t sse;
    conf_gzip_t gzip;
    char **passthrough; /* extra OpenAI paths proxied with auth and limits: "/v1/x" or "/v1/x/" */
    size_t npassthrough;
    conf_log_t log;
    conf_ratelimit_t ratelimit;
    conf_redis_t redis;
    conf_auth_t auth;
    conf_filters_t filters;
    conf_fallback_t fallback;
    conf_fault_t fault;
    conf_routing_t routing;
    conf_cache_t cache;
    conf_http2_t http2;
} conf_t;

/* ---- API ------------------------------------------------------------------ */

/* Loads and checks `path`. On error returns NULL and writes one line to err:
 * "FILE:LINE: KEY.PATH: what is wrong" (e.g. "conf/sluice.yaml:12:
 * upstreams.main.timeouts.connect: expected a duration, got \"2x\""). Unknown
 * keys, wrong types, values out of bounds, missing required keys and broken
 * references (a model naming an unknown upstream) are all errors. */
conf_t *conf_load(const char *path, char *err, size_t errlen) SL_WUR;

/* The same from a string; `name` stands in for the file name in errors.
 * include: is refused here (a string has no directory, and a fuzzer must
 * not make the loader read files). */
conf_t *conf_load_string(const char *yaml, size_t len, const char *name, char *err,
                         size_t errlen) SL_WUR;

void conf_free(conf_t *c);

/* Where sluice looks for its conf when no -c is given. */
#define CONF_DEFAULT_PATH "/etc/sluice/sluice.yaml"

/* Like conf_load(), for `sluice -t`: on error err receives every error in
 * the file and the files it includes, one "FILE:LINE: KEY: message" per
 * line ('\n' between lines, up to errlen), and *nerrors their count. */
conf_t *conf_load_all(const char *path, char *err, size_t errlen, size_t *nerrors) SL_WUR;

/* For errors found after loading by other modules ("FILE: auth:
 * auth.signing.secret_env: environment variable X is not set"): writes msg
 * to out as "FILE:LINE: ..." where LINE is where its deepest key path (or
 * the nearest enclosing section, item or entry) was set in `path` or a file
 * it includes, so such errors carry a line like the loader's own. Reloads
 * `path` to find it (the conf given to the runtime is gone by then). */
void conf_locate(const char *path, const char *msg, char *out, size_t outlen);

/* Lookup helpers; NULL when absent. */
const conf_upstream_t *conf_upstream_find(const conf_t *c, const char *name);
const conf_model_t *conf_model_find(const conf_t *c, const char *name);

/* Reload check: 0 when every key that is not reloadable has the same value
 * in both; otherwise -1 and err names the first key that differs
 * ("listen: changed; needs a restart"). */
int conf_reload_check(const conf_t *old, const conf_t *neu, char *err, size_t errlen) SL_WUR;

/* Prints the reference of every key (Markdown table: key, type, default,
 * bounds, reloadable, meaning), generated from the table. */
void conf_reference_print(FILE *out);

/* Value parsers, exposed for tests and for the few callers that parse
 * durations/sizes from elsewhere (command-line flags). 0 ok, -1 bad. */
int conf_parse_duration_ms(const char *s, int64_t *out) SL_WUR;
int conf_parse_size(const char *s, int64_t *out) SL_WUR;

#endif
