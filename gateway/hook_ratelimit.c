/*
 * hook_ratelimit.c — the rate-limit adapter: clamps max_tokens, reserves
 * the request's token cost and takes a request and a concurrency slot
 * (ratelimit/ decides, in-process or through Redis), answers 429 with
 * Retry-After, retry-after-ms and OpenAI's x-ratelimit-* names (plus the
 * deprecated X-RateLimit-*), strips the usage chunk it asked the
 * upstream for, and settles the reservation with the real usage at the end.
 */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "conf/conf.h"
#include "gateway/gw_conn.h"
#include "gateway/body_scan.h"
#include "gateway/gw_flow.h"
#include "gateway/gw_hook.h"
#include "gateway/gw_req.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_server.h"
#include "gateway/gw_types.h"
#include "gateway/gw_worker.h"
#include "gateway/http1.h"
#include "ratelimit/ratelimit.h"

typedef struct gw_rl {
    gw_req_t *r;
    rl_ticket_t *ticket;
    rl_pending_t *pending;
    rl_decision_t d;
    rl_clamp_t clamp;
    int64_t prompt_est;
    rl_stream_t *stream;
    rl_usage_t usage;
    bool have_usage;
    bool budgets; /* token budgets: the answer's usage settles the reservation */
} gw_rl_t;

static bool gw_rl_any_limit(const conf_ratelimit_t *c)
{
    return c->per_user.requests_per_minute || c->per_user.concurrent ||
           c->per_user.tokens_per_minute || c->per_user.tokens_per_day ||
           c->per_ip.requests_per_minute || c->noverrides;
}

/* Token budgets need the upstream's usage; plain request limits do not. */
static bool gw_rl_budgets(const conf_ratelimit_t *c)
{
    if (c->per_user.tokens_per_minute || c->per_user.tokens_per_day)
        return true;
    for (size_t i = 0; i < c->noverrides; i++)
        if (c->overrides[i].limits.tokens_per_minute || c->overrides[i].limits.tokens_per_day)
            return true;
    return false;
}

/* The runtime's limits (rt_build below): a reload swaps them with the
 * runtime, while the limiter's state (s->rl) stays. */
const rl_policy_t *gw_rl_policy(const gw_rt_t *rt)
{
    return rt->hook_state[gw_hook_index(&gw_hook_ratelimit)];
}

/* Appends n bytes at p, the room checked by the caller: the header lines
 * below are a dozen pieces in a buffer sized once, so no string builder
 * with its grow path inlined at every piece (that made the function 2.6 KB
 * of code, ~40 instruction-cache lines a request). */
