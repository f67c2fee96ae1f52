/*
 * Unit tests of cache/ without Redis: Cache-Control, policy resolution,
 * key normalisation (equal and unequal cases, user scope), the recorder and
 * replayer (JSON -> SSE -> JSON round trips, tool calls, usage chunk,
 * taints), the LRU (byte bound, recency, TTL with a fake clock), the int8
 * kernels against the scalar reference, the semantic index around the
 * threshold with deterministic vectors, its persisted form, the embeddings
 * body and parser, and the per-request flow against the in-process store.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cache/cache.h"
#include "cache/cache_internal.h"
#include "common/log.h"
#include "common/metrics.h"

static conf_t *load(const char *yaml)
{
    char err[512] = "";
    conf_t *c = conf_load_string(yaml, strlen(yaml), "t.yaml", err, sizeof(err));
    if (!c)
        fail_msg("conf: %s", err);
    return c;
}

static const char *base_yaml = "listen: [{address: \"127.0.0.1:1\"}]\n"
                               "upstreams: {u: {servers: [{url: \"http://127.0.0.1:2\"}]}}\n";

static conf_t *load_with(const char *extra)
{
    char buf[16384];
    snprintf(buf, sizeof(buf), "%s%s", base_yaml, extra);
    return load(buf);
}

static json_t *J(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    if (!j)
        fail_msg("bad test json: %s: %s", e.text, s);
    return j;
}

/* ---- Cache-Control ----------------------------------------------------------- */

static unsigned cc(const char *s)
{
    return cache_control_parse(s, strlen(s));
}

static void test_cache_control(void **state)
{
    (void)state;
    assert_int_equal(cache_control_parse(NULL, 0), 0);
    assert_int_equal(cc(""), 0);
    assert_int_equal(cc("no-cache"), CACHE_CC_NO_CACHE);
    assert_int_equal(cc("No-Store"), CACHE_CC_NO_STORE);
    assert_int_equal(cc(" no-cache , no-store "), CACHE_CC_NO_CACHE | CACHE_CC_NO_STORE);
    assert_int_equal(cc("max-age=0"), CACHE_CC_NO_CACHE);
    assert_int_equal(cc("max-age=60"), 0);
    assert_int_equal(cc("max-age=00"), 0);
    assert_int_equal(cc("private, max-age = 0"), CACHE_CC_NO_CACHE);
    assert_int_equal(cc("no-cachex"), 0);
    assert_int_equal(cc("xno-cache"), 0);
    assert_int_equal(cc("foo=\"no-cache, no-store\", bar"), 0);
    assert_int_equal(cc("foo=\"a\",no-store"), CACHE_CC_NO_STORE);
    assert_int_equal(cc(",,,"), 0);
    assert_int_equal(cc("no-cache="), CACHE_CC_NO_CACHE);
}

/* ---- policy ------------------------------------------------------------------ */

static void test_policy(void **state)
{
    (void)state;
    conf_t *c = load_with("models:\n"
                          "  a: {upstream: u}\n"
                          "  b: {upstream: u, cache: {enabled: off}}\n"
                          "  e: {upstream: u}\n"
                          "  g: {upstream: u, cache: {scope: global, ttl: 5m, max_temperature: "
                          "\"0.7\", max_entry_bytes: 2k, semantic: on}}\n"
                          "cache: {enabled: true, ttl: 2h, semantic: {embed_model: e}}\n");
    cache_policy_t p;
    cache_policy_resolve(&c->cache, &conf_model_find(c, "a")->cache, &p);
    assert_true(p.enabled);
    assert_false(p.semantic);
    assert_int_equal(p.scope, CACHE_SCOPE_USER);
    assert_int_equal(p.ttl_ms, 2 * 3600 * 1000);
    assert_true(p.max_temperature == 0);
    assert_int_equal(p.max_entry_bytes, 256 * 1024);
    cache_policy_resolve(&c->cache, &conf_model_find(c, "b")->cache, &p);
    assert_false(p.enabled);
    cache_policy_resolve(&c->cache, &conf_model_find(c, "g")->cache, &p);
    assert_true(p.enabled);
    assert_true(p.semantic);
    assert_int_equal(p.scope, CACHE_SCOPE_GLOBAL);
    assert_int_equal(p.ttl_ms, 5 * 60 * 1000);
    assert_true(fabs(p.max_temperature - 0.7) < 1e-9);
    assert_int_equal(p.max_entry_bytes, 2048);
    cache_policy_resolve(&c->cache, NULL, &p);
    assert_true(p.enabled);
    conf_free(c);

    char err[256];
    const char *bad[] = {"cache: {max_temperature: \"hot\"}\n", "cache: {max_temperature: \"3\"}\n",
                         "cache: {semantic: {threshold: \"0.2\"}}\n", "cache: {scope: inherit}\n",
                         "cache: {ttl: 0}\n"};
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++) {
        char buf[1024];
        snprintf(buf, sizeof(buf), "%s%s", base_yaml, bad[i]);
        conf_t *x = conf_load_string(buf, strlen(buf), "t.yaml", err, sizeof(err));
        if (x)
            fail_msg("accepted %s", bad[i]);
        assert_non_null(strstr(err, "cache."));
    }
}

/* ---- the key ------------------------------------------------------------------- */

static void key_of(const char *body, const char *model, const char *sub, unsigned char *k)
{
    json_t *j = J(body);
    cache_bypass_t why;
    assert_int_equal(cache_key(j, model, sub, k, &why), 0);
    assert_int_equal(why, CACHE_BYPASS_NONE);
    json_decref(j);
}

static bool same_key(const char *a, const char *b)
{
    unsigned char ka[CACHE_KEY_LEN], kb[CACHE_KEY_LEN];
    key_of(a, "m", "alice", ka);
    key_of(b, "m", "alice", kb);
    return memcmp(ka, kb, CACHE_KEY_LEN) == 0;
}

