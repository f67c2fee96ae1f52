/*
 * test_gw_llm_keys.c — the relay's one-pass key scan of an SSE event
 * (gw_llm_scan_keys, gateway/llm_metrics.c) against the per-key memmem
 * searches it replaced: the same usage and content answers on real chunks
 * and on random bytes over a small alphabet of the keys' pieces.
 */
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

/* `"key":` then blanks: what follows, or NULL (the old search). */
static const char *ref_after_key(const char *p, size_t n, const char *key)
{
    size_t klen = strlen(key);
    const char *end = p + n;
    while (p < end) {
        const char *k = memmem(p, (size_t)(end - p), key, klen);
        if (!k)
            return NULL;
        const char *v = k + klen;
        while (v < end && (*v == ' ' || *v == '\t'))
            v++;
        if (v < end)
            return v;
        p = k + 1;
    }
    return NULL;
}

static bool ref_usage(const char *p, size_t n)
{
    const char *end = p + n;
    while (p < end) {
        const char *v = ref_after_key(p, (size_t)(end - p), "\"usage\":");
        if (!v)
            return false;
        if (*v == '{')
            return true;
        p = v;
    }
    return false;
}

static bool ref_content(const char *p, size_t n)
{
    static const char *const keys[] = {"\"content\":", "\"text\":", "\"tool_calls\":"};
    for (size_t i = 0; i < 3; i++) {
        const char *end = p + n, *q = p;
        while (q < end) {
            const char *v = ref_after_key(q, (size_t)(end - q), keys[i]);
            if (!v)
                break;
            if (i == 2 ? *v == '[' && v + 1 < end && v[1] != ']'
                       : *v == '"' && v + 1 < end && v[1] != '"')
                return true;
            q = v;
        }
    }
    return false;
}

/* A Responses event's content: a `"delta":` holding a non-empty string. */
static bool ref_delta(const char *p, size_t n)
{
    const char *end = p + n, *q = p;
    while (q < end) {
        const char *v = ref_after_key(q, (size_t)(end - q), "\"delta\":");
        if (!v)
            return false;
        if (*v == '"' && v + 1 < end && v[1] != '"')
            return true;
        q = v;
    }
    return false;
}

/* The Responses scan alone, with its AVX2 pass (where the CPU has one)
 * and with its SSE2 pass. */
static void check_resp(const char *p, size_t n)
{
    for (int avx2 = 1; avx2 >= 0; avx2--) {
        gw_llm_resp_avx2_set(avx2);
        bool content = true;
        bool usage = gw_llm_resp_scan(p, n, &content);
        if (usage != ref_usage(p, n) || content != ref_delta(p, n))
            fail_msg("Responses scan (avx2 %d) %d/%d, reference %d/%d on [%.*s]", avx2, usage,
                     content, ref_usage(p, n), ref_delta(p, n), (int)n, p);
    }
    gw_llm_resp_avx2_set(true);
}

static void check(const char *p, size_t n)
{
    bool content = true;
    bool usage = gw_llm_scan_keys(p, n, &content);
    if (usage != ref_usage(p, n) || content != ref_content(p, n))
        fail_msg("scan %d/%d, reference %d/%d on [%.*s]", usage, content, ref_usage(p, n),
                 ref_content(p, n), (int)n, p);
    check_resp(p, n);
}

static void test_chunks(void **state)
{
    (void)state;
    static const char *const evs[] = {
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
        "\"delta\":{\"content\":\"tok \"},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n",
        "data: {\"usage\": null, \"choices\":[{\"delta\":{\"content\":\"\"}}]}\n\n",
        "data: {\"choices\":[{\"text\":\"x\"}],\"usage\" :{\"a\":1}}\n\n",
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[]}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"tool_calls\": [{\"id\":\"t\"}]}}]}\n\n",
        "data: {\"a\":\"say \\\"usage\\\":{ and \\\"content\\\":\\\"x\\\"\"}\n\n",
        "data: {\"id\":\"a\",\r\ndata: \"usage\":\t{\"p\":1}}\r\n\r\n",
        "{\"type\":\"response.output_text.delta\",\"sequence_number\":5,\"item_id\":\"msg_1\","
        "\"output_index\":0,\"content_index\":0,\"delta\":\"tok \",\"logprobs\":[]}",
        "{\"type\":\"response.completed\",\"response\":{\"output\":[{\"text\":\"a\\\"delta\\\":"
        "\\\"x\"}],"
        "\"usage\":{\"input_tokens\":9}}}",
        "{\"delta\":  \"\", \"delta\": \"x\"}",
        "{\"delta\":   ",
        "{\"content\":",
        "{\"content\": \"",
        "\"usage\":",
        ":",
        "",
    };
    for (size_t i = 0; i < sizeof(evs) / sizeof(evs[0]); i++)
        check(evs[i], strlen(evs[i]));
    bool content = false;
    assert_false(gw_llm_scan_keys(evs[0], strlen(evs[0]), &content));
    assert_true(content);
    assert_true(gw_llm_scan_keys(evs[1], strlen(evs[1]), &content));
    assert_false(content);
    assert_false(gw_llm_scan_keys(evs[2], strlen(evs[2]), &content));
    assert_false(content);
}

