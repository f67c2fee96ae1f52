/*
 * auth_sig.c — request signatures, the pure part: header syntax, the
 * timestamp window and the HMAC over the canonical request
 *
 *   METHOD \n PATH_WITH_QUERY \n TIMESTAMP \n NONCE \n hex(SHA-256(body))
 *
 * keyed with the token's signing key (the 64 hex characters as ASCII bytes,
 * exactly as the app received them). The replay check that follows a good
 * signature is in auth.c (in-process) and auth_redis.c (SET NX).
 */
#include <string.h>

#include "auth/auth_internal.h"

/* 12 digits reach the year 33658; more is an attempt to overflow. */
#define TS_DIGITS_MAX 12

auth_reason_t auth_sig_parse_timestamp(const char *s, size_t n, int64_t *out)
{
    if (!s || n == 0 || n > TS_DIGITS_MAX)
        return AUTH_R_SIG_TIMESTAMP;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return AUTH_R_SIG_TIMESTAMP;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return AUTH_OK;
}

/* [A-Za-z0-9_-]: one load a character instead of five range tests. */
static const bool sig_nonce_char[256] = {
    ['-'] = true, ['_'] = true,
#define SIG_R(a)  [a] = true, [a + 1] = true, [a + 2] = true, [a + 3] = true, [a + 4] = true
#define SIG_R5(a) SIG_R(a), SIG_R(a + 5)
    SIG_R5('0'),  SIG_R5('A'),  SIG_R5('K'), SIG_R('U'),   ['Z'] = true,
    SIG_R5('a'),  SIG_R5('k'),  SIG_R('u'),  ['z'] = true,
#undef SIG_R5
#undef SIG_R
};

auth_reason_t auth_sig_check_nonce(const char *s, size_t n)
{
    if (!s || n < AUTH_NONCE_MIN || n > AUTH_NONCE_MAX)
        return AUTH_R_SIG_NONCE;
    bool ok = true;
    for (size_t i = 0; i < n; i++)
        ok &= sig_nonce_char[(unsigned char)s[i]];
    return ok ? AUTH_OK : AUTH_R_SIG_NONCE;
}

/* The canonical string of a usual request fits here; it is then fed to the
 * MAC in one update (each update costs two layers of EVP dispatch). A
 * longer one (a long query string) is fed piece by piece. */
#define SIG_CANON_MAX 1024

static int sig_mac(unsigned hint, uint64_t key_id, const char *signing_key, size_t key_len,
                   const char *method, size_t method_len, const char *path, size_t path_len,
                   const char *ts, size_t ts_len, const char *nonce, size_t nonce_len,
                   const unsigned char body_sha256[32], unsigned char mac[32])
{
    size_t total = method_len + path_len + ts_len + nonce_len + 4 + 64;
    if (total > SIG_CANON_MAX) {
        char body_hex[65];
        sl_hex(body_sha256, 32, body_hex);
        const void *parts[] = {method, "\n", path, "\n", ts, "\n", nonce, "\n", body_hex};
        const size_t lens[] = {method_len, 1, path_len, 1, ts_len, 1, nonce_len, 1, 64};
        return auth_hmac_sha256_id(hint, key_id, signing_key, key_len, parts, lens,
                                   SL_ARRAY_LEN(parts), mac);
    }
    /* built in place, the body's hash written as hex straight into it */
    char canon[SIG_CANON_MAX + 1];
    char *p = canon;
    p = mempcpy(p, method, method_len);
    *p++ = '\n';
    p = mempcpy(p, path, path_len);
    *p++ = '\n';
    p = mempcpy(p, ts, ts_len);
    *p++ = '\n';
    p = mempcpy(p, nonce, nonce_len);
    *p++ = '\n';
    sl_hex(body_sha256, 32, p); /* 64 characters and a NUL, which the +1 holds */
    const void *one[] = {canon};
    return auth_hmac_sha256_id(hint, key_id, signing_key, key_len, one, &total, 1, mac);
}

int auth_sig_compute(const char *signing_key, size_t key_len, const char *method, size_t method_len,
                     const char *path, size_t path_len, const char *ts, size_t ts_len,
                     const char *nonce, size_t nonce_len, const unsigned char body_sha256[32],
                     char out[65])
{
    unsigned char mac[32];
    if (sig_mac(0, 0, signing_key, key_len, method, method_len, path, path_len, ts, ts_len, nonce,
                nonce_len, body_sha256, mac) != 0)
        return -1;
    sl_hex(mac, sizeof(mac), out);
    return 0;
}

auth_reason_t auth_sig_verify(const char signing_key[64], unsigned key_hint, uint64_t key_id,
                              const auth_request_t *req, int64_t now, int64_t window_s,
                              int64_t *ts_out)
{
    if (!req->timestamp || !req->nonce || !req->signature)
        return AUTH_R_SIG_MISSING;
    int64_t ts = 0;
    auth_reason_t r = auth_sig_parse_timestamp(req->timestamp, req->timestamp_len, &ts);
    if (r != AUTH_OK)
        return r;
    if (ts < now - window_s || ts > now + window_s)
        return AUTH_R_SIG_TIMESTAMP;
    r = auth_sig_check_nonce(req->nonce, req->nonce_len);
    if (r != AUTH_OK)
        return r;
    unsigned char body_sha[32];
    const unsigned char *bs = req->body_sha256;
    if (!bs) {
        if (auth_sha256(req->body ? req->body : "", req->body ? req->body_len : 0, body_sha) != 0)
            return AUTH_R_SIG_MISMATCH;
        bs = body_sha;
    }
    unsigned char mac[32];
    char want[65];
    if (sig_mac(key_hint, key_id, signing_key, 64, req->method ? req->method : "",
                req->method ? req->method_len : 0, req->path ? req->path : "",
                req->path ? req->path_len : 0, req->timestamp, req->timestamp_len, req->nonce,
                req->nonce_len, bs, mac) != 0)
        return AUTH_R_SIG_MISMATCH;
    sl_hex(mac, sizeof(mac), want);
    if (!sl_ct_equal(want, 64, req->signature, req->signature_len))
        return AUTH_R_SIG_MISMATCH;
    if (ts_out)
        *ts_out = ts;
    return AUTH_OK;
}

int auth_nonce_key(const char *jti, size_t jti_len, const char *nonce, size_t nonce_len,
                   unsigned char out[AUTH_NONCE_KEY_LEN])
{
    unsigned char buf[AUTH_JTI_MAX + 1 + AUTH_NONCE_MAX];
    unsigned char d[32];
    if (jti_len > AUTH_JTI_MAX || nonce_len > AUTH_NONCE_MAX)
        return -1;
    memcpy(buf, jti, jti_len);
    buf[jti_len] = 0;
    memcpy(buf + jti_len + 1, nonce, nonce_len);
    if (auth_sha256(buf, jti_len + 1 + nonce_len, d) != 0)
        return -1;
    memcpy(out, d, AUTH_NONCE_KEY_LEN);
    return 0;
}
