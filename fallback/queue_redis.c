/*
 * queue_redis.c — the queue's Redis store, for several sluice instances
 * sharing one queue: a stream with a consumer group for the work, a hash
 * per request for its state, body and answer, and a hash of counters.
 *
 *   sluice:q:stream       XADD'ed once per accepted request (field id);
 *                         the group "sluice" hands entries to workers
 *                         (XREADGROUP, one at a time), XPENDING re-scans the
 *                         pending entries list for retries that fell due and
 *                         for leases of workers that died (XCLAIM of the one
 *                         taken); XACK + XDEL when the request ends.
 *   sluice:q:item:<id>    u k r b at next n st (p|d|x) lease eid res end;
 *                         expires `keep` after the request ends.
 *   sluice:q:stats        acc del dead: updated in the same script as the
 *                         state change, so acc = del + dead + pending always;
 *                         late: accepts refused as late (deadline, tombstone).
 *   sluice:q:cursor       where the XPENDING scan goes on next time.
 *
 * Every change is one Lua script (atomic in Redis). The durability promise
 * of an accept holds only as far as Redis's own: appendonly yes with
 * appendfsync always (docs/fallback.md).
 *
 * The gauges (depth, oldest pending) come from sluice:q:stats and the
 * stream, read by the stats script: after each accept or report that
 * changed them (at most every FB_QR_REFRESH_MS) and every second from the
 * store's first worker, so they move while requests only wait and follow
 * the other instances sharing the queue.
 */
#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/sl.h"
#include "fallback/fb_internal.h"

#define FB_QR_PREFIX "sluice:q:"
#define FB_QR_STREAM FB_QR_PREFIX "stream"
#define FB_QR_STATS  FB_QR_PREFIX "stats"
#define FB_QR_CURSOR FB_QR_PREFIX "cursor"
#define FB_QR_ITEM   FB_QR_PREFIX "item:"
#define FB_QR_GROUP  "sluice"

#define FB_QR_REFRESH_MS 100  /* least time between refreshes after changes */
#define FB_QR_TICK_MS    1000 /* the first worker's periodic refresh */
/* The accept's deadline in Redis's clock is sluice's own, less the clock
 * estimate's error and this much: time for a reply from just before it to
 * reach sluice (the take-back covers a slower one). */
#define FB_QR_MARGIN_US 1000

/* KEYS: stream item stats; ARGV: id u k r b at next max_pending deadline.
 * The deadline is in Redis's clock (µs): an accept that runs at or after
 * it, or finds the item taken back (st c), stores nothing but a count
 * (stats late). Returns
 * {OK|FULL|LATE, Redis's TIME} (the time refines sluice's clock estimate). */
