/*
 * test_http1.c — the strict HTTP/1.1 adapter (gateway/http1.c): every error
 * class with its status and reason, every split of valid and invalid input
 * giving the same result, pipelining, keep-alive, responses, hop-by-hop.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <http_parser.h>

#include "gateway/http1.h"

/* ---- a driver that feeds input in given pieces and records the outcome ---- */

typedef struct run {
    gw_http_state_t st; /* DONE, ERROR or NEED_MORE after the last piece */
    int status;
    char reason[64];
    char head[4096]; /* gw_http_msg() serialised at GW_HTTP_HEAD */
    int heads;       /* times GW_HTTP_HEAD was returned */
    char body[16384];
    size_t body_len;
    size_t used; /* bytes consumed up to DONE/ERROR/the end */
} run_t;

static int body_sink(void *arg, const char *p, size_t n)
{
    run_t *r = arg;
    assert_true(r->body_len + n <= sizeof(r->body));
    memcpy(r->body + r->body_len, p, n);
    r->body_len += n;
    return 0;
}

static void snap(run_t *r, const gw_http_msg_t *m)
{
    int k =
        snprintf(r->head, sizeof(r->head), "%s|%.*s|%zu|%d|%d.%d|%lld|%d|%d|%d|%s",
                 m->method ? m->method : "-", (int)m->target_len, m->target ? m->target : "",
                 m->path_len, m->status, m->http_major, m->http_minor, (long long)m->content_length,
                 m->chunked, m->keep_alive, m->expect_continue, m->host ? m->host : "(null)");
    for (size_t i = 0; i < m->nheaders && k < (int)sizeof(r->head); i++) {
        const gw_http_header_t *h = &m->headers[i];
        assert_int_equal(strlen(h->name), h->name_len);
        assert_int_equal(strlen(h->value), h->value_len);
        k += snprintf(r->head + k, sizeof(r->head) - (size_t)k, "\n%s=[%s]", h->name, h->value);
    }
}

/* Feeds `in` cut at the sorted offsets cuts[0..ncuts). Stops at DONE/ERROR.
 * eof: call gw_http_feed_eof after the last piece when not done. */
static void run_cuts(gw_http_parser_t *p, const char *in, size_t len, const size_t *cuts,
                     size_t ncuts, bool eof, run_t *r)
{
    memset(r, 0, sizeof(*r));
    size_t start = 0;
    for (size_t c = 0; c <= ncuts; c++) {
        size_t end = c < ncuts ? cuts[c] : len;
        size_t off = start;
        for (;;) {
            size_t used = 99999;
            gw_http_state_t st = gw_http_feed(p, in + off, end - off, &used, body_sink, r);
            assert_true(used <= end - off);
            off += used;
            r->st = st;
            if (st == GW_HTTP_HEAD) {
                r->heads++;
                assert_non_null(gw_http_msg(p));
                snap(r, gw_http_msg(p));
                continue; /* feed on, even with nothing left */
            }
            if (st == GW_HTTP_NEED_MORE)
                assert_int_equal(off, end);
            break;
        }
        r->used = off;
        if (r->st == GW_HTTP_DONE || r->st == GW_HTTP_ERROR)
            break;
        start = end;
    }
    if (eof && r->st == GW_HTTP_NEED_MORE)
        r->st = gw_http_feed_eof(p, body_sink, r);
    assert_int_equal(r->st, gw_http_state(p));
    if (r->st == GW_HTTP_ERROR) {
        r->status = gw_http_error_status(p);
        snprintf(r->reason, sizeof(r->reason), "%s", gw_http_error_reason(p));
        r->used = 0; /* not meaningful after an error */
    } else {
        assert_int_equal(gw_http_body_bytes(p), r->body_len);
    }
}

static void assert_same(const run_t *a, const run_t *b)
{
    assert_int_equal(a->st, b->st);
    assert_int_equal(a->status, b->status);
    assert_string_equal(a->reason, b->reason);
    assert_int_equal(a->heads, b->heads);
    assert_string_equal(a->head, b->head);
    assert_int_equal(a->body_len, b->body_len);
    assert_memory_equal(a->body, b->body, a->body_len);
    assert_int_equal(a->used, b->used);
}

/* Parses `in` whole, then byte by byte, then in every 2-piece split, and
 * checks every way gives the same result; returns the whole-input result. */
static void run_all_splits(gw_http_kind_t kind, const gw_http_limits_t *lim, bool head_req,
                           const char *in, size_t len, bool eof, run_t *out)
{
    gw_http_parser_t *p = gw_http_parser_new(kind, lim);
    assert_non_null(p);
    run_t *r = malloc(sizeof(*r));
    size_t *cuts = malloc((len + 1) * sizeof(*cuts));
    assert_non_null(r);
    assert_non_null(cuts);

    gw_http_parser_reset(p);
    gw_http_parser_set_head_request(p, head_req);
    run_cuts(p, in, len, NULL, 0, eof, out);

    for (size_t i = 1; i < len; i++)
        cuts[i - 1] = i;
    gw_http_parser_reset(p);
    gw_http_parser_set_head_request(p, head_req);
    run_cuts(p, in, len, cuts, len ? len - 1 : 0, eof, r);
    assert_same(out, r);

    for (size_t i = 0; i <= len; i++) {
        gw_http_parser_reset(p);
        gw_http_parser_set_head_request(p, head_req);
        cuts[0] = i;
        run_cuts(p, in, len, cuts, 1, eof, r);
        assert_same(out, r);
    }
    free(cuts);
    free(r);
    gw_http_parser_free(p);
}

static const gw_http_limits_t lim_default = {
    .request_line_bytes = 8192,
    .header_bytes = 16384,
    .header_lines = 100,
    .max_body_bytes = 1 << 20,
};

/* ---- what Debian's http-parser does on its own (why the adapter exists) ---- */

static size_t raw_hp(const char *s, enum http_errno *err)
{
    http_parser hp;
    http_parser_settings st;
    http_parser_settings_init(&st);
    http_parser_init(&hp, HTTP_REQUEST);
    size_t r = http_parser_execute(&hp, &st, s, strlen(s));
    *err = HTTP_PARSER_ERRNO(&hp);
    return r;
}

static void test_debian_http_parser_is_lenient(void **state)
{
    (void)state;
    enum http_errno e;
    assert_int_equal(http_parser_version() >> 8, 0x0209);
    /* built with HTTP_PARSER_STRICT=0: a space inside a header name and
     * before the colon, and two spaces in the request line, pass */
    const char *a = "GET / HTTP/1.1\r\nHo st: a\r\nX : y\r\n\r\n";
    assert_int_equal(raw_hp(a, &e), strlen(a));
    assert_int_equal(e, HPE_OK);
    const char *b = "GET  /a\tb HTTP/1.1\r\nHost: a\r\n\r\n";
    assert_int_equal(raw_hp(b, &e), strlen(b));
    assert_int_equal(e, HPE_OK);
    /* and in any mode: bare LF, obs-fold, chunk size "5 " */
    const char *c = "GET / HTTP/1.1\nHost: a\n b\n\n";
    assert_int_equal(raw_hp(c, &e), strlen(c));
    assert_int_equal(e, HPE_OK);
    const char *d = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nabcde\r\n0\r\n\r\n";
    assert_int_equal(raw_hp(d, &e), strlen(d));
    assert_int_equal(e, HPE_OK);
}

/* ---- errors ---- */

typedef struct bad_case {
    const char *in;
    int status;
    const char *reason;
} bad_case_t;

#define H    "Host: a\r\n"
#define POST "POST /v1/chat/completions HTTP/1.1\r\n" H
#define TE   "Transfer-Encoding: chunked\r\n"

