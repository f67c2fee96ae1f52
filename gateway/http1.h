/*
 * http1.h — strict HTTP/1.1 message framing: a small adapter over Debian's
 * http-parser (built non-strict by Debian: the adapter adds the checks) for
 * client requests and upstream responses.
 *
 * The adapter is pure: it is fed bytes and reports what it parsed. It never
 * touches sockets. The proxy forwards what the adapter parsed (method, target,
 * the header list), re-serialised — never raw header bytes.
 *
 * On top of http-parser it enforces (requests and responses alike unless
 * said):
 *   - the request line within limits.request_line_bytes   -> 414
 *   - the header section within header_bytes and header_lines -> 431
 *   - the body within max_body_bytes (Content-Length checked up front,
 *     chunked counted as it comes)                           -> 413
 *   - every line ends in CRLF: a bare CR or bare LF in the head -> 400
 *   - no obs-fold (a header line starting with SP or HTAB)  -> 400
 *   - Content-Length with Transfer-Encoding, two Content-Lengths, a
 *     Content-Length that is not 1*DIGIT, a Transfer-Encoding other than
 *     exactly "chunked"                                     -> 400 (501 for an
 *     unknown coding)
 *   - bad chunk sizes (0x5, +5, spaces, overflow)           -> 400
 *   - requests: HTTP/1.1 needs exactly one Host; a second Host -> 400;
 *     origin-form target ("/..."), else 400; CONNECT -> 501; only
 *     HTTP/1.0 and HTTP/1.1 (others -> 505). An Upgrade header is not an
 *     error: it is hop-by-hop, so it is dropped and the request served as
 *     plain HTTP/1.1 (RFC 9110 7.8; `curl --http2 http://` sends h2c)
 *   - "Expect: 100-continue" is reported (expect_continue); any other
 *     expectation -> 417
 *   - the request line must be exactly token SP target SP HTTP/d.d, header
 *     names tokens, no control bytes in the head                -> 400
 * Debian's http-parser is built non-strict (HTTP_PARSER_STRICT=0), so these
 * syntax checks are the adapter's own (see http1.c).
 * Every error leaves the parser in GW_HTTP_ERROR with a status and a short
 * machine-readable reason; the caller answers and closes the connection.
 * Errors in a response (the upstream's fault) all have status 502, except a
 * body callback's failure (500).
 *
 * Responses: 1xx interim responses are skipped (the caller sees the final
 * head only; a 101 is an error since Upgrade is never forwarded); 204, 304
 * and the answer to a HEAD request have no body whatever their headers say.
 */
#ifndef GW_HTTP1_H
#define GW_HTTP1_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/sl.h"

struct evbuffer;

typedef enum gw_http_kind {
    GW_HTTP_REQUEST = 0,
    GW_HTTP_RESPONSE,
} gw_http_kind_t;

/* Copied by gw_http_parser_new(); NULL, or a zero field but max_body_bytes,
 * means the defaults (8 KiB, 16 KiB, 100 lines, 1 MiB). http-parser has its
 * own 80 KiB ceiling on a head (431 beyond it whatever header_bytes says). */
typedef struct gw_http_limits {
    size_t request_line_bytes; /* requests only; responses use header_bytes */
    size_t header_bytes;       /* the whole head, request/status line included */
    size_t header_lines;
    size_t max_body_bytes; /* 0 = unlimited (responses stream through) */
} gw_http_limits_t;

/* The header names the head's rules look at, that the proxy drops or
 * rewrites: found once per header when the head is checked (the id of
 * gw_http_header_t), so a list of them is a mask of GW_HN_BIT()s. */
