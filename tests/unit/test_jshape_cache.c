/* Unit tests of common/jshape.c's cache of shapes (sl_jshape_cache_t): it
 * holds at most nslots shapes and never touches a slot past them; a learn
 * replaces an empty slot first, then the least recently used (a hit is a
 * use); the gate lets every miss of a run of gate_run learn and then
 * exactly one in gate_every, and a hit starts the run over; the data of a
 * slot is zeroed once and kept; a thread's caches are freed at its exit
 * (drop counted here; the shapes' bytes are LSan's under SANITIZE=1). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>

#include "common/jshape.h"

typedef struct tdata {
    int tag;
    char *owned; /* freed by tdrop */
} tdata_t;

static atomic_int tdrops;

static void tdrop(void *p)
{
    tdata_t *d = p;
    free(d->owned);
    atomic_fetch_add(&tdrops, 1);
}

/* A text of one shape per k: {"k<k>":"<v>"} with the string's interior a
 * hole, so every v matches the shape of its k. */
static size_t text(char *b, size_t cap, int k, const char *v, sl_jspan_t *hole)
{
    int pre = snprintf(b, cap, "{\"k%d\":\"", k);
    size_t n = (size_t)snprintf(b, cap, "{\"k%d\":\"%s\"}", k, v);
    *hole = (sl_jspan_t){(uint32_t)pre, (uint32_t)strlen(v)};
    return n;
}

/* The caller's part: the slot whose shape matches, told as a hit or a miss. */
static int lookup(sl_jshape_cache_t *c, int k, const char *v)
{
    char b[64];
    sl_jspan_t h, out[1];
    size_t n = text(b, sizeof b, k, v, &h);
    for (unsigned i = 0; i < c->nslots; i++) {
        if (!sl_jshape_empty(&c->slot[i].sh) && sl_jshape_match(&c->slot[i].sh, b, n, out)) {
            assert_int_equal(out[0].len, strlen(v));
            sl_jshape_cache_hit(c, i);
            return (int)i;
        }
    }
    sl_jshape_cache_miss(c);
    return -1;
}

static int learn(sl_jshape_cache_t *c, int k)
{
    char b[64];
    sl_jspan_t h;
    uint8_t kind = SL_JHOLE_STR;
    size_t n = text(b, sizeof b, k, "x", &h);
    int i = sl_jshape_cache_take(c);
    assert_true(i >= 0 && (unsigned)i < c->nslots);
    if (c->dsz) {
        tdata_t *d = c->slot[i].data;
        assert_non_null(d);
        free(d->owned);
        d->tag = k;
        d->owned = strdup("owned");
    }
    assert_int_equal(sl_jshape_cache_set(c, (unsigned)i, b, n, &h, &kind, 1), 0);
    return i;
}

static unsigned kept(const sl_jshape_cache_t *c)
{
    unsigned n = 0;
    for (unsigned i = 0; i < SL_JSHAPE_CACHE_SLOTS; i++) {
        if (!sl_jshape_empty(&c->slot[i].sh)) {
            assert_true(i < c->nslots); /* nothing past the bound */
            n++;
        }
    }
    return n;
}

static void test_bound_and_lru(void **state)
{
    (void)state;
    sl_jshape_cache_t c = SL_JSHAPE_CACHE_INIT(3, 100, 1, 0, NULL);
    /* empty slots first: three shapes in three slots */
    int s1 = learn(&c, 1), s2 = learn(&c, 2), s3 = learn(&c, 3);
    assert_true(s1 != s2 && s2 != s3 && s1 != s3);
    assert_int_equal(kept(&c), 3);
    assert_int_equal(lookup(&c, 1, "hello"), s1);
    assert_int_equal(lookup(&c, 3, ""), s3);
    /* 2 is the least recently used: 4 takes its slot */
    assert_int_equal(learn(&c, 4), s2);
    assert_int_equal(kept(&c), 3);
    assert_int_equal(lookup(&c, 2, "x"), -1);
    assert_int_equal(lookup(&c, 4, "yy"), s2);
    assert_int_equal(lookup(&c, 1, "z"), s1);
    /* now 3 is the oldest use, then 4, then 1 */
    assert_int_equal(learn(&c, 5), s3);
    assert_int_equal(learn(&c, 6), s2);
    assert_int_equal(lookup(&c, 1, "w"), s1);
    assert_int_equal(lookup(&c, 4, "w"), -1);
    for (int k = 10; k < 30; k++) {
        learn(&c, k);
        assert_int_equal(kept(&c), 3);
    }
    /* the last three learnt are the three kept */
    assert_true(lookup(&c, 29, "a") >= 0 && lookup(&c, 28, "a") >= 0 && lookup(&c, 27, "a") >= 0);
    assert_int_equal(lookup(&c, 26, "a"), -1);
    assert_int_equal(c.st.hits, 8);
    assert_int_equal(c.st.misses, 3);
    assert_int_equal(c.st.learns, 26);
    sl_jshape_cache_clear(&c);
    assert_int_equal(kept(&c), 0);
    assert_int_equal(c.st.hits + c.st.misses + c.st.learns, 0);
    assert_int_equal(lookup(&c, 29, "a"), -1);
    sl_jshape_cache_clear(&c);
}

