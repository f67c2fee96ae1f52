/*
 * Exactness under concurrency: 200 threads released at once against one
 * user's limit of 10 (requests a minute, in-flight slots, a token budget)
 * let exactly 10 through, round after round.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>

#include "conf/conf.h"
#include "ratelimit/ratelimit.h"

#define NTHREADS 200

typedef struct race {
    rl_t *rl;
    const char *user;
    int64_t tokens;
    pthread_barrier_t go, hold;
    _Atomic int allowed;
} race_t;

static void *racer(void *arg)
{
    race_t *r = arg;
    rl_request_t req = {.user = r->user, .tokens = r->tokens};
    rl_decision_t d;
    rl_ticket_t *t = NULL;
    /* a worker handle per thread, as in the gateway (a handle keeps its
     * settled tickets for reuse: one thread's only); the in-process store
     * behind them is the shared one that must stay exact */
    char err[128];
    rl_worker_t *w = rl_worker_new(r->rl, NULL, err, sizeof(err));
    pthread_barrier_wait(&r->go);
    rl_check_rc_t rc = w ? rl_check(w, &req, &d, &t, NULL, NULL, NULL) : RL_ERROR;
    if (rc == RL_DONE && d.allowed)
        atomic_fetch_add(&r->allowed, 1);
    /* hold tickets until every thread has checked (in-flight slots) */
    pthread_barrier_wait(&r->hold);
    rl_ticket_settle(t, r->tokens);
    rl_worker_free(w);
    return NULL;
}

static int run_race(const conf_ratelimit_t *c, const char *user, int64_t tokens)
{
    char err[128];
    rl_t *rl = rl_new(c, NULL, err, sizeof(err));
    assert_non_null(rl);
    race_t r = {.rl = rl, .user = user, .tokens = tokens};
    pthread_barrier_init(&r.go, NULL, NTHREADS);
    pthread_barrier_init(&r.hold, NULL, NTHREADS);
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, racer, &r), 0);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&r.go);
    pthread_barrier_destroy(&r.hold);
    rl_free(rl);
    return atomic_load(&r.allowed);
}

static conf_ratelimit_t zero_conf(void)
{
    conf_ratelimit_t c;
    memset(&c, 0, sizeof(c));
    c.max_tokens = 2048;
    c.max_keys = 100000;
    return c;
}

static void test_requests_race(void **state)
{
    (void)state;
    conf_ratelimit_t c = zero_conf();
    c.per_user.requests_per_minute = 10;
    for (int round = 0; round < 5; round++)
        assert_int_equal(run_race(&c, "racer", 0), 10);
}

static void test_concurrent_race(void **state)
{
    (void)state;
    conf_ratelimit_t c = zero_conf();
    c.per_user.concurrent = 10;
    for (int round = 0; round < 5; round++)
        assert_int_equal(run_race(&c, "racer", 0), 10);
}

static void test_tokens_race(void **state)
{
    (void)state;
    conf_ratelimit_t c = zero_conf();
    c.per_user.tokens_per_minute = 1000;
    for (int round = 0; round < 5; round++)
        assert_int_equal(run_race(&c, "racer", 100), 10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_requests_race),
        cmocka_unit_test(test_concurrent_race),
        cmocka_unit_test(test_tokens_race),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
