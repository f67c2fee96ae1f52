/*
 * flt_internal.h — the pure cores of filters/, shared by its .c files and
 * its unit tests, never by other modules: UTF-8 and width folding, the
 * Aho-Corasick word automaton, and the text channel (one choice's answer
 * text, filtered with hold-back). Nothing here does I/O or reads a clock.
 */
#ifndef SL_FLT_INTERNAL_H
#define SL_FLT_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "common/metrics.h"
#include "common/sl.h"
#include "common/yheap.h"
#include "filters/filters.h"

/* ---- UTF-8 and folding (fold.c) ------------------------------------------ */

/* flt_utf8_valid: filters/filters.h. */
/* Length of the character starting at s (1..4), assuming valid UTF-8;
 * a stray byte counts as 1. */
size_t flt_utf8_len(unsigned char lead);
/* Number of code points in valid UTF-8. */
size_t flt_utf8_count(const char *s, size_t n);
/* Bytes of the first max_cp code points of s (at most n). */
size_t flt_utf8_prefix(const char *s, size_t n, size_t max_cp);

/* Width folding of one character: fullwidth ASCII forms U+FF01..U+FF5E to
 * U+0021..U+007E and the ideographic space U+3000 to a space; every other
 * character is copied. Writes 1..4 bytes to out, returns the count, sets
 * *used to the input bytes consumed. */
size_t flt_fold_char(const unsigned char *s, size_t n, unsigned char out[4], size_t *used);
/* Whether width folding leaves s[0..n) byte for byte as it is: no
 * fullwidth form and no ideographic space in it (é, CJK and the rest fold
 * to themselves). */
bool flt_fold_same(const char *s, size_t n);

/* A word as the automaton stores it: width-folded and ASCII-lowercased.
 * Writes into out (capacity cap); returns the length, or SIZE_MAX if it
 * does not fit. */
size_t flt_fold_word(const char *s, size_t n, char *out, size_t cap);

/* ASCII lowercase table used by the automaton at match time. */
extern const unsigned char flt_lower[256];

/* ---- Aho-Corasick automaton (ac.c) -------------------------------------- */

typedef struct flt_ac flt_ac_t;

typedef struct flt_ac_word {
    const char *s; /* folded bytes (flt_fold_word), not NUL-terminated */
    size_t len;    /* 1..FLT_MAX_WORD_BYTES */
    int rule;      /* index into the ruleset's rules */
    int action;    /* flt_action_t: a duplicate keeps the strongest */
} flt_ac_word_t;

/* Builds the automaton; the words array is sorted in place, its strings are
 * only borrowed during the call. n may be 0. NULL on OOM. */
flt_ac_t *flt_ac_new(flt_ac_word_t *words, size_t n);
void flt_ac_free(flt_ac_t *ac);

#define FLT_AC_ROOT 0u

/* One step on a byte of folded text (ASCII case is folded here). */
uint32_t flt_ac_step(const flt_ac_t *ac, uint32_t state, unsigned char c);
/* Whether s[0..n) is ASCII and no word ends anywhere in it, from the root
 * (false at the first byte >= 0x80 or the first word's end). */
bool flt_ac_ascii_clean(const flt_ac_t *ac, const unsigned char *s, size_t n);
/* The same from *state (a channel's): true, with *state the state after
 * s, when s is ASCII and no word ends in it; false (state untouched) at the
 * first byte >= 0x80 or word end. */
bool flt_ac_ascii_run(const flt_ac_t *ac, uint32_t *state, const unsigned char *s, size_t n);
/* flt_ac_ascii_run telling why it stopped. CLEAN: as its true. WORD: a
 * word ends in s. HIGH: s has a byte >= 0x80 at *at or in the 32 bytes
 * after it (the skip tests a round of 32 at once, so not necessarily at
 * it); every byte before *at is ASCII, no word ends before it, and *state
 * is the state there: flt_ac_clean_from goes on from it without stepping
 * those bytes again. */
typedef enum flt_ac_run {
    FLT_AC_RUN_CLEAN,
    FLT_AC_RUN_WORD,
    FLT_AC_RUN_HIGH,
} flt_ac_run_t;
flt_ac_run_t flt_ac_ascii_scan(const flt_ac_t *ac, uint32_t *state, const unsigned char *s,
                               size_t n, size_t *at);
/* Whether no word ends anywhere in folded s[0..n), from the root, for any
 * bytes: the ASCII runs as flt_ac_ascii_run, bytes >= 0x80 stepped one by
 * one. */
bool flt_ac_clean(const flt_ac_t *ac, const unsigned char *s, size_t n);
/* The same from state (the state after the text before s). */
bool flt_ac_clean_from(const flt_ac_t *ac, uint32_t state, const unsigned char *s, size_t n);
/* Length of the longest suffix of the text so far that is a proper prefix
 * of some word (a match that needs more text): no match still to come can
 * start earlier than this many bytes back. */
