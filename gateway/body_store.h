/*
 * body_store.h — storage for large request bodies: one block per body,
 * filled as the bytes arrive and handed to the request's evbuffer by
 * reference (no pull-up, one copy from the socket's buffer, none when read
 * in place). A block grows with the bytes, not with the declared length: a
 * client that declares 8 MiB and sends 100 KiB holds 128 KiB. Blocks come
 * back to a small process-wide cache when the last reference goes, so a
 * steady stream of large bodies neither maps nor faults in fresh pages per
 * request (worker.c fixes glibc's mmap threshold at 256 KiB: a larger
 * malloc is a fresh mapping every time).
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

/* A body declared past this size starts in a mapping of GW_BODY_STORE_READ
 * bytes that doubles (mremap: the pages move, the bytes are not copied) as
 * the bytes arrive; up to it, the block is sized for the body at once. */
#define GW_BODY_STORE_GROW (256u * 1024)

typedef struct gw_body_blk gw_body_blk_t;

/* A block for a body of n bytes (from the cache when one holds all of it);
 * NULL when n is outside [GW_BODY_STORE_MIN, GW_BODY_STORE_MAX] or memory
 * is short. */
gw_body_blk_t *gw_body_blk_new(size_t n) SL_WUR;
/* Back to the cache (or freed); NULL is fine. */
void gw_body_blk_free(gw_body_blk_t *b);
/* Appends n bytes, growing the block when they need room; false when they
 * go past the declared length or the block cannot grow (the caller goes on
 * without it). */
bool gw_body_blk_add(gw_body_blk_t *b, const char *p, size_t n) SL_WUR;
/* All the declared bytes are in. */
bool gw_body_blk_full(const gw_body_blk_t *b);
/* Bytes still to come before it is full. */
size_t gw_body_blk_left(const gw_body_blk_t *b);
/* Where the next bytes go, for a reader that puts them there itself
 * (*room of them fit, never past the declared length; the block grows
 * first when it is full): gw_body_blk_add of that same span then only
 * counts them. NULL when all the declared bytes are in or the block cannot
 * grow. */
char *gw_body_blk_tail(gw_body_blk_t *b, size_t *room) SL_WUR;
/* The block's bytes so far; NULL when it holds none. */
const char *gw_body_blk_data(const gw_body_blk_t *b, size_t *len);
/* Hands the block's bytes to buf as one reference chain; the block is
 * buf's from then on (returned to the cache when the chain is freed, by
 * buf or by any buffer sharing it: evbuffer_add_buffer_reference). -1:
 * out of memory, the block still the caller's. */
int gw_body_blk_give(gw_body_blk_t *b, struct evbuffer *buf) SL_WUR;
/* Frees the cached blocks (tests, shutdown). */
void gw_body_store_drop(void);
/* Bytes in the blocks of bodies being read or in flight (*held) and in the
 * idle ones the cache keeps (*idle); also on /metrics as
 * sluice_body_store_bytes{state="held"|"idle"}. */
void gw_body_store_bytes(size_t *held, size_t *idle);
/* Puts those on /metrics (gw_metrics.c, once at start). */
void gw_body_store_register(void);

#endif
