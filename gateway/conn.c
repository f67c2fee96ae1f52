/*
 * conn.c — one client connection: read and frame requests with the strict
 * HTTP/1.1 adapter, enforce the deadlines (header, body, keep-alive idle),
 * hand each complete request to the router, and after the response either
 * wait for the next request (keep-alive, pipelined bytes kept) or flush and
 * close.
 *
 * One request at a time per connection. While a request is being served the
 * connection still reads, so a client that goes away is noticed at once
 * (and its upstream request cancelled); bytes it pipelines meanwhile wait in
 * the input buffer, bounded by the read high-watermark.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <event2/bufferevent_ssl.h>

#include "common/log.h"
#include "gateway/body_scan.h"
#include "gateway/gw_conn.h"
#include "gateway/gw_h2.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_proxy.h"
#include "gateway/gw_req.h"
#include "gateway/gw_route.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_types.h"
#include "gateway/gw_wio.h"
#include "gateway/gw_worker.h"
#include "gateway/http1.h"

#define GW_CONN_READ_HWM (64 * 1024)
/* Lingering close (RFC 9112 9.6): after an answer sent with request bytes
 * unread, the write side is shut and input drained for at most this long
 * (or this many bytes), so the client reads the answer instead of a reset
 * that a close with unread input would send. */
#define GW_CONN_LINGER_MS    2000
#define GW_CONN_LINGER_BYTES (4u << 20)

static void gw_conn_readcb(struct bufferevent *bev, void *arg);
static void gw_conn_writecb(struct bufferevent *bev, void *arg);
static void gw_conn_drained(void *arg);
static void gw_conn_failed(void *arg, short what);
static void gw_conn_eventcb(struct bufferevent *bev, short what, void *arg);
static void gw_conn_timer_cb(evutil_socket_t fd, short what, void *arg);
static gw_conn_t *gw_conn_attach(gw_worker_t *w, gw_conn_t *c, struct bufferevent *bev,
                                 bool direct);

/* The connection's one deadline (header, body or idle), kept lazily: the
 * timer is re-armed only when a deadline comes earlier than the one it is
 * set for; when it fires early it re-arms for what is left. A request on a
 * keep-alive connection so costs no timer operation at all. */
static void gw_conn_arm(gw_conn_t *c, int64_t ms)
{
    int64_t now = sl_now_ms();
    c->deadline_ms = now + ms;
    if (c->armed_ms && c->armed_ms <= c->deadline_ms)
        return;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(c->timer, &tv);
    c->armed_ms = c->deadline_ms;
}

static void gw_conn_disarm(gw_conn_t *c)
{
    c->deadline_ms = 0; /* the timer may still fire: it finds nothing due */
}

static gw_http_parser_t *gw_conn_parser_new(const conf_limits_t *l)
{
    gw_http_limits_t lim = {
        .request_line_bytes = (size_t)l->request_line_bytes,
        .header_bytes = (size_t)l->header_bytes,
        .header_lines = (size_t)l->header_lines,
        .max_body_bytes = (size_t)l->max_body_bytes,
    };
    return gw_http_parser_new(GW_HTTP_REQUEST, &lim);
}

void gw_conn_accept(gw_worker_t *w, int fd, const struct sockaddr *sa, int salen, gw_listen_rt_t *l)
{
    (void)salen;
    gw_conn_t *c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        return;
    }
    c->w = w;
    c->admin = l->admin;
    c->h2c = !l->admin && w->rt->conf->listen[l->index].h2c;
    if (sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, c->peer, sizeof(c->peer));
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, c->peer,
                  sizeof(c->peer));
    SSL_CTX *ctx = l->admin ? NULL : w->rt->listen_ssl[l->index];
    /* Deferred callbacks only where OpenSSL may call back from inside a
     * write; plain sockets call back from the loop alone. */
    int opts = BEV_OPT_CLOSE_ON_FREE | (ctx ? BEV_OPT_DEFER_CALLBACKS : 0);
    struct bufferevent *bev = NULL;
    if (ctx) {
        SSL *ssl = SSL_new(ctx);
        if (ssl)
            bev = bufferevent_openssl_socket_new(w->base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING, opts);
        if (bev)
            bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
        else if (ssl)
            SSL_free(ssl);
        c->tls = true;
    } else {
        bev = bufferevent_socket_new(w->base, fd, opts);
    }
    if (!bev) {
        close(fd);
        free(c);
        return;
    }
    /* Direct writes only on plain sockets (wio.c). */
    gw_conn_attach(w, c, bev, !ctx);
}

