/*
 * auth.c — the auth module's front: building an auth_t from conf, the
 * request-path check (token, revocation, signature, replay) with its
 * in-process answer, the replies and the two endpoints (token issuance,
 * admin revocation). JWS details are in auth_jwt.c, signatures in
 * auth_sig.c, the stores in auth_store.c, the Redis variant in
 * auth_redis.c.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "auth/auth_internal.h"
#include "common/log.h"

/* ---- reasons ------------------------------------------------------------------- */

static const struct {
    const char *code;
    const char *message;
} reasons[AUTH_R__COUNT] = {
    [AUTH_OK] = {"ok", "ok"},
    [AUTH_R_TOKEN_MISSING] = {"token_missing", "an Authorization: Bearer token is required"},
    [AUTH_R_TOKEN_MALFORMED] = {"token_malformed", "the token is not a well-formed JWT"},
    [AUTH_R_TOKEN_ALG] = {"token_alg", "the token's algorithm is not the one pinned for its key"},
    [AUTH_R_TOKEN_KID] = {"token_unknown_kid", "the token names no known key"},
    [AUTH_R_TOKEN_SIGNATURE] = {"token_signature", "the token's signature does not verify"},
    [AUTH_R_TOKEN_EXPIRED] = {"token_expired", "the token has expired"},
    [AUTH_R_TOKEN_NOT_YET_VALID] = {"token_not_yet_valid", "the token is not valid yet"},
    [AUTH_R_TOKEN_LIFETIME] = {"token_lifetime", "the token's lifetime exceeds the maximum"},
    [AUTH_R_TOKEN_ISSUER] = {"token_issuer", "the token's issuer is not accepted"},
    [AUTH_R_TOKEN_AUDIENCE] = {"token_audience", "the token is not meant for this audience"},
    [AUTH_R_TOKEN_CLAIMS] = {"token_claims", "the token lacks a required claim or has a bad one"},
    [AUTH_R_TOKEN_REVOKED] = {"token_revoked", "the token has been revoked"},
    [AUTH_R_SIG_MISSING] = {"signature_missing",
                            "X-Sluice-Timestamp, X-Sluice-Nonce and X-Sluice-Signature "
                            "are required"},
    [AUTH_R_SIG_TIMESTAMP] = {"signature_timestamp",
                              "X-Sluice-Timestamp is malformed or outside the allowed window"},
    [AUTH_R_SIG_NONCE] = {"signature_nonce",
                          "X-Sluice-Nonce must be 16 to 64 characters of [A-Za-z0-9_-]"},
    [AUTH_R_SIG_MISMATCH] = {"signature_mismatch", "X-Sluice-Signature does not match the request"},
    [AUTH_R_SIG_REPLAY] = {"signature_replay", "this request was already received (replay)"},
    [AUTH_R_STORE_UNAVAILABLE] = {"store_unavailable",
                                  "authentication state is unavailable; retry later"},
    [AUTH_R_NONCE_STORE_FULL] = {"nonce_store_full",
                                 "more signed requests than this server can remember within "
                                 "the signature window; retry later"},
    [AUTH_R_SIG_BEFORE_START] = {"signature_before_start",
                                 "X-Sluice-Timestamp is not later than this server's start: sign "
                                 "the request again with the current time"},
};

const char *auth_reason_str(auth_reason_t r)
{
    return (unsigned)r < AUTH_R__COUNT ? reasons[r].code : "unknown";
}

int auth_reason_http_status(auth_reason_t r)
{
    if (r == AUTH_OK)
        return 200;
    return r == AUTH_R_STORE_UNAVAILABLE || r == AUTH_R_NONCE_STORE_FULL ? 503 : 401;
}

/* ---- metrics --------------------------------------------------------------------- */

static pthread_once_t metrics_once = PTHREAD_ONCE_INIT;
static sl_mseries_t *m_rejected[AUTH_R__COUNT];
static sl_mseries_t *m_fallback[2][2]; /* [nonces|revocations][deny|allow] */
static sl_mseries_t *m_nonces[2];      /* [live|capacity] */