static const char fb_qr_accept_lua[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
    "local st = redis.call('HGET', KEYS[2], 'st')\n"
    "if st == 'c' or now >= tonumber(ARGV[9]) then\n"
    "  redis.call('HINCRBY', KEYS[3], 'late', 1)\n"
    "  return {'LATE', t[1], t[2]}\n"
    "end\n"
    "if st then return {'OK', t[1], t[2]} end\n"
    "local acc = tonumber(redis.call('HGET', KEYS[3], 'acc') or '0')\n"
    "local del = tonumber(redis.call('HGET', KEYS[3], 'del') or '0')\n"
    "local dead = tonumber(redis.call('HGET', KEYS[3], 'dead') or '0')\n"
    "if acc - del - dead >= tonumber(ARGV[8]) then return {'FULL', t[1], t[2]} end\n"
    "local eid = redis.call('XADD', KEYS[1], '*', 'id', ARGV[1])\n"
    "redis.call('HSET', KEYS[2], 'u', ARGV[2], 'k', ARGV[3], 'r', ARGV[4], 'b', ARGV[5],\n"
    "           'at', ARGV[6], 'next', ARGV[7], 'n', 0, 'st', 'p', 'lease', 0, 'eid', eid)\n"
    "redis.call('HINCRBY', KEYS[3], 'acc', 1)\n"
    "return {'OK', t[1], t[2]}\n";

/* KEYS: stream stats item; ARGV: group keep. Takes back an accept sluice
 * answered as not stored: a tombstone (st c, kept `keep`) if it has not
 * run, so that it never will; undone (stream entry, hash, acc) if it ran
 * and no worker has taken it yet. */
static const char fb_qr_cancel_lua[] =
    "local v = redis.call('HMGET', KEYS[3], 'st', 'n', 'lease', 'eid')\n"
    "local function tomb()\n"
    "  redis.call('HSET', KEYS[3], 'st', 'c')\n"
    "  redis.call('PEXPIRE', KEYS[3], ARGV[2])\n"
    "end\n"
    "if not v[1] then tomb() return 'REFUSED' end\n"
    "if v[1] == 'c' then return 'REFUSED' end\n"
    "if v[1] ~= 'p' or tonumber(v[2]) ~= 0 or tonumber(v[3]) ~= 0 then return 'KEPT' end\n"
    "if v[4] then\n"
    "  redis.pcall('XACK', KEYS[1], ARGV[1], v[4])\n"
    "  redis.call('XDEL', KEYS[1], v[4])\n"
    "end\n"
    "redis.call('DEL', KEYS[3])\n"
    "tomb()\n"
    "redis.call('HINCRBY', KEYS[2], 'acc', -1)\n"
    "return 'UNDONE'\n";

/* KEYS: stream stats cursor; ARGV: group consumer now lease max_age keep
 * item_prefix min_idle. Returns nil or {id u k r b n at}. */
static const char fb_qr_next_lua[] =
    "local S, C, CUR = KEYS[1], KEYS[2], KEYS[3]\n"
    "local G, me = ARGV[1], ARGV[2]\n"
    "local now, lease, maxage, keep = tonumber(ARGV[3]), tonumber(ARGV[4]),\n"
    "      tonumber(ARGV[5]), tonumber(ARGV[6])\n"
    "local P = ARGV[7]\n"
    "redis.pcall('XGROUP', 'CREATE', S, G, '0', 'MKSTREAM')\n"
    "local function done(eid)\n"
    "  redis.call('XACK', S, G, eid)\n"
    "  redis.call('XDEL', S, eid)\n"
    "end\n"
    "local function examine(eid, f)\n"
    "  if not f then done(eid) return nil end\n"
    "  local id = f[2]\n"
    "  local h = P .. id\n"
    "  local v = redis.call('HMGET', h, 'st', 'at', 'next', 'lease')\n"
    "  if v[1] ~= 'p' then done(eid) return nil end\n"
    "  if now - tonumber(v[2]) >= maxage then\n"
    "    redis.call('HSET', h, 'st', 'x', 'end', now)\n"
    "    redis.call('HDEL', h, 'b')\n"
    "    redis.call('PEXPIRE', h, keep)\n"
    "    redis.call('HINCRBY', C, 'dead', 1)\n"
    "    done(eid)\n"
    "    return nil\n"
    "  end\n"
    "  if tonumber(v[3]) > now or tonumber(v[4]) > now then return nil end\n"
    "  redis.call('HSET', h, 'lease', now + lease, 'eid', eid)\n"
    "  local x = redis.call('HMGET', h, 'u', 'k', 'r', 'b', 'n', 'at')\n"
    "  return {id, x[1], x[2], x[3], x[4], x[5], x[6]}\n"
    "end\n"
    /* New entries one at a time: one read is one taken (or, not due
     * yet, left to the pending scan), never read ahead and stranded. */
    "for i = 1, 16 do\n"
    "  local r = redis.call('XREADGROUP', 'GROUP', G, me, 'COUNT', 1, 'STREAMS', S, '>')\n"
    "  if not r or not r[1][2][1] then break end\n"
    "  local e = r[1][2][1]\n"
    "  local found = examine(e[1], e[2])\n"
    "  if found then return found end\n"
    "end\n"
    /* The pending entries (retries that fell due, leases of workers that
     * died), looked at without claiming them: a claim resets an entry's
     * idle time, which would hide every entry looked at and not taken for
     * min_idle. Only the one taken is claimed. */
    "local cur = redis.call('GET', CUR) or '-'\n"
    "local p = redis.call('XPENDING', S, G, 'IDLE', ARGV[8], cur, '+', 32)\n"
    "if #p == 0 and cur ~= '-' then\n"
    "  p = redis.call('XPENDING', S, G, 'IDLE', ARGV[8], '-', '+', 32)\n"
    "end\n"
    "local last = nil\n"
    "for _, pe in ipairs(p) do\n"
    "  local eid = pe[1]\n"
    "  last = eid\n"
    "  local ent = redis.call('XRANGE', S, eid, eid)\n"
    "  local f = nil\n"
    "  if ent[1] then f = ent[1][2] end\n"
    "  local found = examine(eid, f)\n"
    "  if found then\n"
    "    redis.call('XCLAIM', S, G, me, 0, eid, 'JUSTID')\n"
    "    redis.call('SET', CUR, '(' .. eid)\n"
    "    return found\n"
    "  end\n"
    "end\n"
    "if last then redis.call('SET', CUR, '(' .. last) else redis.call('SET', CUR, '-') end\n"
    "return nil\n";

/* KEYS: stream stats item; ARGV: group outcome(d|r|x) result now keep
 * max_attempts base max rnd. */
static const char fb_qr_report_lua[] =
    "local S, C, H = KEYS[1], KEYS[2], KEYS[3]\n"
    "local G, o, now, keep = ARGV[1], ARGV[2], tonumber(ARGV[4]), tonumber(ARGV[5])\n"
    "if redis.call('HGET', H, 'st') ~= 'p' then return 'STALE' end\n"
    "local eid = redis.call('HGET', H, 'eid')\n"
    "local function finish(st)\n"
    "  redis.call('HSET', H, 'st', st, 'end', now)\n"
    "  redis.call('HDEL', H, 'b')\n"
    "  redis.call('PEXPIRE', H, keep)\n"
    "  if eid then redis.call('XACK', S, G, eid) redis.call('XDEL', S, eid) end\n"
    "end\n"
    "if o == 'd' then\n"
    "  redis.call('HSET', H, 'res', ARGV[3])\n"
    "  finish('d')\n"
    "  redis.call('HINCRBY', C, 'del', 1)\n"
    "  return 'OK'\n"
    "end\n"
    "local n = redis.call('HINCRBY', H, 'n', 1)\n"
    "if o == 'x' or n >= tonumber(ARGV[6]) then\n"
    "  finish('x')\n"
    "  redis.call('HINCRBY', C, 'dead', 1)\n"
    "  return 'DEAD'\n"
    "end\n"
    "local d = tonumber(ARGV[7])\n"
    "local mx = tonumber(ARGV[8])\n"
    "for i = 2, n do if d < mx then d = d * 2 end end\n"
    "if d > mx then d = mx end\n"
    "local half = math.floor(d / 2)\n"
    "local nx = now + half + (tonumber(ARGV[9]) % (d - half + 1))\n"
    "redis.call('HSET', H, 'next', nx, 'lease', 0)\n"
    "return 'OK'\n";

/* KEYS: stats stream; ARGV: sluice's clock when asked (µs), echoed back.
 * Returns {acc, del, dead, first entry id or '', asked, Redis's TIME, late}. */
static const char fb_qr_stats_lua[] =
    "local v = redis.call('HMGET', KEYS[1], 'acc', 'del', 'dead', 'late')\n"
    "local f = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)\n"
    "local first = ''\n"
    "if f[1] then first = f[1][1] end\n"
    "local t = redis.call('TIME')\n"
    "return {v[1] or '0', v[2] or '0', v[3] or '0', first, ARGV[1], t[1], t[2], v[4] or '0'}\n";

struct fb_qredis {
    fb_queue_t *q;
    conf_fb_queue_t c;
    char *url;
    int64_t timeout_ms;
    sl_redis_script_t *s_accept, *s_next, *s_report, *s_stats;
    pthread_mutex_t lock; /* stats, clock */
    fb_qstats_t stats;
    fb_qclock_t clock; /* Redis's clock against ours, from every reply carrying TIME */
    _Atomic unsigned nworkers;
    _Atomic int64_t refreshed_ms; /* monotonic ms of the last refresh asked for */
};

static void fb_qr_tb_retry(evutil_socket_t fd, short what, void *arg);

static void fb_qr_stats_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    fb_qr_maintain(arg);
}

