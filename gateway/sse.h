/*
 * sse.h — an incremental Server-Sent Events splitter (WHATWG "event stream"
 * framing): fed the upstream's body bytes in any pieces, it finds where each
 * event ends and tells whether the stream's `data: [DONE]` sentinel passed.
 *
 * Two ways to use it:
 *   - scan (cb == NULL): no copy at all. It only tracks line state, so the
 *     relay can move bytes straight to the client and still know when an
 *     event boundary or [DONE] went by. Used when no hook wants events.
 *   - split (cb != NULL): each complete event (its raw bytes, terminating
 *     blank line included) is handed to cb. When an event lies wholly in
 *     one fed piece it is passed in place; otherwise it is assembled in an
 *     internal buffer bounded by max_event_bytes.
 *
 * Lines end in CRLF, LF or CR (a CR at the end of a piece followed by LF at
 * the start of the next is one line end). An event ends at an empty line.
 * Comment lines (starting ':') belong to the event they sit in; an event
 * made only of comments is flagged comment_only.
 *
 * So that events are the same however the input is cut, and no event waits
 * for a byte that may come much later: an event whose blank line ends in CR
 * ends at that CR, and an LF right after it is handed on alone as a
 * comment_only event with raw "\n". A blank line outside any event is a
 * comment_only event of its own too. In split mode the events' raw bytes,
 * concatenated, are exactly the input. One mode per stream (until reset):
 * an event begun in scan mode cannot be finished in split mode (-1).
 * max_event_bytes (0 = 1 MiB) bounds an event in both modes, raw bytes and
 * blank line included; the limit is hit as soon as the event's bytes pass
 * it, not at its end. After -1 every feed returns -1 until reset.
 */
#ifndef GW_SSE_H
#define GW_SSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/sl.h"

typedef struct gw_sse_event {
    const char *raw; /* the event's bytes, blank line included (borrowed) */
    size_t raw_len;
    bool done;         /* the event's data is exactly "[DONE]" */
    bool comment_only; /* only ':' lines (keep-alive pings) */
    /* The data when the event has exactly one data line: its value (one
     * leading space dropped) inside raw, not NUL-terminated; what
     * gw_sse_event_data() would give, found by the split's own pass. NULL
     * otherwise (no data line, or several: call gw_sse_event_data()). */
    const char *data;
    size_t data_len;
} gw_sse_event_t;

/* Return 0 to go on, -1 to stop (gw_sse_feed then returns -1). */
typedef int (*gw_sse_event_cb)(void *arg, const gw_sse_event_t *ev);

typedef struct gw_sse gw_sse_t;

gw_sse_t *gw_sse_new(size_t max_event_bytes);
void gw_sse_free(gw_sse_t *s);
void gw_sse_reset(gw_sse_t *s);
/* For a splitter kept with a cached request struct (conn.c): reset, and
 * its event buffer freed when it grew past GW_SSE_KEEP_BYTES (a long event
 * split across reads), so what is kept stays small. rearm readies it for
 * the next answer's max_event_bytes (0: the default). */
#define GW_SSE_KEEP_BYTES 4096
void gw_sse_recycle(gw_sse_t *s);
void gw_sse_rearm(gw_sse_t *s, size_t max_event_bytes);
/* Tests: line ends found by the two-memchr path (as on a CPU without
 * AVX2), until the next gw_sse_new. */
void gw_sse_no_simd(gw_sse_t *s);
/* Bytes its event buffer holds allocated (tests: what a kept one costs). */
size_t gw_sse_buf_bytes(const gw_sse_t *s);

/* 0 ok; -1 when an event exceeds max_event_bytes or cb returned -1. */
int gw_sse_feed(gw_sse_t *s, const char *p, size_t n, gw_sse_event_cb cb, void *arg) SL_WUR;

bool gw_sse_done_seen(const gw_sse_t *s); /* a [DONE] event completed */

/* The first needle[0..nlen) in h[0..n), or NULL: memchr over needle[pivot],
 * a byte chosen rare in SSE JSON (the ':' of a `"key":`), then one compare
 * per hit. The relay's key scans run on every event's ~200 bytes, where
 * glibc's memmem spends more on its per-call setup (a 256-entry shift table
 * cleared) than on the search. pivot < nlen. */
static inline const char *gw_sse_find(const char *h, size_t n, const char *needle, size_t nlen,
                                      size_t pivot)
{
    if (nlen == 0 || n < nlen)
        return nlen == 0 ? h : NULL;
    const char *p = h + pivot, *last = h + (n - nlen) + pivot; /* pivot's last place */
    while (p <= last) {
        const char *q = memchr(p, (unsigned char)needle[pivot], (size_t)(last - p) + 1);
        if (!q)
            return NULL;
        if (memcmp(q - pivot, needle, nlen) == 0)
            return q - pivot;
        p = q + 1;
    }
    return NULL;
}
/* Bytes of an unfinished event were fed. After gw_sse_feed returned -1: as
 * it was before that call (in scan mode, what the caller had forwarded). */
bool gw_sse_mid_event(const gw_sse_t *s);
/* Complete events so far (comment_only ones excluded). */
size_t gw_sse_events(const gw_sse_t *s);

/* Concatenates the event's data fields (joined with '\n', one leading space
 * after "data:" dropped) into out (cap bytes, NUL-terminated). Returns the
 * data length, or -1 when it does not fit; 0 with out[0]=0 when none. */
long gw_sse_event_data(const gw_sse_event_t *ev, char *out, size_t cap);

/* sse_finish.c: sets bit k of *finished for each choice k (< 64) of the
 * event (a chat or completions chunk) that has a finish_reason. */
void gw_sse_finish_scan(const gw_sse_event_t *ev, uint64_t *finished);
/* The same for a Responses API stream: bit 0 once its last event
 * (response.completed, .incomplete or .failed) went by. */
void gw_sse_responses_scan(const gw_sse_event_t *ev, uint64_t *finished);
/* Every one of n choices has finished (n in 1..64). */
bool gw_sse_finish_all(uint64_t finished, int64_t n);

#endif
