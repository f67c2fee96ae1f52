/*
 * prompt_json.c — the prompt estimates of body.c without a JSON tree: the
 * parts a model sees as "compact JSON" (chat's tools and tool_calls, a
 * Responses request's tools and items without text) counted over the
 * client's bytes with yajl's callbacks, and a Responses request's input
 * items walked the same way.
 *
 * The count is the one rl_estimate_text_tokens() gives over what
 * json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) writes for the value jansson
 * (gateway/json_intake.c) parses from those bytes — equal, not a bound:
 * - structure: no blank between tokens, "," and ":" as the only separators,
 *   members in the client's order (jansson keeps insertion order);
 * - strings and keys: jansson writes the decoded text with '"' and '\\' and
 *   the five short controls (\b \f \n \r \t) as two bytes, any other byte
 *   below 0x20 as \u00XX, everything else as UTF-8 ('/' is not escaped:
 *   no JSON_ESCAPE_SLASH; no JSON_ENSURE_ASCII): so "\/" counts one byte,
 *   "\u00e9" one non-ASCII character, a surrogate pair one too;
 * - integers: "%lld" of the value, the client's token except "-0" ("0");
 * - reals: whatever jansson writes for the double strtod reads (json_real
 *   dumped into a small buffer: "%.17g" and its ".0" are jansson's, not
 *   redone here).
 * A body with an integer beyond int64 (jansson reads its numbers as reals,
 * then turns the integral ones back) is the caller's to count from the
 * tree, as are bodies the scanner did not take (duplicate keys, ...): the
 * text walked here is valid JSON jansson accepts as it is.
 */
#include "ratelimit/rl_internal.h"

#include "common/jshape.h"
#include "common/yheap.h"

#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

/* Deeper than the gateway's scanner lets through (GW_SCAN_DEPTH 256). */
#define RL_JW_DEPTH 256

typedef enum rl_jw_mode {
    RL_JW_DUMP,  /* one value's compact JSON */
    RL_JW_INPUT, /* a Responses input array, item by item */
} rl_jw_mode_t;

typedef enum rl_jw_key {
    RL_JK_OTHER = 0,
    RL_JK_CONTENT,
    RL_JK_OUTPUT,
    RL_JK_TEXT,
    RL_JK_TYPE,
} rl_jw_key_t;

/* A compact dump's bytes as rl_estimate_text_tokens splits them. */
typedef struct rl_jcount {
    int64_t ascii, other;
} rl_jcount_t;

typedef struct rl_jw {
    rl_jw_mode_t mode;
    unsigned depth;               /* containers open */
    bool values;                  /* a whole value went by at depth 0 */
    bool obj[RL_JW_DEPTH];        /* the container at depth i + 1 is an object */
    bool some[RL_JW_DEPTH];       /* ... and has had a member or element */
    rl_jw_key_t key[RL_JW_DEPTH]; /* its current member's key (input mode) */
    rl_jcount_t all, item, part;  /* the whole text's, this item's, this part's */
    int64_t n;                    /* input mode: the items' estimate */
    /* the item (input mode) */
    bool has_content, content_parts, output_str;
    int64_t content, output;
    /* the part of its content array */
    bool text_str, image;
    int64_t text;
} rl_jw_t;

static inline void rl_jw_add(rl_jw_t *w, int64_t ascii, int64_t other)
{
    w->all.ascii += ascii;
    w->all.other += other;
    w->item.ascii += ascii;
    w->item.other += other;
    w->part.ascii += ascii;
    w->part.other += other;
}

static inline int64_t rl_jcount_tokens(rl_jcount_t c)
{
    return (c.ascii + 3) / 4 + c.other;
}

/* What each byte of a decoded string costs in jansson's text: ASCII bytes
 * (its escape: '"', '\\' and the five short controls two, any other
 * control six, \u00XX), and non-ASCII characters (a UTF-8 lead byte one;
 * continuation bytes none). One table lookup a byte: the branches were
 * ~12 instructions a byte of a tools array. */
static const uint8_t rl_jw_ascii[256] = {
    [0x00 ... 0x07] = 6, ['\b'] = 2, ['\t'] = 2,          ['\n'] = 2,          [0x0b] = 6,
    ['\f'] = 2,          ['\r'] = 2, [0x0e ... 0x1f] = 6, [0x20 ... 0x21] = 1, ['"'] = 2,
    [0x23 ... 0x5b] = 1, ['\\'] = 2, [0x5d ... 0x7f] = 1,
};
static const uint8_t rl_jw_lead[256] = {[0xc0 ... 0xff] = 1};

