/*
 * request.c — the prompt side (shape, keep_turns, max_chars, rules, system
 * prompt) over the parsed request body, and the same rules over a whole
 * non-streamed answer. Both edit the jansson tree in place; the caller
 * serialises it again when told it changed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "filters/flt_internal.h"

/* The roles a message may have, with their lengths (chat_shape's compare
 * of a scanned role). */
#define FLT_ROLE(lit)                                                                              \
    {                                                                                              \
        lit, sizeof(lit) - 1                                                                       \
    }
static const struct {
    const char *name;
    size_t len;
} flt_roles[] = {FLT_ROLE("system"),    FLT_ROLE("developer"), FLT_ROLE("user"),
                 FLT_ROLE("assistant"), FLT_ROLE("tool"),      FLT_ROLE("function")};

static flt_req_verdict_t reject(flt_req_result_t *res, const char *code, const char *param,
                                const char *fmt, ...) SL_PRINTF(4, 5) SL_COLD;

#include <stdarg.h>
#include <stddef.h>
static flt_req_verdict_t reject(flt_req_result_t *res, const char *code, const char *param,
                                const char *fmt, ...)
{
    res->status = 400;
    res->code = code;
    snprintf(res->param_buf, sizeof res->param_buf, "%s", param);
    res->param = res->param_buf;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->message, sizeof res->message, fmt, ap);
    va_end(ap);
    return FLT_REQ_REJECT;
}

/* res as "nothing to say": its fields zeroed and its two text buffers
 * empty strings, not cleared whole (264 bytes, ~35 instructions a request):
 * reject() writes them whole before anything reads past their first byte. */
_Static_assert(offsetof(flt_req_result_t, param_buf) ==
                       offsetof(flt_req_result_t, message) +
                           sizeof(((flt_req_result_t *)0)->message) &&
                   offsetof(flt_req_result_t, modified) ==
                       offsetof(flt_req_result_t, param_buf) +
                           sizeof(((flt_req_result_t *)0)->param_buf),
               "result_clear: the two text buffers lie between the fields it zeroes");
static void result_clear(flt_req_result_t *res)
{
    memset(res, 0, offsetof(flt_req_result_t, message));
    res->message[0] = '\0';
    res->param_buf[0] = '\0';
    memset(&res->modified, 0, sizeof(*res) - offsetof(flt_req_result_t, modified));
}

/* What the channel said of message i's content once fed and finished: a
 * block is a rejection naming its rule, a failure an error; FLT_REQ_OK
 * otherwise (masks are the caller's). */
static flt_req_verdict_t chan_verdict(const flt_ruleset_t *rs, const flt_chan_t *ch,
                                      flt_chan_rc_t rc, size_t i, flt_req_result_t *res)
{
    res->logged += ch->nlog;
    if (rc == FLT_CHAN_BLOCK) {
        char p[64];
        snprintf(p, sizeof p, "messages[%zu].content", i);
        res->rule = ch->block_rule >= 0 ? rs->rules[ch->block_rule].name : NULL;
        return reject(res, FLT_CODE_CONTENT_FILTER, p,
                      "the prompt was rejected by the content filter");
    }
    return rc == FLT_CHAN_OK ? FLT_REQ_OK : FLT_REQ_ERROR;
}

static const char *role_of(json_t *m)
{
    return json_string_value(json_object_get(m, "role"));
}

static bool is_system(const char *role)
{
    return role && (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0);
}

