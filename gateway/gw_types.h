/*
 * gw_types.h — the gateway's forward typedefs and small enums, and nothing
 * else (HAProxy's "-t.h" idea): any gateway header may include it, so that a
 * header can name a type of a higher component without including that
 * component. Struct definitions live in the header of the component that
 * owns them:
 *
 *   gw_server.h   process: workers, listeners, signals, reload, drain
 *   gw_worker.h   one thread and event_base; deferred frees; its mailbox
 *   gw_conn.h     a client connection (framing, deadlines, keep-alive)
 *   gw_route.h    the route table
 *   gw_req.h      a request, its local answers, its access-log line
 *   gw_hook.h     the hook chain (policy modules' adapters)
 *   gw_proxy.h    the request flow on the proxied routes, attempts, relay
 *   gw_fallback.h the fallback chain (retry, local tier, template, queue)
 *   gw_upstream.h upstream connections and server choice
 *   gw_rt.h       the runtime built from one conf (pools, models, TLS)
 *   gw_metrics.h  the gateway's metric series
 *   gw_wio.h, http1.h, sse.h, sb.h, gw_tls.h, gw_balance.h, gw_sup.h: leaves
 *
 * Layering (checked by `make check-layers`, see scripts/check-layers):
 * server → worker → conn → route → request/hooks → proxy/attempt → upstream
 * → runtime and leaves. A header includes only headers of its own layer or
 * below; a call upward goes through a stored callback.
 */
#ifndef GW_TYPES_H
#define GW_TYPES_H

#include <stdbool.h>
#include <stdint.h>

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
typedef struct gw_listen_rt gw_listen_rt_t;
typedef struct gw_model_rt gw_model_rt_t;
typedef struct gw_wio gw_wio_t;
typedef struct gw_attempt gw_attempt_t;

typedef enum gw_conn_phase {
    GW_PHASE_IDLE = 0, /* keep-alive wait for the next request */
    GW_PHASE_HEAD,     /* reading a request head */
    GW_PHASE_BODY,     /* reading a request body */
    GW_PHASE_BUSY,     /* a request is being served */
    GW_PHASE_CLOSING,  /* flushing the last response, then close */
} gw_conn_phase_t;

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
    GW_ROUTE_RESPONSES,   /* /v1/responses and /v1/responses/{id}[/cancel] */
    GW_ROUTE_PASSTHROUGH, /* a conf passthrough: path */
    GW_ROUTE_COUNT
} gw_route_t;

/* Hooks compiled in, at most (gw_hook.h); runtimes and workers keep a state
 * slot per hook. */
#define GW_MAX_HOOKS 8

/* A string literal and its length, for (pointer, length) calls, and prefix
 * tests on counted strings: lengths of literals are never counted by hand.
 * A case-insensitive prefix test is http1.h's GW_HTTP_PREFIX_CI. */
#define GW_LIT(s)            (s), (sizeof(s) - 1)
#define GW_PREFIX(p, n, lit) ((n) >= sizeof(lit) - 1 && memcmp((p), (lit), sizeof(lit) - 1) == 0)

#endif
