/*
 * pool.c — spin-then-futex compute pool with work claiming (see
 * pool_internal.h).
 *
 * A dispatch is one 64-bit word: generation (32 bits) | next unclaimed item
 * (16) | item count (16). The caller fills fn/arg, publishes the word, bumps
 * the 32-bit `gen` the helpers spin (and futex-wait) on, and then claims
 * items like any helper. A claim is a compare-and-swap on the word, so a
 * helper that wakes late, after the caller has finished the job or even
 * started the next one, fails its claim (the generation or the counter
 * moved on) and never touches a finished job's fn/arg. The caller returns
 * once `done` reaches the item count: it waits only for items a helper has
 * claimed and is still running.
 *
 * Such a wait is long only when the host preempted the helper in the middle
 * of an item; then the pool runs alone for a back-off period (doubling while
 * it keeps happening, shrinking while helpers keep up), so a busy host
 * never makes the pool slower than its caller alone.
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

/* How long the caller spins waiting for a helper's last item before it
 * yields (pauses; ~1 ms). */
#define POOL_SPIN 20000
/* How long an idle helper spins before it sleeps: longer than the gap
 * between two matrix products of one token (microseconds), but not the
 * gap between steps. A helper that spins through those gaps holds its
 * share of a core the host gives to others too (the proxy, other
 * processes) and is then preempted at a random point, often in the middle
 * of an item the caller must wait for; one that sleeps is woken with the
 * scheduler's credit for the sleep and runs its items promptly.
 * SLUICE_MDL_POOL_SPIN overrides it (for comparisons). */
#define POOL_IDLE_SPIN 2000
/* A wait for a claimed item longer than this means its helper was
 * descheduled (an item is a few microseconds of work). */
#define POOL_STRAGGLE_NS 50000
/* Run-alone back-off after a straggler: first, cap, and how many clean
 * parallel dispatches halve it again. */
#define POOL_SOLO_MIN_NS   16000000
#define POOL_SOLO_MAX_NS   1000000000
#define POOL_SOLO_DECAY_AT 1024
/* ... and at least this many times the wait itself: a helper that waited
 * long to run again will likely wait as long next time */
#define POOL_SOLO_WAIT_MULT 16

struct mdl_pool {
    int nth;
    int idle_spin;
    pthread_t *threads;
    _Atomic uint64_t work; /* gen << 32 | next << 16 | n */
    _Atomic uint32_t gen;  /* futex word: the generation last published */
    _Atomic int done;      /* items finished in the current job */
    _Atomic int sleepers;
    _Atomic int stop;
    _Atomic(mdl_pool_item_fn) fn;
    _Atomic(void *) arg;
    /* caller-only state */
    uint32_t cur_gen;
    int64_t backoff_ns, solo_until;
    int clean;
    mdl_pool_stats_t st;
    _Atomic uint64_t helper_items;
};