fb_qredis_t *fb_qr_new(fb_queue_t *q, const conf_fb_queue_t *c, const conf_redis_t *redis,
                       char *err, size_t errlen)
{
    if (sl_redis_url_check(redis->url, err, errlen) != 0)
        return NULL;
    fb_qredis_t *r = calloc(1, sizeof(*r));
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->q = q;
    r->c = *c;
    r->c.dir = NULL;
    r->url = strdup(redis->url);
    r->timeout_ms = redis->timeout_ms > 0 ? redis->timeout_ms : 50;
    r->s_accept = sl_redis_script_new(fb_qr_accept_lua);
    r->s_next = sl_redis_script_new(fb_qr_next_lua);
    r->s_report = sl_redis_script_new(fb_qr_report_lua);
    r->s_stats = sl_redis_script_new(fb_qr_stats_lua);
    pthread_mutex_init(&r->lock, NULL);
    if (!r->url || !r->s_accept || !r->s_next || !r->s_report || !r->s_stats) {
        snprintf(err, errlen, "out of memory");
        fb_qr_free(r);
        return NULL;
    }
    return r;
}

void fb_qr_free(fb_qredis_t *r)
{
    if (!r)
        return;
    sl_redis_script_free(r->s_accept);
    sl_redis_script_free(r->s_next);
    sl_redis_script_free(r->s_report);
    sl_redis_script_free(r->s_stats);
    pthread_mutex_destroy(&r->lock);
    free(r->url);
    free(r);
}

fb_qworker_t *fb_qr_worker_new(fb_queue_t *q, fb_qredis_t *r, struct event_base *base, char *err,
                               size_t errlen)
{
    fb_qworker_t *w = calloc(1, sizeof(*w));
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    w->q = q;
    w->r = r;
    sl_redis_opts_t o = {.url = r->url, .timeout_ms = r->timeout_ms};
    w->redis = sl_redis_new(base, &o, err, errlen);
    if (!w->redis) {
        free(w);
        return NULL;
    }
    /* Consumers are named per process and worker; a dead one's entries are
     * taken over by XAUTOCLAIM. */
    char host[64] = "host";
    (void)gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = '\0';
    unsigned idx = atomic_fetch_add(&r->nworkers, 1);
    snprintf(w->consumer, sizeof(w->consumer), "%.60s-%d-%u", host, (int)getpid(), idx);
    if (base) {
        w->tb_retry = evtimer_new(base, fb_qr_tb_retry, w);
        if (!w->tb_retry) {
            snprintf(err, errlen, "out of memory");
            fb_qr_worker_free(w);
            return NULL;
        }
    }
    if (idx == 0 && base) {
        w->stats_tick = event_new(base, -1, EV_PERSIST, fb_qr_stats_tick, w);
        struct timeval tv = {FB_QR_TICK_MS / 1000, (FB_QR_TICK_MS % 1000) * 1000};
        if (!w->stats_tick || event_add(w->stats_tick, &tv) != 0) {
            snprintf(err, errlen, "out of memory");
            fb_qr_worker_free(w);
            return NULL;
        }
    }
    return w;
}

void fb_qr_worker_free(fb_qworker_t *w)
{
    if (!w)
        return;
    if (w->stats_tick)
        event_free(w->stats_tick);
    if (w->tb_retry)
        event_free(w->tb_retry);
    for (size_t i = 0; i < FB_QR_TAKEBACKS; i++)
        if (w->tb[i].used)
            sl_gauge_add(fb_m.q_takeback_waiting, -1);
    sl_redis_free(w->redis); /* drops the calls: no callback runs after this */
    free(w);
}

/* ---- calls -------------------------------------------------------------------------- */

typedef enum fb_qr_op {
    FB_QR_ACCEPT,
    FB_QR_CLOCK, /* TIME, then the accept held in `in` */
    FB_QR_NEXT,
    FB_QR_REPORT,
    FB_QR_LOOKUP
} fb_qr_op_t;

