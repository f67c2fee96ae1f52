/*
 * bench_ttfe — the benchmark's SSE client (bench/run.sh), two modes:
 *
 *   build/tools/bench_ttfe -c HOST:PORT [-n REQUESTS] [-w WARMUP] [-o FILE]
 *       Time to first event: sends REQUESTS streaming chat completions one
 *       after another on a keep-alive connection (a new one when the server
 *       closes) and measures, per request, the time from just before the
 *       request is written to the moment the first complete `data:` event
 *       of the body has been read. Each stream is read to its end before
 *       the next request. Samples (microseconds) go to FILE, one a line; a
 *       summary line (n, p50, p99, max) to stdout. WARMUP requests (default
 *       20) are sent first and not counted.
 *
 *   build/tools/bench_ttfe -c HOST:PORT -H STREAMS [-t SECONDS]
 *       Hold: opens STREAMS streams one by one, each on its own connection,
 *       waits for its first event, then prints "ready STREAMS" and keeps
 *       them all open until killed (or SECONDS, default 300, have passed).
 *       With bench_upstream -H behind a proxy this leaves the proxy holding
 *       STREAMS idle streams, for its RSS per stream.
 *
 * Responses are framed by Debian's http-parser (chunked or not). Blocking
 * sockets and a 10 s receive deadline: any failure ends the run (exit 1).
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <http_parser.h>

#define BT_BUF 65536

static const char bt_body[] = "{\"model\":\"bench-model\",\"messages\":[{\"role\":\"user\","
                              "\"content\":\"Hello\"}],\"stream\":true}";

typedef struct bt_conn {
    int fd;
    http_parser parser;
    int status_ok;   /* 200 seen */
    int got_event;   /* first data: event complete */
    int complete;    /* message complete */
    size_t body_len; /* bytes of body kept until the first event */
    size_t scan;     /* where the current event starts in body */
    int64_t t_event; /* ns */
    char body[BT_BUF];
} bt_conn_t;

static struct addrinfo *bt_addr;
static char bt_req[512];
static size_t bt_req_len;
static http_parser_settings bt_settings;

static int64_t bt_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void bt_die(const char *what)
{
    fprintf(stderr, "bench_ttfe: %s%s%s\n", what, errno ? ": " : "", errno ? strerror(errno) : "");
    exit(1);
}

static int bt_on_headers(http_parser *p)
{
    bt_conn_t *c = p->data;
    c->status_ok = p->status_code == 200;
    return 0;
}

/* Keep the body until its first complete event that is a data: event
 * (skipping ": ping" comments and other fields). */
static int bt_on_body(http_parser *p, const char *at, size_t len)
{
    bt_conn_t *c = p->data;
    if (c->got_event)
        return 0;
    if (len > sizeof(c->body) - c->body_len) {
        errno = 0;
        bt_die("first event larger than 64 KiB");
    }
    memcpy(c->body + c->body_len, at, len);
    c->body_len += len;
    for (;;) {
        const char *start = c->body + c->scan;
        const char *end = memmem(start, c->body_len - c->scan, "\n\n", 2);
        if (end == NULL)
            break;
        if (end - start >= 5 && memcmp(start, "data:", 5) == 0) {
            c->got_event = 1;
            c->t_event = bt_now_ns();
            break;
        }
        c->scan = (size_t)(end + 2 - c->body);
    }
    return 0;
}

static int bt_on_complete(http_parser *p)
{
    bt_conn_t *c = p->data;
    c->complete = 1;
    http_parser_pause(p, 1);
    return 0;
}

