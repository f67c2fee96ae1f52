/*
 * h2.c — HTTP/2 client connections: nghttp2 does the framing, HPACK, flow
 * control and the protocol checks; this file maps streams to requests.
 *
 * Every stream becomes one request on its own stream connection
 * (gw_conn_t, conn.c, gw_conn_new_stream) that has no socket: the stream's
 * decoded header fields are loaded into its request parser
 * (gw_http_load_*: the same limits and checks as an HTTP/1.1 head, no text
 * in between) and its DATA into the request body, so the request meets
 * exactly the limits, deadlines, routes, hooks, proxy, fallback, access log
 * and metrics of an HTTP/1.1 request. Its answer comes out through the
 * connection's output interface (gw_out_ops_t), implemented here: the head
 * becomes HEADERS submitted to nghttp2 at once, the body goes into the
 * stream's buffer, which nghttp2's data source reads as DATA frames as the
 * windows allow (one SSE event is flushed in the loop turn it was written).
 *
 * Backpressure: the stream's buffer is what the relay sees as the client's
 * pending output (sse.buffer_bytes pauses the upstream, half of it resumes
 * it, gw_conn_out_drained). The connection's socket output is capped
 * (GW_H2_OUT_HWM): frames are produced only as the socket drains, and
 * nghttp2 picks which stream's DATA goes next, so the connection window is
 * shared between streams.
 *
 * Nothing here runs the nghttp2 session from inside one of its own
 * callbacks: callbacks only record, and gw_h2_flush() runs once the
 * callback-raising call has returned (or from the flush event).
 */
#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>

#include "common/log.h"
#include "conf/conf.h"
#include "gateway/gw_conn.h"
#include "gateway/gw_h2.h"
#include "gateway/gw_h2_mem.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_req.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_types.h"
#include "gateway/http1.h"

/* Frames queued on the socket, at most, before nghttp2 is asked for more. */
#define GW_H2_OUT_HWM (64 * 1024)
/* Longest :method / :path / :authority kept. */
#define GW_H2_PSEUDO_MAX 8192
/* Response header fields of one head, at most (the rest are dropped). */
#define GW_H2_NV_MAX 128
/* The concurrent-stream limit nghttp2 itself is given: one it never
 * reaches, so that streams over ours are refused here (gw_h2_send_settings
 * says why). */
#define GW_H2_NG_STREAMS (1u << 30)
/* Streams refused in a row (none accepted in between) before the client
 * counts as flooding: GOAWAY ENHANCE_YOUR_CALM. */
#define GW_H2_REFUSED_RUN_MAX 200
/* Frames that cost us work and do nothing for the client, as token
 * buckets per connection (burst, refill a second): PRIORITY frames
 * (CVE-2019-9513, the priority tree churned) and DATA frames without a
 * byte of data nor END_STREAM (CVE-2019-9518, empty frames). nghttp2 has
 * no limit of its own for either. */
#define GW_H2_PRIORITY_BURST 200
#define GW_H2_PRIORITY_RATE  50
#define GW_H2_EMPTY_BURST    100
#define GW_H2_EMPTY_RATE     10

typedef struct gw_h2_bucket {
    double tokens;
    int64_t ms; /* last refill, 0 = full and never used */
} gw_h2_bucket_t;

typedef struct gw_h2_stream {
    gw_h2_t *h;
    int32_t id;
    gw_conn_t *sc; /* the stream's request connection; NULL once closed */
    char *method, *path, *authority;
    size_t hdr_bytes;               /* decoded header list size, RFC 9113 6.5.2's way */
    bool too_large;                 /* over http2.max_header_list: answered 431 */
    bool bad;                       /* a header we cannot carry: answered 400 */
    bool head_req;                  /* HEAD: the answer has no body */
    int status;                     /* the answer's, from head_begin */
    struct evbuffer *out;           /* answer body bytes not yet in DATA frames */
    size_t watch_low;               /* tell the request when out falls to this (0: off) */
    bool submitted;                 /* the response HEADERS are queued */
    bool no_body;                   /* ... with END_STREAM: body bytes are dropped */
    bool resp_done;                 /* the answer is complete (END_STREAM when out is empty) */
    bool aborted;                   /* the answer was cut: RST_STREAM, not END_STREAM */
    bool deferred;                  /* the data source said DEFERRED: resume on more */
    bool closed;                    /* nghttp2 closed it */
    bool cut;                       /* reset for the send timeout */
    int64_t progress_ms;            /* out last drained or started filling (send timeout) */
    TAILQ_ENTRY(gw_h2_stream) link; /* h->streams, then h->dead */
    /* :method, :path and :authority when they fit (else malloc'd): last,
     * not cleared when the struct is reused */
    size_t pseudo_used;
    char pseudo[256];
} gw_h2_stream_t;

struct gw_h2 {
    gw_conn_t *c;
    gw_worker_t *w; /* the connection's (for gw_conn_new_stream) */
    nghttp2_session *sess;
    TAILQ_HEAD(, gw_h2_stream) streams;
    TAILQ_HEAD(, gw_h2_stream) dead; /* closed by nghttp2, freed once its call returned */
    gw_h2_stream_t *spare_s;         /* a dead stream's struct and buffer, for the next */
    size_t nstreams;
    struct event *idle_ev;  /* no open stream for http2.idle_timeout: GOAWAY */
    int64_t idle_ms;        /* when the last open stream closed (or the start) */
    struct event *wd_ev;    /* send timeout per stream, armed while one has output */
    struct event *flush_ev; /* frames out once the current callbacks are done */
    gw_conn_t *spare_sc;    /* a finished stream's request connection, for the next */
    int in_cb;              /* inside a call that raises nghttp2 callbacks */
    bool closing;           /* GOAWAY sent or fatal: close once output is out */
    bool calm_ours;         /* the ENHANCE_YOUR_CALM GOAWAY is ours, counted already */
    bool drained;           /* a watched stream's output fell to its mark */
    /* rapid reset: a token bucket of client resets (CVE-2023-44487) */
    gw_h2_bucket_t resets, priority, empty;
    unsigned refused_run; /* streams refused since the last one accepted */
    int64_t max_streams;  /* http2.max_concurrent_streams, counted here */
    int64_t max_header_list;
};

