/*
 * cli.c — `sluice model ...`: operator tools over a GGUF file (info,
 * generate) and the diagnostic subcommands the tests and the benchmark
 * drive (logits, tokenize, detokenize, chat-tokens, bench, membw). All of
 * them work on the same internals the engine uses.
 */
#include "model/model.h"

#include "model/chat_internal.h"
#include "model/gguf_internal.h"
#include "model/qwen2_internal.h"
#include "model/tok_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "common/sl.h"

static const char *usage_text =
    "usage: model <command> [options]\n"
    "  info FILE                          metadata and tensor table\n"
    "  generate --model FILE --prompt TEXT [--max-tokens N] [--temperature T]\n"
    "           [--top-p P] [--top-k K] [--repeat-penalty R] [--seed S] [--threads N]\n"
    "           [--system TEXT] [--raw]   chat (or raw with --raw) completion + tokens/s\n"
    "diagnostics (tests, benchmarks):\n"
    "  logits --model FILE --tokens 1,2,.. [--gen N] [--mode batch|incremental|recompute]\n"
    "         [--out FILE] [common]       greedy continuation and float32 logits\n"
    "  tokenize --model FILE --text TEXT  token ids (--hex: TEXT is hex bytes; --raw: no\n"
    "           specials; --hex-lines FILE: one hex string per line, ids per line)\n"
    "  detokenize --model FILE --tokens 1,2,..   streamed text, as hex per token\n"
    "  chat-tokens --model FILE --messages ROLE=TEXT ...   ChatML prompt ids\n"
    "  bench --model FILE [--prompt-tokens N] [--gen N] [common]   prefill/decode speed\n"
    "  membw [--mib N] [--threads N]      memory read bandwidth (GB/s)\n"
    "  gemm [--mib N] [--streams T] [--gen REPS]   Q8_0 matrix kernels alone: CPU ns\n"
    "        per weight for T tokens, older tiles vs repacked\n"
    "  serve --model FILE [--streams N] [--max-tokens N] [--max-batch N] [--prompt TEXT]\n"
    "        [--stagger-ms N] [--temperature T --seed S] [common]   N concurrent chat\n"
    "        requests through the engine: per-stream TTFT, text, aggregate tokens/s\n"
    "  followup --model FILE [--prompt-tokens N] [--interleave K] [--no-reuse] [common]\n"
    "        a long first turn, K other conversations, then the follow-up turn: its TTFT\n"
    "  batch-check --model FILE [--streams N] [--gen N] [common]   the same sequences\n"
    "        alone and in staggered batched steps: are all logits bit-identical?\n"
    "common: --threads N --kernels scalar|avx2|avx512|auto --precise --batch N --ctx N\n"
    "        --mmap (map the file instead of copying it into huge pages)\n";

typedef struct {
    const char *model, *prompt, *tokens, *mode, *out, *text, *system, *lines;
    int max_tokens, gen, threads, batch, ctx, precise, raw, hex, prompt_tokens, mib, top_k;
    int kernel_level, mmap_file, streams, max_batch, stagger_ms, prefill_chunk, no_reuse;
    int interleave;
    double temperature, top_p, repeat_penalty;
    uint64_t seed;
    int has_seed;
    const char **messages;
    int n_messages;
} cli_opts_t;

/* The engine options every subcommand takes from the command line; each
 * then sets its own (prompt, queue, prefix reuse). */
static void cli_engine_opts(const cli_opts_t *o, mdl_engine_opts_t *eo)
{
    mdl_engine_opts_default(eo);
    eo->threads = o->threads;
    if (o->ctx > 0)
        eo->context = o->ctx;
    if (o->max_batch > 0)
        eo->max_batch = o->max_batch;
    eo->precise = o->precise;
    eo->mmap_file = o->mmap_file;
    eo->kernels = o->kernel_level == MDL_KL_SCALAR ? "scalar"
                  : o->kernel_level == MDL_KL_AVX2 ? "avx2"
                                                   : "auto";
}

static int parse_int(const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < -1000000000L || v > 1000000000L)
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

static int parse_opts(int argc, char **argv, int start, cli_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->max_tokens = 128;
    o->gen = 8;
    o->threads = 1;
    o->temperature = 0.0;
    o->top_p = 1.0;
    o->repeat_penalty = 1.0;
    o->kernel_level = MDL_KL_AVX512;
    o->prompt_tokens = 200;
    o->mib = 512;
    o->streams = 4;
    o->messages = calloc((size_t)argc + 1, sizeof(char *));
    if (!o->messages)
        return -1;
    for (int i = start; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int need = 1, bad = 0;
        if (!strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--prompt"))
            o->prompt = v;
        else if (!strcmp(a, "--tokens"))
            o->tokens = v;
        else if (!strcmp(a, "--mode"))
            o->mode = v;
        else if (!strcmp(a, "--out"))
            o->out = v;
        else if (!strcmp(a, "--text"))
            o->text = v;
        else if (!strcmp(a, "--system"))
            o->system = v;
        else if (!strcmp(a, "--hex-lines"))
            o->lines = v;
        else if (!strcmp(a, "--max-tokens"))
            bad = !v || parse_int(v, &o->max_tokens);
        else if (!strcmp(a, "--gen"))
            bad = !v || parse_int(v, &o->gen);
        else if (!strcmp(a, "--threads"))
            bad = !v || parse_int(v, &o->threads) || o->threads < 1 || o->threads > 64;
        else if (!strcmp(a, "--batch"))
            bad = !v || parse_int(v, &o->batch);
        else if (!strcmp(a, "--ctx"))
            bad = !v || parse_int(v, &o->ctx);
        else if (!strcmp(a, "--prompt-tokens"))
            bad = !v || parse_int(v, &o->prompt_tokens);
        else if (!strcmp(a, "--streams"))
            bad = !v || parse_int(v, &o->streams) || o->streams < 1 || o->streams > 256;
        else if (!strcmp(a, "--max-batch"))
            bad = !v || parse_int(v, &o->max_batch) || o->max_batch < 0;
        else if (!strcmp(a, "--stagger-ms"))
            bad = !v || parse_int(v, &o->stagger_ms) || o->stagger_ms < 0;
        else if (!strcmp(a, "--prefill-chunk"))
            bad = !v || parse_int(v, &o->prefill_chunk) || o->prefill_chunk < 0;
        else if (!strcmp(a, "--interleave"))
            bad = !v || parse_int(v, &o->interleave) || o->interleave < 0 || o->interleave > 64;
        else if (!strcmp(a, "--mib"))
            bad = !v || parse_int(v, &o->mib) || o->mib < 1;
        else if (!strcmp(a, "--top-k"))
            bad = !v || parse_int(v, &o->top_k);
        else if (!strcmp(a, "--temperature"))
            bad = !v || parse_double(v, &o->temperature);
        else if (!strcmp(a, "--top-p"))
            bad = !v || parse_double(v, &o->top_p);
        else if (!strcmp(a, "--repeat-penalty"))
            bad = !v || parse_double(v, &o->repeat_penalty);
        else if (!strcmp(a, "--seed")) {
            bad = !v || !*v;
            if (!bad) {
                char *end;
                o->seed = strtoull(v, &end, 10);
                bad = *end != '\0';
                o->has_seed = 1;
            }
        } else if (!strcmp(a, "--kernels")) {
            bad = !v || (o->kernel_level = mdl_klevel_parse(v)) < 0;
        } else if (!strcmp(a, "--messages")) {
            need = 0;
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
                o->messages[o->n_messages++] = argv[++i];
        } else {
            need = 0;
            if (!strcmp(a, "--precise"))
                o->precise = 1;
            else if (!strcmp(a, "--raw"))
                o->raw = 1;
            else if (!strcmp(a, "--hex"))
                o->hex = 1;
            else if (!strcmp(a, "--mmap"))
                o->mmap_file = 1;
            else if (!strcmp(a, "--no-reuse"))
                o->no_reuse = 1;
            else {
                fprintf(stderr, "model: unknown option %s\n", a);
                return -1;
            }
        }
        if (need) {
            if (!v || bad) {
                fprintf(stderr, "model: option %s needs a valid value\n", a);
                return -1;
            }
            i++;
        }
    }
    return 0;
}

/* "1,2,3" -> ids (caller frees). */
static int32_t *parse_ids(const char *s, int *n)
{
    size_t cap = strlen(s) / 2 + 2;
    int32_t *ids = malloc(sizeof(int32_t) * cap);
    if (!ids)
        return NULL;
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX) {
            free(ids);
            return NULL;
        }
        ids[(*n)++] = (int32_t)v;
        p = end;
        if (*p == ',')
            p++;
        else if (*p) {
            free(ids);
            return NULL;
        }
    }
    return ids;
}

