/*
 * gguf.c — the GGUF reader (see gguf_internal.h). One pass over the header
 * with a bounds-checked cursor builds the key and tensor tables; a second
 * check over the tensor table (sorted by offset) rejects overlaps. Nothing
 * is read from the file after open except through pointers validated here.
 */
#include "model/gguf_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uthash.h>

#define GGUF_MAGIC         0x46554747u /* "GGUF" read as little-endian u32 */
#define GGUF_DEFAULT_ALIGN 32
/* Real files hold tens of keys and hundreds of tensors; these caps keep a
 * hostile header from making us build millions of table entries. */
#define GGUF_MAX_KV      65536
#define GGUF_MAX_TENSORS 65536
#define GGUF_MAX_ALIGN   (1u << 20)

typedef struct {
    mdl_gguf_kv_t kv;
    UT_hash_handle hh;
} gguf_kv_ent_t;

typedef struct {
    mdl_gguf_tensor_t t;
    UT_hash_handle hh;
} gguf_tensor_ent_t;

struct mdl_gguf {
    const uint8_t *base;
    size_t len;
    int mapped; /* munmap(map, map_len) on free */
    void *map;
    size_t map_len;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_off;
    gguf_kv_ent_t *kvs; /* array, n_kv entries; also hashed by key */
    size_t n_kv;
    gguf_kv_ent_t *kv_hash;
    gguf_tensor_ent_t *tensors;
    size_t n_tensors;
    gguf_tensor_ent_t *tensor_hash;
};

/* Bounds-checked reading cursor. Every read fails (and records why) rather
 * than run past len. */
typedef struct {
    const uint8_t *p;
    size_t len;
    size_t off;
    char *err;
    size_t errlen;
} cur_t;