static void test_key_equal(void **state)
{
    (void)state;
    const char *base = "{\"model\":\"m\",\"temperature\":0,\"messages\":[{\"role\":\"user\","
                       "\"content\":\"hello world\"}]}";
    const char *eq[] = {
        /* whitespace: runs, ends, tabs, newlines, NBSP, ideographic space */
        "{\"model\":\"m\",\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":\"  "
        "hello \\t\\n world \"}]}",
        "{\"model\":\"m\",\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":"
        "\"hello\\u00a0world\"}]}",
        "{\"model\":\"m\",\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":"
        "\"hello\\u3000\\u3000world\"}]}",
        /* key order, 0.0 vs 0, the stream flag and its options, user/metadata */
        "{\"messages\":[{\"content\":\"hello world\",\"role\":\"user\"}],\"temperature\":0.0,"
        "\"model\":\"m\"}",
        "{\"model\":\"m\",\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":"
        "true},\"user\":\"u1\",\"metadata\":{\"a\":1},\"messages\":[{\"role\":\"user\","
        "\"content\":\"hello world\"}]}",
        /* a single text part is the plain string */
        "{\"model\":\"m\",\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":[{"
        "\"type\":\"text\",\"text\":\"hello  world\"}]}]}",
        /* the body's model is not what keys: the aliased model passed in is */
        "{\"model\":\"alias\",\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":"
        "\"hello world\"}]}",
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(eq); i++)
        if (!same_key(base, eq[i]))
            fail_msg("expected the same key: %s", eq[i]);
}

static void test_key_unequal(void **state)
{
    (void)state;
    const char *base = "{\"model\":\"m\",\"temperature\":0,\"messages\":[{\"role\":\"user\","
                       "\"content\":\"hello world\"}]}";
    const char *ne[] = {
        "{\"model\":\"m\",\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":\"hello "
        "World\"}]}",
        "{\"model\":\"m\",\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":"
        "\"helloworld\"}]}",
        "{\"model\":\"m\",\"temperature\":0,\"messages\":[{\"role\":\"system\",\"content\":"
        "\"hello world\"}]}",
        "{\"model\":\"m\",\"temperature\":0.1,\"messages\":[{\"role\":\"user\",\"content\":"
        "\"hello world\"}]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hello world\"}]}",
        "{\"model\":\"m\",\"temperature\":0,\"max_tokens\":5,\"messages\":[{\"role\":\"user\","
        "\"content\":\"hello world\"}]}",
        "{\"model\":\"m\",\"temperature\":0,\"seed\":1,\"messages\":[{\"role\":\"user\","
        "\"content\":\"hello world\"}]}",
        "{\"model\":\"m\",\"temperature\":0,\"stop\":[\"x\"],\"messages\":[{\"role\":\"user\","
        "\"content\":\"hello world\"}]}",
        "{\"model\":\"m\",\"temperature\":0,\"response_format\":{\"type\":\"json_object\"},"
        "\"messages\":[{\"role\":\"user\",\"content\":\"hello world\"}]}",
        "{\"model\":\"m\",\"temperature\":0,\"tools\":[{\"type\":\"function\",\"function\":{"
        "\"name\":\"f\"}}],\"messages\":[{\"role\":\"user\",\"content\":\"hello world\"}]}",
        "{\"model\":\"m\",\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":\"hello "
        "world\",\"name\":\"bob\"}]}",
        "{\"model\":\"m\",\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}"
        ",{\"role\":\"user\",\"content\":\"world\"}]}",
        "{\"model\":\"m\",\"temperature\":0,\"top_p\":0.5,\"messages\":[{\"role\":\"user\","
        "\"content\":\"hello world\"}]}",
        /* an image part makes another question */
        "{\"model\":\"m\",\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":[{"
        "\"type\":\"text\",\"text\":\"hello world\"},{\"type\":\"image_url\",\"image_url\":{"
        "\"url\":\"https://x/y.png\"}}]}]}",
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(ne); i++)
        if (same_key(base, ne[i]))
            fail_msg("expected another key: %s", ne[i]);
    /* whitespace counts outside message text (a parameter's strings) */
    if (same_key("{\"temperature\":0,\"stop\":[\"a  b\"],\"messages\":[]}",
                 "{\"temperature\":0,\"stop\":[\"a b\"],\"messages\":[]}"))
        fail_msg("a parameter's whitespace was normalised");
    /* ... and message text is, in each text part of a content of several */
    if (!same_key("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                  "\" a  b\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"u\"}}]}]}",
                  "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                  "\"a b\"},{\"image_url\":{\"url\":\"u\"},\"type\":\"image_url\"}]}]}"))
        fail_msg("text parts were not normalised");
}

static void test_key_scope_and_model(void **state)
{
    (void)state;
    const char *b = "{\"model\":\"m\",\"temperature\":0,\"messages\":[{\"role\":\"user\","
                    "\"content\":\"hi\"}]}";
    unsigned char a1[32], a2[32], bob[32], glob[32], other[32];
    key_of(b, "m", "alice", a1);
    key_of(b, "m", "alice", a2);
    key_of(b, "m", "bob", bob);
    key_of(b, "m", NULL, glob);
    key_of(b, "m2", "alice", other);
    assert_memory_equal(a1, a2, 32);
    assert_memory_not_equal(a1, bob, 32);
    assert_memory_not_equal(a1, glob, 32);
    assert_memory_not_equal(bob, glob, 32);
    assert_memory_not_equal(a1, other, 32);

    cache_bypass_t why = CACHE_BYPASS_NONE;
    unsigned char k[32];
    json_t *bad = J("{\"model\":\"m\",\"messages\":\"hi\"}");
    assert_int_equal(cache_key(bad, "m", NULL, k, &why), -1);
    assert_int_equal(why, CACHE_BYPASS_UNSUPPORTED);
    json_decref(bad);
    bad = J("[1]");
    assert_int_equal(cache_key(bad, "m", NULL, k, &why), -1);
    json_decref(bad);
    bad = J("{\"messages\":[1]}");
    assert_int_equal(cache_key(bad, "m", NULL, k, &why), -1);
    json_decref(bad);

    size_t n;
    char *t = cache_text_normalise(" \t a  b\n\nc \xe3\x80\x80", 14, &n);
    assert_string_equal(t, "a b c");
    assert_int_equal(n, 5);
    free(t);
}

/* ---- recorder and replayer ------------------------------------------------------- */

typedef struct payloads {
    char *p[32];
    size_t n;
} payloads_t;

static int collect(void *arg, const char *data, size_t len)
{
    payloads_t *p = arg;
    assert_true(p->n < 32);
    p->p[p->n++] = strndup(data, len);
    return 0;
}

static void payloads_free(payloads_t *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->p[i]);
    p->n = 0;
}

static const char *answer_json =
    "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1700000000,\"model\":\"m\","
    "\"system_fingerprint\":\"fp1\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
    "\"content\":\"你好, world\\n\"},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":{"
    "\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}";

static cache_entry_t *record_json(const char *s, unsigned *taint)
{
    cache_rec_t *r = cache_rec_new(1 << 20);
    json_t *j = J(s);
    cache_rec_body(r, j);
    json_decref(j);
    cache_entry_t *e = cache_rec_finish(r, taint);
    cache_rec_free(r);
    return e;
}

static cache_entry_t *record_sse(payloads_t *p, unsigned *taint)
{
    cache_rec_t *r = cache_rec_new(1 << 20);
    for (size_t i = 0; i < p->n; i++)
        cache_rec_event(r, p->p[i], strlen(p->p[i]));
    cache_entry_t *e = cache_rec_finish(r, taint);
    cache_rec_free(r);
    return e;
}

static void test_round_trip(void **state)
{
    (void)state;
    unsigned taint = 99;
    cache_entry_t *e = record_json(answer_json, &taint);
    assert_non_null(e);
    assert_int_equal(taint, 0);
    assert_string_equal(cache_entry_content(e, 0), "你好, world\n");

    /* JSON -> SSE with usage */
    payloads_t p = {0};
    cache_replay_opts_t o = {.id = "chatcmpl-new", .created = 1800000000, .include_usage = true};
    assert_int_equal(cache_entry_sse(e, &o, collect, &p), 0);
    assert_int_equal(p.n, 5); /* role, content, finish, usage, [DONE] */
    assert_string_equal(p.p[4], "[DONE]");
    json_t *c0 = J(p.p[0]);
    assert_string_equal(json_string_value(json_object_get(c0, "object")), "chat.completion.chunk");
    assert_string_equal(json_string_value(json_object_get(c0, "id")), "chatcmpl-new");
    assert_int_equal(json_integer_value(json_object_get(c0, "created")), 1800000000);
    assert_true(json_is_null(json_object_get(c0, "usage")));
    json_t *d0 = json_object_get(json_array_get(json_object_get(c0, "choices"), 0), "delta");
    assert_string_equal(json_string_value(json_object_get(d0, "role")), "assistant");
    json_decref(c0);
    json_t *u = J(p.p[3]);
    assert_int_equal(json_array_size(json_object_get(u, "choices")), 0);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(u, "usage"), "total_tokens")), 8);
    json_decref(u);

    /* SSE -> entry -> JSON equals the original (id/created aside) */
    cache_entry_t *e2 = record_sse(&p, &taint);
    assert_non_null(e2);
    assert_int_equal(taint, 0);
    cache_replay_opts_t keep = {0};
    json_t *orig = J(answer_json);
    json_t *back =
        cache_entry_json(e2, &(cache_replay_opts_t){.id = "chatcmpl-1", .created = 1700000000});
    json_object_set_new(
        json_object_get(json_array_get(json_object_get(orig, "choices"), 0), "message"), "refusal",
        json_null());
    if (!json_equal(orig, back)) {
        char *a = json_dumps(orig, JSON_SORT_KEYS), *b = json_dumps(back, JSON_SORT_KEYS);
        fail_msg("round trip differs:\n%s\n%s", a, b);
    }
    json_decref(orig);
    json_decref(back);

    /* encode/decode keeps everything */
    e2->stored_ms = 0;
    size_t len;
    char *enc = cache_entry_encode(e, &len);
    cache_entry_t *e3 = cache_entry_decode(enc, len);
    assert_non_null(e3);
    json_t *j1 = cache_entry_json(e, &keep), *j3 = cache_entry_json(e3, &keep);
    assert_true(json_equal(j1, j3));
    /* the pre-rendered replays are exactly what the renderers make */
    size_t rl;
    assert_null(cache_entry_rendered(e, false, false, &rl)); /* not from a store */
    const char *rj = cache_entry_rendered(e3, false, false, &rl);
    char *dj = json_dumps(j1, JSON_COMPACT);
    assert_int_equal(rl, strlen(dj));
    assert_memory_equal(rj, dj, rl);
    free(dj);
    cache_replay_opts_t wu = {.include_usage = true};
    size_t sl1, sl2;
    char *s1 = cache_entry_sse_body(e, &keep, &sl1), *s2 = cache_entry_sse_body(e, &wu, &sl2);
    const char *r1 = cache_entry_rendered(e3, true, false, &rl);
    assert_int_equal(rl, sl1);
    assert_memory_equal(r1, s1, sl1);
    const char *r2 = cache_entry_rendered(e3, true, true, &rl);
    assert_int_equal(rl, sl2);
    assert_memory_equal(r2, s2, sl2);
    assert_non_null(strstr(r2, "\"total_tokens\":8"));
    free(s1);
    free(s2);
    json_decref(j1);
    json_decref(j3);
    /* broken framing: every truncation, a wrong length, a bad magic */
    for (size_t cut = 0; cut < len; cut += 7)
        assert_null(cache_entry_decode(enc, cut));
    enc[len - 1] = 'x'; /* the stream no longer ends in [DONE] */
    assert_null(cache_entry_decode(enc, len));
    enc[len - 1] = '\n';
    cache_entry_t *ok = cache_entry_decode(enc, len);
    assert_non_null(ok);
    cache_entry_free(ok);
    char *nl = strchr(enc, '\n');
    nl[-1] = (char)(nl[-1] == '9' ? '8' : nl[-1] + 1); /* a length that does not add up */
    assert_null(cache_entry_decode(enc, len));
    enc[0] = 'X';
    assert_null(cache_entry_decode(enc, len));
    free(enc);

    /* without include_usage: no usage chunk, no usage field */
    payloads_free(&p);
    assert_int_equal(cache_entry_sse(e, &keep, collect, &p), 0);
    assert_int_equal(p.n, 4);
    assert_null(strstr(p.p[0], "usage"));
    size_t blen;
    char *body = cache_entry_sse_body(e, &keep, &blen);
    assert_int_equal(strncmp(body, "data: {", 7), 0);
    assert_non_null(strstr(body, "\n\ndata: [DONE]\n\n"));
    assert_int_equal(blen, strlen(body));
    free(body);

    payloads_free(&p);
    cache_entry_free(e);
    cache_entry_free(e2);
    cache_entry_free(e3);
}

static void test_stream_tools(void **state)
{
    (void)state;
    const char *ev[] = {
        "{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null,"
        "\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{"
        "\"name\":\"get_\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}",
        "{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{"
        "\"name\":\"weather\",\"arguments\":\"{\\\"city\\\":\"}}]},\"finish_reason\":null}]}",
        "{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{"
        "\"arguments\":\"\\\"Paris\\\"}\"}}]},\"finish_reason\":null}]}",
        "{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}",
        "[DONE]",
    };
    payloads_t p = {0};
    for (size_t i = 0; i < SL_ARRAY_LEN(ev); i++)
        collect(&p, ev[i], strlen(ev[i]));
    unsigned taint;
    cache_entry_t *e = record_sse(&p, &taint);
    assert_non_null(e);
    json_t *j = cache_entry_json(e, NULL);
    json_t *m = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    assert_true(json_is_null(json_object_get(m, "content")));
    json_t *call = json_array_get(json_object_get(m, "tool_calls"), 0);
    assert_string_equal(json_string_value(json_object_get(call, "id")), "call_1");
    json_t *fn = json_object_get(call, "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")),
                        "{\"city\":\"Paris\"}");
    assert_string_equal(cache_entry_finish(e, 0), "tool_calls");
    /* and back to a stream: role, tool_calls, finish, [DONE] */
    payloads_t r = {0};
    assert_int_equal(cache_entry_sse(e, NULL, collect, &r), 0);
    assert_int_equal(r.n, 4);
    assert_non_null(strstr(r.p[1], "\"tool_calls\":[{"));
    assert_non_null(strstr(r.p[1], "\"index\":0"));
    cache_entry_t *e2 = record_sse(&r, &taint);
    assert_non_null(e2);
    json_t *j2 = cache_entry_json(e2, NULL);
    assert_true(json_equal(j, j2));
    json_decref(j);
    json_decref(j2);
    cache_entry_free(e);
    cache_entry_free(e2);
    payloads_free(&p);
    payloads_free(&r);
}