static void gw_h2_flush(gw_h2_t *h);
static void gw_h2_watch(gw_h2_t *h);

static void gw_h2_count(const char *event)
{
    sl_counter_add(sl_metric_series1(gw_m.h2_events, event), 1);
}

/* Frames out soon: at the end of the current nghttp2 call, or from the
 * flush event once the current callbacks (an upstream read) are done, so
 * the answers of one loop turn leave in one write. */
static void gw_h2_kick(gw_h2_t *h)
{
    if (!h->in_cb && h->flush_ev && !h->c->closed)
        event_active(h->flush_ev, EV_TIMEOUT, 0);
}

/* ---- the answer: the output interface -> HEADERS + DATA ------------------- */

static ssize_t gw_h2_data_read(nghttp2_session *sess, int32_t id, uint8_t *buf, size_t len,
                               uint32_t *flags, nghttp2_data_source *src, void *ud)
{
    (void)sess;
    (void)id;
    gw_h2_t *h = ud;
    gw_h2_stream_t *s = src->ptr;
    int n = evbuffer_remove(s->out, buf, len);
    if (n < 0)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    if (n > 0)
        s->progress_ms = sl_now_ms();
    size_t left = evbuffer_get_length(s->out);
    if (left == 0 && s->resp_done)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    else if (n == 0) {
        s->deferred = true;
        return NGHTTP2_ERR_DEFERRED;
    }
    if (s->watch_low && left <= s->watch_low)
        h->drained = true; /* told after the session call returns (gw_h2_flush) */
    return n;
}

static void gw_h2_resume(gw_h2_stream_t *s)
{
    if (s->submitted && s->deferred && !s->closed) {
        s->deferred = false;
        nghttp2_session_resume_data(s->h->sess, s->id);
    }
}

static void gw_h2_out_head_begin(gw_conn_t *c, gw_req_t *r, int status, gw_sb_t *b)
{
    (void)r;
    (void)b; /* the status goes in :status, not in b */
    gw_h2_stream_t *s = c->out_arg;
    s->status = status >= 100 && status < 1000 ? status : 502;
}

/* RFC 9113 8.2.2: never in an h2 message (content-length: ours, from the
 * answer's length). */
#define GW_H2_HN_DROP                                                                              \
    (GW_HN_BIT(GW_HN_CONNECTION) | GW_HN_BIT(GW_HN_KEEP_ALIVE) |                                   \
     GW_HN_BIT(GW_HN_PROXY_CONNECTION) | GW_HN_BIT(GW_HN_TRANSFER_ENCODING) |                      \
     GW_HN_BIT(GW_HN_UPGRADE) | GW_HN_BIT(GW_HN_TE) | GW_HN_BIT(GW_HN_CONTENT_LENGTH))

/* HPACK: which answer fields may enter the connection's dynamic table. A
 * value that changes with every answer (x-request-id, content-length, an
 * upstream's x-ratelimit-remaining...) only evicts useful entries, and
 * nghttp2's deflater keeps entries of one name in one hash chain, so a
 * table full of request ids made every lookup walk ~70 of them: 14% of
 * the proxy's CPU with 32 connections. Fields whose values repeat are
 * indexed; everything else goes as a literal that is never indexed (as
 * nginx sends all of its answer fields). id: gw_http_hn's for the name,
 * so only names it does not know are compared here. */
static uint8_t gw_h2_index_flag(gw_http_hn_t id, const char *n, size_t len)
{
    switch (id) {
    case GW_HN_CONTENT_TYPE:
    case GW_HN_CACHE_CONTROL:
    case GW_HN_SERVER:
        return NGHTTP2_NV_FLAG_NONE;
    case GW_HN_OTHER:
        break;
    default:
        return NGHTTP2_NV_FLAG_NO_INDEX;
    }
    bool stable = (len == 4 && memcmp(n, "vary", 4) == 0) ||
                  (len == 14 && (memcmp(n, "x-sluice-route", 14) == 0 ||
                                 memcmp(n, "x-sluice-cache", 14) == 0)) ||
                  (len == 17 && memcmp(n, "x-sluice-fallback", 17) == 0);
    return stable ? NGHTTP2_NV_FLAG_NONE : NGHTTP2_NV_FLAG_NO_INDEX;
}

/* The head's lines ("Name: value\r\n", made by sluice itself, so well
 * formed) become the HEADERS' fields: names lower-cased as RFC 9113 8.2.1
 * wants, connection-specific ones dropped, content-length from length. */
