/*
 * conf_keys.c — THE table of configuration keys: one row per YAML key
 * (name, type, offsetof target, default, bounds, reloadable, doc), plus the
 * few checks that relate a value to its neighbours. conf.c walks these rows
 * for parsing, defaults, bounds, errors, free, reload and the reference;
 * nothing else in sluice lists keys.
 *
 * Recipe: adding a section (auth, ratelimit, filters, fallback, redis,
 * fault, ...) is
 *   1. conf.h: a `conf_foo_t` struct with the fields (int64_t for integers,
 *      sizes (bytes) and durations (ms); bool; char * for strings; int for
 *      enums; `char **x; size_t nx;` for a list of strings; `conf_kv_t *x;
 *      size_t nx;` for a string map; `T *x; size_t nx;` for a list or a
 *      named map of sections, with `int line;` and, for a map, `char *name;`
 *      in T), and a `conf_foo_t foo;` field in conf_t;
 *   2. here: a `foo_keys[]` array of rows, its `foo_table`, and one row in
 *      root_keys[] pointing at it; optional checks beside them;
 *   3. then the tests say what is left: tests/unit/test_conf checks the table
 *      (offsets, bounds, defaults, reload flags), that conf/sluice.yaml
 *      mentions every key, and that docs/conf-reference.md matches the
 *      table — regenerate it with
 *        SLUICE_CONF_REFERENCE_UPDATE=1 build/tests/test_conf
 *      and document the keys in conf/sluice.yaml.
 * Nothing in conf.c changes. Mark a row CONF_RELOAD only if the code that
 * reads it picks up a new conf_t on SIGHUP.
 */
#include "conf/conf.h"
#include "conf/conf_internal.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/redis.h"

#define MS(x)      ((int64_t)(x))
#define SEC(x)     ((int64_t)(x)*1000)
#define MINUTES(x) ((int64_t)(x)*60000)
#define HOUR(x)    ((int64_t)(x)*3600000)
#define DAY(x)     ((int64_t)(x)*86400000)
#define KIB(x)     ((int64_t)(x) << 10)
#define MIB(x)     ((int64_t)(x) << 20)
#define GIB(x)     ((int64_t)(x) << 30)

#define R                   CONF_RELOAD
#define TABLE(keys_, type_) .keys = (keys_), .nkeys = SL_ARRAY_LEN(keys_), .size = sizeof(type_)

/* ---- checks ------------------------------------------------------------------ */

/* A DNS name or an IPv4 literal: letters, digits, '-', '.', '_'. */
static bool conf_host_ok(const char *h, size_t n)
{
    if (n == 0 || n > 253)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = h[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '.' || c == '_'))
            return false;
    }
    return true;
}

/* "HOST", "[V6]", then optional ":PORT" (required when dflt_port is 0),
 * with nothing after. Fills host (brackets removed) and port. */
static int conf_parse_hostport(const char *s, int dflt_port, char *host, int *port, char *msg,
                               size_t msglen)
{
    const char *hs = s, *he, *rest;
    if (*s == '[') {
        he = strchr(s, ']');
        if (!he) {
            snprintf(msg, msglen, "unclosed '[' in \"%.80s\"", s);
            return -1;
        }
        hs = s + 1;
        rest = he + 1;
        char v6[CONF_HOST_MAX];
        struct in6_addr a;
        size_t n = (size_t)(he - hs);
        if (n == 0 || n >= sizeof(v6)) {
            snprintf(msg, msglen, "bad IPv6 address in \"%.80s\"", s);
            return -1;
        }
        memcpy(v6, hs, n);
        v6[n] = '\0';
        if (inet_pton(AF_INET6, v6, &a) != 1) {
            snprintf(msg, msglen, "bad IPv6 address \"%.80s\"", v6);
            return -1;
        }
    } else {
        he = strchr(s, ':');
        if (he && strchr(he + 1, ':')) {
            snprintf(msg, msglen, "an IPv6 address needs brackets: \"[::1]:8080\"");
            return -1;
        }
        if (!he)
            he = s + strlen(s);
        rest = he;
        if (!conf_host_ok(hs, (size_t)(he - hs))) {
            snprintf(msg, msglen, "bad host in \"%.80s\"", s);
            return -1;
        }
    }
    size_t hn = (size_t)(he - hs);
    memcpy(host, hs, hn);
    host[hn] = '\0';

    if (*rest == '\0' && dflt_port) {
        *port = dflt_port;
        return 0;
    }
    if (*rest != ':') {
        snprintf(msg, msglen, "expected HOST:PORT, got \"%.80s\"", s);
        return -1;
    }
    const char *p = rest + 1;
    long v = 0;
    if (!*p || strlen(p) > 5)
        v = -1;
    for (const char *q = p; *q && v >= 0; q++)
        v = (*q >= '0' && *q <= '9') ? v * 10 + (*q - '0') : -1;
    if (v < 1 || v > 65535) {
        snprintf(msg, msglen, "bad port \"%.20s\" (1..65535)", p);
        return -1;
    }
    *port = (int)v;
    return 0;
}

static int listen_address_check(void *obj, char *msg, size_t msglen)
{
    conf_listen_t *l = obj;
    return conf_parse_hostport(l->address, 0, l->host, &l->port, msg, msglen);
}

static int listen_tls_check(conf_ctx_t *ctx, void *obj, int line)
{
    const conf_listen_t *l = obj;
    if (!l->tls_cert != !l->tls_key)
        return conf_errorf(ctx, line, NULL, "needs both cert and key (or neither)");
    return 0;
}

static int listen_check(conf_ctx_t *ctx, void *obj, int line)
{
    const conf_listen_t *l = obj;
    for (size_t i = 0; i < l->nprotocols; i++)
        if (strcmp(l->protocols[i], "h2") != 0 && strcmp(l->protocols[i], "http/1.1") != 0)
            return conf_errorf(ctx, line, "protocols", "unknown protocol \"%.40s\" (h2, http/1.1)",
                               l->protocols[i]);
    if (l->nprotocols == 2 && strcmp(l->protocols[0], l->protocols[1]) == 0)
        return conf_errorf(ctx, line, "protocols", "\"%.40s\" twice", l->protocols[0]);
    return 0;
}

static int admin_address_check(void *obj, char *msg, size_t msglen)
{
    conf_admin_t *a = obj;
    if (strcmp(a->address, "off") == 0) {
        a->host[0] = '\0';
        a->port = 0;
        return 0;
    }
    return conf_parse_hostport(a->address, 0, a->host, &a->port, msg, msglen);
}

/* A URL path as a base path: RFC 3986 path characters only (percent
 * escapes well formed), no "." or ".." segment, no empty segment, no
 * query or fragment; the trailing '/' dropped. "" and "/" mean "/v1", the
 * OpenAI API's own root, so the mapping is the same rule for every URL. */
static int conf_base_path(const char *p, char *out, size_t outlen, char *msg, size_t msglen)
{
    size_t n = strlen(p);
    while (n > 0 && p[n - 1] == '/')
        n--;
    if (n == 0) {
        snprintf(out, outlen, "/v1");
        return 0;
    }
    if (n >= outlen) {
        snprintf(msg, msglen, "base path longer than %zu bytes", outlen - 1);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '?' || c == '#') {
            snprintf(msg, msglen,
                     "must not have a query or fragment; the path is a base path: /v1/... of a "
                     "request goes to BASE/...");
            return -1;
        }
        if (c == '%') {
            if (i + 2 >= n || !isxdigit((unsigned char)p[i + 1]) ||
                !isxdigit((unsigned char)p[i + 2])) {
                snprintf(msg, msglen, "bad percent escape in the path");
                return -1;
            }
            continue;
        }
        if (!(isalnum(c) || strchr("-._~!$&'()*+,;=:@/", c))) {
            snprintf(msg, msglen, "character 0x%02x not allowed in the path", c);
            return -1;
        }
    }
    /* Segment by segment: "//", "/./" and "/../" would be read differently
     * by different servers. */
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && p[j] != '/')
            j++;
        size_t seg = j - i - 1;
        if (seg == 0 || (seg == 1 && p[i + 1] == '.') ||
            (seg == 2 && p[i + 1] == '.' && p[i + 2] == '.')) {
            snprintf(msg, msglen, "empty, \".\" or \"..\" segment in the path \"%.*s\"",
                     (int)SL_MIN(n, (size_t)80), p);
            return -1;
        }
        i = j;
    }
    memcpy(out, p, n);
    out[n] = '\0';
    return 0;
}

static int server_url_check(void *obj, char *msg, size_t msglen)
{
    conf_server_t *s = obj;
    const char *u = s->url;
    if (strncmp(u, "http://", 7) == 0) {
        s->https = false;
        u += 7;
    } else if (strncmp(u, "https://", 8) == 0) {
        s->https = true;
        u += 8;
    } else {
        snprintf(msg, msglen, "expected http://HOST[:PORT][/PATH] or https://HOST[:PORT][/PATH]");
        return -1;
    }
    char auth[CONF_HOST_MAX + 16];
    size_t n = strcspn(u, "/?#");
    const char *tail = u + n;
    if (*tail == '?' || *tail == '#') {
        snprintf(msg, msglen, "must not have a query or fragment (\"%.40s\")", tail);
        return -1;
    }
    if (memchr(u, '@', n)) {
        snprintf(msg, msglen, "must not have user info (use api_key_env for credentials)");
        return -1;
    }
    if (n == 0 || n >= sizeof(auth)) {
        snprintf(msg, msglen, "bad host in \"%.80s\"", s->url);
        return -1;
    }
    memcpy(auth, u, n);
    auth[n] = '\0';
    if (conf_parse_hostport(auth, s->https ? 443 : 80, s->host, &s->port, msg, msglen) != 0)
        return -1;
    return conf_base_path(tail, s->base_path, sizeof(s->base_path), msg, msglen);
}

static int api_key_env_check(void *obj, char *msg, size_t msglen)
{
    const char *v = ((const conf_upstream_t *)obj)->api_key_env;
    for (const char *p = v; *p; p++) {
        char c = *p;
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' ||
                  (p != v && c >= '0' && c <= '9');
        if (!ok) {
            snprintf(msg, msglen, "expected an environment variable name ([A-Za-z_][A-Za-z0-9_]*)");
            return -1;
        }
    }
    return 0;
}

static int upstream_timeouts_check(conf_ctx_t *ctx, void *obj, int line)
{
    const conf_upstream_t *u = obj;
    char a[32], b[32];
    conf_format_duration(u->total_timeout_ms, b, sizeof(b));
    if (u->first_byte_timeout_ms > u->total_timeout_ms) {
        conf_format_duration(u->first_byte_timeout_ms, a, sizeof(a));
        return conf_errorf(ctx, line, "first_byte", "longer than total (%s > %s)", a, b);
    }
    if (u->connect_timeout_ms > u->total_timeout_ms) {
        conf_format_duration(u->connect_timeout_ms, a, sizeof(a));
        return conf_errorf(ctx, line, "connect", "longer than total (%s > %s)", a, b);
    }
    return 0;
}

static int log_level_check(void *obj, char *msg, size_t msglen)
{
    if (sl_log_level_parse(((const conf_log_t *)obj)->level) < 0) {
        snprintf(msg, msglen, "expected one of debug, info, warn, error");
        return -1;
    }
    return 0;
}

