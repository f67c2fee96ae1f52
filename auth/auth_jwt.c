/*
 * auth_jwt.c — compact JWS tokens (RFC 7515) carrying JWT claims (RFC
 * 7519): parse, pick the key by kid with its pinned alg, verify the
 * signature (OpenSSL EVP), check the claims against an injected clock, and
 * the reverse (encode + sign) for minting.
 *
 * The order of checks is fixed: structure, alg/kid, signature, then claims
 * — nothing in the payload is believed before the signature holds. The
 * header's jku/x5u/jwk/x5c are never looked at, so a token cannot point us
 * at a key of its choosing; `crit` is refused because we implement no
 * extension (RFC 7515 §4.1.11).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/ecdsa.h>
#include <openssl/evp.h>

#include "auth/auth_internal.h"

/* 9999-12-31: any NumericDate past it is nonsense, and staying far from
 * INT64_MAX keeps every exp + leeway sum defined. */
#define AUTH_DATE_MAX 253402300799LL
#define AUTH_PART_MAX 4096 /* decoded header or payload */

static auth_reason_t decode_json(const char *p, size_t n, json_t **out)
{
    unsigned char buf[AUTH_PART_MAX];
    long m = auth_b64url_decode(p, n, buf, sizeof(buf));
    if (m <= 0)
        return AUTH_R_TOKEN_MALFORMED;
    json_error_t e;
    /* Duplicate members are refused: two parsers that pick different
     * copies of "sub" or "alg" are how confusion attacks start. */
    json_t *j = json_loadb((const char *)buf, (size_t)m, JSON_REJECT_DUPLICATES, &e);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return AUTH_R_TOKEN_MALFORMED;
    }
    *out = j;
    return AUTH_OK;
}

void auth_jwt_clear(auth_jwt_t *j)
{
    if (!j)
        return;
    json_decref(j->header);
    json_decref(j->payload);
    j->header = j->payload = NULL;
    j->alg = j->kid = NULL;
}

auth_reason_t auth_jwt_parse(const char *token, size_t len, auth_jwt_t *out)
{
    memset(out, 0, sizeof(*out));
    if (len == 0)
        return AUTH_R_TOKEN_MISSING;
    if (len > AUTH_TOKEN_MAX)
        return AUTH_R_TOKEN_MALFORMED;
    const char *d1 = memchr(token, '.', len);
    if (!d1)
        return AUTH_R_TOKEN_MALFORMED;
    const char *d2 = memchr(d1 + 1, '.', len - (size_t)(d1 + 1 - token));
    if (!d2 || memchr(d2 + 1, '.', len - (size_t)(d2 + 1 - token)))
        return AUTH_R_TOKEN_MALFORMED;
    size_t hlen = (size_t)(d1 - token), plen = (size_t)(d2 - d1 - 1);
    size_t slen = len - (size_t)(d2 + 1 - token);

    auth_reason_t r = decode_json(token, hlen, &out->header);
    if (r != AUTH_OK)
        goto fail;
    json_t *alg = json_object_get(out->header, "alg");
    json_t *kid = json_object_get(out->header, "kid");
    if (!json_is_string(alg) || (kid && !json_is_string(kid)) ||
        json_object_get(out->header, "crit")) {
        r = AUTH_R_TOKEN_MALFORMED;
        goto fail;
    }
    out->alg = json_string_value(alg);
    out->kid = kid ? json_string_value(kid) : NULL;
    r = decode_json(d1 + 1, plen, &out->payload);
    if (r != AUTH_OK)
        goto fail;
    /* An empty signature parses (it is what `alg: none` carries) and fails
     * later, at the alg or the signature check, with that reason. */
    long s = slen ? auth_b64url_decode(d2 + 1, slen, out->sig, sizeof(out->sig)) : 0;
    if (s < 0) {
        r = AUTH_R_TOKEN_MALFORMED;
        goto fail;
    }
    out->sig_len = (size_t)s;
    out->signing_input_len = (size_t)(d2 - token);
    return AUTH_OK;
fail:
    auth_jwt_clear(out);
    return r;
}

