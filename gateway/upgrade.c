/*
 * upgrade.c — the SIGUSR2 binary upgrade, as nginx does it: the running
 * process starts the binary it was started from (the path /proc/self/exe
 * named at start, so a package that replaced the file is what runs) with
 * the same -c, handing it its listening sockets; the new process adopts
 * them instead of binding, starts, and says so; only then does the old one
 * stop accepting and drain. Both accept from the same sockets meanwhile,
 * so no connection is refused and no stream is cut.
 *
 * The hand-over, through the environment of the new process:
 *   SLUICE_INHERIT=fd:address;fd:address;...   the listening sockets (main
 *       and admin), FD_CLOEXEC cleared for them only; the new process takes
 *       the ones whose address its conf still lists, closes the rest, and
 *       binds what is new
 *   SLUICE_UPGRADE_FD=fd   the write end of a pipe: the new process writes
 *       one byte once its listeners and workers run, and closes it. The old
 *       one reads it on its main loop: a byte = ready (drain and exit); end
 *       of file without one = the new binary failed (keep serving, log its
 *       exit status).
 * Under systemd the new process says MAINPID=<pid> + READY=1 (NotifyAccess=
 * all) before the byte, so the old one exits only once systemd follows the
 * new one, and it never says STOPPING=1 for this drain.
 *
 * Refused (logged, nothing started) while an upgrade is under way, while
 * draining, with supervised model servers (upstreams.*.command: the new
 * process would start its own on the same ports) and with the file journal
 * queue (one process at a time holds its lock).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/sdnotify.h"
#include "fallback/fallback.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_server.h"

extern char **environ;

#define GW_INHERIT_ENV    "SLUICE_INHERIT"
#define GW_UPGRADE_FD_ENV "SLUICE_UPGRADE_FD"
#define GW_INHERIT_MAX    80 /* listen (64) + admin, with room */
/* A new binary that neither says ready nor exits within this is killed. */
#define GW_UPGRADE_DEADLINE_S 60

/* ---- the new process: what it inherited ---------------------------------- */

static struct gw_inherited {
    int fd;
    char address[256];
    bool taken;
} gw_inh[GW_INHERIT_MAX];
static size_t gw_ninh;
static int gw_ready_fd = -1; /* the old process's pipe, or -1 */

int gw_upgrade_inherit(void)
{
    const char *fdenv = getenv(GW_UPGRADE_FD_ENV);
    if (fdenv) {
        char *end;
        long v = strtol(fdenv, &end, 10);
        if (*end == '\0' && v > STDERR_FILENO && v < 65536 && fcntl((int)v, F_GETFD) >= 0) {
            gw_ready_fd = (int)v;
            fcntl(gw_ready_fd, F_SETFD, FD_CLOEXEC); /* not for our own children */
        }
        /* systemd's WATCHDOG_PID names the old process, our parent. */
        sl_notify_watchdog_adopt();
    }
    const char *inh = getenv(GW_INHERIT_ENV);
    for (const char *p = inh; p && *p && gw_ninh < GW_INHERIT_MAX;) {
        const char *semi = strchr(p, ';');
        size_t n = semi ? (size_t)(semi - p) : strlen(p);
        char item[300];
        if (n < sizeof(item)) {
            memcpy(item, p, n);
            item[n] = '\0';
            char *colon = strchr(item, ':');
            char *end = NULL;
            long fd = colon ? strtol(item, &end, 10) : -1;
            if (colon && end == colon && fd > STDERR_FILENO && fd < 65536 &&
                strlen(colon + 1) < sizeof(gw_inh[0].address) && fcntl((int)fd, F_GETFD) >= 0) {
                struct gw_inherited *h = &gw_inh[gw_ninh++];
                h->fd = (int)fd;
                snprintf(h->address, sizeof(h->address), "%s", colon + 1);
                fcntl(h->fd, F_SETFD, FD_CLOEXEC);
            }
        }
        p = semi ? semi + 1 : p + n;
    }
    /* Not for the model servers we start, nor a later upgrade's child. */
    unsetenv(GW_INHERIT_ENV);
    unsetenv(GW_UPGRADE_FD_ENV);
    if (gw_ninh)
        sl_info("upgrade: inherited %zu listening socket(s)", gw_ninh);
    return fdenv != NULL;
}

int gw_upgrade_take(const char *address)
{
    for (size_t i = 0; i < gw_ninh; i++) {
        if (!gw_inh[i].taken && strcmp(gw_inh[i].address, address) == 0) {
            gw_inh[i].taken = true;
            return gw_inh[i].fd;
        }
    }
    return -1;
}

