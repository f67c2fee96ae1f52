/*
 * wio.c — direct writes for plain-socket bufferevents.
 *
 * A bufferevent arms EV_WRITE (an epoll_ctl) whenever bytes are added to its
 * output and disarms it (another) once they are written, and the write
 * waits for the next loop turn. For a proxy that is four extra syscalls and
 * a loop turn per request. Here every writer of the output calls
 * gw_wio_added after its adds, which puts the connection on its worker's
 * flush list; the flush runs once the current callbacks are done (an
 * activated event, no syscall) and writes with one sendmsg (gw_wio_send).
 * Only when the kernel does not take everything is EV_WRITE armed, and
 * libevent finishes the job (with the send timeout running); when the
 * buffer is empty again EV_WRITE is disarmed.
 *
 * No output callback: a direct output has no evbuffer callback at all.
 * Every evbuffer_add, evbuffer_add_buffer and evbuffer_drain walks the
 * buffer's callback list and calls each entry (~70 instructions a call
 * with two entries; five calls a plain request) and at thousands of
 * connections touches their cold lines. Ours (which queued the flush) is
 * replaced by the writers' gw_wio_added: conn.c's HTTP/1 output and 100
 * Continue, h2.c's frames, the upstream request of proxy.c, resend.c and
 * hook_cache.c. The bufferevent's own (bufferevent_socket's outbuf
 * callback) only adds the write event when bytes are added while EV_WRITE
 * is enabled and not pending; a direct writer enables EV_WRITE only while
 * armed, with the event pending until the output is empty, when its write
 * callback disarms it (gw_wio_written) before anything else runs. So
 * gw_wio_set_direct removes it too (evbuffer_setcb(NULL): the only call
 * that can, the entry being libevent's), and a direct output's adds and
 * drains find an empty list. A connection still connecting (not direct)
 * keeps it: libevent writes what was queued once connected.
 *
 * Freezes: a bufferevent freezes the front of its output and the end of
 * its input (only it drains the one and fills the other), and its own
 * write and read thaw them around each call. The reads of our read event
 * and the direct writes are the only ones there are, so the input's end is
 * thawed once when we take the read event, and the output's front whenever
 * the connection is direct and not armed (libevent's write, while armed,
 * freezes it again as it returns): no freeze and thaw per read and write.
 *
 * TLS bufferevents cannot be written around (the SSL object and its record
 * state belong to libevent's bufferevent), so they "kick" instead: the same
 * flush list runs the bufferevent's own write event at once (event_active),
 * and SSL_write happens in this loop turn rather than after an epoll_wait
 * has reported the socket writable. With the event base's epoll changelist
 * (worker.c) the EV_WRITE that libevent arms on new output and disarms once
 * it is written cancel out: no epoll_ctl either. Measured on h2 over TLS,
 * one stream at a time: 11 -> 8 syscalls per request.
 *
 * Connections still connecting keep the ordinary bufferevent behaviour
 * (direct = false, kick = false).
 *
 * Reads (gw_wio_read_own): libevent 2.1's evbuffer_read asks the kernel
 * how much is waiting (ioctl FIONREAD) before every read and then reads at
 * most 4 KiB (EVBUFFER_MAX_READ). For a proxy that is one more syscall per
 * read on both sockets of every request: 4.8 % of a plain request's CPU
 * (bench/RESULTS.md, "Plain request CPU"). A plain socket's bufferevent so
 * gets our read callback on its own read event: one read into the
 * thread's scratch, copied to the end of the input buffer (a small read
 * in a chain of at most 1 KiB, gw_wio_read_once), up to GW_WIO_READ bytes
 * or what the read high-watermark leaves, once per wake-up (level-
 * triggered, as libevent reads). Only the event's callback changes, so
 * enable/disable, the high-watermark suspension (the read mark below), the
 * read timeout and the deferred free work as before;
 * EOF, errors and the timeout end as in libevent's bufferevent_readcb:
 * reading disabled, then the event callback with BEV_EVENT_READING. Bytes
 * read go to the bufferevent's read callback directly (its low-watermark
 * is 0 and it defers nothing), not through bufferevent_trigger.
 *
 * The read mark (gw_wio_set_read_mark): libevent keeps a read high-
 * watermark as a callback on the input buffer that runs on every add and
 * drain and, below the mark, "unsuspends" reading: bufferevent_enable's
 * event_add (a timer re-queued) each time, ~6 times a request (the head's
 * and body's drains, our commits; ~1,000 instructions of a ~33,000 plain
 * request). With our read event the mark is kept in gw_wio_t: each read
 * takes at most what it leaves, and libevent's mark is set only when the
 * input reaches it (libevent then suspends reading, and resumes it once
 * the input drains below) and cleared by the next read below it. It is
 * set after the reader is chosen: libevent's mark, once set, leaves its
 * callback entry on the input buffer for good, walked on every add and
 * drain even while disabled.
 *
 * Client TLS (gw_wio_tls_own): libevent's bufferevent_openssl layers its
 * own evbuffers, 4 KiB reads, deferred callbacks and a BIO round trip over
 * SSL_read/SSL_write. A client TLS connection is instead a plain-socket
 * bufferevent whose read and write events run our callbacks: the read
 * event drives the handshake, then SSL_reads into the thread's scratch,
 * copied to the end of the input buffer (a small request takes a 1 KiB
 * chain, not a 16 KiB block), until OpenSSL holds nothing more (read-ahead on:
 * one read(2) per wake-up takes a whole record, not a 5-byte header and
 * then the rest). Everything OpenSSL has decrypted is always moved to the
 * input buffer before the callback returns (past the read high-watermark
 * by at most one OpenSSL buffer), so no byte ever waits inside the SSL
 * object while the socket is quiet. Writes are the direct writes above
 * with SSL_write (a record of at most 16 KiB per call, pulled up from the
 * output buffer) in place of writev; when the kernel is full EV_WRITE is
 * armed and our write event finishes, with the send timeout running. An
 * SSL_read that must write (a TLS 1.3 ticket with the kernel full) arms
 * EV_WRITE and reads again once it is writable. close_notify and an EOF
 * without it (dirty shutdown, as before) are EOF; any other TLS error is
 * an error; both reach the event callback as for a plain socket.
 */
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <event2/buffer.h>
#include <event2/buffer_compat.h> /* evbuffer_setcb: see the top */
#include <event2/bufferevent.h>
#include <event2/bufferevent_struct.h>
#include <openssl/err.h>