static inline char *gw_rl_put(char *p, const void *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

#define GW_RL_LIT(p, lit) gw_rl_put((p), (lit), sizeof(lit) - 1)

/* One "<name><what>: <value>\r\n" header line, the room checked by the
 * caller. */
static inline char *gw_rl_line(char *p, const char *name, size_t nl, const char *what, size_t wl,
                               const char *v, size_t vl)
{
    p = gw_rl_put(p, name, nl);
    p = gw_rl_put(p, what, wl);
    p = GW_RL_LIT(p, ": ");
    p = gw_rl_put(p, v, vl);
    return GW_RL_LIT(p, "\r\n");
}

#define GW_RL_LINE(p, lit, what, wl, v, vl)                                                        \
    gw_rl_line((p), (lit), sizeof(lit) - 1, (what), (wl), (v), (vl))

/* Built without snprintf: it runs for every answer's headers. */
const char *gw_rl_duration(int64_t ms, char *buf, size_t n)
{
    char t[64]; /* at most 19 + 2 + 2 + 5 + 1 bytes and sl_i64toa's NUL */
    char *p = t;
    if (ms <= 0) {
        p = GW_RL_LIT(p, "0s");
    } else if (ms < 1000) {
        p += sl_i64toa(ms, p);
        p = GW_RL_LIT(p, "ms");
    } else {
        int64_t h = ms / 3600000, m = ms / 60000 % 60, s = ms / 1000 % 60, f = ms % 1000;
        if (h) {
            p += sl_i64toa(h, p);
            *p++ = 'h';
        }
        if (h || m) {
            p += sl_i64toa(m, p);
            *p++ = 'm';
        }
        p += sl_i64toa(s, p);
        if (f) {
            char frac[4] = {'.', (char)('0' + f / 100), (char)('0' + f / 10 % 10),
                            (char)('0' + f % 10)};
            size_t k = sizeof(frac);
            while (frac[k - 1] == '0') /* Go trims the fraction's zeros */
                k--;
            p = gw_rl_put(p, frac, k);
        }
        *p++ = 's';
    }
    if (n) { /* as snprintf: truncated, always terminated */
        size_t k = SL_MIN((size_t)(p - t), n - 1);
        memcpy(buf, t, k);
        buf[k] = '\0';
    }
    return buf;
}

int gw_rl_format_headers(const struct rl_decision *d, char *buf, size_t n)
{
    /* The old names first (rl_format_headers: X-RateLimit-*, Retry-After);
     * the new ones copy their numbers from there. */
    rl_header_nums_t at;
    int len = rl_format_headers_at(d, buf, n, &at);
    if (len < 0)
        return -1;
    const char *what = NULL;
    size_t wl = 0;
    switch (d->limit) {
    case RL_LIMIT_REQUESTS:
    case RL_LIMIT_IP_REQUESTS:
        what = "requests";
        wl = sizeof("requests") - 1;
        break;
    case RL_LIMIT_TOKENS_MINUTE:
    case RL_LIMIT_TOKENS_DAY:
        what = "tokens";
        wl = sizeof("tokens") - 1;
        break;
    default: /* concurrency, the store, the key table: OpenAI has no name for them */
        break;
    }
    int w = 0;
    /* every limit with a name has its numbers in the old names (at) */
    if (what && at.limit_len && at.remaining_len) {
        char reset[48];
        gw_rl_duration(d->reset_ms, reset, sizeof(reset));
        size_t rl = strlen(reset);
        /* three names of at most 24 bytes, two numbers of at most 20, the
         * terminating NUL: sized here, so the lines below stay in buf */
        if ((size_t)len + 3 * (24 + wl + 4) + 2 * 20 + rl >= n)
            return -1;
        char *p = buf + len;
        p = GW_RL_LINE(p, "x-ratelimit-limit-", what, wl, buf + at.limit_off, at.limit_len);
        p = GW_RL_LINE(p, "x-ratelimit-remaining-", what, wl, buf + at.remaining_off,
                       at.remaining_len);
        p = GW_RL_LINE(p, "x-ratelimit-reset-", what, wl, reset, rl);
        *p = '\0';
        len = (int)(p - buf);
    }
    if (!d->allowed && d->retry_after_ms >= 0) {
        w = snprintf(buf + len, n - (size_t)len, "retry-after-ms: %lld\r\n",
                     (long long)SL_MAX(d->retry_after_ms, 1));
        if (w < 0 || (size_t)w >= n - (size_t)len)
            return -1;
        len += w;
    }
    return len;
}

void gw_rl_respond_refusal(gw_req_t *r, const struct rl_decision *d)
{
    char hdrs[512];
    if (gw_rl_format_headers(d, hdrs, sizeof(hdrs)) < 0)
        hdrs[0] = '\0';
    size_t len = 0;
    char *body = rl_error_body(d, &len);
    if (!body) {
        gw_respond_oom(r);
        return;
    }
    r->error_kind = d->limit == RL_LIMIT_STORE ? "ratelimit_store" : "rate_limited";
    gw_respond_json(r, rl_decision_status(d), body, len, hdrs);
    free(body);
}

/* The Responses API's max_output_tokens under the same cap as chat's
 * max_tokens (else that API would be a way around it), with the model's
 * default_max_tokens when absent. Read from the tree when one was built,
 * else from the scanner's facts; the edit is a splice on the client's
 * bytes (gw_req_set_int), or the tree's when there is one. -1: answered
 * (400). */
static int gw_rl_clamp_responses(gw_req_t *r, int64_t cap, rl_clamp_t *clamp)
{
    sl_jkind_t kind;
    int64_t have = 0;
    if (r->json) {
        json_t *v = json_object_get(r->json, "max_output_tokens");
        kind = !v                   ? SL_J_ABSENT
               : json_is_null(v)    ? SL_J_NULL
               : json_is_integer(v) ? SL_J_INT
                                    : SL_J_OBJECT; /* any other: refused below */
        have = json_is_integer(v) ? json_integer_value(v) : 0;
    } else {
        const gw_jfact_t *mot = gw_body_fact(r->scan, GW_F_MAX_OUTPUT_TOKENS);
        kind = mot->kind;
        have = kind == SL_J_INT ? mot->i : 0;
    }
    int64_t dmt = r->model ? r->model->conf->default_max_tokens : 0;
    int64_t want;
    if (kind == SL_J_ABSENT || kind == SL_J_NULL) {
        want = dmt > 0 && dmt < cap ? dmt : cap;
    } else if (kind == SL_J_INT && have >= 1) {
        want = SL_MIN(have, cap);
        if (want == have) {
            clamp->max_tokens = want; /* as sent: the client's bytes go */
            return 0;
        }
    } else {
        gw_respond_error(r, 400, "invalid_request_error", "invalid_parameter",
                         "max_output_tokens must be a positive integer");
        return -1;
    }
    if (gw_req_set_int(r, "max_output_tokens", want) != 0) {
        gw_respond_oom(r);
        return -1;
    }
    clamp->max_tokens = want;
    return 0;
}

/* The Responses prompt estimate from the scanner's facts (no tree): the
 * texts decoded, the input's items and the tools walked over the client's
 * bytes. -1: not to be had that way (the caller counts from the tree). */
int gw_rl_resp_scan_tokens(const gw_body_scan_t *b, int64_t *out)
{
    const gw_jfact_t *ins = gw_body_fact(b, GW_F_INSTRUCTIONS);
    const gw_jfact_t *input = gw_body_fact(b, GW_F_INPUT);
    const gw_jfact_t *tools = gw_body_fact(b, GW_F_TOOLS);
    rl_resp_in_t in = {
        .instructions_kind = ins->kind,
        .input_kind = input->kind,
        .tools_kind = tools->kind,
        .bigint = b->bigint,
    };
    if (ins->kind == SL_J_STRING)
        in.instructions = ins->s;
    if (input->kind == SL_J_STRING)
        in.input = input->s;
    else if (input->kind == SL_J_ARRAY)
        in.input_json = (sl_text_t){b->body + input->off, input->end - input->off};
    if (tools->kind != SL_J_ABSENT)
        in.tools_json = (sl_text_t){b->body + tools->off, tools->end - tools->off};
    return rl_responses_prompt_tokens_in(&in, out);
}

/* A Responses request: the clamp, and with budgets its prompt estimate
 * (instructions, input, tools: from the scan's facts, or from the tree
 * when there is one — the filters edited the body — or the scan's way
 * fails) and, for a stream, the counter its events feed
 * (response.completed's usage, else the deltas' text). Nothing is
 * injected: that API's stream always ends with its usage. -1: answered. */
static int gw_rl_budget_responses(gw_req_t *r, gw_rl_t *s, int64_t cap, bool budgets)
{
    if (gw_rl_clamp_responses(r, cap, &s->clamp) != 0)
        return -1;
    s->clamp.stream = r->stream;
    if (!budgets)
        return 0;
    if (r->json || !r->scan || gw_rl_resp_scan_tokens(r->scan, &s->prompt_est) != 0) {
        const json_t *j = gw_req_json(r);
        if (!j) {
            gw_respond_oom(r);
            return -1;
        }
        s->prompt_est = rl_responses_prompt_tokens(j);
    }
    if (s->clamp.stream && !(s->stream = rl_stream_new(false))) {
        gw_respond_oom(r);
        return -1;
    }
    return 0;
}

/* The clamp over the scanner's facts (body_scan.h): the edits become
 * splices on the client's bytes. -1: answered. */
static int gw_rl_clamp_scan(gw_req_t *r, gw_rl_t *s, bool budgets)
{
    const conf_ratelimit_t *c = &r->rt->conf->ratelimit;
    const gw_body_scan_t *b = r->scan;
    rl_clamp_in_t in;
    gw_body_scan_clamp_in(b, &in);
    rl_clamp_edits_t ed;
    char err[160];
    if (rl_clamp_plan(&in, c->max_tokens, budgets, &s->clamp, &ed, err, sizeof(err)) != 0) {
        gw_respond_error(r, 400, "invalid_request_error", "invalid_parameter", err);
        return -1;
    }
    int64_t dmt = r->model ? r->model->conf->default_max_tokens : 0;
    if (s->clamp.added_max_tokens && dmt > 0 && dmt < s->clamp.max_tokens) {
        /* The model's own default (a reasoning model needs more than a
         * chat model, a small one less); the cap still bounds it. */
        ed.max_tokens = dmt;
        s->clamp.max_tokens = dmt;
    }
    if ((ed.max_tokens > 0 && gw_req_set_int(r, "max_tokens", ed.max_tokens) != 0) ||
        (ed.max_completion_tokens > 0 &&
         gw_req_set_int(r, "max_completion_tokens", ed.max_completion_tokens) != 0) ||
        (ed.include_usage && gw_req_set_include_usage(r) != 0)) {
        gw_respond_oom(r);
        return -1;
    }
    if (budgets) {
        const sl_chat_t *chat = &b->chat;
        bool tools = chat->tools_kind == SL_J_ARRAY || chat->tools_kind == SL_J_OBJECT;
        for (size_t i = 0; !tools && i < chat->nmsgs; i++)
            tools = chat->msgs[i].tool_calls_kind == SL_J_ARRAY ||
                    chat->msgs[i].tool_calls_kind == SL_J_OBJECT;
        if (!tools && b->has_msgs && !r->json) {
            s->prompt_est = rl_chat_prompt_tokens(chat);
        } else if (!b->has_msgs || r->json ||
                   rl_chat_prompt_tokens_json(chat, &s->prompt_est) != 0) {
            /* a prompt the filters edited is in the tree, and tools the
             * scan's way cannot count (prompt_json.c): count from the tree */
            const json_t *j = gw_req_json(r);
            if (!j) {
                gw_respond_oom(r);
                return -1;
            }
            s->prompt_est = rl_body_prompt_tokens(j);
        }
    }
    if (s->clamp.stream && budgets) {
        s->stream = rl_stream_new(s->clamp.injected_usage);
        if (!s->stream) {
            gw_respond_oom(r);
            return -1;
        }
    }
    return 0;
}

static void gw_rl_checked(void *arg, const rl_decision_t *d, rl_ticket_t *ticket)
{
    gw_rl_t *s = arg;
    s->pending = NULL;
    s->d = *d;
    s->ticket = ticket;
    gw_req_t *r = s->r;
    if (!d->allowed) {
        /* Answering ends the request and frees s: leave the chain first. */
        gw_hook_resume(r, GW_HOOK_DONE);
        gw_rl_respond_refusal(r, &s->d);
        return;
    }
    gw_hook_resume(r, GW_HOOK_NEXT);
}

/* All X-Forwarded-For lines joined with ",", into buf; NULL when none. */
static const char *gw_rl_xff(const gw_http_msg_t *m, char *buf, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < m->nheaders; i++) {
        const gw_http_header_t *h = &m->headers[i];
        if (h->name_len != sizeof("X-Forwarded-For") - 1 ||
            strncasecmp(h->name, GW_LIT("X-Forwarded-For")) != 0)
            continue;
        if (n + h->value_len + 2 >= cap)
            break;
        if (n)
            buf[n++] = ',';
        memcpy(buf + n, h->value, h->value_len);
        n += h->value_len;
    }
    buf[n] = '\0';
    return n ? buf : NULL;
}

