/* Unit tests of the `auth:` config section end to end: issue 3's YAML shape
 * loads into conf_auth_t with the right values and defaults, builds an
 * auth_t that verifies and mints, and the loader refuses what auth cannot
 * use (with file:line). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "test_auth_util.h"

static const char *yaml_fmt = "listen:\n"
                              "  - address: 127.0.0.1:8080\n"
                              "auth:\n"
                              "  required: true\n"
                              "  tokens:\n"
                              "    issuer: sluice\n"
                              "    audience: chat\n"
                              "    ttl: 15m\n"
                              "    max_lifetime: 1h\n"
                              "    leeway: 30s\n"
                              "    keys:\n"
                              "      - { kid: k1, alg: HS256, secret_env: T_TOKEN_SECRET }\n"
                              "      - { kid: k2, alg: ES256, public_key: %s }\n"
                              "  clients: [ { id: harmony-app, secret_env: T_CLIENT } ]\n"
                              "  signing: { required: true, secret_env: T_SIGN_SECRET, window: "
                              "300s }\n"
                              "  admin_key_env: T_ADMIN\n"
                              "  on_store_error: { nonces: deny, revocations: deny }\n"
                              "redis: { url: \"redis://127.0.0.1:6379/0\", timeout: 50ms }\n";

static conf_t *load(const char *yaml, char *err, size_t errlen)
{
    return conf_load_string(yaml, strlen(yaml), "t.yaml", err, errlen);
}

static void test_issue_shape(void **state)
{
    (void)state;
    t_env();
    EVP_PKEY *ec = t_keygen("EC");
    char *path = t_write_pub(ec);
    char yaml[2048], err[512] = "";
    snprintf(yaml, sizeof(yaml), yaml_fmt, path);
    conf_t *c = load(yaml, err, sizeof(err));
    if (!c)
        fail_msg("%s", err);
    const conf_auth_t *a = &c->auth;
    assert_true(auth_conf_enabled(a));
    assert_true(a->required);
    assert_string_equal(a->tokens.issuer, "sluice");
    assert_string_equal(a->tokens.audience, "chat");
    assert_int_equal(a->tokens.ttl_ms, 900000);
    assert_int_equal(a->tokens.max_lifetime_ms, 3600000);
    assert_int_equal(a->tokens.leeway_ms, 30000);
    assert_int_equal(a->tokens.nkeys, 2);
    assert_string_equal(a->tokens.keys[0].kid, "k1");
    assert_int_equal(a->tokens.keys[0].alg, CONF_AUTH_HS256);
    assert_string_equal(a->tokens.keys[0].secret_env, "T_TOKEN_SECRET");
    assert_int_equal(a->tokens.keys[1].alg, CONF_AUTH_ES256);
    assert_string_equal(a->tokens.keys[1].public_key, path);
    assert_int_equal(a->tokens.keys[1].line, 13);
    assert_int_equal(a->nclients, 1);
    assert_string_equal(a->clients[0].id, "harmony-app");
    assert_true(a->signing.required);
    assert_int_equal(a->signing.window_ms, 300000);
    assert_string_equal(a->admin_key_env, "T_ADMIN");
    assert_int_equal(a->on_store_error.nonces, CONF_STORE_ERROR_DENY);
    assert_int_equal(a->on_store_error.revocations, CONF_STORE_ERROR_DENY);
    assert_int_equal(c->redis.timeout_ms, 50);

    /* It builds, mints and verifies; an ES256 token of the login key too. */
    auth_stores_t *st = auth_stores_new(0, 0);
    auth_t *au = auth_new(a, st, err, sizeof(err));
    if (!au)
        fail_msg("%s", err);
    char *tok = NULL, key[65];
    assert_int_equal(auth_token_mint(au, "alice", 0, T_NOW, &tok, key, err, sizeof(err)), 0);
    assert_int_equal(auth_token_verify(au, tok, strlen(tok), T_NOW + 899, NULL), AUTH_OK);
    assert_int_equal(auth_token_verify(au, tok, strlen(tok), T_NOW + 930, NULL),
                     AUTH_R_TOKEN_EXPIRED);
    free(tok);
    char *pay = t_claims("bob", "j", T_NOW, T_NOW + 60);
    tok = t_token_pk(AUTH_ALG_ES256, ec, "{\"alg\":\"ES256\",\"kid\":\"k2\"}", pay);
    assert_int_equal(auth_token_verify(au, tok, strlen(tok), T_NOW, NULL), AUTH_OK);
    free(tok);
    free(pay);
    auth_free(au);
    auth_stores_free(st);
    conf_free(c);
    unlink(path);
    free(path);
    EVP_PKEY_free(ec);
}