/* ---- info ----------------------------------------------------------- */

static void print_str(FILE *f, mdl_str_t s, size_t max)
{
    fputc('"', f);
    for (uint64_t i = 0; i < s.len && i < max; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
    if (s.len > max)
        fprintf(f, "...(%" PRIu64 " bytes)", s.len);
}

static void print_value(FILE *f, const mdl_gguf_kv_t *kv)
{
    const uint8_t *p = kv->data;
    switch (kv->type) {
    case MDL_GV_STRING: {
        mdl_str_t s;
        uint64_t len;
        memcpy(&len, p, 8);
        s.len = len;
        s.ptr = (const char *)p + 8;
        print_str(f, s, 120);
        break;
    }
    case MDL_GV_F32: {
        float v;
        memcpy(&v, p, 4);
        fprintf(f, "%g", v);
        break;
    }
    case MDL_GV_F64: {
        double v;
        memcpy(&v, p, 8);
        fprintf(f, "%g", v);
        break;
    }
    case MDL_GV_BOOL:
        fprintf(f, "%s", p[0] ? "true" : "false");
        break;
    case MDL_GV_ARRAY: {
        fprintf(f, "[%s x %" PRIu64 "]", mdl_gv_type_name(kv->arr_type), kv->arr_count);
        if (kv->arr_type == MDL_GV_STRING) {
            uint64_t pos = 0;
            mdl_str_t s;
            for (int i = 0; i < 4 && mdl_gguf_arr_next_str(kv, &pos, &s) == 0; i++) {
                fputc(' ', f);
                print_str(f, s, 24);
            }
        } else if (kv->arr_type != MDL_GV_F32 && kv->arr_type != MDL_GV_F64) {
            for (uint64_t i = 0; i < kv->arr_count && i < 8; i++)
                fprintf(f, " %" PRId64, mdl_gguf_arr_int(kv, i));
        }
        if (kv->arr_count > 4)
            fprintf(f, " ...");
        break;
    }
    default: {
        int64_t v = 0;
        mdl_gguf_kv_t tmp = *kv;
        tmp.arr_type = kv->type;
        tmp.arr_count = 1;
        tmp.type = MDL_GV_ARRAY;
        v = mdl_gguf_arr_int(&tmp, 0);
        fprintf(f, "%" PRId64, v);
    }
    }
}

static int cmd_info(const char *path)
{
    char err[256];
    mdl_gguf_t *g = mdl_gguf_open(path, err, sizeof(err));
    if (!g) {
        fprintf(stderr, "model info: %s\n", err);
        return 1;
    }
    printf("file: %s\nGGUF version %u, %" PRIu64 " bytes, alignment %" PRIu64 ", data at %" PRIu64
           "\n",
           path, mdl_gguf_version(g), mdl_gguf_file_size(g), mdl_gguf_alignment(g),
           mdl_gguf_data_offset(g));
    printf("\nmetadata (%zu keys):\n", mdl_gguf_kv_count(g));
    for (size_t i = 0; i < mdl_gguf_kv_count(g); i++) {
        const mdl_gguf_kv_t *kv = mdl_gguf_kv_at(g, i);
        printf("  %-44.*s ", (int)kv->key.len, kv->key.ptr);
        print_value(stdout, kv);
        putchar('\n');
    }
    uint64_t total = 0;
    printf("\ntensors (%zu):\n  %-36s %-6s %-28s %12s %12s\n", mdl_gguf_tensor_count(g), "name",
           "type", "shape", "offset", "bytes");
    for (size_t i = 0; i < mdl_gguf_tensor_count(g); i++) {
        const mdl_gguf_tensor_t *t = mdl_gguf_tensor_at(g, i);
        char shape[64];
        int n = snprintf(shape, sizeof(shape), "[");
        for (uint32_t d = 0; d < t->n_dims && n < (int)sizeof(shape); d++)
            n += snprintf(shape + n, sizeof(shape) - (size_t)n, "%s%" PRIu64, d ? ", " : "",
                          t->ne[d]);
        if (n < (int)sizeof(shape))
            snprintf(shape + n, sizeof(shape) - (size_t)n, "]");
        printf("  %-36.*s %-6s %-28s %12" PRIu64 " %12" PRIu64 "\n", (int)t->name.len, t->name.ptr,
               mdl_ttype_name(t->type), shape, t->offset, t->nbytes);
        total += t->nbytes;
    }
    printf("  total tensor bytes: %" PRIu64 "\n", total);
    /* Whether the engine can run it, and if not why. */
    mdl_model_t *m = mdl_model_from_gguf(g, err, sizeof(err));
    if (!m) {
        printf("\nengine: cannot run this file: %s\n", err);
        return 1;
    }
    printf("\nengine: qwen2 n_embd=%d n_layer=%d n_head=%d n_kv=%d head_dim=%d n_ff=%d "
           "n_vocab=%d rope_base=%g eps=%g %s head; %.1f MB of weights read per token\n",
           m->n_embd, m->n_layer, m->n_head, m->n_kv, m->head_dim, m->n_ff, m->n_vocab,
           m->rope_base, m->eps, m->tied ? "tied" : "separate", m->bytes_per_token / 1e6);
    mdl_model_free(m);
    return 0;
}

/* ---- shared setup ------------------------------------------------------ */

typedef struct {
    mdl_gguf_t *g; /* tokenizer-only use: the file without a model */
    mdl_model_t *m;
    mdl_tok_t *tok;
    mdl_pool_t *pool;
    mdl_state_t *st;
} cli_ctx_t;

static void ctx_free(cli_ctx_t *c)
{
    mdl_state_free(c->st);
    mdl_pool_free(c->pool);
    mdl_tok_free(c->tok);
    mdl_model_free(c->m);
    mdl_gguf_free(c->g);
}

/* Loads the tokenizer only (any GGUF with tokenizer metadata, weights or
 * not) when n_ctx is 0; otherwise the model and a state of n_ctx tokens. */
static int ctx_open(cli_ctx_t *c, const cli_opts_t *o, int want_tok, int n_ctx)
{
    char err[256];
    memset(c, 0, sizeof(*c));
    if (!o->model) {
        fprintf(stderr, "model: --model FILE is required\n");
        return -1;
    }
    if (n_ctx == 0) {
        c->g = mdl_gguf_open(o->model, err, sizeof(err));
        const mdl_gguf_tensor_t *emb =
            c->g ? mdl_gguf_tensor_find(c->g, "token_embd.weight") : NULL;
        int n_vocab = emb && emb->ne[1] < (1u << 30) ? (int)emb->ne[1] : 1 << 30;
        if (c->g && want_tok)
            c->tok = mdl_tok_from_gguf(c->g, n_vocab, err, sizeof(err));
        if (!c->g || (want_tok && !c->tok)) {
            fprintf(stderr, "model: %s\n", err);
            ctx_free(c);
            return -1;
        }
        return 0;
    }
    c->m = mdl_model_load(o->model, !o->mmap_file, err, sizeof(err));
    if (!c->m) {
        fprintf(stderr, "model: %s\n", err);
        return -1;
    }
    c->pool = mdl_pool_new(o->threads);
    mdl_state_opts_t so = {
        .n_ctx = n_ctx, .batch = o->batch, .kernel_level = o->kernel_level, .precise = o->precise};
    c->st = c->pool ? mdl_state_new(c->m, &so, c->pool, err, sizeof(err)) : NULL;
    if (!c->st) {
        fprintf(stderr, "model: %s\n", c->pool ? err : "cannot start threads");
        ctx_free(c);
        return -1;
    }
    return 0;
}

static int32_t argmax(const float *v, int n)
{
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

/* ---- logits ------------------------------------------------------------ */

static int cmd_logits(const cli_opts_t *o)
{
    int np = 0, rc = 1;
    int32_t *prompt = o->tokens ? parse_ids(o->tokens, &np) : NULL;
    if (!prompt || np == 0) {
        fprintf(stderr, "model logits: --tokens 1,2,... is required\n");
        free(prompt);
        return 1;
    }
    const char *mode = o->mode ? o->mode : "batch";
    int gen = o->gen < 0 ? 0 : o->gen, total = np + gen;
    cli_ctx_t c;
    if (ctx_open(&c, o, 0, o->ctx > 0 ? o->ctx : total + 1) != 0) {
        free(prompt);
        return 1;
    }
    int V = c.m->n_vocab, rows = gen > 0 ? total - 1 : np;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)total);
    float *all = malloc(sizeof(float) * (size_t)rows * V);
    if (!toks || !all)
        goto out;
    memcpy(toks, prompt, sizeof(int32_t) * (size_t)np);
    int recompute = !strcmp(mode, "recompute"), incremental = !strcmp(mode, "incremental");
    if (!recompute && !incremental && strcmp(mode, "batch")) {
        fprintf(stderr, "model logits: unknown mode %s\n", mode);
        goto out;
    }
    /* position i's logits go to row i; recompute re-runs the prefix each time */
    for (int i = 0; i < rows; i++) {
        int ok;
        if (i >= np) /* greedy continuation from the previous row */
            toks[i] = argmax(all + (size_t)(i - 1) * V, V);
        if (recompute) {
            mdl_state_truncate(c.st, 0);
            ok = mdl_state_eval(c.st, toks, i + 1, all + (size_t)i * V, 0) == 0;
        } else if (incremental || i >= np) {
            ok = mdl_state_eval(c.st, toks + i, 1, all + (size_t)i * V, 0) == 0;
        } else {
            ok = mdl_state_eval(c.st, toks, np, all, 1) == 0;
            i = np - 1;
        }
        if (!ok) {
            fprintf(stderr, "model logits: evaluation failed (token id out of range?)\n");
            goto out;
        }
    }
    if (gen > 0)
        toks[total - 1] = argmax(all + (size_t)(rows - 1) * V, V);
    printf("kernels %s%s\ngenerated:", mdl_state_kernels(c.st), o->precise ? " precise" : "");
    for (int i = np; i < total; i++)
        printf(" %d", toks[i]);
    printf("\n");
    if (o->out) {
        FILE *f = fopen(o->out, "wb");
        if (!f || fwrite(all, sizeof(float) * V, (size_t)rows, f) != (size_t)rows) {
            fprintf(stderr, "model logits: cannot write %s\n", o->out);
            if (f)
                fclose(f);
            goto out;
        }
        fclose(f);
    }
    rc = 0;
out:
    free(prompt);
    free(toks);
    free(all);
    ctx_free(&c);
    return rc;
}

