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
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "common/jshape.h"
#include "common/yheap.h"
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

/* ---- the events without a jansson tree ------------------------------------
 *
 * Nearly every event of a Responses stream is a response.output_text.delta.
 * yajl's event parser finds its top-level `type` and the byte span of its
 * `delta` string; the text goes to the filter as is (flt_stream_text) and,
 * when it comes back unchanged, the event is passed without being parsed
 * into a tree or written again. Anything else (a duplicate key, an escaped
 * type, JSON yajl refuses) takes the general path below.
 *
 * The same pass reads the other events: a type this adapter does not
 * touch is passed as the general path would pass it, and the events that
 * repeat the whole text (output_text.done, content_part.done,
 * output_item.done, response.completed / .incomplete) are answered with
 * their own bytes when the general path's jansson dump would write exactly
 * those bytes: the event is what jansson writes (compact, keys once each,
 * integers only, no \u escape: gw_frp_canonical and the callbacks) and
 * every text it would replace already is the text sent. Otherwise, the
 * general path. */

/* The containers whose members the pass follows (see gw_frp_t.fr). */
enum {
    GW_FRP_OTHER = 0,
    GW_FRP_TOP,      /* the event */
    GW_FRP_PART1,    /* content_part.done's part */
    GW_FRP_ITEM,     /* output_item.done's item */
    GW_FRP_ICONTENT, /* its content */
    GW_FRP_IPART,    /* one of its parts */
    GW_FRP_RESP,     /* response.completed's response */
    GW_FRP_OUTPUT,   /* its output */
    GW_FRP_OITEM,    /* one of its items */
    GW_FRP_OCONTENT, /* that item's content */
    GW_FRP_OPART,    /* one of its parts */
};

/* What the pass follows and keeps per container: deeper ones are not
 * followed, and more keys in one object than this are not checked for
 * duplicates (the general path then). */
#define GW_FRP_DEPTH 12
#define GW_FRP_KEYS  24
/* Holes a delta's shape has at most (its top-level values). */
#define GW_FRP_HOLES 16

typedef struct gw_frp_frame {
    uint8_t role;
    uint8_t key;  /* the member whose value comes next: 1 type, 2 text, 3 content, 4 part, 5 item,
                     6 response, 7 output, 0 other */
    bool is_ot;   /* a part: its type is "output_text" */
    uint8_t text; /* a part: its text 0 absent, 1 the text sent, 2 another */
    uint8_t nkeys;
    sl_text_t keys[GW_FRP_KEYS];
} gw_frp_frame_t;

typedef struct gw_frp {
    const char *data;
    size_t n;
    yajl_handle h;
    const gw_flt_resp_t *x; /* the text sent so far, for the compares */
    int depth;
    int key;        /* 1 type, 2 delta, 3 logprobs, 0 other: whose value comes next */
    size_t key_end; /* offset just past that key */
    char type[40];
    bool has_type, has_delta, has_lp, lp_open, odd;
    bool esc_other; /* a string or key yajl decoded (escapes): look for \u */
    size_t ds, de;  /* the delta string, quotes included */
    size_t ls, le;  /* the logprobs value (lsh NULL; else see gw_frp_lp_span) */
    /* a delta a kept shape matched: that shape and its logprobs' span in
     * the shape's text; the matched holes in hole[] (the span moved only
     * when a splice needs it: most deltas pass) */
    const sl_jshape_t *lsh;
    size_t lsh_ls, lsh_le;
    /* the other events */
    /* a delta's holes for its shape: its top-level integers and strings
     * but its type (gw_frp_hole) */
    sl_jspan_t hole[GW_FRP_HOLES];
    uint8_t hkind[GW_FRP_HOLES];
    size_t nholes;
    int kd;      /* the delta's hole, or -1 */
    bool closed; /* the event's object closed (at close_end) */
    size_t close_end;
    bool canon_bad;                     /* not what jansson's compact dump writes */
    bool part1_ot;                      /* part: an object of type output_text */
    bool item_content, resp_output;     /* item.content, response.output there */
    bool bad_part1, bad_item, bad_resp; /* an output_text part there lacks the text sent */
    uint8_t top_text;                   /* the event's own text: as gw_frp_frame_t.text */
    bool canon_ok;                      /* known canonical (a done shape's match) */
    /* a done event's holes for its shape (gw_frp_dhole): every string value
     * but a type's, every integer; dtext: the holes that are texts the
     * general path would compare (and set) */
    bool dh_bad;
    size_t ndh;
    uint64_t dtext;
    sl_jspan_t dh[SL_JSHAPE_MAX_HOLES];
    uint8_t dk[SL_JSHAPE_MAX_HOLES];
    gw_frp_frame_t fr[GW_FRP_DEPTH + 1];
} gw_frp_t;

/* The thread's yajl handle for the events, kept between them (a stream of
 * values: common/yheap.h); the callbacks find their pass in cur. */
static _Thread_local sl_ykeep_t gw_frp_keep;
#define GW_FRP(ctx) ((gw_frp_t *)((sl_ykeep_t *)(ctx))->cur)

/* Does the decoded string s read as the text sent? */
static bool gw_frp_is_sent(const gw_frp_t *p, const unsigned char *s, size_t n)
{
    size_t have = p->x->acc ? p->x->len : 0;
    return n == have && (n == 0 || memcmp(s, p->x->acc, n) == 0);
}

/* A container opens at p->depth (after the increment) as the member k of
 * the frame below it. */
static void gw_frp_open_frame(gw_frp_t *p, bool obj, uint8_t k)
{
    if (p->depth > GW_FRP_DEPTH) {
        p->canon_bad = true;
        return;
    }
    gw_frp_frame_t *f = &p->fr[p->depth];
    uint8_t up = p->depth > 1 ? p->fr[p->depth - 1].role : GW_FRP_OTHER;
    uint8_t role = GW_FRP_OTHER;
    if (p->depth == 1)
        role = obj ? GW_FRP_TOP : GW_FRP_OTHER;
    else if (up == GW_FRP_TOP && obj && k == 4)
        role = GW_FRP_PART1;
    else if (up == GW_FRP_TOP && obj && k == 5)
        role = GW_FRP_ITEM;
    else if (up == GW_FRP_TOP && obj && k == 6)
        role = GW_FRP_RESP;
    else if (up == GW_FRP_ITEM && !obj && k == 3)
        role = GW_FRP_ICONTENT;
    else if (up == GW_FRP_ICONTENT && obj)
        role = GW_FRP_IPART;
    else if (up == GW_FRP_RESP && !obj && k == 7)
        role = GW_FRP_OUTPUT;
    else if (up == GW_FRP_OUTPUT && obj)
        role = GW_FRP_OITEM;
    else if (up == GW_FRP_OITEM && !obj && k == 3)
        role = GW_FRP_OCONTENT;
    else if (up == GW_FRP_OCONTENT && obj)
        role = GW_FRP_OPART;
    f->role = role;
    f->key = 0;
    f->is_ot = false;
    f->text = 0;
    f->nkeys = 0;
}

