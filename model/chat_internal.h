/*
 * chat_internal.h — the pure pieces between tokens and text: ChatML prompt
 * construction, incremental UTF-8 output (never half a character), and the
 * sampler (repetition penalty, temperature, top-k, top-p, seeded RNG).
 * None of them allocate per token or touch global state.
 */
#ifndef MDL_CHAT_INTERNAL_H
#define MDL_CHAT_INTERNAL_H

#include "common/sl.h"
#include "model/model.h"
#include "model/tok_internal.h"

#include <stddef.h>
#include <stdint.h>

/* Qwen's default system prompt, used when the conversation has none. */
extern const char mdl_qwen_default_system[];

/* Appends the ChatML prompt of msgs to out: each message is
 * <|im_start|>ROLE\nCONTENT<|im_end|>\n, then <|im_start|>assistant\n.
 * When the first message is not "system" and default_system is not NULL,
 * a system message with that text comes first. Role and content are
 * encoded as text: a special token's spelling inside a message stays
 * plain text, so a client cannot forge turns. -1 when the vocabulary has
 * no <|im_start|>/<|im_end|> or on allocation failure. */
SL_WUR int mdl_chat_tokens(const mdl_tok_t *t, const mdl_message_t *msgs, size_t n,
                           const char *default_system, mdl_ids_t *out);

/* Incremental UTF-8: bytes go in as tokens produce them; only complete,
 * valid characters come out. Invalid sequences become U+FFFD, so the
 * output is always valid UTF-8 (it ends up in JSON). */
typedef struct {
    uint8_t pend[4];
    int n;
} mdl_utf8_t;

/* Worst-case output bytes for n input bytes (each byte may turn into a
 * 3-byte U+FFFD, plus up to 3 held-back bytes released). */
#define MDL_UTF8_OUT_MAX(n) (3 * ((n) + 4))
/* Consumes n bytes, writes complete characters to out, returns the count. */
size_t mdl_utf8_feed(mdl_utf8_t *u, const uint8_t *in, size_t n, uint8_t *out);
/* End of stream: a held incomplete sequence becomes U+FFFD. */
size_t mdl_utf8_flush(mdl_utf8_t *u, uint8_t *out);

/* xoshiro256** seeded through splitmix64. */
typedef struct {
    uint64_t s[4];
} mdl_rng_t;
void mdl_rng_seed(mdl_rng_t *r, uint64_t seed);
uint64_t mdl_rng_next(mdl_rng_t *r);
double mdl_rng_uniform(mdl_rng_t *r); /* [0, 1) */

/* How many recent tokens the repetition penalty looks at (llama.cpp's
 * default; HF looks at the whole context). */
#define MDL_REPEAT_LAST_N 64

typedef struct {
    float l;
    int32_t id;
} mdl_cand_t;

typedef struct {
    int n_vocab;
    int n_valid; /* ids >= n_valid (padding rows) are never sampled */
    mdl_sampling_t p;
    mdl_rng_t rng;
    mdl_cand_t *cand; /* scratch, n_valid entries */
} mdl_sampler_t;

SL_WUR mdl_sampler_t *mdl_sampler_new(int n_vocab, int n_valid, const mdl_sampling_t *p);
void mdl_sampler_free(mdl_sampler_t *s);
/* Picks the next id from logits (modified in place). hist: the last
 * tokens of the context (prompt and output), oldest first. Greedy when
 * temperature <= 0. */
int32_t mdl_sampler_sample(mdl_sampler_t *s, float *logits, const int32_t *hist, int n_hist);
/* The pieces of mdl_sampler_sample, for tests that check it against a
 * reference: the repetition penalty (logits modified in place) ... */
void mdl_sampler_penalize(const mdl_sampler_t *s, float *logits, const int32_t *hist, int n_hist);
/* ... the candidates (into s->cand, their count returned): the logits
 * within 30 temperatures of maxl, the best one, in id order ... */
int mdl_sampler_collect(mdl_sampler_t *s, const float *logits, float maxl, float temp);
/* ... and the draw from s->cand[0..c) (c >= 1, sorted by mdl_cand_cmp,
 * top-k already applied): softmax at temp around maxl, top-p, one RNG
 * draw. */
int32_t mdl_sampler_draw(mdl_sampler_t *s, int c, float maxl, float temp);
/* qsort order of candidates: larger logit first, ties by smaller id */
int mdl_cand_cmp(const void *a, const void *b);
/* first index of the largest value; NaNs never win, 0 if x[0] is NaN */
int32_t mdl_argmax(const float *x, int n);

#endif
