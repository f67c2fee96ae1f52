/*
 * kernels_avx512.c — AVX-512 (F, BW, VL, VNNI) row kernels, chosen at run
 * time like the AVX2 ones. The integer kernels feed several 32-element
 * blocks to one 512-bit vpdpbusd (unsigned x signed bytes) and weight each
 * block's lanes with its own scale. vpdpbusd wants one operand unsigned,
 * so weights are made unsigned (Q8_0: +128; Q4_0: raw nibbles) and the
 * offset is removed by starting the sum at -offset * sum(x), which prep
 * computes once per activation vector (mdl_act_t c128, c8). Types without
 * a kernel here keep the AVX2 (or scalar) entry.
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

AVX512_TARGET static inline __m512i join256(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Four fp16 weight scales at stride `stride`, times the four activation
 * scales: one float per block. */
AVX512_TARGET static inline __m128 scales4(const uint8_t *row, int stride, const float *dx)
{
    __m128i h = _mm_setr_epi16((short)mdl_rd16(row), (short)mdl_rd16(row + stride),
                               (short)mdl_rd16(row + 2 * stride), (short)mdl_rd16(row + 3 * stride),
                               0, 0, 0, 0);
    return _mm_mul_ps(_mm_cvtph_ps(h), _mm_loadu_ps(dx));
}

/* The activation forms the kernels below read (see mdl_act_t). */
static void prep_avx512(mdl_act_t *a)
{
    const int8_t *q = a->q;
    int n = a->n;
    for (int i = 0; i < n / 4; i++)
        a->c128[i] = -128 * (q[4 * i] + q[4 * i + 1] + q[4 * i + 2] + q[4 * i + 3]);
    static const int korder[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    for (int g = 0; g < n / 256; g++)
        for (int k = 0; k < 8; k++)
            memcpy(a->qk + 256 * g + 32 * k, q + 256 * g + 32 * korder[k], 32);
    for (int g = 0; g < n / 128; g++) {
        const int8_t *src = q + 128 * g;
        int8_t *dst = a->qp + 128 * g;
        for (int k = 0; k < 4; k++) {
            memcpy(dst + 16 * k, src + 32 * k, 16);
            memcpy(dst + 64 + 16 * k, src + 32 * k + 16, 16);
        }
        for (int i = 0; i < 16; i++) {
            const int8_t *lo = src + 32 * (i / 4) + 4 * (i % 4), *hi = lo + 16;
            a->c8[16 * g + i] =
                -8 * (lo[0] + lo[1] + lo[2] + lo[3] + hi[0] + hi[1] + hi[2] + hi[3]);
        }
    }
}

#define TILE_INLINE __attribute__((always_inline)) static inline

/* Q8_0, R rows x T tokens (R, T <= 4, constants at every call site so the
 * accumulators live in registers). Q8_0 as unsigned: sum (w + 128) x =
 * sum w x + 128 sum x, so starting vpdpbusd from -128 sum x (c128) leaves
 * sum w x, with one XOR per 64 weights instead of a sign fix-up. Two
 * blocks per vector, four per step; the weight scales are decoded once per
 * row and step for all T tokens. Per (row, token): one accumulator and the
 * same operations in the same order whatever R and T are, so every tile
 * shape gives the same bits; blocks after the last group of four are done
 * in scalar code. res[r * T + t]. */
AVX512_TARGET TILE_INLINE void q8_0_tile(const uint8_t *row0, size_t rb, int R, const mdl_act_t *a,
                                         int T, float *res)
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m512i i01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i i23 = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm512_setzero_ps();
    int nb = a[0].n / 32, b = 0;
    for (; b + 3 < nb; b += 4) {
        __m512i w0[4], w1[4];
        __m128 dw[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *x = row0 + (size_t)r * rb + (size_t)34 * b;
            _mm_prefetch((const char *)x + MDL_PREFETCH_BYTES, _MM_HINT_T0);
            _mm_prefetch((const char *)x + MDL_PREFETCH_BYTES + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)x + MDL_PREFETCH_BYTES + 128, _MM_HINT_T0);
            w0[r] = _mm512_xor_si512(join256(_mm256_loadu_si256((const __m256i *)(x + 2)),
                                             _mm256_loadu_si256((const __m256i *)(x + 36))),
                                     flip);
            w1[r] = _mm512_xor_si512(join256(_mm256_loadu_si256((const __m256i *)(x + 70)),
                                             _mm256_loadu_si256((const __m256i *)(x + 104))),
                                     flip);
            __m128i h =
                _mm_setr_epi16((short)mdl_rd16(x), (short)mdl_rd16(x + 34), (short)mdl_rd16(x + 68),
                               (short)mdl_rd16(x + 102), 0, 0, 0, 0);
            dw[r] = _mm_cvtph_ps(h);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m512i q0 = _mm512_loadu_si512((const void *)(a[t].q + 32 * b));
            __m512i q1 = _mm512_loadu_si512((const void *)(a[t].q + 32 * b + 64));
            __m512i c0 = _mm512_loadu_si512((const void *)(a[t].c128 + 8 * b));
            __m512i c1 = _mm512_loadu_si512((const void *)(a[t].c128 + 8 * b + 16));
            __m128 dx = _mm_loadu_ps(a[t].d + b);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m512 sc = _mm512_castps128_ps512(_mm_mul_ps(dw[r], dx));
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c0, w0[r], q0)),
                                            _mm512_permutexvar_ps(i01, sc), acc[r][t]);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c1, w1[r], q1)),
                                            _mm512_permutexvar_ps(i23, sc), acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float s = _mm512_reduce_add_ps(acc[r][t]);
            for (int bb = b; bb < nb; bb++) {
                const uint8_t *x = row0 + (size_t)r * rb + (size_t)34 * bb;
                const int8_t *w = (const int8_t *)x + 2, *q = a[t].q + 32 * bb;
                int32_t si = 0;
                for (int j = 0; j < 32; j++)
                    si += w[j] * q[j];
                s += fp16(x) * a[t].d[bb] * (float)si;
            }
            res[r * T + t] = s;
        }
}

