/*
 * procstat.h — the process metrics every Prometheus exporter has
 * (process_cpu_seconds_total, process_resident_memory_bytes,
 * process_virtual_memory_bytes, process_open_fds, process_max_fds,
 * process_start_time_seconds), read from /proc/self when /metrics is
 * scraped, so they cost nothing between scrapes and are never stale.
 *
 * Wiring: call sl_procstat_register() once at startup; from then on
 * sl_metrics_render() appends them (a registry collector). Or call
 * sl_procstat_render() and append its text yourself.
 */
#ifndef SL_PROCSTAT_H
#define SL_PROCSTAT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/sl.h"

typedef struct sl_procstat {
    double cpu_seconds;        /* user + system time */
    int64_t resident_bytes;    /* RSS */
    int64_t virtual_bytes;     /* address space size */
    int64_t open_fds;          /* descriptors open now (not counting the reader's own) */
    int64_t max_fds;           /* soft RLIMIT_NOFILE; -1 = unlimited */
    double start_time_seconds; /* Unix time the process started */
} sl_procstat_t;

/* Reads the process described by self_dir (a /proc/<pid> directory: its
 * stat, limits and fd/) and the boot time from stat_path (/proc/stat);
 * ticks: clock ticks per second, page: page size in bytes. Split from
 * sl_procstat_read so tests can feed it a made-up directory. 0 ok; -1 if a
 * file is missing or malformed (*out is then partly filled). */
int sl_procstat_read_from(const char *self_dir, const char *stat_path, long ticks, long page,
                          sl_procstat_t *out) SL_WUR;

/* This process, from /proc/self and /proc/stat. */
int sl_procstat_read(sl_procstat_t *out) SL_WUR;

/* The metrics in Prometheus text format, written to f. Metrics that could
 * not be read are left out (a scrape must not fail for them). */
void sl_procstat_write(FILE *f, const sl_procstat_t *st);

/* This process's metrics as text: malloc'd, NUL-terminated, length in
 * *len (caller frees); NULL on OOM. */
char *sl_procstat_render(size_t *len);

/* Makes sl_metrics_render() include them. Idempotent, thread-safe. */
void sl_procstat_register(void);

#endif
