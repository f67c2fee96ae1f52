/*
 * quant.c — fp16 conversion, dequantisation, activation quantisation and the
 * portable scalar row kernels (the reference every SIMD kernel must agree
 * with), plus the run-time choice of kernel set (see quant_internal.h).
 */
#include "model/quant_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

float mdl_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in float */
        float f = (float)man * 0x1p-24f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

uint16_t mdl_f32_to_fp16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal */
        float a;
        memcpy(&a, &ax, 4);
        /* a * 2^24 is the subnormal mantissa; rintf rounds half to even */
        return (uint16_t)(sign | (uint16_t)rintf(a * 0x1p24f));
    }
    uint32_t e = (ax >> 23) - 112, m = ax & 0x7fffff;
    uint32_t h = (e << 10) | (m >> 13), rest = m & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++; /* may carry into the exponent, which is still correct */
    return (uint16_t)(sign | h);
}

int mdl_ttype_supported(uint32_t t)
{
    switch (t) {
    case MDL_T_F32:
    case MDL_T_F16:
    case MDL_T_Q8_0:
    case MDL_T_Q4_0:
    case MDL_T_Q5_0:
    case MDL_T_Q4_K:
    case MDL_T_Q6_K:
        return 1;
    default:
        return 0;
    }
}

/* ---- block decoders: integer levels and scales ---------------------- */

/* Q4_K: six-bit scale and min of sub-block j (0..7). */
static void q4k_scale_min(const uint8_t *sc, int j, int *s, int *m)
{
    if (j < 4) {
        *s = sc[j] & 63;
        *m = sc[j + 4] & 63;
    } else {
        *s = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
        *m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}

/* Q4_K block (144 bytes) -> 256 levels 0..15 in element order. */
static void q4k_levels(const uint8_t *b, uint8_t *q)
{
    const uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = qs[32 * c + l] & 0xF;
            q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
        }
}

/* Q6_K block (210 bytes) -> 256 signed levels -32..31 in element order. */
static void q6k_levels(const uint8_t *b, int8_t *q)
{
    const uint8_t *ql = b, *qh = b + 128;
    for (int n = 0; n < 2; n++) {
        const uint8_t *l0 = ql + 64 * n, *h0 = qh + 32 * n;
        int8_t *y = q + 128 * n;
        for (int l = 0; l < 32; l++) {
            y[l] = (int8_t)(((l0[l] & 0xF) | ((h0[l] >> 0) & 3) << 4) - 32);
            y[l + 32] = (int8_t)(((l0[l + 32] & 0xF) | ((h0[l] >> 2) & 3) << 4) - 32);
            y[l + 64] = (int8_t)(((l0[l] >> 4) | ((h0[l] >> 4) & 3) << 4) - 32);
            y[l + 96] = (int8_t)(((l0[l + 32] >> 4) | ((h0[l] >> 6) & 3) << 4) - 32);
        }
    }
}

