/*
 * model.h — sluice's in-process small-model engine (public interface).
 *
 * An engine loads one qwen2 GGUF file (Qwen2.5-0.5B/1.5B-Instruct class)
 * and answers chat requests on its own threads: the caller's thread only
 * queues work, so an event loop can call everything here. Up to
 * `max_batch` requests run at once (continuous batching: one pass over the
 * weights per step serves all of them, on all `threads` compute threads);
 * up to `max_queue` more wait, in arrival order, for a slot.
 *
 * Threads and callbacks: on_text and on_done are called ON AN ENGINE
 * THREAD, never on the thread that submitted. A gateway must marshal them
 * to its event loop (e.g. a locked queue plus an eventfd/event_active) and
 * must not block in them for long: generation waits for the callback.
 * For every accepted request on_done is called exactly once, after the
 * last on_text; no callback follows it. `ud` must stay valid until then.
 * Callbacks must not call mdl_engine_free().
 *
 * Ownership: mdl_engine_submit() copies the messages and parameters; the
 * request handle it returns holds a reference that the caller gives back
 * with mdl_request_release() (any thread, before or after on_done).
 */
#ifndef MDL_MODEL_H
#define MDL_MODEL_H

#include "common/sl.h"

#include <stddef.h>
#include <stdint.h>

typedef struct mdl_engine mdl_engine_t;
typedef struct mdl_request mdl_request_t;

typedef struct {
    int threads;   /* compute threads including the generation thread; default 1 */
    int context;   /* tokens per sequence, prompt + output; default 4096, at most the
                      model's training context */
    int max_queue; /* requests waiting for a free slot; default 8 */
    /* System message used when a conversation has none; its attention state
     * is computed at load and reused by every request that starts with it.
     * NULL: Qwen's default ("You are Qwen, created by Alibaba Cloud. ...");
     * "": no default system message. Copied. */
    const char *system_prompt;
    /* Kernel choice for tests and benchmarks: NULL or "auto" (best the CPU
     * has), "avx512", "avx2", "scalar". SLUICE_MDL_KERNELS=... in the
     * environment can lower it further. */
    const char *kernels;
    int precise; /* float activations for quantized weights (slower; tests) */
    /* 0 (default): read the weights into huge-page memory at load (faster
     * decoding, a private copy of the file in RAM); 1: map the file. */
    int mmap_file;
    /* Continuous batching: up to max_batch requests run at once, each with
     * its own KV cache, all advancing in one pass over the weights per
     * step (default 8, at most 64; fewer when kv_memory_mb, default 2048,
     * does not hold that many caches of `context` tokens). Prompts are
     * read prefill_chunk tokens per step (default 32) while other requests
     * decode. An idle engine waits up to batch_wait_us (default 2000) for
     * a burst to fill its slots before the first step. */
    int max_batch;
    int kv_memory_mb;
    int prefill_chunk;
    int batch_wait_us;
    /* When a slot is needed by another conversation, the KV state it held
     * (if at least 48 tokens) is kept in a prefix store of this many MiB
     * (least recently used out first; default 256, -1: none), so the
     * conversation's next turn still computes only its new tokens. */
    int prefix_cache_mb;
    int no_prefix_reuse; /* benchmarks: never reuse state (nor the system prompt's) */
} mdl_engine_opts_t;

void mdl_engine_opts_default(mdl_engine_opts_t *o);

/* Loads and validates the model file, builds the tokenizer and starts the
 * engine threads. Blocks while it reads the weights (about 0.2 s per
 * 0.5 GB from the page cache, longer from disk): for a reload, call it off
 * the event loop and swap engines when the new one is ready. The system
 * prompt's state is computed on the engine thread afterwards;
 * mdl_engine_ready() turns 1 when it is done (requests submitted before
 * then simply queue). NULL on failure, with a one-line reason in err. */
SL_WUR mdl_engine_t *mdl_engine_new(const char *path, const mdl_engine_opts_t *opts, char *err,
                                    size_t errlen);
/* Cancels every queued and running request (their on_done runs with
 * MDL_FINISH_CANCELLED before this returns), stops the threads, unmaps the
 * model. NULL is fine. */
void mdl_engine_free(mdl_engine_t *e);
/* 1 once loaded and warmed up (for /readyz), 0 before. Any thread. */
int mdl_engine_ready(const mdl_engine_t *e);

