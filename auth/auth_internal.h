/*
 * auth_internal.h — what the auth/ sources share with each other and with
 * their tests and fuzz target: the auth_t layout, the JWS codec, the pure
 * signature check and the in-process stores. Not for other modules.
 */
#ifndef AUTH_INTERNAL_H
#define AUTH_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "auth/auth.h"
#include "common/metrics.h"

/* ---- keys ------------------------------------------------------------------ */

typedef enum auth_alg {
    AUTH_ALG_HS256 = 0,
    AUTH_ALG_RS256,
    AUTH_ALG_ES256,
} auth_alg_t;

/* "HS256" -> AUTH_ALG_HS256 (exact, case-sensitive as RFC 7515 says); -1 when unknown. */
int auth_alg_parse(const char *s);
const char *auth_alg_name(auth_alg_t alg);

typedef struct auth_key {
    char kid[AUTH_KID_MAX + 1];
    auth_alg_t alg;
    unsigned char *secret; /* HS256, owned, cleansed on free */
    size_t secret_len;
    EVP_PKEY *pkey; /* RS256/ES256, owned; public for verifying, private for signing */
} auth_key_t;

/* Loads a PEM public key (or private key when want_private) and checks it
 * fits alg: RSA of at least 2048 bits for RS256, EC P-256 for ES256. */
EVP_PKEY *auth_pem_load(const char *path, auth_alg_t alg, bool want_private, char *err,
                        size_t errlen);
/* The same check for a key already in memory; 0 ok, -1 (err says why). */
int auth_pkey_check(EVP_PKEY *k, auth_alg_t alg, char *err, size_t errlen);

/* ---- verified-token cache (auth_tcache.c) ------------------------------------- */

typedef struct auth_tcache auth_tcache_t;

typedef struct auth_tcache_val {
    auth_claims_t claims;
    char signing_key[65]; /* "" when no signing secret */
    uint64_t key_id;      /* signing_key's (auth_key_id_new), 0 = none */
} auth_tcache_val_t;

#define AUTH_TCACHE_DEFAULT   8192 /* entries, ~650 bytes + the token each */
#define AUTH_TCACHE_TOKEN_MAX 2048 /* longer tokens are verified every time */

auth_tcache_t *auth_tcache_new(size_t cap);
void auth_tcache_free(auth_tcache_t *c);
/* The hash a token is looked up and stored with (not a secret; also the
 * signature check's context hint). */
unsigned auth_tcache_hash(const char *tok, size_t len);
/* When these exact token bytes are cached and now < their expiry, copies
 * the value into *claims, signing_key (65 bytes) and *key_id (unless NULL)
 * and returns true (an expired entry is dropped). */
bool auth_tcache_get(auth_tcache_t *c, const char *tok, size_t len, unsigned hash, int64_t now,
                     auth_claims_t *claims, char *signing_key, uint64_t *key_id);
void auth_tcache_put(auth_tcache_t *c, const char *tok, size_t len, unsigned hash,
                     const auth_tcache_val_t *v, int64_t expires, int64_t now);
size_t auth_tcache_count(auth_tcache_t *c);

/* ---- the built config -------------------------------------------------------- */

typedef struct auth_client {
    char *id;
    unsigned char *secret;
    size_t secret_len;
} auth_client_t;

struct auth {
    auth_stores_t *stores; /* borrowed */
    bool required;
    bool sign_required;
    char *issuer;   /* NULL = not checked */
    char *audience; /* NULL = not checked */
    int64_t ttl_s, max_lifetime_s, leeway_s, window_s;
    auth_key_t *keys;
    size_t nkeys;
    const auth_key_t *mint_key; /* first HS256 key, or NULL */
    auth_client_t *clients;
    size_t nclients;
    unsigned char *signing_secret; /* NULL = signatures cannot be checked */
    size_t signing_secret_len;
    unsigned char *admin_key; /* NULL = revoke API refuses everything */
    size_t admin_key_len;
    int nonces_on_error;      /* conf_store_error_t */
    int revocations_on_error; /* conf_store_error_t */
    bool refuse_before_start; /* auth.signing.refuse_before_start */
    auth_tcache_t *tcache;    /* owned; mutable inside (locked), so const auth_t is fine */
};

/* How long a revocation must be remembered: every token valid at `now`
 * expires (with leeway) before this. */
int64_t auth_revocation_until(const auth_t *a, int64_t now);

/* ---- crypto helpers (OpenSSL) -------------------------------------------------- */

/* HMAC-SHA256 over the concatenation of n pieces. 0 ok, -1 OpenSSL error. */
int auth_hmac_sha256(const void *key, size_t klen, const void *const *parts, const size_t *lens,
                     size_t n, unsigned char out[32]) SL_WUR;
/* The same, for a key that varies per request (a token's signing key):
 * the calling thread keeps keyed contexts of recent keys, and `hint` picks
 * where to look. It must be public (say, bytes of the token's hash), never
 * derived from the key; any value gives the same MAC. */
