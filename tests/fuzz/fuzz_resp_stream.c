/*
 * fuzz_resp_stream.c — the Responses stream filter's fast paths
 * (gw_flt_resp_event: events passed unread, deltas and done events matched
 * by kept shapes, yajl's pass, the yajl handle kept between events) held
 * to its tree path (gw_flt_resp_event_tree: every event a jansson tree)
 * over whole streams. Each event goes through both, each with a filter
 * state of its own; the verdicts, the payloads and the text held back must
 * be the same after every event (so a refusal comes at the same event and
 * a word split across two deltas is held and masked alike), and so must
 * the flush of a last output_text.done added to every stream that did not
 * stop (what was held, and the text sent, which it repeats).
 *
 * The one difference allowed: a delta whose text the filter changed is
 * the upstream's event with its delta (and logprobs, as []) spliced on the
 * fast path, where the tree path writes a new event of five members. So
 * when the two payloads' bytes differ, the tree's must be a delta event
 * and the fast one, read by jansson, must be the upstream's event read by
 * jansson with delta set to the tree's delta and logprobs (when there) to
 * []: the same text, every other member as the upstream sent it.
 *
 * The stream runs twice: once with this thread's kept shapes cleared, and
 * once more with the shapes the first run left (as a second stream from
 * the same server finds them), each run against a fresh tree twin; in the
 * second the templates' sequence numbers are moved by 250 (fz_seq: a 0
 * becomes -0, a 1 a real, a 3 null...), so a kept shape meets values its
 * holes must refuse.
 *
 * Input: byte 0 chooses the rules (fz_rs), the rest is lines, one event
 * each. A line whose first byte is 1..7 is a template (fz_template): a real
 * event type with fuzzer-chosen text, sequence number (reals, -0, nulls,
 * big integers), escapes, member order, duplicate keys, blanks; any other
 * line is the event's bytes as they are.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "filters/filters.h"
#include "gateway/gw_flt_resp.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_MAX_EV   48
#define FZ_MAX_LINE 1024
#define FZ_MAX_P    8

/* ---- the rules --------------------------------------------------------- */

static const char *fz_mask_words = "badword\nab\nx y\n敏感\n";
static const char *fz_block_words = "evil\nzq\n";

/* 0 mask words; 1 mask and block words; 2 mask words and regexes; 3 all */
static flt_ruleset_t *fz_build(int with_regex, int with_block)
{
    static const flt_conf_regex_t re[] = {
        {"cat", "\\bcat\\b", FLT_ACTION_MASK},
        {"phone", "1[3-9]\\d{9}", FLT_ACTION_MASK},
        {"qz", "q[^q]{0,4}z", FLT_ACTION_MASK},
        {"nope", "no+pe", FLT_ACTION_BLOCK},
    };
    char *p1 = fz_file(fz_mask_words), *p2 = fz_file(fz_block_words);
    flt_conf_words_t w[2] = {{p1, FLT_ACTION_MASK, "fz_mask"}, {p2, FLT_ACTION_BLOCK, "fz_block"}};
    flt_conf_t c;
    flt_conf_defaults(&c);
    c.words = w;
    c.nwords = with_block ? 2 : 1;
    c.regex = re;
    c.nregex = with_regex ? (with_block ? 4 : 3) : 0;
    char err[256];
    flt_ruleset_t *rs = flt_ruleset_build(&c, err, sizeof err);
    if (!rs) {
        fprintf(stderr, "fuzz ruleset: %s\n", err);
        abort();
    }
    unlink(p1), unlink(p2);
    free(p1), free(p2);
    return rs;
}

static flt_ruleset_t *fz_rs(uint8_t b)
{
    static flt_ruleset_t *rs[4];
    int i = b & 3;
    if (!rs[i])
        rs[i] = fz_build(i >= 2, i & 1);
    return rs[i];
}

/* ---- a growing string ---------------------------------------------------- */

typedef struct fz_str {
    char *p;
    size_t n, cap;
} fz_str_t;

static void fz_add(fz_str_t *s, const char *p, size_t n)
{
    if (s->n + n + 1 > s->cap) {
        s->cap = (s->n + n + 1) * 2;
        s->p = realloc(s->p, s->cap);
        FZ_ASSERT(s->p);
    }
    memcpy(s->p + s->n, p, n);
    s->n += n;
    s->p[s->n] = '\0';
}

