/* Unit tests of common/jshape.c: a kept shape matches texts that differ only
 * inside its holes (spans exact, at every length around the 16-byte runs),
 * refuses any other byte, an escape, a control byte, a number that is not a
 * plain integer or one too long, refuses holes that are not what they say;
 * and a randomized check against jansson: whatever matches parses, with the
 * holes' values where the shape has them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/jshape.h"

#define S(lit) lit, sizeof(lit) - 1

/* {"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":64} */
static const char T1[] = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                         "\"max_tokens\":64}";

static void set_t1(sl_jshape_t *sh)
{
    const char *m = strstr(T1, "\"m\"") + 1, *c = strstr(T1, "\"hi\"") + 1, *k = strstr(T1, "64");
    sl_jspan_t h[3] = {{(uint32_t)(m - T1), 1}, {(uint32_t)(c - T1), 2}, {(uint32_t)(k - T1), 2}};
    uint8_t kd[3] = {SL_JHOLE_STR, SL_JHOLE_STR, SL_JHOLE_INT};
    assert_int_equal(sl_jshape_set(sh, T1, strlen(T1), h, kd, 3), 0);
}

static void test_same_and_changed(void **state)
{
    (void)state;
    sl_jshape_t sh = {0};
    set_t1(&sh);
    sl_jspan_t o[3];
    assert_true(sl_jshape_match(&sh, T1, strlen(T1), o));
    assert_int_equal(o[1].len, 2);
    assert_memory_equal(T1 + o[1].off, "hi", 2);

    const char *d = "{\"model\":\"chat-model\",\"messages\":[{\"role\":\"user\",\"content\":"
                    "\"Write one sentence about the sea, please.\"}],\"max_tokens\":-1024}";
    assert_true(sl_jshape_match(&sh, d, strlen(d), o));
    assert_int_equal(o[0].len, strlen("chat-model"));
    assert_memory_equal(d + o[0].off, "chat-model", o[0].len);
    assert_memory_equal(d + o[1].off, "Write one sentence about the sea, please.", o[1].len);
    assert_int_equal(sl_jshape_int(d + o[2].off, o[2].len), -1024);

    const char *e = "{\"model\":\"\",\"messages\":[{\"role\":\"user\",\"content\":\"\"}],"
                    "\"max_tokens\":0}";
    assert_true(sl_jshape_match(&sh, e, strlen(e), o));
    assert_int_equal(o[0].len, 0);
    assert_int_equal(o[1].len, 0);
    assert_int_equal(sl_jshape_int(e + o[2].off, o[2].len), 0);
    sl_jshape_clear(&sh);
    assert_true(sl_jshape_empty(&sh));
    assert_false(sl_jshape_match(&sh, T1, strlen(T1), o));
}

static bool m1(sl_jshape_t *sh, const char *d)
{
    sl_jspan_t o[SL_JSHAPE_MAX_HOLES];
    return sl_jshape_match(sh, d, strlen(d), o);
}

static void test_refused(void **state)
{
    (void)state;
    sl_jshape_t sh = {0};
    set_t1(&sh);
    static const char *const bad[] = {
        /* an escape, a quote, a control byte inside a string hole */
        "{\"model\":\"a\\\"b\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_"
        "tokens\":64}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\nb\"}],\"max_tokens\":"
        "64}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\nb\"}],\"max_tokens\":"
        "64}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\tb\"}],\"max_tokens\":"
        "64}",
        /* a byte outside the holes: the role, a key, a blank, the end */
        "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"hi\"}],\"max_tokens\":"
        "64}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokenz\":64}",
        "{\"model\":\"m\", "
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":64}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":64}"
        " ",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":64",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":64}"
        "}",
        /* numbers that are not plain integers, or too long */
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":6."
        "4}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":"
        "6e4}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":"
        "064}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":-}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":+6}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
        "\"max_tokens\":1234567890123456789}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":"
        "\"64\"}",
        /* a string hole given something else */
        "{\"model\":null,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":64}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi",
        "",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (m1(&sh, bad[i]))
            fail_msg("matched: %s", bad[i]);
    /* 18 digits do */
    assert_true(m1(&sh, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                        "\"max_tokens\":-999999999999999999}"));
    /* bytes >= 0x80 are the caller's to check */
    assert_true(m1(&sh, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
                        "\"\xc3\xa9t\xc3\xa9\"}],\"max_tokens\":64}"));
    sl_jshape_clear(&sh);
}