static flt_req_verdict_t check_shape(json_t *body, flt_req_result_t *res)
{
    if (!json_is_object(body))
        return reject(res, FLT_CODE_INVALID_BODY, "body", "the request body must be a JSON object");
    json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs))
        return reject(res, FLT_CODE_INVALID_MESSAGES, "messages", "'messages' must be an array");
    if (json_array_size(msgs) == 0)
        return reject(res, FLT_CODE_INVALID_MESSAGES, "messages", "'messages' must not be empty");
    size_t i;
    json_t *m;
    char p[64];
    json_array_foreach(msgs, i, m)
    {
        snprintf(p, sizeof p, "messages[%zu]", i);
        if (!json_is_object(m))
            return reject(res, FLT_CODE_INVALID_MESSAGE, p, "%s must be an object", p);
        const char *role = role_of(m);
        bool known = false;
        for (size_t r = 0; role && r < SL_ARRAY_LEN(flt_roles); r++)
            known = known || strcmp(role, flt_roles[r].name) == 0;
        snprintf(p, sizeof p, "messages[%zu].role", i);
        if (!known)
            return reject(res, FLT_CODE_INVALID_MESSAGE, p,
                          "%s must be one of system, developer, "
                          "user, assistant, tool, function",
                          p);
        json_t *c = json_object_get(m, "content");
        snprintf(p, sizeof p, "messages[%zu].content", i);
        if (!c || json_is_null(c)) {
            /* an assistant turn that only calls tools has no content */
            if (strcmp(role, "assistant") != 0)
                return reject(res, FLT_CODE_INVALID_MESSAGE, p, "%s is required", p);
            continue;
        }
        if (json_is_string(c))
            continue;
        if (!json_is_array(c))
            return reject(res, FLT_CODE_INVALID_MESSAGE, p,
                          "%s must be a string or an array of parts", p);
        size_t j;
        json_t *part;
        json_array_foreach(c, j, part)
        {
            snprintf(p, sizeof p, "messages[%zu].content[%zu]", i, j);
            const char *type = json_string_value(json_object_get(part, "type"));
            if (!json_is_object(part) || !type)
                return reject(res, FLT_CODE_INVALID_MESSAGE, p, "%s must be an object with a type",
                              p);
            if (strcmp(type, "text") == 0 && !json_is_string(json_object_get(part, "text")))
                return reject(res, FLT_CODE_INVALID_MESSAGE, p, "%s: text must be a string", p);
        }
    }
    return FLT_REQ_OK;
}

/* Keeps the last keep_turns user turns (a turn is a user message and what
 * follows it), and every system/developer message. */
static void keep_turns(json_t *msgs, size_t keep, flt_req_result_t *res)
{
    size_t nuser = 0, i;
    json_t *m;
    json_array_foreach(msgs, i, m) nuser += role_of(m) && strcmp(role_of(m), "user") == 0;
    if (keep == 0 || nuser <= keep)
        return;
    size_t skip = nuser - keep, seen = 0, first = 0;
    json_array_foreach(msgs, i, m)
    {
        if (strcmp(role_of(m), "user") == 0 && seen++ == skip) {
            first = i;
            break;
        }
    }
    for (size_t k = first; k-- > 0;) {
        if (!is_system(role_of(json_array_get(msgs, k)))) {
            json_array_remove(msgs, k);
            res->dropped++;
        }
    }
    res->modified = res->modified || res->dropped > 0;
}

static size_t content_chars(json_t *c)
{
    if (json_is_string(c))
        return flt_utf8_count(json_string_value(c), json_string_length(c));
    size_t n = 0, j;
    json_t *part;
    json_array_foreach(c, j, part)
    {
        json_t *t = json_object_get(part, "text");
        if (json_is_string(t) &&
            strcmp(json_string_value(json_object_get(part, "type")), "text") == 0)
            n += flt_utf8_count(json_string_value(t), json_string_length(t));
    }
    return n;
}

/* Cuts a text json string to its first `left` code points; returns what is left. */
static size_t truncate_text(json_t *s, size_t left)
{
    const char *v = json_string_value(s);
    size_t n = json_string_length(s);
    size_t cut = flt_utf8_prefix(v, n, left);
    size_t used = flt_utf8_count(v, cut);
    if (cut < n)
        json_string_setn(s, v, cut); /* jansson copies before freeing the old value */
    return left - used;
}

static void truncate_content(json_t *c, size_t max)
{
    if (json_is_string(c)) {
        truncate_text(c, max);
        return;
    }
    size_t j, left = max;
    json_t *part;
    json_array_foreach(c, j, part)
    {
        json_t *t = json_object_get(part, "text");
        if (json_is_string(t) &&
            strcmp(json_string_value(json_object_get(part, "type")), "text") == 0)
            left = truncate_text(t, left);
    }
}

