/*
 * auth_redis.c — the shared (Redis) variant of the nonce and revocation
 * stores, so a replay or a revocation is seen by every sluice instance.
 *
 * One round trip per request: a Lua script looks up the token's jti and
 * sub revocations and, when the request is signed, claims its nonce with
 * SET NX EX — in that order, so a revoked token does not burn a nonce.
 * Redis runs a script atomically, which is what makes copies of one signed
 * request spread over several instances let exactly one through.
 *
 * Keys:  sluice:rev:j:<jti>          "1" until the revocation expires
 *        sluice:rev:s:<sub>          revoked_at (Unix s): iat <= it is revoked
 *        sluice:nonce:<hex16>        "1" for window seconds past its timestamp
 *
 * Any failure (down, late, an error reply, an unexpected reply) goes to
 * auth_store_fallback(), which applies on_store_error.
 */
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth/auth_internal.h"
#include "common/log.h"
#include "common/redis.h"

static const char check_lua[] =
    "if redis.call('EXISTS', KEYS[1]) == 1 then return 1 end\n"
    "local cut = redis.call('GET', KEYS[2])\n"
    "if cut and tonumber(ARGV[1]) <= tonumber(cut) then return 1 end\n"
    "if #KEYS >= 3 and not redis.call('SET', KEYS[3], '1', 'NX', 'EX', ARGV[2]) then\n"
    "  return 2\n"
    "end\n"
    "return 0\n";

/* ARGV: now, ttl, then "j"/"s" per key saying which kind it is. A sub's
 * cut-off only ever moves forward, whichever instance's clock is ahead. */
static const char revoke_lua[] = "for i = 1, #KEYS do\n"
                                 "  if ARGV[2 + i] == 's' then\n"
                                 "    local cur = redis.call('GET', KEYS[i])\n"
                                 "    if (not cur) or tonumber(cur) < tonumber(ARGV[1]) then\n"
                                 "      redis.call('SET', KEYS[i], ARGV[1], 'EX', ARGV[2])\n"
                                 "    else\n"
                                 "      redis.call('EXPIRE', KEYS[i], ARGV[2])\n"
                                 "    end\n"
                                 "  else\n"
                                 "    redis.call('SET', KEYS[i], '1', 'EX', ARGV[2])\n"
                                 "  end\n"
                                 "end\n"
                                 "return #KEYS\n";

static pthread_once_t scripts_once = PTHREAD_ONCE_INIT;
static sl_redis_script_t *s_check, *s_revoke;

static void scripts_init(void)
{
    s_check = sl_redis_script_new(check_lua);
    s_revoke = sl_redis_script_new(revoke_lua);
}

struct auth_pending {
    const auth_t *a;
    sl_redis_call_t *call;
    int64_t now;
    void *arg;
    /* check */
    auth_check_cb cb;
    auth_redis_job_t job;
    auth_result_t res;
    /* revoke */
    auth_reply_cb rcb;
    int64_t until;
    char jti[AUTH_JTI_MAX + 1];
    char sub[AUTH_SUB_MAX + 1];
};

#define KEY_CAP (32 + AUTH_SUB_MAX)

void auth_pending_cancel(auth_pending_t *p)
{
    if (!p)
        return;
    sl_redis_call_cancel(p->call);
    free(p);
}

static void check_done(void *arg, sl_redis_status_t st, struct redisReply *reply)
{
    auth_pending_t *p = arg;
    auth_result_t res = p->res;
    if (st == SL_REDIS_OK && reply->type == REDIS_REPLY_INTEGER && reply->integer >= 0 &&
        reply->integer <= 2) {
        if (reply->integer == 1)
            auth_finish(&res, AUTH_R_TOKEN_REVOKED);
        else if (reply->integer == 2)
            auth_finish(&res, AUTH_R_SIG_REPLAY);
    } else {
        if (st == SL_REDIS_OK)
            sl_warn("auth: unexpected reply from the check script (type %d)", reply->type);
        auth_store_fallback(p->a, &p->job, p->now, &res);
    }
    auth_check_cb cb = p->cb;
    void *cb_arg = p->arg;
    free(p);
    cb(cb_arg, &res);
}