/* A decoded string as jansson writes it, quotes included. */
static void rl_jw_string(rl_jw_t *w, const unsigned char *p, size_t n)
{
    int64_t ascii = 2, other = 0;
    for (size_t i = 0; i < n; i++) {
        ascii += rl_jw_ascii[p[i]];
        other += rl_jw_lead[p[i]];
    }
    rl_jw_add(w, ascii, other);
}

/* Input mode: where a value at depth d (containers around it) sits. */
static inline bool rl_jw_is_item(const rl_jw_t *w, unsigned d)
{
    return w->mode == RL_JW_INPUT && d == 1 && !w->obj[0];
}

static inline bool rl_jw_in_item_obj(const rl_jw_t *w, unsigned d)
{
    return w->mode == RL_JW_INPUT && d == 2 && !w->obj[0] && w->obj[1];
}

static inline bool rl_jw_is_part(const rl_jw_t *w, unsigned d)
{
    return w->mode == RL_JW_INPUT && d == 3 && !w->obj[0] && w->obj[1] &&
           w->key[1] == RL_JK_CONTENT && !w->obj[2];
}

static inline bool rl_jw_in_part_obj(const rl_jw_t *w, unsigned d)
{
    return rl_jw_is_part(w, d - 1) && w->obj[3];
}

/* A value starts at the current depth: its separator, then the item's or
 * the part's counts start (after the separator, which is the container's). */
static void rl_jw_begin(rl_jw_t *w)
{
    unsigned d = w->depth;
    if (d > 0 && !w->obj[d - 1]) {
        if (w->some[d - 1])
            rl_jw_add(w, 1, 0); /* "," */
        w->some[d - 1] = true;
    }
    if (rl_jw_in_item_obj(w, d) && w->key[1] == RL_JK_CONTENT) {
        w->has_content = true; /* content of any kind: a string's or parts' text count */
    } else if (rl_jw_is_item(w, d)) {
        w->item = (rl_jcount_t){0, 0};
        w->has_content = w->content_parts = w->output_str = false;
        w->content = w->output = 0;
    } else if (rl_jw_is_part(w, d)) {
        w->part = (rl_jcount_t){0, 0};
        w->text_str = w->image = false;
        w->text = 0;
    }
}

/* A value at the current depth ended (a scalar reported, a container
 * closed): an item's or a part's count taken as body.c takes it. */
static void rl_jw_end(rl_jw_t *w)
{
    unsigned d = w->depth;
    if (d == 0)
        w->values = true;
    if (rl_jw_is_item(w, d)) {
        w->n += 4; /* role and separators */
        if (w->has_content)
            w->n += w->content;
        else if (w->output_str) /* function_call_output */
            w->n += w->output;
        else
            w->n += rl_jcount_tokens(w->item);
    } else if (rl_jw_is_part(w, d)) {
        if (w->text_str)
            w->content += w->text;
        else if (w->image)
            w->content += 85;
        else
            w->content += rl_jcount_tokens(w->part);
    }
}

static int rl_jw_scalar(rl_jw_t *w, int64_t ascii)
{
    rl_jw_begin(w);
    rl_jw_add(w, ascii, 0);
    rl_jw_end(w);
    return 1;
}

static int rl_jw_null(void *ctx)
{
    return rl_jw_scalar(ctx, 4);
}

static int rl_jw_bool(void *ctx, int v)
{
    return rl_jw_scalar(ctx, v ? 4 : 5);
}

static int rl_jw_number(void *ctx, const char *p, size_t n)
{
    bool integral = true;
    for (size_t i = 0; i < n && integral; i++)
        integral = p[i] != '.' && p[i] != 'e' && p[i] != 'E';
    if (integral) /* yajl checked the grammar: no leading zero, so "-0" alone differs */
        return rl_jw_scalar(ctx, n == 2 && p[0] == '-' && p[1] == '0' ? 1 : (int64_t)n);
    char tok[64];
    if (n >= sizeof(tok))
        return 0; /* no real token is this long in practice: the tree counts */
    memcpy(tok, p, n);
    tok[n] = '\0';
    json_t *r = json_real(strtod(tok, NULL));
    char out[64];
    size_t k = r ? json_dumpb(r, out, sizeof(out), JSON_ENCODE_ANY) : 0;
    json_decref(r);
    if (k == 0 || k > sizeof(out))
        return 0;
    return rl_jw_scalar(ctx, (int64_t)k);
}