/* Q4_0, R rows x T tokens, as q8_0_tile: four blocks per vector. The
 * nibbles are used in the order they lie in (all low halves, then all
 * high halves) and the activations were regrouped to match (qp); nibbles
 * are unsigned 0..15, the -8 comes from starting vpdpbusd at -8 sum x
 * (c8). Blocks after the last group of four are done in scalar code. */
AVX512_TARGET TILE_INLINE void q4_0_tile(const uint8_t *row0, size_t rb, int R, const mdl_act_t *a,
                                         int T, float *res)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm512_setzero_ps();
    int nb = a[0].n / 32, ng = nb / 4;
    for (int g = 0; g < ng; g++) {
        __m512i lo[4], hi[4];
        __m128 dw[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *x = row0 + (size_t)r * rb + (size_t)72 * g;
            _mm_prefetch((const char *)x + MDL_PREFETCH_BYTES, _MM_HINT_T0);
            _mm_prefetch((const char *)x + MDL_PREFETCH_BYTES + 64, _MM_HINT_T0);
            __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(x + 2)));
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(x + 20)), 1);
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(x + 38)), 2);
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(x + 56)), 3);
            lo[r] = _mm512_and_si512(v, m4);
            hi[r] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            __m128i h =
                _mm_setr_epi16((short)mdl_rd16(x), (short)mdl_rd16(x + 18), (short)mdl_rd16(x + 36),
                               (short)mdl_rd16(x + 54), 0, 0, 0, 0);
            dw[r] = _mm_cvtph_ps(h);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const int8_t *xp = a[t].qp + 128 * g;
            __m512i qlo = _mm512_loadu_si512((const void *)xp);
            __m512i qhi = _mm512_loadu_si512((const void *)(xp + 64));
            __m512i c = _mm512_loadu_si512((const void *)(a[t].c8 + 16 * g));
            __m128 dx = _mm_loadu_ps(a[t].d + 4 * g);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m512i p = _mm512_dpbusd_epi32(c, lo[r], qlo);
                p = _mm512_dpbusd_epi32(p, hi[r], qhi);
                __m512 sc =
                    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_mul_ps(dw[r], dx)));
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[r][t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float s = _mm512_reduce_add_ps(acc[r][t]);
            for (int b = 4 * ng; b < nb; b++) {
                const uint8_t *x = row0 + (size_t)r * rb + (size_t)18 * b;
                const int8_t *q = a[t].q + 32 * b;
                int32_t si = 0;
                for (int j = 0; j < 16; j++)
                    si += ((x[2 + j] & 0xF) - 8) * q[j] + ((x[2 + j] >> 4) - 8) * q[j + 16];
                s += fp16(x) * a[t].d[b] * (float)si;
            }
            res[r * T + t] = s;
        }
}

