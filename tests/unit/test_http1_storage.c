/*
 * test_http1_storage.c — the parser's head storage (gateway/http1.c): it
 * grows with the head's bytes (a head of a few hundred bytes does not cost
 * the 16 KiB the limits allow), strings stay right when it moves (fed in
 * one piece or byte by byte), it is cut to the head's size once the head is
 * complete and freed by reset (an idle keep-alive connection holds none).
 * A whole head of up to 1 KiB takes the thread's last freed 1 KiB block
 * (wio.c's stack) and gives it back at reset.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gateway/gw_wio.h"
#include "gateway/http1.h"

static const gw_http_limits_t lim = {
    .request_line_bytes = 8192,
    .header_bytes = 16384,
    .header_lines = 100,
    .max_body_bytes = 1 << 20,
};

/* A request with n headers "X-Hk: v-k-...." (each value vlen bytes), after
 * `lead` empty lines, with a 5-byte body. */
static char *make_request(int n, size_t vlen, int lead, size_t *len)
{
    size_t cap = 256 + (size_t)n * (vlen + 32) + 8;
    char *b = malloc(cap);
    assert_non_null(b);
    size_t k = 0;
    for (int i = 0; i < lead; i++)
        k += (size_t)snprintf(b + k, cap - k, "\r\n");
    k += (size_t)snprintf(b + k, cap - k,
                          "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: example\r\n");
    for (int i = 0; i < n; i++) {
        k += (size_t)snprintf(b + k, cap - k, "X-H%d: v-%d-", i, i);
        for (size_t j = 0; j < vlen; j++)
            b[k++] = (char)('a' + (j + (size_t)i) % 26);
        k += (size_t)snprintf(b + k, cap - k, "\r\n");
    }
    k += (size_t)snprintf(b + k, cap - k, "Content-Length: 5\r\n\r\nhello");
    *len = k;
    return b;
}

static int sink(void *arg, const char *p, size_t n)
{
    (void)p;
    *(size_t *)arg += n;
    return 0;
}

/* Feeds in pieces of `step` bytes; checks every header at the head. */
static void feed_and_check(gw_http_parser_t *p, const char *in, size_t len, size_t step, int n,
                           size_t vlen)
{
    size_t off = 0, body = 0;
    gw_http_state_t st = GW_HTTP_NEED_MORE;
    bool head = false;
    while (off < len && st != GW_HTTP_DONE) {
        size_t used = 0;
        st = gw_http_feed(p, in + off, SL_MIN(step, len - off), &used, sink, &body);
        assert_int_not_equal(st, GW_HTTP_ERROR);
        off += used;
        if (st == GW_HTTP_HEAD) {
            head = true;
            const gw_http_msg_t *m = gw_http_msg(p);
            assert_non_null(m);
            assert_string_equal(m->method, "POST");
            assert_int_equal(m->target_len, strlen("/v1/chat/completions?x=1"));
            assert_memory_equal(m->target, "/v1/chat/completions?x=1", m->target_len);
            assert_string_equal(m->host, "example");
            assert_int_equal(m->nheaders, (size_t)n + 2);
            for (int i = 0; i < n; i++) {
                const gw_http_header_t *h = &m->headers[i + 1];
                char name[16], pre[24];
                snprintf(name, sizeof(name), "X-H%d", i);
                snprintf(pre, sizeof(pre), "v-%d-", i);
                assert_string_equal(h->name, name);
                assert_int_equal(h->value_len, strlen(pre) + vlen);
                assert_memory_equal(h->value, pre, strlen(pre));
                for (size_t j = 0; j < vlen; j++)
                    assert_int_equal(h->value[strlen(pre) + j], 'a' + (j + (size_t)i) % 26);
            }
            /* cut to the head: no more than its bytes plus its table */
            assert_true(gw_http_parser_held(p) <= len + ((size_t)n + 2) * sizeof(gw_http_header_t));
            st = GW_HTTP_NEED_MORE;
        }
    }
    assert_true(head);
    assert_int_equal(st, GW_HTTP_DONE);
    assert_int_equal(body, 5);
}