static void SL_PRINTF(2, 3) cur_fail(cur_t *c, const char *fmt, ...)
{
    if (!c->err || c->errlen == 0)
        return;
    int n = snprintf(c->err, c->errlen, "offset %zu: ", c->off);
    if (n < 0 || (size_t)n >= c->errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
    va_end(ap);
}

static size_t cur_left(const cur_t *c)
{
    return c->len - c->off;
}

static int cur_need(cur_t *c, uint64_t n, const char *what)
{
    if (n > cur_left(c)) {
        cur_fail(c, "%s needs %llu bytes, only %zu left in file", what, (unsigned long long)n,
                 cur_left(c));
        return -1;
    }
    return 0;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static int cur_u32(cur_t *c, uint32_t *out, const char *what)
{
    if (cur_need(c, 4, what) != 0)
        return -1;
    *out = le32(c->p + c->off);
    c->off += 4;
    return 0;
}

static int cur_u64(cur_t *c, uint64_t *out, const char *what)
{
    if (cur_need(c, 8, what) != 0)
        return -1;
    *out = le64(c->p + c->off);
    c->off += 8;
    return 0;
}

static int cur_str(cur_t *c, mdl_str_t *out, uint64_t maxlen, const char *what)
{
    uint64_t n;
    if (cur_u64(c, &n, what) != 0)
        return -1;
    if (n > maxlen) {
        c->off -= 8;
        cur_fail(c, "%s length %llu exceeds the limit %llu", what, (unsigned long long)n,
                 (unsigned long long)maxlen);
        return -1;
    }
    if (cur_need(c, n, what) != 0)
        return -1;
    out->ptr = (const char *)(c->p + c->off);
    out->len = n;
    c->off += n;
    return 0;
}

/* Size of a fixed-width value type; 0 for string/array/unknown. */
static uint32_t gv_size(uint32_t t)
{
    switch (t) {
    case MDL_GV_U8:
    case MDL_GV_I8:
    case MDL_GV_BOOL:
        return 1;
    case MDL_GV_U16:
    case MDL_GV_I16:
        return 2;
    case MDL_GV_U32:
    case MDL_GV_I32:
    case MDL_GV_F32:
        return 4;
    case MDL_GV_U64:
    case MDL_GV_I64:
    case MDL_GV_F64:
        return 8;
    default:
        return 0;
    }
}

const char *mdl_gv_type_name(uint32_t t)
{
    static const char *const names[MDL_GV_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "array", "u64", "i64", "f64"};
    return t < MDL_GV_COUNT ? names[t] : NULL;
}

typedef struct {
    const char *name;
    uint32_t block;
    uint32_t bytes;
} ttype_info_t;

static const ttype_info_t ttypes[MDL_T_MAX] = {
    [MDL_T_F32] = {"F32", 1, 4},         [MDL_T_F16] = {"F16", 1, 2},
    [MDL_T_Q4_0] = {"Q4_0", 32, 18},     [MDL_T_Q4_1] = {"Q4_1", 32, 20},
    [MDL_T_Q5_0] = {"Q5_0", 32, 22},     [MDL_T_Q5_1] = {"Q5_1", 32, 24},
    [MDL_T_Q8_0] = {"Q8_0", 32, 34},     [MDL_T_Q8_1] = {"Q8_1", 32, 36},
    [MDL_T_Q2_K] = {"Q2_K", 256, 84},    [MDL_T_Q3_K] = {"Q3_K", 256, 110},
    [MDL_T_Q4_K] = {"Q4_K", 256, 144},   [MDL_T_Q5_K] = {"Q5_K", 256, 176},
    [MDL_T_Q6_K] = {"Q6_K", 256, 210},   [MDL_T_Q8_K] = {"Q8_K", 256, 292},
    [MDL_T_IQ4_NL] = {"IQ4_NL", 32, 18}, [MDL_T_I8] = {"I8", 1, 1},
    [MDL_T_I16] = {"I16", 1, 2},         [MDL_T_I32] = {"I32", 1, 4},
    [MDL_T_I64] = {"I64", 1, 8},         [MDL_T_F64] = {"F64", 1, 8},
    [MDL_T_BF16] = {"BF16", 1, 2},
};

const char *mdl_ttype_name(uint32_t t)
{
    return t < MDL_T_MAX ? ttypes[t].name : NULL;
}

uint32_t mdl_ttype_block(uint32_t t)
{
    return t < MDL_T_MAX ? ttypes[t].block : 0;
}

uint32_t mdl_ttype_bytes(uint32_t t)
{
    return t < MDL_T_MAX ? ttypes[t].bytes : 0;
}

int mdl_str_eq(mdl_str_t s, const char *z)
{
    size_t n = strlen(z);
    return s.len == n && memcmp(s.ptr, z, n) == 0;
}

/* Skips over one value of type t (not an array) checking every length. */
static int skip_scalar(cur_t *c, uint32_t t, const char *what)
{
    if (t == MDL_GV_STRING) {
        mdl_str_t s;
        return cur_str(c, &s, UINT64_MAX, what);
    }
    uint32_t sz = gv_size(t);
    if (sz == 0) {
        cur_fail(c, "%s has unknown value type %u", what, t);
        return -1;
    }
    if (cur_need(c, sz, what) != 0)
        return -1;
    c->off += sz;
    return 0;
}

static int parse_kv(cur_t *c, mdl_gguf_kv_t *kv)
{
    if (cur_str(c, &kv->key, MDL_GGUF_MAX_KEY, "metadata key") != 0)
        return -1;
    if (kv->key.len == 0) {
        cur_fail(c, "empty metadata key");
        return -1;
    }
    if (cur_u32(c, &kv->type, "metadata value type") != 0)
        return -1;
    if (kv->type == MDL_GV_ARRAY) {
        if (cur_u32(c, &kv->arr_type, "array item type") != 0 ||
            cur_u64(c, &kv->arr_count, "array count") != 0)
            return -1;
        if (kv->arr_type == MDL_GV_ARRAY) {
            cur_fail(c, "key '%.*s': nested arrays are not supported", (int)SL_MIN(kv->key.len, 64),
                     kv->key.ptr);
            return -1;
        }
        size_t start = c->off;
        if (kv->arr_type == MDL_GV_STRING) {
            /* Each string is at least its 8-byte length: bound the count
             * before walking so a huge count fails fast. */
            if (kv->arr_count > cur_left(c) / 8) {
                cur_fail(c, "array count %llu exceeds the file", (unsigned long long)kv->arr_count);
                return -1;
            }
            for (uint64_t i = 0; i < kv->arr_count; i++)
                if (skip_scalar(c, MDL_GV_STRING, "array string") != 0)
                    return -1;
        } else {
            uint32_t sz = gv_size(kv->arr_type);
            if (sz == 0) {
                cur_fail(c, "array has unknown item type %u", kv->arr_type);
                return -1;
            }
            if (kv->arr_count > cur_left(c) / sz) {
                cur_fail(c, "array count %llu exceeds the file", (unsigned long long)kv->arr_count);
                return -1;
            }
            c->off += (size_t)kv->arr_count * sz;
        }
        kv->data = c->p + start;
        kv->data_len = c->off - start;
        return 0;
    }
    size_t start = c->off;
    if (skip_scalar(c, kv->type, "metadata value") != 0)
        return -1;
    kv->data = c->p + start;
    kv->data_len = c->off - start;
    return 0;
}

static int mul_ovf(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}

static int parse_tensor(cur_t *c, mdl_gguf_tensor_t *t)
{
    if (cur_str(c, &t->name, MDL_GGUF_MAX_NAME, "tensor name") != 0)
        return -1;
    if (t->name.len == 0) {
        cur_fail(c, "empty tensor name");
        return -1;
    }
    if (cur_u32(c, &t->n_dims, "tensor n_dims") != 0)
        return -1;
    if (t->n_dims < 1 || t->n_dims > MDL_GGUF_MAX_DIMS) {
        cur_fail(c, "tensor '%.*s': n_dims %u not in 1..%d", (int)t->name.len, t->name.ptr,
                 t->n_dims, MDL_GGUF_MAX_DIMS);
        return -1;
    }
    uint64_t nel = 1;
    for (uint32_t d = 0; d < MDL_GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (cur_u64(c, &t->ne[d], "tensor dimension") != 0)
            return -1;
        if (t->ne[d] == 0 || mul_ovf(nel, t->ne[d], &nel) || nel > (UINT64_C(1) << 50)) {
            cur_fail(c, "tensor '%.*s': bad dimension %llu", (int)t->name.len, t->name.ptr,
                     (unsigned long long)t->ne[d]);
            return -1;
        }
    }
    if (cur_u32(c, &t->type, "tensor type") != 0)
        return -1;
    uint32_t blk = mdl_ttype_block(t->type), bsz = mdl_ttype_bytes(t->type);
    if (blk == 0) {
        cur_fail(c, "tensor '%.*s': unknown or unsupported type %u", (int)t->name.len, t->name.ptr,
                 t->type);
        return -1;
    }
    if (t->ne[0] % blk != 0) {
        cur_fail(c, "tensor '%.*s': row length %llu is not a multiple of the %s block (%u)",
                 (int)t->name.len, t->name.ptr, (unsigned long long)t->ne[0],
                 mdl_ttype_name(t->type), blk);
        return -1;
    }
    /* nel < 2^50 and bsz <= 292, so this cannot overflow. */
    t->nbytes = nel / blk * bsz;
    if (cur_u64(c, &t->offset, "tensor offset") != 0)
        return -1;
    return 0;
}

static int cmp_tensor_off(const void *a, const void *b)
{
    const mdl_gguf_tensor_t *x = *(const mdl_gguf_tensor_t *const *)a;
    const mdl_gguf_tensor_t *y = *(const mdl_gguf_tensor_t *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

void mdl_set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* The checks that need the whole tensor table: alignment, bounds, overlap. */
static int check_tensors(mdl_gguf_t *g, char *err, size_t errlen)
{
    uint64_t data_len = g->len - g->data_off;
    const mdl_gguf_tensor_t **order = malloc(sizeof(*order) * (g->n_tensors ? g->n_tensors : 1));
    if (!order) {
        mdl_set_err(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < g->n_tensors; i++) {
        mdl_gguf_tensor_t *t = &g->tensors[i].t;
        uint64_t end;
        if (t->offset % g->alignment != 0) {
            mdl_set_err(err, errlen, "tensor '%.*s': offset %llu is not aligned to %llu",
                        (int)t->name.len, t->name.ptr, (unsigned long long)t->offset,
                        (unsigned long long)g->alignment);
            free(order);
            return -1;
        }
        if (__builtin_add_overflow(t->offset, t->nbytes, &end) || end > data_len) {
            mdl_set_err(err, errlen,
                        "tensor '%.*s': data [%llu, +%llu) lies outside the %llu-byte data section",
                        (int)t->name.len, t->name.ptr, (unsigned long long)t->offset,
                        (unsigned long long)t->nbytes, (unsigned long long)data_len);
            free(order);
            return -1;
        }
        t->data = g->base + g->data_off + t->offset;
        order[i] = t;
    }
    qsort(order, g->n_tensors, sizeof(*order), cmp_tensor_off);
    for (size_t i = 1; i < g->n_tensors; i++) {
        if (order[i - 1]->offset + order[i - 1]->nbytes > order[i]->offset) {
            mdl_set_err(err, errlen, "tensors '%.*s' and '%.*s' overlap",
                        (int)order[i - 1]->name.len, order[i - 1]->name.ptr,
                        (int)order[i]->name.len, order[i]->name.ptr);
            free(order);
            return -1;
        }
    }
    free(order);
    return 0;
}

static int parse_all(mdl_gguf_t *g, char *err, size_t errlen)
{
    cur_t c = {g->base, g->len, 0, err, errlen};
    uint32_t magic;
    if (g->len < 4) {
        mdl_set_err(err, errlen, "file too short (%zu bytes) to be GGUF", g->len);
        return -1;
    }
    if (cur_u32(&c, &magic, "magic") != 0)
        return -1;
    if (magic != GGUF_MAGIC) {
        mdl_set_err(err, errlen, "not a GGUF file (bad magic)");
        return -1;
    }
    if (cur_u32(&c, &g->version, "version") != 0)
        return -1;
    if (g->version == 1) {
        mdl_set_err(err, errlen, "GGUF version 1 is not supported (re-convert the model)");
        return -1;
    }
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffff) == 0)
            mdl_set_err(err, errlen,
                        "GGUF version 0x%x looks byte-swapped (big-endian files are "
                        "not supported)",
                        g->version);
        else
            mdl_set_err(err, errlen, "unsupported GGUF version %u", g->version);
        return -1;
    }
    uint64_t n_tensors, n_kv;
    if (cur_u64(&c, &n_tensors, "tensor count") != 0 || cur_u64(&c, &n_kv, "metadata count") != 0)
        return -1;
    /* A record takes at least 13 bytes (key length, type, 1-byte value), a
     * tensor info at least 32; more than fits in the file is a lie. */
    if (n_kv > GGUF_MAX_KV || n_kv > cur_left(&c) / 13) {
        cur_fail(&c, "metadata count %llu is impossible for this file", (unsigned long long)n_kv);
        return -1;
    }
    if (n_tensors > GGUF_MAX_TENSORS || n_tensors > cur_left(&c) / 32) {
        cur_fail(&c, "tensor count %llu is impossible for this file",
                 (unsigned long long)n_tensors);
        return -1;
    }
    g->kvs = calloc(n_kv ? n_kv : 1, sizeof(*g->kvs));
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof(*g->tensors));
    if (!g->kvs || !g->tensors) {
        mdl_set_err(err, errlen, "out of memory");
        return -1;
    }
    g->alignment = GGUF_DEFAULT_ALIGN;
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv_ent_t *e = &g->kvs[i], *dup = NULL;
        size_t at = c.off;
        if (parse_kv(&c, &e->kv) != 0)
            return -1;
        HASH_FIND(hh, g->kv_hash, e->kv.key.ptr, (unsigned)e->kv.key.len, dup);
        if (dup) {
            c.off = at;
            cur_fail(&c, "duplicate metadata key '%.*s'", (int)SL_MIN(e->kv.key.len, 64),
                     e->kv.key.ptr);
            return -1;
        }
        HASH_ADD_KEYPTR(hh, g->kv_hash, e->kv.key.ptr, (unsigned)e->kv.key.len, e);
        g->n_kv++;
        if (mdl_str_eq(e->kv.key, "general.alignment")) {
            uint32_t a = e->kv.type == MDL_GV_U32 ? le32(e->kv.data) : 0;
            if (a == 0 || (a & (a - 1)) != 0 || a > GGUF_MAX_ALIGN) {
                mdl_set_err(err, errlen, "general.alignment must be a u32 power of two <= %u",
                            GGUF_MAX_ALIGN);
                return -1;
            }
            g->alignment = a;
        }
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor_ent_t *e = &g->tensors[i], *dup = NULL;
        size_t at = c.off;
        if (parse_tensor(&c, &e->t) != 0)
            return -1;
        HASH_FIND(hh, g->tensor_hash, e->t.name.ptr, (unsigned)e->t.name.len, dup);
        if (dup) {
            c.off = at;
            cur_fail(&c, "duplicate tensor name '%.*s'", (int)e->t.name.len, e->t.name.ptr);
            return -1;
        }
        HASH_ADD_KEYPTR(hh, g->tensor_hash, e->t.name.ptr, (unsigned)e->t.name.len, e);
        g->n_tensors++;
    }
    uint64_t data_off = (c.off + g->alignment - 1) / g->alignment * g->alignment;
    if (data_off > g->len) {
        if (g->n_tensors > 0) {
            mdl_set_err(err, errlen, "file ends (%zu bytes) before the data section at %llu",
                        g->len, (unsigned long long)data_off);
            return -1;
        }
        data_off = g->len;
    }
    g->data_off = data_off;
    return check_tensors(g, err, errlen);
}

