/*
 * log.c — the error log. One write(2) per line so lines from worker threads
 * never interleave.
 */
#include "common/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

void sl_log(sl_log_level_t lvl, const char *fmt, ...)
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
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : SL_MIN((size_t)m, sizeof(line) - (size_t)n - 2));
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
