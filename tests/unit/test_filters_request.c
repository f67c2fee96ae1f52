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

/* max_chars on scanned messages (flt_request_check_chat): a string of no
 * more bytes than the limit is not counted (it cannot have more
 * characters), one with more bytes is, so multi-byte text within the limit
 * passes and one character over it does not; truncate edits instead. */
static void test_max_chars_scanned(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        flt_req_verdict_t reject, truncate;
    } cases[] = {
        {"abcde", FLT_REQ_OK, FLT_REQ_OK},
        {"abcdef", FLT_REQ_REJECT, FLT_REQ_EDIT},
        {"", FLT_REQ_OK, FLT_REQ_OK},
        {"\xe4\xb8\x80\xe4\xba\x8c\xe4\xb8\x89\xe5\x9b\x9b\xe4\xba\x94", FLT_REQ_OK, FLT_REQ_OK},
        {"\xe4\xb8\x80\xe4\xba\x8c\xe4\xb8\x89\xe5\x9b\x9b\xe4\xba\x94\xe5\x85\xad", FLT_REQ_REJECT,
         FLT_REQ_EDIT},
        {"ab\xf0\x9f\x98\x80"
         "de",
         FLT_REQ_OK, FLT_REQ_OK},
        {"ab\xf0\x9f\x98\x80"
         "def",
         FLT_REQ_REJECT, FLT_REQ_EDIT},
    };
    flt_ruleset_t *rej = rs_with(5, FLT_OVERFLOW_REJECT, 0, NULL, 0);
    flt_ruleset_t *cut = rs_with(5, FLT_OVERFLOW_TRUNCATE, 0, NULL, 0);
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        sl_chat_msg_t m[2] = {
            {.kind = SL_J_OBJECT,
             .role_kind = SL_J_STRING,
             .role = {"system", 6},
             .content_kind = SL_J_STRING,
             .content = {"a system text far over five", 27}},
            {.kind = SL_J_OBJECT,
             .role_kind = SL_J_STRING,
             .role = {"user", 4},
             .content_kind = SL_J_STRING,
             .content = {cases[i].text, strlen(cases[i].text)}},
        };
        sl_chat_t chat = {.messages_kind = SL_J_ARRAY, .msgs = m, .nmsgs = 2};
        flt_req_result_t r;
        if (flt_request_check_chat(rej, &chat, &r) != cases[i].reject)
            fail_msg("case %zu: reject mode", i);
        if (cases[i].reject == FLT_REQ_REJECT) {
            assert_string_equal(r.code, FLT_CODE_PROMPT_TOO_LONG);
            assert_string_equal(r.param, "messages[1].content");
        }
        if (flt_request_check_chat(cut, &chat, &r) != cases[i].truncate)
            fail_msg("case %zu: truncate mode", i);
    }
    flt_ruleset_unref(rej);
    flt_ruleset_unref(cut);
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

/* ---- text parts: the shortcut against the channel (branch arrparts) ------ */

/* The channel's verdict on the text parts of parts[0..n), fed one after
 * the other as chat_rules did before the shortcut (the reference): *hit
 * when it blocks, masks, logs or changes a byte. */
static flt_chan_rc_t parts_channel(const flt_ruleset_t *rs, const sl_chat_part_t *parts, size_t n,
                                   bool *hit)
{
    flt_chan_t ch;
    assert_int_equal(flt_chan_init(&ch, rs), 0);
    ch.unbounded = true;
    sl_buf_t out = {0};
    char joined[1024];
    size_t jn = 0;
    flt_chan_rc_t rc = FLT_CHAN_OK;
    for (size_t j = 0; j < n && rc == FLT_CHAN_OK; j++) {
        if (parts[j].type_kind != SL_J_STRING || !sl_text_is(parts[j].type, "text") ||
            parts[j].text_kind != SL_J_STRING)
            continue;
        rc = flt_chan_feed(&ch, parts[j].text.p, parts[j].text.len, &out);
        memcpy(joined + jn, parts[j].text.p, parts[j].text.len);
        jn += parts[j].text.len;
    }
    if (rc == FLT_CHAN_OK)
        rc = flt_chan_finish(&ch, &out);
    *hit = rc != FLT_CHAN_OK || ch.nmask || ch.nlog || ch.nlimit || out.len != jn ||
           memcmp(out.p ? out.p : "", joined, jn) != 0;
    flt_chan_fini(&ch);
    sl_buf_free(&out);
    return rc;
}