/* A value (a scalar, or a container opening) in the frame at p->depth. */
static void gw_frp_member(gw_frp_t *p, bool is_str, const unsigned char *s, size_t n)
{
    if (p->depth < 1 || p->depth > GW_FRP_DEPTH)
        return;
    gw_frp_frame_t *f = &p->fr[p->depth];
    uint8_t k = f->key;
    f->key = 0;
    switch (f->role) {
    case GW_FRP_TOP:
        if (k == 2)
            p->top_text = is_str && gw_frp_is_sent(p, s, n) ? 1 : 2;
        break;
    case GW_FRP_ITEM:
        if (k == 3)
            p->item_content = true;
        break;
    case GW_FRP_RESP:
        if (k == 7)
            p->resp_output = true;
        break;
    case GW_FRP_PART1:
    case GW_FRP_IPART:
    case GW_FRP_OPART:
        if (k == 1)
            f->is_ot = is_str && n == 11 && memcmp(s, "output_text", 11) == 0;
        else if (k == 2)
            f->text = is_str && gw_frp_is_sent(p, s, n) ? 1 : 2;
        break;
    default:
        break;
    }
}

/* A top-level scalar as a hole of the event's shape (gw_frp_shape_*): the
 * delta's string (escapes and all), and each other string without an
 * escape and each integer of 18 digits at most; the type stays bytes. s:
 * the string (decoded) or the number's token. */
static void gw_frp_hole(gw_frp_t *p, bool is_str, const unsigned char *s, size_t n)
{
    const char *c = (const char *)s;
    if (p->key == 1 || !s || p->nholes == GW_FRP_HOLES)
        return;
    sl_jspan_t h;
    uint8_t kind;
    if (p->key == 2) {
        h = (sl_jspan_t){(uint32_t)(p->ds + 1), (uint32_t)(p->de - p->ds - 2)};
        kind = SL_JHOLE_JSTR;
        p->kd = (int)p->nholes;
    } else if (c < p->data || c + n > p->data + p->n) {
        return; /* an escaped string (yajl's copy): its bytes stay */
    } else if (is_str) {
        h = (sl_jspan_t){(uint32_t)(c - p->data), (uint32_t)n};
        kind = SL_JHOLE_STR;
    } else {
        size_t i = c[0] == '-';
        if (n - i == 0 || n - i > SL_JSHAPE_INT_DIGITS)
            return;
        for (; i < n; i++)
            if (c[i] < '0' || c[i] > '9')
                return; /* a real: its bytes stay */
        h = (sl_jspan_t){(uint32_t)(c - p->data), (uint32_t)n};
        kind = SL_JHOLE_INT;
    }
    p->hole[p->nholes] = h;
    p->hkind[p->nholes++] = kind;
}

/* jansson writes an integer that fits int64 as its digits, and a real in
 * its own way: the bytes stay only for the former. */
