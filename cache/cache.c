/*
 * cache.c — the cache per request: policy and key at the start, the exact
 * and semantic lookups, recording the answer and storing it at the end,
 * against the in-process store or Redis (one string per entry,
 * sluice:cache:<hex key>, with PX ttl; semantic entries on the stream
 * sluice:cache:sem, which one worker per instance reads from the start and
 * then tails, so every instance's index holds every vector). A Redis
 * failure is a miss and is counted, never an error for the client.
 */
#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_internal.h"
#include "common/log.h"
#include "common/redis.h"

#define CACHE_REDIS_PREFIX   "sluice:cache:"
#define CACHE_SEM_STREAM     "sluice:cache:sem"
#define CACHE_TAIL_BATCH     "512"
#define CACHE_TAIL_IDLE_MS   250
#define CACHE_SEM_STREAM_MAX 1000000

cache_metrics_t cache_m;
static pthread_once_t cache_m_once = PTHREAD_ONCE_INIT;

static void cache_metrics_register(void)
{
    static const double sem_buckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                         0.005,  0.01,    0.025,  0.05};
    cache_m.requests = sl_metric_register("sluice_cache_requests_total",
                                          "Cacheable-route requests by cache result (hit, miss, "
                                          "bypass).",
                                          SL_METRIC_COUNTER, "model,result", NULL, 0);
    cache_m.bypasses =
        sl_metric_register("sluice_cache_bypass_total", "Requests not looked up, by reason.",
                           SL_METRIC_COUNTER, "model,reason", NULL, 0);
    cache_m.stores = sl_metric_register("sluice_cache_stores_total",
                                        "Answers stored, or why not (error, fallback, filtered, "
                                        "truncated, too_large, malformed).",
                                        SL_METRIC_COUNTER, "model,result", NULL, 0);
    cache_m.entries = sl_metric_register("sluice_cache_entries", "Entries in the in-process store.",
                                         SL_METRIC_GAUGE, "model", NULL, 0);
    cache_m.bytes = sl_metric_register("sluice_cache_bytes", "Bytes of the in-process store.",
                                       SL_METRIC_GAUGE, "model", NULL, 0);
    cache_m.evictions = sl_metric_register("sluice_cache_evictions_total",
                                           "In-process entries dropped to make room.",
                                           SL_METRIC_COUNTER, NULL, NULL, 0);
    cache_m.store_errs = sl_metric_register("sluice_cache_store_errors_total",
                                            "Redis failures of the cache (each a miss or a skip).",
                                            SL_METRIC_COUNTER, "op", NULL, 0);
    cache_m.sem_lookups = sl_metric_register("sluice_cache_semantic_lookups_total",
                                             "Semantic index lookups by result.", SL_METRIC_COUNTER,
                                             "model,result", NULL, 0);
    cache_m.sem_seconds = sl_metric_register(
        "sluice_cache_semantic_lookup_seconds", "Time of a semantic index lookup.",
        SL_METRIC_HISTOGRAM, "model", sem_buckets, SL_ARRAY_LEN(sem_buckets));
    cache_m.sem_entries =
        sl_metric_register("sluice_cache_semantic_entries", "Vectors in the semantic index.",
                           SL_METRIC_GAUGE, NULL, NULL, 0);
}

void cache_metrics_init(void)
{
    pthread_once(&cache_m_once, cache_metrics_register);
}

static void cache_count2(sl_metric_t *m, const char *a, const char *b)
{
    const char *v[2] = {a, b};
    sl_counter_add(sl_metric_series(m, v), 1);
}

/* ---- the shared cache ----------------------------------------------------------- */

struct cache {
    const conf_t *conf; /* the start conf: only for a cache_req_in_t without one
                           (tests); the gateway passes each request's */
    bool sem_tail;      /* a semantic cache is configured: tail its stream */
    cache_lru_t *lru;   /* NULL with Redis */
    cache_sem_t *sem;
    char *redis_url;
    int64_t redis_timeout_ms;
    atomic_bool tailer_taken;
};

