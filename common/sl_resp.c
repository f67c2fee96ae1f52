/*
 * sl_resp.c — one Responses API event read with yajl's callbacks
 * (sl_resp.h). Only the members accounting needs are followed: the top
 * level's `type`, `delta` and `response`, the response's `usage`, the
 * usage's three counts. Without SL_RESP_TEXT no string callback is set, so
 * yajl decodes none of the strings (response.completed repeats the whole
 * answer text); yajl's blocks come from a buffer on the stack.
 */
#include "common/sl_resp.h"

#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "common/jshape.h"
#include "common/yheap.h"

enum {
    SL_RK_OTHER = 0,
    SL_RK_TYPE,     /* top level */
    SL_RK_DELTA,    /* top level */
    SL_RK_RESPONSE, /* top level */
    SL_RK_USAGE,    /* in the response */
    SL_RK_IN,       /* in the usage */
    SL_RK_OUT,
    SL_RK_TOTAL,
};

typedef struct sl_rparse {
    sl_resp_ev_t *out;
    int depth;              /* containers open: 1 in the event, 2 in its response, 3 in the usage */
    int key;                /* SL_RK_*: the member whose value comes next */
    bool in_resp, in_usage; /* the container open at depth 2 / 3 is the response / usage */
    bool delta_type;        /* type names a *.delta event other than audio's */
    bool got_delta;         /* a string delta was counted */
    bool bad;               /* a negative count */
    sl_resp_ev_t u;         /* the usage object being read */
    size_t end;             /* bytes read when the usage closed (the read's stop) */
    int nusage;             /* response.usage objects opened */
    struct sl_rrec *rec;    /* a shape's learning pass (below), or NULL */
    yajl_handle h;          /* for the recorder: yajl_get_bytes_consumed */
} sl_rparse_t;

static void sl_rrec_int(sl_rparse_t *p, int key);
static void sl_rrec_str(sl_rparse_t *p);

#define SL_R_IS(k, n, lit) ((n) == sizeof(lit) - 1 && memcmp((k), (lit), sizeof(lit) - 1) == 0)

static int sl_r_key(void *ctx, const unsigned char *k, size_t n)
{
    sl_rparse_t *p = ctx;
    p->key = SL_RK_OTHER;
    if (p->depth == 1) {
        p->key = SL_R_IS(k, n, "type")       ? SL_RK_TYPE
                 : SL_R_IS(k, n, "delta")    ? SL_RK_DELTA
                 : SL_R_IS(k, n, "response") ? SL_RK_RESPONSE
                                             : SL_RK_OTHER;
    } else if (p->depth == 2 && p->in_resp) {
        if (SL_R_IS(k, n, "usage"))
            p->key = SL_RK_USAGE;
    } else if (p->depth == 3 && p->in_usage) {
        p->key = SL_R_IS(k, n, "input_tokens")    ? SL_RK_IN
                 : SL_R_IS(k, n, "output_tokens") ? SL_RK_OUT
                 : SL_R_IS(k, n, "total_tokens")  ? SL_RK_TOTAL
                                                  : SL_RK_OTHER;
    }
    return 1;
}

static int sl_r_scalar(void *ctx)
{
    ((sl_rparse_t *)ctx)->key = SL_RK_OTHER;
    return 1;
}

static int sl_r_bool(void *ctx, int v)
{
    (void)v;
    return sl_r_scalar(ctx);
}

static int sl_r_double(void *ctx, double v)
{
    (void)v;
    return sl_r_scalar(ctx);
}

static int sl_r_integer(void *ctx, long long v)
{
    sl_rparse_t *p = ctx;
    int key = p->key;
    p->key = SL_RK_OTHER;
    if (p->rec)
        sl_rrec_int(p, p->in_usage ? key : SL_RK_OTHER);
    if (key < SL_RK_IN)
        return 1;
    if (v < 0)
        p->bad = true;
    if (key == SL_RK_IN) {
        p->u.have_in = true;
        p->u.in = v;
    } else if (key == SL_RK_OUT) {
        p->u.have_out = true;
        p->u.out = v;
    } else {
        p->u.have_total = true;
        p->u.total = v;
    }
    return 1;
}

static int sl_r_string(void *ctx, const unsigned char *s, size_t n)
{
    sl_rparse_t *p = ctx;
    int key = p->key;
    p->key = SL_RK_OTHER;
    if (p->rec)
        sl_rrec_str(p);
    if (key == SL_RK_TYPE) {
        p->delta_type =
            n >= 6 && memcmp(s + n - 6, ".delta", 6) == 0 && !SL_R_IS(s, n, "response.audio.delta");
    } else if (key == SL_RK_DELTA) {
        /* the last delta member counts, as a tree would keep it */
        int64_t ascii = 0, other = 0;
        sl_text_chars((const char *)s, n, &ascii, &other);
        p->got_delta = true;
        p->out->ascii = ascii;
        p->out->other = other;
    }
    return 1;
}