typedef struct {
    mdl_pool_t *p;
    int tid;
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

/* Claims and runs items of generation g until none is left (or a newer
 * job replaced it). Returns how many this thread ran. */
static int run_claims(mdl_pool_t *p, uint32_t g, int tid)
{
    int ran = 0;
    for (;;) {
        uint64_t w = atomic_load_explicit(&p->work, memory_order_acquire);
        if ((uint32_t)(w >> 32) != g)
            return ran;
        int next = (int)(w >> 16 & 0xFFFF), n = (int)(w & 0xFFFF);
        if (next >= n)
            return ran;
        if (!atomic_compare_exchange_weak_explicit(&p->work, &w, w + (1u << 16),
                                                   memory_order_acq_rel, memory_order_relaxed))
            continue;
        /* the claim succeeded while job g still had work, so the caller is
         * still inside it and fn/arg are g's */
        mdl_pool_item_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        fn(atomic_load_explicit(&p->arg, memory_order_relaxed), next, tid);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        ran++;
    }
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
            if (++spins < p->idle_spin) {
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
        int ran = run_claims(p, g, ha.tid);
        if (ran)
            atomic_fetch_add_explicit(&p->helper_items, (uint64_t)ran, memory_order_relaxed);
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
    const char *env = getenv("SLUICE_MDL_POOL_SPIN");
    p->idle_spin = env && *env ? atoi(env) : POOL_IDLE_SPIN;
    if (p->idle_spin < 0 || p->idle_spin > 10000000)
        p->idle_spin = POOL_IDLE_SPIN;
    p->threads = calloc((size_t)nthreads, sizeof(pthread_t));
    if (!p->threads) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < nthreads; i++) {
        helper_arg_t *ha = malloc(sizeof(*ha));
        if (ha) {
            ha->p = p;
            ha->tid = i;
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

void mdl_pool_stats(const mdl_pool_t *p, mdl_pool_stats_t *out)
{
    *out = (mdl_pool_stats_t){0};
    if (!p)
        return;
    *out = p->st;
    out->helper_items =
        atomic_load_explicit(&((mdl_pool_t *)p)->helper_items, memory_order_relaxed);
}

static void note_wait(mdl_pool_t *p, int64_t waited)
{
    if (waited > POOL_STRAGGLE_NS) {
        p->st.straggler_waits++;
        p->backoff_ns =
            p->backoff_ns ? SL_MIN(p->backoff_ns * 2, (int64_t)POOL_SOLO_MAX_NS) : POOL_SOLO_MIN_NS;
        p->solo_until = sl_now_ns() + SL_MAX(p->backoff_ns, waited * POOL_SOLO_WAIT_MULT);
        p->clean = 0;
    } else if (p->backoff_ns && ++p->clean >= POOL_SOLO_DECAY_AT) {
        p->backoff_ns /= 2;
        if (p->backoff_ns < POOL_SOLO_MIN_NS)
            p->backoff_ns = 0;
        p->clean = 0;
    }
}

void mdl_pool_run_items(mdl_pool_t *p, mdl_pool_item_fn fn, void *arg, int n_items)
{
    if (n_items <= 0)
        return;
    int solo = !p || p->nth == 1 || n_items == 1;
    if (!solo && p->solo_until) {
        if (sl_now_ns() < p->solo_until)
            solo = 1;
        else
            p->solo_until = 0;
    }
    if (solo) {
        if (p && p->nth > 1)
            p->st.solo_dispatches++;
        for (int i = 0; i < n_items; i++)
            fn(arg, i, 0);
        return;
    }
    if (n_items > MDL_POOL_MAX_ITEMS)
        n_items = MDL_POOL_MAX_ITEMS; /* callers size their items below this */
    uint32_t g = ++p->cur_gen;
    if (g == 0) /* 0 is the helpers' initial "seen"; skip it on wrap */
        g = ++p->cur_gen;
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->work, (uint64_t)g << 32 | (uint64_t)n_items, memory_order_release);
    atomic_store(&p->gen, g); /* seq_cst: orders the sleepers read below */
    if (atomic_load(&p->sleepers) > 0)
        futex_wake_all(&p->gen);
    p->st.dispatches++;
    p->st.caller_items += (uint64_t)run_claims(p, g, 0);
    int64_t t0 = 0, waited = 0;
    for (int spins = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n_items; spins++) {
        /* a helper is finishing a claimed item: microseconds, unless the
         * host descheduled it */
        if (spins == 16)
            t0 = sl_now_ns();
        if (spins < POOL_SPIN)
            cpu_relax();
        else
            sched_yield();
    }
    if (t0)
        waited = sl_now_ns() - t0;
    note_wait(p, waited);
}

typedef struct {
    mdl_pool_fn fn;
    void *arg;
    int nth;
} share_arg_t;

static void share_item(void *arg, int item, int tid)
{
    (void)tid;
    const share_arg_t *s = arg;
    s->fn(s->arg, item, s->nth);
}

void mdl_pool_run(mdl_pool_t *p, mdl_pool_fn fn, void *arg)
{
    share_arg_t s = {fn, arg, mdl_pool_size(p)};
    mdl_pool_run_items(p, share_item, &s, s.nth);
}
