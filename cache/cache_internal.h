/*
 * cache_internal.h — what the files of cache/ share and nothing else sees:
 * the metrics, the entry's representation and the kernel table.
 */
#ifndef SL_CACHE_INTERNAL_H
#define SL_CACHE_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache/cache.h"
#include "common/metrics.h"

/* The most choices (n) an entry keeps; more is not cached. */
#define CACHE_MAX_CHOICES 8
/* The most tool calls per choice an entry keeps. */
#define CACHE_MAX_TOOL_CALLS 64

/* An entry is its canonical chat.completion JSON (choices with message and
 * finish_reason; usage; id; created; model; system_fingerprint) plus the
 * wall ms it was stored. Its encoded form (what the stores keep) also
 * carries the three replays pre-rendered — the JSON body, the SSE body and
 * the SSE body with the usage chunk — so a hit is sent without parsing or
 * rendering anything (the replay keeps the stored id and created; Age
 * says how old it is). A decoded entry parses its JSON only when an
 * accessor needs it (obj NULL until then). */
struct cache_entry {
    json_t *obj;
    int64_t stored_ms;
    char *raw; /* the encoded form, owning the slices below; NULL when built here */
    const char *ejson, *body, *sse, *sseu;
    size_t ejson_len, body_len, sse_len, sseu_len;
};

/* The entry's JSON, parsed on first use (NULL when it does not parse). */
json_t *cache_entry_obj(const cache_entry_t *e);

/* Metrics (registered once, process-wide). */
typedef struct cache_metrics {
    sl_metric_t *requests;    /* sluice_cache_requests_total{model,result} hit|miss|bypass */
    sl_metric_t *bypasses;    /* sluice_cache_bypass_total{model,reason} */
    sl_metric_t *stores;      /* sluice_cache_stores_total{model,result} stored|<taint> */
    sl_metric_t *entries;     /* sluice_cache_entries{model} (in-process store) */
    sl_metric_t *bytes;       /* sluice_cache_bytes{model} (in-process store) */
    sl_metric_t *evictions;   /* sluice_cache_evictions_total */
    sl_metric_t *store_errs;  /* sluice_cache_store_errors_total{op} get|set|sem */
    sl_metric_t *sem_lookups; /* sluice_cache_semantic_lookups_total{model,result} hit|miss */
    sl_metric_t *sem_seconds; /* sluice_cache_semantic_lookup_seconds{model} */
    sl_metric_t *sem_entries; /* sluice_cache_semantic_entries */
} cache_metrics_t;
extern cache_metrics_t cache_m;
void cache_metrics_init(void);

/* Taint bit -> label. */
const char *cache_taint_name(unsigned taint);

/* The dot kernels (dot.c); cache_dot_get() is the one chosen for this
 * CPU, for loops that should not pay the once-check per call. */
typedef int32_t (*cache_dot_fn)(const int8_t *, const int8_t *, size_t);
cache_dot_fn cache_dot_get(void);
/* Test hook: use this kernel ("scalar", "avx2", "avx512vnni"); -1 when the
 * CPU lacks it. Not for use while other threads search. */
int cache_dot_force(const char *name);
/* out[i] = dot(q, rows + i * dim) for n rows, with the chosen kernel. */
void cache_dot_i8_rows(const int8_t *q, const int8_t *rows, size_t dim, size_t n, int32_t *out);
int32_t cache_dot_i8_avx2(const int8_t *a, const int8_t *b, size_t n);
int32_t cache_dot_i8_avx512(const int8_t *a, const int8_t *b, size_t n);

/* Bench and test hook: partitions up to n entries are scanned flat at full
 * dimension (default 2048); SIZE_MAX = always flat, 0 = always two-pass. */
void cache_sem_set_flat_max(cache_sem_t *s, size_t n);

/* Quantises v (dim floats) to unit length, then int8 with one scale: out
 * gets dim bytes, *scale the factor back to unit-length floats. -1 when the
 * vector is zero or not finite. */
int cache_quantise(const float *v, size_t dim, int8_t *out, float *scale);

#endif