static int sl_r_open_map(void *ctx)
{
    sl_rparse_t *p = ctx;
    if (p->depth == 1 && p->key == SL_RK_RESPONSE) {
        p->in_resp = true;
    } else if (p->depth == 2 && p->in_resp && p->key == SL_RK_USAGE) {
        p->in_usage = true;
        p->nusage++;
        memset(&p->u, 0, sizeof(p->u));
        p->bad = false;
    }
    p->depth++;
    p->key = SL_RK_OTHER;
    return 1;
}

static int sl_r_open_array(void *ctx)
{
    sl_rparse_t *p = ctx;
    p->depth++;
    p->key = SL_RK_OTHER;
    return 1;
}

static int sl_r_close(void *ctx)
{
    sl_rparse_t *p = ctx;
    int d = p->depth--;
    p->key = SL_RK_OTHER;
    if (d == 3 && p->in_usage) {
        p->in_usage = false;
        if (!p->bad) {
            p->out->usage = true;
            p->out->have_in = p->u.have_in;
            p->out->have_out = p->u.have_out;
            p->out->have_total = p->u.have_total;
            p->out->in = p->u.in;
            p->out->out = p->u.out;
            p->out->total = p->u.total;
            p->end = p->h ? yajl_get_bytes_consumed(p->h) : 0;
            return 0; /* read: the rest of the event is not needed */
        }
    } else if (d == 2) {
        p->in_resp = false;
    }
    return 1;
}

/* Without a string callback: yajl decodes no string. */
static const yajl_callbacks sl_r_usage_cbs = {
    .yajl_null = sl_r_scalar,
    .yajl_boolean = sl_r_bool,
    .yajl_integer = sl_r_integer,
    .yajl_double = sl_r_double,
    .yajl_start_map = sl_r_open_map,
    .yajl_map_key = sl_r_key,
    .yajl_end_map = sl_r_close,
    .yajl_start_array = sl_r_open_array,
    .yajl_end_array = sl_r_close,
};

static const yajl_callbacks sl_r_text_cbs = {
    .yajl_null = sl_r_scalar,
    .yajl_boolean = sl_r_bool,
    .yajl_integer = sl_r_integer,
    .yajl_double = sl_r_double,
    .yajl_string = sl_r_string,
    .yajl_start_map = sl_r_open_map,
    .yajl_map_key = sl_r_key,
    .yajl_end_map = sl_r_close,
    .yajl_start_array = sl_r_open_array,
    .yajl_end_array = sl_r_close,
};

/* sl_resp_event_read with the parse's state kept in *p (its end: where
 * the usage closed), cbs the callbacks; rec, when set, records the shape. */
static int sl_resp_read(const char *data, size_t len, unsigned what, sl_resp_ev_t *out,
                        const yajl_callbacks *cbs, sl_rparse_t *p)
{
    memset(out, 0, sizeof(*out));
    p->out = out;
    sl_yheap_t heap;
    yajl_alloc_funcs af = sl_yheap_funcs(&heap);
    yajl_handle h = yajl_alloc(cbs, &af, p);
    if (!h)
        return -1;
    p->h = h;
    yajl_status st = yajl_parse(h, (const unsigned char *)data, len);
    if (st == yajl_status_ok)
        st = yajl_complete_parse(h);
    yajl_free(h);
    p->h = NULL;
    if (st == yajl_status_client_canceled) /* at the usage's end */
        st = yajl_status_ok;
    if (st != yajl_status_ok) {
        memset(out, 0, sizeof(*out));
        return -1;
    }
    out->delta = p->got_delta && p->delta_type;
    if (!out->delta)
        out->ascii = out->other = 0;
    if (!(what & SL_RESP_USAGE) && out->usage) {
        out->usage = out->have_in = out->have_out = out->have_total = false;
        out->in = out->out = out->total = 0;
    }
    return 0;
}

int sl_resp_event_read(const char *data, size_t len, unsigned what, sl_resp_ev_t *out)
{
    sl_rparse_t p = {0};
    return sl_resp_read(data, len, what, out,
                        (what & SL_RESP_TEXT) ? &sl_r_text_cbs : &sl_r_usage_cbs, &p);
}

