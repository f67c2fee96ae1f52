/*
 * The request-body scanner (gateway/body_scan.c): acceptance equal to
 * jansson's intake on a corpus of tricky bodies (and no slow path for
 * ordinary ones), the facts and their byte spans, splices at every
 * position, big integers kept as sent; and the plain-data policy entry
 * points (rl_clamp_plan, rl_chat_prompt_tokens, flt_request_check_chat)
 * giving exactly what their jansson versions give on the same bodies.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "filters/filters.h"
#include "gateway/body_scan.h"
#include "gateway/json_intake.h"
#include "ratelimit/ratelimit.h"
#include "test_filters_util.h"
#include "tests/fuzz/scan_same.h"

static json_t *intake(const char *b, size_t n)
{
    bool inexact;
    char msg[256];
    json_t *j = gw_json_intake(b, n, &inexact, msg, sizeof(msg));
    if (j && !json_is_object(j)) {
        json_decref(j);
        return NULL;
    }
    return j;
}

/* ---- acceptance ------------------------------------------------------------ */

typedef struct acc_case {
    const char *body;
    size_t len; /* 0: strlen */
    int want;   /* 1: scanner must accept (fast path), 0: must not, -1: either */
} acc_case_t;

static const acc_case_t acc_cases[] = {
    {"{\"model\":\"m\"}", 0, 1},
    {" \t\r\n{\"model\":\"m\"} \n", 0, 1},
    {"{\"model\":\"m\",\"a\":[1,-0,1.5e3,-2E-2,0.0,true,false,null,{}]}", 0, 1},
    {"{\"model\":\"m\\u0041\\n\\\"\\\\\\/\",\"k\\u00e9y\":1}", 0, 1},
    {"{\"model\":\"\\ud83d\\ude00\",\"x\":\"caf\xc3\xa9 \xe6\x95\x8f \xf0\x9f\x98\x80\"}", 0, 1},
    {"{\"model\":\"a\\u0000b\"}", 0, 1}, /* NUL inside a string: fine */
    {"{\"model\":\"m\",\"n\":123456789012345678901234567890}", 0, 1}, /* beyond int64 */
    {"{\"model\":\"m\",\"x\":1e-999}", 0, 1}, /* underflow: jansson takes it */
    {"{}", 0, 1},
    /* refused by both */
    {"", 0, 0},
    {"{", 0, 0},
    {"{\"model\":\"m\"", 0, 0},
    {"{\"model\":\"m\"} x", 0, 0},
    {"{\"model\":\"m\"}\"x", 0, 0},
    {"{\"model\":\"m\"}{}", 0, 0},
    {"{\"model\":\"m\",}", 0, 0},
    {"{\"model\":'m'}", 0, 0},
    {"{\"model\":\"m\"/*c*/}", 0, 0},
    {"{\"a\":01}", 0, 0},
    {"{\"a\":1.}", 0, 0},
    {"{\"a\":.5}", 0, 0},
    {"{\"a\":+1}", 0, 0},
    {"{\"a\":1e999}", 0, 0},
    {"{\"a\":NaN}", 0, 0},
    {"{\"a\":\"\\x\"}", 0, 0},
    {"{\"a\":\"\\u12\"}", 0, 0},
    {"{\"a\":\"tab\there\"}", 0, 0},
    {"{\"a\":1\v}", 0, 0},
    {"{\"a\":1\f}", 0, 0},
    {"{\"a\":\"\xc0\x80\"}", 0, 0},         /* overlong */
    {"{\"a\":\"\xed\xa0\x80\"}", 0, 0},     /* a surrogate in UTF-8 */
    {"{\"a\":\"\xf4\x90\x80\x80\"}", 0, 0}, /* beyond U+10FFFF */
    {"{\"a\":\"\xff\"}", 0, 0},
    {"{\"a\":\"\\ud800\"}", 0, 0},        /* lone high surrogate */
    {"{\"a\":\"\\udc00\"}", 0, 0},        /* lone low surrogate */
    {"{\"a\":\"\\ud800\\u0041\"}", 0, 0}, /* high, then not a low */
    {"{\"a\":1,\"a\":2}", 0, 0},          /* duplicate key */
    {"{\"a\":1,\"\\u0061\":2}", 0, 0},    /* the same key, escaped */
    {"{\"a\\u0000\":1}", 0, 0},           /* NUL in a key */
    {"{\"a\":1}\0", 8, 0},
    /* jansson takes them but not as an object: the slow path words it */
    {"[1,2]", 0, 0},
    {"\"s\"", 0, 0},
    {"3", 0, 0},
};

static void test_acceptance(void **state)
{
    (void)state;
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    for (size_t i = 0; i < sizeof(acc_cases) / sizeof(acc_cases[0]); i++) {
        const acc_case_t *c = &acc_cases[i];
        size_t n = c->len ? c->len : strlen(c->body);
        gw_scan_rc_t rc = gw_body_scan(s, c->body, n, GW_SCAN_MSGS);
        json_t *j = intake(c->body, n);
        if (rc == GW_SCAN_OK && !j)
            fail_msg("case %zu: the scanner accepted what jansson refuses: %s", i, c->body);
        if (c->want == 1 && rc != GW_SCAN_OK)
            fail_msg("case %zu: an ordinary body went to the slow path: %s", i, c->body);
        if (c->want == 0 && rc == GW_SCAN_OK)
            fail_msg("case %zu: accepted: %s", i, c->body);
        json_decref(j);
    }
    gw_body_scan_free(s);
}

/* The byte-class pass before yajl reads 128 bytes a step: a \v or \f as
 * whitespace or a bad UTF-8 sequence inside a string, at every offset of a
 * step and in the tail past the last whole step, still sends the body to
 * the slow path; a good 2-byte character anywhere does not. */
static void test_byte_pass_every_offset(void **state)
{
    (void)state;
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    enum { N = 700 }; /* 5 steps of 128 and a tail of 60 */
    char body[N];
    size_t checked = 0;
    for (size_t at = 1; at + 8 < N; at++) {
        /* {<spaces>"a":1}: \v or \f among the spaces */
        for (int k = 0; k < 2; k++) {
            memset(body, ' ', N);
            body[0] = '{';
            memcpy(body + N - 7, "\"a\":1}", 6);
            assert_int_equal(gw_body_scan(s, body, N, 0), GW_SCAN_OK);
            body[at] = k ? '\f' : '\v';
            if (gw_body_scan(s, body, N, 0) != GW_SCAN_SLOW)
                fail_msg("%s at %zu accepted", k ? "\\f" : "\\v", at);
            checked++;
        }
        /* {"a":"xx...x"}: an overlong sequence, or a good one, in the string */
        if (at < 6 || at + 4 > N)
            continue;
        for (int k = 0; k < 2; k++) {
            memset(body, 'x', N);
            memcpy(body, "{\"a\":\"", 6);
            memcpy(body + N - 2, "\"}", 2);
            body[at] = (char)(k ? 0xc3 : 0xc0); /* é, or an overlong lead */
            body[at + 1] = (char)(k ? 0xa9 : 0x80);
            gw_scan_rc_t rc = gw_body_scan(s, body, N, 0);
            if (rc != (k ? GW_SCAN_OK : GW_SCAN_SLOW))
                fail_msg("%s at %zu: rc %d", k ? "good UTF-8" : "overlong", at, (int)rc);
            checked++;
        }
    }
    assert_true(checked > 2500);
    gw_body_scan_free(s);
}

/* The byte pass's last partial step (read from a zeroed copy): every body
 * length from 8 to 300 bytes, so the tail is each length 0..127, with one
 * byte >= 0x80 (a good 2-byte character, an overlong lead, a lone 0xff) or
 * a \v / \f at every offset of the string or the blanks: refused or taken
 * exactly as a body of that byte alone decides. */
static void test_byte_pass_short_tails(void **state)
{
    (void)state;
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    char body[301];
    size_t checked = 0;
    for (size_t n = 8; n <= 300; n++) {
        /* {"a":"xx..x"}<blanks>: the string takes the first half */
        size_t str_end = 6 + (n - 8) / 2; /* offset of the closing quote */
        memset(body, ' ', n);
        memcpy(body, "{\"a\":\"", 6);
        memset(body + 6, 'x', str_end - 6);
        memcpy(body + str_end, "\"}", 2);
        assert_int_equal(gw_body_scan(s, body, n, GW_SCAN_MSGS), GW_SCAN_OK);
        assert_int_equal(gw_body_fact(s, GW_F_TOP)->end, str_end + 2);
        for (size_t at = 6; at + 1 < str_end; at++) {
            static const unsigned char hi[3][2] = {{0xc3, 0xa9}, {0xc0, 0x80}, {0xff, 'x'}};
            for (int k = 0; k < 3; k++) {
                body[at] = (char)hi[k][0];
                body[at + 1] = (char)hi[k][1];
                gw_scan_rc_t rc = gw_body_scan(s, body, n, GW_SCAN_MSGS);
                if (rc != (k == 0 ? GW_SCAN_OK : GW_SCAN_SLOW))
                    fail_msg("length %zu, byte %#x at %zu: rc %d", n, hi[k][0], at, (int)rc);
                checked++;
            }
            body[at] = body[at + 1] = 'x';
        }
        for (size_t at = str_end + 2; at < n; at++) {
            for (int k = 0; k < 2; k++) {
                body[at] = k ? '\f' : '\v';
                if (gw_body_scan(s, body, n, GW_SCAN_MSGS) != GW_SCAN_SLOW)
                    fail_msg("length %zu, %s at %zu accepted", n, k ? "\\f" : "\\v", at);
                checked++;
            }
            body[at] = ' ';
        }
        assert_int_equal(gw_body_scan(s, body, n, GW_SCAN_MSGS), GW_SCAN_OK);
    }
    assert_true(checked > 40000);
    gw_body_scan_free(s);
}