static mdl_gguf_t *open_common(mdl_gguf_t *g, char *err, size_t errlen)
{
    if (parse_all(g, err, errlen) != 0) {
        mdl_gguf_free(g);
        return NULL;
    }
    return g;
}

mdl_gguf_t *mdl_gguf_open_mem(const void *buf, size_t len, char *err, size_t errlen)
{
    mdl_gguf_t *g = calloc(1, sizeof(*g));
    if (!g) {
        mdl_set_err(err, errlen, "out of memory");
        return NULL;
    }
    g->base = buf;
    g->len = len;
    return open_common(g, err, errlen);
}

static int open_file(const char *path, int *fd, size_t *size, char *err, size_t errlen)
{
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0) {
        mdl_set_err(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        mdl_set_err(err, errlen, "%s: not a regular file", path);
        close(*fd);
        return -1;
    }
    if (st.st_size < 4) {
        mdl_set_err(err, errlen, "%s: file too short (%lld bytes) to be GGUF", path,
                    (long long)st.st_size);
        close(*fd);
        return -1;
    }
    *size = (size_t)st.st_size;
    return 0;
}

static mdl_gguf_t *wrap_mapping(void *map, size_t map_len, const uint8_t *base, size_t len,
                                char *err, size_t errlen)
{
    mdl_gguf_t *g = calloc(1, sizeof(*g));
    if (!g) {
        munmap(map, map_len);
        mdl_set_err(err, errlen, "out of memory");
        return NULL;
    }
    g->base = base;
    g->len = len;
    g->mapped = 1;
    g->map = map;
    g->map_len = map_len;
    return open_common(g, err, errlen);
}

