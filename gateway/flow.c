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

#include "gateway/body_scan.h"
#include "gateway/gw_flow.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_proxy.h"
#include "gateway/gw_req.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_types.h"
#include "gateway/json_intake.h"

json_t *gw_req_json(gw_req_t *r)
{
    if (r->json || !r->scan)
        return r->json;
    char *edited = NULL;
    size_t len = 0;
    const char *b;
    if (gw_body_edited(r->scan)) {
        if (gw_body_splice_apply(r->scan, &edited, &len) != 0)
            return NULL;
        b = edited;
    } else {
        len = evbuffer_get_length(r->body);
        b = (const char *)evbuffer_pullup(r->body, -1);
    }
    bool inexact;
    char msg[256];
    json_t *j = gw_json_intake(b, len, &inexact, msg, sizeof(msg));
    free(edited);
    if (j && !json_is_object(j)) {
        json_decref(j);
        j = NULL;
    }
    r->json = j;
    return j;
}

int gw_req_set_int(gw_req_t *r, const char *key, int64_t v)
{
    if (r->json && json_object_set_new(r->json, key, json_integer(v)) != 0)
        return -1;
    if (!r->scan) {
        r->body_dirty = true;
        return 0;
    }
    const gw_jfact_t *f = strcmp(key, "max_tokens") == 0 ? gw_body_fact(r->scan, GW_F_MAX_TOKENS)
                          : strcmp(key, "max_completion_tokens") == 0
                              ? gw_body_fact(r->scan, GW_F_MAX_COMPLETION_TOKENS)
                          : strcmp(key, "max_output_tokens") == 0
                              ? gw_body_fact(r->scan, GW_F_MAX_OUTPUT_TOKENS)
                              : NULL;
    char digits[24];
    size_t n = sl_i64toa(v, digits);
    return gw_body_set(r->scan, key, f, digits, n);
}

int gw_req_set_include_usage(gw_req_t *r)
{
    if (r->json) {
        json_t *so = json_object_get(r->json, "stream_options");
        if (!json_is_object(so)) {
            so = json_object();
            if (!so || json_object_set_new(r->json, "stream_options", so) != 0)
                return -1;
        }
        if (json_object_set_new(so, "include_usage", json_true()) != 0)
            return -1;
    }
    if (!r->scan) {
        r->body_dirty = true;
        return 0;
    }
    return gw_body_set_include_usage(r->scan);
}

/* The request is through every hook: the body with its edits (splices on
 * the client's bytes; the tree serialised again only when a hook edited
 * the tree itself), then the attempt. */

/* Past this size a spliced body is not copied: the new body is the client's
 * bytes by reference with the splice texts between (below it one memcpy is
 * cheaper than a reference chain per span). */
#define GW_BODY_SPLICE_REF_MIN 16384
/* Spliced bodies up to this size (NUL included) are built on the stack. */
#define GW_BODY_SPLICE_STACK 4096

/* The buffer holding the client's bytes once the spliced body refers into
 * them: freed when the last reference goes (the new body's own chains, and
 * any upstream output buffer still sharing them for a retry or a resend). */
typedef struct gw_body_hold {
    struct evbuffer *buf;
    size_t refs;
} gw_body_hold_t;

static void gw_body_hold_unref(const void *data, size_t len, void *arg)
{
    (void)data;
    (void)len;
    gw_body_hold_t *h = arg;
    if (--h->refs > 0)
        return;
    if (h->buf)
        evbuffer_free(h->buf);
    free(h);
}

typedef struct gw_body_out {
    struct evbuffer *dst;
    gw_body_hold_t *hold;
} gw_body_out_t;

static int gw_body_piece(void *arg, const char *p, size_t n, bool body)
{
    gw_body_out_t *o = arg;
    if (!body)
        return evbuffer_add(o->dst, p, n);
    o->hold->refs++;
    if (evbuffer_add_reference(o->dst, p, n, gw_body_hold_unref, o->hold) != 0) {
        o->hold->refs--;
        return -1;
    }
    return 0;
}

