/*
 * llm_metrics.c — the per-model LLM metrics of docs/metrics.md: TTFT and
 * inter-token histograms, tokens from the upstream's usage, requests by
 * model and exact status, the answering tier, and the gauges read at
 * scrape time (servers in service, the in-process engines). Labels come
 * from the conf (model, upstream names) or closed lists (code, tier, kind),
 * so the series stay bounded.
 */
#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GW_LLM_X86 1
#endif

#include <yajl/yajl_parse.h>

#include "common/jshape.h"
#include "common/sl_resp.h"
#include "common/yheap.h"
#include "fallback/fallback.h"
#include "gateway/gw_llm.h"
#include "gateway/gw_req.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_sup.h"
#include "model/model.h"

static struct {
    sl_metric_t *ttft, *itl, *tokens, *requests, *tier;
    sl_metric_t *eng_queue, *eng_busy, *eng_tokens, *servers, *in_service;
} gw_llm_m;

void gw_llm_metrics_init(void)
{
    gw_llm_m.ttft = sl_metric_register(
        "sluice_time_to_first_token_seconds",
        "From the first byte of a request to the first token sent (a non-streamed answer: "
        "its end).",
        SL_METRIC_HISTOGRAM, "model,stream", sl_metrics_ttft_buckets, sl_metrics_ttft_nbuckets);
    gw_llm_m.itl = sl_metric_register(
        "sluice_inter_token_seconds", "Gap between consecutive content events of a stream.",
        SL_METRIC_HISTOGRAM, "model", sl_metrics_itl_buckets, sl_metrics_itl_nbuckets);
    gw_llm_m.tokens =
        sl_metric_register("sluice_tokens_total", "Tokens from the upstream's usage, by model.",
                           SL_METRIC_COUNTER, "model,kind", NULL, 0);
    gw_llm_m.requests =
        sl_metric_register("sluice_model_requests_total",
                           "Client requests for a model by exact status (499: the client left).",
                           SL_METRIC_COUNTER, "model,code", NULL, 0);
    gw_llm_m.tier =
        sl_metric_register("sluice_answer_tier_total", "Which tier answered a request for a model.",
                           SL_METRIC_COUNTER, "model,tier", NULL, 0);
    gw_llm_m.eng_queue = sl_metric_register("sluice_engine_queue_length",
                                            "Requests waiting for the in-process engine.",
                                            SL_METRIC_GAUGE, "upstream", NULL, 0);
    gw_llm_m.eng_busy = sl_metric_register("sluice_engine_busy",
                                           "Sequences the in-process engine is generating now.",
                                           SL_METRIC_GAUGE, "upstream", NULL, 0);
    gw_llm_m.eng_tokens = sl_metric_register(
        "sluice_engine_tokens_total", "Tokens the in-process engine generated (kind completion).",
        SL_METRIC_COUNTER, "upstream,kind", NULL, 0);
    gw_llm_m.servers =
        sl_metric_register("sluice_upstream_servers", "Servers configured in a pool.",
                           SL_METRIC_GAUGE, "upstream", NULL, 0);
    gw_llm_m.in_service = sl_metric_register("sluice_upstream_servers_in_service",
                                             "Servers of a pool a request may be sent to now.",
                                             SL_METRIC_GAUGE, "upstream", NULL, 0);
}

/* A model's series for what nearly every request counts, looked up by
 * their label strings (a list walk under the registry's lock) once per
 * thread and model, not per request. Series live as long as the process;
 * a slot is keyed by the model's address and its rt's generation (unique
 * per build), so a reload that frees a model and puts another at its
 * address just refills the slot, without a compare of the name on every
 * request (a strcmp each of two lookups was ~80 instructions a request). */
typedef struct gw_llm_mcache {
    const gw_model_rt_t *model;
    uint64_t gen;
    sl_mseries_t *ok, *upstream, *prompt, *completion, *ttft_json, *ttft_stream;
} gw_llm_mcache_t;

#define GW_LLM_MCACHE 8
static _Thread_local gw_llm_mcache_t gw_llm_mc[GW_LLM_MCACHE];
static _Thread_local unsigned gw_llm_mc_next;

static sl_mseries_t *gw_llm_s2(sl_metric_t *m, const char *model, const char *v)
{
    const char *vals[2] = {model, v};
    return sl_metric_series(m, vals);
}

/* The model's cached series. */
static gw_llm_mcache_t *gw_llm_series(const gw_model_rt_t *model)
{
    gw_llm_mcache_t *e = NULL;
    for (unsigned i = 0; i < GW_LLM_MCACHE; i++)
        if (gw_llm_mc[i].model == model) {
            e = &gw_llm_mc[i];
            break;
        }
    if (e && e->gen == model->gen)
        return e;
    if (!e)
        e = &gw_llm_mc[gw_llm_mc_next++ % GW_LLM_MCACHE];
    memset(e, 0, sizeof(*e));
    e->model = model;
    e->gen = model->gen;
    return e;
}

/* One series of the model's slot (NULL: no slot), looked up on its first
 * use: a series appears in the output once something counted in it. */
static sl_mseries_t *gw_llm_cached(sl_mseries_t **slot, sl_metric_t *m, const char *model,
                                   const char *v)
{
    if (!slot)
        return gw_llm_s2(m, model, v);
    if (!*slot)
        *slot = gw_llm_s2(m, model, v);
    return *slot;
}

#define GW_LLM_CACHED(e, field, m, model, v) gw_llm_cached((e) ? &(e)->field : NULL, m, model, v)

/* A Responses API request that made an answer: POST /v1/responses with
 * its body (scanned or parsed). GET /v1/responses/{id} (and its
 * ?stream=true replay) or .../cancel return a stored response, usage and
 * all: not counted again. */
static bool gw_llm_resp_made(const gw_req_t *r)
{
    return r->scan || r->json;
}

/* Template and queued answers are not a model's tokens. */
static bool gw_llm_model_answers(const gw_req_t *r)
{
    return r->model && !(r->fallback && strcmp(r->fallback, "template") == 0);
}

/* Content: a chat delta's text or tool call, or a completion's text. */
static bool gw_llm_has_content(const json_t *j)
{
    const json_t *choices = json_object_get(j, "choices");
    size_t i;
    const json_t *c;
    json_array_foreach(choices, i, c)
    {
        const json_t *d = json_object_get(c, "delta");
        const json_t *s = json_object_get(d, "content");
        if (json_is_string(s) && json_string_length(s) > 0)
            return true;
        if (json_array_size(json_object_get(d, "tool_calls")) > 0)
            return true;
        s = json_object_get(c, "text");
        if (json_is_string(s) && json_string_length(s) > 0)
            return true;
    }
    return false;
}

