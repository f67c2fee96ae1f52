/*
 * gguf_internal.h — a validating reader for GGUF v2/v3 files (the model
 * container llama.cpp and friends use). Internal to model/: the engine, the
 * tools and the tests use it; the gateway only sees model/model.h.
 *
 * The whole file is checked once, at open: every count, string length,
 * array size, tensor shape, offset and size is bounded by the bytes that
 * are really there, tensors may not overlap, keys and tensor names are
 * unique. After a successful open every accessor below is safe on any
 * input, so a hostile file gets a clear error and never a crash.
 *
 * Ownership: mdl_gguf_open() maps the file read-only and owns the mapping;
 * mdl_gguf_open_mem() borrows the caller's buffer, which must outlive the
 * handle. Every pointer handed out (strings, kv records, tensor data) is
 * borrowed from the handle and valid until mdl_gguf_free().
 */
#ifndef MDL_GGUF_INTERNAL_H
#define MDL_GGUF_INTERNAL_H

#include "common/sl.h"

#include <stdint.h>

/* Formats a message into the caller's err[errlen] (nothing when err is
 * NULL or errlen is 0): the error out-parameter of every model/ loader. */
void mdl_set_err(char *err, size_t errlen, const char *fmt, ...) SL_PRINTF(3, 4);

/* GGUF metadata value types (the numbers are the file format's). */
typedef enum {
    MDL_GV_U8 = 0,
    MDL_GV_I8 = 1,
    MDL_GV_U16 = 2,
    MDL_GV_I16 = 3,
    MDL_GV_U32 = 4,
    MDL_GV_I32 = 5,
    MDL_GV_F32 = 6,
    MDL_GV_BOOL = 7,
    MDL_GV_STRING = 8,
    MDL_GV_ARRAY = 9,
    MDL_GV_U64 = 10,
    MDL_GV_I64 = 11,
    MDL_GV_F64 = 12,
    MDL_GV_COUNT
} mdl_gv_type_t;

/* ggml tensor types (the numbers are the file format's). The reader knows
 * the block geometry of these; the engine computes with a subset (see
 * quant_internal.h). */
typedef enum {
    MDL_T_F32 = 0,
    MDL_T_F16 = 1,
    MDL_T_Q4_0 = 2,
    MDL_T_Q4_1 = 3,
    MDL_T_Q5_0 = 6,
    MDL_T_Q5_1 = 7,
    MDL_T_Q8_0 = 8,
    MDL_T_Q8_1 = 9,
    MDL_T_Q2_K = 10,
    MDL_T_Q3_K = 11,
    MDL_T_Q4_K = 12,
    MDL_T_Q5_K = 13,
    MDL_T_Q6_K = 14,
    MDL_T_Q8_K = 15,
    MDL_T_IQ4_NL = 20,
    MDL_T_I8 = 24,
    MDL_T_I16 = 25,
    MDL_T_I32 = 26,
    MDL_T_I64 = 27,
    MDL_T_F64 = 28,
    MDL_T_BF16 = 30,
    MDL_T_MAX = 40 /* bound for tables indexed by type */
} mdl_ttype_t;

/* A string inside the file: not NUL-terminated. */
typedef struct {
    const char *ptr;
    uint64_t len;
} mdl_str_t;

typedef struct mdl_gguf mdl_gguf_t;

/* One metadata record. For arrays, arr_type/arr_count describe the items
 * and data points at the first item; for scalars data points at the value.
 * Strings (scalar or in arrays) are stored as u64 length + bytes. */
typedef struct {
    mdl_str_t key;
    uint32_t type;
    uint32_t arr_type;
    uint64_t arr_count;
    const uint8_t *data;
    uint64_t data_len;
} mdl_gguf_kv_t;

typedef struct {
    mdl_str_t name;
    uint32_t n_dims;
    uint64_t ne[4]; /* ne[0] is the row length; unused dims are 1 */
    uint32_t type;
    uint64_t offset; /* from the start of the data section */
    uint64_t nbytes;
    const uint8_t *data;
} mdl_gguf_tensor_t;

/* Limits that keep a hostile file from making us allocate or loop without
 * bound (real files are far below them). */
