/*
 * test_auth_util.h — helpers shared by the tests/unit/test_auth_*.c
 * binaries: a default `auth:` config with its secrets in the environment,
 * keys generated with OpenSSL, and token construction from raw JSON (so a
 * test can build exactly the broken token it means).
 */
#ifndef TEST_AUTH_UTIL_H
#define TEST_AUTH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>

#include "auth/auth_internal.h"

#define T_TOKEN_SECRET  "test-token-secret-0123456789abcdef0123"
#define T_SIGN_SECRET   "test-signing-secret-0123456789abcdef01"
#define T_CLIENT_SECRET "client-secret-harmony-42"
#define T_ADMIN_KEY     "admin-key-0123456789"
#define T_NOW           1700000000LL

typedef struct tconf {
    conf_auth_t c;
    conf_auth_key_t keys[4];
    conf_auth_client_t clients[2];
} tconf_t;

static inline void t_env(void)
{
    setenv("T_TOKEN_SECRET", T_TOKEN_SECRET, 1);
    setenv("T_SIGN_SECRET", T_SIGN_SECRET, 1);
    setenv("T_CLIENT", T_CLIENT_SECRET, 1);
    setenv("T_ADMIN", T_ADMIN_KEY, 1);
}

/* The example config: HS256 key k1, issuer sluice, audience chat,
 * ttl 15m, max_lifetime 1h, leeway 30s, signing required, window 300s. */
static inline void tconf_default(tconf_t *t)
{
    t_env();
    memset(t, 0, sizeof(*t));
    t->keys[0] =
        (conf_auth_key_t){.kid = "k1", .alg = CONF_AUTH_HS256, .secret_env = "T_TOKEN_SECRET"};
    t->clients[0] = (conf_auth_client_t){.id = "harmony-app", .secret_env = "T_CLIENT"};
    t->c.required = true;
    t->c.tokens = (conf_auth_tokens_t){.issuer = "sluice",
                                       .audience = "chat",
                                       .ttl_ms = 15 * 60000,
                                       .max_lifetime_ms = 3600000,
                                       .leeway_ms = 30000,
                                       .keys = t->keys,
                                       .nkeys = 1};
    t->c.clients = t->clients;
    t->c.nclients = 1;
    t->c.signing =
        (conf_auth_signing_t){.required = true, .secret_env = "T_SIGN_SECRET", .window_ms = 300000};
    t->c.admin_key_env = "T_ADMIN";
    t->c.on_store_error.nonces = CONF_STORE_ERROR_DENY;
    t->c.on_store_error.revocations = CONF_STORE_ERROR_DENY;
}

static inline auth_t *t_auth(const tconf_t *t, auth_stores_t *st)
{
    char err[256] = "";
    auth_t *a = auth_new(&t->c, st, err, sizeof(err));
    if (!a)
        fprintf(stderr, "auth_new: %s\n", err);
    return a;
}

/* A fresh key pair: "EC" P-256 or "RSA" 2048. */
static inline EVP_PKEY *t_keygen(const char *type)
{
    if (strcmp(type, "EC") == 0)
        return EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
    return EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)2048);
}

/* Writes the public half as PEM to a temp file; returns its malloc'd path. */
static inline char *t_write_pub(EVP_PKEY *k)
{
    char *path = strdup("/tmp/sluice-test-key-XXXXXX");
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    PEM_write_PUBKEY(f, k);
    fclose(f);
    return path;
}

/* The public key PEM text (for the HS256-with-public-key attack). */
static inline char *t_pub_pem(EVP_PKEY *k, size_t *len)
{
    BIO *b = BIO_new(BIO_s_mem());
    PEM_write_bio_PUBKEY(b, k);
    char *p = NULL;
    long n = BIO_get_mem_data(b, &p);
    char *out = malloc((size_t)n + 1);
    memcpy(out, p, (size_t)n);
    out[n] = '\0';
    *len = (size_t)n;
    BIO_free(b);
    return out;
}

/* Signs header.payload with an HS256 secret. */
static inline char *t_token_hs(const char *secret, size_t len, const char *hdr, const char *pay)
{
    auth_key_t k = {.alg = AUTH_ALG_HS256, .secret = (unsigned char *)secret, .secret_len = len};
    return auth_jwt_encode(hdr, pay, &k);
}

