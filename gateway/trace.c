/*
 * trace.c — W3C Trace Context's traceparent: parsed strictly (a malformed
 * one is replaced, never half-trusted), and written for the upstream with
 * the client's trace id and sluice's own span id, so the model server's
 * spans join the app's trace.
 */
#include <stdint.h>
#include <string.h>
#include <sys/random.h>
#include <sys/types.h>

#include "common/sl.h"

#include "gateway/gw_trace.h"

static bool gw_trace_hex(const char *p, size_t n, bool *all_zero)
{
    bool zero = true;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
        if (c != '0')
            zero = false;
    }
    if (all_zero)
        *all_zero = zero;
    return true;
}

static unsigned gw_trace_nibble(char c)
{
    return c <= '9' ? (unsigned)(c - '0') : (unsigned)(c - 'a' + 10);
}

bool gw_trace_parse(const char *v, size_t n, char trace_id[33], uint8_t *flags)
{
    bool zero;
    if (!v || n < GW_TRACEPARENT_LEN)
        return false;
    if (!gw_trace_hex(v, 2, NULL) || (v[0] == 'f' && v[1] == 'f'))
        return false;
    bool v00 = v[0] == '0' && v[1] == '0';
    if (v00 ? n != GW_TRACEPARENT_LEN : (n > GW_TRACEPARENT_LEN && v[GW_TRACEPARENT_LEN] != '-'))
        return false;
    if (v[2] != '-' || v[35] != '-' || v[52] != '-')
        return false;
    if (!gw_trace_hex(v + 3, 32, &zero) || zero)
        return false;
    if (!gw_trace_hex(v + 36, 16, &zero) || zero)
        return false;
    if (!gw_trace_hex(v + 53, 2, NULL))
        return false;
    memcpy(trace_id, v + 3, 32);
    trace_id[32] = '\0';
    *flags = (uint8_t)(gw_trace_nibble(v[53]) << 4 | gw_trace_nibble(v[54]));
    return true;
}

/* v as 2*bytes lowercase hex digits, most significant first. */
static void gw_trace_put_hex(char *out, uint64_t v, size_t digits)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t i = digits; i-- > 0; v >>= 4)
        out[i] = hex[v & 15];
}

/* Written by hand, not with snprintf: this runs for every request before
 * its upstream request goes out (the first event waits on it). */
void gw_trace_format(char *out, size_t cap, const char *trace_id, uint64_t span, uint8_t flags)
{
    if (cap < GW_TRACEPARENT_LEN + 1) {
        if (cap)
            out[0] = '\0';
        return;
    }
    if (span == 0)
        span = 1; /* an all-zero parent id is invalid */
    size_t tl = strnlen(trace_id, 32);
    char *w = out;
    memcpy(w, "00-", 3);
    w += 3;
    memcpy(w, trace_id, tl);
    w += tl;
    *w++ = '-';
    gw_trace_put_hex16(w, span);
    w += 16;
    *w++ = '-';
    gw_trace_put_hex(w, flags, 2);
    w += 2;
    *w = '\0';
}

void gw_trace_new_id(char trace_id[33], uint64_t hi, uint64_t lo)
{
    if (hi == 0 && lo == 0)
        lo = 1;
    gw_trace_put_hex16(trace_id, hi);
    gw_trace_put_hex16(trace_id + 16, lo);
    trace_id[32] = '\0';
}

/* splitmix64 per thread, seeded once from the kernel. OpenSSL's RAND_bytes
 * cost 2-6 µs a call here (a DRBG round, parameter lookups, a fork check
 * with getpid) on every request's way to the upstream; trace ids must be
 * unique, not secret. */
void gw_trace_random(uint64_t *out, size_t n)
{
    static _Thread_local uint64_t x;
    static _Thread_local bool seeded;
    if (!seeded) {
        if (getrandom(&x, sizeof(x), 0) != (ssize_t)sizeof(x))
            x = (uint64_t)sl_now_ns() ^ (uint64_t)(uintptr_t)&x;
        seeded = true;
    }
    for (size_t i = 0; i < n; i++) {
        x += 0x9e3779b97f4a7c15ull;
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        out[i] = z ^ (z >> 31);
    }
}
