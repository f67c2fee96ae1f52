/*
 * queue.c — the durable queue of requests that got the template, and its
 * default store: an append-only journal in queue.dir.
 *
 * A record is [u32 length][8 bytes of SHA-256 over length and payload]
 * [payload], the payload a compact JSON object (type, id, times, ...), a
 * NUL, then the raw blob (the request body, or the delivered answer). The
 * types: "a" accepted, "t" an attempt failed (attempts, next time), "d"
 * delivered (the answer), "x" dead-lettered, and "base" (the counts of
 * items compaction dropped). One function applies a record to the memory
 * state, both live (write first, then apply) and on replay, so both agree.
 *
 * Durability: an accept is written and fdatasync'd before fb_queue_accept
 * returns, and so are "d" and "x" (so a restart neither resends a delivered
 * request nor revives a dead one). Concurrent callers share fdatasyncs
 * (group commit: one syncs everything written so far while the others
 * wait for it). "t" records are not synced: losing one only makes a resend
 * come sooner. On open the file is replayed; the first record that is
 * short or whose digest fails ends it (a write torn by a crash can only be
 * the last one) and the file is truncated there.
 *
 * Compaction (fb_queue_maintain, when the file is over 1 MiB and over
 * twice what the live items need) writes the live items and a "base"
 * record to journal.tmp, syncs it, renames it over the journal and syncs
 * the directory: a crash at any point leaves one whole journal.
 *
 * The memory state: a hash of items by id, the pending items in accept
 * order (max_age expiry walks from the head), a heap of pending items by
 * the time they are due (next attempt, or the end of a lease), and the
 * ended items in end order (forgotten after keep). One lock covers it; it
 * is released only while a thread waits for a group fdatasync.
 */
#include <errno.h>
#include <fcntl.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/queue.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uthash.h>

#include "common/log.h"
#include "common/sl.h"
#include "fallback/fb_internal.h"

#define FB_J_NAME      "journal"
#define FB_J_TMP       "journal.tmp"
#define FB_J_LOCK      "LOCK"
#define FB_J_HDR       12
#define FB_J_MAX_REC   (512u << 20) /* sanity cap on one record's payload */
#define FB_J_COMPACT_B (1 << 20)

typedef enum fb_jstate { FB_J_PENDING = 0, FB_J_DELIVERED, FB_J_DEAD } fb_jstate_t;

typedef struct fb_jitem fb_jitem_t;
TAILQ_HEAD(fb_jlist, fb_jitem);

struct fb_jitem {
    char id[FB_QUEUE_ID_LEN + 1];
    char *user, *key, *route;
    char *body;
    size_t body_len;
    fb_jstate_t state;
    int attempts;
    int64_t accepted_ms, next_ms, lease_until, ended_ms;
    char *result;
    size_t result_len;
    size_t hidx;                /* PENDING: index in the due heap */
    uint64_t seq;               /* accept order, the heap's tie-break */
    TAILQ_ENTRY(fb_jitem) link; /* pending (accept order) or ended (end order) */
    UT_hash_handle hh;
};

struct fb_queue {
    conf_fb_queue_t c; /* dir copied */
    int64_t (*now)(void *);
    void *now_arg;
    void (*fill)(void *, void *, size_t);
    void *fill_arg;
    fb_qredis_t *redis;

    /* journal */
    pthread_mutex_t lock;
    pthread_cond_t cv;
    int fd, dirfd, lockfd;
    char *path, *tmp_path;
    int64_t file_bytes;   /* the file's length */
    uint64_t written_seq; /* bytes appended since open, compaction included */
    uint64_t synced_seq;  /* ... of which fdatasync'd */
    bool syncing, broken;
    fb_jitem_t *items;
    struct fb_jlist pending, ended;
    fb_jitem_t **heap;
    size_t nheap, capheap;
    int64_t accepted, delivered, dead, npending;
    int64_t live_bytes;
    int64_t compact_min;
    uint64_t seq;
};

static const char *const fb_qstatus_names[] = {
    "ok", "none", "full", "pending", "delivered", "dead", "unknown", "stale", "store_error"};

const char *fb_qstatus_name(fb_qstatus_t s)
{
    return (unsigned)s < SL_ARRAY_LEN(fb_qstatus_names) ? fb_qstatus_names[s] : "unknown";
}

void fb_qitem_free(fb_qitem_t *it)
{
    if (!it)
        return;
    free(it->user);
    free(it->idem_key);
    free(it->route);
    free(it->body);
    free(it);
}

void fb_qres_clear(fb_qres_t *res)
{
    if (!res)
        return;
    fb_qitem_free(res->item);
    free(res->result);
    memset(res, 0, sizeof(*res));
}

static int64_t fb_queue_default_now(void *arg)
{
    (void)arg;
    return sl_wall_ms();
}

