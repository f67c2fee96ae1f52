/* Unit tests of token verification: every negative of issue 3's list
 * (alg none, key confusion, stripped/foreign signatures, bad base64, time
 * claims at their edges, iss/aud, kid, duplicates), RFC 7515 A.1 under an
 * injected clock, and ES256/RS256 with keys generated here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <openssl/ec.h>
#include <openssl/ecdsa.h>

#include "test_auth_util.h"

#define HDR_K1 "{\"alg\":\"HS256\",\"typ\":\"JWT\",\"kid\":\"k1\"}"

typedef struct fx {
    tconf_t t;
    auth_stores_t *st;
    auth_t *a;
    EVP_PKEY *ec, *rsa; /* trusted keys (conf holds their public halves) */
    EVP_PKEY *ec_other; /* an attacker's key */
    char *ec_path, *rsa_path;
} fx_t;

static fx_t F;

static int group_setup(void **state)
{
    (void)state;
    F.ec = t_keygen("EC");
    F.rsa = t_keygen("RSA");
    F.ec_other = t_keygen("EC");
    F.ec_path = t_write_pub(F.ec);
    F.rsa_path = t_write_pub(F.rsa);
    tconf_default(&F.t);
    F.t.keys[1] = (conf_auth_key_t){.kid = "e1", .alg = CONF_AUTH_ES256, .public_key = F.ec_path};
    F.t.keys[2] = (conf_auth_key_t){.kid = "r1", .alg = CONF_AUTH_RS256, .public_key = F.rsa_path};
    F.t.c.tokens.nkeys = 3;
    F.st = auth_stores_new(0, 0);
    F.a = t_auth(&F.t, F.st);
    return F.a ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    auth_free(F.a);
    auth_stores_free(F.st);
    EVP_PKEY_free(F.ec);
    EVP_PKEY_free(F.rsa);
    EVP_PKEY_free(F.ec_other);
    unlink(F.ec_path);
    unlink(F.rsa_path);
    free(F.ec_path);
    free(F.rsa_path);
    return 0;
}

static auth_reason_t verify(const char *tok, int64_t now)
{
    return auth_token_verify(F.a, tok, strlen(tok), now, NULL);
}

/* Verifies an HS256/k1 token with these claims at T_NOW. */
static auth_reason_t verify_claims(const char *payload)
{
    char *tok = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET), HDR_K1, payload);
    assert_non_null(tok);
    auth_reason_t r = verify(tok, T_NOW);
    free(tok);
    return r;
}

static void test_good_hs256(void **state)
{
    (void)state;
    char *tok = t_good_token("alice", "j-1");
    auth_claims_t c;
    assert_int_equal(auth_token_verify(F.a, tok, strlen(tok), T_NOW, &c), AUTH_OK);
    assert_string_equal(c.sub, "alice");
    assert_string_equal(c.jti, "j-1");
    assert_string_equal(c.kid, "k1");
    assert_int_equal(c.exp, T_NOW + 900);
    assert_true(c.has_iat);
    assert_int_equal(c.iat, T_NOW);
    free(tok);
}

/* The Authorization scheme: "Bearer" in any case (RFC 7235), then one or
 * more spaces; anything else is no bearer token at all. */
static void test_bearer_scheme(void **state)
{
    (void)state;
    char *tok = t_good_token("alice", "j-scheme");
    /* the fixture requires signatures: a token taken asks for them next */
#define ACCEPTED AUTH_R_SIG_MISSING
    static const struct {
        const char *scheme;
        auth_reason_t want;
    } cases[] = {
        {"Bearer ", ACCEPTED},
        {"bearer ", ACCEPTED},
        {"BEARER ", ACCEPTED},
        {"bEaReR   ", ACCEPTED},
        {"Bearer\t", AUTH_R_TOKEN_MISSING},
        {"Bearer", AUTH_R_TOKEN_MISSING},
        {"Bearez ", AUTH_R_TOKEN_MISSING},
        {"Beare ", AUTH_R_TOKEN_MISSING},
        {"Bearer_", AUTH_R_TOKEN_MISSING},
        {"Basic ", AUTH_R_TOKEN_MISSING},
        {"Bearer\x80", AUTH_R_TOKEN_MISSING},
        {"B\x82"
         "arer ",
         AUTH_R_TOKEN_MISSING},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        treq_t q;
        memset(&q, 0, sizeof(q));
        snprintf(q.authz, sizeof(q.authz), "%s%s", cases[i].scheme, tok);
        auth_request_t r = {.authorization = q.authz, .authorization_len = strlen(q.authz)};
        auth_reason_t got = t_check(F.a, &r, T_NOW);
        if (got != cases[i].want)
            fail_msg("scheme \"%s\": %d, want %d", cases[i].scheme, got, cases[i].want);
    }
    free(tok);
#undef ACCEPTED
}

