/*
 * yarena.c — yajl's memory for one parse from a bump arena (on the
 * caller's stack). A stream parses every SSE event with a new yajl handle
 * (yajl has no reset), and the handle, its lexer, buffers and state stack
 * are ~5 allocations each time; from the arena they cost a pointer bump.
 * What does not fit goes to the heap, and back to it when yajl frees it.
 */
#include <stdlib.h>
#include <string.h>

#include "filters/flt_internal.h"

/* Each block starts with its size (for realloc's copy), 16-byte aligned. */
#define YA_HDR 16u

static bool ya_owns(const flt_yarena_t *a, const void *p)
{
    const unsigned char *u = p;
    return u >= a->buf && u < a->buf + sizeof a->buf;
}

static void *ya_malloc(void *ctx, size_t n)
{
    flt_yarena_t *a = ctx;
    size_t need = YA_HDR + ((n + 15u) & ~(size_t)15u);
    if (n <= sizeof a->buf && need <= sizeof a->buf - a->used) {
        unsigned char *b = a->buf + a->used;
        memcpy(b, &n, sizeof n);
        a->used += need;
        return b + YA_HDR;
    }
    return malloc(n);
}

static void ya_free(void *ctx, void *p)
{
    if (p && !ya_owns(ctx, p))
        free(p); /* arena blocks go with the next reset */
}

static void *ya_realloc(void *ctx, void *p, size_t n)
{
    flt_yarena_t *a = ctx;
    if (!p)
        return ya_malloc(ctx, n);
    if (!ya_owns(a, p))
        return realloc(p, n);
    size_t old;
    memcpy(&old, (unsigned char *)p - YA_HDR, sizeof old);
    void *q = ya_malloc(ctx, n);
    if (q)
        memcpy(q, p, old < n ? old : n);
    return q;
}

yajl_alloc_funcs *flt_yarena_reset(flt_yarena_t *a)
{
    a->used = 0;
    a->funcs = (yajl_alloc_funcs){ya_malloc, ya_realloc, ya_free, a};
    return &a->funcs;
}
