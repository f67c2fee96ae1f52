/*
 * metrics.h — a process-wide Prometheus registry: counters, gauges and
 * histograms with a fixed set of label names and a bounded number of label
 * value sets per metric.
 *
 * Usage: register a metric once (at startup or config time; registering the
 * same name again returns the same metric, so reloads do not duplicate it),
 * look up a series for a label-value tuple and keep the pointer (lookups
 * take a lock; updates are lock-free atomics, safe from any thread).
 * Series live as long as the process. Each metric holds at most
 * SL_METRIC_MAX_SERIES series; beyond that every lookup of a new tuple gets
 * one shared series whose label values are all "_overflow", so a bug or a
 * hostile input can never grow memory without bound.
 */
#ifndef SL_METRICS_H
#define SL_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/sl.h"

#define SL_METRIC_MAX_SERIES  512
#define SL_METRIC_MAX_LABELS  4
#define SL_METRIC_MAX_BUCKETS 24

typedef enum sl_metric_type {
    SL_METRIC_COUNTER = 0,
    SL_METRIC_GAUGE,
    SL_METRIC_HISTOGRAM,
} sl_metric_type_t;

typedef struct sl_metric sl_metric_t;
typedef struct sl_mseries sl_mseries_t;

/* Bucket bounds (seconds) chosen for LLM latencies, the contract of
 * docs/metrics.md: time to first token spans a cached short prompt (50 ms)
 * to a long prefill on a busy GPU (a minute); inter-token gaps span a fast
 * decoder (5 ms/token) to a stalled stream (5 s). */
extern const double sl_metrics_ttft_buckets[];
extern const size_t sl_metrics_ttft_nbuckets;
extern const double sl_metrics_itl_buckets[];
extern const size_t sl_metrics_itl_nbuckets;
/* The default set (NULL buckets at registration): HTTP latencies. */
extern const double sl_metrics_default_buckets[];
extern const size_t sl_metrics_default_nbuckets;

/* name: full metric name ("sluice_requests_total"); labels: comma-separated
 * label names ("route,code") or NULL; buckets: histogram upper bounds in
 * ascending order (NULL = a default latency set in seconds). Never NULL:
 * a bad definition is a programming bug and aborts. */
sl_metric_t *sl_metric_register(const char *name, const char *help, sl_metric_type_t type,
                                const char *labels, const double *buckets, size_t nbuckets);

/* The series for these label values (as many as the metric has label names;
 * NULL for a metric without labels). Never NULL. */
sl_mseries_t *sl_metric_series(sl_metric_t *m, const char *const *values);

/* Shorthands for metrics without labels or with one label. */
sl_mseries_t *sl_metric_series0(sl_metric_t *m);
sl_mseries_t *sl_metric_series1(sl_metric_t *m, const char *value);
/* A counter or gauge without labels, registered, and its one series. */
sl_mseries_t *sl_metric_counter0(const char *name, const char *help);
sl_mseries_t *sl_metric_gauge0(const char *name, const char *help);

void sl_counter_add(sl_mseries_t *s, uint64_t n);
void sl_gauge_add(sl_mseries_t *s, int64_t delta);
void sl_gauge_set(sl_mseries_t *s, int64_t v);
void sl_histogram_observe(sl_mseries_t *s, double v);

/* Current values, for tests and for /readyz-style decisions. */
uint64_t sl_counter_value(const sl_mseries_t *s);
int64_t sl_gauge_value(const sl_mseries_t *s);
uint64_t sl_histogram_count(const sl_mseries_t *s);

/* d in the shortest form that parses back to the same double ("0.05",
 * "1", "2.5e-05", "+Inf"), as histogram `le` labels and sums are written.
 * size >= 32 always suffices. */
void sl_metrics_format_double(char *buf, size_t size, double d);

/* A collector writes metrics computed at scrape time (e.g. read from /proc)
 * in text format after the registry's own. Registering the same function
 * twice is a no-op; at most SL_METRIC_MAX_COLLECTORS (a programming bug
 * beyond: aborts). It runs under the registry lock: it must not call back
 * into the registry. */
#define SL_METRIC_MAX_COLLECTORS 8
typedef void (*sl_metrics_collector_fn)(FILE *f);
void sl_metrics_add_collector(sl_metrics_collector_fn fn);

/* The whole registry in Prometheus text format 0.0.4. Returns a malloc'd
 * NUL-terminated string (caller frees) and its length in *len; NULL on OOM. */
char *sl_metrics_render(size_t *len);

#endif