mdl_gguf_t *mdl_gguf_open(const char *path, char *err, size_t errlen)
{
    int fd;
    size_t size;
    if (open_file(path, &fd, &size, err, errlen) != 0)
        return NULL;
    void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        mdl_set_err(err, errlen, "%s: mmap: %s", path, strerror(errno));
        return NULL;
    }
    return wrap_mapping(m, size, m, size, err, errlen);
}

mdl_gguf_t *mdl_gguf_open_copy(const char *path, char *err, size_t errlen)
{
    const size_t huge = (size_t)2 << 20;
    int fd;
    size_t size;
    if (open_file(path, &fd, &size, err, errlen) != 0)
        return NULL;
    /* over-allocate so the copy can start on a 2 MiB boundary */
    size_t map_len = (size + huge - 1) / huge * huge + huge;
    void *m = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        mdl_set_err(err, errlen, "%s: cannot allocate %zu bytes: %s", path, size, strerror(errno));
        close(fd);
        return NULL;
    }
    uint8_t *base = (uint8_t *)(((uintptr_t)m + huge - 1) & ~(uintptr_t)(huge - 1));
    (void)madvise(base, map_len - (size_t)(base - (uint8_t *)m), MADV_HUGEPAGE);
    for (size_t off = 0; off < size;) {
        ssize_t n = read(fd, base + off, SL_MIN(size - off, (size_t)64 << 20));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            mdl_set_err(err, errlen, "%s: read: %s", path, n < 0 ? strerror(errno) : "file shrank");
            close(fd);
            munmap(m, map_len);
            return NULL;
        }
        off += (size_t)n;
    }
    close(fd);
    /* read-only from here: a stray write is a crash, not a corrupt model */
    (void)mprotect(m, map_len, PROT_READ);
    return wrap_mapping(m, map_len, base, size, err, errlen);
}

