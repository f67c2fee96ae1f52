/*
 * engine.c — the serving side of the model (model.h): a bounded FIFO of chat
 * requests and one generation thread that runs up to max_batch of them at
 * once (continuous batching; it is also thread 0 of the compute pool).
 *
 * Each running request owns a slot: a KV cache of its own (one per slot,
 * allocated up front within kv_memory_mb; pages are touched only as the
 * sequence grows). Every step evaluates one token for each decoding slot
 * plus a chunk of prompt tokens for the slots still reading their prompt,
 * in one pass over the weights (mdl_state_eval_seqs); requests join
 * between steps and leave (finished or cancelled) at once, freeing their
 * slot. Batching does not change any sequence's tokens: every per-token
 * operation is the same alone or batched (tested).
 *
 * Prompt-state reuse: a slot keeps the tokens of its last request, so a
 * new request goes to the free slot sharing the longest prefix with it (a
 * multi-turn chat re-sends its history, and gets its previous slot back
 * unless the slots were all needed since) and only computes what follows.
 * The state of the default system message is computed once at start and
 * copied in whenever a request starts with it but its slot does not hold
 * it.
 *
 * Locking: one mutex guards the queue, the slots' request pointers and the
 * stats; it is never held while computing or inside a callback.
 * Cancellation is an atomic flag the generation loop reads every step.
 */
#include "model/model.h"

#include "model/chat_internal.h"
#include "model/pool_internal.h"
#include "model/qwen2_internal.h"
#include "model/tok_internal.h"

#include "common/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct mdl_request {
    _Atomic int refs;
    _Atomic int cancel;
    int done; /* on_done delivered (engine thread only) */
    mdl_message_t *msgs;
    size_t n_msgs;
    char *strings; /* one block holding every role and content */
    mdl_sampling_t params;
    mdl_callbacks_t cb;
    void *ud;
    int64_t t_submit;
    mdl_request_t *next; /* queue link */
};

typedef struct {
    mdl_state_t *st;
    mdl_ids_t cached; /* tokens whose KV state the slot holds, positions 0.. */
    mdl_request_t *r; /* NULL: free (written under e->mu) */
    mdl_ids_t prompt; /* the running request's prompt */
    int fed;          /* prompt tokens in the cache */
    int decoding;     /* prompt done; `last` is the token to feed next */
    int32_t last;
    mdl_sampler_t *smp;
    mdl_utf8_t utf;
    mdl_usage_t u;
    int64_t t0, t1;
    uint64_t lru; /* step of the last use, to pick the coldest slot */
    float *logits;
} slot_t;

/* A saved prefix: the KV state of a conversation whose slot was needed by
 * another one, kept so that its next turn still prefills only what is
 * new. */
typedef struct {
    mdl_state_t *st; /* KV of tokens[0..n) */
    mdl_ids_t tokens;
    uint64_t hash; /* of the tokens, to keep one copy per conversation state */
    uint64_t lru;
    size_t bytes;
} pfx_entry_t;

/* Most saved prefixes, and the shortest worth saving (shorter ones cost
 * less to recompute than to look up and copy). */
#define PFX_MAX     32
#define PFX_MIN_LEN 48

struct mdl_engine {
    mdl_model_t *model;
    mdl_tok_t *tok;
    mdl_pool_t *pool;
    mdl_state_t *work;      /* scratch of a batched step (its own cache holds warm-up only) */
    mdl_state_t *sys_state; /* KV of the system prefix; NULL when none */
    mdl_ids_t sys_tokens;
    slot_t *slots;
    int n_slots, step_tokens, prefill_chunk, batch_wait_us, no_reuse;
    pfx_entry_t pfx[PFX_MAX];
    int n_pfx;
    size_t pfx_bytes, pfx_budget, kv_pos_bytes;
    mdl_seq_step_t *steps;
    int *step_slot;
    char *system_prompt; /* NULL: no default system message */
    int threads, max_queue;
    pthread_t thread;
    int thread_started;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    mdl_request_t *head, *tail;
    int queued;
    int active; /* slots in use */
    _Atomic int stop;
    _Atomic int ready;
    uint64_t seed_counter;
    uint64_t requests_done, tokens_generated, prompt_tokens_total;
    uint64_t prefix_hits, prefix_tokens, steps_run, step_rows, pfx_hits, pfx_saves;
    int last_batch;
    double decode_tps; /* generated tokens per second, smoothed over steps */
    uint64_t step_no;
};

const char *mdl_finish_name(mdl_finish_t f)
{
    switch (f) {
    case MDL_FINISH_STOP:
        return "stop";
    case MDL_FINISH_LENGTH:
        return "length";
    case MDL_FINISH_CANCELLED:
        return "cancelled";
    default:
        return "error";
    }
}

