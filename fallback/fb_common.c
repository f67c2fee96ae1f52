/*
 * fb_common.c — the small pieces every fallback part uses: the sliding
 * window counter, the metric handles, SHA-256, a fast thread-local random,
 * tier names and Redis call cancellation.
 */
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/sl.h"
#include "fallback/fb_internal.h"

/* ---- sliding window ------------------------------------------------------- */

void fb_window_init(fb_window_t *w, int64_t window_ms)
{
    memset(w, 0, sizeof(*w));
    fb_window_resize(w, window_ms);
    for (int i = 0; i < FB_WIN_BUCKETS; i++)
        w->epoch[i] = -1;
}

void fb_window_resize(fb_window_t *w, int64_t window_ms)
{
    int64_t width = window_ms / FB_WIN_BUCKETS;
    w->width_ms = width > 0 ? width : 1;
}

void fb_window_clear(fb_window_t *w)
{
    for (int i = 0; i < FB_WIN_BUCKETS; i++) {
        w->epoch[i] = -1;
        w->a[i] = w->b[i] = 0;
    }
}

static int64_t fb_window_now(const fb_window_t *w, int64_t now_ms)
{
    return now_ms > w->last_ms ? now_ms : w->last_ms;
}

/* Bucket e covers [e*width, (e+1)*width). The window at now is the current
 * bucket and the FB_WIN_BUCKETS-1 before it. */
void fb_window_add(fb_window_t *w, int64_t now_ms, int64_t da, int64_t db)
{
    w->last_ms = fb_window_now(w, now_ms);
    int64_t e = w->last_ms / w->width_ms;
    int i = (int)(e % FB_WIN_BUCKETS);
    if (w->epoch[i] != e) {
        w->epoch[i] = e;
        w->a[i] = w->b[i] = 0;
    }
    w->a[i] += da;
    w->b[i] += db;
}

void fb_window_sum(fb_window_t *w, int64_t now_ms, int64_t *a, int64_t *b)
{
    int64_t e = fb_window_now(w, now_ms) / w->width_ms, sa = 0, sb = 0;
    for (int i = 0; i < FB_WIN_BUCKETS; i++)
        if (w->epoch[i] > e - FB_WIN_BUCKETS && w->epoch[i] <= e) {
            sa += w->a[i];
            sb += w->b[i];
        }
    *a = sa;
    *b = sb;
}

/* ---- metrics -------------------------------------------------------------- */

fb_metrics_t fb_m;
static pthread_once_t fb_metrics_once = PTHREAD_ONCE_INIT;

static const char *const fb_tier_names[FB_TIER_COUNT] = {"retry", "local", "template", "queue"};

const char *fb_tier_name(fb_tier_t t)
{
    return (unsigned)t < FB_TIER_COUNT ? fb_tier_names[t] : "unknown";
}

