/*
 * stream.c — the answer side: SSE data payloads of a streamed
 * chat.completion (or text_completion) in, payloads to send out. Each
 * choices[].index gets its own text channel (scan.c); this file finds the
 * text in the event and puts the filtered text back.
 *
 * The event is read with yajl's event parser, not loaded into a tree: only
 * choices[i].delta.content (chat), choices[i].text (completions),
 * finish_reason, logprobs, index and a top-level usage matter, and for the
 * text strings and logprobs the parser's byte offsets give their exact span
 * in the upstream's bytes. A text without backslashes is fed to the channel
 * straight from the event; one with escapes is decoded by jansson (that one
 * string only, so `\u` escapes and lone surrogates are judged exactly as a
 * full jansson parse would). When the filter changes a text, the new string
 * is encoded and spliced over the old span (logprobs become `null` the same
 * way); the rest of the event stays the upstream's own bytes. An event left
 * unchanged is passed as is (no copy at all). Chunks of our own (flushes,
 * the final content_filter chunk) are built with jansson; they are rare.
 */
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "common/jshape.h"
#include "filters/flt_internal.h"

/* Top-level keys copied into the chunks we make ourselves. */
static const char *const flt_tmpl_keys[] = {"id", "object", "created", "model",
                                            "system_fingerprint"};

/* Where a choice's text was found. */
enum { FLT_TXT_NONE = 0, FLT_TXT_CONTENT, FLT_TXT_TEXT };

/* One element of an event's choices array, as the parser saw it. Spans are
 * byte offsets into the event, [s, e), quotes included for strings. */
typedef struct flt_evc {
    long long index;
    bool has_index, is_obj, delta_obj, finish, logprobs;
    unsigned char kind; /* FLT_TXT_* */
    bool plain;         /* the text is known escape-free valid UTF-8 (stream_tpl_match) */
    unsigned delta_keys;
    unsigned seen; /* keys already met (duplicates fail closed) */
    size_t ts, te; /* the text string */
    size_t ls, le; /* the logprobs value */
} flt_evc_t;

/* One splice of the output: event bytes [s, e) replaced by rep[0..len). */
typedef struct flt_edit {
    size_t s, e;
    size_t off, len; /* in st->ebuf; len 4 with null set: "null" */
    bool null;
} flt_edit_t;

struct flt_stream {
    flt_ruleset_t *rs; /* one reference, dropped by _free */
    flt_chan_t *ch[FLT_MAX_CHOICES];
    int idx[FLT_MAX_CHOICES];
    size_t nch;
    size_t nspare;  /* ch[nch..nspare): channels kept from an earlier stream */
    sl_buf_t first; /* the first chunk's bytes: the template keys, parsed when needed */
    bool has_first;
    json_t *tmpl; /* the template keys of the first chunk (lazily) */
    bool tmpl_done;
    bool completions; /* the upstream sends choices[].text: our chunks do too */
    int block_rule;
    bool blocked;
    sl_buf_t buf, fbuf, dbuf, ebuf; /* scratch, reused per event */
    flt_evc_t *evc;                 /* the parsed choices, reused per event */
    size_t nevc, evcap;
    flt_edit_t *ed;
    size_t ned, edcap;
    /* The last event read whole, kept as a template when it had one choice
     * with a delta.content string and no logprobs (stream_tpl_match). */
    char *tpl;
    size_t tpl_len, tpl_cap;
    size_t tpl_ts, tpl_te; /* its content string, quotes included */
    flt_evc_t tpl_evc;
    bool tpl_ok, tpl_usage, tpl_off;
    size_t tpl_hits;   /* events read through the template (tests) */
    size_t shape_hits; /* events read through a thread's shape (tests) */
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
    for (size_t i = 0; i < SL_MAX(st->nch, st->nspare); i++) {
        flt_chan_fini(st->ch[i]);
        free(st->ch[i]);
    }
    json_decref(st->tmpl);
    sl_buf_free(&st->first);
    free(st->evc);
    free(st->ed);
    sl_buf_free(&st->buf);
    sl_buf_free(&st->fbuf);
    sl_buf_free(&st->dbuf);
    sl_buf_free(&st->ebuf);
    free(st->tpl);
    flt_ruleset_unref(st->rs);
    free(st);
}

/* What a recycled stream keeps: its first channels, and scratch arrays and
 * buffers up to these sizes (larger ones, from an unusual stream, go). */
#define FLT_STREAM_KEEP_CHANS 2
#define FLT_STREAM_KEEP_BYTES 4096

static void stream_keep_buf(sl_buf_t *b)
{
    if (b->cap > FLT_STREAM_KEEP_BYTES)
        sl_buf_free(b);
    b->len = 0;
}

void flt_stream_recycle(flt_stream_t *st)
{
    size_t nall = SL_MAX(st->nch, st->nspare), nkeep = SL_MIN(nall, FLT_STREAM_KEEP_CHANS);
    for (size_t i = 0; i < nall; i++) {
        if (i < nkeep) {
            flt_chan_recycle(st->ch[i]);
            continue;
        }
        flt_chan_fini(st->ch[i]);
        free(st->ch[i]);
    }
    json_decref(st->tmpl);
    stream_keep_buf(&st->first);
    if (st->evcap * sizeof *st->evc > FLT_STREAM_KEEP_BYTES) {
        free(st->evc);
        st->evc = NULL, st->evcap = 0;
    }
    if (st->edcap * sizeof *st->ed > FLT_STREAM_KEEP_BYTES) {
        free(st->ed);
        st->ed = NULL, st->edcap = 0;
    }
    stream_keep_buf(&st->buf);
    stream_keep_buf(&st->fbuf);
    stream_keep_buf(&st->dbuf);
    stream_keep_buf(&st->ebuf);
    flt_ruleset_unref(st->rs);
    /* every other field as a new stream's: nothing of the last answer */
    flt_stream_t k = {
        .nspare = nkeep,
        .block_rule = -1,
        .buf = st->buf,
        .fbuf = st->fbuf,
        .dbuf = st->dbuf,
        .ebuf = st->ebuf,
        .first = st->first,
        .evc = st->evc,
        .evcap = st->evcap,
        .ed = st->ed,
        .edcap = st->edcap,
        .tpl = st->tpl, /* at most FLT_TPL_MAX */
        .tpl_cap = st->tpl_cap,
    };
    memcpy(k.ch, st->ch, nkeep * sizeof *k.ch);
    *st = k;
}

