/*
 * entry.c — the stored answer, the recorder that assembles it from a JSON
 * answer or from the chat.completion.chunk events of a stream, and the
 * replayer that renders it in the shape the client asked for: a
 * chat.completion object, or SSE chunks (role, content, tool calls,
 * finish, the usage chunk when include_usage) ending in [DONE]. A JSON
 * answer replays as a stream and a stream as JSON; the official openai
 * clients parse both.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_internal.h"

/* ---- the entry ------------------------------------------------------------ */

cache_entry_t *cache_entry_new(void)
{
    cache_entry_t *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->obj = json_object();
    if (!e->obj) {
        free(e);
        return NULL;
    }
    return e;
}

void cache_entry_free(cache_entry_t *e)
{
    if (!e)
        return;
    json_decref(e->obj);
    free(e->raw);
    free(e);
}

/* The encoded form: one header line "SC2 <stored_ms> <entry> <json> <sse>
 * <sse+usage>\n" (decimal lengths), then the four texts back to back. */
#define CACHE_ENC_MAGIC "SC2 "

char *cache_entry_encode(const cache_entry_t *e, size_t *len)
{
    json_t *obj = cache_entry_obj(e);
    if (!obj)
        return NULL;
    cache_replay_opts_t plain = {0}, usage = {.include_usage = true};
    json_t *bj = cache_entry_json(e, &plain);
    char *ej = json_dumps(obj, JSON_COMPACT);
    char *body = bj ? json_dumps(bj, JSON_COMPACT) : NULL;
    size_t sl = 0, sul = 0;
    char *sse = cache_entry_sse_body(e, &plain, &sl);
    char *sseu = cache_entry_sse_body(e, &usage, &sul);
    json_decref(bj);
    char *out = NULL;
    if (ej && body && sse && sseu) {
        size_t el = strlen(ej), bl = strlen(body);
        char hdr[128];
        int hl = snprintf(hdr, sizeof(hdr), CACHE_ENC_MAGIC "%lld %zu %zu %zu %zu\n",
                          (long long)e->stored_ms, el, bl, sl, sul);
        size_t total = (size_t)hl + el + bl + sl + sul;
        out = malloc(total + 1);
        if (out) {
            char *p = out;
            p = mempcpy(p, hdr, (size_t)hl);
            p = mempcpy(p, ej, el);
            p = mempcpy(p, body, bl);
            p = mempcpy(p, sse, sl);
            p = mempcpy(p, sseu, sul);
            *p = '\0';
            if (len)
                *len = total;
        }
    }
    free(ej);
    free(body);
    free(sse);
    free(sseu);
    return out;
}

/* The entry's invariants, checked when its JSON is parsed (the store is
 * outside the process: never trust it to be well formed). */
static bool cache_entry_valid(const json_t *o)
{
    const json_t *ch = json_object_get(o, "choices");
    if (!json_is_array(ch) || json_array_size(ch) == 0 || json_array_size(ch) > CACHE_MAX_CHOICES ||
        !json_is_string(json_object_get(o, "model")) || !json_is_string(json_object_get(o, "id")) ||
        !json_is_integer(json_object_get(o, "created")))
        return false;
    for (size_t i = 0; i < json_array_size(ch); i++) {
        const json_t *c = json_array_get(ch, i);
        const json_t *m = json_object_get(c, "message");
        const json_t *content = json_object_get(m, "content");
        const json_t *tc = json_object_get(m, "tool_calls");
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")) ||
            !(json_is_string(content) || json_is_null(content)) || (tc && !json_is_array(tc)) ||
            !json_is_string(json_object_get(c, "finish_reason")))
            return false;
    }
    const json_t *u = json_object_get(o, "usage");
    return !u || json_is_object(u);
}

json_t *cache_entry_obj(const cache_entry_t *e)
{
    if (!e)
        return NULL;
    if (!e->obj && e->ejson) {
        json_t *o = json_loadb(e->ejson, e->ejson_len, JSON_REJECT_DUPLICATES, NULL);
        if (!json_is_object(o) || !cache_entry_valid(o)) {
            json_decref(o);
            return NULL;
        }
        ((cache_entry_t *)e)->obj = o; /* a cache of the parse: entries are per request */
    }
    return e->obj;
}

