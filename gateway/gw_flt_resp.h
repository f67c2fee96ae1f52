/*
 * gw_flt_resp.h — the content filters over the Responses API
 * (flt_responses.c): its events and answers are translated to the chat
 * shapes filters/ knows, and back. Used by hook_filters.c, whose
 * per-thread cache of streamed requests' filter state is declared at the
 * end.
 */
#ifndef GW_FLT_RESP_H
#define GW_FLT_RESP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/sl_chat.h"
#include "filters/filters.h"
#include "gateway/gw_hook.h"

typedef struct gw_flt_resp gw_flt_resp_t;

gw_flt_resp_t *gw_flt_resp_new(void);
void gw_flt_resp_free(gw_flt_resp_t *x);
/* One event's data through st: output_text deltas filtered (held back,
 * masked; an `error` event with code content_filter on a block), and the
 * full texts of the done / completed events replaced by what was sent. */
gw_ev_rc_t gw_flt_resp_event(gw_flt_resp_t *x, flt_stream_t *st, const char *data, size_t len,
                             gw_payloads_t *out);
/* The same, every event through a jansson tree: the general path
 * gw_flt_resp_event takes for what its byte reader leaves (tests compare
 * the two). */
gw_ev_rc_t gw_flt_resp_event_tree(gw_flt_resp_t *x, flt_stream_t *st, const char *data, size_t len,
                                  gw_payloads_t *out);
/* Forgets this thread's kept delta shapes; the deltas read through one
 * since the last clear (tests). */
void gw_flt_resp_shapes_clear(void);
uint64_t gw_flt_resp_shape_hits(void);
/* The same for the done events' kept shapes. */
void gw_flt_resp_dshapes_clear(void);
uint64_t gw_flt_resp_dshape_hits(void);
/* Events this thread read with yajl since it started (tests: the events
 * passed unread are not counted). */
uint64_t gw_flt_resp_scans(void);
/* A whole response object: each output_text filtered. 0 ok, -1 OOM. */
int gw_flt_resp_body(flt_ruleset_t *rs, json_t *body, bool *modified);
/* The same on the answer's bytes (data[0..len), borrowed): 0 with *out
 * NULL when nothing changes (send it as it came), 0 with *out (malloc'd,
 * *outlen bytes) the answer as gw_flt_resp_body and a compact dump write
 * it; 1 when the tree path must decide (nothing was filtered: JSON this
 * reader leaves to jansson, or a text the chat byte filter leaves to its
 * tree); -1 out of memory. */
int gw_flt_resp_body_bytes(flt_ruleset_t *rs, const char *data, size_t len, char **out,
                           size_t *outlen);
/* The request's input when it is a string: checked as one user message
 * (masks written back). FLT_REQ_* as flt_request_check. */
flt_req_verdict_t gw_flt_resp_request(const flt_ruleset_t *rs, json_t *body, flt_req_result_t *res);
/* The same checks over the body scanner's input (borrowed; NULL when the
 * input is not a string) without a tree and without editing: FLT_REQ_EDIT
 * when the rules would change it (the caller then runs
 * gw_flt_resp_request on the parsed body), else gw_flt_resp_request's
 * verdict and res. */
flt_req_verdict_t gw_flt_resp_request_text(const flt_ruleset_t *rs, const sl_text_t *input,
                                           flt_req_result_t *res);

/* ---- hook_filters.c: a streamed request's filter state, kept for reuse ---- */

/* Entries a thread's cache holds at most (each about 4 KiB at most). */
#define GW_FLT_CACHE_MAX 1024

typedef struct gw_flt gw_flt_t;
/* A streamed request's state for rs (takes a reference to rs), from this
 * thread's cache when it holds one, else new. NULL on OOM. */
gw_flt_t *gw_flt_state_get(flt_ruleset_t *rs);
/* Takes ownership: recycled into the cache (nothing of its answer kept),
 * or freed when the cache is full. */
void gw_flt_state_put(gw_flt_t *s);
/* Its answer filter (borrowed, valid until _put). */
flt_stream_t *gw_flt_state_stream(gw_flt_t *s);
/* The worker's tick, on its thread: frees half of the entries no request
 * took since the last tick (all: every one) and refreshes
 * sluice_filter_streams_cached. Returns how many it freed. */
size_t gw_flt_cache_tick(bool all);
/* Entries this thread's cache holds now. */
size_t gw_flt_cache_held(void);

#endif
