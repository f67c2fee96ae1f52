/*
 * json_ffi.c — a tiny C program that reads an answer's usage object N times,
 * built twice by bench/json_ffi.sh: with yajl (as llm_metrics.c) and with
 * simdjson through bench/json_ffi_shim.cc (libsimdjson + libstdc++ linked
 * into a C binary); NO_PARSE: libc only. What they cost besides the parse: binary size, shared
 * objects mapped, start-up instructions, resident memory.
 *
 *   json_ffi N
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] = "{\"prompt_tokens\":25,\"completion_tokens\":12,\"total_tokens\":37}";

#if defined(NO_PARSE)
static int read_usage(char *pad, size_t cap, long long *pt, long long *ct)
{
    (void)cap;
    memcpy(pad, usage, sizeof(usage));
    *pt = pad[1];
    *ct = pad[2];
    return 0;
}
#elif defined(USE_SIMDJSON)
size_t sj_padding(void);
int sj_usage_read(const char *buf, size_t len, size_t cap, long long *pt, long long *ct);

static int read_usage(char *pad, size_t cap, long long *pt, long long *ct)
{
    size_t n = sizeof(usage) - 1;
    memcpy(pad, usage, n); /* the padding copy sluice would make */
    return sj_usage_read(pad, n, cap, pt, ct);
}
#else
#include <yajl/yajl_tree.h>

static int read_usage(char *pad, size_t cap, long long *pt, long long *ct)
{
    (void)cap;
    memcpy(pad, usage, sizeof(usage)); /* the same copy, for a fair count */
    yajl_val t = yajl_tree_parse(pad, NULL, 0);
    if (!t)
        return -1;
    const char *p[] = {"prompt_tokens", NULL}, *c[] = {"completion_tokens", NULL};
    yajl_val a = yajl_tree_get(t, p, yajl_t_number), b = yajl_tree_get(t, c, yajl_t_number);
    int rc = a && b && YAJL_IS_INTEGER(a) && YAJL_IS_INTEGER(b) ? 0 : -1;
    if (rc == 0) {
        *pt = YAJL_GET_INTEGER(a);
        *ct = YAJL_GET_INTEGER(b);
    }
    yajl_tree_free(t);
    return rc;
}
#endif

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 0;
#ifdef USE_SIMDJSON
    size_t cap = sizeof(usage) + sj_padding();
#else
    size_t cap = sizeof(usage);
#endif
    char *pad = malloc(cap);
    if (!pad)
        return 1;
    long long pt = 0, ct = 0, sum = 0;
    for (long i = 0; i < n; i++) {
        if (read_usage(pad, cap, &pt, &ct) != 0)
            return 1;
        sum += pt + ct;
    }
    free(pad);
    printf("%lld\n", sum);
    return 0;
}
