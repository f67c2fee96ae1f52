/*
 * engine_gw.c — an upstream of kind engine: sluice's in-process small model
 * (model/) answering /v1/chat/completions in exactly the OpenAI shapes the
 * rest of the gateway handles, so it serves as the `local` tier of the
 * fallback chain or as the first stop for simple requests.
 *
 * The engine generates on its own threads. Its callbacks (on an engine
 * thread) only append text to a locked buffer and activate an event on the
 * request's worker; everything else — building chunks, the hook chain
 * (filters, usage accounting), writing to the client — happens on the
 * worker's event loop. A client that leaves cancels the generation; a full
 * engine queue is a failure the chain turns into the next tier.
 *
 * Engines are kept in the process-wide registry (gw_shared_t) by upstream,
 * so a reload that does not change an engine's settings keeps the loaded
 * weights.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "fallback/fallback.h"
#include "gateway/gw_flow.h"
#include "gateway/gw_fallback.h"
#include "gateway/gw_proxy.h"
#include "gateway/gw_req.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_types.h"
#include "gateway/gw_worker.h"
#include "model/model.h"

/* ---- the registry ------------------------------------------------------------ */

typedef struct gw_engine_slot {
    struct gw_engine_slot *next;
    char *upstream;
    char *model;
    char *system_prompt;
    int64_t threads, context, max_queue;
    mdl_engine_t *engine;
    int refs; /* runtimes using it (main thread only) */
} gw_engine_slot_t;

/* Runtimes are built on the main thread but may be freed on any worker
 * (by the last request holding one): the registry has a lock. */
static pthread_mutex_t gw_engines_lock = PTHREAD_MUTEX_INITIALIZER;

static bool gw_str_eq(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

mdl_engine_t *gw_engine_get(gw_shared_t *sh, const conf_upstream_t *cu, char *err, size_t errlen)
{
    const conf_engine_t *c = &cu->engine;
    pthread_mutex_lock(&gw_engines_lock);
    for (gw_engine_slot_t *s = sh->engines; s; s = s->next) {
        if (strcmp(s->upstream, cu->name) == 0 && strcmp(s->model, c->model) == 0 &&
            gw_str_eq(s->system_prompt, c->system_prompt) && s->threads == c->threads &&
            s->context == c->context && s->max_queue == c->max_queue) {
            s->refs++;
            pthread_mutex_unlock(&gw_engines_lock);
            return s->engine;
        }
    }
    pthread_mutex_unlock(&gw_engines_lock);
    mdl_engine_opts_t o;
    mdl_engine_opts_default(&o);
    o.threads = (int)c->threads;
    o.context = (int)c->context;
    o.max_queue = (int)c->max_queue;
    o.max_batch = (int)c->max_batch;
    o.system_prompt = c->system_prompt;
    char e[256];
    mdl_engine_t *eng = mdl_engine_new(c->model, &o, e, sizeof(e));
    if (!eng) {
        snprintf(err, errlen, "upstreams.%s.engine.model %s: %s", cu->name, c->model, e);
        return NULL;
    }
    gw_engine_slot_t *s = sl_xcalloc(1, sizeof(*s));
    s->upstream = sl_xstrdup(cu->name);
    s->model = sl_xstrdup(c->model);
    s->system_prompt = c->system_prompt ? sl_xstrdup(c->system_prompt) : NULL;
    s->threads = c->threads;
    s->context = c->context;
    s->max_queue = c->max_queue;
    s->engine = eng;
    s->refs = 1;
    pthread_mutex_lock(&gw_engines_lock);
    s->next = sh->engines;
    sh->engines = s;
    pthread_mutex_unlock(&gw_engines_lock);
    mdl_engine_info_t info;
    mdl_engine_info(eng, &info);
    sl_info("engine %s: %s loaded (%s, %d threads, %s kernels)", cu->name, c->model,
            info.model_name ? info.model_name : "?", info.threads, info.kernels);
    return eng;
}

void gw_engine_put(gw_shared_t *sh, mdl_engine_t *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&gw_engines_lock);
    for (gw_engine_slot_t **pp = &sh->engines; *pp; pp = &(*pp)->next) {
        gw_engine_slot_t *s = *pp;
        if (s->engine != e)
            continue;
        if (--s->refs > 0)
            break;
        /* No runtime uses it, so no request does either (requests hold
         * their runtime): safe to stop its threads. */
        *pp = s->next;
        pthread_mutex_unlock(&gw_engines_lock);
        mdl_engine_free(s->engine);
        free(s->upstream);
        free(s->model);
        free(s->system_prompt);
        free(s);
        return;
    }
    pthread_mutex_unlock(&gw_engines_lock);
}

