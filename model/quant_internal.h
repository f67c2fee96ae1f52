/*
 * quant_internal.h — weight block formats and the row kernels of the
 * engine: fp16 conversion, dequantisation of every supported type, the
 * per-32 int8 quantisation of activations, and row dot products in a
 * portable scalar version plus AVX2 and AVX-512(-VNNI) versions chosen at
 * run time (kernels_avx2.c, kernels_avx512.c; no global -m flags).
 *
 * Two numeric paths exist for quantized weights:
 *  - fast (default): the activation vector is quantized to int8 per block
 *    of 32 (d = max|x| / 127, q = round-half-even(x / d), float32 maths) and
 *    dotted with the weight blocks in integer arithmetic, as llama.cpp does;
 *  - precise: each weight block is dequantized to float and dotted with the
 *    float activations. The tests compare it with a float64 reference.
 * F32 and F16 weights always use float activations.
 *
 * Block layouts are ggml's (little-endian, fp16 = IEEE binary16); see
 * ../shared/local-model-notes.md §4.3 for the formulas.
 */
#ifndef MDL_QUANT_INTERNAL_H
#define MDL_QUANT_INTERNAL_H

#include "common/sl.h"
#include "model/gguf_internal.h"

#include <stdint.h>

/* Elements per activation quantization block. */
#define MDL_QK 32

/* A vector of activations in both forms. x is always set; q/d/qsum only
 * when the fast path quantized it (n must then be a multiple of 32). All
 * pointers are borrowed from the caller's scratch space. */
typedef struct {
    int n;
    const float *x;
    int8_t *q;     /* n int8 */
    float *d;      /* n/32 block scales */
    int32_t *qsum; /* n/32 sums of q per block (for formats with a min) */
    /* Extra forms the AVX-512 kernels read, filled by the kernel set's prep
     * (see MDL_ACT_EXTRA_BYTES); NULL when the set has no prep. */
    int32_t *c128; /* n/4: -128 * sum of each group of 4 q (Q8_0 as unsigned) */
    int8_t *qp;    /* n: q per 4 blocks, the 4 low halves then the 4 high halves */
    int32_t *c8;   /* n/8: -8 * the sums dpbusd lanes see in the qp order (Q4_0) */
    int8_t *qk;    /* n: q per 8 blocks in the order 0 2 1 3 4 6 5 7 (Q4_K nibbles) */
    /* Set on acts[0], acts[8], ... of a batch by mdl_act_interleave: that
     * token and the next (up to 7) in the repacked kernels' form; NULL:
     * those kernels read q/d/qsum token by token. */
    const uint8_t *il;
} mdl_act_t;

/* The interleaved form of up to 8 tokens, block by block (MDL_IL_BLK bytes
 * per 32 activations): the 8 tokens' 32 q, their 8 scales d, then their
 * block sums times the offsets the repacked weights carry (-128 for Q8_0,
 * -16 for Q5_0, -8 for Q4_0). One pointer then reaches every token of a
 * block, so the kernel's 8 token loops keep no 24 pointers in registers,
 * and the offsets' corrections are broadcast loads, not a multiply and a
 * move from a general register per token and block. */
#define MDL_IL_BLK  384
#define MDL_IL_D    256
#define MDL_IL_O128 288
#define MDL_IL_O16  320
#define MDL_IL_O8   352
/* Bytes of the interleaved form of nb tokens of n activations. */
#define MDL_IL_BYTES(n, nb) ((size_t)((nb) + 7) / 8 * ((size_t)(n) / 32) * MDL_IL_BLK)
/* Fills buf (MDL_IL_BYTES(a[0].n, nb), quantized acts) and points
 * a[0].il, a[8].il, ... at it. */
void mdl_act_interleave(mdl_act_t *a, int nb, uint8_t *buf);

/* Scratch bytes for the extra forms of an n-element vector, and how they
 * are laid out in it (buf 64-byte aligned for the fastest loads). */
#define MDL_ACT_EXTRA_BYTES(n) ((size_t)(n)*3 + (size_t)(n) / 2 + 256)
void mdl_act_bind_extra(mdl_act_t *a, uint8_t *buf);

/* Dot product of one weight row (n = a->n elements, type implied by the
 * table slot) with an activation vector. */
