/*
 * test_conf.c — the configuration loader: value parsers, every row type
 * (through a test-only table), every error class with its exact
 * "file:line: key: message", defaults and bounds of sluice's own table,
 * reload comparison, the example conf, and the reference (which must match
 * docs/conf-reference.md byte for byte; regenerate it with
 * SLUICE_CONF_REFERENCE_UPDATE=1 build/tests/test_conf). Run from the
 * repository root.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "conf/conf.h"
#include "conf/conf_internal.h"

/* ---- helpers ---------------------------------------------------------------- */

static conf_t *load(const char *yaml, char *err, size_t errlen)
{
    return conf_load_string(yaml, strlen(yaml), "t.yaml", err, errlen);
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
    }
    fclose(f);
    if (buf)
        buf[n] = '\0';
    *len = n;
    return buf;
}

/* The reference as text; *text is the caller's (free()). */
static char *reference_text(const conf_table_t *t, char **text, size_t *len)
{
    FILE *out = open_memstream(text, len);
    assert_non_null(out);
    if (t == &conf_root_table)
        conf_reference_print(out);
    else
        conf_tree_reference(t, out);
    fclose(out);
    return *text;
}

#define LISTEN "listen:\n  - address: 127.0.0.1:8080\n"

/* ---- value parsers ------------------------------------------------------------ */

static void test_parse_duration(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        int64_t ms;
    } ok[] = {{"0", 0},         {"250", 250},
              {"250ms", 250},   {"10s", 10000},
              {"5m", 300000},   {"1h", 3600000},
              {"1d", 86400000}, {"90s", 90000},
              {"007s", 7000},   {"106751991167d", 106751991167LL * 86400000}};
    for (size_t i = 0; i < SL_ARRAY_LEN(ok); i++) {
        int64_t v = -1;
        assert_int_equal(conf_parse_duration_ms(ok[i].in, &v), 0);
        assert_int_equal(v, ok[i].ms);
    }
    static const char *const bad[] = {
        "",    "s",    "10 s", " 10s", "10S", "1.5s", "-1s",           "+1s",
        "10x", "1ms2", "1sec", "1k",   "1e3", "0x10", "106751991168d", "99999999999999999999"};
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++) {
        int64_t v = 42;
        assert_int_equal(conf_parse_duration_ms(bad[i], &v), -1);
        assert_int_equal(v, 42);
    }
    int64_t v;
    assert_int_equal(conf_parse_duration_ms(NULL, &v), -1);
}

static void test_parse_size(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        int64_t n;
    } ok[] = {{"0", 0},        {"512", 512},       {"16k", 16384},
              {"1m", 1048576}, {"1g", 1073741824}, {"256k", 262144},
              {"2M", 2097152}, {"1G", 1073741824}, {"8K", 8192}};
    for (size_t i = 0; i < SL_ARRAY_LEN(ok); i++) {
        int64_t v = -1;
        assert_int_equal(conf_parse_size(ok[i].in, &v), 0);
        assert_int_equal(v, ok[i].n);
    }
    static const char *const bad[] = {"",   "k",   "1kb",  "1 k", "1.5m",          "-1",
                                      "1t", "1mb", "1KiB", "1e3", "9999999999999g"};
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++) {
        int64_t v = 42;
        assert_int_equal(conf_parse_size(bad[i], &v), -1);
        assert_int_equal(v, 42);
    }
}

static void test_format(void **state)
{
    (void)state;
    char b[32];
    conf_format_duration(0, b, sizeof(b));
    assert_string_equal(b, "0");
    conf_format_duration(250, b, sizeof(b));
    assert_string_equal(b, "250ms");
    conf_format_duration(90000, b, sizeof(b));
    assert_string_equal(b, "90s");
    conf_format_duration(3600000, b, sizeof(b));
    assert_string_equal(b, "1h");
    conf_format_duration(86400000, b, sizeof(b));
    assert_string_equal(b, "1d");
    conf_format_size(16384, b, sizeof(b));
    assert_string_equal(b, "16k");
    conf_format_size(1 << 20, b, sizeof(b));
    assert_string_equal(b, "1m");
    conf_format_size(1000, b, sizeof(b));
    assert_string_equal(b, "1000");
}

/* ---- a test-only table with every row type ------------------------------------ */

typedef struct t_item {
    char *name;
    int line;
    int64_t n;
    char *s;
} t_item_t;

typedef struct t_sub {
    bool on;
    int64_t depth;
} t_sub_t;

typedef struct t_root {
    bool b;
    int64_t i;
    int64_t sz;
    int64_t d;
    char *s;
    int e;
    char **tags;
    size_t ntags;
    t_sub_t sub;
    t_item_t *items;
    size_t nitems;
    t_item_t *named;
    size_t nnamed;
    conf_kv_t *headers;
    size_t nheaders;
    int64_t fixed;
    int64_t auto_n;
} t_root_t;

static const char *const t_colours[] = {"red", "green", "blue", NULL};

static int t_even_check(void *obj, char *msg, size_t msglen)
{
    if (((t_item_t *)obj)->n % 2) {
        snprintf(msg, msglen, "must be even");
        return -1;
    }
    return 0;
}

static int t_sub_check(conf_ctx_t *ctx, void *obj, int line)
{
    const t_sub_t *s = obj;
    if (!s->on && s->depth != 3)
        return conf_errorf(ctx, line, "depth", "only with on: true");
    return 0;
}

static const conf_key_t t_item_keys[] = {
    {.name = "n",
     .type = CONF_INT,
     .off = offsetof(t_item_t, n),
     .def = "2",
     .min = -10,
     .max = 10,
     .check = t_even_check,
     .flags = CONF_RELOAD,
     .doc = "an even number"},
    {.name = "s",
     .type = CONF_STRING,
     .off = offsetof(t_item_t, s),
     .flags = CONF_RELOAD,
     .doc = "a string"},
};
static const conf_table_t t_item_table = {.keys = t_item_keys,
                                          .nkeys = SL_ARRAY_LEN(t_item_keys),
                                          .size = sizeof(t_item_t),
                                          .has_line = true,
                                          .line_off = offsetof(t_item_t, line),
                                          .has_name = true,
                                          .name_off = offsetof(t_item_t, name)};

static const conf_key_t t_sub_keys[] = {
    {.name = "on",
     .type = CONF_BOOL,
     .off = offsetof(t_sub_t, on),
     .def = "false",
     .flags = CONF_RELOAD,
     .doc = "a switch"},
    {.name = "depth",
     .type = CONF_INT,
     .off = offsetof(t_sub_t, depth),
     .def = "3",
     .min = 0,
     .max = 9,
     .flags = CONF_RELOAD,
     .doc = "a depth"},
};
static const conf_table_t t_sub_table = {.keys = t_sub_keys,
                                         .nkeys = SL_ARRAY_LEN(t_sub_keys),
                                         .size = sizeof(t_sub_t),
                                         .check = t_sub_check};

static const conf_key_t t_root_keys[] = {
    {.name = "b",
     .type = CONF_BOOL,
     .off = offsetof(t_root_t, b),
     .def = "true",
     .flags = CONF_RELOAD,
     .doc = "a bool"},
    {.name = "i",
     .type = CONF_INT,
     .off = offsetof(t_root_t, i),
     .def = "-5",
     .min = -100,
     .max = 100,
     .flags = CONF_RELOAD,
     .doc = "an int"},
    {.name = "sz",
     .type = CONF_SIZE,
     .off = offsetof(t_root_t, sz),
     .def = "4k",
     .min = 1024,
     .max = 1 << 20,
     .flags = CONF_RELOAD,
     .doc = "a size"},
    {.name = "d",
     .type = CONF_DURATION,
     .off = offsetof(t_root_t, d),
     .def = "1s",
     .min = 100,
     .max = 60000,
     .flags = CONF_RELOAD,
     .doc = "a duration"},
    {.name = "s",
     .type = CONF_STRING,
     .off = offsetof(t_root_t, s),
     .def = "dflt",
     .flags = CONF_RELOAD,
     .doc = "a string | with a bar"},
    {.name = "e",
     .type = CONF_ENUM,
     .off = offsetof(t_root_t, e),
     .def = "green",
     .enums = t_colours,
     .flags = CONF_RELOAD,
     .doc = "a colour"},
    {.name = "tags",
     .type = CONF_STRLIST,
     .off = offsetof(t_root_t, tags),
     .count_off = offsetof(t_root_t, ntags),
     .min = 0,
     .max = 3,
     .flags = CONF_RELOAD,
     .doc = "strings"},
    {.name = "sub",
     .type = CONF_STRUCT,
     .off = offsetof(t_root_t, sub),
     .sub = &t_sub_table,
     .flags = CONF_RELOAD,
     .doc = "a section"},
    {.name = "items",
     .type = CONF_LIST,
     .off = offsetof(t_root_t, items),
     .count_off = offsetof(t_root_t, nitems),
     .min = 0,
     .max = 4,
     .sub = &t_item_table,
     .flags = CONF_RELOAD,
     .doc = "a list"},
    {.name = "named",
     .type = CONF_MAP,
     .off = offsetof(t_root_t, named),
     .count_off = offsetof(t_root_t, nnamed),
     .min = 0,
     .max = 4,
     .sub = &t_item_table,
     .doc = "a map"},
    {.name = "headers",
     .type = CONF_STRMAP,
     .off = offsetof(t_root_t, headers),
     .count_off = offsetof(t_root_t, nheaders),
     .min = 0,
     .max = 3,
     .flags = CONF_RELOAD,
     .doc = "a string map"},
    {.name = "fixed",
     .type = CONF_INT,
     .off = offsetof(t_root_t, fixed),
     .def = "1",
     .min = 0,
     .max = 9,
     .doc = "restart only"},
    {.name = "auto_n",
     .type = CONF_INT,
     .off = offsetof(t_root_t, auto_n),
     .def = "auto",
     .min = 1,
     .max = 8,
     .flags = CONF_AUTO | CONF_RELOAD,
     .doc = "auto or 1..8"},
};
static const conf_table_t t_root_table = {
    .keys = t_root_keys, .nkeys = SL_ARRAY_LEN(t_root_keys), .size = sizeof(t_root_t)};

static int t_load(t_root_t *r, const char *yaml, char *err, size_t errlen)
{
    memset(r, 0, sizeof(*r));
    return conf_tree_load(&t_root_table, r, yaml, strlen(yaml), "x.yaml", err, errlen);
}