#define MDL_GGUF_MAX_NAME 256
#define MDL_GGUF_MAX_KEY  65535
#define MDL_GGUF_MAX_DIMS 4

/* Opens and validates. On failure returns NULL and writes a one-line reason
 * ("offset N: ...") into err. */
SL_WUR mdl_gguf_t *mdl_gguf_open(const char *path, char *err, size_t errlen);
/* Same, but reads the file into anonymous memory backed by transparent huge
 * pages where the kernel offers them (madvise). Streaming the weights once
 * per token then costs far fewer TLB misses than over a 4 KiB-page file
 * mapping (about 20% faster decoding measured here), at the price of a
 * private copy of the file in memory. */
SL_WUR mdl_gguf_t *mdl_gguf_open_copy(const char *path, char *err, size_t errlen);
/* Same over a caller-owned buffer (borrowed; must outlive the handle). */
SL_WUR mdl_gguf_t *mdl_gguf_open_mem(const void *buf, size_t len, char *err, size_t errlen);
void mdl_gguf_free(mdl_gguf_t *g);

uint32_t mdl_gguf_version(const mdl_gguf_t *g);
uint64_t mdl_gguf_alignment(const mdl_gguf_t *g);
uint64_t mdl_gguf_data_offset(const mdl_gguf_t *g);
uint64_t mdl_gguf_file_size(const mdl_gguf_t *g);

size_t mdl_gguf_kv_count(const mdl_gguf_t *g);
const mdl_gguf_kv_t *mdl_gguf_kv_at(const mdl_gguf_t *g, size_t i);
const mdl_gguf_kv_t *mdl_gguf_kv_find(const mdl_gguf_t *g, const char *key);

size_t mdl_gguf_tensor_count(const mdl_gguf_t *g);
const mdl_gguf_tensor_t *mdl_gguf_tensor_at(const mdl_gguf_t *g, size_t i);
const mdl_gguf_tensor_t *mdl_gguf_tensor_find(const mdl_gguf_t *g, const char *name);

/* Typed getters. They return MDL_GGUF_OK, MDL_GGUF_MISSING when the key is
 * absent, or MDL_GGUF_BADTYPE when it holds something else. get_int
 * accepts every integer width and bool (a u64 above INT64_MAX is
 * BADTYPE); get_float accepts f32, f64 and integers. */
enum { MDL_GGUF_OK = 0, MDL_GGUF_MISSING = 1, MDL_GGUF_BADTYPE = -1 };
SL_WUR int mdl_gguf_get_int(const mdl_gguf_t *g, const char *key, int64_t *out);
SL_WUR int mdl_gguf_get_float(const mdl_gguf_t *g, const char *key, double *out);
SL_WUR int mdl_gguf_get_str(const mdl_gguf_t *g, const char *key, mdl_str_t *out);
/* An array of the given item type (any integer type when want is
 * MDL_GV_I64, any string array when MDL_GV_STRING). */
SL_WUR int mdl_gguf_get_arr(const mdl_gguf_t *g, const char *key, uint32_t want,
                            const mdl_gguf_kv_t **out);

/* Item i of a numeric array as int64 (0 on a type mismatch; the type was
 * checked by get_arr). Random access. */
int64_t mdl_gguf_arr_int(const mdl_gguf_kv_t *kv, uint64_t i);
/* Sequential walk over a string array: start with *pos = 0; each call
 * yields the next item and returns 0, or -1 after the last. */
int mdl_gguf_arr_next_str(const mdl_gguf_kv_t *kv, uint64_t *pos, mdl_str_t *out);

/* Names and geometry of value / tensor types; NULL / 0 when unknown. */
const char *mdl_gv_type_name(uint32_t t);
const char *mdl_ttype_name(uint32_t t);
/* Elements per block and bytes per block; 0 when the type is unknown. */
uint32_t mdl_ttype_block(uint32_t t);
uint32_t mdl_ttype_bytes(uint32_t t);

/* Key comparison helper: 1 when s equals the C string z. */
int mdl_str_eq(mdl_str_t s, const char *z);

#endif
