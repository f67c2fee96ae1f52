/*
 * fuzz_stream_filter.c — libFuzzer target for the answer filter. The input
 * is a split seed (first 8 bytes) and a text (the rest, made valid UTF-8).
 * The text is streamed as chat.completion.chunk events cut at random
 * character boundaries, through flt_stream_event(), and the content that
 * comes out must equal the text filtered whole (flt_text_filter): the
 * hold-back may delay text but never change it. For the words-only ruleset
 * the result is also checked against a naive substring search, and the
 * hold-back against the longest word. A ruleset with block rules must
 * block the stream exactly when the whole text is blocked.
 *
 * Each stream also runs, event by event, beside a twin that reads every
 * event whole (no template, no shapes): verdicts, payload bytes and what
 * the read found (flt_stream_facts) must be the same. Ids and created vary
 * with the seed (sometimes with an escape in the id), so later inputs read
 * their events through shapes that earlier ones left on the thread.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "filters/flt_internal.h"
#include "tests/fuzz/fuzz_util.h"

#define FZ_MAX_TEXT 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *fz_mask_words = "ab\nabc\nbcd\n敏感\n感词\nＸＹ\na b\nhe\nshe\nhers\n";
static const char *fz_log_words = "zz\n";
static const char *fz_block_words = "bad\n禁止\n";
static const char *fz_naive_words[] = {"ab", "abc", "bcd", "敏感", "感词",
                                       "xy", "a b", "he",  "she",  "hers"};
#define FZ_LONGEST_WORD 6 /* bytes: 敏感 */

static flt_ruleset_t *fz_rs_mask, *fz_rs_words, *fz_rs_block;

static flt_ruleset_t *fz_build(int with_regex, int with_block)
{
    static const flt_conf_regex_t re[] = {
        {"phone", "1[3-9]\\d{9}", FLT_ACTION_MASK},   {"cat", "\\bcat\\b", FLT_ACTION_MASK},
        {"lb", "(?<=k=)[a-z]+", FLT_ACTION_MASK},     {"start", "^hi", FLT_ACTION_MASK},
        {"qz", "q[^q]{0,6}z", FLT_ACTION_MASK},       {"end", "end$", FLT_ACTION_MASK},
        {"num", "[0-9]{3}-[0-9]{2}", FLT_ACTION_LOG}, {"aab", "a+b", FLT_ACTION_MASK},
    };
    char *p1 = fz_file(fz_mask_words), *p2 = fz_file(fz_log_words), *p3 = fz_file(fz_block_words);
    flt_conf_words_t w[3] = {{p1, FLT_ACTION_MASK, "fz_mask"},
                             {p2, FLT_ACTION_LOG, "fz_log"},
                             {p3, FLT_ACTION_BLOCK, "fz_block"}};
    flt_conf_t c;
    flt_conf_defaults(&c);
    c.words = w;
    c.nwords = with_block ? 3 : 2;
    c.regex = re;
    c.nregex = with_regex ? SL_ARRAY_LEN(re) : 0;
    c.holdback_max = 1 << 20; /* never forced: equality must hold exactly */
    char err[256];
    flt_ruleset_t *rs = flt_ruleset_build(&c, err, sizeof err);
    if (!rs) {
        fprintf(stderr, "fuzz ruleset: %s\n", err);
        abort();
    }
    unlink(p1), unlink(p2), unlink(p3);
    free(p1), free(p2), free(p3);
    return rs;
}

static uint64_t fz_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Valid UTF-8 without NUL: invalid bytes become '?'. */
static size_t fz_sanitize(const uint8_t *in, size_t n, char *out)
{
    size_t o = 0, i = 0;
    while (i < n && o < FZ_MAX_TEXT - 4) {
        size_t len = flt_utf8_len(in[i]);
        if (i + len <= n && flt_utf8_valid((const char *)in + i, len) && in[i] != 0) {
            memcpy(out + o, in + i, len);
            o += len;
            i += len;
        } else {
            out[o++] = '?';
            i++;
        }
    }
    out[o] = '\0';
    return o;
}

