/*
 * gw_req.h — a client request: what it asked, what the hooks learned, its
 * upstream attempt, its answer; plus the local answers (respond.c). The connection owns the struct
 * and reuses it for the next request on a keep-alive connection.
 */
#ifndef GW_REQ_H
#define GW_REQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>

#include "gateway/gw_hook.h"
#include "gateway/gw_types.h"
#include "gateway/sse.h"

struct gw_req {
    gw_conn_t *c;
    gw_rt_t *rt;
    char id[40];
    int64_t start_ns;
    gw_route_t route;
    void (*handler)(gw_req_t *r); /* the route's, after the pre-route hooks */
    struct evbuffer *body;        /* the client's body; reused for retries */
    json_t *json;                 /* parsed body (proxied routes) */
    const gw_model_rt_t *model;
    bool stream; /* client asked "stream": true */

    /* upstream side */
    gw_pool_rt_t *pool;
    gw_srv_rt_t *server;
    gw_upconn_t *up;
    int attempts;
    struct event *up_timer;
    int64_t t_sent_ns, t_first_byte_ns;
    int64_t deadline_total_ms, deadline_fb_ms;
    int upstatus;
    bool resp_sse;      /* upstream answered text/event-stream */
    bool head_sent;     /* our response head is out */
    bool chunked_out;   /* our response body uses chunked */
    bool upstream_done; /* upstream response complete */
    gw_sse_t *sse;
    bool pinged;
    bool got_event;
    struct event *ping_ev;
    bool paused_upstream; /* backpressure: upstream reads off */

    /* hooks and what they learned */
    gw_hooks_req_t hooks;
    char user[256];      /* the token's sub, "" without auth */
    char client_id[64];  /* the token's client, "" when unknown */
    char client_ip[48];  /* the client's address (X-Forwarded-For from trusted proxies) */
    bool body_dirty;     /* json was edited: serialise it again before sending */
    char body_add[48];   /* else: a member to add to the client's bytes ("k":v) */
    bool body_add_first; /* ... into an object that had no member */
    bool ev_hooks;       /* SSE events go through the hook chain */
    bool buffer_body;    /* a whole JSON answer is gathered for on_body hooks */
    bool stop_stream;    /* a hook ended the stream (finish after the parser returns) */
    struct evbuffer *resp_body;
    struct rl_pending *token_pending; /* /v1/auth/token waiting for its limit */
    struct fb_call *fb_call;          /* a queue accept / lookup waiting for Redis */
    gw_qjob_t *qjob;                  /* a journal accept on the queue thread */

    /* the fallback chain */
    int admit;                /* fb_admit_t of the current attempt */
    int retries;              /* retries made on the current pool */
    int fault_status;         /* injected abort: the model's pool "answers" this */
    gw_srv_rt_t *avoid;       /* retry elsewhere than this server when possible */
    struct event *retry_ev;   /* backoff before the next attempt */
    char retry_after[40];     /* the failed answer's Retry-After */
    struct evbuffer *capture; /* the answer's body, for the idempotency store */
    size_t capture_max;
    const char *fallback; /* "local" / "template": X-Sluice-Fallback */
    const char *ctype;    /* the answer's content type (static), for the idempotency store */
    bool routed_local;    /* routing sent it to the local pool first (X-Sluice-Route) */
    bool tried_local;     /* the local pool had its turn (routing or the local tier) */
    bool local_stream;    /* an in-process stream is open (streams_active) */
    struct gw_ejob *ejob; /* the engine's work for this request */
    bool client_usage;    /* the client itself asked for stream usage */
    char queued_id[40];   /* X-Sluice-Request-Id */
    struct auth_pending *revoke_pending; /* /admin/revoke waiting for Redis */

    /* result */
    int status;
    uint64_t bytes_in, bytes_out;
    const char *error_kind; /* for logs/metrics, static string */
};

/* respond.c: local answers */
void gw_respond_json(gw_req_t *r, int status, const char *body, size_t len,
                     const char *extra_headers);
void gw_respond_error(gw_req_t *r, int status, const char *type, const char *code,
                      const char *message);
/* The same with extra header lines ("Name: value\r\n"...), e.g. a 405's Allow. */
void gw_respond_error_h(gw_req_t *r, int status, const char *type, const char *code,
                        const char *message, const char *extra_headers);
/* 500 internal_error "out of memory", without allocating. */
void gw_respond_oom(gw_req_t *r);
/* Local answers with any content type. */
void gw_respond_body(gw_req_t *r, int status, const char *ctype, const char *body, size_t len,
                     const char *extra_headers);
/* Serialises {"error":{...}} into a malloc'd string. */
char *gw_error_json(const char *type, const char *code, const char *message, size_t *len);

/* "Date: ...\r\n" for this second (thread-local cache). */
const char *gw_date_header(size_t *len);

#endif