static void test_rfc7515_a1(void **state)
{
    (void)state;
    static const char tok[] =
        "eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9"
        ".eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0"
        "cnVlfQ"
        ".dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
    setenv("T_A1_KEY",
           "base64url:AyM1SysPpbyDfgZld3umj1qzKObwVMkoqQ-EstJQLr_T-1qS0gZH75aKtMN3Yj0iPS4hcgUuTwj"
           "AzZr1Z9CAow",
           1);
    tconf_t t;
    tconf_default(&t);
    /* A.1 has no kid, no iss we name, no aud: one key, no iss/aud checks. */
    t.keys[0] = (conf_auth_key_t){.kid = "a1", .alg = CONF_AUTH_HS256, .secret_env = "T_A1_KEY"};
    t.c.tokens.issuer = t.c.tokens.audience = NULL;
    auth_t *a = t_auth(&t, F.st);
    assert_non_null(a);
    auth_claims_t c;
    assert_int_equal(auth_token_verify(a, tok, strlen(tok), 1300819300, &c), AUTH_OK);
    assert_int_equal(c.exp, 1300819380);
    assert_false(c.has_iat);
    assert_int_equal(auth_token_verify(a, tok, strlen(tok), sl_wall_s(), NULL),
                     AUTH_R_TOKEN_EXPIRED);
    /* The same bytes with one signature character changed. */
    char bad[sizeof(tok)];
    memcpy(bad, tok, sizeof(tok));
    bad[sizeof(tok) - 2] = bad[sizeof(tok) - 2] == 'k' ? 'j' : 'k';
    assert_int_not_equal(auth_token_verify(a, bad, strlen(bad), 1300819300, NULL), AUTH_OK);
    /* The request path additionally wants sub, jti and iat. */
    treq_t q;
    memset(&q, 0, sizeof(q));
    snprintf(q.authz, sizeof(q.authz), "Bearer %s", tok);
    auth_request_t r = {.authorization = q.authz, .authorization_len = strlen(q.authz)};
    assert_int_equal(t_check(a, &r, 1300819300), AUTH_R_TOKEN_CLAIMS);
    auth_free(a);
}

static void test_alg_none(void **state)
{
    (void)state;
    static const char *algs[] = {"none", "None", "NONE", "nOnE"};
    char *pay = t_claims("alice", "j", T_NOW, T_NOW + 60);
    for (size_t i = 0; i < SL_ARRAY_LEN(algs); i++) {
        char hdr[128];
        snprintf(hdr, sizeof(hdr), "{\"alg\":\"%s\",\"kid\":\"k1\"}", algs[i]);
        /* Unsigned, as an attacker sends it ... */
        char *tok = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET), hdr, pay);
        *(strrchr(tok, '.') + 1) = '\0';
        assert_int_equal(verify(tok, T_NOW), AUTH_R_TOKEN_ALG);
        free(tok);
        /* ... and even with a valid HMAC attached, and without a kid. */
        tok = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET), hdr, pay);
        assert_int_equal(verify(tok, T_NOW), AUTH_R_TOKEN_ALG);
        free(tok);
        snprintf(hdr, sizeof(hdr), "{\"alg\":\"%s\"}", algs[i]);
        tok = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET), hdr, pay);
        assert_int_equal(verify(tok, T_NOW), AUTH_R_TOKEN_ALG);
        free(tok);
    }
    free(pay);
}

