/* Unit tests of the request path with the in-process stores: signatures
 * (each canonical field altered in turn, the timestamp window's edges,
 * nonce syntax), replays (sequential, and 100 concurrent copies from
 * threads letting exactly one through), and revocation by jti and by sub. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <openssl/rand.h>

#include "test_auth_util.h"

#define NONCE_A "nonce-aaaaaaaaaaaaaaaa"

typedef struct fx {
    tconf_t t;
    auth_stores_t *st;
    auth_t *a;
    char *tok;
} fx_t;

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));
    tconf_default(&f->t);
    f->st = auth_stores_new(0, 0);
    f->a = t_auth(&f->t, f->st);
    f->tok = t_good_token("alice", "jti-alice-1");
    *state = f;
    return f->a ? 0 : -1;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    auth_free(f->a);
    auth_stores_free(f->st);
    free(f->tok);
    free(f);
    return 0;
}

static void test_signed_ok_and_replay(void **state)
{
    fx_t *f = *state;
    treq_t q;
    treq_make(&q, f->a, f->tok, T_NOW, NONCE_A);
    auth_result_t res;
    assert_int_equal(auth_check(f->a, NULL, &q.r, T_NOW, &res, NULL, NULL, NULL), AUTH_DONE);
    assert_int_equal(res.reason, AUTH_OK);
    assert_true(res.authenticated);
    assert_string_equal(res.claims.sub, "alice");
    assert_int_equal(auth_stores_nonce_count(f->st), 1);
    /* The same request again, and again later inside the window. */
    assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_R_SIG_REPLAY);
    assert_int_equal(t_check(f->a, &q.r, T_NOW + 300), AUTH_R_SIG_REPLAY);
    /* Past the window the timestamp refuses it before the store is asked. */
    assert_int_equal(t_check(f->a, &q.r, T_NOW + 301), AUTH_R_SIG_TIMESTAMP);
    /* The same nonce under another token (another jti) is another key. */
    char *tok2 = t_good_token("alice", "jti-alice-2");
    treq_t q2;
    treq_make(&q2, f->a, tok2, T_NOW, NONCE_A);
    assert_int_equal(t_check(f->a, &q2.r, T_NOW), AUTH_OK);
    free(tok2);
}

static void test_each_field_altered(void **state)
{
    fx_t *f = *state;
    treq_t q;
    int n = 0;
    /* Method, path, query, timestamp (still inside the window), nonce
     * (still well-formed), body, signature: each changed after signing. */
    for (int field = 0; field < 8; field++) {
        char nonce[40];
        snprintf(nonce, sizeof(nonce), "field-nonce-%04d-xxxx", n++);
        treq_make(&q, f->a, f->tok, T_NOW, nonce);
        switch (field) {
        case 0:
            snprintf(q.method, sizeof(q.method), "PUT");
            break;
        case 1:
            snprintf(q.path, sizeof(q.path), "/v1/embeddings?stream=true");
            break;
        case 2:
            snprintf(q.path, sizeof(q.path), "/v1/chat/completions?stream=false");
            break;
        case 3:
            snprintf(q.ts, sizeof(q.ts), "%lld", T_NOW + 1);
            break;
        case 4:
            snprintf(q.nonce, sizeof(q.nonce), "field-nonce-9999-xxxx");
            break;
        case 5:
            snprintf(q.body, sizeof(q.body), "{\"model\":\"m\",\"messages\":[1]}");
            break;
        case 6:
            q.sig[10] = q.sig[10] == 'a' ? 'b' : 'a';
            break;
        case 7:
            for (char *c = q.sig; *c; c++)
                if (*c >= 'a' && *c <= 'f')
                    *c = (char)(*c - 'a' + 'A'); /* uppercase hex is not ours */
            break;
        }
        treq_bind(&q);
        assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_R_SIG_MISMATCH);
    }
    /* A signature truncated, extended, or empty. */
    treq_make(&q, f->a, f->tok, T_NOW, "trunc-nonce-aaaaaaa");
    q.sig[63] = '\0';
    treq_bind(&q);
    assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_R_SIG_MISMATCH);
    treq_make(&q, f->a, f->tok, T_NOW, "trunc-nonce-aaaaaaa");
    strcat(q.sig, "0");
    treq_bind(&q);
    assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_R_SIG_MISMATCH);
    /* None of these consumed its nonce: the true request still passes. */
    treq_make(&q, f->a, f->tok, T_NOW, "trunc-nonce-aaaaaaa");
    assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_OK);
    /* A body hashed by the caller gives the same answer as the bytes. */
    treq_make(&q, f->a, f->tok, T_NOW, "prehashed-nonce-aaaa");
    unsigned char h[32];
    assert_int_equal(auth_sha256(q.body, strlen(q.body), h), 0);
    q.r.body_sha256 = h;
    q.r.body = NULL;
    assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_OK);
}

