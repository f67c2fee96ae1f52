/* Unit tests of the output rules on a whole answer read as bytes
 * (filters/answer.c): for every answer of a table, the bytes path gives
 * the same JSON as the tree path (flt_response_filter), or hands the
 * answer to the tree exactly where it must (not JSON, duplicate keys, odd
 * types, text jansson refuses); unchanged bytes stay the upstream's; a hit
 * is counted once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "filters/flt_internal.h"
#include "test_filters_util.h"

static flt_ruleset_t *rs_build(void)
{
    tf_list_t l[2] = {{"badword\n敏感词\n", FLT_ACTION_MASK, "masked"},
                      {"evil\n", FLT_ACTION_BLOCK, "blocked"}};
    flt_conf_regex_t re[] = {{"phone", "1[3-9]\\d{9}", FLT_ACTION_MASK}};
    char err[256] = "";
    flt_ruleset_t *rs = tf_build(l, 2, re, 1, NULL, err, sizeof err);
    if (!rs)
        fail_msg("build: %s", err);
    return rs;
}

/* The tree path's result for an answer, as compact JSON (malloc'd), and
 * whether it changed anything. */
static char *tree_result(flt_ruleset_t *rs, const char *ans, bool *mod)
{
    json_t *j = json_loadb(ans, strlen(ans), 0, NULL);
    assert_non_null(j);
    *mod = false;
    assert_int_equal(flt_response_filter(rs, j, mod), 0);
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

static void assert_json_same(const char *a, size_t alen, const char *b)
{
    json_t *ja = json_loadb(a, alen, 0, NULL), *jb = json_loads(b, 0, NULL);
    if (!ja || !jb || !json_equal(ja, jb))
        fail_msg("differ:\n  bytes: %.*s\n  tree:  %s", (int)alen, a, b);
    json_decref(ja);
    json_decref(jb);
}

#define CH(content, rest)                                                                          \
    "{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":" content "}" rest "}"

/* Answers the bytes path reads itself: same JSON as the tree's. */
static const char *const same_as_tree[] = {
    "{\"id\":\"x\",\"choices\":[" CH("\"The sea is calm.\"", ",\"finish_reason\":\"stop\"") "]}",
    "{\"id\":\"x\",\"choices\":[" CH("\"a BADWORD b\"", ",\"finish_reason\":\"stop\"") "]}",
    "{\"choices\":[" CH("\"so evil\"", ",\"finish_reason\":\"stop\"") "]}",
    /* block without a finish_reason: one is added */
    "{\"choices\":[" CH("\"so evil\"", "") "]}",
    /* finish_reason before the message, null */
    "{\"choices\":[{\"finish_reason\":null,\"index\":0,\"message\":{\"content\":\"evil\"}}]}",
    /* logprobs: an object, an array, null; changed text makes it null */
    "{\"choices\":[" CH("\"badword\"",
                        ",\"logprobs\":{\"content\":[{\"t\":\"badword\",\"p\":[1,2]}]},"
                        "\"finish_reason\":\"stop\"") "]}",
    "{\"choices\":[" CH("\"evil\"", ",\"logprobs\":[1,{\"a\":[]}],\"finish_reason\":\"stop\"") "]}",
    "{\"choices\":[" CH("\"badword\"", ",\"logprobs\":null") "]}",
    "{\"choices\":[" CH("\"fine\"", ",\"logprobs\":{\"x\":1}") "]}",
    /* escapes: decoded for the rules, encoded again in the splice */
    "{\"choices\":[" CH("\"line\\nBAD\\u0057ORD \\\"q\\\" \\u00e9 \\/\"", "") "]}",
    "{\"choices\":[" CH("\"call 13812345678 now\"", "") "]}",
    "{\"choices\":[" CH("\"这是敏感词吗\"", "") "]}",
    "{\"choices\":[" CH("\"ｂａｄｗｏｒｄ\"", "") "]}",
    /* several choices, some odd ones skipped */
    "{\"choices\":[" CH("\"badword\"", "") ",1,null,{\"message\":\"x\"},{\"message\":{\"content\":["
                                           "\"evil\"]}}," CH("\"evil\"",
                                                             ",\"finish_reason\":\"s\"") "]}",
    /* more choices than the reader keeps inline, texts read in place and
     * decoded (escapes) side by side */
    "{\"choices\":[" CH("\"fine\"", "") "," CH("\"bad\\u0077ord\"", "") "," CH(
        "\"so evil\"", "") "," CH("\"ok \\\"evil\\\"\"", "") "," CH("\"calm\"", "") "]}",
    "{\"choices\":[]}",
    "{\"choices\":{\"message\":{\"content\":\"evil\"}}}",
    "{\"object\":\"list\",\"data\":[{\"content\":\"evil\"}]}",
    "{\"choices\":[{\"message\":{\"content\":null}}]}",
    /* blanks anywhere */
    "{ \"choices\" : [ { \"message\" : { \"content\" :\t\"badword\" } ,\n \"logprobs\" : "
    "[ ] , \"finish_reason\" : \"stop\" } ] }",
    /* the mask may meet the key order of a big answer */
    "{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion\",\"created\":1700000000,\"model\":"
    "\"m\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"The sea is "
    "vast and so calm.\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":31,"
    "\"completion_tokens\":9,\"total_tokens\":40,\"x\":1.5e3,\"y\":true,\"z\":[-1,0.25]}}",
};