/* Word and regex rules over one message's text; text parts are one text. */
static flt_req_verdict_t check_rules(const flt_ruleset_t *rs, json_t *m, size_t i,
                                     flt_req_result_t *res)
{
    json_t *c = json_object_get(m, "content");
    json_t *one[1];
    json_t **texts = one;
    size_t ntexts = 0;
    if (json_is_string(c)) {
        one[0] = c;
        ntexts = 1;
    } else if (json_is_array(c) && json_array_size(c) > 0) {
        texts = malloc(json_array_size(c) * sizeof *texts);
        if (!texts)
            return FLT_REQ_ERROR;
        size_t j;
        json_t *part;
        json_array_foreach(c, j, part)
        {
            json_t *t = json_object_get(part, "text");
            if (json_is_string(t) &&
                strcmp(json_string_value(json_object_get(part, "type")), "text") == 0)
                texts[ntexts++] = t;
        }
    }
    flt_req_verdict_t v = FLT_REQ_OK;
    flt_chan_t ch;
    sl_buf_t *outs = ntexts ? calloc(ntexts, sizeof *outs) : NULL;
    if (ntexts && (!outs || flt_chan_init(&ch, rs) != 0)) {
        free(outs);
        if (texts != one)
            free(texts);
        return FLT_REQ_ERROR;
    }
    if (!ntexts)
        goto done;
    ch.unbounded = true;
    flt_chan_rc_t rc = FLT_CHAN_OK;
    for (size_t k = 0; k < ntexts && rc == FLT_CHAN_OK; k++)
        rc =
            flt_chan_feed(&ch, json_string_value(texts[k]), json_string_length(texts[k]), &outs[k]);
    if (rc == FLT_CHAN_OK)
        rc = flt_chan_finish(&ch, &outs[ntexts - 1]);
    v = chan_verdict(rs, &ch, rc, i, res);
    if (v == FLT_REQ_OK && ch.nmask) {
        res->masked += ch.nmask;
        res->modified = true;
        for (size_t k = 0; k < ntexts; k++)
            if (json_string_setn(texts[k], outs[k].p ? outs[k].p : "", outs[k].len) != 0)
                v = FLT_REQ_ERROR;
    }
    flt_chan_fini(&ch);
done:
    for (size_t k = 0; k < ntexts; k++)
        sl_buf_free(&outs[k]);
    free(outs);
    if (texts != one)
        free(texts);
    return v;
}

flt_req_verdict_t flt_request_check(const flt_ruleset_t *rs, json_t *body, flt_req_result_t *res)
{
    result_clear(res);
    flt_req_verdict_t v = check_shape(body, res);
    if (v != FLT_REQ_OK || !rs)
        return v;
    json_t *msgs = json_object_get(body, "messages");
    keep_turns(msgs, (size_t)rs->input.keep_turns, res);

    size_t i;
    json_t *m;
    size_t max = (size_t)rs->input.max_chars;
    json_array_foreach(msgs, i, m)
    {
        if (!max || strcmp(role_of(m), "user") != 0)
            continue;
        json_t *c = json_object_get(m, "content");
        size_t n = content_chars(c);
        if (n <= max)
            continue;
        if (rs->input.on_overflow == FLT_OVERFLOW_REJECT) {
            char p[64];
            snprintf(p, sizeof p, "messages[%zu].content", i);
            return reject(res, FLT_CODE_PROMPT_TOO_LONG, p,
                          "%s has %zu characters; the limit is %zu", p, n, max);
        }
        truncate_content(c, max);
        res->truncated++;
        res->modified = true;
    }

    if (rs->nrules) {
        json_array_foreach(msgs, i, m)
        {
            v = check_rules(rs, m, i, res);
            if (v != FLT_REQ_OK)
                return v;
        }
    }

    if (rs->system_prompt) {
        if (rs->input.system_prompt_mode == FLT_SYSPROMPT_REPLACE) {
            for (size_t k = json_array_size(msgs); k-- > 0;)
                if (is_system(role_of(json_array_get(msgs, k))))
                    json_array_remove(msgs, k);
        }
        json_t *sys = json_pack("{s:s, s:s}", "role", "system", "content", rs->system_prompt);
        if (!sys || json_array_insert_new(msgs, 0, sys) != 0)
            return FLT_REQ_ERROR;
        res->modified = true;
    }
    return FLT_REQ_OK;
}