static void test_timestamp_window(void **state)
{
    fx_t *f = *state;
    treq_t q;
    static const long long offs[] = {-300, 300, -301, 301, -100000, 100000};
    static const auth_reason_t want[] = {AUTH_OK,
                                         AUTH_OK,
                                         AUTH_R_SIG_TIMESTAMP,
                                         AUTH_R_SIG_TIMESTAMP,
                                         AUTH_R_SIG_TIMESTAMP,
                                         AUTH_R_SIG_TIMESTAMP};
    for (size_t i = 0; i < SL_ARRAY_LEN(offs); i++) {
        char nonce[40];
        snprintf(nonce, sizeof(nonce), "window-nonce-%zu-aaaaa", i);
        /* Signed correctly for that timestamp; judged at T_NOW + 600 so the
         * token (iat T_NOW, 15 min) is valid throughout. */
        int64_t now = T_NOW + 600;
        treq_make(&q, f->a, f->tok, now + offs[i], nonce);
        assert_int_equal(t_check(f->a, &q.r, now), want[i]);
    }
    static const char *bad[] = {
        "",      "12a4",          "-1700000000", "+1700000000", " 1700000000", "1700000000 ",
        "1.7e9", "1700000000000", "0x6553f100"};
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++) {
        treq_make(&q, f->a, f->tok, T_NOW, "malformed-ts-aaaaaaa");
        snprintf(q.ts, sizeof(q.ts), "%s", bad[i]);
        treq_bind(&q);
        assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_R_SIG_TIMESTAMP);
    }
}

static void test_nonce_syntax(void **state)
{
    fx_t *f = *state;
    treq_t q;
    /* 15 characters, 65 characters, then characters outside the set. */
    static const char *bad[] = {"short-nonce-15c",
                                ("x23456789012345678901234567890123456789012345678901234567890123"
                                 "45"),
                                "has.a.dot.in.it.xxxxx",
                                "has=padding=aaaaaaaaa",
                                "has space aaaaaaaaaaa",
                                "non-ascii-\xc3\xa9-aaaaaaaa"};
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++) {
        /* Correctly signed, so only the syntax can refuse it. */
        treq_make(&q, f->a, f->tok, T_NOW, bad[i]);
        assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_R_SIG_NONCE);
    }
    static const char *good[] = {"exactly-16-chars",
                                 "x234567890123456789012345678901234567890123456789012345678901234",
                                 "AZaz09_-AZaz09_-"};
    for (size_t i = 0; i < SL_ARRAY_LEN(good); i++) {
        treq_make(&q, f->a, f->tok, T_NOW, good[i]);
        assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_OK);
    }
    /* Every byte value, anywhere in a nonce: exactly [A-Za-z0-9_-] pass. */
    for (int c = 0; c < 256; c++) {
        bool want = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_';
        for (size_t at = 0; at < 20; at += 19) {
            char n[20];
            memset(n, 'a', sizeof(n));
            n[at] = (char)c;
            assert_int_equal(auth_sig_check_nonce(n, sizeof(n)) == AUTH_OK, want);
        }
    }
}