/* The end of a string hole found at every position around the 16-byte
 * runs, for each byte that ends it. */
static void test_string_runs(void **state)
{
    (void)state;
    sl_jshape_t sh = {0};
    assert_int_equal(
        sl_jshape_set(&sh, S("[\"x\",1]"), (sl_jspan_t[]){{2, 1}}, (uint8_t[]){SL_JHOLE_STR}, 1),
        0);
    char d[128];
    for (size_t len = 0; len < 80; len++) {
        d[0] = '[';
        d[1] = '"';
        for (size_t i = 0; i < len; i++)
            d[2 + i] = (char)('a' + i % 26);
        memcpy(d + 2 + len, "\",1]", 4);
        sl_jspan_t o[1];
        assert_true(sl_jshape_match(&sh, d, len + 6, o));
        assert_int_equal(o[0].off, 2);
        assert_int_equal(o[0].len, len);
        static const char stop[] = {'"', '\\', '\n', 0x01, 0x1f, 0};
        for (size_t s = 0; s < sizeof(stop) && len > 0; s++) {
            char save = d[2 + len - 1];
            d[2 + len - 1] = stop[s];
            /* a quote inside ends the hole early: the shape's ",1]" then
             * does not follow */
            assert_false(sl_jshape_match(&sh, d, len + 6, o));
            d[2 + len - 1] = save;
        }
        if (len > 0)
            d[2 + len / 2] = 0x20; /* a blank is content */
        assert_true(sl_jshape_match(&sh, d, len + 6, o));
    }
    sl_jshape_clear(&sh);
}

static void test_set_checks(void **state)
{
    (void)state;
    sl_jshape_t sh = {0};
    uint8_t str = SL_JHOLE_STR, in = SL_JHOLE_INT;
    const char *t = "{\"a\":\"bc\",\"n\":1.5,\"k\":12,\"e\":\"x\\ty\"}";
    size_t n = strlen(t);
    /* not between quotes, or not the whole interior */
    assert_int_equal(sl_jshape_set(&sh, t, n, (sl_jspan_t[]){{5, 4}}, &str, 1), 1);
    assert_int_equal(sl_jshape_set(&sh, t, n, (sl_jspan_t[]){{6, 1}}, &str, 1), 1);
    assert_true(sl_jshape_empty(&sh));
    /* an interior with an escape */
    const char *e = strstr(t, "x\\ty");
    assert_int_equal(sl_jshape_set(&sh, t, n, (sl_jspan_t[]){{(uint32_t)(e - t), 4}}, &str, 1), 1);
    /* part of a number, or a real */
    const char *r = strstr(t, "1.5");
    assert_int_equal(sl_jshape_set(&sh, t, n, (sl_jspan_t[]){{(uint32_t)(r - t), 1}}, &in, 1), 1);
    assert_int_equal(sl_jshape_set(&sh, t, n, (sl_jspan_t[]){{(uint32_t)(r - t), 3}}, &in, 1), 1);
    const char *k = strstr(t, "12");
    assert_int_equal(sl_jshape_set(&sh, t, n, (sl_jspan_t[]){{(uint32_t)(k - t), 1}}, &in, 1), 1);
    assert_int_equal(sl_jshape_set(&sh, t, n, (sl_jspan_t[]){{(uint32_t)(k - t + 1), 1}}, &in, 1),
                     1);
    /* out of order, past the end, unknown kind */
    sl_jspan_t two[2] = {{(uint32_t)(k - t), 2}, {6, 2}};
    uint8_t kk[2] = {SL_JHOLE_INT, SL_JHOLE_STR};
    assert_int_equal(sl_jshape_set(&sh, t, n, two, kk, 2), 1);
    assert_int_equal(sl_jshape_set(&sh, t, n, (sl_jspan_t[]){{(uint32_t)n, 1}}, &str, 1), 1);
    uint8_t zero = 0;
    assert_int_equal(sl_jshape_set(&sh, t, n, (sl_jspan_t[]){{6, 2}}, &zero, 1), 1);
    /* in order: kept */
    sl_jspan_t ok[2] = {{6, 2}, {(uint32_t)(k - t), 2}};
    uint8_t ko[2] = {SL_JHOLE_STR, SL_JHOLE_INT};
    assert_int_equal(sl_jshape_set(&sh, t, n, ok, ko, 2), 0);
    assert_true(m1(&sh, "{\"a\":\"\",\"n\":1.5,\"k\":-7,\"e\":\"x\\ty\"}"));
    /* a bare integer document, the hole its whole text */
    assert_int_equal(sl_jshape_set(&sh, S("42"), (sl_jspan_t[]){{0, 2}}, &in, 1), 0);
    assert_true(m1(&sh, "-3"));
    assert_false(m1(&sh, "3 "));
    /* too big */
    static char big[SL_JSHAPE_MAX_BYTES + 2];
    memset(big, ' ', sizeof(big));
    big[0] = '1';
    assert_int_equal(sl_jshape_set(&sh, big, sizeof(big), (sl_jspan_t[]){{0, 1}}, &in, 1), 1);
    sl_jshape_clear(&sh);
}