static void test_same_as_tree(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_build();
    for (size_t i = 0; i < SL_ARRAY_LEN(same_as_tree); i++) {
        const char *ans = same_as_tree[i];
        bool mod;
        char *want = tree_result(rs, ans, &mod);
        char *out = NULL;
        size_t olen = 0;
        flt_ans_rc_t rc = flt_response_filter_bytes(rs, ans, strlen(ans), &out, &olen);
        if (rc != (mod ? FLT_ANS_EDITED : FLT_ANS_SAME))
            fail_msg("answer %zu: rc %d, tree modified %d: %s", i, rc, mod, ans);
        if (mod) {
            assert_non_null(out);
            assert_int_equal(strlen(out), olen);
            assert_json_same(out, olen, want);
        } else {
            assert_null(out);
        }
        free(out);
        free(want);
    }
    flt_ruleset_unref(rs);
}

/* Answers left to the tree path, before any rule ran. */
static const char *const to_tree[] = {
    "evil",
    "not json, evil",
    "{\"choices\":[" CH("\"evil\"", "") "]} trailing",
    "[{\"choices\":[]},\"evil\"]",
    "\"evil\"",
    "{\"choices\":[],\"choices\":[" CH("\"evil\"", "") "]}",
    "{\"choices\":[{\"message\":{\"content\":\"ok\",\"content\":\"evil\"}}]}",
    "{\"choices\":[{\"message\":{\"content\":\"evil\"},\"message\":{\"content\":\"ok\"}}]}",
    "{\"choices\":[{\"message\":{\"content\":\"evil\"},\"finish_reason\":1}]}",
    "{\"choices\":[{\"message\":{\"content\":\"evil\"},\"finish_reason\":{}}]}",
    "{\"choices\":[{\"message\":{\"content\":\"evil\"},\"logprobs\":0.5}]}",
    "{\"choices\":[{\"message\":{\"content\":\"evil\\u0000\"}}]}",
    "{\"choices\":[{\"message\":{\"content\":\"evil \\ud800\"}}]}",
    "{\"choices\":[{\"message\":{\"content\":\"evil\"}}],\"n\":1e999}",
};

static void test_to_tree(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_build();
    for (size_t i = 0; i < SL_ARRAY_LEN(to_tree); i++) {
        char *out = NULL;
        size_t olen = 0;
        flt_ans_rc_t rc =
            flt_response_filter_bytes(rs, to_tree[i], strlen(to_tree[i]), &out, &olen);
        if (rc != FLT_ANS_TREE)
            fail_msg("answer %zu: rc %d, want the tree: %s", i, rc, to_tree[i]);
        assert_null(out);
    }
    /* invalid UTF-8 in the text (yajl may pass what jansson refuses) */
    const char bad[] = "{\"choices\":[{\"message\":{\"content\":\"evil \xC0\xAF\"}}]}";
    char *out = NULL;
    size_t olen = 0;
    flt_ans_rc_t rc = flt_response_filter_bytes(rs, bad, sizeof bad - 1, &out, &olen);
    assert_true(rc == FLT_ANS_TREE);
    assert_null(out);
    flt_ruleset_unref(rs);
}

