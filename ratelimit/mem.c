/*
 * mem.c — the in-process store: every key's GCRA times and in-flight count
 * in a hash table split into lock stripes, shared by all worker threads.
 * A check or settle locks one stripe for a few hundred nanoseconds, which
 * is what makes it exact under concurrency (200 racing threads against a
 * limit of 10 let exactly 10 through).
 *
 * Memory is bounded: each stripe holds at most max_keys / RL_STRIPES keys
 * in LRU order. Keys whose buckets are full again and that hold no slot
 * are idle (indistinguishable from a fresh key) and are dropped as the LRU
 * end is passed over; a full stripe drops its least recently used key
 * (counted: that key forgets its usage).
 */
#include "ratelimit/rl_internal.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>
#include <utlist.h>

#define RL_STRIPES 64

enum { TAT_REQ = 0, TAT_TPM, TAT_TPD, TAT_N };

typedef struct rl_entry {
    UT_hash_handle hh;
    struct rl_entry *lru_prev, *lru_next;
    int64_t tat[TAT_N];
    int64_t inflight;
    size_t klen;
    char key[]; /* NUL-terminated */
} rl_entry_t;

typedef struct rl_stripe {
    pthread_mutex_t mu;
    rl_entry_t *table;
    rl_entry_t *lru; /* head = least recently used */
    size_t n;
} __attribute__((aligned(64))) rl_stripe_t;

struct rl_mem {
    rl_stripe_t stripes[RL_STRIPES];
    _Atomic size_t cap; /* per stripe (a reload may change it) */
    _Atomic uint64_t evictions;
};

rl_mem_t *rl_mem_new(size_t max_keys)
{
    rl_mem_t *m = NULL;
    if (posix_memalign((void **)&m, 64, sizeof(*m)) != 0)
        return NULL;
    memset(m, 0, sizeof(*m));
    for (int i = 0; i < RL_STRIPES; i++)
        pthread_mutex_init(&m->stripes[i].mu, NULL);
    rl_mem_set_cap(m, max_keys);
    return m;
}

void rl_mem_set_cap(rl_mem_t *m, size_t max_keys)
{
    size_t cap = max_keys / RL_STRIPES;
    atomic_store(&m->cap, cap < 1 ? 1 : cap);
}

void rl_mem_free(rl_mem_t *m)
{
    if (!m)
        return;
    for (int i = 0; i < RL_STRIPES; i++) {
        rl_stripe_t *s = &m->stripes[i];
        rl_entry_t *e, *tmp;
        HASH_ITER(hh, s->table, e, tmp)
        {
            HASH_DEL(s->table, e);
            free(e);
        }
        pthread_mutex_destroy(&s->mu);
    }
    free(m);
}

size_t rl_mem_count(const rl_mem_t *m)
{
    size_t n = 0;
    for (int i = 0; i < RL_STRIPES; i++) {
        rl_stripe_t *s = (rl_stripe_t *)&m->stripes[i];
        pthread_mutex_lock(&s->mu);
        n += s->n;
        pthread_mutex_unlock(&s->mu);
    }
    return n;
}

uint64_t rl_mem_evictions(const rl_mem_t *m)
{
    return atomic_load(&((rl_mem_t *)m)->evictions);
}