static void bt_connect(bt_conn_t *c)
{
    struct timeval tv = {10, 0};
    int one = 1;
    c->fd = socket(bt_addr->ai_family, SOCK_STREAM, 0);
    if (c->fd < 0)
        bt_die("socket");
    if (connect(c->fd, bt_addr->ai_addr, bt_addr->ai_addrlen) != 0)
        bt_die("connect");
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

static void bt_send(bt_conn_t *c)
{
    http_parser_init(&c->parser, HTTP_RESPONSE);
    c->parser.data = c;
    c->status_ok = c->got_event = c->complete = 0;
    c->body_len = c->scan = 0;
    if (write(c->fd, bt_req, bt_req_len) != (ssize_t)bt_req_len)
        bt_die("write");
}

/* Reads until the first event (until_event) or the end of the response. */
static void bt_read(bt_conn_t *c, int until_event)
{
    char buf[16384];
    while (!c->complete && !(until_event && c->got_event)) {
        ssize_t n = read(c->fd, buf, sizeof(buf));
        if (n < 0)
            bt_die("read");
        size_t done = http_parser_execute(&c->parser, &bt_settings, buf, (size_t)n);
        enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
        if (n == 0 && !c->complete) {
            errno = 0;
            bt_die("connection closed before the response ended");
        }
        if (e == HPE_PAUSED) {
            if (done != (size_t)n) {
                errno = 0;
                bt_die("bytes after the response (pipelining is not used)");
            }
        } else if (e != HPE_OK) {
            errno = 0;
            bt_die(http_errno_description(e));
        }
        if (c->parser.status_code != 0 && c->parser.status_code != 200) {
            errno = 0;
            bt_die("status is not 200");
        }
    }
    if (until_event && !c->got_event) {
        errno = 0;
        bt_die("response ended without a data: event");
    }
}

static int bt_cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int bt_ttfe(long n, long warmup, const char *out)
{
    static bt_conn_t c;
    int64_t *us = malloc(sizeof(*us) * (size_t)(n > 0 ? n : 1));
    FILE *f = NULL;
    if (us == NULL)
        bt_die("malloc");
    bt_connect(&c);
    for (long i = -warmup; i < n; i++) {
        int64_t t0 = bt_now_ns();
        bt_send(&c);
        bt_read(&c, 0);
        if (!c.got_event || !c.status_ok) {
            errno = 0;
            bt_die("stream without a data: event");
        }
        if (i >= 0)
            us[i] = (c.t_event - t0) / 1000;
        if (!http_should_keep_alive(&c.parser)) {
            close(c.fd);
            bt_connect(&c);
        }
    }
    close(c.fd);
    if (out != NULL && (f = fopen(out, "w")) == NULL)
        bt_die(out);
    for (long i = 0; f != NULL && i < n; i++)
        fprintf(f, "%lld\n", (long long)us[i]);
    if (f != NULL && fclose(f) != 0)
        bt_die(out);
    qsort(us, (size_t)n, sizeof(*us), bt_cmp);
    if (n > 0)
        printf("n=%ld p50_us=%lld p99_us=%lld max_us=%lld\n", n, (long long)us[n / 2],
               (long long)us[(n * 99) / 100], (long long)us[n - 1]);
    free(us);
    return 0;
}

static _Noreturn void bt_hold(long n, unsigned seconds)
{
    bt_conn_t *c = calloc((size_t)n, sizeof(*c));
    if (c == NULL)
        bt_die("calloc");
    for (long i = 0; i < n; i++) {
        bt_connect(&c[i]);
        bt_send(&c[i]);
        bt_read(&c[i], 1);
    }
    printf("ready %ld\n", n);
    fflush(stdout);
    alarm(seconds); /* never outlive a crashed caller by long */
    for (;;)
        pause(); /* SIGTERM's default action ends the process and its sockets */
}

static void bt_usage(void)
{
    fprintf(stderr, "usage: bench_ttfe -c HOST:PORT [-n REQUESTS] [-w WARMUP] [-o FILE]\n"
                    "       bench_ttfe -c HOST:PORT -H STREAMS [-t SECONDS]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    char host[256] = "", *port;
    long n = 1000, warmup = 20, hold = 0;
    unsigned seconds = 300;
    const char *out = NULL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    int opt;

    while ((opt = getopt(argc, argv, "c:n:w:o:H:t:")) != -1) {
        switch (opt) {
        case 'c':
            snprintf(host, sizeof(host), "%s", optarg);
            break;
        case 'n':
            n = atol(optarg);
            break;
        case 'w':
            warmup = atol(optarg);
            break;
        case 'o':
            out = optarg;
            break;
        case 'H':
            hold = atol(optarg);
            break;
        case 't':
            seconds = (unsigned)atol(optarg);
            break;
        default:
            bt_usage();
        }
    }
    port = strrchr(host, ':');
    if (port == NULL || optind != argc || n < 1 || warmup < 0 || hold < 0)
        bt_usage();
    *port++ = '\0';
    if (getaddrinfo(host, port, &hints, &bt_addr) != 0) {
        fprintf(stderr, "bench_ttfe: cannot resolve %s\n", host);
        return 2;
    }
    bt_req_len = (size_t)snprintf(bt_req, sizeof(bt_req),
                                  "POST /v1/chat/completions HTTP/1.1\r\n"
                                  "Host: %s:%s\r\n"
                                  "Content-Type: application/json\r\n"
                                  "Content-Length: %zu\r\n\r\n%s",
                                  host, port, sizeof(bt_body) - 1, bt_body);
    bt_settings.on_headers_complete = bt_on_headers;
    bt_settings.on_body = bt_on_body;
    bt_settings.on_message_complete = bt_on_complete;
    signal(SIGPIPE, SIG_IGN);
    if (hold > 0)
        bt_hold(hold, seconds);
    return bt_ttfe(n, warmup, out);
}