AVX512_TARGET static float dot_q8_0_avx512(const uint8_t *row, const mdl_act_t *a)
{
    float v;
    q8_0_tile(row, 0, 1, a, 1, &v);
    return v;
}

AVX512_TARGET static float dot_q4_0_avx512(const uint8_t *row, const mdl_act_t *a)
{
    float v;
    q4_0_tile(row, 0, 1, a, 1, &v);
    return v;
}

AVX512_TARGET static inline void gemm_store(float *out, size_t ostride, int r, int R, int t, int T,
                                            const float *res, const float *bias, int accumulate)
{
    for (int i = 0; i < R; i++)
        for (int j = 0; j < T; j++) {
            float v = res[i * T + j] + (bias ? bias[r + i] : 0.0f);
            float *o = out + (size_t)(t + j) * ostride + r + i;
            *o = accumulate ? *o + v : v;
        }
}

/* Tiles of RT rows x 4 tokens; smaller tiles at the edges. Rows outer, so
 * a tile's rows stay in L1 while every token passes over them. With fewer
 * than four tokens (decode) one row at a time streams best. */
#define GEMM_TOKENS(TILE, R, r, t0)                                                                \
    do {                                                                                           \
        int t_ = (t0);                                                                             \
        for (; t_ + 4 <= nb; t_ += 4) {                                                            \
            TILE(w + (size_t)(r)*rb, rb, R, a + t_, 4, res);                                       \
            gemm_store(out, ostride, r, R, t_, 4, res, bias, accumulate);                          \
        }                                                                                          \
        switch (nb - t_) {                                                                         \
        case 3:                                                                                    \
            TILE(w + (size_t)(r)*rb, rb, R, a + t_, 3, res);                                       \
            gemm_store(out, ostride, r, R, t_, 3, res, bias, accumulate);                          \
            break;                                                                                 \
        case 2:                                                                                    \
            TILE(w + (size_t)(r)*rb, rb, R, a + t_, 2, res);                                       \
            gemm_store(out, ostride, r, R, t_, 2, res, bias, accumulate);                          \
            break;                                                                                 \
        case 1:                                                                                    \
            TILE(w + (size_t)(r)*rb, rb, R, a + t_, 1, res);                                       \
            gemm_store(out, ostride, r, R, t_, 1, res, bias, accumulate);                          \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

#define GEMM_DRIVER(NAME, TILE, RT)                                                                \
    AVX512_TARGET static void NAME(const uint8_t *w, size_t rb, int n_rows, const mdl_act_t *a,    \
                                   int nb, float *out, size_t ostride, const float *bias,          \
                                   int accumulate)                                                 \
    {                                                                                              \
        float res[16];                                                                             \
        int r = 0;                                                                                 \
        if (nb >= 4)                                                                               \
            for (; r + RT <= n_rows; r += RT)                                                      \
                GEMM_TOKENS(TILE, RT, r, 0);                                                       \
        for (; r < n_rows; r++)                                                                    \
            GEMM_TOKENS(TILE, 1, r, 0);                                                            \
    }

GEMM_DRIVER(gemm_q8_0_avx512, q8_0_tile, 2)
GEMM_DRIVER(gemm_q4_0_avx512, q4_0_tile, 2)

/* ---- repacked weights (rp16, see quant_internal.h) ------------------ */

/* Four activation bytes in every lane, straight from memory (a broadcast
 * load, no shuffle port). */
AVX512_TARGET static inline __m512i bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

#ifndef MDL_RP_PREFETCH_1
#define MDL_RP_PREFETCH_1 MDL_PREFETCH_BYTES
#endif
/* With 4+ tokens a block takes longer, yet the weights stream slower than
 * at one token: on the shared host (load 8) the 4 KiB lead left a step of
 * 8 waiting on memory. 8 KiB ahead at 4+ tokens: decode tokens per
 * CPU-second of `serve --streams 8` 197 -> 217 (medians of 6, interleaved);
 * at 1 token the longer lead cost ~20% (44 -> 35), so one token keeps 4 KiB
 * (bench/RESULTS-model.md, fifth pass). */
#ifndef MDL_RP_PREFETCH_WIDE
#define MDL_RP_PREFETCH_WIDE 8192
#endif
#ifndef MDL_RP_PREFETCH
#define MDL_RP_PREFETCH (T >= 4 ? MDL_RP_PREFETCH_WIDE : MDL_RP_PREFETCH_1)
#endif
/* The repacked Q8_0/Q4_0/Q5_0 tiles prefetch into L2, not L1: with 8
 * tokens a block takes ~64 vpdpbusd, and L1-bound prefetches (few miss
 * buffers) left the weight stream waiting on the compute instead of
 * overlapping it. `mdl_tool gemm --mib 256`, interleaved 6 rounds on the
 * shared host: 8 tokens 0.154 -> 0.084 CPU ns per weight (medians), 1 token
 * 0.085 -> 0.063 (bench/RESULTS-model.md, fourth pass). */
#ifndef MDL_RP_PF_HINT
#define MDL_RP_PF_HINT _MM_HINT_T1
#endif
#ifndef MDL_RP_K4_PF_HINT /* the Q4_K tile's, separately for comparisons */
#define MDL_RP_K4_PF_HINT _MM_HINT_T1
#endif

/* Q4_K, one group x T tokens: per sub-block, its 8 nibble chunks (the
 * pair's bytes, shifted for the odd sub-block) stay in registers for
 * every token; scales d*sc and dmin*m are 16-lane vectors made once per
 * sub-block. The float order is the reference's (rp_ref_q4k). */
AVX512_TARGET TILE_INLINE void rp_tile_q4k(const uint8_t *G, int nsb, const mdl_act_t *a, int T,
                                           __m512 *acc)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
        acc[t] = _mm512_setzero_ps();
    for (int b = 0; b < nsb; b++) {
        const uint8_t *S = G + (size_t)MDL_RP_K4_BYTES * b;
        for (int k = 0; k < 5; k++)
            _mm_prefetch((const char *)S + MDL_RP_PREFETCH + 64 * k, MDL_RP_K4_PF_HINT);
        __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(S + MDL_RP_K4_D)));
        __m512 dm = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(S + MDL_RP_K4_DMIN)));
        for (int sb = 0; sb < 8; sb++) {
            const uint8_t *Q = S + MDL_RP_K4_Q + 512 * (sb / 2);
            __m512i W[8];
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                __m512i v = _mm512_load_si512((const void *)(Q + 64 * k));
                if (sb & 1)
                    v = _mm512_srli_epi16(v, 4);
                else
                    _mm_prefetch((const char *)Q + MDL_RP_PREFETCH + 64 * k, MDL_RP_K4_PF_HINT);
                W[k] = _mm512_and_si512(v, m4);
            }
            __m512 scv = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(
                                              (const __m128i *)(S + MDL_RP_K4_SC + 16 * sb)))));
            __m512 mnv = _mm512_mul_ps(dm, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(
                                               (const __m128i *)(S + MDL_RP_K4_M + 16 * sb)))));
            int ab = 8 * b + sb;
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                const int8_t *x = a[t].q + 32 * ab;
                __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int k = 0; k < 8; k += 2) {
                    i0 = _mm512_dpbusd_epi32(i0, W[k], bcast4(x + 4 * k));
                    i1 = _mm512_dpbusd_epi32(i1, W[k + 1], bcast4(x + 4 * k + 4));
                }
                __m512 dx = _mm512_set1_ps(a[t].d[ab]);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1)),
                                         _mm512_mul_ps(scv, dx), acc[t]);
                acc[t] = _mm512_fnmadd_ps(_mm512_mul_ps(mnv, dx),
                                          _mm512_set1_ps((float)a[t].qsum[ab]), acc[t]);
            }
        }
    }
}