static void test_missing_headers(void **state)
{
    fx_t *f = *state;
    treq_t q;
    for (int which = 0; which < 3; which++) {
        treq_make(&q, f->a, f->tok, T_NOW, "missing-hdr-aaaaaaa");
        if (which == 0)
            q.r.timestamp = NULL;
        else if (which == 1)
            q.r.nonce = NULL;
        else
            q.r.signature = NULL;
        assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_R_SIG_MISSING);
    }
    /* No token at all, a non-Bearer scheme, an empty bearer. */
    treq_make(&q, f->a, f->tok, T_NOW, "missing-hdr-aaaaaaa");
    q.r.authorization = NULL;
    assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_R_TOKEN_MISSING);
    snprintf(q.authz, sizeof(q.authz), "Basic YWxpY2U6cHc=");
    q.r.authorization = q.authz;
    q.r.authorization_len = strlen(q.authz);
    assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_R_TOKEN_MISSING);
    snprintf(q.authz, sizeof(q.authz), "Bearer   ");
    q.r.authorization_len = strlen(q.authz);
    assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_R_TOKEN_MISSING);
    /* The scheme is case-insensitive. */
    treq_make(&q, f->a, f->tok, T_NOW, "bearer-case-aaaaaaa");
    memcpy(q.authz, "bEARER", 6);
    assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_OK);
}

static void test_optional_modes(void **state)
{
    (void)state;
    tconf_t t;
    tconf_default(&t);
    t.c.signing.required = false;
    auth_stores_t *st = auth_stores_new(0, 0);
    auth_t *a = t_auth(&t, st);
    assert_non_null(a);
    char *tok = t_good_token("carol", "jti-carol");
    treq_t q;
    /* Signing optional: no signature headers passes ... */
    treq_make(&q, a, tok, T_NOW, "optional-aaaaaaaaaa");
    q.r.timestamp = q.r.nonce = q.r.signature = NULL;
    assert_int_equal(t_check(a, &q.r, T_NOW), AUTH_OK);
    /* ... a present but bad one does not. */
    treq_make(&q, a, tok, T_NOW, "optional-aaaaaaaaaa");
    q.sig[0] = q.sig[0] == '0' ? '1' : '0';
    assert_int_equal(t_check(a, &q.r, T_NOW), AUTH_R_SIG_MISMATCH);
    auth_free(a);
    /* Tokens optional too: anonymous passes, a bad token still fails. */
    t.c.required = false;
    a = t_auth(&t, st);
    assert_non_null(a);
    auth_request_t anon = {.method = "GET", .method_len = 3};
    auth_result_t res;
    assert_int_equal(auth_check(a, NULL, &anon, T_NOW, &res, NULL, NULL, NULL), AUTH_DONE);
    assert_int_equal(res.reason, AUTH_OK);
    assert_false(res.authenticated);
    treq_make(&q, a, tok, T_NOW, "optional-bbbbbbbbbb");
    assert_int_equal(t_check(a, &q.r, T_NOW + 3600), AUTH_R_TOKEN_EXPIRED);
    auth_free(a);
    /* Signatures required without tokens is refused as a config. */
    t.c.signing.required = true;
    char err[256];
    assert_null(auth_new(&t.c, st, err, sizeof(err)));
    free(tok);
    auth_stores_free(st);
}