void mdl_engine_opts_default(mdl_engine_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->threads = 1;
    o->context = 4096;
    o->max_queue = 8;
    o->max_batch = 8;
    o->kv_memory_mb = 2048;
    o->prefill_chunk = 32;
    o->batch_wait_us = 2000;
    o->prefix_cache_mb = 256;
}

/* ---- requests ----------------------------------------------------------- */

static void req_unref(mdl_request_t *r)
{
    if (r && atomic_fetch_sub(&r->refs, 1) == 1) {
        free(r->msgs);
        free(r->strings);
        free(r);
    }
}

void mdl_request_release(mdl_request_t *r)
{
    req_unref(r);
}

void mdl_request_cancel(mdl_request_t *r)
{
    if (r)
        atomic_store(&r->cancel, 1);
    /* A queued request is dropped by the generation thread at its next
     * token (or at once when idle, since an idle engine has an empty
     * queue); see drain_cancelled(). */
}

static void finish(mdl_engine_t *e, mdl_request_t *r, mdl_finish_t why, const mdl_usage_t *u,
                   const char *error)
{
    mdl_usage_t zero = {0};
    /* bookkeeping first: whoever on_done wakes sees the stats up to date
     * and may submit again at once without being told the engine is busy */
    pthread_mutex_lock(&e->mu);
    e->requests_done++;
    pthread_mutex_unlock(&e->mu);
    r->done = 1;
    r->cb.on_done(r->ud, why, u ? u : &zero, why == MDL_FINISH_ERROR ? error : NULL);
    req_unref(r);
}

/* Removes cancelled requests from the queue and finishes them, so a client
 * that left does not hold a queue slot until its turn. Generation thread. */
static void drain_cancelled(mdl_engine_t *e)
{
    mdl_request_t *gone = NULL, **pp;
    pthread_mutex_lock(&e->mu);
    e->tail = NULL;
    for (pp = &e->head; *pp;) {
        mdl_request_t *r = *pp;
        if (atomic_load(&r->cancel) || e->stop) {
            *pp = r->next;
            r->next = gone;
            gone = r;
            e->queued--;
        } else {
            e->tail = r;
            pp = &r->next;
        }
    }
    pthread_mutex_unlock(&e->mu);
    while (gone) {
        mdl_request_t *r = gone;
        gone = r->next;
        finish(e, r, MDL_FINISH_CANCELLED, NULL, NULL);
    }
}

static int valid_params(const mdl_sampling_t *p)
{
    return p->temperature >= 0.0f && p->temperature <= 100.0f && p->top_p > 0.0f &&
           p->top_p <= 1.0f && p->top_k >= 0 && p->repetition_penalty > 0.0f &&
           p->repetition_penalty <= 100.0f && p->max_tokens >= 0;
}

int mdl_engine_submit(mdl_engine_t *e, const mdl_message_t *msgs, size_t n_msgs,
                      const mdl_sampling_t *params, const mdl_callbacks_t *cb, void *ud,
                      mdl_request_t **out)
{
    if (out)
        *out = NULL;
    if (!e || !cb || !cb->on_done || (n_msgs > 0 && !msgs) || n_msgs > 100000)
        return MDL_SUBMIT_INVALID;
    mdl_sampling_t p;
    if (params)
        p = *params;
    else
        mdl_sampling_default(&p);
    if (!valid_params(&p))
        return MDL_SUBMIT_INVALID;
    size_t total = 0;
    for (size_t i = 0; i < n_msgs; i++) {
        if (!msgs[i].role || !msgs[i].content || !msgs[i].role[0])
            return MDL_SUBMIT_INVALID;
        total += strlen(msgs[i].role) + strlen(msgs[i].content) + 2;
    }
    mdl_request_t *r = calloc(1, sizeof(*r));
    if (!r)
        return MDL_SUBMIT_ERROR;
    r->msgs = calloc(n_msgs ? n_msgs : 1, sizeof(*r->msgs));
    r->strings = malloc(total ? total : 1);
    if (!r->msgs || !r->strings) {
        free(r->msgs);
        free(r->strings);
        free(r);
        return MDL_SUBMIT_ERROR;
    }
    char *s = r->strings;
    for (size_t i = 0; i < n_msgs; i++) {
        size_t lr = strlen(msgs[i].role) + 1, lc = strlen(msgs[i].content) + 1;
        memcpy(s, msgs[i].role, lr);
        r->msgs[i].role = s;
        s += lr;
        memcpy(s, msgs[i].content, lc);
        r->msgs[i].content = s;
        s += lc;
    }
    r->n_msgs = n_msgs;
    r->t_submit = sl_now_ns();
    r->params = p;
    r->cb = *cb;
    r->ud = ud;
    atomic_init(&r->refs, out ? 2 : 1);
    pthread_mutex_lock(&e->mu);
    /* max_queue counts requests waiting for a slot; queued ones that a
     * free slot will take at the next step are not waiting */
    int waiting = e->queued - (e->n_slots - e->active);
    if (e->stop || waiting >= e->max_queue) {
        int rc = e->stop ? MDL_SUBMIT_ERROR : MDL_SUBMIT_FULL;
        pthread_mutex_unlock(&e->mu);
        free(r->msgs);
        free(r->strings);
        free(r);
        return rc;
    }
    if (!r->params.has_seed) {
        r->params.seed = (uint64_t)sl_now_ns() ^ (++e->seed_counter * 0x9E3779B97F4A7C15ULL);
        r->params.has_seed = 1;
    }
    if (e->tail)
        e->tail->next = r;
    else
        e->head = r;
    e->tail = r;
    e->queued++;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (out)
        *out = r;
    return MDL_SUBMIT_OK;
}

