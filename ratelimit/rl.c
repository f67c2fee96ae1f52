/*
 * rl.c — the limiter: conf -> resolved limits (overrides), the choice of
 * store (in-process, or Redis with on_store_error), tickets that give back
 * what a request took, the metrics, and the 429's headers and body.
 *
 * Redis checks and settles are batched: rl_check() and a settle only queue
 * an entry on the worker and activate its flush event, which runs once the
 * events already due in this turn of the loop have run (the other
 * connections that were readable at the same time) and sends everything
 * queued as ONE EVALSHA of rl_redis.lua.h through common/redis.h (up to
 * RL_BATCH_MAX entries a call). The reply is an array, one element per
 * entry, handed to each check's callback in order. A check's callback
 * runs on the worker's loop, never inside rl_check(); a check cancelled
 * before its batch is sent is dropped (nothing was taken), one cancelled
 * after still waits for its reply so that whatever the script took is
 * given back. The batch shares one deadline: a timeout or a dropped
 * connection sends each of its checks to on_store_error. While the
 * worker's Redis client is not connected, checks do not wait for it:
 * on_store_error decides at once (so "local" serves from the in-process
 * store with no added latency) and Redis is used again as soon as the
 * client has reconnected on its own.
 */
#include "ratelimit/rl_internal.h"

#include <arpa/inet.h>
#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <openssl/rand.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>
#include <utlist.h>

#include "common/log.h"
#include "common/metrics.h"
#include "common/redis.h"
#include "common/spares.h"
#include "conf/conf.h"
#include "ratelimit/rl_redis.lua.h"

typedef struct rl_override {
    UT_hash_handle hh;
    rl_limits_t limits;
    char name[];
} rl_override_t;

enum { MODE_REDIS = 0, MODE_DEGRADED, MODE_N };

/* The limits: per runtime in the gateway (rl_policy_new on each reload). */
struct rl_policy {
    rl_limits_t per_user, per_ip;
    int on_store_error;
    bool leases; /* ratelimit.redis_leases */
    rl_override_t *overrides;
    rl_proxies_t *proxies;
};

/* The state and its stores: one per process, across reloads. */
struct rl {
    rl_policy_t *policy; /* rl_new's own: for checks that name none */
    rl_mem_t *mem;
    int64_t (*now_ns)(void *);
    void *now_arg;
    char *redis_url;
    int64_t redis_timeout_ms;
    sl_redis_script_t *script;
    char instance[17]; /* random: makes lease ids unique across instances */
    _Atomic uint64_t lease_seq;
    sl_mseries_t *limited[RL_LIMIT_COUNT];
    sl_mseries_t *store_err[3]; /* by on_store_error action */
    sl_mseries_t *mode[MODE_N];
    sl_mseries_t *decided[2]; /* request checks of Redis limits: by a script run, by a lease */
};

typedef enum { RL_BACKEND_NONE = 0, RL_BACKEND_MEM, RL_BACKEND_REDIS } rl_backend_t;

struct rl_ticket {
    rl_t *rl;
    rl_worker_t *w;
    rl_backend_t backend;
    int on_store_error; /* the policy's, copied: a ticket may outlive its policy */
    rl_limits_t lim;
    int64_t reserved;
    bool slot;
    bool ip;
    char lease[48];
    unsigned hv; /* rl_mem_hash(key): set by the in-process check, used at settle */
    size_t klen;
    char key[RL_KEY_MAX + 1];
};

/* One entry of a batch: a check (cb set) or a settle (cb NULL). */
struct rl_pending {
    rl_pending_t *prev, *next; /* in w->queue until sent, or a lease's waiters */
    rl_worker_t *w;
    rl_check_cb cb;
    void *arg;
    rl_ticket_t *ticket; /* owned: a check's prepared ticket (key, limits, lease), or the
                            settled ticket */
    int64_t n;           /* check: tokens to reserve; settle: the refund; return: units */
    int64_t want;        /* check: request units to lease on top; -1: the key has no lease entry */
    char op;             /* 'c' check, 's' settle, 'r' give leased units back */
    bool refill;         /* a check made for a lease, not a request: its unit joins the lease */
    bool reparked;       /* waited for a second lease ask: the next miss goes to Redis */
    bool cancelled;
};

/* One EVALSHA in flight: its entries, in the order of the reply's array. */
typedef struct rl_batch rl_batch_t;
struct rl_batch {
    rl_batch_t *prev, *next; /* in w->batches */
    rl_worker_t *w;
    size_t n;
    rl_pending_t *p[RL_BATCH_MAX]; /* owned */
};

/* Room for one entry's keys and numbers while its batch is formatted. */
typedef struct rl_entry_buf {
    char k1[RL_KEY_MAX + 16], k2[RL_KEY_MAX + 16];
    char num[6][24];
} rl_entry_buf_t;

#define RL_BATCH_ARGC (RL_BATCH_MAX * 10 + 1)

/* A leased local quota (docs/ratelimit.md, "Leases"): request units of one
 * key this worker took from Redis ahead of its requests and spends without
 * a round trip. Only for keys limited by requests alone (no concurrency,
 * no token reservation in play). */
typedef struct rl_lease {
    UT_hash_handle hh;
    int64_t units;      /* taken, not spent yet */
    int64_t size;       /* what the next check asks for on top of its own unit (0: none) */
    int64_t granted_ns; /* when the units came */
    int64_t remaining;  /* Redis's remaining then (the leased units excluded) */
    int64_t reset_ms;   /* and its reset */
    int64_t last_ns;    /* last check of the key: an idle entry is dropped */
    int64_t win_ns;     /* checks sent to Redis since then (RL_LEASE_START) */
    int64_t win_n;
    int inflight;             /* checks of the key queued or waiting for Redis */
    bool asking;              /* one of them asks for a lease */
    int64_t ask_rpm;          /* the limit it asks under: a check under the same one may wait */
    rl_pending_t *ask_queued; /* the ask while it is not sent: a waiter adds to it */
    rl_pending_t *waiters;    /* checks that found no unit while the ask was out */
    bool ip;
    rl_limits_t lim; /* the limits of the grant: spent only under the same rpm */
    char key[RL_KEY_MAX + 1];
} rl_lease_t;

