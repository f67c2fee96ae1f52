/*
 * cache.h — the response cache: exact (a hash of the normalised request)
 * and semantic (an embedding of the last user message), in-process (LRU
 * bounded by bytes) or shared by every instance through Redis. Nothing here
 * knows about gateway/ or HTTP framing: the gateway's adapter
 * (gateway/hook_cache.c) feeds it the parsed request, the answer's JSON body
 * or SSE payloads, and sends what it renders. docs/cache.md tells the design.
 *
 * Where each part is called from in a chat completion (POST
 * /v1/chat/completions; other routes are not cached):
 *
 *   after auth, limits and input filters (post-route on_request)
 *       q = cache_req_new(c, &in)          policy, Cache-Control, the key;
 *       cache_req_state(q) == CACHE_BYPASS  -> forward, header "bypass";
 *       cache_lookup(w, q, now, cb, arg)   DONE or PENDING (Redis);
 *       hit: e = cache_req_entry(q) sent as cache_entry_rendered(e,
 *            cache_req_stream(q), cache_req_include_usage(q), &len) (the
 *            body as stored: no parse, no render), or with output filters
 *            on, through them by cache_entry_sse() / cache_entry_json();
 *            header X-Sluice-Cache: hit and Age: cache_req_age_s();
 *       miss, and cache_req_semantic(q): cache_req_embed_body() is
 *            POSTed to /v1/embeddings of cache_req_embed_model() within
 *            cache_req_embed_deadline_ms(); its answer goes to
 *            cache_req_embed_answer() and a second cache_lookup() asks the
 *            semantic index (a timeout / error: just go upstream);
 *   on the answer path (on_body): cache_req_record_body(q, answer);
 *   on the stream path (on_event): cache_req_record_event(q, data, len)
 *       for every data payload ("[DONE]" included), before output filters
 *       change it;
 *   whenever the answer is not the model's own (fallback tier, template,
 *       an output filter masked or blocked, an error status, a cut stream):
 *       cache_req_taint(q, CACHE_TAINT_...);
 *   on_end: cache_store(w, q, now) (stores only a clean, complete answer,
 *       fire and forget), then cache_req_free(q).
 *
 * Threads: cache_t (policy, in-process store, semantic index) is shared by
 * all workers, under small locks. A cache_worker_t belongs to one worker
 * thread and owns its Redis client; callbacks run later on that thread,
 * never inside the call. A Redis failure is a miss, never an error.
 *
 * Clocks: every call that ages something takes the wall clock in ms, so
 * TTLs, Age and expiry are tested with fake clocks and agree across
 * instances sharing Redis.
 */
#ifndef SL_CACHE_H
#define SL_CACHE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sl.h"
#include "conf/conf.h"

struct event_base;

typedef struct cache cache_t;
typedef struct cache_worker cache_worker_t;
typedef struct cache_req cache_req_t;
typedef struct cache_entry cache_entry_t;
typedef struct cache_rec cache_rec_t;
typedef struct cache_sem cache_sem_t;

/* ==== 1. Cache-Control (pure) ================================================= */

enum {
    CACHE_CC_NO_CACHE = 1u << 0, /* skip the lookup, store the fresh answer */
    CACHE_CC_NO_STORE = 1u << 1, /* neither read nor write */
};
/* Flags of a request's Cache-Control value (NULL = none): directives are
 * comma-separated and case-insensitive; `max-age=0` counts as no-cache;
 * unknown directives are ignored. */
unsigned cache_control_parse(const char *value, size_t len);

/* ==== 2. policy ================================================================ */

typedef enum cache_scope {
    CACHE_SCOPE_USER = 0, /* the token's sub is part of the key (the default) */
    CACHE_SCOPE_GLOBAL,   /* every user shares answers */
} cache_scope_t;

/* The effective policy of one model: models.<name>.cache over cache:. */
typedef struct cache_policy {
    bool enabled;
    bool semantic;
    int scope; /* cache_scope_t */
    int64_t ttl_ms;
    double max_temperature; /* a request above it is not cached; absent = 1.0 */
    int64_t max_entry_bytes;
} cache_policy_t;

