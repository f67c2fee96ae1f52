/*
 * auth_store.c — the in-process nonce and revocation stores, shared by
 * every worker thread of one sluice process.
 *
 * Nonces: a uthash table per shard (16 shards, one mutex each, keyed by a
 * hash prefix so they fill evenly), plus a ring of time buckets per shard:
 * every entry sits in the bucket of its expiry second / AUTH_NONCE_BUCKET_S.
 * Expiry never scans: when a bucket's last second has passed, its whole
 * list is moved (one O(1) splice) to the shard's dead list, and each call
 * gives a few dead entries back to the shard's slabs (entries are carved
 * from per-shard slabs, not malloc'd one by one). The capacity (nonce_memory / the bytes an
 * entry costs) holds for the whole store through one atomic count of live
 * entries, not a share per shard, so no shard can fill while others have
 * room. A full store therefore refuses in O(1) — a hash lookup (a replay
 * is still a replay) and an atomic add — instead of walking a shard.
 * Refusing is the only choice: evicting a live nonce would reopen a replay.
 * An entry found expired is treated as absent, so lateness in freeing
 * never changes an answer; a nonce is kept up to one bucket longer than
 * its expiry (it still counts against the capacity until then).
 *
 * The find-or-insert happens under one shard lock, which is what makes 100
 * concurrent copies of a request let exactly one through. Revocations are
 * read on every request and written rarely: one rwlock, plus an atomic
 * count so the common "nothing revoked" case takes no lock at all; they
 * expire from the head of an insertion-ordered list (their expiries are
 * now + a constant).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "auth/auth_internal.h"

/* Set by uthash when it cannot grow a table; the element is then not
 * added. Every HASH_ADD below has an `oom` variable in scope. */
#define HASH_NONFATAL_OOM        1
#define uthash_nonfatal_oom(obj) (oom = 1)
#include <uthash.h>
#include <utlist.h>

#include <openssl/rand.h>

/* uthash grows a table when a chain reaches this length (its default is
 * 10, which keeps 2-3 entries per bucket on average). A fresh nonce, which
 * is nearly every insert, is looked up before it is added and that lookup
 * walks its whole chain: one dependent cache miss per entry in a server
 * whose cache the rest of the request has flushed (perf under bench/
 * policy.sh: the walk was ~1.5 us of a signed request's CPU). 7 halves the
 * chains for 16-byte buckets that keep a nonce within its 128-byte budget
 * at scale (~121 bytes at 200k-1M held; test_nonce_memory_per_entry); 6
 * would exceed it. The revocation table, small, gets the same. */
#undef HASH_BKT_CAPACITY_THRESH
#define HASH_BKT_CAPACITY_THRESH 7U

#define NONCE_SHARDS           16
#define DEFAULT_NONCE_CAP      (AUTH_NONCE_MEMORY_DEFAULT / AUTH_NONCE_ENTRY_BYTES)
#define DEFAULT_REVOCATION_CAP 65536
/* Buckets per shard: enough for the longest life of a nonce (2 x the
 * longest window, 1 h: a timestamp up to a window ahead, kept a window
 * after it) plus the bucket being filled and the one being emptied. */
#define NONCE_BUCKETS 1024
_Static_assert(2 * 3600 / AUTH_NONCE_BUCKET_S + 3 < NONCE_BUCKETS, "nonce ring too short");
/* Dead entries freed per call: more than the one a call may add, so the
 * dead list drains faster than the store fills. */
#define NONCE_FREE_PER_CALL 8
/* Entries are carved from slabs of this many, per shard: long-lived
 * nonces do not interleave with the requests' short-lived allocations (a
 * malloc per nonce fragmented the heap: glibc's malloc_consolidate showed
 * in every request's profile), and an entry costs no allocator header.
 * Freed entries go back to their shard's free list, so a shard holds at
 * most what it held at its peak (bounded by the capacity). */
_Static_assert(AUTH_NONCE_KEY_LEN >= 8, "nonce_hashv reads 8 key bytes");
#define NONCE_SLAB 512