void gw_upgrade_close_unused(void)
{
    for (size_t i = 0; i < gw_ninh; i++) {
        if (!gw_inh[i].taken) {
            sl_info("upgrade: %s is not in the conf any more: closed", gw_inh[i].address);
            close(gw_inh[i].fd);
            gw_inh[i].taken = true;
        }
    }
}

bool gw_upgrade_ready(void)
{
    if (gw_ready_fd < 0)
        return false;
    char b = 'R';
    ssize_t n;
    do
        n = write(gw_ready_fd, &b, 1);
    while (n < 0 && errno == EINTR);
    close(gw_ready_fd);
    gw_ready_fd = -1;
    return true;
}

/* ---- the old process: starting the new one ----------------------------------- */

static struct {
    char *exe;           /* /proc/self/exe at start */
    pid_t pid;           /* the new process, while it starts; 0 = none */
    int rfd;             /* the pipe's read end */
    struct event *ev;    /* rfd readable */
    struct event *timer; /* the deadline, then reaping */
    int reap_tries;
    void (*on_ready)(gw_server_t *);
    gw_server_t *srv;
} gw_up = {.rfd = -1};

void gw_upgrade_init(void)
{
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n <= 0) {
        sl_warn("upgrade: cannot read /proc/self/exe (%s): SIGUSR2 will be refused",
                strerror(errno));
        return;
    }
    buf[n] = '\0';
    free(gw_up.exe);
    gw_up.exe = sl_xstrdup(buf);
}

/* Stops watching; the events themselves are freed at the next start or at
 * exit, never inside their own callback. */
static void gw_upgrade_end(void)
{
    if (gw_up.ev)
        event_del(gw_up.ev);
    if (gw_up.timer)
        event_del(gw_up.timer);
    if (gw_up.rfd >= 0)
        close(gw_up.rfd);
    gw_up.rfd = -1;
}

static void gw_upgrade_free_events(void)
{
    if (gw_up.ev)
        event_free(gw_up.ev);
    if (gw_up.timer)
        event_free(gw_up.timer);
    gw_up.ev = gw_up.timer = NULL;
}

void gw_upgrade_fini(void)
{
    gw_upgrade_end();
    gw_upgrade_free_events();
    free(gw_up.exe);
    gw_up.exe = NULL;
}

static void gw_upgrade_reap_cb(evutil_socket_t fd, short what, void *arg);

/* The new process failed: say why once it is reaped (it closed the pipe
 * by exiting, so that is a moment away; polled, never a blocking wait). */
static void gw_upgrade_failed(const char *why)
{
    if (gw_up.ev)
        event_del(gw_up.ev);
    int st = 0;
    pid_t r = waitpid(gw_up.pid, &st, WNOHANG);
    if (r == 0 && gw_up.reap_tries++ < 100) {
        struct timeval tv = {0, 20000};
        event_del(gw_up.timer);
        event_assign(gw_up.timer, event_get_base(gw_up.timer), -1, 0, gw_upgrade_reap_cb,
                     (void *)why);
        event_add(gw_up.timer, &tv);
        return;
    }
    if (r == gw_up.pid && WIFEXITED(st))
        sl_error("upgrade failed: %s %s (exit status %d); this process keeps serving", gw_up.exe,
                 why, WEXITSTATUS(st));
    else if (r == gw_up.pid && WIFSIGNALED(st))
        sl_error("upgrade failed: %s %s (killed by signal %d); this process keeps serving",
                 gw_up.exe, why, WTERMSIG(st));
    else
        sl_error("upgrade failed: %s %s (pid %ld not reaped); this process keeps serving",
                 gw_up.exe, why, (long)gw_up.pid);
    gw_up.pid = 0;
    gw_upgrade_end();
}

static void gw_upgrade_reap_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_upgrade_failed(arg);
}

static void gw_upgrade_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    /* SIGKILL, not TERM: a TERM'd sluice would tell systemd STOPPING=1. */
    kill(gw_up.pid, SIGKILL);
    gw_upgrade_failed("was not ready in time: killed");
}

static void gw_upgrade_read_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    (void)arg;
    char b;
    ssize_t n = read(fd, &b, 1);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n == 1 && b == 'R') {
        sl_info("upgrade: new process %ld is ready; draining this one", (long)gw_up.pid);
        gw_up.pid = 0; /* not ours to reap: it outlives us */
        gw_upgrade_end();
        gw_up.on_ready(gw_up.srv);
        return;
    }
    gw_upgrade_failed("exited before it was ready");
}

