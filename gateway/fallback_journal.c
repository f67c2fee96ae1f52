/*
 * fallback_journal.c — journal accepts off the event loop, for the fallback
 * chain's template tier (fallback_chain.c) when the model queues to a
 * journal file: one thread writes and fdatasyncs for every worker, and the
 * answer comes back through the worker's mailbox.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fallback/fallback.h"
#include "gateway/gw_fallback.h"
#include "gateway/gw_req.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_types.h"
#include "gateway/gw_worker.h"

/* ---- journal accepts off the event loop ---------------------------------------
 *
 * The journal writes and fdatasyncs before an accept returns (milliseconds
 * on a slow disk). One thread does that for every worker; the answer comes
 * back through the worker's mailbox. A client that leaves meanwhile only
 * unhooks itself: its request is stored all the same (and delivered). */

struct gw_qjob {
    struct gw_qjob *next;
    gw_worker_t *w;
    gw_req_t *r; /* NULL once the request left (worker thread only) */
    void (*done)(void *r, fb_qres_t *res);
    char *user, *key, *route, *body;
    fb_qres_t res;
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_t thread;
    bool running, stop;
    gw_qjob_t *head, **tail;
} gw_qthread = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void gw_qjob_free(gw_qjob_t *j)
{
    if (!j)
        return;
    fb_qres_clear(&j->res);
    free(j->user);
    free(j->key);
    free(j->route);
    free(j->body);
    free(j);
}

/* Takes ownership of body. */
static gw_qjob_t *gw_qjob_new(gw_req_t *r, const char *key, char *body)
{
    gw_qjob_t *j = calloc(1, sizeof(*j));
    if (!j) {
        free(body);
        return NULL;
    }
    j->w = r->c->w;
    j->r = r;
    j->body = body;
    j->user = strdup(gw_req_user(r));
    j->key = key[0] ? strdup(key) : NULL;
    j->route = strdup(r->model->name);
    if (!j->user || !j->route || (key[0] && !j->key)) {
        gw_qjob_free(j);
        return NULL;
    }
    return j;
}

/* The worker: the accept is done. */
static void gw_qjob_done(void *arg)
{
    gw_qjob_t *j = arg;
    gw_req_t *r = j->r;
    if (r)
        j->done(r, &j->res); /* clears r's wait */
    gw_qjob_free(j);
}

static void *gw_qthread_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&gw_qthread.lock);
    for (;;) {
        while (!gw_qthread.head && !gw_qthread.stop)
            pthread_cond_wait(&gw_qthread.cond, &gw_qthread.lock);
        gw_qjob_t *j = gw_qthread.head;
        if (!j)
            break; /* stopping, and nothing left */
        gw_qthread.head = j->next;
        if (!gw_qthread.head)
            gw_qthread.tail = &gw_qthread.head;
        pthread_mutex_unlock(&gw_qthread.lock);
        fb_qaccept_t in = {
            .user = j->user,
            .idem_key = j->key,
            .route = j->route,
            .body = j->body,
            .body_len = strlen(j->body),
        };
        /* The journal store answers at once (FB_DONE); only the queue is
         * touched, under its own lock. */
        if (fb_queue_accept(j->w->qw, &in, &j->res, NULL, NULL, NULL) != FB_DONE)
            j->res.status = FB_Q_STORE_ERROR;
        if (gw_worker_post(j->w, gw_qjob_done, j) != 0)
            gw_qjob_free(j); /* out of memory: the request keeps waiting; nothing leaks */
        pthread_mutex_lock(&gw_qthread.lock);
    }
    pthread_mutex_unlock(&gw_qthread.lock);
    return NULL;
}

static int gw_qthread_push(gw_qjob_t *j)
{
    pthread_mutex_lock(&gw_qthread.lock);
    if (!gw_qthread.running) {
        gw_qthread.tail = &gw_qthread.head;
        gw_qthread.stop = false;
        if (pthread_create(&gw_qthread.thread, NULL, gw_qthread_main, NULL) != 0) {
            pthread_mutex_unlock(&gw_qthread.lock);
            return -1;
        }
        gw_qthread.running = true;
    }
    *gw_qthread.tail = j;
    gw_qthread.tail = &j->next;
    pthread_cond_signal(&gw_qthread.cond);
    pthread_mutex_unlock(&gw_qthread.lock);
    return 0;
}

void gw_fb_queue_thread_stop(void)
{
    pthread_mutex_lock(&gw_qthread.lock);
    bool running = gw_qthread.running;
    gw_qthread.stop = true;
    pthread_cond_signal(&gw_qthread.cond);
    pthread_mutex_unlock(&gw_qthread.lock);
    if (running)
        pthread_join(gw_qthread.thread, NULL); /* finishes what was queued */
    gw_qthread.running = false;
}

/* The client left: the accept completes anyway, and nobody is told. */
static void gw_qjob_wait_cancel(gw_req_t *r, void *job)
{
    (void)r;
    ((gw_qjob_t *)job)->r = NULL;
}

int gw_fb_journal_accept(gw_req_t *r, const char *key, char *body,
                         void (*done)(void *r, fb_qres_t *res))
{
    gw_qjob_t *j = gw_qjob_new(r, key, body); /* takes body */
    if (!j)
        return -1;
    j->done = done;
    gw_req_wait(r, gw_qjob_wait_cancel, j); /* before the push: the thread may be done at once */
    if (gw_qthread_push(j) == 0)
        return 0;
    gw_req_wait_done(r);
    gw_qjob_free(j);
    return -1;
}