static size_t gw_h2_out_head_end(gw_conn_t *c, gw_req_t *r, gw_sb_t *b, int64_t length)
{
    gw_h2_stream_t *s = c->out_arg;
    gw_h2_t *h = s->h;
    if (s->closed || s->submitted) {
        gw_sb_reset(b);
        return 0;
    }
    size_t len = b->oom ? 0 : b->n;
    char *p = len ? b->p : NULL, *end = p + len;
    nghttp2_nv nv[GW_H2_NV_MAX];
    char status[8], cl[24];
    (void)r;
    status[0] = (char)('0' + s->status / 100 % 10); /* 100..999 (head_begin) */
    status[1] = (char)('0' + s->status / 10 % 10);
    status[2] = (char)('0' + s->status % 10);
    size_t n = 0, bytes = 0;
    nv[n++] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)status, 7, 3, NGHTTP2_NV_FLAG_NONE};
    while (p && p < end && n < GW_H2_NV_MAX - 2) {
        char *eol = memchr(p, '\n', (size_t)(end - p));
        char *line_end = eol ? eol : end;
        char *colon = memchr(p, ':', (size_t)(line_end - p));
        if (colon && colon > p) {
            char *v = colon + 1, *ve = line_end;
            while (v < ve && (*v == ' ' || *v == '\t'))
                v++;
            while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t'))
                ve--;
            for (char *k = p; k < colon; k++)
                *k = (char)tolower((unsigned char)*k);
            size_t nl = (size_t)(colon - p);
            gw_http_hn_t id = gw_http_hn(p, nl);
            if (!(GW_HN_BIT(id) & GW_H2_HN_DROP)) {
                nv[n++] = (nghttp2_nv){(uint8_t *)p, (uint8_t *)v, nl, (size_t)(ve - v),
                                       gw_h2_index_flag(id, p, nl)};
                bytes += nl + (size_t)(ve - v) + 4;
            }
        }
        p = line_end + 1;
    }
    if (length >= 0) {
        char *e = cl + sizeof(cl), *d = e;
        uint64_t v = (uint64_t)length;
        do
            *--d = (char)('0' + v % 10);
        while ((v /= 10) != 0);
        nv[n++] = (nghttp2_nv){(uint8_t *)"content-length", (uint8_t *)d, 14, (size_t)(e - d),
                               NGHTTP2_NV_FLAG_NO_INDEX};
    }
    size_t dl;
    const char *date = gw_date_header(&dl); /* "Date: ...\r\n" */
    if (dl > 8 && n < GW_H2_NV_MAX)
        nv[n++] =
            (nghttp2_nv){(uint8_t *)"date", (uint8_t *)date + 6, 4, dl - 8, NGHTTP2_NV_FLAG_NONE};
    s->no_body = length == -2 || s->head_req;
    nghttp2_data_provider dp = {.source.ptr = s, .read_callback = gw_h2_data_read};
    int rv = nghttp2_submit_response(h->sess, s->id, nv, n, s->no_body ? NULL : &dp);
    gw_sb_reset(b); /* nghttp2 copied the fields */
    if (rv != 0) {
        s->aborted = true;
        nghttp2_submit_rst_stream(h->sess, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR);
    } else {
        s->submitted = true;
    }
    s->progress_ms = sl_now_ms();
    gw_h2_kick(h);
    return bytes + 13;
}

static size_t gw_h2_out_data(gw_conn_t *c, gw_req_t *r, const void *p, size_t n)
{
    (void)r;
    gw_h2_stream_t *s = c->out_arg;
    if (s->closed || s->no_body || s->aborted || n == 0)
        return 0;
    if (evbuffer_get_length(s->out) == 0)
        s->progress_ms = sl_now_ms(); /* the send timeout runs from the first byte waiting */
    if (evbuffer_add(s->out, p, n) != 0)
        return 0;
    gw_h2_resume(s);
    gw_h2_watch(s->h);
    gw_h2_kick(s->h);
    return n;
}

static size_t gw_h2_out_end(gw_conn_t *c, gw_req_t *r)
{
    (void)c;
    (void)r;
    return 0; /* END_STREAM goes with the request's end (gw_h2_sc_closed) */
}

static void gw_h2_out_abort(gw_conn_t *c)
{
    gw_h2_stream_t *s = c->out_arg;
    s->aborted = true;
}

static size_t gw_h2_out_pending(const gw_conn_t *c)
{
    const gw_h2_stream_t *s = c->out_arg;
    return evbuffer_get_length(s->out);
}

static void gw_h2_out_watch(gw_conn_t *c, size_t low)
{
    gw_h2_stream_t *s = c->out_arg;
    s->watch_low = low;
}

static const gw_out_ops_t gw_h2_out = {
    .head_begin = gw_h2_out_head_begin,
    .head_end = gw_h2_out_head_end,
    .data = gw_h2_out_data,
    .end = gw_h2_out_end,
    .abort = gw_h2_out_abort,
    .pending = gw_h2_out_pending,
    .watch = gw_h2_out_watch,
};

/* A local answer of this layer (the stream never became a request). */
static void gw_h2_answer_error(gw_h2_stream_t *s, int status, const char *code, const char *msg)
{
    size_t len = 0;
    char *body = gw_error_json("invalid_request_error", code, msg, &len);
    if (body)
        evbuffer_add(s->out, body, len);
    free(body);
    char st[8], cl[24];
    snprintf(st, sizeof(st), "%03d", status);
    snprintf(cl, sizeof(cl), "%zu", len);
    nghttp2_nv nv[] = {
        {(uint8_t *)":status", (uint8_t *)st, 7, 3, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"content-type", (uint8_t *)"application/json", 12, 16, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"content-length", (uint8_t *)cl, 14, strlen(cl), NGHTTP2_NV_FLAG_NONE},
    };
    s->resp_done = true;
    nghttp2_data_provider dp = {.source.ptr = s, .read_callback = gw_h2_data_read};
    if (nghttp2_submit_response(s->h->sess, s->id, nv, SL_ARRAY_LEN(nv), &dp) == 0)
        s->submitted = true;
    else
        nghttp2_submit_rst_stream(s->h->sess, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR);
}

/* The stream connection is done: its request finished (from
 * gw_conn_req_done: sc still open, its request gone), or it is closing
 * (the answer cut, or it failed before answering). */
static void gw_h2_sc_closed(void *arg)
{
    gw_h2_stream_t *s = arg;
    gw_h2_t *h = s->h;
    gw_conn_t *sc = s->sc;
    s->sc = NULL;
    bool whole = sc && !sc->closed && !sc->req && !s->aborted;
    if (sc && !sc->closed) { /* kept for the connection's next stream */
        sc->out_arg = NULL;
        if (h->spare_sc || h->c->closed)
            gw_conn_close(sc);
        else
            h->spare_sc = sc;
    }
    if (s->closed || s->resp_done)
        return;
    s->resp_done = true;
    if (!whole) {
        if (s->submitted) /* a truncated answer: the client must not take it as whole */
            nghttp2_submit_rst_stream(h->sess, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR);
        else
            gw_h2_answer_error(s, 502, "bad_gateway", "the request ended without an answer");
    } else if (!s->submitted) {
        gw_h2_answer_error(s, 502, "bad_gateway", "the request ended without an answer");
    }
    gw_h2_resume(s);
    gw_h2_kick(h);
}

