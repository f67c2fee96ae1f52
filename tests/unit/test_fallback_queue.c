/*
 * The durable queue's journal store: accept / next / report / lookup with
 * an injected wall clock, the backoff schedule, max_attempts and max_age
 * dead letters, owner-only lookups, replay after a restart, crash safety
 * (the journal cut at every byte offset of its last record, and a flipped
 * byte: no acknowledged record lost, no torn record accepted), real kill -9
 * of a child process in the middle of accepts, exactly-once bookkeeping
 * under threads (accepted = delivered + dead + pending at every moment),
 * compaction, and the fsync cost of an accept.
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/log.h"
#include "fallback/fallback.h"

void fb_queue_set_compact_min(fb_queue_t *q, int64_t bytes);

static _Atomic int64_t fake_now = 1700000000000LL;

static int64_t clock_cb(void *arg)
{
    (void)arg;
    return atomic_load(&fake_now);
}

static char tmpdir[128];

static void mk_tmpdir(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/sl-fbq-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
}

static void rm_tree(const char *dir)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static conf_fb_queue_t qconf(const char *dir)
{
    conf_fb_queue_t c = {.enabled = true,
                         .store = CONF_QUEUE_STORE_JOURNAL,
                         .dir = (char *)dir,
                         .max_attempts = 5,
                         .max_age_ms = 3600000,
                         .backoff_ms = 1000,
                         .backoff_max_ms = 60000,
                         .lease_ms = 120000,
                         .keep_ms = 86400000,
                         .max_pending = 100000};
    return c;
}

typedef struct qh {
    fb_queue_t *q;
    fb_qworker_t *w;
} qh_t;

static void qh_open(qh_t *h, const conf_fb_queue_t *c)
{
    char err[256];
    h->q = fb_queue_new(c, NULL, err, sizeof(err));
    if (!h->q)
        fail_msg("fb_queue_new: %s", err);
    fb_queue_set_clock(h->q, clock_cb, NULL);
    h->w = fb_qworker_new(h->q, NULL, err, sizeof(err));
    assert_non_null(h->w);
}

static void qh_close(qh_t *h)
{
    fb_qworker_free(h->w);
    fb_queue_free(h->q);
    h->q = NULL;
    h->w = NULL;
}

static void accept1(qh_t *h, const char *user, const char *key, const char *body, char *id)
{
    fb_qaccept_t in = {.user = user,
                       .idem_key = key,
                       .route = "/v1/chat/completions",
                       .body = body,
                       .body_len = strlen(body)};
    fb_qres_t r;
    assert_int_equal(fb_queue_accept(h->w, &in, &r, NULL, NULL, NULL), FB_DONE);
    assert_int_equal(r.status, FB_Q_OK);
    assert_int_equal(strlen(r.id), FB_QUEUE_ID_LEN);
    if (id)
        strcpy(id, r.id);
    fb_qres_clear(&r);
}

static fb_qstatus_t lookup(qh_t *h, const char *id, const char *user, char **result, int64_t *next)
{
    fb_qres_t r;
    assert_int_equal(fb_queue_lookup(h->w, id, user, &r, NULL, NULL, NULL), FB_DONE);
    fb_qstatus_t s = r.status;
    if (result)
        *result = r.result ? strdup(r.result) : NULL;
    if (next)
        *next = r.next_ms;
    fb_qres_clear(&r);
    return s;
}

static fb_qitem_t *next_item(qh_t *h)
{
    fb_qres_t r;
    assert_int_equal(fb_queue_next(h->w, &r, NULL, NULL, NULL), FB_DONE);
    fb_qitem_t *it = r.item;
    r.item = NULL;
    assert_true(r.status == (it ? FB_Q_OK : FB_Q_NONE));
    fb_qres_clear(&r);
    return it;
}

static fb_qstatus_t report(qh_t *h, const char *id, fb_qoutcome_t o, const char *result)
{
    fb_qres_t r;
    assert_int_equal(
        fb_queue_report(h->w, id, o, result, result ? strlen(result) : 0, &r, NULL, NULL, NULL),
        FB_DONE);
    fb_qstatus_t s = r.status;
    fb_qres_clear(&r);
    return s;
}

static void check_invariant(qh_t *h)
{
    fb_qstats_t st;
    fb_queue_stats(h->q, &st);
    assert_int_equal(st.accepted, st.delivered + st.dead + st.pending);
}

/* ---- the basic life of a request -------------------------------------------- */

