/*
 * cache_bench.c — figures of cache/ on one core (built and run by
 * bench/cache_bench.sh against build/libsluice.a):
 *
 *   semantic lookup at N entries in one partition (the worst case: every
 *   question under one system prompt), dimensions 384 / 768 / 1024, with
 *   the kernel chosen for this CPU and, interleaved in the same run, the
 *   AVX2 and scalar kernels (ratios to the chosen one); p50 / p99 of
 *   cache_sem_lookup, hits checked against the expected answer;
 *
 *   the exact-hit path per request: key + lookup + decode + render (JSON
 *   body, and SSE), in microseconds of CPU.
 *
 * Vectors are deterministic and clustered like sentence embeddings (a
 * shared direction plus noise: neighbours sit at cosine ~0.6-0.8), queries
 * alternate between near-duplicates of stored entries (cosine ~0.97) and
 * fresh ones.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/cache.h"
#include "cache/cache_internal.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0 * 2 - 1;
}

static int64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static void make_vec(float *v, const float *center, size_t d, double noise)
{
    for (size_t i = 0; i < d; i++)
        v[i] = (float)(center[i] + noise * rnd());
}

static void unit(float *v, size_t d)
{
    double ss = 0;
    for (size_t i = 0; i < d; i++)
        ss += (double)v[i] * v[i];
    for (size_t i = 0; i < d; i++)
        v[i] = (float)(v[i] / sqrt(ss));
}

/* q = c * u + sqrt(1 - c^2) * w, w a random unit vector orthogonal to u:
 * exactly cosine c with u. */
static void at_cos(const float *u, double c, float *q, size_t d)
{
    float *w = malloc(d * sizeof(float));
    for (size_t i = 0; i < d; i++)
        w[i] = (float)rnd();
    double dp = 0;
    for (size_t i = 0; i < d; i++)
        dp += (double)w[i] * u[i];
    for (size_t i = 0; i < d; i++)
        w[i] = (float)(w[i] - dp * u[i]);
    unit(w, d);
    double s = sqrt(1 - c * c);
    for (size_t i = 0; i < d; i++)
        q[i] = (float)(c * u[i] + s * w[i]);
    free(w);
}

static void pct(int64_t *lat, int n, double *p50, double *p99)
{
    qsort(lat, (size_t)n, sizeof(int64_t), cmp_i64);
    *p50 = lat[n / 2] / 1e6;
    *p99 = lat[n * 99 / 100] / 1e6;
}

/* One index, two ways of searching it, interleaved query by query: the
 * two-pass search (sketch, then exact) and the flat scan (the reference
 * for recall: both must name the same entry). */