#include "common/sl.h"
#include "gateway/gw_types.h"
#include "gateway/gw_wio.h"
#include "gateway/gw_worker.h"

/* Bytes one read may take: 16 KiB with libevent's chain header included,
 * so a fresh chain for it is a 16 KiB block, not the next power of two. */
#define GW_WIO_READ (16 * 1024 - 128)

/* The thread's read space: every plain read and every SSL_read (copied
 * into the input buffer after). */
static _Thread_local char gw_wio_scratch[GW_WIO_READ];

/* Plaintext bytes one SSL_write takes: one TLS record. */
#define GW_WIO_RECORD (16 * 1024)

void gw_wio_queue(gw_wio_t *io)
{
    /* A list that holds something has its flush active or running (the
     * flush empties it before it returns): only the first one activates. */
    bool first = TAILQ_EMPTY(&io->w->flushq);
    io->queued = true;
    TAILQ_INSERT_TAIL(&io->w->flushq, io, link);
    if (first)
        event_active(io->w->flush_ev, EV_TIMEOUT, 0);
}

/* ---- the read mark (see the top) ---------------------------------------------- */

/* libevent's mark on (suspending reading) only while the input, len
 * bytes, is at ours. io->lev_high is what we last set libevent's to, so
 * no read asks libevent for it (bufferevent_getwatermark). */
static void gw_wio_mark_sync_len(gw_wio_t *io, size_t len)
{
    struct bufferevent *bev = io->bev;
    if (io->read_high && len >= io->read_high) {
        bufferevent_setwatermark(bev, EV_READ, 0, io->read_high); /* suspends */
        io->lev_high = io->read_high;
    } else if (io->lev_high) {
        bufferevent_setwatermark(bev, EV_READ, 0, 0); /* its callback off */
        io->lev_high = 0;
    }
}

static void gw_wio_mark_sync(gw_wio_t *io)
{
    gw_wio_mark_sync_len(io, evbuffer_get_length(bufferevent_get_input(io->bev)));
}

/* What the next read may take into the input, len bytes (SIZE_MAX: no
 * mark); 0 at the mark, with reading suspended. */
static size_t gw_wio_read_room(gw_wio_t *io, size_t len)
{
    if (!io->read_high)
        return SIZE_MAX;
    if (len >= io->read_high || io->lev_high) /* at the mark, or just below it again */
        gw_wio_mark_sync_len(io, len);
    return len >= io->read_high ? 0 : io->read_high - len;
}

/* After a read, the input len bytes: at the mark, reading stops now (as
 * libevent's own mark would have stopped it in the commit). */
