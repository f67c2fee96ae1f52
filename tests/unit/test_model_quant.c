/*
 * test_model_quant.c — the block formats and row kernels: fp16 edge cases,
 * one hand-built block of every type with values worked out by hand from
 * the format description (so the engine and the NumPy reference cannot
 * share a misreading), activation quantization bit-identical across kernel
 * levels, and every dot kernel (fast and precise, every level this CPU
 * has) against a float64 computation on random rows.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/quant_internal.h"

static uint64_t rng_state = 88172645463325252ULL;

static uint32_t rnd32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static float rndf(void) /* uniform in [-1, 1) */
{
    return (float)((double)rnd32() / 2147483648.0 - 1.0);
}

static void wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void test_fp16(void **state)
{
    (void)state;
    assert_true(mdl_fp16_to_f32(0x3C00) == 1.0f);
    assert_true(mdl_fp16_to_f32(0xC000) == -2.0f);
    assert_true(mdl_fp16_to_f32(0x3800) == 0.5f);
    assert_true(mdl_fp16_to_f32(0x7BFF) == 65504.0f);
    assert_true(mdl_fp16_to_f32(0x0001) == ldexpf(1.0f, -24)); /* smallest subnormal */
    assert_true(mdl_fp16_to_f32(0x03FF) == 1023.0f * ldexpf(1.0f, -24));
    assert_true(mdl_fp16_to_f32(0x0400) == ldexpf(1.0f, -14)); /* smallest normal */
    assert_true(isinf(mdl_fp16_to_f32(0x7C00)) && mdl_fp16_to_f32(0x7C00) > 0);
    assert_true(isinf(mdl_fp16_to_f32(0xFC00)) && mdl_fp16_to_f32(0xFC00) < 0);
    assert_true(isnan(mdl_fp16_to_f32(0x7E00)));
    float nz = mdl_fp16_to_f32(0x8000);
    assert_true(nz == 0.0f && signbit(nz));
    /* Every finite half survives a round trip through float. */
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF))
            continue; /* NaN payloads */
        assert_int_equal(mdl_f32_to_fp16(mdl_fp16_to_f32((uint16_t)h)), h);
    }
    /* Rounding: halfway cases go to even, overflow to inf, tiny to zero. */
    assert_int_equal(mdl_f32_to_fp16(1.0f + ldexpf(1.0f, -11)), 0x3C00);     /* tie, even down */
    assert_int_equal(mdl_f32_to_fp16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3C02); /* tie, even up */
    assert_int_equal(mdl_f32_to_fp16(65520.0f), 0x7C00);
    assert_int_equal(mdl_f32_to_fp16(65519.0f), 0x7BFF);
    assert_int_equal(mdl_f32_to_fp16(ldexpf(1.0f, -26)), 0x0000);
    assert_int_equal(mdl_f32_to_fp16(3 * ldexpf(1.0f, -25)), 0x0002); /* 1.5 ulp -> 2 (even) */
}

static void test_block_q8_0(void **state)
{
    (void)state;
    uint8_t b[34];
    wr16(b, 0x3800); /* d = 0.5 */
    for (int j = 0; j < 32; j++)
        b[2 + j] = (uint8_t)(int8_t)(j * 8 - 128); /* -128, -120, ..., 120 */
    float y[32];
    assert_int_equal(mdl_dequant_row(MDL_T_Q8_0, b, y, 32), 0);
    assert_true(y[0] == -64.0f);
    assert_true(y[16] == 0.0f);
    assert_true(y[31] == 60.0f);
}

static void test_block_q4_0(void **state)
{
    (void)state;
    uint8_t b[18];
    wr16(b, 0x4000); /* d = 2 */
    for (int j = 0; j < 16; j++)
        b[2 + j] = (uint8_t)(j | (15 - j) << 4);
    float y[32];
    assert_int_equal(mdl_dequant_row(MDL_T_Q4_0, b, y, 32), 0);
    /* element j = low nibble of byte j, element j+16 = its high nibble */
    assert_true(y[0] == -16.0f);  /* 2 * (0 - 8) */
    assert_true(y[15] == 14.0f);  /* 2 * (15 - 8) */
    assert_true(y[16] == 14.0f);  /* 2 * (15 - 8) */
    assert_true(y[31] == -16.0f); /* 2 * (0 - 8) */
    assert_true(y[5] == -6.0f);
    assert_true(y[21] == 4.0f); /* byte 5 high nibble = 10 */
}

