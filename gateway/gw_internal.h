/*
 * gw_internal.h — the gateway's own structures, shared by the gateway sources only.
 * Nothing outside gateway/ includes this file.
 *
 * The shape of a running sluice:
 *
 *   gw_server_t (process)  ── holds the current gw_rt_t (runtime built from one
 *        │                    conf_t: upstream pools, models, TLS contexts)
 *        ├─ main thread: signals, admin listener, reload, drain
 *        └─ gw_worker_t × N: one event_base each; accept on the shared
 *             listening sockets; owns its client connections (gw_conn_t),
 *             its idle upstream connections (gw_upconn_t) per server, and
 *             the requests (gw_req_t) in flight on them.
 *
 * A request holds a reference to the runtime it started with, so a reload
 * never changes a request half-way. Objects are freed at a safe point
 * (gw_worker_defer_free), never inside their own callbacks.
 */
#ifndef GW_INTERNAL_H
#define GW_INTERNAL_H

#include <netinet/in.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <jansson.h>

#include "common/metrics.h"
#include "common/sl.h"
#include "conf/conf.h"
#include "gateway/gw_hook.h"
#include "gateway/http1.h"
#include "gateway/sse.h"

struct auth;
struct auth_stores;
struct auth_pending;
struct flt_ruleset;
struct rl;
struct rl_worker;
struct rl_pending;
struct rl_decision;
struct sl_redis;
struct fb_breaker;
struct fb_breakers;
struct fb_budget;
struct fb_tmpl;
struct fb_queue;
struct fb_qworker;
struct fb_idem;
struct fb_idem_worker;
struct fb_call;
struct gw_resender;
struct gw_ejob;
struct gw_mail;
typedef struct gw_qjob gw_qjob_t;
struct mdl_engine;
typedef struct gw_server gw_server_t;
typedef struct gw_shared gw_shared_t;
typedef struct gw_sup gw_sup_t;
typedef struct gw_worker gw_worker_t;
typedef struct gw_rt gw_rt_t;
typedef struct gw_conn gw_conn_t;
typedef struct gw_req gw_req_t;
typedef struct gw_upconn gw_upconn_t;
typedef struct gw_pool_rt gw_pool_rt_t;
typedef struct gw_srv_rt gw_srv_rt_t;

/* ---- runtime (immutable once built, refcounted) ------------------------- */

/* One upstream server. The mutable part (failures, ejection, active count)
 * is shared by all workers through atomics. */
struct gw_srv_rt {
    gw_pool_rt_t *pool;
    size_t index; /* 0..rt->nservers-1, indexes per-worker arrays */
    char *url;
    char *host;        /* for SNI, certificate checks */
    char *host_header; /* "host" or "host:port" */
    int port;
    bool https;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    int weight;
    struct fb_breaker *breaker; /* circuit breaker (kept across reloads) */
    _Atomic int active;         /* requests in flight, all workers */
    sl_mseries_t *m_conn_new, *m_conn_reused;
};

struct gw_pool_rt {
    const conf_upstream_t *conf;
    const char *name;
    gw_srv_rt_t **servers;
    size_t nservers;
    char *auth_header; /* "Authorization: Bearer ...\r\n" or NULL */
    size_t auth_header_len;
    SSL_CTX *ssl_ctx; /* for https:// servers */
    sl_mseries_t *m_ttfb;
    conf_fb_circuit_t circuit; /* fallback.circuit with this pool's max_fails/eject */
    struct fb_budget *budget;  /* retry budget (kept across reloads) */
    struct mdl_engine *engine; /* kind engine: the in-process model (no servers) */
    gw_sup_t *sup;             /* a supervised command (supervise.c), or NULL */
};

typedef struct gw_model_rt {
    const char *name;   /* client-facing */
    const char *served; /* upstream's name */
    bool alias;         /* served differs from name: the body is rewritten */
    gw_pool_rt_t *pool;
    const conf_model_t *conf; /* fault:, queue: */
} gw_model_rt_t;

typedef struct gw_listen_rt gw_listen_rt_t;
struct gw_listen_rt {
    size_t index;  /* conf->listen[index]; TLS context in rt->listen_ssl[index] */
    char *address; /* a copy: listeners outlive the conf they came from */
    int fd;        /* shared by every worker */
    bool admin;    /* the admin listener */
};