static void gw_wio_read_done(gw_wio_t *io, size_t len)
{
    if (io->read_high && len >= io->read_high)
        gw_wio_mark_sync_len(io, len);
}

void gw_wio_set_read_mark(gw_wio_t *io, size_t high)
{
    io->read_high = high;
    if (io->own_read) {
        gw_wio_mark_sync(io);
    } else {
        bufferevent_setwatermark(io->bev, EV_READ, 0, high);
        io->lev_high = high;
    }
}

void gw_wio_init(gw_wio_t *io, gw_worker_t *w, struct bufferevent *bev, bool direct,
                 void (*drained)(void *), void (*failed)(void *, short), void *owner)
{
    memset(io, 0, sizeof(*io));
    io->w = w;
    io->bev = bev;
    io->drained = drained;
    io->failed = failed;
    io->owner = owner;
    gw_wio_set_direct(io, direct);
}

void gw_wio_set_direct(gw_wio_t *io, bool direct)
{
    io->direct = direct;
    if (!direct)
        return;
    struct evbuffer *out = bufferevent_get_output(io->bev);
    evbuffer_setcb(out, NULL, NULL); /* libevent's outbuf callback (see the top) */
    if (evbuffer_get_length(out) == 0) {
        bufferevent_disable(io->bev, EV_WRITE);
        io->armed = false;
        evbuffer_unfreeze(out, 1); /* we drain it (see the top) */
    } else {
        io->armed = true; /* libevent is writing; back to direct when drained */
        bufferevent_enable(io->bev, EV_WRITE);
    }
}

void gw_wio_set_kick(gw_wio_t *io, bool kick)
{
    io->kick = kick;
}

static void gw_wio_tls_gone(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
}

void gw_wio_fini(gw_wio_t *io)
{
    if (io->queued) {
        TAILQ_REMOVE(&io->w->flushq, io, link);
        io->queued = false;
    }
    if (io->ssl && io->bev) {
        /* libevent finalizes a freed bufferevent's events with their
         * argument taken as the bufferevent: give it back (deleted first,
         * as event_assign wants; a running callback returns on !io->ssl) */
        struct bufferevent *bev = io->bev;
        evutil_socket_t fd = bufferevent_getfd(bev);
        struct event_base *base = bufferevent_get_base(bev);
        bufferevent_disable(bev, EV_READ | EV_WRITE);
        event_del(&bev->ev_read);
        event_del(&bev->ev_write);
        event_assign(&bev->ev_read, base, fd, EV_READ | EV_PERSIST | EV_FINALIZE, gw_wio_tls_gone,
                     bev);
        event_assign(&bev->ev_write, base, fd, EV_WRITE | EV_PERSIST | EV_FINALIZE, gw_wio_tls_gone,
                     bev);
    } else if (io->own_read && io->bev) {
        /* the same for our plain read event (its argument is io) */
        struct bufferevent *bev = io->bev;
        bufferevent_disable(bev, EV_READ);
        event_del(&bev->ev_read);
        event_assign(&bev->ev_read, bufferevent_get_base(bev), bufferevent_getfd(bev),
                     EV_READ | EV_PERSIST | EV_FINALIZE, gw_wio_tls_gone, bev);
    }
    io->own_read = false;
    SSL_free(io->ssl); /* the socket is the bufferevent's to close */
    io->ssl = NULL;
    io->direct = false;
    io->kick = false;
    io->early = false;
    io->werr = 0;
}

/* libevent wrote (EV_WRITE was armed): once empty, direct again. */
void gw_wio_written(gw_wio_t *io)
{
    struct evbuffer *out = bufferevent_get_output(io->bev);
    if (io->direct && io->armed && evbuffer_get_length(out) == 0) {
        bufferevent_disable(io->bev, EV_WRITE);
        io->armed = false;
        evbuffer_unfreeze(out, 1); /* libevent's write froze it again */
    }
}

/* An SSL call failed with r: 0 to wait (for the socket to be readable,
 * or writable: EV_WRITE armed), else the event bits, *err set. */
static short gw_wio_tls_fail(gw_wio_t *io, int r, int *err)
{
    int e = SSL_get_error(io->ssl, r);
    *err = errno;
    switch (e) {
    case SSL_ERROR_WANT_READ:
        return 0;
    case SSL_ERROR_WANT_WRITE:
        io->rd_wants_wr = true;
        bufferevent_enable(io->bev, EV_WRITE);
        return 0;
    case SSL_ERROR_ZERO_RETURN: /* close_notify, or EOF (SSL_OP_IGNORE_UNEXPECTED_EOF) */
        return BEV_EVENT_EOF;
    case SSL_ERROR_SYSCALL:
        ERR_clear_error();
        return *err == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR;
    default:
        ERR_clear_error();
        *err = EPROTO;
        return BEV_EVENT_ERROR;
    }
}

