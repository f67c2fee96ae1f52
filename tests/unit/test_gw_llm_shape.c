/*
 * test_gw_llm_shape.c — llm_metrics.c's kept shapes against the paths they
 * skip, fact by fact: an SSE event's usage and content through the kept
 * event shapes (gw_llm_event_keys) against the scan (gw_llm_scan_keys), a
 * usage object's counts through the kept usage shapes against yajl
 * (gw_llm_usage_read, kept or not), on the fuzz corpora's events and on
 * many texts made from the usual chunks and usage objects with their
 * values changed, including values that must make a shape miss (an
 * escape that is not JSON's or a surrogate half, a float where an integer
 * was, a finish_reason, "usage":null, tool_calls). The shapes must also
 * serve: the hit counts are asserted.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gateway/gw_llm.h"

static uint32_t rng = 12345;

static uint32_t rnd(uint32_t n)
{
    rng = rng * 1103515245u + 12345u;
    return (rng >> 8) % n;
}

static const char *pick(const char *const *v, size_t n)
{
    return v[rnd((uint32_t)n)];
}

#define PICK(v) pick(v, sizeof(v) / sizeof(v[0]))

/* Values as they stand in the JSON text (inside quotes for strings). */
static const char *const contents[] = {"",
                                       "tok ",
                                       "a",
                                       "The sea is calm.",
                                       "h\xc3\xa9llo",
                                       ":",
                                       "\\\"content\\\":\\\"x",
                                       "line\\nbreak",
                                       "\\u00e9",
                                       "usage\\\":{",
                                       "x\":\"y",
                                       "{[]}",
                                       "tab\there",
                                       "\xff",
                                       " \\\\ ",
                                       "content",
                                       "\":\"",
                                       "a: b: c"};
static const char *const ints[] = {
    "0",  "7",  "1700000000", "-5", "123456789012345678", "1234567890123456789", "1.5", "1e3",
    "01", "-0", "42",         "9"};
static const char *const ids[] = {"chatcmpl-abc",          "",   "m:1", "a\\\"b",
                                  "chatcmpl-9f8e7d6c5b4a", "x y"};
static const char *const finishes[] = {"null", "\"stop\"", "\"length\"", "\"tool_calls\""};

/* One event of a usual stream's kinds, values picked. */
static size_t make_event(char *buf, size_t cap)
{
    const char *id = PICK(ids), *cr = PICK(ints), *md = PICK(ids), *ct = PICK(contents);
    int n;
    switch (rnd(9)) {
    case 0:
        n = snprintf(buf, cap,
                     "data: {\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"created\":%s,"
                     "\"model\":\"%s\",\"system_fingerprint\":\"%s\",\"choices\":[{\"index\":0,"
                     "\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
                     "\"finish_reason\":null}]}\n\n",
                     id, cr, md, PICK(ids));
        break;
    case 1:
    case 2:
        n = snprintf(buf, cap,
                     "data: {\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"created\":%s,"
                     "\"model\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"},"
                     "\"finish_reason\":null}]}\n\n",
                     id, cr, md, ct);
        break;
    case 3:
        n = snprintf(buf, cap,
                     "data: {\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"created\":%s,"
                     "\"model\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{},"
                     "\"finish_reason\":%s}]}\n\n",
                     id, cr, md, PICK(finishes));
        break;
    case 4:
        n = snprintf(buf, cap,
                     "data: {\"id\":\"%s\",\"choices\":[{\"delta\":{\"content\":\"%s\"}}],"
                     "\"usage\":null}\n\n",
                     id, ct);
        break;
    case 5:
        n = snprintf(buf, cap,
                     "data: {\"id\":\"%s\",\"choices\":[],\"usage\":{\"prompt_tokens\":%s,"
                     "\"completion_tokens\":%s}}\n\n",
                     id, cr, PICK(ints));
        break;
    case 6:
        n = snprintf(buf, cap,
                     "data: {\"id\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":"
                     "%s}}]}\n\n",
                     id,
                     rnd(2) ? "[]"
                            : "[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\","
                              "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]");
        break;
    case 7:
        n = snprintf(buf, cap,
                     "data: {\"id\":\"%s\",\"object\":\"text_completion\",\"created\":%s,"
                     "\"choices\":[{\"text\":\"%s\",\"index\":0}]}\n\n",
                     id, cr, ct);
        break;
    default:
        n = snprintf(buf, cap,
                     "data: {\"id\": \"%s\", \"choices\": [{\"delta\": {\"content\": \"%s\"}}]}"
                     "\n\n",
                     id, ct);
        break;
    }
    assert_true(n > 0 && (size_t)n < cap);
    return (size_t)n;
}

