/*
 * status_page.h — the built-in status page (gateway/www/status.html), whose
 * bytes scripts/embed.py compiles into libsluice.a (build/gen/status_page.c)
 * so the admin listener serves GET / without reading a file at run time.
 * docs/metrics.md describes the page and what it polls.
 */
#ifndef SL_STATUS_PAGE_H
#define SL_STATUS_PAGE_H

#include <stddef.h>

/* The page's bytes (text/html; charset=utf-8), followed by a NUL that
 * sl_status_page_len does not count. */
extern const unsigned char sl_status_page[];
extern const size_t sl_status_page_len;

#endif
