/*
 * scan_same.h — the body scanner's two ways to the same answer, compared:
 * yajl over the whole body (GW_SCAN_NO_SKEL) and yajl over a skeleton with
 * string interiors cut out (GW_SCAN_SKEL_TEST: cuts from 3-byte runs, so a
 * small body has many). Everything a caller can read must be equal: the
 * result, every fact's kind, offsets and value, the messages and parts, and
 * the bytes of a spliced body. (Also with the real thresholds: flags.) And
 * the same with the thread's kept shapes against a parse (scan_same_shape).
 * Shared by tests/unit/test_gw_body_scan.c and the fuzz_body_scan target.
 */
#ifndef TESTS_SCAN_SAME_H
#define TESTS_SCAN_SAME_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/body_scan.h"

static inline int scan_same_text(sl_text_t a, sl_text_t b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.p, b.p, a.len) == 0);
}

static inline int scan_same_fact(const gw_jfact_t *a, const gw_jfact_t *b)
{
    if (a->kind != b->kind)
        return 0;
    if (a->kind == SL_J_ABSENT)
        return 1;
    /* the values share their bytes (gw_jfact_t): the one kind names */
    return a->off == b->off && a->end == b->end &&
           ((a->kind != SL_J_INT && a->kind != SL_J_REAL) || a->i == b->i) &&
           (a->kind != SL_J_STRING || scan_same_text(a->s, b->s)) &&
           ((a->kind != SL_J_OBJECT && a->kind != SL_J_ARRAY) ||
            (a->close == b->close && a->members == b->members));
}

static inline int scan_same_spliced(gw_body_scan_t *a, gw_body_scan_t *b)
{
    gw_body_scan_t *s[2] = {a, b};
    char *out[2] = {NULL, NULL};
    size_t n[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        if (gw_body_set(s[i], "model", gw_body_fact(s[i], GW_F_MODEL), "\"m-x\"", 5) != 0 ||
            gw_body_set(s[i], "max_tokens", gw_body_fact(s[i], GW_F_MAX_TOKENS), "7", 1) != 0 ||
            gw_body_set_include_usage(s[i]) != 0 || gw_body_splice_apply(s[i], &out[i], &n[i]) != 0)
            goto oom;
    }
    int same = n[0] == n[1] && memcmp(out[0], out[1], n[0]) == 0;
    free(out[0]);
    free(out[1]);
    return same;
oom:
    free(out[0]);
    free(out[1]);
    return 1; /* out of memory: nothing to compare */
}

/* What differs between two scans that both said OK (NULL: nothing a
 * caller can read, splices applied included; they are added to both). */
