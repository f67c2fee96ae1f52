/*
 * conf.c — the generic, table-driven configuration loader.
 *
 * libyaml's document API turns the file into a node tree that keeps every
 * node's line; the walker below descends it guided by a conf_table_t
 * (conf_internal.h), so every section is parsed, defaulted, bounded,
 * compared for reload, freed and documented by the same few functions and
 * nothing here knows what a listener or an upstream is. Section-specific
 * rules live next to their rows in conf_keys.c as check functions.
 *
 * Errors are single lines "FILE:LINE: key.path: message". The walk does
 * not stop at the first: it goes on with the next key, list item or map
 * entry, so `sluice -t` can list every mistake (conf_load_all); conf_load()
 * still reports the first. A table's cross-key check runs only when
 * nothing under it failed, so one mistake does not cascade. Aliases are
 * refused (a node reached twice) so a hostile file can neither loop nor
 * blow up exponentially; size, nesting depth and node count are capped
 * before the document is built.
 *
 * Values pass through ${VAR} substitution (conf_expand) before they are
 * parsed. `include:` (a row flagged CONF_INCLUDE) loads more files, each
 * its own libyaml document (conf_src_t), whose lists and maps are walked
 * after the main file's as one collection (conf_seg_t), so errors there
 * name that file and line. Where every key was set is kept (conf_index)
 * for conf_locate(), which gives errors found later by other modules
 * (secrets read from the environment) their line.
 */
#include "conf/conf.h"
#include "conf/conf_internal.h"

#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <uthash.h>
#include <yaml.h>

/* A conf file larger than this is refused before parsing. */
#define CONF_FILE_MAX (4 * 1024 * 1024)
/* Deepest nesting of mappings and lists, and most nodes, accepted. libyaml
 * rescans its whole stack of open flow collections on every token, so
 * nesting is quadratic (200,000 '[' take minutes); no conf needs either. */
#define CONF_DEPTH_MAX 32
#define CONF_NODES_MAX 200000

/* Most files one conf may pull in with include:, how deep includes may
 * nest, and how many bytes they may add up to: a glob or a cycle must not
 * make a check take unbounded time or memory. */
#define CONF_INCLUDE_FILES_MAX 256
#define CONF_INCLUDE_DEPTH_MAX 8
#define CONF_INCLUDE_BYTES_MAX (16 * 1024 * 1024)
/* Most error lines kept for conf_load_all(); the rest are only counted. */
#define CONF_ERRORS_MAX 100
/* Room kept at the end of the list for "... and N more errors". */
#define CONF_ERRORS_NOTE 48

/* One YAML file (the main one or an included one) being walked. */
typedef struct conf_src {
    char *name; /* as written in messages: the path given, or the include's */
    char *real; /* realpath, to refuse a file included twice (a cycle); may be NULL */
    yaml_document_t doc;
    bool loaded;
    unsigned char *taken; /* per document node: already walked (alias) */
    size_t nnodes;
    size_t idx; /* in ctx->srcs[], = in conf_index.files[] */
} conf_src_t;

/* A collection's value in an included file, merged after the main file's. */
typedef struct conf_seg {
    const conf_key_t *k;
    conf_src_t *src;
    yaml_node_t *node;
    int kline;
} conf_seg_t;

/* Where a key path was set, for conf_locate(). */
typedef struct conf_where {
    char *path;
    size_t file; /* index into conf_index.files */
    int line;
} conf_where_t;

struct conf_index {
    char **files;
    size_t nfiles;
    conf_where_t *w;
    size_t n, cap;
};

struct conf_ctx {
    const char *name; /* the current file's name, for messages */
    conf_src_t *src;  /* the file being walked */
    conf_src_t *srcs[CONF_INCLUDE_FILES_MAX + 1];
    size_t nsrcs;
    size_t include_bytes;
    conf_seg_t *segs;
    size_t nsegs, capsegs;
    char *err; /* the first error */
    size_t errlen;
    bool failed;
    size_t nerrors;
    size_t nkept; /* lines in all */
    char *all;    /* every error, one per line; NULL = not wanted */
    size_t alllen, allused;
    struct conf_index *index; /* NULL = not wanted */
    bool files;               /* include: may read files (not for strings) */
    char path[CONF_PATH_MAX]; /* key path of what is being walked */
    size_t plen;
};

/* ---- value parsers ------------------------------------------------------- */

/* Unsigned decimal digits at s; *end after them. -1 when none or overflow. */
static int conf_parse_digits(const char *s, int64_t *out, const char **end)
{
    if (*s < '0' || *s > '9')
        return -1;
    int64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        int d = *s - '0';
        if (v > (INT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    *end = s;
    return 0;
}

static int conf_parse_scaled(const char *s, int64_t *out, const char *const *units,
                             const int64_t *mults)
{
    int64_t v;
    const char *u;
    if (!s || conf_parse_digits(s, &v, &u) != 0)
        return -1;
    int64_t mul = 0;
    if (*u == '\0')
        mul = 1;
    for (size_t i = 0; units[i] && mul == 0; i++)
        if (strcmp(u, units[i]) == 0)
            mul = mults[i];
    if (mul == 0 || v > INT64_MAX / mul)
        return -1;
    *out = v * mul;
    return 0;
}

int conf_parse_duration_ms(const char *s, int64_t *out)
{
    static const char *const units[] = {"ms", "s", "m", "h", "d", NULL};
    static const int64_t mults[] = {1, 1000, 60000, 3600000, 86400000};
    return conf_parse_scaled(s, out, units, mults);
}

int conf_parse_size(const char *s, int64_t *out)
{
    /* Binary multiples; upper case accepted too since "1M" is how many
     * people write a megabyte. */
    static const char *const units[] = {"k", "m", "g", "K", "M", "G", NULL};
    static const int64_t mults[] = {1 << 10, 1 << 20, 1 << 30, 1 << 10, 1 << 20, 1 << 30};
    return conf_parse_scaled(s, out, units, mults);
}

static int conf_parse_int(const char *s, int64_t *out)
{
    bool neg = (*s == '-');
    int64_t v;
    const char *end;
    if (conf_parse_digits(s + neg, &v, &end) != 0 || *end != '\0')
        return -1;
    *out = neg ? -v : v;
    return 0;
}

static void conf_format_scaled(int64_t v, char *buf, size_t n, const char *const *units,
                               const int64_t *mults)
{
    for (size_t i = 0; units[i]; i++)
        if (v != 0 && v % mults[i] == 0) {
            snprintf(buf, n, "%lld%s", (long long)(v / mults[i]), units[i]);
            return;
        }
    snprintf(buf, n, "%lld", (long long)v);
}

void conf_format_duration(int64_t ms, char *buf, size_t n)
{
    static const char *const units[] = {"d", "h", "m", "s", "ms", NULL};
    static const int64_t mults[] = {86400000, 3600000, 60000, 1000, 1};
    conf_format_scaled(ms, buf, n, units, mults);
}

void conf_format_size(int64_t bytes, char *buf, size_t n)
{
    static const char *const units[] = {"g", "m", "k", NULL};
    static const int64_t mults[] = {1 << 30, 1 << 20, 1 << 10};
    conf_format_scaled(bytes, buf, n, units, mults);
}

/* ---- messages and key paths --------------------------------------------- */

/* A value as it may appear in a one-line message: quoted, escaped, cut. */
static void conf_quote(const char *s, char *buf, size_t n)
{
    size_t o = 0, i = 0;
    if (n < 8)
        return;
    buf[o++] = '"';
    /* Room kept for one escape (4), "..." (3), the quote and the NUL. */
    for (; s[i] && o + 9 < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)c;
        } else if (c < 0x20 || c == 0x7f) {
            o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
        } else {
            buf[o++] = (char)c;
        }
    }
    if (s[i]) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o++] = '"';
    buf[o] = '\0';
}

/* Records one error line: the first goes to err (the one-line contract of
 * conf_load()), every one (up to CONF_ERRORS_MAX) to the list -t prints. */
