/*
 * http1.c — the strict HTTP/1.1 framing adapter over Debian's http-parser.
 *
 * Debian builds libhttp_parser with HTTP_PARSER_STRICT=0 (checked by
 * tests/unit/test_http1.c: it accepts "Ho st: a", "Host : a", a TAB in the
 * target, two spaces in the request line), and in any mode it accepts bare
 * LF line ends and obs-fold and reads a 304's Content-Length as a body. So
 * the adapter does the head's syntax itself and lets http-parser do what it
 * is good at (method table, version, Content-Length and chunk arithmetic,
 * keep-alive flags, body delivery):
 *
 *   - head_scan() walks every head byte once: CRLF-only line ends, no
 *     obs-fold, no control bytes, a strict request line (token SP target SP
 *     HTTP/d.d), token header names, the size and line limits. It copies
 *     method, target and header names/values (OWS trimmed) into a per-parser
 *     arena, so values may span fed pieces. A head that arrives whole gets
 *     one block sized by its bytes (block_take); one cut across feeds grows
 *     its arena up to a bound from the limits and is cut to size once
 *     complete. Reset frees either, so idle connections hold none. Plain
 *     header lines are taken whole and runs 16 bytes a step (SSE2); the
 *     byte loop does the rest (test_http1_vector.c compares the two).
 *   - A fresh head that is all in one feed and plain is parsed in one
 *     step instead (head_fast(): SSE2 bitmaps of its CRs, ':' and
 *     non-VCHAR bytes, the lines walked on them, one copy of the head);
 *     anything else goes to head_scan() from the head's first byte.
 *   - The head is parsed once, by head_scan(): http-parser never sees it
 *     (it used to get the same bytes, ~3 % of a proxied request's CPU for
 *     nothing head_scan() had not checked already). head_check() applies
 *     the semantic rules (method in http-parser's table, version, CL/TE,
 *     Host, Expect, target) on the copied headers; head_done() derives
 *     keep-alive (Connection / Proxy-Connection tokens, as http-parser
 *     reads them) and whether a body follows.
 *   - A Content-Length body, or a response's body up to the close, is
 *     counted here (feed_body). A chunked body is de-chunked here too, by
 *     chunk_scan(), which validates the framing byte by byte (1*HEXDIG, no
 *     whitespace, CRLF everywhere, bounded extensions and trailers) and
 *     hands each chunk's data on as it passes it: http-parser, which used
 *     to de-chunk the same bytes again after it (~4k instructions of an
 *     8-event SSE stream, and a fixed head of ours per message to put it in
 *     the chunked body state), is still there as the reference path for
 *     tests (gw_http_chunk_direct_set(false): chunk_start, then http-parser
 *     over chunk_scan's valid prefix, a disagreement on the message's end
 *     reported as an error); test_http1_chunked.c compares the two on
 *     generated bodies.
 *
 * Feeding stops at the head's LF and at message end, so pipelined bytes
 * stay with the caller.
 */
#include "gateway/http1.h"
#include "gateway/gw_wio.h"

#include <event2/buffer.h>
#include <http_parser.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gateway/gw_wio.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#define GW_HTTP_SSE2 1
#endif

#define GW_HTTP_MAX_INTERIM   16   /* 1xx responses skipped before the final one */
#define GW_HTTP_MAX_CHUNK_EXT 1024 /* bytes of chunk extensions on one size line */

/* ---- character classes (RFC 9110/9112) ---- */

enum {
    C_TCHAR = 1 << 0, /* token */
    C_VAL = 1 << 1,   /* field-value byte: HTAB SP VCHAR obs-text */
    C_TGT = 1 << 2,   /* request-target byte: VCHAR but '#' */
    C_HEX = 1 << 3,
    C_HOST = 1 << 4, /* Host value: reg-name / IP-literal / port */
    C_DIGIT = 1 << 5,
};

/* GNU range initialisers keep the table readable; gcc and clang both have
 * them. Every byte appears once (-Woverride-init). */
#define VT   (C_VAL | C_TGT)           /* VCHAR, not a token char */
#define VTT  (C_VAL | C_TGT | C_TCHAR) /* token char, not in a host */
#define VTTH (VTT | C_HOST)            /* token char, also in a host */
#define VTH  (C_VAL | C_TGT | C_HOST)  /* sub-delim or ':' '[' ']' */
static const uint8_t gw_http_cls[256] = {
    ['\t'] = C_VAL,
    [' '] = C_VAL,
    ['!'] = VTTH,
    ['"'] = VT,
    ['#'] = C_VAL | C_TCHAR,
    ['$'] = VTTH,
    ['%'] = VTTH,
    ['&'] = VTTH,
    ['\''] = VTTH,
    ['('] = VTH,
    [')'] = VTH,
    ['*'] = VTTH,
    ['+'] = VTTH,
    [','] = VTH,
    ['-'] = VTTH,
    ['.'] = VTTH,
    ['/'] = VT,
    ['0' ... '9'] = VTTH | C_HEX | C_DIGIT,
    [':'] = VTH,
    [';'] = VTH,
    ['<'] = VT,
    ['='] = VTH,
    ['>'] = VT,
    ['?'] = VT,
    ['@'] = VT,
    ['A' ... 'F'] = VTTH | C_HEX,
    ['G' ... 'Z'] = VTTH,
    ['['] = VTH,
    ['\\'] = VT,
    [']'] = VTH,
    ['^'] = VTT,
    ['_'] = VTTH,
    ['`'] = VTT,
    ['a' ... 'f'] = VTTH | C_HEX,
    ['g' ... 'z'] = VTTH,
    ['{'] = VT,
    ['|'] = VTT,
    ['}'] = VT,
    ['~'] = VTTH,
    [0x80 ... 0xff] = C_VAL,
};

#define IS(c, k) (gw_http_cls[(unsigned char)(c)] & (k))

/* ---- parser state ---- */

enum {
    PH_HEAD = 0, /* scanning a head */
    PH_BODY,     /* head returned; body (or pending completion) */
};

/* head_scan() states */
enum {
    HS_LEAD = 0, /* request: before the method (empty CRLF lines allowed) */
    HS_LEAD_LF,
    HS_METHOD,
    HS_TARGET,
    HS_VERSION,
    HS_STATUS, /* response: the status line (http-parser checks its shape) */
    HS_LINE0_LF,
    HS_LINE_START,
    HS_NAME,
    HS_OWS,
    HS_VALUE,
    HS_LINE_LF,
    HS_END_LF,
};

/* chunk_scan() states */
enum {
    CS_SIZE0 = 0,
    CS_SIZE,
    CS_EXT,
    CS_SIZE_LF,
    CS_DATA,
    CS_DATA_CR,
    CS_DATA_LF,
    CS_TR_START,
    CS_TR_NAME,
    CS_TR_LINE,
    CS_TR_LF,
    CS_END_LF,
    CS_END,
};

struct gw_http_parser {
    /* The first 64 bytes (the struct is line-aligned): what the accessors
     * read and the storage fields, which are all that reset writes. The
     * rest of the parse state is reset at the next feed (parse_restart):
     * a client connection's parser is reset at the end of a request, long
     * after its head was parsed, and at 5,000 connections its lines are
     * cold then and cold again at the next head; written once, they miss
     * once. */
    gw_http_state_t state; /* what the last feed returned */
    int phase;
    bool head_request;
    bool started;
    bool stale;     /* reset since the last feed: parse_restart pending */
    bool one_block; /* arena lies in hdrs' block (block_take) */
    int err_status;
    const char *err_reason;
    uint64_t body_bytes;
    /* Grown as a head's bytes arrive (head_reserve), cut to what the head
     * used once it is complete and freed by reset (an idle keep-alive
     * connection holds none). */
    gw_http_header_t *hdrs; /* hdrs_cap entries, at most lim.header_lines */
    size_t hdrs_cap;
    char *arena; /* names, values, method, target; NUL-terminated */
    size_t arena_cap;

    http_parser hp;
    gw_http_kind_t kind;
    gw_http_limits_t lim;
    bool headers_done; /* on_headers_complete ran for chunk_start's head */
    bool complete;     /* on_message_complete ran (http-parser paused) */
    bool interim;      /* the current head is a 1xx */
    bool skip_body;
    unsigned ninterim;

    /* head_scan */
    int hs;
    size_t head_bytes;
    size_t line0_len;
    size_t nlines;
    size_t method_off, target_off, value_start, value_end;
    unsigned ver_len;
    char ver[8];
    unsigned status; /* a response's status code, from its status line */

    /* chunk_scan */
    int cs;
    unsigned chunk_digits;
    size_t chunk_ext;
    uint64_t chunk_size;
    uint64_t chunk_left;
    uint64_t declared;
    size_t trailer_bytes;

    gw_http_body_cb cb;
    void *cb_arg;

    gw_http_msg_t msg;
    size_t arena_len;
    bool conn_close, conn_keep; /* Connection tokens, found by head_check() */
};
_Static_assert(offsetof(struct gw_http_parser, hp) == 64,
               "reset's fields: the struct's first line");

static const char ver_tmpl[8] = "HTTP/0.0";

/* Records the first error; later ones do not overwrite it. Response errors
 * are the upstream's fault, so they all answer 502 (500 stays: our hook). */
SL_COLD static void fail(gw_http_parser_t *p, int status, const char *reason)
{
    if (p->err_reason)
        return;
    if (p->kind == GW_HTTP_RESPONSE && status != 500)
        status = 502;
    p->err_status = status;
    p->err_reason = reason;
    p->state = GW_HTTP_ERROR;
}

/* An error a scanner just recorded, taken back until http-parser has been
 * given the bytes before the offending one: an earlier error of its own
 * then wins, so the reason reported does not depend on how input is split. */
typedef struct gw_http_err {
    int status;
    const char *reason;
} gw_http_err_t;

static gw_http_err_t err_take(gw_http_parser_t *p, gw_http_state_t prev)
{
    gw_http_err_t e = {p->err_status, p->err_reason};
    p->err_status = 0;
    p->err_reason = NULL;
    p->state = prev;
    return e;
}

static void err_put(gw_http_parser_t *p, gw_http_err_t e)
{
    if (e.reason)
        fail(p, e.status, e.reason);
}

/* ---- http-parser callbacks ---- */

static int on_headers_complete(http_parser *hp)
{
    gw_http_parser_t *p = hp->data;
    p->headers_done = true; /* chunk_start's head: the message is ours already */
    return 0;
}

/* Body bytes to the caller, within max_body_bytes; -1 when refused. */
static int body_deliver(gw_http_parser_t *p, const char *at, size_t n)
{
    if (p->lim.max_body_bytes && p->body_bytes + n > p->lim.max_body_bytes) {
        fail(p, 413, "body_too_large");
        return -1;
    }
    p->body_bytes += n;
    if (p->cb && p->cb(p->cb_arg, at, n) != 0) {
        fail(p, 500, "body_callback");
        return -1;
    }
    return 0;
}

static int on_body(http_parser *hp, const char *at, size_t n)
{
    return body_deliver(hp->data, at, n);
}

static int on_message_complete(http_parser *hp)
{
    gw_http_parser_t *p = hp->data;
    p->complete = true;
    http_parser_pause(hp, 1); /* leave pipelined bytes unconsumed */
    return 0;
}