/* Rules across sections, once everything is parsed. */
static int root_check(conf_ctx_t *ctx, void *obj, int line)
{
    const conf_t *c = obj;
    for (size_t i = 0; i < c->nmodels; i++) {
        const conf_model_t *m = &c->models[i];
        if (!conf_upstream_find(c, m->upstream)) {
            char sub[CONF_PATH_MAX];
            snprintf(sub, sizeof(sub), "models.%s.upstream", m->name);
            return conf_errorf_key(ctx, m->line, sub, "no upstream named \"%s\" under upstreams",
                                   m->upstream);
        }
    }
    const conf_fallback_t *fb = &c->fallback;
    if (fb->local.upstream && !conf_upstream_find(c, fb->local.upstream))
        return conf_errorf(ctx, line, "fallback.local.upstream",
                           "no upstream named \"%s\" under upstreams", fb->local.upstream);
    if (fb->queue.store == CONF_QUEUE_STORE_REDIS && !c->redis.url)
        return conf_errorf(ctx, line, "fallback.queue.store", "redis needs redis.url");
    if (c->routing.local_first && !fb->local.upstream)
        return conf_errorf(ctx, line, "routing.local_first", "needs fallback.local.upstream");
    if (c->routing.auto_model && !conf_model_find(c, c->routing.auto_model))
        return conf_errorf(ctx, line, "routing.auto_model", "no model named \"%s\" under models",
                           c->routing.auto_model);
    if (c->routing.auto_model && strcmp(c->routing.auto_model, "auto") == 0)
        return conf_errorf(ctx, line, "routing.auto_model", "must name a real model");
    return 0;
}

/* ---- listen ---------------------------------------------------------------- */

static const conf_key_t listen_tls_keys[] = {
    {.name = "cert",
     .type = CONF_STRING,
     .off = offsetof(conf_listen_t, tls_cert),
     .doc = "PEM certificate chain file; with key, makes this a TLS (1.2+) listener"},
    {.name = "key",
     .type = CONF_STRING,
     .off = offsetof(conf_listen_t, tls_key),
     .doc = "PEM private key file of cert"},
};
/* A YAML-only grouping: its fields live in conf_listen_t itself. */
static const conf_table_t listen_tls_table = {TABLE(listen_tls_keys, conf_listen_t),
                                              .check = listen_tls_check};

static const conf_key_t listen_keys[] = {
    {.name = "address",
     .type = CONF_STRING,
     .off = offsetof(conf_listen_t, address),
     .check = listen_address_check,
     .flags = CONF_REQUIRED,
     .doc = "HOST:PORT or [IPV6]:PORT to accept clients on"},
    {.name = "tls",
     .type = CONF_STRUCT,
     .off = 0,
     .sub = &listen_tls_table,
     .doc = "TLS termination: cert and key, both or neither"},
    {.name = "protocols",
     .type = CONF_STRLIST,
     .off = offsetof(conf_listen_t, protocols),
     .count_off = offsetof(conf_listen_t, nprotocols),
     .min = 0,
     .max = 2,
     .doc = "TLS listeners: what ALPN offers, in preference order (h2, http/1.1); none = both"},
    {.name = "h2c",
     .type = CONF_BOOL,
     .off = offsetof(conf_listen_t, h2c),
     .def = "false",
     .doc = "plain listeners: accept HTTP/2 with prior knowledge (no Upgrade: h2c)"},
};
static const conf_table_t listen_table = {TABLE(listen_keys, conf_listen_t), .has_line = true,
                                          .line_off = offsetof(conf_listen_t, line),
                                          .check = listen_check};

/* ---- admin ------------------------------------------------------------------- */

static const conf_key_t admin_keys[] = {
    {.name = "address",
     .type = CONF_STRING,
     .off = offsetof(conf_admin_t, address),
     .def = "127.0.0.1:9090",
     .check = admin_address_check,
     .doc = "HOST:PORT of the admin listener (/metrics, /healthz, /readyz), or off"},
};
static const conf_table_t admin_table = {TABLE(admin_keys, conf_admin_t)};

/* ---- limits ------------------------------------------------------------------ */

static const conf_key_t limits_keys[] = {
    {.name = "request_line_bytes",
     .type = CONF_SIZE,
     .off = offsetof(conf_limits_t, request_line_bytes),
     .def = "8k",
     .min = 256,
     .max = MIB(1),
     .flags = R,
     .doc = "longest request line; longer gets 414"},
    {.name = "header_bytes",
     .type = CONF_SIZE,
     .off = offsetof(conf_limits_t, header_bytes),
     .def = "16k",
     .min = KIB(1),
     .max = MIB(1),
     .flags = R,
     .doc = "largest request header block; larger gets 431"},
    {.name = "header_lines",
     .type = CONF_INT,
     .off = offsetof(conf_limits_t, header_lines),
     .def = "100",
     .min = 1,
     .max = 10000,
     .flags = R,
     .doc = "most request header lines; more gets 431"},
    {.name = "max_body_bytes",
     .type = CONF_SIZE,
     .off = offsetof(conf_limits_t, max_body_bytes),
     .def = "1m",
     .min = KIB(1),
     .max = GIB(1),
     .flags = R,
     .doc = "largest request body; larger gets 413"},
    {.name = "header_timeout",
     .type = CONF_DURATION,
     .off = offsetof(conf_limits_t, header_timeout_ms),
     .def = "10s",
     .min = MS(100),
     .max = HOUR(1),
     .flags = R,
     .doc = "deadline for a request's line and headers; then 408"},
    {.name = "body_timeout",
     .type = CONF_DURATION,
     .off = offsetof(conf_limits_t, body_timeout_ms),
     .def = "30s",
     .min = MS(100),
     .max = HOUR(1),
     .flags = R,
     .doc = "deadline for a request's body; then 408"},
    {.name = "keepalive_timeout",
     .type = CONF_DURATION,
     .off = offsetof(conf_limits_t, keepalive_timeout_ms),
     .def = "60s",
     .min = MS(100),
     .max = HOUR(1),
     .flags = R,
     .doc = "idle time allowed between requests on a connection"},
    {.name = "send_timeout",
     .type = CONF_DURATION,
     .off = offsetof(conf_limits_t, send_timeout_ms),
     .def = "60s",
     .min = MS(100),
     .max = HOUR(1),
     .flags = R,
     .doc = "a client that reads nothing for this long is disconnected"},
    {.name = "max_connections",
     .type = CONF_INT,
     .off = offsetof(conf_limits_t, max_connections),
     .def = "10000",
     .min = 1,
     .max = 1000000,
     .flags = R,
     .doc = "client connections per worker; above it accepting pauses"},
    {.name = "keepalive_requests",
     .type = CONF_INT,
     .off = offsetof(conf_limits_t, keepalive_requests),
     .def = "1000",
     .min = 1,
     .max = 1000000,
     .flags = R,
     .doc = "requests served on one client connection, then close"},
};
static const conf_table_t limits_table = {TABLE(limits_keys, conf_limits_t)};

/* ---- upstreams ---------------------------------------------------------------- */

static const char *const balance_names[] = {"round_robin", "least_conn", NULL};

static const conf_key_t server_keys[] = {
    {.name = "url",
     .type = CONF_STRING,
     .off = offsetof(conf_server_t, url),
     .check = server_url_check,
     .flags = CONF_REQUIRED | R,
     .doc = "http[s]://HOST[:PORT][/BASE] (port 80 / 443): a request for /v1/REST goes to "
            "BASE/REST (https://api.groq.com/openai/v1); no path = /v1"},
    {.name = "weight",
     .type = CONF_INT,
     .off = offsetof(conf_server_t, weight),
     .def = "1",
     .min = 1,
     .max = 1000,
     .flags = R,
     .doc = "share of requests for round_robin"},
};
static const conf_table_t server_table = {TABLE(server_keys, conf_server_t), .has_line = true,
                                          .line_off = offsetof(conf_server_t, line)};

static const conf_key_t upstream_tls_keys[] = {
    {.name = "ca_file",
     .type = CONF_STRING,
     .off = offsetof(conf_upstream_t, tls_ca_file),
     .flags = R,
     .doc = "PEM CA bundle verifying https:// servers (default: the system's store)"},
};
static const conf_table_t upstream_tls_table = {TABLE(upstream_tls_keys, conf_upstream_t)};

static const conf_key_t upstream_timeout_keys[] = {
    {.name = "connect",
     .type = CONF_DURATION,
     .off = offsetof(conf_upstream_t, connect_timeout_ms),
     .def = "2s",
     .min = MS(10),
     .max = MINUTES(10),
     .flags = R,
     .doc = "deadline to connect (and finish TLS) to a server"},
    {.name = "first_byte",
     .type = CONF_DURATION,
     .off = offsetof(conf_upstream_t, first_byte_timeout_ms),
     .def = "15s",
     .min = MS(10),
     .max = HOUR(1),
     .flags = R,
     .doc = "deadline from sending the request to the first byte"},
    {.name = "total",
     .type = CONF_DURATION,
     .off = offsetof(conf_upstream_t, total_timeout_ms),
     .def = "60s",
     .min = MS(10),
     .max = DAY(1),
     .flags = R,
     .doc = "deadline for the whole upstream exchange, streams included"},
};
static const conf_table_t upstream_timeout_table = {TABLE(upstream_timeout_keys, conf_upstream_t),
                                                    .check = upstream_timeouts_check};

static const conf_key_t engine_keys[] = {
    {.name = "model",
     .type = CONF_STRING,
     .off = offsetof(conf_engine_t, model),
     .flags = R,
     .doc = "GGUF file of the in-process model (qwen2 architecture); loaded at start and on "
            "reload"},
    {.name = "threads",
     .type = CONF_INT,
     .off = offsetof(conf_engine_t, threads),
     .def = "1",
     .min = 1,
     .max = 256,
     .flags = R,
     .doc = "compute threads of the engine (generation never runs on an event-loop thread)"},
    {.name = "context",
     .type = CONF_INT,
     .off = offsetof(conf_engine_t, context),
     .def = "4096",
     .min = 64,
     .max = 131072,
     .flags = R,
     .doc = "tokens per sequence, prompt and answer"},
    {.name = "max_queue",
     .type = CONF_INT,
     .off = offsetof(conf_engine_t, max_queue),
     .def = "8",
     .min = 0,
     .max = 10000,
     .flags = R,
     .doc = "requests waiting behind the running one; beyond it the next tier answers"},
    {.name = "system_prompt",
     .type = CONF_STRING,
     .off = offsetof(conf_engine_t, system_prompt),
     .flags = R,
     .doc = "system message for conversations without one (its state is computed once); "
            "default Qwen's own"},
    {.name = "max_batch",
     .type = CONF_INT,
     .off = offsetof(conf_engine_t, max_batch),
     .def = "8",
     .min = 1,
     .max = 64,
     .flags = R,
     .doc = "requests generated at once (continuous batching: one pass over the weights per "
            "step serves all), each with its own KV cache"},
};
static const conf_table_t engine_table = {TABLE(engine_keys, conf_engine_t)};

/* An upstream is model servers, or the in-process engine: one of the two. */
static int upstream_kind_check(conf_ctx_t *ctx, void *obj, int line)
{
    const conf_upstream_t *u = obj;
    if (u->ncommand && !u->nservers)
        return conf_errorf(ctx, line, "command", "needs servers (where the command listens)");
    if (u->engine.model && u->nservers)
        return conf_errorf(ctx, line, "engine", "an upstream has servers or an engine, not both");
    if (!u->engine.model && !u->nservers)
        return conf_errorf(ctx, line, "servers", "required (or engine: { model })");
    return 0;
}