typedef float (*mdl_dot_fn)(const uint8_t *row, const mdl_act_t *a);
/* The same for four activation vectors a[0..3] at once (batched prefill:
 * the weight blocks are decoded once for four tokens). Each out[t] must be
 * bit-identical to dot(row, &a[t]), so batching never changes results. */
typedef void (*mdl_dot4_fn)(const uint8_t *row, const mdl_act_t *a, float *out);

/* Many weight rows times many token vectors (prefill, batched decode), the
 * weights of a few rows and the activations of a few tokens kept in
 * registers together: for r < n_rows, t < nb,
 *   v = dot(row r, a[t]) + (bias ? bias[r] : 0)
 *   out[t * ostride + r] = accumulate ? out[t * ostride + r] + v : v
 * with rows rb bytes apart. Every v is bit-identical to dot's, whatever
 * the tile a value falls in, so batching never changes results. */
typedef void (*mdl_gemm_fn)(const uint8_t *w, size_t rb, int n_rows, const mdl_act_t *a, int nb,
                            float *out, size_t ostride, const float *bias, int accumulate);

/* Weights repacked at load for the batched integer kernels ("rp16"):
 * rows in groups of MDL_RP_ROWS (the last group padded with zero rows), so
 * one 512-bit register holds 4 bytes of each of 16 rows and vpdpbusd with
 * one broadcast activation word sums 16 rows at once; after a block's 8
 * (Q8_0) or 4x2 (Q4_0) such steps every lane holds its row's whole integer
 * block dot, converted and scaled once per 32 weights, not per 4 (Q4_K:
 * see MDL_RP_K4_*, one sub-block of 32 at a time). The
 * block's weights stay in registers while every token of the batch (up to
 * 8 at a time) is dotted with them: weight reuse across the batch.
 * A group is one linear stream of pairs of blocks: the two blocks' 16 fp16
 * scales each (64 bytes), then their quants (qb bytes each; an odd last
 * block makes a pair of one), so every load is 64-byte aligned:
 *  - Q8_0: 8 chunks of 64 bytes; chunk k, lane i = row i's elements
 *    4k..4k+3 plus 128 (unsigned; the -128 * sum(x) goes into the start);
 *  - Q4_0: 4 chunks of 64 bytes; chunk k, lane i = row i's bytes 4k..4k+3
 *    as they are (low nibbles: elements 4k.., high: 16+4k..; the -8 *
 *    sum(x) goes into the start).
 * Per (row, token) the value is sum over blocks, in order, of
 *   acc = fmaf((float)isum_b, dw_b * dx_b, acc)
 * (then + bias, then + out when accumulating): the same in the scalar
 * reference and the SIMD kernel, and whatever else is in the batch. */
#define MDL_RP_ROWS 16
/* Where block b's scales and quants start in a group (qb: 512 or 256). */
#define MDL_RP_SCALE_OFF(b, qb) ((size_t)(b) / 2 * (64 + 2 * (qb)) + 32 * ((size_t)(b)&1))
#define MDL_RP_Q_OFF(b, qb)     ((size_t)(b) / 2 * (64 + 2 * (qb)) + 64 + (qb) * ((size_t)(b)&1))
/* Q4_K (n_in a multiple of 256): per superblock, 16 fp16 d, 16 fp16 dmin,
 * sub-block scales [8][16] and mins [8][16] as bytes, then for each pair
 * of sub-blocks 8 chunks of 64 bytes (lane i = row i's nibble bytes
 * 4k..4k+3 of that pair: low nibbles the even sub-block, high the odd). */
#define MDL_RP_K4_D     0
#define MDL_RP_K4_DMIN  32
#define MDL_RP_K4_SC    64
#define MDL_RP_K4_M     192
#define MDL_RP_K4_Q     320
#define MDL_RP_K4_BYTES 2368
/* Bytes of one group of 16 rows of n_in elements; 0 when type t has no
 * repacked form. */
size_t mdl_rp_group_bytes(uint32_t t, int n_in);
/* Repacks n_rows rows (rb bytes apart) into ceil(n_rows / 16) groups at
 * dst (64-byte aligned, mdl_rp_group_bytes each). */
void mdl_rp_pack(uint32_t t, const uint8_t *w, size_t rb, int n_rows, int n_in, uint8_t *dst);
/* Like mdl_gemm_fn over repacked weights: w is the first group (groups
 * gstride bytes apart), n_rows the rows wanted from it (the last group may
 * be partial; nothing beyond n_rows is written). */
