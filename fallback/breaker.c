/*
 * breaker.c — the circuit breaker of one upstream server, and the
 * process-wide set of them keyed by (upstream, server URL) so a reload
 * keeps each server's state.
 *
 * closed --(failures in a row, or failure_percent of >= min_requests
 *           results in the window)--> open
 * open   --(cooldown passed; noticed lazily by the next read)--> half-open
 * half-open: `probes` requests are admitted; all succeeding -> closed, one
 *           failing -> open for another cooldown.
 *
 * Reads (state, eligibility, admission while closed) are lock-free atomics;
 * transitions and the window take the breaker's small lock.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>

#include "common/log.h"
#include "common/sl.h"
#include "fallback/fb_internal.h"

struct fb_breaker {
    pthread_mutex_t lock;
    _Atomic int state;          /* fb_circuit_state_t as last brought up to date */
    _Atomic int64_t open_until; /* OPEN: when it may go half-open */
    _Atomic int probes_out;     /* HALF_OPEN: probes admitted and not yet reported */
    _Atomic int consecutive;    /* failures in a row (CLOSED) */
    int probe_ok;               /* HALF_OPEN: probes that succeeded this round */
    int64_t half_since;         /* HALF_OPEN: when it became so */
    fb_window_t win;            /* a = results, b = failures */
    int64_t failures, percent, min_requests, cooldown_ms, probes;
    char *upstream, *server;
    sl_mseries_t *m_state, *m_opened;
    char *key; /* registry: "upstream\nserver" */
    UT_hash_handle hh;
};

static const char *const fb_state_names[] = {"closed", "half_open", "open"};

const char *fb_circuit_state_name(fb_circuit_state_t s)
{
    return (unsigned)s < SL_ARRAY_LEN(fb_state_names) ? fb_state_names[s] : "unknown";
}

static void fb_breaker_params(fb_breaker_t *b, const conf_fb_circuit_t *c)
{
    b->failures = c->failures;
    b->percent = c->failure_percent;
    b->min_requests = c->min_requests > 0 ? c->min_requests : 1;
    b->cooldown_ms = c->cooldown_ms;
    b->probes = c->probes > 0 ? c->probes : 1;
}

fb_breaker_t *fb_breaker_new(const conf_fb_circuit_t *c, const char *upstream, const char *server)
{
    fb_metrics_init();
    fb_breaker_t *b = sl_xcalloc(1, sizeof(*b));
    pthread_mutex_init(&b->lock, NULL);
    fb_window_init(&b->win, c->window_ms);
    fb_breaker_params(b, c);
    b->upstream = sl_xstrdup(upstream ? upstream : "");
    b->server = sl_xstrdup(server ? server : "");
    const char *labels[2] = {b->upstream, b->server};
    b->m_state = sl_metric_series(fb_m.circuit_state, labels);
    b->m_opened = sl_metric_series(fb_m.circuit_opened, labels);
    sl_gauge_set(b->m_state, FB_CIRCUIT_CLOSED);
    return b;
}

void fb_breaker_free(fb_breaker_t *b)
{
    if (!b)
        return;
    pthread_mutex_destroy(&b->lock);
    free(b->upstream);
    free(b->server);
    free(b->key);
    free(b);
}

void fb_breaker_configure(fb_breaker_t *b, const conf_fb_circuit_t *c)
{
    pthread_mutex_lock(&b->lock);
    fb_window_resize(&b->win, c->window_ms);
    fb_breaker_params(b, c);
    pthread_mutex_unlock(&b->lock);
}

/* Under the lock. */
static void fb_breaker_set(fb_breaker_t *b, fb_circuit_state_t s, int64_t now_ms)
{
    int old = atomic_load(&b->state);
    if (s == FB_CIRCUIT_OPEN) {
        atomic_store(&b->open_until, now_ms + b->cooldown_ms);
        if (old != FB_CIRCUIT_OPEN) {
            sl_counter_add(b->m_opened, 1);
            sl_warn("circuit %s %s: open for %lld ms", b->upstream, b->server,
                    (long long)b->cooldown_ms);
        }
    } else if (s == FB_CIRCUIT_HALF_OPEN) {
        atomic_store(&b->probes_out, 0);
        b->probe_ok = 0;
        b->half_since = now_ms;
    } else {
        atomic_store(&b->consecutive, 0);
        fb_window_clear(&b->win);
        if (old != FB_CIRCUIT_CLOSED)
            sl_info("circuit %s %s: closed", b->upstream, b->server);
    }
    atomic_store(&b->state, s);
    sl_gauge_set(b->m_state, s);
}

