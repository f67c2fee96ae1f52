/*
 * test_http1_vector.c — the head scan's vector paths (gateway/http1.c:
 * whole header lines in one step, 16-byte SSE2 runs over values and the
 * target) against the byte loop alone (gw_http_vector_set(false)), on
 * generated heads: every byte value in names, values and the target, at
 * every offset mod 32 of a run, and CR, LF, NUL, HTAB, SP and obs-fold at
 * the edges of 8- and 16-byte runs, values and targets across the
 * limits. Each head is fed whole and cut at
 * every place; the two paths must agree on the state, status, reason,
 * bytes consumed and every parsed string. A vector path that took a byte
 * the byte loop refuses fails here.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>

#include "gateway/http1.h"

typedef struct outcome {
    gw_http_state_t st;
    int status;
    char reason[48];
    size_t used;
    char head[1024]; /* method, target, name=[value] lines, as parsed */
} outcome_t;

/* test_fast_limits narrows it for a while */
static gw_http_limits_t lim = {
    .request_line_bytes = 8192,
    .header_bytes = 16384,
    .header_lines = 100,
    .max_body_bytes = 1 << 20,
};

static void describe(const gw_http_msg_t *m, gw_http_kind_t kind, char *out, size_t cap)
{
    size_t k = 0;
    if (kind == GW_HTTP_REQUEST)
        k +=
            (size_t)snprintf(out + k, cap - k, "%s %.*s", m->method, (int)m->target_len, m->target);
    else
        k += (size_t)snprintf(out + k, cap - k, "%d", m->status);
    for (size_t i = 0; i < m->nheaders && k < cap; i++) {
        const gw_http_header_t *h = &m->headers[i];
        /* the id too: each path sets it with the name */
        k += (size_t)snprintf(out + k, cap - k, "\n#%d %zu:", (int)h->id, h->name_len);
        for (size_t j = 0; j < h->name_len && k + 4 < cap; j++)
            k += (size_t)snprintf(out + k, cap - k, "%02x", (unsigned char)h->name[j]);
        k += (size_t)snprintf(out + k, cap - k, "=%zu:", h->value_len);
        for (size_t j = 0; j < h->value_len && k + 4 < cap; j++)
            k += (size_t)snprintf(out + k, cap - k, "%02x", (unsigned char)h->value[j]);
    }
}

/* Feeds in[0, n) in pieces cut at `cut` (0: whole) until the head ends. */
static void parse(gw_http_kind_t kind, const char *in, size_t n, size_t cut, outcome_t *o)
{
    gw_http_parser_t *p = gw_http_parser_new(kind, &lim);
    assert_non_null(p);
    memset(o, 0, sizeof(*o));
    size_t off = 0;
    gw_http_state_t st = GW_HTTP_NEED_MORE;
    while (off < n && st == GW_HTTP_NEED_MORE) {
        size_t piece = cut && off < cut ? cut - off : n - off, used = 0;
        st = gw_http_feed(p, in + off, piece, &used, NULL, NULL);
        off += used;
        if (used == 0 && st == GW_HTTP_NEED_MORE)
            break;
    }
    o->st = st;
    o->used = off;
    o->status = gw_http_error_status(p);
    snprintf(o->reason, sizeof(o->reason), "%s", gw_http_error_reason(p));
    if (st == GW_HTTP_HEAD || st == GW_HTTP_DONE)
        describe(gw_http_msg(p), kind, o->head, sizeof(o->head));
    gw_http_parser_free(p);
}

static size_t ncompared;

/* The vector and the byte paths agree on in[0, n), whole and cut anywhere. */
static void same(gw_http_kind_t kind, const char *in, size_t n, const char *what, unsigned b,
                 size_t at)
{
    for (size_t cut = 0; cut < n; cut += cut < 4 ? 1 : 1 + cut / 8) {
        outcome_t v, s;
        gw_http_vector_set(true);
        parse(kind, in, n, cut, &v);
        gw_http_vector_set(false);
        parse(kind, in, n, cut, &s);
        gw_http_vector_set(true);
        ncompared++;
        if (v.st != s.st || v.status != s.status || strcmp(v.reason, s.reason) != 0 ||
            v.used != s.used || strcmp(v.head, s.head) != 0)
            fail_msg("%s: byte 0x%02x at %zu, cut %zu: vector st %d %d %s used %zu, byte loop "
                     "st %d %d %s used %zu\nvector head: %s\nbyte head: %s",
                     what, b, at, cut, v.st, v.status, v.reason, v.used, s.st, s.status, s.reason,
                     s.used, v.head, s.head);
    }
}