gw_conn_t *gw_conn_new_bev(gw_worker_t *w, struct bufferevent *bev, bool admin, const char *peer)
{
    gw_conn_t *c = calloc(1, sizeof(*c));
    if (!c) {
        bufferevent_free(bev);
        return NULL;
    }
    c->w = w;
    c->admin = admin;
    snprintf(c->peer, sizeof(c->peer), "%s", peer ? peer : "");
    return gw_conn_attach(w, c, bev, false);
}

/* Takes bev (freed on failure, with c). */
static gw_conn_t *gw_conn_attach(gw_worker_t *w, gw_conn_t *c, struct bufferevent *bev, bool direct)
{
    c->bev = bev;
    c->parser = gw_conn_parser_new(&w->rt->conf->limits);
    c->timer = evtimer_new(w->base, gw_conn_timer_cb, c);
    if (!c->parser || !c->timer) {
        bufferevent_free(c->bev);
        gw_http_parser_free(c->parser);
        if (c->timer)
            event_free(c->timer);
        free(c);
        return NULL;
    }
    bufferevent_setcb(c->bev, gw_conn_readcb, gw_conn_writecb, gw_conn_eventcb, c);
    bufferevent_setwatermark(c->bev, EV_READ, 0, GW_CONN_READ_HWM);
    int64_t st = w->rt->conf->limits.send_timeout_ms;
    struct timeval wtv = {st / 1000, (st % 1000) * 1000};
    bufferevent_set_timeouts(c->bev, NULL, &wtv);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    gw_wio_init(&c->wio, w, c->bev, direct, gw_conn_drained, gw_conn_failed, c);
    TAILQ_INSERT_TAIL(&w->conns, c, link);
    w->nconns++;
    sl_gauge_add(gw_m.conns_active, 1);
    c->phase = GW_PHASE_IDLE;
    /* The first request must arrive within the header deadline. */
    gw_conn_arm(c, w->rt->conf->limits.header_timeout_ms);
    return c;
}

static void gw_req_count(gw_req_t *r);

static void gw_conn_free_cb(void *arg)
{
    gw_conn_t *c = arg;
    free(c);
}

/* A request's resources; the struct and its body buffer are kept as the
 * connection's spare for its next request (keep-alive requests then cost
 * no allocation for them). */
static void gw_req_free(gw_req_t *r)
{
    if (!r)
        return;
    gw_conn_t *c = r->c;
    gw_llm_req_free(r);
    if (r->json)
        json_decref(r->json);
    gw_body_scan_free(r->scan);
    if (r->resp_body)
        evbuffer_free(r->resp_body);
    if (r->capture)
        evbuffer_free(r->capture);
    if (r->retry_ev)
        event_free(r->retry_ev);
    gw_rt_unref(r->rt);
    if (c && !c->closed && !c->spare && r->body) {
        evbuffer_drain(r->body, evbuffer_get_length(r->body));
        c->spare = r;
        return;
    }
    if (r->body)
        evbuffer_free(r->body);
    free(r);
}

static void gw_req_free_spare(gw_conn_t *c)
{
    gw_req_t *r = c->spare;
    c->spare = NULL;
    if (r) {
        evbuffer_free(r->body);
        free(r);
    }
}

struct event_base *gw_conn_base(const gw_conn_t *c)
{
    return c->w->base;
}

const struct conf *gw_conn_conf(const gw_conn_t *c)
{
    return c->w->rt->conf;
}

void gw_conn_defer_free(gw_conn_t *c, void (*fn)(void *), void *obj)
{
    gw_worker_defer_free(c->w, fn, obj);
}

void gw_conn_close(gw_conn_t *c)
{
    if (c->closed)
        return;
    c->closed = true;
    if (c->on_close) {
        void (*fn)(void *) = c->on_close;
        c->on_close = NULL;
        fn(c->on_close_arg);
    }
    if (c->h2) {
        gw_h2_free(c->h2);
        c->h2 = NULL;
    }
    if (c->req) {
        gw_req_t *r = c->req;
        gw_proxy_abort(r);
        gw_hooks_end(r, GW_END_ABORTED);
        if (c->phase == GW_PHASE_BUSY) { /* a dispatched request the client left */
            r->status = 499;             /* as nginx logs a client that left early */
            if (!r->error_kind)
                r->error_kind = "client_closed";
            gw_req_count(r);
            gw_accesslog_write(r);
        }
        gw_req_free(r);
        c->req = NULL;
    }
    gw_req_free_spare(c);
    gw_worker_t *w = c->w;
    TAILQ_REMOVE(&w->conns, c, link);
    w->nconns--;
    sl_gauge_add(gw_m.conns_active, -1);
    event_free(c->timer);
    c->timer = NULL;
    gw_wio_fini(&c->wio);
    bufferevent_free(c->bev); /* libevent defers it if a callback is running */
    c->bev = NULL;
    gw_http_parser_free(c->parser);
    c->parser = NULL;
    gw_worker_defer_free(w, gw_conn_free_cb, c);
    gw_worker_conn_closed(w);
}

