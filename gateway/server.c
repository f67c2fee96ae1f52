/*
 * server.c — the process: load the conf, build the runtime, open the
 * listening sockets, start the workers, and handle signals.
 *
 *   SIGHUP   reload: a new conf_t and runtime are built on the main thread;
 *            if that fails (or a key that needs a restart changed) the old
 *            one keeps serving. Workers pick up the new runtime at once for
 *            new requests; requests in flight finish on the one they began.
 *   SIGTERM  drain: stop accepting (new connections are refused), close idle
 *            keep-alive connections, let requests and streams in flight
 *            finish, and exit 0 when all are done or when shutdown_timeout
 *            passes (then the rest are cut).
 *
 * Each worker thread (worker.c) has its own event_base and accepts on the
 * shared listening sockets; the main thread's base serves the admin
 * listener.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/thread.h>

#include "common/log.h"
#include "common/sdnotify.h"
#include "gateway/gw_conn.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_req.h"
#include "gateway/gw_route.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_server.h"
#include "gateway/gw_sup.h"
#include "gateway/gw_types.h"
#include "gateway/gw_upstream.h"
#include "gateway/gw_tls.h"
#include "gateway/gw_wio.h"
#include "gateway/gw_worker.h"

static gw_server_t gw_srv;

gw_rt_t *gw_server_rt(gw_server_t *s)
{
    pthread_mutex_lock(&s->rt_lock);
    gw_rt_t *rt = gw_rt_ref(atomic_load(&s->rt));
    pthread_mutex_unlock(&s->rt_lock);
    return rt;
}

static void gw_notify_all(void)
{
    for (int i = 0; i < gw_srv.nworkers; i++)
        gw_worker_wake(&gw_srv.workers[i]);
    gw_worker_wake(&gw_srv.main);
}

/* ---- listening sockets ---------------------------------------------------- */

/* "host:port" or "[v6]:port" -> a bound, listening, non-blocking socket. */
static int gw_listen_open(const char *address, char *err, size_t errlen)
{
    char host[256];
    const char *colon = strrchr(address, ':');
    if (!colon || colon == address) {
        snprintf(err, errlen, "bad address %s", address);
        return -1;
    }
    size_t hl = (size_t)(colon - address);
    if (address[0] == '[' && hl >= 2 && address[hl - 1] == ']') {
        memcpy(host, address + 1, hl - 2);
        host[hl - 2] = '\0';
    } else {
        if (hl >= sizeof(host))
            hl = sizeof(host) - 1;
        memcpy(host, address, hl);
        host[hl] = '\0';
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(host, colon + 1, &hints, &ai);
    if (rc != 0 || !ai) {
        snprintf(err, errlen, "%s: %s", address, gai_strerror(rc));
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "%s: socket: %s", address, strerror(errno));
        freeaddrinfo(ai);
        return -1;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 511) != 0) {
        snprintf(err, errlen, "%s: %s", address, strerror(errno));
        close(fd);
        freeaddrinfo(ai);
        return -1;
    }
    freeaddrinfo(ai);
    return fd;
}

static int gw_listens_open(const conf_t *c, char *err, size_t errlen)
{
    bool admin = c->admin.address && strcmp(c->admin.address, "off") != 0;
    gw_srv.nlistens = c->nlisten + (admin ? 1 : 0);
    gw_srv.listens = sl_xcalloc(gw_srv.nlistens, sizeof(*gw_srv.listens));
    for (size_t i = 0; i < gw_srv.nlistens; i++)
        gw_srv.listens[i].fd = -1;
    for (size_t i = 0; i < c->nlisten; i++) {
        gw_srv.listens[i].index = i;
        gw_srv.listens[i].address = sl_xstrdup(c->listen[i].address);
        char e[256];
        int fd = gw_upgrade_take(c->listen[i].address); /* SIGUSR2: the old process's */
        gw_srv.listens[i].fd = fd >= 0 ? fd : gw_listen_open(c->listen[i].address, e, sizeof(e));
        if (gw_srv.listens[i].fd < 0) {
            snprintf(err, errlen, "%s:%d: listen: %s", c->path, c->listen[i].line, e);
            return -1;
        }
    }
    if (admin) {
        gw_listen_rt_t *l = &gw_srv.listens[c->nlisten];
        l->admin = true;
        l->address = sl_xstrdup(c->admin.address);
        char e[256];
        int fd = gw_upgrade_take(c->admin.address);
        l->fd = fd >= 0 ? fd : gw_listen_open(c->admin.address, e, sizeof(e));
        if (l->fd < 0) {
            snprintf(err, errlen, "%s: admin.address: %s", c->path, e);
            return -1;
        }
    }
    gw_upgrade_close_unused();
    return 0;
}

