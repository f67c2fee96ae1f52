/*
 * yheap.h — yajl's own allocations (its handle, lexer, state stack, decode
 * buffer: a handful per parse) from a caller's buffer, usually on the stack,
 * so a short parse on a hot path costs no malloc; beyond the buffer, malloc.
 * The buffer's blocks are never given back one by one: they go with the
 * buffer, so one sl_yheap_t serves one yajl handle (yajl_free it before the
 * buffer goes out of scope).
 */
#ifndef SL_YHEAP_H
#define SL_YHEAP_H

#include <stddef.h>

#include <yajl/yajl_common.h>

#define SL_YHEAP_BYTES 4096

typedef struct sl_yheap {
    size_t used;
    _Alignas(16) unsigned char buf[SL_YHEAP_BYTES];
} sl_yheap_t;

/* Empties h and returns the allocator to pass to yajl_alloc(); borrowed:
 * h must outlive the handle. */
yajl_alloc_funcs sl_yheap_funcs(sl_yheap_t *h);

#endif
