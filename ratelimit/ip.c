/*
 * ip.c — who the client is: trusted proxy CIDRs and the X-Forwarded-For
 * walk. Only a trusted peer's X-Forwarded-For is read, from the right (the
 * entries a trusted proxy appended), stopping at the first address that is
 * not a trusted proxy: anything left of it was written by the client and
 * proves nothing.
 */
#include "ratelimit/rl_internal.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rl_cidr {
    int family;
    unsigned char addr[16];
    int bits;
} rl_cidr_t;

struct rl_proxies {
    size_t n;
    rl_cidr_t cidrs[];
};

typedef struct rl_addr {
    int family;
    unsigned char a[16];
} rl_addr_t;

/* Parses an address (v4, v6, v4-mapped v6 -> v4); whitespace around it
 * and an IPv6 in brackets are accepted. */
static int rl_addr_parse(const char *s, size_t n, rl_addr_t *out)
{
    while (n && (*s == ' ' || *s == '\t')) {
        s++;
        n--;
    }
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
        s++;
        n -= 2;
    }
    char buf[64];
    if (n == 0 || n >= sizeof(buf))
        return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    if (inet_pton(AF_INET, buf, out->a) == 1) {
        out->family = AF_INET;
        return 0;
    }
    if (inet_pton(AF_INET6, buf, out->a) == 1) {
        static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(out->a, mapped, 12) == 0) {
            memmove(out->a, out->a + 12, 4);
            out->family = AF_INET;
        } else {
            out->family = AF_INET6;
        }
        return 0;
    }
    return -1;
}

static bool rl_cidr_match(const rl_cidr_t *c, const rl_addr_t *a)
{
    if (c->family != a->family)
        return false;
    int full = c->bits / 8, rest = c->bits % 8;
    if (memcmp(c->addr, a->a, (size_t)full) != 0)
        return false;
    if (rest == 0)
        return true;
    unsigned char mask = (unsigned char)(0xff << (8 - rest));
    return (c->addr[full] & mask) == (a->a[full] & mask);
}

rl_proxies_t *rl_proxies_new(const char *const *cidrs, size_t n, char *err, size_t errlen)
{
    rl_proxies_t *p = calloc(1, sizeof(*p) + n * sizeof(rl_cidr_t));
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        const char *s = cidrs[i];
        const char *slash = strchr(s, '/');
        rl_addr_t a;
        rl_cidr_t *c = &p->cidrs[i];
        if (rl_addr_parse(s, slash ? (size_t)(slash - s) : strlen(s), &a) != 0)
            goto bad;
        int max = a.family == AF_INET ? 32 : 128;
        c->bits = max;
        if (slash) {
            char *end;
            long b = strtol(slash + 1, &end, 10);
            if (end == slash + 1 || *end || b < 0 || b > max)
                goto bad;
            c->bits = (int)b;
        }
        c->family = a.family;
        memcpy(c->addr, a.a, sizeof(a.a));
        continue;
    bad:
        snprintf(err, errlen, "trusted_proxies: bad address or CIDR \"%.60s\"", s);
        free(p);
        return NULL;
    }
    p->n = n;
    return p;
}

void rl_proxies_free(rl_proxies_t *p)
{
    free(p);
}

static bool rl_trusted(const rl_proxies_t *p, const rl_addr_t *a)
{
    for (size_t i = 0; p && i < p->n; i++)
        if (rl_cidr_match(&p->cidrs[i], a))
            return true;
    return false;
}

bool rl_proxies_contains(const rl_proxies_t *p, const char *ip)
{
    rl_addr_t a;
    return ip && rl_addr_parse(ip, strlen(ip), &a) == 0 && rl_trusted(p, &a);
}

static int rl_addr_format(const rl_addr_t *a, char *out, size_t outlen)
{
    if (a->family == AF_INET && outlen >= INET_ADDRSTRLEN) {
        /* inet_ntop's "%u.%u.%u.%u" without its sprintf (every request) */
        char *p = out;
        for (int i = 0; i < 4; i++) {
            unsigned v = a->a[i];
            if (v >= 100)
                *p++ = (char)('0' + v / 100);
            if (v >= 10)
                *p++ = (char)('0' + v / 10 % 10);
            *p++ = (char)('0' + v % 10);
            *p++ = i < 3 ? '.' : '\0';
        }
        return 0;
    }
    return inet_ntop(a->family, a->a, out, (socklen_t)outlen) ? 0 : -1;
}

int rl_client_ip(const rl_proxies_t *p, const char *peer, const char *xff, char *out, size_t outlen)
{
    rl_addr_t cur;
    if (!peer || rl_addr_parse(peer, strlen(peer), &cur) != 0)
        return -1;
    if (!rl_trusted(p, &cur) || !xff)
        return rl_addr_format(&cur, out, outlen);
    /* Walk the list right to left; `cur` is the nearest hop so far. */
    const char *end = xff + strlen(xff);
    while (end > xff) {
        const char *start = end;
        while (start > xff && start[-1] != ',')
            start--;
        rl_addr_t a;
        size_t n = (size_t)(end - start);
        bool blank = strspn(start, " \t") >= n;
        if (!blank) {
            if (rl_addr_parse(start, n, &a) != 0)
                break; /* garbage: the last trusted hop is all we know */
            cur = a;
            if (!rl_trusted(p, &a))
                break;
        }
        end = start > xff ? start - 1 : xff;
    }
    return rl_addr_format(&cur, out, outlen);
}