struct rl_worker {
    rl_t *rl;
    sl_redis_t *redis;
    rl_pending_t *queue; /* entries not sent yet, in order */
    rl_batch_t *batches; /* sent, awaiting their reply */
    struct event *flush_ev;
    struct event *lease_ev; /* gives back units of leases past their time */
    rl_lease_t *leases;     /* by key */
    size_t nleases;
    int mode; /* MODE_*, -1 before the first look */
    /* scratch of rl_batch_send (one batch at a time: the loop's thread) */
    const char *argv[RL_BATCH_ARGC];
    size_t argvlen[RL_BATCH_ARGC];
    rl_entry_buf_t buf[RL_BATCH_MAX];
    /* Tickets given back, for the next checks (rl_ticket_get): a check and
     * its settle then cost no malloc and free, which at a few dozen
     * requests in flight overflow glibc's per-size cache (7) and reach its
     * bins. Bounded; the worker's own thread only. */
    sl_spares_t spares;
};

static const char *const rl_limit_names[RL_LIMIT_COUNT] = {
    "none",           "requests_per_minute",    "concurrent",        "tokens_per_minute",
    "tokens_per_day", "ip_requests_per_minute", "store_unavailable", "max_keys"};
static const char *const rl_action_names[3] = {"allow", "deny", "local"};

const char *rl_limit_name(rl_limit_t l)
{
    return (unsigned)l < RL_LIMIT_COUNT ? rl_limit_names[l] : "unknown";
}

static int64_t rl_default_clock(void *arg)
{
    (void)arg;
    return sl_now_ns();
}

static void rl_limits_from_conf(const conf_rl_limits_t *c, rl_limits_t *l)
{
    l->requests_per_minute = c->requests_per_minute;
    l->concurrent = c->concurrent;
    l->tokens_per_minute = c->tokens_per_minute;
    l->tokens_per_day = c->tokens_per_day;
}

/* ---- construction ------------------------------------------------------------- */

rl_policy_t *rl_policy_new(const struct conf_ratelimit *c, char *err, size_t errlen)
{
    rl_policy_t *p = sl_xcalloc(1, sizeof(*p));
    rl_limits_from_conf(&c->per_user, &p->per_user);
    p->per_ip.requests_per_minute = c->per_ip.requests_per_minute;
    p->on_store_error = c->on_store_error;
    p->leases = c->redis_leases;
    for (size_t i = 0; i < c->noverrides; i++) {
        const conf_rl_override_t *o = &c->overrides[i];
        size_t n = strlen(o->name);
        rl_override_t *e = sl_xcalloc(1, sizeof(*e) + n + 1);
        memcpy(e->name, o->name, n + 1);
        /* -1 = not set in the override: per_user's value */
        const int64_t *src = &o->limits.requests_per_minute;
        const int64_t *dflt = &p->per_user.requests_per_minute;
        int64_t *dst = &e->limits.requests_per_minute;
        for (int k = 0; k < 4; k++)
            dst[k] = src[k] >= 0 ? src[k] : dflt[k];
        rl_override_t *dup = NULL;
        HASH_FIND(hh, p->overrides, e->name, n, dup);
        if (dup) {
            snprintf(err, errlen, "ratelimit.overrides: \"%s\" twice", o->name);
            free(e);
            rl_policy_free(p);
            return NULL;
        }
        HASH_ADD_KEYPTR(hh, p->overrides, e->name, n, e);
    }
    p->proxies =
        rl_proxies_new((const char *const *)c->trusted_proxies, c->ntrusted_proxies, err, errlen);
    if (!p->proxies) {
        rl_policy_free(p);
        return NULL;
    }
    return p;
}

void rl_policy_free(rl_policy_t *p)
{
    if (!p)
        return;
    rl_override_t *o, *tmp;
    HASH_ITER(hh, p->overrides, o, tmp)
    {
        HASH_DEL(p->overrides, o);
        free(o);
    }
    rl_proxies_free(p->proxies);
    free(p);
}

rl_t *rl_new(const struct conf_ratelimit *c, const struct conf_redis *redis, char *err,
             size_t errlen)
{
    rl_t *rl = sl_xcalloc(1, sizeof(*rl));
    rl->now_ns = rl_default_clock;
    rl->policy = rl_policy_new(c, err, errlen);
    if (!rl->policy) {
        rl_free(rl);
        return NULL;
    }
    rl->mem = rl_mem_new(c->max_keys > 0 ? (size_t)c->max_keys : 100000);
    if (!rl->mem) {
        snprintf(err, errlen, "out of memory");
        rl_free(rl);
        return NULL;
    }
    if (redis && redis->url) {
        if (sl_redis_url_check(redis->url, err, errlen) != 0) {
            rl_free(rl);
            return NULL;
        }
        rl->redis_url = sl_xstrdup(redis->url);
        rl->redis_timeout_ms = redis->timeout_ms > 0 ? redis->timeout_ms : 50;
        rl->script = sl_redis_script_new(rl_redis_lua);
        if (!rl->script) {
            snprintf(err, errlen, "out of memory");
            rl_free(rl);
            return NULL;
        }
    }
    unsigned char rnd[8];
    if (RAND_bytes(rnd, sizeof(rnd)) != 1) {
        uint64_t x = (uint64_t)sl_now_ns() ^ (uint64_t)(uintptr_t)rl;
        memcpy(rnd, &x, sizeof(rnd));
    }
    sl_hex(rnd, sizeof(rnd), rl->instance);

    sl_metric_t *m = sl_metric_register("sluice_ratelimited_total",
                                        "Requests refused by a rate limit, by the limit hit.",
                                        SL_METRIC_COUNTER, "limit", NULL, 0);
    for (int i = 1; i < RL_LIMIT_COUNT; i++)
        rl->limited[i] = sl_metric_series1(m, rl_limit_names[i]);
    m = sl_metric_register("sluice_ratelimit_store_errors_total",
                           "Rate-limit decisions made without Redis (down or past its "
                           "deadline), by the on_store_error action taken.",
                           SL_METRIC_COUNTER, "action", NULL, 0);
    for (int i = 0; i < 3; i++)
        rl->store_err[i] = sl_metric_series1(m, rl_action_names[i]);
    m = sl_metric_register("sluice_ratelimit_redis_mode",
                           "Worker threads whose rate limits use Redis (redis) or, with Redis "
                           "unreachable, on_store_error (degraded).",
                           SL_METRIC_GAUGE, "mode", NULL, 0);
    rl->mode[MODE_REDIS] = sl_metric_series1(m, "redis");
    rl->mode[MODE_DEGRADED] = sl_metric_series1(m, "degraded");
    m = sl_metric_register("sluice_ratelimit_redis_checks_total",
                           "Requests checked against Redis-backed limits, by what decided them: "
                           "a script run (redis) or a unit leased ahead (lease).",
                           SL_METRIC_COUNTER, "by", NULL, 0);
    rl->decided[0] = sl_metric_series1(m, "redis");
    rl->decided[1] = sl_metric_series1(m, "lease");
    return rl;
}

