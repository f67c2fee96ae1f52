/*
 * tok_internal.h — byte-level BPE tokenizer built from a GGUF file's
 * tokenizer.ggml.* metadata (the GPT-2 / Qwen2 scheme, notes §4.4).
 *
 * Encoding: (1) optionally split out special tokens (control and
 * user-defined types) by exact match, longest first; (2) NFC-normalise the
 * rest (libunistring's u8_normalize), as Qwen's tokenizer.json declares and
 * HF does (llama.cpp does not: it differs on decomposed input such as
 * "e\u0301"); (3) split it with the Qwen2 pre-tokenizer regex through PCRE2
 * (UTF + UCP); (4) map each piece's bytes through GPT-2's bytes_to_unicode;
 * (5) apply merges lowest rank first (leftmost on ties); (6) look up the
 * ids.
 *
 * \s in the regex is spelled out as the Unicode White_Space set, which is
 * what HF's Oniguruma matches; PCRE2's own \s leaves out U+0085.
 *
 * A tokenizer is immutable after construction and may be used from several
 * threads at once.
 */
#ifndef MDL_TOK_INTERNAL_H
#define MDL_TOK_INTERNAL_H

#include "common/sl.h"
#include "model/gguf_internal.h"

#include <stdint.h>

/* A growable id vector; free v with free(). */
typedef struct {
    int32_t *v;
    int n, cap;
} mdl_ids_t;

SL_WUR int mdl_ids_push(mdl_ids_t *ids, int32_t id);

/* llama.cpp's token types (tokenizer.ggml.token_type). */
enum {
    MDL_TOKT_NORMAL = 1,
    MDL_TOKT_UNKNOWN = 2,
    MDL_TOKT_CONTROL = 3,
    MDL_TOKT_USER = 4,
    MDL_TOKT_UNUSED = 5,
    MDL_TOKT_BYTE = 6
};

typedef struct mdl_tok mdl_tok_t;

/* Reads tokens, types, merges and the special ids. n_vocab_model is the
 * embedding height; the vocabulary may not exceed it. All strings are
 * copied, so the tokenizer does not depend on g afterwards. */
SL_WUR mdl_tok_t *mdl_tok_from_gguf(const mdl_gguf_t *g, int n_vocab_model, char *err,
                                    size_t errlen);
void mdl_tok_free(mdl_tok_t *t);

int mdl_tok_n_tokens(const mdl_tok_t *t);

/* Appends the ids of len bytes of text. With allow_special, special-token
 * texts in the input become their ids; without, they are ordinary text
 * (what the engine does for message contents). -1 on allocation failure
 * or when a byte has no token (a vocabulary without the 256 byte tokens). */
SL_WUR int mdl_tok_encode(const mdl_tok_t *t, const char *text, size_t len, int allow_special,
                          mdl_ids_t *out);

/* The bytes token id stands for when printed: byte-level decoded for
 * normal tokens, the raw text of user-defined tokens, nothing for control
 * and unused tokens (or their text with render_special). Borrowed; valid
 * for the tokenizer's lifetime. */
const uint8_t *mdl_tok_bytes(const mdl_tok_t *t, int32_t id, int render_special, size_t *len);

/* Exact lookup of a token string (in the file's alphabet); -1 if absent. */
int32_t mdl_tok_find(const mdl_tok_t *t, const char *text);
/* End-of-generation ids: eos_token_id, <|im_end|>, <|endoftext|>. */
int mdl_tok_is_eog(const mdl_tok_t *t, int32_t id);
int mdl_tok_type(const mdl_tok_t *t, int32_t id);
/* Special ids used by ChatML, or -1. */
int32_t mdl_tok_im_start(const mdl_tok_t *t);
int32_t mdl_tok_im_end(const mdl_tok_t *t);

#endif