static void test_block_q5_0(void **state)
{
    (void)state;
    uint8_t b[22] = {0};
    wr16(b, 0x3C00); /* d = 1 */
    uint32_t qh = 1u | 1u << 17 | 1u << 31;
    memcpy(b + 2, &qh, 4); /* little-endian host */
    b[6 + 1] = 0x3A;       /* byte 1: low 0xA, high 0x3 */
    b[6 + 15] = 0xF0;      /* byte 15: low 0, high 0xF */
    float y[32];
    assert_int_equal(mdl_dequant_row(MDL_T_Q5_0, b, y, 32), 0);
    assert_true(y[0] == 0.0f);   /* 0 | 16 - 16 */
    assert_true(y[1] == -6.0f);  /* 0xA - 16 */
    assert_true(y[2] == -16.0f); /* 0 - 16 */
    assert_true(y[17] == 3.0f);  /* 0x3 | 16 - 16 */
    assert_true(y[31] == 15.0f); /* 0xF | 16 - 16 */
    assert_true(y[15] == -16.0f);
}

static void test_block_q4_k(void **state)
{
    (void)state;
    uint8_t b[144] = {0};
    wr16(b, 0x3C00);     /* d = 1 */
    wr16(b + 2, 0x3800); /* dmin = 0.5 */
    uint8_t *sc = b + 4;
    /* sub-block 0: scale 5, min 3; sub-block 1: scale 63, min 0 */
    sc[0] = 5;
    sc[4] = 3;
    sc[1] = 63;
    /* sub-block 4: scale = (sc[8] & 15) | (sc[0] >> 6) << 4 = 2 | 1<<4 = 18,
     *              min   = (sc[8] >> 4) | (sc[4] >> 6) << 4 = 7 | 2<<4 = 39 */
    sc[0] |= 1 << 6;
    sc[4] |= 2 << 6;
    sc[8] = 2 | 7 << 4;
    /* sub-block 7: scale = (sc[11] & 15) | (sc[3] >> 6) << 4 = 1 | 3<<4 = 49,
     *              min   = (sc[11] >> 4) | (sc[7] >> 6) << 4 = 0 */
    sc[3] = 3 << 6;
    sc[11] = 1;
    uint8_t *qs = b + 16;
    qs[0] = 0x9 | 0x4 << 4; /* chunk 0: element 0 (sb0) = 9, element 32 (sb1) = 4 */
    qs[64 + 3] = 0x7;       /* chunk 2: element 128+3 (sb4) = 7 */
    qs[96 + 31] = 0xF << 4; /* chunk 3: element 192+32+31 = 255 (sb7) = 15 */
    float y[256];
    assert_int_equal(mdl_dequant_row(MDL_T_Q4_K, b, y, 256), 0);
    assert_true(y[0] == 5.0f * 9 - 0.5f * 3);
    assert_true(y[1] == -0.5f * 3);
    assert_true(y[32] == 63.0f * 4);
    assert_true(y[128 + 3] == 18.0f * 7 - 0.5f * 39);
    assert_true(y[128] == -0.5f * 39);
    assert_true(y[255] == 49.0f * 15);
    assert_true(y[224] == 0.0f);
}