static void test_basic(void **state)
{
    (void)state;
    mk_tmpdir();
    conf_fb_queue_t c = qconf(tmpdir);
    qh_t h;
    qh_open(&h, &c);
    char a[64], b[64];
    accept1(&h, "alice", "key-1", "{\"model\":\"m\",\"messages\":[]}", a);
    accept1(&h, "bob", NULL, "{\"b\":2}", b);
    assert_string_not_equal(a, b);
    int64_t next;
    assert_int_equal(lookup(&h, a, "alice", NULL, &next), FB_Q_PENDING);
    assert_int_equal(next, atomic_load(&fake_now) + 1000);
    /* only the owner sees it; unknown ids are unknown */
    assert_int_equal(lookup(&h, a, "bob", NULL, NULL), FB_Q_UNKNOWN);
    assert_int_equal(lookup(&h, a, NULL, NULL, NULL), FB_Q_UNKNOWN);
    assert_int_equal(lookup(&h, "q00000000000000000000000000000000", "alice", NULL, NULL),
                     FB_Q_UNKNOWN);
    assert_int_equal(lookup(&h, "nonsense", "alice", NULL, NULL), FB_Q_UNKNOWN);

    /* not due before its backoff */
    assert_null(next_item(&h));
    atomic_fetch_add(&fake_now, 1000);
    fb_qitem_t *it = next_item(&h);
    assert_non_null(it);
    assert_string_equal(it->id, a); /* oldest first */
    assert_string_equal(it->user, "alice");
    assert_string_equal(it->idem_key, "key-1");
    assert_string_equal(it->route, "/v1/chat/completions");
    assert_string_equal(it->body, "{\"model\":\"m\",\"messages\":[]}");
    assert_int_equal(it->attempts, 0);
    fb_qitem_t *it2 = next_item(&h);
    assert_non_null(it2);
    assert_string_equal(it2->id, b);
    assert_null(it2->idem_key);
    /* both leased: nothing more is due */
    assert_null(next_item(&h));
    check_invariant(&h);

    assert_int_equal(report(&h, a, FB_QO_DELIVERED, "{\"object\":\"chat.completion\"}"), FB_Q_OK);
    /* exactly once: a second delivery changes nothing */
    assert_int_equal(report(&h, a, FB_QO_DELIVERED, "{\"other\":1}"), FB_Q_STALE);
    char *res;
    assert_int_equal(lookup(&h, a, "alice", &res, NULL), FB_Q_DELIVERED);
    assert_string_equal(res, "{\"object\":\"chat.completion\"}");
    free(res);
    assert_int_equal(lookup(&h, a, "bob", NULL, NULL), FB_Q_UNKNOWN);
    assert_int_equal(report(&h, b, FB_QO_REJECTED, NULL), FB_Q_OK);
    assert_int_equal(lookup(&h, b, "bob", NULL, NULL), FB_Q_DEAD);
    assert_int_equal(report(&h, "qnope", FB_QO_DELIVERED, "x"), FB_Q_STALE);

    fb_qstats_t st;
    fb_queue_stats(h.q, &st);
    assert_int_equal(st.accepted, 2);
    assert_int_equal(st.delivered, 1);
    assert_int_equal(st.dead, 1);
    assert_int_equal(st.pending, 0);
    fb_qitem_free(it);
    fb_qitem_free(it2);

    /* a second process on the same dir is refused */
    char err[256];
    assert_null(fb_queue_new(&c, NULL, err, sizeof(err)));
    assert_non_null(strstr(err, "in use"));
    qh_close(&h);

    /* restart: the same state */
    qh_open(&h, &c);
    assert_int_equal(lookup(&h, a, "alice", &res, NULL), FB_Q_DELIVERED);
    assert_string_equal(res, "{\"object\":\"chat.completion\"}");
    free(res);
    assert_int_equal(lookup(&h, b, "bob", NULL, NULL), FB_Q_DEAD);
    fb_queue_stats(h.q, &st);
    assert_int_equal(st.accepted, 2);
    assert_int_equal(st.delivered, 1);
    assert_int_equal(st.dead, 1);
    qh_close(&h);
    rm_tree(tmpdir);
}

