/*
 * idem.c — Idempotency-Key handling: a key (scoped to the user) is claimed
 * in flight by the first request, answers 409 to a concurrent duplicate,
 * replays the stored answer once completed, and answers 422 when it comes
 * back with another body. Two stores behind one interface:
 *
 *   in-process  a hash table under one lock, bounded by max_entries (the
 *               oldest entry goes first, counted) and by TTLs: inflight_ttl
 *               for a claim nobody completes (a crash), ttl for answers;
 *   Redis       one hash per key (sluice:idem:<sha256(user, key)>), claimed
 *               and read in one Lua script, so instances share keys.
 *
 * Keys are stored as SHA-256 of (user, NUL, key): bounded size, and a
 * user's key never collides with another user's. The body is compared by
 * its SHA-256. A claim carries a random token so that a late complete or
 * abort (after the claim expired and someone else claimed the key) changes
 * nothing.
 */
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <uthash.h>

#include "common/log.h"
#include "common/sl.h"
#include "fallback/fb_internal.h"

#define FB_IDEM_PREFIX "sluice:idem:"

typedef enum fb_istate { FB_I_INFLIGHT = 0, FB_I_DONE, FB_I_NOT_KEPT } fb_istate_t;

typedef struct fb_ientry fb_ientry_t;
struct fb_ientry {
    unsigned char key[32];
    unsigned char hash[32];
    fb_istate_t state;
    uint64_t token;
    int64_t expires;
    int status;
    char *ctype, *body;
    size_t len;
    UT_hash_handle hh;
    TAILQ_ENTRY(fb_ientry) link; /* oldest first */
};
TAILQ_HEAD(fb_ilist, fb_ientry);

struct fb_idem {
    conf_fb_idem_t c;
    int64_t (*now)(void *);
    void *now_arg;
    pthread_mutex_t lock;
    fb_ientry_t *by_key;
    struct fb_ilist order;
    size_t count;
    /* Redis */
    char *url;
    int64_t timeout_ms;
    sl_redis_script_t *script; /* begin, complete and abort: see fb_idem_lua */
};

struct fb_idem_worker {
    fb_idem_t *s;
    sl_redis_t *redis;
};

static const char *const fb_idem_names[] = {"proceed",  "in_flight", "replay",
                                            "mismatch", "not_kept",  "store_error"};

const char *fb_idem_verdict_name(fb_idem_verdict_t v)
{
    return (unsigned)v < SL_ARRAY_LEN(fb_idem_names) ? fb_idem_names[v] : "unknown";
}

void fb_idem_result_clear(fb_idem_result_t *r)
{
    if (!r)
        return;
    free(r->content_type);
    free(r->body);
    memset(r, 0, sizeof(*r));
}