static void test_block_q6_k(void **state)
{
    (void)state;
    uint8_t b[210] = {0};
    uint8_t *ql = b, *qh = b + 128;
    int8_t *sc = (int8_t *)b + 192;
    wr16(b + 208, 0x3400); /* d = 0.25 */
    for (int k = 0; k < 16; k++)
        sc[k] = (int8_t)(k + 1) * (k % 2 ? -1 : 1); /* 1, -2, 3, -4, ... */
    /* first half, l = 0: y[0] low nibble of ql[0] + qh bits 0-1,
     * y[64] high nibble of ql[0] + qh bits 4-5 */
    ql[0] = 0x5 | 0xC << 4;
    qh[0] = 2 | 1 << 4;
    /* first half, l = 20 (second 16-group): y[52] = ql[52] low + qh[20] bits 2-3 */
    ql[52] = 0xF;
    qh[20] = 3 << 2;
    /* second half, l = 31: y[128+127] = ql[64+63] high + qh[32+31] bits 6-7 */
    ql[127] = 0xA << 4;
    qh[63] = 1 << 6;
    float y[256];
    assert_int_equal(mdl_dequant_row(MDL_T_Q6_K, b, y, 256), 0);
    /* y[0]: q = 5 | 2<<4 = 37 -> 5; scale index 0 (1) */
    assert_true(y[0] == 0.25f * 1 * 5);
    /* y[64]: q = 0xC | 1<<4 = 28 -> -4; scale index l/16 + 4 = 4 (5) */
    assert_true(y[64] == 0.25f * 5 * -4);
    /* y[52]: l = 20 -> group 1 (scale index 1 + 2 = 3, value -4); q = 15 | 3<<4 = 63 -> 31 */
    assert_true(y[52] == 0.25f * -4 * 31);
    /* y[255]: second half, l = 31: scale index 8 + 1 + 6 = 15 (-16); q = 10 | 1<<4 = 26 -> -6 */
    assert_true(y[255] == 0.25f * -16 * -6);
    /* an untouched element: q = 0 - 32 = -32 */
    assert_true(y[1] == 0.25f * 1 * -32);
    assert_int_equal(mdl_dequant_row(MDL_T_Q4_1, b, y, 32), -1);
}

static const mdl_kernels_t *levels[3];
static int n_levels;

static int setup(void **state)
{
    (void)state;
    n_levels = 0;
    for (int l = MDL_KL_SCALAR; l <= mdl_kernels_cpu_level(); l++)
        levels[n_levels++] = mdl_kernels_select(l);
    return 0;
}

static void test_levels_distinct(void **state)
{
    (void)state;
    assert_string_equal(levels[0]->name, "scalar");
    for (int i = 1; i < n_levels; i++)
        assert_int_equal(levels[i]->level, i);
    print_message("kernel levels on this CPU: %d (best %s)\n", n_levels,
                  levels[n_levels - 1]->name);
}

static void test_quantize_identical(void **state)
{
    (void)state;
    enum { N = 32 * 64 };
    float x[N];
    for (int i = 0; i < N; i++)
        x[i] = rndf() * (float)(1 + i % 7);
    for (int j = 0; j < 32; j++)
        x[j] = 0.0f; /* an all-zero block */
    /* a block of exact ties: max 127 -> d = 1, so x*id = k + 0.5 */
    for (int j = 0; j < 32; j++)
        x[32 + j] = j == 0 ? 127.0f : (float)(j - 16) + 0.5f;
    int8_t q0[N], q1[N];
    float d0[N / 32], d1[N / 32];
    int32_t s0[N / 32], s1[N / 32];
    mdl_quantize_scalar(x, N, q0, d0, s0);
    assert_int_equal(q0[32 + 1], -14); /* -14.5 -> -14 (even) */
    assert_int_equal(q0[32 + 2], -14); /* -13.5 -> -14 */
    assert_int_equal(d0[0], 0);
    for (int l = 1; l < n_levels; l++) {
        levels[l]->quantize(x, N, q1, d1, s1);
        assert_memory_equal(q0, q1, sizeof(q0));
        assert_memory_equal(d0, d1, sizeof(d0));
        assert_memory_equal(s0, s1, sizeof(s0));
    }
    for (int b = 0; b < N / 32; b++) {
        int32_t s = 0;
        for (int j = 0; j < 32; j++)
            s += q0[32 * b + j];
        assert_int_equal(s, s0[b]);
    }
}

