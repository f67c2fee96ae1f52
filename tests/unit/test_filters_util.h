/*
 * test_filters_util.h — helpers shared by the filters unit tests (header
 * only, so it is not a test binary of its own): build a ruleset from word
 * lists given inline (written to temporary files) and regex rules.
 */
#ifndef TEST_FILTERS_UTIL_H
#define TEST_FILTERS_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "filters/filters.h"

typedef struct tf_list {
    const char *words; /* file content */
    int action;
    const char *name;
} tf_list_t;

static inline char *tf_write_file(const char *content)
{
    char tmpl[] = "/tmp/flt_test_XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd < 0)
        return NULL;
    size_t n = strlen(content);
    if (write(fd, content, n) != (ssize_t)n) {
        close(fd);
        return NULL;
    }
    close(fd);
    return strdup(tmpl);
}

/* The calling thread's CPU time in ns, for the tests' time bounds: the wall
 * clock would also count other processes' time on a loaded machine. */
static inline int64_t tf_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* tweak may adjust the conf before the build (limits, input settings). */
static inline flt_ruleset_t *tf_build(const tf_list_t *lists, size_t nl, const flt_conf_regex_t *re,
                                      size_t nr, void (*tweak)(flt_conf_t *), char *err,
                                      size_t errlen)
{
    flt_conf_t c;
    flt_conf_defaults(&c);
    flt_conf_words_t w[16];
    char *paths[16];
    for (size_t i = 0; i < nl && i < 16; i++) {
        paths[i] = tf_write_file(lists[i].words);
        w[i] = (flt_conf_words_t){paths[i], lists[i].action, lists[i].name};
    }
    c.words = w;
    c.nwords = nl;
    c.regex = re;
    c.nregex = nr;
    if (tweak)
        tweak(&c);
    flt_ruleset_t *rs = flt_ruleset_build(&c, err, errlen);
    for (size_t i = 0; i < nl && i < 16; i++) {
        unlink(paths[i]);
        free(paths[i]);
    }
    return rs;
}

#endif