/* cm may be NULL (a model without a cache section). */
void cache_policy_resolve(const conf_cache_t *root, const conf_model_cache_t *cm,
                          cache_policy_t *out);

/* ==== 3. the exact key (pure) =================================================== */

#define CACHE_KEY_LEN 32 /* SHA-256 */

/* Why a request is not looked up / stored (labels of bypass metrics). */
typedef enum cache_bypass {
    CACHE_BYPASS_NONE = 0,
    CACHE_BYPASS_OFF,         /* the model's policy is off */
    CACHE_BYPASS_NO_STORE,    /* Cache-Control: no-store */
    CACHE_BYPASS_NO_CACHE,    /* Cache-Control: no-cache (the answer is still stored) */
    CACHE_BYPASS_TEMPERATURE, /* temperature above the bound (or absent, = 1) */
    CACHE_BYPASS_UNSUPPORTED, /* n > 1, logprobs, a body we cannot key */
    CACHE_BYPASS_NO_USER,     /* scope user but no sub */
    CACHE_BYPASS_COUNT
} cache_bypass_t;
const char *cache_bypass_name(cache_bypass_t b);

/* The key of a chat request: SHA-256 over a canonical JSON of the model
 * (after aliasing), the messages (each message's fields, its text content
 * whitespace-normalised: runs of ASCII, NBSP and ideographic spaces become
 * one space, ends trimmed), every other top-level parameter (sorted, numbers
 * canonical: 0 and 0.0 are one) except those that never change the answer
 * (stream, stream_options, user, metadata, store, service_tier), and `sub`
 * when non-NULL (user scope). 0, or -1 when the body is not an object with
 * a messages array (*why set). */
int cache_key(const json_t *body, const char *model, const char *sub,
              unsigned char key[CACHE_KEY_LEN], cache_bypass_t *why) SL_WUR;

/* Whitespace normalisation of one text, as the key does it (malloc'd;
 * NULL on OOM). */
char *cache_text_normalise(const char *s, size_t len, size_t *outlen);

/* ==== 4. the stored entry, recorder and replayer (pure) ========================= */

/* An assembled answer: per choice its role, content, tool_calls (a JSON
 * array or none) and finish_reason; usage, created, model, id. */
cache_entry_t *cache_entry_new(void);
void cache_entry_free(cache_entry_t *e);
/* Serialised form (compact JSON, what the stores keep). Malloc'd. */
char *cache_entry_encode(const cache_entry_t *e, size_t *len);
cache_entry_t *cache_entry_decode(const char *s, size_t len);
size_t cache_entry_nchoices(const cache_entry_t *e);
/* Choice i's content (NULL when none) and finish_reason (NULL when none). */
const char *cache_entry_content(const cache_entry_t *e, size_t i);
const char *cache_entry_finish(const cache_entry_t *e, size_t i);
/* The wall ms the entry was stored (0 until then) and its usage (NULL when
 * none; borrowed). */
int64_t cache_entry_stored_ms(const cache_entry_t *e);
const json_t *cache_entry_usage(const cache_entry_t *e);

/* Why an answer is not kept. */
typedef enum cache_taint {
    CACHE_TAINT_NONE = 0,
    CACHE_TAINT_ERROR = 1u << 0,     /* a non-2xx status or an error event */
    CACHE_TAINT_FALLBACK = 1u << 1,  /* a fallback tier or the template answered */
    CACHE_TAINT_FILTERED = 1u << 2,  /* an output filter masked or blocked */
    CACHE_TAINT_TRUNCATED = 1u << 3, /* finish_reason length, or a stream without [DONE] */
    CACHE_TAINT_TOO_LARGE = 1u << 4, /* past max_entry_bytes */
    CACHE_TAINT_MALFORMED = 1u << 5, /* not a chat.completion we can replay */
} cache_taint_t;

