/*
 * respond.c — answers sluice makes itself: health, models, and every error,
 * always as OpenAI-style JSON {"error":{"message","type","code"}} so mobile
 * clients and the official SDKs surface them properly.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "gateway/gw_conn.h"
#include "gateway/gw_fallback.h"
#include "gateway/gw_gzip.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_req.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_types.h"
#include "gateway/gw_worker.h"
#include "gateway/http1.h"

/* "Date: Sun, 29 Nov 2026 17:23:41 GMT\r\n", formatted once per second per
 * thread. */
const char *gw_date_header(size_t *len)
{
    static _Thread_local time_t last;
    static _Thread_local char buf[48];
    static _Thread_local size_t n;
    time_t now = time(NULL);
    if (now != last) {
        struct tm tm;
        gmtime_r(&now, &tm);
        n = strftime(buf, sizeof(buf), "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
        last = now;
    }
    *len = n;
    return buf;
}

char *gw_error_json(const char *type, const char *code, const char *message, size_t *len)
{
    json_t *o =
        json_pack("{s:{s:s,s:s,s:s}}", "error", "message", message, "type", type, "code", code);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s && len)
        *len = strlen(s);
    return s;
}

bool gw_respond_gzip_ok(gw_req_t *r, size_t len)
{
    if (!r->rt || !r->rt->conf->gzip.enabled || len < (size_t)r->rt->conf->gzip.min_bytes)
        return false;
    const gw_http_msg_t *m = gw_http_msg(r->c->parser);
    const gw_http_header_t *ae = m ? gw_http_header_get(m, GW_HN_ACCEPT_ENCODING) : NULL;
    return ae && gw_gzip_accepted(ae->value, ae->value_len);
}

void gw_respond_json(gw_req_t *r, int status, const char *body, size_t len,
                     const char *extra_headers)
{
    gw_respond_body(r, status, "application/json", body, len, extra_headers);
}

void gw_respond_body(gw_req_t *r, int status, const char *ctype, const char *body, size_t len,
                     const char *extra_headers)
{
    gw_conn_t *c = r->c;
    const gw_http_msg_t *m = gw_http_msg(c->parser);
    bool head = m && m->method && strcmp(m->method, "HEAD") == 0;
    /* A whole JSON answer to a client that takes gzip (never SSE). */
    unsigned char *gz = NULL;
    size_t gzlen = 0;
    if (strcmp(ctype, "application/json") == 0 && gw_respond_gzip_ok(r, len))
        gz = gw_gzip(body, len, (int)r->rt->conf->gzip.level, &gzlen);
    char stack[1024];
    gw_sb_t b;
    gw_sb_init(&b, stack, sizeof(stack));
    gw_out_head_begin(r, status, &b);
    gw_sb_lit(&b, "Content-Type: ");
    gw_sb_str(&b, ctype);
    gw_sb_lit(&b, "\r\nX-Request-Id: ");
    gw_sb_str(&b, r->id);
    gw_sb_lit(&b, "\r\n");
    if (gz)
        gw_sb_lit(&b, "Content-Encoding: gzip\r\nVary: Accept-Encoding\r\n");
    if (extra_headers)
        gw_sb_str(&b, extra_headers);
    gw_out_head_end(r, &b, (int64_t)(gz ? gzlen : len));
    if (!head)
        gw_out_data(r, gz ? (const void *)gz : body, gz ? gzlen : len);
    free(gz);
    if (r->capture) /* past capture_max: the store sees it is too large to keep */
        evbuffer_add(r->capture, body, SL_MIN(len, r->capture_max + 1));
    r->ctype = strcmp(ctype, "text/event-stream") == 0 ? "text/event-stream" : "application/json";
    r->status = status;
    gw_conn_req_done(c);
}

/* The same bytes gw_error_json() makes for it, fixed, so that answering an
 * allocation failure needs no allocation. */
static const char gw_oom_body[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"server_error\",\"code\":\"internal_error\"}}";

void gw_respond_oom(gw_req_t *r)
{
    if (!r->error_kind)
        r->error_kind = "internal_error";
    gw_respond_json(r, 500, gw_oom_body, sizeof(gw_oom_body) - 1, NULL);
}

void gw_respond_error(gw_req_t *r, int status, const char *type, const char *code,
                      const char *message)
{
    gw_respond_error_h(r, status, type, code, message, NULL);
}

void gw_respond_error_h(gw_req_t *r, int status, const char *type, const char *code,
                        const char *message, const char *extra_headers)
{
    size_t len = 0;
    char *body = gw_error_json(type, code, message, &len);
    if (!body) {
        /* Out of memory while answering: the fixed answer, and close, since
         * the next request on this connection would likely fail the same way. */
        r->c->close_after = true;
        gw_respond_oom(r);
        return;
    }
    if (!r->error_kind)
        r->error_kind = code;
    char hdrs[512];
    if (status >= 502 && status <= 504 && r->model) {
        /* The chain gave up on a proxied request: tell the SDK whether (and
         * when) its own retry is worth it, so it does not retry into an
         * open breaker or repeat the retries sluice just made. */
        char hint[160];
        gw_fb_retry_headers(r, hint, sizeof(hint));
        snprintf(hdrs, sizeof(hdrs), "%s%s", extra_headers ? extra_headers : "", hint);
        extra_headers = hdrs;
    }
    gw_respond_json(r, status, body, len, extra_headers);
    free(body);
}
