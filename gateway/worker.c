/*
 * worker.c — one worker thread: its event_base, accepting on the shared
 * listening sockets (pausing at max_connections or when out of
 * descriptors), its connections, the runtime it serves new requests with,
 * drain and stop, deferred frees, and the mailbox through which other
 * threads reach it (an eventfd: libevent runs without locks here, so this
 * is the only way in). The process (server.c) starts and stops workers.
 */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "common/log.h"
#include "gateway/body_scan.h"
#include "gateway/body_store.h"
#include "gateway/gw_conn.h"
#include "gateway/gw_h2_mem.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_server.h"
#include "gateway/gw_types.h"
#include "gateway/gw_upstream.h"
#include "gateway/gw_tls.h"
#include "gateway/gw_wio.h"
#include "gateway/gw_worker.h"

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

/* ---- the tick: idle upstream connections, memory given back -------------- */

/* Each worker's housekeeping, off the request path: expires idle upstream
 * connections (upstream.c) and gives memory back to the system after a
 * peak. */
#define GW_WORKER_TICK_MS 500
/* A fall of this many connections from the worker's peak (and to at most
 * half of it) is a peak worth giving back. */
#define GW_TRIM_DROP 64
/* malloc_trim walks every arena and madvises their free pages: at most
 * once per this interval in the whole process. */
#define GW_TRIM_INTERVAL_MS 5000
/* After a reload the old runtime is freed by its last request: trims then,
 * and once more later for one that lived long. */
#define GW_TRIM_RELOAD_MS  1000
#define GW_TRIM_RELOAD2_MS 15000
/* Blocks from this size up are mmapped (glibc's starting value is 128 KiB;
 * request buffers stay below it). */
#define GW_MMAP_THRESHOLD (256 * 1024)

static _Atomic int64_t gw_trim_last_ms;

/* Resident bytes from /proc/self/statm (one small read), -1 if unknown. */
static int64_t gw_worker_rss(void)
{
    FILE *f = fopen("/proc/self/statm", "re");
    long long size = 0, res = -1;
    if (!f)
        return -1;
    if (fscanf(f, "%lld %lld", &size, &res) != 2)
        res = -1;
    fclose(f);
    return res < 0 ? -1 : (int64_t)res * sysconf(_SC_PAGESIZE);
}

/* Gives free heap memory back (all arenas: glibc trims the top of each and
 * madvises whole free pages inside them). Returns true when it ran. */
static bool gw_worker_trim(int64_t now_ms)
{
    int64_t last = atomic_load(&gw_trim_last_ms);
    if (last && now_ms - last < GW_TRIM_INTERVAL_MS)
        return false;
    if (!atomic_compare_exchange_strong(&gw_trim_last_ms, &last, now_ms))
        return false; /* another worker is trimming */
    int64_t before = gw_worker_rss();
    gw_body_store_drop(); /* the idle large-body blocks (<= 8 MiB) too */
    malloc_trim(0);
    int64_t after = gw_worker_rss();
    sl_counter_add(gw_m.malloc_trims, 1);
    if (before > after && after >= 0)
        sl_counter_add(gw_m.malloc_trim_bytes, (uint64_t)(before - after));
    return true;
}

/* This thread's body-shape counts (body_scan.c) into the metrics. */
static void gw_worker_shape_tick(gw_worker_t *w)
{
    gw_shape_stats_t st = gw_body_scan_shape_stats();
    if (st.hits != w->shape_hits_shown)
        sl_counter_add(gw_m.scan_shape_hits, st.hits - w->shape_hits_shown);
    if (st.misses != w->shape_misses_shown)
        sl_counter_add(gw_m.scan_shape_misses, st.misses - w->shape_misses_shown);
    w->shape_hits_shown = st.hits;
    w->shape_misses_shown = st.misses;
}

static void gw_worker_tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_worker_t *w = arg;
    int64_t now = sl_now_ms();
    gw_upstream_tick(w, now);
    /* The load that holds memory: client connections and idle upstream
     * ones (those close keepalive_timeout after the clients that used
     * them, and their buffers are as much to give back). */
    size_t load = w->nconns;
    for (size_t i = 0; i < w->nwsrv; i++)
        load += w->wsrv[i].nidle;
    if (load > w->peak_conns)
        w->peak_conns = load;
    bool fell = w->peak_conns >= load + GW_TRIM_DROP && load <= w->peak_conns / 2;
    bool reload = w->trim_at_ms && now >= w->trim_at_ms;
    /* before the trim: the structs it frees are memory it can give back */
    gw_conn_cache_tick(w, fell);
    gw_worker_shape_tick(w);
    gw_h2_mem_tick(w->h2mem, fell);
    (void)gw_wio_mem_tick(fell);   /* this thread's kept chains, likewise */
    (void)gw_tls_mem_tick(fell);   /* and its TLS record buffers */
    gw_hooks_worker_tick(w, fell); /* the policy adapters' per-thread caches */
    if ((fell || reload) && gw_worker_trim(now)) {
        w->peak_conns = load;
        if (reload) {
            w->trim_at_ms = w->trim_again ? now + GW_TRIM_RELOAD2_MS - GW_TRIM_RELOAD_MS : 0;
            w->trim_again = false;
        }
    } else if (reload && !fell) {
        w->trim_at_ms = now + GW_TRIM_INTERVAL_MS; /* another worker trimmed: later */
    }
}