void gw_engines_stop(gw_shared_t *sh)
{
    pthread_mutex_lock(&gw_engines_lock);
    for (gw_engine_slot_t *s = sh->engines; s; s = s->next) {
        mdl_engine_free(s->engine); /* cancels, and runs every last on_done */
        s->engine = NULL;           /* gw_engine_put() will not find it again */
    }
    pthread_mutex_unlock(&gw_engines_lock);
}

void gw_engines_free(gw_shared_t *sh)
{
    gw_engines_stop(sh);
    gw_engine_slot_t *s = sh->engines;
    while (s) {
        gw_engine_slot_t *next = s->next;
        free(s->upstream);
        free(s->model);
        free(s->system_prompt);
        free(s);
        s = next;
    }
    sh->engines = NULL;
}

/* ---- one request ---------------------------------------------------------------- */

typedef struct gw_ejob {
    pthread_mutex_t lock;
    struct evbuffer *pending; /* text from the engine thread, under lock */
    bool done;
    mdl_finish_t why;
    mdl_usage_t usage;
    char error[160];
    gw_worker_t *w; /* the request's worker: the engine side posts to it */
    bool posted;    /* a run is posted and has not started (under lock) */
    /* loop side */
    gw_req_t *r; /* NULL once the request is gone */
    mdl_request_t *h;
    struct evbuffer *all; /* the whole answer (non-streamed) */
    bool began;           /* the SSE head and role chunk are out */
    bool stopped;         /* a hook ended the stream */
    char id[64];
    int64_t created;
} gw_ejob_t;

static void gw_ejob_free(gw_ejob_t *j)
{
    if (j->pending)
        evbuffer_free(j->pending);
    if (j->all)
        evbuffer_free(j->all);
    mdl_request_release(j->h);
    pthread_mutex_destroy(&j->lock);
    free(j);
}

/* Engine thread. */
static void gw_ejob_run(void *arg);

/* Engine thread, under j->lock: make sure a run is coming. */
static void gw_ejob_post_locked(gw_ejob_t *j)
{
    if (j->posted)
        return;
    if (gw_worker_post(j->w, gw_ejob_run, j) == 0)
        j->posted = true;
}

static void gw_ejob_on_text(void *ud, const char *text, size_t len)
{
    gw_ejob_t *j = ud;
    pthread_mutex_lock(&j->lock);
    evbuffer_add(j->pending, text, len);
    gw_ejob_post_locked(j);
    pthread_mutex_unlock(&j->lock);
}

/* Engine thread: the last touch of j from this side. */
static void gw_ejob_on_done(void *ud, mdl_finish_t why, const mdl_usage_t *usage, const char *error)
{
    gw_ejob_t *j = ud;
    pthread_mutex_lock(&j->lock);
    j->done = true;
    j->why = why;
    if (usage)
        j->usage = *usage;
    if (error)
        snprintf(j->error, sizeof(j->error), "%s", error);
    gw_ejob_post_locked(j);
    pthread_mutex_unlock(&j->lock);
}

static json_t *gw_ejob_chunk(const gw_ejob_t *j, const gw_req_t *r, json_t *delta,
                             const char *finish)
{
    return json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:o,s:o}]}", "id", j->id, "object",
                     "chat.completion.chunk", "created", (json_int_t)j->created, "model",
                     r->model->name, "choices", "index", 0, "delta", delta, "finish_reason",
                     finish ? json_string(finish) : json_null());
}

static int gw_ejob_emit(gw_ejob_t *j, gw_req_t *r, json_t *chunk)
{
    char *s = chunk ? json_dumps(chunk, JSON_COMPACT) : NULL;
    json_decref(chunk);
    if (!s)
        return -1;
    int rc = gw_proxy_local_stream_event(r, s, strlen(s));
    free(s);
    if (rc != 0)
        j->stopped = true;
    return rc;
}

static json_t *gw_ejob_usage(const gw_ejob_t *j)
{
    return json_pack("{s:i,s:i,s:i}", "prompt_tokens", j->usage.prompt_tokens, "completion_tokens",
                     j->usage.completion_tokens, "total_tokens",
                     j->usage.prompt_tokens + j->usage.completion_tokens);
}

static const char *gw_ejob_finish(mdl_finish_t why)
{
    return why == MDL_FINISH_LENGTH ? "length" : "stop";
}

