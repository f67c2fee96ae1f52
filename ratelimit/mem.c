/*
 * mem.c — the in-process store: every key's GCRA times and in-flight count
 * in a hash table split into lock stripes, shared by all worker threads.
 * A check or settle locks one stripe for a few hundred nanoseconds, which
 * is what makes it exact under concurrency (200 racing threads against a
 * limit of 10 let exactly 10 through).
 *
 * Memory is bounded by max_keys for the whole table (one atomic count, not
 * a share per stripe, so the cap is reached only when the table really
 * holds max_keys). Only idle keys are ever dropped: a key whose buckets are
 * full again and that holds no slot is indistinguishable from a fresh key,
 * so forgetting it costs nothing. Each stripe keeps its keys in LRU order
 * and drops idle ones as the LRU end is passed over. A live key is never
 * evicted: an evicted user would come back with a fresh burst, so anyone
 * with more identities than max_keys could switch the limits off. When the
 * table is full of live keys a new key is refused (RL_LIMIT_KEYS, a 429
 * with Retry-After and a metric) until some key goes idle; keys already
 * tracked are not affected.
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
    _Atomic size_t cap;     /* keys in the whole table (a reload may change it) */
    _Atomic size_t count;   /* keys in the whole table now */
    _Atomic unsigned probe; /* next stripe a full table looks at for idle keys */
    _Atomic uint64_t refused;
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
    atomic_store(&m->cap, max_keys > 0 ? max_keys : 1);
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
    return atomic_load(&((rl_mem_t *)m)->count);
}

