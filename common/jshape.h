/*
 * jshape.h — a small JSON text's shape kept, so that a later text which
 * differs from it only inside chosen values is known to read the same way
 * without parsing it again.
 *
 * After a parser (yajl) accepted a text and its caller recorded what it
 * needed, the caller may keep the text as a shape with holes: interiors of
 * string values (the bytes between the quotes) and whole integer values. A
 * later text has the shape when every byte outside the holes is the same
 * and each hole holds a value of the hole's kind:
 *   - a string hole: a run of bytes with no '"', no '\' and no control byte
 *     (< 0x20), ended by the '"' the shape has there: a JSON string's
 *     interior without escapes;
 *   - an integer hole: '-'? then '0' or a digit 1-9 and more digits, at most
 *     SL_JSHAPE_INT_DIGITS digits in all (any such value fits an int64).
 *   - an escaped-string hole (SL_JHOLE_ESTR): the same, with escapes too:
 *     '\' then one of '"' '\' '/' b f n r t, or u and four hex digits
 *     that are not a surrogate half (D800-DFFF: jansson refuses a lone one,
 *     yajl does not, so such a text is no shape's) nor 0000 (jansson refuses
 *     it without JSON_ALLOW_NUL), ended by the first '"'
 *     not escaped. For a caller that reads such a string's bytes itself
 *     (emptiness, a span) or not at all: its value is not the bytes.
 *   - a JSON-string hole (SL_JHOLE_JSTR): as SL_JHOLE_ESTR, and surrogate
 *     escapes too, in pairs only: \uD800-DBFF then at once \uDC00-DFFF
 *     (jansson's rule: a lone or reversed half is no shape's). A caller
 *     that reads the value decodes the bytes (sl_jshape_match_esc says
 *     which holes hold an escape).
 * JSON's grammar lets any such interior stand where another stands, and any
 * integer token where another integer token stands (RFC 8259: what follows
 * a number is whitespace or a structural character, which the shape's own
 * bytes after the hole then match), so a text with the shape is valid
 * exactly when the shape's text was, with the same keys and structure: all
 * the parser found holds again, with the holes' new spans. Keys are never
 * holes. UTF-8 is the caller's to check: a string hole's bytes >= 0x80 are
 * taken as they are.
 *
 * What is not a hole must match byte for byte, whitespace included: one
 * client's texts (the same SDK, the same server) usually do.
 */
#ifndef SL_JSHAPE_H
#define SL_JSHAPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/sl.h"

/* At most this many digits in an integer hole: 10^18 - 1 < 2^63, so the
 * value fits an int64 (a caller that needs it exact as a double checks
 * 2^53 itself). */
#define SL_JSHAPE_INT_DIGITS 18
/* Most holes and bytes a shape keeps. */
#define SL_JSHAPE_MAX_HOLES 64
#define SL_JSHAPE_MAX_BYTES 8192
/* Most bytes of a shape without holes (sl_jshape_set_text): an exact text,
 * matched by its length and one memcmp, so it may be longer. */
#define SL_JSHAPE_MAX_TEXT 16384

typedef enum sl_jhole_kind {
    SL_JHOLE_STR = 1,  /* a string's interior, without its quotes */
    SL_JHOLE_ESTR = 3, /* the same with escapes (below) */
    SL_JHOLE_INT = 2,  /* a whole integer token */
    SL_JHOLE_JSTR = 4, /* the same with surrogate pairs too (above) */
} sl_jhole_kind_t;

typedef struct sl_jspan {
    uint32_t off, len;
} sl_jspan_t;

typedef struct sl_jshape {
    char *bytes; /* the shape's text (owned) */
    size_t len, cap;
    size_t nholes;
    sl_jspan_t hole[SL_JSHAPE_MAX_HOLES]; /* in bytes, in order */
    uint8_t kind[SL_JSHAPE_MAX_HOLES];
} sl_jshape_t;

/* Keeps text p (n bytes, a text the caller's parser accepted) as sh's shape
 * with the holes given (spans in p, in order, not overlapping, each as its
 * kind says: a string's interior between two '"', or a whole integer token).
 * 0; 1 when the holes are not as said or beyond the bounds (sh is then
 * empty); -1 out of memory (empty too). sh's storage is kept for the next. */
