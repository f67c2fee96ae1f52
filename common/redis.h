/*
 * redis.h — a Redis client for sluice's worker threads: hiredis async on the
 * worker's libevent base, with what Debian's hiredis 0.14 lacks — a deadline
 * on every call, reconnection with backoff, and cancellation.
 *
 * One sl_redis_t per event_base (per worker thread); it is not thread-safe.
 * Callbacks always run later on that base's thread, never inside the call
 * that queued them. A call ends exactly once: with a reply, an error, a
 * timeout, DOWN (not connected / connection lost), or silently when
 * cancelled. Every status other than OK is counted in
 * sluice_redis_errors_total{kind} (kind: down, timeout, overload, plus the
 * connection's own troubles: connect, auth, stall, noscript, and "reply" for
 * Redis error replies handed back with OK); sluice_redis_connected is a
 * gauge of the clients whose connection is up (one per worker thread).
 *
 * Connection: the host is resolved by hiredis with a blocking getaddrinfo()
 * at each (re)connect, so prefer an address or an /etc/hosts name. hiredis
 * writes with write(2): the process must ignore SIGPIPE (the gateway does).
 * While disconnected (between backoff attempts) calls end with DOWN at once
 * rather than waiting out their deadline, so a dead Redis costs no latency.
 * A connection that answers nothing for max(1 s, 10 x timeout) while calls
 * are outstanding is dropped and re-made (a silent network partition).
 */
#ifndef SL_REDIS_H
#define SL_REDIS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sl.h"

struct event_base;
struct redisReply;

typedef struct sl_redis_opts {
    const char *url;            /* redis://[:password@]host[:port][/db] */
    int64_t timeout_ms;         /* per-call deadline, default 50 */
    int64_t reconnect_min_ms;   /* backoff start, default 100 */
    int64_t reconnect_max_ms;   /* backoff cap, default 5000 */
    int64_t connect_timeout_ms; /* TCP connect + AUTH/SELECT, default 1000 */
    /* Called when the connection becomes usable and when a usable one is
     * lost (sl_redis_connected() already tells the new state), from inside
     * the event loop, possibly from a hiredis callback: it must not free
     * the client. Optional. */
    void (*on_state)(void *arg);
    void *state_arg;
} sl_redis_opts_t;

typedef enum sl_redis_status {
    SL_REDIS_OK = 0,  /* reply is valid (may be a Redis error reply: check its type) */
    SL_REDIS_DOWN,    /* not connected, or the connection dropped before the reply */
    SL_REDIS_TIMEOUT, /* no reply within the deadline (a late reply is dropped) */
} sl_redis_status_t;

/* reply: borrowed, valid only during the callback; NULL unless status is OK. */
typedef void (*sl_redis_cb)(void *arg, sl_redis_status_t status, struct redisReply *reply);

typedef struct sl_redis sl_redis_t;
typedef struct sl_redis_call sl_redis_call_t;
typedef struct sl_redis_script sl_redis_script_t;

/* The wait before reconnect attempt with backoff_ms, rnd the jitter's
 * randomness: in [3/4, 1] of backoff_ms, so never above the cap. */
int64_t sl_redis_backoff_delay(int64_t backoff_ms, uint64_t rnd);

/* Connects in the background; calls made before the connection is up wait
 * for it within their deadline. NULL on a bad URL (err says why). */
sl_redis_t *sl_redis_new(struct event_base *base, const sl_redis_opts_t *opts, char *err,
                         size_t errlen) SL_WUR;
/* Drops every pending call WITHOUT running its callback: call it only when
 * the owners of pending calls are gone (worker shutdown), and never from
 * inside one of this client's callbacks (that is a bug: it aborts). */
void sl_redis_free(sl_redis_t *r);

/* Checks a redis:// URL without connecting (for the conf loader): 0 ok,
 * -1 with the reason in err. */
int sl_redis_url_check(const char *url, char *err, size_t errlen) SL_WUR;

bool sl_redis_connected(const sl_redis_t *r);

/* Commands hiredis still holds on the current connection, including those
 * whose caller is gone (timed out or cancelled) and whose late reply will
 * be dropped. Bounded: past SL_REDIS_MAX_INFLIGHT new calls end with DOWN. */
#define SL_REDIS_MAX_INFLIGHT 8192
size_t sl_redis_inflight(const sl_redis_t *r);

/* A time on sl_now_ns()'s clock (in µs) before which a call made from now
 * on cannot end with TIMEOUT: its deadline as the timer sees it, less the
 * slack of libevent's coarse clock. What a caller needs to tell another
 * party "do nothing for me after this" (the Redis queue's accept). From
 * the first call of this on, r arms every call's deadline from a fresh
 * clock read rather than the loop turn's cached time. */
int64_t sl_redis_deadline_us(sl_redis_t *r);

/* Queues a command given as argv. The returned handle is valid until the
 * callback runs or sl_redis_call_cancel() is called; NULL only on OOM. */
sl_redis_call_t *sl_redis_command(sl_redis_t *r, int argc, const char **argv, const size_t *argvlen,
                                  sl_redis_cb cb, void *arg) SL_WUR;
/* The callback will not run. Safe to call once per handle, before the callback. */
void sl_redis_call_cancel(sl_redis_call_t *c);

/* Lua scripts: loaded once per connection, called by SHA; a NOSCRIPT reply
 * (after a Redis restart or SCRIPT FLUSH) reloads and retries once, inside
 * the same deadline. The script object is immutable and may be shared by
 * all threads. */
sl_redis_script_t *sl_redis_script_new(const char *lua);
void sl_redis_script_free(sl_redis_script_t *s);
/* The script's SHA1 in hex (40 chars). */
const char *sl_redis_script_sha(const sl_redis_script_t *s);
/* EVALSHA sha nkeys argv[0..argc-1]: argv holds the nkeys keys first, then
 * the script's arguments (argc counts both). s is borrowed and must outlive
 * the call. */
sl_redis_call_t *sl_redis_evalsha(sl_redis_t *r, const sl_redis_script_t *s, int nkeys, int argc,
                                  const char **argv, const size_t *argvlen, sl_redis_cb cb,
                                  void *arg) SL_WUR;

#endif
