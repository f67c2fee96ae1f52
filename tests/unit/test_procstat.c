/* Unit tests of the process metrics (common/procstat.c): exact values from
 * a made-up /proc directory (a comm with spaces and parentheses, unlimited
 * fds, missing files), this process's own values moving the way they must
 * (fds opened and closed, CPU burnt, memory touched), the text through the
 * registry collector, and promtool's lint of it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/metrics.h"
#include "common/procstat.h"

static char dir[256];

static void put(const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/sl_procstat_XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    char p[512];
    snprintf(p, sizeof(p), "%s/fd", dir);
    mkdir(p, 0700);
    for (int i = 0; i < 7; i++) {
        char n[16];
        snprintf(n, sizeof(n), "fd/%d", i);
        put(n, "");
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* utime 250 + stime 150 ticks at 100/s = 4 s; starttime 12345 ticks = 123.45 s
 * after a boot at 1700000000; vsize 123456789; rss 2048 pages of 4 KiB. */
static const char fake_stat[] =
    "4242 (we ird) (x)) S 1 4242 4242 0 -1 4194560 500 0 0 0 250 150 0 0 20 0 3 0 12345 "
    "123456789 2048 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n";

static void test_fake_dir(void **state)
{
    (void)state;
    put("stat", fake_stat);
    put("limits", "Limit                     Soft Limit           Hard Limit           Units\n"
                  "Max cpu time              unlimited            unlimited            seconds\n"
                  "Max open files            4096                 524288               files\n");
    put("pstat", "cpu  1 2 3 4\nbtime 1700000000\nprocesses 99\n");
    char ps[300];
    snprintf(ps, sizeof(ps), "%s/pstat", dir);
    sl_procstat_t st;
    assert_int_equal(sl_procstat_read_from(dir, ps, 100, 4096, &st), 0);
    assert_true(st.cpu_seconds == 4.0);
    assert_int_equal(st.resident_bytes, 2048 * 4096);
    assert_int_equal(st.virtual_bytes, 123456789);
    assert_int_equal(st.open_fds, 7);
    assert_int_equal(st.max_fds, 4096);
    assert_true(st.start_time_seconds == 1700000000 + 123.45);

    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    sl_procstat_write(f, &st);
    fclose(f);
    assert_non_null(strstr(buf, "# TYPE process_cpu_seconds_total counter\n"
                                "process_cpu_seconds_total 4\n"));
    assert_non_null(strstr(buf, "\nprocess_resident_memory_bytes 8388608\n"));
    assert_non_null(strstr(buf, "\nprocess_virtual_memory_bytes 123456789\n"));
    assert_non_null(strstr(buf, "\nprocess_open_fds 7\n"));
    assert_non_null(strstr(buf, "\nprocess_max_fds 4096\n"));
    assert_non_null(strstr(buf, "\nprocess_start_time_seconds 1700000123.45\n"));
    free(buf);

    /* unlimited fds: process_max_fds left out (no ratio to alert on) */
    put("limits", "Max open files            unlimited            unlimited            files\n");
    assert_int_equal(sl_procstat_read_from(dir, ps, 100, 4096, &st), 0);
    assert_int_equal(st.max_fds, -1);
    f = open_memstream(&buf, &n);
    sl_procstat_write(f, &st);
    fclose(f);
    assert_null(strstr(buf, "process_max_fds"));
    assert_non_null(strstr(buf, "process_open_fds 7\n"));
    free(buf);
}

static void test_fake_dir_broken(void **state)
{
    (void)state;
    put("stat", "4242 (truncated) S 1 2 3");
    put("limits", "nothing here\n");
    char ps[300];
    snprintf(ps, sizeof(ps), "%s/missing", dir);
    sl_procstat_t st;
    assert_int_equal(sl_procstat_read_from(dir, ps, 100, 4096, &st), -1);
    assert_true(st.cpu_seconds < 0);
    assert_true(st.start_time_seconds < 0);
    assert_int_equal(st.max_fds, -1);
    assert_int_equal(st.open_fds, 7); /* what could be read still is */
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    sl_procstat_write(f, &st);
    fclose(f);
    assert_string_equal(buf, "# HELP process_open_fds Number of open file descriptors.\n"
                             "# TYPE process_open_fds gauge\nprocess_open_fds 7\n");
    free(buf);
    assert_int_equal(sl_procstat_read_from("/nonexistent", ps, 100, 4096, &st), -1);
    assert_int_equal(st.open_fds, -1);
}