/* A request with a long value; the byte b at `at` of the value. */
static size_t req_value(char *in, size_t len, size_t at, unsigned b)
{
    size_t n = (size_t)sprintf(in, "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nX-V: ");
    for (size_t i = 0; i < len; i++)
        in[n + i] = (char)('a' + i % 26);
    if (at < len)
        in[n + at] = (char)b;
    n += len;
    n += (size_t)sprintf(in + n, "\r\nContent-Length: 0\r\n\r\n");
    return n;
}

static void test_value_bytes(void **state)
{
    (void)state;
    char in[256];
    for (unsigned b = 0; b < 256; b++)
        for (size_t len = 1; len <= 40; len += 13)
            for (size_t at = 0; at < len; at++)
                same(GW_HTTP_REQUEST, in, req_value(in, len, at, b), "value", b, at);
}

/* The byte b at `at` of a header name (a token). */
static void test_name_bytes(void **state)
{
    (void)state;
    char in[256];
    for (unsigned b = 0; b < 256; b++) {
        for (size_t at = 0; at < 20; at++) {
            size_t n = (size_t)sprintf(in, "GET / HTTP/1.1\r\nHost: a\r\n");
            for (size_t i = 0; i < 20; i++)
                in[n + i] = (char)('A' + i % 26);
            in[n + at] = (char)b;
            n += 20;
            n += (size_t)sprintf(in + n, ": v\r\nX: y\r\n\r\n");
            same(GW_HTTP_REQUEST, in, n, "name", b, at);
        }
    }
}

/* The byte b at `at` of a 40-byte target. */
static void test_target_bytes(void **state)
{
    (void)state;
    char in[256];
    for (unsigned b = 0; b < 256; b++) {
        for (size_t at = 1; at < 40; at++) {
            size_t n = (size_t)sprintf(in, "GET ");
            for (size_t i = 0; i < 40; i++)
                in[n + i] = (char)('a' + i % 26);
            in[n] = '/';
            in[n + at] = (char)b;
            n += 40;
            n += (size_t)sprintf(in + n, " HTTP/1.1\r\nHost: a\r\n\r\n");
            same(GW_HTTP_REQUEST, in, n, "target", b, at);
        }
    }
}

/* The byte b at every place of a request line's version and of status
 * lines (with a reason, a long one, none). */
