/*
 * gw_worker.h — one worker thread (server.c): an event_base, the client
 * connections accepted on it, its idle upstream connections, the policy
 * modules' per-thread handles, deferred frees and a mailbox for other threads.
 */
#ifndef GW_WORKER_H
#define GW_WORKER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <event2/listener.h>

#include "common/spares.h"
#include "gateway/gw_conn.h"
#include "gateway/gw_types.h"
#include "gateway/gw_upstream.h"
#include "gateway/gw_wio.h"

typedef struct gw_lslot {
    gw_worker_t *w;
    struct gw_listen_rt *l;
} gw_lslot_t;

/* Request structs a worker may keep for reuse (conn.c): enough for a peak of
 * thousands of requests in flight; the tick frees what went unused. */
#define GW_REQ_CACHE_MAX 4096
/* Durations with a libevent common timeout per worker (gw_worker_timeout). */
#define GW_WORKER_CTIMEOUTS 32

struct gw_worker {
    gw_server_t *srv;
    int id;
    bool is_main; /* the main thread's pseudo-worker (admin listener) */
    pthread_t thread;
    struct event_base *base;
    gw_rt_t *rt;     /* current runtime (reference held) */
    gw_wsrv_t *wsrv; /* [rt->nservers] */
    size_t nwsrv;
    struct evconnlistener **listeners;
    gw_lslot_t *lslots;
    size_t nlisteners;
    struct event *notify_ev; /* another thread asks (an eventfd): reload / drain / stop,
                                and the mailbox below */
    int notify_fd;
    pthread_mutex_t mail_lock;
    struct gw_mail *mail_head, **mail_tail;
    struct event *accept_ev; /* re-enable accepting after EMFILE */
    struct event *reap_ev;   /* deferred frees */
    struct event *flush_ev;  /* direct writes (wio.c) */
    struct gw_wio_list flushq;
    struct gw_conn_list conns;
    size_t nconns;
    gw_req_t *req_cache[GW_REQ_CACHE_MAX]; /* request structs kept for reuse (conn.c) */
    size_t nreq_cache;
    size_t req_cache_low;      /* fewest cached since the last tick (conn.c) */
    size_t req_cache_shown;    /* what the gauge has of this worker's cache */
    uint64_t shape_hits_shown; /* what the counters have of body_scan's shape stats */
    uint64_t shape_misses_shown;
    struct gw_h2_mem *h2mem;        /* nghttp2's block free lists (h2_mem.c), made at first use */
    struct event *tick_ev;          /* housekeeping (worker.c): idle upstreams, malloc_trim */
    size_t peak_conns;              /* most client + idle upstream conns since the last trim */
    int64_t trim_at_ms;             /* a reload's trim is due then (0: none) */
    bool trim_again;                /* ... and one more later */
    struct rl_worker *rlw;          /* rate limits: this thread's handle (NULL = none) */
    sl_spares_t rl_spares;          /* hook_ratelimit.c's request states, freed ones kept */
    struct sl_redis *redis;         /* this thread's Redis client for auth (NULL = none) */
    struct fb_qworker *qw;          /* the durable queue, this thread's handle */
    struct fb_idem_worker *iw;      /* idempotency store, this thread's handle */
    struct gw_resender *resender;   /* worker 0: resends queued requests */
    void *hook_state[GW_MAX_HOOKS]; /* a policy module's per-thread handle (gw_hook_index) */
    bool accept_paused;
    bool draining;
    int fd_reserve[4]; /* main: descriptors kept for the admin listener (-1: used) */
    uint64_t rng;
    /* libevent common timeouts, one per duration in ms (gw_worker_timeout) */
    struct {
        int64_t ms;
        const struct timeval *tv;
    } ctimeouts[GW_WORKER_CTIMEOUTS];
    size_t nctimeouts;
    /* deferred frees */
    void **reap;
    size_t nreap, capreap;
    void (**reap_fn)(void *);
};

/* A worker of process s (id -1 and is_main: the main thread's pseudo-worker
 * for the admin listener): its loop, mailbox, runtime, the hooks'
 * per-thread handles, its listeners. */
int gw_worker_init(gw_worker_t *w, gw_server_t *s, int id, bool is_main);
void gw_worker_fini(gw_worker_t *w);
/* Runs its loop until it ends (drained, stopped). */
void gw_worker_run(gw_worker_t *w);
/* Closes every connection now, and ends the loop. */
void gw_worker_stop_now(gw_worker_t *w);
/* Makes it look at its mailbox, the runtime and the drain/stop flags. */
void gw_worker_wake(gw_worker_t *w);

/* The worker's event-loop services on base (deferred frees, direct-write
 * flushes, its connection list): all that hosting connections needs, without
 * threads, listeners or a mailbox (gw_worker_init in server.c adds those;
 * the socketless tests use this alone). fini runs what is still deferred. */
int gw_worker_init_loop(gw_worker_t *w, struct event_base *base);
void gw_worker_fini_loop(gw_worker_t *w);
void gw_worker_defer_free(gw_worker_t *w, void (*fn)(void *), void *obj);
/* Runs fn(arg) on w's thread, soon; callable from any thread. libevent runs
 * without its own locks (each base belongs to one thread), so this is the
 * only way in from outside. -1 on OOM. */
int gw_worker_post(gw_worker_t *w, void (*fn)(void *), void *arg);
uint64_t gw_worker_rand(gw_worker_t *w);
/* A connection closed: accepting may resume. */
void gw_worker_conn_closed(gw_worker_t *w);
/* The timeval to event_add a timer of ms milliseconds with: a libevent
 * common timeout for that duration (an O(1) queue: every timer of one
 * duration expires in the order it was added) instead of the timer heap,
 * whose insert and delete cost O(log n) cache misses with thousands of
 * connections. tv is filled either way and is what is returned when the
 * table is full (GW_WORKER_CTIMEOUTS durations, reloads included). Valid
 * for w's base only. */
const struct timeval *gw_worker_timeout(gw_worker_t *w, int64_t ms, struct timeval *tv);
/* evtimer_add of ev in ms milliseconds: on that duration's common timeout
 * when `common` (a configured duration, which many timers share), else on
 * the heap (any other number: a common timeout each would fill the table). */
void gw_worker_timer_add(gw_worker_t *w, struct event *ev, int64_t ms, bool common);
/* Options set on a listening socket once instead of on each connection it
 * accepts (TCP_NODELAY, which Linux copies to accepted sockets). 0 ok, -1
 * if the socket refused one (not TCP). */
int gw_worker_listen_prepare(int fd);

#endif