static void test_hs256_with_rsa_public_key(void **state)
{
    (void)state;
    size_t n = 0;
    char *pem = t_pub_pem(F.rsa, &n);
    char *pay = t_claims("mallory", "j", T_NOW, T_NOW + 60);
    char *tok = t_token_hs(pem, n, "{\"alg\":\"HS256\",\"kid\":\"r1\"}", pay);
    assert_int_equal(verify(tok, T_NOW), AUTH_R_TOKEN_ALG);
    free(tok);
    /* The same trick against the EC key. */
    char *ecpem = t_pub_pem(F.ec, &n);
    tok = t_token_hs(ecpem, n, "{\"alg\":\"HS256\",\"kid\":\"e1\"}", pay);
    assert_int_equal(verify(tok, T_NOW), AUTH_R_TOKEN_ALG);
    free(tok);
    /* And RS256 named on the EC key (alg swap between asymmetric keys). */
    tok = t_token_pk(AUTH_ALG_RS256, F.rsa, "{\"alg\":\"RS256\",\"kid\":\"e1\"}", pay);
    assert_int_equal(verify(tok, T_NOW), AUTH_R_TOKEN_ALG);
    free(tok);
    free(ecpem);
    free(pem);
    free(pay);
}

static void test_stripped_and_truncated_signature(void **state)
{
    (void)state;
    char *tok = t_good_token("alice", "j");
    size_t n = strlen(tok);
    char *dot = strrchr(tok, '.');
    char *cp = strdup(tok);
    /* Stripped: "h.p." */
    cp[dot - tok + 1] = '\0';
    assert_int_equal(verify(cp, T_NOW), AUTH_R_TOKEN_SIGNATURE);
    /* No third part at all: "h.p" */
    cp[dot - tok] = '\0';
    assert_int_equal(verify(cp, T_NOW), AUTH_R_TOKEN_MALFORMED);
    /* Truncated by 3 and 4 characters (still valid base64url). */
    memcpy(cp, tok, n + 1);
    cp[n - 3] = '\0';
    assert_int_equal(verify(cp, T_NOW), AUTH_R_TOKEN_SIGNATURE);
    /* By 1 or 4 (odd bits left over: malformed, or a short signature). */
    memcpy(cp, tok, n + 1);
    cp[n - 4] = '\0';
    assert_int_not_equal(verify(cp, T_NOW), AUTH_OK);
    memcpy(cp, tok, n + 1);
    cp[n - 1] = '\0';
    assert_int_not_equal(verify(cp, T_NOW), AUTH_OK);
    /* Extended: a signature one byte too long. */
    char *ext = malloc(n + 8);
    snprintf(ext, n + 8, "%sAAAA", tok);
    assert_int_equal(verify(ext, T_NOW), AUTH_R_TOKEN_SIGNATURE);
    free(ext);
    free(cp);
    free(tok);
}

static void test_signature_from_another_key(void **state)
{
    (void)state;
    char *pay = t_claims("alice", "j", T_NOW, T_NOW + 60);
    static const char other[] = "another-secret-of-sufficient-length-000";
    char *tok = t_token_hs(other, strlen(other), HDR_K1, pay);
    assert_int_equal(verify(tok, T_NOW), AUTH_R_TOKEN_SIGNATURE);
    free(tok);
    tok = t_token_pk(AUTH_ALG_ES256, F.ec_other, "{\"alg\":\"ES256\",\"kid\":\"e1\"}", pay);
    assert_int_equal(verify(tok, T_NOW), AUTH_R_TOKEN_SIGNATURE);
    free(tok);
    /* A jwk header carrying the attacker's key is never used. */
    tok = t_token_pk(AUTH_ALG_ES256, F.ec_other,
                     "{\"alg\":\"ES256\",\"kid\":\"e1\",\"jku\":\"https://evil/\","
                     "\"jwk\":{\"kty\":\"EC\"}}",
                     pay);
    assert_int_equal(verify(tok, T_NOW), AUTH_R_TOKEN_SIGNATURE);
    free(tok);
    EVP_PKEY *rsa2 = t_keygen("RSA");
    tok = t_token_pk(AUTH_ALG_RS256, rsa2, "{\"alg\":\"RS256\",\"kid\":\"r1\"}", pay);
    assert_int_equal(verify(tok, T_NOW), AUTH_R_TOKEN_SIGNATURE);
    free(tok);
    EVP_PKEY_free(rsa2);
    /* The payload swapped under a valid signature. */
    char *good = t_good_token("alice", "j");
    char *evil_pay = t_claims("admin", "j", T_NOW, T_NOW + 60);
    char *evil = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET), HDR_K1, evil_pay);
    char spliced[2048];
    int hp = (int)(strrchr(evil, '.') - evil);
    snprintf(spliced, sizeof(spliced), "%.*s%s", hp, evil, strrchr(good, '.'));
    assert_int_equal(verify(spliced, T_NOW), AUTH_R_TOKEN_SIGNATURE);
    free(good);
    free(evil);
    free(evil_pay);
    free(pay);
}

