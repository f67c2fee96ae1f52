/*
 * stream.c — the answer side: SSE data payloads of a streamed
 * chat.completion in, payloads to send out. Each choices[].index gets its
 * own text channel (scan.c); this file only takes the JSON apart and puts it
 * back together. An event whose text is released unchanged is passed as the
 * very bytes the upstream sent (no re-serialisation on the common path).
 */
#include <stdlib.h>
#include <string.h>

#include "filters/flt_internal.h"

/* Top-level keys copied into the chunks we make ourselves. */
static const char *const flt_tmpl_keys[] = {"id", "object", "created", "model",
                                            "system_fingerprint"};

struct flt_stream {
    flt_ruleset_t *rs; /* one reference, dropped by _free */
    flt_chan_t *ch[FLT_MAX_CHOICES];
    int idx[FLT_MAX_CHOICES];
    size_t nch;
    json_t *tmpl; /* the template keys of the first chunk */
    int block_rule;
    bool blocked;
    sl_buf_t buf, fbuf; /* scratch, reused per event */
};

void flt_out_reset(flt_out_t *o)
{
    for (size_t i = 0; i < o->n; i++)
        free(o->v[i].data);
    o->n = 0;
}

void flt_out_release(flt_out_t *o)
{
    flt_out_reset(o);
    free(o->v);
    o->v = NULL;
    o->cap = 0;
}

/* Takes ownership of data. */
static int out_push(flt_out_t *o, char *data, size_t len)
{
    if (!data)
        return -1;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 4;
        flt_payload_t *v = realloc(o->v, cap * sizeof *v);
        if (!v) {
            free(data);
            return -1;
        }
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = (flt_payload_t){data, len};
    return 0;
}

static int out_push_json(flt_out_t *o, const json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    return out_push(o, s, s ? strlen(s) : 0);
}

flt_stream_t *flt_stream_new(flt_ruleset_t *rs)
{
    flt_stream_t *st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    st->rs = flt_ruleset_ref(rs);
    st->block_rule = -1;
    return st;
}

void flt_stream_free(flt_stream_t *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->nch; i++) {
        flt_chan_fini(st->ch[i]);
        free(st->ch[i]);
    }
    json_decref(st->tmpl);
    sl_buf_free(&st->buf);
    sl_buf_free(&st->fbuf);
    flt_ruleset_unref(st->rs);
    free(st);
}

static flt_chan_t *stream_chan_find(const flt_stream_t *st, int index)
{
    for (size_t i = 0; i < st->nch; i++)
        if (st->idx[i] == index)
            return st->ch[i];
    return NULL;
}

/* NULL when out of memory or past FLT_MAX_CHOICES (*full set). */
static flt_chan_t *stream_chan(flt_stream_t *st, int index, bool *full)
{
    flt_chan_t *c = stream_chan_find(st, index);
    if (c)
        return c;
    if (st->nch == FLT_MAX_CHOICES) {
        *full = true;
        return NULL;
    }
    c = malloc(sizeof *c);
    if (!c || flt_chan_init(c, st->rs) != 0) {
        free(c);
        return NULL;
    }
    st->ch[st->nch] = c;
    st->idx[st->nch] = index;
    st->nch++;
    return c;
}

size_t flt_stream_held(const flt_stream_t *st, int index)
{
    const flt_chan_t *c = stream_chan_find(st, index);
    return c ? flt_chan_held(c) : 0;
}

const char *flt_stream_block_rule(const flt_stream_t *st)
{
    return st->block_rule >= 0 ? st->rs->rules[st->block_rule].name : NULL;
}

static void stream_tmpl(flt_stream_t *st, json_t *root)
{
    if (st->tmpl)
        return;
    st->tmpl = json_object();
    if (!st->tmpl)
        return;
    for (size_t i = 0; i < SL_ARRAY_LEN(flt_tmpl_keys); i++) {
        json_t *v = json_object_get(root, flt_tmpl_keys[i]);
        if (v)
            json_object_set(st->tmpl, flt_tmpl_keys[i], v);
    }
}

