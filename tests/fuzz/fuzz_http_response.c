/*
 * fuzz_http_response.c — libFuzzer target for the response side of the
 * HTTP/1.1 adapter (gateway/http1.c). The input is what an upstream sends
 * on one connection (responses back to back, ending at close), parsed once
 * as answers to GET and once as answers to HEAD. Beyond "no crash":
 *   - fed whole, byte by byte (small inputs) and in pseudo-random pieces it
 *     gives the same heads, bodies, consumed counts and errors; so does the
 *     proxy's one pass (an evbuffer, a chain per piece, the head callback
 *     going on into the body but for a 5xx), and the whole input with the
 *     head scan's vector paths off (the byte loop alone);
 *   - a final head is never 1xx, heads are well formed, errors are 502;
 *   - bodies match their framing: Content-Length exactly, nothing for
 *     HEAD, 204 and 304, only a close-delimited body ends at EOF.
 */
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
    .max_body_bytes = 0,
};

typedef struct fz_msg {
    gw_http_state_t st;
    int status;
    const char *reason;
    char head[2048];
    size_t head_len;
    char body[MAX_IN];
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
        abort();
    memcpy(m->body + m->body_len, p, n);
    m->body_len += n;
    return 0;
}

static void check_head(const gw_http_msg_t *m)
{
    if (!m || m->method || m->target || m->host)
        abort();
    if (m->status < 200 || m->status > 599 || m->http_major != 1 || m->http_minor > 1)
        abort();
    if (m->chunked && m->content_length >= 0)
        abort();
    if (m->nheaders > fz_lim.header_lines)
        abort();
    for (size_t i = 0; i < m->nheaders; i++) {
        const gw_http_header_t *h = &m->headers[i];
        if (!h->name_len || strlen(h->name) != h->name_len || strlen(h->value) != h->value_len)
            abort();
        if (strpbrk(h->name, " \t:\r\n") || strpbrk(h->value, "\r\n"))
            abort();
    }
}

static void snap_head(fz_msg_t *r, const gw_http_msg_t *m)
{
    int k = snprintf(r->head, sizeof(r->head), "%d %d.%d %lld %d %d|", m->status, m->http_major,
                     m->http_minor, (long long)m->content_length, m->chunked, m->keep_alive);
    for (size_t i = 0; i < m->nheaders && k > 0 && (size_t)k < sizeof(r->head); i++)
        k += snprintf(r->head + k, sizeof(r->head) - (size_t)k, "%s:%s|", m->headers[i].name,
                      m->headers[i].value);
    r->head_len = k > 0 && (size_t)k < sizeof(r->head) ? (size_t)k : sizeof(r->head) - 1;
}

/* The end of one message (DONE, ERROR, or the input used up): checks it
 * against its framing and counts it. false: the run is over. */
static bool fz_msg_end(gw_http_parser_t *p, bool head_req, gw_http_state_t st, bool eof,
                       fz_msg_t *m, size_t used, bool at_end, fz_run_t *out)
{
    m->st = st;
    m->used = used;
    m->status = 0;
    m->reason = NULL;
    if (gw_http_body_bytes(p) != m->body_len)
        abort();
    if (st == GW_HTTP_ERROR) {
        m->status = gw_http_error_status(p);
        m->reason = gw_http_error_reason(p);
        if (!m->reason[0] || m->status != 502)
            abort();
        m->used = 0;
    }
    if (st == GW_HTTP_DONE) {
        const gw_http_msg_t *hm = gw_http_msg(p);
        if (!m->head_len || !hm)
            abort();
        bool bodiless = head_req || hm->status == 204 || hm->status == 304;
        if (bodiless && m->body_len)
            abort();
        if (!bodiless && hm->content_length >= 0 && (int64_t)m->body_len != hm->content_length)
            abort();
        if (eof && (bodiless || hm->chunked || hm->content_length >= 0))
            abort(); /* only a close-delimited body ends at EOF */
        if (eof && hm->keep_alive)
            abort();
    }
    out->n++;
    if (st != GW_HTTP_DONE || at_end || out->n == MAX_MSGS)
        return false;
    gw_http_parser_reset(p);
    gw_http_parser_set_head_request(p, head_req);
    fz_msg_t *next = &out->m[out->n];
    next->head_len = next->body_len = 0;
    return true;
}