static void conf_error_add(conf_ctx_t *ctx, char *text)
{
    ctx->failed = true;
    ctx->nerrors++;
    /* Keys come from the file: keep the message on one line. */
    for (char *p = text; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    if (ctx->nerrors == 1 && ctx->err && ctx->errlen)
        snprintf(ctx->err, ctx->errlen, "%s", text);
    /* Whole lines only, with room kept for the "... and N more" line. */
    size_t need = strlen(text) + 1 + CONF_ERRORS_NOTE;
    if (ctx->all && ctx->nkept < CONF_ERRORS_MAX && ctx->allused + need < ctx->alllen) {
        int r = snprintf(ctx->all + ctx->allused, ctx->alllen - ctx->allused, "%s%s",
                         ctx->allused ? "\n" : "", text);
        if (r > 0)
            ctx->allused += (size_t)r;
        ctx->nkept++;
    }
}

static void conf_error_at(conf_ctx_t *ctx, const char *file, int line, const char *fmt, ...)
    SL_PRINTF(4, 5);
static void conf_error_at(conf_ctx_t *ctx, const char *file, int line, const char *fmt, ...)
{
    char msg[512], text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(text, sizeof(text), "%s:%d: %s", file, line, msg);
    conf_error_add(ctx, text);
}

/* "KEY.PATH[.sub]: " for the key being walked, or "" at the root. */
static void conf_key_prefix(const conf_ctx_t *ctx, const char *sub, char *buf, size_t n)
{
    const char *dot = (ctx->plen && sub) ? "." : "";
    bool haskey = ctx->plen || sub;
    snprintf(buf, n, "%s%s%s%s", ctx->path, dot, sub ? sub : "", haskey ? ": " : "");
}

int conf_errorf(conf_ctx_t *ctx, int line, const char *sub, const char *fmt, ...)
{
    char key[CONF_PATH_MAX + 80], msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    conf_key_prefix(ctx, sub, key, sizeof(key));
    conf_error_at(ctx, ctx->name, line, "%s%s", key, msg);
    return -1;
}

static const conf_where_t *conf_index_find(const struct conf_index *ix, const char *path);

int conf_errorf_key(conf_ctx_t *ctx, int line, const char *sub, const char *fmt, ...)
{
    char key[CONF_PATH_MAX + 80], msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    conf_key_prefix(ctx, sub, key, sizeof(key));
    const char *file = ctx->name;
    /* The key as written: its path without the ": " of the prefix. */
    char path[CONF_PATH_MAX + 80];
    snprintf(path, sizeof(path), "%s", key);
    size_t pl = strlen(path);
    if (pl >= 2)
        path[pl - 2] = '\0';
    const conf_where_t *w = conf_index_find(ctx->index, path);
    if (w) {
        file = ctx->index->files[w->file];
        line = w->line;
    }
    conf_error_at(ctx, file, line, "%s%s", key, msg);
    return -1;
}

static size_t conf_path_push(conf_ctx_t *ctx, const char *fmt, ...) SL_PRINTF(2, 3);
static size_t conf_path_push(conf_ctx_t *ctx, const char *fmt, ...)
{
    size_t old = ctx->plen;
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(ctx->path + old, sizeof(ctx->path) - old, fmt, ap);
    va_end(ap);
    if (r > 0)
        ctx->plen = SL_MIN(old + (size_t)r, sizeof(ctx->path) - 1);
    return old;
}

static size_t conf_path_push_key(conf_ctx_t *ctx, const char *key)
{
    return conf_path_push(ctx, "%s%s", ctx->plen ? "." : "", key);
}

static void conf_path_pop(conf_ctx_t *ctx, size_t old)
{
    ctx->plen = old;
    ctx->path[old] = '\0';
}

/* ---- rows ---------------------------------------------------------------- */

static void *conf_field(void *obj, size_t off)
{
    return (char *)obj + off;
}

static const void *conf_cfield(const void *obj, size_t off)
{
    return (const char *)obj + off;
}

static bool conf_is_number(const conf_key_t *k)
{
    return k->type == CONF_INT || k->type == CONF_SIZE || k->type == CONF_DURATION;
}

static bool conf_is_scalar(const conf_key_t *k)
{
    return conf_is_number(k) || k->type == CONF_BOOL || k->type == CONF_STRING ||
           k->type == CONF_ENUM;
}

static bool conf_is_collection(const conf_key_t *k)
{
    return k->type == CONF_STRLIST || k->type == CONF_LIST || k->type == CONF_MAP ||
           k->type == CONF_STRMAP;
}

static void conf_format_number(const conf_key_t *k, int64_t v, char *buf, size_t n)
{
    if (k->type == CONF_DURATION)
        conf_format_duration(v, buf, n);
    else if (k->type == CONF_SIZE)
        conf_format_size(v, buf, n);
    else
        snprintf(buf, n, "%lld", (long long)v);
}

static void conf_bounds_text(const conf_key_t *k, char *buf, size_t n)
{
    char lo[32], hi[32];
    conf_format_number(k, k->min, lo, sizeof(lo));
    conf_format_number(k, k->max, hi, sizeof(hi));
    snprintf(buf, n, "%s..%s", lo, hi);
}

/* What a key expects, for "expected X, got Y". */
static void conf_expected(const conf_key_t *k, char *buf, size_t n)
{
    switch (k->type) {
    case CONF_BOOL:
        snprintf(buf, n, "true or false");
        break;
    case CONF_INT:
        snprintf(buf, n, "%s", (k->flags & CONF_AUTO) ? "an integer or auto" : "an integer");
        break;
    case CONF_SIZE:
        snprintf(buf, n, "a size (e.g. 512, 16k, 1m, 1g)");
        break;
    case CONF_DURATION:
        snprintf(buf, n, "a duration (e.g. 250ms, 10s, 5m, 1h, 1d)");
        break;
    case CONF_STRING:
        snprintf(buf, n, "a string");
        break;
    case CONF_ENUM: {
        size_t o = (size_t)snprintf(buf, n, "one of");
        for (size_t i = 0; k->enums && k->enums[i] && o < n; i++)
            o += (size_t)snprintf(buf + o, n - o, "%s %s", i ? "," : "", k->enums[i]);
        break;
    }
    case CONF_STRLIST:
        snprintf(buf, n, "a list of strings");
        break;
    case CONF_LIST:
        snprintf(buf, n, "a list of mappings");
        break;
    case CONF_STRUCT:
    case CONF_MAP:
    case CONF_STRMAP:
        snprintf(buf, n, "a mapping");
        break;
    }
}

/* Sets a scalar row from text (the file's or the default), then bounds and
 * the row's check. ctx->path names the key. */
static int conf_set_scalar(conf_ctx_t *ctx, const conf_key_t *k, void *obj, const char *v, int line)
{
    void *field = conf_field(obj, k->off);
    char q[80], want[160], b[96];
    int64_t n = 0;
    int bad = 0;

    switch (k->type) {
    case CONF_BOOL:
        if (strcmp(v, "true") == 0)
            *(bool *)field = true;
        else if (strcmp(v, "false") == 0)
            *(bool *)field = false;
        else
            bad = 1;
        break;
    case CONF_INT:
    case CONF_SIZE:
    case CONF_DURATION:
        if ((k->flags & CONF_AUTO) && strcmp(v, "auto") == 0) {
            *(int64_t *)field = 0;
            break;
        }
        if (k->type == CONF_INT)
            bad = conf_parse_int(v, &n) != 0;
        else if (k->type == CONF_SIZE)
            bad = conf_parse_size(v, &n) != 0;
        else
            bad = conf_parse_duration_ms(v, &n) != 0;
        if (bad)
            break;
        if ((k->min || k->max) && (n < k->min || n > k->max)) {
            conf_quote(v, q, sizeof(q));
            conf_bounds_text(k, b, sizeof(b));
            return conf_errorf(ctx, line, NULL, "%s is out of bounds (%s)", v, b);
        }
        *(int64_t *)field = n;
        break;
    case CONF_STRING:
        if (*v == '\0')
            return conf_errorf(ctx, line, NULL, "must not be empty");
        free(*(char **)field);
        *(char **)field = sl_xstrdup(v);
        break;
    case CONF_ENUM:
        bad = 1;
        for (int i = 0; k->enums && k->enums[i]; i++)
            if (strcmp(v, k->enums[i]) == 0) {
                *(int *)field = i;
                bad = 0;
                break;
            }
        break;
    default:
        return conf_errorf(ctx, line, NULL, "internal: not a scalar key");
    }
    if (bad) {
        conf_quote(v, q, sizeof(q));
        conf_expected(k, want, sizeof(want));
        return conf_errorf(ctx, line, NULL, "expected %s, got %s", want, q);
    }
    if (k->check) {
        char msg[256] = "invalid value";
        if (k->check(obj, msg, sizeof(msg)) != 0)
            return conf_errorf(ctx, line, NULL, "%s", msg);
    }
    return 0;
}

/* Defaults for every row of t (and of its nested sections) into obj. */
static int conf_apply_defaults(conf_ctx_t *ctx, const conf_table_t *t, void *obj, int line)
{
    for (size_t i = 0; i < t->nkeys; i++) {
        const conf_key_t *k = &t->keys[i];
        if (k->type != CONF_STRUCT && !k->def)
            continue;
        size_t old = conf_path_push_key(ctx, k->name);
        int rc = k->type == CONF_STRUCT
                     ? conf_apply_defaults(ctx, k->sub, conf_field(obj, k->off), line)
                     : conf_set_scalar(ctx, k, obj, k->def, line);
        conf_path_pop(ctx, old);
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* ---- the YAML walk ------------------------------------------------------- */

static int conf_line(const yaml_node_t *n)
{
    return (int)n->start_mark.line + 1;
}

static bool conf_is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *v = (const char *)n->data.scalar.value;
    return n->data.scalar.length == 0 || strcmp(v, "~") == 0 || strcmp(v, "null") == 0 ||
           strcmp(v, "Null") == 0 || strcmp(v, "NULL") == 0;
}

static void conf_describe(const yaml_node_t *n, char *buf, size_t len)
{
    if (n->type == YAML_MAPPING_NODE)
        snprintf(buf, len, "a mapping");
    else if (n->type == YAML_SEQUENCE_NODE)
        snprintf(buf, len, "a list");
    else if (conf_is_null(n))
        snprintf(buf, len, "nothing");
    else
        conf_quote((const char *)n->data.scalar.value, buf, len);
}

/* Makes `src` the file being walked (nodes, messages); returns the previous. */
static conf_src_t *conf_src_enter(conf_ctx_t *ctx, conf_src_t *src)
{
    conf_src_t *prev = ctx->src;
    ctx->src = src;
    ctx->name = src->name;
    return prev;
}

/* Fetches a node of the current file for walking; a node met twice was
 * reached via an alias. `at` is the line to blame (the key's), 0 = the
 * node's own. */
static yaml_node_t *conf_take(conf_ctx_t *ctx, int idx, int at)
{
    yaml_node_t *n = yaml_document_get_node(&ctx->src->doc, idx);
    if (!n) {
        conf_errorf(ctx, 1, NULL, "internal: missing YAML node");
        return NULL;
    }
    size_t i = (size_t)(n - ctx->src->doc.nodes.start);
    if (ctx->src->taken[i]) {
        conf_errorf(ctx, at ? at : conf_line(n), NULL, "YAML aliases (*name) are not supported");
        return NULL;
    }
    ctx->src->taken[i] = 1;
    return n;
}

/* The text of a non-null scalar node, or an error "expected WHAT, got ...". */
static int conf_scalar(conf_ctx_t *ctx, const yaml_node_t *n, const char *what, int kline,
                       const char **out)
{
    if (n->type != YAML_SCALAR_NODE || conf_is_null(n)) {
        char got[80];
        conf_describe(n, got, sizeof(got));
        return conf_errorf(ctx, conf_is_null(n) ? kline : conf_line(n), NULL, "expected %s, got %s",
                           what, got);
    }
    const char *v = (const char *)n->data.scalar.value;
    if (n->data.scalar.length > CONF_SCALAR_MAX)
        return conf_errorf(ctx, conf_line(n), NULL, "value longer than %d bytes", CONF_SCALAR_MAX);
    if (strlen(v) != n->data.scalar.length)
        return conf_errorf(ctx, conf_line(n), NULL, "value contains a NUL byte");
    *out = v;
    return 0;
}

/* Longest environment variable name accepted in ${NAME}. */
#define CONF_VAR_MAX 128

/* Substitutes ${NAME} and ${NAME:-default} in a value from the environment
 * (the default when NAME is unset or empty); "$${" stands for a literal
 * "${". An unset NAME without a default is an error naming it: a conf that
 * silently loses a value is worse than one that refuses to load. Secrets do
 * not go through here: *_env keys name their variable, so the secret never
 * sits in the conf tree. */
static int conf_expand(conf_ctx_t *ctx, const char *v, int line, char *out, size_t outlen)
{
    size_t o = 0;
    for (const char *p = v; *p;) {
        const char *piece = p;
        size_t plen = 1;
        if (p[0] == '$' && p[1] == '$' && p[2] == '{') {
            piece = "${";
            plen = 2;
            p += 3;
        } else if (p[0] == '$' && p[1] == '{') {
            const char *name = p + 2, *e = name;
            while ((*e >= 'A' && *e <= 'Z') || (*e >= 'a' && *e <= 'z') || *e == '_' ||
                   (e > name && *e >= '0' && *e <= '9'))
                e++;
            size_t nlen = (size_t)(e - name);
            const char *def = NULL;
            size_t dlen = 0;
            if (nlen > 0 && e[0] == ':' && e[1] == '-') {
                def = e + 2;
                const char *c = strchr(def, '}');
                e = c ? c : def + strlen(def);
                dlen = (size_t)(e - def);
            }
            if (nlen == 0 || nlen > CONF_VAR_MAX || *e != '}')
                return conf_errorf(ctx, line, NULL,
                                   "bad variable reference: expected ${NAME} or ${NAME:-default} "
                                   "(NAME: [A-Za-z_][A-Za-z0-9_]*), or $${ for a literal ${");
            char var[CONF_VAR_MAX + 1];
            memcpy(var, name, nlen);
            var[nlen] = '\0';
            const char *val = getenv(var);
            if (val && (*val || !def)) {
                piece = val;
                plen = strlen(val);
            } else if (def) {
                piece = def;
                plen = dlen;
            } else {
                return conf_errorf(ctx, line, NULL,
                                   "environment variable %s is not set (${%s:-default} gives a "
                                   "default)",
                                   var, var);
            }
            p = e + 1;
        } else {
            p++;
        }
        if (plen >= outlen - o)
            return conf_errorf(ctx, line, NULL, "value longer than %d bytes once ${...} are set",
                               CONF_SCALAR_MAX);
        memcpy(out + o, piece, plen);
        o += plen;
    }
    out[o] = '\0';
    return 0;
}

/* A scalar value with ${...} substituted: *out is the node's text, or buf. */
static int conf_value(conf_ctx_t *ctx, const yaml_node_t *n, const char *what, int kline, char *buf,
                      size_t buflen, const char **out)
{
    const char *v;
    if (conf_scalar(ctx, n, what, kline, &v) != 0)
        return -1;
    if (!strstr(v, "${")) {
        *out = v;
        return 0;
    }
    if (conf_expand(ctx, v, conf_line(n), buf, buflen) != 0)
        return -1;
    *out = buf;
    return 0;
}

/* The node as a collection of `type`, or NULL for null (= empty). */
static int conf_collection(conf_ctx_t *ctx, const conf_key_t *k, yaml_node_t *n,
                           yaml_node_type_t type, size_t *count)
{
    *count = 0;
    if (conf_is_null(n))
        return 0;
    if (n->type != type) {
        char want[160], got[80];
        conf_expected(k, want, sizeof(want));
        conf_describe(n, got, sizeof(got));
        return conf_errorf(ctx, conf_line(n), NULL, "expected %s, got %s", want, got);
    }
    if (type == YAML_SEQUENCE_NODE)
        *count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    else
        *count = (size_t)(n->data.mapping.pairs.top - n->data.mapping.pairs.start);
    return 0;
}

static int conf_count_bounds(conf_ctx_t *ctx, const conf_key_t *k, size_t count, int line)
{
    if ((k->min || k->max) && ((int64_t)count < k->min || (int64_t)count > k->max)) {
        if ((int64_t)count < k->min)
            return conf_errorf(ctx, line, NULL, "needs at least %lld item%s, got %zu",
                               (long long)k->min, k->min == 1 ? "" : "s", count);
        return conf_errorf(ctx, line, NULL, "at most %lld items allowed, got %zu",
                           (long long)k->max, count);
    }
    return 0;
}

/* ---- where each key was set (conf_locate) -------------------------------- */

/* Bound on the index: one entry per key walked, so a few per YAML node. */
#define CONF_INDEX_MAX (4 * CONF_NODES_MAX)

static void conf_index_add(conf_ctx_t *ctx, int line)
{
    struct conf_index *ix = ctx->index;
    if (!ix || ix->n >= CONF_INDEX_MAX || ix->nfiles == 0)
        return;
    if (ix->n == ix->cap) {
        size_t cap = ix->cap ? ix->cap * 2 : 64;
        conf_where_t *w = sl_xcalloc(cap, sizeof(*w));
        if (ix->n)
            memcpy(w, ix->w, ix->n * sizeof(*w));
        free(ix->w);
        ix->w = w;
        ix->cap = cap;
    }
    /* files[] grows in step with srcs[]: the current file's slot is its. */
    ix->w[ix->n++] = (conf_where_t){sl_xstrdup(ctx->path), ctx->src->idx, line};
}

static const conf_where_t *conf_index_find(const struct conf_index *ix, const char *path)
{
    for (size_t i = 0; ix && i < ix->n; i++)
        if (strcmp(ix->w[i].path, path) == 0)
            return &ix->w[i];
    return NULL;
}

static void conf_index_free(struct conf_index *ix)
{
    if (!ix)
        return;
    for (size_t i = 0; i < ix->n; i++)
        free(ix->w[i].path);
    for (size_t i = 0; i < ix->nfiles; i++)
        free(ix->files[i]);
    free(ix->w);
    free(ix->files);
    free(ix);
}

/* ---- "did you mean" ------------------------------------------------------ */

/* Edit distance with adjacent transpositions (optimal string alignment):
 * "conect" and "shutdown_timout" are one edit from the real key. Names
 * longer than 64 bytes get no suggestion. */
static size_t conf_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return SIZE_MAX;
    size_t d[65][65];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            size_t cost = a[i - 1] != b[j - 1];
            size_t v = SL_MIN(d[i - 1][j] + 1, d[i][j - 1] + 1);
            v = SL_MIN(v, d[i - 1][j - 1] + cost);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                v = SL_MIN(v, d[i - 2][j - 2] + 1);
            d[i][j] = v;
        }
    return d[la][lb];
}