static const http_parser_settings gw_http_settings = {
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* Maps an http-parser error to ours (ours, if set first, wins in fail()). */
SL_COLD static void fail_hp(gw_http_parser_t *p)
{
    enum http_errno e = HTTP_PARSER_ERRNO(&p->hp);
    switch (e) {
    case HPE_INVALID_METHOD:
        fail(p, 501, "unknown_method");
        break;
    case HPE_INVALID_VERSION:
        fail(p, 400, "bad_version");
        break;
    case HPE_INVALID_STATUS:
        fail(p, 502, "bad_status");
        break;
    case HPE_INVALID_URL:
    case HPE_INVALID_HOST:
    case HPE_INVALID_PORT:
    case HPE_INVALID_PATH:
    case HPE_INVALID_QUERY_STRING:
    case HPE_INVALID_FRAGMENT:
        fail(p, 400, "bad_target");
        break;
    case HPE_INVALID_HEADER_TOKEN:
        fail(p, 400, "bad_header");
        break;
    case HPE_INVALID_CONTENT_LENGTH:
        fail(p, 400, "bad_content_length");
        break;
    case HPE_UNEXPECTED_CONTENT_LENGTH:
        /* head_check() refuses a second Content-Length and CL+TE before
         * http-parser sees a chunked body */
        fail(p, 400, "cl_and_te");
        break;
    case HPE_INVALID_CHUNK_SIZE:
        fail(p, 400, "bad_chunk_size");
        break;
    case HPE_INVALID_TRANSFER_ENCODING:
        fail(p, 400, "bad_transfer_encoding");
        break;
    case HPE_HEADER_OVERFLOW: /* http-parser's own 80 KiB ceiling */
        fail(p, 431, "header_too_large");
        break;
    case HPE_LF_EXPECTED:
        fail(p, 400, "bare_cr");
        break;
    case HPE_CLOSED_CONNECTION:
        fail(p, 400, "data_after_close");
        break;
    case HPE_INVALID_EOF_STATE:
        fail(p, 400, "truncated");
        break;
    default:
        fail(p, 400, "bad_message");
        break;
    }
}

/* Runs http-parser over n > 0 bytes (n == 0 would mean EOF to it). Returns
 * the bytes it took, or sets the error. A pause is completion, not error. */
static size_t hp_exec(gw_http_parser_t *p, const char *d, size_t n)
{
    if (n == 0)
        return 0;
    size_t r = http_parser_execute(&p->hp, &gw_http_settings, d, n);
    enum http_errno e = HTTP_PARSER_ERRNO(&p->hp);
    if (e == HPE_PAUSED && p->complete)
        return r;
    if (e != HPE_OK) {
        fail_hp(p);
        return r;
    }
    if (r != n)
        fail(p, 400, "bad_message"); /* http-parser stopped without a reason */
    return r;
}

/* ---- the head ---- */

/* The method's index in http-parser's table (the methods it would take),
 * -1 if it is not there. The common methods come first in its table. */
static int method_find(const char *m, size_t n)
{
    /* the two every API request uses, without the table walk's strncmp */
    if (n == 4 && memcmp(m, "POST", 4) == 0)
        return HTTP_POST;
    if (n == 3 && memcmp(m, "GET", 3) == 0)
        return HTTP_GET;
    for (int i = 0;; i++) {
        const char *s = http_method_str((enum http_method)i);
        if (s[0] == '<') /* "<unknown>": past the table's end */
            return -1;
        if (strncmp(s, m, n) == 0 && s[n] == '\0')
            return i;
    }
}

/* Chunked bodies de-chunked by chunk_scan() alone (default), or by
 * http-parser after it (the reference path, for tests). */
static bool gw_http_chunk_direct = true;

void gw_http_chunk_direct_set(bool on)
{
    gw_http_chunk_direct = on;
}

static void head_restart(gw_http_parser_t *p)
{
    p->hs = p->kind == GW_HTTP_REQUEST ? HS_LEAD : HS_STATUS;
    p->head_bytes = 0;
    p->line0_len = 0;
    p->nlines = 0;
    p->ver_len = 0;
    p->status = 0;
    p->arena_len = 0;
    p->headers_done = false;
    p->interim = false;
    p->skip_body = false;
    memset(&p->msg, 0, sizeof(p->msg));
    p->msg.headers = p->hdrs;
    p->msg.content_length = -1;
}

/* Past whole 8-byte words of d[i, end) that are field-value bytes for sure:
 * none below 0x20 (HTAB too: the byte loop takes it) and none 0x7f; bytes
 * from 0x80 are obs-text, allowed. Returns where the byte loop goes on. */
static size_t val_run8(const char *d, size_t i, size_t end)
{
    const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    while (end - i >= 8) {
        uint64_t w, x;
        memcpy(&w, d + i, 8);
        x = w ^ (ones * 0x7f);
        /* a byte below 0x20 in w, or a zero byte in x (a 0x7f in w) */
        if (((w - ones * 0x20) & ~w & high) | ((x - ones) & ~x & high))
            break;
        i += 8;
    }
    return i;
}

/* The vector paths of head_scan(): whole header lines taken in one step
 * and 16-byte runs (SSE2, in every x86-64). Off, the scan is the byte
 * loop and val_run8 alone: test_http1_vector.c compares the two on
 * generated heads (gw_http_vector_set). */
static bool gw_http_vector = true;

void gw_http_vector_set(bool on)
{
    gw_http_vector = on;
}

#ifdef GW_HTTP_SSE2

/* The 16-byte runs below look at d[i, end) but may load any of d[0, avail)
 * (avail >= end: the bytes fed, which a limit may cut short of), so a
 * short name or value is one load and one ctz, not a byte loop over its
 * last 15 bytes; a stop past end is end. Each stops at the first byte
 * that is not one of its class, or at end, or where fewer than 16 bytes
 * are left to load: the byte loop takes it from there. */

/* Past the field-value bytes but HTAB (the byte loop takes it): none below
 * 0x20, none 0x7f. */
static inline __attribute__((always_inline)) size_t val_run16(const char *d, size_t i, size_t end,
                                                              size_t avail)
{
    const __m128i c1f = _mm_set1_epi8(0x1f), del = _mm_set1_epi8(0x7f);
    while (i < end && avail - i >= 16) {
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(d + i));
        /* unsigned b <= 0x1f: min(b, 0x1f) == b */
        __m128i bad = _mm_or_si128(_mm_cmpeq_epi8(_mm_min_epu8(b, c1f), b), _mm_cmpeq_epi8(b, del));
        unsigned m = (unsigned)_mm_movemask_epi8(bad);
        if (m)
            return SL_MIN(i + (size_t)__builtin_ctz(m), end);
        i += 16;
    }
    return SL_MIN(i, end);
}

/* Unsigned lo <= b <= lo + span, per byte. */
static inline __m128i in_range16(__m128i b, char lo, char span)
{
    __m128i t = _mm_sub_epi8(b, _mm_set1_epi8(lo));
    return _mm_cmpeq_epi8(_mm_min_epu8(t, _mm_set1_epi8(span)), t);
}

/* Past the token bytes (tchar, RFC 9110 5.6.2) of d[i, end), 16 a step
 * (a header name's ':' stops it). Not a tchar: CTLs and SP (<= 0x20), DEL and
 * above (>= 0x7f), and the delimiters "(),/:;<=>?@[\]{} as ranges. The
 * byte loop cost ~6 instructions a name byte. */
static size_t name_run16(const char *d, size_t i, size_t end, size_t avail)
{
    const __m128i c20 = _mm_set1_epi8(0x20), c7f = _mm_set1_epi8(0x7f);
    while (i < end && avail - i >= 16) {
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(d + i));
        __m128i bad = _mm_or_si128(_mm_cmpeq_epi8(_mm_min_epu8(b, c20), b),
                                   _mm_cmpeq_epi8(_mm_max_epu8(b, c7f), b));
        bad = _mm_or_si128(bad, _mm_cmpeq_epi8(b, _mm_set1_epi8('"')));
        bad = _mm_or_si128(bad, in_range16(b, '(', 1)); /* ( ) */
        bad = _mm_or_si128(bad, _mm_cmpeq_epi8(b, _mm_set1_epi8(',')));
        bad = _mm_or_si128(bad, _mm_cmpeq_epi8(b, _mm_set1_epi8('/')));
        bad = _mm_or_si128(bad, in_range16(b, ':', 6)); /* : ; < = > ? @ */
        bad = _mm_or_si128(bad, in_range16(b, '[', 2)); /* [ \ ] */
        bad = _mm_or_si128(bad, _mm_cmpeq_epi8(b, _mm_set1_epi8('{')));
        bad = _mm_or_si128(bad, _mm_cmpeq_epi8(b, _mm_set1_epi8('}')));
        unsigned m = (unsigned)_mm_movemask_epi8(bad);
        if (m)
            return SL_MIN(i + (size_t)__builtin_ctz(m), end);
        i += 16;
    }
    return SL_MIN(i, end);
}

/* Past the request-target bytes of d[i, end) (VCHAR but '#'), 16 a step. */
static size_t tgt_run16(const char *d, size_t i, size_t end, size_t avail)
{
    const __m128i c20 = _mm_set1_epi8(0x20), c7f = _mm_set1_epi8(0x7f), hash = _mm_set1_epi8('#');
    while (i < end && avail - i >= 16) {
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(d + i));
        /* unsigned b <= 0x20 or b >= 0x7f, or '#' */
        __m128i bad = _mm_or_si128(
            _mm_cmpeq_epi8(_mm_min_epu8(b, c20), b),
            _mm_or_si128(_mm_cmpeq_epi8(_mm_max_epu8(b, c7f), b), _mm_cmpeq_epi8(b, hash)));
        unsigned m = (unsigned)_mm_movemask_epi8(bad);
        if (m)
            return SL_MIN(i + (size_t)__builtin_ctz(m), end);
        i += 16;
    }
    return SL_MIN(i, end);
}
#endif

/* Past the field-value bytes of d[i, end), HTAB and SP included; d[0,
 * avail) may be loaded (val_run16). */
static inline __attribute__((always_inline)) size_t val_run(const char *d, size_t i, size_t end,
                                                            size_t avail)
{
#ifdef GW_HTTP_SSE2
    i = val_run16(d, i, end, avail);
    if (i < end && !IS(d[i], C_VAL)) /* its stop: the value's CR, mostly */
        return i;
#else
    (void)avail;
#endif
    i = val_run8(d, i, end);
    while (i < end && IS(d[i], C_VAL))
        i++;
    return i;
}

/* "HTTP/" DIGIT "." DIGIT at d (8 bytes there). */
static bool ver_plain(const char *d)
{
    return memcmp(d, "HTTP/", 5) == 0 && IS(d[5], C_DIGIT) && d[6] == '.' && IS(d[7], C_DIGIT);
}

/* Scans n head bytes. Returns how many were valid: up to and including the
 * head's final LF (*end set), all n, or up to the offending byte (error
 * set through fail()). */
