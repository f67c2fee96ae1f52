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
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "gateway/body_scan.h"
#include "gateway/body_store.h"
#include "gateway/gw_conn.h"
#include "gateway/gw_h2.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_proxy.h"
#include "gateway/gw_req.h"
#include "gateway/gw_route.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_trace.h"
#include "gateway/gw_types.h"
#include "gateway/gw_wio.h"
#include "gateway/gw_worker.h"
#include "gateway/http1.h"
#include "gateway/sb.h"

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
static gw_conn_t *gw_conn_attach(gw_worker_t *w, gw_conn_t *c, struct bufferevent *bev, bool direct,
                                 SSL *ssl);
static const gw_out_ops_t gw_out_h1;

/* A batch (gw_out_batch_begin): the chunks of one upstream read gathered
 * as one chunk, its size line written in front of them when it is queued
 * (so the bytes are copied once, and one evbuffer_add runs the buffer's
 * callbacks once, not once per SSE event). Per thread: a loop turn feeds
 * one read at a time. Bounded: what does not fit goes out as before. */
#define GW_H1_BATCH_BYTES 16384
#define GW_H1_BATCH_HEAD  18 /* a size line's room: 16 hex digits, CRLF */
typedef struct gw_h1_batch {
    gw_conn_t *c; /* gathering for c's request r; NULL when off */
    gw_req_t *r;
    size_t len; /* body bytes, at buf + GW_H1_BATCH_HEAD */
    char buf[GW_H1_BATCH_HEAD + GW_H1_BATCH_BYTES + 2];
} gw_h1_batch_t;
static __thread gw_h1_batch_t gw_h1_batch;

/* The connection's one deadline (header, body or idle), kept lazily: the
 * timer is re-armed only when a deadline comes earlier than the one it is
 * set for; when it fires early it re-arms for what is left. A request on a
 * keep-alive connection so costs no timer operation at all. */
static void gw_conn_arm_at(gw_conn_t *c, int64_t ms, int64_t now)
{
    c->deadline_ms = now + ms;
    if (c->armed_ms && c->armed_ms <= c->deadline_ms)
        return;
    /* A configured duration goes to its common timeout (an O(1) queue, not
     * the heap); what is left of one after an early fire is any number, so
     * it takes the heap rather than a common timeout of its own. */
    const conf_limits_t *l = &c->w->rt->conf->limits;
    gw_worker_timer_add(c->w, c->timer, ms,
                        ms == l->header_timeout_ms || ms == l->body_timeout_ms ||
                            ms == l->keepalive_timeout_ms);
    c->armed_ms = c->deadline_ms;
}

