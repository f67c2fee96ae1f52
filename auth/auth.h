/*
 * auth.h — tokens and request signatures: what the gateway calls before a
 * request may reach an upstream, and the two endpoints it routes here
 * (POST /v1/auth/token, POST /admin/revoke). docs/auth.md is the user's
 * side of the same thing (how apps sign, how login backends mint).
 *
 * Objects and their lifetimes:
 *   auth_stores_t  the in-process nonce and revocation stores. Created once
 *                  per process and kept across config reloads (a reload must
 *                  not forget revocations or seen nonces). Thread-safe.
 *   auth_t         keys, secrets and policy built from one config. Immutable
 *                  after auth_new(), shared by every worker thread; must
 *                  outlive every check still pending on it.
 *   sl_redis_t     (common/redis.h) one per worker event base, borrowed per
 *                  call. Pass NULL to use only the in-process stores.
 *
 * Time: every function that judges time takes `now` (wall clock, Unix
 * seconds) from the caller; nothing here reads a clock except where a
 * comment says so (the random jti, and the CLI).
 *
 * Rejections carry an auth_reason_t with a stable string (auth_reason_str)
 * used both as the metric label of sluice_auth_rejected_total{reason} and as
 * the "code" of the OpenAI-style error body. Bodies and messages never
 * include a secret, a token or a signature.
 */
#ifndef AUTH_H
#define AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sl.h"
#include "conf/conf.h"

typedef struct sl_redis sl_redis_t;

/* ---- config ---------------------------------------------------------------
 * The `auth:` section is conf_auth_t in conf/conf.h (rows in conf_keys.c;
 * docs/auth.md shows it). Auth is on when auth.tokens.keys is non-empty
 * (auth_conf_enabled); the gateway builds an auth_t only then. auth_new()
 * reads the secrets from the environment variables the section names, once;
 * a missing or too short secret is a config error. */
static inline bool auth_conf_enabled(const conf_auth_t *c)
{
    return c->tokens.nkeys > 0;
}

/* ---- reasons -------------------------------------------------------------- */

typedef enum auth_reason {
    AUTH_OK = 0,
    AUTH_R_TOKEN_MISSING,       /* no Authorization: Bearer on a route that needs one */
    AUTH_R_TOKEN_MALFORMED,     /* not three base64url parts of JSON objects, duplicate
                                   members, oversized, unknown `crit` */
    AUTH_R_TOKEN_ALG,           /* `none` in any spelling, or not the key's pinned alg */
    AUTH_R_TOKEN_KID,           /* no configured key has this kid */
    AUTH_R_TOKEN_SIGNATURE,     /* the signature does not verify */
    AUTH_R_TOKEN_EXPIRED,       /* now >= exp + leeway */
    AUTH_R_TOKEN_NOT_YET_VALID, /* nbf or iat later than now + leeway */
    AUTH_R_TOKEN_LIFETIME,      /* exp - iat over max_lifetime */
    AUTH_R_TOKEN_ISSUER,        /* iss differs from tokens.issuer */
    AUTH_R_TOKEN_AUDIENCE,      /* aud does not name tokens.audience */
    AUTH_R_TOKEN_CLAIMS,        /* exp missing, a claim of the wrong type or size,
                                   sub or jti missing on the request path */
    AUTH_R_TOKEN_REVOKED,       /* its jti, or its sub since iat, was revoked */
    AUTH_R_SIG_MISSING,         /* signing required and an X-Sluice-* header absent */
    AUTH_R_SIG_TIMESTAMP,       /* not decimal Unix seconds, or outside the window */
    AUTH_R_SIG_NONCE,           /* not 16..64 characters of [A-Za-z0-9_-] */
    AUTH_R_SIG_MISMATCH,        /* the HMAC does not match the canonical request */
    AUTH_R_SIG_REPLAY,          /* this nonce was already used inside the window */
    AUTH_R_STORE_UNAVAILABLE,   /* nonce/revocation store down or late, and
                                   on_store_error is deny */
    AUTH_R_NONCE_STORE_FULL,    /* the in-process nonce store holds as many nonces as
                                   auth.signing.nonce_memory allows (503, Retry-After) */
    AUTH_R_SIG_BEFORE_START,    /* in-process store: the timestamp is before the store's
                                   start, so the nonce may have been used before a restart */
    AUTH_R__COUNT
} auth_reason_t;