static size_t head_scan(gw_http_parser_t *p, const char *d, size_t n, bool *end)
{
    /* Locals, not p->...: the arena stores are char stores, which may alias
     * anything, so fields kept in *p would be reloaded after every byte. */
    const size_t hmax = p->lim.header_bytes;
    const size_t lmax = p->kind == GW_HTTP_REQUEST ? p->lim.request_line_bytes : hmax;
    char *ar = p->arena;
    size_t al = p->arena_len;
    size_t hb = p->head_bytes;
    size_t l0 = p->line0_len;
    int hs = p->hs;
    size_t i;
    *end = false;
    const bool vec = gw_http_vector;
    for (i = 0; i < n; i++) {
        /* The end of a request line, "HTTP/" DIGIT "." DIGIT CRLF, and a
         * whole status line, "HTTP/" DIGIT "." DIGIT SP 3DIGIT [SP reason]
         * CRLF, in one step when all here, within the limits and plain;
         * anything else goes byte by byte from the same byte. */
        if (vec && hs == HS_VERSION && p->ver_len == 0 && n - i >= 10 && hb + 10 <= hmax &&
            l0 + 8 <= lmax && ver_plain(d + i) && d[i + 8] == '\r' && d[i + 9] == '\n') {
            memcpy(p->ver, d + i, 8);
            p->ver_len = 8;
            l0 += 8;
            hb += 10;
            i += 10;
            hs = HS_LINE_START;
        } else if (vec && hs == HS_STATUS && l0 == 0 && n - i >= 14 && ver_plain(d + i) &&
                   d[i + 8] == ' ' && IS(d[i + 9], C_DIGIT) && IS(d[i + 10], C_DIGIT) &&
                   IS(d[i + 11], C_DIGIT)) {
            size_t lim = i + SL_MIN(n - i, hmax - SL_MIN(hb, hmax)), k = i + 12;
            if (k < lim && d[k] == ' ')
                k = val_run(d, k + 1, lim, n);
            if (k + 2 <= lim && d[k] == '\r' && d[k + 1] == '\n') {
                memcpy(p->ver, d + i, 8);
                p->status = (unsigned)(d[i + 9] - '0') * 100 + (unsigned)(d[i + 10] - '0') * 10 +
                            (unsigned)(d[i + 11] - '0');
                l0 = k - i;
                hb += k + 2 - i;
                i = k + 2;
                hs = HS_LINE_START;
            }
        }
        /* A whole header line, name ':' OWS value OWS CRLF, in one step
         * when all of it is here, within the limits, and plain (token
         * name, field-value bytes); anything else (an error, a line cut
         * by the feed) goes byte by byte from its first byte below, so
         * results and reasons are the byte loop's. */
        while (vec && hs == HS_LINE_START && p->nlines < p->lim.header_lines &&
               p->nlines < p->hdrs_cap) {
            size_t lim = i + SL_MIN(n - i, hmax - SL_MIN(hb, hmax)); /* bytes we may take */
            size_t j = i;
#ifdef GW_HTTP_SSE2
            j = name_run16(d, i, lim, n);
#endif
            while (j < lim && IS(d[j], C_TCHAR))
                j++;
            if (j == i || j >= lim || d[j] != ':')
                break;
            size_t vs = j + 1;
            while (vs < lim && (d[vs] == ' ' || d[vs] == '\t'))
                vs++;
            size_t k = val_run(d, vs, lim, n);
            if (k + 2 > lim || d[k] != '\r' || d[k + 1] != '\n')
                break;
            size_t ve = k;
            while (ve > vs && (d[ve - 1] == ' ' || d[ve - 1] == '\t'))
                ve--;
            /* the line up to the value's end in one copy (a call less a
             * header than name and value apart); its ':' and the byte
             * after the value become the NULs, the OWS between stays:
             * still no more arena bytes than head bytes */
            gw_http_header_t *h = &p->hdrs[p->nlines++];
            memcpy(ar + al, d + i, ve - i);
            h->name = ar + al;
            h->name_len = j - i;
            ar[al + (j - i)] = '\0';
            h->value = ar + al + (vs - i);
            h->value_len = ve - vs;
            h->id = gw_http_hn(h->name, h->name_len);
            ar[al + (ve - i)] = '\0';
            al += ve - i + 1;
            hb += k + 2 - i;
            i = k + 2;
        }
        if (i == n)
            break;
        char c = d[i];
        /* Runs of plain bytes in the long parts of a head (target, names,
         * values) are taken in one go; the switch below sees the rest. */
        if (hs == HS_VALUE || hs == HS_NAME || hs == HS_TARGET) {
            int k = hs == HS_VALUE ? C_VAL : hs == HS_NAME ? C_TCHAR : C_TGT;
            size_t lim = SL_MIN(n - i, hmax - SL_MIN(hb, hmax));
            if (hs == HS_TARGET)
                lim = SL_MIN(lim, lmax - SL_MIN(l0, lmax));
            size_t j = i;
#ifdef GW_HTTP_SSE2
            if (vec && hs == HS_VALUE)
                j = val_run16(d, i, lim + i, n);
            else if (vec && hs == HS_TARGET)
                j = tgt_run16(d, i, lim + i, n);
#endif
            if (hs == HS_VALUE) /* long values (a bearer token): 8 bytes a step */
                j = val_run8(d, j, lim + i);
            while (j < lim + i && IS(d[j], k))
                j++;
            if (j > i) {
                size_t run = al;
                memcpy(ar + al, d + i, j - i);
                al += j - i;
                hb += j - i;
                if (hs == HS_TARGET)
                    l0 += j - i;
                if (hs == HS_VALUE) {
                    /* trailing OWS is trimmed at the CR: remember where the
                     * last non-OWS byte of this run ends */
                    size_t e = al;
                    while (e > run && (ar[e - 1] == ' ' || ar[e - 1] == '\t'))
                        e--;
                    if (e > run)
                        p->value_end = e;
                }
                i = j;
                if (i == n)
                    break;
                c = d[i];
            }
        }
        if (++hb > hmax) {
            fail(p, 431, "header_too_large");
            break;
        }
        switch (hs) {
        case HS_LEAD:
            if (c == '\r') {
                hs = HS_LEAD_LF;
            } else if (IS(c, C_TCHAR)) {
                p->method_off = al;
                ar[al++] = c;
                l0 = 1;
                hs = HS_METHOD;
            } else {
                fail(p, 400, c == '\n' ? "bare_lf" : "bad_request_line");
            }
            break;
        case HS_LEAD_LF:
            if (c == '\n')
                hs = HS_LEAD;
            else
                fail(p, 400, "bare_cr");
            break;
        case HS_METHOD:
        case HS_TARGET:
        case HS_VERSION:
            if (c == '\n') {
                fail(p, 400, "bare_lf");
                break;
            }
            if (c != '\r' && ++l0 > lmax) {
                fail(p, 414, "uri_too_long");
                break;
            }
            if (hs == HS_METHOD) {
                if (IS(c, C_TCHAR)) {
                    ar[al++] = c;
                } else if (c == ' ') {
                    int mi = method_find(ar + p->method_off, al - p->method_off);
                    if (mi < 0) {
                        fail(p, 501, "unknown_method");
                        break;
                    }
                    p->hp.method = (unsigned)mi;
                    p->msg.method_len = al - p->method_off;
                    ar[al++] = '\0';
                    p->target_off = al;
                    hs = HS_TARGET;
                } else {
                    fail(p, 400, "bad_request_line");
                }
            } else if (hs == HS_TARGET) {
                /* a target byte would have been taken by the run above */
                if (c == ' ' && al > p->target_off) {
                    p->msg.target_len = al - p->target_off;
                    ar[al++] = '\0';
                    hs = HS_VERSION;
                } else {
                    fail(p, 400, c == ' ' || c == '\r' ? "bad_request_line" : "bad_target");
                }
            } else if (c == '\r') {
                if (p->ver_len == sizeof(p->ver))
                    hs = HS_LINE0_LF;
                else
                    fail(p, 400, "bad_version");
            } else {
                /* "HTTP/" DIGIT "." DIGIT, compared with a template */
                unsigned k = p->ver_len;
                bool ok = k < sizeof(p->ver) &&
                          (ver_tmpl[k] == '0' ? (c >= '0' && c <= '9') : c == ver_tmpl[k]);
                if (ok)
                    p->ver[p->ver_len++] = c;
                else
                    fail(p, 400, c == ' ' ? "bad_request_line" : "bad_version");
            }
            break;
        case HS_STATUS:
            /* HTTP-version SP 3DIGIT [SP reason]: non-strict http-parser
             * takes "HTTQ/1.1", so the shape is ours to check. The reason
             * phrase is optional in practice (RFC 9112 wants the SP). */
            if (c == '\n') {
                fail(p, 400, "bare_lf");
            } else if (l0 < sizeof(p->ver)) {
                if (ver_tmpl[l0] == '0' ? (c >= '0' && c <= '9') : c == ver_tmpl[l0])
                    p->ver[l0++] = c;
                else
                    fail(p, 400, "bad_status_line");
            } else if (l0 == sizeof(p->ver) || l0 == sizeof(p->ver) + 4) {
                if (c == ' ')
                    l0++;
                else if (c == '\r' && l0 > sizeof(p->ver))
                    hs = HS_LINE0_LF;
                else
                    fail(p, 400, "bad_status_line");
            } else if (l0 < sizeof(p->ver) + 4) {
                if (c >= '0' && c <= '9') {
                    p->status = p->status * 10 + (unsigned)(c - '0');
                    l0++;
                } else
                    fail(p, 400, "bad_status_line");
            } else if (c == '\r') {
                hs = HS_LINE0_LF;
            } else if (!IS(c, C_VAL)) {
                fail(p, 400, "bad_status_line");
            } else {
                l0++;
            }
            break;
        case HS_LINE0_LF:
        case HS_LINE_LF:
            if (c == '\n')
                hs = HS_LINE_START;
            else
                fail(p, 400, "bare_cr");
            break;
        case HS_LINE_START:
            if (c == '\r') {
                hs = HS_END_LF;
            } else if (IS(c, C_TCHAR)) {
                /* hdrs_cap: never the limit, but a memory-safe bound */
                if (++p->nlines > p->lim.header_lines || p->nlines > p->hdrs_cap) {
                    fail(p, 431, "too_many_headers");
                    break;
                }
                gw_http_header_t *h = &p->hdrs[p->nlines - 1];
                h->name = ar + al;
                h->value = NULL; /* set at its CR; arena_move skips it until then */
                ar[al++] = c;
                hs = HS_NAME;
            } else if (c == ' ' || c == '\t') {
                fail(p, 400, "obs_fold");
            } else {
                fail(p, 400, c == '\n' ? "bare_lf" : "bad_header");
            }
            break;
        case HS_NAME:
            /* a token byte would have been taken by the run above */
            if (c == ':') {
                gw_http_header_t *h = &p->hdrs[p->nlines - 1];
                h->name_len = (size_t)(ar + al - h->name);
                h->id = gw_http_hn(h->name, h->name_len);
                ar[al++] = '\0';
                p->value_start = p->value_end = al;
                hs = HS_OWS;
            } else {
                fail(p, 400, c == '\n' ? "bare_lf" : "bad_header");
            }
            break;
        case HS_OWS:
        case HS_VALUE:
            if (c == '\r') {
                gw_http_header_t *h = &p->hdrs[p->nlines - 1];
                h->value = ar + p->value_start;
                h->value_len = p->value_end - p->value_start;
                al = p->value_end; /* drop trailing OWS */
                ar[al++] = '\0';
                hs = HS_LINE_LF;
            } else if (c == '\n') {
                fail(p, 400, "bare_lf");
            } else if (!IS(c, C_VAL)) {
                fail(p, 400, "bad_header_value");
            } else if (c != ' ' && c != '\t') {
                ar[al++] = c;
                p->value_end = al;
                hs = HS_VALUE;
            } /* else leading OWS: dropped */
            break;
        case HS_END_LF:
            if (c == '\n') {
                hs = HS_LINE_START;
                *end = true;
                i++;
                goto out;
            }
            fail(p, 400, "bare_cr");
            break;
        }
        if (p->err_reason)
            break;
    }
out:
    p->hs = hs;
    p->arena_len = al;
    p->head_bytes = hb;
    p->line0_len = l0;
    return i;
}

static bool ieq(const char *a, size_t alen, const char *lit)
{
    size_t n = strlen(lit);
    return alen == n && strncasecmp(a, lit, n) == 0;
}

#define NAME_IS(n, lit) gw_http_name_eq((n), (lit), sizeof(lit) - 1)

/* The names of gw_http_hn_t by a switch on the length and a compare or
 * three: a walk over name lists cost a strlen and a strncasecmp per entry
 * and header. Inline in head_fast's line walk, its one hot caller. */
