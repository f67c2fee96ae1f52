/*
 * fuzz_body_scan.c — the body scanner (gateway/body_scan.c) against
 * jansson (gateway/json_intake.c) on the same bytes: whatever the scanner
 * accepts, jansson accepts as an object, with the same facts (types,
 * integers, decoded strings, messages and parts); and the splices (model,
 * max_tokens, stream_options) give a body jansson reads as the original
 * tree with exactly those members changed; and the policy modules'
 * plain-data entry points (the max_tokens clamp, the prompt estimate, the
 * filters' request check) answer as their jansson versions do. GW_SCAN_SLOW
 * is always allowed: jansson then decides, as it did before the scanner.
 * And the skeleton (yajl reading the body with string interiors cut out)
 * gives exactly what yajl over the whole body gives, and a body answered
 * from a kept shape what the parse gives, also for bodies made from it by
 * changing values (scan_same.h).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "filters/filters.h"
#include "gateway/body_scan.h"
#include "gateway/json_intake.h"
#include "ratelimit/ratelimit.h"
#include "tests/fuzz/scan_same.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static sl_jkind_t kind_of(const json_t *v)
{
    switch (v ? json_typeof(v) : (json_type)-1) {
    case JSON_NULL:
        return SL_J_NULL;
    case JSON_TRUE:
        return SL_J_TRUE;
    case JSON_FALSE:
        return SL_J_FALSE;
    case JSON_INTEGER:
        return SL_J_INT;
    case JSON_REAL:
        return SL_J_REAL;
    case JSON_STRING:
        return SL_J_STRING;
    case JSON_ARRAY:
        return SL_J_ARRAY;
    case JSON_OBJECT:
        return SL_J_OBJECT;
    default:
        return SL_J_ABSENT;
    }
}

/* In sl_chat_t a number is INT or REAL by its token (body_scan.h); jansson
 * re-reads a body holding an integer beyond int64 with reals, so there the
 * two may differ. No policy tells them apart: compare "a number". */
static sl_jkind_t chat_kind(sl_jkind_t k)
{
    return k == SL_J_REAL ? SL_J_INT : k;
}

static void same_text(const json_t *v, sl_text_t t)
{
    if (!json_is_string(v))
        return;
    if (t.len != json_string_length(v) || memcmp(t.p, json_string_value(v), t.len) != 0)
        abort();
}

static void same_fact(const json_t *v, const gw_jfact_t *f, size_t size)
{
    if (kind_of(v) != f->kind)
        abort();
    if (json_is_integer(v) && json_integer_value(v) != f->i)
        abort();
    if (json_is_string(v))
        same_text(v, f->s);
    if (f->kind != SL_J_ABSENT && (f->end <= f->off || f->end > size))
        abort();
}

static void same_chat(const json_t *j, const sl_chat_t *c)
{
    const json_t *msgs = json_object_get(j, "messages");
    if (chat_kind(kind_of(msgs)) != chat_kind(c->messages_kind) ||
        chat_kind(kind_of(json_object_get(j, "tools"))) != chat_kind(c->tools_kind))
        abort();
    if (!json_is_array(msgs)) {
        if (c->nmsgs)
            abort();
        return;
    }
    if (json_array_size(msgs) != c->nmsgs)
        abort();
    for (size_t i = 0; i < c->nmsgs; i++) {
        const json_t *m = json_array_get(msgs, i);
        const sl_chat_msg_t *cm = &c->msgs[i];
        const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        const json_t *name = json_object_get(m, "name");
        if (chat_kind(kind_of(m)) != chat_kind(cm->kind) ||
            chat_kind(kind_of(role)) != chat_kind(cm->role_kind) ||
            chat_kind(kind_of(content)) != chat_kind(cm->content_kind) ||
            chat_kind(kind_of(name)) != chat_kind(cm->name_kind) ||
            chat_kind(kind_of(json_object_get(m, "tool_calls"))) != chat_kind(cm->tool_calls_kind))
            abort();
        same_text(role, cm->role);
        same_text(content, cm->content);
        same_text(name, cm->name);
        size_t np = json_is_array(content) ? json_array_size(content) : 0;
        if (np != cm->nparts)
            abort();
        for (size_t k = 0; k < np; k++) {
            const json_t *p = json_array_get(content, k);
            const sl_chat_part_t *cp = &c->parts[cm->part0 + k];
            const json_t *type = json_object_get(p, "type"), *text = json_object_get(p, "text");
            if (chat_kind(kind_of(p)) != chat_kind(cp->kind) ||
                chat_kind(kind_of(type)) != chat_kind(cp->type_kind) ||
                chat_kind(kind_of(text)) != chat_kind(cp->text_kind) ||
                (json_object_get(p, "image_url") != NULL) != cp->image_url)
                abort();
            same_text(type, cp->type);
            same_text(text, cp->text);
        }
    }
}

/* The edited body: the original tree with model "m-x", max_tokens 7 and
 * stream_options.include_usage true, and nothing else changed. */