static void bench_semantic(size_t n, size_t d, int queries)
{
    cache_sem_t *s = cache_sem_new(n, 4, 0);
    unsigned char part[32] = {1};
    float *center = malloc(d * sizeof(float));
    float *stored = malloc((size_t)1000 * d * sizeof(float)); /* the first 1000, for queries */
    float *v = malloc(d * sizeof(float));
    for (size_t i = 0; i < d; i++)
        center[i] = (float)rnd();
    for (size_t i = 0; i < n; i++) {
        make_vec(v, center, d, 1.0);
        unit(v, d);
        if (i < 1000)
            memcpy(stored + i * d, v, d * sizeof(float));
        unsigned char key[32] = {0};
        memcpy(key, &i, sizeof(i));
        if (cache_sem_add(s, part, v, d, key, INT64_MAX) != 0) {
            fprintf(stderr, "add failed\n");
            exit(1);
        }
    }
    /* First the two-pass search alone (the index as production has it), then
     * both interleaved (the flat scan evicts the sketches: a colder figure). */
    int64_t *alone = malloc((size_t)queries * sizeof(int64_t));
    cache_sem_set_flat_max(s, 0);
    for (int q = 0; q < queries; q++) {
        if (q % 2 == 0)
            at_cos(stored + ((size_t)q % 1000) * d, 0.951 + 0.039 * (rnd() + 1) / 2, v, d);
        else
            make_vec(v, center, d, 1.0);
        unsigned char g[32];
        double sm;
        int64_t t0 = cpu_ns();
        (void)cache_sem_lookup(s, part, v, d, 0.95, 0, g, &sm);
        alone[q] = cpu_ns() - t0;
    }
    double l50, l99;
    pct(alone, queries, &l50, &l99);
    free(alone);
    printf("semantic n=%zu dim=%-4zu two-pass alone: p50 %.3f ms p99 %.3f ms\n", n, d, l50, l99);
    int64_t *lat2 = malloc((size_t)queries * sizeof(int64_t));
    int64_t *latf = malloc((size_t)queries * sizeof(int64_t));
    int hits = 0, right = 0, agree = 0, false_hits = 0, dups = 0;
    for (int q = 0; q < queries; q++) {
        bool dup = q % 2 == 0;
        size_t target = (size_t)q % 1000;
        if (dup) /* a paraphrase just above the threshold: cosine 0.951..0.99 */
            at_cos(stored + target * d, 0.951 + 0.039 * (rnd() + 1) / 2, v, d);
        else
            make_vec(v, center, d, 1.0);
        dups += dup;
        unsigned char g2[32], gf[32];
        double s2 = 0, sf = 0;
        cache_sem_set_flat_max(s, 0);
        int64_t t0 = cpu_ns();
        int h2 = cache_sem_lookup(s, part, v, d, 0.95, 0, g2, &s2);
        lat2[q] = cpu_ns() - t0;
        cache_sem_set_flat_max(s, SIZE_MAX);
        t0 = cpu_ns();
        int hf = cache_sem_lookup(s, part, v, d, 0.95, 0, gf, &sf);
        latf[q] = cpu_ns() - t0;
        agree += h2 == hf && (!h2 || memcmp(g2, gf, 32) == 0);
        hits += h2 && dup;
        if (h2 && dup) {
            size_t k;
            memcpy(&k, g2, sizeof(k));
            right += k == target;
        }
        false_hits += h2 && !dup;
    }
    double a50, a99, f50, f99;
    pct(lat2, queries, &a50, &a99);
    pct(latf, queries, &f50, &f99);
    printf("semantic n=%zu dim=%-4zu interleaved: two-pass p50 %.3f ms p99 %.3f ms | flat p50 %.3f "
           "ms p99 "
           "%.3f ms | two-pass/flat p99 %.2f | paraphrases (cos 0.951-0.99) hit %d/%d, right %d; "
           "fresh false hits %d; agrees with flat %d/%d\n",
           n, d, a50, a99, f50, f99, a99 / f99, hits, dups, right, false_hits, agree, queries);
    free(lat2);
    free(latf);
    free(v);
    free(stored);
    free(center);
    cache_sem_free(s);
}

/* Kernel comparison on the raw scan (no index around it), interleaved. */
static void bench_kernels(size_t n, size_t d)
{
    int8_t *m = malloc(n * d), q[8192];
    for (size_t i = 0; i < n * d; i++)
        m[i] = (int8_t)(rnd() * 127);
    for (size_t i = 0; i < d; i++)
        q[i] = (int8_t)(rnd() * 127);
    struct {
        const char *name;
        cache_dot_fn fn;
        int64_t ns;
    } k[] = {{"scalar", cache_dot_i8_ref, 0},
             {"avx2", cache_dot_i8_avx2, 0},
             {"chosen", cache_dot_get(), 0}};
    volatile int64_t sink = 0;
    for (int round = 0; round < 5; round++)
        for (size_t j = 0; j < 3; j++) {
            int64_t t0 = cpu_ns();
            int64_t acc = 0;
            for (size_t i = 0; i < n; i++)
                acc += k[j].fn(q, m + i * d, d);
            k[j].ns += cpu_ns() - t0;
            sink += acc;
        }
    printf("scan n=%zu dim=%zu (5 rounds interleaved, mean per scan): scalar %.3f ms, avx2 %.3f "
           "ms, %s %.3f ms; chosen/scalar %.3f, chosen/avx2 %.3f\n",
           n, d, k[0].ns / 5e6, k[1].ns / 5e6, cache_dot_kernel(), k[2].ns / 5e6,
           (double)k[2].ns / k[0].ns, (double)k[2].ns / k[1].ns);
    (void)sink;
    free(m);
}