/* Under the lock: open -> half-open once the cooldown is over. */
static fb_circuit_state_t fb_breaker_update(fb_breaker_t *b, int64_t now_ms)
{
    int s = atomic_load(&b->state);
    if (s == FB_CIRCUIT_OPEN && now_ms >= atomic_load(&b->open_until)) {
        fb_breaker_set(b, FB_CIRCUIT_HALF_OPEN, now_ms);
        s = FB_CIRCUIT_HALF_OPEN;
    }
    return (fb_circuit_state_t)s;
}

fb_circuit_state_t fb_breaker_state(fb_breaker_t *b, int64_t now_ms)
{
    int s = atomic_load_explicit(&b->state, memory_order_acquire);
    if (s != FB_CIRCUIT_OPEN || now_ms < atomic_load_explicit(&b->open_until, memory_order_acquire))
        return (fb_circuit_state_t)s;
    pthread_mutex_lock(&b->lock);
    fb_circuit_state_t r = fb_breaker_update(b, now_ms);
    pthread_mutex_unlock(&b->lock);
    return r;
}

bool fb_breaker_eligible(fb_breaker_t *b, int64_t now_ms)
{
    switch (fb_breaker_state(b, now_ms)) {
    case FB_CIRCUIT_CLOSED:
        return true;
    case FB_CIRCUIT_HALF_OPEN:
        return atomic_load(&b->probes_out) < b->probes;
    default:
        return false;
    }
}

int64_t fb_breaker_wait_ms(fb_breaker_t *b, int64_t now_ms, int64_t probe_wait_ms)
{
    switch (fb_breaker_state(b, now_ms)) {
    case FB_CIRCUIT_CLOSED:
        return 0;
    case FB_CIRCUIT_HALF_OPEN:
        return atomic_load(&b->probes_out) < b->probes ? 0 : probe_wait_ms;
    default: {
        int64_t left = atomic_load(&b->open_until) - now_ms;
        return left > 0 ? left : 0;
    }
    }
}

fb_admit_t fb_breaker_acquire(fb_breaker_t *b, int64_t now_ms)
{
    if (atomic_load_explicit(&b->state, memory_order_acquire) == FB_CIRCUIT_CLOSED)
        return FB_ADMIT_YES;
    pthread_mutex_lock(&b->lock);
    fb_admit_t a = FB_ADMIT_NO;
    switch (fb_breaker_update(b, now_ms)) {
    case FB_CIRCUIT_CLOSED:
        a = FB_ADMIT_YES;
        break;
    case FB_CIRCUIT_HALF_OPEN:
        /* Probes that never reported (a bug upstream of us) must not wedge
         * the circuit half-open: after a cooldown they are written off. */
        if (atomic_load(&b->probes_out) >= b->probes && now_ms - b->half_since >= b->cooldown_ms) {
            atomic_store(&b->probes_out, 0);
            b->probe_ok = 0;
            b->half_since = now_ms;
        }
        if (atomic_load(&b->probes_out) < b->probes) {
            atomic_fetch_add(&b->probes_out, 1);
            a = FB_ADMIT_PROBE;
        }
        break;
    case FB_CIRCUIT_OPEN:
        break;
    }
    pthread_mutex_unlock(&b->lock);
    return a;
}