int auth_hmac_sha256_hint(unsigned hint, const void *key, size_t klen, const void *const *parts,
                          const size_t *lens, size_t n, unsigned char out[32]) SL_WUR;
/* The same, for a key registered under key_id (auth_key_id_new, 0 = none):
 * a context keyed under the same id is reused without comparing the keys,
 * so the caller must never pass one id with two keys. */
int auth_hmac_sha256_id(unsigned hint, uint64_t key_id, const void *key, size_t klen,
                        const void *const *parts, const size_t *lens, size_t n,
                        unsigned char out[32]) SL_WUR;
/* A number never returned before in this process (never 0). */
uint64_t auth_key_id_new(void);
int auth_sha256(const void *data, size_t len, unsigned char out[32]) SL_WUR;

/* base64url without padding (RFC 7515 §2). encode: out must hold
 * 4*ceil(n/3)+1 bytes; returns the length written (NUL-terminated).
 * decode: strict — only [A-Za-z0-9_-], no padding, canonical trailing bits;
 * returns the decoded length, or -1 (also when it exceeds outcap). */
size_t auth_b64url_encode(const unsigned char *in, size_t n, char *out);
long auth_b64url_decode(const char *in, size_t n, unsigned char *out, size_t outcap);

/* ---- JWS codec ------------------------------------------------------------------- */

#define AUTH_TOKEN_MAX 8192 /* longer tokens are malformed */
#define AUTH_SIG_MAX   512  /* RSA-4096 */

typedef struct auth_jwt {
    size_t signing_input_len; /* "header.payload": the token's first bytes */
    unsigned char sig[AUTH_SIG_MAX];
    size_t sig_len;
    json_t *header;  /* owned */
    json_t *payload; /* owned */
    const char *alg; /* borrowed from header */
    const char *kid; /* borrowed from header; NULL when absent */
} auth_jwt_t;

/* Splits and decodes a compact JWS; no key, no clock. On AUTH_OK the caller
 * must auth_jwt_clear(); on failure nothing is held. */
auth_reason_t auth_jwt_parse(const char *token, size_t len, auth_jwt_t *out);
void auth_jwt_clear(auth_jwt_t *j);

/* Picks the key for a parsed token and enforces the pinned alg. */
auth_reason_t auth_jwt_key(const auth_t *a, const auth_jwt_t *j, const auth_key_t **key);
/* Verifies the signature over token[0..signing_input_len). */
auth_reason_t auth_jwt_verify_sig(const auth_key_t *k, const char *token, const auth_jwt_t *j);
/* The claim rules (exp, nbf, iat, lifetime, iss, aud, types) at `now`. */
auth_reason_t auth_jwt_check_claims(const auth_t *a, const json_t *payload, int64_t now,
                                    auth_claims_t *out);

/* The rules that depend on `now` (exp, nbf, iat, and the remaining-life
 * cap of a token without iat): re-run on every use of a cached token. */
auth_reason_t auth_claims_check_time(const auth_t *a, const auth_claims_t *c, int64_t now);

/* Builds a compact JWS from the two JSON texts, signed with k (HS256
 * secret, or an RS256/ES256 private key). malloc'd; NULL on error. */
char *auth_jwt_encode(const char *header_json, const char *payload_json, const auth_key_t *k);

/* ---- request signatures (pure) ----------------------------------------------------- */

#define AUTH_NONCE_MIN 16
#define AUTH_NONCE_MAX 64

/* Syntax checks; the reason, or AUTH_OK. */
auth_reason_t auth_sig_parse_timestamp(const char *s, size_t n, int64_t *out);
auth_reason_t auth_sig_check_nonce(const char *s, size_t n);

/* Everything but the replay check: headers present, timestamp inside
 * now +- window_s, nonce syntax, HMAC-SHA256(key, canonical) equal to the
 * signature (constant time). signing_key is the 64-char hex string;
 * key_hint as for auth_hmac_sha256_hint (public, stable per token), key_id
 * the key's as for auth_hmac_sha256_id (0 = none). */
auth_reason_t auth_sig_verify(const char signing_key[64], unsigned key_hint, uint64_t key_id,
                              const auth_request_t *req, int64_t now, int64_t window_s,
                              int64_t *ts_out);

/* The canonical string's HMAC as lowercase hex (the CLI's `sign`). */
int auth_sig_compute(const char *signing_key, size_t key_len, const char *method, size_t method_len,
                     const char *path, size_t path_len, const char *ts, size_t ts_len,
                     const char *nonce, size_t nonce_len, const unsigned char body_sha256[32],
                     char out[65]) SL_WUR;

/* The replay key of (jti, nonce): SHA-256(jti 0x00 nonce), first 16 bytes. */
#define AUTH_NONCE_KEY_LEN 16
int auth_nonce_key(const char *jti, size_t jti_len, const char *nonce, size_t nonce_len,
                   unsigned char out[AUTH_NONCE_KEY_LEN]) SL_WUR;

/* ---- in-process stores ------------------------------------------------------------- */