cache_t *cache_new(const conf_t *conf, char *err, size_t errlen)
{
    cache_metrics_init();
    const conf_cache_t *cc = &conf->cache;
    if (cc->semantic.embed_model && !conf_model_find(conf, cc->semantic.embed_model)) {
        snprintf(err, errlen, "cache.semantic.embed_model: no model named \"%s\" under models",
                 cc->semantic.embed_model);
        return NULL;
    }
    cache_t *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->conf = conf;
    c->sem_tail = cc->semantic.embed_model != NULL;
    if (conf->redis.url) {
        c->redis_url = strdup(conf->redis.url);
        c->redis_timeout_ms = conf->redis.timeout_ms;
    } else {
        c->lru = cache_lru_new(cc->max_bytes);
    }
    c->sem = cache_sem_new((size_t)cc->semantic.max_entries, (size_t)cc->semantic.max_partitions,
                           (size_t)cc->semantic.max_bytes);
    if ((conf->redis.url && !c->redis_url) || (!conf->redis.url && !c->lru) || !c->sem) {
        snprintf(err, errlen, "out of memory");
        cache_free(c);
        return NULL;
    }
    return c;
}

void cache_free(cache_t *c)
{
    if (!c)
        return;
    cache_lru_free(c->lru);
    cache_sem_free(c->sem);
    free(c->redis_url);
    free(c);
}

cache_lru_t *cache_lru(cache_t *c)
{
    return c->lru;
}

cache_sem_t *cache_semantic(cache_t *c)
{
    return c->sem;
}

bool cache_uses_redis(const cache_t *c)
{
    return c->redis_url != NULL;
}

/* ---- the worker: Redis client and the semantic tail ------------------------------ */

struct cache_worker {
    cache_t *c;
    sl_redis_t *redis;
    bool tailer;
    struct event *tail_ev;
    sl_redis_call_t *tail_call;
    char last_id[64];
};

static void cache_tail_schedule(cache_worker_t *w, int64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    evtimer_add(w->tail_ev, &tv);
}

/* One XREAD batch: apply every entry, remember the last id; a full batch
 * asks again at once (loading at start), else after a pause (tailing). */
static void cache_tail_cb(void *arg, sl_redis_status_t st, struct redisReply *rep)
{
    cache_worker_t *w = arg;
    w->tail_call = NULL;
    size_t got = 0;
    if (st != SL_REDIS_OK) {
        sl_counter_add(sl_metric_series1(cache_m.store_errs, "sem_tail"), 1);
    } else if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 1) {
        redisReply *stream = rep->element[0];
        redisReply *items =
            stream->type == REDIS_REPLY_ARRAY && stream->elements == 2 ? stream->element[1] : NULL;
        for (size_t i = 0; items && items->type == REDIS_REPLY_ARRAY && i < items->elements; i++) {
            redisReply *it = items->element[i];
            if (it->type != REDIS_REPLY_ARRAY || it->elements != 2 ||
                it->element[0]->type != REDIS_REPLY_STRING)
                continue;
            snprintf(w->last_id, sizeof(w->last_id), "%s", it->element[0]->str);
            redisReply *f = it->element[1];
            for (size_t k = 0; f->type == REDIS_REPLY_ARRAY && k + 1 < f->elements; k += 2)
                if (f->element[k + 1]->type == REDIS_REPLY_STRING &&
                    cache_sem_apply(w->c->sem, f->element[k + 1]->str, f->element[k + 1]->len) != 0)
                    sl_counter_add(sl_metric_series1(cache_m.store_errs, "sem_record"), 1);
            got++;
        }
    }
    cache_tail_schedule(w, got >= (size_t)atoi(CACHE_TAIL_BATCH) ? 0 : CACHE_TAIL_IDLE_MS);
}

