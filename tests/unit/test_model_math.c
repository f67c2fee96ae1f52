/*
 * test_model_math.c — the transformer's small pieces against cases worked
 * out by hand (not by the NumPy reference, so a misunderstanding shared by
 * engine and reference cannot pass): NEOX RoPE pairing, attention with a
 * causal softmax, RMSNorm; and the sampler and streaming UTF-8 decoder.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/chat_internal.h"
#include "model/qwen2_internal.h"

#define NEAR(a, b, tol) assert_true(fabs((double)(a) - (double)(b)) <= (tol))

static void test_rope_hand(void **state)
{
    (void)state;
    /* One 4-dim head at position 1, base 10000. NEOX pairs element i with
     * i + 2: (x0, x2) turn by theta_0 = 1 rad, (x1, x3) by theta_1 =
     * 10000^(-2/4) = 0.01 rad. cos 1 = 0.5403023059, sin 1 = 0.8414709848,
     * cos 0.01 = 0.9999500004, sin 0.01 = 0.0099998333. */
    float v[4] = {1, 2, 3, 4};
    mdl_rope_apply(v, 1, 4, 1, 10000.0);
    NEAR(v[0], 1 * 0.5403023059 - 3 * 0.8414709848, 1e-6); /* -1.9841106 */
    NEAR(v[2], 1 * 0.8414709848 + 3 * 0.5403023059, 1e-6); /* 2.4623779 */
    NEAR(v[1], 2 * 0.9999500004 - 4 * 0.0099998333, 1e-6); /* 1.9599007 */
    NEAR(v[3], 2 * 0.0099998333 + 4 * 0.9999500004, 1e-6); /* 4.0197997 */
    /* GPT-J (interleaved) pairing would have turned (x0, x1) instead. */
    assert_false(fabsf(v[1] - (1 * 0.8414710f + 2 * 0.5403023f)) < 1e-3f);
    /* Position 0 is the identity; two heads turn alike. */
    float w[8] = {1, 2, 3, 4, 1, 2, 3, 4};
    mdl_rope_apply(w, 2, 4, 0, 10000.0);
    for (int i = 0; i < 4; i++)
        assert_true(w[i] == (float)(i + 1));
    mdl_rope_apply(w, 2, 4, 1, 10000.0);
    for (int i = 0; i < 4; i++)
        assert_true(w[i] == w[i + 4]);
    NEAR(w[0], v[0], 1e-7);
    /* A large position stays accurate (the angle is computed in double):
     * pos 3000, theta_0 = 3000 rad; cos 3000 = -0.9879392... */
    float z[4] = {1, 0, 0, 0};
    mdl_rope_apply(z, 1, 4, 3000, 10000.0);
    NEAR(z[0], cos(3000.0), 1e-6);
    NEAR(z[2], sin(3000.0), 1e-6);
}

static void test_attention_hand(void **state)
{
    (void)state;
    const mdl_kernels_t *k = mdl_kernels_select(MDL_KL_AVX512);
    const mdl_kernels_t *ks = mdl_kernels_select(MDL_KL_SCALAR);
    /* q = (1, 0); keys (1, 0) and (0, 1); values (1, 2) and (3, 4); hd 2.
     * scores = (1/sqrt 2, 0) = (0.7071068, 0); softmax: p0 = e^0.7071068 /
     * (e^0.7071068 + 1) = 2.0281150 / 3.0281150 = 0.6697615, p1 = 0.3302385;
     * out = (p0 + 3 p1, 2 p0 + 4 p1) = (1.6604770, 2.6604770). */
    float q[2] = {1, 0}, K[4] = {1, 0, 0, 1}, V[4] = {1, 2, 3, 4}, sc[2], out[2];
    mdl_attend(k, q, K, V, 2, 2, sc, out);
    NEAR(out[0], 1.6604770, 1e-6);
    NEAR(out[1], 2.6604770, 1e-6);
    mdl_attend(ks, q, K, V, 2, 2, sc, out);
    NEAR(out[0], 1.6604770, 1e-6);
    /* causal: with only the first position visible the output is V[0] */
    mdl_attend(k, q, K, V, 1, 2, sc, out);
    NEAR(out[0], 1.0, 1e-7);
    NEAR(out[1], 2.0, 1e-7);
    /* large scores do not overflow (max is subtracted first) */
    float qb[2] = {1000, 0};
    mdl_attend(k, qb, K, V, 2, 2, sc, out);
    NEAR(out[0], 1.0, 1e-6);
}

