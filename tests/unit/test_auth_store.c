/* Unit tests of the in-process stores: nonces seen until they expire,
 * capacity is a hard bound (a full store refuses, never evicts), expired
 * entries are reclaimed, revocations widen and expire; and what
 * on_store_error makes of a full store on the request path; and the
 * verified-token cache (bounded, clock re-checked, revocation not cached). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "test_auth_util.h"

/* A nonce key that lands in shard `shard` (the last byte picks it). */
static void key_for(unsigned char k[AUTH_NONCE_KEY_LEN], int id, int shard)
{
    memset(k, 0, AUTH_NONCE_KEY_LEN);
    memcpy(k, &id, sizeof(id));
    k[AUTH_NONCE_KEY_LEN - 1] = (unsigned char)shard;
}

static void test_nonce_seen_until_expiry(void **state)
{
    (void)state;
    auth_stores_t *s = auth_stores_new(0, 0);
    unsigned char k[AUTH_NONCE_KEY_LEN];
    key_for(k, 1, 0);
    assert_int_equal(auth_nonce_insert(s, k, 1000, 700), AUTH_STORE_NEW);
    assert_int_equal(auth_nonce_insert(s, k, 1000, 700), AUTH_STORE_SEEN);
    assert_int_equal(auth_nonce_insert(s, k, 1000, 1000), AUTH_STORE_SEEN); /* last second */
    assert_int_equal(auth_nonce_insert(s, k, 1500, 1001), AUTH_STORE_NEW);  /* expired: new */
    assert_int_equal(auth_stores_nonce_count(s), 1);
    auth_stores_free(s);
}

static void test_nonce_bounded(void **state)
{
    (void)state;
    /* 32 entries over 16 shards: 2 per shard. */
    auth_stores_t *s = auth_stores_new(32, 0);
    unsigned char k[AUTH_NONCE_KEY_LEN];
    for (int i = 0; i < 2; i++) {
        key_for(k, i, 3);
        assert_int_equal(auth_nonce_insert(s, k, 100, 10), AUTH_STORE_NEW);
    }
    key_for(k, 2, 3);
    assert_int_equal(auth_nonce_insert(s, k, 100, 10), AUTH_STORE_FULL);
    /* Full means refused, not evicted: the first two are still seen. */
    key_for(k, 0, 3);
    assert_int_equal(auth_nonce_insert(s, k, 100, 50), AUTH_STORE_SEEN);
    /* Other shards are unaffected. */
    key_for(k, 2, 4);
    assert_int_equal(auth_nonce_insert(s, k, 100, 10), AUTH_STORE_NEW);
    /* Once they expire, room again, and the count shows the sweep. */
    key_for(k, 2, 3);
    assert_int_equal(auth_nonce_insert(s, k, 300, 101), AUTH_STORE_NEW);
    assert_int_equal(auth_stores_nonce_count(s), 2); /* one per shard 3 and 4 */
    /* Fill the whole store; every shard refuses its third. */
    auth_stores_t *t = auth_stores_new(32, 0);
    int news = 0, fulls = 0;
    for (int i = 0; i < 48; i++) {
        key_for(k, i, i % 16);
        auth_store_rc_t rc = auth_nonce_insert(t, k, 100, 10);
        news += rc == AUTH_STORE_NEW;
        fulls += rc == AUTH_STORE_FULL;
    }
    assert_int_equal(news, 32);
    assert_int_equal(fulls, 16);
    assert_int_equal(auth_stores_nonce_count(t), 32);
    auth_stores_free(t);
    auth_stores_free(s);
}

static void test_nonce_out_of_order_expiry(void **state)
{
    (void)state;
    /* Expiries follow request timestamps, so they arrive out of order: a
     * long-lived head must not keep a full shard from reclaiming the
     * expired entries behind it. */
    auth_stores_t *s = auth_stores_new(32, 0);
    unsigned char k[AUTH_NONCE_KEY_LEN];
    key_for(k, 0, 5);
    assert_int_equal(auth_nonce_insert(s, k, 1000, 10), AUTH_STORE_NEW);
    key_for(k, 1, 5);
    assert_int_equal(auth_nonce_insert(s, k, 50, 10), AUTH_STORE_NEW);
    key_for(k, 2, 5);
    assert_int_equal(auth_nonce_insert(s, k, 1000, 40), AUTH_STORE_FULL);
    assert_int_equal(auth_nonce_insert(s, k, 1000, 60), AUTH_STORE_NEW);
    key_for(k, 0, 5);
    assert_int_equal(auth_nonce_insert(s, k, 1000, 60), AUTH_STORE_SEEN);
    auth_stores_free(s);
}

