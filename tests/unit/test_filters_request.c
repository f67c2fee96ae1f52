/* Unit tests of the request side: shape errors and their codes, max_chars
 * edges in code points (reject and truncate), keep_turns keeping system
 * messages, the system prompt prepended or replacing, rules on decoded text
 * (\u escapes caught), masks in place, the error body, and the reload slot. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "filters/flt_internal.h"
#include "test_filters_util.h"

static flt_conf_input_t input;

static void tweak_input(flt_conf_t *c)
{
    c->input = input;
}

static flt_ruleset_t *rs_with(int64_t max_chars, int overflow, int64_t keep, const char *sys,
                              int mode)
{
    input = (flt_conf_input_t){max_chars, overflow, keep, sys, mode};
    tf_list_t l[2] = {{"badword\n敏感词\n", FLT_ACTION_MASK, "masked"},
                      {"forbidden\n", FLT_ACTION_BLOCK, "blocked"}};
    flt_conf_regex_t re[] = {{"phone", "1[3-9]\\d{9}", FLT_ACTION_MASK}};
    char err[256] = "";
    flt_ruleset_t *rs = tf_build(l, 2, re, 1, tweak_input, err, sizeof err);
    if (!rs)
        fail_msg("build: %s", err);
    return rs;
}

static json_t *parse(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    if (!j)
        fail_msg("bad test json: %s", e.text);
    return j;
}

static flt_req_verdict_t check(const flt_ruleset_t *rs, const char *body, flt_req_result_t *res,
                               json_t **out)
{
    json_t *j = parse(body);
    flt_req_verdict_t v = flt_request_check(rs, j, res);
    if (out)
        *out = j;
    else
        json_decref(j);
    return v;
}

static const char *msg_content(json_t *body, size_t i)
{
    return json_string_value(
        json_object_get(json_array_get(json_object_get(body, "messages"), i), "content"));
}

static const char *msg_role(json_t *body, size_t i)
{
    return json_string_value(
        json_object_get(json_array_get(json_object_get(body, "messages"), i), "role"));
}

static void test_shape_errors(void **state)
{
    (void)state;
    flt_req_result_t r;
    static const struct {
        const char *body, *code, *param;
    } cases[] = {
        {"[1,2]", FLT_CODE_INVALID_BODY, "body"},
        {"{}", FLT_CODE_INVALID_MESSAGES, "messages"},
        {"{\"messages\":{}}", FLT_CODE_INVALID_MESSAGES, "messages"},
        {"{\"messages\":[]}", FLT_CODE_INVALID_MESSAGES, "messages"},
        {"{\"messages\":[1]}", FLT_CODE_INVALID_MESSAGE, "messages[0]"},
        {"{\"messages\":[{\"content\":\"x\"}]}", FLT_CODE_INVALID_MESSAGE, "messages[0].role"},
        {"{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", FLT_CODE_INVALID_MESSAGE,
         "messages[0].role"},
        {"{\"messages\":[{\"role\":\"user\"}]}", FLT_CODE_INVALID_MESSAGE, "messages[0].content"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":5}]}", FLT_CODE_INVALID_MESSAGE,
         "messages[0].content"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"ok\"},{\"role\":\"user\",\"content\":[{"
         "\"text\":\"no type\"}]}]}",
         FLT_CODE_INVALID_MESSAGE, "messages[1].content[0]"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":3}]}]}",
         FLT_CODE_INVALID_MESSAGE, "messages[0].content[0]"},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        assert_int_equal(check(NULL, cases[i].body, &r, NULL), FLT_REQ_REJECT);
        assert_int_equal(r.status, 400);
        assert_string_equal(r.code, cases[i].code);
        assert_string_equal(r.param, cases[i].param);
    }
    /* valid shapes: assistant with tool calls and no content, image parts */
    assert_int_equal(
        check(NULL,
              "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
              "\"text\":\"hi\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]"
              "},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]},{"
              "\"role\":\"tool\",\"content\":\"r\"}]}",
              &r, NULL),
        FLT_REQ_OK);
    assert_int_equal(r.status, 0);
    assert_false(r.modified);
}

