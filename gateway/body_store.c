/*
 * body_store.c — large request bodies in reusable blocks (body_store.h).
 * The cache is process-wide and small (a few blocks, a few MiB): the
 * blocks of the bodies in flight live in their evbuffers, and only the
 * idle ones are kept here, under a mutex (a lock per large body, not per
 * byte).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/body_store.h"

/* Idle blocks kept, and their total size: what a burst of large bodies
 * leaves resident at most. */
#define GW_BODY_STORE_CACHED       4
#define GW_BODY_STORE_CACHED_BYTES (8u << 20)
/* Block sizes are multiples of this, so bodies of near sizes share. */
#define GW_BODY_STORE_GRAIN (64u * 1024)

struct gw_body_blk {
    size_t cap, len;
    size_t want; /* the declared length */
    char data[];
};

static pthread_mutex_t gw_store_mu = PTHREAD_MUTEX_INITIALIZER;
static gw_body_blk_t *gw_store_idle[GW_BODY_STORE_CACHED];
static size_t gw_store_nidle, gw_store_idle_bytes;

gw_body_blk_t *gw_body_blk_new(size_t n)
{
    if (n < GW_BODY_STORE_MIN || n > GW_BODY_STORE_MAX)
        return NULL;
    gw_body_blk_t *b = NULL;
    pthread_mutex_lock(&gw_store_mu);
    size_t best = gw_store_nidle;
    for (size_t i = 0; i < gw_store_nidle; i++) /* the smallest that fits */
        if (gw_store_idle[i]->cap >= n &&
            (best == gw_store_nidle || gw_store_idle[i]->cap < gw_store_idle[best]->cap))
            best = i;
    if (best < gw_store_nidle) {
        b = gw_store_idle[best];
        gw_store_idle[best] = gw_store_idle[--gw_store_nidle];
        gw_store_idle_bytes -= b->cap;
    }
    pthread_mutex_unlock(&gw_store_mu);
    if (!b) {
        size_t cap = (n + GW_BODY_STORE_GRAIN - 1) / GW_BODY_STORE_GRAIN * GW_BODY_STORE_GRAIN;
        b = malloc(sizeof(*b) + cap);
        if (!b)
            return NULL;
        b->cap = cap;
    }
    b->len = 0;
    b->want = n;
    return b;
}

void gw_body_blk_free(gw_body_blk_t *b)
{
    if (!b)
        return;
    gw_body_blk_t *drop = NULL;
    pthread_mutex_lock(&gw_store_mu);
    size_t small = 0; /* the smallest idle block */
    for (size_t i = 1; i < gw_store_nidle; i++)
        if (gw_store_idle[i]->cap < gw_store_idle[small]->cap)
            small = i;
    if (gw_store_nidle > 0 && gw_store_idle[small]->cap < b->cap &&
        (gw_store_nidle == GW_BODY_STORE_CACHED ||
         gw_store_idle_bytes + b->cap > GW_BODY_STORE_CACHED_BYTES)) {
        /* full: a larger block serves more bodies than the smallest */
        drop = gw_store_idle[small];
        gw_store_idle[small] = gw_store_idle[--gw_store_nidle];
        gw_store_idle_bytes -= drop->cap;
    }
    if (gw_store_nidle < GW_BODY_STORE_CACHED &&
        gw_store_idle_bytes + b->cap <= GW_BODY_STORE_CACHED_BYTES) {
        gw_store_idle[gw_store_nidle++] = b;
        gw_store_idle_bytes += b->cap;
        b = NULL;
    }
    pthread_mutex_unlock(&gw_store_mu);
    free(drop);
    free(b);
}

bool gw_body_blk_add(gw_body_blk_t *b, const char *p, size_t n)
{
    if (n > b->cap - b->len)
        return false;
    if (p != b->data + b->len) /* else read in place (gw_body_blk_tail) */
        memmove(b->data + b->len, p, n);
    b->len += n;
    return true;
}

bool gw_body_blk_full(const gw_body_blk_t *b)
{
    return b->len == b->want;
}

char *gw_body_blk_tail(gw_body_blk_t *b)
{
    return b->data + b->len;
}

size_t gw_body_blk_left(const gw_body_blk_t *b)
{
    return b->want > b->len ? b->want - b->len : 0;
}

const char *gw_body_blk_data(const gw_body_blk_t *b, size_t *len)
{
    *len = b ? b->len : 0;
    return b && b->len ? b->data : NULL;
}

static void gw_body_blk_release(const void *data, size_t len, void *arg)
{
    (void)data;
    (void)len;
    gw_body_blk_free(arg);
}

int gw_body_blk_give(gw_body_blk_t *b, struct evbuffer *buf)
{
    if (b->len == 0) {
        gw_body_blk_free(b);
        return 0;
    }
    return evbuffer_add_reference(buf, b->data, b->len, gw_body_blk_release, b);
}

void gw_body_store_drop(void)
{
    pthread_mutex_lock(&gw_store_mu);
    while (gw_store_nidle > 0)
        free(gw_store_idle[--gw_store_nidle]);
    gw_store_idle_bytes = 0;
    pthread_mutex_unlock(&gw_store_mu);
}