/* One block of a 16-row group's weights as unsigned bytes in 8 registers
 * (Q8_0 as stored; the nibble types split and masked, Q5_0's fifth bits
 * added), prefetching MDL_RP_PREFETCH ahead (it depends on T, the tokens
 * of the tile): rp_tile and rp_tile_il load the same way. */
AVX512_TARGET TILE_INLINE void rp_load_block(uint32_t type, const uint8_t *qs, int b, int T,
                                             __m512i *W)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    if (type == MDL_T_Q8_0) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            _mm_prefetch((const char *)qs + MDL_RP_PREFETCH + 64 * k, MDL_RP_PF_HINT);
            W[k] = _mm512_load_si512((const void *)(qs + 64 * k));
        }
    } else {
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            _mm_prefetch((const char *)qs + MDL_RP_PREFETCH + 64 * k, MDL_RP_PF_HINT);
            __m512i v = _mm512_load_si512((const void *)(qs + 64 * k));
            W[k] = _mm512_and_si512(v, m4);
            W[4 + k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        }
        if (type == MDL_T_Q5_0) {
            /* the fifth bits: +16 in the bytes the masks name */
            const __m512i bit5 = _mm512_set1_epi8(0x10);
            _mm_prefetch((const char *)qs + MDL_RP_PREFETCH + 256, MDL_RP_PF_HINT);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                uint64_t mk;
                memcpy(&mk, qs + 256 + 8 * k, 8);
                W[k] = _mm512_mask_add_epi8(W[k], _cvtu64_mask64(mk), W[k], bit5);
            }
        }
    }
    if (!(b & 1))
        _mm_prefetch((const char *)qs - 64 + MDL_RP_PREFETCH, MDL_RP_PF_HINT);
}

