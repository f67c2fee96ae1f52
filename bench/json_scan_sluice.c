/*
 * json_scan_sluice.c — sluice's own body scan (gateway/body_scan.c:
 * gw_body_scan, with GW_SCAN_MSGS as the "full" conf runs it) over a file
 * N times, linked against build/libsluice.a: the whole of what a JSON
 * reader change would replace (the byte pass, yajl, the callbacks, the
 * checks yajl does not make), beside bench/json_parse.c's bare readers.
 * bench/json_parse.sh runs it when build/libsluice.a exists. `check`: what
 * sluice takes of json_parse_simdjson's check inputs (the scan, or jansson
 * with json_intake.c's flags when the scan sends a body to the slow path).
 *
 *   json_scan_sluice FILE N [whole|parse]    whole: no skeleton
 *       (GW_SCAN_NO_SKEL); parse: no kept shape (GW_SCAN_NO_SHAPE), yajl
 *       reads every scan (without it the same body hits the thread's shape
 *       from the second scan on)
 *   json_scan_sluice check
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gateway/body_scan.h"

/* bench/json_parse_simdjson.cc's check() inputs, in its order. */
static int check(void)
{
    static const char *const in[] = {
        "{\"model\":\"m\",\"x\":[1,,2],\"messages\":[]}",
        "{\"model\":\"m\",\"x\":tru,\"messages\":[]}",
        "{\"model\":\"m\",\"x\":01,\"messages\":[]}",
        "{\"model\":\"m\",\"x\":1.e5,\"messages\":[]}",
        "{\"model\":\"m\",\"x\":{\"a\" \"b\"},\"messages\":[]}",
        "{\"model\":\"m\",\"x\":\"\\q\",\"messages\":[]}",
        "{\"model\":\"m\",\"x\":\"\\ud800\",\"messages\":[]}",
        "{\"model\":\"m\",\"x\":\"\xc3\x28\",\"messages\":[]}",
        "{\"model\":\"m\",\"x\":\"\xed\xa0\x80\",\"messages\":[]}",
        "{\"model\":\"m\",\"x\":[1,2}],\"messages\":[]}",
        "{\"model\":\"m\",\"messages\":[]} {}",
        "{\"model\":\"m\",\"messages\":[]}}",
        "{\"model\":\"m\",\"model\":\"n\",\"messages\":[]}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\",\"x\":nul}]}",
        "{\"model\":\"m\",\"x\":18446744073709551616,\"messages\":[]}",
        "{\"model\":\"m\",\"x\":\"a\\u0000b\",\"messages\":[]}",
        "{\"model\":\"m\",\"x\":\"\\ud83d\\ude00\",\"messages\":[]}",
    };
    gw_body_scan_t *s = gw_body_scan_new();
    if (!s)
        return 1;
    printf("sluice today, in check's order:");
    for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++) {
        size_t n = strlen(in[i]);
        gw_scan_rc_t rc = gw_body_scan(s, in[i], n, GW_SCAN_MSGS);
        const char *v = "taken";
        if (rc == GW_SCAN_SLOW) {
            json_t *j = json_loadb(
                in[i], n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, NULL);
            v = j ? "taken (jansson)" : "refused";
            json_decref(j);
        } else if (rc != GW_SCAN_OK) {
            v = "error";
        }
        printf("%s %s", i ? "," : "", v);
    }
    printf("\n");
    gw_body_scan_free(s);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "check") == 0)
        return check();
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
    if (argc > 3 && strcmp(argv[3], "parse") == 0)
        flags |= GW_SCAN_NO_SHAPE;
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
