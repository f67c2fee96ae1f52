/*
 * gw_h2.h — HTTP/2 on a client connection (h2.c): nghttp2 behind a small
 * adapter. A connection becomes h2 after ALPN picked "h2" (TLS) or after
 * the client's preface on an h2c listener; each stream is then one request
 * on its own stream connection (conn.c), so it goes through exactly the
 * path of an HTTP/1.1 request: limits, route, hooks, proxy, access log and
 * metrics.
 */
#ifndef GW_H2_H
#define GW_H2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sl.h"
#include "gateway/gw_types.h"

typedef struct gw_h2 gw_h2_t;

/* The client's connection preface, RFC 9113 3.4. */
#define GW_H2_PREFACE     "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define GW_H2_PREFACE_LEN 24

/* Makes c an h2 connection: c keeps its bufferevent and its place in the
 * worker's list; its callbacks go to h2 from now on. Bytes already read
 * (the preface) are left in the input and parsed at once. -1 on OOM (the
 * caller closes c). */
int gw_h2_start(gw_conn_t *c) SL_WUR;
/* Called by conn.c for an h2 connection. */
void gw_h2_read(gw_h2_t *h);
void gw_h2_written(gw_h2_t *h);
/* Drain / reload: GOAWAY, open streams finish, then close. */
void gw_h2_drain(gw_h2_t *h);
/* The connection is closing: resets and closes every stream. */
void gw_h2_free(gw_h2_t *h);

/* Counters for /metrics (all workers). */
typedef enum gw_h2_event {
    GW_H2_EV_CONNS = 0,      /* h2 connections accepted */
    GW_H2_EV_STREAMS,        /* streams that became requests */
    GW_H2_EV_RST_RECV,       /* RST_STREAM from clients */
    GW_H2_EV_RAPID_RESET,    /* GOAWAY ENHANCE_YOUR_CALM for resets */
    GW_H2_EV_FLOOD,          /* GOAWAY for SETTINGS/PING/... floods (nghttp2's limits) */
    GW_H2_EV_HEADERS_LARGE,  /* header list over http2.max_header_list */
    GW_H2_EV_REFUSED,        /* streams refused (max_concurrent_streams) */
    GW_H2_EV_PROTOCOL_ERROR, /* connections ended for a malformed frame */
    GW_H2_EV_COUNT
} gw_h2_event_t;

#endif
