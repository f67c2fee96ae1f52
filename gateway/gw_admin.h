/*
 * gw_admin.h — the admin listener's state endpoints (admin.c): GET
 * /admin/state (the JSON of docs/metrics.md) and GET / (the status page).
 */
#ifndef GW_ADMIN_H
#define GW_ADMIN_H

#include "gateway/gw_types.h"

void gw_admin_state_route(gw_req_t *r);
void gw_admin_status_page_route(gw_req_t *r);

#endif
