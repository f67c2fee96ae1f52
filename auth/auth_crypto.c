/*
 * auth_crypto.c — the thin layer over OpenSSL that the rest of auth/ uses:
 * HMAC-SHA256 and SHA-256 with algorithms fetched once per process and
 * contexts kept per thread (no allocation or key setup per call),
 * strict base64url on top of EVP_EncodeBlock/EVP_DecodeBlock, and PEM key
 * loading with the size/curve checks each JWS alg needs. Nothing here is
 * hand-written crypto: we only translate the base64 alphabet and refuse
 * the inputs OpenSSL's decoder is lenient about.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "auth/auth_internal.h"

/* Fetching an algorithm is a locked lookup in OpenSSL 3; doing it once
 * keeps it off the per-request path. The fetched objects are immutable
 * and shared by all threads. */
static pthread_once_t crypto_once = PTHREAD_ONCE_INIT;
static EVP_MAC *g_hmac;
static EVP_MD *g_sha256;
/* An HMAC context with its digest already set: duplicating it is cheaper
 * than setting the digest by name on every call (that is a fetch). Never
 * used itself, only read by EVP_MAC_CTX_dup, so threads may share it. */
static EVP_MAC_CTX *g_hmac_tmpl;

static pthread_key_t tl_key;
static void auth_tl_free(void *p);

static void crypto_init(void)
{
    g_hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    g_sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_end(),
    };
    (void)pthread_key_create(&tl_key, auth_tl_free);
    g_hmac_tmpl = g_hmac ? EVP_MAC_CTX_new(g_hmac) : NULL;
    if (g_hmac_tmpl && !EVP_MAC_CTX_set_params(g_hmac_tmpl, params)) {
        EVP_MAC_CTX_free(g_hmac_tmpl);
        g_hmac_tmpl = NULL;
    }
}

/* Per-thread contexts, reused call after call: an EVP_MD_CTX initialised
 * again for each digest (no allocation once it exists), and a small cache
 * of HMAC contexts each keyed with a key this thread used, so that a key
 * seen again skips the key setup (two SHA-256 blocks and three digest
 * inits: about half of an HMAC over a signed request's canonical string).
 * A request's signing key differs per token, so one keyed context per
 * thread missed whenever two users alternated; a 2-way cache of
 * AUTH_TL_SETS sets keeps the keys of a few hundred recent tokens.
 *
 * The set is picked by a hint the caller passes, a value that is public
 * (a hash of the token the client sent), never by the key's own bytes: the
 * memory a lookup touches then says nothing about a secret. The key kept
 * in the slot is still compared (constant time) before its context is
 * used. Contexts are fetch-free dups of the process-wide prepared
 * template, made on a slot's first use; a thread's are freed when it
 * exits. At most AUTH_TL_SETS * 2 contexts (~0.7 KiB each) per thread. */
#define AUTH_TL_KEY_MAX 128 /* longer keys are not kept for reuse */
#define AUTH_TL_SETS    128 /* a power of two */
#define AUTH_TL_WAYS    2

typedef struct auth_tl_mac {
    EVP_MAC_CTX *ctx;
    uint64_t key_id; /* the id its key was registered under; 0 = none */
    size_t klen;     /* 0 = not keyed */
    unsigned char key[AUTH_TL_KEY_MAX];
} auth_tl_mac_t;

typedef struct auth_tl {
    EVP_MD_CTX *md;
    unsigned char lru[AUTH_TL_SETS]; /* per set: the way to replace next */
    auth_tl_mac_t mac[AUTH_TL_SETS][AUTH_TL_WAYS];
} auth_tl_t;

static _Thread_local auth_tl_t *tl;

static void auth_tl_free(void *p)
{
    auth_tl_t *t = p;
    if (!t)
        return;
    EVP_MD_CTX_free(t->md);
    for (size_t i = 0; i < AUTH_TL_SETS; i++)
        for (size_t w = 0; w < AUTH_TL_WAYS; w++)
            EVP_MAC_CTX_free(t->mac[i][w].ctx);
    OPENSSL_cleanse(t, sizeof(*t));
    free(t);
    tl = NULL;
}

static auth_tl_t *auth_tl_get(void)
{
    if (tl)
        return tl;
    auth_tl_t *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->md = EVP_MD_CTX_new();
    if (!t->md || pthread_setspecific(tl_key, t) != 0) {
        auth_tl_free(t);
        return NULL;
    }
    return tl = t;
}

/* The context to use for `key` in the hint's set, keyed and ready for
 * updates, or NULL. */
/* Restarts a kept context from its keyed setup, as the way last used. */
static EVP_MAC_CTX *auth_tl_reuse(auth_tl_t *t, size_t set, size_t w)
{
    t->lru[set] = (unsigned char)(w ^ 1);
    auth_tl_mac_t *m = &t->mac[set][w];
    return EVP_MAC_init(m->ctx, NULL, 0, NULL) ? m->ctx : NULL;
}