typedef struct fb_qr_ctx {
    fb_call_t call; /* first: fb_call_cancel frees the whole context */
    fb_qworker_t *w;
    fb_qr_op_t op;
    fb_queue_cb cb;
    void *arg;
    char id[FB_QUEUE_ID_LEN + 1];
    char *user;
    int64_t now;
    int64_t sent_us;       /* sluice's clock (µs) when the call was made */
    fb_qoutcome_t outcome; /* report */
    struct {
        char *user, *key, *route;
        void *body;
        size_t body_len;
    } held; /* FB_QR_CLOCK: copies of the accept to make once the clock is known */
} fb_qr_ctx_t;

static void fb_qr_ctx_free(void *p)
{
    fb_qr_ctx_t *x = p;
    free(x->user);
    free(x->held.user);
    free(x->held.key);
    free(x->held.route);
    free(x->held.body);
    free(x);
}

static bool fb_is_str(const redisReply *r)
{
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS);
}

static bool fb_str_eq(const redisReply *r, const char *s)
{
    return fb_is_str(r) && strlen(s) == r->len && memcmp(r->str, s, r->len) == 0;
}

static char *fb_dup(const redisReply *r, size_t *len)
{
    if (!fb_is_str(r))
        return NULL;
    char *s = malloc(r->len + 1);
    if (!s)
        return NULL;
    memcpy(s, r->str, r->len);
    s[r->len] = '\0';
    if (len)
        *len = r->len;
    return s;
}

static int64_t fb_int(const redisReply *r)
{
    if (r && r->type == REDIS_REPLY_INTEGER)
        return (int64_t)r->integer;
    if (fb_is_str(r)) {
        char b[32];
        size_t n = SL_MIN(r->len, sizeof(b) - 1);
        memcpy(b, r->str, n);
        b[n] = '\0';
        return strtoll(b, NULL, 10);
    }
    return 0;
}

static void fb_qr_next_reply(fb_qr_ctx_t *x, redisReply *rep, fb_qres_t *res)
{
    if (rep->type == REDIS_REPLY_NIL) {
        res->status = FB_Q_NONE;
        return;
    }
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 7 || !fb_is_str(rep->element[0]) ||
        rep->element[0]->len != FB_QUEUE_ID_LEN) {
        res->status = FB_Q_STORE_ERROR;
        return;
    }
    fb_qitem_t *it = calloc(1, sizeof(*it));
    if (!it) {
        res->status = FB_Q_STORE_ERROR;
        return;
    }
    memcpy(it->id, rep->element[0]->str, FB_QUEUE_ID_LEN);
    it->user = fb_dup(rep->element[1], NULL);
    if (fb_is_str(rep->element[2]) && rep->element[2]->len > 0)
        it->idem_key = fb_dup(rep->element[2], NULL);
    it->route = fb_dup(rep->element[3], NULL);
    it->body = fb_dup(rep->element[4], &it->body_len);
    it->attempts = (int)fb_int(rep->element[5]);
    it->accepted_ms = fb_int(rep->element[6]);
    if (!it->user || !it->route || !it->body) {
        fb_qitem_free(it);
        res->status = FB_Q_STORE_ERROR;
        return;
    }
    res->item = it;
    res->status = FB_Q_OK;
    (void)x;
}

static void fb_qr_lookup_reply(fb_qr_ctx_t *x, redisReply *rep, fb_qres_t *res)
{
    /* HMGET u st res next lease */
    res->status = FB_Q_UNKNOWN;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 5 || !fb_is_str(rep->element[0]))
        return;
    if (!fb_str_eq(rep->element[0], x->user))
        return;
    redisReply *st = rep->element[1];
    if (fb_str_eq(st, "p")) {
        res->status = FB_Q_PENDING;
        int64_t nx = fb_int(rep->element[3]), lu = fb_int(rep->element[4]);
        res->next_ms = nx > lu ? nx : lu;
    } else if (fb_str_eq(st, "d")) {
        res->result = fb_dup(rep->element[2], &res->result_len);
        res->status = res->result ? FB_Q_DELIVERED : FB_Q_STORE_ERROR;
    } else if (fb_str_eq(st, "x")) {
        res->status = FB_Q_DEAD;
    }
}

/* ---- Redis's clock ------------------------------------------------------------ */

static int64_t fb_qr_us(void)
{
    return sl_now_ns() / 1000;
}

/* Redis's TIME as two strings (seconds, microseconds) -> µs; 0 if not. */
static int64_t fb_qr_redis_us(const redisReply *sec, const redisReply *usec)
{
    if (!fb_is_str(sec) || !fb_is_str(usec))
        return 0;
    int64_t s = fb_int(sec), u = fb_int(usec);
    return s > 0 && u >= 0 && u < 1000000 ? s * 1000000 + u : 0;
}

static void fb_qr_clock_sample(fb_qredis_t *r, int64_t sent_us, int64_t redis_us)
{
    int64_t now = fb_qr_us();
    pthread_mutex_lock(&r->lock);
    fb_qclock_sample(&r->clock, sent_us, now, redis_us);
    pthread_mutex_unlock(&r->lock);
}

/* The deadline (Redis's clock, µs) to give an accept sent now: 0, or -1
 * when the estimate is unknown or too loose to leave the script a fair
 * part of the timeout (then sluice asks Redis's TIME first). */
