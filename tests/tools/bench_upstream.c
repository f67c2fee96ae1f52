/*
 * bench_upstream — the fast mock model server of the benchmark (bench/run.sh).
 *
 * Single-threaded libevent, keep-alive, requests framed by Debian's
 * http-parser. POST /v1/chat/completions answers a fixed small
 * chat.completion JSON (Content-Length) unless the body contains
 * "stream":true, in which case it answers an SSE stream (chunked) of N
 * chat.completion.chunk events and `data: [DONE]`. POST /v1/responses
 * answers the Responses API the same way: a fixed response object, or (with
 * "stream":true) the stream an OpenAI server sends — response.created,
 * output_item.added, content_part.added, N response.output_text.delta
 * events, output_text.done, content_part.done, output_item.done and
 * response.completed, each with its `event:` line, no [DONE] — written at
 * once (-d and -H apply to chat streams only). Anything else is 404.
 *
 *   build/tools/bench_upstream [-l HOST:PORT] [-n EVENTS] [-d DELAY_US] [-H]
 *
 *   -l  listen address (default 127.0.0.1:18000)
 *   -n  events per stream (default 8)
 *   -d  delay between events in microseconds (default 0: the whole stream
 *       is written at once; >0: the head and first event at once, then one
 *       event per delay)
 *   -H  hold: streams get the head and the first event and then stay open,
 *       silent, until the client goes away (idle-stream RSS measurement)
 *
 * It is a load generator's partner, not a server to trust: the body is only
 * searched for the "stream":true marker (the benchmark writes the bodies),
 * and bodies beyond BU_BODY_MAX are counted but not searched. On SIGTERM or
 * SIGINT it prints the requests and streams served to stderr and exits.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <http_parser.h>

#define BU_BODY_MAX 8192
#define BU_PATH_MAX 64

static const char bu_chat_path[] = "/v1/chat/completions";
static const char bu_resp_path[] = "/v1/responses";

static const char bu_completion[] =
    "{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion\",\"created\":1700000000,"
    "\"model\":\"bench-model\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
    "\"content\":\"Hello from the bench upstream.\"},\"finish_reason\":\"stop\"}],"
    "\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":7,\"total_tokens\":16}}";

static const char bu_event[] =
    "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\","
    "\"created\":1700000000,\"model\":\"bench-model\",\"choices\":[{\"index\":0,"
    "\"delta\":{\"content\":\"tok \"},\"finish_reason\":null}]}\n\n";

static const char bu_sse_head[] = "HTTP/1.1 200 OK\r\n"
                                  "Content-Type: text/event-stream\r\n"
                                  "Cache-Control: no-cache\r\n"
                                  "Transfer-Encoding: chunked\r\n\r\n";

/* "data: [DONE]\n\n" is 14 bytes; then the last chunk. */
static const char bu_done[] = "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";

/* The body is 60 bytes (the _Static_assert in main checks it). */
#define BU_404_BODY "{\"error\":{\"message\":\"not found\",\"type\":\"bench\",\"code\":404}}\n"
static const char bu_404[] = "HTTP/1.1 404 Not Found\r\n"
                             "Content-Type: application/json\r\n"
                             "Content-Length: 60\r\n\r\n" BU_404_BODY;

/* Built once at start: the whole JSON answer, one event as a chunk. */
static char bu_json_resp[1024];
static size_t bu_json_resp_len;
static char bu_event_chunk[512];
static size_t bu_event_chunk_len;

/* The Responses API's answers (bu_resp_build): the whole JSON answer and
 * the whole stream, head and last chunk included. */
static char *bu_resp_json, *bu_resp_sse;
static size_t bu_resp_json_len, bu_resp_sse_len;

static int bu_events = 8;
static long bu_delay_us;
static int bu_hold;
static unsigned long bu_nreq, bu_nstream;

typedef struct bu_conn {
    struct bufferevent *bev;
    http_parser parser;
    struct event *timer; /* next event of a delayed stream */
    int events_left;
    int busy;    /* a delayed or held stream is in progress: parse no further */
    int closing; /* close once the output has drained */
    int keep_alive;
    size_t path_len, body_len;
    char path[BU_PATH_MAX];
    char body[BU_BODY_MAX];
} bu_conn_t;

static http_parser_settings bu_settings;