static void test_small_head_small_storage(void **state)
{
    (void)state;
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, &lim);
    assert_non_null(p);
    assert_int_equal(gw_http_parser_held(p), 0); /* nothing before a byte */
    size_t len;
    char *in = make_request(3, 10, 0, &len);
    feed_and_check(p, in, len, len, 3, 10);
    assert_true(gw_http_parser_held(p) < 512); /* not the 16 KiB the limits allow */
    gw_http_parser_reset(p);
    assert_int_equal(gw_http_parser_held(p), 0); /* idle: nothing held */
    free(in);
    gw_http_parser_free(p);
}

static void test_storage_moves_keep_strings(void **state)
{
    (void)state;
    static const size_t steps[] = {1, 3, 7, 64, 1000, 100000};
    static const int leads[] = {0, 2};
    for (size_t s = 0; s < sizeof(steps) / sizeof(steps[0]); s++) {
        for (size_t l = 0; l < 2; l++) {
            gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, &lim);
            assert_non_null(p);
            size_t len;
            char *in = make_request(90, 120, leads[l], &len); /* ~13 KiB of head */
            feed_and_check(p, in, len, steps[s], 90, 120);
            gw_http_parser_reset(p);
            assert_int_equal(gw_http_parser_held(p), 0);
            /* and again on the same parser, a small head after a big one */
            free(in);
            in = make_request(2, 5, 0, &len);
            feed_and_check(p, in, len, steps[s], 2, 5);
            free(in);
            gw_http_parser_free(p);
        }
    }
}

/* A whole request without a body: HEAD, then DONE. */
static void feed_whole(gw_http_parser_t *p, const char *in)
{
    size_t used = 0, more = 0;
    assert_int_equal(gw_http_feed(p, in, strlen(in), &used, NULL, NULL), GW_HTTP_HEAD);
    assert_int_equal(used, strlen(in));
    assert_int_equal(gw_http_feed(p, in + used, 0, &more, NULL, NULL), GW_HTTP_DONE);
}

/* Heads that arrive whole get one block each (they went through a
 * per-thread scratch storage before): a
 * second parser's head scanned after the first's must not touch the
 * first's strings, each keeps only its own size, and an interim 1xx in the
 * same bytes as the final head leaves the final head's strings. */
static void test_whole_heads_keep_their_own_strings(void **state)
{
    (void)state;
    gw_http_parser_t *a = gw_http_parser_new(GW_HTTP_REQUEST, &lim);
    gw_http_parser_t *b = gw_http_parser_new(GW_HTTP_REQUEST, &lim);
    assert_non_null(a);
    assert_non_null(b);
    static const char ra[] = "POST /a HTTP/1.1\r\nHost: one\r\nX-K: alpha\r\n"
                             "Content-Length: 0\r\n\r\n";
    static const char rb[] = "GET /bbbbbbbb HTTP/1.1\r\nHost: two\r\nX-K: beta-beta\r\n\r\n";
    size_t used = 0;
    feed_whole(a, ra);
    size_t held_a = gw_http_parser_held(a);
    assert_true(held_a > 0 && held_a <= strlen(ra) + 3 * sizeof(gw_http_header_t));
    feed_whole(b, rb);
    const gw_http_msg_t *ma = gw_http_msg(a), *mb = gw_http_msg(b);
    assert_string_equal(ma->method, "POST");
    assert_memory_equal(ma->target, "/a", 2);
    assert_string_equal(ma->host, "one");
    assert_int_equal(ma->nheaders, 3);
    assert_string_equal(ma->headers[1].name, "X-K");
    assert_string_equal(ma->headers[1].value, "alpha");
    assert_string_equal(mb->method, "GET");
    assert_string_equal(mb->host, "two");
    assert_string_equal(gw_http_header_find(mb, "x-k")->value, "beta-beta");
    assert_int_equal(gw_http_parser_held(a), held_a);
    gw_http_parser_reset(a);
    assert_int_equal(gw_http_parser_held(a), 0);
    assert_string_equal(mb->headers[1].value, "beta-beta"); /* a's reset: b untouched */
    gw_http_parser_free(a);
    gw_http_parser_free(b);

    gw_http_parser_t *r = gw_http_parser_new(GW_HTTP_RESPONSE, &lim);
    assert_non_null(r);
    static const char resp[] = "HTTP/1.1 100 Continue\r\nX-I: interim\r\n\r\n"
                               "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: final\r\n\r\nok";
    size_t body = 0;
    assert_int_equal(gw_http_feed(r, resp, strlen(resp), &used, sink, &body), GW_HTTP_HEAD);
    const gw_http_msg_t *m = gw_http_msg(r);
    assert_int_equal(m->status, 200);
    assert_int_equal(m->nheaders, 2);
    assert_string_equal(m->headers[1].name, "X-A");
    assert_string_equal(m->headers[1].value, "final");
    assert_null(gw_http_header_find(m, "X-I"));
    size_t off = used;
    assert_int_equal(gw_http_feed(r, resp + off, strlen(resp) - off, &used, sink, &body),
                     GW_HTTP_DONE);
    assert_int_equal(body, 2);
    gw_http_parser_free(r);
}

