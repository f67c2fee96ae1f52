/*
 * h2.c — HTTP/2 client connections: nghttp2 does the framing, HPACK, flow
 * control and the protocol checks; this file maps streams to requests.
 *
 * Every stream becomes one request on its own stream connection
 * (gw_conn_t, conn.c) fed through a bufferevent pair: the stream's headers
 * are written to it as an HTTP/1.1 head (never raw bytes: names and values
 * nghttp2 has already validated) and its DATA as the body, so the request
 * meets exactly the limits, deadlines, routes, hooks, proxy, fallback,
 * access log and metrics of an HTTP/1.1 request. The stream connection's
 * answer comes back on the pair, is framed by the HTTP/1.1 response adapter
 * and leaves as HEADERS and one DATA frame per write (so an SSE event is
 * flushed the moment the relay writes it).
 *
 * Backpressure: a stream's pending output is capped (GW_H2_STREAM_HWM);
 * above it the pair is not read, the stream connection's output grows and
 * the relay pauses its upstream, exactly as for a slow HTTP/1.1 client. The
 * connection's socket output is capped the same way (GW_H2_OUT_HWM): frames
 * are produced only as the socket drains, and nghttp2 picks which stream's
 * DATA goes next, so the connection window is shared between streams.
 *
 * Nothing here runs the nghttp2 session from inside one of its own
 * callbacks: callbacks only record, and gw_h2_flush() runs once the
 * callback-raising call has returned.
 */
#include <ctype.h>
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
#include "gateway/gw_metrics.h"
#include "gateway/gw_req.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_types.h"
#include "gateway/http1.h"

/* A stream's answer waiting for its window, at most (then the pair is not
 * read and the relay's own backpressure takes over). */
#define GW_H2_STREAM_HWM (64 * 1024)
/* Frames queued on the socket, at most, before nghttp2 is asked for more. */
#define GW_H2_OUT_HWM (64 * 1024)
/* Longest :method / :path / :authority kept. */
#define GW_H2_PSEUDO_MAX 8192

typedef struct gw_h2_stream {
    gw_h2_t *h;
    int32_t id;
    gw_conn_t *sc;           /* the stream's request connection; NULL once closed */
    struct bufferevent *bev; /* our end of the pair (the other is sc's) */
    struct evbuffer *hdrs;   /* regular header lines, as HTTP/1.1 */
    char *method, *path, *authority;
    size_t hdr_bytes; /* decoded header list size, RFC 9113 6.5.2's way */
    bool too_large;   /* over http2.max_header_list: answered 431 */
    bool bad;         /* a header we cannot carry: answered 400 */
    bool has_cl;      /* the client sent content-length */
    bool chunked;     /* the body goes to sc as chunks */
    bool started;     /* the head went to sc */
    bool head_req;    /* HEAD: the answer has no body */
    gw_http_parser_t *resp;
    struct evbuffer *out; /* answer body bytes not yet in DATA frames */
    bool submitted;       /* the response HEADERS are queued */
    bool resp_done;       /* the answer is complete (END_STREAM when out is empty) */
    bool deferred;        /* the data source said DEFERRED: resume on more */
    bool paused;          /* the pair is not read (out above GW_H2_STREAM_HWM) */
    bool closed;          /* nghttp2 closed it */
    bool cut;             /* reset for the send timeout */
    int64_t progress_ms;  /* out last drained or started filling (send timeout) */
    TAILQ_ENTRY(gw_h2_stream) link;
} gw_h2_stream_t;

struct gw_h2 {
    gw_conn_t *c;
    gw_worker_t *w; /* the connection's (for gw_conn_new_bev) */
    nghttp2_session *sess;
    TAILQ_HEAD(, gw_h2_stream) streams;
    size_t nstreams;
    struct event *idle_ev; /* no open stream for http2.idle_timeout: GOAWAY */
    struct event *wd_ev;   /* send timeout per stream, armed while one has output */
    int in_cb;             /* inside a call that raises nghttp2 callbacks */
    bool closing;          /* GOAWAY sent or fatal: close once output is out */
    bool calm_ours;        /* the ENHANCE_YOUR_CALM GOAWAY is ours, counted already */
    /* rapid reset: a token bucket of client resets (CVE-2023-44487) */
    double reset_tokens;
    int64_t reset_ms;
    int64_t max_header_list;
};

static void gw_h2_flush(gw_h2_t *h);
static void gw_h2_stream_read(gw_h2_stream_t *s);
static void gw_h2_watch(gw_h2_t *h);

static void gw_h2_count(const char *event)
{
    sl_counter_add(sl_metric_series1(gw_m.h2_events, event), 1);
}