static void test_revocations(void **state)
{
    (void)state;
    auth_stores_t *s = auth_stores_new(0, 3);
    auth_claims_t c = {.sub = "alice", .jti = "j1", .iat = 100, .has_iat = true, .exp = 1000};
    assert_false(auth_rev_check(s, &c, 150));
    assert_int_equal(auth_rev_add(s, AUTH_REV_JTI, "j1", 2, 150, 2000, 150), 0);
    assert_true(auth_rev_check(s, &c, 150));
    assert_true(auth_rev_check(s, &c, 2000));
    assert_false(auth_rev_check(s, &c, 2001)); /* expired with the token */
    c.jti[1] = '2';
    assert_false(auth_rev_check(s, &c, 150));
    /* By sub: iat <= cut-off is revoked; a later revocation moves it on,
     * an earlier one never moves it back. */
    assert_int_equal(auth_rev_add(s, AUTH_REV_SUB, "alice", 5, 200, 3000, 200), 0);
    c.iat = 200;
    assert_true(auth_rev_check(s, &c, 250));
    c.iat = 201;
    assert_false(auth_rev_check(s, &c, 250));
    assert_int_equal(auth_rev_add(s, AUTH_REV_SUB, "alice", 5, 300, 3100, 300), 0);
    assert_true(auth_rev_check(s, &c, 350));
    assert_int_equal(auth_rev_add(s, AUTH_REV_SUB, "alice", 5, 100, 3100, 300), 0);
    assert_true(auth_rev_check(s, &c, 350));
    c.has_iat = false; /* cannot prove it is newer */
    c.iat = 999;
    assert_true(auth_rev_check(s, &c, 350));
    assert_int_equal(auth_stores_revocation_count(s), 2);
    /* Capacity 3: a third entry fits, a fourth is refused ... */
    assert_int_equal(auth_rev_add(s, AUTH_REV_JTI, "j3", 2, 300, 3000, 300), 0);
    assert_int_equal(auth_rev_add(s, AUTH_REV_JTI, "j4", 2, 300, 3000, 300), -1);
    /* ... until entries expire (j1's at 2000). */
    assert_int_equal(auth_rev_add(s, AUTH_REV_JTI, "j4", 2, 2500, 5000, 2500), 0);
    assert_int_equal(auth_stores_revocation_count(s), 3);
    /* Oversized ids are refused. */
    char big[AUTH_SUB_MAX + 2];
    memset(big, 'x', sizeof(big));
    assert_int_equal(auth_rev_add(s, AUTH_REV_SUB, big, sizeof(big), 1, 2, 1), -1);
    assert_int_equal(auth_rev_add(s, AUTH_REV_JTI, "", 0, 1, 2, 1), -1);
    auth_stores_free(s);
}

static uint64_t fallback_count(const char *check, const char *action)
{
    size_t n;
    char *txt = sl_metrics_render(&n);
    char pat[128];
    snprintf(pat, sizeof(pat), "sluice_auth_store_fallback_total{check=\"%s\",action=\"%s\"} ",
             check, action);
    const char *p = strstr(txt, pat);
    uint64_t v = p ? strtoull(p + strlen(pat), NULL, 10) : 0;
    free(txt);
    return v;
}

static void test_full_store_policy(void **state)
{
    (void)state;
    char *tok = t_good_token("frank", "jti-frank");
    for (int allow = 0; allow < 2; allow++) {
        tconf_t t;
        tconf_default(&t);
        t.c.on_store_error.nonces = allow ? CONF_STORE_ERROR_ALLOW : CONF_STORE_ERROR_DENY;
        auth_stores_t *st = auth_stores_new(16, 0); /* one nonce per shard */
        auth_t *a = t_auth(&t, st);
        assert_non_null(a);
        uint64_t before = fallback_count("nonces", allow ? "allow" : "deny");
        /* Enough distinct nonces that some shard must overflow. */
        int ok = 0, unavailable = 0;
        for (int i = 0; i < 40; i++) {
            treq_t q;
            char nonce[40];
            snprintf(nonce, sizeof(nonce), "policy-nonce-%04d-aaa", i);
            treq_make(&q, a, tok, T_NOW, nonce);
            auth_reason_t r = t_check(a, &q.r, T_NOW);
            ok += r == AUTH_OK;
            unavailable += r == AUTH_R_STORE_UNAVAILABLE;
        }
        assert_true(auth_stores_nonce_count(st) <= 16);
        if (allow) {
            assert_int_equal(ok, 40);
        } else {
            assert_int_equal(ok + unavailable, 40);
            assert_true(unavailable >= 24);
        }
        uint64_t after = fallback_count("nonces", allow ? "allow" : "deny");
        assert_int_equal(after - before, (uint64_t)(40 - (int)auth_stores_nonce_count(st)));
        auth_free(a);
        auth_stores_free(st);
    }
    free(tok);
    /* The 503 reply for it. */
    auth_http_reply_t rep;
    assert_int_equal(auth_reject_reply(AUTH_R_STORE_UNAVAILABLE, &rep), 0);
    assert_int_equal(rep.status, 503);
    assert_string_equal(rep.www_authenticate, "");
    auth_http_reply_clear(&rep);
}

