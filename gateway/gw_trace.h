/*
 * gw_trace.h — W3C Trace Context (trace.c): the strict parse of a client's
 * `traceparent` and the one sluice sends upstream, so a request can be
 * followed from the app through sluice to the model server by its trace id.
 */
#ifndef GW_TRACE_H
#define GW_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define GW_TRACEPARENT_LEN 55 /* "00-" 32 hex "-" 16 hex "-" 2 hex */

/* Parses a traceparent value by the W3C rules: version two lowercase hex
 * digits other than "ff" (version 00: exactly 55 characters; a later
 * version may append "-..." fields, which are ignored), a trace id of 32
 * lowercase hex digits not all zero, a parent id of 16 not all zero, two
 * hex digits of flags. On success fills trace_id (33 bytes, NUL-ended) and
 * flags (the byte) and returns true; anything else is false (a new trace
 * is started then, as the spec says). */
bool gw_trace_parse(const char *v, size_t n, char trace_id[33], uint8_t *flags);

/* Writes "00-<trace_id>-<span as 16 hex>-<flags as 2 hex>" into out (at
 * least GW_TRACEPARENT_LEN + 1 bytes). */
void gw_trace_format(char *out, size_t cap, const char *trace_id, uint64_t span, uint8_t flags);

/* n random words (a per-thread splitmix64 seeded from getrandom(); ids
 * need not be secret, only unique). */
void gw_trace_random(uint64_t *out, size_t n);

/* A trace id from two random words (never all zero). */
void gw_trace_new_id(char trace_id[33], uint64_t hi, uint64_t lo);

/* The low 32 bits of v as 8 lowercase hex digits: the nibbles spread one a
 * byte (most significant in the lowest byte after the swap), then each
 * byte + '0', + 39 more where the nibble is 10 or above (nibble + 6 carries
 * into bit 4). Per request this wrote 48 digits a table load each. */
static inline void gw_trace_put_hex8(char *out, uint64_t v)
{
    const uint64_t ones = 0x0101010101010101ull;
    uint64_t x = v & 0xFFFFFFFFull;
    x = (x | x << 16) & 0x0000FFFF0000FFFFull;
    x = (x | x << 8) & 0x00FF00FF00FF00FFull;
    x = (x | x << 4) & 0x0F0F0F0F0F0F0F0Full;
    x = __builtin_bswap64(x);
    x += 0x30 * ones + (((x + 6 * ones) >> 4) & ones) * 39;
    memcpy(out, &x, 8);
}

/* v as 16 lowercase hex digits at out (no NUL): the trace and span ids
 * here and a request id (conn.c); inline, as it was in trace.c alone (out
 * of line it cost ~50 instructions a request more). */
static inline void gw_trace_put_hex16(char *out, uint64_t v)
{
    gw_trace_put_hex8(out, v >> 32);
    gw_trace_put_hex8(out + 8, v);
}

#endif
