/*
 * checks_bench.c — what each check of bench/realistic.sh's "full" and
 * "full-sse" workloads (and policy.sh's full_sig) costs in process, as CPU
 * time of this thread per request, without the gateway around it: the
 * prompt's two texts through the rules, the 282-byte answer through the
 * output filter, an 8-event stream (+ [DONE]) through a stream filter, the
 * token check with a cached token, the signed check (64 tokens in turn,
 * fresh nonces, the store filling), and the in-process limiter's check,
 * settle and answer headers. The rules are the bench's: 1,001 words and
 * the regex 1[3-9]\d{9}, masks, output on.
 *
 * Built from tests/tools/ like the other tools; bench/RESULTS.md compares
 * two builds of it (this branch and its base) run in turn on one core.
 *
 *   build/tools/checks_bench [rounds, default 5] [iterations, default 100000]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conf/conf.h"
#include "filters/flt_internal.h"
#include "ratelimit/ratelimit.h"
#include "tests/tools/issue16_rules.h"
#include "tests/unit/test_auth_util.h"

/* CPU time of this thread: the machine is shared. */
static int64_t cb_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static const char cb_answer[] =
    "{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion\",\"created\":1700000000,\"model\":"
    "\"served-model\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"
    "\"The sea is vast and so calm.\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":"
    "31,\"completion_tokens\":9,\"total_tokens\":40}}";

static const char cb_event[] = "{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\","
                               "\"created\":1700000000,\"model\":\"bench-model\",\"choices\":[{"
                               "\"index\":0,\"delta\":{\"content\":\"tok \"},\"finish_reason\":"
                               "null}]}";

static flt_ruleset_t *cb_rules(void)
{
    char err[256];
    flt_ruleset_t *rs = issue16_rules(true, err, sizeof err);
    if (!rs) {
        fprintf(stderr, "checks_bench: rules: %s\n", err);
        exit(1);
    }
    return rs;
}

