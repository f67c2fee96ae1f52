/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader: any input either fails
 * to open with an error message or opens and then survives every accessor
 * (all keys by index and by name, every array walked, every tensor's first
 * and last data byte touched).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf_internal.h"

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
    return 0;
}