void gw_rl_client_ip(gw_req_t *r)
{
    char xff[1024];
    const gw_http_msg_t *m = gw_http_msg(r->c->parser);
    if (rl_client_ip(rl_policy_trusted_proxies(gw_rl_policy(r->rt)), r->c->peer,
                     gw_rl_xff(m, xff, sizeof(xff)), r->tx.client_ip, sizeof(r->tx.client_ip)) != 0)
        snprintf(r->tx.client_ip, sizeof(r->tx.client_ip), "%.47s", r->c->peer);
    gw_req_tx_mark(r, GW_REQ_TX_CLIENT_IP, true);
}

bool gw_rl_budgets_on(const gw_req_t *r)
{
    return gw_rl_budgets(&r->rt->conf->ratelimit);
}

/* The request's clamp (max_tokens, include_usage) into s: 0, or -1 when
 * it was answered (400, OOM). */
static int gw_rl_clamp(gw_req_t *r, gw_rl_t *s)
{
    const conf_ratelimit_t *c = &r->rt->conf->ratelimit;
    bool budgets = gw_rl_budgets(c);
    s->budgets = budgets;
    if ((r->route == GW_ROUTE_CHAT || r->route == GW_ROUTE_COMPLETIONS) && r->scan) {
        if (gw_rl_clamp_scan(r, s, budgets) != 0)
            return -1;
    } else if (r->route == GW_ROUTE_CHAT || r->route == GW_ROUTE_COMPLETIONS) {
        char err[160];
        if (rl_body_clamp_ex(r->json, c->max_tokens, budgets, &s->clamp, err, sizeof(err)) != 0) {
            gw_respond_error(r, 400, "invalid_request_error", "invalid_parameter", err);
            return -1;
        }
        int64_t dmt = r->model ? r->model->conf->default_max_tokens : 0;
        if (s->clamp.added_max_tokens && dmt > 0 && dmt < s->clamp.max_tokens) {
            /* The model's own default (a reasoning model needs more than a
             * chat model, a small one less); the cap still bounds it. */
            if (json_object_set_new(r->json, "max_tokens", json_integer(dmt)) != 0) {
                gw_respond_oom(r);
                return -1;
            }
            s->clamp.max_tokens = dmt;
        }
        if (s->clamp.modified || s->clamp.added_max_tokens)
            r->body_dirty = true; /* the slow path: the tree goes out again */
        if (budgets)
            s->prompt_est = rl_body_prompt_tokens(r->json);
        if (s->clamp.stream && budgets) {
            s->stream = rl_stream_new(s->clamp.injected_usage);
            if (!s->stream) {
                gw_respond_oom(r);
                return -1;
            }
        }
    }
    if (r->route == GW_ROUTE_RESPONSES && (json_is_object(r->json) || r->scan) &&
        gw_rl_budget_responses(r, s, c->max_tokens, budgets) != 0)
        return -1;
    return 0;
}

