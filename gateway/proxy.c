/*
 * proxy.c — an upstream attempt and the relay of its answer: the request
 * (routed by flow.c) goes upstream re-serialised (our own head, the
 * client's end-to-end headers, the API key added, the client's
 * Authorization dropped), and the answer comes back to the client.
 *
 * Answers that are Server-Sent Events get their head at once and each byte
 * as it arrives: upstream body bytes (de-chunked by the parser) go straight
 * into the client's output buffer, re-chunked, while the SSE splitter scans
 * them in place to know where events end and whether `data: [DONE]` came.
 * A stream that ends or breaks without [DONE] leaves the client an SSE error
 * event and no [DONE], and counts as an upstream failure.
 *
 * Backpressure: when the client's output buffer passes sse.buffer_bytes,
 * upstream reads stop until it drains below half of that, so a slow client
 * holds a bounded amount of memory and slows the model server's socket.
 *
 * Deadlines (per request, one timer): connect, then first byte, then the
 * total; each ends in 504 when nothing was sent yet.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/log.h"
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "fallback/fallback.h"
#include "gateway/gw_conn.h"
#include "gateway/gw_fallback.h"
#include "gateway/gw_gzip.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_proxy.h"
#include "gateway/gw_req.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_types.h"
#include "gateway/gw_upstream.h"
#include "gateway/gw_worker.h"
#include "gateway/http1.h"
#include "gateway/body_scan.h"
#include "gateway/body_store.h"
#include "gateway/json_intake.h"
#include "gateway/sb.h"
#include "gateway/sse.h"

static bool gw_proxy_up_read(gw_req_t *r);
static void gw_proxy_up_event(gw_req_t *r, short what);
static void gw_proxy_attempt(gw_req_t *r, bool allow_reuse);
static void gw_proxy_fail(gw_req_t *r, gw_upfail_t kind);

/* ---- helpers ------------------------------------------------------------- */

/* Client headers we never forward: framing and hop-by-hop (rewritten by
 * us), credentials meant for sluice, and what we set ourselves. */
#define GW_REQ_DROP                                                                                \
    (GW_HN_BIT(GW_HN_HOST) | GW_HN_BIT(GW_HN_CONTENT_LENGTH) |                                     \
     GW_HN_BIT(GW_HN_TRANSFER_ENCODING) | GW_HN_BIT(GW_HN_CONNECTION) |                            \
     GW_HN_BIT(GW_HN_KEEP_ALIVE) | GW_HN_BIT(GW_HN_PROXY_CONNECTION) |                             \
     GW_HN_BIT(GW_HN_PROXY_AUTHORIZATION) | GW_HN_BIT(GW_HN_TE) | GW_HN_BIT(GW_HN_TRAILER) |       \
     GW_HN_BIT(GW_HN_UPGRADE) | GW_HN_BIT(GW_HN_EXPECT) | GW_HN_BIT(GW_HN_AUTHORIZATION) |         \
     GW_HN_BIT(GW_HN_ACCEPT_ENCODING) | GW_HN_BIT(GW_HN_CONTENT_TYPE) |                            \
     GW_HN_BIT(GW_HN_X_FORWARDED_FOR) | GW_HN_BIT(GW_HN_X_FORWARDED_PROTO) |                       \
     GW_HN_BIT(GW_HN_X_FORWARDED_HOST) | GW_HN_BIT(GW_HN_FORWARDED) |                              \
     GW_HN_BIT(GW_HN_TRACEPARENT) | GW_HN_BIT(GW_HN_X_REAL_IP) | GW_HN_BIT(GW_HN_X_REQUEST_ID))
/* (traceparent: ours goes instead, the client's trace with sluice's span) */

/* Upstream headers we never pass back: framing, and what we set. */
#define GW_RESP_DROP                                                                               \
    (GW_HN_BIT(GW_HN_CONTENT_LENGTH) | GW_HN_BIT(GW_HN_TRANSFER_ENCODING) |                        \
     GW_HN_BIT(GW_HN_CONNECTION) | GW_HN_BIT(GW_HN_KEEP_ALIVE) | GW_HN_BIT(GW_HN_TE) |             \
     GW_HN_BIT(GW_HN_TRAILER) | GW_HN_BIT(GW_HN_UPGRADE) | GW_HN_BIT(GW_HN_PROXY_AUTHENTICATE) |   \
     GW_HN_BIT(GW_HN_PROXY_CONNECTION) | GW_HN_BIT(GW_HN_CONTENT_TYPE) |                           \
     GW_HN_BIT(GW_HN_X_REQUEST_ID) | GW_HN_BIT(GW_HN_SERVER) | GW_HN_BIT(GW_HN_DATE) |             \
     GW_HN_BIT(GW_HN_CACHE_CONTROL) | GW_HN_BIT(GW_HN_X_ACCEL_BUFFERING))

/* The attempt's one deadline (connect, first byte, total), kept lazily as
 * a connection's is (conn.c, gw_conn_arm_at): the timer is re-armed only
 * when a deadline comes earlier than the one it is set for; when it fires
 * early it re-arms for what is left, and with nothing due (the attempt
 * ended: gw_proxy_finish) it stays off. A request struct keeps its timer
 * (conn.c's cache), so a request on a kept struct usually costs no timer
 * operation at all: its first-byte deadline is later than what the timer
 * still holds from a request before (an event_add and two event_dels a
 * request, ~440 instructions, were the plain request's timer cost). */
static void gw_proxy_arm_at(gw_req_t *r, int64_t deadline_ms, int64_t now)
{
    if (deadline_ms > r->att.deadline_total_ms)
        deadline_ms = r->att.deadline_total_ms;
    r->att.up_due_ms = deadline_ms;
    if (r->att.up_armed_ms && r->att.up_armed_ms <= deadline_ms)
        return;
    r->att.up_armed_ms = deadline_ms;
    int64_t ms = deadline_ms > now ? deadline_ms - now : 0;
    /* The usual durations (connect, first byte: unclamped) go to common
     * timeouts: armed and cancelled once per request, O(1) instead of two
     * heap operations among thousands of connections' timers. Any other
     * (clamped to the total deadline) takes the heap. */
    const conf_upstream_t *cu = r->att.pool->conf;
    gw_worker_timer_add(r->c->w, r->att.up_timer, ms,
                        ms == cu->first_byte_timeout_ms || ms == cu->connect_timeout_ms);
}

static void gw_proxy_arm(gw_req_t *r, int64_t deadline_ms)
{
    gw_proxy_arm_at(r, deadline_ms, sl_now_ms());
}

/* Whether the capture (the idempotency store's copy) still takes bytes:
 * past its max it is not kept. */
static bool gw_proxy_capturing(const gw_req_t *r)
{
    return r->capture && evbuffer_get_length(r->capture) <= r->capture_max;
}

static void gw_proxy_capture(gw_req_t *r, const void *p, size_t n)
{
    evbuffer_add(r->capture, p, SL_MIN(n, r->capture_max + 1));
}

static void gw_proxy_write(gw_req_t *r, const void *p, size_t n)
{
    if (gw_proxy_capturing(r))
        gw_proxy_capture(r, p, n);
    gw_out_data(r, p, n);
}