/* ---- the same over scanned messages (no tree, no edits) ------------------------ */

static bool chat_is_system(const sl_chat_msg_t *m)
{
    return m->role_kind == SL_J_STRING &&
           (sl_text_is(m->role, "system") || sl_text_is(m->role, "developer"));
}

static bool chat_is_user(const sl_chat_msg_t *m)
{
    return m->role_kind == SL_J_STRING && sl_text_is(m->role, "user");
}

static bool chat_text_part(const sl_chat_part_t *p)
{
    return p->text_kind == SL_J_STRING && p->type_kind == SL_J_STRING &&
           sl_text_is(p->type, "text");
}

/* check_shape() over the scanned messages; the param names are written
 * only for a rejection (this runs on every request). */
static flt_req_verdict_t chat_shape(const sl_chat_t *chat, flt_req_result_t *res)
{
    if (chat->messages_kind != SL_J_ARRAY)
        return reject(res, FLT_CODE_INVALID_MESSAGES, "messages", "'messages' must be an array");
    if (chat->nmsgs == 0)
        return reject(res, FLT_CODE_INVALID_MESSAGES, "messages", "'messages' must not be empty");
    char p[64];
    for (size_t i = 0; i < chat->nmsgs; i++) {
        const sl_chat_msg_t *m = &chat->msgs[i];
        if (m->kind != SL_J_OBJECT) {
            snprintf(p, sizeof p, "messages[%zu]", i);
            return reject(res, FLT_CODE_INVALID_MESSAGE, p, "%s must be an object", p);
        }
        bool known = false;
        for (size_t r = 0; m->role_kind == SL_J_STRING && r < SL_ARRAY_LEN(flt_roles) && !known;
             r++)
            known = sl_text_is_n(m->role, flt_roles[r].name, flt_roles[r].len);
        if (!known) {
            snprintf(p, sizeof p, "messages[%zu].role", i);
            return reject(res, FLT_CODE_INVALID_MESSAGE, p,
                          "%s must be one of system, developer, "
                          "user, assistant, tool, function",
                          p);
        }
        if (m->content_kind == SL_J_ABSENT || m->content_kind == SL_J_NULL) {
            if (!sl_text_is(m->role, "assistant")) {
                snprintf(p, sizeof p, "messages[%zu].content", i);
                return reject(res, FLT_CODE_INVALID_MESSAGE, p, "%s is required", p);
            }
            continue;
        }
        if (m->content_kind == SL_J_STRING)
            continue;
        if (m->content_kind != SL_J_ARRAY) {
            snprintf(p, sizeof p, "messages[%zu].content", i);
            return reject(res, FLT_CODE_INVALID_MESSAGE, p,
                          "%s must be a string or an array of parts", p);
        }
        for (size_t j = 0; j < m->nparts; j++) {
            const sl_chat_part_t *part = &chat->parts[m->part0 + j];
            bool typed = part->kind == SL_J_OBJECT && part->type_kind == SL_J_STRING;
            if (typed && (!sl_text_is(part->type, "text") || part->text_kind == SL_J_STRING))
                continue;
            snprintf(p, sizeof p, "messages[%zu].content[%zu]", i, j);
            if (!typed)
                return reject(res, FLT_CODE_INVALID_MESSAGE, p, "%s must be an object with a type",
                              p);
            return reject(res, FLT_CODE_INVALID_MESSAGE, p, "%s: text must be a string", p);
        }
    }
    return FLT_REQ_OK;
}