static inline const char *scan_same_cmp(gw_body_scan_t *a, gw_body_scan_t *b)
{
    const char *why = NULL;
    if (!scan_same_fact(gw_body_fact(a, GW_F_TOP), gw_body_fact(b, GW_F_TOP)))
        why = "top";
    else if (!scan_same_fact(gw_body_fact(a, GW_F_MODEL), gw_body_fact(b, GW_F_MODEL)))
        why = "model";
    else if (!scan_same_fact(gw_body_fact(a, GW_F_STREAM), gw_body_fact(b, GW_F_STREAM)))
        why = "stream";
    else if (!scan_same_fact(gw_body_fact(a, GW_F_STREAM_OPTIONS),
                             gw_body_fact(b, GW_F_STREAM_OPTIONS)))
        why = "stream_options";
    else if (!scan_same_fact(gw_body_fact(a, GW_F_INCLUDE_USAGE),
                             gw_body_fact(b, GW_F_INCLUDE_USAGE)))
        why = "include_usage";
    else if (!scan_same_fact(gw_body_fact(a, GW_F_MAX_TOKENS), gw_body_fact(b, GW_F_MAX_TOKENS)))
        why = "max_tokens";
    else if (!scan_same_fact(gw_body_fact(a, GW_F_MAX_COMPLETION_TOKENS),
                             gw_body_fact(b, GW_F_MAX_COMPLETION_TOKENS)))
        why = "max_completion_tokens";
    else if (!scan_same_fact(gw_body_fact(a, GW_F_MAX_OUTPUT_TOKENS),
                             gw_body_fact(b, GW_F_MAX_OUTPUT_TOKENS)))
        why = "max_output_tokens";
    else if (!scan_same_fact(gw_body_fact(a, GW_F_N), gw_body_fact(b, GW_F_N)))
        why = "n";
    else if (a->bigint != b->bigint || a->has_msgs != b->has_msgs)
        why = "flags";
    else if (a->chat.messages_kind != b->chat.messages_kind ||
             a->chat.tools_kind != b->chat.tools_kind || a->chat.nmsgs != b->chat.nmsgs ||
             a->nparts != b->nparts)
        why = "chat";
    for (size_t i = 0; !why && i < a->chat.nmsgs; i++) {
        const sl_chat_msg_t *x = &a->chat.msgs[i], *y = &b->chat.msgs[i];
        if (x->kind != y->kind || x->role_kind != y->role_kind ||
            x->content_kind != y->content_kind || x->name_kind != y->name_kind ||
            x->tool_calls_kind != y->tool_calls_kind || x->part0 != y->part0 ||
            x->nparts != y->nparts || !scan_same_text(x->role, y->role) ||
            !scan_same_text(x->content, y->content) || !scan_same_text(x->name, y->name))
            why = "a message";
    }
    for (size_t i = 0; !why && i < a->nparts; i++) {
        const sl_chat_part_t *x = &a->chat.parts[i], *y = &b->chat.parts[i];
        if (x->kind != y->kind || x->type_kind != y->type_kind || x->text_kind != y->text_kind ||
            x->image_url != y->image_url || !scan_same_text(x->type, y->type) ||
            !scan_same_text(x->text, y->text))
            why = "a part";
    }
    if (!why && !scan_same_spliced(a, b))
        why = "the spliced body";
    return why;
}

/* Scans body both ways, GW_SCAN_MSGS and flags (with GW_SCAN_SKEL_TEST or
 * not: the test thresholds or the real ones) against GW_SCAN_NO_SKEL; NULL
 * when they agree, else what differs. *cut (may be NULL): bytes the
 * skeleton's parse did not read (0: it took no cut). Neither way uses a
 * kept shape (scan_same_shape compares those). */
static inline const char *scan_same(const char *body, size_t len, unsigned flags, size_t *cut)
{
    const char *why = NULL;
    gw_body_scan_t *a = gw_body_scan_new(), *b = gw_body_scan_new();
    if (!a || !b)
        goto done;
    flags |= GW_SCAN_MSGS | GW_SCAN_NO_SHAPE;
    gw_scan_rc_t ra = gw_body_scan(a, body, len, (flags & ~GW_SCAN_SKEL_TEST) | GW_SCAN_NO_SKEL);
    gw_scan_rc_t rb = gw_body_scan(b, body, len, flags);
    if (cut)
        *cut = b->elided;
    if (ra == GW_SCAN_OOM || rb == GW_SCAN_OOM)
        goto done;
    if (ra != rb) {
        why = "rc";
        goto done;
    }
    if (ra != GW_SCAN_OK)
        goto done;
    if (a->elided != 0)
        why = "the plain path cut";
    else
        why = scan_same_cmp(a, b);
done:
    gw_body_scan_free(a);
    gw_body_scan_free(b);
    return why;
}

/* ---- kept shapes (body_scan.c, "shapes") -------------------------------------
 *
 * A body scanned with the thread's kept shapes (it may hit one, or keep its
 * own) against the same body parsed (GW_SCAN_NO_SHAPE); then bodies made
 * from it by changing what a shape may leave as holes (string values, not
 * a role's or a type's; integers), all at once so the shape is the same
 * (escapes added too: \n, \", \u00e9, a surrogate pair, \\ and \/ are
 * holes' bytes a hit decodes), and by changes that must miss (a lone,
 * reversed or unpaired surrogate escape, a bad escape, \u0000, a real, 19
 * digits, a control byte, a key, a role). Every fact, message, part and
 * spliced body must be the parse's. */