typedef enum gw_http_hn {
    GW_HN_OTHER = 0,
    GW_HN_TE,
    GW_HN_HOST,
    GW_HN_DATE,
    GW_HN_EXPECT,
    GW_HN_SERVER,
    GW_HN_TRAILER,
    GW_HN_UPGRADE,
    GW_HN_FORWARDED,
    GW_HN_X_REAL_IP,
    GW_HN_CONNECTION,
    GW_HN_KEEP_ALIVE,
    GW_HN_TRACEPARENT,
    GW_HN_CONTENT_TYPE,
    GW_HN_X_REQUEST_ID,
    GW_HN_AUTHORIZATION,
    GW_HN_CACHE_CONTROL,
    GW_HN_CONTENT_LENGTH,
    GW_HN_X_SLUICE_NONCE,
    GW_HN_ACCEPT_ENCODING,
    GW_HN_X_FORWARDED_FOR,
    GW_HN_IDEMPOTENCY_KEY,
    GW_HN_PROXY_CONNECTION,
    GW_HN_X_FORWARDED_HOST,
    GW_HN_TRANSFER_ENCODING,
    GW_HN_X_FORWARDED_PROTO,
    GW_HN_X_ACCEL_BUFFERING,
    GW_HN_PROXY_AUTHENTICATE,
    GW_HN_X_SLUICE_SIGNATURE,
    GW_HN_X_SLUICE_TIMESTAMP,
    GW_HN_PROXY_AUTHORIZATION,
    GW_HN_RETRY_AFTER,
    GW_HN_ACCEPT_LANGUAGE,
    GW_HN_CONTENT_ENCODING,
    GW_HN_X_SLUICE_FAULT,     /* fallback's fault injection (FB_FAULT_HEADER) */
    GW_HN_X_SLUICE_ADMIN_KEY, /* and its key (FB_FAULT_ADMIN_HEADER) */
} gw_http_hn_t;
#define GW_HN_BIT(id) ((uint64_t)1 << (id))
/* The hop-by-hop names of RFC 9110 7.6.1 that gw_http_header_is_hop()
 * knows by name: Connection, Keep-Alive, TE, Trailer, Transfer-Encoding,
 * Upgrade. */
#define GW_HN_HOP                                                                                  \
    (GW_HN_BIT(GW_HN_CONNECTION) | GW_HN_BIT(GW_HN_KEEP_ALIVE) | GW_HN_BIT(GW_HN_TE) |             \
     GW_HN_BIT(GW_HN_TRAILER) | GW_HN_BIT(GW_HN_TRANSFER_ENCODING) | GW_HN_BIT(GW_HN_UPGRADE))
/* Request headers that may appear once (400 duplicate_header): credentials
 * and the ids that key replay and idempotency. */
#define GW_HN_SINGLE                                                                               \
    (GW_HN_BIT(GW_HN_AUTHORIZATION) | GW_HN_BIT(GW_HN_X_SLUICE_SIGNATURE) |                        \
     GW_HN_BIT(GW_HN_X_SLUICE_NONCE) | GW_HN_BIT(GW_HN_X_SLUICE_TIMESTAMP) |                       \
     GW_HN_BIT(GW_HN_IDEMPOTENCY_KEY) | GW_HN_BIT(GW_HN_X_REQUEST_ID))

typedef struct gw_http_header {
    const char *name;  /* NUL-terminated, as sent (case kept) */
    const char *value; /* NUL-terminated, leading/trailing OWS stripped */
    size_t name_len;
    size_t value_len;
    gw_http_hn_t id; /* set when the head is checked; GW_HN_OTHER in a header of ours */
} gw_http_header_t;

/* The parsed head. Strings point into the parser's own storage and stay
 * valid until gw_http_parser_reset() or _free(). */
typedef struct gw_http_msg {
    /* request */
    const char *method; /* "GET", "POST", ... */
    size_t method_len;
    const char *target; /* origin-form, "/v1/chat/completions?x=1" */
    size_t target_len;
    size_t path_len; /* length of target up to '?' */
    /* response */
    int status;
    /* both */
    int http_major, http_minor;
    gw_http_header_t *headers;
    size_t nheaders;
    int64_t content_length; /* -1 when absent */
    bool chunked;
    bool keep_alive;      /* http_should_keep_alive() after the head */
    bool expect_continue; /* requests */
    const char *host;     /* requests: the Host value (NULL for HTTP/1.0 without one) */
    /* GW_HN_BIT()s of the ids among headers, set with them when the head
     * is checked: gw_http_header_get answers an absent name without a
     * walk (most of its asks on a request: the fault, idempotency, request
     * id, encoding headers) */
    uint64_t present;
} gw_http_msg_t;