static void fb_queue_default_fill(void *arg, void *buf, size_t n)
{
    (void)arg;
    if (RAND_bytes(buf, (int)n) != 1)
        for (size_t i = 0; i < n; i++)
            ((unsigned char *)buf)[i] = (unsigned char)fb_rand64();
}

int64_t fb_queue_now(fb_queue_t *q)
{
    return q->now(q->now_arg);
}

uint64_t fb_queue_rand(fb_queue_t *q)
{
    uint64_t r;
    q->fill(q->fill_arg, &r, sizeof(r));
    return r;
}

static void fb_queue_new_id(fb_queue_t *q, char id[FB_QUEUE_ID_LEN + 1])
{
    unsigned char b[16];
    q->fill(q->fill_arg, b, sizeof(b));
    id[0] = 'q';
    sl_hex(b, sizeof(b), id + 1);
}

void fb_queue_set_clock(fb_queue_t *q, int64_t (*now_ms)(void *arg), void *arg)
{
    q->now = now_ms;
    q->now_arg = arg;
}

void fb_queue_set_random(fb_queue_t *q, void (*fill)(void *arg, void *buf, size_t n), void *arg)
{
    q->fill = fill;
    q->fill_arg = arg;
}

bool fb_queue_is_redis(const fb_queue_t *q)
{
    return q->redis != NULL;
}

/* ---- the due heap (pending items by max(next, lease end)) ------------------- */

static int64_t fb_jdue(const fb_jitem_t *it)
{
    return it->next_ms > it->lease_until ? it->next_ms : it->lease_until;
}

/* Earlier due first; the same due time in accept order. */
static bool fb_jbefore(const fb_jitem_t *a, const fb_jitem_t *b)
{
    int64_t da = fb_jdue(a), db = fb_jdue(b);
    return da < db || (da == db && a->seq < b->seq);
}

static void fb_heap_swap(fb_queue_t *q, size_t a, size_t b)
{
    fb_jitem_t *t = q->heap[a];
    q->heap[a] = q->heap[b];
    q->heap[b] = t;
    q->heap[a]->hidx = a;
    q->heap[b]->hidx = b;
}

static void fb_heap_fix(fb_queue_t *q, size_t i)
{
    while (i > 0 && fb_jbefore(q->heap[i], q->heap[(i - 1) / 2])) {
        fb_heap_swap(q, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < q->nheap && fb_jbefore(q->heap[l], q->heap[m]))
            m = l;
        if (r < q->nheap && fb_jbefore(q->heap[r], q->heap[m]))
            m = r;
        if (m == i)
            return;
        fb_heap_swap(q, i, m);
        i = m;
    }
}

static int fb_heap_push(fb_queue_t *q, fb_jitem_t *it)
{
    if (q->nheap == q->capheap) {
        size_t cap = q->capheap ? q->capheap * 2 : 64;
        fb_jitem_t **h = realloc(q->heap, cap * sizeof(*h));
        if (!h)
            return -1;
        q->heap = h;
        q->capheap = cap;
    }
    it->hidx = q->nheap;
    q->heap[q->nheap++] = it;
    fb_heap_fix(q, it->hidx);
    return 0;
}

static void fb_heap_remove(fb_queue_t *q, fb_jitem_t *it)
{
    size_t i = it->hidx, last = --q->nheap;
    if (i != last) {
        fb_heap_swap(q, i, last);
        fb_heap_fix(q, i);
    }
}

/* ---- records ------------------------------------------------------------------- */

typedef struct fb_rec {
    char *p;
    size_t len;
} fb_rec_t;

/* meta: taken. The record framed, in r->p (malloc'd). */
static int fb_rec_build(json_t *meta, const void *blob, size_t blen, fb_rec_t *r)
{
    char *m = meta ? json_dumps(meta, JSON_COMPACT) : NULL;
    json_decref(meta);
    if (!m)
        return -1;
    size_t ml = strlen(m), plen = ml + 1 + blen;
    if (plen > FB_J_MAX_REC) {
        free(m);
        return -1;
    }
    r->len = FB_J_HDR + plen;
    r->p = malloc(r->len);
    if (!r->p) {
        free(m);
        return -1;
    }
    unsigned char lb[4] = {(unsigned char)plen, (unsigned char)(plen >> 8),
                           (unsigned char)(plen >> 16), (unsigned char)(plen >> 24)};
    memcpy(r->p, lb, 4);
    memcpy(r->p + FB_J_HDR, m, ml + 1);
    if (blen)
        memcpy(r->p + FB_J_HDR + ml + 1, blob, blen);
    free(m);
    unsigned char d[32];
    fb_sha256(lb, 4, r->p + FB_J_HDR, plen, NULL, 0, d);
    memcpy(r->p + 4, d, 8);
    return 0;
}

/* ---- applying records to the memory state ------------------------------------- */