/* "ok", "token_missing", "token_malformed", ... (stable; never NULL). */
const char *auth_reason_str(auth_reason_t r);
/* 401 for every reason except AUTH_R_STORE_UNAVAILABLE and
 * AUTH_R_NONCE_STORE_FULL (503); 200 for OK. */
int auth_reason_http_status(auth_reason_t r);

/* ---- stores (in-process) --------------------------------------------------- */

typedef struct auth_stores auth_stores_t;

/* What one remembered nonce costs (entry, its share of a slab and
 * of the hash table): auth.signing.nonce_memory / this = the capacity. */
#define AUTH_NONCE_ENTRY_BYTES    128
#define AUTH_NONCE_MEMORY_DEFAULT (128LL << 20) /* 1 Mi nonces */
/* Nonces expire in buckets this many seconds wide: one is remembered up to
 * this much longer than its window, and a full store frees room every
 * bucket (its Retry-After). */
#define AUTH_NONCE_BUCKET_S 8

/* Capacities: nonce entries (0 = AUTH_NONCE_MEMORY_DEFAULT's) and
 * revocation entries (jti and sub together; 0 = default 65536). A full
 * store refuses (nonces: AUTH_R_NONCE_STORE_FULL; revocations: 503 on the
 * admin API), never evicts. */
auth_stores_t *auth_stores_new(size_t nonce_capacity, size_t revocation_capacity) SL_WUR;
void auth_stores_free(auth_stores_t *s);
/* The nonce capacity of the whole store, in entries (auth_new sets it from
 * auth.signing.nonce_memory). Lowering it below what is held refuses new
 * nonces until enough expire; nothing is dropped. */
void auth_stores_set_nonce_capacity(auth_stores_t *s, size_t entries);
size_t auth_stores_nonce_capacity(const auth_stores_t *s);
/* Nonce entries held (expired ones not freed yet included), and live:
 * those counted against the capacity. */
size_t auth_stores_nonce_count(const auth_stores_t *s);
size_t auth_stores_nonce_live(const auth_stores_t *s);
/* Bytes of the nonce tables of all shards (both tables of a shard being
 * moved), kept within nonce_memory. */
size_t auth_stores_nonce_table_bytes(const auth_stores_t *s);
/* Upkeep of the nonce store, off the request path (the gateway's
 * once-a-second tick): passed time buckets of quiet shards, the moves of
 * tables between sizes, and the shrinking of tables a peak left mostly
 * empty (their memory goes back to the system). Each shard's lock is held
 * for a bounded step at a time. */
void auth_stores_maintain(auth_stores_t *s, int64_t now);
size_t auth_stores_revocation_count(const auth_stores_t *s);
/* When the store began remembering nonces (Unix seconds; the gateway sets
 * its start). Nonces of requests signed before it were never seen here, so
 * with auth.signing.refuse_before_start a signed request whose timestamp
 * is an earlier second is refused (AUTH_R_SIG_BEFORE_START) rather than
 * accepted unremembered: after a restart or an upgrade, a request captured
 * before it cannot be replayed. Unset (a library user, tests): no limit. */
void auth_stores_set_started(auth_stores_t *s, int64_t unix_s);
int64_t auth_stores_started(const auth_stores_t *s);
/* Signed requests per second a store of `capacity` nonces sustains with a
 * signature window of window_s: capacity / (window_s + AUTH_NONCE_BUCKET_S)
 * (a nonce is kept its window, plus up to a bucket). */
int64_t auth_nonce_rate(size_t capacity, int64_t window_s);

/* ---- building ------------------------------------------------------------- */

typedef struct auth auth_t;

/* Builds keys and policy from conf; loads PEM files and reads env secrets
 * now. stores: borrowed, must outlive the auth_t. NULL on error with one
 * line in err ("auth.tokens.keys[1] (k2): cannot read conf/keys/x.pub: ...").
 * Registers the metrics (idempotent). */
auth_t *auth_new(const conf_auth_t *conf, auth_stores_t *stores, char *err, size_t errlen) SL_WUR;
void auth_free(auth_t *a);

