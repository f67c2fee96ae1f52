/*
 * conf_internal.h — the shape of the table of keys (conf_keys.c) and the
 * generic walker over it (conf.c). Only conf/ and its tests include this;
 * the rest of sluice sees conf.h.
 *
 * A table describes one C struct: a row per YAML key says where the value
 * goes (offsetof), its type, its default (as YAML text, parsed exactly like
 * input), its bounds, whether a reload may change it, and a one-line doc.
 * Nested sections are rows pointing at another table. Everything generic —
 * parse, defaults, bounds, `file:line` errors, free, the reload comparison
 * and the Markdown reference — walks these rows, so no section has code of
 * its own beyond optional checks.
 */
#ifndef SL_CONF_INTERNAL_H
#define SL_CONF_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/sl.h"

/* What a row's value is, and how it is stored at base + off. */
typedef enum conf_type {
    CONF_BOOL,     /* bool; YAML true / false only */
    CONF_INT,      /* int64_t */
    CONF_SIZE,     /* int64_t bytes; "16k", "1m", "1g" (binary) or an integer */
    CONF_DURATION, /* int64_t ms; "250ms", "10s", "5m", "1h", "1d" or an integer (ms) */
    CONF_STRING,   /* char *, owned, never empty */
    CONF_ENUM,     /* int: index of the value in enums[] */
    CONF_STRLIST,  /* sequence of scalars: char ** at off, size_t count at count_off */
    CONF_STRUCT,   /* mapping: the fields of sub live at base + off (off 0 with a
                      sub describing the same struct = a YAML-only grouping) */
    CONF_LIST,     /* sequence of mappings: sub->size elements at off (pointer),
                      size_t count at count_off */
    CONF_MAP,      /* mapping name -> mapping: like CONF_LIST, the key stored as a
                      char * at sub->name_off, in file order */
    CONF_STRMAP,   /* mapping string -> string: conf_kv_t * at off, size_t count at
                      count_off, in file order */
} conf_type_t;

/* Row flags. A row is reloadable when it and every row above it carry
 * CONF_RELOAD; omitting it is the safe mistake (the key needs a restart). */
enum {
    CONF_RELOAD = 1u << 0,   /* a SIGHUP reload may change it */
    CONF_REQUIRED = 1u << 1, /* must appear in the file (then no default) */
    CONF_AUTO = 1u << 2,     /* CONF_INT: the word "auto" is accepted and stored as 0 */
    /* CONF_STRLIST of the root: file globs whose lists and maps are merged
     * into this table's (a single string is accepted too). */
    CONF_INCLUDE = 1u << 3,
};

/* The most rows one table may have (duplicate detection is a bitmap). */
#define CONF_TABLE_MAX_KEYS 64
/* Longest scalar accepted anywhere (keys, strings, numbers). */
#define CONF_SCALAR_MAX 4096
/* Longest key path kept for messages ("upstreams.main.servers[2].url"). */
#define CONF_PATH_MAX 256

typedef struct conf_ctx conf_ctx_t;
struct conf_table;

typedef struct conf_key {
    const char *name; /* the YAML key */
    conf_type_t type;
    size_t off;       /* offsetof the field in the table's struct */
    size_t count_off; /* CONF_STRLIST, CONF_LIST, CONF_MAP, CONF_STRMAP: the size_t count */
    const char *def;  /* default as YAML text; NULL = zero / NULL / empty */
    /* Bounds, inclusive: the value for CONF_INT/SIZE/DURATION, the number of
     * items for lists and maps. Both 0 = unbounded (only for scalars where
     * any value is meaningful; the table self-check insists on a max for
     * numbers and collections). */
    int64_t min, max;
    const char *const *enums;     /* CONF_ENUM: NULL-terminated, index = stored value */
    const struct conf_table *sub; /* CONF_STRUCT, CONF_LIST, CONF_MAP */
    /* Optional check of a scalar once it is set (from the file or the
     * default), given the struct that holds it, so it can also fill derived
     * fields. Returns 0, or -1 with a message (no key, no line) in msg. */
    int (*check)(void *obj, char *msg, size_t msglen);
    unsigned flags;  /* CONF_RELOAD | CONF_REQUIRED | CONF_AUTO */
    const char *doc; /* one line for the reference; no '|' needed, it is escaped */
} conf_key_t;

typedef struct conf_table {
    const conf_key_t *keys;
    size_t nkeys;
    size_t size; /* sizeof the struct the rows' offsets are relative to */
    /* List and map elements: where to store the item's line, and (maps) the
     * owned copy of its key. */
    bool has_line;
    size_t line_off; /* int */
    bool has_name;
    size_t name_off; /* char * */
    /* Optional check run once the mapping is complete (or absent, with the
     * parent's line): for rules between keys. Report with conf_errorf(). */
    int (*check)(conf_ctx_t *ctx, void *obj, int line);
} conf_table_t;

/* The root of sluice's configuration (conf_keys.c), describing conf_t. */
extern const conf_table_t conf_root_table;

/* ---- the generic walker (conf.c), usable with any table ------------------ */

/* Parses YAML text into obj (sizeof = root->size, zeroed by the caller):
 * defaults, then the file, then checks. `name` stands for the file in
 * messages. On error returns -1 with one line in err; obj may then be half
 * filled and must still be released with conf_tree_free(). */
int conf_tree_load(const conf_table_t *root, void *obj, const char *yaml, size_t len,
                   const char *name, char *err, size_t errlen) SL_WUR;

/* Frees everything the rows own inside obj (not obj itself). */
void conf_tree_free(const conf_table_t *t, void *obj);

/* 0 when every non-reloadable key has the same value in a and b; else -1
 * and "KEY.PATH: changed; needs a restart" in err. */
int conf_tree_diff(const conf_table_t *t, const void *a, const void *b, char *err,
                   size_t errlen) SL_WUR;

/* The Markdown reference of every row under t. */
void conf_tree_reference(const conf_table_t *t, FILE *out);

/* Self-check of a table, for tests: offsets within the struct, bounds set
 * on numbers and collections, defaults that parse and pass bounds and
 * checks, required rows without defaults, no restart-only row inside a
 * reloadable list or map (elements cannot be matched across a reload),
 * unique names, at most CONF_TABLE_MAX_KEYS rows. */
int conf_table_validate(const conf_table_t *t, char *err, size_t errlen) SL_WUR;

/* For table checks: reports "FILE:LINE: PATH[.sub]: message", where PATH is
 * the key path of the mapping being checked; `sub` may be NULL. Returns -1
 * so a check can `return conf_errorf(...)`. */
int conf_errorf(conf_ctx_t *ctx, int line, const char *sub, const char *fmt, ...) SL_PRINTF(4, 5);

/* The same, but the file and line are where PATH[.sub] was set when the
 * walk met it (it may be in an included file); `line` otherwise. For root
 * checks about elements of lists and maps. */
int conf_errorf_key(conf_ctx_t *ctx, int line, const char *sub, const char *fmt, ...)
    SL_PRINTF(4, 5);

/* Formats a duration (ms) or a size (bytes) in the largest exact unit:
 * 90000 -> "90s", 16384 -> "16k". */
void conf_format_duration(int64_t ms, char *buf, size_t n);
void conf_format_size(int64_t bytes, char *buf, size_t n);

#endif
