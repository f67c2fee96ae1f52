/*
 * auth_tcache.c — a cache of tokens that verified, so that the requests of
 * one app session (one token, many requests) do not each parse JSON and
 * check a signature (ES256: ~125 us). Keyed by the exact token bytes (an
 * entry keeps a copy; uthash compares them all on a hit, so a hash
 * collision is only a miss): a hit means these very bytes verified under
 * this auth_t's keys, so only the rules that depend on the clock are re-run
 * (by the caller); revocation is never cached. Each auth_t has its own
 * cache, so new keys (a reload) start empty. The hash is uthash's own over
 * the token's signature bytes (auth_tcache_hash), not SHA-256: only
 * verified tokens get in, so an attacker cannot fill a bucket, and SHA-256
 * through EVP was ~1.5% of a filtered request's CPU.
 *
 * Bounded: sharded uthash tables with a FIFO list; entries leave when
 * their token expires, or oldest first when a shard is full — an eviction
 * only costs one verification more.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "auth/auth_internal.h"

#define HASH_NONFATAL_OOM        1
#define uthash_nonfatal_oom(obj) (oom = 1)
#include <uthash.h>
#include <utlist.h>

#define TCACHE_SHARDS 8

typedef struct tc_ent {
    int64_t expires; /* unusable from this second on */
    auth_tcache_val_t val;
    struct tc_ent *prev, *next;
    UT_hash_handle hh;
    size_t len;
    char tok[]; /* the key: the token's bytes */
} tc_ent_t;

typedef struct tc_shard {
    pthread_mutex_t mu;
    tc_ent_t *table;
    tc_ent_t *list; /* insertion order */
    size_t count, cap;
} __attribute__((aligned(64))) tc_shard_t;

struct auth_tcache {
    tc_shard_t shards[TCACHE_SHARDS];
};

auth_tcache_t *auth_tcache_new(size_t cap)
{
    auth_tcache_t *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    for (size_t i = 0; i < TCACHE_SHARDS; i++) {
        pthread_mutex_init(&c->shards[i].mu, NULL);
        c->shards[i].cap = SL_MAX((cap + TCACHE_SHARDS - 1) / TCACHE_SHARDS, 1);
    }
    return c;
}

static void tc_remove(tc_shard_t *sh, tc_ent_t *e)
{
    HASH_DEL(sh->table, e);
    DL_DELETE(sh->list, e);
    OPENSSL_cleanse(e->val.signing_key, sizeof(e->val.signing_key));
    OPENSSL_cleanse(e->tok, e->len);
    free(e);
    sh->count--;
}

void auth_tcache_free(auth_tcache_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < TCACHE_SHARDS; i++) {
        tc_shard_t *sh = &c->shards[i];
        tc_ent_t *e, *tmp;
        DL_FOREACH_SAFE(sh->list, e, tmp)
        tc_remove(sh, e);
        pthread_mutex_destroy(&sh->mu);
    }
    free(c);
}

/* The hash reads a token's last 16 bytes only: they are its signature (JWS
 * compact form ends with it), unforgeable bytes that differ between any two
 * tokens that verified, so entries spread as well as with the whole token.
 * Already random, they need no strong hash (uthash's Jenkins over 32 bytes
 * was ~260 instructions a request): two 8-byte loads, one multiply, and the
 * product's high half folded down, since uthash picks buckets with the low
 * bits and tc_shard with the top ones. A lookup's own bytes are
 * attacker-chosen but only ever compared; what sits in the table got there
 * by verifying. Equal bytes still decide a hit. */
#define TCACHE_HASH_TAIL 16

unsigned auth_tcache_hash(const char *tok, size_t len)
{
    if (len < TCACHE_HASH_TAIL) { /* never a token that verifies */
        unsigned h = 0;
        HASH_VALUE(tok, len, h);
        return h;
    }
    uint64_t a, b;
    memcpy(&a, tok + len - 16, 8);
    memcpy(&b, tok + len - 8, 8);
    uint64_t x = (a ^ (b << 29 | b >> 35)) * UINT64_C(0x9e3779b97f4a7c15);
    return (unsigned)(x ^ x >> 32);
}

static tc_shard_t *tc_shard(auth_tcache_t *c, unsigned hash)
{
    /* the top bits: uthash picks buckets with the low ones */
    return &c->shards[(hash >> 24) % TCACHE_SHARDS];
}

bool auth_tcache_get(auth_tcache_t *c, const char *tok, size_t len, unsigned hash, int64_t now,
                     auth_claims_t *claims, char *signing_key, uint64_t *key_id)
{
    if (len > AUTH_TCACHE_TOKEN_MAX)
        return false;
    tc_shard_t *sh = tc_shard(c, hash);
    bool hit = false;
    pthread_mutex_lock(&sh->mu);
    tc_ent_t *e = NULL;
    HASH_FIND_BYHASHVALUE(hh, sh->table, tok, len, hash, e);
    if (e && now < e->expires) {
        *claims = e->val.claims;
        memcpy(signing_key, e->val.signing_key, sizeof(e->val.signing_key));
        if (key_id)
            *key_id = e->val.key_id;
        hit = true;
    } else if (e) {
        tc_remove(sh, e);
    }
    pthread_mutex_unlock(&sh->mu);
    return hit;
}

void auth_tcache_put(auth_tcache_t *c, const char *tok, size_t len, unsigned hash,
                     const auth_tcache_val_t *v, int64_t expires, int64_t now)
{
    if (len > AUTH_TCACHE_TOKEN_MAX)
        return; /* verified every time: entries stay small */
    tc_shard_t *sh = tc_shard(c, hash);
    int oom = 0;
    pthread_mutex_lock(&sh->mu);
    tc_ent_t *e = NULL;
    HASH_FIND_BYHASHVALUE(hh, sh->table, tok, len, hash, e);
    if (e)
        goto out; /* another thread verified the same token meanwhile */
    while (sh->list && (sh->list->expires <= now || sh->count >= sh->cap))
        tc_remove(sh, sh->list);
    if (!(e = malloc(sizeof(*e) + len)))
        goto out;
    memcpy(e->tok, tok, len);
    e->len = len;
    e->expires = expires;
    e->val = *v;
    HASH_ADD_KEYPTR_BYHASHVALUE(hh, sh->table, e->tok, len, hash, e);
    if (oom) {
        OPENSSL_cleanse(e, sizeof(*e) + len);
        free(e);
        goto out;
    }
    DL_APPEND(sh->list, e);
    sh->count++;
out:
    pthread_mutex_unlock(&sh->mu);
}

size_t auth_tcache_count(auth_tcache_t *c)
{
    size_t n = 0;
    for (size_t i = 0; i < TCACHE_SHARDS; i++) {
        pthread_mutex_lock(&c->shards[i].mu);
        n += c->shards[i].count;
        pthread_mutex_unlock(&c->shards[i].mu);
    }
    return n;
}