static void bu_conn_free(bu_conn_t *c)
{
    if (c == NULL)
        return;
    if (c->timer)
        event_free(c->timer);
    bufferevent_free(c->bev);
    free(c);
}

static int bu_on_begin(http_parser *p)
{
    bu_conn_t *c = p->data;
    c->path_len = 0;
    c->body_len = 0;
    return 0;
}

static int bu_on_url(http_parser *p, const char *at, size_t len)
{
    bu_conn_t *c = p->data;
    size_t room = sizeof(c->path) - c->path_len;
    size_t n = len < room ? len : room;
    memcpy(c->path + c->path_len, at, n);
    c->path_len += n;
    return 0;
}

static int bu_on_body(http_parser *p, const char *at, size_t len)
{
    bu_conn_t *c = p->data;
    size_t room = sizeof(c->body) - c->body_len;
    size_t n = len < room ? len : room;
    memcpy(c->body + c->body_len, at, n);
    c->body_len += n;
    return 0;
}

static int bu_wants_stream(const bu_conn_t *c)
{
    return memmem(c->body, c->body_len, "\"stream\":true", 13) != NULL ||
           memmem(c->body, c->body_len, "\"stream\": true", 14) != NULL;
}

static void bu_send_event(bu_conn_t *c)
{
    bufferevent_write(c->bev, bu_event_chunk, bu_event_chunk_len);
    c->events_left--;
}

/* A stream has ended: answer the next request if one is already queued. */
static void bu_parse(bu_conn_t *c);

static void bu_stream_end(bu_conn_t *c)
{
    bufferevent_write(c->bev, bu_done, sizeof(bu_done) - 1);
    c->busy = 0;
    if (!c->keep_alive)
        c->closing = 1;
    else
        bu_parse(c);
}

static void bu_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    bu_conn_t *c = arg;
    bu_send_event(c);
    if (c->events_left > 0) {
        struct timeval tv = {bu_delay_us / 1000000, bu_delay_us % 1000000};
        evtimer_add(c->timer, &tv);
    } else {
        bu_stream_end(c);
    }
}

static int bu_is_path(const bu_conn_t *c, const char *path, size_t n)
{
    return c->path_len == n && memcmp(c->path, path, n) == 0;
}

static int bu_on_complete(http_parser *p)
{
    bu_conn_t *c = p->data;
    bu_nreq++;
    c->keep_alive = http_should_keep_alive(p);
    int resp = bu_is_path(c, bu_resp_path, sizeof(bu_resp_path) - 1);
    if (p->method != HTTP_POST ||
        (!resp && !bu_is_path(c, bu_chat_path, sizeof(bu_chat_path) - 1))) {
        bufferevent_write(c->bev, bu_404, sizeof(bu_404) - 1);
    } else if (resp && !bu_wants_stream(c)) {
        bufferevent_write(c->bev, bu_resp_json, bu_resp_json_len);
    } else if (resp) {
        bu_nstream++;
        bufferevent_write(c->bev, bu_resp_sse, bu_resp_sse_len);
    } else if (!bu_wants_stream(c)) {
        bufferevent_write(c->bev, bu_json_resp, bu_json_resp_len);
    } else {
        bu_nstream++;
        bufferevent_write(c->bev, bu_sse_head, sizeof(bu_sse_head) - 1);
        c->events_left = bu_events;
        bu_send_event(c);
        if (bu_hold) {
            c->busy = 1;
        } else if (bu_delay_us > 0 && c->events_left > 0) {
            struct timeval tv = {bu_delay_us / 1000000, bu_delay_us % 1000000};
            c->busy = 1;
            evtimer_add(c->timer, &tv);
        } else {
            while (c->events_left > 0)
                bu_send_event(c);
            bufferevent_write(c->bev, bu_done, sizeof(bu_done) - 1);
        }
    }
    if (c->busy) {
        /* Stop here; bu_parse resumes after the stream (pipelining). */
        http_parser_pause(p, 1);
    } else if (!c->keep_alive) {
        c->closing = 1;
        http_parser_pause(p, 1);
    }
    return 0;
}