static void test_revocation(void **state)
{
    fx_t *f = *state;
    treq_t q;
    char *t1 = t_good_token("dave", "jti-dave-1");
    char *t2 = t_good_token("dave", "jti-dave-2");
    char *t3 = t_good_token("erin", "jti-erin-1");
    treq_make(&q, f->a, t1, T_NOW, "rev-nonce-000000001");
    assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_OK);

    /* By jti: that token only. */
    assert_int_equal(auth_revoke_jti(f->a, "jti-dave-1", T_NOW + 10), 0);
    treq_make(&q, f->a, t1, T_NOW + 10, "rev-nonce-000000002");
    assert_int_equal(t_check(f->a, &q.r, T_NOW + 10), AUTH_R_TOKEN_REVOKED);
    treq_make(&q, f->a, t2, T_NOW + 10, "rev-nonce-000000003");
    assert_int_equal(t_check(f->a, &q.r, T_NOW + 10), AUTH_OK);
    /* A refused request does not burn its nonce: after the revocation
     * expires nothing else could reuse it anyway, but a revoked token's
     * requests must not fill the store. */
    size_t before = auth_stores_nonce_count(f->st);
    treq_make(&q, f->a, t1, T_NOW + 10, "rev-nonce-000000004");
    assert_int_equal(t_check(f->a, &q.r, T_NOW + 10), AUTH_R_TOKEN_REVOKED);
    assert_int_equal(auth_stores_nonce_count(f->st), before);

    /* By sub: every token of dave issued at or before the revocation. */
    assert_int_equal(auth_revoke_sub(f->a, "dave", T_NOW + 20), 0);
    treq_make(&q, f->a, t2, T_NOW + 20, "rev-nonce-000000005");
    assert_int_equal(t_check(f->a, &q.r, T_NOW + 20), AUTH_R_TOKEN_REVOKED);
    treq_make(&q, f->a, t3, T_NOW + 20, "rev-nonce-000000006");
    assert_int_equal(t_check(f->a, &q.r, T_NOW + 20), AUTH_OK);
    /* A token dave gets after the revocation works. */
    char *pay = t_claims("dave", "jti-dave-3", T_NOW + 21, T_NOW + 900);
    char *t4 = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET),
                          "{\"alg\":\"HS256\",\"kid\":\"k1\"}", pay);
    treq_make(&q, f->a, t4, T_NOW + 30, "rev-nonce-000000007");
    assert_int_equal(t_check(f->a, &q.r, T_NOW + 30), AUTH_OK);
    /* Issued in the same second as the revocation: revoked (safe side). */
    free(pay);
    free(t4);
    pay = t_claims("dave", "jti-dave-4", T_NOW + 20, T_NOW + 900);
    t4 = t_token_hs(T_TOKEN_SECRET, strlen(T_TOKEN_SECRET), "{\"alg\":\"HS256\",\"kid\":\"k1\"}",
                    pay);
    treq_make(&q, f->a, t4, T_NOW + 30, "rev-nonce-000000008");
    assert_int_equal(t_check(f->a, &q.r, T_NOW + 30), AUTH_R_TOKEN_REVOKED);
    assert_int_equal(auth_stores_revocation_count(f->st), 2);
    free(pay);
    free(t4);
    free(t1);
    free(t2);
    free(t3);
}

/* ---- 100 concurrent copies ------------------------------------------------------ */

#define COPIES 100

typedef struct race {
    const auth_t *a;
    const auth_request_t *r;
    pthread_barrier_t *go;
    auth_reason_t out;
} race_t;

static void *race_main(void *arg)
{
    race_t *x = arg;
    pthread_barrier_wait(x->go);
    auth_result_t res;
    if (auth_check(x->a, NULL, x->r, T_NOW, &res, NULL, NULL, NULL) != AUTH_DONE)
        abort();
    x->out = res.reason;
    return NULL;
}

static void test_concurrent_replays(void **state)
{
    fx_t *f = *state;
    /* Several rounds, each a fresh nonce: one round could pass by luck of
     * scheduling; twenty in a row with exactly one winner each do not. */
    for (int round = 0; round < 20; round++) {
        treq_t q;
        char nonce[40];
        snprintf(nonce, sizeof(nonce), "concurrent-nonce-%03d", round);
        treq_make(&q, f->a, f->tok, T_NOW, nonce);
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, COPIES);
        pthread_t th[COPIES];
        race_t x[COPIES];
        for (int i = 0; i < COPIES; i++) {
            x[i] = (race_t){.a = f->a, .r = &q.r, .go = &go, .out = AUTH_R__COUNT};
            assert_int_equal(pthread_create(&th[i], NULL, race_main, &x[i]), 0);
        }
        int ok = 0, replay = 0;
        for (int i = 0; i < COPIES; i++) {
            pthread_join(th[i], NULL);
            ok += x[i].out == AUTH_OK;
            replay += x[i].out == AUTH_R_SIG_REPLAY;
        }
        pthread_barrier_destroy(&go);
        assert_int_equal(ok, 1);
        assert_int_equal(replay, COPIES - 1);
    }
}

