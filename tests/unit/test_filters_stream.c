/* Unit tests of the text channel (hold-back filtering) and of the SSE layer
 * over it: words and regexes split across events at every byte offset,
 * Chinese and fullwidth text, overlapping masks, the hold-back bound, the
 * catastrophic-regex limit, and the chunk JSON going in and out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/metrics.h"
#include "filters/flt_internal.h"
#include "gateway/gw_flt_resp.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_route.h"
#include "test_filters_util.h"

static flt_ruleset_t *rs_words(const char *mask_words, const char *block_words)
{
    tf_list_t l[2] = {{mask_words, FLT_ACTION_MASK, "masked"},
                      {block_words, FLT_ACTION_BLOCK, "blocked"}};
    char err[256] = "";
    flt_ruleset_t *rs = tf_build(l, block_words ? 2 : 1, NULL, 0, NULL, err, sizeof err);
    if (!rs)
        fail_msg("build: %s", err);
    return rs;
}

/* Feeds text cut at the given offsets (sorted, may repeat), then finishes;
 * returns the concatenated output (malloc'd) and the result code. */
static char *feed_split(const flt_ruleset_t *rs, const char *text, const size_t *cuts, size_t ncuts,
                        flt_chan_rc_t *rc_out)
{
    flt_chan_t c;
    assert_int_equal(flt_chan_init(&c, rs), 0);
    sl_buf_t out = {0};
    size_t n = strlen(text), pos = 0;
    flt_chan_rc_t rc = FLT_CHAN_OK;
    for (size_t i = 0; i <= ncuts && rc == FLT_CHAN_OK; i++) {
        size_t end = i < ncuts ? cuts[i] : n;
        rc = flt_chan_feed(&c, text + pos, end - pos, &out);
        pos = end;
    }
    if (rc == FLT_CHAN_OK)
        rc = flt_chan_finish(&c, &out);
    *rc_out = rc;
    flt_chan_fini(&c);
    char *s = strndup(out.p ? out.p : "", out.len);
    sl_buf_free(&out);
    return s;
}

static int is_boundary(const char *s, size_t i)
{
    return ((unsigned char)s[i] & 0xC0) != 0x80;
}

/* Every split into two and three pieces (at character boundaries, as JSON
 * strings always are) gives `want`. */
static void check_all_splits(const flt_ruleset_t *rs, const char *text, const char *want,
                             flt_chan_rc_t want_rc)
{
    size_t n = strlen(text);
    flt_chan_rc_t rc;
    char *got = feed_split(rs, text, NULL, 0, &rc);
    assert_int_equal(rc, want_rc);
    if (want_rc == FLT_CHAN_OK)
        assert_string_equal(got, want);
    free(got);
    for (size_t a = 0; a <= n; a++) {
        if (!is_boundary(text, a) && a < n)
            continue;
        size_t c1[1] = {a};
        got = feed_split(rs, text, c1, 1, &rc);
        assert_int_equal(rc, want_rc);
        if (want_rc == FLT_CHAN_OK)
            assert_string_equal(got, want);
        free(got);
        for (size_t b = a; b <= n; b++) {
            if (!is_boundary(text, b) && b < n)
                continue;
            size_t c2[2] = {a, b};
            got = feed_split(rs, text, c2, 2, &rc);
            assert_int_equal(rc, want_rc);
            if (want_rc == FLT_CHAN_OK)
                assert_string_equal(got, want);
            free(got);
        }
    }
}

static void test_split_latin(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n", "evil\n");
    check_all_splits(rs, "a badword here", "a *** here", FLT_CHAN_OK);
    check_all_splits(rs, "BadWord at start", "*** at start", FLT_CHAN_OK);
    check_all_splits(rs, "ends with badword", "ends with ***", FLT_CHAN_OK);
    check_all_splits(rs, "badwor d is not it", "badwor d is not it", FLT_CHAN_OK);
    check_all_splits(rs, "this is EVIL stuff", NULL, FLT_CHAN_BLOCK);
    flt_ruleset_unref(rs);
}

static void test_split_chinese(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("# comment line\n敏感词\n测试\n", "禁止内容\n");
    check_all_splits(rs, "这是敏感词吗", "这是***吗", FLT_CHAN_OK);
    check_all_splits(rs, "测试测试", "******", FLT_CHAN_OK);
    check_all_splits(rs, "敏感 词", "敏感 词", FLT_CHAN_OK);
    check_all_splits(rs, "有禁止内容", NULL, FLT_CHAN_BLOCK);
    flt_ruleset_unref(rs);
}

static void test_fullwidth(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\nｅｖｉｌ\n", NULL);
    /* fullwidth text folds to the halfwidth word, and a fullwidth word in the
     * list matches halfwidth text; the mask replaces the original bytes */
    check_all_splits(rs, "x ＢＡＤｗｏｒｄ y", "x *** y", FLT_CHAN_OK);
    check_all_splits(rs, "so EVIL.", "so ***.", FLT_CHAN_OK);
    check_all_splits(rs, "ｂａｄ　ｗｏｒｄ", "ｂａｄ　ｗｏｒｄ", FLT_CHAN_OK);
    flt_ruleset_unref(rs);
}

static void test_overlapping(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("abc\nbcd\nhe\nshe\nhers\n", NULL);
    /* overlapping matches merge into one mask; adjacent ones stay apart */
    check_all_splits(rs, "xabcdx", "x***x", FLT_CHAN_OK);
    check_all_splits(rs, "ushers", "u***", FLT_CHAN_OK);
    check_all_splits(rs, "abcabc", "******", FLT_CHAN_OK);
    flt_ruleset_unref(rs);
}

/* A mask inside a word whose text spans events: the mask goes out once. */
static void test_mask_inside_spanning_word(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("secret\n", NULL);
    flt_chan_t c;
    assert_int_equal(flt_chan_init(&c, rs), 0);
    sl_buf_t out = {0};
    assert_int_equal(flt_chan_feed(&c, "topsec", 6, &out), FLT_CHAN_OK);
    assert_int_equal(out.len, 3); /* "top" released, "sec" held */
    assert_memory_equal(out.p, "top", 3);
    assert_int_equal(flt_chan_held(&c), 3);
    assert_int_equal(flt_chan_feed(&c, "retary", 6, &out), FLT_CHAN_OK);
    assert_int_equal(flt_chan_held(&c), 0);
    assert_int_equal(flt_chan_finish(&c, &out), FLT_CHAN_OK);
    assert_string_equal(out.p, "top***ary");
    assert_int_equal(c.nmask, 1);
    flt_chan_fini(&c);
    sl_buf_free(&out);
    flt_ruleset_unref(rs);
}

/* Longest suffix of text[0..n) that is a prefix of a word (folded, ASCII). */
static size_t naive_live(const char *const *words, size_t nw, const char *text, size_t n)
{
    size_t best = 0;
    for (size_t w = 0; w < nw; w++) {
        size_t wl = strlen(words[w]);
        for (size_t k = 1; k < wl && k <= n; k++)
            if (strncasecmp(text + n - k, words[w], k) == 0 && k > best)
                best = k;
    }
    return best;
}

static void test_holdback_bound(void **state)
{
    (void)state;
    const char *words[] = {"abcab", "abd", "bcx", "cc"};
    flt_ruleset_t *rs = rs_words("abcab\nabd\nbcx\ncc\n", NULL);
    const char *texts[] = {"abcabcabdabcx", "zzabcabzz", "aaaaabccab", "xbcbcbcx abca"};
    for (size_t t = 0; t < SL_ARRAY_LEN(texts); t++) {
        const char *s = texts[t];
        for (size_t step = 1; step <= 3; step++) {
            flt_chan_t c;
            assert_int_equal(flt_chan_init(&c, rs), 0);
            sl_buf_t out = {0};
            size_t n = strlen(s);
            for (size_t pos = 0; pos < n; pos += step) {
                size_t k = SL_MIN(step, n - pos);
                assert_int_equal(flt_chan_feed(&c, s + pos, k, &out), FLT_CHAN_OK);
                size_t live = naive_live(words, 4, s, pos + k);
                /* never longer than the longest live partial match; with
                 * words only it is exactly that */
                assert_true(flt_chan_held(&c) <= live);
                assert_int_equal(flt_chan_held(&c), live);
            }
            flt_chan_fini(&c);
            sl_buf_free(&out);
        }
    }
    flt_ruleset_unref(rs);
}

static void test_no_partial_released_at_once(void **state)
{
    (void)state;
    flt_conf_regex_t re[] = {{"phone", "1[3-9]\\d{9}", FLT_ACTION_MASK}};
    tf_list_t l[] = {{"badword\n", FLT_ACTION_MASK, "w"}};
    char err[256] = "";
    flt_ruleset_t *rs = tf_build(l, 1, re, 1, NULL, err, sizeof err);
    assert_non_null(rs);
    flt_chan_t c;
    assert_int_equal(flt_chan_init(&c, rs), 0);
    sl_buf_t out = {0};
    assert_int_equal(flt_chan_feed(&c, "Hello there, ", 13, &out), FLT_CHAN_OK);
    assert_int_equal(out.len, 13);
    assert_int_equal(flt_chan_held(&c), 0);
    /* "1" could start a phone number: held; "x" ends it */
    assert_int_equal(flt_chan_feed(&c, "call 1", 6, &out), FLT_CHAN_OK);
    assert_int_equal(flt_chan_held(&c), 1);
    assert_int_equal(flt_chan_feed(&c, "x", 1, &out), FLT_CHAN_OK);
    assert_int_equal(flt_chan_held(&c), 0);
    assert_string_equal(out.p, "Hello there, call 1x");
    /* a phone number split over three events is masked */
    assert_int_equal(flt_chan_feed(&c, " 1381", 5, &out), FLT_CHAN_OK);
    assert_int_equal(flt_chan_held(&c), 4);
    assert_int_equal(flt_chan_feed(&c, "23456", 5, &out), FLT_CHAN_OK);
    assert_int_equal(flt_chan_feed(&c, "78 ok", 5, &out), FLT_CHAN_OK);
    assert_int_equal(flt_chan_held(&c), 0);
    assert_string_equal(out.p, "Hello there, call 1x *** ok");
    flt_chan_fini(&c);
    sl_buf_free(&out);
    flt_ruleset_unref(rs);
}

static void test_regex_splits(void **state)
{
    (void)state;
    flt_conf_regex_t re[] = {
        {"phone", "1[3-9]\\d{9}", FLT_ACTION_MASK}, {"cat", "\\bcat\\b", FLT_ACTION_MASK},
        {"lb", "(?<=key=)[a-z]+", FLT_ACTION_MASK}, {"start", "^hello", FLT_ACTION_MASK},
        {"end", "bye$", FLT_ACTION_MASK},
    };
    char err[256] = "";
    flt_ruleset_t *rs = tf_build(NULL, 0, re, SL_ARRAY_LEN(re), NULL, err, sizeof err);
    assert_non_null(rs);
    check_all_splits(rs, "tel 13812345678.", "tel ***.", FLT_CHAN_OK);
    check_all_splits(rs, "cat concat cat", "*** concat ***", FLT_CHAN_OK);
    check_all_splits(rs, "key=abc, key=9", "key=***, key=9", FLT_CHAN_OK);
    check_all_splits(rs, "hello, hello", "***, hello", FLT_CHAN_OK);
    check_all_splits(rs, "bye bye", "bye ***", FLT_CHAN_OK);
    check_all_splits(rs, "电话：１３８１２３４５６７８", "电话：***", FLT_CHAN_OK);
    flt_ruleset_unref(rs);
}

static int limit_mode;
static void tweak_limits(flt_conf_t *c)
{
    c->regex_limits.match = 10000;
    c->regex_limits.on_limit = limit_mode;
}

static void test_catastrophic_regex(void **state)
{
    (void)state;
    char text[64];
    memset(text, 'a', 40);
    strcpy(text + 40, "!");
    for (int mode = 0; mode < 2; mode++) {
        limit_mode = mode ? FLT_ON_LIMIT_NOMATCH : FLT_ON_LIMIT_MATCH;
        flt_conf_regex_t re[] = {{"evil", "(a+)+$", FLT_ACTION_BLOCK}};
        char err[256] = "";
        flt_ruleset_t *rs = tf_build(NULL, 0, re, 1, tweak_limits, err, sizeof err);
        assert_non_null(rs);
        int64_t t0 = tf_cpu_ns();
        sl_buf_t out = {0};
        flt_chan_rc_t rc = flt_text_filter(rs, text, strlen(text), &out);
        int64_t dt = tf_cpu_ns() - t0;
        /* 2^40 steps without the limit; with it, well under 100 ms of CPU */
        assert_true(dt < 100 * 1000000LL);
        if (mode == 0) {
            assert_int_equal(rc, FLT_CHAN_BLOCK);
        } else {
            assert_int_equal(rc, FLT_CHAN_OK);
            assert_string_equal(out.p, text);
        }
        sl_buf_free(&out);
        /* streamed: the same verdict */
        flt_chan_t c;
        assert_int_equal(flt_chan_init(&c, rs), 0);
        rc = flt_chan_feed(&c, text, 20, &out);
        if (rc == FLT_CHAN_OK)
            rc = flt_chan_feed(&c, text + 20, strlen(text) - 20, &out);
        if (rc == FLT_CHAN_OK)
            rc = flt_chan_finish(&c, &out);
        assert_int_equal(rc, mode == 0 ? FLT_CHAN_BLOCK : FLT_CHAN_OK);
        assert_true(c.nlimit >= 1);
        flt_chan_fini(&c);
        sl_buf_free(&out);
        flt_ruleset_unref(rs);
    }
}