auth_reason_t auth_jwt_key(const auth_t *a, const auth_jwt_t *j, const auth_key_t **key)
{
    /* "none" in any spelling is refused before anything else, so no
     * configuration can ever make an unsigned token acceptable. */
    if (strcasecmp(j->alg, "none") == 0)
        return AUTH_R_TOKEN_ALG;
    const auth_key_t *k = NULL;
    if (j->kid) {
        for (size_t i = 0; i < a->nkeys; i++) {
            if (strcmp(a->keys[i].kid, j->kid) == 0) {
                k = &a->keys[i];
                break;
            }
        }
    } else if (a->nkeys == 1) {
        k = &a->keys[0];
    }
    if (!k)
        return AUTH_R_TOKEN_KID;
    /* The key decides the algorithm; the header only has to agree. This is
     * what stops HS256-with-the-RSA-public-key-as-secret. */
    if (strcmp(j->alg, auth_alg_name(k->alg)) != 0)
        return AUTH_R_TOKEN_ALG;
    *key = k;
    return AUTH_OK;
}

/* The order n of P-256 and n / 2 (rounded down), big-endian. */
static const unsigned char p256_n[32] = {
    0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2, 0xfc, 0x63, 0x25, 0x51};
static const unsigned char p256_half_n[32] = {
    0x7f, 0xff, 0xff, 0xff, 0x80, 0x00, 0x00, 0x00, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xde, 0x73, 0x7d, 0x56, 0xd3, 0x8b, 0xcf, 0x42, 0x79, 0xdc, 0xe5, 0x61, 0x7e, 0x31, 0x92, 0xa8};

/* ECDSA signatures are malleable: if (r, s) verifies, so does (r, n - s),
 * a different token string for the same claims. Only the low half is
 * accepted (s <= n/2, as Bitcoin's BIP 62 and libsecp256k1 do), so each
 * signed token has one encoding. The signature is public: no need for a
 * constant-time compare. */
static bool es256_high_s(const unsigned char s[32])
{
    return memcmp(s, p256_half_n, 32) > 0;
}

/* JWS ES256 signatures are R || S, 32 bytes each (RFC 7518 §3.4); EVP
 * wants the DER ECDSA-Sig-Value. */
static unsigned char *es256_raw_to_der(const unsigned char *raw, int *der_len)
{
    ECDSA_SIG *sig = ECDSA_SIG_new();
    BIGNUM *r = BN_bin2bn(raw, 32, NULL), *s = BN_bin2bn(raw + 32, 32, NULL);
    unsigned char *der = NULL;
    if (!sig || !r || !s || !ECDSA_SIG_set0(sig, r, s)) {
        BN_free(r);
        BN_free(s);
        ECDSA_SIG_free(sig);
        return NULL;
    }
    *der_len = i2d_ECDSA_SIG(sig, &der);
    ECDSA_SIG_free(sig);
    return *der_len > 0 ? der : NULL;
}

auth_reason_t auth_jwt_verify_sig(const auth_key_t *k, const char *token, const auth_jwt_t *j)
{
    if (k->alg == AUTH_ALG_HS256) {
        unsigned char mac[32];
        const void *parts[] = {token};
        size_t lens[] = {j->signing_input_len};
        if (auth_hmac_sha256(k->secret, k->secret_len, parts, lens, 1, mac) != 0)
            return AUTH_R_TOKEN_SIGNATURE;
        return sl_ct_equal(mac, sizeof(mac), j->sig, j->sig_len) ? AUTH_OK : AUTH_R_TOKEN_SIGNATURE;
    }
    const unsigned char *sig = j->sig;
    size_t sig_len = j->sig_len;
    unsigned char *der = NULL;
    if (k->alg == AUTH_ALG_ES256) {
        int der_len = 0;
        if (j->sig_len != 64 || es256_high_s(j->sig + 32) ||
            !(der = es256_raw_to_der(j->sig, &der_len)))
            return AUTH_R_TOKEN_SIGNATURE;
        sig = der;
        sig_len = (size_t)der_len;
    } else if ((int)j->sig_len != EVP_PKEY_get_size(k->pkey)) {
        return AUTH_R_TOKEN_SIGNATURE;
    }
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok = ctx && EVP_DigestVerifyInit_ex(ctx, NULL, "SHA256", NULL, NULL, k->pkey, NULL) == 1 &&
             EVP_DigestVerify(ctx, sig, sig_len, (const unsigned char *)token,
                              j->signing_input_len) == 1;
    EVP_MD_CTX_free(ctx);
    OPENSSL_free(der);
    return ok ? AUTH_OK : AUTH_R_TOKEN_SIGNATURE;
}

