/*
 * filters.h — content filtering for sluice: request checks on the prompt
 * (shape, size, turns, system prompt), sensitive-word lists and regex rules
 * on the prompt and on the answer, streamed or not. Gateway-independent: the
 * gateway plugs it in through a small adapter (gateway/), this module never
 * includes gateway/ headers.
 *
 * Three objects:
 *
 *  - flt_ruleset_t: built once from config (word files read, automaton and
 *    regexes compiled), then immutable and shared by every thread. It is
 *    refcounted: a request takes a reference when it starts and drops it
 *    when it ends, so a SIGHUP reload can swap a new ruleset in (flt_slot_t
 *    does the swap atomically) while requests in flight keep theirs.
 *
 *  - request side: flt_request_check() over the parsed body (jansson), which
 *    it may edit in place (keep_turns, system prompt, truncation, masks).
 *
 *  - answer side: flt_stream_t, one per streamed request. The gateway's SSE
 *    hook feeds it the `data:` payload of each upstream event and sends what
 *    it returns instead. Text is held back only while it could still be the
 *    start of a match (docs/filters.md explains the hold-back).
 *    flt_response_filter() does the same rules on a whole chat.completion.
 *
 * Threading: a ruleset is read-only and may be used from any number of
 * threads at once; a flt_stream_t belongs to one request (one thread).
 */
#ifndef SL_FILTERS_H
#define SL_FILTERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/sl.h"
#include "common/sl_chat.h"
#include "conf/conf.h"

/* ---- configuration ------------------------------------------------------ */

/* What a matching rule does. The order is the strength order: when the same
 * word is in two lists, the stronger action wins. */
typedef enum flt_action {
    FLT_ACTION_BLOCK = 0, /* prompt: 400 content_filter; answer: stop the stream */
    FLT_ACTION_MASK,      /* replace the matched text with the mask string */
    FLT_ACTION_LOG,       /* only count it (sluice_filter_hits_total) */
} flt_action_t;

typedef enum flt_overflow {
    FLT_OVERFLOW_REJECT = 0, /* 400 prompt_too_long */
    FLT_OVERFLOW_TRUNCATE,   /* keep the first max_chars code points */
} flt_overflow_t;

typedef enum flt_sysprompt_mode {
    FLT_SYSPROMPT_PREPEND = 0, /* insert before the client's messages */
    FLT_SYSPROMPT_REPLACE,     /* drop the client's system/developer messages first */
} flt_sysprompt_mode_t;

/* What a regex that hits its match/depth/heap limit counts as. */
typedef enum flt_on_limit {
    FLT_ON_LIMIT_MATCH = 0, /* fail closed: the rule's action applies */
    FLT_ON_LIMIT_NOMATCH,   /* fail open: the text is let through */
} flt_on_limit_t;

/* The `filters:` section, key for key:
 *
 *   filters:
 *     input: { max_chars: 8000, on_overflow: reject, keep_turns: 10,
 *              system_prompt: "...", system_prompt_mode: prepend }
 *     words: [ { file: conf/words/example.txt, action: mask, name: example } ]
 *     regex: [ { name: cn_mobile, pattern: '1[3-9]\d{9}', action: mask } ]
 *     mask: "***"
 *     output: true
 *     regex_limits: { match: 100000, depth: 10000, heap: 4m, on_limit: match }
 *     holdback_max: 4k
 *
 * conf/conf.h's conf_filters_t carries the same from the config file;
 * this plain mirror lets tests and tools build a ruleset without YAML.
 * Strings are borrowed by flt_ruleset_build() (it copies what it keeps). */
typedef struct flt_conf_input {
    int64_t max_chars;         /* per message, Unicode code points; 8000; 0 = no limit */
    int on_overflow;           /* flt_overflow_t, reject */
    int64_t keep_turns;        /* last N user turns kept (system always); 10; 0 = all */
    const char *system_prompt; /* NULL or "" = none */
    int system_prompt_mode;    /* flt_sysprompt_mode_t, prepend */
} flt_conf_input_t;

typedef struct flt_conf_words {
    const char *file; /* UTF-8, one word or phrase per line, `#` comment lines */
    int action;       /* flt_action_t */
    const char *name; /* rule name in metrics; NULL = file base name sans extension */
} flt_conf_words_t;

typedef struct flt_conf_regex {
    const char *name;    /* rule name in metrics; required, unique */
    const char *pattern; /* PCRE2, UTF mode; must not match the empty string */
    int action;          /* flt_action_t */
} flt_conf_regex_t;