static size_t chat_chars(const sl_chat_t *chat, const sl_chat_msg_t *m)
{
    if (m->content_kind == SL_J_STRING)
        return flt_utf8_count(m->content.p, m->content.len);
    size_t n = 0;
    for (size_t j = 0; m->content_kind == SL_J_ARRAY && j < m->nparts; j++) {
        const sl_chat_part_t *p = &chat->parts[m->part0 + j];
        if (chat_text_part(p))
            n += flt_utf8_count(p->text.p, p->text.len);
    }
    return n;
}

/* Parts joined on the stack up to this many bytes (more: one allocation). */
#define FLT_PARTS_STACK 1024

bool flt_parts_clean(const flt_ruleset_t *rs, const sl_chat_part_t *parts, size_t n)
{
    const sl_chat_part_t *one = NULL;
    size_t ntexts = 0, len = 0;
    for (size_t j = 0; j < n; j++) {
        if (chat_text_part(&parts[j])) {
            one = &parts[j];
            ntexts++;
            len += parts[j].text.len;
        }
    }
    if (ntexts <= 1)
        return !one || flt_text_clean(rs, one->text.p, one->text.len);
    /* the channel reads the text parts as one text (a word or a regex
     * match may run across two): so does the verdict */
    char stack[FLT_PARTS_STACK];
    char *buf = len <= sizeof stack ? stack : malloc(len);
    if (!buf)
        return false;
    size_t o = 0;
    for (size_t j = 0; j < n; j++) {
        if (chat_text_part(&parts[j]) && parts[j].text.len) {
            memcpy(buf + o, parts[j].text.p, parts[j].text.len);
            o += parts[j].text.len;
        }
    }
    bool clean = flt_text_clean(rs, buf, len);
    if (buf != stack)
        free(buf);
    return clean;
}

/* check_rules() without writing masks back: FLT_REQ_EDIT when one hit. */
static flt_req_verdict_t chat_rules(const flt_ruleset_t *rs, const sl_chat_t *chat,
                                    const sl_chat_msg_t *m, size_t i, flt_req_result_t *res)
{
    size_t ntexts = 0;
    if (m->content_kind == SL_J_STRING) {
        ntexts = 1;
    } else if (m->content_kind == SL_J_ARRAY) {
        for (size_t j = 0; j < m->nparts; j++)
            ntexts += chat_text_part(&chat->parts[m->part0 + j]);
    }
    if (!ntexts)
        return FLT_REQ_OK;
    if (m->content_kind == SL_J_STRING ? flt_text_clean(rs, m->content.p, m->content.len)
                                       : flt_parts_clean(rs, &chat->parts[m->part0], m->nparts))
        return FLT_REQ_OK;
    flt_chan_t ch;
    if (flt_chan_init(&ch, rs) != 0)
        return FLT_REQ_ERROR;
    ch.unbounded = true;
    sl_buf_t out = {0};
    flt_chan_rc_t rc = FLT_CHAN_OK;
    if (m->content_kind == SL_J_STRING) {
        rc = flt_chan_feed(&ch, m->content.p, m->content.len, &out);
    } else {
        for (size_t j = 0; j < m->nparts && rc == FLT_CHAN_OK; j++) {
            const sl_chat_part_t *p = &chat->parts[m->part0 + j];
            if (chat_text_part(p)) {
                out.len = 0;
                rc = flt_chan_feed(&ch, p->text.p, p->text.len, &out);
            }
        }
    }
    if (rc == FLT_CHAN_OK)
        rc = flt_chan_finish(&ch, &out);
    flt_req_verdict_t v = chan_verdict(rs, &ch, rc, i, res);
    if (v == FLT_REQ_OK && ch.nmask)
        v = FLT_REQ_EDIT;
    flt_chan_fini(&ch);
    sl_buf_free(&out);
    return v;
}