/* Everything written has left: close, or linger first (plain sockets; a
 * TLS write side cannot be half-closed under OpenSSL's feet). */
static void gw_conn_flushed_close(gw_conn_t *c)
{
    int fd = bufferevent_getfd(c->bev);
    if (!c->linger || c->tls || fd < 0 || shutdown(fd, SHUT_WR) != 0) {
        gw_conn_close(c);
        return;
    }
    c->lingering = true;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    c->linger_bytes = evbuffer_get_length(in);
    evbuffer_drain(in, c->linger_bytes);
    bufferevent_setwatermark(c->bev, EV_READ, 0, 0);
    bufferevent_enable(c->bev, EV_READ);
    gw_conn_arm(c, GW_CONN_LINGER_MS);
}

/* Closes once everything written has left. */
static void gw_conn_close_after_flush(gw_conn_t *c)
{
    c->phase = GW_PHASE_CLOSING;
    gw_conn_disarm(c);
    if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
        c->linger = true;
    bufferevent_disable(c->bev, EV_READ);
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) {
        gw_conn_flushed_close(c);
        return;
    }
    bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
    /* Don't let a client that stops reading hold us: the send timeout
     * (bufferevent write timeout) still applies. */
}

/* A connection accepted just before the drain whose request has not been
 * read yet is not idle: its client has sent (or is sending) a request and
 * would see the close as a failure (a SIGUSR2 upgrade drains the old process
 * while clients keep connecting). It gets a short grace to send it, then
 * is served and closed. An idle keep-alive connection closes as soon as its
 * last answer has left: "idle" starts when the answer is queued, and direct
 * writes (wio.c) flush it at the end of the loop turn, so closing at once
 * cut answers the client was about to read. */
#define GW_CONN_DRAIN_FIRST_MS 1000

void gw_conn_drain(gw_conn_t *c)
{
    if (c->h2) {
        gw_h2_drain(c->h2);
        return;
    }
    if (c->h2_stream) { /* its request may not be parsed yet: it ends after its answer */
        c->close_after = true;
        return;
    }
    if (c->phase == GW_PHASE_IDLE && c->nrequests == 0) {
        int64_t left = c->deadline_ms - sl_now_ms();
        gw_conn_arm(c, left > 0 && left < GW_CONN_DRAIN_FIRST_MS ? left : GW_CONN_DRAIN_FIRST_MS);
        c->close_after = true;
        return;
    }
    if (c->phase == GW_PHASE_IDLE)
        gw_conn_close_after_flush(c); /* the last answer may still be on its way out */
    else
        c->close_after = true;
}

static gw_req_t *gw_req_new(gw_conn_t *c)
{
    gw_req_t *r = c->spare;
    struct evbuffer *body = NULL;
    if (r) {
        c->spare = NULL;
        body = r->body;
        memset(r, 0, sizeof(*r));
    } else {
        r = calloc(1, sizeof(*r));
        if (!r)
            return NULL;
    }
    r->c = c;
    r->rt = gw_rt_ref(c->w->rt);
    r->start_ns = sl_now_ns();
    r->route = GW_ROUTE_OTHER;
    r->hooks.pending = -1;
    r->body = body ? body : evbuffer_new();
    if (!r->body) {
        gw_req_free(r);
        return NULL;
    }
    return r;
}

/* The request id: the client's X-Request-Id when it is short and plain,
 * else 16 random hex digits. */