void mdl_gguf_free(mdl_gguf_t *g)
{
    if (!g)
        return;
    HASH_CLEAR(hh, g->kv_hash);
    HASH_CLEAR(hh, g->tensor_hash);
    free(g->kvs);
    free(g->tensors);
    if (g->mapped)
        munmap(g->map, g->map_len);
    free(g);
}

uint32_t mdl_gguf_version(const mdl_gguf_t *g)
{
    return g->version;
}

uint64_t mdl_gguf_alignment(const mdl_gguf_t *g)
{
    return g->alignment;
}

uint64_t mdl_gguf_data_offset(const mdl_gguf_t *g)
{
    return g->data_off;
}

uint64_t mdl_gguf_file_size(const mdl_gguf_t *g)
{
    return g->len;
}

size_t mdl_gguf_kv_count(const mdl_gguf_t *g)
{
    return g->n_kv;
}

const mdl_gguf_kv_t *mdl_gguf_kv_at(const mdl_gguf_t *g, size_t i)
{
    return i < g->n_kv ? &g->kvs[i].kv : NULL;
}

const mdl_gguf_kv_t *mdl_gguf_kv_find(const mdl_gguf_t *g, const char *key)
{
    gguf_kv_ent_t *e = NULL;
    HASH_FIND(hh, g->kv_hash, key, (unsigned)strlen(key), e);
    return e ? &e->kv : NULL;
}

