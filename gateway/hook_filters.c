/*
 * hook_filters.c — the content-filter adapter: request checks on the
 * chat-completions body (shape, length, turns, system prompt, word lists
 * and regexes; 400 content_filter when a block rule matches, and the
 * upstream gets nothing), and the answer filtered as it streams — only the
 * tail that could still become a match is held back (filters/ decides) —
 * or as a whole for non-streamed answers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "filters/filters.h"
#include "gateway/body_scan.h"
#include "gateway/gw_flow.h"
#include "gateway/gw_flt_resp.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_req.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_types.h"

struct gw_flt {
    flt_stream_t *stream; /* answer filtering of a streamed request */
    bool body;            /* a non-streamed answer is filtered whole */
    gw_flt_resp_t *resp;  /* a Responses API stream (flt_responses.c) */
    flt_out_t out;        /* an event's payloads: the array kept across events */
};

/* ---- the per-thread cache of streamed requests' state -----------------------
 *
 * A streamed request with answer rules needs its state (this struct, its
 * flt_stream_t, that one's channel and scratch buffers: about ten blocks).
 * When it ends, the state is recycled (flt_stream_recycle: nothing of the
 * answer stays, the ruleset reference is dropped, buffers past a few KiB
 * are freed) and kept on this thread's LIFO for the next streamed request,
 * which then allocates none of it (issue #16, full-sse). Bounded like the
 * request-struct cache (conn.c): at most GW_FLT_CACHE_MAX entries, each
 * about 4 KiB at most; the worker's tick frees half of those no request
 * took since the tick before, and all of them after a peak and when the
 * thread ends (gw_flt_cache_tick). sluice_filter_streams_cached shows what
 * the workers keep as of their last tick. */

typedef struct gw_flt_cache {
    gw_flt_t *v[GW_FLT_CACHE_MAX];
    size_t n;
    size_t low;   /* fewest held since the last tick */
    size_t shown; /* what the gauge holds for this thread */
} gw_flt_cache_t;
static __thread gw_flt_cache_t gw_flt_cache;

static void gw_flt_state_free(gw_flt_t *s)
{
    flt_stream_free(s->stream);
    gw_flt_resp_free(s->resp);
    flt_out_release(&s->out);
    free(s);
}

gw_flt_t *gw_flt_state_get(flt_ruleset_t *rs)
{
    gw_flt_cache_t *k = &gw_flt_cache;
    if (k->n > 0) {
        gw_flt_t *s = k->v[--k->n];
        if (k->n < k->low)
            k->low = k->n;
        flt_stream_rearm(s->stream, rs);
        return s;
    }
    gw_flt_t *s = sl_zalloc(sizeof(*s));
    if (s && !(s->stream = flt_stream_new(rs))) {
        free(s);
        s = NULL;
    }
    return s;
}

void gw_flt_state_put(gw_flt_t *s)
{
    gw_flt_cache_t *k = &gw_flt_cache;
    gw_flt_resp_free(s->resp); /* Responses streams are rare: not kept */
    s->resp = NULL;
    flt_out_reset(&s->out);
    if (!s->stream || k->n >= GW_FLT_CACHE_MAX) {
        gw_flt_state_free(s);
        return;
    }
    flt_stream_recycle(s->stream);
    k->v[k->n++] = s;
}

flt_stream_t *gw_flt_state_stream(gw_flt_t *s)
{
    return s->stream;
}

size_t gw_flt_cache_tick(bool all)
{
    gw_flt_cache_t *k = &gw_flt_cache;
    /* half of what went unused, as the request-struct cache does */
    size_t n = all ? k->n : (SL_MIN(k->low, k->n) + 1) / 2;
    for (size_t i = 0; i < n; i++)
        gw_flt_state_free(k->v[--k->n]);
    k->low = k->n;
    sl_gauge_add(gw_m.flt_streams_cached, (int64_t)k->n - (int64_t)k->shown);
    k->shown = k->n;
    return n;
}

size_t gw_flt_cache_held(void)
{
    return gw_flt_cache.n;
}

/* The state of every non-streamed request with answer rules: nothing of
 * its own to hold, so one shared, never-written instance (no allocation per
 * request); on_end leaves it alone. */
static gw_flt_t gw_flt_body_only = {.body = true};

static gw_hook_rc_t gw_flt_on_request(gw_req_t *r, void **state)
{
    flt_ruleset_t *rs = r->rt->filters;
    bool resp = r->route == GW_ROUTE_RESPONSES && (json_is_object(r->json) || r->scan);
    if (!rs || (r->route != GW_ROUTE_CHAT && !resp))
        return GW_HOOK_NEXT;
    flt_req_result_t res;
    flt_req_verdict_t v;
    if (resp && !r->json) {
        const gw_jfact_t *input = gw_body_fact(r->scan, GW_F_INPUT);
        v = gw_flt_resp_request_text(rs, input->kind == SL_J_STRING ? &input->s : NULL, &res);
    } else if (resp)
        v = gw_flt_resp_request(rs, r->json, &res);
    else if (r->scan && r->scan->has_msgs)
        v = flt_request_check_chat(rs, &r->scan->chat, &res);
    else
        v = flt_request_check(rs, r->json, &res);
    if (v == FLT_REQ_EDIT) {
        /* The rules edit the prompt: on the tree (built now), serialised
         * again before sending. */
        json_t *j = gw_req_json(r);
        v = !j     ? FLT_REQ_ERROR
            : resp ? gw_flt_resp_request(rs, j, &res)
                   : flt_request_check(rs, j, &res);
    }
    switch (v) {
    case FLT_REQ_OK:
        break;
    case FLT_REQ_REJECT: {
        size_t len = 0;
        char *body = flt_error_body(&res, &len);
        r->error_kind = res.code;
        if (body)
            gw_respond_json(r, res.status, body, len, NULL);
        else
            gw_respond_oom(r);
        free(body);
        return GW_HOOK_DONE;
    }
    default:
        gw_respond_oom(r);
        return GW_HOOK_DONE;
    }
    if (res.modified)
        r->body_dirty = true;
    if (!flt_ruleset_filters_output(rs) ||
        flt_ruleset_word_count(rs) + flt_ruleset_regex_count(rs) == 0)
        return GW_HOOK_NEXT; /* nothing could match an answer: relay it untouched */
    if (!r->stream) {
        *state = &gw_flt_body_only;
        return GW_HOOK_NEXT;
    }
    gw_flt_t *s = gw_flt_state_get(rs);
    if (!s) {
        gw_respond_oom(r);
        return GW_HOOK_DONE;
    }
    *state = s;
    s->resp = resp ? gw_flt_resp_new() : NULL;
    if (resp && !s->resp) {
        gw_respond_oom(r);
        return GW_HOOK_DONE;
    }
    return GW_HOOK_NEXT;
}

