/*
 * gw_gzip.h — gzip of whole (non-streamed) JSON answers (gzip.c) for
 * clients whose Accept-Encoding allows it; zlib does the compression.
 */
#ifndef GW_GZIP_H
#define GW_GZIP_H

#include <stdbool.h>
#include <stddef.h>

/* Does this Accept-Encoding value (RFC 9110 12.5.3) accept gzip: "gzip"
 * or "x-gzip" or "*" with a q above 0, and gzip not refused by q=0? */
bool gw_gzip_accepted(const char *value, size_t len);
/* The gzip member of in[0..n) at level 1..9: malloc'd (caller frees), its
 * length in *out_len; NULL on failure (send the bytes as they are). */
unsigned char *gw_gzip(const void *in, size_t n, int level, size_t *out_len);

#endif