/* gw_proxy_write of all of buf, which is left empty (its chains move to
 * an HTTP/1.1 client's output: no copy, no drain). */
static void gw_proxy_write_buffer(gw_req_t *r, struct evbuffer *buf)
{
    size_t n = evbuffer_get_length(buf);
    if (n && gw_proxy_capturing(r)) /* a pullup only for the capture */
        gw_proxy_capture(r, evbuffer_pullup(buf, -1), n);
    gw_out_data_buffer(r, buf, n);
}

static void gw_proxy_write_end(gw_req_t *r)
{
    gw_out_end(r);
}

/* An SSE event carrying an OpenAI error: what a client gets when a stream
 * breaks after it started (it then gets no [DONE]). */
SL_COLD static void gw_proxy_sse_error(gw_req_t *r, const char *code, const char *msg)
{
    size_t len = 0;
    char *j = gw_error_json("server_error", code, msg, &len);
    if (!j)
        return;
    struct evbuffer *tmp = evbuffer_new();
    if (tmp) {
        evbuffer_add_printf(tmp, "data: %s\n\n", j);
        size_t n = evbuffer_get_length(tmp);
        gw_proxy_write(r, evbuffer_pullup(tmp, -1), n);
        evbuffer_free(tmp);
    }
    free(j);
}

/* Releases everything upstream-side; the client side is the caller's.
 * outcome is the attempt's, for its server's breaker: 1 ok, 0 failed, -1
 * neither (cancelled). */
static void gw_proxy_finish(gw_req_t *r, bool reusable, int outcome)
{
    gw_fb_attempt_end(r, outcome);
    if (r->retry_ev)
        evtimer_del(r->retry_ev);
    r->att.up_due_ms = 0;          /* the timer, if pending, finds nothing due (gw_proxy_arm_at) */
    r->att.head_setup_due = false; /* the next attempt's head sets it again */
    if (r->att.ping_ev) {
        event_free(r->att.ping_ev);
        r->att.ping_ev = NULL;
    }
    if (r->att.sse) {
        /* kept with the struct for its next stream (one per struct: a
         * retry's splitter finds the first one's kept already) */
        if (!r->sse_kept) {
            gw_sse_recycle(r->att.sse);
            r->sse_kept = r->att.sse;
        } else {
            gw_sse_free(r->att.sse);
        }
        r->att.sse = NULL;
        sl_gauge_add(gw_m.streams_active, -1);
    }
    if (r->att.up) {
        gw_upconn_t *u = r->att.up;
        r->att.up = NULL;
        gw_upstream_release(u, reusable);
    }
}

void gw_proxy_abort(gw_req_t *r)
{
    gw_req_wait_cancel(r); /* a hook, Redis, the engine, the queue, a backoff */
    gw_proxy_finish(r, false, -1);
    if (r->local_stream) {
        sl_gauge_add(gw_m.streams_active, -1);
        r->local_stream = false;
    }
}

/* ---- request side ------------------------------------------------------------ */

static void gw_proxy_on_up_read(void *owner)
{
    (void)gw_proxy_up_read(owner);
}

static void gw_proxy_on_up_event(void *owner, short what)
{
    gw_proxy_up_event(owner, what);
}

static void gw_proxy_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_req_t *r = arg;
    r->att.up_armed_ms = 0;
    int64_t due = r->att.up_due_ms;
    if (!due || !r->att.up)
        return; /* the attempt ended (or the struct waits in the cache) */
    int64_t now = sl_now_ms();
    if (now < due) { /* set for an earlier deadline: on for the rest */
        gw_proxy_arm_at(r, due, now);
        return;
    }
    if (!r->att.up->connected)
        gw_proxy_fail(r, GW_UPFAIL_CONNECT_TIMEOUT);
    else if (!r->att.t_first_byte_ns)
        gw_proxy_fail(r, GW_UPFAIL_FIRST_BYTE_TIMEOUT);
    else
        gw_proxy_fail(r, GW_UPFAIL_TOTAL_TIMEOUT);
}

/* Request bodies up to this size are copied into the head's write. */
#define GW_PROXY_BODY_INLINE 2048

static void gw_proxy_write_request(gw_req_t *r, gw_upconn_t *u)
{
    const gw_http_msg_t *m = gw_http_msg(r->c->parser);
    struct evbuffer *out = bufferevent_get_output(u->bev);
    size_t blen = evbuffer_get_length(r->body);
    char stack[4096];
    gw_sb_t b;
    gw_sb_init(&b, stack, sizeof(stack));
    const char *rest = gw_rt_v1_rest(m->target, m->target_len); /* non-NULL: gw_proxy_send */
    gw_sb_add(&b, m->method, m->method_len); /* POST but for /v1/responses/{id}: GET, DELETE */
    gw_sb_lit(&b, " ");
    gw_sb_add(&b, r->att.server->base_path,
              r->att.server->base_path_len); /* /v1/REST -> BASE/REST */
    if (rest)
        gw_sb_add(&b, rest, m->target_len - (size_t)(rest - m->target));
    gw_sb_lit(&b, " HTTP/1.1\r\nHost: ");
    gw_sb_add(&b, r->att.server->host_header, r->att.server->host_header_len);
    const gw_http_header_t *cct =
        r->route == GW_ROUTE_PASSTHROUGH ? gw_http_header_get(m, GW_HN_CONTENT_TYPE) : NULL;
    if (cct) { /* a passthrough body is the client's: multipart, audio, JSON */
        gw_sb_lit(&b, "\r\nContent-Type: ");
        gw_sb_add(&b, cct->value, cct->value_len);
        gw_sb_lit(&b, "\r\nContent-Length: ");
    } else {
        gw_sb_lit(&b, "\r\nContent-Type: application/json\r\nContent-Length: ");
    }
    gw_sb_u64(&b, blen);
    gw_sb_lit(&b, "\r\nX-Request-Id: ");
    gw_sb_str(&b, r->id);
    if (r->traceparent[0]) {
        gw_sb_lit(&b, "\r\ntraceparent: ");
        gw_sb_str(&b, r->traceparent);
    }
    gw_sb_lit(&b, "\r\nX-Forwarded-For: ");
    gw_sb_str(&b, r->c->peer);
    if (r->c->tls)
        gw_sb_lit(&b, "\r\nX-Forwarded-Proto: https\r\n");
    else
        gw_sb_lit(&b, "\r\nX-Forwarded-Proto: http\r\n");
    if (r->att.pool->auth_header)
        gw_sb_add(&b, r->att.pool->auth_header, r->att.pool->auth_header_len);
    for (size_t i = 0; i < m->nheaders; i++) {
        const gw_http_header_t *h = &m->headers[i];
        if ((GW_HN_BIT(h->id) & GW_REQ_DROP) ||
            (h->name_len >= 9 && gw_http_name_eq(h->name, "x-sluice-", 9)) ||
            gw_http_header_is_hop(m, h->name, h->name_len))
            continue;
        gw_sb_header(&b, h->name, h->name_len, h->value, h->value_len);
    }
    gw_sb_lit(&b, "\r\n");
    /* A small body rides in the head's write; a larger one is shared, not
     * copied: out's chains refer to r->body's, which stays whole for a
     * retry or a fallback that sends it again. */
    bool by_ref = blen > GW_PROXY_BODY_INLINE;
    if (blen && !by_ref)
        gw_sb_add(&b, evbuffer_pullup(r->body, -1), blen);
    size_t sent = gw_sb_flush(&b, out);
    if (sent && blen >= GW_BODY_STORE_MIN) /* fewer, larger writes (default 16 KiB) */
        bufferevent_set_max_single_write(u->bev, GW_BODY_STORE_WRITE);
    if (sent && by_ref) {
        if (evbuffer_add_buffer_reference(out, r->body) != 0 &&
            evbuffer_add(out, evbuffer_pullup(r->body, -1), blen) != 0)
            blen = 0; /* OOM: the short request fails upstream, as a copy would */
        sent += blen;
    }
    gw_wio_added(&u->wio); /* before gw_wio_write_now, which writes what is queued */
    sl_counter_add(gw_m.bytes_up_out, sent);
}