typedef struct flt_conf_regex_limits {
    int64_t match;    /* pcre2 match limit, 100000 (applies to JIT too) */
    int64_t depth;    /* pcre2 depth limit, 10000 (interpreter only) */
    int64_t heap_kib; /* pcre2 heap limit in KiB, 4096 (interpreter only) */
    int on_limit;     /* flt_on_limit_t, match */
} flt_conf_regex_limits_t;

typedef struct flt_conf {
    flt_conf_input_t input;
    const flt_conf_words_t *words;
    size_t nwords;
    const flt_conf_regex_t *regex;
    size_t nregex;
    const char *mask; /* "***"; may be "" (delete the match) */
    bool output;      /* filter answers too; true */
    flt_conf_regex_limits_t regex_limits;
    int64_t holdback_max; /* bytes of answer text held back at most per choice, 4096;
                             past it the oldest text is released (counted) */
} flt_conf_t;

/* Fills the defaults above (no rules, output on). */
void flt_conf_defaults(flt_conf_t *c);

/* Bounds checked by flt_ruleset_build(). */
#define FLT_MAX_RULES      256  /* word lists + regexes: bounds the metric series */
#define FLT_MAX_WORD_BYTES 255  /* longest word after folding */
#define FLT_MAX_CHOICES    16   /* choices[].index values a stream may use */
#define FLT_HOLDBACK_MIN   1024 /* holdback_max may not be smaller (> longest word) */

/* ---- ruleset ------------------------------------------------------------ */

typedef struct flt_ruleset flt_ruleset_t;

/* Builds the ruleset of the `filters:` section: reads the word files,
 * builds the automaton, compiles the regexes, registers the metrics. NULL on
 * error with one line in err ("filters.words[0]: conf/words/x.txt:12:
 * invalid UTF-8"). The result has one reference. */
flt_ruleset_t *flt_ruleset_new(const conf_filters_t *conf, char *err, size_t errlen) SL_WUR;

/* The same from the plain struct above (tests, tools). */
flt_ruleset_t *flt_ruleset_build(const flt_conf_t *conf, char *err, size_t errlen) SL_WUR;

/* Takes one more reference; returns rs. Thread-safe. */
flt_ruleset_t *flt_ruleset_ref(flt_ruleset_t *rs);
/* Drops one reference; the last one frees. NULL-safe. Thread-safe. */
void flt_ruleset_unref(flt_ruleset_t *rs);

/* Whether answers are filtered at all (output: true and at least one rule);
 * when false the gateway need not create a flt_stream_t. */
bool flt_ruleset_filters_output(const flt_ruleset_t *rs);
/* Counts, for logs at load time. */
size_t flt_ruleset_word_count(const flt_ruleset_t *rs);
size_t flt_ruleset_regex_count(const flt_ruleset_t *rs);

/* The current ruleset of a process, swapped atomically on reload. */
typedef struct flt_slot flt_slot_t;
/* Takes ownership of rs (may be NULL: "no filtering"). */
flt_slot_t *flt_slot_new(flt_ruleset_t *rs);
void flt_slot_free(flt_slot_t *s);
/* A new reference to the current ruleset (NULL if none); the caller unrefs. */
flt_ruleset_t *flt_slot_acquire(flt_slot_t *s) SL_WUR;
/* Installs rs (takes ownership) and drops the slot's reference to the old one;
 * requests holding the old one keep it until they unref. */
void flt_slot_swap(flt_slot_t *s, flt_ruleset_t *rs);

/* 1 when s[0..n) is valid UTF-8 (no overlongs, no surrogates): stricter
 * than yajl's check, as strict as jansson's (the gateway's Responses
 * adapter checks its kept shapes' holes with it). */
int flt_utf8_valid(const char *s, size_t n);

/* ---- request side ------------------------------------------------------- */

/* Error codes of a rejected request (the OpenAI `error.code`). */
#define FLT_CODE_CONTENT_FILTER   "content_filter"   /* a block rule matched */
#define FLT_CODE_INVALID_JSON     "invalid_json"     /* for the caller: body is not JSON */
#define FLT_CODE_INVALID_BODY     "invalid_body"     /* not an object */
#define FLT_CODE_INVALID_MESSAGES "invalid_messages" /* messages missing, not an array, empty */
#define FLT_CODE_INVALID_MESSAGE  "invalid_message"  /* a message's role or content is wrong */
#define FLT_CODE_PROMPT_TOO_LONG  "prompt_too_long"  /* over max_chars with on_overflow: reject */