static void metrics_init(void)
{
    sl_metric_t *rej =
        sl_metric_register("sluice_auth_rejected_total", "Requests refused by auth, by reason.",
                           SL_METRIC_COUNTER, "reason", NULL, 0);
    for (int r = 1; r < AUTH_R__COUNT; r++)
        m_rejected[r] = sl_metric_series1(rej, reasons[r].code);
    sl_metric_t *fb = sl_metric_register(
        "sluice_auth_store_fallback_total",
        "Nonce/revocation store errors (Redis down or late) and what on_store_error made of "
        "them.",
        SL_METRIC_COUNTER, "check,action", NULL, 0);
    static const char *checks[] = {"nonces", "revocations"}, *actions[] = {"deny", "allow"};
    for (int c = 0; c < 2; c++)
        for (int a = 0; a < 2; a++)
            m_fallback[c][a] = sl_metric_series(fb, (const char *[]){checks[c], actions[a]});
    sl_metric_t *nn = sl_metric_register(
        "sluice_auth_nonces",
        "Nonces the in-process store holds against its capacity (auth.signing.nonce_memory / "
        "128); at capacity signed requests get 503 nonce_store_full.",
        SL_METRIC_GAUGE, "state", NULL, 0);
    m_nonces[0] = sl_metric_series1(nn, "live");
    m_nonces[1] = sl_metric_series1(nn, "capacity");
}

void auth_metrics_init(void)
{
    pthread_once(&metrics_once, metrics_init);
}

void auth_metric_reject(auth_reason_t r)
{
    if (r > AUTH_OK && r < AUTH_R__COUNT && m_rejected[r])
        sl_counter_add(m_rejected[r], 1);
}

void auth_metric_fallback(const char *check, bool allowed)
{
    sl_mseries_t *s = m_fallback[strcmp(check, "nonces") == 0 ? 0 : 1][allowed ? 1 : 0];
    if (s)
        sl_counter_add(s, 1);
}

/* ---- building ----------------------------------------------------------------------- */

#define HS256_SECRET_MIN   32 /* RFC 7518 §3.2: at least the hash size */
#define SIGNING_SECRET_MIN 32
#define CLIENT_SECRET_MIN  16
#define ADMIN_KEY_MIN      16
#define LEEWAY_MAX_MS      60000

/* Reads a secret from the environment. "base64url:..." values are decoded
 * so binary secrets (like RFC 7515's example key) fit in a variable. */
static int env_secret(const char *var, size_t min, unsigned char **out, size_t *outlen,
                      const char *what, char *err, size_t errlen)
{
    const char *v = var ? getenv(var) : NULL;
    if (!var || !*var) {
        snprintf(err, errlen, "%s: no secret_env set", what);
        return -1;
    }
    if (!v || !*v) {
        snprintf(err, errlen, "%s: environment variable %s is not set", what, var);
        return -1;
    }
    static const char pfx[] = "base64url:";
    size_t n = strlen(v);
    unsigned char *buf = sl_xmalloc(n + 1);
    long m;
    if (strncmp(v, pfx, sizeof(pfx) - 1) == 0) {
        m = auth_b64url_decode(v + sizeof(pfx) - 1, n - (sizeof(pfx) - 1), buf, n);
        if (m < 0) {
            free(buf);
            snprintf(err, errlen, "%s: %s is not valid base64url after \"%s\"", what, var, pfx);
            return -1;
        }
    } else {
        memcpy(buf, v, n);
        m = (long)n;
    }
    if ((size_t)m < min) {
        OPENSSL_cleanse(buf, n);
        free(buf);
        snprintf(err, errlen, "%s: the secret in %s is %ld bytes, at least %zu are needed", what,
                 var, m, min);
        return -1;
    }
    *out = buf;
    *outlen = (size_t)m;
    return 0;
}

static void secret_free(unsigned char *p, size_t n)
{
    if (p)
        OPENSSL_cleanse(p, n);
    free(p);
}

void auth_free(auth_t *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->nkeys; i++) {
        secret_free(a->keys[i].secret, a->keys[i].secret_len);
        EVP_PKEY_free(a->keys[i].pkey);
    }
    free(a->keys);
    for (size_t i = 0; i < a->nclients; i++) {
        free(a->clients[i].id);
        secret_free(a->clients[i].secret, a->clients[i].secret_len);
    }
    free(a->clients);
    secret_free(a->signing_secret, a->signing_secret_len);
    secret_free(a->admin_key, a->admin_key_len);
    free(a->issuer);
    free(a->audience);
    auth_tcache_free(a->tcache);
    free(a);
}