int sl_jshape_set(sl_jshape_t *sh, const char *p, size_t n, const sl_jspan_t *holes,
                  const uint8_t *kinds, size_t nholes) SL_WUR;
/* Keeps text p (n bytes) as sh's shape without holes: only the same bytes
 * have it (sl_jshape_is_text). 0; 1 when n is 0 or over SL_JSHAPE_MAX_TEXT
 * (sh is then empty); -1 out of memory (empty too). */
int sl_jshape_set_text(sl_jshape_t *sh, const char *p, size_t n) SL_WUR;
/* Empties sh (no text matches it) and frees its storage. */
void sl_jshape_clear(sl_jshape_t *sh);

static inline bool sl_jshape_empty(const sl_jshape_t *sh)
{
    return sh->len == 0;
}

/* Whether text p (n bytes) is sh's text, sh a shape without holes: the
 * same length, then the same bytes. */
static inline bool sl_jshape_is_text(const sl_jshape_t *sh, const char *p, size_t n)
{
    return sh->nholes == 0 && sh->len == n && n > 0 && memcmp(sh->bytes, p, n) == 0;
}

/* Whether text p (n bytes) has sh's shape (see above); when it has, out
 * (room for sh->nholes spans) gets each hole's span in p. */
bool sl_jshape_match(const sl_jshape_t *sh, const char *p, size_t n, sl_jspan_t *out);
/* sl_jshape_match, and on a match *esc gets bit i set when hole i (a string
 * hole) holds an escape: its value is not its bytes. */
bool sl_jshape_match_esc(const sl_jshape_t *sh, const char *p, size_t n, sl_jspan_t *out,
                         uint64_t *esc);
_Static_assert(SL_JSHAPE_MAX_HOLES <= 64, "sl_jshape_match_esc: a bit a hole");

/* Whether text p (n bytes) begins with sh's shape: as sl_jshape_match on
 * p's first *used bytes (set on a match), what follows them not looked at.
 * For a caller whose parser stops at the shape's last byte (the '}' that
 * closes the value it reads) and never sees what follows. A shape that ends
 * in a hole never matches: an integer there could go on in p. */
bool sl_jshape_match_prefix(const sl_jshape_t *sh, const char *p, size_t n, sl_jspan_t *out,
                            size_t *used);

/* The first byte of p[i..n) that is '"', '\' or a control byte (< 0x20),
 * or n: where a string's interior without escapes ends (16 bytes at a time
 * with SSE2). */
size_t sl_jshape_str_end(const char *p, size_t i, size_t n);

/* The value of an integer hole's bytes (as sl_jshape_match vouched for
 * them: no overflow). */
int64_t sl_jshape_int(const char *p, size_t n);

/* ---- a thread's cache of shapes ----------------------------------------------
 *
 * A few shapes a thread keeps for one kind of text, each in a slot beside
 * what its caller keeps with it (the result the shape stands for), with
 * what every such cache needs once:
 *   - nslots slots; a new shape goes into an empty one, else into the
 *     least recently used (a hit or a learn is a use);
 *   - a learning gate: the first gate_run misses after a hit may all learn
 *     (each that asks the gate); past that, one in gate_every (a power of
 *     two), so a run of ever new texts costs a learn per gate_every texts,
 *     not one per text; a hit starts over;
 *   - hits, misses and learns for the caller's metrics;
 *   - its slots freed at the thread's exit (sl_thread_at_exit, common/sl.h:
 *     one pthread key for all that a thread keeps).
 * The caller tries its slots itself (its match: a key, a prefix, a second
 * shape), then tells a hit (sl_jshape_cache_hit) or a miss
 * (sl_jshape_cache_miss); it asks sl_jshape_cache_gate whether to learn
 * (or, to save the tries too, whether to try at all) and learns with
 * sl_jshape_cache_take then sl_jshape_cache_set. Not thread-safe: one per
 * thread (_Thread_local), initialised with SL_JSHAPE_CACHE_INIT. */