void fb_breaker_report(fb_breaker_t *b, fb_admit_t how, bool ok, int64_t now_ms)
{
    if (how == FB_ADMIT_NO)
        return;
    pthread_mutex_lock(&b->lock);
    fb_circuit_state_t s = fb_breaker_update(b, now_ms);
    if (how == FB_ADMIT_PROBE) {
        if (atomic_load(&b->probes_out) > 0)
            atomic_fetch_sub(&b->probes_out, 1);
        if (s == FB_CIRCUIT_HALF_OPEN) {
            if (!ok)
                fb_breaker_set(b, FB_CIRCUIT_OPEN, now_ms);
            else if (++b->probe_ok >= b->probes)
                fb_breaker_set(b, FB_CIRCUIT_CLOSED, now_ms);
        }
    } else if (s == FB_CIRCUIT_CLOSED) {
        /* Results of requests admitted before the circuit opened say
         * nothing new once it is open or probing: only closed counts. */
        fb_window_add(&b->win, now_ms, 1, ok ? 0 : 1);
        int consec = ok ? 0 : atomic_load(&b->consecutive) + 1;
        atomic_store(&b->consecutive, consec);
        int64_t results, fails;
        fb_window_sum(&b->win, now_ms, &results, &fails);
        if (!ok &&
            ((b->failures > 0 && consec >= b->failures) ||
             (b->percent > 0 && results >= b->min_requests && fails * 100 >= b->percent * results)))
            fb_breaker_set(b, FB_CIRCUIT_OPEN, now_ms);
    }
    pthread_mutex_unlock(&b->lock);
}

void fb_breaker_cancel(fb_breaker_t *b, fb_admit_t how)
{
    if (how != FB_ADMIT_PROBE)
        return;
    pthread_mutex_lock(&b->lock);
    if (atomic_load(&b->probes_out) > 0)
        atomic_fetch_sub(&b->probes_out, 1);
    pthread_mutex_unlock(&b->lock);
}

void fb_breaker_hold(fb_breaker_t *b, int64_t until_ms, int64_t now_ms)
{
    if (until_ms <= now_ms)
        return;
    pthread_mutex_lock(&b->lock);
    int s = atomic_load(&b->state);
    if (s != FB_CIRCUIT_OPEN || atomic_load(&b->open_until) < until_ms) {
        fb_breaker_set(b, FB_CIRCUIT_OPEN, now_ms);
        atomic_store(&b->open_until, until_ms);
    }
    pthread_mutex_unlock(&b->lock);
}

int fb_breaker_failures(fb_breaker_t *b)
{
    return atomic_load(&b->consecutive);
}

int64_t fb_breaker_open_remaining_ms(fb_breaker_t *b, int64_t now_ms)
{
    if (fb_breaker_state(b, now_ms) != FB_CIRCUIT_OPEN)
        return 0;
    int64_t left = atomic_load_explicit(&b->open_until, memory_order_acquire) - now_ms;
    return left > 0 ? left : 0;
}

/* ---- the set ---------------------------------------------------------------- */

struct fb_breakers {
    pthread_mutex_t lock;
    fb_breaker_t *by_key;
};

fb_breakers_t *fb_breakers_new(void)
{
    fb_breakers_t *r = sl_xcalloc(1, sizeof(*r));
    pthread_mutex_init(&r->lock, NULL);
    return r;
}

void fb_breakers_free(fb_breakers_t *r)
{
    if (!r)
        return;
    fb_breaker_t *b, *tmp;
    HASH_ITER(hh, r->by_key, b, tmp)
    {
        HASH_DEL(r->by_key, b);
        fb_breaker_free(b);
    }
    pthread_mutex_destroy(&r->lock);
    free(r);
}

fb_breaker_t *fb_breakers_get(fb_breakers_t *r, const conf_fb_circuit_t *c, const char *upstream,
                              const char *server)
{
    size_t ul = strlen(upstream), sl = strlen(server);
    char *key = sl_xmalloc(ul + sl + 2);
    memcpy(key, upstream, ul);
    key[ul] = '\n';
    memcpy(key + ul + 1, server, sl + 1);
    pthread_mutex_lock(&r->lock);
    fb_breaker_t *b = NULL;
    HASH_FIND_STR(r->by_key, key, b);
    if (b) {
        free(key);
        fb_breaker_configure(b, c);
    } else {
        b = fb_breaker_new(c, upstream, server);
        b->key = key;
        HASH_ADD_KEYPTR(hh, r->by_key, b->key, strlen(b->key), b);
    }
    pthread_mutex_unlock(&r->lock);
    return b;
}

size_t fb_breakers_refresh(fb_breakers_t *r, int64_t now_ms)
{
    size_t open = 0;
    pthread_mutex_lock(&r->lock);
    for (fb_breaker_t *b = r->by_key; b; b = b->hh.next)
        open += fb_breaker_state(b, now_ms) == FB_CIRCUIT_OPEN;
    pthread_mutex_unlock(&r->lock);
    return open;
}
