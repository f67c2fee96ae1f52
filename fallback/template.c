/*
 * template.c — the template reply: the configured text (per language by
 * Accept-Language) in exactly the shape the client asked for, so an app
 * renders it like any answer: a chat.completion (or text_completion) JSON
 * with zero usage and finish_reason "stop", or the SSE bytes of chunks
 * ending in `data: [DONE]`. The official SDKs parse both.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/sl.h"
#include "fallback/fb_internal.h"

struct fb_tmpl {
    char *text;
    char *json;   /* JSON modes' content, compact; NULL = built from the text */
    char **langs; /* configured tags, as written */
    char **texts;
    size_t n;
};

fb_tmpl_t *fb_tmpl_new(const conf_fb_template_t *c)
{
    fb_metrics_init();
    fb_tmpl_t *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->text = strdup(c->text ? c->text : "");
    if (c->json) { /* checked to be an object (hook_fallback.c); compacted once */
        json_t *j = json_loads(c->json, 0, NULL);
        t->json = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (!t->json) {
            fb_tmpl_free(t);
            return NULL;
        }
    }
    t->langs = calloc(c->ntexts + 1, sizeof(char *));
    t->texts = calloc(c->ntexts + 1, sizeof(char *));
    if (!t->text || !t->langs || !t->texts) {
        fb_tmpl_free(t);
        return NULL;
    }
    for (size_t i = 0; i < c->ntexts; i++) {
        t->langs[i] = strdup(c->texts[i].key);
        t->texts[i] = strdup(c->texts[i].value);
        t->n = i + 1;
        if (!t->langs[i] || !t->texts[i]) {
            fb_tmpl_free(t);
            return NULL;
        }
    }
    return t;
}

void fb_tmpl_free(fb_tmpl_t *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++) {
        free(t->langs[i]);
        free(t->texts[i]);
    }
    free(t->langs);
    free(t->texts);
    free(t->text);
    free(t->json);
    free(t);
}

/* ---- Accept-Language (RFC 9110 12.5.4, lookup as in RFC 4647 3.4) ---------- */

#define FB_AL_MAX_ITEMS 32
#define FB_AL_MAX_TAG   35

typedef struct fb_al_item {
    const char *tag;
    size_t len;
    int q; /* thousandths */
    int order;
} fb_al_item_t;

static bool fb_is_ows(char c)
{
    return c == ' ' || c == '\t';
}

/* "q=0.8" -> 800; -1 when malformed. */
static int fb_al_qvalue(const char *p, size_t n)
{
    if (n < 1 || (p[0] != '0' && p[0] != '1'))
        return -1;
    int q = (p[0] - '0') * 1000;
    if (n == 1)
        return q;
    if (p[1] != '.' || n > 5)
        return -1;
    int scale = 100;
    for (size_t i = 2; i < n; i++, scale /= 10) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        q += (p[i] - '0') * scale;
    }
    return q > 1000 ? -1 : q;
}

static size_t fb_al_parse(const char *s, size_t len, fb_al_item_t *items)
{
    size_t n = 0;
    const char *end = s + len, *p = s;
    while (p < end && n < FB_AL_MAX_ITEMS) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *ie = comma ? comma : end;
        const char *a = p, *b = ie;
        p = comma ? comma + 1 : end;
        const char *semi = memchr(a, ';', (size_t)(b - a));
        const char *te = semi ? semi : b;
        while (a < te && fb_is_ows(*a))
            a++;
        while (te > a && fb_is_ows(te[-1]))
            te--;
        size_t tl = (size_t)(te - a);
        if (tl == 0 || tl > FB_AL_MAX_TAG)
            continue;
        bool ok = true;
        for (size_t i = 0; i < tl && ok; i++) {
            char c = a[i];
            ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '-' || (c == '*' && tl == 1);
        }
        if (!ok)
            continue;
        int q = 1000;
        while (semi && ok) {
            /* parameters: only q matters */
            const char *ps = semi + 1;
            const char *pe = memchr(ps, ';', (size_t)(b - ps));
            const char *stop = pe ? pe : b;
            while (ps < stop && fb_is_ows(*ps))
                ps++;
            const char *vs = stop;
            while (vs > ps && fb_is_ows(vs[-1]))
                vs--;
            if (vs - ps >= 2 && (ps[0] == 'q' || ps[0] == 'Q') && ps[1] == '=') {
                q = fb_al_qvalue(ps + 2, (size_t)(vs - ps - 2));
                if (q < 0)
                    ok = false;
            }
            semi = pe;
        }
        if (!ok || q == 0)
            continue;
        items[n].tag = a;
        items[n].len = tl;
        items[n].q = q;
        items[n].order = (int)n;
        n++;
    }
    /* Stable by q, highest first (insertion sort: at most 32 items). */
    for (size_t i = 1; i < n; i++) {
        fb_al_item_t x = items[i];
        size_t j = i;
        while (j > 0 && items[j - 1].q < x.q) {
            items[j] = items[j - 1];
            j--;
        }
        items[j] = x;
    }
    return n;
}

