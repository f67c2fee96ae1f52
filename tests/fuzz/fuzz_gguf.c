/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader and what is built on
 * it: any input either fails to open with an error message or opens and
 * then survives every accessor (all keys by index and by name, every array
 * walked, every tensor's first and last data byte touched); the tokenizer
 * built from it encodes and decodes a fixed text; and a model the loader
 * accepts evaluates two tokens.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf_internal.h"
#include "model/qwen2_internal.h"
#include "model/tok_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

static void walk_kv(const mdl_gguf_t *g, const mdl_gguf_kv_t *kv)
{
    char key[128];
    size_t n = kv->key.len < sizeof(key) - 1 ? kv->key.len : sizeof(key) - 1;
    memcpy(key, kv->key.ptr, n);
    key[n] = '\0';
    int64_t i;
    double d;
    mdl_str_t s;
    const mdl_gguf_kv_t *arr;
    sink += (uint64_t)mdl_gguf_get_int(g, key, &i);
    sink += (uint64_t)mdl_gguf_get_float(g, key, &d);
    sink += (uint64_t)mdl_gguf_get_str(g, key, &s);
    if (mdl_gguf_get_arr(g, key, MDL_GV_STRING, &arr) == MDL_GGUF_OK) {
        uint64_t pos = 0, count = 0;
        while (mdl_gguf_arr_next_str(arr, &pos, &s) == 0) {
            if (s.len)
                sink += (uint8_t)s.ptr[s.len - 1];
            count++;
        }
        if (count != arr->arr_count)
            abort();
    }
    if (mdl_gguf_get_arr(g, key, MDL_GV_I64, &arr) == MDL_GGUF_OK)
        for (uint64_t k = 0; k < arr->arr_count && k < 4096; k++)
            sink += (uint64_t)mdl_gguf_arr_int(arr, k);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256] = "";
    mdl_gguf_t *g = mdl_gguf_open_mem(data, size, err, sizeof(err));
    if (!g) {
        if (err[0] == '\0')
            abort(); /* every failure must say why */
        return 0;
    }
    for (size_t i = 0; i < mdl_gguf_kv_count(g); i++)
        walk_kv(g, mdl_gguf_kv_at(g, i));
    for (size_t i = 0; i < mdl_gguf_tensor_count(g); i++) {
        const mdl_gguf_tensor_t *t = mdl_gguf_tensor_at(g, i);
        if (t->nbytes) {
            sink += t->data[0];
            sink += t->data[t->nbytes - 1];
        }
        char name[MDL_GGUF_MAX_NAME + 1];
        memcpy(name, t->name.ptr, t->name.len);
        name[t->name.len] = '\0';
        if (!memchr(name, '\0', t->name.len) && mdl_gguf_tensor_find(g, name) != t)
            abort();
    }
    mdl_gguf_free(g);
    /* the layers above, on a second handle (the model takes ownership) */
    g = mdl_gguf_open_mem(data, size, err, sizeof(err));
    if (!g)
        abort(); /* opened once, must open again */
    mdl_tok_t *tok = mdl_tok_from_gguf(g, 1 << 20, err, sizeof(err));
    if (tok) {
        static const char text[] =
            "Hello <|im_end|> world's 123 \xe6\x97\xa5\xe6\x9c\xac \xff\xfe  \n";
        mdl_ids_t ids = {0};
        if (mdl_tok_encode(tok, text, sizeof(text) - 1, 1, &ids) == 0)
            for (int i = 0; i < ids.n; i++) {
                size_t len;
                const uint8_t *b = mdl_tok_bytes(tok, ids.v[i], 1, &len);
                if (len)
                    sink += b[len - 1];
            }
        free(ids.v);
        mdl_tok_free(tok);
    }
    mdl_model_t *m = mdl_model_from_gguf(g, err, sizeof(err));
    if (m) {
        mdl_state_opts_t so = {.n_ctx = 4, .batch = 2};
        mdl_state_t *st = mdl_state_new(m, &so, NULL, err, sizeof(err));
        float *logits = malloc(sizeof(float) * (size_t)m->n_vocab);
        int32_t toks[2] = {0, m->n_vocab - 1};
        if (st && logits && mdl_state_eval(st, toks, 2, logits, 0) != 0)
            abort(); /* valid ids in a fresh state must evaluate */
        free(logits);
        mdl_state_free(st);
        mdl_model_free(m);
    }
    return 0;
}
