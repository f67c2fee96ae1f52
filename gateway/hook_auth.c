/*
 * hook_auth.c — the auth adapter (tokens and request signatures), first in
 * the chain. (being wired)
 */
#include "gateway/gw_hook.h"
#include "gateway/gw_internal.h"

const gw_hook_t gw_hook_auth = {
    .name = "auth",
    .pre_route = true,
};