#define SL_JSHAPE_CACHE_SLOTS 8 /* most slots a cache has */

typedef struct sl_jshape_slot {
    sl_jshape_t sh; /* empty: a slot to take first */
    uint64_t used;  /* the cache's tick at the slot's last hit or take */
    void *data;     /* the caller's: dsz bytes, zeroed when first taken (owned) */
} sl_jshape_slot_t;

typedef struct sl_jshape_cache_stats {
    uint64_t hits, misses, learns;
} sl_jshape_cache_stats_t;

typedef struct sl_jshape_cache {
    /* the caller's, set once (SL_JSHAPE_CACHE_INIT) */
    unsigned nslots;          /* 1 .. SL_JSHAPE_CACHE_SLOTS */
    unsigned gate_run;        /* misses in a row that all may learn */
    unsigned gate_every;      /* then one in this many (a power of two) */
    size_t dsz;               /* a slot's data (0: none) */
    void (*drop)(void *data); /* frees what a slot's data owns (NULL: nothing) */
    /* the cache's */
    sl_jshape_slot_t slot[SL_JSHAPE_CACHE_SLOTS];
    uint64_t tick;
    unsigned run;  /* gate calls that said yes since the last hit, up to gate_run */
    unsigned skip; /* gate calls past the run */
    unsigned last; /* the slot of the last hit or take: the newest stamp */
    bool listed;   /* on the thread's exit list */
    sl_jshape_cache_stats_t st;
} sl_jshape_cache_t;

#define SL_JSHAPE_CACHE_INIT(n, run, every, datasz, dropfn)                                        \
    {                                                                                              \
        .nslots = (n), .gate_run = (run), .gate_every = (every), .dsz = (datasz), .drop = (dropfn) \
    }

/* Slot i served the text. The last slot hit or taken holds the newest
 * stamp already: a run of hits on one slot (a stream's events) stores none. */
static inline void sl_jshape_cache_hit(sl_jshape_cache_t *c, unsigned i)
{
    if (i != c->last) {
        c->slot[i].used = ++c->tick;
        c->last = i;
    }
    c->run = c->skip = 0;
    c->st.hits++;
}

/* No slot served the text (or none was tried: the gate said no). */
static inline void sl_jshape_cache_miss(sl_jshape_cache_t *c)
{
    c->st.misses++;
}

/* Whether the gate is open: fewer than gate_run yeses since the last hit
 * (nothing counted: for a caller that asks before it tries). */
static inline bool sl_jshape_cache_open(const sl_jshape_cache_t *c)
{
    return c->run < c->gate_run;
}

/* Whether a text that missed is one to learn (or, asked before, one to
 * try at all): yes gate_run times after a hit, then once in gate_every
 * calls. A caller asks once per text it could learn. */
static inline bool sl_jshape_cache_gate(sl_jshape_cache_t *c)
{
    if (c->run < c->gate_run) {
        c->run++;
        return true;
    }
    return (++c->skip & (c->gate_every - 1)) == 0;
}

/* A slot for a new shape, its shape emptied (storage kept) and its data
 * there (zeroed the first time; else as the last shape left it): the index,
 * or -1 (out of memory, or the slot could not be freed at thread exit).
 * The caller fills the data, then sl_jshape_cache_set; a slot left empty
 * matches nothing. */
int sl_jshape_cache_take(sl_jshape_cache_t *c) SL_WUR;

/* sl_jshape_set on slot i's shape (a learn when 0). */
int sl_jshape_cache_set(sl_jshape_cache_t *c, unsigned i, const char *p, size_t n,
                        const sl_jspan_t *holes, const uint8_t *kinds, size_t nholes) SL_WUR;

/* sl_jshape_set_text on slot i's shape (a learn when 0). */
int sl_jshape_cache_set_text(sl_jshape_cache_t *c, unsigned i, const char *p, size_t n) SL_WUR;

/* Frees every slot (drop, then the data) and starts the cache over:
 * the gate, the tick and the counters (tests; the thread's exit). */
void sl_jshape_cache_clear(sl_jshape_cache_t *c);

#endif