/* ---- signals ----------------------------------------------------------- */

static void gw_count_reload(const char *result, const char *err)
{
    gw_metrics_reload(strcmp(result, "ok") == 0, err);
}

/* Supervised commands are started once: a reload may not change them. */
static int gw_reload_commands_same(const conf_t *a, const conf_t *b, char *err, size_t errlen)
{
    for (size_t i = 0; i < b->nupstreams; i++) {
        const conf_upstream_t *nu = &b->upstreams[i];
        const conf_upstream_t *ou = conf_upstream_find(a, nu->name);
        size_t on = ou ? ou->ncommand : 0;
        bool same = on == nu->ncommand;
        for (size_t k = 0; same && k < on; k++)
            same = strcmp(ou->command[k], nu->command[k]) == 0;
        if (!same) {
            snprintf(err, errlen, "upstreams.%s.command: changed; needs a restart", nu->name);
            return -1;
        }
    }
    for (size_t i = 0; i < a->nupstreams; i++)
        if (a->upstreams[i].ncommand && !conf_upstream_find(b, a->upstreams[i].name)) {
            snprintf(err, errlen, "upstreams.%s: has a command; removing it needs a restart",
                     a->upstreams[i].name);
            return -1;
        }
    return 0;
}

static void gw_reload(void)
{
    char err[1024];
    conf_t *c = conf_load(gw_srv.conf_path, err, sizeof(err));
    if (!c) {
        sl_error("reload refused: %s", err);
        gw_count_reload("error", err);
        return;
    }
    gw_rt_t *old = gw_server_rt(&gw_srv);
    if (conf_reload_check(old->conf, c, err, sizeof(err)) != 0 ||
        gw_reload_commands_same(old->conf, c, err, sizeof(err)) != 0) {
        sl_error("reload refused: %s", err);
        gw_rt_unref(old);
        conf_free(c);
        gw_count_reload("error", err);
        return;
    }
    gw_rt_unref(old);
    gw_rt_t *rt = gw_rt_new(c, gw_srv.shared, err, sizeof(err));
    if (!rt) {
        sl_error("reload refused: %s", err);
        gw_count_reload("error", err);
        return;
    }
    if (gw_accesslog_open(rt->conf->log.access, err, sizeof(err)) != 0) {
        sl_error("reload: %s (access log unchanged)", err);
    }
    if (sl_log_set_target(rt->conf->log.error, err, sizeof(err)) != 0)
        sl_error("reload: %s (error log unchanged)", err);
    int lvl = sl_log_level_parse(rt->conf->log.level);
    if (lvl >= 0)
        sl_log_set_level((sl_log_level_t)lvl);
    sl_log_limited_set_interval(rt->conf->log.repeat_interval_ms * 1000000);
    pthread_mutex_lock(&gw_srv.rt_lock);
    gw_rt_t *prev = atomic_exchange(&gw_srv.rt, rt);
    pthread_mutex_unlock(&gw_srv.rt_lock);
    gw_rt_unref(prev);
    gw_notify_all();
    gw_count_reload("ok", NULL);
    sl_info("reloaded %s (generation %llu)", gw_srv.conf_path, (unsigned long long)rt->generation);
}

/* SIGUSR1 (logrotate's postrotate): the access and error logs are opened
 * again at their paths; a line being written while the file moves lands
 * wholly in the old file or the new one (one dup2 each). */
