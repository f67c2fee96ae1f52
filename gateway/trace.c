/*
 * trace.c — W3C Trace Context's traceparent: parsed strictly (a malformed
 * one is replaced, never half-trusted), and written for the upstream with
 * the client's trace id and sluice's own span id, so the model server's
 * spans join the app's trace.
 */
#include <stdio.h>
#include <string.h>

#include <openssl/rand.h>

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

void gw_trace_format(char *out, size_t cap, const char *trace_id, uint64_t span, uint8_t flags)
{
    if (span == 0)
        span = 1; /* an all-zero parent id is invalid */
    snprintf(out, cap, "00-%.32s-%016llx-%02x", trace_id, (unsigned long long)span,
             (unsigned)flags);
}

void gw_trace_new_id(char trace_id[33], uint64_t hi, uint64_t lo)
{
    if (hi == 0 && lo == 0)
        lo = 1;
    snprintf(trace_id, 33, "%016llx%016llx", (unsigned long long)hi, (unsigned long long)lo);
}

void gw_trace_random(uint64_t *out, size_t n)
{
    if (RAND_bytes((unsigned char *)out, (int)(n * sizeof(*out))) == 1)
        return;
    static _Thread_local uint64_t x;
    for (size_t i = 0; i < n; i++) { /* splitmix64 over the clock */
        x += 0x9e3779b97f4a7c15ull ^ (uint64_t)sl_now_ns();
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        out[i] = z ^ (z >> 31);
    }
}