static void gw_proxy_attempt(gw_req_t *r, bool allow_reuse)
{
    gw_worker_t *w = r->c->w;
    /* One clock read for the pick, the send time and the deadline: the
     * request is queued within microseconds (and written at the end of
     * the loop turn). */
    int64_t now_ns = sl_now_ns(), now = now_ns / 1000000;
    if (r->fault_status && r->att.pool == r->model->pool) {
        /* A drill: the model's servers "answer" the injected status, so the
         * whole chain (retry, local, template) is exercised. */
        r->attempts++;
        r->error_kind = "fault_injected";
        if (gw_fb_after_failure(r, FB_FAIL_STATUS, r->fault_status))
            return;
        gw_respond_error(r, r->fault_status, "server_error", "upstream_error",
                         "The model server failed (an injected fault).");
        return;
    }
    if (r->att.pool->engine) {
        r->attempts++;
        gw_engine_attempt(r);
        return;
    }
    int admit = FB_ADMIT_NO;
    gw_srv_rt_t *srv = gw_upstream_pick(w, r->att.pool, r->avoid, now, &admit);
    if (!srv) {
        gw_metrics_upstream_error(r->att.pool, gw_upfails[GW_UPFAIL_UNAVAILABLE].label);
        r->error_kind = "upstream_unavailable";
        if (gw_fb_after_failure(r, gw_upfails[GW_UPFAIL_UNAVAILABLE].fb_class, 0))
            return;
        gw_respond_error(r, gw_upfails[GW_UPFAIL_UNAVAILABLE].status, "server_error",
                         gw_upfails[GW_UPFAIL_UNAVAILABLE].code,
                         gw_upfails[GW_UPFAIL_UNAVAILABLE].message);
        return;
    }
    gw_upconn_t *u = gw_upstream_get(w, srv, allow_reuse);
    if (!u) {
        fb_breaker_cancel(srv->breaker, (fb_admit_t)admit);
        gw_metrics_upstream_error(r->att.pool, gw_upfails[GW_UPFAIL_INTERNAL].label);
        gw_respond_error(r, gw_upfails[GW_UPFAIL_INTERNAL].status, "server_error",
                         gw_upfails[GW_UPFAIL_INTERNAL].code,
                         gw_upfails[GW_UPFAIL_INTERNAL].message);
        return;
    }
    r->att.admit = admit;
    r->att.server = srv;
    r->att.up = u;
    u->owner = r;
    u->on_read = gw_proxy_on_up_read;
    u->on_event = gw_proxy_on_up_event;
    r->attempts++;
    if (!r->att.up_timer)
        r->att.up_timer = evtimer_new(w->base, gw_proxy_timer_cb, r);
    gw_proxy_write_request(r, u);
    /* The request leaves now; arming its timer and the upstream's read
     * come after (the answer is read in a later loop turn either way). */
    gw_wio_write_now(&u->wio);
    r->att.t_sent_ns = now_ns;
    const conf_upstream_t *cu = r->att.pool->conf;
    gw_proxy_arm_at(r, now + (u->connected ? cu->first_byte_timeout_ms : cu->connect_timeout_ms),
                    now);
    gw_upstream_arm(u);
}

/* The request is through every hook (flow.c): its first attempt. */
void gw_proxy_send_attempt(gw_req_t *r)
{
    const gw_http_msg_t *cm = gw_http_msg(r->c->parser);
    if (!gw_rt_v1_rest(cm->target, cm->target_len)) { /* no upstream path for it */
        gw_respond_error(r, 404, "invalid_request_error", "not_found", "Unknown path.");
        return;
    }
    int64_t now = sl_now_ms();
    r->att.deadline_total_ms = now + r->att.pool->conf->total_timeout_ms;
    fb_budget_on_request(r->att.pool->budget, now);
    gw_proxy_attempt(r, true);
}

static void gw_proxy_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_req_wait_done(arg);
    gw_proxy_attempt(arg, true);
}

static void gw_proxy_retry_cancel(gw_req_t *r, void *arg)
{
    (void)arg;
    evtimer_del(r->retry_ev); /* freed with the request */
}

void gw_proxy_next_attempt(gw_req_t *r, int64_t delay_ms)
{
    if (delay_ms <= 0) {
        gw_proxy_attempt(r, true);
        return;
    }
    if (!r->retry_ev)
        r->retry_ev = evtimer_new(r->c->w->base, gw_proxy_retry_cb, r);
    if (!r->retry_ev) {
        gw_respond_oom(r);
        return;
    }
    struct timeval tv = {delay_ms / 1000, (delay_ms % 1000) * 1000};
    gw_req_wait(r, gw_proxy_retry_cancel, NULL);
    evtimer_add(r->retry_ev, &tv);
}

/* ---- response side ------------------------------------------------------------ */

static void gw_proxy_ping_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_req_t *r = arg;
    if (!r->att.sse || gw_sse_events(r->att.sse) > 0) {
        event_del(r->att.ping_ev);
        return;
    }
    gw_proxy_write(r, ": ping\n\n", 8);
}

static bool gw_ct_is_sse(const gw_http_header_t *h)
{
    return h && GW_HTTP_PREFIX_CI(h->value, h->value_len, "text/event-stream");
}

/* Our response head, from the upstream's. length: the body's length when
 * known (Content-Length), -1 for a body of unknown length (chunked, or
 * close-delimited for HTTP/1.0), -2 for no body at all. */
static void gw_proxy_write_head_body(gw_req_t *r, const gw_http_msg_t *m, int64_t length,
                                     const void *body);

static void gw_proxy_write_head(gw_req_t *r, const gw_http_msg_t *m, int64_t length)
{
    gw_proxy_write_head_body(r, m, length, NULL);
}

/* body non-NULL: the whole answer, length bytes, goes with the head (in
 * the same add to an HTTP/1.1 client when it fits the head's buffer). */
