/* Unit tests of the in-process stores: nonces seen until they expire,
 * capacity is a hard bound (a full store refuses, never evicts), expired
 * entries are reclaimed, revocations widen and expire; and what
 * on_store_error makes of a full store on the request path; and the
 * verified-token cache (bounded, clock re-checked, revocation not cached). */
#include <setjmp.h>
#include <stdarg.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include <cmocka.h>

#include "test_auth_util.h"

/* A nonce key that lands in shard `shard` (the last byte picks it). */
static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* A store key as the product makes them (hash_key: uniform bytes), distinct
 * for distinct ids (the first half is a bijection of id), in the given
 * shard (the last byte). Keys of a few changing bytes would test a weaker
 * placement than the store's (one half the same for all keys: a random
 * secret that leaves that half's product short of low bits made a small
 * table refuse a key about once in 400 runs); the test about keys equal in
 * 8 bytes makes its own. */
static void key_for(unsigned char k[AUTH_NONCE_KEY_LEN], int id, int shard)
{
    uint64_t a = mix64((uint64_t)(uint32_t)id), b = mix64(a);
    memcpy(k, &a, sizeof(a));
    memcpy(k + 8, &b, sizeof(b));
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
    /* 32 entries for the whole store, whatever shard keys fall in: a skewed
     * key (a client grinding nonces onto one shard) cannot fill a shard
     * while the others have room. */
    auth_stores_t *s = auth_stores_new(32, 0);
    unsigned char k[AUTH_NONCE_KEY_LEN];
    for (int i = 0; i < 32; i++) {
        key_for(k, i, 3);
        assert_int_equal(auth_nonce_insert(s, k, 100, 10), AUTH_STORE_NEW);
    }
    key_for(k, 32, 3);
    assert_int_equal(auth_nonce_insert(s, k, 100, 10), AUTH_STORE_FULL);
    key_for(k, 32, 4); /* full is full in every shard */
    assert_int_equal(auth_nonce_insert(s, k, 100, 10), AUTH_STORE_FULL);
    /* Full means refused, not evicted: the first ones are still seen, and
     * a replay is still told apart from a full store. */
    key_for(k, 0, 3);
    assert_int_equal(auth_nonce_insert(s, k, 100, 50), AUTH_STORE_SEEN);
    assert_int_equal(auth_stores_nonce_live(s), 32);
    /* Expiry 100 is in the bucket [96, 104): room again from 104 on, all
     * at once, and the dead entries are freed a few per call. */
    key_for(k, 40, 4);
    assert_int_equal(auth_nonce_insert(s, k, 300, 103), AUTH_STORE_FULL);
    assert_int_equal(auth_nonce_insert(s, k, 300, 104), AUTH_STORE_NEW);
    assert_int_equal(auth_stores_nonce_live(s), 1);
    for (int i = 0; i < 8; i++) {
        key_for(k, 100 + i, 3);
        assert_int_equal(auth_nonce_insert(s, k, 300, 104), AUTH_STORE_NEW);
    }
    assert_int_equal(auth_stores_nonce_count(s), 9); /* the 32 dead ones freed */
    assert_int_equal(auth_stores_nonce_live(s), 9);
    auth_stores_free(s);

    /* The capacity can change (a reload): lower refuses until enough
     * expire, nothing is dropped. */
    auth_stores_t *t = auth_stores_new(64, 0);
    for (int i = 0; i < 48; i++) {
        key_for(k, i, i % 16);
        assert_int_equal(auth_nonce_insert(t, k, 1000, 10), AUTH_STORE_NEW);
    }
    auth_stores_set_nonce_capacity(t, 16);
    assert_int_equal(auth_stores_nonce_capacity(t), 16);
    key_for(k, 99, 0);
    assert_int_equal(auth_nonce_insert(t, k, 1000, 10), AUTH_STORE_FULL);
    key_for(k, 5, 5);
    assert_int_equal(auth_nonce_insert(t, k, 1000, 10), AUTH_STORE_SEEN);
    auth_stores_free(t);
}

static void test_nonce_out_of_order_expiry(void **state)
{
    (void)state;
    /* Expiries follow request timestamps, so they arrive out of order: a
     * long-lived entry inserted first must not keep the expired ones
     * behind it from being reclaimed. */
    auth_stores_t *s = auth_stores_new(2, 0);
    unsigned char k[AUTH_NONCE_KEY_LEN];
    key_for(k, 0, 5);
    assert_int_equal(auth_nonce_insert(s, k, 1000, 10), AUTH_STORE_NEW);
    key_for(k, 1, 9);
    assert_int_equal(auth_nonce_insert(s, k, 50, 10), AUTH_STORE_NEW);
    key_for(k, 2, 5);
    assert_int_equal(auth_nonce_insert(s, k, 1000, 40), AUTH_STORE_FULL);
    /* 50 is in [48, 56): reclaimed at 56 */
    assert_int_equal(auth_nonce_insert(s, k, 1000, 55), AUTH_STORE_FULL);
    assert_int_equal(auth_nonce_insert(s, k, 1000, 56), AUTH_STORE_NEW);
    key_for(k, 0, 5);
    assert_int_equal(auth_nonce_insert(s, k, 1000, 60), AUTH_STORE_SEEN);
    /* An entry found expired (its bucket not over yet) is absent. */
    key_for(k, 1, 9);
    assert_int_equal(auth_nonce_insert(s, k, 1000, 60), AUTH_STORE_FULL);
    auth_stores_free(s);
}

/* Long idle spells, a wall clock that steps back, expiries beyond what the
 * ring can hold: the accounting stays exact. */
