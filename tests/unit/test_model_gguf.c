/*
 * test_model_gguf.c — the GGUF reader on hand-built files: a valid file
 * with every value type, then one hostile variant per check (truncation at
 * every byte, bad magic and versions, impossible counts and lengths,
 * nested arrays, bad shapes, types, offsets and overlaps, duplicates).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/gguf_internal.h"

/* A growable byte buffer that writes little-endian GGUF pieces. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf_t;

static void put(buf_t *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void u8(buf_t *b, uint8_t v)
{
    put(b, &v, 1);
}

static void u32(buf_t *b, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, x, 4);
}

static void u64(buf_t *b, uint64_t v)
{
    u32(b, (uint32_t)v);
    u32(b, (uint32_t)(v >> 32));
}

static void str(buf_t *b, const char *s)
{
    u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void pad_to(buf_t *b, size_t align)
{
    while (b->n % align)
        u8(b, 0);
}

static void header(buf_t *b, uint64_t n_tensors, uint64_t n_kv)
{
    put(b, "GGUF", 4);
    u32(b, 3);
    u64(b, n_tensors);
    u64(b, n_kv);
}

static void tensor_info(buf_t *b, const char *name, uint32_t nd, const uint64_t *ne, uint32_t type,
                        uint64_t off)
{
    str(b, name);
    u32(b, nd);
    for (uint32_t i = 0; i < nd; i++)
        u64(b, ne[i]);
    u32(b, type);
    u64(b, off);
}

/* The valid reference file: 8 keys of assorted types, two tensors. */
static buf_t make_valid(void)
{
    buf_t b = {0};
    header(&b, 2, 8);
    str(&b, "general.architecture");
    u32(&b, MDL_GV_STRING);
    str(&b, "qwen2");
    str(&b, "a.u8");
    u32(&b, MDL_GV_U8);
    u8(&b, 200);
    str(&b, "a.i16");
    u32(&b, MDL_GV_I16);
    u8(&b, 0xfe);
    u8(&b, 0xff); /* -2 */
    str(&b, "a.u64");
    u32(&b, MDL_GV_U64);
    u64(&b, 1234567890123ULL);
    str(&b, "a.f32");
    u32(&b, MDL_GV_F32);
    float f = 1e-6f;
    put(&b, &f, 4);
    str(&b, "a.big");
    u32(&b, MDL_GV_U64);
    u64(&b, UINT64_MAX);
    str(&b, "a.strs");
    u32(&b, MDL_GV_ARRAY);
    u32(&b, MDL_GV_STRING);
    u64(&b, 3);
    str(&b, "x");
    str(&b, "");
    str(&b, "hello");
    str(&b, "a.ints");
    u32(&b, MDL_GV_ARRAY);
    u32(&b, MDL_GV_I32);
    u64(&b, 3);
    u32(&b, 1);
    u32(&b, (uint32_t)-5);
    u32(&b, 7);
    uint64_t ne1[2] = {32, 2}, ne2[1] = {8};
    tensor_info(&b, "w", 2, ne1, MDL_T_Q8_0, 0);
    tensor_info(&b, "v", 1, ne2, MDL_T_F32, 96); /* 68 bytes of w, then aligned */
    pad_to(&b, 32);
    for (int i = 0; i < 96 + 32; i++)
        u8(&b, (uint8_t)i);
    return b;
}

static mdl_gguf_t *open_buf(const buf_t *b, char *err, size_t errlen)
{
    return mdl_gguf_open_mem(b->p, b->n, err, errlen);
}

