/*
 * log.c — the error log. One write(2) per line so lines from worker threads
 * never interleave.
 */
#include "common/log.h"

#include <pthread.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <uthash.h>

static _Atomic int sl_log_level = SL_LOG_INFO;
static const char *const sl_log_names[] = {"debug", "info", "warn", "error"};

void sl_log_set_level(sl_log_level_t lvl)
{
    atomic_store(&sl_log_level, (int)lvl);
}

sl_log_level_t sl_log_get_level(void)
{
    return (sl_log_level_t)atomic_load(&sl_log_level);
}

int sl_log_level_parse(const char *s)
{
    for (size_t i = 0; i < SL_ARRAY_LEN(sl_log_names); i++)
        if (strcmp(s, sl_log_names[i]) == 0)
            return (int)i;
    return -1;
}

/* ---- the error log's target ------------------------------------------------ */

/* Main thread only (start, reload, SIGUSR1): workers only write to fd 2. */
static char *sl_log_path;            /* NULL: stderr as the process got it */
static int sl_log_saved_stderr = -1; /* the original fd 2, to go back to stderr */

static int sl_log_put(const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0) {
        snprintf(err, errlen, "log.error %s: %s", path, strerror(errno));
        return -1;
    }
    if (sl_log_saved_stderr < 0)
        sl_log_saved_stderr = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
    /* One dup2: a writer's line lands wholly in the old file or the new. */
    int rc = dup2(fd, STDERR_FILENO);
    int e = errno;
    close(fd);
    if (rc < 0) {
        snprintf(err, errlen, "log.error %s: dup2: %s", path, strerror(e));
        return -1;
    }
    return 0;
}

int sl_log_set_target(const char *target, char *err, size_t errlen)
{
    if (!target || strcmp(target, "stderr") == 0) {
        if (sl_log_path && sl_log_saved_stderr >= 0)
            dup2(sl_log_saved_stderr, STDERR_FILENO);
        free(sl_log_path);
        sl_log_path = NULL;
        return 0;
    }
    if (sl_log_path && strcmp(sl_log_path, target) == 0)
        return 0;
    char *copy = strdup(target);
    if (!copy) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (sl_log_put(target, err, errlen) != 0) {
        free(copy);
        return -1;
    }
    free(sl_log_path);
    sl_log_path = copy;
    return 0;
}

int sl_log_reopen(char *err, size_t errlen)
{
    return sl_log_path ? sl_log_put(sl_log_path, err, errlen) : 0;
}

static void sl_log_v(sl_log_level_t lvl, const char *suffix, const char *fmt, va_list ap)
    SL_PRINTF(3, 0);

void sl_log(sl_log_level_t lvl, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sl_log_v(lvl, NULL, fmt, ap);
    va_end(ap);
}

static void sl_log_v(sl_log_level_t lvl, const char *suffix, const char *fmt, va_list ap)
{
    if ((int)lvl < atomic_load_explicit(&sl_log_level, memory_order_relaxed))
        return;
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ [%s] ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, sl_log_names[lvl]);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    size_t len = (size_t)n + (m < 0 ? 0 : SL_MIN((size_t)m, sizeof(line) - (size_t)n - 2));
    if (suffix) {
        size_t sl = SL_MIN(strlen(suffix), sizeof(line) - len - 2);
        memcpy(line + len, suffix, sl);
        len += sl;
    }
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

/* ---- rate-limited messages ----------------------------------------------- */

typedef struct sl_logrl_key {
    char *key;
    int64_t last_ns; /* when the key's last line was written */
    uint64_t held;   /* messages counted since then */
    UT_hash_handle hh;
} sl_logrl_key_t;

struct sl_logrl {
    pthread_mutex_t mu;
    sl_logrl_key_t *keys; /* uthash, in insertion/refresh order (oldest first) */
    size_t max_keys;
    int64_t interval_ns;
};

sl_logrl_t *sl_logrl_new(size_t max_keys, int64_t interval_ns)
{
    sl_logrl_t *rl = calloc(1, sizeof(*rl));
    if (!rl)
        return NULL;
    pthread_mutex_init(&rl->mu, NULL);
    rl->max_keys = max_keys ? max_keys : 1;
    rl->interval_ns = interval_ns;
    return rl;
}

static void sl_logrl_key_free(sl_logrl_key_t *k)
{
    free(k->key);
    free(k);
}

void sl_logrl_free(sl_logrl_t *rl)
{
    if (!rl)
        return;
    sl_logrl_key_t *k, *tmp;
    HASH_ITER(hh, rl->keys, k, tmp)
    {
        HASH_DEL(rl->keys, k);
        sl_logrl_key_free(k);
    }
    pthread_mutex_destroy(&rl->mu);
    free(rl);
}

