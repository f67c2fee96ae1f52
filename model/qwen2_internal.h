/*
 * qwen2_internal.h — the qwen2 transformer: weights bound from a GGUF file
 * (mdl_model_t, read-only, shareable between threads) and one sequence's
 * evaluation state (mdl_state_t: KV cache and scratch, one user at a time).
 *
 * Forward pass (HF semantics; notes §4.2): RMSNorm, q/k/v with biases, NEOX
 * RoPE with the base from metadata, grouped-query attention over an f32 KV
 * cache, SwiGLU, tied or separate output head. mdl_state_eval() takes any
 * number of tokens; they are processed in chunks of `batch` tokens so each
 * weight row is read once per chunk (batched prefill).
 */
#ifndef MDL_QWEN2_INTERNAL_H
#define MDL_QWEN2_INTERNAL_H

#include "common/sl.h"
#include "model/gguf_internal.h"
#include "model/pool_internal.h"
#include "model/quant_internal.h"

typedef struct {
    uint32_t type;
    int n_in;  /* row length (GGUF ne[0]) */
    int n_out; /* rows (ne[1]) */
    size_t row_bytes;
    const uint8_t *data; /* borrowed from the mapping */
    /* the same rows repacked for the batched kernels (mdl_rp_pack), in the
     * model's rp region; NULL when the type or CPU has no such kernel */
    const uint8_t *rp;
    size_t rp_gstride; /* bytes per group of MDL_RP_ROWS rows */
} mdl_weight_t;

typedef struct {
    mdl_weight_t wq, wk, wv, wo, wgate, wup, wdown;
    float *attn_norm, *ffn_norm; /* owned copies, n_embd */
    float *bq, *bk, *bv;         /* owned copies; NULL when the file has none */
} mdl_layer_t;

typedef struct {
    mdl_gguf_t *gguf; /* owned */
    int n_embd, n_layer, n_head, n_kv, head_dim, n_ff, n_vocab, n_ctx_train;
    float eps;
    double rope_base;
    int tied; /* output head is token_embd */
    mdl_weight_t tok_embd, output;
    float *output_norm;
    mdl_layer_t *layers;
    uint64_t bytes_per_token; /* weight bytes one decode step reads */
    uint8_t *rp_base;         /* owned mapping holding every weight's rp form */
    size_t rp_len;
    char name[128];
} mdl_model_t;

/* Loads and checks every tensor shape and type; the error names the first
 * problem. copy: read the file into huge-page memory (mdl_gguf_open_copy,
 * faster decoding) instead of mapping it. mdl_model_from_gguf takes
 * ownership of g, also on failure. */
SL_WUR mdl_model_t *mdl_model_load(const char *path, int copy, char *err, size_t errlen);
SL_WUR mdl_model_t *mdl_model_from_gguf(mdl_gguf_t *g, char *err, size_t errlen);
void mdl_model_free(mdl_model_t *m);

typedef struct {
    int n_ctx;        /* KV capacity in tokens; 0: min(4096, training context) */
    int batch;        /* prefill chunk; 0: 32 */
    int kernel_level; /* highest kernel level allowed (MDL_KL_*); env may lower it */
    int precise;      /* float activations for quantized weights */
} mdl_state_opts_t;

typedef struct mdl_state mdl_state_t;

/* The state borrows m and pool (NULL: single-threaded); both must outlive
 * it. */
SL_WUR mdl_state_t *mdl_state_new(const mdl_model_t *m, const mdl_state_opts_t *o, mdl_pool_t *pool,
                                  char *err, size_t errlen);
void mdl_state_free(mdl_state_t *s);
int mdl_state_pos(const mdl_state_t *s);
int mdl_state_n_ctx(const mdl_state_t *s);
const char *mdl_state_kernels(const mdl_state_t *s);
/* Forgets every position >= n (keeps the first n of the cache). */
void mdl_state_truncate(mdl_state_t *s, int n);
/* Copies the first n cached positions of src into dst (same model and
 * n_ctx >= n) and sets dst's position to n. */
SL_WUR int mdl_state_copy_prefix(mdl_state_t *dst, const mdl_state_t *src, int n);

/* Runs n tokens at positions pos .. pos+n-1 and appends them to the cache.
 * logits: NULL (prefill only), or n_vocab floats for the last token, or
 * with all_logits n * n_vocab floats, one row per token. -1 on a bad token
 * id or when the cache would overflow (state unchanged then). */
SL_WUR int mdl_state_eval(mdl_state_t *s, const int32_t *tokens, int n, float *logits,
                          int all_logits);

/* One sequence's part of a batched step: n tokens appended to seq's cache
 * at its current position; logits (NULL or n_vocab floats) receive the
 * last token's. */
typedef struct {
    mdl_state_t *seq;
    const int32_t *tokens;
    int n;
    float *logits;
} mdl_seq_step_t;

/* Continuous batching: evaluates the tokens of several sequences in one
 * pass over the weights, with work's scratch and pool (work's own cache is
 * not touched). Each seq must be a different state of the same model with
 * n_ctx <= work's; the total of n must fit work's batch. A sequence's
 * results are bit-identical to evaluating it alone with the same kernels.
 * -1 on bad input (nothing changed then). */
SL_WUR int mdl_state_eval_seqs(mdl_state_t *work, const mdl_seq_step_t *steps, int n_steps);

/* The two pieces checked against hand-computed cases in the unit tests. */
void mdl_rope_apply(float *v, int n_heads, int head_dim, int pos, double base);
/* One query head against n cached positions: out = softmax(q.K/sqrt(hd)) V,
 * K and V row-major [n][hd]; scores is scratch of n floats. */
void mdl_attend(const mdl_kernels_t *k, const float *q, const float *K, const float *V, int n,
                int hd, float *scores, float *out);
void mdl_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
/* g = SiLU(g) * u, with k's vector expf when it has one (NULL: libm) */
void mdl_silu_mul(const mdl_kernels_t *k, float *g, const float *u, size_t n);

#endif
