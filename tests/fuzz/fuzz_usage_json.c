/*
 * fuzz_usage_json.c — libFuzzer target for the budget's reads without a
 * tree (ratelimit/usage_json.c), held to jansson's tree of the same bytes
 * (json_loadb flags 0, as the gateway and the stream accounting parse):
 *   - rl_usage_from_json gives rl_usage_from_body's result and figures
 *     (-1 when the tree does not load), for every input;
 *   - rl_chunk_read_json, when it reads the bytes (0), gives the tree's
 *     choices text counts (delta else message, text, tool_calls' function
 *     name / arguments), usage and "choices is an empty array";
 *   - the input cut at each "\n\n" (an SSE event's end: no event's data
 *     holds one) is a stream of chunks, each read with the thread's kept
 *     shapes (forgotten at each input: an earlier chunk of the input
 *     teaches one, a later one is read from it) and without: both reads
 *     give the same figures (rl_chunk_read_json's, else the tree's), and
 *     two rl_stream_t fed the chunks both ways the same actions, rewritten
 *     bytes, estimate and usage; a read from a shape is the tree's.
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

static bool fz_same_read(const rl_chunk_read_t *a, const rl_chunk_read_t *b)
{
    return a->ascii == b->ascii && a->other == b->other && a->got_usage == b->got_usage &&
           a->choices_empty == b->choices_empty &&
           (!a->got_usage || fz_same_usage(&a->usage, &b->usage));
}

/* rl_chunk_feed's read: rl_chunk_read_json, else the tree; -1 no tree. */
static int fz_read(const char *p, size_t n, rl_chunk_read_t *r)
{
    if (rl_chunk_read_json(p, n, r) == 0)
        return 0;
    json_t *j = json_loadb(p, n, 0, NULL);
    if (!j)
        return -1;
    rl_chunk_read_tree(j, r);
    json_decref(j);
    return 0;
}

/* One chunk of a stream, with the kept shapes and without. */
static void fz_chunk_both(const char *p, size_t n, rl_stream_t *on, rl_stream_t *off)
{
    rl_chunk_read_t a = {0}, b = {0};
    uint64_t h0 = rl_chunk_shape_hits();
    int ra = fz_read(p, n, &a);
    bool hit = rl_chunk_shape_hits() != h0;
    rl_chunk_shapes_enable(false);
    int rb = fz_read(p, n, &b);
    rl_chunk_shapes_enable(true);
    if (ra != rb || (ra == 0 && !fz_same_read(&a, &b)))
        abort();
    if (hit) { /* a read from a shape: the tree's too */
        json_t *j = json_loadb(p, n, 0, NULL);
        rl_chunk_read_t t = {0};
        if (!j)
            abort();
        rl_chunk_read_tree(j, &t);
        json_decref(j);
        if (!fz_same_read(&a, &t))
            abort();
    }
    char *o1, *o2;
    size_t l1, l2;
    rl_chunk_action_t x1 = rl_stream_feed(on, p, n, &o1, &l1);
    rl_chunk_shapes_enable(false);
    rl_chunk_action_t x2 = rl_stream_feed(off, p, n, &o2, &l2);
    rl_chunk_shapes_enable(true);
    if (x1 != x2 || l1 != l2 || (l1 && memcmp(o1, o2, l1) != 0))
        abort();
    free(o1);
    free(o2);
}

static void fz_stream(const char *p, size_t size)
{
    rl_stream_t *on = rl_stream_new(size & 1), *off = rl_stream_new(size & 1);
    if (!on || !off) {
        rl_stream_free(on);
        rl_stream_free(off);
        return;
    }
    for (size_t i = 0; i < size;) {
        const char *e = memmem(p + i, size - i, "\n\n", 2);
        size_t n = e ? (size_t)(e - (p + i)) : size - i;
        fz_chunk_both(p + i, n, on, off);
        i += n + 2;
    }
    rl_usage_t u1, u2;
    int r1 = rl_stream_usage(on, &u1), r2 = rl_stream_usage(off, &u2);
    if (rl_stream_estimate(on) != rl_stream_estimate(off) || r1 != r2 ||
        (r1 == 0 && !fz_same_usage(&u1, &u2)))
        abort();
    rl_stream_free(on);
    rl_stream_free(off);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data;
    rl_chunk_shapes_clear();
    rl_chunk_shapes_enable(true);
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
    if (memmem(p, size, "\n\n", 2))
        fz_stream(p, size);
    return 0;
}