static void test_valid(void **state)
{
    (void)state;
    buf_t b = make_valid();
    char err[256] = "";
    mdl_gguf_t *g = open_buf(&b, err, sizeof(err));
    assert_non_null(g);
    assert_int_equal(mdl_gguf_version(g), 3);
    assert_int_equal(mdl_gguf_kv_count(g), 8);
    assert_int_equal(mdl_gguf_tensor_count(g), 2);
    mdl_str_t s;
    assert_int_equal(mdl_gguf_get_str(g, "general.architecture", &s), MDL_GGUF_OK);
    assert_true(mdl_str_eq(s, "qwen2"));
    int64_t i;
    assert_int_equal(mdl_gguf_get_int(g, "a.u8", &i), MDL_GGUF_OK);
    assert_int_equal(i, 200);
    assert_int_equal(mdl_gguf_get_int(g, "a.i16", &i), MDL_GGUF_OK);
    assert_int_equal(i, -2);
    assert_int_equal(mdl_gguf_get_int(g, "a.u64", &i), MDL_GGUF_OK);
    assert_true(i == 1234567890123LL);
    assert_int_equal(mdl_gguf_get_int(g, "a.big", &i), MDL_GGUF_BADTYPE);
    assert_int_equal(mdl_gguf_get_int(g, "nope", &i), MDL_GGUF_MISSING);
    assert_int_equal(mdl_gguf_get_int(g, "general.architecture", &i), MDL_GGUF_BADTYPE);
    double d;
    assert_int_equal(mdl_gguf_get_float(g, "a.f32", &d), MDL_GGUF_OK);
    assert_true(d > 0.99e-6 && d < 1.01e-6);
    assert_int_equal(mdl_gguf_get_float(g, "a.u8", &d), MDL_GGUF_OK);
    assert_true(d == 200.0);
    const mdl_gguf_kv_t *kv;
    assert_int_equal(mdl_gguf_get_arr(g, "a.strs", MDL_GV_STRING, &kv), MDL_GGUF_OK);
    assert_int_equal(kv->arr_count, 3);
    uint64_t pos = 0;
    const char *want[] = {"x", "", "hello"};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(mdl_gguf_arr_next_str(kv, &pos, &s), 0);
        assert_true(mdl_str_eq(s, want[k]));
    }
    assert_int_equal(mdl_gguf_arr_next_str(kv, &pos, &s), -1);
    assert_int_equal(mdl_gguf_get_arr(g, "a.strs", MDL_GV_I64, &kv), MDL_GGUF_BADTYPE);
    assert_int_equal(mdl_gguf_get_arr(g, "a.ints", MDL_GV_I64, &kv), MDL_GGUF_OK);
    assert_int_equal(mdl_gguf_arr_int(kv, 0), 1);
    assert_int_equal(mdl_gguf_arr_int(kv, 1), -5);
    assert_int_equal(mdl_gguf_arr_int(kv, 2), 7);
    assert_int_equal(mdl_gguf_arr_int(kv, 3), 0); /* out of range: 0, no read */
    const mdl_gguf_tensor_t *t = mdl_gguf_tensor_find(g, "w");
    assert_non_null(t);
    assert_int_equal(t->type, MDL_T_Q8_0);
    assert_int_equal(t->nbytes, 68);
    assert_int_equal(t->ne[0], 32);
    assert_int_equal(t->ne[1], 2);
    assert_int_equal(t->ne[2], 1);
    assert_ptr_equal(t->data, b.p + mdl_gguf_data_offset(g));
    t = mdl_gguf_tensor_find(g, "v");
    assert_non_null(t);
    assert_int_equal(t->nbytes, 32);
    assert_int_equal(t->data[0], 96);
    assert_null(mdl_gguf_tensor_find(g, "x"));
    mdl_gguf_free(g);
    free(b.p);
}

/* Every proper prefix of the valid file must fail cleanly (ASan checks that
 * nothing reads past the end: the prefix is copied to an exact-size heap
 * block). */
static void test_truncated_everywhere(void **state)
{
    (void)state;
    buf_t b = make_valid();
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *cp = malloc(n ? n : 1);
        memcpy(cp, b.p, n);
        char err[256] = "";
        mdl_gguf_t *g = mdl_gguf_open_mem(cp, n, err, sizeof(err));
        if (g) {
            print_error("prefix of %zu bytes was accepted\n", n);
            fail();
        }
        assert_true(err[0] != '\0');
        free(cp);
    }
    free(b.p);
}

/* Opens b expecting failure with an error containing needle. */
static void expect_err(buf_t *b, const char *needle)
{
    char err[256] = "";
    mdl_gguf_t *g = open_buf(b, err, sizeof(err));
    if (g || !strstr(err, needle)) {
        print_error("expected error containing '%s', got '%s'\n", needle, g ? "(accepted)" : err);
        mdl_gguf_free(g);
        fail();
    }
    free(b->p);
    memset(b, 0, sizeof(*b));
}

