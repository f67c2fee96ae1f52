/*
 * libevent's 1 KiB chains kept per thread (gateway/wio.c, gw_wio_mem_*): a
 * freed 1 KiB block is the next one handed out (LIFO), other sizes go to
 * malloc and free untouched, the stack is bounded, the tick gives back half
 * of what went unused since the tick before and all of it when asked, and,
 * installed into libevent (not under ASan), a small write to an evbuffer
 * takes its chain from the stack and gives it back when drained: the chain
 * size the cache is keyed on is libevent's; the HTTP/1 parser's head blocks
 * go through the same stack.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/buffer.h>

#include "gateway/gw_wio.h"
#include "gateway/http1.h"

static bool installed;

static int empty(void **state)
{
    (void)state;
    (void)gw_wio_mem_tick(true);
    assert_int_equal(gw_wio_mem_cached(), 0);
    return 0;
}

static void test_lifo_reuse(void **state)
{
    (void)state;
    void *a = gw_wio_mem_malloc(1024);
    void *b = gw_wio_mem_malloc(1024);
    assert_non_null(a);
    assert_non_null(b);
    memset(a, 0xa5, 1024);
    gw_wio_mem_free(a);
    gw_wio_mem_free(b);
    assert_int_equal(gw_wio_mem_cached(), 2);
    assert_ptr_equal(gw_wio_mem_malloc(1024), b); /* the last freed first */
    assert_ptr_equal(gw_wio_mem_malloc(1024), a);
    assert_int_equal(gw_wio_mem_cached(), 0);
    gw_wio_mem_free(a);
    gw_wio_mem_free(b);
    assert_int_equal(gw_wio_mem_cached(), 2);
}

static void test_other_sizes_pass(void **state)
{
    (void)state;
    void *small = gw_wio_mem_malloc(100);
    void *big = gw_wio_mem_malloc(2048);
    assert_non_null(small);
    assert_non_null(big);
    gw_wio_mem_free(small);
    gw_wio_mem_free(big);
    gw_wio_mem_free(NULL);
    assert_int_equal(gw_wio_mem_cached(), 0);
    /* a kept block serves 1 KiB only; realloc of one is an ordinary realloc */
    void *c = gw_wio_mem_malloc(1024);
    gw_wio_mem_free(c);
    void *d = gw_wio_mem_malloc(512);
    assert_int_equal(gw_wio_mem_cached(), 1);
    d = gw_wio_mem_realloc(d, 4096);
    assert_non_null(d);
    gw_wio_mem_free(d);
    assert_int_equal(gw_wio_mem_cached(), 1);
}

static void test_bounded(void **state)
{
    (void)state;
    enum { N = GW_WIO_CHAINS_MAX + 100 };
    void **p = calloc(N, sizeof(*p));
    assert_non_null(p);
    for (size_t i = 0; i < N; i++)
        assert_non_null(p[i] = gw_wio_mem_malloc(1024));
    for (size_t i = 0; i < N; i++)
        gw_wio_mem_free(p[i]);
    assert_int_equal(gw_wio_mem_cached(), GW_WIO_CHAINS_MAX);
    free(p);
}

static void test_tick_halves_unused(void **state)
{
    (void)state;
    void *p[100];
    for (size_t i = 0; i < 100; i++)
        p[i] = gw_wio_mem_malloc(1024);
    for (size_t i = 0; i < 100; i++)
        gw_wio_mem_free(p[i]);
    /* all 100 came back after the tick before (empty: low-water 0): in use */
    assert_int_equal(gw_wio_mem_tick(false), 0);
    assert_int_equal(gw_wio_mem_cached(), 100);
    /* none taken since: half of them go, then half of the rest */
    assert_int_equal(gw_wio_mem_tick(false), 50);
    assert_int_equal(gw_wio_mem_cached(), 50);
    /* 30 taken and given back between ticks: 20 stayed unused */
    for (size_t i = 0; i < 30; i++)
        p[i] = gw_wio_mem_malloc(1024);
    for (size_t i = 0; i < 30; i++)
        gw_wio_mem_free(p[i]);
    assert_int_equal(gw_wio_mem_tick(false), 10);
    assert_int_equal(gw_wio_mem_cached(), 40);
    assert_int_equal(gw_wio_mem_tick(true), 40);
    assert_int_equal(gw_wio_mem_cached(), 0);
}

