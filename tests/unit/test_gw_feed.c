/*
 * gw_http_feed_evbuffer(), the one parser feed loop of the client side, the
 * proxy and the resender: a message cut across many evbuffer chains (so the
 * loop must walk them), pipelined messages left alone after DONE, a
 * body-less message completing right after HEAD with nothing more to feed,
 * an empty buffer in the head phase consuming nothing (an idle keep-alive
 * close stays a non-error), and an error stopping the loop. With a head
 * callback (gw_http_feed_evbuffer_cbs, the client side's one pass): head
 * and body in one call across chains (more than one peek's worth too), the
 * callback before any body byte, two pipelined requests in one chain, an
 * error in the second chain, and a callback that stops at the head; the
 * proxy's answers (1xx before the head, a 5xx that stops, 204 and 304).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <event2/buffer.h>

#include "gateway/http1.h"

typedef struct sink {
    char body[256];
    size_t n;
} sink_t;

static int body_cb(void *arg, const char *p, size_t n)
{
    sink_t *s = arg;
    if (s->n + n > sizeof(s->body))
        return -1;
    memcpy(s->body + s->n, p, n);
    s->n += n;
    return 0;
}

static void noop_free(const void *data, size_t len, void *arg)
{
    (void)data;
    (void)len;
    (void)arg;
}

/* Adds s in pieces of k bytes, each its own chain (evbuffer_add_reference). */
static void add_pieces(struct evbuffer *in, const char *s, size_t k)
{
    size_t n = strlen(s);
    for (size_t off = 0; off < n; off += k) {
        size_t len = n - off < k ? n - off : k;
        assert_int_equal(evbuffer_add_reference(in, s + off, len, noop_free, NULL), 0);
    }
}

static void test_message_across_chains(void **state)
{
    (void)state;
    static const char req[] = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                              "Content-Length: 11\r\n\r\nhello world";
    struct evbuffer *in = evbuffer_new();
    add_pieces(in, req, 3);
    assert_true(evbuffer_peek(in, -1, NULL, NULL, 0) > 10); /* many chains */
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    sink_t s = {0};
    size_t fed = 0, total = 0;
    assert_int_equal(gw_http_feed_evbuffer(p, in, &fed, body_cb, &s), GW_HTTP_HEAD);
    total += fed;
    assert_string_equal(gw_http_msg(p)->method, "POST");
    assert_int_equal(s.n, 0); /* the caller acts on the head before any body byte */
    assert_int_equal(gw_http_feed_evbuffer(p, in, &fed, body_cb, &s), GW_HTTP_DONE);
    total += fed;
    assert_int_equal(total, sizeof(req) - 1);
    assert_int_equal(evbuffer_get_length(in), 0);
    assert_int_equal(s.n, 11);
    assert_memory_equal(s.body, "hello world", 11);
    gw_http_parser_free(p);
    evbuffer_free(in);
}