/* Answers with no candidate anywhere (flt_json_strings_clean): relayed as
 * they came without being read, whatever their shape; and answers where a
 * candidate sits where only the reader can judge it. */
static const char *const no_candidate[] = {
    "",
    "not json",
    "[{\"choices\":[]}]",
    "{\"choices\":[],\"choices\":[" CH("\"calm\"", "") "]}",
    /* digits a phone could start with, but outside every string */
    "{\"id\":\"chatcmpl-bench\",\"created\":13812345678,\"choices\":[" CH(
        "\"The sea is vast and so calm.\"", ",\"finish_reason\":\"stop\"") "],\"usage\":{"
                                                                           "\"total_tokens\":40}}",
    "{\"choices\":[" CH("\"e-v-i-l b a d\"", "") "]}",
};

static const char *const candidate[] = {
    /* a word in a text, and one only in a key (not text: unchanged) */
    "{\"choices\":[" CH("\"a badword\"", "") "]}",
    "{\"badword\":1,\"choices\":[" CH("\"calm\"", "") "]}",
    /* words spelled by escapes, in a text and in an id */
    "{\"choices\":[" CH("\"bad\\u0077ord\"", "") "]}",
    "{\"id\":\"\\u0065vil\",\"choices\":[" CH("\"calm\"", "") "]}",
    "{\"choices\":[" CH("\"calm\\n\"", "") "]}",
    /* a regex start inside a string: a phone, and a digit that is none */
    "{\"choices\":[" CH("\"call 13812345678\"", "") "]}",
    "{\"choices\":[" CH("\"room 1\"", "") "]}",
    /* not ASCII */
    "{\"choices\":[" CH("\"caf\xc3\xa9\"", "") "]}",
    "{\"choices\":[" CH("\"\xef\xbd\x82\xef\xbd\x81\xef\xbd\x84word\"", "") "]}",
    /* an unpaired quote with a digit after it */
    "{\"choices\":[" CH("\"calm\"", "") "]} \"1",
};

static void test_no_candidate(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_build();
    for (size_t i = 0; i < SL_ARRAY_LEN(no_candidate); i++) {
        const char *ans = no_candidate[i];
        if (!flt_json_strings_clean(rs, ans, strlen(ans)))
            fail_msg("answer %zu has a candidate: %s", i, ans);
        char *out = NULL;
        size_t olen = 0;
        flt_ans_rc_t rc = flt_response_filter_bytes(rs, ans, strlen(ans), &out, &olen);
        if (rc != FLT_ANS_SAME)
            fail_msg("answer %zu: rc %d, want it relayed unread: %s", i, rc, ans);
        assert_null(out);
    }
    for (size_t i = 0; i < SL_ARRAY_LEN(candidate); i++) {
        const char *ans = candidate[i];
        if (flt_json_strings_clean(rs, ans, strlen(ans)))
            fail_msg("answer %zu has no candidate: %s", i, ans);
        /* the reader's verdict, as before: JSON ones as the tree's */
        json_t *j = json_loads(ans, 0, NULL);
        char *out = NULL;
        size_t olen = 0;
        flt_ans_rc_t rc = flt_response_filter_bytes(rs, ans, strlen(ans), &out, &olen);
        if (!j) { /* relayed as it came, by the reader or the tree path */
            assert_true(rc == FLT_ANS_TREE || rc == FLT_ANS_SAME);
            assert_null(out);
            continue;
        }
        json_decref(j);
        bool mod;
        char *want = tree_result(rs, ans, &mod);
        if (rc != (mod ? FLT_ANS_EDITED : FLT_ANS_SAME))
            fail_msg("answer %zu: rc %d, tree modified %d: %s", i, rc, mod, ans);
        if (mod)
            assert_json_same(out, olen, want);
        free(out);
        free(want);
    }
    /* what a masked one becomes, by content */
    char *out = NULL;
    size_t olen = 0;
    const char *esc = candidate[2];
    assert_int_equal(flt_response_filter_bytes(rs, esc, strlen(esc), &out, &olen), FLT_ANS_EDITED);
    assert_non_null(strstr(out, "\"content\":\"***\""));
    free(out);
    flt_ruleset_unref(rs);
}