/* The thread keeps its yajl handle between bodies (a stream of values):
 * whatever the previous body's end (accepted, refused by yajl, stopped by
 * a callback, a token left open, a second value), the next body gets the
 * verdict and the facts it gets alone. */
static void test_handle_reuse(void **state)
{
    (void)state;
    static const struct {
        const char *body;
        int ok;
    } seq[] = {
        {"{\"model\":\"m\",\"max_tokens\":7}", 1},
        {"{\"model\":\"m\"}{\"max_tokens\":8}", 0}, /* a second object */
        {"{\"model\":\"m\",\"max_tokens\":9}  ", 1},
        {"{\"model\":\"m\"} 5 ", 0},  /* a second value, a number */
        {"{\"model\":\"m\"} \"x", 0}, /* a string left open */
        {"{\"max_tokens\":10}\n", 1},
        {"{\"model\":\"m\"", 0}, /* the document left open */
        {"{\"max_tokens\":11}", 1},
        {"{\"a\":1,\"a\":2}", 0}, /* a callback stops yajl */
        {"{\"max_tokens\":12}", 1},
        {"{\"a\":[1,}", 0}, /* yajl refuses */
        {"{\"max_tokens\":13}", 1},
        {"5", 0},
        {"{\"max_tokens\":14}", 1},
        {"{} {}", 0},
        {"{}", 1},
        {"{\"max_tokens\":15}", 1},
    };
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    for (int round = 0; round < 2; round++) {
        for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
            const char *b = seq[i].body;
            gw_scan_rc_t rc = gw_body_scan(s, b, strlen(b), GW_SCAN_MSGS);
            if (rc != (seq[i].ok ? GW_SCAN_OK : GW_SCAN_SLOW))
                fail_msg("round %d, body %zu (%s): rc %d", round, i, b, (int)rc);
            if (!seq[i].ok)
                continue;
            const char *mt = strstr(b, "\"max_tokens\":");
            assert_int_equal(gw_body_fact(s, GW_F_MAX_TOKENS)->kind, mt ? SL_J_INT : SL_J_ABSENT);
            if (mt)
                assert_int_equal(gw_body_fact(s, GW_F_MAX_TOKENS)->i, atoi(mt + 13));
            assert_int_equal(b[gw_body_fact(s, GW_F_TOP)->close], '}');
            assert_int_equal(gw_body_fact(s, GW_F_TOP)->off, 0);
        }
    }
    gw_body_scan_free(s);
}

/* Duplicate keys past the linear check (the hash), and nesting past the
 * scanner's depth (jansson decides). */
static void test_many_keys_and_depth(void **state)
{
    (void)state;
    char *b = malloc(64 * 1024);
    assert_non_null(b);
    size_t n = (size_t)sprintf(b, "{\"model\":\"m\"");
    for (int i = 0; i < 500; i++)
        n += (size_t)sprintf(b + n, ",\"k%d\":%d", i, i);
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    strcpy(b + n, "}");
    assert_int_equal(gw_body_scan(s, b, n + 1, 0), GW_SCAN_OK);
    assert_int_equal(gw_body_fact(s, GW_F_TOP)->members, 501);
    strcpy(b + n, ",\"k377\":1}");
    assert_int_equal(gw_body_scan(s, b, strlen(b), 0), GW_SCAN_SLOW);
    /* deep: 300 arrays (jansson takes up to 2048) */
    n = (size_t)sprintf(b, "{\"model\":\"m\",\"d\":");
    for (int i = 0; i < 300; i++)
        b[n++] = '[';
    for (int i = 0; i < 300; i++)
        b[n++] = ']';
    b[n++] = '}';
    assert_int_equal(gw_body_scan(s, b, n, 0), GW_SCAN_SLOW);
    json_t *j = intake(b, n);
    assert_non_null(j);
    json_decref(j);
    gw_body_scan_free(s);
    free(b);
}

/* ---- facts ----------------------------------------------------------------- */

static void assert_span(const char *body, const gw_jfact_t *f, const char *text)
{
    assert_int_equal(f->end - f->off, strlen(text));
    assert_memory_equal(body + f->off, text, strlen(text));
}

static void test_facts(void **state)
{
    (void)state;
    const char *b =
        "{\"model\":\"chat-\\u006dodel\",\"messages\":[{\"role\":\"system\",\"content\":\"Be "
        "brief.\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\\n\"},"
        "{\"type\":\"image_url\",\"image_url\":{\"url\":\"u\"}}],\"name\":\"bob\"},{\"role\":"
        "\"assistant\",\"content\":null,\"tool_calls\":[]}],\"stream\":true, \"stream_options\" : "
        "{ \"include_usage\" : false } ,\"max_tokens\":  64 ,\"n\":2,\"tools\":[]}";
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    assert_int_equal(gw_body_scan(s, b, strlen(b), GW_SCAN_MSGS), GW_SCAN_OK);
    assert_int_equal(gw_body_fact(s, GW_F_MODEL)->kind, SL_J_STRING);
    assert_int_equal(gw_body_fact(s, GW_F_MODEL)->s.len, 10);
    assert_memory_equal(gw_body_fact(s, GW_F_MODEL)->s.p, "chat-model", 10);
    assert_span(b, gw_body_fact(s, GW_F_MODEL), "\"chat-\\u006dodel\"");
    assert_int_equal(gw_body_fact(s, GW_F_STREAM)->kind, SL_J_TRUE);
    assert_span(b, gw_body_fact(s, GW_F_STREAM), "true");
    assert_int_equal(gw_body_fact(s, GW_F_STREAM_OPTIONS)->kind, SL_J_OBJECT);
    assert_span(b, gw_body_fact(s, GW_F_STREAM_OPTIONS), "{ \"include_usage\" : false }");
    assert_int_equal(gw_body_fact(s, GW_F_STREAM_OPTIONS)->members, 1);
    assert_int_equal(b[gw_body_fact(s, GW_F_STREAM_OPTIONS)->close], '}');
    assert_int_equal(gw_body_fact(s, GW_F_INCLUDE_USAGE)->kind, SL_J_FALSE);
    assert_span(b, gw_body_fact(s, GW_F_INCLUDE_USAGE), "false");
    assert_int_equal(gw_body_fact(s, GW_F_MAX_TOKENS)->kind, SL_J_INT);
    assert_int_equal(gw_body_fact(s, GW_F_MAX_TOKENS)->i, 64);
    assert_span(b, gw_body_fact(s, GW_F_MAX_TOKENS), "64");
    assert_int_equal(gw_body_fact(s, GW_F_MAX_COMPLETION_TOKENS)->kind, SL_J_ABSENT);
    assert_int_equal(gw_body_fact(s, GW_F_N)->i, 2);
    assert_int_equal(gw_body_fact(s, GW_F_TOP)->members, 7);
    assert_int_equal(b[gw_body_fact(s, GW_F_TOP)->close], '}');
    const sl_chat_t *c = &s->chat;
    assert_int_equal(c->messages_kind, SL_J_ARRAY);
    assert_int_equal(c->tools_kind, SL_J_ARRAY);
    assert_int_equal(c->nmsgs, 3);
    assert_true(sl_text_is(c->msgs[0].role, "system"));
    assert_int_equal(c->msgs[0].content_kind, SL_J_STRING);
    assert_true(sl_text_is(c->msgs[0].content, "Be brief."));
    assert_int_equal(c->msgs[1].content_kind, SL_J_ARRAY);
    assert_int_equal(c->msgs[1].nparts, 2);
    assert_true(sl_text_is(c->parts[c->msgs[1].part0].text, "hi\n"));
    assert_true(c->parts[c->msgs[1].part0 + 1].image_url);
    assert_true(sl_text_is(c->msgs[1].name, "bob"));
    assert_int_equal(c->msgs[2].content_kind, SL_J_NULL);
    assert_int_equal(c->msgs[2].tool_calls_kind, SL_J_ARRAY);
    /* without GW_SCAN_MSGS the messages are not read */
    assert_int_equal(gw_body_scan(s, b, strlen(b), 0), GW_SCAN_OK);
    assert_int_equal(s->chat.nmsgs, 0);
    assert_false(s->has_msgs);
    /* strings with \u0000: the decoded bytes, strcmp's reading for roles */
    const char *z =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\\u0000x\",\"content\":\"a\\u0000b\"}]}";
    assert_int_equal(gw_body_scan(s, z, strlen(z), GW_SCAN_MSGS), GW_SCAN_OK);
    assert_int_equal(s->chat.msgs[0].content.len, 3);
    assert_true(sl_text_is(s->chat.msgs[0].role, "user"));
    gw_body_scan_free(s);
}

/* A scan after a rich one on the same handle (gw_body_scan_reset resets
 * only what is read): every fact, message, part, splice and flag of the
 * first is forgotten. */