static const bad_case_t bad_requests[] = {
    /* smuggling: framing headers */
    {POST "Content-Length: 5\r\n" TE "\r\n0\r\n\r\n", 400, "cl_and_te"},
    {POST TE "Content-Length: 5\r\n\r\n0\r\n\r\n", 400, "cl_and_te"},
    {POST "Content-Length: 5\r\nContent-Length: 5\r\n\r\nabcde", 400, "duplicate_content_length"},
    {POST "Content-Length: 5\r\ncontent-length: 6\r\n\r\nabcdef", 400, "duplicate_content_length"},
    {POST "Content-Length: +5\r\n\r\nabcde", 400, "bad_content_length"},
    {POST "Content-Length: 0x5\r\n\r\nabcde", 400, "bad_content_length"},
    {POST "Content-Length: -1\r\n\r\n", 400, "bad_content_length"},
    {POST "Content-Length: 5 5\r\n\r\nabcde", 400, "bad_content_length"},
    {POST "Content-Length: 5,5\r\n\r\nabcde", 400, "bad_content_length"},
    {POST "Content-Length:\r\n\r\n", 400, "bad_content_length"},
    {POST "Content-Length: 99999999999999999999999\r\n\r\n", 400, "bad_content_length"},
    {POST "Content-Length : 5\r\n\r\nabcde", 400, "bad_header"},
    {POST "Content-Length:\v5\r\n\r\nabcde", 400, "bad_header_value"},
    {POST "Transfer-Encoding: gzip\r\n\r\n", 501, "unsupported_transfer_encoding"},
    {POST "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501,
     "unsupported_transfer_encoding"},
    {POST "Transfer-Encoding: chunked, gzip\r\n\r\n", 400, "bad_transfer_encoding"},
    {POST "Transfer-Encoding: chunked, chunked\r\n\r\n", 400, "bad_transfer_encoding"},
    {POST "Transfer-Encoding: chunked;x=1\r\n\r\n", 400, "bad_transfer_encoding"},
    {POST "Transfer-Encoding: , chunked\r\n\r\n", 400, "bad_transfer_encoding"},
    {POST "Transfer-Encoding:\r\n\r\n", 400, "bad_transfer_encoding"},
    {POST TE TE "\r\n0\r\n\r\n", 400, "bad_transfer_encoding"},
    {"POST / HTTP/1.0\r\n" TE "\r\n0\r\n\r\n", 400, "bad_transfer_encoding"},
    /* chunk sizes */
    {POST TE "\r\n0x5\r\nabcde\r\n0\r\n\r\n", 400, "bad_chunk_size"},
    {POST TE "\r\n+5\r\nabcde\r\n0\r\n\r\n", 400, "bad_chunk_size"},
    {POST TE "\r\n5 \r\nabcde\r\n0\r\n\r\n", 400, "bad_chunk_size"},
    {POST TE "\r\n 5\r\nabcde\r\n0\r\n\r\n", 400, "bad_chunk_size"},
    {POST TE "\r\n5 ;a=b\r\nabcde\r\n0\r\n\r\n", 400, "bad_chunk_size"},
    {POST TE "\r\n-5\r\nabcde\r\n0\r\n\r\n", 400, "bad_chunk_size"},
    {POST TE "\r\n\r\nabcde\r\n0\r\n\r\n", 400, "bad_chunk_size"},
    {POST TE "\r\nfffffffffffffffff\r\nabcde\r\n0\r\n\r\n", 400, "bad_chunk_size"},
    {POST TE "\r\n8000000000000000\r\nabcde\r\n0\r\n\r\n", 400, "bad_chunk_size"},
    {POST TE "\r\n5\nabcde\r\n0\r\n\r\n", 400, "bare_lf"},
    {POST TE "\r\n5\rabcde\r\n0\r\n\r\n", 400, "bare_cr"},
    {POST TE "\r\n5\r\nabcdef\r\n0\r\n\r\n", 400, "bad_chunk"},
    {POST TE "\r\n5\r\nabcde\n0\r\n\r\n", 400, "bare_lf"},
    {POST TE "\r\n5;a\x01\r\nabcde\r\n0\r\n\r\n", 400, "bad_chunk_ext"},
    {POST TE "\r\n0\r\n\r\r\n", 400, "bare_cr"},
    {POST TE "\r\n0\r\nX: y\n\r\n", 400, "bare_lf"},
    {POST TE "\r\n0\r\nX: y\r\n z\r\n\r\n", 400, "obs_fold"},
    /* line ends, folding, bytes */
    {"GET / HTTP/1.1\r\nHost: a\n\r\n", 400, "bare_lf"},
    {"GET / HTTP/1.1\nHost: a\r\n\r\n", 400, "bare_lf"},
    {"GET / HTTP/1.1\r\nHost: a\r\n\n", 400, "bare_lf"},
    {"GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n", 400, "bare_cr"},
    {"GET / HTTP/1.1\rHost: a\r\n\r\n", 400, "bare_cr"},
    {"GET / HTTP/1.1\r\nHost: a\r\n\r\r\n", 400, "bare_cr"},
    {"\rGET / HTTP/1.1\r\nHost: a\r\n\r\n", 400, "bare_cr"},
    {"\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 400, "bare_lf"},
    {"GET / HTTP/1.1\r\nHost: a\r\nX: b\r\n c\r\n\r\n", 400, "obs_fold"},
    {"GET / HTTP/1.1\r\nHost: a\r\nX: b\r\n\tc\r\n\r\n", 400, "obs_fold"},
    {"GET / HTTP/1.1\r\n Host: a\r\n\r\n", 400, "obs_fold"},
    {"GET / HTTP/1.1\r\nHost: a\x01\r\n\r\n", 400, "bad_header_value"},
    {"GET / HTTP/1.1\r\nHost: a\r\nX: a\x7f\r\n\r\n", 400, "bad_header_value"},
    {"GET / HTTP/1.1\r\nHo st: a\r\n\r\n", 400, "bad_header"},
    {"GET / HTTP/1.1\r\nHost a\r\n\r\n", 400, "bad_header"},
    {"GET / HTTP/1.1\r\n: a\r\n\r\n", 400, "bad_header"},
    {"GET / HTTP/1.1\r\nH\xc3\xa9: a\r\n\r\n", 400, "bad_header"},
    /* request line */
    {"GET  / HTTP/1.1\r\n" H "\r\n", 400, "bad_request_line"},
    {"GET / HTTP/1.1 \r\n" H "\r\n", 400, "bad_request_line"},
    {"GET /  HTTP/1.1\r\n" H "\r\n", 400, "bad_request_line"},
    {"GET /\r\n\r\n", 400, "bad_request_line"},
    {" GET / HTTP/1.1\r\n" H "\r\n", 400, "bad_request_line"},
    {"GET /a\tb HTTP/1.1\r\n" H "\r\n", 400, "bad_target"},
    {"GET /\xc3\xa9 HTTP/1.1\r\n" H "\r\n", 400, "bad_target"},
    {"GET /a#b HTTP/1.1\r\n" H "\r\n", 400, "bad_target"},
    {"GET http://a/ HTTP/1.1\r\n" H "\r\n", 400, "bad_target"},
    {"GET * HTTP/1.1\r\n" H "\r\n", 400, "bad_target"},
    {"OPTIONS * HTTP/1.1\r\n" H "\r\n", 400, "bad_target"},
    {"GET / HTTP/2.0\r\n" H "\r\n", 505, "http_version"},
    {"GET / HTTP/0.9\r\n" H "\r\n", 505, "http_version"},
    {"GET / HTTP/1.2\r\n" H "\r\n", 505, "http_version"},
    {"GET / HTTP/1.10\r\n" H "\r\n", 400, "bad_version"},
    {"GET / HTTP/1\r\n" H "\r\n", 400, "bad_version"},
    {"GET / http/1.1\r\n" H "\r\n", 400, "bad_version"},
    {"FOO / HTTP/1.1\r\n" H "\r\n", 501, "unknown_method"},
    {"get / HTTP/1.1\r\n" H "\r\n", 501, "unknown_method"},
    {"CONNECT a:443 HTTP/1.1\r\n" H "\r\n", 501, "connect"},
    {"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, "bad_request_line"},
    /* Host */
    {"GET / HTTP/1.1\r\n\r\n", 400, "missing_host"},
    {"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400, "duplicate_host"},
    {"GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", 400, "duplicate_host"},
    {"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400, "duplicate_host"},
    {"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "bad_host"},
    {"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400, "bad_host"},
    {"GET / HTTP/1.1\r\nHost: u@a\r\n\r\n", 400, "bad_host"},
    /* Expect */
    {POST "Expect: 200-ok\r\nContent-Length: 1\r\n\r\nx", 417, "expectation_failed"},
    {POST "Expect: 100-continue, foo\r\nContent-Length: 1\r\n\r\nx", 417, "expectation_failed"},
    {POST "Expect:\r\nContent-Length: 1\r\n\r\nx", 417, "expectation_failed"},
    /* body */
    {POST "Content-Length: 1048577\r\n\r\n", 413, "body_too_large"},
    /* issue 15.2: credentials and request ids once */
    {POST "Authorization: Bearer a\r\nauthorization: Bearer b\r\n\r\n", 400, "duplicate_header"},
    {POST "X-Sluice-Signature: a\r\nX-Sluice-Signature: a\r\n\r\n", 400, "duplicate_header"},
    {POST "X-Sluice-Nonce: a\r\nX-A: 1\r\nX-Sluice-Nonce: b\r\n\r\n", 400, "duplicate_header"},
    {POST "X-Sluice-Timestamp: 1\r\nX-SLUICE-TIMESTAMP: 2\r\n\r\n", 400, "duplicate_header"},
    {POST "Idempotency-Key: k\r\nIdempotency-Key: k\r\n\r\n", 400, "duplicate_header"},
    {POST "X-Request-Id: r\r\nX-Request-Id: s\r\n\r\n", 400, "duplicate_header"},
    /* issue 15.4: OWS is SP and HTAB only; other bytes still fail */
    {POST "Content-Length: \v1\r\n\r\nx", 400, "bad_header_value"},
    {POST "Content-Length: 1\t2\r\n\r\nx", 400, "bad_content_length"},
    {POST "Transfer-Encoding: \tchunked\t,\r\n\r\n0\r\n\r\n", 400, "bad_transfer_encoding"},
};

static void test_bad_requests(void **state)
{
    (void)state;
    run_t r;
    for (size_t i = 0; i < SL_ARRAY_LEN(bad_requests); i++) {
        const bad_case_t *c = &bad_requests[i];
        run_all_splits(GW_HTTP_REQUEST, &lim_default, false, c->in, strlen(c->in), false, &r);
        if (r.st != GW_HTTP_ERROR || r.status != c->status || strcmp(r.reason, c->reason) != 0)
            fail_msg("case %zu %s: got st=%d %d %s, want %d %s", i, c->in, r.st, r.status, r.reason,
                     c->status, c->reason);
        /* nothing of an erroneous message reached the body callback, except
         * chunks before a bad chunk line */
        if (strncmp(c->reason, "bad_chunk", 9) != 0 && strcmp(c->reason, "bare_lf") &&
            strcmp(c->reason, "bare_cr") && strcmp(c->reason, "obs_fold"))
            assert_int_equal(r.body_len, 0);
    }
}

/* Errors are final: further input is refused with consumed 0. */
static void test_error_is_sticky(void **state)
{
    (void)state;
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    size_t used;
    const char *in = "GET / HTTP/1.1\nHost: a\r\n\r\n";
    assert_int_equal(gw_http_feed(p, in, strlen(in), &used, NULL, NULL), GW_HTTP_ERROR);
    assert_int_equal(gw_http_error_status(p), 400);
    assert_null(gw_http_msg(p));
    assert_int_equal(gw_http_feed(p, "GET", 3, &used, NULL, NULL), GW_HTTP_ERROR);
    assert_int_equal(used, 0);
    assert_int_equal(gw_http_feed_eof(p, NULL, NULL), GW_HTTP_ERROR);
    gw_http_parser_reset(p);
    assert_int_equal(gw_http_error_status(p), 0);
    assert_string_equal(gw_http_error_reason(p), "");
    in = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    assert_int_equal(gw_http_feed(p, in, strlen(in), &used, NULL, NULL), GW_HTTP_HEAD);
    gw_http_parser_free(p);
    gw_http_parser_free(NULL);
}

/* ---- size limits: exactly at the limit passes, one past fails ---- */

static const gw_http_limits_t lim_small = {
    .request_line_bytes = 64,
    .header_bytes = 256,
    .header_lines = 5,
    .max_body_bytes = 100,
};

static void expect_ok(const char *in, size_t len, run_t *r)
{
    run_all_splits(GW_HTTP_REQUEST, &lim_small, false, in, len, false, r);
    if (r->st != GW_HTTP_DONE)
        fail_msg("want DONE, got %d %d %s for %s", r->st, r->status, r->reason, in);
}

static void expect_err(const char *in, size_t len, int status, const char *reason)
{
    run_t r;
    run_all_splits(GW_HTTP_REQUEST, &lim_small, false, in, len, false, &r);
    if (r.st != GW_HTTP_ERROR || r.status != status || strcmp(r.reason, reason) != 0)
        fail_msg("want %d %s, got %d %d %s for %s", status, reason, r.st, r.status, r.reason, in);
}

static void test_limit_request_line(void **state)
{
    (void)state;
    char in[512], target[128];
    run_t r;
    /* "GET " + target + " HTTP/1.1" == 64 bytes */
    size_t tl = 64 - strlen("GET  HTTP/1.1");
    memset(target, 'a', sizeof(target));
    target[0] = '/';
    snprintf(in, sizeof(in), "GET %.*s HTTP/1.1\r\nHost: a\r\n\r\n", (int)tl, target);
    expect_ok(in, strlen(in), &r);
    assert_int_equal(strchr(in, '\r') - in, 64);
    snprintf(in, sizeof(in), "GET %.*s HTTP/1.1\r\nHost: a\r\n\r\n", (int)tl + 1, target);
    expect_err(in, strlen(in), 414, "uri_too_long");
    /* the limit bites before the line ends */
    snprintf(in, sizeof(in), "GET %.*s", (int)tl + 20, target);
    expect_err(in, strlen(in), 414, "uri_too_long");
}

static void test_limit_header_bytes(void **state)
{
    (void)state;
    char in[512], pad[300];
    run_t r;
    memset(pad, 'v', sizeof(pad));
    const char *fmt = "GET / HTTP/1.1\r\nHost: a\r\nX: %.*s\r\n\r\n";
    size_t base = strlen("GET / HTTP/1.1\r\nHost: a\r\nX: \r\n\r\n");
    snprintf(in, sizeof(in), fmt, (int)(256 - base), pad);
    assert_int_equal(strlen(in), 256);
    expect_ok(in, strlen(in), &r);
    snprintf(in, sizeof(in), fmt, (int)(257 - base), pad);
    expect_err(in, strlen(in), 431, "header_too_large");
    /* leading empty lines count too */
    snprintf(in, sizeof(in),
             "\r\n"
             "GET / HTTP/1.1\r\nHost: a\r\nX: %.*s\r\n\r\n",
             (int)(256 - base), pad);
    expect_err(in, strlen(in), 431, "header_too_large");
    /* the trailer section of a chunked body has the same bound */
    snprintf(in, sizeof(in), "POST / HTTP/1.1\r\nHost: a\r\n" TE "\r\n0\r\nX: %.*s\r\n\r\n", 300,
             pad);
    expect_err(in, strlen(in), 431, "header_too_large");
}

static void test_limit_header_lines(void **state)
{
    (void)state;
    run_t r;
    const char *five = "GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\nD:\r\n\r\n";
    expect_ok(five, strlen(five), &r);
    assert_non_null(strstr(r.head, "\nD=[]"));
    const char *six = "GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\nD:\r\nE: 5\r\n\r\n";
    expect_err(six, strlen(six), 431, "too_many_headers");
}

static void test_limit_body(void **state)
{
    (void)state;
    char in[1024], body[200];
    run_t r;
    memset(body, 'b', sizeof(body));
    snprintf(in, sizeof(in), "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n%.100s",
             body);
    expect_ok(in, strlen(in), &r);
    assert_int_equal(r.body_len, 100);
    snprintf(in, sizeof(in), "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 101\r\n\r\n%.101s",
             body);
    expect_err(in, strlen(in), 413, "body_too_large");
    /* chunked: counted as the chunk sizes arrive (60 + 40 = 100 ok) */
    snprintf(in, sizeof(in),
             "POST / HTTP/1.1\r\nHost: a\r\n" TE "\r\n3c\r\n%.60s\r\n28\r\n%.40s\r\n0\r\n\r\n",
             body, body);
    expect_ok(in, strlen(in), &r);
    assert_int_equal(r.body_len, 100);
    snprintf(in, sizeof(in),
             "POST / HTTP/1.1\r\nHost: a\r\n" TE "\r\n3c\r\n%.60s\r\n29\r\n%.41s\r\n0\r\n\r\n",
             body, body);
    expect_err(in, strlen(in), 413, "body_too_large");
}

/* ---- valid requests at every split ---- */

static void test_valid_get(void **state)
{
    (void)state;
    run_t r;
    const char *in = "GET /v1/models?x=1&y=2 HTTP/1.1\r\n"
                     "Host: api.example.com:8080\r\n"
                     "User-Agent:   curl/7.88 \t \r\n"
                     "Accept: */*\r\n"
                     "X-Empty:\r\n"
                     "X-Obs: caf\xc3\xa9  x\r\n"
                     "\r\n";
    run_all_splits(GW_HTTP_REQUEST, &lim_default, false, in, strlen(in), false, &r);
    assert_int_equal(r.st, GW_HTTP_DONE);
    assert_int_equal(r.heads, 1);
    assert_int_equal(r.used, strlen(in));
    assert_string_equal(r.head, "GET|/v1/models?x=1&y=2|10|0|1.1|-1|0|1|0|api.example.com:8080"
                                "\nHost=[api.example.com:8080]"
                                "\nUser-Agent=[curl/7.88]"
                                "\nAccept=[*/*]"
                                "\nX-Empty=[]"
                                "\nX-Obs=[caf\xc3\xa9  x]");
    assert_int_equal(r.body_len, 0);
}

static void test_valid_post_content_length(void **state)
{
    (void)state;
    run_t r;
    const char *in = "\r\n\r\nPOST /v1/chat/completions HTTP/1.1\r\n"
                     "Host: a\r\n"
                     "Content-Type: application/json\r\n"
                     "Content-Length:  17 \r\n"
                     "\r\n"
                     "{\"model\":\"m\",\"x\"}";
    run_all_splits(GW_HTTP_REQUEST, &lim_default, false, in, strlen(in), false, &r);
    assert_int_equal(r.st, GW_HTTP_DONE);
    assert_int_equal(r.used, strlen(in));
    assert_string_equal(r.head, "POST|/v1/chat/completions|20|0|1.1|17|0|1|0|a"
                                "\nHost=[a]\nContent-Type=[application/json]"
                                "\nContent-Length=[17]");
    assert_int_equal(r.body_len, 17);
    assert_memory_equal(r.body, "{\"model\":\"m\",\"x\"}", 17);
}

/* RFC 9110 5.6.3: OWS is SP or HTAB on either side of a value; the adapter
 * and http-parser agree on it for the framing headers too (issue 15.4). */
static void test_valid_ows_tabs(void **state)
{
    (void)state;
    run_t r;
    const char *in = "POST /v1/chat/completions HTTP/1.1\r\n"
                     "Host:\ta\t\r\n"
                     "Content-Length: \t2\t \r\n"
                     "\r\n"
                     "{}";
    run_all_splits(GW_HTTP_REQUEST, &lim_default, false, in, strlen(in), false, &r);
    assert_int_equal(r.st, GW_HTTP_DONE);
    assert_int_equal(r.used, strlen(in));
    assert_string_equal(r.head, "POST|/v1/chat/completions|20|0|1.1|2|0|1|0|a"
                                "\nHost=[a]\nContent-Length=[2]");
    assert_int_equal(r.body_len, 2);
    const char *te = "POST /v1/embeddings HTTP/1.1\r\n"
                     "Host: a\r\n"
                     "Transfer-Encoding:\tchunked\t\r\n"
                     "\r\n"
                     "2\r\n{}\r\n0\r\n\r\n";
    run_all_splits(GW_HTTP_REQUEST, &lim_default, false, te, strlen(te), false, &r);
    assert_int_equal(r.st, GW_HTTP_DONE);
    assert_int_equal(r.used, strlen(te));
    assert_int_equal(r.body_len, 2);
    assert_non_null(strstr(r.head, "\nTransfer-Encoding=[chunked]"));
}

static void test_valid_post_chunked(void **state)
{
    (void)state;
    run_t r;
    const char *in = "POST /v1/embeddings HTTP/1.1\r\n"
                     "Host: a\r\n"
                     "Transfer-Encoding: Chunked\r\n"
                     "\r\n"
                     "5;name=val;q=\"x y\"\r\nhello\r\n"
                     "001\r\n \r\n"
                     "A\r\n0123456789\r\n"
                     "0\r\n"
                     "X-Trailer: t\r\n"
                     "\r\n";
    run_all_splits(GW_HTTP_REQUEST, &lim_default, false, in, strlen(in), false, &r);
    assert_int_equal(r.st, GW_HTTP_DONE);
    assert_int_equal(r.used, strlen(in));
    assert_string_equal(r.head, "POST|/v1/embeddings|14|0|1.1|-1|1|1|0|a"
                                "\nHost=[a]\nTransfer-Encoding=[Chunked]");
    assert_int_equal(r.body_len, 16);
    assert_memory_equal(r.body, "hello 0123456789", 16);
}

static void test_expect_continue(void **state)
{
    (void)state;
    run_t r;
    const char *in = POST "Expect: 100-Continue\r\nContent-Length: 2\r\n\r\nhi";
    run_all_splits(GW_HTTP_REQUEST, &lim_default, false, in, strlen(in), false, &r);
    assert_int_equal(r.st, GW_HTTP_DONE);
    assert_non_null(strstr(r.head, "|2|0|1|1|a\n"));
    /* HTTP/1.0 has no 100 Continue: accepted, not reported */
    const char *in10 = "POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi";
    run_all_splits(GW_HTTP_REQUEST, &lim_default, false, in10, strlen(in10), false, &r);
    assert_int_equal(r.st, GW_HTTP_DONE);
    assert_non_null(strstr(r.head, "|2|0|0|0|(null)\n"));
}

/* The head is reported before any body byte, and with no body the DONE
 * comes from the next feed, even an empty one. */
static void test_head_then_done(void **state)
{
    (void)state;
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    size_t used;
    run_t r = {0};
    const char *in = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc";
    size_t hl = strlen(in) - 3;
    assert_false(gw_http_started(p));
    assert_int_equal(gw_http_feed(p, in, 0, &used, body_sink, &r), GW_HTTP_NEED_MORE);
    assert_false(gw_http_started(p));
    assert_int_equal(gw_http_feed(p, in, strlen(in), &used, body_sink, &r), GW_HTTP_HEAD);
    assert_true(gw_http_started(p));
    assert_int_equal(used, hl);
    assert_int_equal(r.body_len, 0);
    assert_int_equal(gw_http_feed(p, in + hl, 2, &used, body_sink, &r), GW_HTTP_NEED_MORE);
    assert_int_equal(used, 2);
    assert_int_equal(gw_http_body_bytes(p), 2);
    assert_int_equal(gw_http_feed(p, in + hl + 2, 1, &used, body_sink, &r), GW_HTTP_DONE);
    assert_int_equal(used, 1);
    assert_memory_equal(r.body, "abc", 3);
    assert_int_equal(gw_http_feed(p, "GET", 3, &used, body_sink, &r), GW_HTTP_DONE);
    assert_int_equal(used, 0);

    gw_http_parser_reset(p);
    assert_false(gw_http_started(p));
    in = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    assert_int_equal(gw_http_feed(p, in, strlen(in), &used, NULL, NULL), GW_HTTP_HEAD);
    assert_int_equal(used, strlen(in));
    assert_int_equal(gw_http_state(p), GW_HTTP_HEAD);
    assert_int_equal(gw_http_feed(p, NULL, 0, &used, NULL, NULL), GW_HTTP_DONE);
    assert_int_equal(used, 0);
    assert_int_equal(gw_http_feed_eof(p, NULL, NULL), GW_HTTP_DONE);
    gw_http_parser_free(p);
}

static void test_pipelined(void **state)
{
    (void)state;
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    const char *in = "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"
                     "GET /b HTTP/1.1\r\nHost: b\r\n\r\n"
                     "POST /c HTTP/1.1\r\nHost: c\r\n" TE "\r\n2\r\nxy\r\n0\r\n\r\n"
                     "GET /d HTTP/1.1\r\nHost: d\r\n\r\n";
    const char *targets[] = {"/a", "/b", "/c", "/d"};
    const char *bodies[] = {"abc", "", "xy", ""};
    size_t len = strlen(in), off = 0;
    for (int i = 0; i < 4; i++) {
        run_t r = {0};
        size_t used;
        gw_http_parser_reset(p);
        gw_http_state_t st = gw_http_feed(p, in + off, len - off, &used, body_sink, &r);
        assert_int_equal(st, GW_HTTP_HEAD);
        assert_string_equal(gw_http_msg(p)->target, targets[i]);
        off += used;
        st = gw_http_feed(p, in + off, len - off, &used, body_sink, &r);
        assert_int_equal(st, GW_HTTP_DONE);
        off += used;
        assert_int_equal(r.body_len, strlen(bodies[i]));
        assert_memory_equal(r.body, bodies[i], r.body_len);
        /* the bytes left start the next request */
        if (i < 3)
            assert_memory_equal(in + off, i == 0 || i == 2 ? "GET" : "POST", 3);
    }
    assert_int_equal(off, len);
    gw_http_parser_free(p);
}

static void test_keep_alive(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        bool ka;
    } cases[] = {
        {"GET / HTTP/1.1\r\nHost: a\r\n\r\n", true},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", false},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, CLOSE\r\n\r\n", false},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n", true},
        {"GET / HTTP/1.0\r\n\r\n", false},
        {"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", true},
        {"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\nHost: a\r\n\r\n", true},
        /* read as http-parser reads them: Proxy-Connection counts too, and
         * every Connection line */
        {"GET / HTTP/1.1\r\nHost: a\r\nProxy-Connection: close\r\n\r\n", false},
        {"GET / HTTP/1.0\r\nProxy-Connection: keep-alive\r\n\r\n", true},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n", false},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: closed\r\n\r\n", true},
        {"GET / HTTP/1.0\r\nConnection: keep-alives\r\n\r\n", false},
        /* one walk finds both tokens, either order, any case, between
         * commas, spaces and tabs */
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, close\r\n\r\n", false},
        {"GET / HTTP/1.0\r\nConnection: close, keep-alive\r\n\r\n", true}, /* as http-parser */
        {"GET / HTTP/1.0\r\nConnection: te,\tKEEP-ALIVE\r\n\r\n", true},
        {"GET / HTTP/1.0\r\nConnection: ,, keep-alive ,\r\n\r\n", true},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: te ,,Close\r\n\r\n", false},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive clos\r\n\r\n", true},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alivE close\r\n\r\n", false},
        {"GET / HTTP/1.0\r\nConnection: xkeep-alive\r\n\r\n", false},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
        size_t used;
        assert_int_equal(gw_http_feed(p, cases[i].in, strlen(cases[i].in), &used, NULL, NULL),
                         GW_HTTP_HEAD);
        if (gw_http_msg(p)->keep_alive != cases[i].ka)
            fail_msg("case %zu: keep_alive %d", i, gw_http_msg(p)->keep_alive);
        assert_int_equal(gw_http_feed(p, NULL, 0, &used, NULL, NULL), GW_HTTP_DONE);
        gw_http_parser_free(p);
    }
}

/* An Upgrade request is served as plain HTTP/1.1 (the header is
 * hop-by-hop, never forwarded); the bytes after it are the next request. */
static void resp_ok(const char *in, bool head_req, bool eof, run_t *r);

/* Keep-alive of answers: HTTP/1.0 needs the token, a close-delimited body
 * never keeps the connection. */
static void test_response_keep_alive(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        bool ka;
    } cases[] = {
        {"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", true},
        {"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", false},
        {"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", false},
        {"HTTP/1.0 200 OK\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n", true},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", true},
        {"HTTP/1.1 200 OK\r\n\r\n", false},
        {"HTTP/1.1 204 No Content\r\n\r\n", true},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_RESPONSE, NULL);
        size_t used;
        assert_int_equal(gw_http_feed(p, cases[i].in, strlen(cases[i].in), &used, NULL, NULL),
                         GW_HTTP_HEAD);
        if (gw_http_msg(p)->keep_alive != cases[i].ka)
            fail_msg("case %zu: keep_alive %d", i, gw_http_msg(p)->keep_alive);
        gw_http_parser_free(p);
    }
}