void flt_stream_rearm(flt_stream_t *st, flt_ruleset_t *rs)
{
    st->rs = flt_ruleset_ref(rs);
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
    if (st->nch < st->nspare) { /* one kept from an earlier stream */
        c = st->ch[st->nch];
        if (flt_chan_rearm(c, st->rs) != 0) {
            /* c is finalised: the spares after it move down one */
            memmove(&st->ch[st->nch], &st->ch[st->nch + 1],
                    (st->nspare - st->nch - 1) * sizeof *st->ch);
            st->nspare--;
            free(c);
            return NULL;
        }
    } else {
        c = malloc(sizeof *c);
        if (!c || flt_chan_init(c, st->rs) != 0) {
            free(c);
            return NULL;
        }
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

/* The template keys come from the first chunk, kept as bytes and parsed
 * only when a chunk of our own is made (most streams never need it). */
static void stream_tmpl(flt_stream_t *st)
{
    if (st->tmpl_done)
        return;
    st->tmpl_done = true;
    json_t *root =
        st->has_first ? json_loadb(st->first.p, st->first.len, JSON_ALLOW_NUL, NULL) : NULL;
    st->first.len = 0; /* the buffer stays for a recycled stream's next answer */
    st->has_first = false;
    if (!json_is_object(root)) {
        json_decref(root);
        return;
    }
    st->tmpl = json_object();
    for (size_t i = 0; st->tmpl && i < SL_ARRAY_LEN(flt_tmpl_keys); i++) {
        json_t *v = json_object_get(root, flt_tmpl_keys[i]);
        if (v)
            json_object_set(st->tmpl, flt_tmpl_keys[i], v);
    }
    json_decref(root);
}

/* A chunk of our own for one choice: text (NULL: an empty delta) and an
 * optional finish_reason, in the shape the upstream uses. */
static int push_chunk(flt_stream_t *st, flt_out_t *out, int index, const char *text, size_t n,
                      const char *finish)
{
    stream_tmpl(st);
    json_t *o = json_object(), *choice = json_object(), *arr = json_array();
    json_t *body = st->completions ? json_stringn(text ? text : "", text ? n : 0) : json_object();
    if (!o || !choice || !arr || !body ||
        (!st->completions && text &&
         json_object_set_new(body, "content", json_stringn(text, n)) != 0)) {
        json_decref(o), json_decref(choice), json_decref(arr), json_decref(body);
        return -1;
    }
    const char *k;
    json_t *v;
    if (st->tmpl) {
        json_object_foreach(st->tmpl, k, v) json_object_set(o, k, v);
    }
    if (!json_object_get(o, "object"))
        json_object_set_new(
            o, "object",
            json_string(st->completions ? "text_completion" : "chat.completion.chunk"));
    json_object_set_new(choice, "index", json_integer(index));
    json_object_set_new(choice, st->completions ? "text" : "delta", body);
    json_object_set_new(choice, "logprobs", json_null());
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_array_append_new(arr, choice);
    json_object_set_new(o, "choices", arr);
    int rc = out_push_json(out, o);
    json_decref(o);
    return rc;
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
        if (push_chunk(st, out, st->idx[i], NULL, 0, "content_filter") != 0)
            return FLT_EV_ERROR;
        sent++;
    }
    if (!sent && push_chunk(st, out, st->nch ? st->idx[0] : 0, NULL, 0, "content_filter") != 0)
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
        if (st->fbuf.len && push_chunk(st, out, st->idx[i], st->fbuf.p, st->fbuf.len, NULL) != 0)
            return FLT_EV_ERROR;
    }
    return FLT_EV_REPLACE;
}

/* ---- reading an event with yajl ------------------------------------------ */

/* The containers on the path to the text; anything else is skipped. */
typedef enum { EVL_ROOT, EVL_CHOICES, EVL_CHOICE, EVL_DELTA } flt_evl_t;

/* The key whose value comes next. */
typedef enum {
    EVK_OTHER = 0,
    EVK_CHOICES,
    EVK_USAGE,
    EVK_INDEX,
    EVK_DELTA,
    EVK_TEXT,
    EVK_FINISH,
    EVK_LOGPROBS,
    EVK_CONTENT,
    EVK_HOLE, /* a top-level value a shape may leave open (stream_shape_keep) */
} flt_evk_t;

/* Top-level values that change from stream to stream (OpenAI's padding,
 * "obfuscation", from event to event) and that the filter never interprets
 * (push_chunk copies them from the event's own bytes): a string or integer
 * value of these keys is a hole of the thread's shapes. */
#define FLT_ROOT_HOLES 8

typedef struct flt_roots {
    sl_jspan_t hole[FLT_ROOT_HOLES];
    uint8_t kind[FLT_ROOT_HOLES];
    size_t n;
} flt_roots_t;

typedef enum { EVV_NULL, EVV_SCALAR, EVV_INT, EVV_STR, EVV_MAP, EVV_ARR } flt_evv_t;

typedef struct flt_evp {
    flt_stream_t *st;
    const char *data;
    size_t n;
    yajl_handle h;
    flt_evl_t lvl[4];
    int depth;       /* tracked containers open */
    unsigned skip;   /* nesting inside a skipped container */
    bool skip_lp;    /* the skipped container is a choice's logprobs */
    flt_evk_t key;   /* for the next value */
    size_t key_end;  /* offset just past that key */
    unsigned seen;   /* root keys met */
    bool usage, bad; /* bad: fail closed (not an object, a duplicate key we read) */
    bool oom;
    flt_roots_t *roots; /* where EVK_HOLE values are, when wanted */
} flt_evp_t;