static bool cache_ends_with(const char *s, size_t n, const char *tail)
{
    size_t tn = strlen(tail);
    return n >= tn && memcmp(s + n - tn, tail, tn) == 0;
}

cache_entry_t *cache_entry_decode(const char *s, size_t len)
{
    /* Only the framing is checked here (cheap, on every hit); the JSON is
     * parsed and validated when an accessor needs it. */
    if (!s || len < 4 || memcmp(s, CACHE_ENC_MAGIC, 4) != 0)
        return NULL;
    const char *nl = memchr(s, '\n', SL_MIN(len, (size_t)128));
    if (!nl)
        return NULL;
    char hdr[128];
    memcpy(hdr, s, (size_t)(nl - s));
    hdr[nl - s] = '\0';
    long long stored;
    size_t el, bl, sl, sul;
    int used = 0;
    if (sscanf(hdr, CACHE_ENC_MAGIC "%lld %zu %zu %zu %zu%n", &stored, &el, &bl, &sl, &sul,
               &used) != 5 ||
        (size_t)used != (size_t)(nl - s))
        return NULL;
    size_t off = (size_t)(nl - s) + 1;
    if (el > len || bl > len || sl > len || sul > len || off + el + bl + sl + sul != len ||
        el == 0 || bl == 0)
        return NULL;
    cache_entry_t *e = calloc(1, sizeof(*e));
    char *raw = malloc(len + 1);
    if (!e || !raw) {
        free(e);
        free(raw);
        return NULL;
    }
    memcpy(raw, s, len);
    raw[len] = '\0';
    e->raw = raw;
    e->stored_ms = stored;
    e->ejson = raw + off;
    e->ejson_len = el;
    e->body = e->ejson + el;
    e->body_len = bl;
    e->sse = e->body + bl;
    e->sse_len = sl;
    e->sseu = e->sse + sl;
    e->sseu_len = sul;
    if (e->ejson[0] != '{' || e->body[0] != '{' || e->body[bl - 1] != '}' ||
        !cache_ends_with(e->sse, sl, "data: [DONE]\n\n") ||
        !cache_ends_with(e->sseu, sul, "data: [DONE]\n\n")) {
        cache_entry_free(e);
        return NULL;
    }
    return e;
}

const char *cache_entry_rendered(const cache_entry_t *e, bool stream, bool include_usage,
                                 size_t *len)
{
    if (!e || !e->raw)
        return NULL;
    if (!stream) {
        *len = e->body_len;
        return e->body;
    }
    *len = include_usage ? e->sseu_len : e->sse_len;
    return include_usage ? e->sseu : e->sse;
}

size_t cache_entry_nchoices(const cache_entry_t *e)
{
    return json_array_size(json_object_get(cache_entry_obj(e), "choices"));
}

static const json_t *cache_entry_choice(const cache_entry_t *e, size_t i)
{
    return json_array_get(json_object_get(cache_entry_obj(e), "choices"), i);
}

const char *cache_entry_content(const cache_entry_t *e, size_t i)
{
    return json_string_value(
        json_object_get(json_object_get(cache_entry_choice(e, i), "message"), "content"));
}

const char *cache_entry_finish(const cache_entry_t *e, size_t i)
{
    return json_string_value(json_object_get(cache_entry_choice(e, i), "finish_reason"));
}

int64_t cache_entry_stored_ms(const cache_entry_t *e)
{
    return e ? e->stored_ms : 0;
}

const json_t *cache_entry_usage(const cache_entry_t *e)
{
    return json_object_get(cache_entry_obj(e), "usage");
}

/* ---- the recorder ----------------------------------------------------------- */

static const char *const cache_taint_names[] = {"error",     "fallback",  "filtered",
                                                "truncated", "too_large", "malformed"};

const char *cache_taint_name(unsigned taint)
{
    for (size_t i = 0; i < SL_ARRAY_LEN(cache_taint_names); i++)
        if (taint & (1u << i))
            return cache_taint_names[i];
    return "none";
}