/* SSL_write the output, a record at a time: bytes written (> 0), or -1
 * with errno EAGAIN (the kernel is full) or another error. */
static int gw_wio_tls_push(gw_wio_t *io)
{
    struct evbuffer *out = bufferevent_get_output(io->bev);
    size_t len;
    int total = 0;
    while ((len = evbuffer_get_length(out)) > 0) {
        size_t n = SL_MIN(len, (size_t)GW_WIO_RECORD);
        /* contiguous for SSL_write; a copy only when frames straddle
         * chains (the same bytes and length again after WANT_WRITE:
         * SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER) */
        unsigned char *p = evbuffer_pullup(out, (ev_ssize_t)n);
        if (!p) {
            errno = ENOMEM;
            total = -1;
            break;
        }
        int r = SSL_write(io->ssl, p, (int)n);
        if (r > 0) {
            evbuffer_drain(out, (size_t)r);
            total += r;
            continue;
        }
        int err = 0;
        short ev = gw_wio_tls_fail(io, r, &err);
        if (ev == 0 && io->rd_wants_wr) {
            io->rd_wants_wr = false; /* the write side waits: armed by the caller */
            err = EAGAIN;
        } else if (ev == 0) {
            err = EAGAIN; /* wants to read: the read event writes on */
        }
        errno = ev & BEV_EVENT_EOF ? EPIPE : err;
        if (total == 0 || ev)
            total = -1;
        break;
    }
    return total;
}

/* The read event of a TLS connection (gw_wio_tls_own). */
static void gw_wio_tls_readcb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    gw_wio_t *io = arg;
    struct bufferevent *bev = io->bev;
    struct evbuffer *in = bufferevent_get_input(bev);
    short ev = 0;
    int err = 0;
    size_t got = 0;
    if (!io->ssl)
        return;
    bufferevent_incref(bev);  /* the callbacks may free it: freed on our way out */
    if (what == EV_TIMEOUT) { /* only a bare timeout: with EV_READ a read came in time */
        ev = BEV_EVENT_TIMEOUT;
        goto done;
    }
    if (io->hs) {
        ERR_clear_error();
        int r = SSL_do_handshake(io->ssl);
        if (r != 1) {
            ev = gw_wio_tls_fail(io, r, &err);
            goto done;
        }
        io->hs = false;
        if (!io->queued && evbuffer_get_length(bufferevent_get_output(bev)) > 0)
            gw_wio_queue(io); /* output made while the handshake ran */
        if (!SSL_has_pending(io->ssl))
            goto done; /* the request comes with the next wake-up */
    }
    size_t len0 = evbuffer_get_length(in);
    if (gw_wio_read_room(io, len0) == 0)
        goto done; /* at the mark (OpenSSL holds nothing: see the top): suspended */
    for (;;) {
        /* Into the scratch, then copied: a request of a few hundred bytes
         * takes a 1 KiB chain (wio.c's kept ones), not a 16 KiB block
         * reserved for a record that may be that large. */
        int r = SSL_read(io->ssl, gw_wio_scratch, (int)sizeof(gw_wio_scratch));
        if (r <= 0) {
            ev = gw_wio_tls_fail(io, r, &err);
            break;
        }
        if (evbuffer_add(in, gw_wio_scratch, (size_t)r) != 0) {
            err = ENOMEM;
            ev = BEV_EVENT_ERROR;
            break;
        }
        got += (size_t)r;
        /* nothing buffered: the socket is next, at the next wake-up
         * (level-triggered), so no read(2) that only says EAGAIN */
        if (!SSL_has_pending(io->ssl))
            break;
    }
    if (got > 0)
        gw_wio_read_done(io, len0 + got);
done:
    /* io may be gone once a callback ran: only bev (referenced) after */
    if (got > 0)
        bufferevent_trigger(bev, EV_READ, 0); /* if the low watermark is met */
    if (ev) {
        bufferevent_disable(bev, EV_READ);
        errno = err; /* the event callback may ask for the socket's error */
        bufferevent_trigger_event(bev, BEV_EVENT_READING | ev, 0);
    }
    bufferevent_decref(bev);
}

/* The write event of a TLS connection: armed while the kernel is full (or
 * a read waits to write); writes on, the send timeout running. */