typedef struct nonce_ent {
    UT_hash_handle hh;
    struct nonce_ent *prev, *next; /* in its bucket, or the shard's dead list */
    int64_t expires;               /* live while now <= expires */
    uint32_t gen;                  /* its bucket's gen when it went in */
    unsigned char key[AUTH_NONCE_KEY_LEN];
} nonce_ent_t;

typedef struct nonce_slab {
    struct nonce_slab *next;
    nonce_ent_t ents[NONCE_SLAB];
} nonce_slab_t;

typedef struct nonce_bucket {
    nonce_ent_t *list; /* NULL = empty */
    int64_t epoch;     /* expires / AUTH_NONCE_BUCKET_S of every entry in list */
    size_t n;
    uint32_t gen; /* +1 each time the bucket is emptied into the dead list */
} nonce_bucket_t;

typedef struct nonce_shard {
    pthread_mutex_t mu;
    nonce_ent_t *table;
    nonce_ent_t *dead;  /* expired, still in table: freed a few per call */
    nonce_ent_t *spare; /* free entries (linked by next) */
    nonce_slab_t *slabs;
    size_t count;   /* entries held, live and dead */
    int64_t cursor; /* next epoch whose bucket may have expired */
    nonce_bucket_t ring[NONCE_BUCKETS];
} __attribute__((aligned(64))) nonce_shard_t;

typedef struct rev_ent {
    int64_t revoked_at; /* sub: tokens with iat <= this are revoked */
    int64_t expires;
    struct rev_ent *prev, *next;
    UT_hash_handle hh;
    size_t klen;
    char key[]; /* kind byte + id */
} rev_ent_t;

struct auth_stores {
    nonce_shard_t shards[NONCE_SHARDS];
    /* Odd, random per process: a nonce's table hash is the high half of
     * its key's first 8 bytes times this (multiply-shift). The key is
     * already a SHA-256 prefix, so hashing it again (uthash's Jenkins) only
     * cost time; the secret multiplier keeps a client who grinds nonces
     * from aiming them at one chain, which a fixed function (Jenkins, or
     * the key bytes themselves) would allow. */
    uint64_t hash_mult;
    _Atomic size_t nonce_live; /* entries not yet moved to a dead list */
    _Atomic size_t nonce_cap;
    _Atomic int64_t nonce_looked; /* when a full store last looked at every shard */
    pthread_rwlock_t rev_mu;
    rev_ent_t *rev_table;
    rev_ent_t *rev_list;
    _Atomic size_t rev_count;
    size_t rev_cap;
    int64_t started; /* auth_stores_set_started; INT64_MIN = never set */
};

auth_stores_t *auth_stores_new(size_t nonce_capacity, size_t revocation_capacity)
{
    auth_stores_t *s = NULL;
    /* aligned: the shards are cache-line aligned */
    if (posix_memalign((void **)&s, 64, sizeof(*s)) != 0)
        return NULL;
    memset(s, 0, sizeof(*s));
    s->started = INT64_MIN;
    if (nonce_capacity == 0)
        nonce_capacity = DEFAULT_NONCE_CAP;
    if (revocation_capacity == 0)
        revocation_capacity = DEFAULT_REVOCATION_CAP;
    for (size_t i = 0; i < NONCE_SHARDS; i++)
        pthread_mutex_init(&s->shards[i].mu, NULL);
    atomic_store(&s->nonce_cap, nonce_capacity);
    if (RAND_bytes((unsigned char *)&s->hash_mult, sizeof(s->hash_mult)) != 1) {
        free(s);
        return NULL;
    }
    s->hash_mult |= 1;
    pthread_rwlock_init(&s->rev_mu, NULL);
    s->rev_cap = revocation_capacity;
    return s;
}

void auth_stores_free(auth_stores_t *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < NONCE_SHARDS; i++) {
        nonce_shard_t *sh = &s->shards[i];
        HASH_CLEAR(hh, sh->table);
        while (sh->slabs) {
            nonce_slab_t *next = sh->slabs->next;
            free(sh->slabs);
            sh->slabs = next;
        }
        pthread_mutex_destroy(&sh->mu);
    }
    rev_ent_t *r, *rtmp;
    HASH_ITER(hh, s->rev_table, r, rtmp)
    {
        HASH_DEL(s->rev_table, r);
        free(r);
    }
    pthread_rwlock_destroy(&s->rev_mu);
    free(s);
}