static void fz_adds(fz_str_t *s, const char *p)
{
    fz_add(s, p, strlen(p));
}

/* ---- the templates --------------------------------------------------------
 *
 * line[0] the type (1 delta, 2 output_text.done, 3 content_part.done,
 * 4 output_item.done, 5 response.completed, 6 response.incomplete, 7 an
 * event the adapter does not act on), line[1] flags (FZ_F_*), line[2] the
 * sequence number (fz_seq), the rest the text's bytes (fz_enc). */

enum {
    FZ_F_ESC = 1,      /* escapes in the text: '/' as \/, 'e' as \u0065 */
    FZ_F_LP = 2,       /* logprobs not empty */
    FZ_F_REV = 4,      /* the event's members in reverse order */
    FZ_F_DUP = 8,      /* the text's key twice, "" first */
    FZ_F_BLANK = 16,   /* ", " and ": " */
    FZ_F_MODE = 96,    /* the text: 0 its bytes, 1 the upstream's so far, 2 the text sent, 3 both */
    FZ_F_VARIANT = 128 /* another part type, no content, another order of the item */
};

typedef struct fz_gen {
    fz_str_t up;   /* the deltas' texts the templates sent (decoded) */
    fz_str_t sent; /* the text the tree twin sent so far (decoded) */
} fz_gen_t;

/* Text bytes as a JSON string's interior. */
static void fz_enc(fz_str_t *o, const uint8_t *t, size_t n, bool esc)
{
    char b[8];
    for (size_t i = 0; i < n; i++) {
        uint8_t c = t[i];
        if (c == '"' || c == '\\') {
            b[0] = '\\', b[1] = (char)c;
            fz_add(o, b, 2);
        } else if (c == 0x0b) {
            fz_adds(o, "\\n"); /* a line cannot hold one itself */
        } else if (c < 0x20) {
            snprintf(b, sizeof b, "\\u%04x", c);
            fz_adds(o, b);
        } else if (esc && c == '/') {
            fz_adds(o, "\\/");
        } else if (esc && c == 'e') {
            snprintf(b, sizeof b, "\\u%04x", c);
            fz_adds(o, b);
        } else {
            fz_add(o, (const char *)&c, 1);
        }
    }
}

static void fz_seq(fz_str_t *o, uint8_t s)
{
    static const char *const odd[] = {
        "-0", "1.5", "1e3", "null", "12345678901234567890123", "1234567890123456789"};
    char b[8];
    if (s >= 250) {
        fz_adds(o, odd[s - 250]);
        return;
    }
    snprintf(b, sizeof b, "%u", s);
    fz_adds(o, b);
}

typedef struct fz_members {
    fz_str_t v[10];
    const char *k[10];
    size_t n;
} fz_members_t;

static fz_str_t *fz_member(fz_members_t *m, const char *k)
{
    FZ_ASSERT(m->n < 10);
    m->k[m->n] = k;
    memset(&m->v[m->n], 0, sizeof(fz_str_t));
    return &m->v[m->n++];
}

static void fz_object(fz_str_t *o, fz_members_t *m, bool rev, bool blank)
{
    fz_adds(o, "{");
    for (size_t i = 0; i < m->n; i++) {
        size_t k = rev ? m->n - 1 - i : i;
        if (i)
            fz_adds(o, blank ? ", " : ",");
        fz_adds(o, "\"");
        fz_adds(o, m->k[k]);
        fz_adds(o, blank ? "\": " : "\":");
        fz_add(o, m->v[k].p ? m->v[k].p : "", m->v[k].n);
        free(m->v[k].p);
    }
    fz_adds(o, "}");
    m->n = 0;
}

/* The text member's value: the quoted text the flags choose. */
static void fz_text(fz_str_t *o, const fz_gen_t *g, uint8_t f, const uint8_t *t, size_t n)
{
    bool esc = f & FZ_F_ESC;
    fz_adds(o, "\"");
    switch ((f & FZ_F_MODE) >> 5) {
    case 1:
        fz_enc(o, (const uint8_t *)g->up.p, g->up.n, esc);
        break;
    case 2:
        fz_enc(o, (const uint8_t *)g->sent.p, g->sent.n, esc);
        break;
    case 3:
        fz_enc(o, (const uint8_t *)g->sent.p, g->sent.n, esc);
        fz_enc(o, t, n, esc);
        break;
    default:
        fz_enc(o, t, n, esc);
        break;
    }
    fz_adds(o, "\"");
}

