/*
 * retry.c — the retry policy: which failures may be retried, the jittered
 * exponential backoff, Retry-After (seconds or an HTTP-date), and the retry
 * budget of a pool that keeps a 503 storm from being amplified: retries are
 * at most budget_percent of the requests over a sliding window, checked and
 * taken under one small lock so concurrent workers cannot overshoot it.
 *
 * Pure apart from the budget's shared counts: the clocks and the random
 * draw are arguments.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/sl.h"
#include "fallback/fb_internal.h"

struct fb_budget {
    pthread_mutex_t lock;
    fb_window_t win; /* a = requests, b = retries */
    int64_t percent, min;
    sl_mseries_t *m_retries, *m_exhausted;
};

fb_budget_t *fb_budget_new(const conf_fb_retry_t *c, const char *upstream)
{
    fb_metrics_init();
    fb_budget_t *b = sl_xcalloc(1, sizeof(*b));
    pthread_mutex_init(&b->lock, NULL);
    fb_window_init(&b->win, c->budget_window_ms);
    b->percent = c->budget_percent;
    b->min = c->budget_min;
    const char *label = upstream ? upstream : "";
    b->m_retries = sl_metric_series1(fb_m.retries, label);
    b->m_exhausted = sl_metric_series1(fb_m.budget_out, label);
    return b;
}

void fb_budget_free(fb_budget_t *b)
{
    if (!b)
        return;
    pthread_mutex_destroy(&b->lock);
    free(b);
}

void fb_budget_configure(fb_budget_t *b, const conf_fb_retry_t *c)
{
    pthread_mutex_lock(&b->lock);
    fb_window_resize(&b->win, c->budget_window_ms);
    b->percent = c->budget_percent;
    b->min = c->budget_min;
    pthread_mutex_unlock(&b->lock);
}

void fb_budget_on_request(fb_budget_t *b, int64_t now_ms)
{
    pthread_mutex_lock(&b->lock);
    fb_window_add(&b->win, now_ms, 1, 0);
    pthread_mutex_unlock(&b->lock);
}

bool fb_budget_take(fb_budget_t *b, int64_t now_ms)
{
    int64_t req, ret;
    pthread_mutex_lock(&b->lock);
    fb_window_sum(&b->win, now_ms, &req, &ret);
    /* In hundredths, so 20% of 5 requests is exactly one retry. */
    bool ok = (ret + 1) * 100 <= b->percent * req + b->min * 100;
    if (ok)
        fb_window_add(&b->win, now_ms, 0, 1);
    pthread_mutex_unlock(&b->lock);
    return ok;
}

void fb_budget_counts(fb_budget_t *b, int64_t now_ms, int64_t *requests, int64_t *retries)
{
    pthread_mutex_lock(&b->lock);
    fb_window_sum(&b->win, now_ms, requests, retries);
    pthread_mutex_unlock(&b->lock);
}

/* ---- policy --------------------------------------------------------------- */

static const char *const fb_verdict_names[] = {
    "retry", "not_retryable", "client_started", "attempts", "retry_after", "deadline", "budget",
};

const char *fb_retry_verdict_name(fb_retry_verdict_t v)
{
    return (unsigned)v < SL_ARRAY_LEN(fb_verdict_names) ? fb_verdict_names[v] : "unknown";
}

bool fb_failure_retryable(const fb_attempt_t *a)
{
    if (a->client_started)
        return false;
    switch (a->failure) {
    case FB_FAIL_CONNECT:
    case FB_FAIL_FIRST_BYTE:
    case FB_FAIL_RESET:
        return true;
    case FB_FAIL_STATUS:
        /* 501 Not Implemented and 505 HTTP Version Not Supported say the
         * same thing to every retry. */
        return a->status >= 500 && a->status <= 599 && a->status != 501 && a->status != 505;
    case FB_FAIL_OTHER:
    default:
        return false;
    }
}