static void test_nonce_clock_edges(void **state)
{
    (void)state;
    auth_stores_t *s = auth_stores_new(100, 0);
    unsigned char k[AUTH_NONCE_KEY_LEN];
    int64_t now = T_NOW;
    for (int i = 0; i < 50; i++) {
        key_for(k, i, i % 16);
        assert_int_equal(auth_nonce_insert(s, k, now + 600, now), AUTH_STORE_NEW);
    }
    /* a day later: every bucket over, whatever turn of the ring; shards
     * nobody touched are looked at when the store seems full */
    now += 86400;
    for (int i = 0; i < 100; i++) {
        key_for(k, 1000 + i, 1);
        assert_int_equal(auth_nonce_insert(s, k, now + 600, now), AUTH_STORE_NEW);
    }
    key_for(k, 1100, 7);
    assert_int_equal(auth_nonce_insert(s, k, now + 600, now), AUTH_STORE_FULL);
    assert_int_equal(auth_stores_nonce_live(s), 100);
    auth_stores_set_nonce_capacity(s, 200);
    for (int i = 0; i < 99; i++) {
        key_for(k, 1000 + i, 1);
        assert_int_equal(auth_nonce_insert(s, k, now + 600, now + 600), AUTH_STORE_SEEN);
    }
    key_for(k, 1099, 1); /* one expired by lookup: out of its bucket */
    assert_int_equal(auth_nonce_insert(s, k, now + 1200, now + 601), AUTH_STORE_NEW);
    assert_int_equal(auth_stores_nonce_live(s), 100);
    now += 1300; /* all of them over */
    key_for(k, 1000, 1);
    assert_int_equal(auth_nonce_insert(s, k, now + 600, now), AUTH_STORE_NEW);
    assert_int_equal(auth_stores_nonce_live(s), 1);
    /* the clock steps back 20 minutes; entries go in buckets the cursor has
     * passed, expired ones found by lookup come out of the right list */
    int64_t back = now - 1200;
    for (int i = 0; i < 40; i++) {
        key_for(k, 2000 + i, 1);
        assert_int_equal(auth_nonce_insert(s, k, back + 30, back), AUTH_STORE_NEW);
    }
    for (int i = 0; i < 40; i++) {
        key_for(k, 2000 + i, 1);
        assert_int_equal(auth_nonce_insert(s, k, back + 100, back + 40), AUTH_STORE_NEW);
    }
    assert_int_equal(auth_stores_nonce_live(s), 41);
    assert_true(auth_stores_nonce_count(s) <= 41 + 150);
    /* 2 hours ahead cannot be kept (a window is at most 1 h) */
    key_for(k, 3000, 2);
    assert_int_equal(auth_nonce_insert(s, k, now + 4 * 3600, now), AUTH_STORE_FULL);
    /* a clock a century away from the store's first (expiries are kept
     * as 32-bit offsets from it): refused, never stored wrong */
    const int64_t century = 3155760000LL;
    key_for(k, 3002, 2);
    assert_int_equal(auth_nonce_insert(s, k, now + century + 300, now + century), AUTH_STORE_FULL);
    assert_int_equal(auth_nonce_insert(s, k, now - century + 300, now - century), AUTH_STORE_FULL);
    /* already expired: nothing to remember */
    key_for(k, 3001, 2);
    assert_int_equal(auth_nonce_insert(s, k, now - 1, now), AUTH_STORE_NEW);
    assert_int_equal(auth_nonce_insert(s, k, now - 1, now), AUTH_STORE_NEW);
    auth_stores_free(s);
}

/* What a nonce costs: the capacity is nonce_memory / AUTH_NONCE_ENTRY_BYTES,
 * so that must cover the entry, the allocator's overhead and the table. */
/* The table hash reads only a key's first 8 bytes: keys equal there (one
 * chain, by construction) must still be told apart by their other bytes,
 * each remembered on its own and each a replay the second time. */
static void test_nonce_same_table_hash(void **state)
{
    (void)state;
    auth_stores_t *s = auth_stores_new(0, 0);
    unsigned char k[AUTH_NONCE_KEY_LEN];
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < 300; i++) {
            memset(k, 0xab, sizeof(k));
            k[8] = (unsigned char)(i & 0xff);
            k[9] = (unsigned char)(i >> 8);
            k[AUTH_NONCE_KEY_LEN - 1] = 3; /* one shard */
            assert_int_equal(auth_nonce_insert(s, k, T_NOW + 300, T_NOW),
                             pass == 0 ? AUTH_STORE_NEW : AUTH_STORE_SEEN);
        }
    }
    assert_int_equal(auth_stores_nonce_count(s), 300);
    assert_int_equal(auth_stores_nonce_live(s), 300);
    /* Past their expiry the same keys are new again (found, removed, re-added). */
    for (int i = 0; i < 300; i++) {
        memset(k, 0xab, sizeof(k));
        k[8] = (unsigned char)(i & 0xff);
        k[9] = (unsigned char)(i >> 8);
        k[AUTH_NONCE_KEY_LEN - 1] = 3;
        assert_int_equal(auth_nonce_insert(s, k, T_NOW + 700, T_NOW + 400), AUTH_STORE_NEW);
    }
    assert_int_equal(auth_stores_nonce_live(s), 300);
    auth_stores_free(s);
}

static void test_nonce_memory_per_entry(void **state)
{
    (void)state;
    struct mallinfo2 m0 = mallinfo2();
    auth_stores_t *s = auth_stores_new(200000, 0);
    unsigned char k[AUTH_NONCE_KEY_LEN];
    for (int i = 0; i < 200000; i++) {
        unsigned char d[32];
        assert_int_equal(auth_sha256(&i, sizeof(i), d), 0);
        memcpy(k, d, sizeof(k));
        assert_int_equal(auth_nonce_insert(s, k, T_NOW + 300, T_NOW), AUTH_STORE_NEW);
    }
    /* Tables this big are mapped directly (mallinfo2 does not see them):
     * their bytes are the store's own count. Just after a grow started,
     * both tables of a move are held, and the one before them may wait
     * for the tick to unmap it (1/2 + 1 + 2 lines for 3 nonces held: 75
     * bytes a nonce at most). */
    struct mallinfo2 m1 = mallinfo2();
    size_t used = (m1.uordblks + m1.hblkhd) - (m0.uordblks + m0.hblkhd);
    double moving = (double)(used + auth_stores_nonce_table_bytes(s)) / 200000.0;
    auth_stores_maintain(s, T_NOW); /* the moves under way end */
    m1 = mallinfo2();
    used = (m1.uordblks + m1.hblkhd) - (m0.uordblks + m0.hblkhd);
    double per = (double)(used + auth_stores_nonce_table_bytes(s)) / 200000.0;
    auth_stores_free(s);
#if defined(__SANITIZE_ADDRESS__)
    (void)per; /* ASan's allocator: mallinfo2 does not see it, and it pads */
    (void)moving;
#else
    print_message("nonce store: %.1f bytes per nonce (%.1f during moves; budget %d)\n", per, moving,
                  AUTH_NONCE_ENTRY_BYTES);
    assert_true(moving <= AUTH_NONCE_ENTRY_BYTES);
    assert_true(moving <= 75);
    /* docs/auth.md: 16-byte slots in tables 3/8 to 3/4 held, so at most
     * ~43 bytes a nonce (just after a table doubled) */
    assert_true(per <= 48);
    assert_true(per >= 16); /* the measure measured something: a slot */
#endif
}