static void test_taints(void **state)
{
    (void)state;
    unsigned taint;
    /* truncated: finish_reason length */
    const char *len_answer =
        "{\"id\":\"x\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"m\",\"choices\":[{"
        "\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"a\"},\"finish_reason\":"
        "\"length\"}]}";
    assert_null(record_json(len_answer, &taint));
    assert_int_equal(taint, CACHE_TAINT_TRUNCATED);
    const char *cf_answer =
        "{\"id\":\"x\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"m\",\"choices\":[{"
        "\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"a\"},\"finish_reason\":"
        "\"content_filter\"}]}";
    assert_null(record_json(cf_answer, &taint));
    assert_int_equal(taint, CACHE_TAINT_FILTERED);
    assert_null(
        record_json("{\"error\":{\"message\":\"x\",\"type\":\"t\",\"code\":\"c\"}}", &taint));
    assert_int_equal(taint, CACHE_TAINT_ERROR);

    /* a stream without [DONE] */
    payloads_t p = {0};
    cache_entry_t *e = record_json(answer_json, &taint);
    assert_int_equal(cache_entry_sse(e, NULL, collect, &p), 0);
    free(p.p[--p.n]);
    assert_null(record_sse(&p, &taint));
    assert_int_equal(taint, CACHE_TAINT_TRUNCATED);
    /* an error event mid-stream */
    collect(&p, "{\"error\":{\"message\":\"boom\"}}", 29);
    collect(&p, "[DONE]", 6);
    assert_null(record_sse(&p, &taint));
    assert_int_equal(taint, CACHE_TAINT_ERROR);
    payloads_free(&p);

    /* the hook's own taints */
    cache_rec_t *r = cache_rec_new(1 << 20);
    json_t *j = J(answer_json);
    cache_rec_body(r, j);
    cache_rec_taint(r, CACHE_TAINT_FALLBACK);
    assert_null(cache_rec_finish(r, &taint));
    assert_int_equal(taint, CACHE_TAINT_FALLBACK);
    cache_rec_free(r);
    /* too large */
    r = cache_rec_new(64);
    cache_rec_body(r, j);
    assert_null(cache_rec_finish(r, &taint));
    assert_int_equal(taint, CACHE_TAINT_TOO_LARGE);
    cache_rec_free(r);
    r = cache_rec_new(4);
    assert_int_equal(cache_entry_sse(e, NULL, collect, &p), 0);
    for (size_t i = 0; i < p.n; i++)
        cache_rec_event(r, p.p[i], strlen(p.p[i]));
    assert_int_equal(cache_rec_taints(r), CACHE_TAINT_TOO_LARGE);
    cache_rec_free(r);
    json_decref(j);
    payloads_free(&p);
    /* garbage events and bodies never crash */
    r = cache_rec_new(1 << 20);
    cache_rec_event(r, "{", 1);
    assert_int_equal(cache_rec_taints(r), CACHE_TAINT_MALFORMED);
    cache_rec_free(r);
    r = cache_rec_new(1 << 20);
    cache_rec_event(r,
                    "{\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":99,"
                    "\"delta\":{}}]}",
                    66);
    assert_int_equal(cache_rec_taints(r), CACHE_TAINT_MALFORMED);
    cache_rec_free(r);
    assert_null(cache_entry_decode("{\"choices\":[]}", 14));
    assert_null(cache_entry_decode("nope", 4));
    cache_entry_free(e);
}