flt_req_verdict_t flt_request_check_chat(const flt_ruleset_t *rs, const sl_chat_t *chat,
                                         flt_req_result_t *res)
{
    result_clear(res);
    flt_req_verdict_t v = chat_shape(chat, res);
    if (v != FLT_REQ_OK || !rs)
        return v;
    size_t keep = (size_t)rs->input.keep_turns, nuser = 0;
    for (size_t i = 0; i < chat->nmsgs; i++)
        nuser += chat_is_user(&chat->msgs[i]);
    if (keep && nuser > keep) {
        /* keep_turns drops something unless everything before the kept
         * turns is a system or developer message */
        size_t skip = nuser - keep, seen = 0;
        for (size_t i = 0; i < chat->nmsgs; i++) {
            if (chat_is_user(&chat->msgs[i]) && seen++ == skip)
                break;
            if (!chat_is_system(&chat->msgs[i]))
                return FLT_REQ_EDIT;
        }
    }
    size_t max = (size_t)rs->input.max_chars;
    for (size_t i = 0; max && i < chat->nmsgs; i++) {
        const sl_chat_msg_t *m = &chat->msgs[i];
        if (!chat_is_user(m))
            continue;
        if (m->content_kind == SL_J_STRING && m->content.len <= max)
            continue; /* no more characters than bytes: none to count (~130 a prompt) */
        size_t n = chat_chars(chat, m);
        if (n <= max)
            continue;
        if (rs->input.on_overflow != FLT_OVERFLOW_REJECT)
            return FLT_REQ_EDIT;
        char p[64];
        snprintf(p, sizeof p, "messages[%zu].content", i);
        return reject(res, FLT_CODE_PROMPT_TOO_LONG, p, "%s has %zu characters; the limit is %zu",
                      p, n, max);
    }
    for (size_t i = 0; rs->nrules && i < chat->nmsgs; i++) {
        v = chat_rules(rs, chat, &chat->msgs[i], i, res);
        if (v != FLT_REQ_OK)
            return v;
    }
    /* last, as in flt_request_check: a rejected prompt gets no tree */
    return rs->system_prompt ? FLT_REQ_EDIT : FLT_REQ_OK;
}

char *flt_error_body(const flt_req_result_t *res, size_t *len)
{
    json_t *e = json_object(), *o = json_object();
    if (!e || !o) {
        json_decref(e), json_decref(o);
        return NULL;
    }
    json_object_set_new(e, "message", json_string(res->message));
    json_object_set_new(e, "type", json_string("invalid_request_error"));
    json_object_set_new(e, "param", res->param ? json_string(res->param) : json_null());
    json_object_set_new(e, "code", res->code ? json_string(res->code) : json_null());
    json_object_set_new(o, "error", e);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (s && len)
        *len = strlen(s);
    return s;
}

int flt_response_filter(flt_ruleset_t *rs, json_t *body, bool *modified)
{
    *modified = false;
    if (!flt_ruleset_filters_output(rs))
        return 0;
    json_t *choices = json_object_get(body, "choices");
    size_t i;
    json_t *choice;
    sl_buf_t b = {0};
    json_array_foreach(choices, i, choice)
    {
        json_t *msg = json_object_get(choice, "message");
        json_t *c = json_object_get(msg, "content");
        if (!json_is_string(c))
            continue;
        b.len = 0;
        flt_chan_rc_t rc = flt_text_filter(rs, json_string_value(c), json_string_length(c), &b);
        if (rc == FLT_CHAN_ERR) {
            sl_buf_free(&b);
            return -1;
        }
        if (rc == FLT_CHAN_BLOCK) {
            json_object_set_new(msg, "content", json_string(""));
            json_object_set_new(choice, "finish_reason", json_string("content_filter"));
        } else if (b.len == json_string_length(c) &&
                   memcmp(b.p ? b.p : "", json_string_value(c), b.len) == 0) {
            continue;
        } else if (json_string_setn(c, b.p ? b.p : "", b.len) != 0) {
            sl_buf_free(&b);
            return -1;
        }
        if (json_object_get(choice, "logprobs"))
            json_object_set_new(choice, "logprobs", json_null());
        *modified = true;
    }
    sl_buf_free(&b);
    return 0;
}
