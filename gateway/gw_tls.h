/*
 * gw_tls.h — OpenSSL contexts for the listeners and the upstream side (tls.c).
 */
#ifndef GW_TLS_H
#define GW_TLS_H

#include <stddef.h>

#include <openssl/ssl.h>

SSL_CTX *gw_tls_server_ctx(const char *cert, const char *key, char *err, size_t errlen);
/* ALPN on a listener's context: protocols ("h2", "http/1.1") in
 * preference order; none = h2 then http/1.1. */
void gw_tls_server_alpn(SSL_CTX *ctx, char *const *protocols, size_t n);
SSL_CTX *gw_tls_client_ctx(const char *ca_file, char *err, size_t errlen);
/* One-line description of the last OpenSSL error (for logs). */
const char *gw_tls_last_error(char *buf, size_t len);

#endif