static flt_evc_t *evp_choice(flt_evp_t *p)
{
    return &p->st->evc[p->st->nevc - 1];
}

/* Offset of the value after the current key: past blanks, ':' and blanks. */
static size_t evp_value_start(const flt_evp_t *p)
{
    size_t i = p->key_end;
    while (i < p->n && (p->data[i] == ' ' || p->data[i] == '\t' || p->data[i] == '\n' ||
                        p->data[i] == '\r' || p->data[i] == ':'))
        i++;
    return i;
}

/* A top-level string without escapes or an integer of at most
 * SL_JSHAPE_INT_DIGITS digits, [s, e) as yajl found it, noted as a hole. */
static void evp_hole(flt_evp_t *p, flt_evv_t t, size_t end)
{
    flt_roots_t *r = p->roots;
    size_t s = evp_value_start(p);
    if (!r || r->n == FLT_ROOT_HOLES || end <= s)
        return;
    if (t == EVV_STR) {
        if (end - s < 2 || memchr(p->data + s + 1, '\\', end - s - 2))
            return;
        s++, end--;
    } else if (end - s - (p->data[s] == '-') > SL_JSHAPE_INT_DIGITS) {
        return;
    }
    r->hole[r->n] = (sl_jspan_t){(uint32_t)s, (uint32_t)(end - s)};
    r->kind[r->n++] = t == EVV_STR ? SL_JHOLE_STR : SL_JHOLE_INT;
}

static int evp_push(flt_evp_t *p, flt_evl_t l)
{
    p->lvl[p->depth++] = l;
    return 1;
}

static int evp_value(flt_evp_t *p, flt_evv_t t, long long iv)
{
    bool container = t == EVV_MAP || t == EVV_ARR;
    if (p->skip) {
        p->skip += container;
        return 1;
    }
    flt_evk_t k = p->key;
    p->key = EVK_OTHER;
    size_t end = yajl_get_bytes_consumed(p->h);
    if (p->depth == 0) {
        if (t != EVV_MAP) {
            p->bad = true; /* not a chunk: fail closed */
            return 0;
        }
        return evp_push(p, EVL_ROOT);
    }
    switch (p->lvl[p->depth - 1]) {
    case EVL_ROOT:
        if (k == EVK_CHOICES && t == EVV_ARR)
            return evp_push(p, EVL_CHOICES);
        if (k == EVK_USAGE)
            p->usage = t != EVV_NULL;
        else if (k == EVK_HOLE && (t == EVV_STR || t == EVV_INT))
            evp_hole(p, t, end);
        break;
    case EVL_CHOICES: {
        flt_stream_t *st = p->st;
        if (st->nevc == st->evcap) {
            size_t cap = st->evcap ? st->evcap * 2 : 4;
            flt_evc_t *v = realloc(st->evc, cap * sizeof *v);
            if (!v) {
                p->oom = true;
                return 0;
            }
            st->evc = v;
            st->evcap = cap;
        }
        flt_evc_t *c = &st->evc[st->nevc++];
        memset(c, 0, sizeof *c);
        c->is_obj = t == EVV_MAP;
        if (c->is_obj)
            return evp_push(p, EVL_CHOICE);
        break;
    }
    case EVL_CHOICE: {
        flt_evc_t *c = evp_choice(p);
        if (k == EVK_INDEX) {
            c->has_index = t == EVV_INT;
            c->index = iv;
        } else if (k == EVK_DELTA) {
            c->delta_obj = t == EVV_MAP;
            if (c->delta_obj)
                return evp_push(p, EVL_DELTA);
        } else if (k == EVK_TEXT && t == EVV_STR) {
            c->kind = FLT_TXT_TEXT;
            c->ts = evp_value_start(p);
            c->te = end;
        } else if (k == EVK_FINISH) {
            c->finish = t != EVV_NULL;
        } else if (k == EVK_LOGPROBS && t != EVV_NULL) {
            c->logprobs = true;
            c->ls = evp_value_start(p);
            c->le = end;
            if (container) {
                p->skip = 1;
                p->skip_lp = true;
                return 1;
            }
        }
        break;
    }
    case EVL_DELTA:
        if (k == EVK_CONTENT && t == EVV_STR) {
            flt_evc_t *c = evp_choice(p);
            c->kind = FLT_TXT_CONTENT;
            c->ts = evp_value_start(p);
            c->te = end;
        }
        break;
    }
    if (container) {
        p->skip = 1;
        p->skip_lp = false;
    }
    return 1;
}

static int evp_end(void *ctx)
{
    flt_evp_t *p = ctx;
    if (p->skip) {
        if (--p->skip == 0 && p->skip_lp)
            evp_choice(p)->le = yajl_get_bytes_consumed(p->h);
        return 1;
    }
    p->depth--;
    return 1;
}

#define EVP_IS(k, n, lit) ((n) == sizeof(lit) - 1 && memcmp((k), (lit), (n)) == 0)

/* Marks key bit b as met in *seen; a key we read twice is ambiguous (which
 * one would the client keep?), so the event fails closed. */
static int evp_once(flt_evp_t *p, unsigned *seen, unsigned b)
{
    if (*seen & b) {
        p->bad = true;
        return 0;
    }
    *seen |= b;
    return 1;
}