void auth_stores_set_nonce_capacity(auth_stores_t *s, size_t entries)
{
    atomic_store(&s->nonce_cap, entries > 0 ? entries : 1);
}

size_t auth_stores_nonce_capacity(const auth_stores_t *s)
{
    return atomic_load(&((auth_stores_t *)s)->nonce_cap);
}

size_t auth_stores_nonce_count(const auth_stores_t *s)
{
    size_t n = 0;
    for (size_t i = 0; i < NONCE_SHARDS; i++) {
        nonce_shard_t *sh = (nonce_shard_t *)&s->shards[i];
        pthread_mutex_lock(&sh->mu);
        n += sh->count;
        pthread_mutex_unlock(&sh->mu);
    }
    return n;
}

size_t auth_stores_nonce_live(const auth_stores_t *s)
{
    return atomic_load(&((auth_stores_t *)s)->nonce_live);
}

void auth_stores_set_started(auth_stores_t *s, int64_t unix_s)
{
    s->started = unix_s;
}

int64_t auth_stores_started(const auth_stores_t *s)
{
    return s->started;
}

size_t auth_stores_revocation_count(const auth_stores_t *s)
{
    return atomic_load(&s->rev_count);
}

/* ---- nonces ------------------------------------------------------------------ */

static int64_t nonce_epoch(int64_t t)
{
    /* floor division: a clock before 1970 (tests) must not round up */
    return t >= 0 ? t / AUTH_NONCE_BUCKET_S
                  : -((-t + AUTH_NONCE_BUCKET_S - 1) / AUTH_NONCE_BUCKET_S);
}

static nonce_bucket_t *nonce_bucket(nonce_shard_t *sh, int64_t epoch)
{
    return &sh->ring[(uint64_t)epoch % NONCE_BUCKETS];
}

/* Moves a bucket's whole list to the dead list: one splice. */
static void nonce_bucket_kill(auth_stores_t *s, nonce_shard_t *sh, nonce_bucket_t *b)
{
    if (!b->list)
        return;
    DL_CONCAT(sh->dead, b->list);
    atomic_fetch_sub(&s->nonce_live, b->n);
    b->list = NULL;
    b->n = 0;
    b->gen++;
}

/* Kills the buckets whose last second has passed. Normally zero or one
 * step; after a long idle spell at most one turn of the ring. */
static void nonce_expire(auth_stores_t *s, nonce_shard_t *sh, int64_t now)
{
    int64_t now_e = nonce_epoch(now); /* bucket q is over when q < now_e */
    if (sh->cursor < now_e - NONCE_BUCKETS)
        sh->cursor = now_e - NONCE_BUCKETS;
    for (; sh->cursor < now_e; sh->cursor++) {
        nonce_bucket_t *b = nonce_bucket(sh, sh->cursor);
        if (b->list && b->epoch < now_e)
            nonce_bucket_kill(s, sh, b);
    }
}

static nonce_ent_t *nonce_ent_alloc(nonce_shard_t *sh)
{
    if (!sh->spare) {
        nonce_slab_t *sl = malloc(sizeof(*sl));
        if (!sl)
            return NULL;
        sl->next = sh->slabs;
        sh->slabs = sl;
        for (size_t i = 0; i < NONCE_SLAB; i++) {
            sl->ents[i].next = sh->spare;
            sh->spare = &sl->ents[i];
        }
    }
    nonce_ent_t *e = sh->spare;
    sh->spare = e->next;
    return e;
}

static void nonce_ent_release(nonce_shard_t *sh, nonce_ent_t *e)
{
    e->next = sh->spare;
    sh->spare = e;
}

static void nonce_free_dead(nonce_shard_t *sh, int max)
{
    for (int i = 0; i < max && sh->dead; i++) {
        nonce_ent_t *e = sh->dead;
        DL_DELETE(sh->dead, e);
        HASH_DEL(sh->table, e);
        nonce_ent_release(sh, e);
        sh->count--;
    }
}

/* Removes an expired entry found by lookup, from its bucket or the dead
 * list. It is in its bucket exactly when that bucket has not been emptied
 * since it went in (the same gen): a wall clock stepping back could
 * otherwise refill a bucket with an epoch it held before. */
