/*
 * metrics.c — the registry behind metrics.h. Metrics and their series are
 * created rarely (startup, config load, first use of a label tuple) under
 * one mutex and never freed; updates are relaxed atomics. Rendering walks
 * the lists under the same mutex, reading values atomically.
 */
#include "common/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sl_mseries {
    struct sl_mseries *next;
    const struct sl_metric *metric; /* owner: histogram bounds, type */
    char *values[SL_METRIC_MAX_LABELS];
    _Atomic uint64_t count; /* counter value, or histogram count */
    _Atomic int64_t gauge;
    _Atomic uint64_t sum_bits; /* histogram sum, a double's bits */
    _Atomic uint64_t buckets[SL_METRIC_MAX_BUCKETS];
};

struct sl_metric {
    struct sl_metric *next;
    char *name;
    char *help;
    sl_metric_type_t type;
    size_t nlabels;
    char *labels[SL_METRIC_MAX_LABELS];
    size_t nbuckets;
    double buckets[SL_METRIC_MAX_BUCKETS];
    char le[SL_METRIC_MAX_BUCKETS][32]; /* the bounds as printed, formatted once */
    size_t nseries;
    sl_mseries_t *series, **series_tail;
    sl_mseries_t *overflow;
};

static pthread_mutex_t sl_metrics_lock = PTHREAD_MUTEX_INITIALIZER;
static sl_metric_t *sl_metrics_head, **sl_metrics_tail = &sl_metrics_head;

const double sl_metrics_default_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                             0.5,   1,      2.5,   5,    10,    30,   60,  120};
const size_t sl_metrics_default_nbuckets = SL_ARRAY_LEN(sl_metrics_default_buckets);
const double sl_metrics_ttft_buckets[] = {0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1,  1.5, 2,
                                          3,    5,   7.5, 10,  15,  20,   30, 60};
const size_t sl_metrics_ttft_nbuckets = SL_ARRAY_LEN(sl_metrics_ttft_buckets);
const double sl_metrics_itl_buckets[] = {0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1,
                                         0.15,  0.2,  0.3,  0.5,  1,    2,     5};
const size_t sl_metrics_itl_nbuckets = SL_ARRAY_LEN(sl_metrics_itl_buckets);

static void sl_metric_die(const char *name, const char *why)
{
    fprintf(stderr, "sluice: metric %s: %s\n", name, why);
    abort();
}

sl_metric_t *sl_metric_register(const char *name, const char *help, sl_metric_type_t type,
                                const char *labels, const double *buckets, size_t nbuckets)
{
    pthread_mutex_lock(&sl_metrics_lock);
    for (sl_metric_t *m = sl_metrics_head; m; m = m->next) {
        if (strcmp(m->name, name) == 0) {
            if (m->type != type)
                sl_metric_die(name, "registered twice with different types");
            pthread_mutex_unlock(&sl_metrics_lock);
            return m;
        }
    }
    sl_metric_t *m = sl_xcalloc(1, sizeof(*m));
    m->name = sl_xstrdup(name);
    m->help = sl_xstrdup(help);
    m->type = type;
    m->series_tail = &m->series;
    if (labels && *labels) {
        char *copy = sl_xstrdup(labels), *save = NULL;
        for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (m->nlabels == SL_METRIC_MAX_LABELS)
                sl_metric_die(name, "too many labels");
            m->labels[m->nlabels++] = sl_xstrdup(tok);
        }
        free(copy);
    }
    if (type == SL_METRIC_HISTOGRAM) {
        if (!buckets) {
            buckets = sl_metrics_default_buckets;
            nbuckets = sl_metrics_default_nbuckets;
        }
        if (nbuckets == 0 || nbuckets > SL_METRIC_MAX_BUCKETS)
            sl_metric_die(name, "bad bucket count");
        for (size_t i = 0; i < nbuckets; i++) {
            if (i > 0 && !(buckets[i] > buckets[i - 1]))
                sl_metric_die(name, "buckets not ascending");
            m->buckets[i] = buckets[i];
            sl_metrics_format_double(m->le[i], sizeof(m->le[i]), buckets[i]);
        }
        m->nbuckets = nbuckets;
    }
    *sl_metrics_tail = m;
    sl_metrics_tail = &m->next;
    pthread_mutex_unlock(&sl_metrics_lock);
    return m;
}

static sl_mseries_t *sl_mseries_new(const sl_metric_t *m, const char *const *values)
{
    sl_mseries_t *s = sl_xcalloc(1, sizeof(*s));
    s->metric = m;
    for (size_t i = 0; i < m->nlabels; i++)
        s->values[i] = sl_xstrdup(values ? values[i] : "_overflow");
    return s;
}

