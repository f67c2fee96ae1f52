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

/* ---- canonical JSON ------------------------------------------------------- */

/* Numbers that are integral reals become integers, recursively, so 0 and
 * 0.0 (or 1 and 1.0) key alike. Works on a private copy. */
static void cache_canon_numbers(json_t *v)
{
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        void *tmp;
        json_object_foreach_safe(v, tmp, k, x)
        {
            if (json_is_real(x)) {
                double d = json_real_value(x);
                if (d == (double)(json_int_t)d && d > -9e15 && d < 9e15)
                    json_object_set_new(v, k, json_integer((json_int_t)d));
            } else {
                cache_canon_numbers(x);
            }
        }
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *x = json_array_get(v, i);
            if (json_is_real(x)) {
                double d = json_real_value(x);
                if (d == (double)(json_int_t)d && d > -9e15 && d < 9e15)
                    json_array_set_new(v, i, json_integer((json_int_t)d));
            } else {
                cache_canon_numbers(x);
            }
        }
    }
}

static json_t *cache_norm_string(const char *s, size_t n)
{
    size_t on;
    char *t = cache_text_normalise(s, n, &on);
    if (!t)
        return NULL;
    json_t *j = json_stringn(t, on);
    free(t);
    return j;
}

/* A message's content with its text whitespace-normalised: a string, or
 * the text parts of an array of parts (other parts as they are). */
static int cache_norm_content(json_t *msg)
{
    json_t *c = json_object_get(msg, "content");
    if (json_is_string(c)) {
        json_t *n = cache_norm_string(json_string_value(c), json_string_length(c));
        return n ? json_object_set_new(msg, "content", n) : -1;
    }
    if (json_is_array(c)) {
        for (size_t i = 0; i < json_array_size(c); i++) {
            json_t *part = json_array_get(c, i);
            json_t *t = json_object_get(part, "text");
            if (json_is_string(t)) {
                json_t *n = cache_norm_string(json_string_value(t), json_string_length(t));
                if (!n || json_object_set_new(part, "text", n) != 0)
                    return -1;
            }
        }
        /* A single text part is what a plain string means. */
        if (json_array_size(c) == 1) {
            json_t *p = json_array_get(c, 0);
            json_t *ty = json_object_get(p, "type"), *t = json_object_get(p, "text");
            if (json_is_string(ty) && strcmp(json_string_value(ty), "text") == 0 &&
                json_is_string(t) && json_object_size(p) == 2)
                return json_object_set(msg, "content", t);
        }
    }
    return 0;
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
    json_t *canon = json_object(), *params = json_object(), *list = json_array();
    int rc = -1;
    if (!canon || !params || !list)
        goto out;
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_deep_copy(json_array_get(msgs, i));
        if (!json_is_object(m) || cache_norm_content(m) != 0) {
            json_decref(m);
            goto out;
        }
        cache_canon_numbers(m);
        json_array_append_new(list, m);
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)body, k, v)
    {
        if (cache_is_ignored(k))
            continue;
        json_object_set_new(params, k, json_deep_copy(v));
    }
    cache_canon_numbers(params);
    json_object_set_new(canon, "v", json_integer(1));
    json_object_set_new(canon, "model", json_string(model));
    json_object_set(canon, "messages", list);
    json_object_set(canon, "params", params);
    json_object_set_new(canon, "sub", sub ? json_string(sub) : json_null());
    char *text = json_dumps(canon, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII);
    if (!text)
        goto out;
    SHA256((const unsigned char *)text, strlen(text), key);
    free(text);
    *why = CACHE_BYPASS_NONE;
    rc = 0;
out:
    json_decref(canon);
    json_decref(params);
    json_decref(list);
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
