/*
 * llm_shape_bench.c — llm_metrics.c's reads of the upstream's bytes alone,
 * through the kept shapes or not, for bench/llm_shape.sh to count under
 * callgrind (instructions per read: two runs of different lengths, the
 * difference divided by the difference of iterations).
 *
 *   build/tools/llm_shape_bench ITERATIONS MODE [FILE]
 *   MODE: scan | kept        the bench upstream's content chunk (one shape)
 *         scan-miss | kept-miss  a content with a surrogate escape and a
 *                            new number each event (every event a miss)
 *         yajl | kept-usage  issue #16's usage object (one shape)
 *         yajl-rot | kept-rot  three usage shapes in turn (2 are kept)
 *   FILE (yajl, kept-usage): the usage object read from it instead
 *   (bench/json_parse.sh's yajl-usage row).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/gw_llm.h"

static const char lsb_event[] =
    "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\","
    "\"created\":1700000000,\"model\":\"bench-model\",\"choices\":[{\"index\":0,"
    "\"delta\":{\"content\":\"tok \"},\"finish_reason\":null}]}\n\n";

static const char *const lsb_usage[] = {
    "{\"prompt_tokens\":31,\"completion_tokens\":9,\"total_tokens\":40}}",
    "{\"prompt_tokens\":31,\"total_tokens\":40,\"completion_tokens\":9}}",
    "{\"completion_tokens\":9,\"prompt_tokens\":31,\"total_tokens\":40}}"};

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: llm_shape_bench ITERATIONS MODE [FILE]\n");
        return 2;
    }
    static char file[4096];
    size_t flen = 0;
    if (argc == 4) {
        FILE *f = fopen(argv[3], "rb");
        if (!f)
            return 2;
        flen = fread(file, 1, sizeof(file) - 1, f);
        fclose(f);
    }
    long n = atol(argv[1]), k = 0;
    const char *m = argv[2];
    bool kept = strncmp(m, "kept", 4) == 0, c;
    char buf[512];
    for (long i = 0; i < n; i++) {
        if (strcmp(m, "scan") == 0 || strcmp(m, "kept") == 0) {
            k += kept ? gw_llm_event_keys(lsb_event, sizeof(lsb_event) - 1, &c)
                      : gw_llm_scan_keys(lsb_event, sizeof(lsb_event) - 1, &c);
            k += c;
        } else if (strcmp(m, "scan-miss") == 0 || strcmp(m, "kept-miss") == 0) {
            int l = snprintf(buf, sizeof(buf),
                             "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion."
                             "chunk\",\"created\":1700000000,\"model\":\"bench-model\","
                             "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok"
                             "\\ud83d\\ude00%ld\"},\"finish_reason\":null}]}\n\n",
                             i);
            k +=
                kept ? gw_llm_event_keys(buf, (size_t)l, &c) : gw_llm_scan_keys(buf, (size_t)l, &c);
            k += c;
        } else {
            const char *u = flen ? file : strstr(m, "rot") ? lsb_usage[i % 3] : lsb_usage[0];
            gw_llm_uread_t r;
            gw_llm_usage_read(u, flen ? flen : strlen(u), kept, &r);
            if (!r.closed)
                return 1;
            k += r.pv;
        }
    }
    printf("%ld\n", k);
    return 0;
}