static int rl_jw_str(void *ctx, const unsigned char *p, size_t n)
{
    rl_jw_t *w = ctx;
    unsigned d = w->depth;
    rl_jw_begin(w);
    rl_jw_string(w, p, n);
    if (rl_jw_in_item_obj(w, d)) {
        if (w->key[1] == RL_JK_CONTENT) {
            w->content = rl_estimate_text_tokens((const char *)p, n);
        } else if (w->key[1] == RL_JK_OUTPUT) {
            w->output_str = true;
            w->output = rl_estimate_text_tokens((const char *)p, n);
        }
    } else if (rl_jw_in_part_obj(w, d)) {
        if (w->key[3] == RL_JK_TEXT) {
            w->text_str = true;
            w->text = rl_estimate_text_tokens((const char *)p, n);
        } else if (w->key[3] == RL_JK_TYPE) {
            /* strcmp's answer on json_string_value: up to a NUL */
            w->image = n >= 11 && memcmp(p, "input_image", 11) == 0 && (n == 11 || p[11] == 0);
        }
    }
    rl_jw_end(w);
    return 1;
}

static int rl_jw_open(rl_jw_t *w, bool obj)
{
    if (w->depth == RL_JW_DEPTH)
        return 0;
    unsigned d = w->depth;
    rl_jw_begin(w);
    rl_jw_add(w, 1, 0); /* "{" or "[" */
    w->obj[d] = obj;
    w->some[d] = false;
    w->key[d] = RL_JK_OTHER;
    w->depth++;
    return 1;
}

static int rl_jw_close(void *ctx)
{
    rl_jw_t *w = ctx;
    if (w->depth == 0)
        return 0;
    rl_jw_add(w, 1, 0); /* "}" or "]" */
    w->depth--;
    rl_jw_end(w);
    return 1;
}

static int rl_jw_open_map(void *ctx)
{
    return rl_jw_open(ctx, true);
}

static int rl_jw_open_array(void *ctx)
{
    return rl_jw_open(ctx, false);
}

static int rl_jw_map_key(void *ctx, const unsigned char *p, size_t n)
{
    rl_jw_t *w = ctx;
    unsigned d = w->depth;
    if (d == 0)
        return 0;
    if (w->some[d - 1])
        rl_jw_add(w, 1, 0); /* "," */
    w->some[d - 1] = true;
    rl_jw_string(w, p, n);
    rl_jw_add(w, 1, 0); /* ":" */
    rl_jw_key_t k = RL_JK_OTHER;
    if (w->mode == RL_JW_INPUT && d == 2) {
        k = n == 7 && memcmp(p, "content", 7) == 0  ? RL_JK_CONTENT
            : n == 6 && memcmp(p, "output", 6) == 0 ? RL_JK_OUTPUT
                                                    : RL_JK_OTHER;
    } else if (w->mode == RL_JW_INPUT && d == 4) {
        k = n == 4 && memcmp(p, "text", 4) == 0   ? RL_JK_TEXT
            : n == 4 && memcmp(p, "type", 4) == 0 ? RL_JK_TYPE
                                                  : RL_JK_OTHER;
    }
    w->key[d - 1] = k;
    return 1;
}

static const yajl_callbacks rl_jw_cbs = {
    .yajl_null = rl_jw_null,
    .yajl_boolean = rl_jw_bool,
    .yajl_number = rl_jw_number,
    .yajl_string = rl_jw_str,
    .yajl_start_map = rl_jw_open_map,
    .yajl_map_key = rl_jw_map_key,
    .yajl_end_map = rl_jw_close,
    .yajl_start_array = rl_jw_open_array,
    .yajl_end_array = rl_jw_close,
};

/* One JSON value's text walked in mode; -1 when yajl did not take it as
 * exactly one value (the caller counts from the tree). */
static int rl_jw_run(rl_jw_t *w, rl_jw_mode_t mode, const char *p, size_t n)
{
    memset(w, 0, offsetof(rl_jw_t, obj));
    w->all = w->item = w->part = (rl_jcount_t){0, 0};
    w->n = 0;
    w->mode = mode;
    if (!p || n == 0)
        return -1;
    sl_yheap_t heap;
    yajl_alloc_funcs af = sl_yheap_funcs(&heap);
    yajl_handle h = yajl_alloc(&rl_jw_cbs, &af, w);
    if (!h)
        return -1;
    /* the scanner checked the UTF-8 of the whole body */
    yajl_config(h, yajl_dont_validate_strings, 1);
    yajl_status st = yajl_parse(h, (const unsigned char *)p, n);
    if (st == yajl_status_ok)
        st = yajl_complete_parse(h);
    yajl_free(h);
    return st == yajl_status_ok && w->values && w->depth == 0 ? 0 : -1;
}

int rl_json_dump_tokens(const char *p, size_t n, int64_t *out)
{
    rl_jw_t w;
    if (rl_jw_run(&w, RL_JW_DUMP, p, n) != 0)
        return -1;
    *out = rl_jcount_tokens(w.all);
    return 0;
}