static void cache_tail_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    cache_worker_t *w = arg;
    if (w->tail_call)
        return;
    const char *argv[] = {"XREAD",   "COUNT",          CACHE_TAIL_BATCH,
                          "STREAMS", CACHE_SEM_STREAM, w->last_id};
    w->tail_call = sl_redis_command(w->redis, 6, argv, NULL, cache_tail_cb, w);
    if (!w->tail_call)
        cache_tail_schedule(w, CACHE_TAIL_IDLE_MS);
}

cache_worker_t *cache_worker_new(cache_t *c, struct event_base *base, char *err, size_t errlen)
{
    cache_worker_t *w = calloc(1, sizeof(*w));
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    w->c = c;
    snprintf(w->last_id, sizeof(w->last_id), "0");
    if (!c->redis_url)
        return w;
    sl_redis_opts_t o = {.url = c->redis_url, .timeout_ms = c->redis_timeout_ms};
    w->redis = sl_redis_new(base, &o, err, errlen);
    if (!w->redis) {
        free(w);
        return NULL;
    }
    /* One tailer per process (the index is shared by the workers), and
     * none when no semantic cache is configured. */
    bool expected = false;
    if (c->sem_tail && atomic_compare_exchange_strong(&c->tailer_taken, &expected, true)) {
        w->tailer = true;
        w->tail_ev = evtimer_new(base, cache_tail_timer, w);
        if (!w->tail_ev) {
            snprintf(err, errlen, "out of memory");
            cache_worker_free(w);
            return NULL;
        }
        cache_tail_schedule(w, 0);
    }
    return w;
}

void cache_worker_free(cache_worker_t *w)
{
    if (!w)
        return;
    if (w->tail_call)
        sl_redis_call_cancel(w->tail_call);
    if (w->tail_ev)
        event_free(w->tail_ev);
    if (w->tailer)
        atomic_store(&w->c->tailer_taken, false);
    sl_redis_free(w->redis);
    free(w);
}

/* ---- per request ----------------------------------------------------------------- */

struct cache_req {
    cache_t *c;
    const conf_cache_t *cc;
    cache_policy_t pol;
    char *model; /* metric label: the conf's model name */
    cache_state_t state;
    cache_bypass_t bypass;
    bool storing, stream, include_usage;
    unsigned char key[CACHE_KEY_LEN];
    bool key_ok;
    /* semantic */
    bool sem_on, sem_done;
    unsigned char part[CACHE_KEY_LEN];
    char *sem_text;
    size_t sem_len;
    float *vec;
    size_t dim;
    /* the lookup */
    cache_entry_t *hit;
    sl_redis_call_t *call;
    cache_cb cb;
    void *cb_arg;
    bool counted;
    /* the answer */
    cache_rec_t *rec;
};