/* What reset promises before the next byte arrives (it writes the state the
 * accessors read at once and leaves the rest of the parse state to the next
 * feed): a parser reset after an error, or in the middle of a chunked
 * body, reads as new (no error, not started, no message, no body bytes, no
 * storage), a HEAD request marked between the reset and the feed is kept,
 * and the next message parses as on a new parser, whatever state the last
 * one stopped in. */
static void test_reset_reads_new_before_the_next_feed(void **state)
{
    (void)state;
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_RESPONSE, &lim);
    assert_non_null(p);
    size_t used = 0, body = 0;
    static const char bad[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
    assert_int_equal(gw_http_feed(p, bad, strlen(bad), &used, sink, &body), GW_HTTP_HEAD);
    assert_int_equal(gw_http_feed(p, bad + used, strlen(bad) - used, &used, sink, &body),
                     GW_HTTP_ERROR);
    assert_int_equal(gw_http_error_status(p), 502);
    assert_true(gw_http_started(p));

    gw_http_parser_reset(p);
    assert_int_equal(gw_http_state(p), GW_HTTP_NEED_MORE);
    assert_int_equal(gw_http_error_status(p), 0);
    assert_string_equal(gw_http_error_reason(p), "");
    assert_false(gw_http_started(p));
    assert_null(gw_http_msg(p));
    assert_int_equal(gw_http_body_bytes(p), 0);
    assert_int_equal(gw_http_parser_held(p), 0);

    /* the answer to a HEAD (marked between the reset and the first byte):
     * its Content-Length announces no body here */
    gw_http_parser_set_head_request(p, true);
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";
    assert_int_equal(gw_http_feed(p, head, strlen(head), &used, sink, &body), GW_HTTP_HEAD);
    assert_int_equal(gw_http_feed(p, "", 0, &used, sink, &body), GW_HTTP_DONE);
    /* an idle connection closing before the next byte loses nothing */
    gw_http_parser_reset(p);
    assert_int_equal(gw_http_feed_eof(p, sink, &body), GW_HTTP_NEED_MORE);

    /* reset in the middle of a chunk (3 of its 16 bytes read) */
    gw_http_parser_reset(p);
    static const char part[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc";
    body = 0;
    assert_int_equal(gw_http_feed(p, part, strlen(part), &used, sink, &body), GW_HTTP_HEAD);
    assert_int_equal(gw_http_feed(p, part + used, strlen(part) - used, &used, sink, &body),
                     GW_HTTP_NEED_MORE);
    assert_int_equal(body, 3);
    assert_int_equal(gw_http_body_bytes(p), 3);

    gw_http_parser_reset(p);
    assert_int_equal(gw_http_body_bytes(p), 0);
    static const char next[] = "HTTP/1.1 201 Created\r\nContent-Length: 4\r\nX-N: two\r\n\r\nabcd";
    body = 0;
    assert_int_equal(gw_http_feed(p, next, strlen(next), &used, sink, &body), GW_HTTP_HEAD);
    const gw_http_msg_t *m = gw_http_msg(p);
    assert_non_null(m);
    assert_int_equal(m->status, 201);
    assert_int_equal(m->content_length, 4);
    assert_int_equal(m->nheaders, 2);
    assert_string_equal(gw_http_header_find(m, "x-n")->value, "two");
    size_t off = used;
    assert_int_equal(gw_http_feed(p, next + off, strlen(next) - off, &used, sink, &body),
                     GW_HTTP_DONE);
    assert_int_equal(body, 4);
    assert_int_equal(gw_http_body_bytes(p), 4);
    gw_http_parser_free(p);
}

/* A whole head of up to 1 KiB (with its table) is a block from the
 * thread's stack of head blocks, the last given back, and goes back at reset
 * and at free (an exact-size malloc came from glibc's bins, cold at
 * thousands of connections: bench/RESULTS.md "coldreq"); a bigger head and
 * one fed in pieces leave the stack alone; the stack stays bounded. */
static void test_small_head_block_from_thread_stack(void **state)
{
    (void)state;
    gw_wio_mem_prepare();
    (void)gw_wio_mem_tick(true);
    void *warm = gw_wio_head_take(false);
    assert_non_null(warm);
    gw_wio_head_give(warm, false);
    assert_int_equal(gw_wio_head_cached(false), 1);

    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, &lim);
    assert_non_null(p);
    size_t len;
    char *in = make_request(3, 10, 0, &len);
    size_t used = 0, body = 0;
    assert_int_equal(gw_http_feed(p, in, len, &used, sink, &body), GW_HTTP_HEAD);
    assert_int_equal(gw_wio_head_cached(false), 0);
    assert_ptr_equal(gw_http_msg(p)->headers, warm); /* the last one given back */
    assert_string_equal(gw_http_msg(p)->headers[1].name, "X-H0");
    gw_http_parser_reset(p);
    assert_int_equal(gw_wio_head_cached(false), 1); /* back on the stack */
    assert_int_equal(gw_http_parser_held(p), 0);

    /* again, then freed with the parser: back too */
    used = 0;
    assert_int_equal(gw_http_feed(p, in, len, &used, sink, &body), GW_HTTP_HEAD);
    assert_int_equal(gw_wio_head_cached(false), 0);
    gw_http_parser_free(p);
    assert_int_equal(gw_wio_head_cached(false), 1);
    free(in);

    /* over 1 KiB with its table: its own block, never put on the stack */
    p = gw_http_parser_new(GW_HTTP_REQUEST, &lim);
    assert_non_null(p);
    in = make_request(20, 40, 0, &len);
    assert_true(len > GW_WIO_HEAD_BYTES);
    feed_and_check(p, in, len, len, 20, 40);
    assert_int_equal(gw_wio_head_cached(false), 1);
    gw_http_parser_reset(p);
    assert_int_equal(gw_wio_head_cached(false), 1);
    free(in);

    /* a small head fed in pieces grows its own storage */
    in = make_request(3, 10, 0, &len);
    feed_and_check(p, in, len, 7, 3, 10);
    assert_int_equal(gw_wio_head_cached(false), 1);
    gw_http_parser_reset(p);
    assert_int_equal(gw_wio_head_cached(false), 1);

    /* the stack full: a head's block is freed, not pushed past the bound */
    void **fill = calloc(GW_WIO_CHAINS_MAX, sizeof(*fill));
    assert_non_null(fill);
    for (size_t i = 0; i < GW_WIO_CHAINS_MAX; i++)
        fill[i] = malloc(GW_WIO_HEAD_BYTES);
    used = 0;
    assert_int_equal(gw_http_feed(p, in, len, &used, sink, &body), GW_HTTP_HEAD);
    assert_int_equal(gw_wio_head_cached(false), 0);
    for (size_t i = 0; i < GW_WIO_CHAINS_MAX; i++)
        gw_wio_head_give(fill[i], false);
    assert_int_equal(gw_wio_head_cached(false), GW_WIO_CHAINS_MAX);
    gw_http_parser_reset(p);
    assert_int_equal(gw_wio_head_cached(false), GW_WIO_CHAINS_MAX);
    free(fill);
    free(in);
    gw_http_parser_free(p);
    /* the worker's tick gives them back with the chains: half of what went
     * unused from one tick to the next */
    assert_int_equal(gw_wio_mem_cached(), 0);
    assert_int_equal(gw_wio_mem_tick(false), 0); /* all were taken since the last */
    assert_int_equal(gw_wio_mem_tick(false), GW_WIO_CHAINS_MAX / 2);
    assert_int_equal(gw_wio_head_cached(false), GW_WIO_CHAINS_MAX / 2);
    assert_int_equal(gw_wio_mem_tick(true), GW_WIO_CHAINS_MAX / 2);
    assert_int_equal(gw_wio_head_cached(false), 0);
}

