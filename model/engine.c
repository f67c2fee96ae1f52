/*
 * engine.c — the serving side of the model (model.h): a bounded FIFO of chat
 * requests, one generation thread that takes them in turn (it is also
 * thread 0 of the compute pool), prompt-state reuse, and the callbacks.
 *
 * Prompt-state reuse: the KV cache keeps the tokens of the last request, so
 * the next one only computes what follows the longest common prefix (a
 * multi-turn chat re-sends its history). Separately, the state of the
 * default system message is computed once at start and copied in whenever
 * a request starts with it but the live cache does not hold it.
 *
 * Locking: one mutex guards the queue, the running pointer and the stats;
 * it is never held while computing or inside a callback. Cancellation is
 * an atomic flag the generation loop reads before every token.
 */
#include "model/model.h"

#include "model/chat_internal.h"
#include "model/pool_internal.h"
#include "model/qwen2_internal.h"
#include "model/tok_internal.h"

#include "common/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    mdl_request_t *next; /* queue link */
};

struct mdl_engine {
    mdl_model_t *model;
    mdl_tok_t *tok;
    mdl_pool_t *pool;
    mdl_state_t *state;
    mdl_state_t *sys_state; /* KV of the system prefix; NULL when none */
    mdl_ids_t sys_tokens;
    mdl_ids_t cached; /* tokens whose KV state holds, positions 0.. */
    float *logits;
    char *system_prompt; /* NULL: no default system message */
    int threads, max_queue;
    pthread_t thread;
    int thread_started;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    mdl_request_t *head, *tail;
    int queued;
    int running;
    mdl_request_t *cur; /* the request being generated, for shutdown */
    _Atomic int stop;
    _Atomic int ready;
    uint64_t seed_counter;
    uint64_t requests_done, tokens_generated;
};

static void set_err(char *err, size_t errlen, const char *fmt, ...) SL_PRINTF(3, 4);
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

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
    if (e->cur == r) {
        e->running = 0;
        e->cur = NULL;
    }
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
    r->params = p;
    r->cb = *cb;
    r->ud = ud;
    atomic_init(&r->refs, out ? 2 : 1);
    pthread_mutex_lock(&e->mu);
    /* max_queue counts requests waiting behind a running one; when the
     * engine is idle the first queued request is about to run */
    int waiting = e->queued - (e->running ? 0 : 1);
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

/* Brings the KV state to hold prompt[0..n-1) (the last prompt token is
 * always evaluated, for its logits), reusing what it can. Returns the number
 * of tokens reused. */
static int reuse_prefix(mdl_engine_t *e, const mdl_ids_t *prompt)
{
    int lim = prompt->n - 1, common = 0;
    while (common < lim && common < e->cached.n && e->cached.v[common] == prompt->v[common])
        common++;
    int S = e->sys_tokens.n;
    if (e->sys_state && common < S && S <= lim &&
        memcmp(prompt->v, e->sys_tokens.v, sizeof(int32_t) * (size_t)S) == 0 &&
        mdl_state_copy_prefix(e->state, e->sys_state, S) == 0) {
        memcpy(e->cached.v, e->sys_tokens.v, sizeof(int32_t) * (size_t)S);
        e->cached.n = S;
        return S;
    }
    mdl_state_truncate(e->state, common);
    e->cached.n = common;
    return common;
}

static int cached_append(mdl_engine_t *e, const int32_t *t, int n)
{
    for (int i = 0; i < n; i++)
        if (mdl_ids_push(&e->cached, t[i]) != 0)
            return -1;
    return 0;
}

/* Evaluates tokens, chunk by chunk so that cancellation (or shutdown) is
 * seen during a long prefill too, within one chunk; logits of the last one
 * land in e->logits. 1 when cancelled. */
static int eval_tokens(mdl_engine_t *e, mdl_request_t *r, const int32_t *t, int n)
{
    enum { CHUNK = 32 }; /* the state's batch: each chunk reads the weights once */
    for (int c = 0; c < n; c += CHUNK) {
        if ((r && atomic_load(&r->cancel)) || atomic_load(&e->stop))
            return 1;
        int nb = SL_MIN(CHUNK, n - c);
        if (mdl_state_eval(e->state, t + c, nb, c + nb == n ? e->logits : NULL, 0) != 0)
            return -1;
        if (cached_append(e, t + c, nb) != 0)
            return -1;
    }
    return 0;
}

