/*
 * flt_responses.c — content filters over the Responses API. filters/ knows
 * chat chunks and chat.completion objects; a Responses stream carries its
 * text in response.output_text.delta events and repeats the whole text in
 * its done events and in response.completed. Each delta is fed to the
 * chat-stream filter as a one-choice chunk, what comes out is written back
 * as delta events (so text is held back and masked exactly as for chat),
 * and the repeated full texts are replaced by the text actually sent, so a
 * masked or blocked word does not come back at the end.
 */
#include <stdlib.h>
#include <string.h>

#include "gateway/gw_flt_resp.h"

/* The text sent so far is bounded like a gathered answer. */
#define GW_FLT_RESP_MAX (8u << 20)

struct gw_flt_resp {
    char *acc; /* output text sent so far (NUL-terminated) */
    size_t len, cap;
    bool oom;
};

gw_flt_resp_t *gw_flt_resp_new(void)
{
    return calloc(1, sizeof(gw_flt_resp_t));
}

void gw_flt_resp_free(gw_flt_resp_t *x)
{
    if (!x)
        return;
    free(x->acc);
    free(x);
}

static void gw_flt_resp_add(gw_flt_resp_t *x, const char *s, size_t n)
{
    if (x->oom || x->len + n + 1 > GW_FLT_RESP_MAX) {
        x->oom = true;
        return;
    }
    if (x->len + n + 1 > x->cap) {
        size_t cap = x->cap ? x->cap : 256;
        while (cap < x->len + n + 1)
            cap *= 2;
        char *p = realloc(x->acc, cap);
        if (!p) {
            x->oom = true;
            return;
        }
        x->acc = p;
        x->cap = cap;
    }
    memcpy(x->acc + x->len, s, n);
    x->len += n;
    x->acc[x->len] = '\0';
}

static int gw_flt_resp_push(gw_payloads_t *out, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (!s)
        return -1;
    return gw_payloads_push(out, s, strlen(s));
}

/* Every output_text part of a content array gets the text sent. */
static void gw_flt_resp_set_parts(json_t *content, const char *text)
{
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part)
    {
        const char *t = json_string_value(json_object_get(part, "type"));
        if (t && strcmp(t, "output_text") == 0)
            json_object_set_new(part, "text", json_string(text));
    }
}

static void gw_flt_resp_set_output(json_t *output, const char *text)
{
    size_t i;
    json_t *item;
    json_array_foreach(output, i, item)
        gw_flt_resp_set_parts(json_object_get(item, "content"), text);
}