static void fb_jitem_free(fb_jitem_t *it)
{
    if (!it)
        return;
    free(it->user);
    free(it->key);
    free(it->route);
    free(it->body);
    free(it->result);
    free(it);
}

static int64_t fb_jitem_bytes(const fb_jitem_t *it)
{
    return (int64_t)(it->body_len + it->result_len + 256);
}

static void fb_jitem_end(fb_queue_t *q, fb_jitem_t *it, fb_jstate_t st, int64_t at)
{
    fb_heap_remove(q, it);
    TAILQ_REMOVE(&q->pending, it, link);
    it->state = st;
    it->ended_ms = at;
    TAILQ_INSERT_TAIL(&q->ended, it, link);
    q->npending--;
    if (st == FB_J_DELIVERED)
        q->delivered++;
    else
        q->dead++;
}

static const char *fb_jstr(json_t *m, const char *k)
{
    return json_string_value(json_object_get(m, k));
}

static int64_t fb_jint(json_t *m, const char *k)
{
    return (int64_t)json_integer_value(json_object_get(m, k));
}

/* Under the lock. Records that do not fit the state (an attempt for an id
 * compaction dropped, a second delivery) change nothing: replay and the
 * live path treat them alike. -1 only on OOM. */
static int fb_japply(fb_queue_t *q, json_t *m, const char *blob, size_t blen)
{
    const char *t = fb_jstr(m, "t"), *id = fb_jstr(m, "id");
    if (!t)
        return 0;
    if (strcmp(t, "base") == 0) {
        q->accepted += fb_jint(m, "acc");
        q->delivered += fb_jint(m, "del");
        q->dead += fb_jint(m, "dead");
        return 0;
    }
    if (!id || strlen(id) != FB_QUEUE_ID_LEN)
        return 0;
    fb_jitem_t *it = NULL;
    HASH_FIND_STR(q->items, id, it);
    if (strcmp(t, "a") == 0) {
        if (it)
            return 0;
        it = calloc(1, sizeof(*it));
        if (!it)
            return -1;
        memcpy(it->id, id, FB_QUEUE_ID_LEN + 1);
        it->seq = ++q->seq;
        const char *u = fb_jstr(m, "u"), *k = fb_jstr(m, "k"), *r = fb_jstr(m, "r");
        it->user = strdup(u ? u : "");
        it->key = k ? strdup(k) : NULL;
        it->route = strdup(r ? r : "");
        it->body = malloc(blen + 1);
        if (!it->user || (k && !it->key) || !it->route || !it->body || fb_heap_push(q, it) != 0) {
            fb_jitem_free(it);
            return -1;
        }
        memcpy(it->body, blob, blen);
        it->body[blen] = '\0';
        it->body_len = blen;
        it->accepted_ms = fb_jint(m, "at");
        it->next_ms = fb_jint(m, "next");
        fb_heap_fix(q, it->hidx);
        HASH_ADD_STR(q->items, id, it);
        TAILQ_INSERT_TAIL(&q->pending, it, link);
        q->accepted++;
        q->npending++;
        q->live_bytes += fb_jitem_bytes(it);
        return 0;
    }
    if (!it || it->state != FB_J_PENDING)
        return 0;
    if (strcmp(t, "t") == 0) {
        it->attempts = (int)fb_jint(m, "n");
        it->next_ms = fb_jint(m, "next");
        it->lease_until = 0;
        fb_heap_fix(q, it->hidx);
    } else if (strcmp(t, "d") == 0) {
        it->result = malloc(blen + 1);
        if (!it->result)
            return -1;
        memcpy(it->result, blob, blen);
        it->result[blen] = '\0';
        it->result_len = blen;
        q->live_bytes += (int64_t)blen;
        fb_jitem_end(q, it, FB_J_DELIVERED, fb_jint(m, "at"));
    } else if (strcmp(t, "x") == 0) {
        fb_jitem_end(q, it, FB_J_DEAD, fb_jint(m, "at"));
    }
    return 0;
}

/* Splits a payload into its JSON and blob; NULL when malformed. */
static json_t *fb_jparse(const char *p, size_t n, const char **blob, size_t *blen)
{
    const char *nul = memchr(p, '\0', n);
    if (!nul)
        return NULL;
    json_t *m = json_loadb(p, (size_t)(nul - p), 0, NULL);
    if (!m || !json_is_object(m)) {
        json_decref(m);
        return NULL;
    }
    *blob = nul + 1;
    *blen = n - (size_t)(nul - p) - 1;
    return m;
}

/* ---- writing --------------------------------------------------------------------- */

static int fb_write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Under the lock: appends r. On a failed write the file is cut back so no
 * partial record sits before later ones. */
