/*
 * fuzz_http_request.c — libFuzzer target for the request side of the HTTP/1.1
 * adapter (gateway/http1.c). The input is a byte stream from a client,
 * possibly several pipelined requests. Beyond "no crash" it checks:
 *   - the same stream fed whole, byte by byte (small inputs) and in
 *     pseudo-random pieces gives the same messages, bodies, consumed
 *     counts and errors; so does the client side's feed (an evbuffer of
 *     those pieces as chains, head and body in one pass, drained once),
 *     and the whole stream with the head scan's vector paths off (the
 *     byte loop alone: gw_http_vector_set);
 *   - every parsed head is well formed (token names, trimmed values with
 *     no CR/LF/NUL, origin-form target, limits kept) and the body length
 *     matches its framing;
 *   - re-serialising a parsed request the way the proxy does and parsing
 *     it again gives the same message and body.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "gateway/http1.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_MSGS 8
#define MAX_IN   8192

static const gw_http_limits_t fz_lim = {
    .request_line_bytes = 256,
    .header_bytes = 1024,
    .header_lines = 16,
    .max_body_bytes = 4096,
};

typedef struct fz_msg {
    gw_http_state_t st;
    int status;
    const char *reason;
    char head[2048];
    size_t head_len;
    char body[4096];
    size_t body_len;
    size_t used;
} fz_msg_t;

typedef struct fz_run {
    fz_msg_t m[MAX_MSGS];
    size_t n;
} fz_run_t;

static int fz_body(void *arg, const char *p, size_t n)
{
    fz_msg_t *m = arg;
    if (m->body_len + n > sizeof(m->body))
        abort(); /* max_body_bytes must have stopped it */
    memcpy(m->body + m->body_len, p, n);
    m->body_len += n;
    return 0;
}

static int is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static void check_head(const gw_http_msg_t *m)
{
    if (!m || !m->method || !m->target || m->target[0] != '/')
        abort();
    if (strlen(m->target) != m->target_len || m->path_len > m->target_len)
        abort();
    if (m->http_major != 1 || m->http_minor > 1 || m->nheaders > fz_lim.header_lines)
        abort();
    if (m->http_minor == 1 && !m->host)
        abort();
    if (m->chunked && m->content_length >= 0)
        abort();
    if (m->content_length > (int64_t)fz_lim.max_body_bytes)
        abort();
    for (size_t i = 0; i < m->nheaders; i++) {
        const gw_http_header_t *h = &m->headers[i];
        if (!h->name_len || strlen(h->name) != h->name_len || strlen(h->value) != h->value_len)
            abort();
        for (size_t k = 0; k < h->name_len; k++)
            if (!is_tchar((unsigned char)h->name[k]))
                abort();
        for (size_t k = 0; k < h->value_len; k++) {
            unsigned char c = (unsigned char)h->value[k];
            if ((c < 0x20 && c != '\t') || c == 0x7f)
                abort();
        }
        if (h->value_len &&
            (h->value[0] == ' ' || h->value[0] == '\t' || h->value[h->value_len - 1] == ' ' ||
             h->value[h->value_len - 1] == '\t'))
            abort();
    }
}

static void snap_head(fz_msg_t *r, const gw_http_msg_t *m)
{
    int k = snprintf(r->head, sizeof(r->head), "%s %s %d.%d %lld %d %d %d %s|", m->method,
                     m->target, m->http_major, m->http_minor, (long long)m->content_length,
                     m->chunked, m->keep_alive, m->expect_continue, m->host ? m->host : "-");
    for (size_t i = 0; i < m->nheaders && k > 0 && (size_t)k < sizeof(r->head); i++)
        k += snprintf(r->head + k, sizeof(r->head) - (size_t)k, "%s:%s|", m->headers[i].name,
                      m->headers[i].value);
    r->head_len = k > 0 && (size_t)k < sizeof(r->head) ? (size_t)k : sizeof(r->head) - 1;
}

/* A message ended (st, after its last feed; *off the stream's bytes taken
 * so far): checks and records it. true: the next message follows. */
