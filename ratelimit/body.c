/*
 * body.c — what the limiter needs from chat-completions JSON: the
 * max_tokens clamp (and include_usage for streams), a prompt token
 * estimate, the upstream's usage from a response or from SSE chunks, and
 * removal of the usage-only chunk that sluice asked for and the client did
 * not. Pure functions over jansson values and bytes.
 */
#include "ratelimit/rl_internal.h"

#include "common/sl_resp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- estimates ------------------------------------------------------------------ */

int64_t rl_estimate_text_tokens(const char *s, size_t n)
{
    int64_t ascii = 0, other = 0;
    sl_text_chars(s, n, &ascii, &other);
    return (ascii + 3) / 4 + other;
}

static int64_t rl_json_text_tokens(const json_t *v)
{
    if (json_is_string(v))
        return rl_estimate_text_tokens(json_string_value(v), json_string_length(v));
    return 0;
}

/* Message content: a string, or an array of parts ({"type": "text",
 * "text": ...}; an image part counts a flat 85, OpenAI's low-detail
 * figure). */
static int64_t rl_content_tokens(const json_t *content)
{
    if (json_is_string(content))
        return rl_json_text_tokens(content);
    int64_t n = 0;
    size_t i;
    json_t *part;
    if (json_is_array(content)) {
        json_array_foreach(content, i, part)
        {
            const json_t *text = json_object_get(part, "text");
            if (text)
                n += rl_json_text_tokens(text);
            else if (json_object_get(part, "image_url"))
                n += 85;
        }
    }
    return n;
}

/* The compact JSON of v, estimated (what a model sees of a tool or an
 * item it has no text field for). */
static int64_t rl_dump_tokens(const json_t *v)
{
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t)
        return 0;
    int64_t n = rl_estimate_text_tokens(t, strlen(t));
    free(t);
    return n;
}

int64_t rl_body_prompt_tokens(const json_t *body)
{
    int64_t n = 3; /* the reply's priming */
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(body, "messages"), i, m)
    {
        n += 4; /* role and separators */
        n += rl_content_tokens(json_object_get(m, "content"));
        n += rl_json_text_tokens(json_object_get(m, "name"));
        /* an array or object only: a scalar here counts nothing */
        const json_t *calls = json_object_get(m, "tool_calls");
        if (json_is_array(calls) || json_is_object(calls))
            n += rl_dump_tokens(calls);
    }
    const json_t *tools = json_object_get(body, "tools");
    if (json_is_array(tools) || json_is_object(tools))
        n += rl_dump_tokens(tools);
    return n;
}

/* A Responses API content: a string, or parts ({"type": "input_text",
 * "text": ...}; an input_image a flat 85 as chat's image_url; any other
 * part, a file say, its compact JSON). */
static int64_t rl_resp_content_tokens(const json_t *content)
{
    if (json_is_string(content))
        return rl_json_text_tokens(content);
    int64_t n = 0;
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part)
    {
        const json_t *text = json_object_get(part, "text");
        const char *type = json_string_value(json_object_get(part, "type"));
        if (json_is_string(text))
            n += rl_json_text_tokens(text);
        else if (type && strcmp(type, "input_image") == 0)
            n += 85;
        else
            n += rl_dump_tokens(part);
    }
    return n;
}

int64_t rl_responses_prompt_tokens(const json_t *body)
{
    int64_t n = 3; /* the reply's priming */
    n += rl_json_text_tokens(json_object_get(body, "instructions"));
    const json_t *input = json_object_get(body, "input");
    if (json_is_string(input)) {
        n += 4 + rl_json_text_tokens(input); /* one user message */
    } else {
        size_t i;
        json_t *item;
        json_array_foreach(input, i, item)
        {
            n += 4; /* role and separators */
            const json_t *content = json_object_get(item, "content");
            const json_t *output = json_object_get(item, "output");
            if (content)
                n += rl_resp_content_tokens(content);
            else if (json_is_string(output)) /* function_call_output */
                n += rl_json_text_tokens(output);
            else /* function_call (name, arguments), reasoning, ...: as sent */
                n += rl_dump_tokens(item);
        }
    }
    const json_t *tools = json_object_get(body, "tools");
    if (tools)
        n += rl_dump_tokens(tools);
    return n;
}

/* ---- clamp ---------------------------------------------------------------------- */

