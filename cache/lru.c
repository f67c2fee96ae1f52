/*
 * lru.c — the in-process store: a hash table (uthash) of encoded entries
 * under one mutex, bounded by bytes, least recently used dropped first,
 * each entry with its expiry (wall ms, checked on every read and while
 * making room). Values are copied in and out so a reader never holds a
 * pointer into the table after the lock is released.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <uthash.h>

#include "cache/cache_internal.h"

/* What an entry costs beyond its value: the struct, the hash handle and
 * the allocator's rounding, so a flood of tiny entries is bounded too. */
#define CACHE_LRU_OVERHEAD 160

typedef struct cache_lentry cache_lentry_t;
struct cache_lentry {
    unsigned char key[CACHE_KEY_LEN];
    char *val;
    size_t len;
    int64_t expires_ms;
    sl_mseries_t *m_entries, *m_bytes; /* this entry's model series */
    UT_hash_handle hh;
    TAILQ_ENTRY(cache_lentry) link; /* most recent first */
};
TAILQ_HEAD(cache_llist, cache_lentry);

struct cache_lru {
    pthread_mutex_t lock;
    int64_t max_bytes;
    int64_t bytes;
    size_t count;
    uint64_t evictions;
    cache_lentry_t *by_key;
    struct cache_llist order;
};

cache_lru_t *cache_lru_new(int64_t max_bytes)
{
    cache_metrics_init();
    cache_lru_t *l = calloc(1, sizeof(*l));
    if (!l)
        return NULL;
    pthread_mutex_init(&l->lock, NULL);
    l->max_bytes = max_bytes;
    TAILQ_INIT(&l->order);
    return l;
}

static int64_t cache_lentry_cost(size_t len)
{
    return (int64_t)len + CACHE_KEY_LEN + CACHE_LRU_OVERHEAD;
}

/* Under the lock. */
static void cache_lentry_drop(cache_lru_t *l, cache_lentry_t *e)
{
    HASH_DEL(l->by_key, e);
    TAILQ_REMOVE(&l->order, e, link);
    int64_t cost = cache_lentry_cost(e->len);
    l->bytes -= cost;
    l->count--;
    sl_gauge_add(e->m_entries, -1);
    sl_gauge_add(e->m_bytes, -cost);
    free(e->val);
    free(e);
}

void cache_lru_free(cache_lru_t *l)
{
    if (!l)
        return;
    cache_lentry_t *e, *tmp;
    HASH_ITER(hh, l->by_key, e, tmp)
    cache_lentry_drop(l, e);
    pthread_mutex_destroy(&l->lock);
    free(l);
}

int cache_lru_put(cache_lru_t *l, const unsigned char key[CACHE_KEY_LEN], const char *val,
                  size_t len, int64_t expires_ms, const char *model)
{
    int64_t cost = cache_lentry_cost(len);
    if (cost > l->max_bytes)
        return -1;
    cache_lentry_t *e = calloc(1, sizeof(*e));
    char *copy = malloc(len + 1);
    if (!e || !copy) {
        free(e);
        free(copy);
        return -1;
    }
    memcpy(copy, val, len);
    copy[len] = '\0';
    memcpy(e->key, key, CACHE_KEY_LEN);
    e->val = copy;
    e->len = len;
    e->expires_ms = expires_ms;
    const char *label = model ? model : "_none";
    e->m_entries = sl_metric_series1(cache_m.entries, label);
    e->m_bytes = sl_metric_series1(cache_m.bytes, label);

    pthread_mutex_lock(&l->lock);
    cache_lentry_t *old;
    HASH_FIND(hh, l->by_key, key, CACHE_KEY_LEN, old);
    if (old)
        cache_lentry_drop(l, old);
    /* Make room: the least recent first (an expired entry is as good as any). */
    while (l->bytes + cost > l->max_bytes && !TAILQ_EMPTY(&l->order)) {
        cache_lentry_t *victim = TAILQ_LAST(&l->order, cache_llist);
        cache_lentry_drop(l, victim);
        l->evictions++;
        sl_counter_add(sl_metric_series0(cache_m.evictions), 1);
    }
    HASH_ADD(hh, l->by_key, key, CACHE_KEY_LEN, e);
    TAILQ_INSERT_HEAD(&l->order, e, link);
    l->bytes += cost;
    l->count++;
    sl_gauge_add(e->m_entries, 1);
    sl_gauge_add(e->m_bytes, cost);
    pthread_mutex_unlock(&l->lock);
    return 0;
}

char *cache_lru_get(cache_lru_t *l, const unsigned char key[CACHE_KEY_LEN], int64_t now_ms,
                    size_t *len)
{
    char *out = NULL;
    pthread_mutex_lock(&l->lock);
    cache_lentry_t *e;
    HASH_FIND(hh, l->by_key, key, CACHE_KEY_LEN, e);
    if (e && e->expires_ms <= now_ms) {
        cache_lentry_drop(l, e);
        e = NULL;
    }
    if (e) {
        TAILQ_REMOVE(&l->order, e, link);
        TAILQ_INSERT_HEAD(&l->order, e, link);
        out = malloc(e->len + 1);
        if (out) {
            memcpy(out, e->val, e->len + 1);
            if (len)
                *len = e->len;
        }
    }
    pthread_mutex_unlock(&l->lock);
    return out;
}

void cache_lru_del(cache_lru_t *l, const unsigned char key[CACHE_KEY_LEN])
{
    pthread_mutex_lock(&l->lock);
    cache_lentry_t *e;
    HASH_FIND(hh, l->by_key, key, CACHE_KEY_LEN, e);
    if (e)
        cache_lentry_drop(l, e);
    pthread_mutex_unlock(&l->lock);
}

size_t cache_lru_count(cache_lru_t *l)
{
    pthread_mutex_lock(&l->lock);
    size_t n = l->count;
    pthread_mutex_unlock(&l->lock);
    return n;
}

int64_t cache_lru_bytes(cache_lru_t *l)
{
    pthread_mutex_lock(&l->lock);
    int64_t n = l->bytes;
    pthread_mutex_unlock(&l->lock);
    return n;
}

uint64_t cache_lru_evictions(cache_lru_t *l)
{
    pthread_mutex_lock(&l->lock);
    uint64_t n = l->evictions;
    pthread_mutex_unlock(&l->lock);
    return n;
}
