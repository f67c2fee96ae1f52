/*
 * json_scan_sluice.c — sluice's own body scan (gateway/body_scan.c:
 * gw_body_scan, with GW_SCAN_MSGS as the "full" conf runs it) over a file
 * N times, linked against build/libsluice.a: the whole of what a JSON
 * reader change would replace (the byte pass, yajl, the callbacks, the
 * checks yajl does not make), beside bench/json_parse.c's bare readers.
 * bench/json_parse.sh runs it when build/libsluice.a exists.
 *
 *   json_scan_sluice FILE N [whole]    whole: no skeleton (GW_SCAN_NO_SKEL)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/body_scan.h"

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    FILE *f = fopen(argv[1], "rb");
    if (!f)
        return 2;
    static char body[1 << 20];
    size_t len = fread(body, 1, sizeof(body), f);
    fclose(f);
    long n = atol(argv[2]);
    unsigned flags = GW_SCAN_MSGS;
    if (argc > 3 && strcmp(argv[3], "whole") == 0)
        flags |= GW_SCAN_NO_SKEL;
    gw_body_scan_t *s = gw_body_scan_new();
    if (!s)
        return 1;
    size_t msgs = 0;
    for (long i = 0; i < n; i++) {
        if (gw_body_scan(s, body, len, flags) != GW_SCAN_OK) {
            fprintf(stderr, "scan failed\n");
            return 1;
        }
        msgs += s->chat.nmsgs;
    }
    printf("msgs %zu elided %zu\n", msgs, s->elided);
    gw_body_scan_free(s);
    return 0;
}