static void emit(mdl_request_t *r, const uint8_t *p, size_t n)
{
    if (n > 0 && r->cb.on_text)
        r->cb.on_text(r->ud, (const char *)p, n);
}

static void run_request(mdl_engine_t *e, mdl_request_t *r)
{
    mdl_usage_t u = {0};
    mdl_ids_t prompt = {0};
    mdl_sampler_t *smp = NULL;
    char err[160] = "";
    mdl_finish_t why = MDL_FINISH_ERROR;
    int64_t t0 = sl_now_ns();
    if (atomic_load(&r->cancel)) {
        finish(e, r, MDL_FINISH_CANCELLED, &u, NULL);
        return;
    }
    if (mdl_chat_tokens(e->tok, r->msgs, r->n_msgs, e->system_prompt, &prompt) != 0) {
        snprintf(err, sizeof(err), "cannot tokenize the conversation");
        goto out;
    }
    u.prompt_tokens = prompt.n;
    int n_ctx = mdl_state_n_ctx(e->state);
    if (prompt.n >= n_ctx) {
        snprintf(err, sizeof(err), "prompt of %d tokens does not fit the %d-token context",
                 prompt.n, n_ctx);
        goto out;
    }
    smp = mdl_sampler_new(e->model->n_vocab, mdl_tok_n_tokens(e->tok), &r->params);
    if (!smp) {
        snprintf(err, sizeof(err), "out of memory");
        goto out;
    }
    u.cached_tokens = reuse_prefix(e, &prompt);
    int rc = eval_tokens(e, r, prompt.v + u.cached_tokens, prompt.n - u.cached_tokens);
    int64_t t1 = sl_now_ns();
    u.prefill_ms = (double)(t1 - t0) / 1e6;
    if (rc > 0) {
        why = MDL_FINISH_CANCELLED; /* the cache holds what was evaluated: keep it */
        goto out;
    }
    if (rc < 0) {
        snprintf(err, sizeof(err), "evaluation failed");
        mdl_state_truncate(e->state, 0); /* state and token list may disagree: start over */
        e->cached.n = 0;
        goto out;
    }
    mdl_utf8_t utf = {0};
    uint8_t text[MDL_UTF8_OUT_MAX(256)];
    for (;;) {
        int32_t tok = mdl_sampler_sample(smp, e->logits, e->cached.v, e->cached.n);
        if (mdl_tok_is_eog(e->tok, tok)) {
            why = MDL_FINISH_STOP;
            break;
        }
        size_t len;
        const uint8_t *b = mdl_tok_bytes(e->tok, tok, 0, &len);
        while (len > 0) { /* token texts are short; chunk to bound the buffer */
            size_t take = SL_MIN(len, (size_t)256);
            emit(r, text, mdl_utf8_feed(&utf, b, take, text));
            b += take;
            len -= take;
        }
        u.completion_tokens++;
        if (r->params.max_tokens > 0 && u.completion_tokens >= r->params.max_tokens) {
            why = MDL_FINISH_LENGTH;
            break;
        }
        if (atomic_load(&r->cancel)) {
            why = MDL_FINISH_CANCELLED;
            break;
        }
        if (mdl_state_pos(e->state) >= n_ctx) {
            why = MDL_FINISH_LENGTH;
            break;
        }
        drain_cancelled(e);
        if (eval_tokens(e, NULL, &tok, 1) != 0) {
            snprintf(err, sizeof(err), "evaluation failed");
            mdl_state_truncate(e->state, 0);
            e->cached.n = 0;
            break;
        }
    }
    emit(r, text, mdl_utf8_flush(&utf, text));
    u.decode_ms = (double)(sl_now_ns() - t1) / 1e6;
out:
    pthread_mutex_lock(&e->mu);
    e->tokens_generated += (uint64_t)u.completion_tokens;
    pthread_mutex_unlock(&e->mu);
    mdl_sampler_free(smp);
    free(prompt.v);
    finish(e, r, why, &u, err);
}