static void test_token_cache(void **state)
{
    (void)state;
    /* The cache on its own: bounded, oldest out first, expiry honoured. */
    auth_tcache_t *c = auth_tcache_new(16); /* 2 per shard */
    auth_tcache_val_t v, out;
    memset(&v, 0, sizeof(v));
    unsigned char k[32];
    memset(k, 0, sizeof(k));
    for (int i = 0; i < 5; i++) {
        k[0] = (unsigned char)i; /* all in shard 0 (k[31] picks it) */
        snprintf(v.claims.sub, sizeof(v.claims.sub), "u%d", i);
        auth_tcache_put(c, k, &v, 1000, 10);
    }
    assert_int_equal(auth_tcache_count(c), 2);
    k[0] = 0;
    assert_false(auth_tcache_get(c, k, 10, &out)); /* evicted */
    k[0] = 4;
    assert_true(auth_tcache_get(c, k, 10, &out));
    assert_string_equal(out.claims.sub, "u4");
    assert_false(auth_tcache_get(c, k, 1000, &out)); /* expired, and dropped */
    assert_int_equal(auth_tcache_count(c), 1);
    auth_tcache_free(c);
    auth_tcache_free(NULL);

    /* Through the request path. */
    tconf_t t;
    tconf_default(&t);
    auth_stores_t *st = auth_stores_new(0, 0);
    auth_t *a = t_auth(&t, st);
    char *tok = t_good_token("gus", "jti-gus");
    treq_t q;
    treq_make(&q, a, tok, T_NOW, "tcache-nonce-000001");
    assert_int_equal(auth_tcache_count(a->tcache), 0);
    assert_int_equal(t_check(a, &q.r, T_NOW), AUTH_OK);
    assert_int_equal(auth_tcache_count(a->tcache), 1);
    /* A hit gives the same claims, signing key and answers. */
    treq_make(&q, a, tok, T_NOW + 1, "tcache-nonce-000002");
    auth_result_t res;
    assert_int_equal(auth_check(a, NULL, &q.r, T_NOW + 1, &res, NULL, NULL, NULL), AUTH_DONE);
    assert_int_equal(res.reason, AUTH_OK);
    assert_string_equal(res.claims.sub, "gus");
    assert_string_equal(res.claims.jti, "jti-gus");
    assert_string_equal(res.claims.kid, "k1");
    assert_int_equal(auth_tcache_count(a->tcache), 1);
    q.sig[3] = q.sig[3] == 'a' ? 'b' : 'a';
    assert_int_equal(t_check(a, &q.r, T_NOW + 1), AUTH_R_SIG_MISMATCH);
    /* The clock still rules a cached token, and revocation is not cached. */
    treq_make(&q, a, tok, T_NOW + 930, "tcache-nonce-000003");
    assert_int_equal(t_check(a, &q.r, T_NOW + 930), AUTH_R_TOKEN_EXPIRED);
    treq_make(&q, a, tok, T_NOW + 2, "tcache-nonce-000004");
    assert_int_equal(auth_revoke_jti(a, "jti-gus", T_NOW + 2), 0);
    assert_int_equal(t_check(a, &q.r, T_NOW + 2), AUTH_R_TOKEN_REVOKED);
    /* Other bytes are another token: a changed signature is checked. */
    char *bad = strdup(tok);
    char *s = strrchr(bad, '.') + 5;
    *s = *s == 'A' ? 'B' : 'A';
    treq_make(&q, a, bad, T_NOW + 3, "tcache-nonce-000005");
    assert_int_equal(t_check(a, &q.r, T_NOW + 3), AUTH_R_TOKEN_SIGNATURE);
    /* Refused tokens are not cached. */
    assert_int_equal(auth_tcache_count(a->tcache), 1);
    free(bad);
    free(tok);
    auth_free(a);
    auth_stores_free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nonce_seen_until_expiry),   cmocka_unit_test(test_nonce_bounded),
        cmocka_unit_test(test_nonce_out_of_order_expiry), cmocka_unit_test(test_revocations),
        cmocka_unit_test(test_full_store_policy),         cmocka_unit_test(test_token_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