/* Counts a usage object's prompt_tokens and completion_tokens: each an
 * integer or absent (have_*), at least one there, neither negative. */
static void gw_llm_usage_add(gw_req_t *r, bool have_p, json_int_t pv, bool have_c, json_int_t cv)
{
    if (!have_p && !have_c)
        return;
    if (!have_p)
        pv = 0;
    if (!have_c)
        cv = 0;
    if (pv < 0 || cv < 0)
        return;
    r->llm.prompt_tokens += pv;
    r->llm.completion_tokens += cv;
    r->llm.have_usage = true;
    gw_llm_mcache_t *e = gw_llm_series(r->model);
    const char *name = r->model->name;
    sl_counter_add(GW_LLM_CACHED(e, prompt, gw_llm_m.tokens, name, "prompt"), (uint64_t)pv);
    sl_counter_add(GW_LLM_CACHED(e, completion, gw_llm_m.tokens, name, "completion"), (uint64_t)cv);
}

static void gw_llm_usage(gw_req_t *r, const json_t *usage)
{
    const json_t *p = json_object_get(usage, "prompt_tokens");
    const json_t *c = json_object_get(usage, "completion_tokens");
    gw_llm_usage_add(r, json_is_integer(p), json_integer_value(p), json_is_integer(c),
                     json_integer_value(c));
}

/* A content or token arrived now: TTFT for the first, a gap for the rest. */
static void gw_llm_token(gw_req_t *r)
{
    int64_t now = r->ev_ns ? r->ev_ns : sl_now_ns();
    if (!r->llm.first_token_ns) {
        r->llm.first_token_ns = now;
        r->llm.ttft = (double)(now - r->start_ns) / 1e9;
        gw_llm_mcache_t *e = gw_llm_series(r->model);
        sl_histogram_observe(GW_LLM_CACHED(e, ttft_stream, gw_llm_m.ttft, r->model->name, "true"),
                             r->llm.ttft);
    } else {
        if (!r->llm.itl)
            r->llm.itl = sl_metric_series1(gw_llm_m.itl, r->model->name);
        sl_histogram_observe(r->llm.itl, (double)(now - r->llm.last_token_ns) / 1e9);
    }
    r->llm.last_token_ns = now;
}

static const char *gw_llm_after_key(const char *p, size_t n, const char *key, size_t klen);

/* Whether the bytes before the ':' at k end in the key lit (with quotes). */
#define GW_LLM_KEY_AT(p, k, lit)                                                                   \
    ((size_t)((k) - (p)) >= sizeof(lit) - 1 &&                                                     \
     memcmp((k) - (sizeof(lit) - 1), lit, sizeof(lit) - 1) == 0)

/* ---- a Responses API event ------------------------------------------------
 *
 * That API's events are told by their own keys: a token is a `*.delta`
 * event's non-empty `"delta":"...`, and the usage is nested in
 * response.completed (response.usage: input_tokens, output_tokens), read by
 * common/sl_resp.c with yajl's callbacks and no decoded string (the event
 * repeats the whole answer), stopping at the usage's end; a server's later
 * usage events from a shape of its first one kept there
 * (sl_resp_usage_read: the same counts, no yajl pass). */

/* The ':' of the first `":` pair whose quote is in [q, end), or NULL: two
 * loads 16 bytes at a time (SSE2), the quote bits and the next bytes'
 * colon bits ANDed; the last bytes one by one. A colon after anything but
 * a quote (a URL's, a time's) is never stopped at. */
static inline const char *gw_llm_quote_colon(const char *q, const char *end)
{
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), colon = _mm_set1_epi8(':');
    for (; end - q > 16; q += 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)q);
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(q + 1));
        unsigned m = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(a, quote)) &
                     (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(b, colon));
        if (m)
            return q + __builtin_ctz(m) + 1;
    }
#endif
    for (; end - q > 1; q++)
        if (q[0] == '"' && q[1] == ':')
            return q + 1;
    return NULL;
}

/* The next `"key":` of [p, end) from *q on (*q moves past it): its ':',
 * the key read backwards from there (an unescaped `"key"` ending in a
 * quote right before ':' is a key, never string content). Only a ':'
 * right after a quote can end a key: gw_llm_quote_colon finds those alone
 * (the byte before *q is p's first or a colon already passed, never a
 * quote, so the pairs from *q on are the colons from *q on with a quote
 * before). */
static inline const char *gw_llm_next_key(const char *end, const char **q)
{
    if (*q >= end || (*q = gw_llm_quote_colon(*q, end)) == NULL)
        return NULL;
    return (*q)++;
}

/* The value after the key whose ':' is at k, past blanks; NULL when only
 * blanks follow (then no key follows either: a caller stops). Asked only
 * for the keys a scan looks at. */
static inline const char *gw_llm_value(const char *k, const char *end)
{
    const char *w = k + 1;
    while (w < end && (*w == ' ' || *w == '\t'))
        w++;
    return w == end ? NULL : w;
}

/* The ':' of the first `ta":` or `ge":` at p[c..n) (c >= 7: room for a
 * 7-byte key before it), or n: the last two letters of `"delta"` and
 * `"usage"` with the quote and colon after them. Of a Responses event's
 * ~10 keys only those two (and the rare key ending so) stop the pass,
 * where gw_llm_quote_colon stops at every key. Three loads a block; the
 * last block overlaps the one before (the bits already passed masked
 * off), so only an event under 23 bytes goes byte by byte. */
#define GW_LLM_RESP_EQ(P, SI, b, ch)                                                               \
    P##_cmpeq_epi8(P##_loadu_##SI((const void *)(p + (b))), P##_set1_epi8(ch))
