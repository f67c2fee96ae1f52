/*
 * spares.h — a bounded stack of freed objects of one size, kept for reuse.
 *
 * A per-request object that is malloc'ed and freed at a few dozen requests in
 * flight overflows glibc's per-size thread cache (7 chunks) and reaches its
 * bins (~500 instructions a pair, measured). A worker keeps up to
 * SL_SPARES_MAX of them instead. Not thread-safe: one owner thread.
 *
 *   obj = sl_spares_take(&w->spares) ?: fresh allocation;  ... reset obj ...
 *   if (!sl_spares_keep(&w->spares, obj)) free(obj);
 *   sl_spares_free(&w->spares);  (when the owner goes)
 *
 * The caller resets what it takes: the stack keeps the bytes as they were
 * given back.
 */
#ifndef SL_SPARES_H
#define SL_SPARES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>

#define SL_SPARES_MAX 64

typedef struct sl_spares {
    size_t n;
    void *item[SL_SPARES_MAX];
} sl_spares_t;

/* The object given back last, or NULL when none is kept. */
static inline void *sl_spares_take(sl_spares_t *s)
{
    return s->n ? s->item[--s->n] : NULL;
}

/* Keeps p (takes ownership) and returns true, or returns false when the
 * stack is full: p is still the caller's to free. */
static inline bool sl_spares_keep(sl_spares_t *s, void *p)
{
    if (s->n >= SL_SPARES_MAX)
        return false;
    s->item[s->n++] = p;
    return true;
}

/* Frees every kept object; the stack is empty and usable after. */
static inline void sl_spares_free(sl_spares_t *s)
{
    while (s->n)
        free(s->item[--s->n]);
}

#endif