/* ---- token verification (pure) ------------------------------------------- */

#define AUTH_SUB_MAX 255 /* longest sub accepted, in bytes */
#define AUTH_JTI_MAX 128
#define AUTH_KID_MAX 64

typedef struct auth_claims {
    char sub[AUTH_SUB_MAX + 1]; /* "" when absent */
    char jti[AUTH_JTI_MAX + 1]; /* "" when absent */
    char kid[AUTH_KID_MAX + 1]; /* the key that verified it */
    int64_t exp;
    int64_t iat; /* valid when has_iat */
    int64_t nbf; /* valid when has_nbf */
    bool has_iat;
    bool has_nbf;
} auth_claims_t;

/* Verifies a compact JWS (RFC 7515/7519): structure, alg pinned by the key
 * (`kid` header; a token without `kid` is accepted only when exactly one
 * key is configured), signature, exp (required), nbf, iat, lifetime cap,
 * iss and aud when configured. jku/x5u/jwk/x5c headers are never used.
 * Does NOT consult revocations and does not require sub/jti; see
 * auth_check for the request path. out may be NULL. */
auth_reason_t auth_token_verify(const auth_t *a, const char *token, size_t len, int64_t now,
                                auth_claims_t *out) SL_WUR;

/* ---- the request path ------------------------------------------------------ */

/* Header values as received (pointer + length, not NUL-terminated; NULL
 * pointer = header absent). All borrowed for the duration of the call. */
typedef struct auth_request {
    const char *authorization; /* "Bearer <token>" */
    size_t authorization_len;
    const char *method; /* "POST" */
    size_t method_len;
    const char *path; /* request-target exactly as sent: "/v1/chat/completions?x=1" */
    size_t path_len;
    const char *timestamp; /* X-Sluice-Timestamp */
    size_t timestamp_len;
    const char *nonce; /* X-Sluice-Nonce */
    size_t nonce_len;
    const char *signature; /* X-Sluice-Signature */
    size_t signature_len;
    /* The body: either its SHA-256 (32 bytes, when the caller hashed it while
     * reading), or the bytes themselves (body_sha256 NULL). */
    const unsigned char *body_sha256;
    const void *body;
    size_t body_len;
} auth_request_t;

typedef struct auth_result {
    auth_reason_t reason; /* AUTH_OK: let it through */
    bool authenticated;   /* a valid token was presented (claims below are set) */
    auth_claims_t claims; /* claims.sub is the user, for rate limits and logs */
} auth_result_t;

typedef enum auth_status {
    AUTH_DONE = 0,    /* *res is filled now; the callback will not run */
    AUTH_PENDING = 1, /* the callback runs later on redis's event base thread */
} auth_status_t;

typedef struct auth_pending auth_pending_t;
/* res: borrowed, valid during the callback. The pending handle is gone
 * once the callback runs. */
typedef void (*auth_check_cb)(void *arg, const auth_result_t *res);

/* Checks a request: token (when present or required), revocation, then the
 * signature (when present or required) and its nonce. Counts every
 * rejection in sluice_auth_rejected_total{reason}. Tokens that verified
 * are cached in the auth_t (bounded; the clock rules are re-run on a hit,
 * revocation is never cached).
 *   redis == NULL: the in-process stores answer; always AUTH_DONE.
 *   redis != NULL: the revocation lookups and the nonce SET NX go to Redis
 *   in one EVALSHA and the answer is AUTH_PENDING (*pending set), unless the
 *   request was decided without the store (AUTH_DONE). A store error follows
 *   conf on_store_error per check: deny -> AUTH_R_STORE_UNAVAILABLE; allow ->
 *   that check falls back to the in-process store; both counted in
 *   sluice_auth_store_fallback_total{check,action}.
 * Thread-safe (a and the stores are shared; redis is the calling worker's). */
auth_status_t auth_check(const auth_t *a, sl_redis_t *redis, const auth_request_t *req, int64_t now,
                         auth_result_t *res, auth_check_cb cb, void *arg,
                         auth_pending_t **pending) SL_WUR;

/* (auth_check and auth_admin_revoke use Redis only when redis, cb and
 * pending are all non-NULL; otherwise they answer in-process, AUTH_DONE.) */

