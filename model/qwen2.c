/*
 * qwen2.c — binding a qwen2 GGUF's tensors (every shape and type checked)
 * and the forward pass over an f32 KV cache (see qwen2_internal.h).
 *
 * Work split: each matrix product is cut into blocks of rows (about 32 KiB
 * of weights each) that the pool's threads claim one at a time, so a thread
 * the host deschedules never holds up a step; attention is split per
 * (token, head). Norms, RoPE and the
 * element-wise steps are cheap and run on the calling thread.
 */
#include "model/qwen2_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- loading ------------------------------------------------------- */

/* Upper bounds far above any model this engine is meant for; they keep a
 * hostile header from sizing huge scratch buffers. */
#define MAX_EMBD   65536
#define MAX_LAYERS 512
#define MAX_HEADS  1024
#define MAX_FF     (1 << 20)
#define MAX_VOCAB  (1 << 22)

static int get_dim(const mdl_gguf_t *g, const char *key, int64_t def, int64_t lo, int64_t hi,
                   int *out, char *err, size_t errlen)
{
    int64_t v;
    int rc = mdl_gguf_get_int(g, key, &v);
    if (rc == MDL_GGUF_MISSING && def >= 0) {
        v = def;
    } else if (rc != MDL_GGUF_OK) {
        mdl_set_err(err, errlen, "metadata %s: %s", key,
                    rc == MDL_GGUF_MISSING ? "missing" : "not an integer");
        return -1;
    }
    if (v < lo || v > hi) {
        mdl_set_err(err, errlen, "metadata %s = %lld out of range [%lld, %lld]", key, (long long)v,
                    (long long)lo, (long long)hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int bind_weight(const mdl_gguf_t *g, const char *name, int n_in, int n_out, mdl_weight_t *w,
                       char *err, size_t errlen)
{
    const mdl_gguf_tensor_t *t = mdl_gguf_tensor_find(g, name);
    if (!t) {
        mdl_set_err(err, errlen, "tensor %s is missing", name);
        return -1;
    }
    if (!mdl_ttype_supported(t->type)) {
        mdl_set_err(err, errlen,
                    "tensor %s: type %s is not supported (F32, F16, Q8_0, Q4_0, Q5_0, "
                    "Q4_K, Q6_K are)",
                    name, mdl_ttype_name(t->type));
        return -1;
    }
    if (t->ne[0] != (uint64_t)n_in || (n_out > 0 && t->ne[1] != (uint64_t)n_out) || t->ne[2] != 1 ||
        t->ne[3] != 1 || (n_out <= 0 && t->ne[1] > MAX_VOCAB)) {
        mdl_set_err(err, errlen, "tensor %s: shape [%llu, %llu, %llu, %llu], expected [%d, %d]",
                    name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                    (unsigned long long)t->ne[2], (unsigned long long)t->ne[3], n_in, n_out);
        return -1;
    }
    w->type = t->type;
    w->n_in = n_in;
    w->n_out = (int)t->ne[1];
    w->row_bytes = (size_t)n_in / mdl_ttype_block(t->type) * mdl_ttype_bytes(t->type);
    w->data = t->data;
    return 0;
}

/* A 1-D F32/F16 vector copied to floats; *out stays NULL when optional and
 * absent. */
static int load_vec(const mdl_gguf_t *g, const char *name, int n, int optional, float **out,
                    char *err, size_t errlen)
{
    *out = NULL;
    const mdl_gguf_tensor_t *t = mdl_gguf_tensor_find(g, name);
    if (!t) {
        if (optional)
            return 0;
        mdl_set_err(err, errlen, "tensor %s is missing", name);
        return -1;
    }
    if (t->type != MDL_T_F32 && t->type != MDL_T_F16) {
        mdl_set_err(err, errlen, "tensor %s: type %s, expected F32 or F16", name,
                    mdl_ttype_name(t->type));
        return -1;
    }
    if (t->ne[0] != (uint64_t)n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1) {
        mdl_set_err(err, errlen, "tensor %s: shape [%llu, %llu], expected [%d]", name,
                    (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], n);
        return -1;
    }
    *out = malloc(sizeof(float) * (size_t)n);
    if (!*out || mdl_dequant_row(t->type, t->data, *out, n) != 0) {
        mdl_set_err(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

void mdl_model_free(mdl_model_t *m)
{
    if (!m)
        return;
    if (m->layers) {
        for (int l = 0; l < m->n_layer; l++) {
            mdl_layer_t *L = &m->layers[l];
            free(L->attn_norm);
            free(L->ffn_norm);
            free(L->bq);
            free(L->bk);
            free(L->bv);
        }
        free(m->layers);
    }
    free(m->output_norm);
    if (m->rp_base)
        munmap(m->rp_base, m->rp_len);
    mdl_gguf_free(m->gguf);
    free(m);
}

mdl_model_t *mdl_model_load(const char *path, int copy, char *err, size_t errlen)
{
    mdl_gguf_t *g = copy ? mdl_gguf_open_copy(path, err, errlen) : mdl_gguf_open(path, err, errlen);
    if (!g)
        return NULL;
    return mdl_model_from_gguf(g, err, errlen);
}

static int load_hparams(mdl_model_t *m, char *err, size_t errlen)
{
    const mdl_gguf_t *g = m->gguf;
    mdl_str_t arch;
    if (mdl_gguf_get_str(g, "general.architecture", &arch) != MDL_GGUF_OK) {
        mdl_set_err(err, errlen, "metadata general.architecture is missing");
        return -1;
    }
    if (!mdl_str_eq(arch, "qwen2")) {
        mdl_set_err(err, errlen, "architecture '%.*s' is not supported (only qwen2)",
                    (int)SL_MIN(arch.len, 64), arch.ptr);
        return -1;
    }
    mdl_str_t name;
    if (mdl_gguf_get_str(g, "general.name", &name) == MDL_GGUF_OK)
        snprintf(m->name, sizeof(m->name), "%.*s", (int)SL_MIN(name.len, 127), name.ptr);
    else
        snprintf(m->name, sizeof(m->name), "qwen2");
    if (get_dim(g, "qwen2.embedding_length", -1, 1, MAX_EMBD, &m->n_embd, err, errlen) ||
        get_dim(g, "qwen2.block_count", -1, 1, MAX_LAYERS, &m->n_layer, err, errlen) ||
        get_dim(g, "qwen2.attention.head_count", -1, 1, MAX_HEADS, &m->n_head, err, errlen) ||
        get_dim(g, "qwen2.attention.head_count_kv", m->n_head, 1, m->n_head, &m->n_kv, err,
                errlen) ||
        get_dim(g, "qwen2.feed_forward_length", -1, 1, MAX_FF, &m->n_ff, err, errlen) ||
        get_dim(g, "qwen2.context_length", 32768, 1, 1 << 24, &m->n_ctx_train, err, errlen))
        return -1;
    if (m->n_head % m->n_kv != 0) {
        mdl_set_err(err, errlen, "head_count %d is not a multiple of head_count_kv %d", m->n_head,
                    m->n_kv);
        return -1;
    }
    int def_hd = m->n_embd % m->n_head == 0 ? m->n_embd / m->n_head : -1;
    if (get_dim(g, "qwen2.attention.key_length", def_hd, 2, 1024, &m->head_dim, err, errlen))
        return -1;
    int vd;
    if (get_dim(g, "qwen2.attention.value_length", m->head_dim, m->head_dim, m->head_dim, &vd, err,
                errlen))
        return -1;
    if (m->head_dim % 2 != 0) {
        mdl_set_err(err, errlen, "head dimension %d is odd", m->head_dim);
        return -1;
    }
    double v;
    int rc = mdl_gguf_get_float(g, "qwen2.rope.freq_base", &v);
    m->rope_base = rc == MDL_GGUF_OK ? v : 10000.0; /* the GGUF convention's default */
    if (rc == MDL_GGUF_BADTYPE || !(m->rope_base > 1.0 && m->rope_base < 1e12)) {
        mdl_set_err(err, errlen, "metadata qwen2.rope.freq_base is not a number > 1");
        return -1;
    }
    rc = mdl_gguf_get_float(g, "qwen2.attention.layer_norm_rms_epsilon", &v);
    m->eps = rc == MDL_GGUF_OK ? (float)v : 1e-6f;
    if (rc == MDL_GGUF_BADTYPE || !(m->eps > 0.0f && m->eps < 1.0f)) {
        mdl_set_err(err, errlen,
                    "metadata qwen2.attention.layer_norm_rms_epsilon is not in (0, 1)");
        return -1;
    }
    /* Context extension (YaRN and friends) changes RoPE for every position;
     * computing without it would be silently wrong, so refuse. */
    mdl_str_t st;
    if (mdl_gguf_get_str(g, "qwen2.rope.scaling.type", &st) == MDL_GGUF_OK &&
        !mdl_str_eq(st, "none")) {
        double f = 1.0;
        if (mdl_gguf_get_float(g, "qwen2.rope.scaling.factor", &f) != MDL_GGUF_OK || f != 1.0) {
            mdl_set_err(err, errlen, "RoPE scaling '%.*s' is not supported",
                        (int)SL_MIN(st.len, 32), st.ptr);
            return -1;
        }
    }
    return 0;
}

/* Every weight the best kernel set has a repacked kernel for, repacked
 * into one huge-page region (as large as those weights again: the original
 * layout stays for the other kernel levels and the embedding lookups).
 * Decoding reads only the repacked copy, so the bytes per token do not
 * change. A failed allocation only costs speed. SLUICE_MDL_REPACK=0 turns
 * it off (the memory back, the older kernels: for comparisons). */
static void model_repack(mdl_model_t *m)
{
    const mdl_kernels_t *k = mdl_kernels_select(MDL_KL_AVX512);
    const char *env = getenv("SLUICE_MDL_REPACK");
    if (env && !strcmp(env, "0"))
        return;
    mdl_weight_t **ws = calloc(1 + 7 * (size_t)m->n_layer, sizeof(*ws));
    int n = 0;
    if (!ws)
        return;
    ws[n++] = &m->output;
    for (int l = 0; l < m->n_layer; l++) {
        mdl_layer_t *L = &m->layers[l];
        mdl_weight_t *lw[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wgate, &L->wup, &L->wdown};
        for (size_t i = 0; i < SL_ARRAY_LEN(lw); i++)
            ws[n++] = lw[i];
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        size_t gb = k->gemm_rp[ws[i]->type] ? mdl_rp_group_bytes(ws[i]->type, ws[i]->n_in) : 0;
        ws[i]->rp_gstride = gb;
        total += gb * (size_t)((ws[i]->n_out + MDL_RP_ROWS - 1) / MDL_RP_ROWS);
    }
    void *base = total
                     ? mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                     : MAP_FAILED;
    if (base == MAP_FAILED) {
        for (int i = 0; i < n; i++)
            ws[i]->rp_gstride = 0;
        free(ws);
        return;
    }
    (void)madvise(base, total, MADV_HUGEPAGE);
    m->rp_base = base;
    m->rp_len = total;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        mdl_weight_t *w = ws[i];
        if (!w->rp_gstride)
            continue;
        mdl_rp_pack(w->type, w->data, w->row_bytes, w->n_out, w->n_in, m->rp_base + off);
        w->rp = m->rp_base + off;
        off += w->rp_gstride * (size_t)((w->n_out + MDL_RP_ROWS - 1) / MDL_RP_ROWS);
    }
    free(ws);
}

mdl_model_t *mdl_model_from_gguf(mdl_gguf_t *g, char *err, size_t errlen)
{
    mdl_model_t *m = calloc(1, sizeof(*m));
    if (!m) {
        mdl_gguf_free(g);
        mdl_set_err(err, errlen, "out of memory");
        return NULL;
    }
    m->gguf = g;
    if (load_hparams(m, err, errlen) != 0)
        goto fail;
    int E = m->n_embd, qd = m->n_head * m->head_dim, kvd = m->n_kv * m->head_dim;
    if (bind_weight(g, "token_embd.weight", E, 0, &m->tok_embd, err, errlen) != 0)
        goto fail;
    m->n_vocab = m->tok_embd.n_out;
    if (mdl_gguf_tensor_find(g, "output.weight")) {
        if (bind_weight(g, "output.weight", E, m->n_vocab, &m->output, err, errlen) != 0)
            goto fail;
    } else {
        m->output = m->tok_embd;
        m->tied = 1;
    }
    if (load_vec(g, "output_norm.weight", E, 0, &m->output_norm, err, errlen) != 0)
        goto fail;
    m->layers = calloc((size_t)m->n_layer, sizeof(*m->layers));
    if (!m->layers) {
        mdl_set_err(err, errlen, "out of memory");
        goto fail;
    }
    m->bytes_per_token = m->output.row_bytes * (uint64_t)m->n_vocab;
    for (int l = 0; l < m->n_layer; l++) {
        mdl_layer_t *L = &m->layers[l];
        char n[96];
#define NAME(s) (snprintf(n, sizeof(n), "blk.%d.%s", l, s), n)
        if (load_vec(g, NAME("attn_norm.weight"), E, 0, &L->attn_norm, err, errlen) ||
            load_vec(g, NAME("ffn_norm.weight"), E, 0, &L->ffn_norm, err, errlen) ||
            load_vec(g, NAME("attn_q.bias"), qd, 1, &L->bq, err, errlen) ||
            load_vec(g, NAME("attn_k.bias"), kvd, 1, &L->bk, err, errlen) ||
            load_vec(g, NAME("attn_v.bias"), kvd, 1, &L->bv, err, errlen) ||
            bind_weight(g, NAME("attn_q.weight"), E, qd, &L->wq, err, errlen) ||
            bind_weight(g, NAME("attn_k.weight"), E, kvd, &L->wk, err, errlen) ||
            bind_weight(g, NAME("attn_v.weight"), E, kvd, &L->wv, err, errlen) ||
            bind_weight(g, NAME("attn_output.weight"), qd, E, &L->wo, err, errlen) ||
            bind_weight(g, NAME("ffn_gate.weight"), E, m->n_ff, &L->wgate, err, errlen) ||
            bind_weight(g, NAME("ffn_up.weight"), E, m->n_ff, &L->wup, err, errlen) ||
            bind_weight(g, NAME("ffn_down.weight"), m->n_ff, E, &L->wdown, err, errlen))
            goto fail;
#undef NAME
        const mdl_weight_t *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wgate, &L->wup, &L->wdown};
        for (size_t i = 0; i < SL_ARRAY_LEN(ws); i++)
            m->bytes_per_token += ws[i]->row_bytes * (uint64_t)ws[i]->n_out;
    }
    model_repack(m);
    return m;
fail:
    mdl_model_free(m);
    return NULL;
}

/* ---- numeric pieces ------------------------------------------------- */

void mdl_rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++)
        out[i] = x[i] * r * w[i];
}

/* The rotation of position pos: cs[i] = cos, cs[hd/2 + i] = sin of angle
 * i. A step computes it once per row for all layers and for q and k (the
 * pow and sincos per angle were ~1% of a step of 8 sequences). */
static void rope_table(float *cs, int hd, int pos, double base)
{
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        /* double angle: at pos 4096 a float angle would be off by ~1e-4 rad */
        double th = pos * pow(base, -2.0 * i / hd);
        cs[i] = (float)cos(th);
        cs[half + i] = (float)sin(th);
    }
}

static void rope_apply_cs(float *v, int n_heads, int hd, const float *cs)
{
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float c = cs[i], s = cs[half + i];
        for (int h = 0; h < n_heads; h++) {
            float *x = v + (size_t)h * hd;
            float x0 = x[i], x1 = x[i + half];
            x[i] = x0 * c - x1 * s;
            x[i + half] = x0 * s + x1 * c;
        }
    }
}

