/*
 * fuzz_h2.c — libFuzzer target for the HTTP/2 adapter (gateway/h2.c): the
 * input is what a client sends after the preface (frames, or garbage), into
 * a real h2 connection on one end of a bufferevent_pair, on a worker with
 * only its loop services (as tests/unit/test_gw_conn.c does), against a
 * runtime built from a conf string. Streams become requests on the real
 * stream connections (socketless, their heads loaded from the decoded
 * fields, their answers through h2.c's output interface: routes, local
 * answers; proxied ones find the upstream port closed). Beyond "no crash,
 * no leak, no sanitizer report" it checks that the connection is gone once
 * the client leaves (its streams and their stream connections with it: a
 * stream connection left would be a leak the sanitizer reports), and that
 * nothing stays armed on the loop.
 */
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "common/log.h"
#include "conf/conf.h"
#include "gateway/gw_conn.h"
#include "gateway/gw_h2.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_route.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_upstream.h"
#include "gateway/gw_h2_mem.h"
#include "gateway/gw_worker.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct event_base *fz_base;
static gw_worker_t fz_w;

static int fz_closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0)
            close(fd);
        return 9;
    }
    close(fd); /* bound, never listening, now closed: connects are refused */
    return ntohs(a.sin_port);
}

static void fz_init(void)
{
    gw_metrics_init(gw_route_name);
    sl_log_set_level(SL_LOG_ERROR);
    fz_base = event_base_new();
    char yaml[1024];
    snprintf(yaml, sizeof(yaml),
             "listen:\n  - address: 127.0.0.1:8080\n    h2c: true\n"
             "upstreams:\n  main:\n    servers: [ { url: \"http://127.0.0.1:%d\" } ]\n"
             "models:\n  chat-model: { upstream: main }\n"
             "fallback: { retry: { attempts: 0 }, template: { enabled: false } }\n"
             "http2: { max_concurrent_streams: 8, reset_burst: 4, reset_rate: 1 }\n"
             "limits: { max_body_bytes: 4k }\n"
             "log: { access: off }\n",
             fz_closed_port());
    char err[512] = "";
    conf_t *c = conf_load_string(yaml, strlen(yaml), "fuzz", err, sizeof(err));
    gw_shared_t *sh = gw_shared_new();
    fz_w.rt = c && sh ? gw_rt_new(c, sh, err, sizeof(err)) : NULL;
    if (!fz_w.rt || gw_worker_init_loop(&fz_w, fz_base) != 0) {
        fprintf(stderr, "fuzz_h2: setup: %s\n", err);
        abort();
    }
    fz_w.nwsrv = fz_w.rt->nservers;
    fz_w.wsrv = calloc(fz_w.nwsrv, sizeof(*fz_w.wsrv));
    for (size_t i = 0; i < fz_w.nwsrv; i++)
        TAILQ_INIT(&fz_w.wsrv[i].idle);
}

static void fz_spin(void)
{
    for (int i = 0; i < 64; i++)
        event_base_loop(fz_base, EVLOOP_NONBLOCK);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!fz_base)
        fz_init();
    if (size > 64 * 1024)
        return 0;
    struct bufferevent *pair[2];
    if (bufferevent_pair_new(fz_base, 0, pair) != 0)
        abort();
    gw_conn_t *c = gw_conn_new_bev(&fz_w, pair[0], false, "127.0.0.1");
    if (!c)
        abort();
    c->h2c = true;
    bufferevent_enable(pair[1], EV_READ | EV_WRITE);
    bufferevent_write(pair[1], GW_H2_PREFACE, GW_H2_PREFACE_LEN);
    /* In two pieces: a frame cut across reads must parse the same. */
    bufferevent_write(pair[1], data, size / 2);
    fz_spin();
    bufferevent_write(pair[1], data + size / 2, size - size / 2);
    fz_spin();
    /* The client leaves: everything it started must go with it. */
    bufferevent_free(pair[1]);
    gw_conn_t *x, *next;
    for (x = TAILQ_FIRST(&fz_w.conns); x; x = next) {
        next = TAILQ_NEXT(x, link);
        if (!x->h2_stream)
            gw_conn_close(x);
    }
    fz_spin();
    if (fz_w.nconns != 0) { /* stream connections the h2 close did not reach */
        fprintf(stderr, "fuzz_h2: %zu connections left\n", fz_w.nconns);
        abort();
    }
    gw_upstream_worker_reset(&fz_w);
    fz_spin();
    if (gw_h2_mem_in_use(fz_w.h2mem) != 0) { /* a session's block nghttp2 did not give back */
        fprintf(stderr, "fuzz_h2: %zu nghttp2 blocks still in use\n", gw_h2_mem_in_use(fz_w.h2mem));
        abort();
    }
    return 0;
}
