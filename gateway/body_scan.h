/*
 * body_scan.h — the client's JSON body read in one streaming pass (yajl),
 * without building a tree: the whole document validated with exactly the
 * acceptance of gw_json_intake (jansson), and only the facts sluice needs
 * recorded, each with the byte span of its value. Edits (the alias's model,
 * a clamped max_tokens, stream_options) are a splice list applied once, so
 * every other byte goes upstream as the client sent it.
 *
 * Anything the scanner is not sure jansson would accept exactly as it does
 * (duplicate keys, deep nesting, non-UTF-8, lone surrogates, numbers that
 * overflow a double, a top level that is not an object...) is answered
 * GW_SCAN_SLOW: the caller parses with jansson, whose verdict and error
 * message stand (the slow path is today's path, not a guess).
 */
#ifndef GW_BODY_SCAN_H
#define GW_BODY_SCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sl.h"
#include "common/sl_chat.h"

/* One scalar or container fact: its type, its bytes [off, end) in the
 * body, and its value for integers and strings (decoded; borrowed from the
 * body or the scan's arena). The values share their bytes: read the one
 * that kind names, nothing else. 40 bytes, not 64: at 5,000 connections
 * each line of the scanner's facts that a request touches is an L2 miss
 * (and the reset touches none of them: gw_body_scan_t's facts_set). */
typedef struct gw_jfact {
    sl_jkind_t kind;
    size_t off, end;
    union {
        int64_t i;   /* SL_J_INT (and SL_J_REAL: the scan's own use) */
        sl_text_t s; /* SL_J_STRING */
        struct {
            size_t close;   /* SL_J_OBJECT, SL_J_ARRAY: offset of its '}' or ']' */
            size_t members; /* SL_J_OBJECT, SL_J_ARRAY: how many members it has */
        };
    };
} gw_jfact_t;

/* Which facts are wanted beyond the top-level scalars. */
#define GW_SCAN_MSGS 0x1u /* messages[] content, roles, parts (filters, budgets, routing) */
/* For tests and the fuzz target: how the body reaches yajl (body_scan.c's
 * skeleton). Results must not depend on them. */
#define GW_SCAN_NO_SKEL    0x100u /* yajl reads the whole body, whatever its size */
#define GW_SCAN_SKEL_TEST  0x200u /* a skeleton at any size, runs cut from 3 bytes */
#define GW_SCAN_NO_SHAPE   0x400u /* no kept shape tried or kept: yajl reads the body */
#define GW_SCAN_SHAPE_TEST 0x800u /* a shape tried whatever the misses before */

typedef enum gw_scan_rc {
    GW_SCAN_OK = 0,
    GW_SCAN_SLOW = 1, /* let jansson decide (see above) */
    GW_SCAN_OOM = -1,
} gw_scan_rc_t;

typedef struct gw_scan_arena gw_scan_arena_t;

/* internal (body_scan.c): one edit */
typedef struct gw_splice {
    size_t off, del; /* bytes [off, off + del) of the body replaced by text */
    const char *key; /* the top-level key it sets (static), NULL for others */
    char *text;
    size_t len;
    bool comma; /* a member added: "," before it */
} gw_splice_t;

/* Storage that small bodies never outgrow, in the struct itself: an
 * ordinary request costs no allocation for its facts and edits. */
#define GW_SCAN_INLINE_MSGS    8
#define GW_SCAN_INLINE_PARTS   8
#define GW_SCAN_INLINE_SPLICES 4
#define GW_SCAN_INLINE_TEXT    512

/* The top-level facts a scan records, by index into gw_body_scan_t's fact
 * (read them with gw_body_fact). */
typedef enum gw_fact_id {
    GW_F_TOP = 0, /* the document (an object) */
    GW_F_MODEL,
    GW_F_STREAM,
    GW_F_STREAM_OPTIONS,
    GW_F_INCLUDE_USAGE, /* stream_options.include_usage */
    GW_F_MAX_TOKENS,
    GW_F_MAX_COMPLETION_TOKENS,
    GW_F_MAX_OUTPUT_TOKENS,
    GW_F_N,
    GW_F_INPUT,        /* the Responses API's (its text when a string) */
    GW_F_INSTRUCTIONS, /* the Responses API's */
    GW_F_TOOLS,        /* chat's and the Responses API's: the estimate walks its span */
    GW_F_COUNT
} gw_fact_id_t;