static void tweak_holdback(flt_conf_t *c)
{
    c->holdback_max = FLT_HOLDBACK_MIN;
}

/* A regex that could match forever ("a.*z") cannot hold more than
 * holdback_max: the oldest text is released. */
static void test_holdback_cap(void **state)
{
    (void)state;
    flt_conf_regex_t re[] = {{"az", "a[^z]*z", FLT_ACTION_MASK}};
    char err[256] = "";
    flt_ruleset_t *rs = tf_build(NULL, 0, re, 1, tweak_holdback, err, sizeof err);
    assert_non_null(rs);
    flt_chan_t c;
    assert_int_equal(flt_chan_init(&c, rs), 0);
    sl_buf_t out = {0};
    char piece[100];
    memset(piece, 'b', sizeof piece);
    assert_int_equal(flt_chan_feed(&c, "a", 1, &out), FLT_CHAN_OK);
    for (int i = 0; i < 50; i++) {
        assert_int_equal(flt_chan_feed(&c, piece, sizeof piece, &out), FLT_CHAN_OK);
        assert_true(flt_chan_held(&c) <= FLT_HOLDBACK_MIN);
    }
    assert_true(c.nforced > 0);
    assert_true(out.len >= 5001 - FLT_HOLDBACK_MIN);
    flt_chan_fini(&c);
    sl_buf_free(&out);
    flt_ruleset_unref(rs);
}

/* ---- the SSE / JSON layer ------------------------------------------------ */

static char *chunk(const char *content, const char *finish)
{
    json_t *o =
        json_pack("{s:s, s:s, s:i, s:s, s:[{s:i, s:{s:s?}, s:n, s:s?}]}", "id", "c1", "object",
                  "chat.completion.chunk", "created", 7, "model", "m", "choices", "index", 0,
                  "delta", "content", content, "logprobs", "finish_reason", finish);
    assert_non_null(o);
    if (!content)
        json_object_del(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "delta"),
                        "content");
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* Content of an emitted payload (NULL for none), and its finish_reason. */
static char *payload_content(const char *data, char *finish, size_t flen)
{
    json_t *o = json_loads(data, 0, NULL);
    assert_non_null(o);
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    const char *c = json_string_value(json_object_get(json_object_get(ch, "delta"), "content"));
    const char *f = json_string_value(json_object_get(ch, "finish_reason"));
    snprintf(finish, flen, "%s", f ? f : "");
    char *r = c ? strdup(c) : NULL;
    json_decref(o);
    return r;
}

typedef struct run {
    char text[512];
    char finish[64];
    int done;
    int verdict_block;
    int events_out;
} run_t;

static void run_event(flt_stream_t *st, const char *data, run_t *r)
{
    flt_out_t out = {0};
    flt_ev_verdict_t v = flt_stream_event(st, data, strlen(data), &out);
    assert_true(v != FLT_EV_ERROR);
    if (v == FLT_EV_PASS) {
        assert_int_equal(out.n, 0);
        if (strcmp(data, "[DONE]") == 0) {
            r->done++;
        } else {
            char f[32];
            char *c = payload_content(data, f, sizeof f);
            if (c)
                strcat(r->text, c);
            if (f[0])
                snprintf(r->finish, sizeof r->finish, "%s", f);
            free(c);
        }
        r->events_out++;
    }
    for (size_t i = 0; i < out.n; i++) {
        assert_int_equal(strlen(out.v[i].data), out.v[i].len);
        r->events_out++;
        if (strcmp(out.v[i].data, "[DONE]") == 0) {
            assert_int_equal(i, out.n - 1);
            r->done++;
            continue;
        }
        char f[32];
        char *c = payload_content(out.v[i].data, f, sizeof f);
        if (c)
            strcat(r->text, c);
        if (f[0])
            snprintf(r->finish, sizeof r->finish, "%s", f);
        free(c);
    }
    if (v == FLT_EV_BLOCK)
        r->verdict_block = 1;
    flt_out_release(&out);
}

static void run_pieces(flt_ruleset_t *rs, const char *const *pieces, size_t n, run_t *r)
{
    memset(r, 0, sizeof *r);
    flt_stream_t *st = flt_stream_new(rs);
    assert_non_null(st);
    for (size_t i = 0; i < n && !r->verdict_block; i++) {
        char *d = chunk(pieces[i], NULL);
        run_event(st, d, r);
        free(d);
    }
    if (!r->verdict_block) {
        char *d = chunk(NULL, "stop");
        run_event(st, d, r);
        free(d);
    }
    if (!r->verdict_block)
        run_event(st, "[DONE]", r);
    flt_stream_free(st);
}

static void test_sse_mask_and_block(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n敏感\n", "evil\n");
    const char *p1[] = {"Hello ", "a bad", "wo", "rd! 敏", "感 end"};
    run_t r;
    run_pieces(rs, p1, SL_ARRAY_LEN(p1), &r);
    assert_string_equal(r.text, "Hello a ***! *** end");
    assert_string_equal(r.finish, "stop");
    assert_int_equal(r.done, 1);
    assert_int_equal(r.verdict_block, 0);

    /* held text at the end of the stream goes out before the finish chunk */
    const char *p2[] = {"ends in bad"};
    run_pieces(rs, p2, 1, &r);
    assert_string_equal(r.text, "ends in bad");
    assert_string_equal(r.finish, "stop");

    const char *p3[] = {"This is ", "ev", "il indeed"};
    run_pieces(rs, p3, SL_ARRAY_LEN(p3), &r);
    assert_int_equal(r.verdict_block, 1);
    assert_string_equal(r.text, "This is "); /* "ev" never left */
    assert_string_equal(r.finish, "content_filter");
    assert_int_equal(r.done, 0); /* the caller sends [DONE] */
    flt_ruleset_unref(rs);
}

static void test_sse_passthrough_and_edges(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n", NULL);
    flt_stream_t *st = flt_stream_new(rs);
    flt_out_t out = {0};
    /* unchanged text: the very same bytes go on */
    const char *ev = "{\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
                     "\"content\":\"\"},\"finish_reason\":null}]}";
    assert_int_equal(flt_stream_event(st, ev, strlen(ev), &out), FLT_EV_PASS);
    char *d = chunk("plain words ", NULL);
    assert_int_equal(flt_stream_event(st, d, strlen(d), &out), FLT_EV_PASS);
    free(d);
    /* U+0000 in the text is just text */
    const char *nul = "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\\u0000b \"}}]}";
    assert_int_equal(flt_stream_event(st, nul, strlen(nul), &out), FLT_EV_PASS);
    /* a usage-only chunk passes */
    const char *usage = "{\"id\":\"x\",\"choices\":[],\"usage\":{\"total_tokens\":3}}";
    assert_int_equal(flt_stream_event(st, usage, strlen(usage), &out), FLT_EV_PASS);
    /* all of it held back: the event is dropped (REPLACE with nothing) */
    d = chunk("bad", NULL);
    assert_int_equal(flt_stream_event(st, d, strlen(d), &out), FLT_EV_REPLACE);
    assert_int_equal(out.n, 0);
    free(d);
    assert_int_equal(flt_stream_held(st, 0), 3);
    /* logprobs would leak the held tokens: nulled */
    const char *lp = "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ly\"},"
                     "\"logprobs\":{\"content\":[{\"token\":\"ly\"}]},\"finish_reason\":null}]}";
    assert_int_equal(flt_stream_event(st, lp, strlen(lp), &out), FLT_EV_REPLACE);
    assert_int_equal(out.n, 1);
    assert_non_null(strstr(out.v[0].data, "\"logprobs\":null"));
    assert_non_null(strstr(out.v[0].data, "\"content\":\"badly\""));
    flt_out_reset(&out);
    /* [DONE] with nothing held */
    assert_int_equal(flt_stream_event(st, "[DONE]", 6, &out), FLT_EV_REPLACE);
    assert_int_equal(out.n, 1);
    assert_string_equal(out.v[0].data, "[DONE]");
    flt_out_release(&out);
    flt_stream_free(st);

    /* garbage from the upstream fails closed */
    st = flt_stream_new(rs);
    assert_int_equal(flt_stream_event(st, "{not json", 9, &out), FLT_EV_BLOCK);
    assert_int_equal(out.n, 1);
    assert_non_null(strstr(out.v[0].data, "\"finish_reason\":\"content_filter\""));
    assert_null(flt_stream_block_rule(st));
    flt_out_release(&out);
    flt_stream_free(st);

    /* two choices are filtered apart */
    st = flt_stream_new(rs);
    const char *two = "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a bad\"}},"
                      "{\"index\":1,\"delta\":{\"content\":\"a badword\"}}]}";
    assert_int_equal(flt_stream_event(st, two, strlen(two), &out), FLT_EV_REPLACE);
    assert_int_equal(out.n, 1);
    assert_non_null(strstr(out.v[0].data, "\"content\":\"a \""));
    assert_non_null(strstr(out.v[0].data, "\"content\":\"a ***\""));
    assert_int_equal(flt_stream_held(st, 0), 3);
    assert_int_equal(flt_stream_held(st, 1), 0);
    flt_out_reset(&out);
    assert_int_equal(flt_stream_end(st, &out), FLT_EV_REPLACE);
    assert_int_equal(out.n, 1); /* choice 0's "bad" */
    assert_non_null(strstr(out.v[0].data, "\"content\":\"bad\""));
    flt_out_release(&out);
    flt_stream_free(st);
    flt_ruleset_unref(rs);
}

static void test_sse_block_metrics(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("x1\n", "forbidden\n");
    flt_stream_t *st = flt_stream_new(rs);
    flt_out_t out = {0};
    char *d = chunk("so forbid", NULL);
    assert_int_equal(flt_stream_event(st, d, strlen(d), &out), FLT_EV_REPLACE);
    free(d);
    flt_out_reset(&out);
    d = chunk("den fruit", NULL);
    assert_int_equal(flt_stream_event(st, d, strlen(d), &out), FLT_EV_BLOCK);
    free(d);
    assert_string_equal(flt_stream_block_rule(st), "blocked");
    assert_int_equal(out.n, 1);
    json_t *o = json_loads(out.v[0].data, 0, NULL);
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "content_filter");
    assert_string_equal(json_string_value(json_object_get(o, "id")), "c1");
    assert_string_equal(json_string_value(json_object_get(o, "model")), "m");
    json_decref(o);
    flt_out_release(&out);
    flt_stream_free(st);
    char *text = sl_metrics_render(NULL);
    assert_non_null(strstr(text, "sluice_filter_hits_total{rule=\"blocked\",action=\"block\"}"));
    assert_non_null(strstr(text, "sluice_filter_event_seconds_count"));
    free(text);
    flt_ruleset_unref(rs);
}

/* ---- the event read with yajl, text spliced back into the upstream's bytes */

/* One event through a fresh stream; returns the verdict, *res the single
 * payload (malloc'd) when REPLACE gave exactly one, else NULL. */
static flt_ev_verdict_t one_event(flt_stream_t *st, const char *ev, char **res)
{
    flt_out_t out = {0};
    flt_ev_verdict_t v = flt_stream_event(st, ev, strlen(ev), &out);
    *res = NULL;
    if (v == FLT_EV_REPLACE && out.n == 1) {
        assert_int_equal(strlen(out.v[0].data), out.v[0].len);
        *res = strdup(out.v[0].data);
    }
    flt_out_release(&out);
    return v;
}

static void test_sse_splice_exact(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n", "evil\n");
    flt_stream_t *st = flt_stream_new(rs);
    char *res;
    /* odd spacing, key order, "content" keys elsewhere, escapes: only the
     * delta's content string and logprobs change, every other byte stays */
    const char *ev = " { \"id\" : \"x\\u0041\", \"choices\" : [ { \"logprobs\" : {\"content\":"
                     "[{\"token\":\"badword\"}]} , \"delta\" : { \"tool_calls\":[{\"content\":"
                     "\"badword\"}], \"content\" : \"a \\\"b\\u0061dword\\\"\\n\\u00e9\\/\" ,"
                     " \"role\":\"assistant\"}, \"index\" : 0 } ] , \"usage\":null,"
                     " \"x\":{\"content\":\"badword\"} }";
    const char *want = " { \"id\" : \"x\\u0041\", \"choices\" : [ { \"logprobs\" : null , "
                       "\"delta\" : { \"tool_calls\":[{\"content\":\"badword\"}], \"content\" : "
                       "\"a \\\"***\\\"\\né/\" , \"role\":\"assistant\"}, \"index\" : 0 } ] , "
                       "\"usage\":null, \"x\":{\"content\":\"badword\"} }";
    assert_int_equal(one_event(st, ev, &res), FLT_EV_REPLACE);
    assert_non_null(res);
    assert_string_equal(res, want);
    json_t *o = json_loads(res, 0, NULL);
    assert_non_null(o); /* valid JSON */
    json_decref(o);
    free(res);

    /* control characters and quotes in the new text are encoded exactly */
    const char *ev2 = "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\u0001\\t\\\\ "
                      "badword\\r\\b\\f\"}}]}";
    assert_int_equal(one_event(st, ev2, &res), FLT_EV_REPLACE);
    assert_string_equal(res, "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\u0001\\t\\\\ "
                             "***\\r\\b\\f\"}}]}");
    free(res);

    /* unchanged text with escapes: passed as is */
    const char *ev3 = "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\u00e9\\n\"}}]}";
    assert_int_equal(one_event(st, ev3, &res), FLT_EV_PASS);
    flt_stream_free(st);

    /* a \u escape cannot hide a block word */
    st = flt_stream_new(rs);
    const char *ev4 = "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"so \\u0065vil\"}}]}";
    assert_int_equal(one_event(st, ev4, &res), FLT_EV_BLOCK);
    flt_stream_free(st);
    flt_ruleset_unref(rs);
}