static int evp_key(void *ctx, const unsigned char *k, size_t n)
{
    flt_evp_t *p = ctx;
    p->key = EVK_OTHER;
    if (p->skip)
        return 1;
    p->key_end = yajl_get_bytes_consumed(p->h);
    switch (p->lvl[p->depth - 1]) {
    case EVL_ROOT:
        if (EVP_IS(k, n, "choices"))
            p->key = EVK_CHOICES;
        else if (EVP_IS(k, n, "usage"))
            p->key = EVK_USAGE;
        else if (p->roots &&
                 (EVP_IS(k, n, "id") || EVP_IS(k, n, "created") || EVP_IS(k, n, "model") ||
                  EVP_IS(k, n, "system_fingerprint") || EVP_IS(k, n, "obfuscation"))) {
            p->key = EVK_HOLE; /* read like any other key: no once */
            return 1;
        }
        return p->key == EVK_OTHER || evp_once(p, &p->seen, 1u << p->key);
    case EVL_CHOICE:
        if (EVP_IS(k, n, "index"))
            p->key = EVK_INDEX;
        else if (EVP_IS(k, n, "delta"))
            p->key = EVK_DELTA;
        else if (EVP_IS(k, n, "text"))
            p->key = EVK_TEXT;
        else if (EVP_IS(k, n, "finish_reason"))
            p->key = EVK_FINISH;
        else if (EVP_IS(k, n, "logprobs"))
            p->key = EVK_LOGPROBS;
        return p->key == EVK_OTHER || evp_once(p, &evp_choice(p)->seen, 1u << p->key);
    case EVL_DELTA:
        evp_choice(p)->delta_keys++;
        if (EVP_IS(k, n, "content"))
            p->key = EVK_CONTENT;
        return p->key == EVK_OTHER || evp_once(p, &evp_choice(p)->seen, 1u << p->key);
    default:
        return 1;
    }
}

static int evp_null(void *ctx)
{
    return evp_value(ctx, EVV_NULL, 0);
}
static int evp_bool(void *ctx, int v)
{
    (void)v;
    return evp_value(ctx, EVV_SCALAR, 0);
}
static int evp_int(void *ctx, long long v)
{
    return evp_value(ctx, EVV_INT, v);
}
static int evp_double(void *ctx, double v)
{
    (void)v;
    return evp_value(ctx, EVV_SCALAR, 0);
}
static int evp_string(void *ctx, const unsigned char *s, size_t n)
{
    (void)s, (void)n;
    return evp_value(ctx, EVV_STR, 0);
}
static int evp_map(void *ctx)
{
    return evp_value(ctx, EVV_MAP, 0);
}
static int evp_arr(void *ctx)
{
    return evp_value(ctx, EVV_ARR, 0);
}

/* Integers and doubles get callbacks so that yajl range-checks them (a
 * number jansson would refuse is refused here too). */
static const yajl_callbacks flt_evp_cb = {
    .yajl_null = evp_null,
    .yajl_boolean = evp_bool,
    .yajl_integer = evp_int,
    .yajl_double = evp_double,
    .yajl_string = evp_string,
    .yajl_start_map = evp_map,
    .yajl_map_key = evp_key,
    .yajl_end_map = evp_end,
    .yajl_start_array = evp_arr,
    .yajl_end_array = evp_end,
};

/* The event read whole with yajl: as stream_parse. roots (may be NULL) gets
 * where the EVK_HOLE values are. */
static int stream_parse_whole(flt_stream_t *st, const char *data, size_t n, bool *usage,
                              flt_roots_t *roots)
{
    flt_evp_t p = {.st = st, .data = data, .n = n, .roots = roots};
    st->nevc = 0;
    sl_yheap_t ya; /* the handle lives only for this parse: on the stack */
    yajl_alloc_funcs yaf = sl_yheap_funcs(&ya);
    p.h = yajl_alloc(&flt_evp_cb, &yaf, &p);
    if (!p.h)
        return -1;
    yajl_status s = yajl_parse(p.h, (const unsigned char *)data, n);
    if (s == yajl_status_ok)
        s = yajl_complete_parse(p.h);
    yajl_free(p.h);
    if (p.oom)
        return -1;
    if (s != yajl_status_ok || p.bad)
        return 1;
    for (size_t i = 0; i < st->nevc; i++)
        if (st->evc[i].kind != FLT_TXT_NONE && st->evc[i].seen & (1u << EVK_TEXT) &&
            st->evc[i].seen & (1u << EVK_CONTENT))
            return 1; /* both shapes in one choice: which one would the client read? */
    *usage = p.usage;
    return 0;
}

/* ---- events shaped like the last one ---------------------------------------- */

/* Streams repeat one shape: the same id, object, created, model and index
 * around a new delta.content string. JSON parsing is deterministic, so an
 * event whose bytes before and after that string are the template's and
 * whose middle is one JSON string (yajl checks it alone, with the same
 * rules) parses exactly as the template did, the string's span moved.
 * Anything else is parsed whole. */
#define FLT_TPL_MAX 4096 /* longer events are not kept */

typedef struct flt_tpl_p {
    yajl_handle h;
    int strings;
    size_t end; /* just past the first string */
} flt_tpl_p_t;

static int tpl_str(void *ctx, const unsigned char *s, size_t n)
{
    (void)s, (void)n;
    flt_tpl_p_t *p = ctx;
    if (p->strings++ == 0)
        p->end = yajl_get_bytes_consumed(p->h);
    return 1;
}
static int tpl_no(void *ctx)
{
    (void)ctx;
    return 0;
}
static int tpl_no_b(void *ctx, int v)
{
    (void)ctx, (void)v;
    return 0;
}
static int tpl_no_i(void *ctx, long long v)
{
    (void)ctx, (void)v;
    return 0;
}
static int tpl_no_d(void *ctx, double v)
{
    (void)ctx, (void)v;
    return 0;
}
static int tpl_no_k(void *ctx, const unsigned char *k, size_t n)
{
    (void)ctx, (void)k, (void)n;
    return 0;
}
static const yajl_callbacks flt_tpl_cb = {
    .yajl_null = tpl_no,
    .yajl_boolean = tpl_no_b,
    .yajl_integer = tpl_no_i,
    .yajl_double = tpl_no_d,
    .yajl_string = tpl_str,
    .yajl_start_map = tpl_no,
    .yajl_map_key = tpl_no_k,
    .yajl_end_map = tpl_no,
    .yajl_start_array = tpl_no,
    .yajl_end_array = tpl_no,
};

/* Whether the bytes between the quotes are a string yajl certainly takes
 * as one token ending at the closing quote: no quote, backslash or control
 * character, and UTF-8 that flt_utf8_valid (stricter than yajl's check)
 * accepts. Most deltas are such a string; checking them costs a pass over a
 * few bytes instead of a parser handle. Anything else asks yajl. */