struct gw_rt {
    _Atomic int refs;
    uint64_t generation;
    conf_t *conf;
    gw_pool_rt_t *pools;
    size_t npools;
    gw_srv_rt_t *servers; /* all servers of all pools */
    size_t nservers;
    gw_model_rt_t *models;
    size_t nmodels;
    char *models_json; /* the GET /v1/models body */
    size_t models_json_len;
    SSL_CTX **listen_ssl;             /* per conf listen item (NULL when plain) */
    struct auth *auth;                /* NULL when auth is off */
    struct flt_ruleset *filters;      /* content filters (reference held) */
    struct fb_tmpl *tmpl;             /* template replies (NULL when off) */
    gw_pool_rt_t *local;              /* fallback.local: the local tier's pool, or NULL */
    const gw_model_rt_t *auto_model;  /* routing.auto_model */
    struct pcre2_real_code_8 *intent; /* routing.intent, compiled */
    gw_shared_t *shared;              /* what this runtime borrowed engines from */
    char *admin_key;                  /* auth.admin_key_env's value (fault header), or NULL */
};

/* What outlives a reload and the runtimes built on it: the auth stores, the
 * breakers and the retry budgets (per upstream name). Main thread only
 * while building; the objects themselves are thread-safe. */
struct gw_shared {
    struct auth_stores *auth_stores;
    struct fb_breakers *breakers;
    struct gw_budget_slot {
        char *name;
        struct fb_budget *budget;
    } * budgets;
    size_t nbudgets;
    struct gw_engine_slot *engines; /* engine_gw.c */
};

gw_shared_t *gw_shared_new(void);
void gw_shared_free(gw_shared_t *sh);

/* Builds the runtime for c (takes ownership of c): resolves server names,
 * reads API keys from the environment, loads TLS material, builds the auth
 * verifier (on the process-wide stores, borrowed) and the filter rules.
 * NULL with err filled on failure (c is freed then). */
gw_rt_t *gw_rt_new(conf_t *c, gw_shared_t *sh, char *err, size_t errlen) SL_WUR;
gw_rt_t *gw_rt_ref(gw_rt_t *rt);
void gw_rt_unref(gw_rt_t *rt);
const gw_model_rt_t *gw_rt_model(const gw_rt_t *rt, const char *name, size_t len);

/* ---- per-worker upstream state ------------------------------------------ */

TAILQ_HEAD(gw_upconn_list, gw_upconn);
TAILQ_HEAD(gw_conn_list, gw_conn);

/* wio.c: direct writes for a plain-socket bufferevent (see there). */
typedef struct gw_wio {
    gw_worker_t *w;
    struct bufferevent *bev;
    struct evbuffer_cb_entry *cb;
    bool direct;                  /* we write; EV_WRITE armed only while the kernel is full */
    bool armed;                   /* EV_WRITE is armed (libevent writes) */
    bool queued;                  /* on the worker's flush list */
    void (*drained)(void *owner); /* everything was written */
    void (*failed)(void *owner, short what); /* a write failed */
    void *owner;
    TAILQ_ENTRY(gw_wio) link;
} gw_wio_t;
TAILQ_HEAD(gw_wio_list, gw_wio);

void gw_wio_init(gw_wio_t *io, gw_worker_t *w, struct bufferevent *bev, bool direct,
                 void (*drained)(void *), void (*failed)(void *, short), void *owner);
void gw_wio_set_direct(gw_wio_t *io, bool direct);
void gw_wio_fini(gw_wio_t *io);
/* From the bufferevent's write callback: libevent wrote. */
void gw_wio_written(gw_wio_t *io);
void gw_wio_flush_cb(evutil_socket_t fd, short what, void *arg);

typedef struct gw_wsrv {
    struct gw_upconn_list idle; /* keep-alive connections ready for reuse */
    size_t nidle;
    int rr_current; /* smooth weighted round-robin state */
} gw_wsrv_t;

/* ---- the worker -------------------------------------------------------- */

typedef struct gw_lslot {
    gw_worker_t *w;
    struct gw_listen_rt *l;
} gw_lslot_t;

