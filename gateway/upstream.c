/*
 * upstream.c — connections to model servers: picking a server (balancer +
 * ejection), a keep-alive pool per server per worker, connecting over plain
 * TCP or TLS (certificate and host verified, SNI), and returning or closing
 * connections when a request is done.
 *
 * An idle pooled connection keeps reading, so a server that closes it is
 * noticed and the connection dropped before anyone tries to reuse it; the
 * race where the server closes just as a request goes out is handled by
 * the proxy retrying once on a fresh connection (proxy.c).
 *
 * Every failed attempt explains itself in the error log (gw_upstream_log):
 * connect and TLS failures from here, where errno and OpenSSL's verdict are
 * known; timeouts, bad responses and early closes from the proxy. Lines are
 * rate-limited per server and cause, so an outage costs one line per key
 * per log.repeat_interval.
 */
#include <errno.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <arpa/inet.h>
#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <event2/buffer.h>
#include <openssl/ssl.h>
#include <stdatomic.h>

#include "common/log.h"
#include "common/sl.h"
#include "fallback/fallback.h"
#include "gateway/gw_balance.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_sup.h"
#include "gateway/gw_types.h"
#include "gateway/gw_upstream.h"
#include "gateway/gw_wio.h"
#include "gateway/gw_worker.h"
#include "gateway/http1.h"

/* The idle pool: LIFO (the warmest connection is reused first), capped
 * by `keepalive`, and expired by the worker's tick (gw_upstream_tick) after
 * keepalive_timeout (default 4 s: below uvicorn's 5 s, so we rarely race
 * the server's own close). With LIFO reuse the connections at the cold end
 * are exactly those the recent load did not need, so the pool follows the
 * recent peak of concurrent requests: after a burst of N it holds N for
 * keepalive_timeout, then shrinks to what is still used (nginx's keepalive
 * cache, Envoy's idle timeout). No timer per connection: a release costs
 * no timer operation, and thousands of idle connections no timer heap. */

static void gw_up_readcb(struct bufferevent *bev, void *arg);
static void gw_up_eventcb(struct bufferevent *bev, short what, void *arg);

static void gw_up_writecb(struct bufferevent *bev, void *arg)
{
    (void)bev;
    gw_upconn_t *u = arg;
    if (!u->closed)
        gw_wio_written(&u->wio);
}

static void gw_up_drained(void *arg)
{
    (void)arg; /* the request is out; the answer comes through readcb */
}

static void gw_up_failed(void *arg, short what)
{
    gw_up_eventcb(((gw_upconn_t *)arg)->bev, what, arg);
}

/* The worker's state for srv, or NULL when srv belongs to an older runtime
 * than the worker's (a request that began before a reload). */
static gw_wsrv_t *gw_wsrv_of(gw_worker_t *w, const gw_srv_rt_t *srv)
{
    if (srv->index < w->nwsrv && &w->rt->servers[srv->index] == srv)
        return &w->wsrv[srv->index];
    return NULL;
}

/* One pooled connection in or out of ws's idle list: the worker's own
 * count (the pool cap), the server's across workers (GET /admin/state) and
 * the pool's gauge. */
static void gw_idle_count(gw_wsrv_t *ws, gw_srv_rt_t *srv, int delta)
{
    ws->nidle += (size_t)(ssize_t)delta;
    atomic_fetch_add_explicit(&srv->idle, delta, memory_order_relaxed);
    sl_gauge_add(srv->m_idle, delta);
}

void gw_upstream_log(const gw_srv_rt_t *srv, const char *cause, const char *fmt, ...)
{
    if (sl_log_get_level() > SL_LOG_WARN)
        return;
    char key[600], msg[768];
    snprintf(key, sizeof(key), "%s %s", srv->url, cause);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    sl_log_limited(SL_LOG_WARN, key, "upstream %s %s: %s", srv->pool->name, srv->url, msg);
}