/* The callback will not run; frees the handle. Only before the callback. */
void auth_pending_cancel(auth_pending_t *p);

/* ---- HTTP replies ------------------------------------------------------------ */

typedef struct auth_http_reply {
    int status; /* 200, 400, 401, 403, 404, 405, 503 */
    char *body; /* malloc'd JSON, NUL-terminated; owned by the receiver */
    size_t body_len;
    char www_authenticate[160]; /* header value for 401, else "" */
    char headers[64];           /* more header lines for the reply, each ending in CRLF
                                   ("Retry-After: 8\r\n" with a 503), else "" */
} auth_http_reply_t;

/* Frees body and zeroes the reply. NULL-safe. */
void auth_http_reply_clear(auth_http_reply_t *r);

/* The reply for a rejected request: 401 with WWW-Authenticate, or 503
 * with Retry-After (in headers) for the stores, and an OpenAI-style error body
 * {"error":{"message":..,"type":"authentication_error","param":null,"code":"<reason>"}}.
 * -1 only on OOM. */
int auth_reject_reply(auth_reason_t r, auth_http_reply_t *out) SL_WUR;

/* ---- POST /v1/auth/token (synchronous) -------------------------------------
 * Body {"client_id":"..","client_secret":"..","sub":"alice","ttl":900?}
 * (ttl in seconds, optional, at most tokens.max_lifetime). 200 with
 * {"access_token","token_type":"Bearer","expires_in","signing_key"};
 * 400 bad body, 401 bad client, 503 when no key can sign (no HS256 key).
 * -1 only on OOM. Rate limiting per client IP is the caller's. */
int auth_token_endpoint(const auth_t *a, const char *body, size_t len, int64_t now,
                        auth_http_reply_t *out) SL_WUR;

/* Mints a token for sub with the first HS256 key (the CLI and the endpoint
 * both use it). ttl_s 0 = tokens.ttl. *token is malloc'd (caller frees);
 * signing_key receives 64 hex chars + NUL. Reads the OS random source.
 * -1 when no HS256 key is configured, sub is empty or too long, ttl over
 * max_lifetime, or OOM (err says which). */
int auth_token_mint(const auth_t *a, const char *sub, int64_t ttl_s, int64_t now, char **token,
                    char signing_key[65], char *err, size_t errlen) SL_WUR;

/* hex(HMAC-SHA256(signing secret, jti)) into out (65 bytes). -1 when no
 * signing secret is configured. */
int auth_signing_key(const auth_t *a, const char *jti, size_t jti_len, char out[65]) SL_WUR;

/* ---- POST /admin/revoke ---------------------------------------------------------
 * authorization: the Authorization header value ("Bearer <admin key>").
 * Body {"jti":".."} or {"sub":".."} or both. 200 with
 * {"revoked":{"jti":..,"sub":..},"until":<unix s>,"store":"local"|"redis"};
 * 400 bad body, 401 bad admin key, 503 store full or Redis failed.
 * Always recorded in the in-process store; with redis also in Redis
 * (AUTH_PENDING, reply delivered to cb). */
typedef void (*auth_reply_cb)(void *arg, auth_http_reply_t *reply); /* takes the body */

auth_status_t auth_admin_revoke(const auth_t *a, sl_redis_t *redis, const char *authorization,
                                size_t authorization_len, const char *body, size_t len, int64_t now,
                                auth_http_reply_t *out, auth_reply_cb cb, void *arg,
                                auth_pending_t **pending) SL_WUR;

/* Direct revocation, for tests and tools (in-process store only). */
int auth_revoke_jti(const auth_t *a, const char *jti, int64_t now) SL_WUR;
int auth_revoke_sub(const auth_t *a, const char *sub, int64_t now) SL_WUR;

/* ---- tools -------------------------------------------------------------------
 *   sluice token --sub alice [--ttl 15m] -c CONF
 *   sluice sign --key K --method POST --path /v1/chat/completions --body FILE
 *               [--timestamp T] [--nonce N]
 * argv[0] is the subcommand ("token" / "sign"). Prints to stdout; returns
 * the process exit code (0 ok, 1 failure, 2 usage). */
int auth_cli_main(int argc, char **argv);

#endif