static int fb_jappend(fb_queue_t *q, const fb_rec_t *r)
{
    if (q->broken)
        return -1;
    if (fb_write_all(q->fd, r->p, r->len) != 0) {
        int e = errno;
        if (ftruncate(q->fd, q->file_bytes) != 0) {
            q->broken = true;
            sl_error("queue journal %s: write failed (%s) and could not be cut back: the queue "
                     "stops",
                     q->path, strerror(e));
        } else {
            sl_warn("queue journal %s: write failed: %s", q->path, strerror(e));
        }
        return -1;
    }
    q->file_bytes += (int64_t)r->len;
    q->written_seq += r->len;
    return 0;
}

/* Under the lock (released while syncing): returns once everything written
 * up to `upto` is on disk. A failed fdatasync stops the queue: after one,
 * what is on disk is unknown (the kernel may have dropped the dirty pages). */
static int fb_jsync(fb_queue_t *q, uint64_t upto)
{
    while (q->synced_seq < upto) {
        if (q->broken)
            return -1;
        if (q->syncing) {
            pthread_cond_wait(&q->cv, &q->lock);
            continue;
        }
        q->syncing = true;
        uint64_t target = q->written_seq;
        int fd = q->fd;
        pthread_mutex_unlock(&q->lock);
        int rc = fdatasync(fd);
        int e = errno;
        pthread_mutex_lock(&q->lock);
        q->syncing = false;
        sl_counter_add(fb_m.q_fsync, 1);
        if (rc != 0) {
            q->broken = true;
            sl_error("queue journal %s: fdatasync failed: %s; the queue stops", q->path,
                     strerror(e));
        } else if (target > q->synced_seq) {
            q->synced_seq = target;
        }
        pthread_cond_broadcast(&q->cv);
    }
    return 0;
}

/* Under the lock: write, apply, and (when sync) wait for the disk. */
static int fb_jlog(fb_queue_t *q, json_t *meta, const void *blob, size_t blen, bool sync)
{
    fb_rec_t r;
    json_t *m = json_incref(meta);
    if (fb_rec_build(m, blob, blen, &r) != 0) {
        json_decref(meta);
        return -1;
    }
    int rc = fb_jappend(q, &r);
    free(r.p);
    if (rc == 0)
        rc = fb_japply(q, meta, blob, blen);
    json_decref(meta);
    if (rc == 0 && sync)
        rc = fb_jsync(q, q->written_seq);
    if (rc != 0)
        sl_counter_add(fb_m.q_store_errors, 1);
    return rc;
}

static void fb_jgauges(fb_queue_t *q, int64_t now)
{
    sl_gauge_set(fb_m.q_depth, q->npending);
    fb_jitem_t *h = TAILQ_FIRST(&q->pending);
    sl_gauge_set(fb_m.q_oldest, h && now > h->accepted_ms ? (now - h->accepted_ms) / 1000 : 0);
}

/* ---- open and replay --------------------------------------------------------------- */