/* NumericDate (RFC 7519 §2): a JSON number of seconds; fractions are
 * truncated. 1 present, 0 absent, -1 wrong type or out of range. */
static int numeric_date(const json_t *o, const char *name, int64_t *out)
{
    const json_t *v = json_object_get(o, name);
    if (!v)
        return 0;
    double d;
    if (json_is_integer(v))
        d = (double)json_integer_value(v);
    else if (json_is_real(v))
        d = json_real_value(v);
    else
        return -1;
    if (!isfinite(d) || d < 0 || d > (double)AUTH_DATE_MAX)
        return -1;
    *out = json_is_integer(v) ? (int64_t)json_integer_value(v) : (int64_t)d;
    return 1;
}

/* A string claim copied into buf (cap includes the NUL): 1 present,
 * 0 absent, -1 not a non-empty string that fits. */
static int string_claim(const json_t *o, const char *name, char *buf, size_t cap)
{
    const json_t *v = json_object_get(o, name);
    buf[0] = '\0';
    if (!v)
        return 0;
    if (!json_is_string(v))
        return -1;
    size_t n = json_string_length(v);
    if (n == 0 || n >= cap)
        return -1;
    memcpy(buf, json_string_value(v), n + 1);
    return 1;
}

static bool audience_ok(const json_t *aud, const char *want)
{
    if (json_is_string(aud))
        return strcmp(json_string_value(aud), want) == 0;
    if (json_is_array(aud)) {
        size_t i;
        const json_t *v;
        json_array_foreach(aud, i, v)
        {
            if (json_is_string(v) && strcmp(json_string_value(v), want) == 0)
                return true;
        }
    }
    return false;
}

auth_reason_t auth_claims_check_time(const auth_t *a, const auth_claims_t *c, int64_t now)
{
    int64_t L = a->leeway_s;
    if (now >= c->exp + L)
        return AUTH_R_TOKEN_EXPIRED;
    if ((c->has_nbf && c->nbf > now + L) || (c->has_iat && c->iat > now + L))
        return AUTH_R_TOKEN_NOT_YET_VALID;
    /* Without iat the lifetime cannot be measured from issue; bound what is
     * left of it instead, so a token can never outlive the cap from now. */
    if (!c->has_iat && c->exp - now > a->max_lifetime_s + L)
        return AUTH_R_TOKEN_LIFETIME;
    return AUTH_OK;
}

auth_reason_t auth_jwt_check_claims(const auth_t *a, const json_t *p, int64_t now,
                                    auth_claims_t *out)
{
    auth_claims_t c;
    memset(&c, 0, sizeof(c));
    int64_t exp = 0, nbf = 0, iat = 0;
    int has_exp = numeric_date(p, "exp", &exp);
    int has_nbf = numeric_date(p, "nbf", &nbf);
    int has_iat = numeric_date(p, "iat", &iat);
    if (has_exp != 1 || has_nbf < 0 || has_iat < 0)
        return AUTH_R_TOKEN_CLAIMS;
    if (string_claim(p, "sub", c.sub, sizeof(c.sub)) < 0 ||
        string_claim(p, "jti", c.jti, sizeof(c.jti)) < 0)
        return AUTH_R_TOKEN_CLAIMS;
    const json_t *iss = json_object_get(p, "iss");
    if (iss && !json_is_string(iss))
        return AUTH_R_TOKEN_CLAIMS;
    if (a->issuer && (!iss || strcmp(json_string_value(iss), a->issuer) != 0))
        return AUTH_R_TOKEN_ISSUER;
    if (a->audience && !audience_ok(json_object_get(p, "aud"), a->audience))
        return AUTH_R_TOKEN_AUDIENCE;

    c.exp = exp;
    c.iat = iat;
    c.nbf = nbf;
    c.has_iat = has_iat == 1;
    c.has_nbf = has_nbf == 1;
    auth_reason_t r = auth_claims_check_time(a, &c, now);
    if (r != AUTH_OK)
        return r;
    if (c.has_iat && exp - iat > a->max_lifetime_s)
        return AUTH_R_TOKEN_LIFETIME;

    if (out)
        *out = c;
    return AUTH_OK;
}

