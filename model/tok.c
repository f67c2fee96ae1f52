/*
 * tok.c — the byte-level BPE tokenizer (see tok_internal.h). Token strings,
 * their decoded bytes and the merge table are copied out of the GGUF at
 * load; encoding runs PCRE2 for the pre-tokenizer and a heap-ordered merge
 * loop per piece (O(n log n), so a 100k-space run is no problem).
 */
#include <errno.h>
#include <uninorm.h>
#include "model/tok_internal.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>

/* Unicode White_Space, spelled out (see the header comment). */
#define WS                                                                                         \
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{"   \
    "202F}\\x{205F}\\x{3000}"

/* The Qwen2 pre-tokenizer, as in its tokenizer.json, with \s and \S
 * replaced by the White_Space class and its complement. */
static const char qwen2_re[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
                               "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
                               "|\\p{N}"
                               "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
                               "|[" WS "]*[\\r\\n]+"
                               "|[" WS "]+(?![^" WS "])"
                               "|[" WS "]+";

typedef struct {
    const char *key;
    unsigned len;
    int32_t id;
    UT_hash_handle hh;
} tok_ent_t;

typedef struct {
    uint64_t pair;
    int32_t rank, merged;
    UT_hash_handle hh;
} merge_ent_t;

typedef struct {
    size_t text_off, bytes_off;
    uint32_t text_len, bytes_len;
    int type;
} tok_info_t;

struct mdl_tok {
    int n;
    tok_info_t *info;
    char *text;     /* all token strings, back to back */
    uint8_t *bytes; /* their decoded bytes */
    tok_ent_t *ents, *map;
    merge_ent_t *merges, *merge_map;
    int32_t byte_id[256];
    int32_t *specials; /* ids, longest text first */
    int n_specials;
    uint8_t special_first[256];
    pcre2_code *re;
    int32_t eos, eot, im_start, im_end, endoftext;
};

int mdl_ids_push(mdl_ids_t *ids, int32_t id)
{
    if (ids->n == ids->cap) {
        int cap = ids->cap ? ids->cap * 2 : 64;
        int32_t *v = realloc(ids->v, sizeof(int32_t) * (size_t)cap);
        if (!v)
            return -1;
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return 0;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * other 68 to U+0100.. in byte order. */
static uint32_t byte_cp(int b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return (uint32_t)b;
    int n = 0;
    for (int i = 0; i < b; i++)
        if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255)))
            n++;
    return 256u + (uint32_t)n;
}

static int utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2; /* byte_cp() stays below U+0800 */
}

/* Decodes one UTF-8 character at s (n bytes left); returns its length, or
 * 0 for an invalid sequence. */
static int utf8_get(const uint8_t *s, size_t n, uint32_t *cp)
{
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    int len = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC2 ? 2 : 0;
    if (len == 0 || (size_t)len > n || s[0] > 0xF4)
        return 0;
    uint32_t c = s[0] & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        c = c << 6 | (s[i] & 0x3F);
    }
    if ((len == 3 && c < 0x800) || (len == 4 && (c < 0x10000 || c > 0x10FFFF)) ||
        (c >= 0xD800 && c <= 0xDFFF))
        return 0;
    *cp = c;
    return len;
}

static int32_t lookup(const mdl_tok_t *t, const char *s, size_t len)
{
    tok_ent_t *e = NULL;
    HASH_FIND(hh, t->map, s, (unsigned)len, e);
    return e ? e->id : -1;
}

int32_t mdl_tok_find(const mdl_tok_t *t, const char *text)
{
    return lookup(t, text, strlen(text));
}

static int cmp_special(const void *a, const void *b, void *ctx)
{
    const mdl_tok_t *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = t->info[x].text_len, ly = t->info[y].text_len;
    return lx != ly ? (lx > ly ? -1 : 1) : (x > y) - (x < y);
}