static void nonce_remove(auth_stores_t *s, nonce_shard_t *sh, nonce_ent_t *e)
{
    nonce_bucket_t *b = nonce_bucket(sh, nonce_epoch(e->expires));
    if (b->gen == e->gen) {
        DL_DELETE(b->list, e);
        b->n--;
        atomic_fetch_sub(&s->nonce_live, 1);
    } else {
        DL_DELETE(sh->dead, e);
    }
    HASH_DEL(sh->table, e);
    nonce_ent_release(sh, e);
    sh->count--;
}

static unsigned nonce_hashv(const auth_stores_t *s, const unsigned char *key)
{
    uint64_t k;
    memcpy(&k, key, sizeof(k));
    return (unsigned)((k * s->hash_mult) >> 32);
}

/* Room for one more live nonce in the whole store. */
static bool nonce_reserve(auth_stores_t *s)
{
    if (atomic_fetch_add(&s->nonce_live, 1) < atomic_load(&s->nonce_cap))
        return true;
    atomic_fetch_sub(&s->nonce_live, 1);
    return false;
}

auth_store_rc_t auth_nonce_insert(auth_stores_t *s, const unsigned char key[AUTH_NONCE_KEY_LEN],
                                  int64_t expires, int64_t now)
{
    /* The key is a hash prefix, so any byte is a uniform shard index; the
     * capacity is the whole store's, so a skewed key cannot fill a shard. */
    nonce_shard_t *sh = &s->shards[key[AUTH_NONCE_KEY_LEN - 1] % NONCE_SHARDS];
    auth_store_rc_t rc = AUTH_STORE_NEW;
    int oom = 0;
    pthread_mutex_lock(&sh->mu);
    nonce_expire(s, sh, now);
    nonce_free_dead(sh, NONCE_FREE_PER_CALL);
    nonce_ent_t *e = NULL;
    unsigned hv = nonce_hashv(s, key);
    HASH_FIND_BYHASHVALUE(hh, sh->table, key, AUTH_NONCE_KEY_LEN, hv, e);
    if (e && e->expires >= now) {
        rc = AUTH_STORE_SEEN;
        goto out;
    }
    if (e)
        nonce_remove(s, sh, e);
    if (expires < now)
        goto out; /* replayable never again: nothing to remember */
    int64_t p = nonce_epoch(expires);
    if (p - nonce_epoch(now) >= NONCE_BUCKETS - 2) {
        rc = AUTH_STORE_FULL; /* beyond the ring (a window over 1 h): cannot be kept */
        goto out;
    }
    if (!nonce_reserve(s)) {
        /* Buckets of quiet shards may be over without anyone having looked:
         * look (trylock, so two full shards never wait on each other),
         * then ask again. At most NONCE_SHARDS - 1 short looks, and once a
         * second at most (buckets end on whole seconds): under a flood the
         * refusal itself stays cheap. */
        int64_t looked = atomic_load(&s->nonce_looked);
        bool room = false;
        if (looked != now && atomic_compare_exchange_strong(&s->nonce_looked, &looked, now)) {
            for (size_t i = 0; i < NONCE_SHARDS; i++) {
                nonce_shard_t *o = &s->shards[i];
                if (o == sh || pthread_mutex_trylock(&o->mu) != 0)
                    continue;
                nonce_expire(s, o, now);
                pthread_mutex_unlock(&o->mu);
            }
            room = nonce_reserve(s);
        }
        if (!room) {
            rc = AUTH_STORE_FULL;
            goto out;
        }
    }
    if (!(e = nonce_ent_alloc(sh))) {
        atomic_fetch_sub(&s->nonce_live, 1);
        rc = AUTH_STORE_FULL;
        goto out;
    }
    memcpy(e->key, key, AUTH_NONCE_KEY_LEN);
    e->expires = expires;
    HASH_ADD_BYHASHVALUE(hh, sh->table, key, AUTH_NONCE_KEY_LEN, hv, e);
    if (oom) {
        nonce_ent_release(sh, e);
        atomic_fetch_sub(&s->nonce_live, 1);
        rc = AUTH_STORE_FULL;
        goto out;
    }
    nonce_bucket_t *b = nonce_bucket(sh, p);
    if (b->list && b->epoch != p) /* an older turn of the ring: over by construction */
        nonce_bucket_kill(s, sh, b);
    b->epoch = p;
    e->gen = b->gen;
    DL_APPEND(b->list, e);
    b->n++;
    sh->count++;
out:
    pthread_mutex_unlock(&sh->mu);
    return rc;
}

