/*
 * gw_metrics.h — the gateway's own metric series (gw_metrics.c), registered
 * once per process; the policy modules register theirs in their folders.
 */
#ifndef GW_METRICS_H
#define GW_METRICS_H

#include "common/metrics.h"
#include "gateway/gw_types.h"

typedef struct gw_metrics {
    sl_mseries_t *requests[GW_ROUTE_COUNT][6][2];  /* code class 1..5 ([0] other), protocol */
    sl_mseries_t *requests_499[GW_ROUTE_COUNT][2]; /* the client left: code="499", protocol */
    sl_mseries_t *reload_ok, *reload_ts;           /* sluice_config_last_reload_* */
    sl_mseries_t *duration[GW_ROUTE_COUNT];
    sl_mseries_t *conns_active, *streams_active;
    sl_mseries_t *bytes_client_in, *bytes_client_out, *bytes_up_in, *bytes_up_out;
    sl_metric_t *up_errors;                 /* {upstream,kind} */
    sl_metric_t *up_conns;                  /* {upstream,reused} */
    sl_metric_t *up_idle;                   /* {upstream}: idle keep-alive now */
    sl_metric_t *up_idle_closed;            /* {upstream}: closed after keepalive_timeout */
    sl_mseries_t *req_structs_new;          /* request structs allocated (conn.c) */
    sl_mseries_t *req_cached;               /* request structs in the workers' caches */
    sl_mseries_t *flt_streams_cached;       /* streamed answers filter state kept */
    sl_mseries_t *req_structs_freed;        /* ... freed by the caches' ticks (conn.c) */
    sl_mseries_t *h2_mem_cached;            /* nghttp2 blocks' bytes in the free lists (h2_mem.c) */
    sl_mseries_t *h2_mem_in_use;            /* nghttp2 blocks held by sessions (h2_mem.c) */
    sl_mseries_t *malloc_trims;             /* malloc_trim(0) calls (worker.c) */
    sl_mseries_t *scan_shape_hits;          /* bodies answered from a kept shape (worker.c) */
    sl_mseries_t *scan_shape_misses;        /* ... that could have been and were parsed */
    sl_mseries_t *malloc_trim_bytes;        /* RSS they gave back */
    sl_metric_t *up_ttfb;                   /* {upstream} */
    sl_metric_t *parse_errors;              /* {reason} */
    sl_metric_t *reloads;                   /* {result} */
    sl_metric_t *h2_events;                 /* sluice_http2_events_total{event} */
    sl_mseries_t *route_local, *route_main; /* sluice_route_total{target} */
    sl_mseries_t *done_added; /* complete streams the upstream closed without [DONE] */
} gw_metrics_t;
extern gw_metrics_t gw_m;
/* Registers the series; route_name labels the per-route ones (the route
 * table is a layer above, so it is passed in rather than called). */
void gw_metrics_init(const char *(*route_name)(gw_route_t r));
void gw_metrics_upstream_error(const gw_pool_rt_t *p, const char *kind) SL_COLD;

/* The load history /admin/state shows; main thread only (start, SIGHUP,
 * the admin listener). */
typedef struct gw_reload_state {
    uint64_t generation; /* 1 at start, +1 per successful reload */
    double started_time; /* Unix time of the start */
    int64_t started_ns;  /* monotonic, for the uptime */
    double last_time;    /* last reload attempt, 0: never */
    double last_success; /* last successful load (the start counts) */
    bool last_ok;
    char last_error[512];
} gw_reload_state_t;
extern gw_reload_state_t gw_reload_state;
/* A reload's result (err NULL when it succeeded): the counter, the two
 * gauges and gw_reload_state. */
void gw_metrics_reload(bool ok, const char *err);

#endif
