/*
 * Large request bodies' blocks (gateway/body_store.c): the size bounds, a
 * block filled to its declared length and handed to an evbuffer as one
 * chain, reused once the last reference (including a shared one, as the
 * upstream output buffer holds it) is gone, and never reused before; a
 * block that grows with the bytes (each byte kept across the moves, the
 * room never past the declared length) and the bytes it holds counted.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/buffer.h>

#include "gateway/body_store.h"

static void test_bounds(void **state)
{
    (void)state;
    assert_null(gw_body_blk_new(0));
    assert_null(gw_body_blk_new(GW_BODY_STORE_MIN - 1));
    assert_null(gw_body_blk_new((size_t)GW_BODY_STORE_MAX + 1));
    gw_body_blk_t *b = gw_body_blk_new(GW_BODY_STORE_MIN);
    assert_non_null(b);
    size_t len = 99;
    assert_null(gw_body_blk_data(b, &len)); /* nothing in yet */
    assert_int_equal(len, 0);
    gw_body_blk_free(b);
    gw_body_blk_free(NULL);
    gw_body_store_drop();
}

/* A body of n bytes (a pattern), added in pieces of step. */
static gw_body_blk_t *fill(size_t n, size_t step, char seed)
{
    gw_body_blk_t *b = gw_body_blk_new(n);
    assert_non_null(b);
    char piece[4096];
    size_t at = 0;
    while (at < n) {
        size_t k = n - at < step ? n - at : step;
        for (size_t i = 0; i < k; i++)
            piece[i] = (char)(seed + (char)((at + i) % 61));
        assert_false(gw_body_blk_full(b));
        assert_true(gw_body_blk_add(b, piece, k));
        at += k;
    }
    assert_true(gw_body_blk_full(b));
    return b;
}

static void test_fill_give(void **state)
{
    (void)state;
    const size_t n = 100000;
    gw_body_blk_t *b = fill(n, 3000, 'a');
    size_t len;
    const char *d = gw_body_blk_data(b, &len);
    assert_non_null(d);
    assert_int_equal(len, n);
    struct evbuffer *buf = evbuffer_new();
    assert_non_null(buf);
    assert_int_equal(gw_body_blk_give(b, buf), 0);
    assert_int_equal(evbuffer_get_length(buf), n);
    struct evbuffer_iovec v[4];
    assert_int_equal(evbuffer_peek(buf, -1, NULL, v, 4), 1); /* one chain: no pull-up */
    assert_ptr_equal(v[0].iov_base, d);                      /* the block itself, no copy */
    const char *p = (const char *)evbuffer_pullup(buf, -1);
    assert_ptr_equal(p, d);
    for (size_t i = 0; i < n; i++)
        if (p[i] != (char)('a' + (char)(i % 61)))
            fail_msg("byte %zu", i);
    evbuffer_free(buf);
    gw_body_store_drop();
}

static void test_more_than_declared(void **state)
{
    (void)state;
    /* the parser frames the body by its length; past it the block refuses
     * (its room may be rounded up, the declared length is not) */
    gw_body_blk_t *b = fill(GW_BODY_STORE_MIN, 1000, 'k');
    assert_false(gw_body_blk_add(b, "z", 1));
    size_t room = 7;
    assert_null(gw_body_blk_tail(b, &room));
    assert_int_equal(room, 0);
    size_t len;
    assert_non_null(gw_body_blk_data(b, &len));
    assert_int_equal(len, GW_BODY_STORE_MIN);
    assert_true(gw_body_blk_full(b));
    gw_body_blk_free(b);
    gw_body_store_drop();
}