void mdl_rope_apply(float *v, int n_heads, int hd, int pos, double base)
{
    float cs[1024]; /* head_dim <= 1024 (load_hparams) */
    rope_table(cs, hd, pos, base);
    rope_apply_cs(v, n_heads, hd, cs);
}

void mdl_attend(const mdl_kernels_t *k, const float *q, const float *K, const float *V, int n,
                int hd, float *scores, float *out)
{
    float scale = 1.0f / sqrtf((float)hd), mx = -INFINITY, sum = 0.0f;
    if (k->vdots)
        k->vdots(q, K, n, hd, scale, scores);
    else
        for (int t = 0; t < n; t++)
            scores[t] = k->vdot(q, K + (size_t)t * hd, hd) * scale;
    for (int t = 0; t < n; t++)
        mx = scores[t] > mx ? scores[t] : mx;
    if (k->vexpf) {
        for (int t = 0; t < n; t++)
            scores[t] -= mx;
        k->vexpf(scores, n);
        for (int t = 0; t < n; t++)
            sum += scores[t];
    } else {
        for (int t = 0; t < n; t++) {
            scores[t] = expf(scores[t] - mx);
            sum += scores[t];
        }
    }
    float inv = 1.0f / sum;
    if (k->vmix) {
        /* the weights first, so the kernel keeps out in registers */
        for (int t = 0; t < n; t++)
            scores[t] *= inv;
        k->vmix(scores, V, n, hd, out);
        return;
    }
    memset(out, 0, sizeof(float) * (size_t)hd);
    for (int t = 0; t < n; t++)
        k->vaxpy(out, scores[t] * inv, V + (size_t)t * hd, hd);
}