/* The top-level values of one stream's chunks. */
typedef struct fz_head {
    char id[32];
    long long created;
} fz_head_t;

/* style: bit 0 indented, bit 1 \u escapes for non-ASCII, bit 2 logprobs */
static char *fz_chunk(const fz_head_t *hd, const char *s, size_t n, const char *finish,
                      unsigned style)
{
    json_t *delta = json_object();
    if (s)
        json_object_set_new(delta, "content", json_stringn(s, n));
    json_t *lp = style & 4 ? json_pack("{s:[{s:s%}]}", "content", "token", s ? s : "", s ? n : 0)
                           : json_null();
    json_t *o =
        json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:o, s:o, s:s?}]}", "id", hd->id, "object",
                  "chat.completion.chunk", "created", (json_int_t)hd->created, "model", "m",
                  "choices", "index", 0, "delta", delta, "logprobs", lp, "finish_reason", finish);
    char *d = json_dumps(o, (style & 1 ? JSON_INDENT(2) : JSON_COMPACT) |
                                (style & 2 ? JSON_ENSURE_ASCII : 0));
    json_decref(o);
    if (!d)
        abort();
    return d;
}

typedef struct fz_run {
    sl_buf_t text;
    int finish_stop, finish_filter, done, blocked;
    size_t max_held;
    flt_stream_t *whole, *fa, *fb; /* the twin read whole; the two for facts */
} fz_run_t;

static void fz_collect(fz_run_t *r, const char *data)
{
    if (strcmp(data, "[DONE]") == 0) {
        r->done++;
        return;
    }
    json_t *o = json_loads(data, 0, NULL);
    if (!o)
        abort();
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    json_t *c = json_object_get(json_object_get(ch, "delta"), "content");
    FZ_ASSERT(!json_is_object(json_object_get(ch, "logprobs"))); /* would leak held text */
    if (json_is_string(c) && sl_buf_add(&r->text, json_string_value(c), json_string_length(c)))
        abort();
    const char *f = json_string_value(json_object_get(ch, "finish_reason"));
    if (f && strcmp(f, "stop") == 0)
        r->finish_stop++;
    if (f && strcmp(f, "content_filter") == 0)
        r->finish_filter++;
    json_decref(o);
}

/* The event through the twin read whole must give the same verdict and
 * payloads, and both reads the same facts. */
static void fz_twin(fz_run_t *r, const char *data, flt_ev_verdict_t v, const flt_out_t *out)
{
    size_t n = strlen(data);
    char xa[2048], xb[2048];
    int ra = flt_stream_facts(r->fa, data, n, xa, sizeof xa);
    int rb = flt_stream_facts(r->fb, data, n, xb, sizeof xb);
    if (ra != rb || strcmp(xa, xb) != 0) {
        fprintf(stderr, "facts differ for %s\n shapes: %s\n whole:  %s\n", data, xa, xb);
        abort();
    }
    flt_out_t o = {0};
    flt_ev_verdict_t w = flt_stream_event(r->whole, data, n, &o);
    FZ_ASSERT(w == v && o.n == out->n);
    for (size_t i = 0; i < o.n; i++)
        FZ_ASSERT(o.v[i].len == out->v[i].len &&
                  memcmp(o.v[i].data, out->v[i].data, o.v[i].len) == 0);
    flt_out_release(&o);
}

static void fz_event(flt_stream_t *st, const char *data, fz_run_t *r)
{
    flt_out_t out = {0};
    flt_ev_verdict_t v = flt_stream_event(st, data, strlen(data), &out);
    if (v == FLT_EV_ERROR)
        abort();
    fz_twin(r, data, v, &out);
    if (v == FLT_EV_PASS)
        fz_collect(r, data);
    for (size_t i = 0; i < out.n; i++)
        fz_collect(r, out.v[i].data);
    if (v == FLT_EV_BLOCK)
        r->blocked = 1;
    size_t h = flt_stream_held(st, 0);
    if (h > r->max_held)
        r->max_held = h;
    flt_out_release(&out);
}