/* An answer's head block is kept apart from requests': given back at the
 * upstream's release, the next answer takes that same (warm) block even when
 * requests gave theirs back in between; the answers' stack is bounded by
 * GW_WIO_HEADS_ANSWER_MAX. */
static void test_answer_head_block_apart(void **state)
{
    (void)state;
    gw_wio_mem_prepare();
    (void)gw_wio_mem_tick(true);
    static const char ans[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    gw_http_parser_t *up = gw_http_parser_new(GW_HTTP_RESPONSE, &lim);
    gw_http_parser_t *rq = gw_http_parser_new(GW_HTTP_REQUEST, &lim);
    assert_non_null(up);
    assert_non_null(rq);
    size_t len, used = 0, body = 0;
    char *in = make_request(3, 10, 0, &len);
    assert_int_equal(gw_http_feed(rq, in, len, &used, sink, &body), GW_HTTP_HEAD);
    used = 0;
    assert_int_equal(gw_http_feed(up, ans, sizeof(ans) - 1, &used, sink, &body), GW_HTTP_HEAD);
    const void *first = gw_http_msg(up)->headers;
    gw_http_parser_reset(up); /* the release */
    assert_int_equal(gw_wio_head_cached(true), 1);
    gw_http_parser_reset(rq); /* the request's end */
    assert_int_equal(gw_wio_head_cached(false), 1);
    used = 0;
    assert_int_equal(gw_http_feed(up, ans, sizeof(ans) - 1, &used, sink, &body), GW_HTTP_HEAD);
    assert_ptr_equal(gw_http_msg(up)->headers, first); /* the answer's own, not the request's */
    assert_int_equal(gw_wio_head_cached(true), 0);
    assert_int_equal(gw_wio_head_cached(false), 1);
    gw_http_parser_free(up);
    gw_http_parser_free(rq);
    free(in);
    for (size_t i = 0; i < GW_WIO_HEADS_ANSWER_MAX + 5; i++)
        gw_wio_head_give(malloc(GW_WIO_HEAD_BYTES), true);
    assert_int_equal(gw_wio_head_cached(true), GW_WIO_HEADS_ANSWER_MAX);
    (void)gw_wio_mem_tick(true);
    assert_int_equal(gw_wio_head_cached(true), 0);
    assert_int_equal(gw_wio_head_cached(false), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_head_small_storage),
        cmocka_unit_test(test_storage_moves_keep_strings),
        cmocka_unit_test(test_whole_heads_keep_their_own_strings),
        cmocka_unit_test(test_reset_reads_new_before_the_next_feed),
        cmocka_unit_test(test_small_head_block_from_thread_stack),
        cmocka_unit_test(test_answer_head_block_apart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
