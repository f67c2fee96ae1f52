/*
 * version.h — what `sluice -V` prints: sluice's version and commit, how it
 * was built, and the version of each library it runs with (as loaded at run
 * time, which after a library upgrade may differ from the headers it was
 * compiled against). The values come from the Makefile (VERSION,
 * SLUICE_COMMIT, the build flags) as -D defines on common/version.c only.
 */
#ifndef SL_VERSION_H
#define SL_VERSION_H

#include <stdio.h>

/* sluice's version, e.g. "0.1.0" (the Makefile's VERSION). */
const char *sl_version(void);

/* The commit the binary was built from, e.g. "17e5805abc12" or
 * "17e5805abc12-dirty", or "unknown" outside a git checkout. */
const char *sl_version_commit(void);

/* Writes the -V report to f: one "name: value" line each, the first line
 * being "sluice VERSION". Returns 0, or -1 when f reports an error. */
int sl_version_print(FILE *f);

#endif
