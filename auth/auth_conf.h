/*
 * auth_conf.h — the `auth:` config section as plain data, in conf/conf.h's
 * style, until it moves into conf/conf.h next to the loader's table (this
 * file then goes away; the type names stay the same).
 *
 *   auth:
 *     required: true
 *     tokens:
 *       issuer: sluice
 *       audience: chat
 *       ttl: 15m
 *       max_lifetime: 1h
 *       leeway: 30s
 *       keys:
 *         - { kid: k1, alg: HS256, secret_env: SLUICE_TOKEN_SECRET }
 *         - { kid: k2, alg: ES256, public_key: conf/keys/login-es256.pub }
 *     clients: [ { id: harmony-app, secret_env: SLUICE_CLIENT_HARMONY } ]
 *     signing: { required: true, secret_env: SLUICE_SIGNING_SECRET, window: 300s }
 *     admin_key_env: SLUICE_ADMIN_KEY
 *     on_store_error: { nonces: deny, revocations: deny }
 */
#ifndef AUTH_CONF_H
#define AUTH_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum conf_store_error {
    CONF_STORE_ERROR_DENY = 0, /* default */
    CONF_STORE_ERROR_ALLOW,
} conf_store_error_t;

typedef struct conf_auth_key {
    char *kid;        /* required, unique */
    char *alg;        /* "HS256" | "RS256" | "ES256" */
    char *secret_env; /* HS256: env var holding the secret (>= 32 bytes; a value
                         "base64url:..." is decoded first) */
    char *public_key; /* RS256/ES256: PEM public key file */
    int line;
} conf_auth_key_t;

typedef struct conf_auth_client {
    char *id;
    char *secret_env; /* env var holding the client secret (>= 16 bytes) */
    int line;
} conf_auth_client_t;

typedef struct conf_auth_tokens {
    char *issuer;            /* NULL = iss not checked; minted tokens carry it */
    char *audience;          /* NULL = aud not checked */
    int64_t ttl_ms;          /* minted tokens, 15m */
    int64_t max_lifetime_ms; /* exp - iat cap, 1h */
    int64_t leeway_ms;       /* clock skew allowed on exp/nbf/iat, 30s, at most 60s */
    conf_auth_key_t *keys;
    size_t nkeys;
} conf_auth_tokens_t;

typedef struct conf_auth_signing {
    bool required;     /* true */
    char *secret_env;  /* env var of the signing secret (>= 32 bytes) */
    int64_t window_ms; /* +- window on X-Sluice-Timestamp, 300s */
} conf_auth_signing_t;

typedef struct conf_auth_store_error {
    int nonces;      /* conf_store_error_t, deny */
    int revocations; /* conf_store_error_t, deny */
} conf_auth_store_error_t;

typedef struct conf_auth {
    bool required; /* true: a token is needed on the routes the gateway guards */
    conf_auth_tokens_t tokens;
    conf_auth_client_t *clients;
    size_t nclients;
    conf_auth_signing_t signing;
    char *admin_key_env; /* env var of the admin bearer key; NULL = revoke API off */
    conf_auth_store_error_t on_store_error;
} conf_auth_t;

#endif