static int load_tokens(mdl_tok_t *t, const mdl_gguf_t *g, int n_vocab_model, char *err,
                       size_t errlen)
{
    const mdl_gguf_kv_t *toks, *types = NULL;
    if (mdl_gguf_get_arr(g, "tokenizer.ggml.tokens", MDL_GV_STRING, &toks) != MDL_GGUF_OK) {
        mdl_set_err(err, errlen, "tokenizer.ggml.tokens is missing or not a string array");
        return -1;
    }
    if (toks->arr_count == 0 || toks->arr_count > (uint64_t)n_vocab_model) {
        mdl_set_err(err, errlen, "tokenizer has %llu tokens for %d embedding rows",
                    (unsigned long long)toks->arr_count, n_vocab_model);
        return -1;
    }
    int rc = mdl_gguf_get_arr(g, "tokenizer.ggml.token_type", MDL_GV_I64, &types);
    if (rc == MDL_GGUF_BADTYPE || (rc == MDL_GGUF_OK && types->arr_count != toks->arr_count)) {
        mdl_set_err(err, errlen, "tokenizer.ggml.token_type does not match the tokens");
        return -1;
    }
    t->n = (int)toks->arr_count;
    t->info = calloc((size_t)t->n, sizeof(*t->info));
    /* the string record sizes bound the arenas: text <= data_len, and the
     * decoded bytes never exceed the text */
    t->text = malloc(toks->data_len + 1);
    t->bytes = malloc(toks->data_len + 1);
    t->ents = calloc((size_t)t->n, sizeof(*t->ents));
    if (!t->info || !t->text || !t->bytes || !t->ents) {
        mdl_set_err(err, errlen, "out of memory");
        return -1;
    }
    int16_t rev[512];
    for (int i = 0; i < 512; i++)
        rev[i] = -1;
    for (int b = 0; b < 256; b++)
        rev[byte_cp(b)] = (int16_t)b;
    uint64_t pos = 0;
    size_t to = 0, bo = 0;
    for (int i = 0; i < t->n; i++) {
        mdl_str_t s;
        if (mdl_gguf_arr_next_str(toks, &pos, &s) != 0) {
            mdl_set_err(err, errlen, "tokenizer.ggml.tokens is truncated");
            return -1;
        }
        tok_info_t *ti = &t->info[i];
        ti->type = types ? (int)mdl_gguf_arr_int(types, (uint64_t)i) : MDL_TOKT_NORMAL;
        ti->text_off = to;
        ti->text_len = (uint32_t)s.len;
        memcpy(t->text + to, s.ptr, s.len);
        to += s.len;
        ti->bytes_off = bo;
        /* normal (and byte) tokens are in the bytes_to_unicode alphabet;
         * user-defined ones are plain text */
        const uint8_t *p = (const uint8_t *)s.ptr;
        for (size_t k = 0; k < s.len;) {
            uint32_t cp;
            int l = utf8_get(p + k, s.len - k, &cp);
            if (l == 0) {
                t->bytes[bo++] = p[k++];
                continue;
            }
            if (ti->type != MDL_TOKT_USER && cp < 512 && rev[cp] >= 0)
                t->bytes[bo++] = (uint8_t)rev[cp];
            else {
                memcpy(t->bytes + bo, p + k, (size_t)l);
                bo += (size_t)l;
            }
            k += (size_t)l;
        }
        ti->bytes_len = (uint32_t)(bo - ti->bytes_off);
        tok_ent_t *e = &t->ents[i], *dup = NULL;
        e->key = t->text + ti->text_off;
        e->len = ti->text_len;
        e->id = i;
        HASH_FIND(hh, t->map, e->key, e->len, dup);
        if (!dup) /* duplicates: the first id wins, as in HF */
            HASH_ADD_KEYPTR(hh, t->map, e->key, e->len, e);
    }
    return 0;
}

static int load_merges(mdl_tok_t *t, const mdl_gguf_t *g, char *err, size_t errlen)
{
    const mdl_gguf_kv_t *mk;
    int rc = mdl_gguf_get_arr(g, "tokenizer.ggml.merges", MDL_GV_STRING, &mk);
    if (rc == MDL_GGUF_MISSING)
        return 0; /* a vocabulary without merges: bytes only */
    if (rc != MDL_GGUF_OK) {
        mdl_set_err(err, errlen, "tokenizer.ggml.merges is not a string array");
        return -1;
    }
    t->merges = calloc(mk->arr_count ? mk->arr_count : 1, sizeof(*t->merges));
    if (!t->merges) {
        mdl_set_err(err, errlen, "out of memory");
        return -1;
    }
    char *buf = malloc(1024);
    if (!buf) {
        mdl_set_err(err, errlen, "out of memory");
        return -1;
    }
    uint64_t pos = 0;
    mdl_str_t s;
    for (uint64_t r = 0; mdl_gguf_arr_next_str(mk, &pos, &s) == 0; r++) {
        const char *sp = memchr(s.ptr, ' ', s.len);
        if (!sp || s.len > 1000)
            continue; /* malformed rule: ignore it */
        size_t la = (size_t)(sp - s.ptr), lb = s.len - la - 1;
        int32_t a = lookup(t, s.ptr, la), b = lookup(t, sp + 1, lb);
        memcpy(buf, s.ptr, la);
        memcpy(buf + la, sp + 1, lb);
        int32_t m = lookup(t, buf, la + lb);
        if (a < 0 || b < 0 || m < 0)
            continue;
        merge_ent_t *e = &t->merges[r], *dup = NULL;
        e->pair = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
        e->rank = (int32_t)r;
        e->merged = m;
        HASH_FIND(hh, t->merge_map, &e->pair, sizeof(e->pair), dup);
        if (!dup)
            HASH_ADD(hh, t->merge_map, pair, sizeof(e->pair), e);
    }
    free(buf);
    return 0;
}