/* g = SiLU(g) * u. Two passes over chunks: the exponentials (the kernels'
 * vector expf, or libm's one value at a time), then the divisions and products in a loop the
 * compiler vectorises (divps and mulps round as divss and mulss do, so the values are the same bits
 * as the one-pass loop, whose serial divisions cost ~4% of a step of 8 sequences). */
void mdl_silu_mul(const mdl_kernels_t *k, float *restrict g, const float *restrict u, size_t n)
{
    enum { C = 256 }; /* a constant count: -O2 vectorises only such loops */
    float e[C];
    size_t c = 0;
    for (; c + C <= n; c += C) {
        for (size_t i = 0; i < C; i++)
            e[i] = -g[c + i];
        if (k && k->vexpf)
            k->vexpf(e, C);
        else
            for (size_t i = 0; i < C; i++)
                e[i] = expf(e[i]);
        for (size_t i = 0; i < C; i++)
            g[c + i] = g[c + i] / (1.0f + e[i]) * u[c + i];
    }
    for (; c < n; c++) {
        float ec = -g[c];
        if (k && k->vexpf)
            k->vexpf(&ec, 1);
        else
            ec = expf(ec);
        g[c] = g[c] / (1.0f + ec) * u[c];
    }
}

/* ---- evaluation state ----------------------------------------------- */