/* ---- the LRU ------------------------------------------------------------------------ */

static void mk(unsigned char *k, int i)
{
    memset(k, 0, CACHE_KEY_LEN);
    k[0] = (unsigned char)i;
    k[1] = (unsigned char)(i >> 8);
}

static void test_lru(void **state)
{
    (void)state;
    char val[1000];
    memset(val, 'v', sizeof(val));
    /* room for ~8 entries of 1000 bytes (each costs value + key + overhead) */
    cache_lru_t *l = cache_lru_new(10000);
    unsigned char k[CACHE_KEY_LEN];
    for (int i = 0; i < 20; i++) {
        mk(k, i);
        assert_int_equal(cache_lru_put(l, k, val, sizeof(val), 1000, "m"), 0);
        assert_true(cache_lru_bytes(l) <= 10000);
        /* keep 0 the most recent */
        mk(k, 0);
        size_t n;
        char *v = cache_lru_get(l, k, 0, &n);
        assert_non_null(v);
        assert_int_equal(n, sizeof(val));
        free(v);
    }
    size_t cnt = cache_lru_count(l);
    assert_true(cnt >= 7 && cnt <= 8);
    assert_int_equal(cache_lru_evictions(l), 20 - cnt);
    mk(k, 0);
    char *v = cache_lru_get(l, k, 0, NULL);
    assert_non_null(v); /* recency kept it */
    free(v);
    mk(k, 1);
    assert_null(cache_lru_get(l, k, 0, NULL)); /* the oldest went */
    mk(k, 19);
    v = cache_lru_get(l, k, 0, NULL);
    assert_non_null(v);
    free(v);
    /* TTL: expired at its expiry, dropped on read */
    mk(k, 19);
    assert_null(cache_lru_get(l, k, 1000, NULL));
    assert_int_equal(cache_lru_count(l), cnt - 1);
    /* replace keeps one entry */
    mk(k, 500);
    assert_int_equal(cache_lru_put(l, k, "a", 1, 5000, "m"), 0);
    assert_int_equal(cache_lru_put(l, k, "bb", 2, 5000, "m"), 0);
    size_t n;
    v = cache_lru_get(l, k, 4999, &n);
    assert_string_equal(v, "bb");
    free(v);
    cache_lru_del(l, k);
    assert_null(cache_lru_get(l, k, 0, NULL));
    /* larger than the whole store */
    char *big = calloc(1, 20000);
    assert_int_equal(cache_lru_put(l, k, big, 20000, 5000, "m"), -1);
    free(big);
    cache_lru_free(l);
    cache_lru_free(NULL);
}

/* ---- kernels and the semantic index -------------------------------------------------- */

static uint64_t rng = 88172645463325252ull;
static double rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0 * 2 - 1;
}

static void test_dot(void **state)
{
    (void)state;
    int8_t a[1100], b[1100];
    for (size_t i = 0; i < sizeof(a); i++) {
        a[i] = (int8_t)(rnd() * 127);
        b[i] = (int8_t)(rnd() * 127);
    }
    a[0] = 127;
    b[0] = -127;
    a[1] = -127;
    b[1] = -127;
    size_t lens[] = {0, 1, 31, 32, 33, 63, 64, 65, 96, 127, 384, 1024, 1100};
    bool have_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    for (size_t i = 0; i < SL_ARRAY_LEN(lens); i++) {
        int32_t r = cache_dot_i8_ref(a, b, lens[i]);
        assert_int_equal(cache_dot_i8(a, b, lens[i]), r);
        /* each kernel only where this CPU has its instructions (CI
         * machines differ: some have no AVX-512) */
        if (__builtin_cpu_supports("avx2"))
            assert_int_equal(cache_dot_i8_avx2(a, b, lens[i]), r);
        if (have_avx512)
            assert_int_equal(cache_dot_i8_avx512(a, b, lens[i]), r);
    }
    /* many rows against one query: 64-byte rows (the sketches, 16 at a
     * time plus a tail), 384-byte rows and an odd width */
    size_t widths[] = {64, 384, 100};
    for (size_t w = 0; w < SL_ARRAY_LEN(widths); w++) {
        size_t d = widths[w], n = 37;
        int8_t *rows = malloc(n * d);
        for (size_t i = 0; i < n * d; i++)
            rows[i] = (int8_t)(rnd() * 127);
        int32_t out[37];
        cache_dot_i8_rows(a, rows, d, n, out);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(out[i], cache_dot_i8_ref(a, rows + i * d, d));
        free(rows);
    }
    const char *k = cache_dot_kernel();
    assert_true(strcmp(k, "avx512vnni") == 0 || strcmp(k, "avx2") == 0 || strcmp(k, "scalar") == 0);
    /* every kernel this CPU has, through the rows entry point */
    const char *names[] = {"scalar", "avx2", "avx512vnni"};
    char chosen[16];
    snprintf(chosen, sizeof(chosen), "%s", k);
    for (size_t j = 0; j < SL_ARRAY_LEN(names); j++) {
        if (cache_dot_force(names[j]) != 0)
            continue;
        for (size_t w = 0; w < SL_ARRAY_LEN(widths); w++) {
            size_t d = widths[w], n = 37;
            int8_t *rows = malloc(n * d);
            for (size_t i = 0; i < n * d; i++)
                rows[i] = (int8_t)(rnd() * 127);
            int32_t out[37];
            cache_dot_i8_rows(a, rows, d, n, out);
            for (size_t i = 0; i < n; i++)
                assert_int_equal(out[i], cache_dot_i8_ref(a, rows + i * d, d));
            free(rows);
        }
    }
    assert_int_equal(cache_dot_force(chosen), 0);
}