static int32_t special_id(const mdl_gguf_t *g, const mdl_tok_t *t, const char *key)
{
    int64_t v;
    if (mdl_gguf_get_int(g, key, &v) == MDL_GGUF_OK && v >= 0 && v < t->n)
        return (int32_t)v;
    return -1;
}

mdl_tok_t *mdl_tok_from_gguf(const mdl_gguf_t *g, int n_vocab_model, char *err, size_t errlen)
{
    mdl_tok_t *t = calloc(1, sizeof(*t));
    if (!t) {
        mdl_set_err(err, errlen, "out of memory");
        return NULL;
    }
    mdl_str_t model;
    if (mdl_gguf_get_str(g, "tokenizer.ggml.model", &model) != MDL_GGUF_OK ||
        !mdl_str_eq(model, "gpt2")) {
        mdl_set_err(err, errlen, "tokenizer.ggml.model must be \"gpt2\" (byte-level BPE)");
        goto fail;
    }
    if (load_tokens(t, g, n_vocab_model, err, errlen) != 0 || load_merges(t, g, err, errlen) != 0)
        goto fail;
    for (int b = 0; b < 256; b++) {
        char u[2];
        int l = utf8_put(byte_cp(b), u);
        t->byte_id[b] = lookup(t, u, (size_t)l);
    }
    t->specials = malloc(sizeof(int32_t) * (size_t)t->n);
    if (!t->specials) {
        mdl_set_err(err, errlen, "out of memory");
        goto fail;
    }
    for (int i = 0; i < t->n; i++) {
        int ty = t->info[i].type;
        if ((ty == MDL_TOKT_CONTROL || ty == MDL_TOKT_USER) && t->info[i].text_len > 0) {
            t->specials[t->n_specials++] = i;
            t->special_first[(uint8_t)t->text[t->info[i].text_off]] = 1;
        }
    }
    qsort_r(t->specials, (size_t)t->n_specials, sizeof(int32_t), cmp_special, t);
    t->eos = special_id(g, t, "tokenizer.ggml.eos_token_id");
    t->eot = special_id(g, t, "tokenizer.ggml.eot_token_id");
    t->im_start = mdl_tok_find(t, "<|im_start|>");
    t->im_end = mdl_tok_find(t, "<|im_end|>");
    t->endoftext = mdl_tok_find(t, "<|endoftext|>");
    int ecode;
    PCRE2_SIZE eoff;
    t->re = pcre2_compile((PCRE2_SPTR)qwen2_re, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ecode, &eoff, NULL);
    if (!t->re) {
        char msg[128];
        pcre2_get_error_message(ecode, (PCRE2_UCHAR *)msg, sizeof(msg));
        mdl_set_err(err, errlen, "pre-tokenizer regex: %s at %zu", msg, (size_t)eoff);
        goto fail;
    }
    (void)pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* interpreter if JIT is absent */
    return t;
fail:
    mdl_tok_free(t);
    return NULL;
}

void mdl_tok_free(mdl_tok_t *t)
{
    if (!t)
        return;
    HASH_CLEAR(hh, t->map);
    HASH_CLEAR(hh, t->merge_map);
    pcre2_code_free(t->re);
    free(t->info);
    free(t->text);
    free(t->bytes);
    free(t->ents);
    free(t->merges);
    free(t->specials);
    free(t);
}

int mdl_tok_n_tokens(const mdl_tok_t *t)
{
    return t->n;
}

int mdl_tok_type(const mdl_tok_t *t, int32_t id)
{
    return id >= 0 && id < t->n ? t->info[id].type : MDL_TOKT_UNUSED;
}

int32_t mdl_tok_im_start(const mdl_tok_t *t)
{
    return t->im_start;
}

int32_t mdl_tok_im_end(const mdl_tok_t *t)
{
    return t->im_end;
}