typedef enum flt_req_verdict {
    FLT_REQ_ERROR = -1, /* out of memory: answer 500 */
    FLT_REQ_OK = 0,     /* forward the (possibly edited) body */
    FLT_REQ_REJECT = 1, /* answer res->status with flt_error_body(res) */
    FLT_REQ_EDIT = 2,   /* flt_request_check_chat only: edits needed, see there */
} flt_req_verdict_t;

typedef struct flt_req_result {
    int status;        /* 400 when rejected, else 0 */
    const char *code;  /* one of FLT_CODE_*, static */
    const char *param; /* "messages", "messages[3].content", ... (points into message
                          storage below or static) */
    char message[200]; /* human-readable reason, never the matched text */
    char param_buf[64];
    bool modified;      /* the body was edited: serialize it again */
    unsigned masked;    /* mask hits applied */
    unsigned logged;    /* log hits counted */
    unsigned dropped;   /* messages dropped by keep_turns */
    unsigned truncated; /* messages truncated to max_chars */
    const char *rule;   /* the block rule's name when code is content_filter */
} flt_req_result_t;

/* Checks and edits a chat-completions request body in place. The order:
 * shape; keep_turns (a turn starts at a user message; system and developer
 * messages are always kept); system prompt; max_chars per message (text of
 * the string content or of all text parts, in code points); then word and
 * regex rules over the text of every message the client sent (decoded JSON
 * text, so \u escapes hide nothing), masks applied in place. `rs` may be NULL
 * (shape checks only). res is filled in every case. */
flt_req_verdict_t flt_request_check(const flt_ruleset_t *rs, json_t *body,
                                    flt_req_result_t *res) SL_WUR;

/* The same checks over the messages as the gateway's body scanner read
 * them, without a tree and without editing anything: the same verdicts
 * and res for a body the rules leave as it is; FLT_REQ_EDIT when they
 * would change it (keep_turns drops, a truncation, a mask, the system
 * prompt): the caller then runs flt_request_check() on the parsed body. */
flt_req_verdict_t flt_request_check_chat(const flt_ruleset_t *rs, const sl_chat_t *chat,
                                         flt_req_result_t *res) SL_WUR;

/* The OpenAI-style error body for a rejected request:
 * {"error":{"message":...,"type":"invalid_request_error","param":...,"code":...}}
 * malloc'd, NUL-terminated; NULL on OOM. */
char *flt_error_body(const flt_req_result_t *res, size_t *len) SL_WUR;

/* ---- answer side -------------------------------------------------------- */

/* Data payloads to send (each without the "data: " prefix and the blank line). */
typedef struct flt_payload {
    char *data; /* malloc'd, NUL-terminated */
    size_t len;
} flt_payload_t;

typedef struct flt_out {
    flt_payload_t *v;
    size_t n, cap;
} flt_out_t;

/* Frees the payloads, keeps the array for reuse. */
void flt_out_reset(flt_out_t *o);
/* Frees everything; the struct may be reused after. */
void flt_out_release(flt_out_t *o);

typedef enum flt_ev_verdict {
    FLT_EV_ERROR = -1,  /* out of memory: end the stream as for BLOCK (out is empty) */
    FLT_EV_PASS = 0,    /* send the event unchanged; out is empty */
    FLT_EV_REPLACE = 1, /* send out->v[0..n) in its place (n == 0: drop the event) */
    FLT_EV_BLOCK = 2,   /* send out->v[0..n) (final chunks, finish_reason
                           "content_filter"), then "[DONE]", cancel the upstream,
                           feed nothing more */
} flt_ev_verdict_t;

typedef struct flt_stream flt_stream_t;

/* Per-request answer state; takes a reference to rs (dropped by _free). NULL on OOM. */
flt_stream_t *flt_stream_new(flt_ruleset_t *rs) SL_WUR;
void flt_stream_free(flt_stream_t *st);
/* For a caller that keeps streams for reuse (the gateway's per-thread
 * cache): recycle empties st — nothing of its answer stays (held text,
 * hits, a block, the template) and its ruleset reference is dropped — but
 * keeps its first 2 channels and its scratch buffers (each up to 4 KiB;
 * larger ones are freed), so the next stream allocates nothing. rearm
 * readies a recycled stream for rs (takes a reference), as _new would.
 * A recycled stream may also just be freed. */