static void test_pipelined_left_alone(void **state)
{
    (void)state;
#define SECOND "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"
    static const char two[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" SECOND;
    struct evbuffer *in = evbuffer_new();
    add_pieces(in, two, 5);
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    size_t fed = 0;
    assert_int_equal(gw_http_feed_evbuffer(p, in, &fed, NULL, NULL), GW_HTTP_HEAD);
    /* Body-less: DONE at once, even though nothing of it is left to feed
     * beyond the next message's bytes, which stay in the buffer. */
    assert_int_equal(gw_http_feed_evbuffer(p, in, &fed, NULL, NULL), GW_HTTP_DONE);
    assert_int_equal(fed, 0);
    assert_int_equal(evbuffer_get_length(in), sizeof(SECOND) - 1);
    gw_http_parser_reset(p);
    assert_int_equal(gw_http_feed_evbuffer(p, in, &fed, NULL, NULL), GW_HTTP_HEAD);
    assert_int_equal(gw_http_msg(p)->path_len, strlen("/readyz"));
    assert_int_equal(gw_http_feed_evbuffer(p, in, &fed, NULL, NULL), GW_HTTP_DONE);
    assert_int_equal(evbuffer_get_length(in), 0);
    gw_http_parser_free(p);
    evbuffer_free(in);
}

static void test_empty_buffer_is_not_a_start(void **state)
{
    (void)state;
    struct evbuffer *in = evbuffer_new();
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    size_t fed = 99;
    assert_int_equal(gw_http_feed_evbuffer(p, in, &fed, NULL, NULL), GW_HTTP_NEED_MORE);
    assert_int_equal(fed, 0);
    assert_false(gw_http_started(p));
    /* An idle keep-alive connection closing: nothing lost, not an error. */
    assert_int_equal(gw_http_feed_eof(p, NULL, NULL), GW_HTTP_NEED_MORE);
    gw_http_parser_free(p);
    evbuffer_free(in);
}

static void test_error_stops_the_loop(void **state)
{
    (void)state;
    struct evbuffer *in = evbuffer_new();
    add_pieces(in, "GET / HTTP/1.1\r\nBad Header\r\n\r\nGET / HTTP/1.1\r\n\r\n", 4);
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    size_t before = evbuffer_get_length(in), fed = 0;
    assert_int_equal(gw_http_feed_evbuffer(p, in, &fed, NULL, NULL), GW_HTTP_ERROR);
    assert_int_equal(gw_http_error_status(p), 400);
    assert_true(evbuffer_get_length(in) > 0); /* what follows was not eaten */
    assert_int_equal(before - evbuffer_get_length(in), fed);
    /* Sticky: feeding again consumes nothing. */
    assert_int_equal(gw_http_feed_evbuffer(p, in, &fed, NULL, NULL), GW_HTTP_ERROR);
    assert_int_equal(fed, 0);
    gw_http_parser_free(p);
    evbuffer_free(in);
}

static void test_body_callback_refusal(void **state)
{
    (void)state;
    /* A body larger than the sink: the callback refuses, the loop stops. */
    char req[1024];
    char body[400];
    memset(body, 'x', sizeof(body));
    int n =
        snprintf(req, sizeof(req), "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%.*s",
                 sizeof(body), (int)sizeof(body), body);
    assert_true(n > 0 && (size_t)n < sizeof(req));
    struct evbuffer *in = evbuffer_new();
    add_pieces(in, req, 64);
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    sink_t s = {0};
    assert_int_equal(gw_http_feed_evbuffer(p, in, NULL, body_cb, &s), GW_HTTP_HEAD);
    assert_int_equal(gw_http_feed_evbuffer(p, in, NULL, body_cb, &s), GW_HTTP_ERROR);
    assert_true(s.n <= sizeof(s.body));
    gw_http_parser_free(p);
    evbuffer_free(in);
}

/* The client side's head callback: counts its calls, checks no body byte
 * came before it, and goes on (0) or stops at the head (1). */
typedef struct head_probe {
    sink_t *body;
    int calls;
    size_t body_at_head;
    int ret;
} head_probe_t;

static int head_cb(void *arg)
{
    head_probe_t *h = arg;
    h->calls++;
    h->body_at_head = h->body->n;
    return h->ret;
}

static gw_http_state_t feed_cbs(gw_http_parser_t *p, struct evbuffer *in, size_t *fed,
                                head_probe_t *h)
{
    const gw_http_feed_cbs_t cbs = {head_cb, h, body_cb, h->body};
    return gw_http_feed_evbuffer_cbs(p, in, fed, &cbs);
}

#define HEAD11 "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n"

/* Head split across chains, body across chains: one call to DONE. Pieces
 * of k bytes: 30 (the head in three chains, the body after it in the
 * third) and 3 (head and body across many chains, more than one peek
 * takes: the pass peeks again). */
static void one_pass(size_t k)
{
    static const char req[] = HEAD11 "hello world";
    struct evbuffer *in = evbuffer_new();
    add_pieces(in, req, k);
    assert_true(evbuffer_peek(in, -1, NULL, NULL, 0) >= 3);
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    sink_t s = {0};
    head_probe_t h = {&s, 0, 99, 0};
    size_t fed = 0;
    assert_int_equal(feed_cbs(p, in, &fed, &h), GW_HTTP_DONE);
    assert_int_equal(h.calls, 1);
    assert_int_equal(h.body_at_head, 0); /* the head is acted on before the body */
    assert_int_equal(fed, sizeof(req) - 1);
    assert_int_equal(evbuffer_get_length(in), 0);
    assert_int_equal(s.n, 11);
    assert_memory_equal(s.body, "hello world", 11);
    /* done is sticky: nothing more is taken, the callback not called again */
    assert_int_equal(feed_cbs(p, in, &fed, &h), GW_HTTP_DONE);
    assert_int_equal(fed, 0);
    assert_int_equal(h.calls, 1);
    gw_http_parser_free(p);
    evbuffer_free(in);
}

static void test_cbs_one_pass_across_chains(void **state)
{
    (void)state;
    one_pass(30);
    one_pass(3);
}

/* Two requests in one chain: the first completes in one call, the second
 * stays whole in the buffer; a body-less one completes at the head's end. */
static void test_cbs_pipelined_one_chain(void **state)
{
    (void)state;
#define SECOND_GET "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"
    static const char two[] = HEAD11 "hello world" SECOND_GET;
    struct evbuffer *in = evbuffer_new();
    assert_int_equal(evbuffer_add(in, two, sizeof(two) - 1), 0);
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    sink_t s = {0};
    head_probe_t h = {&s, 0, 99, 0};
    size_t fed = 0;
    assert_int_equal(feed_cbs(p, in, &fed, &h), GW_HTTP_DONE);
    assert_int_equal(fed, sizeof(HEAD11) - 1 + 11);
    assert_int_equal(s.n, 11);
    assert_int_equal(evbuffer_get_length(in), sizeof(SECOND_GET) - 1);
    gw_http_parser_reset(p);
    s.n = 0;
    assert_int_equal(feed_cbs(p, in, &fed, &h), GW_HTTP_DONE); /* 0-byte feed after HEAD */
    assert_int_equal(h.calls, 2);
    assert_int_equal(fed, sizeof(SECOND_GET) - 1);
    assert_int_equal(gw_http_msg(p)->path_len, strlen("/readyz"));
    assert_int_equal(s.n, 0);
    assert_int_equal(evbuffer_get_length(in), 0);
    gw_http_parser_free(p);
    evbuffer_free(in);
}

/* An error in the second chain: the feed stops at the offending byte,
 * drains only what came before it, and the head callback is not called. */
static void test_cbs_error_in_second_chain(void **state)
{
    (void)state;
    static const char first[] = "GET / HTTP/1.1\r\nHost: x\r\n";
    static const char second[] = "Bad Header\r\n\r\nGET / HTTP/1.1\r\n\r\n";
    struct evbuffer *in = evbuffer_new();
    assert_int_equal(evbuffer_add_reference(in, first, sizeof(first) - 1, noop_free, NULL), 0);
    assert_int_equal(evbuffer_add_reference(in, second, sizeof(second) - 1, noop_free, NULL), 0);
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    sink_t s = {0};
    head_probe_t h = {&s, 0, 99, 0};
    size_t before = evbuffer_get_length(in), fed = 0;
    assert_int_equal(feed_cbs(p, in, &fed, &h), GW_HTTP_ERROR);
    assert_int_equal(gw_http_error_status(p), 400);
    assert_int_equal(h.calls, 0);
    assert_true(fed >= sizeof(first) - 1 && fed <= sizeof(first) - 1 + strlen("Bad"));
    assert_int_equal(before - evbuffer_get_length(in), fed);
    gw_http_parser_free(p);

    /* A body error in the second chain (bad chunk size) after the head
     * passed: the head's bytes and the valid framing are drained, no more. */
    static const char head[] = "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    static const char body[] = "5\r\nhello\r\nzz\r\n";
    evbuffer_drain(in, evbuffer_get_length(in));
    assert_int_equal(evbuffer_add_reference(in, head, sizeof(head) - 1, noop_free, NULL), 0);
    assert_int_equal(evbuffer_add_reference(in, body, sizeof(body) - 1, noop_free, NULL), 0);
    p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    before = evbuffer_get_length(in);
    assert_int_equal(feed_cbs(p, in, &fed, &h), GW_HTTP_ERROR);
    assert_int_equal(h.calls, 1);
    assert_int_equal(s.n, 5);
    assert_memory_equal(s.body, "hello", 5);
    assert_int_equal(fed, sizeof(head) - 1 + strlen("5\r\nhello\r\n"));
    assert_int_equal(before - evbuffer_get_length(in), fed);
    gw_http_parser_free(p);
    evbuffer_free(in);
}

/* A callback that stops (a 100 Continue written): HEAD with only the head
 * drained; the next call takes the body. */
static void test_cbs_head_stop(void **state)
{
    (void)state;
    static const char req[] = HEAD11 "hello world";
    struct evbuffer *in = evbuffer_new();
    assert_int_equal(evbuffer_add(in, req, sizeof(req) - 1), 0);
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    sink_t s = {0};
    head_probe_t h = {&s, 0, 99, 1};
    size_t fed = 0;
    assert_int_equal(feed_cbs(p, in, &fed, &h), GW_HTTP_HEAD);
    assert_int_equal(fed, sizeof(HEAD11) - 1);
    assert_int_equal(evbuffer_get_length(in), 11);
    assert_int_equal(s.n, 0);
    assert_int_equal(feed_cbs(p, in, &fed, &h), GW_HTTP_DONE);
    assert_int_equal(h.calls, 1);
    assert_int_equal(fed, 11);
    assert_memory_equal(s.body, "hello world", 11);
    gw_http_parser_free(p);
    evbuffer_free(in);
}

/* The proxy's one pass over an upstream answer (gw_proxy_head_cb): the
 * callback sees only the final head (1xx interims skipped), stops at a 5xx
 * with only the head drained, and a 204 completes in the same pass with
 * what follows it left in the buffer. */
typedef struct resp_probe {
    gw_http_parser_t *p;
    sink_t *body;
    int calls, status;
    size_t body_at_head;
} resp_probe_t;

static int resp_head_cb(void *arg)
{
    resp_probe_t *h = arg;
    h->calls++;
    h->status = gw_http_msg(h->p)->status;
    h->body_at_head = h->body->n;
    return h->status >= 500;
}

static gw_http_state_t feed_resp(const char *raw, size_t k, resp_probe_t *h, size_t *fed,
                                 size_t *left)
{
    struct evbuffer *in = evbuffer_new();
    add_pieces(in, raw, k);
    const gw_http_feed_cbs_t cbs = {resp_head_cb, h, body_cb, h->body};
    gw_http_state_t st = gw_http_feed_evbuffer_cbs(h->p, in, fed, &cbs);
    *left = evbuffer_get_length(in);
    evbuffer_free(in);
    return st;
}

#define RESP_200   "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
#define INTERIM    "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
#define NO_CONTENT "HTTP/1.1 204 No Content\r\nX: 1\r\n\r\n"
#define RESP_503   "HTTP/1.1 503 Busy\r\nContent-Length: 6\r\n\r\nfailed"

static void test_cbs_response_cases(void **state)
{
    (void)state;

    for (size_t k = 7; k <= 200; k += 193) { /* many chains, and one */
        size_t fed = 0, left = 0;
        /* 1xx, 1xx, 200 and its body: one call, one callback at the 200 */
        gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_RESPONSE, NULL);
        sink_t s = {0};
        resp_probe_t h = {p, &s, 0, 0, 99};
        assert_int_equal(feed_resp(INTERIM RESP_200, k, &h, &fed, &left), GW_HTTP_DONE);
        assert_int_equal(h.calls, 1);
        assert_int_equal(h.status, 200);
        assert_int_equal(h.body_at_head, 0);
        assert_int_equal(fed, sizeof(INTERIM RESP_200) - 1);
        assert_int_equal(s.n, 5);
        assert_memory_equal(s.body, "hello", 5);
        /* a 5xx (after a 1xx): HEAD, its body neither fed nor drained */
        gw_http_parser_reset(p);
        s.n = 0;
        h.calls = 0;
        assert_int_equal(feed_resp(INTERIM RESP_503, k, &h, &fed, &left), GW_HTTP_HEAD);
        assert_int_equal(h.calls, 1);
        assert_int_equal(h.status, 503);
        assert_int_equal(s.n, 0);
        assert_int_equal(left, 6);
        assert_int_equal(fed, sizeof(INTERIM RESP_503) - 1 - 6);
        /* 204 then stray bytes: DONE in the same pass, the stray bytes left */
        gw_http_parser_reset(p);
        s.n = 0;
        h.calls = 0;
        assert_int_equal(feed_resp(NO_CONTENT "STRAY", k, &h, &fed, &left), GW_HTTP_DONE);
        assert_int_equal(h.calls, 1);
        assert_int_equal(fed, sizeof(NO_CONTENT) - 1);
        assert_int_equal(left, 5);
        assert_int_equal(s.n, 0);
        /* 304 alone: DONE with nothing after the head to feed */
        gw_http_parser_reset(p);
        h.calls = 0;
        assert_int_equal(feed_resp("HTTP/1.1 304 Not Modified\r\n\r\n", k, &h, &fed, &left),
                         GW_HTTP_DONE);
        assert_int_equal(h.calls, 1);
        assert_int_equal(left, 0);
        gw_http_parser_free(p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_message_across_chains),
        cmocka_unit_test(test_pipelined_left_alone),
        cmocka_unit_test(test_empty_buffer_is_not_a_start),
        cmocka_unit_test(test_error_stops_the_loop),
        cmocka_unit_test(test_body_callback_refusal),
        cmocka_unit_test(test_cbs_one_pass_across_chains),
        cmocka_unit_test(test_cbs_pipelined_one_chain),
        cmocka_unit_test(test_cbs_error_in_second_chain),
        cmocka_unit_test(test_cbs_head_stop),
        cmocka_unit_test(test_cbs_response_cases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