/* Random answers from pieces with and without candidates: whenever the
 * shortcut says "no candidate", the tree path changes nothing; and both
 * verdicts occur often. */
static void test_no_candidate_random(void **state)
{
    (void)state;
    static const char *const text[] = {
        "The sea ",
        "calm",
        "bad",
        "word",
        "badword",
        "bad\\u0077ord",
        "1",
        "3812345678",
        "evil",
        "e\\u0076il",
        "\\n",
        "\\\"",
        "\xe6\x95\x8f\xe6\x84\x9f\xe8\xaf\x8d",
        " ",
        "x",
    };
    static const char *const key[] = {"id", "badword", "model", "e\\u0076il", "n"};
    static const char *const num[] = {"13812345678", "1", "40", "1.5e3", "true", "null"};
    flt_ruleset_t *rs = rs_build();
    unsigned seed = 16, nclean = 0, nmaybe = 0;
    sl_buf_t b = {0};
    for (int round = 0; round < 3000; round++) {
        b.len = 0;
        assert_int_equal(sl_buf_add(&b, "{", 1), 0);
        int nk = rand_r(&seed) % 3;
        for (int k = 0; k < nk; k++) {
            char f[96];
            int n = snprintf(f, sizeof f, "\"%s\":%s,", key[rand_r(&seed) % SL_ARRAY_LEN(key)],
                             num[rand_r(&seed) % SL_ARRAY_LEN(num)]);
            assert_int_equal(sl_buf_add(&b, f, (size_t)n), 0);
        }
        assert_int_equal(sl_buf_add(&b, "\"choices\":[", 11), 0);
        int nc = 1 + rand_r(&seed) % 2;
        for (int c = 0; c < nc; c++) {
            const char *h = c ? ",{\"message\":{\"content\":\"" : "{\"message\":{\"content\":\"";
            assert_int_equal(sl_buf_add(&b, h, strlen(h)), 0);
            int np = rand_r(&seed) % 4;
            for (int i = 0; i < np; i++) {
                const char *t = text[rand_r(&seed) % SL_ARRAY_LEN(text)];
                assert_int_equal(sl_buf_add(&b, t, strlen(t)), 0);
            }
            assert_int_equal(sl_buf_add(&b, "\"}}", 3), 0);
        }
        assert_int_equal(sl_buf_add(&b, "]}", 3), 0); /* with the NUL */
        const char *ans = b.p;
        size_t n = b.len - 1;
        if (!flt_json_strings_clean(rs, ans, n)) {
            nmaybe++;
            continue;
        }
        nclean++;
        bool mod;
        char *want = tree_result(rs, ans, &mod);
        if (mod)
            fail_msg("no candidate, but the tree changed it: %s -> %s", ans, want);
        free(want);
        char *out = NULL;
        size_t olen = 0;
        assert_int_equal(flt_response_filter_bytes(rs, ans, n, &out, &olen), FLT_ANS_SAME);
        assert_null(out);
    }
    assert_true(nclean > 300);
    assert_true(nmaybe > 300);
    sl_buf_free(&b);
    flt_ruleset_unref(rs);
}

/* Only the text (and logprobs / finish_reason) change: every other byte
 * is the upstream's, blanks and key order included. */