static void gw_proxy_write_head_body(gw_req_t *r, const gw_http_msg_t *m, int64_t length,
                                     const void *body)
{
    /* m NULL: an answer made in-process (the engine's stream), 200 SSE. */
    static const gw_http_header_t sse_ct = {
        .name = "Content-Type", .value = "text/event-stream", .name_len = 12, .value_len = 17};
    const gw_http_header_t *ct = m ? gw_http_header_get(m, GW_HN_CONTENT_TYPE) : &sse_ct;
    int status = m ? m->status : 200;
    char stack[4096];
    gw_sb_t b;
    gw_sb_init(&b, stack, sizeof(stack));
    gw_out_head_begin(r, status, &b);
    if (r->att.resp_sse) {
        gw_sb_header(&b, "Content-Type", 12, ct->value, ct->value_len);
        gw_sb_lit(&b, "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n");
    } else if (ct) {
        gw_sb_header(&b, "Content-Type", 12, ct->value, ct->value_len);
    }
    gw_sb_lit(&b, "X-Request-Id: ");
    gw_sb_str(&b, r->id);
    gw_sb_lit(&b, "\r\n");
    if (r->fallback) {
        gw_sb_lit(&b, "X-Sluice-Fallback: ");
        gw_sb_str(&b, r->fallback);
        gw_sb_lit(&b, "\r\n");
    }
    if (r->routed_local)
        gw_sb_lit(&b, "X-Sluice-Route: local\r\n");
    if (r->gzip_out)
        gw_sb_lit(&b, "Content-Encoding: gzip\r\nVary: Accept-Encoding\r\n");
    for (size_t i = 0; m && i < m->nheaders; i++) {
        const gw_http_header_t *h = &m->headers[i];
        if ((GW_HN_BIT(h->id) & GW_RESP_DROP) || gw_http_header_is_hop(m, h->name, h->name_len))
            continue;
        gw_sb_header(&b, h->name, h->name_len, h->value, h->value_len);
    }
    gw_hooks_headers(r, &b);
    if (body) {
        if (length && gw_proxy_capturing(r))
            gw_proxy_capture(r, body, (size_t)length);
        gw_out_head_end_body(r, &b, body, (size_t)length);
    } else {
        gw_out_head_end(r, &b, length); /* the whole head in one add (HTTP/1.1) */
    }
    r->ctype = r->att.resp_sse ? "text/event-stream" : "application/json";
}

static void gw_proxy_held_clear(gw_req_t *r);

static bool gw_ct_is_json(const gw_http_header_t *h)
{
    return h && GW_HTTP_PREFIX_CI(h->value, h->value_len, "application/json");
}

/* The head's work for an answer that goes on to the client: what its body
 * needs (held, streamed, hooks) and, unless held, our head. It releases
 * nothing and never touches the upstream's input, so the body that came in
 * the same read is fed in the same pass (gw_proxy_head_cb). */
static void gw_proxy_head_setup(gw_req_t *r, const gw_http_msg_t *m)
{
    const gw_http_header_t *ct = gw_http_header_get(m, GW_HN_CONTENT_TYPE);
    r->att.resp_sse = gw_ct_is_sse(ct);
    bool nobody = m->status == 204 || m->status == 304;
    r->body_hooks = !r->att.resp_sse && !nobody && m->status >= 200 && m->status < 300 &&
                    gw_ct_is_json(ct) && gw_hooks_want_body(r);
    if (!r->att.resp_sse && !nobody) {
        /* A non-streamed answer is committed only once whole and validly
         * framed (and through the on_body hooks when they want it): until
         * then a cut, a reset or bad framing is an ordinary failure with
         * nothing sent, so retry, the next tier or a clean 502 can answer. */
        gw_proxy_held_clear(r);
        r->buffer_body = true;
    }
    if (!r->buffer_body) {
        bool length_known = !r->att.resp_sse && !m->chunked && m->content_length >= 0;
        gw_proxy_write_head(r, m, nobody ? -2 : length_known ? m->content_length : -1);
    }
    if (r->att.resp_sse) {
        r->ev_hooks = gw_hooks_events_begin(r);
        size_t max = (size_t)r->rt->conf->sse.max_event_bytes;
        if (r->sse_kept) { /* the struct's, from its last stream */
            r->att.sse = r->sse_kept;
            r->sse_kept = NULL;
            gw_sse_rearm(r->att.sse, max);
        } else {
            r->att.sse = gw_sse_new(max);
        }
        sl_gauge_add(gw_m.streams_active, 1);
    }
    /* The ping and the deadline wait until this read's events are out. */
    r->att.head_setup_due = true;
}

/* Returns false when the request was handed to the fallback chain (it may
 * be answered, and freed, already): the caller must not touch r again.
 * Only a 5xx can do that; any other head is gw_proxy_head_cb's. */
static bool gw_proxy_on_head(gw_req_t *r)
{
    const gw_http_msg_t *m = gw_http_msg(r->att.up->parser);
    r->att.upstatus = m->status;
    r->status = m->status;
    if (m->status >= 500) {
        const gw_http_header_t *ra = gw_http_header_get(m, GW_HN_RETRY_AFTER);
        snprintf(r->tx.retry_after, sizeof(r->tx.retry_after), "%s", ra ? ra->value : "");
        gw_req_tx_mark(r, GW_REQ_TX_RETRY_AFTER, true);
        gw_metrics_upstream_error(r->att.pool, gw_upfails[GW_UPFAIL_STATUS_5XX].label);
        gw_upstream_log(r->att.server, "status_5xx", "answered HTTP %d", m->status);
        int64_t delay = 0;
        int action = gw_fb_decide(r, gw_upfails[GW_UPFAIL_STATUS_5XX].fb_class, m->status, &delay);
        if (action != GW_FB_NONE) {
            /* Nothing reached the client: the fallback chain answers
             * instead (retry, local model, template). Otherwise the
             * upstream's own answer (body, Retry-After) is relayed. */
            r->error_kind = gw_upfails[GW_UPFAIL_STATUS_5XX].label;
            gw_proxy_finish(r, false, 0);
            gw_fb_apply(r, action, delay);
            return false;
        }
        gw_req_tx_mark(r, GW_REQ_TX_RETRY_AFTER, false);
    }
    gw_proxy_head_setup(r, m);
    return true;
}

/* The answer's head, from inside the feed (gw_http_feed_cbs_t), before any
 * body byte: 0 to feed its body on in the same pass. A 5xx stops the pass
 * at the head (1): it may go to the fallback chain, which releases this
 * connection, its input with it, and may answer and free r; that happens
 * in gw_proxy_up_read once the pass has drained the head, and the failed
 * attempt's body is never fed. 1xx heads never come here (the parser skips
 * them); 204, 304 and the rest release nothing, and a body-less answer
 * completes in the same pass (DONE). */
static int gw_proxy_head_cb(void *arg)
{
    gw_req_t *r = arg;
    const gw_http_msg_t *m = gw_http_msg(r->att.up->parser);
    if (m->status >= 500)
        return 1;
    r->att.upstatus = m->status;
    r->status = m->status;
    gw_proxy_head_setup(r, m);
    return 0;
}