static void gw_req_set_id(gw_req_t *r)
{
    const gw_http_header_t *h = gw_http_header_find(gw_http_msg(r->c->parser), "X-Request-Id");
    if (h && h->value_len >= 8 && h->value_len < sizeof(r->id) &&
        strspn(h->value, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") ==
            h->value_len) {
        memcpy(r->id, h->value, h->value_len + 1);
        return;
    }
    static const char hex[] = "0123456789abcdef";
    uint64_t v = gw_worker_rand(r->c->w);
    for (int i = 15; i >= 0; i--, v >>= 4)
        r->id[i] = hex[v & 15];
    r->id[16] = '\0';
}

static int gw_conn_body_cb(void *arg, const char *p, size_t n)
{
    gw_conn_t *c = arg;
    return evbuffer_add(c->req->body, p, n);
}

static const char *gw_parse_code(int status)
{
    switch (status) {
    case 413:
        return "request_too_large";
    case 414:
        return "uri_too_long";
    case 417:
        return "expectation_failed";
    case 431:
        return "headers_too_large";
    case 501:
        return "not_implemented";
    case 505:
        return "http_version_not_supported";
    default:
        return "bad_request";
    }
}

/* The first bytes of a connection: HTTP/2 when ALPN picked h2, or when an
 * h2c listener sees the preface. 1: handed to h2.c; 0: HTTP/1.1; -1: wait
 * for more bytes (a partial preface). */
static int gw_conn_sniff_h2(gw_conn_t *c, struct evbuffer *in)
{
    bool h2 = false;
    if (c->tls) {
        SSL *ssl = bufferevent_openssl_get_ssl(c->bev);
        const unsigned char *p = NULL;
        unsigned int n = 0;
        if (ssl)
            SSL_get0_alpn_selected(ssl, &p, &n);
        h2 = n == 2 && memcmp(p, "h2", 2) == 0;
    } else if (c->h2c) {
        size_t n = SL_MIN(evbuffer_get_length(in), (size_t)GW_H2_PREFACE_LEN);
        const unsigned char *p = evbuffer_pullup(in, (ssize_t)n);
        if (!p || memcmp(p, GW_H2_PREFACE, n) != 0)
            return 0;
        if (n < GW_H2_PREFACE_LEN)
            return -1;
        h2 = true;
    }
    if (!h2)
        return 0;
    gw_conn_disarm(c); /* h2.c keeps its own idle deadline */
    c->phase = GW_PHASE_BUSY;
    if (gw_h2_start(c) < 0)
        gw_conn_close(c);
    return 1;
}

static void gw_conn_parse(gw_conn_t *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    const conf_limits_t *lim = &c->w->rt->conf->limits;
    while (!c->closed &&
           (c->phase == GW_PHASE_IDLE || c->phase == GW_PHASE_HEAD || c->phase == GW_PHASE_BODY)) {
        if (c->phase == GW_PHASE_IDLE) {
            if (evbuffer_get_length(in) == 0)
                return; /* a request begins with its first byte */
            if (c->nrequests == 0 && !c->h2_stream && (c->tls || c->h2c) &&
                gw_conn_sniff_h2(c, in) != 0)
                return;
            c->req = gw_req_new(c);
            if (!c->req) {
                gw_conn_close(c);
                return;
            }
            c->phase = GW_PHASE_HEAD;
            if (c->nrequests > 0) /* the first request's deadline runs from accept */
                gw_conn_arm(c, lim->header_timeout_ms);
        }
        size_t used = 0;
        gw_http_state_t st = gw_http_feed_evbuffer(c->parser, in, &used, gw_conn_body_cb, c);
        c->req->bytes_in += used;
        sl_counter_add(gw_m.bytes_client_in, used);
        switch (st) {
        case GW_HTTP_NEED_MORE:
            return; /* the input is used up */
        case GW_HTTP_HEAD: {
            const gw_http_msg_t *m = gw_http_msg(c->parser);
            c->phase = GW_PHASE_BODY;
            gw_conn_arm(c, lim->body_timeout_ms);
            if (m->expect_continue && (m->chunked || m->content_length > 0))
                bufferevent_write(c->bev, GW_LIT("HTTP/1.1 100 Continue\r\n\r\n"));
            break;
        }
        case GW_HTTP_DONE: {
            const gw_http_msg_t *m = gw_http_msg(c->parser);
            gw_conn_disarm(c);
            c->phase = GW_PHASE_BUSY;
            c->nrequests++;
            if (!m->keep_alive || (int64_t)c->nrequests >= lim->keepalive_requests)
                c->close_after = true;
            gw_req_set_id(c->req);
            gw_route_dispatch(c->req);
            return;
        }
        case GW_HTTP_ERROR: {
            int status = gw_http_error_status(c->parser);
            const char *reason = gw_http_error_reason(c->parser);
            sl_counter_add(sl_metric_series1(gw_m.parse_errors, reason), 1);
            char msg[160];
            snprintf(msg, sizeof(msg), "malformed request: %s", reason);
            c->phase = GW_PHASE_BUSY;
            c->close_after = true;
            c->linger = true; /* the rest of the request is unread */
            c->req->error_kind = "bad_request";
            snprintf(c->req->id, sizeof(c->req->id), "%016llx",
                     (unsigned long long)gw_worker_rand(c->w));
            gw_respond_error(c->req, status,
                             status >= 500 ? "server_error" : "invalid_request_error",
                             gw_parse_code(status), msg);
            return;
        }
        }
    }
}

static void gw_conn_readcb(struct bufferevent *bev, void *arg)
{
    gw_conn_t *c = arg;
    if (c->h2) {
        gw_h2_read(c->h2);
        return;
    }
    if (c->lingering) {
        struct evbuffer *in = bufferevent_get_input(bev);
        size_t n = evbuffer_get_length(in);
        evbuffer_drain(in, n);
        c->linger_bytes += n;
        if (c->linger_bytes > GW_CONN_LINGER_BYTES)
            gw_conn_close(c);
        return;
    }
    gw_conn_parse(c);
}

/* Output went out (down to the low watermark, or all of it). */
static void gw_conn_drained(void *arg)
{
    gw_conn_t *c = arg;
    if (c->closed)
        return;
    if (c->h2) { /* h2.c produces more frames as the socket drains */
        gw_h2_written(c->h2);
        return;
    }
    if (c->phase == GW_PHASE_CLOSING) {
        if (!c->lingering && evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
            gw_conn_flushed_close(c);
        return;
    }
    if (c->phase == GW_PHASE_BUSY && c->req)
        gw_proxy_client_drained(c->req);
}

static void gw_conn_writecb(struct bufferevent *bev, void *arg)
{
    (void)bev;
    gw_conn_t *c = arg;
    if (c->closed)
        return;
    gw_wio_written(&c->wio);
    gw_conn_drained(c);
}

static void gw_conn_failed(void *arg, short what)
{
    gw_conn_t *c = arg;
    gw_conn_eventcb(c->bev, what, c);
}

static void gw_conn_eventcb(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    gw_conn_t *c = arg;
    if (c->closed)
        return;
    if (what & BEV_EVENT_CONNECTED)
        return;
    if (c->req && !c->req->error_kind)
        c->req->error_kind = (what & BEV_EVENT_TIMEOUT) ? "client_send_timeout" : "client_closed";
    gw_conn_close(c);
}

static void gw_conn_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_conn_t *c = arg;
    c->armed_ms = 0;
    if (c->closed || c->deadline_ms == 0 || c->h2)
        return;
    int64_t left = c->deadline_ms - sl_now_ms();
    if (left > 0) {
        gw_conn_arm(c, left);
        return;
    }
    if (c->closed)
        return;
    if (c->lingering) { /* the client kept sending past the lingering time */
        gw_conn_close(c);
        return;
    }
    if (c->phase == GW_PHASE_IDLE || (c->phase == GW_PHASE_HEAD && !gw_http_started(c->parser))) {
        gw_conn_close(c); /* idle keep-alive, or never sent a byte */
        return;
    }
    if (c->phase == GW_PHASE_HEAD || c->phase == GW_PHASE_BODY) {
        c->phase = GW_PHASE_BUSY;
        c->close_after = true;
        c->linger = true;
        c->req->error_kind = "request_timeout";
        snprintf(c->req->id, sizeof(c->req->id), "%016llx",
                 (unsigned long long)gw_worker_rand(c->w));
        gw_respond_error(c->req, 408, "invalid_request_error", "request_timeout",
                         c->phase == GW_PHASE_HEAD ? "request headers not received in time"
                                                   : "request not received in time");
        return;
    }
}

static void gw_req_count(gw_req_t *r)
{
    int cls = r->status >= 100 && r->status < 600 ? r->status / 100 : 5;
    /* A client that left is not a 4xx of ours: its own value (nginx's 499). */
    int proto = r->c->h2_stream ? 1 : 0;
    sl_counter_add(r->status == 499 ? gw_m.requests_499[r->route][proto]
                                    : gw_m.requests[r->route][cls][proto],
                   1);
    gw_llm_req_end(r); /* per model; a JSON answer's TTFT is taken here */
    sl_histogram_observe(gw_m.duration[r->route], (double)(sl_now_ns() - r->start_ns) / 1e9);
}

void gw_conn_req_done(gw_conn_t *c)
{
    gw_req_t *r = c->req;
    gw_hooks_end(r, GW_END_DONE);
    gw_req_count(r);
    gw_accesslog_write(r);
    gw_req_free(r);
    c->req = NULL;
    if (c->close_after || c->w->draining) {
        gw_conn_close_after_flush(c);
        return;
    }
    c->phase = GW_PHASE_IDLE;
    gw_http_parser_reset(c->parser);
    bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
    gw_conn_arm(c, c->w->rt->conf->limits.keepalive_timeout_ms);
    /* Pipelined bytes already here: parse them on the next loop turn (not
     * now: we may be deep in an upstream callback). */
    if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
        bufferevent_trigger(c->bev, EV_READ, BEV_OPT_DEFER_CALLBACKS);
}