static void test_reset_forgets(void **state)
{
    (void)state;
    const char *rich =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
        "\"text\",\"text\":\"hi\"}]}],\"stream\":true,\"stream_options\":{\"include_usage\":"
        "true},\"max_tokens\":5,\"max_completion_tokens\":6,\"max_output_tokens\":7,\"n\":"
        "123456789012345678901234567890,\"tools\":[],\"x\":\"\\u00e9\",\"input\":\"i\"}";
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    assert_int_equal(gw_body_scan(s, rich, strlen(rich), GW_SCAN_MSGS), GW_SCAN_OK);
    assert_true(s->bigint);
    assert_int_equal(gw_body_set(s, "model", gw_body_fact(s, GW_F_MODEL), "\"q\"", 3), 0);
    assert_int_equal(s->nsplices, 1);
    const char *e = "{}";
    assert_int_equal(gw_body_scan(s, e, 2, GW_SCAN_MSGS), GW_SCAN_OK);
    const gw_jfact_t *absent[] = {gw_body_fact(s, GW_F_MODEL),
                                  gw_body_fact(s, GW_F_STREAM),
                                  gw_body_fact(s, GW_F_STREAM_OPTIONS),
                                  gw_body_fact(s, GW_F_INCLUDE_USAGE),
                                  gw_body_fact(s, GW_F_MAX_TOKENS),
                                  gw_body_fact(s, GW_F_MAX_COMPLETION_TOKENS),
                                  gw_body_fact(s, GW_F_MAX_OUTPUT_TOKENS),
                                  gw_body_fact(s, GW_F_N),
                                  gw_body_fact(s, GW_F_INPUT)};
    for (size_t i = 0; i < sizeof(absent) / sizeof(absent[0]); i++)
        if (absent[i]->kind != SL_J_ABSENT)
            fail_msg("fact %zu kept kind %d", i, (int)absent[i]->kind);
    assert_int_equal(gw_body_fact(s, GW_F_TOP)->kind, SL_J_OBJECT);
    assert_int_equal(gw_body_fact(s, GW_F_TOP)->members, 0);
    assert_false(s->bigint);
    assert_true(s->has_msgs);
    assert_int_equal(s->elided, 0);
    assert_int_equal(s->nsplices, 0);
    assert_int_equal(s->chat.messages_kind, SL_J_ABSENT);
    assert_int_equal(s->chat.tools_kind, SL_J_ABSENT);
    assert_int_equal(s->chat.nmsgs, 0);
    /* the added member goes in without a comma: top's members are this scan's */
    assert_int_equal(gw_body_set(s, "model", gw_body_fact(s, GW_F_MODEL), "\"q\"", 3), 0);
    char *out = NULL;
    size_t n = 0;
    assert_int_equal(gw_body_splice_apply(s, &out, &n), 0);
    assert_int_equal(n, 13);
    assert_memory_equal(out, "{\"model\":\"q\"}", 13);
    free(out);
    /* parts are counted from 0 again; without GW_SCAN_MSGS no messages */
    const char *one = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}";
    assert_int_equal(gw_body_scan(s, rich, strlen(rich), GW_SCAN_MSGS), GW_SCAN_OK);
    assert_int_equal(gw_body_scan(s, one, strlen(one), GW_SCAN_MSGS), GW_SCAN_OK);
    assert_int_equal(s->chat.nmsgs, 1);
    assert_int_equal(s->chat.msgs[0].part0, 0);
    assert_int_equal(s->chat.msgs[0].nparts, 1);
    assert_int_equal(s->chat.tools_kind, SL_J_ABSENT);
    assert_int_equal(gw_body_scan(s, rich, strlen(rich), 0), GW_SCAN_OK);
    assert_false(s->has_msgs);
    assert_int_equal(s->chat.nmsgs, 0);
    gw_body_scan_free(s);
}

/* The reset clears the facts' bits, not their lines (gw_body_scan_t's
 * facts_set): a plain body after a rich one reads every fact it lacks as
 * absent through gw_body_fact, while the rich scan's kinds are still in
 * the bytes (the reset wrote none of those lines), by the yajl path and by
 * a kept shape alike. Fails if the reset writes the kinds again (the bytes
 * check), if it leaves a bit set (a stale fact read), or if a scan or a
 * shape load writes a fact without its bit (the present facts' checks). */
static void test_reset_leaves_fact_lines(void **state)
{
    (void)state;
    const char *rich =
        "{\"model\":\"r\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true},\"max_tokens\":5,\"max_completion_tokens\":6,"
        "\"max_output_tokens\":7,\"n\":2,\"input\":\"i\",\"instructions\":\"s\",\"tools\":[1]}";
    const char *plain =
        "{\"model\":\"bench-model\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}";
    const unsigned ways[] = {GW_SCAN_MSGS | GW_SCAN_NO_SHAPE, GW_SCAN_MSGS | GW_SCAN_SHAPE_TEST};
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    for (size_t w = 0; w < sizeof(ways) / sizeof(ways[0]); w++) {
        /* twice each: with SHAPE_TEST the second scan of a body is a kept shape's load */
        for (int round = 0; round < 2; round++) {
            assert_int_equal(gw_body_scan(s, rich, strlen(rich), ways[w]), GW_SCAN_OK);
            assert_int_equal(s->facts_set, (1u << GW_F_COUNT) - 1);
            assert_int_equal(gw_body_fact(s, GW_F_TOOLS)->kind, SL_J_ARRAY);
            assert_int_equal(gw_body_fact(s, GW_F_N)->i, 2);
            assert_int_equal(gw_body_scan(s, plain, strlen(plain), ways[w]), GW_SCAN_OK);
            assert_int_equal(s->facts_set, (1u << GW_F_TOP) | (1u << GW_F_MODEL));
            assert_int_equal(gw_body_fact(s, GW_F_TOP)->kind, SL_J_OBJECT);
            assert_int_equal(gw_body_fact(s, GW_F_TOP)->members, 2);
            assert_true(sl_text_is(gw_body_fact(s, GW_F_MODEL)->s, "bench-model"));
            for (int i = GW_F_STREAM; i < GW_F_COUNT; i++) {
                if (gw_body_fact(s, (gw_fact_id_t)i)->kind != SL_J_ABSENT)
                    fail_msg("way %zu round %d: fact %d reads kind %d", w, round, i,
                             (int)gw_body_fact(s, (gw_fact_id_t)i)->kind);
                if (s->fact[i].kind == SL_J_ABSENT) /* the rich scan's, unwritten since */
                    fail_msg("way %zu round %d: fact %d's line was written by the reset", w, round,
                             i);
            }
            assert_int_equal(gw_body_fact(s, GW_F_N)->i, 0);
            assert_int_equal(s->fact[GW_F_N].i, 2);
            assert_int_equal(s->fact[GW_F_TOOLS].kind, SL_J_ARRAY);
        }
    }
    gw_body_scan_free(s);
}

/* Integers beyond int64 make jansson read the body again with reals: the
 * facts follow (64.0 is then the integer 64, 2^53+1 a real), and a spliced
 * body keeps the big integer's digits as sent. */
static void test_bigint(void **state)
{
    (void)state;
    const char *b = "{\"model\":\"m\",\"max_tokens\":64.0,\"n\":9007199254740993,"
                    "\"seed\":123456789012345678901234567890}";
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    assert_int_equal(gw_body_scan(s, b, strlen(b), 0), GW_SCAN_OK);
    assert_true(s->bigint);
    assert_int_equal(gw_body_fact(s, GW_F_MAX_TOKENS)->kind, SL_J_INT);
    assert_int_equal(gw_body_fact(s, GW_F_MAX_TOKENS)->i, 64);
    assert_int_equal(gw_body_fact(s, GW_F_N)->kind, SL_J_REAL);
    json_t *j = intake(b, strlen(b));
    assert_true(json_is_integer(json_object_get(j, "max_tokens")));
    assert_true(json_is_real(json_object_get(j, "n")));
    json_decref(j);
    assert_int_equal(gw_body_set(s, "model", gw_body_fact(s, GW_F_MODEL), "\"x\"", 3), 0);
    char *out;
    size_t n;
    assert_int_equal(gw_body_splice_apply(s, &out, &n), 0);
    assert_string_equal(out, "{\"model\":\"x\",\"max_tokens\":64.0,\"n\":9007199254740993,"
                             "\"seed\":123456789012345678901234567890}");
    free(out);
    gw_body_scan_free(s);
}

/* gw_body_splice_apply_buf, as flow.c builds a usual edited body: in the
 * caller's buffer when it fits with its NUL, else in a block of its own;
 * the same bytes either way, and as gw_body_splice_apply's. */
static void test_splice_apply_buf(void **state)
{
    (void)state;
    const char *b = "{\"model\":\"chat-model\",\"max_tokens\":64}";
    const char *want = "{\"model\":\"served-model\",\"max_tokens\":64}";
    size_t wn = strlen(want);
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    assert_int_equal(gw_body_scan(s, b, strlen(b), 0), GW_SCAN_OK);
    assert_int_equal(gw_body_set(s, "model", gw_body_fact(s, GW_F_MODEL), "\"served-model\"", 14),
                     0);
    char buf[64], *out;
    size_t n;
    memset(buf, 'z', sizeof(buf));
    assert_int_equal(gw_body_splice_apply_buf(s, buf, sizeof(buf), &out, &n), 0);
    assert_ptr_equal(out, buf);
    assert_int_equal(n, wn);
    assert_string_equal(out, want);
    /* a buffer without room for the NUL: a block of its own, buf untouched */
    memset(buf, 'z', sizeof(buf));
    assert_int_equal(gw_body_splice_apply_buf(s, buf, wn, &out, &n), 0);
    assert_ptr_not_equal(out, buf);
    assert_int_equal(n, wn);
    assert_string_equal(out, want);
    assert_int_equal(buf[0], 'z');
    free(out);
    assert_int_equal(gw_body_splice_apply(s, &out, &n), 0);
    assert_string_equal(out, want);
    free(out);
    gw_body_scan_free(s);
}