int mdl_tok_is_eog(const mdl_tok_t *t, int32_t id)
{
    return id >= 0 && (id == t->eos || id == t->eot || id == t->im_end || id == t->endoftext);
}

const uint8_t *mdl_tok_bytes(const mdl_tok_t *t, int32_t id, int render_special, size_t *len)
{
    *len = 0;
    if (id < 0 || id >= t->n)
        return (const uint8_t *)"";
    const tok_info_t *ti = &t->info[id];
    if ((ti->type == MDL_TOKT_CONTROL || ti->type == MDL_TOKT_UNUSED) && !render_special)
        return (const uint8_t *)"";
    if (ti->type == MDL_TOKT_CONTROL || ti->type == MDL_TOKT_UNUSED) {
        *len = ti->text_len;
        return (const uint8_t *)t->text + ti->text_off;
    }
    *len = ti->bytes_len;
    return t->bytes + ti->bytes_off;
}

/* ---- BPE ------------------------------------------------------------ */

typedef struct {
    int32_t rank, left;
} cand_t;

typedef struct {
    int32_t *id, *prev, *next;
    cand_t *heap;
    int n_heap, cap;
} bpe_scratch_t;

static int cand_less(cand_t a, cand_t b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.left < b.left);
}

static void heap_push(bpe_scratch_t *s, cand_t c)
{
    int i = s->n_heap++;
    s->heap[i] = c;
    while (i > 0 && cand_less(s->heap[i], s->heap[(i - 1) / 2])) {
        cand_t tmp = s->heap[i];
        s->heap[i] = s->heap[(i - 1) / 2];
        s->heap[(i - 1) / 2] = tmp;
        i = (i - 1) / 2;
    }
}

static cand_t heap_pop(bpe_scratch_t *s)
{
    cand_t top = s->heap[0];
    s->heap[0] = s->heap[--s->n_heap];
    for (int i = 0;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < s->n_heap && cand_less(s->heap[l], s->heap[m]))
            m = l;
        if (r < s->n_heap && cand_less(s->heap[r], s->heap[m]))
            m = r;
        if (m == i)
            break;
        cand_t tmp = s->heap[i];
        s->heap[i] = s->heap[m];
        s->heap[m] = tmp;
        i = m;
    }
    return top;
}

static const merge_ent_t *find_merge(const mdl_tok_t *t, int32_t a, int32_t b)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    merge_ent_t *e = NULL;
    HASH_FIND(hh, t->merge_map, &key, sizeof(key), e);
    return e;
}

static void try_pair(const mdl_tok_t *t, bpe_scratch_t *s, int left)
{
    int right = s->next[left];
    if (right < 0)
        return;
    const merge_ent_t *m = find_merge(t, s->id[left], s->id[right]);
    if (m)
        heap_push(s, (cand_t){m->rank, left});
}

