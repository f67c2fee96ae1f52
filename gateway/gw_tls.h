/*
 * gw_tls.h — OpenSSL contexts for the listeners and the upstream side (tls.c).
 */
#ifndef GW_TLS_H
#define GW_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include <openssl/ssl.h>

SSL_CTX *gw_tls_server_ctx(const char *cert, const char *key, char *err, size_t errlen);
/* ALPN on a listener's context: protocols ("h2", "http/1.1") in
 * preference order; none = h2 then http/1.1. */
void gw_tls_server_alpn(SSL_CTX *ctx, char *const *protocols, size_t n);
SSL_CTX *gw_tls_client_ctx(const char *ca_file, char *err, size_t errlen);
/* One-line description of the last OpenSSL error (for logs). */
const char *gw_tls_last_error(char *buf, size_t len);

/* OpenSSL's record buffers kept per thread (tls.c says why). gw_tls_mem_init
 * installs the three allocation functions into OpenSSL: before anything
 * else calls OpenSSL, once; false where it does not (ASan, or OpenSSL has
 * allocated already). gw_tls_mem_tick runs on the calling thread's worker
 * tick: frees half of what its stack did not use since the tick before, or
 * all of it (all); returns how many. gw_tls_mem_prepare sets up without
 * installing (tests). */
#define GW_TLS_BUF_MIN   (16 * 1024) /* requests this size and up to ... */
#define GW_TLS_BUF_BYTES (17 * 1024) /* ... this get a kept block of this size */
#define GW_TLS_BUFS_MAX  64          /* a thread's stack: 1.1 MiB at most */
bool gw_tls_mem_init(void);
void gw_tls_mem_prepare(void);
void *gw_tls_mem_malloc(size_t size, const char *file, int line);
void *gw_tls_mem_realloc(void *p, size_t size, const char *file, int line);
void gw_tls_mem_free(void *p, const char *file, int line);
size_t gw_tls_mem_tick(bool all);
size_t gw_tls_mem_cached(void);

#endif