static inline __attribute__((always_inline)) gw_http_hn_t hn_find(const char *n, size_t len)
{
    switch (len) {
    case 2:
        if (NAME_IS(n, "te"))
            return GW_HN_TE;
        break;
    case 4:
        if (NAME_IS(n, "host"))
            return GW_HN_HOST;
        if (NAME_IS(n, "date"))
            return GW_HN_DATE;
        break;
    case 6:
        if (NAME_IS(n, "expect"))
            return GW_HN_EXPECT;
        if (NAME_IS(n, "server"))
            return GW_HN_SERVER;
        break;
    case 7:
        if (NAME_IS(n, "trailer"))
            return GW_HN_TRAILER;
        if (NAME_IS(n, "upgrade"))
            return GW_HN_UPGRADE;
        break;
    case 9:
        if (NAME_IS(n, "forwarded"))
            return GW_HN_FORWARDED;
        if (NAME_IS(n, "x-real-ip"))
            return GW_HN_X_REAL_IP;
        break;
    case 10:
        if (NAME_IS(n, "connection"))
            return GW_HN_CONNECTION;
        if (NAME_IS(n, "keep-alive"))
            return GW_HN_KEEP_ALIVE;
        break;
    case 11:
        if (NAME_IS(n, "traceparent"))
            return GW_HN_TRACEPARENT;
        if (NAME_IS(n, "retry-after"))
            return GW_HN_RETRY_AFTER;
        break;
    case 12:
        if (NAME_IS(n, "content-type"))
            return GW_HN_CONTENT_TYPE;
        if (NAME_IS(n, "x-request-id"))
            return GW_HN_X_REQUEST_ID;
        break;
    case 13:
        if (NAME_IS(n, "authorization"))
            return GW_HN_AUTHORIZATION;
        if (NAME_IS(n, "cache-control"))
            return GW_HN_CACHE_CONTROL;
        break;
    case 14:
        if (NAME_IS(n, "content-length"))
            return GW_HN_CONTENT_LENGTH;
        if (NAME_IS(n, "x-sluice-nonce"))
            return GW_HN_X_SLUICE_NONCE;
        if (NAME_IS(n, "x-sluice-fault"))
            return GW_HN_X_SLUICE_FAULT;
        break;
    case 15:
        if (NAME_IS(n, "accept-encoding"))
            return GW_HN_ACCEPT_ENCODING;
        if (NAME_IS(n, "x-forwarded-for"))
            return GW_HN_X_FORWARDED_FOR;
        if (NAME_IS(n, "idempotency-key"))
            return GW_HN_IDEMPOTENCY_KEY;
        if (NAME_IS(n, "accept-language"))
            return GW_HN_ACCEPT_LANGUAGE;
        break;
    case 16:
        if (NAME_IS(n, "proxy-connection"))
            return GW_HN_PROXY_CONNECTION;
        if (NAME_IS(n, "content-encoding"))
            return GW_HN_CONTENT_ENCODING;
        if (NAME_IS(n, "x-forwarded-host"))
            return GW_HN_X_FORWARDED_HOST;
        break;
    case 17:
        if (NAME_IS(n, "transfer-encoding"))
            return GW_HN_TRANSFER_ENCODING;
        if (NAME_IS(n, "x-forwarded-proto"))
            return GW_HN_X_FORWARDED_PROTO;
        if (NAME_IS(n, "x-accel-buffering"))
            return GW_HN_X_ACCEL_BUFFERING;
        break;
    case 18:
        if (NAME_IS(n, "proxy-authenticate"))
            return GW_HN_PROXY_AUTHENTICATE;
        if (NAME_IS(n, "x-sluice-signature"))
            return GW_HN_X_SLUICE_SIGNATURE;
        if (NAME_IS(n, "x-sluice-timestamp"))
            return GW_HN_X_SLUICE_TIMESTAMP;
        if (NAME_IS(n, "x-sluice-admin-key"))
            return GW_HN_X_SLUICE_ADMIN_KEY;
        break;
    case 19:
        if (NAME_IS(n, "proxy-authorization"))
            return GW_HN_PROXY_AUTHORIZATION;
        break;
    default:
        break;
    }
    return GW_HN_OTHER;
}

gw_http_hn_t gw_http_hn(const char *n, size_t len)
{
    return hn_find(n, len);
}

/* Transfer-Encoding: 0 = exactly "chunked"; otherwise fails. A list with
 * codings we do not implement is 501; a malformed one (chunked not last,
 * twice, empty elements, parameters) is 400. */
static int te_check(gw_http_parser_t *p, const char *v, size_t n)
{
    size_t i = 0, nchunked = 0, nother = 0;
    bool chunked_last = false;
    for (;;) {
        while (i < n && (v[i] == ' ' || v[i] == '\t'))
            i++;
        size_t s = i;
        while (i < n && IS(v[i], C_TCHAR))
            i++;
        size_t e = i;
        while (i < n && (v[i] == ' ' || v[i] == '\t'))
            i++;
        if (e == s || (i < n && v[i] != ',')) {
            fail(p, 400, "bad_transfer_encoding");
            return -1;
        }
        chunked_last = ieq(v + s, e - s, "chunked");
        if (chunked_last)
            nchunked++;
        else
            nother++;
        if (i >= n)
            break;
        i++; /* ',' */
    }
    if (nchunked == 1 && chunked_last && nother == 0)
        return 0;
    if (nchunked == 0 || (nchunked == 1 && chunked_last))
        fail(p, 501, "unsupported_transfer_encoding");
    else
        fail(p, 400, "bad_transfer_encoding");
    return -1;
}

/* The next of the comma-separated tokens of value v from *i on: its start
 * in *s, its length returned, *i past it; 0 when none is left. */
static inline size_t token_next(const char *v, size_t vn, size_t *i, size_t *s)
{
    size_t k = *i;
    while (k < vn && (v[k] == ' ' || v[k] == '\t' || v[k] == ','))
        k++;
    *s = k;
    while (k < vn && v[k] != ',' && v[k] != ' ' && v[k] != '\t')
        k++;
    *i = k;
    return k - *s;
}

/* Sets *close and *keep when "close" / "keep-alive" is one of the
 * comma-separated tokens of a Connection value v: one walk for both (two
 * token_listed walks were ~230 instructions a request on "keep-alive"). */
static void conn_tokens(const char *v, size_t vn, bool *close, bool *keep)
{
    size_t i = 0, s, n;
    while ((n = token_next(v, vn, &i, &s)) != 0) {
        if (n == 5 && NAME_IS(v + s, "close"))
            *close = true;
        else if (n == 10 && NAME_IS(v + s, "keep-alive"))
            *keep = true;
    }
}

/* Semantic rules on the complete head, before http-parser sees its last LF. */
static int head_check(gw_http_parser_t *p)
{
    gw_http_msg_t *m = &p->msg;
    http_parser *hp = &p->hp;
    bool req = p->kind == GW_HTTP_REQUEST;
    const gw_http_header_t *cl = NULL, *te = NULL, *host = NULL;

    m->nheaders = p->nlines;
    m->headers = p->hdrs; /* allocated after head_restart when the head began */
    if (!(hp->http_major == 1 && hp->http_minor <= 1)) {
        fail(p, 505, "http_version");
        return -1;
    }
    if (req) {
        m->method = p->arena + p->method_off;
        m->target = p->arena + p->target_off;
        const char *q = memchr(m->target, '?', m->target_len);
        m->path_len = q ? (size_t)(q - m->target) : m->target_len;
        if (hp->method == HTTP_CONNECT) {
            fail(p, 501, "connect");
            return -1;
        }
        if (m->target[0] != '/') { /* absolute-, authority- or asterisk-form */
            fail(p, 400, "bad_target");
            return -1;
        }
    } else {
        if (hp->status_code < 100 || hp->status_code > 599) {
            fail(p, 502, "bad_status");
            return -1;
        }
        if (hp->status_code == 101) { /* we never forward Upgrade */
            fail(p, 502, "unexpected_101");
            return -1;
        }
    }
    uint64_t seen = 0; /* GW_HN_BIT of the names that may appear once, met */
    uint64_t present = 0;
    /* the names a rule below looks at: the others are only present */
    const uint64_t watch =
        GW_HN_BIT(GW_HN_CONTENT_LENGTH) | GW_HN_BIT(GW_HN_TRANSFER_ENCODING) |
        GW_HN_BIT(GW_HN_CONNECTION) | GW_HN_BIT(GW_HN_PROXY_CONNECTION) |
        (req ? GW_HN_BIT(GW_HN_HOST) | GW_HN_SINGLE | GW_HN_BIT(GW_HN_EXPECT) : 0);
    p->conn_close = p->conn_keep = false;
    for (size_t i = 0; i < m->nheaders; i++) {
        const gw_http_header_t *h = &p->hdrs[i];
        gw_http_hn_t id = h->id; /* set by the scan (or the load) with the name */
        present |= GW_HN_BIT(id);
        if (!(GW_HN_BIT(id) & watch))
            continue;
        if (id == GW_HN_CONTENT_LENGTH) {
            if (cl) {
                fail(p, 400, "duplicate_content_length");
                return -1;
            }
            cl = h;
        } else if (id == GW_HN_TRANSFER_ENCODING) {
            if (te) {
                fail(p, 400, "bad_transfer_encoding");
                return -1;
            }
            te = h;
        } else if (id == GW_HN_CONNECTION || id == GW_HN_PROXY_CONNECTION) {
            /* for head_done(): read as http-parser reads them */
            conn_tokens(h->value, h->value_len, &p->conn_close, &p->conn_keep);
        } else if (!req) {
            continue;
        } else if (id == GW_HN_HOST) {
            if (host) {
                fail(p, 400, "duplicate_host");
                return -1;
            }
            host = h;
        } else if (GW_HN_BIT(id) & GW_HN_SINGLE) {
            /* A proxy in front that reads the last of two would see other
             * credentials than we do, so two are refused, as for Host. */
            if (seen & GW_HN_BIT(id)) {
                fail(p, 400, "duplicate_header");
                return -1;
            }
            seen |= GW_HN_BIT(id);
        } else if (id == GW_HN_EXPECT) {
            if (!ieq(h->value, h->value_len, "100-continue")) {
                fail(p, 417, "expectation_failed");
                return -1;
            }
            /* HTTP/1.0 clients cannot know 100 Continue (RFC 9110 10.1.1) */
            m->expect_continue = hp->http_minor == 1;
        }
    }
    m->present = present & ~GW_HN_BIT(GW_HN_OTHER);
    if (cl && te) {
        fail(p, 400, "cl_and_te");
        return -1;
    }
    if (te) {
        if (req && hp->http_minor == 0) { /* RFC 9112 6.1: faulty framing */
            fail(p, 400, "bad_transfer_encoding");
            return -1;
        }
        if (te_check(p, te->value, te->value_len) != 0)
            return -1;
        m->chunked = true;
    }
    if (cl) {
        int64_t v = 0;
        if (cl->value_len == 0 || cl->value_len > 18) {
            fail(p, 400, "bad_content_length");
            return -1;
        }
        for (size_t i = 0; i < cl->value_len; i++) {
            char c = cl->value[i];
            if (c < '0' || c > '9') {
                fail(p, 400, "bad_content_length");
                return -1;
            }
            v = v * 10 + (c - '0');
        }
        m->content_length = v;
        /* Checked up front so no byte of an oversized body is read; not for
         * bodiless responses, whose Content-Length describes another message. */
        bool bodiless = !req && (p->head_request || hp->status_code < 200 ||
                                 hp->status_code == 204 || hp->status_code == 304);
        if (!bodiless && p->lim.max_body_bytes && (uint64_t)v > p->lim.max_body_bytes) {
            fail(p, 413, "body_too_large");
            return -1;
        }
    }
    if (req) {
        if (!host && hp->http_minor == 1) {
            fail(p, 400, "missing_host");
            return -1;
        }
        if (host) {
            for (size_t i = 0; i < host->value_len; i++) {
                if (!IS(host->value[i], C_HOST)) {
                    fail(p, 400, "bad_host");
                    return -1;
                }
            }
            m->host = host->value;
        }
    }
    return 0;
}

/* The strings of the head being stored point into old: turns them into
 * offsets (1-based, NULL stays NULL) so the block can move... */
static void arena_offsets(gw_http_parser_t *p, const char *old, size_t *mo, size_t *to, size_t *ho)
{
    gw_http_msg_t *m = &p->msg;
    /* an entry or field not set yet is NULL */
    for (size_t i = 0; old && i < p->nlines; i++) {
        gw_http_header_t *h = &p->hdrs[i];
        h->name = h->name ? (const char *)(uintptr_t)(h->name - old + 1) : NULL;
        h->value = h->value ? (const char *)(uintptr_t)(h->value - old + 1) : NULL;
    }
    *mo = m->method ? (size_t)(m->method - old) : 0;
    *to = m->target ? (size_t)(m->target - old) : 0;
    *ho = m->host ? (size_t)(m->host - old) : 0;
}

/* ... and back to pointers into p->arena, wherever it is now. */
static void arena_rebase(gw_http_parser_t *p, size_t mo, size_t to, size_t ho)
{
    gw_http_msg_t *m = &p->msg;
    char *a = p->arena;
    for (size_t i = 0; a && i < p->nlines; i++) {
        gw_http_header_t *h = &p->hdrs[i];
        h->name = h->name ? a + (uintptr_t)h->name - 1 : NULL;
        h->value = h->value ? a + (uintptr_t)h->value - 1 : NULL;
    }
    if (m->method)
        m->method = a + mo;
    if (m->target)
        m->target = a + to;
    if (m->host)
        m->host = a + ho;
}

/* Moves the arena to a block of cap bytes (grown or cut), moving the
 * strings that point into it. -1 on OOM (the old block is kept). */
static int arena_move(gw_http_parser_t *p, size_t cap)
{
    size_t mo, to, ho;
    arena_offsets(p, p->arena, &mo, &to, &ho);
    char *na = realloc(p->arena, cap);
    if (na) {
        p->arena = na;
        p->arena_cap = cap;
    }
    arena_rebase(p, mo, to, ho);
    return na ? 0 : -1;
}