/* A key of its own for each id (a SHA-256 prefix, as auth_nonce_key's). */
static void key_of(unsigned char k[AUTH_NONCE_KEY_LEN], long id)
{
    unsigned char d[32];
    assert_int_equal(auth_sha256(&id, sizeof(id), d), 0);
    memcpy(k, d, AUTH_NONCE_KEY_LEN);
}

/* A steady stream of nonces over many windows: tables that grow, entries
 * moved between their two lines, expired slots taken by new keys, time
 * buckets emptied across the ring. Every nonce must stay a replay until
 * its expiry, checked for all of them every 50 s; none is refused. */
static void test_nonce_replay_after_churn(void **state)
{
    (void)state;
    enum { PER_S = 150, WINDOW = 300, SECONDS = 1500 };
    auth_stores_t *s = auth_stores_new(200000, 0);
    unsigned char k[AUTH_NONCE_KEY_LEN];
    long id = 0;
    int64_t t0 = T_NOW;
    for (int64_t now = t0; now < t0 + SECONDS; now++) {
        for (int i = 0; i < PER_S; i++) {
            key_of(k, id++);
            /* timestamps up to 20 s in the past: expiries out of order */
            int64_t exp = now - (id % 21) + WINDOW;
            assert_int_equal(auth_nonce_insert(s, k, exp, now), AUTH_STORE_NEW);
        }
        if ((now - t0) % 50 != 49)
            continue;
        long replays = 0;
        for (long j = 0; j < id; j++) {
            int64_t sent = t0 + j / PER_S;
            int64_t exp = sent - (j + 1) % 21 + WINDOW;
            if (exp < now)
                continue;
            key_of(k, j);
            assert_int_equal(auth_nonce_insert(s, k, exp, now), AUTH_STORE_SEEN);
            replays++;
        }
        /* all of them in the first window, then a window's worth */
        assert_true(replays >= SL_MIN(id, (long)PER_S * (WINDOW - 21)));
    }
    /* what the buckets count is what was sent within a window and a bucket */
    size_t live = auth_stores_nonce_live(s);
    assert_true(live >= (size_t)PER_S * (WINDOW - 21));
    assert_true(live <= (size_t)PER_S * (WINDOW + AUTH_NONCE_BUCKET_S + 1));
    auth_stores_free(s);
}

/* Keys that all fall in one shard (a client grinding nonces) fill it up
 * to the whole store's capacity: the slots come from one table, moved
 * about, and every one of them is still a replay; then the store is full. */
static void test_nonce_one_shard_to_capacity(void **state)
{
    (void)state;
    enum { CAP = 5000 };
    auth_stores_t *s = auth_stores_new(CAP, 0);
    unsigned char k[AUTH_NONCE_KEY_LEN];
    for (int i = 0; i < CAP; i++) {
        key_of(k, i);
        k[AUTH_NONCE_KEY_LEN - 1] = 7;
        assert_int_equal(auth_nonce_insert(s, k, T_NOW + 300, T_NOW), AUTH_STORE_NEW);
    }
    key_of(k, CAP);
    assert_int_equal(auth_nonce_insert(s, k, T_NOW + 300, T_NOW), AUTH_STORE_FULL);
    for (int i = 0; i < CAP; i++) {
        key_of(k, i);
        k[AUTH_NONCE_KEY_LEN - 1] = 7;
        assert_int_equal(auth_nonce_insert(s, k, T_NOW + 300, T_NOW + 10), AUTH_STORE_SEEN);
    }
    assert_int_equal(auth_stores_nonce_live(s), CAP);
    auth_stores_free(s);
}

/* A nonce in its last second is still found by a thread whose clock reads
 * a second or two later: its slot is not given to another key until
 * NONCE_GRACE_S after its expiry (two threads' clocks differ by up to a
 * second). */
static void test_nonce_slot_grace(void **state)
{
    (void)state;
    auth_stores_t *s = auth_stores_new(64, 0);
    unsigned char k[AUTH_NONCE_KEY_LEN];
    /* fill one shard's lines with keys expiring at T_NOW + 10 */
    for (int i = 0; i < 40; i++) {
        key_for(k, i, 2);
        assert_int_equal(auth_nonce_insert(s, k, T_NOW + 10, T_NOW), AUTH_STORE_NEW);
    }
    /* a second past their expiry, new keys in the same shard ... */
    for (int i = 100; i < 124; i++) {
        key_for(k, i, 2);
        assert_int_equal(auth_nonce_insert(s, k, T_NOW + 300, T_NOW + 11), AUTH_STORE_NEW);
    }
    /* ... took no slot that a thread still at T_NOW + 10 needs */
    for (int i = 0; i < 40; i++) {
        key_for(k, i, 2);
        assert_int_equal(auth_nonce_insert(s, k, T_NOW + 10, T_NOW + 10), AUTH_STORE_SEEN);
    }
    auth_stores_free(s);
}

/* A time bucket emptied and then refilled under the same epoch (the wall
 * clock stepped back): an older entry of that epoch whose slot is taken
 * again must not take a count that belongs to the newer one. */
