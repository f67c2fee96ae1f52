/*
 * key.c — the pure parts of deciding what a request is: Cache-Control
 * flags, a model's effective policy, the exact key (SHA-256 of a canonical
 * JSON of everything that changes the answer) and what the semantic cache
 * embeds. Two requests that differ only in whitespace, key order, 0 vs 0.0
 * or the stream flag get one key; anything else that could change the
 * answer gives another (an unknown parameter is kept: at worst a miss).
 */
#include <openssl/sha.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cache/cache_internal.h"

/* ---- Cache-Control -------------------------------------------------------- */

static bool cache_tok_eq(const char *s, size_t n, const char *word)
{
    size_t wn = strlen(word);
    return n == wn && strncasecmp(s, word, n) == 0;
}

unsigned cache_control_parse(const char *v, size_t len)
{
    unsigned f = 0;
    if (!v)
        return 0;
    size_t i = 0;
    while (i < len) {
        while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t s = i;
        while (i < len && v[i] != ',' && v[i] != '=' && v[i] != ' ' && v[i] != '\t')
            i++;
        size_t n = i - s;
        while (i < len && (v[i] == ' ' || v[i] == '\t'))
            i++;
        const char *val = NULL;
        size_t vn = 0;
        if (i < len && v[i] == '=') {
            i++;
            while (i < len && (v[i] == ' ' || v[i] == '\t'))
                i++;
            bool q = i < len && v[i] == '"';
            i += q;
            val = v + i;
            while (i < len && (q ? v[i] != '"' : (v[i] != ',' && v[i] != ' ' && v[i] != '\t')))
                i++;
            vn = (size_t)(v + i - val);
            if (q && i < len)
                i++;
        }
        if (cache_tok_eq(v + s, n, "no-cache"))
            f |= CACHE_CC_NO_CACHE;
        else if (cache_tok_eq(v + s, n, "no-store"))
            f |= CACHE_CC_NO_STORE;
        else if (cache_tok_eq(v + s, n, "max-age") && val && vn == 1 && val[0] == '0')
            f |= CACHE_CC_NO_CACHE;
        /* skip to the next comma */
        while (i < len && v[i] != ',')
            i++;
    }
    return f;
}

/* ---- policy -------------------------------------------------------------- */

void cache_policy_resolve(const conf_cache_t *root, const conf_model_cache_t *cm,
                          cache_policy_t *out)
{
    memset(out, 0, sizeof(*out));
    out->enabled = root->enabled;
    out->semantic = root->semantic.enabled && root->semantic.embed_model;
    out->scope = root->scope == 1 ? CACHE_SCOPE_GLOBAL : CACHE_SCOPE_USER;
    out->ttl_ms = root->ttl_ms;
    out->max_temperature = root->max_temperature_v;
    out->max_entry_bytes = root->max_entry_bytes;
    if (!cm)
        return;
    if (cm->enabled != CONF_CACHE_INHERIT)
        out->enabled = cm->enabled == CONF_CACHE_ON;
    if (cm->semantic != CONF_CACHE_INHERIT)
        out->semantic = cm->semantic == CONF_CACHE_ON && root->semantic.embed_model;
    if (cm->scope != CONF_CACHE_SCOPE_INHERIT)
        out->scope = cm->scope == CONF_CACHE_SCOPE_GLOBAL ? CACHE_SCOPE_GLOBAL : CACHE_SCOPE_USER;
    if (cm->ttl_ms > 0)
        out->ttl_ms = cm->ttl_ms;
    if (cm->max_temperature)
        out->max_temperature = cm->max_temperature_v;
    if (cm->max_entry_bytes > 0)
        out->max_entry_bytes = cm->max_entry_bytes;
    out->semantic = out->semantic && out->enabled;
}

static const char *const cache_bypass_names[CACHE_BYPASS_COUNT] = {
    "none", "off", "no_store", "no_cache", "temperature", "unsupported", "no_user"};