static int build_keys(auth_t *a, const conf_auth_tokens_t *t, char *err, size_t errlen)
{
    a->keys = sl_xcalloc(t->nkeys ? t->nkeys : 1, sizeof(*a->keys));
    for (size_t i = 0; i < t->nkeys; i++) {
        const conf_auth_key_t *ck = &t->keys[i];
        auth_key_t *k = &a->keys[i];
        char what[128];
        snprintf(what, sizeof(what), "auth.tokens.keys[%zu] (%s)", i, ck->kid ? ck->kid : "?");
        if (!ck->kid || !*ck->kid || strlen(ck->kid) > AUTH_KID_MAX) {
            snprintf(err, errlen, "%s: kid must be 1..%d characters", what, AUTH_KID_MAX);
            return -1;
        }
        for (size_t j = 0; j < i; j++) {
            if (strcmp(a->keys[j].kid, ck->kid) == 0) {
                snprintf(err, errlen, "%s: duplicate kid", what);
                return -1;
            }
        }
        /* conf_auth_alg_t and auth_alg_t list the algorithms in one order. */
        int alg = ck->alg;
        if (alg < CONF_AUTH_HS256 || alg > CONF_AUTH_ES256) {
            snprintf(err, errlen, "%s: alg must be HS256, RS256 or ES256", what);
            return -1;
        }
        snprintf(k->kid, sizeof(k->kid), "%s", ck->kid);
        k->alg = (auth_alg_t)alg;
        a->nkeys = i + 1; /* from here auth_free() cleans this key */
        if (k->alg == AUTH_ALG_HS256) {
            if (ck->public_key) {
                snprintf(err, errlen, "%s: HS256 takes secret_env, not public_key", what);
                return -1;
            }
            if (env_secret(ck->secret_env, HS256_SECRET_MIN, &k->secret, &k->secret_len, what, err,
                           errlen) != 0)
                return -1;
            if (!a->mint_key)
                a->mint_key = k;
        } else {
            if (ck->secret_env || !ck->public_key) {
                snprintf(err, errlen, "%s: %s takes public_key (a PEM file), not secret_env", what,
                         auth_alg_name(k->alg));
                return -1;
            }
            char why[256];
            k->pkey = auth_pem_load(ck->public_key, k->alg, false, why, sizeof(why));
            if (!k->pkey) {
                snprintf(err, errlen, "%s: %s", what, why);
                return -1;
            }
        }
    }
    return 0;
}

auth_t *auth_new(const conf_auth_t *c, auth_stores_t *stores, char *err, size_t errlen)
{
    auth_metrics_init();
    auth_t *a = sl_xcalloc(1, sizeof(*a));
    a->stores = stores;
    a->required = c->required;
    a->sign_required = c->signing.required;
    a->issuer = c->tokens.issuer ? sl_xstrdup(c->tokens.issuer) : NULL;
    a->audience = c->tokens.audience ? sl_xstrdup(c->tokens.audience) : NULL;
    a->ttl_s = c->tokens.ttl_ms / 1000;
    a->max_lifetime_s = c->tokens.max_lifetime_ms / 1000;
    a->leeway_s = c->tokens.leeway_ms / 1000;
    a->window_s = c->signing.window_ms / 1000;
    a->refuse_before_start = c->signing.refuse_before_start;
    a->nonces_on_error = c->on_store_error.nonces;
    a->revocations_on_error = c->on_store_error.revocations;
    a->tcache = auth_tcache_new(AUTH_TCACHE_DEFAULT);

    if (!stores || !a->tcache) {
        snprintf(err, errlen, "auth: no stores given, or out of memory");
        goto fail;
    }
    if (c->tokens.leeway_ms < 0 || c->tokens.leeway_ms > LEEWAY_MAX_MS) {
        snprintf(err, errlen, "auth.tokens.leeway: must be 0..60s");
        goto fail;
    }
    if (a->max_lifetime_s < 1 || a->ttl_s < 1 || a->ttl_s > a->max_lifetime_s) {
        snprintf(err, errlen, "auth.tokens.ttl: must be 1s..max_lifetime (and max_lifetime >= 1s)");
        goto fail;
    }
    if (a->window_s < 1 || a->window_s > 3600) {
        snprintf(err, errlen, "auth.signing.window: must be 1s..1h");
        goto fail;
    }
    if (a->sign_required && !a->required) {
        snprintf(err, errlen, "auth.signing.required: signatures need tokens (auth.required)");
        goto fail;
    }
    if (a->required && c->tokens.nkeys == 0) {
        snprintf(err, errlen, "auth.tokens.keys: at least one key is needed when auth.required");
        goto fail;
    }
    if (build_keys(a, &c->tokens, err, errlen) != 0)
        goto fail;
    if (c->signing.secret_env || a->sign_required) {
        if (env_secret(c->signing.secret_env, SIGNING_SECRET_MIN, &a->signing_secret,
                       &a->signing_secret_len, "auth.signing.secret_env", err, errlen) != 0)
            goto fail;
    }
    a->clients = sl_xcalloc(c->nclients ? c->nclients : 1, sizeof(*a->clients));
    for (size_t i = 0; i < c->nclients; i++) {
        const conf_auth_client_t *cc = &c->clients[i];
        char what[128];
        snprintf(what, sizeof(what), "auth.clients[%zu] (%s)", i, cc->id ? cc->id : "?");
        if (!cc->id || !*cc->id) {
            snprintf(err, errlen, "%s: id is required", what);
            goto fail;
        }
        for (size_t j = 0; j < i; j++) {
            if (strcmp(a->clients[j].id, cc->id) == 0) {
                snprintf(err, errlen, "%s: duplicate id", what);
                goto fail;
            }
        }
        a->clients[i].id = sl_xstrdup(cc->id);
        a->nclients = i + 1;
        if (env_secret(cc->secret_env, CLIENT_SECRET_MIN, &a->clients[i].secret,
                       &a->clients[i].secret_len, what, err, errlen) != 0)
            goto fail;
    }
    if (c->admin_key_env && env_secret(c->admin_key_env, ADMIN_KEY_MIN, &a->admin_key,
                                       &a->admin_key_len, "auth.admin_key_env", err, errlen) != 0)
        goto fail;
    if (a->signing_secret && c->signing.nonce_memory > 0) {
        /* 0 = not from a conf file (tests build conf_auth_t by hand): the
         * store keeps the capacity it was made with. */
        size_t cap = (size_t)(c->signing.nonce_memory / AUTH_NONCE_ENTRY_BYTES);
        auth_stores_set_nonce_capacity(stores, cap);
        sl_gauge_set(m_nonces[1], (int64_t)cap);
        sl_info("auth: the nonce store holds %zu nonces (nonce_memory %lld bytes): %lld signed "
                "requests/s sustained with a %llds window",
                cap, (long long)c->signing.nonce_memory,
                (long long)auth_nonce_rate(cap, a->window_s), (long long)a->window_s);
    }
    return a;
fail:
    auth_free(a);
    return NULL;
}

