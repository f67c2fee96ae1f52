/*
 * main.c — the command line. Kept thin: everything it runs lives in the
 * library (server.c and the modules' own entry points).
 *
 *   sluice [-c FILE]          run (default /etc/sluice/sluice.yaml)
 *   sluice -t -c FILE         check FILE (and the TLS files, env vars and
 *                             names it refers to) and exit 0 or 1
 *   sluice --conf-reference   print the reference of every conf key
 *   sluice token|sign ...     auth tools (auth/auth.h)
 *   sluice model ...          the local model engine's tools (model/model.h)
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth/auth.h"
#include "common/log.h"
#include "common/version.h"
#include "gateway/gw_metrics.h"
#include "gateway/gw_route.h"
#include "gateway/gw_rt.h"
#include "gateway/gw_server.h"
#include "gateway/gw_types.h"
#include "model/model.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: sluice [-t] [-c FILE]\n"
               "       sluice token --sub USER [--ttl 15m] -c FILE\n"
               "       sluice sign --key K --method M --path P --body FILE\n"
               "       sluice model info FILE | model generate --model FILE --prompt TEXT\n"
               "       sluice --conf-reference\n"
               "       sluice --version\n"
               "  -c FILE   configuration file (YAML), default " CONF_DEFAULT_PATH "\n"
               "  -t        check the configuration and exit (0 ok, 1 not)\n");
}

static int sluice_check(const char *path)
{
    char err[8192], where[1200];
    size_t nerr = 0;
    gw_metrics_init(gw_route_name);
    conf_t *c = conf_load_all(path, err, sizeof(err), &nerr);
    if (!c) {
        for (char *line = strtok(err, "\n"); line; line = strtok(NULL, "\n"))
            fprintf(stderr, "sluice: %s\n", line);
        fprintf(stderr, "sluice: configuration %s test failed (%zu error%s)\n", path, nerr,
                nerr == 1 ? "" : "s");
        return 1;
    }
    gw_shared_t *shared = gw_shared_new();
    gw_rt_t *rt = shared ? gw_rt_new(c, shared, err, sizeof(err)) : NULL;
    if (!rt) {
        conf_locate(path, err, where, sizeof(where));
        fprintf(stderr, "sluice: %s\n", where);
        fprintf(stderr, "sluice: configuration %s test failed\n", path);
        return 1;
    }
    gw_rt_unref(rt);
    gw_shared_free(shared);
    fprintf(stderr, "sluice: configuration %s is ok\n", path);
    return 0;
}

int main(int argc, char **argv)
{
    /* Tools: sluice token|sign|model ... (their own flags). */
    if (argc >= 2 && (strcmp(argv[1], "token") == 0 || strcmp(argv[1], "sign") == 0))
        return auth_cli_main(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "model") == 0)
        return mdl_cli_main(argc - 1, argv + 1);
    static const struct option longopts[] = {
        {"conf-reference", no_argument, NULL, 'R'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *conf = CONF_DEFAULT_PATH;
    bool test = false;
    int opt;
    while ((opt = getopt_long(argc, argv, "c:thV", longopts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            conf = optarg;
            break;
        case 't':
            test = true;
            break;
        case 'R':
            conf_reference_print(stdout);
            return 0;
        case 'V':
            return sl_version_print(stdout) == 0 ? 0 : 1; /* common/version.c */
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc) {
        usage(stderr);
        return 2;
    }
    if (test)
        return sluice_check(conf);
    return gw_server_run(conf);
}