/* One group of 16 rows times T tokens (T <= 8, a constant at each call
 * site): per block, the weights (8 registers) are loaded and made unsigned
 * bytes once, then every token's 32 activations are broadcast 4 bytes at a
 * time against them. Two integer chains per token (integer sums are exact,
 * so their split is free); the float part is one convert, one scale
 * multiply and one FMA per 16 rows x 32 weights, in block order, as the
 * reference does. */
AVX512_TARGET TILE_INLINE void rp_tile(uint32_t type, const uint8_t *G, int nblk,
                                       const mdl_act_t *a, int T, __m512 *acc)
{
    if (type == MDL_T_Q4_K) {
        rp_tile_q4k(G, nblk, a, T, acc);
        return;
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
        acc[t] = _mm512_setzero_ps();
    size_t qb = type == MDL_T_Q8_0 ? 512 : type == MDL_T_Q5_0 ? 320 : 256;
    for (int b = 0; b < nblk; b++) {
        const uint8_t *qs = G + MDL_RP_Q_OFF(b, qb);
        __m512i W[8];
        rp_load_block(type, qs, b, T, W);
        __m512 dw =
            _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(G + MDL_RP_SCALE_OFF(b, qb))));
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const int8_t *x = a[t].q + 32 * b;
            __m512i i0, i1 = _mm512_setzero_si512();
            if (type == MDL_T_Q8_0) {
                i0 = _mm512_set1_epi32(-128 * a[t].qsum[b]);
#pragma GCC unroll 8
                for (int k = 0; k < 8; k += 2) {
                    i0 = _mm512_dpbusd_epi32(i0, W[k], bcast4(x + 4 * k));
                    i1 = _mm512_dpbusd_epi32(i1, W[k + 1], bcast4(x + 4 * k + 4));
                }
            } else {
                /* low nibbles: elements 4k.. (words 0..3), high: 16+4k.. (4..7) */
                i0 = _mm512_set1_epi32((type == MDL_T_Q5_0 ? -16 : -8) * a[t].qsum[b]);
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    i0 = _mm512_dpbusd_epi32(i0, W[k], bcast4(x + 4 * k));
                    i1 = _mm512_dpbusd_epi32(i1, W[4 + k], bcast4(x + 16 + 4 * k));
                }
            }
            __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(a[t].d[b]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1)), sc, acc[t]);
        }
    }
}

/* rp_tile on the interleaved form (mdl_act_t.il) of T tokens: the same
 * integer sums and the same float operations in the same order, so the
 * same bits; every token's activations, scale and correction of a block
 * are reached from one pointer. With 4+ tokens one integer chain per token
 * (the tokens' chains overlap each other; integer sums are exact in any
 * order), which saves an add per token and block. */