static void test_reuse_after_last_reference(void **state)
{
    (void)state;
    gw_body_store_drop();
    const size_t n = 200000;
    gw_body_blk_t *b = fill(n, 4096, 'A');
    size_t len;
    const char *first = gw_body_blk_data(b, &len);
    struct evbuffer *body = evbuffer_new(), *out = evbuffer_new();
    assert_non_null(body);
    assert_non_null(out);
    assert_int_equal(gw_body_blk_give(b, body), 0);
    /* the upstream's output shares the chain (proxy.c), then the request
     * ends: the block must live on while out still holds it */
    assert_int_equal(evbuffer_add_buffer_reference(out, body), 0);
    evbuffer_free(body);
    gw_body_blk_t *c = fill(n, 4096, 'B');
    const char *second = gw_body_blk_data(c, &len);
    assert_ptr_not_equal(second, first); /* not handed out while shared */
    const char *o = (const char *)evbuffer_pullup(out, -1);
    for (size_t i = 0; i < n; i++)
        if (o[i] != (char)('A' + (char)(i % 61)))
            fail_msg("shared byte %zu changed", i);
    evbuffer_free(out); /* the last reference: the block goes to the cache */
    gw_body_blk_t *d = gw_body_blk_new(n);
    assert_non_null(d);
    assert_true(gw_body_blk_add(d, "x", 1));
    assert_ptr_equal(gw_body_blk_data(d, &len), first); /* reused, no new mapping */
    gw_body_blk_free(d);
    gw_body_blk_free(c);
    gw_body_store_drop();
}

static void test_read_in_place(void **state)
{
    (void)state;
    /* conn.c reads straight into the tail; the add then only counts */
    gw_body_blk_t *b = gw_body_blk_new(50000);
    assert_non_null(b);
    assert_int_equal(gw_body_blk_left(b), 50000);
    size_t room;
    char *t = gw_body_blk_tail(b, &room);
    assert_non_null(t);
    assert_int_equal(room, 50000); /* small: sized for the body at once */
    memset(t, 'q', 30000);
    assert_true(gw_body_blk_add(b, t, 30000));
    assert_int_equal(gw_body_blk_left(b), 20000);
    assert_ptr_equal(gw_body_blk_tail(b, &room), t + 30000);
    assert_int_equal(room, 20000);
    assert_true(gw_body_blk_add(b, "rest", 4)); /* and a copy after it */
    char *t2 = gw_body_blk_tail(b, &room);
    assert_int_equal(room, 19996);
    memset(t2, 'z', 19996);
    assert_true(gw_body_blk_add(b, t2, 19996));
    assert_true(gw_body_blk_full(b));
    assert_int_equal(gw_body_blk_left(b), 0);
    size_t len;
    const char *d = gw_body_blk_data(b, &len);
    assert_int_equal(len, 50000);
    assert_true(d[0] == 'q' && d[29999] == 'q');
    assert_memory_equal(d + 30000, "rest", 4);
    assert_true(d[30004] == 'z' && d[49999] == 'z');
    gw_body_blk_free(b);
    gw_body_store_drop();
}

/* A body declared past GW_BODY_STORE_GROW: the block starts small and
 * doubles as the bytes come, in place and by copy, each byte kept across
 * the moves; the room offered never passes the declared length. */
static void test_grows_with_the_bytes(void **state)
{
    (void)state;
    gw_body_store_drop();
    const size_t n = 3 * 1024 * 1024 + 12345;
    gw_body_blk_t *b = gw_body_blk_new(n);
    assert_non_null(b);
    size_t held, idle;
    gw_body_store_bytes(&held, &idle);
    assert_int_equal(held, GW_BODY_STORE_READ); /* not n */
    size_t at = 0, reads = 0, grew = 0, room, last_room = 0;
    while (at < n) {
        char *t = gw_body_blk_tail(b, &room);
        assert_non_null(t);
        assert_true(room > 0 && room <= n - at);
        if (room > last_room)
            grew++;
        last_room = room;
        /* alternately in place (a read of up to 100,000 bytes) and by copy */
        size_t k = room < 100000 ? room : 100000;
        char piece[3000];
        if (reads++ % 2 == 0) {
            for (size_t i = 0; i < k; i++)
                t[i] = (char)('a' + (char)((at + i) % 59));
            assert_true(gw_body_blk_add(b, t, k));
        } else {
            k = k < sizeof(piece) ? k : sizeof(piece);
            for (size_t i = 0; i < k; i++)
                piece[i] = (char)('a' + (char)((at + i) % 59));
            assert_true(gw_body_blk_add(b, piece, k));
        }
        at += k;
        gw_body_store_bytes(&held, &idle);
        /* the room is at most twice what is in, and never the whole
         * declared length before the bytes need it */
        assert_true(held <= 2 * at + GW_BODY_STORE_READ);
    }
    assert_true(grew >= 5); /* 64 KiB .. 4 MiB */
    assert_true(gw_body_blk_full(b));
    assert_null(gw_body_blk_tail(b, &room));
    size_t len;
    const char *d = gw_body_blk_data(b, &len);
    assert_int_equal(len, n);
    for (size_t i = 0; i < n; i++)
        if (d[i] != (char)('a' + (char)(i % 59)))
            fail_msg("byte %zu", i);
    /* handed over: the one chain is the grown block */
    struct evbuffer *buf = evbuffer_new();
    assert_non_null(buf);
    assert_int_equal(gw_body_blk_give(b, buf), 0);
    assert_ptr_equal(evbuffer_pullup(buf, -1), d);
    evbuffer_free(buf);
    gw_body_store_bytes(&held, &idle);
    assert_int_equal(held, 0);
    assert_true(idle >= n); /* kept whole for the next body of its size */
    gw_body_blk_t *c = gw_body_blk_new(n);
    assert_non_null(c);
    assert_non_null(gw_body_blk_tail(c, &room));
    assert_int_equal(room, n); /* from the cache: all of it at once */
    gw_body_blk_free(c);
    gw_body_store_drop();
    gw_body_store_bytes(&held, &idle);
    assert_int_equal(held + idle, 0);
}

