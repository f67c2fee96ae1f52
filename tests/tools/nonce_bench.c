/*
 * nonce_bench — what one insert into the in-process nonce store costs
 * (auth_nonce_insert: the replay lookup, the expiry of passed time
 * buckets, the add) with the store holding LIVE nonces in a steady state:
 * fresh nonces at a steady rate, each kept for bench/policy.sh's window
 * (300 s), on a simulated clock, so the store holds ~LIVE entries as it
 * would at LIVE / 308 signed requests/s. Keys are random 16 bytes, as the
 * SHA-256 prefixes auth_nonce_key makes.
 *
 *   build/tools/nonce_bench LIVE [MEASURED]    (MEASURED default 1000000)
 *   build/tools/nonce_bench --hold LIVE
 *
 * --hold: the longest single insert (this thread's CPU ns) while the store
 * fills from empty to LIVE and through one more window (tables growing),
 * then through three windows of a trickle (tables shrinking where the
 * store gives memory back), with auth_stores_maintain once a simulated
 * second as the gateway's tick: one thread, so an insert's time bounds
 * its shard lock's hold, measured here and not in the product (a tick
 * holds each shard's lock for steps of it). The tick is made a lock hold
 * at a time (auth_nonce_maintain_step, as auth_stores_maintain makes it)
 * and each hold timed inside the store: the longest, and how many took
 * 100 us or more, while tables grow and while they shrink. Also the table
 * bytes at the peak and after every nonce has expired.
 *
 * The store is filled first (one window and a bucket of simulated time),
 * then MEASURED inserts are timed (this thread's CPU time: the machine is
 * shared). Under `valgrind --tool=callgrind --collect-atstart=no
 * --cache-sim=yes` only the measured inserts are counted (the tool toggles
 * collection around them): instructions and cache misses per insert,
 * load-immune (bench/nonce_store.sh).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "auth/auth_internal.h"

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define BENCH_COLLECT() CALLGRIND_TOGGLE_COLLECT
#else
#define BENCH_COLLECT() ((void)0)
#endif

#define WINDOW_S 300

static uint64_t rng = 0x9e3779b97f4a7c15ULL;

/* splitmix64: a fresh, uniformly random key per insert */
static uint64_t next64(void)
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t tick_worst;        /* --hold: the longest auth_stores_maintain */
static long over_100us, over_1ms; /* --hold: inserts that took that long */
static int64_t hold_worst;        /* --hold: the tick's longest single lock hold */
static long holds, holds_over_100us;

typedef struct feed {
    auth_stores_t *s;
    long per_s; /* inserts per simulated second */
    long in_s;  /* inserts made in the current second */
    int64_t now;
} feed_t;

static void feed_one(feed_t *f)
{
    unsigned char k[AUTH_NONCE_KEY_LEN];
    uint64_t a = next64(), b = next64();
    memcpy(k, &a, 8);
    memcpy(k + 8, &b, 8);
    if (auth_nonce_insert(f->s, k, f->now + WINDOW_S, f->now) != AUTH_STORE_NEW) {
        fprintf(stderr, "nonce_bench: a fresh nonce was refused\n");
        exit(1);
    }
    if (++f->in_s == f->per_s) {
        f->in_s = 0;
        f->now++;
    }
}

/* auth_stores_maintain, a hold at a time, each hold timed (the store
 * reads this thread's CPU clock just inside and just outside its lock). */
static void tick_timed(auth_stores_t *s, int64_t now)
{
    for (unsigned i = 0; i < AUTH_NONCE_SHARDS; i++) {
        for (int k = 0; k < AUTH_NONCE_TICK_HOLDS; k++) {
            int64_t h = 0;
            bool more = auth_nonce_maintain_step(s, i, now, &h);
            hold_worst = h > hold_worst ? h : hold_worst;
            holds++;
            holds_over_100us += h >= 100000;
            if (!more)
                break;
        }
    }
}

/* One insert (or tick), timed: this thread's CPU time, so a preemption by
 * another process on the shared machine is not counted as a hold. */
static int64_t timed_feed(feed_t *f, int64_t *worst)
{
    int64_t t0 = cpu_ns();
    int64_t sec = f->now;
    feed_one(f);
    int64_t d = cpu_ns() - t0;
    *worst = d > *worst ? d : *worst;
    over_100us += d >= 100000;
    over_1ms += d >= 1000000;
    if (f->now != sec) { /* a simulated second passed: the gateway's tick */
        int64_t t1 = cpu_ns();
        tick_timed(f->s, f->now);
        int64_t dt = cpu_ns() - t1;
        tick_worst = dt > tick_worst ? dt : tick_worst;
    }
    return d;
}