static int fb_mkdirs(const char *dir)
{
    char buf[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof(buf))
        return -1;
    memcpy(buf, dir, n + 1);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0700) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return mkdir(buf, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

static int fb_jreplay(fb_queue_t *q, char *err, size_t errlen)
{
    struct stat st;
    if (fstat(q->fd, &st) != 0) {
        snprintf(err, errlen, "%s: %s", q->path, strerror(errno));
        return -1;
    }
    int64_t size = st.st_size, off = 0;
    size_t nrec = 0;
    char *buf = NULL;
    size_t cap = 0;
    while (off + FB_J_HDR <= size) {
        unsigned char hdr[FB_J_HDR];
        if (pread(q->fd, hdr, FB_J_HDR, off) != FB_J_HDR)
            break;
        uint32_t plen = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 |
                        (uint32_t)hdr[3] << 24;
        if (plen > FB_J_MAX_REC || off + FB_J_HDR + (int64_t)plen > size)
            break;
        if (plen > cap) {
            char *nb = realloc(buf, plen);
            if (!nb) {
                free(buf);
                snprintf(err, errlen, "out of memory replaying %s", q->path);
                return -1;
            }
            buf = nb;
            cap = plen;
        }
        if (pread(q->fd, buf, plen, off + FB_J_HDR) != (ssize_t)plen)
            break;
        unsigned char d[32];
        fb_sha256(hdr, 4, buf, plen, NULL, 0, d);
        if (memcmp(d, hdr + 4, 8) != 0)
            break;
        const char *blob;
        size_t blen;
        json_t *m = fb_jparse(buf, plen, &blob, &blen);
        if (!m)
            break;
        int rc = fb_japply(q, m, blob, blen);
        json_decref(m);
        if (rc != 0) {
            free(buf);
            snprintf(err, errlen, "out of memory replaying %s", q->path);
            return -1;
        }
        off += FB_J_HDR + plen;
        nrec++;
    }
    free(buf);
    if (off < size) {
        /* A crash tore the last write: what follows the last whole record
         * was never acknowledged (its fdatasync had not returned). */
        sl_warn("queue journal %s: dropping %lld bytes after the last whole record (offset %lld)",
                q->path, (long long)(size - off), (long long)off);
        if (ftruncate(q->fd, off) != 0 || fdatasync(q->fd) != 0) {
            snprintf(err, errlen, "%s: cannot truncate the torn tail: %s", q->path,
                     strerror(errno));
            return -1;
        }
    }
    q->file_bytes = off;
    sl_info("queue journal %s: %zu records, %lld pending, %lld delivered, %lld dead", q->path, nrec,
            (long long)q->npending, (long long)q->delivered, (long long)q->dead);
    return 0;
}

static char *fb_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int fb_jopen(fb_queue_t *q, char *err, size_t errlen)
{
    const char *dir = q->c.dir;
    if (fb_mkdirs(dir) != 0) {
        snprintf(err, errlen, "queue.dir %s: cannot create: %s", dir, strerror(errno));
        return -1;
    }
    q->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    char *lockp = fb_path(dir, FB_J_LOCK);
    q->path = fb_path(dir, FB_J_NAME);
    q->tmp_path = fb_path(dir, FB_J_TMP);
    if (q->dirfd < 0 || !lockp || !q->path || !q->tmp_path) {
        snprintf(err, errlen, "queue.dir %s: %s", dir, strerror(errno));
        free(lockp);
        return -1;
    }
    q->lockfd = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    free(lockp);
    if (q->lockfd < 0 || flock(q->lockfd, LOCK_EX | LOCK_NB) != 0) {
        snprintf(err, errlen, "queue.dir %s: %s", dir,
                 errno == EWOULDBLOCK ? "in use by another sluice process" : strerror(errno));
        return -1;
    }
    /* A compaction that died before its rename: the journal is whole. */
    if (unlink(q->tmp_path) != 0 && errno != ENOENT) {
        snprintf(err, errlen, "%s: %s", q->tmp_path, strerror(errno));
        return -1;
    }
    q->fd = open(q->path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (q->fd < 0 || fsync(q->dirfd) != 0) {
        snprintf(err, errlen, "%s: %s", q->path, strerror(errno));
        return -1;
    }
    return fb_jreplay(q, err, errlen);
}

fb_queue_t *fb_queue_new(const conf_fb_queue_t *c, const conf_redis_t *redis, char *err,
                         size_t errlen)
{
    fb_metrics_init();
    fb_queue_t *q = calloc(1, sizeof(*q));
    if (!q) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    q->c = *c;
    q->c.dir = c->dir ? strdup(c->dir) : strdup("var/queue");
    q->now = fb_queue_default_now;
    q->fill = fb_queue_default_fill;
    q->fd = q->dirfd = q->lockfd = -1;
    q->compact_min = FB_J_COMPACT_B;
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cv, NULL);
    TAILQ_INIT(&q->pending);
    TAILQ_INIT(&q->ended);
    bool use_redis = c->store == CONF_QUEUE_STORE_REDIS ||
                     (c->store == CONF_QUEUE_STORE_AUTO && redis && redis->url);
    if (use_redis) {
        if (!redis || !redis->url) {
            snprintf(err, errlen, "fallback.queue.store redis needs redis.url");
            fb_queue_free(q);
            return NULL;
        }
        q->redis = fb_qr_new(q, c, redis, err, errlen);
        if (!q->redis) {
            fb_queue_free(q);
            return NULL;
        }
        return q;
    }
    if (!q->c.dir || fb_jopen(q, err, errlen) != 0) {
        fb_queue_free(q);
        return NULL;
    }
    fb_jgauges(q, fb_queue_now(q));
    return q;
}

void fb_queue_free(fb_queue_t *q)
{
    if (!q)
        return;
    fb_qr_free(q->redis);
    fb_jitem_t *it, *tmp;
    HASH_ITER(hh, q->items, it, tmp)
    {
        HASH_DEL(q->items, it);
        fb_jitem_free(it);
    }
    free(q->heap);
    if (q->fd >= 0)
        close(q->fd);
    if (q->dirfd >= 0)
        close(q->dirfd);
    if (q->lockfd >= 0)
        close(q->lockfd); /* releases the flock */
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->cv);
    free(q->path);
    free(q->tmp_path);
    free(q->c.dir);
    free(q);
}

fb_qworker_t *fb_qworker_new(fb_queue_t *q, struct event_base *base, char *err, size_t errlen)
{
    if (q->redis)
        return fb_qr_worker_new(q, q->redis, base, err, errlen);
    fb_qworker_t *w = calloc(1, sizeof(*w));
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    w->q = q;
    return w;
}

void fb_qworker_free(fb_qworker_t *w)
{
    if (!w)
        return;
    if (w->q->redis) {
        fb_qr_worker_free(w);
        return;
    }
    free(w);
}

static fb_queue_t *fb_wq(fb_qworker_t *w)
{
    return w->q;
}