typedef enum gw_http_state {
    GW_HTTP_NEED_MORE = 0, /* all input consumed, message not complete */
    GW_HTTP_HEAD,          /* head complete: gw_http_msg() is valid; feed again for the body */
    GW_HTTP_DONE,          /* message complete; input after it was not consumed */
    GW_HTTP_ERROR,         /* see gw_http_error_status/_reason */
} gw_http_state_t;

/* Body bytes, already de-chunked; `p` points into the fed input (borrowed
 * for the callback). Return 0 to go on, -1 to stop with an error (500). */
typedef int (*gw_http_body_cb)(void *arg, const char *p, size_t n);

typedef struct gw_http_parser gw_http_parser_t;

gw_http_parser_t *gw_http_parser_new(gw_http_kind_t kind, const gw_http_limits_t *limits);
void gw_http_parser_free(gw_http_parser_t *p);
/* Ready for the next message on the same connection (keep-alive): frees
 * the head storage and makes the accessors read as on a new parser at once,
 * the rest of the parse state at the next feed or load (one cache line now,
 * the others when the next message touches them anyway: for a parser whose
 * last bytes came long ago, e.g. a client's at the end of its request). */
void gw_http_parser_reset(gw_http_parser_t *p);
/* The same, all of it now: for a parser used just before (an upstream
 * connection's, released right after its response), whose lines are warm
 * now and would be cold at the next message. */
void gw_http_parser_reset_now(gw_http_parser_t *p);
/* Bytes of head storage p holds now: a head that arrived whole holds a
 * block sized by its bytes; one fed in pieces grows with them and is cut to
 * what it used once complete; none after reset. */
size_t gw_http_parser_held(const gw_http_parser_t *p);
/* Responses: the request was HEAD (no body follows, whatever the headers say).
 * Call it after _new/_reset, before feeding; reset clears it. */
void gw_http_parser_set_head_request(gw_http_parser_t *p, bool head);

/* Feeds up to n bytes. *consumed tells how many were used. Parsing stops
 * (and returns) after the head is complete (GW_HTTP_HEAD) and after the
 * message is complete (GW_HTTP_DONE), so the caller can act on the head
 * before any body byte, and so pipelined bytes after a message are left
 * alone. Body bytes go to body_cb (may be NULL to discard). Once it has
 * returned GW_HTTP_HEAD, feeding goes on in the body: call it again even
 * with n == 0, since a message without a body then returns GW_HTTP_DONE
 * (consumed 0). After DONE or ERROR it returns the same, consuming nothing,
 * until reset. */
gw_http_state_t gw_http_feed(gw_http_parser_t *p, const char *data, size_t n, size_t *consumed,
                             gw_http_body_cb body_cb, void *arg) SL_WUR;

/* gw_http_feed over what `in` holds, draining what the parser used: returns
 * at HEAD, DONE or ERROR as gw_http_feed does, or NEED_MORE once `in` is used
 * up. Right after HEAD it feeds even an empty `in`, so a body-less message
 * completes (DONE). *fed (may be NULL) gets the bytes drained. The one feed
 * loop of the client side, the proxy and the resender. */
gw_http_state_t gw_http_feed_evbuffer(gw_http_parser_t *p, struct evbuffer *in, size_t *fed,
                                      gw_http_body_cb body_cb, void *arg) SL_WUR;

/* Called at a complete head from inside the feed, before any body byte:
 * return 0 to feed the body on in the same pass (one peek and one drain of
 * the input for head and body), else the feed returns GW_HTTP_HEAD. The
 * head's bytes are still in the input (drained when the pass ends): the
 * callback must not touch that buffer, nor free what feeds it. */