int sl_logrl_check(sl_logrl_t *rl, const char *key, int64_t now_ns, uint64_t *held)
{
    *held = 0;
    int due = 0;
    pthread_mutex_lock(&rl->mu);
    sl_logrl_key_t *k = NULL;
    HASH_FIND_STR(rl->keys, key, k);
    if (!k) {
        if (HASH_COUNT(rl->keys) >= rl->max_keys) {
            sl_logrl_key_t *old = rl->keys; /* the least recently written */
            HASH_DEL(rl->keys, old);
            sl_logrl_key_free(old);
        }
        k = calloc(1, sizeof(*k));
        if (k && !(k->key = strdup(key))) {
            free(k);
            k = NULL;
        }
        if (!k) { /* no memory: say it rather than lose it */
            pthread_mutex_unlock(&rl->mu);
            return 1;
        }
        k->last_ns = now_ns;
        HASH_ADD_KEYPTR(hh, rl->keys, k->key, strlen(k->key), k);
        due = 1;
    } else if (now_ns - k->last_ns >= rl->interval_ns) {
        *held = k->held;
        k->held = 0;
        k->last_ns = now_ns;
        HASH_DEL(rl->keys, k); /* to the end: the eviction order is by last line */
        HASH_ADD_KEYPTR(hh, rl->keys, k->key, strlen(k->key), k);
        due = 1;
    } else {
        k->held++;
    }
    pthread_mutex_unlock(&rl->mu);
    return due;
}

size_t sl_logrl_flush(sl_logrl_t *rl, int64_t now_ns,
                      void (*emit)(const char *key, uint64_t held, int64_t interval_ns, void *arg),
                      void *arg)
{
    size_t n = 0;
    pthread_mutex_lock(&rl->mu);
    sl_logrl_key_t *k, *tmp;
    HASH_ITER(hh, rl->keys, k, tmp)
    {
        if (k->held && now_ns - k->last_ns >= rl->interval_ns) {
            emit(k->key, k->held, now_ns - k->last_ns, arg);
            k->held = 0;
            k->last_ns = now_ns;
            n++;
        }
    }
    pthread_mutex_unlock(&rl->mu);
    return n;
}

#define SL_LOGRL_DEFAULT_NS (10 * (int64_t)1000000000)

static pthread_once_t sl_logrl_once = PTHREAD_ONCE_INIT;
static sl_logrl_t *sl_logrl_global;
static _Atomic int64_t sl_logrl_interval = SL_LOGRL_DEFAULT_NS;
static pthread_mutex_t sl_log_limited_mu = PTHREAD_MUTEX_INITIALIZER;

static void sl_logrl_global_init(void)
{
    sl_logrl_global = sl_logrl_new(4096, SL_LOGRL_DEFAULT_NS);
}

static sl_logrl_t *sl_logrl_get(void)
{
    pthread_once(&sl_logrl_once, sl_logrl_global_init);
    return sl_logrl_global;
}

void sl_log_limited_set_interval(int64_t interval_ns)
{
    if (interval_ns <= 0)
        interval_ns = SL_LOGRL_DEFAULT_NS;
    atomic_store(&sl_logrl_interval, interval_ns);
    sl_logrl_t *rl = sl_logrl_get();
    if (rl) {
        pthread_mutex_lock(&rl->mu);
        rl->interval_ns = interval_ns;
        pthread_mutex_unlock(&rl->mu);
    }
}

void sl_log_limited(sl_log_level_t lvl, const char *key, const char *fmt, ...)
{
    if ((int)lvl < atomic_load_explicit(&sl_log_level, memory_order_relaxed))
        return;
    sl_logrl_t *rl = sl_logrl_get();
    uint64_t held = 0;
    /* The decision and the write are one step: a thread that finds a key
     * already claimed waits until its line is out. Otherwise a failure that
     * logs its cause and then its consequence under two keys, on several
     * workers at once, could show the consequence first (the cause claimed
     * by one worker, the consequence written by another before it). */
    pthread_mutex_lock(&sl_log_limited_mu);
    if (rl && !sl_logrl_check(rl, key, sl_now_ns(), &held)) {
        pthread_mutex_unlock(&sl_log_limited_mu);
        return;
    }
    char suffix[96];
    if (held)
        snprintf(suffix, sizeof(suffix), " (%llu more like this in the last %llds)",
                 (unsigned long long)held,
                 (long long)(atomic_load(&sl_logrl_interval) / 1000000000));
    va_list ap;
    va_start(ap, fmt);
    sl_log_v(lvl, held ? suffix : NULL, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&sl_log_limited_mu);
}

static void sl_logrl_emit(const char *key, uint64_t held, int64_t span_ns, void *arg)
{
    (void)arg;
    sl_log(SL_LOG_WARN, "%s: %llu more like this in the last %llds", key, (unsigned long long)held,
           (long long)(span_ns / 1000000000));
}

void sl_log_limited_flush(void)
{
    sl_logrl_t *rl = sl_logrl_get();
    if (rl)
        sl_logrl_flush(rl, sl_now_ns(), sl_logrl_emit, NULL);
}
