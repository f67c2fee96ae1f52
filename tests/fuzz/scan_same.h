/*
 * scan_same.h — the body scanner's two ways to the same answer, compared:
 * yajl over the whole body (GW_SCAN_NO_SKEL) and yajl over a skeleton with
 * string interiors cut out (GW_SCAN_SKEL_TEST: cuts from 3-byte runs, so a
 * small body has many). Everything a caller can read must be equal: the
 * result, every fact's kind, offsets and value, the messages and parts, and
 * the bytes of a spliced body. (Also with the real thresholds: flags.) Shared by
 * tests/unit/test_gw_body_scan.c and the fuzz_body_scan target.
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
    return a->off == b->off && a->end == b->end && a->i == b->i &&
           (a->kind != SL_J_STRING || scan_same_text(a->s, b->s)) &&
           (a->kind != SL_J_OBJECT || (a->close == b->close && a->members == b->members));
}

static inline int scan_same_spliced(gw_body_scan_t *a, gw_body_scan_t *b)
{
    gw_body_scan_t *s[2] = {a, b};
    char *out[2] = {NULL, NULL};
    size_t n[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        if (gw_body_set(s[i], "model", &s[i]->model, "\"m-x\"", 5) != 0 ||
            gw_body_set(s[i], "max_tokens", &s[i]->max_tokens, "7", 1) != 0 ||
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

/* Scans body both ways, GW_SCAN_MSGS and flags (with GW_SCAN_SKEL_TEST or
 * not: the test thresholds or the real ones) against GW_SCAN_NO_SKEL; NULL
 * when they agree, else what differs. *cut (may be NULL): bytes the
 * skeleton's parse did not read (0: it took no cut). */
static inline const char *scan_same(const char *body, size_t len, unsigned flags, size_t *cut)
{
    const char *why = NULL;
    gw_body_scan_t *a = gw_body_scan_new(), *b = gw_body_scan_new();
    if (!a || !b)
        goto done;
    flags |= GW_SCAN_MSGS;
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
    else if (!scan_same_fact(&a->top, &b->top))
        why = "top";
    else if (!scan_same_fact(&a->model, &b->model))
        why = "model";
    else if (!scan_same_fact(&a->stream, &b->stream))
        why = "stream";
    else if (!scan_same_fact(&a->stream_options, &b->stream_options))
        why = "stream_options";
    else if (!scan_same_fact(&a->include_usage, &b->include_usage))
        why = "include_usage";
    else if (!scan_same_fact(&a->max_tokens, &b->max_tokens))
        why = "max_tokens";
    else if (!scan_same_fact(&a->max_completion_tokens, &b->max_completion_tokens))
        why = "max_completion_tokens";
    else if (!scan_same_fact(&a->max_output_tokens, &b->max_output_tokens))
        why = "max_output_tokens";
    else if (!scan_same_fact(&a->n, &b->n))
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
done:
    gw_body_scan_free(a);
    gw_body_scan_free(b);
    return why;
}

#endif