static EVP_MAC_CTX *auth_tl_mac(auth_tl_t *t, unsigned hint, uint64_t key_id, const void *key,
                                size_t klen)
{
    /* OpenSSL refuses a NULL key even of length 0; an empty key never
     * occurs here (secrets have minimum lengths) but stay defined. */
    static const unsigned char empty[1];
    size_t set = hint & (AUTH_TL_SETS - 1);
    auth_tl_mac_t *ways = t->mac[set];
    /* By id first: a public number, so an equality test, not a
     * constant-time compare of two secret keys (64 bytes, a byte a step). */
    for (size_t w = 0; key_id && w < AUTH_TL_WAYS; w++)
        if (ways[w].key_id == key_id && ways[w].klen == klen)
            return auth_tl_reuse(t, set, w);
    if (klen && klen <= AUTH_TL_KEY_MAX) {
        for (size_t w = 0; w < AUTH_TL_WAYS; w++) {
            auth_tl_mac_t *m = &ways[w];
            if (m->klen == klen && CRYPTO_memcmp(key, m->key, klen) == 0) {
                m->key_id = key_id; /* the same key under a new id */
                return auth_tl_reuse(t, set, w);
            }
        }
    }
    auth_tl_mac_t *m = &ways[t->lru[set]];
    t->lru[set] ^= 1;
    if (!m->ctx && !(m->ctx = g_hmac_tmpl ? EVP_MAC_CTX_dup(g_hmac_tmpl) : NULL))
        return NULL;
    m->klen = 0;
    m->key_id = 0;
    if (!EVP_MAC_init(m->ctx, klen ? key : empty, klen, NULL))
        return NULL;
    if (klen && klen <= AUTH_TL_KEY_MAX) {
        memcpy(m->key, key, klen);
        m->klen = klen;
        m->key_id = key_id;
    }
    return m->ctx;
}

uint64_t auth_key_id_new(void)
{
    static _Atomic uint64_t next = 1;
    return atomic_fetch_add_explicit(&next, 1, memory_order_relaxed);
}

int auth_hmac_sha256_hint(unsigned hint, const void *key, size_t klen, const void *const *parts,
                          const size_t *lens, size_t n, unsigned char out[32])
{
    return auth_hmac_sha256_id(hint, 0, key, klen, parts, lens, n, out);
}

int auth_hmac_sha256_id(unsigned hint, uint64_t key_id, const void *key, size_t klen,
                        const void *const *parts, const size_t *lens, size_t n,
                        unsigned char out[32])
{
    pthread_once(&crypto_once, crypto_init);
    auth_tl_t *t = auth_tl_get();
    EVP_MAC_CTX *ctx = t ? auth_tl_mac(t, hint, key_id, key, klen) : NULL;
    int ok = ctx != NULL;
    for (size_t i = 0; ok && i < n; i++)
        ok = EVP_MAC_update(ctx, parts[i], lens[i]);
    size_t outl = 0;
    if (ok)
        ok = EVP_MAC_final(ctx, out, &outl, 32);
    if (!ok && t) {
        /* a context in an unknown state is keyed again next time */
        for (size_t w = 0; w < AUTH_TL_WAYS; w++) {
            t->mac[hint & (AUTH_TL_SETS - 1)][w].klen = 0;
            t->mac[hint & (AUTH_TL_SETS - 1)][w].key_id = 0;
        }
    }
    return ok && outl == 32 ? 0 : -1;
}

int auth_hmac_sha256(const void *key, size_t klen, const void *const *parts, const size_t *lens,
                     size_t n, unsigned char out[32])
{
    /* set 0: the process's own keys (token and signing secrets) */
    return auth_hmac_sha256_hint(0, key, klen, parts, lens, n, out);
}

int auth_sha256(const void *data, size_t len, unsigned char out[32])
{
    pthread_once(&crypto_once, crypto_init);
    auth_tl_t *t = g_sha256 ? auth_tl_get() : NULL;
    unsigned int outl = 0;
    if (!t || !EVP_DigestInit_ex2(t->md, g_sha256, NULL) || !EVP_DigestUpdate(t->md, data, len) ||
        !EVP_DigestFinal_ex(t->md, out, &outl) || outl != 32)
        return -1;
    return 0;
}

size_t auth_b64url_encode(const unsigned char *in, size_t n, char *out)
{
    int m = EVP_EncodeBlock((unsigned char *)out, in, (int)n);
    size_t k = (size_t)m;
    while (k > 0 && out[k - 1] == '=')
        k--;
    for (size_t i = 0; i < k; i++) {
        if (out[i] == '+')
            out[i] = '-';
        else if (out[i] == '/')
            out[i] = '_';
    }
    out[k] = '\0';
    return k;
}

