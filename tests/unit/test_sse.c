/*
 * test_sse.c — the SSE splitter (gateway/sse.c): events identical however
 * the stream is cut (every 2- and 3-piece split), [DONE] detection and its
 * near misses, comment-only events, the event size bound, scan vs split.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gateway/sse.h"

/* Splitters made by check_all_splits find line ends without AVX2 (the
 * path of a CPU that lacks it) when set. */
static bool no_simd;

/* ---- a recorder of events ---- */

#define MAX_EV 64

typedef struct rec {
    size_t n;
    char raw[MAX_EV][512];
    size_t len[MAX_EV];
    bool done[MAX_EV];
    bool comment[MAX_EV];
    bool in_place[MAX_EV];
    const char *piece; /* the piece being fed, to tell in-place events */
    size_t piece_len;
    int fail_at;        /* return -1 on this event (0 = never) */
    size_t data_events; /* events whose data came in place */
} rec_t;

static int rec_cb(void *arg, const gw_sse_event_t *ev)
{
    rec_t *r = arg;
    assert_true(r->n < MAX_EV);
    assert_true(ev->raw_len > 0 && ev->raw_len < sizeof(r->raw[0]));
    memcpy(r->raw[r->n], ev->raw, ev->raw_len);
    r->len[r->n] = ev->raw_len;
    r->done[r->n] = ev->done;
    r->comment[r->n] = ev->comment_only;
    r->in_place[r->n] = ev->raw >= r->piece && ev->raw + ev->raw_len <= r->piece + r->piece_len;
    /* the in-place data of a one-data-line event is what the joining
     * gw_sse_event_data gives, however the input was cut */
    char joined[512];
    long jl = gw_sse_event_data(ev, joined, sizeof(joined));
    assert_true(jl >= 0);
    size_t ndata = 0;
    for (size_t i = 0; i + 4 <= ev->raw_len; i++)
        if ((i == 0 || ev->raw[i - 1] == '\n' || ev->raw[i - 1] == '\r') &&
            memcmp(ev->raw + i, "data", 4) == 0 &&
            (i + 4 == ev->raw_len || strchr(":\r\n", ev->raw[i + 4])))
            ndata++;
    if (ndata == 1) {
        assert_non_null(ev->data);
        assert_true(ev->data >= ev->raw && ev->data + ev->data_len <= ev->raw + ev->raw_len);
        assert_int_equal(ev->data_len, (size_t)jl);
        assert_memory_equal(ev->data, joined, (size_t)jl);
    } else {
        assert_null(ev->data);
    }
    r->data_events += ev->data != NULL;
    r->n++;
    if (r->fail_at && (int)r->n == r->fail_at)
        return -1;
    return 0;
}

typedef struct outcome {
    int rc;
    bool done;
    size_t events;
    bool mid;
} outcome_t;

/* Feeds `in` cut at cuts[0..ncuts) (sorted) in split mode (rec != NULL) or
 * scan mode. */
static outcome_t feed_cuts(gw_sse_t *s, const char *in, size_t len, const size_t *cuts,
                           size_t ncuts, rec_t *rec)
{
    outcome_t o = {0};
    size_t start = 0;
    gw_sse_reset(s);
    for (size_t c = 0; c <= ncuts; c++) {
        size_t end = c < ncuts ? cuts[c] : len;
        if (rec) {
            rec->piece = in + start;
            rec->piece_len = end - start;
        }
        o.rc = gw_sse_feed(s, in + start, end - start, rec ? rec_cb : NULL, rec);
        if (o.rc != 0)
            break;
        start = end;
    }
    o.done = gw_sse_done_seen(s);
    o.events = gw_sse_events(s);
    o.mid = gw_sse_mid_event(s);
    return o;
}

static void assert_same_events(const rec_t *a, const rec_t *b)
{
    assert_int_equal(a->n, b->n);
    for (size_t i = 0; i < a->n; i++) {
        assert_int_equal(a->len[i], b->len[i]);
        assert_memory_equal(a->raw[i], b->raw[i], a->len[i]);
        assert_int_equal(a->done[i], b->done[i]);
        assert_int_equal(a->comment[i], b->comment[i]);
    }
}

