/*
 * gw_proxy.h — an attempt on an upstream (proxy.c): send, the SSE relay,
 * abort and finish; and in-process answers (engine_gw.c) through the same
 * hooks. The way there (hooks, model route) is gw_flow.h.
 */
#ifndef GW_PROXY_H
#define GW_PROXY_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "gateway/gw_types.h"
#include "gateway/sse.h"

/* proxy.c */
/* The first attempt of a request that is through every hook (flow.c). */
void gw_proxy_send_attempt(gw_req_t *r);
/* Client went away or conn is closing: stop everything upstream. */
void gw_proxy_abort(gw_req_t *r);
/* proxy.c: the next attempt (now, or after delay_ms) on r->pool. */
void gw_proxy_next_attempt(gw_req_t *r, int64_t delay_ms);
/* proxy.c: answers made in-process (the engine), through the same hooks. */
void gw_proxy_local_stream_begin(gw_req_t *r);
/* -1: a hook ended the stream (stop generating, then _end). */
int gw_proxy_local_stream_event(gw_req_t *r, const char *data, size_t len);
/* error_code NULL: a clean end (the caller sent [DONE] as an event). */
void gw_proxy_local_stream_end(gw_req_t *r, const char *error_code, const char *error_msg);
void gw_proxy_local_body(gw_req_t *r, json_t *body);
/* A whole local answer: 200, body (len bytes, borrowed) as ctype, with
 * extra ("" none) and the hooks' headers; when those cannot be built (out of
 * memory) extra alone, and the answer still goes out. */
void gw_proxy_local_answer(gw_req_t *r, const char *ctype, const char *body, size_t len,
                           const char *extra);
/* engine_gw.c: an attempt on a pool of kind engine. */
void gw_engine_attempt(gw_req_t *r);
/* Client output drained below the low watermark. */
void gw_proxy_client_drained(gw_req_t *r);

/* One attempt on an upstream: the pool and server it went to, its
 * connection, timers and deadlines, the status it got and the state of the
 * relay of its answer. Embedded in the request (r->att). */
struct gw_attempt {
    gw_pool_rt_t *pool;  /* the pool tried (the model's, or the local tier's) */
    gw_srv_rt_t *server; /* the server picked */
    gw_upconn_t *up;     /* its connection, NULL when none */
    int admit;           /* fb_admit_t: the breaker's admission taken */
    struct event *up_timer;
    int64_t up_due_ms;   /* the attempt's deadline; 0: none (proxy.c, gw_proxy_arm_at) */
    int64_t up_armed_ms; /* what up_timer is set for; 0: not pending. Kept with the
                          * timer across the requests of a cached struct (conn.c) */
    int64_t t_sent_ns, t_first_byte_ns;
    int64_t deadline_total_ms;
    int upstatus;  /* the upstream's status */
    bool resp_sse; /* it answered text/event-stream */
    gw_sse_t *sse; /* the SSE splitter of the relay */
    struct event *ping_ev;
    bool paused_upstream; /* backpressure: upstream reads off */
    bool head_setup_due;  /* gw_proxy_after_head runs at the end of this read */
};

/* How an upstream attempt failed; one row each in gw_upfails[] (proxy.c). */
typedef enum gw_upfail {
    GW_UPFAIL_CONNECT = 0,
    GW_UPFAIL_CONNECT_TLS,
    GW_UPFAIL_CONNECT_TIMEOUT,
    GW_UPFAIL_FIRST_BYTE_TIMEOUT,
    GW_UPFAIL_TOTAL_TIMEOUT,
    GW_UPFAIL_RESET,
    GW_UPFAIL_TRUNCATED,
    GW_UPFAIL_BAD_RESPONSE,
    GW_UPFAIL_STATUS_5XX,
    GW_UPFAIL_UNAVAILABLE,
    GW_UPFAIL_INTERNAL,
    GW_UPFAIL_COUNT
} gw_upfail_t;

typedef struct gw_upfail_row {
    const char *label;   /* sluice_upstream_errors_total{kind}, r->error_kind (static) */
    int fb_class;        /* fb_failure_t: how the retry policy classes it */
    int status;          /* our answer when the chain has nothing better (0: upstream's) */
    const char *code;    /* error.code of that answer */
    const char *message; /* error.message of that answer */
} gw_upfail_row_t;

extern const gw_upfail_row_t gw_upfails[GW_UPFAIL_COUNT];

#endif