/* "fd:address;..." of every open listening socket. */
static int gw_upgrade_inherit_env(const gw_server_t *s, char *out, size_t cap)
{
    size_t n = snprintf(out, cap, GW_INHERIT_ENV "=");
    for (size_t i = 0; i < s->nlistens; i++) {
        if (s->listens[i].fd < 0)
            continue;
        int w = snprintf(out + n, cap - n, "%s%d:%s", n > sizeof(GW_INHERIT_ENV) ? ";" : "",
                         s->listens[i].fd, s->listens[i].address);
        if (w < 0 || (size_t)w >= cap - n)
            return -1;
        n += (size_t)w;
    }
    return 0;
}

int gw_upgrade_start(gw_server_t *s, const gw_rt_t *rt, void (*on_ready)(gw_server_t *), char *err,
                     size_t errlen)
{
    if (gw_up.pid) {
        snprintf(err, errlen, "an upgrade is already under way (pid %ld)", (long)gw_up.pid);
        return -1;
    }
    if (atomic_load(&s->draining)) {
        snprintf(err, errlen, "draining");
        return -1;
    }
    if (!gw_up.exe) {
        snprintf(err, errlen, "the binary's path is unknown (/proc/self/exe)");
        return -1;
    }
    for (size_t i = 0; i < rt->conf->nupstreams; i++)
        if (rt->conf->upstreams[i].ncommand) {
            snprintf(err, errlen,
                     "upstreams.%s.command: the new process would start a second model server "
                     "on its port; restart instead",
                     rt->conf->upstreams[i].name);
            return -1;
        }
    if (s->queue && !fb_queue_is_redis(s->queue)) {
        snprintf(err, errlen,
                 "fallback.queue: the journal is locked by one process at a time; restart "
                 "instead (or use the redis store)");
        return -1;
    }
    /* Everything the child needs is made before fork(): after it, only
     * async-signal-safe calls (fcntl, execve, _exit), since other threads
     * may hold locks (malloc's) at the moment of the fork. */
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        return -1;
    }
    char inherit[8192], upfd[64];
    snprintf(upfd, sizeof(upfd), GW_UPGRADE_FD_ENV "=%d", p[1]);
    size_t nenv = 0;
    while (environ[nenv])
        nenv++;
    char **envp = calloc(nenv + 3, sizeof(*envp));
    int keep[GW_INHERIT_MAX];
    size_t nkeep = 0;
    if (!envp || gw_upgrade_inherit_env(s, inherit, sizeof(inherit)) != 0) {
        snprintf(err, errlen, envp ? "too many listeners to pass" : "out of memory");
        free(envp);
        close(p[0]);
        close(p[1]);
        return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < nenv; i++)
        if (strncmp(environ[i], GW_INHERIT_ENV "=", sizeof(GW_INHERIT_ENV)) != 0 &&
            strncmp(environ[i], GW_UPGRADE_FD_ENV "=", sizeof(GW_UPGRADE_FD_ENV)) != 0)
            envp[k++] = environ[i];
    envp[k++] = inherit;
    envp[k++] = upfd;
    envp[k] = NULL;
    for (size_t i = 0; i < s->nlistens && nkeep < GW_INHERIT_MAX; i++)
        if (s->listens[i].fd >= 0)
            keep[nkeep++] = s->listens[i].fd;
    char *argv[] = {gw_up.exe, "-c", s->conf_path, NULL};
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        free(envp);
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        /* The child: only these descriptors cross the exec. */
        for (size_t i = 0; i < nkeep; i++)
            fcntl(keep[i], F_SETFD, 0);
        fcntl(p[1], F_SETFD, 0);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execve(argv[0], argv, envp);
        _exit(127);
    }
    free(envp);
    close(p[1]);
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    gw_upgrade_free_events(); /* a failed earlier attempt's */
    gw_up.pid = pid;
    gw_up.rfd = p[0];
    gw_up.reap_tries = 0;
    gw_up.on_ready = on_ready;
    gw_up.srv = s;
    struct event_base *base = s->main.base;
    gw_up.ev = event_new(base, p[0], EV_READ | EV_PERSIST, gw_upgrade_read_cb, NULL);
    gw_up.timer = evtimer_new(base, gw_upgrade_deadline_cb, NULL);
    struct timeval tv = {GW_UPGRADE_DEADLINE_S, 0};
    if (!gw_up.ev || !gw_up.timer || event_add(gw_up.ev, NULL) != 0 ||
        event_add(gw_up.timer, &tv) != 0) {
        /* cannot watch it: it would run beside us unseen */
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        gw_up.pid = 0;
        gw_upgrade_end();
        gw_upgrade_free_events();
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    sl_info("upgrade: started %s (pid %ld) with %zu listening socket(s)", gw_up.exe, (long)pid,
            nkeep);
    return 0;
}