void flt_stream_recycle(flt_stream_t *st);
void flt_stream_rearm(flt_stream_t *st, flt_ruleset_t *rs);

/* One SSE event's data payload: a chat.completion.chunk JSON (text in
 * choices[].delta.content), a text_completion chunk (choices[].text) or
 * "[DONE]". out must be empty (flt_out_reset) on entry. For "[DONE]" every
 * choice's held-back text is flushed and "[DONE]" is the last payload of a
 * REPLACE. A chunk with a finish_reason flushes that choice first (an extra
 * content chunk before it). `logprobs` are nulled while output filtering is
 * on, as they would leak held-back or masked tokens. A REPLACE payload is
 * the upstream's bytes with only the text strings and logprobs rewritten
 * (the event is read with yajl, not re-serialised). A payload that is not
 * one JSON object, text that is not valid UTF-8 (a lone \u surrogate too),
 * or a key the filter reads given twice fails closed (BLOCK). */
flt_ev_verdict_t flt_stream_event(flt_stream_t *st, const char *data, size_t len,
                                  flt_out_t *out) SL_WUR;
/* The same, for a caller that has read the clock for this event already
 * (sl_now_ns, at the event's arrival; 0: read it here): the time observed
 * in sluice_filter_event_seconds runs from t0_ns, so the event costs one
 * clock read here instead of two. */
flt_ev_verdict_t flt_stream_event_at(flt_stream_t *st, const char *data, size_t len, flt_out_t *out,
                                     int64_t t0_ns) SL_WUR;

/* One piece of choice `index`'s text, for a caller that reads its events
 * itself (the Responses adapter): s[0..n) is fed to that choice's channel
 * and *rel, *rlen give the text released now (borrowed from st, valid until
 * the next call). PASS: exactly the piece (send the event as it came);
 * REPLACE: other text (possibly none: held back, or masked); BLOCK: a block
 * rule matched (or a 17th choice), nothing is released and the stream takes
 * no more; ERROR: out of memory or text that is not valid UTF-8. */
flt_ev_verdict_t flt_stream_text(flt_stream_t *st, int index, const char *s, size_t n,
                                 const char **rel, size_t *rlen) SL_WUR;

/* The upstream ended without "[DONE]": flushes held-back text (REPLACE with
 * chunks, no "[DONE]"), or BLOCK. */
flt_ev_verdict_t flt_stream_end(flt_stream_t *st, flt_out_t *out) SL_WUR;

/* Bytes of answer text currently held back for one choice (tests, debugging). */
size_t flt_stream_held(const flt_stream_t *st, int index);
/* Name of the rule that blocked the stream, or NULL. */
const char *flt_stream_block_rule(const flt_stream_t *st);

/* A whole non-streamed chat.completion: each choices[].message.content is
 * filtered; a mask rewrites it, a block empties it and sets finish_reason
 * "content_filter". *modified tells whether to serialize again. 0 ok, -1 OOM. */
int flt_response_filter(flt_ruleset_t *rs, json_t *body, bool *modified) SL_WUR;

/* The same on the answer's bytes, without a tree (answer.c): the changed
 * strings are spliced in, every other byte is the upstream's. */
typedef enum flt_ans_rc {
    FLT_ANS_ERROR = -1, /* out of memory: fail the answer, as the tree path's -1 */
    FLT_ANS_SAME = 0,   /* nothing to change: send it as it came */
    FLT_ANS_EDITED = 1, /* *out (malloc'd, NUL-terminated, *outlen bytes): send that */
    FLT_ANS_TREE = 2,   /* not read here (not JSON, a duplicate key on the path, an
                           odd finish_reason...): parse it and use flt_response_filter;
                           no rule ran, nothing was counted */
} flt_ans_rc_t;
flt_ans_rc_t flt_response_filter_bytes(flt_ruleset_t *rs, const char *data, size_t n, char **out,
                                       size_t *outlen) SL_WUR;

/* true when no string of the answer data[0..n) (JSON or not) can hold what
 * the output rules change or count, seen from its bytes alone (no parse):
 * output not filtered, or no backslash, ASCII, no word and no regex start
 * inside a string. Then any reader of any API's answer finds every text
 * clean, and the answer goes as it came (FLT_ANS_SAME's first check, for
 * the gateway's other answer shapes). false: maybe. */
bool flt_answer_bytes_clean(const flt_ruleset_t *rs, const char *data, size_t n);

#endif
