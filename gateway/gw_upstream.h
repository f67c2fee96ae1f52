/*
 * gw_upstream.h — connections to upstream servers (upstream.c): choosing a
 * server of a pool (balancer + circuit breakers), the per-worker idle
 * keep-alive pools, connect/TLS, and handing a connection's events to its
 * current user through stored callbacks (the proxy's attempt), so this layer
 * never calls up into the request.
 */
#ifndef GW_UPSTREAM_H
#define GW_UPSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include <event2/bufferevent.h>
#include <event2/event.h>

#include "common/sl.h"
#include "gateway/gw_types.h"
#include "gateway/gw_wio.h"
#include "gateway/http1.h"

TAILQ_HEAD(gw_upconn_list, gw_upconn);

/* Per worker, per upstream server. */
typedef struct gw_wsrv {
    struct gw_upconn_list idle; /* keep-alive connections ready for reuse */
    size_t nidle;
    int rr_current; /* smooth weighted round-robin state */
} gw_wsrv_t;

/* The direct writer's line first (gw_wio.h), then what a request on it
 * reads and writes (the idle list's link: taking a kept connection off its
 * head writes the next one's), then the rest. Allocated line-aligned
 * (upstream.c). */
struct gw_upconn {
    gw_wio_t wio;
    gw_worker_t *w;
    gw_srv_rt_t *srv;
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
    TAILQ_ENTRY(gw_upconn) link;
    uint64_t generation; /* runtime generation it belongs to */
    int connect_errno;   /* an immediate connect failure's errno, for the log */
};

_Static_assert(offsetof(struct gw_upconn, wio) == 0, "gw_upconn: its gw_wio_t first (gw_wio.h)");

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
/* An idle connection to srv (when allow_reuse), or a new one (connecting),
 * counted in srv->active until gw_upstream_release. NULL on error. */
gw_upconn_t *gw_upstream_get(gw_worker_t *w, gw_srv_rt_t *srv, bool allow_reuse);
/* Done with u (no longer in srv->active): back to the idle pool when
 * reusable, else closed. */
void gw_upstream_release(gw_upconn_t *u, bool reusable);
/* Start reading (and writing, while connecting) for a request. */
void gw_upstream_arm(gw_upconn_t *u);
void gw_upstream_close(gw_upconn_t *u);
/* The worker's tick: closes idle connections older than their pool's
 * keepalive_timeout (the coldest first). */
void gw_upstream_tick(gw_worker_t *w, int64_t now_ms);
/* Worker's runtime changed: close idle connections of the old one. */
void gw_upstream_worker_reset(gw_worker_t *w);
/* One error-log line about srv, at warn: "upstream POOL URL: MESSAGE",
 * rate-limited per server and cause (sl_log_limited's key "URL cause"), so
 * a failure that repeats during an outage costs one line per interval. */
void gw_upstream_log(const gw_srv_rt_t *srv, const char *cause, const char *fmt, ...)
    SL_PRINTF(3, 4);

#endif