/* A random row of type t with n elements and sane fp16 scales. */
static uint8_t *random_row(uint32_t t, int n)
{
    uint32_t blk = mdl_ttype_block(t), bs = mdl_ttype_bytes(t);
    size_t bytes = (size_t)n / blk * bs;
    uint8_t *r = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        r[i] = (uint8_t)rnd32();
    for (int b = 0; b < (int)(n / blk); b++) {
        uint8_t *p = r + (size_t)b * bs;
        switch (t) {
        case MDL_T_F32:
            for (uint32_t i = 0; i < bs; i += 4) {
                float f = rndf();
                memcpy(p, &f, 4);
            }
            break;
        case MDL_T_F16:
            wr16(p, mdl_f32_to_fp16(rndf()));
            break;
        case MDL_T_Q8_0:
        case MDL_T_Q4_0:
        case MDL_T_Q5_0:
            wr16(p, mdl_f32_to_fp16(0.001f + 0.02f * fabsf(rndf())));
            break;
        case MDL_T_Q4_K:
            wr16(p, mdl_f32_to_fp16(0.001f + 0.01f * fabsf(rndf())));
            wr16(p + 2, mdl_f32_to_fp16(0.001f + 0.01f * fabsf(rndf())));
            break;
        case MDL_T_Q6_K:
            wr16(p + 208, mdl_f32_to_fp16(0.0005f + 0.002f * fabsf(rndf())));
            break;
        }
    }
    return r;
}

static void check_close(double got, double want, double scale, const char *what, uint32_t t,
                        const char *lvl)
{
    double tol = 1e-5 * scale + 1e-6;
    if (fabs(got - want) > tol) {
        print_error("%s %s (%s): got %.9g want %.9g (tol %.3g)\n", what, mdl_ttype_name(t), lvl,
                    got, want, tol);
        fail();
    }
}

static void test_dots(void **state)
{
    (void)state;
    const uint32_t types[] = {MDL_T_F32,  MDL_T_F16,  MDL_T_Q8_0, MDL_T_Q4_0,
                              MDL_T_Q5_0, MDL_T_Q4_K, MDL_T_Q6_K};
    const int sizes[] = {256, 512, 768, 32 * 29};
    for (size_t ti = 0; ti < SL_ARRAY_LEN(types); ti++) {
        for (size_t si = 0; si < SL_ARRAY_LEN(sizes); si++) {
            uint32_t t = types[ti];
            int n = sizes[si];
            if (n % (int)mdl_ttype_block(t))
                continue;
            for (int rep = 0; rep < 4; rep++) {
                uint8_t *row = random_row(t, n);
                float *x = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * n);
                int8_t *q = malloc(n);
                float *d = malloc(sizeof(float) * n / 32);
                int32_t *qs = malloc(sizeof(int32_t) * n / 32);
                for (int i = 0; i < n; i++)
                    x[i] = rndf() * (rep == 3 ? 100.0f : 1.0f);
                mdl_quantize_scalar(x, n, q, d, qs);
                uint8_t *extra = malloc(MDL_ACT_EXTRA_BYTES(n));
                mdl_act_t a = {.n = n, .x = x, .q = q, .d = d, .qsum = qs};
                mdl_act_bind_extra(&a, extra);
                assert_int_equal(mdl_dequant_row(t, row, w, n), 0);
                /* float64 references: exact weights times float and
                 * quantized activations; scale = sum |w x| */
                double ref_f = 0, ref_q = 0, scale = 0;
                for (int i = 0; i < n; i++) {
                    double xq = (double)d[i / 32] * q[i];
                    ref_f += (double)w[i] * x[i];
                    ref_q += (double)w[i] * xq;
                    scale += fabs((double)w[i] * x[i]);
                }
                int float_act = t == MDL_T_F32 || t == MDL_T_F16;
                for (int l = 0; l < n_levels; l++) {
                    const mdl_kernels_t *k = levels[l];
                    if (k->prep)
                        k->prep(&a);
                    assert_non_null(k->dot[t]);
                    assert_non_null(k->dot_f[t]);
                    check_close(k->dot[t](row, &a), float_act ? ref_f : ref_q, scale, "fast", t,
                                k->name);
                    check_close(k->dot_f[t](row, &a), ref_f, scale, "precise", t, k->name);
                }
                free(row);
                free(x);
                free(w);
                free(q);
                free(d);
                free(qs);
                free(extra);
            }
        }
    }
}

/* The batched kernels give bit-identical results to the single ones, so
 * batched prefill never changes a logit. */