void rl_free(rl_t *rl)
{
    if (!rl)
        return;
    rl_policy_free(rl->policy);
    rl_mem_free(rl->mem);
    sl_redis_script_free(rl->script);
    free(rl->redis_url);
    free(rl);
}

void rl_set_clock(rl_t *rl, int64_t (*now_ns)(void *arg), void *arg)
{
    rl->now_ns = now_ns ? now_ns : rl_default_clock;
    rl->now_arg = arg;
}

const rl_proxies_t *rl_trusted_proxies(const rl_t *rl)
{
    return rl->policy->proxies;
}

const rl_proxies_t *rl_policy_trusted_proxies(const rl_policy_t *p)
{
    return p->proxies;
}

void rl_set_max_keys(rl_t *rl, int64_t max_keys)
{
    rl_mem_set_cap(rl->mem, max_keys > 0 ? (size_t)max_keys : 100000);
}

size_t rl_mem_keys(const rl_t *rl)
{
    return rl_mem_count(rl->mem);
}

uint64_t rl_mem_keys_refused(const rl_t *rl)
{
    return rl_mem_refused(rl->mem);
}

void rl_policy_limits_for(const rl_policy_t *p, const char *user, const char *client,
                          rl_limits_t *out)
{
    if (!user) {
        *out = p->per_ip;
        return;
    }
    rl_override_t *o = NULL;
    HASH_FIND_STR(p->overrides, user, o);
    if (!o && client) {
        char k[RL_KEY_MAX + 8];
        int n = snprintf(k, sizeof(k), "client:%s", client);
        if (n > 0 && (size_t)n < sizeof(k))
            HASH_FIND(hh, p->overrides, k, (size_t)n, o);
    }
    *out = o ? o->limits : p->per_user;
}

void rl_limits_for(const rl_t *rl, const char *user, const char *client, rl_limits_t *out)
{
    rl_policy_limits_for(rl->policy, user, client, out);
}

/* ---- workers -------------------------------------------------------------------- */

static void rl_worker_mode(rl_worker_t *w)
{
    if (!w->redis)
        return;
    int mode = sl_redis_connected(w->redis) ? MODE_REDIS : MODE_DEGRADED;
    if (mode == w->mode)
        return;
    if (w->mode >= 0)
        sl_gauge_add(w->rl->mode[w->mode], -1);
    sl_gauge_add(w->rl->mode[mode], 1);
    w->mode = mode;
}

/* sl_redis tells each change of its connection: the gauge follows
 * reconnects and losses at once, with or without traffic. */
static void rl_redis_state_cb(void *arg)
{
    rl_worker_mode(arg);
}

static void rl_flush_cb(evutil_socket_t fd, short what, void *arg);
static void rl_lease_sweep_cb(evutil_socket_t fd, short what, void *arg);

rl_worker_t *rl_worker_new(rl_t *rl, struct event_base *base, char *err, size_t errlen)
{
    rl_worker_t *w = calloc(1, sizeof(*w));
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    w->rl = rl;
    w->mode = -1;
    if (rl->redis_url) {
        sl_redis_opts_t o = {.url = rl->redis_url,
                             .timeout_ms = rl->redis_timeout_ms,
                             .on_state = rl_redis_state_cb,
                             .state_arg = w};
        w->redis = sl_redis_new(base, &o, err, errlen);
        w->flush_ev = event_new(base, -1, 0, rl_flush_cb, w);
        w->lease_ev = event_new(base, -1, EV_PERSIST, rl_lease_sweep_cb, w);
        struct timeval ltv = {0, RL_LEASE_SWEEP_MS * 1000};
        if (!w->redis || !w->flush_ev || !w->lease_ev || event_add(w->lease_ev, &ltv) != 0) {
            rl_worker_free(w);
            return NULL;
        }
        rl_worker_mode(w);
    }
    return w;
}

void rl_worker_free(rl_worker_t *w)
{
    if (!w)
        return;
    sl_redis_free(w->redis); /* drops pending calls without callbacks */
    rl_pending_t *p, *tmp;
    DL_FOREACH_SAFE(w->queue, p, tmp)
    {
        DL_DELETE(w->queue, p);
        free(p->ticket);
        free(p);
    }
    rl_batch_t *b, *btmp;
    DL_FOREACH_SAFE(w->batches, b, btmp)
    {
        DL_DELETE(w->batches, b);
        for (size_t i = 0; i < b->n; i++) {
            free(b->p[i]->ticket);
            free(b->p[i]);
        }
        free(b);
    }
    if (w->flush_ev)
        event_free(w->flush_ev);
    if (w->lease_ev)
        event_free(w->lease_ev);
    /* units still leased are not given back: they count as spent until
     * the key's bucket refills (the safe side) */
    rl_lease_t *l, *ltmp;
    HASH_ITER(hh, w->leases, l, ltmp)
    {
        DL_FOREACH_SAFE(l->waiters, p, tmp) /* no callbacks, as for the queue */
        {
            DL_DELETE(l->waiters, p);
            free(p->ticket);
            free(p);
        }
        HASH_DEL(w->leases, l);
        free(l);
    }
    if (w->mode >= 0)
        sl_gauge_add(w->rl->mode[w->mode], -1);
    sl_spares_free(&w->spares);
    free(w);
}

bool rl_worker_redis_up(const rl_worker_t *w)
{
    return w && w->redis && sl_redis_connected(w->redis);
}

/* ---- checks ----------------------------------------------------------------------- */

/* A zeroed ticket of w's (the key bytes past klen excepted: nothing reads
 * them), from its spares when it has one. NULL on OOM. */
static rl_ticket_t *rl_ticket_get(rl_worker_t *w)
{
    rl_ticket_t *t = sl_spares_take(&w->spares);
    if (!t)
        return sl_zalloc(sizeof(rl_ticket_t));
    memset(t, 0, offsetof(rl_ticket_t, key));
    t->key[0] = '\0';
    return t;
}

/* Frees t, or keeps it among its worker's spares. t's worker is alive: a
 * ticket is settled or released on its worker's loop before
 * rl_worker_free (the gateway ends its requests first). */
static void rl_ticket_put(rl_ticket_t *t)
{
    rl_worker_t *w = t->w;
    if (!w || !sl_spares_keep(&w->spares, t))
        free(t);
}

static bool rl_limits_any(const rl_limits_t *l, int64_t tokens)
{
    return l->requests_per_minute > 0 || l->concurrent > 0 ||
           (tokens > 0 && (l->tokens_per_minute > 0 || l->tokens_per_day > 0));
}

static void rl_count_refusal(rl_t *rl, const rl_decision_t *d)
{
    if (!d->allowed && d->limit > RL_LIMIT_NONE && d->limit < RL_LIMIT_COUNT)
        sl_counter_add(rl->limited[d->limit], 1);
}