/* ---- the answer: pair -> HEADERS + DATA ----------------------------------- */

static ssize_t gw_h2_data_read(nghttp2_session *sess, int32_t id, uint8_t *buf, size_t len,
                               uint32_t *flags, nghttp2_data_source *src, void *ud)
{
    (void)sess;
    (void)id;
    (void)ud;
    gw_h2_stream_t *s = src->ptr;
    int n = evbuffer_remove(s->out, buf, len);
    if (n < 0)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    if (n > 0)
        s->progress_ms = sl_now_ms();
    if (evbuffer_get_length(s->out) == 0 && s->resp_done)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    else if (n == 0) {
        s->deferred = true;
        return NGHTTP2_ERR_DEFERRED;
    }
    if (s->paused && evbuffer_get_length(s->out) < GW_H2_STREAM_HWM / 2 && s->bev) {
        s->paused = false;
        bufferevent_enable(s->bev, EV_READ);
    }
    return n;
}

/* Submits the answer's head: the HTTP/1.1 head's status and headers, hop
 * by hop ones dropped, names lower-cased as RFC 9113 8.2.1 wants. */
static int gw_h2_submit_head(gw_h2_stream_t *s, const gw_http_msg_t *m)
{
    size_t total = 4;
    for (size_t i = 0; i < m->nheaders; i++)
        total += m->headers[i].name_len + 1;
    nghttp2_nv *nv = calloc(m->nheaders + 1, sizeof(*nv));
    char *names = malloc(total);
    if (!nv || !names) {
        free(nv);
        free(names);
        return -1;
    }
    char status[8];
    snprintf(status, sizeof(status), "%03d",
             m->status >= 100 && m->status < 1000 ? m->status : 502);
    size_t n = 0, off = 0;
    nv[n++] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)status, 7, 3, NGHTTP2_NV_FLAG_NONE};
    for (size_t i = 0; i < m->nheaders; i++) {
        const gw_http_header_t *hd = &m->headers[i];
        if (gw_http_header_is_hop(m, hd->name, hd->name_len))
            continue;
        char *lc = names + off;
        for (size_t k = 0; k < hd->name_len; k++)
            lc[k] = (char)tolower((unsigned char)hd->name[k]);
        off += hd->name_len;
        nv[n++] = (nghttp2_nv){(uint8_t *)lc, (uint8_t *)hd->value, hd->name_len, hd->value_len,
                               NGHTTP2_NV_FLAG_NONE};
    }
    nghttp2_data_provider dp = {.source.ptr = s, .read_callback = gw_h2_data_read};
    int rv = nghttp2_submit_response(s->h->sess, s->id, nv, n, &dp);
    free(nv);
    free(names);
    if (rv != 0)
        return -1;
    s->submitted = true;
    return 0;
}

static int gw_h2_resp_body(void *arg, const char *p, size_t n)
{
    gw_h2_stream_t *s = arg;
    return evbuffer_add(s->out, p, n);
}

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

static void gw_h2_stream_read(gw_h2_stream_t *s)
{
    if (s->closed || !s->bev)
        return;
    struct evbuffer *in = bufferevent_get_input(s->bev);
    if (evbuffer_get_length(s->out) == 0)
        s->progress_ms = sl_now_ms(); /* the send timeout runs from the first byte waiting */
    while (!s->resp_done) {
        gw_http_state_t st = gw_http_feed_evbuffer(s->resp, in, NULL, gw_h2_resp_body, s);
        if (st == GW_HTTP_HEAD) {
            if (!s->submitted && gw_h2_submit_head(s, gw_http_msg(s->resp)) < 0) {
                nghttp2_submit_rst_stream(s->h->sess, NGHTTP2_FLAG_NONE, s->id,
                                          NGHTTP2_INTERNAL_ERROR);
                s->resp_done = true;
            }
            continue;
        }
        if (st == GW_HTTP_DONE) {
            s->resp_done = true;
            break;
        }
        if (st == GW_HTTP_ERROR) {
            nghttp2_submit_rst_stream(s->h->sess, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR);
            s->resp_done = true;
        }
        break; /* NEED_MORE */
    }
    if (s->resp_done)
        evbuffer_drain(in, evbuffer_get_length(in));
    if (!s->paused && evbuffer_get_length(s->out) >= GW_H2_STREAM_HWM) {
        s->paused = true;
        bufferevent_disable(s->bev, EV_READ);
    }
    if (s->submitted && s->deferred) {
        s->deferred = false;
        nghttp2_session_resume_data(s->h->sess, s->id);
    }
    if (evbuffer_get_length(s->out) > 0)
        gw_h2_watch(s->h);
}