/* The method is looked up in http-parser's table (the head never reaches
 * http-parser): every method it knows passes, CONNECT is refused by us,
 * anything else is 501 at the end of the method, before any later error. */
static void test_methods(void **state)
{
    (void)state;
    run_t r;
    char in[256];
    int n = 0;
    for (int i = 0;; i++) {
        const char *m = http_method_str((enum http_method)i);
        if (strcmp(m, "<unknown>") == 0)
            break;
        snprintf(in, sizeof(in), "%s / HTTP/1.1\r\nHost: a\r\n\r\n", m);
        run_all_splits(GW_HTTP_REQUEST, &lim_default, false, in, strlen(in), false, &r);
        if (strcmp(m, "CONNECT") == 0) {
            assert_int_equal(r.st, GW_HTTP_ERROR);
            assert_string_equal(r.reason, "connect");
        } else {
            if (r.st != GW_HTTP_DONE)
                fail_msg("%s: state %d (%s)", m, r.st, r.reason);
            assert_int_equal(strncmp(r.head, m, strlen(m)), 0);
        }
        n++;
    }
    assert_true(n >= 30); /* http-parser 2.9 has 34 */
    static const char *const unknown[] = {
        "GE / HTTP/1.1\r\nHost: a\r\n\r\n",      "GETS / HTTP/1.1\r\nHost: a\r\n\r\n",
        "Post / HTTP/1.1\r\nHost: a\r\n\r\n",    "FOO / HTTP/1.1\r\nBad Header: x\r\n\r\n",
        "FOO /\x01 HTTP/1.1\r\nHost: a\r\n\r\n",
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(unknown); i++) {
        run_all_splits(GW_HTTP_REQUEST, &lim_default, false, unknown[i], strlen(unknown[i]), false,
                       &r);
        assert_int_equal(r.st, GW_HTTP_ERROR);
        assert_int_equal(r.status, 501);
        assert_string_equal(r.reason, "unknown_method");
    }
}

