/*
 * test_gw_listen.c — what worker.c does for many connections at little
 * cost per connection:
 * - the listener's options (gw_worker_listen_prepare): sluice no longer
 *   sets TCP_NODELAY on each accepted connection but once on the
 *   listener, which holds only because Linux copies it to the sockets
 *   accept() returns. An accepted socket has TCP_NODELAY when its listener
 *   was prepared, and does not when it was not (so the first can fail).
 * - common timeouts (gw_worker_timeout): one per duration, reused, the
 *   table's cap, and timers on them firing after their duration and in
 *   order, beside a heap timer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>

#include "common/sl.h"
#include "gateway/gw_worker.h"

/* A loopback listener on an ephemeral port; its address in *sa. */
static int listener(struct sockaddr_in *sa)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    *sa = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)sa, sizeof(*sa)), 0);
    socklen_t len = sizeof(*sa);
    assert_int_equal(getsockname(fd, (struct sockaddr *)sa, &len), 0);
    assert_int_equal(listen(fd, 4), 0);
    return fd;
}

/* TCP_NODELAY of a connection accepted on lfd (prepared or not). */
static int accepted_nodelay(bool prepare)
{
    struct sockaddr_in sa;
    int lfd = listener(&sa);
    if (prepare)
        assert_int_equal(gw_worker_listen_prepare(lfd), 0);
    int cfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(cfd >= 0);
    assert_int_equal(connect(cfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    int afd = accept(lfd, NULL, NULL);
    assert_true(afd >= 0);
    int v = -1;
    socklen_t len = sizeof(v);
    assert_int_equal(getsockopt(afd, IPPROTO_TCP, TCP_NODELAY, &v, &len), 0);
    close(afd);
    close(cfd);
    close(lfd);
    return v;
}

static void test_accepted_inherit_nodelay(void **state)
{
    (void)state;
    assert_int_not_equal(accepted_nodelay(true), 0);
}

static void test_unprepared_has_no_nodelay(void **state)
{
    (void)state;
    assert_int_equal(accepted_nodelay(false), 0);
}

static void test_not_tcp_is_refused(void **state)
{
    (void)state;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(gw_worker_listen_prepare(fd), -1);
    close(fd);
}

static void test_common_timeout_table(void **state)
{
    (void)state;
    gw_worker_t w = {0};
    w.base = event_base_new();
    assert_non_null(w.base);
    struct timeval a, b, c;
    const struct timeval *ta = gw_worker_timeout(&w, 1500, &a);
    assert_int_equal(a.tv_sec, 1);
    assert_int_equal(a.tv_usec, 500000);
    assert_ptr_not_equal(ta, &a); /* a common timeout, not the plain value */
    assert_ptr_equal(gw_worker_timeout(&w, 1500, &b), ta); /* reused */
    assert_ptr_not_equal(gw_worker_timeout(&w, 2000, &c), ta);
    assert_int_equal(w.nctimeouts, 2);
    assert_ptr_equal(gw_worker_timeout(&w, 0, &c), &c); /* nothing to queue */
    assert_ptr_equal(gw_worker_timeout(&w, -5, &c), &c);
    assert_int_equal(c.tv_sec, 0);
    assert_int_equal(c.tv_usec, 0);
    for (int64_t ms = 3000; w.nctimeouts < GW_WORKER_CTIMEOUTS; ms += 1000)
        assert_ptr_not_equal(gw_worker_timeout(&w, ms, &c), &c);
    /* full: the plain timeval (the heap), still right */
    assert_ptr_equal(gw_worker_timeout(&w, 999999, &c), &c);
    assert_int_equal(c.tv_sec, 999);
    assert_int_equal(c.tv_usec, 999000);
    assert_ptr_equal(gw_worker_timeout(&w, 1500, &b), ta); /* the old ones stay */
    event_base_free(w.base);
}

typedef struct {
    int order[8];
    int64_t at_ms[8];
    int n;
} fired_t;

static fired_t fired;

/* libevent keeps time on CLOCK_MONOTONIC_COARSE (one tick, ~4 ms): a
 * deadline is "never early" on that clock, and may look a tick early on the
 * precise one, so the test reads the same clock libevent does. */
static int64_t coarse_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    fired.order[fired.n] = (int)(intptr_t)arg;
    fired.at_ms[fired.n] = coarse_ms();
    fired.n++;
}

static void test_common_timeout_fires(void **state)
{
    (void)state;
    gw_worker_t w = {0};
    w.base = event_base_new();
    assert_non_null(w.base);
    fired = (fired_t){0};
    struct event *ev[4];
    for (int i = 0; i < 4; i++)
        ev[i] = evtimer_new(w.base, on_timer, (void *)(intptr_t)i);
    int64_t t0 = coarse_ms();
    struct timeval tv;
    /* three on one 60 ms common timeout, one 20 ms on the heap */
    for (int i = 0; i < 3; i++)
        assert_int_equal(evtimer_add(ev[i], gw_worker_timeout(&w, 60, &tv)), 0);
    struct timeval heap = {0, 20000};
    assert_int_equal(evtimer_add(ev[3], &heap), 0);
    /* a re-add moves the first to the back of its queue */
    assert_int_equal(evtimer_add(ev[0], gw_worker_timeout(&w, 60, &tv)), 0);
    assert_int_equal(event_base_dispatch(w.base), 1); /* no events left */
    assert_int_equal(fired.n, 4);
    assert_int_equal(fired.order[0], 3);
    assert_int_equal(fired.order[1], 1);
    assert_int_equal(fired.order[2], 2);
    assert_int_equal(fired.order[3], 0);
    assert_true(fired.at_ms[0] - t0 >= 19);
    for (int i = 1; i < 4; i++) {
        assert_true(fired.at_ms[i] - t0 >= 59); /* never early */
        assert_true(fired.at_ms[i] - t0 < 2000);
    }
    for (int i = 0; i < 4; i++)
        event_free(ev[i]);
    event_base_free(w.base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepted_inherit_nodelay),
        cmocka_unit_test(test_unprepared_has_no_nodelay),
        cmocka_unit_test(test_not_tcp_is_refused),
        cmocka_unit_test(test_common_timeout_table),
        cmocka_unit_test(test_common_timeout_fires),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