static void rl_check_mem(rl_t *rl, rl_ticket_t *t, int64_t tokens, rl_decision_t *d)
{
    t->hv = rl_mem_hash(t->key, t->klen);
    rl_mem_check(rl->mem, t->key, t->klen, t->hv, &t->lim, t->ip, tokens, rl->now_ns(rl->now_arg),
                 d, &t->slot);
    t->backend = RL_BACKEND_MEM;
    t->reserved = d->allowed ? tokens : 0;
}

/* Redis could not answer: on_store_error decides. */
SL_COLD static void rl_store_error(rl_t *rl, rl_ticket_t *t, int64_t tokens, rl_decision_t *d)
{
    sl_counter_add(rl->store_err[t->on_store_error], 1);
    memset(d, 0, sizeof(*d));
    switch (t->on_store_error) {
    case CONF_STORE_ERROR_LOCAL:
        rl_check_mem(rl, t, tokens, d);
        break;
    case CONF_STORE_ERROR_DENY:
        d->allowed = false;
        d->limit = RL_LIMIT_STORE;
        d->retry_after_ms = 1000;
        t->backend = RL_BACKEND_NONE;
        break;
    default:
        d->allowed = true;
        t->backend = RL_BACKEND_NONE;
        break;
    }
    d->store_error = true;
}

/* ---- leased local quotas ------------------------------------------------------ */

static int64_t rl_lease_cap(const rl_limits_t *lim)
{
    return SL_MIN((int64_t)RL_LEASE_MAX, lim->requests_per_minute / RL_LEASE_DIVISOR);
}

/* A key whose limits a lease can serve: requests alone. A concurrency slot
 * must be held in Redis (it is given back per request), and a token
 * reservation differs per request. */
static bool rl_lease_eligible(const rl_ticket_t *t, int64_t tokens)
{
    return t->lim.concurrent == 0 && rl_lease_cap(&t->lim) >= 1 &&
           (tokens == 0 || (t->lim.tokens_per_minute == 0 && t->lim.tokens_per_day == 0));
}

static rl_lease_t *rl_lease_find(rl_worker_t *w, const char *key, size_t klen)
{
    rl_lease_t *l = NULL;
    HASH_FIND(hh, w->leases, key, klen, l);
    return l;
}

static void rl_enqueue(rl_worker_t *w, rl_pending_t *p);

/* A Redis call of the lease's own (no request behind it): a ticket for its
 * key and limits, op 'r' (give back) or 'c' (ask). NULL on OOM. */
static rl_pending_t *rl_lease_call(rl_worker_t *w, const rl_lease_t *l, char op)
{
    rl_pending_t *p = sl_zalloc(sizeof(*p));
    rl_ticket_t *t = sl_zalloc(sizeof(*t));
    if (!p || !t) {
        free(p);
        free(t);
        return NULL;
    }
    t->rl = w->rl;
    t->w = w;
    t->lim = l->lim;
    t->ip = l->ip;
    t->klen = strlen(l->key);
    memcpy(t->key, l->key, t->klen + 1);
    p->w = w;
    p->ticket = t;
    p->op = op;
    return p;
}

/* Gives a lease's unspent units back to Redis (with this turn's batch). */
static void rl_lease_give_back(rl_worker_t *w, rl_lease_t *l)
{
    int64_t units = l->units;
    l->units = 0;
    if (units <= 0)
        return;
    rl_pending_t *p = rl_lease_call(w, l, 'r');
    if (!p)
        return; /* lost: they count as spent (the safe side) */
    p->n = units;
    p->want = -1;
    rl_enqueue(w, p);
}

/* A leased unit for this request, if the worker holds one: decided here,
 * no round trip. */
static bool rl_lease_spend(rl_lease_t *l, const rl_ticket_t *t, int64_t now, rl_decision_t *d)
{
    if (l->units <= 0 || l->lim.requests_per_minute != t->lim.requests_per_minute ||
        now - l->granted_ns >= (int64_t)RL_LEASE_TTL_MS * 1000000)
        return false;
    l->units--;
    l->last_ns = now;
    memset(d, 0, sizeof(*d));
    d->allowed = true;
    d->limit = t->ip ? RL_LIMIT_IP_REQUESTS : RL_LIMIT_REQUESTS;
    d->limit_value = l->lim.requests_per_minute;
    /* Redis's remaining at the grant plus what this worker still holds: an
     * estimate (others' spending since is not seen) */
    d->remaining = SL_MIN(l->remaining + l->units, l->lim.requests_per_minute);
    d->reset_ms = SL_MAX(l->reset_ms - (now - l->granted_ns) / 1000000, 0);
    return true;
}

/* A check of the lease's own (no request behind it) asks for `want` units;
 * its own unit joins them. Checks that find no unit meanwhile wait for it
 * (rl_lease_wait). false on OOM. */
static bool rl_lease_ask(rl_worker_t *w, rl_lease_t *l, int64_t want)
{
    rl_pending_t *p = rl_lease_call(w, l, 'c');
    if (!p)
        return false;
    p->refill = true;
    p->want = want;
    l->asking = true;
    l->ask_rpm = l->lim.requests_per_minute;
    l->ask_queued = p;
    l->inflight++;
    rl_enqueue(w, p);
    return true;
}

/* The lease is half spent: ask for the next one while this one still
 * serves, so that a busy key need not wait a round trip. Spent fast
 * (within a quarter of its time), the lease grows. */
static void rl_lease_refill(rl_worker_t *w, rl_lease_t *l, int64_t now)
{
    if (l->asking || l->size == 0 || l->units >= (l->size + 1) / 2)
        return;
    if (now - l->granted_ns < (int64_t)RL_LEASE_TTL_MS * 1000000 / 4)
        l->size = SL_MIN(l->size * 2, rl_lease_cap(&l->lim));
    (void)rl_lease_ask(w, l, l->size);
}

/* Before a check of an eligible key goes to Redis: how many units it asks
 * for on top of its own. The size grows while checks of the key queue up
 * behind each other, a lease runs out before its time, or more than
 * RL_LEASE_START checks of the key went to Redis within the lease time
 * (busy even if they come one at a time: how busy a key is counts, not
 * how its requests fall against the round trip). */