/* The message as JSON for flt_request_check (the tree path). */
static json_t *parts_tree(const sl_chat_part_t *parts, size_t n)
{
    json_t *c = json_array();
    for (size_t j = 0; j < n; j++) {
        json_t *p = json_object();
        json_object_set_new(p, "type", json_stringn(parts[j].type.p, parts[j].type.len));
        if (parts[j].text_kind == SL_J_STRING)
            json_object_set_new(p, "text", json_stringn(parts[j].text.p, parts[j].text.len));
        if (parts[j].image_url)
            json_object_set_new(p, "image_url", json_pack("{s:s}", "url", "https://x/y.png"));
        json_array_append_new(c, p);
    }
    return json_pack("{s:[{s:s,s:o}]}", "messages", "role", "user", "content", c);
}

/* flt_parts_clean and flt_request_check_chat's rules on content parts,
 * against the channel fed the text parts (and the tree path), on random
 * messages of 1-5 parts: text parts (some empty) and image_url parts
 * between them, texts from pieces that spell the words in halves across
 * two parts ("forb" "idden", "bad" "word", 敏 感 词 one a part), é and CJK
 * (the shortcut's non-ASCII steps), fullwidth forms and U+3000 (folding:
 * never clean), a phone number in two parts. Clean must be exactly "the
 * channel finds nothing and changes nothing" where folding leaves the
 * joined text as it is, and never true where it finds something. Judging
 * each part alone shows as a clean message the channel masks or blocks
 * (a word split across parts), no shortcut for parts as too few clean. */