typedef struct scan_tok {
    size_t off, len;
    char kind; /* 's' a string value's interior, 'w' a role's or type's, 'k' a key's, 'i' an integer
                */
} scan_tok_t;

#define SCAN_TOKS_MAX 256

/* The tokens of body a shape test changes (a rough lexer: what it gets
 * wrong makes bodies the scanner judges anyway). */
static inline size_t scan_toks(const char *b, size_t n, scan_tok_t *t)
{
    size_t nt = 0;
    const char *key = "";
    size_t klen = 0;
    char prev = 0; /* the last byte outside strings and blanks */
    for (size_t i = 0; i < n && nt < SCAN_TOKS_MAX; i++) {
        char ch = b[i];
        if (ch == '"') {
            size_t j = i + 1;
            bool esc = false;
            while (j < n && b[j] != '"') {
                if (b[j] == '\\') {
                    esc = true;
                    j++;
                }
                j++;
            }
            if (j >= n)
                break;
            size_t k = j + 1;
            while (k < n && (b[k] == ' ' || b[k] == '\n' || b[k] == '\t' || b[k] == '\r'))
                k++;
            bool is_key = k < n && b[k] == ':';
            /* escaped strings too: a value's may be a hole (escaped keys
             * and words make no shape; their mutations miss) */
            (void)esc;
            char kind = is_key ? 'k' : 's';
            if (!is_key && ((klen == 4 && memcmp(key, "role", 4) == 0) ||
                            (klen == 4 && memcmp(key, "type", 4) == 0)))
                kind = 'w';
            t[nt++] = (scan_tok_t){i + 1, j - i - 1, kind};
            if (is_key) {
                key = b + i + 1;
                klen = j - i - 1;
            }
            prev = '"';
            i = j;
            continue;
        }
        if ((ch == '-' || (ch >= '0' && ch <= '9')) &&
            (prev == ':' || prev == ',' || prev == '[')) {
            size_t j = i + (ch == '-');
            while (j < n && b[j] >= '0' && b[j] <= '9')
                j++;
            if (j < n && b[j] != '.' && b[j] != 'e' && b[j] != 'E' && j > i + (ch == '-'))
                t[nt++] = (scan_tok_t){i, j - i, 'i'};
            prev = '0';
            i = j - 1;
            continue;
        }
        if (ch != ' ' && ch != '\n' && ch != '\t' && ch != '\r')
            prev = ch;
    }
    return nt;
}

/* body with every token of kind kind (all: each; else the first only)
 * replaced by what mut makes of it, into out (malloc'd). */
typedef size_t (*scan_mut_fn)(const char *p, size_t n, char *o);

static inline char *scan_mutate(const char *b, size_t n, const scan_tok_t *t, size_t nt, char kind,
                                bool all, scan_mut_fn mut, size_t *outlen, bool *changed)
{
    char *o = malloc(n * 3 + 64 * (nt + 1));
    if (!o)
        return NULL;
    size_t at = 0, w = 0;
    *changed = false;
    for (size_t i = 0; i < nt; i++) {
        if (t[i].kind != kind || (*changed && !all))
            continue;
        memcpy(o + w, b + at, t[i].off - at);
        w += t[i].off - at;
        w += mut(b + t[i].off, t[i].len, o + w);
        at = t[i].off + t[i].len;
        *changed = true;
    }
    memcpy(o + w, b + at, n - at);
    *outlen = w + n - at;
    return o;
}