static int64_t rl_lease_want(rl_worker_t *w, const rl_ticket_t *t, int64_t now)
{
    rl_lease_t *l = rl_lease_find(w, t->key, t->klen);
    if (!l) {
        if (w->nleases >= RL_LEASE_KEYS)
            return -1; /* no entry: no lease for this key for now */
        l = calloc(1, sizeof(*l));
        if (!l)
            return -1;
        memcpy(l->key, t->key, t->klen + 1);
        HASH_ADD(hh, w->leases, key, t->klen, l);
        w->nleases++;
    }
    l->last_ns = now;
    int64_t cap = rl_lease_cap(&t->lim);
    bool ran_out =
        l->granted_ns && l->units == 0 && now - l->granted_ns < (int64_t)RL_LEASE_TTL_MS * 1000000;
    if (now - l->win_ns >= (int64_t)RL_LEASE_TTL_MS * 1000000) {
        l->win_ns = now;
        l->win_n = 0;
    }
    bool busy = ++l->win_n > RL_LEASE_START;
    if (l->inflight > 0 || ran_out || busy)
        l->size = SL_MIN(SL_MAX(l->size * 2, 1), cap);
    l->size = SL_MIN(l->size, cap);
    l->inflight++;
    if (l->asking || l->size == 0)
        return 0; /* one lease request in flight per key */
    l->asking = true;
    l->ask_rpm = t->lim.requests_per_minute;
    return l->size;
}

/* A check that found no unit while the key's lease ask is out waits for
 * that ask instead of making a Redis call of its own: how many calls a
 * busy key makes then depends on how many requests it has, not on how
 * they fall against the round trip (docs/ratelimit.md, "Leases"). Only
 * under the limit the ask is made under (a reload changes it). */
static bool rl_lease_wait(const rl_lease_t *l, const rl_ticket_t *t)
{
    return l->asking && l->ask_rpm == t->lim.requests_per_minute;
}

/* Answers a check that is not a Redis entry (a waiter): counts a refusal,
 * hands the ticket over (or frees it), frees p. */
static void rl_pending_answer(rl_pending_t *p, const rl_decision_t *d)
{
    rl_ticket_t *t = p->ticket;
    rl_count_refusal(p->w->rl, d);
    if (!d->allowed) {
        free(t);
        t = NULL;
    }
    rl_check_cb cb = p->cb;
    void *cbarg = p->arg;
    free(p);
    cb(cbarg, d, t);
}

/* How the waiters of an ask that is over are answered when the lease
 * cannot serve them all. */
typedef enum {
    RL_WAIT_FAILED, /* Redis did not answer: on_store_error decides, as for the ask */
    RL_WAIT_SEND,   /* the lease was refused or the ask never sent: each goes to Redis */
    RL_WAIT_REASK,  /* granted but too small: one ask for all of them */
} rl_wait_end_t;

/* The key's lease ask is over: its waiters spend the units it brought, in
 * the order they came. Those left over wait once more, for one ask sized
 * to cover them (answered in the round trip their own Redis checks would
 * have taken); after that, or when the lease was refused, they go to
 * Redis one entry each, in this turn's batch. Callbacks run here: on the
 * loop, never inside rl_check(). */
static void rl_lease_serve(rl_worker_t *w, rl_lease_t *l, rl_wait_end_t how)
{
    rl_t *rl = w->rl;
    int64_t now = rl->now_ns(rl->now_arg);
    rl_pending_t *list = l->waiters, *miss = NULL, *p, *tmp;
    int64_t nmiss = 0;
    l->waiters = NULL; /* a callback's new check may wait anew */
    DL_FOREACH_SAFE(list, p, tmp)
    {
        DL_DELETE(list, p);
        rl_decision_t d;
        if (p->cancelled) { /* nothing was taken for it */
            free(p->ticket);
            free(p);
        } else if (how != RL_WAIT_FAILED && rl_lease_spend(l, p->ticket, now, &d)) {
            p->ticket->backend = RL_BACKEND_NONE;
            sl_counter_add(rl->decided[1], 1);
            rl_pending_answer(p, &d);
        } else {
            DL_APPEND(miss, p);
            if (!p->reparked)
                nmiss++;
        }
    }
    if (!miss) {
        rl_lease_refill(w, l, now);
        return;
    }
    if (how == RL_WAIT_REASK && nmiss > 0 && l->size > 0 && !l->asking) {
        /* the requests outran the lease: it grows, and this ask covers them */
        l->size = SL_MIN(l->size * 2, rl_lease_cap(&l->lim));
        int64_t want = SL_MIN(l->size + nmiss, l->lim.requests_per_minute / RL_LEASE_DIVISOR);
        if (rl_lease_ask(w, l, want)) {
            DL_FOREACH_SAFE(miss, p, tmp)
            {
                if (!p->reparked && rl_lease_wait(l, p->ticket)) {
                    DL_DELETE(miss, p);
                    p->reparked = true;
                    DL_APPEND(l->waiters, p);
                }
            }
        }
    }
    DL_FOREACH_SAFE(miss, p, tmp)
    {
        DL_DELETE(miss, p);
        if (how == RL_WAIT_FAILED) {
            rl_decision_t d;
            rl_store_error(rl, p->ticket, p->n, &d);
            rl_pending_answer(p, &d);
        } else {
            p->want = rl_lease_want(w, p->ticket, now);
            if (p->want > 0)
                l->ask_queued = p;
            rl_enqueue(w, p);
        }
    }
}

/* A check of an eligible key is over (d NULL: Redis did not answer, or,
 * sent false, the check was cancelled before its batch went out): the
 * lease entry learns what Redis granted, and when the check was the key's
 * lease ask, the checks waiting for it are answered. */
static void rl_lease_reply(rl_worker_t *w, const rl_pending_t *p, const rl_decision_t *d,
                           int64_t leased, bool sent)
{
    const rl_ticket_t *t = p->ticket;
    rl_lease_t *l = rl_lease_find(w, t->key, t->klen);
    if (!l)
        return;
    if (l->inflight > 0)
        l->inflight--;
    bool ask = p->want > 0;
    if (ask)
        l->asking = false;
    if (l->ask_queued == p)
        l->ask_queued = NULL;
    rl_wait_end_t how = RL_WAIT_SEND;
    if (!d) {
        how = sent ? RL_WAIT_FAILED : RL_WAIT_SEND;
    } else if (!d->allowed) {
        l->size = 0; /* near the limit: every check goes to Redis */
    } else if (leased > 0 || p->refill) {
        int64_t units = leased + (p->refill ? 1 : 0); /* a refill's own unit joins */
        if (l->units > 0 && l->lim.requests_per_minute != t->lim.requests_per_minute)
            rl_lease_give_back(w, l); /* taken under other limits (a reload) */
        int64_t now = w->rl->now_ns(w->rl->now_arg);
        l->units += units;
        l->lim = t->lim;
        l->ip = t->ip;
        l->granted_ns = now;
        l->remaining = d->remaining;
        l->reset_ms = d->reset_ms;
        if (leased > 0)
            how = RL_WAIT_REASK;
    }
    if (ask && l->waiters)
        rl_lease_serve(w, l, how);
}

