/*
 * rl_internal.h — what the files of ratelimit/ share and nothing else sees:
 * the in-process store (mem.c) and the way a decision is put together from
 * per-limit results (the same rules the Redis script follows).
 */
#ifndef SL_RL_INTERNAL_H
#define SL_RL_INTERNAL_H

#include "common/sl.h"
#include "ratelimit/ratelimit.h"

/* Longest key kept as is ("u:" + sub, "i:" + address); longer ones are
 * replaced by "h:" + their SHA-256 in hex, so a huge sub cannot blow up
 * memory or Redis keys. */
#define RL_KEY_MAX 256

/* Refusal for concurrency: no clock says when a slot frees; ask to retry in
 * a second. */
#define RL_CONCURRENT_RETRY_MS 1000

/* A table full of live keys refuses a new key with at least this
 * Retry-After. Before refusing, it looks at the LRU end of every other
 * stripe (trylock: a busy one is skipped) and drops up to this many idle
 * keys from the first that has some. */
#define RL_KEYS_RETRY_MS      1000
#define RL_RECLAIM_PER_STRIPE 4

/* A Redis concurrency lease lives this long unless released: it bounds the
 * damage of an instance that dies holding slots. Longer than any upstream
 * total timeout should be. */
#define RL_LEASE_MS (15 * 60 * 1000)

/* A charge (usage above the reservation) never puts a key more than this
 * many whole periods into debt, so one bogus usage figure cannot lock a
 * user out for years. */
#define RL_MAX_DEBT_PERIODS 4

/* A worker sends the Redis checks and settles of one event-loop turn as one
 * EVALSHA carrying up to this many entries (a busier turn sends several):
 * it bounds a call's size (9 arguments an entry) and the script's run. */
#define RL_BATCH_MAX 64

/* Leased local quotas (docs/ratelimit.md, "Leases"). A key limited by
 * requests alone that has checks of its own waiting for Redis (or more
 * than RL_LEASE_START of them within RL_LEASE_TTL_MS) gets request units
 * ahead of its requests, which the worker spends without a round
 * trip: a lease doubles each time one is spent before its time, up to
 * RL_LEASE_MAX and 1/RL_LEASE_DIVISOR of the limit (so a limit under
 * RL_LEASE_DIVISOR a minute never leases); Redis grants it only while the
 * key's bucket stays at least half full. Units not spent within
 * RL_LEASE_TTL_MS are given back. At most RL_LEASE_KEYS keys per worker;
 * one idle for RL_LEASE_IDLE_MS is forgotten. */
#define RL_LEASE_MAX      64
#define RL_LEASE_DIVISOR  64
#define RL_LEASE_TTL_MS   1000
#define RL_LEASE_SWEEP_MS 250
#define RL_LEASE_KEYS     4096
#define RL_LEASE_IDLE_MS  10000
/* A key leases, even with its checks one at a time, once more than this
 * many of them went to Redis within RL_LEASE_TTL_MS (8 a second): a lease
 * of 1 or 2 units is then spent well before its time. */
#define RL_LEASE_START 8

typedef struct rl_mem rl_mem_t;

rl_mem_t *rl_mem_new(size_t max_keys);
void rl_mem_free(rl_mem_t *m);
/* Keys held now, in the whole table. */
size_t rl_mem_count(const rl_mem_t *m);
/* New keys refused because every key the table holds was live, since start. */
uint64_t rl_mem_refused(const rl_mem_t *m);
/* A new size of the whole table (reload of ratelimit.max_keys); thread-safe.
 * Keys above a smaller cap stay until they are idle; no new key is taken
 * while the table is over it. */
void rl_mem_set_cap(rl_mem_t *m, size_t max_keys);

/* All or nothing: one request (if lim->requests_per_minute), a concurrency
 * slot (if lim->concurrent), `tokens` from each token budget. ip: name the
 * request limit RL_LIMIT_IP_REQUESTS. A key the table does not hold yet,
 * with max_keys live keys in it, is refused with RL_LIMIT_KEYS. *slot tells whether a slot was
 * taken (to give back at settle). */
void rl_mem_check(rl_mem_t *m, const char *key, size_t klen, unsigned hv, const rl_limits_t *lim,
                  bool ip, int64_t tokens, int64_t now, rl_decision_t *d, bool *slot);
/* refund = reserved - used (> 0 gives back, < 0 charges); slot: give the
 * concurrency slot back. */
void rl_mem_settle(rl_mem_t *m, const char *key, size_t klen, unsigned hv, const rl_limits_t *lim,
                   int64_t refund, bool slot, int64_t now);
/* The key's hash (rl_mem_check and rl_mem_settle take it): computed once
 * per ticket, not at both ends. */
unsigned rl_mem_hash(const char *key, size_t klen);

/* Builds "u:<user>" / "i:<ip>" (or the hashed form) into out[RL_KEY_MAX+1];
 * returns its length. */
size_t rl_key_make(char prefix, const char *s, char *out);

#endif
