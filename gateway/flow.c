/*
 * flow.c — a request's way to its upstream attempt: the pre-route hooks
 * (gw_proxy_start), then the route's handler; for the proxied routes
 * (gw_proxy_route) the JSON body is parsed, the model routed to its pool
 * (aliases, routing.local_first, "auto"), the post-route hooks run, the
 * body is serialised again when a hook or an alias changed it, and the
 * attempt starts (proxy.c). A hook that went pending comes back through
 * gw_proxy_resume. The attempt, the relay and abort are proxy.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "gateway/gw_flow.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_proxy.h"
#include "gateway/gw_req.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_types.h"
#include "gateway/json_intake.h"

static void gw_proxy_body_add(gw_req_t *r)
{
    size_t len = evbuffer_get_length(r->body);
    const char *b = (const char *)evbuffer_pullup(r->body, -1);
    size_t end = len;
    while (end > 0 && b[end - 1] != '}')
        end--;
    if (end == 0)
        return;
    struct evbuffer *nb = evbuffer_new();
    if (!nb)
        return;
    evbuffer_add(nb, b, end - 1);
    if (!r->body_add_first)
        evbuffer_add(nb, GW_LIT(","));
    evbuffer_add(nb, r->body_add, strlen(r->body_add));
    evbuffer_add(nb, b + end - 1, len - (end - 1));
    evbuffer_free(r->body);
    r->body = nb;
    r->body_add[0] = '\0';
}

/* The request is through every hook: serialise the body again if a hook
 * (or the alias) changed it, and send it. */
static void gw_proxy_send(gw_req_t *r)
{
    if (r->body_dirty) {
        char *s = json_dumps(r->json, JSON_COMPACT);
        if (!s) {
            gw_respond_oom(r);
            return;
        }
        evbuffer_drain(r->body, evbuffer_get_length(r->body));
        evbuffer_add(r->body, s, strlen(s));
        free(s);
        r->body_dirty = false;
    } else if (r->body_add[0]) {
        gw_proxy_body_add(r);
    }
    gw_proxy_send_attempt(r);
}

/* routing.local_first: a request the small model can serve — few turns and
 * a short prompt, or a last user message matching routing.intent. */
static bool gw_route_simple(const gw_req_t *r)
{
    const conf_routing_t *c = &r->rt->conf->routing;
    if (!c->local_first)
        return false;
    json_t *msgs = json_object_get(r->json, "messages");
    if (!json_is_array(msgs))
        return false;
    int64_t chars = 0, turns = 0;
    const char *last = NULL;
    size_t last_len = 0, i;
    json_t *m;
    json_array_foreach(msgs, i, m)
    {
        json_t *content = json_object_get(m, "content");
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!json_is_string(content))
            return false; /* parts (images, ...) are not for the small model */
        const char *s = json_string_value(content);
        size_t n = json_string_length(content);
        for (size_t k = 0; k < n; k++)
            chars += ((unsigned char)s[k] & 0xC0) != 0x80; /* code points */
        if (role && strcmp(role, "user") == 0) {
            turns++;
            last = s;
            last_len = n;
        }
    }
    if (r->rt->intent && last) {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(r->rt->intent, NULL);
        int rc = md ? pcre2_match(r->rt->intent, (PCRE2_SPTR)last, last_len, 0, 0, md, NULL) : -1;
        pcre2_match_data_free(md);
        if (rc >= 0)
            return true;
    }
    return chars <= c->max_prompt_chars && turns <= c->max_turns;
}

/* Parses the body, picks the model's upstream, then runs the post-route
 * hooks. */