/* What the head starts that no byte of the read holding it needs, run once
 * that read is fed through (gw_proxy_up_read): its head and events are
 * written first, in one writev as before, so the first event does not wait
 * for timers (issue #16, the time to first event). */
static void gw_proxy_after_head(gw_req_t *r)
{
    r->att.head_setup_due = false;
    if (r->head_sent)
        gw_out_write_now(r);
    int64_t ping_ms = r->rt->conf->sse.ping_interval_ms;
    /* The ping keeps a stream alive only until its first event (ping_cb):
     * none when that event came with the head. */
    if (r->att.sse && ping_ms > 0 && gw_sse_events(r->att.sse) == 0) {
        r->att.ping_ev = event_new(r->c->w->base, -1, EV_PERSIST, gw_proxy_ping_cb, r);
        struct timeval tv = {ping_ms / 1000, (ping_ms % 1000) * 1000};
        if (r->att.ping_ev)
            event_add(r->att.ping_ev, &tv);
    }
    /* From here on only the total deadline applies. */
    gw_proxy_arm(r, r->att.deadline_total_ms);
}

#define GW_SSE_FRAME_BYTES  8    /* "data: " and the blank line's "\n\n" */
#define GW_PROXY_EMIT_STACK 4096 /* a replaced event and a flush chunk fit */
/* Per thread, not on the stack: the write is not reentrant, and gcc's
 * -Wmaybe-uninitialized cannot see that the loop fills what is written. */
static __thread char gw_proxy_frame_buf[GW_PROXY_EMIT_STACK];

/* The payloads as SSE events ("data: <payload>\n\n" each), written at
 * once: assembled in a per-thread buffer when they fit (the usual replaced event),
 * else in one allocation; only when that fails, piece by piece (nothing is
 * lost, the client may see the events in more than one chunk). */
static void gw_proxy_write_payloads(gw_req_t *r, gw_payloads_t *out)
{
    if (out->n == 0)
        return;
    size_t total = 0;
    for (size_t i = 0; i < out->n; i++)
        total += GW_SSE_FRAME_BYTES + gw_payloads_at(out, i)->len;
    char *stack = gw_proxy_frame_buf;
    char *buf = total <= sizeof(gw_proxy_frame_buf) ? stack : malloc(total);
    if (!buf) {
        for (size_t i = 0; i < out->n; i++) {
            const gw_payload_t *p = gw_payloads_at(out, i);
            gw_proxy_write(r, GW_LIT("data: "));
            gw_proxy_write(r, p->data, p->len);
            gw_proxy_write(r, GW_LIT("\n\n"));
        }
        return;
    }
    char *w = buf;
    for (size_t i = 0; i < out->n; i++) {
        const gw_payload_t *p = gw_payloads_at(out, i);
        memcpy(w, "data: ", 6);
        memcpy(w + 6, p->data, p->len);
        memcpy(w + 6 + p->len, "\n\n", 2);
        w += GW_SSE_FRAME_BYTES + p->len;
    }
    gw_proxy_write(r, buf, (size_t)(w - buf));
    if (buf != stack)
        free(buf);
}

/* Complete events only go out: those of one read gathered into one chunk
 * (gw_out_batch_begin in gw_proxy_up_read), copied from the read buffer
 * itself; only an event split across reads is assembled (by the splitter)
 * first. A partial event is never forwarded, so a stream cut mid-event
 * cannot hand the client half a JSON document. */
/* One event's data payload through the hook chain and out; raw (may be
 * NULL) is the event as it came, sent when every hook passes. Returns -1
 * when a hook ended the stream (r->stop_stream is set). */
static int gw_proxy_emit(gw_req_t *r, const char *data, size_t len, const char *raw, size_t raw_len)
{
    gw_payloads_t out;
    gw_payloads_init(&out);
    gw_ev_rc_t rc = r->ev_hooks ? gw_hooks_event(r, data, len, &out) : GW_EV_PASS;
    if (rc == GW_EV_PASS) {
        if (raw) {
            gw_proxy_write(r, raw, raw_len);
        } else if (gw_payloads_push_copy(&out, data, len) != 0) {
            return -1;
        }
    }
    gw_proxy_write_payloads(r, &out);
    gw_payloads_clear(&out);
    if (rc == GW_EV_STOP) {
        r->stop_stream = true;
        return -1;
    }
    return 0;
}

static int gw_proxy_event_cb(void *arg, const gw_sse_event_t *ev)
{
    gw_req_t *r = arg;
    if (r->route == GW_ROUTE_RESPONSES) /* for the end-of-stream decision */
        gw_sse_responses_scan(ev, &r->sse_finished);
    else
        gw_sse_finish_scan(ev, &r->sse_finished);
    if (ev->comment_only) {
        gw_proxy_write(r, ev->raw, ev->raw_len);
        return 0;
    }
    /* One clock read per event: TTFT / the gap, and the filter's time. */
    r->ev_ns = sl_now_ns();
    /* TTFT, gaps, usage: as the upstream sent them, before any hook */
    bool usage = gw_llm_sse_event(r, ev);
    if (!r->ev_hooks) {
        r->ev_ns = 0;
        gw_proxy_write(r, ev->raw, ev->raw_len);
        return 0;
    }
    /* The usual event has one data line: the splitter found its value in
     * place (no rescan, no copy); several lines are joined here. */
    char stack[2048], *heap = NULL;
    const char *data = ev->data;
    long dl = (long)ev->data_len;
    if (!data) {
        data = stack;
        if ((dl = gw_sse_event_data(ev, stack, sizeof(stack))) < 0) {
            if (!(heap = malloc(ev->raw_len + 1)))
                return -1;
            data = heap;
            dl = gw_sse_event_data(ev, heap, ev->raw_len + 1);
        }
    }
    int rc = 0;
    if (dl <= 0) { /* no data field: nothing for the hooks */
        gw_proxy_write(r, ev->raw, ev->raw_len);
    } else { /* a hook that ends the stream: finish after the parser returns */
        r->llm.ev_plain = usage ? NULL : data;
        rc = gw_proxy_emit(r, data, (size_t)dl, ev->raw, ev->raw_len);
    }
    r->llm.ev_plain = NULL;
    r->ev_ns = 0;
    free(heap);
    return rc;
}

/* ---- answers made in-process (the engine) --------------------------------- */

void gw_proxy_local_stream_begin(gw_req_t *r)
{
    r->att.upstatus = 200;
    r->status = 200;
    r->att.resp_sse = true;
    r->ev_hooks = gw_hooks_events_begin(r);
    gw_proxy_write_head(r, NULL, -1);
    sl_gauge_add(gw_m.streams_active, 1);
    r->local_stream = true;
}

int gw_proxy_local_stream_event(gw_req_t *r, const char *data, size_t len)
{
    r->ev_ns = sl_now_ns();
    r->llm.ev_plain = gw_llm_event(r, data, len) ? NULL : data;
    int rc = gw_proxy_emit(r, data, len, NULL, 0);
    r->llm.ev_plain = NULL;
    r->ev_ns = 0;
    return rc;
}