/* ---- tokenizer tools ---------------------------------------------------- */

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

static void print_ids(const mdl_ids_t *ids)
{
    for (int i = 0; i < ids->n; i++)
        printf("%s%d", i ? "," : "", ids->v[i]);
    printf("\n");
}

/* Decodes hex into buf (len/2 bytes); -1 on bad input. */
static int unhex(const char *hex, size_t len, char *buf)
{
    if (len % 2)
        return -1;
    for (size_t i = 0; i < len / 2; i++) {
        int h = hexval(hex[2 * i]), l = hexval(hex[2 * i + 1]);
        if (h < 0 || l < 0)
            return -1;
        buf[i] = (char)(h << 4 | l);
    }
    return 0;
}

static int tokenize_print(const cli_ctx_t *c, const char *text, size_t len, int raw)
{
    mdl_ids_t ids = {0};
    int rc = mdl_tok_encode(c->tok, text, len, !raw, &ids);
    if (rc == 0)
        print_ids(&ids);
    else
        fprintf(stderr, "model tokenize: encoding failed\n");
    free(ids.v);
    return rc;
}

/* --text TEXT (or hex with --hex), or --hex-lines FILE: one hex-encoded
 * string per line, one line of ids out per line in. */
static int cmd_tokenize(const cli_opts_t *o)
{
    if (!o->text && !o->lines) {
        fprintf(stderr, "model tokenize: --text or --hex-lines is required\n");
        return 1;
    }
    cli_ctx_t c;
    if (ctx_open(&c, o, 1, 0) != 0)
        return 1;
    int rc = 1;
    char *line = NULL, *buf = NULL;
    size_t cap = 0;
    if (o->text) {
        size_t len = strlen(o->text);
        buf = malloc(len + 1);
        if (!buf)
            goto out;
        if (o->hex && unhex(o->text, len, buf) != 0) {
            fprintf(stderr, "model tokenize: bad hex\n");
            goto out;
        }
        if (!o->hex)
            memcpy(buf, o->text, len);
        rc = tokenize_print(&c, buf, o->hex ? len / 2 : len, o->raw) ? 1 : 0;
        goto out;
    }
    FILE *f = fopen(o->lines, "r");
    if (!f) {
        fprintf(stderr, "model tokenize: cannot open %s\n", o->lines);
        goto out;
    }
    ssize_t n;
    rc = 0;
    while (rc == 0 && (n = getline(&line, &cap, f)) >= 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = '\0';
        if (unhex(line, (size_t)n, line) != 0) {
            fprintf(stderr, "model tokenize: bad hex line\n");
            rc = 1;
        } else {
            rc = tokenize_print(&c, line, (size_t)n / 2, o->raw) ? 1 : 0;
        }
    }
    fclose(f);
out:
    free(buf);
    free(line);
    ctx_free(&c);
    return rc;
}