static const char *fb_tmpl_find(const fb_tmpl_t *t, const char *tag, size_t len, size_t *idx)
{
    for (size_t i = 0; i < t->n; i++)
        if (strlen(t->langs[i]) == len && strncasecmp(t->langs[i], tag, len) == 0) {
            *idx = i;
            return t->texts[i];
        }
    return NULL;
}

const char *fb_tmpl_pick(const fb_tmpl_t *t, const char *al, size_t len, const char **lang)
{
    if (lang)
        *lang = NULL;
    if (!al || !len || !t->n)
        return t->text;
    fb_al_item_t items[FB_AL_MAX_ITEMS];
    size_t n = fb_al_parse(al, len, items);
    for (size_t i = 0; i < n; i++) {
        if (items[i].len == 1 && items[i].tag[0] == '*')
            return t->text;
        /* Lookup: the whole tag, then without its last subtag, ... */
        size_t l = items[i].len;
        while (l > 0) {
            size_t idx;
            const char *x = fb_tmpl_find(t, items[i].tag, l, &idx);
            if (x) {
                if (lang)
                    *lang = t->langs[idx];
                return x;
            }
            while (l > 0 && items[i].tag[l - 1] != '-')
                l--;
            if (l > 0)
                l--; /* drop the '-' too */
        }
    }
    return t->text;
}

/* ---- rendering ------------------------------------------------------------ */

void fb_reply_req_from_json(const json_t *body, fb_reply_req_t *q)
{
    q->stream = json_is_true(json_object_get(body, "stream"));
    const json_t *so = json_object_get(body, "stream_options");
    q->include_usage = q->stream && json_is_true(json_object_get(so, "include_usage"));
    const json_t *m = json_object_get(body, "model");
    q->model = json_is_string(m) ? json_string_value(m) : NULL;
    const json_t *n = json_object_get(body, "n");
    json_int_t nv = json_is_integer(n) ? json_integer_value(n) : 1;
    q->n = (int)(nv < 1 ? 1 : nv > FB_REPLY_MAX_N ? FB_REPLY_MAX_N : nv);
    const char *rf =
        json_string_value(json_object_get(json_object_get(body, "response_format"), "type"));
    q->json_mode = rf && (strcmp(rf, "json_object") == 0 || strcmp(rf, "json_schema") == 0);
    const json_t *tc = json_object_get(body, "tool_choice");
    /* "required", or {"type":"function","function":{"name":...}}: the client
     * will read tool_calls, and a template has none to give. */
    q->tools_required = json_array_size(json_object_get(body, "tools")) > 0 &&
                        ((json_is_string(tc) && strcmp(json_string_value(tc), "required") == 0) ||
                         json_is_object(tc));
}

const char *fb_reply_content_type(const fb_reply_req_t *q)
{
    return q->stream ? "text/event-stream" : "application/json";
}

static json_t *fb_usage_zero(void)
{
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", 0, "completion_tokens", 0, "total_tokens",
                     0);
}

/* The fields every object of the reply shares. */
static json_t *fb_reply_base(const fb_reply_req_t *q, const char *id, const char *object)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:n}", "id", id, "object", object, "created",
                     (json_int_t)q->created, "model", q->model ? q->model : "",
                     "system_fingerprint");
}

typedef struct fb_buf {
    char *p;
    size_t len, cap;
    bool oom;
} fb_buf_t;

