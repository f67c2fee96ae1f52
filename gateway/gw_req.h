/*
 * gw_req.h — a client request: what it asked, what the hooks learned, its
 * upstream attempt, its answer; plus the local answers (respond.c). The connection owns the struct
 * and reuses it for the next request on a keep-alive connection.
 */
#ifndef GW_REQ_H
#define GW_REQ_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>

#include "common/sl.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_llm.h"
#include "gateway/gw_proxy.h"
#include "gateway/gw_types.h"
#include "gateway/sse.h"

/* What a request is waiting on, whatever it is (a pending hook, a Redis
 * call, the engine, the queue thread, a backoff timer): at most one thing
 * at a time, so aborting a request is one call, gw_req_wait_cancel(). */
typedef struct gw_wait {
    void (*cancel)(gw_req_t *r, void *arg); /* NULL: not waiting */
    void *arg;
} gw_wait_t;

struct gw_req {
    gw_conn_t *c;
    gw_rt_t *rt;
    int64_t start_ns;
    gw_route_t route;
    void (*handler)(gw_req_t *r); /* the route's, after the pre-route hooks */
    gw_wait_t wait;
    struct evbuffer *body;     /* the client's body; reused for retries */
    json_t *json;              /* parsed body: gw_req_json() builds it on demand (gw_flow.h) */
    struct gw_body_scan *scan; /* the body's facts and edits (body_scan.h); NULL: tree only */
    /* a cached struct's scanner, for its next request's scan (conn.c): its facts
     * borrow a freed body until gw_body_scan() resets it */
    struct gw_body_scan *scan_kept;
    /* a cached struct's SSE splitter, recycled (sse.h), for its next
     * streamed answer (proxy.c): no calloc and free per stream */
    struct gw_sse *sse_kept;
    const gw_model_rt_t *model;
    /* a large body's storage while it arrives (body_store.h, conn.c) */
    struct gw_body_blk *body_blk;
    /* its socket's SO_RCVLOWAT is raised while it arrives (conn.c) */
    bool body_lowat;
    bool stream; /* client asked "stream": true */

    /* upstream side */
    gw_attempt_t att; /* the current upstream attempt (gw_proxy.h) */
    int attempts;     /* attempts made, all pools */
    bool head_sent;   /* our response head is out */
    bool chunked_out; /* our response body uses chunked */

    /* hooks and what they learned */
    gw_hooks_req_t hooks;
    bool body_dirty;       /* the tree was edited: serialise it again before sending */
    bool ev_hooks;         /* SSE events go through the hook chain */
    bool buffer_body;      /* a non-streamed answer is held until whole (proxy.c) */
    bool body_hooks;       /* ... and goes through the on_body hooks */
    bool stop_stream;      /* a hook ended the stream (finish after the parser returns) */
    int64_t ev_ns;         /* the SSE event being relayed arrived (sl_now_ns; 0 between
                            * events): its one clock read, for TTFT / the gap and the
                            * filter's event_seconds */
    uint64_t sse_finished; /* bit k: choice k of the stream has its finish_reason */
    bool gzip_ok;          /* the client accepts gzip and conf gzip is on (gzip.c) */
    bool gzip_out;         /* this answer's body is gzip (Content-Encoding) */
    uint8_t tx_set;        /* GW_REQ_TX_* bits: which of tx's texts this request wrote */
    struct evbuffer *resp_body;

    /* a held answer's bytes while they fit GW_PROXY_HELD_MAX (proxy.c): plain
     * copies, no evbuffer call a read; kept by the cache up to GW_REQ_HELD_KEEP */
    sl_buf_t held;
    bool held_ev; /* the held bytes are in resp_body instead */

    /* the fallback chain */
    int retries;              /* retries made on the current pool */
    int fault_status;         /* injected abort: the model's pool "answers" this */
    gw_srv_rt_t *avoid;       /* retry elsewhere than this server when possible */
    struct event *retry_ev;   /* backoff before the next attempt */
    struct evbuffer *capture; /* the answer's body, for the idempotency store */
    size_t capture_max;
    const char *fallback; /* "local" / "template": X-Sluice-Fallback */
    const char *ctype;    /* the answer's content type (static), for the idempotency store */
    bool routed_local;    /* routing sent it to the local pool first (X-Sluice-Route) */
    bool tried_local;     /* the local pool had its turn (routing or the local tier) */
    bool local_stream;    /* an in-process stream is open (streams_active) */
    bool client_usage;    /* the client itself asked for stream usage */

    /* result */
    int status;
    uint64_t bytes_in, bytes_out;
    const char *error_kind; /* for logs/metrics, static string */
    gw_llm_req_t llm;       /* TTFT, tokens (llm_metrics.c) */