static void check_event(const char *p, size_t n)
{
    bool want_c = true, got_c = false;
    bool want_u = gw_llm_scan_keys(p, n, &want_c);
    bool got_u = gw_llm_event_keys(p, n, &got_c);
    if (want_u != got_u || want_c != got_c)
        fail_msg("kept %d/%d, scan %d/%d on [%.*s]", got_u, got_c, want_u, want_c, (int)n, p);
}

static void test_events_random(void **state)
{
    (void)state;
    gw_llm_shapes_clear();
    char buf[1024];
    for (int i = 0; i < 40000; i++) {
        size_t n = make_event(buf, sizeof(buf));
        check_event(buf, n);
        check_event(buf, n); /* learnt by the first: through a shape now, mostly */
    }
    gw_llm_shape_stats_t st = gw_llm_shape_stats();
    /* the shapes served, and the misses learnt */
    print_message("events: %llu hits, %llu misses, %llu learns\n", (unsigned long long)st.e_hits,
                  (unsigned long long)st.e_misses, (unsigned long long)st.e_learns);
    assert_true(st.e_hits > 20000);
    assert_true(st.e_misses > 1000);
    assert_true(st.e_learns > 1000);
    gw_llm_shapes_clear();
}

/* Streams: one id, created and model per stream, the content changing
 * from event to event (the fast shapes' case), with every kind of value. */
static void test_events_streams(void **state)
{
    (void)state;
    gw_llm_shapes_clear();
    char buf[1024];
    for (int st = 0; st < 3000; st++) {
        const char *id = PICK(ids), *cr = PICK(ints), *md = PICK(ids);
        int n = snprintf(buf, sizeof(buf),
                         "data: {\"id\":\"%s\",\"object\":\"chat.completion.chunk\","
                         "\"created\":%s,\"model\":\"%s\",\"choices\":[{\"index\":0,"
                         "\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                         "\"finish_reason\":null}]}\n\n",
                         id, cr, md);
        check_event(buf, (size_t)n);
        for (int e = 0; e < 8; e++) {
            n = snprintf(buf, sizeof(buf),
                         "data: {\"id\":\"%s\",\"object\":\"chat.completion.chunk\","
                         "\"created\":%s,\"model\":\"%s\",\"choices\":[{\"index\":0,"
                         "\"delta\":{\"content\":\"%s\"},\"finish_reason\":null}]}\n\n",
                         id, cr, md, rnd(4) ? PICK(contents) : "");
            check_event(buf, (size_t)n);
        }
        n = snprintf(buf, sizeof(buf),
                     "data: {\"id\":\"%s\",\"object\":\"chat.completion.chunk\","
                     "\"created\":%s,\"model\":\"%s\",\"choices\":[{\"index\":0,"
                     "\"delta\":{},\"finish_reason\":%s}]}\n\n",
                     id, cr, md, PICK(finishes));
        check_event(buf, (size_t)n);
        if (rnd(2)) {
            n = snprintf(buf, sizeof(buf),
                         "data: {\"id\":\"%s\",\"choices\":[],\"usage\":{\"prompt_tokens\":%s,"
                         "\"completion_tokens\":%s}}\n\n",
                         id, PICK(ints), PICK(ints));
            check_event(buf, (size_t)n);
        }
    }
    gw_llm_shape_stats_t st = gw_llm_shape_stats();
    print_message("streams: %llu hits (%llu fast), %llu misses, %llu learns\n",
                  (unsigned long long)st.e_hits, (unsigned long long)st.e_fast,
                  (unsigned long long)st.e_misses, (unsigned long long)st.e_learns);
    assert_true(st.e_fast > 5000);
    assert_true(st.e_hits > st.e_fast + 2000);
    gw_llm_shapes_clear();
}

/* Each event of the fuzz corpora's files twice (the second through the
 * shape the first left, when it left one). */