static void test_splice_exact(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_build();
    const char *ans = "{ \"id\": \"a\",\n  \"choices\": [ {\"message\": {\"content\": \"x badword "
                      "y\"}, \"logprobs\": {\"a\": [1]}, \"finish_reason\": \"stop\"} ], "
                      "\"usage\": {\"total_tokens\": 40} }";
    char *out = NULL;
    size_t olen = 0;
    assert_int_equal(flt_response_filter_bytes(rs, ans, strlen(ans), &out, &olen), FLT_ANS_EDITED);
    assert_string_equal(out, "{ \"id\": \"a\",\n  \"choices\": [ {\"message\": {\"content\": \"x "
                             "*** y\"}, \"logprobs\": null, \"finish_reason\": \"stop\"} ], "
                             "\"usage\": {\"total_tokens\": 40} }");
    free(out);
    const char *blk = "{\"choices\":[{\"index\":0,\"message\":{\"content\":\"so evil\"}}]}";
    assert_int_equal(flt_response_filter_bytes(rs, blk, strlen(blk), &out, &olen), FLT_ANS_EDITED);
    assert_string_equal(out, "{\"choices\":[{\"finish_reason\":\"content_filter\",\"index\":0,"
                             "\"message\":{\"content\":\"\"}}]}");
    free(out);
    /* a text with a quote and a control character after the mask */
    const char *esc = "{\"choices\":[{\"message\":{\"content\":\"\\\"badword\\\"\\t\\u0001\"}}]}";
    assert_int_equal(flt_response_filter_bytes(rs, esc, strlen(esc), &out, &olen), FLT_ANS_EDITED);
    assert_string_equal(out,
                        "{\"choices\":[{\"message\":{\"content\":\"\\\"***\\\"\\t\\u0001\"}}]}");
    free(out);
    flt_ruleset_unref(rs);
}

/* Output filtering off: nothing read, nothing changed. */
static void tweak_no_output(flt_conf_t *c)
{
    c->output = false;
}

static void test_output_off(void **state)
{
    (void)state;
    tf_list_t l[1] = {{"evil\n", FLT_ACTION_BLOCK, "blocked"}};
    char err[256] = "";
    flt_ruleset_t *rs = tf_build(l, 1, NULL, 0, tweak_no_output, err, sizeof err);
    assert_non_null(rs);
    const char *ans = "{\"choices\":[{\"message\":{\"content\":\"evil\"}}]}";
    char *out = NULL;
    size_t olen = 0;
    assert_int_equal(flt_response_filter_bytes(rs, ans, strlen(ans), &out, &olen), FLT_ANS_SAME);
    assert_null(out);
    flt_ruleset_unref(rs);
}

/* Many choices (the parser's array grows) and a long text. */
static void test_many_choices(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_build();
    sl_buf_t b = {0};
    assert_int_equal(sl_buf_add(&b, "{\"choices\":[", 12), 0);
    for (int i = 0; i < 40; i++) {
        char c[160];
        int n = snprintf(c, sizeof c, "%s{\"index\":%d,\"message\":{\"content\":\"%s %d\"}}",
                         i ? "," : "", i, i % 3 ? "fine" : "badword", i);
        assert_int_equal(sl_buf_add(&b, c, (size_t)n), 0);
    }
    assert_int_equal(sl_buf_add(&b, "]}", 3), 0); /* with the NUL */
    bool mod;
    char *want = tree_result(rs, b.p, &mod);
    assert_true(mod);
    char *out = NULL;
    size_t olen = 0;
    assert_int_equal(flt_response_filter_bytes(rs, b.p, b.len - 1, &out, &olen), FLT_ANS_EDITED);
    assert_json_same(out, olen, want);
    free(out);
    free(want);
    sl_buf_free(&b);
    flt_ruleset_unref(rs);
}

/* Strings past the yajl arena (common/yheap.c): its buffers move to the heap
 * and grow there; same result as the tree. */
