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
 * Each worker thread has its own event_base and accepts on the shared
 * listening sockets; the main thread's base serves the admin listener.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include <event2/thread.h>

#include "common/log.h"
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

/* ---- deferred frees, randomness ----------------------------------------- */

static void gw_worker_reap_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_worker_t *w = arg;
    /* Frees may queue more frees: loop until the list stays empty. */
    while (w->nreap) {
        size_t n = w->nreap;
        void **objs = w->reap;
        void (**fns)(void *) = w->reap_fn;
        w->reap = NULL;
        w->reap_fn = NULL;
        w->nreap = w->capreap = 0;
        for (size_t i = 0; i < n; i++)
            fns[i](objs[i]);
        free(objs);
        free(fns);
    }
}

void gw_worker_defer_free(gw_worker_t *w, void (*fn)(void *), void *obj)
{
    if (w->nreap == w->capreap) {
        size_t cap = w->capreap ? w->capreap * 2 : 16;
        void **o = realloc(w->reap, cap * sizeof(*o));
        void (**f)(void *) = realloc(w->reap_fn, cap * sizeof(*f));
        if (!o || !f) {
            /* Out of memory: leaking beats freeing inside a callback. */
            if (o)
                w->reap = o;
            if (f)
                w->reap_fn = f;
            sl_error("out of memory queueing a deferred free");
            return;
        }
        w->reap = o;
        w->reap_fn = f;
        w->capreap = cap;
    }
    w->reap[w->nreap] = obj;
    w->reap_fn[w->nreap] = fn;
    w->nreap++;
    event_active(w->reap_ev, EV_TIMEOUT, 0);
}

uint64_t gw_worker_rand(gw_worker_t *w)
{
    /* xorshift64*: request ids and tie-breaks, not secrets */
    uint64_t x = w->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    w->rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* ---- accepting ---------------------------------------------------------- */

static void gw_worker_accept_enable(gw_worker_t *w, bool on)
{
    for (size_t i = 0; i < w->nlisteners; i++) {
        if (!w->listeners[i])
            continue;
        if (on)
            evconnlistener_enable(w->listeners[i]);
        else
            evconnlistener_disable(w->listeners[i]);
    }
    w->accept_paused = !on;
}

void gw_worker_conn_closed(gw_worker_t *w)
{
    if (w->accept_paused && !w->draining &&
        (int64_t)w->nconns < w->rt->conf->limits.max_connections)
        gw_worker_accept_enable(w, true);
    if (w->draining && w->nconns == 0 && !w->is_main)
        event_base_loopexit(w->base, NULL);
}

static void gw_accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                         int salen, void *arg)
{
    (void)l;
    gw_lslot_t *slot = arg;
    gw_worker_t *w = slot->w;
    if (w->draining) {
        close(fd);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    gw_conn_accept(w, fd, sa, salen, slot->l);
    if (!w->is_main && (int64_t)w->nconns >= w->rt->conf->limits.max_connections)
        gw_worker_accept_enable(w, false);
}

static void gw_accept_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_worker_t *w = arg;
    if (w->accept_paused && !w->draining)
        gw_worker_accept_enable(w, true);
}

static void gw_accept_error_cb(struct evconnlistener *l, void *arg)
{
    (void)l;
    int err = EVUTIL_SOCKET_ERROR();
    gw_worker_t *w = ((gw_lslot_t *)arg)->w;
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        /* Out of descriptors: stop accepting until a connection closes (or
         * a second passes, for closes in other workers). */
        sl_warn("worker %d: accept: %s; pausing accepts", w->id, strerror(err));
        gw_worker_accept_enable(w, false);
        struct timeval tv = {1, 0};
        event_add(w->accept_ev, &tv);
        return;
    }
    sl_warn("worker %d: accept: %s", w->id, strerror(err));
}

static int gw_worker_listen(gw_worker_t *w)
{
    w->listeners = sl_xcalloc(gw_srv.nlistens, sizeof(*w->listeners));
    w->lslots = sl_xcalloc(gw_srv.nlistens, sizeof(*w->lslots));
    w->nlisteners = gw_srv.nlistens;
    for (size_t i = 0; i < gw_srv.nlistens; i++) {
        gw_listen_rt_t *lr = &gw_srv.listens[i];
        if (lr->admin != w->is_main)
            continue;
        w->lslots[i].w = w;
        w->lslots[i].l = lr;
        w->listeners[i] = evconnlistener_new(w->base, gw_accept_cb, &w->lslots[i],
                                             LEV_OPT_CLOSE_ON_EXEC, 0, lr->fd);
        if (!w->listeners[i]) {
            sl_error("worker %d: cannot listen on %s", w->id, lr->address);
            return -1;
        }
        evconnlistener_set_error_cb(w->listeners[i], gw_accept_error_cb);
    }
    return 0;
}