static bool fz_msg_end(gw_http_parser_t *p, gw_http_state_t st, fz_msg_t *m, size_t used,
                       bool at_end, fz_run_t *out)
{
    if (st == GW_HTTP_NEED_MORE) {
        st = gw_http_feed_eof(p, fz_body, m);
        if (st != GW_HTTP_ERROR && (st != GW_HTTP_NEED_MORE || gw_http_started(p)))
            abort(); /* requests never end at close */
    }
    m->st = st;
    m->used = used;
    if (gw_http_body_bytes(p) != m->body_len)
        abort();
    if (st == GW_HTTP_ERROR) {
        m->status = gw_http_error_status(p);
        m->reason = gw_http_error_reason(p);
        if (!m->reason[0] || m->status < 400 || m->status > 505)
            abort();
        m->used = 0;
    }
    if (st == GW_HTTP_DONE) {
        const gw_http_msg_t *hm = gw_http_msg(p);
        if (!m->head_len || !hm)
            abort();
        if (hm->content_length >= 0 && (int64_t)m->body_len != hm->content_length)
            abort();
        if (hm->content_length < 0 && !hm->chunked && m->body_len)
            abort();
    }
    out->n++;
    if (st != GW_HTTP_DONE || at_end || out->n == MAX_MSGS)
        return false;
    gw_http_parser_reset(p);
    return true;
}

/* Feeds a stream cut at cuts[] (sorted, in (0, len)), message after message. */
static void fz_feed(gw_http_parser_t *p, const char *in, size_t len, const size_t *cuts,
                    size_t ncuts, fz_run_t *out)
{
    memset(out, 0, sizeof(*out));
    size_t off = 0, c = 0;
    gw_http_parser_reset(p);
    fz_msg_t *m = &out->m[0];
    size_t msg_start = 0;
    for (;;) {
        while (c < ncuts && cuts[c] <= off)
            c++;
        size_t end = c < ncuts ? cuts[c] : len;
        size_t used = 0;
        gw_http_state_t st = gw_http_feed(p, in + off, end - off, &used, fz_body, m);
        if (used > end - off)
            abort();
        off += used;
        if (st == GW_HTTP_HEAD) {
            if (m->head_len)
                abort(); /* one head per message */
            check_head(gw_http_msg(p));
            snap_head(m, gw_http_msg(p));
            continue;
        }
        if (st == GW_HTTP_NEED_MORE) {
            if (off != end)
                abort();
            if (end < len)
                continue;
        }
        if (!fz_msg_end(p, st, m, off - msg_start, off == len, out))
            return;
        m = &out->m[out->n];
        msg_start = off;
    }
}

/* The client side's head callback: the head before any body byte. */
typedef struct fz_ev {
    gw_http_parser_t *p;
    fz_msg_t *m;
} fz_ev_t;

static int fz_head(void *arg)
{
    fz_ev_t *e = arg;
    if (e->m->head_len || e->m->body_len)
        abort(); /* one head per message, before its body */
    check_head(gw_http_msg(e->p));
    snap_head(e->m, gw_http_msg(e->p));
    return 0;
}

/* The client side's way (conn.c): the stream in an evbuffer, one chain per
 * piece between cuts[], fed by gw_http_feed_evbuffer_cbs with the head
 * callback (head and body in one pass), message after message. */
static void fz_feed_ev(gw_http_parser_t *p, const char *in, size_t len, const size_t *cuts,
                       size_t ncuts, fz_run_t *out)
{
    memset(out, 0, sizeof(*out));
    struct evbuffer *b = evbuffer_new();
    if (!b)
        abort();
    size_t prev = 0;
    for (size_t c = 0; c <= ncuts; c++) {
        size_t end = c < ncuts ? cuts[c] : len;
        if (end > prev && evbuffer_add_reference(b, in + prev, end - prev, NULL, NULL) != 0)
            abort();
        prev = end > prev ? end : prev;
    }
    gw_http_parser_reset(p);
    size_t off = 0, msg_start = 0;
    fz_ev_t e = {p, &out->m[0]};
    for (;;) {
        const gw_http_feed_cbs_t cbs = {fz_head, &e, fz_body, e.m};
        size_t used = 0, before = evbuffer_get_length(b);
        gw_http_state_t st = gw_http_feed_evbuffer_cbs(p, b, &used, &cbs);
        if (before - evbuffer_get_length(b) != used || st == GW_HTTP_HEAD)
            abort(); /* drained what it took; the callback went on */
        off += used;
        if (st == GW_HTTP_NEED_MORE && off != len)
            abort(); /* the buffer is used up */
        if (!fz_msg_end(p, st, e.m, off - msg_start, off == len, out))
            break;
        e.m = &out->m[out->n];
        msg_start = off;
    }
    evbuffer_free(b);
}

static void fz_same(const fz_run_t *a, const fz_run_t *b)
{
    if (a->n != b->n)
        abort();
    for (size_t i = 0; i < a->n; i++) {
        const fz_msg_t *x = &a->m[i], *y = &b->m[i];
        if (x->st != y->st || x->status != y->status || x->used != y->used ||
            x->head_len != y->head_len || memcmp(x->head, y->head, x->head_len) != 0 ||
            x->body_len != y->body_len || memcmp(x->body, y->body, x->body_len) != 0)
            abort();
        if ((x->reason || y->reason) && (!x->reason || !y->reason || strcmp(x->reason, y->reason)))
            abort();
    }
}