static void rl_lease_sweep_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    rl_worker_t *w = arg;
    int64_t now = w->rl->now_ns(w->rl->now_arg);
    rl_lease_t *l, *tmp;
    HASH_ITER(hh, w->leases, l, tmp)
    {
        if (l->units > 0 && now - l->granted_ns >= (int64_t)RL_LEASE_TTL_MS * 1000000) {
            if (l->units > l->size / 2)
                l->size /= 2; /* more than needed: ask for less */
            rl_lease_give_back(w, l);
        }
        if (l->units == 0 && l->inflight == 0 && !l->waiters &&
            now - l->last_ns >= (int64_t)RL_LEASE_IDLE_MS * 1000000) {
            HASH_DEL(w->leases, l);
            w->nleases--;
            free(l);
        }
    }
}

/* Formats entry i of a batch (p: a check or a settle) into w->buf[i] and
 * its slots of w->argv: keys at 2i, 2i+1; arguments after the n entries'
 * keys and the lease ms. */
static void rl_entry_format(rl_worker_t *w, size_t i, size_t n, const rl_pending_t *p)
{
    const rl_ticket_t *t = p->ticket;
    rl_entry_buf_t *b = &w->buf[i];
    int l1 = snprintf(b->k1, sizeof(b->k1), "sl:rl:{%s}", t->key);
    int l2 = snprintf(b->k2, sizeof(b->k2), "sl:rl:{%s}:c", t->key);
    w->argv[2 * i] = b->k1;
    w->argvlen[2 * i] = (size_t)l1;
    w->argv[2 * i + 1] = b->k2;
    w->argvlen[2 * i + 1] = (size_t)l2;
    const int64_t v[5] = {t->lim.requests_per_minute, t->lim.concurrent, t->lim.tokens_per_minute,
                          t->lim.tokens_per_day, p->n};
    size_t a = 2 * n + 1 + 8 * i;
    w->argv[a] = p->op == 'c' ? "c" : p->op == 'r' ? "r" : "s";
    w->argvlen[a] = 1;
    for (int k = 0; k < 5; k++) {
        w->argvlen[a + 1 + (size_t)k] = sl_i64toa(v[k], b->num[k]);
        w->argv[a + 1 + (size_t)k] = b->num[k];
    }
    w->argv[a + 6] = t->lease;
    w->argvlen[a + 6] = strlen(t->lease);
    w->argvlen[a + 7] = sl_i64toa(p->want > 0 ? p->want : 0, b->num[5]);
    w->argv[a + 7] = b->num[5];
}

static int rl_reply_decision(const redisReply *r, rl_ticket_t *t, rl_decision_t *d, int64_t *leased)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 7)
        return -1;
    for (size_t i = 0; i < 7; i++)
        if (r->element[i]->type != REDIS_REPLY_INTEGER)
            return -1;
    static const rl_limit_t which[5] = {RL_LIMIT_NONE, RL_LIMIT_REQUESTS, RL_LIMIT_TOKENS_MINUTE,
                                        RL_LIMIT_TOKENS_DAY, RL_LIMIT_CONCURRENT};
    long long w = r->element[1]->integer;
    if (w < 0 || w > 4)
        return -1;
    memset(d, 0, sizeof(*d));
    d->allowed = r->element[0]->integer == 1;
    d->limit = which[w];
    if (d->limit == RL_LIMIT_REQUESTS && t->ip)
        d->limit = RL_LIMIT_IP_REQUESTS;
    d->retry_after_ms = r->element[2]->integer;
    d->limit_value = r->element[3]->integer;
    d->remaining = r->element[4]->integer;
    d->reset_ms = r->element[5]->integer;
    *leased = r->element[6]->integer > 0 ? r->element[6]->integer : 0;
    t->slot = d->allowed && t->lim.concurrent > 0;
    return 0;
}

/* The end of one entry: e is its element of the batch's reply, NULL when
 * the whole call failed (down, deadline, a reply of the wrong shape).
 * Frees p; runs a check's callback. */
static void rl_entry_end(rl_pending_t *p, const redisReply *e)
{
    rl_worker_t *w = p->w;
    rl_t *rl = w->rl;
    rl_ticket_t *t = p->ticket;
    if (p->op != 'c') { /* a settle or a return: nobody waits for it */
        if (!e || e->type == REDIS_REPLY_ERROR)
            sl_debug("ratelimit: a Redis settle was lost (%s)",
                     e && e->str ? e->str : "down or late");
        free(t);
        free(p);
        return;
    }
    rl_decision_t d;
    int64_t leased = 0;
    bool ok = e && rl_reply_decision(e, t, &d, &leased) == 0;
    if (p->refill) {
        rl_lease_reply(w, p, ok ? &d : NULL, leased, true);
        free(t);
        free(p);
        return;
    }
    if (ok)
        sl_counter_add(rl->decided[0], 1);
    if (p->want >= 0)
        rl_lease_reply(w, p, ok ? &d : NULL, leased, true);
    if (e && !ok)
        sl_log_limited(SL_LOG_WARN, "ratelimit redis reply",
                       "ratelimit: unexpected Redis reply (%s)",
                       e->type == REDIS_REPLY_ERROR && e->str ? e->str : "shape");
    if (ok) {
        t->backend = RL_BACKEND_REDIS;
        t->reserved = d.allowed ? p->n : 0;
    }
    if (p->cancelled) {
        if (ok && d.allowed) /* give back what the script took */
            rl_ticket_release(t);
        else
            free(t);
        free(p);
        return;
    }
    if (!ok)
        rl_store_error(rl, t, p->n, &d);
    rl_count_refusal(rl, &d);
    if (!d.allowed) {
        free(t);
        t = NULL;
    }
    rl_check_cb cb = p->cb;
    void *cbarg = p->arg;
    free(p);
    cb(cbarg, &d, t);
}

static void rl_batch_cb(void *arg, sl_redis_status_t st, struct redisReply *reply)
{
    rl_batch_t *b = arg;
    DL_DELETE(b->w->batches, b);
    bool shape =
        st == SL_REDIS_OK && reply && reply->type == REDIS_REPLY_ARRAY && reply->elements == b->n;
    if (st == SL_REDIS_OK && !shape)
        sl_log_limited(
            SL_LOG_WARN, "ratelimit redis reply", "ratelimit: unexpected Redis reply (%s)",
            reply && reply->type == REDIS_REPLY_ERROR && reply->str ? reply->str : "shape");
    /* A callback may queue new entries (a settle, the next request's
     * check) or cancel a later entry of this batch: neither touches b. */
    for (size_t i = 0; i < b->n; i++)
        rl_entry_end(b->p[i], shape ? reply->element[i] : NULL);
    free(b);
}