static void test_bad_base64(void **state)
{
    (void)state;
    char *tok = t_good_token("alice", "j");
    char *dot = strchr(tok, '.');
    char buf[2048];
    /* Standard-alphabet characters, padding, whitespace, invalid bytes. */
    static const char *inserts[] = {"+", "/", "=", " ", "*", "\x80"};
    for (size_t i = 0; i < SL_ARRAY_LEN(inserts); i++) {
        snprintf(buf, sizeof(buf), "%.*s%s%s", (int)(dot - tok - 1), tok, inserts[i], dot - 1);
        /* The header's second to last character replaced. */
        assert_int_equal(verify(buf, T_NOW), AUTH_R_TOKEN_MALFORMED);
    }
    /* A header that decodes but is not JSON, and JSON that is not an object. */
    char *t2 = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET), "not json", "{}");
    assert_int_equal(verify(t2, T_NOW), AUTH_R_TOKEN_MALFORMED);
    free(t2);
    t2 = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET), HDR_K1, "[1,2]");
    assert_int_equal(verify(t2, T_NOW), AUTH_R_TOKEN_MALFORMED);
    free(t2);
    t2 = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET), "[\"alg\",\"HS256\"]", "{}");
    assert_int_equal(verify(t2, T_NOW), AUTH_R_TOKEN_MALFORMED);
    free(t2);
    /* Four parts, an empty header, nothing at all, far too long. */
    snprintf(buf, sizeof(buf), "%s.AAAA", tok);
    assert_int_equal(verify(buf, T_NOW), AUTH_R_TOKEN_MALFORMED);
    assert_int_equal(verify(dot, T_NOW), AUTH_R_TOKEN_MALFORMED);
    assert_int_equal(verify("", T_NOW), AUTH_R_TOKEN_MISSING);
    char *huge = malloc(AUTH_TOKEN_MAX + 2);
    memset(huge, 'A', AUTH_TOKEN_MAX + 1);
    huge[AUTH_TOKEN_MAX + 1] = '\0';
    assert_int_equal(verify(huge, T_NOW), AUTH_R_TOKEN_MALFORMED);
    free(huge);
    free(tok);
}

static void test_b64url_strict(void **state)
{
    (void)state;
    unsigned char out[16];
    assert_int_equal(auth_b64url_decode("QUJD", 4, out, sizeof(out)), 3);
    assert_memory_equal(out, "ABC", 3);
    assert_int_equal(auth_b64url_decode("QQ", 2, out, sizeof(out)), 1);
    assert_int_equal(out[0], 'A');
    assert_int_equal(auth_b64url_decode("QR", 2, out, sizeof(out)), -1); /* stray bits */
    assert_int_equal(auth_b64url_decode("QQ==", 4, out, sizeof(out)), -1);
    assert_int_equal(auth_b64url_decode("Q", 1, out, sizeof(out)), -1);
    assert_int_equal(auth_b64url_decode("_-8", 3, out, sizeof(out)), 2);
    assert_int_equal(out[0], 0xff);
    assert_int_equal(out[1], 0xef);
    assert_int_equal(auth_b64url_decode("QUJD", 4, out, 2), -1); /* too big */
    assert_int_equal(auth_b64url_decode("", 0, out, sizeof(out)), 0);
    char enc[8];
    assert_int_equal(auth_b64url_encode((const unsigned char *)"\xff\xef", 2, enc), 3);
    assert_string_equal(enc, "_-8");
}