/* Keys as the callbacks match them: escaped forms of the wanted keys are
 * those keys; a key of a wanted key's length, or a wanted key inside an
 * object nothing is read from, is not; escaped keys that differ are no
 * duplicates of each other (each kept as decoded, not as yajl's buffer). */
static void test_key_forms(void **state)
{
    (void)state;
    const char *b =
        "{\"x\":{\"model\":\"inner\",\"max_tokens\":1},\"modex\":\"no\",\"mod\\u0065l\":"
        "\"m\",\"m\\u0065ssages\":[{\"r\\u006fle\":\"user\",\"content\":\"hi\"}],"
        "\"\\u0061\":1,\"\\u0062\":2,\"max_tokenz\":3,\"max_tokens\":4}";
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    assert_int_equal(gw_body_scan(s, b, strlen(b), GW_SCAN_MSGS), GW_SCAN_OK);
    assert_int_equal(gw_body_fact(s, GW_F_MODEL)->kind, SL_J_STRING);
    assert_true(sl_text_is(gw_body_fact(s, GW_F_MODEL)->s, "m"));
    assert_span(b, gw_body_fact(s, GW_F_MODEL), "\"m\"");
    assert_int_equal(gw_body_fact(s, GW_F_MAX_TOKENS)->i, 4);
    assert_int_equal(gw_body_fact(s, GW_F_TOP)->members, 8);
    assert_int_equal(s->chat.nmsgs, 1);
    assert_true(sl_text_is(s->chat.msgs[0].role, "user"));
    assert_true(sl_text_is(s->chat.msgs[0].content, "hi"));
    /* the same key escaped and plain, in any order: a duplicate */
    const char *d1 = "{\"model\":\"m\",\"mod\\u0065l\":\"n\"}";
    const char *d2 = "{\"mod\\u0065l\":\"n\",\"model\":\"m\"}";
    assert_int_equal(gw_body_scan(s, d1, strlen(d1), 0), GW_SCAN_SLOW);
    assert_int_equal(gw_body_scan(s, d2, strlen(d2), 0), GW_SCAN_SLOW);
    gw_body_scan_free(s);
}

/* Integers of up to 18 digits are read by the scanner itself, longer ones
 * by strtoll: both sides of that bound, signed, agree with jansson (the
 * largest 19-digit ones overflow an int64: a big integer, as reals). */
static void test_integer_bounds(void **state)
{
    (void)state;
    static const struct {
        const char *num;
        bool big;
        int64_t v;
    } cases[] = {
        {"0", false, 0},
        {"-0", false, 0},
        {"7", false, 7},
        {"-7", false, -7},
        {"999999999999999999", false, 999999999999999999LL},
        {"-999999999999999999", false, -999999999999999999LL},
        {"1000000000000000000", false, 1000000000000000000LL},
        {"9223372036854775807", false, INT64_MAX},
        {"-9223372036854775808", false, INT64_MIN},
        {"9223372036854775808", true, 0},
        {"9999999999999999999", true, 0},
        {"-9999999999999999999", true, 0},
    };
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char b[128];
        int n = snprintf(b, sizeof(b), "{\"model\":\"m\",\"max_tokens\":%s}", cases[i].num);
        assert_int_equal(gw_body_scan(s, b, (size_t)n, 0), GW_SCAN_OK);
        json_t *j = intake(b, (size_t)n);
        assert_non_null(j);
        const json_t *mt = json_object_get(j, "max_tokens");
        if (cases[i].big) {
            assert_true(s->bigint);
            assert_true(json_is_real(mt));
        } else {
            assert_false(s->bigint);
            assert_int_equal(gw_body_fact(s, GW_F_MAX_TOKENS)->kind, SL_J_INT);
            assert_true(gw_body_fact(s, GW_F_MAX_TOKENS)->i == cases[i].v);
            assert_true(json_integer_value(mt) == cases[i].v);
        }
        assert_span(b, gw_body_fact(s, GW_F_MAX_TOKENS), cases[i].num);
        json_decref(j);
    }
    gw_body_scan_free(s);
}

/* ---- splices ------------------------------------------------------------------ */

/* gw_body_splice_walk's pieces, as flow.c sends a large edited body: the
 * client's bytes by reference, the splice texts between. */
typedef struct walk {
    const gw_body_scan_t *s;
    char buf[512];
    size_t n, body_pieces, text_pieces;
    int stop_at; /* piece index at which to return 7, -1 never */
} walk_t;

static int walk_piece(void *arg, const char *p, size_t n, bool body)
{
    walk_t *w = arg;
    assert_true(n > 0); /* no empty pieces */
    if (w->stop_at >= 0 && (size_t)w->stop_at == w->body_pieces + w->text_pieces)
        return 7;
    if (body) { /* a span of the scanned bytes themselves, not a copy */
        assert_true(p >= w->s->body && p + n <= w->s->body + w->s->len);
        w->body_pieces++;
    } else {
        w->text_pieces++;
    }
    assert_true(w->n + n <= sizeof(w->buf));
    memcpy(w->buf + w->n, p, n);
    w->n += n;
    return 0;
}

static void check_walk(const gw_body_scan_t *s, const char *out, size_t n)
{
    walk_t w = {.s = s, .stop_at = -1};
    assert_int_equal(gw_body_splice_walk(s, walk_piece, &w), 0);
    assert_int_equal(w.n, n);
    assert_memory_equal(w.buf, out, n);
    assert_true(w.body_pieces >= 1);
    assert_true(w.text_pieces >= s->nsplices); /* a comma is a piece of its own */
    /* a piece that fails stops the walk with its code */
    walk_t f = {.s = s, .stop_at = 1};
    assert_int_equal(gw_body_splice_walk(s, walk_piece, &f), 7);
    assert_int_equal(f.body_pieces + f.text_pieces, 1);
}

/* Applies the three edits the gateway makes to body and checks the result
 * is the original tree with exactly those changes, and the bytes before the
 * first edit unchanged. */
static void check_edits(const char *body)
{
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    if (gw_body_scan(s, body, strlen(body), 0) != GW_SCAN_OK)
        fail_msg("not scanned: %s", body);
    size_t first = gw_body_fact(s, GW_F_MODEL)->off;
    if (gw_body_fact(s, GW_F_MAX_TOKENS)->kind != SL_J_ABSENT &&
        gw_body_fact(s, GW_F_MAX_TOKENS)->off < first)
        first = gw_body_fact(s, GW_F_MAX_TOKENS)->off;
    if (gw_body_fact(s, GW_F_STREAM_OPTIONS)->kind != SL_J_ABSENT &&
        gw_body_fact(s, GW_F_STREAM_OPTIONS)->off < first)
        first = gw_body_fact(s, GW_F_STREAM_OPTIONS)->off;
    assert_int_equal(gw_body_set(s, "model", gw_body_fact(s, GW_F_MODEL), "\"served\"", 8), 0);
    assert_int_equal(gw_body_set(s, "max_tokens", gw_body_fact(s, GW_F_MAX_TOKENS), "100", 3), 0);
    assert_int_equal(gw_body_set(s, "max_tokens", gw_body_fact(s, GW_F_MAX_TOKENS), "7", 1),
                     0); /* set again */
    assert_int_equal(gw_body_set_include_usage(s), 0);
    assert_int_equal(gw_body_set_include_usage(s), 0); /* a second time: nothing more */
    char *out;
    size_t n;
    assert_int_equal(gw_body_splice_apply(s, &out, &n), 0);
    assert_int_equal(strlen(out), n);
    json_t *got = intake(out, n);
    if (!got)
        fail_msg("edited body is not JSON: %s -> %s", body, out);
    json_t *want = intake(body, strlen(body));
    assert_non_null(want);
    json_object_set_new(want, "model", json_string("served"));
    json_object_set_new(want, "max_tokens", json_integer(7));
    json_t *so = json_object_get(want, "stream_options");
    if (!json_is_object(so)) {
        so = json_object();
        json_object_set_new(want, "stream_options", so);
    }
    json_object_set_new(so, "include_usage", json_true());
    if (!json_equal(got, want))
        fail_msg("%s -> %s", body, out);
    /* bytes before the first edit are the client's */
    assert_memory_equal(out, body, first);
    check_walk(s, out, n);
    json_decref(got);
    json_decref(want);
    free(out);
    gw_body_scan_free(s);
}