auth_status_t auth_redis_check(const auth_t *a, sl_redis_t *redis, const auth_redis_job_t *job,
                               int64_t now, auth_result_t *res, auth_check_cb cb, void *arg,
                               auth_pending_t **pending)
{
    pthread_once(&scripts_once, scripts_init);
    auth_pending_t *p = calloc(1, sizeof(*p));
    if (!p || !s_check) {
        free(p);
        auth_store_fallback(a, job, now, res);
        return AUTH_DONE;
    }
    char kj[KEY_CAP], ks[KEY_CAP], kn[64], iat[24], ttl[24], hex[2 * AUTH_NONCE_KEY_LEN + 1];
    snprintf(kj, sizeof(kj), "sluice:rev:j:%s", job->claims.jti);
    snprintf(ks, sizeof(ks), "sluice:rev:s:%s", job->claims.sub);
    /* Without iat every token of a revoked sub counts as older (the Lua
     * compares -1 <= cut); the request path never lets one get here. */
    snprintf(iat, sizeof(iat), "%lld", job->claims.has_iat ? (long long)job->claims.iat : -1LL);
    sl_hex(job->nonce_key, AUTH_NONCE_KEY_LEN, hex);
    snprintf(kn, sizeof(kn), "sluice:nonce:%s", hex);
    int64_t t = job->nonce_expires - now + 1;
    snprintf(ttl, sizeof(ttl), "%lld", (long long)(t > 0 ? t : 1));
    const char *argv[] = {kj, ks, kn, iat, ttl};
    const char *argv2[] = {kj, ks, iat, ttl};
    p->a = a;
    p->now = now;
    p->cb = cb;
    p->arg = arg;
    p->job = *job;
    p->res = *res;
    if (job->check_nonce)
        p->call = sl_redis_evalsha(redis, s_check, 3, 5, argv, NULL, check_done, p);
    else
        p->call = sl_redis_evalsha(redis, s_check, 2, 4, argv2, NULL, check_done, p);
    if (!p->call) {
        free(p);
        auth_store_fallback(a, job, now, res);
        return AUTH_DONE;
    }
    *pending = p;
    return AUTH_PENDING;
}

static void revoke_done(void *arg, sl_redis_status_t st, struct redisReply *reply)
{
    auth_pending_t *p = arg;
    auth_http_reply_t out;
    int rc;
    if (st == SL_REDIS_OK && reply->type == REDIS_REPLY_INTEGER) {
        rc = auth_revoke_reply(&out, p->jti[0] ? p->jti : NULL, p->sub[0] ? p->sub : NULL, p->until,
                               "redis");
    } else {
        sl_warn("auth: revocation not written to Redis (%s); it holds on this instance only",
                st == SL_REDIS_TIMEOUT ? "timeout"
                : st == SL_REDIS_DOWN  ? "down"
                                       : "error");
        rc = auth_error_reply(&out, 503, "server_error", "store_unavailable",
                              "recorded on this instance only: the shared store failed; retry");
    }
    if (rc != 0) {
        memset(&out, 0, sizeof(out));
        out.status = 500;
    }
    auth_reply_cb cb = p->rcb;
    void *cb_arg = p->arg;
    free(p);
    cb(cb_arg, &out);
}

auth_status_t auth_redis_revoke(const auth_t *a, sl_redis_t *redis, const char *jti,
                                const char *sub, int64_t now, int64_t until, auth_reply_cb cb,
                                void *arg, auth_pending_t **pending, auth_http_reply_t *out)
{
    pthread_once(&scripts_once, scripts_init);
    auth_pending_t *p = calloc(1, sizeof(*p));
    char kj[KEY_CAP], ks[KEY_CAP], snow[24], sttl[24];
    const char *argv[6];
    int nkeys = 0;
    if (!p || !s_revoke)
        goto fail;
    snprintf(snow, sizeof(snow), "%lld", (long long)now);
    snprintf(sttl, sizeof(sttl), "%lld", (long long)(until - now + 1));
    if (jti) {
        snprintf(kj, sizeof(kj), "sluice:rev:j:%s", jti);
        snprintf(p->jti, sizeof(p->jti), "%s", jti);
        argv[nkeys++] = kj;
    }
    if (sub) {
        snprintf(ks, sizeof(ks), "sluice:rev:s:%s", sub);
        snprintf(p->sub, sizeof(p->sub), "%s", sub);
        argv[nkeys++] = ks;
    }
    int argc = nkeys;
    argv[argc++] = snow;
    argv[argc++] = sttl;
    if (jti)
        argv[argc++] = "j";
    if (sub)
        argv[argc++] = "s";
    p->a = a;
    p->now = now;
    p->rcb = cb;
    p->arg = arg;
    p->until = until;
    p->call = sl_redis_evalsha(redis, s_revoke, nkeys, argc, argv, NULL, revoke_done, p);
    if (!p->call)
        goto fail;
    *pending = p;
    return AUTH_PENDING;
fail:
    free(p);
    if (auth_error_reply(out, 503, "server_error", "store_unavailable",
                         "recorded on this instance only: the shared store failed; retry") != 0)
        out->status = 500;
    return AUTH_DONE;
}