uint64_t rl_mem_refused(const rl_mem_t *m)
{
    return atomic_load(&((rl_mem_t *)m)->refused);
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

static void rl_stripe_drop(rl_mem_t *m, rl_stripe_t *s, rl_entry_t *e)
{
    HASH_DELETE(hh, s->table, e);
    DL_DELETE2(s->lru, e, lru_prev, lru_next);
    s->n--;
    atomic_fetch_sub(&m->count, 1);
    free(e);
}

/* Drops up to max idle keys from the stripe's LRU end, never keep (NULL:
 * any); how many went. */
static int rl_stripe_reclaim(rl_mem_t *m, rl_stripe_t *s, int max, int64_t now,
                             const rl_entry_t *keep)
{
    int n = 0;
    while (n < max && s->lru && s->lru != keep && rl_entry_idle(s->lru, now)) {
        rl_stripe_drop(m, s, s->lru);
        n++;
    }
    return n;
}

/* The table is full: looks at the other stripes' LRU ends for idle keys,
 * starting at a rotating stripe, until one gives some back. trylock only
 * (the caller holds its own stripe), so two full checks can never wait on
 * each other. At most RL_STRIPES - 1 looks: constant work, and only for a
 * new key while the table is full. */
static void rl_mem_reclaim_elsewhere(rl_mem_t *m, const rl_stripe_t *own, int64_t now)
{
    unsigned start = atomic_fetch_add(&m->probe, 1);
    for (unsigned i = 0; i < RL_STRIPES; i++) {
        rl_stripe_t *o = &m->stripes[(start + i) % RL_STRIPES];
        if (o == own || pthread_mutex_trylock(&o->mu) != 0)
            continue;
        int n = rl_stripe_reclaim(m, o, RL_RECLAIM_PER_STRIPE, now, NULL);
        pthread_mutex_unlock(&o->mu);
        if (n > 0)
            return;
    }
}

/* Reserves room for one more key in the whole table. */
static bool rl_mem_reserve(rl_mem_t *m)
{
    if (atomic_fetch_add(&m->count, 1) < atomic_load_explicit(&m->cap, memory_order_relaxed))
        return true;
    atomic_fetch_sub(&m->count, 1);
    return false;
}

/* The stripe's entry for key, created (and made most recent) as needed.
 * NULL when it cannot be created: *full tells a table full of live keys
 * from an allocation failure. */
static rl_entry_t *rl_stripe_get(rl_mem_t *m, rl_stripe_t *s, const char *key, size_t klen,
                                 unsigned hv, int64_t now, bool *full)
{
    *full = false;
    rl_entry_t *e = NULL;
    HASH_FIND_BYHASHVALUE(hh, s->table, key, klen, hv, e);
    /* Passing over the LRU end: drop up to two idle keys per call, so idle
     * keys go away faster than new ones come; but not the key asked for.
     * An idle key (no slot held, every tat <= now) is what a fresh one
     * would be (rl_gcra_* read a tat <= now as now), so keeping it answers
     * the same, without the free and calloc a user pays on every request
     * when its one request at a time leaves it idle (settle puts an idle
     * key at the LRU end). */
    rl_stripe_reclaim(m, s, 2, now, e);
    if (e) {
        if (s->lru->lru_prev != e) { /* not already the most recent */
            DL_DELETE2(s->lru, e, lru_prev, lru_next);
            DL_APPEND2(s->lru, e, lru_prev, lru_next);
        }
        return e;
    }
    if (!rl_mem_reserve(m)) {
        rl_mem_reclaim_elsewhere(m, s, now);
        if (!rl_mem_reserve(m)) {
            *full = true;
            return NULL;
        }
    }
    e = calloc(1, sizeof(*e) + klen + 1);
    if (!e) {
        atomic_fetch_sub(&m->count, 1);
        return NULL;
    }
    memcpy(e->key, key, klen);
    e->klen = klen;
    HASH_ADD_KEYPTR_BYHASHVALUE(hh, s->table, e->key, klen, hv, e);
    DL_APPEND2(s->lru, e, lru_prev, lru_next);
    s->n++;
    return e;
}

/* When a table full of live keys may have room: the moment this stripe's
 * least recently used key goes idle (a guess: another key may go first),
 * at least a second away. */
static int64_t rl_stripe_retry_ms(const rl_stripe_t *s, int64_t now)
{
    int64_t until = 0;
    if (s->lru)
        for (int i = 0; i < TAT_N; i++)
            until = SL_MAX(until, s->lru->tat[i] - now);
    return SL_MAX((until + 999999) / 1000000, RL_KEYS_RETRY_MS);
}

unsigned rl_mem_hash(const char *key, size_t klen)
{
    unsigned h;
    HASH_VALUE(key, klen, h);
    return h;
}

static rl_stripe_t *rl_mem_stripe(rl_mem_t *m, unsigned hv)
{
    /* high bits pick the stripe; uthash uses the low bits for buckets */
    return &m->stripes[(hv >> 20) % RL_STRIPES];
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

void rl_mem_check(rl_mem_t *m, const char *key, size_t klen, unsigned hv, const rl_limits_t *lim,
                  bool ip, int64_t tokens, int64_t now, rl_decision_t *d, bool *slot)
{
    memset(d, 0, sizeof(*d));
    d->allowed = true;
    *slot = false;
    rl_stripe_t *s = rl_mem_stripe(m, hv);
    pthread_mutex_lock(&s->mu);
    bool full = false;
    rl_entry_t *e = rl_stripe_get(m, s, key, klen, hv, now, &full);
    if (!e && full) {
        /* Every key is live: a new one must not get a free burst. */
        d->allowed = false;
        d->limit = RL_LIMIT_KEYS;
        d->limit_value = (int64_t)atomic_load_explicit(&m->cap, memory_order_relaxed);
        d->retry_after_ms = rl_stripe_retry_ms(s, now);
        d->reset_ms = d->retry_after_ms;
        pthread_mutex_unlock(&s->mu);
        atomic_fetch_add(&m->refused, 1);
        return;
    }
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

void rl_mem_settle(rl_mem_t *m, const char *key, size_t klen, unsigned hv, const rl_limits_t *lim,
                   int64_t refund, bool slot, int64_t now)
{
    rl_stripe_t *s = rl_mem_stripe(m, hv);
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
        /* Idle now (its last slot back, its buckets full): first to go. */
        if (rl_entry_idle(e, now) && s->lru != e) {
            DL_DELETE2(s->lru, e, lru_prev, lru_next);
            DL_PREPEND2(s->lru, e, lru_prev, lru_next);
        }
    }
    pthread_mutex_unlock(&s->mu);
}
