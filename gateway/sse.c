/*
 * sse.c — the incremental SSE splitter (see sse.h for the contract).
 *
 * One pass over the bytes with a small line state: at a line's start it
 * tells comment from field, follows the field name far enough to know a
 * "data" line, and follows a data value far enough to know "[DONE]"; the
 * rest of a line is skipped by sse_eol (one pass for CR and LF with AVX2).
 * A line that starts with "data:" whole in the piece skips its name in one
 * step, so the usual event ("data: {...}" and a blank line) costs three
 * turns of the loop. Scan and split mode run the same
 * code; split mode only adds handing out event bytes, in place when the
 * event began in the piece being fed, else from a buffer that holds the
 * event's earlier bytes (bounded by max_event_bytes, grown on demand).
 *
 * Line ends: CR, LF or CRLF. An event ends at the end of its blank line,
 * which for a CR-ended blank line is the CR itself (the event goes out at
 * once, not when the next byte happens to arrive). The LF of such a CRLF is
 * then handed on alone as a comment_only event with raw "\n", so that
 * events are the same however the input was cut and split mode's output
 * bytes are exactly its input bytes. A blank line outside any event is
 * likewise a comment_only event of its own; neither counts as an event.
 */
#include "gateway/sse.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SSE_EOL_X86 1
#endif

#define GW_SSE_DEFAULT_MAX (1u << 20)

enum {
    LS_START = 0, /* at a line's first byte */
    LS_NAME,      /* in a field name that may still be "data" */
    LS_VSP,       /* right after "data:": one space is dropped */
    LS_VALUE,     /* in a data value that may still be "[DONE]" */
    LS_SKIP,      /* the rest of a line that cannot matter */
    LS_SKIP_DATA, /* the rest of a data line that is not "[DONE]" */
};

enum {
    CR_NONE = 0,
    CR_LINE,  /* a CR ended a line inside an event: an LF next is its tail */
    CR_EVENT, /* a CR ended a blank line: an LF next is a pseudo event */
};

struct gw_sse {
    size_t max;
    int ls;
    int after_cr;
    int npos; /* bytes of "data" matched in the field name, -1 when not */
    int dpos; /* bytes of "[DONE]" matched in the value, -1 when not */
    unsigned ndata;
    size_t v_off; /* where the current data line's value begins (event offset) */
    size_t d_off; /* the first data line's value: offset and length */
    size_t d_len;
    bool done_cand; /* the event's only data line so far is "[DONE]" */
    bool has_field; /* a line other than a comment */
    size_t ev_prev; /* bytes of the current event fed in earlier pieces */
    bool buffered;  /* ...and they are in buf (split mode) */
    char *buf;
    size_t buf_len, buf_cap;
    bool failed;
    bool mid_at_fail; /* gw_sse_mid_event() once failed */
    bool done_seen;
    bool avx2; /* sse_eol's one pass (else two memchr) */
    size_t events;
};

static bool sse_cpu_avx2(void)
{
#ifdef SSE_EOL_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
#else
    return false;
#endif
}

gw_sse_t *gw_sse_new(size_t max_event_bytes)
{
    gw_sse_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->max = max_event_bytes ? max_event_bytes : GW_SSE_DEFAULT_MAX;
    s->avx2 = sse_cpu_avx2();
    return s;
}

void gw_sse_free(gw_sse_t *s)
{
    if (!s)
        return;
    free(s->buf);
    free(s);
}

void gw_sse_reset(gw_sse_t *s)
{
    char *buf = s->buf;
    size_t cap = s->buf_cap, max = s->max;
    bool avx2 = s->avx2;
    memset(s, 0, sizeof(*s));
    s->buf = buf;
    s->buf_cap = cap;
    s->max = max;
    s->avx2 = avx2;
}

void gw_sse_recycle(gw_sse_t *s)
{
    if (s->buf_cap > GW_SSE_KEEP_BYTES) {
        free(s->buf);
        s->buf = NULL;
        s->buf_cap = 0;
    }
    gw_sse_reset(s);
}

void gw_sse_rearm(gw_sse_t *s, size_t max_event_bytes)
{
    gw_sse_reset(s);
    s->max = max_event_bytes ? max_event_bytes : GW_SSE_DEFAULT_MAX;
}

void gw_sse_no_simd(gw_sse_t *s)
{
    s->avx2 = false;
}

size_t gw_sse_buf_bytes(const gw_sse_t *s)
{
    return s->buf_cap;
}

/* After a failure mid_event tells what the input before the failing call
 * left open: in scan mode the caller forwarded exactly that input. */
SL_COLD static int sse_fail(gw_sse_t *s, bool mid_at_entry)
{
    s->failed = true;
    s->mid_at_fail = mid_at_entry;
    return -1;
}