unsigned flt_ac_depth(const flt_ac_t *ac, uint32_t state);
/* The words ending at `state`: out_first gives a node or -1, out_next the
 * next one (shorter), each with its length and rule. */
int32_t flt_ac_out_first(const flt_ac_t *ac, uint32_t state);
int32_t flt_ac_out_next(const flt_ac_t *ac, int32_t node);
unsigned flt_ac_out_len(const flt_ac_t *ac, int32_t node);
int flt_ac_out_rule(const flt_ac_t *ac, int32_t node);
size_t flt_ac_nodes(const flt_ac_t *ac);
size_t flt_ac_words(const flt_ac_t *ac);

/* ---- ruleset internals (ruleset.c) --------------------------------------- */

typedef struct flt_rule {
    char *name;
    int action;               /* flt_action_t */
    bool is_regex;            /* else a word list */
    sl_mseries_t *hits;       /* sluice_filter_hits_total{rule,action} */
    sl_mseries_t *limit_hits; /* sluice_filter_regex_limit_hits_total{rule} */
    pcre2_code *code;         /* regex only */
    uint32_t lookbehind;      /* regex only: max lookbehind, characters */
} flt_rule_t;

/* Per byte, the regexes a match may start with that byte (from PCRE2's own
 * start-of-match analysis); regexes without such an analysis have their
 * bit set for every byte. Lets a regex with nothing pending skip text that
 * cannot start a match without a pcre2_match() call. */
#define FLT_RE_WORDS ((FLT_MAX_RULES + 63) / 64)

struct flt_ruleset {
    atomic_int refs;
    flt_rule_t *rules; /* word lists first, then regexes */
    size_t nrules;
    size_t first_regex; /* index of the first regex rule */
    size_t nwords;      /* distinct words loaded */
    flt_ac_t *ac;       /* NULL when there are no words */
    pcre2_match_context *mctx;
    char *mask;
    size_t mask_len;
    flt_conf_input_t input; /* system_prompt copied below */
    char *system_prompt;
    bool output;
    int on_limit;
    size_t holdback_max;
    size_t history; /* folded bytes kept before a regex's scan point (lookbehind) */
    uint64_t re_start[256][FLT_RE_WORDS]; /* bit k: regex k may start with this byte */
    uint8_t re_any[256]; /* 1: some regex may start with this byte (re_start's OR) */
    /* re_any for the 32-byte passes (scan.c, flt_re_tables_build): per low
     * nibble the high nibbles (bits) of the ASCII bytes in it, per high
     * nibble its bit; each 16-byte table twice, one per AVX2 lane */
    unsigned char re_nib[2][32];
    bool avx2; /* the CPU has AVX2: the passes run (else a loop a byte) */
    sl_mseries_t *event_seconds;
    sl_mseries_t *holdback_forced;
};

/* ---- text channel (scan.c) ----------------------------------------------- */

/* Fills rs->re_nib and rs->avx2 from rs->re_any (after the regexes). */
void flt_re_tables_build(flt_ruleset_t *rs);

/* A match waiting to be applied, in original-text byte offsets. */
typedef struct flt_range {
    size_t os, oe;
} flt_range_t;

/* One text stream (one choice of an answer, or one prompt message) filtered
 * with hold-back. Offsets named f* are in the folded text, o* in the
 * original text, all absolute from the start of the stream. */
typedef struct flt_chan {
    const flt_ruleset_t *rs; /* borrowed */
    pcre2_match_data *md;
    uint32_t ac; /* automaton state after the last folded byte */
    /* folded window: fb[i] is folded byte fstart+i; fmap[i] its original offset */
    unsigned char *fb;
    size_t *fmap;
    size_t flen, fcap, fstart;
    size_t femit; /* folded offset released so far */
    /* original text not yet released: ob[i] is original byte ostart+i */
    char *ob;
    size_t olen, ocap, ostart;
    size_t *rstart;  /* per regex: folded offset where its next search starts */
    size_t nrstart;  /* entries in rstart (kept by flt_chan_recycle) */
    flt_range_t *rg; /* pending masks */
    size_t nrg, rgcap;
    size_t mask_until; /* original offset up to which released text is masked */
    int block_rule;    /* rule index that blocked, or -1 */
    bool finished;
    bool unbounded; /* whole text at once: no holdback_max */
    /* counts, for results and tests */
    unsigned nmask, nlog, nlimit, nforced;
    unsigned nclean; /* pieces released whole without the windows (chan_feed_clean) */
} flt_chan_t;