AVX512_TARGET TILE_INLINE void rp_tile_il(uint32_t type, const uint8_t *G, int nblk,
                                          const uint8_t *il, int T, __m512 *acc)
{
    const size_t oo = type == MDL_T_Q8_0   ? MDL_IL_O128
                      : type == MDL_T_Q5_0 ? MDL_IL_O16
                                           : MDL_IL_O8;
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
        acc[t] = _mm512_setzero_ps();
    size_t qb = type == MDL_T_Q8_0 ? 512 : type == MDL_T_Q5_0 ? 320 : 256;
    for (int b = 0; b < nblk; b++) {
        const uint8_t *qs = G + MDL_RP_Q_OFF(b, qb);
        const uint8_t *P = il + (size_t)MDL_IL_BLK * b;
        __m512i W[8];
        rp_load_block(type, qs, b, T, W);
        __m512 dw =
            _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(G + MDL_RP_SCALE_OFF(b, qb))));
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            /* chunk k holds elements 4k.. (the nibble types: low nibbles,
             * elements 0..15, in chunks 0..3, high ones in 4..7) */
            const int8_t *x = (const int8_t *)P + 32 * t;
            int32_t o;
            float dx;
            memcpy(&o, P + oo + 4 * t, 4);
            memcpy(&dx, P + MDL_IL_D + 4 * t, 4);
            __m512i i0 = _mm512_set1_epi32(o), iv;
            if (T >= 4) {
#pragma GCC unroll 8
                for (int k = 0; k < 8; k++)
                    i0 = _mm512_dpbusd_epi32(i0, W[k], bcast4(x + 4 * k));
                iv = i0;
            } else {
                __m512i i1 = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int k = 0; k < 8; k += 2) {
                    i0 = _mm512_dpbusd_epi32(i0, W[k], bcast4(x + 4 * k));
                    i1 = _mm512_dpbusd_epi32(i1, W[k + 1], bcast4(x + 4 * k + 4));
                }
                iv = _mm512_add_epi32(i0, i1);
            }
            __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(dx));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iv), sc, acc[t]);
        }
    }
}

/* One chunk of T tokens: the interleaved form when the batch has it. */
#define RP_TILE_T(TYPE, G, nblk, a, T, acc)                                                        \
    do {                                                                                           \
        if ((TYPE) != MDL_T_Q4_K && (a)[0].il)                                                     \
            rp_tile_il(TYPE, G, nblk, (a)[0].il, T, acc);                                          \
        else                                                                                       \
            rp_tile(TYPE, G, nblk, a, T, acc);                                                     \
    } while (0)

AVX512_TARGET TILE_INLINE void rp_store(__m512 v, float *o, int n, const float *bias,
                                        int accumulate)
{
    __mmask16 m = (__mmask16)(n >= 16 ? 0xFFFF : (1u << n) - 1);
    if (bias)
        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias));
    if (accumulate)
        v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, o), v);
    _mm512_mask_storeu_ps(o, m, v);
}

#define RP_DRIVER(NAME, TYPE)                                                                      \
    AVX512_TARGET static void NAME(const uint8_t *w, size_t gstride, int n_rows,                   \
                                   const mdl_act_t *a, int nb, float *out, size_t ostride,         \
                                   const float *bias, int accumulate)                              \
    {                                                                                              \
        int nblk = a[0].n / (TYPE == MDL_T_Q4_K ? 256 : 32);                                       \
        for (int r = 0; r < n_rows; r += MDL_RP_ROWS) {                                            \
            const uint8_t *G = w + gstride * (size_t)(r / MDL_RP_ROWS);                            \
            int nr = SL_MIN(MDL_RP_ROWS, n_rows - r);                                              \
            for (int t0 = 0; t0 < nb; t0 += 8) {                                                   \
                __m512 acc[8];                                                                     \
                int T = SL_MIN(8, nb - t0);                                                        \
                switch (T) {                                                                       \
                case 1:                                                                            \
                    RP_TILE_T(TYPE, G, nblk, a + t0, 1, acc);                                      \
                    break;                                                                         \
                case 2:                                                                            \
                    RP_TILE_T(TYPE, G, nblk, a + t0, 2, acc);                                      \
                    break;                                                                         \
                case 3:                                                                            \
                    RP_TILE_T(TYPE, G, nblk, a + t0, 3, acc);                                      \
                    break;                                                                         \
                case 4:                                                                            \
                    RP_TILE_T(TYPE, G, nblk, a + t0, 4, acc);                                      \
                    break;                                                                         \
                case 5:                                                                            \
                    RP_TILE_T(TYPE, G, nblk, a + t0, 5, acc);                                      \
                    break;                                                                         \
                case 6:                                                                            \
                    RP_TILE_T(TYPE, G, nblk, a + t0, 6, acc);                                      \
                    break;                                                                         \
                case 7:                                                                            \
                    RP_TILE_T(TYPE, G, nblk, a + t0, 7, acc);                                      \
                    break;                                                                         \
                default:                                                                           \
                    RP_TILE_T(TYPE, G, nblk, a + t0, 8, acc);                                      \
                    break;                                                                         \
                }                                                                                  \
                for (int t = 0; t < T; t++)                                                        \
                    rp_store(acc[t], out + (size_t)(t0 + t) * ostride + r, nr,                     \
                             bias ? bias + r : NULL, accumulate);                                  \
            }                                                                                      \
        }                                                                                          \
    }