static void test_splices_every_position(void **state)
{
    (void)state;
    /* each edited key first, middle, last, alone in its object, absent;
     * stream_options absent, null, empty, with include_usage of each type */
    static const char *bodies[] = {
        "{\"model\":\"m\"}",
        "{ \"model\" : \"m\" }",
        "{\"model\":\"m\",\"max_tokens\":5}",
        "{\"max_tokens\":5,\"model\":\"m\"}",
        "{\"a\":1,\"model\":\"m\",\"max_tokens\":null,\"b\":[1]}",
        "{\"model\":\"m\",\"stream_options\":null}",
        "{\"model\":\"m\",\"stream_options\":{}}",
        "{\"model\":\"m\",\"stream_options\":{ }}",
        "{\"model\":\"m\",\"stream_options\":{\"x\":1}}",
        "{\"model\":\"m\",\"stream_options\":{\"include_usage\":false}}",
        "{\"model\":\"m\",\"stream_options\":{\"include_usage\":null,\"y\":2}}",
        "{\"model\":\"m\",\"stream_options\":{\"a\":{},\"include_usage\":\"yes\"}}",
        "{\"stream_options\":{\"include_usage\":true},\"model\":\"m\"}",
        "{\"stream_options\":7,\"model\":\"m\",\"max_tokens\":\"x\"}",
        "{\"model\":\"\\u006d\",\"max_tokens\":1e3}\n",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"}\"}]}",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++)
        check_edits(bodies[i]);
}

static void test_splice_bytes(void **state)
{
    (void)state;
    const char *b = "{\"model\":\"chat-model\", \"messages\":[],\"max_tokens\":9000}";
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    assert_int_equal(gw_body_scan(s, b, strlen(b), 0), GW_SCAN_OK);
    assert_false(gw_body_edited(s));
    char q[64];
    size_t qn;
    assert_int_equal(gw_json_quote("served-model", 12, q, sizeof(q), &qn), 0);
    assert_int_equal(gw_body_set(s, "model", gw_body_fact(s, GW_F_MODEL), q, qn), 0);
    assert_int_equal(gw_body_set(s, "max_tokens", gw_body_fact(s, GW_F_MAX_TOKENS), "2048", 4), 0);
    assert_int_equal(gw_body_set(s, "max_completion_tokens", NULL, "5", 1), 0);
    assert_true(gw_body_edited(s));
    char *out;
    size_t n;
    assert_int_equal(gw_body_splice_apply(s, &out, &n), 0);
    assert_string_equal(out, "{\"model\":\"served-model\", \"messages\":[],\"max_tokens\":2048,"
                             "\"max_completion_tokens\":5}");
    free(out);
    /* a name that needs escaping goes through jansson */
    assert_int_equal(gw_json_quote("a\"b\n", 4, q, sizeof(q), &qn), 0);
    assert_int_equal(qn, 8);
    assert_memory_equal(q, "\"a\\\"b\\n\"", 8);
    assert_int_equal(gw_json_quote("abc", 3, q, 4, &qn), -1); /* does not fit */
    gw_body_scan_free(s);
}

/* ---- the policy modules' plain-data entry points ------------------------- */

static const char *policy_bodies[] = {
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello there\"}]}",
    "{\"model\":\"m\",\"max_tokens\":100}",
    "{\"model\":\"m\",\"max_tokens\":5000,\"max_completion_tokens\":300}",
    "{\"model\":\"m\",\"max_completion_tokens\":9999}",
    "{\"model\":\"m\",\"max_tokens\":0}",
    "{\"model\":\"m\",\"max_tokens\":-3}",
    "{\"model\":\"m\",\"max_tokens\":1.5}",
    "{\"model\":\"m\",\"max_tokens\":\"9\"}",
    "{\"model\":\"m\",\"max_tokens\":null,\"stream\":null}",
    "{\"model\":\"m\",\"stream\":true}",
    "{\"model\":\"m\",\"stream\":1}",
    "{\"model\":\"m\",\"stream\":true,\"stream_options\":null}",
    "{\"model\":\"m\",\"stream\":true,\"stream_options\":[]}",
    "{\"model\":\"m\",\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
    "{\"model\":\"m\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}",
    "{\"model\":\"m\",\"stream\":false,\"stream_options\":3}",
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
    "\"caf\xc3\xa9 \xe6\x95\x8f\xe6\x84\x9f\"},{\"type\":\"image_url\",\"image_url\":{}},7,"
    "{\"text\":3}]},{\"role\":\"assistant\",\"name\":\"n\xc3\xa9\",\"content\":null}]}",
    "{\"model\":\"m\",\"messages\":{}}",
    "{\"model\":\"m\",\"messages\":[1,\"x\",{\"content\":{}}]}",
};

static void test_ratelimit_plain(void **state)
{
    (void)state;
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    for (size_t i = 0; i < sizeof(policy_bodies) / sizeof(policy_bodies[0]); i++) {
        const char *b = policy_bodies[i];
        assert_int_equal(gw_body_scan(s, b, strlen(b), GW_SCAN_MSGS), GW_SCAN_OK);
        for (int want = 0; want < 2; want++) {
            json_t *j = intake(b, strlen(b));
            rl_clamp_t a, c;
            char ea[160] = "", ec[160] = "";
            int ra = rl_body_clamp_ex(j, 2048, want, &a, ea, sizeof(ea));
            rl_clamp_in_t in;
            gw_body_scan_clamp_in(s, &in);
            rl_clamp_edits_t ed;
            int rc = rl_clamp_plan(&in, 2048, want, &c, &ed, ec, sizeof(ec));
            if (ra != rc || strcmp(ea, ec) != 0)
                fail_msg("body %zu: %d '%s' vs %d '%s'", i, ra, ea, rc, ec);
            if (ra == 0) {
                assert_memory_equal(&a, &c, sizeof(a));
                /* the edits give the tree rl_body_clamp_ex made */
                json_t *k = intake(b, strlen(b));
                if (ed.max_tokens)
                    json_object_set_new(k, "max_tokens", json_integer(ed.max_tokens));
                if (ed.max_completion_tokens)
                    json_object_set_new(k, "max_completion_tokens",
                                        json_integer(ed.max_completion_tokens));
                if (ed.include_usage) {
                    json_t *so = json_object_get(k, "stream_options");
                    if (!json_is_object(so)) {
                        so = json_object();
                        json_object_set_new(k, "stream_options", so);
                    }
                    json_object_set_new(so, "include_usage", json_true());
                }
                if (!json_equal(j, k))
                    fail_msg("body %zu: the edits differ", i);
                json_decref(k);
            }
            json_decref(j);
        }
        json_t *j = intake(b, strlen(b));
        assert_int_equal(rl_chat_prompt_tokens(&s->chat), rl_body_prompt_tokens(j));
        json_decref(j);
    }
    gw_body_scan_free(s);
}

static flt_conf_input_t fin;
static void tweak(flt_conf_t *c)
{
    c->input = fin;
}

static void test_filters_plain(void **state)
{
    (void)state;
    static const char *bodies[] = {
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}",
        "{\"model\":\"m\"}",
        "{\"model\":\"m\",\"messages\":{}}",
        "{\"model\":\"m\",\"messages\":[]}",
        "{\"model\":\"m\",\"messages\":[3]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"boss\",\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\\u0000\",\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":null}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[3]}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"},"
        "{\"type\":\"text\",\"text\":\"ok\"}]}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"this is forbidden\"}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
        "\"text\":"
        "\"forbid\"},{\"type\":\"text\",\"text\":\"den\"}]}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a badword here\"}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"call 13812345678\"}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"0123456789abc\"}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\","
        "\"content\":\"1\"},{\"role\":\"assistant\",\"content\":\"2\"},{\"role\":\"user\","
        "\"content\":\"3\"}]}",
    };
    /* max_chars 12 (reject, then truncate), keep_turns 1 (then 0), a system
     * prompt: every path to each verdict */
    static const flt_conf_input_t inputs[] = {
        {0, FLT_OVERFLOW_REJECT, 0, NULL, 0},      {12, FLT_OVERFLOW_REJECT, 0, NULL, 0},
        {12, FLT_OVERFLOW_TRUNCATE, 0, NULL, 0},   {0, FLT_OVERFLOW_REJECT, 1, NULL, 0},
        {0, FLT_OVERFLOW_REJECT, 0, "be nice", 0},
    };
    tf_list_t l[2] = {{"badword\n", FLT_ACTION_MASK, "masked"},
                      {"forbidden\n", FLT_ACTION_BLOCK, "blocked"}};
    flt_conf_regex_t re[] = {{"phone", "1[3-9]\\d{9}", FLT_ACTION_MASK}};
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    int edits = 0, plain = 0;
    for (size_t k = 0; k < sizeof(inputs) / sizeof(inputs[0]); k++) {
        fin = inputs[k];
        char err[256] = "";
        flt_ruleset_t *rs = tf_build(l, 2, re, 1, tweak, err, sizeof(err));
        if (!rs)
            fail_msg("build: %s", err);
        for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
            const char *b = bodies[i];
            assert_int_equal(gw_body_scan(s, b, strlen(b), GW_SCAN_MSGS), GW_SCAN_OK);
            flt_req_result_t rc, rt;
            flt_req_verdict_t vc = flt_request_check_chat(rs, &s->chat, &rc);
            json_t *j = intake(b, strlen(b));
            flt_req_verdict_t vt = flt_request_check(rs, j, &rt);
            if (vc == FLT_REQ_EDIT) {
                /* only when the tree's check did edit the body */
                if (vt != FLT_REQ_OK || !rt.modified)
                    fail_msg("conf %zu body %zu: EDIT but the tree says %d/%d", k, i, vt,
                             rt.modified);
                edits++;
            } else {
                if (vc != vt || rt.modified)
                    fail_msg("conf %zu body %zu: %d vs %d (modified %d)", k, i, vc, vt,
                             rt.modified);
                assert_int_equal(rc.status, rt.status);
                assert_string_equal(rc.message, rt.message);
                assert_true(rc.code == rt.code);
                assert_string_equal(rc.param ? rc.param : "", rt.param ? rt.param : "");
                assert_true((rc.rule == NULL) == (rt.rule == NULL));
                assert_int_equal(rc.logged, rt.logged);
                plain++;
            }
            json_decref(j);
        }
        flt_ruleset_unref(rs);
    }
    assert_true(edits >= 5);  /* mask, phone, truncate, keep_turns, system prompt */
    assert_true(plain >= 60); /* and the rest without a tree */
    gw_body_scan_free(s);
}