/* ---- the request: HEADERS + DATA -> the stream's request ---------------- */

static void gw_h2_pseudo_free(gw_h2_stream_t *s, char *p)
{
    if (p < s->pseudo || p >= s->pseudo + sizeof(s->pseudo))
        free(p);
}

static void gw_h2_stream_free(void *arg)
{
    gw_h2_stream_t *s = arg;
    if (s->out)
        evbuffer_free(s->out);
    gw_h2_pseudo_free(s, s->method);
    gw_h2_pseudo_free(s, s->path);
    gw_h2_pseudo_free(s, s->authority);
    free(s);
}

/* Streams nghttp2 closed, once the call that closed them has returned
 * (nothing on the stack holds them): one struct with its output buffer is
 * kept for the connection's next stream, the rest freed. */
static void gw_h2_reap(gw_h2_t *h)
{
    gw_h2_stream_t *s;
    while ((s = TAILQ_FIRST(&h->dead))) {
        TAILQ_REMOVE(&h->dead, s, link);
        if (h->spare_s || h->c->closed || !s->out) {
            gw_h2_stream_free(s);
            continue;
        }
        gw_h2_pseudo_free(s, s->method);
        gw_h2_pseudo_free(s, s->path);
        gw_h2_pseudo_free(s, s->authority);
        s->method = s->path = s->authority = NULL;
        s->pseudo_used = 0;
        evbuffer_drain(s->out, evbuffer_get_length(s->out));
        h->spare_s = s;
    }
}

/* Closes s's request connection (cancelling its upstream), if any. */
static void gw_h2_stream_drop_sc(gw_h2_stream_t *s)
{
    if (s->sc) {
        gw_conn_t *sc = s->sc;
        s->sc = NULL;
        sc->on_close = NULL;
        gw_conn_close(sc);
    }
}

/* Unlinks s, closes its request connection and frees it at the next safe
 * point: after the nghttp2 call that closed it (gw_h2_reap), or the
 * worker's deferred frees when the connection goes (reap). */
static void gw_h2_stream_close(gw_h2_stream_t *s, bool reap)
{
    gw_h2_t *h = s->h;
    s->closed = true;
    gw_h2_stream_drop_sc(s);
    TAILQ_REMOVE(&h->streams, s, link);
    h->nstreams--;
    if (reap)
        gw_conn_defer_free(h->c, gw_h2_stream_free, s);
    else
        TAILQ_INSERT_TAIL(&h->dead, s, link);
    if (h->nstreams == 0)
        h->idle_ms = sl_now_ms(); /* the idle timer finds it (gw_h2_idle_cb) */
}

static gw_h2_stream_t *gw_h2_stream_new(gw_h2_t *h, int32_t id)
{
    gw_h2_stream_t *s = h->spare_s;
    if (s) { /* cleared but for its (empty) buffer and the pseudo arena */
        struct evbuffer *out = s->out;
        h->spare_s = NULL;
        memset(s, 0, offsetof(gw_h2_stream_t, pseudo_used));
        s->out = out;
    } else {
        s = calloc(1, sizeof(*s));
        if (!s)
            return NULL;
        s->out = evbuffer_new();
    }
    s->h = h;
    s->id = id;
    if (s->out && h->spare_sc) {
        s->sc = gw_conn_stream_reuse(h->spare_sc, s);
        h->spare_sc = NULL;
    } else if (s->out) {
        s->sc = gw_conn_new_stream(h->w, &gw_h2_out, s, h->c->peer, h->c->tls);
    }
    if (!s->sc) {
        gw_h2_stream_free(s);
        return NULL;
    }
    s->sc->on_close = gw_h2_sc_closed;
    s->sc->on_close_arg = s;
    TAILQ_INSERT_TAIL(&h->streams, s, link);
    h->nstreams++;
    return s;
}

/* The header block is complete: the stream becomes a request. */
static void gw_h2_stream_start(gw_h2_stream_t *s, bool end_stream)
{
    if (!s->sc)
        return;
    gw_conn_t *sc = s->sc;
    gw_h2_count("streams");
    /* A head h2 itself finds malformed is answered by the request like a
     * malformed HTTP/1.1 head (431/400, access log, parse-error metric). */
    gw_http_state_t st;
    if (s->too_large) {
        gw_h2_count("headers_too_large");
        st = gw_http_load_fail(sc->parser, 431, "header_list_too_large");
    } else if (s->bad || !s->method || !s->path) {
        st = gw_http_load_fail(sc->parser, 400, "bad_pseudo_header");
    } else {
        s->head_req = strcmp(s->method, "HEAD") == 0;
        st = gw_http_load_head(sc->parser, s->method, s->path, s->authority, !end_stream);
    }
    gw_conn_stream_fed(sc, st, 0);
}

static void gw_h2_stream_body_end(gw_h2_stream_t *s)
{
    if (s->sc)
        gw_conn_stream_body(s->sc, NULL, 0, true);
}

static void gw_h2_calm(gw_h2_t *h, const char *event, const char *why);

static int gw_h2_on_begin_headers(nghttp2_session *sess, const nghttp2_frame *f, void *ud)
{
    gw_h2_t *h = ud;
    if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    /* Over SETTINGS_MAX_CONCURRENT_STREAMS, before or after the client
     * acknowledged it: REFUSED_STREAM (RFC 9113 5.1.2), which a client may
     * retry, and its other streams go on. The stream has no user data, so
     * its headers and DATA are ignored; nghttp2 closes it once the RST is
     * out. */
    if ((int64_t)h->nstreams >= h->max_streams) {
        nghttp2_submit_rst_stream(sess, NGHTTP2_FLAG_NONE, f->hd.stream_id, NGHTTP2_REFUSED_STREAM);
        gw_h2_count("refused_stream");
        if (++h->refused_run > GW_H2_REFUSED_RUN_MAX)
            gw_h2_calm(h, "refused_flood", "opens streams over the limit without pause");
        return 0;
    }
    h->refused_run = 0;
    gw_h2_stream_t *s = gw_h2_stream_new(h, f->hd.stream_id);
    if (!s)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    nghttp2_session_set_stream_user_data(sess, f->hd.stream_id, s);
    return 0;
}

