/*
 * Template replies: Accept-Language choice (q-values, order, prefix
 * lookup, q=0, "*", junk), and the exact shapes — chat.completion and
 * text_completion JSON checked field by field with jansson, and the SSE
 * bytes parsed back into events that must end in [DONE] and concatenate to
 * the text.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "fallback/fallback.h"

#define ZH "我现在网络不太顺畅，稍后再试试吧。"
#define EN "The network is not stable right now, please try again shortly."

static fb_tmpl_t *make_tmpl(void)
{
    conf_kv_t texts[] = {{.key = "en", .value = EN},
                         {.key = "en-GB", .value = "Do try again shortly."},
                         {.key = "ja", .value = "しばらくしてからもう一度お試しください。"},
                         {.key = "zh-TW", .value = "我現在網路不太順暢，稍後再試試吧。"}};
    conf_fb_template_t c = {.enabled = true, .text = ZH, .texts = texts, .ntexts = 4};
    fb_tmpl_t *t = fb_tmpl_new(&c);
    assert_non_null(t);
    return t;
}

static const char *pick(fb_tmpl_t *t, const char *al, const char **lang)
{
    return fb_tmpl_pick(t, al, al ? strlen(al) : 0, lang);
}

static void test_accept_language(void **state)
{
    (void)state;
    fb_tmpl_t *t = make_tmpl();
    const char *lang;
    assert_string_equal(pick(t, NULL, &lang), ZH);
    assert_null(lang);
    assert_string_equal(pick(t, "", &lang), ZH);
    assert_string_equal(pick(t, "en", &lang), EN);
    assert_string_equal(lang, "en");
    assert_string_equal(pick(t, "en-US", &lang), EN); /* prefix */
    assert_string_equal(lang, "en");
    assert_string_equal(pick(t, "EN-us", NULL), EN); /* case */
    assert_string_equal(pick(t, "en-GB", &lang), "Do try again shortly.");
    assert_string_equal(pick(t, "en-GB-oxendict", &lang), "Do try again shortly.");
    assert_string_equal(pick(t, "zh-Hant-TW", &lang), ZH); /* zh-Hant, zh: none -> default */
    assert_null(lang);
    assert_string_equal(pick(t, "zh-TW", &lang), "我現在網路不太順暢，稍後再試試吧。");
    /* q-values: the highest wins whatever the order */
    assert_string_equal(pick(t, "en;q=0.5, ja;q=0.9", &lang),
                        "しばらくしてからもう一度お試しください。");
    /* ties keep header order */
    assert_string_equal(pick(t, "ja;q=0.8, en;q=0.8", &lang),
                        "しばらくしてからもう一度お試しください。");
    assert_string_equal(pick(t, "en;q=0.8, ja;q=0.8", &lang), EN);
    /* a browser's usual header: zh-CN first, nothing for zh -> next is en-US */
    assert_string_equal(pick(t, "zh-CN,zh;q=0.9,en-US;q=0.8,en;q=0.7", &lang), EN);
    /* q=0 means "not this one" */
    assert_string_equal(pick(t, "en;q=0, ja;q=0.1", &lang),
                        "しばらくしてからもう一度お試しください。");
    assert_string_equal(pick(t, "en;q=0.000", &lang), ZH);
    /* "*" before any match: the default */
    assert_string_equal(pick(t, "fr, *;q=0.5, en;q=0.1", &lang), ZH);
    /* junk is skipped, not fatal */
    assert_string_equal(pick(t, "en;q=2, ja;q=abc, %%%, en-GB ; q=0.3", &lang),
                        "Do try again shortly.");
    assert_string_equal(pick(t, ",,, ;q=1, en", &lang), EN);
    assert_string_equal(pick(t, "en ; foo=bar ; q=1.000", &lang), EN);
    assert_string_equal(pick(t, "fr-FR,de", &lang), ZH);
    /* a long header: only the first 32 items are looked at */
    char big[4096] = "";
    for (int i = 0; i < 40; i++)
        strcat(big, "fr,");
    strcat(big, "en");
    assert_string_equal(pick(t, big, &lang), ZH);
    fb_tmpl_free(t);

    conf_fb_template_t none = {.text = "x"};
    t = fb_tmpl_new(&none);
    assert_string_equal(pick(t, "en", &lang), "x");
    fb_tmpl_free(t);
}