/* Chunked bodies after heads http-parser never saw: after interim heads,
 * a request's, and pipelined bytes left where the message ends. */
static void test_chunked_after_own_head(void **state)
{
    (void)state;
    run_t r;
    const char *in = "HTTP/1.1 100 Continue\r\n\r\n"
                     "HTTP/1.1 200 OK\r\n" TE "\r\n"
                     "3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: 1\r\n\r\nHTTP/1.1";
    resp_ok(in, false, false, &r);
    assert_int_equal(r.heads, 1);
    assert_int_equal(r.body_len, 5);
    assert_memory_equal(r.body, "abcde", 5);
    assert_int_equal(r.used, strlen(in) - 8);
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    const char *req = "POST /a HTTP/1.1\r\nHost: a\r\n" TE "\r\n4\r\nwxyz\r\n0\r\n\r\n"
                      "GET /b HTTP/1.1\r\nHost: b\r\n\r\n";
    size_t used, off = 0;
    run_t body = {0};
    assert_int_equal(gw_http_feed(p, req, strlen(req), &used, body_sink, &body), GW_HTTP_HEAD);
    off += used;
    assert_true(gw_http_msg(p)->chunked);
    assert_int_equal(gw_http_feed(p, req + off, strlen(req) - off, &used, body_sink, &body),
                     GW_HTTP_DONE);
    off += used;
    assert_int_equal(body.body_len, 4);
    assert_memory_equal(body.body, "wxyz", 4);
    assert_string_equal(req + off, "GET /b HTTP/1.1\r\nHost: b\r\n\r\n");
    gw_http_parser_reset(p);
    assert_int_equal(gw_http_feed(p, req + off, strlen(req) - off, &used, NULL, NULL),
                     GW_HTTP_HEAD);
    assert_false(gw_http_msg(p)->chunked);
    assert_int_equal(gw_http_feed(p, NULL, 0, &used, NULL, NULL), GW_HTTP_DONE);
    gw_http_parser_free(p);
}