static void replay_dir(const char *dir, size_t *events)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *de;
    static char buf[1 << 16];
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        size_t n = fread(buf, 1, sizeof(buf), f);
        fclose(f);
        for (size_t at = 0; at < n;) {
            const char *e = memmem(buf + at, n - at, "\n\n", 2);
            size_t end = e ? (size_t)(e - buf) + 2 : n;
            check_event(buf + at, end - at);
            check_event(buf + at, end - at);
            /* and with its values bent: every byte of a value changed */
            for (size_t k = at; k < end; k++)
                if (buf[k] >= 'a' && buf[k] <= 'z')
                    buf[k] = (char)('a' + ('z' - buf[k]));
            check_event(buf + at, end - at);
            (*events)++;
            at = end;
        }
    }
    closedir(d);
}

static void test_events_corpus(void **state)
{
    (void)state;
    gw_llm_shapes_clear();
    size_t events = 0;
    replay_dir("tests/fuzz/corpus/fuzz_sse", &events);
    replay_dir("tests/fuzz/corpus/fuzz_stream_filter", &events);
    assert_true(events > 20);
    gw_llm_shapes_clear();
}

#define S(lit) lit, sizeof(lit) - 1

/* A content chunk learnt, then texts that must hit and texts that must
 * miss (each a new shape: the scan's answer, and the miss counted). */
static void test_events_hit_and_miss(void **state)
{
    (void)state;
    gw_llm_shapes_clear();
    bool c;
    static const char learn[] =
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
        "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"},"
        "\"finish_reason\":null}]}\n\n";
    assert_false(gw_llm_event_keys(S(learn), &c));
    assert_true(c);
    assert_int_equal(gw_llm_shape_stats().e_learns, 1);
    static const char hit_empty[] =
        "data: {\"id\":\"chatcmpl-22\",\"object\":\"chat.completion.chunk\",\"created\":17,"
        "\"model\":\"other-model\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},"
        "\"finish_reason\":null}]}\n\n";
    assert_false(gw_llm_event_keys(S(hit_empty), &c));
    assert_false(c); /* an empty content is no token */
    static const char hit_colon[] =
        "data: {\"id\":\"chatcmpl-3\",\"object\":\"chat.completion.chunk\",\"created\":-1,"
        "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\":usage:{\"},"
        "\"finish_reason\":null}]}\n\n";
    assert_false(gw_llm_event_keys(S(hit_colon), &c));
    assert_true(c);
    static const char hit_escaped[] =
        "data: {\"id\":\"chatcmpl-4\",\"object\":\"chat.completion.chunk\",\"created\":2,"
        "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\n\\n\\\"a\\\": \"},"
        "\"finish_reason\":null}]}\n\n";
    assert_false(gw_llm_event_keys(S(hit_escaped), &c));
    assert_true(c); /* escapes in a content hole: still the shape */
    assert_int_equal(gw_llm_shape_stats().e_hits, 3);
    static const char *const miss[] = {
        /* a surrogate escape in the content */
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,"
        "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\ud83d\\ude00\"},"
        "\"finish_reason\":null}]}\n\n",
        /* a bad escape */
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,"
        "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\\qb\"},"
        "\"finish_reason\":null}]}\n\n",
        /* a float where the integer was */
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1.5,"
        "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},"
        "\"finish_reason\":null}]}\n\n",
        /* a finish_reason */
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,"
        "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},"
        "\"finish_reason\":\"stop\"}]}\n\n",
        /* "usage":null added */
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,"
        "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},"
        "\"finish_reason\":null}],\"usage\":null}\n\n",
        /* tool_calls instead of content */
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,"
        "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0}]},"
        "\"finish_reason\":null}]}\n\n",
        /* a 19-digit integer */
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\","
        "\"created\":1234567890123456789,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":"
        "{\"content\":\"a\"},\"finish_reason\":null}]}\n\n",
        /* a control byte in the content */
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,"
        "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\tb\"},"
        "\"finish_reason\":null}]}\n\n",
    };
    for (size_t i = 0; i < sizeof(miss) / sizeof(miss[0]); i++) {
        gw_llm_shapes_clear();
        assert_false(gw_llm_event_keys(S(learn), &c)); /* the content chunk's shape only */
        check_event(miss[i], strlen(miss[i]));
        gw_llm_shape_stats_t st = gw_llm_shape_stats();
        if (st.e_hits != 0 || st.e_misses != 2)
            fail_msg("hit %s", miss[i]);
    }
    /* a usage chunk is never kept: the scan each time */
    gw_llm_shapes_clear();
    static const char usage[] = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,"
                                "\"completion_tokens\":2}}\n\n";
    for (int i = 0; i < 3; i++) {
        assert_true(gw_llm_event_keys(S(usage), &c));
        assert_false(c);
    }
    assert_int_equal(gw_llm_shape_stats().e_learns, 0);
    assert_int_equal(gw_llm_shape_stats().e_hits, 0);
    gw_llm_shapes_clear();
}