/* A unit vector at exactly cosine c from unit vector a (with b orthogonal). */
static void at_cos(const float *a, const float *orth, double c, float *out, size_t d)
{
    double s = sqrt(1 - c * c);
    for (size_t i = 0; i < d; i++)
        out[i] = (float)(c * a[i] + s * orth[i]);
}

static void unit(float *v, size_t d)
{
    double ss = 0;
    for (size_t i = 0; i < d; i++)
        ss += (double)v[i] * v[i];
    for (size_t i = 0; i < d; i++)
        v[i] = (float)(v[i] / sqrt(ss));
}

static void test_semantic(void **state)
{
    (void)state;
    enum { D = 384 };
    float a[D], o[D], q[D];
    for (size_t i = 0; i < D; i++)
        a[i] = (float)rnd(), o[i] = (float)rnd();
    unit(a, D);
    /* Gram-Schmidt: o orthogonal to a */
    double dp = 0;
    for (size_t i = 0; i < D; i++)
        dp += a[i] * o[i];
    for (size_t i = 0; i < D; i++)
        o[i] = (float)(o[i] - dp * a[i]);
    unit(o, D);

    cache_sem_t *s = cache_sem_new(100, 4, 0);
    unsigned char part[32] = {1}, other[32] = {2}, key[32] = {7}, got[32];
    double sim = 0;
    assert_int_equal(cache_sem_add(s, part, a, D, key, 10000), 0);
    /* around the threshold 0.95: 0.96 hits, 0.94 misses */
    at_cos(a, o, 0.96, q, D);
    assert_int_equal(cache_sem_lookup(s, part, q, D, 0.95, 0, got, &sim), 1);
    assert_memory_equal(got, key, 32);
    assert_true(fabs(sim - 0.96) < 0.005);
    at_cos(a, o, 0.94, q, D);
    assert_int_equal(cache_sem_lookup(s, part, q, D, 0.95, 0, got, &sim), 0);
    /* the same vector scaled: cosine 1 */
    for (size_t i = 0; i < D; i++)
        q[i] = a[i] * 3;
    assert_int_equal(cache_sem_lookup(s, part, q, D, 0.999, 0, got, &sim), 1);
    /* another partition, another dimension, expiry, a zero vector */
    assert_int_equal(cache_sem_lookup(s, other, a, D, 0.5, 0, got, &sim), 0);
    assert_int_equal(cache_sem_lookup(s, part, a, D - 1, 0.5, 0, got, &sim), 0);
    assert_int_equal(cache_sem_add(s, part, a, D - 1, key, 10000), -1);
    assert_int_equal(cache_sem_lookup(s, part, a, D, 0.5, 10000, got, &sim), 0);
    float zero[D] = {0};
    assert_int_equal(cache_sem_lookup(s, part, zero, D, 0.5, 0, got, &sim), 0);
    assert_int_equal(cache_sem_add(s, part, zero, D, key, 10000), -1);

    /* the best of several wins; the same key refreshes in place */
    unsigned char k2[32] = {8};
    at_cos(a, o, 0.97, q, D);
    assert_int_equal(cache_sem_add(s, part, q, D, k2, 10000), 0);
    assert_int_equal(cache_sem_add(s, part, q, D, k2, 10000), 0);
    assert_int_equal(cache_sem_count(s), 2);
    at_cos(a, o, 0.99, q, D); /* closer to k2's (0.97 from a) than to a? cos(k2,q) ~ 0.9997 */
    assert_int_equal(cache_sem_lookup(s, part, q, D, 0.95, 0, got, &sim), 1);
    assert_memory_equal(got, k2, 32);

    /* per-partition bound: the oldest goes */
    for (int i = 0; i < 150; i++) {
        unsigned char kk[32] = {0};
        kk[0] = 100;
        kk[1] = (unsigned char)i;
        float v[D];
        for (size_t j = 0; j < D; j++)
            v[j] = (float)rnd();
        assert_int_equal(cache_sem_add(s, part, v, D, kk, 10000), 0);
    }
    assert_int_equal(cache_sem_count(s), 100);
    assert_int_equal(cache_sem_lookup(s, part, a, D, 0.999, 0, got, &sim), 0); /* a's went */
    /* partition bound */
    for (int i = 0; i < 6; i++) {
        unsigned char pp[32] = {0};
        pp[0] = (unsigned char)(50 + i);
        assert_int_equal(cache_sem_add(s, pp, a, D, key, 10000), 0);
    }
    assert_int_equal(cache_sem_count(s), 4);

    /* the byte bound: 64-dim slots cost 64 + 64 + 32 + 4 + 8 = 172 bytes;
     * 20000 bytes hold two partitions of 64 slots at most */
    cache_sem_t *sb = cache_sem_new(1000, 100, 30000);
    float v64[64];
    for (int i = 0; i < 400; i++) {
        unsigned char pp[32] = {0}, kk[32] = {0};
        pp[0] = (unsigned char)(i / 100); /* 4 partitions of 100 adds */
        kk[0] = (unsigned char)i;
        kk[1] = (unsigned char)(i >> 8);
        for (size_t j = 0; j < 64; j++)
            v64[j] = (float)rnd();
        assert_int_equal(cache_sem_add(sb, pp, v64, 64, kk, 10000), 0);
        assert_true(cache_sem_bytes(sb) <= 30000);
    }
    /* the newest partition is searchable: its last vector is found */
    unsigned char lp[32] = {3}, lk[32];
    assert_int_equal(cache_sem_lookup(sb, lp, v64, 64, 0.999, 0, lk, &sim), 1);
    assert_int_equal(lk[0], (unsigned char)399);
    assert_int_equal(lk[1], 1);
    /* the oldest went to make room */
    unsigned char fp[32] = {0};
    assert_int_equal(cache_sem_lookup(sb, fp, v64, 64, -1, 0, lk, &sim), 0);
    assert_true(cache_sem_count(sb) < 400);
    cache_sem_free(sb);

    /* persisted form: encode, apply to another index, find it there */
    size_t len;
    char *rec = cache_sem_encode(part, a, D, key, 10000, &len);
    assert_non_null(rec);
    cache_sem_t *s2 = cache_sem_new(10, 10, 0);
    assert_int_equal(cache_sem_apply(s2, rec, len), 0);
    at_cos(a, o, 0.96, q, D);
    assert_int_equal(cache_sem_lookup(s2, part, q, D, 0.95, 0, got, &sim), 1);
    assert_memory_equal(got, key, 32);
    assert_int_equal(cache_sem_apply(s2, rec, len - 1), -1);
    rec[0] = 'X';
    assert_int_equal(cache_sem_apply(s2, rec, len), -1);
    free(rec);
    cache_sem_free(s2);
    cache_sem_free(s);
    cache_sem_free(NULL);
}

