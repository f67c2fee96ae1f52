/*
 * gw_route.h — which handler serves a request (route.c).
 */
#ifndef GW_ROUTE_H
#define GW_ROUTE_H

#include <stddef.h>

#include "gateway/gw_types.h"

/* Finds the request's row in the route table (method, listener, path),
 * answers 404/405 itself, else calls the row's handler, through the
 * pre-route hooks first when the row says so. */
void gw_route_dispatch(gw_req_t *r);
/* The metric label of a route. */
const char *gw_route_name(gw_route_t r);

#endif