static void test_types_defaults(void **state)
{
    (void)state;
    t_root_t r;
    char err[512];
    assert_int_equal(conf_table_validate(&t_root_table, err, sizeof(err)), 0);
    if (t_load(&r, "", err, sizeof(err)) != 0)
        fail_msg("%s", err);
    assert_true(r.b);
    assert_int_equal(r.i, -5);
    assert_int_equal(r.sz, 4096);
    assert_int_equal(r.d, 1000);
    assert_string_equal(r.s, "dflt");
    assert_int_equal(r.e, 1);
    assert_int_equal(r.ntags, 0);
    assert_null(r.tags);
    assert_false(r.sub.on);
    assert_int_equal(r.sub.depth, 3);
    assert_int_equal(r.nitems, 0);
    assert_int_equal(r.nnamed, 0);
    assert_int_equal(r.nheaders, 0);
    assert_int_equal(r.auto_n, 0);
    conf_tree_free(&t_root_table, &r);
    assert_null(r.s);
}

static void test_types_values(void **state)
{
    (void)state;
    t_root_t r;
    char err[512];
    const char *yaml = "b: false\n"                          /* 1 */
                       "i: -100\n"                           /* 2 */
                       "sz: 1m\n"                            /* 3 */
                       "d: 250ms\n"                          /* 4 */
                       "s: \"hello world\"\n"                /* 5 */
                       "e: blue\n"                           /* 6 */
                       "tags: [a, \"b c\", '7']\n"           /* 7 */
                       "sub: { on: true, depth: 0 }\n"       /* 8 */
                       "items:\n"                            /* 9 */
                       "  - { n: 4, s: x }\n"                /* 10 */
                       "  -\n"                               /* 11 */
                       "    n: -6\n"                         /* 12 */
                       "named:\n"                            /* 13 */
                       "  first: { n: 8 }\n"                 /* 14 */
                       "  second: {}\n"                      /* 15 */
                       "headers: { X-A: \"1\", x-b: two }\n" /* 16 */
                       "auto_n: 8\n";                        /* 17 */
    assert_int_equal(t_load(&r, yaml, err, sizeof(err)), 0);
    assert_false(r.b);
    assert_int_equal(r.i, -100);
    assert_int_equal(r.sz, 1 << 20);
    assert_int_equal(r.d, 250);
    assert_string_equal(r.s, "hello world");
    assert_int_equal(r.e, 2);
    assert_int_equal(r.ntags, 3);
    assert_string_equal(r.tags[0], "a");
    assert_string_equal(r.tags[1], "b c");
    assert_string_equal(r.tags[2], "7");
    assert_true(r.sub.on);
    assert_int_equal(r.sub.depth, 0);
    assert_int_equal(r.nitems, 2);
    assert_int_equal(r.items[0].n, 4);
    assert_string_equal(r.items[0].s, "x");
    assert_int_equal(r.items[0].line, 10);
    assert_int_equal(r.items[1].n, -6);
    assert_null(r.items[1].s);
    assert_int_equal(r.items[1].line, 12);
    assert_int_equal(r.nnamed, 2);
    assert_string_equal(r.named[0].name, "first");
    assert_int_equal(r.named[0].n, 8);
    assert_int_equal(r.named[0].line, 14);
    assert_string_equal(r.named[1].name, "second");
    assert_int_equal(r.named[1].n, 2);
    assert_int_equal(r.named[1].line, 15);
    assert_int_equal(r.nheaders, 2);
    assert_string_equal(r.headers[0].key, "X-A");
    assert_string_equal(r.headers[0].value, "1");
    assert_int_equal(r.headers[0].line, 16);
    assert_string_equal(r.headers[1].key, "x-b");
    assert_string_equal(r.headers[1].value, "two");
    assert_int_equal(r.auto_n, 8);
    conf_tree_free(&t_root_table, &r);
    assert_null(r.items);
    assert_int_equal(r.nitems, 0);
    assert_null(r.headers);

    /* Empty values of collections are empty, not errors. */
    assert_int_equal(t_load(&r, "tags:\nitems: []\nnamed:\nheaders: {}\nsub:\n", err, sizeof(err)),
                     0);
    assert_int_equal(r.ntags + r.nitems + r.nnamed + r.nheaders, 0);
    conf_tree_free(&t_root_table, &r);
}

static void test_types_errors(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        const char *err;
    } cases[] = {
        {"b: yes\n", "x.yaml:1: b: expected true or false, got \"yes\""},
        {"b: 1\n", "x.yaml:1: b: expected true or false, got \"1\""},
        {"b: True\n", "x.yaml:1: b: expected true or false, got \"True\""},
        {"b:\n", "x.yaml:1: b: expected true or false, got nothing"},
        {"b: [true]\n", "x.yaml:1: b: expected true or false, got a list"},
        {"i: 1.5\n", "x.yaml:1: i: expected an integer, got \"1.5\""},
        {"i: +3\n", "x.yaml:1: i: expected an integer, got \"+3\""},
        {"i: 101\n", "x.yaml:1: i: 101 is out of bounds (-100..100)"},
        {"i: -101\n", "x.yaml:1: i: -101 is out of bounds (-100..100)"},
        {"i: 99999999999999999999\n",
         "x.yaml:1: i: expected an integer, got \"99999999999999999999\""},
        {"\n\nsz: 10q\n", "x.yaml:3: sz: expected a size (e.g. 512, 16k, 1m, 1g), got \"10q\""},
        {"sz: 1023\n", "x.yaml:1: sz: 1023 is out of bounds (1k..1m)"},
        {"sz: 2m\n", "x.yaml:1: sz: 2m is out of bounds (1k..1m)"},
        {"d: 2x\n", "x.yaml:1: d: expected a duration (e.g. 250ms, 10s, 5m, 1h, 1d), got \"2x\""},
        {"d: 99ms\n", "x.yaml:1: d: 99ms is out of bounds (100ms..1m)"},
        {"d: 2m\n", "x.yaml:1: d: 2m is out of bounds (100ms..1m)"},
        {"s: ''\n", "x.yaml:1: s: must not be empty"},
        {"s: { a: 1 }\n", "x.yaml:1: s: expected a string, got a mapping"},
        {"s: ~\n", "x.yaml:1: s: expected a string, got nothing"},
        {"s: \"a\\0b\"\n", "x.yaml:1: s: value contains a NUL byte"},
        {"e: purple\n", "x.yaml:1: e: expected one of red, green, blue, got \"purple\""},
        {"tags: a\n", "x.yaml:1: tags: expected a list of strings, got \"a\""},
        {"tags: [a, [b]]\n", "x.yaml:1: tags[1]: expected a string, got a list"},
        {"tags: [a, '']\n", "x.yaml:1: tags[1]: must not be empty"},
        {"tags: [a, b, c, d]\n", "x.yaml:1: tags: at most 3 items allowed, got 4"},
        {"sub: 1\n", "x.yaml:1: sub: expected a mapping, got \"1\""},
        {"sub:\n  on: false\n  depth: 4\n", "x.yaml:1: sub.depth: only with on: true"},
        {"sub:\n  on: true\n  wat: 4\n", "x.yaml:3: sub.wat: unknown key"},
        {"sub:\n  on: true\n  on: false\n", "x.yaml:3: sub.on: duplicate key (first at line 2)"},
        {"items: {}\n", "x.yaml:1: items: expected a list of mappings, got a mapping"},
        {"items:\n  - n: 2\n  - n: 3\n", "x.yaml:3: items[1].n: must be even"},
        {"items:\n  - n: 2\n  - 5\n", "x.yaml:3: items[1]: expected a mapping, got \"5\""},
        {"items: [{}, {}, {}, {}, {}]\n", "x.yaml:1: items: at most 4 items allowed, got 5"},
        {"named:\n  a: {}\n  b: { n: 11 }\n", "x.yaml:3: named.b.n: 11 is out of bounds (-10..10)"},
        {"named:\n  a: {}\n  a: {}\n", "x.yaml:3: named.a: duplicate key (first at line 2)"},
        {"named:\n  a: []\n", "x.yaml:2: named.a: expected a mapping, got a list"},
        {"named: [a]\n", "x.yaml:1: named: expected a mapping, got a list"},
        {"named:\n  [a]: {}\n", "x.yaml:2: named: expected a name, got a list"},
        {"headers: { a: 1, a: 2 }\n", "x.yaml:1: headers.a: duplicate key (first at line 1)"},
        {"headers: { a: [1] }\n", "x.yaml:1: headers.a: expected a string, got a list"},
        {"headers: [a]\n", "x.yaml:1: headers: expected a mapping, got a list"},
        {"auto_n: 0\n", "x.yaml:1: auto_n: 0 is out of bounds (1..8)"},
        {"auto_n: automatic\n", "x.yaml:1: auto_n: expected an integer or auto, got \"automatic\""},
        {"i: &x 3\nfixed: *x\n", "x.yaml:2: fixed: YAML aliases (*name) are not supported"},
        {"sub: &s { on: true, depth: *s }\n",
         "x.yaml:1: sub.depth: YAML aliases (*name) are not supported"},
        {"? [a]\n: 1\n", "x.yaml:1: expected a key, got a list"},
        {"\"b\\nx\": 1\n", "x.yaml:1: b?x: unknown key"},
        {"[1, 2]\n", "x.yaml:1: expected a mapping, got a list"},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        t_root_t r;
        char err[512] = "";
        int rc = t_load(&r, cases[i].yaml, err, sizeof(err));
        if (rc != -1 || strcmp(err, cases[i].err) != 0)
            fail_msg("case %zu: %s\n  want: %s\n  got:  %s (rc %d)", i, cases[i].yaml, cases[i].err,
                     err, rc);
        conf_tree_free(&t_root_table, &r);
    }
}