const char *cache_bypass_name(cache_bypass_t b)
{
    return (unsigned)b < CACHE_BYPASS_COUNT ? cache_bypass_names[b] : "unknown";
}

/* ---- whitespace normalisation --------------------------------------------- */

/* Length of the whitespace sequence at s (0 if none): ASCII space, tab,
 * CR, LF, FF, VT, U+00A0 and U+3000 (common in Chinese input). */
static size_t cache_ws_len(const unsigned char *s, size_t n)
{
    if (n >= 1 && (s[0] == ' ' || (s[0] >= '\t' && s[0] <= '\r')))
        return 1;
    if (n >= 2 && s[0] == 0xC2 && s[1] == 0xA0)
        return 2;
    if (n >= 3 && s[0] == 0xE3 && s[1] == 0x80 && s[2] == 0x80)
        return 3;
    return 0;
}

char *cache_text_normalise(const char *s, size_t len, size_t *outlen)
{
    char *out = malloc(len + 1);
    if (!out)
        return NULL;
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0, i = 0;
    bool pending = false;
    while (i < len) {
        size_t w = cache_ws_len(p + i, len - i);
        if (w) {
            pending = o > 0;
            i += w;
            continue;
        }
        if (pending)
            out[o++] = ' ';
        pending = false;
        out[o++] = (char)p[i++];
    }
    out[o] = '\0';
    if (outlen)
        *outlen = o;
    return out;
}

/* ---- canonical form -------------------------------------------------------- */

/* The key hashes a canonical byte form written straight from the parsed
 * request, with no copy of it: every value is typed and length-prefixed
 * (so no escaping is needed and no two values share a form), object keys
 * are sorted, integral numbers are integers (0 = 0.0), and message text is
 * whitespace-normalised. */
typedef struct cache_cbuf {
    char *p;
    size_t len, cap;
    bool heap, oom;
    char stack[2048];
} cache_cbuf_t;

static void cache_cput(cache_cbuf_t *b, const void *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap * 2;
        while (cap < b->len + n)
            cap *= 2;
        char *p = b->heap ? realloc(b->p, cap) : malloc(cap);
        if (!p) {
            b->oom = true;
            return;
        }
        if (!b->heap)
            memcpy(p, b->p, b->len);
        b->p = p;
        b->cap = cap;
        b->heap = true;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void cache_cstr(cache_cbuf_t *b, const char *s, size_t n)
{
    char hdr[24];
    int hl = snprintf(hdr, sizeof(hdr), "s%zu:", n);
    cache_cput(b, hdr, (size_t)hl);
    cache_cput(b, s, n);
}

/* A text, whitespace-normalised. */
static void cache_ctext(cache_cbuf_t *b, const char *s, size_t n)
{
    size_t on;
    char *t = cache_text_normalise(s, n, &on);
    if (!t) {
        b->oom = true;
        return;
    }
    cache_cstr(b, t, on);
    free(t);
}

static int cache_keycmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The keys of an object, sorted (malloc'd array; NULL with n = 0 when
 * empty; NULL with n > 0 on OOM). */
static const char **cache_sorted_keys(const json_t *o, size_t *n)
{
    *n = json_object_size(o);
    if (*n == 0)
        return NULL;
    const char **k = malloc(*n * sizeof(*k));
    if (!k)
        return NULL;
    size_t i = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v) k[i++] = key;
    qsort(k, *n, sizeof(*k), cache_keycmp);
    return k;
}

static void cache_cvalue(cache_cbuf_t *b, const json_t *v, int depth);

static void cache_cnumber(cache_cbuf_t *b, double d, json_int_t i, bool is_int)
{
    char t[40];
    int n;
    if (is_int)
        n = snprintf(t, sizeof(t), "i%lld;", (long long)i);
    else if (d == (double)(json_int_t)d && d > -9e15 && d < 9e15)
        n = snprintf(t, sizeof(t), "i%lld;", (long long)(json_int_t)d);
    else
        n = snprintf(t, sizeof(t), "r%.17g;", d);
    cache_cput(b, t, (size_t)n);
}