size_t rl_key_make(char prefix, const char *s, char *out)
{
    size_t n = strlen(s);
    if (n + 2 <= RL_KEY_MAX) {
        out[0] = prefix;
        out[1] = ':';
        memcpy(out + 2, s, n + 1);
        return n + 2;
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (EVP_Digest(s, n, md, &mdlen, EVP_sha256(), NULL) != 1)
        mdlen = 0;
    out[0] = 'h';
    out[1] = prefix;
    out[2] = ':';
    sl_hex(md, mdlen, out + 3);
    return 3 + 2 * (size_t)mdlen;
}

static bool rl_entry_idle(const rl_entry_t *e, int64_t now)
{
    if (e->inflight > 0)
        return false;
    for (int i = 0; i < TAT_N; i++)
        if (e->tat[i] > now)
            return false;
    return true;
}

static void rl_stripe_drop(rl_stripe_t *s, rl_entry_t *e)
{
    HASH_DELETE(hh, s->table, e);
    DL_DELETE2(s->lru, e, lru_prev, lru_next);
    s->n--;
    free(e);
}

/* The stripe's entry for key, created (and made most recent) as needed;
 * NULL only when a new one cannot be allocated. */
static rl_entry_t *rl_stripe_get(rl_mem_t *m, rl_stripe_t *s, const char *key, size_t klen,
                                 unsigned hv, int64_t now)
{
    /* Passing over the LRU end: drop up to two idle keys per call, so idle
     * keys go away at the rate new ones come. */
    for (int i = 0; i < 2 && s->lru && rl_entry_idle(s->lru, now); i++)
        rl_stripe_drop(s, s->lru);
    rl_entry_t *e = NULL;
    HASH_FIND_BYHASHVALUE(hh, s->table, key, klen, hv, e);
    if (e) {
        if (s->lru->lru_prev != e) { /* not already the most recent */
            DL_DELETE2(s->lru, e, lru_prev, lru_next);
            DL_APPEND2(s->lru, e, lru_prev, lru_next);
        }
        return e;
    }
    if (s->n >= atomic_load_explicit(&m->cap, memory_order_relaxed) && s->lru) {
        if (!rl_entry_idle(s->lru, now))
            atomic_fetch_add(&m->evictions, 1); /* that key forgets its usage */
        rl_stripe_drop(s, s->lru);
    }
    e = calloc(1, sizeof(*e) + klen + 1);
    if (!e)
        return NULL;
    memcpy(e->key, key, klen);
    e->klen = klen;
    HASH_ADD_KEYPTR_BYHASHVALUE(hh, s->table, e->key, klen, hv, e);
    DL_APPEND2(s->lru, e, lru_prev, lru_next);
    s->n++;
    return e;
}

static rl_stripe_t *rl_mem_stripe(rl_mem_t *m, const char *key, size_t klen, unsigned *hv)
{
    unsigned h;
    HASH_VALUE(key, klen, h);
    *hv = h;
    /* high bits pick the stripe; uthash uses the low bits for buckets */
    return &m->stripes[(h >> 20) % RL_STRIPES];
}

/* Keeps the refusal that asks for the longest wait ("never" beats all). */
static void rl_note_refusal(rl_decision_t *d, rl_limit_t lim, int64_t limit_value,
                            const rl_gcra_result_t *r, int64_t retry_ms, int64_t reset_ms)
{
    bool take =
        d->allowed || retry_ms == -1 || (d->retry_after_ms != -1 && retry_ms > d->retry_after_ms);
    if (!take)
        return;
    d->allowed = false;
    d->limit = lim;
    d->limit_value = limit_value;
    d->remaining = r ? r->remaining : 0;
    d->retry_after_ms = retry_ms;
    d->reset_ms = reset_ms;
}

static int64_t rl_ns_to_ms_ceil(int64_t ns)
{
    return ns < 0 ? -1 : (ns + 999999) / 1000000;
}

void rl_mem_check(rl_mem_t *m, const char *key, size_t klen, const rl_limits_t *lim, bool ip,
                  int64_t tokens, int64_t now, rl_decision_t *d, bool *slot)
{
    memset(d, 0, sizeof(*d));
    d->allowed = true;
    *slot = false;
    unsigned hv;
    rl_stripe_t *s = rl_mem_stripe(m, key, klen, &hv);
    pthread_mutex_lock(&s->mu);
    rl_entry_t *e = rl_stripe_get(m, s, key, klen, hv, now);
    if (!e) { /* out of memory: let it through rather than fail the request */
        pthread_mutex_unlock(&s->mu);
        return;
    }
    int64_t tat[TAT_N];
    memcpy(tat, e->tat, sizeof(tat));
    const int64_t limits[TAT_N] = {lim->requests_per_minute, lim->tokens_per_minute,
                                   lim->tokens_per_day};
    const int64_t periods[TAT_N] = {RL_MINUTE_NS, RL_MINUTE_NS, RL_DAY_NS};
    const int64_t costs[TAT_N] = {1, tokens, tokens};
    const rl_limit_t names[TAT_N] = {ip ? RL_LIMIT_IP_REQUESTS : RL_LIMIT_REQUESTS,
                                     RL_LIMIT_TOKENS_MINUTE, RL_LIMIT_TOKENS_DAY};
    rl_gcra_result_t res[TAT_N];
    bool used[TAT_N] = {false};
    for (int i = 0; i < TAT_N; i++) {
        if (limits[i] <= 0 || costs[i] <= 0)
            continue;
        used[i] = true;
        rl_gcra_take(&tat[i], now, limits[i], periods[i], costs[i], &res[i]);
        if (!res[i].allowed)
            rl_note_refusal(d, names[i], limits[i], &res[i], rl_ns_to_ms_ceil(res[i].retry_ns),
                            rl_ns_to_ms_ceil(res[i].reset_ns));
    }
    if (lim->concurrent > 0 && e->inflight >= lim->concurrent)
        rl_note_refusal(d, RL_LIMIT_CONCURRENT, lim->concurrent, NULL, RL_CONCURRENT_RETRY_MS,
                        RL_CONCURRENT_RETRY_MS);
    if (d->allowed) {
        memcpy(e->tat, tat, sizeof(tat));
        if (lim->concurrent > 0) {
            e->inflight++;
            *slot = true;
        }
        for (int i = 0; i < TAT_N; i++) {
            if (!used[i])
                continue;
            d->limit = names[i];
            d->limit_value = limits[i];
            d->remaining = res[i].remaining;
            d->reset_ms = rl_ns_to_ms_ceil(res[i].reset_ns);
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
}

void rl_mem_settle(rl_mem_t *m, const char *key, size_t klen, const rl_limits_t *lim,
                   int64_t refund, bool slot, int64_t now)
{
    unsigned hv;
    rl_stripe_t *s = rl_mem_stripe(m, key, klen, &hv);
    pthread_mutex_lock(&s->mu);
    rl_entry_t *e = NULL;
    HASH_FIND_BYHASHVALUE(hh, s->table, key, klen, hv, e);
    if (e) { /* gone means evicted: nothing left to give back */
        if (slot && e->inflight > 0)
            e->inflight--;
        if (refund != 0 && lim->tokens_per_minute > 0)
            rl_gcra_adjust(&e->tat[TAT_TPM], now, lim->tokens_per_minute, RL_MINUTE_NS, refund);
        if (refund != 0 && lim->tokens_per_day > 0)
            rl_gcra_adjust(&e->tat[TAT_TPD], now, lim->tokens_per_day, RL_DAY_NS, refund);
    }
    pthread_mutex_unlock(&s->mu);
}