struct mdl_state {
    const mdl_model_t *m;
    const mdl_kernels_t *k;
    mdl_pool_t *pool;
    int nth, n_ctx, batch, precise, pos, q_dim, kv_dim, max_in;
    int rp_only;            /* every matrix takes the repacked kernels: no prep needed */
    float *kcache, *vcache; /* [layer][kv head][n_ctx][head_dim] */
    float *x, *h, *q, *kb, *vb, *o, *g, *u; /* batch rows each */
    float *scores;                          /* nth * n_ctx */
    float *rope;                            /* batch rows of head_dim: cos, sin */
    int8_t *aq;
    float *ad;
    int32_t *as;
    uint8_t *ax;  /* the kernels' extra activation forms (prep) */
    uint8_t *ail; /* the repacked kernels' interleaved form (mdl_act_interleave) */
    mdl_act_t *acts;
    /* per-row bookkeeping of a batch (batch entries each) */
    mdl_state_t **row_seq;
    int *row_pos, *lg_rows;
    float **lg_out;
    int32_t *step_tok;
    float *lg; /* batch * n_vocab when the head's rows must be copied out; lazily */
};

void mdl_state_free(mdl_state_t *s)
{
    if (!s)
        return;
    free(s->kcache);
    free(s->vcache);
    free(s->x);
    free(s->h);
    free(s->q);
    free(s->kb);
    free(s->vb);
    free(s->o);
    free(s->g);
    free(s->u);
    free(s->scores);
    free(s->rope);
    free(s->aq);
    free(s->ad);
    free(s->as);
    free(s->ax);
    free(s->ail);
    free(s->acts);
    free(s->row_seq);
    free(s->row_pos);
    free(s->lg_rows);
    free(s->lg_out);
    free(s->step_tok);
    free(s->lg);
    free(s);
}

static float *fbuf(size_t n, int *ok)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p)
        *ok = 0;
    return p;
}