/* One input's runs share a stream, recycled between them as the gateway's
 * cache does (flt_stream_recycle / _rearm): each run after the first starts
 * from what the one before left (another ruleset, with or without regexes,
 * text held, a block), so every check below also says nothing of it stays. */
static flt_stream_t *fz_kept;

static void fz_stream(flt_ruleset_t *rs, const char *text, size_t n, uint64_t seed, fz_run_t *r)
{
    memset(r, 0, sizeof *r);
    flt_stream_t *st = fz_kept;
    fz_kept = NULL;
    if (st)
        flt_stream_rearm(st, rs);
    else
        st = flt_stream_new(rs);
    r->whole = flt_stream_new(rs);
    r->fa = flt_stream_new(rs);
    r->fb = flt_stream_new(rs);
    if (!st || !r->whole || !r->fa || !r->fb)
        abort();
    flt_stream_template(r->whole, false);
    flt_stream_template(r->fb, false);
    uint64_t s = seed | 1;
    size_t pos = 0, maxpiece = 1 + fz_rand(&s) % 24;
    unsigned style = (unsigned)(seed >> 40) & 7;
    /* a new id and created per stream; one in eight ids with a quote */
    fz_head_t hd;
    snprintf(hd.id, sizeof hd.id, (seed >> 44) % 8 ? "fz-%x" : "fz\"%x", (unsigned)(seed >> 16));
    hd.created = (long long)(seed % 4000000000u) - 100;
    while (pos < n && !r->blocked) {
        size_t end = pos + fz_rand(&s) % (maxpiece + 1); /* empty pieces too */
        if (end > n)
            end = n;
        while (end < n && ((unsigned char)text[end] & 0xC0) == 0x80)
            end++; /* JSON strings hold whole characters */
        char *d = fz_chunk(&hd, text + pos, end - pos, NULL, style);
        fz_event(st, d, r);
        free(d);
        pos = end;
    }
    if (!r->blocked) {
        char *d = fz_chunk(&hd, NULL, 0, "stop", style);
        fz_event(st, d, r);
        free(d);
    }
    if (!r->blocked)
        fz_event(st, "[DONE]", r);
    flt_stream_recycle(st);
    fz_kept = st;
    flt_stream_free(r->whole);
    flt_stream_free(r->fa);
    flt_stream_free(r->fb);
}

/* Naive reference for the words-only ruleset: fold, find every occurrence,
 * merge overlapping ranges, one mask per merged range. */
static void fz_naive(const char *text, size_t n, sl_buf_t *out)
{
    char fold[FZ_MAX_TEXT];
    size_t map[FZ_MAX_TEXT + 1], fl = 0, i = 0;
    while (i < n) {
        unsigned char tmp[4];
        size_t used, k = flt_fold_char((const unsigned char *)text + i, n - i, tmp, &used);
        for (size_t j = 0; j < k; j++) {
            fold[fl] = (char)flt_lower[tmp[j]];
            map[fl++] = i;
        }
        i += used;
    }
    map[fl] = n;
    unsigned char *masked = calloc(n + 1, 1); /* 1 = inside, 2 = a range starts here */
    size_t *ends = calloc(n + 1, sizeof *ends);
    for (size_t w = 0; w < SL_ARRAY_LEN(fz_naive_words); w++) {
        size_t wl = strlen(fz_naive_words[w]);
        for (size_t p = 0; p + wl <= fl; p++) {
            if (memcmp(fold + p, fz_naive_words[w], wl) != 0)
                continue;
            size_t os = map[p], oe = map[p + wl];
            if (oe > ends[os])
                ends[os] = oe;
        }
    }
    /* sweep by start: merge when a start lies inside the open range */
    size_t open_end = 0;
    for (size_t p = 0; p < n; p++) {
        if (ends[p] && p < open_end) {
            if (ends[p] > open_end)
                open_end = ends[p];
        } else if (ends[p]) {
            masked[p] = 2;
            open_end = ends[p];
        }
        if (p < open_end && masked[p] != 2)
            masked[p] = 1;
    }
    for (size_t p = 0; p < n; p++) {
        int ok = 0;
        if (masked[p] == 2)
            ok = sl_buf_add(out, "***", 3);
        else if (!masked[p])
            ok = sl_buf_add(out, text + p, 1);
        if (ok)
            abort();
    }
    free(masked);
    free(ends);
}

