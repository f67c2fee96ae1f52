/*
 * sl.h — the few things every sluice module shares.
 *
 * Return convention (all modules): 0 is success, -1 is an error. Where a
 * caller must tell "not yet" from "failed" a function returns a small enum
 * instead, documented at its declaration. Functions whose result must be
 * checked are marked SL_WUR.
 *
 * Ownership: a pointer parameter is borrowed for the duration of the call
 * unless the declaration says "takes ownership". A returned pointer is owned
 * by the caller when the function is a *_new / *_dup, borrowed otherwise.
 * Every *_free() accepts NULL.
 */
#ifndef SL_H
#define SL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SL_OK  0
#define SL_ERR (-1)

#define SL_WUR          __attribute__((warn_unused_result))
#define SL_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define SL_UNUSED       __attribute__((unused))
/* Rarely run (error replies, logging): GCC optimises it for size, puts it in
 * .text.unlikely away from the request path, and treats the branches that
 * lead to a call of it as unlikely (docs/gateway.md, "Build flags"). */
#define SL_COLD         __attribute__((cold))
#define SL_LIKELY(x)    __builtin_expect(!!(x), 1)
#define SL_UNLIKELY(x)  __builtin_expect(!!(x), 0)
#define SL_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define SL_MIN(a, b)    ((a) < (b) ? (a) : (b))
#define SL_MAX(a, b)    ((a) > (b) ? (a) : (b))

/* Free and NULL the caller's pointer (Tor's habit). */
#define SL_FREE(p)                                                                                 \
    do {                                                                                           \
        free(p);                                                                                   \
        (p) = NULL;                                                                                \
    } while (0)

/* Monotonic clock in milliseconds / nanoseconds, and wall clock in seconds. */
int64_t sl_now_ms(void);
int64_t sl_now_ns(void);
int64_t sl_wall_s(void);
int64_t sl_wall_ms(void);

/* Allocation that aborts on failure: for startup and config paths only.
 * Request paths use plain malloc and handle NULL. */
void *sl_xmalloc(size_t n);
void *sl_xcalloc(size_t n, size_t m);
char *sl_xstrdup(const char *s);

/* One zeroed object on a request path: malloc and memset, not calloc.
 * glibc 2.36's calloc never takes from the thread's tcache (it goes to
 * _int_malloc every time: ~230-410 instructions per call measured), while
 * malloc of a small block pops it from there. NULL when out of memory. */
static inline SL_WUR void *sl_zalloc(size_t n)
{
    void *p = malloc(n);
    if (p)
        memset(p, 0, n);
    return p;
}

/* The end of the ASCII run at s[i..n): the first byte >= 0x80, or n.
 * Eight bytes a step where there are eight. */
static inline size_t sl_ascii_end(const void *s, size_t i, size_t n)
{
    const unsigned char *u = s;
    uint64_t x;
    while (i + 8 <= n && (memcpy(&x, u + i, 8), !(x & 0x8080808080808080ull)))
        i += 8;
    while (i < n && u[i] < 0x80)
        i++;
    return i;
}

/* Whether s[0..n) is all ASCII: no byte >= 0x80 (every byte read, eight
 * a step, no branch per word: for short runs that are mostly ASCII). */
static inline bool sl_ascii_all(const void *s, size_t n)
{
    const unsigned char *u = s;
    uint64_t acc = 0, w;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, u + i, 8);
        acc |= w;
    }
    for (; i < n; i++)
        acc |= u[i];
    return (acc & 0x8080808080808080ull) == 0;
}

/* The two counts of UTF-8 text s[0..n) that a token estimate weighs:
 * ASCII bytes added to *ascii, other characters (lead bytes) to *other. */
static inline void sl_text_chars(const char *s, size_t n, int64_t *ascii, int64_t *other)
{
    const unsigned char *u = (const unsigned char *)s;
    int64_t a = 0, o = 0;
    for (size_t i = 0; i < n; i++) {
        if (u[i] < 0x80)
            a++;
        else if ((u[i] & 0xc0) != 0x80)
            o++;
    }
    *ascii += a;
    *other += o;
}

/* Constant-time comparison of two byte strings of possibly different length;
 * returns 1 when equal. Time depends only on the lengths. */
int sl_ct_equal(const void *a, size_t alen, const void *b, size_t blen);

/* Decimal of v into out (at least 21 bytes), NUL-terminated; returns the
 * length. For hot paths where snprintf's format pass shows. */
size_t sl_i64toa(int64_t v, char *out);

/* Lowercase hex of n bytes into out (2n+1 bytes, NUL-terminated). */
void sl_hex(const unsigned char *in, size_t n, char *out);

/* A growable byte buffer, always NUL-terminated once anything was added
 * (p stays NULL until then). Zero-initialise it; sl_buf_free releases it. */
typedef struct sl_buf {
    char *p;
    size_t len, cap;
} sl_buf_t;

/* Appends n bytes (doubling the capacity as needed); -1 when out of memory,
 * the buffer unchanged. */
int sl_buf_add(sl_buf_t *b, const void *s, size_t n) SL_WUR;
void sl_buf_free(sl_buf_t *b);

/* Calls fn(arg) when the calling thread exits (one pthread key's
 * destructor for all of them, in the order added): what a thread keeps in
 * _Thread_local storage (kept parser handles, shape caches) freed with it.
 * fn must not add. At most SL_THREAD_EXITS a thread; -1 when full (or no
 * key): the caller then keeps nothing it would leak. */
#define SL_THREAD_EXITS 16
int sl_thread_at_exit(void (*fn)(void *), void *arg) SL_WUR;

#endif