static void gw_wio_tls_writecb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    gw_wio_t *io = arg;
    struct bufferevent *bev = io->bev;
    struct evbuffer *out = bufferevent_get_output(bev);
    short ev = 0;
    int err = 0;
    if (!io->ssl)
        return;
    bufferevent_incref(bev);
    if (what == EV_TIMEOUT) {
        ev = BEV_EVENT_TIMEOUT;
        goto done;
    }
    if (io->rd_wants_wr) { /* the read (or handshake) that wanted to write goes on */
        io->rd_wants_wr = false;
        event_active(&bev->ev_read, EV_READ, 1);
    }
    if (!io->armed) {
        /* armed for the read alone: output, if any, is the flush's */
        bufferevent_disable(bev, EV_WRITE);
        if (!io->queued && !io->hs && evbuffer_get_length(out) > 0)
            gw_wio_queue(io);
        goto done;
    }
    int n = gw_wio_tls_push(io);
    if (n < 0 && errno != EAGAIN) {
        err = errno;
        ev = BEV_EVENT_ERROR;
        goto done;
    }
    if (n > 0) /* the write callback (gw_wio_written), if at the low watermark */
        bufferevent_trigger(bev, EV_WRITE, 0);
done:
    if (ev) {
        bufferevent_disable(bev, EV_WRITE);
        errno = err;
        bufferevent_trigger_event(bev, BEV_EVENT_WRITING | ev, 0);
    }
    bufferevent_decref(bev);
}

int gw_wio_tls_own(gw_wio_t *io, SSL *ssl)
{
    struct bufferevent *bev = io->bev;
    evutil_socket_t fd = bufferevent_getfd(bev);
    if (fd < 0 || SSL_set_fd(ssl, (int)fd) != 1)
        return -1;
    SSL_set_accept_state(ssl);
    SSL_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    /* an EOF without close_notify is an EOF, as it was with libevent's
     * allow_dirty_shutdown */
    SSL_set_options(ssl, SSL_OP_IGNORE_UNEXPECTED_EOF);
    SSL_set_read_ahead(ssl, 1);
    io->ssl = ssl;
    io->hs = true;
    io->own_read = true;
    io->fd = fd;
    /* event_assign needs the events neither added nor active */
    short on = bufferevent_get_enabled(bev);
    if (on)
        bufferevent_disable(bev, on);
    struct event_base *base = bufferevent_get_base(bev);
    event_assign(&bev->ev_read, base, fd, EV_READ | EV_PERSIST | EV_FINALIZE, gw_wio_tls_readcb,
                 io);
    event_assign(&bev->ev_write, base, fd, EV_WRITE | EV_PERSIST | EV_FINALIZE, gw_wio_tls_writecb,
                 io);
    /* only we fill the input and drain the output (see the top) */
    evbuffer_unfreeze(bufferevent_get_input(bev), 0);
    evbuffer_unfreeze(bufferevent_get_output(bev), 1);
    gw_wio_mark_sync(io); /* the mark moves from libevent's to ours */
    if (on)
        bufferevent_enable(bev, on);
    return 0;
}

/* The socket: ours (read_own, tls_own) is the one libevent reads. */
static evutil_socket_t gw_wio_fd(const gw_wio_t *io)
{
    return io->own_read ? io->fd : bufferevent_getfd(io->bev);
}

/* Chains one send takes, as many as evbuffer_write's writev took
 * (libevent's NUM_WRITE_IOVEC); the rest goes in the next call. */
#define GW_WIO_IOV 128

/* One sendmsg of the front of out (thawed: see the top), drained by what
 * the kernel took: bytes sent, or -1 with errno; *empty: out is empty now
 * (all of it was sent, or there was nothing), known from the peek, so no
 * caller asks for the length. evbuffer_write would do a
 * writev, which reaches the same sock_sendmsg through the VFS first
 * (rw_verify_area, the file's LSM and fsnotify hooks, a kiocb), as
 * read(2) does (bench/RESULTS.md "plainsys"). MSG_NOSIGNAL: a peer gone
 * is EPIPE, as with SIGPIPE ignored. */
