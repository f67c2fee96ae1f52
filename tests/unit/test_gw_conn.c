/*
 * The gateway core without sockets: a client connection hosted on one end
 * of a bufferevent_pair, on a worker with only its loop services
 * (gw_worker_init_loop), against a runtime built from a conf string. The
 * test plays the client on the other end and drives the loop itself, so
 * nothing waits on a clock:
 *   connection -> request -> route table -> (pre-route hooks) -> handler,
 *   keep-alive reuse and pipelining, 400 + close on a malformed head,
 *   404/405 with Allow from the route table, the client leaving in every
 *   phase (head, body, waiting on a retry backoff: the wait slot), and
 *   nothing left armed on the loop afterwards.
 * The one socket is an upstream connect to a closed local port (refused at
 * once), so that a proxied request reaches an attempt and a backoff.
 */
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "common/log.h"
#include "conf/conf.h"
#include "gateway/gw_conn.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_req.h"
#include "gateway/gw_route.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_upstream.h"
#include "gateway/gw_worker.h"

typedef struct fx {
    struct event_base *base;
    gw_shared_t *shared;
    gw_worker_t w;
    struct bufferevent *client; /* the test's end of the pair */
    gw_conn_t *c;
    bool eof; /* an error or EOF on the client's end */
} fx_t;

static int closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        return 9;
    close(fd); /* bound, never listening, now closed: connects are refused */
    return ntohs(a.sin_port);
}

static void client_event(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    fx_t *f = arg;
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        f->eof = true;
}

static int setup(void **state)
{
    static bool metrics_done;
    if (!metrics_done) {
        gw_metrics_init(gw_route_name);
        metrics_done = true;
    }
    sl_log_set_level(SL_LOG_ERROR);
    fx_t *f = calloc(1, sizeof(*f));
    f->base = event_base_new();
    char yaml[1024];
    snprintf(yaml, sizeof(yaml),
             "listen:\n  - address: 127.0.0.1:8080\n"
             "upstreams:\n  main:\n    servers: [ { url: \"http://127.0.0.1:%d\" } ]\n"
             "models:\n  chat-model: { upstream: main }\n"
             "fallback: { retry: { attempts: 1, backoff: 30s, backoff_max: 30s } }\n"
             "log: { access: off }\n",
             closed_port());
    char err[512] = "";
    conf_t *c = conf_load_string(yaml, strlen(yaml), "test", err, sizeof(err));
    assert_non_null(c);
    f->shared = gw_shared_new();
    f->w.rt = gw_rt_new(c, f->shared, err, sizeof(err));
    if (!f->w.rt)
        fail_msg("runtime: %s", err);
    assert_int_equal(gw_worker_init_loop(&f->w, f->base), 0);
    f->w.id = 0;
    f->w.nwsrv = f->w.rt->nservers;
    f->w.wsrv = calloc(f->w.nwsrv, sizeof(*f->w.wsrv));
    for (size_t i = 0; i < f->w.nwsrv; i++)
        TAILQ_INIT(&f->w.wsrv[i].idle);
    struct bufferevent *pair[2];
    assert_int_equal(bufferevent_pair_new(f->base, 0, pair), 0);
    f->c = gw_conn_new_bev(&f->w, pair[0], false, "127.0.0.1");
    assert_non_null(f->c);
    f->client = pair[1];
    bufferevent_setcb(f->client, NULL, NULL, client_event, f);
    bufferevent_enable(f->client, EV_READ | EV_WRITE);
    *state = f;
    return 0;
}

static void guard_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    *(bool *)arg = true;
}

/* Runs the loop until cond holds: each turn waits for the next event, and a
 * guard timer bounds the whole wait (a failure, not a synchronisation: the
 * conditions are met by events the loop delivers, not by time passing). */
static bool spin(fx_t *f, bool (*cond)(fx_t *f))
{
    bool expired = false;
    struct event *guard = evtimer_new(f->base, guard_cb, &expired);
    struct timeval tv = {10, 0};
    evtimer_add(guard, &tv);
    while (!cond(f) && !expired)
        event_base_loop(f->base, EVLOOP_ONCE);
    event_free(guard);
    return cond(f);
}