/* Whether every matrix of m goes through k's repacked kernels, which read
 * only q, d and qsum of the activations: then the row kernels' extra forms
 * (prep: ~2% of a step of 8 sequences, per row and matrix input) are never
 * read and not made. */
static int model_rp_only(const mdl_model_t *m, const mdl_kernels_t *k)
{
    if (!m->output.rp || !k->gemm_rp[m->output.type])
        return 0;
    for (int l = 0; l < m->n_layer; l++) {
        const mdl_layer_t *L = &m->layers[l];
        const mdl_weight_t *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wgate, &L->wup, &L->wdown};
        for (size_t i = 0; i < SL_ARRAY_LEN(ws); i++)
            if (!ws[i]->rp || !k->gemm_rp[ws[i]->type] || ws[i]->type == MDL_T_F32 ||
                ws[i]->type == MDL_T_F16)
                return 0;
    }
    return 1;
}

mdl_state_t *mdl_state_new(const mdl_model_t *m, const mdl_state_opts_t *o, mdl_pool_t *pool,
                           char *err, size_t errlen)
{
    mdl_state_t *s = calloc(1, sizeof(*s));
    if (!s) {
        mdl_set_err(err, errlen, "out of memory");
        return NULL;
    }
    s->m = m;
    s->pool = pool;
    s->nth = mdl_pool_size(pool);
    s->k = mdl_kernels_select(o ? o->kernel_level : MDL_KL_AVX512);
    s->precise = o ? o->precise : 0;
    s->rp_only = !s->precise && model_rp_only(m, s->k);
    s->n_ctx = o && o->n_ctx > 0 ? o->n_ctx : SL_MIN(4096, m->n_ctx_train);
    s->batch = o && o->batch > 0 ? SL_MIN(o->batch, 512) : 32;
    if (s->n_ctx > (1 << 20)) {
        mdl_set_err(err, errlen, "context %d too large", s->n_ctx);
        free(s);
        return NULL;
    }
    s->q_dim = m->n_head * m->head_dim;
    s->kv_dim = m->n_kv * m->head_dim;
    s->max_in = SL_MAX(SL_MAX(m->n_embd, s->q_dim), m->n_ff);
    size_t B = (size_t)s->batch, kv = (size_t)m->n_layer * s->n_ctx * s->kv_dim;
    int ok = 1;
    s->kcache = fbuf(kv, &ok);
    s->vcache = fbuf(kv, &ok);
    s->x = fbuf(B * m->n_embd, &ok);
    s->h = fbuf(B * m->n_embd, &ok);
    s->q = fbuf(B * s->q_dim, &ok);
    s->kb = fbuf(B * s->kv_dim, &ok);
    s->vb = fbuf(B * s->kv_dim, &ok);
    s->o = fbuf(B * s->q_dim, &ok);
    s->g = fbuf(B * m->n_ff, &ok);
    s->u = fbuf(B * m->n_ff, &ok);
    s->scores = fbuf((size_t)s->nth * s->n_ctx, &ok);
    s->rope = fbuf(B * (size_t)m->head_dim, &ok);
    s->aq = malloc(B * s->max_in + 64);
    s->ad = fbuf(B * s->max_in / MDL_QK + 1, &ok);
    s->as = calloc(B * s->max_in / MDL_QK + 1, sizeof(int32_t));
    s->acts = calloc(B, sizeof(mdl_act_t));
    s->row_seq = calloc(B, sizeof(*s->row_seq));
    s->row_pos = calloc(B, sizeof(int));
    s->lg_rows = calloc(B, sizeof(int));
    s->lg_out = calloc(B, sizeof(float *));
    s->step_tok = calloc(B, sizeof(int32_t));
    s->lg = fbuf(B * (size_t)m->n_vocab, &ok);
    s->ail = aligned_alloc(64, (MDL_IL_BYTES(s->max_in, B) + 63) / 64 * 64);
    s->ax = s->k->prep ? aligned_alloc(64, B * ((MDL_ACT_EXTRA_BYTES(s->max_in) + 63) / 64 * 64))
                       : NULL;
    if (!ok || !s->aq || !s->as || !s->ail || !s->acts || (s->k->prep && !s->ax) || !s->row_seq ||
        !s->row_pos || !s->lg_rows || !s->lg_out || !s->step_tok) {
        mdl_set_err(err, errlen, "out of memory for a %d-token context", s->n_ctx);
        mdl_state_free(s);
        return NULL;
    }
    return s;
}

int mdl_state_pos(const mdl_state_t *s)
{
    return s->pos;
}

int mdl_state_n_ctx(const mdl_state_t *s)
{
    return s->n_ctx;
}

const char *mdl_state_kernels(const mdl_state_t *s)
{
    return s->k->name;
}

void mdl_state_truncate(mdl_state_t *s, int n)
{
    if (n >= 0 && n < s->pos)
        s->pos = n;
}

