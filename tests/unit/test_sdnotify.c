/*
 * Unit tests of common/sdnotify.c against a real unix datagram socket that
 * NOTIFY_SOCKET points at, as systemd's own: each call must send exactly one
 * datagram with exactly the protocol text systemd parses, with the sender's
 * credentials attached, and nothing at all when NOTIFY_SOCKET is unset. The
 * watchdog interval is read the way sd_watchdog_enabled(3) defines it.
 * sendmsg() on a unix socket queues the datagram before it returns, so every
 * read here is non-blocking: no waiting, no sleeps.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/sdnotify.h"

typedef struct nsock {
    int fd;
    char dir[64];
    char path[108];
} nsock_t;

static uint64_t mono_usec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* A datagram socket like systemd's notify socket: SO_PASSCRED so the
 * kernel attaches the sender's pid, as systemd needs to attribute it. */
static int nsock_setup(void **state)
{
    nsock_t *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    snprintf(s->dir, sizeof(s->dir), "/tmp/sl-notify-XXXXXX");
    assert_non_null(mkdtemp(s->dir));
    snprintf(s->path, sizeof(s->path), "%s/notify", s->dir);
    s->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(s->fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, s->path, strlen(s->path) + 1);
    assert_int_equal(bind(s->fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    int one = 1;
    assert_int_equal(setsockopt(s->fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)), 0);
    setenv("NOTIFY_SOCKET", s->path, 1);
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    *state = s;
    return 0;
}

static int nsock_teardown(void **state)
{
    nsock_t *s = *state;
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    close(s->fd);
    unlink(s->path);
    rmdir(s->dir);
    free(s);
    return 0;
}

/* Reads one queued datagram into buf (NUL-terminated); returns its length,
 * or -1 when none is queued. Asserts the sender is this process. */
static ssize_t nsock_read(nsock_t *s, char *buf, size_t cap)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(struct ucred))];
    } cbuf;
    struct iovec iov = {.iov_base = buf, .iov_len = cap - 1};
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = cbuf.buf,
                        .msg_controllen = sizeof(cbuf.buf)};
    ssize_t n = recvmsg(s->fd, &mh, MSG_DONTWAIT);
    if (n < 0) {
        assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
        return -1;
    }
    assert_false(mh.msg_flags & MSG_TRUNC);
    buf[n] = '\0';
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    assert_non_null(cm);
    assert_int_equal(cm->cmsg_level, SOL_SOCKET);
    assert_int_equal(cm->cmsg_type, SCM_CREDENTIALS);
    struct ucred uc;
    memcpy(&uc, CMSG_DATA(cm), sizeof(uc));
    assert_int_equal(uc.pid, getpid());
    return n;
}

/* Exactly one datagram, equal to want. */
static void expect_one(nsock_t *s, const char *want)
{
    char buf[1024];
    assert_true(nsock_read(s, buf, sizeof(buf)) >= 0);
    assert_string_equal(buf, want);
    assert_int_equal(nsock_read(s, buf, sizeof(buf)), -1);
}

static void test_unset_socket_sends_nothing(void **state)
{
    nsock_t *s = *state;
    unsetenv("NOTIFY_SOCKET");
    assert_int_equal(sl_notify_ready(), 0);
    assert_int_equal(sl_notify_reloading(), 0);
    assert_int_equal(sl_notify_stopping(), 0);
    assert_int_equal(sl_notify_watchdog(), 0);
    assert_int_equal(sl_notify_mainpid(), 0);
    assert_int_equal(sl_notify_status("x"), 0);
    char buf[64];
    assert_int_equal(nsock_read(s, buf, sizeof(buf)), -1);
}

static void test_ready(void **state)
{
    assert_int_equal(sl_notify_ready(), 1);
    expect_one(*state, "READY=1");
}

static void test_stopping(void **state)
{
    assert_int_equal(sl_notify_stopping(), 1);
    expect_one(*state, "STOPPING=1");
}

static void test_watchdog(void **state)
{
    assert_int_equal(sl_notify_watchdog(), 1);
    expect_one(*state, "WATCHDOG=1");
}