/* Runs what is ready now, without waiting. */
static void spin_ready(fx_t *f)
{
    for (int i = 0; i < 100; i++)
        event_base_loop(f->base, EVLOOP_NONBLOCK);
}

/* A pair end that is freed tells its partner nothing: say EOF first, as a
 * socket's peer closing would. */
static void client_close(fx_t *f)
{
    bufferevent_flush(f->client, EV_WRITE, BEV_FINISHED);
    bufferevent_free(f->client);
    f->client = NULL;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    if (f->client)
        client_close(f);
    spin_ready(f); /* the gateway sees the close and frees at its safe point */
    assert_int_equal(f->w.nconns, 0);
    gw_upstream_worker_reset(&f->w);
    gw_worker_fini_loop(&f->w);
    /* Nothing left armed: no request, retry or connection timer. */
    assert_int_equal(event_base_get_num_events(f->base, EVENT_BASE_COUNT_ADDED), 0);
    free(f->w.wsrv);
    gw_rt_unref(f->w.rt);
    gw_shared_free(f->shared);
    event_base_free(f->base);
    free(f);
    return 0;
}

static void send_str(fx_t *f, const char *s)
{
    assert_int_equal(bufferevent_write(f->client, s, strlen(s)), 0);
}

typedef struct resp {
    int status;
    char head[2048];
    char body[4096];
} resp_t;

static bool have_response(fx_t *f)
{
    struct evbuffer *in = bufferevent_get_input(f->client);
    struct evbuffer_ptr p = evbuffer_search(in, "\r\n\r\n", 4, NULL);
    if (p.pos < 0)
        return false;
    size_t hl = (size_t)p.pos + 4;
    char head[2048];
    size_t n = evbuffer_copyout(in, head, hl < sizeof(head) - 1 ? hl : sizeof(head) - 1);
    head[n] = '\0';
    const char *cl = strstr(head, "Content-Length: ");
    size_t blen = cl ? strtoul(cl + 16, NULL, 10) : 0;
    return evbuffer_get_length(in) >= hl + blen;
}

static bool have_head(fx_t *f)
{
    struct evbuffer_ptr p = evbuffer_search(bufferevent_get_input(f->client), "\r\n\r\n", 4, NULL);
    return p.pos >= 0;
}

/* The next response on the client end (status 0 when none came). */
static void read_response(fx_t *f, resp_t *r)
{
    memset(r, 0, sizeof(*r));
    assert_true(spin(f, have_response));
    struct evbuffer *in = bufferevent_get_input(f->client);
    struct evbuffer_ptr p = evbuffer_search(in, "\r\n\r\n", 4, NULL);
    if (p.pos < 0)
        return;
    size_t hl = (size_t)p.pos + 4;
    assert_true(hl < sizeof(r->head));
    evbuffer_remove(in, r->head, hl);
    const char *cl = strstr(r->head, "Content-Length: ");
    size_t blen = cl ? strtoul(cl + 16, NULL, 10) : 0;
    assert_true(blen < sizeof(r->body));
    evbuffer_remove(in, r->body, blen);
    assert_int_equal(sscanf(r->head, "HTTP/1.1 %d", &r->status), 1);
}

/* A connection starts with its direct writer, on a line of its own
 * (gw_wio.h, gw_conn.h): what queueing a write and the flush read is one
 * cache line. Connections allocated the plain way (16-byte aligned) would
 * spread it over two, and nothing else would show it: eight of them, so
 * that a plain malloc cannot land them all on a line start by chance. */
#define LINE_CONNS 8
static void test_conn_wio_line_aligned(void **state)
{
    fx_t *f = *state;
    gw_conn_t *c[LINE_CONNS];
    struct bufferevent *peer[LINE_CONNS];
    for (int i = 0; i < LINE_CONNS; i++) {
        struct bufferevent *pair[2];
        assert_int_equal(bufferevent_pair_new(f->base, 0, pair), 0);
        c[i] = gw_conn_new_bev(&f->w, pair[0], false, "127.0.0.2");
        assert_non_null(c[i]);
        peer[i] = pair[1];
        assert_int_equal((uintptr_t)c[i] % GW_WIO_LINE, 0);
        assert_ptr_equal((void *)&c[i]->wio, (void *)c[i]);
        assert_ptr_equal(c[i]->wio.owner, c[i]);
        assert_string_equal(c[i]->peer, "127.0.0.2"); /* the cold tail written as before */
    }
    assert_int_equal((uintptr_t)f->c % GW_WIO_LINE, 0);
    for (int i = 0; i < LINE_CONNS; i++) {
        gw_conn_close(c[i]);
        bufferevent_free(peer[i]);
    }
    spin_ready(f);
}