static inline char *t_token_pk(auth_alg_t alg, EVP_PKEY *priv, const char *hdr, const char *pay)
{
    auth_key_t k = {.alg = alg, .pkey = priv};
    return auth_jwt_encode(hdr, pay, &k);
}

/* A claims set valid at T_NOW for the default config. */
static inline char *t_claims(const char *sub, const char *jti, long long iat, long long exp)
{
    char *p = malloc(512);
    snprintf(p, 512,
             "{\"iss\":\"sluice\",\"aud\":\"chat\",\"sub\":\"%s\",\"jti\":\"%s\",\"iat\":%lld,"
             "\"exp\":%lld}",
             sub, jti, iat, exp);
    return p;
}

/* A default-config HS256 token for sub/jti issued at T_NOW for 15 min. */
static inline char *t_good_token(const char *sub, const char *jti)
{
    char *p = t_claims(sub, jti, T_NOW, T_NOW + 900);
    char *t = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET),
                         "{\"alg\":\"HS256\",\"typ\":\"JWT\",\"kid\":\"k1\"}", p);
    free(p);
    return t;
}

/* A signed request for token `tok` (Authorization built into authz). */
typedef struct treq {
    auth_request_t r;
    char authz[AUTH_TOKEN_MAX + 16];
    char method[16];
    char path[256];
    char ts[32];
    char nonce[80];
    char sig[80];
    char body[256];
} treq_t;

static inline void treq_sign(treq_t *q, const char *key)
{
    unsigned char h[32];
    if (auth_sha256(q->body, strlen(q->body), h) != 0 ||
        auth_sig_compute(key, strlen(key), q->method, strlen(q->method), q->path, strlen(q->path),
                         q->ts, strlen(q->ts), q->nonce, strlen(q->nonce), h, q->sig) != 0)
        abort();
}

/* Points the auth_request_t at the strings (call after editing them). */
static inline void treq_bind(treq_t *q)
{
    q->r = (auth_request_t){.authorization = q->authz,
                            .authorization_len = strlen(q->authz),
                            .method = q->method,
                            .method_len = strlen(q->method),
                            .path = q->path,
                            .path_len = strlen(q->path),
                            .timestamp = q->ts,
                            .timestamp_len = strlen(q->ts),
                            .nonce = q->nonce,
                            .nonce_len = strlen(q->nonce),
                            .signature = q->sig,
                            .signature_len = strlen(q->sig),
                            .body = q->body,
                            .body_len = strlen(q->body)};
}

/* A correctly signed POST /v1/chat/completions at `ts` with `nonce`. */
static inline void treq_make(treq_t *q, const auth_t *a, const char *tok, long long ts,
                             const char *nonce)
{
    memset(q, 0, sizeof(*q));
    snprintf(q->authz, sizeof(q->authz), "Bearer %s", tok);
    snprintf(q->method, sizeof(q->method), "POST");
    snprintf(q->path, sizeof(q->path), "/v1/chat/completions?stream=true");
    snprintf(q->ts, sizeof(q->ts), "%lld", ts);
    snprintf(q->nonce, sizeof(q->nonce), "%s", nonce);
    snprintf(q->body, sizeof(q->body), "{\"model\":\"m\",\"messages\":[]}");
    /* The jti without judging time: requests may be signed at any ts. */
    auth_jwt_t j;
    if (auth_jwt_parse(tok, strlen(tok), &j) != AUTH_OK)
        abort();
    const char *jti = json_string_value(json_object_get(j.payload, "jti"));
    char key[65];
    if (!jti || auth_signing_key(a, jti, strlen(jti), key) != 0)
        abort();
    auth_jwt_clear(&j);
    treq_sign(q, key);
    treq_bind(q);
}

static inline auth_reason_t t_check(const auth_t *a, const auth_request_t *r, int64_t now)
{
    auth_result_t res;
    auth_status_t st = auth_check(a, NULL, r, now, &res, NULL, NULL, NULL);
    if (st != AUTH_DONE)
        abort();
    return res.reason;
}

#endif