static void test_max_chars_edges(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_with(5, FLT_OVERFLOW_REJECT, 0, NULL, 0);
    flt_req_result_t r;
    /* five code points of three bytes each: 15 bytes, still at the limit */
    assert_int_equal(
        check(rs, "{\"messages\":[{\"role\":\"user\",\"content\":\"一二三四五\"}]}", &r, NULL),
        FLT_REQ_OK);
    assert_int_equal(
        check(rs, "{\"messages\":[{\"role\":\"user\",\"content\":\"一二三四五六\"}]}", &r, NULL),
        FLT_REQ_REJECT);
    assert_string_equal(r.code, FLT_CODE_PROMPT_TOO_LONG);
    assert_string_equal(r.param, "messages[0].content");
    /* a 4-byte emoji counts once; parts are added up */
    assert_int_equal(check(rs,
                           "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                           "\"text\":\"ab\"},{\"type\":\"text\",\"text\":\"c\\ud83d\\ude00e\"}]}]}",
                           &r, NULL),
                     FLT_REQ_OK);
    /* only user content counts */
    assert_int_equal(
        check(rs, "{\"messages\":[{\"role\":\"system\",\"content\":\"long system text\"}]}", &r,
              NULL),
        FLT_REQ_OK);
    flt_ruleset_unref(rs);

    rs = rs_with(5, FLT_OVERFLOW_TRUNCATE, 0, NULL, 0);
    json_t *b;
    assert_int_equal(
        check(rs, "{\"messages\":[{\"role\":\"user\",\"content\":\"一二三四五六七\"}]}", &r, &b),
        FLT_REQ_OK);
    assert_true(r.modified);
    assert_int_equal(r.truncated, 1);
    assert_string_equal(msg_content(b, 0), "一二三四五");
    json_decref(b);
    assert_int_equal(check(rs,
                           "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                           "\"text\":\"abc\"},{\"type\":\"text\",\"text\":\"d\\ud83d\\ude00fg\"},{"
                           "\"type\":\"text\",\"text\":\"tail\"}]}]}",
                           &r, &b),
                     FLT_REQ_OK);
    json_t *parts = json_object_get(json_array_get(json_object_get(b, "messages"), 0), "content");
    assert_string_equal(json_string_value(json_object_get(json_array_get(parts, 0), "text")),
                        "abc");
    assert_string_equal(json_string_value(json_object_get(json_array_get(parts, 1), "text")),
                        "d\xF0\x9F\x98\x80");
    assert_string_equal(json_string_value(json_object_get(json_array_get(parts, 2), "text")), "");
    json_decref(b);
    flt_ruleset_unref(rs);
}

static void test_keep_turns(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_with(0, 0, 2, NULL, 0);
    flt_req_result_t r;
    json_t *b;
    assert_int_equal(check(rs,
                           "{\"messages\":["
                           "{\"role\":\"system\",\"content\":\"S1\"},"
                           "{\"role\":\"user\",\"content\":\"u1\"},"
                           "{\"role\":\"assistant\",\"content\":\"a1\"},"
                           "{\"role\":\"developer\",\"content\":\"D\"},"
                           "{\"role\":\"user\",\"content\":\"u2\"},"
                           "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]},"
                           "{\"role\":\"tool\",\"content\":\"t2\"},"
                           "{\"role\":\"user\",\"content\":\"u3\"}]}",
                           &r, &b),
                     FLT_REQ_OK);
    assert_int_equal(r.dropped, 2);
    assert_true(r.modified);
    const char *want[] = {"S1", "D", "u2", NULL, "t2", "u3"};
    assert_int_equal(json_array_size(json_object_get(b, "messages")), 6);
    for (size_t i = 0; i < 6; i++) {
        if (want[i])
            assert_string_equal(msg_content(b, i), want[i]);
        else
            assert_string_equal(msg_role(b, i), "assistant");
    }
    json_decref(b);
    /* exactly keep_turns user turns: nothing dropped */
    assert_int_equal(check(rs,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"u1\"},"
                           "{\"role\":\"user\",\"content\":\"u2\"}]}",
                           &r, NULL),
                     FLT_REQ_OK);
    assert_int_equal(r.dropped, 0);
    assert_false(r.modified);
    flt_ruleset_unref(rs);
}

static void test_system_prompt(void **state)
{
    (void)state;
    const char *body = "{\"messages\":[{\"role\":\"system\",\"content\":\"client sys\"},"
                       "{\"role\":\"user\",\"content\":\"hi\"}]}";
    flt_req_result_t r;
    json_t *b;
    flt_ruleset_t *rs = rs_with(0, 0, 0, "Be nice.", FLT_SYSPROMPT_PREPEND);
    assert_int_equal(check(rs, body, &r, &b), FLT_REQ_OK);
    assert_true(r.modified);
    assert_int_equal(json_array_size(json_object_get(b, "messages")), 3);
    assert_string_equal(msg_role(b, 0), "system");
    assert_string_equal(msg_content(b, 0), "Be nice.");
    assert_string_equal(msg_content(b, 1), "client sys");
    json_decref(b);
    flt_ruleset_unref(rs);

    rs = rs_with(0, 0, 0, "Be nice.", FLT_SYSPROMPT_REPLACE);
    assert_int_equal(check(rs, body, &r, &b), FLT_REQ_OK);
    assert_int_equal(json_array_size(json_object_get(b, "messages")), 2);
    assert_string_equal(msg_content(b, 0), "Be nice.");
    assert_string_equal(msg_content(b, 1), "hi");
    json_decref(b);
    flt_ruleset_unref(rs);
}

