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
 * Errors: the first one wins and is a single line "FILE:LINE: key.path:
 * message". Aliases are refused (a node reached twice) so a hostile file
 * can neither loop nor blow up exponentially; size, nesting depth and node
 * count are capped before the document is built.
 */
#include "conf/conf.h"
#include "conf/conf_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

/* A conf file larger than this is refused before parsing. */
#define CONF_FILE_MAX (4 * 1024 * 1024)
/* Deepest nesting of mappings and lists, and most nodes, accepted. libyaml
 * rescans its whole stack of open flow collections on every token, so
 * nesting is quadratic (200,000 '[' take minutes); no conf needs either. */
#define CONF_DEPTH_MAX 32
#define CONF_NODES_MAX 200000

struct conf_ctx {
    const char *name; /* the file name, for messages */
    yaml_document_t *doc;
    unsigned char *taken; /* per document node: already walked (alias) */
    size_t nnodes;
    char *err;
    size_t errlen;
    bool failed;
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

int conf_errorf(conf_ctx_t *ctx, int line, const char *sub, const char *fmt, ...)
{
    if (ctx->failed || !ctx->err || ctx->errlen == 0)
        return -1;
    ctx->failed = true;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const char *dot = (ctx->plen && sub) ? "." : "";
    bool haskey = ctx->plen || sub;
    snprintf(ctx->err, ctx->errlen, "%s:%d: %s%s%s%s%s", ctx->name, line, ctx->path, dot,
             sub ? sub : "", haskey ? ": " : "", msg);
    /* Keys come from the file: keep the message on one line. */
    for (char *p = ctx->err; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
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

/* Fetches a node for walking; a node met twice was reached via an alias.
 * `at` is the line to blame (the key's), 0 = the node's own. */
static yaml_node_t *conf_take(conf_ctx_t *ctx, int idx, int at)
{
    yaml_node_t *n = yaml_document_get_node(ctx->doc, idx);
    if (!n) {
        conf_errorf(ctx, 1, NULL, "internal: missing YAML node");
        return NULL;
    }
    size_t i = (size_t)(n - ctx->doc->nodes.start);
    if (ctx->taken[i]) {
        conf_errorf(ctx, at ? at : conf_line(n), NULL, "YAML aliases (*name) are not supported");
        return NULL;
    }
    ctx->taken[i] = 1;
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

static int conf_walk_struct(conf_ctx_t *ctx, const conf_table_t *t, void *obj, yaml_node_t *n,
                            int line);

static int conf_walk_list(conf_ctx_t *ctx, const conf_key_t *k, void *obj, yaml_node_t *n,
                          int kline)
{
    size_t count;
    if (conf_collection(ctx, k, n, YAML_SEQUENCE_NODE, &count) != 0 ||
        conf_count_bounds(ctx, k, count, kline) != 0)
        return -1;
    const conf_table_t *sub = k->sub;
    /* Zeroed elements and the count set up front, so a failure half way
     * leaves something conf_tree_free() can release. */
    char *arr = count ? sl_xcalloc(count, sub->size) : NULL;
    *(void **)conf_field(obj, k->off) = arr;
    *(size_t *)conf_field(obj, k->count_off) = count;
    for (size_t i = 0; i < count; i++) {
        void *elem = arr + i * sub->size;
        size_t old = conf_path_push(ctx, "[%zu]", i);
        yaml_node_t *item = conf_take(ctx, n->data.sequence.items.start[i], 0);
        if (!item)
            return -1;
        int line = conf_line(item);
        if (sub->has_line)
            *(int *)conf_field(elem, sub->line_off) = line;
        if (conf_apply_defaults(ctx, sub, elem, line) != 0 ||
            conf_walk_struct(ctx, sub, elem, item, line) != 0)
            return -1;
        conf_path_pop(ctx, old);
    }
    return 0;
}

static int conf_walk_map(conf_ctx_t *ctx, const conf_key_t *k, void *obj, yaml_node_t *n, int kline)
{
    size_t count;
    if (conf_collection(ctx, k, n, YAML_MAPPING_NODE, &count) != 0 ||
        conf_count_bounds(ctx, k, count, kline) != 0)
        return -1;
    const conf_table_t *sub = k->sub;
    char *arr = count ? sl_xcalloc(count, sub->size) : NULL;
    *(void **)conf_field(obj, k->off) = arr;
    *(size_t *)conf_field(obj, k->count_off) = count;
    for (size_t i = 0; i < count; i++) {
        void *elem = arr + i * sub->size;
        yaml_node_pair_t *p = &n->data.mapping.pairs.start[i];
        yaml_node_t *kn = conf_take(ctx, p->key, 0);
        const char *name;
        if (!kn || conf_scalar(ctx, kn, "a name", conf_line(kn), &name) != 0)
            return -1;
        int line = conf_line(kn);
        size_t old = conf_path_push_key(ctx, name);
        for (size_t j = 0; j < i; j++) {
            const void *prev = arr + j * sub->size;
            if (strcmp(*(char *const *)conf_cfield(prev, sub->name_off), name) == 0)
                return conf_errorf(ctx, line, NULL, "duplicate key (first at line %d)",
                                   sub->has_line ? *(const int *)conf_cfield(prev, sub->line_off)
                                                 : 0);
        }
        *(char **)conf_field(elem, sub->name_off) = sl_xstrdup(name);
        if (sub->has_line)
            *(int *)conf_field(elem, sub->line_off) = line;
        yaml_node_t *vn = conf_take(ctx, p->value, line);
        if (!vn || conf_apply_defaults(ctx, sub, elem, line) != 0 ||
            conf_walk_struct(ctx, sub, elem, vn, line) != 0)
            return -1;
        conf_path_pop(ctx, old);
    }
    return 0;
}

static int conf_walk_strlist(conf_ctx_t *ctx, const conf_key_t *k, void *obj, yaml_node_t *n,
                             int kline)
{
    size_t count;
    if (conf_collection(ctx, k, n, YAML_SEQUENCE_NODE, &count) != 0 ||
        conf_count_bounds(ctx, k, count, kline) != 0)
        return -1;
    char **arr = count ? sl_xcalloc(count, sizeof(char *)) : NULL;
    *(char ***)conf_field(obj, k->off) = arr;
    *(size_t *)conf_field(obj, k->count_off) = count;
    for (size_t i = 0; i < count; i++) {
        size_t old = conf_path_push(ctx, "[%zu]", i);
        yaml_node_t *item = conf_take(ctx, n->data.sequence.items.start[i], 0);
        const char *v;
        if (!item || conf_scalar(ctx, item, "a string", conf_line(item), &v) != 0)
            return -1;
        if (*v == '\0')
            return conf_errorf(ctx, conf_line(item), NULL, "must not be empty");
        arr[i] = sl_xstrdup(v);
        conf_path_pop(ctx, old);
    }
    return 0;
}

static int conf_walk_strmap(conf_ctx_t *ctx, const conf_key_t *k, void *obj, yaml_node_t *n,
                            int kline)
{
    size_t count;
    if (conf_collection(ctx, k, n, YAML_MAPPING_NODE, &count) != 0 ||
        conf_count_bounds(ctx, k, count, kline) != 0)
        return -1;
    conf_kv_t *arr = count ? sl_xcalloc(count, sizeof(conf_kv_t)) : NULL;
    *(conf_kv_t **)conf_field(obj, k->off) = arr;
    *(size_t *)conf_field(obj, k->count_off) = count;
    for (size_t i = 0; i < count; i++) {
        yaml_node_pair_t *p = &n->data.mapping.pairs.start[i];
        yaml_node_t *kn = conf_take(ctx, p->key, 0);
        const char *key, *v;
        if (!kn || conf_scalar(ctx, kn, "a key", conf_line(kn), &key) != 0)
            return -1;
        size_t old = conf_path_push_key(ctx, key);
        for (size_t j = 0; j < i; j++)
            if (strcmp(arr[j].key, key) == 0)
                return conf_errorf(ctx, conf_line(kn), NULL, "duplicate key (first at line %d)",
                                   arr[j].line);
        arr[i].key = sl_xstrdup(key);
        arr[i].line = conf_line(kn);
        yaml_node_t *vn = conf_take(ctx, p->value, arr[i].line);
        if (!vn || conf_scalar(ctx, vn, "a string", arr[i].line, &v) != 0)
            return -1;
        arr[i].value = sl_xstrdup(v);
        conf_path_pop(ctx, old);
    }
    return 0;
}

/* `kline` is the line of the key: an empty value's own mark may already
 * point at the next line, and a section's missing keys read best there. */
static int conf_walk_value(conf_ctx_t *ctx, const conf_key_t *k, void *obj, yaml_node_t *n,
                           int kline)
{
    switch (k->type) {
    case CONF_STRUCT:
        return conf_walk_struct(ctx, k->sub, conf_field(obj, k->off), n, kline);
    case CONF_LIST:
        return conf_walk_list(ctx, k, obj, n, kline);
    case CONF_MAP:
        return conf_walk_map(ctx, k, obj, n, kline);
    case CONF_STRLIST:
        return conf_walk_strlist(ctx, k, obj, n, kline);
    case CONF_STRMAP:
        return conf_walk_strmap(ctx, k, obj, n, kline);
    default: {
        char want[160];
        const char *v;
        conf_expected(k, want, sizeof(want));
        if (conf_scalar(ctx, n, want, kline, &v) != 0)
            return -1;
        return conf_set_scalar(ctx, k, obj, v, conf_line(n));
    }
    }
}

/* Walks a mapping described by t into obj. n NULL or null = an absent or
 * empty section: still checked for required keys and by t->check, at
 * `line` (the parent's). */
static int conf_walk_struct(conf_ctx_t *ctx, const conf_table_t *t, void *obj, yaml_node_t *n,
                            int line)
{
    uint64_t seen = 0;
    int seen_line[CONF_TABLE_MAX_KEYS] = {0};

    if (t->nkeys > CONF_TABLE_MAX_KEYS)
        return conf_errorf(ctx, line, NULL, "internal: table has too many keys");
    if (n && !conf_is_null(n) && n->type != YAML_MAPPING_NODE) {
        char got[80];
        conf_describe(n, got, sizeof(got));
        return conf_errorf(ctx, conf_line(n), NULL, "expected a mapping, got %s", got);
    }
    if (n && n->type == YAML_MAPPING_NODE) {
        for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top;
             p++) {
            yaml_node_t *kn = conf_take(ctx, p->key, 0);
            const char *name;
            if (!kn || conf_scalar(ctx, kn, "a key", conf_line(kn), &name) != 0)
                return -1;
            int kline = conf_line(kn);
            size_t old = conf_path_push_key(ctx, name);
            size_t i = 0;
            while (i < t->nkeys && strcmp(t->keys[i].name, name) != 0)
                i++;
            if (i == t->nkeys)
                return conf_errorf(ctx, kline, NULL, "unknown key");
            if (seen & (UINT64_C(1) << i))
                return conf_errorf(ctx, kline, NULL, "duplicate key (first at line %d)",
                                   seen_line[i]);
            seen |= UINT64_C(1) << i;
            seen_line[i] = kline;
            yaml_node_t *vn = conf_take(ctx, p->value, kline);
            if (!vn || conf_walk_value(ctx, &t->keys[i], obj, vn, kline) != 0)
                return -1;
            conf_path_pop(ctx, old);
        }
    }
    for (size_t i = 0; i < t->nkeys; i++) {
        const conf_key_t *k = &t->keys[i];
        if (seen & (UINT64_C(1) << i))
            continue;
        size_t old = conf_path_push_key(ctx, k->name);
        if (k->flags & CONF_REQUIRED)
            return conf_errorf(ctx, line, NULL, "missing (required)");
        if (k->type == CONF_STRUCT &&
            conf_walk_struct(ctx, k->sub, conf_field(obj, k->off), NULL, line) != 0)
            return -1;
        conf_path_pop(ctx, old);
    }
    return t->check ? t->check(ctx, obj, line) : 0;
}

/* "FILE:LINE: syntax error: PROBLEM (CONTEXT at line N)" from libyaml. */
static void conf_yaml_error(const yaml_parser_t *p, const char *name, const char *yaml, size_t len,
                            char *err, size_t errlen)
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
    snprintf(err, errlen, "%s:%d: syntax error: %s%s", name, line,
             p->problem ? p->problem : "cannot parse YAML", ctxt);
    for (char *c = err; *c; c++)
        if ((unsigned char)*c < 0x20)
            *c = '?';
}

/* A first pass over libyaml's events, which stops as soon as the input is
 * nested too deep or has too many nodes — before the document loader
 * spends quadratic time on it. Syntax errors are reported here too. */
static int conf_yaml_precheck(const char *name, const char *yaml, size_t len, char *err,
                              size_t errlen)
{
    yaml_parser_t parser;
    yaml_event_t ev;
    int depth = 0, rc = -1;
    size_t nodes = 0;

    if (!yaml_parser_initialize(&parser)) {
        snprintf(err, errlen, "%s: cannot initialise the YAML parser", name);
        return -1;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    for (;;) {
        if (!yaml_parser_parse(&parser, &ev)) {
            conf_yaml_error(&parser, name, yaml, len, err, errlen);
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
            snprintf(err, errlen, "%s:%d: nested deeper than %d levels", name, line,
                     CONF_DEPTH_MAX);
            break;
        }
        if (nodes > CONF_NODES_MAX) {
            snprintf(err, errlen, "%s:%d: more than %d YAML nodes", name, line, CONF_NODES_MAX);
            break;
        }
    }
    yaml_parser_delete(&parser);
    return rc;
}

int conf_tree_load(const conf_table_t *root, void *obj, const char *yaml, size_t len,
                   const char *name, char *err, size_t errlen)
{
    conf_ctx_t ctx = {.name = name, .err = err, .errlen = errlen};
    yaml_parser_t parser;
    yaml_document_t doc, extra;
    int rc = -1;

    if (errlen)
        err[0] = '\0';
    if (len > CONF_FILE_MAX) {
        snprintf(err, errlen, "%s: too large (%zu bytes, at most %d)", name, len, CONF_FILE_MAX);
        return -1;
    }
    if (conf_yaml_precheck(name, yaml, len, err, errlen) != 0)
        return -1;
    if (!yaml_parser_initialize(&parser)) {
        snprintf(err, errlen, "%s: cannot initialise the YAML parser", name);
        return -1;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    if (!yaml_parser_load(&parser, &doc)) {
        conf_yaml_error(&parser, name, yaml, len, err, errlen);
        yaml_parser_delete(&parser);
        return -1;
    }
    /* One document only: a second one would silently be ignored. */
    if (!yaml_parser_load(&parser, &extra)) {
        conf_yaml_error(&parser, name, yaml, len, err, errlen);
        goto out;
    }
    yaml_node_t *second = yaml_document_get_root_node(&extra);
    if (second) {
        snprintf(err, errlen, "%s:%d: only one YAML document is allowed", name, conf_line(second));
        yaml_document_delete(&extra);
        goto out;
    }
    yaml_document_delete(&extra);

    ctx.doc = &doc;
    ctx.nnodes = (size_t)(doc.nodes.top - doc.nodes.start);
    ctx.taken = sl_xcalloc(ctx.nnodes ? ctx.nnodes : 1, 1);
    yaml_node_t *top = yaml_document_get_root_node(&doc);
    int line = 1;
    if (top) {
        ctx.taken[0] = 1; /* the root is node 1, index 0 */
        line = conf_line(top);
    }
    if (conf_apply_defaults(&ctx, root, obj, line) == 0 &&
        conf_walk_struct(&ctx, root, obj, top, line) == 0)
        rc = 0;
    free(ctx.taken);
out:
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return rc;
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
          "Relative file paths are relative to sluice's working directory.\n"
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

conf_t *conf_load_string(const char *yaml, size_t len, const char *name, char *err, size_t errlen)
{
    conf_t *c = sl_xcalloc(1, sizeof(*c));
    c->path = sl_xstrdup(name ? name : "(string)");
    if (conf_tree_load(&conf_root_table, c, yaml, len, c->path, err, errlen) != 0) {
        conf_free(c);
        return NULL;
    }
    return c;
}

conf_t *conf_load(const char *path, char *err, size_t errlen)
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
    conf_t *c = conf_load_string(buf, len, path, err, errlen);
    free(buf);
    return c;
}

void conf_free(conf_t *c)
{
    if (!c)
        return;
    conf_tree_free(&conf_root_table, c);
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