static void gw_reopen_logs(void)
{
    char err[512];
    if (gw_accesslog_reopen(err, sizeof(err)) != 0)
        sl_error("reopen: %s (access log unchanged)", err);
    if (sl_log_reopen(err, sizeof(err)) != 0)
        sl_error("reopen: %s (error log unchanged)", err);
    sl_info("logs reopened");
}

static void gw_drain_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    sl_warn("shutdown_timeout passed: closing the remaining connections");
    atomic_store(&gw_srv.stop_now, true);
    gw_notify_all();
}

static void gw_drain_poll_cb(evutil_socket_t fd, short what, void *arg);

/* Stop accepting, let what is in flight finish, then exit. systemd hears
 * STOPPING=1 for a TERM/INT/QUIT drain, never for an upgrade's (the unit
 * goes on, in the new process). */
static void gw_drain_start(bool stopping)
{
    if (atomic_exchange(&gw_srv.draining, true)) {
        /* A second SIGTERM/SIGINT: stop now. */
        gw_drain_timeout_cb(-1, 0, NULL);
        return;
    }
    gw_rt_t *rt = gw_server_rt(&gw_srv);
    int64_t ms = rt->conf->shutdown_timeout_ms;
    gw_rt_unref(rt);
    sl_info("draining (up to %lld ms)", (long long)ms);
    if (stopping)
        sl_notify_stopping();
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    gw_srv.drain_timer = evtimer_new(gw_srv.main.base, gw_drain_timeout_cb, NULL);
    evtimer_add(gw_srv.drain_timer, &tv);
    gw_notify_all();
    /* The main loop ends when every worker thread has ended. */
    gw_srv.drain_poll = event_new(gw_srv.main.base, -1, EV_PERSIST, gw_drain_poll_cb, NULL);
    struct timeval ptv = {0, 20000};
    event_add(gw_srv.drain_poll, &ptv);
}

/* The new binary of a SIGUSR2 upgrade is serving: this one bows out. */
static void gw_upgrade_done(gw_server_t *s)
{
    (void)s;
    if (!atomic_load(&gw_srv.draining))
        gw_drain_start(false);
}

static void gw_signal_cb(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    (void)arg;
    if (sig == SIGUSR1) {
        gw_reopen_logs();
        return;
    }
    if (sig == SIGUSR2) {
        char err[512];
        gw_rt_t *rt = gw_server_rt(&gw_srv);
        int rc = gw_upgrade_start(&gw_srv, rt, gw_upgrade_done, err, sizeof(err));
        gw_rt_unref(rt);
        if (rc != 0)
            sl_error("upgrade refused: %s; this process keeps serving", err);
        return;
    }
    if (sig == SIGHUP) {
        /* systemd waits between the two (Type=notify): READY also after a
         * refused reload, since the old conf is serving. */
        sl_notify_reloading();
        gw_reload();
        sl_notify_ready();
        return;
    }
    gw_drain_start(true);
}

static _Atomic int gw_workers_running;

static void gw_drain_poll_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    if (atomic_load(&gw_workers_running) == 0)
        event_base_loopexit(gw_srv.main.base, NULL);
}

static void *gw_worker_thread(void *arg)
{
    gw_worker_run(arg);
    gw_hooks_worker_tick(arg, true); /* what the adapters kept on this thread */
    (void)gw_wio_mem_tick(true);     /* the chains this thread kept (wio.c) */
    (void)gw_tls_mem_tick(true);     /* and its TLS record buffers (tls.c) */
    atomic_fetch_sub(&gw_workers_running, 1);
    return NULL;
}

/* ---- run ----------------------------------------------------------------- */

static void gw_maint_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    gw_hooks_tick(&gw_srv);
    sl_log_limited_flush(); /* the counts of repeated failures that went quiet */
}

/* WATCHDOG=1 from the main loop: if the loop hangs, systemd restarts us. */
static void gw_watchdog_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    sl_notify_watchdog();
}