/* ---- revocations ---------------------------------------------------------------- */

#define REV_KEY_MAX (1 + AUTH_SUB_MAX)

static size_t rev_key(char *buf, auth_rev_kind_t kind, const char *id, size_t len)
{
    buf[0] = (char)kind;
    memcpy(buf + 1, id, len);
    return len + 1;
}

static void rev_remove(auth_stores_t *s, rev_ent_t *e)
{
    HASH_DEL(s->rev_table, e);
    DL_DELETE(s->rev_list, e);
    free(e);
    atomic_fetch_sub(&s->rev_count, 1);
}

static void rev_sweep(auth_stores_t *s, int64_t now, bool all)
{
    rev_ent_t *e, *tmp;
    DL_FOREACH_SAFE(s->rev_list, e, tmp)
    {
        if (e->expires >= now) {
            if (!all)
                break;
            continue;
        }
        rev_remove(s, e);
    }
}

int auth_rev_add(auth_stores_t *s, auth_rev_kind_t kind, const char *id, size_t len,
                 int64_t revoked_at, int64_t expires, int64_t now)
{
    if (len == 0 || len > (kind == AUTH_REV_JTI ? AUTH_JTI_MAX : AUTH_SUB_MAX))
        return -1;
    char key[REV_KEY_MAX];
    size_t klen = rev_key(key, kind, id, len);
    int rc = 0, oom = 0;
    pthread_rwlock_wrlock(&s->rev_mu);
    rev_sweep(s, now, false);
    rev_ent_t *e = NULL;
    HASH_FIND(hh, s->rev_table, key, klen, e);
    if (e) {
        /* Revoking again only ever widens: later cut-off, later expiry. */
        e->revoked_at = SL_MAX(e->revoked_at, revoked_at);
        e->expires = SL_MAX(e->expires, expires);
        DL_DELETE(s->rev_list, e);
        DL_APPEND(s->rev_list, e);
        goto out;
    }
    if (atomic_load(&s->rev_count) >= s->rev_cap)
        rev_sweep(s, now, true);
    if (atomic_load(&s->rev_count) >= s->rev_cap || !(e = malloc(sizeof(*e) + klen))) {
        rc = -1;
        goto out;
    }
    e->revoked_at = revoked_at;
    e->expires = expires;
    e->klen = klen;
    memcpy(e->key, key, klen);
    HASH_ADD_KEYPTR(hh, s->rev_table, e->key, klen, e);
    if (oom) {
        free(e);
        rc = -1;
        goto out;
    }
    DL_APPEND(s->rev_list, e);
    atomic_fetch_add(&s->rev_count, 1);
out:
    pthread_rwlock_unlock(&s->rev_mu);
    return rc;
}

bool auth_rev_check(auth_stores_t *s, const auth_claims_t *c, int64_t now)
{
    if (atomic_load_explicit(&s->rev_count, memory_order_acquire) == 0)
        return false;
    char key[REV_KEY_MAX];
    bool revoked = false;
    pthread_rwlock_rdlock(&s->rev_mu);
    rev_ent_t *e = NULL;
    if (c->jti[0]) {
        size_t klen = rev_key(key, AUTH_REV_JTI, c->jti, strlen(c->jti));
        HASH_FIND(hh, s->rev_table, key, klen, e);
        if (e && e->expires >= now)
            revoked = true;
    }
    if (!revoked && c->sub[0]) {
        size_t klen = rev_key(key, AUTH_REV_SUB, c->sub, strlen(c->sub));
        e = NULL;
        HASH_FIND(hh, s->rev_table, key, klen, e);
        /* A token without iat cannot show it was issued after the cut-off. */
        if (e && e->expires >= now && (!c->has_iat || c->iat <= e->revoked_at))
            revoked = true;
    }
    pthread_rwlock_unlock(&s->rev_mu);
    return revoked;
}
