/*
 * chat.c — ChatML prompt ids, streaming UTF-8 repair and the sampler (see
 * chat_internal.h). Pure functions over their inputs; the sampler's only
 * state is its seeded RNG and scratch.
 */
#include "model/chat_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char mdl_qwen_default_system[] =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

/* ---- ChatML ---------------------------------------------------------- */

/* <|im_start|> + encode(role "\n" content) + <|im_end|> + encode("\n").
 * Role, newline and content are encoded as one text, as HF does when it
 * tokenizes the rendered template (the regex may join the newline with
 * leading whitespace of the content). */
static int chat_message(const mdl_tok_t *t, const char *role, const char *content, mdl_ids_t *out)
{
    size_t lr = strlen(role), lc = strlen(content);
    char *buf = malloc(lr + lc + 2);
    if (!buf)
        return -1;
    memcpy(buf, role, lr);
    buf[lr] = '\n';
    memcpy(buf + lr + 1, content, lc);
    int rc = mdl_ids_push(out, mdl_tok_im_start(t)) ||
             mdl_tok_encode(t, buf, lr + 1 + lc, 0, out) || mdl_ids_push(out, mdl_tok_im_end(t)) ||
             mdl_tok_encode(t, "\n", 1, 0, out);
    free(buf);
    return rc ? -1 : 0;
}

int mdl_chat_tokens(const mdl_tok_t *t, const mdl_message_t *msgs, size_t n,
                    const char *default_system, mdl_ids_t *out)
{
    if (mdl_tok_im_start(t) < 0 || mdl_tok_im_end(t) < 0)
        return -1;
    if (default_system && (n == 0 || strcmp(msgs[0].role, "system") != 0) &&
        chat_message(t, "system", default_system, out) != 0)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (chat_message(t, msgs[i].role, msgs[i].content, out) != 0)
            return -1;
    if (mdl_ids_push(out, mdl_tok_im_start(t)) != 0 ||
        mdl_tok_encode(t, "assistant\n", 10, 0, out) != 0)
        return -1;
    return 0;
}

/* ---- streaming UTF-8 -------------------------------------------------- */

static size_t put_fffd(uint8_t *out)
{
    out[0] = 0xEF;
    out[1] = 0xBF;
    out[2] = 0xBD;
    return 3;
}

/* Expected length of a sequence starting with lead byte b; 0 if b cannot
 * start one. */
static int seq_len(uint8_t b)
{
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF)
        return 2;
    if (b >= 0xE0 && b <= 0xEF)
        return 3;
    if (b >= 0xF0 && b <= 0xF4)
        return 4;
    return 0;
}

/* Whether b may follow the bytes already held (rules out overlong forms,
 * surrogates and code points above U+10FFFF at the second byte). */
static int continues(const mdl_utf8_t *u, uint8_t b)
{
    if ((b & 0xC0) != 0x80)
        return 0;
    if (u->n != 1)
        return 1;
    switch (u->pend[0]) {
    case 0xE0:
        return b >= 0xA0;
    case 0xED:
        return b <= 0x9F;
    case 0xF0:
        return b >= 0x90;
    case 0xF4:
        return b <= 0x8F;
    default:
        return 1;
    }
}

size_t mdl_utf8_feed(mdl_utf8_t *u, const uint8_t *in, size_t n, uint8_t *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = in[i];
        if (u->n > 0) {
            if (continues(u, b)) {
                u->pend[u->n++] = b;
                if (u->n == seq_len(u->pend[0])) {
                    memcpy(out + o, u->pend, (size_t)u->n);
                    o += (size_t)u->n;
                    u->n = 0;
                }
                continue;
            }
            /* broken sequence: one U+FFFD for what was held, then b
             * starts afresh */
            o += put_fffd(out + o);
            u->n = 0;
        }
        int l = seq_len(b);
        if (l == 1)
            out[o++] = b;
        else if (l == 0)
            o += put_fffd(out + o);
        else
            u->pend[u->n++] = b;
    }
    return o;
}

size_t mdl_utf8_flush(mdl_utf8_t *u, uint8_t *out)
{
    if (u->n == 0)
        return 0;
    u->n = 0;
    return put_fffd(out);
}

/* ---- RNG -------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

void mdl_rng_seed(mdl_rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t mdl_rng_next(mdl_rng_t *r)
{
    uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

double mdl_rng_uniform(mdl_rng_t *r)
{
    return (double)(mdl_rng_next(r) >> 11) * 0x1.0p-53;
}

/* ---- sampler ------------------------------------------------------------ */

void mdl_sampling_default(mdl_sampling_t *p)
{
    memset(p, 0, sizeof(*p));
    p->temperature = 0.7f;
    p->top_p = 0.8f;
    p->top_k = 20;
    p->repetition_penalty = 1.05f;
}

mdl_sampler_t *mdl_sampler_new(int n_vocab, int n_valid, const mdl_sampling_t *p)
{
    mdl_sampler_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->n_vocab = n_vocab;
    s->n_valid = n_valid > 0 && n_valid <= n_vocab ? n_valid : n_vocab;
    s->p = *p;
    s->cand = malloc(sizeof(mdl_cand_t) * (size_t)s->n_valid);
    if (!s->cand) {
        free(s);
        return NULL;
    }
    mdl_rng_seed(&s->rng, p->seed);
    return s;
}

void mdl_sampler_free(mdl_sampler_t *s)
{
    if (!s)
        return;
    free(s->cand);
    free(s);
}

