/*
 * sb.h — a small string builder for response and request heads: bytes are
 * gathered in a caller's stack buffer (growing to the heap past it) and
 * handed to an evbuffer in one call. evbuffer_add_printf and one
 * evbuffer_add per piece each cost a format pass or a buffer lock; a head
 * is a dozen pieces.
 */
#ifndef GW_SB_H
#define GW_SB_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

typedef struct gw_sb {
    char *p;
    size_t n, cap;
    char *heap; /* p once it outgrew the stack buffer */
    bool oom;
} gw_sb_t;

static inline void gw_sb_init(gw_sb_t *b, char *stack, size_t cap)
{
    b->p = stack;
    b->n = 0;
    b->cap = cap;
    b->heap = NULL;
    b->oom = false;
}

static inline void gw_sb_add(gw_sb_t *b, const void *s, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = (b->n + n) * 2;
        char *h = realloc(b->heap, cap);
        if (!h) {
            b->oom = true;
            return;
        }
        if (!b->heap)
            memcpy(h, b->p, b->n);
        b->heap = b->p = h;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static inline void gw_sb_str(gw_sb_t *b, const char *s)
{
    gw_sb_add(b, s, strlen(s));
}

#define gw_sb_lit(b, lit) gw_sb_add((b), (lit), sizeof(lit) - 1)

static inline void gw_sb_u64(gw_sb_t *b, uint64_t v)
{
    char d[24];
    size_t i = sizeof(d);
    do {
        d[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    gw_sb_add(b, d + i, sizeof(d) - i);
}

/* v in lowercase hex written backwards, ending just before end (at most
 * 16 digits); returns where the digits start. */
static inline char *gw_hex_back(char *end, uint64_t v)
{
    static const char digits[] = "0123456789abcdef";
    do {
        *--end = digits[v & 15];
        v >>= 4;
    } while (v);
    return end;
}

static inline void gw_sb_hex(gw_sb_t *b, uint64_t v)
{
    char d[16];
    char *p = gw_hex_back(d + sizeof(d), v);
    gw_sb_add(b, p, (size_t)(d + sizeof(d) - p));
}

/* "Name: value\r\n" */
static inline void gw_sb_header(gw_sb_t *b, const char *name, size_t nl, const char *value,
                                size_t vl)
{
    gw_sb_add(b, name, nl);
    gw_sb_add(b, ": ", 2);
    gw_sb_add(b, value, vl);
    gw_sb_add(b, "\r\n", 2);
}

/* Empties b and frees what it took from the heap (b is done: init it
 * again before another add). */
static inline void gw_sb_reset(gw_sb_t *b)
{
    free(b->heap);
    b->heap = NULL;
    b->n = 0;
}

/* Hands the bytes to out and resets b; returns how many (0 on OOM). */
static inline size_t gw_sb_flush(gw_sb_t *b, struct evbuffer *out)
{
    size_t n = b->oom ? 0 : b->n;
    if (n)
        evbuffer_add(out, b->p, n);
    gw_sb_reset(b);
    return n;
}

#endif