int mdl_state_copy_prefix(mdl_state_t *dst, const mdl_state_t *src, int n)
{
    if (dst->m != src->m || n < 0 || n > src->pos || n > dst->n_ctx)
        return -1;
    const mdl_model_t *m = src->m;
    size_t hd = (size_t)m->head_dim;
    for (int l = 0; l < m->n_layer; l++)
        for (int g = 0; g < m->n_kv; g++) {
            size_t so = ((size_t)l * m->n_kv + g) * src->n_ctx * hd;
            size_t dof = ((size_t)l * m->n_kv + g) * dst->n_ctx * hd;
            memcpy(dst->kcache + dof, src->kcache + so, sizeof(float) * hd * n);
            memcpy(dst->vcache + dof, src->vcache + so, sizeof(float) * hd * n);
        }
    dst->pos = n;
    return 0;
}

/* ---- parallel pieces ------------------------------------------------ */

typedef struct {
    const mdl_weight_t *w;
    const float *bias;
    float *out; /* nb rows of w->n_out */
    int accumulate;
    int rows_per_item, first_item; /* filled by matmul() */
} mm_job_t;

typedef struct {
    const mdl_state_t *s;
    const mdl_act_t *acts;
    int nb;
    mm_job_t jobs[3];
    int n_jobs;
} mm_task_t;

/* One item: a block of rows of one job, for every token of the batch. */
static void mm_item(void *arg, int item, int tid)
{
    (void)tid;
    const mm_task_t *t = arg;
    int j = t->n_jobs - 1;
    while (j > 0 && item < t->jobs[j].first_item)
        j--;
    const mm_job_t *jb = &t->jobs[j];
    const mdl_weight_t *w = jb->w;
    int use_float = t->s->precise || w->type == MDL_T_F32 || w->type == MDL_T_F16;
    mdl_dot_fn dot = use_float ? t->s->k->dot_f[w->type] : t->s->k->dot[w->type];
    mdl_dot4_fn dot4 = use_float ? NULL : t->s->k->dot4[w->type];
    int r0 = (item - jb->first_item) * jb->rows_per_item;
    int r1 = SL_MIN(w->n_out, r0 + jb->rows_per_item);
    mdl_gemm_rp_fn gemm_rp = use_float || !w->rp ? NULL : t->s->k->gemm_rp[w->type];
    if (gemm_rp) {
        /* r0 is a multiple of MDL_RP_ROWS (mm_rows_per_item) */
        gemm_rp(w->rp + w->rp_gstride * (size_t)(r0 / MDL_RP_ROWS), w->rp_gstride, r1 - r0, t->acts,
                t->nb, jb->out + r0, (size_t)w->n_out, jb->bias ? jb->bias + r0 : NULL,
                jb->accumulate);
        return;
    }
    mdl_gemm_fn gemm = use_float ? NULL : t->s->k->gemm[w->type];
    if (gemm) {
        gemm(w->data + (size_t)r0 * w->row_bytes, w->row_bytes, r1 - r0, t->acts, t->nb,
             jb->out + r0, (size_t)w->n_out, jb->bias ? jb->bias + r0 : NULL, jb->accumulate);
        return;
    }
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = w->data + (size_t)r * w->row_bytes;
        float bias = jb->bias ? jb->bias[r] : 0.0f;
        int b = 0;
        float v4[4];
        for (; dot4 && b + 4 <= t->nb; b += 4) {
            dot4(row, &t->acts[b], v4);
            for (int k = 0; k < 4; k++) {
                float *o = jb->out + (size_t)(b + k) * w->n_out + r;
                *o = jb->accumulate ? *o + (v4[k] + bias) : v4[k] + bias;
            }
        }
        for (; b < t->nb; b++) {
            float v = dot(row, &t->acts[b]) + bias;
            float *o = jb->out + (size_t)b * w->n_out + r;
            *o = jb->accumulate ? *o + v : v;
        }
    }
}

/* Rows per work item: about 32 KiB of weights (a few microseconds of
 * streaming: small enough that a thread the host deschedules holds up
 * little, large enough that claiming costs ~1%), a multiple of 16 so that
 * threads never share a cache line of the output and items start on a
 * group of repacked rows. */
static int mm_rows_per_item(const mdl_weight_t *w)
{
    size_t rows = (32768 + w->row_bytes - 1) / w->row_bytes;
    int rpi = (int)SL_MAX((size_t)MDL_RP_ROWS, (rows + 15) & ~(size_t)15);
    while ((w->n_out + rpi - 1) / rpi > MDL_POOL_MAX_ITEMS / 4)
        rpi *= 2;
    return rpi;
}

/* Points acts[0..nb) at rows of x (n floats each) and quantizes them when a
 * quantized weight will read them. */
static void prep_acts(mdl_state_t *s, const float *x, int nb, int n)
{
    int quant = !s->precise && n % MDL_QK == 0;
    for (int b = 0; b < nb; b++) {
        mdl_act_t *a = &s->acts[b];
        a->n = n;
        a->x = x + (size_t)b * n;
        a->q = s->aq + (size_t)b * n;
        a->d = s->ad + (size_t)b * n / MDL_QK;
        a->qsum = s->as + (size_t)b * n / MDL_QK;
        a->il = NULL;
        if (!quant)
            continue;
        s->k->quantize(a->x, n, a->q, a->d, a->qsum);
        if (s->k->prep && !s->rp_only) {
            size_t stride = (MDL_ACT_EXTRA_BYTES(s->max_in) + 63) / 64 * 64;
            mdl_act_bind_extra(a, s->ax + (size_t)b * stride);
            s->k->prep(a);
        }
    }
    /* the interleaved form pays from 4 tokens (the registers one pointer
     * per token would take); alone or in pairs its 384-byte blocks only
     * spread a token's 32 bytes over more cache lines */
    if (quant && nb >= 4)
        mdl_act_interleave(s->acts, nb, s->ail);
}

