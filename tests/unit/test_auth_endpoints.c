/* Unit tests of what the gateway routes to auth: POST /v1/auth/token
 * (client check, the token and signing key it returns), POST /admin/revoke
 * (admin key, body shapes, effect), the 401/503 replies and reason
 * strings, and the config errors of auth_new. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "test_auth_util.h"

typedef struct fx {
    tconf_t t;
    auth_stores_t *st;
    auth_t *a;
} fx_t;

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));
    tconf_default(&f->t);
    f->st = auth_stores_new(0, 0);
    f->a = t_auth(&f->t, f->st);
    *state = f;
    return f->a ? 0 : -1;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    auth_free(f->a);
    auth_stores_free(f->st);
    free(f);
    return 0;
}

static json_t *body_json(const auth_http_reply_t *r)
{
    assert_non_null(r->body);
    assert_int_equal(strlen(r->body), r->body_len);
    json_error_t e;
    json_t *j = json_loads(r->body, 0, &e);
    assert_non_null(j);
    return j;
}

static const char *err_code(json_t *j)
{
    return json_string_value(json_object_get(json_object_get(j, "error"), "code"));
}

static void test_token_issue(void **state)
{
    fx_t *f = *state;
    static const char body[] = "{\"client_id\":\"harmony-app\",\"client_secret\":\"" T_CLIENT_SECRET
                               "\",\"sub\":\"alice\"}";
    auth_http_reply_t r;
    assert_int_equal(auth_token_endpoint(f->a, body, strlen(body), T_NOW, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *j = body_json(&r);
    const char *tok = json_string_value(json_object_get(j, "access_token"));
    const char *key = json_string_value(json_object_get(j, "signing_key"));
    assert_string_equal(json_string_value(json_object_get(j, "token_type")), "Bearer");
    assert_int_equal(json_integer_value(json_object_get(j, "expires_in")), 900);
    assert_non_null(tok);
    assert_non_null(key);
    assert_int_equal(strlen(key), 64);
    /* The token verifies, carries our claims, and its signing key is the
     * one any instance recomputes from its jti. */
    auth_claims_t c;
    assert_int_equal(auth_token_verify(f->a, tok, strlen(tok), T_NOW, &c), AUTH_OK);
    assert_string_equal(c.sub, "alice");
    assert_int_equal(c.iat, T_NOW);
    assert_int_equal(c.exp, T_NOW + 900);
    assert_string_equal(c.kid, "k1");
    assert_int_equal(strlen(c.jti), 22); /* 16 random bytes */
    char want[65];
    assert_int_equal(auth_signing_key(f->a, c.jti, strlen(c.jti), want), 0);
    assert_string_equal(key, want);
    /* The key signs requests that pass. */
    treq_t q;
    treq_make(&q, f->a, tok, T_NOW, "issued-nonce-aaaaaaaa");
    assert_int_equal(t_check(f->a, &q.r, T_NOW + 1), AUTH_OK);
    /* Two issues never share a jti. */
    auth_http_reply_t r2;
    assert_int_equal(auth_token_endpoint(f->a, body, strlen(body), T_NOW, &r2), 0);
    json_t *j2 = body_json(&r2);
    assert_string_not_equal(tok, json_string_value(json_object_get(j2, "access_token")));
    json_decref(j2);
    auth_http_reply_clear(&r2);
    /* Secrets never appear in the reply. */
    assert_null(strstr(r.body, T_CLIENT_SECRET));
    assert_null(strstr(r.body, T_SIGN_SECRET));
    json_decref(j);
    auth_http_reply_clear(&r);
    assert_null(r.body);

    /* A shorter ttl, and one over the cap. */
    static const char b3[] = "{\"client_id\":\"harmony-app\",\"client_secret\":\"" T_CLIENT_SECRET
                             "\",\"sub\":\"alice\",\"ttl\":60}";
    assert_int_equal(auth_token_endpoint(f->a, b3, strlen(b3), T_NOW, &r), 0);
    assert_int_equal(r.status, 200);
    j = body_json(&r);
    assert_int_equal(json_integer_value(json_object_get(j, "expires_in")), 60);
    json_decref(j);
    auth_http_reply_clear(&r);
    static const char b4[] = "{\"client_id\":\"harmony-app\",\"client_secret\":\"" T_CLIENT_SECRET
                             "\",\"sub\":\"alice\",\"ttl\":3601}";
    assert_int_equal(auth_token_endpoint(f->a, b4, strlen(b4), T_NOW, &r), 0);
    assert_int_equal(r.status, 400);
    auth_http_reply_clear(&r);
}