static void test_defaults_and_off(void **state)
{
    (void)state;
    char err[512];
    /* No auth: section at all: off, with the issue's defaults in place. */
    conf_t *c = load("listen:\n  - address: 127.0.0.1:8080\n", err, sizeof(err));
    assert_non_null(c);
    assert_false(auth_conf_enabled(&c->auth));
    assert_true(c->auth.required);
    assert_true(c->auth.signing.required);
    assert_int_equal(c->auth.tokens.ttl_ms, 900000);
    assert_int_equal(c->auth.tokens.leeway_ms, 30000);
    assert_int_equal(c->auth.signing.window_ms, 300000);
    assert_int_equal(c->auth.on_store_error.nonces, CONF_STORE_ERROR_DENY);
    assert_int_equal(c->auth.on_store_error.revocations, CONF_STORE_ERROR_DENY);
    conf_free(c);
}

static void test_loader_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *auth;
        const char *needle;
    } cases[] = {
        {"  tokens: { keys: [ { kid: k1, alg: none, secret_env: X } ] }\n", "alg"},
        {"  tokens: { keys: [ { kid: k1, alg: HS256 } ] }\n", "HS256 takes secret_env"},
        {"  tokens: { keys: [ { kid: k1, alg: HS256, secret_env: X, public_key: y.pub } ] }\n",
         "HS256 takes secret_env"},
        {"  tokens: { keys: [ { kid: k1, alg: ES256, secret_env: X } ] }\n",
         "ES256 takes public_key"},
        {"  tokens: { keys: [ { kid: k1, alg: HS256, secret_env: X },"
         " { kid: k1, alg: HS256, secret_env: Y } ] }\n",
         "duplicate kid"},
        {"  tokens: { leeway: 61s, keys: [ { kid: k1, alg: HS256, secret_env: X } ] }\n", "leeway"},
        {"  tokens: { ttl: 2h, keys: [ { kid: k1, alg: HS256, secret_env: X } ] }\n", "ttl"},
        {"  required: false\n"
         "  signing: { required: true, secret_env: S }\n"
         "  tokens: { keys: [ { kid: k1, alg: HS256, secret_env: X } ] }\n",
         "signing.required"},
        {"  tokens: { keys: [ { kid: k1, alg: HS256, secret_env: X } ] }\n", "signing.secret_env"},
        {"  clients: [ { id: app, secret_env: C } ]\n", "at least one key"},
        {"  on_store_error: { nonces: local }\n", "nonces"},
        {"  tokens: { keys: [ { kid: k1, alg: HS256, secret_env: X, jku: http://x } ] }\n", "jku"},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        char yaml[1024], err[512] = "";
        snprintf(yaml, sizeof(yaml), "listen:\n  - address: 127.0.0.1:8080\nauth:\n%s",
                 cases[i].auth);
        conf_t *c = load(yaml, err, sizeof(err));
        if (c)
            fail_msg("case %zu loaded", i);
        if (!strstr(err, cases[i].needle) || !strstr(err, "t.yaml:"))
            fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err, cases[i].needle);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_issue_shape),
        cmocka_unit_test(test_defaults_and_off),
        cmocka_unit_test(test_loader_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