/* ---- generation ------------------------------------------------------------ */

static int ids_set(mdl_ids_t *dst, const int32_t *v, int n)
{
    dst->n = 0;
    for (int i = 0; i < n; i++)
        if (mdl_ids_push(dst, v[i]) != 0)
            return -1;
    return 0;
}

static uint64_t ids_hash(const int32_t *v, int n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int i = 0; i < n; i++)
        h = (h ^ (uint32_t)v[i]) * 0x100000001b3ULL;
    return h;
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb)
{
    int c = 0, lim = SL_MIN(na, nb);
    while (c < lim && a[c] == b[c])
        c++;
    return c;
}

static void pfx_drop(mdl_engine_t *e, int i)
{
    pfx_entry_t *p = &e->pfx[i];
    e->pfx_bytes -= p->bytes;
    mdl_state_free(p->st);
    free(p->tokens.v);
    e->pfx[i] = e->pfx[--e->n_pfx];
}

/* Keeps the slot's cache (about to be overwritten by another conversation)
 * in the prefix store, evicting the least recently used entries to stay
 * within the budget. Failure only means the state is not kept. */
static void pfx_save(mdl_engine_t *e, slot_t *sl)
{
    int n = sl->cached.n;
    size_t bytes = (size_t)n * e->kv_pos_bytes;
    if (e->no_reuse || n < PFX_MIN_LEN || bytes > e->pfx_budget)
        return;
    uint64_t h = ids_hash(sl->cached.v, n);
    for (int i = 0; i < e->n_pfx; i++)
        if (e->pfx[i].hash == h && e->pfx[i].tokens.n == n) {
            e->pfx[i].lru = e->step_no;
            return;
        }
    while (e->n_pfx > 0 && (e->n_pfx == PFX_MAX || e->pfx_bytes + bytes > e->pfx_budget)) {
        int old = 0;
        for (int i = 1; i < e->n_pfx; i++)
            if (e->pfx[i].lru < e->pfx[old].lru)
                old = i;
        pfx_drop(e, old);
    }
    mdl_state_opts_t so = {.n_ctx = n, .batch = 1};
    char err[64];
    pfx_entry_t p = {.hash = h, .lru = e->step_no, .bytes = bytes};
    p.st = mdl_state_new(e->model, &so, NULL, err, sizeof(err));
    if (!p.st || mdl_state_copy_prefix(p.st, sl->st, n) != 0 ||
        ids_set(&p.tokens, sl->cached.v, n) != 0) {
        mdl_state_free(p.st);
        free(p.tokens.v);
        return;
    }
    e->pfx[e->n_pfx++] = p;
    e->pfx_bytes += bytes;
    e->pfx_saves++;
}

/* The saved prefix sharing the most tokens with the prompt (at most lim). */
static int pfx_find(mdl_engine_t *e, const mdl_ids_t *prompt, int lim, int *common_out)
{
    int best = -1, best_c = 0;
    for (int i = 0; i < e->n_pfx; i++) {
        int c = common_prefix(e->pfx[i].tokens.v, e->pfx[i].tokens.n, prompt->v, lim);
        if (c > best_c) {
            best = i;
            best_c = c;
        }
    }
    *common_out = best_c;
    return best;
}

/* The free slot for a prompt: the longest common prefix with what it holds
 * (its previous conversation), the coldest among equals. */