static void test_upgrade_ignored(void **state)
{
    (void)state;
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    const char *in = "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                     "Upgrade: h2c\r\nHTTP2-Settings: AAA\r\n\r\nGET";
    size_t used;
    assert_int_equal(gw_http_feed(p, in, strlen(in), &used, NULL, NULL), GW_HTTP_HEAD);
    assert_int_equal(gw_http_feed(p, in + used, 3, &used, NULL, NULL), GW_HTTP_DONE);
    assert_int_equal(used, 0);
    gw_http_parser_free(p);
}

static void test_eof_request(void **state)
{
    (void)state;
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    size_t used;
    /* idle close: nothing lost */
    assert_int_equal(gw_http_feed_eof(p, NULL, NULL), GW_HTTP_NEED_MORE);
    /* mid-head */
    assert_int_equal(gw_http_feed(p, "GET / HT", 8, &used, NULL, NULL), GW_HTTP_NEED_MORE);
    assert_int_equal(gw_http_feed_eof(p, NULL, NULL), GW_HTTP_ERROR);
    assert_string_equal(gw_http_error_reason(p), "truncated");
    /* mid-body */
    gw_http_parser_reset(p);
    const char *in = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nab";
    assert_int_equal(gw_http_feed(p, in, strlen(in), &used, NULL, NULL), GW_HTTP_HEAD);
    assert_int_equal(gw_http_feed(p, in + used, strlen(in) - used, &used, NULL, NULL),
                     GW_HTTP_NEED_MORE);
    assert_int_equal(gw_http_feed_eof(p, NULL, NULL), GW_HTTP_ERROR);
    gw_http_parser_free(p);
}