static int bpe_piece(const mdl_tok_t *t, const uint8_t *p, size_t n, bpe_scratch_t *s,
                     mdl_ids_t *out)
{
    if (n > (size_t)s->cap) {
        size_t cap = n * 2;
        if (cap > INT32_MAX / 4)
            return -1;
        int32_t *id = realloc(s->id, sizeof(int32_t) * cap);
        if (id)
            s->id = id;
        int32_t *pv = realloc(s->prev, sizeof(int32_t) * cap);
        if (pv)
            s->prev = pv;
        int32_t *nx = realloc(s->next, sizeof(int32_t) * cap);
        if (nx)
            s->next = nx;
        /* every merge pushes at most two candidates: n + 2n */
        cand_t *h = realloc(s->heap, sizeof(cand_t) * cap * 3);
        if (h)
            s->heap = h;
        if (!id || !pv || !nx || !h)
            return -1;
        s->cap = (int)cap;
    }
    for (size_t i = 0; i < n; i++) {
        s->id[i] = t->byte_id[p[i]];
        if (s->id[i] < 0)
            return -1;
        s->prev[i] = (int32_t)i - 1;
        s->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    s->n_heap = 0;
    for (size_t i = 0; i + 1 < n; i++)
        try_pair(t, s, (int)i);
    while (s->n_heap > 0) {
        cand_t c = heap_pop(s);
        int l = c.left, r = s->next[l];
        if (s->id[l] < 0 || r < 0)
            continue;
        const merge_ent_t *m = find_merge(t, s->id[l], s->id[r]);
        if (!m || m->rank != c.rank)
            continue; /* stale: one side changed since it was queued */
        s->id[l] = m->merged;
        s->id[r] = -1;
        s->next[l] = s->next[r];
        if (s->next[r] >= 0)
            s->prev[s->next[r]] = l;
        if (s->prev[l] >= 0)
            try_pair(t, s, s->prev[l]);
        try_pair(t, s, l);
    }
    for (int i = 0; i >= 0; i = s->next[i])
        if (mdl_ids_push(out, s->id[i]) != 0)
            return -1;
    return 0;
}

static int encode_text(const mdl_tok_t *t, const char *text, size_t len, bpe_scratch_t *s,
                       pcre2_match_data *md, mdl_ids_t *out)
{
    size_t off = 0;
    const uint8_t *u = (const uint8_t *)text;
    while (off < len) {
        int rc = pcre2_match(t->re, (PCRE2_SPTR)text, len, off, 0, md, NULL);
        size_t m0 = len, m1 = len;
        if (rc > 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            m0 = ov[0];
            m1 = ov[1];
        } else if (rc != PCRE2_ERROR_NOMATCH) {
            return -1;
        }
        /* bytes no alternative matched (only invalid UTF-8 can do that)
         * are a piece of their own */
        if (m0 > off && bpe_piece(t, u + off, m0 - off, s, out) != 0)
            return -1;
        if (m1 > m0 && bpe_piece(t, u + m0, m1 - m0, s, out) != 0)
            return -1;
        off = m1 > m0 ? m1 : m0 + 1;
        if (rc <= 0)
            break;
    }
    return 0;
}

/* Finds the first special token at or after pos; returns its start or len
 * when there is none. */
static size_t next_special(const mdl_tok_t *t, const char *text, size_t len, size_t pos,
                           int32_t *id)
{
    for (size_t i = pos; i < len; i++) {
        if (!t->special_first[(uint8_t)text[i]])
            continue;
        for (int k = 0; k < t->n_specials; k++) {
            const tok_info_t *ti = &t->info[t->specials[k]];
            if (ti->text_len <= len - i &&
                memcmp(text + i, t->text + ti->text_off, ti->text_len) == 0) {
                *id = t->specials[k];
                return i;
            }
        }
    }
    return len;
}

/* NFC, as Qwen's tokenizer.json declares (its normalizer runs before the
 * pre-tokenizer, on the text between special tokens). ASCII is already
 * NFC; text that is not valid UTF-8 is left as it is (the byte-level BPE
 * encodes any bytes). 0 and *out NULL when the text needs no change. */
static int nfc(const char *text, size_t len, uint8_t **out, size_t *out_len)
{
    *out = NULL;
    size_t i = 0;
    while (i < len && (uint8_t)text[i] < 0x80)
        i++;
    if (i == len)
        return 0;
    size_t n = 0;
    uint8_t *r = u8_normalize(UNINORM_NFC, (const uint8_t *)text, len, NULL, &n);
    if (!r)
        return errno == ENOMEM ? -1 : 0;
    if (n == len && memcmp(r, text, len) == 0) {
        free(r);
        return 0;
    }
    *out = r;
    *out_len = n;
    return 0;
}

static int encode_nfc(const mdl_tok_t *t, const char *text, size_t len, bpe_scratch_t *s,
                      pcre2_match_data *md, mdl_ids_t *out)
{
    uint8_t *norm;
    size_t nlen = 0;
    if (nfc(text, len, &norm, &nlen) != 0)
        return -1;
    int rc = norm ? encode_text(t, (const char *)norm, nlen, s, md, out)
                  : encode_text(t, text, len, s, md, out);
    free(norm);
    return rc;
}

int mdl_tok_encode(const mdl_tok_t *t, const char *text, size_t len, int allow_special,
                   mdl_ids_t *out)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re, NULL);
    bpe_scratch_t s = {0};
    int rc = md ? 0 : -1;
    size_t pos = 0;
    while (rc == 0 && pos < len) {
        int32_t sid = -1;
        size_t at = allow_special && t->n_specials ? next_special(t, text, len, pos, &sid) : len;
        if (at > pos && encode_nfc(t, text + pos, at - pos, &s, md, out) != 0)
            rc = -1;
        if (rc == 0 && sid >= 0) {
            if (mdl_ids_push(out, sid) != 0)
                rc = -1;
            at += t->info[sid].text_len;
        }
        pos = at;
    }
    pcre2_match_data_free(md);
    free(s.id);
    free(s.prev);
    free(s.next);
    free(s.heap);
    return rc;
}