static void test_rmsnorm_hand(void **state)
{
    (void)state;
    /* x = (1, 2, 3, 4): mean square 7.5, rms 2.7386128 */
    float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 2, 0.5f}, y[4];
    mdl_rmsnorm(y, x, w, 4, 0.0f);
    NEAR(y[0], 0.3651484, 1e-6);
    NEAR(y[1], 0.7302967, 1e-6);
    NEAR(y[2], 2.1908902, 1e-6);
    NEAR(y[3], 0.7302967, 1e-6);
    float zero[4] = {0}, out[4];
    mdl_rmsnorm(out, zero, w, 4, 1e-6f);
    assert_true(out[0] == 0.0f);
}

/* ---- UTF-8 streaming ---- */

static size_t feed_str(mdl_utf8_t *u, const char *s, size_t n, uint8_t *out)
{
    return mdl_utf8_feed(u, (const uint8_t *)s, n, out);
}

static void test_utf8_stream(void **state)
{
    (void)state;
    uint8_t out[64];
    mdl_utf8_t u = {0};
    /* "é" (C3 A9) split across two tokens: nothing, then both bytes */
    assert_int_equal(feed_str(&u, "a\xC3", 2, out), 1);
    assert_int_equal(out[0], 'a');
    assert_int_equal(feed_str(&u, "\xA9z", 2, out), 3);
    assert_memory_equal(out, "\xC3\xA9z", 3);
    /* a 4-byte emoji one byte at a time */
    const char *emoji = "\xF0\x9F\x98\x80";
    for (int i = 0; i < 3; i++)
        assert_int_equal(feed_str(&u, emoji + i, 1, out), 0);
    assert_int_equal(feed_str(&u, emoji + 3, 1, out), 4);
    assert_memory_equal(out, emoji, 4);
    /* a broken sequence: C3 then 'x' -> U+FFFD, 'x' */
    assert_int_equal(feed_str(&u, "\xC3x", 2, out), 4);
    assert_memory_equal(out, "\xEF\xBF\xBDx", 4);
    /* stray continuation byte, invalid lead bytes, overlong, surrogate */
    assert_int_equal(feed_str(&u, "\x80", 1, out), 3);
    assert_int_equal(feed_str(&u, "\xC0\xFF", 2, out), 6);
    assert_int_equal(feed_str(&u, "\xE0\x80", 2, out), 6); /* E0 needs A0..BF: two FFFD */
    assert_int_equal(feed_str(&u, "\xED\xA0\x80", 3, out), 9);
    assert_int_equal(feed_str(&u, "\xF4\x90", 2, out), 6); /* above U+10FFFF */
    /* held bytes at the end become one U+FFFD */
    assert_int_equal(feed_str(&u, "\xE4\xB8", 2, out), 0);
    assert_int_equal(mdl_utf8_flush(&u, out), 3);
    assert_memory_equal(out, "\xEF\xBF\xBD", 3);
    assert_int_equal(mdl_utf8_flush(&u, out), 0);
    /* CJK byte by byte, interleaved with ASCII */
    const char *s = "\xE4\xB8\xAD"
                    "b"
                    "\xE6\x96\x87";
    size_t total = 0;
    uint8_t all[16];
    for (int i = 0; i < 7; i++)
        total += feed_str(&u, s + i, 1, all + total);
    assert_int_equal(total, 7);
    assert_memory_equal(all, s, 7);
}

/* ---- sampler ---- */

