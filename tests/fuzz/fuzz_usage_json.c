/*
 * fuzz_usage_json.c — libFuzzer target for the budget's reads without a
 * tree (ratelimit/usage_json.c), held to jansson's tree of the same bytes
 * (json_loadb flags 0, as the gateway and the stream accounting parse):
 *   - rl_usage_from_json gives rl_usage_from_body's result and figures
 *     (-1 when the tree does not load), for every input;
 *   - rl_chunk_read_json, when it reads the bytes (0), gives the tree's
 *     choices text counts (delta else message, text, tool_calls' function
 *     name / arguments), usage and "choices is an empty array".
 * A mismatch aborts.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ratelimit/ratelimit.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool fz_same_usage(const rl_usage_t *a, const rl_usage_t *b)
{
    return a->prompt_tokens == b->prompt_tokens && a->completion_tokens == b->completion_tokens &&
           a->total_tokens == b->total_tokens;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data;
    json_t *j = json_loadb(p, size, 0, NULL);
    rl_usage_t ut = {0}, ub;
    int rt = j ? rl_usage_from_body(j, &ut) : -1;
    int rb = rl_usage_from_json(p, size, &ub);
    if (rt != rb || (rt == 0 && !fz_same_usage(&ut, &ub)))
        abort();
    rl_chunk_read_t ct = {0}, cb;
    if (rl_chunk_read_json(p, size, &cb) == 0) {
        if (!j || !json_is_object(j))
            abort(); /* only a chunk object reaches it, but what it reads is JSON */
        rl_chunk_read_tree(j, &ct);
        if (ct.ascii != cb.ascii || ct.other != cb.other || ct.got_usage != cb.got_usage ||
            ct.choices_empty != cb.choices_empty ||
            (ct.got_usage && !fz_same_usage(&ct.usage, &cb.usage)))
            abort();
    }
    json_decref(j);
    return 0;
}