static int buf_append(gw_sse_t *s, const char *p, size_t n)
{
    if (s->buf_len + n > s->buf_cap) {
        size_t cap = s->buf_cap ? s->buf_cap : 1024;
        while (cap < s->buf_len + n)
            cap *= 2;
        cap = SL_MIN(cap, s->max); /* callers checked buf_len + n <= max */
        char *nb = realloc(s->buf, cap);
        if (!nb)
            return -1;
        s->buf = nb;
        s->buf_cap = cap;
    }
    memcpy(s->buf + s->buf_len, p, n);
    s->buf_len += n;
    return 0;
}

/* The event made of the earlier pieces' bytes and p[start, end) is complete. */
static int sse_dispatch(gw_sse_t *s, const char *p, size_t start, size_t end, gw_sse_event_cb cb,
                        void *arg)
{
    size_t len = s->ev_prev + (end - start);
    if (len > s->max)
        return -1;
    gw_sse_event_t ev = {
        .raw = p + start,
        .raw_len = len,
        .done = s->ndata == 1 && s->done_cand,
        .comment_only = !s->has_field,
    };
    if (ev.done)
        s->done_seen = true;
    if (s->has_field)
        s->events++;
    int rc = 0;
    if (cb) {
        if (s->ev_prev) {
            if (buf_append(s, p + start, end - start) != 0)
                return -1;
            ev.raw = s->buf;
        }
        if (s->ndata == 1) {
            ev.data = ev.raw + s->d_off;
            ev.data_len = s->d_len;
        }
        rc = cb(arg, &ev);
    }
    s->ev_prev = 0;
    s->buf_len = 0;
    s->buffered = false;
    s->ndata = 0;
    s->done_cand = false;
    s->has_field = false;
    return rc;
}

/* A non-blank line ended (at CR or LF c) at event offset off. */
static void sse_line_end(gw_sse_t *s, char c, size_t off)
{
    if (s->ls == LS_VALUE || s->ls == LS_VSP || s->ls == LS_SKIP_DATA ||
        (s->ls == LS_NAME && s->npos == 4)) {
        if (s->ndata == 0) { /* "data" with no ':' has an empty value */
            s->d_off = s->ls == LS_NAME ? off : s->v_off;
            s->d_len = off - s->d_off;
        }
        s->ndata++;
        s->done_cand = s->ndata == 1 && s->ls == LS_VALUE && s->dpos == 6;
    }
    s->ls = LS_START;
    s->after_cr = c == '\r' ? CR_LINE : CR_NONE;
}

#ifdef SSE_EOL_X86
/* The CR and LF bytes of p[0, 32) as bits. */
__attribute__((target("avx2"))) static inline uint32_t sse_eol32(const char *p)
{
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    __m256i e = _mm256_or_si256(_mm256_cmpeq_epi8(v, _mm256_set1_epi8('\n')),
                                _mm256_cmpeq_epi8(v, _mm256_set1_epi8('\r')));
    return (uint32_t)_mm256_movemask_epi8(e);
}

/* sse_eol with AVX2: 32 bytes a step, both bytes at once; the piece's last
 * 32 bytes are read as one block that overlaps what was passed (masked). */
__attribute__((target("avx2"))) static size_t sse_eol_avx2(const char *p, size_t i, size_t n)
{
    for (; i + 32 <= n; i += 32) {
        uint32_t m = sse_eol32(p + i);
        if (m)
            return i + (size_t)__builtin_ctz(m);
    }
    if (i == n)
        return n;
    if (n >= 32) {
        uint32_t m = sse_eol32(p + n - 32) >> (32 - (n - i));
        return m ? i + (size_t)__builtin_ctz(m) : n;
    }
    for (; i < n; i++) /* a piece shorter than 32 bytes */
        if (p[i] == '\n' || p[i] == '\r')
            break;
    return i;
}
#endif

/* Where the line at p[i] ends: its first CR or LF, or n (it goes on in the
 * next piece). The bulk of a stream (the JSON after "data: ") goes by
 * here: one pass with AVX2, else an LF search and a CR search before it. */
static inline size_t sse_eol(const gw_sse_t *s, const char *p, size_t i, size_t n)
{
#ifdef SSE_EOL_X86
    if (s->avx2)
        return sse_eol_avx2(p, i, n);
#endif
    const char *lf = memchr(p + i, '\n', n - i);
    size_t lim = lf ? (size_t)(lf - p) : n;
    const char *cr = memchr(p + i, '\r', lim - i);
    return cr ? (size_t)(cr - p) : lim;
}