static void test_sse_fail_closed(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n", NULL);
    static const char *const bad[] = {
        "[1]",
        "\"text\"",
        "42",
        "{\"choices\":[]} {}",
        "{\"choices\":[{\"delta\":{\"content\":\"a\",\"content\":\"badword\"}}]}",
        "{\"choices\":[{\"delta\":{\"content\":\"a\"},\"delta\":{\"content\":\"b\"}}]}",
        "{\"choices\":[],\"choices\":[{\"delta\":{\"content\":\"badword\"}}]}",
        "{\"choices\":[{\"text\":\"a\",\"delta\":{\"content\":\"b\"}}]}",
        "{\"choices\":[{\"delta\":{\"content\":\"lone \\ud800 surrogate\"}}]}",
        "{\"choices\":[{\"delta\":{\"content\":\"overlong \xc0\xaf\"}}]}",
        "{\"choices\":[{\"delta\":{\"content\":\"raw\nnewline\"}}]}",
        "{\"created\":123456789012345678901234567890,\"choices\":[]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}],}",
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++) {
        flt_stream_t *st = flt_stream_new(rs);
        flt_out_t out = {0};
        flt_ev_verdict_t v = flt_stream_event(st, bad[i], strlen(bad[i]), &out);
        if (v != FLT_EV_BLOCK)
            fail_msg("event %zu (%s): verdict %d, want BLOCK", i, bad[i], (int)v);
        assert_int_equal(out.n, 1);
        assert_non_null(strstr(out.v[0].data, "\"finish_reason\":\"content_filter\""));
        flt_out_release(&out);
        flt_stream_free(st);
    }
    /* ... and what still passes: a non-object choice, a non-string content,
     * a delta that is not an object, numbers of every kind, a surrogate pair */
    static const char *const good[] = {
        "{\"choices\":[1,null,{\"delta\":{\"content\":null}}]}",
        "{\"choices\":[{\"delta\":\"badword\",\"index\":1.5}]}",
        "{\"created\":-1.5e3,\"choices\":[{\"index\":-0,\"delta\":{\"content\":\"\\ud83d\\ude00\"}}"
        "]}",
        "{\"choices\":{\"delta\":{\"content\":\"badword\"}}}",
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(good); i++) {
        flt_stream_t *st = flt_stream_new(rs);
        flt_out_t out = {0};
        flt_ev_verdict_t v = flt_stream_event(st, good[i], strlen(good[i]), &out);
        if (v != FLT_EV_PASS)
            fail_msg("event %zu (%s): verdict %d, want PASS", i, good[i], (int)v);
        flt_out_release(&out);
        flt_stream_free(st);
    }
    flt_ruleset_unref(rs);
}

static void test_sse_completions_shape(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n", NULL);
    flt_stream_t *st = flt_stream_new(rs);
    char *res;
    const char *e1 = "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"text\":"
                     "\"a badword\",\"index\":0,\"logprobs\":null,\"finish_reason\":null}]}";
    assert_int_equal(one_event(st, e1, &res), FLT_EV_REPLACE);
    assert_string_equal(res, "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{"
                             "\"text\":\"a ***\",\"index\":0,\"logprobs\":null,\"finish_reason\""
                             ":null}]}");
    free(res);
    /* all held: dropped */
    const char *e2 = "{\"id\":\"cmpl-1\",\"choices\":[{\"text\":\"bad\",\"index\":0}]}";
    flt_out_t out = {0};
    assert_int_equal(flt_stream_event(st, e2, strlen(e2), &out), FLT_EV_REPLACE);
    assert_int_equal(out.n, 0);
    /* the finish flushes the held text in a chunk of the same shape */
    const char *e3 = "{\"id\":\"cmpl-1\",\"choices\":[{\"index\":0,\"finish_reason\":\"stop\"}]}";
    assert_int_equal(flt_stream_event(st, e3, strlen(e3), &out), FLT_EV_REPLACE);
    assert_int_equal(out.n, 2);
    json_t *o = json_loads(out.v[0].data, 0, NULL);
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "text")), "bad");
    assert_null(json_object_get(ch, "delta"));
    assert_string_equal(json_string_value(json_object_get(o, "id")), "cmpl-1");
    assert_string_equal(json_string_value(json_object_get(o, "object")), "text_completion");
    json_decref(o);
    assert_string_equal(out.v[1].data, e3); /* the finish chunk itself, untouched */
    flt_out_release(&out);
    flt_stream_free(st);
    flt_ruleset_unref(rs);
}

/* Random chat chunks (escapes, odd spacing, extra keys, two choices) through
 * the stream: every REPLACE payload is valid JSON equal to its input but for
 * the content strings and logprobs, and the text that comes out per choice
 * equals the text filtered whole. */
static void test_sse_random_events(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\nxy\n", NULL);
    static const char *const alpha[] = {"a", "b",  "d",  "o",  "r", "w",  "x",    "y",
                                        " ", "\"", "\\", "\n", "é", "敏", "\x01", "/"};
    uint32_t seed = 12345;
    for (int round = 0; round < 200; round++) {
        flt_stream_t *st = flt_stream_new(rs);
        sl_buf_t in[2] = {{0}}, got[2] = {{0}};
        for (int ev = 0; ev < 12; ev++) {
            json_t *o = json_pack("{s:s, s:[]}", "id", "r", "choices");
            json_t *arr = json_object_get(o, "choices");
            for (int k = 0; k < 2; k++) {
                char text[64] = "";
                seed = seed * 1103515245u + 12345u;
                int len = (int)(seed >> 16) % 6;
                for (int j = 0; j < len; j++) {
                    seed = seed * 1103515245u + 12345u;
                    strcat(text, alpha[(seed >> 16) % SL_ARRAY_LEN(alpha)]);
                }
                assert_int_equal(sl_buf_add(&in[k], text, strlen(text)), 0);
                json_array_append_new(arr, json_pack("{s:i, s:{s:s}, s:n}", "index", k, "delta",
                                                     "content", text, "logprobs"));
            }
            char *d = json_dumps(o, JSON_COMPACT | (ev % 2 ? JSON_INDENT(1) : 0));
            flt_out_t out = {0};
            flt_ev_verdict_t v = flt_stream_event(st, d, strlen(d), &out);
            assert_true(v == FLT_EV_PASS || v == FLT_EV_REPLACE);
            for (size_t i = 0; i < (v == FLT_EV_PASS ? 1 : out.n); i++) {
                const char *p = v == FLT_EV_PASS ? d : out.v[i].data;
                json_t *r = json_loads(p, 0, NULL);
                assert_non_null(r);
                json_t *rc = json_object_get(r, "choices");
                if (json_array_size(rc) != 2)
                    fail_msg("payload %s from %s", p, d);
                assert_string_equal(json_string_value(json_object_get(r, "id")), "r");
                for (int k = 0; k < 2; k++) {
                    json_t *c =
                        json_object_get(json_object_get(json_array_get(rc, k), "delta"), "content");
                    assert_true(json_is_string(c));
                    assert_int_equal(
                        sl_buf_add(&got[k], json_string_value(c), json_string_length(c)), 0);
                }
                json_decref(r);
            }
            flt_out_release(&out);
            free(d);
            json_decref(o);
        }
        flt_out_t out = {0};
        assert_int_equal(flt_stream_end(st, &out), FLT_EV_REPLACE);
        for (size_t i = 0; i < out.n; i++) {
            json_t *r = json_loads(out.v[i].data, 0, NULL);
            json_t *c0 = json_array_get(json_object_get(r, "choices"), 0);
            int k = (int)json_integer_value(json_object_get(c0, "index"));
            json_t *c = json_object_get(json_object_get(c0, "delta"), "content");
            assert_int_equal(sl_buf_add(&got[k], json_string_value(c), json_string_length(c)), 0);
            json_decref(r);
        }
        flt_out_release(&out);
        for (int k = 0; k < 2; k++) {
            sl_buf_t whole = {0};
            assert_int_equal(flt_text_filter(rs, in[k].p ? in[k].p : "", in[k].len, &whole),
                             FLT_CHAN_OK);
            assert_int_equal(got[k].len, whole.len);
            assert_memory_equal(got[k].p ? got[k].p : "", whole.p ? whole.p : "", whole.len);
            sl_buf_free(&whole);
            sl_buf_free(&in[k]);
            sl_buf_free(&got[k]);
        }
        flt_stream_free(st);
    }
    flt_ruleset_unref(rs);
}

/* The clean-piece shortcut of flt_chan_feed (nothing held, ASCII, no word
 * end, no partial word, no byte a regex may start with) against the same
 * text filtered whole: random texts of word letters, digits of the phone
 * regex and blanks, cut into random pieces. Both ways must be taken, and
 * flt_chan_feed_same (half the pieces) says "same" exactly on the shortcut. */
static void test_clean_pieces_same(void **state)
{
    (void)state;
    tf_list_t l[1] = {{"forbidden\nxy\nyo\n", FLT_ACTION_MASK, "masked"}};
    /* a lookbehind: the history kept across clean pieces must be the one
     * the full path keeps ("q" released clean, then "z" looks behind) */
    flt_conf_regex_t re[] = {{"phone", "1[3-9]\\d{9}", FLT_ACTION_MASK},
                             {"qz", "(?<=qq)z", FLT_ACTION_MASK}};
    char err[256] = "";
    flt_ruleset_t *rs = tf_build(l, 1, re, 2, NULL, err, sizeof err);
    if (!rs)
        fail_msg("build: %s", err);
    static const char alpha[] = "forbidenxy o 13892 Q... aaa ssss tttt, mmmm qqqz ";
    uint32_t seed = 777;
    unsigned clean = 0, full = 0, nsame = 0;
    for (int round = 0; round < 2000; round++) {
        char text[96];
        seed = seed * 1103515245u + 12345u;
        size_t n = (seed >> 16) % (sizeof(text) - 1);
        for (size_t i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            text[i] = alpha[(seed >> 16) % (sizeof(alpha) - 1)];
        }
        text[n] = '\0';
        flt_chan_t c;
        assert_int_equal(flt_chan_init(&c, rs), 0);
        sl_buf_t got = {0};
        size_t pos = 0;
        while (pos < n) {
            seed = seed * 1103515245u + 12345u;
            size_t k = 1 + (seed >> 16) % 8;
            if (k > n - pos)
                k = n - pos;
            unsigned before = c.nclean;
            if (seed & (1u << 8)) {
                assert_int_equal(flt_chan_feed(&c, text + pos, k, &got), FLT_CHAN_OK);
            } else {
                /* the uncopied variant: a clean piece is the caller's own
                 * text (the relay passes the event as is), out untouched */
                bool same = true;
                size_t had = got.len;
                assert_int_equal(flt_chan_feed_same(&c, text + pos, k, &got, &same), FLT_CHAN_OK);
                assert_int_equal(same, c.nclean > before);
                if (same) {
                    assert_int_equal(got.len, had);
                    assert_int_equal(sl_buf_add(&got, text + pos, k), 0);
                    nsame++;
                }
            }
            if (c.nclean > before)
                clean++;
            else
                full++;
            pos += k;
        }
        assert_int_equal(flt_chan_finish(&c, &got), FLT_CHAN_OK);
        flt_chan_fini(&c);
        sl_buf_t whole = {0};
        assert_int_equal(flt_text_filter(rs, text, n, &whole), FLT_CHAN_OK);
        if (got.len != whole.len || memcmp(got.p ? got.p : "", whole.p ? whole.p : "", got.len))
            fail_msg("\"%s\": pieces gave \"%.*s\", whole \"%.*s\"", text, (int)got.len,
                     got.p ? got.p : "", (int)whole.len, whole.p ? whole.p : "");
        sl_buf_free(&got);
        sl_buf_free(&whole);
    }
    print_message("clean pieces %u (uncopied %u), full %u\n", clean, nsame, full);
    assert_true(clean > 1000);
    assert_true(nsame > 400);
    assert_true(full > 1000);
    flt_ruleset_unref(rs);
}

static void test_stream_text_api(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n", "evil\n");
    flt_stream_t *st = flt_stream_new(rs);
    const char *rel;
    size_t rlen;
    assert_int_equal(flt_stream_text(st, 0, "plain ", 6, &rel, &rlen), FLT_EV_PASS);
    assert_int_equal(rlen, 6);
    assert_memory_equal(rel, "plain ", 6);
    /* held back: REPLACE with nothing */
    assert_int_equal(flt_stream_text(st, 0, "a bad", 5, &rel, &rlen), FLT_EV_REPLACE);
    assert_int_equal(rlen, 2);
    assert_memory_equal(rel, "a ", 2);
    assert_int_equal(flt_stream_held(st, 0), 3);
    assert_int_equal(flt_stream_text(st, 0, "word!", 5, &rel, &rlen), FLT_EV_REPLACE);
    assert_int_equal(rlen, 4);
    assert_memory_equal(rel, "***!", 4);
    /* choices are apart; invalid UTF-8 is an error, not text */
    assert_int_equal(flt_stream_text(st, 1, "ok", 2, &rel, &rlen), FLT_EV_PASS);
    assert_int_equal(flt_stream_text(st, 1, "\xc0\xaf", 2, &rel, &rlen), FLT_EV_ERROR);
    /* a block: nothing released, and the stream stays blocked */
    assert_int_equal(flt_stream_text(st, 0, "so evil", 7, &rel, &rlen), FLT_EV_BLOCK);
    assert_string_equal(flt_stream_block_rule(st), "blocked");
    assert_int_equal(flt_stream_text(st, 0, "more", 4, &rel, &rlen), FLT_EV_BLOCK);
    flt_out_t out = {0};
    const char *d = "{\"choices\":[]}";
    assert_int_equal(flt_stream_event(st, d, strlen(d), &out), FLT_EV_BLOCK);
    flt_out_release(&out);
    flt_stream_free(st);
    flt_ruleset_unref(rs);
}