typedef struct cache_rchoice {
    bool seen;
    char *role;
    sl_buf_t content;
    bool has_content;
    json_t *tool_calls; /* array of {id, type, function: {name, arguments}} */
    char *finish;
} cache_rchoice_t;

struct cache_rec {
    int64_t max_bytes;
    int64_t used;
    unsigned taint;
    bool streamed, done, have_body;
    json_t *head; /* id, model, created, system_fingerprint from the first chunk */
    json_t *usage;
    json_t *body; /* a whole JSON answer */
    cache_rchoice_t ch[CACHE_MAX_CHOICES];
};

cache_rec_t *cache_rec_new(int64_t max_bytes)
{
    cache_rec_t *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->max_bytes = max_bytes > 0 ? max_bytes : INT64_MAX;
    return r;
}

void cache_rec_free(cache_rec_t *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < CACHE_MAX_CHOICES; i++) {
        free(r->ch[i].role);
        free(r->ch[i].content.p);
        json_decref(r->ch[i].tool_calls);
        free(r->ch[i].finish);
    }
    json_decref(r->head);
    json_decref(r->usage);
    json_decref(r->body);
    free(r);
}

void cache_rec_taint(cache_rec_t *r, unsigned taint)
{
    if (r)
        r->taint |= taint;
}

unsigned cache_rec_taints(const cache_rec_t *r)
{
    return r ? r->taint : CACHE_TAINT_MALFORMED;
}

/* Counts n bytes against the budget; false (and TOO_LARGE) past it. */
static bool cache_rec_spend(cache_rec_t *r, size_t n)
{
    r->used += (int64_t)n;
    if (r->used > r->max_bytes) {
        r->taint |= CACHE_TAINT_TOO_LARGE;
        return false;
    }
    return true;
}

static int cache_set_str(char **dst, const json_t *v)
{
    if (!json_is_string(v))
        return 0;
    char *s = strdup(json_string_value(v));
    if (!s)
        return -1;
    free(*dst);
    *dst = s;
    return 0;
}

/* Appends a string field of src to the same field of dst (both objects). */
static int cache_append_field(json_t *dst, const json_t *src, const char *k)
{
    const json_t *add = json_object_get(src, k);
    if (!add || json_is_null(add))
        return 0;
    if (!json_is_string(add))
        return -1;
    const json_t *cur = json_object_get(dst, k);
    size_t cn = json_is_string(cur) ? json_string_length(cur) : 0;
    size_t an = json_string_length(add);
    char *s = malloc(cn + an + 1);
    if (!s)
        return -1;
    if (cn)
        memcpy(s, json_string_value(cur), cn);
    memcpy(s + cn, json_string_value(add), an);
    int rc = json_object_set_new(dst, k, json_stringn(s, cn + an));
    free(s);
    return rc;
}

/* Merges streamed tool-call deltas into the choice's calls, by index. */
static int cache_rec_tools(cache_rec_t *r, cache_rchoice_t *c, const json_t *deltas)
{
    if (!json_is_array(deltas))
        return -1;
    if (!c->tool_calls && !(c->tool_calls = json_array()))
        return -1;
    for (size_t i = 0; i < json_array_size(deltas); i++) {
        const json_t *d = json_array_get(deltas, i);
        const json_t *ix = json_object_get(d, "index");
        if (!json_is_integer(ix) || json_integer_value(ix) < 0 ||
            json_integer_value(ix) >= CACHE_MAX_TOOL_CALLS)
            return -1;
        size_t k = (size_t)json_integer_value(ix);
        while (json_array_size(c->tool_calls) <= k)
            json_array_append_new(c->tool_calls,
                                  json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", "", "type",
                                            "function", "function", "name", "", "arguments", ""));
        json_t *call = json_array_get(c->tool_calls, k);
        json_t *fn = json_object_get(call, "function");
        const json_t *dfn = json_object_get(d, "function");
        if (!fn)
            return -1;
        if (json_is_string(json_object_get(d, "id")))
            json_object_set(call, "id", json_object_get(d, "id"));
        if (json_is_string(json_object_get(d, "type")))
            json_object_set(call, "type", json_object_get(d, "type"));
        if (dfn && !json_is_object(dfn))
            return -1;
        const json_t *name = json_object_get(dfn, "name"),
                     *args = json_object_get(dfn, "arguments");
        size_t n = (json_is_string(name) ? json_string_length(name) : 0) +
                   (json_is_string(args) ? json_string_length(args) : 0);
        if (!cache_rec_spend(r, n))
            return 0;
        if (cache_append_field(fn, dfn, "name") != 0 ||
            cache_append_field(fn, dfn, "arguments") != 0)
            return -1;
    }
    return 0;
}