int64_t auth_nonce_rate(size_t capacity, int64_t window_s)
{
    /* An honest client's nonce is kept for its window (its timestamp is
     * now) plus up to one bucket before its bucket is freed. */
    return (int64_t)capacity / (window_s + AUTH_NONCE_BUCKET_S);
}

int64_t auth_revocation_until(const auth_t *a, int64_t now)
{
    /* A token accepted at t has iat <= t + leeway and is accepted until
     * iat + max_lifetime + leeway; one issued before `now` is therefore dead
     * by now + max_lifetime + 2 * leeway. */
    return now + a->max_lifetime_s + 2 * a->leeway_s;
}

/* ---- the request path ----------------------------------------------------------------- */

/* "Bearer " at h (n >= 7), the scheme ASCII case-insensitive. Not
 * strncasecmp: glibc's AVX2 version takes a slow path near the end of a
 * page, so its cost moved with where the header sat. */
static bool bearer_scheme(const char *h)
{
    static const char lit[] = "bearer";
    for (size_t i = 0; i < 6; i++)
        if ((h[i] | 0x20) != lit[i])
            return false;
    return h[6] == ' ';
}

/* "Bearer <token>": scheme case-insensitive (RFC 7235), one or more spaces. */
static bool bearer(const char *h, size_t n, const char **tok, size_t *tok_len)
{
    if (!h || n < 7 || !bearer_scheme(h))
        return false;
    size_t i = 7;
    while (i < n && h[i] == ' ')
        i++;
    size_t j = n;
    while (j > i && (h[j - 1] == ' ' || h[j - 1] == '\t'))
        j--;
    *tok = h + i;
    *tok_len = j - i;
    return j > i;
}

void auth_finish(auth_result_t *res, auth_reason_t r)
{
    res->reason = r;
    auth_metric_reject(r);
}

/* The in-process answer to a job (its claims: claims, which job->claims
 * need not hold): revocation first (it does not consume
 * the nonce), then the nonce. A full nonce store refuses. */
static auth_reason_t local_checks(const auth_t *a, const auth_redis_job_t *job,
                                  const auth_claims_t *claims, int64_t now)
{
    if (job->check_rev && auth_rev_check(a->stores, claims, now))
        return AUTH_R_TOKEN_REVOKED;
    /* The store knows no nonce from before it started (a restart, an
     * upgrade): a request signed then may already have been used. Whole
     * seconds: one signed in the second of the start passes (a client
     * signing as the server comes up must get through; a process that
     * died in that same second leaves that one second open). */
    if (job->check_nonce && a->refuse_before_start &&
        job->nonce_expires - a->window_s < auth_stores_started(a->stores))
        return AUTH_R_SIG_BEFORE_START;
    if (job->check_nonce) {
        auth_store_rc_t rc = auth_nonce_insert(a->stores, job->nonce_key, job->nonce_expires, now);
        if (m_nonces[0]) /* a plain store of one atomic: the gauge follows the fill */
            sl_gauge_set(m_nonces[0], (int64_t)auth_stores_nonce_live(a->stores));
        if (rc == AUTH_STORE_SEEN)
            return AUTH_R_SIG_REPLAY;
        /* Full: refused whatever on_store_error says (that is about
         * Redis): letting it through unremembered would let it be replayed,
         * and a full store is what a flood of signed requests makes. */
        if (rc == AUTH_STORE_FULL)
            return AUTH_R_NONCE_STORE_FULL;
    }
    return AUTH_OK;
}