/* The events of one answer through st; their payloads (the event itself on
 * PASS) joined by '|' into a string to compare (malloc'd). */
static char *recycle_run(flt_stream_t *st, const char *const *texts, size_t n)
{
    sl_buf_t b = {0};
    flt_out_t out;
    memset(&out, 0, sizeof out);
    for (size_t i = 0; i <= n; i++) {
        char *d = i < n ? chunk(texts[i], NULL) : strdup("[DONE]");
        flt_ev_verdict_t v = flt_stream_event(st, d, strlen(d), &out);
        char tag[8];
        snprintf(tag, sizeof tag, "%d:", (int)v);
        assert_int_equal(sl_buf_add(&b, tag, strlen(tag)), 0);
        if (v == FLT_EV_PASS)
            assert_int_equal(sl_buf_add(&b, d, strlen(d)), 0);
        for (size_t k = 0; k < out.n; k++)
            assert_int_equal(sl_buf_add(&b, out.v[k].data, out.v[k].len), 0);
        assert_int_equal(sl_buf_add(&b, "|", 2), 0); /* the NUL too: a string */
        b.len--;
        flt_out_reset(&out);
        free(d);
        if (v == FLT_EV_BLOCK)
            break;
    }
    flt_out_release(&out);
    return b.p;
}

/* A recycled stream (the gateway's per-thread cache) starts as a new one:
 * held text, a mask in progress, a block and the template of the stream
 * before leave nothing behind, for the same ruleset and for another one
 * (a reload: words only, then with a regex, then without). */
static void test_stream_recycle_forgets(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n", "evil\n");
    flt_conf_regex_t re[] = {{"phone", "1[3-9]\\d{9}", FLT_ACTION_MASK}};
    tf_list_t l[2] = {{"badword\n", FLT_ACTION_MASK, "masked"},
                      {"evil\n", FLT_ACTION_BLOCK, "blocked"}};
    char err[256] = "";
    flt_ruleset_t *rs_re = tf_build(l, 2, re, 1, NULL, err, sizeof err);
    assert_non_null(rs_re);
    const char *first[] = {"a bad", "wo", "x 138001", "an evil end"}; /* held, then blocked */
    const char *second[] = {"rd is ", "fine 1380013", "8000 ", "ok"};
    flt_ruleset_t *order[] = {rs, rs_re, rs_re, rs};
    flt_stream_t *st = flt_stream_new(rs);
    for (size_t round = 0; round < 4; round++) {
        flt_ruleset_t *r = order[round];
        if (round) {
            flt_stream_recycle(st);
            flt_stream_rearm(st, r);
        }
        char *got1 = recycle_run(st, first, 4);
        assert_non_null(strstr(got1, "content_filter"));
        assert_string_equal(flt_stream_block_rule(st), "blocked");
        flt_stream_recycle(st);
        flt_stream_rearm(st, r);
        assert_null(flt_stream_block_rule(st));
        assert_int_equal(flt_stream_held(st, 0), 0);
        assert_int_equal(flt_stream_template_hits(st), 0);
        char *got2 = recycle_run(st, second, 4);
        flt_stream_t *fresh = flt_stream_new(r);
        char *want2 = recycle_run(fresh, second, 4);
        assert_string_equal(got2, want2); /* "rd is " is not the end of "badword" */
        assert_null(strstr(got2, "content_filter"));
        assert_true((strstr(got2, "***") != NULL) == (r == rs_re)); /* the number, masked */
        flt_stream_free(fresh);
        free(got1);
        free(got2);
        free(want2);
    }
    flt_stream_free(st);
    flt_ruleset_unref(rs_re);
    flt_ruleset_unref(rs);
}

/* The chunks a recycled stream makes itself carry its own answer's first
 * chunk's keys (id, model), not those of the answer before it. */
static void test_stream_recycle_template_keys(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n", "evil\n");
    flt_stream_t *st = flt_stream_new(rs);
    flt_out_t out;
    memset(&out, 0, sizeof out);
    const char *a = "{\"id\":\"first-answer\",\"model\":\"m-old\",\"choices\":[{\"index\":0,"
                    "\"delta\":{\"content\":\"hello \"}}]}";
    assert_int_equal(flt_stream_event(st, a, strlen(a), &out), FLT_EV_PASS);
    flt_stream_recycle(st);
    flt_stream_rearm(st, rs);
    const char *b = "{\"id\":\"second\",\"model\":\"m-new\",\"choices\":[{\"index\":0,"
                    "\"delta\":{\"content\":\"an evil \"}}]}";
    assert_int_equal(flt_stream_event(st, b, strlen(b), &out), FLT_EV_BLOCK);
    assert_int_equal(out.n, 1);
    assert_non_null(strstr(out.v[0].data, "\"id\":\"second\""));
    assert_non_null(strstr(out.v[0].data, "\"model\":\"m-new\""));
    assert_null(strstr(out.v[0].data, "first-answer"));
    flt_out_release(&out);
    flt_stream_free(st);
    flt_ruleset_unref(rs);
}

/* A recycled channel keeps small buffers only: one that grew past
 * FLT_CHAN_KEEP (a long held text) is freed, a small one stays. */
static void test_chan_recycle_bounded(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n", NULL);
    flt_chan_t c;
    assert_int_equal(flt_chan_init(&c, rs), 0);
    sl_buf_t out = {0};
    assert_int_equal(flt_chan_feed(&c, "a bad", 5, &out), FLT_CHAN_OK);
    flt_chan_recycle(&c);
    assert_non_null(c.ob);
    assert_true(c.ocap > 0 && c.ocap <= FLT_CHAN_KEEP);
    assert_int_equal(c.olen, 0);
    assert_int_equal(c.ostart, 0);
    assert_int_equal(c.flen + c.fstart + c.ac, 0);
    assert_int_equal(c.block_rule, -1);
    assert_int_equal(flt_chan_rearm(&c, rs), 0);
    /* text that stays held (a prefix of the word repeated) grows the windows */
    char big[2000];
    for (size_t i = 0; i + 3 <= sizeof big; i += 3)
        memcpy(big + i, "bad", 3);
    size_t nb = sizeof big - sizeof big % 3;
    out.len = 0;
    assert_int_equal(flt_chan_feed(&c, big, nb, &out), FLT_CHAN_OK);
    assert_true(c.ocap > FLT_CHAN_KEEP);
    flt_chan_recycle(&c);
    assert_null(c.ob);
    assert_int_equal(c.ocap, 0);
    assert_null(c.fb);
    assert_null(c.fmap);
    assert_int_equal(c.fcap, 0);
    assert_int_equal(flt_chan_rearm(&c, rs), 0);
    out.len = 0;
    assert_int_equal(flt_chan_feed(&c, "badword x", 9, &out), FLT_CHAN_OK);
    assert_int_equal(flt_chan_finish(&c, &out), FLT_CHAN_OK);
    assert_int_equal(out.len, 5);
    assert_memory_equal(out.p, "*** x", 5);
    flt_chan_fini(&c);
    sl_buf_free(&out);
    flt_ruleset_unref(rs);
}

/* The gateway's cache of streamed requests' filter state (hook_filters.c):
 * at most GW_FLT_CACHE_MAX held; the tick frees half of what went unused,
 * all of it when told; a state taken again filters as a new one (a block
 * in the stream before does not carry over). */
static void test_flt_cache_bounded(void **state)
{
    (void)state;
    static bool metrics_done; /* the cache's gauge */
    if (!metrics_done)
        gw_metrics_init(gw_route_name);
    metrics_done = true;
    flt_ruleset_t *rs = rs_words("badword\n", "evil\n");
    size_t n = GW_FLT_CACHE_MAX + 5;
    gw_flt_t **v = calloc(n, sizeof *v);
    assert_non_null(v);
    assert_int_equal(gw_flt_cache_tick(true), 0);
    for (size_t i = 0; i < n; i++)
        assert_non_null(v[i] = gw_flt_state_get(rs));
    for (size_t i = 0; i < n; i++)
        gw_flt_state_put(v[i]);
    assert_int_equal(gw_flt_cache_held(), GW_FLT_CACHE_MAX); /* 5 freed at once */
    /* the tick after a busy one: the low mark was 0 (all were taken) */
    assert_int_equal(gw_flt_cache_tick(false), 0);
    /* none taken for a whole tick: half of them go, then half again */
    assert_int_equal(gw_flt_cache_tick(false), GW_FLT_CACHE_MAX / 2);
    assert_int_equal(gw_flt_cache_held(), GW_FLT_CACHE_MAX / 2);
    assert_int_equal(gw_flt_cache_tick(false), GW_FLT_CACHE_MAX / 4);
    /* stream 1 blocked; stream 2 (the same state, LIFO) passes clean text */
    gw_flt_t *s1 = gw_flt_state_get(rs);
    flt_out_t out;
    memset(&out, 0, sizeof out);
    char *ev = chunk("an evil ba", NULL);
    assert_int_equal(flt_stream_event(gw_flt_state_stream(s1), ev, strlen(ev), &out), FLT_EV_BLOCK);
    free(ev);
    flt_out_reset(&out);
    gw_flt_state_put(s1);
    gw_flt_t *s2 = gw_flt_state_get(rs);
    assert_ptr_equal(s2, s1);
    flt_stream_t *st = gw_flt_state_stream(s2);
    assert_null(flt_stream_block_rule(st));
    assert_int_equal(flt_stream_held(st, 0), 0);
    ev = chunk("dword is ok", NULL); /* no tail that may start a word */
    assert_int_equal(flt_stream_event(st, ev, strlen(ev), &out), FLT_EV_PASS);
    free(ev);
    flt_out_release(&out);
    gw_flt_state_put(s2);
    assert_int_equal(gw_flt_cache_held(), GW_FLT_CACHE_MAX / 4);
    assert_int_equal(gw_flt_cache_tick(true), GW_FLT_CACHE_MAX / 4);
    assert_int_equal(gw_flt_cache_held(), 0);
    free(v);
    flt_ruleset_unref(rs);
}

/* gw_payloads_t: the first GW_PAYLOADS_INLINE entries in the list itself,
 * the rest (and all of them then) in one array; order and contents kept
 * across the switch, and a list moved by value stays whole (no pointer into
 * itself). */
static void test_payloads_inline_then_ext(void **state)
{
    (void)state;
    gw_payloads_t p;
    gw_payloads_init(&p);
    char name[32];
    for (int i = 0; i < GW_PAYLOADS_INLINE + 3; i++) {
        snprintf(name, sizeof name, "p%d", i);
        assert_int_equal(gw_payloads_push_copy(&p, name, strlen(name)), 0);
        assert_int_equal(p.n, (size_t)i + 1);
        if (i < GW_PAYLOADS_INLINE)
            assert_null(p.ext); /* no allocation for the usual few */
        else
            assert_non_null(p.ext);
    }
    gw_payloads_t moved = p; /* as gw_hooks_event hands a list on */
    gw_payloads_init(&p);
    for (size_t i = 0; i < moved.n; i++) {
        snprintf(name, sizeof name, "p%zu", i);
        assert_string_equal(gw_payloads_at(&moved, i)->data, name);
        assert_int_equal(gw_payloads_at(&moved, i)->len, strlen(name));
    }
    gw_payloads_clear(&moved);
    assert_int_equal(moved.n, 0);
    assert_null(moved.ext);
    /* inline only, moved and freed: nothing of the first list is shared */
    assert_int_equal(gw_payloads_push_copy(&p, "a", 1), 0);
    moved = p;
    gw_payloads_init(&p);
    assert_string_equal(gw_payloads_at(&moved, 0)->data, "a");
    gw_payloads_clear(&p); /* empty: frees nothing */
    gw_payloads_clear(&moved);
}

/* The Responses adapter's delta events (gateway/flt_responses.c): read with
 * yajl, the delta spliced, logprobs emptied, every other byte kept. */
static void test_responses_delta_splice(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n", "evil\n");
    flt_stream_t *st = flt_stream_new(rs);
    gw_flt_resp_t *x = gw_flt_resp_new();
    gw_payloads_t out;
    memset(&out, 0, sizeof out);
    const char *e1 = "{\"type\":\"response.output_text.delta\",\"sequence_number\":4,"
                     "\"logprobs\":[{\"token\":\"badword\"}],\"item_id\":\"m1\","
                     "\"delta\" : \"a \\\"badword\\\" and bad\"}";
    assert_int_equal(gw_flt_resp_event(x, st, e1, strlen(e1), &out), GW_EV_REPLACE);
    assert_int_equal(out.n, 1);
    assert_string_equal(gw_payloads_at(&out, 0)->data,
                        "{\"type\":\"response.output_text.delta\",\"sequence_number\":4,"
                        "\"logprobs\":[],\"item_id\":\"m1\",\"delta\" : \"a \\\"***\\\" and \"}");
    gw_payloads_clear(&out);
    /* unchanged: passed as is */
    const char *e2 = "{\"type\":\"response.output_text.delta\",\"delta\":\"ly fine \"}";
    assert_int_equal(gw_flt_resp_event(x, st, e2, strlen(e2), &out), GW_EV_REPLACE);
    assert_int_equal(out.n, 1); /* "bad" was held: "badly fine " goes out now */
    assert_non_null(strstr(gw_payloads_at(&out, 0)->data, "\"delta\":\"badly fine \""));
    gw_payloads_clear(&out);
    const char *e3 = "{\"type\":\"response.output_text.delta\",\"delta\":\"ok \"}";
    assert_int_equal(gw_flt_resp_event(x, st, e3, strlen(e3), &out), GW_EV_PASS);
    assert_int_equal(out.n, 0);
    /* a block word, \u-escaped: an error event ends it */
    const char *e4 = "{\"type\":\"response.output_text.delta\",\"delta\":\"\\u0065vil\"}";
    assert_int_equal(gw_flt_resp_event(x, st, e4, strlen(e4), &out), GW_EV_STOP);
    assert_int_equal(out.n, 1);
    assert_non_null(strstr(gw_payloads_at(&out, 0)->data, "\"code\":\"content_filter\""));
    gw_payloads_clear(&out);
    gw_flt_resp_free(x);
    flt_stream_free(st);
    flt_ruleset_unref(rs);
}