static void cache_rec_head(cache_rec_t *r, const json_t *o)
{
    if (r->head)
        return;
    r->head = json_object();
    if (!r->head)
        return;
    static const char *const keys[] = {"id", "model", "created", "system_fingerprint"};
    for (size_t i = 0; i < SL_ARRAY_LEN(keys); i++) {
        json_t *v = json_object_get(o, keys[i]);
        if (v && !json_is_null(v))
            json_object_set(r->head, keys[i], v);
    }
}

void cache_rec_event(cache_rec_t *r, const char *data, size_t len)
{
    if (!r || r->taint)
        return;
    r->streamed = true;
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        r->done = true;
        return;
    }
    if (r->done) {
        r->taint |= CACHE_TAINT_MALFORMED; /* events after [DONE] */
        return;
    }
    json_t *o = json_loadb(data, len, 0, NULL);
    if (!json_is_object(o)) {
        r->taint |= CACHE_TAINT_MALFORMED;
        json_decref(o);
        return;
    }
    if (json_object_get(o, "error")) {
        r->taint |= CACHE_TAINT_ERROR;
        goto out;
    }
    const char *obj = json_string_value(json_object_get(o, "object"));
    const json_t *choices = json_object_get(o, "choices");
    if (!obj || strcmp(obj, "chat.completion.chunk") != 0 || !json_is_array(choices)) {
        r->taint |= CACHE_TAINT_MALFORMED;
        goto out;
    }
    cache_rec_head(r, o);
    const json_t *u = json_object_get(o, "usage");
    if (json_is_object(u)) {
        json_decref(r->usage);
        r->usage = json_deep_copy(u);
    }
    for (size_t i = 0; i < json_array_size(choices); i++) {
        const json_t *c = json_array_get(choices, i);
        const json_t *ix = json_object_get(c, "index");
        const json_t *d = json_object_get(c, "delta");
        const json_t *lp = json_object_get(c, "logprobs");
        if (!json_is_integer(ix) || json_integer_value(ix) < 0 ||
            json_integer_value(ix) >= CACHE_MAX_CHOICES || (d && !json_is_object(d)) ||
            (lp && !json_is_null(lp))) {
            r->taint |= CACHE_TAINT_MALFORMED;
            goto out;
        }
        cache_rchoice_t *ch = &r->ch[json_integer_value(ix)];
        ch->seen = true;
        const json_t *content = json_object_get(d, "content");
        const json_t *refusal = json_object_get(d, "refusal");
        if (refusal && !json_is_null(refusal)) {
            r->taint |= CACHE_TAINT_FILTERED; /* a refusal is kept out: policy may change */
            goto out;
        }
        if (cache_set_str(&ch->role, json_object_get(d, "role")) != 0 ||
            cache_set_str(&ch->finish, json_object_get(c, "finish_reason")) != 0) {
            r->taint |= CACHE_TAINT_MALFORMED;
            goto out;
        }
        if (json_is_string(content)) {
            ch->has_content = true;
            size_t n = json_string_length(content);
            if (!cache_rec_spend(r, n))
                goto out;
            if (sl_buf_add(&ch->content, json_string_value(content), n) != 0) {
                r->taint |= CACHE_TAINT_MALFORMED;
                goto out;
            }
        }
        const json_t *tc = json_object_get(d, "tool_calls");
        if (tc && !json_is_null(tc) && cache_rec_tools(r, ch, tc) != 0) {
            r->taint |= CACHE_TAINT_MALFORMED;
            goto out;
        }
    }
out:
    json_decref(o);
}