static json_t *load(const char *s, size_t n)
{
    json_error_t e;
    json_t *j = json_loadb(s, n, JSON_REJECT_DUPLICATES, &e);
    if (!j)
        fail_msg("bad JSON: %s in %.*s", e.text, (int)n, s);
    return j;
}

static void check_usage_zero(json_t *u)
{
    assert_true(json_is_object(u));
    assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), 0);
    assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 0);
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), 0);
}

static void test_chat_json(void **state)
{
    (void)state;
    fb_reply_req_t q = {
        .api = FB_API_CHAT, .model = "chat-model", .id = "abc123", .created = 1700000000};
    size_t n;
    char *s = fb_reply_render(&q, ZH, &n);
    assert_non_null(s);
    assert_int_equal(strlen(s), n);
    assert_string_equal(fb_reply_content_type(&q), "application/json");
    json_t *j = load(s, n);
    assert_string_equal(json_string_value(json_object_get(j, "id")), "chatcmpl-abc123");
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion");
    assert_int_equal(json_integer_value(json_object_get(j, "created")), 1700000000);
    assert_string_equal(json_string_value(json_object_get(j, "model")), "chat-model");
    json_t *ch = json_object_get(j, "choices");
    assert_int_equal(json_array_size(ch), 1);
    json_t *c0 = json_array_get(ch, 0);
    assert_int_equal(json_integer_value(json_object_get(c0, "index")), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "stop");
    json_t *m = json_object_get(c0, "message");
    assert_string_equal(json_string_value(json_object_get(m, "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(m, "content")), ZH);
    check_usage_zero(json_object_get(j, "usage"));
    json_decref(j);
    free(s);

    /* no id given: a random one; no model: "" */
    fb_reply_req_t q2 = {.api = FB_API_CHAT};
    s = fb_reply_render(&q2, "x\"y\n", &n);
    j = load(s, n);
    assert_true(strncmp(json_string_value(json_object_get(j, "id")), "chatcmpl-", 9) == 0);
    assert_true(strlen(json_string_value(json_object_get(j, "id"))) > 9);
    assert_string_equal(json_string_value(json_object_get(j, "model")), "");
    assert_string_equal(
        json_string_value(json_object_get(
            json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"),
            "content")),
        "x\"y\n");
    json_decref(j);
    free(s);
}

static void test_completions_json(void **state)
{
    (void)state;
    fb_reply_req_t q = {.api = FB_API_COMPLETIONS, .model = "m", .id = "r1", .created = 5};
    size_t n;
    char *s = fb_reply_render(&q, EN, &n);
    json_t *j = load(s, n);
    assert_string_equal(json_string_value(json_object_get(j, "id")), "cmpl-r1");
    assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "text")), EN);
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "stop");
    check_usage_zero(json_object_get(j, "usage"));
    json_decref(j);
    free(s);
}

/* Splits SSE bytes into the data of each event; checks the framing. */
static size_t sse_events(const char *s, size_t n, char **data, size_t max)
{
    size_t k = 0;
    const char *p = s, *end = s + n;
    while (p < end) {
        const char *e = strstr(p, "\n\n");
        assert_non_null(e);
        assert_true(strncmp(p, "data: ", 6) == 0);
        assert_null(memchr(p, '\n', (size_t)(e - p))); /* one data line per event */
        assert_true(k < max);
        data[k++] = strndup(p + 6, (size_t)(e - p - 6));
        p = e + 2;
    }
    assert_true(p == end);
    return k;
}