static int fb_qr_deadline(fb_qworker_t *w, int64_t *deadline)
{
    fb_qredis_t *r = w->r;
    int64_t local = sl_redis_deadline_us(w->redis);
    pthread_mutex_lock(&r->lock);
    int rc = -1;
    if (fb_qclock_err(&r->clock, local) <= r->timeout_ms * 1000 / 4)
        rc = fb_qclock_deadline(&r->clock, local, FB_QR_MARGIN_US, deadline);
    pthread_mutex_unlock(&r->lock);
    return rc;
}

/* ---- take-backs ---------------------------------------------------------------------
 *
 * An accept that ended without a clear answer (timeout, lost connection,
 * error reply) is answered "not stored" and taken back (fb_qr_cancel_lua).
 * The accept's deadline keeps a late run from storing; the take-back undoes
 * one that ran in time but whose answer never came. That includes an accept
 * still unread in the socket of a connection that dropped: Redis may run it
 * before its deadline. So a take-back is kept in its worker's table until
 * Redis answers it, and sent again every FB_QR_TB_RETRY_MS while the
 * connection is down (on the new connection once it is up). An accept's first
 * resend waits max(backoff, 2 x redis.timeout): a take-back that arrives
 * later finds the item taken (kept, with a warning). A full table (64) sends
 * the take-back once, as the other ones were first. */
#define FB_QR_TB_RETRY_MS 100

static void fb_qr_cancel_send(fb_qworker_t *w, const char *id, fb_qr_tb_t *t);

static void fb_qr_tb_arm(fb_qworker_t *w)
{
    struct timeval tv = {0, FB_QR_TB_RETRY_MS * 1000};
    if (w->tb_retry && !evtimer_pending(w->tb_retry, NULL))
        evtimer_add(w->tb_retry, &tv);
}

static void fb_qr_tb_retry(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    fb_qworker_t *w = arg;
    for (size_t i = 0; i < FB_QR_TAKEBACKS; i++)
        if (w->tb[i].used && !w->tb[i].out)
            fb_qr_cancel_send(w, w->tb[i].id, &w->tb[i]);
}

static void fb_qr_cancel_cb(void *arg, sl_redis_status_t status, redisReply *rep)
{
    fb_qr_tb_t *t = arg; /* NULL: sent once (the table was full) */
    if (status != SL_REDIS_OK || !rep || rep->type == REDIS_REPLY_ERROR) {
        if (t) { /* not heard: again, on this or the next connection */
            t->out = false;
            fb_qr_tb_arm(t->w);
        } else {
            sl_counter_add(fb_m.q_store_errors, 1);
        }
        return;
    }
    if (t) {
        t->used = t->out = false;
        sl_gauge_add(fb_m.q_takeback_waiting, -1);
    }
    if (fb_str_eq(rep, "REFUSED"))
        sl_counter_add(fb_m.q_late_refused, 1);
    else if (fb_str_eq(rep, "UNDONE"))
        sl_counter_add(fb_m.q_late_undone, 1);
    else {
        sl_counter_add(fb_m.q_late_kept, 1);
        sl_warn("queue redis: an accept answered as not stored had been taken already");
    }
}

static void fb_qr_cancel_send(fb_qworker_t *w, const char *id, fb_qr_tb_t *t)
{
    char item[64], keep[24];
    snprintf(item, sizeof(item), FB_QR_ITEM "%s", id);
    snprintf(keep, sizeof(keep), "%lld", (long long)SL_MAX(w->r->c.keep_ms, 1000));
    /* EVAL with the text, not EVALSHA: rare, and a first NOSCRIPT answered
     * after this call's own deadline (Redis late again) would be dropped
     * without the reload that makes it run. */
    const char *argv[] = {"EVAL", fb_qr_cancel_lua, "3", FB_QR_STREAM, FB_QR_STATS,
                          item,   FB_QR_GROUP,      keep};
    size_t lens[SL_ARRAY_LEN(argv)];
    for (size_t i = 0; i < SL_ARRAY_LEN(argv); i++)
        lens[i] = strlen(argv[i]);
    if (t)
        t->out = true;
    if (sl_redis_command(w->redis, (int)SL_ARRAY_LEN(argv), argv, lens, fb_qr_cancel_cb, t))
        return;
    if (t) { /* out of memory: the timer tries again */
        t->out = false;
        fb_qr_tb_arm(w);
    } else {
        sl_counter_add(fb_m.q_store_errors, 1);
    }
}

/* The accept of id is answered "not stored": take it back. */
static void fb_qr_cancel(fb_qworker_t *w, const char *id)
{
    fb_qr_tb_t *t = NULL;
    for (size_t i = 0; i < FB_QR_TAKEBACKS && !t; i++)
        if (!w->tb[i].used)
            t = &w->tb[i];
    if (t) {
        t->w = w;
        t->used = true;
        memcpy(t->id, id, sizeof(t->id));
        sl_gauge_add(fb_m.q_takeback_waiting, 1);
    } else {
        sl_log_limited(SL_LOG_WARN, "queue_takebacks",
                       "queue redis: %d take-backs wait for Redis already: this one is sent once",
                       FB_QR_TAKEBACKS);
    }
    fb_qr_cancel_send(w, id, t);
}

static sl_redis_call_t *fb_qr_accept_send(fb_qworker_t *w, fb_qr_ctx_t *x, const fb_qaccept_t *in,
                                          int64_t deadline);

/* The accept in x waited for Redis's TIME (the reply rep): send it now.
 * true when it is on its way (x lives on). */
