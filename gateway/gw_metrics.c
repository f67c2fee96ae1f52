/*
 * gw_metrics.c — the gateway's metrics, registered once at startup. Hot
 * series (requests by route and status class, durations, byte counters)
 * are looked up here and cached, so the request path only does atomic adds.
 * Every label has a bounded set of values: routes and classes are enums,
 * upstream names come from the conf, error kinds and parse-error reasons
 * are static strings.
 */
#include <stdio.h>

#include "common/procstat.h"
#include "common/version.h"
#include "gateway/body_store.h"
#include "gateway/gw_llm.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_types.h"

gw_metrics_t gw_m;
gw_reload_state_t gw_reload_state;

void gw_metrics_init(const char *(*route_name)(gw_route_t r))
{
    static const char *const classes[] = {"other", "1xx", "2xx", "3xx", "4xx", "5xx"};
    static const char *const protocols[] = {"http1", "h2"};
    sl_metric_t *req = sl_metric_register("sluice_requests_total",
                                          "Client requests by route, status class and protocol.",
                                          SL_METRIC_COUNTER, "route,code,protocol", NULL, 0);
    sl_metric_t *dur =
        sl_metric_register("sluice_request_duration_seconds",
                           "Time from the first byte of a request to the end of its response.",
                           SL_METRIC_HISTOGRAM, "route", NULL, 0);
    for (int r = 0; r < GW_ROUTE_COUNT; r++) {
        for (int k = 1; k < 6; k++) {
            for (int p = 0; p < 2; p++) {
                const char *v[3] = {route_name((gw_route_t)r), classes[k], protocols[p]};
                gw_m.requests[r][k][p] = sl_metric_series(req, v);
            }
        }
        for (int p = 0; p < 2; p++) {
            const char *v499[3] = {route_name((gw_route_t)r), "499", protocols[p]};
            gw_m.requests_499[r][p] = sl_metric_series(req, v499);
        }
        gw_m.duration[r] = sl_metric_series1(dur, route_name((gw_route_t)r));
    }
    gw_m.conns_active = sl_metric_gauge0("sluice_connections_active", "Open client connections.");
    gw_m.streams_active = sl_metric_gauge0("sluice_streams_active", "SSE streams being relayed.");
    sl_metric_t *bytes = sl_metric_register("sluice_bytes_total", "Bytes moved, by direction.",
                                            SL_METRIC_COUNTER, "direction", NULL, 0);
    gw_m.bytes_client_in = sl_metric_series1(bytes, "client_in");
    gw_m.bytes_client_out = sl_metric_series1(bytes, "client_out");
    gw_m.bytes_up_in = sl_metric_series1(bytes, "upstream_in");
    gw_m.bytes_up_out = sl_metric_series1(bytes, "upstream_out");
    gw_m.up_errors = sl_metric_register("sluice_upstream_errors_total",
                                        "Upstream failures by upstream and kind.",
                                        SL_METRIC_COUNTER, "upstream,kind", NULL, 0);
    gw_m.up_conns = sl_metric_register(
        "sluice_upstream_connections_total",
        "Upstream connections used for a request, new or reused from the keep-alive pool.",
        SL_METRIC_COUNTER, "upstream,reused", NULL, 0);
    gw_m.up_idle =
        sl_metric_register("sluice_upstream_connections_idle",
                           "Idle keep-alive upstream connections in the pools, all workers.",
                           SL_METRIC_GAUGE, "upstream", NULL, 0);
    gw_m.up_idle_closed = sl_metric_register(
        "sluice_upstream_idle_closed_total",
        "Idle keep-alive upstream connections closed after keepalive_timeout (the pool "
        "shrinking to the recent need).",
        SL_METRIC_COUNTER, "upstream", NULL, 0);
    gw_m.req_structs_new = sl_metric_counter0(
        "sluice_request_structs_allocated_total",
        "Request structs allocated anew, not taken from the worker's cache of them.");
    gw_m.req_cached = sl_metric_gauge0(
        "sluice_request_structs_cached",
        "Request structs the workers keep for reuse (as of each worker's last tick).");
    gw_m.flt_streams_cached = sl_metric_gauge0(
        "sluice_filter_streams_cached",
        "Streamed requests' answer-filter state the workers keep for reuse (as of each worker's "
        "last tick).");
    gw_m.req_structs_freed = sl_metric_counter0(
        "sluice_request_structs_freed_total",
        "Request structs the workers' ticks freed from their caches (unused for a whole tick, "
        "or all of them after a peak).");
    gw_m.h2_mem_cached = sl_metric_gauge0(
        "sluice_http2_mem_cached_bytes",
        "Bytes of free blocks the workers keep for nghttp2's sessions (as of each worker's last "
        "tick).");
    gw_m.h2_mem_in_use = sl_metric_gauge0(
        "sluice_http2_mem_blocks_in_use",
        "Blocks nghttp2's sessions hold from the workers' allocator (as of each worker's last "
        "tick): 0 once every HTTP/2 connection has closed.");
    gw_m.scan_shape_hits = sl_metric_counter0(
        "sluice_body_shape_hits_total",
        "Request bodies read from a kept JSON shape instead of parsed (body scan; as of each "
        "worker's last tick).");
    gw_m.scan_shape_misses = sl_metric_counter0(
        "sluice_body_shape_misses_total",
        "Small request bodies that matched no kept JSON shape and were parsed (as of each "
        "worker's last tick).");
    gw_m.malloc_trims = sl_metric_counter0(
        "sluice_malloc_trims_total",
        "malloc_trim(0) calls: after the connection count fell from a peak, and after reloads.");
    gw_m.malloc_trim_bytes = sl_metric_counter0(
        "sluice_malloc_trim_released_bytes_total",
        "Resident memory given back to the system by malloc_trim(0) (RSS before - after).");
    gw_m.up_ttfb = sl_metric_register(
        "sluice_upstream_ttfb_seconds",
        "Time from sending a request upstream to the first byte of its response headers (not "
        "the first token: sluice_time_to_first_token_seconds).",
        SL_METRIC_HISTOGRAM, "upstream", NULL, 0);
    gw_m.parse_errors = sl_metric_register("sluice_http_parse_errors_total",
                                           "Client requests rejected by the HTTP parser.",
                                           SL_METRIC_COUNTER, "reason", NULL, 0);
    sl_metric_t *rt = sl_metric_register("sluice_route_total",
                                         "Proxied chat requests by where routing sent them "
                                         "first (local: the small model).",
                                         SL_METRIC_COUNTER, "target", NULL, 0);
    gw_m.route_local = sl_metric_series1(rt, "local");
    gw_m.route_main = sl_metric_series1(rt, "main");
    gw_m.done_added = sl_metric_counter0(
        "sluice_stream_done_added_total",
        "Streams the upstream closed without data: [DONE] after every choice had its "
        "finish_reason: complete, so sluice ended them with [DONE].");
    gw_m.reloads =
        sl_metric_register("sluice_config_reloads_total", "Configuration reloads by result.",
                           SL_METRIC_COUNTER, "result", NULL, 0);
    gw_m.h2_events =
        sl_metric_register("sluice_http2_events_total",
                           "HTTP/2 connections, streams, and what the hardening refused, by event.",
                           SL_METRIC_COUNTER, "event", NULL, 0);
    const char *bv[2] = {sl_version(), sl_version_commit()};
    sl_gauge_set(sl_metric_series(sl_metric_register("sluice_build_info",
                                                     "sluice's version and commit (always 1).",
                                                     SL_METRIC_GAUGE, "version,commit", NULL, 0),
                                  bv),
                 1);
    gw_m.reload_ok =
        sl_metric_gauge0("sluice_config_last_reload_successful",
                         "1 if the last reload (or the start) succeeded, 0 if it failed.");
    gw_m.reload_ts = sl_metric_gauge0("sluice_config_last_reload_success_timestamp_seconds",
                                      "Unix time of the last successful load (the start counts).");
    gw_llm_metrics_init();
    sl_procstat_register(); /* process_* at every scrape */
    gw_body_store_register();
    /* The start is the first successful load. */
    if (!gw_reload_state.generation) {
        double now = (double)sl_wall_ms() / 1e3;
        gw_reload_state.generation = 1;
        gw_reload_state.started_time = now;
        gw_reload_state.started_ns = sl_now_ns();
        gw_reload_state.last_success = now;
        gw_reload_state.last_ok = true;
        sl_gauge_set(gw_m.reload_ok, 1);
        sl_gauge_set(gw_m.reload_ts, sl_wall_s());
    }
}

void gw_metrics_reload(bool ok, const char *err)
{
    sl_counter_add(sl_metric_series1(gw_m.reloads, ok ? "ok" : "error"), 1);
    double now = (double)sl_wall_ms() / 1e3;
    gw_reload_state.last_time = now;
    gw_reload_state.last_ok = ok;
    snprintf(gw_reload_state.last_error, sizeof(gw_reload_state.last_error), "%s",
             ok || !err ? "" : err);
    sl_gauge_set(gw_m.reload_ok, ok ? 1 : 0);
    if (ok) {
        gw_reload_state.generation++;
        gw_reload_state.last_success = now;
        sl_gauge_set(gw_m.reload_ts, sl_wall_s());
    }
}

void gw_metrics_upstream_error(const gw_pool_rt_t *p, const char *kind)
{
    const char *v[2] = {p->name, kind};
    sl_counter_add(sl_metric_series(gw_m.up_errors, v), 1);
}