int gw_sse_feed(gw_sse_t *s, const char *p, size_t n, gw_sse_event_cb cb, void *arg)
{
    static const char data_name[] = "data", done_value[] = "[DONE]";
    if (s->failed)
        return -1;
    const bool mid0 = s->ev_prev > 0;
    if (cb && s->ev_prev && !s->buffered)
        return sse_fail(s, mid0); /* the event began in scan mode: its bytes are gone */
    size_t i = 0, start = 0;
    while (i < n) {
        char c = p[i];
        if (s->after_cr) {
            int k = s->after_cr;
            s->after_cr = CR_NONE;
            if (c == '\n') {
                if (k == CR_EVENT) {
                    if (sse_dispatch(s, p, i, i + 1, cb, arg) != 0)
                        return sse_fail(s, mid0);
                    start = i + 1;
                }
                i++;
                continue;
            }
        }
        switch (s->ls) {
        case LS_START:
            if (c == 'd' && n - i >= 6 && memcmp(p + i, "data:", 5) == 0) {
                /* the usual line: its name and the space in one step */
                s->has_field = true;
                s->npos = 4;
                s->dpos = 0;
                size_t v = i + 5 + (p[i + 5] == ' ');
                s->v_off = s->ev_prev + v - start;
                s->ls = LS_VALUE;
                i = v;
                continue;
            }
            if (c == '\r' || c == '\n') { /* blank line */
                if (sse_dispatch(s, p, start, i + 1, cb, arg) != 0)
                    return sse_fail(s, mid0);
                start = i + 1;
                s->after_cr = c == '\r' ? CR_EVENT : CR_NONE;
            } else if (c == ':') {
                s->ls = LS_SKIP;
            } else {
                s->has_field = true;
                s->npos = c == 'd' ? 1 : -1;
                s->ls = c == 'd' ? LS_NAME : LS_SKIP;
            }
            i++;
            break;
        case LS_NAME:
            if (c == '\r' || c == '\n') {
                sse_line_end(s, c, s->ev_prev + i - start);
            } else if (c == ':') {
                s->ls = s->npos == 4 ? LS_VSP : LS_SKIP;
                s->dpos = 0;
                s->v_off = s->ev_prev + i + 1 - start;
            } else if (s->npos < 4 && c == data_name[s->npos]) {
                s->npos++;
            } else {
                s->ls = LS_SKIP;
            }
            i++;
            break;
        case LS_VSP:
            s->ls = LS_VALUE;
            if (c == ' ') {
                s->v_off++;
                i++;
                break;
            }
            /* fall through */
        case LS_VALUE:
            if (c == '\r' || c == '\n') {
                sse_line_end(s, c, s->ev_prev + i - start);
            } else if (s->dpos < 6 && c == done_value[s->dpos]) {
                s->dpos++;
            } else { /* c is no line end: the scan below starts at it */
                s->ls = LS_SKIP_DATA;
                goto skip;
            }
            i++;
            break;
        case LS_SKIP:
        case LS_SKIP_DATA:
        skip : {
            size_t e = sse_eol(s, p, i, n);
            if (e == n) {
                i = n;
                break;
            }
            sse_line_end(s, p[e], s->ev_prev + e - start);
            i = e + 1;
            break;
        }
        }
    }
    if (n > start) { /* the current event goes on in the next piece */
        size_t k = n - start;
        if (s->ev_prev + k > s->max)
            return sse_fail(s, mid0);
        if (cb && buf_append(s, p + start, k) != 0)
            return sse_fail(s, mid0);
        s->ev_prev += k;
        s->buffered = cb != NULL;
    }
    return 0;
}

bool gw_sse_done_seen(const gw_sse_t *s)
{
    return s->done_seen;
}

bool gw_sse_mid_event(const gw_sse_t *s)
{
    return s->failed ? s->mid_at_fail : s->ev_prev > 0;
}

size_t gw_sse_events(const gw_sse_t *s)
{
    return s->events;
}

long gw_sse_event_data(const gw_sse_event_t *ev, char *out, size_t cap)
{
    const char *q = ev->raw, *end = ev->raw + ev->raw_len;
    size_t o = 0;
    bool any = false;
    if (cap == 0)
        return -1;
    while (q < end) {
        /* the line ends at its first CR or LF: two vector searches, not a
         * byte loop (an event is typically one ~200-byte data line) */
        const char *le = memchr(q, '\n', (size_t)(end - q));
        if (!le)
            le = end;
        const char *cr = memchr(q, '\r', (size_t)(le - q));
        if (cr)
            le = cr;
        size_t ll = (size_t)(le - q);
        if (ll == 0)
            break; /* the blank line */
        const char *colon = memchr(q, ':', ll);
        size_t nl = colon ? (size_t)(colon - q) : ll;
        if (nl == sizeof("data") - 1 && memcmp(q, "data", sizeof("data") - 1) == 0) {
            const char *v = colon ? colon + 1 : le;
            if (v < le && *v == ' ')
                v++;
            size_t vl = (size_t)(le - v);
            if (o + (any ? 1 : 0) + vl + 1 > cap)
                return -1;
            if (any)
                out[o++] = '\n';
            memcpy(out + o, v, vl);
            o += vl;
            any = true;
        }
        q = le;
        if (q < end && *q == '\r') {
            q++;
            if (q < end && *q == '\n')
                q++;
        } else if (q < end) {
            q++;
        }
    }
    out[o] = '\0';
    return (long)o;
}