static void test_response_whole(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n", "evil\n");
    json_t *b = json_loads("{\"object\":\"chat.completion\",\"choices\":["
                           "{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"a "
                           "BADWORD b\"},\"finish_reason\":\"stop\"},"
                           "{\"index\":1,\"message\":{\"role\":\"assistant\",\"content\":\"so "
                           "evil\"},\"finish_reason\":\"stop\"},"
                           "{\"index\":2,\"message\":{\"role\":\"assistant\",\"content\":\"fine\"},"
                           "\"finish_reason\":\"stop\"}]}",
                           0, NULL);
    bool mod = false;
    assert_int_equal(flt_response_filter(rs, b, &mod), 0);
    assert_true(mod);
    json_t *ch = json_object_get(b, "choices");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_array_get(ch, 0), "message"), "content")),
                        "a *** b");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_array_get(ch, 1), "message"), "content")),
                        "");
    assert_string_equal(json_string_value(json_object_get(json_array_get(ch, 1), "finish_reason")),
                        "content_filter");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_array_get(ch, 2), "message"), "content")),
                        "fine");
    json_decref(b);
    flt_ruleset_unref(rs);
}

/* ---- the Responses adapter's byte reader against its tree path ---------- */

/* One stream's events through gw_flt_resp_event (delta shapes kept as in
 * the gateway) and then, with a stream state of its own, through the paths
 * it replaces: gw_flt_resp_event_tree (a jansson tree, the path every
 * event but the deltas once took) and, for the deltas, gw_flt_resp_event
 * with no shape kept (yajl reads each: their byte path is older than this
 * reader, and splices a released text into the upstream's event where the
 * tree path writes a new one). Each verdict, each payload's bytes and the
 * count the same. Stops after a STOP. Returns the deltas read through a
 * shape. */
static uint64_t resp_same(flt_ruleset_t *rs, const char *const *ev, size_t n)
{
    enum { MAXEV = 64, MAXP = 8 };
    assert_true(n <= MAXEV);
    gw_ev_rc_t rc[MAXEV];
    size_t np[MAXEV];
    char *pl[MAXEV][MAXP];
    size_t pn[MAXEV][MAXP];
    size_t ran = 0;
    gw_flt_resp_shapes_clear();
    flt_stream_t *st = flt_stream_new(rs);
    gw_flt_resp_t *x = gw_flt_resp_new();
    assert_true(st && x);
    for (size_t i = 0; i < n; i++) {
        gw_payloads_t out;
        gw_payloads_init(&out);
        rc[i] = gw_flt_resp_event(x, st, ev[i], strlen(ev[i]), &out);
        assert_true(out.n <= MAXP);
        np[i] = out.n;
        for (size_t k = 0; k < out.n; k++) {
            const gw_payload_t *p = gw_payloads_at(&out, k);
            pl[i][k] = malloc(p->len + 1);
            memcpy(pl[i][k], p->data, p->len);
            pn[i][k] = p->len;
        }
        gw_payloads_clear(&out);
        ran = i + 1;
        if (rc[i] == GW_EV_STOP)
            break;
    }
    uint64_t hits = gw_flt_resp_shape_hits();
    gw_flt_resp_free(x);
    flt_stream_free(st);
    st = flt_stream_new(rs);
    x = gw_flt_resp_new();
    for (size_t i = 0; i < ran; i++) {
        gw_payloads_t out;
        gw_payloads_init(&out);
        size_t len = strlen(ev[i]);
        gw_ev_rc_t b;
        if (strstr(ev[i], "\"type\":\"response.output_text.delta\"")) {
            gw_flt_resp_shapes_clear();
            b = gw_flt_resp_event(x, st, ev[i], len, &out);
        } else {
            b = gw_flt_resp_event_tree(x, st, ev[i], len, &out);
        }
        if (rc[i] != b || np[i] != out.n)
            fail_msg("event %zu %s: rc %d/%d, %zu/%zu payloads", i, ev[i], rc[i], b, np[i], out.n);
        for (size_t k = 0; k < out.n; k++) {
            const gw_payload_t *q = gw_payloads_at(&out, k);
            if (pn[i][k] != q->len || memcmp(pl[i][k], q->data, q->len) != 0)
                fail_msg("event %zu payload %zu:\n%.*s\nvs the reference's\n%.*s", i, k,
                         (int)pn[i][k], pl[i][k], (int)q->len, q->data);
        }
        gw_payloads_clear(&out);
    }
    for (size_t i = 0; i < ran; i++)
        for (size_t k = 0; k < np[i]; k++)
            free(pl[i][k]);
    gw_flt_resp_free(x);
    flt_stream_free(st);
    return hits;
}

#define RESP_ITEM(text)                                                                            \
    "{\"id\":\"msg_1\",\"type\":\"message\",\"status\":\"completed\",\"role\":\"assistant\","      \
    "\"content\":[{\"type\":\"output_text\",\"text\":\"" text "\",\"annotations\":[]}]}"
#define RESP_EV(type, rest) "{\"type\":\"" type "\",\"sequence_number\":1," rest "}"
#define RESP_DELTA(d)                                                                              \
    RESP_EV("response.output_text.delta",                                                          \
            "\"item_id\":\"msg_1\",\"output_index\":0,"                                            \
            "\"content_index\":0,\"delta\":\"" d "\",\"logprobs\":[]")
#define RESP_DONES(text)                                                                           \
    RESP_EV("response.output_text.done",                                                           \
            "\"item_id\":\"msg_1\",\"output_index\":0,"                                            \
            "\"content_index\":0,\"text\":\"" text "\",\"logprobs\":[]"),                          \
        RESP_EV("response.content_part.done",                                                      \
                "\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"part\":{\"type\":" \
                "\"output_text\",\"text\":\"" text "\",\"annotations\":[]}"),                      \
        RESP_EV("response.output_item.done", "\"output_index\":0,\"item\":" RESP_ITEM(text)),      \
        RESP_EV(                                                                                   \
            "response.completed",                                                                  \
            "\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"created_at\":1700000000,"   \
            "\"status\":\"completed\",\"output\":[" RESP_ITEM(                                     \
                text) "],\"usage\":{"                                                              \
                      "\"input_tokens\":9,\"output_tokens\":-3,\"total_tokens\":12}}")
#define RESP_HEAD                                                                                  \
    RESP_EV("response.created", "\"response\":{\"id\":\"resp_1\",\"output\":[],\"usage\":null}"),  \
        RESP_EV("response.output_item.added",                                                      \
                "\"output_index\":0,\"item\":{\"id\":\"msg_1\",\"content\":[]}"),                  \
        RESP_EV("response.content_part.added",                                                     \
                "\"item_id\":\"msg_1\",\"part\":{\"type\":\"output_text\",\"text\":\"\"}")

static void test_responses_bytes_same_as_tree(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n", "evil\n");
    /* compact, as OpenAI sends it: the done events go as they came */
    static const char *const plain[] = {RESP_HEAD, RESP_DELTA("The sea "), RESP_DELTA(""),
                                        RESP_DELTA("is calm."), RESP_DONES("The sea is calm.")};
    /* escapes jansson writes as they are, raw non-ASCII, and ones it writes
     * otherwise (\u, \/) */
    static const char *const esc[] = {
        RESP_HEAD, RESP_DELTA("a \\\"b\\\"\\n\\tc\\\\ caf\xc3\xa9 \xe6\x95\x8f "),
        RESP_DONES("a \\\"b\\\"\\n\\tc\\\\ caf\xc3\xa9 \xe6\x95\x8f ")};
    static const char *const uesc[] = {RESP_DELTA("caf\\u00e9 a\\/b"),
                                       RESP_DONES("caf\\u00e9 a\\/b")};
    /* a masked word: the done events carry the upstream's text, replaced */
    static const char *const masked[] = {RESP_HEAD, RESP_DELTA("a bad"), RESP_DELTA("word here"),
                                         RESP_DONES("a badword here")};
    /* the same with each done type written with a \\u escape (jansson
     * reads the type it spells: no event passes unread for its bytes; a
     * delta's splice is the fast path's own, compared in shaped below) */
    static const char *const masked_esc[] = {
        RESP_HEAD,
        RESP_DELTA("a bad"),
        RESP_DELTA("word here"),
        RESP_EV("response.output_text.\\u0064one", "\"text\":\"a badword here\""),
        RESP_EV("response.content_part.d\\u006fne",
                "\"part\":{\"type\":\"output_text\",\"text\":\"a badword here\"}"),
        RESP_EV("response.output_item.don\\u0065", "\"item\":" RESP_ITEM("a badword here")),
        RESP_EV("response.in\\u0063omplete",
                "\"response\":{\"output\":[" RESP_ITEM("a badword here") "]}"),
        RESP_EV("response\\u002ecompleted",
                "\"response\":{\"output\":[" RESP_ITEM("a badword here") "]}")};
    /* a word held at the end: text_done flushes it first */
    static const char *const held[] = {RESP_DELTA("so bad"), RESP_DONES("so bad")};
    /* the done texts not the text sent (an upstream's own), or missing */
    static const char *const other[] = {
        RESP_DELTA("one"),
        RESP_DONES("two"),
        RESP_EV("response.content_part.done", "\"part\":{\"type\":\"output_text\"}"),
        RESP_EV("response.content_part.done", "\"part\":{\"type\":\"refusal\",\"text\":\"x\"}"),
        RESP_EV("response.content_part.done", "\"part\":[1]"),
        RESP_EV("response.output_item.done", "\"item\":{\"id\":\"m\"}"),
        RESP_EV("response.output_item.done", "\"item\":{\"content\":{\"type\":\"output_text\"}}"),
        RESP_EV(
            "response.output_item.done",
            "\"item\":{\"content\":[1,{\"type\":\"output_text\",\"text\":7},{\"text\":\"x\"}]}"),
        RESP_EV("response.completed", "\"response\":{\"status\":\"completed\"}"),
        RESP_EV("response.incomplete", "\"response\":{\"output\":[{\"content\":[]},3]}"),
        RESP_EV("response.completed.extra", "\"response\":{\"output\":[]}"),
        RESP_EV("response.output_text.done", "\"item_id\":\"m\""),
        RESP_EV("response.output_text.done", "\"text\":null")};
    /* what jansson writes differently: blanks, reals, -0, big integers,
     * duplicate keys; JSON either refuses; other types and shapes */
    static const char *const odd[] = {
        RESP_DELTA("abc"),
        "{\"type\": \"response.content_part.done\", \"part\": {\"type\": \"output_text\", "
        "\"text\": \"abc\"}}",
        RESP_EV("response.output_item.done", "\"x\":1.5,\"item\":" RESP_ITEM("abc")),
        RESP_EV("response.output_item.done", "\"x\":-0,\"item\":" RESP_ITEM("abc")),
        RESP_EV("response.output_item.done", "\"x\":1e3,\"item\":" RESP_ITEM("abc")),
        RESP_EV("response.output_item.done",
                "\"x\":1234567890123456789,\"item\":" RESP_ITEM("abc")),
        RESP_EV("response.output_item.done", "\"item\":" RESP_ITEM("abc") ",\"item\":{}"),
        RESP_EV("response.content_part.done",
                "\"part\":{\"type\":\"output_text\",\"text\":\"abc\",\"type\":\"x\"}"),
        RESP_EV("response.content_part.done",
                "\"part\":{\"t\\u0079pe\":\"output_text\",\"text\":\"abc\"}"),
        "[{\"type\":\"response.content_part.done\"}]",
        "{\"type\":\"response.created\"} \"x",
        "{\"type\":\"response.created\"}{",
        "{\"type\":\"response.created\"} \r\n",
        "{\"type\":\"response.content_part.done\",\"part\":{\"type\":\"output_text\",\"text\":"
        "\"abc\"}}\n",
        "7",
        "{\"type\":7,\"part\":{}}",
        "{\"type\":\"response.content_part.done\",\"type\":\"response.created\"}",
        RESP_EV("response.in_progress", "\"response\":{\"x\":1.25}"),
        RESP_EV("error", "\"code\":\"x\",\"message\":\"y\""),
        "{\"type\":\"response.content_part.done\",\"a\":{\"b\":{\"c\":{\"d\":{\"e\":{\"f\":{\"g\":"
        "{\"h\":{\"i\":{\"j\":{\"k\":{\"l\":{\"m\":1}}}}}}}}}}}}},\"part\":{\"type\":\"output_"
        "text\","
        "\"text\":\"abc\"}}",
        RESP_DONES("abc")};
    /* a block word: the stream ends at it */
    static const char *const blocked[] = {RESP_HEAD, RESP_DELTA("so e"), RESP_DELTA("vil"),
                                          RESP_DONES("so evil")};
    static const char *const blocked_done[] = {RESP_DELTA("so e"), RESP_DONES("so e")};
    /* deltas of one shape: escapes in the hole, \\u0000 (no shape's), logprobs
     * before and after the delta while a masked word moves the splice */
    static const char *const shaped[] = {
        RESP_DELTA("one "),
        RESP_DELTA(""),
        RESP_DELTA("a \\\"q\\\" caf\\u00e9 "),
        RESP_DELTA("\\ud83d\\ude00 "),
        RESP_DELTA("bad"),
        RESP_DELTA("word and badword "),
        "{\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"logprobs\":[{\"t\":1}],"
        "\"item_id\":\"m\",\"delta\":\"a\"}",
        "{\"type\":\"response.output_text.delta\",\"sequence_number\":123,\"logprobs\":[{\"t\":1}],"
        "\"item_id\":\"mmm\",\"delta\":\"bb badword\"}",
        "{\"type\":\"response.output_text.delta\",\"sequence_number\":-5,\"logprobs\":[{\"t\":1}],"
        "\"item_id\":\"\",\"delta\":\"c badword c\"}",
        RESP_DELTA("badword"),
        RESP_DONES("...")};
    assert_true(resp_same(rs, shaped, SL_ARRAY_LEN(shaped)) >= 6);
    assert_true(resp_same(rs, plain, SL_ARRAY_LEN(plain)) >= 1);
    resp_same(rs, esc, SL_ARRAY_LEN(esc));
    resp_same(rs, uesc, SL_ARRAY_LEN(uesc));
    resp_same(rs, masked, SL_ARRAY_LEN(masked));
    resp_same(rs, masked_esc, SL_ARRAY_LEN(masked_esc));
    resp_same(rs, held, SL_ARRAY_LEN(held));
    resp_same(rs, other, SL_ARRAY_LEN(other));
    resp_same(rs, odd, SL_ARRAY_LEN(odd));
    resp_same(rs, blocked, SL_ARRAY_LEN(blocked));
    resp_same(rs, blocked_done, SL_ARRAY_LEN(blocked_done));
    flt_ruleset_unref(rs);
}