/* Randomized: a shape with five holes, texts with random hole contents from
 * an alphabet that includes every byte that matters. Each text that matches
 * must parse with jansson, and each hole's value be the one jansson reads. */
/* A prefix match: the usage object of an answer, with the rest after it
 * not looked at; a shape that ends in an integer hole never matches. */
static void test_prefix(void **state)
{
    (void)state;
    static const char U[] = "{\"prompt_tokens\":27,\"completion_tokens\":12}";
    sl_jshape_t sh = {0};
    const char *a = strstr(U, "27"), *b = strstr(U, "12");
    sl_jspan_t h[2] = {{(uint32_t)(a - U), 2}, {(uint32_t)(b - U), 2}};
    uint8_t kd[2] = {SL_JHOLE_INT, SL_JHOLE_INT};
    assert_int_equal(sl_jshape_set(&sh, U, strlen(U), h, kd, 2), 0);
    sl_jspan_t o[2];
    size_t used = 0;
    const char *t = "{\"prompt_tokens\":3100,\"completion_tokens\":0},\"x\":[1,2]}";
    assert_true(sl_jshape_match_prefix(&sh, t, strlen(t), o, &used));
    assert_int_equal(used, strlen("{\"prompt_tokens\":3100,\"completion_tokens\":0}"));
    assert_int_equal(sl_jshape_int(t + o[0].off, o[0].len), 3100);
    assert_int_equal(sl_jshape_int(t + o[1].off, o[1].len), 0);
    assert_false(sl_jshape_match(&sh, t, strlen(t), o)); /* not the whole text */
    assert_true(sl_jshape_match_prefix(&sh, U, strlen(U), o, &used));
    assert_int_equal(used, strlen(U));
    /* one byte short, a float, a changed key */
    assert_false(sl_jshape_match_prefix(&sh, U, strlen(U) - 1, o, &used));
    const char *f = "{\"prompt_tokens\":27.5,\"completion_tokens\":12}";
    assert_false(sl_jshape_match_prefix(&sh, f, strlen(f), o, &used));
    const char *k = "{\"prompt_tokenz\":27,\"completion_tokens\":12}";
    assert_false(sl_jshape_match_prefix(&sh, k, strlen(k), o, &used));
    /* ends in a hole: "12" then ".5" or "3" would go on */
    static const char N[] = "[1,12";
    sl_jspan_t hn = {3, 2};
    uint8_t kn = SL_JHOLE_INT;
    assert_int_equal(sl_jshape_set(&sh, N, strlen(N), &hn, &kn, 1), 0);
    assert_true(sl_jshape_match(&sh, N, strlen(N), o));
    assert_false(sl_jshape_match_prefix(&sh, "[1,12.5]", 8, o, &used));
    assert_false(sl_jshape_match_prefix(&sh, N, strlen(N), o, &used));
    sl_jshape_clear(&sh);
}

