/*
 * dot.c — int8 dot products for the semantic index, the cache's own (the
 * model engine's kernels are internal to model/ and shaped for its quant
 * blocks). Chosen once at run time: AVX-512 VNNI (vpdpbusd), AVX2
 * (sign-extend to 16 bits, vpmaddwd), or the scalar reference. Each SIMD
 * function carries a target attribute, so the file builds with the plain
 * CFLAGS and runs on any x86-64.
 *
 * vpdpbusd multiplies unsigned by signed bytes: a·b = |a|·(b·sign(a)).
 * Quantised values stay in -127..127, so neither |a| nor the negation of b
 * can overflow a byte.
 */
#include <pthread.h>
#include <string.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/cache_internal.h"

int32_t cache_dot_i8_ref(const int8_t *a, const int8_t *b, size_t n)
{
    int32_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += (int32_t)a[i] * (int32_t)b[i];
    return s;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define CACHE_AVX2   __attribute__((target("avx2")))
#define CACHE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2")))

CACHE_AVX2 int32_t cache_dot_i8_avx2(const int8_t *a, const int8_t *b, size_t n)
{
    __m256i acc = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i va = _mm256_loadu_si256((const __m256i *)(a + i));
        __m256i vb = _mm256_loadu_si256((const __m256i *)(b + i));
        /* |a| as unsigned times b with a's sign: pmaddubsw pairs, then
         * pmaddwd with ones widens to 32 bits (127*127*2 fits 16 bits). */
        __m256i ua = _mm256_sign_epi8(va, va);
        __m256i sb = _mm256_sign_epi8(vb, va);
        __m256i p16 = _mm256_maddubs_epi16(ua, sb);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
    }
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    int32_t r = _mm_cvtsi128_si32(s);
    return r + cache_dot_i8_ref(a + i, b + i, n - i);
}

CACHE_AVX512 int32_t cache_dot_i8_avx512(const int8_t *a, const int8_t *b, size_t n)
{
    __m512i acc = _mm512_setzero_si512();
    const __m512i zero = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i va = _mm512_loadu_si512((const void *)(a + i));
        __m512i vb = _mm512_loadu_si512((const void *)(b + i));
        __mmask64 neg = _mm512_movepi8_mask(va);
        __m512i ua = _mm512_abs_epi8(va);
        __m512i sb = _mm512_mask_sub_epi8(vb, neg, zero, vb);
        acc = _mm512_dpbusd_epi32(acc, ua, sb);
    }
    if (i + 32 <= n) {
        __m256i va = _mm256_loadu_si256((const __m256i *)(a + i));
        __m256i vb = _mm256_loadu_si256((const __m256i *)(b + i));
        __m256i ua = _mm256_sign_epi8(va, va);
        __m256i sb = _mm256_sign_epi8(vb, va);
        __m256i a32 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ua, sb);
        acc = _mm512_add_epi32(acc, _mm512_zextsi256_si512(a32));
        i += 32;
    }
    return _mm512_reduce_add_epi32(acc) + cache_dot_i8_ref(a + i, b + i, n - i);
}

/* Many rows against one query: the query's |q| and sign mask are made
 * once, each row costs one masked negate and one vpdpbusd per 64 bytes. */
/* 64-byte rows (the sketches), 16 at a time: one vpdpbusd per row, then
 * the 16 accumulators are summed lane-wise by a transpose tree (unpack
 * 32, unpack 64, two 128-bit shuffles) instead of 16 horizontal sums. */
CACHE_AVX512 static void cache_rows64_avx512(const int8_t *q, const int8_t *rows, size_t n,
                                             int32_t *out)
{
    const __m512i zero = _mm512_setzero_si512();
    __m512i vq = _mm512_loadu_si512((const void *)q);
    __mmask64 neg = _mm512_movepi8_mask(vq);
    __m512i ua = _mm512_abs_epi8(vq);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i a[16];
        for (int r = 0; r < 16; r++) {
            __m512i vb = _mm512_loadu_si512((const void *)(rows + (i + (size_t)r) * 64));
            a[r] = _mm512_dpbusd_epi32(zero, ua, _mm512_mask_sub_epi8(vb, neg, zero, vb));
        }
        __m512i b[8], c[4];
        for (int k = 0; k < 8; k++)
            b[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2 * k], a[2 * k + 1]),
                                    _mm512_unpackhi_epi32(a[2 * k], a[2 * k + 1]));
        for (int j = 0; j < 4; j++)
            c[j] = _mm512_add_epi32(_mm512_unpacklo_epi64(b[2 * j], b[2 * j + 1]),
                                    _mm512_unpackhi_epi64(b[2 * j], b[2 * j + 1]));
        __m512i e0 = _mm512_add_epi32(_mm512_shuffle_i32x4(c[0], c[1], 0x88),
                                      _mm512_shuffle_i32x4(c[0], c[1], 0xdd));
        __m512i e1 = _mm512_add_epi32(_mm512_shuffle_i32x4(c[2], c[3], 0x88),
                                      _mm512_shuffle_i32x4(c[2], c[3], 0xdd));
        __m512i f = _mm512_add_epi32(_mm512_shuffle_i32x4(e0, e1, 0x88),
                                     _mm512_shuffle_i32x4(e0, e1, 0xdd));
        _mm512_storeu_si512((void *)(out + i), f);
    }
    for (; i < n; i++) {
        __m512i vb = _mm512_loadu_si512((const void *)(rows + i * 64));
        out[i] = _mm512_reduce_add_epi32(
            _mm512_dpbusd_epi32(zero, ua, _mm512_mask_sub_epi8(vb, neg, zero, vb)));
    }
}