static void test_self(void **state)
{
    (void)state;
    sl_procstat_t a, b;
    assert_int_equal(sl_procstat_read(&a), 0);

    /* fds: exactly the ones opened */
    int fds[5];
    for (int i = 0; i < 5; i++) {
        fds[i] = dup(0);
        assert_true(fds[i] >= 0);
    }
    assert_int_equal(sl_procstat_read(&b), 0);
    assert_int_equal(b.open_fds, a.open_fds + 5);
    for (int i = 0; i < 5; i++)
        close(fds[i]);
    assert_int_equal(sl_procstat_read(&b), 0);
    assert_int_equal(b.open_fds, a.open_fds);

    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur == RLIM_INFINITY)
        assert_int_equal(b.max_fds, -1);
    else
        assert_int_equal(b.max_fds, (int64_t)rl.rlim_cur);

    /* start time: this test process started within the last 10 minutes */
    double now = (double)time(NULL);
    assert_true(a.start_time_seconds <= now + 1);
    assert_true(a.start_time_seconds > now - 600);

    /* CPU: burn until the process clock moved 0.3 s; the counter follows
     * (to a tick, 1/100 s, and the clock's own rounding) */
    clock_t c0 = clock();
    volatile double x = 0;
    while ((double)(clock() - c0) / CLOCKS_PER_SEC < 0.3)
        for (int i = 0; i < 100000; i++)
            x += i * 0.5;
    assert_int_equal(sl_procstat_read(&b), 0);
    assert_true(b.cpu_seconds - a.cpu_seconds >= 0.25);
    assert_true(b.cpu_seconds - a.cpu_seconds < 5);

    /* memory: 64 MiB touched shows in the RSS */
    size_t big = 64u << 20;
    char *m = malloc(big);
    assert_non_null(m);
    memset(m, 1, big);
    assert_int_equal(sl_procstat_read(&b), 0);
    assert_true(b.resident_bytes - a.resident_bytes >= (int64_t)(big / 2));
    assert_true(b.virtual_bytes >= b.resident_bytes);
    free(m);
}

static void test_registry_collector(void **state)
{
    (void)state;
    sl_metric_register("t_collector_total", "Before.", SL_METRIC_COUNTER, NULL, NULL, 0);
    size_t n = 0;
    char *t = sl_metrics_render(&n);
    assert_null(strstr(t, "process_open_fds"));
    free(t);
    sl_procstat_register();
    sl_procstat_register(); /* once only */
    t = sl_metrics_render(&n);
    assert_non_null(strstr(t, "# TYPE t_collector_total counter\n"));
    const char *p = strstr(t, "# TYPE process_open_fds gauge\n");
    assert_non_null(p);
    assert_null(strstr(p + 1, "# TYPE process_open_fds gauge\n"));
    assert_non_null(strstr(t, "\nprocess_cpu_seconds_total "));
    assert_non_null(strstr(t, "\nprocess_resident_memory_bytes "));
    assert_non_null(strstr(t, "\nprocess_max_fds "));
    assert_non_null(strstr(t, "\nprocess_start_time_seconds "));
    if (system("command -v promtool >/dev/null 2>&1") == 0) {
        FILE *pt = popen("promtool check metrics >/dev/null", "w");
        assert_non_null(pt);
        assert_int_equal(fwrite(t, 1, n, pt), n);
        assert_int_equal(pclose(pt), 0);
    }
    free(t);
    t = sl_procstat_render(&n);
    assert_non_null(t);
    assert_int_equal(strlen(t), n);
    assert_true(strncmp(t, "# HELP process_cpu_seconds_total ", 33) == 0);
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fake_dir),
        cmocka_unit_test(test_fake_dir_broken),
        cmocka_unit_test(test_self),
        cmocka_unit_test(test_registry_collector),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