sl_mseries_t *sl_metric_series(sl_metric_t *m, const char *const *values)
{
    pthread_mutex_lock(&sl_metrics_lock);
    sl_mseries_t *s;
    for (s = m->series; s; s = s->next) {
        size_t i;
        for (i = 0; i < m->nlabels; i++)
            if (strcmp(s->values[i], values[i]) != 0)
                break;
        if (i == m->nlabels)
            goto out;
    }
    if (m->nseries >= SL_METRIC_MAX_SERIES) {
        if (!m->overflow) {
            m->overflow = sl_mseries_new(m, NULL);
            *m->series_tail = m->overflow;
            m->series_tail = &m->overflow->next;
        }
        s = m->overflow;
        goto out;
    }
    s = sl_mseries_new(m, values);
    *m->series_tail = s;
    m->series_tail = &s->next;
    m->nseries++;
out:
    pthread_mutex_unlock(&sl_metrics_lock);
    return s;
}

sl_mseries_t *sl_metric_series0(sl_metric_t *m)
{
    return sl_metric_series(m, NULL);
}

sl_mseries_t *sl_metric_counter0(const char *name, const char *help)
{
    return sl_metric_series0(sl_metric_register(name, help, SL_METRIC_COUNTER, NULL, NULL, 0));
}

sl_mseries_t *sl_metric_gauge0(const char *name, const char *help)
{
    return sl_metric_series0(sl_metric_register(name, help, SL_METRIC_GAUGE, NULL, NULL, 0));
}

sl_mseries_t *sl_metric_series1(sl_metric_t *m, const char *value)
{
    const char *v[1] = {value};
    return sl_metric_series(m, v);
}

void sl_counter_add(sl_mseries_t *s, uint64_t n)
{
    atomic_fetch_add_explicit(&s->count, n, memory_order_relaxed);
}

void sl_gauge_add(sl_mseries_t *s, int64_t delta)
{
    atomic_fetch_add_explicit(&s->gauge, delta, memory_order_relaxed);
}

void sl_gauge_set(sl_mseries_t *s, int64_t v)
{
    atomic_store_explicit(&s->gauge, v, memory_order_relaxed);
}

static double sl_bits_to_double(uint64_t b)
{
    double d;
    memcpy(&d, &b, sizeof(d));
    return d;
}

static uint64_t sl_double_to_bits(double d)
{
    uint64_t b;
    memcpy(&b, &d, sizeof(b));
    return b;
}