/* Q5_0 block (22 bytes) -> 32 signed levels -16..15. */
static void q50_levels(const uint8_t *b, int8_t *q)
{
    uint32_t qh =
        (uint32_t)b[2] | (uint32_t)b[3] << 8 | (uint32_t)b[4] << 16 | (uint32_t)b[5] << 24;
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(((qs[j] & 0xF) | ((qh >> j) & 1) << 4) - 16);
        q[j + 16] = (int8_t)(((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
    }
}

int mdl_dequant_row(uint32_t t, const void *src, float *dst, int64_t n)
{
    const uint8_t *p = src;
    switch (t) {
    case MDL_T_F32:
        memcpy(dst, p, (size_t)n * 4);
        return 0;
    case MDL_T_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = mdl_fp16_to_f32(mdl_rd16(p + 2 * i));
        return 0;
    case MDL_T_Q8_0:
        for (int64_t b = 0; b < n / 32; b++, p += 34) {
            float d = mdl_fp16_to_f32(mdl_rd16(p));
            for (int j = 0; j < 32; j++)
                dst[32 * b + j] = d * (float)(int8_t)p[2 + j];
        }
        return 0;
    case MDL_T_Q4_0:
        for (int64_t b = 0; b < n / 32; b++, p += 18) {
            float d = mdl_fp16_to_f32(mdl_rd16(p));
            for (int j = 0; j < 16; j++) {
                dst[32 * b + j] = d * (float)((p[2 + j] & 0xF) - 8);
                dst[32 * b + j + 16] = d * (float)((p[2 + j] >> 4) - 8);
            }
        }
        return 0;
    case MDL_T_Q5_0:
        for (int64_t b = 0; b < n / 32; b++, p += 22) {
            float d = mdl_fp16_to_f32(mdl_rd16(p));
            int8_t q[32];
            q50_levels(p, q);
            for (int j = 0; j < 32; j++)
                dst[32 * b + j] = d * (float)q[j];
        }
        return 0;
    case MDL_T_Q4_K:
        for (int64_t b = 0; b < n / 256; b++, p += 144) {
            float d = mdl_fp16_to_f32(mdl_rd16(p)), dmin = mdl_fp16_to_f32(mdl_rd16(p + 2));
            uint8_t q[256];
            q4k_levels(p, q);
            for (int s = 0; s < 8; s++) {
                int sc, m;
                q4k_scale_min(p + 4, s, &sc, &m);
                float ds = d * (float)sc, dm = dmin * (float)m;
                for (int l = 0; l < 32; l++)
                    dst[256 * b + 32 * s + l] = ds * (float)q[32 * s + l] - dm;
            }
        }
        return 0;
    case MDL_T_Q6_K:
        for (int64_t b = 0; b < n / 256; b++, p += 210) {
            float d = mdl_fp16_to_f32(mdl_rd16(p + 208));
            int8_t q[256];
            q6k_levels(p, q);
            for (int e = 0; e < 256; e++)
                dst[256 * b + e] = d * (float)(int8_t)p[192 + e / 16] * (float)q[e];
        }
        return 0;
    default:
        return -1;
    }
}

/* ---- activation quantization ---------------------------------------- */

void mdl_quantize_scalar(const float *x, int n, int8_t *q, float *d, int32_t *qsum)
{
    for (int b = 0; b < n / MDL_QK; b++) {
        const float *xb = x + MDL_QK * b;
        float amax = 0.0f;
        for (int j = 0; j < MDL_QK; j++) {
            float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        float db = amax / 127.0f;
        float id = db != 0.0f ? 1.0f / db : 0.0f;
        int32_t s = 0;
        for (int j = 0; j < MDL_QK; j++) {
            /* clamp in float: converting NaN or a huge value to int is
             * undefined (a hostile file can hold NaN weights). NaN goes to
             * -127, which is what the SIMD conversion's INT_MIN clamps to. */
            float r = rintf(xb[j] * id);
            r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
            int v = r == r ? (int)r : -127;
            q[MDL_QK * b + j] = (int8_t)v;
            s += v;
        }
        d[b] = db;
        qsum[b] = s;
    }
}

void mdl_act_bind_extra(mdl_act_t *a, uint8_t *buf)
{
    size_t n = (size_t)a->n, r = (n + 63) / 64 * 64;
    a->c128 = (int32_t *)(void *)buf;         /* n/4 int32 = n bytes */
    a->qp = (int8_t *)(buf + r);              /* n bytes */
    a->qk = (int8_t *)(buf + 2 * r);          /* n bytes */
    a->c8 = (int32_t *)(void *)(buf + 3 * r); /* n/8 int32 = n/2 bytes */
}

void mdl_act_interleave(mdl_act_t *a, int nb, uint8_t *buf)
{
    int nblk = a[0].n / 32;
    for (int t0 = 0; t0 < nb; t0 += 8) {
        uint8_t *c = buf + (size_t)(t0 / 8) * nblk * MDL_IL_BLK;
        for (int t = t0; t < nb && t < t0 + 8; t++) {
            int j = t - t0;
            for (int b = 0; b < nblk; b++) {
                uint8_t *p = c + (size_t)b * MDL_IL_BLK;
                int32_t s = a[t].qsum[b], o[3] = {-128 * s, -16 * s, -8 * s};
                memcpy(p + 32 * j, a[t].q + 32 * b, 32);
                memcpy(p + MDL_IL_D + 4 * j, &a[t].d[b], 4);
                memcpy(p + MDL_IL_O128 + 4 * j, &o[0], 4);
                memcpy(p + MDL_IL_O16 + 4 * j, &o[1], 4);
                memcpy(p + MDL_IL_O8 + 4 * j, &o[2], 4);
            }
            a[t].il = j == 0 ? c : NULL;
        }
    }
}

/* ---- scalar row kernels --------------------------------------------- */

static float dot_f32_f32(const uint8_t *row, const mdl_act_t *a)
{
    float acc = 0.0f;
    for (int i = 0; i < a->n; i++) {
        float w;
        memcpy(&w, row + 4 * i, 4);
        acc += w * a->x[i];
    }
    return acc;
}

static float dot_f16_f32(const uint8_t *row, const mdl_act_t *a)
{
    float acc = 0.0f;
    for (int i = 0; i < a->n; i++)
        acc += mdl_fp16_to_f32(mdl_rd16(row + 2 * i)) * a->x[i];
    return acc;
}

/* Precise path for block formats: dequantize a block, dot in float. */
#define DEFINE_DOT_DEQUANT(NAME, TYPE, BLK, BYTES)                                                 \
    static float NAME(const uint8_t *row, const mdl_act_t *a)                                      \
    {                                                                                              \
        float tmp[BLK], acc = 0.0f;                                                                \
        for (int b = 0; b < a->n / (BLK); b++) {                                                   \
            if (mdl_dequant_row(TYPE, row + (size_t)b * (BYTES), tmp, BLK) != 0)                   \
                return 0.0f;                                                                       \
            const float *x = a->x + (size_t)b * (BLK);                                             \
            float s = 0.0f;                                                                        \
            for (int j = 0; j < (BLK); j++)                                                        \
                s += tmp[j] * x[j];                                                                \
            acc += s;                                                                              \
        }                                                                                          \
        return acc;                                                                                \
    }
DEFINE_DOT_DEQUANT(dotf_q8_0, MDL_T_Q8_0, 32, 34)
DEFINE_DOT_DEQUANT(dotf_q4_0, MDL_T_Q4_0, 32, 18)
DEFINE_DOT_DEQUANT(dotf_q5_0, MDL_T_Q5_0, 32, 22)
DEFINE_DOT_DEQUANT(dotf_q4_k, MDL_T_Q4_K, 256, 144)
DEFINE_DOT_DEQUANT(dotf_q6_k, MDL_T_Q6_K, 256, 210)

static float dotq_q8_0(const uint8_t *row, const mdl_act_t *a)
{
    float acc = 0.0f;
    for (int b = 0; b < a->n / 32; b++, row += 34) {
        const int8_t *w = (const int8_t *)row + 2, *x = a->q + 32 * b;
        int32_t s = 0;
        for (int j = 0; j < 32; j++)
            s += w[j] * x[j];
        acc += mdl_fp16_to_f32(mdl_rd16(row)) * a->d[b] * (float)s;
    }
    return acc;
}

static float dotq_q4_0(const uint8_t *row, const mdl_act_t *a)
{
    float acc = 0.0f;
    for (int b = 0; b < a->n / 32; b++, row += 18) {
        const int8_t *x = a->q + 32 * b;
        int32_t s = 0;
        for (int j = 0; j < 16; j++)
            s += ((row[2 + j] & 0xF) - 8) * x[j] + ((row[2 + j] >> 4) - 8) * x[j + 16];
        acc += mdl_fp16_to_f32(mdl_rd16(row)) * a->d[b] * (float)s;
    }
    return acc;
}

static float dotq_q5_0(const uint8_t *row, const mdl_act_t *a)
{
    float acc = 0.0f;
    for (int b = 0; b < a->n / 32; b++, row += 22) {
        int8_t q[32];
        q50_levels(row, q);
        const int8_t *x = a->q + 32 * b;
        int32_t s = 0;
        for (int j = 0; j < 32; j++)
            s += q[j] * x[j];
        acc += mdl_fp16_to_f32(mdl_rd16(row)) * a->d[b] * (float)s;
    }
    return acc;
}

/* Q4_K: x = d*sc*q - dmin*m, so per sub-block of 32 the dot with int8
 * activations is ad * (d*sc*sum(q*a) - dmin*m*sum(a)). */
static float dotq_q4_k(const uint8_t *row, const mdl_act_t *a)
{
    float acc = 0.0f;
    for (int b = 0; b < a->n / 256; b++, row += 144) {
        float d = mdl_fp16_to_f32(mdl_rd16(row)), dmin = mdl_fp16_to_f32(mdl_rd16(row + 2));
        uint8_t q[256];
        q4k_levels(row, q);
        for (int s = 0; s < 8; s++) {
            int sc, m, ab = 8 * b + s;
            q4k_scale_min(row + 4, s, &sc, &m);
            const int8_t *x = a->q + 32 * ab;
            int32_t si = 0;
            for (int l = 0; l < 32; l++)
                si += q[32 * s + l] * x[l];
            acc += a->d[ab] * (d * (float)sc * (float)si - dmin * (float)m * (float)a->qsum[ab]);
        }
    }
    return acc;
}

/* Q6_K: x = d*scale[e/16]*q; one activation scale covers two sub-scales. */
static float dotq_q6_k(const uint8_t *row, const mdl_act_t *a)
{
    float acc = 0.0f;
    for (int b = 0; b < a->n / 256; b++, row += 210) {
        float d = mdl_fp16_to_f32(mdl_rd16(row + 208));
        const int8_t *sc = (const int8_t *)row + 192;
        int8_t q[256];
        q6k_levels(row, q);
        for (int s = 0; s < 8; s++) {
            int ab = 8 * b + s;
            const int8_t *x = a->q + 32 * ab;
            int32_t s0 = 0, s1 = 0;
            for (int l = 0; l < 16; l++) {
                s0 += q[32 * s + l] * x[l];
                s1 += q[32 * s + 16 + l] * x[16 + l];
            }
            acc += a->d[ab] * d * (float)(sc[2 * s] * s0 + sc[2 * s + 1] * s1);
        }
    }
    return acc;
}

/* ---- repacked weights (rp16, see quant_internal.h) ------------------ */

static size_t rp_qbytes(uint32_t t)
{
    /* Q5_0: the Q4_0 nibbles, then 8 64-bit masks of the fifth bits */
    return t == MDL_T_Q8_0 ? 512 : t == MDL_T_Q4_0 ? 256 : t == MDL_T_Q5_0 ? 320 : 0;
}

size_t mdl_rp_group_bytes(uint32_t t, int n_in)
{
    if (t == MDL_T_Q4_K)
        return n_in > 0 && n_in % 256 == 0 ? (size_t)n_in / 256 * MDL_RP_K4_BYTES : 0;
    if (!rp_qbytes(t) || n_in <= 0 || n_in % 32)
        return 0;
    size_t nblk = (size_t)n_in / 32;
    return (nblk + 1) / 2 * 64 + nblk * rp_qbytes(t);
}

/* Q4_K: per superblock of 256, the 16 rows' d and dmin, their 8 six-bit
 * scales and mins as bytes (sub-block major), then the nibbles as they lie
 * in each row (4 bytes per lane; low nibbles sub-block 2c, high 2c+1). */
static void rp_pack_q4k(const uint8_t *w, size_t rb, int n_rows, int n_in, uint8_t *dst)
{
    size_t gb = mdl_rp_group_bytes(MDL_T_Q4_K, n_in);
    int nsb = n_in / 256, ng = (n_rows + MDL_RP_ROWS - 1) / MDL_RP_ROWS;
    memset(dst, 0, gb * (size_t)ng); /* padding rows: d = 0, scales 0 */
    for (int r = 0; r < n_rows; r++) {
        int i = r % MDL_RP_ROWS;
        uint8_t *G = dst + gb * (size_t)(r / MDL_RP_ROWS);
        for (int b = 0; b < nsb; b++) {
            const uint8_t *blk = w + rb * (size_t)r + 144 * (size_t)b;
            uint8_t *S = G + MDL_RP_K4_BYTES * (size_t)b;
            memcpy(S + MDL_RP_K4_D + 2 * i, blk, 2);
            memcpy(S + MDL_RP_K4_DMIN + 2 * i, blk + 2, 2);
            for (int sb = 0; sb < 8; sb++) {
                int sc, m;
                q4k_scale_min(blk + 4, sb, &sc, &m);
                S[MDL_RP_K4_SC + 16 * sb + i] = (uint8_t)sc;
                S[MDL_RP_K4_M + 16 * sb + i] = (uint8_t)m;
            }
            for (int c = 0; c < 4; c++)
                for (int k = 0; k < 8; k++)
                    memcpy(S + MDL_RP_K4_Q + 512 * c + 64 * k + 4 * i, blk + 16 + 32 * c + 4 * k,
                           4);
        }
    }
}

/* Q4_K reference: per sub-block s, in order,
 *   acc = fmaf(isum, (d * sc) * dx, acc); acc = fmaf(-((dmin * m) * dx), qsum, acc) */
static float rp_ref_q4k(const uint8_t *G, int i, const mdl_act_t *a)
{
    float acc = 0.0f;
    for (int b = 0; b < a->n / 256; b++) {
        const uint8_t *S = G + MDL_RP_K4_BYTES * (size_t)b;
        float d = mdl_fp16_to_f32(mdl_rd16(S + MDL_RP_K4_D + 2 * i));
        float dmin = mdl_fp16_to_f32(mdl_rd16(S + MDL_RP_K4_DMIN + 2 * i));
        for (int sb = 0; sb < 8; sb++) {
            int ab = 8 * b + sb;
            const int8_t *x = a->q + 32 * ab;
            const uint8_t *Q = S + MDL_RP_K4_Q + 512 * (sb / 2);
            int32_t isum = 0;
            for (int k = 0; k < 8; k++)
                for (int m = 0; m < 4; m++) {
                    uint8_t v = Q[64 * k + 4 * i + m];
                    isum += ((sb & 1) ? v >> 4 : v & 0xF) * x[4 * k + m];
                }
            float scf = d * (float)S[MDL_RP_K4_SC + 16 * sb + i];
            float mnf = dmin * (float)S[MDL_RP_K4_M + 16 * sb + i];
            acc = fmaf((float)isum, scf * a->d[ab], acc);
            acc = fmaf(-(mnf * a->d[ab]), (float)a->qsum[ab], acc);
        }
    }
    return acc;
}

void mdl_rp_pack(uint32_t t, const uint8_t *w, size_t rb, int n_rows, int n_in, uint8_t *dst)
{
    if (t == MDL_T_Q4_K) {
        if (mdl_rp_group_bytes(t, n_in))
            rp_pack_q4k(w, rb, n_rows, n_in, dst);
        return;
    }
    size_t gb = mdl_rp_group_bytes(t, n_in), qb = rp_qbytes(t);
    size_t bb = t == MDL_T_Q8_0 ? 34 : t == MDL_T_Q5_0 ? 22 : 18;
    int nblk = n_in / 32, ng = (n_rows + MDL_RP_ROWS - 1) / MDL_RP_ROWS;
    if (!gb)
        return;
    memset(dst, 0, gb * (size_t)ng);
    for (int g = 0; g < ng; g++) {
        uint8_t *G = dst + gb * (size_t)g;
        for (int i = 0; i < MDL_RP_ROWS; i++) {
            int r = g * MDL_RP_ROWS + i;
            for (int b = 0; b < nblk; b++) {
                uint8_t *sc = G + MDL_RP_SCALE_OFF(b, qb) + 2 * i, *qs = G + MDL_RP_Q_OFF(b, qb);
                if (r >= n_rows) {
                    /* padding row: scale 0, levels 0 (Q8_0 stores +128) */
                    if (t == MDL_T_Q8_0)
                        for (int k = 0; k < 8; k++)
                            memset(qs + 64 * k + 4 * i, 0x80, 4);
                    continue;
                }
                const uint8_t *blk = w + rb * (size_t)r + bb * (size_t)b;
                memcpy(sc, blk, 2);
                if (t == MDL_T_Q8_0) {
                    for (int k = 0; k < 8; k++)
                        for (int m = 0; m < 4; m++)
                            qs[64 * k + 4 * i + m] = (uint8_t)(blk[2 + 4 * k + m] ^ 0x80);
                } else if (t == MDL_T_Q5_0) {
                    /* mask k (lo, elements 4k..) and 4+k (hi, 16+4k..): bit
                     * 4i+m is the fifth bit of lane i's byte m */
                    uint32_t qh = (uint32_t)blk[2] | (uint32_t)blk[3] << 8 |
                                  (uint32_t)blk[4] << 16 | (uint32_t)blk[5] << 24;
                    for (int k = 0; k < 4; k++) {
                        memcpy(qs + 64 * k + 4 * i, blk + 6 + 4 * k, 4);
                        for (int m = 0; m < 4; m++) {
                            int bit = 4 * i + m;
                            qs[256 + 8 * k + bit / 8] |=
                                (uint8_t)(((qh >> (4 * k + m)) & 1) << (bit % 8));
                            qs[256 + 8 * (4 + k) + bit / 8] |=
                                (uint8_t)(((qh >> (16 + 4 * k + m)) & 1) << (bit % 8));
                        }
                    }
                } else {
                    for (int k = 0; k < 4; k++)
                        memcpy(qs + 64 * k + 4 * i, blk + 2 + 4 * k, 4);
                }
            }
        }
    }
}

void mdl_gemm_rp_ref(uint32_t t, const uint8_t *w, size_t gstride, int n_rows, const mdl_act_t *a,
                     int nb, float *out, size_t ostride, const float *bias, int accumulate)
{
    int nblk = a[0].n / 32;
    size_t qb = rp_qbytes(t);
    for (int r = 0; r < n_rows; r++) {
        const uint8_t *G = w + gstride * (size_t)(r / MDL_RP_ROWS);
        int i = r % MDL_RP_ROWS;
        for (int tk = 0; tk < nb; tk++) {
            const int8_t *x = a[tk].q;
            float acc = 0.0f;
            if (t == MDL_T_Q4_K)
                acc = rp_ref_q4k(G, i, &a[tk]);
            else
                for (int b = 0; b < nblk; b++) {
                    const uint8_t *qs = G + MDL_RP_Q_OFF(b, qb);
                    int32_t isum;
                    if (t == MDL_T_Q8_0) {
                        /* what vpdpbusd computes: unsigned weight x signed x,
                         * started at -128 * sum(x) */
                        isum = -128 * a[tk].qsum[b];
                        for (int k = 0; k < 8; k++)
                            for (int m = 0; m < 4; m++)
                                isum += qs[64 * k + 4 * i + m] * x[32 * b + 4 * k + m];
                    } else if (t == MDL_T_Q5_0) {
                        isum = -16 * a[tk].qsum[b];
                        for (int k = 0; k < 4; k++)
                            for (int m = 0; m < 4; m++) {
                                uint8_t v = qs[64 * k + 4 * i + m];
                                int bit = 4 * i + m;
                                int hl = (qs[256 + 8 * k + bit / 8] >> (bit % 8)) & 1;
                                int hh = (qs[256 + 8 * (4 + k) + bit / 8] >> (bit % 8)) & 1;
                                isum += ((v & 0xF) | hl << 4) * x[32 * b + 4 * k + m] +
                                        ((v >> 4) | hh << 4) * x[32 * b + 16 + 4 * k + m];
                            }
                    } else {
                        isum = -8 * a[tk].qsum[b];
                        for (int k = 0; k < 4; k++)
                            for (int m = 0; m < 4; m++) {
                                uint8_t v = qs[64 * k + 4 * i + m];
                                isum += (v & 0xF) * x[32 * b + 4 * k + m] +
                                        (v >> 4) * x[32 * b + 16 + 4 * k + m];
                            }
                    }
                    float dw = mdl_fp16_to_f32(mdl_rd16(G + MDL_RP_SCALE_OFF(b, qb) + 2 * i));
                    acc = fmaf((float)isum, dw * a[tk].d[b], acc);
                }
            float v = bias ? acc + bias[r] : acc;
            float *o = out + (size_t)tk * ostride + r;
            *o = accumulate ? *o + v : v;
        }
    }
}

static float vdot_scalar(const float *a, const float *b, int n)
{
    float acc = 0.0f;
    for (int i = 0; i < n; i++)
        acc += a[i] * b[i];
    return acc;
}

static void vaxpy_scalar(float *y, float a, const float *x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

const mdl_kernels_t mdl_kernels_scalar = {
    .name = "scalar",
    .level = MDL_KL_SCALAR,
    .quantize = mdl_quantize_scalar,
    .dot =
        {
            [MDL_T_F32] = dot_f32_f32,
            [MDL_T_F16] = dot_f16_f32,
            [MDL_T_Q8_0] = dotq_q8_0,
            [MDL_T_Q4_0] = dotq_q4_0,
            [MDL_T_Q5_0] = dotq_q5_0,
            [MDL_T_Q4_K] = dotq_q4_k,
            [MDL_T_Q6_K] = dotq_q6_k,
        },
    .dot_f =
        {
            [MDL_T_F32] = dot_f32_f32,
            [MDL_T_F16] = dot_f16_f32,
            [MDL_T_Q8_0] = dotf_q8_0,
            [MDL_T_Q4_0] = dotf_q4_0,
            [MDL_T_Q5_0] = dotf_q5_0,
            [MDL_T_Q4_K] = dotf_q4_k,
            [MDL_T_Q6_K] = dotf_q6_k,
        },
    .vdot = vdot_scalar,
    .vaxpy = vaxpy_scalar,
};

/* ---- run-time selection --------------------------------------------- */

static mdl_kernels_t k_avx2, k_avx512;
static int k_avx2_ok, k_avx512_ok;
static pthread_once_t k_once = PTHREAD_ONCE_INIT;

int mdl_kernels_cpu_level(void)
{
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    /* F16C has no __builtin_cpu_supports name in gcc 12; every AVX2 CPU
     * has it (it came with Ivy Bridge / Piledriver). */
    if (!avx2)
        return MDL_KL_SCALAR;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        return MDL_KL_AVX512;
    return MDL_KL_AVX2;
}

static void kernels_init(void)
{
    int lvl = mdl_kernels_cpu_level();
    k_avx2 = mdl_kernels_scalar;
    k_avx2_ok = lvl >= MDL_KL_AVX2 && mdl_kernels_init_avx2(&k_avx2) == 0;
    k_avx512 = k_avx2;
    k_avx512_ok = k_avx2_ok && lvl >= MDL_KL_AVX512 && mdl_kernels_init_avx512(&k_avx512) == 0;
}

int mdl_klevel_parse(const char *s)
{
    if (!strcasecmp(s, "scalar"))
        return MDL_KL_SCALAR;
    if (!strcasecmp(s, "avx2"))
        return MDL_KL_AVX2;
    if (!strcasecmp(s, "avx512") || !strcasecmp(s, "auto"))
        return MDL_KL_AVX512;
    return -1;
}

const mdl_kernels_t *mdl_kernels_select(int max_level)
{
    pthread_once(&k_once, kernels_init);
    const char *env = getenv("SLUICE_MDL_KERNELS");
    if (env && *env) {
        int e = mdl_klevel_parse(env);
        if (e >= 0 && e < max_level)
            max_level = e;
    }
    if (max_level >= MDL_KL_AVX512 && k_avx512_ok)
        return &k_avx512;
    if (max_level >= MDL_KL_AVX2 && k_avx2_ok)
        return &k_avx2;
    return &mdl_kernels_scalar;
}