static void test_line0_bytes(void **state)
{
    (void)state;
    static const char *const status[] = {
        "HTTP/1.1 200 OK\r\n",
        "HTTP/1.0 404 Not Found At All, Really Not Here\r\n",
        "HTTP/1.1 204\r\n",
        "HTTP/1.1 200 \r\n",
    };
    char in[256];
    for (unsigned b = 0; b < 256; b++) {
        for (size_t at = 0; at < 10; at++) {
            size_t n = (size_t)sprintf(in, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n");
            in[7 + at] = (char)b;
            same(GW_HTTP_REQUEST, in, n, "version", b, at);
        }
        for (size_t k = 0; k < sizeof(status) / sizeof(status[0]); k++) {
            size_t sl = strlen(status[k]);
            for (size_t at = 0; at < sl; at++) {
                size_t n = (size_t)sprintf(in, "%sX: y\r\nContent-Length: 0\r\n\r\n", status[k]);
                in[at] = (char)b;
                same(GW_HTTP_RESPONSE, in, n, "status", b, at);
            }
        }
    }
}

/* Line ends, NUL, OWS and obs-fold at the edges of 8- and 16-byte runs,
 * the value starting at every offset mod 32 of the head. */
static void test_run_edges(void **state)
{
    (void)state;
    static const char *const inserts[] = {
        "\r", "\n", "\r\n", "\r\n ", "\r\n\t", "\0", "\t", " ", " \t ", "\r\r\n", "\x7f", "\x80",
    };
    char in[512];
    for (size_t pad = 0; pad < 32; pad++) {
        for (size_t ins = 0; ins < sizeof(inserts) / sizeof(inserts[0]); ins++) {
            const char *s = inserts[ins];
            size_t sl = strlen(s) ? strlen(s) : 1; /* "\0": one NUL */
            for (size_t at = 0; at < 50; at++) {
                size_t n = (size_t)sprintf(in, "HTTP/1.1 200 OK\r\nX-Pad: ");
                for (size_t i = 0; i < pad; i++)
                    in[n++] = 'p';
                n += (size_t)sprintf(in + n, "\r\nX-V:%s", pad & 1 ? " " : "");
                size_t vstart = n;
                for (size_t i = 0; i < 50; i++)
                    in[n++] = (char)('a' + i % 26);
                memmove(in + vstart + at + sl, in + vstart + at, 50 - at);
                memcpy(in + vstart + at, s, sl);
                n += sl;
                n += (size_t)sprintf(in + n, "\r\nContent-Length: 0\r\n\r\n");
                same(GW_HTTP_RESPONSE, in, n, "edge", (unsigned char)s[0], at);
            }
        }
    }
}

/* Many lines, within and past the limits: lines, bytes. */
static void test_limits(void **state)
{
    (void)state;
    static char in[40000];
    for (size_t lines = 95; lines <= 102; lines++) {
        size_t n = (size_t)sprintf(in, "GET / HTTP/1.1\r\nHost: a\r\n");
        for (size_t i = 0; i < lines; i++)
            n += (size_t)sprintf(in + n, "X-%zu: %zu\r\n", i, i);
        n += (size_t)sprintf(in + n, "\r\n");
        same(GW_HTTP_REQUEST, in, n, "lines", 0, lines);
    }
    for (size_t vlen = 16300; vlen <= 16400; vlen += 7) {
        size_t n = (size_t)sprintf(in, "GET / HTTP/1.1\r\nHost: a\r\nX: ");
        memset(in + n, 'v', vlen);
        n += vlen;
        n += (size_t)sprintf(in + n, "\r\n\r\n");
        outcome_t v, s;
        gw_http_vector_set(true);
        parse(GW_HTTP_REQUEST, in, n, 0, &v);
        gw_http_vector_set(false);
        parse(GW_HTTP_REQUEST, in, n, 0, &s);
        gw_http_vector_set(true);
        assert_int_equal(v.st, s.st);
        assert_string_equal(v.reason, s.reason);
        assert_int_equal(v.used, s.used);
        assert_string_equal(v.head, s.head);
    }
    /* a target across request_line_bytes with more target bytes after
     * it: the 16-byte run may load past the limit but not take it */
    for (size_t tlen = 8170; tlen <= 8200; tlen += 3) {
        size_t n = (size_t)sprintf(in, "GET /");
        memset(in + n, 't', tlen);
        n += tlen;
        n += (size_t)sprintf(in + n, " HTTP/1.1\r\nHost: a\r\n\r\n");
        same(GW_HTTP_REQUEST, in, n, "target limit", 't', tlen);
    }
}

/* gw_http_name_eq (8 bytes a step) and gw_http_hn agree with strncasecmp
 * for every byte value at every place of every name of the enum. */
static void test_name_eq(void **state)
{
    (void)state;
    static const char *const names[] = {
        "te",
        "host",
        "date",
        "expect",
        "server",
        "trailer",
        "upgrade",
        "forwarded",
        "x-real-ip",
        "connection",
        "keep-alive",
        "traceparent",
        "retry-after",
        "content-type",
        "x-request-id",
        "authorization",
        "cache-control",
        "content-length",
        "x-sluice-nonce",
        "accept-encoding",
        "x-forwarded-for",
        "idempotency-key",
        "accept-language",
        "proxy-connection",
        "x-forwarded-host",
        "content-encoding",
        "transfer-encoding",
        "x-forwarded-proto",
        "x-accel-buffering",
        "proxy-authenticate",
        "x-sluice-signature",
        "x-sluice-timestamp",
        "proxy-authorization",
        "x-sluice-fault",
        "x-sluice-admin-key",
    };
    for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
        const char *lit = names[k];
        size_t n = strlen(lit);
        gw_http_hn_t id = gw_http_hn(lit, n);
        assert_int_not_equal(id, GW_HN_OTHER);
        for (size_t j = 0; j < k; j++) /* one id per name */
            assert_int_not_equal(id, gw_http_hn(names[j], strlen(names[j])));
        for (size_t at = 0; at < n; at++) {
            for (unsigned b = 0; b < 256; b++) {
                char name[32];
                memcpy(name, lit, n);
                name[at] = (char)b;
                bool want = b != 0 && strncasecmp(name, lit, n) == 0;
                if (gw_http_name_eq(name, lit, n) != want)
                    fail_msg("%s: byte 0x%02x at %zu: want %d", lit, b, at, want);
                if ((gw_http_hn(name, n) == id) != want)
                    fail_msg("gw_http_hn %s: byte 0x%02x at %zu: want %d", lit, b, at, want);
                ncompared++;
            }
        }
    }
}

