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

/* upgrade.c: the SIGUSR2 binary upgrade (the hand-over is described there).
 * In the new process, at start while single-threaded: gw_upgrade_inherit()
 * reads what the old one passed (1 when this process is an upgrade's),
 * gw_upgrade_take() gives the inherited socket listening on an address (or
 * -1: bind it), gw_upgrade_close_unused() closes the ones no longer
 * configured, gw_upgrade_ready() tells the old process (false when there
 * is none). In the old one: gw_upgrade_init() notes the binary's path at
 * start; gw_upgrade_start() runs the new binary and calls on_ready on the
 * main loop once it is ready (-1 and err: refused, nothing started; a
 * failure later is logged and this process keeps serving). */
int gw_upgrade_inherit(void);
int gw_upgrade_take(const char *address);
void gw_upgrade_close_unused(void);
bool gw_upgrade_ready(void);
void gw_upgrade_init(void);
void gw_upgrade_fini(void);
int gw_upgrade_start(gw_server_t *s, const gw_rt_t *rt, void (*on_ready)(gw_server_t *), char *err,
                     size_t errlen);

#endif
