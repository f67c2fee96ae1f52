/*
 * hook_filters.c — the content-filter adapter. (being wired)
 */
#include "gateway/gw_hook.h"
#include "gateway/gw_internal.h"

const gw_hook_t gw_hook_filters = {
    .name = "filters",
    .pre_route = false,
};