struct gw_worker {
    gw_server_t *srv;
    int id;
    bool is_main; /* the main thread's pseudo-worker (admin listener) */
    pthread_t thread;
    struct event_base *base;
    gw_rt_t *rt;     /* current runtime (reference held) */
    gw_wsrv_t *wsrv; /* [rt->nservers] */
    size_t nwsrv;
    struct evconnlistener **listeners;
    gw_lslot_t *lslots;
    size_t nlisteners;
    struct event *notify_ev; /* another thread asks (an eventfd): reload / drain / stop,
                                and the mailbox below */
    int notify_fd;
    pthread_mutex_t mail_lock;
    struct gw_mail *mail_head, **mail_tail;
    struct event *accept_ev; /* re-enable accepting after EMFILE */
    struct event *reap_ev;   /* deferred frees */
    struct event *flush_ev;  /* direct writes (wio.c) */
    struct gw_wio_list flushq;
    struct gw_conn_list conns;
    size_t nconns;
    struct rl_worker *rlw;        /* rate limits: this thread's handle (NULL = none) */
    struct sl_redis *redis;       /* this thread's Redis client for auth (NULL = none) */
    struct fb_qworker *qw;        /* the durable queue, this thread's handle */
    struct fb_idem_worker *iw;    /* idempotency store, this thread's handle */
    struct gw_resender *resender; /* worker 0: resends queued requests */
    bool accept_paused;
    bool draining;
    uint64_t rng;
    /* deferred frees */
    void **reap;
    size_t nreap, capreap;
    void (**reap_fn)(void *);
};

void gw_worker_defer_free(gw_worker_t *w, void (*fn)(void *), void *obj);
/* Runs fn(arg) on w's thread, soon; callable from any thread. libevent runs
 * without its own locks (each base belongs to one thread), so this is the
 * only way in from outside. -1 on OOM. */
int gw_worker_post(gw_worker_t *w, void (*fn)(void *), void *arg);
uint64_t gw_worker_rand(gw_worker_t *w);
/* A connection closed: accepting may resume. */
void gw_worker_conn_closed(gw_worker_t *w);

/* ---- client connection and request -------------------------------------- */

typedef enum gw_conn_phase {
    GW_PHASE_IDLE = 0, /* keep-alive wait for the next request */
    GW_PHASE_HEAD,     /* reading a request head */
    GW_PHASE_BODY,     /* reading a request body */
    GW_PHASE_BUSY,     /* a request is being served */
    GW_PHASE_CLOSING,  /* flushing the last response, then close */
} gw_conn_phase_t;

struct gw_conn {
    gw_worker_t *w;
    struct bufferevent *bev;
    gw_wio_t wio;
    bool tls;
    bool admin;
    bool closed; /* freed at the next safe point */
    char peer[64];
    gw_conn_phase_t phase;
    gw_http_parser_t *parser;
    gw_req_t *req;
    gw_req_t *spare; /* the last request's struct, kept for the next one */
    struct event *timer;
    int64_t deadline_ms; /* the current deadline (monotonic), 0 = none */
    int64_t armed_ms;    /* when the timer is set to fire, 0 = not armed */
    unsigned nrequests;
    bool close_after; /* Connection: close after this response */
    TAILQ_ENTRY(gw_conn) link;
};

typedef enum gw_route {
    GW_ROUTE_CHAT = 0,
    GW_ROUTE_COMPLETIONS,
    GW_ROUTE_EMBEDDINGS,
    GW_ROUTE_MODELS,
    GW_ROUTE_HEALTH,
    GW_ROUTE_AUTH_TOKEN,
    GW_ROUTE_REQUESTS,
    GW_ROUTE_ADMIN,
    GW_ROUTE_OTHER,
    GW_ROUTE_COUNT
} gw_route_t;

struct gw_req {
    gw_conn_t *c;
    gw_rt_t *rt;
    char id[40];
    int64_t start_ns;
    gw_route_t route;
    struct evbuffer *body; /* the client's body; reused for retries */
    json_t *json;          /* parsed body (proxied routes) */
    const gw_model_rt_t *model;
    bool stream; /* client asked "stream": true */

    /* upstream side */
    gw_pool_rt_t *pool;
    gw_srv_rt_t *server;
    gw_upconn_t *up;
    int attempts;
    struct event *up_timer;
    int64_t t_sent_ns, t_first_byte_ns;
    int64_t deadline_total_ms, deadline_fb_ms;
    int upstatus;
    bool resp_sse;      /* upstream answered text/event-stream */
    bool head_sent;     /* our response head is out */
    bool chunked_out;   /* our response body uses chunked */
    bool upstream_done; /* upstream response complete */
    gw_sse_t *sse;
    bool pinged;
    bool got_event;
    struct event *ping_ev;
    bool paused_upstream; /* backpressure: upstream reads off */

