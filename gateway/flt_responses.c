/*
 * flt_responses.c — content filters over the Responses API. filters/ knows
 * chat chunks and chat.completion objects; a Responses stream carries its
 * text in response.output_text.delta events and repeats the whole text in
 * its done events and in response.completed. Each delta's text is fed to
 * the chat-stream filter's choice 0 (flt_stream_text; the event is read
 * with yajl, below), what comes out is spliced back into the delta event
 * (so text is held back and masked exactly as for chat); the text_done
 * event goes through the chat path as a finish chunk; and the repeated
 * full texts are replaced by the text actually sent, so a masked or
 * blocked word does not come back at the end.
 */
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

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

/* ---- the delta events without a jansson tree --------------------------------
 *
 * Nearly every event of a Responses stream is a response.output_text.delta.
 * yajl's event parser finds its top-level `type` and the byte span of its
 * `delta` string; the text goes to the filter as is (flt_stream_text) and,
 * when it comes back unchanged, the event is passed without being parsed
 * into a tree or written again. Anything else (another type, a duplicate
 * key, an escaped type, JSON yajl refuses) takes the general path below. */

typedef struct gw_frp {
    const char *data;
    size_t n;
    yajl_handle h;
    int depth;
    int key;        /* 1 type, 2 delta, 3 logprobs, 0 other: whose value comes next */
    size_t key_end; /* offset just past that key */
    char type[40];
    bool has_type, has_delta, has_lp, lp_open, odd;
    size_t ds, de; /* the delta string, quotes included */
    size_t ls, le; /* the logprobs value */
} gw_frp_t;

static int gw_frp_value(gw_frp_t *p, bool is_str, bool container, const unsigned char *s, size_t n)
{
    if (p->depth == 1 && p->key == 1) {
        if (!is_str || n >= sizeof(p->type) || p->has_type) {
            p->odd = true;
            return 0;
        }
        memcpy(p->type, s, n);
        p->type[n] = '\0';
        p->has_type = true;
    } else if (p->depth == 1 && p->key == 2) {
        if (!is_str || p->has_delta) {
            p->odd = true;
            return 0;
        }
        size_t i = p->key_end;
        while (i < p->n && p->data[i] != '"')
            i++; /* past the blanks and the colon */
        p->ds = i;
        p->de = yajl_get_bytes_consumed(p->h);
        p->has_delta = true;
    } else if (p->depth == 1 && p->key == 3) {
        if (p->has_lp) {
            p->odd = true;
            return 0;
        }
        size_t i = p->key_end;
        while (i < p->n && (p->data[i] == ' ' || p->data[i] == '\t' || p->data[i] == '\n' ||
                            p->data[i] == '\r' || p->data[i] == ':'))
            i++;
        p->ls = i;
        p->le = yajl_get_bytes_consumed(p->h); /* a container's end comes with its close */
        p->has_lp = true;
        p->lp_open = container;
    }
    p->key = 0;
    p->depth += container;
    return 1;
}

static int gw_frp_null(void *c)
{
    return gw_frp_value(c, false, false, NULL, 0);
}
static int gw_frp_bool(void *c, int v)
{
    (void)v;
    return gw_frp_value(c, false, false, NULL, 0);
}
static int gw_frp_num(void *c, const char *s, size_t n)
{
    (void)s, (void)n;
    return gw_frp_value(c, false, false, NULL, 0);
}
static int gw_frp_str(void *c, const unsigned char *s, size_t n)
{
    return gw_frp_value(c, true, false, s, n);
}
static int gw_frp_open(void *c)
{
    return gw_frp_value(c, false, true, NULL, 0);
}
static int gw_frp_close(void *c)
{
    gw_frp_t *p = c;
    if (--p->depth == 1 && p->lp_open) {
        p->le = yajl_get_bytes_consumed(p->h);
        p->lp_open = false;
    }
    return 1;
}
static int gw_frp_key(void *c, const unsigned char *k, size_t n)
{
    gw_frp_t *p = c;
    p->key = 0;
    if (p->depth != 1)
        return 1;
    p->key_end = yajl_get_bytes_consumed(p->h);
    if (n == 4 && memcmp(k, "type", 4) == 0)
        p->key = 1;
    else if (n == 5 && memcmp(k, "delta", 5) == 0)
        p->key = 2;
    else if (n == 8 && memcmp(k, "logprobs", 8) == 0)
        p->key = 3;
    return 1;
}

static const yajl_callbacks gw_frp_cb = {
    .yajl_null = gw_frp_null,
    .yajl_boolean = gw_frp_bool,
    .yajl_number = gw_frp_num,
    .yajl_string = gw_frp_str,
    .yajl_start_map = gw_frp_open,
    .yajl_map_key = gw_frp_key,
    .yajl_end_map = gw_frp_close,
    .yajl_start_array = gw_frp_open,
    .yajl_end_array = gw_frp_close,
};