/* Depth is bounded by jansson's parser already; the guard keeps a caller's
 * hand-built cycle from recursing forever. */
#define CACHE_CANON_DEPTH 64

/* What an object is: plain, a message (its content is text), or a content
 * part (its "text" is text). */
enum { CACHE_OBJ_PLAIN = 0, CACHE_OBJ_MESSAGE, CACHE_OBJ_PART };

static void cache_cobject(cache_cbuf_t *b, const json_t *o, int depth, int kind)
{
    bool message = kind == CACHE_OBJ_MESSAGE;
    size_t n;
    const char **keys = cache_sorted_keys(o, &n);
    if (n && !keys) {
        b->oom = true;
        return;
    }
    cache_cput(b, "{", 1);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_object_get(o, keys[i]);
        cache_cstr(b, keys[i], strlen(keys[i]));
        if (message && strcmp(keys[i], "content") == 0) {
            /* a single text part is what a plain string means */
            const json_t *p0 = json_array_get(v, 0);
            const json_t *ty = json_object_get(p0, "type"), *tx = json_object_get(p0, "text");
            if (json_array_size(v) == 1 && json_is_string(ty) &&
                strcmp(json_string_value(ty), "text") == 0 && json_is_string(tx) &&
                json_object_size(p0) == 2)
                v = tx;
            if (json_is_string(v)) {
                cache_ctext(b, json_string_value(v), json_string_length(v));
            } else if (json_is_array(v)) {
                cache_cput(b, "[", 1);
                for (size_t k = 0; k < json_array_size(v); k++) {
                    const json_t *part = json_array_get(v, k);
                    if (json_is_object(part))
                        cache_cobject(b, part, depth + 1, CACHE_OBJ_PART);
                    else
                        cache_cvalue(b, part, depth + 1);
                }
                cache_cput(b, "]", 1);
            } else {
                cache_cvalue(b, v, depth + 1);
            }
        } else if (kind == CACHE_OBJ_PART && strcmp(keys[i], "text") == 0 && json_is_string(v)) {
            cache_ctext(b, json_string_value(v), json_string_length(v)); /* a content part */
        } else {
            cache_cvalue(b, v, depth + 1);
        }
    }
    cache_cput(b, "}", 1);
    free(keys);
}

static void cache_cvalue(cache_cbuf_t *b, const json_t *v, int depth)
{
    if (depth > CACHE_CANON_DEPTH) {
        b->oom = true;
        return;
    }
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        cache_cobject(b, v, depth, CACHE_OBJ_PLAIN);
        break;
    case JSON_ARRAY:
        cache_cput(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++)
            cache_cvalue(b, json_array_get(v, i), depth + 1);
        cache_cput(b, "]", 1);
        break;
    case JSON_STRING:
        cache_cstr(b, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        cache_cnumber(b, 0, json_integer_value(v), true);
        break;
    case JSON_REAL:
        cache_cnumber(b, json_real_value(v), 0, false);
        break;
    case JSON_TRUE:
        cache_cput(b, "t", 1);
        break;
    case JSON_FALSE:
        cache_cput(b, "f", 1);
        break;
    default:
        cache_cput(b, "n", 1);
        break;
    }
}

/* Top-level parameters that never change the answer. */
static const char *const cache_ignored[] = {"stream", "stream_options", "user",     "metadata",
                                            "store",  "service_tier",   "messages", "model"};

static bool cache_is_ignored(const char *k)
{
    for (size_t i = 0; i < SL_ARRAY_LEN(cache_ignored); i++)
        if (strcmp(k, cache_ignored[i]) == 0)
            return true;
    return false;
}