/* GW_HTTP_PREFIX_CI (the answer's content-type checks) agrees with
 * strncasecmp for every byte value at every place of the two literals, and
 * for values longer and shorter than them. */
static void test_prefix_ci(void **state)
{
    (void)state;
    static const char *const lits[] = {"application/json", "text/event-stream"};
    for (size_t li = 0; li < sizeof(lits) / sizeof(lits[0]); li++) {
        const char *lit = lits[li];
        size_t n = strlen(lit);
        char v[64];
        for (size_t at = 0; at < n; at++) {
            for (int b = 0; b < 256; b++) {
                memcpy(v, lit, n);
                memcpy(v + n, "; charset=utf-8", 16);
                v[at] = (char)b;
                bool want = b != 0 && strncasecmp(v, lit, n) == 0;
                bool got = li == 0 ? GW_HTTP_PREFIX_CI(v, n + 15, "application/json")
                                   : GW_HTTP_PREFIX_CI(v, n + 15, "text/event-stream");
                if (got != want)
                    fail_msg("%s: byte 0x%02x at %zu: want %d", lit, b, at, want);
                ncompared++;
            }
        }
    }
    assert_true(GW_HTTP_PREFIX_CI("APPLICATION/JSON", 16, "application/json"));
    assert_true(GW_HTTP_PREFIX_CI("Text/Event-Stream;x", 19, "text/event-stream"));
    assert_false(GW_HTTP_PREFIX_CI("application/jso", 15, "application/json"));
    assert_false(GW_HTTP_PREFIX_CI("application/xjson", 17, "application/json"));
}

/* ---- the one-step parse of a whole head (head_fast) ---- */

/* The one-step parse copies the head whole, so the second header's name
 * lies two bytes (the first line's CR LF) after the first's value;
 * head_scan() stores the strings packed, one NUL between them: which of
 * the two parsed a head is so seen from outside (the first value must
 * have no trailing OWS). */
static bool taken_whole(gw_http_kind_t kind, const char *in, size_t n)
{
    gw_http_parser_t *p = gw_http_parser_new(kind, &lim);
    size_t used = 0;
    gw_http_state_t st = gw_http_feed(p, in, n, &used, NULL, NULL);
    bool whole = false;
    const gw_http_msg_t *m = gw_http_msg(p);
    if ((st == GW_HTTP_HEAD || st == GW_HTTP_DONE) && m->nheaders >= 2)
        whole = m->headers[1].name == m->headers[0].value + m->headers[0].value_len + 2;
    gw_http_parser_free(p);
    return whole;
}

/* A request and a response whose lines cross the 64-byte steps of the
 * marking pass, with a body after them; at every place of the head, one
 * of the bytes the pass marks or that end a name or a value (CR, LF,
 * CRLF, a bare CR before CRLF, NUL, HTAB, DEL, obs-text, ':', SP, an
 * early end): the one-step parse (whole feeds) and the byte loop agree,
 * whole and cut. */