CACHE_AVX512 static void cache_rows_avx512(const int8_t *q, const int8_t *rows, size_t dim,
                                           size_t n, int32_t *out)
{
    size_t nb = dim / 64;
    __m512i ua[CACHE_SEM_MAX_DIM / 64];
    __mmask64 neg[CACHE_SEM_MAX_DIM / 64];
    const __m512i zero = _mm512_setzero_si512();
    for (size_t b = 0; b < nb; b++) {
        __m512i v = _mm512_loadu_si512((const void *)(q + b * 64));
        neg[b] = _mm512_movepi8_mask(v);
        ua[b] = _mm512_abs_epi8(v);
    }
    for (size_t i = 0; i < n; i++) {
        const int8_t *r = rows + i * dim;
        __m512i acc = zero;
        for (size_t b = 0; b < nb; b++) {
            __m512i vb = _mm512_loadu_si512((const void *)(r + b * 64));
            acc = _mm512_dpbusd_epi32(acc, ua[b], _mm512_mask_sub_epi8(vb, neg[b], zero, vb));
        }
        out[i] = _mm512_reduce_add_epi32(acc);
    }
}
#else
int32_t cache_dot_i8_avx2(const int8_t *a, const int8_t *b, size_t n)
{
    return cache_dot_i8_ref(a, b, n);
}
int32_t cache_dot_i8_avx512(const int8_t *a, const int8_t *b, size_t n)
{
    return cache_dot_i8_ref(a, b, n);
}
#endif

static cache_dot_fn cache_dot_impl = cache_dot_i8_ref;
static const char *cache_dot_name = "scalar";
static pthread_once_t cache_dot_once = PTHREAD_ONCE_INIT;

static void cache_dot_pick(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) {
        cache_dot_impl = cache_dot_i8_avx512;
        cache_dot_name = "avx512vnni";
    } else if (__builtin_cpu_supports("avx2")) {
        cache_dot_impl = cache_dot_i8_avx2;
        cache_dot_name = "avx2";
    }
#endif
}

int32_t cache_dot_i8(const int8_t *a, const int8_t *b, size_t n)
{
    pthread_once(&cache_dot_once, cache_dot_pick);
    return cache_dot_impl(a, b, n);
}

const char *cache_dot_kernel(void)
{
    pthread_once(&cache_dot_once, cache_dot_pick);
    return cache_dot_name;
}

cache_dot_fn cache_dot_get(void)
{
    pthread_once(&cache_dot_once, cache_dot_pick);
    return cache_dot_impl;
}

void cache_dot_i8_rows(const int8_t *q, const int8_t *rows, size_t dim, size_t n, int32_t *out)
{
    pthread_once(&cache_dot_once, cache_dot_pick);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (cache_dot_impl == cache_dot_i8_avx512 && dim == 64) {
        cache_rows64_avx512(q, rows, n, out);
        return;
    }
    if (cache_dot_impl == cache_dot_i8_avx512 && dim % 64 == 0) {
        cache_rows_avx512(q, rows, dim, n, out);
        return;
    }
#endif
    cache_dot_fn dot = cache_dot_impl;
    for (size_t i = 0; i < n; i++)
        out[i] = dot(q, rows + i * dim, dim);
}

int cache_dot_force(const char *name)
{
    pthread_once(&cache_dot_once, cache_dot_pick);
    /* the name kept is our literal, never the caller's buffer */
    if (strcmp(name, "scalar") == 0) {
        cache_dot_impl = cache_dot_i8_ref;
        cache_dot_name = "scalar";
    } else if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2")) {
        cache_dot_impl = cache_dot_i8_avx2;
        cache_dot_name = "avx2";
    } else if (strcmp(name, "avx512vnni") == 0 && __builtin_cpu_supports("avx512vnni") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
        cache_dot_impl = cache_dot_i8_avx512;
        cache_dot_name = "avx512vnni";
    } else {
        return -1;
    }
    return 0;
}