/* A head that arrives whole in one feed (nearly all of them: a client's
 * request, an upstream's answer) gets one block of the size its bytes
 * bound, taken before the scan: the header table (an entry per CR of the
 * head at most: every header line follows a CRLF of its own) and behind it
 * the arena (a byte per head byte at most). One allocation per head (a
 * block of the thread's stack of head blocks when it fits 1 KiB:
 * gw_wio_head_take, given back at reset), nothing copied or moved after
 * the scan, nothing held before a head's first byte or after reset. A head
 * cut across feeds grows its storage instead (storage_reserve). */
static void storage_drop(gw_http_parser_t *p)
{
    if (p->one_block) { /* block_take's, from the thread's stack when it fit */
        if (p->hdrs_cap * sizeof(*p->hdrs) + p->arena_cap <= GW_WIO_HEAD_BYTES)
            gw_wio_head_give(p->hdrs, p->kind == GW_HTTP_RESPONSE);
        else
            free(p->hdrs);
    } else {
        free(p->arena);
        free(p->hdrs);
    }
    p->arena = NULL;
    p->hdrs = NULL;
    p->arena_cap = 0;
    p->hdrs_cap = 0;
    p->one_block = false;
}

static void storage_free(gw_http_parser_t *p)
{
    storage_drop(p);
    p->msg.headers = NULL;
}

/* The head's block, for a head of len bytes whose end (CRLFCRLF) is found
 * with ncr CRs from its first byte that is not a CR or LF. A header entry
 * is made at a line start that follows a CR of its own, before the end's
 * first CR (which ends the last line), so ncr - 2 entries are enough; the
 * arena stores nothing of the final LF CR LF, so len bytes are. -1 on OOM.
 * Caps as storage_reserve's: the scan checks the limits. */
static int block_take(gw_http_parser_t *p, size_t len, size_t ncr)
{
    size_t full = p->lim.header_bytes + 2 * p->lim.header_lines + 2;
    size_t acap = SL_MIN(len, full);
    size_t lines = SL_MAX(SL_MIN(ncr - 2, p->lim.header_lines), (size_t)1);
    size_t need = lines * sizeof(gw_http_header_t) + acap;
    /* Most heads fit 1 KiB: such a block comes from the thread's stack of
     * head blocks and goes back to it (gw_wio.h says why) */
    gw_http_header_t *h =
        need <= GW_WIO_HEAD_BYTES ? gw_wio_head_take(p->kind == GW_HTTP_RESPONSE) : malloc(need);
    if (!h)
        return -1;
    p->hdrs = h;
    p->hdrs_cap = lines;
    p->arena = (char *)(h + lines);
    p->arena_cap = acap;
    p->one_block = true;
    p->msg.headers = h;
    return 0;
}

/* Room for what n more head bytes d can store: each head byte stores at
 * most one arena byte (a NUL takes the place of the ':', SP or CR it
 * replaces) and each header line takes at least three, so storage grows
 * with the head actually sent, up to the limits' bound; the head's end in
 * d, when it is there, bounds n. Most heads so cost a block of a few
 * hundred bytes, not 16 KiB. -1 on OOM. */
static int storage_reserve(gw_http_parser_t *p, size_t n, size_t lines);

/* The first CRLFCRLF in d[0, n), or NULL. A head has a CR per line, so a
 * memchr per line finds it: glibc's memmem takes ~3-5 instructions per
 * byte for a 4-byte needle (callgrind: ~1,000 per head), memchr a few per
 * 32 bytes. */
/* CR LF CR LF at c (4 bytes there): a memcmp of a constant 4 bytes is one
 * 4-byte compare (gcc inlines it); every line's CR has its LF after it, so
 * the three byte compares it replaces mostly all ran. */
static inline bool crlfcrlf(const char *c)
{
    return memcmp(c, "\r\n\r\n", 4) == 0;
}

static const char *head_end_find(const char *d, size_t n, size_t *ncr)
{
    const char *end = d + n;
    size_t k = 0;
#ifdef GW_HTTP_SSE2
    /* The same, 16 bytes a step: the CRs of a block by one compare, each
     * checked for the CRLFCRLF there; memchr's call and set-up per CR cost
     * more than the search in a head of ~15-byte lines. */
    if (gw_http_vector) {
        const __m128i cr = _mm_set1_epi8('\r');
        for (; end - d >= 19; d += 16) { /* a CR at d[15] has its 3 bytes after */
            __m128i b = _mm_loadu_si128((const __m128i *)(const void *)d);
            unsigned m = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(b, cr));
            for (; m; m &= m - 1) {
                const char *c = d + __builtin_ctz(m);
                k++;
                if (crlfcrlf(c)) {
                    *ncr = k + 1;
                    return c;
                }
            }
        }
    }
#endif
    while (end - d >= 4) {
        const char *c = memchr(d, '\r', (size_t)(end - d) - 3);
        if (!c)
            return NULL;
        k++;
        if (c[1] == '\n' && c[2] == '\r' && c[3] == '\n') {
            *ncr = k + 1; /* the empty line's CR too */
            return c;
        }
        d = c + 1;
    }
    return NULL;
}

static int head_reserve(gw_http_parser_t *p, const char *d, size_t n)
{
    /* After its first other byte, a head's first CRLFCRLF is its end; CR
     * and LF before it (empty lines before a request line, or the end of
     * a line fed before) are skipped, and an end not found bounds nothing. */
    size_t lead = 0;
    while (lead < n && (d[lead] == '\r' || d[lead] == '\n'))
        lead++;
    size_t ncr = 0;
    const char *e = head_end_find(d + lead, n - lead, &ncr);
    if (e)
        n = (size_t)(e - d) + 4;
    if (e && !p->arena && !p->hdrs && !p->arena_len)
        return block_take(p, n, ncr);
    return storage_reserve(p, n, p->nlines + n / 3 + 2);
}

/* Room for n more arena bytes and `lines` header entries in all, each
 * capped by the limits' bound (the checks against the limits are the
 * callers'); grown at least twofold. -1 on OOM. */
static int storage_reserve(gw_http_parser_t *p, size_t n, size_t lines)
{
    if (p->one_block) /* never: a block is a whole head's, freed before the next */
        return -1;
    size_t full = p->lim.header_bytes + 2 * p->lim.header_lines + 2;
    size_t need = SL_MIN(p->arena_len + n + 1, full);
    if (need > p->arena_cap) {
        size_t cap = SL_MIN(SL_MAX(need, 2 * p->arena_cap), full);
        if (arena_move(p, cap) != 0)
            return -1;
    }
    lines = SL_MIN(lines, p->lim.header_lines);
    if (lines > p->hdrs_cap) {
        size_t cap = SL_MIN(SL_MAX(lines, 2 * p->hdrs_cap), p->lim.header_lines);
        gw_http_header_t *h = realloc(p->hdrs, cap * sizeof(*h));
        if (!h)
            return -1;
        memset(h + p->hdrs_cap, 0, (cap - p->hdrs_cap) * sizeof(*h));
        p->hdrs = h;
        p->hdrs_cap = cap;
        p->msg.headers = h;
    }
    return 0;
}

/* The head is complete: give back what it did not use. */
static void head_shrink(gw_http_parser_t *p)
{
    if (p->one_block)
        return; /* sized by the head's bytes already (block_take) */
    if (p->arena_len + 1 < p->arena_cap)
        (void)arena_move(p, p->arena_len + 1); /* on OOM the bigger block stays */
    size_t n = SL_MAX(p->nlines, (size_t)1);
    if (n < p->hdrs_cap) {
        gw_http_header_t *nh = realloc(p->hdrs, n * sizeof(*p->hdrs));
        if (nh) {
            p->hdrs = nh;
            p->hdrs_cap = n;
        }
    }
    p->msg.headers = p->hdrs;
}

#ifdef GW_HTTP_SSE2

/* ---- a whole head in one step ---- */

/* A head that is all in one feed, up to GW_HTTP_FAST_BYTES, is parsed
 * without the byte loop (head_fast). One SSE2 pass, 64 bytes a step and
 * only as far as the head goes, marks its CRs, its ':' and the bytes that
 * are not VCHAR or SP (controls, DEL and, for the pass's cheapness,
 * obs-text) in three bitmaps, and finds the end (a CR two bytes after a CR)
 * and the CRs before it (the lines, for block_take). The head is then
 * walked line by line on the bitmaps, straight into its block, and taken
 * only when every marked byte is a line end's CR or the byte after it,
 * every CR has its LF, every name is a token, the request or status line
 * is of the plain shape and the limits hold. Anything else (a bare CR or
 * LF, HTAB, NUL, obs-text, obs-fold, a bad name, a limit, a head cut by
 * the feed, ...) leaves the parser as it was and head_scan() parses the
 * head from its first byte, so every error, its reason and the bytes taken
 * are the byte loop's (test_http1_vector.c compares the two). The head is
 * copied into its block whole, one memcpy; the ':' after each name, the
 * end of each value and the request line's two SPs become the strings'
 * NULs. */
#define GW_HTTP_FAST_BYTES 8192 /* 2 KiB of bitmaps on the stack */

typedef struct head_fast {
    uint64_t cr[GW_HTTP_FAST_BYTES / 64];
    uint64_t col[GW_HTTP_FAST_BYTES / 64];
} head_fast_t;

/* The masks of 16 bytes at s, or'ed in at bit 16 * k. */
#define FAST_MASK16(s, k)                                                                          \
    do {                                                                                           \
        __m128i b_ = _mm_loadu_si128((const __m128i *)(const void *)((s) + 16 * (k)));             \
        /* b + 1 < 0x21, signed: 0x00-0x1f, 0x7f and 0x80-0xff */                                  \
        __m128i x_ = _mm_cmplt_epi8(_mm_add_epi8(b_, one), c21);                                   \
        cr |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(b_, crv)) << (16 * (k));        \
        col |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(b_, colv)) << (16 * (k));      \
        ctl |= (uint64_t)(unsigned)_mm_movemask_epi8(x_) << (16 * (k));                            \
    } while (0)

/* The bits set in x, a few (a head's CRs in 64 bytes): a step each.
 * __builtin_popcountll is a libgcc call without -mpopcnt (~15
 * instructions and the call). */
static inline size_t fast_bits(uint64_t x)
{
    size_t k = 0;
    for (; x; x &= x - 1)
        k++;
    return k;
}

/* Marks d[0, n) 64 bytes a step until the head's end: the CR of its empty
 * line, returned (*ncr: the CRs up to and including it), or 0 when it is
 * not there or a marked byte is not a CR or the byte after one. */
static size_t fast_mark(head_fast_t *f, const char *d, size_t n, size_t *ncr)
{
    const __m128i crv = _mm_set1_epi8('\r'), colv = _mm_set1_epi8(':'), one = _mm_set1_epi8(1),
                  c21 = _mm_set1_epi8(0x21);
    uint64_t prev = 0; /* the last chunk's CRs */
    size_t crs = 0;
    for (size_t at = 0, c = 0; at < n; at += 64, c++) {
        const char *s = d + at;
        char pad[64];
        if (n - at < 64) { /* past n: 'a', no mark */
            memset(pad, 'a', sizeof(pad));
            memcpy(pad, s, n - at);
            s = pad;
        }
        uint64_t cr = 0, col = 0, ctl = 0;
        FAST_MASK16(s, 0);
        FAST_MASK16(s, 1);
        FAST_MASK16(s, 2);
        FAST_MASK16(s, 3);
        f->cr[c] = cr;
        f->col[c] = col;
        /* marked bytes that are neither a CR nor right after one */
        uint64_t odd = ctl ^ (cr | cr << 1 | prev >> 63);
        uint64_t end = cr & (cr << 2 | prev >> 62);
        if (end) {
            unsigned b = (unsigned)__builtin_ctzll(end);
            /* through the LF after it (bit 0 of the next chunk when b is
             * 63: the walk reads that byte) */
            uint64_t upto = b >= 62 ? ~(uint64_t)0 : ((uint64_t)1 << (b + 2)) - 1;
            if (odd & upto)
                return 0;
            *ncr = crs + fast_bits(cr & (~(uint64_t)0 >> (63 - b)));
            return at + b;
        }
        if (odd)
            return 0;
        crs += fast_bits(cr);
        prev = cr;
    }
    return 0;
}