RP_DRIVER(gemm_rp_q8_0_avx512, MDL_T_Q8_0)
RP_DRIVER(gemm_rp_q4_0_avx512, MDL_T_Q4_0)
RP_DRIVER(gemm_rp_q4_k_avx512, MDL_T_Q4_K)
RP_DRIVER(gemm_rp_q5_0_avx512, MDL_T_Q5_0)

/* Q5_0: as Q4_0, plus the fifth bits added as 0x10 under a byte mask
 * built from the four qh words (low halves of qh go with the low nibbles,
 * high halves with the high nibbles); levels 0..31, offset -16 = 2 * c8. */
AVX512_TARGET static float dot_q5_0_avx512(const uint8_t *row, const mdl_act_t *a)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), bit5 = _mm512_set1_epi8(0x10);
    const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int nb = a->n / 32, b = 0;
    for (; b + 3 < nb; b += 4, row += 88) {
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES + 64, _MM_HINT_T0);
        __m512i r = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(row + 6)));
        r = _mm512_inserti32x4(r, _mm_loadu_si128((const __m128i *)(row + 28)), 1);
        r = _mm512_inserti32x4(r, _mm_loadu_si128((const __m128i *)(row + 50)), 2);
        r = _mm512_inserti32x4(r, _mm_loadu_si128((const __m128i *)(row + 72)), 3);
        uint32_t h[4];
        for (int k = 0; k < 4; k++)
            memcpy(&h[k], row + 2 + 22 * k, 4);
        uint64_t mlo = (uint64_t)(h[0] & 0xFFFF) | (uint64_t)(h[1] & 0xFFFF) << 16 |
                       (uint64_t)(h[2] & 0xFFFF) << 32 | (uint64_t)(h[3] & 0xFFFF) << 48;
        uint64_t mhi = (uint64_t)(h[0] >> 16) | (uint64_t)(h[1] >> 16) << 16 |
                       (uint64_t)(h[2] >> 16) << 32 | (uint64_t)(h[3] >> 16) << 48;
        __m512i lo = _mm512_and_si512(r, m4), hi = _mm512_and_si512(_mm512_srli_epi16(r, 4), m4);
        lo = _mm512_mask_add_epi8(lo, _cvtu64_mask64(mlo), lo, bit5);
        hi = _mm512_mask_add_epi8(hi, _cvtu64_mask64(mhi), hi, bit5);
        const int8_t *xp = a->qp + 32 * b;
        __m512i c = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(a->c8 + 4 * b)), 1);
        __m512i p = _mm512_dpbusd_epi32(c, lo, _mm512_loadu_si512((const void *)xp));
        p = _mm512_dpbusd_epi32(p, hi, _mm512_loadu_si512((const void *)(xp + 64)));
        __m512 sc = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(scales4(row, 22, a->d + b)));
        if (b & 4)
            acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc1);
        else
            acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc0);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; b < nb; b++, row += 22) {
        uint32_t qh;
        memcpy(&qh, row + 2, 4);
        const int8_t *x = a->q + 32 * b;
        int32_t si = 0;
        for (int j = 0; j < 16; j++)
            si += (((row[6 + j] & 0xF) | ((qh >> j) & 1) << 4) - 16) * x[j] +
                  (((row[6 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16) * x[j + 16];
        s += fp16(row) * a->d[b] * (float)si;
    }
    return s;
}

/* Q4_K: a 256-element superblock is two 64-byte loads whose low and high
 * nibbles are sub-blocks (0,2) (1,3) (4,6) (5,7) in 256-bit halves; the
 * activations were regrouped to match (qk). Scale of sub-block j is
 * d*sc_j*dx_j; the mins contribute dmin*m_j*dx_j*sum(x_j), kept apart. */
AVX512_TARGET static float dot_q4_k_avx512(const uint8_t *row, const mdl_act_t *a)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i i02 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
    const __m512i i13 = _mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m512i i46 = _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6);
    const __m512i i57 = _mm512_setr_epi32(5, 5, 5, 5, 5, 5, 5, 5, 7, 7, 7, 7, 7, 7, 7, 7);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    __m256 mins = _mm256_setzero_ps();
    for (int b = 0; b < a->n / 256; b++, row += 144) {
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)row + MDL_PREFETCH_BYTES + 128, _MM_HINT_T0);
        /* the 8 six-bit scales and mins, four bytes at a time (notes §4.3) */
        uint32_t w0, w1, w2;
        memcpy(&w0, row + 4, 4);
        memcpy(&w1, row + 8, 4);
        memcpy(&w2, row + 12, 4);
        uint64_t sc = (uint64_t)(w0 & 0x3F3F3F3F) |
                      (uint64_t)((w2 & 0x0F0F0F0F) | ((w0 >> 6) & 0x03030303) << 4) << 32;
        uint64_t mn = (uint64_t)(w1 & 0x3F3F3F3F) |
                      (uint64_t)(((w2 >> 4) & 0x0F0F0F0F) | ((w1 >> 6) & 0x03030303) << 4) << 32;
        __m256 dx = _mm256_loadu_ps(a->d + 8 * b);
        __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
        __m256 mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
        __m256 s8 = _mm256_mul_ps(scf, _mm256_mul_ps(_mm256_set1_ps(fp16(row)), dx));
        mins = _mm256_fmadd_ps(
            _mm256_mul_ps(mnf, _mm256_mul_ps(_mm256_set1_ps(fp16(row + 2)), dx)),
            _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(a->qsum + 8 * b))), mins);
        __m512 S = _mm512_castps256_ps512(s8);
        __m512i v0 = _mm512_loadu_si512((const void *)(row + 16));
        __m512i v1 = _mm512_loadu_si512((const void *)(row + 80));
        const int8_t *x = a->qk + 256 * b;
        __m512i z = _mm512_setzero_si512();
        __m512i p0 =
            _mm512_dpbusd_epi32(z, _mm512_and_si512(v0, m4), _mm512_loadu_si512((const void *)x));
        __m512i p1 = _mm512_dpbusd_epi32(z, _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4),
                                         _mm512_loadu_si512((const void *)(x + 64)));
        __m512i p2 = _mm512_dpbusd_epi32(z, _mm512_and_si512(v1, m4),
                                         _mm512_loadu_si512((const void *)(x + 128)));
        __m512i p3 = _mm512_dpbusd_epi32(z, _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4),
                                         _mm512_loadu_si512((const void *)(x + 192)));
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_permutexvar_ps(i02, S), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_permutexvar_ps(i13, S), acc1);
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p2), _mm512_permutexvar_ps(i46, S), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p3), _mm512_permutexvar_ps(i57, S), acc1);
    }
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(mins), _mm256_extractf128_ps(mins, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) - _mm_cvtss_f32(m);
}