/* libevent allocates a small slot (~32 bytes) per descriptor number the
 * first time the number is watched, and keeps it until the base is freed.
 * Allocated during a peak, between the connections' buffers, 10,000 of them
 * pin ~30 MB of that freed memory (glibc gives back whole free pages only:
 * measured with malloc_info after 5,000 connections, 66 MB free in 10,066
 * pieces). So each worker makes libevent allocate them at start, together:
 * an eventfd duplicated at (or above) every number up to what the worker
 * may use, watched and unwatched once. */
#define GW_WORKER_FD_SLOTS_MAX 65536

static void gw_worker_nop_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
}

static void gw_worker_reserve_fd_slots(gw_worker_t *w)
{
    struct rlimit rl;
    int64_t n = w->rt->conf->limits.max_connections * 2 + 256; /* client + upstream */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        n = SL_MIN(n, (int64_t)rl.rlim_cur);
    n = SL_MIN(n, GW_WORKER_FD_SLOTS_MAX);
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct event *ev = event_new(w->base, -1, 0, gw_worker_nop_cb, NULL);
    for (int k = efd + 1; efd >= 0 && ev && k < n; k++) {
        int d = fcntl(efd, F_DUPFD_CLOEXEC, k); /* the lowest free number >= k */
        if (d < 0)
            break;
        if (event_assign(ev, w->base, d, EV_READ, gw_worker_nop_cb, NULL) == 0 &&
            event_add(ev, NULL) == 0)
            event_del(ev);
        close(d);
        if (d > k)
            k = d; /* k..d-1 are in use, their slots taken already */
    }
    if (ev)
        event_free(ev);
    if (efd >= 0)
        close(efd);
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

/* The admin listener's reserve (main thread): descriptors held so that
 * /metrics and /healthz still answer when the process is out of them; one
 * is given back for each accept that hits the limit, and taken again when
 * an admin connection closes or the accept timer runs. */
static void gw_reserve_fill(gw_worker_t *w)
{
    for (size_t i = 0; w->is_main && i < SL_ARRAY_LEN(w->fd_reserve); i++)
        if (w->fd_reserve[i] < 0)
            w->fd_reserve[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

static bool gw_reserve_release(gw_worker_t *w)
{
    for (size_t i = 0; w->is_main && i < SL_ARRAY_LEN(w->fd_reserve); i++)
        if (w->fd_reserve[i] >= 0) {
            close(w->fd_reserve[i]);
            w->fd_reserve[i] = -1;
            return true;
        }
    return false;
}

/* A connection that never sent a byte is shed only after this long: a
 * client just accepted has had no time to send its request yet. */
#define GW_WORKER_SHED_SILENT_MS 1000

/* Out of descriptors: closes up to max of this worker's connections that
 * wait for a request with nothing buffered — idle keep-alive ones first,
 * then those silent since their accept — oldest first, so a new client is
 * served now rather than after their timeouts. Returns how many. */
static int gw_worker_shed(gw_worker_t *w, int max)
{
    int n = 0;
    /* a silent connection's deadline is its header deadline from accept */
    int64_t silent_before =
        sl_now_ms() + w->rt->conf->limits.header_timeout_ms - GW_WORKER_SHED_SILENT_MS;
    for (int pass = 0; pass < 2 && n < max; pass++) {
        gw_conn_t *c = TAILQ_FIRST(&w->conns), *next;
        for (; c && n < max; c = next) {
            next = TAILQ_NEXT(c, link);
            if (c->phase != GW_PHASE_IDLE || c->closed || (pass == 0) != (c->nrequests > 0) ||
                evbuffer_get_length(bufferevent_get_input(c->bev)) > 0 ||
                (pass == 1 && c->deadline_ms > silent_before))
                continue;
            gw_conn_close(c);
            n++;
        }
    }
    return n;
}

void gw_worker_conn_closed(gw_worker_t *w)
{
    gw_reserve_fill(w);
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
    /* TCP_NODELAY comes from the listener (gw_worker_listen_prepare). */
    gw_conn_accept(w, fd, sa, salen, slot->l);
    if (w->nconns > w->peak_conns) /* a burst shorter than a tick counts too */
        w->peak_conns = w->nconns;
    if (!w->is_main && (int64_t)w->nconns >= w->rt->conf->limits.max_connections)
        gw_worker_accept_enable(w, false);
}

static void gw_accept_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_worker_t *w = arg;
    gw_reserve_fill(w);
    if (w->accept_paused && !w->draining)
        gw_worker_accept_enable(w, true);
}

/* Connections shed per accept that hits the descriptor limit. */
#define GW_WORKER_SHED 16

static void gw_accept_error_cb(struct evconnlistener *l, void *arg)
{
    (void)l;
    int err = EVUTIL_SOCKET_ERROR();
    gw_worker_t *w = ((gw_lslot_t *)arg)->w;
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        /* Out of descriptors. The admin listener takes one from its
         * reserve; a worker sheds its oldest idle connections (their
         * descriptors are closed by libevent's finalizers later in this
         * loop turn, so accepting resumes on the next one). Otherwise
         * accepting pauses until a connection closes or a second passes
         * (closes in other workers). One log line per interval for all
         * workers. */
        bool reserve = w->is_main && gw_reserve_release(w);
        int shed = reserve ? 0 : gw_worker_shed(w, GW_WORKER_SHED);
        sl_log_limited(SL_LOG_WARN, "accept_fd_limit", "accept: %s; %s", strerror(err),
                       reserve ? "admin reserve used"
                       : shed  ? "shedding idle connections"
                               : "pausing accepts");
        struct timeval tv = {shed ? 0 : 1, shed ? 1000 : 0};
        event_add(w->accept_ev, &tv); /* also takes the reserve back */
        if (reserve)
            return; /* the listener is still on: the next accept gets it */
        gw_worker_accept_enable(w, false);
        return;
    }
    sl_warn("worker %d: accept: %s", w->id, strerror(err));
}

const struct timeval *gw_worker_timeout(gw_worker_t *w, int64_t ms, struct timeval *tv)
{
    if (ms < 0)
        ms = 0;
    tv->tv_sec = (time_t)(ms / 1000);
    tv->tv_usec = (suseconds_t)((ms % 1000) * 1000);
    for (size_t i = 0; i < w->nctimeouts; i++)
        if (w->ctimeouts[i].ms == ms)
            return w->ctimeouts[i].tv;
    if (ms == 0 || w->nctimeouts >= GW_WORKER_CTIMEOUTS)
        return tv;
    const struct timeval *c = event_base_init_common_timeout(w->base, tv);
    if (!c)
        return tv; /* libevent's own cap (256 per base) */
    w->ctimeouts[w->nctimeouts].ms = ms;
    w->ctimeouts[w->nctimeouts].tv = c;
    w->nctimeouts++;
    return c;
}

void gw_worker_timer_add(gw_worker_t *w, struct event *ev, int64_t ms, bool common)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(ev, common ? gw_worker_timeout(w, ms, &tv) : &tv);
}

