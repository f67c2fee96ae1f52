/*
 * test_gw_trace.c — the W3C traceparent parse (gateway/trace.c): every rule
 * of the spec that makes a header invalid, the versions after 00, and the
 * header sluice writes parsing back to the same trace id.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gateway/gw_trace.h"

#define TID "4bf92f3577b34da6a3ce929d0e0e4736"

static bool parse(const char *v, char tid[33], uint8_t *flags)
{
    return gw_trace_parse(v, strlen(v), tid, flags);
}

static void test_valid(void **state)
{
    (void)state;
    char tid[33];
    uint8_t flags = 0;
    assert_true(parse("00-" TID "-00f067aa0ba902b7-01", tid, &flags));
    assert_string_equal(tid, TID);
    assert_int_equal(flags, 1);
    assert_true(parse("00-" TID "-00f067aa0ba902b7-ff", tid, &flags));
    assert_int_equal(flags, 0xff);
    /* a later version may add fields after a dash */
    assert_true(parse("01-" TID "-00f067aa0ba902b7-00-whatever", tid, &flags));
    assert_int_equal(flags, 0);
    assert_true(parse("cc-" TID "-00f067aa0ba902b7-01", tid, &flags));
}

static void test_invalid(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",
        "00",
        "00-" TID "-00f067aa0ba902b7-0",                           /* short */
        "00-" TID "-00f067aa0ba902b7-01-",                         /* 00 is exactly 55 */
        "00-" TID "-00f067aa0ba902b7-01x",                         /* 00 is exactly 55 */
        "01-" TID "-00f067aa0ba902b7-01x",                         /* after 55: only "-" */
        "ff-" TID "-00f067aa0ba902b7-01",                          /* version ff */
        "0g-" TID "-00f067aa0ba902b7-01",                          /* version not hex */
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", /* upper case */
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01", /* zero trace */
        "00-" TID "-0000000000000000-01",                          /* zero parent */
        "00-" TID "-00f067aa0ba902b7-0z",                          /* flags not hex */
        "00_" TID "-00f067aa0ba902b7-01",                          /* separators */
        "00-" TID "_00f067aa0ba902b7-01",
        "00-" TID "-00f067aa0ba902b7_01",
        "00-4bf92f3577b34da6a3ce929d0e0e473-x00f067aa0ba902b7-01", /* misplaced dash */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char tid[33] = "unchanged";
        uint8_t flags = 7;
        if (parse(bad[i], tid, &flags))
            fail_msg("accepted: %s", bad[i]);
    }
    char tid[33];
    uint8_t flags;
    assert_false(gw_trace_parse(NULL, 0, tid, &flags));
}

static void test_format_round_trip(void **state)
{
    (void)state;
    char tid[33], out[GW_TRACEPARENT_LEN + 1], back[33];
    uint8_t flags = 0;
    gw_trace_new_id(tid, 0x0123456789abcdefull, 0xfedcba9876543210ull);
    assert_string_equal(tid, "0123456789abcdeffedcba9876543210");
    gw_trace_format(out, sizeof(out), tid, 0xabcull, 1);
    assert_string_equal(out, "00-0123456789abcdeffedcba9876543210-0000000000000abc-01");
    assert_true(parse(out, back, &flags));
    assert_string_equal(back, tid);
    assert_int_equal(flags, 1);
    /* zero words never make an invalid id */
    gw_trace_new_id(tid, 0, 0);
    gw_trace_format(out, sizeof(out), tid, 0, 0);
    assert_true(parse(out, back, &flags));
    /* random words differ */
    uint64_t a[2] = {0, 0}, b[2] = {0, 0};
    gw_trace_random(a, 2);
    gw_trace_random(b, 2);
    assert_true(a[0] != b[0] || a[1] != b[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_format_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