static int gw_wio_send(struct evbuffer *out, evutil_socket_t fd, bool *empty)
{
    struct evbuffer_iovec v[GW_WIO_IOV];
    struct iovec iov[GW_WIO_IOV];
    int n = evbuffer_peek(out, -1, NULL, v, GW_WIO_IOV);
    size_t total = 0;
    *empty = false;
    if (n <= 0) {
        *empty = true;
        return 0;
    }
    int k = SL_MIN(n, GW_WIO_IOV);
    for (int i = 0; i < k; i++) {
        iov[i].iov_base = v[i].iov_base;
        iov[i].iov_len = v[i].iov_len;
        total += v[i].iov_len;
    }
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)k};
    ssize_t sent = total ? sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) : 0;
    if (sent < 0)
        return -1;
    if (evbuffer_drain(out, (size_t)sent) != 0) { /* frozen: a bug, never bytes sent twice */
        errno = EINVAL;
        return -1;
    }
    /* a full vector may have left chains unpeeked (evbuffer_peek stops
     * there): only then is the length asked */
    *empty = (size_t)sent == total && (n < GW_WIO_IOV || evbuffer_get_length(out) == 0);
    return (int)sent;
}

static void gw_wio_flush(gw_wio_t *io)
{
    struct evbuffer *out = bufferevent_get_output(io->bev);
    if (io->kick) {
        /* libevent's TLS write callback, now: it writes what SSL takes and
         * disarms EV_WRITE once the buffer is empty (or leaves it armed,
         * with the send timeout, when the kernel is full). */
        if (evbuffer_get_length(out) > 0)
            event_active(&io->bev->ev_write, EV_WRITE, 1);
        return;
    }
    bool early = io->early;
    int werr = io->werr;
    io->early = false;
    io->werr = 0;
    if (werr && io->direct && !io->armed) { /* gw_wio_write_now's failure, reported now */
        errno = werr;
        io->failed(io->owner, BEV_EVENT_ERROR | BEV_EVENT_WRITING);
        return;
    }
    if (!io->direct || io->armed || io->hs)
        return;
    if (early && evbuffer_get_length(out) == 0) { /* gw_wio_write_now wrote it all */
        io->drained(io->owner);
        return;
    }
    int n = 0;
    bool empty;
    if (io->ssl) {
        empty = evbuffer_get_length(out) == 0;
        if (!empty) {
            n = gw_wio_tls_push(io);
            empty = evbuffer_get_length(out) == 0;
        }
    } else {
        n = gw_wio_send(out, gw_wio_fd(io), &empty);
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        io->failed(io->owner, BEV_EVENT_ERROR | BEV_EVENT_WRITING);
        return;
    }
    if (!empty) {
        /* The kernel is full: let libevent finish (send timeout armed). */
        io->armed = true;
        bufferevent_enable(io->bev, EV_WRITE);
        return;
    }
    if (n > 0 || early) /* written now (and by gw_wio_write_now before) */
        io->drained(io->owner);
}

/* The write of the flush, ahead of it; the flush (io stays queued) runs
 * the callbacks: a failure or a short write is left to it (it writes
 * again, or arms EV_WRITE), a whole write becomes drained there. */
void gw_wio_write_now(gw_wio_t *io)
{
    if (!io->queued || io->kick || io->ssl || !io->direct || io->armed || io->hs || io->werr)
        return;
    bool empty;
    int n = gw_wio_send(bufferevent_get_output(io->bev), gw_wio_fd(io), &empty);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        io->werr = (short)(errno ? errno : EIO); /* errno values fit */
    else if (empty)
        io->early = true;
}

void gw_wio_flush_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_worker_t *w = arg;
    gw_wio_t *io;
    /* A flush may queue more (a drained client resumes an upstream read
     * that answers at once): loop until the list stays empty. */
    while ((io = TAILQ_FIRST(&w->flushq)) != NULL) {
        TAILQ_REMOVE(&w->flushq, io, link);
        io->queued = false;
        gw_wio_flush(io);
    }
}

/* One read into the thread's scratch, copied to the end of bev's input, at
 * most what the read high-watermark leaves: bytes read, 0 at EOF, -1 with
 * *err set; -2 when the buffer is at its mark (reading is suspended again).
 * Its first GW_WIO_OWN bytes go to the free end of the input's last chain
 * or a new chain of libevent's smallest block (1 KiB with its header:
 * glibc's per-thread cache serves it), the rest to a chain behind. A 16 KiB
 * chain for every read (as libevent reads) is over that cache's size: with
 * thousands of connections those blocks come from glibc's large bins, cold
 * and fragmented (unlink_chunk, _int_malloc and _int_free were 8 % of the
 * worker's CPU at 5,000 connections, bench/RESULTS.md). A small message so
 * costs no large block at all. Reading into reserved space (readv into
 * evbuffer_reserve_space's, then evbuffer_commit_space) saved the copy but
 * cost more than it: ~235 instructions a read against ~100 for an add and
 * the copy of a 400-byte message (callgrind, bench/RESULTS.md "evleft"). */