/* Logs why a connection that never became usable failed: errno for TCP;
 * for TLS, OpenSSL's verification result (unknown CA, expired, a name
 * mismatch with the name expected) or its handshake error (protocol
 * version, not TLS at all), with the SNI sent and the trust store used (a
 * mistyped ca_file shows here). err: the socket error at the event, or 0. */
SL_COLD static void gw_up_log_connect_error(gw_upconn_t *u, short what, int err)
{
    const gw_srv_rt_t *s = u->srv;
    SSL *ssl = s->https ? bufferevent_openssl_get_ssl(u->bev) : NULL;
    unsigned long e = 0, ssl_err = 0;
    /* The first OpenSSL error is the cause (the rest follow from it);
     * libevent also queues SSL_get_error() codes (lib 0, e.g. SYSCALL for a
     * refused connect), which are not OpenSSL's reasons. */
    while (ssl && (e = bufferevent_get_openssl_error(u->bev)) != 0)
        if (!ssl_err && ERR_GET_LIB(e) != 0)
            ssl_err = e;
    long vr = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
    if (!ssl || (vr == X509_V_OK && !ssl_err && err)) {
        /* The TCP connect itself failed (also for https: no TLS byte yet). */
        gw_upstream_log(s, "connect", "connect failed: %s",
                        err                      ? strerror(err)
                        : (what & BEV_EVENT_EOF) ? "connection closed"
                                                 : "unknown error");
        return;
    }
    struct in6_addr a6;
    struct in_addr a4;
    bool ip = inet_pton(AF_INET, s->host, &a4) == 1 || inet_pton(AF_INET6, s->host, &a6) == 1;
    const char *ca = s->pool->conf->tls_ca_file;
    char ctx[400];
    snprintf(ctx, sizeof(ctx), "SNI %s, CA %s%s", ip ? "none (an IP address)" : s->host,
             ca ? "file " : "the system store", ca ? ca : "");
    if (vr != X509_V_OK) {
        bool name = vr == X509_V_ERR_HOSTNAME_MISMATCH || vr == X509_V_ERR_IP_ADDRESS_MISMATCH;
        gw_upstream_log(s, "tls", "TLS certificate verify failed: %s (verify error %ld%s%s); %s",
                        X509_verify_cert_error_string(vr), vr, name ? ", expected " : "",
                        name ? s->host : "", ctx);
        return;
    }
    const char *reason =
        (what & BEV_EVENT_EOF) ? "connection closed by the server" : "unknown error";
    char eb[256];
    if (ssl_err) {
        reason = ERR_reason_error_string(ssl_err);
        if (!reason) {
            ERR_error_string_n(ssl_err, eb, sizeof(eb));
            reason = eb;
        }
    } else if (err) {
        reason = strerror(err);
    }
    gw_upstream_log(s, "tls", "TLS handshake failed: %s; %s", reason, ctx);
}

bool gw_upstream_other_eligible(const gw_pool_rt_t *pool, const gw_srv_rt_t *except, int64_t now_ms)
{
    if (!gw_sup_healthy(pool->sup))
        return false;
    for (size_t i = 0; i < pool->nservers; i++)
        if (pool->servers[i] != except && fb_breaker_eligible(pool->servers[i]->breaker, now_ms))
            return true;
    return false;
}

bool gw_upstream_any_eligible(const gw_pool_rt_t *pool, int64_t now_ms)
{
    return gw_upstream_other_eligible(pool, NULL, now_ms);
}