/* An output item (a message) holding the text. */
static void fz_item(fz_str_t *o, const fz_gen_t *g, uint8_t f, const uint8_t *t, size_t n)
{
    bool blank = f & FZ_F_BLANK;
    fz_members_t m = {.n = 0}, p = {.n = 0};
    fz_adds(fz_member(&p, "type"), "\"output_text\"");
    if (f & FZ_F_DUP)
        fz_adds(fz_member(&p, "text"), "\"\"");
    fz_text(fz_member(&p, "text"), g, f, t, n);
    fz_adds(fz_member(&p, "annotations"), "[]");
    fz_adds(fz_member(&m, "id"), "\"msg_1\"");
    fz_adds(fz_member(&m, "type"), "\"message\"");
    fz_adds(fz_member(&m, "status"), "\"completed\"");
    fz_adds(fz_member(&m, "role"), "\"assistant\"");
    fz_str_t *c = fz_member(&m, "content");
    fz_adds(c, "[");
    fz_object(c, &p, false, blank);
    fz_adds(c, "]");
    fz_object(o, &m, f & FZ_F_VARIANT, blank);
}

static void fz_template(fz_str_t *o, fz_gen_t *g, const uint8_t *l, size_t n, uint8_t shift)
{
    static const char *const other[] = {"response.created", "response.in_progress",
                                        "response.output_item.added", "response.content_part.added",
                                        "error"};
    static const char *const types[] = {
        NULL,
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
        "response.incomplete",
    };
    uint8_t kind = l[0], f = n > 1 ? l[1] : 0, s = (uint8_t)((n > 2 ? l[2] : 0) + shift);
    const uint8_t *t = n > 3 ? l + 3 : l;
    size_t tn = n > 3 ? n - 3 : 0;
    bool blank = f & FZ_F_BLANK;
    const char *type = kind == 7 ? other[s % 5] : types[kind];
    fz_members_t m = {.n = 0};
    fz_str_t *v = fz_member(&m, "type");
    fz_adds(v, "\"");
    fz_adds(v, type);
    fz_adds(v, "\"");
    fz_seq(fz_member(&m, "sequence_number"), s);
    if (kind <= 3) {
        fz_adds(fz_member(&m, "item_id"), "\"msg_1\"");
        fz_adds(fz_member(&m, "output_index"), "0");
        fz_adds(fz_member(&m, "content_index"), "0");
    }
    if (kind == 1 || kind == 2) {
        const char *k = kind == 1 ? "delta" : "text";
        if (f & FZ_F_DUP)
            fz_adds(fz_member(&m, k), "\"\"");
        fz_text(fz_member(&m, k), g, f, t, tn);
        fz_adds(fz_member(&m, "logprobs"),
                f & FZ_F_LP ? "[{\"token\":\"a\",\"logprob\":-0.25,\"bytes\":[97]}]" : "[]");
        if (kind == 1 && !(f & FZ_F_MODE))
            fz_add(&g->up, (const char *)t, tn); /* (as bytes: near enough for a seed) */
    } else if (kind == 3) {
        fz_members_t p = {.n = 0};
        fz_adds(fz_member(&p, "type"), f & FZ_F_VARIANT ? "\"refusal\"" : "\"output_text\"");
        if (f & FZ_F_DUP)
            fz_adds(fz_member(&p, "text"), "\"\"");
        fz_text(fz_member(&p, "text"), g, f, t, tn);
        fz_adds(fz_member(&p, "annotations"), "[]");
        fz_object(fz_member(&m, "part"), &p, false, blank);
    } else if (kind == 4) {
        fz_adds(fz_member(&m, "output_index"), "0");
        fz_item(fz_member(&m, "item"), g, f, t, tn);
    } else if (kind == 5 || kind == 6) {
        fz_members_t r = {.n = 0};
        fz_adds(fz_member(&r, "id"), "\"resp_1\"");
        fz_adds(fz_member(&r, "object"), "\"response\"");
        fz_adds(fz_member(&r, "created_at"), "1700000000");
        fz_adds(fz_member(&r, "status"), kind == 5 ? "\"completed\"" : "\"incomplete\"");
        fz_str_t *out = fz_member(&r, "output");
        fz_adds(out, "[");
        fz_item(out, g, f, t, tn);
        fz_adds(out, "]");
        fz_adds(fz_member(&r, "usage"),
                "{\"input_tokens\":9,\"output_tokens\":3,\"total_tokens\":12}");
        fz_object(fz_member(&m, "response"), &r, false, blank);
    } else {
        fz_members_t r = {.n = 0};
        fz_adds(fz_member(&r, "id"), "\"resp_1\"");
        fz_adds(fz_member(&r, "output"), "[]");
        fz_text(fz_member(&r, "note"), g, f, t, tn);
        fz_object(fz_member(&m, "response"), &r, false, blank);
    }
    fz_object(o, &m, f & FZ_F_REV, blank);
}