/* Moves flt's payloads into the chain's list. */
static int gw_flt_move(flt_out_t *o, gw_payloads_t *out)
{
    int rc = 0;
    for (size_t i = 0; i < o->n; i++) {
        if (rc == 0 && gw_payloads_push(out, o->v[i].data, o->v[i].len) != 0)
            rc = -1;
        else if (rc != 0)
            free(o->v[i].data);
        o->v[i].data = NULL;
    }
    o->n = 0;
    return rc;
}

static gw_ev_rc_t gw_flt_on_event(gw_req_t *r, void *state, const char *data, size_t len,
                                  gw_payloads_t *out)
{
    gw_flt_t *s = state;
    if (!s->stream)
        return GW_EV_PASS;
    if (s->resp) {
        gw_ev_rc_t rc = gw_flt_resp_event(s->resp, s->stream, data, len, out);
        if (rc == GW_EV_STOP)
            r->error_kind = "content_filter";
        return rc;
    }
    /* timed from the relay's clock read for this event (r->ev_ns) */
    flt_ev_verdict_t v = flt_stream_event_at(s->stream, data, len, &s->out, r->ev_ns);
    int moved = gw_flt_move(&s->out, out); /* leaves s->out empty, its array kept */
    switch (v) {
    case FLT_EV_PASS:
        return GW_EV_PASS;
    case FLT_EV_REPLACE:
        return moved == 0 ? GW_EV_REPLACE : GW_EV_STOP;
    default: /* BLOCK, or out of memory: end the stream, [DONE] last */
        r->error_kind = "content_filter";
        gw_payloads_push_copy(out, "[DONE]", 6);
        return GW_EV_STOP;
    }
}

static int gw_flt_on_body(gw_req_t *r, void *state, json_t *body, bool *modified)
{
    gw_flt_t *s = state;
    if (!s->body)
        return 0;
    bool m = false;
    if (r->route == GW_ROUTE_RESPONSES ? gw_flt_resp_body(r->rt->filters, body, &m) != 0
                                       : flt_response_filter(r->rt->filters, body, &m) != 0)
        return -1;
    if (m)
        *modified = true;
    return 0;
}

/* A chat.completion (filters/answer.c) or a Responses answer
 * (flt_responses.c) read as bytes: no tree unless the answer is one that
 * reader leaves to it. */
static int gw_flt_on_body_raw(gw_req_t *r, void *state, const char *data, size_t len, char **out,
                              size_t *outlen)
{
    gw_flt_t *s = state;
    if (!s->body)
        return 0;
    if (r->route == GW_ROUTE_RESPONSES) /* the Responses API's shape (flt_responses.c) */
        return gw_flt_resp_body_bytes(r->rt->filters, data, len, out, outlen);
    switch (flt_response_filter_bytes(r->rt->filters, data, len, out, outlen)) {
    case FLT_ANS_SAME:
    case FLT_ANS_EDITED:
        return 0;
    case FLT_ANS_TREE:
        return 1;
    default:
        return -1;
    }
}

static void gw_flt_on_end(gw_req_t *r, void *state, gw_end_t how)
{
    (void)r;
    (void)how;
    gw_flt_t *s = state;
    if (!s || s == &gw_flt_body_only)
        return;
    gw_flt_state_put(s);
}

static void gw_flt_worker_tick(gw_worker_t *w, bool all)
{
    (void)w;
    (void)gw_flt_cache_tick(all);
}

/* ---- lifecycle ------------------------------------------------------------ */

static int gw_flt_rt_build(gw_rt_t *rt, gw_shared_t *sh, char *err, size_t errlen)
{
    (void)sh;
    char e[512];
    rt->filters = flt_ruleset_new(&rt->conf->filters, e, sizeof(e));
    if (!rt->filters) {
        snprintf(err, errlen, "%s: filters: %s", rt->conf->path ? rt->conf->path : "conf", e);
        return -1;
    }
    return 0;
}

static void gw_flt_rt_free(gw_rt_t *rt)
{
    flt_ruleset_unref(rt->filters);
    rt->filters = NULL;
}

const gw_hook_t gw_hook_filters = {
    .name = "filters",
    .rt_build = gw_flt_rt_build,
    .rt_free = gw_flt_rt_free,
    .on_request = gw_flt_on_request,
    .on_event = gw_flt_on_event,
    .on_body = gw_flt_on_body,
    .on_body_raw = gw_flt_on_body_raw,
    .on_end = gw_flt_on_end,
    .worker_tick = gw_flt_worker_tick,
};