static int pick_slot(mdl_engine_t *e, const mdl_ids_t *prompt, int *common_out)
{
    int best = -1, best_common = -1, lim = prompt->n - 1;
    for (int i = 0; i < e->n_slots; i++) {
        slot_t *sl = &e->slots[i];
        if (sl->r)
            continue;
        int c = 0;
        while (c < lim && c < sl->cached.n && sl->cached.v[c] == prompt->v[c])
            c++;
        if (c > best_common || (c == best_common && sl->lru < e->slots[best].lru)) {
            best = i;
            best_common = c;
        }
    }
    *common_out = best_common;
    return best;
}

/* Brings the slot's KV state to a prefix of the prompt (the last prompt
 * token is always evaluated, for its logits). Returns the tokens reused. */
static int reuse_prefix(mdl_engine_t *e, slot_t *sl, const mdl_ids_t *prompt, int common)
{
    int lim = prompt->n - 1, S = e->sys_tokens.n;
    if (e->no_reuse) {
        mdl_state_truncate(sl->st, 0);
        sl->cached.n = 0;
        return 0;
    }
    /* what the slot holds beyond the shared part belongs to another
     * conversation: keep it for that one's next turn */
    if (sl->cached.n - common >= PFX_MIN_LEN)
        pfx_save(e, sl);
    int pc, pi = pfx_find(e, prompt, lim, &pc);
    if (pi >= 0 && pc > common && pc > S && mdl_state_copy_prefix(sl->st, e->pfx[pi].st, pc) == 0 &&
        ids_set(&sl->cached, prompt->v, pc) == 0) {
        e->pfx[pi].lru = e->step_no;
        e->pfx_hits++;
        return pc;
    }
    if (e->sys_state && common < S && S <= lim &&
        memcmp(prompt->v, e->sys_tokens.v, sizeof(int32_t) * (size_t)S) == 0 &&
        mdl_state_copy_prefix(sl->st, e->sys_state, S) == 0 &&
        ids_set(&sl->cached, e->sys_tokens.v, S) == 0)
        return S;
    mdl_state_truncate(sl->st, common);
    sl->cached.n = common;
    return common;
}

static void emit(mdl_request_t *r, const uint8_t *p, size_t n)
{
    if (n > 0 && r->cb.on_text)
        r->cb.on_text(r->ud, (const char *)p, n);
}

/* Ends the slot's request and frees the slot; the cache stays for the
 * next request that shares its prefix. */
static void slot_finish(mdl_engine_t *e, slot_t *sl, mdl_finish_t why, const char *err)
{
    mdl_request_t *r = sl->r;
    uint8_t text[MDL_UTF8_OUT_MAX(0)];
    emit(r, text, mdl_utf8_flush(&sl->utf, text));
    if (sl->decoding)
        sl->u.decode_ms = (double)(sl_now_ns() - sl->t1) / 1e6;
    else if (sl->t0)
        sl->u.prefill_ms = (double)(sl_now_ns() - sl->t0) / 1e6;
    mdl_sampler_free(sl->smp);
    sl->smp = NULL;
    mdl_usage_t u = sl->u;
    pthread_mutex_lock(&e->mu);
    e->tokens_generated += (uint64_t)u.completion_tokens;
    sl->r = NULL;
    e->active--;
    pthread_mutex_unlock(&e->mu);
    sl->decoding = 0;
    sl->lru = e->step_no;
    finish(e, r, why, &u, err);
    req_unref(r); /* the slot's reference */
}

/* Puts a request admitted from the queue into a free slot: tokenizes,
 * checks, reuses what the slot's cache holds. On error it is finished. */
