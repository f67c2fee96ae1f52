/*
 * auth_cli.c — the operator and app-developer tools behind
 *
 *   sluice token --sub alice [--ttl 15m] [--json] -c CONF
 *       mints a token with the conf's HS256 key and prints it with its
 *       signing key (the same thing POST /v1/auth/token returns);
 *   sluice sign --key K --method POST --path /v1/chat/completions
 *               [--body FILE|-] [--timestamp T] [--nonce N]
 *       prints the three X-Sluice-* headers for that request.
 *
 * gateway/main.c hands over argv with argv[0] the subcommand. These read
 * the real clock and the OS random source; everything they compute goes
 * through the same functions the request path checks with.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/rand.h>

#include "auth/auth_internal.h"
#include "common/log.h"

#define CLI_BODY_MAX (64 << 20)

static int usage_token(void)
{
    fprintf(stderr, "usage: sluice token --sub USER [--ttl 15m] [--json] -c CONF\n"
                    "  mints a token with the conf's HS256 key (auth.tokens.keys) and prints\n"
                    "  it with its signing key; secrets come from the environment variables\n"
                    "  the conf names.\n");
    return 2;
}

static int usage_sign(void)
{
    fprintf(stderr,
            "usage: sluice sign --key SIGNING_KEY --method METHOD --path PATH\n"
            "                   [--body FILE|-] [--timestamp UNIX_S] [--nonce NONCE]\n"
            "  prints X-Sluice-Timestamp, X-Sluice-Nonce and X-Sluice-Signature for the\n"
            "  request (PATH with its query string, exactly as sent; no --body = empty).\n");
    return 2;
}

static int cli_token(int argc, char **argv)
{
    static const struct option opts[] = {
        {"sub", required_argument, NULL, 's'},  {"ttl", required_argument, NULL, 't'},
        {"conf", required_argument, NULL, 'c'}, {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},       {NULL, 0, NULL, 0},
    };
    const char *sub = NULL, *ttl = NULL, *conf_path = NULL;
    bool json = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "s:t:c:jh", opts, NULL)) != -1) {
        switch (c) {
        case 's':
            sub = optarg;
            break;
        case 't':
            ttl = optarg;
            break;
        case 'c':
            conf_path = optarg;
            break;
        case 'j':
            json = true;
            break;
        default:
            return usage_token();
        }
    }
    if (!sub || !conf_path || optind != argc)
        return usage_token();
    int64_t ttl_ms = 0;
    if (ttl && (conf_parse_duration_ms(ttl, &ttl_ms) != 0 || ttl_ms < 1000)) {
        fprintf(stderr, "sluice token: --ttl: expected a duration of at least 1s (\"15m\")\n");
        return 2;
    }
    char err[512];
    conf_t *conf = conf_load(conf_path, err, sizeof(err));
    if (!conf) {
        fprintf(stderr, "sluice token: %s\n", err);
        return 1;
    }
    int rc = 1;
    auth_stores_t *st = auth_stores_new(16, 16);
    auth_t *a = NULL;
    char *tok = NULL, key[65];
    if (!auth_conf_enabled(&conf->auth)) {
        fprintf(stderr, "sluice token: %s has no auth.tokens.keys\n", conf_path);
        goto out;
    }
    /* auth_new's start-up line (the nonce store's size) is for the server's
     * log, not for a tool whose output is a token */
    sl_log_level_t lvl = sl_log_get_level();
    if (lvl < SL_LOG_WARN)
        sl_log_set_level(SL_LOG_WARN);
    a = st ? auth_new(&conf->auth, st, err, sizeof(err)) : NULL;
    sl_log_set_level(lvl);
    if (!a) {
        fprintf(stderr, "sluice token: %s\n", st ? err : "out of memory");
        goto out;
    }
    int64_t ttl_s = ttl_ms ? ttl_ms / 1000 : a->ttl_s;
    if (auth_token_mint(a, sub, ttl_s, sl_wall_s(), &tok, key, err, sizeof(err)) != 0) {
        fprintf(stderr, "sluice token: %s\n", err);
        goto out;
    }
    if (json) {
        json_t *j = json_pack("{s:s,s:s,s:I}", "access_token", tok, "token_type", "Bearer",
                              "expires_in", (json_int_t)ttl_s);
        if (j && key[0])
            json_object_set_new(j, "signing_key", json_string(key));
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (!s)
            goto out;
        printf("%s\n", s);
        free(s);
    } else {
        printf("access_token: %s\n", tok);
        if (key[0])
            printf("signing_key: %s\n", key);
        else
            printf("signing_key: (none: auth.signing.secret_env is not set)\n");
        printf("expires_in: %lld\n", (long long)ttl_s);
    }
    rc = fflush(stdout) == 0 ? 0 : 1;