static void test_dot4_identical(void **state)
{
    (void)state;
    const uint32_t types[] = {MDL_T_Q8_0, MDL_T_Q4_0, MDL_T_Q5_0, MDL_T_F16};
    const int n = 896 + 64; /* 30 blocks: exercises the tail after groups of 4 */
    for (size_t ti = 0; ti < SL_ARRAY_LEN(types); ti++) {
        uint8_t *row = random_row(types[ti], n);
        float *x = malloc(sizeof(float) * 4 * n);
        int8_t *q = malloc(4 * n);
        float *d = malloc(sizeof(float) * 4 * n / 32);
        int32_t *qs = malloc(sizeof(int32_t) * 4 * n / 32);
        uint8_t *extra = malloc(4 * MDL_ACT_EXTRA_BYTES(n));
        mdl_act_t a[4];
        for (int i = 0; i < 4 * n; i++)
            x[i] = rndf();
        for (int l = 0; l < n_levels; l++) {
            const mdl_kernels_t *k = levels[l];
            for (int t = 0; t < 4; t++) {
                a[t] = (mdl_act_t){.n = n,
                                   .x = x + t * n,
                                   .q = q + t * n,
                                   .d = d + t * n / 32,
                                   .qsum = qs + t * n / 32};
                uint8_t *e = extra + t * MDL_ACT_EXTRA_BYTES(n);
                mdl_act_bind_extra(&a[t], e);
                k->quantize(a[t].x, n, a[t].q, a[t].d, a[t].qsum);
                if (k->prep)
                    k->prep(&a[t]);
            }
            if (!k->dot4[types[ti]])
                continue;
            float out[4];
            k->dot4[types[ti]](row, a, out);
            for (int t = 0; t < 4; t++) {
                float one = k->dot[types[ti]](row, &a[t]);
                assert_memory_equal(&one, &out[t], sizeof(float));
            }
        }
        free(row);
        free(x);
        free(q);
        free(d);
        free(qs);
        free(extra);
    }
}

static void test_vector_helpers(void **state)
{
    (void)state;
    enum { N = 77 };
    float a[N], b[N], y0[N], y1[N];
    for (int i = 0; i < N; i++) {
        a[i] = rndf();
        b[i] = rndf();
        y0[i] = y1[i] = rndf();
    }
    double ref = 0;
    for (int i = 0; i < N; i++)
        ref += (double)a[i] * b[i];
    for (int l = 0; l < n_levels; l++) {
        assert_true(fabs(levels[l]->vdot(a, b, N) - ref) < 1e-5);
        memcpy(y1, y0, sizeof(y0));
        levels[l]->vaxpy(y1, 0.5f, a, N);
        for (int i = 0; i < N; i++)
            assert_true(fabsf(y1[i] - (y0[i] + 0.5f * a[i])) < 1e-6f);
    }
}

/* The attention kernels give the bits of the per-row loops they replace
 * (scores: vdot times the scale; value mix: zero, then vaxpy per row), for
 * the unrolled head size 64 and the generic paths, n across 1..130. */
static void test_attention_kernels_identical(void **state)
{
    (void)state;
    enum { NMAX = 130, HMAX = 128 };
    static float K[NMAX * HMAX], V[NMAX * HMAX];
    float q[HMAX], w[NMAX], got[NMAX > HMAX ? NMAX : HMAX], want[NMAX > HMAX ? NMAX : HMAX];
    for (int i = 0; i < NMAX * HMAX; i++) {
        K[i] = rndf();
        V[i] = rndf();
    }
    for (int i = 0; i < HMAX; i++)
        q[i] = rndf();
    for (int i = 0; i < NMAX; i++)
        w[i] = fabsf(rndf()) / NMAX;
    const int hds[] = {64, 48, 128}, ns[] = {1, 2, 7, 64, 130};
    int checked = 0;
    for (int l = 0; l < n_levels; l++) {
        const mdl_kernels_t *k = levels[l];
        for (size_t hi = 0; hi < sizeof(hds) / sizeof(hds[0]); hi++)
            for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
                int hd = hds[hi], n = ns[ni];
                float scale = 1.0f / sqrtf((float)hd);
                if (k->vdots) {
                    k->vdots(q, K, n, hd, scale, got);
                    for (int t = 0; t < n; t++)
                        want[t] = k->vdot(q, K + (size_t)t * hd, hd) * scale;
                    assert_memory_equal(got, want, sizeof(float) * (size_t)n);
                    checked++;
                }
                if (k->vmix) {
                    k->vmix(w, V, n, hd, got);
                    memset(want, 0, sizeof(float) * (size_t)hd);
                    for (int t = 0; t < n; t++)
                        k->vaxpy(want, w[t], V + (size_t)t * hd, hd);
                    assert_memory_equal(got, want, sizeof(float) * (size_t)hd);
                    checked++;
                }
            }
    }
    assert_true(checked >= 30); /* the AVX2 set at least (the CPU has it) */
}