static void test_rules_on_decoded_text(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_with(0, 0, 0, NULL, 0);
    flt_req_result_t r;
    json_t *b;
    /* "forbidden" spelled with \u escapes is still "forbidden" */
    assert_int_equal(check(rs,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"a "
                           "\\u0066orbi\\u0064\\u0064en b\"}]}",
                           &r, NULL),
                     FLT_REQ_REJECT);
    assert_string_equal(r.code, FLT_CODE_CONTENT_FILTER);
    assert_string_equal(r.rule, "blocked");
    assert_string_equal(r.param, "messages[0].content");
    size_t n;
    char *eb = flt_error_body(&r, &n);
    assert_non_null(eb);
    assert_int_equal(strlen(eb), n);
    json_t *e = parse(eb);
    json_t *err = json_object_get(e, "error");
    assert_string_equal(json_string_value(json_object_get(err, "code")), "content_filter");
    assert_string_equal(json_string_value(json_object_get(err, "type")), "invalid_request_error");
    assert_null(strstr(eb, "forbidden")); /* never echo the matched text */
    json_decref(e);
    free(eb);
    /* Chinese word escaped, masked in place; a word split over text parts */
    assert_int_equal(check(rs,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"x\\u654f\\u611f\\u8bcd "
                           "13912345678\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                           "\"text\":\"a bad\"},{\"type\":\"text\",\"text\":\"word b\"}]}]}",
                           &r, &b),
                     FLT_REQ_OK);
    assert_true(r.modified);
    assert_int_equal(r.masked, 3);
    assert_string_equal(msg_content(b, 0), "x*** ***");
    json_t *parts = json_object_get(json_array_get(json_object_get(b, "messages"), 1), "content");
    char joined[64];
    snprintf(joined, sizeof joined, "%s%s",
             json_string_value(json_object_get(json_array_get(parts, 0), "text")),
             json_string_value(json_object_get(json_array_get(parts, 1), "text")));
    assert_string_equal(joined, "a *** b");
    json_decref(b);
    /* a block word split over two parts is caught too */
    assert_int_equal(check(rs,
                           "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                           "\"text\":\"forb\"},{\"type\":\"text\",\"text\":\"idden\"}]}]}",
                           &r, NULL),
                     FLT_REQ_REJECT);
    /* clean text: untouched */
    assert_int_equal(
        check(rs, "{\"messages\":[{\"role\":\"user\",\"content\":\"good day\"}]}", &r, NULL),
        FLT_REQ_OK);
    assert_false(r.modified);
    flt_ruleset_unref(rs);
}

static void test_config_errors(void **state)
{
    (void)state;
    char err[256];
    tf_list_t bad_utf8[] = {{"ok\n\xC3\x28\n", FLT_ACTION_MASK, NULL}};
    assert_null(tf_build(bad_utf8, 1, NULL, 0, NULL, err, sizeof err));
    assert_non_null(strstr(err, ":2: invalid UTF-8"));
    flt_conf_regex_t empty[] = {{"e", "a*", FLT_ACTION_MASK}};
    assert_null(tf_build(NULL, 0, empty, 1, NULL, err, sizeof err));
    assert_non_null(strstr(err, "empty string"));
    flt_conf_regex_t broken[] = {{"b", "a(", FLT_ACTION_MASK}};
    assert_null(tf_build(NULL, 0, broken, 1, NULL, err, sizeof err));
    assert_non_null(strstr(err, "filters.regex[0] (b): pattern:"));
    flt_conf_regex_t dup[] = {{"d", "x", FLT_ACTION_MASK}, {"d", "y", FLT_ACTION_LOG}};
    assert_null(tf_build(NULL, 0, dup, 2, NULL, err, sizeof err));
    assert_non_null(strstr(err, "used twice"));
    flt_conf_t c;
    flt_conf_defaults(&c);
    flt_conf_words_t w = {"/nonexistent/words.txt", FLT_ACTION_MASK, NULL};
    c.words = &w;
    c.nwords = 1;
    assert_null(flt_ruleset_build(&c, err, sizeof err));
    assert_non_null(strstr(err, "filters.words[0]: /nonexistent/words.txt:"));
}

static void test_slot_swap(void **state)
{
    (void)state;
    flt_ruleset_t *a = rs_with(0, 0, 0, NULL, 0);
    flt_ruleset_t *b = rs_with(0, 0, 0, NULL, 0);
    flt_slot_t *slot = flt_slot_new(a);
    flt_ruleset_t *held = flt_slot_acquire(slot);
    assert_ptr_equal(held, a);
    /* a request in flight keeps the old ruleset after the swap */
    flt_stream_t *st = flt_stream_new(held);
    flt_slot_swap(slot, b);
    flt_ruleset_t *now = flt_slot_acquire(slot);
    assert_ptr_equal(now, b);
    assert_int_equal(atomic_load(&a->refs), 2); /* held + the stream */
    flt_out_t out = {0};
    const char *d = "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a badword\"}}]}";
    assert_int_equal(flt_stream_event(st, d, strlen(d), &out), FLT_EV_REPLACE);
    flt_out_release(&out);
    flt_stream_free(st);
    flt_ruleset_unref(held); /* frees a (ASan would see a leak or a double free) */
    flt_ruleset_unref(now);
    flt_slot_free(slot);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shape_errors),
        cmocka_unit_test(test_max_chars_edges),
        cmocka_unit_test(test_keep_turns),
        cmocka_unit_test(test_system_prompt),
        cmocka_unit_test(test_rules_on_decoded_text),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_slot_swap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
