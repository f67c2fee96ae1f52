/*
 * fbq_bench — the cost of a durable accept into the journal queue: one
 * thread, then four sharing fdatasyncs (group commit). Prints figures; it
 * is a benchmark, not a test (it was an assert-less unit test before).
 *
 *   build/tools/fbq_bench [DIR] [N]     DIR: a directory on the disk to measure
 *                                       (default build/), N accepts (default 200)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/sl.h"
#include "fallback/fallback.h"

typedef struct fbq_bench {
    fb_qworker_t *w;
    int n;
    int failed;
} fbq_bench_t;

static void *fbq_bench_run(void *arg)
{
    fbq_bench_t *b = arg;
    static const char body[] = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}";
    for (int i = 0; i < b->n; i++) {
        fb_qaccept_t in = {.user = "u",
                           .route = "/v1/chat/completions",
                           .body = body,
                           .body_len = sizeof(body) - 1};
        fb_qres_t r;
        if (fb_queue_accept(b->w, &in, &r, NULL, NULL, NULL) != FB_DONE || r.status != FB_Q_OK)
            b->failed++;
        fb_qres_clear(&r);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    const char *base = argc > 1 ? argv[1] : "build";
    int n = argc > 2 ? atoi(argv[2]) : 200;
    if (n < 4)
        n = 4;
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/fbq-bench-%d", base, (int)getpid());
    conf_fb_queue_t c = {.enabled = true,
                         .store = CONF_QUEUE_STORE_JOURNAL,
                         .dir = dir,
                         .max_attempts = 5,
                         .max_age_ms = 3600000,
                         .backoff_ms = 1000,
                         .backoff_max_ms = 60000,
                         .lease_ms = 120000,
                         .keep_ms = 86400000,
                         .max_pending = 1000000};
    char err[256];
    fb_queue_t *q = fb_queue_new(&c, NULL, err, sizeof(err));
    if (!q) {
        fprintf(stderr, "fbq_bench: %s\n", err);
        return 1;
    }
    fb_qworker_t *w = fb_qworker_new(q, NULL, err, sizeof(err));
    if (!w) {
        fprintf(stderr, "fbq_bench: %s\n", err);
        fb_queue_free(q);
        return 1;
    }
    int64_t t0 = sl_now_ns();
    fbq_bench_t b1 = {.w = w, .n = n};
    fbq_bench_run(&b1);
    int64_t t1 = sl_now_ns();
    pthread_t th[4];
    fbq_bench_t b4[4];
    for (int i = 0; i < 4; i++) {
        b4[i] = (fbq_bench_t){.w = w, .n = n / 4};
        pthread_create(&th[i], NULL, fbq_bench_run, &b4[i]);
    }
    int failed = b1.failed;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        failed += b4[i].failed;
    }
    int64_t t2 = sl_now_ns();
    printf("fsync cost on %s: %.1f us per accept (1 thread), %.1f us per accept (4 threads, "
           "group commit); %d failed\n",
           base, (double)(t1 - t0) / n / 1000.0, (double)(t2 - t1) / (n / 4 * 4) / 1000.0, failed);
    fb_qworker_free(w);
    fb_queue_free(q);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        return 1;
    return failed ? 1 : 0;
}