/* ---- schedule: exponential backoff, max_attempts, leases, max_age ------------- */

static void test_schedule(void **state)
{
    (void)state;
    mk_tmpdir();
    conf_fb_queue_t c = qconf(tmpdir);
    c.max_attempts = 5;
    qh_t h;
    qh_open(&h, &c);
    char a[64];
    accept1(&h, "u", NULL, "{}", a);
    atomic_fetch_add(&fake_now, 1000);
    for (int n = 1; n < 5; n++) {
        fb_qitem_t *it = next_item(&h);
        assert_non_null(it);
        assert_int_equal(it->attempts, n - 1);
        fb_qitem_free(it);
        assert_int_equal(report(&h, a, FB_QO_RETRY, NULL), FB_Q_OK);
        int64_t next, now = atomic_load(&fake_now);
        assert_int_equal(lookup(&h, a, "u", NULL, &next), FB_Q_PENDING);
        /* delay n: backoff * 2^(n-1), jittered to [half, full] */
        int64_t full = 1000LL << (n - 1);
        assert_true(next - now >= full / 2 && next - now <= full);
        atomic_store(&fake_now, next - 1);
        assert_null(next_item(&h));
        atomic_store(&fake_now, next);
    }
    fb_qitem_t *it = next_item(&h);
    assert_non_null(it);
    fb_qitem_free(it);
    /* the fifth failure is the last */
    assert_int_equal(report(&h, a, FB_QO_RETRY, NULL), FB_Q_OK);
    assert_int_equal(lookup(&h, a, "u", NULL, NULL), FB_Q_DEAD);
    assert_null(next_item(&h));

    /* a lease that nobody reports runs out and the item is due again */
    char b[64];
    accept1(&h, "u", NULL, "{}", b);
    atomic_fetch_add(&fake_now, 1000);
    it = next_item(&h);
    assert_string_equal(it->id, b);
    fb_qitem_free(it);
    atomic_fetch_add(&fake_now, 119999);
    assert_null(next_item(&h));
    atomic_fetch_add(&fake_now, 1);
    it = next_item(&h);
    assert_non_null(it);
    assert_string_equal(it->id, b);
    fb_qitem_free(it);

    /* max_age: dead-lettered on the next look, even while leased */
    atomic_fetch_add(&fake_now, 3600000);
    assert_null(next_item(&h));
    assert_int_equal(lookup(&h, b, "u", NULL, NULL), FB_Q_DEAD);
    assert_int_equal(report(&h, b, FB_QO_DELIVERED, "late"), FB_Q_STALE);
    check_invariant(&h);

    /* max_pending */
    qh_close(&h);
    c.max_pending = 2;
    qh_open(&h, &c);
    accept1(&h, "u", NULL, "1", NULL);
    accept1(&h, "u", NULL, "2", NULL);
    fb_qaccept_t in = {.user = "u", .route = "r", .body = "3", .body_len = 1};
    fb_qres_t r;
    assert_int_equal(fb_queue_accept(h.w, &in, &r, NULL, NULL, NULL), FB_DONE);
    assert_int_equal(r.status, FB_Q_FULL);
    qh_close(&h);
    rm_tree(tmpdir);
}