/* Many bodies declared at 8 MiB that have sent 100 KiB each hold about
 * that, not 8 MiB each (what the block took at head time before). */
static void test_slow_bodies_hold_what_they_sent(void **state)
{
    (void)state;
    gw_body_store_drop();
    enum { N = 50 };
    gw_body_blk_t *bs[N];
    static char piece[100 * 1024];
    memset(piece, 'p', sizeof(piece));
    for (size_t i = 0; i < N; i++) {
        bs[i] = gw_body_blk_new(8u << 20);
        assert_non_null(bs[i]);
        assert_true(gw_body_blk_add(bs[i], piece, sizeof(piece)));
    }
    size_t held, idle;
    gw_body_store_bytes(&held, &idle);
    assert_true(held <= N * (size_t)(128 * 1024));
    assert_true(held >= N * sizeof(piece));
    for (size_t i = 0; i < N; i++)
        gw_body_blk_free(bs[i]);
    gw_body_store_bytes(&held, &idle);
    assert_int_equal(held, 0);
    assert_true(idle <= (size_t)(8u << 20)); /* the cache's bound */
    gw_body_store_drop();
}

static void test_empty_give(void **state)
{
    (void)state;
    gw_body_blk_t *b = gw_body_blk_new(GW_BODY_STORE_MIN);
    assert_non_null(b);
    struct evbuffer *buf = evbuffer_new();
    assert_int_equal(gw_body_blk_give(b, buf), 0); /* nothing: the block goes back */
    assert_int_equal(evbuffer_get_length(buf), 0);
    evbuffer_free(buf);
    gw_body_store_drop();
}

static void test_cache_bound(void **state)
{
    (void)state;
    /* more idle blocks than the cache keeps: the rest are freed (ASan/LSan
     * would report a leak), the largest kept */
    gw_body_blk_t *bs[8];
    for (size_t i = 0; i < 8; i++) {
        bs[i] = gw_body_blk_new((i + 1) * 512 * 1024);
        assert_non_null(bs[i]);
    }
    for (size_t i = 0; i < 8; i++)
        gw_body_blk_free(bs[i]);
    /* a 3 MiB body finds a kept block of at least its size */
    gw_body_blk_t *b = gw_body_blk_new(3u << 20);
    assert_non_null(b);
    gw_body_blk_free(b);
    gw_body_store_drop();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_fill_give),
        cmocka_unit_test(test_more_than_declared),
        cmocka_unit_test(test_reuse_after_last_reference),
        cmocka_unit_test(test_read_in_place),
        cmocka_unit_test(test_grows_with_the_bytes),
        cmocka_unit_test(test_slow_bodies_hold_what_they_sent),
        cmocka_unit_test(test_empty_give),
        cmocka_unit_test(test_cache_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