cache_req_t *cache_req_new(cache_t *c, const cache_req_in_t *in)
{
    cache_req_t *q = calloc(1, sizeof(*q));
    if (!q)
        return NULL;
    const conf_t *conf = in->conf ? in->conf : c->conf;
    const conf_model_t *cm = in->model ? conf_model_find(conf, in->model) : NULL;
    q->c = c;
    q->cc = &conf->cache;
    q->model = strdup(in->model && cm ? in->model : "_other");
    if (!q->model) {
        free(q);
        return NULL;
    }
    cache_policy_resolve(&conf->cache, cm ? &cm->cache : NULL, &q->pol);
    const json_t *b = in->body;
    q->stream = json_is_true(json_object_get(b, "stream"));
    q->include_usage =
        q->stream &&
        json_is_true(json_object_get(json_object_get(b, "stream_options"), "include_usage"));
    unsigned cc =
        in->cache_control ? cache_control_parse(in->cache_control, strlen(in->cache_control)) : 0;
    q->state = CACHE_BYPASS;
    const json_t *t = json_object_get(b, "temperature");
    double temp = json_is_number(t) ? json_number_value(t) : 1.0;
    const json_t *n = json_object_get(b, "n");
    const json_t *lp = json_object_get(b, "logprobs");
    const char *sub = q->pol.scope == CACHE_SCOPE_USER ? in->sub : NULL;
    if (!q->pol.enabled || !cm) {
        q->bypass = CACHE_BYPASS_OFF;
    } else if (cc & CACHE_CC_NO_STORE) {
        q->bypass = CACHE_BYPASS_NO_STORE;
    } else if (temp > q->pol.max_temperature) {
        q->bypass = CACHE_BYPASS_TEMPERATURE;
    } else if ((n && (!json_is_integer(n) || json_integer_value(n) < 1 ||
                      json_integer_value(n) > CACHE_MAX_CHOICES)) ||
               json_is_true(lp)) {
        q->bypass = CACHE_BYPASS_UNSUPPORTED;
    } else if (q->pol.scope == CACHE_SCOPE_USER && (!in->sub || !*in->sub)) {
        q->bypass = CACHE_BYPASS_NO_USER;
    } else if (cache_key(b, in->key_model ? in->key_model : in->model, sub, q->key, &q->bypass) !=
               0) {
        /* q->bypass says why */
    } else {
        q->key_ok = true;
        q->storing = true;
        if (cc & CACHE_CC_NO_CACHE)
            q->bypass = CACHE_BYPASS_NO_CACHE;
        else
            q->state = CACHE_MISS;
        if (q->pol.semantic)
            q->sem_text = cache_sem_text(b, in->key_model ? in->key_model : in->model, sub,
                                         q->cc->semantic.multi_turn, q->part, &q->sem_len);
        q->sem_on = q->sem_text != NULL;
    }
    if (q->state == CACHE_BYPASS)
        cache_count2(cache_m.bypasses, q->model, cache_bypass_name(q->bypass));
    if (q->storing) {
        q->rec = cache_rec_new(q->pol.max_entry_bytes);
        if (!q->rec)
            q->storing = false;
    }
    return q;
}

void cache_req_free(cache_req_t *q)
{
    if (!q)
        return;
    cache_lookup_cancel(q);
    if (!q->counted)
        cache_count2(cache_m.requests, q->model, cache_req_header(q));
    cache_entry_free(q->hit);
    cache_rec_free(q->rec);
    free(q->sem_text);
    free(q->vec);
    free(q->model);
    free(q);
}

cache_state_t cache_req_state(const cache_req_t *q)
{
    return q->state;
}

cache_bypass_t cache_req_bypass(const cache_req_t *q)
{
    return q->bypass;
}

const char *cache_req_header(const cache_req_t *q)
{
    return q->state == CACHE_HIT ? "hit" : q->state == CACHE_MISS ? "miss" : "bypass";
}

bool cache_req_storing(const cache_req_t *q)
{
    return q->storing && q->state != CACHE_HIT;
}

bool cache_req_stream(const cache_req_t *q)
{
    return q->stream;
}

bool cache_req_include_usage(const cache_req_t *q)
{
    return q->include_usage;
}

const unsigned char *cache_req_key(const cache_req_t *q)
{
    return q->key_ok ? q->key : NULL;
}

const cache_entry_t *cache_req_entry(const cache_req_t *q)
{
    return q->state == CACHE_HIT ? q->hit : NULL;
}

int64_t cache_req_age_s(const cache_req_t *q, int64_t now_ms)
{
    if (!q->hit || now_ms <= q->hit->stored_ms)
        return 0;
    return (now_ms - q->hit->stored_ms) / 1000;
}

bool cache_req_semantic(const cache_req_t *q)
{
    return q->sem_on && q->state == CACHE_MISS && !q->sem_done && !q->vec;
}

char *cache_req_embed_body(const cache_req_t *q, size_t *len)
{
    if (!q->sem_text || !q->cc->semantic.embed_model)
        return NULL;
    return cache_embed_body(q->cc->semantic.embed_model, q->sem_text, q->sem_len, len);
}

const char *cache_req_embed_model(const cache_req_t *q)
{
    return q->cc->semantic.embed_model;
}