gw_srv_rt_t *gw_upstream_pick(gw_worker_t *w, gw_pool_rt_t *pool, const gw_srv_rt_t *avoid,
                              int64_t now_ms, int *admit)
{
    gw_balance_item_t items[64];
    /* round-robin state for a runtime the worker left behind: a slot is
     * zeroed only when used (a 256-byte clear was ~40 instructions a pick) */
    int scratch[64];
    size_t n = SL_MIN(pool->nservers, SL_ARRAY_LEN(items));
    size_t eligible = 0;
    if (!gw_sup_healthy(pool->sup))
        return NULL; /* its supervised server is (re)starting */
    for (size_t i = 0; i < n; i++) {
        gw_srv_rt_t *s = pool->servers[i];
        items[i].weight = s->weight;
        items[i].active = atomic_load_explicit(&s->active, memory_order_relaxed);
        items[i].eligible = fb_breaker_eligible(s->breaker, now_ms);
        eligible += items[i].eligible;
        gw_wsrv_t *ws = gw_wsrv_of(w, s);
        if (ws) {
            items[i].current = &ws->rr_current;
        } else {
            scratch[i] = 0;
            items[i].current = &scratch[i];
        }
    }
    /* A retry goes elsewhere when somewhere else is possible. */
    for (size_t i = 0; avoid && eligible > 1 && i < n; i++)
        if (pool->servers[i] == avoid && items[i].eligible) {
            items[i].eligible = false;
            eligible--;
        }
    /* The breaker may refuse the one picked (a half-open breaker's probe
     * slots are taken): then the next best. */
    while (eligible > 0) {
        int k = gw_balance_pick(items, n, pool->conf->balance, gw_worker_rand(w));
        if (k < 0)
            return NULL;
        fb_admit_t a = fb_breaker_acquire(pool->servers[k]->breaker, now_ms);
        if (a != FB_ADMIT_NO) {
            *admit = (int)a;
            return pool->servers[k];
        }
        items[k].eligible = false;
        eligible--;
    }
    return NULL;
}

static bool srv_https(const gw_upconn_t *u)
{
    return u->srv->https;
}

static void gw_upconn_free_cb(void *arg)
{
    gw_upconn_t *u = arg;
    free(u);
}

void gw_upstream_close(gw_upconn_t *u)
{
    if (u->closed)
        return;
    u->closed = true;
    gw_worker_t *w = u->w;
    if (!u->owner && u->idle_since_ms) {
        /* In an idle list (a runtime change unlinks them all first and
         * clears idle_since_ms). */
        gw_wsrv_t *ws = gw_wsrv_of(w, u->srv);
        if (ws) {
            TAILQ_REMOVE(&ws->idle, u, link);
            gw_idle_count(ws, u->srv, -1);
        }
    }
    if (u->bev) {
        gw_wio_fini(&u->wio);
        bufferevent_free(u->bev);
    }
    u->bev = NULL;
    gw_http_parser_free(u->parser);
    u->parser = NULL;
    u->owner = NULL;
    gw_worker_defer_free(w, gw_upconn_free_cb, u);
}

static int gw_up_tls_setup(SSL *ssl, const gw_srv_rt_t *s)
{
    struct in6_addr a6;
    struct in_addr a4;
    bool ip = inet_pton(AF_INET, s->host, &a4) == 1 || inet_pton(AF_INET6, s->host, &a6) == 1;
    if (ip)
        return X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), s->host) == 1 ? 0 : -1;
    if (SSL_set_tlsext_host_name(ssl, s->host) != 1)
        return -1;
    return SSL_set1_host(ssl, s->host) == 1 ? 0 : -1;
}