static void test_clamp_in(void **state)
{
    (void)state;
    const char *b = "{\"model\":\"m\",\"max_tokens\":77,\"max_completion_tokens\":\"x\","
                    "\"stream\":true,\"stream_options\":{\"include_usage\":true}}";
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    assert_int_equal(gw_body_scan(s, b, strlen(b), 0), GW_SCAN_OK);
    rl_clamp_in_t in;
    gw_body_scan_clamp_in(s, &in);
    assert_int_equal(in.max_tokens_kind, SL_J_INT);
    assert_int_equal(in.max_tokens, 77);
    assert_int_equal(in.max_completion_tokens_kind, SL_J_STRING);
    assert_int_equal(in.stream_kind, SL_J_TRUE);
    assert_int_equal(in.stream_options_kind, SL_J_OBJECT);
    assert_true(in.include_usage);
    const char *b2 = "{\"model\":\"m\",\"stream_options\":{\"include_usage\":1}}";
    assert_int_equal(gw_body_scan(s, b2, strlen(b2), 0), GW_SCAN_OK);
    gw_body_scan_clamp_in(s, &in);
    assert_int_equal(in.max_tokens_kind, SL_J_ABSENT);
    assert_int_equal(in.max_completion_tokens_kind, SL_J_ABSENT);
    assert_int_equal(in.stream_kind, SL_J_ABSENT);
    assert_false(in.include_usage); /* 1 is not true */
    gw_body_scan_free(s);
}

/* ---- the skeleton (yajl reads string interiors cut out) ----------------------- */

/* A body whose long content is filled with filler and has ins written at
 * offset at of it, both ways (scan_same.h): the test thresholds (cuts of
 * runs from 3 bytes) and the real ones. */
static size_t skel_case(char *b, size_t cap, const char *pre, size_t clen, const char *ins,
                        size_t inslen, size_t at, const char *post)
{
    size_t n = (size_t)snprintf(b, cap, "%s", pre);
    assert_true(n + clen + strlen(post) < cap);
    for (size_t i = 0; i < clen; i++)
        b[n + i] = (char)('a' + i % 26);
    if (at + inslen <= clen)
        memcpy(b + n + at, ins, inslen);
    n += clen;
    n += (size_t)snprintf(b + n, cap - n, "%s", post);
    return n;
}

static void skel_check(const char *b, size_t n, size_t *cuts)
{
    size_t cut = 0;
    const char *why = scan_same(b, n, GW_SCAN_SKEL_TEST, &cut);
    if (why)
        fail_msg("test thresholds: %s differs on %.*s", why, (int)(n < 400 ? n : 400), b);
    *cuts += cut > 0;
    why = scan_same(b, n, 0, &cut);
    if (why)
        fail_msg("real thresholds: %s differs on %.*s", why, (int)(n < 400 ? n : 400), b);
    *cuts += cut > 0;
}

static void test_skeleton_same(void **state)
{
    (void)state;
    enum { CAP = 20000 };
    char *b = malloc(CAP);
    assert_non_null(b);
    static const struct {
        const char *ins;
        size_t len;
    } ins[] = {
        {"\\\"", 2},         /* an escaped quote */
        {"\\\\", 2},         /* an escaped backslash */
        {"\\\\\\\\\\\\", 6}, /* a run of backslashes ending on a boundary */
        {"\\\\\\\"", 4},     /* \\ then \" */
        {"\\n\\t", 4},
        {"\\u00e9", 6},
        {"\\ud83d\\ude00", 12},
        {"\\ud83dxx\\ude00", 14}, /* a lone surrogate split by a run: refused */
        {"\\u12", 4},             /* a short \u escape: refused */
        {"\xc3\xa9", 2},          /* UTF-8 across a 32/64-byte boundary */
        {"\xf0\x9f\x98\x80", 4},
        {"\xc3", 1},        /* a broken UTF-8 sequence: refused */
        {"\"", 1},          /* ends the string early: refused */
        {"\x01", 1},        /* a control byte: refused */
        {"\n", 1},          /* a raw newline: refused */
        {"\\", 1},          /* a backslash escaping the next letter */
        {"\\x", 2},         /* an invalid escape */
        {"\v", 1},          /* \v: jansson decides */
        {"\",\"x\":\"", 7}, /* the string closed and another member opened */
    };
    static const struct {
        const char *pre, *post;
    } shapes[] = {
        {"{\"model\":\"m\",\"max_tokens\":64,\"messages\":[{\"role\":\"user\",\"content\":\"",
         "\"}],\"stream\":false}"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"",
         "\"},{\"type\":\"text\",\"text\":\"b\\u0041\"}]}],\"model\":\"m\",\"n\":2}"},
        {"{\"model\":\"m\",\"", "\":1,\"max_tokens\":3}"}, /* a long key */
        {"{\"model\":\"m\",\"messages\":[{\"content\":\"x\",\"role\":\"",
         "\"}],\"stream_options\":{\"include_usage\":false}}"},
        {"{\"model\":\"", "\",\"messages\":[]}"},    /* the model itself long */
        {"{\"model\":\"m\",\"x\":\"", "\"} \"tail"}, /* junk after the document */
        {"{\"model\":\"m\",\"x\":\"", ""},           /* a string open at the end */
    };
    size_t checked = 0, cuts = 0;
    static const size_t clens[] = {3, 40, 255, 256, 300, 5000};
    for (size_t sh = 0; sh < SL_ARRAY_LEN(shapes); sh++)
        for (size_t cl = 0; cl < SL_ARRAY_LEN(clens); cl++)
            for (size_t k = 0; k < SL_ARRAY_LEN(ins); k++) {
                size_t clen = clens[cl];
                /* every offset of the first 130 bytes and of the last 70 */
                for (size_t at = 0; at < clen; at++) {
                    if (at > 130 && at + 70 < clen && at % 61 != 0)
                        continue;
                    size_t n = skel_case(b, CAP, shapes[sh].pre, clen, ins[k].ins, ins[k].len, at,
                                         shapes[sh].post);
                    skel_check(b, n, &cuts);
                    checked++;
                }
            }
    /* Two long keys equal but for one byte in their middles: the skeleton
     * must not take them for duplicates (nor the same key for two). */
    for (int same = 0; same < 2; same++) {
        size_t n = 0;
        n += (size_t)sprintf(b + n, "{\"model\":\"m\",\"");
        for (int i = 0; i < 600; i++)
            b[n++] = i == 300 ? 'X' : 'k';
        n += (size_t)sprintf(b + n, "\":1,\"");
        for (int i = 0; i < 600; i++)
            b[n++] = i == 300 && !same ? 'Y' : (i == 300 ? 'X' : 'k');
        n += (size_t)sprintf(b + n, "\":2}");
        gw_body_scan_t *s = gw_body_scan_new();
        assert_non_null(s);
        assert_int_equal(gw_body_scan(s, b, n, 0), same ? GW_SCAN_SLOW : GW_SCAN_OK);
        assert_int_equal(gw_body_scan(s, b, n, GW_SCAN_SKEL_TEST),
                         same ? GW_SCAN_SLOW : GW_SCAN_OK);
        if (!same)
            assert_true(s->elided > 1000);
        gw_body_scan_free(s);
    }
    /* Many cuts in one body (the map's binary search), each content
     * decoded from the body when it has an escape. */
    size_t n = (size_t)sprintf(b, "{\"model\":\"m\",\"messages\":[");
    for (int m = 0; m < 40; m++) {
        n += (size_t)sprintf(b + n, "%s{\"role\":\"user\",\"content\":\"", m ? "," : "");
        for (int i = 0; i < 300; i++)
            b[n++] = (char)('a' + (i + m) % 26);
        n += (size_t)sprintf(b + n, m % 3 ? "\\n%d\"}" : "%d\"}", m);
    }
    n += (size_t)sprintf(b + n, "],\"max_tokens\":5}");
    skel_check(b, n, &cuts);
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    assert_int_equal(gw_body_scan(s, b, n, GW_SCAN_MSGS), GW_SCAN_OK);
    assert_int_equal(s->chat.nmsgs, 40);
    assert_true(s->elided > 40 * 250);
    assert_int_equal(s->chat.msgs[1].content.len, 300 + 1 + 1);
    assert_int_equal(s->chat.msgs[1].content.p[300], '\n');
    assert_int_equal(gw_body_fact(s, GW_F_MAX_TOKENS)->i, 5);
    assert_memory_equal(b + gw_body_fact(s, GW_F_MAX_TOKENS)->off, "5", 1);
    gw_body_scan_free(s);
    free(b);
    assert_true(checked > 10000);
    assert_true(cuts > checked / 2); /* the skeleton was taken, mostly */
}