/* Learning is bounded: a stream of ever new shapes parses for a few
 * misses, then for one in 64. */
static void test_events_learn_bound(void **state)
{
    (void)state;
    gw_llm_shapes_clear();
    char buf[256];
    bool c;
    for (int i = 0; i < 6400; i++) {
        int n = snprintf(buf, sizeof(buf), "data: {\"k%d\":\"v\"}\n\n", i);
        (void)gw_llm_event_keys(buf, (size_t)n, &c);
    }
    gw_llm_shape_stats_t st = gw_llm_shape_stats();
    assert_int_equal(st.e_hits, 0);
    assert_true(st.e_learns <= 4 + 6400 / 64 + 1);
    gw_llm_shapes_clear();
}

static void check_usage(const char *p, size_t n)
{
    gw_llm_uread_t want, got;
    gw_llm_usage_read(p, n, false, &want);
    gw_llm_usage_read(p, n, true, &got);
    if (want.closed != got.closed || want.have_p != got.have_p || want.have_c != got.have_c ||
        (want.have_p && want.pv != got.pv) || (want.have_c && want.cv != got.cv))
        fail_msg("kept %d %d:%lld %d:%lld, yajl %d %d:%lld %d:%lld on [%.*s]", got.closed,
                 got.have_p, got.pv, got.have_c, got.cv, want.closed, want.have_p, want.pv,
                 want.have_c, want.cv, (int)n, p);
}

static void test_usage_random(void **state)
{
    (void)state;
    gw_llm_shapes_clear();
    static const char *const tails[] = {
        "}", "},\"system_fingerprint\":\"fp\"}", "}garbage", "", "}}", " }"};
    char buf[1024];
    for (int i = 0; i < 40000; i++) {
        const char *a = PICK(ints), *b = PICK(ints), *c = PICK(ints);
        int n;
        switch (rnd(6)) {
        case 0:
        case 1:
            n = snprintf(buf, sizeof(buf),
                         "{\"prompt_tokens\":%s,\"completion_tokens\":%s,\"total_tokens\":%s%s", a,
                         b, c, PICK(tails));
            break;
        case 2:
            n = snprintf(buf, sizeof(buf),
                         "{\"prompt_tokens\":%s,\"completion_tokens\":%s,\"total_tokens\":%s,"
                         "\"prompt_tokens_details\":{\"cached_tokens\":%s,\"audio_tokens\":0},"
                         "\"completion_tokens_details\":{\"reasoning_tokens\":%s}%s",
                         a, b, c, PICK(ints), PICK(ints), PICK(tails));
            break;
        case 3:
            n = snprintf(buf, sizeof(buf),
                         "{\"prompt_tokens\":%s,\"prompt_tokens\":%s,\"completion_tokens\":%s%s", a,
                         b, c, PICK(tails));
            break;
        case 4:
            n = snprintf(buf, sizeof(buf),
                         "{\"completion_tokens\":%s,\"prompt_tokens\":null,\"note\":\"%s\"%s", a,
                         PICK(ids), PICK(tails));
            break;
        default:
            n = snprintf(buf, sizeof(buf),
                         "{\"x\":{\"prompt_tokens\":%s},\"completion_tokens\":[%s],"
                         "\"prompt_tokens\": %s %s",
                         a, b, c, PICK(tails));
            break;
        }
        assert_true(n > 0 && (size_t)n < sizeof(buf));
        size_t len = (size_t)n;
        if (rnd(8) == 0)
            len = rnd((uint32_t)len + 1); /* cut short */
        check_usage(buf, len);
        check_usage(buf, len);
    }
    gw_llm_shape_stats_t st = gw_llm_shape_stats();
    print_message("usage: %llu hits, %llu misses\n", (unsigned long long)st.u_hits,
                  (unsigned long long)st.u_misses);
    assert_true(st.u_hits > 5000);
    assert_true(st.u_misses > 1000);
    gw_llm_shapes_clear();
}

/* Usage objects of three shapes in turn (two kept): a few learns, then one
 * miss in 64; the counts as yajl's all the while. */
