/*
 * test_model_pool.c — the compute pool runs every item exactly once per
 * dispatch, whatever the thread count, across many back-to-back dispatches
 * (the claim protocol must never let a late helper run an item of a
 * finished or later job), and the share form keeps its contract.
 */
#include "model/pool_internal.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

typedef struct {
    int n;
    _Atomic int hits[4096];
    _Atomic int bad_tid;
    int nth;
} items_t;

static void count_item(void *arg, int item, int tid)
{
    items_t *t = arg;
    if (tid < 0 || tid >= t->nth || item < 0 || item >= t->n)
        atomic_fetch_add(&t->bad_tid, 1);
    else
        atomic_fetch_add(&t->hits[item], 1);
}

static void run_many(int nth)
{
    mdl_pool_t *p = mdl_pool_new(nth);
    assert_non_null(p);
    assert_int_equal(mdl_pool_size(p), nth);
    static items_t t;
    for (int rep = 0; rep < 3000; rep++) {
        memset(&t, 0, sizeof(t));
        t.nth = nth;
        t.n = 1 + (rep * 37) % 4096;
        mdl_pool_run_items(p, count_item, &t, t.n);
        assert_int_equal(atomic_load(&t.bad_tid), 0);
        for (int i = 0; i < t.n; i++)
            if (atomic_load(&t.hits[i]) != 1)
                fail_msg("dispatch %d: item %d of %d ran %d times", rep, i, t.n,
                         atomic_load(&t.hits[i]));
    }
    mdl_pool_stats_t st;
    mdl_pool_stats(p, &st);
    if (nth > 1)
        assert_true(st.caller_items + st.helper_items > 0 || st.solo_dispatches > 0);
    mdl_pool_free(p);
}

static void test_items_once_1(void **state)
{
    (void)state;
    run_many(1);
}

static void test_items_once_2(void **state)
{
    (void)state;
    run_many(2);
}

static void test_items_once_4(void **state)
{
    /* more threads than cores: helpers are descheduled all the time */
    (void)state;
    run_many(4);
}

typedef struct {
    _Atomic int seen[8];
    int nth_seen;
} shares_t;

static void count_share(void *arg, int ith, int nth)
{
    shares_t *s = arg;
    s->nth_seen = nth;
    atomic_fetch_add(&s->seen[ith], 1);
}

static void test_shares(void **state)
{
    (void)state;
    mdl_pool_t *p = mdl_pool_new(3);
    assert_non_null(p);
    for (int rep = 0; rep < 200; rep++) {
        shares_t s;
        memset(&s, 0, sizeof(s));
        mdl_pool_run(p, count_share, &s);
        assert_int_equal(s.nth_seen, 3);
        for (int i = 0; i < 3; i++)
            assert_int_equal(atomic_load(&s.seen[i]), 1);
    }
    mdl_pool_free(p);
    shares_t s;
    memset(&s, 0, sizeof(s));
    mdl_pool_run(NULL, count_share, &s); /* NULL pool: inline, one share */
    assert_int_equal(s.nth_seen, 1);
    assert_int_equal(atomic_load(&s.seen[0]), 1);
    mdl_pool_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_items_once_1),
        cmocka_unit_test(test_items_once_2),
        cmocka_unit_test(test_items_once_4),
        cmocka_unit_test(test_shares),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