static void fz_feed(gw_http_parser_t *p, bool head_req, const char *in, size_t len,
                    const size_t *cuts, size_t ncuts, fz_run_t *out)
{
    out->n = 0;
    size_t off = 0, c = 0, msg_start = 0;
    gw_http_parser_reset(p);
    gw_http_parser_set_head_request(p, head_req);
    fz_msg_t *m = &out->m[0];
    m->head_len = m->body_len = 0;
    for (;;) {
        while (c < ncuts && cuts[c] <= off)
            c++;
        size_t end = c < ncuts ? cuts[c] : len;
        size_t used = 0;
        bool eof = false;
        gw_http_state_t st = gw_http_feed(p, in + off, end - off, &used, fz_body, m);
        if (used > end - off)
            abort();
        off += used;
        if (st == GW_HTTP_HEAD) {
            if (m->head_len)
                abort();
            check_head(gw_http_msg(p));
            snap_head(m, gw_http_msg(p));
            continue;
        }
        if (st == GW_HTTP_NEED_MORE) {
            if (off != end)
                abort();
            if (end < len)
                continue;
            st = gw_http_feed_eof(p, fz_body, m);
            eof = true;
        }
        if (!fz_msg_end(p, head_req, st, eof, m, off - msg_start, off == len, out))
            return;
        m = &out->m[out->n];
        msg_start = off;
    }
}

/* The proxy's head callback (gw_proxy_head_cb): the head before any body
 * byte; a 5xx stops the pass at its head. */
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
    return gw_http_msg(e->p)->status >= 500;
}

/* The proxy's way (gw_proxy_up_read): the stream in an evbuffer, one chain
 * per piece between cuts[], fed by gw_http_feed_evbuffer_cbs with the head
 * callback (head and body in one pass but for a 5xx, which is fed on after
 * its head), the close at the end. */
static void fz_feed_ev(gw_http_parser_t *p, bool head_req, const char *in, size_t len,
                       const size_t *cuts, size_t ncuts, fz_run_t *out)
{
    out->n = 0;
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
    gw_http_parser_set_head_request(p, head_req);
    size_t off = 0, msg_start = 0;
    fz_ev_t e = {p, &out->m[0]};
    e.m->head_len = e.m->body_len = 0;
    for (;;) {
        const gw_http_feed_cbs_t cbs = {fz_head, &e, fz_body, e.m};
        size_t used = 0, before = evbuffer_get_length(b);
        bool eof = false;
        gw_http_state_t st = gw_http_feed_evbuffer_cbs(p, b, &used, &cbs);
        if (before - evbuffer_get_length(b) != used)
            abort(); /* drained what it took */
        off += used;
        if (st == GW_HTTP_HEAD) {
            if (!e.m->head_len || gw_http_msg(p)->status < 500 || e.m->body_len)
                abort(); /* only a 5xx stops, before its body */
            continue;
        }
        if (st == GW_HTTP_NEED_MORE) {
            if (off != len)
                abort(); /* the buffer is used up */
            st = gw_http_feed_eof(p, fz_body, e.m);
            eof = true;
        }
        if (!fz_msg_end(p, head_req, st, eof, e.m, off - msg_start, off == len, out))
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
    if (size > MAX_IN)
        return 0;
    if (!p && !(p = gw_http_parser_new(GW_HTTP_RESPONSE, &fz_lim)))
        abort();
    const char *in = (const char *)data;
    uint64_t seed = 1469598103934665603ull;
    for (size_t i = 0; i < size; i++)
        seed = (seed ^ data[i]) * 1099511628211ull;
    seed |= 1;

    for (int head_req = 0; head_req < 2; head_req++) {
        fz_feed(p, head_req, in, size, NULL, 0, &whole);
        /* the byte loop alone (no one-step head, no 16-byte runs) agrees */
        gw_http_vector_set(false);
        fz_feed(p, head_req, in, size, NULL, 0, &other);
        gw_http_vector_set(true);
        fz_same(&whole, &other);
        for (int round = 0; round < 3 && size > 1; round++) {
            size_t n = 1 + fz_rng(&seed) % 4, k = 0;
            for (size_t i = 0; i < n; i++)
                cuts[k++] = 1 + fz_rng(&seed) % (size - 1);
            for (size_t i = 1; i < k; i++)
                for (size_t j = i; j > 0 && cuts[j - 1] > cuts[j]; j--) {
                    size_t t = cuts[j];
                    cuts[j] = cuts[j - 1];
                    cuts[j - 1] = t;
                }
            fz_feed(p, head_req, in, size, cuts, k, &other);
            fz_same(&whole, &other);
        }
        if (size > 1 && size <= 512) {
            for (size_t i = 1; i < size; i++)
                cuts[i - 1] = i;
            fz_feed(p, head_req, in, size, cuts, size - 1, &other);
            fz_same(&whole, &other);
            fz_feed_ev(p, head_req, in, size, cuts, size - 1, &other);
            fz_same(&whole, &other);
        }
        fz_feed_ev(p, head_req, in, size, NULL, 0, &other);
        fz_same(&whole, &other);
        if (size > 1) { /* pieces of 3 bytes, each its own chain */
            size_t k = 0;
            for (size_t i = 3; i < size; i += 3)
                cuts[k++] = i;
            fz_feed_ev(p, head_req, in, size, cuts, k, &other);
            fz_same(&whole, &other);
        }
    }
    return 0;
}