/* ---- the two paths -------------------------------------------------------- */

typedef struct fz_side {
    flt_stream_t *st;
    gw_flt_resp_t *x;
} fz_side_t;

static void fz_side_new(fz_side_t *s, flt_ruleset_t *rs)
{
    s->st = flt_stream_new(rs);
    s->x = gw_flt_resp_new();
    FZ_ASSERT(s->st && s->x);
}

static void fz_side_free(fz_side_t *s)
{
    gw_flt_resp_free(s->x);
    flt_stream_free(s->st);
}

static void fz_fail(size_t i, const char *ev, size_t len, const char *why, const char *a, size_t an,
                    const char *b, size_t bn)
{
    fprintf(stderr, "event %zu %.*s\n%s\nfast: %.*s\ntree: %.*s\n", i, (int)len, ev, why, (int)an,
            a ? a : "", (int)bn, b ? b : "");
    abort();
}

static bool fz_is_delta(const json_t *j)
{
    const char *t = json_string_value(json_object_get(j, "type"));
    return t && strcmp(t, "response.output_text.delta") == 0;
}

/* The fast path's payload f stands for the tree path's r, the event being
 * ev: the same bytes, or a delta spliced into the upstream's event (the
 * difference allowed: see the top of the file). */
static bool fz_same_payload(const char *ev, size_t len, const gw_payload_t *f,
                            const gw_payload_t *r)
{
    if (f->len == r->len && memcmp(f->data, r->data, r->len) == 0)
        return true;
    json_t *rj = json_loadb(r->data, r->len, 0, NULL);
    json_t *fj = json_loadb(f->data, f->len, 0, NULL);
    json_t *oj = json_loadb(ev, len, 0, NULL);
    bool ok = fz_is_delta(rj) && fj && json_is_object(oj) && fz_is_delta(oj) &&
              json_is_string(json_object_get(rj, "delta"));
    if (ok) {
        json_object_set(oj, "delta", json_object_get(rj, "delta"));
        if (json_object_get(oj, "logprobs"))
            json_object_set_new(oj, "logprobs", json_array());
        ok = json_equal(fj, oj);
    }
    json_decref(rj);
    json_decref(fj);
    json_decref(oj);
    return ok;
}

/* What the tree twin sent for this event (PASS: the event's own delta). */
static void fz_note_sent(fz_gen_t *g, const char *ev, size_t len, gw_ev_rc_t rc, gw_payloads_t *out)
{
    for (size_t k = 0; k < (rc == GW_EV_PASS ? 1 : out->n); k++) {
        const char *d = rc == GW_EV_PASS ? ev : gw_payloads_at(out, k)->data;
        size_t dn = rc == GW_EV_PASS ? len : gw_payloads_at(out, k)->len;
        json_t *j = json_loadb(d, dn, 0, NULL);
        json_t *s = json_object_get(j, "delta");
        if (fz_is_delta(j) && json_is_string(s))
            fz_add(&g->sent, json_string_value(s), json_string_length(s));
        json_decref(j);
    }
}

