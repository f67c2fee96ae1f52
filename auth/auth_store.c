/*
 * auth_store.c — the in-process nonce and revocation stores, shared by
 * every worker thread of one sluice process.
 *
 * Both are uthash tables with a list in insertion order beside them.
 * Entries are given their expiry when inserted, and expiries are close to
 * insertion order (now + a constant, or a timestamp within the window of
 * now), so expired entries are popped from the head of the list as new ones
 * arrive; an entry that is found expired is treated as absent, so lateness
 * in sweeping never changes an answer. When a table is at capacity after a
 * full sweep the insert fails (a store error for the caller's policy):
 * evicting a live nonce would reopen a replay, evicting a revocation would
 * un-revoke a token.
 *
 * Nonces are sharded by key (16 mutexes) so workers rarely contend; the
 * find-or-insert happens under one shard lock, which is what makes 100
 * concurrent copies of a request let exactly one through. Revocations are
 * read on every request and written rarely: one rwlock, plus an atomic
 * count so the common "nothing revoked" case takes no lock at all.
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

#define NONCE_SHARDS           16
#define DEFAULT_NONCE_CAP      1048576
#define DEFAULT_REVOCATION_CAP 65536

typedef struct nonce_ent {
    unsigned char key[AUTH_NONCE_KEY_LEN];
    int64_t expires; /* live while now <= expires */
    struct nonce_ent *prev, *next;
    UT_hash_handle hh;
} nonce_ent_t;

typedef struct nonce_shard {
    pthread_mutex_t mu;
    nonce_ent_t *table;
    nonce_ent_t *list; /* insertion order, oldest first */
    size_t count;
    size_t cap;
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
    pthread_rwlock_t rev_mu;
    rev_ent_t *rev_table;
    rev_ent_t *rev_list;
    _Atomic size_t rev_count;
    size_t rev_cap;
};

auth_stores_t *auth_stores_new(size_t nonce_capacity, size_t revocation_capacity)
{
    auth_stores_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    if (nonce_capacity == 0)
        nonce_capacity = DEFAULT_NONCE_CAP;
    if (revocation_capacity == 0)
        revocation_capacity = DEFAULT_REVOCATION_CAP;
    for (size_t i = 0; i < NONCE_SHARDS; i++) {
        pthread_mutex_init(&s->shards[i].mu, NULL);
        s->shards[i].cap = (nonce_capacity + NONCE_SHARDS - 1) / NONCE_SHARDS;
    }
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
        nonce_ent_t *e, *tmp;
        HASH_ITER(hh, sh->table, e, tmp)
        {
            HASH_DEL(sh->table, e);
            free(e);
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

size_t auth_stores_revocation_count(const auth_stores_t *s)
{
    return atomic_load(&s->rev_count);
}

/* ---- nonces ------------------------------------------------------------------ */

static void nonce_remove(nonce_shard_t *sh, nonce_ent_t *e)
{
    HASH_DEL(sh->table, e);
    DL_DELETE(sh->list, e);
    free(e);
    sh->count--;
}

/* Pops expired entries from the head; with `all`, walks the whole list
 * (used only when the shard is full, to reclaim out-of-order expiries). */
static void nonce_sweep(nonce_shard_t *sh, int64_t now, bool all)
{
    nonce_ent_t *e, *tmp;
    DL_FOREACH_SAFE(sh->list, e, tmp)
    {
        if (e->expires >= now) {
            if (!all)
                break;
            continue;
        }
        nonce_remove(sh, e);
    }
}

auth_store_rc_t auth_nonce_insert(auth_stores_t *s, const unsigned char key[AUTH_NONCE_KEY_LEN],
                                  int64_t expires, int64_t now)
{
    /* The key is a hash prefix, so any byte is a uniform shard index. */
    nonce_shard_t *sh = &s->shards[key[AUTH_NONCE_KEY_LEN - 1] % NONCE_SHARDS];
    auth_store_rc_t rc = AUTH_STORE_NEW;
    int oom = 0;
    pthread_mutex_lock(&sh->mu);
    nonce_ent_t *e = NULL;
    HASH_FIND(hh, sh->table, key, AUTH_NONCE_KEY_LEN, e);
    if (e && e->expires >= now) {
        rc = AUTH_STORE_SEEN;
        goto out;
    }
    if (e)
        nonce_remove(sh, e);
    nonce_sweep(sh, now, false);
    if (sh->count >= sh->cap)
        nonce_sweep(sh, now, true);
    if (sh->count >= sh->cap || !(e = malloc(sizeof(*e)))) {
        rc = AUTH_STORE_FULL;
        goto out;
    }
    memcpy(e->key, key, AUTH_NONCE_KEY_LEN);
    e->expires = expires;
    HASH_ADD(hh, sh->table, key, AUTH_NONCE_KEY_LEN, e);
    if (oom) {
        free(e);
        rc = AUTH_STORE_FULL;
        goto out;
    }
    DL_APPEND(sh->list, e);
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