gw_upconn_t *gw_upstream_get(gw_worker_t *w, gw_srv_rt_t *srv, bool allow_reuse)
{
    gw_wsrv_t *ws = gw_wsrv_of(w, srv);
    if (allow_reuse && ws) {
        gw_upconn_t *u = TAILQ_FIRST(&ws->idle);
        if (u && u->generation == w->rt->generation && u->srv == srv) {
            TAILQ_REMOVE(&ws->idle, u, link);
            gw_idle_count(ws, srv, -1);
            u->idle_since_ms = 0;
            u->reused = true;
            u->nreq++;
            sl_counter_add(srv->m_conn_reused, 1);
            atomic_fetch_add_explicit(&srv->active, 1, memory_order_relaxed);
            return u;
        }
    }
    gw_upconn_t *u = aligned_alloc(GW_WIO_LINE, GW_WIO_LINE_SIZE(sizeof(*u)));
    if (!u)
        return NULL;
    memset(u, 0, sizeof(*u));
    u->w = w;
    u->srv = srv;
    u->generation = w->rt->generation;
    u->nreq = 1;
    const conf_limits_t *lim = &w->rt->conf->limits;
    gw_http_limits_t hl = {
        .request_line_bytes = (size_t)lim->header_bytes,
        .header_bytes = (size_t)lim->header_bytes,
        .header_lines = (size_t)lim->header_lines,
        .max_body_bytes = 0,
    };
    u->parser = gw_http_parser_new(GW_HTTP_RESPONSE, &hl);
    int opts = BEV_OPT_CLOSE_ON_FREE | (srv->https ? BEV_OPT_DEFER_CALLBACKS : 0);
    if (srv->https) {
        SSL *ssl = SSL_new(srv->pool->ssl_ctx);
        if (ssl && gw_up_tls_setup(ssl, srv) == 0)
            u->bev =
                bufferevent_openssl_socket_new(w->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING, opts);
        if (!u->bev && ssl)
            SSL_free(ssl);
    } else {
        u->bev = bufferevent_socket_new(w->base, -1, opts);
    }
    if (!u->parser || !u->bev) {
        gw_upstream_close(u);
        return NULL;
    }
    bufferevent_setcb(u->bev, gw_up_readcb, gw_up_writecb, gw_up_eventcb, u);
    gw_wio_init(&u->wio, w, u->bev, false, gw_up_drained, gw_up_failed, u);
    if (bufferevent_socket_connect(u->bev, (struct sockaddr *)&srv->addr, (int)srv->addrlen) != 0) {
        int err = errno;
        if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
            /* Out of descriptors or memory here: a local failure, not the
             * server's, so it must not count against its circuit breaker
             * (the caller cancels the admission it took). */
            sl_log_limited(SL_LOG_WARN, "upstream_socket", "upstream %s: no socket: %s", srv->url,
                           strerror(err));
            gw_upstream_close(u);
            return NULL;
        }
        /* Immediate failure (no route): report through the proxy's normal
         * path on the next loop turn. */
        u->connected = false;
        u->connect_errno = errno;
        bufferevent_trigger_event(u->bev, BEV_EVENT_ERROR, BEV_OPT_DEFER_CALLBACKS);
    } else if (!srv->https) {
        /* our reads, without libevent's FIONREAD (wio.c); only now, as
         * setting the socket reassigned the read event */
        (void)gw_wio_read_own(&u->wio);
    }
    /* after the reader is chosen (gw_wio_set_read_mark says why) */
    gw_wio_set_read_mark(&u->wio, 64 * 1024);
    bufferevent_enable(u->bev, EV_READ | EV_WRITE);
    sl_counter_add(srv->m_conn_new, 1);
    atomic_fetch_add_explicit(&srv->active, 1, memory_order_relaxed);
    return u;
}

/* bufferevent_enable, unless our read event (gw_wio_read_own: a plain
 * socket, no read timeout) already has what: then it would only re-add a
 * pending event with no timeout, an event_add that changes nothing. A
 * kept connection is enabled when it goes idle and again when it is
 * taken, so that is most requests. */
static void gw_up_enable(gw_upconn_t *u, short what)
{
    if (u->wio.own_read && (bufferevent_get_enabled(u->bev) & what) == what)
        return;
    bufferevent_enable(u->bev, what);
}

void gw_upstream_arm(gw_upconn_t *u)
{
    /* A direct writer needs no EV_WRITE (arming it costs an epoll_ctl). */
    gw_up_enable(u, u->wio.direct ? EV_READ : EV_READ | EV_WRITE);
}

