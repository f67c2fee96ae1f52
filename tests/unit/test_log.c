/* Unit tests of the rate-limited error log: one line per key per interval,
 * the held-back count carried on the next line or flushed when the key goes
 * quiet, keys independent, the key table bounded. The clock is passed in. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"

#define S (1000000000LL)

static void test_first_at_once_then_counted(void **state)
{
    (void)state;
    sl_logrl_t *rl = sl_logrl_new(16, 10 * S);
    assert_non_null(rl);
    uint64_t held = 99;
    assert_int_equal(sl_logrl_check(rl, "up a connect", 0, &held), 1);
    assert_int_equal(held, 0);
    /* 1,000 failures inside one interval: none is written */
    int written = 0;
    for (int i = 1; i <= 1000; i++)
        written += sl_logrl_check(rl, "up a connect", i * (S / 1000), &held);
    assert_int_equal(written, 0);
    /* the first one after the interval is written and carries the count */
    assert_int_equal(sl_logrl_check(rl, "up a connect", 10 * S + 1, &held), 1);
    assert_int_equal(held, 1000);
    /* and the count starts again */
    assert_int_equal(sl_logrl_check(rl, "up a connect", 10 * S + 2, &held), 0);
    assert_int_equal(sl_logrl_check(rl, "up a connect", 20 * S + 1, &held), 1);
    assert_int_equal(held, 1);
    sl_logrl_free(rl);
}

static void test_keys_are_independent(void **state)
{
    (void)state;
    sl_logrl_t *rl = sl_logrl_new(16, 10 * S);
    uint64_t held;
    assert_int_equal(sl_logrl_check(rl, "up a connect", 0, &held), 1);
    assert_int_equal(sl_logrl_check(rl, "up a tls", 1, &held), 1);
    assert_int_equal(sl_logrl_check(rl, "up b connect", 2, &held), 1);
    assert_int_equal(sl_logrl_check(rl, "up a connect", 3, &held), 0);
    assert_int_equal(sl_logrl_check(rl, "up a tls", 4, &held), 0);
    sl_logrl_free(rl);
}

struct flushed {
    int n;
    char key[64];
    uint64_t held;
};

static void on_flush(const char *key, uint64_t held, int64_t span, void *arg)
{
    struct flushed *f = arg;
    f->n++;
    snprintf(f->key, sizeof(f->key), "%s", key);
    f->held = held;
    assert_true(span >= 10 * S);
}

static void test_flush_reports_quiet_keys_once(void **state)
{
    (void)state;
    sl_logrl_t *rl = sl_logrl_new(16, 10 * S);
    uint64_t held;
    sl_logrl_check(rl, "quiet", 0, &held);
    sl_logrl_check(rl, "quiet", 1, &held);
    sl_logrl_check(rl, "quiet", 2, &held);
    sl_logrl_check(rl, "nothing held", 0, &held);
    struct flushed f = {0};
    /* before the interval ends: nothing */
    assert_int_equal(sl_logrl_flush(rl, 5 * S, on_flush, &f), 0);
    assert_int_equal(f.n, 0);
    /* after: the key with held messages, once, with its count */
    assert_int_equal(sl_logrl_flush(rl, 11 * S, on_flush, &f), 1);
    assert_int_equal(f.n, 1);
    assert_string_equal(f.key, "quiet");
    assert_int_equal(f.held, 2);
    assert_int_equal(sl_logrl_flush(rl, 30 * S, on_flush, &f), 0);
    assert_int_equal(f.n, 1);
    sl_logrl_free(rl);
}

static void test_table_is_bounded(void **state)
{
    (void)state;
    sl_logrl_t *rl = sl_logrl_new(4, 10 * S);
    uint64_t held;
    char key[32];
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        /* every new key is written at once even past the cap */
        assert_int_equal(sl_logrl_check(rl, key, i, &held), 1);
    }
    /* the newest keys are still tracked, the oldest were dropped */
    assert_int_equal(sl_logrl_check(rl, "k99", 200, &held), 0);
    assert_int_equal(sl_logrl_check(rl, "k0", 201, &held), 1);
    sl_logrl_free(rl);
}