static char *gw_h2_dup(gw_h2_stream_t *s, const uint8_t *v, size_t n)
{
    if (n < sizeof(s->pseudo) - s->pseudo_used) {
        char *p = s->pseudo + s->pseudo_used;
        memcpy(p, v, n);
        p[n] = '\0';
        s->pseudo_used += n + 1;
        return p;
    }
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, v, n);
        p[n] = '\0';
    }
    return p;
}

static int gw_h2_on_header(nghttp2_session *sess, const nghttp2_frame *f, const uint8_t *name,
                           size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                           void *ud)
{
    (void)flags;
    gw_h2_t *h = ud;
    if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0; /* trailers: not forwarded */
    gw_h2_stream_t *s = nghttp2_session_get_stream_user_data(sess, f->hd.stream_id);
    if (!s)
        return 0;
    /* RFC 9113 6.5.2: name + value + 32 per field. Past the cap the rest is
     * decoded (HPACK state must stay in step) but not kept. */
    s->hdr_bytes += namelen + valuelen + 32;
    if (s->hdr_bytes > (size_t)h->max_header_list)
        s->too_large = true;
    if (s->too_large || s->bad || !s->sc)
        return 0;
    if (name[0] == ':') {
        char **slot = NULL;
        if (namelen == 7 && memcmp(name, ":method", 7) == 0)
            slot = &s->method;
        else if (namelen == 5 && memcmp(name, ":path", 5) == 0)
            slot = &s->path;
        else if (namelen == 10 && memcmp(name, ":authority", 10) == 0)
            slot = &s->authority;
        if (slot && valuelen < GW_H2_PSEUDO_MAX && !*slot) {
            *slot = gw_h2_dup(s, value, valuelen);
            if (!*slot)
                return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        }
        return 0;
    }
    /* Host comes from :authority when there is one (RFC 9113 8.3.1); TE
     * (only "trailers" is allowed in h2) and Expect are hop by hop here. */
    if ((namelen == 4 && memcmp(name, "host", 4) == 0)) {
        if (!s->authority) {
            s->authority = gw_h2_dup(s, value, valuelen);
            if (!s->authority)
                return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        }
        return 0;
    }
    if ((namelen == 2 && memcmp(name, "te", 2) == 0) ||
        (namelen == 6 && memcmp(name, "expect", 6) == 0))
        return 0;
    /* Straight into the request's parser: its limits (header_lines,
     * header_bytes: 431) and checks apply; an error is answered once the
     * block is complete. */
    (void)gw_http_load_header(s->sc->parser, (const char *)name, namelen, (const char *)value,
                              valuelen);
    return 0;
}

static int gw_h2_on_data(nghttp2_session *sess, uint8_t flags, int32_t id, const uint8_t *data,
                         size_t len, void *ud)
{
    (void)flags;
    (void)ud;
    gw_h2_stream_t *s = nghttp2_session_get_stream_user_data(sess, id);
    if (!s || !s->sc || len == 0)
        return 0; /* answered already (431, 413, ...): the rest is dropped */
    gw_conn_stream_body(s->sc, (const char *)data, len, false);
    return 0;
}

/* Takes a token from b (burst, refilled rate a second); false when empty. */
static bool gw_h2_bucket_take(gw_h2_bucket_t *b, double burst, double rate)
{
    int64_t now = sl_now_ms();
    if (b->ms == 0) {
        b->tokens = burst;
        b->ms = now;
    }
    b->tokens += (double)(now - b->ms) * rate / 1000.0;
    if (b->tokens > burst)
        b->tokens = burst;
    b->ms = now;
    if (b->tokens < 1.0)
        return false;
    b->tokens -= 1.0;
    return true;
}

/* A client abusing the protocol: GOAWAY ENHANCE_YOUR_CALM, counted once. */
static void gw_h2_calm(gw_h2_t *h, const char *event, const char *why)
{
    if (h->closing)
        return;
    gw_h2_count(event);
    sl_log_limited(SL_LOG_WARN, "h2_calm", "h2: %s %s: GOAWAY ENHANCE_YOUR_CALM", h->c->peer, why);
    h->calm_ours = true;
    nghttp2_session_terminate_session(h->sess, NGHTTP2_ENHANCE_YOUR_CALM);
    h->closing = true;
}