#define GW_WIO_OWN (1024 - 64)

static ssize_t gw_wio_read_once(gw_wio_t *io, evutil_socket_t fd, int *err)
{
    struct bufferevent *bev = io->bev;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t len0 = evbuffer_get_length(in);
    size_t want = gw_wio_read_room(io, len0);
    if (want == 0)
        return -2; /* at the mark: suspended until the input drains */
    want = SL_MIN(want, (size_t)GW_WIO_READ);
    /* recv, not read: a read(2) of a socket goes through the VFS first
     * (rw_verify_area, the LSM's file hook, a kiocb) before the same
     * sock_recvmsg; ~0.04-0.06 µs a call in the kernel (sampled,
     * bench/RESULTS.md "plainsys"). The descriptor is always a socket. */
    ssize_t n = recv(fd, gw_wio_scratch, want, 0);
    *err = errno;
    if (n > 0) {
        /* The first GW_WIO_OWN bytes fill the last chain's free end or a
         * new chain of libevent's smallest block, the rest a chain of its
         * own, as reserved space would have (one copy of a small message:
         * cheaper than reserving and committing the space). */
        size_t own = SL_MIN((size_t)n, (size_t)GW_WIO_OWN);
        if (evbuffer_add(in, gw_wio_scratch, own) != 0 ||
            ((size_t)n > own && evbuffer_add(in, gw_wio_scratch + own, (size_t)n - own) != 0)) {
            *err = ENOMEM;
            n = -1;
        }
    }
    if (n > 0)
        gw_wio_read_done(io, len0 + (size_t)n);
    return n;
}

static void gw_wio_readcb(evutil_socket_t fd, short what, void *arg)
{
    gw_wio_t *io = arg;
    struct bufferevent *bev = io->bev;
    short ev = BEV_EVENT_READING;
    int err = 0;
    /* No reference of our own: nothing touches bev or io after the read
     * callback, and _trigger_event holds its own (a callback that frees
     * the bufferevent leaves it to libevent's finalizer, which runs after
     * us; the gateway frees connections at its next safe point anyway). */
    if (what == EV_TIMEOUT) {
        /* only a bare timeout: with EV_READ a read came in time */
        ev |= BEV_EVENT_TIMEOUT;
    } else {
        ssize_t n = gw_wio_read_once(io, fd, &err);
        if (n > 0) {
            /* The read callback. bufferevent_trigger(EV_READ) would take a
             * reference, compare the input with the low watermark (ours are
             * 0) and check for deferred callbacks (a socket read by us has
             * none: gw_wio_read_own): ~100 instructions a read for a call. */
            if (bev->wm_read.low == 0 && bev->readcb)
                bev->readcb(bev, bev->cbarg);
            else
                bufferevent_trigger(bev, EV_READ, 0);
            ev = 0;
        } else if (n == -2 || (n < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR))) {
            ev = 0; /* woken for nothing, or at the mark: wait */
        } else {
            ev |= n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR;
        }
    }
    if (ev) {
        bufferevent_disable(bev, EV_READ);
        errno = err; /* the event callback may ask for the socket's error */
        bufferevent_trigger_event(bev, ev, 0);
    }
}

int gw_wio_read_own(gw_wio_t *io)
{
    struct bufferevent *bev = io->bev;
    evutil_socket_t fd = bufferevent_getfd(bev);
    if (fd < 0)
        return -1;
    /* event_assign needs the event neither added nor active */
    short on = bufferevent_get_enabled(bev) & EV_READ;
    if (on)
        bufferevent_disable(bev, EV_READ);
    event_assign(&bev->ev_read, bufferevent_get_base(bev), fd, EV_READ | EV_PERSIST | EV_FINALIZE,
                 gw_wio_readcb, io);
    io->own_read = true;
    io->fd = fd;
    /* only we add to the input now: its end stays thawed (see the top) */
    evbuffer_unfreeze(bufferevent_get_input(bev), 0);
    gw_wio_mark_sync(io); /* the mark moves from libevent's to ours */
    if (on)
        bufferevent_enable(bev, EV_READ);
    return 0;
}