static void test_types_diff_and_reference(void **state)
{
    (void)state;
    t_root_t a, b;
    char err[512];
    assert_int_equal(t_load(&a, "fixed: 2\nnamed: { x: { n: 4 } }\n", err, sizeof(err)), 0);
    assert_int_equal(
        t_load(&b, "fixed: 2\nnamed: { x: { n: 4 } }\ni: 7\nitems: [{}]\n", err, sizeof(err)), 0);
    assert_int_equal(conf_tree_diff(&t_root_table, &a, &b, err, sizeof(err)), 0);
    conf_tree_free(&t_root_table, &b);

    assert_int_equal(t_load(&b, "fixed: 3\nnamed: { x: { n: 4 } }\n", err, sizeof(err)), 0);
    assert_int_equal(conf_tree_diff(&t_root_table, &a, &b, err, sizeof(err)), -1);
    assert_string_equal(err, "fixed: changed; needs a restart");
    conf_tree_free(&t_root_table, &b);

    assert_int_equal(t_load(&b, "fixed: 2\nnamed: { x: { n: 6 } }\n", err, sizeof(err)), 0);
    assert_int_equal(conf_tree_diff(&t_root_table, &a, &b, err, sizeof(err)), -1);
    assert_string_equal(err, "named.x.n: changed; needs a restart");
    conf_tree_free(&t_root_table, &b);

    assert_int_equal(t_load(&b, "fixed: 2\nnamed: { y: { n: 4 } }\n", err, sizeof(err)), 0);
    assert_int_equal(conf_tree_diff(&t_root_table, &a, &b, err, sizeof(err)), -1);
    assert_string_equal(err, "named: changed; needs a restart");
    conf_tree_free(&t_root_table, &b);
    conf_tree_free(&t_root_table, &a);

    size_t len;
    char *ref = NULL;
    reference_text(&t_root_table, &ref, &len);
    assert_non_null(strstr(ref, "| `b` | bool | `true` |  | yes | a bool |\n"));
    assert_non_null(strstr(ref, "| `i` | integer | `-5` | -100..100 | yes | an int |\n"));
    assert_non_null(strstr(ref, "| `sz` | size | `4k` | 1k..1m | yes | a size |\n"));
    assert_non_null(strstr(ref, "| `d` | duration | `1s` | 100ms..1m | yes | a duration |\n"));
    assert_non_null(strstr(ref, "| `s` | string | `dflt` |  | yes | a string \\| with a bar |\n"));
    assert_non_null(
        strstr(ref, "| `e` | enum | `green` | `red`, `green`, `blue` | yes | a colour |\n"));
    assert_non_null(strstr(ref, "| `tags` | list of strings | empty | 0..3 items | yes |"));
    assert_non_null(strstr(ref, "| `sub.depth` | integer | `3` | 0..9 | yes | a depth |\n"));
    assert_non_null(strstr(ref, "| `items[].n` | integer | `2` | -10..10 | yes |"));
    assert_non_null(strstr(ref, "| `named.<name>.s` | string | none |  | no | a string |\n"));
    assert_non_null(strstr(ref, "| `headers` | map of strings | empty | 0..3 items | yes |"));
    assert_non_null(strstr(ref, "| `auto_n` | integer | `auto` | 1..8 or `auto` | yes |"));
    free(ref);
}

/* A table the self-check must refuse, one defect at a time. */
static void test_table_validate_rejects(void **state)
{
    (void)state;
    char err[512];
    t_root_t dummy;
    (void)dummy;
    conf_key_t k[1];
    conf_table_t t = {.keys = k, .nkeys = 1, .size = sizeof(t_root_t)};

    k[0] = (conf_key_t){.name = "i",
                        .type = CONF_INT,
                        .off = offsetof(t_root_t, i),
                        .def = "1",
                        .doc = "x"}; /* no bounds */
    assert_int_equal(conf_table_validate(&t, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "i: numbers and collections need bounds"));

    k[0] = (conf_key_t){
        .name = "i", .type = CONF_INT, .off = sizeof(t_root_t), .def = "1", .max = 9, .doc = "x"};
    assert_int_equal(conf_table_validate(&t, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "offset outside the struct"));

    k[0] = (conf_key_t){.name = "i",
                        .type = CONF_INT,
                        .off = offsetof(t_root_t, i),
                        .def = "10",
                        .max = 9,
                        .doc = "x"};
    assert_int_equal(conf_table_validate(&t, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "i: 10 is out of bounds (0..9)"));

    k[0] = (conf_key_t){.name = "i",
                        .type = CONF_INT,
                        .off = offsetof(t_root_t, i),
                        .def = "1",
                        .max = 9,
                        .flags = CONF_REQUIRED,
                        .doc = "x"};
    assert_int_equal(conf_table_validate(&t, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "required and a default"));

    k[0] = (conf_key_t){
        .name = "i", .type = CONF_INT, .off = offsetof(t_root_t, i), .max = 9, .doc = "x"};
    assert_int_equal(conf_table_validate(&t, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "needs a default"));

    k[0] = (conf_key_t){.name = "items",
                        .type = CONF_LIST,
                        .off = offsetof(t_root_t, items),
                        .count_off = offsetof(t_root_t, nitems),
                        .max = 4,
                        .sub = &t_item_table,
                        .flags = CONF_RELOAD,
                        .doc = "x"};
    assert_int_equal(conf_table_validate(&t, err, sizeof(err)), 0);
    k[0].flags = 0; /* a restart-only list may hold rows marked reloadable */
    assert_int_equal(conf_table_validate(&t, err, sizeof(err)), 0);
    /* ... but a reloadable list must not hold restart-only rows. */
    static const conf_key_t fixed_n[] = {{.name = "n",
                                          .type = CONF_INT,
                                          .off = offsetof(t_item_t, n),
                                          .def = "2",
                                          .max = 9,
                                          .doc = "x"}};
    conf_table_t fixed_item = t_item_table;
    fixed_item.keys = fixed_n;
    fixed_item.nkeys = 1;
    k[0].sub = &fixed_item;
    k[0].flags = CONF_RELOAD;
    assert_int_equal(conf_table_validate(&t, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "items.n: restart-only inside a reloadable list or map"));
    k[0].sub = &t_item_table;
    k[0].flags = CONF_RELOAD;
    k[0].min = 1; /* non-empty but optional */
    assert_int_equal(conf_table_validate(&t, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "must be CONF_REQUIRED"));
}

/* ---- sluice's table: defaults, values, errors ---------------------------------- */

static void test_root_table_valid(void **state)
{
    (void)state;
    char err[512];
    if (conf_table_validate(&conf_root_table, err, sizeof(err)) != 0)
        fail_msg("%s", err);
}

static void test_defaults(void **state)
{
    (void)state;
    char err[512] = "";
    conf_t *c = load(LISTEN, err, sizeof(err));
    if (!c)
        fail_msg("%s", err);
    assert_string_equal(c->path, "t.yaml");
    assert_int_equal(c->nlisten, 1);
    assert_string_equal(c->listen[0].address, "127.0.0.1:8080");
    assert_string_equal(c->listen[0].host, "127.0.0.1");
    assert_int_equal(c->listen[0].port, 8080);
    assert_int_equal(c->listen[0].line, 2);
    assert_null(c->listen[0].tls_cert);
    assert_null(c->listen[0].tls_key);
    assert_string_equal(c->admin.address, "127.0.0.1:9090");
    assert_string_equal(c->admin.host, "127.0.0.1");
    assert_int_equal(c->admin.port, 9090);
    assert_int_equal(c->workers, 0);
    assert_int_equal(c->shutdown_timeout_ms, 30000);
    assert_int_equal(c->limits.request_line_bytes, 8192);
    assert_int_equal(c->limits.header_bytes, 16384);
    assert_int_equal(c->limits.header_lines, 100);
    assert_int_equal(c->limits.max_body_bytes, 1 << 20);
    assert_int_equal(c->limits.header_timeout_ms, 10000);
    assert_int_equal(c->limits.body_timeout_ms, 30000);
    assert_int_equal(c->limits.keepalive_timeout_ms, 60000);
    assert_int_equal(c->limits.send_timeout_ms, 60000);
    assert_int_equal(c->limits.max_connections, 10000);
    assert_int_equal(c->limits.keepalive_requests, 1000);
    assert_int_equal(c->nupstreams, 0);
    assert_null(c->upstreams);
    assert_int_equal(c->nmodels, 0);
    assert_int_equal(c->sse.ping_interval_ms, 15000);
    assert_int_equal(c->sse.max_event_bytes, 1 << 20);
    assert_int_equal(c->sse.buffer_bytes, 256 << 10);
    assert_string_equal(c->log.access, "stdout");
    assert_string_equal(c->log.level, "info");
    assert_null(conf_upstream_find(c, "main"));
    assert_null(conf_model_find(c, "chat-model"));
    conf_free(c);
    conf_free(NULL);
}

/* The shape given in issue 2, every key set. */
static const char issue_yaml[] =
    "listen:\n"                                                                   /* 1 */
    "  - address: 127.0.0.1:8080\n"                                               /* 2 */
    "  - address: 0.0.0.0:8443\n"                                                 /* 3 */
    "    tls: { cert: conf/tls/server.crt, key: conf/tls/server.key }\n"          /* 4 */
    "  - address: \"[::1]:8081\"\n"                                               /* 5 */
    "admin: { address: 127.0.0.1:9091 }\n"                                        /* 6 */
    "workers: 4\n"                                                                /* 7 */
    "shutdown_timeout: 5s\n"                                                      /* 8 */
    "limits: { max_body_bytes: 2m, header_timeout: 5s, keepalive_timeout: 1m }\n" /* 9 */
    "upstreams:\n"                                                                /* 10 */
    "  main:\n"                                                                   /* 11 */
    "    servers: [ { url: \"http://127.0.0.1:8000\", weight: 1 },\n"             /* 12 */
    "               { url: \"https://gpu.example:8443\", weight: 3 },\n"          /* 13 */
    "               { url: \"https://[2001:db8::1]/\" } ]\n"                      /* 14 */
    "    balance: least_conn\n"                                                   /* 15 */
    "    api_key_env: UPSTREAM_API_KEY\n"                                         /* 16 */
    "    tls: { ca_file: /etc/ssl/certs/ca-certificates.crt }\n"                  /* 17 */
    "    keepalive: 32\n"                                                         /* 18 */
    "    timeouts: { connect: 1s, first_byte: 20s, total: 2m }\n"                 /* 19 */
    "    max_fails: 5\n"                                                          /* 20 */
    "    eject: 30s\n"                                                            /* 21 */
    "  spare:\n"                                                                  /* 22 */
    "    servers:\n"                                                              /* 23 */
    "      - url: http://10.0.0.2\n"                                              /* 24 */
    "models:\n"                                                                   /* 25 */
    "  chat-model: { upstream: main, name: Qwen2.5-7B-Instruct }\n"               /* 26 */
    "  small: { upstream: spare }\n"                                              /* 27 */
    "sse: { ping_interval: 0, max_event_bytes: 64k, buffer_bytes: 1m }\n"         /* 28 */
    "log: { access: /var/log/sluice/access.log, level: debug }\n";                /* 29 */