/* A chunk of our own for one choice; takes ownership of delta. */
static int push_chunk(flt_stream_t *st, flt_out_t *out, int index, json_t *delta,
                      const char *finish)
{
    json_t *o = json_object(), *choice = json_object(), *arr = json_array();
    if (!o || !choice || !arr || !delta) {
        json_decref(o), json_decref(choice), json_decref(arr), json_decref(delta);
        return -1;
    }
    const char *k;
    json_t *v;
    if (st->tmpl) {
        json_object_foreach(st->tmpl, k, v) json_object_set(o, k, v);
    }
    if (!json_object_get(o, "object"))
        json_object_set_new(o, "object", json_string("chat.completion.chunk"));
    json_object_set_new(choice, "index", json_integer(index));
    json_object_set_new(choice, "delta", delta);
    json_object_set_new(choice, "logprobs", json_null());
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_array_append_new(arr, choice);
    json_object_set_new(o, "choices", arr);
    int rc = out_push_json(out, o);
    json_decref(o);
    return rc;
}

static json_t *text_delta(const char *s, size_t n)
{
    json_t *d = json_object();
    if (d && json_object_set_new(d, "content", json_stringn(s, n)) != 0) {
        json_decref(d);
        return NULL;
    }
    return d;
}

/* Stops the stream: one final chunk per unfinished choice. */
static flt_ev_verdict_t stream_block(flt_stream_t *st, flt_out_t *out, int rule)
{
    flt_out_reset(out);
    st->blocked = true;
    st->block_rule = rule;
    size_t sent = 0;
    for (size_t i = 0; i < st->nch; i++) {
        if (st->ch[i]->finished)
            continue;
        if (push_chunk(st, out, st->idx[i], json_object(), "content_filter") != 0)
            return FLT_EV_ERROR;
        sent++;
    }
    if (!sent &&
        push_chunk(st, out, st->nch ? st->idx[0] : 0, json_object(), "content_filter") != 0)
        return FLT_EV_ERROR;
    return FLT_EV_BLOCK;
}

static flt_ev_verdict_t stream_flush_all(flt_stream_t *st, flt_out_t *out)
{
    for (size_t i = 0; i < st->nch; i++) {
        flt_chan_t *c = st->ch[i];
        if (c->finished)
            continue;
        st->fbuf.len = 0;
        flt_chan_rc_t rc = flt_chan_finish(c, &st->fbuf);
        if (rc == FLT_CHAN_BLOCK)
            return stream_block(st, out, c->block_rule);
        if (rc != FLT_CHAN_OK)
            return FLT_EV_ERROR;
        if (st->fbuf.len &&
            push_chunk(st, out, st->idx[i], text_delta(st->fbuf.p, st->fbuf.len), NULL) != 0)
            return FLT_EV_ERROR;
    }
    return FLT_EV_REPLACE;
}

static bool json_is_set(const json_t *j)
{
    return j && !json_is_null(j);
}

/* A choice that, after filtering, says nothing: its delta is only an empty
 * content, no finish_reason, no logprobs. */
static bool choice_empty(json_t *choice)
{
    json_t *delta = json_object_get(choice, "delta");
    json_t *content = json_object_get(delta, "content");
    return json_object_size(delta) == 1 && json_is_string(content) &&
           json_string_length(content) == 0 &&
           !json_is_set(json_object_get(choice, "finish_reason")) &&
           !json_is_set(json_object_get(choice, "logprobs"));
}

/* One choice of a chunk: filters its delta.content in place, flushes on a
 * finish_reason (extra chunks go to `pre`). */