static void test_nonce_clock_back_recount(void **state)
{
    (void)state;
    auth_stores_t *s = auth_stores_new(100, 0);
    unsigned char k1[AUTH_NONCE_KEY_LEN], k2[AUTH_NONCE_KEY_LEN], k3[AUTH_NONCE_KEY_LEN];
    key_for(k1, 1, 1);
    key_for(k2, 2, 1);
    key_for(k3, 3, 1);
    assert_int_equal(auth_nonce_insert(s, k1, 1010, 1000),
                     AUTH_STORE_NEW); /* bucket [1008, 1016) */
    assert_int_equal(auth_nonce_insert(s, k3, 1400, 1100), AUTH_STORE_NEW); /* it is over */
    assert_int_equal(auth_stores_nonce_live(s), 1);
    assert_int_equal(auth_nonce_insert(s, k2, 1012, 1005), AUTH_STORE_NEW); /* back: refilled */
    assert_int_equal(auth_stores_nonce_live(s), 2);
    /* k1, expired, comes again: its slot is reused; k2 still counts */
    assert_int_equal(auth_nonce_insert(s, k1, 1300, 1013), AUTH_STORE_NEW);
    assert_int_equal(auth_stores_nonce_live(s), 3);
    assert_int_equal(auth_nonce_insert(s, k2, 1012, 1012), AUTH_STORE_SEEN);
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

static uint64_t reject_count(const char *reason)
{
    size_t n;
    char *txt = sl_metrics_render(&n);
    char pat[128];
    snprintf(pat, sizeof(pat), "sluice_auth_rejected_total{reason=\"%s\"} ", reason);
    const char *p = strstr(txt, pat);
    uint64_t v = p ? strtoull(p + strlen(pat), NULL, 10) : 0;
    free(txt);
    return v;
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

/* A full nonce store refuses with nonce_store_full (503, Retry-After),
 * whatever on_store_error says (that is about Redis): letting the request
 * through unremembered would let it be replayed. */
static void test_full_store_policy(void **state)
{
    (void)state;
    char *tok = t_good_token("frank", "jti-frank");
    for (int allow = 0; allow < 2; allow++) {
        tconf_t t;
        tconf_default(&t);
        t.c.on_store_error.nonces = allow ? CONF_STORE_ERROR_ALLOW : CONF_STORE_ERROR_DENY;
        auth_stores_t *st = auth_stores_new(16, 0);
        auth_t *a = t_auth(&t, st);
        assert_non_null(a);
        uint64_t fb0 = fallback_count("nonces", allow ? "allow" : "deny");
        uint64_t rej0 = reject_count("nonce_store_full");
        int ok = 0, full = 0;
        for (int i = 0; i < 40; i++) {
            treq_t q;
            char nonce[40];
            snprintf(nonce, sizeof(nonce), "policy-nonce-%04d-aaa", i);
            treq_make(&q, a, tok, T_NOW, nonce);
            auth_reason_t r = t_check(a, &q.r, T_NOW);
            ok += r == AUTH_OK;
            full += r == AUTH_R_NONCE_STORE_FULL;
        }
        assert_int_equal(ok, 16);
        assert_int_equal(full, 24);
        assert_int_equal(auth_stores_nonce_count(st), 16);
        assert_int_equal(fallback_count("nonces", allow ? "allow" : "deny"), fb0);
        assert_int_equal(reject_count("nonce_store_full"), rej0 + 24);
        auth_free(a);
        auth_stores_free(st);
    }
    free(tok);
    /* The 503 replies: Retry-After, no WWW-Authenticate. */
    auth_http_reply_t rep;
    assert_int_equal(auth_reject_reply(AUTH_R_NONCE_STORE_FULL, &rep), 0);
    assert_int_equal(rep.status, 503);
    assert_string_equal(rep.www_authenticate, "");
    assert_string_equal(rep.headers, "Retry-After: 8\r\n");
    assert_non_null(strstr(rep.body, "\"code\":\"nonce_store_full\""));
    assert_non_null(strstr(rep.body, "\"type\":\"server_error\""));
    auth_http_reply_clear(&rep);
    assert_int_equal(auth_reject_reply(AUTH_R_STORE_UNAVAILABLE, &rep), 0);
    assert_int_equal(rep.status, 503);
    assert_string_equal(rep.headers, "Retry-After: 1\r\n");
    auth_http_reply_clear(&rep);
    assert_int_equal(auth_reject_reply(AUTH_R_SIG_REPLAY, &rep), 0);
    assert_int_equal(rep.status, 401);
    assert_string_equal(rep.headers, "");
    auth_http_reply_clear(&rep);
}

/* nonce_memory from conf sets the capacity; the rate it sustains. */
static void test_nonce_memory_conf(void **state)
{
    (void)state;
    tconf_t t;
    tconf_default(&t);
    t.c.signing.nonce_memory = 1 << 20;
    auth_stores_t *st = auth_stores_new(16, 0);
    auth_t *a = t_auth(&t, st);
    assert_non_null(a);
    assert_int_equal(auth_stores_nonce_capacity(st), (1 << 20) / AUTH_NONCE_ENTRY_BYTES);
    assert_int_equal(auth_nonce_rate(8192, 300), 8192 / 308);
    assert_int_equal(auth_nonce_rate((128 << 20) / AUTH_NONCE_ENTRY_BYTES, 300), 3404);
    auth_free(a);
    auth_stores_free(st);
}

/* The cache's hash reads the signature's last 16 bytes: every one of them
 * counts, nothing before them does, and tokens with random signatures
 * spread evenly over the shards (top bits) and over uthash's buckets (low
 * bits). */
static void test_token_cache_hash(void **state)
{
    (void)state;
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    enum { N = 8192, SIG = 43 };
    const char *head = "eyJhbGciOiJIUzI1NiIsImtpZCI6ImsxIn0.eyJzdWIiOiJ1In0.";
    size_t hl = strlen(head);
    char tok[128];
    memcpy(tok, head, hl);
    uint64_t rnd = 0x243f6a8885a308d3u;
    unsigned shards[8] = {0}, buckets[256] = {0};
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < SIG; j++) {
            rnd ^= rnd << 13, rnd ^= rnd >> 7, rnd ^= rnd << 17;
            tok[hl + j] = b64[rnd & 63];
        }
        unsigned h = auth_tcache_hash(tok, hl + SIG);
        shards[(h >> 24) % 8]++;
        buckets[h & 255]++;
        if (i < 64) {
            /* any one of the last 16 bytes changes it, nothing before */
            for (size_t p = hl + SIG - 16; p < hl + SIG; p++) {
                char c = tok[p];
                tok[p] = c == 'A' ? 'B' : 'A';
                assert_int_not_equal(auth_tcache_hash(tok, hl + SIG), h);
                tok[p] = c;
            }
            char c = tok[hl + SIG - 17];
            tok[hl + SIG - 17] = c == 'A' ? 'B' : 'A';
            assert_int_equal(auth_tcache_hash(tok, hl + SIG), h);
            tok[hl + SIG - 17] = c;
        }
    }
    for (int i = 0; i < 8; i++) /* 1,024 expected: +-12 % is ~8 sigma */
        assert_in_range(shards[i], N / 8 - 128, N / 8 + 128);
    for (int i = 0; i < 256; i++) /* 32 expected */
        assert_in_range(buckets[i], 8, 64);
}