static void test_issue_shape(void **state)
{
    (void)state;
    char err[512] = "";
    conf_t *c = load(issue_yaml, err, sizeof(err));
    if (!c)
        fail_msg("%s", err);
    assert_int_equal(c->nlisten, 3);
    assert_string_equal(c->listen[1].address, "0.0.0.0:8443");
    assert_string_equal(c->listen[1].tls_cert, "conf/tls/server.crt");
    assert_string_equal(c->listen[1].tls_key, "conf/tls/server.key");
    assert_int_equal(c->listen[1].line, 3);
    assert_int_equal(c->listen[1].port, 8443);
    assert_string_equal(c->listen[2].host, "::1");
    assert_int_equal(c->listen[2].port, 8081);
    assert_int_equal(c->admin.port, 9091);
    assert_int_equal(c->workers, 4);
    assert_int_equal(c->shutdown_timeout_ms, 5000);
    assert_int_equal(c->limits.max_body_bytes, 2 << 20);
    assert_int_equal(c->limits.header_timeout_ms, 5000);
    assert_int_equal(c->limits.keepalive_timeout_ms, 60000);
    assert_int_equal(c->limits.body_timeout_ms, 30000); /* untouched default */

    assert_int_equal(c->nupstreams, 2);
    const conf_upstream_t *u = conf_upstream_find(c, "main");
    assert_ptr_equal(u, &c->upstreams[0]);
    assert_string_equal(u->name, "main");
    assert_int_equal(u->line, 11);
    assert_int_equal(u->nservers, 3);
    assert_string_equal(u->servers[0].url, "http://127.0.0.1:8000");
    assert_false(u->servers[0].https);
    assert_string_equal(u->servers[0].host, "127.0.0.1");
    assert_int_equal(u->servers[0].port, 8000);
    assert_int_equal(u->servers[0].weight, 1);
    assert_int_equal(u->servers[0].line, 12);
    assert_true(u->servers[1].https);
    assert_string_equal(u->servers[1].host, "gpu.example");
    assert_int_equal(u->servers[1].port, 8443);
    assert_int_equal(u->servers[1].weight, 3);
    assert_int_equal(u->servers[1].line, 13);
    assert_string_equal(u->servers[2].host, "2001:db8::1");
    assert_int_equal(u->servers[2].port, 443);
    assert_int_equal(u->servers[2].weight, 1);
    assert_int_equal(u->balance, CONF_BALANCE_LEAST_CONN);
    assert_string_equal(u->api_key_env, "UPSTREAM_API_KEY");
    assert_string_equal(u->tls_ca_file, "/etc/ssl/certs/ca-certificates.crt");
    assert_int_equal(u->keepalive, 32);
    assert_int_equal(u->connect_timeout_ms, 1000);
    assert_int_equal(u->first_byte_timeout_ms, 20000);
    assert_int_equal(u->total_timeout_ms, 120000);
    assert_int_equal(u->max_fails, 5);
    assert_int_equal(u->eject_ms, 30000);

    const conf_upstream_t *s = conf_upstream_find(c, "spare");
    assert_non_null(s);
    assert_int_equal(s->line, 22);
    assert_int_equal(s->servers[0].port, 80);
    assert_int_equal(s->servers[0].line, 24);
    assert_int_equal(s->balance, CONF_BALANCE_ROUND_ROBIN);
    assert_null(s->api_key_env);
    assert_null(s->tls_ca_file);
    assert_int_equal(s->keepalive, 10000); /* the default */
    assert_int_equal(s->keepalive_timeout_ms, 4000);
    assert_int_equal(s->connect_timeout_ms, 2000);
    assert_int_equal(s->first_byte_timeout_ms, 15000);
    assert_int_equal(s->total_timeout_ms, 60000);
    assert_int_equal(s->max_fails, 0); /* 0: fallback.circuit decides */
    assert_int_equal(s->eject_ms, 0);
    assert_null(conf_upstream_find(c, "nope"));
    assert_null(conf_upstream_find(c, NULL));

    assert_int_equal(c->nmodels, 2);
    const conf_model_t *m = conf_model_find(c, "chat-model");
    assert_non_null(m);
    assert_string_equal(m->upstream, "main");
    assert_string_equal(m->served, "Qwen2.5-7B-Instruct");
    assert_int_equal(m->line, 26);
    m = conf_model_find(c, "small");
    assert_non_null(m);
    assert_null(m->served);
    assert_null(conf_model_find(c, "Qwen2.5-7B-Instruct"));

    assert_int_equal(c->sse.ping_interval_ms, 0);
    assert_int_equal(c->sse.max_event_bytes, 64 << 10);
    assert_int_equal(c->sse.buffer_bytes, 1 << 20);
    assert_string_equal(c->log.access, "/var/log/sluice/access.log");
    assert_string_equal(c->log.level, "debug");
    conf_free(c);
}