static bool tpl_plain_string(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    bool ascii = true;
    if (n >= 16) {
        /* 16 bytes at a time (common/jshape.c, SSE2), then ASCII 8 at a time:
         * below 16 the call and the second pass cost more than they save */
        if (sl_jshape_str_end(s, 0, n) != n)
            return false;
        ascii = sl_ascii_all(s, n);
    } else {
        for (size_t i = 0; i < n; i++) {
            if (u[i] < 0x20 || u[i] == '"' || u[i] == '\\')
                return false;
            ascii = ascii && u[i] < 0x80;
        }
    }
    return ascii || flt_utf8_valid(s, n);
}

/* Whether s[0..n) is exactly one JSON string token, as yajl reads it;
 * *plain when it is one without escapes, valid UTF-8 (tpl_plain_string). */
static bool tpl_one_string(const char *s, size_t n, bool *plain)
{
    *plain = false;
    if (n < 2 || s[0] != '"' || s[n - 1] != '"')
        return false;
    if (tpl_plain_string(s + 1, n - 2))
        return *plain = true;
    flt_tpl_p_t p = {0};
    sl_yheap_t ya;
    yajl_alloc_funcs yaf = sl_yheap_funcs(&ya);
    p.h = yajl_alloc(&flt_tpl_cb, &yaf, &p);
    if (!p.h)
        return false;
    yajl_status r = yajl_parse(p.h, (const unsigned char *)s, n);
    if (r == yajl_status_ok)
        r = yajl_complete_parse(p.h);
    yajl_free(p.h);
    /* one string ending at the last byte: yajl takes an unfinished string
     * after a complete value as "more to come", not as garbage ("" then ") */
    return r == yajl_status_ok && p.strings == 1 && p.end == n;
}

/* Inlined (stream_parse): it was before flt_stream_facts called it too. */
static inline __attribute__((always_inline)) bool
stream_tpl_match(flt_stream_t *st, const char *data, size_t n, bool *usage)
{
    size_t pre = st->tpl_ts, post = st->tpl_len - st->tpl_te;
    bool plain;
    if (!st->tpl_ok || st->tpl_off || n < pre + post + 2 || memcmp(data, st->tpl, pre) != 0 ||
        memcmp(data + n - post, st->tpl + st->tpl_te, post) != 0 ||
        !tpl_one_string(data + pre, n - pre - post, &plain))
        return false;
    st->nevc = 1; /* evcap >= 1: the template was parsed into it */
    st->evc[0] = st->tpl_evc;
    st->evc[0].ts = pre;
    st->evc[0].te = n - post;
    st->evc[0].plain = plain; /* stream_text need not look at it again */
    *usage = st->tpl_usage;
    st->tpl_hits++;
    return true;
}

/* After a whole parse: the event becomes the template if it has the
 * shape stream_tpl_match handles (else there is none). */
static void stream_tpl_keep(flt_stream_t *st, const char *data, size_t n, bool usage)
{
    st->tpl_ok = false;
    if (st->nevc != 1 || !st->evc[0].is_obj || st->evc[0].kind != FLT_TXT_CONTENT ||
        st->evc[0].logprobs || n > FLT_TPL_MAX)
        return;
    if (n > st->tpl_cap) {
        /* a usual delta fits 512 bytes, which malloc serves from its
         * per-thread cache; 4 KiB (the most kept) it does not */
        size_t cap = n <= 512 ? 512 : FLT_TPL_MAX;
        char *t = realloc(st->tpl, cap);
        if (!t)
            return; /* only a cost: the next event is parsed whole */
        st->tpl = t;
        st->tpl_cap = cap;
    }
    memcpy(st->tpl, data, n);
    st->tpl_len = n;
    st->tpl_ts = st->evc[0].ts;
    st->tpl_te = st->evc[0].te;
    st->tpl_evc = st->evc[0];
    st->tpl_usage = usage;
    st->tpl_ok = true;
}

void flt_stream_template(flt_stream_t *st, bool on)
{
    st->tpl_off = !on;
}

size_t flt_stream_template_hits(const flt_stream_t *st)
{
    return st->tpl_hits;
}

/* ---- events shaped like one of another stream ------------------------------- */

/* The template above starts over with each stream, whose first event then
 * costs a whole parse, as does each event of a new shape (the role delta,
 * the first content delta, the finish): the next stream's events differ in
 * id and created (and maybe model and system_fingerprint). So each worker
 * thread also keeps a few events it read whole as common/jshape shapes,
 * whose holes are those top-level values and choices[0]'s text: an event
 * of another stream that has one of these shapes reads as that shape's
 * event did, its spans moved (jshape.h says why). What the parse records
 * depends on nothing but the bytes (no conf, no flag: the ruleset only
 * decides whether events are read at all), so the shapes are keyed by
 * nothing else and a reload does not touch them. Everything the filter
 * interprets stays shape bytes: index, finish_reason, logprobs, usage, the
 * delta's keys and role, object. The text hole is a string without escapes:
 * an event whose text has one misses here (the per-stream template above
 * still takes it after the stream's first such event). */
#define FLT_SHAPES      4
#define FLT_SHAPE_HOLES (FLT_ROOT_HOLES + 1)

/* What a slot of the thread's cache keeps beside its shape. */
typedef struct flt_shape {
    flt_evc_t evc; /* choices[0] as read, when nevc */
    size_t nevc;   /* 0 or 1 */
    int text;      /* the hole of evc's text, -1 none */
    bool usage;
} flt_shape_t;

/* Past this many events kept without a hit in between, the thread's events
 * are new shapes each time (a value outside the holes that changes per
 * event): only every FLT_SHAPE_STREAK-th is kept (and its holes noted), so
 * that a miss costs little more than today's parse. A hit starts over. */
#define FLT_SHAPE_STREAK 16

/* The thread's shapes (common/jshape.h): empty slots, then the least
 * recently used; the gate as above; freed at thread exit. */