void auth_store_fallback(const auth_t *a, const auth_redis_job_t *job, int64_t now,
                         auth_result_t *res)
{
    if (job->check_rev) {
        bool allow = a->revocations_on_error == CONF_STORE_ERROR_ALLOW;
        auth_metric_fallback("revocations", allow);
        if (!allow) {
            auth_finish(res, AUTH_R_STORE_UNAVAILABLE);
            return;
        }
    }
    if (job->check_nonce) {
        bool allow = a->nonces_on_error == CONF_STORE_ERROR_ALLOW;
        auth_metric_fallback("nonces", allow);
        if (!allow) {
            auth_finish(res, AUTH_R_STORE_UNAVAILABLE);
            return;
        }
    }
    /* Both allowed: this instance's own stores still catch what they can
     * (replays sent to this instance, revocations made through it). */
    auth_reason_t r = local_checks(a, job, &job->claims, now);
    if (r != AUTH_OK)
        auth_finish(res, r);
}

auth_status_t auth_check(const auth_t *a, sl_redis_t *redis, const auth_request_t *req, int64_t now,
                         auth_result_t *res, auth_check_cb cb, void *arg, auth_pending_t **pending)
{
    /* Every field of *res is set on every path below; the claims (~500
     * bytes) are written once, by the cache or the token's parse, and are
     * zero whenever authenticated is false. The job's claims are copied
     * only for the Redis path, which outlives this call. */
    res->reason = AUTH_OK;
    res->authenticated = false;
    if (pending)
        *pending = NULL;
    auth_redis_job_t job;
    job.check_rev = false;
    job.check_nonce = false;
    job.nonce_expires = 0;

    const char *tok = NULL;
    size_t tok_len = 0;
    if (!bearer(req->authorization, req->authorization_len, &tok, &tok_len)) {
        /* A malformed Authorization header is not "absent". */
        memset(&res->claims, 0, sizeof(res->claims));
        auth_finish(res, req->authorization || a->required ? AUTH_R_TOKEN_MISSING : AUTH_OK);
        return AUTH_DONE;
    }
    /* A token seen before skips parsing and its signature check: only the
     * clock-dependent rules are re-run. */
    auth_tcache_val_t v;
    unsigned th = auth_tcache_hash(tok, tok_len);
    bool cached =
        auth_tcache_get(a->tcache, tok, tok_len, th, now, &res->claims, v.signing_key, &v.key_id);
    auth_reason_t r;
    if (cached) {
        r = auth_claims_check_time(a, &res->claims, now);
    } else {
        memset(&res->claims, 0, sizeof(res->claims));
        r = auth_token_verify(a, tok, tok_len, now, &res->claims);
        /* On the request path a token must name its user, be revocable by
         * itself (jti) and say when it was issued (revocation by sub). */
        if (r == AUTH_OK && (!res->claims.sub[0] || !res->claims.jti[0] || !res->claims.has_iat))
            r = AUTH_R_TOKEN_CLAIMS;
        if (r == AUTH_OK) {
            v.claims = res->claims;
            v.signing_key[0] = '\0';
            /* the signing key's id: its HMAC context is found by it */
            v.key_id = a->signing_secret ? auth_key_id_new() : 0;
            if (a->signing_secret &&
                auth_signing_key(a, v.claims.jti, strlen(v.claims.jti), v.signing_key) != 0)
                r = AUTH_R_SIG_MISMATCH;
            else
                auth_tcache_put(a->tcache, tok, tok_len, th, &v, res->claims.exp + a->leeway_s,
                                now);
        }
    }
    if (r != AUTH_OK) {
        memset(&res->claims, 0, sizeof(res->claims));
        auth_finish(res, r);
        return AUTH_DONE;
    }
    res->authenticated = true;
    job.check_rev = true;

    bool sig_present = req->timestamp || req->nonce || req->signature;
    if (a->signing_secret && (a->sign_required || sig_present)) {
        int64_t ts = 0;
        /* The token's hash picks where this thread keeps the key's HMAC
         * context: public, and the same for every request of the token. */
        r = auth_sig_verify(v.signing_key, th & 0xffffu, v.key_id, req, now, a->window_s, &ts);
        OPENSSL_cleanse(v.signing_key, sizeof(v.signing_key));
        if (r == AUTH_OK && auth_nonce_key(res->claims.jti, strlen(res->claims.jti), req->nonce,
                                           req->nonce_len, job.nonce_key) != 0)
            r = AUTH_R_SIG_MISMATCH;
        if (r != AUTH_OK) {
            auth_finish(res, r);
            return AUTH_DONE;
        }
        job.check_nonce = true;
        /* Replayable while now <= ts + window; remember it that long. */
        job.nonce_expires = ts + a->window_s;
    }

    if (redis && cb && pending) {
        /* Revocations made through this instance are always here too (even
         * one whose Redis write failed), and looking costs no round trip. */
        if (auth_rev_check(a->stores, &res->claims, now)) {
            auth_finish(res, AUTH_R_TOKEN_REVOKED);
            return AUTH_DONE;
        }
        job.claims = res->claims;
        if (!job.check_nonce)
            memset(job.nonce_key, 0, sizeof(job.nonce_key));
        return auth_redis_check(a, redis, &job, now, res, cb, arg, pending);
    }
    r = local_checks(a, &job, &res->claims, now);
    if (r != AUTH_OK)
        auth_finish(res, r);
    return AUTH_DONE;
}

