/*
 * gw_wio.h — direct writes for a plain-socket bufferevent (wio.c says why):
 * the client connection and the upstream connection both write through it.
 */
#ifndef GW_WIO_H
#define GW_WIO_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/queue.h>

#include <event2/bufferevent.h>
#include <event2/event.h>
#include <openssl/ssl.h>

#include "gateway/gw_types.h"

/* The first 64 bytes are what queueing a write and the flush read
 * (gw_wio_added, gw_wio_flush), so at thousands of connections, where a
 * connection's lines are cold again by its flush, that is one line: the
 * owners (gw_conn_t, gw_upconn_t) put it first in a line-aligned struct
 * (GW_WIO_LINE). The flags are bits to fit it. */
struct gw_wio {
    gw_worker_t *w;
    struct bufferevent *bev;
    void *owner;
    void (*drained)(void *owner); /* everything was written */
    TAILQ_ENTRY(gw_wio) link;
    SSL *ssl;             /* our TLS (gw_wio_tls_own): owned, freed by fini */
    evutil_socket_t fd;   /* the socket, while own_read */
    short werr;           /* gw_wio_write_now's write failed: errno, failed at the flush */
    bool direct : 1;      /* we write; EV_WRITE armed only while the kernel is full */
    bool armed : 1;       /* EV_WRITE is armed (libevent writes) */
    bool queued : 1;      /* on the worker's flush list */
    bool kick : 1;        /* TLS: libevent writes, but in this loop turn */
    bool early : 1;       /* gw_wio_write_now wrote everything: drained at the flush */
    bool hs : 1;          /* the TLS handshake is not done yet */
    bool rd_wants_wr : 1; /* an SSL_read (or the handshake) waits to write */
    bool own_read : 1;    /* our read event (gw_wio_read_own, gw_wio_tls_own) */
    /* -- the second line: reads and errors */
    void (*failed)(void *owner, short what); /* a write failed */
    size_t read_high;                        /* the read high-watermark (gw_wio_set_read_mark) */
    size_t lev_high;                         /* libevent's read mark as we last set it (0: off) */
};
TAILQ_HEAD(gw_wio_list, gw_wio);

/* A struct that starts with its gw_wio_t is allocated line-aligned: its
 * size rounded up to GW_WIO_LINE, for aligned_alloc. */
#define GW_WIO_LINE         64
#define GW_WIO_LINE_SIZE(n) (((n) + GW_WIO_LINE - 1) & ~(size_t)(GW_WIO_LINE - 1))
_Static_assert(offsetof(struct gw_wio, failed) == GW_WIO_LINE,
               "gw_wio_t: what the queue and the flush read is its first line");

void gw_wio_init(gw_wio_t *io, gw_worker_t *w, struct bufferevent *bev, bool direct,
                 void (*drained)(void *), void (*failed)(void *, short), void *owner);
/* direct = true: a plain-socket bufferevent (bufferevent_socket_new) only,
 * connected; from then on its output has no callback at all (wio.c, "No
 * output callback"), so every writer calls gw_wio_added. */
void gw_wio_set_direct(gw_wio_t *io, bool direct);
void gw_wio_queue(gw_wio_t *io);
/* Bytes were added to io's output: every writer of a client's or an
 * upstream's output calls this after its adds (before gw_wio_write_now),
 * or they wait there until something else is written (wio.c, "No output
 * callback"). Queues the flush when we write (direct and not waiting for
 * EV_WRITE) or kick (TLS); otherwise libevent's bufferevent writes. */
static inline void gw_wio_added(gw_wio_t *io)
{
    if (!io->queued && (io->kick || (io->direct && !io->armed)))
        gw_wio_queue(io);
}
/* TLS: new output is written at the end of the current callbacks by
 * running the bufferevent's own write event at once (wio.c). */
void gw_wio_set_kick(gw_wio_t *io, bool kick);
/* Writes what is queued on a direct plain socket now, not at the end of
 * the current callbacks: for bytes whose latency matters (a request sent
 * upstream) when the caller still has work to do that need not precede
 * them (timers, bookkeeping). Only the write moves: drained and failed
 * still run from the flush, never inside the caller (wio.c). A no-op for
 * TLS, a connection still connecting, or one whose EV_WRITE is armed. */