static void test_time_claims(void **state)
{
    (void)state;
    char p[512];
    /* exp: the leeway is 30 s; expired from exp + 30 on. */
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\",\"aud\":\"chat\",\"iat\":%lld,\"exp\":%lld}",
             T_NOW - 600, T_NOW - 29);
    assert_int_equal(verify_claims(p), AUTH_OK);
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\",\"aud\":\"chat\",\"iat\":%lld,\"exp\":%lld}",
             T_NOW - 600, T_NOW - 30);
    assert_int_equal(verify_claims(p), AUTH_R_TOKEN_EXPIRED);
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\",\"aud\":\"chat\",\"iat\":%lld,\"exp\":%lld}",
             T_NOW - 3000, T_NOW - 2000);
    assert_int_equal(verify_claims(p), AUTH_R_TOKEN_EXPIRED);
    /* nbf in the future: allowed up to the leeway. */
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\",\"aud\":\"chat\",\"nbf\":%lld,\"exp\":%lld}",
             T_NOW + 30, T_NOW + 600);
    assert_int_equal(verify_claims(p), AUTH_OK);
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\",\"aud\":\"chat\",\"nbf\":%lld,\"exp\":%lld}",
             T_NOW + 31, T_NOW + 600);
    assert_int_equal(verify_claims(p), AUTH_R_TOKEN_NOT_YET_VALID);
    /* iat in the future, the same way. */
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\",\"aud\":\"chat\",\"iat\":%lld,\"exp\":%lld}",
             T_NOW + 31, T_NOW + 600);
    assert_int_equal(verify_claims(p), AUTH_R_TOKEN_NOT_YET_VALID);
    /* Lifetime: exp - iat at most 1 h. */
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\",\"aud\":\"chat\",\"iat\":%lld,\"exp\":%lld}", T_NOW,
             T_NOW + 3600);
    assert_int_equal(verify_claims(p), AUTH_OK);
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\",\"aud\":\"chat\",\"iat\":%lld,\"exp\":%lld}", T_NOW,
             T_NOW + 3601);
    assert_int_equal(verify_claims(p), AUTH_R_TOKEN_LIFETIME);
    /* Without iat: what is left of it is capped instead. */
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\",\"aud\":\"chat\",\"exp\":%lld}", T_NOW + 3600 + 31);
    assert_int_equal(verify_claims(p), AUTH_R_TOKEN_LIFETIME);
    /* Fractional dates are truncated; strings are not dates. */
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\",\"aud\":\"chat\",\"iat\":%lld.5,\"exp\":%lld.9}",
             T_NOW, T_NOW + 60);
    assert_int_equal(verify_claims(p), AUTH_OK);
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\",\"aud\":\"chat\",\"exp\":\"%lld\"}", T_NOW + 60);
    assert_int_equal(verify_claims(p), AUTH_R_TOKEN_CLAIMS);
    assert_int_equal(verify_claims("{\"iss\":\"sluice\",\"aud\":\"chat\",\"exp\":-1}"),
                     AUTH_R_TOKEN_CLAIMS);
    assert_int_equal(verify_claims("{\"iss\":\"sluice\",\"aud\":\"chat\",\"exp\":1e300}"),
                     AUTH_R_TOKEN_CLAIMS);
    /* exp is required. */
    assert_int_equal(verify_claims("{\"iss\":\"sluice\",\"aud\":\"chat\",\"sub\":\"a\"}"),
                     AUTH_R_TOKEN_CLAIMS);
}