static int body_fail(void *arg, const char *p, size_t n)
{
    (void)arg;
    (void)p;
    (void)n;
    return -1;
}

static void test_body_callback_error(void **state)
{
    (void)state;
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    const char *in = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nabcde";
    size_t used;
    assert_int_equal(gw_http_feed(p, in, strlen(in), &used, body_fail, NULL), GW_HTTP_HEAD);
    assert_int_equal(gw_http_feed(p, in + used, 5, &used, body_fail, NULL), GW_HTTP_ERROR);
    assert_int_equal(gw_http_error_status(p), 500);
    assert_string_equal(gw_http_error_reason(p), "body_callback");
    gw_http_parser_free(p);
}

/* ---- responses ---- */

static void resp_ok(const char *in, bool head_req, bool eof, run_t *r)
{
    gw_http_limits_t lim = lim_default;
    lim.max_body_bytes = 0;
    run_all_splits(GW_HTTP_RESPONSE, &lim, head_req, in, strlen(in), eof, r);
    if (r->st != GW_HTTP_DONE)
        fail_msg("want DONE, got %d %d %s for %s", r->st, r->status, r->reason, in);
}

static void test_response_content_length(void **state)
{
    (void)state;
    run_t r;
    resp_ok("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
            false, false, &r);
    assert_string_equal(r.head, "-||0|200|1.1|2|0|1|0|(null)"
                                "\nContent-Type=[application/json]\nContent-Length=[2]");
    assert_int_equal(r.body_len, 2);
    /* no reason phrase; HTTP/1.0 without keep-alive */
    resp_ok("HTTP/1.0 404\r\nContent-Length: 0\r\n\r\n", false, false, &r);
    assert_string_equal(r.head, "-||0|404|1.0|0|0|0|0|(null)\nContent-Length=[0]");
}

static void test_response_chunked(void **state)
{
    (void)state;
    run_t r;
    resp_ok("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" TE "\r\n"
            "f\r\ndata: {\"a\":1}\n\n\r\n"
            "e\r\ndata: [DONE]\n\n\r\n"
            "0\r\n\r\n",
            false, false, &r);
    assert_int_equal(r.body_len, 29);
    assert_memory_equal(r.body, "data: {\"a\":1}\n\ndata: [DONE]\n\n", 29);
    assert_non_null(strstr(r.head, "|-1|1|1|"));
}

static void test_response_close_delimited(void **state)
{
    (void)state;
    run_t r;
    resp_ok("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nhello, world", false, true, &r);
    assert_int_equal(r.body_len, 12);
    assert_non_null(strstr(r.head, "|-1|0|0|")); /* not keep-alive */
    /* without the EOF it never completes */
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_RESPONSE, NULL);
    const char *in = "HTTP/1.1 200 OK\r\n\r\nabc";
    size_t used;
    assert_int_equal(gw_http_feed(p, in, strlen(in), &used, NULL, NULL), GW_HTTP_HEAD);
    assert_int_equal(gw_http_feed(p, in + used, 3, &used, NULL, NULL), GW_HTTP_NEED_MORE);
    assert_int_equal(gw_http_feed_eof(p, NULL, NULL), GW_HTTP_DONE);
    assert_int_equal(gw_http_body_bytes(p), 3);
    /* a truncated Content-Length body at EOF is an error */
    gw_http_parser_reset(p);
    in = "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc";
    assert_int_equal(gw_http_feed(p, in, strlen(in), &used, NULL, NULL), GW_HTTP_HEAD);
    assert_int_equal(gw_http_feed(p, in + used, 3, &used, NULL, NULL), GW_HTTP_NEED_MORE);
    assert_int_equal(gw_http_feed_eof(p, NULL, NULL), GW_HTTP_ERROR);
    assert_int_equal(gw_http_error_status(p), 502);
    gw_http_parser_free(p);
}