static void test_token_issue_refusals(void **state)
{
    fx_t *f = *state;
    static const struct {
        const char *body;
        int status;
        const char *code;
    } cases[] = {
        {"{\"client_id\":\"harmony-app\",\"client_secret\":\"wrong-secret-0000000\","
         "\"sub\":\"a\"}",
         401, "invalid_client"},
        {"{\"client_id\":\"harmony-app\",\"client_secret\":\"" T_CLIENT_SECRET "x\","
         "\"sub\":\"a\"}",
         401, "invalid_client"},
        {"{\"client_id\":\"other-app\",\"client_secret\":\"" T_CLIENT_SECRET "\",\"sub\":\"a\"}",
         401, "invalid_client"},
        {"{\"client_id\":\"harmony-app\",\"client_secret\":\"" T_CLIENT_SECRET "\"}", 400,
         "invalid_request"},
        {"{\"client_id\":\"harmony-app\",\"client_secret\":\"" T_CLIENT_SECRET
         "\",\"sub\":\"a\",\"admin\":true}",
         400, "invalid_request"},
        {"{\"client_id\":\"harmony-app\",\"client_secret\":\"" T_CLIENT_SECRET
         "\",\"sub\":\"a\",\"sub\":\"b\"}",
         400, "invalid_request"},
        {"{\"client_id\":\"harmony-app\",\"client_secret\":\"" T_CLIENT_SECRET "\",\"sub\":\"\"}",
         400, "invalid_request"},
        {"not json", 400, "invalid_request"},
        {"", 400, "invalid_request"},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        auth_http_reply_t r;
        assert_int_equal(auth_token_endpoint(f->a, cases[i].body, strlen(cases[i].body), T_NOW, &r),
                         0);
        assert_int_equal(r.status, cases[i].status);
        json_t *j = body_json(&r);
        assert_string_equal(err_code(j), cases[i].code);
        if (r.status == 401)
            assert_non_null(strstr(r.www_authenticate, "Bearer"));
        assert_null(strstr(r.body, T_CLIENT_SECRET));
        json_decref(j);
        auth_http_reply_clear(&r);
    }
}

static void test_mint_without_hs256(void **state)
{
    (void)state;
    EVP_PKEY *ec = t_keygen("EC");
    char *path = t_write_pub(ec);
    tconf_t t;
    tconf_default(&t);
    t.keys[0] = (conf_auth_key_t){.kid = "e1", .alg = CONF_AUTH_ES256, .public_key = path};
    auth_stores_t *st = auth_stores_new(0, 0);
    auth_t *a = t_auth(&t, st);
    assert_non_null(a);
    static const char body[] = "{\"client_id\":\"harmony-app\",\"client_secret\":\"" T_CLIENT_SECRET
                               "\",\"sub\":\"alice\"}";
    auth_http_reply_t r;
    assert_int_equal(auth_token_endpoint(a, body, strlen(body), T_NOW, &r), 0);
    assert_int_equal(r.status, 503);
    auth_http_reply_clear(&r);
    char *tok = NULL, key[65], err[128];
    assert_int_equal(auth_token_mint(a, "alice", 0, T_NOW, &tok, key, err, sizeof(err)), -1);
    assert_null(tok);
    auth_free(a);
    auth_stores_free(st);
    unlink(path);
    free(path);
    EVP_PKEY_free(ec);
}

static auth_http_reply_t do_revoke(fx_t *f, const char *authz, const char *body, int64_t now)
{
    auth_http_reply_t r;
    assert_int_equal(auth_admin_revoke(f->a, NULL, authz, authz ? strlen(authz) : 0, body,
                                       strlen(body), now, &r, NULL, NULL, NULL),
                     AUTH_DONE);
    return r;
}

