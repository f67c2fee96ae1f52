/*
 * OpenSSL's record buffers kept per thread (gateway/tls.c, gw_tls_mem_*): a
 * request of GW_TLS_BUF_MIN..GW_TLS_BUF_BYTES bytes is served from the
 * stack, last freed first, other sizes go to malloc and free untouched,
 * the stack is bounded, the tick gives back half of what went unused since
 * the tick before and all of it when asked, and, installed into OpenSSL
 * (not under ASan), a TLS connection with SSL_MODE_RELEASE_BUFFERS takes
 * its read and write buffers from the stack and gives them back after
 * each record: the sizes the stack is keyed on are OpenSSL's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/ssl.h>

#include "gateway/gw_tls.h"

#define F __FILE__, __LINE__

static bool installed;

static int empty(void **state)
{
    (void)state;
    (void)gw_tls_mem_tick(true);
    assert_int_equal(gw_tls_mem_cached(), 0);
    return 0;
}

static void test_lifo_reuse(void **state)
{
    (void)state;
    void *a = gw_tls_mem_malloc(16712, F);
    void *b = gw_tls_mem_malloc(16584, F);
    assert_non_null(a);
    assert_non_null(b);
    memset(a, 0xa5, GW_TLS_BUF_BYTES); /* every block holds the largest size */
    gw_tls_mem_free(a, F);
    gw_tls_mem_free(b, F);
    assert_int_equal(gw_tls_mem_cached(), 2);
    assert_ptr_equal(gw_tls_mem_malloc(GW_TLS_BUF_BYTES, F), b); /* the last freed first */
    assert_ptr_equal(gw_tls_mem_malloc(GW_TLS_BUF_MIN, F), a);
    assert_int_equal(gw_tls_mem_cached(), 0);
    gw_tls_mem_free(a, F);
    gw_tls_mem_free(b, F);
    assert_int_equal(gw_tls_mem_cached(), 2);
}

static void test_other_sizes_pass(void **state)
{
    (void)state;
    void *small = gw_tls_mem_malloc(100, F);
    void *under = gw_tls_mem_malloc(GW_TLS_BUF_MIN - 1, F);
    void *over = gw_tls_mem_malloc(GW_TLS_BUF_BYTES + 256, F);
    assert_non_null(small);
    assert_non_null(under);
    assert_non_null(over);
    gw_tls_mem_free(small, F);
    gw_tls_mem_free(under, F);
    gw_tls_mem_free(over, F);
    gw_tls_mem_free(NULL, F);
    assert_int_equal(gw_tls_mem_cached(), 0);
    /* a kept block serves its range only; realloc is an ordinary realloc */
    void *c = gw_tls_mem_malloc(16712, F);
    gw_tls_mem_free(c, F);
    void *d = gw_tls_mem_malloc(512, F);
    assert_int_equal(gw_tls_mem_cached(), 1);
    d = gw_tls_mem_realloc(d, 40000, F);
    assert_non_null(d);
    gw_tls_mem_free(d, F);
    assert_int_equal(gw_tls_mem_cached(), 1);
}

static void test_bounded(void **state)
{
    (void)state;
    enum { N = GW_TLS_BUFS_MAX + 10 };
    void *p[N];
    for (size_t i = 0; i < N; i++)
        assert_non_null(p[i] = gw_tls_mem_malloc(16712, F));
    for (size_t i = 0; i < N; i++)
        gw_tls_mem_free(p[i], F);
    assert_int_equal(gw_tls_mem_cached(), GW_TLS_BUFS_MAX);
}

static void test_tick_halves_unused(void **state)
{
    (void)state;
    void *p[40];
    for (size_t i = 0; i < 40; i++)
        p[i] = gw_tls_mem_malloc(16712, F);
    for (size_t i = 0; i < 40; i++)
        gw_tls_mem_free(p[i], F);
    /* all 40 came back after the tick before (empty: low-water 0): in use */
    assert_int_equal(gw_tls_mem_tick(false), 0);
    assert_int_equal(gw_tls_mem_cached(), 40);
    /* none taken since: half of them go */
    assert_int_equal(gw_tls_mem_tick(false), 20);
    assert_int_equal(gw_tls_mem_cached(), 20);
    /* 12 taken and given back between ticks: 8 stayed unused */
    for (size_t i = 0; i < 12; i++)
        p[i] = gw_tls_mem_malloc(16584, F);
    for (size_t i = 0; i < 12; i++)
        gw_tls_mem_free(p[i], F);
    assert_int_equal(gw_tls_mem_tick(false), 4);
    assert_int_equal(gw_tls_mem_cached(), 16);
    assert_int_equal(gw_tls_mem_tick(true), 16);
    assert_int_equal(gw_tls_mem_cached(), 0);
}