/* ---- replies --------------------------------------------------------------------------- */

void auth_http_reply_clear(auth_http_reply_t *r)
{
    if (!r)
        return;
    free(r->body);
    memset(r, 0, sizeof(*r));
}

/* Takes a json_t (steals the reference) and makes it the reply body. */
static int reply_json(auth_http_reply_t *out, int status, json_t *j)
{
    out->status = status;
    out->body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!out->body)
        return -1;
    out->body_len = strlen(out->body);
    return 0;
}

int auth_error_reply(auth_http_reply_t *out, int status, const char *type, const char *code,
                     const char *message)
{
    memset(out, 0, sizeof(*out));
    json_t *j = json_pack("{s:{s:s,s:s,s:n,s:s}}", "error", "message", message, "type", type,
                          "param", "code", code);
    return reply_json(out, status, j);
}

int auth_reject_reply(auth_reason_t r, auth_http_reply_t *out)
{
    if ((unsigned)r >= AUTH_R__COUNT)
        r = AUTH_R_TOKEN_MALFORMED;
    int status = auth_reason_http_status(r);
    if (auth_error_reply(out, status, status == 503 ? "server_error" : "authentication_error",
                         reasons[r].code, reasons[r].message) != 0)
        return -1;
    if (status == 503)
        /* the store frees room a bucket at a time; Redis comes back soon */
        snprintf(out->headers, sizeof(out->headers), "Retry-After: %d\r\n",
                 r == AUTH_R_NONCE_STORE_FULL ? AUTH_NONCE_BUCKET_S : 1);
    if (status == 401) {
        if (r == AUTH_R_TOKEN_MISSING)
            snprintf(out->www_authenticate, sizeof(out->www_authenticate),
                     "Bearer realm=\"sluice\"");
        else
            snprintf(out->www_authenticate, sizeof(out->www_authenticate),
                     "Bearer realm=\"sluice\", error=\"%s\", error_description=\"%s\"",
                     r >= AUTH_R_SIG_MISSING ? "invalid_request" : "invalid_token",
                     reasons[r].code);
    }
    return 0;
}

/* ---- issuance ------------------------------------------------------------------------------ */

int auth_signing_key(const auth_t *a, const char *jti, size_t jti_len, char out[65])
{
    if (!a->signing_secret)
        return -1;
    unsigned char mac[32];
    const void *parts[] = {jti};
    size_t lens[] = {jti_len};
    if (auth_hmac_sha256(a->signing_secret, a->signing_secret_len, parts, lens, 1, mac) != 0)
        return -1;
    sl_hex(mac, sizeof(mac), out);
    OPENSSL_cleanse(mac, sizeof(mac));
    return 0;
}