static void test_health_keepalive_pipelined(void **state)
{
    fx_t *f = *state;
    resp_t r;
    send_str(f, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    read_response(f, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "{\"status\":\"ok\"}");
    assert_null(strstr(r.head, "Connection: close"));
    /* The same connection again (the spare request struct is reused), then
     * two requests in one write: two answers, in order. */
    send_str(f, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    read_response(f, &r);
    assert_int_equal(r.status, 200);
    send_str(f, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
                "HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    read_response(f, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"chat-model\""));
    memset(&r, 0, sizeof(r));
    assert_true(spin(f, have_head));
    struct evbuffer *in = bufferevent_get_input(f->client);
    size_t n = evbuffer_get_length(in);
    assert_true(n > 0 && n < sizeof(r.head));
    evbuffer_remove(in, r.head, n); /* HEAD: a head, no body */
    assert_int_equal(strncmp(r.head, "HTTP/1.1 200", 12), 0);
    assert_non_null(strstr(r.head, "\r\n\r\n"));
    assert_int_equal(strlen(strstr(r.head, "\r\n\r\n")), 4);
    assert_int_equal(f->w.nconns, 1);
    assert_int_equal(f->c->nrequests, 4);
    assert_false(f->eof);
}

static void test_route_table_answers(void **state)
{
    fx_t *f = *state;
    resp_t r;
    send_str(f, "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    read_response(f, &r);
    assert_int_equal(r.status, 405);
    assert_non_null(strstr(r.head, "Allow: GET, HEAD\r\n"));
    assert_non_null(strstr(r.body, "\"code\":\"method_not_allowed\""));
    send_str(f, "GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n");
    read_response(f, &r);
    assert_int_equal(r.status, 405);
    assert_non_null(strstr(r.head, "Allow: POST\r\n"));
    send_str(f, "GET /v1/requests/ HTTP/1.1\r\nHost: x\r\n\r\n"); /* a prefix needs an id */
    read_response(f, &r);
    assert_int_equal(r.status, 404);
    assert_non_null(strstr(r.body, "\"code\":\"not_found\""));
    send_str(f, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"); /* admin listener only */
    read_response(f, &r);
    assert_int_equal(r.status, 404);
    send_str(f, "GET /v1/models/chat-model HTTP/1.1\r\nHost: x\r\n\r\n");
    read_response(f, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"id\":\"chat-model\""));
    send_str(f, "GET /v1/models/nope HTTP/1.1\r\nHost: x\r\n\r\n");
    read_response(f, &r);
    assert_int_equal(r.status, 404);
    assert_non_null(strstr(r.body, "\"code\":\"model_not_found\""));
    assert_int_equal(f->c->nrequests, 6);
    assert_false(f->eof);
}

static bool conn_gone(fx_t *f)
{
    return f->w.nconns == 0;
}

static void test_malformed_head_400_and_close(void **state)
{
    fx_t *f = *state;
    resp_t r;
    send_str(f, "GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n");
    read_response(f, &r);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.head, "Connection: close\r\n"));
    assert_non_null(strstr(r.body, "\"type\":\"invalid_request_error\""));
    assert_true(spin(f, conn_gone)); /* closed after the answer, on its own */
}

static void leave(fx_t *f)
{
    client_close(f);
    f->client = NULL;
    assert_true(spin(f, conn_gone));
}

static bool conn_in_body(fx_t *f)
{
    return f->c->phase == GW_PHASE_BODY;
}

static bool conn_in_head(fx_t *f)
{
    return f->c->phase == GW_PHASE_HEAD;
}

static void test_client_leaves_mid_head(void **state)
{
    fx_t *f = *state;
    send_str(f, "POST /v1/chat/completions HTTP/1.1\r\nHo");
    assert_true(spin(f, conn_in_head));
    leave(f);
}