static void fb_buf_add(fb_buf_t *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 512;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* "data: {json}\n\n"; takes obj. */
static int fb_sse_add(json_t *obj, fb_buf_t *out)
{
    if (!obj) {
        out->oom = true;
        return -1;
    }
    char *s = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (!s) {
        out->oom = true;
        return -1;
    }
    fb_buf_add(out, "data: ", 6);
    fb_buf_add(out, s, strlen(s));
    fb_buf_add(out, "\n\n", 2);
    free(s);
    return 0;
}

/* One streamed chunk: chat's delta or completions' text. */
static json_t *fb_chunk(const fb_reply_req_t *q, const char *id, int index, json_t *delta_or_text,
                        const char *finish)
{
    bool chat = q->api == FB_API_CHAT;
    json_t *o = fb_reply_base(q, id, chat ? "chat.completion.chunk" : "text_completion");
    json_t *choice =
        json_pack("{s:i, s:o, s:n, s:o}", "index", index, chat ? "delta" : "text", delta_or_text,
                  "logprobs", "finish_reason", finish ? json_string(finish) : json_null());
    if (!o || !choice) {
        json_decref(o);
        json_decref(choice);
        return NULL;
    }
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    if (q->include_usage)
        json_object_set_new(o, "usage", json_null());
    return o;
}

char *fb_reply_render(const fb_reply_req_t *q, const char *text, size_t *len)
{
    bool chat = q->api == FB_API_CHAT;
    char id[96], rnd[17];
    if (!q->id) {
        snprintf(rnd, sizeof(rnd), "%016llx", (unsigned long long)fb_rand64());
    }
    snprintf(id, sizeof(id), "%s%.64s", chat ? "chatcmpl-" : "cmpl-", q->id ? q->id : rnd);
    if (!text)
        text = "";

    if (!q->stream) {
        json_t *o = fb_reply_base(q, id, chat ? "chat.completion" : "text_completion");
        json_t *choices = json_array();
        int nc = q->n > 0 ? q->n : 1;
        for (int i = 0; o && choices && i < nc; i++) {
            json_t *choice = chat ? json_pack("{s:i, s:{s:s, s:s, s:n}, s:n, s:s}", "index", i,
                                              "message", "role", "assistant", "content", text,
                                              "refusal", "logprobs", "finish_reason", "stop")
                                  : json_pack("{s:i, s:s, s:n, s:s}", "index", i, "text", text,
                                              "logprobs", "finish_reason", "stop");
            if (!choice || json_array_append_new(choices, choice) != 0) {
                json_decref(choices);
                choices = NULL;
            }
        }
        if (!o || !choices) {
            json_decref(o);
            json_decref(choices);
            return NULL;
        }
        json_object_set_new(o, "choices", choices);
        json_object_set_new(o, "usage", fb_usage_zero());
        char *s = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        if (s && len)
            *len = strlen(s);
        return s;
    }

    fb_buf_t out = {0};
    int nc = q->n > 0 ? q->n : 1;
    for (int i = 0; i < nc; i++) { /* each choice whole, one after the other */
        if (chat) {
            fb_sse_add(fb_chunk(q, id, i,
                                json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL),
                       &out);
            fb_sse_add(fb_chunk(q, id, i, json_pack("{s:s}", "content", text), NULL), &out);
            fb_sse_add(fb_chunk(q, id, i, json_object(), "stop"), &out);
        } else {
            fb_sse_add(fb_chunk(q, id, i, json_string(text), NULL), &out);
            fb_sse_add(fb_chunk(q, id, i, json_string(""), "stop"), &out);
        }
    }
    if (q->include_usage) {
        json_t *u = fb_reply_base(q, id, chat ? "chat.completion.chunk" : "text_completion");
        if (u) {
            json_object_set_new(u, "choices", json_array());
            json_object_set_new(u, "usage", fb_usage_zero());
        }
        fb_sse_add(u, &out);
    }
    fb_buf_add(&out, "data: [DONE]\n\n", 14);
    if (out.oom) {
        free(out.p);
        return NULL;
    }
    if (len)
        *len = out.len;
    return out.p;
}

char *fb_tmpl_render(const fb_tmpl_t *t, const fb_reply_req_t *q, const char *al, size_t al_len,
                     size_t *len)
{
    const char *text = fb_tmpl_pick(t, al, al_len, NULL);
    char *built = NULL;
    if (q->json_mode) {
        /* The app will JSON.parse the content: give it an object it can
         * recognise as "no answer" rather than prose. */
        if (t->json) {
            text = t->json;
        } else {
            json_t *o = json_pack("{s:s, s:s}", "error", "unavailable", "message", text);
            built = o ? json_dumps(o, JSON_COMPACT) : NULL;
            json_decref(o);
            if (!built)
                return NULL;
            text = built;
        }
    }
    char *s = fb_reply_render(q, text, len);
    free(built);
    if (s)
        fb_count_tier(FB_TIER_TEMPLATE);
    return s;
}
