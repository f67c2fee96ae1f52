/*
 * sdnotify.c — the systemd notification calls (see sdnotify.h). A thin layer
 * over sd_notify(3) so the rest of sluice names what happened (ready,
 * reloading, stopping) instead of writing protocol strings, and so the
 * protocol has one place that the unit test can hold to exact datagrams.
 *
 * sd_notify() is called with unset_environment = 0 on purpose: the process
 * started by a SIGUSR2 upgrade inherits the environment and must still find
 * NOTIFY_SOCKET to announce itself with MAINPID.
 */
#include "common/sdnotify.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "common/sl.h"

/* sd_notify returns > 0 sent, 0 no NOTIFY_SOCKET, < 0 -errno. */
static int sl_notify_send(const char *msg)
{
    int rc = sd_notify(0, msg);
    if (rc > 0)
        return 1;
    if (rc == 0)
        return 0;
    errno = -rc;
    return -1;
}

int sl_notify_ready(void)
{
    return sl_notify_send("READY=1");
}

int sl_notify_reloading(void)
{
    /* CLOCK_MONOTONIC, as systemd's own now(CLOCK_MONOTONIC) compares it. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t usec = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
    char msg[64];
    snprintf(msg, sizeof(msg), "RELOADING=1\nMONOTONIC_USEC=%llu", (unsigned long long)usec);
    return sl_notify_send(msg);
}

int sl_notify_stopping(void)
{
    return sl_notify_send("STOPPING=1");
}

int sl_notify_watchdog(void)
{
    return sl_notify_send("WATCHDOG=1");
}

int sl_notify_mainpid(void)
{
    char msg[64];
    snprintf(msg, sizeof(msg), "MAINPID=%ld\nREADY=1", (long)getpid());
    return sl_notify_send(msg);
}

int sl_notify_status(const char *text)
{
    char msg[8 + 256 + 1];
    size_t n = text ? strcspn(text, "\n") : 0;
    n = SL_MIN(n, (size_t)256);
    snprintf(msg, sizeof(msg), "STATUS=%.*s", (int)n, text ? text : "");
    return sl_notify_send(msg);
}

int64_t sl_notify_watchdog_usec(void)
{
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) <= 0)
        return 0;
    return usec > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)usec;
}

int sl_notify_watchdog_adopt(void)
{
    const char *v = getenv("WATCHDOG_PID");
    if (!v || !getenv("WATCHDOG_USEC"))
        return 0;
    char *end = NULL;
    errno = 0;
    long pid = strtol(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || pid <= 1 || pid != (long)getppid())
        return 0;
    char own[24];
    snprintf(own, sizeof(own), "%ld", (long)getpid());
    return setenv("WATCHDOG_PID", own, 1) == 0 ? 1 : 0;
}