static bool gw_frp_int_canonical(const char *s, size_t n)
{
    size_t i = s[0] == '-';
    if (n - i == 0 || n - i > 18 || (i && n == 2 && s[1] == '0'))
        return false; /* (19 digits and more: maybe beyond int64; -0 is written 0) */
    for (; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

/* A scalar at any depth as a hole of a done event's shape (gw_frp_dshape_*):
 * strings but a "type"'s (pk the member's key id) and integers; a text the
 * general path compares (pk 2 in the event or a part) must be one. */
static void gw_frp_dhole(gw_frp_t *p, bool is_str, uint8_t pk, const unsigned char *s, size_t n)
{
    const char *c = (const char *)s;
    uint8_t role = p->depth >= 1 && p->depth <= GW_FRP_DEPTH ? p->fr[p->depth].role : GW_FRP_OTHER;
    bool text = is_str && pk == 2 &&
                (role == GW_FRP_TOP || role == GW_FRP_PART1 || role == GW_FRP_IPART ||
                 role == GW_FRP_OPART);
    if (p->dh_bad || !s || (is_str && pk == 1))
        return;
    if (c < p->data || c + n > p->data + p->n || p->ndh == SL_JSHAPE_MAX_HOLES) {
        p->dh_bad |= text || p->ndh == SL_JSHAPE_MAX_HOLES; /* escaped: its bytes stay */
        return;
    }
    if (!is_str && !gw_frp_int_canonical(c, n))
        return; /* a real: its bytes stay (and the event is not canonical) */
    if (text)
        p->dtext |= 1ull << p->ndh;
    p->dh[p->ndh] = (sl_jspan_t){(uint32_t)(c - p->data), (uint32_t)n};
    p->dk[p->ndh++] = is_str ? SL_JHOLE_STR : SL_JHOLE_INT;
}

/* container: 0 a scalar, 1 an object opens, 2 an array opens. */
static int gw_frp_value(gw_frp_t *p, bool is_str, int container, const unsigned char *s, size_t n)
{
    if (p->depth == 0 && (p->closed || container != 1)) {
        p->odd = true; /* a second value after the event's, or one before it */
        return 0;
    }
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
        p->lp_open = container != 0;
    }
    if (p->depth == 1 && !container)
        gw_frp_hole(p, is_str, s, n);
    p->key = 0;
    uint8_t pk = p->depth >= 1 && p->depth <= GW_FRP_DEPTH ? p->fr[p->depth].key : 0;
    if (!container)
        gw_frp_dhole(p, is_str, pk, s, n);
    gw_frp_member(p, is_str, s, n);
    if (container) {
        p->depth++;
        gw_frp_open_frame(p, container == 1, pk);
    }
    return 1;
}

/* jansson reads the number token s: an integer within int64, a real
 * within a double (it refuses the event otherwise). */
static bool gw_frp_num_loads(const char *s, size_t n)
{
    char buf[64];
    if (!memchr(s, '.', n) && !memchr(s, 'e', n) && !memchr(s, 'E', n)) {
        if (n - (s[0] == '-') <= 18)
            return true;
        if (n >= sizeof(buf))
            return false;
        memcpy(buf, s, n);
        buf[n] = '\0';
        errno = 0;
        (void)strtoll(buf, NULL, 10);
        return errno == 0;
    }
    if (n >= sizeof(buf))
        return false; /* (a real that long: the tree path decides) */
    memcpy(buf, s, n);
    buf[n] = '\0';
    double v = strtod(buf, NULL);
    return v - v == 0; /* not inf */
}

/* jansson reads the string (or key) s as yajl gave it: yajl's UTF-8 check
 * lets through what jansson's refuses (overlong forms, surrogates), so a
 * string of the event's own bytes is checked as the filters check text;
 * one yajl decoded (an escape) may hold a \u jansson refuses (\u0000, a
 * lone surrogate half, which yajl writes as '?'): noted for gw_frp_scan. */
static bool gw_frp_str_loads(gw_frp_t *p, const unsigned char *s, size_t n)
{
    const char *c = (const char *)s;
    if (c < p->data || c + n > p->data + p->n) {
        p->esc_other = true;
        return true;
    }
    return flt_utf8_valid(c, n);
}

static int gw_frp_null(void *c)
{
    return gw_frp_value(GW_FRP(c), false, 0, NULL, 0);
}
static int gw_frp_bool(void *c, int v)
{
    (void)v;
    return gw_frp_value(GW_FRP(c), false, 0, NULL, 0);
}
static int gw_frp_num(void *c, const char *s, size_t n)
{
    gw_frp_t *p = GW_FRP(c);
    if (!gw_frp_int_canonical(s, n)) {
        p->canon_bad = true;
        if (!gw_frp_num_loads(s, n)) {
            p->odd = true; /* jansson refuses the event: the tree path decides */
            return 0;
        }
    }
    return gw_frp_value(p, false, 0, (const unsigned char *)s, n);
}
static int gw_frp_str(void *c, const unsigned char *s, size_t n)
{
    gw_frp_t *p = GW_FRP(c);
    if (!gw_frp_str_loads(p, s, n)) {
        p->odd = true;
        return 0;
    }
    return gw_frp_value(p, true, 0, s, n);
}
static int gw_frp_open_map(void *c)
{
    return gw_frp_value(GW_FRP(c), false, 1, NULL, 0);
}
static int gw_frp_open_array(void *c)
{
    return gw_frp_value(GW_FRP(c), false, 2, NULL, 0);
}
static int gw_frp_close(void *c)
{
    gw_frp_t *p = GW_FRP(c);
    if (p->depth >= 1 && p->depth <= GW_FRP_DEPTH) {
        const gw_frp_frame_t *f = &p->fr[p->depth];
        bool bad = f->is_ot && f->text != 1; /* the general path would set its text */
        if (f->role == GW_FRP_PART1) {
            p->part1_ot = f->is_ot;
            p->bad_part1 |= bad;
        } else if (f->role == GW_FRP_IPART) {
            p->bad_item |= bad;
        } else if (f->role == GW_FRP_OPART) {
            p->bad_resp |= bad;
        }
    }
    if (--p->depth == 1 && p->lp_open) {
        p->le = yajl_get_bytes_consumed(p->h);
        p->lp_open = false;
    } else if (p->depth == 0) {
        p->closed = true;
        p->close_end = yajl_get_bytes_consumed(p->h);
    }
    return 1;
}

/* The key k in the object at p->depth: recorded, and checked against the
 * object's others (jansson keeps the last of a duplicate, which its dump
 * would show). */
static void gw_frp_key_note(gw_frp_t *p, const unsigned char *k, size_t n)
{
    if (p->depth < 1 || p->depth > GW_FRP_DEPTH)
        return;
    gw_frp_frame_t *f = &p->fr[p->depth];
    const char *kc = (const char *)k;
    if (kc < p->data || kc + n > p->data + p->n || f->nkeys == GW_FRP_KEYS) {
        p->canon_bad = true; /* an escaped key (yajl's copy), or too many to compare */
        return;
    }
    for (size_t i = 0; i < f->nkeys; i++)
        if (f->keys[i].len == n && memcmp(f->keys[i].p, kc, n) == 0)
            p->canon_bad = true;
    f->keys[f->nkeys++] = (sl_text_t){kc, n};
    uint8_t id = 0;
    if (n == 4)
        id = memcmp(k, "type", 4) == 0   ? 1
             : memcmp(k, "text", 4) == 0 ? 2
             : memcmp(k, "part", 4) == 0 ? 4
             : memcmp(k, "item", 4) == 0 ? 5
                                         : 0;
    else if (n == 7 && memcmp(k, "content", 7) == 0)
        id = 3;
    else if (n == 8 && memcmp(k, "response", 8) == 0)
        id = 6;
    else if (n == 6 && memcmp(k, "output", 6) == 0)
        id = 7;
    f->key = id;
}

static int gw_frp_key(void *c, const unsigned char *k, size_t n)
{
    gw_frp_t *p = GW_FRP(c);
    p->key = 0;
    if (!gw_frp_str_loads(p, k, n)) {
        p->odd = true;
        return 0;
    }
    gw_frp_key_note(p, k, n);
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
    .yajl_start_map = gw_frp_open_map,
    .yajl_map_key = gw_frp_key,
    .yajl_end_map = gw_frp_close,
    .yajl_start_array = gw_frp_open_array,
    .yajl_end_array = gw_frp_close,
};

/* The event's kinds, by its type as the general path tells them apart. */
typedef enum gw_frp_kind {
    GW_FRK_OTHER = 0, /* passed as it came */
    GW_FRK_DELTA,
    GW_FRK_TEXT_DONE,
    GW_FRK_PART_DONE,
    GW_FRK_ITEM_DONE,
    GW_FRK_COMPLETED, /* response.completed* and response.incomplete */
} gw_frp_kind_t;

static gw_frp_kind_t gw_frp_kind(const char *type)
{
    if (strcmp(type, "response.output_text.delta") == 0)
        return GW_FRK_DELTA;
    if (strcmp(type, "response.output_text.done") == 0)
        return GW_FRK_TEXT_DONE;
    if (strcmp(type, "response.content_part.done") == 0)
        return GW_FRK_PART_DONE;
    if (strcmp(type, "response.output_item.done") == 0)
        return GW_FRK_ITEM_DONE;
    if (strncmp(type, "response.completed", 18) == 0 || strcmp(type, "response.incomplete") == 0)
        return GW_FRK_COMPLETED;
    return GW_FRK_OTHER;
}

/* true: the event read (one object, its type a string given once). */
static bool gw_frp_scan(gw_frp_t *p, const gw_flt_resp_t *x, const char *data, size_t len)
{
    p->data = data;
    p->n = len;
    p->x = x;
    p->depth = 0;
    p->key = 0;
    p->has_type = p->has_delta = p->has_lp = p->lp_open = p->odd = p->esc_other = false;
    p->canon_bad = p->part1_ot = p->item_content = p->resp_output = false;
    p->bad_part1 = p->bad_item = p->bad_resp = false;
    p->top_text = 0;
    p->canon_ok = p->dh_bad = false;
    p->ndh = 0;
    p->dtext = 0;
    p->closed = false;
    p->nholes = 0;
    p->kd = -1;
    p->lsh = NULL;
    /* yajl takes \v and \f for blanks, jansson refuses them (in a string
     * both refuse a control byte): the tree path decides */
    if (memchr(data, '\v', len) || memchr(data, '\f', len))
        return false;
    p->h = sl_ykeep_take(&gw_frp_keep, &gw_frp_cb, true);
    if (!p->h)
        return false;
    gw_frp_keep.cur = p;
    yajl_status s = yajl_parse(p->h, (const unsigned char *)data, len);
    gw_frp_keep.cur = NULL;
    /* the object closed, and nothing but blanks after it (yajl reads a
     * stream of values: it would take a second) */
    bool whole = s == yajl_status_ok && p->closed;
    for (size_t i = whole ? p->close_end : len; i < len; i++)
        if (data[i] != ' ' && data[i] != '\t' && data[i] != '\n' && data[i] != '\r')
            whole = false;
    sl_ykeep_put(&gw_frp_keep, p->h, whole);
    if (whole && p->esc_other && memmem(data, len, "\\u", 2))
        return false; /* maybe a \u jansson refuses: the tree path decides */
    return whole && !p->odd && p->has_type;
}

/* ---- delta events by their shape --------------------------------------------
 *
 * A stream's deltas differ from each other only in their delta text and
 * their numbers (sequence_number...): after yajl read one, its bytes are
 * kept as a shape with those values as holes (common/jshape.h), and a later
 * event with that shape is known, without a parse, to be a delta read the
 * same way (the same type, keys and logprobs; the delta's and logprobs'
 * spans moved by the holes' new lengths). */

typedef struct gw_frp_shape {
    int kd;      /* the delta's hole */
    bool has_lp; /* logprobs there, at [ls, le) in the shape's text */
    size_t ls, le;
} gw_frp_shape_t;

static _Thread_local sl_jshape_cache_t gw_frp_shapes =
    SL_JSHAPE_CACHE_INIT(2, 4, 16, sizeof(gw_frp_shape_t), NULL);

/* An offset in the shape's text, in the matched text. */
static size_t gw_frp_shift(const sl_jshape_t *sh, const sl_jspan_t *got, size_t off)
{
    size_t o = off;
    for (size_t i = 0; i < sh->nholes && sh->hole[i].off < off; i++)
        o = o + got[i].len - sh->hole[i].len;
    return o;
}

/* Each string hole of sh but the delta's (kd: the filter checks that one)
 * is UTF-8 as jansson takes it (gw_frp_str_loads). */
static bool gw_frp_holes_utf8(const sl_jshape_t *sh, const char *data, const sl_jspan_t *got,
                              int kd)
{
    for (size_t i = 0; i < sh->nholes; i++) {
        if (sh->kind[i] != SL_JHOLE_STR || (int)i == kd)
            continue;
        if (!flt_utf8_valid(data + got[i].off, got[i].len)) /* (skips ASCII a word at a time) */
            return false;
    }
    return true;
}

/* The logprobs value's span in p's event: a kept shape's moved by the
 * holes matched before it (gw_frp_shape_find), else the scan's. */
static void gw_frp_lp_span(const gw_frp_t *p, size_t *ls, size_t *le)
{
    if (!p->lsh) {
        *ls = p->ls;
        *le = p->le;
        return;
    }
    *ls = gw_frp_shift(p->lsh, p->hole, p->lsh_ls);
    *le = gw_frp_shift(p->lsh, p->hole, p->lsh_le);
}

/* true: data is a delta with a kept shape; p holds what gw_frp_scan would
 * have found for gw_flt_resp_fast (the spans; logprobs' through
 * gw_frp_lp_span). */
static bool gw_frp_shape_find(gw_frp_t *p, const char *data, size_t len)
{
    sl_jshape_cache_t *c = &gw_frp_shapes;
    sl_jspan_t *got = p->hole; /* a delta's shape has at most GW_FRP_HOLES holes */
    uint64_t esc;
    for (unsigned i = 0; i < c->nslots; i++) {
        const sl_jshape_slot_t *sl = &c->slot[i];
        if (sl_jshape_empty(&sl->sh) || !sl_jshape_match_esc(&sl->sh, data, len, got, &esc))
            continue;
        const gw_frp_shape_t *d = sl->data;
        if (!gw_frp_holes_utf8(&sl->sh, data, got, d->kd))
            continue;
        sl_jshape_cache_hit(c, i);
        p->data = data;
        p->n = len;
        p->ds = got[d->kd].off - 1;
        p->de = got[d->kd].off + got[d->kd].len + 1;
        p->has_lp = d->has_lp;
        p->lsh = &sl->sh; /* valid until a shape is learnt: not in this event */
        p->lsh_ls = d->ls;
        p->lsh_le = d->le;
        return true;
    }
    sl_jshape_cache_miss(c);
    return false;
}

/* A delta gw_frp_scan read: its shape kept when the gate says so. */
static void gw_frp_shape_learn(const gw_frp_t *p)
{
    sl_jshape_cache_t *c = &gw_frp_shapes;
    if (p->kd < 0 || !sl_jshape_cache_gate(c))
        return;
    int i = sl_jshape_cache_take(c);
    if (i < 0)
        return;
    gw_frp_shape_t *d = c->slot[i].data;
    *d = (gw_frp_shape_t){p->kd, p->has_lp, p->ls, p->le};
    if (sl_jshape_cache_set(c, (unsigned)i, p->data, p->n, p->hole, p->hkind, p->nholes) != 0)
        return; /* the slot stays empty: it matches nothing */
}

/* Forgets this thread's shapes (tests). */
void gw_flt_resp_shapes_clear(void)
{
    sl_jshape_cache_clear(&gw_frp_shapes);
}

uint64_t gw_flt_resp_shape_hits(void)
{
    return gw_frp_shapes.st.hits;
}

/* ---- done events by their shape ---------------------------------------------
 *
 * The events that repeat the whole text come once a stream, in the same
 * form from one server: after gw_frp_scan read one and gw_flt_resp_quick
 * answered it, its bytes are kept as a shape whose holes are every string
 * value but a type's and every integer (gw_frp_dhole), with what the answer
 * was. A later event with that shape has the same keys, types and
 * structure, and is canonical (jansson's own writing) when the shape's
 * was, but for what the holes hold: an integer -0 (jansson writes 0) and
 * a string not valid UTF-8 (flt_utf8_valid, stricter than yajl's check
 * the scan relies on) are taken as misses; and
 * the texts the general path would compare must each be the text sent. */

enum { GW_FRD_PASS = 1, GW_FRD_COPY, GW_FRD_TEXT_DONE };

typedef struct gw_frp_dshape {
    uint8_t answer; /* GW_FRD_*: what gw_flt_resp_quick made of it */
    uint64_t dtext; /* the holes that are texts (bit i: hole i) */
} gw_frp_dshape_t;

static _Thread_local sl_jshape_cache_t gw_frp_dshapes =
    SL_JSHAPE_CACHE_INIT(4, 8, 16, sizeof(gw_frp_dshape_t), NULL);

/* The holes got in data hold what the shape's answer stands for. */
static bool gw_frp_dholes_ok(const gw_frp_t *p, const sl_jshape_t *sh, const sl_jspan_t *got,
                             uint64_t dtext)
{
    for (size_t i = 0; i < sh->nholes; i++) {
        const unsigned char *b = (const unsigned char *)p->data + got[i].off;
        size_t n = got[i].len;
        if (sh->kind[i] == SL_JHOLE_INT) {
            if (n == 2 && b[0] == '-' && b[1] == '0')
                return false;
            continue;
        }
        if (dtext >> i & 1 && !gw_frp_is_sent(p, b, n))
            return false;
        if (!flt_utf8_valid((const char *)b, n))
            return false;
    }
    return true;
}

/* A done event with a kept shape: its answer (GW_FRD_*), p set as
 * gw_frp_scan would have set what that answer reads; 0 none. */
static int gw_frp_dshape_find(gw_frp_t *p, const gw_flt_resp_t *x, const char *data, size_t len)
{
    sl_jshape_cache_t *c = &gw_frp_dshapes;
    sl_jspan_t got[SL_JSHAPE_MAX_HOLES];
    p->data = data;
    p->n = len;
    p->x = x;
    for (unsigned i = 0; i < c->nslots; i++) {
        const sl_jshape_slot_t *sl = &c->slot[i];
        const gw_frp_dshape_t *d = sl->data;
        if (sl_jshape_empty(&sl->sh) || !sl_jshape_match(&sl->sh, data, len, got) ||
            !gw_frp_dholes_ok(p, &sl->sh, got, d->dtext))
            continue;
        sl_jshape_cache_hit(c, i);
        p->top_text = 1;
        p->canon_ok = true;
        p->canon_bad = false;
        return d->answer;
    }
    sl_jshape_cache_miss(c);
    return 0;
}

/* A done event gw_frp_scan read and gw_flt_resp_quick answered (answer). */
static void gw_frp_dshape_learn(const gw_frp_t *p, uint8_t answer)
{
    sl_jshape_cache_t *c = &gw_frp_dshapes;
    if (!answer || p->dh_bad || !sl_jshape_cache_gate(c))
        return;
    for (size_t i = 0; i < p->ndh; i++)
        if (p->dtext >> i & 1 &&
            !gw_frp_is_sent(p, (const unsigned char *)p->data + p->dh[i].off, p->dh[i].len))
            return; /* a text another than the one sent: no shape stands for it */
    int i = sl_jshape_cache_take(c);
    if (i < 0)
        return;
    gw_frp_dshape_t *d = c->slot[i].data;
    *d = (gw_frp_dshape_t){answer, p->dtext};
    if (sl_jshape_cache_set(c, (unsigned)i, p->data, p->n, p->dh, p->dk, p->ndh) != 0)
        return; /* the slot stays empty */
}

void gw_flt_resp_dshapes_clear(void)
{
    sl_jshape_cache_clear(&gw_frp_dshapes);
}

uint64_t gw_flt_resp_dshape_hits(void)
{
    return gw_frp_dshapes.st.hits;
}

/* The bytes are what jansson's compact dump writes for them: no blank
 * between tokens, and no escape it would write otherwise (\u, \/). With
 * the callbacks' checks (keys once, integers) the event comes out of a
 * json_loadb / json_dumps round as it went in. */
static bool gw_frp_canonical(const gw_frp_t *p)
{
    if (p->canon_ok)
        return true;
    if (p->canon_bad)
        return false;
    const char *d = p->data;
    size_t i = 0, n = p->n;
    while (i < n) {
        char ch = d[i++];
        if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r')
            return false;
        if (ch != '"')
            continue;
        for (;;) { /* a string's interior, a run at a time */
            i = sl_jshape_str_end(d, i, n);
            if (i >= n)
                return false;
            ch = d[i++];
            if (ch == '"')
                break;
            char e = i < n ? d[i++] : 'u';
            if (ch != '\\' ||
                (e != '"' && e != '\\' && e != 'b' && e != 'f' && e != 'n' && e != 'r' && e != 't'))
                return false; /* \u, \/ (or a control byte yajl refused) */
        }
    }
    return true;
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
    size_t el = strlen(enc), ls = 0, le = 0;
    if (p->has_lp)
        gw_frp_lp_span(p, &ls, &le);
    struct gw_frp_edit {
        size_t s, e;
        const char *r;
        size_t rl;
    } ed[2] = {{p->ds, p->de, enc, el}, {ls, le, "[]", 2}};
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

static bool gw_frp_surely_other(const char *data, size_t len);

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
    if (v == FLT_EV_REPLACE && rlen == 0 && !flt_utf8_valid(t, tn))
        v = FLT_EV_ERROR; /* dropped unread (its item finished): as the tree path, which
                             cannot read it, not dropped */
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

/* What the filter made of a delta's or a text_done's chat chunk (v, o),
 * as Responses events: the general path's tail, shared with the quick
 * text_done (j the event's tree, borrowed). */
static gw_ev_rc_t gw_flt_resp_after(gw_flt_resp_t *x, json_t *j, bool delta, bool text_done,
                                    const char *d, flt_ev_verdict_t v, const flt_out_t *o,
                                    gw_payloads_t *out)
{
    gw_ev_rc_t rc = GW_EV_REPLACE;
    if (v == FLT_EV_PASS && delta) {
        gw_flt_resp_add(x, d ? d : "", d ? strlen(d) : 0);
        rc = GW_EV_PASS;
    } else {
        /* What the filter let out, as delta events of this item. */
        for (size_t i = 0; i < o->n && rc != GW_EV_STOP; i++) {
            json_t *c = json_loads(o->v[i].data, 0, NULL);
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
    return rc;
}

gw_ev_rc_t gw_flt_resp_event_tree(gw_flt_resp_t *x, flt_stream_t *st, const char *data, size_t len,
                                  gw_payloads_t *out)
{
    json_t *j = json_loadb(data, len, 0, NULL);
    if (!j && !gw_frp_surely_other(data, len)) {
        /* Text we cannot read is text we cannot check (as the chat filter):
         * a client's parser may take what jansson refuses (an integer beyond
         * int64, \u0000, a surrogate in UTF-8, a second value) and show a
         * delta or a done text no rule saw. */
        gw_flt_resp_blocked(out);
        return GW_EV_STOP;
    }
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
    gw_ev_rc_t rc = gw_flt_resp_after(x, j, delta, text_done, d, v, &o, out);
    flt_out_release(&o);
    json_decref(j);
    return rc;
}

/* The text_done event: the chat path's finish chunk (the bytes the general
 * path packs for it) flushes what is held; when nothing comes out and the
 * event already carries the text sent, in jansson's own form, it goes as
 * it came (without its event: line, as a replaced event). */
static gw_ev_rc_t gw_flt_resp_text_done(gw_flt_resp_t *x, flt_stream_t *st, const gw_frp_t *p,
                                        gw_payloads_t *out)
{
    static const char fin[] =
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":null},\"finish_reason\":\"stop\"}]}";
    flt_out_t o;
    memset(&o, 0, sizeof(o));
    flt_ev_verdict_t v = flt_stream_event(st, fin, sizeof(fin) - 1, &o);
    gw_ev_rc_t rc;
    if ((v == FLT_EV_PASS || v == FLT_EV_REPLACE) && o.n == 0 && !x->oom && p->top_text == 1 &&
        gw_frp_canonical(p)) {
        rc = gw_payloads_push_copy(out, p->data, p->n) == 0 ? GW_EV_REPLACE : GW_EV_STOP;
    } else {
        json_t *j = json_loadb(p->data, p->n, 0, NULL);
        rc = gw_flt_resp_after(x, j, false, true, NULL, v, &o, out);
        json_decref(j);
    }
    flt_out_release(&o);
    return rc;
}

/* An event gw_frp_scan read that is not a delta: 0 answered (*rc), -1 the
 * general path decides. *learn: the answer a shape of it may stand for
 * (GW_FRD_*), or 0. */
static int gw_flt_resp_quick(gw_flt_resp_t *x, flt_stream_t *st, const gw_frp_t *p,
                             gw_payloads_t *out, gw_ev_rc_t *rc, uint8_t *learn)
{
    bool there, bad;
    *learn = 0;
    switch (gw_frp_kind(p->type)) {
    case GW_FRK_OTHER:
        *rc = GW_EV_PASS; /* the general path passes it too */
        return 0;
    case GW_FRK_TEXT_DONE:
        if (p->top_text == 1 && gw_frp_canonical(p))
            *learn = GW_FRD_TEXT_DONE; /* the filter's part runs again on a match */
        *rc = gw_flt_resp_text_done(x, st, p, out);
        return 0;
    case GW_FRK_PART_DONE:
        there = p->part1_ot, bad = p->bad_part1;
        break;
    case GW_FRK_ITEM_DONE:
        there = p->item_content, bad = p->bad_item;
        break;
    case GW_FRK_COMPLETED:
        there = p->resp_output, bad = p->bad_resp;
        break;
    default:
        return -1;
    }
    if (!gw_frp_canonical(p))
        return -1;
    if (!there) {
        *learn = GW_FRD_PASS;
        *rc = GW_EV_PASS; /* nothing the general path would set */
        return 0;
    }
    if (bad)
        return -1;
    *learn = GW_FRD_COPY;
    *rc = gw_payloads_push_copy(out, p->data, p->n) == 0 ? GW_EV_REPLACE : GW_EV_STOP;
    return 0;
}

/* Events parsed by gw_frp_scan on this thread (tests). */
static _Thread_local uint64_t gw_frp_scans;

uint64_t gw_flt_resp_scans(void)
{
    return gw_frp_scans;
}

/* true: no type the general path acts on can be read from these bytes, so
 * it passes the event whatever else it holds (or when jansson refuses it).
 * Each such type (gw_frp_kind) has ".delta", ".done", ".completed" or
 * ".incomplete" in it, and without a backslash a decoded string's bytes
 * are the event's own: an event with none of them after a '.' is passed
 * without a parse (response.created, *.added, in_progress: a third of a
 * short stream's bytes). */
static bool gw_frp_surely_other(const char *data, size_t len)
{
    if (memchr(data, '\\', len))
        return false;
    const char *end = data + len, *q = data;
    while ((q = memchr(q, '.', (size_t)(end - q))) != NULL) {
        size_t rest = (size_t)(end - ++q);
        if ((rest >= 4 && q[0] == 'd' &&
             (memcmp(q, "done", 4) == 0 || (rest >= 5 && memcmp(q, "delta", 5) == 0))) ||
            (rest >= 9 && memcmp(q, "completed", 9) == 0) ||
            (rest >= 10 && memcmp(q, "incomplete", 10) == 0))
            return false;
    }
    return true;
}

gw_ev_rc_t gw_flt_resp_event(gw_flt_resp_t *x, flt_stream_t *st, const char *data, size_t len,
                             gw_payloads_t *out)
{
    gw_frp_t fp;
    gw_ev_rc_t rc;
    if (gw_frp_shape_find(&fp, data, len))
        return gw_flt_resp_fast(x, st, &fp, data, len, out, &rc) == 0
                   ? rc
                   : gw_flt_resp_event_tree(x, st, data, len, out);
    if (gw_frp_surely_other(data, len))
        return GW_EV_PASS; /* as gw_frp_kind's GW_FRK_OTHER, or the tree path's no type */
    switch (gw_frp_dshape_find(&fp, x, data, len)) {
    case GW_FRD_PASS:
        return GW_EV_PASS;
    case GW_FRD_COPY:
        return gw_payloads_push_copy(out, data, len) == 0 ? GW_EV_REPLACE : GW_EV_STOP;
    case GW_FRD_TEXT_DONE:
        return gw_flt_resp_text_done(x, st, &fp, out);
    default:
        break;
    }
    gw_frp_scans++;
    if (gw_frp_scan(&fp, x, data, len)) {
        uint8_t learn;
        if (fp.has_delta && strcmp(fp.type, "response.output_text.delta") == 0) {
            gw_frp_shape_learn(&fp);
            if (gw_flt_resp_fast(x, st, &fp, data, len, out, &rc) == 0)
                return rc;
        } else if (gw_flt_resp_quick(x, st, &fp, out, &rc, &learn) == 0) {
            gw_frp_dshape_learn(&fp, learn);
            return rc;
        }
    }
    return gw_flt_resp_event_tree(x, st, data, len, out);
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

flt_req_verdict_t gw_flt_resp_request_text(const flt_ruleset_t *rs, const sl_text_t *input,
                                           flt_req_result_t *res)
{
    if (!input) {
        memset(res, 0, sizeof(*res));
        return FLT_REQ_OK; /* as gw_flt_resp_request: item lists not read yet */
    }
    /* the one user message gw_flt_resp_request builds as a tree */
    sl_chat_msg_t m = {.kind = SL_J_OBJECT,
                       .role_kind = SL_J_STRING,
                       .role = {"user", 4},
                       .content_kind = SL_J_STRING,
                       .content = *input};
    sl_chat_t chat = {.messages_kind = SL_J_ARRAY, .msgs = &m, .nmsgs = 1};
    return flt_request_check_chat(rs, &chat, res);
}

/* ---- a whole answer without a jansson tree --------------------------------
 *
 * A Responses answer's texts are output[i].content[k].text. yajl finds
 * each one's bytes; each goes through the chat answer's byte filter as the
 * content of a one-choice chat.completion (what gw_flt_resp_body builds as
 * a tree). When no rule changes any, the answer goes as it came, as on the
 * tree path; when one does, the answer is written as the tree path writes
 * it. Anything jansson might read otherwise than yajl (a \u escape: NUL and
 * lone surrogates; integers beyond int64, reals beyond a double; a
 * duplicate key on the path; deep nesting) is left to the tree path. */

#define GW_FRB_DEPTH 64
#define GW_FRB_TEXTS 8

enum { GW_FRB_OTHER = 0, GW_FRB_TOP, GW_FRB_OUTPUT, GW_FRB_ITEM, GW_FRB_CONTENT, GW_FRB_PART };

typedef struct gw_frb_span {
    size_t s, e; /* the string's bytes, quotes included */
} gw_frb_span_t;

typedef struct gw_frb {
    const char *data;
    size_t n;
    yajl_handle h;
    int depth;
    bool odd;
    bool closed; /* the top container closed (at close_end) */
    size_t close_end;
    uint8_t role[GW_FRB_DEPTH + 1]; /* per depth: the container's role */
    uint8_t key[GW_FRB_DEPTH + 1];  /* per depth: 1 when the value coming is the one followed */
    uint8_t seen[GW_FRB_DEPTH + 1]; /* per depth: that key was seen in this object */
    size_t key_end;                 /* offset past the last key */
    gw_frb_span_t *v, v0[GW_FRB_TEXTS];
    size_t nv, cap;
} gw_frb_t;

static _Thread_local sl_ykeep_t gw_frb_keep;
#define GW_FRB(ctx) ((gw_frb_t *)((sl_ykeep_t *)(ctx))->cur)

static int gw_frb_push(gw_frb_t *p, size_t s, size_t e)
{
    if (p->nv == p->cap) {
        size_t cap = p->cap * 2;
        gw_frb_span_t *v = malloc(cap * sizeof(*v));
        if (!v)
            return -1;
        memcpy(v, p->v, p->nv * sizeof(*v));
        if (p->v != p->v0)
            free(p->v);
        p->v = v;
        p->cap = cap;
    }
    p->v[p->nv++] = (gw_frb_span_t){s, e};
    return 0;
}

/* A value in the container at p->depth; container: 0 a scalar, 1 an object
 * opens, 2 an array opens. */
static int gw_frb_value(gw_frb_t *p, bool is_str, int container)
{
    int d = p->depth;
    if (d == 0 && p->closed) {
        p->odd = true; /* a second value after the answer */
        return 0;
    }
    uint8_t up = d >= 1 && d <= GW_FRB_DEPTH ? p->role[d] : GW_FRB_OTHER;
    bool followed = d >= 1 && d <= GW_FRB_DEPTH && p->key[d];
    if (d >= 1 && d <= GW_FRB_DEPTH)
        p->key[d] = 0;
    if (up == GW_FRB_PART && followed && is_str) {
        size_t i = p->key_end;
        while (i < p->n && p->data[i] != '"')
            i++; /* past the blanks and the colon */
        if (gw_frb_push(p, i, yajl_get_bytes_consumed(p->h)) != 0) {
            p->odd = true;
            return 0;
        }
    }
    if (!container)
        return 1;
    if (++p->depth > GW_FRB_DEPTH) {
        p->odd = true; /* jansson's own limit is near: let it decide */
        return 0;
    }
    uint8_t role = GW_FRB_OTHER;
    if (d == 0)
        role = container == 1 ? GW_FRB_TOP : GW_FRB_OTHER;
    else if (up == GW_FRB_TOP && followed && container == 2)
        role = GW_FRB_OUTPUT;
    else if (up == GW_FRB_OUTPUT && container == 1)
        role = GW_FRB_ITEM;
    else if (up == GW_FRB_ITEM && followed && container == 2)
        role = GW_FRB_CONTENT;
    else if (up == GW_FRB_CONTENT && container == 1)
        role = GW_FRB_PART;
    p->role[p->depth] = role;
    p->key[p->depth] = 0;
    p->seen[p->depth] = 0;
    return 1;
}

static int gw_frb_null(void *c)
{
    return gw_frb_value(GW_FRB(c), false, 0);
}
static int gw_frb_bool(void *c, int v)
{
    (void)v;
    return gw_frb_value(GW_FRB(c), false, 0);
}
static int gw_frb_num(void *c, const char *s, size_t n)
{
    gw_frb_t *p = GW_FRB(c);
    bool real = memchr(s, '.', n) || memchr(s, 'e', n) || memchr(s, 'E', n);
    if (!real && n - (s[0] == '-') > 18) {
        p->odd = true; /* maybe beyond int64: jansson refuses the answer */
        return 0;
    }
    if (real) {
        char buf[64];
        if (n >= sizeof(buf)) {
            p->odd = true;
            return 0;
        }
        memcpy(buf, s, n);
        buf[n] = '\0';
        double v = strtod(buf, NULL);
        if (v - v != 0) { /* inf: jansson refuses it */
            p->odd = true;
            return 0;
        }
    }
    return gw_frb_value(p, false, 0);
}
static int gw_frb_str(void *c, const unsigned char *s, size_t n)
{
    (void)s, (void)n;
    return gw_frb_value(GW_FRB(c), true, 0);
}
static int gw_frb_open_map(void *c)
{
    return gw_frb_value(GW_FRB(c), false, 1);
}
static int gw_frb_open_array(void *c)
{
    return gw_frb_value(GW_FRB(c), false, 2);
}
static int gw_frb_close(void *c)
{
    gw_frb_t *p = GW_FRB(c);
    if (--p->depth == 0) {
        p->closed = true;
        p->close_end = yajl_get_bytes_consumed(p->h);
    }
    return 1;
}
static int gw_frb_key(void *c, const unsigned char *k, size_t n)
{
    gw_frb_t *p = GW_FRB(c);
    int d = p->depth;
    if (d < 1 || d > GW_FRB_DEPTH)
        return 1;
    uint8_t r = p->role[d];
    bool f = (r == GW_FRB_TOP && n == 6 && memcmp(k, "output", 6) == 0) ||
             (r == GW_FRB_ITEM && n == 7 && memcmp(k, "content", 7) == 0) ||
             (r == GW_FRB_PART && n == 4 && memcmp(k, "text", 4) == 0);
    if (f && p->seen[d]) {
        p->odd = true; /* jansson keeps the last: the tree path decides */
        return 0;
    }
    p->seen[d] |= f;
    p->key[d] = f;
    p->key_end = yajl_get_bytes_consumed(p->h);
    return 1;
}

static const yajl_callbacks gw_frb_cb = {
    .yajl_null = gw_frb_null,
    .yajl_boolean = gw_frb_bool,
    .yajl_number = gw_frb_num,
    .yajl_string = gw_frb_str,
    .yajl_start_map = gw_frb_open_map,
    .yajl_map_key = gw_frb_key,
    .yajl_end_map = gw_frb_close,
    .yajl_start_array = gw_frb_open_array,
    .yajl_end_array = gw_frb_close,
};

/* The one-choice chat.completion gw_flt_resp_body builds for the text at
 * raw (its JSON string), through the byte filter. *edited: the text the
 * filter made of it (malloc'd) or NULL when unchanged. 0, 1 (the tree
 * path decides), -1 (out of memory). */
static int gw_frb_text(flt_ruleset_t *rs, const char *raw, size_t rn, char **edited, size_t *elen)
{
    static const char pre[] = "{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                              "\"content\":";
    static const char post[] = "},\"finish_reason\":\"stop\"}]}";
    char stack[1024], *b = stack;
    size_t n = sizeof(pre) - 1 + rn + sizeof(post) - 1;
    if (n + 1 > sizeof(stack) && !(b = malloc(n + 1)))
        return -1;
    memcpy(b, pre, sizeof(pre) - 1);
    memcpy(b + sizeof(pre) - 1, raw, rn);
    memcpy(b + sizeof(pre) - 1 + rn, post, sizeof(post));
    char *o = NULL;
    size_t on = 0;
    flt_ans_rc_t rc = flt_response_filter_bytes(rs, b, n, &o, &on);
    if (b != stack)
        free(b);
    *edited = NULL;
    if (rc == FLT_ANS_SAME)
        return 0;
    if (rc != FLT_ANS_EDITED)
        return rc == FLT_ANS_TREE ? 1 : -1;
    /* the new content, as gw_flt_resp_body reads it from the tree */
    json_t *cc = json_loadb(o, on, 0, NULL);
    free(o);
    if (!cc)
        return -1;
    json_t *ch = json_array_get(json_object_get(cc, "choices"), 0);
    json_t *nt = json_object_get(json_object_get(ch, "message"), "content");
    *elen = json_is_string(nt) ? json_string_length(nt) : 0;
    *edited = malloc(*elen + 1);
    if (*edited) {
        memcpy(*edited, json_is_string(nt) ? json_string_value(nt) : "", *elen);
        (*edited)[*elen] = '\0';
    }
    json_decref(cc);
    return *edited ? 0 : -1;
}

/* The tree path's answer with the texts edited: the answer parsed, each
 * string text in order (k) set to ed[k] when there is one, written again. */
static int gw_frb_write(const char *data, size_t len, char **ed, const size_t *el, size_t nv,
                        char **out, size_t *outlen)
{
    json_t *body = json_loadb(data, len, 0, NULL);
    if (!body)
        return 1;
    size_t i, k, at = 0;
    json_t *item, *part;
    json_array_foreach(json_object_get(body, "output"), i,
                       item){json_array_foreach(json_object_get(item, "content"), k, part){
        if (!json_is_string(json_object_get(part, "text"))) continue;
    if (at < nv && ed[at])
        json_object_set_new(part, "text", json_stringn(ed[at], el[at]));
    at++;
}
}
*out = json_dumps(body, JSON_COMPACT);
*outlen = *out ? strlen(*out) : 0;
json_decref(body);
return *out ? 0 : -1;
}

int gw_flt_resp_body_bytes(flt_ruleset_t *rs, const char *data, size_t len, char **out,
                           size_t *outlen)
{
    *out = NULL;
    *outlen = 0;
    /* Most answers hold no candidate in any string: every text the reader
     * below (or the tree path) would feed to the chat filter is clean, so
     * nothing changes and the answer goes as it came, whatever its form
     * (the chat answer's first check too: filters/answer.c). */
    if (flt_answer_bytes_clean(rs, data, len))
        return 0;
    if (memmem(data, len, "\\u", 2))
        return 1;
    gw_frb_t p;
    memset(&p, 0, offsetof(gw_frb_t, v0));
    p.data = data;
    p.n = len;
    p.v = p.v0;
    p.nv = 0;
    p.cap = GW_FRB_TEXTS;
    p.h = sl_ykeep_take(&gw_frb_keep, &gw_frb_cb, true);
    if (!p.h)
        return -1;
    gw_frb_keep.cur = &p;
    yajl_status s = yajl_parse(p.h, (const unsigned char *)data, len);
    gw_frb_keep.cur = NULL;
    bool whole = s == yajl_status_ok && p.closed; /* and blanks after it only */
    for (size_t i = whole ? p.close_end : len; i < len; i++)
        if (data[i] != ' ' && data[i] != '\t' && data[i] != '\n' && data[i] != '\r')
            whole = false;
    sl_ykeep_put(&gw_frb_keep, p.h, whole);
    int rc = whole && !p.odd ? 0 : 1;
    char **ed = NULL;
    size_t *el = NULL;
    bool edited = false;
    if (rc == 0 && p.nv) {
        ed = calloc(p.nv, sizeof(*ed));
        el = calloc(p.nv, sizeof(*el));
        rc = ed && el ? 0 : -1;
    }
    for (size_t i = 0; rc == 0 && i < p.nv; i++) {
        rc = gw_frb_text(rs, data + p.v[i].s, p.v[i].e - p.v[i].s, &ed[i], &el[i]);
        edited |= ed[i] != NULL;
    }
    if (rc == 0 && edited)
        rc = gw_frb_write(data, len, ed, el, p.nv, out, outlen);
    for (size_t i = 0; ed && i < p.nv; i++)
        free(ed[i]);
    free(ed);
    free(el);
    if (p.v != p.v0)
        free(p.v);
    return rc;
}