size_t mdl_gguf_tensor_count(const mdl_gguf_t *g)
{
    return g->n_tensors;
}

const mdl_gguf_tensor_t *mdl_gguf_tensor_at(const mdl_gguf_t *g, size_t i)
{
    return i < g->n_tensors ? &g->tensors[i].t : NULL;
}

const mdl_gguf_tensor_t *mdl_gguf_tensor_find(const mdl_gguf_t *g, const char *name)
{
    gguf_tensor_ent_t *e = NULL;
    HASH_FIND(hh, g->tensor_hash, name, (unsigned)strlen(name), e);
    return e ? &e->t : NULL;
}

/* Reads a fixed-width integer or bool value of type t at p. */
static int read_int(uint32_t t, const uint8_t *p, int64_t *out)
{
    switch (t) {
    case MDL_GV_U8:
    case MDL_GV_BOOL:
        *out = p[0];
        return 0;
    case MDL_GV_I8:
        *out = (int8_t)p[0];
        return 0;
    case MDL_GV_U16:
        *out = (uint16_t)(p[0] | p[1] << 8);
        return 0;
    case MDL_GV_I16:
        *out = (int16_t)(uint16_t)(p[0] | p[1] << 8);
        return 0;
    case MDL_GV_U32:
        *out = le32(p);
        return 0;
    case MDL_GV_I32:
        *out = (int32_t)le32(p);
        return 0;
    case MDL_GV_U64: {
        uint64_t v = le64(p);
        if (v > (uint64_t)INT64_MAX)
            return -1;
        *out = (int64_t)v;
        return 0;
    }
    case MDL_GV_I64:
        *out = (int64_t)le64(p);
        return 0;
    default:
        return -1;
    }
}