int auth_token_mint(const auth_t *a, const char *sub, int64_t ttl_s, int64_t now, char **token,
                    char signing_key[65], char *err, size_t errlen)
{
    *token = NULL;
    signing_key[0] = '\0';
    if (!a->mint_key) {
        snprintf(err, errlen, "no HS256 key in auth.tokens.keys: sluice cannot mint tokens");
        return -1;
    }
    size_t sub_len = sub ? strlen(sub) : 0;
    if (sub_len == 0 || sub_len > AUTH_SUB_MAX) {
        snprintf(err, errlen, "sub must be 1..%d bytes", AUTH_SUB_MAX);
        return -1;
    }
    if (ttl_s == 0)
        ttl_s = a->ttl_s;
    if (ttl_s < 1 || ttl_s > a->max_lifetime_s) {
        snprintf(err, errlen, "ttl must be 1..%lld s (max_lifetime)", (long long)a->max_lifetime_s);
        return -1;
    }
    unsigned char rnd[16];
    char jti[32];
    if (RAND_bytes(rnd, sizeof(rnd)) != 1) {
        snprintf(err, errlen, "no randomness for jti");
        return -1;
    }
    auth_b64url_encode(rnd, sizeof(rnd), jti);
    json_t *h = json_pack("{s:s,s:s,s:s}", "alg", "HS256", "typ", "JWT", "kid", a->mint_key->kid);
    json_t *p = json_pack("{s:s,s:I,s:I,s:s}", "sub", sub, "iat", (json_int_t)now, "exp",
                          (json_int_t)(now + ttl_s), "jti", jti);
    if (p && a->issuer)
        json_object_set_new(p, "iss", json_string(a->issuer));
    if (p && a->audience)
        json_object_set_new(p, "aud", json_string(a->audience));
    char *hs = h ? json_dumps(h, JSON_COMPACT) : NULL;
    char *ps = p ? json_dumps(p, JSON_COMPACT) : NULL;
    json_decref(h);
    json_decref(p);
    if (hs && ps)
        *token = auth_jwt_encode(hs, ps, a->mint_key);
    free(hs);
    free(ps);
    if (!*token) {
        snprintf(err, errlen, "out of memory (or sub is not valid UTF-8)");
        return -1;
    }
    if (a->signing_secret && auth_signing_key(a, jti, strlen(jti), signing_key) != 0) {
        SL_FREE(*token);
        snprintf(err, errlen, "cannot derive the signing key");
        return -1;
    }
    return 0;
}

static const auth_client_t *client_check(const auth_t *a, const char *id, const char *secret,
                                         size_t secret_len)
{
    const auth_client_t *found = NULL;
    for (size_t i = 0; i < a->nclients; i++) {
        if (strcmp(a->clients[i].id, id) == 0)
            found = &a->clients[i];
    }
    /* Compare even for an unknown id, so timing does not tell ids apart. */
    static const unsigned char dummy[CLIENT_SECRET_MIN];
    const void *want = found ? (const void *)found->secret : (const void *)dummy;
    size_t want_len = found ? found->secret_len : sizeof(dummy);
    int eq = sl_ct_equal(want, want_len, secret, secret_len);
    return found && eq ? found : NULL;
}

int auth_token_endpoint(const auth_t *a, const char *body, size_t len, int64_t now,
                        auth_http_reply_t *out)
{
    memset(out, 0, sizeof(*out));
    json_error_t e;
    json_t *j = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &e);
    const char *id = NULL, *secret = NULL, *sub = NULL;
    json_int_t ttl = 0;
    size_t secret_len = 0;
    int rc;
    if (!j ||
        json_unpack_ex(j, &e, JSON_STRICT, "{s:s,s:s%,s:s,s?I}", "client_id", &id, "client_secret",
                       &secret, &secret_len, "sub", &sub, "ttl", &ttl) != 0) {
        json_decref(j);
        return auth_error_reply(out, 400, "invalid_request_error", "invalid_request",
                                "expected {\"client_id\",\"client_secret\",\"sub\"[,\"ttl\"]}");
    }
    if (!client_check(a, id, secret, secret_len)) {
        rc = auth_error_reply(out, 401, "authentication_error", "invalid_client",
                              "unknown client or wrong secret");
        if (rc == 0)
            snprintf(out->www_authenticate, sizeof(out->www_authenticate),
                     "Bearer realm=\"sluice\", error=\"invalid_client\"");
        json_decref(j);
        return rc;
    }
    if (ttl < 0 || ttl > a->max_lifetime_s) {
        json_decref(j);
        return auth_error_reply(out, 400, "invalid_request_error", "invalid_ttl",
                                "ttl must be 1..max_lifetime seconds");
    }
    if (!a->mint_key) {
        json_decref(j);
        return auth_error_reply(out, 503, "server_error", "no_signing_key",
                                "this gateway has no HS256 key to mint tokens with");
    }
    char *token = NULL, key[65], err[128];
    int64_t eff_ttl = ttl ? ttl : a->ttl_s;
    if (auth_token_mint(a, sub, eff_ttl, now, &token, key, err, sizeof(err)) != 0) {
        json_decref(j);
        return auth_error_reply(out, 400, "invalid_request_error", "invalid_request", err);
    }
    json_decref(j);
    json_t *r = json_pack("{s:s,s:s,s:I}", "access_token", token, "token_type", "Bearer",
                          "expires_in", (json_int_t)eff_ttl);
    if (r && key[0])
        json_object_set_new(r, "signing_key", json_string(key));
    OPENSSL_cleanse(key, sizeof(key));
    free(token);
    return reply_json(out, 200, r);
}

