/*
 * gw_h2_mem.h — the allocator nghttp2 sessions use (h2_mem.c): small blocks
 * from a per-worker free list, by size class, instead of malloc/free for
 * every stream, frame and header nghttp2 makes. Bounded (at most
 * GW_H2_MEM_CLASS_BYTES cached per class and worker), halved by the
 * worker's tick when unused like the request struct cache, and emptied
 * when the worker's load falls from a peak. A pool belongs to one worker
 * thread; every session that uses it lives on that thread.
 */
#ifndef GW_H2_MEM_H
#define GW_H2_MEM_H

#include <stdbool.h>
#include <stddef.h>

#include <nghttp2/nghttp2.h>

/* Bytes (payload) a worker keeps cached per size class, at most. */
#define GW_H2_MEM_CLASS_BYTES (64 * 1024)

typedef struct gw_h2_mem gw_h2_mem_t;

/* The allocator for nghttp2_session_server_new3 of the pool in *slot (the
 * worker's, w->h2mem, gw_conn_h2_mem), made at its first use; borrowed,
 * valid while the worker lives. NULL on OOM: nghttp2 then uses malloc. */
nghttp2_mem *gw_h2_mem_get(gw_h2_mem_t **slot);
/* The worker's tick: frees half of what stayed unused since the last one
 * (all with all), and updates the gauges. NULL: nothing. */
void gw_h2_mem_tick(gw_h2_mem_t *m, bool all);
/* The worker's loop ends: cached blocks are freed and *slot cleared; the
 * pool itself goes when the last block in use comes back (at once if none
 * is). */
void gw_h2_mem_release(gw_h2_mem_t **slot);
/* Blocks the pool's sessions hold now (for tests: 0 once every h2
 * connection has closed). */
size_t gw_h2_mem_in_use(const gw_h2_mem_t *m);

#endif