static void test_usage_learn_bound(void **state)
{
    (void)state;
    gw_llm_shapes_clear();
    static const char *const us[] = {
        "{\"prompt_tokens\":31,\"completion_tokens\":9,\"total_tokens\":40}}",
        "{\"prompt_tokens\":31,\"total_tokens\":40,\"completion_tokens\":9}}",
        "{\"completion_tokens\":9,\"prompt_tokens\":31,\"total_tokens\":40}}"};
    for (int i = 0; i < 6400; i++)
        check_usage(us[i % 3], strlen(us[i % 3]));
    gw_llm_shape_stats_t st = gw_llm_shape_stats();
    /* misses learn rarely, so some shapes stay and hit */
    assert_true(st.u_hits > 0);
    assert_true(st.u_misses > 6400 / 3);
    gw_llm_shapes_clear();
}

static void test_usage_hit_and_miss(void **state)
{
    (void)state;
    gw_llm_shapes_clear();
    gw_llm_uread_t u;
    gw_llm_usage_read(S("{\"prompt_tokens\":27,\"completion_tokens\":12,\"total_tokens\":39}}"),
                      true, &u);
    assert_true(u.closed && u.have_p && u.have_c);
    assert_int_equal(u.pv, 27);
    assert_int_equal(u.cv, 12);
    gw_llm_usage_read(
        S("{\"prompt_tokens\":3100,\"completion_tokens\":-4,\"total_tokens\":0},\"x\":1}"), true,
        &u);
    assert_true(u.closed && u.have_p && u.have_c);
    assert_int_equal(u.pv, 3100);
    assert_int_equal(u.cv, -4);
    assert_int_equal(gw_llm_shape_stats().u_hits, 1);
    /* a float where an integer was, and one cut short: misses, as yajl */
    gw_llm_usage_read(S("{\"prompt_tokens\":3.5,\"completion_tokens\":4,\"total_tokens\":0}"), true,
                      &u);
    assert_true(u.closed && !u.have_p && u.have_c);
    gw_llm_usage_read(S("{\"prompt_tokens\":3,\"completion_tokens\":4,\"total_tokens\":0"), true,
                      &u);
    assert_false(u.closed);
    assert_int_equal(gw_llm_shape_stats().u_hits, 1);
    gw_llm_shapes_clear();
}

/* The Responses API's names, and a kept shape used only with the names it
 * was learnt with: an object that has both chat's and that API's counts
 * reads each set by its own names, kept or not. */
static void test_usage_responses_names(void **state)
{
    (void)state;
    gw_llm_shapes_clear();
    gw_llm_uread_t u;
    static const char both[] = "{\"prompt_tokens\":1,\"input_tokens\":2,\"output_tokens\":3,"
                               "\"completion_tokens\":4,\"total_tokens\":5}";
    gw_llm_resp_usage_read(S("{\"input_tokens\":31,\"input_tokens_details\":{\"input_tokens\":7},"
                             "\"output_tokens\":9,\"total_tokens\":40}"),
                           true, &u);
    assert_true(u.closed && u.have_p && u.have_c);
    assert_int_equal(u.pv, 31);
    assert_int_equal(u.cv, 9);
    for (int round = 0; round < 2; round++) { /* the second: both through kept shapes */
        gw_llm_usage_read(S(both), true, &u);
        assert_true(u.closed && u.have_p && u.have_c);
        assert_int_equal(u.pv, 1);
        assert_int_equal(u.cv, 4);
        gw_llm_resp_usage_read(S(both), true, &u);
        assert_true(u.closed && u.have_p && u.have_c);
        assert_int_equal(u.pv, 2);
        assert_int_equal(u.cv, 3);
    }
    /* chat's names only: nothing for a Responses read */
    gw_llm_resp_usage_read(S("{\"prompt_tokens\":1,\"completion_tokens\":4}"), false, &u);
    assert_true(u.closed && !u.have_p && !u.have_c);
    gw_llm_shapes_clear();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events_random),         cmocka_unit_test(test_events_streams),
        cmocka_unit_test(test_events_corpus),         cmocka_unit_test(test_events_hit_and_miss),
        cmocka_unit_test(test_events_learn_bound),    cmocka_unit_test(test_usage_random),
        cmocka_unit_test(test_usage_hit_and_miss),    cmocka_unit_test(test_usage_learn_bound),
        cmocka_unit_test(test_usage_responses_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
