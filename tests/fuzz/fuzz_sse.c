/*
 * fuzz_sse.c — libFuzzer target for the SSE splitter (gateway/sse.c). The
 * input is an event-stream body. Beyond "no crash" it checks:
 *   - split mode fed whole and in pseudo-random pieces (byte by byte for
 *     small inputs) gives the same events;
 *   - scan mode agrees with split mode on result, [DONE], event count and
 *     mid-event state, whatever the pieces;
 *   - the events' raw bytes, concatenated, are the input (all of it unless
 *     an event is unfinished), each event ends in a line end, no event
 *     exceeds max_event_bytes;
 *   - done is set exactly when gw_sse_event_data() gives "[DONE]".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/sse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_IN 8192
#define MAX_EV 4096

typedef struct fz_rec {
    size_t n;
    size_t off[MAX_EV], len[MAX_EV]; /* in cat */
    bool done[MAX_EV], comment[MAX_EV];
    char cat[MAX_IN];
    size_t cat_len;
    size_t max;
} fz_rec_t;

typedef struct fz_out {
    int rc;
    bool done, mid;
    size_t events;
} fz_out_t;

static char fz_data[MAX_IN + 1];

static int fz_cb(void *arg, const gw_sse_event_t *ev)
{
    fz_rec_t *r = arg;
    if (r->n >= MAX_EV || ev->raw_len == 0 || ev->raw_len > r->max ||
        r->cat_len + ev->raw_len > sizeof(r->cat))
        abort();
    char last = ev->raw[ev->raw_len - 1];
    if (last != '\n' && last != '\r')
        abort();
    long dl = gw_sse_event_data(ev, fz_data, sizeof(fz_data));
    if (dl < 0 || fz_data[dl] != '\0') /* data may hold NULs itself */
        abort();
    bool is_done = dl == 6 && memcmp(fz_data, "[DONE]", 6) == 0;
    if (is_done != ev->done || (ev->comment_only && (ev->done || dl != 0)))
        abort();
    memcpy(r->cat + r->cat_len, ev->raw, ev->raw_len);
    r->off[r->n] = r->cat_len;
    r->len[r->n] = ev->raw_len;
    r->done[r->n] = ev->done;
    r->comment[r->n] = ev->comment_only;
    r->cat_len += ev->raw_len;
    r->n++;
    return 0;
}

static fz_out_t fz_feed(gw_sse_t *s, const char *in, size_t len, const size_t *cuts, size_t ncuts,
                        fz_rec_t *rec)
{
    fz_out_t o = {0};
    size_t start = 0;
    gw_sse_reset(s);
    for (size_t c = 0; c <= ncuts; c++) {
        size_t end = c < ncuts ? cuts[c] : len;
        o.rc = gw_sse_feed(s, in + start, end - start, rec ? fz_cb : NULL, rec);
        if (o.rc != 0)
            break;
        start = end;
    }
    o.done = gw_sse_done_seen(s);
    o.mid = gw_sse_mid_event(s);
    o.events = gw_sse_events(s);
    return o;
}

static void fz_same_out(fz_out_t a, fz_out_t b)
{
    if (a.rc != b.rc || a.done != b.done || a.events != b.events || (a.rc == 0 && a.mid != b.mid))
        abort();
}

static void fz_same_rec(const fz_rec_t *a, const fz_rec_t *b)
{
    if (a->n != b->n || a->cat_len != b->cat_len || memcmp(a->cat, b->cat, a->cat_len) != 0)
        abort();
    for (size_t i = 0; i < a->n; i++)
        if (a->len[i] != b->len[i] || a->done[i] != b->done[i] || a->comment[i] != b->comment[i])
            abort();
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
    static fz_rec_t whole, other;
    static size_t cuts[MAX_IN];
    if (size > MAX_IN)
        return 0;
    const char *in = (const char *)data;
    uint64_t seed = 1469598103934665603ull;
    for (size_t i = 0; i < size; i++)
        seed = (seed ^ data[i]) * 1099511628211ull;
    seed |= 1;
    /* a small bound (hit often) and one no event here can reach */
    static const size_t maxes[] = {64, MAX_IN + 1};
    for (size_t mi = 0; mi < 2; mi++) {
        gw_sse_t *s = gw_sse_new(maxes[mi]);
        if (!s)
            abort();
        memset(&whole, 0, sizeof(whole));
        whole.max = maxes[mi];
        fz_out_t w = fz_feed(s, in, size, NULL, 0, &whole);
        fz_same_out(w, fz_feed(s, in, size, NULL, 0, NULL));
        /* the events are the input, in order, nothing left out */
        if (whole.cat_len > size || memcmp(whole.cat, in, whole.cat_len) != 0)
            abort();
        if (w.rc == 0 && !w.mid && whole.cat_len != size)
            abort();
        if (w.rc == 0 && w.mid && whole.cat_len == size)
            abort();
        if (mi == 1 && w.rc != 0)
            abort();
        size_t nev = 0, ndone = 0;
        for (size_t i = 0; i < whole.n; i++) {
            nev += !whole.comment[i];
            ndone += whole.done[i];
        }
        if (nev != w.events || (ndone > 0) != w.done)
            abort();

        for (int round = 0; round < 4 && size > 1; round++) {
            size_t n = 1 + fz_rng(&seed) % 5, k = 0;
            for (size_t i = 0; i < n; i++)
                cuts[k++] = 1 + fz_rng(&seed) % (size - 1);
            for (size_t i = 1; i < k; i++)
                for (size_t j = i; j > 0 && cuts[j - 1] > cuts[j]; j--) {
                    size_t t = cuts[j];
                    cuts[j] = cuts[j - 1];
                    cuts[j - 1] = t;
                }
            memset(&other, 0, offsetof(fz_rec_t, cat));
            other.cat_len = 0;
            other.max = maxes[mi];
            fz_same_out(w, fz_feed(s, in, size, cuts, k, &other));
            fz_same_rec(&whole, &other);
            fz_same_out(w, fz_feed(s, in, size, cuts, k, NULL));
        }
        if (size > 1 && size <= 1024) {
            for (size_t i = 1; i < size; i++)
                cuts[i - 1] = i;
            memset(&other, 0, offsetof(fz_rec_t, cat));
            other.cat_len = 0;
            other.max = maxes[mi];
            fz_same_out(w, fz_feed(s, in, size, cuts, size - 1, &other));
            fz_same_rec(&whole, &other);
            fz_same_out(w, fz_feed(s, in, size, cuts, size - 1, NULL));
        }
        gw_sse_free(s);
    }
    return 0;
}