/* ---- operations -------------------------------------------------------------------- */

fb_rc_t fb_queue_accept(fb_qworker_t *w, const fb_qaccept_t *in, fb_qres_t *res, fb_queue_cb cb,
                        void *arg, fb_call_t **call)
{
    fb_queue_t *q = fb_wq(w);
    memset(res, 0, sizeof(*res));
    char id[FB_QUEUE_ID_LEN + 1];
    fb_queue_new_id(q, id);
    int64_t now = fb_queue_now(q);
    if (q->redis)
        return fb_qr_accept(w, id, in, now, res, cb, arg, call);
    json_t *m = json_pack("{s:s, s:s, s:s, s:s, s:I, s:I}", "t", "a", "id", id, "u",
                          in->user ? in->user : "", "r", in->route ? in->route : "", "at",
                          (json_int_t)now, "next", (json_int_t)(now + q->c.backoff_ms));
    if (!m)
        return FB_ERROR;
    if (in->idem_key)
        json_object_set_new(m, "k", json_string(in->idem_key));
    pthread_mutex_lock(&q->lock);
    if (q->npending >= q->c.max_pending) {
        pthread_mutex_unlock(&q->lock);
        json_decref(m);
        sl_counter_add(fb_m.q_full, 1);
        res->status = FB_Q_FULL;
        return FB_DONE;
    }
    int rc = fb_jlog(q, m, in->body, in->body_len, true);
    if (rc == 0)
        fb_jgauges(q, now);
    pthread_mutex_unlock(&q->lock);
    if (rc != 0) {
        res->status = FB_Q_STORE_ERROR;
        return FB_DONE;
    }
    sl_counter_add(fb_m.q_accepted, 1);
    fb_count_tier(FB_TIER_QUEUE);
    res->status = FB_Q_OK;
    memcpy(res->id, id, sizeof(id));
    return FB_DONE;
}

/* Under the lock: dead-letters pending items past max_age (oldest first). */
static int fb_jexpire(fb_queue_t *q, int64_t now)
{
    fb_jitem_t *it;
    while ((it = TAILQ_FIRST(&q->pending)) && it->accepted_ms + q->c.max_age_ms <= now) {
        json_t *m = json_pack("{s:s, s:s, s:I, s:s}", "t", "x", "id", it->id, "at", (json_int_t)now,
                              "why", "max_age");
        if (!m || fb_jlog(q, m, NULL, 0, false) != 0)
            return -1;
        sl_counter_add(fb_m.q_dead, 1);
    }
    return 0;
}

static fb_qitem_t *fb_jcopy(const fb_jitem_t *it)
{
    fb_qitem_t *o = calloc(1, sizeof(*o));
    if (!o)
        return NULL;
    memcpy(o->id, it->id, sizeof(o->id));
    o->user = strdup(it->user);
    o->idem_key = it->key ? strdup(it->key) : NULL;
    o->route = strdup(it->route);
    o->body = malloc(it->body_len + 1);
    if (!o->user || (it->key && !o->idem_key) || !o->route || !o->body) {
        fb_qitem_free(o);
        return NULL;
    }
    memcpy(o->body, it->body, it->body_len + 1);
    o->body_len = it->body_len;
    o->attempts = it->attempts;
    o->accepted_ms = it->accepted_ms;
    return o;
}

fb_rc_t fb_queue_next(fb_qworker_t *w, fb_qres_t *res, fb_queue_cb cb, void *arg, fb_call_t **call)
{
    fb_queue_t *q = fb_wq(w);
    memset(res, 0, sizeof(*res));
    int64_t now = fb_queue_now(q);
    if (q->redis)
        return fb_qr_next(w, now, res, cb, arg, call);
    pthread_mutex_lock(&q->lock);
    if (fb_jexpire(q, now) != 0) {
        pthread_mutex_unlock(&q->lock);
        res->status = FB_Q_STORE_ERROR;
        return FB_DONE;
    }
    res->status = FB_Q_NONE;
    if (q->nheap > 0 && fb_jdue(q->heap[0]) <= now) {
        fb_jitem_t *it = q->heap[0];
        res->item = fb_jcopy(it);
        if (!res->item) {
            pthread_mutex_unlock(&q->lock);
            return FB_ERROR;
        }
        it->lease_until = now + q->c.lease_ms;
        fb_heap_fix(q, it->hidx);
        res->status = FB_Q_OK;
    }
    fb_jgauges(q, now);
    pthread_mutex_unlock(&q->lock);
    return FB_DONE;
}

