/*
 * yheap.c — a bump allocator for yajl (yheap.h says why). Each block has
 * its size in the 16 bytes in front of it, so realloc knows what to copy;
 * free of a block in the buffer does nothing.
 */
#include "common/yheap.h"

#include <pthread.h>
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

/* ---- kept handles ------------------------------------------------------------ */

typedef struct sl_ykeep_list {
    sl_ykeep_t *box[SL_YKEEP_MAX];
    size_t n;
} sl_ykeep_list_t;

static _Thread_local sl_ykeep_list_t sl_ykeep_tls;
static pthread_key_t sl_ykeep_key;
static pthread_once_t sl_ykeep_once = PTHREAD_ONCE_INIT;
static bool sl_ykeep_key_ok;

static void sl_ykeep_exit(void *p)
{
    sl_ykeep_list_t *l = p;
    for (size_t i = 0; i < l->n; i++) {
        if (l->box[i]->h) {
            yajl_free(l->box[i]->h);
            l->box[i]->h = NULL;
        }
    }
}

static void sl_ykeep_init(void)
{
    sl_ykeep_key_ok = pthread_key_create(&sl_ykeep_key, sl_ykeep_exit) == 0;
}

/* The box on the thread's exit list (once); false: it cannot be. */
static bool sl_ykeep_list(sl_ykeep_t *k)
{
    sl_ykeep_list_t *l = &sl_ykeep_tls;
    pthread_once(&sl_ykeep_once, sl_ykeep_init);
    if (!sl_ykeep_key_ok || l->n == SL_YKEEP_MAX)
        return false;
    if (l->n == 0 && pthread_setspecific(sl_ykeep_key, l) != 0)
        return false;
    l->box[l->n++] = k;
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