typedef struct {
    const char *model_name;      /* general.name of the file */
    int n_ctx, n_vocab, threads; /* context in tokens, vocabulary, compute threads */
    const char *kernels;         /* "avx512", "avx2" or "scalar" */
    uint64_t weight_bytes;       /* bytes of weights read per generated token */
    int queued, running;         /* at the moment of the call: waiting, in a slot */
    uint64_t requests_done, tokens_generated;
    int max_batch;          /* slots (requests that run at once) */
    int batch;              /* sequences in the last step, 0 when idle */
    uint64_t prompt_tokens; /* prompt tokens of started requests */
    uint64_t prefix_hits;   /* requests that reused cached state ... */
    uint64_t prefix_tokens; /* ... and the prompt tokens they did not compute */
    uint64_t steps;         /* batched steps run, and the tokens they held */
    uint64_t step_rows;
    double decode_tps;           /* generated tokens per second over recent steps (all sequences) */
    uint64_t prefix_cache_hits;  /* requests that resumed from a saved prefix */
    uint64_t prefix_cache_saves; /* states saved when their slot was taken */
    int prefix_cache_entries;
    uint64_t prefix_cache_bytes;
} mdl_engine_info_t;
/* Snapshot of the engine's state; strings are borrowed from the engine. */
void mdl_engine_info(mdl_engine_t *e, mdl_engine_info_t *out);

typedef struct {
    const char *role; /* "system", "user", "assistant", "tool" */
    const char *content;
} mdl_message_t;

typedef struct {
    float temperature;        /* 0: greedy */
    float top_p;              /* (0, 1]; 1: off */
    int top_k;                /* 0: off */
    float repetition_penalty; /* 1: off; applied to the last 64 tokens */
    uint64_t seed;
    int has_seed;   /* 0: seeded from the clock */
    int max_tokens; /* 0: until a stop token or the context is full */
} mdl_sampling_t;

/* Qwen's published defaults: temperature 0.7, top_p 0.8, top_k 20,
 * repetition_penalty 1.05, no seed, max_tokens 0. */
void mdl_sampling_default(mdl_sampling_t *p);

typedef enum {
    MDL_FINISH_STOP = 0,  /* <|im_end|> or <|endoftext|> */
    MDL_FINISH_LENGTH,    /* max_tokens reached or the context is full */
    MDL_FINISH_CANCELLED, /* mdl_request_cancel() or engine shutdown */
    MDL_FINISH_ERROR      /* e.g. the prompt does not fit the context; see error */
} mdl_finish_t;

const char *mdl_finish_name(mdl_finish_t f); /* "stop", "length", "cancelled", "error" */

typedef struct {
    int prompt_tokens;
    int completion_tokens;
    int cached_tokens; /* prompt tokens whose state was reused */
    double prefill_ms, decode_ms;
    double ttft_ms; /* from submit to the first token (queue wait included) */
    /* the process's CPU seconds (CLOCK_PROCESS_CPUTIME_ID) when the first
     * token came: benchmarks take the CPU of decoding alone from it */
    double first_token_cpu_s;
} mdl_usage_t;

typedef struct {
    /* A piece of the answer: always whole UTF-8 characters, never empty,
     * not NUL-terminated, borrowed for the call. May be NULL. */
    void (*on_text)(void *ud, const char *text, size_t len);
    /* The end. error is NULL unless why is MDL_FINISH_ERROR; usage and
     * error are borrowed for the call. Required. */
    void (*on_done)(void *ud, mdl_finish_t why, const mdl_usage_t *usage, const char *error);
} mdl_callbacks_t;

enum {
    MDL_SUBMIT_OK = 0,
    MDL_SUBMIT_ERROR = -1,   /* allocation failure or engine shutting down */
    MDL_SUBMIT_FULL = -2,    /* max_queue requests are already waiting: try the next tier */
    MDL_SUBMIT_INVALID = -3, /* bad messages or sampling parameters */
};

/* Queues a chat completion. On MDL_SUBMIT_OK, *out (when out is not NULL)
 * receives a handle the caller must release; callbacks follow on an
 * engine thread. On any other result nothing was queued and no callback
 * will run. cb is copied. */
SL_WUR int mdl_engine_submit(mdl_engine_t *e, const mdl_message_t *msgs, size_t n_msgs,
                             const mdl_sampling_t *params, const mdl_callbacks_t *cb, void *ud,
                             mdl_request_t **out);

/* Asks the request to stop; safe from any thread, at any time before the
 * handle is released, also after on_done (then it does nothing). A running
 * generation stops before its next token (while the prompt is still being
 * processed: within 32 prompt tokens); a queued one is dropped with
 * MDL_FINISH_CANCELLED at the running request's next token, without
 * waiting for its turn. */
void mdl_request_cancel(mdl_request_t *r);
/* Gives back the caller's reference. Does not cancel. NULL is fine. */
void mdl_request_release(mdl_request_t *r);

/* `sluice model ...`: argv[0] is the command name, argv[1] the subcommand
 * (info, generate, and diagnostics; see `model help`). Returns the exit
 * status. */
int mdl_cli_main(int argc, char **argv);

#endif