bool fb_idem_key_valid(const char *key, size_t len)
{
    if (!key || len == 0 || len > FB_IDEM_KEY_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if (key[i] < 0x21 || key[i] > 0x7e)
            return false;
    return true;
}

static int64_t fb_idem_default_now(void *arg)
{
    (void)arg;
    return sl_now_ms();
}

/* One script for begin ('b'), complete ('c') and abort ('a'), on purpose:
 * complete and abort are fired and forgotten, and the client's next request
 * with the key may be queued right behind on the same connection. Redis
 * keeps one connection's order, but a script Redis does not know yet
 * (fresh or restarted Redis) answers NOSCRIPT and is sent again after that
 * reply; with separate scripts a later begin (already loaded) would
 * overtake the complete and see the key still in flight. With one script
 * every call after a NOSCRIPT is refused too and resent in the same order. */
static const char fb_idem_lua[] =
    "local op = ARGV[1]\n"
    "if op == 'b' then\n"
    "  local v = redis.call('HMGET', KEYS[1], 'h', 'st', 'status', 'ct', 'body')\n"
    "  if not v[1] then\n"
    "    redis.call('HSET', KEYS[1], 'h', ARGV[2], 'st', 'i', 'tok', ARGV[3])\n"
    "    redis.call('PEXPIRE', KEYS[1], ARGV[4])\n"
    "    return {'P'}\n"
    "  end\n"
    "  if v[1] ~= ARGV[2] then return {'M'} end\n"
    "  if v[2] == 'i' then return {'I'} end\n"
    "  if v[2] == 'n' then return {'N'} end\n"
    "  return {'R', v[3], v[4], v[5]}\n"
    "end\n"
    "local v = redis.call('HMGET', KEYS[1], 'tok', 'st')\n"
    "if v[1] ~= ARGV[2] or v[2] ~= 'i' then return 0 end\n"
    "if op == 'a' then\n"
    "  redis.call('DEL', KEYS[1])\n"
    "  return 1\n"
    "end\n"
    "redis.call('HSET', KEYS[1], 'st', ARGV[3], 'status', ARGV[4], 'ct', ARGV[5], 'body', "
    "ARGV[6])\n"
    "redis.call('PEXPIRE', KEYS[1], ARGV[7])\n"
    "return 1\n";

fb_idem_t *fb_idem_new(const conf_fb_idem_t *c, const conf_redis_t *redis, char *err, size_t errlen)
{
    fb_metrics_init();
    fb_idem_t *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->c = *c;
    s->now = fb_idem_default_now;
    pthread_mutex_init(&s->lock, NULL);
    TAILQ_INIT(&s->order);
    if (redis && redis->url) {
        if (sl_redis_url_check(redis->url, err, errlen) != 0) {
            fb_idem_free(s);
            return NULL;
        }
        s->url = strdup(redis->url);
        s->timeout_ms = redis->timeout_ms > 0 ? redis->timeout_ms : 50;
        s->script = sl_redis_script_new(fb_idem_lua);
        if (!s->url || !s->script) {
            snprintf(err, errlen, "out of memory");
            fb_idem_free(s);
            return NULL;
        }
    }
    return s;
}

static void fb_ientry_free(fb_ientry_t *e)
{
    free(e->ctype);
    free(e->body);
    free(e);
}

/* Under the lock. */
static void fb_ientry_drop(fb_idem_t *s, fb_ientry_t *e)
{
    HASH_DEL(s->by_key, e);
    TAILQ_REMOVE(&s->order, e, link);
    s->count--;
    fb_ientry_free(e);
}

void fb_idem_free(fb_idem_t *s)
{
    if (!s)
        return;
    fb_ientry_t *e;
    while ((e = TAILQ_FIRST(&s->order)))
        fb_ientry_drop(s, e);
    sl_redis_script_free(s->script);
    pthread_mutex_destroy(&s->lock);
    free(s->url);
    free(s);
}

void fb_idem_set_clock(fb_idem_t *s, int64_t (*now_ms)(void *arg), void *arg)
{
    s->now = now_ms;
    s->now_arg = arg;
}

size_t fb_idem_count(fb_idem_t *s)
{
    pthread_mutex_lock(&s->lock);
    size_t n = s->count;
    pthread_mutex_unlock(&s->lock);
    return n;
}

fb_idem_worker_t *fb_idem_worker_new(fb_idem_t *s, struct event_base *base, char *err,
                                     size_t errlen)
{
    fb_idem_worker_t *w = calloc(1, sizeof(*w));
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    w->s = s;
    if (s->url) {
        sl_redis_opts_t o = {.url = s->url, .timeout_ms = s->timeout_ms};
        w->redis = sl_redis_new(base, &o, err, errlen);
        if (!w->redis) {
            free(w);
            return NULL;
        }
    }
    return w;
}

void fb_idem_worker_free(fb_idem_worker_t *w)
{
    if (!w)
        return;
    sl_redis_free(w->redis);
    free(w);
}

static void fb_idem_key(const char *user, const char *key, unsigned char out[32])
{
    const char *u = user ? user : "";
    fb_sha256(u, strlen(u) + 1, key, strlen(key), NULL, 0, out);
}

static void fb_idem_count_verdict(fb_idem_verdict_t v)
{
    switch (v) {
    case FB_IDEM_REPLAY:
        sl_counter_add(fb_m.idem_replays, 1);
        break;
    case FB_IDEM_IN_FLIGHT:
    case FB_IDEM_NOT_KEPT:
        sl_counter_add(fb_m.idem_in_flight, 1);
        break;
    case FB_IDEM_MISMATCH:
        sl_counter_add(fb_m.idem_mismatch, 1);
        break;
    case FB_IDEM_STORE_ERROR:
        sl_counter_add(fb_m.idem_store_errors, 1);
        break;
    default:
        break;
    }
}

static uint64_t fb_idem_token(void)
{
    uint64_t t;
    do
        t = fb_rand64();
    while (t == 0);
    return t;
}

/* ---- in-process ----------------------------------------------------------------- */

/* Under the lock: drops expired entries from the old end. */
static void fb_idem_sweep(fb_idem_t *s, int64_t now)
{
    fb_ientry_t *e;
    int n = 0;
    /* A bounded step per call: the order is by insertion, not expiry. */
    while ((e = TAILQ_FIRST(&s->order)) && e->expires <= now && n++ < 64)
        fb_ientry_drop(s, e);
}

static fb_idem_verdict_t fb_idem_mem_begin(fb_idem_t *s, const unsigned char k[32],
                                           const unsigned char h[32], fb_idem_result_t *res)
{
    int64_t now = s->now(s->now_arg);
    fb_idem_verdict_t v;
    pthread_mutex_lock(&s->lock);
    fb_idem_sweep(s, now);
    fb_ientry_t *e = NULL;
    HASH_FIND(hh, s->by_key, k, 32, e);
    if (e && e->expires <= now) {
        fb_ientry_drop(s, e);
        e = NULL;
    }
    if (!e) {
        e = calloc(1, sizeof(*e));
        if (!e) {
            pthread_mutex_unlock(&s->lock);
            return FB_IDEM_STORE_ERROR;
        }
        if (s->count >= (size_t)s->c.max_entries && !TAILQ_EMPTY(&s->order)) {
            fb_ientry_drop(s, TAILQ_FIRST(&s->order));
            sl_counter_add(fb_m.idem_evicted, 1);
        }
        memcpy(e->key, k, 32);
        memcpy(e->hash, h, 32);
        e->state = FB_I_INFLIGHT;
        e->token = fb_idem_token();
        e->expires = now + s->c.inflight_ttl_ms;
        HASH_ADD(hh, s->by_key, key, 32, e);
        TAILQ_INSERT_TAIL(&s->order, e, link);
        s->count++;
        res->token = e->token;
        v = FB_IDEM_PROCEED;
    } else if (memcmp(e->hash, h, 32) != 0) {
        v = FB_IDEM_MISMATCH;
    } else if (e->state == FB_I_INFLIGHT) {
        v = FB_IDEM_IN_FLIGHT;
    } else if (e->state == FB_I_NOT_KEPT) {
        v = FB_IDEM_NOT_KEPT;
    } else {
        res->status = e->status;
        res->content_type = strdup(e->ctype ? e->ctype : "");
        res->body = malloc(e->len + 1);
        if (!res->content_type || !res->body) {
            fb_idem_result_clear(res);
            v = FB_IDEM_STORE_ERROR;
        } else {
            memcpy(res->body, e->body, e->len);
            res->body[e->len] = '\0';
            res->body_len = e->len;
            v = FB_IDEM_REPLAY;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return v;
}

static void fb_idem_mem_complete(fb_idem_t *s, const unsigned char k[32], uint64_t token,
                                 int status, const char *ctype, const void *body, size_t len)
{
    int64_t now = s->now(s->now_arg);
    pthread_mutex_lock(&s->lock);
    fb_ientry_t *e = NULL;
    HASH_FIND(hh, s->by_key, k, 32, e);
    if (e && e->state == FB_I_INFLIGHT && e->token == token) {
        bool keep = (int64_t)len <= s->c.max_response_bytes;
        char *b = keep ? malloc(len + 1) : NULL;
        char *ct = keep ? strdup(ctype ? ctype : "") : NULL;
        if (keep && (!b || !ct)) {
            free(b);
            free(ct);
            b = ct = NULL;
            keep = false; /* out of memory: remembered as completed, not replayable */
        }
        if (b) {
            memcpy(b, body, len);
            b[len] = '\0';
        }
        e->state = keep ? FB_I_DONE : FB_I_NOT_KEPT;
        e->status = status;
        e->body = b;
        e->len = keep ? len : 0;
        e->ctype = ct;
        e->expires = now + s->c.ttl_ms;
        TAILQ_REMOVE(&s->order, e, link);
        TAILQ_INSERT_TAIL(&s->order, e, link);
    }
    pthread_mutex_unlock(&s->lock);
}

static void fb_idem_mem_abort(fb_idem_t *s, const unsigned char k[32], uint64_t token)
{
    pthread_mutex_lock(&s->lock);
    fb_ientry_t *e = NULL;
    HASH_FIND(hh, s->by_key, k, 32, e);
    if (e && e->state == FB_I_INFLIGHT && e->token == token)
        fb_ientry_drop(s, e);
    pthread_mutex_unlock(&s->lock);
}

/* ---- Redis ----------------------------------------------------------------------------- */

typedef struct fb_idem_ctx {
    fb_call_t call; /* first */
    fb_idem_cb cb;
    void *arg;
    uint64_t token;
} fb_idem_ctx_t;

static void fb_idem_ctx_free(void *p)
{
    free(p);
}

static char *fb_rdup(const redisReply *r, size_t *len)
{
    if (!r || (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_STATUS))
        return NULL;
    char *s = malloc(r->len + 1);
    if (s) {
        memcpy(s, r->str, r->len);
        s[r->len] = '\0';
        if (len)
            *len = r->len;
    }
    return s;
}

static void fb_idem_begin_cb(void *arg, sl_redis_status_t status, redisReply *rep)
{
    fb_idem_ctx_t *x = arg;
    fb_idem_result_t res;
    memset(&res, 0, sizeof(res));
    res.verdict = FB_IDEM_STORE_ERROR;
    if (status == SL_REDIS_OK && rep && rep->type == REDIS_REPLY_ARRAY && rep->elements >= 1 &&
        rep->element[0]->type == REDIS_REPLY_STRING && rep->element[0]->len == 1) {
        switch (rep->element[0]->str[0]) {
        case 'P':
            res.verdict = FB_IDEM_PROCEED;
            res.token = x->token;
            break;
        case 'M':
            res.verdict = FB_IDEM_MISMATCH;
            break;
        case 'I':
            res.verdict = FB_IDEM_IN_FLIGHT;
            break;
        case 'N':
            res.verdict = FB_IDEM_NOT_KEPT;
            break;
        case 'R':
            if (rep->elements == 4) {
                char *st = fb_rdup(rep->element[1], NULL);
                res.status = st ? atoi(st) : 0;
                free(st);
                res.content_type = fb_rdup(rep->element[2], NULL);
                res.body = fb_rdup(rep->element[3], &res.body_len);
                if (res.content_type && res.body) {
                    res.verdict = FB_IDEM_REPLAY;
                } else {
                    fb_idem_result_clear(&res);
                    res.verdict = FB_IDEM_STORE_ERROR;
                }
            }
            break;
        }
    } else if (rep && rep->type == REDIS_REPLY_ERROR) {
        sl_warn("idempotency redis: %.*s", (int)rep->len, rep->str);
    }
    fb_idem_count_verdict(res.verdict);
    fb_idem_cb cb = x->cb;
    void *carg = x->arg;
    free(x);
    cb(carg, &res);
}

static void fb_idem_ff_cb(void *arg, sl_redis_status_t status, redisReply *rep)
{
    (void)arg;
    if (status != SL_REDIS_OK || !rep || rep->type == REDIS_REPLY_ERROR)
        sl_counter_add(fb_m.idem_store_errors, 1);
}

static void fb_idem_rkey(const unsigned char k[32], char out[sizeof(FB_IDEM_PREFIX) + 64])
{
    memcpy(out, FB_IDEM_PREFIX, sizeof(FB_IDEM_PREFIX) - 1);
    sl_hex(k, 32, out + sizeof(FB_IDEM_PREFIX) - 1);
}

/* ---- the interface --------------------------------------------------------------------- */

fb_rc_t fb_idem_begin(fb_idem_worker_t *w, const char *user, const char *key, const void *body,
                      size_t body_len, fb_idem_result_t *res, fb_idem_cb cb, void *arg,
                      fb_call_t **call)
{
    memset(res, 0, sizeof(*res));
    if (!key || !fb_idem_key_valid(key, strlen(key)))
        return FB_ERROR;
    unsigned char k[32], h[32];
    fb_idem_key(user, key, k);
    fb_sha256(body, body_len, NULL, 0, NULL, 0, h);
    fb_idem_t *s = w->s;
    if (!w->redis) {
        res->verdict = fb_idem_mem_begin(s, k, h, res);
        fb_idem_count_verdict(res->verdict);
        return FB_DONE;
    }
    fb_idem_ctx_t *x = calloc(1, sizeof(*x));
    if (!x)
        return FB_ERROR;
    x->call.free_ctx = fb_idem_ctx_free;
    x->cb = cb;
    x->arg = arg;
    x->token = fb_idem_token();
    char rkey[sizeof(FB_IDEM_PREFIX) + 64], hh[65], tok[24], ttl[24];
    fb_idem_rkey(k, rkey);
    sl_hex(h, 32, hh);
    snprintf(tok, sizeof(tok), "%llu", (unsigned long long)x->token);
    snprintf(ttl, sizeof(ttl), "%lld", (long long)s->c.inflight_ttl_ms);
    const char *argv[] = {rkey, "b", hh, tok, ttl};
    size_t lens[] = {strlen(rkey), 1, 64, strlen(tok), strlen(ttl)};
    sl_redis_call_t *rc =
        sl_redis_evalsha(w->redis, s->script, 1, 5, argv, lens, fb_idem_begin_cb, x);
    if (!rc) {
        free(x);
        return FB_ERROR;
    }
    x->call.rc = rc;
    if (call)
        *call = &x->call;
    return FB_PENDING;
}

void fb_idem_complete(fb_idem_worker_t *w, const char *user, const char *key, uint64_t token,
                      int status, const char *content_type, const void *body, size_t len)
{
    if (!key)
        return;
    unsigned char k[32];
    fb_idem_key(user, key, k);
    fb_idem_t *s = w->s;
    if (!w->redis) {
        fb_idem_mem_complete(s, k, token, status, content_type, body, len);
        return;
    }
    bool keep = (int64_t)len <= s->c.max_response_bytes;
    char rkey[sizeof(FB_IDEM_PREFIX) + 64], tok[24], st[16], ttl[24];
    fb_idem_rkey(k, rkey);
    snprintf(tok, sizeof(tok), "%llu", (unsigned long long)token);
    snprintf(st, sizeof(st), "%d", status);
    snprintf(ttl, sizeof(ttl), "%lld", (long long)s->c.ttl_ms);
    const char *ct = content_type ? content_type : "";
    const char *argv[] = {rkey, "c", tok, keep ? "d" : "n", st, ct, keep ? body : "", ttl};
    size_t lens[] = {strlen(rkey), 1,          strlen(tok),    1,
                     strlen(st),   strlen(ct), keep ? len : 0, strlen(ttl)};
    if (!argv[6])
        argv[6] = "";
    /* Fire and forget: the callback's argument is nothing that can go away. */
    if (!sl_redis_evalsha(w->redis, s->script, 1, 8, argv, lens, fb_idem_ff_cb, NULL))
        sl_counter_add(fb_m.idem_store_errors, 1);
}

void fb_idem_abort(fb_idem_worker_t *w, const char *user, const char *key, uint64_t token)
{
    if (!key)
        return;
    unsigned char k[32];
    fb_idem_key(user, key, k);
    if (!w->redis) {
        fb_idem_mem_abort(w->s, k, token);
        return;
    }
    char rkey[sizeof(FB_IDEM_PREFIX) + 64], tok[24];
    fb_idem_rkey(k, rkey);
    snprintf(tok, sizeof(tok), "%llu", (unsigned long long)token);
    const char *argv[] = {rkey, "a", tok};
    size_t lens[] = {strlen(rkey), 1, strlen(tok)};
    if (!sl_redis_evalsha(w->redis, w->s->script, 1, 3, argv, lens, fb_idem_ff_cb, NULL))
        sl_counter_add(fb_m.idem_store_errors, 1);
}
