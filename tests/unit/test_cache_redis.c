/*
 * Unit tests of cache/ against a real redis-server started by the test:
 * two cache instances (two cache_t, as two sluice processes) share answers
 * through Redis, the TTL is Redis's PX, the semantic index is persisted on
 * the stream and loaded / tailed by the other instance (and by one started
 * later), a cancelled lookup never calls back, and Redis down is a miss
 * (counted), never an error. Waits run the event loop until a condition
 * holds or a deadline passes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cache/cache.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/redis.h"
#include "tests/unit/redis_server.h"

static rs_server_t srv;
static struct event_base *base;

static const char *answer_json =
    "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1700000000,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"shared "
    "answer\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5,"
    "\"completion_tokens\":2,\"total_tokens\":7}}";

static conf_t *load_conf(void)
{
    char yaml[1024], err[256];
    snprintf(yaml, sizeof(yaml),
             "listen: [{address: \"127.0.0.1:1\"}]\n"
             "upstreams: {u: {servers: [{url: \"http://127.0.0.1:2\"}]}}\n"
             "models: {chat: {upstream: u, cache: {semantic: on}}, emb: {upstream: u}}\n"
             "redis: {url: \"redis://127.0.0.1:%d\", timeout: 200ms}\n"
             "cache: {enabled: true, ttl: 30s, scope: global, semantic: {embed_model: emb}}\n",
             srv.port);
    conf_t *c = conf_load_string(yaml, strlen(yaml), "t.yaml", err, sizeof(err));
    if (!c)
        fail_msg("%s", err);
    return c;
}

typedef struct inst {
    cache_t *c;
    cache_worker_t *w;
} inst_t;

static void inst_new(inst_t *i, const conf_t *conf)
{
    char err[256];
    i->c = cache_new(conf, err, sizeof(err));
    assert_non_null(i->c);
    assert_true(cache_uses_redis(i->c));
    i->w = cache_worker_new(i->c, base, err, sizeof(err));
    assert_non_null(i->w);
}

static void inst_free(inst_t *i)
{
    cache_worker_free(i->w);
    cache_free(i->c);
}

typedef struct done {
    int calls;
    cache_state_t state;
} done_t;

static void done_cb(void *arg, cache_req_t *q)
{
    done_t *d = arg;
    d->calls++;
    d->state = cache_req_state(q);
}

static bool done_yet(void *arg)
{
    return ((done_t *)arg)->calls > 0;
}

static cache_req_t *mkreq(inst_t *i, const conf_t *conf, const char *text)
{
    char body[512];
    snprintf(body, sizeof(body),
             "{\"model\":\"chat\",\"temperature\":0,\"messages\":[{\"role\":\"user\","
             "\"content\":\"%s\"}]}",
             text);
    json_t *j = json_loads(body, 0, NULL);
    cache_req_in_t in = {.conf = conf, .body = j, .model = "chat", .sub = "alice"};
    cache_req_t *q = cache_req_new(i->c, &in);
    json_decref(j);
    assert_non_null(q);
    return q;
}

/* Runs a lookup to its end; returns the state. */
static cache_state_t lookup(inst_t *i, cache_req_t *q, int64_t now)
{
    done_t d = {0};
    cache_rc_t rc = cache_lookup(i->w, q, now, done_cb, &d);
    if (rc == CACHE_DONE)
        return cache_req_state(q);
    assert_int_equal(rc, CACHE_PENDING);
    assert_int_equal(d.calls, 0);
    assert_true(rs_run_until(base, done_yet, &d, 2000));
    assert_int_equal(d.calls, 1);
    return d.state;
}

static bool key_exists(void *arg)
{
    redisReply *r = rs_cmd(&srv, "DBSIZE");
    bool ok = r && r->type == REDIS_REPLY_INTEGER && r->integer >= *(long long *)arg;
    freeReplyObject(r);
    return ok;
}

typedef struct semwait {
    cache_t *c;
    size_t n;
} semwait_t;

static bool sem_has(void *arg)
{
    semwait_t *s = arg;
    return cache_sem_count(cache_semantic(s->c)) >= s->n;
}

static uint64_t store_errs(const char *op)
{
    sl_metric_t *m =
        sl_metric_register("sluice_cache_store_errors_total", "", SL_METRIC_COUNTER, "op", NULL, 0);
    return sl_counter_value(sl_metric_series1(m, op));
}

static int setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    sl_log_set_level(SL_LOG_ERROR);
    memset(&srv, 0, sizeof(srv));
    rs_start(&srv);
    base = event_base_new();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    event_base_free(base);
    rs_cleanup(&srv);
    return 0;
}