/* The first bit of w at or after pos, looking no further than word
 * last (marked); SIZE_MAX when there is none. */
static inline size_t fast_next(const uint64_t *w, size_t pos, size_t last)
{
    size_t c = pos >> 6;
    uint64_t x = w[c] & (~(uint64_t)0 << (pos & 63));
    while (!x) {
        if (++c > last)
            return SIZE_MAX;
        x = w[c];
    }
    return c * 64 + (size_t)__builtin_ctzll(x);
}

/* d[s, e) all of class k: the 16-byte run, then the byte loop. */
static inline bool fast_all(const char *d, size_t s, size_t e, size_t n, int k)
{
    s = k == C_TCHAR ? name_run16(d, s, e, n) : tgt_run16(d, s, e, n);
    while (s < e && IS(d[s], k))
        s++;
    return s == e;
}

/* The request line d[0, e): method SP target SP HTTP/d.d, within the
 * line limit; the method's length (its index in *method), or 0 when the
 * line is not of that shape. */
static size_t fast_request_line(const gw_http_parser_t *p, const char *d, size_t e, size_t n,
                                int *method)
{
    size_t ms;
    int mi;
    if (e < 14 || e > p->lim.request_line_bytes) /* "GET / HTTP/1.1" */
        return 0;
    if (memcmp(d, "POST ", 5) == 0) {
        ms = 4;
        mi = HTTP_POST;
    } else if (memcmp(d, "GET ", 4) == 0) {
        ms = 3;
        mi = HTTP_GET;
    } else {
        for (ms = 0; ms < e && IS(d[ms], C_TCHAR); ms++)
            ;
        if (ms == 0 || d[ms] != ' ' || (mi = method_find(d, ms)) < 0)
            return 0;
    }
    size_t te = e - 9; /* the SP before the version */
    if (te <= ms + 1 || d[te] != ' ' || !ver_plain(d + te + 1) ||
        !fast_all(d, ms + 1, te, n, C_TGT))
        return 0;
    *method = mi;
    return ms;
}

/* The status line d[0, e): HTTP/d.d SP 3DIGIT [SP reason] (the reason's
 * bytes were checked by fast_mark); false when not of that shape. */
static bool fast_status_line(const char *d, size_t e, unsigned *status)
{
    if (e < 12 || !ver_plain(d) || d[8] != ' ' || !IS(d[9], C_DIGIT) || !IS(d[10], C_DIGIT) ||
        !IS(d[11], C_DIGIT) || (e > 12 && d[12] != ' '))
        return false;
    *status = (unsigned)(d[9] - '0') * 100 + (unsigned)(d[10] - '0') * 10 + (unsigned)(d[11] - '0');
    return true;
}

/* The header lines d[s, q) (q: the end's CR) into p's block, whose arena
 * holds a copy of d; false when a line is not name ':' value CRLF with a
 * token name. */
static bool fast_lines(gw_http_parser_t *p, const head_fast_t *f, const char *d, size_t s, size_t q,
                       size_t n)
{
    char *ar = p->arena;
    gw_http_header_t *h = p->hdrs;
    while (s < q) {
        size_t e = fast_next(f->cr, s, q >> 6); /* q's at the latest */
        size_t k = fast_next(f->col, s, q >> 6);
        if (d[e + 1] != '\n' || k >= e)
            return false;
        gw_http_hn_t id = hn_find(d + s, k - s);
        /* a name of the enum matched case-insensitively is a token */
        if (id == GW_HN_OTHER && (k == s || !fast_all(d, s, k, n, C_TCHAR)))
            return false;
        /* OWS is SP (an HTAB was marked); d[e] is the CR, d[vs] not a SP */
        size_t vs = k + 1, ve = e;
        while (d[vs] == ' ')
            vs++;
        if (vs < e)
            while (d[ve - 1] == ' ')
                ve--;
        h->name = ar + s;
        h->name_len = k - s;
        h->value = ar + vs;
        h->value_len = ve - vs;
        h->id = id;
        ar[k] = '\0';
        ar[ve] = '\0';
        h++;
        s = e + 2;
    }
    return true;
}

/* Parses the head at d[0, n) in one step when it is all there and plain
 * (above). Returns its length through the final LF, or 0 when it was not
 * taken (the parser as it was; 503 set on OOM). */
static size_t head_fast(gw_http_parser_t *p, const char *d, size_t n)
{
    head_fast_t f;
    bool req = p->kind == GW_HTTP_REQUEST;
    size_t lim = SL_MIN(SL_MIN(n, (size_t)GW_HTTP_FAST_BYTES), p->lim.header_bytes);
    size_t ncr = 0;
    if (lim == 0 || d[0] == '\r' || d[0] == '\n') /* empty lines before a request line */
        return 0;
    size_t q = fast_mark(&f, d, lim, &ncr);
    /* the end's LF within the limit; no more lines than it allows */
    if (q == 0 || q + 1 >= lim || d[q + 1] != '\n' || ncr - 2 > p->lim.header_lines)
        return 0;
    size_t e0 = fast_next(f.cr, 0, q >> 6);
    size_t ms = 0;
    int mi = 0;
    unsigned st = 0;
    if (d[e0 + 1] != '\n' ||
        (req ? (ms = fast_request_line(p, d, e0, n, &mi)) == 0 : !fast_status_line(d, e0, &st)))
        return 0;
    if (block_take(p, q + 2, ncr) != 0) {
        fail(p, 503, "out_of_memory");
        return 0;
    }
    memcpy(p->arena, d, q); /* all but the empty line */
    if (!fast_lines(p, &f, d, e0 + 2, q, n)) {
        storage_drop(p); /* the byte loop's turn, from the first byte */
        p->msg.headers = NULL;
        return 0;
    }
    if (req) {
        size_t te = e0 - 9;
        p->method_off = 0;
        p->msg.method_len = ms;
        p->arena[ms] = '\0';
        p->target_off = ms + 1;
        p->msg.target_len = te - ms - 1;
        p->arena[te] = '\0';
        memcpy(p->ver, d + te + 1, 8);
        p->hp.method = (unsigned)mi;
    } else {
        memcpy(p->ver, d, 8);
        p->status = st;
    }
    p->ver_len = 8;
    p->nlines = ncr - 2;
    p->arena_len = q;
    p->head_bytes = q + 2;
    p->line0_len = e0;
    p->hs = HS_LINE_START;
    return q + 2;
}
#else
static size_t head_fast(gw_http_parser_t *p, const char *d, size_t n)
{
    (void)p, (void)d, (void)n;
    return 0;
}
#endif

/* The version and status of a head head_scan() found whole, where
 * head_check() looks for them. */
static void head_line(gw_http_parser_t *p)
{
    p->hp.http_major = (unsigned short)(p->ver[5] - '0');
    p->hp.http_minor = (unsigned short)(p->ver[7] - '0');
    if (p->kind == GW_HTTP_RESPONSE)
        p->hp.status_code = p->status;
}

/* The head passed head_check(): keep-alive, and whether a body follows.
 * Connection and Proxy-Connection are read as http-parser reads them:
 * "close" ends an HTTP/1.1 connection, "keep-alive" keeps an HTTP/1.0 one. */
static void head_done(gw_http_parser_t *p)
{
    gw_http_msg_t *m = &p->msg;
    bool req = p->kind == GW_HTTP_REQUEST, close = false, keep = false;
    m->http_major = p->hp.http_major;
    m->http_minor = p->hp.http_minor;
    m->status = req ? 0 : (int)p->hp.status_code;
    close = p->conn_close; /* head_check() read Connection, Proxy-Connection */
    keep = p->conn_keep;
    bool conn_ok = m->http_minor >= 1 ? !close : keep;
    if (!req) {
        int st = m->status;
        p->interim = st >= 100 && st < 200;
        p->skip_body = p->interim || st == 204 || st == 304 || p->head_request;
    }
    /* A response delimited by close cannot leave the connection reusable. */
    m->keep_alive = conn_ok && (req || p->skip_body || m->chunked || m->content_length >= 0);
    /* No body: a bodiless response, or no framing or a zero length (a
     * request without framing has none; a response reads to the close). */
    p->complete = !p->interim && (p->skip_body || m->content_length == 0 ||
                                  (req && !m->chunked && m->content_length < 0));
}

/* http-parser de-chunks a chunked body but never sees the head: a fixed
 * head of ours puts it in the chunked body state. */
