/* Unit tests of the metrics registry: values, label escaping, histogram
 * buckets, the series cap, re-registration returning the same metric, `le`
 * labels in their shortest exact form, and promtool's lint of the output. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/metrics.h"

static char *render(void)
{
    size_t n = 0;
    char *t = sl_metrics_render(&n);
    assert_non_null(t);
    assert_int_equal(strlen(t), n);
    return t;
}

static void test_counter_and_labels(void **state)
{
    (void)state;
    sl_metric_t *m = sl_metric_register("t_requests_total", "Requests.", SL_METRIC_COUNTER,
                                        "route,code", NULL, 0);
    const char *v1[] = {"chat", "2xx"};
    const char *v2[] = {"we\"ird\\", "5xx"};
    sl_counter_add(sl_metric_series(m, v1), 3);
    sl_counter_add(sl_metric_series(m, v1), 2);
    sl_counter_add(sl_metric_series(m, v2), 1);
    assert_ptr_equal(sl_metric_series(m, v1), sl_metric_series(m, v1));
    assert_int_equal(sl_counter_value(sl_metric_series(m, v1)), 5);
    assert_ptr_equal(
        m, sl_metric_register("t_requests_total", "x", SL_METRIC_COUNTER, "route,code", NULL, 0));
    char *t = render();
    assert_non_null(strstr(t, "# TYPE t_requests_total counter\n"));
    assert_non_null(strstr(t, "t_requests_total{route=\"chat\",code=\"2xx\"} 5\n"));
    assert_non_null(strstr(t, "t_requests_total{route=\"we\\\"ird\\\\\",code=\"5xx\"} 1\n"));
    free(t);
}

static void test_gauge(void **state)
{
    (void)state;
    sl_mseries_t *g = sl_metric_series0(
        sl_metric_register("t_active", "Active.", SL_METRIC_GAUGE, NULL, NULL, 0));
    sl_gauge_add(g, 4);
    sl_gauge_add(g, -1);
    assert_int_equal(sl_gauge_value(g), 3);
    char *t = render();
    assert_non_null(strstr(t, "\nt_active 3\n"));
    free(t);
}

static void test_histogram(void **state)
{
    (void)state;
    static const double b[] = {0.1, 1, 10};
    sl_mseries_t *h = sl_metric_series1(
        sl_metric_register("t_dur_seconds", "Duration.", SL_METRIC_HISTOGRAM, "route", b, 3),
        "chat");
    sl_histogram_observe(h, 0.05);
    sl_histogram_observe(h, 0.1); /* le is inclusive */
    sl_histogram_observe(h, 5);
    sl_histogram_observe(h, 50);
    assert_int_equal(sl_histogram_count(h), 4);
    char *t = render();
    assert_non_null(strstr(t, "t_dur_seconds_bucket{route=\"chat\",le=\"0.1\"} 2\n"));
    assert_non_null(strstr(t, "t_dur_seconds_bucket{route=\"chat\",le=\"1\"} 2\n"));
    assert_non_null(strstr(t, "t_dur_seconds_bucket{route=\"chat\",le=\"10\"} 3\n"));
    assert_non_null(strstr(t, "t_dur_seconds_bucket{route=\"chat\",le=\"+Inf\"} 4\n"));
    assert_non_null(strstr(t, "t_dur_seconds_sum{route=\"chat\"} 55.15\n"));
    assert_non_null(strstr(t, "t_dur_seconds_count{route=\"chat\"} 4\n"));
    free(t);
}

static void test_series_cap(void **state)
{
    (void)state;
    sl_metric_t *m =
        sl_metric_register("t_capped_total", "Capped.", SL_METRIC_COUNTER, "k", NULL, 0);
    char v[32];
    for (int i = 0; i < SL_METRIC_MAX_SERIES + 50; i++) {
        snprintf(v, sizeof(v), "v%d", i);
        sl_counter_add(sl_metric_series1(m, v), 1);
    }
    sl_mseries_t *o = sl_metric_series1(m, "another");
    assert_int_equal(sl_counter_value(o), 50 + 0);
    char *t = render();
    assert_non_null(strstr(t, "t_capped_total{k=\"_overflow\"} 50\n"));
    assert_null(strstr(t, "k=\"v512\""));
    free(t);
}

/* The shortest form: reads back to the same double, and one digit fewer
 * does not. */
static void assert_shortest(const char *txt, double want)
{
    char *end = NULL;
    double got = strtod(txt, &end);
    assert_true(end && *end == '\0');
    assert_true(got == want);
    const char *e = strpbrk(txt, "eE");
    /* significant digits: from the first non-zero one to the last */
    size_t digits = 0, upto_nonzero = 0;
    for (const char *p = txt; *p && p != e; p++) {
        if ((*p >= '1' && *p <= '9') || (digits > 0 && *p == '0'))
            digits++;
        if (*p >= '1' && *p <= '9')
            upto_nonzero = digits;
    }
    digits = upto_nonzero;
    if (digits > 1) {
        char shorter[400];
        snprintf(shorter, sizeof(shorter), "%.*g", (int)digits - 1, want);
        assert_false(strtod(shorter, NULL) == want);
    }
}