static void bench_hit_path(int iters)
{
    char yaml[] = "listen: [{address: \"127.0.0.1:1\"}]\n"
                  "upstreams: {u: {servers: [{url: \"http://127.0.0.1:2\"}]}}\n"
                  "models: {chat: {upstream: u}}\n"
                  "cache: {enabled: true}\n";
    char err[256];
    conf_t *conf = conf_load_string(yaml, strlen(yaml), "b.yaml", err, sizeof(err));
    cache_t *c = cache_new(conf, err, sizeof(err));
    cache_worker_t *w = cache_worker_new(c, NULL, err, sizeof(err));
    const char *req = "{\"model\":\"chat\",\"temperature\":0,\"messages\":[{\"role\":\"system\","
                      "\"content\":\"You are a helpful assistant.\"},{\"role\":\"user\","
                      "\"content\":\"What are your opening hours on Sunday?\"}]}";
    const char *ans =
        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1700000000,\"model\":"
        "\"chat\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"We "
        "are open from 10:00 to 18:00 on Sundays, and from 9:00 to 20:00 on weekdays. Public "
        "holidays may differ: check the app's store page for the week's hours.\"},"
        "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":40,"
        "\"total_tokens\":70}}";
    json_t *body = json_loads(req, 0, NULL), *aj = json_loads(ans, 0, NULL);
    cache_req_in_t in = {.conf = conf, .body = body, .model = "chat", .sub = "alice"};
    cache_req_t *q = cache_req_new(c, &in);
    cache_req_record_body(q, aj);
    (void)cache_store(w, q, 1000);
    cache_req_free(q);
    for (int mode = 0; mode < 4; mode++) {
        int64_t t0 = cpu_ns();
        size_t bytes = 0;
        for (int i = 0; i < iters; i++) {
            /* the hook parses the body anyway; the cache adds this */
            q = cache_req_new(c, &in);
            (void)cache_lookup(w, q, 2000, NULL, NULL);
            if (cache_req_state(q) != CACHE_HIT) {
                fprintf(stderr, "expected a hit\n");
                exit(1);
            }
            size_t len = 0;
            char *out;
            if (mode >= 2) { /* the fast path: pre-rendered at store time */
                const char *r = cache_entry_rendered(cache_req_entry(q), mode == 3, false, &len);
                out = malloc(len);
                memcpy(out, r, len);
            } else if (mode == 0) {
                json_t *j = cache_entry_json(cache_req_entry(q), NULL);
                out = json_dumps(j, JSON_COMPACT);
                len = strlen(out);
                json_decref(j);
            } else {
                out = cache_entry_sse_body(cache_req_entry(q), NULL, &len);
            }
            bytes += len;
            free(out);
            cache_req_free(q);
        }
        static const char *const names[] = {"JSON, rendered per hit", "SSE, rendered per hit",
                                            "JSON, pre-rendered", "SSE, pre-rendered"};
        printf("exact hit path (%s): %.2f us CPU per request (%zu bytes out)\n", names[mode],
               (cpu_ns() - t0) / 1e3 / iters, bytes / (size_t)iters);
    }
    json_decref(body);
    json_decref(aj);
    cache_worker_free(w);
    cache_free(c);
    conf_free(conf);
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? (size_t)atol(argv[1]) : 100000;
    int queries = argc > 2 ? atoi(argv[2]) : 400;
    printf("cache bench: dot kernel %s, one thread\n", cache_dot_kernel());
    bench_hit_path(20000);
    bench_kernels(n, 384);
    size_t dims[] = {384, 768, 1024};
    for (size_t i = 0; i < 3; i++)
        bench_semantic(n, dims[i], queries);
    return 0;
}
