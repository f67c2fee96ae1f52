/*
 * body_store.c — large request bodies in reusable blocks (body_store.h).
 * The cache is process-wide and small (a few blocks, a few MiB): the
 * blocks of the bodies in flight live in their evbuffers, and only the
 * idle ones are kept here, under a mutex (a lock per large body, not per
 * byte).
 *
 * A block is a small header and its bytes: up to GW_BODY_STORE_GROW bytes
 * from malloc, sized for the body at once; past it a private anonymous
 * mapping that starts at GW_BODY_STORE_READ and doubles with mremap, which
 * moves the pages rather than the bytes, so a body that arrives fast pays
 * a few page-table moves (none when the cache had a block for all of it)
 * and a slow one holds what it sent, not what it declared.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/metrics.h"
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
    bool mapped; /* data is a mapping of cap bytes (else malloc'd) */
    char *data;
};

static pthread_mutex_t gw_store_mu = PTHREAD_MUTEX_INITIALIZER;
static gw_body_blk_t *gw_store_idle[GW_BODY_STORE_CACHED];
static size_t gw_store_nidle, gw_store_idle_bytes;
/* the caps of the blocks out of the cache (any worker grows its own) */
static _Atomic size_t gw_store_held;

static size_t gw_grain_up(size_t n)
{
    return (n + GW_BODY_STORE_GRAIN - 1) / GW_BODY_STORE_GRAIN * GW_BODY_STORE_GRAIN;
}

static void gw_blk_release_data(gw_body_blk_t *b)
{
    if (b->mapped)
        munmap(b->data, b->cap);
    else
        free(b->data);
}

static void gw_blk_destroy(gw_body_blk_t *b)
{
    gw_blk_release_data(b);
    free(b);
}

/* A fresh block: the whole body's room up to GW_BODY_STORE_GROW, else a
 * mapping that gw_blk_grow doubles. */
static gw_body_blk_t *gw_blk_alloc(size_t n)
{
    gw_body_blk_t *b = malloc(sizeof(*b));
    if (!b)
        return NULL;
    b->len = 0;
    if (n <= GW_BODY_STORE_GROW) {
        b->mapped = false;
        b->cap = gw_grain_up(n);
        b->data = malloc(b->cap);
    } else {
        b->mapped = true;
        b->cap = GW_BODY_STORE_READ;
        b->data = mmap(NULL, b->cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (b->data == MAP_FAILED)
            b->data = NULL;
    }
    if (!b->data) {
        free(b);
        return NULL;
    }
    return b;
}

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
    if (!b && !(b = gw_blk_alloc(n)))
        return NULL;
    b->len = 0;
    b->want = n;
    atomic_fetch_add(&gw_store_held, b->cap);
    return b;
}

void gw_body_blk_free(gw_body_blk_t *b)
{
    if (!b)
        return;
    atomic_fetch_sub(&gw_store_held, b->cap);
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
    if (drop)
        gw_blk_destroy(drop);
    if (b)
        gw_blk_destroy(b);
}

/* Room for need more bytes: the mapping doubles (at least to fit them,
 * at most to the declared length). Only mappings grow: a malloc'd block
 * was sized for its body. -1: out of memory, the block as it was. */
static int gw_blk_grow(gw_body_blk_t *b, size_t need)
{
    if (need <= b->cap - b->len)
        return 0;
    size_t full = gw_grain_up(b->want);
    if (!b->mapped || b->len + need > full)
        return -1;
    size_t cap = b->cap * 2 > b->len + need ? b->cap * 2 : gw_grain_up(b->len + need);
    if (cap > full)
        cap = full;
    void *p = mremap(b->data, b->cap, cap, MREMAP_MAYMOVE);
    if (p == MAP_FAILED)
        return -1;
    atomic_fetch_add(&gw_store_held, cap - b->cap);
    b->data = p;
    b->cap = cap;
    return 0;
}

bool gw_body_blk_add(gw_body_blk_t *b, const char *p, size_t n)
{
    if (n > b->want - b->len)
        return false;            /* past the declared length */
    if (p != b->data + b->len) { /* else read in place (gw_body_blk_tail) */
        if (gw_blk_grow(b, n) != 0)
            return false;
        memmove(b->data + b->len, p, n);
    }
    b->len += n;
    return true;
}

bool gw_body_blk_full(const gw_body_blk_t *b)
{
    return b->len == b->want;
}

char *gw_body_blk_tail(gw_body_blk_t *b, size_t *room)
{
    *room = 0;
    if (b->len >= b->want || (b->len == b->cap && gw_blk_grow(b, 1) != 0))
        return NULL;
    size_t r = b->cap - b->len, left = b->want - b->len;
    *room = r < left ? r : left;
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
        gw_blk_destroy(gw_store_idle[--gw_store_nidle]);
    gw_store_idle_bytes = 0;
    pthread_mutex_unlock(&gw_store_mu);
}

void gw_body_store_bytes(size_t *held, size_t *idle)
{
    pthread_mutex_lock(&gw_store_mu);
    *idle = gw_store_idle_bytes;
    pthread_mutex_unlock(&gw_store_mu);
    *held = atomic_load(&gw_store_held);
}

static void gw_body_store_collect(FILE *f)
{
    size_t held, idle;
    gw_body_store_bytes(&held, &idle);
    fprintf(f,
            "# HELP sluice_body_store_bytes Bytes in large request bodies' blocks: held by bodies "
            "being read or in flight, idle in the cache.\n"
            "# TYPE sluice_body_store_bytes gauge\n"
            "sluice_body_store_bytes{state=\"held\"} %zu\n"
            "sluice_body_store_bytes{state=\"idle\"} %zu\n",
            held, idle);
}

void gw_body_store_register(void)
{
    sl_metrics_add_collector(gw_body_store_collect);
}
