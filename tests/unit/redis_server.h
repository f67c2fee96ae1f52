/*
 * redis_server.h — test helper: a real redis-server of the test's own, on a
 * free port in a temp dir, that a test can kill and restart, plus an event
 * loop runner that waits for a condition up to a deadline (no sleeps).
 *
 * Header-only (static functions) because every tests/unit/ .c file not named
 * test_* is linked into every unit binary; only the tests that include
 * this pay for it.
 */
#ifndef SL_TEST_REDIS_SERVER_H
#define SL_TEST_REDIS_SERVER_H

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/sl.h"

typedef struct rs_server {
    pid_t pid;
    int port;
    char dir[64];
    char password[64]; /* "" = none */
} rs_server_t;

static SL_UNUSED int rs_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        perror("rs_free_port");
        abort();
    }
    close(fd);
    return ntohs(sa.sin_port);
}

/* A blocking client for test set-up and checks; NULL when not reachable. */
static SL_UNUSED redisContext *rs_connect(const rs_server_t *rs)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", rs->port, tv);
    if (!c || c->err) {
        redisFree(c);
        return NULL;
    }
    if (rs->password[0]) {
        redisReply *rep = redisCommand(c, "AUTH %s", rs->password);
        freeReplyObject(rep);
    }
    return c;
}

/* Runs one command on a fresh blocking connection; returns the reply
 * (caller frees) or NULL. */
static SL_UNUSED redisReply *rs_cmd(const rs_server_t *rs, const char *fmt, ...)
{
    redisContext *c = rs_connect(rs);
    if (!c)
        return NULL;
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    return rep;
}

/* Sends a command without waiting for its reply (DEBUG SLEEP, CLIENT
 * PAUSE): the connection is left open (returned; redisFree it later). */
static SL_UNUSED redisContext *rs_send_nowait(const rs_server_t *rs, const char *cmd)
{
    redisContext *c = rs_connect(rs);
    if (!c)
        return NULL;
    redisAppendCommand(c, cmd);
    int done = 0;
    while (!done)
        if (redisBufferWrite(c, &done) != REDIS_OK)
            break;
    return c;
}

static SL_UNUSED bool rs_ping(const rs_server_t *rs)
{
    redisReply *rep = rs_cmd(rs, "PING");
    bool ok = rep && rep->type == REDIS_REPLY_STATUS && strcmp(rep->str, "PONG") == 0;
    freeReplyObject(rep);
    return ok;
}

/* Starts (or restarts, on the same port) the server and waits until it
 * answers PING, up to 5 s. */
static SL_UNUSED void rs_start(rs_server_t *rs)
{
    if (!rs->dir[0]) {
        snprintf(rs->dir, sizeof(rs->dir), "/tmp/sl-redis-XXXXXX");
        if (!mkdtemp(rs->dir)) {
            perror("mkdtemp");
            abort();
        }
        rs->port = rs_free_port();
    }
    char port[16], logf[128];
    snprintf(port, sizeof(port), "%d", rs->port);
    snprintf(logf, sizeof(logf), "%s/redis.log", rs->dir);
    pid_t pid = fork();
    if (pid == 0) {
        const char *argv[24];
        int n = 0;
        argv[n++] = "redis-server";
        argv[n++] = "--port";
        argv[n++] = port;
        argv[n++] = "--bind";
        argv[n++] = "127.0.0.1";
        argv[n++] = "--dir";
        argv[n++] = rs->dir;
        argv[n++] = "--save";
        argv[n++] = "";
        argv[n++] = "--appendonly";
        argv[n++] = "no";
        argv[n++] = "--logfile";
        argv[n++] = logf;
        argv[n++] = "--enable-debug-command";
        argv[n++] = "yes";
        if (rs->password[0]) {
            argv[n++] = "--requirepass";
            argv[n++] = rs->password;
        }
        argv[n] = NULL;
        execvp("redis-server", (char *const *)argv);
        _exit(127);
    }
    rs->pid = pid;
    int64_t deadline = sl_now_ms() + 5000;
    while (!rs_ping(rs)) {
        if (sl_now_ms() > deadline) {
            fprintf(stderr, "redis-server on port %d did not start\n", rs->port);
            abort();
        }
        struct timespec ts = {0, 5 * 1000 * 1000}; /* polling for a process to come up */
        nanosleep(&ts, NULL);
    }
}

static SL_UNUSED void rs_kill(rs_server_t *rs)
{
    if (rs->pid > 0) {
        kill(rs->pid, SIGKILL);
        waitpid(rs->pid, NULL, 0);
        rs->pid = 0;
    }
}

static SL_UNUSED void rs_cleanup(rs_server_t *rs)
{
    rs_kill(rs);
    if (rs->dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", rs->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", rs->dir);
        rs->dir[0] = '\0';
    }
}

/* ---- event loop runner ---------------------------------------------------- */

static SL_UNUSED void rs_tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
}

/* Runs the loop until cond(arg) is true or `ms` pass; returns cond's last
 * value. A 1 ms tick keeps the loop from blocking past the deadline. */
static SL_UNUSED bool rs_run_until(struct event_base *base, bool (*cond)(void *), void *arg,
                                   int64_t ms)
{
    struct event *tick = event_new(base, -1, EV_PERSIST, rs_tick_cb, NULL);
    struct timeval tv = {0, 1000};
    event_add(tick, &tv);
    int64_t deadline = sl_now_ms() + ms;
    bool ok;
    while (!(ok = cond(arg)) && sl_now_ms() < deadline)
        event_base_loop(base, EVLOOP_ONCE);
    event_free(tick);
    return ok;
}

static SL_UNUSED bool rs_never(void *arg)
{
    (void)arg;
    return false;
}

/* Runs the loop for `ms` (to let things that must NOT happen have a chance). */
static SL_UNUSED void rs_run_for(struct event_base *base, int64_t ms)
{
    (void)rs_run_until(base, rs_never, NULL, ms);
}

#endif
