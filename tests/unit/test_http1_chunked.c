/*
 * test_http1_chunked.c — chunked bodies de-chunked by the framing scan
 * alone with its fast paths (gateway/http1.c, the default: size lines and
 * the data's CRLF taken whole) against the reference path, the byte loop
 * then http-parser (gw_http_chunk_direct_set(false),
 * gw_http_vector_set(false)), on
 * generated messages: requests and responses, random chunk sizes, hex in
 * either case with leading zeros, extensions, trailers, pipelined bytes
 * after the end; one byte of each in three replaced by CR, LF, SP, HTAB,
 * ';', NUL, a hex or non-hex letter, or any byte; fed whole and in random
 * pieces; a small max_body_bytes and a body callback that refuses. The two
 * paths must agree on the state, status, reason, the body bytes delivered
 * and, unless an error stopped them, the bytes consumed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>

#include <cmocka.h>

#include "gateway/http1.h"

#define IN_CAP   8192
#define BODY_CAP 8192

typedef struct outcome {
    gw_http_state_t st;
    int status;
    char reason[48];
    size_t used;
    size_t body_len;
    char body[BODY_CAP];
} outcome_t;

typedef struct sink {
    outcome_t *o;
    size_t refuse_at; /* refuse the call that passes this many bytes; 0: never */
} sink_t;