static const conf_key_t upstream_keys[] = {
    {.name = "servers",
     .type = CONF_LIST,
     .off = offsetof(conf_upstream_t, servers),
     .count_off = offsetof(conf_upstream_t, nservers),
     .min = 0,
     .max = 256,
     .sub = &server_table,
     .flags = R,
     .doc = "the servers of this pool (required unless engine is set)"},
    {.name = "engine",
     .type = CONF_STRUCT,
     .off = offsetof(conf_upstream_t, engine),
     .sub = &engine_table,
     .flags = R,
     .doc = "instead of servers: sluice's own in-process model (model/)"},
    {.name = "command",
     .type = CONF_STRLIST,
     .off = offsetof(conf_upstream_t, command),
     .count_off = offsetof(conf_upstream_t, ncommand),
     .min = 0,
     .max = 256,
     .flags = R,
     .doc = "a model server for this pool that sluice starts, health-checks (GET /v1/models "
            "on the first server) before use, and restarts with backoff: program and arguments "
            "(a reload that changes it is refused: restart)"},
    {.name = "balance",
     .type = CONF_ENUM,
     .off = offsetof(conf_upstream_t, balance),
     .def = "round_robin",
     .enums = balance_names,
     .flags = R,
     .doc = "round_robin (weighted) or least_conn"},
    {.name = "api_key_env",
     .type = CONF_STRING,
     .off = offsetof(conf_upstream_t, api_key_env),
     .check = api_key_env_check,
     .flags = R,
     .doc = "environment variable whose value sluice sends as `Authorization: Bearer`"},
    {.name = "tls",
     .type = CONF_STRUCT,
     .off = 0,
     .sub = &upstream_tls_table,
     .flags = R,
     .doc = "TLS toward https:// servers"},
    {.name = "keepalive",
     .type = CONF_INT,
     .off = offsetof(conf_upstream_t, keepalive),
     .def = "10000",
     .min = 0,
     .max = 100000,
     .flags = R,
     .doc = "most idle keep-alive connections kept per server per worker; the pool follows "
            "the recent peak of concurrent requests below it (idle ones close after "
            "keepalive_timeout); 0 = none"},
    {.name = "keepalive_timeout",
     .type = CONF_DURATION,
     .off = offsetof(conf_upstream_t, keepalive_timeout_ms),
     .def = "4s",
     .min = MS(100),
     .max = HOUR(1),
     .flags = R,
     .doc = "an idle keep-alive connection is closed after this long (below the server's own "
            "idle timeout: uvicorn's is 5s)"},
    {.name = "timeouts",
     .type = CONF_STRUCT,
     .off = 0,
     .sub = &upstream_timeout_table,
     .flags = R,
     .doc = "upstream deadlines"},
    {.name = "max_fails",
     .type = CONF_INT,
     .off = offsetof(conf_upstream_t, max_fails),
     .def = "0",
     .min = 0,
     .max = 1000,
     .flags = R,
     .doc = "consecutive failures (connect error, 5xx) that open a server's circuit breaker; "
            "0 = fallback.circuit.failures"},
    {.name = "eject",
     .type = CONF_DURATION,
     .off = offsetof(conf_upstream_t, eject_ms),
     .def = "0",
     .min = 0,
     .max = HOUR(1),
     .flags = R,
     .doc = "how long an open breaker keeps a server out before a probe; "
            "0 = fallback.circuit.cooldown"},
};
static const conf_table_t upstream_table = {
    TABLE(upstream_keys, conf_upstream_t),       .has_line = true,
    .line_off = offsetof(conf_upstream_t, line), .has_name = true,
    .name_off = offsetof(conf_upstream_t, name), .check = upstream_kind_check};

/* ---- fault injection (fallback/) ------------------------------------------------- */

static const char *const queue_mode_names[] = {"inherit", "on", "off", NULL};

static const conf_key_t fault_keys[] = {
    {.name = "abort_percent",
     .type = CONF_INT,
     .off = offsetof(conf_fault_t, abort_percent),
     .def = "0",
     .min = 0,
     .max = 100,
     .flags = R,
     .doc = "percent of requests answered abort_status at once instead of being forwarded"},
    {.name = "abort_status",
     .type = CONF_INT,
     .off = offsetof(conf_fault_t, abort_status),
     .def = "503",
     .min = 400,
     .max = 599,
     .flags = R,
     .doc = "the status of an injected abort (it goes through the fallback chain like a real one)"},
    {.name = "delay_percent",
     .type = CONF_INT,
     .off = offsetof(conf_fault_t, delay_percent),
     .def = "0",
     .min = 0,
     .max = 100,
     .flags = R,
     .doc = "percent of requests held for delay before they are forwarded"},
    {.name = "delay",
     .type = CONF_DURATION,
     .off = offsetof(conf_fault_t, delay_ms),
     .def = "0s",
     .min = 0,
     .max = MINUTES(10),
     .flags = R,
     .doc = "how long an injected delay lasts"},
    {.name = "header",
     .type = CONF_BOOL,
     .off = offsetof(conf_fault_t, header),
     .def = "true",
     .flags = R,
     .doc = "honour a per-request X-Sluice-Fault header carrying X-Sluice-Admin-Key (needs "
            "auth.admin_key_env)"},
};
static const conf_table_t fault_table = {TABLE(fault_keys, conf_fault_t)};

/* Under a model: the same keys, -1 (delay: 0) = the root's value, no header
 * switch. */
static const conf_key_t model_fault_keys[] = {
    {.name = "abort_percent",
     .type = CONF_INT,
     .off = offsetof(conf_fault_t, abort_percent),
     .def = "-1",
     .min = -1,
     .max = 100,
     .flags = R,
     .doc = "percent of this model's requests aborted; -1 = fault.abort_percent"},
    {.name = "abort_status",
     .type = CONF_INT,
     .off = offsetof(conf_fault_t, abort_status),
     .def = "-1",
     .min = -1,
     .max = 599,
     .flags = R,
     .doc = "status of this model's injected aborts (400..599); -1 = fault.abort_status"},
    {.name = "delay_percent",
     .type = CONF_INT,
     .off = offsetof(conf_fault_t, delay_percent),
     .def = "-1",
     .min = -1,
     .max = 100,
     .flags = R,
     .doc = "percent of this model's requests delayed; -1 = fault.delay_percent"},
    {.name = "delay",
     .type = CONF_DURATION,
     .off = offsetof(conf_fault_t, delay_ms),
     .def = "0s",
     .min = 0,
     .max = MINUTES(10),
     .flags = R,
     .doc = "this model's injected delay; 0 = fault.delay"},
};
static int model_fault_check(conf_ctx_t *ctx, void *obj, int line)
{
    const conf_fault_t *f = obj;
    if (f->abort_status != -1 && f->abort_status < 400)
        return conf_errorf(ctx, line, "abort_status", "expected 400..599 (or -1)");
    return 0;
}
static const conf_table_t model_fault_table = {TABLE(model_fault_keys, conf_fault_t),
                                               .check = model_fault_check};

/* ---- response cache (cache/) --------------------------------------------------- */

static const char *const cache_mode_names[] = {"inherit", "on", "off", NULL};
static const char *const cache_scope_names[] = {"inherit", "user", "global", NULL};
static const char *const cache_root_scope_names[] = {"user", "global", NULL};

/* A decimal in [lo, hi] (temperatures, cosine bounds): the YAML scalar is
 * kept as written, its value in the derived double. */