static void assert_same_outcome(outcome_t a, outcome_t b)
{
    assert_int_equal(a.rc, b.rc);
    assert_int_equal(a.done, b.done);
    assert_int_equal(a.events, b.events);
    if (a.rc == 0) /* after a failure it depends on where the input was cut */
        assert_int_equal(a.mid, b.mid);
}

/* The stream whole, then in every 2-piece and (when three) every 3-piece
 * split: split mode gives the same events, scan mode the same counts. */
static void check_all_splits(const char *in, size_t len, size_t max, bool three, rec_t *whole,
                             outcome_t *wo)
{
    gw_sse_t *s = gw_sse_new(max);
    assert_non_null(s);
    if (no_simd)
        gw_sse_no_simd(s);
    rec_t *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    memset(whole, 0, sizeof(*whole));
    *wo = feed_cuts(s, in, len, NULL, 0, whole);
    outcome_t so = feed_cuts(s, in, len, NULL, 0, NULL);
    assert_same_outcome(*wo, so);
    /* whole: every event lies in the one piece */
    for (size_t k = 0; k < whole->n; k++)
        assert_true(whole->in_place[k]);

    size_t cuts[2];
    for (size_t i = 0; i <= len; i++) {
        cuts[0] = i;
        memset(r, 0, sizeof(*r));
        assert_same_outcome(*wo, feed_cuts(s, in, len, cuts, 1, r));
        assert_same_events(whole, r);
        assert_same_outcome(*wo, feed_cuts(s, in, len, cuts, 1, NULL));
        for (size_t j = i; three && j <= len; j++) {
            cuts[1] = j;
            memset(r, 0, sizeof(*r));
            assert_same_outcome(*wo, feed_cuts(s, in, len, cuts, 2, r));
            assert_same_events(whole, r);
            assert_same_outcome(*wo, feed_cuts(s, in, len, cuts, 2, NULL));
        }
    }
    /* byte by byte */
    size_t *all = malloc((len + 1) * sizeof(*all));
    assert_non_null(all);
    for (size_t i = 1; i < len; i++)
        all[i - 1] = i;
    memset(r, 0, sizeof(*r));
    assert_same_outcome(*wo, feed_cuts(s, in, len, all, len ? len - 1 : 0, r));
    assert_same_events(whole, r);
    free(all);
    free(r);
    gw_sse_free(s);
}

/* ---- tests ---- */

static const char mixed[] = "data: {\"a\":1}\r\n\r\n"             /* CRLF */
                            ": ping\n\n"                          /* LF, comment only */
                            "event: delta\rdata: x\rdata: y\r\r"  /* CR */
                            "id: 7\r\ndata:  two\nretry: 5\r\r\n" /* mixed */
                            "\n"                                  /* stray blank line */
                            "data:[DONE]\r\n\r\n";

static void test_mixed_stream_every_split(void **state)
{
    (void)state;
    rec_t w;
    outcome_t o;
    check_all_splits(mixed, strlen(mixed), 4096, true, &w, &o);
    assert_int_equal(o.rc, 0);
    assert_true(o.done);
    assert_false(o.mid);
    assert_int_equal(o.events, 4); /* comments and blank lines excluded */
    static const struct {
        const char *raw;
        bool done, comment;
    } want[] = {
        {"data: {\"a\":1}\r\n\r", false, false},
        {"\n", false, true},
        {": ping\n\n", false, true},
        {"event: delta\rdata: x\rdata: y\r\r", false, false},
        {"id: 7\r\ndata:  two\nretry: 5\r\r", false, false},
        {"\n", false, true},
        {"\n", false, true},
        {"data:[DONE]\r\n\r", true, false},
        {"\n", false, true},
    };
    assert_int_equal(w.n, SL_ARRAY_LEN(want));
    size_t total = 0;
    for (size_t i = 0; i < w.n; i++) {
        assert_int_equal(w.len[i], strlen(want[i].raw));
        assert_memory_equal(w.raw[i], want[i].raw, w.len[i]);
        assert_int_equal(w.done[i], want[i].done);
        assert_int_equal(w.comment[i], want[i].comment);
        total += w.len[i];
    }
    /* split mode hands out every input byte exactly once */
    assert_int_equal(total, strlen(mixed));
    assert_int_equal(w.data_events, 3); /* {"a":1}, " two", [DONE]; x+y has two lines */
}