static void test_client_leaves_mid_body(void **state)
{
    fx_t *f = *state;
    send_str(f, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                "application/json\r\nContent-Length: 100\r\n\r\n{\"mo");
    assert_true(spin(f, conn_in_body));
    leave(f);
}

static bool waiting_on_backoff(fx_t *f)
{
    return f->c->req && f->c->req->wait.cancel != NULL && f->c->req->attempts == 1 &&
           !f->c->req->att.up;
}

/* Connection -> request -> hooks -> model route -> attempt (refused) ->
 * the fallback chain's retry waits on its backoff in the wait slot; the
 * client leaves: one cancel, the timer is gone (teardown checks nothing is
 * left armed), the connection is freed. */
static void test_client_leaves_during_retry_backoff(void **state)
{
    fx_t *f = *state;
    static const char body[] = "{\"model\":\"chat-model\",\"messages\":[{\"role\":\"user\","
                               "\"content\":\"hi\"}]}";
    char req[512];
    snprintf(req, sizeof(req),
             "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
             "application/json\r\nContent-Length: %zu\r\n\r\n%s",
             sizeof(body) - 1, body);
    send_str(f, req);
    /* The refused connect arrives through the loop like any event. */
    assert_true(spin(f, waiting_on_backoff));
    assert_int_equal(f->c->req->route, GW_ROUTE_CHAT);
    assert_string_equal(f->c->req->model->name, "chat-model");
    assert_int_equal(evbuffer_get_length(bufferevent_get_input(f->client)), 0);
    leave(f);
}

/* The texts of a struct the last request left in the cache, as one with
 * auth, the queue and a failed retry leaves them: every byte set. */
static void fill_texts(gw_req_t *r)
{
#define FILL(t)                                                                                    \
    do {                                                                                           \
        memset((t), 'S', sizeof(t) - 1);                                                           \
        (t)[sizeof(t) - 1] = '\0';                                                                 \
    } while (0)
    FILL(r->id);
    FILL(r->trace_id);
    FILL(r->traceparent);
    FILL(r->tx.client_id);
    FILL(r->tx.client_ip);
    FILL(r->tx.retry_after);
    FILL(r->tx.queued_id);
    FILL(r->tx.user);
#undef FILL
    r->tx_set = 0xff; /* each of them written */
}

/* A reused request struct clears only its texts' first bytes and the bits
 * of the rarely written ones (gw_req.h): one left out would hand the last
 * request's user, queued id or Retry-After to the next request on the
 * worker. */
static void test_reused_struct_texts_cleared(void **state)
{
    fx_t *f = *state;
    resp_t r;
    send_str(f, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    read_response(f, &r);
    assert_int_equal(r.status, 200);
    assert_true(f->w.nreq_cache > 0);
    gw_req_t *old = f->w.req_cache[f->w.nreq_cache - 1];
    fill_texts(old);
    static const char body[] = "{\"model\":\"chat-model\",\"messages\":[{\"role\":\"user\","
                               "\"content\":\"hi\"}]}";
    char req[512];
    snprintf(req, sizeof(req),
             "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
             "application/json\r\nContent-Length: %zu\r\n\r\n%s",
             sizeof(body) - 1, body);
    send_str(f, req);
    assert_true(spin(f, waiting_on_backoff)); /* routed, tried, refused: still live */
    gw_req_t *q = f->c->req;
    assert_ptr_equal(q, old); /* the cached struct, reused */
    assert_string_equal(gw_req_user(q), "");
    assert_string_equal(gw_req_client_id(q), "");
    assert_string_equal(gw_req_queued_id(q), "");
    assert_string_equal(gw_req_retry_after(q), "");
    assert_null(strchr(gw_req_client_ip(q), 'S'));
    /* ... without a write to their lines: the last request's bytes are
     * still there, only their bits are clear */
    assert_int_equal(q->tx.user[0], 'S');
    assert_int_equal(q->tx.queued_id[0], 'S');
    assert_int_equal(q->tx_set, 0);
    /* written by this request: its own values, none of the last one's */
    assert_int_equal(strlen(q->id), 16);
    assert_int_equal(strlen(q->trace_id), 32);
    assert_null(strchr(q->trace_id, 'S'));
    assert_int_equal(strncmp(q->traceparent, "00-", 3), 0);
    assert_null(strchr(q->traceparent, 'S'));
    leave(f);
}

/* ---- heads loaded from decoded fields (HTTP/2 streams) ------------------- */

static gw_http_parser_t *load_parser(void)
{
    gw_http_limits_t lim = {
        .request_line_bytes = 64, .header_bytes = 512, .header_lines = 4, .max_body_bytes = 10};
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, &lim);
    assert_non_null(p);
    return p;
}