static void test_sampler_greedy_and_penalty(void **state)
{
    (void)state;
    mdl_sampling_t p = {0};
    p.repetition_penalty = 1.0f;
    p.top_p = 1.0f;
    mdl_sampler_t *s = mdl_sampler_new(6, 5, &p);
    assert_non_null(s);
    float lg[6] = {0.1f, 2.0f, 1.9f, -1.0f, 0.0f, 99.0f}; /* id 5 is padding */
    assert_int_equal(mdl_sampler_sample(s, lg, NULL, 0), 1);
    /* penalty 1.1 on id 1: 2.0 / 1.1 = 1.818 < 1.9 -> id 2 */
    s->p.repetition_penalty = 1.1f;
    float lg2[6] = {0.1f, 2.0f, 1.9f, -1.0f, 0.0f, 99.0f};
    int32_t hist[3] = {1, 1, 3};
    assert_int_equal(mdl_sampler_sample(s, lg2, hist, 3), 2);
    assert_true(fabsf(lg2[1] - 2.0f / 1.1f) < 1e-6f); /* once, not twice */
    assert_true(fabsf(lg2[3] - -1.1f) < 1e-6f);       /* negative: multiplied */
    /* only the last 64 tokens count */
    int32_t longh[100];
    for (int i = 0; i < 100; i++)
        longh[i] = i < 36 ? 1 : 4;
    float lg3[6] = {0.1f, 2.0f, 1.9f, -1.0f, 0.0f, 99.0f};
    assert_int_equal(mdl_sampler_sample(s, lg3, longh, 100), 1);
    mdl_sampler_free(s);
    mdl_sampler_free(NULL);
}

/* The sampler as it was before mdl_argmax and the top-k heap (serial
 * argmax, a qsort of every candidate, then the first top_k), kept here as
 * the reference its outputs must match for the same seed and parameters.
 * The penalty, the candidates' collection and the draw from the sorted
 * candidates never changed: it calls the product's. */
static int32_t ref_sample(mdl_sampler_t *s, float *logits, const int32_t *hist, int n_hist)
{
    int n = s->n_valid;
    mdl_sampler_penalize(s, logits, hist, n_hist);
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    float temp = s->p.temperature;
    if (!(temp > 0.0f))
        return best;
    float maxl = logits[best];
    int c = mdl_sampler_collect(s, logits, maxl, temp);
    if (c == 0)
        return best;
    qsort(s->cand, (size_t)c, sizeof(mdl_cand_t), mdl_cand_cmp);
    if (s->p.top_k > 0 && c > s->p.top_k)
        c = s->p.top_k;
    return mdl_sampler_draw(s, c, maxl, temp);
}

static int32_t serial_argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