/* One data line, found in place (rec_cb checks each against
 * gw_sse_event_data), in every 2- and 3-piece cut. */
static void test_one_data_line_in_place(void **state)
{
    (void)state;
    static const char in[] = "data\n\n"
                             "data:\n\n"
                             "data: \r\n\r\n"
                             ": c\ndata: v w\n: c2\nid: 1\n\n"
                             "event: e\rdata\r\r"
                             "dat: 1\ndatax: 2\ndata:  sp\n\n"
                             "data: a\ndata: b\n\n";
    rec_t w;
    outcome_t o;
    check_all_splits(in, strlen(in), 4096, true, &w, &o);
    assert_int_equal(o.rc, 0);
    assert_int_equal(o.events, 7);
    assert_int_equal(w.data_events, 6);
}

static void test_openai_stream_every_split(void **state)
{
    (void)state;
    const char *in = "data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"
                     "data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"
                     ": keep-alive\n\n"
                     "data: {\"id\":\"c1\",\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}"
                     "\n\n"
                     "data: [DONE]\n\n";
    rec_t w;
    outcome_t o;
    check_all_splits(in, strlen(in), 4096, true, &w, &o);
    assert_int_equal(w.n, 5);
    assert_int_equal(o.events, 4);
    assert_true(o.done);
    assert_true(w.done[4]);
    assert_true(w.comment[2]);
    for (int i = 0; i < 4; i++)
        assert_false(w.done[i]);
}

static void test_done_detection(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        bool done;
    } cases[] = {
        {"data: [DONE]\n\n", true},
        {"data:[DONE]\n\n", true}, /* the space after the colon is optional */
        {"data: [DONE]\r\n\r\n", true},
        {"data: [DONE]\r\r", true},
        {"event: end\ndata: [DONE]\n\n", true},
        {": c\ndata: [DONE]\nid: 5\n\n", true},
        {"data: [DONE] \n\n", false},
        {"data: [DONE]x\n\n", false},
        {"data:  [DONE]\n\n", false},
        {"data: [DONE\n\n", false},
        {"data: [done]\n\n", false},
        {"data: DONE\n\n", false},
        {"data: [DONE]\ndata: [DONE]\n\n", false},
        {"data\ndata: [DONE]\n\n", false},
        {"data: [DONE]\ndata\n\n", false},
        {"Data: [DONE]\n\n", false},
        {"data : [DONE]\n\n", false},
        {"xdata: [DONE]\n\n", false},
        {"datax: [DONE]\n\n", false},
        {": data: [DONE]\n\n", false},
        {"data: [DONE]\n", false}, /* no blank line yet */
        {"data: [DONE]", false},   /* no line end yet */
        {"data: x\n\ndata: [DONE]\n\n", true},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        rec_t w;
        outcome_t o;
        check_all_splits(cases[i].in, strlen(cases[i].in), 4096, false, &w, &o);
        if (o.done != cases[i].done)
            fail_msg("case %zu %s: done %d", i, cases[i].in, o.done);
        size_t nd = 0;
        for (size_t k = 0; k < w.n; k++)
            nd += w.done[k];
        assert_int_equal(nd, cases[i].done ? 1 : 0);
    }
}

static void test_comment_only(void **state)
{
    (void)state;
    rec_t w;
    outcome_t o;
    const char *in = ": ping\n\n:\n: a\n: b\n\n: c\ndata: x\n\n";
    check_all_splits(in, strlen(in), 4096, true, &w, &o);
    assert_int_equal(w.n, 3);
    assert_true(w.comment[0]);
    assert_true(w.comment[1]);
    assert_false(w.comment[2]);
    assert_int_equal(o.events, 1);
    assert_false(o.done);
}