/* An event jansson refuses, when an acting type may be read from it,
 * stops the stream with the content_filter error (fuzz_resp_stream found
 * the tree path passing them as they came): a client's parser may take
 * what jansson refuses and show a text no rule saw ("badword\u0000", a
 * second "delta" in an event with a number beyond int64). On both paths;
 * an event no acting type can be read from still passes. */
static void test_responses_unreadable_fail_closed(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n", "evil\n");
    static const char *const refused[] = {
        RESP_DELTA("badword\\u0000"),
        RESP_DELTA("ok \\ud800"),
        "{\"type\":\"response.output_text.delta\",\"n\":123456789012345678901,\"delta\":\"x\","
        "\"delta\":\"badword\"}",
        "{\"type\":\"response.output_text.delta\",\"sequence_number\":9223372036854775808,"
        "\"delta\":\"badword\"}",
        "{\"type\":\"response.output_text.delta\",\"x\":1e999,\"delta\":\"badword\"}",
        "{\"type\":\"response.output_text.delta\",\"item_id\":\"\xed\xa0\x80\",\"delta\":"
        "\"badword\"}",
        "{\"type\":\"response.output_text.delta\",\"item_id\":\"\xc0\xaf\",\"delta\":\"badword\"}",
        "{\"type\":\"response.output_text.delta\",\"k\\u0000\":1,\"delta\":\"badword\"}",
        "{\"type\":\"response.output_text.delta\",\"delta\":\"badword\"} x",
        "\",\"{\"type\":\"response.output_text.delta\",\"delta\":\"badword\"}",
        "7 {\"type\":\"response.output_text.delta\",\"delta\":\"badword\"}",
        "[]{\"type\":\"response.output_text.delta\",\"delta\":\"badword\"}",
        "\v{\"type\":\"response.output_text.delta\",\"delta\":\"badword\"}",
        "{\"type\":\"response.output_text.delta\",\f\"delta\":\"badword\"}",
        RESP_EV("response.output_text.done", "\"text\":\"ok \"\v"),
        RESP_EV("response.output_text.done", "\"text\":\"ok badword\\u0000\""),
        RESP_EV("response.content_part.done",
                "\"part\":{\"type\":\"output_text\",\"text\":\"a\\u0000\"}"),
        RESP_EV("response.output_item.done",
                "\"x\":123456789012345678901,\"item\":" RESP_ITEM("ok badword")),
        RESP_EV("response.refusal.delta", "\"delta\":\"\\udc00\""),
        "{\"type\":\"response.content_part.done\",\"part\":{\"type\":\"output_text\",\"text\":"
        "\"abc\"}",
        "{\"type\":\"response.content_part.done\",\"part\":{}}{\"type\":\"x\"}",
        "{\"type\":\"response.content_part.done\",\"part\":{}} x",
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(refused); i++) {
        const char *const ev[] = {RESP_DELTA("ok "), refused[i]};
        flt_stream_t *st = flt_stream_new(rs);
        gw_flt_resp_t *x = gw_flt_resp_new();
        gw_payloads_t out;
        for (size_t k = 0; k < 2; k++) {
            gw_payloads_init(&out);
            gw_ev_rc_t rc = gw_flt_resp_event(x, st, ev[k], strlen(ev[k]), &out);
            if (k == 0)
                assert_int_equal(rc, GW_EV_PASS);
            else if (rc != GW_EV_STOP || out.n != 1 ||
                     !strstr(gw_payloads_at(&out, 0)->data, "\"code\":\"content_filter\""))
                fail_msg("event %zu %s: rc %d, %zu payloads", i, ev[k], rc, out.n);
            gw_payloads_clear(&out);
        }
        gw_flt_resp_free(x);
        flt_stream_free(st);
        resp_same(rs, ev, 2);
    }
    /* a delta after its item finished is dropped unread, but not one that
     * is not UTF-8 (the tree path cannot read it either) */
    static const char *const late[] = {RESP_DELTA("ok "),
                                       RESP_EV("response.output_text.done", "\"text\":\"ok \""),
                                       RESP_DELTA("late"), RESP_DELTA("la\xc0\xafte")};
    flt_stream_t *st = flt_stream_new(rs);
    gw_flt_resp_t *x = gw_flt_resp_new();
    gw_ev_rc_t want[] = {GW_EV_PASS, GW_EV_REPLACE, GW_EV_REPLACE, GW_EV_STOP};
    for (size_t k = 0; k < SL_ARRAY_LEN(late); k++) {
        gw_payloads_t out;
        gw_payloads_init(&out);
        assert_int_equal(gw_flt_resp_event(x, st, late[k], strlen(late[k]), &out), want[k]);
        assert_int_equal(out.n, k == 2 ? 0 : k == 0 ? 0 : 1);
        gw_payloads_clear(&out);
    }
    gw_flt_resp_free(x);
    flt_stream_free(st);
    resp_same(rs, late, SL_ARRAY_LEN(late));
    /* no acting type in it: passed, whatever jansson makes of it */
    static const char *const passed[] = {RESP_DELTA("ok "), "{\"type\":\"response.created\"} x",
                                         "{\"type\":\"response.created\",\"x\":\"\xc0\xaf\"}",
                                         RESP_DELTA("badword")};
    resp_same(rs, passed, SL_ARRAY_LEN(passed));
    flt_ruleset_unref(rs);
}

/* The events no acting type can be read from go unparsed; every other one
 * is read (and the byte compare above holds for both). */
static void test_responses_unread_events(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n", "evil\n");
    flt_stream_t *st = flt_stream_new(rs);
    gw_flt_resp_t *x = gw_flt_resp_new();
    static const struct {
        const char *ev;
        unsigned read; /* 1: parsed with yajl */
    } cases[] = {
        {RESP_EV("response.created", "\"response\":{\"id\":\"r\",\"model\":\"gpt-4.1\"}"), 0},
        {RESP_EV("response.in_progress", "\"response\":{\"status\":\"in_progress\"}"), 0},
        {RESP_EV("response.output_item.added", "\"item\":{\"id\":\"m\",\"content\":[]}"), 0},
        {RESP_EV("response.content_part.added", "\"part\":{\"type\":\"output_text\"}"), 0},
        {"{\"type\":\"response.created\",", 0}, /* refused JSON: passed either way */
        {RESP_EV("response.created", "\"note\":\"x.done\""), 1},
        {RESP_EV("response.created", "\"note\":\"x\\n\""), 1},
        {RESP_EV("response.output_text.done", "\"text\":\"\""), 1},
        {RESP_EV("response.content_part.done", "\"part\":{}"), 1},
        {RESP_EV("response.output_item.done", "\"item\":{}"), 1},
        {RESP_EV("response.completed", "\"response\":{}"), 1},
        {RESP_EV("response.incomplete", "\"response\":{}"), 1},
        {RESP_EV("response.refusal.delta", "\"delta\":\"no\""), 1},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        gw_payloads_t out;
        gw_payloads_init(&out);
        uint64_t before = gw_flt_resp_scans();
        gw_ev_rc_t rc = gw_flt_resp_event(x, st, cases[i].ev, strlen(cases[i].ev), &out);
        if (gw_flt_resp_scans() - before != cases[i].read)
            fail_msg("event %zu %s: read %u times, want %u", i, cases[i].ev,
                     (unsigned)(gw_flt_resp_scans() - before), cases[i].read);
        if (!cases[i].read)
            assert_int_equal(rc, GW_EV_PASS);
        gw_payloads_clear(&out);
    }
    gw_flt_resp_free(x);
    flt_stream_free(st);
    flt_ruleset_unref(rs);
}

/* The done events' kept shapes: a later stream of the same form is
 * answered from them (no parse), byte for byte as the tree path answers;
 * texts not the text sent, -0, invalid UTF-8 and a changed type miss them;
 * valid UTF-8 hits. */
static void test_responses_done_shapes(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n", "evil\n");
    static const char *const first[] = {RESP_HEAD, RESP_DELTA("The sea "), RESP_DELTA("is calm."),
                                        RESP_DONES("The sea is calm.")};
    static const char *const again[] = {RESP_HEAD, RESP_DELTA("A longer "),
                                        RESP_DELTA("answer, this time."),
                                        RESP_DONES("A longer answer, this time.")};
    static const char *const masked[] = {RESP_DELTA("a bad"), RESP_DELTA("word here"),
                                         RESP_DONES("a badword here")};
    static const char *const other[] = {RESP_DELTA("one"), RESP_DONES("two")};
    static const char *const utf8[] = {RESP_DELTA("caf\xc3\xa9"), RESP_DONES("caf\xc3\xa9")};
    static const char *const odd[] = {
        RESP_DELTA("abc"),
        "{\"type\":\"response.output_text.done\",\"sequence_number\":-0,\"item_id\":\"msg_1\","
        "\"output_index\":0,\"content_index\":0,\"text\":\"abc\",\"logprobs\":[]}",
        "{\"type\":\"response.content_part.done\",\"sequence_number\":1,\"item_id\":\"msg_\xff\","
        "\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":"
        "\"abc\",\"annotations\":[]}}",
        "{\"type\":\"response.content_part.done\",\"sequence_number\":1,\"item_id\":\"msg_1\","
        "\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"output_texx\",\"text\":"
        "\"zzz\",\"annotations\":[]}}"};
    gw_flt_resp_dshapes_clear();
    resp_same(rs, first, SL_ARRAY_LEN(first));
    uint64_t h0 = gw_flt_resp_dshape_hits();
    resp_same(rs, again, SL_ARRAY_LEN(again));
    /* the four done events answered from their shapes (a hit: no parse) */
    assert_int_equal(gw_flt_resp_dshape_hits() - h0, 4);
    h0 = gw_flt_resp_dshape_hits();
    resp_same(rs, masked, SL_ARRAY_LEN(masked));
    resp_same(rs, other, SL_ARRAY_LEN(other));
    resp_same(rs, odd, SL_ARRAY_LEN(odd));
    assert_int_equal(gw_flt_resp_dshape_hits() - h0, 0);
    /* valid UTF-8 in the holes: hits again */
    resp_same(rs, utf8, SL_ARRAY_LEN(utf8));
    assert_int_equal(gw_flt_resp_dshape_hits() - h0, 4);
    gw_flt_resp_dshapes_clear();
    flt_ruleset_unref(rs);
}

/* The finish chunk the byte reader feeds for a text_done is the one the
 * tree path packs. */
static void test_responses_finish_chunk(void **state)
{
    (void)state;
    json_t *c = json_pack("{s:[{s:i, s:{s:s?}, s:s?}]}", "choices", "index", 0, "delta", "content",
                          NULL, "finish_reason", "stop");
    char *s = json_dumps(c, JSON_COMPACT);
    assert_string_equal(
        s, "{\"choices\":[{\"index\":0,\"delta\":{\"content\":null},\"finish_reason\":\"stop\"}]}");
    free(s);
    json_decref(c);
}

/* A string input checked from the scanner's text gives the tree path's
 * verdict and result, or EDIT where the tree path edited it. */
static void test_responses_request_text(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n", "evil\n");
    static const char *const inputs[] = {"hello",       "",        "caf\xc3\xa9 \"q\"\n",
                                         "a badword b", "so evil", "\xe6\x95\x8f evil"};
    for (size_t i = 0; i < SL_ARRAY_LEN(inputs); i++) {
        json_t *body = json_pack("{s:s, s:s}", "model", "m", "input", inputs[i]);
        flt_req_result_t a, b;
        sl_text_t in = {inputs[i], strlen(inputs[i])};
        flt_req_verdict_t va = gw_flt_resp_request_text(rs, &in, &a);
        flt_req_verdict_t vb = gw_flt_resp_request(rs, body, &b);
        if (va == FLT_REQ_EDIT) {
            assert_int_equal(vb, FLT_REQ_OK);
            assert_true(b.modified);
        } else {
            assert_int_equal(va, vb);
            assert_int_equal(a.status, b.status);
            assert_false(b.modified);
            assert_string_equal(a.code ? a.code : "", b.code ? b.code : "");
            assert_string_equal(a.param ? a.param : "", b.param ? b.param : "");
            assert_string_equal(a.message, b.message);
        }
        json_decref(body);
    }
    /* a list of items: not read, as on the tree */
    flt_req_result_t r;
    assert_int_equal(gw_flt_resp_request_text(rs, NULL, &r), FLT_REQ_OK);
    assert_int_equal(r.status, 0);
    flt_ruleset_unref(rs);
}

