/*
 * issue16_rules.h — issue #16's "full" filter rules for the bench tools, as
 * bench/lib.sh's realistic confs have them: a 1,001-word list and the
 * phone-number regex, both masking.
 */
#ifndef SLUICE_TOOLS_ISSUE16_RULES_H
#define SLUICE_TOOLS_ISSUE16_RULES_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "filters/filters.h"

/* The rules, with the output filter on or off; NULL with err set. */
static inline flt_ruleset_t *issue16_rules(bool output, char *err, size_t errlen)
{
    char path[] = "/tmp/sluice_rules_XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        snprintf(err, errlen, "cannot write the word list");
        return NULL;
    }
    for (int i = 0; i < 1001; i++)
        fprintf(f, "forbiddenword%04dx\n", i);
    fclose(f);
    flt_conf_t c;
    flt_conf_defaults(&c);
    flt_conf_words_t w = {path, FLT_ACTION_MASK, "words"};
    static const flt_conf_regex_t re[] = {{"phone", "1[3-9]\\d{9}", FLT_ACTION_MASK}};
    c.words = &w;
    c.nwords = 1;
    c.regex = re;
    c.nregex = 1;
    c.output = output;
    flt_ruleset_t *rs = flt_ruleset_build(&c, err, errlen);
    unlink(path);
    return rs;
}

#endif
