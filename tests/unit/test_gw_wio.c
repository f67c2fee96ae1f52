/*
 * gw_wio_read_own (gateway/wio.c): a plain socket's bufferevent read by our
 * own callback on its read event instead of libevent's evbuffer_read (which
 * asks FIONREAD before every read and reads at most 4 KiB). Over a real
 * loopback TCP pair, the loop driven by the test (EVLOOP_NONBLOCK: one
 * readiness check per turn, nothing waits on a clock but the timeout case):
 * bytes and their order, reads larger than libevent's 4 KiB but bounded,
 * one read per wake-up, the read high-watermark's suspension and resume,
 * EOF, a reset, the read timeout, reading toggled off and on, and a
 * bufferevent freed inside its own read callback. The read mark is
 * gw_wio_set_read_mark's: libevent's own is set only while the input is at
 * it (its input-buffer callback would re-add the read event on every drain).
 * gw_wio_write_now: the queued bytes reach the peer before the flush, while
 * drained (or failed, for a peer that reset) still runs only from the flush.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "gateway/gw_wio.h"
#include "gateway/gw_worker.h"

typedef struct fx {
    struct event_base *base;
    struct bufferevent *bev;
    gw_wio_t io;          /* the bufferevent's (no worker: never direct) */
    size_t mark;          /* gw_wio_set_read_mark's, when set by the test */
    size_t lib_high_max;  /* libevent's read mark, the most a callback saw below ours */
    int lib_high_at_mark; /* callbacks that found the input at ours and libevent's set there */
    int peer;             /* the other end, blocking */
    int nreads;           /* read callbacks */
    size_t max_read;      /* the most one callback found new */
    size_t seen;          /* bytes taken out (drain mode) */
    bool drain;           /* the read callback empties the input */
    bool free_in_cb;      /* the read callback frees the bufferevent */
    size_t keep;          /* keep mode: the callback leaves this many bytes */
    size_t len_before;    /* keep mode: the input's length after the last callback */
    size_t first_read;    /* keep mode: the first callback's input length */
    short what;           /* the event callback's flags */
    unsigned char *data;  /* drain mode: the bytes, in order */
    size_t data_cap;
} fx_t;

static void tcp_pair(int fds[2])
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    assert_true(l >= 0);
    assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(l, 1), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&a, &len), 0);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(c, (struct sockaddr *)&a, sizeof(a)), 0);
    int s = accept(l, NULL, NULL);
    assert_true(s >= 0);
    close(l);
    fds[0] = s;
    fds[1] = c;
}

static void fx_readcb(struct bufferevent *bev, void *arg)
{
    fx_t *f = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t n = evbuffer_get_length(in);
    f->nreads++;
    if (f->mark) {
        size_t lo = 0, hi = 0;
        bufferevent_getwatermark(bev, EV_READ, &lo, &hi);
        if (n >= f->mark)
            f->lib_high_at_mark += hi == f->mark;
        else if (hi > f->lib_high_max)
            f->lib_high_max = hi;
    }
    if (f->free_in_cb) {
        gw_wio_fini(&f->io); /* as the gateway does before every free */
        bufferevent_free(bev);
        f->bev = NULL;
        return;
    }
    if (f->keep) {
        /* what this read added; the largest after the first in max_read */
        if (f->nreads == 1)
            f->first_read = n;
        else if (n - f->len_before > f->max_read)
            f->max_read = n - f->len_before;
        if (n > f->keep) {
            f->seen += n - f->keep;
            evbuffer_drain(in, n - f->keep);
        }
        f->len_before = evbuffer_get_length(in);
        return;
    }
    if (!f->drain)
        return;
    if (n > f->max_read)
        f->max_read = n;
    if (f->data && f->seen + n <= f->data_cap)
        evbuffer_copyout(in, f->data + f->seen, n);
    f->seen += n;
    evbuffer_drain(in, n);
}

static void fx_eventcb(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    fx_t *f = arg;
    f->what = what;
}