static void test_bad_header(void **state)
{
    (void)state;
    buf_t b = make_valid();
    b.p[0] = 'X';
    expect_err(&b, "bad magic");
    b = make_valid();
    b.p[4] = 1;
    expect_err(&b, "version 1");
    b = make_valid();
    b.p[4] = 0;
    b.p[7] = 3; /* 0x03000000: a big-endian writer */
    expect_err(&b, "byte-swapped");
    b = make_valid();
    b.p[4] = 9;
    expect_err(&b, "unsupported GGUF version 9");
    b = (buf_t){0};
    put(&b, "GG", 2);
    expect_err(&b, "too short");
}

static void test_huge_counts(void **state)
{
    (void)state;
    buf_t b = {0};
    header(&b, 0, UINT64_MAX);
    expect_err(&b, "metadata count");
    header(&b, 1ULL << 40, 0);
    expect_err(&b, "tensor count");
    /* A string length beyond the file. */
    header(&b, 0, 1);
    u64(&b, 1ULL << 62);
    put(&b, "abcdefghijklmnop", 16);
    expect_err(&b, "exceeds the limit");
    header(&b, 0, 1);
    str(&b, "k");
    u32(&b, MDL_GV_STRING);
    u64(&b, 1000);
    put(&b, "short", 5);
    expect_err(&b, "only 5 left");
    /* Array counts beyond the file, fixed and string items. */
    header(&b, 0, 1);
    str(&b, "k");
    u32(&b, MDL_GV_ARRAY);
    u32(&b, MDL_GV_U32);
    u64(&b, UINT64_MAX / 2);
    u32(&b, 0);
    expect_err(&b, "array count");
    header(&b, 0, 1);
    str(&b, "k");
    u32(&b, MDL_GV_ARRAY);
    u32(&b, MDL_GV_STRING);
    u64(&b, 1ULL << 33);
    u64(&b, 0);
    expect_err(&b, "array count");
}

static void test_bad_values(void **state)
{
    (void)state;
    buf_t b = {0};
    header(&b, 0, 1);
    str(&b, "k");
    u32(&b, MDL_GV_ARRAY);
    u32(&b, MDL_GV_ARRAY);
    u64(&b, 1);
    u32(&b, MDL_GV_U8);
    u64(&b, 1);
    u8(&b, 1);
    expect_err(&b, "nested arrays");
    header(&b, 0, 1);
    str(&b, "k");
    u32(&b, 99);
    u64(&b, 0);
    expect_err(&b, "unknown value type 99");
    header(&b, 0, 1);
    str(&b, "k");
    u32(&b, MDL_GV_ARRAY);
    u32(&b, 77);
    u64(&b, 0);
    expect_err(&b, "unknown item type 77");
    header(&b, 0, 2);
    str(&b, "k");
    u32(&b, MDL_GV_U8);
    u8(&b, 1);
    str(&b, "k");
    u32(&b, MDL_GV_U8);
    u8(&b, 2);
    expect_err(&b, "duplicate metadata key 'k'");
    header(&b, 0, 1);
    str(&b, "");
    u32(&b, MDL_GV_U8);
    u8(&b, 1);
    u64(&b, 0);
    expect_err(&b, "empty metadata key");
    header(&b, 0, 1);
    str(&b, "general.alignment");
    u32(&b, MDL_GV_U32);
    u32(&b, 48);
    u64(&b, 0);
    expect_err(&b, "power of two");
    header(&b, 0, 1);
    str(&b, "general.alignment");
    u32(&b, MDL_GV_U64);
    u64(&b, 32);
    expect_err(&b, "power of two");
}

/* One tensor with the given shape/type/offset and `data` bytes of data. */
static buf_t one_tensor(uint32_t nd, const uint64_t *ne, uint32_t type, uint64_t off, size_t data)
{
    buf_t b = {0};
    header(&b, 1, 0);
    tensor_info(&b, "t", nd, ne, type, off);
    pad_to(&b, 32);
    for (size_t i = 0; i < data; i++)
        u8(&b, 0);
    return b;
}