/* The row of t closest to an unknown key, when it is close enough to be a
 * typo (a quarter of the name's length, 1..3 edits); NULL otherwise. */
static const char *conf_suggest(const conf_table_t *t, const char *name)
{
    size_t limit = SL_MAX((size_t)1, SL_MIN((size_t)3, strlen(name) / 4));
    size_t best = SIZE_MAX;
    const char *sugg = NULL;
    for (size_t i = 0; i < t->nkeys; i++) {
        size_t d = conf_edit_distance(name, t->keys[i].name);
        if (d <= limit && d < best) {
            best = d;
            sugg = t->keys[i].name;
        }
    }
    return sugg;
}

static int conf_unknown_key(conf_ctx_t *ctx, const conf_table_t *t, const char *name, int line)
{
    const char *s = conf_suggest(t, name);
    if (s)
        return conf_errorf(ctx, line, NULL, "unknown key; did you mean `%s`?", s);
    return conf_errorf(ctx, line, NULL, "unknown key");
}

/* ---- the YAML walk ------------------------------------------------------- */

static int conf_walk_struct(conf_ctx_t *ctx, const conf_table_t *t, void *obj, yaml_node_t *n,
                            int line);

/* A list or map's value may come in pieces: the main file's, then each
 * included file's (conf_seg_t), walked as one collection. Fills the counts
 * (0 for a piece of the wrong type, which is reported) and returns the sum. */
static size_t conf_segs_count(conf_ctx_t *ctx, conf_seg_t *segs, size_t nsegs,
                              yaml_node_type_t type)
{
    size_t total = 0;
    for (size_t s = 0; s < nsegs; s++) {
        conf_src_t *prev = conf_src_enter(ctx, segs[s].src);
        size_t c = 0;
        if (conf_collection(ctx, segs[s].k, segs[s].node, type, &c) != 0)
            segs[s].node = NULL;
        total += c;
        conf_src_enter(ctx, prev);
    }
    return total;
}

/* A list or map walk's start: the count over the pieces, its bounds, and a
 * zeroed array of k->sub hung on obj with the count up front, so a failure
 * half way leaves something conf_tree_free() can release. */
static int conf_segs_alloc(conf_ctx_t *ctx, const conf_key_t *k, void *obj, conf_seg_t *segs,
                           size_t nsegs, yaml_node_type_t type, char **arr, size_t *count)
{
    size_t errs0 = ctx->nerrors;
    size_t n = conf_segs_count(ctx, segs, nsegs, type);
    conf_src_t *prev = conf_src_enter(ctx, segs[0].src);
    int brc = conf_count_bounds(ctx, k, n, segs[0].kline);
    conf_src_enter(ctx, prev);
    if (brc != 0 || ctx->nerrors != errs0)
        return -1;
    *arr = n ? sl_xcalloc(n, k->sub->size) : NULL;
    *count = n;
    *(void **)conf_field(obj, k->off) = *arr;
    *(size_t *)conf_field(obj, k->count_off) = n;
    return 0;
}

static int conf_walk_list(conf_ctx_t *ctx, const conf_key_t *k, void *obj, conf_seg_t *segs,
                          size_t nsegs)
{
    size_t errs0 = ctx->nerrors, count;
    char *arr;
    if (conf_segs_alloc(ctx, k, obj, segs, nsegs, YAML_SEQUENCE_NODE, &arr, &count) != 0)
        return -1;
    const conf_table_t *sub = k->sub;
    size_t j = 0;
    for (size_t s = 0; s < nsegs; s++) {
        yaml_node_t *n = segs[s].node;
        if (!n || n->type != YAML_SEQUENCE_NODE)
            continue;
        conf_src_t *prev = conf_src_enter(ctx, segs[s].src);
        size_t c = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
        for (size_t i = 0; i < c && j < count; i++, j++) {
            void *elem = arr + j * sub->size;
            size_t old = conf_path_push(ctx, "[%zu]", j);
            yaml_node_t *item = conf_take(ctx, n->data.sequence.items.start[i], 0);
            if (item) {
                int line = conf_line(item);
                conf_index_add(ctx, line);
                if (sub->has_line)
                    *(int *)conf_field(elem, sub->line_off) = line;
                if (conf_apply_defaults(ctx, sub, elem, line) == 0)
                    (void)conf_walk_struct(ctx, sub, elem, item, line);
            }
            conf_path_pop(ctx, old);
        }
        conf_src_enter(ctx, prev);
    }
    return ctx->nerrors == errs0 ? 0 : -1;
}

