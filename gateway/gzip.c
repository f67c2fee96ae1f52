/*
 * gzip.c — compressing a whole JSON answer for a mobile client that sent
 * Accept-Encoding: gzip. Only complete bodies (sluice's own answers and
 * relayed JSON gathered before their head goes out): SSE is never
 * compressed, since a compressor holds bytes back and the relay's point is
 * that each event leaves the moment it is complete.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <zlib.h>

#include "gateway/gw_gzip.h"

/* q of one list item's parameters (";q=0.5"): thousandths, 1000 when none. */
static int gw_gzip_q(const char *p, const char *end)
{
    while (p < end) {
        while (p < end && (*p == ';' || *p == ' ' || *p == '\t'))
            p++;
        if (end - p >= 2 && (p[0] == 'q' || p[0] == 'Q') && p[1] == '=') {
            p += 2;
            int q = 0, digits = 0;
            if (p < end && *p == '1')
                return 1000;
            if (p < end && *p == '0')
                p++;
            if (p < end && *p == '.')
                for (p++; p < end && *p >= '0' && *p <= '9' && digits < 3; p++, digits++)
                    q = q * 10 + (*p - '0');
            while (digits++ < 3)
                q *= 10;
            return q;
        }
        while (p < end && *p != ';')
            p++;
    }
    return 1000;
}

bool gw_gzip_accepted(const char *v, size_t len)
{
    const char *p = v, *end = v + len;
    int gzip_q = -1, star_q = -1;
    while (p < end) {
        while (p < end && (*p == ' ' || *p == '\t' || *p == ','))
            p++;
        const char *tok = p;
        while (p < end && *p != ',' && *p != ';' && *p != ' ' && *p != '\t')
            p++;
        size_t tl = (size_t)(p - tok);
        const char *params = p;
        while (p < end && *p != ',')
            p++;
        int q = gw_gzip_q(params, p);
        if ((tl == 4 && strncasecmp(tok, "gzip", 4) == 0) ||
            (tl == 6 && strncasecmp(tok, "x-gzip", 6) == 0))
            gzip_q = q;
        else if (tl == 1 && tok[0] == '*')
            star_q = q;
    }
    if (gzip_q >= 0)
        return gzip_q > 0;
    return star_q > 0;
}

unsigned char *gw_gzip(const void *in, size_t n, int level, size_t *out_len)
{
    z_stream z;
    memset(&z, 0, sizeof(z));
    /* The window no larger than the input (zlib's state for a 32 KiB window
     * is about 256 KiB to set up per answer; a 4 KiB answer needs an eighth
     * of it), and + 16: a gzip header and trailer, not zlib's. */
    int wbits = 9;
    while (wbits < 15 && ((size_t)1 << wbits) < n)
        wbits++;
    int mem = wbits < 15 ? 6 : 8;
    if (deflateInit2(&z, level, Z_DEFLATED, wbits + 16, mem, Z_DEFAULT_STRATEGY) != Z_OK)
        return NULL;
    size_t cap = deflateBound(&z, (uLong)n);
    unsigned char *out = malloc(cap);
    if (!out) {
        deflateEnd(&z);
        return NULL;
    }
    z.next_in = (Bytef *)(uintptr_t)in;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    int rc = deflate(&z, Z_FINISH);
    *out_len = cap - z.avail_out;
    deflateEnd(&z);
    if (rc != Z_STREAM_END) {
        free(out);
        return NULL;
    }
    return out;
}