/* One event through both sides; false: the stream stopped. */
static bool fz_event(fz_side_t *fast, fz_side_t *tree, fz_gen_t *g, size_t i, const char *ev,
                     size_t len)
{
    gw_payloads_t fo, to;
    gw_payloads_init(&fo);
    gw_payloads_init(&to);
    gw_ev_rc_t a = gw_flt_resp_event(fast->x, fast->st, ev, len, &fo);
    gw_ev_rc_t b = gw_flt_resp_event_tree(tree->x, tree->st, ev, len, &to);
    char why[128];
    if (a != b || fo.n != to.n) {
        snprintf(why, sizeof why, "rc %d/%d, %zu/%zu payloads", a, b, fo.n, to.n);
        fz_fail(i, ev, len, why, fo.n ? gw_payloads_at(&fo, 0)->data : NULL,
                fo.n ? gw_payloads_at(&fo, 0)->len : 0, to.n ? gw_payloads_at(&to, 0)->data : NULL,
                to.n ? gw_payloads_at(&to, 0)->len : 0);
    }
    for (size_t k = 0; k < fo.n; k++) {
        const gw_payload_t *p = gw_payloads_at(&fo, k), *q = gw_payloads_at(&to, k);
        if (!fz_same_payload(ev, len, p, q)) {
            snprintf(why, sizeof why, "payload %zu", k);
            fz_fail(i, ev, len, why, p->data, p->len, q->data, q->len);
        }
    }
    if (flt_stream_held(fast->st, 0) != flt_stream_held(tree->st, 0)) {
        snprintf(why, sizeof why, "held %zu/%zu", flt_stream_held(fast->st, 0),
                 flt_stream_held(tree->st, 0));
        fz_fail(i, ev, len, why, NULL, 0, NULL, 0);
    }
    if (g)
        fz_note_sent(g, ev, len, b, &to);
    gw_payloads_clear(&fo);
    gw_payloads_clear(&to);
    return a != GW_EV_STOP;
}

/* One run of the stream against a fresh tree twin, each event made as it
 * comes (its template reads the text sent so far); shift is added to the
 * templates' sequence numbers (a second stream's, with the -0, reals,
 * nulls and big integers of fz_seq where the first had small ones). */
static void fz_run(flt_ruleset_t *rs, const uint8_t *const *line, const size_t *linen, size_t nev,
                   uint8_t shift)
{
    static const char flush[] = "{\"type\":\"response.output_text.done\",\"text\":\"\"}";
    fz_side_t fast, tree;
    fz_gen_t g = {{0}, {0}};
    fz_add(&g.up, "", 0);
    fz_add(&g.sent, "", 0);
    fz_side_new(&fast, rs);
    fz_side_new(&tree, rs);
    bool going = true;
    for (size_t i = 0; i < nev && going; i++) {
        fz_str_t o = {0};
        if (linen[i] && line[i][0] >= 1 && line[i][0] <= 7)
            fz_template(&o, &g, line[i], linen[i], shift);
        else
            fz_add(&o, (const char *)line[i], linen[i]);
        going = fz_event(&fast, &tree, &g, i, o.p, o.n);
        free(o.p);
    }
    if (going)
        fz_event(&fast, &tree, NULL, nev, flush, sizeof(flush) - 1);
    fz_side_free(&fast);
    fz_side_free(&tree);
    free(g.up.p);
    free(g.sent.p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    flt_ruleset_t *rs = fz_rs(data[0]);
    const uint8_t *line[FZ_MAX_EV];
    size_t linen[FZ_MAX_EV], nev = 0, pos = 1;
    while (pos < size && nev < FZ_MAX_EV) {
        const uint8_t *nl = memchr(data + pos, '\n', size - pos);
        size_t end = nl ? (size_t)(nl - data) : size;
        if (end - pos <= FZ_MAX_LINE && !(pos == 1 && end == 1)) {
            line[nev] = data + pos;
            linen[nev++] = end - pos;
        }
        pos = end + 1;
    }
    gw_flt_resp_shapes_clear();
    gw_flt_resp_dshapes_clear();
    fz_run(rs, line, linen, nev, 0);
    /* once more, with the shapes the first run left, the same events but
     * the templates' sequence numbers */
    fz_run(rs, line, linen, nev, 250);
    return 0;
}