/* Assembles an entry from a whole chat.completion JSON or from the data
 * payloads of its chat.completion.chunk stream. max_bytes bounds the text
 * kept (past it: TOO_LARGE, and nothing more is kept). */
cache_rec_t *cache_rec_new(int64_t max_bytes);
void cache_rec_free(cache_rec_t *r);
void cache_rec_body(cache_rec_t *r, const json_t *answer);
void cache_rec_event(cache_rec_t *r, const char *data, size_t len);
void cache_rec_taint(cache_rec_t *r, unsigned taint);
/* Taint bits so far (finish_reason length / content_filter and a missing
 * [DONE] are seen by cache_rec_finish). */
unsigned cache_rec_taints(const cache_rec_t *r);
/* The entry when the answer is clean and complete (caller owns it), else
 * NULL with *taint saying why. */
cache_entry_t *cache_rec_finish(cache_rec_t *r, unsigned *taint);

typedef struct cache_replay_opts {
    const char *id;     /* the response id; NULL = the stored one */
    int64_t created;    /* unix seconds; 0 = the stored one */
    bool include_usage; /* stream_options.include_usage: a last chunk with usage */
} cache_replay_opts_t;

/* A chat.completion object (new reference). */
json_t *cache_entry_json(const cache_entry_t *e, const cache_replay_opts_t *o);
/* The stream as SSE data payloads, in order: a role chunk, content chunk,
 * tool_calls chunk, a finish chunk per choice, the usage chunk when asked,
 * then "[DONE]". emit returns 0, or -1 to stop (returned). */
typedef int (*cache_emit_fn)(void *arg, const char *data, size_t len);
int cache_entry_sse(const cache_entry_t *e, const cache_replay_opts_t *o, cache_emit_fn emit,
                    void *arg);
/* The same framed as a text/event-stream body ("data: ...\n\n"). Malloc'd. */
char *cache_entry_sse_body(const cache_entry_t *e, const cache_replay_opts_t *o, size_t *len);
/* The fast path of a hit: the replay pre-rendered at store time (stored id
 * and created), for a decoded entry (a lookup's): the JSON body, or the
 * SSE body with or without the usage chunk. Borrowed, valid while e lives;
 * NULL for an entry not from a store (then render with the above). */
const char *cache_entry_rendered(const cache_entry_t *e, bool stream, bool include_usage,
                                 size_t *len);

/* ==== 5. the stores ============================================================= */

/* The in-process store alone (the cache_t holds one): an LRU bounded by
 * bytes (key + encoded entry + overhead), each entry with its expiry.
 * Thread-safe. */
typedef struct cache_lru cache_lru_t;
cache_lru_t *cache_lru_new(int64_t max_bytes);
void cache_lru_free(cache_lru_t *l);
/* Takes a copy of val. Replaces an entry of the same key. -1 when it can
 * never fit (larger than max_bytes) or on OOM. */
int cache_lru_put(cache_lru_t *l, const unsigned char key[CACHE_KEY_LEN], const char *val,
                  size_t len, int64_t expires_ms, const char *model);
/* A malloc'd copy of the value (NULL: absent or expired at now_ms, which
 * then drops it). A hit makes the entry the most recent. */
char *cache_lru_get(cache_lru_t *l, const unsigned char key[CACHE_KEY_LEN], int64_t now_ms,
                    size_t *len);
void cache_lru_del(cache_lru_t *l, const unsigned char key[CACHE_KEY_LEN]);
size_t cache_lru_count(cache_lru_t *l);
int64_t cache_lru_bytes(cache_lru_t *l);
/* Entries dropped to make room (not expiries). */
uint64_t cache_lru_evictions(cache_lru_t *l);

/* ==== 6. the semantic index ===================================================== */

/* Vectors are unit-normalised, then int8-quantised with one scale each, so
 * cosine = dot(a, b) * sa * sb. Partitions (the system prompt's hash) each
 * hold at most max_per_partition entries (the oldest goes first); an entry
 * names the exact key of the answer it stands for. Thread-safe (a rwlock:
 * lookups share it). */