/* A whole answer through gw_flt_resp_body_bytes and through the tree path
 * it replaces (gw_hooks_body_bytes: json_loadb, gw_flt_resp_body, a compact
 * dump when modified, the bytes as they came when not JSON): the same
 * bytes go out. Returns how the byte reader answered (0 or 1). */
static int resp_body_same(flt_ruleset_t *rs, const char *a)
{
    size_t len = strlen(a);
    char *o = NULL;
    size_t on = 0;
    int rc = gw_flt_resp_body_bytes(rs, a, len, &o, &on);
    assert_true(rc == 0 || rc == 1);
    json_t *j = json_loadb(a, len, 0, NULL);
    char *want = NULL;
    if (j) {
        bool m = false;
        assert_int_equal(gw_flt_resp_body(rs, j, &m), 0);
        if (m)
            want = json_dumps(j, JSON_COMPACT);
        json_decref(j);
    }
    if (rc == 0) {
        const char *got = o ? o : a;
        const char *w = want ? want : a;
        if (strlen(w) != (o ? on : len) || strcmp(got, w) != 0)
            fail_msg("answer %s:\nbytes %s\ntree  %s", a, got, w);
    }
    free(o);
    free(want);
    return rc;
}

#define RESP_BODY(texts)                                                                           \
    "{\"id\":\"resp_1\",\"object\":\"response\",\"created_at\":1700000000,\"status\":"             \
    "\"completed\","                                                                               \
    "\"output\":[" texts "],\"usage\":{\"input_tokens\":9,\"output_tokens\":-3}}"
#define RESP_MSG(parts) "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[" parts "]}"
#define RESP_PART(text) "{\"type\":\"output_text\",\"text\":\"" text "\",\"annotations\":[]}"

static void test_responses_body_bytes_same_as_tree(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\n", "evil\n");
    /* read as bytes (0): clean, masked, blocked, several parts and items,
     * escapes, non-ASCII, shapes the tree path skips too */
    static const char *const bytes[] = {
        RESP_BODY(RESP_MSG(RESP_PART("The sea is calm."))),
        RESP_BODY(RESP_MSG(RESP_PART("a badword b"))),
        RESP_BODY(RESP_MSG(RESP_PART("so evil"))),
        RESP_BODY(RESP_MSG(RESP_PART("one") "," RESP_PART("two badword")) "," RESP_MSG(
            RESP_PART("three") ",{\"type\":\"refusal\",\"text\":\"badword\"}")),
        RESP_BODY(RESP_MSG(RESP_PART("a \\\"q\\\"\\n\\t caf\xc3\xa9 \xe6\x95\x8f \\/ badword"))),
        RESP_BODY(RESP_MSG("1,{\"text\":7},{\"text\":null},[]") ",3,{\"content\":{}}"),
        RESP_BODY(""),
        RESP_BODY(RESP_MSG(
            RESP_PART("1") "," RESP_PART("2") "," RESP_PART("3") "," RESP_PART("4") "," RESP_PART("5") "," RESP_PART("6") "," RESP_PART(
                "7") "," RESP_PART("8") "," RESP_PART("9")) "," RESP_MSG(RESP_PART("10 badword") "," RESP_PART("11 evil"))),
        "{\"output\": [ {\"content\": [ {\"text\": \"x badword\"} ] } ], \"n\": 1.5e3}",
        "{\"status\":\"completed\"}",
        "{\"output\":[{\"content\":[{\"text\":\"a badword\"}]}]}\n ",
        "[1,2]",
        "{\"output\":[{\"content\":[{\"text\":\"ok\",\"text2\":\"badword\"}]}],"
        "\"output2\":[{\"content\":[{\"text\":\"badword\"}]}]}",
    };
    /* left to the tree path (1): JSON jansson might read otherwise */
    static const char *const tree[] = {
        RESP_BODY(RESP_MSG(RESP_PART("caf\\u00e9 badword"))),
        RESP_BODY(RESP_MSG(RESP_PART("a\\u0000"))),
        "{\"output\":[],\"n\":123456789012345678901,\"t\":\"badword\"}",
        "{\"output\":[],\"n\":1e999,\"t\":\"badword\"}",
        "{\"output\":[{\"content\":[{\"text\":\"ok\",\"text\":\"badword\"}]}]}",
        "{\"output\":[{\"content\":[],\"content\":[{\"text\":\"badword\"}]}]}",
        "{\"output\":[],\"output\":[{\"content\":[{\"text\":\"badword\"}]}]}",
        "{\"output\":[{\"content\":[{\"text\":\"badword\"}]}]",
        "not json \"badword\"",
        "{\"output\":[]}{\"output\":[{\"content\":[{\"text\":\"badword\"}]}]}",
        "{\"output\":[]} x \"badword\"",
        "\"badword\"",
    };
    /* no string with a candidate (flt_answer_bytes_clean): as they came
     * (0, nothing written), whatever jansson or yajl would make of them */
    static const char *const clean[] = {
        RESP_BODY(RESP_MSG(RESP_PART("The sea is calm."))),
        "{\"output\":[],\"n\":123456789012345678901}",
        "{\"output\":[],\"n\":1e999}",
        "{\"output\":[{\"content\":[{\"text\":\"ok\",\"text\":\"fine\"}]}]}",
        "{\"output\":[]} x",
        "not json",
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(bytes); i++)
        if (resp_body_same(rs, bytes[i]) != 0)
            fail_msg("answer %zu left to the tree: %s", i, bytes[i]);
    for (size_t i = 0; i < SL_ARRAY_LEN(tree); i++)
        if (resp_body_same(rs, tree[i]) != 1)
            fail_msg("answer %zu read as bytes: %s", i, tree[i]);
    for (size_t i = 0; i < SL_ARRAY_LEN(clean); i++) {
        char *o = NULL;
        size_t on = 0;
        assert_int_equal(gw_flt_resp_body_bytes(rs, clean[i], strlen(clean[i]), &o, &on), 0);
        assert_null(o);
        assert_int_equal(resp_body_same(rs, clean[i]), 0);
    }
    /* a deep answer is jansson's to refuse */
    char deep[400] = "{\"t\":\"badword\",\"output\":";
    for (int i = 0; i < 70; i++)
        strcat(deep, "[");
    for (int i = 0; i < 70; i++)
        strcat(deep, "]");
    strcat(deep, "}");
    assert_int_equal(resp_body_same(rs, deep), 1);
    flt_ruleset_unref(rs);
}

/* Events shaped like the last one are read through its template: for any
 * sequence (valid, invalid or other-shaped middles) the verdicts and the
 * payloads are byte for byte those of reading every event whole. */
static void test_sse_template_same(void **state)
{
    (void)state;
    flt_ruleset_t *rs = rs_words("badword\nxy\n", "evil\n");
    static const char *const mid[] = {
        "a",         "bad", "word",    " ",   "\\\"", "\\n",  "\\u00e9",      "é",     "敏",
        "\\u0062ad", "x",   "y",       "ev",  "il",   "\x01", "\xc0\xaf",     "\\q",   "\\ud800",
        "\"",        "\\",  "\\u0000", "\\/", "o",    "r",    "\"},\"x\":\"", "\"}}]}"};
    static const char *const shapes[] = {
        "{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"choices\":[{"
        "\"index\":0,\"delta\":{\"content\":\"%s\"},\"finish_reason\":null}]}",
        "{\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"},"
        "\"logprobs\":{\"c\":[1]}}]}",
        "{\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"},"
        "\"finish_reason\":\"stop\"}],\"usage\":{\"total_tokens\":3}}",
        "{\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\",\"content\":\"x\"}}"
        "]}",
        "{\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"}}]} x",
    };
    uint32_t seed = 777;
    size_t hits = 0;
    for (int round = 0; round < 1000; round++) {
        flt_stream_t *a = flt_stream_new(rs), *b = flt_stream_new(rs);
        flt_stream_template(b, false);
        for (int ev = 0; ev < 16; ev++) {
            char text[96] = "", d[512];
            seed = seed * 1103515245u + 12345u;
            int len = (int)(seed >> 16) % 4;
            for (int j = 0; j < len; j++) {
                seed = seed * 1103515245u + 12345u;
                strcat(text, mid[(seed >> 16) % SL_ARRAY_LEN(mid)]);
            }
            seed = seed * 1103515245u + 12345u;
            unsigned r = (seed >> 16) % 16;
            size_t shape = r < 11 ? 0 : r - 11 < SL_ARRAY_LEN(shapes) ? r - 11 : 0;
            snprintf(d, sizeof d, shapes[shape], text);
            flt_out_t oa = {0}, ob = {0};
            flt_ev_verdict_t va = flt_stream_event(a, d, strlen(d), &oa);
            flt_ev_verdict_t vb = flt_stream_event(b, d, strlen(d), &ob);
            if (va != vb || oa.n != ob.n)
                fail_msg("round %d event %d: %d/%zu vs %d/%zu for %s", round, ev, va, oa.n, vb,
                         ob.n, d);
            for (size_t i = 0; i < oa.n; i++)
                if (oa.v[i].len != ob.v[i].len || memcmp(oa.v[i].data, ob.v[i].data, oa.v[i].len))
                    fail_msg("round %d event %d payload %zu: %s vs %s", round, ev, i, oa.v[i].data,
                             ob.v[i].data);
            flt_out_release(&oa);
            flt_out_release(&ob);
        }
        hits += flt_stream_template_hits(a);
        assert_int_equal(flt_stream_template_hits(b), 0);
        flt_stream_free(a);
        flt_stream_free(b);
    }
    /* the shortcut did run (an event after a block is not read at all) */
    if (hits < 300)
        fail_msg("template used %zu times", hits);
    flt_ruleset_unref(rs);
}

/* ---- shapes kept across streams ---------------------------------------------- */

static uint32_t shape_rnd(uint32_t *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return *seed >> 16;
}

static const char *shape_pick(uint32_t *seed, const char *const *v, size_t n)
{
    return v[shape_rnd(seed) % n];
}

#define SHAPE_PICK(seed, v) shape_pick(seed, v, SL_ARRAY_LEN(v))

/* One event of a random stream: a usual shape (role delta, content delta,
 * finish, usage, completions text) with new top-level values and text, or
 * one changed where a shape must miss: an escape in a hole, a float or a
 * 19-digit integer where an integer was, another finish_reason, logprobs,
 * a second choice, an invalid byte, a key the parse reads twice. */
static void shape_event(uint32_t *seed, char *d, size_t cap)
{
    static const char *const ids[] = {
        "chatcmpl-1", "chatcmpl-2b9c", "x",      "",     "chatcmpl-\\u0041",
        "é",          "\xc0\xaf",      "a\\\"b", "\x80", "\xe4\xb8",
    };
    static const char *const created[] = {
        "1",   "1700000000",         "1718000001",          "0",  "-3",    "1.5",
        "1e3", "123456789012345678", "1234567890123456789", "01", "\"s\"", "null",
    };
    static const char *const models[] = {"m", "qwen2.5-7b", "m\\/x", "模型", ""};
    static const char *const texts[] = {
        "a",      "bad",   "word", " ",         "\\n",   "\\u00e9", "é",    "ev",
        "il",     "\\\"",  "\x80", "\xc0\xaf",  "\x01",  "x",       "y",    "\\ud800",
        "o\\\\r", "hello", "敏",   "\\u0062ad", "\\t\"", "\"}",     "\"]}", "word bad",
    };
    static const char *const fins[] = {"null", "null", "\"stop\"", "\"length\"", "\"\"", "1"};
    static const char *const forms[] = {
        /* role, content (usual), finish: the chat shapes of one server */
        "{\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"created\":%s,\"model\":\"%s\","
        "\"system_fingerprint\":\"fp_1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":"
        "\"assistant\",\"content\":\"%s\"},\"logprobs\":null,\"finish_reason\":%s}]}",
        "{\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"created\":%s,\"model\":\"%s\","
        "\"system_fingerprint\":\"fp_1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"},"
        "\"logprobs\":null,\"finish_reason\":%s}]}",
        "{\"id\":\"%s\",\"created\":%s,\"model\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{%.0s"
        "},\"finish_reason\":\"stop\"%.0s}]}",
        /* usage last, completions text, an index that moves */
        "{\"id\":\"%s\",\"created\":%s,\"model\":\"%s\",\"choices\":[],\"usage\":{%.0s"
        "\"prompt_tokens\":3%.0s}}",
        "{\"id\":\"%s\",\"object\":\"text_completion\",\"created\":%s,\"model\":\"%s\",\"choices\":"
        "[{\"text\":\"%s\",\"index\":0,\"logprobs\":null,\"finish_reason\":%s}]}",
        "{\"id\":\"%s\",\"created\":%s,\"model\":\"%s\",\"choices\":[{\"index\":1,\"delta\":{"
        "\"content\":\"%s\"},\"finish_reason\":%s}]}",
        "{\"id\":\"%s\",\"created\":%s,\"model\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{"
        "\"content\":\"%s\"},\"finish_reason\":%s}]}",
        /* what must not read as the usual shapes */
        "{\"id\":\"%s\",\"created\":%s,\"model\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{"
        "\"content\":\"%s\"},\"logprobs\":{\"content\":[{\"token\":\"a\"}]},"
        "\"finish_reason\":%s}]}",
        "{\"id\":\"%s\",\"created\":%s,\"model\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{"
        "\"content\":\"%s\"},\"finish_reason\":%s},{\"index\":1,\"delta\":{\"content\":\"bad\"}}]}",
        "{\"id\":\"%s\",\"created\":%s,\"model\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{"
        "\"content\":\"%s\",\"content\":\"word\"},\"finish_reason\":%s}]}",
        "{\"id\":\"%s\",\"created\":%s,\"model\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{"
        "\"content\":\"%s\"},\"finish_reason\":%s}],\"id\":\"dup\"}",
    };
    unsigned r = shape_rnd(seed) % 32;
    /* mostly the usual values, so that shapes hit; the odd ones now and then */
    const char *id = r < 24 ? ids[shape_rnd(seed) % 2] : SHAPE_PICK(seed, ids);
    const char *cr = r < 24 ? created[shape_rnd(seed) % 3] : SHAPE_PICK(seed, created);
    const char *md = r < 28 ? models[shape_rnd(seed) % 2] : SHAPE_PICK(seed, models);
    const char *fin = r < 28 ? "null" : SHAPE_PICK(seed, fins);
    char text[96] = "";
    int len = (int)(shape_rnd(seed) % 4);
    for (int j = 0; j < len; j++)
        strcat(text, SHAPE_PICK(seed, texts));
    _Static_assert(SL_ARRAY_LEN(forms) == 11, "f - 5 below picks forms 1 to 10");
    unsigned f = shape_rnd(seed) % 16;
    const char *form = forms[f < 4 ? 1 : f < 6 ? 0 : f - 5];
    snprintf(d, cap, form, id, cr, md, text, fin);
}