void gw_proxy_local_stream_end(gw_req_t *r, const char *error_code, const char *error_msg)
{
    if (error_code) {
        r->error_kind = error_code;
        gw_proxy_sse_error(r, error_code, error_msg);
    }
    r->stop_stream = false;
    gw_proxy_write_end(r);
    if (r->local_stream) {
        sl_gauge_add(gw_m.streams_active, -1);
        r->local_stream = false;
    }
    gw_conn_req_done(r->c);
}

void gw_proxy_local_body(gw_req_t *r, json_t *body)
{
    gw_llm_body(r, body); /* the engine's usage */
    r->att.upstatus = 200;
    bool modified = false;
    if (gw_hooks_want_body(r) && gw_hooks_body(r, body, &modified) != 0) {
        gw_respond_error(r, 502, "server_error", "upstream_error", "The answer was refused.");
        return;
    }
    char *s = json_dumps(body, JSON_COMPACT);
    if (!s) {
        gw_respond_oom(r);
        return;
    }
    char extra[96] = "";
    if (r->fallback)
        snprintf(extra, sizeof(extra), "X-Sluice-Fallback: %s\r\n", r->fallback);
    else if (r->routed_local)
        snprintf(extra, sizeof(extra), "X-Sluice-Route: local\r\n");
    gw_proxy_local_answer(r, "application/json", s, strlen(s), extra);
    free(s);
}

void gw_proxy_local_answer(gw_req_t *r, const char *ctype, const char *body, size_t len,
                           const char *extra)
{
    r->att.upstatus = 200;
    char stack[512];
    gw_sb_t hdrs;
    gw_sb_init(&hdrs, stack, sizeof(stack));
    gw_sb_str(&hdrs, extra);
    gw_hooks_headers(r, &hdrs);
    gw_sb_add(&hdrs, "", 1);
    gw_respond_body(r, 200, ctype, body, len, hdrs.oom ? extra : hdrs.p);
    gw_sb_reset(&hdrs);
}

/* Whole JSON answers gathered for on_body hooks are bounded. */
#define GW_PROXY_MAX_BUFFERED (8u << 20)
/* A non-streamed answer is held until whole up to this size; a larger one
 * is committed when it passes it and relayed as it comes (a failure after
 * that can only cut it). docs/gateway.md, "When an answer is committed". */
#define GW_PROXY_HOLD_BYTES (2u << 20)

/* A held answer up to this size is gathered in r->held with plain copies
 * (the usual JSON answer: one read, one memcpy) and goes out with its head
 * in one add; past it the bytes move to the resp_body buffer. */
#define GW_PROXY_HELD_MAX (16u * 1024)

/* Nothing held (the held block and resp_body keep their memory). */
static void gw_proxy_held_clear(gw_req_t *r)
{
    if (r->held_ev)
        evbuffer_drain(r->resp_body, evbuffer_get_length(r->resp_body));
    r->held_ev = false;
    r->held.len = 0;
}

static size_t gw_proxy_held_len(const gw_req_t *r)
{
    return r->held_ev ? evbuffer_get_length(r->resp_body) : r->held.len;
}

/* n more bytes of a held answer. -1: out of memory. */
static int gw_proxy_hold(gw_req_t *r, const char *p, size_t n)
{
    if (!r->held_ev && r->held.len + n <= GW_PROXY_HELD_MAX)
        return sl_buf_add(&r->held, p, n);
    if (!r->held_ev) { /* past the block: what it has, then the rest, in resp_body */
        if (!r->resp_body && !(r->resp_body = evbuffer_new()))
            return -1;
        if (r->held.len && evbuffer_add(r->resp_body, r->held.p, r->held.len) != 0)
            return -1;
        r->held.len = 0;
        r->held_ev = true;
    }
    return evbuffer_add(r->resp_body, p, n);
}

/* Commits a held answer too large to hold: its head and what came so far
 * go out, the rest is relayed as it arrives. */
static void gw_proxy_commit_held(gw_req_t *r)
{
    const gw_http_msg_t *m = gw_http_msg(r->att.up->parser);
    bool length_known = !m->chunked && m->content_length >= 0;
    r->buffer_body = false;
    gw_proxy_write_head(r, m, length_known ? m->content_length : -1);
    if (r->held_ev)
        gw_proxy_write_buffer(r, r->resp_body);
    else if (r->held.len)
        gw_proxy_write(r, r->held.p, r->held.len);
    gw_proxy_held_clear(r);
}

/* A held answer failed before it was committed: nothing of it is kept. */
static void gw_proxy_drop_held(gw_req_t *r)
{
    gw_proxy_held_clear(r);
    r->buffer_body = false;
    r->body_hooks = false;
}

static int gw_proxy_body_cb(void *arg, const char *p, size_t n)
{
    gw_req_t *r = arg;
    if (r->att.sse)
        return gw_sse_feed(r->att.sse, p, n, gw_proxy_event_cb, r);
    gw_llm_body_bytes(r, p, n); /* its tail, for the usage (no buffering) */
    if (r->buffer_body) {
        size_t have = gw_proxy_held_len(r);
        if (r->body_hooks && have + n > GW_PROXY_MAX_BUFFERED)
            return -1;
        if (r->body_hooks || have + n <= GW_PROXY_HOLD_BYTES)
            return gw_proxy_hold(r, p, n);
        gw_proxy_commit_held(r);
    }
    gw_proxy_write(r, p, n);
    return 0;
}

/* A gathered JSON answer: through the on_body hooks, then out with its
 * head. -1 when the hooks refuse it. */
static int gw_proxy_flush_buffered(gw_req_t *r)
{
    const gw_http_msg_t *m = gw_http_msg(r->att.up->parser);
    size_t len = gw_proxy_held_len(r);
    const char *held = len == 0     ? ""
                       : r->held_ev ? (const char *)evbuffer_pullup(r->resp_body, -1)
                                    : r->held.p;
    char *edited = NULL;
    size_t elen = 0;
    if (r->body_hooks && gw_hooks_body_bytes(r, held, len, &edited, &elen) != 0)
        return -1;
    r->buffer_body = false;
    r->body_hooks = false;
    /* gzip (when the client accepts it and conf has it on) needs the whole
     * answer: its length goes in the head. An upstream that encoded its
     * answer itself, or an answer that is not JSON, is relayed as it is. */
    bool gz_fit = m->status >= 200 && m->status < 300 &&
                  !gw_http_header_get(m, GW_HN_CONTENT_ENCODING) &&
                  gw_ct_is_json(gw_http_header_get(m, GW_HN_CONTENT_TYPE));
    size_t flen = edited ? elen : len;
    bool gz_want = gz_fit && gw_respond_gzip_ok(r, flen);
    const void *final = edited ? (const void *)edited : gz_want ? (const void *)held : NULL;
    size_t gzlen = 0;
    unsigned char *gz = gz_want ? gw_gzip(final, flen, (int)r->rt->conf->gzip.level, &gzlen) : NULL;
    if (gz) {
        /* The idempotency store keeps the plain bytes, not the encoding. */
        if (gw_proxy_capturing(r))
            gw_proxy_capture(r, final, flen);
        struct evbuffer *cap = r->capture;
        r->capture = NULL;
        r->gzip_out = true;
        gw_proxy_write_head(r, m, (int64_t)gzlen);
        gw_proxy_write(r, gz, gzlen);
        r->capture = cap;
        free(gz);
        free(edited);
        gw_proxy_held_clear(r);
        return 0;
    }
    if (edited) {
        gw_proxy_write_head_body(r, m, (int64_t)elen, edited);
        free(edited);
    } else if (r->held_ev) {
        gw_proxy_write_head(r, m, (int64_t)len);
        gw_proxy_write_buffer(r, r->resp_body); /* moved: left empty */
    } else {
        gw_proxy_write_head_body(r, m, (int64_t)len, held);
    }
    gw_proxy_held_clear(r);
    return 0;
}

