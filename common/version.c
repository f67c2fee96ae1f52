/*
 * version.c — the `sluice -V` report (see version.h). Library versions are
 * asked of the libraries themselves wherever they can say (the .so that is
 * actually loaded); hiredis 0.14 has no such call, so its line gives the
 * headers' version and the file the loader mapped, which names the soname.
 *
 * Compiled with -DSL_VERSION_STR, -DSL_COMMIT_STR and -DSL_BUILD_FLAGS_STR
 * from the Makefile; the fallbacks below keep a build by hand working.
 */
#include "common/version.h"

#include <dlfcn.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <http_parser.h>
#include <jansson.h>
#include <nghttp2/nghttp2.h>
#include <openssl/crypto.h>
#include <pcre2.h>
#include <yajl/yajl_version.h>
#include <yaml.h>

#include "common/sl.h"

#ifndef SL_VERSION_STR
#define SL_VERSION_STR "0.0.0"
#endif
#ifndef SL_COMMIT_STR
#define SL_COMMIT_STR "unknown"
#endif
#ifndef SL_BUILD_FLAGS_STR
#define SL_BUILD_FLAGS_STR "unknown"
#endif

#define SL_STR_(x) #x
#define SL_STR(x)  SL_STR_(x)

const char *sl_version(void)
{
    return SL_VERSION_STR;
}

const char *sl_version_commit(void)
{
    return SL_COMMIT_STR;
}

static const char *sl_version_compiler(void)
{
#if defined(__clang__)
    return "clang " __clang_version__;
#elif defined(__GNUC__)
    return "gcc " __VERSION__;
#else
    return "unknown";
#endif
}

/* The base name of the shared object that holds sym, or "?" (static link
 * or no dladdr). */
static const char *sl_version_loaded_from(const void *sym)
{
    Dl_info info;
    if (dladdr(sym, &info) == 0 || !info.dli_fname)
        return "?";
    const char *slash = strrchr(info.dli_fname, '/');
    return slash ? slash + 1 : info.dli_fname;
}

int sl_version_print(FILE *f)
{
    char pcre[64] = "?";
    if (pcre2_config(PCRE2_CONFIG_VERSION, pcre) < 0)
        snprintf(pcre, sizeof(pcre), "?");
    uint32_t jit = 0;
    (void)pcre2_config(PCRE2_CONFIG_JIT, &jit);
    unsigned long hp = http_parser_version();

    fprintf(f, "sluice %s\n", sl_version());
    fprintf(f, "commit: %s\n", sl_version_commit());
    fprintf(f, "compiler: %s\n", sl_version_compiler());
    fprintf(f, "build flags: %s\n", SL_BUILD_FLAGS_STR);
    fprintf(f, "libevent: %s\n", event_get_version());
    fprintf(f, "OpenSSL: %s\n", OpenSSL_version(OPENSSL_VERSION));
    fprintf(f, "jansson: %s\n", jansson_version_str());
    fprintf(f, "PCRE2: %s (JIT %s)\n", pcre, jit ? "yes" : "no");
    /* hiredis 0.14 exports no version function: the headers' numbers, and
     * the library file actually loaded (its soname carries major.minor). */
    fprintf(f, "hiredis: %s (headers; loaded %s)\n",
            SL_STR(HIREDIS_MAJOR) "." SL_STR(HIREDIS_MINOR) "." SL_STR(HIREDIS_PATCH),
            sl_version_loaded_from((const void *)redisConnect));
    fprintf(f, "libyaml: %s\n", yaml_get_version_string());
    fprintf(f, "http-parser: %lu.%lu.%lu\n", (hp >> 16) & 255, (hp >> 8) & 255, hp & 255);
    const nghttp2_info *h2 = nghttp2_version(0);
    fprintf(f, "nghttp2: %s\n", h2 ? h2->version_str : "?");
    int yv = yajl_version(); /* MAJOR * 10000 + MINOR * 100 + MICRO */
    fprintf(f, "yajl: %d.%d.%d\n", yv / 10000, yv / 100 % 100, yv % 100);
    return ferror(f) ? -1 : 0;
}