/* Sends up to RL_BATCH_MAX queued entries as one EVALSHA. */
static void rl_batch_send(rl_worker_t *w)
{
    rl_batch_t *b = malloc(sizeof(*b));
    size_t n = 0;
    rl_pending_t *failed[RL_BATCH_MAX];
    while (w->queue && n < RL_BATCH_MAX) {
        rl_pending_t *p = w->queue;
        DL_DELETE(w->queue, p);
        if (p->op == 'c' && p->cancelled) { /* never sent: nothing to give back */
            if (p->want >= 0)
                rl_lease_reply(w, p, NULL, 0, false);
            free(p->ticket);
            free(p);
            continue;
        }
        if (p->op == 'c' && p->want > 0) { /* a lease ask: its size is final now */
            rl_lease_t *l = rl_lease_find(w, p->ticket->key, p->ticket->klen);
            if (l && l->ask_queued == p)
                l->ask_queued = NULL;
        }
        if (b)
            b->p[n] = p;
        else
            failed[n] = p;
        n++;
    }
    if (n == 0) {
        free(b);
        return;
    }
    if (b) {
        b->w = w;
        b->n = n;
        for (size_t i = 0; i < n; i++)
            rl_entry_format(w, i, n, b->p[i]);
        char lease_ms[24];
        w->argvlen[2 * n] = sl_i64toa(RL_LEASE_MS, lease_ms);
        w->argv[2 * n] = lease_ms;
        if (sl_redis_evalsha(w->redis, w->rl->script, (int)(2 * n), (int)(10 * n + 1), w->argv,
                             w->argvlen, rl_batch_cb, b)) {
            DL_APPEND(w->batches, b);
            return;
        }
        memcpy(failed, b->p, n * sizeof(failed[0]));
        free(b);
    }
    /* Out of memory: each entry as if Redis were down (we are on the
     * flush event, not inside rl_check(): callbacks may run). */
    for (size_t i = 0; i < n; i++)
        rl_entry_end(failed[i], NULL);
}

static void rl_flush_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    rl_worker_t *w = arg;
    while (w->queue)
        rl_batch_send(w);
}

/* Queues a check or settle for this turn's batch. */
static void rl_enqueue(rl_worker_t *w, rl_pending_t *p)
{
    if (!w->queue)
        event_active(w->flush_ev, EV_TIMEOUT, 0);
    DL_APPEND(w->queue, p);
}

/* A check entry of t's for the batch or a lease's waiters, owning t;
 * NULL (t freed) on OOM. */
static rl_pending_t *rl_check_entry(rl_worker_t *w, rl_ticket_t *t, int64_t tokens, rl_check_cb cb,
                                    void *arg)
{
    rl_pending_t *p = sl_zalloc(sizeof(*p));
    if (!p) {
        free(t);
        return NULL;
    }
    p->w = w;
    p->cb = cb;
    p->arg = arg;
    p->ticket = t;
    p->n = tokens;
    p->op = 'c';
    return p;
}

rl_check_rc_t rl_check(rl_worker_t *w, const rl_request_t *req, rl_decision_t *d,
                       rl_ticket_t **ticket, rl_check_cb cb, void *arg, rl_pending_t **pending)
{
    rl_t *rl = w->rl;
    *ticket = NULL;
    if (pending)
        *pending = NULL;
    memset(d, 0, sizeof(*d));
    rl_ticket_t *t = rl_ticket_get(w);
    if (!t)
        return RL_ERROR;
    t->rl = rl;
    t->w = w;
    const rl_policy_t *pol = req->policy ? req->policy : rl->policy;
    t->on_store_error = pol->on_store_error;
    int64_t tokens = req->tokens > 0 ? req->tokens : 0;
    if (req->user) {
        rl_policy_limits_for(pol, req->user, req->client, &t->lim);
        t->klen = rl_key_make('u', req->user, t->key);
    } else if (req->ip) {
        rl_policy_limits_for(pol, NULL, NULL, &t->lim);
        t->ip = true;
        tokens = 0; /* no budgets without a user */
        /* an IPv6 client owns a whole /64: limit the prefix, not the address */
        char ip[INET6_ADDRSTRLEN + 4];
        unsigned char a6[16];
        snprintf(ip, sizeof(ip), "%s", req->ip);
        if (strchr(ip, ':') && inet_pton(AF_INET6, ip, a6) == 1) {
            memset(a6 + 8, 0, 8);
            if (inet_ntop(AF_INET6, a6, ip, INET6_ADDRSTRLEN))
                strcat(ip, "/64");
        }
        t->klen = rl_key_make('i', ip, t->key);
    }
    if (!t->klen || !rl_limits_any(&t->lim, tokens)) {
        d->allowed = true;
        *ticket = t; /* nothing to give back, but one flow for the caller */
        return RL_DONE;
    }
    if (!w->redis) {
        rl_check_mem(rl, t, tokens, d);
        goto done;
    }
    if (t->lim.concurrent > 0)
        snprintf(t->lease, sizeof(t->lease), "%s:%llu", rl->instance,
                 (unsigned long long)atomic_fetch_add(&rl->lease_seq, 1));
    if (!sl_redis_connected(w->redis)) {
        rl_store_error(rl, t, tokens, d);
        goto done;
    }
    bool leasable = pol->leases && rl_lease_eligible(t, tokens);
    int64_t now = leasable ? rl->now_ns(rl->now_arg) : 0;
    if (leasable) {
        rl_lease_t *l = rl_lease_find(w, t->key, t->klen);
        if (l && rl_lease_spend(l, t, now, d)) {
            rl_lease_refill(w, l, now);
            t->backend = RL_BACKEND_NONE; /* a request unit is never given back */
            sl_counter_add(rl->decided[1], 1);
            *ticket = t;
            return RL_DONE;
        }
        if (l && rl_lease_wait(l, t)) {
            rl_pending_t *p = rl_check_entry(w, t, tokens, cb, arg);
            if (!p)
                return RL_ERROR;
            l->last_ns = now;
            /* checks queue up behind each other: the lease grows (as in
             * rl_lease_want) */
            l->size = SL_MIN(SL_MAX(l->size * 2, 1), rl_lease_cap(&t->lim));
            if (l->ask_queued) /* not sent yet: it asks for this one too */
                l->ask_queued->want =
                    SL_MIN(l->ask_queued->want + 1, t->lim.requests_per_minute / RL_LEASE_DIVISOR);
            DL_APPEND(l->waiters, p);
            if (pending)
                *pending = p;
            return RL_PENDING;
        }
    }
    rl_pending_t *p = rl_check_entry(w, t, tokens, cb, arg);
    if (!p)
        return RL_ERROR;
    int64_t want = leasable ? rl_lease_want(w, t, now) : -1;
    p->want = want;
    if (want > 0)
        rl_lease_find(w, t->key, t->klen)->ask_queued = p;
    rl_enqueue(w, p);
    if (pending)
        *pending = p;
    return RL_PENDING;
done:
    rl_count_refusal(rl, d);
    if (d->allowed)
        *ticket = t;
    else
        rl_ticket_put(t);
    return RL_DONE;
}