int cache_key(const json_t *body, const char *model, const char *sub,
              unsigned char key[CACHE_KEY_LEN], cache_bypass_t *why)
{
    cache_bypass_t dummy;
    if (!why)
        why = &dummy;
    *why = CACHE_BYPASS_UNSUPPORTED;
    const json_t *msgs = json_object_get(body, "messages");
    if (!json_is_object(body) || !json_is_array(msgs) || !model)
        return -1;
    cache_cbuf_t b;
    b.p = b.stack;
    b.len = 0;
    b.cap = sizeof(b.stack);
    b.heap = b.oom = false;
    cache_cput(&b, "k1", 2);
    cache_cstr(&b, model, strlen(model));
    cache_cput(&b, "[", 1);
    int rc = -1;
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m))
            goto out;
        cache_cobject(&b, m, 1, CACHE_OBJ_MESSAGE);
    }
    cache_cput(&b, "]{", 2);
    size_t n;
    const char **keys = cache_sorted_keys(body, &n);
    if (n && !keys)
        goto out;
    for (size_t i = 0; i < n; i++) {
        if (cache_is_ignored(keys[i]))
            continue;
        cache_cstr(&b, keys[i], strlen(keys[i]));
        cache_cvalue(&b, json_object_get(body, keys[i]), 1);
    }
    free(keys);
    cache_cput(&b, "}", 1);
    if (sub)
        cache_cstr(&b, sub, strlen(sub));
    else
        cache_cput(&b, "n", 1);
    if (b.oom)
        goto out;
    SHA256((const unsigned char *)b.p, b.len, key);
    *why = CACHE_BYPASS_NONE;
    rc = 0;
out:
    if (b.heap)
        free(b.p);
    return rc;
}

/* ---- what the semantic cache embeds --------------------------------------- */

/* The text of a message's content (string, or its text parts joined by a
 * space), malloc'd; NULL when it has none. */
static char *cache_msg_text(const json_t *msg, size_t *len)
{
    const json_t *c = json_object_get(msg, "content");
    if (json_is_string(c))
        return cache_text_normalise(json_string_value(c), json_string_length(c), len);
    if (!json_is_array(c))
        return NULL;
    size_t total = 0;
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *t = json_object_get(json_array_get(c, i), "text");
        if (json_is_string(t))
            total += json_string_length(t) + 1;
    }
    if (!total)
        return NULL;
    char *buf = malloc(total + 1);
    if (!buf)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < json_array_size(c); i++) {
        const json_t *t = json_object_get(json_array_get(c, i), "text");
        if (!json_is_string(t))
            continue;
        if (o)
            buf[o++] = ' ';
        memcpy(buf + o, json_string_value(t), json_string_length(t));
        o += json_string_length(t);
    }
    char *n = cache_text_normalise(buf, o, len);
    free(buf);
    return n;
}

char *cache_sem_text(const json_t *body, const char *model, const char *sub, bool multi_turn,
                     unsigned char part[CACHE_KEY_LEN], size_t *len)
{
    const json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || !model)
        return NULL;
    /* The partition: what must match exactly for a similar question to get
     * the same answer — the model, the user in user scope, the system
     * prompt(s). */
    json_t *p = json_pack("[s,s?]", model, sub);
    size_t users = 0;
    const json_t *last = NULL;
    char *text = NULL;
    for (size_t i = 0; p && i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role)
            goto out;
        if (strcmp(role, "user") == 0) {
            users++;
            last = m;
        } else if (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0) {
            size_t n = 0;
            char *t = cache_msg_text(m, &n);
            json_array_append_new(p, json_pack("[s,s#]", role, t ? t : "", t ? n : 0));
            free(t);
        } else if (!multi_turn) {
            goto out; /* assistant / tool turns: a conversation, not a question */
        }
    }
    if (!p || !last || (users > 1 && !multi_turn))
        goto out;
    text = cache_msg_text(last, len);
    if (!text || !*len) {
        SL_FREE(text);
        goto out;
    }
    char *ps = json_dumps(p, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (!ps) {
        SL_FREE(text);
        goto out;
    }
    SHA256((const unsigned char *)ps, strlen(ps), part);
    free(ps);
out:
    json_decref(p);
    return text;
}