    /* Texts, NUL-terminated: last, because a reused struct clears only their
     * first bytes (gw_req_new, conn.c), so the lines of an unused text's tail
     * stay untouched: at thousands of connections every line a request
     * writes is a cache miss. These three every request writes. */
    char id[40];
    char trace_id[33];    /* W3C trace id (32 hex), "" when none */
    char traceparent[56]; /* the traceparent sent upstream */
    /* Texts only some requests write (auth, a rate limit, the fallback
     * queue, a failed attempt): each is "" unless its GW_REQ_TX_* bit is set
     * in tx_set, which the struct's clear zeroes. So a request whose hooks
     * write none of them neither clears nor reads their lines (three, that
     * were first bytes cleared and read per request). Read them through
     * gw_req_user() and its siblings; a writer fills the text, then sets
     * its bit (gw_req_tx_mark). */
    struct {
        char client_id[64];   /* the token's client */
        char client_ip[48];   /* the client's address (X-Forwarded-For from trusted proxies) */
        char retry_after[40]; /* the failed answer's Retry-After */
        char queued_id[40];   /* X-Sluice-Request-Id */
        char user[256];       /* the token's sub */
    } tx;
};

#define GW_REQ_TX_CLIENT_ID   (1u << 0)
#define GW_REQ_TX_CLIENT_IP   (1u << 1)
#define GW_REQ_TX_RETRY_AFTER (1u << 2)
#define GW_REQ_TX_QUEUED_ID   (1u << 3)
#define GW_REQ_TX_USER        (1u << 4)

/* The text r->tx holds at bit, or "" when this request did not write it. */
static inline const char *gw_req_tx(const gw_req_t *r, unsigned bit, const char *text)
{
    return r->tx_set & bit ? text : "";
}

/* A writer filled a text of r->tx (set) or emptied it (clear). */
static inline void gw_req_tx_mark(gw_req_t *r, unsigned bit, bool set)
{
    r->tx_set = (uint8_t)(set ? r->tx_set | bit : r->tx_set & ~bit);
}

static inline const char *gw_req_client_id(const gw_req_t *r)
{
    return gw_req_tx(r, GW_REQ_TX_CLIENT_ID, r->tx.client_id);
}

static inline const char *gw_req_client_ip(const gw_req_t *r)
{
    return gw_req_tx(r, GW_REQ_TX_CLIENT_IP, r->tx.client_ip);
}

static inline const char *gw_req_retry_after(const gw_req_t *r)
{
    return gw_req_tx(r, GW_REQ_TX_RETRY_AFTER, r->tx.retry_after);
}

static inline const char *gw_req_queued_id(const gw_req_t *r)
{
    return gw_req_tx(r, GW_REQ_TX_QUEUED_ID, r->tx.queued_id);
}

/* The token's sub, "" without auth. */
static inline const char *gw_req_user(const gw_req_t *r)
{
    return gw_req_tx(r, GW_REQ_TX_USER, r->tx.user);
}

/* respond.c: local answers */
/* Would an answer of len bytes be gzipped for this client (conf gzip on,
 * len >= gzip.min_bytes, Accept-Encoding takes gzip)? */
bool gw_respond_gzip_ok(gw_req_t *r, size_t len);
void gw_respond_json(gw_req_t *r, int status, const char *body, size_t len,
                     const char *extra_headers);
void gw_respond_error(gw_req_t *r, int status, const char *type, const char *code,
                      const char *message) SL_COLD;
/* The same with extra header lines ("Name: value\r\n"...), e.g. a 405's Allow. */
void gw_respond_error_h(gw_req_t *r, int status, const char *type, const char *code,
                        const char *message, const char *extra_headers) SL_COLD;
/* The request now waits on arg; cancel(r, arg) undoes it if the request
 * is aborted first. Waiting on two things at once is a bug. */
static inline void gw_req_wait(gw_req_t *r, void (*cancel)(gw_req_t *r, void *arg), void *arg)
{
    assert(!r->wait.cancel);
    r->wait.cancel = cancel;
    r->wait.arg = arg;
}

/* What it waited on arrived (its callback runs): nothing left to cancel. */
static inline void gw_req_wait_done(gw_req_t *r)
{
    r->wait.cancel = NULL;
    r->wait.arg = NULL;
}

/* Abort: cancel whatever the request waits on, if anything. */
static inline void gw_req_wait_cancel(gw_req_t *r)
{
    gw_wait_t w = r->wait;
    gw_req_wait_done(r);
    if (w.cancel)
        w.cancel(r, w.arg);
}

/* 500 internal_error "out of memory", without allocating. */
void gw_respond_oom(gw_req_t *r);
/* Local answers with any content type. */
void gw_respond_body(gw_req_t *r, int status, const char *ctype, const char *body, size_t len,
                     const char *extra_headers);
/* Serialises {"error":{...}} into a malloc'd string. */
char *gw_error_json(const char *type, const char *code, const char *message, size_t *len) SL_COLD;

/* "Date: ...\r\n" for this second (thread-local cache). */
const char *gw_date_header(size_t *len);

#endif