static int gw_cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int gw_server_run(const char *conf_path)
{
    char err[1024];
    signal(SIGPIPE, SIG_IGN);
    /* Before any thread starts: it edits the environment (upgrade.c). */
    bool upgraded = gw_upgrade_inherit() == 1;
    gw_upgrade_init();
    /* No evthread_use_pthreads(): every event_base belongs to one thread,
     * and the few cross-thread messages go through gw_worker_post (an
     * eventfd), so libevent's locks would only cost. */
    /* Before anything allocates through libevent (wio.c: its 1 KiB chains). */
    (void)gw_wio_mem_init();
    /* Before anything calls OpenSSL (tls.c: its record buffers). */
    if (!gw_tls_mem_init())
        sl_debug("TLS record buffers: OpenSSL's allocator (not kept per thread)");
    gw_metrics_init(gw_route_name);
    conf_t *c = conf_load(conf_path, err, sizeof(err));
    if (!c) {
        sl_error("%s", err);
        return 1;
    }
    int lvl = sl_log_level_parse(c->log.level);
    if (lvl >= 0)
        sl_log_set_level((sl_log_level_t)lvl);
    sl_log_limited_set_interval(c->log.repeat_interval_ms * 1000000);
    if (sl_log_set_target(c->log.error, err, sizeof(err)) != 0) {
        sl_error("%s", err);
        conf_free(c);
        return 1;
    }
    gw_srv.conf_path = sl_xstrdup(conf_path);
    pthread_mutex_init(&gw_srv.rt_lock, NULL);
    gw_srv.shared = gw_shared_new();
    if (!gw_srv.shared) {
        sl_error("out of memory");
        return 1;
    }
    gw_rt_t *rt = gw_rt_new(c, gw_srv.shared, err, sizeof(err));
    if (!rt) {
        sl_error("%s", err);
        return 1;
    }
    atomic_store(&gw_srv.rt, rt);
    if (gw_accesslog_open(rt->conf->log.access, err, sizeof(err)) != 0 ||
        gw_listens_open(rt->conf, err, sizeof(err)) != 0) {
        sl_error("%s", err);
        return 1;
    }
    if (gw_hooks_process_init(&gw_srv, rt->conf, err, sizeof(err)) != 0) {
        sl_error("%s", err);
        return 1;
    }
    gw_srv.nworkers = rt->conf->workers > 0 ? (int)rt->conf->workers : gw_cores();
    gw_srv.workers = sl_xcalloc((size_t)gw_srv.nworkers, sizeof(*gw_srv.workers));
    if (gw_worker_init(&gw_srv.main, &gw_srv, -1, true) != 0)
        return 1;
    for (int i = 0; i < gw_srv.nworkers; i++)
        if (gw_worker_init(&gw_srv.workers[i], &gw_srv, i, false) != 0)
            return 1;
    struct event_base *mb = gw_srv.main.base;
    gw_srv.sig_hup = evsignal_new(mb, SIGHUP, gw_signal_cb, NULL);
    gw_srv.sig_term = evsignal_new(mb, SIGTERM, gw_signal_cb, NULL);
    gw_srv.sig_int = evsignal_new(mb, SIGINT, gw_signal_cb, NULL);
    evsignal_add(gw_srv.sig_hup, NULL);
    evsignal_add(gw_srv.sig_term, NULL);
    evsignal_add(gw_srv.sig_int, NULL);
    /* QUIT drains like TERM (nginx's graceful stop is QUIT; ours is both). */
    gw_srv.sig_quit = evsignal_new(mb, SIGQUIT, gw_signal_cb, NULL);
    gw_srv.sig_usr1 = evsignal_new(mb, SIGUSR1, gw_signal_cb, NULL);
    gw_srv.sig_usr2 = evsignal_new(mb, SIGUSR2, gw_signal_cb, NULL);
    evsignal_add(gw_srv.sig_quit, NULL);
    evsignal_add(gw_srv.sig_usr1, NULL);
    evsignal_add(gw_srv.sig_usr2, NULL);
    if (gw_sup_init(mb, rt, err, sizeof(err)) != 0) {
        sl_error("supervise: %s", err);
        return 1;
    }
    for (size_t i = 0; i < rt->npools; i++) /* built before the supervisors */
        if (rt->pools[i].conf->ncommand)
            rt->pools[i].sup = gw_sup_find(rt->pools[i].name);
    gw_srv.maint_ev = event_new(mb, -1, EV_PERSIST, gw_maint_cb, NULL);
    struct timeval one = {1, 0};
    event_add(gw_srv.maint_ev, &one);
    atomic_store(&gw_workers_running, gw_srv.nworkers);
    for (int i = 0; i < gw_srv.nworkers; i++) {
        if (pthread_create(&gw_srv.workers[i].thread, NULL, gw_worker_thread, &gw_srv.workers[i]) !=
            0) {
            sl_error("cannot start worker %d", i);
            return 1;
        }
    }
    atomic_store(&gw_srv.ready, true);
    if (upgraded) {
        /* systemd follows this process first; then the old one may go. */
        sl_notify_mainpid();
        gw_upgrade_ready();
    } else {
        sl_notify_ready();
    }
    int64_t wd_usec = sl_notify_watchdog_usec();
    if (wd_usec > 0) {
        gw_srv.watchdog_ev = event_new(mb, -1, EV_PERSIST, gw_watchdog_cb, NULL);
        struct timeval wtv = {(wd_usec / 2) / 1000000, (wd_usec / 2) % 1000000};
        if (gw_srv.watchdog_ev)
            event_add(gw_srv.watchdog_ev, &wtv);
        sl_notify_watchdog();
    }
    sl_info("sluice started: %d worker(s), %zu listener(s), conf %s, pid %ld", gw_srv.nworkers,
            rt->conf->nlisten, conf_path, (long)getpid());
    event_base_dispatch(mb);
    for (int i = 0; i < gw_srv.nworkers; i++)
        pthread_join(gw_srv.workers[i].thread, NULL);
    /* Close every connection (cancelling engine work), then stop the
     * engines, which delivers their last callbacks into the mailboxes that
     * gw_worker_fini() still runs. */
    for (int i = 0; i < gw_srv.nworkers; i++)
        gw_worker_stop_now(&gw_srv.workers[i]);
    gw_engines_stop(gw_srv.shared);
    gw_hooks_process_stop(&gw_srv);
    gw_sup_shutdown();
    for (int i = 0; i < gw_srv.nworkers; i++)
        gw_worker_fini(&gw_srv.workers[i]);
    gw_worker_fini(&gw_srv.main);
    for (size_t i = 0; i < gw_srv.nlistens; i++) {
        if (gw_srv.listens[i].fd >= 0)
            close(gw_srv.listens[i].fd);
        free(gw_srv.listens[i].address);
    }
    event_free(gw_srv.sig_hup);
    event_free(gw_srv.sig_term);
    event_free(gw_srv.sig_int);
    event_free(gw_srv.sig_quit);
    event_free(gw_srv.sig_usr1);
    event_free(gw_srv.sig_usr2);
    gw_upgrade_fini();
    if (gw_srv.drain_timer)
        event_free(gw_srv.drain_timer);
    if (gw_srv.drain_poll)
        event_free(gw_srv.drain_poll);
    event_free(gw_srv.maint_ev);
    if (gw_srv.watchdog_ev)
        event_free(gw_srv.watchdog_ev);
    free(gw_srv.workers);
    free(gw_srv.listens);
    gw_hooks_process_fini(&gw_srv);
    gw_rt_unref(atomic_load(&gw_srv.rt)); /* gives its engines back to the registry */
    gw_shared_free(gw_srv.shared);
    free(gw_srv.conf_path);
    gw_hooks_worker_tick(&gw_srv.main, true); /* what the adapters kept here */
    (void)gw_wio_mem_tick(true);              /* the main thread's kept chains */
    (void)gw_tls_mem_tick(true);
    sl_info("sluice stopped");
    return 0;
}

bool gw_server_ready(void)
{
    return atomic_load(&gw_srv.ready) && !atomic_load(&gw_srv.draining);
}