static void bu_parse(bu_conn_t *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t len;
    while (!c->busy && !c->closing && (len = evbuffer_get_length(in)) > 0) {
        const char *data = (const char *)evbuffer_pullup(in, -1);
        size_t n = http_parser_execute(&c->parser, &bu_settings, data, len);
        enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
        evbuffer_drain(in, n);
        if (e == HPE_PAUSED) {
            http_parser_pause(&c->parser, 0);
        } else if (e != HPE_OK) {
            bufferevent_write(c->bev, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", 47);
            c->closing = 1;
        } else if (n < len) {
            c->closing = 1; /* cannot happen without an error; be safe */
        }
    }
    if (c->closing) {
        bufferevent_disable(c->bev, EV_READ);
        if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
            bu_conn_free(c);
    }
}

static void bu_read_cb(struct bufferevent *bev, void *arg)
{
    bu_parse(arg);
}

static void bu_write_cb(struct bufferevent *bev, void *arg)
{
    bu_conn_t *c = arg;
    if (c->closing)
        bu_conn_free(c);
}

static void bu_event_cb(struct bufferevent *bev, short what, void *arg)
{
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        bu_conn_free(arg);
}

static void bu_accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                         int salen, void *arg)
{
    struct event_base *base = arg;
    int one = 1;
    bu_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        evutil_closesocket(fd);
        return;
    }
    /* Small writes (one SSE event) must leave at once, not wait for an ACK. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
    c->timer = evtimer_new(base, bu_timer_cb, c);
    if (c->bev == NULL || c->timer == NULL) {
        if (c->bev == NULL)
            evutil_closesocket(fd);
        bu_conn_free(c);
        return;
    }
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    bufferevent_setcb(c->bev, bu_read_cb, bu_write_cb, bu_event_cb, c);
    bufferevent_enable(c->bev, EV_READ);
}

static void bu_signal_cb(evutil_socket_t sig, short what, void *arg)
{
    event_base_loopbreak(arg);
}

/* Appends printf's output to *buf (grown as needed); exits on OOM. */
static void bu_cat(char **buf, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void bu_cat(char **buf, size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *p = n < 0 ? NULL : realloc(*buf, *len + (size_t)n + 1);
    if (!p) {
        fprintf(stderr, "bench_upstream: out of memory\n");
        exit(1);
    }
    va_start(ap, fmt);
    vsnprintf(p + *len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    *buf = p;
    *len += (size_t)n;
}

/* One SSE event of the Responses stream as a chunk: its event: line, its
 * data: line ({"type":..., "sequence_number":seq, then rest). */
static void bu_resp_event(char **buf, size_t *len, int seq, const char *type, const char *rest)
{
    char ev[8192];
    int n =
        snprintf(ev, sizeof(ev), "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%d,%s}\n\n",
                 type, type, seq, rest);
    if (n < 0 || (size_t)n >= sizeof(ev)) {
        fprintf(stderr, "bench_upstream: event too long\n");
        exit(1);
    }
    bu_cat(buf, len, "%x\r\n%s\r\n", n, ev);
}

/* The Responses answers, the text being bu_events times "tok ". */
static void bu_resp_build(void)
{
    char text[1024] = "", item[2048], resp[3072], rest[4096];
    for (int i = 0; i < bu_events && strlen(text) + 5 < sizeof(text); i++)
        strcat(text, "tok ");
    snprintf(item, sizeof(item),
             "{\"id\":\"msg_bench\",\"type\":\"message\",\"status\":\"completed\","
             "\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"%s\","
             "\"annotations\":[]}]}",
             text);
    snprintf(resp, sizeof(resp),
             "{\"id\":\"resp_bench\",\"object\":\"response\",\"created_at\":1700000000,"
             "\"status\":\"completed\",\"model\":\"bench-model\",\"output\":[%s],"
             "\"usage\":{\"input_tokens\":9,\"output_tokens\":%d,\"total_tokens\":%d}}",
             item, bu_events, 9 + bu_events);
    bu_cat(&bu_resp_json, &bu_resp_json_len,
           "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
           strlen(resp), resp);

    char **b = &bu_resp_sse;
    size_t *l = &bu_resp_sse_len;
    int seq = 0;
    bu_cat(b, l, "%s", bu_sse_head);
    bu_resp_event(b, l, seq++, "response.created",
                  "\"response\":{\"id\":\"resp_bench\",\"object\":\"response\","
                  "\"created_at\":1700000000,\"status\":\"in_progress\",\"model\":\"bench-model\","
                  "\"output\":[],\"usage\":null}");
    bu_resp_event(b, l, seq++, "response.output_item.added",
                  "\"output_index\":0,\"item\":{\"id\":\"msg_bench\",\"type\":\"message\","
                  "\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}");
    bu_resp_event(b, l, seq++, "response.content_part.added",
                  "\"item_id\":\"msg_bench\",\"output_index\":0,\"content_index\":0,"
                  "\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}");
    for (int i = 0; i < bu_events; i++)
        bu_resp_event(b, l, seq++, "response.output_text.delta",
                      "\"item_id\":\"msg_bench\",\"output_index\":0,\"content_index\":0,"
                      "\"delta\":\"tok \",\"logprobs\":[]");
    snprintf(rest, sizeof(rest),
             "\"item_id\":\"msg_bench\",\"output_index\":0,\"content_index\":0,\"text\":\"%s\","
             "\"logprobs\":[]",
             text);
    bu_resp_event(b, l, seq++, "response.output_text.done", rest);
    snprintf(rest, sizeof(rest),
             "\"item_id\":\"msg_bench\",\"output_index\":0,\"content_index\":0,"
             "\"part\":{\"type\":\"output_text\",\"text\":\"%s\",\"annotations\":[]}",
             text);
    bu_resp_event(b, l, seq++, "response.content_part.done", rest);
    snprintf(rest, sizeof(rest), "\"output_index\":0,\"item\":%s", item);
    bu_resp_event(b, l, seq++, "response.output_item.done", rest);
    snprintf(rest, sizeof(rest), "\"response\":%s", resp);
    bu_resp_event(b, l, seq++, "response.completed", rest);
    bu_cat(b, l, "0\r\n\r\n");
}

static void bu_usage(void)
{
    fprintf(stderr, "usage: bench_upstream [-l HOST:PORT] [-n EVENTS] [-d DELAY_US] [-H]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *addr = "127.0.0.1:18000";
    struct sockaddr_storage ss;
    int sslen = sizeof(ss), opt;

    _Static_assert(sizeof(BU_404_BODY) - 1 == 60, "404 body length");
    while ((opt = getopt(argc, argv, "l:n:d:H")) != -1) {
        switch (opt) {
        case 'l':
            addr = optarg;
            break;
        case 'n':
            bu_events = atoi(optarg);
            break;
        case 'd':
            bu_delay_us = atol(optarg);
            break;
        case 'H':
            bu_hold = 1;
            break;
        default:
            bu_usage();
        }
    }
    if (bu_events < 1 || bu_delay_us < 0 || optind != argc)
        bu_usage();
    if (evutil_parse_sockaddr_port(addr, (struct sockaddr *)&ss, &sslen) != 0) {
        fprintf(stderr, "bench_upstream: bad address %s\n", addr);
        return 2;
    }

    bu_json_resp_len = (size_t)snprintf(bu_json_resp, sizeof(bu_json_resp),
                                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                        "Content-Length: %zu\r\n\r\n%s",
                                        sizeof(bu_completion) - 1, bu_completion);
    bu_event_chunk_len = (size_t)snprintf(bu_event_chunk, sizeof(bu_event_chunk), "%zx\r\n%s\r\n",
                                          sizeof(bu_event) - 1, bu_event);

    bu_resp_build();

    memset(&bu_settings, 0, sizeof(bu_settings));
    bu_settings.on_message_begin = bu_on_begin;
    bu_settings.on_url = bu_on_url;
    bu_settings.on_body = bu_on_body;
    bu_settings.on_message_complete = bu_on_complete;

    signal(SIGPIPE, SIG_IGN);
    struct event_base *base = event_base_new();
    struct evconnlistener *l =
        evconnlistener_new_bind(base, bu_accept_cb, base, LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_FREE,
                                4096, (struct sockaddr *)&ss, sslen);
    if (base == NULL || l == NULL) {
        fprintf(stderr, "bench_upstream: cannot listen on %s: %s\n", addr, strerror(errno));
        return 1;
    }
    struct event *sigterm = evsignal_new(base, SIGTERM, bu_signal_cb, base);
    struct event *sigint = evsignal_new(base, SIGINT, bu_signal_cb, base);
    evsignal_add(sigterm, NULL);
    evsignal_add(sigint, NULL);

    event_base_dispatch(base);

    fprintf(stderr, "bench_upstream: %lu requests, %lu streams\n", bu_nreq, bu_nstream);
    event_free(sigterm);
    event_free(sigint);
    evconnlistener_free(l);
    event_base_free(base);
    free(bu_resp_json);
    free(bu_resp_sse);
    return 0;
}