static void test_reject_metric(void **state)
{
    fx_t *f = *state;
    treq_t q;
    treq_make(&q, f->a, f->tok, T_NOW, "metric-nonce-aaaaaa");
    assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_OK);
    for (int i = 0; i < 3; i++)
        assert_int_equal(t_check(f->a, &q.r, T_NOW), AUTH_R_SIG_REPLAY);
    size_t n = 0;
    char *txt = sl_metrics_render(&n);
    assert_non_null(txt);
    /* Earlier tests replayed too; this one added 3 (cumulative counter). */
    const char *line = strstr(txt, "sluice_auth_rejected_total{reason=\"signature_replay\"} ");
    assert_non_null(line);
    long v = atol(line + strlen("sluice_auth_rejected_total{reason=\"signature_replay\"} "));
    assert_true(v >= 3);
    free(txt);
}

/* The HMAC and SHA-256 helpers reuse per-thread contexts (the HMAC one
 * keyed with the thread's last key): every answer must still equal
 * OpenSSL's one-shot result, whatever the order of keys, data and threads. */
static void mac_check(const char *key, const char *data)
{
    unsigned char got[32], want[32];
    size_t wl = 0;
    const void *parts[] = {data, data + strlen(data) / 2};
    size_t lens[] = {strlen(data) / 2, strlen(data) - strlen(data) / 2};
    assert_int_equal(auth_hmac_sha256(key, strlen(key), parts, lens, 2, got), 0);
    assert_non_null(EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, key, strlen(key),
                              (const unsigned char *)data, strlen(data), want, sizeof(want), &wl));
    assert_int_equal(wl, 32);
    assert_memory_equal(got, want, 32);
    unsigned char d1[32], d2[32];
    unsigned int dl = 0;
    assert_int_equal(auth_sha256(data, strlen(data), d1), 0);
    assert_int_equal(EVP_Digest(data, strlen(data), d2, &dl, EVP_sha256(), NULL), 1);
    assert_memory_equal(d1, d2, 32);
}

static void *mac_thread(void *arg)
{
    int id = *(int *)arg;
    char key[64], data[64];
    for (int i = 0; i < 2000; i++) {
        /* runs of the same key, then a change; keys shared across threads */
        snprintf(key, sizeof(key), "key-%d-0123456789abcdef0123456789", (i / 3 + id) % 5);
        snprintf(data, sizeof(data), "data %d of thread %d", i, id);
        mac_check(key, data);
    }
    return NULL;
}