static int gw_h2_on_frame_recv(nghttp2_session *sess, const nghttp2_frame *f, void *ud)
{
    gw_h2_t *h = ud;
    switch (f->hd.type) {
    case NGHTTP2_HEADERS: {
        gw_h2_stream_t *s = nghttp2_session_get_stream_user_data(sess, f->hd.stream_id);
        if (!s)
            return 0;
        bool end = (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
        if (f->headers.cat == NGHTTP2_HCAT_REQUEST)
            gw_h2_stream_start(s, end);
        else if (end)
            gw_h2_stream_body_end(s);
        return 0;
    }
    case NGHTTP2_DATA:
        if (f->hd.flags & NGHTTP2_FLAG_END_STREAM) {
            gw_h2_stream_t *s = nghttp2_session_get_stream_user_data(sess, f->hd.stream_id);
            if (s)
                gw_h2_stream_body_end(s);
        } else if (f->hd.length <= f->data.padlen &&
                   !gw_h2_bucket_take(&h->empty, GW_H2_EMPTY_BURST, GW_H2_EMPTY_RATE)) {
            gw_h2_calm(h, "empty_data_flood", "sends empty DATA frames");
        }
        return 0;
    case NGHTTP2_PRIORITY:
        if (!gw_h2_bucket_take(&h->priority, GW_H2_PRIORITY_BURST, GW_H2_PRIORITY_RATE))
            gw_h2_calm(h, "priority_flood", "sends PRIORITY frames too fast");
        return 0;
    case NGHTTP2_RST_STREAM: {
        gw_h2_count("rst_recv");
        const conf_http2_t *c = &gw_conn_conf(h->c)->http2;
        if (!gw_h2_bucket_take(&h->resets, (double)c->reset_burst, (double)c->reset_rate))
            gw_h2_calm(h, "rapid_reset", "resets streams too fast");
        return 0;
    }
    default:
        return 0;
    }
}

static int gw_h2_on_frame_send(nghttp2_session *sess, const nghttp2_frame *f, void *ud)
{
    (void)sess;
    gw_h2_t *h = ud;
    if (f->hd.type == NGHTTP2_GOAWAY && f->goaway.error_code == NGHTTP2_PROTOCOL_ERROR)
        gw_h2_count("protocol_error");
    else if (f->hd.type == NGHTTP2_GOAWAY && f->goaway.error_code == NGHTTP2_ENHANCE_YOUR_CALM &&
             !h->calm_ours) /* nghttp2's own limits: queued ACKs, SETTINGS entries */
        gw_h2_count("flood");
    return 0;
}

static int gw_h2_on_stream_close(nghttp2_session *sess, int32_t id, uint32_t code, void *ud)
{
    (void)code;
    (void)ud;
    gw_h2_stream_t *s = nghttp2_session_get_stream_user_data(sess, id);
    if (!s)
        return 0;
    nghttp2_session_set_stream_user_data(sess, id, NULL);
    if (s->sc && s->sc->req && !s->sc->req->error_kind && code != NGHTTP2_NO_ERROR)
        s->sc->req->error_kind = "client_reset";
    gw_h2_stream_close(s, false);
    return 0;
}

/* ---- the connection ----------------------------------------------------- */

/* Frames of one gw_h2_flush on their way to the socket's buffer. */
static _Thread_local uint8_t gw_h2_gather[4096];

/* The session's frames out to the socket, while there is room. */
static void gw_h2_flush(gw_h2_t *h)
{
    if (h->in_cb || h->c->closed)
        return;
    struct evbuffer *out = bufferevent_get_output(h->c->bev);
    size_t queued = evbuffer_get_length(out), held = 0;
    const size_t queued0 = queued;
    h->in_cb++;
    /* nghttp2 hands out one frame (or part) per call, in its own buffer:
     * the small ones are gathered in the thread's scratch and go to the
     * socket's buffer in one add (one run of its callbacks), an answer's
     * HEADERS and DATA together; a large one goes straight in. */
    while (queued + held < GW_H2_OUT_HWM && nghttp2_session_want_write(h->sess)) {
        const uint8_t *data;
        ssize_t n = nghttp2_session_mem_send(h->sess, &data);
        if (n < 0) {
            h->closing = true;
            break;
        }
        if (n == 0)
            break;
        sl_counter_add(gw_m.bytes_client_out, (uint64_t)n);
        if (held + (size_t)n > sizeof(gw_h2_gather)) {
            evbuffer_add(out, gw_h2_gather, held);
            queued += held;
            held = 0;
        }
        if ((size_t)n > sizeof(gw_h2_gather) / 2) {
            evbuffer_add(out, data, (size_t)n);
            queued += (size_t)n;
            continue;
        }
        memcpy(gw_h2_gather + held, data, (size_t)n);
        held += (size_t)n;
    }
    if (held)
        evbuffer_add(out, gw_h2_gather, held);
    if (queued + held > queued0)
        gw_wio_added(&h->c->wio);
    h->in_cb--;
    if (h->drained) { /* backpressure off for streams whose output fell to the mark */
        h->drained = false;
        gw_h2_stream_t *s, *next;
        for (s = TAILQ_FIRST(&h->streams); s; s = next) {
            next = TAILQ_NEXT(s, link);
            if (s->watch_low && s->sc && evbuffer_get_length(s->out) <= s->watch_low) {
                s->watch_low = 0;
                gw_conn_out_drained(s->sc);
            }
        }
    }
    gw_h2_reap(h); /* every stream nghttp2 closed in this call or before */
    if (!nghttp2_session_want_read(h->sess) && !nghttp2_session_want_write(h->sess))
        h->closing = true;
    if (h->closing) {
        bufferevent_disable(h->c->bev, EV_READ);
        if (evbuffer_get_length(out) == 0)
            gw_conn_close(h->c);
    }
}

void gw_h2_read(gw_h2_t *h)
{
    struct evbuffer *in = bufferevent_get_input(h->c->bev);
    if (h->closing) { /* nghttp2 takes no more: nothing may pile up (no read mark) */
        evbuffer_drain(in, evbuffer_get_length(in));
        return;
    }
    h->in_cb++;
    while (evbuffer_get_length(in) > 0 && !h->closing) {
        size_t n = evbuffer_get_contiguous_space(in);
        ssize_t rv = nghttp2_session_mem_recv(h->sess, evbuffer_pullup(in, (ssize_t)n), n);
        if (rv < 0) {
            const char *ev = rv == NGHTTP2_ERR_FLOODED                  ? "flood"
                             : rv == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS ? "continuation_flood"
                             : rv == NGHTTP2_ERR_BAD_CLIENT_MAGIC       ? "bad_preface"
                                                                        : "protocol_error";
            gw_h2_count(ev);
            h->calm_ours = true;
            sl_log_limited(SL_LOG_WARN, "h2_fatal", "h2: %s: %s: closing", h->c->peer,
                           nghttp2_strerror((int)rv));
            nghttp2_session_terminate_session(h->sess, rv == NGHTTP2_ERR_BAD_CLIENT_MAGIC
                                                           ? NGHTTP2_PROTOCOL_ERROR
                                                           : NGHTTP2_ENHANCE_YOUR_CALM);
            h->closing = true;
            evbuffer_drain(in, evbuffer_get_length(in));
            break;
        }
        sl_counter_add(gw_m.bytes_client_in, (uint64_t)rv);
        evbuffer_drain(in, (size_t)rv);
    }
    h->in_cb--;
    /* Closing: the GOAWAY still goes out, so flush ignores closing here. */
    bool closing = h->closing;
    h->closing = false;
    gw_h2_flush(h);
    if (closing && !h->c->closed) { /* h outlives a close until the reap */
        h->closing = true;
        bufferevent_disable(h->c->bev, EV_READ);
        if (evbuffer_get_length(bufferevent_get_output(h->c->bev)) == 0)
            gw_conn_close(h->c);
    }
}

void gw_h2_written(gw_h2_t *h)
{
    if (h->closing) {
        if (evbuffer_get_length(bufferevent_get_output(h->c->bev)) == 0)
            gw_conn_close(h->c);
        return;
    }
    gw_h2_flush(h);
}

void gw_h2_drain(gw_h2_t *h)
{
    if (h->closing)
        return;
    /* The last stream the client opened finishes; nothing newer starts. */
    nghttp2_submit_goaway(h->sess, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(h->sess), NGHTTP2_NO_ERROR, NULL,
                          0);
    gw_h2_count("goaway_drain");
    gw_h2_flush(h);
}

/* The zero-window stall: a stream whose answer has waited for the client's
 * window longer than limits.send_timeout is reset (its upstream request
 * cancelled), as an HTTP/1.1 client that stops reading is disconnected;
 * the other streams go on. A client that grants no connection window
 * stalls every stream, and so loses them all. */
static void gw_h2_wd_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_h2_t *h = arg;
    if (h->c->closed || !h->sess)
        return;
    int64_t now = sl_now_ms(), limit = gw_conn_conf(h->c)->limits.send_timeout_ms;
    bool waiting = false;
    gw_h2_stream_t *s;
    TAILQ_FOREACH(s, &h->streams, link)
    {
        if (s->closed || s->cut || evbuffer_get_length(s->out) == 0)
            continue;
        if (now - s->progress_ms < limit) {
            waiting = true;
            continue;
        }
        s->cut = true;
        if (s->sc && s->sc->req && !s->sc->req->error_kind)
            s->sc->req->error_kind = "client_send_timeout";
        gw_h2_count("send_timeout");
        nghttp2_submit_rst_stream(h->sess, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_CANCEL);
    }
    if (waiting)
        gw_h2_watch(h);
    gw_h2_flush(h);
}

