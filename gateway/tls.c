/*
 * tls.c — OpenSSL contexts: one per TLS listener (termination, TLS 1.2+),
 * one per upstream pool with https:// servers (peer verification against a
 * CA file is always on; the host check and SNI are set per connection in
 * upstream.c). There is deliberately no switch to trust any certificate.
 */
#include <malloc.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/gw_tls.h"
#include "common/sl.h"
#include "gateway/gw_types.h"

const char *gw_tls_last_error(char *buf, size_t len)
{
    unsigned long e = ERR_get_error();
    if (!e) {
        snprintf(buf, len, "unknown TLS error");
        return buf;
    }
    ERR_error_string_n(e, buf, len);
    ERR_clear_error();
    return buf;
}

SSL_CTX *gw_tls_server_ctx(const char *cert, const char *key, char *err, size_t errlen)
{
    char eb[256];
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        snprintf(err, errlen, "TLS: %s", gw_tls_last_error(eb, sizeof(eb)));
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        snprintf(err, errlen, "TLS certificate %s: %s", cert, gw_tls_last_error(eb, sizeof(eb)));
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        snprintf(err, errlen, "TLS key %s: %s", key, gw_tls_last_error(eb, sizeof(eb)));
        goto fail;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        snprintf(err, errlen, "TLS key %s does not match certificate %s", key, cert);
        goto fail;
    }
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

SSL_CTX *gw_tls_client_ctx(const char *ca_file, char *err, size_t errlen)
{
    char eb[256];
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        snprintf(err, errlen, "TLS: %s", gw_tls_last_error(eb, sizeof(eb)));
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    int ok = ca_file ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL)
                     : SSL_CTX_set_default_verify_paths(ctx);
    if (ok != 1) {
        snprintf(err, errlen, "TLS CA file %s: %s", ca_file ? ca_file : "(system default)",
                 gw_tls_last_error(eb, sizeof(eb)));
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

/* ALPN wire lists ("\x02h2\x08http/1.1"), one per preference order; the
 * callback's argument says which, so no allocation outlives the context. */
static const unsigned char gw_alpn_lists[][13] = {
    "\x02h2\x08http/1.1", /* 0: h2 first (the default) */
    "\x08http/1.1\x02h2", /* 1: http/1.1 first */
    "\x02h2",             /* 2: h2 only */
    "\x08http/1.1",       /* 3: http/1.1 only */
};
static const unsigned int gw_alpn_lens[] = {12, 12, 3, 9};

static int gw_tls_alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                              const unsigned char *in, unsigned int inlen, void *arg)
{
    (void)ssl;
    size_t k = (size_t)(uintptr_t)arg;
    /* SSL_select_next_proto takes the server's list first: our order wins. */
    if (SSL_select_next_proto((unsigned char **)out, outlen, gw_alpn_lists[k], gw_alpn_lens[k], in,
                              inlen) != OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_NOACK; /* no common protocol: HTTP/1.1 without ALPN */
    return SSL_TLSEXT_ERR_OK;
}

void gw_tls_server_alpn(SSL_CTX *ctx, char *const *protocols, size_t n)
{
    size_t k = 0;
    if (n == 1)
        k = strcmp(protocols[0], "h2") == 0 ? 2 : 3;
    else if (n == 2 && strcmp(protocols[0], "http/1.1") == 0)
        k = 1;
    SSL_CTX_set_alpn_select_cb(ctx, gw_tls_alpn_select, (void *)(uintptr_t)k);
}

/* ---- OpenSSL's record buffers kept per thread ------------------------------
 *
 * SSL_MODE_RELEASE_BUFFERS keeps an idle connection small (no 16 KiB read
 * and write buffers held while it waits), at the price of a buffer
 * allocated and freed for every record read or written: at one request at
 * a time on an h2+TLS connection that is one 16,712-byte read and one
 * 16,584-byte write buffer per request (OpenSSL 3.0, ssl3_buffer.c), from
 * glibc's large bins (_int_malloc, _int_free joining neighbours), ~1,500
 * instructions a request by callgrind. So OpenSSL allocates through these
 * functions: a request of GW_TLS_BUF_MIN..GW_TLS_BUF_BYTES bytes is served
 * with a GW_TLS_BUF_BYTES block from a per-thread LIFO stack of at most
 * GW_TLS_BUFS_MAX (the last freed, the warmest, first), everything else
 * with malloc as before. Blocks stay glibc's (realloc and a free from
 * another thread work as for any block); the worker's tick gives back half
 * of what its thread's stack did not use since the tick before, so an idle
 * worker holds none after a few ticks, as with the release mode alone.
 * Not installed under ASan (its own allocator checks the buffers). */

#if defined(__SANITIZE_ADDRESS__)
#define GW_TLS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GW_TLS_ASAN 1
#endif
#endif

struct gw_tls_bufs {
    void *blk[GW_TLS_BUFS_MAX];
    size_t n;
    size_t low; /* fewest held since the last tick */
};
static __thread struct gw_tls_bufs gw_tls_bufs;

static size_t gw_tls_buf_usable; /* malloc_usable_size of a GW_TLS_BUF_BYTES block */

void *gw_tls_mem_malloc(size_t size, const char *file, int line)
{
    (void)file;
    (void)line;
    if (size < GW_TLS_BUF_MIN || size > GW_TLS_BUF_BYTES || !gw_tls_buf_usable)
        return malloc(size);
    if (gw_tls_bufs.n > 0) {
        void *p = gw_tls_bufs.blk[--gw_tls_bufs.n];
        if (gw_tls_bufs.n < gw_tls_bufs.low)
            gw_tls_bufs.low = gw_tls_bufs.n;
        return p;
    }
    return malloc(GW_TLS_BUF_BYTES);
}

void *gw_tls_mem_realloc(void *p, size_t size, const char *file, int line)
{
    (void)file;
    (void)line;
    return realloc(p, size);
}

void gw_tls_mem_free(void *p, const char *file, int line)
{
    (void)file;
    (void)line;
    if (p && gw_tls_bufs.n < GW_TLS_BUFS_MAX && malloc_usable_size(p) == gw_tls_buf_usable) {
        gw_tls_bufs.blk[gw_tls_bufs.n++] = p;
        return;
    }
    free(p);
}

size_t gw_tls_mem_cached(void)
{
    return gw_tls_bufs.n;
}

size_t gw_tls_mem_tick(bool all)
{
    size_t n = all ? gw_tls_bufs.n : (SL_MIN(gw_tls_bufs.low, gw_tls_bufs.n) + 1) / 2;
    for (size_t i = 0; i < n; i++)
        free(gw_tls_bufs.blk[--gw_tls_bufs.n]);
    gw_tls_bufs.low = gw_tls_bufs.n;
    return n;
}

void gw_tls_mem_prepare(void)
{
    void *p = malloc(GW_TLS_BUF_BYTES);
    gw_tls_buf_usable = p ? malloc_usable_size(p) : 0;
    free(p);
}

bool gw_tls_mem_init(void)
{
#ifdef GW_TLS_ASAN
    return false;
#else
    gw_tls_mem_prepare();
    if (!gw_tls_buf_usable)
        return false;
    /* 0 once OpenSSL has allocated anything: then it keeps malloc */
    return CRYPTO_set_mem_functions(gw_tls_mem_malloc, gw_tls_mem_realloc, gw_tls_mem_free) == 1;
#endif
}