#define GW_LLM_RESP_BITS(P, SI, b)                                                                 \
    ((unsigned)P##_movemask_epi8(P##_and_##SI(                                                     \
        P##_and_##SI(GW_LLM_RESP_EQ(P, SI, b, ':'), GW_LLM_RESP_EQ(P, SI, (b)-1, '"')),            \
        P##_or_##SI(GW_LLM_RESP_EQ(P, SI, (b)-3, 't'), GW_LLM_RESP_EQ(P, SI, (b)-3, 'g')))))

static size_t gw_llm_resp_next_sse2(const char *p, size_t c, size_t n)
{
#if defined(__SSE2__)
    for (; c + 16 <= n; c += 16) {
        unsigned m = GW_LLM_RESP_BITS(_mm, si128, c);
        if (m)
            return c + (size_t)__builtin_ctz(m);
    }
    if (c < n && n >= 23) { /* the last block, from n - 16 (>= 7, < c) */
        size_t b = n - 16;
        unsigned m = GW_LLM_RESP_BITS(_mm, si128, b) & (~0u << (c - b));
        return m ? b + (size_t)__builtin_ctz(m) : n;
    }
#endif
    for (; c < n; c++)
        if (p[c] == ':' && p[c - 1] == '"' && (p[c - 3] == 't' || p[c - 3] == 'g'))
            return c;
    return n;
}

#ifdef GW_LLM_X86
/* The same, 32 bytes a block; an event under 39 bytes, the SSE2 one. */
__attribute__((target("avx2"))) static size_t gw_llm_resp_next_avx2(const char *p, size_t c,
                                                                    size_t n)
{
    for (; c + 32 <= n; c += 32) {
        unsigned m = GW_LLM_RESP_BITS(_mm256, si256, c);
        if (m)
            return c + (size_t)__builtin_ctz(m);
    }
    if (c < n && n >= 39) { /* the last block, from n - 32 (>= 7, < c) */
        size_t b = n - 32;
        unsigned m = GW_LLM_RESP_BITS(_mm256, si256, b) & (~0u << (c - b));
        return m ? b + (size_t)__builtin_ctz(m) : n;
    }
    return gw_llm_resp_next_sse2(p, c, n);
}
#endif
#undef GW_LLM_RESP_BITS
#undef GW_LLM_RESP_EQ

/* Whether gw_llm_resp_next takes the AVX2 pass (tests: false holds it to
 * the SSE2 one). */
static bool gw_llm_resp_avx2_on = true;

void gw_llm_resp_avx2_set(bool on)
{
    gw_llm_resp_avx2_on = on;
}

static inline size_t gw_llm_resp_next(const char *p, size_t c, size_t n)
{
#ifdef GW_LLM_X86
    if (gw_llm_resp_avx2_on && __builtin_cpu_supports("avx2"))
        return gw_llm_resp_next_avx2(p, c, n);
#endif
    return gw_llm_resp_next_sse2(p, c, n);
}

/* One pass over a Responses event's bytes: true when a `"usage":` holds an
 * object (response.completed's); *content when a `"delta":` holds a
 * non-empty string. Every `"usage":` and `"delta":` is a stop of
 * gw_llm_resp_next (the same keys, in the same order, as a pass over
 * every `":` pair). */
bool gw_llm_resp_scan(const char *p, size_t n, bool *content)
{
    const char *end = p + n;
    bool usage = false;
    *content = false;
    for (size_t c = gw_llm_resp_next(p, 7, n); c < n; c = gw_llm_resp_next(p, c + 1, n)) {
        const char *k = p + c;
        bool u = GW_LLM_KEY_AT(p, k, "\"usage\"");
        if (!u && !GW_LLM_KEY_AT(p, k, "\"delta\""))
            continue;
        const char *v = gw_llm_value(k, end);
        if (!v)
            break;
        if (u)
            usage |= *v == '{';
        else if (*v == '"' && v + 1 < end && v[1] != '"')
            *content = true;
    }
    return usage;
}

/* A Responses event's data that holds a usage object: response.usage. */
static void gw_llm_resp_usage(gw_req_t *r, const char *data, size_t len)
{
    sl_resp_ev_t e;
    if (sl_resp_usage_read(data, len, &e) == 0 && e.usage)
        gw_llm_usage_add(r, e.have_in, e.in, e.have_out, e.out);
}

/* gw_llm_event for a Responses event's data. */
static bool gw_llm_resp_event(gw_req_t *r, const char *data, size_t len)
{
    bool content;
    bool usage = gw_llm_resp_scan(data, len, &content);
    if (content)
        gw_llm_token(r);
    if (usage)
        gw_llm_resp_usage(r, data, len);
    return usage;
}

bool gw_llm_event(gw_req_t *r, const char *data, size_t len)
{
    if (!gw_llm_model_answers(r) || len == 0 || data[0] != '{')
        return true; /* [DONE], or not a JSON chunk */
    if (r->route == GW_ROUTE_RESPONSES)
        return gw_llm_resp_made(r) ? gw_llm_resp_event(r, data, len) : true;
    bool content;
    if (!gw_llm_scan_keys(data, len, &content)) { /* most events: a scan, no parse */
        if (content)
            gw_llm_token(r);
        return false;
    }
    json_t *j = json_loadb(data, len, 0, NULL);
    if (!j)
        return true;
    const json_t *usage = json_object_get(j, "usage");
    if (json_is_object(usage))
        gw_llm_usage(r, usage);
    if (gw_llm_has_content(j))
        gw_llm_token(r);
    json_decref(j);
    return true;
}

/* `"key":` then optional blanks, then what follows, or NULL. Inside a JSON
 * string a quote is always escaped, so an unescaped `"key":` is a key. */
static const char *gw_llm_after_key(const char *p, size_t n, const char *key, size_t klen)
{
    const char *end = p + n;
    while (p < end) {
        const char *k = gw_sse_find(p, (size_t)(end - p), key, klen, klen - 1); /* at ':' */
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

bool gw_llm_has_usage_key(const char *p, size_t n)
{
    /* an object, not the "usage":null some servers put in every chunk */
    const char *end = p + n;
    while (p < end) {
        const char *v = gw_llm_after_key(p, (size_t)(end - p), "\"usage\":", 8);
        if (!v)
            return false;
        if (*v == '{')
            return true;
        p = v;
    }
    return false;
}

bool gw_llm_scan_keys(const char *p, size_t n, bool *content)
{
    /* Every `"key":` is found at its ':' (a byte an event has about ten
     * of): gw_llm_next_key. */
    const char *end = p + n, *q = p;
    bool usage = false;
    *content = false;
    for (const char *k; (k = gw_llm_next_key(end, &q)) != NULL;) {
        int kind = GW_LLM_KEY_AT(p, k, "\"usage\"")                                        ? 1
                   : GW_LLM_KEY_AT(p, k, "\"content\"") || GW_LLM_KEY_AT(p, k, "\"text\"") ? 2
                   : GW_LLM_KEY_AT(p, k, "\"tool_calls\"")                                 ? 3
                                                                                           : 0;
        if (!kind)
            continue;
        const char *v = gw_llm_value(k, end);
        if (!v)
            break;
        if (kind == 1) {
            if (*v == '{')
                usage = true; /* not the "usage":null some servers put in every chunk */
        } else if (kind == 2) {
            if (*v == '"' && v + 1 < end && v[1] != '"')
                *content = true;
        } else if (*v == '[' && v + 1 < end && v[1] != ']') {
            *content = true;
        }
    }
    return usage;
}

bool gw_llm_sse_event(gw_req_t *r, const gw_sse_event_t *ev)
{
    if (!gw_llm_model_answers(r) || ev->done)
        return true;
    bool content;
    bool resp = r->route == GW_ROUTE_RESPONSES;
    if (resp && !gw_llm_resp_made(r))
        return true; /* not looked at */
    bool usage = resp ? gw_llm_resp_scan(ev->raw, ev->raw_len, &content)
                      : gw_llm_event_keys(ev->raw, ev->raw_len, &content);
    if (!usage || resp) {
        if (content)
            gw_llm_token(r);
        if (!usage)
            return false;
    }
    /* the usage chunk (or one that also carries usage): parse it (a
     * Responses event: its response.usage alone, its content told above) */
    if (ev->data) { /* one data line: found in place by the splitter */
        if (ev->data_len && resp)
            gw_llm_resp_usage(r, ev->data, ev->data_len);
        else if (ev->data_len)
            gw_llm_event(r, ev->data, ev->data_len);
        return true;
    }
    char stack[2048], *data = stack;
    long dl = gw_sse_event_data(ev, stack, sizeof(stack));
    if (dl < 0) {
        data = malloc(ev->raw_len + 1);
        dl = data ? gw_sse_event_data(ev, data, ev->raw_len + 1) : -1;
    }
    if (dl > 0 && resp)
        gw_llm_resp_usage(r, data, (size_t)dl);
    else if (dl > 0)
        gw_llm_event(r, data, (size_t)dl);
    if (data != stack)
        free(data);
    return true;
}

void gw_llm_body(gw_req_t *r, const json_t *body)
{
    const json_t *usage = json_object_get(body, "usage");
    if (gw_llm_model_answers(r) && json_is_object(usage))
        gw_llm_usage(r, usage);
}

void gw_llm_body_bytes(gw_req_t *r, const char *p, size_t n)
{
    if (!gw_llm_model_answers(r) ||
        (r->route != GW_ROUTE_CHAT && r->route != GW_ROUTE_COMPLETIONS &&
         (r->route != GW_ROUTE_RESPONSES || !gw_llm_resp_made(r))))
        return;
    if (!r->llm.tail && !(r->llm.tail = malloc(GW_LLM_TAIL)))
        return; /* no usage then: the metrics add nothing */
    if (n >= GW_LLM_TAIL) {
        memcpy(r->llm.tail, p + n - GW_LLM_TAIL, GW_LLM_TAIL);
        r->llm.tail_len = GW_LLM_TAIL;
        return;
    }
    if (r->llm.tail_len + n > GW_LLM_TAIL) {
        size_t drop = r->llm.tail_len + n - GW_LLM_TAIL;
        memmove(r->llm.tail, r->llm.tail + drop, r->llm.tail_len - drop);
        r->llm.tail_len -= drop;
    }
    memcpy(r->llm.tail + r->llm.tail_len, p, n);
    r->llm.tail_len += n;
}

/* The usage object of a JSON answer, read by yajl with callbacks: only
 * its own two integer members are kept, and the parse stops at the
 * object's end (what follows it is the rest of the answer). Once per
 * request, so no tree and no malloc: yajl's few blocks come from a buffer
 * on the stack (common/yheap.h). The counts are taken only when the whole
 * object parsed, as a tree parse would have them. */
typedef struct gw_llm_uparse {
    yajl_handle h;       /* where a value ends: yajl_get_bytes_consumed */
    const char *base;    /* the text given to yajl */
    int depth;           /* 1: inside the usage object itself */
    int key;             /* the member whose value comes next: 0 other, 1 prompt, 2 completion */
    bool resp;           /* the Responses API's names: input_tokens, output_tokens */
    bool closed;         /* the usage object ended */
    bool have_p, have_c; /* an integer value was seen */
    long long pv, cv;
    /* For the kept shape: every integer is a hole; hp / hc the hole whose
     * value was taken (yajl's last), -1 none; odd: not to be kept (an
     * integer too long for a hole, too many). end: the object's length. */
    bool odd;
    int hp, hc;
    size_t end, nholes;
    sl_jspan_t hole[SL_JSHAPE_MAX_HOLES];
} gw_llm_uparse_t;

static int gw_llm_up_value(void *ctx)
{
    ((gw_llm_uparse_t *)ctx)->key = 0;
    return 1;
}

static int gw_llm_up_bool(void *ctx, int v)
{
    (void)v;
    return gw_llm_up_value(ctx);
}

static int gw_llm_up_double(void *ctx, double v)
{
    (void)v;
    return gw_llm_up_value(ctx);
}

static int gw_llm_up_string(void *ctx, const unsigned char *s, size_t n)
{
    (void)s;
    (void)n;
    return gw_llm_up_value(ctx);
}

/* The integer token yajl just read, in h's text base: it ends where yajl
 * stopped (the byte after it was put back), and starts after the ':', ','
 * '[' or blank before it. false: too long for a hole. */
static bool gw_llm_int_span(yajl_handle h, const char *base, sl_jspan_t *sp)
{
    size_t end = yajl_get_bytes_consumed(h), b = end;
    while (b > 0 && ((base[b - 1] >= '0' && base[b - 1] <= '9') || base[b - 1] == '-'))
        b--;
    sp->off = (uint32_t)b;
    sp->len = (uint32_t)(end - b);
    size_t digits = end - b - (end > b && base[b] == '-');
    return digits > 0 && digits <= SL_JSHAPE_INT_DIGITS && end <= UINT32_MAX;
}

static int gw_llm_up_integer(void *ctx, long long v)
{
    gw_llm_uparse_t *u = ctx;
    int hole = -1;
    if (u->nholes < SL_JSHAPE_MAX_HOLES && gw_llm_int_span(u->h, u->base, &u->hole[u->nholes]))
        hole = (int)u->nholes++;
    else
        u->odd = true;
    if (u->key == 1) {
        u->have_p = true;
        u->pv = v;
        u->hp = hole;
    } else if (u->key == 2) {
        u->have_c = true;
        u->cv = v;
        u->hc = hole;
    }
    u->key = 0;
    return 1;
}

static int gw_llm_up_map_key(void *ctx, const unsigned char *k, size_t n)
{
    gw_llm_uparse_t *u = ctx;
    u->key = 0;
    if (u->depth != 1)
        return 1;
    if (u->resp ? n == 12 && memcmp(k, "input_tokens", 12) == 0
                : n == 13 && memcmp(k, "prompt_tokens", 13) == 0)
        u->key = 1;
    else if (u->resp ? n == 13 && memcmp(k, "output_tokens", 13) == 0
                     : n == 17 && memcmp(k, "completion_tokens", 17) == 0)
        u->key = 2;
    return 1;
}

static int gw_llm_up_open(void *ctx)
{
    gw_llm_uparse_t *u = ctx;
    u->depth++;
    u->key = 0;
    return 1;
}

static int gw_llm_up_close(void *ctx)
{
    gw_llm_uparse_t *u = ctx;
    if (--u->depth == 0) {
        u->closed = true;
        u->end = yajl_get_bytes_consumed(u->h);
        return 0; /* the object is whole: stop here */
    }
    return 1;
}

static const yajl_callbacks gw_llm_up_cbs = {
    .yajl_null = gw_llm_up_value,
    .yajl_boolean = gw_llm_up_bool,
    .yajl_integer = gw_llm_up_integer,
    .yajl_double = gw_llm_up_double,
    .yajl_string = gw_llm_up_string,
    .yajl_start_map = gw_llm_up_open,
    .yajl_map_key = gw_llm_up_map_key,
    .yajl_end_map = gw_llm_up_close,
    .yajl_start_array = gw_llm_up_open,
    .yajl_end_array = gw_llm_up_close,
};

/* ---- kept shapes (common/jshape.h) ----------------------------------------
 *
 * Per thread, a few texts the parse (or the scan) read before, kept as
 * shapes: a text with a kept shape reads the same, so its facts are taken
 * from the shape and its holes' spans instead of a parse. Nothing of the
 * conf goes into what is read here, so the shapes need no key besides the
 * bytes. Two caches of the thread (common/jshape.h's sl_jshape_cache_t:
 * empty slots then the least recently used, freed at thread exit). */
#define GW_LLM_USHAPES 2 /* usage objects of JSON answers */
#define GW_LLM_ESHAPES 4 /* SSE events: a stream's first, content and last chunks */
/* A miss learns (an event: one yajl parse; a usage object: its copy) while
 * fewer than this many learns came since the last hit; then one miss in
 * GW_LLM_LEARN_EVERY: a stream of ever new shapes costs a parse per 64
 * events, not one per event (the caches' gate). */
#define GW_LLM_LEARN_FREE  4
#define GW_LLM_LEARN_EVERY 64

/* What a usage slot keeps beside its shape. */
typedef struct gw_llm_ushape {
    int hp, hc; /* the hole of prompt_tokens' / completion_tokens' value, -1 none */
    bool resp;  /* learnt with the Responses API's names */
} gw_llm_ushape_t;

/* What an event slot keeps beside its shape sh. */
typedef struct gw_llm_eshape {
    uint64_t cmask; /* string holes the scan reads as content when not empty */
    bool content;   /* content from the shape's own bytes */
    /* The same shape with only its content holes left, the others filled
     * with the values of a text that had sh: a stream's events differ only
     * in their content, and a text that has fast has sh (what fills a hole
     * is a value of the hole's kind), at one compare over its bytes instead
     * of a run per hole. Made again from a text that had sh and not fast,
     * when the last one served or one time in 8 (an id per event). */
    sl_jshape_t fast;
    unsigned fast_hits, fast_tries;
} gw_llm_eshape_t;

static void gw_llm_eshape_drop(void *p)
{
    gw_llm_eshape_t *k = p;
    sl_jshape_clear(&k->fast);
}

static _Thread_local sl_jshape_cache_t gw_llm_uc = SL_JSHAPE_CACHE_INIT(
    GW_LLM_USHAPES, GW_LLM_LEARN_FREE, GW_LLM_LEARN_EVERY, sizeof(gw_llm_ushape_t), NULL);
static _Thread_local sl_jshape_cache_t gw_llm_ec =
    SL_JSHAPE_CACHE_INIT(GW_LLM_ESHAPES, GW_LLM_LEARN_FREE, GW_LLM_LEARN_EVERY,
                         sizeof(gw_llm_eshape_t), gw_llm_eshape_drop);
static _Thread_local uint64_t gw_llm_e_fast; /* of the event hits: through a fast shape */

void gw_llm_shapes_clear(void)
{
    sl_jshape_cache_clear(&gw_llm_uc);
    sl_jshape_cache_clear(&gw_llm_ec);
    gw_llm_e_fast = 0;
}

gw_llm_shape_stats_t gw_llm_shape_stats(void)
{
    return (gw_llm_shape_stats_t){
        .u_hits = gw_llm_uc.st.hits,
        .u_misses = gw_llm_uc.st.misses,
        .e_hits = gw_llm_ec.st.hits,
        .e_misses = gw_llm_ec.st.misses,
        .e_learns = gw_llm_ec.st.learns,
        .e_fast = gw_llm_e_fast,
    };
}

/* A hole's value as an integer fact: the hole's, or none. */
static void gw_llm_hole_int(const char *p, const sl_jspan_t *sp, int hole, bool *have, long long *v)
{
    *have = hole >= 0;
    *v = hole >= 0 ? sl_jshape_int(p + sp[hole].off, sp[hole].len) : 0;
}

/* The usage object through a kept shape: what yajl would read, from the
 * holes (the object's bytes only: yajl stops at its '}'). */
static bool gw_llm_usage_kept(const char *obj, size_t n, bool resp, gw_llm_uread_t *out)
{
    sl_jshape_cache_t *c = &gw_llm_uc;
    sl_jspan_t sp[SL_JSHAPE_MAX_HOLES];
    size_t used;
    for (unsigned i = 0; i < GW_LLM_USHAPES; i++) {
        const sl_jshape_t *sh = &c->slot[i].sh;
        const gw_llm_ushape_t *u = c->slot[i].data;
        if (sl_jshape_empty(sh) || !u || u->resp != resp ||
            !sl_jshape_match_prefix(sh, obj, n, sp, &used))
            continue;
        out->closed = true;
        gw_llm_hole_int(obj, sp, u->hp, &out->have_p, &out->pv);
        gw_llm_hole_int(obj, sp, u->hc, &out->have_c, &out->cv);
        sl_jshape_cache_hit(c, i);
        return true;
    }
    return false;
}

/* A usage object yajl read whole, kept as a shape (its integers the holes). */
static void gw_llm_usage_learn(const char *obj, const gw_llm_uparse_t *u)
{
    if (u->odd)
        return;
    uint8_t kinds[SL_JSHAPE_MAX_HOLES];
    memset(kinds, SL_JHOLE_INT, u->nholes);
    int i = sl_jshape_cache_take(&gw_llm_uc);
    if (i < 0)
        return;
    gw_llm_ushape_t *k = gw_llm_uc.slot[i].data;
    k->hp = u->hp;
    k->hc = u->hc;
    k->resp = u->resp;
    if (sl_jshape_cache_set(&gw_llm_uc, (unsigned)i, obj, u->end, u->hole, kinds, u->nholes) != 0)
        return; /* empty then */
}

/* gw_llm_usage_read with the Responses API's names when resp. */
static void gw_llm_usage_read_as(const char *obj, size_t n, bool kept, bool resp,
                                 gw_llm_uread_t *out)
{
    memset(out, 0, sizeof(*out));
    if (kept) {
        if (gw_llm_usage_kept(obj, n, resp, out))
            return;
        sl_jshape_cache_miss(&gw_llm_uc);
    }
    gw_llm_uparse_t u = {.base = obj, .hp = -1, .hc = -1, .resp = resp};
    sl_yheap_t heap;
    yajl_alloc_funcs af = sl_yheap_funcs(&heap);
    yajl_handle h = yajl_alloc(&gw_llm_up_cbs, &af, &u);
    if (!h)
        return;
    u.h = h;
    (void)yajl_parse(h, (const unsigned char *)obj, n); /* client_canceled at its end */
    yajl_free(h);
    if (!u.closed)
        return;
    *out = (gw_llm_uread_t){
        .closed = true, .have_p = u.have_p, .have_c = u.have_c, .pv = u.pv, .cv = u.cv};
    if (kept && sl_jshape_cache_gate(&gw_llm_uc))
        gw_llm_usage_learn(obj, &u);
}

void gw_llm_usage_read(const char *obj, size_t n, bool kept, gw_llm_uread_t *out)
{
    gw_llm_usage_read_as(obj, n, kept, false, out);
}

void gw_llm_resp_usage_read(const char *obj, size_t n, bool kept, gw_llm_uread_t *out)
{
    gw_llm_usage_read_as(obj, n, kept, true, out);
}

/* obj..end starts with the usage object's '{' (a Responses answer's:
 * input_tokens, output_tokens). */
static void gw_llm_usage_bytes(gw_req_t *r, const char *obj, size_t n)
{
    gw_llm_uread_t u;
    gw_llm_usage_read_as(obj, n, true, r->route == GW_ROUTE_RESPONSES, &u);
    if (u.closed)
        gw_llm_usage_add(r, u.have_p, u.pv, u.have_c, u.cv);
}

/* ---- an SSE event's shape ------------------------------------------------
 *
 * Learnt from an event `data: {...}` on one line that holds no usage
 * object (the usage chunk goes the parse's way each time): yajl finds the
 * holes, the values of keys llm_metrics never interprets (ids, the model,
 * the fingerprint, created) or reads only as empty or not (content, text,
 * arguments), strings as escaped-string holes (SL_JHOLE_ESTR: content
 * often holds a \n). finish_reason, role, types, booleans, null,
 * tool_calls' brackets stay the shape's bytes. The facts are
 * gw_llm_scan_keys' on the text: its scan meets a hole's bytes only as the
 * byte after a `"content":"` or `"text":"`. No key is read inside a hole:
 * a '"' there is escaped, so the byte before it is a '\\', and a value's
 * opening quote follows ':', ',', '[' or a blank, where a key read back
 * from a ':' needs a letter before its last '"'. So content is the
 * shape's own, or one of those holes not empty. */
typedef struct gw_llm_eparse {
    yajl_handle h;
    const char *base; /* the event's JSON */
    size_t len;
    int want; /* the next value: 0 bytes of the shape, 1 a string hole, 2 an integer hole */
    size_t nholes;
    sl_jspan_t hole[SL_JSHAPE_MAX_HOLES];
    uint8_t kind[SL_JSHAPE_MAX_HOLES];
} gw_llm_eparse_t;

static int gw_llm_ep_other(void *ctx)
{
    ((gw_llm_eparse_t *)ctx)->want = 0;
    return 1;
}

static int gw_llm_ep_bool(void *ctx, int v)
{
    (void)v;
    return gw_llm_ep_other(ctx);
}

static int gw_llm_ep_double(void *ctx, double v)
{
    (void)v;
    return gw_llm_ep_other(ctx);
}

static int gw_llm_ep_key(void *ctx, const unsigned char *k, size_t n)
{
    static const char *const str_keys[] = {"id",   "model",     "system_fingerprint", "content",
                                           "text", "arguments", "reasoning_content"};
    gw_llm_eparse_t *e = ctx;
    e->want = 0;
    for (size_t i = 0; i < sizeof(str_keys) / sizeof(str_keys[0]); i++)
        if (strlen(str_keys[i]) == n && memcmp(k, str_keys[i], n) == 0)
            e->want = 1;
    if (n == 7 && memcmp(k, "created", 7) == 0)
        e->want = 2;
    return 1;
}

/* The string yajl just read, in e's text: it ends at the '"' before where
 * yajl stopped and starts after the '"' before that which no odd run of
 * '\\' escapes. sl_jshape_set checks the span again. */
static bool gw_llm_str_span(const gw_llm_eparse_t *e, sl_jspan_t *sp)
{
    size_t end = yajl_get_bytes_consumed(e->h);
    if (end == 0 || end > e->len || e->base[end - 1] != '"')
        return false;
    size_t close = end - 1, q = close;
    while (q > 0) {
        const char *f = memrchr(e->base, '"', q);
        if (!f)
            return false;
        q = (size_t)(f - e->base);
        size_t bs = 0;
        while (bs < q && e->base[q - 1 - bs] == '\\')
            bs++;
        if (bs % 2 == 0) {
            sp->off = (uint32_t)(q + 1);
            sp->len = (uint32_t)(close - q - 1);
            return true;
        }
    }
    return false;
}

/* A string value of a hole's key: a hole, escapes and all (its bytes are
 * only read as empty or not). */
static int gw_llm_ep_string(void *ctx, const unsigned char *s, size_t n)
{
    (void)s;
    (void)n;
    gw_llm_eparse_t *e = ctx;
    if (e->want == 1 && e->nholes < SL_JSHAPE_MAX_HOLES && gw_llm_str_span(e, &e->hole[e->nholes]))
        e->kind[e->nholes++] = SL_JHOLE_ESTR;
    e->want = 0;
    return 1;
}

static int gw_llm_ep_integer(void *ctx, long long v)
{
    (void)v;
    gw_llm_eparse_t *e = ctx;
    if (e->want == 2 && e->nholes < SL_JSHAPE_MAX_HOLES &&
        gw_llm_int_span(e->h, e->base, &e->hole[e->nholes]))
        e->kind[e->nholes++] = SL_JHOLE_INT;
    e->want = 0;
    return 1;
}

static const yajl_callbacks gw_llm_ep_cbs = {
    .yajl_null = gw_llm_ep_other,
    .yajl_boolean = gw_llm_ep_bool,
    .yajl_integer = gw_llm_ep_integer,
    .yajl_double = gw_llm_ep_double,
    .yajl_string = gw_llm_ep_string,
    .yajl_start_map = gw_llm_ep_other,
    .yajl_map_key = gw_llm_ep_key,
    .yajl_start_array = gw_llm_ep_other,
};

/* Whether the scan reads the string hole at off as content when not
 * empty: `"content":` or `"text":`, blanks, then its opening quote. */
static bool gw_llm_hole_content(const char *p, size_t off)
{
    size_t j = off - 1; /* the opening quote */
    while (j > 0 && (p[j - 1] == ' ' || p[j - 1] == '\t'))
        j--;
    if (j < 2 || p[j - 1] != ':' || p[j - 2] != '"')
        return false;
    const char *k = p + j - 1;
    return GW_LLM_KEY_AT(p, k, "\"content\"") || GW_LLM_KEY_AT(p, k, "\"text\"");
}

/* The event raw (n bytes, no usage object in it) kept as a shape when it
 * is one `data:` line of a JSON object yajl reads whole. */
static void gw_llm_event_learn(const char *raw, size_t n)
{
    size_t pre = n > 6 && memcmp(raw, "data: ", 6) == 0  ? 6
                 : n > 5 && memcmp(raw, "data:", 5) == 0 ? 5
                                                         : 0;
    if (!pre || n < pre + 4 || n > SL_JSHAPE_MAX_BYTES || memcmp(raw + n - 2, "\n\n", 2) != 0)
        return;
    const char *js = raw + pre;
    size_t jn = n - pre - 2;
    if (js[0] != '{' || memchr(js, '\n', jn) || memchr(js, '\r', jn))
        return;
    gw_llm_eparse_t e = {.base = js, .len = jn};
    sl_yheap_t heap;
    yajl_alloc_funcs af = sl_yheap_funcs(&heap);
    yajl_handle h = yajl_alloc(&gw_llm_ep_cbs, &af, &e);
    if (!h)
        return;
    e.h = h;
    bool ok = yajl_parse(h, (const unsigned char *)js, jn) == yajl_status_ok &&
              yajl_complete_parse(h) == yajl_status_ok;
    yajl_free(h);
    char *flat = ok ? malloc(n) : NULL; /* the text with its string holes empty */
    if (!flat)
        return;
    uint64_t cmask = 0;
    size_t fl = 0, at = 0;
    for (size_t i = 0; i < e.nholes; i++) {
        e.hole[i].off += (uint32_t)pre;
        if (e.kind[i] != SL_JHOLE_ESTR)
            continue;
        if (gw_llm_hole_content(raw, e.hole[i].off))
            cmask |= (uint64_t)1 << i;
        memcpy(flat + fl, raw + at, e.hole[i].off - at);
        fl += e.hole[i].off - at;
        at = (size_t)e.hole[i].off + e.hole[i].len;
    }
    memcpy(flat + fl, raw + at, n - at);
    fl += n - at;
    bool content;
    bool usage = gw_llm_scan_keys(flat, fl, &content);
    free(flat);
    if (usage)
        return;
    int i = sl_jshape_cache_take(&gw_llm_ec);
    if (i < 0)
        return;
    gw_llm_eshape_t *k = gw_llm_ec.slot[i].data;
    sl_jshape_clear(&k->fast); /* made from the shape it replaces */
    k->fast_hits = k->fast_tries = 0;
    k->cmask = cmask;
    k->content = content;
    if (sl_jshape_cache_set(&gw_llm_ec, (unsigned)i, raw, n, e.hole, e.kind, e.nholes) != 0)
        return; /* empty then */
}

/* k's fast shape from raw, a text that has k's shape with holes sp. */
static void gw_llm_event_fast(gw_llm_eshape_t *k, const char *raw, size_t n, const sl_jspan_t *sp)
{
    sl_jspan_t h[SL_JSHAPE_MAX_HOLES];
    uint8_t kinds[SL_JSHAPE_MAX_HOLES];
    size_t nh = 0;
    for (uint64_t m = k->cmask; m; m &= m - 1) {
        h[nh] = sp[__builtin_ctzll(m)];
        kinds[nh++] = SL_JHOLE_ESTR;
    }
    k->fast_hits = 0;
    if (sl_jshape_set(&k->fast, raw, n, h, kinds, nh) != 0)
        sl_jshape_clear(&k->fast);
}

/* Whether raw has slot s's fast shape, or else its shape (*content then
 * told). */
static bool gw_llm_event_match(const sl_jshape_slot_t *s, const char *raw, size_t n, bool *content)
{
    gw_llm_eshape_t *k = s->data;
    if (!k)
        return false; /* never taken */
    sl_jspan_t sp[SL_JSHAPE_MAX_HOLES];
    bool c = k->content;
    if (!sl_jshape_empty(&k->fast) && sl_jshape_match(&k->fast, raw, n, sp)) {
        for (size_t i = 0; i < k->fast.nholes && !c; i++)
            c = sp[i].len > 0;
        k->fast_hits++;
        gw_llm_e_fast++;
    } else if (!sl_jshape_empty(&s->sh) && sl_jshape_match(&s->sh, raw, n, sp)) {
        for (uint64_t m = k->cmask; m && !c; m &= m - 1)
            c = sp[__builtin_ctzll(m)].len > 0;
        if (sl_jshape_empty(&k->fast) || k->fast_hits > 0 || ++k->fast_tries % 8 == 0)
            gw_llm_event_fast(k, raw, n, sp);
    } else {
        return false;
    }
    *content = c;
    return true;
}

bool gw_llm_event_keys(const char *raw, size_t n, bool *content)
{
    sl_jshape_cache_t *c = &gw_llm_ec;
    for (unsigned t = 0; t < GW_LLM_ESHAPES; t++) {
        unsigned i = c->last + t; /* the last hit's first */
        if (i >= GW_LLM_ESHAPES)
            i -= GW_LLM_ESHAPES;
        if (!gw_llm_event_match(&c->slot[i], raw, n, content))
            continue;
        sl_jshape_cache_hit(c, i);
        return false;
    }
    sl_jshape_cache_miss(c);
    bool usage = gw_llm_scan_keys(raw, n, content);
    if (!usage && sl_jshape_cache_gate(c))
        gw_llm_event_learn(raw, n);
    return usage;
}

/* The usage object in the answer's tail: the last `"usage":{`. Found from
 * the end, one ':' at a time with the key before it read (the usage member
 * is near an answer's end: a few colons back, where a forward search
 * passed every ':' of the answer, ~500 instructions for a 282-byte one). A
 * quote inside a string is escaped, so `"usage":` there is never a key. */
static void gw_llm_tail_usage(gw_req_t *r)
{
    const char *p = r->llm.tail, *end = p + r->llm.tail_len;
    size_t n = r->llm.tail_len;
    while (n > 0) {
        const char *k = memrchr(p, ':', n);
        if (!k)
            return;
        n = (size_t)(k - p);
        if (!GW_LLM_KEY_AT(p, k, "\"usage\""))
            continue;
        const char *v = k + 1;
        while (v < end && (*v == ' ' || *v == '\t'))
            v++;
        if (v < end && *v == '{') {
            gw_llm_usage_bytes(r, v, (size_t)(end - v));
            return;
        }
    }
}

void gw_llm_req_free(gw_req_t *r)
{
    free(r->llm.tail);
    r->llm.tail = NULL;
    r->llm.tail_len = 0;
}

/* The tier of a request served first time by its upstream, returned as
 * this array so gw_llm_req_end knows it by its address. */
static const char gw_llm_tier_upstream[] = "upstream";

const char *gw_llm_tier(const gw_req_t *r)
{
    if (r->status < 200 || r->status >= 400)
        return "error";
    if (gw_req_queued_id(r)[0])
        return "queue";
    if (r->fallback && strcmp(r->fallback, "template") == 0)
        return "template";
    if ((r->fallback && strcmp(r->fallback, "local") == 0) || r->routed_local)
        return "local";
    if (r->retries > 0)
        return "retry";
    return gw_llm_tier_upstream;
}

static const char *gw_llm_code(int status, char *buf, size_t cap)
{
    static const int codes[] = {200, 202, 400, 401, 403, 404, 405, 408, 409,
                                413, 422, 429, 499, 500, 502, 503, 504};
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
        if (codes[i] == status) {
            snprintf(buf, cap, "%d", status);
            return buf;
        }
    return "other";
}

void gw_llm_req_end(gw_req_t *r, int64_t now_ns)
{
    if (!r->model)
        return; /* refused before its model was known: not a model's request */
    if (r->llm.tail && !r->llm.have_usage && r->att.upstatus >= 200 && r->att.upstatus < 300)
        gw_llm_tail_usage(r);
    gw_llm_mcache_t *e = gw_llm_series(r->model);
    const char *name = r->model->name;
    char code[8];
    if (r->status == 200)
        sl_counter_add(GW_LLM_CACHED(e, ok, gw_llm_m.requests, name, "200"), 1);
    else
        sl_counter_add(
            gw_llm_s2(gw_llm_m.requests, name, gw_llm_code(r->status, code, sizeof(code))), 1);
    const char *tier = gw_llm_tier(r);
    if (tier == gw_llm_tier_upstream)
        sl_counter_add(GW_LLM_CACHED(e, upstream, gw_llm_m.tier, name, tier), 1);
    else
        sl_counter_add(gw_llm_s2(gw_llm_m.tier, name, tier), 1);
    /* A whole JSON answer: its first token reached the client with its end. */
    bool text_route = r->route == GW_ROUTE_CHAT || r->route == GW_ROUTE_COMPLETIONS ||
                      (r->route == GW_ROUTE_RESPONSES && gw_llm_resp_made(r));
    if (text_route && !r->att.resp_sse && !r->llm.first_token_ns && r->status >= 200 &&
        r->status < 300 && !gw_req_queued_id(r)[0] && gw_llm_model_answers(r)) {
        r->llm.first_token_ns = now_ns;
        r->llm.ttft = (double)(r->llm.first_token_ns - r->start_ns) / 1e9;
        sl_histogram_observe(GW_LLM_CACHED(e, ttft_json, gw_llm_m.ttft, name, "false"),
                             r->llm.ttft);
    }
}

bool gw_llm_server_in_service(const gw_pool_rt_t *p, gw_srv_rt_t *s, int64_t now_ms)
{
    if (p->sup && !gw_sup_healthy(p->sup))
        return false;
    return fb_breaker_eligible(s->breaker, now_ms);
}

void gw_llm_scrape(const gw_rt_t *rt)
{
    int64_t now = sl_now_ms();
    for (size_t i = 0; i < rt->npools; i++) {
        const gw_pool_rt_t *p = &rt->pools[i];
        int64_t in = 0, total = (int64_t)p->nservers;
        for (size_t k = 0; k < p->nservers; k++)
            in += gw_llm_server_in_service(p, p->servers[k], now);
        if (p->engine) {
            total = 1;
            in = mdl_engine_ready(p->engine);
            mdl_engine_info_t info;
            mdl_engine_info(p->engine, &info);
            sl_gauge_set(sl_metric_series1(gw_llm_m.eng_queue, p->name), info.queued);
            sl_gauge_set(sl_metric_series1(gw_llm_m.eng_busy, p->name), info.running);
            /* The engine keeps its own total; the counter catches up to it
             * (an engine rebuilt by a reload starts again from 0: the
             * counter then waits until the new total passes it). */
            const char *v[2] = {p->name, "completion"};
            sl_mseries_t *tok = sl_metric_series(gw_llm_m.eng_tokens, v);
            uint64_t have = sl_counter_value(tok);
            if (info.tokens_generated > have)
                sl_counter_add(tok, info.tokens_generated - have);
        }
        sl_gauge_set(sl_metric_series1(gw_llm_m.servers, p->name), total);
        sl_gauge_set(sl_metric_series1(gw_llm_m.in_service, p->name), in);
    }
}