static void test_silu_mul_matches_one_pass(void **state)
{
    (void)state;
    enum { N = 1000 }; /* not a multiple of the 256-value chunks */
    static float g[N], ref[N], u[N];
    mdl_rng_t r;
    mdl_rng_seed(&r, 3);
    for (int i = 0; i < N; i++) {
        g[i] = (float)(mdl_rng_uniform(&r) * 40.0 - 20.0);
        u[i] = (float)(mdl_rng_uniform(&r) * 4.0 - 2.0);
        ref[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
    static float g2[N];
    memcpy(g2, g, sizeof(g));
    mdl_silu_mul(NULL, g, u, N); /* libm: the same bits as the one-pass loop */
    assert_memory_equal(g, ref, sizeof(g));
    assert_true(fabsf(g[0]) > 0.0f || fabsf(u[0]) == 0.0f);
    /* the best kernels' vector expf: within a few ulp */
    const mdl_kernels_t *k = mdl_kernels_select(MDL_KL_AVX512);
    mdl_silu_mul(k, g2, u, N);
    for (int i = 0; i < N; i++)
        assert_true(fabsf(g2[i] - ref[i]) <= 4e-7f * fabsf(ref[i]) + 1e-30f);
}

/* Each value of the vector expf depends only on its input: a value alone
 * and inside any run gives the same bits (so rows are the same alone or
 * batched), and it stays within 1 ulp-ish of libm, also for the ends. */
static void test_vexpf_per_element(void **state)
{
    (void)state;
    const mdl_kernels_t *k = mdl_kernels_select(MDL_KL_AVX512);
    if (!k->vexpf)
        skip();
    enum { N = 203 };
    static float x[N], y[N];
    mdl_rng_t r;
    mdl_rng_seed(&r, 11);
    for (int i = 0; i < N; i++)
        x[i] = (float)(mdl_rng_uniform(&r) * 200.0 - 120.0);
    x[0] = -INFINITY;
    x[1] = 0.0f;
    x[2] = 89.0f; /* overflows */
    x[3] = -104.0f;
    memcpy(y, x, sizeof(x));
    k->vexpf(y, N);
    int close = 0;
    for (int i = 0; i < N; i++) {
        float one = x[i];
        k->vexpf(&one, 1);
        assert_memory_equal(&one, &y[i], sizeof(float));
        float ref = expf(x[i]);
        if (isinf(ref))
            assert_true(y[i] == ref);
        else if (ref < 0x1p-126f) /* subnormal results: a few units of 2^-149 */
            close += fabsf(y[i] - ref) <= 0x1p-146f;
        else
            close += fabsf(y[i] - ref) <= 2.5e-7f * ref;
    }
    assert_true(y[1] == 1.0f);
    assert_int_equal(close, N - 1); /* all but the overflow */
}

static void test_argmax_matches_serial(void **state)
{
    (void)state;
    mdl_rng_t r;
    mdl_rng_seed(&r, 7);
    enum { N = 1000 };
    static float x[N];
    int checked = 0;
    for (int round = 0; round < 2000; round++) {
        int n = 1 + (int)(mdl_rng_next(&r) % N);
        int kind = round % 5;
        for (int i = 0; i < n; i++) {
            /* kind 1: few distinct values (ties); 2: signed zeros;
             * 3: NaNs sprinkled; 4: NaN first */
            double u = mdl_rng_uniform(&r);
            x[i] = kind == 1 ? (float)(int)(u * 4) : (float)(u * 20.0 - 10.0);
            if (kind == 2)
                x[i] = u < 0.5 ? 0.0f : -0.0f;
            if ((kind == 3 || kind == 4) && mdl_rng_uniform(&r) < 0.1)
                x[i] = NAN;
        }
        if (kind == 4)
            x[0] = NAN;
        assert_int_equal(mdl_argmax(x, n), serial_argmax(x, n));
        checked++;
    }
    assert_int_equal(checked, 2000);
    float one = 3.0f;
    assert_int_equal(mdl_argmax(&one, 1), 0);
    assert_int_equal(mdl_argmax(&one, 0), 0);
}

static void test_sampler_matches_reference(void **state)
{
    (void)state;
    enum { V = 5000, NV = 4990, STEPS = 40 };
    static float a[V], b[V];
    int32_t hist[STEPS + 8];
    mdl_rng_t r;
    mdl_rng_seed(&r, 99);
    const float temps[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.5f};
    const float top_ps[] = {1.0f, 0.8f, 0.5f, 0.95f};
    const int top_ks[] = {0, 1, 20, 200};
    int cases = 0, sampled_non_greedy = 0;
    for (int seed = 0; seed < 6; seed++)
        for (size_t ti = 0; ti < SL_ARRAY_LEN(temps); ti++)
            for (size_t pi = 0; pi < SL_ARRAY_LEN(top_ps); pi++)
                for (size_t ki = 0; ki < SL_ARRAY_LEN(top_ks); ki++) {
                    mdl_sampling_t p = {0};
                    p.temperature = temps[ti];
                    p.top_p = top_ps[pi];
                    p.top_k = top_ks[ki];
                    p.repetition_penalty = seed % 2 ? 1.05f : 1.0f;
                    p.seed = (uint64_t)seed * 1000 + ti * 100 + pi * 10 + ki;
                    mdl_sampler_t *s1 = mdl_sampler_new(V, NV, &p);
                    mdl_sampler_t *s2 = mdl_sampler_new(V, NV, &p);
                    assert_non_null(s1);
                    assert_non_null(s2);
                    int nh = 0;
                    for (int step = 0; step < STEPS; step++) {
                        for (int i = 0; i < V; i++)
                            a[i] = b[i] = (float)(mdl_rng_uniform(&r) * 8.0 - 4.0);
                        if (seed == 5) /* 33 levels: ties everywhere (top-k selection
                                          must order them by id as the full sort did) */
                            for (int i = 0; i < V; i++)
                                a[i] = b[i] = floorf(a[i] * 4.0f) / 4.0f;
                        int32_t x = mdl_sampler_sample(s1, a, hist, nh);
                        int32_t y = ref_sample(s2, b, hist, nh);
                        assert_int_equal(x, y);
                        assert_memory_equal(a, b, sizeof(float) * V); /* same penalties */
                        sampled_non_greedy += x != serial_argmax(a, NV);
                        hist[nh++] = x;
                    }
                    mdl_sampler_free(s1);
                    mdl_sampler_free(s2);
                    cases++;
                }
    assert_int_equal(cases, 6 * 5 * 4 * 4);
    assert_true(sampled_non_greedy > 1000); /* the random paths were exercised */
}

static void test_sampler_distribution_and_seed(void **state)
{
    (void)state;
    mdl_sampling_t p = {0};
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    p.seed = 42;
    mdl_sampler_t *a = mdl_sampler_new(3, 3, &p), *b = mdl_sampler_new(3, 3, &p);
    /* logits (0, ln 2, -inf-ish): probabilities 1/3, 2/3, ~0 */
    int count[3] = {0}, same = 1;
    enum { N = 30000 };
    for (int i = 0; i < N; i++) {
        float l1[3] = {0.0f, logf(2.0f), -1000.0f}, l2[3] = {0.0f, logf(2.0f), -1000.0f};
        int32_t x = mdl_sampler_sample(a, l1, NULL, 0), y = mdl_sampler_sample(b, l2, NULL, 0);
        count[x]++;
        same &= x == y;
    }
    assert_true(same); /* same seed, same stream */
    assert_int_equal(count[2], 0);
    /* binomial sd for p = 1/3, n = 30000 is 82; allow 5 sd */
    assert_true(abs(count[0] - N / 3) < 410);
    /* temperature 0.5 sharpens: p1 = 4/5 */
    a->p.temperature = 0.5f;
    int c1 = 0;
    for (int i = 0; i < N; i++) {
        float l[3] = {0.0f, logf(2.0f), -1000.0f};
        c1 += mdl_sampler_sample(a, l, NULL, 0) == 1;
    }
    assert_true(abs(c1 - 4 * N / 5) < 350);
    /* top_k 1 and a tiny top_p are greedy */
    a->p.temperature = 1.0f;
    a->p.top_k = 1;
    for (int i = 0; i < 100; i++) {
        float l[3] = {0.0f, logf(2.0f), 0.5f};
        assert_int_equal(mdl_sampler_sample(a, l, NULL, 0), 1);
    }
    a->p.top_k = 0;
    a->p.top_p = 0.45f; /* the top token (p 0.5) alone covers 45% of the mass */
    for (int i = 0; i < 100; i++) {
        float l[3] = {0.0f, logf(2.0f), logf(1.0f)};
        assert_int_equal(mdl_sampler_sample(a, l, NULL, 0), 1);
    }
    /* a different seed gives a different stream */
    mdl_sampling_t q = p;
    q.seed = 43;
    mdl_sampler_t *c = mdl_sampler_new(3, 3, &q), *d = mdl_sampler_new(3, 3, &p);
    int differ = 0;
    for (int i = 0; i < 64; i++) {
        float l1[3] = {0, 0, 0}, l2[3] = {0, 0, 0};
        differ |= mdl_sampler_sample(c, l1, NULL, 0) != mdl_sampler_sample(d, l2, NULL, 0);
    }
    assert_true(differ);
    mdl_sampler_free(a);
    mdl_sampler_free(b);
    mdl_sampler_free(c);
    mdl_sampler_free(d);
}

static void test_rng_known_values(void **state)
{
    (void)state;
    mdl_rng_t r, r2;
    mdl_rng_seed(&r, 1);
    mdl_rng_seed(&r2, 1);
    for (int i = 0; i < 10; i++)
        assert_true(mdl_rng_next(&r) == mdl_rng_next(&r2));
    for (int i = 0; i < 1000; i++) {
        double u = mdl_rng_uniform(&r);
        assert_true(u >= 0.0 && u < 1.0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rope_hand),
        cmocka_unit_test(test_attention_hand),
        cmocka_unit_test(test_rmsnorm_hand),
        cmocka_unit_test(test_utf8_stream),
        cmocka_unit_test(test_sampler_greedy_and_penalty),
        cmocka_unit_test(test_sampler_distribution_and_seed),
        cmocka_unit_test(test_silu_mul_matches_one_pass),
        cmocka_unit_test(test_vexpf_per_element),
        cmocka_unit_test(test_argmax_matches_serial),
        cmocka_unit_test(test_sampler_matches_reference),
        cmocka_unit_test(test_rng_known_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