void gw_upstream_release(gw_upconn_t *u, bool reusable)
{
    gw_worker_t *w = u->w;
    u->owner = NULL;
    gw_srv_rt_t *srv = u->srv;
    atomic_fetch_sub_explicit(&srv->active, 1, memory_order_relaxed);
    gw_wsrv_t *ws = gw_wsrv_of(w, srv);
    /* Pooled only when the request went out whole and the answer was read
     * whole (nginx's rule): a server that answered before reading all of
     * the request would take its unsent rest as the start of the next
     * request on this connection. */
    if (!reusable || u->closed || w->draining || !ws ||
        ws->nidle >= (size_t)srv->pool->conf->keepalive ||
        evbuffer_get_length(bufferevent_get_output(u->bev)) > 0 ||
        evbuffer_get_length(bufferevent_get_input(u->bev)) > 0) {
        gw_upstream_close(u);
        return;
    }
    gw_http_parser_reset_now(u->parser); /* frees its head storage while idle; warm now */
    u->idle_since_ms = sl_now_ms();
    TAILQ_INSERT_HEAD(&ws->idle, u, link); /* LIFO: the warmest connection first */
    gw_idle_count(ws, srv, 1);
    gw_up_enable(u, EV_READ); /* a close or stray bytes while idle are seen */
}

void gw_upstream_tick(gw_worker_t *w, int64_t now_ms)
{
    for (size_t i = 0; i < w->nwsrv; i++) {
        gw_wsrv_t *ws = &w->wsrv[i];
        gw_srv_rt_t *srv = &w->rt->servers[i];
        int64_t before = now_ms - srv->pool->conf->keepalive_timeout_ms;
        gw_upconn_t *u;
        /* The tail is the coldest: stop at the first one still wanted. */
        while ((u = TAILQ_LAST(&ws->idle, gw_upconn_list)) != NULL && u->idle_since_ms <= before) {
            sl_counter_add(srv->m_idle_closed, 1);
            gw_upstream_close(u);
        }
    }
}

static void gw_up_readcb(struct bufferevent *bev, void *arg)
{
    gw_upconn_t *u = arg;
    if (u->closed)
        return;
    if (!u->owner) {
        /* Bytes on an idle connection: the server is not speaking HTTP to
         * us any more (or sent garbage). Drop the connection. */
        (void)bev;
        gw_upstream_close(u);
        return;
    }
    u->on_read(u->owner);
}

static void gw_up_eventcb(struct bufferevent *bev, short what, void *arg)
{
    gw_upconn_t *u = arg;
    if (u->closed)
        return;
    if (what & BEV_EVENT_CONNECTED) {
        int fd = bufferevent_getfd(bev);
        int one = 1;
        if (fd >= 0)
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        u->connected = true;
        if (!srv_https(u))
            gw_wio_set_direct(&u->wio, true); /* connected: write directly from now on */
        else
            gw_wio_set_kick(&u->wio, true); /* handshake done: TLS writes in this turn */
        if (u->owner)
            u->on_event(u->owner, what);
        return;
    }
    if (!u->owner) {
        gw_upstream_close(u);
        return;
    }
    if (!u->connected && (what & (BEV_EVENT_ERROR | BEV_EVENT_EOF))) {
        int err = EVUTIL_SOCKET_ERROR(); /* libevent keeps it for (deferred) callbacks */
        gw_up_log_connect_error(u, what, u->connect_errno ? u->connect_errno : err);
    }
    u->on_event(u->owner, what);
}

void gw_upstream_worker_reset(gw_worker_t *w)
{
    for (size_t i = 0; i < w->nwsrv; i++) {
        gw_upconn_t *u;
        while ((u = TAILQ_FIRST(&w->wsrv[i].idle)) != NULL) {
            TAILQ_REMOVE(&w->wsrv[i].idle, u, link);
            gw_idle_count(&w->wsrv[i], u->srv, -1);
            u->idle_since_ms = 0; /* unlinked: close must not touch the list */
            gw_upstream_close(u);
        }
    }
}