static int cmd_detokenize(const cli_opts_t *o)
{
    int n = 0;
    int32_t *ids = o->tokens ? parse_ids(o->tokens, &n) : NULL;
    if (!ids) {
        fprintf(stderr, "model detokenize: --tokens is required\n");
        return 1;
    }
    cli_ctx_t c;
    if (ctx_open(&c, o, 1, 0) != 0) {
        free(ids);
        return 1;
    }
    mdl_utf8_t u = {0};
    for (int i = 0; i <= n; i++) {
        size_t len = 0, w;
        const uint8_t *b = i < n ? mdl_tok_bytes(c.tok, ids[i], o->raw, &len) : NULL;
        uint8_t *out = malloc(MDL_UTF8_OUT_MAX(len));
        if (!out)
            break;
        w = i < n ? mdl_utf8_feed(&u, b, len, out) : mdl_utf8_flush(&u, out);
        for (size_t k = 0; k < w; k++)
            printf("%02x", out[k]);
        printf("\n");
        free(out);
    }
    free(ids);
    ctx_free(&c);
    return 0;
}

static int cmd_chat_tokens(const cli_opts_t *o)
{
    cli_ctx_t c;
    if (ctx_open(&c, o, 1, 0) != 0)
        return 1;
    mdl_message_t *msgs = calloc((size_t)o->n_messages + 1, sizeof(*msgs));
    char **copies = calloc((size_t)o->n_messages + 1, sizeof(char *));
    mdl_ids_t ids = {0};
    int rc = 1;
    if (!msgs || !copies)
        goto out;
    for (int i = 0; i < o->n_messages; i++) {
        copies[i] = strdup(o->messages[i]);
        char *eq = copies[i] ? strchr(copies[i], '=') : NULL;
        if (!eq) {
            fprintf(stderr, "model chat-tokens: messages are ROLE=TEXT\n");
            goto out;
        }
        *eq = '\0';
        msgs[i].role = copies[i];
        msgs[i].content = eq + 1;
    }
    const char *sys = o->system ? (o->system[0] ? o->system : NULL) : mdl_qwen_default_system;
    if (mdl_chat_tokens(c.tok, msgs, (size_t)o->n_messages, sys, &ids) != 0) {
        fprintf(stderr, "model chat-tokens: failed (no ChatML tokens in the vocabulary?)\n");
        goto out;
    }
    print_ids(&ids);
    rc = 0;
out:
    for (int i = 0; copies && i < o->n_messages; i++)
        free(copies[i]);
    free(copies);
    free(msgs);
    free(ids.v);
    ctx_free(&c);
    return rc;
}

/* ---- generate (through the engine, as the gateway will) ------------------ */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    mdl_finish_t why;
    mdl_usage_t usage;
    char error[160];
} gen_wait_t;