    /* hooks and what they learned */
    gw_hooks_req_t hooks;
    char user[256];      /* the token's sub, "" without auth */
    char client_id[64];  /* the token's client, "" when unknown */
    char client_ip[48];  /* the client's address (X-Forwarded-For from trusted proxies) */
    bool body_dirty;     /* json was edited: serialise it again before sending */
    char body_add[48];   /* else: a member to add to the client's bytes ("k":v) */
    bool body_add_first; /* ... into an object that had no member */
    bool ev_hooks;       /* SSE events go through the hook chain */
    bool buffer_body;    /* a whole JSON answer is gathered for on_body hooks */
    bool stop_stream;    /* a hook ended the stream (finish after the parser returns) */
    struct evbuffer *resp_body;
    struct rl_pending *token_pending; /* /v1/auth/token waiting for its limit */
    struct fb_call *fb_call;          /* a queue accept / lookup waiting for Redis */
    gw_qjob_t *qjob;                  /* a journal accept on the queue thread */

    /* the fallback chain */
    int admit;                /* fb_admit_t of the current attempt */
    int retries;              /* retries made on the current pool */
    int fault_status;         /* injected abort: the model's pool "answers" this */
    gw_srv_rt_t *avoid;       /* retry elsewhere than this server when possible */
    struct event *retry_ev;   /* backoff before the next attempt */
    char retry_after[40];     /* the failed answer's Retry-After */
    struct evbuffer *capture; /* the answer's body, for the idempotency store */
    size_t capture_max;
    const char *fallback; /* "local" / "template": X-Sluice-Fallback */
    const char *ctype;    /* the answer's content type (static), for the idempotency store */
    bool routed_local;    /* routing sent it to the local pool first (X-Sluice-Route) */
    bool tried_local;     /* the local pool had its turn (routing or the local tier) */
    bool local_stream;    /* an in-process stream is open (streams_active) */
    struct gw_ejob *ejob; /* the engine's work for this request */
    bool client_usage;    /* the client itself asked for stream usage */
    char queued_id[40];   /* X-Sluice-Request-Id */
    struct auth_pending *revoke_pending; /* /admin/revoke waiting for Redis */

    /* result */
    int status;
    uint64_t bytes_in, bytes_out;
    const char *error_kind; /* for logs/metrics, static string */
};

/* conn.c */
void gw_conn_accept(gw_worker_t *w, int fd, const struct sockaddr *sa, int salen,
                    gw_listen_rt_t *l);
void gw_conn_close(gw_conn_t *c);
/* The current request is finished: log, count, then keep-alive or close. */
void gw_conn_req_done(gw_conn_t *c);
/* Drain: close if idle, else close after the current response. */
void gw_conn_drain(gw_conn_t *c);

/* respond.c: local answers */
void gw_respond_json(gw_req_t *r, int status, const char *body, size_t len,
                     const char *extra_headers);
void gw_respond_error(gw_req_t *r, int status, const char *type, const char *code,
                      const char *message);
/* An error before a request object exists (parse errors): answer and close. */
void gw_conn_respond_error(gw_conn_t *c, int status, const char *code, const char *message);
/* Serialises {"error":{...}} into a malloc'd string. */
char *gw_error_json(const char *type, const char *code, const char *message, size_t *len);

/* "Date: ...\r\n" for this second (thread-local cache). */
const char *gw_date_header(size_t *len);

/* route.c */
void gw_route_dispatch(gw_req_t *r);
gw_route_t gw_route_of(const char *path, size_t len);
const char *gw_route_name(gw_route_t r);

/* proxy.c */
void gw_proxy_start(gw_req_t *r);
/* Client went away or conn is closing: stop everything upstream. */
void gw_proxy_abort(gw_req_t *r);
/* hook_fallback.c: the chain after an attempt failed with nothing sent to
 * the client. failure: fb_failure_t; status: the upstream's (or injected)
 * status for FB_FAIL_STATUS. Returns true when the chain took the request
 * over (a retry, the local tier, a template); false: the caller answers
 * with its error (or relays the upstream's 5xx). */
bool gw_fb_after_failure(gw_req_t *r, int failure, int status);
/* The same in two steps, for a 5xx answer that is relayed when the chain
 * has nothing better: what the chain would do (GW_FB_NONE: nothing; a
 * retry takes its budget here), then do it. */