static void gw_h2_pair_readcb(struct bufferevent *bev, void *arg)
{
    (void)bev;
    gw_h2_stream_t *s = arg;
    gw_h2_stream_read(s);
    gw_h2_flush(s->h);
}

static void gw_h2_pair_eventcb(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    (void)what;
    (void)arg; /* the stream connection's end is reported by gw_h2_sc_closed */
}

/* The stream connection closed (its answer is out, or it failed). */
static void gw_h2_sc_closed(void *arg)
{
    gw_h2_stream_t *s = arg;
    s->sc = NULL;
    if (s->closed)
        return;
    gw_h2_stream_read(s); /* what it wrote last may not have been read yet */
    if (!s->resp_done) {
        s->resp_done = true;
        if (s->submitted) /* a truncated answer: the client must not take it as whole */
            nghttp2_submit_rst_stream(s->h->sess, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR);
        else
            gw_h2_answer_error(s, 502, "bad_gateway", "the request ended without an answer");
    }
    if (s->submitted && s->deferred) {
        s->deferred = false;
        nghttp2_session_resume_data(s->h->sess, s->id);
    }
    if (!s->h->in_cb)
        gw_h2_flush(s->h);
}

/* ---- the request: HEADERS + DATA -> pair ---------------------------------- */

static void gw_h2_stream_free(void *arg)
{
    gw_h2_stream_t *s = arg;
    evbuffer_free(s->hdrs);
    evbuffer_free(s->out);
    gw_http_parser_free(s->resp);
    free(s->method);
    free(s->path);
    free(s->authority);
    free(s);
}

/* Unlinks s, closes its request connection (cancelling its upstream) and
 * frees it at the next safe point. */
static void gw_h2_stream_close(gw_h2_stream_t *s)
{
    gw_h2_t *h = s->h;
    s->closed = true;
    if (s->sc) {
        gw_conn_t *sc = s->sc;
        s->sc = NULL;
        sc->on_close = NULL;
        gw_conn_close(sc);
    }
    if (s->bev) {
        bufferevent_free(s->bev);
        s->bev = NULL;
    }
    TAILQ_REMOVE(&h->streams, s, link);
    h->nstreams--;
    gw_conn_defer_free(h->c, gw_h2_stream_free, s);
    if (h->nstreams == 0 && h->idle_ev) {
        int64_t ms = gw_conn_conf(h->c)->http2.idle_timeout_ms;
        struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
        evtimer_add(h->idle_ev, &tv);
    }
}

static gw_h2_stream_t *gw_h2_stream_new(gw_h2_t *h, int32_t id)
{
    gw_h2_stream_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->h = h;
    s->id = id;
    s->hdrs = evbuffer_new();
    s->out = evbuffer_new();
    /* The answer comes from our own stream connection: any body length
     * (an SSE stream has no end known in advance), a generous head. */
    static const gw_http_limits_t resp_lim = {
        .header_bytes = 64 * 1024, .header_lines = 256, .max_body_bytes = 0};
    s->resp = gw_http_parser_new(GW_HTTP_RESPONSE, &resp_lim);
    if (!s->hdrs || !s->out || !s->resp) {
        gw_h2_stream_free(s);
        return NULL;
    }
    TAILQ_INSERT_TAIL(&h->streams, s, link);
    h->nstreams++;
    if (h->idle_ev)
        evtimer_del(h->idle_ev);
    return s;
}