static int load_body_cb(void *arg, const char *p, size_t n)
{
    strncat(arg, p, n);
    return 0;
}

static void test_load_head_valid(void **state)
{
    (void)state;
    gw_http_parser_t *p = load_parser();
    assert_int_equal(gw_http_load_header(p, GW_LIT("content-type"), GW_LIT(" application/json ")),
                     GW_HTTP_NEED_MORE);
    assert_int_equal(gw_http_load_header(p, GW_LIT("content-length"), GW_LIT("5")),
                     GW_HTTP_NEED_MORE);
    assert_int_equal(gw_http_load_head(p, "POST", "/v1/chat/completions?x=1", "api.example", true),
                     GW_HTTP_HEAD);
    const gw_http_msg_t *m = gw_http_msg(p);
    assert_non_null(m);
    assert_string_equal(m->method, "POST");
    assert_string_equal(m->target, "/v1/chat/completions?x=1");
    assert_int_equal(m->path_len, strlen("/v1/chat/completions"));
    assert_string_equal(m->host, "api.example");
    assert_int_equal(m->content_length, 5);
    assert_false(m->keep_alive);
    assert_string_equal(gw_http_header_find(m, "Content-Type")->value, "application/json");
    char body[32] = "";
    assert_int_equal(gw_http_load_body(p, "he", 2, false, load_body_cb, body), GW_HTTP_HEAD);
    assert_int_equal(gw_http_load_body(p, "llo", 3, true, load_body_cb, body), GW_HTTP_DONE);
    assert_string_equal(body, "hello");
    /* the next stream's head on the same parser */
    gw_http_parser_reset(p);
    assert_int_equal(gw_http_load_head(p, "GET", "/healthz", NULL, false), GW_HTTP_DONE);
    assert_string_equal(gw_http_msg(p)->host, "");
    gw_http_parser_free(p);
}

typedef struct load_case {
    const char *name, *value; /* one header, or NULL */
    const char *method, *path;
    bool body;
    int status;
    const char *reason;
} load_case_t;