int64_t cache_req_embed_deadline_ms(const cache_req_t *q)
{
    return q->cc->semantic.deadline_ms;
}

bool cache_req_charge_tokens(const cache_req_t *q)
{
    return q->cc->charge_tokens;
}

int cache_req_embed_answer(cache_req_t *q, const char *body, size_t len)
{
    if (!q->sem_on)
        return -1;
    free(q->vec);
    q->vec = cache_embed_parse(body, len, &q->dim);
    return q->vec ? 0 : -1;
}

/* ---- lookups ---------------------------------------------------------------------- */

static void cache_redis_key(const unsigned char key[CACHE_KEY_LEN], char *out)
{
    memcpy(out, CACHE_REDIS_PREFIX, sizeof(CACHE_REDIS_PREFIX) - 1);
    sl_hex(key, CACHE_KEY_LEN, out + sizeof(CACHE_REDIS_PREFIX) - 1);
}
#define CACHE_RKEY_LEN (sizeof(CACHE_REDIS_PREFIX) - 1 + 2 * CACHE_KEY_LEN + 1)

/* A stored value became this request's answer, or not. */
static void cache_found(cache_req_t *q, const char *val, size_t len)
{
    cache_entry_t *e = val ? cache_entry_decode(val, len) : NULL;
    if (e) {
        cache_entry_free(q->hit);
        q->hit = e;
        q->state = CACHE_HIT;
    }
}

static void cache_get_cb(void *arg, sl_redis_status_t st, struct redisReply *rep)
{
    cache_req_t *q = arg;
    q->call = NULL;
    if (st != SL_REDIS_OK)
        sl_counter_add(sl_metric_series1(cache_m.store_errs, "get"), 1);
    else if (rep->type == REDIS_REPLY_STRING)
        cache_found(q, rep->str, rep->len);
    cache_cb cb = q->cb;
    q->cb = NULL;
    cb(q->cb_arg, q);
}

/* Fetches the entry stored under key: now (in-process) or later (Redis). */
static cache_rc_t cache_fetch(cache_worker_t *w, cache_req_t *q, const unsigned char *key,
                              int64_t now_ms, cache_cb cb, void *arg)
{
    cache_t *c = q->c;
    if (!c->redis_url) {
        size_t len = 0;
        char *v = cache_lru_get(c->lru, key, now_ms, &len);
        cache_found(q, v, len);
        free(v);
        return CACHE_DONE;
    }
    if (!w || !w->redis)
        return CACHE_DONE; /* no client: a miss */
    char rkey[CACHE_RKEY_LEN];
    cache_redis_key(key, rkey);
    const char *argv[] = {"GET", rkey};
    q->cb = cb;
    q->cb_arg = arg;
    q->call = sl_redis_command(w->redis, 2, argv, NULL, cache_get_cb, q);
    if (!q->call) {
        q->cb = NULL;
        return CACHE_ERROR;
    }
    return CACHE_PENDING;
}

cache_rc_t cache_lookup(cache_worker_t *w, cache_req_t *q, int64_t now_ms, cache_cb cb, void *arg)
{
    if (q->state != CACHE_MISS || q->call)
        return CACHE_DONE;
    if (!q->vec)
        return cache_fetch(w, q, q->key, now_ms, cb, arg);
    /* The semantic lookup: local, then the entry it names. */
    if (q->sem_done)
        return CACHE_DONE;
    q->sem_done = true;
    unsigned char key[CACHE_KEY_LEN];
    double sim = 0;
    int64_t t0 = sl_now_ns();
    int found = cache_sem_lookup(q->c->sem, q->part, q->vec, q->dim, q->cc->semantic.threshold_v,
                                 now_ms, key, &sim);
    sl_histogram_observe(sl_metric_series1(cache_m.sem_seconds, q->model),
                         (double)(sl_now_ns() - t0) / 1e9);
    cache_count2(cache_m.sem_lookups, q->model, found ? "hit" : "miss");
    if (!found)
        return CACHE_DONE;
    return cache_fetch(w, q, key, now_ms, cb, arg);
}