static void test_arena_overflow(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_build();
    sl_buf_t b = {0};
    assert_int_equal(sl_buf_add(&b, "{\"id\":\"", 7), 0);
    for (int i = 0; i < 3000; i++) /* a 12 KB escaped key value */
        assert_int_equal(sl_buf_add(&b, "a\\nb", 4), 0);
    assert_int_equal(sl_buf_add(&b, "\",\"choices\":[{\"message\":{\"content\":\"", 36), 0);
    for (int i = 0; i < 3000; i++) {
        const char *piece = i == 1500 ? "badword\\t" : "x\\ty ";
        assert_int_equal(sl_buf_add(&b, piece, strlen(piece)), 0);
    }
    assert_int_equal(sl_buf_add(&b, "\"}}]}", 6), 0);
    bool mod;
    char *want = tree_result(rs, b.p, &mod);
    assert_true(mod);
    char *out = NULL;
    size_t olen = 0;
    assert_int_equal(flt_response_filter_bytes(rs, b.p, b.len - 1, &out, &olen), FLT_ANS_EDITED);
    assert_json_same(out, olen, want);
    free(out);
    free(want);
    sl_buf_free(&b);
    flt_ruleset_unref(rs);
}

/* The channel-free verdict: only for text that folding leaves as it is
 * (ASCII, é, CJK: valid UTF-8, no fullwidth form) with no word and no regex
 * match; anything else (or a regex limit) is left to the channel. */
static void tweak_limit(flt_conf_t *c)
{
    c->regex_limits.match = 10000;
}

static void test_text_clean(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_build();
    static const char *const clean[] = {
        "",        "The sea is vast and so calm.",     "bad word",       "call 1234",
        "e-v-i-l", "12345678901 (1 then 2: no phone)", "caf\xc3\xa9",    "the sea\xc2\xa0",
        "敏感 词", "the caf\xc3\xa9 by the harbour.",  "bad\xc3\xa9word"};
    for (size_t i = 0; i < SL_ARRAY_LEN(clean); i++)
        if (!flt_text_clean(rs, clean[i], strlen(clean[i])))
            fail_msg("not clean: %s", clean[i]);
    /* a word or phone after é (the automaton's steps over bytes >= 0x80),
     * a fullwidth form (folding changes the text), bad UTF-8 */
    static const char *const maybe[] = {"a badword",
                                        "BadWord",
                                        "xevilx",
                                        "call 13812345678",
                                        "caf\xc3\xa9 badword",
                                        "caf\xc3\xa9 13812345678",
                                        "ｂａｄｗｏｒｄ",
                                        "敏感词",
                                        "x敏感词x",
                                        "\xc3\xa9 \xef\xbd\x82",
                                        "caf\xc3",
                                        "\xc0\xaf"};
    for (size_t i = 0; i < SL_ARRAY_LEN(maybe); i++)
        if (flt_text_clean(rs, maybe[i], strlen(maybe[i])))
            fail_msg("clean: %s", maybe[i]);
    flt_ruleset_unref(rs);
    /* a search that hits the match limit is no verdict */
    flt_conf_regex_t re[] = {{"evil", "(a+)+$", FLT_ACTION_BLOCK}};
    char err[256] = "", text[64];
    rs = tf_build(NULL, 0, re, 1, tweak_limit, err, sizeof err);
    assert_non_null(rs);
    memset(text, 'a', 40);
    strcpy(text + 40, "!");
    assert_false(flt_text_clean(rs, text, strlen(text)));
    assert_true(flt_text_clean(rs, "bbb!", 4));
    flt_ruleset_unref(rs);
}

/* flt_text_clean against the channel on texts with bytes >= 0x80: words
 * with é and CJK in them (one starting with é: the automaton in the middle
 * of a word across an ASCII run and a non-ASCII step), a phone after é,
 * fullwidth forms and the ideographic space. clean must be exactly "the
 * channel leaves the text as it is" where folding is the identity, and
 * never true where it is not. A pass that skips or mis-steps a byte >= 0x80
 * shows as a clean text the channel masks or blocks. */