/* ---- the usage event by its kept shape --------------------------------------
 *
 * One server writes its usage event (response.completed) in one form: the
 * same members in the same order, only its strings' and integers' values
 * changing. After the read above took a usage from one, the bytes it read
 * (up to the usage's closing '}', where it stopped) are kept as a shape
 * whose holes are every string and integer value there (common/jshape.h).
 * An event that begins with that shape is lexed by yajl token for token as
 * the kept one was (jshape.h: the same keys and structure, a value of the
 * hole's kind in each hole), so the read would reach the same usage object,
 * whose counts are then its holes' values. What jshape leaves to its
 * caller, or what would make the read go another way, the read decides:
 * a hole whose bytes >= 0x80 are not UTF-8 by yajl's own rule, and a
 * negative count (the read goes on past such a usage). */

#define SL_RS_SETS 8 /* counts a kept usage has at most (duplicates included) */

typedef struct sl_rshape {
    uint8_t nset;              /* the usage's counts, in the order the read set them */
    uint8_t hole[SL_RS_SETS];  /* the hole holding each */
    uint8_t field[SL_RS_SETS]; /* SL_RK_IN, _OUT, _TOTAL */
} sl_rshape_t;

typedef struct sl_rrec {
    const char *data;
    size_t nh;
    bool bad; /* beyond the bounds: not kept */
    sl_jspan_t hole[SL_JSHAPE_MAX_HOLES];
    uint8_t kind[SL_JSHAPE_MAX_HOLES];
    sl_rshape_t d;
} sl_rrec_t;

static _Thread_local sl_jshape_cache_t sl_rshapes =
    SL_JSHAPE_CACHE_INIT(2, 4, 16, sizeof(sl_rshape_t), NULL);

static void sl_rrec_hole(sl_rrec_t *r, size_t off, size_t len, uint8_t kind)
{
    if (r->nh == SL_JSHAPE_MAX_HOLES) {
        r->bad = true;
        return;
    }
    r->hole[r->nh] = (sl_jspan_t){(uint32_t)off, (uint32_t)len};
    r->kind[r->nh++] = kind;
}

/* An integer just read (yajl stops right after its last digit): a hole
 * when it fits one; key: the usage's count it is, or SL_RK_OTHER. */
static void sl_rrec_int(sl_rparse_t *p, int key)
{
    sl_rrec_t *r = p->rec;
    size_t e = yajl_get_bytes_consumed(p->h), b = e;
    while (b > 0 && ((r->data[b - 1] >= '0' && r->data[b - 1] <= '9') || r->data[b - 1] == '-'))
        b--;
    size_t digits = e - b - (r->data[b] == '-');
    if (digits > SL_JSHAPE_INT_DIGITS) {
        if (key >= SL_RK_IN)
            r->bad = true; /* a count the shape could not hold */
        return;            /* else kept as the shape's own bytes */
    }
    if (key >= SL_RK_IN) {
        if (r->d.nset == SL_RS_SETS || r->nh >= 255) {
            r->bad = true;
            return;
        }
        r->d.hole[r->d.nset] = (uint8_t)r->nh;
        r->d.field[r->d.nset++] = (uint8_t)key;
    }
    sl_rrec_hole(r, b, e - b, SL_JHOLE_INT);
}

/* A string value just read (yajl stops after its closing quote): its
 * interior is a hole. Its opening quote is the last quote before that
 * which no odd run of backslashes escapes. */
static void sl_rrec_str(sl_rparse_t *p)
{
    sl_rrec_t *r = p->rec;
    size_t e = yajl_get_bytes_consumed(p->h) - 1, b = e; /* at the closing quote */
    for (;;) {
        while (b > 0 && r->data[--b] != '"')
            ;
        size_t k = b;
        while (k > 0 && r->data[k - 1] == '\\')
            k--;
        if ((b - k) % 2 == 0)
            break;
    }
    sl_rrec_hole(r, b + 1, e - b - 1, SL_JHOLE_JSTR);
}

/* The usage event's callbacks with a string callback: the learning pass. */
static int sl_rrec_string_cb(void *ctx, const unsigned char *s, size_t n)
{
    (void)s, (void)n;
    sl_rparse_t *p = ctx;
    p->key = SL_RK_OTHER;
    sl_rrec_str(p);
    return 1;
}

static const yajl_callbacks sl_rrec_cbs = {
    .yajl_null = sl_r_scalar,
    .yajl_boolean = sl_r_bool,
    .yajl_integer = sl_r_integer,
    .yajl_double = sl_r_double,
    .yajl_string = sl_rrec_string_cb,
    .yajl_start_map = sl_r_open_map,
    .yajl_map_key = sl_r_key,
    .yajl_end_map = sl_r_close,
    .yajl_start_array = sl_r_open_array,
    .yajl_end_array = sl_r_close,
};