fb_rc_t fb_queue_report(fb_qworker_t *w, const char *id, fb_qoutcome_t o, const void *result,
                        size_t result_len, fb_qres_t *res, fb_queue_cb cb, void *arg,
                        fb_call_t **call)
{
    fb_queue_t *q = fb_wq(w);
    memset(res, 0, sizeof(*res));
    int64_t now = fb_queue_now(q);
    uint64_t rnd = fb_queue_rand(q);
    if (q->redis)
        return fb_qr_report(w, id, o, result, result_len, now, rnd, res, cb, arg, call);
    pthread_mutex_lock(&q->lock);
    fb_jitem_t *it = NULL;
    HASH_FIND_STR(q->items, id, it);
    if (!it || it->state != FB_J_PENDING) {
        pthread_mutex_unlock(&q->lock);
        res->status = FB_Q_STALE;
        return FB_DONE;
    }
    json_t *m;
    bool sync = true;
    const char *why = NULL;
    if (o == FB_QO_DELIVERED) {
        m = json_pack("{s:s, s:s, s:I}", "t", "d", "id", id, "at", (json_int_t)now);
    } else if (o == FB_QO_RETRY && it->attempts + 1 < q->c.max_attempts) {
        int n = it->attempts + 1;
        int64_t next = now + fb_backoff_ms(q->c.backoff_ms, q->c.backoff_max_ms, n - 1, rnd);
        m = json_pack("{s:s, s:s, s:i, s:I}", "t", "t", "id", id, "n", n, "next", (json_int_t)next);
        sync = false;
    } else {
        why = o == FB_QO_RETRY ? "max_attempts" : "rejected";
        m = json_pack("{s:s, s:s, s:I, s:s}", "t", "x", "id", id, "at", (json_int_t)now, "why",
                      why);
    }
    int rc = m ? fb_jlog(q, m, o == FB_QO_DELIVERED ? result : NULL,
                         o == FB_QO_DELIVERED ? result_len : 0, sync)
               : -1;
    fb_jgauges(q, now);
    pthread_mutex_unlock(&q->lock);
    if (rc != 0) {
        res->status = FB_Q_STORE_ERROR;
        return FB_DONE;
    }
    if (o == FB_QO_DELIVERED)
        sl_counter_add(fb_m.q_delivered, 1);
    else if (why)
        sl_counter_add(fb_m.q_dead, 1);
    res->status = FB_Q_OK;
    return FB_DONE;
}

fb_rc_t fb_queue_lookup(fb_qworker_t *w, const char *id, const char *user, fb_qres_t *res,
                        fb_queue_cb cb, void *arg, fb_call_t **call)
{
    fb_queue_t *q = fb_wq(w);
    memset(res, 0, sizeof(*res));
    if (!user)
        user = "";
    int64_t now = fb_queue_now(q);
    if (q->redis)
        return fb_qr_lookup(w, id, user, now, res, cb, arg, call);
    pthread_mutex_lock(&q->lock);
    fb_jitem_t *it = NULL;
    if (id && strlen(id) == FB_QUEUE_ID_LEN)
        HASH_FIND_STR(q->items, id, it);
    res->status = FB_Q_UNKNOWN;
    if (it && strcmp(it->user, user) == 0) {
        switch (it->state) {
        case FB_J_PENDING:
            res->status = FB_Q_PENDING;
            res->next_ms = fb_jdue(it);
            break;
        case FB_J_DELIVERED:
            res->result = malloc(it->result_len + 1);
            if (!res->result) {
                pthread_mutex_unlock(&q->lock);
                return FB_ERROR;
            }
            memcpy(res->result, it->result, it->result_len + 1);
            res->result_len = it->result_len;
            res->status = FB_Q_DELIVERED;
            break;
        case FB_J_DEAD:
            res->status = FB_Q_DEAD;
            break;
        }
    }
    pthread_mutex_unlock(&q->lock);
    return FB_DONE;
}

/* ---- maintenance and compaction -------------------------------------------------------- */

/* Under the lock, no fdatasync running: rewrites the journal with the live
 * items only. */