void cache_rec_body(cache_rec_t *r, const json_t *answer)
{
    if (!r || r->taint)
        return;
    const char *obj = json_string_value(json_object_get(answer, "object"));
    if (!json_is_object(answer) || json_object_get(answer, "error")) {
        r->taint |= CACHE_TAINT_ERROR;
        return;
    }
    if (!obj || strcmp(obj, "chat.completion") != 0 || r->have_body) {
        r->taint |= CACHE_TAINT_MALFORMED;
        return;
    }
    r->have_body = true;
    r->body = json_deep_copy(answer);
    if (!r->body)
        r->taint |= CACHE_TAINT_MALFORMED;
}

/* A choice as the entry keeps it, or NULL (and why in *taint). */
static json_t *cache_choice_build(size_t index, const char *role, const json_t *content,
                                  const json_t *tool_calls, const char *finish, unsigned *taint)
{
    if (!finish) {
        *taint |= CACHE_TAINT_TRUNCATED;
        return NULL;
    }
    if (strcmp(finish, "length") == 0) {
        *taint |= CACHE_TAINT_TRUNCATED;
        return NULL;
    }
    if (strcmp(finish, "content_filter") == 0) {
        *taint |= CACHE_TAINT_FILTERED;
        return NULL;
    }
    if (!(json_is_string(content) || (json_is_null(content) && tool_calls))) {
        *taint |= CACHE_TAINT_MALFORMED;
        return NULL;
    }
    json_t *msg = json_pack("{s:s, s:O}", "role", role ? role : "assistant", "content", content);
    if (msg && json_array_size(tool_calls))
        json_object_set(msg, "tool_calls", (json_t *)tool_calls);
    json_t *c = msg ? json_pack("{s:I, s:o, s:s}", "index", (json_int_t)index, "message", msg,
                                "finish_reason", finish)
                    : NULL;
    if (!c)
        *taint |= CACHE_TAINT_MALFORMED;
    return c;
}