void sl_histogram_observe(sl_mseries_t *s, double v)
{
    const sl_metric_t *m = s->metric;
    /* Non-cumulative counts per bucket; rendering accumulates. Index
     * nbuckets is +Inf. */
    size_t i = 0;
    while (i < m->nbuckets && v > m->buckets[i])
        i++;
    if (i < m->nbuckets)
        atomic_fetch_add_explicit(&s->buckets[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->count, 1, memory_order_relaxed);
    uint64_t old = atomic_load_explicit(&s->sum_bits, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&s->sum_bits, &old,
                                                  sl_double_to_bits(sl_bits_to_double(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

uint64_t sl_counter_value(const sl_mseries_t *s)
{
    return atomic_load_explicit(&((sl_mseries_t *)s)->count, memory_order_relaxed);
}

int64_t sl_gauge_value(const sl_mseries_t *s)
{
    return atomic_load_explicit(&((sl_mseries_t *)s)->gauge, memory_order_relaxed);
}

uint64_t sl_histogram_count(const sl_mseries_t *s)
{
    return sl_counter_value(s);
}

/* ---- rendering ---------------------------------------------------------- */

static void sl_put_escaped(FILE *f, const char *v, bool help)
{
    for (; *v; v++) {
        if (*v == '\\')
            fputs("\\\\", f);
        else if (*v == '\n')
            fputs("\\n", f);
        else if (*v == '"' && !help)
            fputs("\\\"", f);
        else
            fputc(*v, f);
    }
}

/* The shortest %g form that reads back as the same double: 0.05, not
 * 0.050000000000000003. An `le` label is matched as a string by PromQL
 * ({le="0.05"}), so the exact digits a person would write are the contract;
 * 17 significant digits are always enough to round-trip. */
void sl_metrics_format_double(char *buf, size_t size, double d)
{
    if (isnan(d)) {
        snprintf(buf, size, "NaN");
        return;
    }
    if (isinf(d)) {
        snprintf(buf, size, "%s", d > 0 ? "+Inf" : "-Inf");
        return;
    }
    /* Round-tripping is monotonic in the precision (more digits are never
     * farther from d), so the least precision that reads back is found by
     * bisection: 4 or 5 tries instead of up to 17. */
    int lo = 1, hi = 17;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        snprintf(buf, size, "%.*g", mid, d);
        if (strtod(buf, NULL) == d)
            hi = mid;
        else
            lo = mid + 1;
    }
    int prec = lo;
    /* %g switches to an exponent once the exponent reaches the precision
     * ("1.2e+02" for 120): widen the precision to the integer digits so
     * whole numbers stay plain, as people write them. */
    char e[40];
    snprintf(e, sizeof(e), "%.*e", prec - 1, d);
    const char *x = strchr(e, 'e');
    long exp10 = x ? strtol(x + 1, NULL, 10) : 0;
    if (exp10 >= prec && exp10 < 17)
        prec = (int)exp10 + 1;
    snprintf(buf, size, "%.*g", prec, d);
}

static void sl_put_double(FILE *f, double d)
{
    char b[40];
    sl_metrics_format_double(b, sizeof(b), d);
    fputs(b, f);
}

/* Writes {a="x",b="y"[,le="..."]} — or nothing when there are no labels. */
static void sl_put_labels(FILE *f, const sl_metric_t *m, const sl_mseries_t *s, const char *le)
{
    if (m->nlabels == 0 && !le)
        return;
    fputc('{', f);
    for (size_t i = 0; i < m->nlabels; i++) {
        fprintf(f, "%s%s=\"", i ? "," : "", m->labels[i]);
        sl_put_escaped(f, s->values[i], false);
        fputc('"', f);
    }
    if (le)
        fprintf(f, "%sle=\"%s\"", m->nlabels ? "," : "", le);
    fputc('}', f);
}

static void sl_render_metric(FILE *f, const sl_metric_t *m)
{
    static const char *const types[] = {"counter", "gauge", "histogram"};
    fprintf(f, "# HELP %s ", m->name);
    sl_put_escaped(f, m->help, true);
    fprintf(f, "\n# TYPE %s %s\n", m->name, types[m->type]);
    for (const sl_mseries_t *s = m->series; s; s = s->next) {
        sl_mseries_t *w = (sl_mseries_t *)s;
        switch (m->type) {
        case SL_METRIC_COUNTER:
            fputs(m->name, f);
            sl_put_labels(f, m, s, NULL);
            fprintf(f, " %llu\n", (unsigned long long)sl_counter_value(s));
            break;
        case SL_METRIC_GAUGE:
            fputs(m->name, f);
            sl_put_labels(f, m, s, NULL);
            fprintf(f, " %lld\n", (long long)sl_gauge_value(s));
            break;
        case SL_METRIC_HISTOGRAM: {
            /* Read the total first: buckets may move on while we render,
             * and the +Inf bucket must equal _count. */
            uint64_t total = atomic_load_explicit(&w->count, memory_order_relaxed);
            uint64_t cum = 0;
            for (size_t i = 0; i < m->nbuckets; i++) {
                cum += atomic_load_explicit(&w->buckets[i], memory_order_relaxed);
                if (cum > total)
                    cum = total;
                fprintf(f, "%s_bucket", m->name);
                sl_put_labels(f, m, s, m->le[i]);
                fprintf(f, " %llu\n", (unsigned long long)cum);
            }
            fprintf(f, "%s_bucket", m->name);
            sl_put_labels(f, m, s, "+Inf");
            fprintf(f, " %llu\n", (unsigned long long)total);
            fprintf(f, "%s_sum", m->name);
            sl_put_labels(f, m, s, NULL);
            fputc(' ', f);
            sl_put_double(
                f, sl_bits_to_double(atomic_load_explicit(&w->sum_bits, memory_order_relaxed)));
            fprintf(f, "\n%s_count", m->name);
            sl_put_labels(f, m, s, NULL);
            fprintf(f, " %llu\n", (unsigned long long)total);
            break;
        }
        }
    }
}

static sl_metrics_collector_fn sl_collectors[SL_METRIC_MAX_COLLECTORS];
static size_t sl_ncollectors;

void sl_metrics_add_collector(sl_metrics_collector_fn fn)
{
    pthread_mutex_lock(&sl_metrics_lock);
    size_t i;
    for (i = 0; i < sl_ncollectors && sl_collectors[i] != fn; i++)
        ;
    if (i == sl_ncollectors) {
        if (sl_ncollectors == SL_METRIC_MAX_COLLECTORS)
            sl_metric_die("(collector)", "too many collectors");
        sl_collectors[sl_ncollectors++] = fn;
    }
    pthread_mutex_unlock(&sl_metrics_lock);
}

char *sl_metrics_render(size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return NULL;
    pthread_mutex_lock(&sl_metrics_lock);
    for (const sl_metric_t *m = sl_metrics_head; m; m = m->next)
        sl_render_metric(f, m);
    for (size_t i = 0; i < sl_ncollectors; i++)
        sl_collectors[i](f);
    pthread_mutex_unlock(&sl_metrics_lock);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    if (len)
        *len = n;
    return buf;
}