static void fb_metrics_register(void)
{
    fb_m.fallback = sl_metric_register("sluice_fallback_total",
                                       "Requests served by a fallback tier (retry, local, "
                                       "template, queue).",
                                       SL_METRIC_COUNTER, "tier", NULL, 0);
    for (int t = 0; t < FB_TIER_COUNT; t++)
        fb_m.tier[t] = sl_metric_series1(fb_m.fallback, fb_tier_names[t]);
    fb_m.retries = sl_metric_register("sluice_retries_total", "Retries of upstream attempts.",
                                      SL_METRIC_COUNTER, "upstream", NULL, 0);
    fb_m.budget_out =
        sl_metric_register("sluice_retry_budget_exhausted_total",
                           "Retries refused because the pool's retry budget was spent.",
                           SL_METRIC_COUNTER, "upstream", NULL, 0);
    fb_m.circuit_state = sl_metric_register(
        "sluice_circuit_state", "Circuit breaker state per server: 0 closed, 1 half-open, 2 open.",
        SL_METRIC_GAUGE, "upstream,server", NULL, 0);
    fb_m.circuit_opened =
        sl_metric_register("sluice_circuit_opened_total", "Times a server's circuit opened.",
                           SL_METRIC_COUNTER, "upstream,server", NULL, 0);
    fb_m.q_depth = sl_metric_gauge0("sluice_queue_depth", "Queued requests waiting for delivery.");
    fb_m.q_oldest = sl_metric_gauge0("sluice_queue_oldest_pending_seconds",
                                     "Age of the oldest queued request not yet delivered.");
    fb_m.q_accepted =
        sl_metric_counter0("sluice_queue_accepted_total", "Requests stored in the queue.");
    fb_m.q_delivered = sl_metric_counter0("sluice_queue_delivered_total",
                                          "Queued requests delivered (answer stored).");
    fb_m.q_dead = sl_metric_counter0("sluice_queue_dead_letters_total",
                                     "Queued requests dead-lettered (attempts, age or rejected).");
    fb_m.q_full = sl_metric_counter0("sluice_queue_full_total",
                                     "Requests not queued because max_pending were waiting.");
    fb_m.q_store_errors = sl_metric_counter0("sluice_queue_store_errors_total",
                                             "Queue operations that failed in the store.");
    sl_metric_t *late = sl_metric_register(
        "sluice_queue_late_total",
        "Redis queue accepts answered as not stored (deadline passed), by what the take-back "
        "found: refused (had not run: it never will), undone (had run: taken back), kept "
        "(a worker had it already).",
        SL_METRIC_COUNTER, "result", NULL, 0);
    fb_m.q_late_refused = sl_metric_series1(late, "refused");
    fb_m.q_late_undone = sl_metric_series1(late, "undone");
    fb_m.q_late_kept = sl_metric_series1(late, "kept");
    fb_m.q_store_late = sl_metric_gauge0(
        "sluice_queue_store_late",
        "Accepts the Redis queue's script refused as past their "
        "deadline or taken back, every instance sharing it (sluice:q:stats late).");
    fb_m.q_takeback_waiting = sl_metric_gauge0(
        "sluice_queue_takebacks_waiting",
        "Take-backs of accepts answered as not stored that Redis has not answered yet "
        "(the connection was down or dropped): sent again every 100 ms.");
    fb_m.q_fsync =
        sl_metric_counter0("sluice_queue_fsyncs_total", "fdatasync calls of the journal.");
    fb_m.idem_replays = sl_metric_counter0("sluice_idempotent_replays_total",
                                           "Answers replayed for a repeated Idempotency-Key.");
    fb_m.idem_in_flight =
        sl_metric_counter0("sluice_idempotency_in_flight_total",
                           "Requests refused (409) while the same key was in flight.");
    fb_m.idem_mismatch =
        sl_metric_counter0("sluice_idempotency_mismatch_total",
                           "Requests refused (422): the key was used with another body.");
    fb_m.idem_evicted = sl_metric_counter0("sluice_idempotency_evicted_total",
                                           "Keys dropped early because the store was full.");
    fb_m.idem_store_errors = sl_metric_counter0("sluice_idempotency_store_errors_total",
                                                "Idempotency checks that failed in the store.");
    fb_m.faults = sl_metric_register("sluice_faults_injected_total",
                                     "Faults injected (kind abort|delay, source conf|header).",
                                     SL_METRIC_COUNTER, "kind,source", NULL, 0);
}

void fb_metrics_init(void)
{
    pthread_once(&fb_metrics_once, fb_metrics_register);
}

void fb_count_tier(fb_tier_t t)
{
    fb_metrics_init();
    if ((unsigned)t < FB_TIER_COUNT)
        sl_counter_add(fb_m.tier[t], 1);
}

/* ---- helpers -------------------------------------------------------------- */

void fb_sha256(const void *a, size_t alen, const void *b, size_t blen, const void *c, size_t clen,
               unsigned char out[32])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned int n = 32;
    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1 ||
        (a && EVP_DigestUpdate(ctx, a, alen) != 1) || (b && EVP_DigestUpdate(ctx, b, blen) != 1) ||
        (c && EVP_DigestUpdate(ctx, c, clen) != 1) || EVP_DigestFinal_ex(ctx, out, &n) != 1)
        abort(); /* only on OOM inside OpenSSL */
    EVP_MD_CTX_free(ctx);
}

uint64_t fb_rand64(void)
{
    static _Thread_local uint64_t s;
    if (!s) {
        if (RAND_bytes((unsigned char *)&s, sizeof(s)) != 1)
            s = (uint64_t)sl_now_ns();
        s |= 1;
    }
    /* xorshift64*: jitter and sampling need speed, not secrecy. */
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1DULL;
}

void fb_call_cancel(fb_call_t *c)
{
    if (!c)
        return;
    sl_redis_call_cancel(c->rc);
    c->free_ctx(c);
}