typedef enum auth_store_rc {
    AUTH_STORE_NEW = 0,  /* inserted: first sight */
    AUTH_STORE_SEEN = 1, /* already there and not expired */
    AUTH_STORE_FULL = -1 /* at capacity after sweeping, or OOM */
} auth_store_rc_t;

/* Atomically: present and unexpired -> SEEN, else insert -> NEW. */
auth_store_rc_t auth_nonce_insert(auth_stores_t *s, const unsigned char key[AUTH_NONCE_KEY_LEN],
                                  int64_t expires, int64_t now);

/* Test hooks of the nonce tables' moves. set_step: the work an insert
 * pays towards a move (0: none; moves then go only by test_step or
 * auth_stores_maintain). test_step: one step of `work` on a shard's move
 * (a line looked at is 1, an entry moved 8); false when none is under way.
 * test_lines: a shard's table lines, the old table's lines (0: no move)
 * and those of them not yet moved. */
void auth_nonce_test_set_step(auth_stores_t *s, long work);
bool auth_nonce_test_step(auth_stores_t *s, unsigned shard, long work, int64_t now);
size_t auth_nonce_test_lines(auth_stores_t *s, unsigned shard, size_t *old_lines, size_t *old_left);
/* test_pin on: a shard's table (the old one during a move) is pinned as
 * the tick pins a table it faults in unlocked; off: the pin ends as the
 * tick ends it (a table moved out meanwhile is freed then). */
void auth_nonce_test_pin(auth_stores_t *s, unsigned shard, bool on);

/* One lock hold of the tick's upkeep of a shard (auth_stores_maintain
 * makes up to AUTH_NONCE_TICK_HOLDS of them a shard, stopping at the first
 * false): its passed time buckets, then a bounded share of a move, or the
 * start of a shrink. true: more to do. hold_ns (NULL: not measured) gets
 * how long the shard's lock was held, in this thread's CPU ns (nonce_bench
 * --hold). */
#define AUTH_NONCE_SHARDS     16
#define AUTH_NONCE_TICK_HOLDS 256
bool auth_nonce_maintain_step(auth_stores_t *s, unsigned shard, int64_t now, int64_t *hold_ns);

typedef enum auth_rev_kind {
    AUTH_REV_JTI = 'j',
    AUTH_REV_SUB = 's',
} auth_rev_kind_t;

/* jti: revoked until `expires`. sub: tokens with iat <= revoked_at are
 * revoked (a later revocation of the same sub raises revoked_at), entry kept
 * until `expires`. 0 ok, -1 full or OOM. */
int auth_rev_add(auth_stores_t *s, auth_rev_kind_t kind, const char *id, size_t len,
                 int64_t revoked_at, int64_t expires, int64_t now);
/* true when the token (jti, sub, iat) is revoked at now. */
bool auth_rev_check(auth_stores_t *s, const auth_claims_t *c, int64_t now);

/* Sets res->reason and counts a rejection. */
void auth_finish(auth_result_t *res, auth_reason_t r);

/* ---- metrics ------------------------------------------------------------------------ */

void auth_metrics_init(void);
void auth_metric_reject(auth_reason_t r);
/* check: "nonces" | "revocations"; allowed: the fallback's outcome. */
void auth_metric_fallback(const char *check, bool allowed);

/* ---- redis (auth_redis.c) ------------------------------------------------------------ */

typedef struct auth_redis_job {
    bool check_rev;   /* look up jti/sub revocations */
    bool check_nonce; /* SET NX the nonce */
    auth_claims_t claims;
    unsigned char nonce_key[AUTH_NONCE_KEY_LEN];
    int64_t nonce_expires; /* unix s */
} auth_redis_job_t;

/* Queues the job's EVALSHA; *res holds the result so far (the token's).
 * AUTH_PENDING with *pending, or AUTH_DONE when the call could not be
 * queued (the store-error policy already applied to *res). */
auth_status_t auth_redis_check(const auth_t *a, sl_redis_t *redis, const auth_redis_job_t *job,
                               int64_t now, auth_result_t *res, auth_check_cb cb, void *arg,
                               auth_pending_t **pending);
/* Applies on_store_error to a job whose store failed: decides *res using
 * the in-process stores for the checks whose policy is allow. */
void auth_store_fallback(const auth_t *a, const auth_redis_job_t *job, int64_t now,
                         auth_result_t *res);

auth_status_t auth_redis_revoke(const auth_t *a, sl_redis_t *redis, const char *jti,
                                const char *sub, int64_t now, int64_t until, auth_reply_cb cb,
                                void *arg, auth_pending_t **pending, auth_http_reply_t *out);
/* Builds the admin 200 body. -1 on OOM. */
int auth_revoke_reply(auth_http_reply_t *out, const char *jti, const char *sub, int64_t until,
                      const char *store);
/* Builds {"error":{...}} replies. -1 on OOM. */
int auth_error_reply(auth_http_reply_t *out, int status, const char *type, const char *code,
                     const char *message);

#endif
