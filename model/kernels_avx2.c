/*
 * kernels_avx2.c — AVX2/FMA/F16C row kernels. Every function carries its own
 * target attribute, so the file builds with the project's plain CFLAGS and
 * the code only runs after mdl_kernels_select() saw the CPU support it.
 *
 * Integer dots use the usual sign trick: |w| (unsigned) times x*sign(w)
 * (signed) through maddubs, exact because |w| <= 128 and |x| <= 127 keep
 * each pair sum below 32767. Weight rows stream from DRAM once per token,
 * so each loop prefetches MDL_PREFETCH_BYTES ahead.
 */
#include "model/quant_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>
#include <string.h>

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
/* round to nearest even, like rintf (a macro: clang wants a literal) */
#define RND (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

AVX2_TARGET static inline float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2_TARGET static inline int32_t hsum256i(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

AVX2_TARGET static inline float fp16(const uint8_t *p)
{
    return _cvtsh_ss(mdl_rd16(p));
}

/* Same float32 operations as mdl_quantize_scalar, so the result is
 * bit-identical (round_ps to nearest = rintf's half-to-even). */
AVX2_TARGET static void quantize_avx2(const float *x, int n, int8_t *q, float *d, int32_t *qsum)
{
    const __m256 signbit = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < n / MDL_QK; b++) {
        const float *xb = x + MDL_QK * b;
        __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        __m256 m = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(signbit, v0), _mm256_andnot_ps(signbit, v1)),
            _mm256_max_ps(_mm256_andnot_ps(signbit, v2), _mm256_andnot_ps(signbit, v3)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float db = amax / 127.0f;
        float id = db != 0.0f ? 1.0f / db : 0.0f;
        __m256 mul = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, mul), RND));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, mul), RND));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, mul), RND));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, mul), RND));
        const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
        i0 = _mm256_max_epi32(_mm256_min_epi32(i0, lim), nlim);
        i1 = _mm256_max_epi32(_mm256_min_epi32(i1, lim), nlim);
        i2 = _mm256_max_epi32(_mm256_min_epi32(i2, lim), nlim);
        i3 = _mm256_max_epi32(_mm256_min_epi32(i3, lim), nlim);
        qsum[b] = hsum256i(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        _mm256_storeu_si256((__m256i *)(q + MDL_QK * b), _mm256_permutevar8x32_epi32(p, perm));
        d[b] = db;
    }
}

/* sum over pairs of |w| * (x * sign(w)), as 8 int32 lanes converted to float */
AVX2_TARGET static inline __m256 dot_i8_32(__m256i w, __m256i x)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
}

AVX2_TARGET static float dot_q8_0_avx2(const uint8_t *row, const mdl_act_t *a)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int nb = a->n / 32, b = 0;
    for (; b + 1 < nb; b += 2, row += 68) {
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES + 64, _MM_HINT_T0);
        __m256i w0 = _mm256_loadu_si256((const __m256i *)(row + 2));
        __m256i w1 = _mm256_loadu_si256((const __m256i *)(row + 36));
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(a->q + 32 * b));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(a->q + 32 * b + 32));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(row) * a->d[b]), dot_i8_32(w0, x0), acc0);
        acc1 =
            _mm256_fmadd_ps(_mm256_set1_ps(fp16(row + 34) * a->d[b + 1]), dot_i8_32(w1, x1), acc1);
    }
    for (; b < nb; b++, row += 34) {
        __m256i w0 = _mm256_loadu_si256((const __m256i *)(row + 2));
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(a->q + 32 * b));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(row) * a->d[b]), dot_i8_32(w0, x0), acc0);
    }
    return hsum256(_mm256_add_ps(acc0, acc1));
}