static void test_text_clean_utf8_as_channel(void **state)
{
    (void)state;
    static const char *const piece[] = {
        "x",  " ",  "\xc3\xa9", "caf",          "CAF",          "bad",          "word",
        "敏", "感", "词",       "敏感词",       "ev",           "il",           "13812345678",
        "1",  "3",  "\xc2\xa0", "\xe2\x82\xac", "\xef\xbd\x82", "\xe3\x80\x80", "\xf0\x9f\x8c\x8a",
    };
    tf_list_t l[2] = {{"badword\n敏感词\ncaf\xc3\xa9\n\xc3\xa9"
                       "bad\n",
                       FLT_ACTION_MASK, "masked"},
                      {"evil\n", FLT_ACTION_BLOCK, "blocked"}};
    flt_conf_regex_t re[] = {{"phone", "1[3-9]\\d{9}", FLT_ACTION_MASK}};
    char err[256] = "";
    flt_ruleset_t *rs = tf_build(l, 2, re, 1, NULL, err, sizeof err);
    if (!rs)
        fail_msg("build: %s", err);
    unsigned seed = 16, clean = 0, hit = 0, folded = 0;
    char text[256];
    sl_buf_t out = {0};
    for (int round = 0; round < 20000; round++) {
        size_t n = 0, want = (size_t)(round % 120);
        while (n < want) {
            const char *p = rand_r(&seed) % 4 ? "x" : piece[rand_r(&seed) % SL_ARRAY_LEN(piece)];
            size_t pn = strlen(p);
            if (n + pn > want)
                break;
            memcpy(text + n, p, pn);
            n += pn;
        }
        bool c = flt_text_clean(rs, text, n);
        out.len = 0;
        flt_chan_rc_t rc = flt_chan_text(rs, text, n, &out);
        bool same = rc == FLT_CHAN_OK && out.len == n && memcmp(out.p ? out.p : "", text, n) == 0;
        if (c && !same)
            fail_msg("clean, but the channel changes it: %.*s", (int)n, text);
        if (!flt_fold_same(text, n)) {
            assert_false(c);
            folded++;
        } else if (!c && same) {
            fail_msg("the channel leaves it, but not clean: %.*s", (int)n, text);
        }
        c ? clean++ : !same ? hit++ : 0;
    }
    assert_true(clean > 2000 && hit > 2000 && folded > 1000);
    sl_buf_free(&out);
    flt_ruleset_unref(rs);
}

/* flt_text_clean goes on from where its ASCII pass stopped, with the
 * automaton's state there (branch arrparts: it used to start over from the
 * root). That state is not the root when a word's ASCII head lies before
 * the 32-byte round that holds its first byte >= 0x80: words with é or 中
 * after an ASCII head, planted at every offset of texts up to ~110 bytes,
 * so on both sides of each round's edge, with near misses (è for é) that
 * are clean. A resume from the root, or from the wrong offset, shows as a
 * clean text the channel masks. */
static void test_text_clean_resume(void **state)
{
    (void)state;
    tf_list_t l[1] = {{"caf\xc3\xa9\nbad\xc3\xa9word\ntid\xe4\xb8\xad\n", FLT_ACTION_MASK, "m"}};
    char err[256] = "";
    flt_ruleset_t *rs = tf_build(l, 1, NULL, 0, NULL, err, sizeof err);
    if (!rs)
        fail_msg("build: %s", err);
    static const char *const word[] = {"caf\xc3\xa9", "CAF\xc3\xa9", "bad\xc3\xa9word",
                                       "tid\xe4\xb8\xad"};
    static const char *const miss[] = {"caf\xc3\xa8", "bad\xc3\xa9wore", "tid\xe4\xb8\xae"};
    char text[160];
    sl_buf_t out = {0};
    for (size_t o = 0; o < 100; o++) {
        for (size_t tail = 0; tail < 3; tail++) {
            for (size_t w = 0; w < SL_ARRAY_LEN(word) + SL_ARRAY_LEN(miss); w++) {
                bool hit = w < SL_ARRAY_LEN(word);
                const char *p = hit ? word[w] : miss[w - SL_ARRAY_LEN(word)];
                memset(text, 'x', o);
                memcpy(text + o, p, strlen(p));
                size_t n = o + strlen(p);
                memset(text + n, 'y', tail * 20);
                n += tail * 20;
                bool c = flt_text_clean(rs, text, n);
                out.len = 0;
                assert_int_equal(flt_chan_text(rs, text, n, &out), FLT_CHAN_OK);
                bool same = out.len == n && memcmp(out.p, text, n) == 0;
                if (c != !hit || same != !hit)
                    fail_msg("%s at %zu, tail %zu: clean %d, channel same %d", p, o, tail * 20, c,
                             same);
            }
        }
    }
    sl_buf_free(&out);
    flt_ruleset_unref(rs);
}