/* r->body becomes the spliced body. -1: out of memory (r->body as it was). */
static int gw_body_splice_into(gw_req_t *r)
{
    gw_body_scan_t *s = r->scan;
    if (s->len < GW_BODY_SPLICE_REF_MIN) {
        /* a usual request's body is built on the stack: no malloc and free
         * for the moment it takes to copy it into r->body */
        char stack[GW_BODY_SPLICE_STACK];
        char *b;
        size_t n;
        if (gw_body_splice_apply_buf(s, stack, sizeof(stack), &b, &n) != 0)
            return -1;
        evbuffer_drain(r->body, evbuffer_get_length(r->body));
        int rc = evbuffer_add(r->body, b, n);
        if (b != stack)
            free(b);
        return rc;
    }
    /* s->body is r->body's bytes (pulled up by gw_proxy_route): the new
     * buffer refers into them, and the old buffer lives on in the hold. */
    gw_body_out_t o = {evbuffer_new(), malloc(sizeof(gw_body_hold_t))};
    if (!o.dst || !o.hold) {
        if (o.dst)
            evbuffer_free(o.dst);
        free(o.hold);
        return -1;
    }
    o.hold->buf = r->body;
    o.hold->refs = 1; /* this function's, until the new body is in place */
    if (gw_body_splice_walk(s, gw_body_piece, &o) != 0) {
        evbuffer_free(o.dst); /* its spans let go of the hold */
        o.hold->buf = NULL;   /* r->body stays r->body */
        gw_body_hold_unref(NULL, 0, o.hold);
        return -1;
    }
    r->body = o.dst;
    gw_body_hold_unref(NULL, 0, o.hold);
    return 0;
}

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
        if (r->scan) { /* its spans and strings were of the old bytes; numbers stay */
            r->scan->nsplices = 0;
            r->scan->body = NULL;
        }
    } else if (gw_body_edited(r->scan)) {
        if (gw_body_splice_into(r) != 0) {
            gw_respond_oom(r);
            return;
        }
        /* The scan's spans and strings were of the old bytes: only its
         * numbers (n, stream) are read from here on. */
        r->scan->nsplices = 0;
        r->scan->body = NULL;
    }
    gw_proxy_send_attempt(r);
}

