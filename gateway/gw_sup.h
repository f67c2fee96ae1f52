/*
 * gw_sup.h — model servers sluice starts and watches itself
 * (upstreams.<name>.command; supervise.c).
 */
#ifndef GW_SUP_H
#define GW_SUP_H

#include <stdbool.h>
#include <stddef.h>

#include <event2/event.h>

#include "gateway/gw_types.h"

int gw_sup_init(struct event_base *base, const gw_rt_t *rt, char *err, size_t errlen);
void gw_sup_shutdown(void);
gw_sup_t *gw_sup_find(const char *upstream);
/* True when s is NULL (nothing supervised) or its server answers. */
bool gw_sup_healthy(const gw_sup_t *s);
/* Restarts so far (/admin/state); 0 for NULL. */
long long gw_sup_restarts(const gw_sup_t *s);

#endif