static size_t fast_head(gw_http_kind_t kind, char *in, size_t pad)
{
    size_t n;
    if (kind == GW_HTTP_REQUEST)
        n = (size_t)sprintf(in,
                            "POST /v1/chat/completions?x=%.*s HTTP/1.1\r\nHost: 127.0.0.1:24610\r\n"
                            "Content-Type: application/json\r\nX-Long-Name-Of-A-Header: ",
                            (int)pad,
                            "qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq");
    else
        n = (size_t)sprintf(in,
                            "HTTP/1.1 200 OK%.*s\r\nServer: nginx/1.22.1\r\nDate: Sat, 05 Dec 2026 "
                            "12:45:00 GMT\r\nContent-Type: application/json\r\nX-Long: ",
                            (int)pad,
                            "                                                                ");
    memset(in + n, 'v', 70);
    n += 70;
    n += (size_t)sprintf(in + n, "\r\nContent-Length: 4\r\nConnection: keep-alive\r\n\r\n\r\n");
    memcpy(in + n, "\0\tx", 3); /* the body's last bytes, then one more */
    return n + 3;
}

static void test_fast_bytes(void **state)
{
    (void)state;
    static const char *const inserts[] = {
        "\r", "\n", "\r\n", "\r\r\n", "\0", "\t", "\x7f", "\x80", ":", " ", "\r\n\r\n",
    };
    char in[512], out[600];
    for (int kind = 0; kind < 2; kind++) {
        gw_http_kind_t k = kind ? GW_HTTP_RESPONSE : GW_HTTP_REQUEST;
        for (size_t pad = 0; pad < 64; pad += 38) { /* 0 38 */
            size_t n = fast_head(k, in, pad);
            assert_true(taken_whole(k, in, n)); /* the plain head itself */
            for (size_t ins = 0; ins < sizeof(inserts) / sizeof(inserts[0]); ins++) {
                const char *s = inserts[ins];
                size_t sl = strlen(s) ? strlen(s) : 1;
                for (size_t at = 0; at + 7 < n; at++) {
                    memcpy(out, in, at);
                    memcpy(out + at, s, sl);
                    memcpy(out + at + sl, in + at, n - at);
                    same(k, out, n + sl, "fast", (unsigned char)s[0], at);
                }
            }
        }
    }
}

/* The head's end (CR LF CR LF) at every offset of a 64-byte step, the
 * feed ending right after it or going on with bytes the pass marks; no
 * header, one, many. */
static void test_fast_end(void **state)
{
    (void)state;
    static const char *const tails[] = {"", "\r", "\n", "\r\n", "\0\0", "xyz\r\n\r\n"};
    char in[1024], path[256], reason[256];
    path[0] = '/'; /* "GET //aaa...": a path of pad bytes after the first '/' */
    memset(path + 1, 'a', sizeof(path) - 1);
    memset(reason, 'r', sizeof(reason));
    for (size_t pad = 0; pad < 200; pad++) {
        for (size_t t = 0; t < sizeof(tails) / sizeof(tails[0]); t++) {
            size_t tl = t == 4 ? 2 : strlen(tails[t]);
            size_t n = (size_t)sprintf(in, "GET /%.*s HTTP/1.1\r\nHost: a\r\n\r\n", (int)pad, path);
            memcpy(in + n, tails[t], tl);
            same(GW_HTTP_REQUEST, in, n + tl, "end", (unsigned)t, pad);
            n = (size_t)sprintf(in, "HTTP/1.1 204 %.*s\r\n\r\n", (int)pad, reason);
            memcpy(in + n, tails[t], tl);
            same(GW_HTTP_RESPONSE, in, n + tl, "end", (unsigned)t, pad);
            n = (size_t)sprintf(in, "POST /x HTTP/1.1\r\nHost: a\r\n");
            for (size_t i = 0; i < pad % 23; i++)
                n += (size_t)sprintf(in + n, "X-%zu:%s%zu \r\n", i, i & 1 ? "" : "  ", pad);
            n += (size_t)sprintf(in + n, "Content-Length: 3\r\n\r\n");
            memcpy(in + n, tails[t], tl);
            same(GW_HTTP_REQUEST, in, n + tl, "lines", (unsigned)t, pad);
        }
    }
}

/* Heads at and past the limits (header_bytes, request_line_bytes,
 * header_lines) taken whole: the one-step parse declines them and the
 * byte loop answers, with its status and reason. */