/* A zeroed state, from the worker's spares when it has one (at a few
 * dozen requests in flight malloc and free of the same size overflow
 * glibc's per-size cache and reach its bins). NULL on OOM. */
static gw_rl_t *gw_rl_state_new(gw_worker_t *w)
{
    gw_rl_t *s = sl_spares_take(&w->rl_spares);
    if (!s)
        return sl_zalloc(sizeof(gw_rl_t));
    memset(s, 0, sizeof(*s));
    return s;
}

/* Frees s, or keeps it among w's spares. */
static void gw_rl_state_free(gw_worker_t *w, gw_rl_t *s)
{
    if (!sl_spares_keep(&w->rl_spares, s))
        free(s);
}

static gw_hook_rc_t gw_rl_on_request(gw_req_t *r, void **state)
{
    gw_worker_t *w = r->c->w;
    const conf_ratelimit_t *c = &r->rt->conf->ratelimit;
    if (!w->rlw)
        return GW_HOOK_NEXT;
    if (!gw_rl_any_limit(c)) {
        /* Nothing to count: the clamp alone, on the stack; a state only
         * for a stream whose injected usage is stripped (no calloc and
         * free on the way of a request that keeps nothing). */
        gw_rl_t tmp = {.r = r};
        if (gw_rl_clamp(r, &tmp) != 0) {
            rl_stream_free(tmp.stream);
            return GW_HOOK_DONE;
        }
        if (!tmp.stream)
            return GW_HOOK_NEXT;
        gw_rl_t *s = malloc(sizeof(*s));
        if (!s) {
            rl_stream_free(tmp.stream);
            gw_respond_oom(r);
            return GW_HOOK_DONE;
        }
        *s = tmp;
        *state = s;
        return GW_HOOK_NEXT;
    }
    gw_rl_t *s = gw_rl_state_new(w);
    if (!s) {
        gw_respond_oom(r);
        return GW_HOOK_DONE;
    }
    s->r = r;
    *state = s;
    if (gw_rl_clamp(r, s) != 0)
        return GW_HOOK_DONE;
    const char *user = gw_req_user(r);
    const char *client = gw_req_client_id(r);
    if (!user[0])
        gw_rl_client_ip(r); /* the limiter keys by address only without a user */
    rl_request_t q = {
        .policy = gw_rl_policy(r->rt),
        .user = user[0] ? user : NULL,
        .client = client[0] ? client : NULL,
        .ip = gw_req_client_ip(r),
        .tokens = s->prompt_est + s->clamp.max_tokens,
    };
    switch (rl_check(w->rlw, &q, &s->d, &s->ticket, gw_rl_checked, s, &s->pending)) {
    case RL_PENDING:
        return GW_HOOK_PENDING;
    case RL_DONE:
        if (!s->d.allowed) {
            gw_rl_respond_refusal(r, &s->d);
            return GW_HOOK_DONE;
        }
        return GW_HOOK_NEXT;
    default:
        gw_respond_oom(r);
        return GW_HOOK_DONE;
    }
}

