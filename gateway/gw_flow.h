/*
 * gw_flow.h — a request's way to its upstream attempt (flow.c): the
 * pre-route hooks, the route's handler, and for the proxied routes the
 * model route and the post-route hooks.
 */
#ifndef GW_FLOW_H
#define GW_FLOW_H

#include <jansson.h>

#include "common/sl.h"
#include "gateway/gw_types.h"

/* Runs the pre-route hooks, then r->handler (the route's). */
void gw_proxy_start(gw_req_t *r);
/* The handler of the proxied routes: the body parsed, the model routed to
 * its pool, the post-route hooks, then the upstream attempt. */
void gw_proxy_route(gw_req_t *r);
/* A pending hook finished: go on with the request. */
void gw_proxy_resume(gw_req_t *r);

/* The body as a jansson tree, parsed now if it was not yet (the hot
 * proxied path reads the scanner's facts instead, r->scan): for the
 * consumers that need structure (engine, templates, queue, cache keys,
 * filters' edits). Edits recorded so far are in it. Borrowed; NULL when
 * out of memory or the body is not a JSON object. */
json_t *gw_req_json(gw_req_t *r);

/* Edits of a chat/completions body, on r->scan's splices (and on the tree
 * too when it was built), else on the tree (then serialised again). -1:
 * out of memory. key: a top-level member holding an integer. */
int gw_req_set_int(gw_req_t *r, const char *key, int64_t v) SL_WUR;
/* stream_options.include_usage made true. */
int gw_req_set_include_usage(gw_req_t *r) SL_WUR;

#endif