int flt_chan_init(flt_chan_t *c, const flt_ruleset_t *rs) SL_WUR;
void flt_chan_fini(flt_chan_t *c);
/* Empties c for another text, keeping its buffers up to FLT_CHAN_KEEP
 * bytes of text (larger ones are freed) and its match data; c borrows no
 * ruleset after. flt_chan_rearm() readies it for rs (0, or -1 on OOM with
 * c finalised). */
#define FLT_CHAN_KEEP 512
void flt_chan_recycle(flt_chan_t *c);
int flt_chan_rearm(flt_chan_t *c, const flt_ruleset_t *rs) SL_WUR;

typedef enum flt_chan_rc {
    FLT_CHAN_ERR = -1,
    FLT_CHAN_OK = 0,
    FLT_CHAN_BLOCK = 1,
} flt_chan_rc_t;

/* Feeds text (valid UTF-8 of whole characters, as a JSON string always is;
 * anything else is an error) and appends the text released by it (masks
 * applied) to out. BLOCK: a block rule matched; nothing is appended and the
 * channel takes no more text. */
flt_chan_rc_t flt_chan_feed(flt_chan_t *c, const char *s, size_t n, sl_buf_t *out) SL_WUR;
/* flt_chan_feed, except that a piece released whole and alone, unchanged
 * (the clean path), is not copied: *same is set and out left as it was,
 * the caller's s being the output. */
flt_chan_rc_t flt_chan_feed_same(flt_chan_t *c, const char *s, size_t n, sl_buf_t *out,
                                 bool *same) SL_WUR;
/* End of text: releases everything held back (final, non-partial regex pass). */
flt_chan_rc_t flt_chan_finish(flt_chan_t *c, sl_buf_t *out) SL_WUR;
/* Original bytes held back now. */
size_t flt_chan_held(const flt_chan_t *c);

/* Whether a whole text certainly has no hit, without a channel: it is
 * valid UTF-8 that folding leaves as it is (ASCII, é, CJK: not a
 * fullwidth form), no word ends anywhere in it and no regex matches it in
 * one complete search. false: maybe (text folding changes, invalid UTF-8,
 * a hit, a regex limit): the channel decides. Most texts are clean,
 * and the channel's buffers, map and release steps cost ~7 allocations. */
bool flt_text_clean(const flt_ruleset_t *rs, const char *s, size_t n);

/* flt_text_clean() of the text parts of a message's content (parts[0..n),
 * as the body scanner read them), joined as the channel reads them: one
 * text, the other parts (image_url...) left out. One text part is judged
 * in place; more are copied together first (false when that copy cannot be
 * allocated: the channel decides). */
bool flt_parts_clean(const flt_ruleset_t *rs, const sl_chat_part_t *parts, size_t n);

/* Whether no string of a JSON text (the text need not be JSON: if it is)
 * can hold a hit, without parsing it: no backslash (each string's text is
 * then its bytes between two quotes), ASCII, no word ends anywhere in it,
 * and no byte inside a string can start a regex match. true implies
 * flt_text_clean() of every string the text holds; false: maybe. */
bool flt_json_strings_clean(const flt_ruleset_t *rs, const char *s, size_t n);

/* Whole text at once: out gets the filtered text (masks applied). Same rules
 * and result as feeding it in pieces. */
flt_chan_rc_t flt_text_filter(const flt_ruleset_t *rs, const char *s, size_t n,
                              sl_buf_t *out) SL_WUR;
/* flt_text_filter without its flt_text_clean shortcut: the channel alone
 * (what the shortcut must agree with). */
flt_chan_rc_t flt_chan_text(const flt_ruleset_t *rs, const char *s, size_t n, sl_buf_t *out) SL_WUR;

/* Appends text (valid UTF-8) as a JSON string, quotes included: only the
 * quote, the backslash and control characters are escaped (stream.c). */
int flt_json_str_encode(sl_buf_t *b, const char *s, size_t n) SL_WUR;

/* ---- streams (stream.c) ----------------------------------------------------- */

/* Turns the template shortcut off or on (tests compare both). */
void flt_stream_template(flt_stream_t *st, bool on);
/* Events read through the template so far. */
size_t flt_stream_template_hits(const flt_stream_t *st);
/* Events read through one of the thread's shapes so far (events of other
 * streams kept as common/jshape shapes; off with the template). */
size_t flt_stream_shape_hits(const flt_stream_t *st);
/* Drops the calling thread's shapes (tests start from none). */
void flt_stream_shapes_clear(void);
/* Tests: reads event data[0..n) as flt_stream_event would (template,
 * shapes, whole parse) and prints into buf what the read found: the
 * result, usage and every choice's facts with their spans. Returns the
 * read's result (0, 1 fail closed, -1 out of memory). */
int flt_stream_facts(flt_stream_t *st, const char *data, size_t n, char *buf, size_t cap);

/* yajl's memory for one parse comes from common/yheap.h (on the parser's
 * stack): a handle, its lexer and state stack take ~500 bytes. */

#endif