/* K = 3 misses in a row all learn, then exactly 1 in M = 4; a hit starts
 * over. */
static void test_gate(void **state)
{
    (void)state;
    sl_jshape_cache_t c = SL_JSHAPE_CACHE_INIT(2, 3, 4, 0, NULL);
    static const char want[] = "111000100010001000100";
    for (int round = 0; round < 2; round++) {
        char got[sizeof want] = {0};
        for (size_t i = 0; i + 1 < sizeof want; i++) {
            bool g = sl_jshape_cache_gate(&c);
            assert_int_equal(lookup(&c, 1000 + (int)i + 100 * round, "v"), -1);
            got[i] = g ? '1' : '0';
        }
        if (strcmp(got, want) != 0)
            fail_msg("round %d: gate %s, want %s", round, got, want);
        /* a hit ends the run */
        learn(&c, 7);
        assert_true(lookup(&c, 7, "again") >= 0);
        assert_int_equal(c.run, 0);
    }
    assert_int_equal(c.st.misses, 2 * (sizeof want - 1));
    sl_jshape_cache_clear(&c);
}

/* A slot's data: zeroed when first taken, kept (for the caller to reuse)
 * when the slot is taken again, dropped and freed by clear. */
static void test_data(void **state)
{
    (void)state;
    atomic_store(&tdrops, 0);
    sl_jshape_cache_t c = SL_JSHAPE_CACHE_INIT(2, 4, 4, sizeof(tdata_t), tdrop);
    int i = sl_jshape_cache_take(&c);
    assert_true(i >= 0);
    tdata_t *d = c.slot[i].data;
    assert_non_null(d);
    assert_int_equal(d->tag, 0);
    assert_null(d->owned);
    /* taken but not set: empty, matches nothing, taken again first */
    assert_int_equal(lookup(&c, 1, "a"), -1);
    assert_int_equal(learn(&c, 1), i);
    assert_int_equal(((tdata_t *)c.slot[i].data)->tag, 1);
    int j = learn(&c, 2);
    assert_true(j != i);
    assert_int_equal(learn(&c, 3), i); /* the older */
    assert_ptr_equal(c.slot[i].data, d);
    assert_int_equal(d->tag, 3);
    sl_jshape_cache_clear(&c);
    assert_int_equal(atomic_load(&tdrops), 2);
    assert_null(c.slot[i].data);
}

static _Thread_local sl_jshape_cache_t tcache_a =
    SL_JSHAPE_CACHE_INIT(4, 16, 16, sizeof(tdata_t), tdrop);
static _Thread_local sl_jshape_cache_t tcache_b =
    SL_JSHAPE_CACHE_INIT(2, 16, 16, sizeof(tdata_t), tdrop);

static void *thread_learns(void *arg)
{
    int n = *(int *)arg;
    for (int k = 0; k < n; k++)
        learn(&tcache_a, k);
    learn(&tcache_b, 1);
    learn(&tcache_b, 2);
    learn(&tcache_b, 3);
    return NULL;
}

/* A thread's caches are freed when it exits: every slot's data dropped
 * (and under LSan, no shape's bytes left). */
static void test_thread_exit(void **state)
{
    (void)state;
    atomic_store(&tdrops, 0);
    int n = 6;
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&t[i], NULL, thread_learns, &n), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    /* per thread: 4 slots of a, 2 of b */
    assert_int_equal(atomic_load(&tdrops), 3 * (4 + 2));
    /* this thread's own caches are untouched by the others' */
    assert_int_equal(kept(&tcache_a), 0);
    assert_int_equal(tcache_a.st.learns, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bound_and_lru),
        cmocka_unit_test(test_gate),
        cmocka_unit_test(test_data),
        cmocka_unit_test(test_thread_exit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