/* A map entry's name, for finding duplicates (uthash, keyed by the
 * element's own copy of the name). */
typedef struct conf_name {
    const char *name;
    size_t j;
    UT_hash_handle hh;
} conf_name_t;

static int conf_walk_map(conf_ctx_t *ctx, const conf_key_t *k, void *obj, conf_seg_t *segs,
                         size_t nsegs)
{
    size_t errs0 = ctx->nerrors, count;
    char *arr;
    if (conf_segs_alloc(ctx, k, obj, segs, nsegs, YAML_MAPPING_NODE, &arr, &count) != 0)
        return -1;
    const conf_table_t *sub = k->sub;
    /* Per element: the file and line it came from, for duplicate messages. */
    conf_src_t **from = count ? sl_xcalloc(count, sizeof(*from)) : NULL;
    int *lines = count ? sl_xcalloc(count, sizeof(*lines)) : NULL;
    /* Names seen so far, hashed: a map may have 100000 entries
     * (ratelimit.overrides), too many to compare each with every other. */
    conf_name_t *names = count ? sl_xcalloc(count, sizeof(*names)) : NULL, *seen = NULL;
    size_t j = 0;
    for (size_t s = 0; s < nsegs; s++) {
        yaml_node_t *n = segs[s].node;
        if (!n || n->type != YAML_MAPPING_NODE)
            continue;
        conf_src_t *prev = conf_src_enter(ctx, segs[s].src);
        size_t c = (size_t)(n->data.mapping.pairs.top - n->data.mapping.pairs.start);
        for (size_t i = 0; i < c && j < count; i++, j++) {
            void *elem = arr + j * sub->size;
            yaml_node_pair_t *p = &n->data.mapping.pairs.start[i];
            yaml_node_t *kn = conf_take(ctx, p->key, 0);
            const char *name;
            char nbuf[CONF_SCALAR_MAX + 1];
            if (!kn || conf_value(ctx, kn, "a name", conf_line(kn), nbuf, sizeof(nbuf), &name) != 0)
                continue;
            int line = conf_line(kn);
            from[j] = ctx->src;
            lines[j] = line;
            size_t old = conf_path_push_key(ctx, name);
            conf_name_t *hit = NULL;
            HASH_FIND_STR(seen, name, hit);
            size_t dup = hit ? hit->j : j;
            if (dup != j) {
                if (from[dup] == ctx->src)
                    conf_errorf(ctx, line, NULL, "duplicate key (first at line %d)", lines[dup]);
                else
                    conf_errorf(ctx, line, NULL, "duplicate key (first at %s:%d)", from[dup]->name,
                                lines[dup]);
                conf_path_pop(ctx, old);
                continue;
            }
            conf_index_add(ctx, line);
            char *owned = sl_xstrdup(name);
            *(char **)conf_field(elem, sub->name_off) = owned;
            names[j] = (conf_name_t){.name = owned, .j = j};
            HASH_ADD_KEYPTR(hh, seen, owned, strlen(owned), &names[j]);
            if (sub->has_line)
                *(int *)conf_field(elem, sub->line_off) = line;
            yaml_node_t *vn = conf_take(ctx, p->value, line);
            if (vn && conf_apply_defaults(ctx, sub, elem, line) == 0)
                (void)conf_walk_struct(ctx, sub, elem, vn, line);
            conf_path_pop(ctx, old);
        }
        conf_src_enter(ctx, prev);
    }
    HASH_CLEAR(hh, seen);
    free(names);
    free(from);
    free(lines);
    return ctx->nerrors == errs0 ? 0 : -1;
}

static int conf_walk_strlist(conf_ctx_t *ctx, const conf_key_t *k, void *obj, yaml_node_t *n,
                             int kline)
{
    size_t count;
    if (conf_collection(ctx, k, n, YAML_SEQUENCE_NODE, &count) != 0 ||
        conf_count_bounds(ctx, k, count, kline) != 0)
        return -1;
    size_t errs0 = ctx->nerrors;
    char **arr = count ? sl_xcalloc(count, sizeof(char *)) : NULL;
    *(char ***)conf_field(obj, k->off) = arr;
    *(size_t *)conf_field(obj, k->count_off) = count;
    for (size_t i = 0; i < count; i++) {
        size_t old = conf_path_push(ctx, "[%zu]", i);
        yaml_node_t *item = conf_take(ctx, n->data.sequence.items.start[i], 0);
        const char *v;
        char buf[CONF_SCALAR_MAX + 1];
        if (item && conf_value(ctx, item, "a string", conf_line(item), buf, sizeof(buf), &v) == 0) {
            if (*v == '\0')
                conf_errorf(ctx, conf_line(item), NULL, "must not be empty");
            else
                arr[i] = sl_xstrdup(v);
        }
        conf_path_pop(ctx, old);
    }
    return ctx->nerrors == errs0 ? 0 : -1;
}

static int conf_walk_strmap(conf_ctx_t *ctx, const conf_key_t *k, void *obj, yaml_node_t *n,
                            int kline)
{
    size_t count;
    if (conf_collection(ctx, k, n, YAML_MAPPING_NODE, &count) != 0 ||
        conf_count_bounds(ctx, k, count, kline) != 0)
        return -1;
    size_t errs0 = ctx->nerrors;
    conf_kv_t *arr = count ? sl_xcalloc(count, sizeof(conf_kv_t)) : NULL;
    *(conf_kv_t **)conf_field(obj, k->off) = arr;
    *(size_t *)conf_field(obj, k->count_off) = count;
    for (size_t i = 0; i < count; i++) {
        yaml_node_pair_t *p = &n->data.mapping.pairs.start[i];
        yaml_node_t *kn = conf_take(ctx, p->key, 0);
        const char *key, *v;
        char buf[CONF_SCALAR_MAX + 1];
        if (!kn || conf_scalar(ctx, kn, "a key", conf_line(kn), &key) != 0)
            continue;
        size_t old = conf_path_push_key(ctx, key);
        size_t dup = i;
        for (size_t j = 0; j < i && dup == i; j++)
            if (arr[j].key && strcmp(arr[j].key, key) == 0)
                dup = j;
        if (dup != i) {
            conf_errorf(ctx, conf_line(kn), NULL, "duplicate key (first at line %d)",
                        arr[dup].line);
            conf_path_pop(ctx, old);
            continue;
        }
        arr[i].key = sl_xstrdup(key);
        arr[i].line = conf_line(kn);
        conf_index_add(ctx, arr[i].line);
        yaml_node_t *vn = conf_take(ctx, p->value, arr[i].line);
        if (vn && conf_value(ctx, vn, "a string", arr[i].line, buf, sizeof(buf), &v) == 0)
            arr[i].value = sl_xstrdup(v);
        conf_path_pop(ctx, old);
    }
    return ctx->nerrors == errs0 ? 0 : -1;
}

/* `kline` is the line of the key: an empty value's own mark may already
 * point at the next line, and a section's missing keys read best there. */
static int conf_walk_value(conf_ctx_t *ctx, const conf_key_t *k, void *obj, yaml_node_t *n,
                           int kline)
{
    conf_seg_t seg = {k, ctx->src, n, kline};
    switch (k->type) {
    case CONF_STRUCT:
        return conf_walk_struct(ctx, k->sub, conf_field(obj, k->off), n, kline);
    case CONF_LIST:
        return conf_walk_list(ctx, k, obj, &seg, 1);
    case CONF_MAP:
        return conf_walk_map(ctx, k, obj, &seg, 1);
    case CONF_STRLIST:
        return conf_walk_strlist(ctx, k, obj, n, kline);
    case CONF_STRMAP:
        return conf_walk_strmap(ctx, k, obj, n, kline);
    default: {
        char want[160], buf[CONF_SCALAR_MAX + 1];
        const char *v;
        conf_expected(k, want, sizeof(want));
        if (conf_value(ctx, n, want, kline, buf, sizeof(buf), &v) != 0)
            return -1;
        return conf_set_scalar(ctx, k, obj, v, conf_line(n));
    }
    }
}

/* ---- include: -------------------------------------------------------------- */

static int conf_src_parse(conf_ctx_t *ctx, conf_src_t *src, const char *yaml, size_t len);

/* Adds a file to the walk; NULL (reported at line of the current file)
 * when the bounds on included files are hit. */
static conf_src_t *conf_src_add(conf_ctx_t *ctx, const char *name)
{
    if (ctx->nsrcs >= SL_ARRAY_LEN(ctx->srcs))
        return NULL;
    conf_src_t *src = sl_xcalloc(1, sizeof(*src));
    src->name = sl_xstrdup(name);
    src->idx = ctx->nsrcs;
    ctx->srcs[ctx->nsrcs++] = src;
    struct conf_index *ix = ctx->index;
    if (ix) {
        char **files = sl_xcalloc(ix->nfiles + 1, sizeof(*files));
        if (ix->nfiles)
            memcpy(files, ix->files, ix->nfiles * sizeof(*files));
        free(ix->files);
        ix->files = files;
        ix->files[ix->nfiles++] = sl_xstrdup(name);
    }
    return src;
}

static void conf_src_free(conf_src_t *src)
{
    if (!src)
        return;
    if (src->loaded)
        yaml_document_delete(&src->doc);
    free(src->taken);
    free(src->name);
    free(src->real);
    free(src);
}

static void conf_include_file(conf_ctx_t *ctx, const conf_table_t *t, const char *path, int line,
                              int depth);

/* The value of an include key in the current file: a pattern or a list of
 * them, each a glob(3) relative to the including file's directory. At the
 * top (obj set) the patterns are also kept in the struct's row. */