static void gen_on_text(void *ud, const char *text, size_t len)
{
    (void)ud;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

static void gen_on_done(void *ud, mdl_finish_t why, const mdl_usage_t *u, const char *error)
{
    gen_wait_t *w = ud;
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    w->why = why;
    w->usage = *u;
    if (error)
        snprintf(w->error, sizeof(w->error), "%s", error);
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static int cmd_generate(const cli_opts_t *o)
{
    if (!o->model || !o->prompt) {
        fprintf(stderr, "model generate: --model FILE and --prompt TEXT are required\n");
        return 1;
    }
    mdl_engine_opts_t eo;
    cli_engine_opts(o, &eo);
    eo.system_prompt = o->system;
    char err[256];
    int64_t t0 = sl_now_ns();
    mdl_engine_t *e = mdl_engine_new(o->model, &eo, err, sizeof(err));
    if (!e) {
        fprintf(stderr, "model generate: %s\n", err);
        return 1;
    }
    mdl_sampling_t sp;
    mdl_sampling_default(&sp);
    sp.temperature = (float)o->temperature;
    sp.top_p = (float)o->top_p;
    sp.top_k = o->top_k;
    sp.repetition_penalty = (float)o->repeat_penalty;
    sp.max_tokens = o->max_tokens;
    sp.seed = o->seed;
    sp.has_seed = o->has_seed;
    gen_wait_t w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    mdl_message_t msg = {"user", o->prompt};
    mdl_callbacks_t cb = {gen_on_text, gen_on_done};
    int rc = mdl_engine_submit(e, &msg, 1, &sp, &cb, &w, NULL);
    if (rc != MDL_SUBMIT_OK) {
        fprintf(stderr, "model generate: submit failed (%d)\n", rc);
        mdl_engine_free(e);
        return 1;
    }
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    mdl_engine_info_t info;
    mdl_engine_info(e, &info);
    double dec_s = w.usage.decode_ms / 1e3;
    printf("\n");
    fprintf(stderr,
            "[%s] finish=%s prompt_tokens=%d (cached %d) completion_tokens=%d "
            "prefill %.0f ms, %.2f tokens/s decode, %s x%d, load+total %.2f s%s%s\n",
            info.model_name, mdl_finish_name(w.why), w.usage.prompt_tokens, w.usage.cached_tokens,
            w.usage.completion_tokens, w.usage.prefill_ms,
            dec_s > 0 ? w.usage.completion_tokens / dec_s : 0.0, info.kernels, info.threads,
            (double)(sl_now_ns() - t0) / 1e9, w.error[0] ? " error: " : "", w.error);
    mdl_engine_free(e);
    return w.why == MDL_FINISH_ERROR ? 1 : 0;
}

/* ---- bench ------------------------------------------------------------------ */

static int cmd_bench(const cli_opts_t *o)
{
    int P = o->prompt_tokens > 0 ? o->prompt_tokens : 1, G = o->gen > 0 ? o->gen : 32;
    cli_ctx_t c;
    if (ctx_open(&c, o, 0, P + G + 1) != 0)
        return 1;
    int V = c.m->n_vocab;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(P + G));
    float *lg = malloc(sizeof(float) * (size_t)V);
    if (!toks || !lg) {
        free(toks);
        free(lg);
        ctx_free(&c);
        return 1;
    }
    uint64_t x = 12345;
    for (int i = 0; i < P; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        toks[i] = (int32_t)((x >> 33) % (uint64_t)V);
    }
    /* one warm-up token pulls the mapping into the page cache and memory */
    if (mdl_state_eval(c.st, toks, 1, lg, 0) != 0)
        goto fail;
    mdl_state_truncate(c.st, 0);
    struct timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    int64_t t0 = sl_now_ns();
    if (mdl_state_eval(c.st, toks, P, lg, 0) != 0)
        goto fail;
    int64_t t1 = sl_now_ns();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    /* this thread's CPU time: with one thread, what the prefill cost when
     * other processes take turns on the core (a shared machine) */
    double pre_cpu = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) / 1e9;
    int64_t *at = malloc(sizeof(int64_t) * (size_t)(G + 1));
    if (!at)
        goto fail;
    at[0] = t1;
    for (int i = 0; i < G; i++) {
        toks[P + i] = argmax(lg, V);
        if (mdl_state_eval(c.st, toks + P + i, 1, lg, 0) != 0) {
            free(at);
            goto fail;
        }
        at[i + 1] = sl_now_ns();
    }
    int64_t t2 = at[G];
    /* On a shared machine other processes steal time now and then; the best
     * window of 8 consecutive tokens shows what the engine does when it has
     * the core (as STREAM reports its best run). */
    int win = SL_MIN(8, G);
    int64_t best = INT64_MAX;
    for (int i = 0; i + win <= G; i++)
        best = SL_MIN(best, at[i + win] - at[i]);
    free(at);
    double pre_s = (double)(t1 - t0) / 1e9, dec_s = (double)(t2 - t1) / 1e9;
    double tps = G / dec_s, gbs = tps * (double)c.m->bytes_per_token / 1e9;
    double best_tps = win / ((double)best / 1e9);
    printf("model=%s kernels=%s%s threads=%d bytes_per_token=%.1fMB prefill_tokens=%d "
           "prefill_s=%.3f prefill_tps=%.2f ttft_ms=%.1f decode_tokens=%d decode_s=%.3f "
           "decode_tps=%.2f decode_best8_tps=%.2f effective_GBps=%.2f prefill_cpu_tps=%.2f\n",
           c.m->name, mdl_state_kernels(c.st), o->precise ? "+precise" : "", o->threads,
           c.m->bytes_per_token / 1e6, P, pre_s, P / pre_s, pre_s * 1e3, G, dec_s, tps, best_tps,
           gbs, pre_cpu > 0 ? P / pre_cpu : 0.0);
    mdl_pool_stats_t ps;
    mdl_pool_stats(c.pool, &ps);
    fprintf(stderr,
            "pool: dispatches=%llu caller_items=%llu helper_items=%llu straggler_waits=%llu "
            "solo_dispatches=%llu\n",
            (unsigned long long)ps.dispatches, (unsigned long long)ps.caller_items,
            (unsigned long long)ps.helper_items, (unsigned long long)ps.straggler_waits,
            (unsigned long long)ps.solo_dispatches);
    free(toks);
    free(lg);
    ctx_free(&c);
    return 0;
fail:
    fprintf(stderr, "model bench: evaluation failed\n");
    free(toks);
    free(lg);
    ctx_free(&c);
    return 1;
}

/* ---- membw: STREAM-style read bandwidth ------------------------------------------ */

typedef struct {
    const float *buf;
    size_t n;
    const mdl_kernels_t *k;
    double sums[64];
} bw_task_t;

static void bw_worker(void *arg, int ith, int nth)
{
    bw_task_t *t = arg;
    size_t per = t->n / (size_t)nth, a = per * (size_t)ith;
    double s = 0;
    const size_t chunk = 1 << 20;
    for (size_t i = a; i < a + per; i += chunk) {
        size_t m = SL_MIN(chunk, a + per - i);
        s += t->k->vdot(t->buf + i, t->buf + i, (int)m);
    }
    t->sums[ith] = s;
}

