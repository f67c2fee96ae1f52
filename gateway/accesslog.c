/*
 * accesslog.c — one JSON line per request, to stdout or a file, written
 * with a single write(2) so lines from workers never interleave. Never
 * holds tokens, keys, query strings or bodies: only the path, the
 * client-facing model name and figures.
 */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <stdatomic.h>

#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common/log.h"
#include "gateway/gw_conn.h"
#include "gateway/gw_req.h"
#include "gateway/gw_route.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_types.h"
#include "gateway/http1.h"

static _Atomic int gw_accesslog_fd = -1;
/* The descriptor a file target lives on, kept for the process's life: a
 * new file (reload, SIGUSR1) is dup2'd onto it, never closed under a worker
 * that loaded the number a moment ago and is about to write. Main thread. */
static int gw_accesslog_filefd = -1;
static char *gw_accesslog_path;

static int gw_accesslog_put(const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0) {
        snprintf(err, errlen, "log.access %s: %s", path, strerror(errno));
        return -1;
    }
    if (gw_accesslog_filefd < 0) {
        gw_accesslog_filefd = fd;
        return 0;
    }
    int rc = dup2(fd, gw_accesslog_filefd); /* atomic: each line goes wholly to one file */
    int e = errno;
    close(fd);
    if (rc < 0) {
        snprintf(err, errlen, "log.access %s: dup2: %s", path, strerror(e));
        return -1;
    }
    return 0;
}

/* log.user: hash — HMAC-SHA256 of the sub under a key drawn once per
 * process, so lines of one user can be grouped without the log naming
 * them (and without a dictionary of subs reversing an unkeyed hash). */
static unsigned char gw_accesslog_user_key[32];
static pthread_once_t gw_accesslog_key_once = PTHREAD_ONCE_INIT;

static void gw_accesslog_key_init(void)
{
    if (RAND_bytes(gw_accesslog_user_key, sizeof(gw_accesslog_user_key)) != 1) {
        uint64_t t = (uint64_t)sl_now_ns() ^ (uint64_t)getpid() << 32;
        memcpy(gw_accesslog_user_key, &t, sizeof(t));
    }
}

static void gw_accesslog_user(json_t *o, const gw_req_t *r)
{
    int mode = r->rt->conf->log.user;
    const char *user = gw_req_user(r);
    if (!user[0] || mode == CONF_LOG_USER_OFF)
        return;
    if (mode == CONF_LOG_USER_PLAIN) {
        json_object_set_new(o, "user", json_string(user));
        return;
    }
    pthread_once(&gw_accesslog_key_once, gw_accesslog_key_init);
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (!HMAC(EVP_sha256(), gw_accesslog_user_key, sizeof(gw_accesslog_user_key),
              (const unsigned char *)user, strlen(user), mac, &len) ||
        len < 8)
        return;
    char hex[17];
    for (int i = 0; i < 8; i++)
        snprintf(hex + 2 * i, 3, "%02x", mac[i]);
    json_object_set_new(o, "user", json_string(hex));
}

int gw_accesslog_open(const char *target, char *err, size_t errlen)
{
    int fd;
    if (!target || strcmp(target, "off") == 0) {
        fd = -1;
    } else if (strcmp(target, "stdout") == 0) {
        fd = STDOUT_FILENO;
    } else {
        /* Opened again even when unchanged: a reload reopens, as USR1 does. */
        char *copy = strdup(target);
        if (!copy || gw_accesslog_put(target, err, errlen) != 0) {
            if (!copy)
                snprintf(err, errlen, "out of memory");
            free(copy);
            return -1;
        }
        free(gw_accesslog_path);
        gw_accesslog_path = copy;
        fd = gw_accesslog_filefd;
    }
    if (fd != gw_accesslog_filefd) {
        free(gw_accesslog_path);
        gw_accesslog_path = NULL;
    }
    atomic_store(&gw_accesslog_fd, fd);
    return 0;
}

int gw_accesslog_reopen(char *err, size_t errlen)
{
    if (!gw_accesslog_path || atomic_load(&gw_accesslog_fd) != gw_accesslog_filefd)
        return 0;
    return gw_accesslog_put(gw_accesslog_path, err, errlen);
}

void gw_accesslog_write(const gw_req_t *r)
{
    int fd = atomic_load_explicit(&gw_accesslog_fd, memory_order_relaxed);
    if (fd < 0)
        return;
    const gw_http_msg_t *m = r->c->parser ? gw_http_msg(r->c->parser) : NULL;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[64];
    snprintf(when, sizeof(when), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    double dur = (double)(sl_now_ns() - r->start_ns) / 1e9;
    double ttfb =
        r->att.t_first_byte_ns ? (double)(r->att.t_first_byte_ns - r->att.t_sent_ns) / 1e9 : -1;
    json_t *o = json_object();
    json_object_set_new(o, "time", json_string(when));
    json_object_set_new(o, "id", json_string(r->id));
    json_object_set_new(o, "client", json_string(r->c->peer));
    if (m && m->method) {
        json_object_set_new(o, "method", json_string(m->method));
        json_object_set_new(o, "path", json_stringn(m->target, m->path_len));
    }
    json_object_set_new(o, "status", json_integer(r->status));
    json_object_set_new(o, "protocol", json_string(r->c->h2_stream ? "h2" : "http1"));
    json_object_set_new(o, "route", json_string(gw_route_name(r->route)));
    if (r->model)
        json_object_set_new(o, "model", json_string(r->model->name));
    if (r->att.pool)
        json_object_set_new(o, "upstream", json_string(r->att.pool->name));
    if (r->att.server)
        json_object_set_new(o, "server", json_string(r->att.server->url));
    if (r->att.upstatus)
        json_object_set_new(o, "upstream_status", json_integer(r->att.upstatus));
    json_object_set_new(o, "stream", json_boolean(r->att.resp_sse));
    json_object_set_new(o, "bytes_in", json_integer((json_int_t)r->bytes_in));
    json_object_set_new(o, "bytes_out", json_integer((json_int_t)r->bytes_out));
    json_object_set_new(o, "duration", json_real(dur));
    if (ttfb >= 0)
        json_object_set_new(o, "ttfb", json_real(ttfb));
    if (r->error_kind)
        json_object_set_new(o, "error", json_string(r->error_kind));
    gw_accesslog_user(o, r);
    if (r->llm.have_usage) {
        json_object_set_new(o, "prompt_tokens", json_integer(r->llm.prompt_tokens));
        json_object_set_new(o, "completion_tokens", json_integer(r->llm.completion_tokens));
    }
    if (r->llm.first_token_ns)
        json_object_set_new(o, "ttft", json_real(r->llm.ttft));
    if (r->model)
        json_object_set_new(o, "tier", json_string(gw_llm_tier(r)));
    json_object_set_new(o, "retries", json_integer(r->retries));
    if (r->trace_id[0])
        json_object_set_new(o, "trace_id", json_string(r->trace_id));
    char buf[2048];
    size_t n = json_dumpb(o, buf, sizeof(buf) - 1, JSON_COMPACT | JSON_REAL_PRECISION(6));
    json_decref(o);
    if (n == 0 || n >= sizeof(buf) - 1)
        return;
    buf[n++] = '\n';
    ssize_t w = write(fd, buf, n);
    (void)w;
}
