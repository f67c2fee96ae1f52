/*
 * h2_mem.c — nghttp2's allocator: per-worker free lists of small blocks.
 *
 * An nghttp2 session allocates for every stream (the stream, its outbound
 * items, the header fields it decodes and copies), about ten malloc/free
 * pairs per request at one stream at a time. Here each block carries a
 * 16-byte header (its pool and size class) and goes back to its class's
 * free list when nghttp2 frees it, so a steady load reuses the same few
 * blocks and glibc's malloc is not called per request. Blocks over the
 * largest class are plain malloc'd (the header says so).
 *
 * Bounded: a class keeps at most GW_H2_MEM_CLASS_BYTES of free blocks (the
 * rest are freed at once); the worker's tick frees half of the blocks
 * that went unused for a whole tick, all of them after a peak (as
 * conn.c's request struct cache). Everything of a session is freed by
 * nghttp2_session_del, so a closed connection's blocks are back here, and
 * the in-use count (sluice_http2_mem_blocks_in_use) is 0 with no h2
 * connection open.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/sl.h"
#include "gateway/gw_h2_mem.h"
#include "gateway/gw_metrics.h"

/* Classes of 64, 128, ... 4096 bytes. */
#define GW_H2_MEM_MIN_SHIFT 6
#define GW_H2_MEM_NCLASS    7
#define GW_H2_MEM_LARGE     GW_H2_MEM_NCLASS
#define GW_H2_MEM_MAX_SIZE  ((size_t)1 << (GW_H2_MEM_MIN_SHIFT + GW_H2_MEM_NCLASS - 1))

/* A block's header; the payload follows, 16-byte aligned as malloc's. */
typedef struct gw_h2_blk {
    gw_h2_mem_t *pool;
    uint32_t cls;  /* GW_H2_MEM_LARGE: malloc'd for its size */
    uint32_t size; /* payload bytes */
} gw_h2_blk_t;

_Static_assert(sizeof(gw_h2_blk_t) == 16, "the payload stays 16-byte aligned");

/* A free block's payload: the next free one. */
typedef struct gw_h2_free {
    struct gw_h2_free *next;
} gw_h2_free_t;

struct gw_h2_mem {
    nghttp2_mem mem;
    gw_h2_free_t *head[GW_H2_MEM_NCLASS];
    size_t nfree[GW_H2_MEM_NCLASS];
    size_t low[GW_H2_MEM_NCLASS]; /* fewest free since the last tick */
    size_t in_use;                /* blocks handed out, all sizes */
    int64_t shown_cached;         /* what the gauges have of this pool */
    int64_t shown_in_use;
    bool released; /* the worker's loop ended: blocks coming back are freed */
};

static size_t gw_h2_mem_class_size(uint32_t cls)
{
    return (size_t)1 << (GW_H2_MEM_MIN_SHIFT + cls);
}

static uint32_t gw_h2_mem_class(size_t size)
{
    uint32_t cls = 0;
    while (cls < GW_H2_MEM_NCLASS && gw_h2_mem_class_size(cls) < size)
        cls++;
    return cls;
}

static void *gw_h2_mem_malloc(size_t size, void *ud)
{
    gw_h2_mem_t *m = ud;
    if (size > UINT32_MAX - sizeof(gw_h2_blk_t))
        return NULL;
    uint32_t cls = gw_h2_mem_class(size);
    gw_h2_blk_t *b;
    if (cls < GW_H2_MEM_NCLASS && m->head[cls]) {
        gw_h2_free_t *f = m->head[cls];
        m->head[cls] = f->next;
        if (--m->nfree[cls] < m->low[cls])
            m->low[cls] = m->nfree[cls];
        b = (gw_h2_blk_t *)f - 1;
    } else {
        size_t cap = cls < GW_H2_MEM_NCLASS ? gw_h2_mem_class_size(cls) : size;
        b = malloc(sizeof(*b) + cap);
        if (!b)
            return NULL;
        b->pool = m;
        b->cls = cls;
        b->size = (uint32_t)cap;
    }
    m->in_use++;
    return b + 1;
}

static void gw_h2_mem_pool_free(gw_h2_mem_t *m)
{
    for (uint32_t c = 0; c < GW_H2_MEM_NCLASS; c++) {
        while (m->head[c]) {
            gw_h2_free_t *f = m->head[c];
            m->head[c] = f->next;
            free((gw_h2_blk_t *)f - 1);
        }
        m->nfree[c] = m->low[c] = 0;
    }
}