int mdl_cand_cmp(const void *a, const void *b)
{
    const mdl_cand_t *x = a, *y = b;
    if (x->l != y->l)
        return x->l > y->l ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Restores the heap order below h[i] in h[0..k): every entry worse (later
 * in mdl_cand_cmp's order) than or equal to its children, the worst on top. */
static void cand_sift(mdl_cand_t *h, int k, int i)
{
    for (;;) {
        int w = i, l = 2 * i + 1, r = l + 1;
        if (l < k && mdl_cand_cmp(&h[l], &h[w]) > 0)
            w = l;
        if (r < k && mdl_cand_cmp(&h[r], &h[w]) > 0)
            w = r;
        if (w == i)
            return;
        mdl_cand_t t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Moves the k first of c[0..n) in mdl_cand_cmp's order into c[0..k) (in no
 * order): a heap of the best k so far. mdl_cand_cmp is a total order (ties go
 * by id), so sorting these k gives exactly the first k of a full sort; with
 * flat logits (tens of thousands of candidates) the full qsort was ~15% of
 * a step of 8 sampled sequences. */
static void cand_top_k(mdl_cand_t *c, int n, int k)
{
    for (int i = k / 2 - 1; i >= 0; i--)
        cand_sift(c, k, i);
    for (int i = k; i < n; i++)
        if (mdl_cand_cmp(&c[i], &c[0]) < 0) {
            c[0] = c[i];
            cand_sift(c, k, 0);
        }
}

/* The first index of the largest value (NaNs never win; 0 when x[0] is NaN
 * or n < 1), as the one-pass `x[i] > x[best]` loop gives, in two passes
 * the compiler turns into vector max and compare: 16 lane maxima (maxps
 * is exactly `x > m ? x : m`), then the first block holding that value.
 * Greedy decoding calls this once per sequence per step over the whole
 * vocabulary (151,936 logits), where the serial loop cost ~4% of a step. */
int32_t mdl_argmax(const float *x, int n)
{
    if (n < 1)
        return 0;
    enum { L = 16 };
    float m[L];
    for (int j = 0; j < L; j++)
        m[j] = x[0];
    int i = 0;
    for (; i + L <= n; i += L)
        for (int j = 0; j < L; j++)
            m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    float mx = m[0];
    for (int j = 1; j < L; j++)
        mx = m[j] > mx ? m[j] : mx;
    for (; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (i = 0; i + L <= n; i += L) {
        int hit = 0;
        for (int j = 0; j < L; j++)
            hit |= x[i + j] == mx;
        if (hit)
            break;
    }
    for (; i < n; i++)
        if (x[i] == mx)
            return i;
    return 0; /* mx is NaN: x[0] was */
}

void mdl_sampler_penalize(const mdl_sampler_t *s, float *logits, const int32_t *hist, int n_hist)
{
    int n = s->n_valid;
    float rp = s->p.repetition_penalty;
    if (rp > 0.0f && rp != 1.0f) {
        int from = n_hist > MDL_REPEAT_LAST_N ? n_hist - MDL_REPEAT_LAST_N : 0;
        for (int i = from; i < n_hist; i++) {
            int32_t t = hist[i];
            int seen = 0;
            for (int j = from; j < i && !seen; j++)
                seen = hist[j] == t;
            if (seen || t < 0 || t >= n)
                continue; /* once per distinct token, as HF does */
            logits[t] = logits[t] > 0.0f ? logits[t] / rp : logits[t] * rp;
        }
    }
}

int32_t mdl_sampler_draw(mdl_sampler_t *s, int c, float maxl, float temp)
{
    double total = 0.0;
    for (int i = 0; i < c; i++) {
        double pr = exp((double)(s->cand[i].l - maxl) / temp);
        s->cand[i].l = (float)pr;
        total += pr;
    }
    if (s->p.top_p > 0.0f && s->p.top_p < 1.0f) {
        double cum = 0.0;
        int keep = c;
        for (int i = 0; i < c; i++) {
            cum += s->cand[i].l / total;
            if (cum >= s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
        c = keep;
        total = 0.0;
        for (int i = 0; i < c; i++)
            total += s->cand[i].l;
    }
    double u = mdl_rng_uniform(&s->rng) * total, acc = 0.0;
    for (int i = 0; i < c; i++) {
        acc += s->cand[i].l;
        if (u < acc)
            return s->cand[i].id;
    }
    return s->cand[c - 1].id;
}

int mdl_sampler_collect(mdl_sampler_t *s, const float *logits, float maxl, float temp)
{
    /* Logits within 30 temperatures of the best carry all but e^-30 of the
     * mass each; dropping the rest changes no probability by more than
     * n * 1e-13 and saves sorting the whole vocabulary. */
    float floor = maxl - 30.0f * temp;
    int c = 0;
    for (int i = 0; i < s->n_valid; i++)
        if (logits[i] >= floor)
            s->cand[c++] = (mdl_cand_t){logits[i], i};
    return c;
}

int32_t mdl_sampler_sample(mdl_sampler_t *s, float *logits, const int32_t *hist, int n_hist)
{
    int n = s->n_valid;
    mdl_sampler_penalize(s, logits, hist, n_hist);
    int32_t best = mdl_argmax(logits, n);
    float temp = s->p.temperature;
    if (!(temp > 0.0f))
        return best;
    float maxl = logits[best];
    int c = mdl_sampler_collect(s, logits, maxl, temp);
    if (c == 0)
        return best; /* NaN logits (a broken model): nothing to sample from */
    if (s->p.top_k > 0 && c > s->p.top_k) {
        cand_top_k(s->cand, c, s->p.top_k);
        c = s->p.top_k;
    }
    qsort(s->cand, (size_t)c, sizeof(mdl_cand_t), mdl_cand_cmp);
    return mdl_sampler_draw(s, c, maxl, temp);
}