static void slot_start(mdl_engine_t *e, mdl_request_t *r)
{
    mdl_ids_t prompt = {0};
    char err[160] = "";
    mdl_usage_t u0 = {0};
    if (atomic_load(&r->cancel)) {
        finish(e, r, MDL_FINISH_CANCELLED, &u0, NULL);
        goto gone;
    }
    if (mdl_chat_tokens(e->tok, r->msgs, r->n_msgs, e->system_prompt, &prompt) != 0) {
        snprintf(err, sizeof(err), "cannot tokenize the conversation");
    } else if (prompt.n >= mdl_state_n_ctx(e->work)) {
        u0.prompt_tokens = prompt.n;
        snprintf(err, sizeof(err), "prompt of %d tokens does not fit the %d-token context",
                 prompt.n, mdl_state_n_ctx(e->work));
    } else {
        int common, i = pick_slot(e, &prompt, &common);
        mdl_sampler_t *smp =
            mdl_sampler_new(e->model->n_vocab, mdl_tok_n_tokens(e->tok), &r->params);
        if (i < 0 || !smp) {
            mdl_sampler_free(smp);
            snprintf(err, sizeof(err), i < 0 ? "no free slot" : "out of memory");
        } else {
            slot_t *sl = &e->slots[i];
            free(sl->prompt.v);
            sl->prompt = prompt;
            sl->smp = smp;
            sl->t0 = sl_now_ns();
            sl->t1 = 0;
            memset(&sl->utf, 0, sizeof(sl->utf));
            memset(&sl->u, 0, sizeof(sl->u));
            sl->u.prompt_tokens = prompt.n;
            sl->decoding = 0;
            sl->fed = sl->u.cached_tokens = reuse_prefix(e, sl, &prompt, common);
            pthread_mutex_lock(&e->mu);
            sl->r = r; /* the reference taken at admission moves to the slot */
            e->prompt_tokens_total += (uint64_t)prompt.n;
            if (sl->fed > 0) {
                e->prefix_hits++;
                e->prefix_tokens += (uint64_t)sl->fed;
            }
            pthread_mutex_unlock(&e->mu);
            return;
        }
    }
    free(prompt.v);
    finish(e, r, MDL_FINISH_ERROR, &u0, err);
gone:
    pthread_mutex_lock(&e->mu);
    e->active--;
    pthread_mutex_unlock(&e->mu);
    req_unref(r);
}

/* After a step: the slot has logits for a new token. Samples, streams it,
 * and either keeps the slot decoding or finishes it. */
static void slot_token(mdl_engine_t *e, slot_t *sl)
{
    mdl_request_t *r = sl->r;
    int32_t tok = mdl_sampler_sample(sl->smp, sl->logits, sl->cached.v, sl->cached.n);
    if (mdl_tok_is_eog(e->tok, tok)) {
        slot_finish(e, sl, MDL_FINISH_STOP, NULL);
        return;
    }
    size_t len;
    const uint8_t *b = mdl_tok_bytes(e->tok, tok, 0, &len);
    uint8_t text[MDL_UTF8_OUT_MAX(256)];
    while (len > 0) { /* token texts are short; chunk to bound the buffer */
        size_t take = SL_MIN(len, (size_t)256);
        emit(r, text, mdl_utf8_feed(&sl->utf, b, take, text));
        b += take;
        len -= take;
    }
    sl->u.completion_tokens++;
    if (r->params.max_tokens > 0 && sl->u.completion_tokens >= r->params.max_tokens)
        slot_finish(e, sl, MDL_FINISH_LENGTH, NULL);
    else if (atomic_load(&r->cancel))
        slot_finish(e, sl, MDL_FINISH_CANCELLED, NULL);
    else if (mdl_state_pos(sl->st) >= mdl_state_n_ctx(sl->st))
        slot_finish(e, sl, MDL_FINISH_LENGTH, NULL);
    else
        sl->last = tok;
}

/* One step: a token for every decoding slot and a share of the prompt
 * chunk for every slot still reading its prompt, in one batched pass. */