/* The choices a streamed answer has: the client's n (1 when absent). */
static int64_t gw_proxy_choices(const gw_req_t *r)
{
    if (r->scan) {
        const gw_jfact_t *n = gw_body_fact(r->scan, GW_F_N);
        return n->kind == SL_J_INT ? n->i : 1;
    }
    json_t *n = json_object_get(r->json, "n");
    return json_is_integer(n) ? (int64_t)json_integer_value(n) : 1;
}

static void gw_proxy_on_done(gw_req_t *r)
{
    bool reusable = gw_http_msg(r->att.up->parser)->keep_alive;
    int outcome = r->att.upstatus >= 500 ? 0 : 1;
    if (r->buffer_body && gw_proxy_flush_buffered(r) != 0) {
        gw_proxy_finish(r, reusable, outcome);
        gw_respond_error(r, 502, "server_error", "upstream_error",
                         "The model server's answer was refused.");
        return;
    }
    if (r->att.resp_sse && !gw_sse_done_seen(r->att.sse) && !gw_sse_mid_event(r->att.sse) &&
        gw_sse_finish_all(r->sse_finished, gw_proxy_choices(r))) {
        /* Every choice finished, only [DONE] is missing: a complete answer
         * (some servers close without it). End it as the SDKs expect. */
        static const char done[] = "data: [DONE]\n\n";
        if (r->route != GW_ROUTE_RESPONSES) { /* that API never sends one */
            sl_counter_add(gw_m.done_added, 1);
            if (gw_proxy_emit(r, "[DONE]", 6, done, sizeof(done) - 1) != 0)
                r->stop_stream = false;
        }
    } else if (r->att.resp_sse && !gw_sse_done_seen(r->att.sse)) {
        r->error_kind = "upstream_truncated";
        gw_upstream_log(r->att.server, "truncated", "the stream ended without data: [DONE]");
        gw_metrics_upstream_error(r->att.pool, gw_upfails[GW_UPFAIL_TRUNCATED].label);
        outcome = 0;
        gw_proxy_sse_error(r, "upstream_truncated",
                           "The model server ended the stream before it was complete.");
    }
    gw_proxy_write_end(r);
    gw_proxy_finish(r, reusable, outcome);
    gw_conn_req_done(r->c);
}

/* A hook ended the stream (filters: blocked). The upstream is cut. */
static void gw_proxy_on_stopped(gw_req_t *r)
{
    r->stop_stream = false;
    r->error_kind = "stopped_by_hook";
    gw_proxy_write_end(r);
    gw_proxy_finish(r, false, -1);
    gw_conn_req_done(r->c);
}

/* Every way an upstream attempt fails, one row each: the label (metric
 * kind and r->error_kind), how the retry policy classes it, and the answer
 * when the fallback chain has nothing better. Indexed by gw_upfail_t. */
const gw_upfail_row_t gw_upfails[GW_UPFAIL_COUNT] = {
    [GW_UPFAIL_CONNECT] = {"connect", FB_FAIL_CONNECT, 502, "upstream_error",
                           "Could not connect to the model server."},
    [GW_UPFAIL_CONNECT_TLS] = {"connect_tls", FB_FAIL_CONNECT, 502, "upstream_error",
                               "Could not connect to the model server."},
    [GW_UPFAIL_CONNECT_TIMEOUT] = {"connect_timeout", FB_FAIL_CONNECT, 504, "upstream_timeout",
                                   "The model server did not accept the connection in time."},
    [GW_UPFAIL_FIRST_BYTE_TIMEOUT] = {"first_byte_timeout", FB_FAIL_FIRST_BYTE, 504,
                                      "upstream_timeout",
                                      "The model server did not answer in time."},
    [GW_UPFAIL_TOTAL_TIMEOUT] = {"total_timeout", FB_FAIL_OTHER, 504, "upstream_timeout",
                                 "The model server did not finish in time."},
    [GW_UPFAIL_RESET] = {"reset", FB_FAIL_RESET, 502, "upstream_error",
                         "The model server closed the connection without answering."},
    [GW_UPFAIL_TRUNCATED] = {"truncated", FB_FAIL_OTHER, 502, "upstream_error",
                             "The model server closed the connection mid-answer."},
    [GW_UPFAIL_BAD_RESPONSE] = {"bad_response", FB_FAIL_OTHER, 502, "upstream_error",
                                "The model server sent an invalid response."},
    /* status 0: the upstream's own status is relayed or passed on. */
    [GW_UPFAIL_STATUS_5XX] = {"status_5xx", FB_FAIL_STATUS, 0, "upstream_error",
                              "The model server failed."},
    [GW_UPFAIL_UNAVAILABLE] = {"unavailable", FB_FAIL_CONNECT, 503, "upstream_unavailable",
                               "No model server is available right now."},
    [GW_UPFAIL_INTERNAL] = {"internal", FB_FAIL_OTHER, 502, "upstream_error",
                            "Could not open a connection to the model server."},
};

/* The error-log line for a failure the proxy sees: which deadline fired,
 * the parser's reason, an early close. Connect and TLS failures are logged
 * by upstream.c, which knows errno and OpenSSL's verdict. */
SL_COLD static void gw_proxy_log_fail(const gw_req_t *r, gw_upfail_t kind)
{
    const gw_srv_rt_t *srv = r->att.server;
    const gw_upconn_t *u = r->att.up;
    if (!srv || !u)
        return;
    const conf_upstream_t *cu = r->att.pool->conf;
    const char *label = gw_upfails[kind].label;
    /* The total deadline caps the connect and first-byte ones. */
    bool total = sl_now_ms() >= r->att.deadline_total_ms;
    long long tms = (long long)cu->total_timeout_ms;
    switch (kind) {
    case GW_UPFAIL_CONNECT_TIMEOUT:
        if (total)
            gw_upstream_log(srv, label,
                            "total timeout: %lld ms (timeouts.total) passed while connecting", tms);
        else
            gw_upstream_log(
                srv, label, "connect timeout: not connected%s within %lld ms (timeouts.connect)",
                srv->https ? " (TCP and TLS handshake)" : "", (long long)cu->connect_timeout_ms);
        break;
    case GW_UPFAIL_FIRST_BYTE_TIMEOUT:
        if (total)
            gw_upstream_log(srv, label,
                            "total timeout: %lld ms (timeouts.total) passed before the first byte",
                            tms);
        else
            gw_upstream_log(srv, label,
                            "first byte timeout: no response within %lld ms of the request "
                            "(timeouts.first_byte)",
                            (long long)cu->first_byte_timeout_ms);
        break;
    case GW_UPFAIL_TOTAL_TIMEOUT:
        gw_upstream_log(srv, label,
                        "total timeout: the response took longer than %lld ms (timeouts.total)",
                        tms);
        break;
    case GW_UPFAIL_BAD_RESPONSE:
        gw_upstream_log(srv, label, "bad response: %s%s", gw_http_error_reason(u->parser),
                        strcmp(gw_http_error_reason(u->parser), "body_callback") == 0
                            ? " (an SSE event over sse.max_event_bytes, or an answer too "
                              "large to buffer)"
                            : "");
        break;
    case GW_UPFAIL_RESET:
        gw_upstream_log(srv, label, "closed the connection before the response head");
        break;
    case GW_UPFAIL_TRUNCATED:
        gw_upstream_log(srv, label, "closed the connection mid-response");
        break;
    default: /* connect, connect_tls: upstream.c; the rest never reach a server */
        break;
    }
}