/* data[0..end) read to a usage (its end): kept as a shape when the gate
 * says so and the same read, recording, stops there again. */
static void sl_rshape_learn(const char *data, size_t end)
{
    sl_jshape_cache_t *c = &sl_rshapes;
    /* a prefix no shape can hold (a long answer's repeated text) neither
     * asks the gate nor takes a slot: the shapes kept stay */
    if (end > SL_JSHAPE_MAX_BYTES || !sl_jshape_cache_gate(c))
        return;
    sl_rrec_t *r = calloc(1, sizeof(*r));
    if (!r)
        return;
    r->data = data;
    sl_resp_ev_t e;
    sl_rparse_t p = {.rec = r};
    /* one usage opened (a first one with a negative count is passed over by
     * the read: a shape of it could stand for the wrong one) */
    if (sl_resp_read(data, end, SL_RESP_USAGE, &e, &sl_rrec_cbs, &p) == 0 && e.usage &&
        p.end == end && p.nusage == 1 && !r->bad) {
        int i = sl_jshape_cache_take(c);
        if (i >= 0) {
            *(sl_rshape_t *)c->slot[i].data = r->d;
            if (sl_jshape_cache_set(c, (unsigned)i, data, end, r->hole, r->kind, r->nh) != 0)
                r->bad = true; /* the slot stays empty: it matches nothing */
        }
    }
    free(r);
}

/* s[0..n) is UTF-8 by yajl's check (a lead byte, then as many bytes
 * 10xxxxxx as it says; no overlong or surrogate test). */
static bool sl_resp_yajl_utf8(const unsigned char *s, size_t n)
{
    size_t i = sl_ascii_end(s, 0, n);
    while (i < n) {
        unsigned char c = s[i++];
        size_t more = c < 0x80           ? 0
                      : (c >> 5) == 0x6  ? 1
                      : (c >> 4) == 0xe  ? 2
                      : (c >> 3) == 0x1e ? 3
                                         : 4;
        if (more == 4 || n - i < more)
            return false;
        for (; more; more--)
            if ((s[i++] >> 6) != 0x2)
                return false;
    }
    return true;
}

/* true: data begins with a kept shape; *out what the read would give. */
static bool sl_rshape_find(const char *data, size_t len, sl_resp_ev_t *out)
{
    sl_jshape_cache_t *c = &sl_rshapes;
    sl_jspan_t got[SL_JSHAPE_MAX_HOLES];
    size_t used;
    for (unsigned i = 0; i < c->nslots; i++) {
        const sl_jshape_slot_t *sl = &c->slot[i];
        if (sl_jshape_empty(&sl->sh) || !sl_jshape_match_prefix(&sl->sh, data, len, got, &used))
            continue;
        bool ok = true;
        for (size_t k = 0; ok && k < sl->sh.nholes; k++)
            if (sl->sh.kind[k] != SL_JHOLE_INT)
                ok = sl_resp_yajl_utf8((const unsigned char *)data + got[k].off, got[k].len);
        const sl_rshape_t *d = sl->data;
        memset(out, 0, sizeof(*out));
        for (size_t k = 0; ok && k < d->nset; k++) {
            const sl_jspan_t *h = &got[d->hole[k]];
            int64_t v = sl_jshape_int(data + h->off, h->len);
            ok = v >= 0;
            if (d->field[k] == SL_RK_IN)
                out->have_in = true, out->in = v;
            else if (d->field[k] == SL_RK_OUT)
                out->have_out = true, out->out = v;
            else
                out->have_total = true, out->total = v;
        }
        if (!ok)
            continue;
        out->usage = true;
        sl_jshape_cache_hit(c, i);
        return true;
    }
    sl_jshape_cache_miss(c);
    return false;
}

int sl_resp_usage_read(const char *data, size_t len, sl_resp_ev_t *out)
{
    if (sl_rshape_find(data, len, out))
        return 0;
    sl_rparse_t p = {0};
    int rc = sl_resp_read(data, len, SL_RESP_USAGE, out, &sl_r_usage_cbs, &p);
    if (rc == 0 && out->usage)
        sl_rshape_learn(data, p.end);
    return rc;
}

void sl_resp_shapes_clear(void)
{
    sl_jshape_cache_clear(&sl_rshapes);
}

uint64_t sl_resp_shape_hits(void)
{
    return sl_rshapes.st.hits;
}

int64_t sl_resp_usage_total(const sl_resp_ev_t *e)
{
    if (!e->usage || (!e->have_total && !e->have_in && !e->have_out))
        return -1;
    if (e->have_total)
        return e->total;
    return (e->have_in ? e->in : 0) + (e->have_out ? e->out : 0);
}