/* The end of a streamed answer: finish chunk, usage when asked, [DONE]. */
static void gw_ejob_stream_done(gw_ejob_t *j, gw_req_t *r)
{
    if (j->why == MDL_FINISH_ERROR) {
        gw_proxy_local_stream_end(r, "upstream_error", "The local model failed.");
        return;
    }
    if (gw_ejob_emit(j, r, gw_ejob_chunk(j, r, json_object(), gw_ejob_finish(j->why))) == 0 &&
        json_is_true(
            json_object_get(json_object_get(gw_req_json(r), "stream_options"), "include_usage"))) {
        json_t *u = json_pack("{s:s,s:s,s:I,s:s,s:[],s:o}", "id", j->id, "object",
                              "chat.completion.chunk", "created", (json_int_t)j->created, "model",
                              r->model->name, "choices", "usage", gw_ejob_usage(j));
        gw_ejob_emit(j, r, u);
    }
    if (!j->stopped)
        gw_proxy_local_stream_event(r, "[DONE]", 6);
    gw_proxy_local_stream_end(r, NULL, NULL);
}

static void gw_ejob_body_done(gw_ejob_t *j, gw_req_t *r)
{
    size_t n = evbuffer_get_length(j->all);
    json_t *msg = json_pack("{s:s,s:s%}", "role", "assistant", "content",
                            n ? (const char *)evbuffer_pullup(j->all, -1) : "", n);
    json_t *body = json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:o,s:n,s:s}],s:o}", "id", j->id, "object",
                             "chat.completion", "created", (json_int_t)j->created, "model",
                             r->model->name, "choices", "index", 0, "message", msg, "logprobs",
                             "finish_reason", gw_ejob_finish(j->why), "usage", gw_ejob_usage(j));
    if (!body) {
        gw_respond_oom(r);
        return;
    }
    gw_proxy_local_body(r, body);
    json_decref(body);
}

/* The request's worker: text and the end, from the engine. */
static void gw_ejob_run(void *arg)
{
    gw_ejob_t *j = arg;
    struct evbuffer *text = evbuffer_new();
    pthread_mutex_lock(&j->lock);
    j->posted = false;
    if (text)
        evbuffer_add_buffer(text, j->pending);
    bool done = j->done;
    pthread_mutex_unlock(&j->lock);
    gw_req_t *r = j->r;
    if (!r || !text) {
        if (text)
            evbuffer_free(text);
        if (done)
            gw_ejob_free(j); /* the request left; the engine is through with j */
        return;
    }
    size_t n = evbuffer_get_length(text);
    if (n && !r->att.t_first_byte_ns)
        r->att.t_first_byte_ns = sl_now_ns();
    if (r->stream) {
        if (!j->began && (n || (done && j->why != MDL_FINISH_ERROR))) {
            j->began = true;
            gw_proxy_local_stream_begin(r);
            gw_ejob_emit(j, r,
                         gw_ejob_chunk(j, r,
                                       json_pack("{s:s,s:s}", "role", "assistant", "content", ""),
                                       NULL));
        }
        if (n && !j->stopped)
            gw_ejob_emit(j, r,
                         gw_ejob_chunk(j, r,
                                       json_pack("{s:s%}", "content",
                                                 (const char *)evbuffer_pullup(text, -1), n),
                                       NULL));
    } else if (n) {
        evbuffer_add_buffer(j->all, text);
    }
    evbuffer_free(text);
    if (j->stopped && !done) {
        /* A filter blocked the answer: stop generating; the end comes
         * through on_done (cancelled). */
        mdl_request_cancel(j->h);
        return;
    }
    if (!done)
        return;
    /* The generation ended: answer, then the job is ours alone to free. */
    j->r = NULL;
    gw_req_wait_done(r);
    if (j->stopped) {
        gw_proxy_local_stream_end(r, NULL, NULL);
    } else if (j->why == MDL_FINISH_ERROR && !j->began) {
        sl_warn("engine %s: %s", r->att.pool->name, j->error);
        r->error_kind = "engine_error";
        if (!gw_fb_after_failure(r, FB_FAIL_OTHER, 0))
            gw_respond_error(r, 502, "server_error", "upstream_error", "The local model failed.");
    } else if (r->stream) {
        gw_ejob_stream_done(j, r);
    } else {
        gw_ejob_body_done(j, r);
    }
    gw_ejob_free(j);
}

/* Messages of the chat body as (role, text): string contents, or the text
 * parts of an array. Returns the count; -1 when malformed. Texts point into
 * body or into *arena (freed by the caller). */
