/*
 * The Redis queue's clock estimate (fallback/qclock.c): from replies that
 * carry Redis's TIME, where Redis's clock stands against sluice's, and the
 * accept deadline in Redis's clock. Injected times throughout; Redis's
 * clock skewed both ways (an hour behind, seconds ahead), read anywhere in
 * the round trip, drifting at the bound: the deadline given must never be
 * later than where Redis's clock truly is when sluice's deadline passes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fallback/fb_internal.h"

#define S     1000000LL        /* µs */
#define EPOCH (1764763200 * S) /* Redis reads a wall clock; ours is monotonic */

static void test_unknown_refuses(void **state)
{
    (void)state;
    fb_qclock_t c = {0};
    int64_t d = 42;
    assert_int_equal(fb_qclock_deadline(&c, 10 * S, 1000, &d), -1);
    assert_int_equal(d, 42);
    assert_true(fb_qclock_err(&c, 10 * S) == INT64_MAX);
}

static void test_offset_is_time_minus_midpoint(void **state)
{
    (void)state;
    fb_qclock_t c = {0};
    /* Redis 5 s ahead, read at the midpoint of a 400 µs round trip. */
    fb_qclock_sample(&c, 100 * S, 100 * S + 400, 105 * S + 200);
    assert_true(c.known);
    assert_int_equal(c.off_us, 5 * S);
    assert_int_equal(c.err_us, 200);
    assert_int_equal(c.at_us, 100 * S + 200);
    /* 50 ms later: the bound has grown by the drift (1000 ppm: 50 µs). */
    int64_t d;
    assert_int_equal(fb_qclock_deadline(&c, 100 * S + 200 + 50000, 1000, &d), 0);
    assert_int_equal(d, 100 * S + 200 + 50000 + 5 * S - 200 - 50 - 1000);
    assert_int_equal(fb_qclock_err(&c, 100 * S + 200 + 10 * S), 200 + 10000);
}

/* Wherever in [send, recv] Redis read its clock and whichever way the two
 * clocks drift (at the bound), the deadline plus the margin is at or below
 * Redis's true clock once sluice's reaches local. */
static void check_never_late(int64_t send, int64_t true_off)
{
    const int64_t rtts[] = {0, 1, 150, 3000, 40000};
    const int64_t ages[] = {0, 1000, 50000, S, 12 * S};
    for (size_t i = 0; i < sizeof(rtts) / sizeof(rtts[0]); i++) {
        int64_t recv = send + rtts[i];
        for (int where = 0; where < 3; where++) {
            int64_t read_at = where == 0 ? send : where == 1 ? send + rtts[i] / 3 : recv;
            fb_qclock_t c = {0};
            fb_qclock_sample(&c, send, recv, read_at + true_off);
            for (size_t j = 0; j < sizeof(ages) / sizeof(ages[0]); j++) {
                for (int sign = -1; sign <= 1; sign += 2) {
                    int64_t local = recv + ages[j];
                    /* Redis's clock at local, drifted at the bound since
                     * the read, rounded against us. */
                    int64_t drift = ((local - read_at) * FB_QCLOCK_DRIFT_PPM) / 1000000;
                    int64_t truth = local + true_off + sign * drift;
                    int64_t d;
                    assert_int_equal(fb_qclock_deadline(&c, local, 1000, &d), 0);
                    assert_true(d + 1000 <= truth);
                    /* and not wastefully early: within the bounds' width */
                    assert_true(truth - (d + 1000) <= rtts[i] + 2 * drift + 2);
                }
            }
        }
    }
}

static void test_redis_behind_by_an_hour(void **state)
{
    (void)state;
    check_never_late(7 * S, EPOCH - 3600 * S);
    /* and behind ours outright (a negative offset) */
    check_never_late(EPOCH, -3600 * S);
}

static void test_redis_ahead_by_seconds(void **state)
{
    (void)state;
    check_never_late(7 * S, EPOCH + 7 * S + 123);
    check_never_late(EPOCH, 7 * S + 123);
}

static void test_no_skew(void **state)
{
    (void)state;
    check_never_late(7 * S, EPOCH);
    check_never_late(EPOCH, 0);
}

static void test_tighter_sample_kept(void **state)
{
    (void)state;
    fb_qclock_t c = {0};
    fb_qclock_sample(&c, 10 * S, 10 * S + 100, 10 * S + 50 + 2 * S); /* err 50 */
    fb_qclock_t before = c;
    /* A looser sample that agrees does not replace it... */
    fb_qclock_sample(&c, 11 * S, 11 * S + 20000, 11 * S + 10000 + 2 * S);
    assert_int_equal(c.err_us, before.err_us);
    assert_int_equal(c.at_us, before.at_us);
    /* ...a tighter one does (the old one has aged: 50 + 1000 µs of drift at 11 s). */
    fb_qclock_sample(&c, 20 * S, 20 * S + 400, 20 * S + 200 + 2 * S);
    assert_int_equal(c.err_us, 200);
    assert_int_equal(c.at_us, 20 * S + 200);
    assert_int_equal(c.off_us, 2 * S);
}

static void test_stepped_clock_replaces(void **state)
{
    (void)state;
    fb_qclock_t c = {0};
    fb_qclock_sample(&c, 10 * S, 10 * S + 100, 10 * S + 50 + 2 * S);
    /* Redis's clock stepped back 1 s: a looser sample outside the bounds
     * is believed, or accepts would get deadlines Redis reaches 1 s late. */
    fb_qclock_sample(&c, 10 * S + 1000, 10 * S + 21000, 10 * S + 11000 + S);
    assert_int_equal(c.off_us, S);
    assert_int_equal(c.err_us, 10000);
    int64_t d;
    assert_int_equal(fb_qclock_deadline(&c, 11 * S, 0, &d), 0);
    assert_true(d <= 11 * S + S);
}

static void test_bad_samples_ignored(void **state)
{
    (void)state;
    fb_qclock_t c = {0};
    fb_qclock_sample(&c, 10 * S, 10 * S - 1, 20 * S); /* answered before asked */
    fb_qclock_sample(&c, 10 * S, 10 * S + 5, 0);      /* no TIME in the reply */
    assert_false(c.known);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_refuses),
        cmocka_unit_test(test_offset_is_time_minus_midpoint),
        cmocka_unit_test(test_redis_behind_by_an_hour),
        cmocka_unit_test(test_redis_ahead_by_seconds),
        cmocka_unit_test(test_no_skew),
        cmocka_unit_test(test_tighter_sample_kept),
        cmocka_unit_test(test_stepped_clock_replaces),
        cmocka_unit_test(test_bad_samples_ignored),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
