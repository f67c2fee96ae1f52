/*
 * fuzz_util.h — what the filter fuzz targets share: an assertion that
 * aborts (libFuzzer and the corpus replay both report an abort) and a
 * word list written to a temporary file for a ruleset's conf.
 */
#ifndef TESTS_FUZZ_UTIL_H
#define TESTS_FUZZ_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FZ_ASSERT(c)                                                                               \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #c);                        \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* content in a new file under /tmp: its path (the caller's to unlink and
 * free); aborts when it cannot be written. */
static inline char *fz_file(const char *content)
{
    char tmpl[] = "/tmp/fuzz_words_XXXXXX";
    int fd = mkstemp(tmpl);
    FZ_ASSERT(fd >= 0);
    FZ_ASSERT(write(fd, content, strlen(content)) == (ssize_t)strlen(content));
    close(fd);
    char *p = strdup(tmpl);
    FZ_ASSERT(p != NULL);
    return p;
}

#endif