typedef void (*mdl_gemm_rp_fn)(const uint8_t *w, size_t gstride, int n_rows, const mdl_act_t *a,
                               int nb, float *out, size_t ostride, const float *bias,
                               int accumulate);
/* The scalar reference of every gemm_rp kernel (bit-identical to them). */
void mdl_gemm_rp_ref(uint32_t t, const uint8_t *w, size_t gstride, int n_rows, const mdl_act_t *a,
                     int nb, float *out, size_t ostride, const float *bias, int accumulate);

typedef enum { MDL_KL_SCALAR = 0, MDL_KL_AVX2 = 1, MDL_KL_AVX512 = 2 } mdl_klevel_t;

typedef struct {
    const char *name;
    int level;
    /* Quantizes n floats (n % 32 == 0) into q/d/qsum. Bit-identical across
     * levels (same float32 operations, round half to even). */
    void (*quantize)(const float *x, int n, int8_t *q, float *d, int32_t *qsum);
    /* Derives the extra forms from q (NULL: the set needs none). */
    void (*prep)(mdl_act_t *a);
    mdl_dot_fn dot[MDL_T_MAX];   /* fast path; NULL when the type is unsupported */
    mdl_dot4_fn dot4[MDL_T_MAX]; /* optional batched form of dot */
    mdl_gemm_fn gemm[MDL_T_MAX]; /* optional matrix form of dot */
    /* optional matrix kernels over repacked weights (mdl_rp_pack); used
     * instead of gemm when the weight was repacked */
    mdl_gemm_rp_fn gemm_rp[MDL_T_MAX];
    mdl_dot_fn dot_f[MDL_T_MAX]; /* precise path (float activations) */
    /* Float helpers for attention. */
    float (*vdot)(const float *a, const float *b, int n);
    void (*vaxpy)(float *y, float a, const float *x, int n); /* y += a*x */
    /* optional, same bits as the loops over vdot / vaxpy they replace:
     * out[t] = vdot(q, K[t], hd) * scale for n rows; out = sum w[t] V[t] */
    void (*vdots)(const float *q, const float *K, int n, int hd, float scale, float *out);
    void (*vmix)(const float *w, const float *V, int n, int hd, float *out);
    /* optional: x[i] = e^x[i] (within 1 ulp of expf; each value depends
     * only on its input, so rows give the same bits alone or batched) */
    void (*vexpf)(float *x, int n);
} mdl_kernels_t;

/* The best kernel set this CPU runs, capped at max_level. The environment
 * variable SLUICE_MDL_KERNELS=scalar|avx2|avx512 lowers the cap further
 * (so a whole process can be forced onto the scalar path). Never NULL. */
const mdl_kernels_t *mdl_kernels_select(int max_level);
/* The highest level this CPU supports (ignoring the environment). */
int mdl_kernels_cpu_level(void);
/* Parses "scalar", "avx2", "avx512", "auto" (= 2); -1 when unknown. */
int mdl_klevel_parse(const char *s);

/* Types the engine computes with (F32, F16, Q8_0, Q4_0, Q5_0, Q4_K, Q6_K). */
int mdl_ttype_supported(uint32_t t);

float mdl_fp16_to_f32(uint16_t h);
uint16_t mdl_f32_to_fp16(float f); /* round to nearest even; for tests/tools */

/* Dequantizes n elements (a multiple of the type's block) of type t.
 * Returns -1 for unsupported types. */
SL_WUR int mdl_dequant_row(uint32_t t, const void *src, float *dst, int64_t n);

/* The scalar pieces, exported so the SIMD files can fall back to them and
 * the unit tests can compare against them. */
void mdl_quantize_scalar(const float *x, int n, int8_t *q, float *d, int32_t *qsum);
extern const mdl_kernels_t mdl_kernels_scalar;

/* Filled by kernels_avx2.c / kernels_avx512.c from the table below them;
 * each returns 0 and fills *k, or -1 when compiled without support. */
int mdl_kernels_init_avx2(mdl_kernels_t *k);
int mdl_kernels_init_avx512(mdl_kernels_t *k);

/* Software prefetch distance for streaming weight rows, in bytes. Weights
 * are read once per token from DRAM; prefetching this far ahead lets the
 * loads overlap the arithmetic (see the notes, §2.3). */
#ifndef MDL_PREFETCH_BYTES
#define MDL_PREFETCH_BYTES 4096
#endif

static inline uint16_t mdl_rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

#endif