static void check_splices(gw_body_scan_t *s, const json_t *orig)
{
    if (gw_body_set(s, "model", gw_body_fact(s, GW_F_MODEL), "\"m-x\"", 5) != 0 ||
        gw_body_set(s, "max_tokens", gw_body_fact(s, GW_F_MAX_TOKENS), "9", 1) != 0 ||
        gw_body_set(s, "max_tokens", gw_body_fact(s, GW_F_MAX_TOKENS), "7", 1) != 0 ||
        gw_body_set_include_usage(s) != 0 || gw_body_set_include_usage(s) != 0)
        return; /* out of memory */
    char *out;
    size_t n;
    if (gw_body_splice_apply(s, &out, &n) != 0)
        return;
    bool inexact;
    char msg[256];
    json_t *e = gw_json_intake(out, n, &inexact, msg, sizeof(msg));
    free(out);
    if (!json_is_object(e))
        abort();
    json_t *want = json_deep_copy(orig);
    if (!want) {
        json_decref(e);
        return;
    }
    json_object_set_new(want, "model", json_string("m-x"));
    json_object_set_new(want, "max_tokens", json_integer(7));
    json_t *so = json_object_get(want, "stream_options");
    if (!json_is_object(so)) {
        so = json_object();
        json_object_set_new(want, "stream_options", so);
    }
    json_object_set_new(so, "include_usage", json_true());
    if (!json_equal(want, e))
        abort();
    json_decref(want);
    json_decref(e);
}

/* rl_clamp_plan and rl_chat_prompt_tokens against their tree versions. */
static void check_ratelimit(const gw_body_scan_t *s, const json_t *orig)
{
    for (int want = 0; want < 2; want++) {
        json_t *j = json_deep_copy(orig);
        if (!j)
            return;
        rl_clamp_t a, c;
        rl_clamp_edits_t ed;
        char ea[160] = "", ec[160] = "";
        int ra = rl_body_clamp_ex(j, 300, want, &a, ea, sizeof(ea));
        rl_clamp_in_t in;
        gw_body_scan_clamp_in(s, &in);
        int rc = rl_clamp_plan(&in, 300, want, &c, &ed, ec, sizeof(ec));
        if (ra != rc || strcmp(ea, ec) != 0 || (ra == 0 && memcmp(&a, &c, sizeof(a)) != 0))
            abort();
        json_decref(j);
    }
    bool tools = s->chat.tools_kind == SL_J_ARRAY || s->chat.tools_kind == SL_J_OBJECT;
    for (size_t i = 0; i < s->chat.nmsgs; i++)
        tools = tools || s->chat.msgs[i].tool_calls_kind == SL_J_ARRAY ||
                s->chat.msgs[i].tool_calls_kind == SL_J_OBJECT;
    if (!tools && rl_chat_prompt_tokens(&s->chat) != rl_body_prompt_tokens(orig))
        abort();
    /* tools and tool calls too, from their spans (big integers: the tree) */
    int64_t est;
    int rc = rl_chat_prompt_tokens_json(&s->chat, &est);
    if (rc != 0 ? !s->bigint && s->has_msgs : est != rl_body_prompt_tokens(orig))
        abort();
    /* again: the tools' count the thread kept (when it kept it), the same */
    int64_t est2 = -1;
    if (rl_chat_prompt_tokens_json(&s->chat, &est2) != rc || (rc == 0 && est2 != est))
        abort();
    /* the body as a Responses request, from the facts */
    rl_resp_in_t in = {.instructions_kind = gw_body_fact(s, GW_F_INSTRUCTIONS)->kind,
                       .input_kind = gw_body_fact(s, GW_F_INPUT)->kind,
                       .tools_kind = gw_body_fact(s, GW_F_TOOLS)->kind,
                       .bigint = s->bigint};
    if (gw_body_fact(s, GW_F_INSTRUCTIONS)->kind == SL_J_STRING)
        in.instructions = gw_body_fact(s, GW_F_INSTRUCTIONS)->s;
    if (gw_body_fact(s, GW_F_INPUT)->kind == SL_J_STRING)
        in.input = gw_body_fact(s, GW_F_INPUT)->s;
    else if (gw_body_fact(s, GW_F_INPUT)->kind == SL_J_ARRAY)
        in.input_json =
            (sl_text_t){s->body + gw_body_fact(s, GW_F_INPUT)->off,
                        gw_body_fact(s, GW_F_INPUT)->end - gw_body_fact(s, GW_F_INPUT)->off};
    if (gw_body_fact(s, GW_F_TOOLS)->kind != SL_J_ABSENT)
        in.tools_json =
            (sl_text_t){s->body + gw_body_fact(s, GW_F_TOOLS)->off,
                        gw_body_fact(s, GW_F_TOOLS)->end - gw_body_fact(s, GW_F_TOOLS)->off};
    rc = rl_responses_prompt_tokens_in(&in, &est);
    if (rc != 0 ? !s->bigint : est != rl_responses_prompt_tokens(orig))
        abort();
    est2 = -1;
    if (rl_responses_prompt_tokens_in(&in, &est2) != rc || (rc == 0 && est2 != est))
        abort();
}