/* The two-pass search (sketch, then exact) finds what the flat scan finds,
 * under every kernel this CPU has: 3000 clustered vectors, queries at
 * cosine 0.956..0.99 of stored ones (hits: quantisation moves a cosine by
 * ~1e-3 at 128 dimensions, so not closer to the bound) and fresh ones. */
static void test_semantic_two_pass(void **state)
{
    (void)state;
    enum { D = 128, N = 3000 };
    float *data = malloc(sizeof(float) * D * N), center[D], q[D], o[D];
    for (size_t i = 0; i < D; i++)
        center[i] = (float)rnd();
    cache_sem_t *s = cache_sem_new(N, 1, 0);
    unsigned char part[32] = {9};
    for (size_t k = 0; k < N; k++) {
        for (size_t i = 0; i < D; i++)
            data[k * D + i] = (float)(center[i] + rnd());
        unit(data + k * D, D);
        unsigned char key[32] = {0};
        memcpy(key, &k, sizeof(k));
        assert_int_equal(cache_sem_add(s, part, data + k * D, D, key, 1000), 0);
    }
    const char *names[] = {"scalar", "avx2", "avx512vnni"};
    char chosen[16];
    snprintf(chosen, sizeof(chosen), "%s", cache_dot_kernel());
    for (size_t kn = 0; kn < SL_ARRAY_LEN(names); kn++) {
        if (cache_dot_force(names[kn]) != 0)
            continue;
        int hits = 0;
        for (int t = 0; t < 40; t++) {
            size_t target = (size_t)t * 71 % N;
            bool dup = t % 2 == 0;
            if (dup) {
                const float *a = data + target * D;
                for (size_t i = 0; i < D; i++)
                    o[i] = (float)rnd();
                double dp = 0;
                for (size_t i = 0; i < D; i++)
                    dp += (double)a[i] * o[i];
                for (size_t i = 0; i < D; i++)
                    o[i] = (float)(o[i] - dp * a[i]);
                unit(o, D);
                at_cos(a, o, 0.956 + 0.034 * (rnd() + 1) / 2, q, D);
            } else {
                for (size_t i = 0; i < D; i++)
                    q[i] = (float)(center[i] + rnd());
            }
            unsigned char g1[32], g2[32];
            double s1 = 0, s2 = 0;
            cache_sem_set_flat_max(s, 0);
            int h1 = cache_sem_lookup(s, part, q, D, 0.95, 0, g1, &s1);
            cache_sem_set_flat_max(s, SIZE_MAX);
            int h2 = cache_sem_lookup(s, part, q, D, 0.95, 0, g2, &s2);
            assert_int_equal(h1, h2);
            assert_int_equal(h1, dup);
            if (h1) {
                assert_memory_equal(g1, g2, 32);
                size_t k;
                memcpy(&k, g1, sizeof(k));
                assert_int_equal(k, target);
                hits++;
            }
            /* expired entries are never returned, by either pass */
            cache_sem_set_flat_max(s, 0);
            assert_int_equal(cache_sem_lookup(s, part, q, D, 0.95, 1000, g1, &s1), 0);
        }
        assert_int_equal(hits, 20);
    }
    assert_int_equal(cache_dot_force(chosen), 0);
    cache_sem_free(s);
    free(data);
}

static void test_embed(void **state)
{
    (void)state;
    size_t n;
    char *b = cache_embed_body("e", "hello \"x\"", 9, &n);
    json_t *j = J(b);
    assert_string_equal(json_string_value(json_object_get(j, "model")), "e");
    assert_string_equal(json_string_value(json_object_get(j, "input")), "hello \"x\"");
    json_decref(j);
    free(b);
    const char *ok = "{\"object\":\"list\",\"data\":[{\"object\":\"embedding\",\"index\":0,"
                     "\"embedding\":[0.5,-1,2e-1]}],\"model\":\"e\"}";
    size_t dim = 0;
    float *v = cache_embed_parse(ok, strlen(ok), &dim);
    assert_non_null(v);
    assert_int_equal(dim, 3);
    assert_true(v[0] == 0.5f && v[1] == -1.0f && fabsf(v[2] - 0.2f) < 1e-6);
    free(v);
    const char *bad[] = {"{}",
                         "{\"data\":[]}",
                         "{\"data\":[{\"embedding\":[]}]}",
                         "{\"data\":[{\"embedding\":[1,\"x\"]}]}",
                         "nope",
                         "[1,2]"};
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++)
        assert_null(cache_embed_parse(bad[i], strlen(bad[i]), &dim));

    unsigned char p1[32], p2[32], p3[32];
    json_t *r1 =
        J("{\"messages\":[{\"role\":\"system\",\"content\":\"be nice\"},{\"role\":\"user\","
          "\"content\":\" What is  sluice? \"}]}");
    json_t *r2 =
        J("{\"messages\":[{\"role\":\"system\",\"content\":\"be rude\"},{\"role\":\"user\","
          "\"content\":\"What is sluice?\"}]}");
    json_t *r3 = J("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\","
                   "\"content\":\"b\"},{\"role\":\"user\",\"content\":\"c\"}]}");
    size_t l;
    char *t1 = cache_sem_text(r1, "m", NULL, false, p1, &l);
    assert_string_equal(t1, "What is sluice?");
    char *t2 = cache_sem_text(r2, "m", NULL, false, p2, &l);
    assert_memory_not_equal(p1, p2, 32); /* the system prompt partitions */
    char *t3 = cache_sem_text(r1, "m", "bob", false, p3, &l);
    assert_memory_not_equal(p1, p3, 32); /* and the user in user scope */
    assert_null(cache_sem_text(r3, "m", NULL, false, p3, &l));
    char *t4 = cache_sem_text(r3, "m", NULL, true, p3, &l);
    assert_string_equal(t4, "c");
    free(t1);
    free(t2);
    free(t3);
    free(t4);
    json_decref(r1);
    json_decref(r2);
    json_decref(r3);
}

/* ---- garbage never crashes --------------------------------------------------------- */

/* Deterministic mutations (flip, cut, duplicate) of valid inputs to every
 * parser of outside data: stored values, SSE payloads, JSON answers, semantic
 * records, embeddings answers. Under ASan this is the fuzz corpus's job. */