static void conf_include_patterns(conf_ctx_t *ctx, const conf_table_t *t, const conf_key_t *k,
                                  void *obj, yaml_node_t *vn, int kline, int depth)
{
    yaml_node_t *items[64];
    size_t nitems = 0;
    /* A conf given as a string (tests, the fuzzer) has no directory, and
     * must not make the loader read whatever files it names. */
    if (!ctx->files) {
        conf_errorf(ctx, kline, NULL, "only a conf file may include others");
        return;
    }
    if (vn->type == YAML_SEQUENCE_NODE) {
        size_t c = (size_t)(vn->data.sequence.items.top - vn->data.sequence.items.start);
        if (conf_count_bounds(ctx, k, c, kline) != 0)
            return;
        for (size_t i = 0; i < c && nitems < SL_ARRAY_LEN(items); i++)
            if ((items[nitems] = conf_take(ctx, vn->data.sequence.items.start[i], 0)))
                nitems++;
    } else {
        items[nitems++] = vn;
    }
    char **keep = obj && nitems ? sl_xcalloc(nitems, sizeof(char *)) : NULL;
    if (obj) {
        *(char ***)conf_field(obj, k->off) = keep;
        *(size_t *)conf_field(obj, k->count_off) = nitems;
    }
    /* The including file's directory (its name up to the last '/'). */
    const char *slash = strrchr(ctx->src->name, '/');
    int dirlen = slash ? (int)(slash - ctx->src->name) : 0;
    for (size_t i = 0; i < nitems; i++) {
        const char *pat;
        char buf[CONF_SCALAR_MAX + 1], full[PATH_MAX];
        int line = conf_line(items[i]);
        if (conf_value(ctx, items[i], "a file or a glob (conf.d/*.yaml)", kline, buf, sizeof(buf),
                       &pat) != 0)
            continue;
        if (keep)
            keep[i] = sl_xstrdup(pat);
        int r = (pat[0] == '/' || !slash)
                    ? snprintf(full, sizeof(full), "%s", pat)
                    : snprintf(full, sizeof(full), "%.*s/%s", dirlen, ctx->src->name, pat);
        if (r < 0 || (size_t)r >= sizeof(full)) {
            conf_errorf(ctx, line, NULL, "path too long");
            continue;
        }
        glob_t g;
        int rc = glob(full, GLOB_ERR | GLOB_MARK, NULL, &g);
        if (rc == GLOB_NOMATCH) {
            /* A glob matching nothing is an empty conf.d; a plain name
             * that is missing is a mistake. */
            if (!strpbrk(pat, "*?["))
                conf_errorf(ctx, line, NULL, "%s: no such file", full);
            continue;
        }
        if (rc != 0) {
            conf_errorf(ctx, line, NULL, "%s: cannot read (%s)", full,
                        rc == GLOB_NOSPACE ? "out of memory" : strerror(errno));
            globfree(&g);
            continue;
        }
        for (size_t j = 0; j < g.gl_pathc; j++) {
            const char *f = g.gl_pathv[j];
            size_t fl = strlen(f);
            if (fl && f[fl - 1] == '/')
                continue; /* a directory (GLOB_MARK) */
            conf_include_file(ctx, t, f, line, depth + 1);
        }
        globfree(&g);
    }
}

/* Loads one included file and collects its lists and maps (segments the
 * main walk merges after the main file's own). Anything else in it is an
 * error: scalars and sections belong in the main file, where a reader
 * looks for them. */
/* Visits each key of the mapping n described by t, in order; unknown keys
 * and second occurrences are reported here and not visited. The key's
 * path is pushed around the visit. Returns the table's keys seen (bit i:
 * t->keys[i]); seen_line[i] gets the line of each. */
typedef void (*conf_pair_fn)(conf_ctx_t *ctx, const conf_key_t *k, yaml_node_pair_t *p, int kline,
                             void *arg);

static uint64_t conf_map_each(conf_ctx_t *ctx, const conf_table_t *t, yaml_node_t *n,
                              int *seen_line, conf_pair_fn fn, void *arg)
{
    uint64_t seen = 0;
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = conf_take(ctx, p->key, 0);
        const char *name;
        if (!kn || conf_scalar(ctx, kn, "a key", conf_line(kn), &name) != 0)
            continue;
        int kline = conf_line(kn);
        size_t old = conf_path_push_key(ctx, name);
        size_t i = 0;
        while (i < t->nkeys && strcmp(t->keys[i].name, name) != 0)
            i++;
        if (i == t->nkeys) {
            conf_unknown_key(ctx, t, name, kline);
        } else if (seen & (UINT64_C(1) << i)) {
            conf_errorf(ctx, kline, NULL, "duplicate key (first at line %d)", seen_line[i]);
        } else {
            seen |= UINT64_C(1) << i;
            seen_line[i] = kline;
            fn(ctx, &t->keys[i], p, kline, arg);
        }
        conf_path_pop(ctx, old);
    }
    return seen;
}

struct conf_include_arg {
    const conf_table_t *t;
    conf_src_t *src;
    int depth;
};

/* A key of an included file: include: again, or a piece of a list or map
 * the main walk merges in (conf_walk_merged). */
static void conf_include_pair(conf_ctx_t *ctx, const conf_key_t *k, yaml_node_pair_t *p, int kline,
                              void *arg)
{
    struct conf_include_arg *a = arg;
    yaml_node_t *vn;
    if (!(k->flags & CONF_INCLUDE) && k->type != CONF_LIST && k->type != CONF_MAP) {
        conf_errorf(ctx, kline, NULL,
                    "an included file may only hold lists and maps (upstreams, models, "
                    "...); set this in the main file");
    } else if ((vn = conf_take(ctx, p->value, kline)) == NULL) {
        return;
    } else if (k->flags & CONF_INCLUDE) {
        conf_include_patterns(ctx, a->t, k, NULL, vn, kline, a->depth);
    } else {
        if (ctx->nsegs == ctx->capsegs) {
            size_t cap = ctx->capsegs ? ctx->capsegs * 2 : 16;
            conf_seg_t *segs = sl_xcalloc(cap, sizeof(*segs));
            if (ctx->nsegs)
                memcpy(segs, ctx->segs, ctx->nsegs * sizeof(*segs));
            free(ctx->segs);
            ctx->segs = segs;
            ctx->capsegs = cap;
        }
        ctx->segs[ctx->nsegs++] = (conf_seg_t){k, a->src, vn, kline};
    }
}

static void conf_include_file(conf_ctx_t *ctx, const conf_table_t *t, const char *path, int line,
                              int depth)
{
    if (depth > CONF_INCLUDE_DEPTH_MAX) {
        conf_errorf(ctx, line, NULL, "%s: includes nested deeper than %d", path,
                    CONF_INCLUDE_DEPTH_MAX);
        return;
    }
    char *real = realpath(path, NULL);
    for (size_t i = 0; real && i < ctx->nsrcs; i++)
        if (ctx->srcs[i]->real && strcmp(ctx->srcs[i]->real, real) == 0) {
            conf_errorf(ctx, line, NULL, "%s is included twice (an include cycle?)", path);
            free(real);
            return;
        }
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        conf_errorf(ctx, line, NULL, "%s: cannot open: %s", path,
                    f ? "not a regular file" : strerror(errno));
        if (f)
            fclose(f);
        free(real);
        return;
    }
    if (st.st_size > CONF_FILE_MAX ||
        ctx->include_bytes + (size_t)st.st_size > CONF_INCLUDE_BYTES_MAX) {
        conf_errorf(ctx, line, NULL, "%s: too large (included files may add up to %d bytes)", path,
                    CONF_INCLUDE_BYTES_MAX);
        fclose(f);
        free(real);
        return;
    }
    conf_src_t *src = conf_src_add(ctx, path);
    if (!src) {
        conf_errorf(ctx, line, NULL, "%s: more than %d included files", path,
                    CONF_INCLUDE_FILES_MAX);
        fclose(f);
        free(real);
        return;
    }
    src->real = real;
    size_t len = (size_t)st.st_size;
    ctx->include_bytes += len;
    char *buf = sl_xmalloc(len + 1);
    size_t got = fread(buf, 1, len, f);
    int rerr = ferror(f);
    fclose(f);
    buf[got] = '\0';
    if (rerr || got != len) {
        conf_errorf(ctx, line, NULL, "%s: cannot read", path);
        free(buf);
        return;
    }
    int prc = conf_src_parse(ctx, src, buf, len);
    free(buf);
    if (prc != 0)
        return;
    conf_src_t *prev = conf_src_enter(ctx, src);
    /* Key paths in an included file start at the root again. */
    char saved_path[CONF_PATH_MAX];
    size_t saved_plen = ctx->plen;
    memcpy(saved_path, ctx->path, sizeof(saved_path));
    conf_path_pop(ctx, 0);
    yaml_node_t *top = yaml_document_get_root_node(&src->doc);
    if (top && !conf_is_null(top) && top->type != YAML_MAPPING_NODE) {
        char got2[80];
        conf_describe(top, got2, sizeof(got2));
        conf_errorf(ctx, conf_line(top), NULL, "expected a mapping, got %s", got2);
    } else if (top && top->type == YAML_MAPPING_NODE) {
        struct conf_include_arg a = {t, src, depth};
        int seen_line[CONF_TABLE_MAX_KEYS] = {0};
        (void)conf_map_each(ctx, t, top, seen_line, conf_include_pair, &a);
    }
    memcpy(ctx->path, saved_path, sizeof(saved_path));
    ctx->plen = saved_plen;
    conf_src_enter(ctx, prev);
}

/* Walks a collection row: the main file's node (n, may be NULL) and the
 * pieces included files gave it. */
static int conf_walk_merged(conf_ctx_t *ctx, const conf_key_t *k, void *obj, yaml_node_t *n,
                            int kline)
{
    size_t nsegs = 0;
    conf_seg_t *segs = sl_xcalloc(ctx->nsegs + 1, sizeof(*segs));
    if (n)
        segs[nsegs++] = (conf_seg_t){k, ctx->src, n, kline};
    for (size_t i = 0; i < ctx->nsegs; i++)
        if (ctx->segs[i].k == k)
            segs[nsegs++] = ctx->segs[i];
    int rc = k->type == CONF_LIST ? conf_walk_list(ctx, k, obj, segs, nsegs)
                                  : conf_walk_map(ctx, k, obj, segs, nsegs);
    free(segs);
    return rc;
}

static bool conf_has_segs(const conf_ctx_t *ctx, const conf_key_t *k)
{
    for (size_t i = 0; i < ctx->nsegs; i++)
        if (ctx->segs[i].k == k)
            return true;
    return false;
}

/* A key of a mapping the main walk reads (include: was done first). */
static void conf_struct_pair(conf_ctx_t *ctx, const conf_key_t *k, yaml_node_pair_t *p, int kline,
                             void *obj)
{
    conf_index_add(ctx, kline);
    if (k->flags & CONF_INCLUDE)
        return;
    yaml_node_t *vn = conf_take(ctx, p->value, kline);
    if (vn && (k->type == CONF_LIST || k->type == CONF_MAP) && conf_has_segs(ctx, k))
        (void)conf_walk_merged(ctx, k, obj, vn, kline);
    else if (vn)
        (void)conf_walk_value(ctx, k, obj, vn, kline);
}