/* 16 packed nibbles -> 32 unsigned levels 0..15, low nibbles first */
AVX2_TARGET static inline __m256i unpack_q4(const uint8_t *qs)
{
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    __m128i lo = _mm_and_si128(raw, m4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
    return _mm256_set_m128i(hi, lo);
}

/* unsigned levels times signed activations, 8 int32 lanes as float */
AVX2_TARGET static inline __m256 dot_u8_32(__m256i w, __m256i x)
{
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}

/* Q4_0: the levels are nibble - 8; maddubs takes the nibbles as they are
 * (unsigned) and the -8 * sum(x) of each block (qsum) is one scalar term. */
AVX2_TARGET static float dot_q4_0_avx2(const uint8_t *row, const mdl_act_t *a)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float corr = 0.0f;
    int nb = a->n / 32, b = 0;
    for (; b + 1 < nb; b += 2, row += 36) {
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES, _MM_HINT_T0);
        float s0 = fp16(row) * a->d[b], s1 = fp16(row + 18) * a->d[b + 1];
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(a->q + 32 * b));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(a->q + 32 * b + 32));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(s0), dot_u8_32(unpack_q4(row + 2), x0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(s1), dot_u8_32(unpack_q4(row + 20), x1), acc1);
        corr += s0 * (float)a->qsum[b] + s1 * (float)a->qsum[b + 1];
    }
    for (; b < nb; b++, row += 18) {
        float s0 = fp16(row) * a->d[b];
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(a->q + 32 * b));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(s0), dot_u8_32(unpack_q4(row + 2), x0), acc0);
        corr += s0 * (float)a->qsum[b];
    }
    return hsum256(_mm256_add_ps(acc0, acc1)) - 8.0f * corr;
}

/* Q5_0: the 32 fifth bits spread to bytes (0x10 where set) */
AVX2_TARGET static inline __m256i unpack_q5(const uint8_t *blk)
{
    uint32_t qh;
    memcpy(&qh, blk + 2, 4);
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m128i raw = _mm_loadu_si128((const __m128i *)(blk + 6));
    __m128i lo = _mm_and_si128(raw, m4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
    __m256i q =
        _mm256_or_si256(_mm256_set_m128i(hi, lo), _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    return _mm256_sub_epi8(q, _mm256_set1_epi8(16));
}

AVX2_TARGET static float dot_q5_0_avx2(const uint8_t *row, const mdl_act_t *a)
{
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < a->n / 32; b++, row += 22) {
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES, _MM_HINT_T0);
        __m256i x = _mm256_loadu_si256((const __m256i *)(a->q + 32 * b));
        acc =
            _mm256_fmadd_ps(_mm256_set1_ps(fp16(row) * a->d[b]), dot_i8_32(unpack_q5(row), x), acc);
    }
    return hsum256(acc);
}

/* Q4_K: per 32-element sub-block, x = d*sc*q - dmin*m. The q.x part goes
 * through maddubs (q unsigned 0..15); the min part needs only the
 * activation block sums (qsum), so it is a scalar term per sub-block. */
AVX2_TARGET static float dot_q4_k_avx2(const uint8_t *row, const mdl_act_t *a)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int b = 0; b < a->n / 256; b++, row += 144) {
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES + 128, _MM_HINT_T0);
        float d = fp16(row), dmin = fp16(row + 2);
        const uint8_t *sc = row + 4, *qs = row + 16;
        for (int c = 0; c < 4; c++) {
            int j0 = 2 * c, j1 = j0 + 1, s0 = 8 * b + j0, s1 = s0 + 1;
            /* six-bit scales and mins (notes §4.3) */
            int sc0, m0, sc1, m1;
            if (j0 < 4) {
                sc0 = sc[j0] & 63, m0 = sc[j0 + 4] & 63, sc1 = sc[j1] & 63, m1 = sc[j1 + 4] & 63;
            } else {
                sc0 = (sc[j0 + 4] & 0xF) | ((sc[j0 - 4] >> 6) << 4);
                m0 = (sc[j0 + 4] >> 4) | ((sc[j0] >> 6) << 4);
                sc1 = (sc[j1 + 4] & 0xF) | ((sc[j1 - 4] >> 6) << 4);
                m1 = (sc[j1 + 4] >> 4) | ((sc[j1] >> 6) << 4);
            }
            __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(raw, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            __m256i p0 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(a->q + 32 * s0))),
                ones);
            __m256i p1 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(a->q + 32 * s1))),
                ones);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc0 * a->d[s0]), _mm256_cvtepi32_ps(p0),
                                  acc);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc1 * a->d[s1]), _mm256_cvtepi32_ps(p1),
                                  acc);
            mins += dmin * ((float)m0 * a->d[s0] * (float)a->qsum[s0] +
                            (float)m1 * a->d[s1] * (float)a->qsum[s1]);
        }
    }
    return hsum256(acc) - mins;
}