static void test_mainpid(void **state)
{
    char want[64];
    snprintf(want, sizeof(want), "MAINPID=%ld\nREADY=1", (long)getpid());
    assert_int_equal(sl_notify_mainpid(), 1);
    expect_one(*state, want);
}

/* RELOADING=1 then MONOTONIC_USEC=<now on CLOCK_MONOTONIC>, nothing else:
 * the timestamp lies between two reads of the clock around the call. */
static void test_reloading_carries_monotonic_usec(void **state)
{
    nsock_t *s = *state;
    uint64_t before = mono_usec();
    assert_int_equal(sl_notify_reloading(), 1);
    uint64_t after = mono_usec();
    char buf[256];
    assert_true(nsock_read(s, buf, sizeof(buf)) > 0);
    const char *pfx = "RELOADING=1\nMONOTONIC_USEC=";
    assert_int_equal(strncmp(buf, pfx, strlen(pfx)), 0);
    const char *num = buf + strlen(pfx);
    assert_true(num[0] >= '1' && num[0] <= '9');
    char *end = NULL;
    unsigned long long usec = strtoull(num, &end, 10);
    assert_string_equal(end, ""); /* no trailing newline or field */
    assert_true(usec >= before);
    assert_true(usec <= after);
    assert_int_equal(nsock_read(s, buf, sizeof(buf)), -1);
}

static void test_reload_sequence_in_order(void **state)
{
    nsock_t *s = *state;
    assert_int_equal(sl_notify_reloading(), 1);
    assert_int_equal(sl_notify_ready(), 1);
    char buf[256];
    assert_true(nsock_read(s, buf, sizeof(buf)) > 0);
    assert_int_equal(strncmp(buf, "RELOADING=1\n", 12), 0);
    assert_true(nsock_read(s, buf, sizeof(buf)) > 0);
    assert_string_equal(buf, "READY=1");
    assert_int_equal(nsock_read(s, buf, sizeof(buf)), -1);
}

/* STATUS= is one line: a newline in the text cannot add an assignment
 * (e.g. a conf path ending "\nSTOPPING=1"), and it is cut at 256 bytes. */
static void test_status_one_bounded_line(void **state)
{
    nsock_t *s = *state;
    assert_int_equal(sl_notify_status("reload refused\nSTOPPING=1"), 1);
    expect_one(s, "STATUS=reload refused");
    char longtext[600];
    memset(longtext, 'a', sizeof(longtext) - 1);
    longtext[sizeof(longtext) - 1] = '\0';
    assert_int_equal(sl_notify_status(longtext), 1);
    char buf[1024];
    assert_int_equal(nsock_read(s, buf, sizeof(buf)), 7 + 256);
    assert_int_equal(strspn(buf + 7, "a"), 256);
    assert_int_equal(sl_notify_status(NULL), 1);
    expect_one(s, "STATUS=");
}

/* systemd also listens on abstract sockets ("@name" in NOTIFY_SOCKET). */
static void test_abstract_socket(void **state)
{
    (void)state;
    char name[64];
    snprintf(name, sizeof(name), "sl-notify-test-%ld", (long)getpid());
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t n = strlen(name);
    memcpy(sa.sun_path + 1, name, n); /* sun_path[0] = 0: abstract */
    assert_int_equal(bind(fd, (struct sockaddr *)&sa,
                          (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)),
                     0);
    char env[80];
    snprintf(env, sizeof(env), "@%s", name);
    setenv("NOTIFY_SOCKET", env, 1);
    assert_int_equal(sl_notify_ready(), 1);
    char buf[64];
    ssize_t got = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);
    assert_int_equal(got, 7);
    buf[got] = '\0';
    assert_string_equal(buf, "READY=1");
    close(fd);
}

/* A socket that is gone is an error the caller can log, not a crash. */
static void test_missing_socket_is_an_error(void **state)
{
    nsock_t *s = *state;
    char gone[160];
    snprintf(gone, sizeof(gone), "%s/absent", s->dir);
    setenv("NOTIFY_SOCKET", gone, 1);
    errno = 0;
    assert_int_equal(sl_notify_ready(), -1);
    assert_int_equal(errno, ENOENT);
}