static int rl_clamp_field(json_t *body, const char *name, int64_t max, bool *seen, int64_t *value,
                          char *err, size_t errlen)
{
    json_t *v = json_object_get(body, name);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 1) {
        snprintf(err, errlen, "%s must be a positive integer", name);
        return -1;
    }
    int64_t x = json_integer_value(v);
    if (x > max) {
        x = max;
        if (json_object_set_new(body, name, json_integer(x)) != 0) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
    *value = *seen ? SL_MIN(*value, x) : x;
    *seen = true;
    return 0;
}

int rl_body_clamp(json_t *body, int64_t policy_max, rl_clamp_t *out, char *err, size_t errlen)
{
    return rl_body_clamp_ex(body, policy_max, true, out, err, errlen);
}

/* The integer value of key, or -1 when absent or not an integer. */
static json_int_t rl_int_or(const json_t *body, const char *key)
{
    const json_t *v = json_object_get(body, key);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

int rl_body_clamp_ex(json_t *body, int64_t policy_max, bool want_usage, rl_clamp_t *out, char *err,
                     size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (!json_is_object(body)) {
        snprintf(err, errlen, "the request body must be a JSON object");
        return -1;
    }
    json_int_t mt0 = rl_int_or(body, "max_tokens");
    json_int_t mct0 = rl_int_or(body, "max_completion_tokens");
    bool seen = false;
    int64_t v = policy_max;
    if (rl_clamp_field(body, "max_tokens", policy_max, &seen, &v, err, errlen) != 0 ||
        rl_clamp_field(body, "max_completion_tokens", policy_max, &seen, &v, err, errlen) != 0)
        return -1;
    if (!seen) {
        /* max_tokens: what vLLM, Ollama, llama.cpp and SGLang all read */
        if (json_object_set_new(body, "max_tokens", json_integer(policy_max)) != 0) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        v = policy_max;
        out->added_max_tokens = true;
    } else if (rl_int_or(body, "max_tokens") != mt0 ||
               rl_int_or(body, "max_completion_tokens") != mct0) {
        out->modified = true;
    }
    out->max_tokens = v;

    json_t *stream = json_object_get(body, "stream");
    if (stream && !json_is_boolean(stream) && !json_is_null(stream)) {
        snprintf(err, errlen, "stream must be a boolean");
        return -1;
    }
    out->stream = json_is_true(stream);
    if (!out->stream || !want_usage)
        return 0;
    json_t *so = json_object_get(body, "stream_options");
    if (so && !json_is_object(so) && !json_is_null(so)) {
        snprintf(err, errlen, "stream_options must be an object");
        return -1;
    }
    if (so && json_is_object(so) && json_is_true(json_object_get(so, "include_usage")))
        return 0; /* the client asked for usage: it sees the chunk */
    if (!so || !json_is_object(so)) {
        so = json_object();
        if (!so || json_object_set_new(body, "stream_options", so) != 0) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
    if (json_object_set_new(so, "include_usage", json_true()) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    out->injected_usage = true;
    out->modified = true;
    return 0;
}

/* ---- the same over scanned facts --------------------------------------------------- */

static int rl_plan_field(sl_jkind_t kind, int64_t x, const char *name, int64_t max, bool *seen,
                         int64_t *value, int64_t *set, char *err, size_t errlen)
{
    if (kind == SL_J_ABSENT || kind == SL_J_NULL)
        return 0;
    if (kind != SL_J_INT || x < 1) {
        snprintf(err, errlen, "%s must be a positive integer", name);
        return -1;
    }
    if (x > max) {
        x = max;
        *set = x;
    }
    *value = *seen ? SL_MIN(*value, x) : x;
    *seen = true;
    return 0;
}

int rl_clamp_plan(const rl_clamp_in_t *in, int64_t policy_max, bool want_usage, rl_clamp_t *out,
                  rl_clamp_edits_t *edits, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    memset(edits, 0, sizeof(*edits));
    bool seen = false;
    int64_t v = policy_max;
    if (rl_plan_field(in->max_tokens_kind, in->max_tokens, "max_tokens", policy_max, &seen, &v,
                      &edits->max_tokens, err, errlen) != 0 ||
        rl_plan_field(in->max_completion_tokens_kind, in->max_completion_tokens,
                      "max_completion_tokens", policy_max, &seen, &v, &edits->max_completion_tokens,
                      err, errlen) != 0)
        return -1;
    if (!seen) {
        edits->max_tokens = policy_max;
        v = policy_max;
        out->added_max_tokens = true;
    } else if (edits->max_tokens || edits->max_completion_tokens) {
        out->modified = true;
    }
    out->max_tokens = v;
    sl_jkind_t st = in->stream_kind;
    if (st != SL_J_ABSENT && st != SL_J_TRUE && st != SL_J_FALSE && st != SL_J_NULL) {
        snprintf(err, errlen, "stream must be a boolean");
        return -1;
    }
    out->stream = st == SL_J_TRUE;
    if (!out->stream || !want_usage)
        return 0;
    sl_jkind_t so = in->stream_options_kind;
    if (so != SL_J_ABSENT && so != SL_J_OBJECT && so != SL_J_NULL) {
        snprintf(err, errlen, "stream_options must be an object");
        return -1;
    }
    if (so == SL_J_OBJECT && in->include_usage)
        return 0; /* the client asked for usage: it sees the chunk */
    edits->include_usage = true;
    out->injected_usage = true;
    out->modified = true;
    return 0;
}

static int64_t rl_text_tokens(sl_jkind_t kind, sl_text_t t)
{
    return kind == SL_J_STRING ? rl_estimate_text_tokens(t.p, t.len) : 0;
}

int64_t rl_chat_prompt_tokens(const sl_chat_t *chat)
{
    int64_t n = 3; /* the reply's priming */
    for (size_t i = 0; chat->messages_kind == SL_J_ARRAY && i < chat->nmsgs; i++) {
        const sl_chat_msg_t *m = &chat->msgs[i];
        n += 4; /* role and separators */
        if (m->content_kind == SL_J_STRING) {
            n += rl_text_tokens(m->content_kind, m->content);
        } else if (m->content_kind == SL_J_ARRAY) {
            for (size_t k = 0; k < m->nparts; k++) {
                const sl_chat_part_t *p = &chat->parts[m->part0 + k];
                if (p->text_kind != SL_J_ABSENT)
                    n += rl_text_tokens(p->text_kind, p->text);
                else if (p->image_url)
                    n += 85;
            }
        }
        n += rl_text_tokens(m->name_kind, m->name);
    }
    return n;
}

/* ---- usage ------------------------------------------------------------------------ */

/* Chat's names (prompt_tokens, completion_tokens), else the Responses
 * API's (input_tokens, output_tokens); total_tokens in both. */
static int rl_usage_parse(const json_t *usage, rl_usage_t *u)
{
    if (!json_is_object(usage))
        return -1;
    const json_t *p = json_object_get(usage, "prompt_tokens");
    const json_t *c = json_object_get(usage, "completion_tokens");
    if (!p && !c) {
        p = json_object_get(usage, "input_tokens");
        c = json_object_get(usage, "output_tokens");
    }
    const json_t *t = json_object_get(usage, "total_tokens");
    if (!json_is_integer(c) && !json_is_integer(t))
        return -1;
    u->prompt_tokens = json_is_integer(p) ? SL_MAX(json_integer_value(p), 0) : 0;
    u->completion_tokens = json_is_integer(c) ? SL_MAX(json_integer_value(c), 0) : 0;
    /* both at least 0: a sum beyond int64 (a huge usage) saturates */
    if (json_is_integer(t))
        u->total_tokens = SL_MAX(json_integer_value(t), 0);
    else if (__builtin_add_overflow(u->prompt_tokens, u->completion_tokens, &u->total_tokens))
        u->total_tokens = INT64_MAX;
    return 0;
}

int rl_usage_from_body(const json_t *body, rl_usage_t *u)
{
    memset(u, 0, sizeof(*u));
    return rl_usage_parse(json_object_get(body, "usage"), u);
}

/* ---- streams ------------------------------------------------------------------------- */

struct rl_stream {
    bool strip;
    bool got_usage;
    rl_usage_t usage;
    int64_t ascii, other; /* streamed text, for the estimate */
};

rl_stream_t *rl_stream_new(bool strip)
{
    rl_stream_t *s = calloc(1, sizeof(*s));
    if (s)
        s->strip = strip;
    return s;
}

void rl_stream_free(rl_stream_t *s)
{
    free(s);
}

static void rl_chunk_count(rl_chunk_read_t *r, const json_t *v)
{
    if (json_is_string(v))
        sl_text_chars(json_string_value(v), json_string_length(v), &r->ascii, &r->other);
}

void rl_chunk_read_tree(const json_t *j, rl_chunk_read_t *r)
{
    memset(r, 0, sizeof(*r));
    const json_t *choices = json_object_get(j, "choices");
    size_t i, k;
    json_t *ch, *tc;
    json_array_foreach(choices, i, ch)
    {
        const json_t *delta = json_object_get(ch, "delta");
        if (!delta)
            delta = json_object_get(ch, "message");
        rl_chunk_count(r, json_object_get(delta, "content"));
        rl_chunk_count(r, json_object_get(delta, "reasoning_content"));
        rl_chunk_count(r, json_object_get(ch, "text")); /* legacy completions */
        json_array_foreach(json_object_get(delta, "tool_calls"), k, tc)
        {
            const json_t *fn = json_object_get(tc, "function");
            rl_chunk_count(r, json_object_get(fn, "name"));
            rl_chunk_count(r, json_object_get(fn, "arguments"));
        }
    }
    r->got_usage = rl_usage_from_body(j, &r->usage) == 0;
    r->choices_empty = json_is_array(choices) && json_array_size(choices) == 0;
}

/* s NULL: strip, count nothing (rl_chunk_strip_usage). */
static rl_chunk_action_t rl_chunk_feed(rl_stream_t *s, const char *data, size_t len, char **out,
                                       size_t *outlen)
{
    *out = NULL;
    *outlen = 0;
    while (len && (*data == ' ' || *data == '\t')) {
        data++;
        len--;
    }
    if (len == 0 || *data != '{')
        return RL_CHUNK_FORWARD; /* "[DONE]", or not ours to judge */
    /* Without a tree unless the usage must be cut out of a chunk with
     * choices (a rewrite) or the bytes are odd (usage_json.c). */
    rl_chunk_read_t rd;
    if (rl_chunk_read_json(data, len, &rd) == 0 &&
        (!rd.got_usage || rd.choices_empty || (s && !s->strip))) {
        if (s) {
            s->ascii += rd.ascii;
            s->other += rd.other;
            if (rd.got_usage) {
                s->usage = rd.usage;
                s->got_usage = true;
            }
        }
        return rd.got_usage && (!s || s->strip) ? RL_CHUNK_DROP : RL_CHUNK_FORWARD;
    }
    json_t *j = json_loadb(data, len, 0, NULL);
    if (!j)
        return RL_CHUNK_FORWARD;
    rl_chunk_action_t act = RL_CHUNK_FORWARD;
    rl_chunk_read_tree(j, &rd);
    if (s) {
        s->ascii += rd.ascii;
        s->other += rd.other;
    }
    if (rd.got_usage) {
        if (s) {
            s->usage = rd.usage; /* the last one wins: some servers send running totals */
            s->got_usage = true;
        }
        if (!s || s->strip) {
            if (rd.choices_empty) {
                act = RL_CHUNK_DROP;
            } else if (json_object_del(j, "usage") == 0) {
                char *t = json_dumps(j, JSON_COMPACT);
                if (t) {
                    *out = t;
                    *outlen = strlen(t);
                    act = RL_CHUNK_REWRITE;
                }
            }
        }
    }
    json_decref(j);
    return act;
}

rl_chunk_action_t rl_stream_feed(rl_stream_t *s, const char *data, size_t len, char **out,
                                 size_t *outlen)
{
    return rl_chunk_feed(s, data, len, out, outlen);
}

rl_chunk_action_t rl_chunk_strip_usage(const char *data, size_t len, char **out, size_t *outlen)
{
    return rl_chunk_feed(NULL, data, len, out, outlen);
}

void rl_stream_feed_responses(rl_stream_t *s, const char *data, size_t len)
{
    /* Only a delta or a usage is read: the other events (created, item
     * added, done) are not parsed. */
    if (!memmem(data, len, "\"delta\"", 7) && !memmem(data, len, "\"usage\"", 7))
        return;
    sl_resp_ev_t e;
    if (sl_resp_event_read(data, len, SL_RESP_USAGE | SL_RESP_TEXT, &e) != 0)
        return;
    if (e.delta) {
        s->ascii += e.ascii;
        s->other += e.other;
    }
    int64_t total = sl_resp_usage_total(&e);
    if (total >= 0) {
        s->usage.prompt_tokens = e.have_in ? e.in : 0;
        s->usage.completion_tokens = e.have_out ? e.out : 0;
        s->usage.total_tokens = total;
        s->got_usage = true;
    }
}

int rl_stream_usage(const rl_stream_t *s, rl_usage_t *u)
{
    if (!s->got_usage)
        return -1;
    *u = s->usage;
    return 0;
}

int64_t rl_stream_estimate(const rl_stream_t *s)
{
    return (s->ascii + 3) / 4 + s->other;
}

int64_t rl_stream_settle_tokens(const rl_stream_t *s, int64_t prompt_estimate)
{
    if (s->got_usage)
        return s->usage.total_tokens;
    return prompt_estimate + rl_stream_estimate(s);
}