static void test_response_no_body(void **state)
{
    (void)state;
    run_t r;
    /* 204 and 304 never have a body, whatever Content-Length says */
    const char *in = "HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\nHTTP/1.1";
    resp_ok(in, false, false, &r);
    assert_int_equal(r.used, strlen(in) - 8);
    assert_int_equal(r.body_len, 0);
    assert_non_null(strstr(r.head, "|304|1.1|10|0|1|"));
    in = "HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1";
    resp_ok(in, false, false, &r);
    assert_int_equal(r.used, strlen(in) - 8);
    /* a HEAD request's response */
    in = "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nHTTP/1.1";
    resp_ok(in, true, false, &r);
    assert_int_equal(r.used, strlen(in) - 8);
    assert_non_null(strstr(r.head, "|200|1.1|1000|0|1|"));
    in = "HTTP/1.1 200 OK\r\n" TE "\r\n";
    resp_ok(in, true, false, &r);
}

static void test_response_interim_skipped(void **state)
{
    (void)state;
    run_t r;
    const char *in = "HTTP/1.1 100 Continue\r\n\r\n"
                     "HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n"
                     "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    resp_ok(in, false, false, &r);
    assert_int_equal(r.heads, 1);
    assert_string_equal(r.head, "-||0|200|1.1|2|0|1|0|(null)\nContent-Length=[2]");
    assert_memory_equal(r.body, "ok", 2);
    assert_int_equal(r.used, strlen(in));
}

