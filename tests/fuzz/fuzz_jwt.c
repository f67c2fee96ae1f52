/*
 * fuzz_jwt.c — libFuzzer target for the token parser: the whole
 * verification (split, base64url, JSON with duplicate refusal, kid/alg
 * selection, HS256/ES256/RS256 signature checks, claims at a fixed clock)
 * and, since a fuzzer rarely forges a signature, the claim rules run on
 * every payload that parses. Corpus: tests/fuzz/corpus/fuzz_jwt/ (valid
 * HS256 tokens for this target's key, RFC 7515 A.1, alg none, duplicates).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>

#include "auth/auth_internal.h"

#define FUZZ_NOW 1700000000LL

static auth_t *g_auth;

static char *write_pub(EVP_PKEY *k)
{
    char *path = strdup("/tmp/sluice-fuzz-key-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0)
        abort();
    FILE *f = fdopen(fd, "w");
    PEM_write_PUBKEY(f, k);
    fclose(f);
    return path;
}

static void init(void)
{
    /* The corpus's valid tokens are signed with this secret. */
    setenv("FUZZ_TOKEN_SECRET", "fuzz-token-secret-0123456789abcdef0123", 1);
    setenv("FUZZ_SIGN_SECRET", "fuzz-signing-secret-0123456789abcdef01", 1);
    EVP_PKEY *ec = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
    EVP_PKEY *rsa = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)2048);
    char *ec_path = write_pub(ec), *rsa_path = write_pub(rsa);
    static conf_auth_key_t keys[3];
    keys[0] =
        (conf_auth_key_t){.kid = "k1", .alg = CONF_AUTH_HS256, .secret_env = "FUZZ_TOKEN_SECRET"};
    keys[1] = (conf_auth_key_t){.kid = "e1", .alg = CONF_AUTH_ES256, .public_key = ec_path};
    keys[2] = (conf_auth_key_t){.kid = "r1", .alg = CONF_AUTH_RS256, .public_key = rsa_path};
    conf_auth_t c = {
        .required = true,
        .tokens = {.issuer = "sluice",
                   .audience = "chat",
                   .ttl_ms = 900000,
                   .max_lifetime_ms = 3600000,
                   .leeway_ms = 30000,
                   .keys = keys,
                   .nkeys = 3},
        .signing = {.required = true, .secret_env = "FUZZ_SIGN_SECRET", .window_ms = 300000},
    };
    char err[256];
    g_auth = auth_new(&c, auth_stores_new(1024, 1024), err, sizeof(err));
    if (!g_auth) {
        fprintf(stderr, "fuzz_jwt: %s\n", err);
        abort();
    }
    unlink(ec_path);
    unlink(rsa_path);
    free(ec_path);
    free(rsa_path);
    EVP_PKEY_free(ec);
    EVP_PKEY_free(rsa);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_auth)
        init();
    const char *tok = (const char *)data;
    auth_claims_t c;
    auth_reason_t r = auth_token_verify(g_auth, tok, size, FUZZ_NOW, &c);
    if (r == AUTH_OK && (strlen(c.sub) > AUTH_SUB_MAX || c.exp + 30 <= FUZZ_NOW))
        abort(); /* an accepted token must satisfy what we promised */
    if ((unsigned)r >= AUTH_R__COUNT)
        abort();

    auth_jwt_t j;
    if (auth_jwt_parse(tok, size, &j) == AUTH_OK) {
        if (j.signing_input_len >= size || j.sig_len > AUTH_SIG_MAX || !j.alg)
            abort();
        const auth_key_t *k = NULL;
        (void)auth_jwt_key(g_auth, &j, &k);
        (void)auth_jwt_check_claims(g_auth, j.payload, FUZZ_NOW, &c);
        auth_jwt_clear(&j);
    }

    /* The same bytes as the whole Authorization header of a request. */
    char *h = malloc(size + 8);
    if (!h)
        return 0;
    memcpy(h, "Bearer ", 7);
    memcpy(h + 7, data, size);
    auth_request_t req = {.authorization = h, .authorization_len = size + 7};
    auth_result_t res;
    if (auth_check(g_auth, NULL, &req, FUZZ_NOW, &res, NULL, NULL, NULL) != AUTH_DONE)
        abort();
    free(h);
    return 0;
}