/* dot for four token vectors (the weight decoding shared): tiles of one
 * row, bit-identical to dot. */
AVX512_TARGET static void dot4_q8_0_avx512(const uint8_t *row, const mdl_act_t *a, float *out)
{
    q8_0_tile(row, 0, 1, a, 4, out);
}

AVX512_TARGET static void dot4_q4_0_avx512(const uint8_t *row, const mdl_act_t *a, float *out)
{
    q4_0_tile(row, 0, 1, a, 4, out);
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
    k->prep = prep_avx512;
    k->dot[MDL_T_Q8_0] = dot_q8_0_avx512;
    k->dot[MDL_T_Q4_0] = dot_q4_0_avx512;
    k->dot[MDL_T_Q5_0] = dot_q5_0_avx512;
    k->dot[MDL_T_Q4_K] = dot_q4_k_avx512;
    k->dot4[MDL_T_Q8_0] = dot4_q8_0_avx512;
    k->dot4[MDL_T_Q4_0] = dot4_q4_0_avx512;
    k->gemm[MDL_T_Q8_0] = gemm_q8_0_avx512;
    k->gemm[MDL_T_Q4_0] = gemm_q4_0_avx512;
    k->gemm_rp[MDL_T_Q8_0] = gemm_rp_q8_0_avx512;
    k->gemm_rp[MDL_T_Q4_0] = gemm_rp_q4_0_avx512;
    k->gemm_rp[MDL_T_Q4_K] = gemm_rp_q4_k_avx512;
    k->gemm_rp[MDL_T_Q5_0] = gemm_rp_q5_0_avx512;
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
