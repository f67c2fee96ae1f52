/*
 * answer.c — the output rules on a whole non-streamed chat.completion read
 * as bytes: yajl's event parser finds each choices[i].message.content
 * string (and the choice's finish_reason and logprobs) by its byte span,
 * the text goes through a channel (scan.c), and what changed is spliced
 * over the old spans; every other byte stays the upstream's own. No tree
 * is built: parsing the whole answer with jansson was the largest single
 * cost of a filtered non-streamed request (bench/RESULTS.md, issue 16).
 *
 * The result is the one flt_response_filter() gives on the parsed tree (a
 * mask rewrites the content, a block empties it and sets finish_reason
 * "content_filter", a change makes logprobs null). Whatever this reader
 * cannot judge exactly as the tree would — not JSON (the tree path then
 * relays it untouched), a duplicate key on the path to the text (which
 * one would the client keep?), a finish_reason or logprobs of an odd type,
 * text jansson would refuse — is left to the tree (FLT_ANS_TREE), decided
 * before any rule runs so nothing is counted twice. yajl is laxer than
 * jansson in a few places outside the texts (\v as a blank, a \u0000 in
 * another string): such an answer, which the tree path relayed untouched
 * as not JSON, is filtered here — more is checked, never less.
 */
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "filters/flt_internal.h"

typedef enum { ANL_ROOT, ANL_CHOICES, ANL_CHOICE, ANL_MESSAGE } flt_anl_t;

typedef enum {
    ANK_OTHER = 0,
    ANK_CHOICES,
    ANK_MESSAGE,
    ANK_FINISH,
    ANK_LOGPROBS,
    ANK_CONTENT,
} flt_ank_t;

typedef enum { ANV_NULL, ANV_SCALAR, ANV_STR, ANV_MAP, ANV_ARR } flt_anv_t;

/* One element of choices[], as the parser saw it; spans are [s, e) byte
 * offsets into the answer, quotes included for strings. */
typedef struct flt_anc {
    size_t open;   /* just past the choice's '{' */
    size_t ts, te; /* message.content, a string (has_text) */
    size_t fs, fe; /* finish_reason's value (has_finish) */
    size_t ls, le; /* logprobs' value (has_lp; not null) */
    bool has_text, has_finish, has_lp;
    unsigned seen, mseen; /* keys met in the choice / its message */
    const char *dp;       /* decoded text: in the answer (no escape) or NULL */
    size_t doff, dlen;    /* ... else at doff in the scratch buffer */
} flt_anc_t;

typedef struct flt_anp {
    const char *data;
    size_t n;
    yajl_handle h;
    flt_anl_t lvl[4];
    int depth;
    unsigned skip;    /* nesting inside a skipped container */
    size_t *skip_end; /* set at the skipped container's close, or NULL */
    flt_ank_t key;
    size_t key_end;
    bool root_choices, bad, oom;
    flt_anc_t *c; /* in one[] until an answer has more choices */
    size_t nc, cap;
    flt_anc_t one[2];
} flt_anp_t;

static flt_anc_t *anp_choice(flt_anp_t *p)
{
    return &p->c[p->nc - 1];
}

/* Offset of the value after the current key: past blanks, ':' and blanks. */
static size_t anp_value_start(const flt_anp_t *p)
{
    size_t i = p->key_end;
    while (i < p->n && (p->data[i] == ' ' || p->data[i] == '\t' || p->data[i] == '\n' ||
                        p->data[i] == '\r' || p->data[i] == ':'))
        i++;
    return i;
}

static int anp_bad(flt_anp_t *p)
{
    p->bad = true;
    return 0;
}

