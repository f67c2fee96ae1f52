/*
 * sl_resp.c — one Responses API event read with yajl's callbacks
 * (sl_resp.h). Only the members accounting needs are followed: the top
 * level's `type`, `delta` and `response`, the response's `usage`, the
 * usage's three counts. Without SL_RESP_TEXT no string callback is set, so
 * yajl decodes none of the strings (response.completed repeats the whole
 * answer text); yajl's blocks come from a buffer on the stack.
 */
#include "common/sl_resp.h"

#include <string.h>

#include <yajl/yajl_parse.h>

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
} sl_rparse_t;

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
    if (key == SL_RK_TYPE) {
        p->delta_type =
            n >= 6 && memcmp(s + n - 6, ".delta", 6) == 0 && !SL_R_IS(s, n, "response.audio.delta");
    } else if (key == SL_RK_DELTA) {
        /* the last delta member counts, as a tree would keep it */
        int64_t ascii = 0, other = 0;
        for (size_t i = 0; i < n; i++) {
            if (s[i] < 0x80)
                ascii++;
            else if ((s[i] & 0xc0) != 0x80)
                other++;
        }
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

int sl_resp_event_read(const char *data, size_t len, unsigned what, sl_resp_ev_t *out)
{
    memset(out, 0, sizeof(*out));
    sl_rparse_t p = {.out = out};
    sl_yheap_t heap;
    yajl_alloc_funcs af = sl_yheap_funcs(&heap);
    yajl_handle h = yajl_alloc((what & SL_RESP_TEXT) ? &sl_r_text_cbs : &sl_r_usage_cbs, &af, &p);
    if (!h)
        return -1;
    yajl_status st = yajl_parse(h, (const unsigned char *)data, len);
    if (st == yajl_status_ok)
        st = yajl_complete_parse(h);
    yajl_free(h);
    if (st == yajl_status_client_canceled) /* at the usage's end */
        st = yajl_status_ok;
    if (st != yajl_status_ok) {
        memset(out, 0, sizeof(*out));
        return -1;
    }
    out->delta = p.got_delta && p.delta_type;
    if (!out->delta)
        out->ascii = out->other = 0;
    if (!(what & SL_RESP_USAGE) && out->usage) {
        out->usage = out->have_in = out->have_out = out->have_total = false;
        out->in = out->out = out->total = 0;
    }
    return 0;
}

int64_t sl_resp_usage_total(const sl_resp_ev_t *e)
{
    if (!e->usage || (!e->have_total && !e->have_in && !e->have_out))
        return -1;
    if (e->have_total)
        return e->total;
    return (e->have_in ? e->in : 0) + (e->have_out ? e->out : 0);
}