static bool fb_qr_clock_then_accept(fb_qr_ctx_t *x, redisReply *rep)
{
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2)
        fb_qr_clock_sample(x->w->r, x->sent_us, fb_qr_redis_us(rep->element[0], rep->element[1]));
    int64_t deadline;
    if (fb_qr_deadline(x->w, &deadline) != 0)
        return false;
    fb_qaccept_t in = {.user = x->held.user,
                       .idem_key = x->held.key,
                       .route = x->held.route,
                       .body = x->held.body,
                       .body_len = x->held.body_len};
    sl_redis_call_t *rc = fb_qr_accept_send(x->w, x, &in, deadline);
    if (!rc)
        return false;
    x->call.rc = rc;
    x->op = FB_QR_ACCEPT;
    return true;
}

static void fb_qr_accept_reply(fb_qr_ctx_t *x, redisReply *rep, fb_qres_t *res)
{
    res->status = FB_Q_STORE_ERROR;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 3)
        return;
    fb_qr_clock_sample(x->w->r, x->sent_us, fb_qr_redis_us(rep->element[1], rep->element[2]));
    if (fb_str_eq(rep->element[0], "OK")) {
        res->status = FB_Q_OK;
        memcpy(res->id, x->id, sizeof(res->id));
    } else if (fb_str_eq(rep->element[0], "FULL")) {
        res->status = FB_Q_FULL;
    }
    /* LATE in time to hear it: the timer is about to fire anyway. */
}

static void fb_qr_refresh(fb_qworker_t *w)
{
    int64_t now = sl_now_ms(), last = atomic_load(&w->r->refreshed_ms);
    if (now - last < FB_QR_REFRESH_MS ||
        !atomic_compare_exchange_strong(&w->r->refreshed_ms, &last, now))
        return;
    fb_qr_maintain(w);
}

static void fb_qr_cb(void *arg, sl_redis_status_t status, redisReply *rep)
{
    fb_qr_ctx_t *x = arg;
    fb_qres_t res;
    memset(&res, 0, sizeof(res));
    if (status != SL_REDIS_OK || !rep || rep->type == REDIS_REPLY_ERROR) {
        if (rep && rep->type == REDIS_REPLY_ERROR)
            sl_warn("queue redis: %.*s", (int)rep->len, rep->str);
        res.status = FB_Q_STORE_ERROR;
    } else {
        switch (x->op) {
        case FB_QR_ACCEPT:
            fb_qr_accept_reply(x, rep, &res);
            break;
        case FB_QR_CLOCK:
            if (fb_qr_clock_then_accept(x, rep))
                return;
            res.status = FB_Q_STORE_ERROR;
            break;
        case FB_QR_NEXT:
            fb_qr_next_reply(x, rep, &res);
            break;
        case FB_QR_REPORT:
            res.status = fb_str_eq(rep, "STALE")                          ? FB_Q_STALE
                         : fb_str_eq(rep, "OK") || fb_str_eq(rep, "DEAD") ? FB_Q_OK
                                                                          : FB_Q_STORE_ERROR;
            if (fb_str_eq(rep, "DEAD"))
                sl_counter_add(fb_m.q_dead, 1);
            else if (fb_str_eq(rep, "OK") && x->outcome == FB_QO_DELIVERED)
                sl_counter_add(fb_m.q_delivered, 1);
            break;
        case FB_QR_LOOKUP:
            fb_qr_lookup_reply(x, rep, &res);
            break;
        }
    }
    if (res.status == FB_Q_STORE_ERROR)
        sl_counter_add(fb_m.q_store_errors, 1);
    else if (x->op == FB_QR_ACCEPT && res.status == FB_Q_OK) {
        sl_counter_add(fb_m.q_accepted, 1);
        fb_count_tier(FB_TIER_QUEUE);
    } else if (x->op == FB_QR_ACCEPT && res.status == FB_Q_FULL)
        sl_counter_add(fb_m.q_full, 1);
    /* An accept sent that the client will hear "not stored" of may still
     * run (it may have, its reply late): take it back. */
    if (x->op == FB_QR_ACCEPT && res.status == FB_Q_STORE_ERROR)
        fb_qr_cancel(x->w, x->id);
    /* The depth just changed: show it now rather than at the next tick. */
    if (res.status == FB_Q_OK && (x->op == FB_QR_ACCEPT || x->op == FB_QR_REPORT))
        fb_qr_refresh(x->w);
    fb_queue_cb cb = x->cb;
    void *carg = x->arg;
    fb_qr_ctx_free(x);
    cb(carg, &res);
}

static fb_qr_ctx_t *fb_qr_ctx(fb_qworker_t *w, fb_qr_op_t op, fb_queue_cb cb, void *arg,
                              int64_t now)
{
    fb_qr_ctx_t *x = calloc(1, sizeof(*x));
    if (!x)
        return NULL;
    x->call.free_ctx = fb_qr_ctx_free;
    x->w = w;
    x->op = op;
    x->cb = cb;
    x->arg = arg;
    x->now = now;
    return x;
}

static fb_rc_t fb_qr_launch(fb_qr_ctx_t *x, sl_redis_call_t *rc, fb_call_t **call)
{
    if (!rc) {
        fb_qr_ctx_free(x);
        return FB_ERROR;
    }
    x->call.rc = rc;
    if (call)
        *call = &x->call;
    return FB_PENDING;
}