/* Q6_K: the 6-bit levels of one 128-element half rebuilt 32 at a time from
 * ql (low 4 bits) and qh (2 bits), made signed (-32..31), then the sign
 * trick; each 32 spans two 16-element scales: lanes 0-3 and 4-7. */
AVX2_TARGET static float dot_q6_k_avx2(const uint8_t *row, const mdl_act_t *a)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    const __m256i off = _mm256_set1_epi8(32), ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < a->n / 256; b++, row += 210) {
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES + 128, _MM_HINT_T0);
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES + 192, _MM_HINT_T0);
        float d = fp16(row + 208);
        const int8_t *sc = (const int8_t *)row + 192;
        for (int h = 0; h < 2; h++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(row + 64 * h));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(row + 64 * h + 32));
            __m256i hb = _mm256_loadu_si256((const __m256i *)(row + 128 + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
            q[1] = _mm256_or_si256(
                _mm256_and_si256(l1, m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
            q[2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
            q[3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
            for (int g = 0; g < 4; g++) {
                int s = 8 * b + 4 * h + g, k = 8 * h + 2 * g;
                __m256i v = _mm256_sub_epi8(q[g], off);
                __m256i x = _mm256_loadu_si256((const __m256i *)(a->q + 32 * s));
                __m256i p = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(x, v)), ones);
                __m256 scv = _mm256_setr_ps((float)sc[k], (float)sc[k], (float)sc[k], (float)sc[k],
                                            (float)sc[k + 1], (float)sc[k + 1], (float)sc[k + 1],
                                            (float)sc[k + 1]);
                acc = _mm256_fmadd_ps(_mm256_mul_ps(scv, _mm256_set1_ps(d * a->d[s])),
                                      _mm256_cvtepi32_ps(p), acc);
            }
        }
    }
    return hsum256(acc);
}

AVX2_TARGET static float dot_f16_avx2(const uint8_t *row, const mdl_act_t *a)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
    int n = a->n, i = 0;
    const float *x = a->x;
    for (; i + 32 <= n; i += 32) {
        _mm_prefetch((const char *)row + 2 * i + MDL_PREFETCH_BYTES, _MM_HINT_T0);
        const __m128i *w = (const __m128i *)(row + 2 * i);
        acc0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(w)), _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(w + 1)), _mm256_loadu_ps(x + i + 8),
                               acc1);
        acc2 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(w + 2)), _mm256_loadu_ps(x + i + 16),
                               acc2);
        acc3 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(w + 3)), _mm256_loadu_ps(x + i + 24),
                               acc3);
    }
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++)
        s += _cvtsh_ss(mdl_rd16(row + 2 * i)) * x[i];
    return s;
}

AVX2_TARGET static float vdot_avx2(const float *a, const float *b, int n)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    float s = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

AVX2_TARGET static float dot_f32_avx2(const uint8_t *row, const mdl_act_t *a)
{
    /* rows of a GGUF tensor are only 4-byte aligned in general: loadu */
    const float *w = (const float *)(const void *)row;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int n = a->n, i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm_prefetch((const char *)(w + i) + MDL_PREFETCH_BYTES, _MM_HINT_T0);
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(a->x + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(a->x + i + 8), acc1);
    }
    float s = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) {
        float wi;
        memcpy(&wi, row + 4 * i, 4);
        s += wi * a->x[i];
    }
    return s;
}

