/*
 * supervise.c — model servers sluice starts itself (`upstreams.<name>.command`,
 * e.g. llama.cpp's server running a small model as the local tier).
 *
 * The main thread starts each command in its own process group, checks its
 * health (GET BASE/models on the pool's first server — /v1/models unless
 * its URL has a base path — every 500 ms until it
 * answers 200, then every 5 s), and restarts it with backoff (1 s doubling
 * to 30 s; reset after a minute up) when it exits or stops answering. Until
 * it is healthy its pool counts as out of service: the balancer skips it,
 * /readyz says so, and the fallback chain goes on to the next tier. At exit
 * the process group gets SIGTERM, then SIGKILL after 5 s.
 *
 * The supervisor lives for the whole process (the `command` key needs a
 * restart); runtimes read each pool's health through an atomic flag.
 */
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <stdatomic.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/sl.h"
#include "conf/conf.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_sup.h"
#include "gateway/gw_types.h"

extern char **environ;

#define GW_SUP_BACKOFF_MIN_MS 1000
#define GW_SUP_BACKOFF_MAX_MS 30000
#define GW_SUP_STABLE_MS      60000
#define GW_SUP_PROBE_FAST_MS  500
#define GW_SUP_PROBE_SLOW_MS  5000
#define GW_SUP_PROBE_FAILS    3 /* failed probes in a row (once up) that restart it */

struct gw_sup {
    gw_sup_t *next;
    char *upstream;
    char **argv;
    struct sockaddr_storage addr; /* the pool's first server */
    socklen_t addrlen;
    char host_header[300];
    char models_path[CONF_BASE_PATH_MAX + 16]; /* base_path + "/models" */
    struct event_base *base;
    struct event *timer;
    pid_t pid;
    _Atomic bool healthy;
    int64_t started_ms, healthy_since_ms, next_start_ms;
    int64_t backoff_ms;
    int probe_fails;
    struct bufferevent *probe;
    sl_mseries_t *m_restarts, *m_up;
};

static gw_sup_t *gw_sups;

bool gw_sup_healthy(const gw_sup_t *s)
{
    return !s || atomic_load_explicit(&s->healthy, memory_order_relaxed);
}

long long gw_sup_restarts(const gw_sup_t *s)
{
    return s && s->m_restarts ? (long long)sl_counter_value(s->m_restarts) : 0;
}

gw_sup_t *gw_sup_find(const char *upstream)
{
    for (gw_sup_t *s = gw_sups; s; s = s->next)
        if (strcmp(s->upstream, upstream) == 0)
            return s;
    return NULL;
}

static void gw_sup_set_healthy(gw_sup_t *s, bool up)
{
    if (atomic_exchange(&s->healthy, up) != up) {
        sl_gauge_set(s->m_up, up ? 1 : 0);
        sl_info("supervised %s: %s", s->upstream, up ? "healthy" : "not healthy");
    }
}

static void gw_sup_arm(gw_sup_t *s, int64_t ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(s->timer, &tv);
}

static void gw_sup_start(gw_sup_t *s)
{
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    posix_spawnattr_setpgroup(&at, 0); /* its own group: stopped as a whole */
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&at, &none);
    sigset_t dfl;
    sigemptyset(&dfl);
    sigaddset(&dfl, SIGPIPE);
    sigaddset(&dfl, SIGTERM);
    sigaddset(&dfl, SIGHUP);
    sigaddset(&dfl, SIGINT);
    posix_spawnattr_setsigdefault(&at, &dfl);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
    pid_t pid;
    int rc = posix_spawnp(&pid, s->argv[0], NULL, &at, s->argv, environ);
    posix_spawnattr_destroy(&at);
    int64_t now = sl_now_ms();
    if (rc != 0) {
        sl_error("supervised %s: cannot start %s: %s", s->upstream, s->argv[0], strerror(rc));
        s->pid = 0;
        s->next_start_ms = now + s->backoff_ms;
        s->backoff_ms = SL_MIN(s->backoff_ms * 2, GW_SUP_BACKOFF_MAX_MS);
        return;
    }
    s->pid = pid;
    s->started_ms = now;
    s->probe_fails = 0;
    sl_info("supervised %s: started %s (pid %d)", s->upstream, s->argv[0], (int)pid);
}

