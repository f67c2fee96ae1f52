/*
 * pool.c — spin-then-futex compute pool (see pool_internal.h). The caller
 * publishes a job by bumping `gen`; helpers that see the new generation run
 * their share and bump `done`; the caller runs share 0 and spins until every
 * helper is done. Sleeping helpers are counted so that the common case (all
 * of them spinning) costs no system call.
 */
#include "model/pool_internal.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Roughly a millisecond of spinning before a helper sleeps: longer than the
 * gap between two matrix products of one token, shorter than a human can
 * notice when the engine goes idle. */
#define POOL_SPIN 20000

struct mdl_pool {
    int nth;
    pthread_t *threads;
    _Atomic uint32_t gen;
    _Atomic int done;
    _Atomic int sleepers;
    _Atomic int stop;
    mdl_pool_fn fn;
    void *arg;
};

typedef struct {
    mdl_pool_t *p;
    int ith;
} helper_arg_t;

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void *helper_main(void *v)
{
    helper_arg_t ha = *(helper_arg_t *)v;
    free(v);
    mdl_pool_t *p = ha.p;
    /* gen was 0 when the pool was made; a job may already be posted by the
     * time this thread runs, so do not read the current value */
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < POOL_SPIN) {
                cpu_relax();
                continue;
            }
            /* Announce the sleep, then re-check: the dispatcher bumps gen
             * before reading sleepers, so one of us sees the other. */
            atomic_fetch_add(&p->sleepers, 1);
            if (atomic_load(&p->gen) == seen)
                futex_wait(&p->gen, seen);
            atomic_fetch_sub(&p->sleepers, 1);
            spins = 0;
        }
        seen = g;
        if (atomic_load(&p->stop))
            return NULL;
        p->fn(p->arg, ha.ith, p->nth);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

mdl_pool_t *mdl_pool_new(int nthreads)
{
    if (nthreads < 1)
        nthreads = 1;
    mdl_pool_t *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->nth = nthreads;
    p->threads = calloc((size_t)nthreads, sizeof(pthread_t));
    if (!p->threads) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < nthreads; i++) {
        helper_arg_t *ha = malloc(sizeof(*ha));
        if (ha) {
            ha->p = p;
            ha->ith = i;
        }
        if (!ha || pthread_create(&p->threads[i], NULL, helper_main, ha) != 0) {
            free(ha);
            p->nth = i; /* join only those that started */
            mdl_pool_free(p);
            return NULL;
        }
    }
    return p;
}

void mdl_pool_free(mdl_pool_t *p)
{
    if (!p)
        return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1);
    futex_wake_all(&p->gen);
    for (int i = 1; i < p->nth; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p);
}

int mdl_pool_size(const mdl_pool_t *p)
{
    return p ? p->nth : 1;
}

void mdl_pool_run(mdl_pool_t *p, mdl_pool_fn fn, void *arg)
{
    if (!p || p->nth == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: publishes fn/arg, orders the sleepers read */
    if (atomic_load(&p->sleepers) > 0)
        futex_wake_all(&p->gen);
    fn(arg, 0, p->nth);
    int spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < p->nth - 1) {
        /* helpers finish within microseconds of us; yield only if one was
         * descheduled (2 vCPUs are shared with the proxy) */
        if (++spins < POOL_SPIN)
            cpu_relax();
        else
            sched_yield();
    }
}