enum {
    GW_FB_NONE = 0,
    GW_FB_RETRY,
    GW_FB_RETRY_ELSEWHERE,
    GW_FB_MAIN,
    GW_FB_LOCAL,
    GW_FB_TEMPLATE
};
int gw_fb_decide(gw_req_t *r, int failure, int status, int64_t *delay_ms);
void gw_fb_apply(gw_req_t *r, int action, int64_t delay_ms);
/* proxy.c: the next attempt (now, or after delay_ms) on r->pool. */
void gw_proxy_next_attempt(gw_req_t *r, int64_t delay_ms);
/* The attempt's end for its breaker: 1 ok, 0 failed, -1 cancelled. */
void gw_fb_attempt_end(gw_req_t *r, int outcome);
/* GET /v1/requests/{id}, after the pre-route hooks. */
void gw_fb_requests_route(gw_req_t *r);
/* Per worker: queue and idempotency handles, and worker 0's resender. */
int gw_fb_worker_init(gw_worker_t *w);
void gw_fb_worker_fini(gw_worker_t *w);
/* Process: the queue and idempotency stores (NULL-safe when off). */
int gw_fb_server_init(gw_server_t *s, const conf_t *c, char *err, size_t errlen);
void gw_fb_server_fini(gw_server_t *s);
/* The journal accept thread: the client left (the accept completes anyway);
 * shutdown (after the workers stopped, before their mailboxes close). */
void gw_fb_queue_abort(gw_req_t *r);
void gw_fb_queue_thread_stop(void);
/* Once a second on the main thread: queue maintenance. */
void gw_fb_maintain(gw_server_t *s);
/* Before rendering /metrics: refresh breaker gauges. */
void gw_fb_metrics_refresh(gw_server_t *s);
/* proxy.c: answers made in-process (the engine), through the same hooks. */
void gw_proxy_local_stream_begin(gw_req_t *r);
/* -1: a hook ended the stream (stop generating, then _end). */
int gw_proxy_local_stream_event(gw_req_t *r, const char *data, size_t len);
/* error_code NULL: a clean end (the caller sent [DONE] as an event). */
void gw_proxy_local_stream_end(gw_req_t *r, const char *error_code, const char *error_msg);
void gw_proxy_local_body(gw_req_t *r, json_t *body);
/* engine_gw.c: an attempt on a pool of kind engine. */
void gw_engine_attempt(gw_req_t *r);
void gw_engine_abort(gw_req_t *r);
/* The process-wide engines, by upstream (kept across reloads when
 * unchanged). */
struct mdl_engine *gw_engine_get(gw_shared_t *sh, const conf_upstream_t *cu, char *err,
                                 size_t errlen);
void gw_engine_put(gw_shared_t *sh, struct mdl_engine *e);
/* Shutdown: stop every engine (their last callbacks reach the mailboxes);
 * then free the registry. */
void gw_engines_stop(gw_shared_t *sh);
void gw_engines_free(gw_shared_t *sh);
/* supervise.c: model servers sluice starts (upstreams.<name>.command). */
int gw_sup_init(struct event_base *base, const gw_rt_t *rt, char *err, size_t errlen);
void gw_sup_shutdown(void);
gw_sup_t *gw_sup_find(const char *upstream);
/* True when s is NULL (nothing supervised) or its server answers. */
bool gw_sup_healthy(const gw_sup_t *s);
/* Local answers with any content type. */
void gw_respond_body(gw_req_t *r, int status, const char *ctype, const char *body, size_t len,
                     const char *extra_headers);
/* A pending hook finished: go on with the request. */
void gw_proxy_resume(gw_req_t *r);
/* Client output drained below the low watermark. */
void gw_proxy_client_drained(gw_req_t *r);

/* upstream.c */
struct gw_upconn {
    gw_worker_t *w;
    gw_srv_rt_t *srv;
    gw_wio_t wio;
    uint64_t generation; /* runtime generation it belongs to */
    struct bufferevent *bev;
    gw_http_parser_t *parser;
    /* Who uses it now (NULL while idle), and where its events go. */
    void *owner;
    void (*on_read)(void *owner);
    void (*on_event)(void *owner, short what);
    bool connected;
    bool reused;
    bool closed;
    unsigned nreq;
    int64_t idle_since_ms;
    struct event *idle_timer;
    TAILQ_ENTRY(gw_upconn) link;
};

/* Picks a server of pool (balancer + circuit breakers), avoiding `avoid`
 * when another is eligible, and takes the breaker's admission (*admit,
 * fb_admit_t). NULL when none is in service. */