/* Walks a mapping described by t into obj. n NULL or null = an absent or
 * empty section: still checked for required keys and by t->check, at
 * `line` (the parent's). Errors do not stop the walk: the next key is
 * walked, so `sluice -t` lists every mistake; t->check runs only when
 * everything under t was fine (it may rely on any field). */
static int conf_walk_struct(conf_ctx_t *ctx, const conf_table_t *t, void *obj, yaml_node_t *n,
                            int line)
{
    uint64_t seen = 0;
    int seen_line[CONF_TABLE_MAX_KEYS] = {0};
    size_t errs0 = ctx->nerrors;

    if (t->nkeys > CONF_TABLE_MAX_KEYS)
        return conf_errorf(ctx, line, NULL, "internal: table has too many keys");
    if (n && !conf_is_null(n) && n->type != YAML_MAPPING_NODE) {
        char got[80];
        conf_describe(n, got, sizeof(got));
        return conf_errorf(ctx, conf_line(n), NULL, "expected a mapping, got %s", got);
    }
    /* include: first, wherever it is in the mapping, so the included
     * pieces are known before the lists they add to are walked. */
    if (n && n->type == YAML_MAPPING_NODE) {
        for (size_t i = 0; i < t->nkeys; i++) {
            const conf_key_t *k = &t->keys[i];
            if (!(k->flags & CONF_INCLUDE))
                continue;
            for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top;
                 p++) {
                yaml_node_t *kn = yaml_document_get_node(&ctx->src->doc, p->key);
                if (!kn || kn->type != YAML_SCALAR_NODE ||
                    strcmp((const char *)kn->data.scalar.value, k->name) != 0)
                    continue;
                size_t old = conf_path_push_key(ctx, k->name);
                yaml_node_t *vn = conf_take(ctx, p->value, conf_line(kn));
                if (vn && !conf_is_null(vn))
                    conf_include_patterns(ctx, t, k, obj, vn, conf_line(kn), 0);
                conf_path_pop(ctx, old);
                break; /* a second include: is reported as a duplicate below */
            }
        }
    }
    if (n && n->type == YAML_MAPPING_NODE)
        seen = conf_map_each(ctx, t, n, seen_line, conf_struct_pair, obj);
    for (size_t i = 0; i < t->nkeys; i++) {
        const conf_key_t *k = &t->keys[i];
        if (seen & (UINT64_C(1) << i))
            continue;
        size_t old = conf_path_push_key(ctx, k->name);
        if ((k->type == CONF_LIST || k->type == CONF_MAP) && conf_has_segs(ctx, k))
            (void)conf_walk_merged(ctx, k, obj, NULL, line);
        else if (k->flags & CONF_REQUIRED)
            conf_errorf(ctx, line, NULL, "missing (required)");
        else if (k->type == CONF_STRUCT)
            (void)conf_walk_struct(ctx, k->sub, conf_field(obj, k->off), NULL, line);
        conf_path_pop(ctx, old);
    }
    if (ctx->nerrors != errs0)
        return -1;
    return t->check ? t->check(ctx, obj, line) : 0;
}

/* "FILE:LINE: syntax error: PROBLEM (CONTEXT at line N)" from libyaml. */
static void conf_yaml_error(conf_ctx_t *ctx, const yaml_parser_t *p, const char *yaml, size_t len)
{
    int line = (int)p->problem_mark.line + 1;
    if (p->error == YAML_READER_ERROR) {
        /* Reader errors (bad encoding) carry a byte offset, not a mark. */
        line = 1;
        for (size_t i = 0; i < len && i < p->problem_offset; i++)
            line += yaml[i] == '\n';
    }
    char ctxt[160] = "";
    if (p->context)
        snprintf(ctxt, sizeof(ctxt), " (%s at line %d)", p->context, (int)p->context_mark.line + 1);
    conf_error_at(ctx, ctx->name, line, "syntax error: %s%s",
                  p->problem ? p->problem : "cannot parse YAML", ctxt);
}

/* A first pass over libyaml's events, which stops as soon as the input is
 * nested too deep or has too many nodes — before the document loader
 * spends quadratic time on it. Syntax errors are reported here too. */