/* A random text into buf (cap bytes): up to maxparts - 1 of the pieces, drawn
 * with the LCG state *x; its length. */
static size_t random_text(char *buf, size_t cap, const char *const *pieces, size_t npieces,
                          size_t maxparts, uint32_t *x)
{
    size_t n = 0;
    *x = *x * 1103515245u + 12345u;
    size_t parts = (*x >> 16) % maxparts;
    for (size_t k = 0; k < parts; k++) {
        *x = *x * 1103515245u + 12345u;
        const char *s = pieces[(*x >> 16) % npieces];
        size_t l = strlen(s);
        if (n + l > cap)
            break;
        memcpy(buf + n, s, l);
        n += l;
    }
    return n;
}

static void test_random(void **state)
{
    (void)state;
    static const char *const pieces[] = {"\"usage\"", "\"content\"", "\"text\"",  "\"tool_calls\"",
                                         "\"delta\"", "lta\"",       "https://x", ":",
                                         " ",         "\t",          "{",         "[",
                                         "]",         "\"",          "\\",        "x",
                                         "null",      "\"\"",        "age\"",     "t\"",
                                         "ls\""};
    char buf[160];
    uint32_t x = 7;
    for (int it = 0; it < 200000; it++) {
        size_t n =
            random_text(buf, sizeof(buf), pieces, sizeof(pieces) / sizeof(pieces[0]), 14, &x);
        check(buf, n);
    }
}

/* The Responses scan stops only at `ta":` / `ge":` (gw_llm_resp_next), a
 * block of 16 or 32 bytes at a time, the last block overlapping the one
 * before: each key at every offset from an event's start and end (the
 * blocks' edges, the overlap, the bytes before the first block), in a
 * buffer of exactly the event's bytes (ASan: no read outside it), beside
 * keys the pass must not stop at. */
static void test_resp_offsets(void **state)
{
    (void)state;
    static const char *const keys[] = {
        "\"delta\":\"x\"", "\"usage\":{\"a\":1}", "\"delta\":\"\"",   "\"usage\":null",
        "\"beta\":\"x\"",  "\"sage\":{}",         "\"delta\" :\"x\"", "\"delta\":",
    };
    size_t hits = 0;
    for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
        size_t kl = strlen(keys[k]);
        for (size_t pre = 0; pre <= 70; pre++) {
            for (size_t post = 0; post <= 70; post++) {
                size_t n = pre + kl + post;
                char *b = malloc(n ? n : 1);
                assert_non_null(b);
                for (size_t i = 0; i < pre; i++)
                    b[i] = "{\"ty\":\"t\",x"[i % 12];
                memcpy(b + pre, keys[k], kl);
                for (size_t i = 0; i < post; i++)
                    b[pre + kl + i] = ",\"n\":1 ]}"[i % 10];
                check_resp(b, n);
                bool content;
                hits += gw_llm_resp_scan(b, n, &content) || content;
                free(b);
            }
        }
    }
    /* "delta":"x" and "usage":{..} count at every offset but where the
     * (7 bytes before the colon: always, the key has them) */
    assert_int_equal(hits, 2 * 71 * 71);
}

/* Longer random events than test_random's (up to 400 bytes: many blocks of
 * either width), the Responses scan alone. */
static void test_resp_random(void **state)
{
    (void)state;
    static const char *const pieces[] = {
        "\"usage\"", "\"delta\"", "ta\"",     "ge\"", "\":", ":", "\"",  " ",
        "{",         "\"x\"",     "abcdefgh", "\\",   "t",   "g", "\"\""};
    char buf[400];
    uint32_t x = 11;
    for (int it = 0; it < 100000; it++) {
        size_t n =
            random_text(buf, sizeof(buf), pieces, sizeof(pieces) / sizeof(pieces[0]), 90, &x);
        check_resp(buf, n);
    }
}

/* A Responses event is parsed only when it may carry what gw_llm_event
 * reads: a top-level usage or choices, or JSON yajl refuses (then jansson
 * decides, as before). */
int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunks),
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_resp_offsets),
        cmocka_unit_test(test_resp_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
