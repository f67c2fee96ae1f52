/*
 * yheap.c — a bump allocator for yajl (yheap.h says why). Each block has
 * its size in the 16 bytes in front of it, so realloc knows what to copy;
 * free of a block in the buffer does nothing.
 */
#include "common/yheap.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/sl.h"

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

/* ---- kept handles ------------------------------------------------------------ */

static void sl_ykeep_exit(void *p)
{
    sl_ykeep_t *k = p;
    if (k->h) {
        yajl_free(k->h);
        k->h = NULL;
    }
    k->listed = false;
}

/* The box on the thread's exit list (once); false: it cannot be. */
static bool sl_ykeep_list(sl_ykeep_t *k)
{
    if (sl_thread_at_exit(sl_ykeep_exit, k) != 0)
        return false;
    k->listed = true;
    return true;
}

yajl_handle sl_ykeep_take(sl_ykeep_t *k, const yajl_callbacks *cbs, bool check_utf8)
{
    yajl_handle h = k->h;
    if (h) {
        k->h = NULL;
        return h;
    }
    h = yajl_alloc(cbs, NULL, k);
    if (h) {
        if (!check_utf8)
            yajl_config(h, yajl_dont_validate_strings, 1);
        yajl_config(h, yajl_allow_multiple_values, 1);
    }
    return h;
}

void sl_ykeep_put(sl_ykeep_t *k, yajl_handle h, bool whole)
{
    if (whole && !k->h && (k->listed || sl_ykeep_list(k))) {
        k->h = h;
        return;
    }
    yajl_free(h);
}
