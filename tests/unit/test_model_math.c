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
        cmocka_unit_test(test_rng_known_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