static void test_load_head_refusals(void **state)
{
    (void)state;
    static const load_case_t cases[] = {
        {"connection", "close", "GET", "/", false, 400, "connection_header"},
        {"transfer-encoding", "chunked", "POST", "/", true, 400, "connection_header"},
        {"upgrade", "h2c", "GET", "/", false, 400, "connection_header"},
        {"x-ok", "a\rb", "GET", "/", false, 400, "bad_header"},
        {"bad name", "v", "GET", "/", false, 400, "bad_header"},
        {NULL, NULL, "G(T", "/", false, 400, "bad_method"},
        {NULL, NULL, "CONNECT", "/", false, 501, "connect"},
        {NULL, NULL, "GET", "*", false, 400, "bad_target"},
        {NULL, NULL, "GET", "/a b", false, 400, "bad_target"},
        {NULL, NULL, "GET", "/0123456789012345678901234567890123456789012345678901234567890", false,
         414, "uri_too_long"},
        {"content-length", "12", "POST", "/", true, 413, "body_too_large"},
        {"content-length", "1x", "POST", "/", true, 400, "bad_content_length"},
        {"content-length", "3", "POST", "/", false, 400, "body_length"},
        {"x-big", NULL, "GET", "/", false, 431, "header_too_large"},
    };
    char big[600];
    memset(big, 'b', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        const load_case_t *k = &cases[i];
        gw_http_parser_t *p = load_parser();
        if (k->name) {
            const char *v = k->value ? k->value : big;
            (void)gw_http_load_header(p, k->name, strlen(k->name), v, strlen(v));
        }
        gw_http_state_t st = gw_http_load_head(p, k->method, k->path, "h", k->body);
        if (st != GW_HTTP_ERROR)
            fail_msg("case %zu (%s): accepted", i, k->reason);
        assert_int_equal(gw_http_error_status(p), k->status);
        assert_string_equal(gw_http_error_reason(p), k->reason);
        gw_http_parser_free(p);
    }
    /* more header fields than header_lines; the same credential twice */
    gw_http_parser_t *p = load_parser();
    for (int i = 0; i < 4; i++)
        (void)gw_http_load_header(p, GW_LIT("x-a"), GW_LIT("1"));
    assert_int_equal(gw_http_load_header(p, GW_LIT("x-a"), GW_LIT("1")), GW_HTTP_ERROR);
    assert_string_equal(gw_http_error_reason(p), "too_many_headers");
    gw_http_parser_free(p);
    p = load_parser();
    (void)gw_http_load_header(p, GW_LIT("authorization"), GW_LIT("Bearer a"));
    (void)gw_http_load_header(p, GW_LIT("authorization"), GW_LIT("Bearer b"));
    assert_int_equal(gw_http_load_head(p, "GET", "/", "h", false), GW_HTTP_ERROR);
    assert_string_equal(gw_http_error_reason(p), "duplicate_header");
    gw_http_parser_free(p);
    /* the body: longer than its Content-Length, shorter, over max_body_bytes */
    p = load_parser();
    (void)gw_http_load_header(p, GW_LIT("content-length"), GW_LIT("2"));
    assert_int_equal(gw_http_load_head(p, "POST", "/", "h", true), GW_HTTP_HEAD);
    assert_int_equal(gw_http_load_body(p, "abc", 3, false, NULL, NULL), GW_HTTP_ERROR);
    assert_string_equal(gw_http_error_reason(p), "body_length");
    gw_http_parser_free(p);
    p = load_parser();
    (void)gw_http_load_header(p, GW_LIT("content-length"), GW_LIT("2"));
    assert_int_equal(gw_http_load_head(p, "POST", "/", "h", true), GW_HTTP_HEAD);
    assert_int_equal(gw_http_load_body(p, "a", 1, true, NULL, NULL), GW_HTTP_ERROR);
    assert_string_equal(gw_http_error_reason(p), "body_length");
    gw_http_parser_free(p);
    p = load_parser();
    assert_int_equal(gw_http_load_head(p, "POST", "/", "h", true), GW_HTTP_HEAD);
    assert_int_equal(gw_http_load_body(p, "0123456789", 10, false, NULL, NULL), GW_HTTP_HEAD);
    assert_int_equal(gw_http_load_body(p, "x", 1, true, NULL, NULL), GW_HTTP_ERROR);
    assert_int_equal(gw_http_error_status(p), 413);
    gw_http_parser_free(p);
}

/* ---- a stream connection and the output interface ---------------------- */

typedef struct rec {
    int status;
    int64_t length;
    int heads, ends, done;
    bool closed_when_done; /* the connection was already closing at on_close */
    char lines[1024];
    char body[4096];
    gw_conn_t *c;
} rec_t;

static void rec_head_begin(gw_conn_t *c, gw_req_t *r, int status, gw_sb_t *b)
{
    (void)r;
    (void)b;
    rec_t *x = c->out_arg;
    x->status = status;
}

static size_t rec_head_end(gw_conn_t *c, gw_req_t *r, gw_sb_t *b, int64_t length)
{
    (void)r;
    rec_t *x = c->out_arg;
    size_t n = b->n;
    assert_false(b->oom);
    assert_true(n < sizeof(x->lines));
    memcpy(x->lines, b->p, n);
    gw_sb_reset(b);
    x->lines[n] = '\0';
    x->length = length;
    x->heads++;
    return n;
}

static size_t rec_data(gw_conn_t *c, gw_req_t *r, const void *p, size_t n)
{
    (void)r;
    rec_t *x = c->out_arg;
    strncat(x->body, p, n);
    return n;
}

static size_t rec_end(gw_conn_t *c, gw_req_t *r)
{
    (void)r;
    ((rec_t *)c->out_arg)->ends++;
    return 0;
}

static void rec_abort(gw_conn_t *c)
{
    (void)c;
    fail_msg("no answer here is cut");
}