static void step(mdl_engine_t *e)
{
    int n = 0, rows = 0, n_pre = 0;
    for (int i = 0; i < e->n_slots; i++) {
        slot_t *sl = &e->slots[i];
        if (!sl->r)
            continue;
        if (atomic_load(&sl->r->cancel) || atomic_load(&e->stop)) {
            slot_finish(e, sl, MDL_FINISH_CANCELLED, NULL);
            continue;
        }
        if (sl->decoding) {
            e->steps[n] = (mdl_seq_step_t){sl->st, &sl->last, 1, sl->logits};
            e->step_slot[n++] = i;
            rows++;
        } else {
            n_pre++;
        }
    }
    if (n_pre > 0) {
        /* Prompt tokens this step: a chunk while others decode (so their
         * streams keep flowing), the whole scratch batch otherwise; shared
         * evenly, so requests that arrive together get their first tokens
         * together. */
        int budget = (rows > 0 ? e->prefill_chunk : e->step_tokens) - rows;
        budget = SL_MAX(budget, n_pre);
        budget = SL_MIN(budget, e->step_tokens - rows);
        int share = (budget + n_pre - 1) / n_pre, left = n_pre;
        for (int i = 0; i < e->n_slots && left > 0; i++) {
            slot_t *sl = &e->slots[i];
            if (!sl->r || sl->decoding)
                continue;
            left--;
            int take = SL_MIN(SL_MIN(share, budget), sl->prompt.n - sl->fed);
            if (take <= 0)
                continue;
            budget -= take;
            int last = sl->fed + take == sl->prompt.n;
            e->steps[n] =
                (mdl_seq_step_t){sl->st, sl->prompt.v + sl->fed, take, last ? sl->logits : NULL};
            e->step_slot[n++] = i;
            rows += take;
        }
    }
    if (n == 0)
        return;
    int64_t t0 = sl_now_ns();
    int rc = mdl_state_eval_seqs(e->work, e->steps, n);
    double dt = (double)(sl_now_ns() - t0) / 1e9;
    int decoded = 0;
    for (int k = 0; k < n; k++)
        decoded += e->slots[e->step_slot[k]].decoding;
    /* stats before the callbacks, so whoever on_done wakes sees this step */
    pthread_mutex_lock(&e->mu);
    e->step_no++;
    e->steps_run++;
    e->step_rows += (uint64_t)rows;
    e->last_batch = n;
    if (rc == 0 && decoded > 0 && dt > 0) {
        double tps = decoded / dt;
        e->decode_tps = e->decode_tps > 0 ? 0.9 * e->decode_tps + 0.1 * tps : tps;
    }
    pthread_mutex_unlock(&e->mu);
    for (int k = 0; k < n; k++) {
        slot_t *sl = &e->slots[e->step_slot[k]];
        const mdl_seq_step_t *st = &e->steps[k];
        if (rc != 0) {
            /* state and token list may disagree: start the slot over */
            mdl_state_truncate(sl->st, 0);
            sl->cached.n = 0;
            slot_finish(e, sl, MDL_FINISH_ERROR, "evaluation failed");
            continue;
        }
        int bad = 0;
        for (int j = 0; j < st->n && !bad; j++)
            bad = mdl_ids_push(&sl->cached, st->tokens[j]) != 0;
        if (bad) {
            mdl_state_truncate(sl->st, 0);
            sl->cached.n = 0;
            slot_finish(e, sl, MDL_FINISH_ERROR, "out of memory");
            continue;
        }
        sl->lru = e->step_no;
        if (sl->decoding) {
            slot_token(e, sl);
        } else {
            sl->fed += st->n;
            if (sl->fed == sl->prompt.n) {
                sl->t1 = sl_now_ns();
                sl->u.prefill_ms = (double)(sl->t1 - sl->t0) / 1e6;
                sl->u.ttft_ms = (double)(sl->t1 - sl->r->t_submit) / 1e6;
                struct timespec cts;
                if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cts) == 0)
                    sl->u.first_token_cpu_s = (double)cts.tv_sec + (double)cts.tv_nsec / 1e9;
                sl->decoding = 1;
                slot_token(e, sl);
            }
        }
    }
}

/* Computes and keeps the state of the default system message. */
static void warm_up(mdl_engine_t *e)
{
    if (!e->system_prompt || e->no_reuse)
        return;
    mdl_message_t sys = {"system", e->system_prompt};
    mdl_ids_t all = {0};
    if (mdl_chat_tokens(e->tok, &sys, 1, NULL, &all) != 0) {
        free(all.v);
        return;
    }
    /* the prefix every conversation with this system message shares: all
     * but the trailing "<|im_start|>assistant\n" */
    int S = all.n;
    while (S > 0 && all.v[S - 1] != mdl_tok_im_start(e->tok))
        S--;
    S--; /* drop <|im_start|> itself */
    mdl_state_opts_t so = {.n_ctx = SL_MAX(S, 1), .batch = 1};
    char err[128];
    if (S > 0 && S < mdl_state_n_ctx(e->work) - 1 &&
        mdl_state_eval(e->work, all.v, S, NULL, 0) == 0 &&
        (e->sys_state = mdl_state_new(e->model, &so, NULL, err, sizeof(err))) != NULL &&
        mdl_state_copy_prefix(e->sys_state, e->work, S) == 0) {
        e->sys_tokens.v = all.v;
        e->sys_tokens.n = S;
        e->sys_tokens.cap = all.cap;
        mdl_state_truncate(e->work, 0);
        return;
    }
    sl_warn("model: could not cache the system prompt state");
    mdl_state_free(e->sys_state);
    e->sys_state = NULL;
    free(all.v);
}

/* Takes queued requests into free slots (under e->mu). When the engine was
 * idle, waits up to batch_wait_us for the slots to fill first: requests of
 * a burst arrive microseconds apart, and starting them in one step gives
 * them their first tokens together. Returns the requests taken, linked. */