gw_srv_rt_t *gw_upstream_pick(gw_worker_t *w, gw_pool_rt_t *pool, const gw_srv_rt_t *avoid,
                              int64_t now_ms, int *admit);
/* A server of pool other than `except` is eligible now. */
bool gw_upstream_other_eligible(const gw_pool_rt_t *pool, const gw_srv_rt_t *except,
                                int64_t now_ms);
/* A server of pool is eligible now. */
bool gw_upstream_any_eligible(const gw_pool_rt_t *pool, int64_t now_ms);
/* An idle connection to srv (when allow_reuse), or a new one (connecting).
 * NULL on error. */
gw_upconn_t *gw_upstream_get(gw_worker_t *w, gw_srv_rt_t *srv, bool allow_reuse);
/* Done with u: back to the idle pool when reusable, else closed. */
void gw_upstream_release(gw_upconn_t *u, bool reusable);
/* Start reading (and writing, while connecting) for a request. */
void gw_upstream_arm(gw_upconn_t *u);
void gw_upstream_close(gw_upconn_t *u);
/* Worker's runtime changed: close idle connections of the old one. */
void gw_upstream_worker_reset(gw_worker_t *w);

/* balance.c — pure: smooth weighted round-robin and least-connections. */
typedef struct gw_balance_item {
    int weight;
    int active;    /* least_conn */
    bool eligible; /* not ejected */
    int *current;  /* rr state, per worker */
} gw_balance_item_t;
/* Index of the chosen item, or -1 when none is eligible. */
int gw_balance_pick(gw_balance_item_t *items, size_t n, int balance, uint64_t tiebreak);

/* tls.c */
SSL_CTX *gw_tls_server_ctx(const char *cert, const char *key, char *err, size_t errlen);
SSL_CTX *gw_tls_client_ctx(const char *ca_file, char *err, size_t errlen);
/* One-line description of the last OpenSSL error (for logs). */
const char *gw_tls_last_error(char *buf, size_t len);

/* metrics (gw_metrics.c) */
typedef struct gw_metrics {
    sl_mseries_t *requests[GW_ROUTE_COUNT][6]; /* code class 1..5, [0] other */
    sl_mseries_t *duration[GW_ROUTE_COUNT];
    sl_mseries_t *conns_active, *streams_active;
    sl_mseries_t *bytes_client_in, *bytes_client_out, *bytes_up_in, *bytes_up_out;
    sl_metric_t *up_errors;                 /* {upstream,kind} */
    sl_metric_t *up_conns;                  /* {upstream,reused} */
    sl_metric_t *up_ttfb;                   /* {upstream} */
    sl_metric_t *parse_errors;              /* {reason} */
    sl_metric_t *reloads;                   /* {result} */
    sl_mseries_t *route_local, *route_main; /* sluice_route_total{target} */
} gw_metrics_t;
extern gw_metrics_t gw_m;
void gw_metrics_init(void);
void gw_metrics_upstream_error(const gw_pool_rt_t *p, const char *kind);

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
/* route.c: GET /v1/models[/id] once the pre-route hooks passed. */
void gw_route_models(gw_req_t *r);

/* accesslog.c */
int gw_accesslog_open(const char *target, char *err, size_t errlen);
void gw_accesslog_write(const gw_req_t *r);

/* server.c */
struct gw_server {
    gw_rt_t *_Atomic rt; /* current runtime */
    pthread_mutex_t rt_lock;
    gw_worker_t *workers;
    int nworkers;
    gw_worker_t main;
    gw_listen_rt_t *listens;
    size_t nlistens;
    _Atomic bool draining;
    _Atomic bool ready;
    int64_t drain_deadline_ms;
    char *conf_path;
    struct rl *rl;          /* rate limiter: lives across reloads (its state must) */
    gw_shared_t *shared;    /* auth stores, breakers, budgets: across reloads too */
    struct fb_queue *queue; /* durable queue (NULL when no model queues) */
    struct fb_idem *idem;   /* idempotency store (NULL when off) */
    struct event *maint_ev; /* queue maintenance, once a second */
    struct event *sig_hup, *sig_term, *sig_int, *drain_timer, *drain_poll;
};
/* For /readyz: started and not draining. */
bool gw_server_ready(void);
/* A new reference to the current runtime. */
gw_rt_t *gw_server_rt(gw_server_t *s);
int gw_server_run(const char *conf_path);

#endif