/* The longest insert while the store fills to `live` and is fed for
 * another window at the same rate; then a trickle of one insert a second
 * for three windows, with the tick each second, lets the store give its
 * tables back. */
static int hold_main(long live)
{
    long per_s = live / (WINDOW_S + AUTH_NONCE_BUCKET_S / 2);
    auth_stores_t *s = auth_stores_new((size_t)(live + live / 8 + 4096), 0);
    if (!s)
        return 1;
    feed_t f = {.s = s, .per_s = per_s, .now = 1700000000};
    long n = per_s * (2 * WINDOW_S + 2 * AUTH_NONCE_BUCKET_S);
    int64_t worst = 0, sum = 0;
    for (long i = 0; i < n; i++)
        sum += timed_feed(&f, &worst);
    size_t peak = auth_stores_nonce_table_bytes(s);
    size_t held = auth_stores_nonce_live(s);
    int64_t fill_tick = tick_worst, fill_hold = hold_worst;
    long o100 = over_100us, o1 = over_1ms, fill_holds = holds, fill_h100 = holds_over_100us;
    tick_worst = 0;
    hold_worst = 0;
    holds = holds_over_100us = 0;
    f.per_s = 1;
    f.in_s = 0;
    int64_t qworst = 0;
    for (long i = 0; i < 3 * WINDOW_S; i++)
        (void)timed_feed(&f, &qworst);
    printf("nonce_bench hold live=%zu inserts=%ld max_insert_cpu_ns=%lld mean_insert_cpu_ns=%.1f "
           "over_100us=%ld over_1ms=%ld max_tick_cpu_ns=%lld table_bytes_peak=%zu "
           "table_bytes_after=%zu "
           "quiet_max_insert_cpu_ns=%lld quiet_max_tick_cpu_ns=%lld "
           "max_tick_hold_cpu_ns=%lld tick_holds=%ld tick_holds_over_100us=%ld "
           "quiet_max_tick_hold_cpu_ns=%lld quiet_tick_holds=%ld quiet_tick_holds_over_100us=%ld\n",
           held, n, (long long)worst, (double)sum / (double)n, o100, o1, (long long)fill_tick, peak,
           auth_stores_nonce_table_bytes(s), (long long)qworst, (long long)tick_worst,
           (long long)fill_hold, fill_holds, fill_h100, (long long)hold_worst, holds,
           holds_over_100us);
    auth_stores_free(s);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--hold") == 0)
        return hold_main(atol(argv[2]));
    if (argc < 2) {
        fprintf(stderr, "usage: nonce_bench LIVE [MEASURED] | --hold LIVE\n");
        return 2;
    }
    long live = atol(argv[1]);
    long measured = argc > 2 ? atol(argv[2]) : 1000000;
    if (live < 1000 || measured < 1) {
        fprintf(stderr, "nonce_bench: LIVE >= 1000, MEASURED >= 1\n");
        return 2;
    }
    /* kept for the window plus, on average, half a bucket */
    long per_s = live / (WINDOW_S + AUTH_NONCE_BUCKET_S / 2);
    if (per_s < 1)
        per_s = 1;
    /* room for the peak: a bucket's worth above the steady state */
    auth_stores_t *s = auth_stores_new((size_t)(live + live / 8 + 4096), 0);
    if (!s)
        return 1;
    feed_t f = {.s = s, .per_s = per_s, .now = 1700000000};
    long warm = per_s * (WINDOW_S + 2 * AUTH_NONCE_BUCKET_S);
    for (long i = 0; i < warm; i++)
        feed_one(&f);
    size_t live0 = auth_stores_nonce_live(s);
    BENCH_COLLECT();
    int64_t c0 = cpu_ns();
    for (long i = 0; i < measured; i++)
        feed_one(&f);
    int64_t c1 = cpu_ns();
    BENCH_COLLECT();
    printf("nonce_bench live=%zu..%zu held=%zu inserts=%ld rate=%ld/s cpu_ns_per_insert=%.1f\n",
           live0, auth_stores_nonce_live(s), auth_stores_nonce_count(s), measured, per_s,
           (double)(c1 - c0) / (double)measured);
    auth_stores_free(s);
    return 0;
}