static void test_format_double(void **state)
{
    (void)state;
    static const struct {
        double d;
        const char *want;
    } cases[] = {
        {0.05, "0.05"},
        {0.1, "0.1"},
        {0.0025, "0.0025"},
        {1, "1"},
        {120, "120"},
        {2.5e-6, "2.5e-06"},
        {1e-6, "1e-06"},
        {0.075, "0.075"},
        {0.1 + 0.2, "0.30000000000000004"},
        {1.0 / 3, "0.3333333333333333"},
        {123456789, "123456789"},
        {-0.5, "-0.5"},
        {0, "0"},
    };
    char b[40];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        sl_metrics_format_double(b, sizeof(b), cases[i].d);
        assert_string_equal(b, cases[i].want);
        assert_shortest(b, cases[i].d);
    }
    sl_metrics_format_double(b, sizeof(b), INFINITY);
    assert_string_equal(b, "+Inf");
    sl_metrics_format_double(b, sizeof(b), -INFINITY);
    assert_string_equal(b, "-Inf");
    sl_metrics_format_double(b, sizeof(b), NAN);
    assert_string_equal(b, "NaN");
}

/* Every bucket set the project registers (the default, the filter's per-event
 * set, the LLM sets of docs/metrics.md) renders each bound as the decimal a
 * person writes in an SLO query. */
static void check_bounds(const char *name, const double *b, size_t n, const char *const *want)
{
    sl_mseries_t *h =
        sl_metric_series0(sl_metric_register(name, "Bounds.", SL_METRIC_HISTOGRAM, NULL, b, n));
    sl_histogram_observe(h, b[0]);
    char *t = render();
    size_t found = 0;
    char prefix[96];
    int plen = snprintf(prefix, sizeof(prefix), "%s_bucket{le=\"", name);
    for (const char *p = strstr(t, prefix); p; p = strstr(p + 1, prefix)) {
        const char *v = p + plen, *q = strchr(v, '"');
        assert_non_null(q);
        char le[40];
        assert_true((size_t)(q - v) < sizeof(le));
        memcpy(le, v, (size_t)(q - v));
        le[q - v] = '\0';
        if (strcmp(le, "+Inf") == 0)
            continue;
        assert_true(found < n);
        assert_string_equal(le, want[found]);
        assert_shortest(le, b[found]);
        found++;
    }
    assert_int_equal(found, n);
    free(t);
}

static void test_le_shortest(void **state)
{
    (void)state;
    static const char *const def[] = {"0.001", "0.0025", "0.005", "0.01", "0.025", "0.05",
                                      "0.1",   "0.25",   "0.5",   "1",    "2.5",   "5",
                                      "10",    "30",     "60",    "120"};
    assert_int_equal(sl_metrics_default_nbuckets, 16);
    check_bounds("t_default_seconds", sl_metrics_default_buckets, sl_metrics_default_nbuckets, def);
    /* filters/ruleset.c's per-event set */
    static const double ev[] = {1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5,
                                1e-4, 2.5e-4, 1e-3, 1e-2, 0.1};
    static const char *const evs[] = {"1e-06",  "2.5e-06", "5e-06", "1e-05", "2.5e-05", "5e-05",
                                      "0.0001", "0.00025", "0.001", "0.01",  "0.1"};
    check_bounds("t_event_seconds", ev, sizeof(ev) / sizeof(ev[0]), evs);
    static const char *const ttft[] = {"0.05", "0.1", "0.2", "0.3", "0.5", "0.75", "1",  "1.5", "2",
                                       "3",    "5",   "7.5", "10",  "15",  "20",   "30", "60"};
    assert_int_equal(sl_metrics_ttft_nbuckets, 17);
    check_bounds("t_ttft_seconds", sl_metrics_ttft_buckets, sl_metrics_ttft_nbuckets, ttft);
    static const char *const itl[] = {"0.005", "0.01", "0.02", "0.03", "0.05", "0.075", "0.1",
                                      "0.15",  "0.2",  "0.3",  "0.5",  "1",    "2",     "5"};
    assert_int_equal(sl_metrics_itl_nbuckets, 14);
    check_bounds("t_itl_seconds", sl_metrics_itl_buckets, sl_metrics_itl_nbuckets, itl);
    /* the series an SLO query selects exists under the short name */
    char *t = render();
    assert_non_null(strstr(t, "t_ttft_seconds_bucket{le=\"0.05\"} 1\n"));
    assert_null(strstr(t, "0000000"));
    free(t);
}

/* promtool's own lint on the whole registry as rendered (every metric the
 * tests above registered). Skipped only where promtool is not installed. */
static void test_promtool_check(void **state)
{
    (void)state;
    if (system("command -v promtool >/dev/null 2>&1") != 0) {
        skip();
        return;
    }
    size_t n = 0;
    char *t = sl_metrics_render(&n);
    assert_non_null(t);
    FILE *p = popen("promtool check metrics >/dev/null", "w");
    assert_non_null(p);
    assert_int_equal(fwrite(t, 1, n, p), n);
    int rc = pclose(p);
    free(t);
    assert_int_equal(rc, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counter_and_labels), cmocka_unit_test(test_gauge),
        cmocka_unit_test(test_histogram),          cmocka_unit_test(test_series_cap),
        cmocka_unit_test(test_format_double),      cmocka_unit_test(test_le_shortest),
        cmocka_unit_test(test_promtool_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