static void gw_sup_kill(gw_sup_t *s, int sig)
{
    if (s->pid > 0)
        kill(-s->pid, sig);
}

/* The child ended (or was made to): schedule the next start. */
static void gw_sup_ended(gw_sup_t *s, const char *why)
{
    int64_t now = sl_now_ms();
    gw_sup_set_healthy(s, false);
    if (s->healthy_since_ms && now - s->healthy_since_ms >= GW_SUP_STABLE_MS)
        s->backoff_ms = GW_SUP_BACKOFF_MIN_MS; /* it ran well: start over gently */
    s->healthy_since_ms = 0;
    s->pid = 0;
    s->next_start_ms = now + s->backoff_ms;
    sl_warn("supervised %s: %s; restart in %lld ms", s->upstream, why, (long long)s->backoff_ms);
    s->backoff_ms = SL_MIN(s->backoff_ms * 2, GW_SUP_BACKOFF_MAX_MS);
    sl_counter_add(s->m_restarts, 1);
}

/* ---- the health probe: GET BASE/models, 200 = healthy ---------------------- */

static void gw_sup_probe_done(gw_sup_t *s, bool ok)
{
    if (s->probe) {
        bufferevent_free(s->probe);
        s->probe = NULL;
    }
    if (ok) {
        s->probe_fails = 0;
        if (!s->healthy_since_ms)
            s->healthy_since_ms = sl_now_ms();
        gw_sup_set_healthy(s, true);
        return;
    }
    if (atomic_load(&s->healthy) && ++s->probe_fails >= GW_SUP_PROBE_FAILS) {
        /* Up once, silent now: restart it. */
        gw_sup_kill(s, SIGKILL);
    }
}

static void gw_sup_probe_read(struct bufferevent *bev, void *arg)
{
    gw_sup_t *s = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    char line[64];
    size_t n = evbuffer_get_length(in);
    if (n < 12)
        return;
    evbuffer_copyout(in, line, SL_MIN(n, sizeof(line) - 1));
    line[SL_MIN(n, sizeof(line) - 1)] = '\0';
    gw_sup_probe_done(s, strncmp(line, GW_LIT("HTTP/1.1 200")) == 0 ||
                             strncmp(line, GW_LIT("HTTP/1.0 200")) == 0);
}

static void gw_sup_probe_event(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    gw_sup_t *s = arg;
    if (what & BEV_EVENT_CONNECTED) {
        evbuffer_add_printf(bufferevent_get_output(s->probe),
                            "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
                            s->models_path, s->host_header);
        return;
    }
    gw_sup_probe_done(s, false);
}

static void gw_sup_probe(gw_sup_t *s)
{
    if (s->probe)
        gw_sup_probe_done(s, false); /* the last one never answered */
    s->probe = bufferevent_socket_new(s->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!s->probe)
        return;
    bufferevent_setcb(s->probe, gw_sup_probe_read, NULL, gw_sup_probe_event, s);
    struct timeval tv = {2, 0};
    bufferevent_set_timeouts(s->probe, &tv, &tv);
    bufferevent_enable(s->probe, EV_READ | EV_WRITE);
    if (bufferevent_socket_connect(s->probe, (struct sockaddr *)&s->addr, (int)s->addrlen) != 0)
        gw_sup_probe_done(s, false);
}