static int fx_setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));
    int fds[2];
    tcp_pair(fds);
    f->base = event_base_new();
    assert_non_null(f->base);
    evutil_make_socket_nonblocking(fds[0]);
    f->bev = bufferevent_socket_new(f->base, fds[0], BEV_OPT_CLOSE_ON_FREE);
    assert_non_null(f->bev);
    f->peer = fds[1];
    bufferevent_setcb(f->bev, fx_readcb, NULL, fx_eventcb, f);
    bufferevent_enable(f->bev, EV_READ);
    gw_wio_init(&f->io, NULL, f->bev, false, NULL, NULL, f);
    assert_int_equal(gw_wio_read_own(&f->io), 0);
    *state = f;
    return 0;
}

static int fx_teardown(void **state)
{
    fx_t *f = *state;
    if (f->bev) {
        gw_wio_fini(&f->io);
        bufferevent_free(f->bev);
    }
    if (f->peer >= 0)
        close(f->peer);
    event_base_free(f->base);
    free(f->data);
    free(f);
    return 0;
}

static void peer_send(fx_t *f, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t k = send(f->peer, c, n, 0);
        assert_true(k > 0);
        c += k;
        n -= (size_t)k;
    }
}

/* One loop turn that does not block. */
static void turn(fx_t *f)
{
    event_base_loop(f->base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
}

/* Turns until the callbacks took `want` bytes, at most `max` turns. */
static int turns_until(fx_t *f, size_t want, int max)
{
    int n = 0;
    while (f->seen < want && n < max) {
        turn(f);
        n++;
    }
    return n;
}

static void test_bytes_then_eof(void **state)
{
    fx_t *f = *state;
    f->drain = true;
    f->data = malloc(64);
    f->data_cap = 64;
    peer_send(f, "hello, ", 7);
    turns_until(f, 7, 1000);
    peer_send(f, "world", 5);
    turns_until(f, 12, 1000);
    assert_int_equal(f->seen, 12);
    assert_memory_equal(f->data, "hello, world", 12);
    assert_int_equal(f->what, 0);
    shutdown(f->peer, SHUT_WR);
    for (int i = 0; i < 1000 && !f->what; i++)
        turn(f);
    assert_int_equal(f->what, BEV_EVENT_EOF | BEV_EVENT_READING);
    /* as libevent does: reading is off after EOF */
    assert_int_equal(bufferevent_get_enabled(f->bev) & EV_READ, 0);
}

/* Reads of up to 16 KiB (not libevent's 4 KiB; one past 960 bytes is
 * added in two parts), one per wake-up, bytes in order. */
static void test_read_size(void **state)
{
    fx_t *f = *state;
    enum { N = 256 * 1024 };
    unsigned char *src = malloc(N);
    for (size_t i = 0; i < N; i++)
        src[i] = (unsigned char)(i * 7 + i / 251);
    f->drain = true;
    f->data = malloc(N);
    f->data_cap = N;
    /* the peer writes in the background of the loop: a child would be
     * overkill, so write what the socket takes, then turn, and repeat */
    int fl = fcntl(f->peer, F_GETFL);
    fcntl(f->peer, F_SETFL, fl | O_NONBLOCK);
    size_t sent = 0;
    int turns = 0;
    while (f->seen < N && turns < 100000) {
        if (sent < N) {
            ssize_t k = send(f->peer, src + sent, N - sent, 0);
            if (k > 0)
                sent += (size_t)k;
            else
                assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
        }
        int before = f->nreads;
        turn(f);
        /* level-triggered, one read per wake-up: at most one callback */
        assert_true(f->nreads - before <= 1);
        turns++;
    }
    assert_int_equal(f->seen, N);
    assert_memory_equal(f->data, src, N);
    assert_true(f->max_read > 4096);       /* more than evbuffer_read's cap */
    assert_true(f->max_read <= 16 * 1024); /* one read, bounded */
    /* 256 KiB in reads of ~16 KiB: at least 16 of them, far fewer than the
     * 64 that 4 KiB reads would take at best */
    assert_true(f->nreads >= N / (16 * 1024));
    free(src);
}

/* A read takes no more than the read high-watermark leaves: the first
 * one fills the input to the mark (libevent's would stop at 4 KiB), and
 * with the callback keeping KEEP bytes every later one takes exactly
 * HIGH - KEEP. (A callback that took nothing would be called again and
 * again: libevent 2.1.12 re-runs the read callback, deferred, while the
 * input is at its mark and reading is enabled.) */
static void test_high_watermark(void **state)
{
    fx_t *f = *state;
    enum { HIGH = 10000, KEEP = 9000, N = 50000 };
    char *src = calloc(1, N);
    f->keep = KEEP;
    f->mark = HIGH;
    gw_wio_set_read_mark(&f->io, HIGH);
    size_t lo = 0, hi = 1;
    bufferevent_getwatermark(f->bev, EV_READ, &lo, &hi);
    assert_int_equal(hi, 0); /* below ours: libevent's is off */
    peer_send(f, src, N);
    for (int i = 0; i < 1000 && f->seen + KEEP < N; i++)
        turn(f);
    assert_int_equal(f->first_read, HIGH);
    assert_int_equal(f->max_read, HIGH - KEEP); /* the largest read after the first */
    assert_int_equal(f->seen + KEEP, N);
    assert_int_equal(f->nreads, 1 + (N - HIGH) / (HIGH - KEEP));
    /* every callback found the input at the mark, libevent's set there */
    assert_int_equal(f->lib_high_at_mark, f->nreads);
    free(src);
}

/* Below the mark libevent's own is off (its input-buffer callback, which
 * re-adds the read event on every drain, does nothing), while every read
 * is still bounded by ours; a mark of 0 takes it away. */
static void test_mark_off_below(void **state)
{
    fx_t *f = *state;
    enum { HIGH = 10000, N = 60000, PIECE = 3000 };
    char *src = calloc(1, N);
    f->mark = HIGH;
    gw_wio_set_read_mark(&f->io, HIGH);
    f->drain = true;
    for (size_t off = 0; off < N; off += PIECE) {
        peer_send(f, src + off, PIECE);
        turns_until(f, off + PIECE, 1000);
    }
    assert_int_equal(f->seen, N);
    assert_true(f->nreads >= N / HIGH);
    assert_true(f->max_read <= HIGH);
    assert_int_equal(f->lib_high_max, 0);
    gw_wio_set_read_mark(&f->io, 0);
    size_t lo = 0, hi = 1;
    bufferevent_getwatermark(f->bev, EV_READ, &lo, &hi);
    assert_int_equal(hi, 0);
    free(src);
}

/* A reset is an error with BEV_EVENT_READING, reading off. */
static void test_reset(void **state)
{
    fx_t *f = *state;
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(f->peer, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(f->peer);
    f->peer = -1;
    for (int i = 0; i < 1000 && !f->what; i++)
        turn(f);
    assert_int_equal(f->what, BEV_EVENT_ERROR | BEV_EVENT_READING);
    assert_int_equal(bufferevent_get_enabled(f->bev) & EV_READ, 0);
    assert_int_equal(EVUTIL_SOCKET_ERROR(), ECONNRESET);
}

/* The bufferevent's read timeout still applies (its own timer). */
static void test_read_timeout(void **state)
{
    fx_t *f = *state;
    struct timeval tv = {0, 2000};
    bufferevent_set_timeouts(f->bev, &tv, NULL);
    /* blocks until the first event: the 2 ms timeout, nothing is sent */
    event_base_loop(f->base, EVLOOP_ONCE);
    assert_int_equal(f->what, BEV_EVENT_TIMEOUT | BEV_EVENT_READING);
    assert_int_equal(bufferevent_get_enabled(f->bev) & EV_READ, 0);
}

/* Disabled: bytes stay in the socket; enabled again: they are read, by our
 * callback still (a read above 4 KiB). Installing on an enabled
 * bufferevent keeps it enabled. */
static void test_disable_enable(void **state)
{
    fx_t *f = *state;
    enum { N = 12000 };
    char *src = calloc(1, N);
    f->drain = true;
    bufferevent_disable(f->bev, EV_READ);
    peer_send(f, src, N);
    for (int i = 0; i < 50; i++)
        turn(f);
    assert_int_equal(f->nreads, 0);
    assert_int_equal(gw_wio_read_own(&f->io), 0); /* again, while disabled */
    bufferevent_enable(f->bev, EV_READ);
    assert_int_equal(gw_wio_read_own(&f->io), 0); /* and while enabled */
    assert_true(bufferevent_get_enabled(f->bev) & EV_READ);
    turns_until(f, N, 1000);
    assert_int_equal(f->seen, N);
    assert_true(f->max_read > 4096);
    free(src);
}

/* Freed inside its read callback: nothing touches it after the callback,
 * and libevent's finalizer frees it only once our event callback returned
 * (ASan would see a use after free otherwise). */
static void test_free_in_callback(void **state)
{
    fx_t *f = *state;
    f->free_in_cb = true;
    peer_send(f, "x", 1);
    for (int i = 0; i < 1000 && f->bev; i++)
        turn(f);
    assert_null(f->bev);
    assert_int_equal(f->nreads, 1);
    turn(f); /* the deferred free runs */
}

static void test_no_socket(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    struct bufferevent *bev = bufferevent_socket_new(base, -1, 0);
    gw_wio_t io;
    gw_wio_init(&io, NULL, bev, false, NULL, NULL, NULL);
    assert_int_equal(gw_wio_read_own(&io), -1);
    gw_wio_fini(&io);
    bufferevent_free(bev);
    event_base_free(base);
}

/* ---- gw_wio_write_now ------------------------------------------------------ */

typedef struct wn {
    int drained, failed;
    short what;
} wn_t;

static void wn_drained(void *arg)
{
    ((wn_t *)arg)->drained++;
}

static void wn_failed(void *arg, short what)
{
    ((wn_t *)arg)->failed++;
    ((wn_t *)arg)->what = what;
}

/* A worker with just what the flush needs: its base, list and event. */
static gw_worker_t *wn_worker(struct event_base *base)
{
    gw_worker_t *w = calloc(1, sizeof(*w));
    assert_non_null(w);
    w->base = base;
    TAILQ_INIT(&w->flushq);
    w->flush_ev = event_new(base, -1, 0, gw_wio_flush_cb, w);
    assert_non_null(w->flush_ev);
    return w;
}

/* A test's io and the worker wn_worker made, freed. */
static void wn_end(gw_wio_t *io, gw_worker_t *w)
{
    gw_wio_fini(io);
    event_free(w->flush_ev);
    free(w);
}

static void test_write_now(void **state)
{
    fx_t *f = *state;
    gw_worker_t *w = wn_worker(f->base);
    gw_wio_t io;
    wn_t n = {0};
    char got[16];
    gw_wio_init(&io, w, f->bev, true, wn_drained, wn_failed, &n);
    evbuffer_add(bufferevent_get_output(f->bev), "request", 7);
    gw_wio_added(&io);
    assert_true(io.queued);
    assert_int_equal(recv(f->peer, got, sizeof(got), MSG_DONTWAIT), -1); /* not yet */
    gw_wio_write_now(&io);
    assert_int_equal(recv(f->peer, got, sizeof(got), MSG_DONTWAIT), 7); /* before the flush */
    assert_memory_equal(got, "request", 7);
    assert_int_equal(n.drained, 0); /* the callbacks wait for the flush */
    assert_int_equal(evbuffer_get_length(bufferevent_get_output(f->bev)), 0);
    turn(f);
    assert_int_equal(n.drained, 1);
    assert_int_equal(n.failed, 0);
    assert_false(io.queued);
    /* bytes added after the early write go out with the flush */
    evbuffer_add(bufferevent_get_output(f->bev), "ab", 2);
    gw_wio_added(&io);
    gw_wio_write_now(&io);
    evbuffer_add(bufferevent_get_output(f->bev), "cd", 2);
    gw_wio_added(&io);
    turn(f);
    assert_int_equal(recv(f->peer, got, sizeof(got), MSG_DONTWAIT), 4);
    assert_memory_equal(got, "abcd", 4);
    assert_int_equal(n.drained, 2);
    wn_end(&io, w);
}

/* The peer reset: the early write fails, failed runs from the flush. */
static void test_write_now_reset(void **state)
{
    fx_t *f = *state;
    gw_worker_t *w = wn_worker(f->base);
    gw_wio_t io;
    wn_t n = {0};
    struct linger lg = {1, 0};
    signal(SIGPIPE, SIG_IGN);
    assert_int_equal(setsockopt(f->peer, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    close(f->peer); /* RST */
    f->peer = -1;
    gw_wio_init(&io, w, f->bev, true, wn_drained, wn_failed, &n);
    evbuffer_add(bufferevent_get_output(f->bev), "request", 7);
    gw_wio_added(&io);
    gw_wio_write_now(&io);
    assert_int_equal(n.failed, 0);
    assert_int_not_equal(io.werr, 0);
    turn(f);
    assert_int_equal(n.failed, 1);
    assert_true(n.what & BEV_EVENT_ERROR);
    assert_true(n.what & BEV_EVENT_WRITING);
    assert_int_equal(n.drained, 0);
    wn_end(&io, w);
}

/* Connections queued for the flush: the first one on an empty list
 * activates the flush event, the others ride on it, all are written in the
 * same turn; one queued from inside the flush (a drained callback writing
 * to another connection) too. */
typedef struct two {
    wn_t n;
    gw_wio_t *write_to; /* drained adds "more" here, once */
} two_t;

/* A writer: its bytes, then gw_wio_added (the output has no callback). */
static void out_add(gw_wio_t *io, const char *s, size_t n)
{
    evbuffer_add(bufferevent_get_output(io->bev), s, n);
    gw_wio_added(io);
}

static void two_drained(void *arg)
{
    two_t *t = arg;
    t->n.drained++;
    if (t->write_to) {
        out_add(t->write_to, "more", 4);
        t->write_to = NULL;
    }
}

static void test_flush_two(void **state)
{
    fx_t *f = *state;
    gw_worker_t *w = wn_worker(f->base);
    int fds[2];
    tcp_pair(fds);
    evutil_make_socket_nonblocking(fds[0]);
    struct bufferevent *bev2 = bufferevent_socket_new(f->base, fds[0], BEV_OPT_CLOSE_ON_FREE);
    assert_non_null(bev2);
    gw_wio_t a, b;
    two_t ta = {0}, tb = {0};
    char got[16];
    gw_wio_init(&a, w, f->bev, true, two_drained, wn_failed, &ta);
    gw_wio_init(&b, w, bev2, true, two_drained, wn_failed, &tb);
    out_add(&a, "one", 3);
    out_add(&b, "two", 3);
    assert_true(a.queued);
    assert_true(b.queued);
    turn(f);
    assert_int_equal(ta.n.drained, 1);
    assert_int_equal(tb.n.drained, 1);
    assert_int_equal(recv(f->peer, got, sizeof(got), MSG_DONTWAIT), 3);
    assert_memory_equal(got, "one", 3);
    assert_int_equal(recv(fds[1], got, sizeof(got), MSG_DONTWAIT), 3);
    assert_memory_equal(got, "two", 3);
    /* the second alone, on the emptied list */
    out_add(&b, "2", 1);
    turn(f);
    assert_int_equal(tb.n.drained, 2);
    assert_int_equal(recv(fds[1], got, sizeof(got), MSG_DONTWAIT), 1);
    /* queued while the flush runs: written in the same turn */
    ta.write_to = &b;
    out_add(&a, "x", 1);
    turn(f);
    assert_int_equal(ta.n.drained, 2);
    assert_int_equal(tb.n.drained, 3);
    assert_int_equal(recv(fds[1], got, sizeof(got), MSG_DONTWAIT), 4);
    assert_memory_equal(got, "more", 4);
    assert_int_equal(ta.n.failed + tb.n.failed, 0);
    gw_wio_fini(&a);
    gw_wio_fini(&b);
    bufferevent_free(bev2);
    close(fds[1]);
    event_free(w->flush_ev);
    free(w);
}

/* The owner's write callback, as conn.c's: libevent wrote (EV_WRITE armed). */
static gw_wio_t *mc_io;
static int mc_written;

static void mc_writecb(struct bufferevent *bev, void *arg)
{
    (void)bev;
    (void)arg;
    mc_written++;
    gw_wio_written(mc_io);
}

/* n bytes whose value changes with the place: a lost, misplaced or
 * repeated piece shows. */
static unsigned char *pattern(size_t n, unsigned mul, unsigned div)
{
    unsigned char *p = malloc(n);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * mul + i / div);
    return p;
}

/* io on f's bufferevent, with conn.c's write callback (mc_writecb). */
static void mc_init(fx_t *f, gw_worker_t *w, gw_wio_t *io, wn_t *n)
{
    gw_wio_init(io, w, f->bev, true, wn_drained, wn_failed, n);
    mc_io = io;
    mc_written = 0;
    bufferevent_setcb(f->bev, fx_readcb, mc_writecb, fx_eventcb, f);
}

/* Turns the loop, the peer reading into got (room bytes), until `want`
 * bytes arrived and libevent's write is disarmed (bounded); the bytes read. */
static size_t mc_peer_read(fx_t *f, gw_wio_t *io, unsigned char *got, size_t want, size_t room)
{
    size_t have = 0;
    for (int i = 0; i < 100000 && (have < want || io->armed); i++) {
        turn(f);
        ssize_t k = recv(f->peer, got + have, room - have, MSG_DONTWAIT);
        if (k > 0)
            have += (size_t)k;
    }
    return have;
}

/* The direct write (gw_wio_send: one sendmsg of at most 128 chains) with
 * more chains than one call takes and more bytes than the kernel holds:
 * the peer, reading only after the first write, gets every byte in order
 * (what a call sent is drained, no more, no less), the rest goes out by
 * the flush and then libevent's EV_WRITE, which is disarmed once the
 * output is empty (the connection writes directly again). */
static void test_write_many_chains(void **state)
{
    fx_t *f = *state;
    gw_worker_t *w = wn_worker(f->base);
    gw_wio_t io;
    wn_t n = {0};
    enum { PIECES = 300, PIECE = 16, BIG = 2 << 20, TOTAL = PIECES * PIECE + BIG };
    unsigned char *src = pattern(TOTAL, 7, 251), *got = malloc(TOTAL);
    assert_non_null(got);
    mc_init(f, w, &io, &n);
    struct evbuffer *out = bufferevent_get_output(f->bev);
    for (size_t i = 0; i < PIECES; i++) /* a chain each */
        evbuffer_add_reference(out, src + i * PIECE, PIECE, NULL, NULL);
    evbuffer_add_reference(out, src + PIECES * PIECE, BIG, NULL, NULL);
    gw_wio_added(&io);
    gw_wio_write_now(&io);
    assert_true(evbuffer_get_length(out) > 0); /* 128 chains at most */
    assert_int_equal(mc_peer_read(f, &io, got, TOTAL, TOTAL), TOTAL);
    assert_memory_equal(got, src, TOTAL);
    assert_true(mc_written >= 1); /* the kernel filled: libevent finished */
    assert_false(io.armed);
    assert_int_equal(n.failed, 0);
    assert_int_equal(evbuffer_get_length(out), 0);
    wn_end(&io, w);
    free(src);
    free(got);
}

/* No output callback (wio.c): bytes a writer adds while libevent writes
 * (armed) go out with its writes, nothing queued for them; once libevent
 * has emptied the output and disarmed, the next writer's bytes are written
 * directly again in the turn, exactly once (the output's front is thawed
 * again after libevent's write froze it: a drain that failed would leave
 * them to be sent twice), and the drained callback runs. */
static void test_write_while_armed(void **state)
{
    fx_t *f = *state;
    gw_worker_t *w = wn_worker(f->base);
    gw_wio_t io;
    wn_t n = {0};
    enum { BIG = 4 << 20, MID = 64 << 10, TOTAL = BIG + MID };
    unsigned char *src = pattern(TOTAL, 13, 509), *got = malloc(TOTAL + 16);
    char tail[16];
    assert_non_null(got);
    mc_init(f, w, &io, &n);
    struct evbuffer *out = bufferevent_get_output(f->bev);
    evbuffer_add_reference(out, src, BIG, NULL, NULL);
    gw_wio_added(&io);
    assert_true(io.queued);
    turn(f); /* the flush: more than the kernel takes */
    assert_true(io.armed);
    assert_int_equal(n.drained, 0);
    evbuffer_add(out, src + BIG, MID);
    gw_wio_added(&io);
    assert_false(io.queued); /* libevent's to write */
    assert_int_equal(mc_peer_read(f, &io, got, TOTAL, TOTAL + 16), TOTAL);
    assert_memory_equal(got, src, TOTAL);
    assert_true(mc_written >= 1);
    assert_false(io.armed);
    int drained = n.drained;
    out_add(&io, "tail", 4);
    assert_true(io.queued); /* direct again */
    turn(f);
    assert_int_equal(evbuffer_get_length(out), 0);
    assert_int_equal(recv(f->peer, tail, sizeof(tail), MSG_DONTWAIT), 4);
    assert_memory_equal(tail, "tail", 4);
    assert_int_equal(n.drained, drained + 1);
    out_add(&io, "more", 4);
    turn(f);
    assert_int_equal(recv(f->peer, tail, sizeof(tail), MSG_DONTWAIT), 4);
    assert_memory_equal(tail, "more", 4);
    assert_int_equal(n.failed, 0);
    wn_end(&io, w);
    free(src);
    free(got);
}

/* A writer that does not call gw_wio_added leaves its bytes in the output
 * (no callback queues them): nothing is written in the turn; the call
 * queues them. What every writer of the gateway must do (wio.c). */
static void test_added_queues(void **state)
{
    fx_t *f = *state;
    gw_worker_t *w = wn_worker(f->base);
    gw_wio_t io;
    wn_t n = {0};
    char got[16];
    gw_wio_init(&io, w, f->bev, true, wn_drained, wn_failed, &n);
    evbuffer_add(bufferevent_get_output(f->bev), "answer", 6);
    assert_false(io.queued);
    turn(f);
    assert_int_equal(recv(f->peer, got, sizeof(got), MSG_DONTWAIT), -1);
    assert_int_equal(n.drained, 0);
    gw_wio_added(&io);
    assert_true(io.queued);
    gw_wio_added(&io); /* once on the list */
    turn(f);
    assert_int_equal(recv(f->peer, got, sizeof(got), MSG_DONTWAIT), 6);
    assert_memory_equal(got, "answer", 6);
    assert_int_equal(n.drained, 1);
    wn_end(&io, w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bytes_then_eof, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_mark_off_below, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_read_size, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_high_watermark, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_reset, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_read_timeout, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_disable_enable, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_free_in_callback, fx_setup, fx_teardown),
        cmocka_unit_test(test_no_socket),
        cmocka_unit_test_setup_teardown(test_write_now, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_write_now_reset, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_flush_two, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_write_many_chains, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_write_while_armed, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_added_queues, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