/* The 32-byte passes (flt_json_strings_clean's and the regex start bytes
 * of flt_text_clean, with AVX2) against the loops they stand for (the same
 * ruleset with rs->avx2 off), on texts built from pieces that put quotes,
 * backslashes, digits a regex starts with and bytes >= 0x80 at every
 * offset, so on both sides of each 32-byte round's edge and in the last,
 * short round; with words and a regex, a regex alone, words alone. A pass
 * that misses a string's digit, an escape or an unpaired quote shows as a
 * verdict the loops do not give. */
static void test_byte_pass_same_as_loop(void **state)
{
    (void)state;
    static const char *const piece[] = {
        "\"", "\"", "\"", "1",  "13812345678", "\\", "\\u0031", "\xe6\x95\x8f", ":", "{", "}",
        ",",  "a",  "b",  "ad", "badword",     "ev", "il",      "   ",          "0", "9",
    };
    tf_list_t l[1] = {{"badword\nevil\n", FLT_ACTION_MASK, "w"}};
    flt_conf_regex_t re[] = {{"phone", "1[3-9]\\d{9}", FLT_ACTION_MASK}};
    char err[256] = "";
    flt_ruleset_t *set[3] = {tf_build(l, 1, re, 1, NULL, err, sizeof err),
                             tf_build(NULL, 0, re, 1, NULL, err, sizeof err),
                             tf_build(l, 1, NULL, 0, NULL, err, sizeof err)};
    __builtin_cpu_init();
    unsigned seed = 32;
    for (int k = 0; k < 3; k++) {
        flt_ruleset_t *rs = set[k];
        if (!rs)
            fail_msg("build: %s", err);
        assert_int_equal(rs->avx2, __builtin_cpu_supports("avx2") != 0);
        unsigned jclean = 0, jmaybe = 0, tclean = 0, tmaybe = 0;
        char text[256];
        for (int round = 0; round < 40000; round++) {
            size_t n = 0, want = (size_t)(round % 160);
            /* mostly plain letters, so that whole rounds pass clean */
            while (n < want) {
                const char *p =
                    rand_r(&seed) % 3 ? "x" : piece[rand_r(&seed) % SL_ARRAY_LEN(piece)];
                size_t pn = strlen(p);
                if (n + pn > want)
                    break;
                memcpy(text + n, p, pn);
                n += pn;
            }
            if (n && rand_r(&seed) % 2) { /* one quote at the offset the round picks */
                text[(size_t)round % n] = '"';
            }
            rs->avx2 = false;
            bool jl = flt_json_strings_clean(rs, text, n), tl = flt_text_clean(rs, text, n);
            rs->avx2 = __builtin_cpu_supports("avx2") != 0;
            if (flt_json_strings_clean(rs, text, n) != jl)
                fail_msg("ruleset %d, strings: %d by the loop: %.*s", k, jl, (int)n, text);
            if (flt_text_clean(rs, text, n) != tl)
                fail_msg("ruleset %d, text: %d by the loop: %.*s", k, tl, (int)n, text);
            jl ? jclean++ : jmaybe++;
            tl ? tclean++ : tmaybe++;
        }
        assert_true(jclean > 2000 && jmaybe > 2000 && tclean > 2000 && tmaybe > 2000);
        flt_ruleset_unref(rs);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_as_tree),
        cmocka_unit_test(test_to_tree),
        cmocka_unit_test(test_splice_exact),
        cmocka_unit_test(test_output_off),
        cmocka_unit_test(test_many_choices),
        cmocka_unit_test(test_text_clean),
        cmocka_unit_test(test_text_clean_utf8_as_channel),
        cmocka_unit_test(test_text_clean_resume),
        cmocka_unit_test(test_arena_overflow),
        cmocka_unit_test(test_no_candidate),
        cmocka_unit_test(test_no_candidate_random),
        cmocka_unit_test(test_byte_pass_same_as_loop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