static int b64url_char_ok(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

long auth_b64url_decode(const char *in, size_t n, unsigned char *out, size_t outcap)
{
    /* A remainder of 1 character cannot encode a whole byte. */
    if (n % 4 == 1 || n > AUTH_TOKEN_MAX)
        return -1;
    if (n == 0)
        return 0;
    size_t dlen = n / 4 * 3 + (n % 4 ? n % 4 - 1 : 0);
    if (dlen > outcap)
        return -1;
    size_t padded = (n + 3) / 4 * 4;
    /* Token parts are small: stack buffers keep malloc off the hot path. */
    char sbuf[1024], scheck[1024];
    unsigned char stmp[768];
    bool small = padded + 1 <= sizeof(sbuf);
    char *buf = small ? sbuf : malloc(padded + 1);
    unsigned char *tmp = small ? stmp : malloc(padded / 4 * 3 + 1);
    char *check = small ? scheck : malloc(padded + 1);
    long rc = -1;
    if (!buf || !tmp || !check)
        goto out;
    for (size_t i = 0; i < n; i++) {
        char c = in[i];
        if (!b64url_char_ok(c))
            goto out;
        buf[i] = c == '-' ? '+' : c == '_' ? '/' : c;
    }
    for (size_t i = n; i < padded; i++)
        buf[i] = '=';
    if (EVP_DecodeBlock(tmp, (const unsigned char *)buf, (int)padded) != (int)(padded / 4 * 3))
        goto out;
    /* EVP_DecodeBlock ignores the unused low bits of the last character
     * ("QR" and "QQ" both give "A"); a token must have one spelling, so
     * re-encode and demand the same text. */
    if (auth_b64url_encode(tmp, dlen, check) != n || memcmp(check, in, n) != 0)
        goto out;
    if (dlen > 0)
        memcpy(out, tmp, dlen);
    rc = (long)dlen;
out:
    if (!small) {
        free(buf);
        free(tmp);
        free(check);
    }
    return rc;
}

int auth_pkey_check(EVP_PKEY *k, auth_alg_t alg, char *err, size_t errlen)
{
    if (alg == AUTH_ALG_RS256) {
        if (!EVP_PKEY_is_a(k, "RSA")) {
            snprintf(err, errlen, "not an RSA key (alg RS256)");
            return -1;
        }
        if (EVP_PKEY_get_bits(k) < 2048) {
            snprintf(err, errlen, "RSA key of %d bits, RS256 needs at least 2048",
                     EVP_PKEY_get_bits(k));
            return -1;
        }
        return 0;
    }
    if (alg == AUTH_ALG_ES256) {
        char group[64] = "";
        size_t glen = 0;
        if (!EVP_PKEY_is_a(k, "EC") || !EVP_PKEY_get_group_name(k, group, sizeof(group), &glen) ||
            (strcmp(group, "prime256v1") != 0 && strcmp(group, "P-256") != 0)) {
            snprintf(err, errlen, "not an EC P-256 key (alg ES256)");
            return -1;
        }
        return 0;
    }
    snprintf(err, errlen, "alg %s takes a secret, not a key file", auth_alg_name(alg));
    return -1;
}

EVP_PKEY *auth_pem_load(const char *path, auth_alg_t alg, bool want_private, char *err,
                        size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    EVP_PKEY *k = want_private ? PEM_read_PrivateKey(f, NULL, NULL, NULL)
                               : PEM_read_PUBKEY(f, NULL, NULL, NULL);
    fclose(f);
    if (!k) {
        unsigned long e = ERR_get_error();
        char ebuf[128];
        ERR_error_string_n(e, ebuf, sizeof(ebuf));
        ERR_clear_error();
        snprintf(err, errlen, "%s: not a PEM %s key (%s)", path,
                 want_private ? "private" : "public", ebuf);
        return NULL;
    }
    char why[128];
    if (auth_pkey_check(k, alg, why, sizeof(why)) != 0) {
        snprintf(err, errlen, "%s: %s", path, why);
        EVP_PKEY_free(k);
        return NULL;
    }
    return k;
}

int auth_alg_parse(const char *s)
{
    if (!s)
        return -1;
    if (strcmp(s, "HS256") == 0)
        return AUTH_ALG_HS256;
    if (strcmp(s, "RS256") == 0)
        return AUTH_ALG_RS256;
    if (strcmp(s, "ES256") == 0)
        return AUTH_ALG_ES256;
    return -1;
}

const char *auth_alg_name(auth_alg_t alg)
{
    switch (alg) {
    case AUTH_ALG_HS256:
        return "HS256";
    case AUTH_ALG_RS256:
        return "RS256";
    case AUTH_ALG_ES256:
        return "ES256";
    }
    return "?";
}