typedef int (*gw_http_head_cb)(void *arg);

typedef struct gw_http_feed_cbs {
    gw_http_head_cb head_cb; /* may be NULL: return at HEAD */
    void *head_arg;
    gw_http_body_cb body_cb; /* may be NULL: discard the body */
    void *body_arg;
} gw_http_feed_cbs_t;

/* gw_http_feed_evbuffer with a head callback. */
gw_http_state_t gw_http_feed_evbuffer_cbs(gw_http_parser_t *p, struct evbuffer *in, size_t *fed,
                                          const gw_http_feed_cbs_t *cbs) SL_WUR;

/* The peer closed: for a response delimited by close, this completes it
 * (GW_HTTP_DONE); otherwise an incomplete message is GW_HTTP_ERROR
 * ("truncated"). With no byte fed since reset it returns GW_HTTP_NEED_MORE
 * (an idle keep-alive connection closing is not an error). */
gw_http_state_t gw_http_feed_eof(gw_http_parser_t *p, gw_http_body_cb body_cb, void *arg) SL_WUR;

gw_http_state_t gw_http_state(const gw_http_parser_t *p);
/* The parsed head once GW_HTTP_HEAD was returned (also in DONE); NULL before. */
const gw_http_msg_t *gw_http_msg(const gw_http_parser_t *p);
/* Bytes of body delivered so far. */
uint64_t gw_http_body_bytes(const gw_http_parser_t *p);
/* Any byte of a message seen since the last reset (idle vs mid-request). */
bool gw_http_started(const gw_http_parser_t *p);

/* 400, 413, 414, 417, 431, 500, 501, 505 (502 for responses); 0 when none. */
int gw_http_error_status(const gw_http_parser_t *p);
/* Short reason for logs and error bodies: "bare_lf", "obs_fold", "cl_and_te",
 * "duplicate_content_length", "bad_chunk_size", "header_too_large",
 * "too_many_headers", "uri_too_long", "body_too_large", "missing_host",
 * "duplicate_host", ... ("" when none). The full list is in test_http1.c. */
const char *gw_http_error_reason(const gw_http_parser_t *p);

/* A request head decoded by another framing (HTTP/2, h2.c), loaded into a
 * fresh (or reset) request parser without any HTTP/1.1 text: the same
 * limits and checks as a parsed head (header_lines, header_bytes and
 * request_line_bytes -> 431/414, method a token, origin-form target, one
 * Content-Length of digits within max_body_bytes -> 413, the credentials
 * that may appear once -> 400 duplicate_header), plus the connection-specific
 * headers RFC 9113 8.2.2 forbids (Connection, Keep-Alive, Proxy-Connection,
 * Transfer-Encoding, Upgrade -> 400). Headers first, then _load_head with
 * the pseudo-header fields (authority becomes the Host header); it returns
 * GW_HTTP_HEAD when a body follows, GW_HTTP_DONE when not, or GW_HTTP_ERROR
 * (status and reason as for a parsed head). Once an error is set, later
 * calls return it. gw_http_msg() is valid after HEAD/DONE as usual. */
gw_http_state_t gw_http_load_header(gw_http_parser_t *p, const char *name, size_t name_len,
                                    const char *value, size_t value_len);
gw_http_state_t gw_http_load_head(gw_http_parser_t *p, const char *method, const char *path,
                                  const char *authority, bool body_follows) SL_WUR;
/* The other framing found the head malformed itself (h2: a header list
 * over its cap, missing pseudo-header fields): ERROR with this status and
 * reason, answered like any other. */
gw_http_state_t gw_http_load_fail(gw_http_parser_t *p, int status, const char *reason);
/* Body bytes of a loaded head: counted against max_body_bytes (413) and the
 * Content-Length (400 body_length), then to body_cb. end: the body is
 * complete (DONE, or 400 body_length when shorter than Content-Length). */