static inline size_t scan_mut_longer(const char *p, size_t n, char *o)
{
    memcpy(o, p, n);
    memcpy(o + n, "x y", 3);
    return n + 3;
}
static inline size_t scan_mut_shorter(const char *p, size_t n, char *o)
{
    memcpy(o, p, n / 2);
    return n / 2;
}
static inline size_t scan_mut_utf8(const char *p, size_t n, char *o)
{
    memcpy(o, "\xc3\xa9", 2);
    memcpy(o + 2, p, n);
    return n + 2;
}
static inline size_t scan_mut_badutf8(const char *p, size_t n, char *o)
{
    memcpy(o, p, n);
    o[n] = (char)0xff;
    return n + 1;
}
static inline size_t scan_mut_escape(const char *p, size_t n, char *o)
{
    memcpy(o, p, n);
    memcpy(o + n, "\\n", 2);
    return n + 2;
}
/* p with the escape e (NUL-terminated) after its first half: spans that
 * move inside a hole, an escape between two plain runs. */
static inline size_t scan_mut_esc_in(const char *p, size_t n, char *o, const char *e)
{
    size_t h = 0, el = strlen(e);
    while (h < n / 2) /* not inside an escape of the body's */
        h += p[h] != '\\' ? 1 : h + 1 < n && p[h + 1] == 'u' ? 6 : 2;
    if (h > n)
        h = n;
    memcpy(o, p, h);
    memcpy(o + h, e, el);
    memcpy(o + h + el, p + h, n - h);
    return n + el;
}
static inline size_t scan_mut_esc_quote(const char *p, size_t n, char *o)
{
    return scan_mut_esc_in(p, n, o, "\\\"");
}
static inline size_t scan_mut_esc_u(const char *p, size_t n, char *o)
{
    return scan_mut_esc_in(p, n, o, "caf\\u00e9\\n");
}
static inline size_t scan_mut_esc_pair(const char *p, size_t n, char *o)
{
    return scan_mut_esc_in(p, n, o, "\\ud83d\\ude00\\\\\\/");
}
static inline size_t scan_mut_esc_only(const char *p, size_t n, char *o)
{
    (void)p;
    (void)n;
    memcpy(o, "\\t", 2);
    return 2;
}
static inline size_t scan_mut_plain(const char *p, size_t n, char *o)
{
    (void)p;
    (void)n;
    memcpy(o, "plain", 5);
    return 5;
}
static inline size_t scan_mut_lone_hi(const char *p, size_t n, char *o)
{
    return scan_mut_esc_in(p, n, o, "\\ud83d");
}
static inline size_t scan_mut_lone_lo(const char *p, size_t n, char *o)
{
    return scan_mut_esc_in(p, n, o, "\\ude00");
}
static inline size_t scan_mut_reversed(const char *p, size_t n, char *o)
{
    return scan_mut_esc_in(p, n, o, "\\ude00\\ud83d");
}
static inline size_t scan_mut_unpaired(const char *p, size_t n, char *o)
{
    return scan_mut_esc_in(p, n, o, "\\ud83d\\u0041");
}
static inline size_t scan_mut_bad_esc(const char *p, size_t n, char *o)
{
    return scan_mut_esc_in(p, n, o, "\\x41");
}
static inline size_t scan_mut_short_u(const char *p, size_t n, char *o)
{
    return scan_mut_esc_in(p, n, o, "\\u00G9");
}
static inline size_t scan_mut_nul(const char *p, size_t n, char *o)
{
    return scan_mut_esc_in(p, n, o, "\\u0000");
}
static inline size_t scan_mut_ctl(const char *p, size_t n, char *o)
{
    memcpy(o, p, n);
    o[n] = '\t';
    return n + 1;
}
static inline size_t scan_mut_letter(const char *p, size_t n, char *o)
{
    memcpy(o, p, n);
    if (n)
        o[n - 1] = o[n - 1] == 'q' ? 'r' : 'q';
    return n ? n : 0;
}
static inline size_t scan_mut_int_big(const char *p, size_t n, char *o)
{
    (void)p;
    (void)n;
    memcpy(o, "-123456789012345678", 19);
    return 19;
}
static inline size_t scan_mut_int_small(const char *p, size_t n, char *o)
{
    (void)p;
    (void)n;
    o[0] = '7';
    return 1;
}
static inline size_t scan_mut_int_19(const char *p, size_t n, char *o)
{
    (void)p;
    (void)n;
    memcpy(o, "1234567890123456789", 19);
    return 19;
}
static inline size_t scan_mut_real(const char *p, size_t n, char *o)
{
    memcpy(o, p, n);
    memcpy(o + n, ".5", 2);
    return n + 2;
}