static void gw_rl_on_cancel(gw_req_t *r, void *state)
{
    (void)r;
    gw_rl_t *s = state;
    if (s && s->pending) {
        rl_pending_cancel(s->pending);
        s->pending = NULL;
    }
}

static void gw_rl_on_headers(gw_req_t *r, void *state, gw_sb_t *head)
{
    (void)r;
    gw_rl_t *s = state;
    char hdrs[512];
    int n;
    if (s && s->d.limit != RL_LIMIT_NONE &&
        (n = gw_rl_format_headers(&s->d, hdrs, sizeof(hdrs))) > 0)
        gw_sb_add(head, hdrs, (size_t)n);
}

static gw_ev_rc_t gw_rl_on_event(gw_req_t *r, void *state, const char *data, size_t len,
                                 gw_payloads_t *out)
{
    gw_rl_t *s = state;
    if (!s->stream)
        return GW_EV_PASS;
    if (r->route == GW_ROUTE_RESPONSES) {
        rl_stream_feed_responses(s->stream, data, len);
        return GW_EV_PASS;
    }
    char *rw = NULL;
    size_t rwlen = 0;
    switch (rl_stream_feed(s->stream, data, len, &rw, &rwlen)) {
    case RL_CHUNK_DROP:
        return GW_EV_REPLACE; /* nothing pushed: the event is dropped */
    case RL_CHUNK_REWRITE:
        if (gw_payloads_push(out, rw, rwlen) != 0)
            return GW_EV_STOP;
        return GW_EV_REPLACE;
    default:
        return GW_EV_PASS;
    }
}