static void test_admin_revoke(void **state)
{
    fx_t *f = *state;
    char *tok = t_good_token("gina", "jti-gina-1");
    char *tok2 = t_good_token("gina", "jti-gina-2");
    static const char admin[] = "Bearer " T_ADMIN_KEY;
    /* Refusals first: none of them may revoke anything. */
    auth_http_reply_t r = do_revoke(f, NULL, "{\"jti\":\"jti-gina-1\"}", T_NOW);
    assert_int_equal(r.status, 401);
    assert_non_null(strstr(r.www_authenticate, "Bearer"));
    auth_http_reply_clear(&r);
    r = do_revoke(f, "Bearer " T_ADMIN_KEY "x", "{\"jti\":\"jti-gina-1\"}", T_NOW);
    assert_int_equal(r.status, 401);
    auth_http_reply_clear(&r);
    r = do_revoke(f, "Basic " T_ADMIN_KEY, "{\"jti\":\"jti-gina-1\"}", T_NOW);
    assert_int_equal(r.status, 401);
    auth_http_reply_clear(&r);
    static const char *bad[] = {
        "{}", "{\"jti\":\"\"}", "{\"jti\":5}", "{\"jti\":\"a\",\"all\":true}", "[\"jti\"]", "nope"};
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++) {
        r = do_revoke(f, admin, bad[i], T_NOW);
        assert_int_equal(r.status, 400);
        auth_http_reply_clear(&r);
    }
    assert_int_equal(auth_stores_revocation_count(f->st), 0);
    treq_t q;
    treq_make(&q, f->a, tok, T_NOW, "admin-nonce-00000001");
    assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_OK);

    /* By jti. */
    r = do_revoke(f, admin, "{\"jti\":\"jti-gina-1\"}", T_NOW + 5);
    assert_int_equal(r.status, 200);
    json_t *j = body_json(&r);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "revoked"), "jti")),
                        "jti-gina-1");
    assert_string_equal(json_string_value(json_object_get(j, "store")), "local");
    /* Remembered for max_lifetime + 2 x leeway. */
    assert_int_equal(json_integer_value(json_object_get(j, "until")), T_NOW + 5 + 3600 + 60);
    json_decref(j);
    auth_http_reply_clear(&r);
    treq_make(&q, f->a, tok, T_NOW + 6, "admin-nonce-00000002");
    assert_int_equal(t_check(f->a, &q.r, T_NOW + 6), AUTH_R_TOKEN_REVOKED);
    treq_make(&q, f->a, tok2, T_NOW + 6, "admin-nonce-00000003");
    assert_int_equal(t_check(f->a, &q.r, T_NOW + 6), AUTH_OK);

    /* By sub (and both at once). */
    r = do_revoke(f, admin, "{\"sub\":\"gina\",\"jti\":\"jti-other\"}", T_NOW + 7);
    assert_int_equal(r.status, 200);
    auth_http_reply_clear(&r);
    treq_make(&q, f->a, tok2, T_NOW + 8, "admin-nonce-00000004");
    assert_int_equal(t_check(f->a, &q.r, T_NOW + 8), AUTH_R_TOKEN_REVOKED);
    assert_int_equal(auth_stores_revocation_count(f->st), 3);
    free(tok);
    free(tok2);
}

static void test_admin_disabled(void **state)
{
    (void)state;
    tconf_t t;
    tconf_default(&t);
    t.c.admin_key_env = NULL;
    auth_stores_t *st = auth_stores_new(0, 0);
    auth_t *a = t_auth(&t, st);
    auth_http_reply_t r;
    static const char admin[] = "Bearer " T_ADMIN_KEY;
    assert_int_equal(auth_admin_revoke(a, NULL, admin, strlen(admin), "{\"sub\":\"x\"}", 11, T_NOW,
                                       &r, NULL, NULL, NULL),
                     AUTH_DONE);
    assert_int_equal(r.status, 403);
    auth_http_reply_clear(&r);
    assert_int_equal(auth_stores_revocation_count(st), 0);
    auth_free(a);
    auth_stores_free(st);
}