static void test_token_cache(void **state)
{
    (void)state;
    /* The cache on its own: bounded, oldest out first, expiry honoured. */
    auth_tcache_t *c = auth_tcache_new(16); /* 2 per shard */
    auth_tcache_val_t v, out;
    memset(&v, 0, sizeof(v));
    /* five tokens of one shard (the hash's top bits pick it) */
    char k[5][32];
    unsigned h[5];
    for (int i = 0, n = 0; i < 5; n++) {
        snprintf(k[i], sizeof(k[i]), "token-%d", n);
        h[i] = auth_tcache_hash(k[i], strlen(k[i]));
        if (i == 0 || (h[i] >> 24) % 8 == (h[0] >> 24) % 8)
            i++;
    }
    for (int i = 0; i < 5; i++) {
        snprintf(v.claims.sub, sizeof(v.claims.sub), "u%d", i);
        auth_tcache_put(c, k[i], strlen(k[i]), h[i], &v, 1000, 10);
    }
    assert_int_equal(auth_tcache_count(c), 2);
    assert_false(auth_tcache_get(c, k[0], strlen(k[0]), h[0], 10, &out.claims, out.signing_key,
                                 NULL)); /* evicted */
    assert_true(
        auth_tcache_get(c, k[4], strlen(k[4]), h[4], 10, &out.claims, out.signing_key, NULL));
    assert_string_equal(out.claims.sub, "u4");
    /* the bytes decide, not the hash: a prefix, or other bytes under the
     * same hash value, are not the token */
    assert_false(
        auth_tcache_get(c, k[4], strlen(k[4]) - 1, h[4], 10, &out.claims, out.signing_key, NULL));
    assert_false(auth_tcache_get(c, "token-x", 7, h[4], 10, &out.claims, out.signing_key, NULL));
    assert_false(auth_tcache_get(c, k[4], strlen(k[4]), h[4], 1000, &out.claims, out.signing_key,
                                 NULL)); /* expired, and dropped */
    assert_int_equal(auth_tcache_count(c), 1);
    /* a token longer than AUTH_TCACHE_TOKEN_MAX is not kept */
    char *big = malloc(AUTH_TCACHE_TOKEN_MAX + 2);
    memset(big, 'b', AUTH_TCACHE_TOKEN_MAX + 1);
    big[AUTH_TCACHE_TOKEN_MAX + 1] = '\0';
    unsigned bh = auth_tcache_hash(big, AUTH_TCACHE_TOKEN_MAX + 1);
    auth_tcache_put(c, big, AUTH_TCACHE_TOKEN_MAX + 1, bh, &v, 1000, 10);
    assert_false(auth_tcache_get(c, big, AUTH_TCACHE_TOKEN_MAX + 1, bh, 10, &out.claims,
                                 out.signing_key, NULL));
    assert_int_equal(auth_tcache_count(c), 1);
    free(big);
    auth_tcache_free(c);
    auth_tcache_free(NULL);

    /* The hash reads a token's tail (its signature): tokens that differ
     * only before it share a hash, and are still two entries, each found
     * by its own bytes only. */
    c = auth_tcache_new(64);
    const char *tail = "0123456789abcdefghijABCDEFGHIJ-_"; /* 32 bytes */
    char ta[80], tb[80], tc[80];
    snprintf(ta, sizeof(ta), "eyJhead-a.payload-a.%s", tail);
    snprintf(tb, sizeof(tb), "eyJhead-b.payload-b.%s", tail);
    snprintf(tc, sizeof(tc), "eyJhead-c.payload-c.%s", tail);
    unsigned ha = auth_tcache_hash(ta, strlen(ta));
    assert_int_equal(ha, auth_tcache_hash(tb, strlen(tb)));
    assert_int_not_equal(ha, auth_tcache_hash(ta, strlen(ta) - 1));
    snprintf(v.claims.sub, sizeof(v.claims.sub), "a");
    auth_tcache_put(c, ta, strlen(ta), ha, &v, 1000, 10);
    snprintf(v.claims.sub, sizeof(v.claims.sub), "b");
    auth_tcache_put(c, tb, strlen(tb), ha, &v, 1000, 10);
    assert_int_equal(auth_tcache_count(c), 2);
    assert_true(auth_tcache_get(c, ta, strlen(ta), ha, 10, &out.claims, out.signing_key, NULL));
    assert_string_equal(out.claims.sub, "a");
    assert_true(auth_tcache_get(c, tb, strlen(tb), ha, 10, &out.claims, out.signing_key, NULL));
    assert_string_equal(out.claims.sub, "b");
    assert_false(auth_tcache_get(c, tc, strlen(tc), ha, 10, &out.claims, out.signing_key, NULL));
    auth_tcache_free(c);

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
    /* A reload builds a new auth_t: its cache starts empty, and under a new
     * secret for k1 the token cached by the old one is refused, not hit. */
    setenv("T_TOKEN_SECRET2", "another-token-secret-0123456789abcdef0", 1);
    tconf_t t2;
    tconf_default(&t2);
    t2.keys[0].secret_env = "T_TOKEN_SECRET2";
    auth_t *a2 = t_auth(&t2, st);
    assert_non_null(a2);
    assert_int_equal(auth_tcache_count(a2->tcache), 0);
    treq_make(&q, a2, tok, T_NOW + 4, "tcache-nonce-000006");
    assert_int_equal(t_check(a2, &q.r, T_NOW + 4), AUTH_R_TOKEN_SIGNATURE);
    assert_int_equal(auth_tcache_count(a2->tcache), 0);
    auth_free(a2);
    free(bad);
    free(tok);
    auth_free(a);
    auth_stores_free(st);
}

/* ---- moves of a shard's table (grow, shrink), step by step ---- */

enum { MV_SHARD = 6 };

static void key_in(unsigned char k[AUTH_NONCE_KEY_LEN], long id)
{
    key_of(k, id);
    k[AUTH_NONCE_KEY_LEN - 1] = MV_SHARD;
}

/* Keys [first, last) of MV_SHARD are all replays at `now`. */
static void all_seen(auth_stores_t *s, long first, long last, int64_t exp, int64_t now)
{
    unsigned char k[AUTH_NONCE_KEY_LEN];
    for (long j = first; j < last; j++) {
        key_in(k, j);
        assert_int_equal(auth_nonce_insert(s, k, exp, now), AUTH_STORE_SEEN);
    }
}