gw_http_state_t gw_http_load_body(gw_http_parser_t *p, const char *data, size_t n, bool end,
                                  gw_http_body_cb body_cb, void *arg) SL_WUR;

/* ASCII case-insensitive: name[0, n) equals lower[0, n) (no locale, unlike
 * strncasecmp). lower holds lower-case letters and bytes below 0x40 only
 * ('-', digits): a letter there has 0x40 set, so (lower & 0x40) >> 1 is
 * the 0x20 that name's byte may lack, exactly where lower has a letter, and
 * 8 bytes compare in one step. */
static inline bool gw_http_name_eq(const char *name, const char *lower, size_t n)
{
    const uint64_t b40 = 0x4040404040404040ull;
    uint64_t a, l;
    if (n >= 8) {
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            memcpy(&a, name + i, 8);
            memcpy(&l, lower + i, 8);
            if ((a | (l & b40) >> 1) != l)
                return false;
        }
        if (i == n)
            return true;
        memcpy(&a, name + n - 8, 8); /* the last 8, overlapping */
        memcpy(&l, lower + n - 8, 8);
        return (a | (l & b40) >> 1) == l;
    }
    if (n >= 4) { /* the first 4 and the last 4, overlapping */
        uint32_t a4, l4;
        memcpy(&a4, name, 4);
        memcpy(&l4, lower, 4);
        if ((a4 | (l4 & (uint32_t)b40) >> 1) != l4)
            return false;
        memcpy(&a4, name + n - 4, 4);
        memcpy(&l4, lower + n - 4, 4);
        return (a4 | (l4 & (uint32_t)b40) >> 1) == l4;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i], lc = (unsigned char)lower[i];
        if ((c | (lc & 0x40) >> 1) != lc)
            return false;
    }
    return true;
}

/* p[0, n) starts with lit, a lower-case literal as gw_http_name_eq takes,
 * ASCII case-insensitive. Not strncasecmp: besides the locale, glibc's
 * AVX2 version takes a slow path when either string is near the end of a
 * page, so its cost moved with the binary's layout (40 to 155 instructions
 * a call for the same content-type check). */
#define GW_HTTP_PREFIX_CI(p, n, lit)                                                               \
    ((n) >= sizeof(lit) - 1 && gw_http_name_eq((p), (lit), sizeof(lit) - 1))

/* The id of name[0, len): GW_HN_OTHER for a name not in the enum. */
gw_http_hn_t gw_http_hn(const char *name, size_t len);

/* The first header with this id (a name of gw_http_hn_t), or NULL: what
 * gw_http_header_find gives for the name, without the name's strlen and
 * classification. */
const gw_http_header_t *gw_http_header_get(const gw_http_msg_t *m, gw_http_hn_t id);

/* Case-insensitive header lookup; the first match or NULL. */
const gw_http_header_t *gw_http_header_find(const gw_http_msg_t *m, const char *name);

/* True for hop-by-hop headers a proxy must not forward (Connection,
 * Keep-Alive, Proxy-*, TE, Trailer, Transfer-Encoding, Upgrade) and for any
 * header named in the message's Connection header. */
bool gw_http_header_is_hop(const gw_http_msg_t *m, const char *name, size_t name_len);

/* Tests only: the head scan's vector paths (a whole head in one step,
 * whole lines in one step, 16-byte runs) on (the default) or off (the
 * byte loop alone), for test_http1_vector.c and the HTTP fuzz targets to
 * compare the two. Process-wide. */
void gw_http_vector_set(bool on);

/* Tests only: chunked bodies de-chunked by the framing scan alone (on, the
 * default) or, as before, by http-parser after it (off), for
 * test_http1_chunked.c to compare the two. Process-wide. */
void gw_http_chunk_direct_set(bool on);

/* Reason phrase for a status code ("Not Found"); "Unknown" when none. */
const char *gw_http_status_text(int status);

#endif
