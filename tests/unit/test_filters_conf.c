/* The filters: section end to end: YAML through the conf loader into a
 * ruleset (flt_ruleset_new), with the example word list; the conf's own
 * checks (duplicate names, enums, bounds) and the ruleset's (bad pattern). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "conf/conf.h"
#include "filters/flt_internal.h"

#define LISTEN "listen:\n  - address: 127.0.0.1:8080\n"

static conf_t *load(const char *yaml, char *err, size_t errlen)
{
    return conf_load_string(yaml, strlen(yaml), "t.yaml", err, errlen);
}

static void test_defaults(void **state)
{
    (void)state;
    char err[512];
    conf_t *c = load(LISTEN, err, sizeof err);
    if (!c)
        fail_msg("%s", err);
    const conf_filters_t *f = &c->filters;
    assert_int_equal(f->input.max_chars, 8000);
    assert_int_equal(f->input.keep_turns, 10);
    assert_int_equal(f->input.on_overflow, FLT_OVERFLOW_REJECT);
    assert_null(f->input.system_prompt);
    assert_string_equal(f->mask, "***");
    assert_true(f->output);
    assert_int_equal(f->holdback_max, 4096);
    assert_int_equal(f->regex_limits.heap_bytes, 4 << 20);
    flt_ruleset_t *rs = flt_ruleset_new(f, err, sizeof err);
    assert_non_null(rs);
    assert_false(flt_ruleset_filters_output(rs)); /* no rules: nothing to do on answers */
    flt_ruleset_unref(rs);
    conf_free(c);
}

static void test_full_section(void **state)
{
    (void)state;
    char err[512];
    conf_t *c =
        load(LISTEN "filters:\n"
                    "  input: { max_chars: 100, on_overflow: truncate, keep_turns: 3,\n"
                    "           system_prompt: \"Be kind.\", system_prompt_mode: replace }\n"
                    "  words:\n"
                    "    - { file: conf/words/example.txt, action: block }\n"
                    "    - { file: conf/words/example.txt, action: log, name: again }\n"
                    "  regex: [ { name: cn_mobile, pattern: '1[3-9]\\d{9}', action: mask } ]\n"
                    "  mask: \"[x]\"\n"
                    "  output: true\n"
                    "  regex_limits: { match: 5000, depth: 100, heap: 1m, on_limit: nomatch }\n"
                    "  holdback_max: 8k\n",
             err, sizeof err);
    if (!c)
        fail_msg("%s", err);
    const conf_filters_t *f = &c->filters;
    assert_int_equal(f->nwords, 2);
    assert_int_equal(f->words[0].action, CONF_FILTER_BLOCK);
    assert_null(f->words[0].name);
    assert_string_equal(f->words[1].name, "again");
    assert_int_equal(f->nregex, 1);
    assert_int_equal(f->regex_limits.on_limit, FLT_ON_LIMIT_NOMATCH);
    flt_ruleset_t *rs = flt_ruleset_new(f, err, sizeof err);
    if (!rs)
        fail_msg("%s", err);
    assert_true(flt_ruleset_filters_output(rs));
    assert_int_equal(flt_ruleset_word_count(rs), 5);
    assert_int_equal(flt_ruleset_regex_count(rs), 1);
    assert_string_equal(rs->rules[0].name, "example"); /* from the file name */
    assert_int_equal(rs->holdback_max, 8192);
    /* the block list wins over the log list for the same words */
    sl_buf_t out = {0};
    const char *fw = "a ＰＬＡＣＥＨＯＬＤＥＲ b";
    assert_int_equal(flt_text_filter(rs, fw, strlen(fw), &out), FLT_CHAN_BLOCK);
    out.len = 0;
    assert_int_equal(flt_text_filter(rs, "call 13912345678", 16, &out), FLT_CHAN_OK);
    assert_string_equal(out.p, "call [x]");
    sl_buf_free(&out);
    /* request side from conf: system prompt replaces, keep_turns applies */
    json_t *b = json_loads("{\"messages\":[{\"role\":\"system\",\"content\":\"x\"},"
                           "{\"role\":\"user\",\"content\":\"hi\"}]}",
                           0, NULL);
    flt_req_result_t res;
    assert_int_equal(flt_request_check(rs, b, &res), FLT_REQ_OK);
    assert_int_equal(json_array_size(json_object_get(b, "messages")), 2);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(b, "messages"), 0), "content")),
                        "Be kind.");
    json_decref(b);
    flt_ruleset_unref(rs);
    conf_free(c);
}

static void test_errors(void **state)
{
    (void)state;
    char err[512];
    static const struct {
        const char *yaml, *want;
    } cases[] = {
        {LISTEN "filters:\n  regex: [ { name: a, pattern: x }, { name: a, pattern: y } ]\n",
         "duplicate name"},
        {LISTEN "filters:\n  words: [ { file: f.txt, action: shout } ]\n", "action"},
        {LISTEN "filters:\n  input: { max_chars: -1 }\n", "max_chars"},
        {LISTEN "filters:\n  holdback_max: 10\n", "holdback_max"},
        {LISTEN "filters:\n  regex: [ { pattern: x } ]\n", "name"},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        conf_t *c = load(cases[i].yaml, err, sizeof err);
        if (c)
            fail_msg("case %zu loaded", i);
        if (!strstr(err, cases[i].want))
            fail_msg("case %zu: %s", i, err);
    }
    /* the conf cannot compile patterns; the ruleset build says where */
    conf_t *c =
        load(LISTEN "filters:\n  regex: [ { name: bad, pattern: 'a(' } ]\n", err, sizeof err);
    assert_non_null(c);
    assert_null(flt_ruleset_new(&c->filters, err, sizeof err));
    assert_non_null(strstr(err, "filters.regex[0] (bad): pattern:"));
    conf_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_full_section),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