static long gw_engine_messages(json_t *body, mdl_message_t **out, json_t **arena)
{
    json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return -1;
    size_t n = json_array_size(msgs);
    mdl_message_t *m = calloc(n, sizeof(*m));
    *arena = json_array();
    if (!m || !*arena) {
        free(m);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *it = json_array_get(msgs, i);
        json_t *role = json_object_get(it, "role"), *content = json_object_get(it, "content");
        if (!json_is_string(role))
            goto bad;
        m[i].role = json_string_value(role);
        if (json_is_string(content)) {
            m[i].content = json_string_value(content);
        } else if (json_is_array(content)) {
            struct evbuffer *b = evbuffer_new();
            size_t k;
            json_t *part;
            json_array_foreach(content, k, part)
            {
                json_t *t = json_object_get(part, "text");
                if (json_is_string(t))
                    evbuffer_add(b, json_string_value(t), json_string_length(t));
            }
            json_t *s = json_stringn((const char *)evbuffer_pullup(b, -1), evbuffer_get_length(b));
            evbuffer_free(b);
            if (!s)
                goto bad;
            json_array_append_new(*arena, s);
            m[i].content = json_string_value(s);
        } else if (json_is_null(content) || !content) {
            m[i].content = "";
        } else {
            goto bad;
        }
    }
    *out = m;
    return (long)n;
bad:
    free(m);
    json_decref(*arena);
    *arena = NULL;
    return -1;
}

static void gw_engine_sampling(json_t *body, mdl_sampling_t *p)
{
    mdl_sampling_default(p);
    json_t *v;
    if (json_is_number(v = json_object_get(body, "temperature")))
        p->temperature = (float)json_number_value(v);
    if (json_is_number(v = json_object_get(body, "top_p")))
        p->top_p = (float)json_number_value(v);
    if (json_is_integer(v = json_object_get(body, "top_k")))
        p->top_k = (int)json_integer_value(v);
    if (json_is_number(v = json_object_get(body, "repetition_penalty")))
        p->repetition_penalty = (float)json_number_value(v);
    if (json_is_integer(v = json_object_get(body, "seed"))) {
        p->seed = (uint64_t)json_integer_value(v);
        p->has_seed = 1;
    }
    json_t *mt = json_object_get(body, "max_completion_tokens");
    if (!json_is_integer(mt))
        mt = json_object_get(body, "max_tokens");
    if (json_is_integer(mt) && json_integer_value(mt) > 0)
        p->max_tokens = (int)SL_MIN(json_integer_value(mt), 1 << 30);
}

/* The client left: the job is freed on the loop when the engine's on_done
 * arrives. */
static void gw_engine_wait_cancel(gw_req_t *r, void *job)
{
    (void)r;
    gw_ejob_t *j = job;
    j->r = NULL;
    mdl_request_cancel(j->h);
}

void gw_engine_attempt(gw_req_t *r)
{
    if (r->route != GW_ROUTE_CHAT) {
        gw_respond_error(r, 404, "invalid_request_error", "not_found",
                         "The local model serves /v1/chat/completions only.");
        return;
    }
    mdl_message_t *msgs = NULL;
    json_t *arena = NULL;
    long n = gw_engine_messages(gw_req_json(r), &msgs, &arena);
    if (n < 0) {
        gw_respond_error(r, 400, "invalid_request_error", "invalid_messages",
                         "messages must be a non-empty array of {role, content}.");
        return;
    }
    mdl_sampling_t params;
    gw_engine_sampling(gw_req_json(r), &params);
    gw_ejob_t *j = calloc(1, sizeof(*j));
    if (!j) {
        free(msgs);
        json_decref(arena);
        gw_respond_oom(r);
        return;
    }
    pthread_mutex_init(&j->lock, NULL);
    j->pending = evbuffer_new();
    j->all = evbuffer_new();
    j->w = r->c->w;
    j->r = r;
    j->created = sl_wall_s();
    snprintf(j->id, sizeof(j->id), "chatcmpl-%s", r->id);
    mdl_callbacks_t cb = {.on_text = gw_ejob_on_text, .on_done = gw_ejob_on_done};
    int rc = j->pending && j->all
                 ? mdl_engine_submit(r->att.pool->engine, msgs, (size_t)n, &params, &cb, j, &j->h)
                 : MDL_SUBMIT_ERROR;
    free(msgs);
    json_decref(arena);
    if (rc == MDL_SUBMIT_OK) {
        gw_req_wait(r, gw_engine_wait_cancel, j);
        r->att.t_sent_ns = sl_now_ns();
        return;
    }
    gw_ejob_free(j);
    if (rc == MDL_SUBMIT_INVALID) {
        gw_respond_error(r, 400, "invalid_request_error", "invalid_request",
                         "The local model cannot take these messages or parameters.");
        return;
    }
    /* Full (or shutting down): the next tier answers. */
    r->error_kind = rc == MDL_SUBMIT_FULL ? "engine_busy" : "engine_error";
    if (gw_fb_after_failure(r, FB_FAIL_CONNECT, 0))
        return;
    gw_respond_error(r, 503, "server_error", "upstream_unavailable",
                     "The local model is busy right now.");
}
