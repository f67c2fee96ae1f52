/*
 * rl_bench — the in-process limiter's cost per check (rl_check + settling
 * the ticket), in ns, single-threaded and with 2 threads, on 1000 users
 * with every limit on (requests, concurrency, both token budgets) and
 * limits high enough that every check is allowed (the common path).
 *
 *   build/tools/rl_bench [checks_per_thread]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conf/conf.h"
#include "ratelimit/ratelimit.h"

#define NUSERS 1000

static char users[NUSERS][24];

typedef struct job {
    rl_worker_t *w;
    long n;
    int offset;
    double ns, cpu_ns;
    pthread_barrier_t *go;
} job_t;

/* The machine is shared: CPU time of this thread is the steadier figure. */
static int64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *run(void *arg)
{
    job_t *j = arg;
    rl_decision_t d;
    if (j->go)
        pthread_barrier_wait(j->go);
    int64_t t0 = sl_now_ns(), c0 = cpu_ns();
    for (long i = 0; i < j->n; i++) {
        rl_request_t req = {.user = users[(i + j->offset) % NUSERS], .tokens = 300};
        rl_ticket_t *t = NULL;
        if (rl_check(j->w, &req, &d, &t, NULL, NULL, NULL) != RL_DONE || !d.allowed) {
            fprintf(stderr, "rl_bench: unexpected refusal\n");
            exit(1);
        }
        rl_ticket_settle(t, 250);
    }
    j->ns = (double)(sl_now_ns() - t0) / (double)j->n;
    j->cpu_ns = (double)(cpu_ns() - c0) / (double)j->n;
    return NULL;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    conf_ratelimit_t c;
    memset(&c, 0, sizeof(c));
    c.per_user.requests_per_minute = 1000000;
    c.per_user.concurrent = 1000;
    c.per_user.tokens_per_minute = 1000000000;
    c.per_user.tokens_per_day = 1000000000000LL;
    c.max_tokens = 2048;
    c.max_keys = 100000;
    char err[256];
    rl_t *rl = rl_new(&c, NULL, err, sizeof(err));
    if (!rl) {
        fprintf(stderr, "rl_bench: %s\n", err);
        return 1;
    }
    for (int i = 0; i < NUSERS; i++)
        snprintf(users[i], sizeof(users[i]), "user-%d", i);
    rl_worker_t *w1 = rl_worker_new(rl, NULL, err, sizeof(err));
    rl_worker_t *w2 = rl_worker_new(rl, NULL, err, sizeof(err));

    job_t warm = {.w = w1, .n = n / 10};
    run(&warm);
    job_t one = {.w = w1, .n = n};
    run(&one);
    printf("1 thread:  %.0f ns per check wall, %.0f ns CPU (%.2f M checks/s)\n", one.ns, one.cpu_ns,
           1e3 / one.ns);

    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    job_t two[2] = {{.w = w1, .n = n, .offset = 0, .go = &go},
                    {.w = w2, .n = n, .offset = NUSERS / 2, .go = &go}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, run, &two[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    double per = (two[0].ns + two[1].ns) / 2, cpu = (two[0].cpu_ns + two[1].cpu_ns) / 2;
    printf("2 threads: %.0f ns per check per thread wall, %.0f ns CPU (%.2f M checks/s "
           "together)\n",
           per, cpu, 2e3 / per);
    pthread_barrier_destroy(&go);
    rl_worker_free(w1);
    rl_worker_free(w2);
    rl_free(rl);
    return 0;
}