/* Both tables of a move count against nonce_memory, and stay within it
 * (only MV_SHARD has tables). Returns the old lines left to move. */
static size_t moving_bytes(auth_stores_t *s)
{
    size_t old, left;
    size_t n = auth_nonce_test_lines(s, MV_SHARD, &old, &left);
    assert_int_equal(auth_stores_nonce_table_bytes(s), (n + old) * 64);
    assert_true(auth_stores_nonce_table_bytes(s) <=
                auth_stores_nonce_capacity(s) * AUTH_NONCE_ENTRY_BYTES);
    return left;
}

/* A grow and then a shrink of one shard's table, moved one line a step
 * (inserts pay nothing: only the test moves it): at every step every
 * nonce inserted before the move or during it is a replay, whichever table
 * it is in; a key found expired in the old table is new and then a
 * replay; a full store refuses without touching the move. */
static void test_nonce_move_step_by_step(void **state)
{
    (void)state;
    auth_stores_t *s = auth_stores_new(4000, 0);
    unsigned char k[AUTH_NONCE_KEY_LEN];
    const int64_t expA = T_NOW + 300, expB = T_NOW + 1000;
    long id = 0;
    size_t old = 0, left = 0;
    /* A: expire at T_NOW + 300 (ids from 40); B: 40 that outlive them */
    for (; id < 40; id++) {
        key_in(k, id);
        assert_int_equal(auth_nonce_insert(s, k, expB, T_NOW), AUTH_STORE_NEW);
    }
    while (id < 150 || old == 0) {
        key_in(k, id++);
        assert_int_equal(auth_nonce_insert(s, k, expA, T_NOW), AUTH_STORE_NEW);
        (void)auth_nonce_test_lines(s, MV_SHARD, &old, &left);
    }
    /* a grow has just started: 64 lines into 128, nothing moved yet */
    assert_int_equal(auth_nonce_test_lines(s, MV_SHARD, &old, &left), 128);
    assert_int_equal(old, 64);
    assert_int_equal(left, 64);
    auth_nonce_test_set_step(s, 0);
    long grow_start = id;
    int steps = 0;
    while ((left = moving_bytes(s)) > 0) {
        key_in(k, id++); /* inserted during the move: into the new table */
        assert_int_equal(auth_nonce_insert(s, k, expA, T_NOW), AUTH_STORE_NEW);
        all_seen(s, 0, 40, expB, T_NOW + 1);
        all_seen(s, 40, id, expA, T_NOW + 1);
        assert_true(auth_nonce_test_step(s, MV_SHARD, 1, T_NOW + 1));
        size_t o2, l2;
        (void)auth_nonce_test_lines(s, MV_SHARD, &o2, &l2);
        assert_true(l2 == left - 1 || (l2 == 0 && o2 == 0)); /* one line a step */
        steps++;
    }
    assert_int_equal(steps, 64);
    assert_true(id - grow_start == 64);
    assert_false(auth_nonce_test_step(s, MV_SHARD, 1, T_NOW + 1)); /* over */
    all_seen(s, 0, 40, expB, T_NOW + 2);
    all_seen(s, 40, id, expA, T_NOW + 2);
    assert_int_equal(auth_stores_nonce_table_bytes(s), 128 * 64);

    /* After A's expiry only B is held, 40 of 512 slots: the next insert
     * starts a shrink (to 32 lines: 3/8 held at most, an eighth at least). */
    const int64_t later = T_NOW + 400, expC = T_NOW + 900;
    long c = 100000;
    key_in(k, c++);
    assert_int_equal(auth_nonce_insert(s, k, expC, later), AUTH_STORE_NEW);
    assert_int_equal(auth_nonce_test_lines(s, MV_SHARD, &old, &left), 32);
    assert_int_equal(old, 128);
    assert_int_equal(auth_stores_nonce_live(s), 41);
    steps = 0;
    while ((left = moving_bytes(s)) > 0) {
        if (steps % 4 == 0) { /* (under 3/4 of the new 128 slots all along) */
            key_in(k, c++);
            assert_int_equal(auth_nonce_insert(s, k, expC, later), AUTH_STORE_NEW);
        }
        all_seen(s, 0, 40, expB, later);
        all_seen(s, 100000, c, expC, later);
        if (steps % 16 == 5) {
            /* an expired key of A, found (or not) in the old table: new,
             * then a replay, then a replay wherever the move puts it */
            key_in(k, 40 + steps);
            assert_int_equal(auth_nonce_insert(s, k, expC, later), AUTH_STORE_NEW);
            assert_int_equal(auth_nonce_insert(s, k, expC, later), AUTH_STORE_SEEN);
        }
        if (steps == 40) {
            /* full: refused at once, the move untouched, replays still told */
            size_t cap = auth_stores_nonce_capacity(s);
            auth_stores_set_nonce_capacity(s, auth_stores_nonce_live(s));
            key_in(k, 999999);
            assert_int_equal(auth_nonce_insert(s, k, expC, later), AUTH_STORE_FULL);
            size_t o2, l2;
            (void)auth_nonce_test_lines(s, MV_SHARD, &o2, &l2);
            assert_int_equal(l2, left);
            all_seen(s, 0, 40, expB, later);
            auth_stores_set_nonce_capacity(s, cap);
        }
        assert_true(auth_nonce_test_step(s, MV_SHARD, 1, later));
        steps++;
    }
    assert_int_equal(steps, 128);
    all_seen(s, 0, 40, expB, later + 1);
    all_seen(s, 100000, c, expC, later + 1);
    for (int j = 5; j < 128; j += 16) {
        key_in(k, 40 + j);
        assert_int_equal(auth_nonce_insert(s, k, expC, later + 1), AUTH_STORE_SEEN);
    }
    assert_int_equal(auth_stores_nonce_live(s), 40 + (size_t)(c - 100000) + 8);
    auth_stores_free(s);
}

/* After a peak, once its nonces have expired, the tables shrink back to
 * their first size through the tick alone (no insert needed), and a
 * nonce that outlives the peak is still a replay after. */