static void matmul(mdl_state_t *s, int nb, const mm_job_t *jobs, int n_jobs)
{
    mm_task_t t = {.s = s, .acts = s->acts, .nb = nb, .n_jobs = n_jobs};
    memcpy(t.jobs, jobs, sizeof(*jobs) * (size_t)n_jobs);
    int items = 0;
    for (int j = 0; j < n_jobs; j++) {
        mm_job_t *jb = &t.jobs[j];
        jb->rows_per_item = mm_rows_per_item(jb->w);
        jb->first_item = items;
        items += (jb->w->n_out + jb->rows_per_item - 1) / jb->rows_per_item;
    }
    mdl_pool_run_items(s->pool, mm_item, &t, items);
}

/* Where each row of a batch belongs: the sequence whose KV cache it reads
 * and extends, and its position there. One sequence alone is the case
 * where every row names the same state. */
typedef struct {
    mdl_state_t *const *seq; /* nb */
    const int *pos;          /* nb */
} rows_t;

typedef struct {
    mdl_state_t *s; /* scratch */
    const rows_t *rows;
    int layer;
} attn_task_t;

/* One item: one query head of one token, over its own sequence's cache. */
static void attn_item(void *arg, int i, int tid)
{
    const attn_task_t *t = arg;
    mdl_state_t *s = t->s;
    const mdl_model_t *m = s->m;
    int hd = m->head_dim, group = m->n_head / m->n_kv;
    float *scores = s->scores + (size_t)tid * s->n_ctx;
    int b = i / m->n_head, h = i % m->n_head, g = h / group;
    const mdl_state_t *q = t->rows->seq[b];
    size_t base = ((size_t)t->layer * m->n_kv + g) * q->n_ctx * hd;
    mdl_attend(s->k, s->q + (size_t)b * s->q_dim + (size_t)h * hd, q->kcache + base,
               q->vcache + base, t->rows->pos[b] + 1, hd, scores,
               s->o + (size_t)b * s->q_dim + (size_t)h * hd);
}

/* nb tokens (at most s->batch) through every layer, using s's scratch; row
 * b extends rows->seq[b] at rows->pos[b]. Rows n_lg..: logits of rows
 * lg_rows[0..n_lg) go to lg_out[i] (n_vocab floats each). Positions are
 * not advanced here. Per row, every operation is the same whatever else
 * is in the batch (the batched kernels are bit-identical to the single
 * ones), so a sequence's results do not depend on its neighbours. */
static int forward(mdl_state_t *s, const int32_t *tok, int nb, const rows_t *rows,
                   const int *lg_rows, float *const *lg_out, int n_lg)
{
    const mdl_model_t *m = s->m;
    int E = m->n_embd, hd = m->head_dim;
    for (int b = 0; b < nb; b++)
        if (mdl_dequant_row(m->tok_embd.type,
                            m->tok_embd.data + (size_t)tok[b] * m->tok_embd.row_bytes,
                            s->x + (size_t)b * E, E) != 0)
            return -1;
    for (int b = 0; b < nb; b++)
        rope_table(s->rope + (size_t)b * hd, hd, rows->pos[b], m->rope_base);
    for (int l = 0; l < m->n_layer; l++) {
        const mdl_layer_t *L = &m->layers[l];
        for (int b = 0; b < nb; b++)
            mdl_rmsnorm(s->h + (size_t)b * E, s->x + (size_t)b * E, L->attn_norm, E, m->eps);
        prep_acts(s, s->h, nb, E);
        mm_job_t qkv[3] = {{&L->wq, L->bq, s->q, 0, 0, 0},
                           {&L->wk, L->bk, s->kb, 0, 0, 0},
                           {&L->wv, L->bv, s->vb, 0, 0, 0}};
        matmul(s, nb, qkv, 3);
        for (int b = 0; b < nb; b++) {
            int pos = rows->pos[b];
            mdl_state_t *q = rows->seq[b];
            float *qb = s->q + (size_t)b * s->q_dim, *kb = s->kb + (size_t)b * s->kv_dim;
            rope_apply_cs(qb, m->n_head, hd, s->rope + (size_t)b * hd);
            rope_apply_cs(kb, m->n_kv, hd, s->rope + (size_t)b * hd);
            for (int g = 0; g < m->n_kv; g++) {
                size_t at = (((size_t)l * m->n_kv + g) * q->n_ctx + pos) * hd;
                memcpy(q->kcache + at, kb + (size_t)g * hd, sizeof(float) * hd);
                memcpy(q->vcache + at, s->vb + (size_t)b * s->kv_dim + (size_t)g * hd,
                       sizeof(float) * hd);
            }
        }
        attn_task_t at = {s, rows, l};
        mdl_pool_run_items(s->pool, attn_item, &at, nb * m->n_head);
        prep_acts(s, s->o, nb, s->q_dim);
        mm_job_t out[1] = {{&L->wo, NULL, s->x, 1, 0, 0}};
        matmul(s, nb, out, 1);
        for (int b = 0; b < nb; b++)
            mdl_rmsnorm(s->h + (size_t)b * E, s->x + (size_t)b * E, L->ffn_norm, E, m->eps);
        prep_acts(s, s->h, nb, E);
        mm_job_t gu[2] = {{&L->wgate, NULL, s->g, 0, 0, 0}, {&L->wup, NULL, s->u, 0, 0, 0}};
        matmul(s, nb, gu, 2);
        mdl_silu_mul(s->k, s->g, s->u, (size_t)nb * m->n_ff);
        prep_acts(s, s->g, nb, m->n_ff);
        mm_job_t down[1] = {{&L->wdown, NULL, s->x, 1, 0, 0}};
        matmul(s, nb, down, 1);
    }
    if (n_lg > 0) {
        /* only the rows whose logits are wanted go through the head; the
         * head writes n_lg consecutive rows, copied out when the caller's
         * rows are not consecutive */
        for (int i = 0; i < n_lg; i++)
            mdl_rmsnorm(s->h + (size_t)i * E, s->x + (size_t)lg_rows[i] * E, m->output_norm, E,
                        m->eps);
        prep_acts(s, s->h, n_lg, E);
        int contiguous = 1;
        for (int i = 1; i < n_lg; i++)
            if (lg_out[i] != lg_out[0] + (size_t)i * m->n_vocab)
                contiguous = 0;
        float *dst = contiguous ? lg_out[0] : s->lg;
        mm_job_t head[1] = {{&m->output, NULL, dst, 0, 0, 0}};
        matmul(s, n_lg, head, 1);
        if (!contiguous)
            for (int i = 0; i < n_lg; i++)
                memcpy(lg_out[i], s->lg + (size_t)i * m->n_vocab, sizeof(float) * m->n_vocab);
    }
    return 0;
}