/* Events read through the thread's shapes (kept from other streams) find
 * exactly what the whole parse finds, field by field and span by span, and
 * give byte for byte the same verdicts and payloads: streams a and fa go
 * through template and shapes, b and fb read every event whole. */
static void test_sse_shape_same(void **state)
{
    (void)state;
    flt_stream_shapes_clear();
    flt_ruleset_t *rs = rs_words("badword\nxy\n", "evil\n");
    uint32_t seed = 4242;
    size_t hits = 0, firsts = 0, events = 0;
    for (int round = 0; round < 1500; round++) {
        flt_stream_t *a = flt_stream_new(rs), *b = flt_stream_new(rs);
        flt_stream_t *fa = flt_stream_new(rs), *fb = flt_stream_new(rs);
        flt_stream_template(b, false);
        flt_stream_template(fb, false);
        for (int ev = 0; ev < 8; ev++) {
            char d[1024], xa[1024], xb[1024];
            shape_event(&seed, d, sizeof d);
            size_t n = strlen(d), before = flt_stream_shape_hits(fa);
            int ra = flt_stream_facts(fa, d, n, xa, sizeof xa);
            int rb = flt_stream_facts(fb, d, n, xb, sizeof xb);
            if (ra != rb || strcmp(xa, xb) != 0)
                fail_msg("round %d event %d: %s\n  shape: %s\n  whole: %s", round, ev, d, xa, xb);
            firsts += ev == 0 && flt_stream_shape_hits(fa) > before;
            flt_out_t oa = {0}, ob = {0};
            flt_ev_verdict_t va = flt_stream_event(a, d, n, &oa);
            flt_ev_verdict_t vb = flt_stream_event(b, d, n, &ob);
            if (va != vb || oa.n != ob.n)
                fail_msg("round %d event %d: %d/%zu vs %d/%zu for %s", round, ev, va, oa.n, vb,
                         ob.n, d);
            for (size_t i = 0; i < oa.n; i++)
                if (oa.v[i].len != ob.v[i].len || memcmp(oa.v[i].data, ob.v[i].data, oa.v[i].len))
                    fail_msg("round %d event %d payload %zu: %s vs %s", round, ev, i, oa.v[i].data,
                             ob.v[i].data);
            events++;
            flt_out_release(&oa);
            flt_out_release(&ob);
        }
        hits += flt_stream_shape_hits(fa);
        assert_int_equal(flt_stream_shape_hits(fb), 0);
        assert_int_equal(flt_stream_shape_hits(b), 0);
        flt_stream_free(a);
        flt_stream_free(b);
        flt_stream_free(fa);
        flt_stream_free(fb);
    }
    /* the shapes did run, on first events of streams too */
    if (hits < events / 10 || firsts < 150)
        fail_msg("shapes used %zu times of %zu events, %zu first events", hits, events, firsts);
    flt_ruleset_unref(rs);
    flt_stream_shapes_clear();
}

/* One server's chunk, the values a shape leaves open given. */
static void shape_chunk(char *d, size_t cap, const char *id, const char *created,
                        const char *content, const char *tail)
{
    snprintf(d, cap,
             "{\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"created\":%s,\"model\":"
             "\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"},\"logprobs\":null,"
             "\"finish_reason\":%s",
             id, created, content, tail);
}

/* After stream 1 kept the shape, stream 2's first event hits it with new
 * id, created and text; each change below must miss (and read as whole). */
static void test_sse_shape_misses(void **state)
{
    (void)state;
    flt_stream_shapes_clear();
    flt_ruleset_t *rs = rs_words("badword\n", NULL);
    char d[512], xa[1024], xb[1024];
    flt_stream_t *s1 = flt_stream_new(rs);
    shape_chunk(d, sizeof d, "c-1", "1700000000", "hi", "null}]}");
    assert_int_equal(flt_stream_facts(s1, d, strlen(d), xa, sizeof xa), 0);
    assert_int_equal(flt_stream_shape_hits(s1), 0);
    flt_stream_free(s1);

    static const struct {
        const char *id, *created, *content, *tail;
        bool hit;
    } cases[] = {
        {"c-2", "1700000001", "there", "null}]}", true},
        {"chatcmpl-longer-id", "-7", "", "null}]}", true},
        {"c-2", "123456789012345678", "é 敏", "null}]}", true},
        {"c-2", "1", "a\\nb", "null}]}", false},               /* an escape in the text */
        {"c\\u002d2", "1", "a", "null}]}", false},             /* ... in the id */
        {"c-2", "1", "a", "\"stop\"}]}", false},               /* another finish_reason */
        {"c-2", "1.5", "a", "null}]}", false},                 /* a float */
        {"c-2", "1234567890123456789", "a", "null}]}", false}, /* 19 digits */
        {"c-2", "01", "a", "null}]}", false},                  /* not JSON */
        {"c-\xc0\xaf", "1", "a", "null}]}", false},            /* invalid UTF-8 */
        {"c-\x80", "1", "a", "null}]}", false},                /* ... that yajl refuses */
        {"c-2", "1", "a\xe4\xb8", "null}]}", false},
        {"c-2", "1", "a\xed\xa0\x80", "null}]}", false}, /* a surrogate's bytes */
        {"c-2", "1", "a", "null,\"logprobs\":{}}]}", false},
        {"c-2", "1", "a", "null},{\"index\":1,\"delta\":{}}]}", false},
        {"c-2", "1", "a", "null}]} ", false},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        flt_stream_t *a = flt_stream_new(rs), *b = flt_stream_new(rs);
        flt_stream_template(b, false);
        shape_chunk(d, sizeof d, cases[i].id, cases[i].created, cases[i].content, cases[i].tail);
        int ra = flt_stream_facts(a, d, strlen(d), xa, sizeof xa);
        int rb = flt_stream_facts(b, d, strlen(d), xb, sizeof xb);
        if (ra != rb || strcmp(xa, xb) != 0)
            fail_msg("case %zu: %s\n  shape: %s\n  whole: %s", i, d, xa, xb);
        if (flt_stream_shape_hits(a) != (cases[i].hit ? 1u : 0u))
            fail_msg("case %zu (%s): %zu hits, want %d", i, d, flt_stream_shape_hits(a),
                     cases[i].hit);
        flt_stream_free(a);
        flt_stream_free(b);
    }
    flt_ruleset_unref(rs);
    flt_stream_shapes_clear();
}

/* Events of a new shape each time (a float outside the holes that changes)
 * are kept only now and then; when one shape comes back, it is kept again
 * within FLT_SHAPE_STREAK (16) events and then hits every time. */
static void test_sse_shape_streak(void **state)
{
    (void)state;
    flt_stream_shapes_clear();
    flt_ruleset_t *rs = rs_words("badword\n", NULL);
    char d[512], tail[64], id[32];
    int first_hit = -1;
    for (int i = 0; i < 100; i++) {
        flt_stream_t *st = flt_stream_new(rs);
        flt_out_t out = {0};
        snprintf(id, sizeof id, "c-%d", i);
        snprintf(tail, sizeof tail, "null}],\"t\":%d.5}", i < 40 ? i : 1000);
        shape_chunk(d, sizeof d, id, "1", "hi", tail);
        assert_int_equal(flt_stream_event(st, d, strlen(d), &out), FLT_EV_PASS);
        size_t h = flt_stream_shape_hits(st);
        if (i < 40)
            assert_int_equal(h, 0);
        else if (first_hit < 0 && h)
            first_hit = i;
        else if (first_hit >= 0)
            assert_int_equal(h, 1);
        flt_stream_free(st);
    }
    if (first_hit <= 41 || first_hit > 40 + 17) /* 41: kept at once, no damper */
        fail_msg("the shape came back at event 40 and first hit at %d", first_hit);
    flt_ruleset_unref(rs);
    flt_stream_shapes_clear();
}

/* A shape holds how an event reads, never what the filter did with it:
 * stream 1 holds back "bad" and is blocked by "evil"; stream 2, read
 * through stream 1's shapes, starts clean. */
static void test_sse_shape_no_leak(void **state)
{
    (void)state;
    flt_stream_shapes_clear();
    flt_ruleset_t *rs = rs_words("badword\n", "evil\n");
    char d[512];
    flt_out_t out = {0};
    flt_stream_t *s1 = flt_stream_new(rs);
    shape_chunk(d, sizeof d, "c-1", "1", "so bad", "null}]}");
    assert_int_equal(flt_stream_event(s1, d, strlen(d), &out), FLT_EV_REPLACE);
    assert_non_null(strstr(out.v[0].data, "\"content\":\"so \""));
    flt_out_reset(&out);
    shape_chunk(d, sizeof d, "c-1", "1", "evil", "null}]}");
    assert_int_equal(flt_stream_event(s1, d, strlen(d), &out), FLT_EV_BLOCK);
    flt_out_reset(&out);
    assert_true(flt_stream_template_hits(s1) == 1);
    flt_stream_free(s1);

    flt_stream_t *s2 = flt_stream_new(rs);
    shape_chunk(d, sizeof d, "c-2", "2", "word", "null}]}");
    assert_int_equal(flt_stream_event(s2, d, strlen(d), &out), FLT_EV_PASS);
    assert_int_equal(out.n, 0);
    assert_int_equal(flt_stream_shape_hits(s2), 1);
    assert_int_equal(flt_stream_held(s2, 0), 0);
    shape_chunk(d, sizeof d, "c-2", "2", "", "\"stop\"}]}");
    assert_int_equal(flt_stream_event(s2, d, strlen(d), &out), FLT_EV_PASS);
    assert_int_equal(flt_stream_end(s2, &out), FLT_EV_REPLACE);
    assert_int_equal(out.n, 0);
    assert_null(flt_stream_block_rule(s2));
    flt_out_release(&out);
    flt_stream_free(s2);
    flt_ruleset_unref(rs);
    flt_stream_shapes_clear();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_latin),
        cmocka_unit_test(test_split_chinese),
        cmocka_unit_test(test_fullwidth),
        cmocka_unit_test(test_overlapping),
        cmocka_unit_test(test_mask_inside_spanning_word),
        cmocka_unit_test(test_holdback_bound),
        cmocka_unit_test(test_no_partial_released_at_once),
        cmocka_unit_test(test_regex_splits),
        cmocka_unit_test(test_catastrophic_regex),
        cmocka_unit_test(test_holdback_cap),
        cmocka_unit_test(test_sse_mask_and_block),
        cmocka_unit_test(test_sse_passthrough_and_edges),
        cmocka_unit_test(test_sse_block_metrics),
        cmocka_unit_test(test_sse_splice_exact),
        cmocka_unit_test(test_sse_fail_closed),
        cmocka_unit_test(test_sse_completions_shape),
        cmocka_unit_test(test_sse_random_events),
        cmocka_unit_test(test_sse_template_same),
        cmocka_unit_test(test_sse_shape_same),
        cmocka_unit_test(test_sse_shape_misses),
        cmocka_unit_test(test_sse_shape_no_leak),
        cmocka_unit_test(test_sse_shape_streak),
        cmocka_unit_test(test_clean_pieces_same),
        cmocka_unit_test(test_stream_text_api),
        cmocka_unit_test(test_stream_recycle_forgets),
        cmocka_unit_test(test_stream_recycle_template_keys),
        cmocka_unit_test(test_chan_recycle_bounded),
        cmocka_unit_test(test_flt_cache_bounded),
        cmocka_unit_test(test_payloads_inline_then_ext),
        cmocka_unit_test(test_responses_delta_splice),
        cmocka_unit_test(test_response_whole),
        cmocka_unit_test(test_responses_bytes_same_as_tree),
        cmocka_unit_test(test_responses_unreadable_fail_closed),
        cmocka_unit_test(test_responses_unread_events),
        cmocka_unit_test(test_responses_done_shapes),
        cmocka_unit_test(test_responses_finish_chunk),
        cmocka_unit_test(test_responses_request_text),
        cmocka_unit_test(test_responses_body_bytes_same_as_tree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
