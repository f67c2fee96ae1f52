/*
 * json_parse.c — instructions one parse of issue #16's request body costs
 * in each JSON reader Debian has for C (bench/json_parse.sh counts them with
 * callgrind): yajl as gateway/body_scan.c drives it (one kept handle, a
 * stream of values, string validation off, callbacks that do nothing),
 * jansson as gateway/json_intake.c (a tree, duplicates rejected), and, when
 * Debian's libjsmn-dev is installed, jsmn (a tokenizer: strict, parent
 * links, no validation of numbers, literals or separators). The usage
 * object's row (yajl-usage) is gateway/llm_metrics.c's own read, run by
 * build/tools/llm_shape_bench.
 *
 *   json_parse MODE N [FILE]    MODE: yajl | jansson | jsmn;
 *                               N parses of FILE (default: #16's body)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <yajl/yajl_parse.h>

#ifdef HAVE_JSMN
#define JSMN_STATIC
#define JSMN_STRICT
#define JSMN_PARENT_LINKS
#include <jsmn.h>
#endif

static const char body[] =
    "{\"model\":\"chat-model\",\"messages\":[{\"role\":\"system\",\"content\":\"You are a "
    "helpful assistant.\"},{\"role\":\"user\",\"content\":\"Write one sentence about the sea, "
    "please, in plain English.\"}],\"max_tokens\":64}";

static unsigned long events;

static int on_plain(void *c)
{
    (void)c;
    events++;
    return 1;
}
static int on_bool(void *c, int b)
{
    (void)b;
    return on_plain(c);
}
static int on_text(void *c, const char *s, size_t n)
{
    (void)s;
    (void)n;
    return on_plain(c);
}
static int on_ustr(void *c, const unsigned char *s, size_t n)
{
    (void)s;
    (void)n;
    return on_plain(c);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *b = NULL;
    size_t n = 0, cap = 0, got;
    do {
        if (cap - n < 65536) {
            char *nb = realloc(b, cap + 65536);
            if (!nb) {
                free(b);
                fclose(f);
                return NULL;
            }
            b = nb;
            cap += 65536;
        }
        got = fread(b + n, 1, cap - n, f);
        n += got;
    } while (got > 0);
    fclose(f);
    *len = n;
    return b;
}

static const yajl_callbacks cbs = {
    .yajl_null = on_plain,
    .yajl_boolean = on_bool,
    .yajl_number = on_text,
    .yajl_string = on_ustr,
    .yajl_start_map = on_plain,
    .yajl_map_key = on_ustr,
    .yajl_end_map = on_plain,
    .yajl_start_array = on_plain,
    .yajl_end_array = on_plain,
};

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4)
        return 2;
    const char *mode = argv[1];
    long n = atol(argv[2]);
    size_t len = sizeof(body) - 1;
    const char *in = body;
    char *file = NULL;
    if (argc == 4) {
        file = slurp(argv[3], &len);
        if (!file)
            return 2;
        in = file;
    }
    yajl_handle h = yajl_alloc(&cbs, NULL, NULL);
    yajl_config(h, yajl_allow_multiple_values, 1);
    yajl_config(h, yajl_dont_validate_strings, 1);
    for (long i = 0; i < n; i++) {
        if (strcmp(mode, "yajl") == 0) {
            if (yajl_parse(h, (const unsigned char *)in, len) != yajl_status_ok)
                return 1;
        } else if (strcmp(mode, "jansson") == 0) {
            json_error_t err;
            json_t *j = json_loadb(in, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
            if (!j)
                return 1;
            events += json_object_size(j);
            json_decref(j);
#ifdef HAVE_JSMN
        } else if (strcmp(mode, "jsmn") == 0) {
            static jsmntok_t toks[8192];
            jsmn_parser p;
            jsmn_init(&p);
            int r = jsmn_parse(&p, in, len, toks, 8192);
            if (r < 0)
                return 1;
            events += (unsigned long)r;
#endif
        } else {
            return 2;
        }
    }
    yajl_free(h);
    free(file);
    printf("%s %lu\n", mode, events);
    return 0;
}