static sl_redis_call_t *fb_qr_accept_send(fb_qworker_t *w, fb_qr_ctx_t *x, const fb_qaccept_t *in,
                                          int64_t deadline)
{
    const char *id = x->id;
    char item[64], at[24], next[24], maxp[24], dl[24];
    snprintf(item, sizeof(item), FB_QR_ITEM "%s", id);
    snprintf(at, sizeof(at), "%lld", (long long)x->now);
    /* The first attempt waits at least two call deadlines: the take-back
     * of an accept whose answer came too late (fb_qr_cancel, sent when
     * sluice's deadline passes) reaches Redis before any worker may take it. */
    snprintf(next, sizeof(next), "%lld",
             (long long)(x->now + SL_MAX(w->r->c.backoff_ms, 2 * w->r->timeout_ms)));
    snprintf(maxp, sizeof(maxp), "%lld", (long long)w->r->c.max_pending);
    snprintf(dl, sizeof(dl), "%lld", (long long)deadline);
    const char *u = in->user ? in->user : "", *k = in->idem_key ? in->idem_key : "",
               *r = in->route ? in->route : "";
    const char *argv[] = {FB_QR_STREAM, item, FB_QR_STATS, id, u, k, r, NULL, at, next, maxp, dl};
    size_t lens[SL_ARRAY_LEN(argv)];
    for (size_t i = 0; i < SL_ARRAY_LEN(argv); i++)
        lens[i] = argv[i] ? strlen(argv[i]) : 0;
    argv[7] = in->body ? in->body : "";
    lens[7] = in->body ? in->body_len : 0;
    x->sent_us = fb_qr_us();
    return sl_redis_evalsha(w->redis, w->r->s_accept, 3, (int)SL_ARRAY_LEN(argv), argv, lens,
                            fb_qr_cb, x);
}

static char *fb_qr_strdup0(const char *s)
{
    return strdup(s ? s : "");
}

/* No usable estimate of Redis's clock (the first accept, or none for a
 * while): hold a copy of the accept and ask Redis's TIME first. */
static sl_redis_call_t *fb_qr_clock_first(fb_qworker_t *w, fb_qr_ctx_t *x, const fb_qaccept_t *in)
{
    x->op = FB_QR_CLOCK;
    x->held.user = fb_qr_strdup0(in->user);
    x->held.key = fb_qr_strdup0(in->idem_key); /* "" is no key, as in the accept's argv */
    x->held.route = fb_qr_strdup0(in->route);
    x->held.body = malloc(in->body_len + 1);
    if (!x->held.user || !x->held.key || !x->held.route || !x->held.body)
        return NULL;
    if (in->body_len)
        memcpy(x->held.body, in->body, in->body_len);
    x->held.body_len = in->body_len;
    const char *argv[] = {"TIME"};
    size_t lens[] = {4};
    x->sent_us = fb_qr_us();
    return sl_redis_command(w->redis, 1, argv, lens, fb_qr_cb, x);
}

fb_rc_t fb_qr_accept(fb_qworker_t *w, const char *id, const fb_qaccept_t *in, int64_t now,
                     fb_qres_t *res, fb_queue_cb cb, void *arg, fb_call_t **call)
{
    (void)res;
    fb_qr_ctx_t *x = fb_qr_ctx(w, FB_QR_ACCEPT, cb, arg, now);
    if (!x)
        return FB_ERROR;
    memcpy(x->id, id, FB_QUEUE_ID_LEN + 1);
    int64_t deadline;
    if (fb_qr_deadline(w, &deadline) == 0)
        return fb_qr_launch(x, fb_qr_accept_send(w, x, in, deadline), call);
    return fb_qr_launch(x, fb_qr_clock_first(w, x, in), call);
}

fb_rc_t fb_qr_next(fb_qworker_t *w, int64_t now, fb_qres_t *res, fb_queue_cb cb, void *arg,
                   fb_call_t **call)
{
    (void)res;
    fb_qr_ctx_t *x = fb_qr_ctx(w, FB_QR_NEXT, cb, arg, now);
    if (!x)
        return FB_ERROR;
    const conf_fb_queue_t *c = &w->r->c;
    char nows[24], lease[24], maxage[24], keep[24], minidle[24];
    snprintf(nows, sizeof(nows), "%lld", (long long)now);
    snprintf(lease, sizeof(lease), "%lld", (long long)c->lease_ms);
    snprintf(maxage, sizeof(maxage), "%lld", (long long)c->max_age_ms);
    snprintf(keep, sizeof(keep), "%lld", (long long)c->keep_ms);
    /* How soon a pending entry is looked at again: often enough for the
     * first backoff, no busier than every 100 ms. */
    snprintf(minidle, sizeof(minidle), "%lld", (long long)SL_MAX(100, SL_MIN(c->backoff_ms, 1000)));
    const char *argv[] = {FB_QR_STREAM, FB_QR_STATS, FB_QR_CURSOR, FB_QR_GROUP, w->consumer, nows,
                          lease,        maxage,      keep,         FB_QR_ITEM,  minidle};
    size_t lens[SL_ARRAY_LEN(argv)];
    for (size_t i = 0; i < SL_ARRAY_LEN(argv); i++)
        lens[i] = strlen(argv[i]);
    return fb_qr_launch(x,
                        sl_redis_evalsha(w->redis, w->r->s_next, 3, (int)SL_ARRAY_LEN(argv), argv,
                                         lens, fb_qr_cb, x),
                        call);
}