/* The routing decision over message texts (routing.local_first). */
static bool gw_route_simple_msgs(const gw_req_t *r, const sl_chat_t *chat)
{
    const conf_routing_t *c = &r->rt->conf->routing;
    if (chat->messages_kind != SL_J_ARRAY)
        return false;
    int64_t chars = 0, turns = 0;
    const char *last = NULL;
    size_t last_len = 0;
    for (size_t i = 0; i < chat->nmsgs; i++) {
        const sl_chat_msg_t *m = &chat->msgs[i];
        if (m->content_kind != SL_J_STRING)
            return false; /* parts (images, ...) are not for the small model */
        const char *s = m->content.p;
        size_t n = m->content.len;
        for (size_t k = 0; k < n; k++)
            chars += ((unsigned char)s[k] & 0xC0) != 0x80; /* code points */
        if (m->role_kind == SL_J_STRING && sl_text_is(m->role, "user")) {
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

/* routing.local_first: a request the small model can serve — few turns and
 * a short prompt, or a last user message matching routing.intent. */
static bool gw_route_simple(const gw_req_t *r)
{
    const conf_routing_t *c = &r->rt->conf->routing;
    if (!c->local_first)
        return false;
    if (r->scan && r->scan->has_msgs)
        return gw_route_simple_msgs(r, &r->scan->chat);
    json_t *msgs = json_object_get(r->json, "messages");
    if (!json_is_array(msgs))
        return false;
    /* The tree's messages as the scanner's plain data (slow path only). */
    size_t nm = json_array_size(msgs);
    sl_chat_msg_t *v = calloc(nm ? nm : 1, sizeof(*v));
    if (!v)
        return false;
    for (size_t i = 0; i < nm; i++) {
        json_t *m = json_array_get(msgs, i);
        json_t *content = json_object_get(m, "content");
        json_t *role = json_object_get(m, "role");
        v[i].content_kind = json_is_string(content) ? SL_J_STRING : SL_J_OBJECT;
        v[i].content = (sl_text_t){json_string_value(content), json_string_length(content)};
        v[i].role_kind = json_is_string(role) ? SL_J_STRING : SL_J_ABSENT;
        v[i].role = (sl_text_t){json_string_value(role), json_string_length(role)};
    }
    sl_chat_t chat = {.messages_kind = SL_J_ARRAY, .msgs = v, .nmsgs = nm};
    bool simple = gw_route_simple_msgs(r, &chat);
    free(v);
    return simple;
}

/* Which facts the hooks of this request will read beyond the top level. */
static unsigned gw_scan_flags(const gw_req_t *r)
{
    bool msgs = (r->rt->filters && r->route == GW_ROUTE_CHAT) || r->rt->conf->routing.local_first ||
                gw_rl_budgets_on(r);
    return msgs ? GW_SCAN_MSGS : 0;
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
    const char *b = (const char *)evbuffer_pullup(r->body, -1);
    if (r->route == GW_ROUTE_CHAT || r->route == GW_ROUTE_COMPLETIONS ||
        r->route == GW_ROUTE_RESPONSES) {
        /* The hot path: one streaming pass, no tree (body_scan.h); the
         * Responses API's input is one of its facts. */
        /* a cached request's scanner when it has one (conn.c) */
        r->scan = r->scan_kept ? r->scan_kept : gw_body_scan_new();
        r->scan_kept = NULL;
        if (!r->scan) {
            gw_respond_oom(r);
            return;
        }
        switch (gw_body_scan(r->scan, b, len, gw_scan_flags(r))) {
        case GW_SCAN_OK:
            break;
        case GW_SCAN_SLOW: /* jansson decides, and says what is wrong */
            gw_body_scan_free(r->scan);
            r->scan = NULL;
            break;
        default:
            gw_respond_oom(r);
            return;
        }
    }
    if (!r->scan) {
        char jmsg[256];
        /* inexact: an integer beyond int64 is held as a real. The client's
         * bytes are forwarded as they came unless a hook or an alias edits
         * the body (then such a number goes out as the nearest double). */
        bool inexact = false;
        r->json = gw_json_intake(b, len, &inexact, jmsg, sizeof(jmsg));
        (void)inexact;
        if (!r->json || !json_is_object(r->json)) {
            if (r->json)
                snprintf(jmsg, sizeof(jmsg), "The request body must be a JSON object.");
            gw_respond_error(r, 400, "invalid_request_error", "invalid_json", jmsg);
            return;
        }
    }
    sl_text_t mname = {NULL, 0};
    if (r->scan) {
        const gw_jfact_t *model = gw_body_fact(r->scan, GW_F_MODEL);
        if (model->kind == SL_J_STRING)
            mname = model->s;
    } else {
        json_t *jm = json_object_get(r->json, "model");
        if (json_is_string(jm))
            mname = (sl_text_t){json_string_value(jm), json_string_length(jm)};
    }
    if (mname.len == 0) {
        gw_respond_error(r, 400, "invalid_request_error", "missing_model",
                         "The request must name a model (a string).");
        return;
    }
    r->model = gw_rt_model(r->rt, mname.p, mname.len);
    bool asked_auto = false;
    if (!r->model && r->rt->auto_model && sl_text_is(mname, "auto")) {
        r->model = r->rt->auto_model; /* "auto": local first when it can, else this */
        asked_auto = true;
    }
    if (!r->model) {
        char msg[200];
        /* %.*s stops at a NUL as the C string did */
        snprintf(msg, sizeof(msg), "The model `%.*s` does not exist.",
                 (int)SL_MIN(strnlen(mname.p, mname.len), 100), mname.p);
        gw_respond_error(r, 404, "invalid_request_error", "model_not_found", msg);
        return;
    }
    if (r->scan) {
        r->stream = gw_body_fact(r->scan, GW_F_STREAM)->kind == SL_J_TRUE;
        r->client_usage = gw_body_fact(r->scan, GW_F_INCLUDE_USAGE)->kind == SL_J_TRUE;
    } else {
        r->stream = json_is_true(json_object_get(r->json, "stream"));
        r->client_usage = json_is_true(
            json_object_get(json_object_get(r->json, "stream_options"), "include_usage"));
    }
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
        if (r->scan && r->model->served_json) { /* quoted once, when the rt was built */
            if (gw_body_set(r->scan, "model", gw_body_fact(r->scan, GW_F_MODEL),
                            r->model->served_json, r->model->served_json_len) != 0) {
                gw_respond_oom(r);
                return;
            }
        } else {
            json_t *j = gw_req_json(r); /* a served name too long for a splice: the tree */
            if (!j || json_object_set_new(j, "model", json_string(r->model->served)) != 0) {
                gw_respond_oom(r);
                return;
            }
            r->body_dirty = true;
        }
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