static int chunk_start(gw_http_parser_t *p)
{
    static const char req[] = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
    static const char resp[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    bool r = p->kind == GW_HTTP_REQUEST;
    size_t n = r ? sizeof(req) - 1 : sizeof(resp) - 1;
    http_parser_init(&p->hp, r ? HTTP_REQUEST : HTTP_RESPONSE);
    p->hp.data = p;
    p->headers_done = false;
    if (hp_exec(p, r ? req : resp, n) != n || !p->headers_done || p->err_reason) {
        fail(p, 500, "chunk_start"); /* never: the head is ours */
        return -1;
    }
    return 0;
}

/* Feeds the head phase: one or more heads (1xx interims are skipped). */
static gw_http_state_t feed_heads(gw_http_parser_t *p, const char *d, size_t n, size_t *used)
{
    size_t off = 0;
    for (;;) {
        bool end = true;
        /* a head all here, fresh: in one step when plain (head_fast) */
        size_t v = gw_http_vector && p->head_bytes == 0 && !p->hdrs && !p->arena
                       ? head_fast(p, d + off, n - off)
                       : 0;
        if (v == 0 && !p->err_reason) {
            if (head_reserve(p, d + off, n - off) != 0) {
                fail(p, 503, "out_of_memory");
                *used = off;
                return GW_HTTP_ERROR;
            }
            v = head_scan(p, d + off, n - off, &end);
        }
        if (p->err_reason) {
            *used = off + v; /* up to the offending byte */
            return GW_HTTP_ERROR;
        }
        if (!end) {
            *used = n;
            return p->state = GW_HTTP_NEED_MORE;
        }
        head_line(p);
        if (head_check(p) != 0) {
            *used = off + v - 1; /* the head's last LF is not taken */
            return GW_HTTP_ERROR;
        }
        head_done(p);
        off += v;
        if (p->interim) {
            if (++p->ninterim > GW_HTTP_MAX_INTERIM) {
                fail(p, 502, "too_many_interim");
                *used = off;
                return GW_HTTP_ERROR;
            }
            if (p->one_block)
                storage_free(p); /* the interim's strings are not kept */
            head_restart(p);
            continue;
        }
        head_shrink(p);
        p->phase = PH_BODY;
        p->cs = CS_SIZE0;
        *used = off;
        if (!gw_http_chunk_direct && p->msg.chunked && !p->complete && chunk_start(p) != 0)
            return GW_HTTP_ERROR;
        return p->state = GW_HTTP_HEAD;
    }
}

static gw_http_state_t feed_head(gw_http_parser_t *p, const char *d, size_t n, size_t *used)
{
    return feed_heads(p, d, n, used);
}

/* ---- chunked framing ---- */

/* Validates chunked framing over n bytes; returns the valid prefix: all n,
 * up to and including the message's last LF (*end), or up to the bad byte. */
static unsigned hex_val(char c)
{
    return c <= '9' ? (unsigned)(c - '0') : (unsigned)((c | 0x20) - 'a' + 10);
}

/* The vector flag's fast path of chunk_scan(): a whole size line "1*15HEXDIG
 * CRLF" at d[i], taken in one step. Returns the bytes taken, 0 when the
 * line is anything else or not all there (the byte loop takes it then).
 * Fifteen digits cannot overflow the checks the byte loop makes. */
static size_t chunk_size_line(gw_http_parser_t *p, const char *d, size_t i, size_t n)
{
    size_t j = i;
    uint64_t size = 0;
    while (j < n && j - i < 15 && IS(d[j], C_HEX))
        size = size << 4 | hex_val(d[j++]);
    if (j == i || n - j < 2 || d[j] != '\r' || d[j + 1] != '\n')
        return 0;
    p->declared += size;
    if (p->lim.max_body_bytes && p->declared > p->lim.max_body_bytes) {
        fail(p, 413, "body_too_large");
        return j - i; /* at the CR, as the byte loop */
    }
    p->chunk_left = size;
    p->cs = size ? CS_DATA : CS_TR_START;
    return j + 2 - i;
}

static size_t chunk_scan(gw_http_parser_t *p, const char *d, size_t n, bool *end)
{
    size_t i = 0;
    *end = false;
    while (i < n && !p->err_reason) {
        char c = d[i];
        switch (p->cs) {
        case CS_SIZE0:
            if (gw_http_vector) {
                size_t k = chunk_size_line(p, d, i, n);
                if (k) {
                    i += k;
                    break;
                }
            }
            /* fall through */
        case CS_SIZE:
            if (IS(c, C_HEX)) {
                unsigned x = hex_val(c);
                if (++p->chunk_digits > 16 || p->chunk_size > (uint64_t)INT64_MAX >> 4) {
                    fail(p, 400, "bad_chunk_size");
                    break;
                }
                p->chunk_size = p->chunk_size << 4 | x;
                p->cs = CS_SIZE;
            } else if (p->cs == CS_SIZE && (c == ';' || c == '\r')) {
                p->declared += p->chunk_size;
                if (p->lim.max_body_bytes && p->declared > p->lim.max_body_bytes) {
                    fail(p, 413, "body_too_large");
                    break;
                }
                p->chunk_ext = 0;
                p->cs = c == ';' ? CS_EXT : CS_SIZE_LF;
            } else {
                fail(p, 400, c == '\n' ? "bare_lf" : "bad_chunk_size");
                break;
            }
            i++;
            break;
        case CS_EXT:
            if (c == '\r') {
                p->cs = CS_SIZE_LF;
            } else if (c == '\n') {
                fail(p, 400, "bare_lf");
                break;
            } else if (!IS(c, C_VAL) || ++p->chunk_ext > GW_HTTP_MAX_CHUNK_EXT) {
                fail(p, 400, "bad_chunk_ext");
                break;
            }
            i++;
            break;
        case CS_SIZE_LF:
            if (c != '\n') {
                fail(p, 400, "bare_cr");
                break;
            }
            p->chunk_left = p->chunk_size;
            p->cs = p->chunk_size ? CS_DATA : CS_TR_START;
            p->chunk_size = 0;
            p->chunk_digits = 0;
            i++;
            break;
        case CS_DATA: {
            uint64_t k = SL_MIN(p->chunk_left, (uint64_t)(n - i));
            if (gw_http_chunk_direct && body_deliver(p, d + i, (size_t)k) != 0)
                break; /* refused: the error is set */
            i += (size_t)k;
            p->chunk_left -= k;
            if (p->chunk_left)
                break;
            p->cs = CS_DATA_CR;
            if (gw_http_vector && n - i >= 2 && d[i] == '\r' && d[i + 1] == '\n') {
                p->cs = CS_SIZE0; /* the data's CRLF in one step */
                i += 2;
            }
            break;
        }
        case CS_DATA_CR:
            if (c != '\r') {
                fail(p, 400, c == '\n' ? "bare_lf" : "bad_chunk");
                break;
            }
            p->cs = CS_DATA_LF;
            i++;
            break;
        case CS_DATA_LF:
            if (c != '\n') {
                fail(p, 400, "bare_cr");
                break;
            }
            p->cs = CS_SIZE0;
            i++;
            break;
        case CS_TR_START:
        case CS_TR_NAME:
        case CS_TR_LINE:
            if (++p->trailer_bytes > p->lim.header_bytes) {
                fail(p, 431, "header_too_large");
                break;
            }
            if (p->cs == CS_TR_NAME) {
                /* a trailer field's name: 1*tchar ":", as in a head */
                if (c == ':') {
                    p->cs = CS_TR_LINE;
                } else if (!IS(c, C_TCHAR)) {
                    fail(p, 400, "bad_header");
                    break;
                }
            } else if (c == '\r') {
                p->cs = p->cs == CS_TR_START ? CS_END_LF : CS_TR_LF;
            } else if (c == '\n') {
                fail(p, 400, "bare_lf");
                break;
            } else if (p->cs == CS_TR_START && (c == ' ' || c == '\t')) {
                fail(p, 400, "obs_fold");
                break;
            } else if (p->cs == CS_TR_START) {
                if (!IS(c, C_TCHAR)) {
                    fail(p, 400, "bad_header");
                    break;
                }
                p->cs = CS_TR_NAME;
            } else if (!IS(c, C_VAL)) {
                fail(p, 400, "bad_char");
                break;
            }
            i++;
            break;
        case CS_TR_LF:
        case CS_END_LF:
            if (c != '\n') {
                fail(p, 400, "bare_cr");
                break;
            }
            i++;
            if (p->cs == CS_END_LF) {
                p->cs = CS_END;
                *end = true;
                if (gw_http_chunk_direct)
                    p->complete = true;
                return i;
            }
            p->trailer_bytes++;
            p->cs = CS_TR_START;
            break;
        default:
            *end = true;
            return 0;
        }
    }
    return i;
}

static gw_http_state_t feed_body(gw_http_parser_t *p, const char *d, size_t n, size_t *used)
{
    if (p->complete) {
        *used = 0;
        return p->state = GW_HTTP_DONE;
    }
    if (!p->msg.chunked) {
        /* Content-Length bytes, or a response's up to the close */
        size_t k = n;
        int64_t cl = p->msg.content_length;
        if (cl >= 0 && (uint64_t)cl - p->body_bytes < k)
            k = (size_t)((uint64_t)cl - p->body_bytes);
        *used = k;
        if (k && body_deliver(p, d, k) != 0)
            return GW_HTTP_ERROR;
        p->complete = cl >= 0 && p->body_bytes == (uint64_t)cl;
        return p->state = p->complete ? GW_HTTP_DONE : GW_HTTP_NEED_MORE;
    }
    bool end = false;
    if (gw_http_chunk_direct) {
        *used = chunk_scan(p, d, n, &end);
        if (p->err_reason)
            return GW_HTTP_ERROR;
        return p->state = p->complete ? GW_HTTP_DONE : GW_HTTP_NEED_MORE;
    }
    gw_http_state_t prev = p->state;
    size_t v = chunk_scan(p, d, n, &end);
    gw_http_err_t e = err_take(p, prev);
    size_t r = hp_exec(p, d, v); /* the valid bytes' data reaches the callback */
    err_put(p, e);
    if (!p->err_reason && end && !p->complete)
        fail(p, 400, "bad_message"); /* the two parsers disagree */
    *used = r;
    if (p->err_reason)
        return GW_HTTP_ERROR;
    return p->state = p->complete ? GW_HTTP_DONE : GW_HTTP_NEED_MORE;
}

/* ---- public API ---- */

gw_http_parser_t *gw_http_parser_new(gw_http_kind_t kind, const gw_http_limits_t *limits)
{
    static const gw_http_limits_t defaults = {
        .request_line_bytes = 8192,
        .header_bytes = 16384,
        .header_lines = 100,
        .max_body_bytes = 1 << 20,
    };
    /* line-aligned, so reset's fields are one line (the struct's top) */
    size_t size = (sizeof(gw_http_parser_t) + 63) & ~(size_t)63;
    gw_http_parser_t *p = aligned_alloc(64, size);
    if (!p)
        return NULL;
    memset(p, 0, size);
    p->kind = kind;
    p->lim = limits ? *limits : defaults;
    if (!p->lim.request_line_bytes)
        p->lim.request_line_bytes = defaults.request_line_bytes;
    if (!p->lim.header_bytes)
        p->lim.header_bytes = defaults.header_bytes;
    if (!p->lim.header_lines)
        p->lim.header_lines = defaults.header_lines;
    /* The head storage grows with the head's bytes (head_reserve). */
    gw_http_parser_reset(p);
    return p;
}

void gw_http_parser_free(gw_http_parser_t *p)
{
    if (!p)
        return;
    storage_free(p);
    free(p);
}

/* What reset leaves to the next feed: the rest of the parse state. Every
 * entry point that parses or loads calls parse_fresh() first; the
 * accessors read only the top line, which reset writes at once. */
static void parse_restart(gw_http_parser_t *p)
{
    /* http-parser itself is not reset here: it sees no head, and the
     * fields of it that head_check() reads (method, version, status) are
     * set by the scan or the load of every head before it runs; the
     * reference path of a chunked body starts it afresh (chunk_start). */
    p->complete = false;
    p->ninterim = 0;
    p->cs = CS_SIZE0;
    p->chunk_digits = 0;
    p->chunk_ext = 0;
    p->chunk_size = 0;
    p->chunk_left = 0;
    p->declared = 0;
    p->trailer_bytes = 0;
    p->cb = NULL;
    p->cb_arg = NULL;
    head_restart(p);
    p->stale = false;
}

static inline void parse_fresh(gw_http_parser_t *p)
{
    if (p->stale)
        parse_restart(p);
}

void gw_http_parser_reset(gw_http_parser_t *p)
{
    p->state = GW_HTTP_NEED_MORE;
    p->phase = PH_HEAD;
    p->head_request = false;
    p->started = false;
    p->err_status = 0;
    p->err_reason = NULL;
    p->body_bytes = 0;
    /* the next head takes its own (head_reserve); storage_free's write to
     * msg.headers is parse_restart's too */
    storage_drop(p);
    p->stale = true;
}

void gw_http_parser_reset_now(gw_http_parser_t *p)
{
    gw_http_parser_reset(p);
    parse_restart(p);
}

size_t gw_http_parser_held(const gw_http_parser_t *p)
{
    return p->arena_cap + p->hdrs_cap * sizeof(*p->hdrs);
}

void gw_http_parser_set_head_request(gw_http_parser_t *p, bool head)
{
    p->head_request = head;
}

gw_http_state_t gw_http_feed(gw_http_parser_t *p, const char *data, size_t n, size_t *consumed,
                             gw_http_body_cb body_cb, void *arg)
{
    parse_fresh(p);
    *consumed = 0;
    if (p->state == GW_HTTP_ERROR || p->state == GW_HTTP_DONE)
        return p->state;
    if (n)
        p->started = true;
    p->cb = body_cb;
    p->cb_arg = arg;
    gw_http_state_t st =
        p->phase == PH_HEAD ? feed_head(p, data, n, consumed) : feed_body(p, data, n, consumed);
    p->cb = NULL;
    p->cb_arg = NULL;
    return st;
}

/* Chains peeked per pass: a request's head and body are in one or two. */
#define GW_HTTP_FEED_IOV 4

/* Feeds the k peeked chains in order; *used gets the bytes taken. Returns
 * at DONE or ERROR; at HEAD unless head_cb says go on (0); NEED_MORE once
 * the chains are used up, or when the parser took nothing. Right after
 * HEAD it feeds even nothing, so a body-less message completes. */
static gw_http_state_t feed_iov(gw_http_parser_t *p, const struct evbuffer_iovec *v, int k,
                                size_t *used, const gw_http_feed_cbs_t *cbs)
{
    size_t total = 0, off = 0;
    int i = 0;
    gw_http_state_t st;
    for (;;) {
        while (i < k && off == v[i].iov_len) {
            i++;
            off = 0;
        }
        size_t left = i < k ? v[i].iov_len - off : 0;
        if (left == 0 && p->phase == PH_HEAD && p->state != GW_HTTP_ERROR) {
            /* Nothing to feed, and no head just passed that a 0-byte feed
             * could complete. */
            st = GW_HTTP_NEED_MORE;
            break;
        }
        const char *d = left ? (const char *)v[i].iov_base + off : "";
        size_t u = 0;
        st = gw_http_feed(p, d, left, &u, cbs->body_cb, cbs->body_arg);
        off += u;
        total += u;
        if (st == GW_HTTP_HEAD && cbs->head_cb && cbs->head_cb(cbs->head_arg) == 0)
            continue; /* the body in the same pass */
        if (st != GW_HTTP_NEED_MORE || u == 0 || (u == left && i + 1 >= k))
            break;
    }
    *used = total;
    return st;
}

gw_http_state_t gw_http_feed_evbuffer_cbs(gw_http_parser_t *p, struct evbuffer *in, size_t *fed,
                                          const gw_http_feed_cbs_t *cbs)
{
    size_t total = 0;
    gw_http_state_t st;
    for (;;) {
        struct evbuffer_iovec v[GW_HTTP_FEED_IOV];
        int n = evbuffer_peek(in, -1, NULL, v, GW_HTTP_FEED_IOV);
        int k = n < 0 ? 0 : n > GW_HTTP_FEED_IOV ? GW_HTTP_FEED_IOV : n;
        size_t used = 0, have = 0;
        st = feed_iov(p, v, k, &used, cbs);
        if (used) /* once for all the chains fed (head and body alike) */
            evbuffer_drain(in, used);
        total += used;
        /* with len -1, evbuffer_peek stops at GW_HTTP_FEED_IOV chains: when
         * it filled them all and the parser took them all, look again */
        if (st != GW_HTTP_NEED_MORE || n < GW_HTTP_FEED_IOV || used == 0)
            break;
        for (int i = 0; i < k; i++)
            have += v[i].iov_len;
        if (used != have)
            break; /* the parser stopped short: as with nothing taken */
    }
    if (fed)
        *fed = total;
    return st;
}

gw_http_state_t gw_http_feed_evbuffer(gw_http_parser_t *p, struct evbuffer *in, size_t *fed,
                                      gw_http_body_cb body_cb, void *arg)
{
    const gw_http_feed_cbs_t cbs = {.body_cb = body_cb, .body_arg = arg};
    return gw_http_feed_evbuffer_cbs(p, in, fed, &cbs);
}

gw_http_state_t gw_http_feed_eof(gw_http_parser_t *p, gw_http_body_cb body_cb, void *arg)
{
    parse_fresh(p);
    if (p->state == GW_HTTP_ERROR || p->state == GW_HTTP_DONE)
        return p->state;
    if (p->phase == PH_HEAD) {
        if (!p->started)
            return p->state; /* idle connection closed: nothing lost */
        fail(p, 400, "truncated");
        return GW_HTTP_ERROR;
    }
    if (p->complete)
        return p->state = GW_HTTP_DONE;
    /* Only a response without Content-Length or chunking ends at close. */
    (void)body_cb; /* no bytes are left to deliver: the body was fed as it came */
    (void)arg;
    if (p->kind == GW_HTTP_RESPONSE && !p->msg.chunked && p->msg.content_length < 0) {
        p->complete = true;
        return p->state = GW_HTTP_DONE;
    }
    fail(p, 400, "truncated");
    return GW_HTTP_ERROR;
}

/* ---- heads decoded by another framing (HTTP/2) ---- */

/* A loaded head's first storage: an arena and a header table most heads
 * fit in (load_str). */
#define GW_HTTP_LOAD_ARENA 384
#define GW_HTTP_LOAD_LINES 12

/* Copies n bytes and a NUL into the arena; false when over header_bytes. */
static bool load_str(gw_http_parser_t *p, const char *s, size_t n, size_t *off)
{
    if (p->head_bytes + n > p->lim.header_bytes) {
        fail(p, 431, "header_too_large");
        return false;
    }
    /* The storage grows with the head, as for bytes fed (head_reserve),
     * but starts at a block most heads fit in: grown field by field from
     * nothing, an h2 head took ~6 reallocs (each moving every field). */
    size_t want = p->arena_cap ? n : SL_MAX(n, (size_t)GW_HTTP_LOAD_ARENA - 1); /* + its NUL */
    if (storage_reserve(p, want, SL_MAX(p->nlines + 1, (size_t)GW_HTTP_LOAD_LINES)) != 0) {
        fail(p, 503, "out_of_memory");
        return false;
    }
    if (p->arena_len + n + 1 > p->arena_cap) {
        fail(p, 431, "header_too_large");
        return false;
    }
    *off = p->arena_len;
    memcpy(p->arena + p->arena_len, s, n);
    p->arena[p->arena_len + n] = '\0';
    p->arena_len += n + 1;
    p->head_bytes += n;
    return true;
}

static bool all_in(const char *s, size_t n, int cls)
{
    for (size_t i = 0; i < n; i++)
        if (!IS(s[i], cls))
            return false;
    return true;
}

/* RFC 9113 8.2.2: connection-specific fields are malformed in h2. */
#define GW_HN_CONN_SPECIFIC                                                                        \
    (GW_HN_BIT(GW_HN_CONNECTION) | GW_HN_BIT(GW_HN_KEEP_ALIVE) |                                   \
     GW_HN_BIT(GW_HN_PROXY_CONNECTION) | GW_HN_BIT(GW_HN_TRANSFER_ENCODING) |                      \
     GW_HN_BIT(GW_HN_UPGRADE))

gw_http_state_t gw_http_load_header(gw_http_parser_t *p, const char *name, size_t name_len,
                                    const char *value, size_t value_len)
{
    parse_fresh(p);
    if (p->state == GW_HTTP_ERROR)
        return p->state;
    p->started = true;
    if (p->nlines >= p->lim.header_lines) {
        fail(p, 431, "too_many_headers");
        return p->state;
    }
    if (name_len == 0 || !all_in(name, name_len, C_TCHAR) || !all_in(value, value_len, C_VAL)) {
        fail(p, 400, "bad_header");
        return p->state;
    }
    gw_http_hn_t id = gw_http_hn(name, name_len);
    if (GW_HN_BIT(id) & GW_HN_CONN_SPECIFIC) {
        fail(p, 400, "connection_header");
        return p->state;
    }
    /* OWS is not part of a value (RFC 9110 5.5), as head_scan() trims it. */
    while (value_len && (value[0] == ' ' || value[0] == '\t')) {
        value++;
        value_len--;
    }
    while (value_len && (value[value_len - 1] == ' ' || value[value_len - 1] == '\t'))
        value_len--;
    size_t no, vo;
    p->head_bytes += 4; /* ": " and CRLF, as the same line in HTTP/1.1 */
    if (!load_str(p, name, name_len, &no) || !load_str(p, value, value_len, &vo))
        return p->state;
    gw_http_header_t *h = &p->hdrs[p->nlines++];
    h->name = p->arena + no;
    h->name_len = name_len;
    h->value = p->arena + vo;
    h->value_len = value_len;
    h->id = id;
    return p->state;
}

gw_http_state_t gw_http_load_head(gw_http_parser_t *p, const char *method, const char *path,
                                  const char *authority, bool body_follows)
{
    parse_fresh(p);
    if (p->state == GW_HTTP_ERROR)
        return p->state;
    p->started = true;
    size_t ml = strlen(method), pl = strlen(path), al = authority ? strlen(authority) : 0;
    if (ml + pl + 11 > p->lim.request_line_bytes) { /* "M P HTTP/1.1\r\n" */
        fail(p, 414, "uri_too_long");
        return p->state;
    }
    if (ml == 0 || !all_in(method, ml, C_TCHAR)) {
        fail(p, 400, "bad_method");
        return p->state;
    }
    if (strcmp(method, "CONNECT") == 0) {
        fail(p, 501, "connect");
        return p->state;
    }
    if (pl == 0 || !all_in(path, pl, C_TGT)) {
        fail(p, 400, "bad_target");
        return p->state;
    }
    /* Host from :authority (RFC 9113 8.3.1), checked like a Host header. */
    if (gw_http_load_header(p, "host", 4, authority ? authority : "", al) == GW_HTTP_ERROR)
        return p->state;
    size_t mo, to;
    if (!load_str(p, method, ml, &mo) || !load_str(p, path, pl, &to))
        return p->state;
    p->method_off = mo;
    p->target_off = to;
    p->msg.method_len = ml;
    p->msg.target_len = pl;
    p->hp.http_major = 1; /* what head_check() asks of an HTTP/1.1 head */
    p->hp.http_minor = 1;
    p->hp.method = HTTP_GET;
    if (head_check(p) != 0)
        return p->state;
    /* Storage still at its first size has nothing worth two reallocs
     * (moving every field) to give back: a few hundred bytes, freed with
     * the request. A head that grew it is cut to its size. */
    if (p->arena_cap > GW_HTTP_LOAD_ARENA || p->hdrs_cap > GW_HTTP_LOAD_LINES)
        head_shrink(p);
    gw_http_msg_t *m = &p->msg;
    m->http_major = 2;
    m->http_minor = 0;
    m->keep_alive = false; /* one request per stream */
    m->expect_continue = false;
    if (!body_follows && m->content_length > 0) {
        fail(p, 400, "body_length");
        return p->state;
    }
    p->phase = PH_BODY;
    p->complete = !body_follows;
    return p->state = body_follows ? GW_HTTP_HEAD : GW_HTTP_DONE;
}

gw_http_state_t gw_http_load_fail(gw_http_parser_t *p, int status, const char *reason)
{
    parse_fresh(p);
    p->started = true;
    fail(p, status, reason);
    return p->state;
}

gw_http_state_t gw_http_load_body(gw_http_parser_t *p, const char *data, size_t n, bool end,
                                  gw_http_body_cb body_cb, void *arg)
{
    parse_fresh(p);
    if (p->state == GW_HTTP_ERROR || p->state == GW_HTTP_DONE || p->phase != PH_BODY)
        return p->state;
    int64_t cl = p->msg.content_length;
    if (p->lim.max_body_bytes && p->body_bytes + n > p->lim.max_body_bytes) {
        fail(p, 413, "body_too_large");
        return p->state;
    }
    if (cl >= 0 && p->body_bytes + n > (uint64_t)cl) {
        fail(p, 400, "body_length");
        return p->state;
    }
    p->body_bytes += n;
    if (n && body_cb && body_cb(arg, data, n) != 0) {
        fail(p, 500, "body_callback");
        return p->state;
    }
    if (!end)
        return p->state;
    if (cl >= 0 && p->body_bytes != (uint64_t)cl) {
        fail(p, 400, "body_length");
        return p->state;
    }
    p->complete = true;
    return p->state = GW_HTTP_DONE;
}

gw_http_state_t gw_http_state(const gw_http_parser_t *p)
{
    return p->state;
}

const gw_http_msg_t *gw_http_msg(const gw_http_parser_t *p)
{
    return p->phase == PH_BODY ? &p->msg : NULL;
}

uint64_t gw_http_body_bytes(const gw_http_parser_t *p)
{
    return p->body_bytes;
}

bool gw_http_started(const gw_http_parser_t *p)
{
    return p->started;
}

int gw_http_error_status(const gw_http_parser_t *p)
{
    return p->err_status;
}

const char *gw_http_error_reason(const gw_http_parser_t *p)
{
    return p->err_reason ? p->err_reason : "";
}

const gw_http_header_t *gw_http_header_get(const gw_http_msg_t *m, gw_http_hn_t id)
{
    if (!(m->present & GW_HN_BIT(id)))
        return NULL;
    for (size_t i = 0; i < m->nheaders; i++)
        if (m->headers[i].id == id)
            return &m->headers[i];
    return NULL;
}

const gw_http_header_t *gw_http_header_find(const gw_http_msg_t *m, const char *name)
{
    size_t n = strlen(name);
    gw_http_hn_t id = gw_http_hn(name, n);
    if (id != GW_HN_OTHER) /* a name of the enum: the ids head_check() set */
        return gw_http_header_get(m, id);
    for (size_t i = 0; i < m->nheaders; i++)
        if (m->headers[i].name_len == n && strcasecmp(m->headers[i].name, name) == 0)
            return &m->headers[i];
    return NULL;
}

/* Is `name` one of the comma-separated tokens of value v? */
static bool token_listed(const char *v, size_t vn, const char *name, size_t name_len)
{
    size_t i = 0, s, n;
    while ((n = token_next(v, vn, &i, &s)) != 0)
        if (n == name_len && strncasecmp(v + s, name, name_len) == 0)
            return true;
    return false;
}

bool gw_http_header_is_hop(const gw_http_msg_t *m, const char *name, size_t name_len)
{
    if (GW_HN_BIT(gw_http_hn(name, name_len)) & GW_HN_HOP)
        return true;
    if (name_len >= sizeof("proxy-") - 1 && NAME_IS(name, "proxy-"))
        return true;
    if (!m)
        return false;
    for (size_t i = 0; i < m->nheaders; i++) {
        const gw_http_header_t *h = &m->headers[i];
        if (h->name_len == 10 && NAME_IS(h->name, "connection") &&
            token_listed(h->value, h->value_len, name, name_len))
            return true;
    }
    return false;
}

const char *gw_http_status_text(int status)
{
    const char *s = http_status_str((enum http_status)status);
    return s[0] == '<' ? "Unknown" : s; /* "<unknown>": no reason phrase starts so */
}