/* The error log on a file (log.error), then reopened after a move (SIGUSR1):
 * the lines before the move are in the moved file, the ones after in a new
 * file at the old path, and going back to stderr restores the original fd 2. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void test_error_log_file_and_reopen(void **state)
{
    (void)state;
    char dir[] = "/tmp/sl-log-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], moved[256], err[256];
    snprintf(path, sizeof(path), "%s/error.log", dir);
    snprintf(moved, sizeof(moved), "%s/error.log.1", dir);
    struct stat before;
    assert_int_equal(fstat(STDERR_FILENO, &before), 0);
    assert_int_equal(sl_log_reopen(err, sizeof(err)), 0); /* stderr: nothing to do */
    assert_int_equal(sl_log_set_target(path, err, sizeof(err)), 0);
    sl_error("line one");
    assert_int_equal(rename(path, moved), 0);
    sl_error("line two"); /* still the moved file: not reopened yet */
    assert_int_equal(sl_log_reopen(err, sizeof(err)), 0);
    sl_error("line three");
    fprintf(stderr, "stray write\n"); /* fd 2 itself follows the file */
    fflush(stderr);
    char *m = slurp(moved);
    assert_non_null(m);
    assert_non_null(strstr(m, "line one"));
    assert_non_null(strstr(m, "line two"));
    assert_null(strstr(m, "line three"));
    char *n = slurp(path);
    assert_non_null(n);
    assert_null(strstr(n, "line two"));
    assert_non_null(strstr(n, "line three"));
    assert_non_null(strstr(n, "stray write"));
    /* a bad path is refused and changes nothing */
    char bad[300];
    snprintf(bad, sizeof(bad), "%s/no/such/dir/e.log", dir);
    assert_int_equal(sl_log_set_target(bad, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "log.error"));
    sl_error("line four");
    assert_non_null(strstr(slurp(path), "line four"));
    assert_int_equal(sl_log_set_target("stderr", err, sizeof(err)), 0);
    struct stat after;
    assert_int_equal(fstat(STDERR_FILENO, &after), 0);
    assert_true(after.st_ino == before.st_ino && after.st_dev == before.st_dev);
    unlink(path);
    unlink(moved);
    rmdir(dir);
}

/* Several threads log the same cause and then its consequence under two
 * keys, the way every worker does when Redis refuses its password. Whichever
 * thread writes each line, the cause must come first in the file. */
#define ORDER_THREADS 8
#define ORDER_TRIALS  300

static pthread_barrier_t order_barrier;

static void *order_worker(void *arg)
{
    (void)arg;
    for (int t = 0; t < ORDER_TRIALS; t++) {
        char k1[32], k2[32];
        snprintf(k1, sizeof(k1), "order %d cause", t);
        snprintf(k2, sizeof(k2), "order %d effect", t);
        pthread_barrier_wait(&order_barrier);
        sl_log_limited(SL_LOG_ERROR, k1, "trial %d: cause", t);
        sl_log_limited(SL_LOG_WARN, k2, "trial %d: effect", t);
    }
    return NULL;
}

static void test_limited_lines_keep_claim_order(void **state)
{
    (void)state;
    char dir[] = "/tmp/sl-log-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], err[256];
    snprintf(path, sizeof(path), "%s/error.log", dir);
    assert_int_equal(sl_log_set_target(path, err, sizeof(err)), 0);
    pthread_barrier_init(&order_barrier, NULL, ORDER_THREADS);
    pthread_t th[ORDER_THREADS];
    for (int i = 0; i < ORDER_THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, order_worker, NULL), 0);
    for (int i = 0; i < ORDER_THREADS; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&order_barrier);
    assert_int_equal(sl_log_set_target("stderr", err, sizeof(err)), 0);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static int cause_at[ORDER_TRIALS], effect_at[ORDER_TRIALS], seen[ORDER_TRIALS];
    char line[512];
    int n = 0, inverted = 0;
    while (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "trial ");
        int t;
        if (!p || sscanf(p, "trial %d", &t) != 1 || t < 0 || t >= ORDER_TRIALS)
            continue;
        n++;
        seen[t]++;
        if (strstr(p, ": cause"))
            cause_at[t] = n;
        else
            effect_at[t] = n;
    }
    fclose(f);
    /* one line per key: two a trial, however many threads */
    assert_int_equal(n, 2 * ORDER_TRIALS);
    for (int t = 0; t < ORDER_TRIALS; t++) {
        assert_int_equal(seen[t], 2);
        if (effect_at[t] < cause_at[t])
            inverted++;
    }
    assert_int_equal(inverted, 0);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_at_once_then_counted),
        cmocka_unit_test(test_keys_are_independent),
        cmocka_unit_test(test_flush_reports_quiet_keys_once),
        cmocka_unit_test(test_table_is_bounded),
        cmocka_unit_test(test_error_log_file_and_reopen),
        cmocka_unit_test(test_limited_lines_keep_claim_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