/* An escaped-string hole: escapes pass, the span runs to the first quote
 * not escaped; a bad escape, a surrogate half, \u0000 and a control byte
 * miss; whatever matches, jansson parses. */
static void test_escaped(void **state)
{
    (void)state;
    static const char T[] = "{\"content\":\"tok\",\"n\":1}";
    sl_jshape_t sh = {0};
    sl_jspan_t h = {12, 3};
    uint8_t kd = SL_JHOLE_ESTR;
    assert_int_equal(sl_jshape_set(&sh, T, strlen(T), &h, &kd, 1), 0);
    static const char *const hit[] = {"",
                                      "tok",
                                      "a\\nb",
                                      "\\\"",
                                      "\\\\",
                                      "x\\\\\\\"y",
                                      "\\u00e9\\/\\b\\f\\r\\t",
                                      "\\uFFFF",
                                      "\\uD7FF",
                                      "\\u0001",
                                      ":\\\"content\\\":\\\"x"};
    static const char *const miss[] = {"\\",      "\\x",     "\\u12", "\\u12G4", "\\uD800",
                                       "\\udfff", "\\u0000", "a\tb",  "\\\\\"",  "\\U0041"};
    char buf[128];
    sl_jspan_t o;
    for (size_t i = 0; i < sizeof(hit) / sizeof(hit[0]); i++) {
        int n = snprintf(buf, sizeof(buf), "{\"content\":\"%s\",\"n\":1}", hit[i]);
        if (!sl_jshape_match(&sh, buf, (size_t)n, &o))
            fail_msg("missed [%s]", buf);
        assert_int_equal(o.off, 12);
        assert_int_equal(o.len, strlen(hit[i]));
        json_error_t err;
        json_t *j = json_loadb(buf, (size_t)n, 0, &err);
        if (!j)
            fail_msg("jansson refused [%s]: %s", buf, err.text);
        json_decref(j);
        /* as a shape's own text too */
        sl_jspan_t h2 = {12, (uint32_t)strlen(hit[i])};
        sl_jshape_t s2 = {0};
        assert_int_equal(sl_jshape_set(&s2, buf, (size_t)n, &h2, &kd, 1), 0);
        sl_jshape_clear(&s2);
    }
    for (size_t i = 0; i < sizeof(miss) / sizeof(miss[0]); i++) {
        int n = snprintf(buf, sizeof(buf), "{\"content\":\"%s\",\"n\":1}", miss[i]);
        if (sl_jshape_match(&sh, buf, (size_t)n, &o))
            fail_msg("matched [%s]", buf);
    }
    /* a plain string hole still refuses any escape */
    kd = SL_JHOLE_STR;
    assert_int_equal(sl_jshape_set(&sh, T, strlen(T), &h, &kd, 1), 0);
    assert_false(sl_jshape_match(&sh, S("{\"content\":\"a\\nb\",\"n\":1}"), &o));
    sl_jshape_clear(&sh);
}

/* A JSON-string hole: ESTR's escapes and surrogate escapes in pairs (high
 * then low at once), which jansson takes; a lone, reversed or unpaired half
 * misses (yajl would decode it where jansson refuses). match_esc's mask
 * says which holes hold an escape. */
