/*
 * test_gw_listen.c — the listener's options (gateway/worker.c,
 * gw_worker_listen_prepare): sluice no longer sets TCP_NODELAY on each
 * accepted connection but once on the listener, which holds only because
 * Linux copies it to the sockets accept() returns. These tests pin that:
 * an accepted socket has TCP_NODELAY when its listener was prepared, and
 * does not when it was not (so the first can fail).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepted_inherit_nodelay),
        cmocka_unit_test(test_unprepared_has_no_nodelay),
        cmocka_unit_test(test_not_tcp_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
