/*
 * gw_flow.h — a request's way to its upstream attempt (flow.c): the
 * pre-route hooks, the route's handler, and for the proxied routes the
 * model route and the post-route hooks.
 */
#ifndef GW_FLOW_H
#define GW_FLOW_H

#include "gateway/gw_types.h"

/* Runs the pre-route hooks, then r->handler (the route's). */
void gw_proxy_start(gw_req_t *r);
/* The handler of the proxied routes: the body parsed, the model routed to
 * its pool, the post-route hooks, then the upstream attempt. */
void gw_proxy_route(gw_req_t *r);
/* A pending hook finished: go on with the request. */
void gw_proxy_resume(gw_req_t *r);

#endif