int64_t fb_backoff_ms(int64_t base_ms, int64_t max_ms, int n, uint64_t rnd)
{
    int64_t d = base_ms > 0 ? base_ms : 0;
    for (int i = 0; i < n && d < max_ms; i++)
        d *= 2;
    if (d > max_ms)
        d = max_ms;
    if (d <= 0)
        return 0;
    /* "Equal jitter": never less than half, so a storm's retries still
     * spread out but none comes back at once. */
    int64_t half = d / 2;
    return half + (int64_t)(rnd % (uint64_t)(d - half + 1));
}

static bool fb_all_digits(const char *s, size_t n)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

int64_t fb_retry_after_ms(const char *value, int64_t now_wall_ms)
{
    if (!value)
        return -1;
    while (*value == ' ' || *value == '\t')
        value++;
    size_t n = strlen(value);
    while (n && (value[n - 1] == ' ' || value[n - 1] == '\t'))
        n--;
    if (fb_all_digits(value, n)) {
        if (n > 9) /* more than 31 years: the same as "not soon" */
            return INT64_C(999999999) * 1000;
        int64_t s = 0;
        for (size_t i = 0; i < n; i++)
            s = s * 10 + (value[i] - '0');
        return s * 1000;
    }
    /* The three date forms HTTP allows (RFC 9110 5.6.7); strptime's names
     * are the C locale's, which is what HTTP uses. */
    static const char *const fmts[] = {"%a, %d %b %Y %H:%M:%S GMT", "%A, %d-%b-%y %H:%M:%S GMT",
                                       "%a %b %e %H:%M:%S %Y"};
    char buf[64];
    if (n >= sizeof(buf))
        return -1;
    memcpy(buf, value, n);
    buf[n] = '\0';
    for (size_t i = 0; i < SL_ARRAY_LEN(fmts); i++) {
        struct tm tm;
        memset(&tm, 0, sizeof(tm));
        const char *end = strptime(buf, fmts[i], &tm);
        if (!end || *end)
            continue;
        int64_t at = (int64_t)timegm(&tm) * 1000;
        return at > now_wall_ms ? at - now_wall_ms : 0;
    }
    return -1;
}

void fb_retry_decide(const conf_fb_retry_t *c, fb_budget_t *b, const fb_attempt_t *a,
                     int64_t now_ms, int64_t now_wall_ms, uint64_t rnd, fb_retry_decision_t *d)
{
    memset(d, 0, sizeof(*d));
    if (a->client_started) {
        d->verdict = FB_NO_RETRY_STARTED;
        return;
    }
    if (!fb_failure_retryable(a)) {
        d->verdict = FB_NO_RETRY_KIND;
        return;
    }
    if (a->retries_done >= c->attempts) {
        d->verdict = FB_NO_RETRY_ATTEMPTS;
        return;
    }
    int64_t delay = fb_backoff_ms(c->backoff_ms, c->backoff_max_ms, a->retries_done, rnd);
    d->prefer_other = a->other_server;
    if (!a->other_server && a->retry_after) {
        /* The same server asked for a pause: honour it or give up on it. */
        int64_t ra = fb_retry_after_ms(a->retry_after, now_wall_ms);
        if (ra > c->backoff_max_ms) {
            d->verdict = FB_NO_RETRY_RETRY_AFTER;
            return;
        }
        if (ra > delay)
            delay = ra;
    }
    if (a->deadline_ms > 0 && now_ms + delay >= a->deadline_ms) {
        d->verdict = FB_NO_RETRY_DEADLINE;
        return;
    }
    if (b && !fb_budget_take(b, now_ms)) {
        sl_counter_add(b->m_exhausted, 1);
        d->verdict = FB_NO_RETRY_BUDGET;
        return;
    }
    if (b)
        sl_counter_add(b->m_retries, 1);
    fb_count_tier(FB_TIER_RETRY);
    d->verdict = FB_RETRY;
    d->delay_ms = delay;
}