static void fz_fail(const char *what, const char *text, const sl_buf_t *a, const sl_buf_t *b)
{
    fprintf(stderr, "%s\n text: [%s]\n want: [%.*s]\n got:  [%.*s]\n", what, text, (int)a->len,
            a->p ? a->p : "", (int)b->len, b->p ? b->p : "");
    abort();
}

static int fz_equal(const sl_buf_t *a, const sl_buf_t *b)
{
    return a->len == b->len && (a->len == 0 || memcmp(a->p, b->p, a->len) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!fz_rs_mask) {
        fz_rs_mask = fz_build(1, 0);
        fz_rs_words = fz_build(0, 0);
        fz_rs_block = fz_build(1, 1);
    }
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    size_t skip = size < 8 ? size : 8;
    for (size_t i = 0; i < skip; i++)
        seed = (seed ^ data[i]) * 0x100000001B3ull;
    static char text[FZ_MAX_TEXT];
    size_t n = fz_sanitize(data + skip, size - skip, text);

    flt_ruleset_t *sets[2] = {fz_rs_mask, fz_rs_words};
    for (int k = 0; k < 2; k++) {
        sl_buf_t whole = {0};
        FZ_ASSERT(flt_text_filter(sets[k], text, n, &whole) == FLT_CHAN_OK);
        fz_run_t r;
        fz_stream(sets[k], text, n, seed, &r);
        FZ_ASSERT(!r.blocked && r.finish_stop == 1 && r.done == 1 && !r.finish_filter);
        if (!fz_equal(&whole, &r.text))
            fz_fail("stream != whole", text, &whole, &r.text);
        if (k == 1) {
            sl_buf_t naive = {0};
            fz_naive(text, n, &naive);
            if (!fz_equal(&naive, &whole))
                fz_fail("whole != naive", text, &naive, &whole);
            sl_buf_free(&naive);
            /* words only: never more held than a proper prefix of the longest
             * word, in folded bytes; a folded byte is at most 3 original ones */
            FZ_ASSERT(r.max_held <= (FZ_LONGEST_WORD - 1) * 3);
        }
        sl_buf_free(&whole);
        sl_buf_free(&r.text);
    }

    sl_buf_t whole = {0};
    flt_chan_rc_t rc = flt_text_filter(fz_rs_block, text, n, &whole);
    fz_run_t r;
    fz_stream(fz_rs_block, text, n, seed, &r);
    FZ_ASSERT((rc == FLT_CHAN_BLOCK) == (r.blocked == 1));
    FZ_ASSERT(!r.blocked || (r.finish_filter == 1 && !r.finish_stop && !r.done));
    if (!r.blocked && !fz_equal(&whole, &r.text))
        fz_fail("stream != whole (block set)", text, &whole, &r.text);
    sl_buf_free(&whole);
    sl_buf_free(&r.text);

    /* after a block (or not), recycled once more onto the regex set */
    FZ_ASSERT(flt_text_filter(fz_rs_mask, text, n, &whole) == FLT_CHAN_OK);
    fz_stream(fz_rs_mask, text, n, seed ^ 0x5555, &r);
    FZ_ASSERT(!r.blocked && r.finish_stop == 1 && r.done == 1 && !r.finish_filter);
    if (!fz_equal(&whole, &r.text))
        fz_fail("recycled stream != whole", text, &whole, &r.text);
    sl_buf_free(&whole);
    sl_buf_free(&r.text);
    flt_stream_free(fz_kept);
    fz_kept = NULL;
    return 0;
}