cache_entry_t *cache_rec_finish(cache_rec_t *r, unsigned *taint)
{
    unsigned dummy;
    if (!taint)
        taint = &dummy;
    *taint = r ? r->taint : CACHE_TAINT_MALFORMED;
    if (!r || r->taint)
        return NULL;
    if (r->streamed && r->have_body) {
        *taint |= CACHE_TAINT_MALFORMED;
        return NULL;
    }
    if (!r->streamed && !r->have_body) {
        *taint |= CACHE_TAINT_TRUNCATED;
        return NULL;
    }
    if (r->streamed && !r->done) {
        *taint |= CACHE_TAINT_TRUNCATED;
        return NULL;
    }
    json_t *choices = json_array();
    json_t *obj = json_object();
    if (!choices || !obj)
        goto bad;
    const json_t *src = r->streamed ? r->head : r->body;
    static const char *const keys[] = {"id", "model", "created", "system_fingerprint"};
    for (size_t i = 0; src && i < SL_ARRAY_LEN(keys); i++) {
        json_t *v = json_object_get(src, keys[i]);
        if (v && !json_is_null(v))
            json_object_set(obj, keys[i], v);
    }
    if (r->streamed) {
        size_t n = 0;
        while (n < CACHE_MAX_CHOICES && r->ch[n].seen)
            n++;
        for (size_t i = n; i < CACHE_MAX_CHOICES; i++)
            if (r->ch[i].seen) { /* a hole in the indexes */
                *taint |= CACHE_TAINT_MALFORMED;
                goto bad;
            }
        for (size_t i = 0; i < n; i++) {
            cache_rchoice_t *c = &r->ch[i];
            json_t *content = c->has_content
                                  ? json_stringn(c->content.p ? c->content.p : "", c->content.len)
                                  : json_null();
            json_t *ch = cache_choice_build(i, c->role, content, c->tool_calls, c->finish, taint);
            json_decref(content);
            if (!ch)
                goto bad;
            json_array_append_new(choices, ch);
        }
        if (r->usage)
            json_object_set(obj, "usage", r->usage);
    } else {
        const json_t *bc = json_object_get(r->body, "choices");
        if (!json_is_array(bc) || json_array_size(bc) > CACHE_MAX_CHOICES) {
            *taint |= CACHE_TAINT_MALFORMED;
            goto bad;
        }
        for (size_t i = 0; i < json_array_size(bc); i++) {
            const json_t *c = json_array_get(bc, i);
            const json_t *m = json_object_get(c, "message");
            const json_t *lp = json_object_get(c, "logprobs");
            const json_t *rf = json_object_get(m, "refusal");
            const json_t *ix = json_object_get(c, "index");
            if (!json_is_object(m) || (lp && !json_is_null(lp)) ||
                (ix && json_integer_value(ix) != (json_int_t)i)) {
                *taint |= CACHE_TAINT_MALFORMED;
                goto bad;
            }
            if (rf && !json_is_null(rf)) {
                *taint |= CACHE_TAINT_FILTERED;
                goto bad;
            }
            const json_t *content = json_object_get(m, "content");
            json_t *tc = json_object_get(m, "tool_calls");
            json_t *ch =
                cache_choice_build(i, json_string_value(json_object_get(m, "role")),
                                   content ? content : json_null(), json_is_array(tc) ? tc : NULL,
                                   json_string_value(json_object_get(c, "finish_reason")), taint);
            if (!ch)
                goto bad;
            json_array_append_new(choices, ch);
        }
        const json_t *u = json_object_get(r->body, "usage");
        if (json_is_object(u))
            json_object_set(obj, "usage", (json_t *)u);
    }
    if (json_array_size(choices) == 0) {
        *taint |= CACHE_TAINT_MALFORMED;
        goto bad;
    }
    json_object_set(obj, "choices", choices);
    if (!json_is_string(json_object_get(obj, "model")) ||
        !json_is_integer(json_object_get(obj, "created")) ||
        !json_is_string(json_object_get(obj, "id"))) {
        *taint |= CACHE_TAINT_MALFORMED;
        goto bad;
    }
    char *enc = json_dumps(obj, JSON_COMPACT);
    size_t elen = enc ? strlen(enc) : SIZE_MAX;
    free(enc);
    if (elen == SIZE_MAX || (int64_t)elen > r->max_bytes) {
        *taint |= elen == SIZE_MAX ? CACHE_TAINT_MALFORMED : CACHE_TAINT_TOO_LARGE;
        goto bad;
    }
    cache_entry_t *e = calloc(1, sizeof(*e));
    if (!e)
        goto bad;
    e->obj = obj;
    json_decref(choices);
    return e;
bad:
    json_decref(choices);
    json_decref(obj);
    return NULL;
}

/* ---- the replayer ----------------------------------------------------------- */

json_t *cache_entry_json(const cache_entry_t *e, const cache_replay_opts_t *o)
{
    json_t *j = json_deep_copy(cache_entry_obj(e));
    if (!j)
        return NULL;
    json_object_set_new(j, "object", json_string("chat.completion"));
    if (o && o->id)
        json_object_set_new(j, "id", json_string(o->id));
    if (o && o->created)
        json_object_set_new(j, "created", json_integer(o->created));
    json_t *choices = json_object_get(j, "choices");
    for (size_t i = 0; i < json_array_size(choices); i++) {
        json_t *c = json_array_get(choices, i);
        json_object_set_new(c, "logprobs", json_null());
        json_t *m = json_object_get(c, "message");
        if (!json_object_get(m, "refusal"))
            json_object_set_new(m, "refusal", json_null());
    }
    return j;
}

/* A chunk carrying one choice (or none: the usage chunk). */
static json_t *cache_chunk(const json_t *eo, const cache_replay_opts_t *o, json_t *choice)
{
    json_t *c = json_object();
    if (!c) {
        json_decref(choice);
        return NULL;
    }
    json_object_set_new(c, "id",
                        o && o->id ? json_string(o->id) : json_incref(json_object_get(eo, "id")));
    json_object_set_new(c, "object", json_string("chat.completion.chunk"));
    json_object_set_new(c, "created",
                        o && o->created ? json_integer(o->created)
                                        : json_incref(json_object_get(eo, "created")));
    json_object_set(c, "model", json_object_get(eo, "model"));
    json_t *fp = json_object_get(eo, "system_fingerprint");
    if (fp)
        json_object_set(c, "system_fingerprint", fp);
    json_t *arr = json_array();
    if (choice)
        json_array_append_new(arr, choice);
    json_object_set_new(c, "choices", arr);
    if (o && o->include_usage)
        json_object_set_new(c, "usage", json_null());
    return c;
}