/* Moves what one side wrote to the other. */
static void pump(BIO *a, BIO *b)
{
    char buf[32768];
    int n;
    while ((n = BIO_read(a, buf, sizeof(buf))) > 0)
        assert_int_equal(BIO_write(b, buf, n), n);
}

static void test_openssl_record_buffers(void **state)
{
    (void)state;
    if (!installed)
        skip(); /* ASan: not installed */
    /* anonymous DH, TLS 1.2: no certificate needed for a real record layer */
    SSL_CTX *sc = SSL_CTX_new(TLS_server_method());
    SSL_CTX *cc = SSL_CTX_new(TLS_client_method());
    assert_non_null(sc);
    assert_non_null(cc);
    SSL_CTX *ctx[2] = {sc, cc};
    for (int i = 0; i < 2; i++) {
        SSL_CTX_set_security_level(ctx[i], 0);
        assert_int_equal(SSL_CTX_set_cipher_list(ctx[i], "ADH-AES128-GCM-SHA256:@SECLEVEL=0"), 1);
        SSL_CTX_set_max_proto_version(ctx[i], TLS1_2_VERSION);
        SSL_CTX_set_mode(ctx[i], SSL_MODE_RELEASE_BUFFERS);
    }
    assert_int_equal(SSL_CTX_set_dh_auto(sc, 1), 1);
    SSL *s = SSL_new(sc), *c = SSL_new(cc);
    BIO *s_in = BIO_new(BIO_s_mem()), *s_out = BIO_new(BIO_s_mem());
    BIO *c_in = BIO_new(BIO_s_mem()), *c_out = BIO_new(BIO_s_mem());
    SSL_set_bio(s, s_in, s_out);
    SSL_set_bio(c, c_in, c_out);
    SSL_set_accept_state(s);
    SSL_set_connect_state(c);
    for (int i = 0; i < 10 && !(SSL_is_init_finished(s) && SSL_is_init_finished(c)); i++) {
        (void)SSL_do_handshake(c);
        pump(c_out, s_in);
        (void)SSL_do_handshake(s);
        pump(s_out, c_in);
    }
    assert_true(SSL_is_init_finished(s) && SSL_is_init_finished(c));
    (void)gw_tls_mem_tick(true);
    /* one request and answer a round: each record's buffer comes from the
     * stack and goes back to it (one at a time: every buffer is released
     * before the next is taken), so the stack neither empties nor grows */
    char buf[256];
    size_t kept = 0;
    for (int round = 0; round < 20; round++) {
        assert_int_equal(SSL_write(c, "request", 7), 7);
        pump(c_out, s_in);
        assert_int_equal(SSL_read(s, buf, sizeof(buf)), 7);
        assert_int_equal(SSL_write(s, "answer", 6), 6);
        pump(s_out, c_in);
        assert_int_equal(SSL_read(c, buf, sizeof(buf)), 6);
        assert_memory_equal(buf, "answer", 6);
        if (round == 0)
            kept = gw_tls_mem_cached();
        assert_int_equal(gw_tls_mem_cached(), kept);
    }
    assert_true(kept >= 1 && kept <= 4); /* at most a read and a write buffer per side */
    SSL_free(s);
    SSL_free(c);
    SSL_CTX_free(sc);
    SSL_CTX_free(cc);
}

int main(void)
{
    installed = gw_tls_mem_init(); /* before any other OpenSSL call */
    if (!installed)
        gw_tls_mem_prepare();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_lifo_reuse, empty),
        cmocka_unit_test_setup(test_other_sizes_pass, empty),
        cmocka_unit_test_setup(test_bounded, empty),
        cmocka_unit_test_setup(test_tick_halves_unused, empty),
        cmocka_unit_test_setup(test_openssl_record_buffers, empty),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    (void)gw_tls_mem_tick(true);
    return rc;
}