static void test_env_forces_scalar(void **state)
{
    (void)state;
    setenv("SLUICE_MDL_KERNELS", "scalar", 1);
    assert_ptr_equal(mdl_kernels_select(MDL_KL_AVX512), &mdl_kernels_scalar);
    unsetenv("SLUICE_MDL_KERNELS");
    assert_int_equal(mdl_kernels_select(MDL_KL_AVX512)->level, mdl_kernels_cpu_level());
    assert_int_equal(mdl_klevel_parse("AVX2"), MDL_KL_AVX2);
    assert_int_equal(mdl_klevel_parse("sse"), -1);
    assert_true(mdl_ttype_supported(MDL_T_Q6_K));
    assert_false(mdl_ttype_supported(MDL_T_Q4_1));
}

/* The matrix kernels give, for every (row, token), the bits dot gives,
 * whatever tile the pair falls in (row and token counts that leave every
 * kind of edge), with bias and accumulation applied as the engine does. */
static void test_gemm_identical(void **state)
{
    (void)state;
    const uint32_t types[] = {MDL_T_Q8_0, MDL_T_Q4_0};
    const int ns[] = {896, 32 * 29, 160};
    enum { ROWS = 7, TOKS = 11 };
    for (size_t ti = 0; ti < SL_ARRAY_LEN(types); ti++) {
        for (size_t ni = 0; ni < SL_ARRAY_LEN(ns); ni++) {
            int n = ns[ni];
            size_t rb = (size_t)n / 32 * mdl_ttype_bytes(types[ti]);
            uint8_t *w = malloc(rb * ROWS);
            for (int r = 0; r < ROWS; r++) {
                uint8_t *row = random_row(types[ti], n);
                memcpy(w + rb * r, row, rb);
                free(row);
            }
            float *x = malloc(sizeof(float) * TOKS * n);
            int8_t *q = malloc((size_t)TOKS * n);
            float *d = malloc(sizeof(float) * TOKS * n / 32);
            int32_t *qs = malloc(sizeof(int32_t) * TOKS * n / 32);
            uint8_t *extra = malloc(TOKS * MDL_ACT_EXTRA_BYTES(n));
            float bias[ROWS], out[TOKS * ROWS], base[TOKS * ROWS];
            mdl_act_t a[TOKS];
            for (int i = 0; i < TOKS * n; i++)
                x[i] = rndf();
            for (int r = 0; r < ROWS; r++)
                bias[r] = rndf();
            for (int l = 0; l < n_levels; l++) {
                const mdl_kernels_t *k = levels[l];
                if (!k->gemm[types[ti]])
                    continue;
                for (int t = 0; t < TOKS; t++) {
                    a[t] = (mdl_act_t){.n = n,
                                       .x = x + t * n,
                                       .q = q + t * n,
                                       .d = d + t * n / 32,
                                       .qsum = qs + t * n / 32};
                    mdl_act_bind_extra(&a[t], extra + t * MDL_ACT_EXTRA_BYTES(n));
                    k->quantize(a[t].x, n, a[t].q, a[t].d, a[t].qsum);
                    if (k->prep)
                        k->prep(&a[t]);
                }
                for (int nb = 1; nb <= TOKS; nb++)
                    for (int rows = 1; rows <= ROWS; rows++)
                        for (int mode = 0; mode < 3; mode++) {
                            for (int i = 0; i < TOKS * ROWS; i++)
                                out[i] = base[i] = (float)i;
                            k->gemm[types[ti]](w, rb, rows, a, nb, out, ROWS,
                                               mode == 1 ? bias : NULL, mode == 2);
                            for (int t = 0; t < nb; t++)
                                for (int r = 0; r < rows; r++) {
                                    float v = k->dot[types[ti]](w + rb * r, &a[t]) +
                                              (mode == 1 ? bias[r] : 0.0f);
                                    if (mode == 2)
                                        v = base[t * ROWS + r] + v;
                                    assert_memory_equal(&v, &out[t * ROWS + r], sizeof(float));
                                }
                            /* nothing outside rows x nb is written */
                            for (int t = 0; t < TOKS; t++)
                                for (int r = 0; r < ROWS; r++)
                                    if (t >= nb || r >= rows)
                                        assert_true(out[t * ROWS + r] == base[t * ROWS + r]);
                        }
            }
            free(w);
            free(x);
            free(q);
            free(d);
            free(qs);
            free(extra);
        }
    }
}