static _Thread_local sl_jshape_cache_t flt_shapes =
    SL_JSHAPE_CACHE_INIT(FLT_SHAPES, FLT_SHAPE_STREAK, FLT_SHAPE_STREAK, sizeof(flt_shape_t), NULL);

void flt_stream_shapes_clear(void)
{
    sl_jshape_cache_clear(&flt_shapes);
}

/* Whether every string hole of shape s is UTF-8 as yajl takes it: an event
 * it would refuse must go to the whole parse (and fail closed there).
 * flt_utf8_valid is the stricter check, so a yes here is a yes for yajl. */
static bool stream_shape_utf8(const char *data, const sl_jshape_t *sh, const sl_jspan_t *sp)
{
    for (size_t i = 0; i < sh->nholes; i++) {
        if (sh->kind[i] != SL_JHOLE_STR)
            continue;
        const unsigned char *u = (const unsigned char *)data + sp[i].off;
        size_t j = 0;
        while (j < sp[i].len && u[j] < 0x80)
            j++;
        if (j < sp[i].len && !flt_utf8_valid(data + sp[i].off, sp[i].len))
            return false;
    }
    return true;
}

/* Whether data[0..n) ends with the bytes after shape s's last hole: a cheap
 * first test (shapes of one server differ most often near the end). */
static bool stream_shape_tail(const sl_jshape_t *sh, const char *data, size_t n)
{
    size_t t = sh->nholes ? sh->len - (sh->hole[sh->nholes - 1].off + sh->hole[sh->nholes - 1].len)
                          : sh->len;
    return t <= n && memcmp(data + n - t, sh->bytes + sh->len - t, t) == 0;
}

static bool stream_shape_match(flt_stream_t *st, const char *data, size_t n, bool *usage)
{
    sl_jspan_t sp[FLT_SHAPE_HOLES];
    if (st->tpl_off)
        return false;
    sl_jshape_cache_t *c = &flt_shapes;
    for (unsigned i = 0; i < FLT_SHAPES; i++) {
        const sl_jshape_t *sh = &c->slot[i].sh;
        if (sl_jshape_empty(sh) || !stream_shape_tail(sh, data, n) ||
            !sl_jshape_match(sh, data, n, sp))
            continue;
        const flt_shape_t *s = c->slot[i].data;
        if (!stream_shape_utf8(data, sh, sp))
            break;
        if (s->nevc && st->evcap == 0) {
            st->evc = malloc(4 * sizeof *st->evc);
            if (!st->evc)
                return false; /* the whole parse says out of memory */
            st->evcap = 4;
        }
        st->nevc = s->nevc;
        if (s->nevc) {
            st->evc[0] = s->evc;
            if (s->text >= 0) {
                st->evc[0].ts = sp[s->text].off - 1;
                st->evc[0].te = (size_t)sp[s->text].off + sp[s->text].len + 1;
            }
        }
        *usage = s->usage;
        sl_jshape_cache_hit(c, i);
        st->shape_hits++;
        return true;
    }
    sl_jshape_cache_miss(c);
    return false;
}

/* After a whole parse: the event becomes one of the thread's shapes if it
 * has at most one choice, without logprobs (their span would need the
 * parse) and without usage (its counts differ in every stream), and if its
 * text is a string without escapes. */
static void stream_shape_keep(flt_stream_t *st, const char *data, size_t n, bool usage,
                              const flt_roots_t *roots)
{
    if (st->tpl_off || usage || st->nevc > 1 || n > FLT_TPL_MAX)
        return;
    sl_jspan_t h[FLT_SHAPE_HOLES];
    uint8_t k[FLT_SHAPE_HOLES];
    size_t nh = roots->n;
    memcpy(h, roots->hole, nh * sizeof *h);
    memcpy(k, roots->kind, nh);
    const flt_evc_t *e = st->nevc ? &st->evc[0] : NULL;
    if (e && (!e->is_obj || e->logprobs))
        return;
    int text = -1;
    if (e && e->kind != FLT_TXT_NONE) {
        if (memchr(data + e->ts + 1, '\\', e->te - e->ts - 2))
            return;
        /* in order of offset: after the top-level holes before it */
        size_t at = nh;
        while (at > 0 && h[at - 1].off > e->ts)
            at--;
        memmove(h + at + 1, h + at, (nh - at) * sizeof *h);
        memmove(k + at + 1, k + at, nh - at);
        h[at] = (sl_jspan_t){(uint32_t)e->ts + 1, (uint32_t)(e->te - e->ts - 2)};
        k[at] = SL_JHOLE_STR;
        nh++;
        text = (int)at;
    }
    int i = sl_jshape_cache_take(&flt_shapes);
    if (i < 0)
        return;
    flt_shape_t *s = flt_shapes.slot[i].data;
    s->nevc = st->nevc;
    if (e)
        s->evc = *e;
    s->text = text;
    s->usage = usage;
    if (sl_jshape_cache_set(&flt_shapes, (unsigned)i, data, n, h, k, nh) != 0)
        return; /* only a cost: the slot is empty */
}

size_t flt_stream_shape_hits(const flt_stream_t *st)
{
    return st->shape_hits;
}

/* 0 parsed (st->evc filled, *usage set), 1 not a chunk we can read (fail
 * closed), -1 out of memory. The stream's template first (a compare), then
 * the thread's shapes (a compare each), then the whole parse. */
static int stream_parse_miss(flt_stream_t *st, const char *data, size_t n, bool *usage);

/* Inlined in stream_event, as it was before flt_stream_facts called it too:
 * the template's compare is the cost of most events (with the shapes' and
 * the whole parse's path kept out of line). */
static inline __attribute__((always_inline)) int stream_parse(flt_stream_t *st, const char *data,
                                                              size_t n, bool *usage)
{
    if (stream_tpl_match(st, data, n, usage))
        return 0;
    return stream_parse_miss(st, data, n, usage);
}

/* Past the stream's template: kept out of line, so that the template's
 * compare stays inlined in stream_event as before the shapes. */