static void test_nonce_shrink_after_peak(void **state)
{
    (void)state;
    auth_stores_t *s = auth_stores_new(200000, 0);
    unsigned char k[AUTH_NONCE_KEY_LEN];
    assert_int_equal(auth_stores_nonce_table_bytes(s), 0);
    for (long i = 0; i < 100000; i++) {
        key_of(k, i);
        assert_int_equal(auth_nonce_insert(s, k, T_NOW + (i == 7 ? 3000 : 60), T_NOW),
                         AUTH_STORE_NEW);
    }
    size_t peak = auth_stores_nonce_table_bytes(s);
    assert_true(peak >= 100000 * 16);    /* at least a slot each */
    auth_stores_maintain(s, T_NOW + 30); /* nothing expired: nothing shrinks */
    assert_true(auth_stores_nonce_table_bytes(s) >= 100000 * 16);
    auth_stores_maintain(s, T_NOW + 80); /* all but one expired */
    assert_int_equal(auth_stores_nonce_live(s), 1);
    /* every shard back to 8 lines of 64 bytes */
    assert_int_equal(auth_stores_nonce_table_bytes(s), 16 * 8 * 64);
    key_of(k, 7);
    assert_int_equal(auth_nonce_insert(s, k, T_NOW + 3000, T_NOW + 81), AUTH_STORE_SEEN);
    key_of(k, 8);
    assert_int_equal(auth_nonce_insert(s, k, T_NOW + 3000, T_NOW + 81), AUTH_STORE_NEW);
    auth_stores_free(s);

    /* One shard, deterministic: the 1,024-line table moved out by a grow
     * to 2,048 is left by the insert that ended the move for the tick to
     * unmap; the 6,145th insert starts the grow to 4,096. One tick frees
     * the parked table and ends the move: the tables are exactly the new
     * one; after expiry, 8 lines. */
    s = auth_stores_new(200000, 0);
    for (long i = 0; i < 6145; i++) {
        key_in(k, i);
        assert_int_equal(auth_nonce_insert(s, k, T_NOW + 60, T_NOW), AUTH_STORE_NEW);
    }
    size_t old, left;
    assert_int_equal(auth_nonce_test_lines(s, MV_SHARD, &old, &left), 4096);
    assert_int_equal(old, 2048);
    assert_int_equal(auth_stores_nonce_table_bytes(s), (4096 + 2048 + 1024) * 64);
    auth_stores_maintain(s, T_NOW + 1);
    assert_int_equal(auth_nonce_test_lines(s, MV_SHARD, &old, &left), 4096);
    assert_int_equal(old, 0);
    assert_int_equal(auth_stores_nonce_table_bytes(s), 4096 * 64);
    all_seen(s, 0, 6145, T_NOW + 60, T_NOW + 1);
    auth_stores_maintain(s, T_NOW + 80);
    assert_int_equal(auth_stores_nonce_table_bytes(s), 8 * 64);
    auth_stores_free(s);
}

/* A wall clock that steps back during a shrink makes the old table's
 * expired entries live again; the small new table cannot take them all
 * (the move stops). A key found expired in the old table is then new and
 * keeps its slot there: it must not need room in the new table (it was
 * refused, nonce_store_full, about once in 200,000 runs of
 * test_nonce_clock_edges). */
static void test_nonce_clock_back_in_shrink(void **state)
{
    (void)state;
    auth_stores_t *s = auth_stores_new(4000, 0);
    unsigned char k[AUTH_NONCE_KEY_LEN];
    for (long i = 0; i < 140; i++) { /* 64 lines */
        key_in(k, i);
        assert_int_equal(auth_nonce_insert(s, k, T_NOW + 100, T_NOW), AUTH_STORE_NEW);
    }
    for (long i = 1000; i < 1050; i++) { /* the keys looked up later */
        key_in(k, i);
        assert_int_equal(auth_nonce_insert(s, k, T_NOW + 40, T_NOW), AUTH_STORE_NEW);
    }
    while (auth_nonce_test_step(s, MV_SHARD, 1 << 20, T_NOW))
        ;
    size_t old, left;
    assert_int_equal(auth_nonce_test_lines(s, MV_SHARD, &old, &left), 64);
    auth_nonce_test_set_step(s, 0); /* only the test moves */
    key_in(k, 5000);                /* all expired: this insert starts a shrink */
    assert_int_equal(auth_nonce_insert(s, k, T_NOW + 300, T_NOW + 200), AUTH_STORE_NEW);
    assert_int_equal(auth_nonce_test_lines(s, MV_SHARD, &old, &left), 8);
    assert_int_equal(old, 64);
    /* 150 seconds back: the 140 are live again, 32 slots cannot take them */
    const int64_t back = T_NOW + 50;
    assert_true(auth_nonce_test_step(s, MV_SHARD, 1 << 20, back));
    (void)auth_nonce_test_lines(s, MV_SHARD, &old, &left);
    assert_true(left > 0);               /* the move is stuck */
    for (long i = 1000; i < 1050; i++) { /* expired at T_NOW + 40: new */
        key_in(k, i);
        assert_int_equal(auth_nonce_insert(s, k, back + 100, back), AUTH_STORE_NEW);
        assert_int_equal(auth_nonce_insert(s, k, back + 100, back), AUTH_STORE_SEEN);
    }
    all_seen(s, 1000, 1050, back + 100, back + 1);
    auth_stores_free(s);
}

/* The tick faults a table's pages in without the shard's lock, the table
 * pinned: a request that moves it out meanwhile must neither unmap it (the
 * tick is still using it) nor park it for the tick to forget; it is freed
 * when the pin ends, and counted in nonce_memory until then. One shard, as
 * above: a 2,048-line table being moved into 4,096 lines while the parked
 * 1,024-line one waits for the tick (so a request would unmap the 2,048
 * itself). */