/* The repacked kernels (rp16; Q8_0, Q4_0, Q5_0, Q4_K): every SIMD level that has one gives the
 * scalar reference's bits for every (row, token), over partial groups of
 * 16 rows, odd block counts, token counts across the 8-token chunks, with
 * bias and accumulation; a token's values do not depend on the others in
 * the batch; and the reference agrees with the row kernel (a different
 * summation order, so within float rounding). */
static void test_gemm_rp(void **state)
{
    (void)state;
    const uint32_t types[] = {MDL_T_Q8_0, MDL_T_Q4_0, MDL_T_Q5_0, MDL_T_Q4_K};
    const int ns_32[] = {896, 32 * 29, 160}, ns_256[] = {256, 768, 1536};
    const int row_counts[] = {1, 5, 16, 17, 37};
    enum { ROWS = 37, TOKS = 11 };
    int checked = 0;
    for (size_t ti = 0; ti < SL_ARRAY_LEN(types); ti++) {
        uint32_t ty = types[ti];
        const int *ns = ty == MDL_T_Q4_K ? ns_256 : ns_32;
        for (size_t ni = 0; ni < 3; ni++) {
            int n = ns[ni];
            size_t rb = (size_t)n / mdl_ttype_block(ty) * mdl_ttype_bytes(ty),
                   gb = mdl_rp_group_bytes(ty, n);
            assert_true(gb > 0 && gb % 64 == 0);
            int ng = (ROWS + MDL_RP_ROWS - 1) / MDL_RP_ROWS;
            uint8_t *w = malloc(rb * ROWS), *rp = aligned_alloc(64, gb * (size_t)ng);
            for (int r = 0; r < ROWS; r++) {
                uint8_t *row = random_row(ty, n);
                memcpy(w + rb * r, row, rb);
                free(row);
            }
            mdl_rp_pack(ty, w, rb, ROWS, n, rp);
            float *x = malloc(sizeof(float) * TOKS * n);
            int8_t *q = malloc((size_t)TOKS * n);
            float *d = malloc(sizeof(float) * TOKS * n / 32);
            int32_t *qs = malloc(sizeof(int32_t) * TOKS * n / 32);
            float bias[ROWS], ref[TOKS * ROWS], out[TOKS * ROWS], one[ROWS];
            mdl_act_t a[TOKS], ai[TOKS];
            uint8_t *il = aligned_alloc(64, (MDL_IL_BYTES(n, TOKS) + 63) / 64 * 64);
            assert_non_null(il);
            for (int i = 0; i < TOKS * n; i++)
                x[i] = rndf();
            for (int r = 0; r < ROWS; r++)
                bias[r] = rndf();
            for (int t = 0; t < TOKS; t++) {
                a[t] = (mdl_act_t){.n = n,
                                   .x = x + t * n,
                                   .q = q + t * n,
                                   .d = d + t * n / 32,
                                   .qsum = qs + t * n / 32};
                mdl_quantize_scalar(a[t].x, n, a[t].q, a[t].d, a[t].qsum);
                ai[t] = a[t];
            }
            /* the reference against the row kernel */
            mdl_gemm_rp_ref(ty, rp, gb, ROWS, a, TOKS, ref, ROWS, NULL, 0);
            for (int t = 0; t < TOKS; t++)
                for (int r = 0; r < ROWS; r++) {
                    float v = mdl_kernels_scalar.dot[ty](w + rb * r, &a[t]);
                    /* Q4_K: the mins cancel most of the sum, so its rounding
                     * is relative to the terms, not to the result */
                    float tol = ty == MDL_T_Q4_K ? 1e-4f : 1e-5f;
                    if (!(fabsf(v - ref[t * ROWS + r]) <= tol * (1.0f + fabsf(v))))
                        fail_msg("type %u n %d t %d r %d: %g vs %g", ty, n, t, r, v,
                                 ref[t * ROWS + r]);
                }
            for (size_t rc = 0; rc < SL_ARRAY_LEN(row_counts); rc++) {
                int rows = row_counts[rc];
                for (int nb = 1; nb <= TOKS; nb++)
                    for (int mode = 0; mode < 3; mode++) {
                        for (int i = 0; i < TOKS * ROWS; i++)
                            ref[i] = (float)i;
                        mdl_gemm_rp_ref(ty, rp, gb, rows, a, nb, ref, ROWS, mode == 1 ? bias : NULL,
                                        mode == 2);
                        for (int t = 0; t < TOKS; t++)
                            for (int r = 0; r < ROWS; r++)
                                if (t >= nb || r >= rows)
                                    assert_true(ref[t * ROWS + r] == (float)(t * ROWS + r));
                        for (int l = 0; l < n_levels; l++) {
                            mdl_gemm_rp_fn f = levels[l]->gemm_rp[ty];
                            if (!f)
                                continue;
                            for (int i = 0; i < TOKS * ROWS; i++)
                                out[i] = (float)i;
                            f(rp, gb, rows, a, nb, out, ROWS, mode == 1 ? bias : NULL, mode == 2);
                            assert_memory_equal(out, ref, sizeof(out));
                            /* the interleaved form, as the engine runs it: the
                             * same bits (any batch of it, from a[0]) */
                            mdl_act_interleave(ai, nb, il);
                            for (int i = 0; i < TOKS * ROWS; i++)
                                out[i] = (float)i;
                            f(rp, gb, rows, ai, nb, out, ROWS, mode == 1 ? bias : NULL, mode == 2);
                            assert_memory_equal(out, ref, sizeof(out));
                            for (int t = 0; t < nb; t += 8)
                                assert_non_null(ai[t].il);
                            /* each token alone gives the same bits */
                            for (int t = 0; t < nb; t++) {
                                for (int r = 0; r < rows; r++)
                                    one[r] = (float)(t * ROWS + r);
                                f(rp, gb, rows, a + t, 1, one, ROWS, mode == 1 ? bias : NULL,
                                  mode == 2);
                                assert_memory_equal(one, &ref[t * ROWS], sizeof(float) * rows);
                            }
                            checked++;
                        }
                    }
            }
            free(w);
            free(rp);
            free(x);
            free(q);
            free(d);
            free(qs);
            free(il);
        }
    }
    /* this CPU has AVX-512 VNNI (CI is the same machine); elsewhere only the
     * reference runs */
    if (mdl_kernels_cpu_level() >= MDL_KL_AVX512)
        assert_int_equal(checked, 4 * 3 * 5 * TOKS * 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16),
        cmocka_unit_test(test_block_q8_0),
        cmocka_unit_test(test_block_q4_0),
        cmocka_unit_test(test_block_q5_0),
        cmocka_unit_test(test_block_q4_k),
        cmocka_unit_test(test_block_q6_k),
        cmocka_unit_test(test_levels_distinct),
        cmocka_unit_test(test_quantize_identical),
        cmocka_unit_test(test_dots),
        cmocka_unit_test(test_dot4_identical),
        cmocka_unit_test(test_gemm_identical),
        cmocka_unit_test(test_gemm_rp),
        cmocka_unit_test(test_vector_helpers),
        cmocka_unit_test(test_attention_kernels_identical),
        cmocka_unit_test(test_env_forces_scalar),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