static void test_watchdog_usec(void **state)
{
    (void)state;
    assert_int_equal(sl_notify_watchdog_usec(), 0); /* WatchdogSec unset */
    setenv("WATCHDOG_USEC", "3000000", 1);
    assert_int_equal(sl_notify_watchdog_usec(), 3000000);
    char pid[32];
    snprintf(pid, sizeof(pid), "%ld", (long)getpid());
    setenv("WATCHDOG_PID", pid, 1);
    assert_int_equal(sl_notify_watchdog_usec(), 3000000);
    /* meant for another process (e.g. the one that exec'd us) */
    snprintf(pid, sizeof(pid), "%ld", (long)getpid() + 1);
    setenv("WATCHDOG_PID", pid, 1);
    assert_int_equal(sl_notify_watchdog_usec(), 0);
    unsetenv("WATCHDOG_PID");
    setenv("WATCHDOG_USEC", "soon", 1);
    assert_int_equal(sl_notify_watchdog_usec(), 0);
    setenv("WATCHDOG_USEC", "0", 1);
    assert_int_equal(sl_notify_watchdog_usec(), 0);
}

/* The new process of an upgrade inherits WATCHDOG_PID naming its parent
 * (the old process): adopting makes the watchdog its own; a WATCHDOG_PID
 * naming anyone else is left alone. */
static void test_watchdog_adopt(void **state)
{
    (void)state;
    char pid[32];
    assert_int_equal(sl_notify_watchdog_adopt(), 0); /* no watchdog at all */
    setenv("WATCHDOG_USEC", "2000000", 1);
    snprintf(pid, sizeof(pid), "%ld", (long)getppid());
    setenv("WATCHDOG_PID", pid, 1);
    assert_int_equal(sl_notify_watchdog_usec(), 0); /* the parent's, not ours */
    assert_int_equal(sl_notify_watchdog_adopt(), 1);
    snprintf(pid, sizeof(pid), "%ld", (long)getpid());
    assert_string_equal(getenv("WATCHDOG_PID"), pid);
    assert_int_equal(sl_notify_watchdog_usec(), 2000000);
    assert_int_equal(sl_notify_watchdog_adopt(), 0); /* already ours */
    snprintf(pid, sizeof(pid), "%ld", (long)getppid() + 7);
    setenv("WATCHDOG_PID", pid, 1);
    assert_int_equal(sl_notify_watchdog_adopt(), 0);
    assert_string_equal(getenv("WATCHDOG_PID"), pid);
    setenv("WATCHDOG_PID", "12x", 1);
    assert_int_equal(sl_notify_watchdog_adopt(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unset_socket_sends_nothing, nsock_setup,
                                        nsock_teardown),
        cmocka_unit_test_setup_teardown(test_ready, nsock_setup, nsock_teardown),
        cmocka_unit_test_setup_teardown(test_stopping, nsock_setup, nsock_teardown),
        cmocka_unit_test_setup_teardown(test_watchdog, nsock_setup, nsock_teardown),
        cmocka_unit_test_setup_teardown(test_mainpid, nsock_setup, nsock_teardown),
        cmocka_unit_test_setup_teardown(test_reloading_carries_monotonic_usec, nsock_setup,
                                        nsock_teardown),
        cmocka_unit_test_setup_teardown(test_reload_sequence_in_order, nsock_setup, nsock_teardown),
        cmocka_unit_test_setup_teardown(test_status_one_bounded_line, nsock_setup, nsock_teardown),
        cmocka_unit_test_setup_teardown(test_abstract_socket, nsock_setup, nsock_teardown),
        cmocka_unit_test_setup_teardown(test_missing_socket_is_an_error, nsock_setup,
                                        nsock_teardown),
        cmocka_unit_test_setup_teardown(test_watchdog_usec, nsock_setup, nsock_teardown),
        cmocka_unit_test_setup_teardown(test_watchdog_adopt, nsock_setup, nsock_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