typedef struct gw_body_scan {
    const char *body; /* borrowed: the bytes scanned (stable until the scan is reset) */
    size_t len;
    /* Bit i: fact[i] was written by this scan; every other fact is absent
     * and its bytes are a former scan's. The reset clears these bits only,
     * not the facts' kinds: at 5,000 connections a scanner is cold when its
     * request starts, and the facts' eight lines that a body without
     * max_tokens, tools, input... never writes were eight L2 misses. */
    uint16_t facts_set;
    gw_jfact_t fact[GW_F_COUNT]; /* read through gw_body_fact, never directly */
    bool bigint;                 /* an integer beyond int64 somewhere (jansson: a real) */
    bool has_msgs;               /* chat below was filled (GW_SCAN_MSGS) */
    size_t elided;               /* body bytes yajl did not read (string interiors cut) */
    sl_chat_t chat;

    /* internals: storage for messages, parts, decoded strings, splices */
    sl_chat_msg_t *msgs;
    size_t msgs_cap;
    sl_chat_part_t *parts;
    size_t nparts, parts_cap;
    gw_scan_arena_t *arena;
    gw_splice_t *splices;
    size_t nsplices, splices_cap;
    size_t text0_used;
    sl_chat_msg_t msgs0[GW_SCAN_INLINE_MSGS];
    sl_chat_part_t parts0[GW_SCAN_INLINE_PARTS];
    gw_splice_t splices0[GW_SCAN_INLINE_SPLICES];
    char text0[GW_SCAN_INLINE_TEXT];
} gw_body_scan_t;

/* The fact id of s's last scan: its own when the scan wrote it, else a
 * shared absent fact (kind SL_J_ABSENT, the rest zero). */
extern const gw_jfact_t gw_jfact_absent;
static inline const gw_jfact_t *gw_body_fact(const gw_body_scan_t *s, gw_fact_id_t id)
{
    return (s->facts_set >> id) & 1u ? &s->fact[id] : &gw_jfact_absent;
}

gw_body_scan_t *gw_body_scan_new(void) SL_WUR;
/* Frees s and what it holds; NULL is fine. */
void gw_body_scan_free(gw_body_scan_t *s);
/* Forgets the last scan and its splices (keeps the storage for the next). */
void gw_body_scan_reset(gw_body_scan_t *s);

/* Scans body (borrowed; it must stay unchanged while s is used) with
 * GW_SCAN_* flags. */
gw_scan_rc_t gw_body_scan(gw_body_scan_t *s, const char *body, size_t len, unsigned flags) SL_WUR;

/* ---- edits: recorded as splices, applied by gw_body_splice_apply -------- */

/* The top-level member key (a plain ASCII name) set to the JSON text val:
 * its value replaced when the key is there (f: its fact), else the member
 * added at the end of the object. Setting the same key again replaces the
 * earlier edit. -1: out of memory. */
int gw_body_set(gw_body_scan_t *s, const char *key, const gw_jfact_t *f, const char *val,
                size_t vlen) SL_WUR;
/* stream_options.include_usage made true, however stream_options is now
 * (absent, null, an object without it or with another value). -1: OOM. */
int gw_body_set_include_usage(gw_body_scan_t *s) SL_WUR;
/* Any edit recorded? */
static inline bool gw_body_edited(const gw_body_scan_t *s)
{
    return s && s->nsplices > 0;
}
/* The body with every splice applied, into out (malloc'd, *outlen its
 * length). -1: out of memory. */
int gw_body_splice_apply(const gw_body_scan_t *s, char **out, size_t *outlen) SL_WUR;
/* The same into buf (cap bytes, the caller's) when it fits with a NUL,
 * else into a malloc'd block: *out is buf or that block (the caller frees
 * it when it is not buf). -1: out of memory. */
int gw_body_splice_apply_buf(const gw_body_scan_t *s, char *buf, size_t cap, char **out,
                             size_t *outlen) SL_WUR;

/* The spliced body as pieces in order, without building it: each run of
 * the client's bytes (body: true, a span of s->body) and each splice text
 * (body: false, valid only during the call) handed to piece; a non-zero
 * return stops the walk and is returned. -1: out of memory. */
typedef int (*gw_body_piece_fn)(void *arg, const char *p, size_t n, bool body);
int gw_body_splice_walk(const gw_body_scan_t *s, gw_body_piece_fn piece, void *arg) SL_WUR;

/* This thread's shape cache (body_scan.c, "shapes"): bodies answered from a
 * kept shape, and bodies that could have been but matched none. */
typedef struct gw_shape_stats {
    uint64_t hits, misses;
} gw_shape_stats_t;
gw_shape_stats_t gw_body_scan_shape_stats(void);
/* Forgets this thread's kept shapes (tests). */
void gw_body_scan_shapes_clear(void);

/* The facts ratelimit's clamp plan takes (rl_clamp_plan), into in. */
struct rl_clamp_in;
void gw_body_scan_clamp_in(const gw_body_scan_t *s, struct rl_clamp_in *in);

/* The JSON text of a string (quotes and escapes), into buf; 0, or -1 when
 * it does not fit or is not UTF-8. Uses jansson for anything but plain
 * printable ASCII. */
int gw_json_quote(const char *v, size_t n, char *buf, size_t cap, size_t *outlen) SL_WUR;

#endif