gw_ev_rc_t gw_flt_resp_event(gw_flt_resp_t *x, flt_stream_t *st, const char *data, size_t len,
                             gw_payloads_t *out)
{
    json_t *j = json_loadb(data, len, 0, NULL);
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) {
        json_decref(j);
        return GW_EV_PASS;
    }
    bool delta = strcmp(type, "response.output_text.delta") == 0;
    bool text_done = strcmp(type, "response.output_text.done") == 0;
    const char *text = x->acc ? x->acc : "";
    if (!delta && !text_done) {
        /* The events that repeat the whole text: what was sent instead. */
        json_t *target = NULL;
        if (strcmp(type, "response.content_part.done") == 0) {
            json_t *part = json_object_get(j, "part");
            const char *pt = json_string_value(json_object_get(part, "type"));
            if (pt && strcmp(pt, "output_text") == 0) {
                json_object_set_new(part, "text", json_string(text));
                target = part;
            }
        } else if (strcmp(type, "response.output_item.done") == 0) {
            target = json_object_get(json_object_get(j, "item"), "content");
            gw_flt_resp_set_parts(target, text);
        } else if (strncmp(type, "response.completed", 18) == 0 ||
                   strcmp(type, "response.incomplete") == 0) {
            target = json_object_get(json_object_get(j, "response"), "output");
            gw_flt_resp_set_output(target, text);
        }
        gw_ev_rc_t rc = GW_EV_PASS;
        if (target)
            rc = gw_flt_resp_push(out, j) == 0 ? GW_EV_REPLACE : GW_EV_STOP;
        json_decref(j);
        return rc;
    }
    const char *d = delta ? json_string_value(json_object_get(j, "delta")) : NULL;
    json_t *chunk = json_pack("{s:[{s:i, s:{s:s?}, s:s?}]}", "choices", "index", 0, "delta",
                              "content", d, "finish_reason", text_done ? "stop" : NULL);
    char *cs = chunk ? json_dumps(chunk, JSON_COMPACT) : NULL;
    json_decref(chunk);
    flt_out_t o;
    memset(&o, 0, sizeof(o));
    flt_ev_verdict_t v = cs ? flt_stream_event(st, cs, strlen(cs), &o) : FLT_EV_ERROR;
    free(cs);
    gw_ev_rc_t rc = GW_EV_REPLACE;
    if (v == FLT_EV_PASS && delta) {
        gw_flt_resp_add(x, d ? d : "", d ? strlen(d) : 0);
        rc = GW_EV_PASS;
    } else {
        /* What the filter let out, as delta events of this item. */
        for (size_t i = 0; i < o.n && rc != GW_EV_STOP; i++) {
            json_t *c = json_loads(o.v[i].data, 0, NULL);
            json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
            const char *t =
                json_string_value(json_object_get(json_object_get(ch, "delta"), "content"));
            if (t && *t) {
                json_t *ev = json_pack("{s:s, s:O?, s:O?, s:O?, s:s, s:[]}", "type",
                                       "response.output_text.delta", "item_id",
                                       json_object_get(j, "item_id"), "output_index",
                                       json_object_get(j, "output_index"), "content_index",
                                       json_object_get(j, "content_index"), "delta", t, "logprobs");
                gw_flt_resp_add(x, t, strlen(t));
                if (gw_flt_resp_push(out, ev) != 0)
                    rc = GW_EV_STOP;
                json_decref(ev);
            }
            json_decref(c);
        }
        if (v == FLT_EV_BLOCK || v == FLT_EV_ERROR || x->oom) {
            json_t *e =
                json_pack("{s:s, s:s, s:s, s:n}", "type", "error", "code", "content_filter",
                          "message", "The answer was stopped by a content filter.", "param");
            gw_flt_resp_push(out, e);
            json_decref(e);
            rc = GW_EV_STOP;
        } else if (text_done && rc != GW_EV_STOP) {
            json_object_set_new(j, "text", json_string(x->acc ? x->acc : ""));
            if (gw_flt_resp_push(out, j) != 0)
                rc = GW_EV_STOP;
        }
    }
    flt_out_release(&o);
    json_decref(j);
    return rc;
}

int gw_flt_resp_body(flt_ruleset_t *rs, json_t *body, bool *modified)
{
    size_t i, k;
    json_t *item, *part;
    json_array_foreach(json_object_get(body, "output"), i, item)
    {
        json_array_foreach(json_object_get(item, "content"), k, part)
        {
            json_t *t = json_object_get(part, "text");
            if (!json_is_string(t))
                continue;
            json_t *cc =
                json_pack("{s:[{s:i, s:{s:s, s:O}, s:s}]}", "choices", "index", 0, "message",
                          "role", "assistant", "content", t, "finish_reason", "stop");
            bool m = false;
            if (!cc || flt_response_filter(rs, cc, &m) != 0) {
                json_decref(cc);
                return -1;
            }
            if (m) {
                json_t *ch = json_array_get(json_object_get(cc, "choices"), 0);
                json_t *nt = json_object_get(json_object_get(ch, "message"), "content");
                json_object_set_new(
                    part, "text",
                    json_is_string(nt) ? json_stringn(json_string_value(nt), json_string_length(nt))
                                       : json_string(""));
                *modified = true;
            }
            json_decref(cc);
        }
    }
    return 0;
}

flt_req_verdict_t gw_flt_resp_request(const flt_ruleset_t *rs, json_t *body, flt_req_result_t *res)
{
    json_t *in = json_object_get(body, "input");
    if (!json_is_string(in)) {
        memset(res, 0, sizeof(*res));
        return FLT_REQ_OK; /* item lists: not read yet (docs/clients.md) */
    }
    json_t *chat = json_pack("{s:O?, s:[{s:s, s:O}]}", "model", json_object_get(body, "model"),
                             "messages", "role", "user", "content", in);
    if (!chat)
        return FLT_REQ_ERROR;
    flt_req_verdict_t v = flt_request_check(rs, chat, res);
    if (v == FLT_REQ_OK && res->modified) {
        json_t *m = json_array_get(json_object_get(chat, "messages"), 0);
        json_t *c = json_object_get(m, "content");
        if (json_is_string(c))
            json_object_set(body, "input", c);
    }
    json_decref(chat);
    return v;
}