int gw_worker_listen_prepare(int fd)
{
    /* Linux copies a listener's TCP options to the sockets it accepts, so
     * one setsockopt here replaces one per accepted connection (at 5,000
     * connections opened per run that was 5,000 syscalls). Done on every
     * listener a worker takes, inherited ones (binary upgrade) included:
     * an older process may not have set it. */
    int one = 1;
    return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int gw_worker_listen(gw_worker_t *w)
{
    w->listeners = sl_xcalloc(w->srv->nlistens, sizeof(*w->listeners));
    w->lslots = sl_xcalloc(w->srv->nlistens, sizeof(*w->lslots));
    w->nlisteners = w->srv->nlistens;
    for (size_t i = 0; i < w->srv->nlistens; i++) {
        gw_listen_rt_t *lr = &w->srv->listens[i];
        if (lr->admin != w->is_main)
            continue;
        w->lslots[i].w = w;
        w->lslots[i].l = lr;
        (void)gw_worker_listen_prepare(lr->fd);
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
    gw_rt_t *rt = gw_server_rt(w->srv);
    if (w->rt && rt->generation == w->rt->generation) {
        gw_rt_unref(rt);
        return;
    }
    gw_upstream_worker_reset(w);
    if (w->rt) { /* a reload: give the old runtime's memory back once it is freed */
        w->trim_at_ms = sl_now_ms() + GW_TRIM_RELOAD_MS;
        w->trim_again = true;
    }
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
    if (!w->is_main && atomic_fetch_add(&gw_unlistened, 1) + 1 == w->srv->nworkers) {
        /* Every worker has stopped watching the shared sockets: close them
         * so new connections are refused, not left in the backlog. */
        for (size_t i = 0; i < w->srv->nlistens; i++) {
            if (!w->srv->listens[i].admin && w->srv->listens[i].fd >= 0) {
                close(w->srv->listens[i].fd);
                w->srv->listens[i].fd = -1;
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

void gw_worker_stop_now(gw_worker_t *w)
{
    gw_conn_t *c, *next;
    for (c = TAILQ_FIRST(&w->conns); c; c = next) {
        next = TAILQ_NEXT(c, link);
        gw_conn_close(c);
    }
    if (!w->is_main)
        event_base_loopexit(w->base, NULL);
}

struct gw_mail {
    struct gw_mail *next;
    void (*fn)(void *);
    void *arg;
};

void gw_worker_wake(gw_worker_t *w)
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
    if (atomic_load(&w->srv->draining))
        gw_worker_start_drain(w);
    if (atomic_load(&w->srv->stop_now))
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
    w->nctimeouts = 0; /* common timeouts belong to a base */
    w->reap_ev = event_new(w->base, -1, 0, gw_worker_reap_cb, w);
    w->flush_ev = event_new(w->base, -1, 0, gw_wio_flush_cb, w);
    return w->reap_ev && w->flush_ev ? 0 : -1;
}

void gw_worker_fini_loop(gw_worker_t *w)
{
    gw_worker_reap_cb(-1, 0, w);
    gw_conn_cache_free(w);
    gw_h2_mem_release(&w->h2mem);
    if (w->reap_ev)
        event_free(w->reap_ev);
    if (w->flush_ev)
        event_free(w->flush_ev);
    w->reap_ev = w->flush_ev = NULL;
}

/* epoll with libevent's changelist: an event added and deleted again within
 * one loop turn (a TLS connection's EV_WRITE armed by new output, then
 * disarmed when the kicked write empties it, wio.c) costs no epoll_ctl; only
 * the net change reaches the kernel when the loop next waits. libevent warns
 * that it mixes badly with dup()ed descriptors; none is ever registered. */
static struct event_base *gw_worker_base_new(void)
{
    struct event_config *cfg = event_config_new();
    if (!cfg)
        return NULL;
    event_config_set_flag(cfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    struct event_base *base = event_base_new_with_config(cfg);
    event_config_free(cfg);
    return base;
}

int gw_worker_init(gw_worker_t *w, gw_server_t *s, int id, bool is_main)
{
    w->srv = s;
    w->id = id;
    w->is_main = is_main;
    /* Millisecond timers through epoll_wait's timeout: a precise timer
     * (timerfd) costs a syscall per loop turn, and every deadline here
     * is in milliseconds anyway. */
    struct event_base *base = w->base ? w->base : gw_worker_base_new();
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
    w->tick_ev = event_new(w->base, -1, EV_PERSIST, gw_worker_tick_cb, w);
    if (!w->notify_ev || !w->accept_ev || !w->tick_ev)
        return -1;
    struct timeval tick = {0, GW_WORKER_TICK_MS * 1000};
    event_add(w->tick_ev, &tick);
    if (is_main) {
        /* A fixed mmap threshold: glibc's moves up after a large block is
         * freed, after which large blocks (a reloaded word list's automaton)
         * come from the heap and stay there; fixed, they are mmapped and
         * unmapped on free. Fixing it also fixes the trim threshold. */
        mallopt(M_MMAP_THRESHOLD, GW_MMAP_THRESHOLD);
    }
    for (size_t i = 0; i < SL_ARRAY_LEN(w->fd_reserve); i++)
        w->fd_reserve[i] = -1;
    gw_reserve_fill(w);
    gw_worker_update_rt(w);
    if (!is_main)
        gw_worker_reserve_fd_slots(w);
    if (gw_hooks_worker_init(w) != 0) /* the policy modules' per-thread handles */
        return -1;
    return gw_worker_listen(w);
}

void gw_worker_fini(gw_worker_t *w)
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
    if (w->tick_ev)
        event_free(w->tick_ev);
    w->tick_ev = NULL;
    for (size_t i = 0; w->is_main && i < SL_ARRAY_LEN(w->fd_reserve); i++)
        if (w->fd_reserve[i] >= 0)
            close(w->fd_reserve[i]);
    gw_worker_fini_loop(w);
    gw_rt_unref(w->rt);
    w->rt = NULL;
    event_base_free(w->base);
    w->base = NULL;
}

void gw_worker_run(gw_worker_t *w)
{
    event_base_dispatch(w->base);
}
