/* Unit tests of the metrics registry: values, label escaping, histogram
 * buckets, the series cap, and re-registration returning the same metric. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
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
    assert_non_null(
        strstr(t, "t_dur_seconds_bucket{route=\"chat\",le=\"0.10000000000000001\"} 2\n"));
    assert_non_null(strstr(t, "t_dur_seconds_bucket{route=\"chat\",le=\"1\"} 2\n"));
    assert_non_null(strstr(t, "t_dur_seconds_bucket{route=\"chat\",le=\"10\"} 3\n"));
    assert_non_null(strstr(t, "t_dur_seconds_bucket{route=\"chat\",le=\"+Inf\"} 4\n"));
    assert_non_null(strstr(t, "t_dur_seconds_sum{route=\"chat\"} 55.149999999999999\n"));
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counter_and_labels),
        cmocka_unit_test(test_gauge),
        cmocka_unit_test(test_histogram),
        cmocka_unit_test(test_series_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