static void test_mid_event(void **state)
{
    (void)state;
    gw_sse_t *s = gw_sse_new(0);
    assert_false(gw_sse_mid_event(s));
    assert_int_equal(gw_sse_feed(s, "da", 2, NULL, NULL), 0);
    assert_true(gw_sse_mid_event(s));
    assert_int_equal(gw_sse_feed(s, "ta: x\n", 6, NULL, NULL), 0);
    assert_true(gw_sse_mid_event(s));
    assert_int_equal(gw_sse_feed(s, "\n", 1, NULL, NULL), 0);
    assert_false(gw_sse_mid_event(s));
    assert_int_equal(gw_sse_events(s), 1);
    /* a CR-ended event is complete at the CR; a pending LF is not an event */
    assert_int_equal(gw_sse_feed(s, "data: y\r\n\r", 10, NULL, NULL), 0);
    assert_false(gw_sse_mid_event(s));
    assert_int_equal(gw_sse_events(s), 2);
    assert_int_equal(gw_sse_feed(s, "\n", 1, NULL, NULL), 0);
    assert_false(gw_sse_mid_event(s));
    assert_int_equal(gw_sse_events(s), 2);
    /* a pending CR inside an event */
    assert_int_equal(gw_sse_feed(s, "data: z\r", 8, NULL, NULL), 0);
    assert_true(gw_sse_mid_event(s));
    gw_sse_reset(s);
    assert_false(gw_sse_mid_event(s));
    assert_int_equal(gw_sse_events(s), 0);
    gw_sse_free(s);
    gw_sse_free(NULL);
}

static void test_max_event_bytes(void **state)
{
    (void)state;
    char in[256];
    rec_t w;
    outcome_t o;
    /* 40 bytes of event, blank line included */
    snprintf(in, sizeof(in), "data: %.32s\n\n", "0123456789012345678901234567890123");
    assert_int_equal(strlen(in), 40);
    check_all_splits(in, 40, 40, true, &w, &o);
    assert_int_equal(o.rc, 0);
    assert_int_equal(w.n, 1);
    check_all_splits(in, 40, 39, true, &w, &o);
    assert_int_equal(o.rc, -1);
    assert_int_equal(w.n, 0);
    /* events before the oversized one are delivered, then it stops */
    snprintf(in, sizeof(in), "data: a\n\ndata: %.32s\n\ndata: b\n\n",
             "0123456789012345678901234567890123");
    check_all_splits(in, strlen(in), 39, true, &w, &o);
    assert_int_equal(o.rc, -1);
    assert_int_equal(w.n, 1);
    assert_int_equal(o.events, 1);
    /* an endless line fails without waiting for its end, and stays failed */
    gw_sse_t *s = gw_sse_new(64);
    char big[100];
    memset(big, 'x', sizeof(big));
    assert_int_equal(gw_sse_feed(s, "data: ", 6, NULL, NULL), 0);
    assert_int_equal(gw_sse_feed(s, big, sizeof(big), NULL, NULL), -1);
    assert_true(gw_sse_mid_event(s)); /* "data: " had gone out */
    assert_int_equal(gw_sse_feed(s, "\n\n", 2, NULL, NULL), -1);
    /* a failing piece that completed an event first: what went out before
     * it ("data: a") is still an open event for the client */
    gw_sse_reset(s);
    assert_int_equal(gw_sse_feed(s, "data: a", 7, NULL, NULL), 0);
    char two[128];
    snprintf(two, sizeof(two), "\n\ndata: %.70s", big);
    assert_int_equal(gw_sse_feed(s, two, strlen(two), NULL, NULL), -1);
    assert_true(gw_sse_mid_event(s));
    gw_sse_reset(s);
    assert_int_equal(gw_sse_feed(s, two + 2, strlen(two) - 2, NULL, NULL), -1);
    assert_false(gw_sse_mid_event(s));
    gw_sse_reset(s);
    assert_int_equal(gw_sse_feed(s, "data: ok\n\n", 10, NULL, NULL), 0);
    assert_int_equal(gw_sse_events(s), 1);
    gw_sse_free(s);
}