/* ---- crash safety: the journal cut at every byte of its last record ---------- */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    assert_int_equal(fread(p, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return p;
}

static void write_file(const char *path, const char *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void test_torn_tail(void **state)
{
    (void)state;
    mk_tmpdir();
    conf_fb_queue_t c = qconf(tmpdir);
    qh_t h;
    qh_open(&h, &c);
    char ids[3][64], last[64];
    accept1(&h, "u", "k0", "{\"n\":0}", ids[0]);
    accept1(&h, "u", NULL, "{\"n\":1}", ids[1]);
    accept1(&h, "u", NULL, "{\"n\":2}", ids[2]);
    atomic_fetch_add(&fake_now, 1000);
    fb_qitem_free(next_item(&h));
    assert_int_equal(report(&h, ids[0], FB_QO_DELIVERED, "{\"answer\":0}"), FB_Q_OK);
    int64_t before = fb_queue_journal_bytes(h.q);
    accept1(&h, "v", "kl", "{\"n\":\"last, with a body long enough to cut in many places\"}", last);
    int64_t after = fb_queue_journal_bytes(h.q);
    qh_close(&h);

    char path[256], cdir[200], cpath[300];
    snprintf(path, sizeof(path), "%s/journal", tmpdir);
    size_t len = 0;
    char *full = read_file(path, &len);
    assert_int_equal((int64_t)len, after);
    snprintf(cdir, sizeof(cdir), "%s/cut", tmpdir);
    snprintf(cpath, sizeof(cpath), "%s/journal", cdir);
    conf_fb_queue_t cc = qconf(cdir);
    sl_log_set_level(SL_LOG_ERROR); /* one "dropping N bytes" warning per offset */
    for (int64_t off = before; off <= after; off++) {
        rm_tree(cdir);
        assert_int_equal(mkdir(cdir, 0700), 0);
        write_file(cpath, full, (size_t)off);
        qh_open(&h, &cc);
        /* everything acknowledged before the last record is there */
        char *res;
        assert_int_equal(lookup(&h, ids[0], "u", &res, NULL), FB_Q_DELIVERED);
        assert_string_equal(res, "{\"answer\":0}");
        free(res);
        assert_int_equal(lookup(&h, ids[1], "u", NULL, NULL), FB_Q_PENDING);
        assert_int_equal(lookup(&h, ids[2], "u", NULL, NULL), FB_Q_PENDING);
        /* the last one only when whole */
        fb_qstatus_t s = lookup(&h, last, "v", NULL, NULL);
        assert_int_equal(s, off == after ? FB_Q_PENDING : FB_Q_UNKNOWN);
        fb_qstats_t st;
        fb_queue_stats(h.q, &st);
        assert_int_equal(st.accepted, off == after ? 4 : 3);
        check_invariant(&h);
        /* the torn tail is cut off, so new records follow whole ones */
        assert_int_equal(fb_queue_journal_bytes(h.q), off == after ? after : before);
        char again[64];
        accept1(&h, "w", NULL, "{}", again);
        qh_close(&h);
        qh_open(&h, &cc);
        assert_int_equal(lookup(&h, again, "w", NULL, NULL), FB_Q_PENDING);
        qh_close(&h);
    }
    /* a flipped byte anywhere in the last record: that record is refused */
    for (int64_t off = before; off < after; off += 7) {
        rm_tree(cdir);
        assert_int_equal(mkdir(cdir, 0700), 0);
        full[off] ^= 0x20;
        write_file(cpath, full, len);
        full[off] ^= 0x20;
        qh_open(&h, &cc);
        assert_int_equal(lookup(&h, last, "v", NULL, NULL), FB_Q_UNKNOWN);
        assert_int_equal(lookup(&h, ids[2], "u", NULL, NULL), FB_Q_PENDING);
        qh_close(&h);
    }
    sl_log_set_level(SL_LOG_INFO);
    free(full);
    rm_tree(tmpdir);
}

/* ---- kill -9 in the middle of accepts ---------------------------------------- */

static void test_kill9(void **state)
{
    (void)state;
    mk_tmpdir();
    conf_fb_queue_t c = qconf(tmpdir);
    sl_log_set_level(SL_LOG_ERROR);
    char acked[2000][FB_QUEUE_ID_LEN + 1];
    size_t nacked = 0;
    for (int round = 0; round < 3; round++) {
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            char err[256];
            fb_queue_t *q = fb_queue_new(&c, NULL, err, sizeof(err));
            if (!q)
                _exit(2);
            fb_qworker_t *w = fb_qworker_new(q, NULL, err, sizeof(err));
            for (;;) {
                fb_qaccept_t in = {.user = "u", .route = "r", .body = "{\"x\":1}", .body_len = 7};
                fb_qres_t r;
                if (fb_queue_accept(w, &in, &r, NULL, NULL, NULL) != FB_DONE || r.status != FB_Q_OK)
                    _exit(3);
                /* acknowledged: only now does the "client" learn the id */
                if (write(fds[1], r.id, FB_QUEUE_ID_LEN) != FB_QUEUE_ID_LEN)
                    _exit(4);
            }
        }
        close(fds[1]);
        /* let it acknowledge a few hundred, then kill it mid-stride */
        size_t got = 0;
        char buf[FB_QUEUE_ID_LEN];
        while (got < 200 + (size_t)round * 50) {
            ssize_t n = read(fds[0], buf, sizeof(buf));
            assert_int_equal(n, FB_QUEUE_ID_LEN); /* writes of 33 bytes to a pipe are atomic */
            memcpy(acked[nacked], buf, FB_QUEUE_ID_LEN);
            acked[nacked][FB_QUEUE_ID_LEN] = '\0';
            nacked++;
            got++;
        }
        kill(pid, SIGKILL);
        ssize_t n;
        while ((n = read(fds[0], buf, sizeof(buf))) == FB_QUEUE_ID_LEN && nacked < 2000) {
            memcpy(acked[nacked], buf, FB_QUEUE_ID_LEN);
            acked[nacked][FB_QUEUE_ID_LEN] = '\0';
            nacked++;
        }
        close(fds[0]);
        int st;
        waitpid(pid, &st, 0);
        assert_true(WIFSIGNALED(st));
    }
    qh_t h;
    qh_open(&h, &c);
    for (size_t i = 0; i < nacked; i++)
        if (lookup(&h, acked[i], "u", NULL, NULL) != FB_Q_PENDING)
            fail_msg("acknowledged %s lost after kill -9", acked[i]);
    fb_qstats_t st;
    fb_queue_stats(h.q, &st);
    /* at most one accepted-but-unacknowledged per kill */
    assert_true(st.accepted >= (int64_t)nacked && st.accepted <= (int64_t)nacked + 3);
    check_invariant(&h);
    printf("  kill -9 x3: %zu acknowledged, all found; %lld in the journal\n", nacked,
           (long long)st.accepted);
    qh_close(&h);
    sl_log_set_level(SL_LOG_INFO);
    rm_tree(tmpdir);
}

/* ---- exactly-once bookkeeping under threads ------------------------------------ */

typedef struct race {
    qh_t *h;
    _Atomic bool stop;
    _Atomic int accepted_ok;
    _Atomic int delivered_ok, dead_ok, stale;
    _Atomic int violations;
    int per_producer;
    unsigned seed;
    _Atomic int *deliveries; /* by accept order is unknown: counted by id hash */
    char (*ids)[FB_QUEUE_ID_LEN + 1];
    _Atomic int nids;
} race_t;

static void *producer(void *arg)
{
    race_t *r = arg;
    for (int i = 0; i < r->per_producer; i++) {
        fb_qaccept_t in = {.user = "u", .route = "r", .body = "{}", .body_len = 2};
        fb_qres_t res;
        if (fb_queue_accept(r->h->w, &in, &res, NULL, NULL, NULL) == FB_DONE &&
            res.status == FB_Q_OK) {
            int k = atomic_fetch_add(&r->nids, 1);
            strcpy(r->ids[k], res.id);
            atomic_fetch_add(&r->accepted_ok, 1);
        }
        fb_qres_clear(&res);
    }
    return NULL;
}

static void *consumer(void *arg)
{
    race_t *r = arg;
    unsigned seed = r->seed + (unsigned)(uintptr_t)pthread_self();
    while (!atomic_load(&r->stop)) {
        atomic_fetch_add(&fake_now, 50);
        fb_qres_t res;
        if (fb_queue_next(r->h->w, &res, NULL, NULL, NULL) != FB_DONE || !res.item) {
            fb_qres_clear(&res);
            continue;
        }
        int x = rand_r(&seed) % 10;
        fb_qoutcome_t o = x < 6 ? FB_QO_DELIVERED : x < 9 ? FB_QO_RETRY : FB_QO_REJECTED;
        fb_qres_t rr;
        assert_int_equal(
            fb_queue_report(r->h->w, res.item->id, o, "{\"ok\":1}", 8, &rr, NULL, NULL, NULL),
            FB_DONE);
        if (rr.status == FB_Q_STALE)
            atomic_fetch_add(&r->stale, 1);
        /* a second delivery of the same item must be refused */
        if (o == FB_QO_DELIVERED && rr.status == FB_Q_OK) {
            atomic_fetch_add(&r->delivered_ok, 1);
            fb_qres_t r2;
            assert_int_equal(fb_queue_report(r->h->w, res.item->id, FB_QO_DELIVERED, "x", 1, &r2,
                                             NULL, NULL, NULL),
                             FB_DONE);
            if (r2.status != FB_Q_STALE)
                atomic_fetch_add(&r->violations, 1);
        }
        fb_qres_clear(&res);
    }
    return NULL;
}

static void *monitor(void *arg)
{
    race_t *r = arg;
    while (!atomic_load(&r->stop)) {
        fb_qstats_t st;
        fb_queue_stats(r->h->q, &st);
        if (st.accepted != st.delivered + st.dead + st.pending)
            atomic_fetch_add(&r->violations, 1);
    }
    return NULL;
}

static void test_exactly_once_threads(void **state)
{
    (void)state;
    mk_tmpdir();
    conf_fb_queue_t c = qconf(tmpdir);
    c.backoff_ms = 10;
    c.backoff_max_ms = 100;
    c.max_attempts = 3;
    /* Leases never run out here: a second take would be a bug. The fake clock
     * moves 50 ms per consumer turn (100 per drain spin), so on a loaded
     * machine millions of ms can pass in one run: the lease must outlast any
     * run, not just a quick one. */
    c.lease_ms = (int64_t)1 << 50;
    /* Likewise nothing may age out (max_age turns a pending item dead, which
     * its consumer then sees as stale) or be forgotten before the restart. */
    c.max_age_ms = (int64_t)1 << 50;
    c.keep_ms = (int64_t)1 << 50;
    qh_t h;
    qh_open(&h, &c);
    race_t r = {.h = &h, .per_producer = 300, .seed = 7};
    r.ids = calloc(1000, sizeof(*r.ids));
    pthread_t p[2], cs[2], mon;
    pthread_create(&mon, NULL, monitor, &r);
    for (int i = 0; i < 2; i++)
        pthread_create(&cs[i], NULL, consumer, &r);
    for (int i = 0; i < 2; i++)
        pthread_create(&p[i], NULL, producer, &r);
    for (int i = 0; i < 2; i++)
        pthread_join(p[i], NULL);
    /* drain: until nothing is pending */
    for (int spins = 0; spins < 1000000; spins++) {
        fb_qstats_t st;
        fb_queue_stats(h.q, &st);
        if (st.pending == 0)
            break;
        atomic_fetch_add(&fake_now, 100);
        sched_yield();
    }
    atomic_store(&r.stop, true);
    for (int i = 0; i < 2; i++)
        pthread_join(cs[i], NULL);
    pthread_join(mon, NULL);
    fb_qstats_t st;
    fb_queue_stats(h.q, &st);
    printf("  threads: %lld accepted, %lld delivered, %lld dead, %lld pending; %d stale\n",
           (long long)st.accepted, (long long)st.delivered, (long long)st.dead,
           (long long)st.pending, atomic_load(&r.stale));
    assert_int_equal(atomic_load(&r.violations), 0);
    assert_int_equal(st.accepted, 600);
    assert_int_equal(atomic_load(&r.accepted_ok), 600);
    assert_int_equal(st.pending, 0);
    assert_int_equal(st.delivered, atomic_load(&r.delivered_ok));
    assert_int_equal(st.accepted, st.delivered + st.dead);
    assert_int_equal(atomic_load(&r.stale), 0);
    /* every id ended exactly once, and says so after a restart */
    qh_close(&h);
    qh_open(&h, &c);
    int del = 0, dead = 0;
    for (int i = 0; i < 600; i++) {
        fb_qstatus_t s = lookup(&h, r.ids[i], "u", NULL, NULL);
        assert_true(s == FB_Q_DELIVERED || s == FB_Q_DEAD);
        del += s == FB_Q_DELIVERED;
        dead += s == FB_Q_DEAD;
    }
    assert_int_equal(del, st.delivered);
    assert_int_equal(dead, st.dead);
    fb_qstats_t st2;
    fb_queue_stats(h.q, &st2);
    assert_memory_equal(&st, &st2, offsetof(fb_qstats_t, oldest_pending_ms));
    qh_close(&h);
    free(r.ids);
    rm_tree(tmpdir);
}

/* ---- compaction ---------------------------------------------------------------------- */

static void test_compaction(void **state)
{
    (void)state;
    mk_tmpdir();
    conf_fb_queue_t c = qconf(tmpdir);
    c.keep_ms = 60000;
    qh_t h;
    qh_open(&h, &c);
    fb_queue_set_compact_min(h.q, 4096);
    char body[600];
    memset(body, 'x', sizeof(body) - 1);
    body[sizeof(body) - 1] = '\0';
    char keepers[5][64], first[64];
    accept1(&h, "u", NULL, body, first);
    for (int i = 0; i < 200; i++)
        accept1(&h, "u", NULL, body, NULL);
    for (int i = 0; i < 5; i++)
        accept1(&h, "u", "k", "{\"keep\":true}", keepers[i]);
    atomic_fetch_add(&fake_now, 1000);
    /* deliver or kill all but the 5 keepers */
    for (int i = 0; i < 201; i++) {
        fb_qitem_t *it = next_item(&h);
        assert_non_null(it);
        assert_int_equal(report(&h, it->id, i % 3 ? FB_QO_DELIVERED : FB_QO_REJECTED, body),
                         FB_Q_OK);
        fb_qitem_free(it);
    }
    int64_t big = fb_queue_journal_bytes(h.q);
    assert_int_equal(fb_queue_maintain(h.q, h.w), 0);
    /* nothing expired yet: every result is still readable */
    assert_int_equal(lookup(&h, first, "u", NULL, NULL), FB_Q_DEAD);
    atomic_fetch_add(&fake_now, 60000);
    assert_int_equal(fb_queue_maintain(h.q, h.w), 0);
    int64_t small = fb_queue_journal_bytes(h.q);
    printf("  compaction: %lld -> %lld bytes\n", (long long)big, (long long)small);
    assert_true(small < big / 10);
    assert_int_equal(lookup(&h, first, "u", NULL, NULL), FB_Q_UNKNOWN); /* past keep */
    fb_qstats_t st;
    fb_queue_stats(h.q, &st);
    assert_int_equal(st.accepted, 206);
    assert_int_equal(st.delivered, 134);
    assert_int_equal(st.dead, 67);
    assert_int_equal(st.pending, 5);
    /* appends after the compaction land in the new file */
    char after[64];
    accept1(&h, "u", NULL, "{}", after);
    qh_close(&h);
    qh_open(&h, &c);
    fb_qstats_t st2;
    fb_queue_stats(h.q, &st2);
    assert_int_equal(st2.accepted, 207);
    assert_int_equal(st2.delivered, 134);
    assert_int_equal(st2.dead, 67);
    assert_int_equal(st2.pending, 6);
    for (int i = 0; i < 5; i++)
        assert_int_equal(lookup(&h, keepers[i], "u", NULL, NULL), FB_Q_PENDING);
    assert_int_equal(lookup(&h, after, "u", NULL, NULL), FB_Q_PENDING);
    qh_close(&h);
    rm_tree(tmpdir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic),
        cmocka_unit_test(test_schedule),
        cmocka_unit_test(test_torn_tail),
        cmocka_unit_test(test_kill9),
        cmocka_unit_test(test_exactly_once_threads),
        cmocka_unit_test(test_compaction),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
