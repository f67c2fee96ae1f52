/* Unit tests of the tools: `sluice token` mints from a real conf file and
 * what it prints verifies; `sluice sign` prints headers that the request
 * path accepts, and that it refuses once any input differs. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "test_auth_util.h"

static const char conf_yaml[] = "listen:\n"
                                "  - address: 127.0.0.1:8080\n"
                                "auth:\n"
                                "  tokens:\n"
                                "    issuer: sluice\n"
                                "    audience: chat\n"
                                "    keys:\n"
                                "      - { kid: k1, alg: HS256, secret_env: T_TOKEN_SECRET }\n"
                                "  signing: { secret_env: T_SIGN_SECRET }\n";

/* Runs auth_cli_main with stdout captured into out (NUL-terminated). */
static int run(char *out, size_t cap, int argc, char **argv)
{
    char path[] = "/tmp/sluice-cli-out-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stdout);
    int saved = dup(1);
    dup2(fd, 1);
    int rc = auth_cli_main(argc, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    lseek(fd, 0, SEEK_SET);
    ssize_t n = read(fd, out, cap - 1);
    out[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    return rc;
}

static char *write_tmp(const char *text)
{
    char *path = strdup("/tmp/sluice-cli-in-XXXXXX");
    int fd = mkstemp(path);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

/* The value after "name: " on its own line. */
static void field(const char *out, const char *name, char *val, size_t cap)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "%s: ", name);
    const char *p = strstr(out, pat);
    assert_non_null(p);
    p += strlen(pat);
    size_t n = strcspn(p, "\n");
    assert_true(n < cap);
    memcpy(val, p, n);
    val[n] = '\0';
}

static void test_token(void **state)
{
    (void)state;
    t_env();
    char *conf = write_tmp(conf_yaml);
    char out[4096], tok[2048], key[128], exp[32];
    char *argv[] = {"token", "--sub", "alice", "--ttl", "10m", "-c", conf, NULL};
    assert_int_equal(run(out, sizeof(out), 7, argv), 0);
    field(out, "access_token", tok, sizeof(tok));
    field(out, "signing_key", key, sizeof(key));
    field(out, "expires_in", exp, sizeof(exp));
    assert_string_equal(exp, "600");
    assert_int_equal(strlen(key), 64);

    /* Verify it with an auth_t built from the same conf. */
    char err[512];
    conf_t *c = conf_load(conf, err, sizeof(err));
    assert_non_null(c);
    auth_stores_t *st = auth_stores_new(0, 0);
    auth_t *a = auth_new(&c->auth, st, err, sizeof(err));
    assert_non_null(a);
    auth_claims_t cl;
    assert_int_equal(auth_token_verify(a, tok, strlen(tok), sl_wall_s(), &cl), AUTH_OK);
    assert_string_equal(cl.sub, "alice");
    assert_int_equal(cl.exp - cl.iat, 600);
    char want[65];
    assert_int_equal(auth_signing_key(a, cl.jti, strlen(cl.jti), want), 0);
    assert_string_equal(key, want);

    /* --json is the endpoint's body. */
    char *argv2[] = {"token", "--sub", "bob", "--json", "-c", conf, NULL};
    assert_int_equal(run(out, sizeof(out), 6, argv2), 0);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "token_type")), "Bearer");
    assert_int_equal(json_integer_value(json_object_get(j, "expires_in")), 900);
    assert_non_null(json_string_value(json_object_get(j, "signing_key")));
    json_decref(j);

    /* Refusals: usage (2) and failures (1). */
    char *bad1[] = {"token", "-c", conf, NULL};
    assert_int_equal(run(out, sizeof(out), 3, bad1), 2);
    char *bad2[] = {"token", "--sub", "x", "--ttl", "soon", "-c", conf, NULL};
    assert_int_equal(run(out, sizeof(out), 7, bad2), 2);
    char *bad3[] = {"token", "--sub", "x", "--ttl", "2h", "-c", conf, NULL};
    assert_int_equal(run(out, sizeof(out), 7, bad3), 1); /* over max_lifetime */
    char *bad4[] = {"token", "--sub", "x", "-c", "/nonexistent.yaml", NULL};
    assert_int_equal(run(out, sizeof(out), 5, bad4), 1);
    char *noauth = write_tmp("listen:\n  - address: 127.0.0.1:8080\n");
    char *bad5[] = {"token", "--sub", "x", "-c", noauth, NULL};
    assert_int_equal(run(out, sizeof(out), 5, bad5), 1);
    char *bad6[] = {"frobnicate", NULL};
    assert_int_equal(run(out, sizeof(out), 1, bad6), 2);
    assert_string_equal(out, "");

    auth_free(a);
    auth_stores_free(st);
    conf_free(c);
    unlink(conf);
    unlink(noauth);
    free(conf);
    free(noauth);
}