static void test_nonce_pinned_table(void **state)
{
    (void)state;
    auth_stores_t *s = auth_stores_new(200000, 0);
    unsigned char k[AUTH_NONCE_KEY_LEN];
    long id = 0;
    for (; id < 6145; id++) {
        key_in(k, id);
        assert_int_equal(auth_nonce_insert(s, k, T_NOW + 60, T_NOW), AUTH_STORE_NEW);
    }
    size_t old, left;
    assert_int_equal(auth_nonce_test_lines(s, MV_SHARD, &old, &left), 4096);
    assert_int_equal(old, 2048);
    auth_nonce_test_pin(s, MV_SHARD, true);
    while (old) { /* inserts end the move */
        key_in(k, id++);
        assert_int_equal(auth_nonce_insert(s, k, T_NOW + 60, T_NOW), AUTH_STORE_NEW);
        (void)auth_nonce_test_lines(s, MV_SHARD, &old, &left);
    }
    assert_true(id < 7000);
    /* moved out, still held for the tick: the three tables counted */
    assert_int_equal(auth_stores_nonce_table_bytes(s), (4096 + 2048 + 1024) * 64);
    all_seen(s, 0, id, T_NOW + 60, T_NOW + 1);
    auth_nonce_test_pin(s, MV_SHARD, false); /* freed now */
    assert_int_equal(auth_stores_nonce_table_bytes(s), (4096 + 1024) * 64);
    auth_stores_maintain(s, T_NOW + 1); /* the parked one */
    assert_int_equal(auth_stores_nonce_table_bytes(s), 4096 * 64);
    all_seen(s, 0, id, T_NOW + 60, T_NOW + 1);
    auth_stores_free(s);
}

/* Threads inserting the same keys while tables grow (phase 1) and shrink
 * (phase 2), the tick running beside them as the gateway's does: every key
 * is new to exactly one thread, whatever table it was in when the others
 * looked; afterwards every key of phase 2 is a replay. */
enum { RACE_THREADS = 4, RACE_KEYS = 60000, RACE_KEYS2 = 3000 };

typedef struct race {
    auth_stores_t *s;
    unsigned char (*keys)[AUTH_NONCE_KEY_LEN];
    long n;
    int64_t now, exp;
    _Atomic int *news;
    _Atomic int done;
    int t;
} race_t;

typedef struct race_arg {
    race_t *r;
    int t;
} race_arg_t;

static void *race_insert(void *arg)
{
    race_arg_t *a = arg;
    race_t *r = a->r;
    for (long i = 0; i < r->n; i++) {
        long j = (i + a->t * r->n / RACE_THREADS) % r->n; /* each thread its own order */
        if (auth_nonce_insert(r->s, r->keys[j], r->exp, r->now) == AUTH_STORE_NEW)
            atomic_fetch_add(&r->news[j], 1);
    }
    return NULL;
}

static void *race_tick(void *arg)
{
    race_t *r = arg;
    while (!atomic_load(&r->done))
        auth_stores_maintain(r->s, r->now);
    return NULL;
}

static void race_run(race_t *r)
{
    pthread_t th[RACE_THREADS], tick;
    race_arg_t args[RACE_THREADS];
    for (long j = 0; j < r->n; j++)
        atomic_store(&r->news[j], 0);
    atomic_store(&r->done, 0);
    assert_int_equal(pthread_create(&tick, NULL, race_tick, r), 0);
    for (int t = 0; t < RACE_THREADS; t++) {
        args[t] = (race_arg_t){r, t};
        assert_int_equal(pthread_create(&th[t], NULL, race_insert, &args[t]), 0);
    }
    for (int t = 0; t < RACE_THREADS; t++)
        pthread_join(th[t], NULL);
    atomic_store(&r->done, 1);
    pthread_join(tick, NULL);
    long bad = 0;
    for (long j = 0; j < r->n; j++)
        bad += atomic_load(&r->news[j]) != 1;
    assert_int_equal(bad, 0);
}

static void test_nonce_moves_concurrent(void **state)
{
    (void)state;
    race_t r = {.s = auth_stores_new(400000, 0)};
    r.keys = malloc(sizeof(*r.keys) * RACE_KEYS);
    r.news = malloc(sizeof(*r.news) * RACE_KEYS);
    for (long j = 0; j < RACE_KEYS; j++)
        key_of(r.keys[j], j);
    /* phase 1: from empty to 60,000 held, every table growing */
    r.n = RACE_KEYS;
    r.now = T_NOW;
    r.exp = T_NOW + 60;
    race_run(&r);
    size_t grown = auth_stores_nonce_table_bytes(r.s);
    assert_true(grown >= RACE_KEYS * 16);
    /* phase 2: they have expired; new keys while the tables shrink */
    for (long j = 0; j < RACE_KEYS2; j++)
        key_of(r.keys[j], RACE_KEYS + j);
    r.n = RACE_KEYS2;
    r.now = T_NOW + 100;
    r.exp = T_NOW + 400;
    race_run(&r);
    auth_stores_maintain(r.s, r.now);
    assert_true(auth_stores_nonce_table_bytes(r.s) < grown / 8);
    for (long j = 0; j < RACE_KEYS2; j++)
        assert_int_equal(auth_nonce_insert(r.s, r.keys[j], r.exp, r.now + 1), AUTH_STORE_SEEN);
    assert_int_equal(auth_stores_nonce_live(r.s), RACE_KEYS2);
    free(r.keys);
    free((void *)r.news);
    auth_stores_free(r.s);
}

int main(void)
{
    /* SL_TEST_FILTER=test_nonce_clock_edges: one test alone, so a loop of
     * thousands of processes (each with its own random hash secret) can
     * look for a rare failure (bench/RESULTS.md, nonceflake). */
    const char *only = getenv("SL_TEST_FILTER");
    if (only)
        cmocka_set_test_filter(only);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nonce_seen_until_expiry),
        cmocka_unit_test(test_nonce_bounded),
        cmocka_unit_test(test_nonce_out_of_order_expiry),
        cmocka_unit_test(test_revocations),
        cmocka_unit_test(test_full_store_policy),
        cmocka_unit_test(test_token_cache),
        cmocka_unit_test(test_token_cache_hash),
        cmocka_unit_test(test_nonce_clock_edges),
        cmocka_unit_test(test_nonce_memory_per_entry),
        cmocka_unit_test(test_nonce_same_table_hash),
        cmocka_unit_test(test_nonce_memory_conf),
        cmocka_unit_test(test_nonce_replay_after_churn),
        cmocka_unit_test(test_nonce_one_shard_to_capacity),
        cmocka_unit_test(test_nonce_slot_grace),
        cmocka_unit_test(test_nonce_clock_back_recount),
        cmocka_unit_test(test_nonce_move_step_by_step),
        cmocka_unit_test(test_nonce_shrink_after_peak),
        cmocka_unit_test(test_nonce_pinned_table),
        cmocka_unit_test(test_nonce_clock_back_in_shrink),
        cmocka_unit_test(test_nonce_moves_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