/* Computes and keeps the state of the default system message. */
static void warm_up(mdl_engine_t *e)
{
    if (!e->system_prompt)
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
    if (S > 0 && S < mdl_state_n_ctx(e->state) - 1 && eval_tokens(e, NULL, all.v, S) == 0 &&
        (e->sys_state = mdl_state_new(e->model, &so, NULL, err, sizeof(err))) != NULL &&
        mdl_state_copy_prefix(e->sys_state, e->state, S) == 0) {
        e->sys_tokens.v = all.v;
        e->sys_tokens.n = S;
        e->sys_tokens.cap = all.cap;
        return;
    }
    sl_warn("model: could not cache the system prompt state");
    mdl_state_free(e->sys_state);
    e->sys_state = NULL;
    free(all.v);
}

static void *engine_main(void *arg)
{
    mdl_engine_t *e = arg;
    warm_up(e);
    atomic_store(&e->ready, 1);
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop && !e->head)
            pthread_cond_wait(&e->cv, &e->mu);
        if (e->stop) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        mdl_request_t *r = e->head;
        e->head = r->next;
        if (!e->head)
            e->tail = NULL;
        r->next = NULL;
        e->queued--;
        e->running = 1;
        e->cur = r;
        atomic_fetch_add(&r->refs, 1); /* keeps cur valid until it is cleared */
        pthread_mutex_unlock(&e->mu);
        run_request(e, r);
        pthread_mutex_lock(&e->mu);
        e->running = 0;
        e->cur = NULL;
        pthread_mutex_unlock(&e->mu);
        req_unref(r);
    }
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
    int klevel = parse_kernels(o.kernels);
    if (o.threads > 256 || klevel < 0) {
        set_err(err, errlen, "bad engine options (threads %d, kernels %s)", o.threads,
                o.kernels ? o.kernels : "auto");
        return NULL;
    }
    mdl_engine_t *e = calloc(1, sizeof(*e));
    if (!e) {
        set_err(err, errlen, "out of memory");
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
        set_err(err, errlen, "the vocabulary has no <|im_start|>/<|im_end|>: not a chat model");
        goto fail;
    }
    e->pool = mdl_pool_new(o.threads);
    if (!e->pool) {
        set_err(err, errlen, "cannot start %d compute threads", o.threads);
        goto fail;
    }
    mdl_state_opts_t so = {.n_ctx = SL_MIN(o.context, e->model->n_ctx_train),
                           .kernel_level = klevel,
                           .precise = o.precise};
    e->state = mdl_state_new(e->model, &so, e->pool, err, errlen);
    if (!e->state)
        goto fail;
    e->logits = malloc(sizeof(float) * (size_t)e->model->n_vocab);
    const char *sys = o.system_prompt ? o.system_prompt : mdl_qwen_default_system;
    e->system_prompt = sys[0] ? strdup(sys) : NULL;
    if (!e->logits || (sys[0] && !e->system_prompt)) {
        set_err(err, errlen, "out of memory");
        goto fail;
    }
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        set_err(err, errlen, "cannot start the generation thread");
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
        if (e->cur)
            atomic_store(&e->cur->cancel, 1);
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    mdl_state_free(e->state);
    mdl_state_free(e->sys_state);
    mdl_pool_free(e->pool);
    mdl_tok_free(e->tok);
    mdl_model_free(e->model);
    free(e->sys_tokens.v);
    free(e->cached.v);
    free(e->logits);
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
    out->n_ctx = mdl_state_n_ctx(e->state);
    out->n_vocab = e->model->n_vocab;
    out->threads = e->threads;
    out->kernels = mdl_state_kernels(e->state);
    out->weight_bytes = e->model->bytes_per_token;
    pthread_mutex_lock(&e->mu);
    out->queued = e->queued;
    out->running = e->running;
    out->requests_done = e->requests_done;
    out->tokens_generated = e->tokens_generated;
    pthread_mutex_unlock(&e->mu);
}