static void test_jstr(void **state)
{
    (void)state;
    static const char T[] = "{\"a\":\"x\",\"b\":\"y\",\"n\":1}";
    sl_jshape_t sh = {0};
    sl_jspan_t h[2] = {{6, 1}, {14, 1}};
    uint8_t kd[2] = {SL_JHOLE_JSTR, SL_JHOLE_JSTR};
    assert_int_equal(sl_jshape_set(&sh, T, strlen(T), h, kd, 2), 0);
    static const char *const hit[] = {"",
                                      "tok",
                                      "a\\nb",
                                      "\\\"",
                                      "\\u00e9\\/\\b\\f\\r\\t",
                                      "\\ud83d\\ude00",
                                      "\\uD800\\uDC00\\uDBFF\\uDFFF",
                                      "x\\ud83d\\ude00y\\ud83d\\ude01",
                                      "\\uD7FF\\uE000"};
    static const char *const miss[] = {
        "\\ud83d",         "\\ude00",       "\\ude00\\ud83d", "\\ud83d\\u0041", "\\ud83d\\ud83d",
        "\\ud83dx\\ude00", "\\ud83d\\ude0", "\\ud83d\\",      "\\u0000",        "\\x",
        "\\u12G4",         "a\tb"};
    char buf[128];
    sl_jspan_t o[2];
    uint64_t esc;
    for (size_t i = 0; i < sizeof(hit) / sizeof(hit[0]); i++) {
        int n = snprintf(buf, sizeof(buf), "{\"a\":\"%s\",\"b\":\"y\",\"n\":1}", hit[i]);
        if (!sl_jshape_match_esc(&sh, buf, (size_t)n, o, &esc))
            fail_msg("missed [%s]", buf);
        assert_int_equal(o[0].len, strlen(hit[i]));
        assert_int_equal(esc, strchr(hit[i], '\\') ? 1u : 0u);
        json_error_t err;
        json_t *j = json_loadb(buf, (size_t)n, 0, &err);
        if (!j)
            fail_msg("jansson refused [%s]: %s", buf, err.text);
        json_decref(j);
        /* the second hole's bit */
        n = snprintf(buf, sizeof(buf), "{\"a\":\"x\",\"b\":\"%s\",\"n\":1}", hit[i]);
        assert_true(sl_jshape_match_esc(&sh, buf, (size_t)n, o, &esc));
        assert_int_equal(esc, strchr(hit[i], '\\') ? 2u : 0u);
    }
    for (size_t i = 0; i < sizeof(miss) / sizeof(miss[0]); i++) {
        int n = snprintf(buf, sizeof(buf), "{\"a\":\"%s\",\"b\":\"y\",\"n\":1}", miss[i]);
        if (sl_jshape_match_esc(&sh, buf, (size_t)n, o, &esc))
            fail_msg("matched [%s]", buf);
    }
    /* an ESTR hole still refuses a pair */
    kd[0] = SL_JHOLE_ESTR;
    assert_int_equal(sl_jshape_set(&sh, T, strlen(T), h, kd, 2), 0);
    assert_false(sl_jshape_match(&sh, S("{\"a\":\"\\ud83d\\ude00\",\"b\":\"y\",\"n\":1}"), o));
    sl_jshape_clear(&sh);
}