/* The header block is complete: the stream becomes a request. */
static void gw_h2_stream_start(gw_h2_stream_t *s, bool end_stream)
{
    gw_h2_t *h = s->h;
    if (s->too_large) {
        gw_h2_count("headers_too_large");
        gw_h2_answer_error(s, 431, "headers_too_large", "request headers too large");
        return;
    }
    if (s->bad || !s->method || !s->path) {
        gw_h2_answer_error(s, 400, "bad_request", "malformed request: bad h2 headers");
        return;
    }
    if (strcmp(s->method, "CONNECT") == 0) {
        gw_h2_answer_error(s, 501, "not_implemented", "CONNECT is not supported");
        return;
    }
    struct bufferevent *pair[2];
    if (bufferevent_pair_new(gw_conn_base(h->c), BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS,
                             pair) < 0) {
        nghttp2_submit_rst_stream(h->sess, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR);
        return;
    }
    s->bev = pair[1];
    s->sc = gw_conn_new_bev(h->w, pair[0], false, h->c->peer); /* takes pair[0] */
    if (!s->sc) {
        nghttp2_submit_rst_stream(h->sess, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR);
        return;
    }
    s->sc->tls = h->c->tls;
    s->sc->h2_stream = true;
    s->sc->on_close = gw_h2_sc_closed;
    s->sc->on_close_arg = s;
    bufferevent_setcb(s->bev, gw_h2_pair_readcb, NULL, gw_h2_pair_eventcb, s);
    bufferevent_enable(s->bev, EV_READ | EV_WRITE);
    s->head_req = strcmp(s->method, "HEAD") == 0;
    gw_http_parser_set_head_request(s->resp, s->head_req);
    s->chunked = !end_stream && !s->has_cl;
    struct evbuffer *o = bufferevent_get_output(s->bev);
    /* One request per stream connection: it closes after its answer. */
    evbuffer_add_printf(o, "%s %s HTTP/1.1\r\nHost: %s\r\n", s->method, s->path,
                        s->authority ? s->authority : "");
    evbuffer_add_buffer(o, s->hdrs);
    evbuffer_add_printf(o, "%sConnection: close\r\n\r\n",
                        s->chunked ? "Transfer-Encoding: chunked\r\n" : "");
    s->started = true;
    gw_h2_count("streams");
}

static void gw_h2_stream_body_end(gw_h2_stream_t *s)
{
    if (s->started && s->bev && s->chunked) {
        bufferevent_write(s->bev, GW_LIT("0\r\n\r\n"));
        s->chunked = false;
    }
}

static int gw_h2_on_begin_headers(nghttp2_session *sess, const nghttp2_frame *f, void *ud)
{
    gw_h2_t *h = ud;
    if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    gw_h2_stream_t *s = gw_h2_stream_new(h, f->hd.stream_id);
    if (!s)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    nghttp2_session_set_stream_user_data(sess, f->hd.stream_id, s);
    return 0;
}

static char *gw_h2_dup(const uint8_t *v, size_t n)
{
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
    if (s->too_large || s->bad)
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
            *slot = gw_h2_dup(value, valuelen);
            if (!*slot)
                return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        }
        return 0;
    }
    /* Host comes from :authority when there is one (RFC 9113 8.3.1); TE
     * (only "trailers" is allowed in h2) and Expect are hop by hop here. */
    if ((namelen == 4 && memcmp(name, "host", 4) == 0)) {
        if (!s->authority) {
            s->authority = gw_h2_dup(value, valuelen);
            if (!s->authority)
                return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        }
        return 0;
    }
    if ((namelen == 2 && memcmp(name, "te", 2) == 0) ||
        (namelen == 6 && memcmp(name, "expect", 6) == 0))
        return 0;
    if (namelen == 14 && memcmp(name, "content-length", 14) == 0)
        s->has_cl = true;
    evbuffer_add(s->hdrs, name, namelen);
    evbuffer_add(s->hdrs, ": ", 2);
    evbuffer_add(s->hdrs, value, valuelen);
    evbuffer_add(s->hdrs, "\r\n", 2);
    return 0;
}

static int gw_h2_on_data(nghttp2_session *sess, uint8_t flags, int32_t id, const uint8_t *data,
                         size_t len, void *ud)
{
    (void)flags;
    (void)ud;
    gw_h2_stream_t *s = nghttp2_session_get_stream_user_data(sess, id);
    if (!s || !s->started || !s->sc || !s->bev || len == 0)
        return 0; /* answered already (431, 413, ...): the rest is dropped */
    if (s->chunked) {
        char sz[24];
        int n = snprintf(sz, sizeof(sz), "%zx\r\n", len);
        bufferevent_write(s->bev, sz, (size_t)n);
        bufferevent_write(s->bev, data, len);
        bufferevent_write(s->bev, "\r\n", 2);
    } else {
        bufferevent_write(s->bev, data, len);
    }
    return 0;
}

/* Client resets: a token bucket of reset_burst, refilled reset_rate a
 * second; empty = rapid reset (CVE-2023-44487): GOAWAY ENHANCE_YOUR_CALM. */