SL_COLD static void gw_proxy_fail(gw_req_t *r, gw_upfail_t kind)
{
    const gw_upfail_row_t *f = &gw_upfails[kind];
    gw_upconn_t *u = r->att.up;
    bool stale =
        u && u->reused && !r->att.t_first_byte_ns && !r->head_sent && kind == GW_UPFAIL_RESET;
    if (stale && r->attempts < 3) { /* The server closed a pooled connection just as we reused it:
                                     * nothing was processed, so resend on a fresh connection. */
        gw_proxy_finish(r, false, -1);
        gw_proxy_attempt(r, false);
        return;
    }
    gw_proxy_log_fail(r, kind);
    gw_metrics_upstream_error(r->att.pool, f->label);
    r->error_kind = f->label;
    if (!r->head_sent) {
        /* A held answer that broke reached nobody: as safe to retry as a
         * reset before the first byte. */
        int cls = f->fb_class;
        if (r->buffer_body && (kind == GW_UPFAIL_TRUNCATED || kind == GW_UPFAIL_BAD_RESPONSE))
            cls = FB_FAIL_RESET;
        gw_proxy_drop_held(r);
        gw_proxy_finish(r, false, 0);
        if (gw_fb_after_failure(r, cls, f->status))
            return;
        gw_respond_error(r, f->status, "server_error", f->code, f->message);
        return;
    }
    /* The answer already started: say so in-band when we can. */
    if (r->att.resp_sse) {
        gw_proxy_sse_error(
            r, strcmp(f->code, "upstream_timeout") == 0 ? f->code : "upstream_truncated",
            f->message);
        gw_proxy_write_end(r);
    } else {
        gw_out_abort(r); /* HTTP/1.1: a short body + close is the only signal */
    }
    gw_proxy_finish(r, false, 0);
    gw_conn_req_done(r->c);
}

/* Returns true while r is still reading from the same upstream connection;
 * false when the request ended (and may be freed) or moved on. */
static bool gw_proxy_up_read(gw_req_t *r)
{
    gw_upconn_t *u = r->att.up;
    struct evbuffer *in = bufferevent_get_input(u->bev);
    size_t total = evbuffer_get_length(in);
    if (total == 0)
        return true;
    sl_counter_add(gw_m.bytes_up_in, total);
    if (!r->att.t_first_byte_ns) {
        r->att.t_first_byte_ns = sl_now_ns();
        sl_histogram_observe(r->att.pool->m_ttfb,
                             (double)(r->att.t_first_byte_ns - r->att.t_sent_ns) / 1e9);
    }
    bool more = true; /* until the input is used up, or the answer ended */
    while (more && r->att.up == u) {
        const gw_http_feed_cbs_t cbs = {gw_proxy_head_cb, r, gw_proxy_body_cb, r};
        /* A stream's events of this read leave as one piece, queued
         * before anything below runs (docs/gateway.md, "One SSE
         * event through the relay"); a JSON answer has nothing to gather. */
        bool batch = r->stream || r->att.resp_sse;
        if (batch)
            gw_out_batch_begin(r);
        gw_http_state_t st = gw_http_feed_evbuffer_cbs(u->parser, in, NULL, &cbs);
        if (batch)
            gw_out_batch_end(r);
        if (r->stop_stream) {
            gw_proxy_on_stopped(r);
            return false;
        }
        switch (st) {
        case GW_HTTP_NEED_MORE:
            more = false;
            break;
        case GW_HTTP_HEAD: /* a 5xx (gw_proxy_head_cb): its body not fed yet */
            if (!gw_proxy_on_head(r))
                return false;
            break;
        case GW_HTTP_DONE:
            gw_proxy_on_done(r);
            return false;
        case GW_HTTP_ERROR:
            gw_proxy_fail(r, GW_UPFAIL_BAD_RESPONSE);
            return false;
        }
    }
    if (r->att.up != u)
        return false;
    if (r->att.head_setup_due)
        gw_proxy_after_head(r);
    /* Backpressure toward a slow client. */
    size_t hwm = (size_t)r->rt->conf->sse.buffer_bytes;
    if (!r->att.paused_upstream && gw_out_pending(r) > hwm) {
        bufferevent_disable(u->bev, EV_READ);
        r->att.paused_upstream = true;
        gw_out_watch(r, hwm / 2);
    }
    return true;
}

void gw_proxy_client_drained(gw_req_t *r)
{
    if (!r->att.paused_upstream || !r->att.up)
        return;
    size_t hwm = (size_t)r->rt->conf->sse.buffer_bytes;
    if (gw_out_pending(r) > hwm / 2)
        return;
    r->att.paused_upstream = false;
    gw_out_watch(r, 0);
    bufferevent_enable(r->att.up->bev, EV_READ);
}

static void gw_proxy_up_event(gw_req_t *r, short what)
{
    gw_upconn_t *u = r->att.up;
    if (what & BEV_EVENT_CONNECTED) {
        gw_proxy_arm(r, sl_now_ms() + r->att.pool->conf->first_byte_timeout_ms);
        return;
    }
    if (what & BEV_EVENT_EOF) {
        /* Drain what is buffered first, then let the parser judge the end:
         * a close-delimited body ends here; a framed one is truncated. */
        if (!gw_proxy_up_read(r))
            return;
    }
    if ((what & BEV_EVENT_EOF) && (r->head_sent || r->buffer_body)) {
        gw_http_state_t st = gw_http_feed_eof(u->parser, gw_proxy_body_cb, r);
        if (st == GW_HTTP_DONE) {
            gw_proxy_on_done(r);
            return;
        }
    }
    if (!u->connected) {
        gw_proxy_fail(r, u->srv->https ? GW_UPFAIL_CONNECT_TLS : GW_UPFAIL_CONNECT);
        return;
    }
    if (!r->att.t_first_byte_ns) {
        gw_proxy_fail(r, GW_UPFAIL_RESET);
        return;
    }
    gw_proxy_fail(r, GW_UPFAIL_TRUNCATED);
}