void cache_lookup_cancel(cache_req_t *q)
{
    if (q && q->call) {
        sl_redis_call_cancel(q->call);
        q->call = NULL;
        q->cb = NULL;
    }
}

/* ---- the answer -------------------------------------------------------------------- */

void cache_req_record_body(cache_req_t *q, const json_t *answer)
{
    if (cache_req_storing(q))
        cache_rec_body(q->rec, answer);
}

void cache_req_record_event(cache_req_t *q, const char *data, size_t len)
{
    if (cache_req_storing(q))
        cache_rec_event(q->rec, data, len);
}

void cache_req_taint(cache_req_t *q, unsigned taint)
{
    if (q)
        cache_rec_taint(q->rec, taint);
}

static void cache_set_cb(void *arg, sl_redis_status_t st, struct redisReply *rep)
{
    const char *op = arg;
    if (st != SL_REDIS_OK || (rep && rep->type == REDIS_REPLY_ERROR))
        sl_counter_add(sl_metric_series1(cache_m.store_errs, op), 1);
}

int cache_store(cache_worker_t *w, cache_req_t *q, int64_t now_ms)
{
    if (!cache_req_storing(q))
        return 0;
    unsigned taint = 0;
    cache_entry_t *e = cache_rec_finish(q->rec, &taint);
    if (!e) {
        cache_count2(cache_m.stores, q->model, cache_taint_name(taint));
        return 0;
    }
    e->stored_ms = now_ms;
    size_t len = 0;
    char *enc = cache_entry_encode(e, &len);
    cache_entry_free(e);
    if (!enc)
        return -1;
    int64_t expires = now_ms + q->pol.ttl_ms;
    int rc = 1;
    cache_t *c = q->c;
    if (!c->redis_url) {
        if (cache_lru_put(c->lru, q->key, enc, len, expires, q->model) != 0)
            rc = 0;
    } else if (w && w->redis) {
        char rkey[CACHE_RKEY_LEN], px[24];
        cache_redis_key(q->key, rkey);
        sl_i64toa(q->pol.ttl_ms, px);
        const char *argv[] = {"SET", rkey, enc, "PX", px};
        size_t argvlen[] = {3, strlen(rkey), len, 2, strlen(px)};
        if (!sl_redis_command(w->redis, 5, argv, argvlen, cache_set_cb, (void *)"set"))
            rc = 0;
    } else {
        rc = 0;
    }
    free(enc);
    cache_count2(cache_m.stores, q->model, rc == 1 ? "stored" : "store_failed");
    /* The semantic index names the exact key of the answer just stored. */
    if (rc == 1 && q->vec) {
        (void)cache_sem_add(c->sem, q->part, q->vec, q->dim, q->key, expires);
        size_t rlen = 0;
        char *recd = c->redis_url && w && w->redis
                         ? cache_sem_encode(q->part, q->vec, q->dim, q->key, expires, &rlen)
                         : NULL;
        if (recd) {
            char maxlen[24];
            int64_t m = q->cc->semantic.max_entries * q->cc->semantic.max_partitions;
            sl_i64toa(m > CACHE_SEM_STREAM_MAX ? CACHE_SEM_STREAM_MAX : m, maxlen);
            const char *argv[] = {"XADD", CACHE_SEM_STREAM, "MAXLEN", "~", maxlen, "*", "e", recd};
            size_t argvlen[] = {4, strlen(CACHE_SEM_STREAM), 6, 1, strlen(maxlen), 1, 1, rlen};
            if (!sl_redis_command(w->redis, 8, argv, argvlen, cache_set_cb, (void *)"sem_add"))
                sl_counter_add(sl_metric_series1(cache_m.store_errs, "sem_add"), 1);
            free(recd);
        }
    }
    return rc;
}