static int conf_yaml_precheck(conf_ctx_t *ctx, const char *yaml, size_t len)
{
    yaml_parser_t parser;
    yaml_event_t ev;
    int depth = 0, rc = -1;
    size_t nodes = 0;

    if (!yaml_parser_initialize(&parser)) {
        conf_error_at(ctx, ctx->name, 1, "cannot initialise the YAML parser");
        return -1;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    for (;;) {
        if (!yaml_parser_parse(&parser, &ev)) {
            conf_yaml_error(ctx, &parser, yaml, len);
            break;
        }
        yaml_event_type_t type = ev.type;
        int line = (int)ev.start_mark.line + 1;
        yaml_event_delete(&ev);
        if (type == YAML_STREAM_END_EVENT) {
            rc = 0;
            break;
        }
        if (type == YAML_SCALAR_EVENT || type == YAML_ALIAS_EVENT ||
            type == YAML_SEQUENCE_START_EVENT || type == YAML_MAPPING_START_EVENT)
            nodes++;
        if (type == YAML_SEQUENCE_START_EVENT || type == YAML_MAPPING_START_EVENT)
            depth++;
        else if (type == YAML_SEQUENCE_END_EVENT || type == YAML_MAPPING_END_EVENT)
            depth--;
        if (depth > CONF_DEPTH_MAX) {
            conf_error_at(ctx, ctx->name, line, "nested deeper than %d levels", CONF_DEPTH_MAX);
            break;
        }
        if (nodes > CONF_NODES_MAX) {
            conf_error_at(ctx, ctx->name, line, "more than %d YAML nodes", CONF_NODES_MAX);
            break;
        }
    }
    yaml_parser_delete(&parser);
    return rc;
}

/* Parses one file's text into src->doc (one document only), errors under
 * src's name. */
static int conf_src_parse(conf_ctx_t *ctx, conf_src_t *src, const char *yaml, size_t len)
{
    yaml_parser_t parser;
    yaml_document_t extra;
    int rc = -1;
    conf_src_t *prev = conf_src_enter(ctx, src);

    if (conf_yaml_precheck(ctx, yaml, len) != 0)
        goto done;
    if (!yaml_parser_initialize(&parser)) {
        conf_error_at(ctx, src->name, 1, "cannot initialise the YAML parser");
        goto done;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    if (!yaml_parser_load(&parser, &src->doc)) {
        conf_yaml_error(ctx, &parser, yaml, len);
        yaml_parser_delete(&parser);
        goto done;
    }
    src->loaded = true;
    /* One document only: a second one would silently be ignored. */
    if (!yaml_parser_load(&parser, &extra)) {
        conf_yaml_error(ctx, &parser, yaml, len);
    } else {
        yaml_node_t *second = yaml_document_get_root_node(&extra);
        if (second)
            conf_error_at(ctx, src->name, conf_line(second), "only one YAML document is allowed");
        else
            rc = 0;
        yaml_document_delete(&extra);
    }
    yaml_parser_delete(&parser);
    if (rc == 0) {
        src->nnodes = (size_t)(src->doc.nodes.top - src->doc.nodes.start);
        src->taken = sl_xcalloc(src->nnodes ? src->nnodes : 1, 1);
        if (yaml_document_get_root_node(&src->doc))
            src->taken[0] = 1; /* the root is node 1, index 0 */
    }
done:
    if (prev)
        conf_src_enter(ctx, prev);
    return rc;
}

/* The loader behind conf_tree_load() and conf_load*(): `all` (may be NULL)
 * receives every error, one per line; `index` (may be NULL) where each key
 * was set. */
static int conf_tree_load_ex(const conf_table_t *root, void *obj, const char *yaml, size_t len,
                             const char *name, bool files, char *err, size_t errlen, char *all,
                             size_t alllen, size_t *nerrors, struct conf_index **index)
{
    conf_ctx_t ctx = {
        .name = name, .err = err, .errlen = errlen, .all = all, .alllen = alllen, .files = files};
    int rc = -1;

    if (errlen)
        err[0] = '\0';
    if (all && alllen)
        all[0] = '\0';
    ctx.index = sl_xcalloc(1, sizeof(*ctx.index));
    conf_src_t *main_src = conf_src_add(&ctx, name);
    main_src->real = realpath(name, NULL);
    conf_src_enter(&ctx, main_src);
    if (len > CONF_FILE_MAX) {
        char text[512];
        snprintf(text, sizeof(text), "%s: too large (%zu bytes, at most %d)", name, len,
                 CONF_FILE_MAX);
        conf_error_add(&ctx, text);
        goto out;
    }
    if (conf_src_parse(&ctx, main_src, yaml, len) != 0)
        goto out;
    yaml_node_t *top = yaml_document_get_root_node(&main_src->doc);
    int line = top ? conf_line(top) : 1;
    if (conf_apply_defaults(&ctx, root, obj, line) == 0 &&
        conf_walk_struct(&ctx, root, obj, top, line) == 0 && ctx.nerrors == 0)
        rc = 0;
out:
    for (size_t i = 0; i < ctx.nsrcs; i++)
        conf_src_free(ctx.srcs[i]);
    free(ctx.segs);
    if (nerrors)
        *nerrors = ctx.nerrors;
    if (all && ctx.nerrors > ctx.nkept && ctx.allused + 1 < alllen)
        snprintf(all + ctx.allused, alllen - ctx.allused, "%s... and %zu more errors",
                 ctx.allused ? "\n" : "", ctx.nerrors - ctx.nkept);
    if (index && rc == 0)
        *index = ctx.index;
    else
        conf_index_free(ctx.index);
    return rc;
}

int conf_tree_load(const conf_table_t *root, void *obj, const char *yaml, size_t len,
                   const char *name, char *err, size_t errlen)
{
    return conf_tree_load_ex(root, obj, yaml, len, name, false, err, errlen, NULL, 0, NULL, NULL);
}

/* ---- free ---------------------------------------------------------------- */

void conf_tree_free(const conf_table_t *t, void *obj)
{
    if (!obj)
        return;
    for (size_t i = 0; i < t->nkeys; i++) {
        const conf_key_t *k = &t->keys[i];
        void *field = conf_field(obj, k->off);
        size_t *count = conf_is_collection(k) ? conf_field(obj, k->count_off) : NULL;
        switch (k->type) {
        case CONF_STRING:
            SL_FREE(*(char **)field);
            break;
        case CONF_STRUCT:
            conf_tree_free(k->sub, field);
            break;
        case CONF_STRLIST: {
            char **arr = *(char ***)field;
            for (size_t j = 0; j < *count; j++)
                free(arr[j]);
            SL_FREE(*(char ***)field);
            *count = 0;
            break;
        }
        case CONF_STRMAP: {
            conf_kv_t *arr = *(conf_kv_t **)field;
            for (size_t j = 0; j < *count; j++) {
                free(arr[j].key);
                free(arr[j].value);
            }
            SL_FREE(*(conf_kv_t **)field);
            *count = 0;
            break;
        }
        case CONF_LIST:
        case CONF_MAP: {
            char *arr = *(char **)field;
            for (size_t j = 0; j < *count; j++) {
                void *elem = arr + j * k->sub->size;
                conf_tree_free(k->sub, elem);
                if (k->sub->has_name)
                    SL_FREE(*(char **)conf_field(elem, k->sub->name_off));
            }
            SL_FREE(*(char **)field);
            *count = 0;
            break;
        }
        default:
            break;
        }
    }
}

/* ---- reload comparison ---------------------------------------------------- */

static bool conf_str_eq(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* Compares rows of t between a and b; `reload` = every parent reloadable. */
static int conf_diff_rows(conf_ctx_t *ctx, const conf_table_t *t, const void *a, const void *b,
                          bool reload)
{
    for (size_t i = 0; i < t->nkeys; i++) {
        const conf_key_t *k = &t->keys[i];
        bool eff = reload && (k->flags & CONF_RELOAD);
        if (eff && k->type != CONF_STRUCT)
            continue;
        const void *fa = conf_cfield(a, k->off), *fb = conf_cfield(b, k->off);
        size_t na = 0, nb = 0;
        if (conf_is_collection(k)) {
            na = *(const size_t *)conf_cfield(a, k->count_off);
            nb = *(const size_t *)conf_cfield(b, k->count_off);
        }
        size_t old = conf_path_push_key(ctx, k->name);
        bool same = true;
        switch (k->type) {
        case CONF_BOOL:
            same = *(const bool *)fa == *(const bool *)fb;
            break;
        case CONF_INT:
        case CONF_SIZE:
        case CONF_DURATION:
            same = *(const int64_t *)fa == *(const int64_t *)fb;
            break;
        case CONF_ENUM:
            same = *(const int *)fa == *(const int *)fb;
            break;
        case CONF_STRING:
            same = conf_str_eq(*(char *const *)fa, *(char *const *)fb);
            break;
        case CONF_STRUCT:
            if (conf_diff_rows(ctx, k->sub, fa, fb, eff) != 0)
                return -1;
            break;
        case CONF_STRLIST:
            same = na == nb;
            for (size_t j = 0; same && j < na; j++)
                same = conf_str_eq((*(char **const *)fa)[j], (*(char **const *)fb)[j]);
            break;
        case CONF_STRMAP:
            same = na == nb;
            for (size_t j = 0; same && j < na; j++) {
                const conf_kv_t *x = &(*(conf_kv_t *const *)fa)[j];
                const conf_kv_t *y = &(*(conf_kv_t *const *)fb)[j];
                same = conf_str_eq(x->key, y->key) && conf_str_eq(x->value, y->value);
            }
            break;
        case CONF_LIST:
        case CONF_MAP:
            same = na == nb;
            for (size_t j = 0; same && j < na; j++) {
                const void *ea = *(char *const *)fa + j * k->sub->size;
                const void *eb = *(char *const *)fb + j * k->sub->size;
                size_t o2;
                if (k->type == CONF_MAP) {
                    const char *nm = *(char *const *)conf_cfield(ea, k->sub->name_off);
                    if (!conf_str_eq(nm, *(char *const *)conf_cfield(eb, k->sub->name_off))) {
                        same = false;
                        break;
                    }
                    o2 = conf_path_push_key(ctx, nm);
                } else {
                    o2 = conf_path_push(ctx, "[%zu]", j);
                }
                if (conf_diff_rows(ctx, k->sub, ea, eb, false) != 0)
                    return -1;
                conf_path_pop(ctx, o2);
            }
            break;
        }
        if (!same) {
            snprintf(ctx->err, ctx->errlen, "%s: changed; needs a restart", ctx->path);
            return -1;
        }
        conf_path_pop(ctx, old);
    }
    return 0;
}

int conf_tree_diff(const conf_table_t *t, const void *a, const void *b, char *err, size_t errlen)
{
    conf_ctx_t ctx = {.name = "", .err = err, .errlen = errlen};
    if (errlen)
        err[0] = '\0';
    return conf_diff_rows(&ctx, t, a, b, true);
}

/* ---- the reference --------------------------------------------------------- */

static const char *conf_type_name(const conf_key_t *k)
{
    switch (k->type) {
    case CONF_BOOL:
        return "bool";
    case CONF_INT:
        return "integer";
    case CONF_SIZE:
        return "size";
    case CONF_DURATION:
        return "duration";
    case CONF_STRING:
        return "string";
    case CONF_ENUM:
        return "enum";
    case CONF_STRLIST:
        return "list of strings";
    case CONF_STRUCT:
        return "section";
    case CONF_LIST:
        return "list of sections";
    case CONF_MAP:
        return "map of sections by name";
    case CONF_STRMAP:
        return "map of strings";
    }
    return "?";
}

/* Markdown cell text: '|' would end the cell. */
static void conf_cell(FILE *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '|')
            fputc('\\', out);
        fputc(*s, out);
    }
}

static void conf_ref_rows(const conf_table_t *t, FILE *out, char *path, size_t plen, bool reload)
{
    for (size_t i = 0; i < t->nkeys; i++) {
        const conf_key_t *k = &t->keys[i];
        bool eff = reload && (k->flags & CONF_RELOAD);
        size_t len = plen;
        int r = snprintf(path + plen, CONF_PATH_MAX - plen, "%s%s", plen ? "." : "", k->name);
        if (r > 0)
            len = SL_MIN(plen + (size_t)r, (size_t)CONF_PATH_MAX - 1);

        char def[128] = "", bounds[256] = "";
        if (k->flags & CONF_REQUIRED)
            snprintf(def, sizeof(def), "required");
        else if (k->def)
            snprintf(def, sizeof(def), "`%s`", k->def);
        else if (k->type == CONF_STRING)
            snprintf(def, sizeof(def), "none");
        else if (conf_is_collection(k))
            snprintf(def, sizeof(def), "empty");

        if (conf_is_number(k) && (k->min || k->max)) {
            conf_bounds_text(k, bounds, sizeof(bounds));
            if (k->flags & CONF_AUTO) {
                size_t o = strlen(bounds);
                snprintf(bounds + o, sizeof(bounds) - o, " or `auto`");
            }
        } else if (conf_is_collection(k) && (k->min || k->max)) {
            snprintf(bounds, sizeof(bounds), "%lld..%lld items", (long long)k->min,
                     (long long)k->max);
        } else if (k->type == CONF_ENUM) {
            size_t o = 0;
            for (size_t j = 0; k->enums && k->enums[j] && o < sizeof(bounds); j++)
                o += (size_t)snprintf(bounds + o, sizeof(bounds) - o, "%s`%s`", j ? ", " : "",
                                      k->enums[j]);
        }

        fprintf(out, "| `%s` | %s | ", path, conf_type_name(k));
        conf_cell(out, def);
        fputs(" | ", out);
        conf_cell(out, bounds);
        fprintf(out, " | %s | ", eff ? "yes" : "no");
        conf_cell(out, k->doc ? k->doc : "");
        fputs(" |\n", out);

        if (k->type == CONF_STRUCT) {
            conf_ref_rows(k->sub, out, path, len, eff);
        } else if (k->type == CONF_LIST || k->type == CONF_MAP) {
            const char *suffix = k->type == CONF_LIST ? "[]" : ".<name>";
            size_t l2 = len;
            r = snprintf(path + len, CONF_PATH_MAX - len, "%s", suffix);
            if (r > 0)
                l2 = SL_MIN(len + (size_t)r, (size_t)CONF_PATH_MAX - 1);
            conf_ref_rows(k->sub, out, path, l2, eff);
        }
        path[plen] = '\0';
    }
}

void conf_tree_reference(const conf_table_t *t, FILE *out)
{
    char path[CONF_PATH_MAX] = "";
    fputs("Key paths: `a.b` is key `b` inside section `a`; `listen[]` is an item of a "
          "list; `upstreams.<name>` is an entry of a map, named by its key.\n"
          "Durations are `250ms`, `10s`, `5m`, `1h`, `1d` or a plain integer (milliseconds); "
          "sizes are `512`, `16k`, `1m`, `1g` (binary multiples; a plain integer is bytes); "
          "bools are `true` or `false`.\n"
          "Relative file paths are relative to sluice's working directory (include: patterns "
          "excepted: they are relative to the including file).\n"
          "Any value may hold `${VAR}` or `${VAR:-default}` (the default when VAR is unset or "
          "empty); an unset VAR without a default is an error naming it; `$${` is a literal "
          "`${`. Secrets are never written this way: `*_env` keys name the variable holding "
          "them.\n"
          "Without `-c`, sluice reads `/etc/sluice/sluice.yaml`. `sluice -t` lists every error "
          "(up to 100), each `file:line: key: message`, with a \"did you mean\" for a "
          "mistyped key.\n"
          "Upstream base paths: a server `url` may end in a path, e.g. "
          "`https://api.groq.com/openai/v1`. A client's `/v1/REST` is sent as `BASE/REST` "
          "(`/v1/chat/completions` -> `/openai/v1/chat/completions`); a URL without a path (or "
          "`/`) means `/v1`, so the client's path goes as it came. The path is normalised: "
          "trailing `/` dropped; no query, fragment, empty, `.` or `..` segment; at most 255 "
          "bytes.\n"
          "Reload `yes`: a SIGHUP reload applies a change; `no`: the key needs a restart "
          "(a reload that changes it is refused).\n\n",
          out);
    fputs("| Key | Type | Default | Bounds | Reload | Meaning |\n", out);
    fputs("|---|---|---|---|---|---|\n", out);
    conf_ref_rows(t, out, path, 0, true);
}

/* ---- table self-check ------------------------------------------------------ */

static size_t conf_field_size(const conf_key_t *k)
{
    switch (k->type) {
    case CONF_BOOL:
        return sizeof(bool);
    case CONF_INT:
    case CONF_SIZE:
    case CONF_DURATION:
        return sizeof(int64_t);
    case CONF_ENUM:
        return sizeof(int);
    case CONF_STRUCT:
        return k->sub ? k->sub->size : 0;
    default:
        return sizeof(void *);
    }
}

static int conf_validate_rows(conf_ctx_t *ctx, const conf_table_t *t, bool reload,
                              bool in_collection)
{
    if (t->nkeys == 0 || t->nkeys > CONF_TABLE_MAX_KEYS)
        return conf_errorf(ctx, 0, NULL, "table has %zu rows (1..%d)", t->nkeys,
                           CONF_TABLE_MAX_KEYS);
    if ((t->has_line && t->line_off + sizeof(int) > t->size) ||
        (t->has_name && t->name_off + sizeof(char *) > t->size))
        return conf_errorf(ctx, 0, NULL, "line/name offset outside the struct");
    for (size_t i = 0; i < t->nkeys; i++) {
        const conf_key_t *k = &t->keys[i];
        if (!k->name || !*k->name || !k->doc || !*k->doc)
            return conf_errorf(ctx, 0, NULL, "row %zu has no name or no doc", i);
        size_t old = conf_path_push_key(ctx, k->name);
        for (size_t j = 0; j < i; j++)
            if (strcmp(t->keys[j].name, k->name) == 0)
                return conf_errorf(ctx, 0, NULL, "two rows with this name");
        if (k->off + conf_field_size(k) > t->size ||
            (conf_is_collection(k) && k->count_off + sizeof(size_t) > t->size))
            return conf_errorf(ctx, 0, NULL, "offset outside the struct");
        bool needs_sub = k->type == CONF_STRUCT || k->type == CONF_LIST || k->type == CONF_MAP;
        if (needs_sub != (k->sub != NULL))
            return conf_errorf(ctx, 0, NULL, "sub-table present iff section/list/map");
        if (k->type == CONF_MAP && !k->sub->has_name)
            return conf_errorf(ctx, 0, NULL, "map elements need name_off");
        if ((k->flags & CONF_REQUIRED) && k->def)
            return conf_errorf(ctx, 0, NULL, "required and a default");
        if ((k->flags & CONF_AUTO) && k->type != CONF_INT)
            return conf_errorf(ctx, 0, NULL, "CONF_AUTO on a non-integer");
        if ((conf_is_number(k) || conf_is_collection(k)) && (k->max <= 0 || k->min > k->max))
            return conf_errorf(ctx, 0, NULL, "numbers and collections need bounds min..max");
        if ((conf_is_number(k) || k->type == CONF_BOOL || k->type == CONF_ENUM) && !k->def &&
            !(k->flags & CONF_REQUIRED))
            return conf_errorf(ctx, 0, NULL, "needs a default (or CONF_REQUIRED)");
        if (k->type == CONF_ENUM && (!k->enums || !k->enums[0]))
            return conf_errorf(ctx, 0, NULL, "enum without names");
        if (!conf_is_scalar(k) && k->def)
            return conf_errorf(ctx, 0, NULL, "only scalars have defaults");
        if (conf_is_collection(k) && k->min > 0 && !(k->flags & CONF_REQUIRED))
            return conf_errorf(ctx, 0, NULL, "a non-empty collection must be CONF_REQUIRED");
        if (in_collection && reload && !(k->flags & CONF_RELOAD))
            return conf_errorf(ctx, 0, NULL,
                               "restart-only inside a reloadable list or map (cannot be "
                               "matched across a reload)");
        bool eff = reload && (k->flags & CONF_RELOAD);
        if (k->type == CONF_STRUCT) {
            if (conf_validate_rows(ctx, k->sub, eff, in_collection) != 0)
                return -1;
        } else if (k->type == CONF_LIST || k->type == CONF_MAP) {
            if (conf_validate_rows(ctx, k->sub, eff, true) != 0)
                return -1;
            /* Defaults of the element type must load on their own. */
            void *elem = sl_xcalloc(1, k->sub->size);
            int rc = conf_apply_defaults(ctx, k->sub, elem, 0);
            conf_tree_free(k->sub, elem);
            free(elem);
            if (rc != 0)
                return -1;
        }
        conf_path_pop(ctx, old);
    }
    return 0;
}

int conf_table_validate(const conf_table_t *t, char *err, size_t errlen)
{
    conf_ctx_t ctx = {.name = "table", .err = err, .errlen = errlen};
    if (errlen)
        err[0] = '\0';
    if (conf_validate_rows(&ctx, t, true, false) != 0)
        return -1;
    void *obj = sl_xcalloc(1, t->size);
    int rc = conf_apply_defaults(&ctx, t, obj, 0);
    conf_tree_free(t, obj);
    free(obj);
    return rc;
}

/* ---- the public API ------------------------------------------------------ */

/* Reads a whole conf file, bounded; NULL with one line in err. */
static char *conf_read_file(const char *path, size_t *lenp, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        fclose(f);
        return NULL;
    }
    if (st.st_size > CONF_FILE_MAX) {
        snprintf(err, errlen, "%s: too large (%lld bytes, at most %d)", path, (long long)st.st_size,
                 CONF_FILE_MAX);
        fclose(f);
        return NULL;
    }
    size_t len = (size_t)st.st_size;
    char *buf = sl_xmalloc(len + 1);
    size_t got = fread(buf, 1, len, f);
    int rerr = ferror(f);
    fclose(f);
    if (rerr || got != len) {
        snprintf(err, errlen, "%s: cannot read", path);
        free(buf);
        return NULL;
    }
    buf[len] = '\0';
    *lenp = len;
    return buf;
}

