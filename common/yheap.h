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

#include <stdbool.h>
#include <stddef.h>

#include <yajl/yajl_common.h>
#include <yajl/yajl_parse.h>

#define SL_YHEAP_BYTES 4096

typedef struct sl_yheap {
    size_t used;
    _Alignas(16) unsigned char buf[SL_YHEAP_BYTES];
} sl_yheap_t;

/* Empties h and returns the allocator to pass to yajl_alloc(); borrowed:
 * h must outlive the handle. */
yajl_alloc_funcs sl_yheap_funcs(sl_yheap_t *h);

/*
 * A yajl handle a thread keeps between parses. yajl 2.1 has no reset, and a
 * handle per parse (alloc, config, the state stack's first push, free)
 * costs ~450 instructions, as much as a short document's tokens. A kept
 * handle parses a stream of values (yajl_allow_multiple_values, its
 * documented use): after a document that parsed whole it sits between
 * values, and the next document starts as a new value. Any other end (an
 * error, a callback's stop, a token left open) must free it: put it back
 * only when the document closed and nothing but blanks followed.
 *
 * One static _Thread_local sl_ykeep_t per parser (per callback set); its
 * callbacks get the box as ctx and find their parse in box->cur. The
 * handles go at thread exit (sl_thread_at_exit, common/sl.h).
 */

typedef struct sl_ykeep {
    yajl_handle h; /* idle, or NULL (in use, or none yet) */
    void *cur;     /* the caller's parse state, for its callbacks */
    bool listed;   /* the thread-exit list has this box */
} sl_ykeep_t;

/* The box's idle handle (the box holds none until put back), or a new one
 * with the callbacks cbs (ctx: the box), multiple values on, and yajl's
 * UTF-8 check on strings when check_utf8 (one box: always the same).
 * NULL: out of memory. */
yajl_handle sl_ykeep_take(sl_ykeep_t *k, const yajl_callbacks *cbs, bool check_utf8);

/* Back into the box when whole (the document closed, blanks after it) and
 * the box is empty; freed otherwise. */
void sl_ykeep_put(sl_ykeep_t *k, yajl_handle h, bool whole);

#endif