static void test_shared(void **state)
{
    (void)state;
    conf_t *conf = load_conf();
    inst_t a, b;
    inst_new(&a, conf);
    inst_new(&b, conf);
    int64_t now = sl_wall_ms();

    cache_req_t *q = mkreq(&a, conf, "hi there");
    assert_int_equal(lookup(&a, q, now), CACHE_MISS);
    json_t *ans = json_loads(answer_json, 0, NULL);
    cache_req_record_body(q, ans);
    json_decref(ans);
    assert_int_equal(cache_store(a.w, q, now), 1);
    cache_req_free(q);
    long long one = 1;
    assert_true(rs_run_until(base, key_exists, &one, 2000));

    /* the other instance gets it, as a stream too */
    q = mkreq(&b, conf, "hi   there");
    assert_int_equal(lookup(&b, q, now + 3000), CACHE_HIT);
    assert_int_equal(cache_req_age_s(q, now + 3000), 3);
    assert_string_equal(cache_entry_content(cache_req_entry(q), 0), "shared answer");
    size_t len;
    char *sse = cache_entry_sse_body(cache_req_entry(q), NULL, &len);
    assert_non_null(strstr(sse, "\"content\":\"shared answer\""));
    free(sse);
    cache_req_free(q);

    /* Redis keeps it ttl (30 s) */
    redisReply *keys = rs_cmd(&srv, "KEYS sluice:cache:*");
    assert_int_equal(keys->elements, 1);
    redisReply *ttl = rs_cmd(&srv, "PTTL %s", keys->element[0]->str);
    assert_true(ttl->integer > 25000 && ttl->integer <= 30000);
    freeReplyObject(ttl);
    /* expiry in Redis is a miss */
    redisReply *del = rs_cmd(&srv, "PEXPIRE %s 1", keys->element[0]->str);
    freeReplyObject(del);
    freeReplyObject(keys);
    long long zero = 0;
    (void)zero;
    q = mkreq(&b, conf, "hi there");
    int64_t t0 = sl_now_ms();
    cache_state_t st;
    do { /* Redis expires on access after 1 ms */
        cache_req_free(q);
        q = mkreq(&b, conf, "hi there");
        st = lookup(&b, q, now);
    } while (st == CACHE_HIT && sl_now_ms() - t0 < 1000);
    assert_int_equal(st, CACHE_MISS);
    cache_req_free(q);

    /* a garbage value under the key is a miss, not a crash */
    q = mkreq(&b, conf, "garbage");
    char rkey[128] = "sluice:cache:";
    sl_hex(cache_req_key(q), 32, rkey + strlen(rkey));
    redisReply *set = rs_cmd(&srv, "SET %s {\"choices\":7}", rkey);
    freeReplyObject(set);
    assert_int_equal(lookup(&b, q, now), CACHE_MISS);
    cache_req_free(q);

    /* cancelled: the callback never runs */
    q = mkreq(&b, conf, "hi there");
    done_t d = {0};
    assert_int_equal(cache_lookup(b.w, q, now, done_cb, &d), CACHE_PENDING);
    cache_req_free(q); /* cancels */
    rs_run_for(base, 50);
    assert_int_equal(d.calls, 0);

    inst_free(&a);
    inst_free(&b);
    conf_free(conf);
}

static void test_semantic_shared(void **state)
{
    (void)state;
    redisReply *fl = rs_cmd(&srv, "FLUSHALL");
    freeReplyObject(fl);
    conf_t *conf = load_conf();
    inst_t a, b;
    inst_new(&a, conf);
    inst_new(&b, conf);
    int64_t now = sl_wall_ms();
    const char *e1 = "{\"data\":[{\"embedding\":[1,0,0,0]}]}";
    const char *e2 = "{\"data\":[{\"embedding\":[0.97,0.2431,0,0]}]}";

    cache_req_t *q = mkreq(&a, conf, "What is sluice?");
    assert_int_equal(lookup(&a, q, now), CACHE_MISS);
    assert_true(cache_req_semantic(q));
    assert_int_equal(cache_req_embed_answer(q, e1, strlen(e1)), 0);
    assert_int_equal(lookup(&a, q, now), CACHE_MISS);
    json_t *ans = json_loads(answer_json, 0, NULL);
    cache_req_record_body(q, ans);
    json_decref(ans);
    assert_int_equal(cache_store(a.w, q, now), 1);
    cache_req_free(q);

    /* b tails the stream and has the vector */
    semwait_t sw = {b.c, 1};
    assert_true(rs_run_until(base, sem_has, &sw, 3000));
    q = mkreq(&b, conf, "what's sluice");
    assert_int_equal(lookup(&b, q, now), CACHE_MISS);
    assert_int_equal(cache_req_embed_answer(q, e2, strlen(e2)), 0);
    assert_int_equal(lookup(&b, q, now), CACHE_HIT);
    assert_string_equal(cache_entry_content(cache_req_entry(q), 0), "shared answer");
    cache_req_free(q);

    /* an instance started later loads it from the start */
    inst_t c;
    inst_new(&c, conf);
    sw.c = c.c;
    assert_true(rs_run_until(base, sem_has, &sw, 3000));
    inst_free(&c);

    inst_free(&a);
    inst_free(&b);
    conf_free(conf);
}

static void test_redis_down(void **state)
{
    (void)state;
    conf_t *conf = load_conf();
    inst_t a;
    inst_new(&a, conf);
    rs_kill(&srv);
    uint64_t before = store_errs("get");
    int64_t now = sl_wall_ms();
    for (int i = 0; i < 3; i++) {
        cache_req_t *q = mkreq(&a, conf, "hi there");
        int64_t t0 = sl_now_ms();
        assert_int_equal(lookup(&a, q, now), CACHE_MISS);
        assert_true(sl_now_ms() - t0 < 1000); /* bounded by the deadline, not hanging */
        json_t *ans = json_loads(answer_json, 0, NULL);
        cache_req_record_body(q, ans);
        json_decref(ans);
        assert_true(cache_store(a.w, q, now) >= 0); /* fire and forget: no error */
        cache_req_free(q);
    }
    assert_int_equal(store_errs("get"), before + 3);
    rs_run_for(base, 50);
    inst_free(&a);
    rs_start(&srv);
    conf_free(conf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared),
        cmocka_unit_test(test_semantic_shared),
        cmocka_unit_test(test_redis_down),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