static void test_against_jansson(void **state)
{
    (void)state;
    const char *t = "{\"s\":\"a\",\"arr\":[1,\"b\",{\"n\":-2}],\"last\":\"c\",\"z\":3}";
    size_t n = strlen(t);
    sl_jspan_t h[5] = {{(uint32_t)(strstr(t, "\"a\"") - t + 1), 1},
                       {(uint32_t)(strstr(t, "[1") - t + 1), 1},
                       {(uint32_t)(strstr(t, "\"b\"") - t + 1), 1},
                       {(uint32_t)(strstr(t, "-2") - t), 2},
                       {(uint32_t)(strstr(t, "\"c\"") - t + 1), 1}};
    uint8_t k[5] = {SL_JHOLE_STR, SL_JHOLE_INT, SL_JHOLE_STR, SL_JHOLE_INT, SL_JHOLE_STR};
    sl_jshape_t sh = {0};
    assert_int_equal(sl_jshape_set(&sh, t, n, h, k, 5), 0);
    static const char alpha[] = "ab -0123456789.eE+\"\\\n\t,:{}[]";
    unsigned seed = 12345;
    size_t matched = 0, refused = 0;
    for (int iter = 0; iter < 20000; iter++) {
        char d[256];
        size_t dl = 0, tp = 0;
        for (int i = 0; i < 5; i++) {
            memcpy(d + dl, t + tp, h[i].off - tp);
            dl += h[i].off - tp;
            tp = h[i].off + h[i].len;
            seed = seed * 1103515245u + 12345u;
            size_t len = (seed >> 16) % 6;
            for (size_t j = 0; j < len; j++) {
                seed = seed * 1103515245u + 12345u;
                /* mostly plain letters or digits, sometimes anything */
                size_t a = (seed >> 16) % 100 < 80
                               ? (k[i] == SL_JHOLE_INT ? 4 + (seed >> 8) % 10 : 0)
                               : (seed >> 8) % (sizeof(alpha) - 1);
                d[dl++] = alpha[a];
            }
        }
        memcpy(d + dl, t + tp, n - tp);
        dl += n - tp;
        sl_jspan_t o[5];
        if (!sl_jshape_match(&sh, d, dl, o)) {
            refused++;
            continue;
        }
        matched++;
        json_error_t err;
        json_t *j = json_loadb(d, dl, JSON_REJECT_DUPLICATES, &err);
        if (!j)
            fail_msg("matched but jansson refuses (%s): %.*s", err.text, (int)dl, d);
        json_t *arr = json_object_get(j, "arr");
        const json_t *vs[3] = {json_object_get(j, "s"), json_array_get(arr, 1),
                               json_object_get(j, "last")};
        const sl_jspan_t *so[3] = {&o[0], &o[2], &o[4]};
        for (int i = 0; i < 3; i++) {
            assert_true(json_is_string(vs[i]));
            assert_int_equal(json_string_length(vs[i]), so[i]->len);
            assert_memory_equal(json_string_value(vs[i]), d + so[i]->off, so[i]->len);
        }
        assert_true(json_is_integer(json_array_get(arr, 0)));
        assert_int_equal(json_integer_value(json_array_get(arr, 0)),
                         sl_jshape_int(d + o[1].off, o[1].len));
        const json_t *nn = json_object_get(json_array_get(arr, 2), "n");
        assert_true(json_is_integer(nn));
        assert_int_equal(json_integer_value(nn), sl_jshape_int(d + o[3].off, o[3].len));
        assert_int_equal(json_integer_value(json_object_get(j, "z")), 3);
        json_decref(j);
    }
    /* both outcomes happened often enough to mean something */
    assert_true(matched > 2000);
    assert_true(refused > 2000);
    sl_jshape_clear(&sh);
}

/* Every literal length from 0 to 40 between two holes, and past the last
 * hole: the text as kept matches, and one byte changed anywhere in a
 * literal (first, middle, last: each of jshape_eq's loads) never does. */