static void gw_h2_mem_free(void *p, void *ud)
{
    (void)ud; /* the block's own pool: the same one */
    if (!p)
        return;
    gw_h2_blk_t *b = (gw_h2_blk_t *)p - 1;
    gw_h2_mem_t *m = b->pool;
    m->in_use--;
    if (b->cls < GW_H2_MEM_NCLASS && !m->released &&
        m->nfree[b->cls] < GW_H2_MEM_CLASS_BYTES / b->size) {
        gw_h2_free_t *f = p;
        f->next = m->head[b->cls];
        m->head[b->cls] = f;
        m->nfree[b->cls]++;
        return;
    }
    free(b);
    if (m->released && m->in_use == 0)
        free(m);
}

static void *gw_h2_mem_calloc(size_t n, size_t size, void *ud)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    void *p = gw_h2_mem_malloc(n * size, ud);
    if (p)
        memset(p, 0, n * size);
    return p;
}

static void *gw_h2_mem_realloc(void *p, size_t size, void *ud)
{
    if (!p)
        return gw_h2_mem_malloc(size, ud);
    gw_h2_blk_t *b = (gw_h2_blk_t *)p - 1;
    if (size <= b->size && (b->cls == GW_H2_MEM_LARGE) == (size > GW_H2_MEM_MAX_SIZE))
        return p; /* still fits its class (or its large block) */
    if (b->cls == GW_H2_MEM_LARGE && size > GW_H2_MEM_MAX_SIZE) {
        if (size > UINT32_MAX - sizeof(*b))
            return NULL;
        gw_h2_blk_t *nb = realloc(b, sizeof(*b) + size);
        if (!nb)
            return NULL;
        nb->size = (uint32_t)size;
        return nb + 1;
    }
    void *np = gw_h2_mem_malloc(size, ud);
    if (!np)
        return NULL;
    memcpy(np, p, SL_MIN(size, (size_t)b->size));
    gw_h2_mem_free(p, ud);
    return np;
}

nghttp2_mem *gw_h2_mem_get(gw_h2_mem_t **slot)
{
    if (!*slot) {
        gw_h2_mem_t *m = calloc(1, sizeof(*m));
        if (!m)
            return NULL;
        m->mem = (nghttp2_mem){.mem_user_data = m,
                               .malloc = gw_h2_mem_malloc,
                               .free = gw_h2_mem_free,
                               .calloc = gw_h2_mem_calloc,
                               .realloc = gw_h2_mem_realloc};
        *slot = m;
    }
    return &(*slot)->mem;
}

static void gw_h2_mem_show(gw_h2_mem_t *m)
{
    int64_t cached = 0;
    for (uint32_t c = 0; c < GW_H2_MEM_NCLASS; c++)
        cached += (int64_t)(m->nfree[c] * gw_h2_mem_class_size(c));
    sl_gauge_add(gw_m.h2_mem_cached, cached - m->shown_cached);
    sl_gauge_add(gw_m.h2_mem_in_use, (int64_t)m->in_use - m->shown_in_use);
    m->shown_cached = cached;
    m->shown_in_use = (int64_t)m->in_use;
}

void gw_h2_mem_tick(gw_h2_mem_t *m, bool all)
{
    if (!m)
        return;
    for (uint32_t c = 0; c < GW_H2_MEM_NCLASS; c++) {
        size_t n = all ? m->nfree[c] : (SL_MIN(m->low[c], m->nfree[c]) + 1) / 2;
        while (n-- > 0 && m->head[c]) {
            gw_h2_free_t *f = m->head[c];
            m->head[c] = f->next;
            m->nfree[c]--;
            free((gw_h2_blk_t *)f - 1);
        }
        m->low[c] = m->nfree[c];
    }
    gw_h2_mem_show(m);
}

void gw_h2_mem_release(gw_h2_mem_t **slot)
{
    gw_h2_mem_t *m = *slot;
    if (!m)
        return;
    *slot = NULL;
    gw_h2_mem_pool_free(m);
    sl_gauge_add(gw_m.h2_mem_cached, -m->shown_cached);
    sl_gauge_add(gw_m.h2_mem_in_use, -m->shown_in_use);
    m->shown_cached = m->shown_in_use = 0;
    m->released = true;
    if (m->in_use == 0)
        free(m);
}

size_t gw_h2_mem_in_use(const gw_h2_mem_t *m)
{
    return m ? m->in_use : 0;
}