static flt_ev_verdict_t stream_choice(flt_stream_t *st, json_t *choice, size_t pos, flt_out_t *pre,
                                      bool *modified)
{
    json_t *ji = json_object_get(choice, "index");
    int index = json_is_integer(ji) ? (int)json_integer_value(ji) : (int)pos;
    bool full = false;
    flt_chan_t *c = stream_chan(st, index, &full);
    if (!c)
        return full ? stream_block(st, pre, -1) : FLT_EV_ERROR;
    json_t *delta = json_object_get(choice, "delta");
    json_t *content = json_is_object(delta) ? json_object_get(delta, "content") : NULL;
    sl_buf_t *b = &st->buf;
    b->len = 0;
    bool has_text = json_is_string(content);
    if (has_text) {
        const char *s = json_string_value(content);
        size_t n = json_string_length(content);
        /* text after this choice finished has no place to go: dropped */
        flt_chan_rc_t rc = c->finished ? FLT_CHAN_OK : flt_chan_feed(c, s, n, b);
        if (rc == FLT_CHAN_BLOCK)
            return stream_block(st, pre, c->block_rule);
        if (rc != FLT_CHAN_OK)
            return FLT_EV_ERROR;
    }
    if (json_is_set(json_object_get(choice, "finish_reason")) && !c->finished) {
        size_t before = b->len;
        flt_chan_rc_t rc = flt_chan_finish(c, b);
        if (rc == FLT_CHAN_BLOCK)
            return stream_block(st, pre, c->block_rule);
        if (rc != FLT_CHAN_OK)
            return FLT_EV_ERROR;
        if (!has_text && b->len > before) {
            /* held text goes out in a chunk of its own before the finish */
            if (push_chunk(st, pre, index, text_delta(b->p, b->len), NULL) != 0)
                return FLT_EV_ERROR;
        }
    }
    if (has_text) {
        if (b->len != json_string_length(content) ||
            memcmp(b->p ? b->p : "", json_string_value(content), b->len) != 0) {
            if (json_object_set_new(delta, "content", json_stringn(b->p ? b->p : "", b->len)) != 0)
                return FLT_EV_ERROR;
            *modified = true;
        }
    }
    if (json_is_set(json_object_get(choice, "logprobs"))) {
        json_object_set_new(choice, "logprobs", json_null());
        *modified = true;
    }
    return FLT_EV_PASS;
}

static flt_ev_verdict_t stream_event(flt_stream_t *st, const char *data, size_t len, flt_out_t *out)
{
    if (st->blocked)
        return FLT_EV_BLOCK;
    if (!flt_ruleset_filters_output(st->rs))
        return FLT_EV_PASS;
    size_t n = len;
    while (n && (data[n - 1] == ' ' || data[n - 1] == '\r' || data[n - 1] == '\n'))
        n--;
    if (n == 6 && memcmp(data, "[DONE]", 6) == 0) {
        flt_ev_verdict_t v = stream_flush_all(st, out);
        if (v != FLT_EV_REPLACE)
            return v;
        char *d = strdup("[DONE]");
        return out_push(out, d, 6) == 0 ? FLT_EV_REPLACE : FLT_EV_ERROR;
    }
    if (n == 0)
        return FLT_EV_PASS;
    /* a model may well emit U+0000; it is text, not a reason to block */
    json_t *root = json_loadb(data, n, JSON_ALLOW_NUL, NULL);
    if (!json_is_object(root)) {
        /* text we cannot read is text we cannot check: fail closed */
        json_decref(root);
        return stream_block(st, out, -1);
    }
    stream_tmpl(st, root);
    json_t *choices = json_object_get(root, "choices");
    if (!json_is_array(choices) || json_array_size(choices) == 0) {
        json_decref(root);
        return FLT_EV_PASS;
    }
    bool modified = false;
    size_t i;
    json_t *choice;
    json_array_foreach(choices, i, choice)
    {
        if (!json_is_object(choice))
            continue;
        flt_ev_verdict_t v = stream_choice(st, choice, i, out, &modified);
        if (v != FLT_EV_PASS) {
            json_decref(root);
            if (v == FLT_EV_ERROR)
                flt_out_reset(out);
            return v;
        }
    }
    if (!modified && out->n == 0) {
        json_decref(root);
        return FLT_EV_PASS;
    }
    bool drop = !json_is_set(json_object_get(root, "usage"));
    json_array_foreach(choices, i, choice) drop =
        drop && json_is_object(choice) && choice_empty(choice);
    int rc = drop ? 0 : out_push_json(out, root);
    json_decref(root);
    if (rc != 0) {
        flt_out_reset(out);
        return FLT_EV_ERROR;
    }
    return FLT_EV_REPLACE;
}

flt_ev_verdict_t flt_stream_event(flt_stream_t *st, const char *data, size_t len, flt_out_t *out)
{
    int64_t t0 = sl_now_ns();
    flt_ev_verdict_t v = stream_event(st, data, len, out);
    if (st->rs->event_seconds)
        sl_histogram_observe(st->rs->event_seconds, (double)(sl_now_ns() - t0) * 1e-9);
    return v;
}

flt_ev_verdict_t flt_stream_end(flt_stream_t *st, flt_out_t *out)
{
    if (st->blocked)
        return FLT_EV_BLOCK;
    if (!flt_ruleset_filters_output(st->rs))
        return FLT_EV_PASS;
    flt_ev_verdict_t v = stream_flush_all(st, out);
    if (v == FLT_EV_ERROR)
        flt_out_reset(out);
    return v;
}