static void test_garbage(void **state)
{
    (void)state;
    unsigned taint;
    cache_entry_t *e = record_json(answer_json, &taint);
    size_t elen;
    char *enc = cache_entry_encode(e, &elen);
    payloads_t p = {0};
    cache_replay_opts_t wu = {.include_usage = true};
    assert_int_equal(cache_entry_sse(e, &wu, collect, &p), 0);
    unsigned char part[32] = {3}, key[32] = {4};
    float vec[16];
    for (size_t i = 0; i < 16; i++)
        vec[i] = (float)rnd();
    size_t rlen;
    char *rec = cache_sem_encode(part, vec, 16, key, 1000, &rlen);
    const char *emb = "{\"data\":[{\"embedding\":[0.1,-0.2,0.3,1e3]}]}";
    const char *inputs[] = {enc, rec, emb, answer_json, p.p[0], p.p[1], p.p[2], p.p[3]};
    size_t lens[] = {elen,           rlen,           strlen(emb),    strlen(answer_json),
                     strlen(p.p[0]), strlen(p.p[1]), strlen(p.p[2]), strlen(p.p[3])};
    cache_sem_t *s = cache_sem_new(8, 2, 0);
    char buf[16384];
    for (int it = 0; it < 3000; it++) {
        size_t which = (size_t)it % SL_ARRAY_LEN(inputs);
        size_t n = lens[which];
        assert_true(n < sizeof(buf) / 2);
        memcpy(buf, inputs[which], n);
        int flips = 1 + it % 4;
        for (int f = 0; f < flips; f++)
            buf[(size_t)((rnd() + 1) / 2 * (double)n) % n] = (char)(rnd() * 128);
        if (it % 5 == 0)
            n = (size_t)((rnd() + 1) / 2 * (double)n);
        if (it % 7 == 0 && n) { /* duplicate a slice */
            size_t a = (size_t)((rnd() + 1) / 2 * (double)n) % n;
            memcpy(buf + n, buf + a, n - a);
            n += n - a;
        }
        cache_entry_t *d = cache_entry_decode(buf, n);
        if (d) { /* framing survived: the accessors still must not crash */
            (void)cache_entry_nchoices(d);
            (void)cache_entry_content(d, 0);
            (void)cache_entry_usage(d);
            json_t *j = cache_entry_json(d, NULL);
            json_decref(j);
            size_t bl;
            char *b = cache_entry_sse_body(d, NULL, &bl);
            free(b);
            cache_entry_free(d);
        }
        (void)cache_sem_apply(s, buf, n);
        size_t dim;
        float *v = cache_embed_parse(buf, n, &dim);
        free(v);
        cache_rec_t *r = cache_rec_new(1 << 16);
        cache_rec_event(r, buf, n);
        json_t *j = json_loadb(buf, n, 0, NULL);
        cache_rec_body(r, j);
        json_decref(j);
        cache_entry_t *x = cache_rec_finish(r, &taint);
        cache_entry_free(x);
        cache_rec_free(r);
        (void)cache_control_parse(buf, n);
        size_t nl;
        char *t = cache_text_normalise(buf, n, &nl);
        assert_true(nl <= n);
        free(t);
    }
    cache_sem_free(s);
    payloads_free(&p);
    free(rec);
    free(enc);
    cache_entry_free(e);
}

/* ---- the request flow against the in-process store ------------------------------------ */

static const char *flow_yaml = "models:\n"
                               "  chat: {upstream: u, name: served}\n"
                               "  off: {upstream: u, cache: {enabled: off}}\n"
                               "  emb: {upstream: u}\n"
                               "  g: {upstream: u, cache: {scope: global, semantic: on}}\n"
                               "cache: {enabled: true, ttl: 10s, semantic: {embed_model: emb}}\n";

static cache_req_t *req(cache_t *c, const conf_t *conf, const char *body, const char *model,
                        const char *sub, const char *ccv)
{
    json_t *j = J(body);
    cache_req_in_t in = {.conf = conf, .body = j, .model = model, .sub = sub, .cache_control = ccv};
    cache_req_t *q = cache_req_new(c, &in);
    json_decref(j);
    assert_non_null(q);
    return q;
}

static void never_cb(void *arg, cache_req_t *q)
{
    (void)arg;
    (void)q;
    fail_msg("no callback expected in-process");
}

static uint64_t metric(const char *name, const char *labels, const char *a, const char *b)
{
    sl_metric_t *m = sl_metric_register(name, "", SL_METRIC_COUNTER, labels, NULL, 0);
    const char *v[2] = {a, b};
    return sl_counter_value(sl_metric_series(m, v));
}