static void test_callback_stop(void **state)
{
    (void)state;
    gw_sse_t *s = gw_sse_new(0);
    rec_t *r = calloc(1, sizeof(*r));
    r->fail_at = 2;
    const char *in = "data: 1\n\ndata: 2\n\ndata: 3\n\n";
    r->piece = in;
    r->piece_len = strlen(in);
    assert_int_equal(gw_sse_feed(s, in, strlen(in), rec_cb, r), -1);
    assert_int_equal(r->n, 2);
    assert_int_equal(gw_sse_feed(s, "data: 4\n\n", 9, rec_cb, r), -1);
    assert_int_equal(r->n, 2);
    free(r);
    gw_sse_free(s);
}

static void test_in_place_and_assembled(void **state)
{
    (void)state;
    gw_sse_t *s = gw_sse_new(0);
    rec_t *r = calloc(1, sizeof(*r));
    const char *a = "data: 1\n\ndata: 2";
    const char *b = "2\n\ndata: 3\n\n";
    r->piece = a;
    r->piece_len = strlen(a);
    assert_int_equal(gw_sse_feed(s, a, strlen(a), rec_cb, r), 0);
    r->piece = b;
    r->piece_len = strlen(b);
    assert_int_equal(gw_sse_feed(s, b, strlen(b), rec_cb, r), 0);
    assert_int_equal(r->n, 3);
    assert_true(r->in_place[0]);
    assert_false(r->in_place[1]); /* assembled from both pieces */
    assert_memory_equal(r->raw[1], "data: 22\n\n", 10);
    assert_true(r->in_place[2]);
    /* a stream begun in scan mode cannot switch to split mid-event */
    gw_sse_reset(s);
    assert_int_equal(gw_sse_feed(s, "data: x", 7, NULL, NULL), 0);
    assert_int_equal(gw_sse_feed(s, "\n\n", 2, rec_cb, r), -1);
    free(r);
    gw_sse_free(s);
}

/* A splitter recycled with its request struct (proxy.c, conn.c) starts as
 * a new one: an event half read, a failure, a [DONE] and the counts of the
 * stream before are gone, a long event's buffer too, and the next
 * answer's max_event_bytes applies. */
static void test_recycle_rearm(void **state)
{
    (void)state;
    gw_sse_t *s = gw_sse_new(0);
    rec_t *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    static char big[3 * GW_SSE_KEEP_BYTES];
    memcpy(big, "data: ", 6);
    memset(big + 6, 'x', sizeof(big) - 6);
    const char *d = "data: [DONE]\n\n";
    r->piece = d;
    r->piece_len = strlen(d);
    assert_int_equal(gw_sse_feed(s, d, strlen(d), rec_cb, r), 0);
    r->piece = big;
    r->piece_len = sizeof(big);
    assert_int_equal(gw_sse_feed(s, big, sizeof(big), rec_cb, r), 0); /* buffered, grown */
    assert_true(gw_sse_mid_event(s));
    assert_true(gw_sse_done_seen(s));
    assert_true(gw_sse_buf_bytes(s) >= sizeof(big));
    gw_sse_recycle(s);
    assert_int_equal(gw_sse_buf_bytes(s), 0); /* past GW_SSE_KEEP_BYTES: freed */
    gw_sse_rearm(s, 64);
    assert_false(gw_sse_mid_event(s));
    assert_false(gw_sse_done_seen(s));
    assert_int_equal(gw_sse_events(s), 0);
    /* the new stream's first event is only its own bytes */
    const char *a = "data: 1\n\n";
    r->n = 0;
    r->piece = a;
    r->piece_len = strlen(a);
    assert_int_equal(gw_sse_feed(s, a, strlen(a), rec_cb, r), 0);
    assert_int_equal(r->n, 1);
    assert_int_equal(r->len[0], strlen(a));
    assert_memory_equal(r->raw[0], a, strlen(a));
    /* the new bound: 64 bytes */
    assert_int_equal(gw_sse_feed(s, big, 100, NULL, NULL), -1);
    /* a small buffer is kept: the next split event needs no allocation */
    gw_sse_rearm(s, 0);
    assert_int_equal(gw_sse_feed(s, "data: 2", 7, rec_cb, r), 0);
    size_t small = gw_sse_buf_bytes(s);
    assert_true(small > 0 && small <= GW_SSE_KEEP_BYTES);
    gw_sse_recycle(s);
    assert_int_equal(gw_sse_buf_bytes(s), small);
    /* failed, recycled again: usable, with the default bound back */
    assert_int_equal(gw_sse_feed(s, big, 100, NULL, NULL), 0);
    gw_sse_recycle(s);
    gw_sse_rearm(s, 0);
    assert_int_equal(gw_sse_feed(s, big, 100, NULL, NULL), 0);
    assert_int_equal(gw_sse_feed(s, "\n\n", 2, NULL, NULL), 0);
    assert_int_equal(gw_sse_events(s), 1);
    free(r);
    gw_sse_free(s);
}

