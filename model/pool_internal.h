/*
 * pool_internal.h — the engine's compute pool: a fixed set of helper threads
 * that share each matrix product with the calling thread. Dispatches come
 * about a hundred times per generated token, so helpers spin briefly on a
 * generation counter before sleeping on a futex; between requests they
 * sleep and cost nothing.
 *
 * Work is cut into many small items that threads claim one at a time from
 * an atomic counter, so a helper that the host deschedules (2 vCPUs shared
 * with the proxy and everything else) does not hold up a step: the caller
 * takes the items it would have done. Only an item a helper has already
 * claimed is waited for; when that wait is long (the helper was preempted
 * in the middle of one), the pool runs alone for a while before asking for
 * help again, so a busy host costs at most what one thread costs.
 *
 * One thread at a time may call mdl_pool_run*() (the engine's generation
 * thread). The pool owns its helper threads; mdl_pool_free() joins them.
 */
#ifndef MDL_POOL_INTERNAL_H
#define MDL_POOL_INTERNAL_H

#include "common/sl.h"

#include <stdint.h>

typedef struct mdl_pool mdl_pool_t;

/* Work item of mdl_pool_run_items(): item in [0, n_items), each run exactly
 * once by some thread; tid in [0, mdl_pool_size()) names the thread (0 is
 * the caller) for per-thread scratch. Items may run in any order and in
 * parallel. */
typedef void (*mdl_pool_item_fn)(void *arg, int item, int tid);
/* Older form: called once per share ith in [0, nth). The shares are items,
 * so a share may run on any thread (never two at once on one thread). */
typedef void (*mdl_pool_fn)(void *arg, int ith, int nth);

/* Most items one dispatch may have. */
#define MDL_POOL_MAX_ITEMS 65535

/* nthreads counts the caller: 1 means no helper threads. NULL on failure. */
SL_WUR mdl_pool_t *mdl_pool_new(int nthreads);
void mdl_pool_free(mdl_pool_t *p);
int mdl_pool_size(const mdl_pool_t *p);
/* Runs every item and returns when all have finished. A NULL pool (or one
 * thread) runs them inline, in order. n_items <= MDL_POOL_MAX_ITEMS. */
void mdl_pool_run_items(mdl_pool_t *p, mdl_pool_item_fn fn, void *arg, int n_items);
/* Runs fn once per share (nth = pool size) and returns when all are done. */
void mdl_pool_run(mdl_pool_t *p, mdl_pool_fn fn, void *arg);

typedef struct {
    uint64_t dispatches;      /* parallel dispatches (solo ones not counted) */
    uint64_t helper_items;    /* items run by helper threads */
    uint64_t caller_items;    /* items run by the caller */
    uint64_t straggler_waits; /* dispatches that waited long for a preempted helper */
    uint64_t solo_dispatches; /* dispatches run alone after such a wait */
} mdl_pool_stats_t;
/* Counters since mdl_pool_new (read by the caller's thread; approximate
 * from any other). */
void mdl_pool_stats(const mdl_pool_t *p, mdl_pool_stats_t *out);

#endif