static size_t rec_pending(const gw_conn_t *c)
{
    (void)c;
    return 0;
}

static void rec_watch(gw_conn_t *c, size_t low)
{
    (void)c;
    (void)low;
}

static const gw_out_ops_t rec_ops = {
    .head_begin = rec_head_begin,
    .head_end = rec_head_end,
    .data = rec_data,
    .end = rec_end,
    .abort = rec_abort,
    .pending = rec_pending,
    .watch = rec_watch,
};

static void rec_on_close(void *arg)
{
    rec_t *x = arg;
    x->done++;
    x->closed_when_done = x->c->closed;
}

static void test_stream_conn_answers_through_the_output_interface(void **state)
{
    fx_t *f = *state;
    rec_t a = {0}, b = {0};
    unsigned before = f->w.nconns;
    gw_conn_t *c = gw_conn_new_stream(&f->w, &rec_ops, &a, "127.0.0.1", false);
    assert_non_null(c);
    assert_int_equal(f->w.nconns, before); /* not in the worker's list */
    a.c = c;
    c->on_close = rec_on_close;
    c->on_close_arg = &a;
    (void)gw_http_load_header(c->parser, GW_LIT("x-request-id"), GW_LIT("stream-one-id"));
    gw_conn_stream_fed(c, gw_http_load_head(c->parser, "GET", "/healthz", "h", false), 0);
    /* answered at once, through the interface: no HTTP/1.1 text */
    assert_int_equal(a.heads, 1);
    assert_int_equal(a.status, 200);
    assert_int_equal(a.length, (int64_t)strlen(a.body));
    assert_non_null(strstr(a.lines, "X-Request-Id: stream-one-id\r\n"));
    assert_null(strstr(a.lines, "HTTP/1.1"));
    assert_null(strstr(a.lines, "Content-Length"));
    assert_non_null(strstr(a.body, "ok"));
    assert_int_equal(a.done, 1); /* the request is done, the connection kept */
    assert_false(a.closed_when_done);
    /* reused for the next stream: a POST with a body, to a route that 404s */
    assert_ptr_equal(gw_conn_stream_reuse(c, &b), c);
    b.c = c;
    c->on_close = rec_on_close;
    c->on_close_arg = &b;
    (void)gw_http_load_header(c->parser, GW_LIT("content-type"), GW_LIT("application/json"));
    gw_conn_stream_fed(c, gw_http_load_head(c->parser, "POST", "/nope", "h", true), 0);
    assert_int_equal(b.heads, 0);
    gw_conn_stream_body(c, GW_LIT("{}"), false);
    gw_conn_stream_body(c, NULL, 0, true);
    assert_int_equal(b.heads, 1);
    assert_int_equal(b.status, 404);
    assert_non_null(strstr(b.body, "\"error\""));
    assert_int_equal(b.done, 1);
    assert_int_equal(a.done, 1);
    /* a malformed stream head: 400 through the interface, as HTTP/1.1 */
    rec_t d = {0};
    assert_ptr_equal(gw_conn_stream_reuse(c, &d), c);
    d.c = c;
    c->on_close = rec_on_close;
    c->on_close_arg = &d;
    (void)gw_http_load_header(c->parser, GW_LIT("connection"), GW_LIT("keep-alive"));
    gw_conn_stream_fed(c, gw_http_load_head(c->parser, "GET", "/healthz", "h", false), 0);
    assert_int_equal(d.status, 400);
    assert_non_null(strstr(d.body, "connection_header"));
    assert_int_equal(d.done, 1);
    gw_conn_close(c);
    spin_ready(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_conn_wio_line_aligned, setup, teardown),
        cmocka_unit_test_setup_teardown(test_health_keepalive_pipelined, setup, teardown),
        cmocka_unit_test_setup_teardown(test_route_table_answers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_head_400_and_close, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_leaves_mid_head, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_leaves_mid_body, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_leaves_during_retry_backoff, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reused_struct_texts_cleared, setup, teardown),
        cmocka_unit_test(test_load_head_valid),
        cmocka_unit_test(test_load_head_refusals),
        cmocka_unit_test_setup_teardown(test_stream_conn_answers_through_the_output_interface,
                                        setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