void rl_pending_cancel(rl_pending_t *p)
{
    if (p)
        p->cancelled = true;
}

/* ---- tickets ------------------------------------------------------------------------- */

static void rl_ticket_finish(rl_ticket_t *t, int64_t refund)
{
    switch (t->backend) {
    case RL_BACKEND_MEM:
        rl_mem_settle(t->rl->mem, t->key, t->klen, t->hv, &t->lim, refund, t->slot,
                      t->rl->now_ns(t->rl->now_arg));
        break;
    case RL_BACKEND_REDIS:
        if ((refund != 0 && (t->lim.tokens_per_minute > 0 || t->lim.tokens_per_day > 0)) ||
            t->slot) {
            if (!t->slot)
                t->lease[0] = '\0';
            rl_pending_t *p = sl_zalloc(sizeof(*p));
            if (p) { /* the settle takes the ticket; it goes with this turn's batch */
                p->w = t->w;
                p->ticket = t;
                p->n = refund;
                p->op = 's';
                p->want = -1;
                rl_enqueue(t->w, p);
                return;
            }
            sl_debug("ratelimit: cannot queue a Redis settle");
        }
        break;
    default:
        break;
    }
    rl_ticket_put(t);
}

void rl_ticket_settle(rl_ticket_t *t, int64_t used_tokens)
{
    if (!t)
        return;
    if (used_tokens < 0)
        used_tokens = 0;
    rl_ticket_finish(t, t->reserved - used_tokens);
}

void rl_ticket_release(rl_ticket_t *t)
{
    if (t)
        rl_ticket_finish(t, t->reserved);
}

int64_t rl_ticket_reserved(const rl_ticket_t *t)
{
    return t ? t->reserved : 0;
}

/* ---- answers ----------------------------------------------------------------------------- */

int64_t rl_ms_to_s_ceil(int64_t ms)
{
    return ms <= 0 ? 0 : (ms + 999) / 1000;
}

int rl_decision_status(const rl_decision_t *d)
{
    return d->limit == RL_LIMIT_STORE ? 503 : 429;
}

int rl_format_headers(const rl_decision_t *d, char *buf, size_t n)
{
    rl_header_nums_t at;
    return rl_format_headers_at(d, buf, n, &at);
}

int rl_format_headers_at(const rl_decision_t *d, char *buf, size_t n, rl_header_nums_t *at)
{
    size_t len = 0;
    int w;
    memset(at, 0, sizeof(*at));
    if (n == 0)
        return -1;
    buf[0] = '\0';
    if (d->limit != RL_LIMIT_NONE && d->limit != RL_LIMIT_STORE && d->limit != RL_LIMIT_KEYS) {
        /* Per answer: built without snprintf (three numbers, fixed names). */
        static const struct {
            const char *s;
            size_t n;
        } names[3] = {{"X-RateLimit-Limit: ", sizeof("X-RateLimit-Limit: ") - 1},
                      {"X-RateLimit-Remaining: ", sizeof("X-RateLimit-Remaining: ") - 1},
                      {"X-RateLimit-Reset: ", sizeof("X-RateLimit-Reset: ") - 1}};
        int64_t vals[3] = {d->limit_value, SL_MAX(d->remaining, 0), rl_ms_to_s_ceil(d->reset_ms)};
        for (int i = 0; i < 3; i++) {
            size_t nl = names[i].n;
            if (len + nl + 24 + 2 >= n)
                return -1;
            memcpy(buf + len, names[i].s, nl);
            len += nl;
            size_t dl = sl_i64toa(vals[i], buf + len);
            if (i == 0) {
                at->limit_off = len;
                at->limit_len = dl;
            } else if (i == 1) {
                at->remaining_off = len;
                at->remaining_len = dl;
            }
            len += dl;
            buf[len++] = '\r';
            buf[len++] = '\n';
        }
        buf[len] = '\0';
    }
    if (!d->allowed && d->retry_after_ms >= 0) {
        w = snprintf(buf + len, n - len, "Retry-After: %lld\r\n",
                     (long long)SL_MAX(rl_ms_to_s_ceil(d->retry_after_ms), 1));
        if (w < 0 || (size_t)w >= n - len)
            return -1;
        len += (size_t)w;
    }
    return (int)len;
}

char *rl_error_body(const rl_decision_t *d, size_t *len)
{
    char msg[256];
    const char *name = rl_limit_name(d->limit);
    if (d->limit == RL_LIMIT_STORE)
        snprintf(msg, sizeof(msg),
                 "Rate limits cannot be checked right now (store unavailable); retry shortly.");
    else if (d->retry_after_ms < 0)
        snprintf(msg, sizeof(msg),
                 "Request too large for %s (limit %lld): it can never fit; lower max_tokens or "
                 "shorten the prompt.",
                 name, (long long)d->limit_value);
    else if (d->limit == RL_LIMIT_KEYS)
        snprintf(msg, sizeof(msg),
                 "Rate limits are tracking as many active users as they can (max_keys %lld); "
                 "retry in %llds.",
                 (long long)d->limit_value,
                 (long long)SL_MAX(rl_ms_to_s_ceil(d->retry_after_ms), 1));
    else if (d->limit == RL_LIMIT_CONCURRENT)
        snprintf(msg, sizeof(msg),
                 "Rate limit reached for concurrent requests (limit %lld); retry after one "
                 "finishes.",
                 (long long)d->limit_value);
    else
        snprintf(msg, sizeof(msg), "Rate limit reached for %s (limit %lld); retry in %llds.", name,
                 (long long)d->limit_value,
                 (long long)SL_MAX(rl_ms_to_s_ceil(d->retry_after_ms), 1));
    /* A store that cannot answer is the server's trouble, not a limit the
     * client exceeded: the same type and code as auth's store_unavailable. */
    bool store = d->limit == RL_LIMIT_STORE;
    json_t *j = json_pack("{s:{s:s, s:s, s:n, s:s, s:s}}", "error", "message", msg, "type",
                          store ? "server_error" : "rate_limit_error", "param", "code",
                          store ? "store_unavailable" : "rate_limit_exceeded", "limit", name);
    if (!j)
        return NULL;
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (s && len)
        *len = strlen(s);
    return s;
}