static void test_iss_aud(void **state)
{
    (void)state;
    char p[512];
#define EXP "\"exp\":1700000600"
    snprintf(p, sizeof(p), "{\"iss\":\"evil\",\"aud\":\"chat\"," EXP "}");
    assert_int_equal(verify_claims(p), AUTH_R_TOKEN_ISSUER);
    snprintf(p, sizeof(p), "{\"aud\":\"chat\"," EXP "}");
    assert_int_equal(verify_claims(p), AUTH_R_TOKEN_ISSUER);
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\",\"aud\":\"other\"," EXP "}");
    assert_int_equal(verify_claims(p), AUTH_R_TOKEN_AUDIENCE);
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\"," EXP "}");
    assert_int_equal(verify_claims(p), AUTH_R_TOKEN_AUDIENCE);
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\",\"aud\":[\"x\",\"chat\"]," EXP "}");
    assert_int_equal(verify_claims(p), AUTH_OK);
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\",\"aud\":[\"x\",\"y\"]," EXP "}");
    assert_int_equal(verify_claims(p), AUTH_R_TOKEN_AUDIENCE);
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\",\"aud\":7," EXP "}");
    assert_int_equal(verify_claims(p), AUTH_R_TOKEN_AUDIENCE);
    snprintf(p, sizeof(p), "{\"iss\":7,\"aud\":\"chat\"," EXP "}");
    assert_int_equal(verify_claims(p), AUTH_R_TOKEN_CLAIMS);
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\",\"aud\":\"chat\",\"sub\":5," EXP "}");
    assert_int_equal(verify_claims(p), AUTH_R_TOKEN_CLAIMS);
    char longsub[AUTH_SUB_MAX + 2];
    memset(longsub, 'a', sizeof(longsub) - 1);
    longsub[sizeof(longsub) - 1] = '\0';
    char *lp = t_claims(longsub, "j", T_NOW, T_NOW + 60);
    assert_int_equal(verify_claims(lp), AUTH_R_TOKEN_CLAIMS);
    free(lp);
#undef EXP
}

static void test_kid(void **state)
{
    (void)state;
    char *pay = t_claims("alice", "j", T_NOW, T_NOW + 60);
    char *tok = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET),
                           "{\"alg\":\"HS256\",\"kid\":\"k9\"}", pay);
    assert_int_equal(verify(tok, T_NOW), AUTH_R_TOKEN_KID);
    free(tok);
    /* No kid with three keys configured: refused rather than guessed. */
    tok = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET), "{\"alg\":\"HS256\"}", pay);
    assert_int_equal(verify(tok, T_NOW), AUTH_R_TOKEN_KID);
    free(tok);
    /* kid of the wrong type, and an unknown crit extension. */
    tok = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET), "{\"alg\":\"HS256\",\"kid\":1}", pay);
    assert_int_equal(verify(tok, T_NOW), AUTH_R_TOKEN_MALFORMED);
    free(tok);
    tok = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET),
                     "{\"alg\":\"HS256\",\"kid\":\"k1\",\"crit\":[\"exp\"]}", pay);
    assert_int_equal(verify(tok, T_NOW), AUTH_R_TOKEN_MALFORMED);
    free(tok);
    /* alg spelled differently from the key's ("hs256") is not the same alg. */
    tok = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET), "{\"alg\":\"hs256\",\"kid\":\"k1\"}",
                     pay);
    assert_int_equal(verify(tok, T_NOW), AUTH_R_TOKEN_ALG);
    free(tok);
    free(pay);
}

static void test_duplicate_members(void **state)
{
    (void)state;
    char p[512];
    snprintf(p, sizeof(p),
             "{\"iss\":\"sluice\",\"aud\":\"chat\",\"sub\":\"alice\",\"sub\":\"admin\","
             "\"exp\":%lld}",
             T_NOW + 60);
    assert_int_equal(verify_claims(p), AUTH_R_TOKEN_MALFORMED);
    snprintf(p, sizeof(p), "{\"iss\":\"sluice\",\"aud\":\"chat\",\"exp\":%lld,\"exp\":%lld}",
             T_NOW + 60, T_NOW + 99999);
    assert_int_equal(verify_claims(p), AUTH_R_TOKEN_MALFORMED);
    char *pay = t_claims("alice", "j", T_NOW, T_NOW + 60);
    char *tok = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET),
                           "{\"alg\":\"HS256\",\"kid\":\"k1\",\"alg\":\"none\"}", pay);
    assert_int_equal(verify(tok, T_NOW), AUTH_R_TOKEN_MALFORMED);
    free(tok);
    free(pay);
}