static const bad_case_t bad_responses[] = {
    {"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n" TE "\r\n0\r\n\r\n", 502, "cl_and_te"},
    {"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", 502,
     "duplicate_content_length"},
    {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nx", 502, "unsupported_transfer_encoding"},
    {"HTTP/1.1 200 OK\r\n" TE "\r\n0x1\r\nx\r\n0\r\n\r\n", 502, "bad_chunk_size"},
    {"HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n", 502, "bare_lf"},
    {"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n  x\r\n\r\n", 502, "obs_fold"},
    {"HTTP/2.0 200 OK\r\n\r\n", 502, "http_version"},
    {"HTTP/1.1 099 Odd\r\n\r\n", 502, "bad_status"},
    {"HTTP/1.1 600 Odd\r\n\r\n", 502, "bad_status"},
    {"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n", 502, "unexpected_101"},
    {"\r\nHTTP/1.1 200 OK\r\n\r\n", 502, "bad_status_line"},
    {"HTTP/1.1 200 OK\r\nX: \x01\r\n\r\n", 502, "bad_header_value"},
    {"HTTQ/1.1 200 OK\r\n\r\n", 502, "bad_status_line"},
    {"HTTP/1.1  200 OK\r\n\r\n", 502, "bad_status_line"},
    {"HTTP/1.1 20 OK\r\n\r\n", 502, "bad_status_line"},
    {"HTTP/1.1 2000 OK\r\n\r\n", 502, "bad_status_line"},
    {"HTTP/1.1 200 O\x01K\r\n\r\n", 502, "bad_status_line"},
    {"HTTP/1.1 200 OK\rX\r\n\r\n", 502, "bare_cr"},
    {"HTTP/1.1 200 OK\r\n" TE "\r\n5\r\nabcde\r\n", 502, "truncated"},
    {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc", 502, "truncated"},
    {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", 502, "truncated"},
};

static void test_bad_responses(void **state)
{
    (void)state;
    run_t r;
    for (size_t i = 0; i < SL_ARRAY_LEN(bad_responses); i++) {
        const bad_case_t *c = &bad_responses[i];
        run_all_splits(GW_HTTP_RESPONSE, &lim_default, false, c->in, strlen(c->in), true, &r);
        if (r.st != GW_HTTP_ERROR || r.status != c->status || strcmp(r.reason, c->reason) != 0)
            fail_msg("case %zu %s: got st=%d %d %s, want %d %s", i, c->in, r.st, r.status, r.reason,
                     c->status, c->reason);
    }
    /* an endless stream of 1xx is cut */
    char in[2048] = "";
    for (int i = 0; i < 17; i++)
        strcat(in, "HTTP/1.1 100 Continue\r\n\r\n");
    run_all_splits(GW_HTTP_RESPONSE, &lim_default, false, in, strlen(in), false, &r);
    assert_int_equal(r.st, GW_HTTP_ERROR);
    assert_string_equal(r.reason, "too_many_interim");
}

/* ---- headers ---- */

static void test_hop_by_hop(void **state)
{
    (void)state;
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    const char *in = "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, X-Secret ,x-other\r\n"
                     "Connection: X-Third\r\nX-Secret: 1\r\nX-Keep: 2\r\n\r\n";
    size_t used;
    assert_int_equal(gw_http_feed(p, in, strlen(in), &used, NULL, NULL), GW_HTTP_HEAD);
    const gw_http_msg_t *m = gw_http_msg(p);
    static const char *hop[] = {"Connection",        "keep-alive", "Proxy-Authorization",
                                "proxy-connection",  "TE",         "Trailer",
                                "transfer-encoding", "Upgrade",    "x-secret",
                                "X-OTHER",           "x-third"};
    static const char *end2end[] = {"Host", "X-Keep", "Content-Length", "Authorization",
                                    "Tee",  "Proxy",  "X-Secre"};
    for (size_t i = 0; i < SL_ARRAY_LEN(hop); i++)
        if (!gw_http_header_is_hop(m, hop[i], strlen(hop[i])))
            fail_msg("%s should be hop-by-hop", hop[i]);
    for (size_t i = 0; i < SL_ARRAY_LEN(end2end); i++)
        if (gw_http_header_is_hop(m, end2end[i], strlen(end2end[i])))
            fail_msg("%s should be end-to-end", end2end[i]);
    assert_false(gw_http_header_is_hop(NULL, "X-Secret", 8));
    assert_true(gw_http_header_is_hop(NULL, "TE", 2));

    const gw_http_header_t *h = gw_http_header_find(m, "x-secret");
    assert_non_null(h);
    assert_string_equal(h->value, "1");
    h = gw_http_header_find(m, "CONNECTION");
    assert_string_equal(h->value, "keep-alive, X-Secret ,x-other"); /* the first */
    assert_null(gw_http_header_find(m, "X-Absent"));
    assert_null(gw_http_header_find(m, "X-Secre"));
    gw_http_parser_free(p);
}

/* gw_http_header_get by id, against the message's mask of ids: a name
 * present is found (any case), an absent one is NULL, and neither a
 * previous message on the same parser, an interim answer's headers nor a
 * loaded head leaves a bit behind (a stale bit would find a header the
 * message does not have; a missing one would lose a header it has). */
static void test_header_get_by_id(void **state)
{
    (void)state;
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    const char *a = "POST /v1 HTTP/1.1\r\nHost: a\r\nx-request-id: r1\r\nIDEMPOTENCY-KEY: k\r\n"
                    "X-Other: o\r\nContent-Type: a/b\r\nContent-Length: 0\r\n\r\n";
    size_t used;
    assert_int_equal(gw_http_feed(p, a, strlen(a), &used, NULL, NULL), GW_HTTP_HEAD);
    const gw_http_msg_t *m = gw_http_msg(p);
    assert_string_equal(gw_http_header_get(m, GW_HN_X_REQUEST_ID)->value, "r1");
    assert_string_equal(gw_http_header_get(m, GW_HN_IDEMPOTENCY_KEY)->value, "k");
    assert_string_equal(gw_http_header_get(m, GW_HN_CONTENT_TYPE)->value, "a/b");
    assert_string_equal(gw_http_header_get(m, GW_HN_HOST)->value, "a");
    assert_null(gw_http_header_get(m, GW_HN_AUTHORIZATION));
    assert_null(gw_http_header_get(m, GW_HN_X_SLUICE_FAULT));
    assert_null(gw_http_header_get(m, GW_HN_OTHER));
    assert_string_equal(gw_http_header_find(m, "X-OTHER")->value, "o");
    assert_string_equal(gw_http_header_find(m, "Idempotency-Key")->value, "k");
    assert_int_equal(gw_http_feed(p, NULL, 0, &used, NULL, NULL), GW_HTTP_DONE);

    gw_http_parser_reset(p);
    const char *b = "GET / HTTP/1.1\r\nHost: b\r\nAuthorization: Bearer t\r\n\r\n";
    assert_int_equal(gw_http_feed(p, b, strlen(b), &used, NULL, NULL), GW_HTTP_HEAD);
    m = gw_http_msg(p);
    assert_null(gw_http_header_get(m, GW_HN_X_REQUEST_ID));
    assert_null(gw_http_header_get(m, GW_HN_IDEMPOTENCY_KEY));
    assert_null(gw_http_header_get(m, GW_HN_CONTENT_TYPE));
    assert_null(gw_http_header_find(m, "x-request-id"));
    assert_string_equal(gw_http_header_get(m, GW_HN_AUTHORIZATION)->value, "Bearer t");
    assert_string_equal(gw_http_header_get(m, GW_HN_HOST)->value, "b");
    gw_http_parser_free(p);

    p = gw_http_parser_new(GW_HTTP_RESPONSE, NULL);
    const char *c = "HTTP/1.1 100 Continue\r\nContent-Encoding: gzip\r\n\r\n"
                    "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nRetry-After: 3\r\n\r\n";
    assert_int_equal(gw_http_feed(p, c, strlen(c), &used, NULL, NULL), GW_HTTP_HEAD);
    m = gw_http_msg(p);
    assert_int_equal(m->status, 200);
    assert_null(gw_http_header_get(m, GW_HN_CONTENT_ENCODING));
    assert_string_equal(gw_http_header_get(m, GW_HN_RETRY_AFTER)->value, "3");
    assert_string_equal(gw_http_header_get(m, GW_HN_CONTENT_LENGTH)->value, "0");
    gw_http_parser_free(p);

    p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    assert_int_equal(gw_http_load_header(p, "x-sluice-fault", 14, "503", 3), GW_HTTP_NEED_MORE);
    assert_int_equal(gw_http_load_head(p, "POST", "/v1", "h", true), GW_HTTP_HEAD);
    m = gw_http_msg(p);
    assert_string_equal(gw_http_header_get(m, GW_HN_X_SLUICE_FAULT)->value, "503");
    assert_string_equal(gw_http_header_get(m, GW_HN_HOST)->value, "h");
    assert_null(gw_http_header_get(m, GW_HN_X_REQUEST_ID));
    gw_http_parser_free(p);
}

/* The method's length beside it (the router and the upstream head take it
 * instead of a strlen or strcmp): parsed, cut anywhere, and loaded. */
static void test_method_len(void **state)
{
    (void)state;
    static const char *const meths[] = {"GET", "POST", "DELETE", "OPTIONS", "HEAD", "M-SEARCH"};
    for (size_t i = 0; i < SL_ARRAY_LEN(meths); i++) {
        char in[128];
        snprintf(in, sizeof in, "%s /v1/x?y=1 HTTP/1.1\r\nHost: a\r\n\r\n", meths[i]);
        for (size_t cut = 1; cut < strlen(in); cut++) {
            gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
            size_t used, u2;
            gw_http_state_t st = gw_http_feed(p, in, cut, &used, NULL, NULL);
            assert_int_equal(st, GW_HTTP_NEED_MORE);
            st = gw_http_feed(p, in + used, strlen(in) - used, &u2, NULL, NULL);
            assert_int_equal(st, GW_HTTP_HEAD);
            const gw_http_msg_t *m = gw_http_msg(p);
            assert_string_equal(m->method, meths[i]);
            assert_int_equal(m->method_len, strlen(meths[i]));
            gw_http_parser_free(p);
        }
        gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
        assert_int_equal(gw_http_load_head(p, meths[i], "/v1/x", "h", false), GW_HTTP_DONE);
        assert_string_equal(gw_http_msg(p)->method, meths[i]);
        assert_int_equal(gw_http_msg(p)->method_len, strlen(meths[i]));
        gw_http_parser_free(p);
    }
}

static void test_status_text(void **state)
{
    (void)state;
    assert_string_equal(gw_http_status_text(200), "OK");
    assert_string_equal(gw_http_status_text(404), "Not Found");
    assert_string_equal(gw_http_status_text(431), "Request Header Fields Too Large");
    assert_string_equal(gw_http_status_text(599), "Unknown");
}

/* Every byte value at every place of a long header value (the scan takes
 * whole 8-byte words where it can): a field-value byte (HTAB, SP, VCHAR,
 * obs-text) is kept in the value, any other is 400 bad_header_value; the
 * same result whole, byte by byte and cut anywhere (run_all_splits). */
static void test_value_bytes_every_place(void **state)
{
    (void)state;
    run_t r;
    for (unsigned b = 0; b < 256; b++) {
        if (b == '\r' || b == '\n')
            continue; /* line ends: bare_cr / bare_lf, tested above */
        bool ok = b == '\t' || (b >= 0x20 && b != 0x7f);
        for (size_t k = 1; k < 19; k++) {
            char val[41], in[128], want[64];
            memset(val, 'v', 40);
            val[40] = '\0';
            val[k] = (char)b;
            const char pre[] = "GET / HTTP/1.1\r\nHost: a\r\nX-Long: ", post[] = "\r\n\r\n";
            size_t n = 0;
            memcpy(in, pre, sizeof pre - 1);
            n += sizeof pre - 1;
            memcpy(in + n, val, 40); /* val may hold a NUL */
            n += 40;
            memcpy(in + n, post, sizeof post - 1);
            n += sizeof post - 1;
            run_all_splits(GW_HTTP_REQUEST, &lim_default, false, in, n, false, &r);
            if (!ok) {
                if (r.st != GW_HTTP_ERROR || r.status != 400 ||
                    strcmp(r.reason, "bad_header_value") != 0)
                    fail_msg("byte 0x%02x at %zu: st %d %d %s", b, k, r.st, r.status, r.reason);
                continue;
            }
            snprintf(want, sizeof want, "\nX-Long=[%s]", val);
            if (r.st != GW_HTTP_DONE || !strstr(r.head, want))
                fail_msg("byte 0x%02x at %zu: st %d, head %s", b, k, r.st, r.head);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_debian_http_parser_is_lenient),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_value_bytes_every_place),
        cmocka_unit_test(test_error_is_sticky),
        cmocka_unit_test(test_limit_request_line),
        cmocka_unit_test(test_limit_header_bytes),
        cmocka_unit_test(test_limit_header_lines),
        cmocka_unit_test(test_limit_body),
        cmocka_unit_test(test_valid_get),
        cmocka_unit_test(test_valid_post_content_length),
        cmocka_unit_test(test_valid_post_chunked),
        cmocka_unit_test(test_valid_ows_tabs),
        cmocka_unit_test(test_expect_continue),
        cmocka_unit_test(test_head_then_done),
        cmocka_unit_test(test_pipelined),
        cmocka_unit_test(test_keep_alive),
        cmocka_unit_test(test_upgrade_ignored),
        cmocka_unit_test(test_response_keep_alive),
        cmocka_unit_test(test_methods),
        cmocka_unit_test(test_chunked_after_own_head),
        cmocka_unit_test(test_eof_request),
        cmocka_unit_test(test_body_callback_error),
        cmocka_unit_test(test_response_content_length),
        cmocka_unit_test(test_response_chunked),
        cmocka_unit_test(test_response_close_delimited),
        cmocka_unit_test(test_response_no_body),
        cmocka_unit_test(test_response_interim_skipped),
        cmocka_unit_test(test_bad_responses),
        cmocka_unit_test(test_hop_by_hop),
        cmocka_unit_test(test_header_get_by_id),
        cmocka_unit_test(test_method_len),
        cmocka_unit_test(test_status_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
