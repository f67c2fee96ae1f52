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

struct gw_conn {
    gw_worker_t *w;
    struct bufferevent *bev;
    gw_wio_t wio;
    bool tls;
    bool admin;
    bool closed; /* freed at the next safe point */
    char peer[64];
    gw_conn_phase_t phase;
    gw_http_parser_t *parser;
    gw_req_t *req;
    struct event *timer;
    int64_t deadline_ms; /* the current deadline (monotonic), 0 = none */
    int64_t armed_ms;    /* when the timer is set to fire, 0 = not armed */
    unsigned nrequests;
    bool close_after; /* Connection: close after this response */
    bool linger;      /* request bytes may be unread: lingering close (conn.c) */
    bool lingering;   /* write side shut, draining input until EOF or deadline */
    size_t linger_bytes;
    /* HTTP/2 (h2.c): the connection itself, after ALPN or the preface... */
    struct gw_h2 *h2;
    bool h2c;       /* plain listener with h2c: true: the preface switches to h2 */
    bool h2_stream; /* ...or one stream's request connection (protocol "h2") */
    /* Called once from gw_conn_close (the stream connection's owner). */
    void (*on_close)(void *arg);
    void *on_close_arg;
    TAILQ_ENTRY(gw_conn) link;
};
TAILQ_HEAD(gw_conn_list, gw_conn);

/* conn.c */
void gw_conn_accept(gw_worker_t *w, int fd, const struct sockaddr *sa, int salen,
                    gw_listen_rt_t *l);
/* A connection on an existing bufferevent (takes it; freed on failure):
 * one end of a bufferevent_pair in the socketless tests. NULL on OOM. */
gw_conn_t *gw_conn_new_bev(gw_worker_t *w, struct bufferevent *bev, bool admin, const char *peer);
void gw_conn_close(gw_conn_t *c);
/* Frees the request structs the worker keeps for reuse (conn.c). */
void gw_conn_cache_free(gw_worker_t *w);
/* For h2.c (same layer, no worker internals): c's loop, the conf of the
 * runtime its worker serves now, and a free at the worker's next safe point. */
struct event_base *gw_conn_base(const gw_conn_t *c);
const struct conf *gw_conn_conf(const gw_conn_t *c);
void gw_conn_defer_free(gw_conn_t *c, void (*fn)(void *), void *obj);
/* The current request is finished: log, count, then keep-alive or close. */
void gw_conn_req_done(gw_conn_t *c);
/* Drain: close if idle, else close after the current response. */
void gw_conn_drain(gw_conn_t *c);
/* An error before a request object exists (parse errors): answer and close. */
void gw_conn_respond_error(gw_conn_t *c, int status, const char *code, const char *message);

/* accesslog.c: one JSON line per finished request, written by the connection
 * when it is done with a request. */
int gw_accesslog_open(const char *target, char *err, size_t errlen);
/* SIGUSR1: opens the file again at its path (logrotate moved it); no-op for
 * stdout or off. Main thread only. */
int gw_accesslog_reopen(char *err, size_t errlen);
void gw_accesslog_write(const gw_req_t *r);

#endif