static void gw_h2_watch(gw_h2_t *h)
{
    if (!h->wd_ev || evtimer_pending(h->wd_ev, NULL))
        return;
    int64_t ms = gw_conn_conf(h->c)->limits.send_timeout_ms / 4;
    if (ms < 50)
        ms = 50;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(h->wd_ev, &tv);
}

/* The idle timer stays armed for the connection's life and is not moved
 * per stream (an evtimer_del and _add a request at one stream at a time):
 * when it fires it looks at when the last stream closed and waits again
 * for what is left of http2.idle_timeout, or all of it while a stream is
 * open. */
static void gw_h2_idle_arm(gw_h2_t *h, int64_t ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(h->idle_ev, &tv);
}

static void gw_h2_idle_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_h2_t *h = arg;
    if (h->c->closed)
        return;
    int64_t limit = gw_conn_conf(h->c)->http2.idle_timeout_ms;
    int64_t left = h->nstreams > 0 ? limit : h->idle_ms + limit - sl_now_ms();
    if (left > 0) {
        gw_h2_idle_arm(h, left);
        return;
    }
    nghttp2_session_terminate_session(h->sess, NGHTTP2_NO_ERROR);
    gw_h2_flush(h);
}

static void gw_h2_flush_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_h2_flush(arg);
}

void gw_h2_free(gw_h2_t *h)
{
    if (!h)
        return;
    gw_h2_stream_t *s;
    while ((s = TAILQ_FIRST(&h->streams)))
        gw_h2_stream_close(s, true);
    while ((s = TAILQ_FIRST(&h->dead))) { /* the caller's stack may hold them */
        TAILQ_REMOVE(&h->dead, s, link);
        gw_conn_defer_free(h->c, gw_h2_stream_free, s);
    }
    if (h->spare_s)
        gw_h2_stream_free(h->spare_s);
    h->spare_s = NULL;
    if (h->spare_sc) {
        gw_conn_close(h->spare_sc);
        h->spare_sc = NULL;
    }
    if (h->flush_ev)
        event_free(h->flush_ev);
    h->flush_ev = NULL;
    if (h->idle_ev)
        event_free(h->idle_ev);
    h->idle_ev = NULL;
    if (h->wd_ev)
        event_free(h->wd_ev);
    h->wd_ev = NULL;
    nghttp2_session_del(h->sess);
    h->sess = NULL;
    /* The caller's stack may still hold h (gw_h2_read -> flush -> close):
     * it goes at the next safe point, with its connection. */
    gw_conn_defer_free(h->c, free, h);
}

/* Our first SETTINGS frame out, telling the client our stream limit.
 * nghttp2 treats a stream over its acknowledged local limit as a
 * connection error (GOAWAY PROTOCOL_ERROR, every other stream lost); RFC
 * 9113 5.1.2 allows REFUSED_STREAM instead, and that is what a client that
 * raced the limit can recover from. So nghttp2 is given a limit it never
 * reaches (GW_H2_NG_STREAMS) and counts nothing, the client is told ours
 * (the value replaced in the frame nghttp2 serialised, before it leaves),
 * and gw_h2_on_begin_headers refuses what is over it. */