/* A stream's events matter only with a token budget (s->stream, made by
 * on_request): without one the hook leaves the event dispatch. */
static bool gw_rl_wants_events(const gw_req_t *r, void *state)
{
    (void)r;
    return ((const gw_rl_t *)state)->stream != NULL;
}

static int gw_rl_on_body(gw_req_t *r, void *state, json_t *body, bool *modified)
{
    (void)r;
    (void)modified;
    gw_rl_t *s = state;
    s->have_usage = rl_usage_from_body(body, &s->usage) == 0;
    return 0;
}

/* The answer's bytes, when no hook reading it needs a tree: the usage read
 * without one (rl_usage_from_json: the tree's figures, at a fraction of its
 * cost). Never asks for the tree, never edits. */
static int gw_rl_on_body_raw(gw_req_t *r, void *state, const char *data, size_t len, char **out,
                             size_t *outlen)
{
    (void)r;
    (void)out;
    (void)outlen;
    gw_rl_t *s = state;
    s->have_usage = rl_usage_from_json(data, len, &s->usage) == 0;
    return 0;
}

static bool gw_rl_wants_body(const gw_req_t *r, void *state)
{
    (void)r;
    return ((const gw_rl_t *)state)->budgets;
}

static void gw_rl_on_end(gw_req_t *r, void *state, gw_end_t how)
{
    (void)how;
    gw_rl_t *s = state;
    if (!s)
        return;
    if (s->pending)
        rl_pending_cancel(s->pending);
    if (s->ticket) {
        /* Settle when the upstream produced an answer (even a cut one: the
         * tokens were spent); give everything back when it never did. */
        bool produced = r->att.t_first_byte_ns && r->att.upstatus >= 200 && r->att.upstatus < 300;
        if (!produced) {
            rl_ticket_release(s->ticket);
        } else {
            int64_t used;
            if (s->stream)
                used = rl_stream_settle_tokens(s->stream, s->prompt_est);
            else if (s->have_usage)
                used = s->usage.total_tokens;
            else
                used = rl_ticket_reserved(s->ticket);
            rl_ticket_settle(s->ticket, used);
        }
    }
    rl_stream_free(s->stream);
    gw_rl_state_free(r->c->w, s);
}