static int cmd_membw(const cli_opts_t *o)
{
    size_t bytes = (size_t)o->mib << 20, n = bytes / sizeof(float);
    float *buf = malloc(bytes);
    mdl_pool_t *pool = mdl_pool_new(o->threads);
    if (!buf || !pool || o->threads > 64) {
        free(buf);
        mdl_pool_free(pool);
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        buf[i] = (float)(i & 7) * 0.125f;
    bw_task_t t = {.buf = buf, .n = n, .k = mdl_kernels_select(o->kernel_level)};
    double best = 0;
    for (int rep = 0; rep < 10; rep++) { /* best of 10: the machine may be shared */
        int64_t t0 = sl_now_ns();
        mdl_pool_run(pool, bw_worker, &t);
        double s = (double)(sl_now_ns() - t0) / 1e9, gbs = (double)bytes / s / 1e9;
        best = gbs > best ? gbs : best;
    }
    printf("membw threads=%d MiB=%d read_GBps=%.2f (check %g)\n", o->threads, o->mib, best,
           t.sums[0]);
    free(buf);
    mdl_pool_free(pool);
    return 0;
}

/* ---- gemm: the Q8_0 matrix kernels alone --------------------------------------- */

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A Q8_0 matrix of about MiB (896-wide rows, like Qwen2.5-0.5B's) times T
 * tokens, with the older tiles and with the repacked kernel, interleaved:
 * CPU time per call (this thread's: memory stalls count, other processes
 * do not), as ns per weight and weights x tokens per ns. MiB 1 stays in
 * the caches, 256 streams from memory like a decode step. */
static int cmd_gemm(const cli_opts_t *o)
{
    const mdl_kernels_t *k = mdl_kernels_select(o->kernel_level);
    const int n = 896, T = o->streams > 0 && o->streams <= 64 ? o->streams : 8;
    size_t rb = (size_t)n / 32 * 34;
    int rows = (int)(((size_t)o->mib << 20) / rb / 16 * 16), reps = o->gen > 0 ? o->gen : 8;
    if (rows < 16 || !k->gemm[MDL_T_Q8_0] || !k->gemm_rp[MDL_T_Q8_0]) {
        fprintf(stderr, "model gemm: needs --mib >= 1 and the avx512 kernels\n");
        return 1;
    }
    size_t gb = mdl_rp_group_bytes(MDL_T_Q8_0, n);
    uint8_t *w = malloc(rb * (size_t)rows), *rp = aligned_alloc(64, gb * (size_t)(rows / 16));
    float *x = malloc(sizeof(float) * (size_t)n * T),
          *out = malloc(sizeof(float) * (size_t)rows * T);
    int8_t *q = malloc((size_t)n * T);
    float *d = malloc(sizeof(float) * (size_t)n / 32 * T);
    int32_t *qs = malloc(sizeof(int32_t) * (size_t)n / 32 * T);
    size_t xb = (MDL_ACT_EXTRA_BYTES(n) + 63) / 64 * 64;
    uint8_t *extra = aligned_alloc(64, xb * (size_t)T);
    mdl_act_t *a = calloc((size_t)T, sizeof(*a));
    if (!w || !rp || !x || !out || !q || !d || !qs || !extra || !a) {
        free(w), free(rp), free(x), free(out), free(q), free(d), free(qs), free(extra), free(a);
        return 1;
    }
    uint64_t r = 88172645463325252ULL;
    for (size_t i = 0; i < rb * (size_t)rows; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        w[i] = (uint8_t)(r >> 24);
    }
    for (int i = 0; i < rows * n / 32; i++) /* sane fp16 scales: 0x2000 + small */
        w[(size_t)i * 34 + 1] = 0x20;
    for (int i = 0; i < n * T; i++)
        x[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
    for (int t = 0; t < T; t++) {
        a[t] = (mdl_act_t){.n = n,
                           .x = x + (size_t)t * n,
                           .q = q + (size_t)t * n,
                           .d = d + (size_t)t * n / 32,
                           .qsum = qs + (size_t)t * n / 32};
        mdl_act_bind_extra(&a[t], extra + xb * (size_t)t);
        k->quantize(a[t].x, n, a[t].q, a[t].d, a[t].qsum);
        if (k->prep)
            k->prep(&a[t]);
    }
    uint8_t *il = aligned_alloc(64, (MDL_IL_BYTES(n, T) + 63) / 64 * 64);
    if (il && T >= 4 && !getenv("MDL_GEMM_NO_IL")) /* as the engine runs it */
        mdl_act_interleave(a, T, il);
    mdl_rp_pack(MDL_T_Q8_0, w, rb, rows, n, rp);
    double best[2] = {1e30, 1e30};
    for (int rep = 0; rep < reps; rep++)
        for (int v = 0; v < 2; v++) {
            double c0 = thread_cpu_s();
            if (v == 0)
                k->gemm[MDL_T_Q8_0](w, rb, rows, a, T, out, (size_t)rows, NULL, 0);
            else
                k->gemm_rp[MDL_T_Q8_0](rp, gb, rows, a, T, out, (size_t)rows, NULL, 0);
            double c = thread_cpu_s() - c0;
            best[v] = c < best[v] ? c : best[v];
        }
    double nw = (double)rows * n;
    printf("gemm q8_0 rows=%d cols=%d tokens=%d MiB=%.1f tiles_ns_per_weight=%.4f "
           "rp_ns_per_weight=%.4f tiles_macs_per_ns=%.2f rp_macs_per_ns=%.2f rp_vs_tiles=%.2f\n",
           rows, n, T, (double)rb * rows / 1048576.0, best[0] * 1e9 / nw, best[1] * 1e9 / nw,
           nw * T / (best[0] * 1e9), nw * T / (best[1] * 1e9), best[0] / best[1]);
    free(w), free(rp), free(x), free(out), free(q), free(d), free(qs), free(extra), free(a);
    free(il);
    return 0;
}

/* ---- serve: concurrent requests through the engine ---------------------------- */

typedef struct {
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    int *n_done;
    int64_t t_submit, t_done;
    int texts;
    char hex[4096];
    size_t hex_len;
    mdl_finish_t why;
    mdl_usage_t usage;
} serve_stream_t;

/* CPU seconds of the whole process (every thread) so far. */
static double proc_cpu_s(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0)
        return 0.0;
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void serve_on_text(void *ud, const char *text, size_t len)
{
    serve_stream_t *s = ud;
    s->texts++;
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < len && s->hex_len + 2 < sizeof(s->hex); i++) {
        s->hex[s->hex_len++] = hx[(uint8_t)text[i] >> 4];
        s->hex[s->hex_len++] = hx[(uint8_t)text[i] & 15];
    }
}

static void serve_on_done(void *ud, mdl_finish_t why, const mdl_usage_t *u, const char *error)
{
    (void)error;
    serve_stream_t *s = ud;
    pthread_mutex_lock(s->mu);
    s->t_done = sl_now_ns();
    s->why = why;
    s->usage = *u;
    (*s->n_done)++;
    pthread_cond_broadcast(s->cv);
    pthread_mutex_unlock(s->mu);
}

static int cmd_serve(const cli_opts_t *o)
{
    if (!o->model) {
        fprintf(stderr, "model serve: --model FILE is required\n");
        return 1;
    }
    mdl_engine_opts_t eo;
    cli_engine_opts(o, &eo);
    if (o->prefill_chunk > 0)
        eo.prefill_chunk = o->prefill_chunk;
    eo.max_queue = o->streams;
    eo.system_prompt = o->system;
    char err[256];
    mdl_engine_t *e = mdl_engine_new(o->model, &eo, err, sizeof(err));
    if (!e) {
        fprintf(stderr, "model serve: %s\n", err);
        return 1;
    }
    while (!mdl_engine_ready(e)) /* the system prompt's state first */
        usleep(1000);
    int N = o->streams, n_done = 0, rc = 0;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    serve_stream_t *ss = calloc((size_t)N, sizeof(*ss));
    char(*content)[256] = calloc((size_t)N, 256);
    if (!ss || !content) {
        free(ss);
        free(content);
        mdl_engine_free(e);
        return 1;
    }
    mdl_sampling_t sp;
    mdl_sampling_default(&sp);
    sp.temperature = (float)o->temperature;
    sp.top_p = (float)o->top_p;
    sp.top_k = o->top_k;
    sp.repetition_penalty = (float)o->repeat_penalty;
    sp.max_tokens = o->max_tokens;
    sp.seed = o->seed;
    sp.has_seed = 1;
    mdl_callbacks_t cb = {serve_on_text, serve_on_done};
    /* CPU time of the whole process over the requests (the engine thread
     * and the pool; this thread sleeps): on a shared host it shows what
     * the work cost, when the wall clock shows mostly whom the host ran */
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    int64_t t0 = sl_now_ns();
    for (int i = 0; i < N; i++) {
        if (i > 0 && o->stagger_ms > 0)
            usleep((useconds_t)o->stagger_ms * 1000);
        snprintf(content[i], 256, "%s (request %d of %d)", o->prompt ? o->prompt : "Hello", i + 1,
                 N);
        mdl_message_t msg = {"user", content[i]};
        ss[i].mu = &mu;
        ss[i].cv = &cv;
        ss[i].n_done = &n_done;
        ss[i].t_submit = sl_now_ns();
        if (mdl_engine_submit(e, &msg, 1, &sp, &cb, &ss[i], NULL) != MDL_SUBMIT_OK) {
            fprintf(stderr, "model serve: submit %d failed\n", i);
            pthread_mutex_lock(&mu);
            n_done++;
            pthread_mutex_unlock(&mu);
            rc = 1;
        }
    }
    pthread_mutex_lock(&mu);
    while (n_done < N)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    int64_t t1 = sl_now_ns();
    double cpu_end = proc_cpu_s();
    getrusage(RUSAGE_SELF, &ru1);
    double cpu = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) +
                 (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) / 1e6 +
                 (double)(ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
                 (double)(ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e6;
    /* decode alone: the tokens after each stream's first, over the CPU
     * spent from the earliest first token to the end (prompts submitted
     * together are prefilled before any first token, so outside it) */
    long total = 0, after_first = 0;
    double cpu_first = 0.0;
    for (int i = 0; i < N; i++) {
        serve_stream_t *s = &ss[i];
        total += s->usage.completion_tokens;
        after_first += s->usage.completion_tokens > 1 ? s->usage.completion_tokens - 1 : 0;
        double f = s->usage.first_token_cpu_s;
        if (f > 0.0 && (cpu_first == 0.0 || f < cpu_first))
            cpu_first = f;
        printf("stream=%d finish=%s prompt_tokens=%d cached_tokens=%d completion_tokens=%d "
               "ttft_ms=%.1f total_ms=%.1f text_hex=%.*s\n",
               i, mdl_finish_name(s->why), s->usage.prompt_tokens, s->usage.cached_tokens,
               s->usage.completion_tokens, s->usage.ttft_ms,
               (double)(s->t_done - s->t_submit) / 1e6, (int)s->hex_len, s->hex);
    }
    mdl_engine_info_t info;
    mdl_engine_info(e, &info);
    double wall = (double)(t1 - t0) / 1e9;
    printf("summary streams=%d max_batch=%d threads=%d kernels=%s wall_s=%.3f tokens=%ld "
           "agg_tps=%.2f cpu_s=%.3f tokens_per_cpu_s=%.2f steps=%llu step_rows=%llu "
           "prefix_hits=%llu prefix_tokens=%llu decode_cpu_s=%.3f decode_tokens_per_cpu_s=%.2f\n",
           N, info.max_batch, info.threads, info.kernels, wall, total, total / wall, cpu,
           cpu > 0 ? total / cpu : 0.0, (unsigned long long)info.steps,
           (unsigned long long)info.step_rows, (unsigned long long)info.prefix_hits,
           (unsigned long long)info.prefix_tokens, cpu_end - cpu_first,
           cpu_first > 0.0 && cpu_end > cpu_first ? after_first / (cpu_end - cpu_first) : 0.0);
    free(ss);
    free(content);
    mdl_engine_free(e);
    return rc;
}

/* ---- followup: a conversation's next turn, with and without reuse ----------- */

static int hexval(char c);

/* Runs one chat request to its end; the answer's bytes (decoded from the
 * stream's hex) go to reply when not NULL. */
static int followup_run(mdl_engine_t *e, const mdl_message_t *m, size_t n, int max_tokens,
                        serve_stream_t *s, char *reply, size_t reply_cap)
{
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    int done = 0;
    memset(s, 0, sizeof(*s));
    s->mu = &mu;
    s->cv = &cv;
    s->n_done = &done;
    mdl_sampling_t sp;
    mdl_sampling_default(&sp);
    sp.temperature = 0.0f;
    sp.repetition_penalty = 1.0f;
    sp.max_tokens = max_tokens;
    mdl_callbacks_t cb = {serve_on_text, serve_on_done};
    s->t_submit = sl_now_ns();
    if (mdl_engine_submit(e, m, n, &sp, &cb, s, NULL) != MDL_SUBMIT_OK)
        return -1;
    pthread_mutex_lock(&mu);
    while (!done)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    if (reply) {
        size_t k = 0;
        for (size_t i = 0; i + 1 < s->hex_len && k + 1 < reply_cap; i += 2)
            reply[k++] = (char)(hexval(s->hex[i]) << 4 | hexval(s->hex[i + 1]));
        reply[k] = 0;
    }
    return 0;
}

static int cmd_followup(const cli_opts_t *o)
{
    if (!o->model) {
        fprintf(stderr, "model followup: --model FILE is required\n");
        return 1;
    }
    mdl_engine_opts_t eo;
    cli_engine_opts(o, &eo);
    if (o->ctx <= 0)
        eo.context = 4096;
    eo.max_queue = 64;
    eo.no_prefix_reuse = o->no_reuse;
    char err[256];
    mdl_engine_t *e = mdl_engine_new(o->model, &eo, err, sizeof(err));
    if (!e) {
        fprintf(stderr, "model followup: %s\n", err);
        return 1;
    }
    while (!mdl_engine_ready(e))
        usleep(1000);
    /* a long first user turn: words of letters and digits, roughly one
     * token per byte or two depending on the vocabulary */
    size_t cap = (size_t)o->prompt_tokens * 8 + 64;
    char *text = malloc(cap), reply[1024];
    serve_stream_t *s = malloc(sizeof(*s) * 66);
    int rc = 1;
    if (!text || !s)
        goto out;
    size_t len = 0;
    for (int i = 0; len + 16 < cap && (int)len < o->prompt_tokens; i++)
        len += (size_t)snprintf(text + len, cap - len, "w%d ", i % 97);
    mdl_message_t turn1[1] = {{"user", text}};
    if (followup_run(e, turn1, 1, 4, &s[0], reply, sizeof(reply)) != 0)
        goto out;
    /* other conversations take every slot in between */
    char others[64][96];
    int K = o->interleave;
    {
        pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
        pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
        int done = 0;
        mdl_sampling_t sp;
        mdl_sampling_default(&sp);
        sp.temperature = 0.0f;
        sp.max_tokens = 2;
        mdl_callbacks_t cb = {serve_on_text, serve_on_done};
        for (int k = 0; k < K; k++) {
            snprintf(others[k], sizeof(others[k]),
                     "another user, number %d, with a question of a few dozen tokens: %d", k,
                     k * 7919);
            mdl_message_t m = {"user", others[k]};
            memset(&s[1 + k], 0, sizeof(s[0]));
            s[1 + k].mu = &mu;
            s[1 + k].cv = &cv;
            s[1 + k].n_done = &done;
            if (mdl_engine_submit(e, &m, 1, &sp, &cb, &s[1 + k], NULL) != MDL_SUBMIT_OK)
                goto out;
        }
        pthread_mutex_lock(&mu);
        while (done < K)
            pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
    }
    mdl_message_t turn2[3] = {
        {"user", text}, {"assistant", reply}, {"user", "Thanks. And what comes next?"}};
    serve_stream_t s2;
    if (followup_run(e, turn2, 3, 8, &s2, NULL, 0) != 0)
        goto out;
    mdl_engine_info_t info;
    mdl_engine_info(e, &info);
    printf(
        "turn1_prompt_tokens=%d turn1_ttft_ms=%.1f turn2_prompt_tokens=%d turn2_cached_tokens=%d "
        "turn2_ttft_ms=%.1f turn2_finish=%s turn2_text_hex=%.*s interleaved=%d reuse=%d "
        "prefix_cache_hits=%llu prefix_cache_saves=%llu prefix_cache_entries=%d\n",
        s[0].usage.prompt_tokens, s[0].usage.ttft_ms, s2.usage.prompt_tokens,
        s2.usage.cached_tokens, s2.usage.ttft_ms, mdl_finish_name(s2.why), (int)s2.hex_len, s2.hex,
        K, !o->no_reuse, (unsigned long long)info.prefix_cache_hits,
        (unsigned long long)info.prefix_cache_saves, info.prefix_cache_entries);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "model followup: a request failed\n");
    free(text);
    free(s);
    mdl_engine_free(e);
    return rc;
}

/* ---- batch-check: batched steps against sequences alone ---------------------- */

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

static int cmd_batch_check(const cli_opts_t *o)
{
    int N = SL_MIN(o->streams, 16), G = o->gen > 0 ? o->gen : 8, chunk = 8;
    cli_ctx_t c;
    int P_max = 5 + 7 * (N - 1);
    if (ctx_open(&c, o, 0, P_max + G + 2) != 0)
        return 1;
    int V = c.m->n_vocab;
    char err[256];
    mdl_state_opts_t so = {
        .n_ctx = P_max + G + 2, .batch = 1, .kernel_level = o->kernel_level, .precise = o->precise};
    mdl_state_t *seq[16] = {0};
    int32_t toks[16][512];
    int plen[16], fed[16] = {0}, gen[16] = {0};
    uint64_t h_alone[16], h_batch[16];
    int32_t out_alone[16][64], out_batch[16][64];
    float *lg = malloc(sizeof(float) * (size_t)V * 16);
    int rc = 1;
    if (!lg || G > 64 || P_max + G > 500)
        goto out;
    uint64_t x = 777;
    for (int i = 0; i < N; i++) {
        plen[i] = 5 + 7 * i;
        for (int k = 0; k < plen[i]; k++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            toks[i][k] = (int32_t)((x >> 33) % (uint64_t)V);
        }
        seq[i] = mdl_state_new(c.m, &so, NULL, err, sizeof(err));
        if (!seq[i])
            goto out;
    }
    /* alone: each sequence by itself on the context's state */
    for (int i = 0; i < N; i++) {
        mdl_state_truncate(c.st, 0);
        h_alone[i] = 0xcbf29ce484222325ULL;
        if (mdl_state_eval(c.st, toks[i], plen[i], lg, 0) != 0)
            goto out;
        for (int g = 0; g < G; g++) {
            h_alone[i] = fnv(h_alone[i], lg, sizeof(float) * (size_t)V);
            int32_t t = argmax(lg, V);
            out_alone[i][g] = t;
            if (mdl_state_eval(c.st, &t, 1, lg, 0) != 0)
                goto out;
        }
        h_alone[i] = fnv(h_alone[i], lg, sizeof(float) * (size_t)V);
    }
    /* batched: sequence i joins at step i; prompts go in chunks of 8 while
     * the others decode; every step is one mdl_state_eval_seqs */
    for (int i = 0; i < N; i++)
        h_batch[i] = 0xcbf29ce484222325ULL;
    for (int stepno = 0;; stepno++) {
        mdl_seq_step_t st[16];
        int idx[16], n = 0, live = 0;
        int32_t last[16];
        for (int i = 0; i < N; i++) {
            if (gen[i] > G)
                continue;
            live++;
            if (i > stepno)
                continue;
            if (fed[i] < plen[i]) {
                int take = SL_MIN(chunk, plen[i] - fed[i]);
                int done = fed[i] + take == plen[i];
                st[n] = (mdl_seq_step_t){seq[i], toks[i] + fed[i], take,
                                         done ? lg + (size_t)n * V : NULL};
            } else {
                last[i] = out_batch[i][gen[i] - 1];
                st[n] = (mdl_seq_step_t){seq[i], &last[i], 1, lg + (size_t)n * V};
            }
            idx[n++] = i;
        }
        if (!live)
            break;
        if (n == 0)
            continue;
        if (mdl_state_eval_seqs(c.st, st, n) != 0)
            goto out;
        for (int k = 0; k < n; k++) {
            int i = idx[k];
            if (fed[i] < plen[i]) {
                fed[i] += st[k].n;
                if (fed[i] < plen[i])
                    continue;
            }
            const float *l = lg + (size_t)k * V;
            h_batch[i] = fnv(h_batch[i], l, sizeof(float) * (size_t)V);
            if (gen[i] < G)
                out_batch[i][gen[i]] = argmax(l, V);
            gen[i]++;
        }
    }
    int same = 1;
    for (int i = 0; i < N; i++) {
        int eq = h_alone[i] == h_batch[i] &&
                 memcmp(out_alone[i], out_batch[i], sizeof(int32_t) * (size_t)G) == 0;
        same &= eq;
        printf("seq=%d prompt=%d alone=%016llx batched=%016llx tokens=", i, plen[i],
               (unsigned long long)h_alone[i], (unsigned long long)h_batch[i]);
        for (int g = 0; g < G; g++)
            printf("%s%d", g ? "," : "", out_batch[i][g]);
        printf(" %s\n", eq ? "identical" : "DIFFERENT");
    }
    printf("kernels=%s%s identical=%d\n", mdl_state_kernels(c.st), o->precise ? "+precise" : "",
           same);
    rc = same ? 0 : 3;
out:
    if (rc == 1)
        fprintf(stderr, "model batch-check: evaluation failed\n");
    for (int i = 0; i < N; i++)
        mdl_state_free(seq[i]);
    free(lg);
    ctx_free(&c);
    return rc;
}

/* ---- entry ------------------------------------------------------------------------ */

/* The commands that take the common options (parse_opts), by name. */
static const struct {
    const char *name;
    int (*run)(const cli_opts_t *o);
} cli_cmds[] = {
    {"generate", cmd_generate},
    {"logits", cmd_logits},
    {"tokenize", cmd_tokenize},
    {"detokenize", cmd_detokenize},
    {"chat-tokens", cmd_chat_tokens},
    {"bench", cmd_bench},
    {"membw", cmd_membw},
    {"serve", cmd_serve},
    {"gemm", cmd_gemm},
    {"followup", cmd_followup},
    {"batch-check", cmd_batch_check},
};

int mdl_cli_main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help")) {
        fputs(usage_text, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "info")) {
        if (argc != 3) {
            fputs("usage: model info FILE\n", stderr);
            return 2;
        }
        return cmd_info(argv[2]);
    }
    cli_opts_t o;
    if (parse_opts(argc, argv, 2, &o) != 0) {
        free(o.messages);
        return 2;
    }
    int rc = 2;
    size_t i = 0;
    while (i < SL_ARRAY_LEN(cli_cmds) && strcmp(cmd, cli_cmds[i].name) != 0)
        i++;
    if (i < SL_ARRAY_LEN(cli_cmds))
        rc = cli_cmds[i].run(&o);
    else
        fprintf(stderr, "model: unknown command %s\n%s", cmd, usage_text);
    free(o.messages);
    return rc;
}
