/*
 * fb_internal.h — what the fallback/ sources share and nothing else sees:
 * the sliding-window counter (retry budget, breaker ratio), the metric
 * handles, digests and the small Redis call wrapper.
 */
#ifndef SL_FB_INTERNAL_H
#define SL_FB_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/metrics.h"
#include "common/redis.h"
#include "fallback/fallback.h"

/* ---- sliding window: FB_WIN_BUCKETS buckets of two counters ------------ */

#define FB_WIN_BUCKETS 10

/* Not thread-safe: its owner's lock protects it. */
typedef struct fb_window {
    int64_t width_ms; /* window / FB_WIN_BUCKETS, >= 1 */
    int64_t last_ms;  /* the latest add's time: the window never goes back */
    int64_t epoch[FB_WIN_BUCKETS];
    int64_t a[FB_WIN_BUCKETS], b[FB_WIN_BUCKETS];
} fb_window_t;

void fb_window_init(fb_window_t *w, int64_t window_ms);
/* Changes the width; counts are kept (they age out at the new pace). */
void fb_window_resize(fb_window_t *w, int64_t window_ms);
void fb_window_add(fb_window_t *w, int64_t now_ms, int64_t da, int64_t db);
/* Sums over the buckets still inside the window at now. Both take now as
 * max(now, the latest add's time): a caller whose clock read is older than
 * another thread's (read before it took the owner's lock) counts in, and
 * reads, the window as it is, never a bucket a newer clock has dropped or
 * before one a newer clock has filled. A sum at a later time is a pure read:
 * it does not move the window. */
void fb_window_sum(fb_window_t *w, int64_t now_ms, int64_t *a, int64_t *b);
void fb_window_clear(fb_window_t *w);

/* ---- metrics -------------------------------------------------------------- */

typedef struct fb_metrics {
    sl_metric_t *fallback;       /* {tier} */
    sl_metric_t *retries;        /* {upstream} */
    sl_metric_t *budget_out;     /* {upstream} */
    sl_metric_t *circuit_state;  /* {upstream,server} */
    sl_metric_t *circuit_opened; /* {upstream,server} */
    sl_mseries_t *q_depth, *q_oldest, *q_accepted, *q_delivered, *q_dead, *q_full, *q_store_errors,
        *q_fsync;
    /* accepts sluice gave up on, by what the take-back found: refused (had
     * not run), undone (had run; taken back), kept (already taken) */
    sl_mseries_t *q_late_refused, *q_late_undone, *q_late_kept;
    sl_mseries_t *q_store_late;       /* the store's own count of accepts it refused as late */
    sl_mseries_t *q_takeback_waiting; /* take-backs not yet answered by Redis, all workers */
    sl_mseries_t *idem_replays, *idem_in_flight, *idem_mismatch, *idem_evicted, *idem_store_errors;
    sl_metric_t *faults; /* {kind,source} */
    sl_mseries_t *tier[FB_TIER_COUNT];
} fb_metrics_t;
extern fb_metrics_t fb_m;

/* ---- helpers -------------------------------------------------------------- */

/* SHA-256 of the parts (NULL-terminated list of (ptr, len) pairs is
 * overkill here: up to three parts, unused ones NULL). out: 32 bytes. */
void fb_sha256(const void *a, size_t alen, const void *b, size_t blen, const void *c, size_t clen,
               unsigned char out[32]);

/* A process-wide fast random (xorshift per thread, seeded from OpenSSL). */
uint64_t fb_rand64(void);

/* A Redis call of ours: the first member of each call's context, so that
 * cancelling it cancels the client call and frees the whole context. */
struct fb_call {
    sl_redis_call_t *rc;
    void (*free_ctx)(void *ctx);
};

/* ---- Redis's clock against ours (qclock.c) -------------------------------- */

/* The most two clocks may run apart (sluice's monotonic clock, slewed by
 * NTP, against Redis's wall clock): NTP slews each by at most 500 ppm. */
#define FB_QCLOCK_DRIFT_PPM 1000