/* ---- a thread's kept counts of tools arrays ----------------------------------
 *
 * An SDK sends the same tools array, byte for byte, with every turn of a
 * conversation, and an application the same one in all its conversations,
 * while walking it is most of a budgeted request's estimate (~38,000
 * instructions a request for issue #16's body with a 783-byte array of two
 * functions). So the thread keeps the count of the last few arrays it
 * walked beside their exact bytes (common/jshape.h's cache, each slot a
 * shape without holes and its data the count). A hit is the same length,
 * then the same bytes (memcmp): the walk depends on the bytes alone (the
 * mode is DUMP's; a body with a big integer never gets here), so the kept
 * count is the one the walk gives. Only counts are kept, never a failure:
 * a walk that fails is walked again. A message's tool_calls are not kept:
 * each conversation has its own, resent in ever longer runs, which a few
 * LRU slots would cycle through (a miss each) while pushing out the shared
 * tools array. */
#define RL_JC_SLOTS 4 /* arrays a thread keeps */
#define RL_JC_RUN   4 /* misses after a hit that may all be kept */
#define RL_JC_EVERY 8 /* then one in this many */

static _Thread_local sl_jshape_cache_t rl_jc =
    SL_JSHAPE_CACHE_INIT(RL_JC_SLOTS, RL_JC_RUN, RL_JC_EVERY, sizeof(int64_t), NULL);
static _Thread_local bool rl_jc_off;

void rl_tools_counts_clear(void)
{
    sl_jshape_cache_clear(&rl_jc);
}

void rl_tools_counts_enable(bool on)
{
    rl_jc_off = !on;
}

uint64_t rl_tools_count_hits(void)
{
    return rl_jc.st.hits;
}

/* rl_json_dump_tokens for a tools array: a kept count when the thread
 * walked the same bytes before, else the walk (then kept, gate willing). */
static int rl_tools_dump_tokens(const char *p, size_t n, int64_t *out)
{
    sl_jshape_cache_t *c = &rl_jc;
    if (rl_jc_off || !p || n == 0 || n > SL_JSHAPE_MAX_TEXT)
        return rl_json_dump_tokens(p, n, out);
    for (unsigned k = 0, i = c->last; k < c->nslots; k++, i = (i + 1) % c->nslots) {
        const sl_jshape_slot_t *s = &c->slot[i];
        if (sl_jshape_is_text(&s->sh, p, n)) {
            *out = *(const int64_t *)s->data;
            sl_jshape_cache_hit(c, i);
            return 0;
        }
    }
    sl_jshape_cache_miss(c);
    if (rl_json_dump_tokens(p, n, out) != 0)
        return -1;
    if (!sl_jshape_cache_gate(c))
        return 0;
    int i = sl_jshape_cache_take(c); /* its shape empty: it matches nothing until set */
    if (i >= 0) {
        *(int64_t *)c->slot[i].data = *out;
        if (sl_jshape_cache_set_text(c, (unsigned)i, p, n) != 0)
            return 0; /* out of memory: the slot stays empty */
    }
    return 0;
}

int rl_chat_prompt_tokens_json(const sl_chat_t *chat, int64_t *out)
{
    if (chat->bigint)
        return -1;
    int64_t n = rl_chat_prompt_tokens(chat), t;
    for (size_t i = 0; chat->messages_kind == SL_J_ARRAY && i < chat->nmsgs; i++) {
        const sl_chat_msg_t *m = &chat->msgs[i];
        if (m->tool_calls_kind != SL_J_ARRAY && m->tool_calls_kind != SL_J_OBJECT)
            continue;
        if (rl_json_dump_tokens(m->tool_calls.p, m->tool_calls.len, &t) != 0)
            return -1;
        n += t;
    }
    if (chat->tools_kind == SL_J_ARRAY || chat->tools_kind == SL_J_OBJECT) {
        if (rl_tools_dump_tokens(chat->tools.p, chat->tools.len, &t) != 0)
            return -1;
        n += t;
    }
    *out = n;
    return 0;
}

int rl_responses_prompt_tokens_in(const rl_resp_in_t *in, int64_t *out)
{
    if (in->bigint)
        return -1;
    int64_t n = 3; /* the reply's priming */
    if (in->instructions_kind == SL_J_STRING)
        n += rl_estimate_text_tokens(in->instructions.p, in->instructions.len);
    if (in->input_kind == SL_J_STRING) {
        n += 4 + rl_estimate_text_tokens(in->input.p, in->input.len); /* one user message */
    } else if (in->input_kind == SL_J_ARRAY) {
        rl_jw_t w;
        if (rl_jw_run(&w, RL_JW_INPUT, in->input_json.p, in->input_json.len) != 0)
            return -1;
        n += w.n;
    }
    if (in->tools_kind != SL_J_ABSENT) {
        int64_t t;
        if (rl_tools_dump_tokens(in->tools_json.p, in->tools_json.len, &t) != 0)
            return -1;
        n += t;
    }
    *out = n;
    return 0;
}