/* The proxy's way: method, target, version, each header as parsed; the body
 * re-framed (Content-Length as is, chunked as one chunk). */
static size_t reserialise(const gw_http_msg_t *m, const fz_msg_t *r, char *out, size_t cap)
{
    int k = snprintf(out, cap, "%s %s HTTP/1.%d\r\n", m->method, m->target, m->http_minor);
    for (size_t i = 0; i < m->nheaders && k > 0 && (size_t)k < cap; i++)
        k += snprintf(out + k, cap - (size_t)k, "%s: %s\r\n", m->headers[i].name,
                      m->headers[i].value);
    /* "name: value" may be longer than what was sent: skip what no longer
     * fits the limits (that is the limits' business, tested elsewhere) */
    if (k < 0 || (size_t)k + 2 > fz_lim.header_bytes || (size_t)k + r->body_len + 64 > cap)
        return 0;
    size_t n = (size_t)k;
    memcpy(out + n, "\r\n", 2);
    n += 2;
    if (m->chunked && r->body_len)
        n += (size_t)snprintf(out + n, cap - n, "%zx\r\n", r->body_len);
    memcpy(out + n, r->body, r->body_len);
    n += r->body_len;
    if (m->chunked)
        n += (size_t)snprintf(out + n, cap - n, "%s0\r\n\r\n", r->body_len ? "\r\n" : "");
    return n;
}

static uint64_t fz_rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static gw_http_parser_t *p;
    static fz_run_t whole, other;
    static size_t cuts[MAX_IN];
    static char re[MAX_IN + 8192];
    if (size > MAX_IN)
        return 0;
    if (!p && !(p = gw_http_parser_new(GW_HTTP_REQUEST, &fz_lim)))
        abort();
    const char *in = (const char *)data;

    fz_feed(p, in, size, NULL, 0, &whole);
    /* the byte loop alone (no one-step head, no 16-byte runs) agrees */
    gw_http_vector_set(false);
    fz_feed(p, in, size, NULL, 0, &other);
    gw_http_vector_set(true);
    fz_same(&whole, &other);

    uint64_t seed = 1469598103934665603ull;
    for (size_t i = 0; i < size; i++)
        seed = (seed ^ data[i]) * 1099511628211ull;
    seed |= 1;
    for (int round = 0; round < 4 && size > 1; round++) {
        size_t n = 1 + fz_rng(&seed) % 4, k = 0;
        for (size_t i = 0; i < n; i++)
            cuts[k++] = 1 + fz_rng(&seed) % (size - 1);
        for (size_t i = 1; i < k; i++) /* insertion sort, a handful of cuts */
            for (size_t j = i; j > 0 && cuts[j - 1] > cuts[j]; j--) {
                size_t t = cuts[j];
                cuts[j] = cuts[j - 1];
                cuts[j - 1] = t;
            }
        fz_feed(p, in, size, cuts, k, &other);
        fz_same(&whole, &other);
        fz_feed_ev(p, in, size, cuts, k, &other);
        fz_same(&whole, &other);
    }
    if (size > 1 && size <= 512) {
        for (size_t i = 1; i < size; i++)
            cuts[i - 1] = i;
        fz_feed(p, in, size, cuts, size - 1, &other);
        fz_same(&whole, &other);
        fz_feed_ev(p, in, size, cuts, size - 1, &other);
        fz_same(&whole, &other);
    }

    /* re-serialise the first message and parse it again */
    if (whole.n && whole.m[0].st == GW_HTTP_DONE) {
        gw_http_parser_reset(p);
        size_t used;
        fz_msg_t first = {0};
        gw_http_state_t st = gw_http_feed(p, in, size, &used, fz_body, &first);
        if (st != GW_HTTP_HEAD)
            abort();
        size_t off = used;
        st = gw_http_feed(p, in + off, size - off, &used, fz_body, &first);
        if (st != GW_HTTP_DONE)
            abort();
        size_t n = reserialise(gw_http_msg(p), &first, re, sizeof(re));
        if (n) {
            fz_feed(p, re, n, NULL, 0, &other);
            if (other.n != 1 || other.m[0].st != GW_HTTP_DONE)
                abort();
            if (other.m[0].head_len != whole.m[0].head_len ||
                memcmp(other.m[0].head, whole.m[0].head, whole.m[0].head_len) != 0 ||
                other.m[0].body_len != whole.m[0].body_len ||
                memcmp(other.m[0].body, whole.m[0].body, whole.m[0].body_len) != 0)
                abort();
        }
    }
    return 0;
}