static mdl_request_t *admit_locked(mdl_engine_t *e, int was_idle)
{
    if (was_idle && e->batch_wait_us > 0 && e->n_slots > 1 && e->head) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ns = ts.tv_nsec + (int64_t)e->batch_wait_us * 1000;
        ts.tv_sec += ns / 1000000000;
        ts.tv_nsec = ns % 1000000000;
        while (!e->stop && e->queued < e->n_slots &&
               pthread_cond_timedwait(&e->cv, &e->mu, &ts) == 0)
            ;
    }
    mdl_request_t *taken = NULL, **tail = &taken;
    while (e->head && e->active < e->n_slots && !e->stop) {
        mdl_request_t *r = e->head;
        e->head = r->next;
        if (!e->head)
            e->tail = NULL;
        r->next = NULL;
        e->queued--;
        e->active++;
        atomic_fetch_add(&r->refs, 1); /* the slot's reference */
        *tail = r;
        tail = &r->next;
    }
    return taken;
}

static void *engine_main(void *arg)
{
    mdl_engine_t *e = arg;
    warm_up(e);
    atomic_store(&e->ready, 1);
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop && !e->head && e->active == 0)
            pthread_cond_wait(&e->cv, &e->mu);
        if (e->stop) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        mdl_request_t *taken = admit_locked(e, e->active == 0);
        pthread_mutex_unlock(&e->mu);
        while (taken) {
            mdl_request_t *r = taken;
            taken = r->next;
            r->next = NULL;
            slot_start(e, r);
        }
        drain_cancelled(e);
        step(e);
    }
    for (int i = 0; i < e->n_slots; i++)
        if (e->slots[i].r)
            slot_finish(e, &e->slots[i], MDL_FINISH_CANCELLED, NULL);
    drain_cancelled(e); /* stop is set: finishes every queued request */
    return NULL;
}

/* ---- lifecycle ------------------------------------------------------------------ */

static int parse_kernels(const char *s)
{
    if (!s || !*s)
        return MDL_KL_AVX512;
    return mdl_klevel_parse(s);
}