static int sink_cb(void *arg, const char *at, size_t n)
{
    sink_t *s = arg;
    outcome_t *o = s->o;
    if (s->refuse_at && o->body_len + n > s->refuse_at)
        return -1;
    assert_true(o->body_len + n <= BODY_CAP);
    memcpy(o->body + o->body_len, at, n);
    o->body_len += n;
    return 0;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* Feeds in[0, n) in pieces (cuts[] of ncuts sizes, repeated; none: whole)
 * until the message ends or fails. */
static void run(gw_http_kind_t kind, const char *in, size_t n, const size_t *cuts, size_t ncuts,
                size_t max_body, size_t refuse_at, outcome_t *o)
{
    gw_http_limits_t lim = {
        .request_line_bytes = 8192,
        .header_bytes = 2048,
        .header_lines = 100,
        .max_body_bytes = max_body,
    };
    gw_http_parser_t *p = gw_http_parser_new(kind, &lim);
    assert_non_null(p);
    memset(o, 0, sizeof(*o));
    sink_t s = {o, refuse_at};
    size_t off = 0, k = 0;
    gw_http_state_t st = GW_HTTP_NEED_MORE;
    while (off < n && (st == GW_HTTP_NEED_MORE || st == GW_HTTP_HEAD)) {
        size_t piece = ncuts ? SL_MIN(cuts[k++ % ncuts], n - off) : n - off, used = 0;
        st = gw_http_feed(p, in + off, piece, &used, sink_cb, &s);
        off += used;
        if (used == 0 && st == GW_HTTP_NEED_MORE)
            break;
    }
    if (st == GW_HTTP_NEED_MORE || st == GW_HTTP_HEAD)
        st = gw_http_feed_eof(p, sink_cb, &s);
    o->st = st;
    o->used = off;
    o->status = gw_http_error_status(p);
    snprintf(o->reason, sizeof(o->reason), "%s", gw_http_error_reason(p));
    gw_http_parser_free(p);
}

/* A chunked message into out (returns its length): head, chunks, the last
 * chunk, trailers, maybe pipelined bytes. */
static size_t gen(gw_http_kind_t kind, char *out, size_t cap)
{
    size_t k = 0;
    const char *head = kind == GW_HTTP_REQUEST
                           ? "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n"
                             "Transfer-Encoding: chunked\r\n\r\n"
                           : "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             "Transfer-Encoding: chunked\r\n\r\n";
    k += (size_t)snprintf(out + k, cap - k, "%s", head);
    unsigned nchunks = rnd(10);
    for (unsigned c = 0; c < nchunks && k + 600 < cap; c++) {
        unsigned size = 1 + rnd(rnd(4) ? 300 : 3);
        const char *fmt = rnd(2) ? "%x" : "%X";
        if (rnd(8) == 0) /* leading zeros: up to 17 digits in all */
            k += (size_t)snprintf(out + k, cap - k, "%.*s", (int)(1 + rnd(15)), "000000000000000");
        k += (size_t)snprintf(out + k, cap - k, fmt, size);
        if (rnd(6) == 0)
            k += (size_t)snprintf(out + k, cap - k, ";ext=%u", rnd(1000));
        k += (size_t)snprintf(out + k, cap - k, "\r\n");
        for (unsigned i = 0; i < size; i++)
            out[k++] = (char)(rnd(4) ? 'a' + rnd(26) : rnd(256));
        k += (size_t)snprintf(out + k, cap - k, "\r\n");
    }
    k += (size_t)snprintf(out + k, cap - k, rnd(4) ? "0\r\n" : "000;last\r\n");
    if (rnd(5) == 0)
        k += (size_t)snprintf(out + k, cap - k, "X-Trailer: %u\r\n", rnd(100000));
    k += (size_t)snprintf(out + k, cap - k, "\r\n");
    if (rnd(3) == 0)
        k += (size_t)snprintf(out + k, cap - k, "GET / HTTP/1.1\r\n");
    return k;
}

static const char bad_bytes[] = {'\r', '\n', ' ', '\t', ';', '\0', 'f', 'g', '0', 'Z'};

static size_t ncompared, nerrors, ndone;

static void compare(gw_http_kind_t kind, const char *in, size_t n, const size_t *cuts, size_t ncuts,
                    size_t max_body, size_t refuse_at, unsigned iter)
{
    static outcome_t d, r;
    gw_http_chunk_direct_set(true);
    run(kind, in, n, cuts, ncuts, max_body, refuse_at, &d);
    gw_http_chunk_direct_set(false);
    gw_http_vector_set(false);
    run(kind, in, n, cuts, ncuts, max_body, refuse_at, &r);
    gw_http_vector_set(true);
    gw_http_chunk_direct_set(true);
    ncompared++;
    nerrors += d.st == GW_HTTP_ERROR;
    ndone += d.st == GW_HTTP_DONE;
    if (d.st != r.st || d.status != r.status || strcmp(d.reason, r.reason) != 0 ||
        d.body_len != r.body_len || memcmp(d.body, r.body, d.body_len) != 0 ||
        (d.st != GW_HTTP_ERROR && d.used != r.used)) {
        for (size_t q = 0; q < n; q++) /* the message, for a failure's record */
            fprintf(stderr, isprint((unsigned char)in[q]) ? "%c" : "\\x%02x", (unsigned char)in[q]);
        fprintf(stderr, "\n");
        fail_msg("message %u (%zu bytes, %zu cuts, max_body %zu, refuse %zu): direct st %d %d "
                 "%s used %zu body %zu; http-parser st %d %d %s used %zu body %zu",
                 iter, n, ncuts, max_body, refuse_at, d.st, d.status, d.reason, d.used, d.body_len,
                 r.st, r.status, r.reason, r.used, r.body_len);
    }
}

static void test_direct_is_http_parser(void **state)
{
    (void)state;
    static char in[IN_CAP];
    for (unsigned iter = 0; iter < 20000; iter++) {
        gw_http_kind_t kind = rnd(2) ? GW_HTTP_REQUEST : GW_HTTP_RESPONSE;
        size_t n = gen(kind, in, sizeof(in));
        if (rnd(3) == 0) { /* one byte past the head replaced */
            size_t at = 60 + rnd((uint32_t)(n - 60));
            in[at] = rnd(3) ? bad_bytes[rnd(sizeof(bad_bytes))] : (char)rnd(256);
        }
        size_t cuts[8], ncuts = rnd(3) ? 1 + rnd(8) : 0;
        for (size_t i = 0; i < ncuts; i++)
            cuts[i] = 1 + rnd(rnd(2) ? 8 : 200);
        size_t max_body = rnd(6) == 0 ? 200 + rnd(600) : 1 << 20;
        size_t refuse_at = rnd(8) == 0 ? 1 + rnd(600) : 0;
        compare(kind, in, n, cuts, ncuts, max_body, refuse_at, iter);
    }
    /* the generator reaches both ends and the errors */
    assert_true(ndone > ncompared / 3);
    assert_true(nerrors > ncompared / 10);
    printf("compared %zu messages: %zu complete, %zu errors\n", ncompared, ndone, nerrors);
}

/* The direct path's figures on fixed input: body, consumption, end. */
static void test_direct_fixed(void **state)
{
    (void)state;
    static const char in[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                             "5\r\nhello\r\n6;x=1\r\n world\r\n0\r\nT: 1\r\n\r\nNEXT";
    static const size_t one[] = {1};
    for (int w = 0; w < 2; w++) {
        static outcome_t o;
        run(GW_HTTP_RESPONSE, in, sizeof(in) - 1, one, w, 1 << 20, 0, &o);
        assert_int_equal(o.st, GW_HTTP_DONE);
        assert_int_equal(o.body_len, 11);
        assert_memory_equal(o.body, "hello world", 11);
        assert_int_equal(o.used, sizeof(in) - 1 - 4); /* "NEXT" left */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_direct_fixed),
        cmocka_unit_test(test_direct_is_http_parser),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