/* ---- libevent's 1 KiB chains, kept per thread -----------------------------
 *
 * Every small write or read takes a chain of libevent's smallest size (1 KiB
 * with its header: MIN_BUFFER_SIZE) and gives it back once written or read,
 * ~3.5 per request. glibc's tcache keeps 7 blocks a size; at thousands of
 * connections a loop turn serves hundreds of requests, so most of those
 * chains come from and go back to the bins: _int_malloc, _int_free joining
 * the block with its (cold) neighbours, and malloc_consolidate, which every
 * allocation of 1 KiB or more runs while small freed blocks wait in the
 * fastbins. Counted by callgrind at 5,000 connections (bench/RESULTS.md,
 * "scale4"), that was the largest growth over 32 in instructions, D1 and
 * L2 misses per request. So libevent allocates through these functions:
 * a block of that size goes to a per-thread LIFO stack (the last freed,
 * the warmest, is the next taken) of at most GW_WIO_CHAINS_MAX blocks, and
 * everything else to malloc as before. Blocks stay glibc's (realloc and a
 * free from another thread work as for any block); the worker's tick gives
 * back half of what its thread's stack did not use since the tick before
 * (gw_wio_mem_tick), and all of it when the worker trims after a peak.
 * Not installed under ASan (its own allocator checks the chains). */
#if defined(__SANITIZE_ADDRESS__)
#define GW_WIO_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GW_WIO_ASAN 1
#endif
#endif

struct gw_wio_stack {
    void *blk[GW_WIO_CHAINS_MAX];
    size_t n;
    size_t low; /* fewest held since the last tick */
};
static __thread struct gw_wio_stack gw_wio_chains;
/* The HTTP/1 parsers' head blocks (gw_wio_head_take): stacks of their own,
 * so that no free has to ask malloc a block's size, one per kind of head: an
 * answer's block, given back at the upstream's release right after its head
 * was read, is still in cache for the next answer, which a request's block
 * given back at the request's end (its head read long before) would have
 * been taken instead of (the next answer then wrote a cold block). */
static __thread struct gw_wio_stack gw_wio_heads[2];

static size_t gw_wio_chain_usable; /* malloc_usable_size of a 1 KiB block; 0: stacks off */

static void *gw_wio_stack_pop(struct gw_wio_stack *st)
{
    void *p = st->blk[--st->n];
    if (st->n < st->low)
        st->low = st->n;
    return p;
}

static size_t gw_wio_stack_trim(struct gw_wio_stack *st, bool all)
{
    size_t n = all ? st->n : (SL_MIN(st->low, st->n) + 1) / 2;
    for (size_t i = 0; i < n; i++)
        free(st->blk[--st->n]);
    st->low = st->n;
    return n;
}

void *gw_wio_mem_malloc(size_t size)
{
    if (size == GW_WIO_CHAIN_BYTES && gw_wio_chains.n > 0)
        return gw_wio_stack_pop(&gw_wio_chains);
    return malloc(size);
}

void *gw_wio_mem_realloc(void *p, size_t size)
{
    return realloc(p, size);
}

void gw_wio_mem_free(void *p)
{
    if (p && gw_wio_chains.n < GW_WIO_CHAINS_MAX && malloc_usable_size(p) == gw_wio_chain_usable) {
        gw_wio_chains.blk[gw_wio_chains.n++] = p;
        return;
    }
    free(p);
}

size_t gw_wio_mem_cached(void)
{
    return gw_wio_chains.n;
}

size_t gw_wio_mem_tick(bool all)
{
    return gw_wio_stack_trim(&gw_wio_chains, all) + gw_wio_stack_trim(&gw_wio_heads[0], all) +
           gw_wio_stack_trim(&gw_wio_heads[1], all);
}

void *gw_wio_head_take(bool answer)
{
    struct gw_wio_stack *st = &gw_wio_heads[answer];
    if (st->n > 0)
        return gw_wio_stack_pop(st);
    return malloc(GW_WIO_HEAD_BYTES);
}

void gw_wio_head_give(void *p, bool answer)
{
    struct gw_wio_stack *st = &gw_wio_heads[answer];
    if (p && gw_wio_chain_usable &&
        st->n < (answer ? GW_WIO_HEADS_ANSWER_MAX : GW_WIO_CHAINS_MAX)) {
        st->blk[st->n++] = p;
        return;
    }
    free(p);
}

size_t gw_wio_head_cached(bool answer)
{
    return gw_wio_heads[answer].n;
}

void gw_wio_mem_prepare(void)
{
    void *p = malloc(GW_WIO_CHAIN_BYTES);
    gw_wio_chain_usable = p ? malloc_usable_size(p) : 0;
    free(p);
}

bool gw_wio_mem_init(void)
{
#ifdef GW_WIO_ASAN
    return false;
#else
    gw_wio_mem_prepare();
    if (!gw_wio_chain_usable)
        return false;
    event_set_mem_functions(gw_wio_mem_malloc, gw_wio_mem_realloc, gw_wio_mem_free);
    return true;
#endif
}
