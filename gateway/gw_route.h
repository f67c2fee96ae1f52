/*
 * gw_route.h — which handler serves a request (route.c).
 */
#ifndef GW_ROUTE_H
#define GW_ROUTE_H

#include <stddef.h>

#include "gateway/gw_types.h"

/* route.c */
void gw_route_dispatch(gw_req_t *r);
gw_route_t gw_route_of(const char *path, size_t len);
const char *gw_route_name(gw_route_t r);
/* route.c: GET /v1/models[/id] once the pre-route hooks passed. */
void gw_route_models(gw_req_t *r);

#endif