static void test_sign(void **state)
{
    (void)state;
    tconf_t t;
    tconf_default(&t);
    auth_stores_t *st = auth_stores_new(0, 0);
    auth_t *a = t_auth(&t, st);
    char *tok = t_good_token("alice", "jti-cli");
    char key[65];
    assert_int_equal(auth_signing_key(a, "jti-cli", 7, key), 0);
    static const char body[] =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    char *body_path = write_tmp(body);

    char out[1024], ts[32], nonce[80], sig[80];
    char *argv[] = {"sign",
                    "--key",
                    key,
                    "--method",
                    "POST",
                    "--path",
                    "/v1/chat/completions?x=1",
                    "--body",
                    body_path,
                    "--timestamp",
                    "1700000000",
                    NULL};
    assert_int_equal(run(out, sizeof(out), 11, argv), 0);
    field(out, "X-Sluice-Timestamp", ts, sizeof(ts));
    field(out, "X-Sluice-Nonce", nonce, sizeof(nonce));
    field(out, "X-Sluice-Signature", sig, sizeof(sig));
    assert_string_equal(ts, "1700000000");
    assert_int_equal(strlen(nonce), 22);
    assert_int_equal(strlen(sig), 64);

    /* Exactly these headers on exactly this request pass ... */
    treq_t q;
    memset(&q, 0, sizeof(q));
    snprintf(q.authz, sizeof(q.authz), "Bearer %s", tok);
    snprintf(q.method, sizeof(q.method), "POST");
    snprintf(q.path, sizeof(q.path), "/v1/chat/completions?x=1");
    snprintf(q.ts, sizeof(q.ts), "%s", ts);
    snprintf(q.nonce, sizeof(q.nonce), "%s", nonce);
    snprintf(q.sig, sizeof(q.sig), "%s", sig);
    snprintf(q.body, sizeof(q.body), "%s", body);
    treq_bind(&q);
    /* ... and a different body does not. */
    treq_t q2 = q;
    q2.body[5] = 'M';
    treq_bind(&q2);
    assert_int_equal(t_check(a, &q2.r, T_NOW), AUTH_R_SIG_MISMATCH);
    assert_int_equal(t_check(a, &q.r, T_NOW), AUTH_OK);

    /* A given nonce is used as is; two runs without one differ. */
    char *argv2[] = {"sign",   "--key",      key,       "--method",          "GET",
                     "--path", "/v1/models", "--nonce", "my-own-nonce-0123", NULL};
    assert_int_equal(run(out, sizeof(out), 9, argv2), 0);
    field(out, "X-Sluice-Nonce", nonce, sizeof(nonce));
    assert_string_equal(nonce, "my-own-nonce-0123");
    char n1[80], n2[80];
    char *argv3[] = {"sign", "--key", key, "--method", "GET", "--path", "/v1/models", NULL};
    assert_int_equal(run(out, sizeof(out), 7, argv3), 0);
    field(out, "X-Sluice-Nonce", n1, sizeof(n1));
    assert_int_equal(run(out, sizeof(out), 7, argv3), 0);
    field(out, "X-Sluice-Nonce", n2, sizeof(n2));
    assert_string_not_equal(n1, n2);

    char *bad1[] = {"sign", "--key", key, "--method", "GET", "--path", "v1", NULL};
    assert_int_equal(run(out, sizeof(out), 7, bad1), 2);
    char *bad2[] = {"sign",   "--key", key,       "--method", "GET",
                    "--path", "/",     "--nonce", "short",    NULL};
    assert_int_equal(run(out, sizeof(out), 9, bad2), 2);
    char *bad3[] = {"sign",   "--key", key,      "--method",          "GET",
                    "--path", "/",     "--body", "/nonexistent/body", NULL};
    assert_int_equal(run(out, sizeof(out), 9, bad3), 1);

    unlink(body_path);
    free(body_path);
    free(tok);
    auth_free(a);
    auth_stores_free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token),
        cmocka_unit_test(test_sign),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
