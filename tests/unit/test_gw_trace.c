/*
 * test_gw_trace.c — the W3C traceparent parse (gateway/trace.c): every rule
 * of the spec that makes a header invalid, the versions after 00, and the
 * header sluice writes parsing back to the same trace id.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

/* The ids and parent ids are written 8 digits a step (trace.c): every
 * nibble value at every position, against printf's %016llx. */
static void test_hex_against_printf(void **state)
{
    (void)state;
    char tid[33], out[GW_TRACEPARENT_LEN + 1], want[80];
    uint64_t x = 0x243f6a8885a308d3ull;
    for (int i = 0; i < 20000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t hi = x, lo = x ^ (x >> 29) * 0x9e3779b97f4a7c15ull;
        if (i < 16) /* a nibble repeated: each value in every position */
            hi = lo = 0x1111111111111111ull * (uint64_t)i;
        if (hi == 0 && lo == 0)
            continue;
        gw_trace_new_id(tid, hi, lo);
        snprintf(want, sizeof(want), "%016llx%016llx", (unsigned long long)hi,
                 (unsigned long long)lo);
        assert_string_equal(tid, want);
        gw_trace_format(out, sizeof(out), tid, lo | 1, 0x5a);
        snprintf(want, sizeof(want), "00-%s-%016llx-5a", tid, (unsigned long long)(lo | 1));
        assert_string_equal(out, want);
        /* the request id's 16 digits (conn.c), zero included */
        char id[17];
        uint64_t v = i == 16 ? 0 : x;
        gw_trace_put_hex16(id, v);
        id[16] = '\0';
        snprintf(want, sizeof(want), "%016llx", (unsigned long long)v);
        assert_string_equal(id, want);
    }
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

static void *random_thread(void *arg)
{
    gw_trace_random(arg, 4);
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The per-thread generator: no repeats in a long run, and each thread seeds
 * its own (two workers must not hand out the same ids). */
static void test_random_unique(void **state)
{
    (void)state;
    enum { N = 20000 };
    uint64_t *v = malloc(N * sizeof(*v));
    assert_non_null(v);
    gw_trace_random(v, N);
    qsort(v, N, sizeof(*v), cmp_u64);
    for (size_t i = 1; i < N; i++)
        assert_true(v[i] != v[i - 1]);
    free(v);
    uint64_t t1[4], t2[4];
    pthread_t a, b;
    assert_int_equal(pthread_create(&a, NULL, random_thread, t1), 0);
    assert_int_equal(pthread_create(&b, NULL, random_thread, t2), 0);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    assert_memory_not_equal(t1, t2, sizeof(t1));
    /* the hand-written format: every flag value, span at its widest */
    char out[GW_TRACEPARENT_LEN + 1];
    gw_trace_format(out, sizeof(out), TID, UINT64_MAX, 0xff);
    assert_string_equal(out, "00-" TID "-ffffffffffffffff-ff");
    char small[8] = "xxxxxxx";
    gw_trace_format(small, sizeof(small), TID, 1, 0);
    assert_string_equal(small, ""); /* too small: empty, never overrun */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_format_round_trip),
        cmocka_unit_test(test_hex_against_printf),
        cmocka_unit_test(test_random_unique),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