/* ---- lifecycle ------------------------------------------------------------ */

/* The limits of a runtime: built with it, so a SIGHUP applies new limits,
 * keys and overrides to new requests while every bucket is kept. */
static int gw_rl_rt_build(gw_rt_t *rt, gw_shared_t *sh, char *err, size_t errlen)
{
    (void)sh;
    char e[512];
    rl_policy_t *p = rl_policy_new(&rt->conf->ratelimit, e, sizeof(e));
    if (!p) {
        snprintf(err, errlen, "%s: %s", rt->conf->path ? rt->conf->path : "conf", e);
        return -1;
    }
    rt->hook_state[gw_hook_index(&gw_hook_ratelimit)] = p;
    return 0;
}

static void gw_rl_rt_free(gw_rt_t *rt)
{
    int i = gw_hook_index(&gw_hook_ratelimit);
    rl_policy_free(rt->hook_state[i]);
    rt->hook_state[i] = NULL;
}

/* ratelimit.max_keys of the runtime serving now (a reload may change it):
 * applied here, on the main thread, rather than in rt_build, which also
 * runs for a reload that is then refused. */
static void gw_rl_tick(gw_server_t *s)
{
    static int64_t applied = -1;
    if (!s->rl)
        return;
    gw_rt_t *rt = gw_server_rt(s);
    int64_t want = rt->conf->ratelimit.max_keys;
    gw_rt_unref(rt);
    if (applied < 0)
        applied = want; /* process_init built it with this */
    if (want != applied) {
        rl_set_max_keys(s->rl, want);
        applied = want;
    }
}

/* The limiter lives across reloads: its state (buckets, concurrency) must. */
static int gw_rl_process_init(gw_server_t *s, const conf_t *c, char *err, size_t errlen)
{
    s->rl = rl_new(&c->ratelimit, &c->redis, err, errlen);
    return s->rl ? 0 : -1;
}

static void gw_rl_process_fini(gw_server_t *s)
{
    rl_free(s->rl);
    s->rl = NULL;
}

/* The request workers' handles (the main thread's admin listener serves no
 * limited route). */
static int gw_rl_worker_init(gw_worker_t *w)
{
    if (w->is_main || !w->srv->rl)
        return 0;
    char err[256];
    w->rlw = rl_worker_new(w->srv->rl, w->base, err, sizeof(err));
    if (!w->rlw) {
        sl_error("worker %d: rate limits: %s", w->id, err);
        return -1;
    }
    return 0;
}

static void gw_rl_worker_fini(gw_worker_t *w)
{
    sl_spares_free(&w->rl_spares);
    rl_worker_free(w->rlw);
    w->rlw = NULL;
}

const gw_hook_t gw_hook_ratelimit = {
    .name = "ratelimit",
    .rt_build = gw_rl_rt_build,
    .rt_free = gw_rl_rt_free,
    .tick = gw_rl_tick,
    .process_init = gw_rl_process_init,
    .process_fini = gw_rl_process_fini,
    .worker_init = gw_rl_worker_init,
    .worker_fini = gw_rl_worker_fini,
    .on_request = gw_rl_on_request,
    .on_cancel = gw_rl_on_cancel,
    .on_headers = gw_rl_on_headers,
    .on_event = gw_rl_on_event,
    .wants_events = gw_rl_wants_events,
    .on_body = gw_rl_on_body,
    .on_body_raw = gw_rl_on_body_raw,
    .wants_body = gw_rl_wants_body,
    .on_end = gw_rl_on_end,
};