static void test_es256_rs256(void **state)
{
    (void)state;
    char *pay = t_claims("bob", "j-es", T_NOW, T_NOW + 600);
    char *tok = t_token_pk(AUTH_ALG_ES256, F.ec, "{\"alg\":\"ES256\",\"kid\":\"e1\"}", pay);
    auth_claims_t c;
    assert_int_equal(auth_token_verify(F.a, tok, strlen(tok), T_NOW, &c), AUTH_OK);
    assert_string_equal(c.sub, "bob");
    assert_string_equal(c.kid, "e1");
    /* The raw R||S signature is 64 bytes: 86 base64url characters. */
    assert_int_equal(strlen(strrchr(tok, '.') + 1), 86);
    assert_int_equal(verify(tok, T_NOW + 700), AUTH_R_TOKEN_EXPIRED);
    free(tok);

    tok = t_token_pk(AUTH_ALG_RS256, F.rsa, "{\"alg\":\"RS256\",\"kid\":\"r1\"}", pay);
    assert_int_equal(auth_token_verify(F.a, tok, strlen(tok), T_NOW, &c), AUTH_OK);
    assert_string_equal(c.kid, "r1");
    /* A flipped bit in the middle of the RSA signature. */
    char *s = strrchr(tok, '.') + 20;
    *s = *s == 'A' ? 'B' : 'A';
    assert_int_equal(verify(tok, T_NOW), AUTH_R_TOKEN_SIGNATURE);
    free(tok);

    /* ES256 with a DER signature (what EVP emits) instead of R||S. */
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    char si[1024];
    char hdr64[256], pay64[512];
    static const char es_hdr[] = "{\"alg\":\"ES256\",\"kid\":\"e1\"}";
    auth_b64url_encode((const unsigned char *)es_hdr, strlen(es_hdr), hdr64);
    auth_b64url_encode((const unsigned char *)pay, strlen(pay), pay64);
    snprintf(si, sizeof(si), "%s.%s", hdr64, pay64);
    unsigned char der[128];
    size_t dlen = sizeof(der);
    assert_int_equal(EVP_DigestSignInit(ctx, NULL, EVP_sha256(), NULL, F.ec), 1);
    assert_int_equal(EVP_DigestSign(ctx, der, &dlen, (unsigned char *)si, strlen(si)), 1);
    EVP_MD_CTX_free(ctx);
    char sig64[256], full[2048];
    auth_b64url_encode(der, dlen, sig64);
    snprintf(full, sizeof(full), "%s.%s", si, sig64);
    assert_int_equal(verify(full, T_NOW), AUTH_R_TOKEN_SIGNATURE);
    free(pay);
}

/* ES256 is malleable: (r, n - s) verifies wherever (r, s) does. The high-S
 * twin is refused (one encoding per signed token), and the tokens sluice
 * signs itself always carry the low S. */
static void test_es256_high_s(void **state)
{
    (void)state;
    static const char hdr[] = "{\"alg\":\"ES256\",\"kid\":\"e1\"}";
    EC_GROUP *g = EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1);
    assert_non_null(g);
    const BIGNUM *n = EC_GROUP_get0_order(g);
    int mauled_refused = 0;
    /* OpenSSL's s is high about half of the time: 16 tokens give both */
    for (int i = 0; i < 16; i++) {
        char jti[32];
        snprintf(jti, sizeof(jti), "j-es-%d", i);
        char *pay = t_claims("bob", jti, T_NOW, T_NOW + 600);
        char *tok = t_token_pk(AUTH_ALG_ES256, F.ec, hdr, pay);
        assert_non_null(tok);
        assert_int_equal(verify(tok, T_NOW), AUTH_OK);
        char *dot = strrchr(tok, '.');
        unsigned char rs[64];
        assert_int_equal(auth_b64url_decode(dot + 1, strlen(dot + 1), rs, sizeof(rs)), 64);
        /* the twin: (r, n - s) */
        BIGNUM *sb = BN_bin2bn(rs + 32, 32, NULL), *tw = BN_new();
        assert_int_equal(BN_sub(tw, n, sb), 1);
        unsigned char twin[64];
        memcpy(twin, rs, 32);
        assert_int_equal(BN_bn2binpad(tw, twin + 32, 32), 32);
        /* OpenSSL on its own accepts the twin: the test can fail */
        ECDSA_SIG *es = ECDSA_SIG_new();
        BIGNUM *r2 = BN_bin2bn(twin, 32, NULL), *s2 = BN_bin2bn(twin + 32, 32, NULL);
        assert_int_equal(ECDSA_SIG_set0(es, r2, s2), 1);
        unsigned char *der = NULL;
        int dlen = i2d_ECDSA_SIG(es, &der);
        assert_true(dlen > 0);
        EVP_MD_CTX *ctx = EVP_MD_CTX_new();
        assert_int_equal(EVP_DigestVerifyInit(ctx, NULL, EVP_sha256(), NULL, F.ec), 1);
        assert_int_equal(EVP_DigestVerify(ctx, der, (size_t)dlen, (const unsigned char *)tok,
                                          (size_t)(dot - tok)),
                         1);
        EVP_MD_CTX_free(ctx);
        OPENSSL_free(der);
        ECDSA_SIG_free(es);
        /* sluice refuses it */
        char tw64[128], *mauled = malloc(strlen(tok) + 8);
        auth_b64url_encode(twin, 64, tw64);
        memcpy(mauled, tok, (size_t)(dot - tok) + 1);
        strcpy(mauled + (dot - tok) + 1, tw64);
        assert_string_not_equal(mauled, tok);
        assert_int_equal(verify(mauled, T_NOW), AUTH_R_TOKEN_SIGNATURE);
        mauled_refused++;
        BN_free(sb);
        BN_free(tw);
        free(mauled);
        free(tok);
        free(pay);
    }
    assert_int_equal(mauled_refused, 16);
    EC_GROUP_free(g);
}

