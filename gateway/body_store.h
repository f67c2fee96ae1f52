/*
 * body_store.h — storage for large request bodies: one block per body,
 * sized from its Content-Length, filled as the bytes arrive and handed to
 * the request's evbuffer by reference (no pull-up, one copy from the
 * socket's buffer). Blocks come back to a small process-wide cache when the
 * last reference goes, so a steady stream of large bodies neither mmaps nor
 * faults in fresh pages per request (worker.c fixes glibc's mmap threshold
 * at 256 KiB: a larger malloc is a fresh mapping every time).
 */
#ifndef GW_BODY_STORE_H
#define GW_BODY_STORE_H

#include <stdbool.h>
#include <stddef.h>

#include <event2/buffer.h>

#include "common/sl.h"

/* Bodies from this size up (declared) get a block; below, evbuffer chains. */
#define GW_BODY_STORE_MIN (16u * 1024)
/* ... up to this size (a larger one, if max_body_bytes allows it, grows
 * in evbuffer chains). */
#define GW_BODY_STORE_MAX (64u << 20)

/* A connection bringing such a body wakes per this many bytes. */
#define GW_BODY_STORE_READ (64u * 1024)
/* An upstream connection sending one writes up to this much per call (the
 * body goes by reference: nothing is allocated for it). */
#define GW_BODY_STORE_WRITE (1u << 20)

typedef struct gw_body_blk gw_body_blk_t;

/* A block for a body of n bytes (from the cache when one fits); NULL when
 * n is outside [GW_BODY_STORE_MIN, GW_BODY_STORE_MAX] or memory is short. */
gw_body_blk_t *gw_body_blk_new(size_t n) SL_WUR;
/* Back to the cache (or freed); NULL is fine. */
void gw_body_blk_free(gw_body_blk_t *b);
/* Appends n bytes; false when they do not fit (the caller goes on
 * without the block). */
bool gw_body_blk_add(gw_body_blk_t *b, const char *p, size_t n) SL_WUR;
/* All the declared bytes are in. */
bool gw_body_blk_full(const gw_body_blk_t *b);
/* Bytes still to come before it is full. */
size_t gw_body_blk_left(const gw_body_blk_t *b);
/* Where the next bytes go (gw_body_blk_left of them fit): a reader may
 * put them there itself; gw_body_blk_add of that same span then only
 * counts them. */
char *gw_body_blk_tail(gw_body_blk_t *b);
/* The block's bytes so far; NULL when it holds none. */
const char *gw_body_blk_data(const gw_body_blk_t *b, size_t *len);
/* Hands the block's bytes to buf as one reference chain; the block is
 * buf's from then on (returned to the cache when the chain is freed, by
 * buf or by any buffer sharing it: evbuffer_add_buffer_reference). -1:
 * out of memory, the block still the caller's. */
int gw_body_blk_give(gw_body_blk_t *b, struct evbuffer *buf) SL_WUR;
/* Frees the cached blocks (tests, shutdown). */
void gw_body_store_drop(void);

#endif