static void test_flow(void **state)
{
    (void)state;
    conf_t *conf = load_with(flow_yaml);
    char err[256];
    cache_t *c = cache_new(conf, err, sizeof(err));
    assert_non_null(c);
    assert_false(cache_uses_redis(c));
    cache_worker_t *w = cache_worker_new(c, NULL, err, sizeof(err));
    assert_non_null(w);
    const char *body = "{\"model\":\"chat\",\"temperature\":0,\"messages\":[{\"role\":\"user\","
                       "\"content\":\"hi\"}]}";
    const char *sbody = "{\"model\":\"chat\",\"temperature\":0,\"stream\":true,\"stream_options\":"
                        "{\"include_usage\":true},\"messages\":[{\"role\":\"user\",\"content\":"
                        "\"  hi \"}]}";
    uint64_t hits0 = metric("sluice_cache_requests_total", "model,result", "chat", "hit");

    /* 1: a miss, answered by JSON, stored */
    cache_req_t *q = req(c, conf, body, "chat", "alice", NULL);
    assert_int_equal(cache_req_state(q), CACHE_MISS);
    assert_int_equal(cache_lookup(w, q, 1000, never_cb, NULL), CACHE_DONE);
    assert_int_equal(cache_req_state(q), CACHE_MISS);
    assert_string_equal(cache_req_header(q), "miss");
    assert_false(cache_req_semantic(q)); /* chat has no semantic */
    json_t *ans = J(answer_json);
    cache_req_record_body(q, ans);
    json_decref(ans);
    assert_int_equal(cache_store(w, q, 1000), 1);
    cache_req_free(q);
    assert_int_equal(cache_lru_count(cache_lru(c)), 1);

    /* 2: the same as a stream with usage, 5 s later: a hit, Age 5 */
    q = req(c, conf, sbody, "chat", "alice", NULL);
    assert_int_equal(cache_lookup(w, q, 6000, never_cb, NULL), CACHE_DONE);
    assert_int_equal(cache_req_state(q), CACHE_HIT);
    assert_string_equal(cache_req_header(q), "hit");
    assert_int_equal(cache_req_age_s(q, 6000), 5);
    assert_true(cache_req_stream(q) && cache_req_include_usage(q));
    assert_false(cache_req_storing(q));
    assert_int_equal(cache_store(w, q, 6000), 0);
    const cache_entry_t *e = cache_req_entry(q);
    assert_string_equal(cache_entry_content(e, 0), "你好, world\n");
    cache_req_free(q);
    assert_int_equal(metric("sluice_cache_requests_total", "model,result", "chat", "hit"),
                     hits0 + 1);

    /* 3: bob does not get alice's answer */
    q = req(c, conf, body, "chat", "bob", NULL);
    assert_int_equal(cache_lookup(w, q, 6000, never_cb, NULL), CACHE_DONE);
    assert_int_equal(cache_req_state(q), CACHE_MISS);
    cache_req_free(q);

    /* 4: no-cache skips the lookup but stores; no-store neither */
    q = req(c, conf, body, "chat", "alice", "no-cache");
    assert_int_equal(cache_req_state(q), CACHE_BYPASS);
    assert_int_equal(cache_req_bypass(q), CACHE_BYPASS_NO_CACHE);
    assert_true(cache_req_storing(q));
    cache_req_free(q);
    q = req(c, conf, body, "chat", "alice", "no-store");
    assert_int_equal(cache_req_bypass(q), CACHE_BYPASS_NO_STORE);
    assert_false(cache_req_storing(q));
    assert_string_equal(cache_req_header(q), "bypass");
    cache_req_free(q);

    /* 5: TTL: 10 s after the store it is gone */
    q = req(c, conf, body, "chat", "alice", NULL);
    assert_int_equal(cache_lookup(w, q, 11000, never_cb, NULL), CACHE_DONE);
    assert_int_equal(cache_req_state(q), CACHE_MISS);
    cache_req_free(q);

    /* 6: bypasses: temperature (absent = 1), off, no user, unknown model, n */
    const char *warm = "{\"model\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    q = req(c, conf, warm, "chat", "alice", NULL);
    assert_int_equal(cache_req_bypass(q), CACHE_BYPASS_TEMPERATURE);
    assert_false(cache_req_storing(q));
    cache_req_free(q);
    q = req(c, conf, body, "off", "alice", NULL);
    assert_int_equal(cache_req_bypass(q), CACHE_BYPASS_OFF);
    cache_req_free(q);
    q = req(c, conf, body, "chat", NULL, NULL);
    assert_int_equal(cache_req_bypass(q), CACHE_BYPASS_NO_USER);
    cache_req_free(q);
    q = req(c, conf, body, "nosuch", "alice", NULL);
    assert_int_equal(cache_req_bypass(q), CACHE_BYPASS_OFF);
    cache_req_free(q);
    q = req(c, conf,
            "{\"temperature\":0,\"n\":99,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
            "chat", "alice", NULL);
    assert_int_equal(cache_req_bypass(q), CACHE_BYPASS_UNSUPPORTED);
    cache_req_free(q);
    q = req(c, conf, "{\"temperature\":0,\"messages\":7}", "chat", "alice", NULL);
    assert_int_equal(cache_req_bypass(q), CACHE_BYPASS_UNSUPPORTED);
    cache_req_free(q);

    /* 7: a tainted answer is not stored */
    q = req(c, conf, body, "chat", "carol", NULL);
    ans = J(answer_json);
    cache_req_record_body(q, ans);
    json_decref(ans);
    cache_req_taint(q, CACHE_TAINT_FILTERED);
    assert_int_equal(cache_store(w, q, 20000), 0);
    cache_req_free(q);
    q = req(c, conf, body, "chat", "carol", NULL);
    assert_int_equal(cache_lookup(w, q, 20000, never_cb, NULL), CACHE_DONE);
    assert_int_equal(cache_req_state(q), CACHE_MISS);
    cache_req_free(q);

    /* 8: semantic (global scope): store with an embedding, a similar question hits */
    enum { D = 8 };
    const char *emb1 = "{\"data\":[{\"embedding\":[1,0,0,0,0,0,0,0]}]}";
    const char *emb_close = "{\"data\":[{\"embedding\":[0.96,0.28,0,0,0,0,0,0]}]}";
    const char *emb_far = "{\"data\":[{\"embedding\":[0.94,0.3412,0,0,0,0,0,0]}]}";
    const char *gq = "{\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":\"What is "
                     "sluice?\"}]}";
    const char *gq2 = "{\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":\"what's "
                      "sluice\"}]}";
    q = req(c, conf, gq, "g", NULL, NULL);
    assert_int_equal(cache_lookup(w, q, 30000, never_cb, NULL), CACHE_DONE);
    assert_true(cache_req_semantic(q));
    size_t bl;
    char *eb = cache_req_embed_body(q, &bl);
    assert_non_null(strstr(eb, "\"input\":\"What is sluice?\""));
    assert_non_null(strstr(eb, "\"model\":\"emb\""));
    free(eb);
    assert_string_equal(cache_req_embed_model(q), "emb");
    assert_int_equal(cache_req_embed_deadline_ms(q), 50);
    assert_int_equal(cache_req_embed_answer(q, emb1, strlen(emb1)), 0);
    assert_int_equal(cache_lookup(w, q, 30000, never_cb, NULL), CACHE_DONE);
    assert_int_equal(cache_req_state(q), CACHE_MISS);
    ans = J(answer_json);
    cache_req_record_body(q, ans);
    json_decref(ans);
    assert_int_equal(cache_store(w, q, 30000), 1);
    cache_req_free(q);
    assert_int_equal(cache_sem_count(cache_semantic(c)), 1);

    q = req(c, conf, gq2, "g", NULL, NULL);
    assert_int_equal(cache_lookup(w, q, 31000, never_cb, NULL), CACHE_DONE);
    assert_int_equal(cache_req_state(q), CACHE_MISS); /* exact: another text */
    assert_int_equal(cache_req_embed_answer(q, emb_close, strlen(emb_close)), 0);
    assert_int_equal(cache_lookup(w, q, 31000, never_cb, NULL), CACHE_DONE);
    assert_int_equal(cache_req_state(q), CACHE_HIT);
    assert_string_equal(cache_entry_content(cache_req_entry(q), 0), "你好, world\n");
    cache_req_free(q);

    q = req(c, conf, gq2, "g", NULL, NULL);
    assert_int_equal(cache_lookup(w, q, 31000, never_cb, NULL), CACHE_DONE);
    assert_int_equal(cache_req_embed_answer(q, emb_far, strlen(emb_far)), 0);
    assert_int_equal(cache_lookup(w, q, 31000, never_cb, NULL), CACHE_DONE);
    assert_int_equal(cache_req_state(q), CACHE_MISS); /* cosine 0.94 < 0.95 */
    assert_int_equal(cache_req_embed_answer(q, "{}", 2), -1);
    cache_req_free(q);
    (void)D;

    cache_worker_free(w);
    cache_free(c);
    conf_free(conf);

    /* an embed_model that names no model */
    conf = load_with("models: {a: {upstream: u}}\ncache: {semantic: {embed_model: nope}}\n");
    assert_null(cache_new(conf, err, sizeof(err)));
    assert_non_null(strstr(err, "embed_model"));
    conf_free(conf);
}

int main(void)
{
    sl_log_set_level(SL_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_control),
        cmocka_unit_test(test_policy),
        cmocka_unit_test(test_key_equal),
        cmocka_unit_test(test_key_unequal),
        cmocka_unit_test(test_key_scope_and_model),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_stream_tools),
        cmocka_unit_test(test_taints),
        cmocka_unit_test(test_lru),
        cmocka_unit_test(test_dot),
        cmocka_unit_test(test_semantic),
        cmocka_unit_test(test_semantic_two_pass),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_flow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