static void gw_conn_arm(gw_conn_t *c, int64_t ms)
{
    gw_conn_arm_at(c, ms, sl_now_ms());
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

/* A zeroed connection, line-aligned so its gw_wio_t's first line is one
 * cache line (gw_wio.h); free() frees it. NULL on OOM. */
static gw_conn_t *gw_conn_alloc(void)
{
    gw_conn_t *c = aligned_alloc(GW_WIO_LINE, GW_WIO_LINE_SIZE(sizeof(*c)));
    if (c)
        memset(c, 0, sizeof(*c));
    return c;
}

void gw_conn_accept(gw_worker_t *w, int fd, const struct sockaddr *sa, int salen, gw_listen_rt_t *l)
{
    (void)salen;
    gw_conn_t *c = gw_conn_alloc();
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
    /* TLS too is a plain-socket bufferevent: wio.c reads and writes it
     * with SSL_read/SSL_write (gw_wio_tls_own says why). */
    SSL *ssl = ctx ? SSL_new(ctx) : NULL;
    struct bufferevent *bev =
        ctx && !ssl ? NULL : bufferevent_socket_new(w->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        SSL_free(ssl);
        close(fd);
        free(c);
        return;
    }
    c->tls = ssl != NULL;
    gw_conn_attach(w, c, bev, true, ssl);
}

gw_conn_t *gw_conn_new_bev(gw_worker_t *w, struct bufferevent *bev, bool admin, const char *peer)
{
    gw_conn_t *c = gw_conn_alloc();
    if (!c) {
        bufferevent_free(bev);
        return NULL;
    }
    c->w = w;
    c->admin = admin;
    snprintf(c->peer, sizeof(c->peer), "%s", peer ? peer : "");
    return gw_conn_attach(w, c, bev, false, NULL);
}

/* Takes bev and ssl (freed on failure, with c). */
static gw_conn_t *gw_conn_attach(gw_worker_t *w, gw_conn_t *c, struct bufferevent *bev, bool direct,
                                 SSL *ssl)
{
    c->bev = bev;
    c->out = &gw_out_h1;
    c->parser = gw_conn_parser_new(&w->rt->conf->limits);
    c->timer = evtimer_new(w->base, gw_conn_timer_cb, c);
    if (!c->parser || !c->timer) {
        SSL_free(ssl);
        bufferevent_free(c->bev);
        gw_http_parser_free(c->parser);
        if (c->timer)
            event_free(c->timer);
        free(c);
        return NULL;
    }
    bufferevent_setcb(c->bev, gw_conn_readcb, gw_conn_writecb, gw_conn_eventcb, c);
    int64_t st = w->rt->conf->limits.send_timeout_ms;
    struct timeval wtv = {st / 1000, (st % 1000) * 1000};
    bufferevent_set_timeouts(c->bev, NULL, &wtv);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    gw_wio_init(&c->wio, w, c->bev, direct, gw_conn_drained, gw_conn_failed, c);
    if (direct && !ssl) /* a plain socket: read without libevent's FIONREAD (wio.c) */
        (void)gw_wio_read_own(&c->wio);
    if (ssl && gw_wio_tls_own(&c->wio, ssl) != 0) {
        gw_wio_fini(&c->wio);
        SSL_free(ssl);
        bufferevent_free(c->bev);
        gw_http_parser_free(c->parser);
        event_free(c->timer);
        free(c);
        return NULL;
    }
    /* Once the reader is chosen: with ours, libevent's mark (a callback on
     * the input) is never created (gw_wio_set_read_mark says why). */
    gw_wio_set_read_mark(&c->wio, GW_CONN_READ_HWM);
    TAILQ_INSERT_TAIL(&w->conns, c, link);
    w->nconns++;
    sl_gauge_add(gw_m.conns_active, 1);
    c->phase = GW_PHASE_IDLE;
    /* The first request must arrive within the header deadline. */
    gw_conn_arm(c, w->rt->conf->limits.header_timeout_ms);
    return c;
}

static int64_t gw_req_count(gw_req_t *r);

static void gw_conn_free_cb(void *arg)
{
    gw_conn_t *c = arg;
    free(c);
}

/* Request structs the worker keeps for its next requests, with what every
 * proxied request needs again: the emptied body and answer buffers, the
 * upstream timer (its argument is the struct itself, so it stays right)
 * and the usage tail's block. A keep-alive request so costs no allocation
 * for them while an idle connection holds none (nginx frees a request's
 * memory between keep-alive requests). Bounded: at most GW_REQ_CACHE_MAX
 * (gw_worker.h), and the worker's tick frees half of those no request took
 * since the tick before (the cache's low-water mark), and all of them when
 * it trims after a peak. Sized for the peak, not 64: with thousands of
 * connections the requests in flight swing by hundreds, and each struct
 * the cache could not keep was a new struct, scanner and usage tail (three
 * blocks over glibc's tcache size, from its cold large bins) for the next
 * request: 24-37 % of requests at 5,000 connections with 64. */

/* What a cached struct holds beyond itself. */
static void gw_req_kept_free(gw_req_t *r)
{
    if (r->body)
        evbuffer_free(r->body);
    if (r->resp_body)
        evbuffer_free(r->resp_body);
    sl_buf_free(&r->held);
    if (r->att.up_timer)
        event_free(r->att.up_timer);
    gw_body_scan_free(r->scan);
    gw_body_scan_free(r->scan_kept);
    gw_sse_free(r->sse_kept);
    gw_llm_req_free(r);
    free(r);
}

/* The largest block for a held answer (r->held) a cached struct keeps. */
#define GW_REQ_HELD_KEEP 4096

/* The largest body whose scanner a cached request struct keeps. */
#define GW_REQ_SCAN_KEEP_MAX (16 * 1024)

static void gw_req_cache_put(gw_worker_t *w, gw_req_t *r)
{
    if (w->nreq_cache >= GW_REQ_CACHE_MAX) {
        gw_req_kept_free(r);
        return;
    }
    evbuffer_drain(r->body, evbuffer_get_length(r->body));
    /* mostly empty already (moved to the client: gw_out_data_buffer); a
     * drain of nothing still runs the buffer's callbacks */
    size_t held = r->resp_body ? evbuffer_get_length(r->resp_body) : 0;
    if (held)
        evbuffer_drain(r->resp_body, held);
    if (r->held.cap > GW_REQ_HELD_KEEP) /* a cached struct stays small */
        sl_buf_free(&r->held);
    /* r->att.up_timer stays as it is: pending or not, it finds nothing due
     * (proxy.c, gw_proxy_arm_at) */
    /* The body scanner stays too (2.6 KiB and its string arena: two blocks
     * over glibc's tcache size, cold in its large bins with thousands of
     * connections). Only after a small body: what it keeps (its arena, grown
     * arrays) is at most about the body's size, and a cached struct must
     * stay small. Not reset here: gw_body_scan() resets it when it starts,
     * and by then (hundreds of requests later at thousands of connections)
     * lines written here would be cold again. */
    if (r->scan && r->scan->len > GW_REQ_SCAN_KEEP_MAX) {
        gw_body_scan_free(r->scan);
        r->scan = NULL;
    }
    if (r->scan) {
        gw_body_scan_free(r->scan_kept);
        r->scan_kept = r->scan;
        r->scan = NULL;
    }
    w->req_cache[w->nreq_cache++] = r;
}

void gw_conn_cache_free(gw_worker_t *w)
{
    while (w->nreq_cache > 0)
        gw_req_kept_free(w->req_cache[--w->nreq_cache]);
    sl_gauge_add(gw_m.req_cached, -(int64_t)w->req_cache_shown);
    w->req_cache_shown = 0;
    w->req_cache_low = 0;
}

void gw_conn_cache_tick(gw_worker_t *w, bool all)
{
    /* half of what went unused: a load that swings from tick to tick keeps
     * most of its structs, an ended peak is gone in a few seconds (and at
     * once when the worker trims after it) */
    size_t n = all ? w->nreq_cache : (SL_MIN(w->req_cache_low, w->nreq_cache) + 1) / 2;
    if (n)
        sl_counter_add(gw_m.req_structs_freed, n);
    while (n-- > 0)
        gw_req_kept_free(w->req_cache[--w->nreq_cache]);
    w->req_cache_low = w->nreq_cache;
    sl_gauge_add(gw_m.req_cached, (int64_t)w->nreq_cache - (int64_t)w->req_cache_shown);
    w->req_cache_shown = w->nreq_cache;
}

/* A request's resources; the struct and what it keeps go to the worker's
 * cache. */
static void gw_req_free(gw_req_t *r)
{
    if (!r)
        return;
    gw_conn_t *c = r->c;
    if (r->json)
        json_decref(r->json);
    gw_body_blk_free(r->body_blk); /* a body cut short */
    r->body_blk = NULL;
    if (r->capture)
        evbuffer_free(r->capture);
    if (r->retry_ev)
        event_free(r->retry_ev);
    gw_rt_unref(r->rt);
    if (c && r->body) {
        gw_req_cache_put(c->w, r);
        return;
    }
    gw_req_kept_free(r);
}

struct event_base *gw_conn_base(const gw_conn_t *c)
{
    return c->w->base;
}

struct gw_h2_mem **gw_conn_h2_mem(gw_conn_t *c)
{
    return &c->w->h2mem;
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
    if (gw_h1_batch.c == c) /* closed mid-read: nothing more is written */
        gw_h1_batch.c = NULL;
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
    gw_worker_t *w = c->w;
    event_free(c->timer);
    c->timer = NULL;
    gw_http_parser_free(c->parser);
    c->parser = NULL;
    if (!c->bev) { /* an h2 stream's: not in the list, no socket */
        gw_worker_defer_free(w, gw_conn_free_cb, c);
        return;
    }
    TAILQ_REMOVE(&w->conns, c, link);
    w->nconns--;
    sl_gauge_add(gw_m.conns_active, -1);
    gw_wio_fini(&c->wio);
    bufferevent_free(c->bev); /* libevent defers it if a callback is running */
    c->bev = NULL;
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
    gw_wio_set_read_mark(&c->wio, 0);
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

/* A reused struct's texts (gw_req.h): each one's first byte only; those
 * of r->tx are "" by the memset of tx_set, their lines untouched. */
static void gw_req_texts_clear(gw_req_t *r)
{
    r->id[0] = '\0';
    r->trace_id[0] = '\0';
    r->traceparent[0] = '\0';
}

static gw_req_t *gw_req_new(gw_conn_t *c)
{
    gw_worker_t *w = c->w;
    gw_req_t *r = w->nreq_cache ? w->req_cache[--w->nreq_cache] : NULL;
    struct evbuffer *body = NULL;
    if (w->nreq_cache < w->req_cache_low)
        w->req_cache_low = w->nreq_cache;
    if (r) {
        body = r->body;
        struct evbuffer *resp_body = r->resp_body;
        sl_buf_t held = {.p = r->held.p, .cap = r->held.cap}; /* empty, its block kept */
        struct event *up_timer = r->att.up_timer;
        int64_t up_armed_ms = r->att.up_armed_ms;
        char *tail = r->llm.tail;
        struct gw_body_scan *scan_kept = r->scan_kept;
        struct gw_sse *sse_kept = r->sse_kept;
        memset(r, 0, offsetof(gw_req_t, id));
        gw_req_texts_clear(r);
        r->sse_kept = sse_kept;
        r->resp_body = resp_body;
        r->held = held;
        r->att.up_timer = up_timer;
        r->att.up_armed_ms = up_armed_ms;
        r->llm.tail = tail;
        r->scan_kept = scan_kept;
    } else {
        r = calloc(1, sizeof(*r));
        if (!r)
            return NULL;
        sl_counter_add(gw_m.req_structs_new, 1);
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
    const gw_http_header_t *h = gw_http_header_get(gw_http_msg(r->c->parser), GW_HN_X_REQUEST_ID);
    if (h && h->value_len >= 8 && h->value_len < sizeof(r->id) &&
        strspn(h->value, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") ==
            h->value_len) {
        memcpy(r->id, h->value, h->value_len + 1);
        return;
    }
    gw_trace_put_hex16(r->id, gw_worker_rand(r->c->w)); /* was a loop a digit: ~130 */
    r->id[16] = '\0';
}

/* A large body over plain TCP wakes the loop per GW_BODY_STORE_READ bytes,
 * not per segment (reads averaged 4 KiB: a readv, an ioctl and an
 * epoll_wait each): SO_RCVLOWAT, never above the bytes still to come (the
 * socket would not wake again), back to 1 for the last of them. Raised only
 * when the socket ran dry with more than that to come (gw_conn_body_direct):
 * a body that is all there already costs no setsockopt. Not over TLS: bytes
 * OpenSSL already holds are not the socket's. */
static void gw_conn_body_lowat(gw_conn_t *c, int lowat)
{
    evutil_socket_t fd = c->bev && !c->tls ? bufferevent_getfd(c->bev) : -1;
    if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof(lowat)) == 0)
        c->req->body_lowat = lowat > 1;
}

static int gw_conn_body_cb(void *arg, const char *p, size_t n)
{
    gw_conn_t *c = arg;
    gw_req_t *r = c->req;
    if (r->body_blk) {
        /* a large body: into its block, which becomes r->body's one chain
         * when complete (body_store.h) */
        if (!gw_body_blk_add(r->body_blk, p, n))
            return -1; /* more than declared: the parser frames by length */
        if (r->body_lowat && gw_body_blk_left(r->body_blk) <= GW_BODY_STORE_READ)
            gw_conn_body_lowat(c, 1);
        if (gw_body_blk_full(r->body_blk)) {
            if (gw_body_blk_give(r->body_blk, r->body) != 0)
                return -1;
            r->body_blk = NULL;
        }
        return 0;
    }
    return evbuffer_add(r->body, p, n);
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
        SSL *ssl = c->wio.ssl;
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

/* A whole request (head and body) was read: it goes to its route. */
static void gw_conn_dispatch(gw_conn_t *c)
{
    gw_conn_disarm(c);
    c->phase = GW_PHASE_BUSY;
    c->nrequests++;
    gw_req_set_id(c->req);
    gw_route_dispatch(c->req);
}

/* The parser refused the request: answered with its status and reason,
 * counted by reason. */
SL_COLD static void gw_conn_parse_error(gw_conn_t *c)
{
    int status = gw_http_error_status(c->parser);
    const char *reason = gw_http_error_reason(c->parser);
    sl_counter_add(sl_metric_series1(gw_m.parse_errors, reason), 1);
    char msg[160];
    snprintf(msg, sizeof(msg), "malformed request: %s", reason);
    c->phase = GW_PHASE_BUSY;
    c->req->error_kind = "bad_request";
    snprintf(c->req->id, sizeof(c->req->id), "%016llx", (unsigned long long)gw_worker_rand(c->w));
    gw_respond_error(c->req, status, status >= 500 ? "server_error" : "invalid_request_error",
                     gw_parse_code(status), msg);
}

/* The rest of a large body straight from the socket into its block: a
 * recv per burst instead of libevent 2.1's reads of at most 4 KiB
 * (EVBUFFER_MAX_READ: a readv, a FIONREAD ioctl and a loop turn each),
 * and no copy (the body callback finds the bytes in place). Plain TCP
 * only, and only once libevent's input is empty, so the bytes keep their
 * order; never past the body (a pipelined request stays in the socket).
 * EOF and errors are left to the bufferevent's next read. */
static gw_http_state_t gw_conn_body_direct(gw_conn_t *c, size_t *used)
{
    gw_http_state_t st = GW_HTTP_NEED_MORE;
    evutil_socket_t fd = c->tls || !c->bev ? -1 : bufferevent_getfd(c->bev);
    while (fd >= 0 && st == GW_HTTP_NEED_MORE && c->req->body_blk) {
        size_t room;
        char *tail = gw_body_blk_tail(c->req->body_blk, &room);
        ssize_t n = tail ? recv(fd, tail, room, MSG_DONTWAIT) : 0;
        if (n <= 0)
            break;
        size_t k = 0;
        st = gw_http_feed(c->parser, tail, (size_t)n, &k, gw_conn_body_cb, c);
        *used += k;
    }
    /* dry with much still to come: wake when there is a useful read */
    if (fd >= 0 && st == GW_HTTP_NEED_MORE && c->req->body_blk && !c->req->body_lowat &&
        gw_body_blk_left(c->req->body_blk) > GW_BODY_STORE_READ)
        gw_conn_body_lowat(c, (int)GW_BODY_STORE_READ);
    return st;
}

typedef struct gw_conn_head {
    gw_conn_t *c;
    int64_t now_ms; /* 0 until read */
} gw_conn_head_t;

/* The head is complete (gw_http_head_cb, called inside the feed, the
 * head's bytes still in the input): the body's deadline and store. 0: the
 * feed goes on with the body in the same pass; 1 when a 100 Continue was
 * written (a write may read, so the input is left alone until the feed
 * has drained it). */
static int gw_conn_head(void *arg)
{
    gw_conn_head_t *h = arg;
    gw_conn_t *c = h->c;
    const gw_http_msg_t *m = gw_http_msg(c->parser);
    c->phase = GW_PHASE_BODY;
    if (!h->now_ms)
        h->now_ms = sl_now_ms();
    gw_conn_arm_at(c, c->w->rt->conf->limits.body_timeout_ms, h->now_ms);
    if (!m->chunked && m->content_length >= GW_BODY_STORE_MIN &&
        evbuffer_get_length(c->req->body) == 0) {
        c->req->body_blk = gw_body_blk_new((size_t)m->content_length);
    }
    if (m->expect_continue && (m->chunked || m->content_length > 0)) {
        bufferevent_write(c->bev, GW_LIT("HTTP/1.1 100 Continue\r\n\r\n"));
        gw_wio_added(&c->wio);
        return 1;
    }
    return 0;
}

static void gw_conn_parse(gw_conn_t *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    const conf_limits_t *lim = &c->w->rt->conf->limits;
    /* One clock read for the deadlines armed in this call (microseconds
     * apart): the new request's start, else read when first needed. */
    int64_t now_ms = 0;
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
            now_ms = c->req->start_ns / 1000000;
            if (c->nrequests > 0) /* the first request's deadline runs from accept */
                gw_conn_arm_at(c, lim->header_timeout_ms, now_ms);
        }
        size_t used = 0;
        gw_conn_head_t h = {c, now_ms};
        const gw_http_feed_cbs_t cbs = {gw_conn_head, &h, gw_conn_body_cb, c};
        gw_http_state_t st = gw_http_feed_evbuffer_cbs(c->parser, in, &used, &cbs);
        now_ms = h.now_ms;
        if (st == GW_HTTP_NEED_MORE && c->req->body_blk && evbuffer_get_length(in) == 0)
            st = gw_conn_body_direct(c, &used);
        c->req->bytes_in += used;
        sl_counter_add(gw_m.bytes_client_in, used);
        switch (st) {
        case GW_HTTP_NEED_MORE:
            return; /* the input is used up */
        case GW_HTTP_HEAD:
            break; /* 100 Continue went out: the body comes in the next pass */
        case GW_HTTP_DONE: {
            const gw_http_msg_t *m = gw_http_msg(c->parser);
            if (!m->keep_alive || (int64_t)c->nrequests + 1 >= lim->keepalive_requests)
                c->close_after = true;
            gw_conn_dispatch(c);
            return;
        }
        case GW_HTTP_ERROR:
            c->close_after = true;
            c->linger = true; /* the rest of the request is unread */
            gw_conn_parse_error(c);
            return;
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
    /* Bytes pipelined while a request is served wait in the input; at the
     * read high-watermark reading stops here, not only by libevent's
     * suspension: libevent 2.1.12 re-runs this callback at once, over and
     * over, while the input is at its mark and reading is enabled, and a
     * busy connection takes nothing from it (a worker at 100 % CPU until
     * the answer was done). Reading resumes when the request ends
     * (gw_conn_req_done); a client leaving meanwhile is noticed then, as
     * with the suspension. */
    if (!c->closed && c->phase == GW_PHASE_BUSY &&
        evbuffer_get_length(bufferevent_get_input(bev)) >= GW_CONN_READ_HWM)
        bufferevent_disable(bev, EV_READ);
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

/* Returns the time it counted the request at, for the caller's next
 * deadline (one clock read for the end of a request). */
static int64_t gw_req_count(gw_req_t *r)
{
    int cls = r->status >= 100 && r->status < 600 ? r->status / 100 : 5;
    /* A client that left is not a 4xx of ours: its own value (nginx's 499). */
    int proto = r->c->h2_stream ? 1 : 0;
    sl_counter_add(r->status == 499 ? gw_m.requests_499[r->route][proto]
                                    : gw_m.requests[r->route][cls][proto],
                   1);
    int64_t now_ns = sl_now_ns();
    gw_llm_req_end(r, now_ns); /* per model; a JSON answer's TTFT is taken here */
    sl_histogram_observe(gw_m.duration[r->route], (double)(now_ns - r->start_ns) / 1e9);
    return now_ns;
}

void gw_conn_req_done(gw_conn_t *c)
{
    gw_req_t *r = c->req;
    gw_hooks_end(r, GW_END_DONE);
    int64_t now_ms = gw_req_count(r) / 1000000;
    gw_accesslog_write(r);
    gw_req_free(r);
    c->req = NULL;
    if (c->h2_stream) {
        /* One request per stream: h2.c ends the stream, and closes c or
         * keeps it for the connection's next stream (gw_conn_stream_reuse). */
        gw_conn_disarm(c);
        c->phase = GW_PHASE_IDLE;
        void (*fn)(void *) = c->on_close;
        c->on_close = NULL;
        if (fn)
            fn(c->on_close_arg);
        else
            gw_conn_close(c);
        return;
    }
    if (c->close_after || c->w->draining) {
        gw_conn_close_after_flush(c);
        return;
    }
    c->phase = GW_PHASE_IDLE;
    gw_http_parser_reset(c->parser);
    if (c->out_watched) { /* the relay's backpressure watch (gw_h1_watch) */
        bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
        c->out_watched = false;
    }
    gw_conn_arm_at(c, c->w->rt->conf->limits.keepalive_timeout_ms, now_ms);
    if (!(bufferevent_get_enabled(c->bev) & EV_READ))
        bufferevent_enable(c->bev, EV_READ); /* stopped at the mark (gw_conn_readcb) */
    /* Pipelined bytes already here: parse them on the next loop turn (not
     * now: we may be deep in an upstream callback). */
    if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
        bufferevent_trigger(c->bev, EV_READ, BEV_OPT_DEFER_CALLBACKS);
}

/* ---- h2 streams (h2.c) ------------------------------------------------------ */

gw_conn_t *gw_conn_new_stream(gw_worker_t *w, const gw_out_ops_t *ops, void *arg, const char *peer,
                              bool tls)
{
    gw_conn_t *c = gw_conn_alloc();
    if (!c)
        return NULL;
    c->w = w;
    c->out = ops;
    c->out_arg = arg;
    c->tls = tls;
    c->h2_stream = true;
    c->close_after = true;
    snprintf(c->peer, sizeof(c->peer), "%s", peer ? peer : "");
    c->parser = gw_conn_parser_new(&w->rt->conf->limits);
    c->timer = evtimer_new(w->base, gw_conn_timer_cb, c);
    c->req = c->parser && c->timer ? gw_req_new(c) : NULL;
    if (!c->req) {
        gw_http_parser_free(c->parser);
        if (c->timer)
            event_free(c->timer);
        free(c);
        return NULL;
    }
    c->phase = GW_PHASE_HEAD;
    return c;
}

gw_conn_t *gw_conn_stream_reuse(gw_conn_t *c, void *arg)
{
    gw_http_parser_reset(c->parser);
    c->out_arg = arg;
    c->req = gw_req_new(c); /* the last request's struct and body buffer, as keep-alive does */
    if (!c->req) {
        gw_conn_close(c);
        return NULL;
    }
    c->phase = GW_PHASE_HEAD;
    return c;
}

void gw_conn_stream_fed(gw_conn_t *c, gw_http_state_t st, size_t bytes)
{
    if (c->closed || !c->req || (c->phase != GW_PHASE_HEAD && c->phase != GW_PHASE_BODY))
        return;
    c->req->bytes_in += bytes;
    switch (st) {
    case GW_HTTP_NEED_MORE:
        return;
    case GW_HTTP_HEAD:
        if (c->phase == GW_PHASE_HEAD) {
            c->phase = GW_PHASE_BODY;
            gw_conn_arm(c, c->w->rt->conf->limits.body_timeout_ms);
        }
        return;
    case GW_HTTP_DONE:
        gw_conn_dispatch(c);
        return;
    case GW_HTTP_ERROR:
        gw_conn_disarm(c);
        gw_conn_parse_error(c);
        return;
    }
}

void gw_conn_stream_body(gw_conn_t *c, const char *p, size_t n, bool end)
{
    if (c->closed || c->phase != GW_PHASE_BODY)
        return; /* answered already (413, 400, ...) or dispatched: the rest is dropped */
    gw_conn_stream_fed(c, gw_http_load_body(c->parser, p, n, end, gw_conn_body_cb, c), n);
}

void gw_conn_out_drained(gw_conn_t *c)
{
    if (!c->closed && c->phase == GW_PHASE_BUSY && c->req)
        gw_proxy_client_drained(c->req);
}

/* ---- the output interface ---------------------------------------------------- */

void gw_out_head_begin(gw_req_t *r, int status, gw_sb_t *b)
{
    r->c->out->head_begin(r->c, r, status, b);
}

void gw_out_head_end(gw_req_t *r, gw_sb_t *b, int64_t length)
{
    r->bytes_out += r->c->out->head_end(r->c, r, b, length);
    r->head_sent = true;
}

void gw_out_head_end_body(gw_req_t *r, gw_sb_t *b, const void *p, size_t n)
{
    const gw_out_ops_t *o = r->c->out;
    if (o->head_end_body) {
        r->bytes_out += o->head_end_body(r->c, r, b, p, n);
        r->head_sent = true;
        return;
    }
    gw_out_head_end(r, b, (int64_t)n);
    if (n)
        gw_out_data(r, p, n);
}

void gw_out_data(gw_req_t *r, const void *p, size_t n)
{
    r->bytes_out += r->c->out->data(r->c, r, p, n);
}

void gw_out_data_buffer(gw_req_t *r, struct evbuffer *buf, size_t len)
{
    ssize_t n = r->c->out->data_buffer ? r->c->out->data_buffer(r->c, r, buf, len) : -1;
    if (n >= 0) {
        r->bytes_out += (size_t)n;
        return;
    }
    if (len)
        gw_out_data(r, evbuffer_pullup(buf, -1), len);
    evbuffer_drain(buf, len);
}

void gw_out_end(gw_req_t *r)
{
    r->bytes_out += r->c->out->end(r->c, r);
}

void gw_out_abort(gw_req_t *r)
{
    r->c->out->abort(r->c);
}

size_t gw_out_pending(const gw_req_t *r)
{
    return r->c->out->pending(r->c);
}

void gw_out_watch(gw_req_t *r, size_t low)
{
    r->c->out->watch(r->c, low);
}

void gw_out_write_now(gw_req_t *r)
{
    if (r->c->out->write_now)
        r->c->out->write_now(r->c);
}

void gw_out_batch_begin(gw_req_t *r)
{
    if (r->c->out->batch)
        r->c->out->batch(r->c, r, true);
}

void gw_out_batch_end(gw_req_t *r)
{
    if (r->c->out->batch)
        r->c->out->batch(r->c, r, false);
}

/* HTTP/1.1: straight into the connection's output buffer (wio.c writes it
 * at the end of the loop turn). The head's status line is written by
 * _begin, the caller's lines follow, _end adds the framing. */

/* Queues what c's batch gathered, as one chunk. */
static void gw_h1_batch_flush(gw_conn_t *c)
{
    gw_h1_batch_t *b = &gw_h1_batch;
    if (b->c != c || b->len == 0)
        return;
    /* the size line, written backwards into the room before the bytes */
    char *start = b->buf + GW_H1_BATCH_HEAD;
    *--start = '\n';
    *--start = '\r';
    start = gw_hex_back(start, b->len);
    memcpy(b->buf + GW_H1_BATCH_HEAD + b->len, "\r\n", 2);
    size_t head = (size_t)(b->buf + GW_H1_BATCH_HEAD - start);
    size_t n = head + b->len + 2;
    evbuffer_add(bufferevent_get_output(c->bev), start, n);
    gw_wio_added(&c->wio);
    sl_counter_add(gw_m.bytes_client_out, n);
    b->r->bytes_out += head + 2; /* the body bytes were counted by data() */
    b->len = 0;
}

static void gw_h1_batch_set(gw_conn_t *c, gw_req_t *r, bool on)
{
    gw_h1_batch_t *b = &gw_h1_batch;
    if (b->c)
        gw_h1_batch_flush(b->c);
    b->c = on ? c : NULL;
    b->r = r;
    b->len = 0;
}

/* Into c's batch: true when taken (chunked framing only). */
static bool gw_h1_batch_add(gw_conn_t *c, gw_req_t *r, const void *p, size_t n)
{
    gw_h1_batch_t *b = &gw_h1_batch;
    if (b->c != c || !r->chunked_out || n > GW_H1_BATCH_BYTES)
        return false;
    if (b->len + n > GW_H1_BATCH_BYTES)
        gw_h1_batch_flush(c);
    memcpy(b->buf + GW_H1_BATCH_HEAD + b->len, p, n);
    b->len += n;
    return true;
}
static void gw_h1_head_begin(gw_conn_t *c, gw_req_t *r, int status, gw_sb_t *b)
{
    (void)c;
    (void)r;
    gw_sb_lit(b, "HTTP/1.1 ");
    gw_sb_u64(b, (uint64_t)status);
    gw_sb_lit(b, " ");
    gw_sb_str(b, gw_http_status_text(status));
    gw_sb_lit(b, "\r\n");
}

/* The status line, the caller's lines and these in one evbuffer_add; with
 * a body p (Content-Length n) that fits b's stack, the body too: a held
 * answer's head and body in one add, not an add and a chain move. */
static size_t gw_h1_head_finish(gw_conn_t *c, gw_req_t *r, gw_sb_t *b, int64_t length,
                                const void *p, size_t n)
{
    gw_h1_batch_flush(c);
    if (c->w->draining)
        c->close_after = true;
    if (length >= 0) {
        gw_sb_lit(b, "Content-Length: ");
        gw_sb_u64(b, (uint64_t)length);
        gw_sb_lit(b, "\r\n");
    } else if (length == -1) {
        const gw_http_msg_t *cm = gw_http_msg(c->parser);
        if (cm && cm->http_minor >= 1) {
            gw_sb_lit(b, "Transfer-Encoding: chunked\r\n");
            r->chunked_out = true;
        } else {
            c->close_after = true; /* HTTP/1.0: the close ends the body */
        }
    }
    if (c->close_after)
        gw_sb_lit(b, "Connection: close\r\n");
    size_t dl;
    const char *date = gw_date_header(&dl);
    gw_sb_add(b, date, dl);
    gw_sb_lit(b, "\r\n");
    struct evbuffer *out = bufferevent_get_output(c->bev);
    bool inline_body = n && !b->heap && b->n + n <= b->cap;
    if (inline_body)
        gw_sb_add(b, p, n);
    size_t sent = gw_sb_flush(b, out);
    if (n && !inline_body && sent && evbuffer_add(out, p, n) == 0)
        sent += n;
    gw_wio_added(&c->wio);
    sl_counter_add(gw_m.bytes_client_out, sent);
    return sent;
}

static size_t gw_h1_head_end(gw_conn_t *c, gw_req_t *r, gw_sb_t *b, int64_t length)
{
    return gw_h1_head_finish(c, r, b, length, NULL, 0);
}

static size_t gw_h1_head_end_body(gw_conn_t *c, gw_req_t *r, gw_sb_t *b, const void *p, size_t n)
{
    return gw_h1_head_finish(c, r, b, (int64_t)n, p, n);
}

static size_t gw_h1_data(gw_conn_t *c, gw_req_t *r, const void *p, size_t n)
{
    if (gw_h1_batch_add(c, r, p, n))
        return n; /* the framing is counted when the batch is queued */
    gw_h1_batch_flush(c);
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (r->chunked_out) {
        /* An event is typically a few hundred bytes: frame it in one piece. */
        char stack[4096];
        gw_sb_t b;
        gw_sb_init(&b, stack, sizeof(stack));
        gw_sb_hex(&b, n);
        gw_sb_lit(&b, "\r\n");
        if (n <= sizeof(stack) - 32) {
            gw_sb_add(&b, p, n);
            gw_sb_lit(&b, "\r\n");
            n = gw_sb_flush(&b, out);
        } else {
            size_t k = gw_sb_flush(&b, out);
            evbuffer_add(out, p, n);
            evbuffer_add(out, GW_LIT("\r\n"));
            n += k + 2;
        }
    } else {
        evbuffer_add(out, p, n);
    }
    gw_wio_added(&c->wio);
    sl_counter_add(gw_m.bytes_client_out, n);
    return n;
}

/* A body of known length: buf's chains become the output's (one
 * evbuffer_add_buffer, no copy, no drain of buf). */
static ssize_t gw_h1_data_buffer(gw_conn_t *c, gw_req_t *r, struct evbuffer *buf, size_t n)
{
    gw_h1_batch_flush(c);
    if (r->chunked_out || evbuffer_add_buffer(bufferevent_get_output(c->bev), buf) != 0)
        return -1;
    gw_wio_added(&c->wio);
    sl_counter_add(gw_m.bytes_client_out, n);
    return (ssize_t)n;
}

static size_t gw_h1_end(gw_conn_t *c, gw_req_t *r)
{
    gw_h1_batch_flush(c);
    if (!r->chunked_out)
        return 0;
    evbuffer_add(bufferevent_get_output(c->bev), GW_LIT("0\r\n\r\n"));
    gw_wio_added(&c->wio);
    sl_counter_add(gw_m.bytes_client_out, 5);
    return 5;
}

static void gw_h1_abort(gw_conn_t *c)
{
    gw_h1_batch_flush(c);  /* what came before the cut still goes out */
    c->close_after = true; /* a short body + close is the only signal */
}

static size_t gw_h1_pending(const gw_conn_t *c)
{
    size_t gathered = gw_h1_batch.c == c ? gw_h1_batch.len : 0;
    return evbuffer_get_length(bufferevent_get_output(c->bev)) + gathered;
}

static void gw_h1_watch(gw_conn_t *c, size_t low)
{
    bufferevent_setwatermark(c->bev, EV_WRITE, low, 0);
    c->out_watched = low != 0;
}

static void gw_h1_write_now(gw_conn_t *c)
{
    gw_h1_batch_flush(c);
    gw_wio_write_now(&c->wio);
}

static const gw_out_ops_t gw_out_h1 = {
    .head_begin = gw_h1_head_begin,
    .head_end = gw_h1_head_end,
    .head_end_body = gw_h1_head_end_body,
    .data = gw_h1_data,
    .end = gw_h1_end,
    .abort = gw_h1_abort,
    .pending = gw_h1_pending,
    .watch = gw_h1_watch,
    .write_now = gw_h1_write_now,
    .data_buffer = gw_h1_data_buffer,
    .batch = gw_h1_batch_set,
};
