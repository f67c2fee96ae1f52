/*
 * scan_bench.c — the request-body scanner (gateway/body_scan.c) alone on
 * bench/realistic.sh's bodies (the realistic request with a user message
 * that long), as CPU time of this thread per KiB: yajl over the skeleton
 * (the default) or over the whole body (`whole`: GW_SCAN_NO_SKEL, the path
 * before the skeleton). Under `valgrind --tool=callgrind` its instruction
 * counts are the firm figure on a shared machine.
 *
 * `esc` after the mode: a "\n" escape every 1,000 bytes of the message (a
 * prompt's paragraphs: its text is then decoded, not borrowed).
 *
 * KiB 0: realistic.lua's own ~210-byte request (issue #16's plain/full
 * figures), per scan; under callgrind, divide by the iterations.
 *
 *   build/tools/scan_bench [KiB, default 1024] [iterations, default 200] [skel|whole] [esc]
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gateway/body_scan.h"

static int64_t sb_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    size_t kib = argc > 1 ? strtoul(argv[1], NULL, 10) : 1024;
    long iters = argc > 2 ? strtol(argv[2], NULL, 10) : 200;
    unsigned flags = GW_SCAN_MSGS;
    if (argc > 3 && strcmp(argv[3], "whole") == 0)
        flags |= GW_SCAN_NO_SKEL;
    bool esc = argc > 4 && strcmp(argv[4], "esc") == 0;
    static const char head[] =
        "{\"model\":\"chat-model\",\"max_tokens\":64,\"messages\":[{\"role\":"
        "\"system\",\"content\":\"You are a helpful assistant.\"},{\"role\":"
        "\"user\",\"content\":\"";
    static const char tail[] = "\"}]}";
    static const char line[] = "Write one sentence about the sea, please, in plain English. ";
    static const char req[] =
        "{\"model\":\"chat-model\",\"messages\":[{\"role\":\"system\",\"content\":\"You are a "
        "helpful assistant.\"},{\"role\":\"user\",\"content\":\"Write one sentence about the sea, "
        "please, in plain English.\"}],\"max_tokens\":64}";
    size_t n = kib ? kib * 1024 : sizeof(req) - 1;
    if (kib == 0) {
        gw_body_scan_t *s = gw_body_scan_new();
        if (!s)
            return 1;
        int64_t t0 = sb_cpu_ns();
        for (long i = 0; i < iters; i++) {
            if (gw_body_scan(s, req, n, flags) != GW_SCAN_OK || s->chat.nmsgs != 2 ||
                gw_body_fact(s, GW_F_MAX_TOKENS)->i != 64) {
                fprintf(stderr, "scan failed\n");
                return 1;
            }
        }
        int64_t t1 = sb_cpu_ns();
        printf("%zu-byte request: %.3f us per scan\n", n, (double)(t1 - t0) / 1e3 / (double)iters);
        gw_body_scan_free(s);
        return 0;
    }
    if (iters < 1 || n < sizeof(head) + sizeof(tail)) {
        fprintf(stderr, "usage: scan_bench [KiB >= 1] [iterations] [skel|whole]\n");
        return 2;
    }
    char *b = malloc(n + 1);
    if (!b)
        return 1;
    size_t at = 0;
    memcpy(b, head, sizeof(head) - 1);
    at = sizeof(head) - 1;
    for (size_t i = 0; at < n - (sizeof(tail) - 1); i++) {
        if (esc && i % 1000 == 999 && at + 2 < n - (sizeof(tail) - 1)) {
            b[at++] = '\\';
            b[at++] = 'n';
            continue;
        }
        b[at++] = line[i % (sizeof(line) - 1)];
    }
    memcpy(b + at, tail, sizeof(tail) - 1);
    b[n] = '\0';
    gw_body_scan_t *s = gw_body_scan_new();
    if (!s)
        return 1;
    int64_t t0 = sb_cpu_ns();
    for (long i = 0; i < iters; i++) {
        if (gw_body_scan(s, b, n, flags) != GW_SCAN_OK || s->chat.nmsgs != 2) {
            fprintf(stderr, "scan failed\n");
            return 1;
        }
    }
    int64_t t1 = sb_cpu_ns();
    double us = (double)(t1 - t0) / 1e3 / (double)iters;
    printf("%zu KiB%s, %s: %.2f us per scan, %.4f us/KiB, %zu bytes not read by yajl\n", kib,
           esc ? " (escapes)" : "", flags & GW_SCAN_NO_SKEL ? "whole" : "skel", us,
           us / (double)kib, s->elided);
    gw_body_scan_free(s);
    free(b);
    return 0;
}
