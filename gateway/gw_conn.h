/*
 * gw_conn.h — a client connection (conn.c): reading and framing requests,
 * deadlines, keep-alive, and closing at a safe point.
 */
#ifndef GW_CONN_H
#define GW_CONN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include <event2/bufferevent.h>
#include <event2/event.h>

#include "gateway/gw_types.h"
#include "gateway/gw_wio.h"
#include "gateway/http1.h"
#include "gateway/sb.h"

/* The answer's way out: how a request writes its client's answer, whatever
 * the framing. conn.c implements it for HTTP/1.1 (a status line, header
 * lines, Content-Length or chunked, into the socket's bufferevent) and h2.c
 * for a stream (HEADERS and DATA frames submitted to nghttp2 directly, the
 * body read from the stream's own buffer). Callers use the gw_out_*
 * wrappers below, which keep r's counters. */
typedef struct gw_out_ops {
    /* Starts the head in the caller's builder b, which the caller then
     * appends header lines to ("Name: value\r\n", HTTP/1.1 syntax, never
     * framing headers). HTTP/1.1 puts its status line in b first, so the
     * whole head reaches the socket's buffer in one add (each add runs the
     * buffer's callbacks). */
    void (*head_begin)(gw_conn_t *c, gw_req_t *r, int status, gw_sb_t *b);
    /* Ends it: framing from length (>= 0: Content-Length; -1: unknown, so
     * chunked or until close; -2: no body), Date. Takes b's bytes (it may
     * rewrite them: h2 lower-cases the names) and empties b. Returns the
     * bytes queued. */
    size_t (*head_end)(gw_conn_t *c, gw_req_t *r, gw_sb_t *b, int64_t length);
    /* Optional: head_end with Content-Length n and the whole body p, in
     * the same add when they fit b's stack. Returns the bytes queued. */
    size_t (*head_end_body)(gw_conn_t *c, gw_req_t *r, gw_sb_t *b, const void *p, size_t n);
    /* Body bytes, sent as soon as the client takes them (an SSE event is
     * flushed in the loop turn of the read that completed it; within a
     * batch its framing comes when the batch is queued). Returns the bytes
     * queued, framing included. */
    size_t (*data)(gw_conn_t *c, gw_req_t *r, const void *p, size_t n);
    /* The body is complete (a chunked body's last chunk). */
    size_t (*end)(gw_conn_t *c, gw_req_t *r);
    /* The answer cannot be completed (cut after its head): the client must
     * not take it as whole (HTTP/1.1: close after it; h2: RST_STREAM). */
    void (*abort)(gw_conn_t *c);
    /* Answer bytes queued that the client has not taken yet (backpressure). */
    size_t (*pending)(const gw_conn_t *c);
    /* Call gw_conn_out_drained() once pending() falls to low (0: stop). */
    void (*watch)(gw_conn_t *c, size_t low);
    /* Optional: write what is queued now, ahead of the loop turn's flush
     * (HTTP/1.1: gw_wio_write_now); the flush still runs the callbacks. */
    void (*write_now)(gw_conn_t *c);
    /* Optional: data() of all of buf's bytes, moved (buf is left empty):
     * HTTP/1.1 with a known length hands buf's chains to the socket's
     * buffer (evbuffer_add_buffer) instead of copying them and draining
     * buf. n is buf's length (the caller's: asked once). -1: not taken
     * (buf untouched), the caller copies. Else as data(). */
    ssize_t (*data_buffer)(gw_conn_t *c, gw_req_t *r, struct evbuffer *buf, size_t n);
    /* Optional: on, data() calls may be gathered (HTTP/1.1: into one
     * chunk, one add to the socket's buffer) until off, which queues them;
     * every other op queues what was gathered first. */
    void (*batch)(gw_conn_t *c, gw_req_t *r, bool on);
} gw_out_ops_t;

/* Hot first: the direct writer's line (gw_wio_t, first: see gw_wio.h),
 * then what each request reads and writes, then what only a connection's
 * start and end (or TLS, h2, a lingering close) need. Allocated
 * line-aligned (gw_conn_alloc, conn.c). */
struct gw_conn {
    gw_wio_t wio;
    const gw_out_ops_t *out; /* the answer's framing (gw_out_h1, or h2.c's for a stream) */
    gw_http_parser_t *parser;
    gw_req_t *req;
    gw_conn_phase_t phase;
    bool closed;      /* freed at the next safe point */
    bool close_after; /* Connection: close after this response */
    bool out_watched; /* gw_h1_watch set a write low-watermark: reset at the request's end */
    bool h2_stream;   /* one stream's request connection (protocol "h2"), see h2 below */
    gw_worker_t *w;
    struct bufferevent *bev;
    struct event *timer;
    int64_t deadline_ms; /* the current deadline (monotonic), 0 = none */
    int64_t armed_ms;    /* when the timer is set to fire, 0 = not armed */
    unsigned nrequests;
    bool linger;    /* request bytes may be unread: lingering close (conn.c) */
    bool lingering; /* write side shut, draining input until EOF or deadline */
    bool tls;
    bool admin;
    /* HTTP/2 (h2.c): the connection itself, after ALPN or the preface... */
    struct gw_h2 *h2;
    bool h2c;      /* plain listener with h2c: true: the preface switches to h2 */
    void *out_arg; /* the implementation's (h2.c: the stream) */
    size_t linger_bytes;
    /* Called once from gw_conn_close, or from gw_conn_req_done for an h2
     * stream's (the stream connection's owner, h2.c). */
    void (*on_close)(void *arg);
    void *on_close_arg;
    TAILQ_ENTRY(gw_conn) link;
    char peer[64];
};
TAILQ_HEAD(gw_conn_list, gw_conn);
_Static_assert(offsetof(struct gw_conn, wio) == 0, "gw_conn: its gw_wio_t first (gw_wio.h)");