/* One chunk of one sequence (the scratch's own cache). */
static int forward_one(mdl_state_t *s, const int32_t *tok, int nb, float *logits, int all_logits)
{
    for (int b = 0; b < nb; b++) {
        s->row_seq[b] = s;
        s->row_pos[b] = s->pos + b;
        s->lg_rows[b] = b;
        s->lg_out[b] = logits ? logits + (size_t)b * s->m->n_vocab : NULL;
    }
    rows_t rows = {s->row_seq, s->row_pos};
    int rc;
    if (!logits)
        rc = forward(s, tok, nb, &rows, NULL, NULL, 0);
    else if (all_logits)
        rc = forward(s, tok, nb, &rows, s->lg_rows, s->lg_out, nb);
    else
        rc = forward(s, tok, nb, &rows, s->lg_rows + nb - 1, &logits, 1);
    if (rc == 0)
        s->pos += nb;
    return rc;
}

int mdl_state_eval(mdl_state_t *s, const int32_t *tokens, int n, float *logits, int all_logits)
{
    if (n <= 0 || n > s->n_ctx - s->pos)
        return -1;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= s->m->n_vocab)
            return -1;
    for (int c = 0; c < n; c += s->batch) {
        int nb = SL_MIN(s->batch, n - c), last = c + nb == n;
        float *lg = NULL;
        if (all_logits)
            lg = logits ? logits + (size_t)c * s->m->n_vocab : NULL;
        else if (last)
            lg = logits;
        if (forward_one(s, tokens + c, nb, lg, all_logits) != 0)
            return -1;
    }
    return 0;
}

int mdl_state_eval_seqs(mdl_state_t *work, const mdl_seq_step_t *steps, int n_steps)
{
    int total = 0, n_lg = 0;
    if (n_steps <= 0)
        return -1;
    for (int i = 0; i < n_steps; i++) {
        const mdl_seq_step_t *st = &steps[i];
        mdl_state_t *q = st->seq;
        if (!q || q->m != work->m || st->n <= 0 || st->n > q->n_ctx - q->pos ||
            q->n_ctx > work->n_ctx)
            return -1;
        for (int j = 0; j < i; j++)
            if (steps[j].seq == q)
                return -1; /* one entry per sequence: positions would collide */
        for (int k = 0; k < st->n; k++)
            if (st->tokens[k] < 0 || st->tokens[k] >= work->m->n_vocab)
                return -1;
        total += st->n;
        n_lg += st->logits != NULL;
    }
    if (total > work->batch)
        return -1;
    int32_t *tok = work->step_tok;
    int b = 0;
    n_lg = 0;
    for (int i = 0; i < n_steps; i++) {
        const mdl_seq_step_t *st = &steps[i];
        for (int k = 0; k < st->n; k++, b++) {
            tok[b] = st->tokens[k];
            work->row_seq[b] = st->seq;
            work->row_pos[b] = st->seq->pos + k;
        }
        if (st->logits) {
            work->lg_rows[n_lg] = b - 1;
            work->lg_out[n_lg++] = st->logits;
        }
    }
    rows_t rows = {work->row_seq, work->row_pos};
    if (forward(work, tok, total, &rows, work->lg_rows, work->lg_out, n_lg) != 0)
        return -1;
    for (int i = 0; i < n_steps; i++)
        steps[i].seq->pos += steps[i].n;
    return 0;
}