mdl_engine_t *mdl_engine_new(const char *path, const mdl_engine_opts_t *opts, char *err,
                             size_t errlen)
{
    mdl_engine_opts_t o;
    if (opts)
        o = *opts;
    else
        mdl_engine_opts_default(&o);
    if (o.threads <= 0)
        o.threads = 1;
    if (o.context <= 0)
        o.context = 4096;
    if (o.max_queue < 0)
        o.max_queue = 0;
    if (o.max_batch <= 0)
        o.max_batch = 8;
    o.max_batch = SL_MIN(o.max_batch, 64);
    if (o.kv_memory_mb <= 0)
        o.kv_memory_mb = 2048;
    if (o.prefill_chunk <= 0)
        o.prefill_chunk = 32;
    o.prefill_chunk = SL_MIN(o.prefill_chunk, 512);
    if (o.batch_wait_us < 0)
        o.batch_wait_us = 0;
    o.batch_wait_us = SL_MIN(o.batch_wait_us, 100000);
    if (o.prefix_cache_mb == 0)
        o.prefix_cache_mb = 256;
    int klevel = parse_kernels(o.kernels);
    if (o.threads > 256 || klevel < 0) {
        mdl_set_err(err, errlen, "bad engine options (threads %d, kernels %s)", o.threads,
                    o.kernels ? o.kernels : "auto");
        return NULL;
    }
    mdl_engine_t *e = calloc(1, sizeof(*e));
    if (!e) {
        mdl_set_err(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->threads = o.threads;
    e->max_queue = o.max_queue;
    e->model = mdl_model_load(path, !o.mmap_file, err, errlen);
    if (!e->model)
        goto fail;
    e->tok = mdl_tok_from_gguf(e->model->gguf, e->model->n_vocab, err, errlen);
    if (!e->tok)
        goto fail;
    if (mdl_tok_im_start(e->tok) < 0 || mdl_tok_im_end(e->tok) < 0) {
        mdl_set_err(err, errlen, "the vocabulary has no <|im_start|>/<|im_end|>: not a chat model");
        goto fail;
    }
    e->pool = mdl_pool_new(o.threads);
    if (!e->pool) {
        mdl_set_err(err, errlen, "cannot start %d compute threads", o.threads);
        goto fail;
    }
    int n_ctx = SL_MIN(o.context, e->model->n_ctx_train);
    /* slots: max_batch, as many as the KV budget holds (at least one) */
    uint64_t kv_seq = 2ull * sizeof(float) * (uint64_t)e->model->n_layer * (uint64_t)n_ctx *
                      (uint64_t)(e->model->n_kv * e->model->head_dim);
    uint64_t fit = (uint64_t)o.kv_memory_mb * 1048576ull / (kv_seq ? kv_seq : 1);
    e->n_slots = (int)SL_MAX((uint64_t)1, SL_MIN((uint64_t)o.max_batch, fit));
    e->prefill_chunk = o.prefill_chunk;
    e->no_reuse = o.no_prefix_reuse;
    e->kv_pos_bytes = (size_t)(kv_seq / (uint64_t)n_ctx);
    e->pfx_budget = o.prefix_cache_mb < 0 ? 0 : (size_t)o.prefix_cache_mb * 1048576u;
    e->batch_wait_us = o.batch_wait_us;
    e->step_tokens = SL_MAX(64, e->n_slots + o.prefill_chunk);
    mdl_state_opts_t so = {
        .n_ctx = n_ctx, .batch = e->step_tokens, .kernel_level = klevel, .precise = o.precise};
    e->work = mdl_state_new(e->model, &so, e->pool, err, errlen);
    if (!e->work)
        goto fail;
    e->slots = calloc((size_t)e->n_slots, sizeof(*e->slots));
    e->steps = calloc((size_t)e->n_slots, sizeof(*e->steps));
    e->step_slot = calloc((size_t)e->n_slots, sizeof(int));
    if (!e->slots || !e->steps || !e->step_slot) {
        mdl_set_err(err, errlen, "out of memory");
        goto fail;
    }
    mdl_state_opts_t seq_o = so;
    seq_o.batch = 1; /* a slot's state is its cache; the scratch is work's */
    for (int i = 0; i < e->n_slots; i++) {
        slot_t *sl = &e->slots[i];
        sl->st = mdl_state_new(e->model, &seq_o, NULL, err, errlen);
        if (!sl->st)
            goto fail;
        sl->logits = malloc(sizeof(float) * (size_t)e->model->n_vocab);
        if (!sl->logits) {
            mdl_set_err(err, errlen, "out of memory");
            goto fail;
        }
    }
    const char *sys = o.system_prompt ? o.system_prompt : mdl_qwen_default_system;
    e->system_prompt = sys[0] ? strdup(sys) : NULL;
    if (sys[0] && !e->system_prompt) {
        mdl_set_err(err, errlen, "out of memory");
        goto fail;
    }
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        mdl_set_err(err, errlen, "cannot start the generation thread");
        goto fail;
    }
    e->thread_started = 1;
    return e;
fail:
    mdl_engine_free(e);
    return NULL;
}

void mdl_engine_free(mdl_engine_t *e)
{
    if (!e)
        return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        for (mdl_request_t *r = e->head; r; r = r->next)
            atomic_store(&r->cancel, 1);
        for (int i = 0; i < e->n_slots; i++)
            if (e->slots[i].r)
                atomic_store(&e->slots[i].r->cancel, 1);
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    for (int i = 0; e->slots && i < e->n_slots; i++) {
        mdl_state_free(e->slots[i].st);
        free(e->slots[i].cached.v);
        free(e->slots[i].prompt.v);
        free(e->slots[i].logits);
        mdl_sampler_free(e->slots[i].smp);
    }
    free(e->slots);
    free(e->steps);
    free(e->step_slot);
    while (e->n_pfx > 0)
        pfx_drop(e, e->n_pfx - 1);
    mdl_state_free(e->work);
    mdl_state_free(e->sys_state);
    mdl_pool_free(e->pool);
    mdl_tok_free(e->tok);
    mdl_model_free(e->model);
    free(e->sys_tokens.v);
    free(e->system_prompt);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

int mdl_engine_ready(const mdl_engine_t *e)
{
    return e && atomic_load(&((mdl_engine_t *)e)->ready);
}

void mdl_engine_info(mdl_engine_t *e, mdl_engine_info_t *out)
{
    memset(out, 0, sizeof(*out));
    out->model_name = e->model->name;
    out->n_ctx = mdl_state_n_ctx(e->work);
    out->n_vocab = e->model->n_vocab;
    out->threads = e->threads;
    out->kernels = mdl_state_kernels(e->work);
    out->weight_bytes = e->model->bytes_per_token;
    out->max_batch = e->n_slots;
    pthread_mutex_lock(&e->mu);
    out->queued = e->queued;
    out->running = e->active;
    out->requests_done = e->requests_done;
    out->tokens_generated = e->tokens_generated;
    out->prompt_tokens = e->prompt_tokens_total;
    out->prefix_hits = e->prefix_hits;
    out->prefix_tokens = e->prefix_tokens;
    out->steps = e->steps_run;
    out->step_rows = e->step_rows;
    out->batch = e->active ? e->last_batch : 0;
    out->decode_tps = e->decode_tps;
    out->prefix_cache_hits = e->pfx_hits;
    out->prefix_cache_saves = e->pfx_saves;
    out->prefix_cache_entries = e->n_pfx;
    out->prefix_cache_bytes = e->pfx_bytes;
    pthread_mutex_unlock(&e->mu);
}