static void gw_worker_unlisten(gw_worker_t *w)
{
    for (size_t i = 0; i < w->nlisteners; i++) {
        if (w->listeners[i])
            evconnlistener_free(w->listeners[i]);
        w->listeners[i] = NULL;
    }
}

/* ---- worker lifecycle ------------------------------------------------------ */

static _Atomic int gw_unlistened;

static void gw_worker_update_rt(gw_worker_t *w)
{
    gw_rt_t *rt = gw_server_rt(&gw_srv);
    if (w->rt && rt->generation == w->rt->generation) {
        gw_rt_unref(rt);
        return;
    }
    gw_upstream_worker_reset(w);
    gw_rt_unref(w->rt);
    w->rt = rt;
    free(w->wsrv);
    w->nwsrv = rt->nservers;
    w->wsrv = sl_xcalloc(rt->nservers ? rt->nservers : 1, sizeof(*w->wsrv));
    for (size_t i = 0; i < rt->nservers; i++)
        TAILQ_INIT(&w->wsrv[i].idle);
}

static void gw_worker_start_drain(gw_worker_t *w)
{
    if (w->draining)
        return;
    w->draining = true;
    gw_worker_unlisten(w);
    if (!w->is_main && atomic_fetch_add(&gw_unlistened, 1) + 1 == gw_srv.nworkers) {
        /* Every worker has stopped watching the shared sockets: close them
         * so new connections are refused, not left in the backlog. */
        for (size_t i = 0; i < gw_srv.nlistens; i++) {
            if (!gw_srv.listens[i].admin && gw_srv.listens[i].fd >= 0) {
                close(gw_srv.listens[i].fd);
                gw_srv.listens[i].fd = -1;
            }
        }
    }
    gw_upstream_worker_reset(w);
    gw_conn_t *c, *next;
    for (c = TAILQ_FIRST(&w->conns); c; c = next) {
        next = TAILQ_NEXT(c, link);
        gw_conn_drain(c);
    }
    if (w->nconns == 0 && !w->is_main)
        event_base_loopexit(w->base, NULL);
}

static void gw_worker_stop_now(gw_worker_t *w)
{
    gw_conn_t *c, *next;
    for (c = TAILQ_FIRST(&w->conns); c; c = next) {
        next = TAILQ_NEXT(c, link);
        gw_conn_close(c);
    }
    if (!w->is_main)
        event_base_loopexit(w->base, NULL);
}

static _Atomic bool gw_stop_now;

struct gw_mail {
    struct gw_mail *next;
    void (*fn)(void *);
    void *arg;
};

static void gw_worker_wake(gw_worker_t *w)
{
    uint64_t one = 1;
    ssize_t n = write(w->notify_fd, &one, sizeof(one));
    (void)n; /* a full counter already means "wake up" */
}

int gw_worker_post(gw_worker_t *w, void (*fn)(void *), void *arg)
{
    struct gw_mail *m = malloc(sizeof(*m));
    if (!m)
        return -1;
    m->next = NULL;
    m->fn = fn;
    m->arg = arg;
    pthread_mutex_lock(&w->mail_lock);
    *w->mail_tail = m;
    w->mail_tail = &m->next;
    pthread_mutex_unlock(&w->mail_lock);
    gw_worker_wake(w);
    return 0;
}

static void gw_worker_run_mail(gw_worker_t *w)
{
    pthread_mutex_lock(&w->mail_lock);
    struct gw_mail *m = w->mail_head;
    w->mail_head = NULL;
    w->mail_tail = &w->mail_head;
    pthread_mutex_unlock(&w->mail_lock);
    while (m) {
        struct gw_mail *next = m->next;
        m->fn(m->arg);
        free(m);
        m = next;
    }
}

static void gw_worker_notify_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    gw_worker_t *w = arg;
    uint64_t n;
    ssize_t r = read(fd, &n, sizeof(n)); /* clears the eventfd */
    (void)r;
    gw_worker_run_mail(w);
    gw_worker_update_rt(w);
    if (atomic_load(&gw_srv.draining))
        gw_worker_start_drain(w);
    if (atomic_load(&gw_stop_now))
        gw_worker_stop_now(w);
}