static void test_fast_limits(void **state)
{
    (void)state;
    static char in[9000];
    gw_http_limits_t saved = lim;
    size_t n = (size_t)sprintf(in, "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n");
    for (int i = 0; i < 8; i++)
        n += (size_t)sprintf(in + n, "X-%d: value %d\r\n", i, i);
    n += (size_t)sprintf(in + n, "\r\n");
    for (size_t hb = n - 3; hb <= n + 1; hb++) {
        lim.header_bytes = hb;
        same(GW_HTTP_REQUEST, in, n, "header_bytes", 0, hb);
    }
    lim = saved;
    for (size_t rl = 32; rl <= 36; rl++) {
        lim.request_line_bytes = rl;
        same(GW_HTTP_REQUEST, in, n, "request_line_bytes", 0, rl);
    }
    lim = saved;
    for (size_t hl = 7; hl <= 10; hl++) {
        lim.header_lines = hl;
        same(GW_HTTP_REQUEST, in, n, "header_lines", 0, hl);
    }
    lim = saved;
    /* a head over the one-step parse's 8 KiB: the byte loop takes it all */
    n = (size_t)sprintf(in, "GET / HTTP/1.1\r\nHost: a\r\nX: ");
    memset(in + n, 'v', 8300);
    n += 8300;
    n += (size_t)sprintf(in + n, "\r\n\r\n");
    same(GW_HTTP_REQUEST, in, n, "8 KiB", 0, n);
    assert_false(taken_whole(GW_HTTP_REQUEST, in, n));
}

/* Two heads in one feed: an interim 100 and its final answer, two
 * pipelined requests; a request after empty lines (the byte loop's). */
static void test_fast_more(void **state)
{
    (void)state;
    static const char interim[] =
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
        "\r\nok";
    static const char two[] =
        "GET /a HTTP/1.1\r\nHost: a\r\nX: 1\r\n\r\nGET /b HTTP/1.1\r\nHost: b\r\n"
        "X: 2\r\n\r\n";
    static const char lead[] = "\r\n\r\nGET /a HTTP/1.1\r\nHost: a\r\nX: 1\r\n\r\n";
    same(GW_HTTP_RESPONSE, interim, sizeof(interim) - 1, "interim", 0, 0);
    same(GW_HTTP_REQUEST, two, sizeof(two) - 1, "pipelined", 0, 0);
    same(GW_HTTP_REQUEST, lead, sizeof(lead) - 1, "lead", 0, 0);
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, &lim);
    size_t used = 0;
    assert_int_equal(gw_http_feed(p, two, sizeof(two) - 1, &used, NULL, NULL), GW_HTTP_HEAD);
    assert_int_equal(used, 34);
    assert_int_equal(gw_http_feed(p, two + used, 0, &used, NULL, NULL), GW_HTTP_DONE);
    gw_http_parser_reset(p);
    assert_int_equal(gw_http_feed(p, two + 34, sizeof(two) - 35, &used, NULL, NULL), GW_HTTP_HEAD);
    assert_string_equal(gw_http_msg(p)->target, "/b");
    assert_string_equal(gw_http_msg(p)->host, "b");
    assert_int_equal(gw_http_msg(p)->headers[0].id, GW_HN_HOST);
    gw_http_parser_free(p);
    assert_true(taken_whole(GW_HTTP_REQUEST, two, sizeof(two) - 1));
    assert_false(taken_whole(GW_HTTP_REQUEST, lead, sizeof(lead) - 1));
}

static void test_compared_enough(void **state)
{
    (void)state;
    /* the generators above really ran their heads through both paths */
    assert_true(ncompared > 100000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_value_bytes),     cmocka_unit_test(test_name_bytes),
        cmocka_unit_test(test_target_bytes),    cmocka_unit_test(test_line0_bytes),
        cmocka_unit_test(test_run_edges),       cmocka_unit_test(test_limits),
        cmocka_unit_test(test_name_eq),         cmocka_unit_test(test_prefix_ci),
        cmocka_unit_test(test_fast_bytes),      cmocka_unit_test(test_fast_end),
        cmocka_unit_test(test_fast_limits),     cmocka_unit_test(test_fast_more),
        cmocka_unit_test(test_compared_enough),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