static long data_of(const char *raw, char *out, size_t cap)
{
    gw_sse_event_t ev = {.raw = raw, .raw_len = strlen(raw)};
    return gw_sse_event_data(&ev, out, cap);
}

static void test_event_data(void **state)
{
    (void)state;
    char out[64];
    assert_int_equal(data_of("data: {\"a\":1}\n\n", out, sizeof(out)), 7);
    assert_string_equal(out, "{\"a\":1}");
    assert_int_equal(
        data_of("event: x\r\ndata:a\r\n: c\r\ndata:  b\r\ndata\r\nid: 1\r\n\r", out, sizeof(out)),
        5);
    assert_memory_equal(out, "a\n b\n\0", 6);
    assert_int_equal(data_of("data: x\rdata: y\r\r", out, sizeof(out)), 3);
    assert_string_equal(out, "x\ny");
    assert_int_equal(data_of(": ping\n\n", out, sizeof(out)), 0);
    assert_string_equal(out, "");
    assert_int_equal(data_of("\n", out, sizeof(out)), 0);
    assert_int_equal(data_of("datax: 1\ndat: 2\n\n", out, sizeof(out)), 0);
    /* bytes after the blank line are not part of the event */
    assert_int_equal(data_of("data: 1\n\ndata: 2\n\n", out, sizeof(out)), 1);
    /* fits exactly (3 bytes + NUL), one short fails */
    assert_int_equal(data_of("data: abc\n\n", out, 4), 3);
    assert_string_equal(out, "abc");
    assert_int_equal(data_of("data: abc\n\n", out, 3), -1);
    assert_int_equal(data_of("data: a\ndata: b\n\n", out, 3), -1);
    assert_int_equal(data_of("data: a\ndata: b\n\n", out, 4), 3);
    assert_int_equal(data_of(": x\n\n", out, 0), -1);
}

/* gw_sse_find against glibc's memmem: every needle/pivot over random
 * haystacks of a small alphabet (many near misses), any length and place. */
static void test_find_is_memmem(void **state)
{
    (void)state;
    static const char *const needles[] = {"\"usage\":", "\"finish_reason\"", "\":", "a", "ab:"};
    char h[96];
    uint32_t x = 12345;
    for (int it = 0; it < 20000; it++) {
        size_t n = (size_t)(x % sizeof(h));
        for (size_t i = 0; i < n; i++) {
            x = x * 1103515245u + 12345u;
            h[i] = "\"a:b_usg"[(x >> 16) % 8];
        }
        const char *nd = needles[it % 5];
        size_t nl = strlen(nd);
        if (n >= nl && (x >> 8) % 3 == 0) /* plant it somewhere */
            memcpy(h + (x >> 4) % (n - nl + 1), nd, nl);
        for (size_t pv = 0; pv < nl; pv++)
            assert_ptr_equal(gw_sse_find(h, n, nd, nl, pv), memmem(h, n, nd, nl));
        x = x * 1103515245u + 12345u;
    }
    assert_null(gw_sse_find("\"usage\"", 7, "\"usage\":", 8, 7));
}

/* The line-end scan (32 bytes a step with AVX2, a piece's tail as one
 * overlapping block, a piece under 32 bytes byte by byte) and the "data:"
 * name taken in one step: one-data-line events whose value is every length
 * around the block sizes, ended by LF, CR or CRLF, with a CR or LF at each
 * place of a long line, in every 2-piece cut and byte by byte, both paths.
 * Each event's bytes and in-place data are checked against the input. */