static void test_errors(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        const char *err;
    } cases[] = {
        /* listen */
        {"", "t.yaml:1: listen: missing (required)"},
        {"# nothing\n\nworkers: 2\n", "t.yaml:3: listen: missing (required)"},
        {"listen: []\n", "t.yaml:1: listen: needs at least 1 item, got 0"},
        {"listen:\n", "t.yaml:1: listen: needs at least 1 item, got 0"},
        {"listen:\n  - tls: { cert: a, key: b }\n",
         "t.yaml:2: listen[0].address: missing (required)"},
        {"listen:\n  - address: localhost\n",
         "t.yaml:2: listen[0].address: expected HOST:PORT, got \"localhost\""},
        {"listen:\n  - address: :8080\n", "t.yaml:2: listen[0].address: bad host in \":8080\""},
        {"listen:\n  - address: a:1\n  - address: 0.0.0.0:70000\n",
         "t.yaml:3: listen[1].address: bad port \"70000\" (1..65535)"},
        {"listen:\n  - address: 0.0.0.0:0\n",
         "t.yaml:2: listen[0].address: bad port \"0\" (1..65535)"},
        {"listen:\n  - address: 0.0.0.0:80x\n",
         "t.yaml:2: listen[0].address: bad port \"80x\" (1..65535)"},
        {"listen:\n  - address: ::1:8080\n",
         "t.yaml:2: listen[0].address: an IPv6 address needs brackets: \"[::1]:8080\""},
        {"listen:\n  - address: '[::g]:8080'\n",
         "t.yaml:2: listen[0].address: bad IPv6 address \"::g\""},
        {"listen:\n  - address: '[::1'\n", "t.yaml:2: listen[0].address: unclosed '[' in \"[::1\""},
        {"listen:\n  - address: '[::1]8080'\n",
         "t.yaml:2: listen[0].address: expected HOST:PORT, got \"[::1]8080\""},
        {"listen:\n  - address: a b:1\n", "t.yaml:2: listen[0].address: bad host in \"a b:1\""},
        {"listen:\n  - address: 1.2.3.4:443\n    tls: { cert: a.crt }\n",
         "t.yaml:3: listen[0].tls: needs both cert and key (or neither)"},
        {"listen:\n  - address: 1.2.3.4:443\n    tls:\n      key: a.key\n",
         "t.yaml:3: listen[0].tls: needs both cert and key (or neither)"},
        {"listen:\n  - address: 1.2.3.4:443\n    tls: { cert: a, key: b, ca: c }\n",
         "t.yaml:3: listen[0].tls.ca: unknown key"},
        {"listen:\n  address: 1.2.3.4:443\n",
         "t.yaml:2: listen: expected a list of mappings, got a mapping"},
        /* admin, workers, shutdown_timeout */
        {LISTEN "admin: { address: nowhere }\n",
         "t.yaml:3: admin.address: expected HOST:PORT, got \"nowhere\""},
        {LISTEN "admin: off\n", "t.yaml:3: admin: expected a mapping, got \"off\""},
        {LISTEN "workers: many\n", "t.yaml:3: workers: expected an integer or auto, got \"many\""},
        {LISTEN "workers: 0\n", "t.yaml:3: workers: 0 is out of bounds (1..256)"},
        {LISTEN "workers: 257\n", "t.yaml:3: workers: 257 is out of bounds (1..256)"},
        {LISTEN "workers:\n", "t.yaml:3: workers: expected an integer or auto, got nothing"},
        {LISTEN "workers: 2\nworkers: 3\n", "t.yaml:4: workers: duplicate key (first at line 3)"},
        {LISTEN "shutdown_timeout: 2x\n",
         "t.yaml:3: shutdown_timeout: expected a duration (e.g. 250ms, 10s, 5m, 1h, 1d), got "
         "\"2x\""},
        {LISTEN "shutdown_timeout: 2h\n",
         "t.yaml:3: shutdown_timeout: 2h is out of bounds (0..1h)"},
        {LISTEN "bogus: 1\n", "t.yaml:3: bogus: unknown key"},
        /* limits */
        {LISTEN "limits: []\n", "t.yaml:3: limits: expected a mapping, got a list"},
        {LISTEN "limits:\n  max_body_bytes: 1t\n",
         "t.yaml:4: limits.max_body_bytes: expected a size (e.g. 512, 16k, 1m, 1g), got \"1t\""},
        {LISTEN "limits:\n  max_body_bytes: 2g\n",
         "t.yaml:4: limits.max_body_bytes: 2g is out of bounds (1k..1g)"},
        {LISTEN "limits:\n  header_lines: 0\n",
         "t.yaml:4: limits.header_lines: 0 is out of bounds (1..10000)"},
        {LISTEN "limits:\n  header_timeout: 50ms\n",
         "t.yaml:4: limits.header_timeout: 50ms is out of bounds (100ms..1h)"},
        {LISTEN "limits:\n  foo: 1\n", "t.yaml:4: limits.foo: unknown key"},
        /* upstreams */
        {LISTEN "upstreams:\n  u: { servers: [] }\n",
         "t.yaml:4: upstreams.u.servers: required (or engine: { model })"},
        {LISTEN "upstreams:\n  u:\n    balance: least_conn\n",
         "t.yaml:4: upstreams.u.servers: required (or engine: { model })"},
        {LISTEN "upstreams:\n  u:\n    servers: [ { url: \"http://h\" } ]\n"
                "    engine: { model: m.gguf }\n",
         "t.yaml:4: upstreams.u.engine: an upstream has servers or an engine, not both"},
        {LISTEN "upstreams:\n  u:\n    engine: { threads: 2 }\n",
         "t.yaml:4: upstreams.u.servers: required (or engine: { model })"},
        {LISTEN "upstreams:\n  u:\n",
         "t.yaml:4: upstreams.u.servers: required (or engine: { model })"},
        {LISTEN "upstreams:\n  u: { servers: [{weight: 2}] }\n",
         "t.yaml:4: upstreams.u.servers[0].url: missing (required)"},
        {LISTEN "upstreams:\n  u: { servers: [\"http://a\"] }\n",
         "t.yaml:4: upstreams.u.servers[0]: expected a mapping, got \"http://a\""},
        {LISTEN "upstreams:\n  u:\n    servers:\n      - url: http://a\n    balance: random\n",
         "t.yaml:7: upstreams.u.balance: expected one of round_robin, least_conn, got \"random\""},
        {LISTEN "upstreams:\n  u:\n    servers:\n      - url: ftp://a\n",
         "t.yaml:6: upstreams.u.servers[0].url: expected http://HOST[:PORT][/PATH] or "
         "https://HOST[:PORT][/PATH]"},
        {LISTEN "upstreams:\n  u:\n    servers:\n      - url: http://a:8000/v1?x=1\n",
         "t.yaml:6: upstreams.u.servers[0].url: must not have a query or fragment; the path is a "
         "base path: /v1/... of a request goes to BASE/..."},
        {LISTEN "upstreams:\n  u:\n    servers:\n      - url: http://a?x=1\n",
         "t.yaml:6: upstreams.u.servers[0].url: must not have a query or fragment (\"?x=1\")"},
        {LISTEN "upstreams:\n  u:\n    servers:\n      - url: http://user:pw@a\n",
         "t.yaml:6: upstreams.u.servers[0].url: must not have user info (use api_key_env for "
         "credentials)"},
        {LISTEN "upstreams:\n  u:\n    servers:\n      - url: http://a:99999\n",
         "t.yaml:6: upstreams.u.servers[0].url: bad port \"99999\" (1..65535)"},
        {LISTEN "upstreams:\n  u:\n    servers:\n      - url: 'http://a:'\n",
         "t.yaml:6: upstreams.u.servers[0].url: bad port \"\" (1..65535)"},
        {LISTEN "upstreams:\n  u:\n    servers:\n      - url: http://\n",
         "t.yaml:6: upstreams.u.servers[0].url: bad host in \"http://\""},
        {LISTEN "upstreams:\n  u:\n    servers:\n      - url: HTTP://a\n",
         "t.yaml:6: upstreams.u.servers[0].url: expected http://HOST[:PORT][/PATH] or "
         "https://HOST[:PORT][/PATH]"},
        {LISTEN "upstreams:\n  u:\n    servers:\n      - url: http://a\n        weight: 0\n",
         "t.yaml:7: upstreams.u.servers[0].weight: 0 is out of bounds (1..1000)"},
        {LISTEN "upstreams:\n  u:\n    servers:\n      - url: http://a\n        weight: 1001\n",
         "t.yaml:7: upstreams.u.servers[0].weight: 1001 is out of bounds (1..1000)"},
        {LISTEN "upstreams:\n  u:\n    servers: [{url: http://a}]\n    api_key_env: my key\n",
         "t.yaml:6: upstreams.u.api_key_env: expected an environment variable name "
         "([A-Za-z_][A-Za-z0-9_]*)"},
        {LISTEN "upstreams:\n  u:\n    servers: [{url: http://a}]\n    api_key_env: 1KEY\n",
         "t.yaml:6: upstreams.u.api_key_env: expected an environment variable name "
         "([A-Za-z_][A-Za-z0-9_]*)"},
        {LISTEN "upstreams:\n  u:\n    servers: [{url: http://a}]\n"
                "    timeouts: { first_byte: 90s }\n",
         "t.yaml:6: upstreams.u.timeouts.first_byte: longer than total (90s > 1m)"},
        {LISTEN "upstreams:\n  u:\n    servers: [{url: http://a}]\n"
                "    timeouts: { connect: 5s, total: 3s, first_byte: 1s }\n",
         "t.yaml:6: upstreams.u.timeouts.connect: longer than total (5s > 3s)"},
        {LISTEN "upstreams:\n  u:\n    servers: [{url: http://a}]\n    tls: { ca: x }\n",
         "t.yaml:6: upstreams.u.tls.ca: unknown key"},
        {LISTEN "upstreams:\n  u: { servers: [{url: http://a}] }\n"
                "  u: { servers: [{url: http://b}] }\n",
         "t.yaml:5: upstreams.u: duplicate key (first at line 4)"},
        {LISTEN "upstreams: [u]\n", "t.yaml:3: upstreams: expected a mapping, got a list"},
        /* models */
        {LISTEN "models:\n  m: { upstream: nope }\n",
         "t.yaml:4: models.m.upstream: no upstream named \"nope\" under upstreams"},
        {LISTEN "models:\n  m: { name: x }\n", "t.yaml:4: models.m.upstream: missing (required)"},
        {LISTEN "models:\n  m:\n    upstream: u\n    served: x\n",
         "t.yaml:6: models.m.served: unknown key"},
        {LISTEN "upstreams:\n  u: { servers: [{url: http://a}] }\n"
                "models:\n  m: { upstream: u }\n  m: { upstream: u }\n",
         "t.yaml:7: models.m: duplicate key (first at line 6)"},
        {LISTEN "upstreams:\n  u: { servers: [{url: http://a}] }\n"
                "models:\n  m: { upstream: u, name: '' }\n",
         "t.yaml:6: models.m.name: must not be empty"},
        /* sse, log */
        {LISTEN "sse: { ping_interval: 2h }\n",
         "t.yaml:3: sse.ping_interval: 2h is out of bounds (0..1h)"},
        {LISTEN "sse: { buffer_bytes: 1k }\n",
         "t.yaml:3: sse.buffer_bytes: 1k is out of bounds (4k..64m)"},
        {LISTEN "log: { level: verbose }\n",
         "t.yaml:3: log.level: expected one of debug, info, warn, error"},
        {LISTEN "log: { access: '' }\n", "t.yaml:3: log.access: must not be empty"},
        {LISTEN "log: { access: [a] }\n", "t.yaml:3: log.access: expected a string, got a list"},
        /* document-level */
        {"hello\n", "t.yaml:1: expected a mapping, got \"hello\""},
        {LISTEN "---\nlisten: []\n", "t.yaml:4: only one YAML document is allowed"},
        {LISTEN "workers: &w 2\nshutdown_timeout: *w\n",
         "t.yaml:4: shutdown_timeout: YAML aliases (*name) are not supported"},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        char err[512] = "";
        conf_t *c = load(cases[i].yaml, err, sizeof(err));
        if (c || strcmp(err, cases[i].err) != 0)
            fail_msg("case %zu:\n%s\n  want: %s\n  got:  %s", i, cases[i].yaml, cases[i].err,
                     c ? "(loaded)" : err);
    }
}

/* YAML syntax errors: "FILE:LINE: syntax error: ...", the line of the fault. */
static void test_syntax_errors(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        const char *prefix;
    } cases[] = {
        {LISTEN "limits: { max_body_bytes: 1m\n", "t.yaml:4: syntax error: "},
        {LISTEN "admin:\n  address: a:1\n   workers: 2\n", "t.yaml:5: syntax error: "},
        {LISTEN "\n\nlog: \"unterminated\n", "t.yaml:6: syntax error: "},
        {LISTEN "workers: *nowhere\n", "t.yaml:3: syntax error: "},
        {"listen:\n\t- address: a:1\n", "t.yaml:2: syntax error: "},
        {LISTEN "workers: \xff\xfe\n", "t.yaml:3: syntax error: "},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        char err[512] = "";
        conf_t *c = load(cases[i].yaml, err, sizeof(err));
        if (c || strncmp(err, cases[i].prefix, strlen(cases[i].prefix)) != 0 || strchr(err, '\n'))
            fail_msg("case %zu: want prefix %s, got %s", i, cases[i].prefix, err);
    }
}

static void test_load_file_errors(void **state)
{
    (void)state;
    char err[512] = "";
    assert_null(conf_load("tests/unit/no-such.yaml", err, sizeof(err)));
    assert_string_equal(err, "tests/unit/no-such.yaml: cannot open: No such file or directory");
    assert_null(conf_load("tests/unit", err, sizeof(err)));
    assert_string_equal(err, "tests/unit: not a regular file");

    size_t big = 4 * 1024 * 1024 + 1;
    char *huge = malloc(big);
    assert_non_null(huge);
    memset(huge, '#', big);
    assert_null(conf_load_string(huge, big, "big.yaml", err, sizeof(err)));
    assert_string_equal(err, "big.yaml: too large (4194305 bytes, at most 4194304)");

    /* Deep nesting is refused early (libyaml is quadratic in it): this
     * took minutes before the depth cap. */
    size_t depth = 200000, n = 0;
    n += (size_t)sprintf(huge, "listen:\n  - ");
    memset(huge + n, '[', depth);
    memset(huge + n + depth, ']', depth);
    n += 2 * depth;
    huge[n] = '\0';
    int64_t t0 = sl_now_ms();
    assert_null(conf_load_string(huge, n, "deep.yaml", err, sizeof(err)));
    assert_string_equal(err, "deep.yaml:2: nested deeper than 32 levels");
    assert_true(sl_now_ms() - t0 < 2000);

    /* 32 levels are fine as YAML (then refused by the table, not the cap). */
    n = (size_t)sprintf(huge, "listen: ");
    memset(huge + n, '[', 31);
    memset(huge + n + 31, ']', 31);
    huge[n + 62] = '\0';
    assert_null(conf_load_string(huge, n + 62, "ok.yaml", err, sizeof(err)));
    assert_string_equal(err, "ok.yaml:1: listen[0]: expected a mapping, got a list");

    /* Too many nodes. */
    n = (size_t)sprintf(huge, "listen: [");
    for (int i = 0; i < 200001; i++)
        n += (size_t)sprintf(huge + n, "1,");
    n += (size_t)sprintf(huge + n, "1]\n");
    assert_null(conf_load_string(huge, n, "many.yaml", err, sizeof(err)));
    assert_string_equal(err, "many.yaml:1: more than 200000 YAML nodes");
    free(huge);
}

/* ---- reload ---------------------------------------------------------------------- */

