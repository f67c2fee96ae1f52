/*
 * fuzz_conf.c — libFuzzer target for the configuration loader: arbitrary
 * bytes through conf_load_string(). A conf either loads (then the reload
 * comparison with itself must pass, and the error buffer stays empty) or is
 * refused with exactly one line naming the file.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conf/conf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    conf_t *c = conf_load_string((const char *)data, size, "f.yaml", err, sizeof(err));
    if (c) {
        if (conf_reload_check(c, c, err, sizeof(err)) != 0)
            abort();
        for (size_t i = 0; i < c->nmodels; i++)
            if (!conf_upstream_find(c, c->models[i].upstream) ||
                conf_model_find(c, c->models[i].name) == NULL)
                abort();
        conf_free(c);
    } else if (strncmp(err, "f.yaml", 6) != 0 || strchr(err, '\n')) {
        abort();
    }
    return 0;
}