/* A ruleset without word files: a regex that masks, one that blocks, and
 * max_chars 40 (reject). */
static flt_ruleset_t *fuzz_rules(void)
{
    static flt_ruleset_t *rs;
    static bool tried;
    if (!tried) {
        tried = true;
        flt_conf_t c;
        flt_conf_defaults(&c);
        static const flt_conf_regex_t re[] = {{"mask", "[0-9]{4}", FLT_ACTION_MASK},
                                              {"block", "(?i)forbid", FLT_ACTION_BLOCK},
                                              {"log", "xx", FLT_ACTION_LOG}};
        c.regex = re;
        c.nregex = 3;
        c.input.max_chars = 40;
        c.input.keep_turns = 3;
        char err[256];
        rs = flt_ruleset_build(&c, err, sizeof(err));
    }
    return rs;
}

static void check_filters(const gw_body_scan_t *s, const json_t *orig)
{
    flt_ruleset_t *rs = fuzz_rules();
    if (!rs)
        return;
    json_t *j = json_deep_copy(orig);
    if (!j)
        return;
    flt_req_result_t rc, rt;
    flt_req_verdict_t vc = flt_request_check_chat(rs, &s->chat, &rc);
    flt_req_verdict_t vt = flt_request_check(rs, j, &rt);
    json_decref(j);
    if (vt == FLT_REQ_ERROR || vc == FLT_REQ_ERROR)
        return; /* out of memory */
    if (vc == FLT_REQ_EDIT) {
        if (vt != FLT_REQ_OK || !rt.modified)
            abort(); /* EDIT only when the tree's check edits */
        return;
    }
    if (vc != vt || rt.modified || rc.status != rt.status || rc.code != rt.code ||
        strcmp(rc.message, rt.message) != 0 || rc.logged != rt.logged ||
        strcmp(rc.param ? rc.param : "", rt.param ? rt.param : "") != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The gateway scans a NUL-terminated copy (evbuffer_pullup); so here. */
    char *body = malloc(size + 1);
    if (!body)
        return 0;
    memcpy(body, data, size);
    body[size] = '\0';
    gw_body_scan_t *s = gw_body_scan_new();
    if (!s) {
        free(body);
        return 0;
    }
    gw_scan_rc_t rc = gw_body_scan(s, body, size, GW_SCAN_MSGS);
    bool inexact = false;
    char msg[256];
    json_t *j = gw_json_intake(body, size, &inexact, msg, sizeof(msg));
    if (rc == GW_SCAN_OK) {
        if (!json_is_object(j))
            abort(); /* the scanner accepted what jansson refuses */
        if (inexact != s->bigint)
            abort();
        same_fact(json_object_get(j, "model"), gw_body_fact(s, GW_F_MODEL), size);
        same_fact(json_object_get(j, "stream"), gw_body_fact(s, GW_F_STREAM), size);
        same_fact(json_object_get(j, "stream_options"), gw_body_fact(s, GW_F_STREAM_OPTIONS), size);
        const json_t *so = json_object_get(j, "stream_options");
        if (json_is_object(so))
            same_fact(json_object_get(so, "include_usage"), gw_body_fact(s, GW_F_INCLUDE_USAGE),
                      size);
        same_fact(json_object_get(j, "max_tokens"), gw_body_fact(s, GW_F_MAX_TOKENS), size);
        same_fact(json_object_get(j, "max_completion_tokens"),
                  gw_body_fact(s, GW_F_MAX_COMPLETION_TOKENS), size);
        same_fact(json_object_get(j, "max_output_tokens"), gw_body_fact(s, GW_F_MAX_OUTPUT_TOKENS),
                  size);
        same_fact(json_object_get(j, "n"), gw_body_fact(s, GW_F_N), size);
        same_fact(json_object_get(j, "input"), gw_body_fact(s, GW_F_INPUT), size);
        same_fact(json_object_get(j, "instructions"), gw_body_fact(s, GW_F_INSTRUCTIONS), size);
        same_fact(json_object_get(j, "tools"), gw_body_fact(s, GW_F_TOOLS), size);
        if (gw_body_fact(s, GW_F_TOP)->members != json_object_size(j))
            abort();
        same_chat(j, &s->chat);
        check_ratelimit(s, j);
        check_filters(s, j);
        if (!inexact)
            check_splices(s, j);
    }
    json_decref(j);
    gw_body_scan_free(s);
    const char *why = scan_same(body, size, GW_SCAN_SKEL_TEST, NULL);
    if (!why)
        why = scan_same(body, size, 0, NULL);
    if (why) {
        fprintf(stderr, "skeleton and whole body differ: %s\n", why);
        abort();
    }
    why = scan_same_shape(body, size);
    if (why) {
        fprintf(stderr, "a kept shape and the parse differ: %s\n", why);
        abort();
    }
    free(body);
    return 0;
}
