/*
 * gw_llm.h — what an LLM operator measures per model (llm_metrics.c): time
 * to the first token, the gaps between tokens, the tokens the upstream
 * reported in its usage, requests by exact status and the tier that
 * answered (docs/metrics.md, "Per-model LLM metrics"). The relay calls in
 * where it sees an event's data, the connection when a request is counted;
 * the per-request figures live in r->llm (also read by the access log).
 */
#ifndef GW_LLM_H
#define GW_LLM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/metrics.h"
#include "gateway/gw_types.h"
#include "gateway/sse.h"

/* Per request, embedded in gw_req_t (zeroed with it). */
typedef struct gw_llm_req {
    int64_t first_token_ns; /* the first content event went out; 0: none yet */
    int64_t last_token_ns;  /* the latest content event */
    double ttft;            /* seconds, -1 when not observed (set with first_token_ns) */
    int64_t prompt_tokens, completion_tokens; /* the upstream's usage */
    bool have_usage;
    sl_mseries_t *itl; /* the model's inter-token series, looked up once */
    char *tail;        /* a JSON answer's last bytes (malloc'd), where its usage is */
    size_t tail_len;
    /* The data the hooks are handed for the event being relayed, when the
     * relay's scan found no usage object in it: hook_llm.c's strip test
     * would scan the same bytes again. NULL between events. */
    const char *ev_plain;
} gw_llm_req_t;

/* Registers the families (from gw_metrics_init). */
void gw_llm_metrics_init(void);
/* One SSE event's data, as the upstream (or the engine) sent it, before
 * the hooks: a content event times TTFT / the gap (at r->ev_ns when set),
 * a usage adds tokens. false when the data holds no usage object (its
 * bytes were scanned for one); true when it does or was not looked at. */
bool gw_llm_event(gw_req_t *r, const char *data, size_t len);
/* The same from an upstream event's raw bytes: a content event is told by
 * a scan (no copy, no parse: the relay's hot path); only an event that
 * carries a usage object is extracted and parsed. false when the raw bytes
 * hold no usage object, hence neither does its data (a match in the data
 * lies within one data line, so in the raw bytes too). */
bool gw_llm_sse_event(gw_req_t *r, const gw_sse_event_t *ev);
/* One pass over an event's bytes (raw or data): true when a `"usage":`
 * holds an object (gw_llm_has_usage_key), *content when a `"content":` or
 * `"text":` holds a non-empty string or `"tool_calls":` a non-empty array
 * (what gw_llm_has_content tells on the tree). */
bool gw_llm_scan_keys(const char *p, size_t n, bool *content);
/* The same for a Responses API event: true when a `"usage":` holds an
 * object, *content when a `"delta":` holds a non-empty string. */
bool gw_llm_resp_scan(const char *p, size_t n, bool *content);
/* Tests: false holds gw_llm_resp_scan to its SSE2 pass (default: AVX2
 * where the CPU has it). Not thread-safe: set before any request. */
void gw_llm_resp_avx2_set(bool on);
/* gw_llm_scan_keys' answer on an event's raw bytes through the thread's
 * kept event shapes (the scan on a miss, which may keep the event's shape:
 * docs/metrics.md, "Kept shapes"). */
bool gw_llm_event_keys(const char *raw, size_t n, bool *content);
/* A usage object's two counts as yajl reads them (closed: the object parsed
 * whole), obj..n from its '{' (what follows is not read); through the
 * thread's kept usage shapes when kept (a miss then keeps its shape). */
typedef struct gw_llm_uread {
    bool closed, have_p, have_c;
    long long pv, cv;
} gw_llm_uread_t;
void gw_llm_usage_read(const char *obj, size_t n, bool kept, gw_llm_uread_t *out);
/* The same with the Responses API's names: input_tokens into the prompt
 * count, output_tokens into the completion count (a kept shape serves only
 * reads of the names it was learnt with). */
void gw_llm_resp_usage_read(const char *obj, size_t n, bool kept, gw_llm_uread_t *out);
/* The thread's kept shapes: how often they served (tests, benches), and
 * dropped. */
typedef struct gw_llm_shape_stats {
    uint64_t u_hits, u_misses, e_hits, e_misses, e_learns;
    uint64_t e_fast; /* of e_hits: through a shape with only its content holes */
} gw_llm_shape_stats_t;
gw_llm_shape_stats_t gw_llm_shape_stats(void);
void gw_llm_shapes_clear(void);
/* Whether an event's data may carry the usage (hook_llm.c's strip test). */
bool gw_llm_has_usage_key(const char *p, size_t n);
/* A whole JSON answer's usage (an answer made in-process). */
void gw_llm_body(gw_req_t *r, const json_t *body);
/* A relayed JSON answer's bytes, in pieces: the last GW_LLM_TAIL bytes are
 * kept, and the usage object found there is counted when the request is
 * (servers put it at the end, after the choices) — the answer itself is
 * never gathered for it. */
#define GW_LLM_TAIL 2048
void gw_llm_body_bytes(gw_req_t *r, const char *p, size_t n);
/* Frees what r->llm holds (the request is freed or reused). */
void gw_llm_req_free(gw_req_t *r);
/* The request is counted (status final, 499 for a client that left) at
 * now_ns: the per-model request and tier counters, TTFT of a non-streamed
 * answer. */
void gw_llm_req_end(gw_req_t *r, int64_t now_ns);
/* The tier that answered ("upstream", "retry", "local", "template",
 * "queue", "error"), for the metric and the access log. */
const char *gw_llm_tier(const gw_req_t *r);
/* At scrape time: gauges read from the runtime (servers in service, the
 * engines' queue and busy, their token counters). Main thread. */
void gw_llm_scrape(const gw_rt_t *rt);
/* A server a request may be sent to now (breaker, supervision). */
bool gw_llm_server_in_service(const gw_pool_rt_t *p, gw_srv_rt_t *s, int64_t now_ms);

#endif
