/* Unit tests of the balancer: smooth weighted round-robin spreads picks in
 * proportion to weights without bunching, skips ejected servers, and
 * least-connections prefers the lowest active/weight with rotating ties. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "conf/conf.h"
#include "gateway/gw_balance.h"

static void setup_items(gw_balance_item_t *it, int *cur, const int *w, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        cur[i] = 0;
        it[i].weight = w[i];
        it[i].active = 0;
        it[i].eligible = true;
        it[i].current = &cur[i];
    }
}

static void test_rr_weights(void **state)
{
    (void)state;
    gw_balance_item_t it[3];
    int cur[3];
    const int w[3] = {5, 1, 1};
    setup_items(it, cur, w, 3);
    char seq[8] = {0};
    int counts[3] = {0};
    for (int i = 0; i < 7; i++) {
        int k = gw_balance_pick(it, 3, CONF_BALANCE_ROUND_ROBIN, 0);
        assert_true(k >= 0 && k < 3);
        seq[i] = (char)('a' + k);
        counts[k]++;
    }
    /* smooth: the heavy server never gets more than 2 in a row here */
    assert_string_equal(seq, "aabacaa");
    assert_int_equal(counts[0], 5);
    assert_int_equal(counts[1], 1);
    assert_int_equal(counts[2], 1);
    /* over many rounds the proportions hold exactly */
    memset(counts, 0, sizeof(counts));
    for (int i = 0; i < 700; i++)
        counts[gw_balance_pick(it, 3, CONF_BALANCE_ROUND_ROBIN, 0)]++;
    assert_int_equal(counts[0], 500);
    assert_int_equal(counts[1], 100);
    assert_int_equal(counts[2], 100);
}

static void test_rr_skips_ejected(void **state)
{
    (void)state;
    gw_balance_item_t it[3];
    int cur[3];
    const int w[3] = {1, 1, 1};
    setup_items(it, cur, w, 3);
    it[1].eligible = false;
    int counts[3] = {0};
    for (int i = 0; i < 100; i++)
        counts[gw_balance_pick(it, 3, CONF_BALANCE_ROUND_ROBIN, 0)]++;
    assert_int_equal(counts[1], 0);
    assert_int_equal(counts[0], 50);
    assert_int_equal(counts[2], 50);
    it[0].eligible = it[2].eligible = false;
    assert_int_equal(gw_balance_pick(it, 3, CONF_BALANCE_ROUND_ROBIN, 0), -1);
    assert_int_equal(gw_balance_pick(it, 0, CONF_BALANCE_ROUND_ROBIN, 0), -1);
}

static void test_least_conn(void **state)
{
    (void)state;
    gw_balance_item_t it[3];
    int cur[3];
    const int w[3] = {1, 2, 1};
    setup_items(it, cur, w, 3);
    it[0].active = 3;
    it[1].active = 4; /* 4/2 = 2 per weight: the least loaded */
    it[2].active = 3;
    for (uint64_t t = 0; t < 6; t++)
        assert_int_equal(gw_balance_pick(it, 3, CONF_BALANCE_LEAST_CONN, t), 1);
    /* ties rotate with the tie-break value */
    it[1].active = 6;
    int seen[3] = {0};
    for (uint64_t t = 0; t < 6; t++)
        seen[gw_balance_pick(it, 3, CONF_BALANCE_LEAST_CONN, t)]++;
    assert_true(seen[0] > 0 && seen[1] > 0 && seen[2] > 0);
    it[1].eligible = false;
    it[0].active = 0;
    assert_int_equal(gw_balance_pick(it, 3, CONF_BALANCE_LEAST_CONN, 2), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rr_weights),
        cmocka_unit_test(test_rr_skips_ejected),
        cmocka_unit_test(test_least_conn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