static void test_reload_check(void **state)
{
    (void)state;
    char err[512];
    conf_t *a = load(issue_yaml, err, sizeof(err));
    assert_non_null(a);
    conf_t *b = load(issue_yaml, err, sizeof(err));
    assert_non_null(b);
    assert_int_equal(conf_reload_check(a, b, err, sizeof(err)), 0);
    conf_free(b);

    /* Reloadable keys may change: limits, upstreams (even their servers),
     * models, sse, log, shutdown_timeout. */
    static const struct {
        const char *from, *to;
    } ok[] = {
        {"max_body_bytes: 2m", "max_body_bytes: 4m"},
        {"weight: 3", "weight: 7"},
        {"  spare:\n    servers:\n      - url: http://10.0.0.2\n",
         "  spare:\n    servers:\n      - url: http://10.0.0.3\n      - url: http://10.0.0.4\n"},
        {"  small: { upstream: spare }\n", ""},
        {"ping_interval: 0", "ping_interval: 1s"},
        {"level: debug", "level: warn"},
        {"shutdown_timeout: 5s", "shutdown_timeout: 50s"},
    };
    static const struct {
        const char *from, *to, *err;
    } bad[] = {
        {"127.0.0.1:8080", "127.0.0.1:8090", "listen[0].address: changed; needs a restart"},
        {"    tls: { cert: conf/tls/server.crt, key: conf/tls/server.key }\n", "",
         "listen[1].tls.cert: changed; needs a restart"},
        {"  - address: \"[::1]:8081\"\n", "", "listen: changed; needs a restart"},
        {"127.0.0.1:9091", "127.0.0.1:9092", "admin.address: changed; needs a restart"},
        {"workers: 4", "workers: auto", "workers: changed; needs a restart"},
    };
    char text[4096];
    for (size_t i = 0; i < SL_ARRAY_LEN(ok) + SL_ARRAY_LEN(bad); i++) {
        bool good = i < SL_ARRAY_LEN(ok);
        const char *from = good ? ok[i].from : bad[i - SL_ARRAY_LEN(ok)].from;
        const char *to = good ? ok[i].to : bad[i - SL_ARRAY_LEN(ok)].to;
        const char *at = strstr(issue_yaml, from);
        assert_non_null(at);
        snprintf(text, sizeof(text), "%.*s%s%s", (int)(at - issue_yaml), issue_yaml, to,
                 at + strlen(from));
        b = load(text, err, sizeof(err));
        if (!b)
            fail_msg("case %zu: %s", i, err);
        int rc = conf_reload_check(a, b, err, sizeof(err));
        if (good && rc != 0)
            fail_msg("case %zu: refused: %s", i, err);
        if (!good && (rc != -1 || strcmp(err, bad[i - SL_ARRAY_LEN(ok)].err) != 0))
            fail_msg("case %zu: want %s, got %s", i, bad[i - SL_ARRAY_LEN(ok)].err, err);
        conf_free(b);
    }
    conf_free(a);
}

/* ---- the example conf and the reference ----------------------------------------- */

static void test_example_conf(void **state)
{
    (void)state;
    char err[512] = "";
    conf_t *c = conf_load("conf/sluice.yaml", err, sizeof(err));
    if (!c)
        fail_msg("%s", err);
    assert_string_equal(c->path, "conf/sluice.yaml");
    assert_int_equal(c->nlisten, 1);
    assert_string_equal(c->listen[0].address, "127.0.0.1:8080");
    assert_null(c->listen[0].tls_cert);
    assert_string_equal(c->admin.address, "127.0.0.1:9090");
    assert_int_equal(c->workers, 0);
    const conf_upstream_t *u = conf_upstream_find(c, "main");
    assert_non_null(u);
    assert_int_equal(u->nservers, 1);
    assert_string_equal(u->servers[0].host, "127.0.0.1");
    assert_int_equal(u->servers[0].port, 8000);
    const conf_model_t *m = conf_model_find(c, "chat-model");
    assert_non_null(m);
    assert_string_equal(m->upstream, "main");
    assert_string_equal(m->served, "demo-model");
    conf_free(c);

    /* The TLS listener shown commented out must load when uncommented. */
    size_t len;
    char *text = read_all("conf/sluice.yaml", &len);
    assert_non_null(text);
    const char *a = "  # - address: 0.0.0.0:8443\n  #   tls:";
    char *at = strstr(text, a);
    assert_non_null(at);
    memmove(at + 2, at + 4, strlen(at + 4) + 1); /* "  - address" */
    at = strstr(at, "  #   tls:");
    assert_non_null(at);
    memmove(at + 2, at + 4, strlen(at + 4) + 1); /* "    tls:" */
    c = conf_load_string(text, strlen(text), "edited.yaml", err, sizeof(err));
    if (!c)
        fail_msg("%s", err);
    assert_int_equal(c->nlisten, 2);
    assert_string_equal(c->listen[1].tls_cert, "conf/tls/server.crt");
    assert_string_equal(c->listen[1].tls_key, "conf/tls/server.key");
    conf_free(c);
    free(text);
}

/* Every row of a table, as "path" strings like the reference prints them. */
static void each_path(const conf_table_t *t, char *path, size_t plen,
                      void (*fn)(const char *path, const conf_key_t *k, void *arg), void *arg)
{
    for (size_t i = 0; i < t->nkeys; i++) {
        const conf_key_t *k = &t->keys[i];
        size_t len = plen + (size_t)snprintf(path + plen, CONF_PATH_MAX - plen, "%s%s",
                                             plen ? "." : "", k->name);
        fn(path, k, arg);
        if (k->type == CONF_STRUCT)
            each_path(k->sub, path, len, fn, arg);
        else if (k->type == CONF_LIST || k->type == CONF_MAP)
            each_path(k->sub, path,
                      len + (size_t)snprintf(path + len, CONF_PATH_MAX - len, "%s",
                                             k->type == CONF_LIST ? "[]" : ".<name>"),
                      fn, arg);
        path[plen] = '\0';
    }
}

static void check_in_reference(const char *path, const conf_key_t *k, void *arg)
{
    char want[CONF_PATH_MAX + 8];
    snprintf(want, sizeof(want), "\n| `%s` | ", path);
    if (!strstr(arg, want))
        fail_msg("reference lacks %s", path);
    (void)k;
}

static void check_in_example(const char *path, const conf_key_t *k, void *arg)
{
    char want[128];
    snprintf(want, sizeof(want), "%s:", k->name);
    if (!strstr(arg, want))
        fail_msg("conf/sluice.yaml does not mention %s (key %s)", want, path);
}

static void count_rows(const char *path, const conf_key_t *k, void *arg)
{
    (void)path;
    (void)k;
    (*(size_t *)arg)++;
}