static conf_t *conf_load_text(const char *yaml, size_t len, const char *name, bool files, char *err,
                              size_t errlen, char *all, size_t alllen, size_t *nerrors)
{
    conf_t *c = sl_xcalloc(1, sizeof(*c));
    c->path = sl_xstrdup(name ? name : "(string)");
    if (conf_tree_load_ex(&conf_root_table, c, yaml, len, c->path, files, err, errlen, all, alllen,
                          nerrors, &c->index) != 0) {
        conf_free(c);
        return NULL;
    }
    return c;
}

conf_t *conf_load_string(const char *yaml, size_t len, const char *name, char *err, size_t errlen)
{
    return conf_load_text(yaml, len, name, false, err, errlen, NULL, 0, NULL);
}

conf_t *conf_load(const char *path, char *err, size_t errlen)
{
    size_t len = 0;
    char *buf = conf_read_file(path, &len, err, errlen);
    if (!buf)
        return NULL;
    conf_t *c = conf_load_text(buf, len, path, true, err, errlen, NULL, 0, NULL);
    free(buf);
    return c;
}

conf_t *conf_load_all(const char *path, char *err, size_t errlen, size_t *nerrors)
{
    size_t len = 0, n = 0;
    if (nerrors)
        *nerrors = 0;
    char *buf = conf_read_file(path, &len, err, errlen);
    if (!buf) {
        if (nerrors)
            *nerrors = 1;
        return NULL;
    }
    /* The first error is also where the list starts: err holds them all. */
    char first[1024];
    conf_t *c = conf_load_text(buf, len, path, true, first, sizeof(first), err, errlen, &n);
    free(buf);
    if (nerrors)
        *nerrors = n;
    return c;
}

/* How many characters of `path` name a key set in the file: the whole
 * path, or its longest enclosing section, list item or map entry. */
static const conf_where_t *conf_index_nearest(const struct conf_index *ix, const char *msg,
                                              size_t *matched)
{
    char path[CONF_PATH_MAX];
    size_t n = strcspn(msg, " :");
    if (n >= sizeof(path))
        n = sizeof(path) - 1;
    memcpy(path, msg, n);
    path[n] = '\0';
    const conf_where_t *w = NULL;
    while (n > 0 && !(w = conf_index_find(ix, path))) {
        while (n > 0 && path[n - 1] != '.' && path[n - 1] != '[')
            n--;
        if (n > 0)
            n--;
        path[n] = '\0';
    }
    *matched = n;
    return w;
}

void conf_locate(const char *path, const char *msg, char *out, size_t outlen)
{
    if (!outlen)
        return;
    char err[256];
    conf_t *c = path ? conf_load(path, err, sizeof(err)) : NULL;
    const struct conf_index *ix = c ? c->index : NULL;
    /* "FILE: " in front (some modules name the file but know no line). */
    size_t pl = path ? strlen(path) : 0;
    if (pl && strncmp(msg, path, pl) == 0 && msg[pl] == ':' && msg[pl + 1] == ' ')
        msg += pl + 2;
    else if (pl && strncmp(msg, path, pl) == 0 && msg[pl] == ':')
        ix = NULL; /* "FILE:LINE: ...": already located */
    /* The message may be "module: key.path (detail): what"; the segment
     * whose leading key path is the deepest one set in the file wins. */
    const conf_where_t *best = NULL;
    size_t bestlen = 0;
    for (const char *seg = msg; ix && seg; seg = strstr(seg, ": ")) {
        if (seg != msg)
            seg += 2;
        size_t m = 0;
        const conf_where_t *w = conf_index_nearest(ix, seg, &m);
        if (w && m > bestlen) {
            best = w;
            bestlen = m;
        }
    }
    if (best)
        snprintf(out, outlen, "%s:%d: %s", ix->files[best->file], best->line, msg);
    else if (ix)
        snprintf(out, outlen, "%s: %s", path, msg);
    else
        snprintf(out, outlen, "%s", msg);
    conf_free(c);
}

void conf_free(conf_t *c)
{
    if (!c)
        return;
    conf_tree_free(&conf_root_table, c);
    conf_index_free(c->index);
    free(c->path);
    free(c);
}

const conf_upstream_t *conf_upstream_find(const conf_t *c, const char *name)
{
    for (size_t i = 0; c && name && i < c->nupstreams; i++)
        if (strcmp(c->upstreams[i].name, name) == 0)
            return &c->upstreams[i];
    return NULL;
}

const conf_model_t *conf_model_find(const conf_t *c, const char *name)
{
    for (size_t i = 0; c && name && i < c->nmodels; i++)
        if (strcmp(c->models[i].name, name) == 0)
            return &c->models[i];
    return NULL;
}

int conf_reload_check(const conf_t *old, const conf_t *neu, char *err, size_t errlen)
{
    return conf_tree_diff(&conf_root_table, old, neu, err, errlen);
}

void conf_reference_print(FILE *out)
{
    conf_tree_reference(&conf_root_table, out);
}