static void test_literal_bytes(void **state)
{
    (void)state;
    for (size_t lit = 0; lit <= 40; lit++) {
        char t[128];
        size_t n = 0;
        t[n++] = '[';
        t[n++] = '"';
        size_t h0 = n;
        memcpy(t + n, "ab", 2), n += 2;
        t[n++] = '"';
        t[n++] = ',';
        size_t l0 = n; /* a string of lit bytes, its quotes: the literal between holes */
        t[n++] = '"';
        for (size_t i = 0; i < lit; i++)
            t[n++] = (char)('c' + i % 20);
        t[n++] = '"';
        t[n++] = ',';
        size_t l1 = n;
        size_t h1 = n;
        memcpy(t + n, "12", 2), n += 2;
        size_t l2 = n; /* the tail: lit bytes of a string, then ']' */
        t[n++] = ',';
        t[n++] = '"';
        for (size_t i = 0; i < lit; i++)
            t[n++] = (char)('C' + i % 20);
        t[n++] = '"';
        t[n++] = ']';
        sl_jspan_t holes[2] = {{(uint32_t)h0, 2}, {(uint32_t)h1, 2}};
        uint8_t kinds[2] = {SL_JHOLE_STR, SL_JHOLE_INT};
        sl_jshape_t sh = {0};
        assert_int_equal(sl_jshape_set(&sh, t, n, holes, kinds, 2), 0);
        sl_jspan_t got[2];
        assert_true(sl_jshape_match(&sh, t, n, got));
        for (size_t at = l0; at < n; at++) {
            if ((at >= l1 && at < l2) || t[at] == '"' || t[at] == ',' || t[at] == ']')
                continue; /* the hole, and bytes whose change breaks the JSON */
            char u[128];
            memcpy(u, t, n);
            u[at] = u[at] == 'x' ? 'y' : 'x';
            if (sl_jshape_match(&sh, u, n, got))
                fail_msg("literal %zu: byte %zu changed, still a match: %.*s", lit, at, (int)n, u);
        }
        sl_jshape_clear(&sh);
    }
}

/* A shape without holes: an exact text, any byte of it (blanks, a string's
 * interior, an integer) telling it apart, at lengths up to
 * SL_JSHAPE_MAX_TEXT (twice a shape with holes'), none beyond. */
static void test_text(void **state)
{
    (void)state;
    static char t[SL_JSHAPE_MAX_TEXT + 1];
    memset(t, ' ', sizeof(t));
    memcpy(t, T1, strlen(T1));
    sl_jshape_t sh = {0};
    for (size_t n = strlen(T1); n <= SL_JSHAPE_MAX_TEXT; n += n < 100 ? 1 : 4093) {
        assert_int_equal(sl_jshape_set_text(&sh, t, n), 0);
        assert_true(sl_jshape_is_text(&sh, t, n));
        sl_jspan_t o[1];
        assert_true(sl_jshape_match(&sh, t, n, o));
        assert_false(sl_jshape_is_text(&sh, t, n - 1));
        assert_false(sl_jshape_is_text(&sh, t, n + 1));
        for (size_t i = 0; i < n; i += i < 80 ? 1 : 997) { /* each byte of T1, some blanks */
            char keep = t[i];
            t[i] = (char)(keep ^ 1);
            if (sl_jshape_is_text(&sh, t, n))
                fail_msg("length %zu: byte %zu changed, still the text", n, i);
            t[i] = keep;
        }
        assert_true(sl_jshape_is_text(&sh, t, n));
    }
    assert_int_equal(sl_jshape_set_text(&sh, t, SL_JSHAPE_MAX_TEXT + 1), 1);
    assert_true(sl_jshape_empty(&sh));
    assert_false(sl_jshape_is_text(&sh, t, SL_JSHAPE_MAX_TEXT + 1));
    assert_int_equal(sl_jshape_set_text(&sh, t, 0), 1);
    assert_false(sl_jshape_is_text(&sh, t, 0));
    /* a shape with holes is not a text, even over the same bytes */
    set_t1(&sh);
    assert_false(sl_jshape_is_text(&sh, T1, strlen(T1)));
    sl_jshape_clear(&sh);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_and_changed),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_string_runs),
        cmocka_unit_test(test_set_checks),
        cmocka_unit_test(test_jstr),
        cmocka_unit_test(test_against_jansson),
        cmocka_unit_test(test_prefix),
        cmocka_unit_test(test_escaped),
        cmocka_unit_test(test_literal_bytes),
        cmocka_unit_test(test_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