static void test_parts_clean_as_channel(void **state)
{
    (void)state;
    static const char *const piece[] = {
        "x",
        " ",
        "bad",
        "word",
        "badword",
        "BAD",
        "forb",
        "idden",
        "敏",
        "感",
        "词",
        "\xc3\xa9",
        "caf",
        "tide",
        "ti",
        "de",
        "13812",
        "345678",
        "1",
        "3",
        "\xe4\xb8\xad",
        "ev",
        "il",
        "\xc2\xa0",
        "\xef\xbd\x82",
        "\xe3\x80\x80",
        "\xf0\x9f\x8c\x8a",
    };
    tf_list_t l[3] = {{"badword\n敏感词\ncaf\xc3\xa9\n", FLT_ACTION_MASK, "masked"},
                      {"forbidden\nevil\n", FLT_ACTION_BLOCK, "blocked"},
                      {"tide\n", FLT_ACTION_LOG, "logged"}};
    flt_conf_regex_t re[] = {{"phone", "1[3-9]\\d{9}", FLT_ACTION_MASK}};
    char err[256] = "";
    flt_ruleset_t *rs = tf_build(l, 3, re, 1, NULL, err, sizeof err);
    if (!rs)
        fail_msg("build: %s", err);
    static const char *const halves[][2] = {
        {"forb", "idden"}, {"bad", "word"},     {"BadW", "ord"},  {"敏", "感词"},
        {"敏感", "词"},    {"1381", "2345678"}, {"ti", "de"},     {"caf", "\xc3\xa9"},
        {"e", "vil"},      {"ｂａｄ", "word"},  {"bad", "wor d"}, {"138123", "4567"},
    };
    const char *carry = "";
    unsigned seed = 5, clean = 0, hit = 0, split = 0, folded = 0, multi = 0;
    char text[5][80];
    for (int round = 0; round < 20000; round++) {
        sl_chat_part_t parts[5];
        carry = "";
        size_t n = 1 + (size_t)rand_r(&seed) % 5, ntext = 0;
        bool each_clean = true, same = true;
        char joined[400];
        size_t jn = 0;
        for (size_t j = 0; j < n; j++) {
            memset(&parts[j], 0, sizeof parts[j]);
            parts[j].kind = SL_J_OBJECT;
            parts[j].type_kind = SL_J_STRING;
            if (rand_r(&seed) % 4 == 0) {
                parts[j].type = (sl_text_t){"image_url", 9};
                parts[j].image_url = true;
                continue;
            }
            size_t tn = strlen(carry), want = tn + (size_t)rand_r(&seed) % 24;
            memcpy(text[j], carry, tn);
            carry = "";
            while (tn < want) {
                const char *p =
                    rand_r(&seed) % 3 ? "x" : piece[rand_r(&seed) % SL_ARRAY_LEN(piece)];
                size_t pn = strlen(p);
                if (tn + pn > want)
                    break;
                memcpy(text[j] + tn, p, pn);
                tn += pn;
            }
            if (rand_r(&seed) % 3 == 0) { /* a word's first half here, the rest next */
                const char *const *w = halves[rand_r(&seed) % SL_ARRAY_LEN(halves)];
                memcpy(text[j] + tn, w[0], strlen(w[0]));
                tn += strlen(w[0]);
                carry = w[1];
            }
            parts[j].type = (sl_text_t){"text", 4};
            parts[j].text_kind = SL_J_STRING;
            parts[j].text = (sl_text_t){text[j], tn};
            each_clean = each_clean && flt_text_clean(rs, text[j], tn);
            memcpy(joined + jn, text[j], tn);
            jn += tn;
            ntext++;
        }
        bool c = flt_parts_clean(rs, parts, n), ch_hit;
        flt_chan_rc_t rc = parts_channel(rs, parts, n, &ch_hit);
        same = !ch_hit;
        if (c && !same)
            fail_msg("round %d: clean, but the channel finds a hit in %.*s", round, (int)jn,
                     joined);
        if (!flt_fold_same(joined, jn)) {
            assert_false(c);
            folded++;
        } else if (!c && same) {
            fail_msg("round %d: the channel finds nothing, but not clean: %.*s", round, (int)jn,
                     joined);
        }
        c ? clean++ : !same ? hit++ : 0;
        split += !same && each_clean; /* only the joined text has the hit */
        multi += ntext > 1 && c;
        /* the request check over the scanned message against the tree's */
        sl_chat_msg_t m = {.kind = SL_J_OBJECT,
                           .role_kind = SL_J_STRING,
                           .role = {"user", 4},
                           .content_kind = SL_J_ARRAY,
                           .part0 = 0,
                           .nparts = n};
        sl_chat_t chat = {.messages_kind = SL_J_ARRAY, .msgs = &m, .nmsgs = 1, .parts = parts};
        flt_req_result_t rc_chat, rc_tree;
        flt_req_verdict_t vc = flt_request_check_chat(rs, &chat, &rc_chat);
        json_t *body = parts_tree(parts, n);
        flt_req_verdict_t vt = flt_request_check(rs, body, &rc_tree);
        json_decref(body);
        if (vt == FLT_REQ_REJECT) {
            assert_int_equal(vc, FLT_REQ_REJECT);
            assert_int_equal(rc, FLT_CHAN_BLOCK);
            assert_string_equal(rc_chat.code, rc_tree.code);
            assert_string_equal(rc_chat.rule, rc_tree.rule);
            assert_string_equal(rc_chat.param, "messages[0].content");
        } else {
            assert_int_equal(vt, FLT_REQ_OK);
            assert_int_equal(vc, rc_tree.modified ? FLT_REQ_EDIT : FLT_REQ_OK);
            assert_int_equal(rc_chat.logged, rc_tree.logged);
            if (c)
                assert_false(rc_tree.modified || rc_tree.logged);
        }
    }
    /* every kind of case came up often enough to mean something */
    if (!(clean > 3000 && hit > 3000 && split > 1000 && folded > 1000 && multi > 1000))
        fail_msg("clean %u hit %u split %u folded %u multi %u", clean, hit, split, folded, multi);
    flt_ruleset_unref(rs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shape_errors),           cmocka_unit_test(test_max_chars_edges),
        cmocka_unit_test(test_max_chars_scanned),      cmocka_unit_test(test_keep_turns),
        cmocka_unit_test(test_system_prompt),          cmocka_unit_test(test_rules_on_decoded_text),
        cmocka_unit_test(test_config_errors),          cmocka_unit_test(test_slot_swap),
        cmocka_unit_test(test_parts_clean_as_channel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