out:
    OPENSSL_cleanse(key, sizeof(key));
    free(tok);
    auth_free(a);
    auth_stores_free(st);
    conf_free(conf);
    return rc;
}

/* The whole file (or stdin for "-"), at most CLI_BODY_MAX bytes. */
static char *read_body(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t m = fread(buf + n, 1, cap - n, f);
        n += m;
        if (m == 0)
            break;
        if (n == cap) {
            if (cap >= CLI_BODY_MAX) {
                SL_FREE(buf);
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb)
                SL_FREE(buf);
            buf = nb;
            cap *= 2;
        }
    }
    if (buf && ferror(f))
        SL_FREE(buf);
    if (f != stdin)
        fclose(f);
    *len = n;
    return buf;
}

static int cli_sign(int argc, char **argv)
{
    static const struct option opts[] = {
        {"key", required_argument, NULL, 'k'},
        {"method", required_argument, NULL, 'm'},
        {"path", required_argument, NULL, 'p'},
        {"body", required_argument, NULL, 'b'},
        {"timestamp", required_argument, NULL, 't'},
        {"nonce", required_argument, NULL, 'n'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *key = NULL, *method = NULL, *path = NULL, *body_path = NULL, *ts_arg = NULL,
               *nonce_arg = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "k:m:p:b:t:n:h", opts, NULL)) != -1) {
        switch (c) {
        case 'k':
            key = optarg;
            break;
        case 'm':
            method = optarg;
            break;
        case 'p':
            path = optarg;
            break;
        case 'b':
            body_path = optarg;
            break;
        case 't':
            ts_arg = optarg;
            break;
        case 'n':
            nonce_arg = optarg;
            break;
        default:
            return usage_sign();
        }
    }
    if (!key || !method || !path || optind != argc || !*method || path[0] != '/')
        return usage_sign();
    if (strlen(key) != 64)
        fprintf(stderr, "sluice sign: warning: a signing key is 64 hex characters\n");
    char ts[24], nonce[AUTH_NONCE_MAX + 1];
    int64_t tsv;
    if (ts_arg) {
        if (auth_sig_parse_timestamp(ts_arg, strlen(ts_arg), &tsv) != AUTH_OK) {
            fprintf(stderr, "sluice sign: --timestamp: expected Unix seconds\n");
            return 2;
        }
    } else {
        tsv = sl_wall_s();
    }
    snprintf(ts, sizeof(ts), "%lld", (long long)tsv);
    if (nonce_arg) {
        if (auth_sig_check_nonce(nonce_arg, strlen(nonce_arg)) != AUTH_OK) {
            fprintf(stderr, "sluice sign: --nonce: 16 to 64 characters of [A-Za-z0-9_-]\n");
            return 2;
        }
        snprintf(nonce, sizeof(nonce), "%s", nonce_arg);
    } else {
        unsigned char rnd[16];
        if (RAND_bytes(rnd, sizeof(rnd)) != 1) {
            fprintf(stderr, "sluice sign: no randomness for a nonce\n");
            return 1;
        }
        auth_b64url_encode(rnd, sizeof(rnd), nonce);
    }
    size_t blen = 0;
    char *body = body_path ? read_body(body_path, &blen) : NULL;
    if (body_path && !body) {
        fprintf(stderr, "sluice sign: cannot read the body from %s\n", body_path);
        return 1;
    }
    unsigned char h[32];
    char sig[65];
    int rc = 1;
    if (auth_sha256(body ? body : "", blen, h) == 0 &&
        auth_sig_compute(key, strlen(key), method, strlen(method), path, strlen(path), ts,
                         strlen(ts), nonce, strlen(nonce), h, sig) == 0) {
        printf("X-Sluice-Timestamp: %s\nX-Sluice-Nonce: %s\nX-Sluice-Signature: %s\n", ts, nonce,
               sig);
        rc = fflush(stdout) == 0 ? 0 : 1;
    }
    free(body);
    return rc;
}

int auth_cli_main(int argc, char **argv)
{
    if (argc < 1 || !argv[0])
        return 2;
    if (strcmp(argv[0], "token") == 0)
        return cli_token(argc, argv);
    if (strcmp(argv[0], "sign") == 0)
        return cli_sign(argc, argv);
    fprintf(stderr, "sluice: unknown tool \"%s\" (token, sign)\n", argv[0]);
    return 2;
}