int gw_worker_init_loop(gw_worker_t *w, struct event_base *base)
{
    TAILQ_INIT(&w->conns);
    TAILQ_INIT(&w->flushq);
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof(seed), 0) != sizeof(seed))
        seed = (uint64_t)sl_now_ns();
    w->rng = seed | 1;
    w->base = base;
    w->reap_ev = event_new(w->base, -1, 0, gw_worker_reap_cb, w);
    w->flush_ev = event_new(w->base, -1, 0, gw_wio_flush_cb, w);
    return w->reap_ev && w->flush_ev ? 0 : -1;
}

void gw_worker_fini_loop(gw_worker_t *w)
{
    gw_worker_reap_cb(-1, 0, w);
    if (w->reap_ev)
        event_free(w->reap_ev);
    if (w->flush_ev)
        event_free(w->flush_ev);
    w->reap_ev = w->flush_ev = NULL;
}

static int gw_worker_init(gw_worker_t *w, int id, bool is_main)
{
    w->srv = &gw_srv;
    w->id = id;
    w->is_main = is_main;
    /* Millisecond timers through epoll_wait's timeout: a precise timer
     * (timerfd) costs a syscall per loop turn, and every deadline here
     * is in milliseconds anyway. */
    struct event_base *base = w->base ? w->base : event_base_new();
    if (!base || gw_worker_init_loop(w, base) != 0)
        return -1;
    w->notify_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_mutex_init(&w->mail_lock, NULL);
    w->mail_head = NULL;
    w->mail_tail = &w->mail_head;
    if (w->notify_fd < 0)
        return -1;
    w->notify_ev = event_new(w->base, w->notify_fd, EV_READ | EV_PERSIST, gw_worker_notify_cb, w);
    if (w->notify_ev)
        event_add(w->notify_ev, NULL);
    w->accept_ev = evtimer_new(w->base, gw_accept_retry_cb, w);
    if (!w->notify_ev || !w->accept_ev)
        return -1;
    gw_worker_update_rt(w);
    if (gw_hooks_worker_init(w) != 0) /* the policy modules' per-thread handles */
        return -1;
    return gw_worker_listen(w);
}

static void gw_worker_fini(gw_worker_t *w)
{
    gw_worker_unlisten(w);
    gw_worker_stop_now(w);
    gw_worker_reap_cb(-1, 0, w);
    gw_upstream_worker_reset(w);
    gw_worker_reap_cb(-1, 0, w);
    gw_hooks_worker_fini(w);
    free(w->listeners);
    free(w->lslots);
    free(w->wsrv);
    event_free(w->notify_ev);
    gw_worker_run_mail(w); /* what was posted last (frees, mostly) */
    close(w->notify_fd);
    pthread_mutex_destroy(&w->mail_lock);
    event_free(w->accept_ev);
    gw_worker_fini_loop(w);
    gw_rt_unref(w->rt);
    w->rt = NULL;
    event_base_free(w->base);
    w->base = NULL;
}

static void *gw_worker_main(void *arg)
{
    gw_worker_t *w = arg;
    event_base_dispatch(w->base);
    return NULL;
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
        gw_srv.listens[i].fd = gw_listen_open(c->listen[i].address, e, sizeof(e));
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
        l->fd = gw_listen_open(c->admin.address, e, sizeof(e));
        if (l->fd < 0) {
            snprintf(err, errlen, "%s: admin.address: %s", c->path, e);
            return -1;
        }
    }
    return 0;
}

/* ---- signals ----------------------------------------------------------- */