static void check_line_ends(void)
{
    static const char *const ends[] = {"\n\n", "\r\r", "\r\n\r\n"};
    static const size_t lens[] = {0, 1, 2, 5, 25, 26, 27, 31, 32, 33, 58, 63, 64, 65, 97, 200};
    char in[600], val[256];
    for (size_t e = 0; e < SL_ARRAY_LEN(ends); e++) {
        for (size_t k = 0; k < SL_ARRAY_LEN(lens); k++) {
            size_t L = lens[k];
            for (size_t i = 0; i < L; i++)
                val[i] = "{\"a\":[1, 2]}wxyz"[i % 16]; /* ':' and ' ' inside too */
            /* an event, a comment in an event with no data, the first event again */
            int n = snprintf(in, sizeof(in), "data: %.*s%s: c\nevent: x%sdata:%.*s%s", (int)L, val,
                             ends[e], ends[e], (int)L, val, ends[e]);
            assert_true(n > 0 && (size_t)n < sizeof(in));
            rec_t w;
            outcome_t o;
            check_all_splits(in, (size_t)n, 4096, false, &w, &o);
            assert_int_equal(o.rc, 0);
            assert_int_equal(o.events, 3);
            assert_false(o.mid);
            size_t lf_tail = e == 2 ? 1 : 0;        /* a CRLF blank line's LF: an event alone */
            assert_int_equal(w.n, 3 + 3 * lf_tail); /* the comment is in event 2 */
            size_t hl = 6 + L + strlen(ends[e]) - lf_tail;
            assert_int_equal(w.len[0], hl);
            assert_memory_equal(w.raw[0], in, hl);
            assert_int_equal(w.data_events, 2);
            size_t total = 0;
            for (size_t i = 0; i < w.n; i++)
                total += w.len[i];
            assert_int_equal(total, (size_t)n);
        }
    }
    /* a CR or LF at each place of a long line ends it there: two data lines */
    for (int at = 0; at < 100; at++) {
        for (int cr = 0; cr < 2; cr++) {
            memset(val, 'v', 100);
            int n = snprintf(in, sizeof(in), "data: %.*s%cdata:%.*s\n\n", at, val, cr ? '\r' : '\n',
                             100 - at, val);
            char want[128];
            int wl = snprintf(want, sizeof(want), "%.*s\n%.*s", at, val, 100 - at, val);
            rec_t w;
            outcome_t o;
            check_all_splits(in, (size_t)n, 4096, false, &w, &o);
            assert_int_equal(o.events, 1);
            assert_int_equal(w.n, 1);
            assert_int_equal(w.data_events, 0); /* two data lines: joined, not in place */
            char got[128];
            gw_sse_event_t ev = {.raw = w.raw[0], .raw_len = w.len[0]};
            assert_int_equal(gw_sse_event_data(&ev, got, sizeof(got)), wl);
            assert_memory_equal(got, want, (size_t)wl);
        }
    }
}

static void test_line_ends(void **state)
{
    (void)state;
    check_line_ends();
    no_simd = true;
    check_line_ends();
    no_simd = false;
}

/* The whole suite's every-split checks once more on the two-memchr path. */
static void test_no_simd_every_split(void **state)
{
    no_simd = true;
    test_mixed_stream_every_split(state);
    test_openai_stream_every_split(state);
    test_one_data_line_in_place(state);
    test_done_detection(state);
    test_comment_only(state);
    no_simd = false;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixed_stream_every_split),
        cmocka_unit_test(test_openai_stream_every_split),
        cmocka_unit_test(test_one_data_line_in_place),
        cmocka_unit_test(test_done_detection),
        cmocka_unit_test(test_comment_only),
        cmocka_unit_test(test_mid_event),
        cmocka_unit_test(test_max_event_bytes),
        cmocka_unit_test(test_callback_stop),
        cmocka_unit_test(test_in_place_and_assembled),
        cmocka_unit_test(test_recycle_rearm),
        cmocka_unit_test(test_event_data),
        cmocka_unit_test(test_find_is_memmem),
        cmocka_unit_test(test_line_ends),
        cmocka_unit_test(test_no_simd_every_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