static void test_reference(void **state)
{
    (void)state;
    size_t len;
    char *ref = NULL;
    reference_text(&conf_root_table, &ref, &len);
    char path[CONF_PATH_MAX] = "";
    each_path(&conf_root_table, path, 0, check_in_reference, ref);

    size_t rows = 0, lines = 0;
    each_path(&conf_root_table, path, 0, count_rows, &rows);
    for (const char *p = strstr(ref, "\n| `"); p; p = strstr(p + 1, "\n| `"))
        lines++;
    assert_int_equal(lines, rows);
    assert_true(rows >= 40);

    /* Spot checks of the columns. */
    assert_non_null(strstr(ref, "| `listen` | list of sections | required | 1..64 items | no |"));
    assert_non_null(
        strstr(ref, "| `limits.max_body_bytes` | size | `1m` | 1k..1g | yes | largest request "
                    "body; larger gets 413 |\n"));
    assert_non_null(strstr(ref, "| `workers` | integer | `auto` | 1..256 or `auto` | no |"));
    assert_non_null(
        strstr(ref, "| `upstreams.<name>.servers[].url` | string | required |  | yes |"));
    assert_non_null(strstr(ref, "| `upstreams.<name>.balance` | enum | `round_robin` | "
                                "`round_robin`, `least_conn` | yes |"));
    assert_non_null(strstr(ref, "| `upstreams.<name>.timeouts.connect` | duration | `2s` | "
                                "10ms..10m | yes |"));
    assert_non_null(strstr(ref, "| `models.<name>.name` | string | none |  | yes |"));
    assert_non_null(strstr(ref, "| `admin.address` | string | `127.0.0.1:9090` |  | no |"));

    /* docs/conf-reference.md is this output, byte for byte. */
    if (getenv("SLUICE_CONF_REFERENCE_UPDATE")) {
        FILE *f = fopen("docs/conf-reference.md", "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(ref, 1, len, f), len);
        assert_int_equal(fclose(f), 0);
    }
    size_t dlen;
    char *doc = read_all("docs/conf-reference.md", &dlen);
    if (!doc || dlen != len || memcmp(doc, ref, len) != 0)
        fail_msg("docs/conf-reference.md differs from conf_reference_print(); regenerate it: "
                 "SLUICE_CONF_REFERENCE_UPDATE=1 <build>/tests/test_conf");
    free(doc);

    /* The example conf names every key (set or in a comment). */
    char *example = read_all("conf/sluice.yaml", &dlen);
    assert_non_null(example);
    each_path(&conf_root_table, path, 0, check_in_example, example);
    free(example);
    free(ref);
}

/* ---- base paths (issue 12) ------------------------------------------------------ */

#define UP_URL(u) LISTEN "upstreams:\n  u:\n    servers:\n      - url: " u "\n"

static void test_base_path(void **state)
{
    (void)state;
    static const struct {
        const char *url, *base;
    } ok[] = {
        {"http://a:8000", "/v1"},
        {"http://a:8000/", "/v1"},
        {"https://api.groq.com/openai/v1", "/openai/v1"},
        {"https://api.groq.com/openai/v1/", "/openai/v1"},
        {"https://api.groq.com/openai/v1//", "/openai/v1"},
        {"http://[::1]:11434/v1", "/v1"},
        {"http://h/api/%7Euser/v2", "/api/%7Euser/v2"},
        {"http://h/a-b_c.d~e/f:g@h", "/a-b_c.d~e/f:g@h"},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(ok); i++) {
        char yaml[512], err[512] = "";
        snprintf(yaml, sizeof(yaml), UP_URL("%s"), ok[i].url);
        conf_t *c = load(yaml, err, sizeof(err));
        if (!c)
            fail_msg("%s: %s", ok[i].url, err);
        assert_string_equal(c->upstreams[0].servers[0].base_path, ok[i].base);
        assert_string_equal(c->upstreams[0].servers[0].url, ok[i].url);
        conf_free(c);
    }
    char longp[400] = "http://h/";
    memset(longp + 9, 'a', 300);
    longp[309] = '\0';
    const struct {
        const char *url, *err;
    } bad[] = {
        {"http://h/a//b", "empty, \".\" or \"..\" segment in the path \"/a//b\""},
        {"http://h/a/../b", "empty, \".\" or \"..\" segment in the path \"/a/../b\""},
        {"http://h/./b", "empty, \".\" or \"..\" segment in the path \"/./b\""},
        {"http://h/a%zz", "bad percent escape in the path"},
        {"http://h/a%2", "bad percent escape in the path"},
        {"'http://h/a b'", "character 0x20 not allowed in the path"},
        {"http://h/v1#frag", "must not have a query or fragment; the path is a base path: /v1/... "
                             "of a request goes to BASE/..."},
        {longp, "base path longer than 255 bytes"},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++) {
        char yaml[1024], err[512] = "", want[512];
        snprintf(yaml, sizeof(yaml), UP_URL("%s"), bad[i].url);
        snprintf(want, sizeof(want), "t.yaml:6: upstreams.u.servers[0].url: %s", bad[i].err);
        conf_t *c = load(yaml, err, sizeof(err));
        if (c || strcmp(err, want) != 0)
            fail_msg("%s:\n  want: %s\n  got:  %s", bad[i].url, want, c ? "(loaded)" : err);
    }
}

/* ---- every error, did you mean (issue 13 item 5) -------------------------------- */

/* Writes text to dir/name (dir created if missing); returns the path. */
static const char *write_file(const char *dir, const char *name, const char *text)
{
    static char path[512];
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", dir);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    char *slash = strrchr(path, '/');
    if (slash && slash > path + strlen(dir)) {
        *slash = '\0';
        snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", path);
        assert_int_equal(system(cmd), 0);
        *slash = '/';
    }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static char tmpdir[64];

static int tmpdir_setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/sluice-test-conf-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int tmpdir_teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_all_errors(void **state)
{
    (void)state;
    char dir[128];
    snprintf(dir, sizeof(dir), "%s/all", tmpdir);
    const char *p = write_file(dir, "three.yaml",
                               LISTEN                           /* 1-2 */
                               "shutdown_timout: 5s\n"          /* 3 */
                               "workers: many\n"                /* 4 */
                               "upstreams:\n"                   /* 5 */
                               "  u:\n"                         /* 6 */
                               "    servers:\n"                 /* 7 */
                               "      - url: http://a\n"        /* 8 */
                               "        wieght: 2\n"            /* 9 */
                               "      - url: http://b\n"        /* 10 */
                               "    timeouts: { conect: 1s }\n" /* 11 */
                               "models:\n"                      /* 12 */
                               "  m: { upstream: nowhere }\n"); /* 13 */
    char err[4096], want[2048];
    size_t n = 0;
    assert_null(conf_load_all(p, err, sizeof(err), &n));
    /* Four mistakes, four lines, in file order; the model's dangling
     * upstream is a cross-section check, skipped while anything else is
     * wrong (it could be a consequence). */
    snprintf(want, sizeof(want),
             "%s:3: shutdown_timout: unknown key; did you mean `shutdown_timeout`?\n"
             "%s:4: workers: expected an integer or auto, got \"many\"\n"
             "%s:9: upstreams.u.servers[0].wieght: unknown key; did you mean `weight`?\n"
             "%s:11: upstreams.u.timeouts.conect: unknown key; did you mean `connect`?",
             p, p, p, p);
    assert_string_equal(err, want);
    assert_int_equal(n, 4);

    /* conf_load() keeps its one-line contract: the first error. */
    char one[512];
    assert_null(conf_load(p, one, sizeof(one)));
    snprintf(want, sizeof(want),
             "%s:3: shutdown_timout: unknown key; did you mean `shutdown_timeout`?", p);
    assert_string_equal(one, want);

    /* Alone, the cross-section error is reported. */
    p = write_file(dir, "dangling.yaml",
                   LISTEN "upstreams:\n  u: { servers: [{url: http://a}] }\n"
                          "models:\n  m: { upstream: nowhere }\n");
    assert_null(conf_load_all(p, err, sizeof(err), &n));
    snprintf(want, sizeof(want),
             "%s:6: models.m.upstream: no upstream named \"nowhere\" under upstreams", p);
    assert_string_equal(err, want);
    assert_int_equal(n, 1);

    /* Far from every key: no suggestion. */
    char e2[512];
    assert_null(load(LISTEN "zzzzzzzz: 1\nlimits: { max_body_byte: 1m }\n", e2, sizeof(e2)));
    assert_string_equal(e2, "t.yaml:3: zzzzzzzz: unknown key");
    assert_null(load(LISTEN "limits: { max_body_byte: 1m }\n", e2, sizeof(e2)));
    assert_string_equal(
        e2, "t.yaml:3: limits.max_body_byte: unknown key; did you mean `max_body_bytes`?");

    /* Many errors: the list is bounded, the count is not. */
    size_t big = 300 * 16 + 64;
    char *text = malloc(big);
    assert_non_null(text);
    size_t o = (size_t)snprintf(text, big, LISTEN);
    for (int i = 0; i < 300; i++)
        o += (size_t)snprintf(text + o, big - o, "bogus%03d: 1\n", i);
    p = write_file(dir, "many.yaml", text);
    free(text);
    assert_null(conf_load_all(p, err, sizeof(err), &n));
    assert_int_equal(n, 300);
    assert_non_null(strstr(err, "bogus000: unknown key"));
    assert_null(strstr(err, "bogus299"));
    size_t lines = 1;
    for (const char *q = err; *q; q++)
        lines += *q == '\n';
    assert_true(lines <= 101);
    assert_non_null(strstr(err, "more errors"));

    /* A missing file is one error. */
    assert_null(conf_load_all("tests/unit/no-such.yaml", err, sizeof(err), &n));
    assert_int_equal(n, 1);
    assert_string_equal(err, "tests/unit/no-such.yaml: cannot open: No such file or directory");
}

/* ---- ${VAR} (issue 13 item 6) ------------------------------------------------------- */

static void test_env_subst(void **state)
{
    (void)state;
    setenv("SLT_PORT", "18081", 1);
    setenv("SLT_HOST", "10.0.0.7", 1);
    setenv("SLT_EMPTY", "", 1);
    unsetenv("SLT_UNSET");
    char err[512] = "";
    conf_t *c = load("listen:\n  - address: 127.0.0.1:${SLT_PORT}\n"
                     "workers: ${SLT_UNSET:-3}\n"
                     "upstreams:\n  u:\n    servers:\n"
                     "      - url: http://${SLT_HOST}:${SLT_UNSET:-8000}/x\n"
                     "models:\n  m: { upstream: u, name: '${SLT_EMPTY:-served}' }\n"
                     "fallback:\n  template:\n    text: 'cost $5, $${literal} ${SLT_EMPTY}!'\n"
                     "    texts: { en: 'port ${SLT_PORT}' }\n"
                     "ratelimit: { trusted_proxies: ['${SLT_HOST}/32'] }\n",
                     err, sizeof(err));
    if (!c)
        fail_msg("%s", err);
    assert_int_equal(c->listen[0].port, 18081);
    assert_int_equal(c->workers, 3);
    assert_string_equal(c->upstreams[0].servers[0].url, "http://10.0.0.7:8000/x");
    assert_string_equal(c->upstreams[0].servers[0].host, "10.0.0.7");
    assert_string_equal(c->upstreams[0].servers[0].base_path, "/x");
    assert_string_equal(c->models[0].served, "served");
    assert_string_equal(c->fallback.tmpl.text, "cost $5, ${literal} !");
    assert_string_equal(c->fallback.tmpl.texts[0].value, "port 18081");
    assert_string_equal(c->ratelimit.trusted_proxies[0], "10.0.0.7/32");
    conf_free(c);

    static const struct {
        const char *yaml, *err;
    } bad[] = {
        {"listen:\n  - address: 127.0.0.1:${SLT_UNSET}\n",
         "t.yaml:2: listen[0].address: environment variable SLT_UNSET is not set "
         "(${SLT_UNSET:-default} gives a default)"},
        {LISTEN "workers: ${SLT_UNSET\n",
         "t.yaml:3: workers: bad variable reference: expected ${NAME} or ${NAME:-default} "
         "(NAME: [A-Za-z_][A-Za-z0-9_]*), or $${ for a literal ${"},
        {LISTEN "workers: ${1X}\n",
         "t.yaml:3: workers: bad variable reference: expected ${NAME} or ${NAME:-default} "
         "(NAME: [A-Za-z_][A-Za-z0-9_]*), or $${ for a literal ${"},
        {LISTEN "workers: ${}\n",
         "t.yaml:3: workers: bad variable reference: expected ${NAME} or ${NAME:-default} "
         "(NAME: [A-Za-z_][A-Za-z0-9_]*), or $${ for a literal ${"},
        /* Substitution happens before the value is checked. */
        {LISTEN "workers: ${SLT_HOST}\n",
         "t.yaml:3: workers: expected an integer or auto, got \"10.0.0.7\""},
        {LISTEN "log: { access: '${SLT_EMPTY}' }\n", "t.yaml:3: log.access: must not be empty"},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++) {
        c = load(bad[i].yaml, err, sizeof(err));
        if (c || strcmp(err, bad[i].err) != 0)
            fail_msg("case %zu:\n  want: %s\n  got:  %s", i, bad[i].err, c ? "(loaded)" : err);
    }

    /* A value that grows past the scalar bound once substituted. */
    char *big = malloc(3000);
    assert_non_null(big);
    memset(big, 'x', 2999);
    big[2999] = '\0';
    setenv("SLT_BIG", big, 1);
    free(big);
    c = load(LISTEN "fallback: { template: { text: '${SLT_BIG}${SLT_BIG}' } }\n", err, sizeof(err));
    assert_null(c);
    assert_string_equal(err, "t.yaml:3: fallback.template.text: value longer than 4096 bytes "
                             "once ${...} are set");
    unsetenv("SLT_BIG");
}

/* ---- include: (issue 13 item 6) -------------------------------------------------------- */

static void test_include(void **state)
{
    (void)state;
    char dir[128], err[4096], want[4096];
    size_t n;
    snprintf(dir, sizeof(dir), "%s/inc", tmpdir);
    write_file(dir, "conf.d/10-a.yaml",
               "upstreams:\n  a:\n    servers: [{url: http://a}]\n"
               "models:\n  ma: { upstream: a }\n");
    write_file(dir, "conf.d/20-b.yaml",
               "include: ../more/*.yaml\n"
               "models:\n  mb: { upstream: b }\n");
    write_file(dir, "more/b.yaml", "upstreams:\n  b:\n    servers: [{url: http://b/v2}]\n");
    write_file(dir, "conf.d/notes.txt", "not yaml: [\n");
    const char *p = write_file(dir, "main.yaml",
                               LISTEN "upstreams:\n  main:\n    servers: [{url: http://m}]\n"
                                      "models:\n  m: { upstream: main }\n"
                                      "include: conf.d/*.yaml\n");
    char mainp[256];
    snprintf(mainp, sizeof(mainp), "%s", p);
    conf_t *c = conf_load_all(mainp, err, sizeof(err), &n);
    if (!c)
        fail_msg("%s", err);
    /* The main file's entries first, then each file in glob order. */
    assert_int_equal(c->nupstreams, 3);
    assert_string_equal(c->upstreams[0].name, "main");
    assert_string_equal(c->upstreams[1].name, "a");
    assert_string_equal(c->upstreams[2].name, "b");
    assert_string_equal(c->upstreams[2].servers[0].base_path, "/v2");
    assert_int_equal(c->nmodels, 3);
    assert_string_equal(c->models[1].name, "ma");
    assert_string_equal(c->models[2].name, "mb");
    assert_int_equal(c->ninclude, 1);
    assert_string_equal(c->include[0], "conf.d/*.yaml");
    conf_free(c);

    /* Errors name the included file and its line; all of them are listed. */
    write_file(dir, "conf.d/30-bad.yaml",
               "models:\n"                                          /* 1 */
               "  mc: { upstream: a, nam: x }\n"                    /* 2 */
               "  m: { upstream: a }\n"                             /* 3 */
               "workers: 2\n"                                       /* 4 */
               "upstreams:\n  c: { servers: [{url: ftp://c}] }\n"); /* 5-6 */
    assert_null(conf_load_all(mainp, err, sizeof(err), &n));
    char bad[256];
    snprintf(bad, sizeof(bad), "%s/conf.d/30-bad.yaml", dir);
    snprintf(want, sizeof(want),
             "%s:4: workers: an included file may only hold lists and maps (upstreams, models, "
             "...); set this in the main file\n"
             "%s:6: upstreams.c.servers[0].url: expected http://HOST[:PORT][/PATH] or "
             "https://HOST[:PORT][/PATH]\n"
             "%s:2: models.mc.nam: unknown key; did you mean `name`?\n"
             "%s:3: models.m: duplicate key (first at %s:7)",
             bad, bad, bad, bad, mainp);
    assert_string_equal(err, want);
    assert_int_equal(n, 4);

    /* A model in an included file naming an unknown upstream: its file. */
    write_file(dir, "conf.d/30-bad.yaml", "models:\n  mc: { upstream: nowhere }\n");
    assert_null(conf_load_all(mainp, err, sizeof(err), &n));
    snprintf(want, sizeof(want),
             "%s:2: models.mc.upstream: no upstream named \"nowhere\" under upstreams", bad);
    assert_string_equal(err, want);

    /* A syntax error in an included file. */
    write_file(dir, "conf.d/30-bad.yaml", "models:\n  mc: [\n");
    assert_null(conf_load_all(mainp, err, sizeof(err), &n));
    snprintf(want, sizeof(want), "%s:3: syntax error: ", bad);
    assert_int_equal(strncmp(err, want, strlen(want)), 0);
    assert_int_equal(n, 1);

    /* A cycle: b includes the conf.d files again. */
    write_file(dir, "conf.d/30-bad.yaml", "include: 10-a.yaml\n");
    assert_null(conf_load_all(mainp, err, sizeof(err), &n));
    snprintf(want, sizeof(want),
             "%s:1: include: %s/conf.d/10-a.yaml is included twice (an include cycle?)", bad, dir);
    assert_string_equal(err, want);

    /* A file including itself, and depth: each file includes the next. */
    write_file(dir, "conf.d/30-bad.yaml", "include: 30-bad.yaml\n");
    assert_null(conf_load_all(mainp, err, sizeof(err), &n));
    assert_non_null(strstr(err, "30-bad.yaml is included twice (an include cycle?)"));
    for (int i = 0; i < 12; i++) {
        char name[64], text[64];
        snprintf(name, sizeof(name), "deep/d%02d.yaml", i);
        snprintf(text, sizeof(text), "include: d%02d.yaml\n", i + 1);
        write_file(dir, name, text);
    }
    write_file(dir, "conf.d/30-bad.yaml", "include: ../deep/d00.yaml\n");
    assert_null(conf_load_all(mainp, err, sizeof(err), &n));
    assert_non_null(strstr(err, "includes nested deeper than 8"));
    assert_int_equal(n, 1);

    /* A plain name that is missing is an error; a glob matching nothing
     * is an empty directory. */
    write_file(dir, "conf.d/30-bad.yaml", "include: [nothing-*.yaml, missing.yaml]\n");
    assert_null(conf_load_all(mainp, err, sizeof(err), &n));
    snprintf(want, sizeof(want), "%s:1: include: %s/conf.d/missing.yaml: no such file", bad, dir);
    assert_string_equal(err, want);
    assert_int_equal(n, 1);
    char rm[600];
    snprintf(rm, sizeof(rm), "rm -f '%s'", bad);
    assert_int_equal(system(rm), 0);

    /* A conf from a string (tests, the fuzzer) reads no other file. */
    snprintf(want, sizeof(want), LISTEN "include: '%s/more/*.yaml'\n", dir);
    c = load(want, err, sizeof(err));
    assert_null(c);
    assert_string_equal(err, "t.yaml:3: include: only a conf file may include others");
}

/* ---- errors found later, located (secrets keep their line) ------------------------ */

static void test_locate(void **state)
{
    (void)state;
    char dir[128], out[1024], want[1024];
    snprintf(dir, sizeof(dir), "%s/loc", tmpdir);
    write_file(dir, "conf.d/u.yaml", "upstreams:\n  x:\n    servers: [{url: http://x}]\n");
    const char *p0 = write_file(dir, "main.yaml",
                                LISTEN "include: conf.d/*.yaml\n" /* 3 */
                                       "auth:\n"                  /* 4 */
                                       "  tokens:\n"              /* 5 */
                                       "    keys:\n"              /* 6 */
                                       "      - kid: k1\n"        /* 7 */
                                       "        alg: HS256\n"     /* 8 */
                                       "        secret_env: K1\n" /* 9 */
                                       "  signing:\n"             /* 10 */
                                       "    secret_env: SIGN\n"); /* 11 */
    char p[512];
    snprintf(p, sizeof(p), "%s", p0);
    char msg[600];
    snprintf(msg, sizeof(msg), "%s: auth: auth.signing.secret_env: the secret in SIGN is 1 bytes",
             p);
    conf_locate(p, msg, out, sizeof(out));
    snprintf(want, sizeof(want),
             "%s:11: auth: auth.signing.secret_env: the secret in SIGN is 1 bytes", p);
    assert_string_equal(out, want);
    /* A list item with a detail after it: the item's line. */
    conf_locate(p, "auth: auth.tokens.keys[0] (k1): environment variable K1 is not set", out,
                sizeof(out));
    snprintf(want, sizeof(want),
             "%s:7: auth: auth.tokens.keys[0] (k1): environment variable K1 is not set", p);
    assert_string_equal(out, want);
    /* A key not in the file: the nearest section that is. */
    conf_locate(p, "auth.tokens.ttl: must be 1s..max_lifetime", out, sizeof(out));
    snprintf(want, sizeof(want), "%s:5: auth.tokens.ttl: must be 1s..max_lifetime", p);
    assert_string_equal(out, want);
    /* In an included file. */
    conf_locate(p, "upstreams.x.servers[0]: cannot resolve", out, sizeof(out));
    snprintf(want, sizeof(want), "%s/conf.d/u.yaml:3: upstreams.x.servers[0]: cannot resolve", dir);
    assert_string_equal(out, want);
    /* Already located, or naming nothing in the file. */
    snprintf(msg, sizeof(msg), "%s:2: listen: x", p);
    conf_locate(p, msg, out, sizeof(out));
    assert_string_equal(out, msg);
    conf_locate(p, "redis: down", out, sizeof(out));
    snprintf(want, sizeof(want), "%s: redis: down", p);
    assert_string_equal(out, want);
}

/* A large map: every entry kept in order, a duplicate found with its first
 * line (names are hashed, not compared pairwise). */
static void test_big_map(void **state)
{
    (void)state;
    size_t cap = 5000 * 48 + 256, o = 0;
    char *text = malloc(cap), err[512];
    assert_non_null(text);
    o += (size_t)snprintf(text + o, cap - o, LISTEN "ratelimit:\n  overrides:\n");
    for (int i = 0; i < 5000; i++)
        o += (size_t)snprintf(text + o, cap - o, "    user%d: { requests_per_minute: %d }\n", i,
                              i % 100 + 1);
    conf_t *c = load(text, err, sizeof(err));
    if (!c)
        fail_msg("%s", err);
    assert_int_equal(c->ratelimit.noverrides, 5000);
    assert_string_equal(c->ratelimit.overrides[4321].name, "user4321");
    assert_int_equal(c->ratelimit.overrides[4321].line, 4321 + 5);
    assert_int_equal(c->ratelimit.overrides[4321].limits.requests_per_minute, 22);
    conf_free(c);
    snprintf(text + o, cap - o, "    user1234: { requests_per_minute: 1 }\n");
    assert_null(load(text, err, sizeof(err)));
    assert_string_equal(err, "t.yaml:5005: ratelimit.overrides.user1234: duplicate key (first at "
                             "line 1239)");
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_duration),
        cmocka_unit_test(test_parse_size),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_types_defaults),
        cmocka_unit_test(test_types_values),
        cmocka_unit_test(test_types_errors),
        cmocka_unit_test(test_types_diff_and_reference),
        cmocka_unit_test(test_table_validate_rejects),
        cmocka_unit_test(test_root_table_valid),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_issue_shape),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_load_file_errors),
        cmocka_unit_test(test_reload_check),
        cmocka_unit_test(test_example_conf),
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_base_path),
        cmocka_unit_test(test_all_errors),
        cmocka_unit_test(test_env_subst),
        cmocka_unit_test(test_include),
        cmocka_unit_test(test_locate),
        cmocka_unit_test(test_big_map),
    };
    return cmocka_run_group_tests(tests, tmpdir_setup, tmpdir_teardown);
}