static void gw_sup_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_sup_t *s = arg;
    if (s->pid > 0) {
        int st;
        pid_t r = waitpid(s->pid, &st, WNOHANG);
        if (r == s->pid) {
            char why[64];
            if (WIFEXITED(st))
                snprintf(why, sizeof(why), "exited with %d", WEXITSTATUS(st));
            else
                snprintf(why, sizeof(why), "killed by signal %d", WTERMSIG(st));
            gw_sup_kill(s, SIGKILL); /* whatever it left in its group */
            gw_sup_ended(s, why);
        }
    }
    if (s->pid <= 0) {
        if (sl_now_ms() >= s->next_start_ms)
            gw_sup_start(s);
        gw_sup_arm(s, GW_SUP_PROBE_FAST_MS);
        return;
    }
    gw_sup_probe(s);
    gw_sup_arm(s, atomic_load(&s->healthy) ? GW_SUP_PROBE_SLOW_MS : GW_SUP_PROBE_FAST_MS);
}

int gw_sup_init(struct event_base *base, const gw_rt_t *rt, char *err, size_t errlen)
{
    sl_metric_t *mr = sl_metric_register("sluice_supervised_restarts_total",
                                         "Restarts of model servers sluice supervises.",
                                         SL_METRIC_COUNTER, "upstream", NULL, 0);
    sl_metric_t *mu = sl_metric_register("sluice_supervised_up",
                                         "1 while a supervised model server answers its health "
                                         "check.",
                                         SL_METRIC_GAUGE, "upstream", NULL, 0);
    for (size_t i = 0; i < rt->npools; i++) {
        const gw_pool_rt_t *p = &rt->pools[i];
        const conf_upstream_t *cu = p->conf;
        if (!cu->ncommand)
            continue;
        gw_sup_t *s = sl_xcalloc(1, sizeof(*s));
        s->upstream = sl_xstrdup(cu->name);
        s->argv = sl_xcalloc(cu->ncommand + 1, sizeof(*s->argv));
        for (size_t k = 0; k < cu->ncommand; k++)
            s->argv[k] = sl_xstrdup(cu->command[k]);
        memcpy(&s->addr, &p->servers[0]->addr, p->servers[0]->addrlen);
        s->addrlen = p->servers[0]->addrlen;
        snprintf(s->host_header, sizeof(s->host_header), "%s", p->servers[0]->host_header);
        snprintf(s->models_path, sizeof(s->models_path), "%s/models", p->servers[0]->base_path);
        s->base = base;
        s->timer = evtimer_new(base, gw_sup_tick, s);
        s->backoff_ms = GW_SUP_BACKOFF_MIN_MS;
        s->m_restarts = sl_metric_series1(mr, s->upstream);
        s->m_up = sl_metric_series1(mu, s->upstream);
        if (!s->timer) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        s->next = gw_sups;
        gw_sups = s;
        gw_sup_start(s);
        gw_sup_arm(s, GW_SUP_PROBE_FAST_MS);
    }
    return 0;
}

void gw_sup_shutdown(void)
{
    gw_sup_t *s;
    for (s = gw_sups; s; s = s->next)
        gw_sup_kill(s, SIGTERM);
    int64_t deadline = sl_now_ms() + 5000;
    for (s = gw_sups; s; s = s->next) {
        while (s->pid > 0) {
            int st;
            pid_t r = waitpid(s->pid, &st, WNOHANG);
            if (r == s->pid || (r < 0 && errno == ECHILD))
                break;
            if (sl_now_ms() >= deadline) {
                gw_sup_kill(s, SIGKILL);
                waitpid(s->pid, &st, 0);
                break;
            }
            usleep(20000); /* shutdown only: waiting on a child, not synchronising */
        }
    }
    while ((s = gw_sups) != NULL) {
        gw_sups = s->next;
        if (s->probe)
            bufferevent_free(s->probe);
        event_free(s->timer);
        for (size_t k = 0; s->argv[k]; k++)
            free(s->argv[k]);
        free(s->argv);
        free(s->upstream);
        free(s);
    }
}
