/*
 * kernels_avx512.c — AVX-512 (F, BW, VL, VNNI) row kernels, chosen at run
 * time like the AVX2 ones. The integer kernels take two 32-element blocks
 * per 512-bit vpdpbusd: lanes 0-7 hold the first block's partial sums,
 * lanes 8-15 the second's, and a two-valued scale vector weights them.
 * AVX-512 has no vpsignb, so x*sign(w) is a masked negate on w's sign bits.
 * Types without a kernel here keep the AVX2 (or scalar) entry.
 */
#include "model/quant_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>
#include <string.h>

#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

AVX512_TARGET static inline float fp16(const uint8_t *p)
{
    return _cvtsh_ss(mdl_rd16(p));
}

/* |w| . (x * sign(w)) summed in groups of 4 bytes: 16 int32 lanes */
AVX512_TARGET static inline __m512 dot_i8_64(__m512i w, __m512i x)
{
    __mmask64 neg = _mm512_movepi8_mask(w);
    __m512i sx = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
    __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), sx);
    return _mm512_cvtepi32_ps(p);
}

AVX512_TARGET static inline __m512 scale2(float s0, float s1)
{
    return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(s0), _mm512_set1_ps(s1));
}

AVX512_TARGET static inline __m512i join256(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

AVX512_TARGET static float dot_q8_0_avx512(const uint8_t *row, const mdl_act_t *a)
{
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int nb = a->n / 32, b = 0;
    for (; b + 3 < nb; b += 4, row += 136) {
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES + 128, _MM_HINT_T0);
        __m512i w0 = join256(_mm256_loadu_si256((const __m256i *)(row + 2)),
                             _mm256_loadu_si256((const __m256i *)(row + 36)));
        __m512i w1 = join256(_mm256_loadu_si256((const __m256i *)(row + 70)),
                             _mm256_loadu_si256((const __m256i *)(row + 104)));
        __m512i x0 = _mm512_loadu_si512((const void *)(a->q + 32 * b));
        __m512i x1 = _mm512_loadu_si512((const void *)(a->q + 32 * b + 64));
        acc0 = _mm512_fmadd_ps(scale2(fp16(row) * a->d[b], fp16(row + 34) * a->d[b + 1]),
                               dot_i8_64(w0, x0), acc0);
        acc1 = _mm512_fmadd_ps(scale2(fp16(row + 68) * a->d[b + 2], fp16(row + 102) * a->d[b + 3]),
                               dot_i8_64(w1, x1), acc1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; b < nb; b++, row += 34) {
        const int8_t *w = (const int8_t *)row + 2, *x = a->q + 32 * b;
        __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(),
                                        _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *)w)),
                                        _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x),
                                                         _mm256_loadu_si256((const __m256i *)w)));
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
        s += fp16(row) * a->d[b] * (float)_mm_cvtsi128_si32(h);
    }
    return s;
}

/* Two Q4_0 blocks (at p and p+18) -> 64 signed levels in element order */
AVX512_TARGET static inline __m512i unpack_q4x2(const uint8_t *p)
{
    __m256i raw =
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p + 2))),
                                _mm_loadu_si128((const __m128i *)(p + 20)), 1);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    /* [lo0 lo1 hi0 hi1] -> [lo0 hi0 lo1 hi1] */
    __m512i z = join256(lo, hi);
    z = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));
    return _mm512_sub_epi8(z, _mm512_set1_epi8(8));
}

AVX512_TARGET static float dot_q4_0_avx512(const uint8_t *row, const mdl_act_t *a)
{
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int nb = a->n / 32, b = 0;
    for (; b + 3 < nb; b += 4, row += 72) {
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES + 64, _MM_HINT_T0);
        __m512i w0 = unpack_q4x2(row), w1 = unpack_q4x2(row + 36);
        __m512i x0 = _mm512_loadu_si512((const void *)(a->q + 32 * b));
        __m512i x1 = _mm512_loadu_si512((const void *)(a->q + 32 * b + 64));
        acc0 = _mm512_fmadd_ps(scale2(fp16(row) * a->d[b], fp16(row + 18) * a->d[b + 1]),
                               dot_i8_64(w0, x0), acc0);
        acc1 = _mm512_fmadd_ps(scale2(fp16(row + 36) * a->d[b + 2], fp16(row + 54) * a->d[b + 3]),
                               dot_i8_64(w1, x1), acc1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; b < nb; b++, row += 18) {
        const int8_t *x = a->q + 32 * b;
        int32_t si = 0;
        for (int j = 0; j < 16; j++)
            si += ((row[2 + j] & 0xF) - 8) * x[j] + ((row[2 + j] >> 4) - 8) * x[j + 16];
        s += fp16(row) * a->d[b] * (float)si;
    }
    return s;
}

AVX512_TARGET static float dot_f16_avx512(const uint8_t *row, const mdl_act_t *a)
{
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int n = a->n, i = 0;
    const float *x = a->x;
    for (; i + 32 <= n; i += 32) {
        _mm_prefetch((const char *)row + 2 * i + MDL_PREFETCH_BYTES, _MM_HINT_T0);
        const __m256i *w = (const __m256i *)(row + 2 * i);
        acc0 =
            _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(w)), _mm512_loadu_ps(x + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(w + 1)),
                               _mm512_loadu_ps(x + i + 16), acc1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; i < n; i++)
        s += _cvtsh_ss(mdl_rd16(row + 2 * i)) * x[i];
    return s;
}

AVX512_TARGET static float dot_f32_avx512(const uint8_t *row, const mdl_act_t *a)
{
    const float *w = (const float *)(const void *)row;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int n = a->n, i = 0;
    for (; i + 32 <= n; i += 32) {
        _mm_prefetch((const char *)(w + i) + MDL_PREFETCH_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)(w + i) + MDL_PREFETCH_BYTES + 64, _MM_HINT_T0);
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(a->x + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(a->x + i + 16), acc1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; i < n; i++) {
        float wi;
        memcpy(&wi, row + 4 * i, 4);
        s += wi * a->x[i];
    }
    return s;
}

int mdl_kernels_init_avx512(mdl_kernels_t *k)
{
    k->name = "avx512";
    k->level = MDL_KL_AVX512;
    k->dot[MDL_T_Q8_0] = dot_q8_0_avx512;
    k->dot[MDL_T_Q4_0] = dot_q4_0_avx512;
    k->dot[MDL_T_F16] = dot_f16_avx512;
    k->dot[MDL_T_F32] = dot_f32_avx512;
    k->dot_f[MDL_T_F16] = dot_f16_avx512;
    k->dot_f[MDL_T_F32] = dot_f32_avx512;
    return 0;
}

#else

int mdl_kernels_init_avx512(mdl_kernels_t *k)
{
    (void)k;
    return -1;
}

#endif