static int cache_decimal(const char *s, double lo, double hi, double *out, char *msg, size_t msglen)
{
    char *end = NULL;
    double v = s ? strtod(s, &end) : 0;
    if (!s || end == s || *end || !(v >= lo && v <= hi)) {
        snprintf(msg, msglen, "expected a number in %g..%g", lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}
static int cache_temp_check(void *obj, char *msg, size_t msglen)
{
    conf_cache_t *c = obj;
    return cache_decimal(c->max_temperature, 0, 2, &c->max_temperature_v, msg, msglen);
}
static int model_cache_temp_check(void *obj, char *msg, size_t msglen)
{
    conf_model_cache_t *c = obj;
    return cache_decimal(c->max_temperature, 0, 2, &c->max_temperature_v, msg, msglen);
}
static int cache_threshold_check(void *obj, char *msg, size_t msglen)
{
    conf_cache_semantic_t *c = obj;
    return cache_decimal(c->threshold, 0.5, 1, &c->threshold_v, msg, msglen);
}

static const conf_key_t cache_semantic_keys[] = {
    {.name = "enabled",
     .type = CONF_BOOL,
     .off = offsetof(conf_cache_semantic_t, enabled),
     .def = "false",
     .flags = R,
     .doc = "semantic lookups for models with cache on (models.<name>.cache.semantic overrides)"},
    {.name = "embed_model",
     .type = CONF_STRING,
     .off = offsetof(conf_cache_semantic_t, embed_model),
     .flags = R,
     .doc = "the model (a key under models) whose /v1/embeddings embeds the last user "
            "message; unset = no semantic cache"},
    {.name = "threshold",
     .type = CONF_STRING,
     .off = offsetof(conf_cache_semantic_t, threshold),
     .def = "0.95",
     .check = cache_threshold_check,
     .flags = R,
     .doc = "cosine similarity (0.5..1) at or above which a stored answer is returned"},
    {.name = "deadline",
     .type = CONF_DURATION,
     .off = offsetof(conf_cache_semantic_t, deadline_ms),
     .def = "50ms",
     .min = MS(1),
     .max = SEC(10),
     .flags = R,
     .doc = "deadline of the embedding call; past it the request simply goes upstream"},
    {.name = "max_entries",
     .type = CONF_INT,
     .off = offsetof(conf_cache_semantic_t, max_entries),
     .def = "10000",
     .min = 16,
     .max = 10000000,
     .doc = "vectors kept per partition (system prompt); past it the oldest goes"},
    {.name = "max_partitions",
     .type = CONF_INT,
     .off = offsetof(conf_cache_semantic_t, max_partitions),
     .def = "1024",
     .min = 1,
     .max = 1000000,
     .doc = "partitions (system prompt x model x user in user scope) kept; past it the "
            "least recently used goes"},
    {.name = "max_bytes",
     .type = CONF_SIZE,
     .off = offsetof(conf_cache_semantic_t, max_bytes),
     .def = "256m",
     .min = MIB(1),
     .max = GIB(64),
     .doc = "memory of the whole index (vectors, sketches, keys); past it the least recently "
            "added partitions go"},
    {.name = "multi_turn",
     .type = CONF_BOOL,
     .off = offsetof(conf_cache_semantic_t, multi_turn),
     .def = "false",
     .flags = R,
     .doc = "also look up requests with more than one user turn (by the last one)"},
};
static const conf_table_t cache_semantic_table = {
    TABLE(cache_semantic_keys, conf_cache_semantic_t)};

static const conf_key_t cache_keys[] = {
    {.name = "enabled",
     .type = CONF_BOOL,
     .off = offsetof(conf_cache_t, enabled),
     .def = "false",
     .flags = R,
     .doc = "cache answers of every model (models.<name>.cache.enabled overrides)"},
    {.name = "ttl",
     .type = CONF_DURATION,
     .off = offsetof(conf_cache_t, ttl_ms),
     .def = "1h",
     .min = SEC(1),
     .max = DAY(30),
     .flags = R,
     .doc = "how long a stored answer is served"},
    {.name = "scope",
     .type = CONF_ENUM,
     .off = offsetof(conf_cache_t, scope),
     .def = "user",
     .enums = cache_root_scope_names,
     .flags = R,
     .doc = "user (the token's sub is part of the key: answers may be personal) or global"},
    {.name = "max_temperature",
     .type = CONF_STRING,
     .off = offsetof(conf_cache_t, max_temperature),
     .def = "0",
     .check = cache_temp_check,
     .flags = R,
     .doc = "requests with a higher temperature (absent = 1) are not cached"},
    {.name = "max_entry_bytes",
     .type = CONF_SIZE,
     .off = offsetof(conf_cache_t, max_entry_bytes),
     .def = "256k",
     .min = KIB(1),
     .max = MIB(64),
     .flags = R,
     .doc = "larger answers are not stored"},
    {.name = "max_bytes",
     .type = CONF_SIZE,
     .off = offsetof(conf_cache_t, max_bytes),
     .def = "64m",
     .min = MIB(1),
     .max = GIB(64),
     .doc = "memory of the in-process store (LRU); with redis.url Redis is the store"},
    {.name = "charge_tokens",
     .type = CONF_BOOL,
     .off = offsetof(conf_cache_t, charge_tokens),
     .def = "true",
     .flags = R,
     .doc = "a hit charges the user's token budget the stored usage (false: hits are free)"},
    {.name = "semantic",
     .type = CONF_STRUCT,
     .off = offsetof(conf_cache_t, semantic),
     .sub = &cache_semantic_table,
     .doc = "semantic cache: an embedding of the last user message, cosine >= threshold"},
};
static const conf_table_t cache_table = {TABLE(cache_keys, conf_cache_t)};

static const conf_key_t model_cache_keys[] = {
    {.name = "enabled",
     .type = CONF_ENUM,
     .off = offsetof(conf_model_cache_t, enabled),
     .def = "inherit",
     .enums = cache_mode_names,
     .flags = R,
     .doc = "cache this model's answers: inherit (cache.enabled), on, off"},
    {.name = "semantic",
     .type = CONF_ENUM,
     .off = offsetof(conf_model_cache_t, semantic),
     .def = "inherit",
     .enums = cache_mode_names,
     .flags = R,
     .doc = "semantic lookups for this model: inherit (cache.semantic.enabled), on, off"},
    {.name = "scope",
     .type = CONF_ENUM,
     .off = offsetof(conf_model_cache_t, scope),
     .def = "inherit",
     .enums = cache_scope_names,
     .flags = R,
     .doc = "inherit (cache.scope), user or global"},
    {.name = "ttl",
     .type = CONF_DURATION,
     .off = offsetof(conf_model_cache_t, ttl_ms),
     .def = "0",
     .min = 0,
     .max = DAY(30),
     .flags = R,
     .doc = "how long this model's answers are served; 0 = cache.ttl"},
    {.name = "max_entry_bytes",
     .type = CONF_SIZE,
     .off = offsetof(conf_model_cache_t, max_entry_bytes),
     .def = "0",
     .min = 0,
     .max = MIB(64),
     .flags = R,
     .doc = "larger answers of this model are not stored; 0 = cache.max_entry_bytes"},
    {.name = "max_temperature",
     .type = CONF_STRING,
     .off = offsetof(conf_model_cache_t, max_temperature),
     .check = model_cache_temp_check,
     .flags = R,
     .doc = "temperature bound for this model; unset = cache.max_temperature"},
};
static const conf_table_t model_cache_table = {TABLE(model_cache_keys, conf_model_cache_t)};

/* ---- models --------------------------------------------------------------------- */

static const conf_key_t model_keys[] = {
    {.name = "upstream",
     .type = CONF_STRING,
     .off = offsetof(conf_model_t, upstream),
     .flags = CONF_REQUIRED | R,
     .doc = "the upstream (a key under upstreams) serving it"},
    {.name = "name",
     .type = CONF_STRING,
     .off = offsetof(conf_model_t, served),
     .flags = R,
     .doc = "the upstream's name for the model (alias target); default: the same name"},
    {.name = "fault",
     .type = CONF_STRUCT,
     .off = offsetof(conf_model_t, fault),
     .sub = &model_fault_table,
     .flags = R,
     .doc = "fault injection for this model; unset keys = the root fault's (docs/fallback.md)"},
    {.name = "queue",
     .type = CONF_ENUM,
     .off = offsetof(conf_model_t, queue),
     .def = "inherit",
     .enums = queue_mode_names,
     .flags = R,
     .doc = "queue requests that got the template for resending: inherit "
            "(fallback.queue.enabled), on, off"},
    {.name = "cache",
     .type = CONF_STRUCT,
     .off = offsetof(conf_model_t, cache),
     .sub = &model_cache_table,
     .flags = R,
     .doc = "response cache policy of this model; unset keys = cache: (docs/cache.md)"},
    {.name = "default_max_tokens",
     .type = CONF_INT,
     .off = offsetof(conf_model_t, default_max_tokens),
     .def = "0",
     .min = 0,
     .max = 10000000,
     .flags = R,
     .doc = "max_tokens sent upstream when the client sends none (at most ratelimit.max_tokens, "
            "still the cap); 0 = the cap itself"},
};
static const conf_table_t model_table = {TABLE(model_keys, conf_model_t), .has_line = true,
                                         .line_off = offsetof(conf_model_t, line), .has_name = true,
                                         .name_off = offsetof(conf_model_t, name)};

/* ---- sse / log ------------------------------------------------------------------- */

static const conf_key_t sse_keys[] = {
    {.name = "ping_interval",
     .type = CONF_DURATION,
     .off = offsetof(conf_sse_t, ping_interval_ms),
     .def = "15s",
     .min = 0,
     .max = HOUR(1),
     .flags = R,
     .doc = "`: ping` comment this often until the first event; 0 = off"},
    {.name = "max_event_bytes",
     .type = CONF_SIZE,
     .off = offsetof(conf_sse_t, max_event_bytes),
     .def = "1m",
     .min = KIB(1),
     .max = MIB(64),
     .flags = R,
     .doc = "an upstream event larger than this fails the stream"},
    {.name = "buffer_bytes",
     .type = CONF_SIZE,
     .off = offsetof(conf_sse_t, buffer_bytes),
     .def = "256k",
     .min = KIB(4),
     .max = MIB(64),
     .flags = R,
     .doc = "per-stream bytes queued toward a slow client before upstream reads pause"},
};
static const conf_table_t sse_table = {TABLE(sse_keys, conf_sse_t)};

static const conf_key_t gzip_keys[] = {
    {.name = "enabled",
     .type = CONF_BOOL,
     .off = offsetof(conf_gzip_t, enabled),
     .def = "true",
     .flags = R,
     .doc = "gzip non-streamed JSON answers when Accept-Encoding allows (SSE never)"},
    {.name = "min_bytes",
     .type = CONF_SIZE,
     .off = offsetof(conf_gzip_t, min_bytes),
     .def = "1k",
     .min = 0,
     .max = MIB(64),
     .flags = R,
     .doc = "answers smaller than this are sent as they are"},
    {.name = "level",
     .type = CONF_INT,
     .off = offsetof(conf_gzip_t, level),
     .def = "6",
     .min = 1,
     .max = 9,
     .flags = R,
     .doc = "zlib compression level (1 fastest, 9 smallest)"},
};
static const conf_table_t gzip_table = {TABLE(gzip_keys, conf_gzip_t)};
static const char *const log_user_names[] = {"hash", "plain", "off", NULL};

static const conf_key_t log_keys[] = {
    {.name = "access",
     .type = CONF_STRING,
     .off = offsetof(conf_log_t, access),
     .def = "stdout",
     .flags = R,
     .doc = "access log (JSON lines): stdout, off, or a file path"},
    {.name = "level",
     .type = CONF_STRING,
     .off = offsetof(conf_log_t, level),
     .def = "info",
     .check = log_level_check,
     .flags = R,
     .doc = "error log level: debug, info, warn, error"},
    {.name = "repeat_interval",
     .type = CONF_DURATION,
     .off = offsetof(conf_log_t, repeat_interval_ms),
     .def = "10s",
     .min = 1000,
     .max = HOUR(1),
     .flags = R,
     .doc = "a failure that repeats (an upstream or Redis down) is logged once, then as a count "
            "per this interval"},
    {.name = "error",
     .type = CONF_STRING,
     .off = offsetof(conf_log_t, error),
     .def = "stderr",
     .flags = R,
     .doc = "error log: stderr, or a file path (opened onto fd 2; SIGUSR1 reopens it)"},
    {.name = "user",
     .type = CONF_ENUM,
     .off = offsetof(conf_log_t, user),
     .def = "hash",
     .enums = log_user_names,
     .flags = R,
     .doc = "the user (token sub) in the access log: hash (HMAC-SHA256 with a per-process key, "
            "16 hex digits; the same user reads the same until a restart), plain, or off"},
};
static const conf_table_t log_table = {TABLE(log_keys, conf_log_t)};

/* ---- ratelimit / redis ------------------------------------------------------------ */

/* "ADDR/BITS" or a bare address (a single host), IPv4 or IPv6. */
static bool conf_cidr_ok(const char *s)
{
    char a[64];
    const char *slash = strchr(s, '/');
    size_t n = slash ? (size_t)(slash - s) : strlen(s);
    if (n == 0 || n >= sizeof(a))
        return false;
    memcpy(a, s, n);
    a[n] = '\0';
    unsigned char buf[16];
    int maxbits = inet_pton(AF_INET, a, buf) == 1    ? 32
                  : inet_pton(AF_INET6, a, buf) == 1 ? 128
                                                     : -1;
    if (maxbits < 0)
        return false;
    if (!slash)
        return true;
    long bits = 0;
    const char *p = slash + 1;
    if (!*p || strlen(p) > 3)
        return false;
    for (; *p; p++) {
        if (*p < '0' || *p > '9')
            return false;
        bits = bits * 10 + (*p - '0');
    }
    return bits <= maxbits;
}

static int ratelimit_check(conf_ctx_t *ctx, void *obj, int line)
{
    const conf_ratelimit_t *r = obj;
    for (size_t i = 0; i < r->ntrusted_proxies; i++)
        if (!conf_cidr_ok(r->trusted_proxies[i]))
            return conf_errorf(ctx, line, "trusted_proxies",
                               "expected an address or CIDR (10.0.0.0/8, fd00::/8), got \"%.60s\"",
                               r->trusted_proxies[i]);
    return 0;
}

static int redis_url_check(void *obj, char *msg, size_t msglen)
{
    return sl_redis_url_check(((const conf_redis_t *)obj)->url, msg, msglen);
}

/* per_user; an override has the same keys, where -1 (the default) means
 * "not set here: per_user's value". 0 = no limit. */
static const conf_key_t rl_user_keys[] = {
    {.name = "requests_per_minute",
     .type = CONF_INT,
     .off = offsetof(conf_rl_limits_t, requests_per_minute),
     .def = "0",
     .min = 0,
     .max = 1000000,
     .flags = R,
     .doc = "requests a minute per user; 0 = none (smooth: no double burst at a minute's edge)"},
    {.name = "concurrent",
     .type = CONF_INT,
     .off = offsetof(conf_rl_limits_t, concurrent),
     .def = "0",
     .min = 0,
     .max = 100000,
     .flags = R,
     .doc = "requests in flight at once per user; 0 = none"},
    {.name = "tokens_per_minute",
     .type = CONF_INT,
     .off = offsetof(conf_rl_limits_t, tokens_per_minute),
     .def = "0",
     .min = 0,
     .max = 1000000000,
     .flags = R,
     .doc = "token budget a minute per user; 0 = none (reserved before, settled after)"},
    {.name = "tokens_per_day",
     .type = CONF_INT,
     .off = offsetof(conf_rl_limits_t, tokens_per_day),
     .def = "0",
     .min = 0,
     .max = 1000000000000LL,
     .flags = R,
     .doc = "token budget a rolling day per user; 0 = none"},
};
static const conf_table_t rl_user_table = {TABLE(rl_user_keys, conf_rl_limits_t)};

static const conf_key_t rl_ip_keys[] = {
    {.name = "requests_per_minute",
     .type = CONF_INT,
     .off = offsetof(conf_rl_limits_t, requests_per_minute),
     .def = "0",
     .min = 0,
     .max = 1000000,
     .flags = R,
     .doc = "requests a minute per client address, for endpoints without a user; 0 = none"},
};
static const conf_table_t rl_ip_table = {TABLE(rl_ip_keys, conf_rl_limits_t)};

static const conf_key_t rl_override_keys[] = {
    {.name = "requests_per_minute",
     .type = CONF_INT,
     .off = offsetof(conf_rl_override_t, limits.requests_per_minute),
     .def = "-1",
     .min = -1,
     .max = 1000000,
     .flags = R,
     .doc = "requests a minute for this user or client; -1 = per_user's (smooth: no double burst "
            "at a minute's edge)"},
    {.name = "concurrent",
     .type = CONF_INT,
     .off = offsetof(conf_rl_override_t, limits.concurrent),
     .def = "-1",
     .min = -1,
     .max = 100000,
     .flags = R,
     .doc = "requests in flight at once for this user or client; -1 = per_user's"},
    {.name = "tokens_per_minute",
     .type = CONF_INT,
     .off = offsetof(conf_rl_override_t, limits.tokens_per_minute),
     .def = "-1",
     .min = -1,
     .max = 1000000000,
     .flags = R,
     .doc = "token budget a minute for this user or client; -1 = per_user's (reserved before, "
            "settled after)"},
    {.name = "tokens_per_day",
     .type = CONF_INT,
     .off = offsetof(conf_rl_override_t, limits.tokens_per_day),
     .def = "-1",
     .min = -1,
     .max = 1000000000000LL,
     .flags = R,
     .doc = "token budget a rolling day for this user or client; -1 = per_user's"},
};
static const conf_table_t rl_override_table = {
    TABLE(rl_override_keys, conf_rl_override_t), .has_line = true,
    .line_off = offsetof(conf_rl_override_t, line), .has_name = true,
    .name_off = offsetof(conf_rl_override_t, name)};

static const char *const store_error_names[] = {"allow", "deny", "local", NULL};

static const conf_key_t ratelimit_keys[] = {
    {.name = "per_user",
     .type = CONF_STRUCT,
     .off = offsetof(conf_ratelimit_t, per_user),
     .sub = &rl_user_table,
     .flags = R,
     .doc = "limits for each user (the token's sub)"},
    {.name = "per_ip",
     .type = CONF_STRUCT,
     .off = offsetof(conf_ratelimit_t, per_ip),
     .sub = &rl_ip_table,
     .flags = R,
     .doc = "limits for each client address on endpoints without a user (token issuance)"},
    {.name = "max_tokens",
     .type = CONF_INT,
     .off = offsetof(conf_ratelimit_t, max_tokens),
     .def = "2048",
     .min = 1,
     .max = 10000000,
     .flags = R,
     .doc = "the upstream gets min(client's max_tokens or max_completion_tokens, this); none "
            "sent = this"},
    {.name = "on_store_error",
     .type = CONF_ENUM,
     .off = offsetof(conf_ratelimit_t, on_store_error),
     .def = "allow",
     .enums = store_error_names,
     .flags = R,
     .doc = "Redis down or past its deadline: allow (counted), deny, or local (this "
            "instance's in-process limits)"},
    {.name = "overrides",
     .type = CONF_MAP,
     .off = offsetof(conf_ratelimit_t, overrides),
     .count_off = offsetof(conf_ratelimit_t, noverrides),
     .sub = &rl_override_table,
     .min = 0,
     .max = 100000,
     .flags = R,
     .doc = "per_user limits for one user (key: the sub) or client (key: client:ID)"},
    {.name = "trusted_proxies",
     .type = CONF_STRLIST,
     .off = offsetof(conf_ratelimit_t, trusted_proxies),
     .count_off = offsetof(conf_ratelimit_t, ntrusted_proxies),
     .min = 0,
     .max = 1000,
     .flags = R,
     .doc = "CIDRs of proxies whose X-Forwarded-For is believed (the right-most address not in "
            "them is the client)"},
    {.name = "max_keys",
     .type = CONF_INT,
     .off = offsetof(conf_ratelimit_t, max_keys),
     .def = "100000",
     .min = 64,
     .max = 100000000,
     .flags = R,
     .doc = "users and addresses the in-process store tracks at once (idle ones expire; past "
            "this a new one gets 429 max_keys: live ones are never dropped)"},
    {.name = "redis_leases",
     .type = CONF_BOOL,
     .off = offsetof(conf_ratelimit_t, redis_leases),
     .def = "true",
     .flags = R,
     .doc = "with Redis: a busy key limited by requests alone spends units leased ahead (taken "
            "in Redis first: never more than the limit; see docs/ratelimit.md)"},
};
static const conf_table_t ratelimit_table = {TABLE(ratelimit_keys, conf_ratelimit_t),
                                             .check = ratelimit_check};

static const conf_key_t redis_keys[] = {
    {.name = "url",
     .type = CONF_STRING,
     .off = offsetof(conf_redis_t, url),
     .check = redis_url_check,
     .doc = "redis://[:password@]host[:port][/db]; unset = no Redis (limits per instance)"},
    {.name = "timeout",
     .type = CONF_DURATION,
     .off = offsetof(conf_redis_t, timeout_ms),
     .def = "50ms",
     .min = MS(1),
     .max = SEC(10),
     .doc = "deadline of each Redis call; past it on_store_error decides"},
};
static const conf_table_t redis_table = {TABLE(redis_keys, conf_redis_t)};

/* ---- auth: tokens and request signatures (auth/) ------------------------------------ */

static const char *const auth_alg_names[] = {"HS256", "RS256", "ES256", NULL};
/* Index = conf_store_error_t (allow 0, deny 1); auth has no "local". */
static const char *const auth_store_error_names[] = {"allow", "deny", NULL};

/* HS256 takes a secret, RS256/ES256 a public key file: never both. */
static int conf_auth_key_check(conf_ctx_t *ctx, void *obj, int line)
{
    const conf_auth_key_t *k = obj;
    if (k->alg == CONF_AUTH_HS256 && (!k->secret_env || k->public_key))
        return conf_errorf(ctx, line, NULL, "HS256 takes secret_env (and no public_key)");
    if (k->alg != CONF_AUTH_HS256 && (!k->public_key || k->secret_env))
        return conf_errorf(ctx, line, NULL, "%s takes public_key (and no secret_env)",
                           auth_alg_names[k->alg]);
    return 0;
}

static int conf_auth_check(conf_ctx_t *ctx, void *obj, int line)
{
    const conf_auth_t *a = obj;
    const conf_auth_tokens_t *t = &a->tokens;
    if (t->ttl_ms > t->max_lifetime_ms)
        return conf_errorf(ctx, line, "tokens.ttl", "longer than tokens.max_lifetime");
    for (size_t i = 0; i < t->nkeys; i++)
        for (size_t j = 0; j < i; j++)
            if (strcmp(t->keys[i].kid, t->keys[j].kid) == 0)
                return conf_errorf(ctx, t->keys[i].line, "tokens.keys", "duplicate kid \"%.64s\"",
                                   t->keys[i].kid);
    for (size_t i = 0; i < a->nclients; i++)
        for (size_t j = 0; j < i; j++)
            if (strcmp(a->clients[i].id, a->clients[j].id) == 0)
                return conf_errorf(ctx, a->clients[i].line, "clients", "duplicate id \"%.64s\"",
                                   a->clients[i].id);
    /* No keys = auth off; anything else set then is a half-written section. */
    if (t->nkeys == 0 && (a->nclients || a->admin_key_env || a->signing.secret_env))
        return conf_errorf(ctx, line, "tokens.keys",
                           "at least one key is needed once auth is "
                           "configured (clients, signing or admin key)");
    if (t->nkeys > 0 && a->signing.required && !a->required)
        return conf_errorf(ctx, line, "signing.required",
                           "signatures need tokens: set "
                           "auth.required too");
    if (t->nkeys > 0 && a->signing.required && !a->signing.secret_env)
        return conf_errorf(ctx, line, "signing.secret_env", "required when signing.required");
    return 0;
}

static const conf_key_t auth_key_keys[] = {
    {.name = "kid",
     .type = CONF_STRING,
     .off = offsetof(conf_auth_key_t, kid),
     .flags = CONF_REQUIRED | R,
     .doc = "key id: a token's `kid` header picks this key"},
    {.name = "alg",
     .type = CONF_ENUM,
     .off = offsetof(conf_auth_key_t, alg),
     .enums = auth_alg_names,
     .flags = CONF_REQUIRED | R,
     .doc = "the one algorithm this key verifies (HS256, RS256, ES256); `none` never"},
    {.name = "secret_env",
     .type = CONF_STRING,
     .off = offsetof(conf_auth_key_t, secret_env),
     .flags = R,
     .doc = "HS256: environment variable holding the secret (>= 32 bytes; base64url:... decoded)"},
    {.name = "public_key",
     .type = CONF_STRING,
     .off = offsetof(conf_auth_key_t, public_key),
     .flags = R,
     .doc = "RS256/ES256: PEM public key file (RSA >= 2048 bits, EC P-256)"},
};
static const conf_table_t auth_key_table = {TABLE(auth_key_keys, conf_auth_key_t), .has_line = true,
                                            .line_off = offsetof(conf_auth_key_t, line),
                                            .check = conf_auth_key_check};

static const conf_key_t auth_tokens_keys[] = {
    {.name = "issuer",
     .type = CONF_STRING,
     .off = offsetof(conf_auth_tokens_t, issuer),
     .flags = R,
     .doc = "required `iss` of tokens (and the one sluice mints); unset = not checked"},
    {.name = "audience",
     .type = CONF_STRING,
     .off = offsetof(conf_auth_tokens_t, audience),
     .flags = R,
     .doc = "required `aud` of tokens (and the one sluice mints); unset = not checked"},
    {.name = "ttl",
     .type = CONF_DURATION,
     .off = offsetof(conf_auth_tokens_t, ttl_ms),
     .def = "15m",
     .min = SEC(1),
     .max = DAY(1),
     .flags = R,
     .doc = "lifetime of tokens minted by POST /v1/auth/token and `sluice token`"},
    {.name = "max_lifetime",
     .type = CONF_DURATION,
     .off = offsetof(conf_auth_tokens_t, max_lifetime_ms),
     .def = "1h",
     .min = SEC(1),
     .max = DAY(1),
     .flags = R,
     .doc = "tokens with exp - iat above this are refused; revocations are kept this long"},
    {.name = "leeway",
     .type = CONF_DURATION,
     .off = offsetof(conf_auth_tokens_t, leeway_ms),
     .def = "30s",
     .min = 0,
     .max = SEC(60),
     .flags = R,
     .doc = "clock skew allowed on exp, nbf and iat"},
    {.name = "keys",
     .type = CONF_LIST,
     .off = offsetof(conf_auth_tokens_t, keys),
     .count_off = offsetof(conf_auth_tokens_t, nkeys),
     .min = 0,
     .max = 64,
     .sub = &auth_key_table,
     .flags = R,
     .doc = "verification keys, each with a kid and a pinned alg; none = auth off"},
};
static const conf_table_t auth_tokens_table = {TABLE(auth_tokens_keys, conf_auth_tokens_t)};

static const conf_key_t auth_client_keys[] = {
    {.name = "id",
     .type = CONF_STRING,
     .off = offsetof(conf_auth_client_t, id),
     .flags = CONF_REQUIRED | R,
     .doc = "client_id an app backend sends to POST /v1/auth/token"},
    {.name = "secret_env",
     .type = CONF_STRING,
     .off = offsetof(conf_auth_client_t, secret_env),
     .flags = CONF_REQUIRED | R,
     .doc = "environment variable holding its client_secret (>= 16 bytes)"},
};
static const conf_table_t auth_client_table = {TABLE(auth_client_keys, conf_auth_client_t),
                                               .has_line = true,
                                               .line_off = offsetof(conf_auth_client_t, line)};

static const conf_key_t auth_signing_keys[] = {
    {.name = "required",
     .type = CONF_BOOL,
     .off = offsetof(conf_auth_signing_t, required),
     .def = "true",
     .flags = R,
     .doc = "requests must carry X-Sluice-Timestamp, -Nonce and -Signature"},
    {.name = "secret_env",
     .type = CONF_STRING,
     .off = offsetof(conf_auth_signing_t, secret_env),
     .flags = R,
     .doc = "environment variable of the secret signing keys derive from (>= 32 bytes)"},
    {.name = "window",
     .type = CONF_DURATION,
     .off = offsetof(conf_auth_signing_t, window_ms),
     .def = "300s",
     .min = SEC(1),
     .max = HOUR(1),
     .flags = R,
     .doc = "X-Sluice-Timestamp may differ from now by this much; nonces are kept as long"},
    {.name = "nonce_memory",
     .type = CONF_SIZE,
     .off = offsetof(conf_auth_signing_t, nonce_memory),
     .def = "128m",
     .min = KIB(64),
     .max = GIB(64),
     .doc = "memory for the in-process nonce store (128 bytes a nonce); full, signed requests "
            "get 503 nonce_store_full: it sustains nonce_memory / 128 / (window + 8s) "
            "requests/s (128m, 300s: 3404/s)"},
    {.name = "refuse_before_start",
     .type = CONF_BOOL,
     .off = offsetof(conf_auth_signing_t, refuse_before_start),
     .def = "true",
     .flags = R,
     .doc = "in-process nonce store: refuse (401 signature_before_start) a signed request "
            "whose timestamp is a second before sluice's start, which a restart would let be "
            "replayed; clients whose clocks lag by d seconds are refused for d seconds after "
            "each start"},
};
static const conf_table_t auth_signing_table = {TABLE(auth_signing_keys, conf_auth_signing_t)};

static const conf_key_t auth_store_error_keys[] = {
    {.name = "nonces",
     .type = CONF_ENUM,
     .off = offsetof(conf_auth_store_error_t, nonces),
     .def = "deny",
     .enums = auth_store_error_names,
     .flags = R,
     .doc = "Redis down or late on the replay check: deny (503), or allow (this instance's "
            "own nonce store still checks)"},
    {.name = "revocations",
     .type = CONF_ENUM,
     .off = offsetof(conf_auth_store_error_t, revocations),
     .def = "deny",
     .enums = auth_store_error_names,
     .flags = R,
     .doc = "Redis down or late on the revocation lookup: deny (503), or allow (this "
            "instance's own revocations still apply)"},
};
static const conf_table_t auth_store_error_table = {
    TABLE(auth_store_error_keys, conf_auth_store_error_t)};

static const conf_key_t auth_keys[] = {
    {.name = "required",
     .type = CONF_BOOL,
     .off = offsetof(conf_auth_t, required),
     .def = "true",
     .flags = R,
     .doc = "a valid token is needed on /v1/* (when keys are configured)"},
    {.name = "tokens",
     .type = CONF_STRUCT,
     .off = offsetof(conf_auth_t, tokens),
     .sub = &auth_tokens_table,
     .flags = R,
     .doc = "JWT verification and issuance"},
    {.name = "clients",
     .type = CONF_LIST,
     .off = offsetof(conf_auth_t, clients),
     .count_off = offsetof(conf_auth_t, nclients),
     .min = 0,
     .max = 1000,
     .sub = &auth_client_table,
     .flags = R,
     .doc = "app backends allowed to mint tokens at POST /v1/auth/token"},
    {.name = "signing",
     .type = CONF_STRUCT,
     .off = offsetof(conf_auth_t, signing),
     .sub = &auth_signing_table,
     .flags = R,
     .doc = "request signatures (HMAC with the token's signing key)"},
    {.name = "admin_key_env",
     .type = CONF_STRING,
     .off = offsetof(conf_auth_t, admin_key_env),
     .flags = R,
     .doc = "environment variable of the bearer key for POST /admin/revoke; unset = off"},
    {.name = "on_store_error",
     .type = CONF_STRUCT,
     .off = offsetof(conf_auth_t, on_store_error),
     .sub = &auth_store_error_table,
     .flags = R,
     .doc = "what a failing Redis means for each check"},
};
static const conf_table_t auth_table = {TABLE(auth_keys, conf_auth_t), .check = conf_auth_check};

/* ---- filters: content filtering (filters/) ----------------------------------------- */

/* Index = conf_filter_action_t = flt_action_t. */
static const char *const filter_action_names[] = {"block", "mask", "log", NULL};
static const char *const filter_overflow_names[] = {"reject", "truncate", NULL};
static const char *const filter_sysprompt_names[] = {"prepend", "replace", NULL};
static const char *const filter_on_limit_names[] = {"match", "nomatch", NULL};

/* Rule names label sluice_filter_hits_total: unique, as far as the file
 * says (a word list without a name is named after its file by filters/). */
static int conf_filters_check(conf_ctx_t *ctx, void *obj, int line)
{
    const conf_filters_t *f = obj;
    for (size_t i = 0; i < f->nregex; i++) {
        for (size_t j = 0; j < i; j++)
            if (strcmp(f->regex[i].name, f->regex[j].name) == 0)
                return conf_errorf(ctx, f->regex[i].line, "regex", "duplicate name \"%.64s\"",
                                   f->regex[i].name);
        for (size_t j = 0; j < f->nwords; j++)
            if (f->words[j].name && strcmp(f->regex[i].name, f->words[j].name) == 0)
                return conf_errorf(ctx, f->regex[i].line, "regex",
                                   "name \"%.64s\" is also a word list's", f->regex[i].name);
    }
    for (size_t i = 0; i < f->nwords; i++)
        for (size_t j = 0; j < i; j++)
            if (f->words[i].name && f->words[j].name &&
                strcmp(f->words[i].name, f->words[j].name) == 0)
                return conf_errorf(ctx, f->words[i].line, "words", "duplicate name \"%.64s\"",
                                   f->words[i].name);
    return 0;
}

static const conf_key_t filter_words_keys[] = {
    {.name = "file",
     .type = CONF_STRING,
     .off = offsetof(conf_filter_words_t, file),
     .flags = CONF_REQUIRED | R,
     .doc = "UTF-8 word list: one word or phrase per line, `#` comment lines; matched "
            "ignoring ASCII case and fullwidth forms"},
    {.name = "action",
     .type = CONF_ENUM,
     .off = offsetof(conf_filter_words_t, action),
     .def = "mask",
     .enums = filter_action_names,
     .flags = R,
     .doc = "block (prompt: 400 content_filter; answer: stop with finish_reason "
            "content_filter), mask, or log"},
    {.name = "name",
     .type = CONF_STRING,
     .off = offsetof(conf_filter_words_t, name),
     .flags = R,
     .doc = "rule name in sluice_filter_hits_total; unset = the file's base name"},
};
static const conf_table_t filter_words_table = {TABLE(filter_words_keys, conf_filter_words_t),
                                                .has_line = true,
                                                .line_off = offsetof(conf_filter_words_t, line)};

static const conf_key_t filter_regex_keys[] = {
    {.name = "name",
     .type = CONF_STRING,
     .off = offsetof(conf_filter_regex_t, name),
     .flags = CONF_REQUIRED | R,
     .doc = "rule name in sluice_filter_hits_total, unique"},
    {.name = "pattern",
     .type = CONF_STRING,
     .off = offsetof(conf_filter_regex_t, pattern),
     .flags = CONF_REQUIRED | R,
     .doc = "PCRE2 pattern (UTF mode, JIT) over the decoded text; must not match the empty "
            "string"},
    {.name = "action",
     .type = CONF_ENUM,
     .off = offsetof(conf_filter_regex_t, action),
     .def = "mask",
     .enums = filter_action_names,
     .flags = R,
     .doc = "block, mask or log"},
};
static const conf_table_t filter_regex_table = {TABLE(filter_regex_keys, conf_filter_regex_t),
                                                .has_line = true,
                                                .line_off = offsetof(conf_filter_regex_t, line)};

static const conf_key_t filter_input_keys[] = {
    {.name = "max_chars",
     .type = CONF_INT,
     .off = offsetof(conf_filters_input_t, max_chars),
     .def = "8000",
     .min = 0,
     .max = 10000000,
     .flags = R,
     .doc = "longest user message in Unicode code points; 0 = no limit"},
    {.name = "on_overflow",
     .type = CONF_ENUM,
     .off = offsetof(conf_filters_input_t, on_overflow),
     .def = "reject",
     .enums = filter_overflow_names,
     .flags = R,
     .doc = "a longer message: reject (400 prompt_too_long) or truncate to max_chars"},
    {.name = "keep_turns",
     .type = CONF_INT,
     .off = offsetof(conf_filters_input_t, keep_turns),
     .def = "10",
     .min = 0,
     .max = 10000,
     .flags = R,
     .doc = "keep the last N turns (a user message and what follows it); system and "
            "developer messages always stay; 0 = all"},
    {.name = "system_prompt",
     .type = CONF_STRING,
     .off = offsetof(conf_filters_input_t, system_prompt),
     .flags = R,
     .doc = "system message added to every request; unset = none"},
    {.name = "system_prompt_mode",
     .type = CONF_ENUM,
     .off = offsetof(conf_filters_input_t, system_prompt_mode),
     .def = "prepend",
     .enums = filter_sysprompt_names,
     .flags = R,
     .doc = "prepend it, or replace the client's system and developer messages with it"},
};
static const conf_table_t filter_input_table = {TABLE(filter_input_keys, conf_filters_input_t)};

static const conf_key_t filter_limits_keys[] = {
    {.name = "match",
     .type = CONF_INT,
     .off = offsetof(conf_filters_regex_limits_t, match),
     .def = "100000",
     .min = 1,
     .max = 1000000000,
     .flags = R,
     .doc = "PCRE2 match limit per search (bounds backtracking, JIT included)"},
    {.name = "depth",
     .type = CONF_INT,
     .off = offsetof(conf_filters_regex_limits_t, depth),
     .def = "10000",
     .min = 1,
     .max = 100000000,
     .flags = R,
     .doc = "PCRE2 depth limit (interpreter; patterns JIT cannot compile)"},
    {.name = "heap",
     .type = CONF_SIZE,
     .off = offsetof(conf_filters_regex_limits_t, heap_bytes),
     .def = "4m",
     .min = KIB(64),
     .max = GIB(1),
     .flags = R,
     .doc = "PCRE2 heap limit (interpreter)"},
    {.name = "on_limit",
     .type = CONF_ENUM,
     .off = offsetof(conf_filters_regex_limits_t, on_limit),
     .def = "match",
     .enums = filter_on_limit_names,
     .flags = R,
     .doc = "a search stopped by a limit counts as a match (the rule's action applies) or "
            "as none; counted in sluice_filter_regex_limit_hits_total"},
};
static const conf_table_t filter_limits_table = {
    TABLE(filter_limits_keys, conf_filters_regex_limits_t)};

static const conf_key_t filters_keys[] = {
    {.name = "input",
     .type = CONF_STRUCT,
     .off = offsetof(conf_filters_t, input),
     .sub = &filter_input_table,
     .flags = R,
     .doc = "request checks before anything is forwarded"},
    {.name = "words",
     .type = CONF_LIST,
     .off = offsetof(conf_filters_t, words),
     .count_off = offsetof(conf_filters_t, nwords),
     .min = 0,
     .max = 64,
     .sub = &filter_words_table,
     .flags = R,
     .doc = "sensitive-word lists (Aho-Corasick), reloaded on SIGHUP"},
    {.name = "regex",
     .type = CONF_LIST,
     .off = offsetof(conf_filters_t, regex),
     .count_off = offsetof(conf_filters_t, nregex),
     .min = 0,
     .max = 192,
     .sub = &filter_regex_table,
     .flags = R,
     .doc = "regex rules"},
    {.name = "mask",
     .type = CONF_STRING,
     .off = offsetof(conf_filters_t, mask),
     .def = "***",
     .flags = R,
     .doc = "what a mask rule puts in place of the matched text"},
    {.name = "output",
     .type = CONF_BOOL,
     .off = offsetof(conf_filters_t, output),
     .def = "true",
     .flags = R,
     .doc = "apply the rules to answers too (streamed with hold-back, docs/filters.md)"},
    {.name = "regex_limits",
     .type = CONF_STRUCT,
     .off = offsetof(conf_filters_t, regex_limits),
     .sub = &filter_limits_table,
     .flags = R,
     .doc = "bounds on every regex search, so no pattern can stall a worker"},
    {.name = "holdback_max",
     .type = CONF_SIZE,
     .off = offsetof(conf_filters_t, holdback_max),
     .def = "4k",
     .min = KIB(1),
     .max = MIB(16),
     .flags = R,
     .doc = "most answer text held back per choice while a match may still complete; past "
            "it the oldest text is released (counted)"},
};
static const conf_table_t filters_table = {TABLE(filters_keys, conf_filters_t),
                                           .check = conf_filters_check};

/* ---- fallback: retry, circuit, local, template, queue, idempotency (fallback/) ------- */

static const char *const queue_store_names[] = {"auto", "journal", "redis", NULL};

static int fallback_retry_check(conf_ctx_t *ctx, void *obj, int line)
{
    const conf_fb_retry_t *r = obj;
    if (r->backoff_ms > r->backoff_max_ms)
        return conf_errorf(ctx, line, "backoff", "longer than backoff_max");
    return 0;
}

static int fallback_queue_check(conf_ctx_t *ctx, void *obj, int line)
{
    const conf_fb_queue_t *q = obj;
    if (q->backoff_ms > q->backoff_max_ms)
        return conf_errorf(ctx, line, "backoff", "longer than backoff_max");
    return 0;
}

static const conf_key_t fallback_retry_keys[] = {
    {.name = "attempts",
     .type = CONF_INT,
     .off = offsetof(conf_fb_retry_t, attempts),
     .def = "1",
     .min = 0,
     .max = 10,
     .flags = R,
     .doc = "retries after the first try (connect failure, 5xx, first-byte timeout; only "
            "before anything reached the client); 0 = none"},
    {.name = "backoff",
     .type = CONF_DURATION,
     .off = offsetof(conf_fb_retry_t, backoff_ms),
     .def = "100ms",
     .min = 0,
     .max = MINUTES(1),
     .flags = R,
     .doc = "delay before the first retry, doubled for each next one, jittered (half to full)"},
    {.name = "backoff_max",
     .type = CONF_DURATION,
     .off = offsetof(conf_fb_retry_t, backoff_max_ms),
     .def = "2s",
     .min = 0,
     .max = MINUTES(10),
     .flags = R,
     .doc = "cap on a retry's delay; a Retry-After longer than this skips the retry on that "
            "server"},
    {.name = "budget_percent",
     .type = CONF_INT,
     .off = offsetof(conf_fb_retry_t, budget_percent),
     .def = "20",
     .min = 0,
     .max = 100,
     .flags = R,
     .doc = "retries are at most this percent of a pool's requests over budget_window"},
    {.name = "budget_window",
     .type = CONF_DURATION,
     .off = offsetof(conf_fb_retry_t, budget_window_ms),
     .def = "10s",
     .min = SEC(1),
     .max = HOUR(1),
     .flags = R,
     .doc = "the retry budget's sliding window"},
    {.name = "budget_min",
     .type = CONF_INT,
     .off = offsetof(conf_fb_retry_t, budget_min),
     .def = "3",
     .min = 0,
     .max = 1000000,
     .flags = R,
     .doc = "retries a window allows whatever the percent (for quiet pools); adds to the "
            "amplification bound"},
};
static const conf_table_t fallback_retry_table = {TABLE(fallback_retry_keys, conf_fb_retry_t),
                                                  .check = fallback_retry_check};

static const conf_key_t fallback_circuit_keys[] = {
    {.name = "failures",
     .type = CONF_INT,
     .off = offsetof(conf_fb_circuit_t, failures),
     .def = "5",
     .min = 0,
     .max = 100000,
     .flags = R,
     .doc = "consecutive failures of a server that open its circuit; 0 = off"},
    {.name = "failure_percent",
     .type = CONF_INT,
     .off = offsetof(conf_fb_circuit_t, failure_percent),
     .def = "50",
     .min = 0,
     .max = 100,
     .flags = R,
     .doc = "failure percent over window (once min_requests results are in) that opens it; "
            "0 = off"},
    {.name = "min_requests",
     .type = CONF_INT,
     .off = offsetof(conf_fb_circuit_t, min_requests),
     .def = "20",
     .min = 1,
     .max = 1000000,
     .flags = R,
     .doc = "results the window must hold before failure_percent applies"},
    {.name = "window",
     .type = CONF_DURATION,
     .off = offsetof(conf_fb_circuit_t, window_ms),
     .def = "10s",
     .min = SEC(1),
     .max = HOUR(1),
     .flags = R,
     .doc = "sliding window of failure_percent"},
    {.name = "cooldown",
     .type = CONF_DURATION,
     .off = offsetof(conf_fb_circuit_t, cooldown_ms),
     .def = "30s",
     .min = MS(100),
     .max = HOUR(1),
     .flags = R,
     .doc = "an open circuit gets no requests this long, then lets probes through (half-open)"},
    {.name = "probes",
     .type = CONF_INT,
     .off = offsetof(conf_fb_circuit_t, probes),
     .def = "1",
     .min = 1,
     .max = 100,
     .flags = R,
     .doc = "half-open: requests let through; all succeeding closes it, one failing reopens it"},
};
static const conf_table_t fallback_circuit_table = {
    TABLE(fallback_circuit_keys, conf_fb_circuit_t)};

static const conf_key_t fallback_local_keys[] = {
    {.name = "upstream",
     .type = CONF_STRING,
     .off = offsetof(conf_fb_local_t, upstream),
     .flags = R,
     .doc = "pool (a key under upstreams) tried when the model's own is unavailable; unset = "
            "no local tier"},
};
static const conf_table_t fallback_local_table = {TABLE(fallback_local_keys, conf_fb_local_t)};

static const conf_key_t fallback_template_keys[] = {
    {.name = "enabled",
     .type = CONF_BOOL,
     .off = offsetof(conf_fb_template_t, enabled),
     .def = "true",
     .flags = R,
     .doc = "answer with the template (status 200, the shape asked for) when no model can"},
    {.name = "text",
     .type = CONF_STRING,
     .off = offsetof(conf_fb_template_t, text),
     .def = "我现在网络不太顺畅，稍后再试试吧。",
     .flags = R,
     .doc = "the template's text when no entry of texts matches Accept-Language"},
    {.name = "texts",
     .type = CONF_STRMAP,
     .off = offsetof(conf_fb_template_t, texts),
     .count_off = offsetof(conf_fb_template_t, ntexts),
     .min = 0,
     .max = 256,
     .flags = R,
     .doc = "language tag -> text, chosen by Accept-Language (q-values; en-US falls back to "
            "en)"},
    {.name = "json",
     .type = CONF_STRING,
     .off = offsetof(conf_fb_template_t, json),
     .flags = R,
     .doc = "the content answered to response_format json_object / json_schema (a JSON object); "
            "default {\"error\":\"unavailable\",\"message\":<the text>}"},
};
static const conf_table_t fallback_template_table = {
    TABLE(fallback_template_keys, conf_fb_template_t)};

static const conf_key_t fallback_queue_keys[] = {
    {.name = "enabled",
     .type = CONF_BOOL,
     .off = offsetof(conf_fb_queue_t, enabled),
     .def = "false",
     .doc = "store requests that got the template and resend them (models.<name>.queue "
            "overrides)"},
    {.name = "store",
     .type = CONF_ENUM,
     .off = offsetof(conf_fb_queue_t, store),
     .def = "auto",
     .enums = queue_store_names,
     .doc = "journal (fsynced file in dir), redis (a stream; needs redis.url), or auto "
            "(redis when redis.url is set)"},
    {.name = "dir",
     .type = CONF_STRING,
     .off = offsetof(conf_fb_queue_t, dir),
     .def = "var/queue",
     .doc = "directory of the journal (created if missing)"},
    {.name = "max_attempts",
     .type = CONF_INT,
     .off = offsetof(conf_fb_queue_t, max_attempts),
     .def = "20",
     .min = 1,
     .max = 10000,
     .doc = "resends of one request, then it is dead-lettered"},
    {.name = "max_age",
     .type = CONF_DURATION,
     .off = offsetof(conf_fb_queue_t, max_age_ms),
     .def = "24h",
     .min = SEC(1),
     .max = DAY(30),
     .doc = "a request not delivered this long after it was accepted is dead-lettered"},
    {.name = "backoff",
     .type = CONF_DURATION,
     .off = offsetof(conf_fb_queue_t, backoff_ms),
     .def = "1s",
     .min = MS(10),
     .max = HOUR(1),
     .doc = "delay before the first resend, doubled per attempt, jittered"},
    {.name = "backoff_max",
     .type = CONF_DURATION,
     .off = offsetof(conf_fb_queue_t, backoff_max_ms),
     .def = "5m",
     .min = MS(10),
     .max = DAY(1),
     .doc = "cap on the delay between resends"},
    {.name = "lease",
     .type = CONF_DURATION,
     .off = offsetof(conf_fb_queue_t, lease_ms),
     .def = "2m",
     .min = SEC(1),
     .max = HOUR(1),
     .doc = "a request taken for a resend that reports nothing this long is due again"},
    {.name = "keep",
     .type = CONF_DURATION,
     .off = offsetof(conf_fb_queue_t, keep_ms),
     .def = "24h",
     .min = SEC(1),
     .max = DAY(30),
     .doc = "results and dead letters stay readable at GET /v1/requests/{id} this long"},
    {.name = "max_pending",
     .type = CONF_INT,
     .off = offsetof(conf_fb_queue_t, max_pending),
     .def = "100000",
     .min = 1,
     .max = 100000000,
     .doc = "requests waiting at once; beyond it a request gets the template only (counted)"},
};
static const conf_table_t fallback_queue_table = {TABLE(fallback_queue_keys, conf_fb_queue_t),
                                                  .check = fallback_queue_check};

static const conf_key_t fallback_idem_keys[] = {
    {.name = "enabled",
     .type = CONF_BOOL,
     .off = offsetof(conf_fb_idem_t, enabled),
     .def = "true",
     .doc = "honour Idempotency-Key (per user): 409 while in flight, replay after, 422 on a "
            "new body"},
    {.name = "ttl",
     .type = CONF_DURATION,
     .off = offsetof(conf_fb_idem_t, ttl_ms),
     .def = "24h",
     .min = SEC(1),
     .max = DAY(30),
     .doc = "a completed key's answer is replayed this long"},
    {.name = "inflight_ttl",
     .type = CONF_DURATION,
     .off = offsetof(conf_fb_idem_t, inflight_ttl_ms),
     .def = "5m",
     .min = SEC(1),
     .max = DAY(1),
     .doc = "an in-flight mark nobody completes (a crash) is dropped after this"},
    {.name = "max_entries",
     .type = CONF_INT,
     .off = offsetof(conf_fb_idem_t, max_entries),
     .def = "100000",
     .min = 16,
     .max = 100000000,
     .doc = "keys the in-process store holds; past it the oldest is dropped (counted)"},
    {.name = "max_response_bytes",
     .type = CONF_SIZE,
     .off = offsetof(conf_fb_idem_t, max_response_bytes),
     .def = "1m",
     .min = KIB(1),
     .max = MIB(64),
     .doc = "larger answers are not kept: a replay of such a key gets 409"},
};
static const conf_table_t fallback_idem_table = {TABLE(fallback_idem_keys, conf_fb_idem_t)};

static const conf_key_t fallback_keys[] = {
    {.name = "retry",
     .type = CONF_STRUCT,
     .off = offsetof(conf_fallback_t, retry),
     .sub = &fallback_retry_table,
     .flags = R,
     .doc = "retries of a failed upstream attempt, bounded by a budget"},
    {.name = "circuit",
     .type = CONF_STRUCT,
     .off = offsetof(conf_fallback_t, circuit),
     .sub = &fallback_circuit_table,
     .flags = R,
     .doc = "circuit breaker per upstream server"},
    {.name = "local",
     .type = CONF_STRUCT,
     .off = offsetof(conf_fallback_t, local),
     .sub = &fallback_local_table,
     .flags = R,
     .doc = "the local small-model tier"},
    {.name = "template",
     .type = CONF_STRUCT,
     .off = offsetof(conf_fallback_t, tmpl),
     .sub = &fallback_template_table,
     .flags = R,
     .doc = "the template reply tier"},
    {.name = "queue",
     .type = CONF_STRUCT,
     .off = offsetof(conf_fallback_t, queue),
     .sub = &fallback_queue_table,
     .doc = "durable queue of template-answered requests, resent later"},
    {.name = "idempotency",
     .type = CONF_STRUCT,
     .off = offsetof(conf_fallback_t, idempotency),
     .sub = &fallback_idem_table,
     .doc = "Idempotency-Key handling"},
};
static const conf_table_t fallback_table = {TABLE(fallback_keys, conf_fallback_t)};

/* ---- the root ----------------------------------------------------------------------- */

static const conf_key_t routing_keys[] = {
    {.name = "local_first",
     .type = CONF_BOOL,
     .off = offsetof(conf_routing_t, local_first),
     .def = "false",
     .flags = R,
     .doc = "requests matching the rules below go to fallback.local first, the model's own "
            "upstream being their fallback"},
    {.name = "max_prompt_chars",
     .type = CONF_INT,
     .off = offsetof(conf_routing_t, max_prompt_chars),
     .def = "400",
     .min = 0,
     .max = 1000000,
     .flags = R,
     .doc = "a request is simple when its messages hold at most this many code points ..."},
    {.name = "max_turns",
     .type = CONF_INT,
     .off = offsetof(conf_routing_t, max_turns),
     .def = "2",
     .min = 0,
     .max = 1000,
     .flags = R,
     .doc = "... and at most this many user turns ..."},
    {.name = "intent",
     .type = CONF_STRING,
     .off = offsetof(conf_routing_t, intent),
     .flags = R,
     .doc = "... or its last user message matches this PCRE2 pattern (UTF mode)"},
    {.name = "auto_model",
     .type = CONF_STRING,
     .off = offsetof(conf_routing_t, auto_model),
     .flags = R,
     .doc = "what model `auto` means when the rules do not pick the local model (a key under "
            "models)"},
};
static const conf_table_t routing_table = {TABLE(routing_keys, conf_routing_t)};

/* ---- http2 ------------------------------------------------------------------- */

static const conf_key_t http2_keys[] = {
    {.name = "max_concurrent_streams",
     .type = CONF_INT,
     .off = offsetof(conf_http2_t, max_concurrent_streams),
     .def = "100",
     .min = 1,
     .max = 10000,
     .flags = R,
     .doc = "open streams per h2 connection; more are refused (REFUSED_STREAM)"},
    {.name = "initial_window",
     .type = CONF_SIZE,
     .off = offsetof(conf_http2_t, initial_window),
     .def = "64k",
     .min = 1024,
     .max = MIB(16),
     .flags = R,
     .doc = "h2 flow-control window per stream for request bodies"},
    {.name = "max_header_list",
     .type = CONF_SIZE,
     .off = offsetof(conf_http2_t, max_header_list),
     .def = "16k",
     .min = KIB(1),
     .max = MIB(1),
     .flags = R,
     .doc = "largest decoded header list of a stream (HPACK bomb, CONTINUATION flood); "
            "larger gets 431"},
    {.name = "max_frame",
     .type = CONF_SIZE,
     .off = offsetof(conf_http2_t, max_frame),
     .def = "16k",
     .min = KIB(16),
     .max = 16777215,
     .flags = R,
     .doc = "largest h2 frame payload sluice accepts (SETTINGS_MAX_FRAME_SIZE)"},
    {.name = "idle_timeout",
     .type = CONF_DURATION,
     .off = offsetof(conf_http2_t, idle_timeout_ms),
     .def = "60s",
     .min = MS(100),
     .max = HOUR(1),
     .flags = R,
     .doc = "an h2 connection with no open stream is closed (GOAWAY) after this"},
    {.name = "reset_burst",
     .type = CONF_INT,
     .off = offsetof(conf_http2_t, reset_burst),
     .def = "200",
     .min = 1,
     .max = 100000,
     .flags = R,
     .doc = "stream resets a client may send at once before GOAWAY ENHANCE_YOUR_CALM "
            "(rapid reset, CVE-2023-44487)"},
    {.name = "reset_rate",
     .type = CONF_INT,
     .off = offsetof(conf_http2_t, reset_rate),
     .def = "100",
     .min = 1,
     .max = 100000,
     .flags = R,
     .doc = "stream resets per second a client earns back after the burst"},
};
static const conf_table_t http2_table = {TABLE(http2_keys, conf_http2_t)};

static const conf_key_t root_keys[] = {
    {.name = "include",
     .type = CONF_STRLIST,
     .off = offsetof(conf_t, include),
     .count_off = offsetof(conf_t, ninclude),
     .max = 64,
     .flags = R | CONF_INCLUDE,
     .doc = "files whose upstreams, models (and other top-level lists and maps) are added to "
            "this file's: a path or glob (conf.d/*.yaml) relative to this file, or a list of "
            "them; included files may include others (8 deep, 256 files)"},
    {.name = "listen",
     .type = CONF_LIST,
     .off = offsetof(conf_t, listen),
     .count_off = offsetof(conf_t, nlisten),
     .min = 1,
     .max = 64,
     .sub = &listen_table,
     .flags = CONF_REQUIRED,
     .doc = "client listeners (at least one)"},
    {.name = "admin",
     .type = CONF_STRUCT,
     .off = offsetof(conf_t, admin),
     .sub = &admin_table,
     .doc = "the admin listener"},
    {.name = "workers",
     .type = CONF_INT,
     .off = offsetof(conf_t, workers),
     .def = "auto",
     .min = 1,
     .max = 256,
     .flags = CONF_AUTO,
     .doc = "worker threads, each with its own event loop; auto = one per core"},
    {.name = "shutdown_timeout",
     .type = CONF_DURATION,
     .off = offsetof(conf_t, shutdown_timeout_ms),
     .def = "30s",
     .min = 0,
     .max = HOUR(1),
     .flags = R,
     .doc = "on SIGTERM, how long open requests and streams may drain"},
    {.name = "limits",
     .type = CONF_STRUCT,
     .off = offsetof(conf_t, limits),
     .sub = &limits_table,
     .flags = R,
     .doc = "client-side limits"},
    {.name = "upstreams",
     .type = CONF_MAP,
     .off = offsetof(conf_t, upstreams),
     .count_off = offsetof(conf_t, nupstreams),
     .min = 0,
     .max = 256,
     .sub = &upstream_table,
     .flags = R,
     .doc = "named pools of model servers"},
    {.name = "models",
     .type = CONF_MAP,
     .off = offsetof(conf_t, models),
     .count_off = offsetof(conf_t, nmodels),
     .min = 0,
     .max = 4096,
     .sub = &model_table,
     .flags = R,
     .doc = "the model names clients may ask for, and where they go"},
    {.name = "sse",
     .type = CONF_STRUCT,
     .off = offsetof(conf_t, sse),
     .sub = &sse_table,
     .flags = R,
     .doc = "server-sent events relay"},
    {.name = "gzip",
     .type = CONF_STRUCT,
     .off = offsetof(conf_t, gzip),
     .sub = &gzip_table,
     .flags = R,
     .doc = "gzip of non-streamed JSON answers (docs/clients.md)"},
    {.name = "passthrough",
     .type = CONF_STRLIST,
     .off = offsetof(conf_t, passthrough),
     .count_off = offsetof(conf_t, npassthrough),
     .min = 0,
     .max = 64,
     .flags = R,
     .doc = "more OpenAI paths to proxy, with auth and limits: \"/v1/moderations\" (exact) or "
            "\"/v1/audio/\" (a prefix); to the body's model's upstream, else the first model's "
            "(docs/clients.md)"},
    {.name = "log",
     .type = CONF_STRUCT,
     .off = offsetof(conf_t, log),
     .sub = &log_table,
     .flags = R,
     .doc = "logging"},
    {.name = "ratelimit",
     .type = CONF_STRUCT,
     .off = offsetof(conf_t, ratelimit),
     .sub = &ratelimit_table,
     .flags = R,
     .doc = "request limits and token budgets per user and per address"},
    {.name = "redis",
     .type = CONF_STRUCT,
     .off = offsetof(conf_t, redis),
     .sub = &redis_table,
     .doc = "Redis shared by sluice instances (rate limits, nonces); unset url = none"},
    {.name = "auth",
     .type = CONF_STRUCT,
     .off = offsetof(conf_t, auth),
     .sub = &auth_table,
     .flags = R,
     .doc = "tokens, request signatures and revocation (docs/auth.md)"},
    {.name = "filters",
     .type = CONF_STRUCT,
     .off = offsetof(conf_t, filters),
     .sub = &filters_table,
     .flags = R,
     .doc = "content filtering of prompts and answers (docs/filters.md)"},
    {.name = "fallback",
     .type = CONF_STRUCT,
     .off = offsetof(conf_t, fallback),
     .sub = &fallback_table,
     .flags = R,
     .doc = "the fallback chain: retry, circuit, local model, template, queue "
            "(docs/fallback.md)"},
    {.name = "fault",
     .type = CONF_STRUCT,
     .off = offsetof(conf_t, fault),
     .sub = &fault_table,
     .flags = R,
     .doc = "fault injection for drills, in front of the upstream; per model under models "
            "(docs/fallback.md)"},
    {.name = "routing",
     .type = CONF_STRUCT,
     .off = offsetof(conf_t, routing),
     .sub = &routing_table,
     .flags = R,
     .doc = "send requests the small model can serve to fallback.local first (docs/model.md)"},
    {.name = "cache",
     .type = CONF_STRUCT,
     .off = offsetof(conf_t, cache),
     .sub = &cache_table,
     .flags = R,
     .doc = "response cache, exact and semantic; per model under models (docs/cache.md)"},
    {.name = "http2",
     .type = CONF_STRUCT,
     .off = offsetof(conf_t, http2),
     .sub = &http2_table,
     .flags = R,
     .doc = "HTTP/2 (ALPN h2 on TLS listeners, h2c where enabled): settings and limits"},
};

const conf_table_t conf_root_table = {TABLE(root_keys, conf_t), .check = root_check};
