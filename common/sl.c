/*
 * sl.c — clocks, checked allocation and small byte helpers shared by every
 * module (see sl.h for the conventions).
 */
#include "common/sl.h"

#include <openssl/crypto.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int64_t sl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t sl_now_ms(void)
{
    return sl_now_ns() / 1000000;
}

int64_t sl_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t sl_wall_s(void)
{
    return (int64_t)time(NULL);
}

static void sl_oom(size_t n)
{
    fprintf(stderr, "sluice: out of memory allocating %zu bytes\n", n);
    abort();
}

void *sl_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        sl_oom(n);
    return p;
}

void *sl_xcalloc(size_t n, size_t m)
{
    void *p = calloc(n ? n : 1, m ? m : 1);
    if (!p)
        sl_oom(n * m);
    return p;
}

char *sl_xstrdup(const char *s)
{
    char *p = strdup(s);
    if (!p)
        sl_oom(strlen(s) + 1);
    return p;
}

int sl_ct_equal(const void *a, size_t alen, const void *b, size_t blen)
{
    /* Compare against a, whatever blen is, so time depends on alen only;
     * a length mismatch still fails. */
    if (alen != blen) {
        (void)CRYPTO_memcmp(a, a, alen);
        return 0;
    }
    return CRYPTO_memcmp(a, b, alen) == 0;
}

size_t sl_i64toa(int64_t v, char *out)
{
    /* the length first (compares, no division), then two digits a step
     * from a table straight into out, backwards: a header's seven-digit
     * limit took seven divide-by-ten steps and a reversal */
    static const char pairs[201] = "00010203040506070809101112131415161718192021222324"
                                   "25262728293031323334353637383940414243444546474849"
                                   "50515253545556575859606162636465666768697071727374"
                                   "75767778798081828384858687888990919293949596979899";
    static const uint64_t pow10[20] = {1ull,
                                       10ull,
                                       100ull,
                                       1000ull,
                                       10000ull,
                                       100000ull,
                                       1000000ull,
                                       10000000ull,
                                       100000000ull,
                                       1000000000ull,
                                       10000000000ull,
                                       100000000000ull,
                                       1000000000000ull,
                                       10000000000000ull,
                                       100000000000000ull,
                                       1000000000000000ull,
                                       10000000000000000ull,
                                       100000000000000000ull,
                                       1000000000000000000ull,
                                       10000000000000000000ull};
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    /* digits from the bit length: 1233 / 4096 ~ log10(2), so t is the
     * digit count minus one or exact, and one compare tells (a loop of
     * compares cost ~4 instructions a digit) */
    unsigned t = (unsigned)(64 - __builtin_clzll(u | 1)) * 1233u >> 12;
    size_t len = (size_t)t + ((u | 1) >= pow10[t]) + (v < 0);
    char *p = out + len;
    *p = '\0';
    while (u >= 100) {
        unsigned k = (unsigned)(u % 100) * 2;
        u /= 100;
        *--p = pairs[k + 1];
        *--p = pairs[k];
    }
    if (u >= 10) {
        *--p = pairs[u * 2 + 1];
        *--p = pairs[u * 2];
    } else {
        *--p = (char)('0' + u);
    }
    if (v < 0)
        *--p = '-';
    return len;
}

void sl_hex(const unsigned char *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

int sl_buf_add(sl_buf_t *b, const void *s, size_t n)
{
    if (n == 0)
        return 0;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

void sl_buf_free(sl_buf_t *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* ---- thread exit -------------------------------------------------------------- */

typedef struct sl_texits {
    struct {
        void (*fn)(void *);
        void *arg;
    } e[SL_THREAD_EXITS];
    size_t n;
} sl_texits_t;

static _Thread_local sl_texits_t sl_texits;
static pthread_key_t sl_texit_key;
static pthread_once_t sl_texit_once = PTHREAD_ONCE_INIT;
static bool sl_texit_key_ok;

static void sl_texit_run(void *p)
{
    sl_texits_t *l = p;
    for (size_t i = 0; i < l->n; i++)
        l->e[i].fn(l->e[i].arg);
    l->n = 0;
}

static void sl_texit_init(void)
{
    sl_texit_key_ok = pthread_key_create(&sl_texit_key, sl_texit_run) == 0;
}

int sl_thread_at_exit(void (*fn)(void *), void *arg)
{
    sl_texits_t *l = &sl_texits;
    pthread_once(&sl_texit_once, sl_texit_init);
    if (!sl_texit_key_ok || l->n == SL_THREAD_EXITS)
        return -1;
    if (l->n == 0 && pthread_setspecific(sl_texit_key, l) != 0)
        return -1;
    l->e[l->n].fn = fn;
    l->e[l->n].arg = arg;
    l->n++;
    return 0;
}
