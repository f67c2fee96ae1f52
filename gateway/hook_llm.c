/*
 * hook_llm.c — the LLM metrics' hook, last in the chain: makes every
 * streamed request carry stream_options.include_usage (so the upstream's
 * usage can be counted; the relay reads it in gw_llm_event before any hook)
 * and, when the client did not ask for it, drops or rewrites the usage
 * chunk on the way out so the client sees what it asked for. The ratelimit hook injects the same
 * thing for token budgets and strips it itself: then this one finds the
 * flag already set and leaves the stream alone.
 */
#include <stdlib.h>
#include <string.h>

#include "gateway/body_scan.h"
#include "gateway/gw_flow.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_llm.h"
#include "gateway/gw_req.h"
#include "gateway/gw_types.h"
#include "ratelimit/ratelimit.h"

/* The state of a request whose usage chunk is stripped (on_event runs
 * only for a hook with a state). */
static const char gw_llm_strip = 1;

static gw_hook_rc_t gw_llm_on_request(gw_req_t *r, void **state)
{
    if ((!r->json && !r->scan) || !r->model ||
        (r->route != GW_ROUTE_CHAT && r->route != GW_ROUTE_COMPLETIONS))
        return GW_HOOK_NEXT;
    if (!r->stream)
        return GW_HOOK_NEXT; /* a JSON answer's usage is read from its tail */
    /* A stream needs the hook only to strip what it asked for: the relay
     * reads the events itself (gw_llm_sse_event). */
    if (r->scan) {
        /* the scan's facts: the ratelimit hook's injection updated them */
        if (gw_body_fact(r->scan, GW_F_INCLUDE_USAGE)->kind == SL_J_TRUE)
            return GW_HOOK_NEXT; /* the client, or the ratelimit hook, asked */
        sl_jkind_t so = gw_body_fact(r->scan, GW_F_STREAM_OPTIONS)->kind;
        if (so != SL_J_ABSENT && so != SL_J_OBJECT)
            return GW_HOOK_NEXT; /* the upstream will say what is wrong with it */
    } else {
        json_t *so = json_object_get(r->json, "stream_options");
        if (json_is_true(json_object_get(so, "include_usage")))
            return GW_HOOK_NEXT;
        if (so && !json_is_object(so))
            return GW_HOOK_NEXT;
    }
    /* A splice on the client's bytes (the tree, if one was built, gets it
     * too, for the engine); on the slow path the tree, serialised again. */
    if (gw_req_set_include_usage(r) != 0)
        return GW_HOOK_NEXT; /* no usage then: the metrics add nothing (no guessing) */
    /* The strip keeps nothing between events: a mark, not an allocation,
     * so the request leaves without a calloc (issue #16). */
    *state = (void *)&gw_llm_strip;
    return GW_HOOK_NEXT;
}

static gw_ev_rc_t gw_llm_on_event(gw_req_t *r, void *state, const char *data, size_t len,
                                  gw_payloads_t *out)
{
    /* The relay scanned this event for a usage object already (the same
     * bytes, when no hook before this one replaced them). */
    if (data == r->llm.ev_plain || !gw_llm_has_usage_key(data, len))
        return GW_EV_PASS; /* no usage in it: nothing to strip, no parse */
    char *rw = NULL;
    size_t rwlen = 0;
    (void)state;
    switch (rl_chunk_strip_usage(data, len, &rw, &rwlen)) {
    case RL_CHUNK_DROP:
        return GW_EV_REPLACE; /* nothing pushed: the usage-only chunk is dropped */
    case RL_CHUNK_REWRITE:
        if (gw_payloads_push(out, rw, rwlen) != 0)
            return GW_EV_STOP;
        return GW_EV_REPLACE;
    default:
        return GW_EV_PASS;
    }
}

const gw_hook_t gw_hook_llm = {
    .name = "llm",
    .on_request = gw_llm_on_request,
    .on_event = gw_llm_on_event,
};