static __attribute__((noinline)) int stream_parse_miss(flt_stream_t *st, const char *data, size_t n,
                                                       bool *usage)
{
    if (stream_shape_match(st, data, n, usage)) {
        stream_tpl_keep(st, data, n, *usage);
        return 0;
    }
    flt_roots_t roots;
    roots.n = 0;
    bool keep = !st->tpl_off && sl_jshape_cache_gate(&flt_shapes);
    int rc = stream_parse_whole(st, data, n, usage, keep ? &roots : NULL);
    if (rc == 0) {
        stream_tpl_keep(st, data, n, *usage);
        if (keep)
            stream_shape_keep(st, data, n, *usage, &roots);
    } else {
        st->tpl_ok = false;
    }
    return rc;
}

int flt_stream_facts(flt_stream_t *st, const char *data, size_t n, char *buf, size_t cap)
{
    bool usage = false;
    int rc = stream_parse(st, data, n, &usage);
    size_t o = (size_t)snprintf(buf, cap, "rc=%d usage=%d nevc=%zu", rc, usage, rc ? 0 : st->nevc);
    for (size_t i = 0; rc == 0 && i < st->nevc && o < cap; i++) {
        const flt_evc_t *e = &st->evc[i];
        o += (size_t)snprintf(buf + o, cap - o,
                              " |index=%lld/%d obj=%d delta=%d/%u finish=%d logprobs=%d "
                              "kind=%u seen=%x text=%zu-%zu lp=%zu-%zu",
                              e->index, e->has_index, e->is_obj, e->delta_obj, e->delta_keys,
                              e->finish, e->logprobs, e->kind, e->seen, e->ts, e->te, e->ls, e->le);
    }
    return rc;
}

/* The decoded text of span [s, e) (a JSON string, quotes included). Without
 * a backslash it is the bytes between the quotes; with one, jansson decodes
 * that string (exactly as a whole-event parse would) into st->dbuf.
 * 0 ok, 1 not decodable (fail closed), -1 out of memory. */
static int stream_text(flt_stream_t *st, const char *data, size_t s, size_t e, bool plain,
                       const char **t, size_t *tn)
{
    *t = data + s + 1;
    *tn = e - s - 2;
    if (plain)
        return 0;
    if (!memchr(*t, '\\', *tn))
        return flt_utf8_valid(*t, *tn) ? 0 : 1; /* yajl checks less than jansson did */
    json_t *j = json_loadb(data + s, e - s, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (!json_is_string(j)) {
        json_decref(j);
        return 1;
    }
    st->dbuf.len = 0;
    int rc = sl_buf_add(&st->dbuf, json_string_value(j), json_string_length(j));
    json_decref(j);
    if (rc != 0)
        return -1;
    *t = st->dbuf.p ? st->dbuf.p : "";
    *tn = st->dbuf.len;
    return 0;
}

/* Appends text as a JSON string (quotes included) to b. The text is valid
 * UTF-8 (the channel only releases that), so only the quote, the backslash
 * and the control characters need escapes; the rest is copied. */
int flt_json_str_encode(sl_buf_t *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    if (sl_buf_add(b, "\"", 1) != 0)
        return -1;
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        if (sl_buf_add(b, s + run, i - run) != 0)
            return -1;
        char esc[6] = {'\\', 0, 0, 0, 0, 0};
        size_t elen = 2;
        switch (c) {
        case '"':
        case '\\':
            esc[1] = (char)c;
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        case '\b':
            esc[1] = 'b';
            break;
        case '\f':
            esc[1] = 'f';
            break;
        default:
            memcpy(esc + 1, "u00", 3);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            elen = 6;
        }
        if (sl_buf_add(b, esc, elen) != 0)
            return -1;
        run = i + 1;
    }
    if (sl_buf_add(b, s + run, n - run) != 0 || sl_buf_add(b, "\"", 1) != 0)
        return -1;
    return 0;
}

static int stream_edit(flt_stream_t *st, size_t s, size_t e, size_t off, size_t len, bool null)
{
    if (st->ned == st->edcap) {
        size_t cap = st->edcap ? st->edcap * 2 : 4;
        flt_edit_t *v = realloc(st->ed, cap * sizeof *v);
        if (!v)
            return -1;
        st->ed = v;
        st->edcap = cap;
    }
    st->ed[st->ned++] = (flt_edit_t){s, e, off, len, null};
    return 0;
}

/* The event with every edit spliced in, as a new payload. */
static int stream_splice(flt_stream_t *st, const char *data, size_t n, flt_out_t *out)
{
    /* few edits, nearly in order already: insertion sort by offset */
    for (size_t i = 1; i < st->ned; i++)
        for (size_t j = i; j > 0 && st->ed[j].s < st->ed[j - 1].s; j--) {
            flt_edit_t t = st->ed[j];
            st->ed[j] = st->ed[j - 1];
            st->ed[j - 1] = t;
        }
    size_t total = n;
    for (size_t i = 0; i < st->ned; i++)
        total = total - (st->ed[i].e - st->ed[i].s) + st->ed[i].len;
    char *o = malloc(total + 1), *w = o;
    if (!o)
        return -1;
    size_t pos = 0;
    for (size_t i = 0; i < st->ned; i++) {
        const flt_edit_t *ed = &st->ed[i];
        memcpy(w, data + pos, ed->s - pos);
        w += ed->s - pos;
        memcpy(w, ed->null ? "null" : st->ebuf.p + ed->off, ed->len);
        w += ed->len;
        pos = ed->e;
    }
    memcpy(w, data + pos, n - pos);
    w += n - pos;
    *w = '\0';
    return out_push(out, o, total);
}

/* One choice: its text through its channel (the change recorded as an
 * edit), a finish_reason flushing it (extra chunk to `out`). *empty: the
 * choice says nothing once filtered (its delta is only an empty content, no
 * finish_reason), so the event may be dropped. */
