/* floor_relay — the least work a proxy can do on this machine, as a bench
 * baseline (issues #16 "plain" and #21 item 4): every accepted client
 * connection gets its own upstream connection, and bytes are relayed both
 * ways unread — no parsing, no routing, no headers, no pool. Per request
 * that is the kernel work every HTTP/1 proxy pays (a recv and a send on
 * each side, a share of an epoll_wait) plus almost no user space, so its
 * CPU per request is the floor under nginx's and sluice's.
 *
 * It makes the calls sluice makes: recv/send (not read/write), an
 * edge-triggered registration of both directions once per socket (no
 * epoll_ctl per request), no read after a short one (the edge comes again
 * when more arrives), TCP_NODELAY on both sides. Bytes the peer cannot take
 * yet wait in a per-side buffer (bounded: a side that holds more than
 * FR_PEND_MAX bytes closes the pair) until EPOLLOUT.
 *
 *   floor_relay -l HOST:PORT -u HOST:PORT
 *
 * Not a proxy for real use: it trusts both ends and speaks no HTTP. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define FR_BUF      (64 * 1024)
#define FR_PEND_MAX (64 * 1024 * 1024)
#define FR_EVENTS   512

struct fr_pair;

typedef struct fr_side {
    int fd;
    struct fr_pair *pair;
    struct fr_side *peer;
    char *pend; /* bytes read from the peer that this side's send refused */
    size_t plen, poff;
} fr_side_t;

typedef struct fr_pair {
    fr_side_t s[2]; /* 0: client, 1: upstream */
    bool dead;
} fr_pair_t;

static char fr_buf[FR_BUF];
static int fr_ep = -1;
static struct sockaddr_in fr_up;

static int parse_addr(const char *s, struct sockaddr_in *a)
{
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s || colon - s >= 64)
        return -1;
    char host[64];
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 1 || port > 65535)
        return -1;
    memset(a, 0, sizeof(*a));
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    return inet_pton(AF_INET, host, &a->sin_addr) == 1 ? 0 : -1;
}

static void pair_close(fr_pair_t *p)
{
    if (p->dead)
        return;
    p->dead = true;
    for (int i = 0; i < 2; i++) {
        close(p->s[i].fd);
        free(p->s[i].pend);
        p->s[i].pend = NULL;
    }
    /* freed at the end of the loop turn: events for it may follow */
}

/* Sends what side s holds back; 0 when it is empty, 1 when the kernel is
 * full (EPOLLOUT will come), -1 on error. */
static int side_flush(fr_side_t *s)
{
    while (s->poff < s->plen) {
        ssize_t n = send(s->fd, s->pend + s->poff, s->plen - s->poff, MSG_NOSIGNAL);
        if (n > 0) {
            s->poff += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == ENOTCONN))
            return 1;
        if (n < 0 && errno == EINTR)
            continue;
        return -1;
    }
    s->plen = s->poff = 0;
    return 0;
}

/* Queues n bytes for side s, after what it holds: -1 past the bound. */
static int side_hold(fr_side_t *s, const char *d, size_t n)
{
    if (s->poff) {
        memmove(s->pend, s->pend + s->poff, s->plen - s->poff);
        s->plen -= s->poff;
        s->poff = 0;
    }
    if (s->plen + n > FR_PEND_MAX)
        return -1;
    char *b = realloc(s->pend, s->plen + n);
    if (!b)
        return -1;
    memcpy(b + s->plen, d, n);
    s->pend = b;
    s->plen += n;
    return 0;
}

/* Sends n bytes to side s: straight to the kernel when nothing waits. */
static int side_send(fr_side_t *s, const char *d, size_t n)
{
    if (s->plen == s->poff) {
        ssize_t w = send(s->fd, d, n, MSG_NOSIGNAL);
        if (w == (ssize_t)n)
            return 0;
        if (w < 0 && errno != EAGAIN && errno != ENOTCONN && errno != EINTR)
            return -1;
        if (w > 0) {
            d += w;
            n -= (size_t)w;
        }
    }
    return side_hold(s, d, n);
}

/* Reads side s until a short read, relaying to its peer. */
static void side_readable(fr_side_t *s)
{
    for (;;) {
        ssize_t n = recv(s->fd, fr_buf, sizeof(fr_buf), 0);
        if (n > 0) {
            if (side_send(s->peer, fr_buf, (size_t)n) < 0) {
                pair_close(s->pair);
                return;
            }
            if ((size_t)n < sizeof(fr_buf))
                return; /* drained: the next edge brings more */
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        pair_close(s->pair); /* EOF or error: both sides go */
        return;
    }
}

static int sock_watch(fr_side_t *s)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.ptr = s};
    return epoll_ctl(fr_ep, EPOLL_CTL_ADD, s->fd, &ev);
}

static void on_accept(int lfd)
{
    for (;;) {
        int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0)
            return; /* EAGAIN, or out of descriptors: the next edge retries */
        int u = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int one = 1;
        if (u < 0 ||
            (connect(u, (struct sockaddr *)&fr_up, sizeof(fr_up)) < 0 && errno != EINPROGRESS)) {
            close(c);
            if (u >= 0)
                close(u);
            continue;
        }
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        setsockopt(u, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        fr_pair_t *p = calloc(1, sizeof(*p));
        if (!p) {
            close(c);
            close(u);
            continue;
        }
        p->s[0] = (fr_side_t){.fd = c, .pair = p, .peer = &p->s[1]};
        p->s[1] = (fr_side_t){.fd = u, .pair = p, .peer = &p->s[0]};
        if (sock_watch(&p->s[0]) < 0 || sock_watch(&p->s[1]) < 0) {
            pair_close(p);
            free(p);
        }
    }
}

int main(int argc, char **argv)
{
    struct sockaddr_in la;
    const char *l = NULL, *u = NULL;
    int opt;
    while ((opt = getopt(argc, argv, "l:u:")) != -1) {
        if (opt == 'l')
            l = optarg;
        else if (opt == 'u')
            u = optarg;
        else
            l = NULL, u = NULL;
    }
    if (!l || !u || parse_addr(l, &la) < 0 || parse_addr(u, &fr_up) < 0) {
        fprintf(stderr, "usage: floor_relay -l HOST:PORT -u HOST:PORT\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&la, sizeof(la)) < 0 || listen(lfd, 8192) < 0) {
        perror("floor_relay: listen");
        return 1;
    }
    fr_ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
    if (fr_ep < 0 || epoll_ctl(fr_ep, EPOLL_CTL_ADD, lfd, &lev) < 0) {
        perror("floor_relay: epoll");
        return 1;
    }
    struct epoll_event evs[FR_EVENTS];
    fr_pair_t *dead[2 * FR_EVENTS];
    for (;;) {
        int n = epoll_wait(fr_ep, evs, FR_EVENTS, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            perror("floor_relay: epoll_wait");
            return 1;
        }
        int nd = 0;
        for (int i = 0; i < n; i++) {
            fr_side_t *s = evs[i].data.ptr;
            if (!s) {
                on_accept(lfd);
                continue;
            }
            fr_pair_t *p = s->pair;
            if (p->dead)
                continue;
            if ((evs[i].events & EPOLLOUT) && side_flush(s) < 0)
                pair_close(p);
            if (!p->dead && (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
                side_readable(s);
            if (p->dead) {
                bool seen = false;
                for (int k = 0; k < nd; k++)
                    seen = seen || dead[k] == p;
                if (!seen)
                    dead[nd++] = p;
            }
        }
        for (int k = 0; k < nd; k++)
            free(dead[k]);
    }
}