/* true: a delta event read (p->ds..de its delta string). */
static bool gw_frp_scan(gw_frp_t *p, const char *data, size_t len)
{
    memset(p, 0, sizeof(*p));
    p->data = data;
    p->n = len;
    p->h = yajl_alloc(&gw_frp_cb, NULL, p);
    if (!p->h)
        return false;
    yajl_status s = yajl_parse(p->h, (const unsigned char *)data, len);
    if (s == yajl_status_ok)
        s = yajl_complete_parse(p->h);
    yajl_free(p->h);
    return s == yajl_status_ok && !p->odd && p->has_type && p->has_delta &&
           strcmp(p->type, "response.output_text.delta") == 0;
}

/* The event with its delta replaced by t (and logprobs, which would carry
 * the upstream's tokens, by []): every other byte stays the upstream's. */
static int gw_flt_resp_splice(gw_flt_resp_t *x, const gw_frp_t *p, const char *data, size_t len,
                              const char *t, size_t tn, gw_payloads_t *out)
{
    json_t *js = json_stringn(t, tn);
    char *enc = js ? json_dumps(js, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    json_decref(js);
    if (!enc)
        return -1;
    size_t el = strlen(enc);
    struct gw_frp_edit {
        size_t s, e;
        const char *r;
        size_t rl;
    } ed[2] = {{p->ds, p->de, enc, el}, {p->ls, p->le, "[]", 2}};
    size_t ned = p->has_lp ? 2 : 1;
    if (ned == 2 && ed[1].s < ed[0].s) {
        struct gw_frp_edit tmp = ed[0];
        ed[0] = ed[1];
        ed[1] = tmp;
    }
    size_t total = len;
    for (size_t i = 0; i < ned; i++)
        total = total - (ed[i].e - ed[i].s) + ed[i].rl;
    char *o = malloc(total + 1), *w = o;
    if (!o) {
        free(enc);
        return -1;
    }
    size_t pos = 0;
    for (size_t i = 0; i < ned; i++) {
        memcpy(w, data + pos, ed[i].s - pos);
        w += ed[i].s - pos;
        memcpy(w, ed[i].r, ed[i].rl);
        w += ed[i].rl;
        pos = ed[i].e;
    }
    memcpy(w, data + pos, len - pos);
    o[total] = '\0';
    free(enc);
    gw_flt_resp_add(x, t, tn);
    return gw_payloads_push(out, o, total);
}

static void gw_flt_resp_blocked(gw_payloads_t *out)
{
    json_t *e = json_pack("{s:s, s:s, s:s, s:n}", "type", "error", "code", "content_filter",
                          "message", "The answer was stopped by a content filter.", "param");
    gw_flt_resp_push(out, e);
    json_decref(e);
}

/* A delta event found by gw_frp_scan. -1: take the general path (the text
 * was not fed: a string jansson would not decode). */
static int gw_flt_resp_fast(gw_flt_resp_t *x, flt_stream_t *st, const gw_frp_t *p, const char *data,
                            size_t len, gw_payloads_t *out, gw_ev_rc_t *rc)
{
    const char *t = data + p->ds + 1;
    size_t tn = p->de - p->ds - 2;
    json_t *dec = NULL;
    if (memchr(t, '\\', tn)) { /* escapes: that one string decoded by jansson */
        dec = json_loadb(data + p->ds, p->de - p->ds, JSON_DECODE_ANY, NULL);
        if (!json_is_string(dec)) {
            json_decref(dec);
            return -1;
        }
        t = json_string_value(dec);
        tn = json_string_length(dec);
    }
    const char *rel;
    size_t rlen;
    flt_ev_verdict_t v = flt_stream_text(st, 0, t, tn, &rel, &rlen);
    if (v == FLT_EV_PASS) {
        gw_flt_resp_add(x, t, tn);
        *rc = GW_EV_PASS;
    } else if (v == FLT_EV_REPLACE) {
        *rc = GW_EV_REPLACE; /* nothing released: the event is dropped */
        if (rlen && gw_flt_resp_splice(x, p, data, len, rel, rlen, out) != 0)
            *rc = GW_EV_STOP;
        if (x->oom || *rc == GW_EV_STOP) {
            gw_flt_resp_blocked(out);
            *rc = GW_EV_STOP;
        }
    } else {
        gw_flt_resp_blocked(out);
        *rc = GW_EV_STOP;
    }
    json_decref(dec);
    return 0;
}

gw_ev_rc_t gw_flt_resp_event(gw_flt_resp_t *x, flt_stream_t *st, const char *data, size_t len,
                             gw_payloads_t *out)
{
    gw_frp_t fp;
    gw_ev_rc_t frc;
    if (gw_frp_scan(&fp, data, len) && gw_flt_resp_fast(x, st, &fp, data, len, out, &frc) == 0)
        return frc;
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