/* Redis's clock = ours + off_us, within err_us, as of our at_us (all µs;
 * ours is sl_now_ns()/1000). Not thread-safe: its owner's lock protects it. */
typedef struct fb_qclock {
    bool known;
    int64_t off_us, err_us, at_us;
} fb_qclock_t;

/* Takes a reply carrying Redis's TIME redis_us to a call made at send_us
 * and answered at recv_us: keeps whichever of the estimate and the sample
 * is tighter at recv_us, or the sample when the two disagree beyond their
 * bounds (a clock was stepped). */
void fb_qclock_sample(fb_qclock_t *c, int64_t send_us, int64_t recv_us, int64_t redis_us);
/* The estimate's error bound at our at_us, drift included; INT64_MAX if
 * nothing is known. */
int64_t fb_qclock_err(const fb_qclock_t *c, int64_t at_us);
/* A Redis time that Redis's clock has surely passed, less margin_us, by
 * the time ours reaches local_us: 0 with *redis_us, -1 if nothing is known. */
int fb_qclock_deadline(const fb_qclock_t *c, int64_t local_us, int64_t margin_us,
                       int64_t *redis_us) SL_WUR;

#endif

/* ---- the queue's Redis store (queue_redis.c), behind fb_queue_* ------------ */

typedef struct fb_qredis fb_qredis_t;

/* A take-back (queue_redis.c) kept until Redis answers it. */
#define FB_QR_TAKEBACKS 64
typedef struct fb_qr_tb {
    struct fb_qworker *w;
    char id[FB_QUEUE_ID_LEN + 1];
    bool used; /* waiting for Redis's answer */
    bool out;  /* a call for it is on its way */
} fb_qr_tb_t;

/* A queue worker: the journal needs only q; the Redis store also has the
 * worker thread's client and its consumer name in the group. The first
 * Redis worker of a store also refreshes the queue gauges every second
 * (stats_tick): the gateway's maintenance runs on a thread without a
 * worker, so fb_queue_maintain(q, NULL) cannot ask Redis itself. The
 * take-backs Redis has not answered yet are sent again by tb_retry. */
struct fb_qworker {
    fb_queue_t *q;
    fb_qredis_t *r;
    sl_redis_t *redis;
    struct event *stats_tick;
    struct event *tb_retry;
    fb_qr_tb_t tb[FB_QR_TAKEBACKS];
    char consumer[96];
};
fb_qredis_t *fb_qr_new(fb_queue_t *q, const conf_fb_queue_t *c, const conf_redis_t *redis,
                       char *err, size_t errlen);
void fb_qr_free(fb_qredis_t *r);
fb_qworker_t *fb_qr_worker_new(fb_queue_t *q, fb_qredis_t *r, struct event_base *base, char *err,
                               size_t errlen);
void fb_qr_worker_free(fb_qworker_t *w);
fb_rc_t fb_qr_accept(fb_qworker_t *w, const char *id, const fb_qaccept_t *in, int64_t now,
                     fb_qres_t *res, fb_queue_cb cb, void *arg, fb_call_t **call);
fb_rc_t fb_qr_next(fb_qworker_t *w, int64_t now, fb_qres_t *res, fb_queue_cb cb, void *arg,
                   fb_call_t **call);
fb_rc_t fb_qr_report(fb_qworker_t *w, const char *id, fb_qoutcome_t o, const void *result,
                     size_t len, int64_t now, uint64_t rnd, fb_qres_t *res, fb_queue_cb cb,
                     void *arg, fb_call_t **call);
fb_rc_t fb_qr_lookup(fb_qworker_t *w, const char *id, const char *user, int64_t now, fb_qres_t *res,
                     fb_queue_cb cb, void *arg, fb_call_t **call);
void fb_qr_maintain(fb_qworker_t *w);
void fb_qr_stats(fb_qredis_t *r, fb_qstats_t *st);

/* What queue.c lends the Redis store: the clock, ids and the backoff. */
int64_t fb_queue_now(fb_queue_t *q);
uint64_t fb_queue_rand(fb_queue_t *q);