static void test_bad_tensors(void **state)
{
    (void)state;
    uint64_t ne[5] = {32, 4, 1, 1, 1};
    buf_t b = one_tensor(2, ne, MDL_T_F32, 0, 512);
    char err[256];
    mdl_gguf_t *g = open_buf(&b, err, sizeof(err));
    assert_non_null(g);
    mdl_gguf_free(g);
    free(b.p);
    b = one_tensor(0, ne, MDL_T_F32, 0, 512);
    expect_err(&b, "n_dims 0");
    b = one_tensor(5, ne, MDL_T_F32, 0, 512);
    expect_err(&b, "n_dims 5");
    uint64_t zero[2] = {32, 0};
    b = one_tensor(2, zero, MDL_T_F32, 0, 512);
    expect_err(&b, "bad dimension 0");
    uint64_t huge[3] = {1ULL << 40, 1ULL << 30, 2};
    b = one_tensor(3, huge, MDL_T_F32, 0, 512);
    expect_err(&b, "bad dimension");
    b = one_tensor(2, ne, 4, 0, 512); /* type 4 was removed from ggml */
    expect_err(&b, "unknown or unsupported type 4");
    b = one_tensor(2, ne, 1000, 0, 512);
    expect_err(&b, "type 1000");
    uint64_t odd[2] = {33, 1};
    b = one_tensor(2, odd, MDL_T_Q4_0, 0, 512);
    expect_err(&b, "not a multiple of the Q4_0 block");
    b = one_tensor(2, ne, MDL_T_F32, 16, 512);
    expect_err(&b, "not aligned");
    b = one_tensor(2, ne, MDL_T_F32, 0, 511);
    expect_err(&b, "outside");
    b = one_tensor(2, ne, MDL_T_F32, UINT64_MAX - 31, 512);
    expect_err(&b, "outside");
    /* Two tensors overlapping by one block. */
    b = (buf_t){0};
    header(&b, 2, 0);
    tensor_info(&b, "a", 2, ne, MDL_T_F32, 0);
    tensor_info(&b, "b", 2, ne, MDL_T_F32, 480);
    pad_to(&b, 32);
    for (int i = 0; i < 1024; i++)
        u8(&b, 0);
    expect_err(&b, "overlap");
    b = (buf_t){0};
    header(&b, 2, 0);
    tensor_info(&b, "a", 2, ne, MDL_T_F32, 0);
    tensor_info(&b, "a", 2, ne, MDL_T_F32, 512);
    pad_to(&b, 32);
    for (int i = 0; i < 1024; i++)
        u8(&b, 0);
    expect_err(&b, "duplicate tensor name 'a'");
    /* Data section start beyond the end of the file. */
    b = (buf_t){0};
    header(&b, 1, 0);
    tensor_info(&b, "a", 2, ne, MDL_T_F32, 0);
    expect_err(&b, "data section");
}

static void test_file_errors(void **state)
{
    (void)state;
    char err[256] = "";
    assert_null(mdl_gguf_open("/nonexistent/x.gguf", err, sizeof(err)));
    assert_non_null(strstr(err, "No such file"));
    assert_null(mdl_gguf_open("/tmp", err, sizeof(err)));
    assert_non_null(strstr(err, "not a regular file"));
    char path[] = "/tmp/test_model_gguf_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    buf_t b = make_valid();
    assert_int_equal(write(fd, b.p, b.n), (ssize_t)b.n);
    close(fd);
    mdl_gguf_t *g = mdl_gguf_open(path, err, sizeof(err));
    assert_non_null(g);
    assert_int_equal(mdl_gguf_file_size(g), b.n);
    assert_non_null(mdl_gguf_tensor_find(g, "v"));
    mdl_gguf_free(g);
    mdl_gguf_free(NULL);
    unlink(path);
    free(b.p);
}

static void test_type_table(void **state)
{
    (void)state;
    assert_int_equal(mdl_ttype_block(MDL_T_Q4_K), 256);
    assert_int_equal(mdl_ttype_bytes(MDL_T_Q4_K), 144);
    assert_int_equal(mdl_ttype_bytes(MDL_T_Q6_K), 210);
    assert_int_equal(mdl_ttype_bytes(MDL_T_Q5_0), 22);
    assert_int_equal(mdl_ttype_bytes(MDL_T_Q8_0), 34);
    assert_int_equal(mdl_ttype_bytes(MDL_T_Q4_0), 18);
    assert_int_equal(mdl_ttype_block(5), 0);
    assert_int_equal(mdl_ttype_block(12345), 0);
    assert_string_equal(mdl_ttype_name(MDL_T_Q6_K), "Q6_K");
    assert_null(mdl_gv_type_name(13));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),       cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_bad_header),  cmocka_unit_test(test_huge_counts),
        cmocka_unit_test(test_bad_values),  cmocka_unit_test(test_bad_tensors),
        cmocka_unit_test(test_file_errors), cmocka_unit_test(test_type_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