void gw_proxy_route(gw_req_t *r)
{
    size_t len = evbuffer_get_length(r->body);
    if (r->route == GW_ROUTE_PASSTHROUGH && r->rt->nmodels > 0) {
        /* Any body (audio is multipart): routed by its model when it is a
         * JSON object naming one we serve, else to the first model's
         * upstream; forwarded as it came. */
        json_t *j = len ? json_loadb((const char *)evbuffer_pullup(r->body, -1), len,
                                     JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, NULL)
                        : NULL;
        json_t *jm = json_object_get(j, "model");
        r->model = json_is_string(jm)
                       ? gw_rt_model(r->rt, json_string_value(jm), json_string_length(jm))
                       : NULL;
        json_decref(j);
        if (!r->model)
            r->model = &r->rt->models[0];
        r->att.pool = r->model->pool;
        if (gw_hooks_run(r, false) == GW_HOOK_NEXT)
            gw_proxy_send(r);
        return;
    }
    if (r->route == GW_ROUTE_RESPONSES && len == 0 && r->rt->nmodels > 0) {
        /* GET / DELETE /v1/responses/{id}, POST .../cancel: no model to
         * route by; the first model's upstream stored the response. */
        r->model = &r->rt->models[0];
        r->att.pool = r->model->pool;
        if (gw_hooks_run(r, false) == GW_HOOK_NEXT)
            gw_proxy_send(r);
        return;
    }
    if (len == 0) {
        gw_respond_error(r, 400, "invalid_request_error", "invalid_json",
                         "The request body must be a JSON object.");
        return;
    }
    char jmsg[256];
    /* inexact: an integer beyond int64 is held as a real. The client's
     * bytes are forwarded as they came unless a hook or an alias edits the
     * body (then such a number goes out as the nearest double). */
    bool inexact = false;
    r->json = gw_json_intake((const char *)evbuffer_pullup(r->body, -1), len, &inexact, jmsg,
                             sizeof(jmsg));
    (void)inexact;
    if (!r->json || !json_is_object(r->json)) {
        if (r->json)
            snprintf(jmsg, sizeof(jmsg), "The request body must be a JSON object.");
        gw_respond_error(r, 400, "invalid_request_error", "invalid_json", jmsg);
        return;
    }
    json_t *jm = json_object_get(r->json, "model");
    if (!json_is_string(jm) || json_string_length(jm) == 0) {
        gw_respond_error(r, 400, "invalid_request_error", "missing_model",
                         "The request must name a model (a string).");
        return;
    }
    r->model = gw_rt_model(r->rt, json_string_value(jm), json_string_length(jm));
    bool asked_auto = false;
    if (!r->model && r->rt->auto_model && strcmp(json_string_value(jm), "auto") == 0) {
        r->model = r->rt->auto_model; /* "auto": local first when it can, else this */
        asked_auto = true;
    }
    if (!r->model) {
        char msg[200];
        snprintf(msg, sizeof(msg), "The model `%.100s` does not exist.", json_string_value(jm));
        gw_respond_error(r, 404, "invalid_request_error", "model_not_found", msg);
        return;
    }
    r->stream = json_is_true(json_object_get(r->json, "stream"));
    r->client_usage =
        json_is_true(json_object_get(json_object_get(r->json, "stream_options"), "include_usage"));
    r->att.pool = r->model->pool;
    if (r->rt->local && r->att.pool != r->rt->local && r->route == GW_ROUTE_CHAT &&
        (asked_auto || gw_route_simple(r))) {
        r->att.pool = r->rt->local; /* the model's own upstream is its fallback */
        r->routed_local = true;
        r->tried_local = true;
    }
    if (r->att.pool == r->rt->local)
        r->tried_local = true;
    sl_counter_add(r->att.pool == r->rt->local ? gw_m.route_local : gw_m.route_main, 1);
    if (asked_auto || r->model->alias) {
        json_object_set_new(r->json, "model", json_string(r->model->served));
        r->body_dirty = true;
    }
    if (gw_hooks_run(r, false) == GW_HOOK_NEXT)
        gw_proxy_send(r);
}

/* The pre-route hooks passed: answer the models list ourselves, or route
 * the body to an upstream. */
static void gw_proxy_after_pre(gw_req_t *r)
{
    r->handler(r); /* the route's (route.c), stored by gw_route_dispatch */
}

void gw_proxy_start(gw_req_t *r)
{
    r->hooks.pending = -1;
    if (gw_hooks_run(r, true) == GW_HOOK_NEXT)
        gw_proxy_after_pre(r);
}

void gw_proxy_resume(gw_req_t *r)
{
    if (!r->hooks.pre_done) {
        if (gw_hooks_run(r, true) == GW_HOOK_NEXT)
            gw_proxy_after_pre(r);
        return;
    }
    if (gw_hooks_run(r, false) == GW_HOOK_NEXT)
        gw_proxy_send(r);
}