static bool gw_h2_reset_allowed(gw_h2_t *h)
{
    const conf_http2_t *c = &gw_conn_conf(h->c)->http2;
    int64_t now = sl_now_ms();
    if (h->reset_ms == 0) {
        h->reset_tokens = (double)c->reset_burst;
        h->reset_ms = now;
    }
    h->reset_tokens += (double)(now - h->reset_ms) * (double)c->reset_rate / 1000.0;
    if (h->reset_tokens > (double)c->reset_burst)
        h->reset_tokens = (double)c->reset_burst;
    h->reset_ms = now;
    if (h->reset_tokens < 1.0)
        return false;
    h->reset_tokens -= 1.0;
    return true;
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
        }
        return 0;
    case NGHTTP2_RST_STREAM:
        gw_h2_count("rst_recv");
        if (!gw_h2_reset_allowed(h) && !h->closing) {
            gw_h2_count("rapid_reset");
            sl_log_limited(SL_LOG_WARN, "h2_rapid_reset",
                           "h2: %s resets streams too fast: GOAWAY ENHANCE_YOUR_CALM", h->c->peer);
            h->calm_ours = true;
            nghttp2_session_terminate_session(sess, NGHTTP2_ENHANCE_YOUR_CALM);
            h->closing = true;
        }
        return 0;
    default:
        return 0;
    }
}

static int gw_h2_on_frame_send(nghttp2_session *sess, const nghttp2_frame *f, void *ud)
{
    (void)sess;
    gw_h2_t *h = ud;
    if (f->hd.type == NGHTTP2_RST_STREAM && f->rst_stream.error_code == NGHTTP2_REFUSED_STREAM)
        gw_h2_count("refused_stream");
    else if (f->hd.type == NGHTTP2_GOAWAY && f->goaway.error_code == NGHTTP2_PROTOCOL_ERROR)
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
    gw_h2_stream_close(s);
    return 0;
}

/* ---- the connection ----------------------------------------------------- */

/* The session's frames out to the socket, while there is room. */
static void gw_h2_flush(gw_h2_t *h)
{
    if (h->in_cb || h->c->closed)
        return;
    struct evbuffer *out = bufferevent_get_output(h->c->bev);
    h->in_cb++;
    while (evbuffer_get_length(out) < GW_H2_OUT_HWM) {
        const uint8_t *data;
        ssize_t n = nghttp2_session_mem_send(h->sess, &data);
        if (n < 0) {
            h->closing = true;
            break;
        }
        if (n == 0)
            break;
        evbuffer_add(out, data, (size_t)n);
        sl_counter_add(gw_m.bytes_client_out, (uint64_t)n);
    }
    h->in_cb--;
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
    if (h->closing)
        return;
    struct evbuffer *in = bufferevent_get_input(h->c->bev);
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

static void gw_h2_idle_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_h2_t *h = arg;
    if (h->nstreams > 0 || h->c->closed)
        return;
    nghttp2_session_terminate_session(h->sess, NGHTTP2_NO_ERROR);
    gw_h2_flush(h);
}

void gw_h2_free(gw_h2_t *h)
{
    if (!h)
        return;
    gw_h2_stream_t *s;
    while ((s = TAILQ_FIRST(&h->streams)))
        gw_h2_stream_close(s);
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

int gw_h2_start(gw_conn_t *c)
{
    gw_h2_t *h = calloc(1, sizeof(*h));
    if (!h)
        return -1;
    const conf_http2_t *hc = &gw_conn_conf(c)->http2;
    h->c = c;
    h->w = c->w;
    h->max_header_list = hc->max_header_list;
    TAILQ_INIT(&h->streams);
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
    if (nghttp2_session_server_new2(&h->sess, cb, h, opt) != 0)
        goto fail;
    nghttp2_session_callbacks_del(cb);
    nghttp2_option_del(opt);
    cb = NULL;
    opt = NULL;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, (uint32_t)hc->max_concurrent_streams},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, (uint32_t)hc->initial_window},
        {NGHTTP2_SETTINGS_MAX_FRAME_SIZE, (uint32_t)hc->max_frame},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)hc->max_header_list},
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
    };
    if (nghttp2_submit_settings(h->sess, NGHTTP2_FLAG_NONE, iv, SL_ARRAY_LEN(iv)) != 0)
        goto fail;
    h->idle_ev = evtimer_new(gw_conn_base(c), gw_h2_idle_cb, h);
    h->wd_ev = evtimer_new(gw_conn_base(c), gw_h2_wd_cb, h);
    if (!h->idle_ev || !h->wd_ev)
        goto fail;
    int64_t ms = hc->idle_timeout_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(h->idle_ev, &tv);
    c->h2 = h;
    gw_h2_count("conns");
    bufferevent_setwatermark(c->bev, EV_WRITE, GW_H2_OUT_HWM / 2, 0);
    gw_h2_read(h);
    return 0;
fail:
    nghttp2_session_callbacks_del(cb);
    nghttp2_option_del(opt);
    if (h->idle_ev)
        event_free(h->idle_ev);
    if (h->wd_ev)
        event_free(h->wd_ev);
    if (h->sess)
        nghttp2_session_del(h->sess);
    free(h);
    return -1;
}