/* conn.c */
void gw_conn_accept(gw_worker_t *w, int fd, const struct sockaddr *sa, int salen,
                    gw_listen_rt_t *l);
/* A connection on an existing bufferevent (takes it; freed on failure):
 * one end of a bufferevent_pair in the socketless tests. NULL on OOM. */
gw_conn_t *gw_conn_new_bev(gw_worker_t *w, struct bufferevent *bev, bool admin, const char *peer);
void gw_conn_close(gw_conn_t *c);
/* Frees the request structs the worker keeps for reuse (conn.c). */
void gw_conn_cache_free(gw_worker_t *w);
/* The worker's tick: frees the cached structs that none of the requests
 * since the last tick needed (all of them with all = true). */
void gw_conn_cache_tick(gw_worker_t *w, bool all);
/* For h2.c (same layer, no worker internals): c's loop, the conf of the
 * runtime its worker serves now, and a free at the worker's next safe point. */
struct event_base *gw_conn_base(const gw_conn_t *c);
/* The worker's nghttp2 block pool slot (h2_mem.c), for c's h2 session. */
struct gw_h2_mem **gw_conn_h2_mem(gw_conn_t *c);
const struct conf *gw_conn_conf(const gw_conn_t *c);
void gw_conn_defer_free(gw_conn_t *c, void (*fn)(void *), void *obj);
/* h2.c: a stream's request connection, with no socket of its own: its
 * answer goes out through ops (arg for them), its request head is loaded
 * from decoded fields (gw_http_load_*) into c->parser, then
 * gw_conn_stream_fed(). It is not in the worker's connection list (the h2
 * connection is); the request struct exists at once (c->req). */
gw_conn_t *gw_conn_new_stream(gw_worker_t *w, const gw_out_ops_t *ops, void *arg, const char *peer,
                              bool tls);
/* A stream connection whose request is done (c->on_close was called from
 * gw_conn_req_done, c not closed), made ready for another stream's request
 * (arg for the ops): its parser, timer, request struct and body buffer are
 * reused. NULL on OOM (c is closed). */
gw_conn_t *gw_conn_stream_reuse(gw_conn_t *c, void *arg);
/* What the last gw_http_load_* on c->parser returned: HEAD arms the body
 * deadline, DONE dispatches the request (route, hooks, proxy, exactly as
 * HTTP/1.1), ERROR answers 4xx as a parse error does. */
void gw_conn_stream_fed(gw_conn_t *c, gw_http_state_t st, size_t bytes);
/* A stream's DATA (end: END_STREAM): through gw_http_load_body (limits,
 * Content-Length) into the request's body, then as gw_conn_stream_fed. */
void gw_conn_stream_body(gw_conn_t *c, const char *p, size_t n, bool end);
/* The answer's pending bytes fell to the watched level (backpressure off). */
void gw_conn_out_drained(gw_conn_t *c);

/* The output interface, for the request's writers (respond.c, proxy.c). */
void gw_out_head_begin(gw_req_t *r, int status, gw_sb_t *b);
void gw_out_head_end(gw_req_t *r, gw_sb_t *b, int64_t length);
/* gw_out_head_end with Content-Length n, then the whole body p (borrowed,
 * copied before the call returns). */
void gw_out_head_end_body(gw_req_t *r, gw_sb_t *b, const void *p, size_t n);
void gw_out_data(gw_req_t *r, const void *p, size_t n);
/* gw_out_data of all of buf's len bytes (len: its length); buf is left empty
 * (moved where the framing allows, else copied and drained). */
void gw_out_data_buffer(gw_req_t *r, struct evbuffer *buf, size_t len);
void gw_out_end(gw_req_t *r);
void gw_out_abort(gw_req_t *r);
size_t gw_out_pending(const gw_req_t *r);
void gw_out_watch(gw_req_t *r, size_t low);
void gw_out_write_now(gw_req_t *r);
/* The gw_out_data calls between _begin and _end may reach the output as one
 * piece (HTTP/1.1: one chunk, one add), queued by _end at the latest: the
 * events of one upstream read, still all written in the read's loop turn.
 * One batch at a time per thread; nothing else may run in between that
 * writes to another connection. */
void gw_out_batch_begin(gw_req_t *r);
void gw_out_batch_end(gw_req_t *r);

/* The current request is finished: log, count, then keep-alive or close. */
void gw_conn_req_done(gw_conn_t *c);
/* Drain: close if idle, else close after the current response. */
void gw_conn_drain(gw_conn_t *c);
/* An error before a request object exists (parse errors): answer and close. */
void gw_conn_respond_error(gw_conn_t *c, int status, const char *code, const char *message) SL_COLD;

/* accesslog.c: one JSON line per finished request, written by the connection
 * when it is done with a request. */
int gw_accesslog_open(const char *target, char *err, size_t errlen);
/* SIGUSR1: opens the file again at its path (logrotate moved it); no-op for
 * stdout or off. Main thread only. */
int gw_accesslog_reopen(char *err, size_t errlen);
void gw_accesslog_write(const gw_req_t *r);

#endif