static void test_key_loading(void **state)
{
    (void)state;
    char err[256];
    tconf_t t;
    tconf_default(&t);
    /* An RSA key given as ES256, a P-384 key as ES256, RSA-1024. */
    t.keys[1] = (conf_auth_key_t){.kid = "x", .alg = CONF_AUTH_ES256, .public_key = F.rsa_path};
    t.c.tokens.nkeys = 2;
    assert_null(auth_new(&t.c, F.st, err, sizeof(err)));
    assert_non_null(strstr(err, "P-256"));
    EVP_PKEY *p384 = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-384");
    char *p384_path = t_write_pub(p384);
    t.keys[1].public_key = p384_path;
    assert_null(auth_new(&t.c, F.st, err, sizeof(err)));
    EVP_PKEY *r1024 = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)1024);
    char *r1024_path = t_write_pub(r1024);
    t.keys[1] = (conf_auth_key_t){.kid = "x", .alg = CONF_AUTH_RS256, .public_key = r1024_path};
    assert_null(auth_new(&t.c, F.st, err, sizeof(err)));
    assert_non_null(strstr(err, "2048"));
    t.keys[1].public_key = "/nonexistent/key.pub";
    assert_null(auth_new(&t.c, F.st, err, sizeof(err)));
    assert_non_null(strstr(err, "cannot read"));
    t.keys[1] = (conf_auth_key_t){.kid = "k1", .alg = CONF_AUTH_ES256, .public_key = F.ec_path};
    assert_null(auth_new(&t.c, F.st, err, sizeof(err)));
    assert_non_null(strstr(err, "duplicate kid"));
    t.keys[1] = (conf_auth_key_t){.kid = "x", .alg = 7, .public_key = F.ec_path};
    assert_null(auth_new(&t.c, F.st, err, sizeof(err)));
    t.keys[1] = (conf_auth_key_t){.kid = "x", .alg = CONF_AUTH_HS256, .public_key = F.ec_path};
    assert_null(auth_new(&t.c, F.st, err, sizeof(err)));
    unlink(p384_path);
    unlink(r1024_path);
    free(p384_path);
    free(r1024_path);
    EVP_PKEY_free(p384);
    EVP_PKEY_free(r1024);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_hs256),
        cmocka_unit_test(test_bearer_scheme),
        cmocka_unit_test(test_rfc7515_a1),
        cmocka_unit_test(test_alg_none),
        cmocka_unit_test(test_hs256_with_rsa_public_key),
        cmocka_unit_test(test_stripped_and_truncated_signature),
        cmocka_unit_test(test_signature_from_another_key),
        cmocka_unit_test(test_bad_base64),
        cmocka_unit_test(test_b64url_strict),
        cmocka_unit_test(test_time_claims),
        cmocka_unit_test(test_iss_aud),
        cmocka_unit_test(test_kid),
        cmocka_unit_test(test_duplicate_members),
        cmocka_unit_test(test_es256_rs256),
        cmocka_unit_test(test_es256_high_s),
        cmocka_unit_test(test_key_loading),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