/* ---- revocation ------------------------------------------------------------------------------ */

int auth_revoke_jti(const auth_t *a, const char *jti, int64_t now)
{
    return auth_rev_add(a->stores, AUTH_REV_JTI, jti, strlen(jti), now,
                        auth_revocation_until(a, now), now);
}

int auth_revoke_sub(const auth_t *a, const char *sub, int64_t now)
{
    return auth_rev_add(a->stores, AUTH_REV_SUB, sub, strlen(sub), now,
                        auth_revocation_until(a, now), now);
}

int auth_revoke_reply(auth_http_reply_t *out, const char *jti, const char *sub, int64_t until,
                      const char *store)
{
    memset(out, 0, sizeof(*out));
    json_t *rv = json_object();
    if (rv && jti)
        json_object_set_new(rv, "jti", json_string(jti));
    if (rv && sub)
        json_object_set_new(rv, "sub", json_string(sub));
    json_t *j =
        rv ? json_pack("{s:o,s:I,s:s}", "revoked", rv, "until", (json_int_t)until, "store", store)
           : NULL;
    return reply_json(out, 200, j);
}

auth_status_t auth_admin_revoke(const auth_t *a, sl_redis_t *redis, const char *authorization,
                                size_t authorization_len, const char *body, size_t len, int64_t now,
                                auth_http_reply_t *out, auth_reply_cb cb, void *arg,
                                auth_pending_t **pending)
{
    memset(out, 0, sizeof(*out));
    if (pending)
        *pending = NULL;
    const char *key = NULL;
    size_t key_len = 0;
    if (!a->admin_key) {
        if (auth_error_reply(out, 403, "permission_error", "admin_disabled",
                             "auth.admin_key_env is not configured") != 0)
            out->status = 500;
        return AUTH_DONE;
    }
    if (!bearer(authorization, authorization_len, &key, &key_len) ||
        !sl_ct_equal(a->admin_key, a->admin_key_len, key, key_len)) {
        if (auth_error_reply(out, 401, "authentication_error", "invalid_admin_key",
                             "a valid admin key is required") == 0)
            snprintf(out->www_authenticate, sizeof(out->www_authenticate),
                     "Bearer realm=\"sluice-admin\"");
        else
            out->status = 500;
        return AUTH_DONE;
    }
    json_error_t e;
    json_t *j = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &e);
    const char *jti = NULL, *sub = NULL;
    if (!j || json_unpack_ex(j, &e, JSON_STRICT, "{s?s,s?s}", "jti", &jti, "sub", &sub) != 0 ||
        (!jti && !sub) || (jti && (!*jti || strlen(jti) > AUTH_JTI_MAX)) ||
        (sub && (!*sub || strlen(sub) > AUTH_SUB_MAX))) {
        json_decref(j);
        if (auth_error_reply(out, 400, "invalid_request_error", "invalid_request",
                             "expected {\"jti\":\"..\"} and/or {\"sub\":\"..\"}") != 0)
            out->status = 500;
        return AUTH_DONE;
    }
    int64_t until = auth_revocation_until(a, now);
    /* Always recorded here too: with Redis down, this instance at least
     * honours it, and checks that fall back (allow) see it. */
    if ((jti && auth_revoke_jti(a, jti, now) != 0) || (sub && auth_revoke_sub(a, sub, now) != 0)) {
        json_decref(j);
        if (auth_error_reply(out, 503, "server_error", "store_full",
                             "the revocation store is full") != 0)
            out->status = 500;
        return AUTH_DONE;
    }
    sl_info("auth: revoked%s%s%s%s until %lld", jti ? " jti=" : "", jti ? jti : "",
            sub ? " sub=" : "", sub ? sub : "", (long long)until);
    auth_status_t st = AUTH_DONE;
    if (redis && cb && pending)
        st = auth_redis_revoke(a, redis, jti, sub, now, until, cb, arg, pending, out);
    else if (auth_revoke_reply(out, jti, sub, until, "local") != 0)
        out->status = 500;
    json_decref(j);
    return st;
}