AVX2_TARGET static void vaxpy_avx2(float *y, float a, const float *x, int n)
{
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

/* Attention over n cached rows, without a call and a reload of q per row:
 * the same two accumulators and the same sums as vdot_avx2, so the scores
 * are the same bits. */
AVX2_TARGET static void vdots_avx2(const float *q, const float *K, int n, int hd, float scale,
                                   float *out)
{
    if (hd % 16 != 0 || hd > 256) {
        for (int t = 0; t < n; t++)
            out[t] = vdot_avx2(q, K + (size_t)t * hd, hd) * scale;
        return;
    }
    if (hd == 64) {
        /* q in eight registers; the loops unrolled (GCC does not at -O2:
         * a loop over i per position was ~2% of a step of 8 sequences) */
        __m256 qv[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
            qv[j] = _mm256_loadu_ps(q + 8 * j);
        for (int t = 0; t < n; t++) {
            const float *k = K + (size_t)t * 64;
            __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
#pragma GCC unroll 4
            for (int i = 0; i < 64; i += 16) {
                acc0 = _mm256_fmadd_ps(qv[i / 8], _mm256_loadu_ps(k + i), acc0);
                acc1 = _mm256_fmadd_ps(qv[i / 8 + 1], _mm256_loadu_ps(k + i + 8), acc1);
            }
            out[t] = hsum256(_mm256_add_ps(acc0, acc1)) * scale;
        }
        return;
    }
    for (int t = 0; t < n; t++) {
        const float *k = K + (size_t)t * hd;
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        for (int i = 0; i < hd; i += 16) {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(k + i + 8), acc1);
        }
        out[t] = hsum256(_mm256_add_ps(acc0, acc1)) * scale;
    }
}

/* out = sum over t of w[t] * V[t], with out kept in registers (head sizes
 * up to 64): the same fused multiply-adds in the same order as zeroing out
 * and calling vaxpy_avx2 per row, so the same bits. */
AVX2_TARGET static void vmix_avx2(const float *w, const float *V, int n, int hd, float *out)
{
    if (hd != 64) {
        memset(out, 0, sizeof(float) * (size_t)hd);
        for (int t = 0; t < n; t++)
            vaxpy_avx2(out, w[t], V + (size_t)t * hd, hd);
        return;
    }
    /* the loops over j unrolled, so a[] lives in registers: GCC at -O2
     * kept it on the stack, a store and a reload per FMA (~3% of a step) */
    __m256 a[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++)
        a[j] = _mm256_setzero_ps();
    for (int t = 0; t < n; t++) {
        const float *v = V + (size_t)t * 64;
        __m256 wv = _mm256_set1_ps(w[t]);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
            a[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + 8 * j), a[j]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++)
        _mm256_storeu_ps(out + 8 * j, a[j]);
}

/* glibc's vector expf (libmvec, which -lm brings in as needed): 8 lanes,
 * each the value of its own input whatever the others are, within 1 ulp
 * of expf. The scalar expf calls were ~5% of a step of 8 sequences. */
AVX2_TARGET __m256 _ZGVdN8v_expf(__m256 x);

AVX2_TARGET static void vexpf_avx2(float *x, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _ZGVdN8v_expf(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float t[8] = {0};
        memcpy(t, x + i, sizeof(float) * (size_t)(n - i));
        _mm256_storeu_ps(t, _ZGVdN8v_expf(_mm256_loadu_ps(t)));
        memcpy(x + i, t, sizeof(float) * (size_t)(n - i));
    }
}

int mdl_kernels_init_avx2(mdl_kernels_t *k)
{
    k->name = "avx2";
    k->level = MDL_KL_AVX2;
    k->quantize = quantize_avx2;
    k->dot[MDL_T_Q8_0] = dot_q8_0_avx2;
    k->dot[MDL_T_Q4_0] = dot_q4_0_avx2;
    k->dot[MDL_T_Q5_0] = dot_q5_0_avx2;
    k->dot[MDL_T_Q4_K] = dot_q4_k_avx2;
    k->dot[MDL_T_Q6_K] = dot_q6_k_avx2;
    k->dot[MDL_T_F16] = dot_f16_avx2;
    k->dot[MDL_T_F32] = dot_f32_avx2;
    k->dot_f[MDL_T_F16] = dot_f16_avx2;
    k->dot_f[MDL_T_F32] = dot_f32_avx2;
    k->vdot = vdot_avx2;
    k->vaxpy = vaxpy_avx2;
    k->vdots = vdots_avx2;
    k->vmix = vmix_avx2;
    k->vexpf = vexpf_avx2;
    return 0;
}

#else

int mdl_kernels_init_avx2(mdl_kernels_t *k)
{
    (void)k;
    return -1;
}

#endif