static int gw_h2_send_settings(gw_h2_t *h, gw_conn_t *c, uint32_t streams)
{
    const uint8_t *data;
    ssize_t n = nghttp2_session_mem_send(h->sess, &data);
    uint8_t buf[128];
    if (n < 9 || (size_t)n > sizeof(buf) || data[3] != NGHTTP2_SETTINGS ||
        ((size_t)data[0] << 16 | (size_t)data[1] << 8 | data[2]) + 9 != (size_t)n)
        return -1; /* not the one SETTINGS frame nghttp2 always sends first */
    memcpy(buf, data, (size_t)n);
    for (size_t off = 9; off + 6 <= (size_t)n; off += 6) {
        if (buf[off] == 0 && buf[off + 1] == NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS) {
            buf[off + 2] = (uint8_t)(streams >> 24);
            buf[off + 3] = (uint8_t)(streams >> 16);
            buf[off + 4] = (uint8_t)(streams >> 8);
            buf[off + 5] = (uint8_t)streams;
        }
    }
    sl_counter_add(gw_m.bytes_client_out, (uint64_t)n);
    if (evbuffer_add(bufferevent_get_output(c->bev), buf, (size_t)n) != 0)
        return -1;
    gw_wio_added(&c->wio);
    return 0;
}

int gw_h2_start(gw_conn_t *c)
{
    gw_h2_t *h = calloc(1, sizeof(*h));
    if (!h)
        return -1;
    const conf_http2_t *hc = &gw_conn_conf(c)->http2;
    h->c = c;
    h->w = c->w;
    h->max_header_list = hc->max_header_list;
    h->max_streams = hc->max_concurrent_streams;
    TAILQ_INIT(&h->streams);
    TAILQ_INIT(&h->dead);
    nghttp2_session_callbacks *cb = NULL;
    nghttp2_option *opt = NULL;
    if (nghttp2_session_callbacks_new(&cb) != 0 || nghttp2_option_new(&opt) != 0)
        goto fail;
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, gw_h2_on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, gw_h2_on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, gw_h2_on_data);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, gw_h2_on_frame_recv);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, gw_h2_on_frame_send);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, gw_h2_on_stream_close);
    /* nghttp2's own guards: queued SETTINGS/PING ACKs and RST_STREAMs a
     * client can make us owe (floods), SETTINGS entries, CONTINUATION frames
     * per header block (CVE-2024-27316), and its reset limiter set above
     * ours, as a backstop (ours counts and answers first). */
    nghttp2_option_set_max_outbound_ack(opt, 1000);
    nghttp2_option_set_max_settings(opt, 32);
    nghttp2_option_set_max_continuations(opt, 8);
    nghttp2_option_set_stream_reset_rate_limit(opt, (uint64_t)hc->reset_burst * 2,
                                               (uint64_t)hc->reset_rate * 2);
    nghttp2_option_set_max_send_header_block_length(opt, 64 * 1024);
    /* nghttp2 keeps closed streams for the RFC 7540 priority tree until
     * open + closed ones exceed the local stream limit, which it is given
     * as GW_H2_NG_STREAMS (gw_h2_send_settings): without this every stream
     * of a connection stayed allocated until the connection closed (~400
     * bytes a request, 8 MB after 20,000 requests on one connection). A
     * priority that names a closed stream falls back to the default. */
    nghttp2_option_set_no_closed_streams(opt, 1);
    /* the worker's free lists (h2_mem.c); NULL: nghttp2's malloc */
    if (nghttp2_session_server_new3(&h->sess, cb, h, opt, gw_h2_mem_get(gw_conn_h2_mem(c))) != 0)
        goto fail;
    nghttp2_session_callbacks_del(cb);
    nghttp2_option_del(opt);
    cb = NULL;
    opt = NULL;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, GW_H2_NG_STREAMS},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, (uint32_t)hc->initial_window},
        {NGHTTP2_SETTINGS_MAX_FRAME_SIZE, (uint32_t)hc->max_frame},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)hc->max_header_list},
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
    };
    if (nghttp2_submit_settings(h->sess, NGHTTP2_FLAG_NONE, iv, SL_ARRAY_LEN(iv)) != 0 ||
        gw_h2_send_settings(h, c, (uint32_t)hc->max_concurrent_streams) != 0)
        goto fail;
    h->idle_ev = evtimer_new(gw_conn_base(c), gw_h2_idle_cb, h);
    h->wd_ev = evtimer_new(gw_conn_base(c), gw_h2_wd_cb, h);
    h->flush_ev = event_new(gw_conn_base(c), -1, 0, gw_h2_flush_cb, h);
    if (!h->idle_ev || !h->wd_ev || !h->flush_ev)
        goto fail;
    h->idle_ms = sl_now_ms();
    gw_h2_idle_arm(h, hc->idle_timeout_ms);
    c->h2 = h;
    gw_h2_count("conns");
    bufferevent_setwatermark(c->bev, EV_WRITE, GW_H2_OUT_HWM / 2, 0);
    /* No read high-watermark: gw_h2_read hands nghttp2 all of the input
     * in the callback that read it (or drains it when closing, and reading
     * stops), so the input holds at most one wake-up's read (wio.c: one
     * read(2), or what OpenSSL decrypted from one). With the mark set,
     * libevent re-enabled the read event on every add to and drain of the
     * input (bufferevent_inbuf_wm_cb -> bufferevent_unsuspend_read_ ->
     * event_add): two per request. */
    bufferevent_setwatermark(c->bev, EV_READ, 0, 0);
    gw_h2_read(h);
    return 0;
fail:
    nghttp2_session_callbacks_del(cb);
    nghttp2_option_del(opt);
    if (h->idle_ev)
        event_free(h->idle_ev);
    if (h->wd_ev)
        event_free(h->wd_ev);
    if (h->flush_ev)
        event_free(h->flush_ev);
    if (h->sess)
        nghttp2_session_del(h->sess);
    free(h);
    return -1;
}
