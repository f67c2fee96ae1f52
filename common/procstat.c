/*
 * procstat.c — process metrics read from procfs at scrape time (see
 * procstat.h). Each file is read whole into a bounded buffer; a field that
 * cannot be parsed leaves its metric out rather than failing the scrape.
 */
#include "common/procstat.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/metrics.h"

#define SL_PROC_FILE_MAX 8192 /* /proc/self/stat and limits are ~300 and ~1500 bytes */

/* path's contents, NUL-terminated, at most size-1 bytes. -1 if unreadable. */
static int sl_proc_slurp(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t n = 0;
    while (n < size - 1) {
        ssize_t r = read(fd, buf + n, size - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    return n > 0 ? 0 : -1;
}

/* <pid>/stat: "pid (comm) state ppid ..." — comm may hold spaces and
 * parentheses, so fields are counted from the last ')'. Field numbers as
 * in proc(5): 14 utime, 15 stime, 22 starttime (ticks after boot), 23
 * vsize (bytes), 24 rss (pages). */
static int sl_proc_stat(const char *text, long ticks, long page, sl_procstat_t *out,
                        double *start_ticks)
{
    const char *p = strrchr(text, ')');
    if (!p)
        return -1;
    p++;
    unsigned long long v[25] = {0};
    int field = 3; /* the state, after ") " */
    while (field <= 24) {
        while (*p == ' ')
            p++;
        if (!*p)
            return -1;
        char *end;
        if (field >= 4) {
            errno = 0;
            v[field] = strtoull(p, &end, 10);
            if (end == p || errno)
                return -1;
        } else {
            end = (char *)p;
            while (*end && *end != ' ')
                end++;
        }
        p = end;
        field++;
    }
    out->cpu_seconds = (double)(v[14] + v[15]) / (double)ticks;
    out->virtual_bytes = (int64_t)v[23];
    out->resident_bytes = (int64_t)v[24] * page;
    *start_ticks = (double)v[22];
    return 0;
}

/* The rest of the line of text that starts with key; NULL if none. */
static const char *sl_proc_line(const char *text, const char *key)
{
    size_t k = strlen(key);
    for (const char *p = text; *p;) {
        if (strncmp(p, key, k) == 0)
            return p + k;
        const char *nl = strchr(p, '\n');
        if (!nl)
            break;
        p = nl + 1;
    }
    return NULL;
}

/* /proc/stat's "btime <unix seconds>" line. */
static int sl_proc_btime(const char *text, double *btime)
{
    const char *p = sl_proc_line(text, "btime ");
    if (!p)
        return -1;
    char *end;
    unsigned long long b = strtoull(p, &end, 10);
    if (end == p)
        return -1;
    *btime = (double)b;
    return 0;
}

/* <pid>/limits: "Max open files   1024   1048576   files" (soft, hard). */
static int sl_proc_max_fds(const char *text, int64_t *max)
{
    const char *p = sl_proc_line(text, "Max open files");
    if (!p)
        return -1;
    while (*p == ' ')
        p++;
    if (strncmp(p, "unlimited", 9) == 0) {
        *max = -1;
        return 0;
    }
    char *end;
    long long n = strtoll(p, &end, 10);
    if (end == p || n < 0)
        return -1;
    *max = n;
    return 0;
}

/* Entries of <pid>/fd, less the descriptor this count itself holds open
 * when the directory is our own. */
static int64_t sl_proc_count_fds(const char *fd_dir)
{
    DIR *d = opendir(fd_dir);
    if (!d)
        return -1;
    int self = dirfd(d);
    int64_t n = 0;
    struct dirent *e;
    bool own = strncmp(fd_dir, "/proc/self/", 11) == 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if (own && atoi(e->d_name) == self)
            continue;
        n++;
    }
    closedir(d);
    return n;
}

int sl_procstat_read_from(const char *self_dir, const char *stat_path, long ticks, long page,
                          sl_procstat_t *out)
{
    out->cpu_seconds = -1;
    out->resident_bytes = out->virtual_bytes = out->open_fds = out->max_fds = -1;
    out->start_time_seconds = -1;
    if (ticks <= 0 || page <= 0)
        return -1;
    int rc = 0;
    char path[512], *buf = malloc(SL_PROC_FILE_MAX);
    if (!buf)
        return -1;
    double start_ticks = -1, btime = -1;
    snprintf(path, sizeof(path), "%s/stat", self_dir);
    if (sl_proc_slurp(path, buf, SL_PROC_FILE_MAX) != 0 ||
        sl_proc_stat(buf, ticks, page, out, &start_ticks) != 0)
        rc = -1;
    if (sl_proc_slurp(stat_path, buf, SL_PROC_FILE_MAX) != 0 || sl_proc_btime(buf, &btime) != 0)
        rc = -1;
    if (start_ticks >= 0 && btime >= 0)
        out->start_time_seconds = btime + start_ticks / (double)ticks;
    snprintf(path, sizeof(path), "%s/limits", self_dir);
    int64_t max = -1;
    if (sl_proc_slurp(path, buf, SL_PROC_FILE_MAX) != 0 || sl_proc_max_fds(buf, &max) != 0)
        rc = -1;
    out->max_fds = max;
    snprintf(path, sizeof(path), "%s/fd", self_dir);
    out->open_fds = sl_proc_count_fds(path);
    if (out->open_fds < 0)
        rc = -1;
    free(buf);
    return rc;
}

int sl_procstat_read(sl_procstat_t *out)
{
    return sl_procstat_read_from("/proc/self", "/proc/stat", sysconf(_SC_CLK_TCK),
                                 sysconf(_SC_PAGESIZE), out);
}

static void sl_procstat_one(FILE *f, const char *name, const char *type, const char *help, double v)
{
    char num[40];
    sl_metrics_format_double(num, sizeof(num), v);
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %s\n", name, help, name, type, name, num);
}

void sl_procstat_write(FILE *f, const sl_procstat_t *st)
{
    if (st->cpu_seconds >= 0)
        sl_procstat_one(f, "process_cpu_seconds_total", "counter",
                        "Total user and system CPU time spent in seconds.", st->cpu_seconds);
    if (st->resident_bytes >= 0)
        sl_procstat_one(f, "process_resident_memory_bytes", "gauge",
                        "Resident memory size in bytes.", (double)st->resident_bytes);
    if (st->virtual_bytes >= 0)
        sl_procstat_one(f, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
                        (double)st->virtual_bytes);
    if (st->open_fds >= 0)
        sl_procstat_one(f, "process_open_fds", "gauge", "Number of open file descriptors.",
                        (double)st->open_fds);
    if (st->max_fds >= 0)
        sl_procstat_one(f, "process_max_fds", "gauge", "Maximum number of open file descriptors.",
                        (double)st->max_fds);
    if (st->start_time_seconds >= 0)
        sl_procstat_one(f, "process_start_time_seconds", "gauge",
                        "Start time of the process since unix epoch in seconds.",
                        st->start_time_seconds);
}

static void sl_procstat_collect(FILE *f)
{
    sl_procstat_t st;
    if (sl_procstat_read(&st) != 0) {
        /* what could be read is written: a scrape must not fail for one field */
    }
    sl_procstat_write(f, &st);
}

char *sl_procstat_render(size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return NULL;
    sl_procstat_collect(f);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    if (len)
        *len = n;
    return buf;
}

void sl_procstat_register(void)
{
    sl_metrics_add_collector(sl_procstat_collect);
}