static flt_ev_verdict_t stream_choice(flt_stream_t *st, const char *data, const flt_evc_t *e,
                                      size_t pos, flt_out_t *out, bool *empty)
{
    int index = e->has_index ? (int)e->index : (int)pos;
    bool full = false;
    flt_chan_t *c = stream_chan(st, index, &full);
    if (!c)
        return full ? stream_block(st, out, -1) : FLT_EV_ERROR;
    const char *t = NULL;
    size_t tn = 0;
    bool has_text = e->kind != FLT_TXT_NONE;
    if (has_text) {
        if (e->kind == FLT_TXT_TEXT)
            st->completions = true;
        int rc = stream_text(st, data, e->ts, e->te, e->plain, &t, &tn);
        if (rc != 0)
            return rc > 0 ? stream_block(st, out, -1) : FLT_EV_ERROR;
    }
    sl_buf_t *b = &st->buf;
    b->len = 0;
    bool same = false; /* the channel released t itself, whole: nothing copied to b */
    if (has_text) {
        /* text after this choice finished has no place to go: dropped */
        flt_chan_rc_t rc = c->finished ? FLT_CHAN_OK
                           : e->finish ? flt_chan_feed(c, t, tn, b)
                                       : flt_chan_feed_same(c, t, tn, b, &same);
        if (rc == FLT_CHAN_BLOCK)
            return stream_block(st, out, c->block_rule);
        if (rc != FLT_CHAN_OK)
            return FLT_EV_ERROR;
    }
    if (e->finish && !c->finished) {
        size_t before = b->len;
        flt_chan_rc_t rc = flt_chan_finish(c, b);
        if (rc == FLT_CHAN_BLOCK)
            return stream_block(st, out, c->block_rule);
        if (rc != FLT_CHAN_OK)
            return FLT_EV_ERROR;
        /* held text goes out in a chunk of its own before the finish */
        if (!has_text && b->len > before && push_chunk(st, out, index, b->p, b->len, NULL) != 0)
            return FLT_EV_ERROR;
    }
    if (has_text && !same && (b->len != tn || memcmp(b->p ? b->p : "", t, tn) != 0)) {
        size_t off = st->ebuf.len;
        if (flt_json_str_encode(&st->ebuf, b->p ? b->p : "", b->len) != 0 ||
            stream_edit(st, e->ts, e->te, off, st->ebuf.len - off, false) != 0)
            return FLT_EV_ERROR;
    }
    if (e->logprobs && stream_edit(st, e->ls, e->le, 0, 4, true) != 0)
        return FLT_EV_ERROR;
    *empty = !e->finish && has_text && (same ? tn : b->len) == 0 &&
             (e->kind == FLT_TXT_TEXT || (e->delta_obj && e->delta_keys == 1));
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
    bool usage = false;
    int prc = stream_parse(st, data, n, &usage);
    if (prc < 0)
        return FLT_EV_ERROR;
    if (prc > 0) /* text we cannot read is text we cannot check: fail closed */
        return stream_block(st, out, -1);
    if (!st->tmpl_done && !st->has_first) {
        st->first.len = 0;
        st->has_first = sl_buf_add(&st->first, data, n) == 0;
    }
    if (st->nevc == 0)
        return FLT_EV_PASS;
    st->ned = 0;
    st->ebuf.len = 0;
    bool drop = !usage;
    for (size_t i = 0; i < st->nevc; i++) {
        const flt_evc_t *e = &st->evc[i];
        bool empty = false;
        if (e->is_obj) {
            flt_ev_verdict_t v = stream_choice(st, data, e, i, out, &empty);
            if (v != FLT_EV_PASS) {
                if (v == FLT_EV_ERROR)
                    flt_out_reset(out);
                return v;
            }
        }
        drop = drop && empty;
    }
    if (st->ned == 0 && out->n == 0)
        return FLT_EV_PASS;
    if (!drop && stream_splice(st, data, n, out) != 0) {
        flt_out_reset(out);
        return FLT_EV_ERROR;
    }
    return FLT_EV_REPLACE;
}

flt_ev_verdict_t flt_stream_event_at(flt_stream_t *st, const char *data, size_t len, flt_out_t *out,
                                     int64_t t0_ns)
{
    int64_t t0 = t0_ns ? t0_ns : sl_now_ns();
    flt_ev_verdict_t v = stream_event(st, data, len, out);
    if (st->rs->event_seconds)
        sl_histogram_observe(st->rs->event_seconds, (double)(sl_now_ns() - t0) * 1e-9);
    return v;
}

flt_ev_verdict_t flt_stream_event(flt_stream_t *st, const char *data, size_t len, flt_out_t *out)
{
    return flt_stream_event_at(st, data, len, out, 0);
}

static flt_ev_verdict_t stream_feed_text(flt_stream_t *st, int index, const char *s, size_t n,
                                         const char **rel, size_t *rlen)
{
    *rel = s;
    *rlen = n;
    if (st->blocked)
        return FLT_EV_BLOCK;
    if (!flt_ruleset_filters_output(st->rs))
        return FLT_EV_PASS;
    bool full = false;
    flt_chan_t *c = stream_chan(st, index, &full);
    if (!c) {
        if (!full)
            return FLT_EV_ERROR;
        st->blocked = true;
        return FLT_EV_BLOCK;
    }
    sl_buf_t *b = &st->buf;
    b->len = 0;
    /* text after this choice finished has no place to go: dropped */
    flt_chan_rc_t rc = c->finished ? FLT_CHAN_OK : flt_chan_feed(c, s, n, b);
    if (rc == FLT_CHAN_BLOCK) {
        st->blocked = true;
        st->block_rule = c->block_rule;
        return FLT_EV_BLOCK;
    }
    if (rc != FLT_CHAN_OK)
        return FLT_EV_ERROR;
    *rel = b->p ? b->p : "";
    *rlen = b->len;
    return b->len == n && memcmp(*rel, s, n) == 0 ? FLT_EV_PASS : FLT_EV_REPLACE;
}

flt_ev_verdict_t flt_stream_text(flt_stream_t *st, int index, const char *s, size_t n,
                                 const char **rel, size_t *rlen)
{
    int64_t t0 = sl_now_ns();
    flt_ev_verdict_t v = stream_feed_text(st, index, s, n, rel, rlen);
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
