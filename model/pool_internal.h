/*
 * pool_internal.h — the engine's compute pool: a fixed set of helper threads
 * that split each matrix product with the calling thread. Dispatches come
 * about a hundred times per generated token, so helpers spin briefly on a
 * generation counter before sleeping on a futex; between requests they
 * sleep and cost nothing.
 *
 * One thread at a time may call mdl_pool_run() (the engine's generation
 * thread). The pool owns its helper threads; mdl_pool_free() joins them.
 */
#ifndef MDL_POOL_INTERNAL_H
#define MDL_POOL_INTERNAL_H

#include "common/sl.h"

typedef struct mdl_pool mdl_pool_t;

/* Work item: called once per thread with ith in [0, nth); ith 0 is the
 * caller of mdl_pool_run(). */
typedef void (*mdl_pool_fn)(void *arg, int ith, int nth);

/* nthreads counts the caller: 1 means no helper threads. NULL on failure. */
SL_WUR mdl_pool_t *mdl_pool_new(int nthreads);
void mdl_pool_free(mdl_pool_t *p);
int mdl_pool_size(const mdl_pool_t *p);
/* Runs fn on every thread and returns when all have finished. A NULL pool
 * runs fn(arg, 0, 1) inline. */
void mdl_pool_run(mdl_pool_t *p, mdl_pool_fn fn, void *arg);

#endif