/* ---- kept shapes (body_scan.c, "shapes") --------------------------------------- */

/* Issue #16's body, with the values a shape leaves as holes given. */
static size_t shape_body(char *b, size_t cap, const char *model, const char *sys, const char *user,
                         const char *max_tokens)
{
    return (size_t)snprintf(
        b, cap,
        "{\"model\":\"%s\",\"messages\":[{\"role\":\"system\",\"content\":\"%s\"},"
        "{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%s}",
        model, sys, user, max_tokens);
}

static void shape_check_text(sl_text_t t, const char *want)
{
    assert_int_equal(t.len, strlen(want));
    assert_memory_equal(t.p, want, t.len);
}

/* Two bodies of one shape: the second answered from the shape with its
 * own values (a stale span or a value not re-read fails here); an escape,
 * a new key or a role changed miss and are parsed. */
static void test_shapes(void **state)
{
    (void)state;
    gw_body_scan_shapes_clear();
    gw_shape_stats_t st0 = gw_body_scan_shape_stats();
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    char b1[512], b2[512], b3[512];
    size_t n1 = shape_body(b1, sizeof(b1), "chat-model", "You are a helpful assistant.",
                           "Write one sentence about the sea, please, in plain English.", "64");
    size_t n2 = shape_body(b2, sizeof(b2), "m2", "", "caf\xc3\xa9 sea, longer than before by far",
                           "-123456789012345678");
    assert_int_equal(gw_body_scan(s, b1, n1, GW_SCAN_MSGS), GW_SCAN_OK);
    gw_shape_stats_t st = gw_body_scan_shape_stats();
    assert_int_equal(st.hits - st0.hits, 0);
    assert_int_equal(st.misses - st0.misses, 1);
    assert_int_equal(gw_body_scan(s, b2, n2, GW_SCAN_MSGS), GW_SCAN_OK);
    st = gw_body_scan_shape_stats();
    assert_int_equal(st.hits - st0.hits, 1);
    assert_ptr_equal(s->body, b2);
    shape_check_text(gw_body_fact(s, GW_F_MODEL)->s, "m2");
    assert_memory_equal(b2 + gw_body_fact(s, GW_F_MODEL)->off, "\"m2\"", 4);
    assert_int_equal(gw_body_fact(s, GW_F_MODEL)->end, gw_body_fact(s, GW_F_MODEL)->off + 4);
    assert_int_equal(gw_body_fact(s, GW_F_MAX_TOKENS)->kind, SL_J_INT);
    assert_true(gw_body_fact(s, GW_F_MAX_TOKENS)->i == -123456789012345678LL);
    assert_memory_equal(b2 + gw_body_fact(s, GW_F_MAX_TOKENS)->off, "-123456789012345678}", 20);
    assert_int_equal(gw_body_fact(s, GW_F_MAX_TOKENS)->end, n2 - 1);
    assert_int_equal(gw_body_fact(s, GW_F_TOP)->end, n2);
    assert_int_equal(gw_body_fact(s, GW_F_TOP)->close, n2 - 1);
    assert_int_equal(gw_body_fact(s, GW_F_TOP)->members, 3);
    assert_int_equal(s->chat.nmsgs, 2);
    shape_check_text(s->chat.msgs[0].role, "system");
    shape_check_text(s->chat.msgs[0].content, "");
    shape_check_text(s->chat.msgs[1].role, "user");
    shape_check_text(s->chat.msgs[1].content, "caf\xc3\xa9 sea, longer than before by far");
    assert_ptr_equal(s->chat.msgs[1].content.p, strstr(b2, "caf"));
    /* the splices land on the new body's bytes */
    assert_int_equal(gw_body_set(s, "model", gw_body_fact(s, GW_F_MODEL), "\"x\"", 3), 0);
    assert_int_equal(gw_body_set(s, "max_tokens", gw_body_fact(s, GW_F_MAX_TOKENS), "9", 1), 0);
    char *out;
    size_t olen;
    assert_int_equal(gw_body_splice_apply(s, &out, &olen), 0);
    char want[512];
    size_t wn =
        shape_body(want, sizeof(want), "x", "", "caf\xc3\xa9 sea, longer than before by far", "9");
    assert_int_equal(olen, wn);
    assert_memory_equal(out, want, wn);
    free(out);

    /* misses: a role changed, a key changed, a real, another flag; each
     * parsed (and right). Escapes in a hole hit: test_shapes_escaped. */
    static const struct {
        const char *model, *sys, *user, *max;
        unsigned flags;
    } miss[] = {
        {"m", "a\\ud800b", "u", "1", GW_SCAN_MSGS},
        {"m", "a", "u\\u0000", "1", GW_SCAN_MSGS},
        {"m", "a", "u", "1.5", GW_SCAN_MSGS},
        {"m", "a", "u", "1234567890123456789", GW_SCAN_MSGS},
        {"m", "a", "u\"", "1", GW_SCAN_MSGS},
        {"m", "a", "u", "1", 0},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(miss); i++) {
        gw_shape_stats_t a = gw_body_scan_shape_stats();
        size_t n3 =
            shape_body(b3, sizeof(b3), miss[i].model, miss[i].sys, miss[i].user, miss[i].max);
        gw_scan_rc_t rc = gw_body_scan(s, b3, n3, miss[i].flags);
        gw_shape_stats_t z = gw_body_scan_shape_stats();
        assert_int_equal(z.hits, a.hits);
        const char *why = scan_same_shape(b3, n3);
        if (why)
            fail_msg("miss case %zu: %s", i, why);
        if (i == 0)
            assert_int_equal(rc, GW_SCAN_SLOW); /* jansson: a lone surrogate */
        if (i == 1) {
            assert_int_equal(rc, GW_SCAN_OK);
            assert_int_equal(s->chat.msgs[1].content.len, 2);
            assert_memory_equal(s->chat.msgs[1].content.p, "u\0", 2);
        }
    }
    char b4[512];
    memcpy(b4, b1, n1);
    memcpy(strstr(b4, "\"user\""), "\"usex\"", 6);
    gw_shape_stats_t a = gw_body_scan_shape_stats();
    assert_int_equal(gw_body_scan(s, b4, n1, GW_SCAN_MSGS), GW_SCAN_OK);
    assert_int_equal(gw_body_scan_shape_stats().hits, a.hits);
    shape_check_text(s->chat.msgs[1].role, "usex");
    memcpy(b4, b1, n1);
    memcpy(strstr(b4, "\"max_tokens\""), "\"max_tokenz\"", 12);
    assert_int_equal(gw_body_scan(s, b4, n1, GW_SCAN_MSGS), GW_SCAN_OK);
    assert_int_equal(gw_body_scan_shape_stats().hits, a.hits);
    assert_int_equal(gw_body_fact(s, GW_F_MAX_TOKENS)->kind, SL_J_ABSENT);

    /* the thread keeps a few: 4 shapes in turn all hit, 5 all miss (LRU) */
    for (int k = 4; k <= 5; k++) {
        gw_body_scan_shapes_clear();
        a = gw_body_scan_shape_stats();
        for (int round = 0; round < 3; round++)
            for (int j = 0; j < k; j++) {
                char pad[16];
                snprintf(pad, sizeof(pad), "%*s", j + 1, "");
                size_t n = (size_t)snprintf(b3, sizeof(b3), "{\"model\":\"m%d\",%s\"n\":%d}", round,
                                            pad, j);
                assert_int_equal(gw_body_scan(s, b3, n, 0), GW_SCAN_OK);
                assert_int_equal(gw_body_fact(s, GW_F_N)->i, j);
                shape_check_text(gw_body_fact(s, GW_F_MODEL)->s, round == 0   ? "m0"
                                                                 : round == 1 ? "m1"
                                                                              : "m2");
            }
        gw_shape_stats_t z = gw_body_scan_shape_stats();
        assert_int_equal(z.hits - a.hits, k == 4 ? 8 : 0);
    }
    gw_body_scan_free(s);
}

/* A body scanned twice more with shapes: each scan must hit (hit: true)
 * or miss, and give what the parse gives (scan_same.h), rc included. */
static void shape_esc_case(gw_body_scan_t *s, const char *b, size_t n, bool hit, gw_scan_rc_t want)
{
    gw_shape_stats_t a = gw_body_scan_shape_stats();
    gw_scan_rc_t rc = gw_body_scan(s, b, n, GW_SCAN_MSGS);
    if (rc != want)
        fail_msg("rc %d, not %d: %.*s", rc, want, (int)n, b);
    if (gw_body_scan_shape_stats().hits - a.hits != (hit ? 1u : 0u))
        fail_msg("%s expected: %.*s", hit ? "a hit" : "a miss", (int)n, b);
    const char *why = scan_same_shape1(b, n, GW_SCAN_MSGS);
    if (why)
        fail_msg("%s differs: %.*s", why, (int)n, b);
}

/* Escapes in the holes (JSTR): a body with escapes is kept, and a body of
 * its shape hits with each text decoded from its own bytes exactly as the
 * parse decodes it (a text left as the raw bytes, a stale decoded copy or
 * a decode of the learnt body fails here); plain bodies hit the escaped
 * shape and the other way round. Lone, reversed or unpaired surrogate
 * escapes, a bad escape and \u0000 miss and get the parse's answer (a
 * hole that let them through would answer OK where jansson refuses). A
 * role with an escape keeps no shape. */
