/*
 * json_intake.h — parsing the client's JSON body (json_intake.c): every
 * valid JSON document accepted, errors in sluice's own words.
 */
#ifndef GW_JSON_INTAKE_H
#define GW_JSON_INTAKE_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

/* The parsed body (new reference), or NULL with msg set to a message for
 * the client (400 invalid_json). *inexact: some integer did not fit int64
 * and is held as a real, so a body sluice serialises again would change
 * it (forward the client's bytes when nothing was edited). */
json_t *gw_json_intake(const char *p, size_t len, bool *inexact, char *msg, size_t msglen);

#endif