static int anp_value(flt_anp_t *p, flt_anv_t t)
{
    bool container = t == ANV_MAP || t == ANV_ARR;
    if (p->skip) {
        p->skip += container;
        return 1;
    }
    flt_ank_t k = p->key;
    p->key = ANK_OTHER;
    size_t end = yajl_get_bytes_consumed(p->h);
    size_t *skip_end = NULL;
    if (p->depth == 0) {
        if (t != ANV_MAP)
            return anp_bad(p); /* the tree path decides what a non-object is */
        p->lvl[p->depth++] = ANL_ROOT;
        return 1;
    }
    switch (p->lvl[p->depth - 1]) {
    case ANL_ROOT:
        if (k == ANK_CHOICES && t == ANV_ARR) {
            p->lvl[p->depth++] = ANL_CHOICES;
            return 1;
        }
        break;
    case ANL_CHOICES:
        if (t == ANV_MAP) {
            if (p->nc == p->cap) {
                size_t cap = p->cap * 2;
                flt_anc_t *v = realloc(p->c == p->one ? NULL : p->c, cap * sizeof *v);
                if (!v) {
                    p->oom = true;
                    return 0;
                }
                if (p->c == p->one)
                    memcpy(v, p->one, sizeof p->one);
                p->c = v;
                p->cap = cap;
            }
            flt_anc_t *c = &p->c[p->nc++];
            memset(c, 0, sizeof *c);
            c->open = end;
            p->lvl[p->depth++] = ANL_CHOICE;
            return 1;
        }
        break;
    case ANL_CHOICE: {
        flt_anc_t *c = anp_choice(p);
        if (k == ANK_MESSAGE && t == ANV_MAP) {
            p->lvl[p->depth++] = ANL_MESSAGE;
            return 1;
        }
        if (k == ANK_FINISH) {
            /* a string or null is replaced whole; anything else: the tree */
            if (t != ANV_STR && t != ANV_NULL)
                return anp_bad(p);
            c->has_finish = true;
            c->fs = anp_value_start(p);
            c->fe = end;
        } else if (k == ANK_LOGPROBS && t != ANV_NULL) {
            if (t == ANV_SCALAR)
                return anp_bad(p); /* a number's end is not where yajl stands */
            c->has_lp = true;
            c->ls = anp_value_start(p);
            c->le = end;
            if (container)
                skip_end = &c->le;
        }
        break;
    }
    case ANL_MESSAGE:
        if (k == ANK_CONTENT && t == ANV_STR) {
            flt_anc_t *c = anp_choice(p);
            c->has_text = true;
            c->ts = anp_value_start(p);
            c->te = end;
        }
        break;
    }
    if (container) {
        p->skip = 1;
        p->skip_end = skip_end;
    }
    return 1;
}

static int anp_end(void *ctx)
{
    flt_anp_t *p = ctx;
    if (p->skip) {
        if (--p->skip == 0 && p->skip_end)
            *p->skip_end = yajl_get_bytes_consumed(p->h);
        return 1;
    }
    p->depth--;
    return 1;
}

#define ANP_IS(k, n, lit) ((n) == sizeof(lit) - 1 && memcmp((k), (lit), (n)) == 0)

/* A key on the path to the text met twice: the tree would keep the last,
 * a client might read the first. Left to the tree path. */
static int anp_once(flt_anp_t *p, unsigned *seen, flt_ank_t k)
{
    if (*seen & (1u << k))
        return anp_bad(p);
    *seen |= 1u << k;
    return 1;
}

static int anp_key(void *ctx, const unsigned char *k, size_t n)
{
    flt_anp_t *p = ctx;
    p->key = ANK_OTHER;
    if (p->skip)
        return 1;
    p->key_end = yajl_get_bytes_consumed(p->h);
    switch (p->lvl[p->depth - 1]) {
    case ANL_ROOT:
        if (!ANP_IS(k, n, "choices"))
            return 1;
        if (p->root_choices)
            return anp_bad(p);
        p->root_choices = true;
        p->key = ANK_CHOICES;
        return 1;
    case ANL_CHOICE:
        if (ANP_IS(k, n, "message"))
            p->key = ANK_MESSAGE;
        else if (ANP_IS(k, n, "finish_reason"))
            p->key = ANK_FINISH;
        else if (ANP_IS(k, n, "logprobs"))
            p->key = ANK_LOGPROBS;
        return p->key == ANK_OTHER || anp_once(p, &anp_choice(p)->seen, p->key);
    case ANL_MESSAGE:
        if (ANP_IS(k, n, "content"))
            p->key = ANK_CONTENT;
        return p->key == ANK_OTHER || anp_once(p, &anp_choice(p)->mseen, p->key);
    default:
        return 1;
    }
}

static int anp_null(void *ctx)
{
    return anp_value(ctx, ANV_NULL);
}
static int anp_bool(void *ctx, int v)
{
    (void)v;
    return anp_value(ctx, ANV_SCALAR);
}
static int anp_int(void *ctx, long long v)
{
    (void)v;
    return anp_value(ctx, ANV_SCALAR);
}
static int anp_double(void *ctx, double v)
{
    (void)v;
    return anp_value(ctx, ANV_SCALAR);
}
static int anp_string(void *ctx, const unsigned char *s, size_t n)
{
    (void)s, (void)n;
    return anp_value(ctx, ANV_STR);
}
static int anp_map(void *ctx)
{
    return anp_value(ctx, ANV_MAP);
}
static int anp_arr(void *ctx)
{
    return anp_value(ctx, ANV_ARR);
}