int mdl_gguf_get_int(const mdl_gguf_t *g, const char *key, int64_t *out)
{
    const mdl_gguf_kv_t *kv = mdl_gguf_kv_find(g, key);
    if (!kv)
        return MDL_GGUF_MISSING;
    return read_int(kv->type, kv->data, out) == 0 ? MDL_GGUF_OK : MDL_GGUF_BADTYPE;
}

int mdl_gguf_get_float(const mdl_gguf_t *g, const char *key, double *out)
{
    const mdl_gguf_kv_t *kv = mdl_gguf_kv_find(g, key);
    if (!kv)
        return MDL_GGUF_MISSING;
    if (kv->type == MDL_GV_F32) {
        uint32_t u = le32(kv->data);
        float f;
        memcpy(&f, &u, 4);
        *out = f;
        return MDL_GGUF_OK;
    }
    if (kv->type == MDL_GV_F64) {
        uint64_t u = le64(kv->data);
        memcpy(out, &u, 8);
        return MDL_GGUF_OK;
    }
    int64_t i;
    if (kv->type != MDL_GV_BOOL && read_int(kv->type, kv->data, &i) == 0) {
        *out = (double)i;
        return MDL_GGUF_OK;
    }
    return MDL_GGUF_BADTYPE;
}

int mdl_gguf_get_str(const mdl_gguf_t *g, const char *key, mdl_str_t *out)
{
    const mdl_gguf_kv_t *kv = mdl_gguf_kv_find(g, key);
    if (!kv)
        return MDL_GGUF_MISSING;
    if (kv->type != MDL_GV_STRING)
        return MDL_GGUF_BADTYPE;
    out->len = le64(kv->data);
    out->ptr = (const char *)kv->data + 8;
    return MDL_GGUF_OK;
}

static int is_int_type(uint32_t t)
{
    return t <= MDL_GV_I32 || t == MDL_GV_U64 || t == MDL_GV_I64 || t == MDL_GV_BOOL;
}

int mdl_gguf_get_arr(const mdl_gguf_t *g, const char *key, uint32_t want, const mdl_gguf_kv_t **out)
{
    const mdl_gguf_kv_t *kv = mdl_gguf_kv_find(g, key);
    if (!kv)
        return MDL_GGUF_MISSING;
    if (kv->type != MDL_GV_ARRAY)
        return MDL_GGUF_BADTYPE;
    if (want == MDL_GV_I64 ? !is_int_type(kv->arr_type) : kv->arr_type != want)
        return MDL_GGUF_BADTYPE;
    *out = kv;
    return MDL_GGUF_OK;
}

int64_t mdl_gguf_arr_int(const mdl_gguf_kv_t *kv, uint64_t i)
{
    int64_t v = 0;
    uint32_t sz = gv_size(kv->arr_type);
    if (kv->type != MDL_GV_ARRAY || i >= kv->arr_count || sz == 0)
        return 0;
    if (read_int(kv->arr_type, kv->data + i * sz, &v) != 0)
        return 0;
    return v;
}

int mdl_gguf_arr_next_str(const mdl_gguf_kv_t *kv, uint64_t *pos, mdl_str_t *out)
{
    /* The walk was validated at open, but re-check so a misuse (wrong kv,
     * wrong pos) cannot read past the record. */
    if (kv->type != MDL_GV_ARRAY || kv->arr_type != MDL_GV_STRING || *pos + 8 > kv->data_len)
        return -1;
    uint64_t n = le64(kv->data + *pos);
    if (n > kv->data_len - *pos - 8)
        return -1;
    out->ptr = (const char *)kv->data + *pos + 8;
    out->len = n;
    *pos += 8 + n;
    return 0;
}