#define CACHE_SEM_MAX_DIM 8192
/* max_bytes bounds the whole index (vectors, sketches, keys, as allocated):
 * past it the least recently added partitions go, and a partition that
 * alone reaches it stops growing (its oldest entries are overwritten). */
cache_sem_t *cache_sem_new(size_t max_per_partition, size_t max_partitions, size_t max_bytes);
/* Bytes the index holds now. */
size_t cache_sem_bytes(cache_sem_t *s);
void cache_sem_free(cache_sem_t *s);
/* Adds (or refreshes) a vector. The first vector fixes the dimension; a
 * vector of another dimension is refused (-1). */
int cache_sem_add(cache_sem_t *s, const unsigned char part[CACHE_KEY_LEN], const float *vec,
                  size_t dim, const unsigned char key[CACHE_KEY_LEN], int64_t expires_ms);
/* The best entry of the partition with cosine >= threshold, not expired at
 * now_ms: 1 and key / *sim filled, 0 when none. */
int cache_sem_lookup(cache_sem_t *s, const unsigned char part[CACHE_KEY_LEN], const float *vec,
                     size_t dim, double threshold, int64_t now_ms, unsigned char key[CACHE_KEY_LEN],
                     double *sim);
size_t cache_sem_count(cache_sem_t *s);

/* The persisted form of one entry (Redis stream field "e"): part, key,
 * expiry, scale and the int8 vector. Pure. */
char *cache_sem_encode(const unsigned char part[CACHE_KEY_LEN], const float *vec, size_t dim,
                       const unsigned char key[CACHE_KEY_LEN], int64_t expires_ms, size_t *len);
/* Applies a persisted entry to the index (0, or -1 when malformed). */
int cache_sem_apply(cache_sem_t *s, const char *rec, size_t len);

/* int8 dot products: the kernel chosen for this CPU (AVX-512 VNNI, AVX2,
 * or scalar) and the scalar reference. n is any length. */
int32_t cache_dot_i8(const int8_t *a, const int8_t *b, size_t n);
int32_t cache_dot_i8_ref(const int8_t *a, const int8_t *b, size_t n);
/* Name of the kernel cache_dot_i8 uses ("avx512vnni", "avx2", "scalar"). */
const char *cache_dot_kernel(void);

/* The /v1/embeddings request body for this text (malloc'd JSON) and the
 * parser of its answer: data[0].embedding as floats (malloc'd, *dim set);
 * NULL when the answer is not an embeddings list of numbers. */
char *cache_embed_body(const char *model, const char *text, size_t len, size_t *outlen);
float *cache_embed_parse(const char *body, size_t len, size_t *dim);

/* What the semantic cache embeds for a request: the last user message's
 * text (malloc'd, normalised) and the partition (SHA-256 over the model,
 * the sub in user scope, and the system messages' text). NULL when the
 * request has no user text, or more than one user turn without multi_turn. */
char *cache_sem_text(const json_t *body, const char *model, const char *sub, bool multi_turn,
                     unsigned char part[CACHE_KEY_LEN], size_t *len);

/* ==== 7. the cache, per request ================================================ */

/* The shared parts: the in-process store (cache.max_bytes) or Redis
 * (redis.url), and the semantic index (cache.semantic sizes). Sizes and
 * stores keep their start value; policies come from each request's conf
 * (cache_req_in_t.conf), so a reload applies to the next request. NULL with
 * err on a bad value (an embed_model naming no model). */
cache_t *cache_new(const conf_t *conf, char *err, size_t errlen) SL_WUR;
void cache_free(cache_t *c);
cache_lru_t *cache_lru(cache_t *c);
cache_sem_t *cache_semantic(cache_t *c);
bool cache_uses_redis(const cache_t *c);

/* A worker's Redis client (none when the cache has no Redis: base may then
 * be NULL). With a semantic cache configured, the first worker also tails
 * the semantic stream. */
cache_worker_t *cache_worker_new(cache_t *c, struct event_base *base, char *err,
                                 size_t errlen) SL_WUR;