/* Integers and doubles get callbacks so that yajl range-checks them as
 * jansson does (a number jansson refuses sends the answer to the tree). */
static const yajl_callbacks flt_anp_cb = {
    .yajl_null = anp_null,
    .yajl_boolean = anp_bool,
    .yajl_integer = anp_int,
    .yajl_double = anp_double,
    .yajl_string = anp_string,
    .yajl_start_map = anp_map,
    .yajl_map_key = anp_key,
    .yajl_end_map = anp_end,
    .yajl_start_array = anp_arr,
    .yajl_end_array = anp_end,
};

/* One splice: answer bytes [s, e) replaced by rep[0..len) of the scratch
 * buffer (or by a literal when lit is set). */
typedef struct flt_ans_edit {
    size_t s, e, off, len;
    const char *lit;
} flt_ans_edit_t;

typedef struct flt_ans {
    flt_ans_edit_t *ed;
    size_t ned, cap;
    sl_buf_t enc; /* encoded replacement strings */
} flt_ans_t;

static int ans_edit(flt_ans_t *a, size_t s, size_t e, size_t off, size_t len, const char *lit)
{
    if (a->ned == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 8;
        flt_ans_edit_t *v = realloc(a->ed, cap * sizeof *v);
        if (!v)
            return -1;
        a->ed = v;
        a->cap = cap;
    }
    a->ed[a->ned++] = (flt_ans_edit_t){s, e, off, len, lit};
    return 0;
}

static int ans_splice(flt_ans_t *a, const char *data, size_t n, char **out, size_t *outlen)
{
    /* a few edits, in order within a choice but finish_reason may come
     * before the message: insertion sort by offset */
    for (size_t i = 1; i < a->ned; i++)
        for (size_t j = i; j > 0 && a->ed[j].s < a->ed[j - 1].s; j--) {
            flt_ans_edit_t t = a->ed[j];
            a->ed[j] = a->ed[j - 1];
            a->ed[j - 1] = t;
        }
    size_t total = n;
    for (size_t i = 0; i < a->ned; i++)
        total = total - (a->ed[i].e - a->ed[i].s) + a->ed[i].len;
    char *o = malloc(total + 1), *w = o;
    if (!o)
        return -1;
    size_t pos = 0;
    for (size_t i = 0; i < a->ned; i++) {
        const flt_ans_edit_t *ed = &a->ed[i];
        memcpy(w, data + pos, ed->s - pos);
        w += ed->s - pos;
        memcpy(w, ed->lit ? ed->lit : a->enc.p + ed->off, ed->len);
        w += ed->len;
        pos = ed->e;
    }
    memcpy(w, data + pos, n - pos);
    w += n - pos;
    *w = '\0';
    *out = o;
    *outlen = total;
    return 0;
}

/* The decoded text of each choice: the bytes between the quotes when there
 * is no backslash (read in place, no copy), else jansson's own decoding of
 * that one string into dec. 1: text the tree path would judge (refuse)
 * differently, -1 out of memory. */
static int ans_decode(flt_anp_t *p, sl_buf_t *dec)
{
    for (size_t i = 0; i < p->nc; i++) {
        flt_anc_t *c = &p->c[i];
        if (!c->has_text)
            continue;
        const char *t = p->data + c->ts + 1;
        size_t tn = c->te - c->ts - 2;
        c->doff = dec->len;
        if (!memchr(t, '\\', tn)) {
            if (!flt_utf8_valid(t, tn))
                return 1;
            c->dp = t;
            c->dlen = tn;
            continue;
        }
        /* flags 0, as the answer's own parse: a \u0000 is refused */
        json_t *j = json_loadb(p->data + c->ts, c->te - c->ts, JSON_DECODE_ANY, NULL);
        if (!json_is_string(j)) {
            json_decref(j);
            return 1;
        }
        int rc = sl_buf_add(dec, json_string_value(j), json_string_length(j));
        json_decref(j);
        if (rc != 0)
            return -1;
        c->dlen = dec->len - c->doff;
    }
    return 0;
}

static const char flt_ans_cf[] = "\"content_filter\"";
static const char flt_ans_cf_key[] = "\"finish_reason\":\"content_filter\",";