static int fb_jcompact(fb_queue_t *q)
{
    while (q->syncing)
        pthread_cond_wait(&q->cv, &q->lock);
    int fd = open(q->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) {
        sl_warn("queue journal %s: compaction: %s", q->tmp_path, strerror(errno));
        return -1;
    }
    int64_t nitems = 0, ndel = 0, ndead = 0;
    for (fb_jitem_t *it = q->items; it; it = it->hh.next) {
        nitems++;
        ndel += it->state == FB_J_DELIVERED;
        ndead += it->state == FB_J_DEAD;
    }
    int64_t bytes = 0;
    int rc = 0;
    json_t *metas[4];
    const void *blobs[4];
    size_t blens[4];
    int nm = 0;
    /* The counts of forgotten items, so accepted = delivered + dead +
     * pending still holds after a restart. */
    metas[nm] =
        json_pack("{s:s, s:I, s:I, s:I}", "t", "base", "acc", (json_int_t)(q->accepted - nitems),
                  "del", (json_int_t)(q->delivered - ndel), "dead", (json_int_t)(q->dead - ndead));
    blobs[nm] = NULL;
    blens[nm++] = 0;
    fb_jitem_t *it = q->items;
    for (;;) {
        for (int i = 0; i < nm && rc == 0; i++) {
            fb_rec_t r;
            if (fb_rec_build(metas[i], blobs[i], blens[i], &r) != 0) {
                rc = -1;
                for (int j = i + 1; j < nm; j++)
                    json_decref(metas[j]);
                break;
            }
            rc = fb_write_all(fd, r.p, r.len);
            bytes += (int64_t)r.len;
            free(r.p);
            if (rc != 0)
                for (int j = i + 1; j < nm; j++)
                    json_decref(metas[j]);
        }
        nm = 0;
        if (rc != 0 || !it)
            break;
        json_t *a = json_pack("{s:s, s:s, s:s, s:s, s:I, s:I}", "t", "a", "id", it->id, "u",
                              it->user, "r", it->route, "at", (json_int_t)it->accepted_ms, "next",
                              (json_int_t)it->next_ms);
        if (a && it->key)
            json_object_set_new(a, "k", json_string(it->key));
        metas[nm] = a;
        blobs[nm] = it->body;
        blens[nm++] = it->body_len;
        if (it->attempts > 0) {
            metas[nm] = json_pack("{s:s, s:s, s:i, s:I}", "t", "t", "id", it->id, "n", it->attempts,
                                  "next", (json_int_t)it->next_ms);
            blobs[nm] = NULL;
            blens[nm++] = 0;
        }
        if (it->state == FB_J_DELIVERED) {
            metas[nm] = json_pack("{s:s, s:s, s:I}", "t", "d", "id", it->id, "at",
                                  (json_int_t)it->ended_ms);
            blobs[nm] = it->result;
            blens[nm++] = it->result_len;
        } else if (it->state == FB_J_DEAD) {
            metas[nm] = json_pack("{s:s, s:s, s:I, s:s}", "t", "x", "id", it->id, "at",
                                  (json_int_t)it->ended_ms, "why", "kept");
            blobs[nm] = NULL;
            blens[nm++] = 0;
        }
        it = it->hh.next;
    }
    if (rc != 0 || fdatasync(fd) != 0 || rename(q->tmp_path, q->path) != 0 ||
        fsync(q->dirfd) != 0) {
        sl_warn("queue journal %s: compaction failed: %s", q->path, strerror(errno));
        close(fd);
        (void)unlink(q->tmp_path);
        return -1;
    }
    sl_counter_add(fb_m.q_fsync, 2);
    close(q->fd);
    q->fd = fd;
    sl_info("queue journal %s: compacted %lld -> %lld bytes", q->path, (long long)q->file_bytes,
            (long long)bytes);
    q->file_bytes = bytes;
    q->written_seq += (uint64_t)bytes;
    q->synced_seq = q->written_seq;
    return 0;
}

int fb_queue_maintain(fb_queue_t *q, fb_qworker_t *w)
{
    if (q->redis) {
        if (w)
            fb_qr_maintain(w);
        return 0;
    }
    int64_t now = fb_queue_now(q);
    pthread_mutex_lock(&q->lock);
    int rc = fb_jexpire(q, now);
    fb_jitem_t *it;
    while ((it = TAILQ_FIRST(&q->ended)) && it->ended_ms + q->c.keep_ms <= now) {
        TAILQ_REMOVE(&q->ended, it, link);
        HASH_DEL(q->items, it);
        q->live_bytes -= fb_jitem_bytes(it);
        fb_jitem_free(it);
    }
    if (rc == 0 && !q->broken && q->file_bytes > q->compact_min &&
        q->file_bytes > 2 * q->live_bytes)
        rc = fb_jcompact(q);
    fb_jgauges(q, now);
    pthread_mutex_unlock(&q->lock);
    return rc;
}

void fb_queue_stats(fb_queue_t *q, fb_qstats_t *st)
{
    memset(st, 0, sizeof(*st));
    if (q->redis) {
        fb_qr_stats(q->redis, st);
        return;
    }
    pthread_mutex_lock(&q->lock);
    st->accepted = q->accepted;
    st->delivered = q->delivered;
    st->dead = q->dead;
    st->pending = q->npending;
    fb_jitem_t *h = TAILQ_FIRST(&q->pending);
    st->oldest_pending_ms = h ? h->accepted_ms : 0;
    pthread_mutex_unlock(&q->lock);
}

int64_t fb_queue_journal_bytes(fb_queue_t *q)
{
    pthread_mutex_lock(&q->lock);
    int64_t n = q->file_bytes;
    pthread_mutex_unlock(&q->lock);
    return n;
}

/* Test hook (declared in the test): compaction threshold. */
void fb_queue_set_compact_min(fb_queue_t *q, int64_t bytes);
void fb_queue_set_compact_min(fb_queue_t *q, int64_t bytes)
{
    q->compact_min = bytes;
}