static void test_reject_replies(void **state)
{
    (void)state;
    /* Every reason has a distinct, stable, non-empty code. */
    for (int i = 0; i < AUTH_R__COUNT; i++) {
        const char *s = auth_reason_str((auth_reason_t)i);
        assert_true(strlen(s) > 1);
        for (int k = 0; k < i; k++)
            assert_string_not_equal(s, auth_reason_str((auth_reason_t)k));
    }
    assert_string_equal(auth_reason_str(AUTH_R_TOKEN_EXPIRED), "token_expired");
    assert_string_equal(auth_reason_str(AUTH_R_SIG_REPLAY), "signature_replay");
    assert_string_equal(auth_reason_str(AUTH_R__COUNT), "unknown");
    for (int i = 1; i < AUTH_R__COUNT; i++) {
        auth_http_reply_t r;
        assert_int_equal(auth_reject_reply((auth_reason_t)i, &r), 0);
        assert_int_equal(r.status, auth_reason_http_status((auth_reason_t)i));
        json_t *j = body_json(&r);
        json_t *e = json_object_get(j, "error");
        assert_string_equal(err_code(j), auth_reason_str((auth_reason_t)i));
        assert_non_null(json_string_value(json_object_get(e, "message")));
        assert_true(json_is_null(json_object_get(e, "param")));
        if (r.status == 401) {
            assert_string_equal(json_string_value(json_object_get(e, "type")),
                                "authentication_error");
            assert_int_equal(strncmp(r.www_authenticate, "Bearer realm=\"sluice\"", 21), 0);
        }
        json_decref(j);
        auth_http_reply_clear(&r);
    }
    auth_http_reply_t r;
    assert_int_equal(auth_reject_reply(AUTH_R_TOKEN_EXPIRED, &r), 0);
    assert_string_equal(r.www_authenticate, "Bearer realm=\"sluice\", error=\"invalid_token\", "
                                            "error_description=\"token_expired\"");
    auth_http_reply_clear(&r);
    assert_int_equal(auth_reject_reply(AUTH_R_TOKEN_MISSING, &r), 0);
    assert_string_equal(r.www_authenticate, "Bearer realm=\"sluice\"");
    auth_http_reply_clear(&r);
}

static void test_config_errors(void **state)
{
    (void)state;
    auth_stores_t *st = auth_stores_new(0, 0);
    char err[256];
    tconf_t t;
#define EXPECT_ERR(mutation, needle)                                                               \
    do {                                                                                           \
        tconf_default(&t);                                                                         \
        mutation;                                                                                  \
        err[0] = '\0';                                                                             \
        assert_null(auth_new(&t.c, st, err, sizeof(err)));                                         \
        assert_non_null(strstr(err, needle));                                                      \
    } while (0)
    EXPECT_ERR(unsetenv("T_TOKEN_SECRET"), "T_TOKEN_SECRET is not set");
    EXPECT_ERR(setenv("T_TOKEN_SECRET", "short", 1), "at least 32");
    EXPECT_ERR(setenv("T_TOKEN_SECRET", "base64url:!!", 1), "base64url");
    EXPECT_ERR(setenv("T_SIGN_SECRET", "short", 1), "auth.signing.secret_env");
    EXPECT_ERR(setenv("T_CLIENT", "short", 1), "auth.clients[0] (harmony-app)");
    EXPECT_ERR(setenv("T_ADMIN", "short", 1), "admin_key_env");
    EXPECT_ERR(t.c.tokens.leeway_ms = 61000, "leeway");
    EXPECT_ERR(t.c.tokens.ttl_ms = 2 * 3600000, "ttl");
    EXPECT_ERR(t.c.signing.window_ms = 0, "window");
    EXPECT_ERR(t.c.tokens.nkeys = 0, "at least one key");
    EXPECT_ERR(t.keys[0].kid = "", "kid");
    EXPECT_ERR((t.clients[1] = t.clients[0], t.c.nclients = 2), "duplicate id");
    EXPECT_ERR(t.c.signing.secret_env = NULL, "auth.signing.secret_env");
#undef EXPECT_ERR
    /* And secrets that are fine: 32 bytes exactly, base64url-encoded. */
    tconf_default(&t);
    setenv("T_TOKEN_SECRET", "base64url:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", 1);
    auth_t *a = auth_new(&t.c, st, err, sizeof(err));
    assert_non_null(a);
    auth_free(a);
    t_env();
    auth_free(NULL);
    auth_stores_free(st);
    auth_stores_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_token_issue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_token_issue_refusals, setup, teardown),
        cmocka_unit_test(test_mint_without_hs256),
        cmocka_unit_test_setup_teardown(test_admin_revoke, setup, teardown),
        cmocka_unit_test(test_admin_disabled),
        cmocka_unit_test(test_reject_replies),
        cmocka_unit_test(test_config_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