/* The rules on each choice's text; the changes as edits. */
static flt_ans_rc_t ans_rules(flt_ruleset_t *rs, flt_anp_t *p, const sl_buf_t *dec, flt_ans_t *a)
{
    sl_buf_t b = {0};
    flt_ans_rc_t ret = FLT_ANS_SAME;
    for (size_t i = 0; i < p->nc; i++) {
        const flt_anc_t *c = &p->c[i];
        if (!c->has_text)
            continue;
        const char *t = c->dp ? c->dp : dec->p ? dec->p + c->doff : "";
        if (flt_text_clean(rs, t, c->dlen))
            continue; /* no copy of a text that stays as it is */
        b.len = 0;
        flt_chan_rc_t rc = flt_text_filter(rs, t, c->dlen, &b);
        if (rc == FLT_CHAN_ERR) {
            ret = FLT_ANS_ERROR;
            break;
        }
        size_t off = a->enc.len;
        if (rc == FLT_CHAN_BLOCK) {
            int e = ans_edit(a, c->ts, c->te, 0, 2, "\"\"");
            if (e == 0 && c->has_finish)
                e = ans_edit(a, c->fs, c->fe, 0, sizeof flt_ans_cf - 1, flt_ans_cf);
            else if (e == 0) /* a member after it exists: the message */
                e = ans_edit(a, c->open, c->open, 0, sizeof flt_ans_cf_key - 1, flt_ans_cf_key);
            if (e != 0) {
                ret = FLT_ANS_ERROR;
                break;
            }
        } else if (b.len == c->dlen && memcmp(b.p ? b.p : "", t, b.len) == 0) {
            continue;
        } else if (flt_json_str_encode(&a->enc, b.p ? b.p : "", b.len) != 0 ||
                   ans_edit(a, c->ts, c->te, off, a->enc.len - off, NULL) != 0) {
            ret = FLT_ANS_ERROR;
            break;
        }
        if (c->has_lp && ans_edit(a, c->ls, c->le, 0, 4, "null") != 0) {
            ret = FLT_ANS_ERROR;
            break;
        }
        ret = FLT_ANS_EDITED;
    }
    sl_buf_free(&b);
    return ret;
}

bool flt_answer_bytes_clean(const flt_ruleset_t *rs, const char *data, size_t n)
{
    return !flt_ruleset_filters_output(rs) || flt_json_strings_clean(rs, data, n);
}

flt_ans_rc_t flt_response_filter_bytes(flt_ruleset_t *rs, const char *data, size_t n, char **out,
                                       size_t *outlen)
{
    *out = NULL;
    *outlen = 0;
    if (!flt_ruleset_filters_output(rs))
        return FLT_ANS_SAME;
    /* Most answers hold no candidate at all: then no text in them, as the
     * reader below or the tree path would find it, changes, and what the
     * client gets is the answer as it came, whatever its shape. */
    if (flt_json_strings_clean(rs, data, n))
        return FLT_ANS_SAME;
    flt_anp_t p = {.data = data, .n = n};
    p.c = p.one;
    p.cap = SL_ARRAY_LEN(p.one);
    sl_yheap_t ya;
    yajl_alloc_funcs yaf = sl_yheap_funcs(&ya);
    p.h = yajl_alloc(&flt_anp_cb, &yaf, &p);
    if (!p.h)
        return FLT_ANS_ERROR;
    yajl_status s = yajl_parse(p.h, (const unsigned char *)data, n);
    if (s == yajl_status_ok)
        s = yajl_complete_parse(p.h);
    yajl_free(p.h);
    flt_ans_rc_t ret;
    sl_buf_t dec = {0};
    flt_ans_t a = {0};
    if (p.oom) {
        ret = FLT_ANS_ERROR;
    } else if (s != yajl_status_ok || p.bad) {
        ret = FLT_ANS_TREE;
    } else {
        int d = ans_decode(&p, &dec);
        ret = d < 0 ? FLT_ANS_ERROR : d > 0 ? FLT_ANS_TREE : ans_rules(rs, &p, &dec, &a);
        if (ret == FLT_ANS_EDITED && ans_splice(&a, data, n, out, outlen) != 0)
            ret = FLT_ANS_ERROR;
    }
    if (p.c != p.one)
        free(p.c);
    free(a.ed);
    sl_buf_free(&a.enc);
    sl_buf_free(&dec);
    return ret;
}