auth_reason_t auth_token_verify(const auth_t *a, const char *token, size_t len, int64_t now,
                                auth_claims_t *out)
{
    auth_jwt_t j;
    auth_reason_t r = auth_jwt_parse(token, len, &j);
    if (r != AUTH_OK)
        return r;
    const auth_key_t *k = NULL;
    r = auth_jwt_key(a, &j, &k);
    if (r == AUTH_OK)
        r = auth_jwt_verify_sig(k, token, &j);
    if (r == AUTH_OK)
        r = auth_jwt_check_claims(a, j.payload, now, out);
    if (r == AUTH_OK && out)
        snprintf(out->kid, sizeof(out->kid), "%s", k->kid);
    auth_jwt_clear(&j);
    return r;
}

static int sign_pkey(const auth_key_t *k, const unsigned char *in, size_t n, unsigned char *sig,
                     size_t *sig_len)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    size_t dlen = 0;
    unsigned char *der = NULL;
    int rc = -1;
    if (!ctx || EVP_DigestSignInit_ex(ctx, NULL, "SHA256", NULL, NULL, k->pkey, NULL) != 1 ||
        EVP_DigestSign(ctx, NULL, &dlen, in, n) != 1 || !(der = OPENSSL_malloc(dlen)) ||
        EVP_DigestSign(ctx, der, &dlen, in, n) != 1)
        goto out;
    if (k->alg == AUTH_ALG_RS256) {
        if (dlen > AUTH_SIG_MAX)
            goto out;
        memcpy(sig, der, dlen);
        *sig_len = dlen;
        rc = 0;
    } else {
        const unsigned char *p = der;
        ECDSA_SIG *es = d2i_ECDSA_SIG(NULL, &p, (long)dlen);
        const BIGNUM *r = NULL, *s = NULL;
        BIGNUM *order = BN_bin2bn(p256_n, 32, NULL), *low = BN_new();
        if (es && order && low) {
            ECDSA_SIG_get0(es, &r, &s);
            if (BN_bn2binpad(r, sig, 32) == 32 && BN_bn2binpad(s, sig + 32, 32) == 32) {
                *sig_len = 64;
                rc = 0;
            }
            /* half of what OpenSSL makes has a high s: give n - s, the
             * encoding verifiers accept (es256_high_s) */
            if (rc == 0 && es256_high_s(sig + 32) &&
                (BN_sub(low, order, s) != 1 || BN_bn2binpad(low, sig + 32, 32) != 32))
                rc = -1;
        }
        BN_free(order);
        BN_free(low);
        ECDSA_SIG_free(es);
    }
out:
    OPENSSL_free(der);
    EVP_MD_CTX_free(ctx);
    return rc;
}

char *auth_jwt_encode(const char *header_json, const char *payload_json, const auth_key_t *k)
{
    size_t hn = strlen(header_json), pn = strlen(payload_json);
    size_t cap = (hn + pn + AUTH_SIG_MAX) / 3 * 4 + 32; /* three parts, padding, NUL */
    char *out = malloc(cap);
    if (!out)
        return NULL;
    size_t n = auth_b64url_encode((const unsigned char *)header_json, hn, out);
    out[n++] = '.';
    n += auth_b64url_encode((const unsigned char *)payload_json, pn, out + n);
    unsigned char sig[AUTH_SIG_MAX];
    size_t sig_len = 0;
    if (k->alg == AUTH_ALG_HS256) {
        const void *parts[] = {out};
        size_t lens[] = {n};
        if (auth_hmac_sha256(k->secret, k->secret_len, parts, lens, 1, sig) != 0)
            goto fail;
        sig_len = 32;
    } else if (!k->pkey || sign_pkey(k, (const unsigned char *)out, n, sig, &sig_len) != 0) {
        goto fail;
    }
    out[n++] = '.';
    auth_b64url_encode(sig, sig_len, out + n);
    return out;
fail:
    free(out);
    return NULL;
}
