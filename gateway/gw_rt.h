/*
 * gw_rt.h — the runtime: what one conf_t becomes once resolved (upstream
 * pools and servers, models, listeners, TLS contexts, the policy modules'
 * compiled state), immutable once built and refcounted. A request holds a
 * reference to the runtime it started with, so a reload never changes a
 * request half-way. Also gw_shared_t: what outlives reloads (auth stores,
 * breakers, retry budgets, in-process engines).
 */
#ifndef GW_RT_H
#define GW_RT_H

#include <netinet/in.h>
#include <openssl/ssl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "common/metrics.h"
#include "common/sl.h"
#include "conf/conf.h"
#include "gateway/gw_types.h"

/* ---- runtime (immutable once built, refcounted) ------------------------- */

/* One upstream server. The mutable part (failures, ejection, active count)
 * is shared by all workers through atomics. */
struct gw_srv_rt {
    gw_pool_rt_t *pool;
    size_t index; /* 0..rt->nservers-1, indexes per-worker arrays */
    char *url;
    char *host;        /* for SNI, certificate checks */
    char *host_header; /* "host" or "host:port" */
    char *base_path;   /* the URL's path, "/v1" when it has none (conf_server_t) */
    size_t host_header_len, base_path_len; /* their strlen: every request's head */
    int port;
    bool https;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    int weight;
    struct fb_breaker *breaker; /* circuit breaker (kept across reloads) */
    _Atomic int active;         /* requests in flight, all workers */
    _Atomic int idle;           /* pooled keep-alive connections, all workers */
    sl_mseries_t *m_conn_new, *m_conn_reused;
    sl_mseries_t *m_idle, *m_idle_closed; /* idle pooled now; closed for idleness */
};

struct gw_pool_rt {
    const conf_upstream_t *conf;
    const char *name;
    gw_srv_rt_t **servers;
    size_t nservers;
    char *auth_header; /* "Authorization: Bearer ...\r\n" or NULL */
    size_t auth_header_len;
    SSL_CTX *ssl_ctx; /* for https:// servers */
    sl_mseries_t *m_ttfb;
    conf_fb_circuit_t circuit; /* fallback.circuit with this pool's max_fails/eject */
    struct fb_budget *budget;  /* retry budget (kept across reloads) */
    struct mdl_engine *engine; /* kind engine: the in-process model (no servers) */
    gw_sup_t *sup;             /* a supervised command (supervise.c), or NULL */
};

struct gw_model_rt {
    const char *name;            /* client-facing */
    const char *served;          /* upstream's name */
    size_t name_len, served_len; /* their strlen: asked on every request */
    uint64_t gen;                /* its rt's generation: with its address, unique to this model */
    char *served_json; /* served as a JSON string, quotes and all, for the body's "model" splice
                        * (NULL: too long for one; the tree rewrites it) */
    size_t served_json_len;
    bool alias; /* served differs from name: the body is rewritten */
    gw_pool_rt_t *pool;
    const conf_model_t *conf; /* fault:, queue: */
};

struct gw_listen_rt {
    size_t index;  /* conf->listen[index]; TLS context in rt->listen_ssl[index] */
    char *address; /* a copy: listeners outlive the conf they came from */
    int fd;        /* shared by every worker */
    bool admin;    /* the admin listener */
};

struct gw_rt {
    _Atomic int refs;
    uint64_t generation;
    conf_t *conf;
    gw_pool_rt_t *pools;
    size_t npools;
    gw_srv_rt_t *servers; /* all servers of all pools */
    size_t nservers;
    gw_model_rt_t *models;
    size_t nmodels;
    char *models_json; /* the GET /v1/models body */
    size_t models_json_len;
    SSL_CTX **listen_ssl;             /* per conf listen item (NULL when plain) */
    struct auth *auth;                /* NULL when auth is off */
    struct flt_ruleset *filters;      /* content filters (reference held) */
    struct fb_tmpl *tmpl;             /* template replies (NULL when off) */
    gw_pool_rt_t *local;              /* fallback.local: the local tier's pool, or NULL */
    const gw_model_rt_t *auto_model;  /* routing.auto_model */
    struct pcre2_real_code_8 *intent; /* routing.intent, compiled */
    gw_shared_t *shared;              /* what this runtime borrowed engines from */
    char *admin_key;                  /* auth.admin_key_env's value (fault header), or NULL */
    /* What a policy module compiles per runtime, one slot per hook
     * (gw_hook_index); built by its rt_build, freed by its rt_free. */
    void *hook_state[GW_MAX_HOOKS];
};

/* What outlives a reload and the runtimes built on it: the auth stores, the
 * breakers and the retry budgets (per upstream name). Main thread only
 * while building; the objects themselves are thread-safe. */
struct gw_shared {
    struct auth_stores *auth_stores;
    struct fb_breakers *breakers;
    struct gw_budget_slot {
        char *name;
        struct fb_budget *budget;
    } * budgets;
    size_t nbudgets;
    struct gw_engine_slot *engines; /* engine_gw.c */
};

gw_shared_t *gw_shared_new(void);
void gw_shared_free(gw_shared_t *sh);

/* Builds the runtime for c (takes ownership of c): resolves server names,
 * reads API keys from the environment, loads TLS material, builds the auth
 * verifier (on the process-wide stores, borrowed) and the filter rules.
 * NULL with err filled on failure (c is freed then). */
gw_rt_t *gw_rt_new(conf_t *c, gw_shared_t *sh, char *err, size_t errlen) SL_WUR;
gw_rt_t *gw_rt_ref(gw_rt_t *rt);
void gw_rt_unref(gw_rt_t *rt);
const gw_model_rt_t *gw_rt_model(const gw_rt_t *rt, const char *name, size_t len);
/* The client's /v1/REST goes to a server as srv->base_path + /REST
 * (docs/conf-reference.md): the part of target after "/v1" ("/REST" and its
 * query), or NULL when target is not under /v1/ (never forwarded). */
const char *gw_rt_v1_rest(const char *target, size_t len);

/* engine_gw.c: the process-wide engines, by upstream (kept across reloads
 * when unchanged). */
struct mdl_engine *gw_engine_get(gw_shared_t *sh, const conf_upstream_t *cu, char *err,
                                 size_t errlen);
void gw_engine_put(gw_shared_t *sh, struct mdl_engine *e);
/* Shutdown: stop every engine (their last callbacks reach the mailboxes);
 * then free the registry. */
void gw_engines_stop(gw_shared_t *sh);
void gw_engines_free(gw_shared_t *sh);

#endif
