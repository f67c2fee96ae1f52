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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_health_keepalive_pipelined, setup, teardown),
        cmocka_unit_test_setup_teardown(test_route_table_answers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_head_400_and_close, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_leaves_mid_head, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_leaves_mid_body, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_leaves_during_retry_backoff, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
