/*
 * yheap.c — a bump allocator for yajl (yheap.h says why). Each block has
 * its size in the 16 bytes in front of it, so realloc knows what to copy;
 * free of a block in the buffer does nothing.
 */
#include "common/yheap.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define SL_YHEAP_HDR 16

static bool sl_yheap_has(const sl_yheap_t *h, const void *p)
{
    return (const unsigned char *)p >= h->buf && (const unsigned char *)p < h->buf + sizeof(h->buf);
}

static void *sl_yheap_malloc(void *ctx, size_t sz)
{
    sl_yheap_t *h = ctx;
    size_t need = SL_YHEAP_HDR + ((sz + 15) & ~(size_t)15);
    if (sz < sizeof(h->buf) && sizeof(h->buf) - h->used >= need) {
        unsigned char *p = h->buf + h->used;
        memcpy(p, &sz, sizeof(sz));
        h->used += need;
        return p + SL_YHEAP_HDR;
    }
    return malloc(sz);
}

static void sl_yheap_free(void *ctx, void *p)
{
    if (!sl_yheap_has(ctx, p))
        free(p);
}

static void *sl_yheap_realloc(void *ctx, void *p, size_t sz)
{
    sl_yheap_t *h = ctx;
    if (!p)
        return sl_yheap_malloc(ctx, sz);
    if (!sl_yheap_has(h, p))
        return realloc(p, sz);
    size_t old;
    memcpy(&old, (unsigned char *)p - SL_YHEAP_HDR, sizeof(old));
    if (sz <= old)
        return p;
    void *n = sl_yheap_malloc(ctx, sz);
    if (n)
        memcpy(n, p, old);
    return n;
}

yajl_alloc_funcs sl_yheap_funcs(sl_yheap_t *h)
{
    h->used = 0;
    return (yajl_alloc_funcs){sl_yheap_malloc, sl_yheap_realloc, sl_yheap_free, h};
}