/* body scanned with shapes (flags) and without; NULL when they agree. */
static inline const char *scan_same_shape1(const char *body, size_t len, unsigned flags)
{
    const char *why = NULL;
    gw_body_scan_t *a = gw_body_scan_new(), *b = gw_body_scan_new();
    if (!a || !b)
        goto done;
    gw_scan_rc_t ra = gw_body_scan(a, body, len, flags | GW_SCAN_NO_SHAPE);
    gw_scan_rc_t rb = gw_body_scan(b, body, len, flags | GW_SCAN_SHAPE_TEST);
    if (ra == GW_SCAN_OOM || rb == GW_SCAN_OOM)
        goto done;
    if (ra != rb)
        why = "rc (shape)";
    else if (ra == GW_SCAN_OK && a->elided != b->elided)
        why = "elided (shape)";
    else if (ra == GW_SCAN_OK)
        why = scan_same_cmp(a, b);
done:
    gw_body_scan_free(a);
    gw_body_scan_free(b);
    return why;
}

/* The whole shape test on body, with flags 0 and GW_SCAN_MSGS. */
static inline const char *scan_same_shape(const char *body, size_t len)
{
    static const struct {
        char kind;
        bool all;
        scan_mut_fn mut;
    } muts[] = {
        {'s', true, scan_mut_longer},
        {'s', true, scan_mut_shorter},
        {'i', true, scan_mut_int_big},
        {'i', true, scan_mut_int_small},
        {'s', false, scan_mut_utf8},
        {'s', false, scan_mut_badutf8},
        {'s', false, scan_mut_escape},
        {'s', false, scan_mut_ctl},
        {'i', false, scan_mut_int_19},
        {'i', false, scan_mut_real},
        {'k', false, scan_mut_letter},
        {'w', false, scan_mut_letter},
        {'s', false, scan_mut_letter},
        /* escapes in every string value: the same shape, decoded on a hit */
        {'s', true, scan_mut_esc_quote},
        {'s', true, scan_mut_esc_u},
        {'s', true, scan_mut_esc_pair},
        {'s', true, scan_mut_esc_only},
        {'s', true, scan_mut_plain},
        /* escapes jansson refuses or reads otherwise than yajl: a miss */
        {'s', false, scan_mut_lone_hi},
        {'s', false, scan_mut_lone_lo},
        {'s', false, scan_mut_reversed},
        {'s', false, scan_mut_unpaired},
        {'s', false, scan_mut_bad_esc},
        {'s', false, scan_mut_short_u},
        {'s', false, scan_mut_nul},
        {'w', false, scan_mut_esc_u},
        {'k', false, scan_mut_esc_u},
    };
    scan_tok_t *t = malloc(SCAN_TOKS_MAX * sizeof(*t));
    if (!t)
        return NULL;
    size_t nt = scan_toks(body, len, t);
    const char *why = NULL;
    for (unsigned f = 0; f < 2 && !why; f++) {
        unsigned flags = f ? GW_SCAN_MSGS : 0;
        /* twice: the first may keep the shape, the second hits it */
        why = scan_same_shape1(body, len, flags);
        if (!why)
            why = scan_same_shape1(body, len, flags);
        for (size_t m = 0; m < sizeof(muts) / sizeof(muts[0]) && !why; m++) {
            size_t n2;
            bool changed;
            char *b2 = scan_mutate(body, len, t, nt, muts[m].kind, muts[m].all, muts[m].mut, &n2,
                                   &changed);
            if (!b2)
                break;
            if (changed)
                why = scan_same_shape1(b2, n2, flags);
            free(b2);
        }
    }
    free(t);
    return why;
}

#endif
