/*
 * sse_finish.c — which choices of a streamed chat or completions answer
 * already carry a finish_reason. A server that closes the stream cleanly
 * without `data: [DONE]` after every choice finished sent a complete answer:
 * the relay ends it with [DONE] instead of an error event (issue 12). Cheap
 * on the hot path: an event is parsed only when it holds a non-null
 * finish_reason, which is once per choice.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gateway/sse.h"

static bool gw_sse_finish_candidate(const char *p, size_t n)
{
    static const char key[] = "\"finish_reason\"";
    const char *end = p + n;
    while (p < end) {
        /* at its '_': rarer in an event than any of its letters */
        const char *k = gw_sse_find(p, (size_t)(end - p), key, sizeof(key) - 1, 7);
        if (!k)
            return false;
        const char *v = k + sizeof(key) - 1;
        while (v < end && (*v == ' ' || *v == ':' || *v == '\t'))
            v++;
        if (v < end && *v != 'n') /* not null: a reason */
            return true;
        p = v;
    }
    return false;
}

void gw_sse_finish_scan(const gw_sse_event_t *ev, uint64_t *finished)
{
    if (ev->comment_only || ev->done || !gw_sse_finish_candidate(ev->raw, ev->raw_len))
        return;
    char *data = malloc(ev->raw_len + 1);
    long len = data ? gw_sse_event_data(ev, data, ev->raw_len + 1) : -1;
    json_t *j = len > 0 ? json_loadb(data, (size_t)len, JSON_ALLOW_NUL, NULL) : NULL;
    free(data);
    json_t *choices = json_object_get(j, "choices");
    size_t i;
    json_t *c;
    json_array_foreach(choices, i, c)
    {
        json_t *fr = json_object_get(c, "finish_reason");
        json_t *ix = json_object_get(c, "index");
        json_int_t k = json_is_integer(ix) ? json_integer_value(ix) : (json_int_t)i;
        if (json_is_string(fr) && k >= 0 && k < 64)
            *finished |= UINT64_C(1) << k;
    }
    json_decref(j);
}

bool gw_sse_finish_all(uint64_t finished, int64_t n)
{
    if (n < 1 || n > 64)
        return false; /* more choices than tracked: not provably complete */
    uint64_t want = n == 64 ? UINT64_MAX : (UINT64_C(1) << n) - 1;
    return (finished & want) == want;
}

void gw_sse_responses_scan(const gw_sse_event_t *ev, uint64_t *finished)
{
    /* The Responses API ends with one of these events and sends no
     * [DONE]; its `event:` line names it (OpenAI, vLLM). */
    static const char *const ends[] = {"event: response.completed", "event: response.incomplete",
                                       "event: response.failed"};
    if (ev->comment_only)
        return;
    for (size_t i = 0; i < sizeof(ends) / sizeof(ends[0]); i++) {
        size_t n = strlen(ends[i]);
        if (ev->raw_len > n && memcmp(ev->raw, ends[i], n) == 0 &&
            (ev->raw[n] == '\n' || ev->raw[n] == '\r')) {
            *finished |= 1;
            return;
        }
    }
}