static void test_libevent_chains(void **state)
{
    (void)state;
    if (!installed)
        skip(); /* ASan: not installed */
    struct evbuffer *b = evbuffer_new();
    assert_non_null(b);
    size_t before = gw_wio_mem_cached();
    assert_int_equal(evbuffer_add(b, "hello", 5), 0);
    assert_int_equal(evbuffer_drain(b, 5), 0); /* the chain is freed */
    assert_int_equal(gw_wio_mem_cached(), before + 1);
    assert_int_equal(evbuffer_add(b, "again", 5), 0); /* and taken again */
    assert_int_equal(gw_wio_mem_cached(), before);
    evbuffer_free(b);
    assert_int_equal(gw_wio_mem_cached(), before + 1);
}

/* The HTTP/1 parser's head blocks (http1.c's block_take): a head that fits
 * 1 KiB takes a kept block and gives it back at reset, the next head takes
 * the same block and reads only its own bytes; a larger head gets a block
 * of its own size (under ASan a 1 KiB block for it would be an overflow)
 * that is freed, not kept. */
static void feed_head(gw_http_parser_t *p, const char *in)
{
    size_t used;
    assert_int_equal(gw_http_feed(p, in, strlen(in), &used, NULL, NULL), GW_HTTP_HEAD);
    assert_int_equal(used, strlen(in));
}

static void test_head_blocks(void **state)
{
    (void)state;
    gw_http_parser_t *p = gw_http_parser_new(GW_HTTP_REQUEST, NULL);
    char big[1600], in[2048];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    snprintf(in, sizeof in, "GET /a HTTP/1.1\r\nHost: one\r\nX-Long: %.200s\r\n\r\n", big);
    feed_head(p, in);
    assert_int_equal(gw_wio_mem_cached(), 0); /* none kept yet: malloc's */
    gw_http_parser_reset(p);
    assert_int_equal(gw_wio_mem_cached(), 1);

    feed_head(p, "GET /b HTTP/1.1\r\nHost: two\r\nX-K: v\r\n\r\n");
    assert_int_equal(gw_wio_mem_cached(), 0); /* the kept one */
    const gw_http_msg_t *m = gw_http_msg(p);
    assert_int_equal(m->nheaders, 2);
    assert_string_equal(m->host, "two");
    assert_string_equal(gw_http_header_find(m, "x-k")->value, "v");
    assert_null(gw_http_header_find(m, "x-long"));
    gw_http_parser_reset(p);
    assert_int_equal(gw_wio_mem_cached(), 1);

    snprintf(in, sizeof in, "GET /c HTTP/1.1\r\nHost: three\r\nX-Long: %s\r\n\r\n", big);
    feed_head(p, in);
    assert_int_equal(gw_wio_mem_cached(), 1); /* its own block */
    m = gw_http_msg(p);
    assert_int_equal(gw_http_header_find(m, "x-long")->value_len, sizeof(big) - 1);
    assert_string_equal(gw_http_header_find(m, "x-long")->value, big);
    assert_true(gw_http_parser_held(p) > 1024);
    gw_http_parser_reset(p);
    assert_int_equal(gw_wio_mem_cached(), 1);
    assert_int_equal(gw_http_parser_held(p), 0);
    gw_http_parser_free(p);
}

int main(void)
{
    installed = gw_wio_mem_init(); /* before any other libevent call */
    if (!installed)
        gw_wio_mem_prepare();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_lifo_reuse, empty),
        cmocka_unit_test_setup(test_other_sizes_pass, empty),
        cmocka_unit_test_setup(test_bounded, empty),
        cmocka_unit_test_setup(test_tick_halves_unused, empty),
        cmocka_unit_test_setup(test_libevent_chains, empty),
        cmocka_unit_test_setup(test_head_blocks, empty),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    (void)gw_wio_mem_tick(true);
    return rc;
}