static void check_stream(fb_api_t api, bool usage)
{
    fb_reply_req_t q = {.api = api,
                        .stream = true,
                        .include_usage = usage,
                        .model = "chat-model",
                        .id = "s1",
                        .created = 42};
    size_t n;
    char *s = fb_reply_render(&q, ZH, &n);
    assert_non_null(s);
    assert_int_equal(strlen(s), n);
    assert_string_equal(fb_reply_content_type(&q), "text/event-stream");
    char *ev[16];
    size_t k = sse_events(s, n, ev, 16);
    bool chat = api == FB_API_CHAT;
    size_t want = (chat ? 3 : 2) + (usage ? 1 : 0) + 1;
    assert_int_equal(k, want);
    assert_string_equal(ev[k - 1], "[DONE]");
    char text[512] = "";
    int finishes = 0;
    for (size_t i = 0; i + 1 < k; i++) {
        json_t *j = load(ev[i], strlen(ev[i]));
        assert_string_equal(json_string_value(json_object_get(j, "id")),
                            chat ? "chatcmpl-s1" : "cmpl-s1");
        assert_string_equal(json_string_value(json_object_get(j, "object")),
                            chat ? "chat.completion.chunk" : "text_completion");
        assert_int_equal(json_integer_value(json_object_get(j, "created")), 42);
        assert_string_equal(json_string_value(json_object_get(j, "model")), "chat-model");
        json_t *ch = json_object_get(j, "choices");
        json_t *u = json_object_get(j, "usage");
        if (usage && i + 2 == k) {
            /* the usage chunk: no choices, zero usage */
            assert_int_equal(json_array_size(ch), 0);
            check_usage_zero(u);
        } else {
            assert_int_equal(json_array_size(ch), 1);
            if (usage)
                assert_true(json_is_null(u));
            else
                assert_null(u);
            json_t *c0 = json_array_get(ch, 0);
            const char *piece;
            if (chat) {
                json_t *d = json_object_get(c0, "delta");
                assert_true(json_is_object(d));
                if (i == 0)
                    assert_string_equal(json_string_value(json_object_get(d, "role")), "assistant");
                piece = json_string_value(json_object_get(d, "content"));
            } else {
                piece = json_string_value(json_object_get(c0, "text"));
            }
            if (piece)
                strcat(text, piece);
            json_t *f = json_object_get(c0, "finish_reason");
            if (json_is_string(f)) {
                assert_string_equal(json_string_value(f), "stop");
                finishes++;
                assert_true(i + (usage ? 3 : 2) == k); /* the last content chunk */
            } else {
                assert_true(json_is_null(f));
            }
        }
        json_decref(j);
    }
    assert_int_equal(finishes, 1);
    assert_string_equal(text, ZH);
    for (size_t i = 0; i < k; i++)
        free(ev[i]);
    free(s);
}

static void test_streams(void **state)
{
    (void)state;
    check_stream(FB_API_CHAT, false);
    check_stream(FB_API_CHAT, true);
    check_stream(FB_API_COMPLETIONS, false);
    check_stream(FB_API_COMPLETIONS, true);
}

static void test_from_json(void **state)
{
    (void)state;
    json_t *b = json_loads("{\"model\":\"m1\",\"stream\":true,\"stream_options\":"
                           "{\"include_usage\":true},\"messages\":[]}",
                           0, NULL);
    fb_reply_req_t q = {0};
    fb_reply_req_from_json(b, &q);
    assert_true(q.stream);
    assert_true(q.include_usage);
    assert_string_equal(q.model, "m1");
    json_decref(b);
    b = json_loads("{\"model\":5,\"stream\":\"yes\",\"stream_options\":{\"include_usage\":true}}",
                   0, NULL);
    fb_reply_req_from_json(b, &q);
    assert_false(q.stream);
    assert_false(q.include_usage); /* only meaningful with a stream */
    assert_null(q.model);
    json_decref(b);

    /* the whole tier: pick + render */
    fb_tmpl_t *t = make_tmpl();
    fb_reply_req_t r = {.api = FB_API_CHAT, .model = "x", .id = "1"};
    size_t n;
    char *s = fb_tmpl_render(t, &r, "en-US,en;q=0.9", 14, &n);
    assert_non_null(strstr(s, EN));
    free(s);
    fb_tmpl_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accept_language),  cmocka_unit_test(test_chat_json),
        cmocka_unit_test(test_completions_json), cmocka_unit_test(test_streams),
        cmocka_unit_test(test_from_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