static void cb_fail(const char *what)
{
    fprintf(stderr, "checks_bench: %s\n", what);
    exit(1);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    long n = argc > 2 ? atol(argv[2]) : 100000;
    flt_ruleset_t *rs = cb_rules();
    static const char *const prompt[] = {
        "You are a helpful assistant.",
        "Write one sentence about the sea, please, in plain English."};

    /* auth: a cached HS256 token; 64 tokens with signatures */
    tconf_t t;
    tconf_default(&t);
    t.c.signing.required = false;
    auth_stores_t *st = auth_stores_new(0, 0);
    auth_t *a = t_auth(&t, st);
    if (!a)
        cb_fail("auth");
    enum { NTOK = 64, CB_BATCH = 1024 };
    char *tok[NTOK];
    static treq_t q[NTOK], sq[CB_BATCH];
    for (int i = 0; i < NTOK; i++) {
        char sub[32], jti[32];
        snprintf(sub, sizeof sub, "bench-user-%d", i);
        snprintf(jti, sizeof jti, "jti-%d", i);
        tok[i] = t_good_token(sub, jti);
        treq_make(&q[i], a, tok[i], T_NOW, "bench-nonce-0000000000");
    }
    auth_request_t plain = q[0].r;
    plain.timestamp = plain.nonce = plain.signature = NULL;
    plain.timestamp_len = plain.nonce_len = plain.signature_len = 0;

    /* ratelimit: per_user {requests_per_minute: 1000000, concurrent: 1000} */
    conf_ratelimit_t rc;
    memset(&rc, 0, sizeof(rc));
    rc.per_user.requests_per_minute = 1000000;
    rc.per_user.concurrent = 1000;
    rc.max_tokens = 2048;
    rc.max_keys = 100000;
    char err[256] = "";
    rl_t *rl = rl_new(&rc, NULL, err, sizeof err);
    rl_worker_t *rlw = rl ? rl_worker_new(rl, NULL, err, sizeof err) : NULL;
    if (!rlw)
        cb_fail(err);

    printf("| round | prompt (2 texts) | answer (282 B) | stream (8 events + [DONE]) | token "
           "(cached) | signed (token + sig + nonce) | limiter (check, settle, headers) |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    long nonce = 0;
    for (int r = 0; r < rounds; r++) {
        double us[6];
        int64_t t0 = cb_cpu_ns();
        for (long i = 0; i < n; i++)
            for (int k = 0; k < 2; k++)
                if (!flt_text_clean(rs, prompt[k], strlen(prompt[k])))
                    cb_fail("prompt not clean");
        us[0] = (double)(cb_cpu_ns() - t0) / 1e3 / (double)n;

        t0 = cb_cpu_ns();
        for (long i = 0; i < n; i++) {
            char *o = NULL;
            size_t ol = 0;
            if (flt_response_filter_bytes(rs, cb_answer, sizeof cb_answer - 1, &o, &ol) !=
                FLT_ANS_SAME)
                cb_fail("answer changed");
        }
        us[1] = (double)(cb_cpu_ns() - t0) / 1e3 / (double)n;

        long ns = n / 8;
        t0 = cb_cpu_ns();
        for (long i = 0; i < ns; i++) {
            flt_stream_t *s = flt_stream_new(rs);
            flt_out_t out = {0};
            for (int e = 0; e < 8; e++)
                if (flt_stream_event(s, cb_event, sizeof cb_event - 1, &out) != FLT_EV_PASS)
                    cb_fail("event changed");
            if (flt_stream_event(s, "[DONE]", 6, &out) != FLT_EV_REPLACE)
                cb_fail("[DONE]");
            flt_out_release(&out);
            flt_stream_free(s);
        }
        us[2] = (double)(cb_cpu_ns() - t0) / 1e3 / (double)ns;

        auth_result_t res;
        t0 = cb_cpu_ns();
        for (long i = 0; i < n; i++) {
            plain.authorization = q[i % NTOK].r.authorization;
            plain.authorization_len = q[i % NTOK].r.authorization_len;
            if (auth_check(a, NULL, &plain, T_NOW, &res, NULL, NULL, NULL) != AUTH_DONE ||
                res.reason != AUTH_OK)
                cb_fail("token");
        }
        us[3] = (double)(cb_cpu_ns() - t0) / 1e3 / (double)n;

        /* fresh nonces, signed ahead in batches: signing is not measured */
        int64_t spent = 0;
        long nsig = 0;
        while (nsig < n / 4) {
            for (long i = 0; i < CB_BATCH; i++) {
                treq_t *x = &sq[i];
                *x = q[i % NTOK];
                snprintf(x->nonce, sizeof(x->nonce), "bench-nonce-%010ld", nonce++);
                char key[65], jti[32];
                snprintf(jti, sizeof jti, "jti-%ld", i % NTOK);
                if (auth_signing_key(a, jti, strlen(jti), key) != 0)
                    cb_fail("signing key");
                treq_sign(x, key);
                treq_bind(x);
            }
            int64_t c0 = cb_cpu_ns();
            for (long i = 0; i < CB_BATCH; i++)
                if (auth_check(a, NULL, &sq[i].r, T_NOW, &res, NULL, NULL, NULL) != AUTH_DONE ||
                    res.reason != AUTH_OK)
                    cb_fail("signed");
            spent += cb_cpu_ns() - c0;
            nsig += CB_BATCH;
        }
        us[4] = (double)spent / 1e3 / (double)nsig;

        t0 = cb_cpu_ns();
        for (long i = 0; i < n; i++) {
            rl_request_t rq = {.user = "bench-user", .ip = "127.0.0.1", .tokens = 100};
            rl_decision_t d;
            rl_ticket_t *tk = NULL;
            if (rl_check(rlw, &rq, &d, &tk, NULL, NULL, NULL) != RL_DONE || !d.allowed)
                cb_fail("limiter");
            char hdrs[512];
            if (rl_format_headers(&d, hdrs, sizeof hdrs) <= 0)
                cb_fail("headers");
            rl_ticket_settle(tk, 50);
        }
        us[5] = (double)(cb_cpu_ns() - t0) / 1e3 / (double)n;
        printf("| %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", r + 1, us[0], us[1], us[2],
               us[3], us[4], us[5]);
        fflush(stdout);
    }
    rl_worker_free(rlw);
    rl_free(rl);
    for (int i = 0; i < NTOK; i++)
        free(tok[i]);
    auth_free(a);
    auth_stores_free(st);
    flt_ruleset_unref(rs);
    return 0;
}