static void test_shapes_escaped(void **state)
{
    (void)state;
    gw_body_scan_shapes_clear();
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    char b[512];
    size_t n = shape_body(b, sizeof(b), "chat-model",
                          "You are a helpful assistant.\\nAnswer in plain English.",
                          "Write one sentence about the sea.\\nUse the word \\\"tide\\\" and "
                          "caf\\u00e9.",
                          "64");
    shape_esc_case(s, b, n, false, GW_SCAN_OK); /* kept */
    shape_check_text(s->chat.msgs[0].content,
                     "You are a helpful assistant.\nAnswer in plain English.");

    /* other escapes, other lengths: a hit, each text decoded */
    static const struct {
        const char *model, *sys, *user, *want_model, *want_sys, *want_user;
    } hits[] = {
        {"m\\u002d2", "a\\tb", "\\ud83d\\ude00 x\\/y\\\\z", "m-2", "a\tb",
         "\xf0\x9f\x98\x80 x/y\\z"},
        {"plain", "no escape", "none either", "plain", "no escape", "none either"},
        {"m", "\\\"", "\\b\\f\\r\\n\\u00FF\\uFFFF", "m", "\"", "\b\f\r\n\xc3\xbf\xef\xbf\xbf"},
        {"", "", "\\uD7FF\\uE000\\u0001", "", "", "\xed\x9f\xbf\xee\x80\x80\x01"},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(hits); i++) {
        n = shape_body(b, sizeof(b), hits[i].model, hits[i].sys, hits[i].user, "7");
        shape_esc_case(s, b, n, true, GW_SCAN_OK);
        assert_int_equal(gw_body_scan(s, b, n, GW_SCAN_MSGS), GW_SCAN_OK);
        shape_check_text(gw_body_fact(s, GW_F_MODEL)->s, hits[i].want_model);
        shape_check_text(s->chat.msgs[0].content, hits[i].want_sys);
        shape_check_text(s->chat.msgs[1].content, hits[i].want_user);
        assert_int_equal(gw_body_fact(s, GW_F_MAX_TOKENS)->i, 7);
        assert_memory_equal(b + gw_body_fact(s, GW_F_MAX_TOKENS)->off, "7}", 2);
        /* a text without escapes is the body's bytes, one with a copy */
        const sl_text_t *u = &s->chat.msgs[1].content;
        bool in_body = u->p >= b && u->p < b + n;
        assert_int_equal(in_body, strchr(hits[i].user, '\\') == NULL);
    }

    /* many runs of escapes (the decoder's batches of 32) and one long run
     * (past its stack buffer), each between plain bytes */
    char big[2048], user[1536], want[1024];
    for (int k = 0; k < 2; k++) {
        size_t un = 0, wn = 0;
        for (int i = 0; i < (k ? 1 : 70); i++) {
            un += (size_t)sprintf(user + un, "w%d\\n", i);
            wn += (size_t)sprintf(want + wn, "w%d\n", i);
        }
        for (int i = 0; k && i < 150; i++) {
            un += (size_t)sprintf(user + un, i % 2 ? "\\u00e9" : "\\ud83d\\ude00");
            wn += (size_t)sprintf(want + wn, i % 2 ? "\xc3\xa9" : "\xf0\x9f\x98\x80");
        }
        un += (size_t)sprintf(user + un, "end");
        wn += (size_t)sprintf(want + wn, "end");
        n = shape_body(big, sizeof(big), "m", "s", user, "7");
        shape_esc_case(s, big, n, true, GW_SCAN_OK);
        assert_int_equal(gw_body_scan(s, big, n, GW_SCAN_MSGS), GW_SCAN_OK);
        shape_check_text(s->chat.msgs[1].content, want);
    }

    /* misses: the parse's verdict (SLOW: jansson decides and refuses) */
    static const struct {
        const char *user;
        gw_scan_rc_t rc;
    } miss[] = {
        {"x\\ud83d", GW_SCAN_SLOW},
        {"x\\ude00", GW_SCAN_SLOW},
        {"\\ude00\\ud83d", GW_SCAN_SLOW},
        {"\\ud83d\\u0041", GW_SCAN_SLOW},
        {"\\ud83d\\ud83d", GW_SCAN_SLOW},
        {"\\ud83dx\\ude00", GW_SCAN_SLOW},
        {"a\\x41", GW_SCAN_SLOW},
        {"a\\u00G9", GW_SCAN_SLOW},
        {"a\\u12", GW_SCAN_SLOW},
        {"a\\U0041", GW_SCAN_SLOW},
        {"a\\u0000b", GW_SCAN_OK},
        {"a\tb", GW_SCAN_SLOW},
        {"a\\", GW_SCAN_SLOW},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(miss); i++) {
        n = shape_body(b, sizeof(b), "m", "s", miss[i].user, "7");
        shape_esc_case(s, b, n, false, miss[i].rc);
    }

    /* a role with an escape: parsed right, and no shape kept from it */
    gw_body_scan_shapes_clear();
    n = (size_t)snprintf(b, sizeof(b),
                         "{\"model\":\"m\",\"messages\":[{\"role\":\"us\\u0065r\","
                         "\"content\":\"a\\nb\"}]}");
    shape_esc_case(s, b, n, false, GW_SCAN_OK);
    shape_check_text(s->chat.msgs[0].role, "user");
    shape_esc_case(s, b, n, false, GW_SCAN_OK);
    gw_body_scan_free(s);
}

/* A run of new shapes makes the thread back off (it tries one body in
 * 16); a run of one shape then hits again within 32 bodies, and every body
 * after the first hit hits. */
static void test_shapes_backoff(void **state)
{
    (void)state;
    gw_body_scan_shapes_clear();
    gw_body_scan_t *s = gw_body_scan_new();
    assert_non_null(s);
    char b[128];
    gw_shape_stats_t a0 = gw_body_scan_shape_stats();
    for (int i = 0; i < 20; i++) {
        size_t n = (size_t)snprintf(b, sizeof(b), "{\"model\":\"m\",\"k%03d\":1}", i);
        assert_int_equal(gw_body_scan(s, b, n, 0), GW_SCAN_OK);
    }
    gw_shape_stats_t a = gw_body_scan_shape_stats();
    assert_int_equal(a.hits - a0.hits, 0);
    assert_int_equal(a.misses - a0.misses, 20);
    int first = -1;
    for (int i = 0; i < 60; i++) {
        size_t n = (size_t)snprintf(b, sizeof(b), "{\"model\":\"m%d\",\"n\":%d}", i, i);
        assert_int_equal(gw_body_scan(s, b, n, 0), GW_SCAN_OK);
        assert_int_equal(gw_body_fact(s, GW_F_N)->i, i); /* tried or not, the right answer */
        gw_shape_stats_t z = gw_body_scan_shape_stats();
        if (first < 0 && z.hits > a.hits)
            first = i;
        if (first >= 0)
            assert_int_equal(z.hits - a.hits, (uint64_t)(i - first + 1));
    }
    assert_true(first > 0 && first <= 32);
    gw_body_scan_free(s);
}

/* The differential over every case of this file: with shapes against the
 * parse, the body and bodies made from it by changing values (scan_same.h). */
static void test_shapes_same(void **state)
{
    (void)state;
    size_t hits0 = gw_body_scan_shape_stats().hits;
    for (size_t i = 0; i < SL_ARRAY_LEN(acc_cases); i++) {
        const acc_case_t *c = &acc_cases[i];
        const char *why = scan_same_shape(c->body, c->len ? c->len : strlen(c->body));
        if (why)
            fail_msg("case %zu: %s differs on %s", i, why, c->body);
    }
    for (size_t i = 0; i < SL_ARRAY_LEN(policy_bodies); i++) {
        const char *why = scan_same_shape(policy_bodies[i], strlen(policy_bodies[i]));
        if (why)
            fail_msg("policy body %zu: %s differs on %s", i, why, policy_bodies[i]);
    }
    char b[512];
    size_t n = shape_body(b, sizeof(b), "chat-model", "You are a helpful assistant.",
                          "Write one sentence about the sea, please, in plain English.", "64");
    const char *why = scan_same_shape(b, n);
    if (why)
        fail_msg("#16's body: %s differs", why);
    /* the bodies made from a shape hit it, mostly */
    assert_true(gw_body_scan_shape_stats().hits - hits0 > 40);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_acceptance),
        cmocka_unit_test(test_byte_pass_every_offset),
        cmocka_unit_test(test_byte_pass_short_tails),
        cmocka_unit_test(test_handle_reuse),
        cmocka_unit_test(test_reset_leaves_fact_lines),
        cmocka_unit_test(test_many_keys_and_depth),
        cmocka_unit_test(test_facts),
        cmocka_unit_test(test_reset_forgets),
        cmocka_unit_test(test_bigint),
        cmocka_unit_test(test_splice_apply_buf),
        cmocka_unit_test(test_integer_bounds),
        cmocka_unit_test(test_key_forms),
        cmocka_unit_test(test_splices_every_position),
        cmocka_unit_test(test_splice_bytes),
        cmocka_unit_test(test_ratelimit_plain),
        cmocka_unit_test(test_filters_plain),
        cmocka_unit_test(test_clamp_in),
        cmocka_unit_test(test_skeleton_same),
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_shapes_escaped),
        cmocka_unit_test(test_shapes_backoff),
        cmocka_unit_test(test_shapes_same),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