fb_rc_t fb_qr_report(fb_qworker_t *w, const char *id, fb_qoutcome_t o, const void *result,
                     size_t len, int64_t now, uint64_t rnd, fb_qres_t *res, fb_queue_cb cb,
                     void *arg, fb_call_t **call)
{
    (void)res;
    if (!id || strlen(id) != FB_QUEUE_ID_LEN)
        return FB_ERROR;
    fb_qr_ctx_t *x = fb_qr_ctx(w, FB_QR_REPORT, cb, arg, now);
    if (!x)
        return FB_ERROR;
    const conf_fb_queue_t *c = &w->r->c;
    char item[64], nows[24], keep[24], maxa[24], base[24], mx[24], rn[24];
    snprintf(item, sizeof(item), FB_QR_ITEM "%s", id);
    snprintf(nows, sizeof(nows), "%lld", (long long)now);
    snprintf(keep, sizeof(keep), "%lld", (long long)c->keep_ms);
    snprintf(maxa, sizeof(maxa), "%lld", (long long)c->max_attempts);
    snprintf(base, sizeof(base), "%lld", (long long)c->backoff_ms);
    snprintf(mx, sizeof(mx), "%lld", (long long)c->backoff_max_ms);
    snprintf(rn, sizeof(rn), "%llu", (unsigned long long)(rnd % 1000000007ULL));
    x->outcome = o;
    const char *oc = o == FB_QO_DELIVERED ? "d" : o == FB_QO_RETRY ? "r" : "x";
    const char *argv[] = {FB_QR_STREAM, FB_QR_STATS, item, FB_QR_GROUP, oc, "",
                          nows,         keep,        maxa, base,        mx, rn};
    size_t lens[SL_ARRAY_LEN(argv)];
    for (size_t i = 0; i < SL_ARRAY_LEN(argv); i++)
        lens[i] = strlen(argv[i]);
    if (o == FB_QO_DELIVERED && result) {
        argv[5] = result;
        lens[5] = len;
    }
    return fb_qr_launch(x,
                        sl_redis_evalsha(w->redis, w->r->s_report, 3, (int)SL_ARRAY_LEN(argv), argv,
                                         lens, fb_qr_cb, x),
                        call);
}

fb_rc_t fb_qr_lookup(fb_qworker_t *w, const char *id, const char *user, int64_t now, fb_qres_t *res,
                     fb_queue_cb cb, void *arg, fb_call_t **call)
{
    if (!id || strlen(id) != FB_QUEUE_ID_LEN || id[0] != 'q') {
        /* not an id of ours: no need to ask */
        res->status = FB_Q_UNKNOWN;
        return FB_DONE;
    }
    fb_qr_ctx_t *x = fb_qr_ctx(w, FB_QR_LOOKUP, cb, arg, now);
    if (!x)
        return FB_ERROR;
    x->user = strdup(user);
    if (!x->user) {
        fb_qr_ctx_free(x);
        return FB_ERROR;
    }
    char item[64];
    snprintf(item, sizeof(item), FB_QR_ITEM "%s", id);
    const char *argv[] = {"HMGET", item, "u", "st", "res", "next", "lease"};
    size_t lens[SL_ARRAY_LEN(argv)];
    for (size_t i = 0; i < SL_ARRAY_LEN(argv); i++)
        lens[i] = strlen(argv[i]);
    return fb_qr_launch(
        x, sl_redis_command(w->redis, (int)SL_ARRAY_LEN(argv), argv, lens, fb_qr_cb, x), call);
}

/* ---- counters ---------------------------------------------------------------------- */

static void fb_qr_stats_cb(void *arg, sl_redis_status_t status, redisReply *rep)
{
    fb_qredis_t *r = arg;
    if (status != SL_REDIS_OK || !rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 8)
        return;
    fb_qr_clock_sample(r, fb_int(rep->element[4]),
                       fb_qr_redis_us(rep->element[5], rep->element[6]));
    fb_qstats_t st = {0};
    st.accepted = fb_int(rep->element[0]);
    st.delivered = fb_int(rep->element[1]);
    st.dead = fb_int(rep->element[2]);
    st.pending = st.accepted - st.delivered - st.dead;
    /* A stream entry id starts with Redis's ms clock at XADD: the oldest
     * entry left is the oldest request not yet ended. */
    if (fb_is_str(rep->element[3]) && rep->element[3]->len > 0)
        st.oldest_pending_ms = fb_int(rep->element[3]);
    pthread_mutex_lock(&r->lock);
    r->stats = st;
    pthread_mutex_unlock(&r->lock);
    sl_gauge_set(fb_m.q_depth, st.pending);
    sl_gauge_set(fb_m.q_store_late, fb_int(rep->element[7]));
    int64_t now = fb_queue_now(r->q);
    sl_gauge_set(fb_m.q_oldest, st.oldest_pending_ms && now > st.oldest_pending_ms
                                    ? (now - st.oldest_pending_ms) / 1000
                                    : 0);
}

void fb_qr_maintain(fb_qworker_t *w)
{
    /* The time asked rides in the call and comes back with Redis's TIME:
     * a clock sample without a context to keep (fire and forget). */
    char asked[24];
    snprintf(asked, sizeof(asked), "%lld", (long long)fb_qr_us());
    const char *argv[] = {FB_QR_STATS, FB_QR_STREAM, asked};
    size_t lens[] = {strlen(argv[0]), strlen(argv[1]), strlen(argv[2])};
    /* Fire and forget: the argument is the store, which outlives workers. */
    if (!sl_redis_evalsha(w->redis, w->r->s_stats, 2, 3, argv, lens, fb_qr_stats_cb, w->r))
        sl_counter_add(fb_m.q_store_errors, 1);
}

void fb_qr_stats(fb_qredis_t *r, fb_qstats_t *st)
{
    pthread_mutex_lock(&r->lock);
    *st = r->stats;
    pthread_mutex_unlock(&r->lock);
}