void gw_wio_write_now(gw_wio_t *io);
void gw_wio_fini(gw_wio_t *io);
/* From the bufferevent's write callback: libevent wrote. */
void gw_wio_written(gw_wio_t *io);
void gw_wio_flush_cb(evutil_socket_t fd, short what, void *arg);

/* Plain sockets: the bufferevent's read event runs our read (wio.c says
 * why) instead of libevent's; everything else about reading (enable and
 * disable, the read timeout, EOF and errors to the event callback) stays
 * the bufferevent's, and the read high-watermark is gw_wio_set_read_mark's.
 * The bufferevent must not defer its callbacks (BEV_OPT_DEFER_CALLBACKS):
 * the read callback is run directly after a read with a read low-watermark
 * of 0.
 * Call after gw_wio_init, once the socket is set (after
 * bufferevent_socket_connect: setting the fd reassigns the event). 0, or
 * -1 when the bufferevent has no socket (it keeps libevent's read). */
int gw_wio_read_own(gw_wio_t *io);

/* The read high-watermark (0: none), in place of bufferevent_setwatermark
 * (EV_READ): reads stop while the input holds that much. With our read
 * event it is kept here and libevent's own mark is set only while the
 * input is at it (wio.c, "The read mark"); otherwise it is libevent's.
 * Set it after gw_wio_read_own / gw_wio_tls_own: libevent's mark, once
 * set, leaves a callback entry on the input buffer for the bufferevent's
 * life, walked on every add and drain even while disabled. */
void gw_wio_set_read_mark(gw_wio_t *io, size_t high);

/* TLS on a plain-socket bufferevent, by us (wio.c says why): SSL_read
 * into the input buffer from the read event, SSL_write from the output
 * buffer at flush time (the direct writes above, with EV_WRITE armed only
 * while the kernel is full). Takes ownership of ssl (freed by
 * gw_wio_fini), puts it in accept state on the bufferevent's socket. Call
 * after gw_wio_init(direct = true). 0, or -1 (ssl not taken). */
int gw_wio_tls_own(gw_wio_t *io, SSL *ssl);

/* libevent's 1 KiB chains kept per thread (wio.c says why). gw_wio_mem_init
 * installs the three allocation functions into libevent: before any other
 * libevent call, once; false where it does not (ASan). gw_wio_mem_tick runs
 * on the calling thread's worker tick: frees half of what its stack did not
 * use since the tick before, or all of it (all); returns how many. The rest
 * is for tests: gw_wio_mem_prepare sets up without installing. */
#define GW_WIO_CHAINS_MAX  1024 /* a thread's stack: 1 MiB at most */
#define GW_WIO_CHAIN_BYTES 1024 /* libevent's smallest chain with its header */
bool gw_wio_mem_init(void);
void gw_wio_mem_prepare(void);
void *gw_wio_mem_malloc(size_t size);
void *gw_wio_mem_realloc(void *p, size_t size);
void gw_wio_mem_free(void *p);
size_t gw_wio_mem_tick(bool all);
size_t gw_wio_mem_cached(void);

/* The HTTP/1 parsers' head blocks (http1.c, block_take): a whole head of
 * up to GW_WIO_HEAD_BYTES with its header table. A thread keeps those given
 * back on two stacks of its own, requests' and answers' (answer), at most
 * GW_WIO_CHAINS_MAX and GW_WIO_HEADS_ANSWER_MAX blocks (1.25 MiB), the last
 * given back the next taken, instead of an exact-size malloc from glibc's
 * bins, cold at thousands of connections (bench/RESULTS.md, "coldreq");
 * gw_wio_mem_tick trims them with the chains'. take: a block of
 * GW_WIO_HEAD_BYTES or NULL (OOM); give: NULL-safe, frees the block where
 * the stacks are off (ASan) or full. */
#define GW_WIO_HEAD_BYTES       1024
#define GW_WIO_HEADS_ANSWER_MAX 256 /* an answer's head is given back at release */
void *gw_wio_head_take(bool answer);
void gw_wio_head_give(void *p, bool answer);
size_t gw_wio_head_cached(bool answer);

#endif