/* Free every cache_req_t of this worker first (a pending lookup holds a
 * call of its Redis client). */
void cache_worker_free(cache_worker_t *w);

typedef struct cache_req_in {
    const conf_t *conf;        /* the request's conf (borrowed, outlives the request);
                                  NULL = cache_new's, which must then still be alive */
    const json_t *body;        /* the request as forwarded (after filters and clamps) */
    const char *model;         /* the client's model name: picks the policy (conf models) */
    const char *key_model;     /* after aliasing (upstream/served); NULL = model */
    const char *sub;           /* the token's sub; NULL = anonymous */
    const char *cache_control; /* the header's value; NULL = none */
} cache_req_in_t;

typedef enum cache_state {
    CACHE_BYPASS = 0, /* no lookup (cache_req_bypass() says why); maybe still store */
    CACHE_MISS,       /* looked up (or about to be), nothing found */
    CACHE_HIT,        /* cache_req_entry() is the answer */
} cache_state_t;

/* Per-request state; NULL only on OOM. Never fails on bad input: such a
 * request is a bypass. */
cache_req_t *cache_req_new(cache_t *c, const cache_req_in_t *in);
void cache_req_free(cache_req_t *q);
cache_state_t cache_req_state(const cache_req_t *q);
cache_bypass_t cache_req_bypass(const cache_req_t *q);
/* X-Sluice-Cache's value: "hit", "miss" or "bypass". */
const char *cache_req_header(const cache_req_t *q);
/* Whether the answer will be recorded (policy on, no no-store, cacheable). */
bool cache_req_storing(const cache_req_t *q);
bool cache_req_stream(const cache_req_t *q);
bool cache_req_include_usage(const cache_req_t *q);
const unsigned char *cache_req_key(const cache_req_t *q);
/* A hit's entry (borrowed, valid while q lives) and its age in seconds. */
const cache_entry_t *cache_req_entry(const cache_req_t *q);
int64_t cache_req_age_s(const cache_req_t *q, int64_t now_ms);
/* Whether a semantic lookup applies (model has it on, a miss, single turn). */
bool cache_req_semantic(const cache_req_t *q);
/* The embeddings request for this request (malloc'd; NULL when none), the
 * model (a key under models) to send it to and its deadline. */
char *cache_req_embed_body(const cache_req_t *q, size_t *len);
const char *cache_req_embed_model(const cache_req_t *q);
int64_t cache_req_embed_deadline_ms(const cache_req_t *q);
/* Whether a hit charges the token budget its stored usage (cache.charge_tokens). */
bool cache_req_charge_tokens(const cache_req_t *q);
/* The embeddings answer: 0, or -1 when unusable (then go upstream). */
int cache_req_embed_answer(cache_req_t *q, const char *body, size_t len);

typedef enum cache_rc {
    CACHE_ERROR = -1, /* out of memory: treat as a miss */
    CACHE_DONE = 0,   /* answered now: cache_req_state() tells */
    CACHE_PENDING = 1 /* cb runs later on the worker's thread, exactly once */
} cache_rc_t;
typedef void (*cache_cb)(void *arg, cache_req_t *q);

/* The exact lookup, or (after cache_req_embed_answer) the semantic one.
 * Counted in the metrics (hits, misses, semantic lookups and latency). */
cache_rc_t cache_lookup(cache_worker_t *w, cache_req_t *q, int64_t now_ms, cache_cb cb, void *arg);
/* The client left while a lookup was pending: the callback will not run. */
void cache_lookup_cancel(cache_req_t *q);

/* The answer path. */
void cache_req_record_body(cache_req_t *q, const json_t *answer);
void cache_req_record_event(cache_req_t *q, const char *data, size_t len);
void cache_req_taint(cache_req_t *q, unsigned taint);
/* Stores a clean answer (fire and forget): 1 stored, 0 not (tainted, not
 * storing, a hit), -1 OOM. The semantic index gets its vector too. */
int cache_store(cache_worker_t *w, cache_req_t *q, int64_t now_ms);

#endif