static void gw_count_reload(const char *result)
{
    sl_counter_add(sl_metric_series1(gw_m.reloads, result), 1);
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
        gw_count_reload("error");
        return;
    }
    gw_rt_t *old = gw_server_rt(&gw_srv);
    if (conf_reload_check(old->conf, c, err, sizeof(err)) != 0 ||
        gw_reload_commands_same(old->conf, c, err, sizeof(err)) != 0) {
        sl_error("reload refused: %s", err);
        gw_rt_unref(old);
        conf_free(c);
        gw_count_reload("error");
        return;
    }
    gw_rt_unref(old);
    gw_rt_t *rt = gw_rt_new(c, gw_srv.shared, err, sizeof(err));
    if (!rt) {
        sl_error("reload refused: %s", err);
        gw_count_reload("error");
        return;
    }
    if (gw_accesslog_open(rt->conf->log.access, err, sizeof(err)) != 0) {
        sl_error("reload: %s (access log unchanged)", err);
    }
    int lvl = sl_log_level_parse(rt->conf->log.level);
    if (lvl >= 0)
        sl_log_set_level((sl_log_level_t)lvl);
    pthread_mutex_lock(&gw_srv.rt_lock);
    gw_rt_t *prev = atomic_exchange(&gw_srv.rt, rt);
    pthread_mutex_unlock(&gw_srv.rt_lock);
    gw_rt_unref(prev);
    gw_notify_all();
    gw_count_reload("ok");
    sl_info("reloaded %s (generation %llu)", gw_srv.conf_path, (unsigned long long)rt->generation);
}

static void gw_drain_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    sl_warn("shutdown_timeout passed: closing the remaining connections");
    atomic_store(&gw_stop_now, true);
    gw_notify_all();
}

static void gw_drain_poll_cb(evutil_socket_t fd, short what, void *arg);

static void gw_signal_cb(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    (void)arg;
    if (sig == SIGHUP) {
        gw_reload();
        return;
    }
    if (atomic_exchange(&gw_srv.draining, true)) {
        /* A second SIGTERM/SIGINT: stop now. */
        gw_drain_timeout_cb(-1, 0, NULL);
        return;
    }
    gw_rt_t *rt = gw_server_rt(&gw_srv);
    int64_t ms = rt->conf->shutdown_timeout_ms;
    gw_rt_unref(rt);
    sl_info("draining (up to %lld ms)", (long long)ms);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    gw_srv.drain_timer = evtimer_new(gw_srv.main.base, gw_drain_timeout_cb, NULL);
    evtimer_add(gw_srv.drain_timer, &tv);
    gw_notify_all();
    /* The main loop ends when every worker thread has ended. */
    gw_srv.drain_poll = event_new(gw_srv.main.base, -1, EV_PERSIST, gw_drain_poll_cb, NULL);
    struct timeval ptv = {0, 20000};
    event_add(gw_srv.drain_poll, &ptv);
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
    gw_worker_main(arg);
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
    /* No evthread_use_pthreads(): every event_base belongs to one thread,
     * and the few cross-thread messages go through gw_worker_post (an
     * eventfd), so libevent's locks would only cost. */
    gw_metrics_init(gw_route_name);
    conf_t *c = conf_load(conf_path, err, sizeof(err));
    if (!c) {
        sl_error("%s", err);
        return 1;
    }
    int lvl = sl_log_level_parse(c->log.level);
    if (lvl >= 0)
        sl_log_set_level((sl_log_level_t)lvl);
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
    if (gw_worker_init(&gw_srv.main, -1, true) != 0)
        return 1;
    for (int i = 0; i < gw_srv.nworkers; i++)
        if (gw_worker_init(&gw_srv.workers[i], i, false) != 0)
            return 1;
    struct event_base *mb = gw_srv.main.base;
    gw_srv.sig_hup = evsignal_new(mb, SIGHUP, gw_signal_cb, NULL);
    gw_srv.sig_term = evsignal_new(mb, SIGTERM, gw_signal_cb, NULL);
    gw_srv.sig_int = evsignal_new(mb, SIGINT, gw_signal_cb, NULL);
    evsignal_add(gw_srv.sig_hup, NULL);
    evsignal_add(gw_srv.sig_term, NULL);
    evsignal_add(gw_srv.sig_int, NULL);
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
    sl_info("sluice started: %d worker(s), %zu listener(s), conf %s", gw_srv.nworkers,
            rt->conf->nlisten, conf_path);
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
    if (gw_srv.drain_timer)
        event_free(gw_srv.drain_timer);
    if (gw_srv.drain_poll)
        event_free(gw_srv.drain_poll);
    event_free(gw_srv.maint_ev);
    free(gw_srv.workers);
    free(gw_srv.listens);
    gw_hooks_process_fini(&gw_srv);
    gw_rt_unref(atomic_load(&gw_srv.rt)); /* gives its engines back to the registry */
    gw_shared_free(gw_srv.shared);
    free(gw_srv.conf_path);
    sl_info("sluice stopped");
    return 0;
}

bool gw_server_ready(void)
{
    return atomic_load(&gw_srv.ready) && !atomic_load(&gw_srv.draining);
}