static void test_hmac_contexts_reused(void **state)
{
    (void)state;
    mac_check("key-a-0123456789abcdef0123456789ab", "one");
    mac_check("key-a-0123456789abcdef0123456789ab", "one");   /* same key again */
    mac_check("key-b-0123456789abcdef0123456789ab", "two");   /* another */
    mac_check("key-a-0123456789abcdef0123456789ab", "three"); /* back */
    mac_check("key-a-0123456789abcdef0123456789abc", "four"); /* a prefix of it was last */
    char big[300];
    memset(big, 'k', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    mac_check(big, "a key over the kept length");
    mac_check(big, "twice");
    mac_check("", "empty key");
    pthread_t th[4];
    int ids[4];
    for (int i = 0; i < 4; i++) {
        ids[i] = i;
        assert_int_equal(pthread_create(&th[i], NULL, mac_thread, &ids[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
}

/* Keyed contexts kept per thread in a 2-way cache, the set picked by a
 * hint, a context found by its key's id or by the key: random keys (64 hex characters like a
 * signing key, or raw bytes of any length up to past the kept maximum) and random data, hints that
 * crowd many keys into one set (every lookup evicts) or spread them, must
 * each give OpenSSL's one-shot HMAC; and a signature computed through the
 * verifier's path (one contiguous canonical string, or pieces past its
 * buffer) must verify, and fail once one byte of the body changes. */
static void test_hmac_hint_cache_matches_one_shot(void **state)
{
    (void)state;
    enum { KEYS = 40, ROUNDS = 3000 };
    unsigned char keys[KEYS][200];
    size_t klen[KEYS];
    /* ids as auth_check has them: from auth_key_id_new, one per key. A
     * made-up id (k + 1) can be one the tests before this one registered
     * for another 64-byte signing key, still kept in its set: the id
     * lookup then rightly trusts it and MACs with that key. */
    uint64_t ids[KEYS];
    assert_int_equal(RAND_bytes((unsigned char *)keys, sizeof(keys)), 1);
    for (int i = 0; i < KEYS; i++) {
        ids[i] = auth_key_id_new();
        if (i % 2 == 0) { /* a signing key: hex text */
            sl_hex(keys[i], 32, (char *)keys[i]);
            klen[i] = 64;
        } else {
            klen[i] = 1 + keys[i][199] % 199; /* 1..199: some past the kept 128 */
        }
    }
    unsigned char data[600];
    int hits_checked = 0;
    for (int r = 0; r < ROUNDS; r++) {
        unsigned char rnd[4];
        assert_int_equal(RAND_bytes(rnd, sizeof(rnd)), 1);
        int k = rnd[0] % KEYS;
        size_t dl = (size_t)(rnd[1] | rnd[2] << 8) % sizeof(data);
        assert_int_equal(RAND_bytes(data, (int)sizeof(data)), 1);
        /* hint: by key (spread), one set for all (crowded), or random */
        unsigned hint = r % 3 == 0 ? (unsigned)k * 7u : r % 3 == 1 ? 5u : rnd[3];
        const void *parts[] = {data, data + dl / 3};
        size_t lens[] = {dl / 3, dl - dl / 3};
        unsigned char got[32], want[32];
        size_t wl = 0;
        /* by id (each key its own, as auth_check's) or by the key alone,
         * mixed in one set: a way rekeyed by key must lose its old id */
        uint64_t id = rnd[3] & 1 ? ids[k] : 0;
        assert_int_equal(auth_hmac_sha256_id(hint, id, keys[k], klen[k], parts, lens, 2, got), 0);
        assert_non_null(EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, keys[k], klen[k], data, dl,
                                  want, sizeof(want), &wl));
        assert_int_equal(wl, 32);
        assert_memory_equal(got, want, 32);
        hits_checked++;
    }
    assert_int_equal(hits_checked, ROUNDS);

    /* Through the verifier: a short canonical string and one over 1 KiB. */
    tconf_t t;
    tconf_default(&t);
    auth_stores_t *st = auth_stores_new(0, 0);
    auth_t *a = t_auth(&t, st);
    assert_non_null(a);
    char *tok = t_good_token("carol", "jti-carol-1");
    for (int longpath = 0; longpath < 2; longpath++) {
        for (int i = 0; i < 4; i++) {
            treq_t q;
            char nonce[64];
            snprintf(nonce, sizeof(nonce), "nonce-hint-%d-%d-xxxxxxxx", longpath, i);
            treq_make(&q, a, tok, T_NOW, nonce);
            if (longpath) {
                memset(q.path, 'p', sizeof(q.path) - 1);
                q.path[0] = '/';
                q.path[sizeof(q.path) - 1] = '\0';
            }
            char key[65];
            assert_int_equal(auth_signing_key(a, "jti-carol-1", strlen("jti-carol-1"), key), 0);
            treq_sign(&q, key);
            treq_bind(&q);
            unsigned hint = (unsigned)i * 3u;
            assert_int_equal(auth_sig_verify(key, hint, 0, &q.r, T_NOW, 300, NULL), AUTH_OK);
            q.body[3] ^= 1;
            assert_int_equal(auth_sig_verify(key, hint, 0, &q.r, T_NOW, 300, NULL),
                             AUTH_R_SIG_MISMATCH);
            q.body[3] ^= 1;
            q.sig[10] = q.sig[10] == 'a' ? 'b' : 'a';
            assert_int_equal(auth_sig_verify(key, hint, 0, &q.r, T_NOW, 300, NULL),
                             AUTH_R_SIG_MISMATCH);
        }
    }
    free(tok);
    auth_free(a);
    auth_stores_free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_signed_ok_and_replay, setup, teardown),
        cmocka_unit_test_setup_teardown(test_each_field_altered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timestamp_window, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nonce_syntax, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_headers, setup, teardown),
        cmocka_unit_test(test_optional_modes),
        cmocka_unit_test_setup_teardown(test_revocation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_replays, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reject_metric, setup, teardown),
        cmocka_unit_test(test_hmac_contexts_reused),
        cmocka_unit_test(test_hmac_hint_cache_matches_one_shot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