static json_t *cache_delta(size_t i, json_t *delta, const char *finish)
{
    return json_pack("{s:I, s:o, s:n, s:s?}", "index", (json_int_t)i, "delta", delta, "logprobs",
                     "finish_reason", finish);
}

static int cache_emit_json(json_t *chunk, cache_emit_fn emit, void *arg)
{
    if (!chunk)
        return -1;
    char *s = json_dumps(chunk, JSON_COMPACT);
    json_decref(chunk);
    if (!s)
        return -1;
    int rc = emit(arg, s, strlen(s));
    free(s);
    return rc;
}

int cache_entry_sse(const cache_entry_t *e, const cache_replay_opts_t *o, cache_emit_fn emit,
                    void *arg)
{
    const json_t *eo = cache_entry_obj(e);
    if (!eo)
        return -1;
    const json_t *choices = json_object_get(eo, "choices");
    for (size_t i = 0; i < json_array_size(choices); i++) {
        const json_t *c = json_array_get(choices, i);
        const json_t *m = json_object_get(c, "message");
        const json_t *content = json_object_get(m, "content");
        const json_t *tc = json_object_get(m, "tool_calls");
        /* The role first, with empty content (null when the answer is tool
         * calls), as the servers send it. */
        json_t *d = json_object();
        if (d) {
            json_object_set(d, "role", json_object_get(m, "role"));
            json_object_set_new(d, "content",
                                json_is_string(content) ? json_string("") : json_null());
        }
        if (cache_emit_json(cache_chunk(eo, o, cache_delta(i, d, NULL)), emit, arg) != 0)
            return -1;
        if (json_is_string(content) && json_string_length(content) &&
            cache_emit_json(
                cache_chunk(eo, o, cache_delta(i, json_pack("{s:O}", "content", content), NULL)),
                emit, arg) != 0)
            return -1;
        if (json_array_size(tc)) {
            json_t *calls = json_array();
            for (size_t k = 0; calls && k < json_array_size(tc); k++) {
                json_t *call = json_deep_copy(json_array_get(tc, k));
                if (call)
                    json_object_set_new(call, "index", json_integer((json_int_t)k));
                json_array_append_new(calls, call);
            }
            if (cache_emit_json(
                    cache_chunk(eo, o,
                                cache_delta(i, json_pack("{s:o}", "tool_calls", calls), NULL)),
                    emit, arg) != 0)
                return -1;
        }
        if (cache_emit_json(
                cache_chunk(eo, o,
                            cache_delta(i, json_object(),
                                        json_string_value(json_object_get(c, "finish_reason")))),
                emit, arg) != 0)
            return -1;
    }
    if (o && o->include_usage) {
        json_t *u = cache_chunk(eo, o, NULL);
        const json_t *usage = json_object_get(eo, "usage");
        if (u)
            json_object_set_new(u, "usage",
                                usage ? json_deep_copy(usage)
                                      : json_pack("{s:i, s:i, s:i}", "prompt_tokens", 0,
                                                  "completion_tokens", 0, "total_tokens", 0));
        if (cache_emit_json(u, emit, arg) != 0)
            return -1;
    }
    return emit(arg, "[DONE]", 6);
}

static int cache_frame(void *arg, const char *data, size_t len)
{
    sl_buf_t *b = arg;
    if (sl_buf_add(b, "data: ", 6) != 0 || sl_buf_add(b, data, len) != 0 ||
        sl_buf_add(b, "\n\n", 2) != 0)
        return -1;
    return 0;
}

char *cache_entry_sse_body(const cache_entry_t *e, const cache_replay_opts_t *o, size_t *len)
{
    sl_buf_t b = {0};
    if (cache_entry_sse(e, o, cache_frame, &b) != 0) {
        free(b.p);
        return NULL;
    }
    if (len)
        *len = b.len;
    return b.p;
}
