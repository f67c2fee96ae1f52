/*
 * gw_server.h — the process (server.c): the current runtime, workers,
 * listeners, signals, reload and drain.
 */
#ifndef GW_SERVER_H
#define GW_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <event2/event.h>

#include "gateway/gw_types.h"
#include "gateway/gw_worker.h"

struct gw_server {
    gw_rt_t *_Atomic rt; /* current runtime */
    pthread_mutex_t rt_lock;
    gw_worker_t *workers;
    int nworkers;
    gw_worker_t main;
    gw_listen_rt_t *listens;
    size_t nlistens;
    _Atomic bool draining;
    _Atomic bool ready;
    _Atomic bool stop_now; /* shutdown_timeout passed: workers close everything */
    int64_t drain_deadline_ms;
    char *conf_path;
    struct rl *rl;          /* rate limiter: lives across reloads (its state must) */
    gw_shared_t *shared;    /* auth stores, breakers, budgets: across reloads too */
    struct fb_queue *queue; /* durable queue (NULL when no model queues) */
    struct fb_idem *idem;   /* idempotency store (NULL when off) */
    struct event *maint_ev; /* queue maintenance, once a second */
    struct event *sig_hup, *sig_term, *sig_int, *drain_timer, *drain_poll;

    /* issue 13 (signals, upgrade, systemd): WATCHDOG=1 timer when WatchdogSec= is set */
    struct event *watchdog_ev;
    struct event *sig_quit, *sig_usr1, *sig_usr2;
};
/* For /readyz: started and not draining. */
bool gw_server_ready(void);
/* A new reference to the current runtime. */
gw_rt_t *gw_server_rt(gw_server_t *s);
int gw_server_run(const char *conf_path);

#endif
