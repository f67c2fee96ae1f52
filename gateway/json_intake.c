/*
 * json_intake.c — the client's JSON body as sluice parses it. Everything
 * valid JSON allows is accepted: "\u0000" inside strings (JSON_ALLOW_NUL;
 * every consumer reads strings with their length) and integers beyond
 * int64 (jansson refuses those, so the body is parsed again with integers
 * as reals and the integral ones that fit turned back into integers: the
 * tree sluice decides on is right, and the client's bytes are forwarded as
 * they came unless sluice must rewrite the body). Errors are sluice's own
 * words with the line and column, never the library's text.
 */
#include <math.h>
#include <stdio.h>

#include <jansson.h>

#include "gateway/json_intake.h"

/* 2^53: beyond it a double no longer holds every integer. */
#define GW_JSON_EXACT 9007199254740992.0

/* Integral reals back to integers, depth first (bounded by jansson's own
 * nesting limit, 2048). Returns -1 on allocation failure. */
static int gw_json_ints_back(json_t *j)
{
    if (json_is_object(j)) {
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v)
        {
            if (json_is_real(v)) {
                double d = json_real_value(v);
                if (d == floor(d) && fabs(d) < GW_JSON_EXACT &&
                    json_object_set_new(j, k, json_integer((json_int_t)d)) != 0)
                    return -1;
            } else if (gw_json_ints_back(v) != 0) {
                return -1;
            }
        }
    } else if (json_is_array(j)) {
        for (size_t i = 0; i < json_array_size(j); i++) {
            json_t *v = json_array_get(j, i);
            if (json_is_real(v)) {
                double d = json_real_value(v);
                if (d == floor(d) && fabs(d) < GW_JSON_EXACT &&
                    json_array_set_new(j, i, json_integer((json_int_t)d)) != 0)
                    return -1;
            } else if (gw_json_ints_back(v) != 0) {
                return -1;
            }
        }
    }
    return 0;
}

static const char *gw_json_why(enum json_error_code c)
{
    switch (c) {
    case json_error_premature_end_of_input:
        return "it ends before the JSON value does";
    case json_error_end_of_input_expected:
        return "there is more after the JSON value";
    case json_error_invalid_utf8:
        return "it is not valid UTF-8";
    case json_error_duplicate_key:
        return "an object has the same key twice";
    case json_error_numeric_overflow:
        return "a number is too large to represent";
    case json_error_stack_overflow:
        return "it is nested too deeply";
    case json_error_null_byte_in_key:
        return "an object key contains \\u0000";
    case json_error_null_character:
        return "it contains a NUL byte outside a string";
    case json_error_out_of_memory:
        return "sluice ran out of memory reading it";
    default:
        return "its syntax is invalid";
    }
}

json_t *gw_json_intake(const char *p, size_t len, bool *inexact, char *msg, size_t msglen)
{
    json_error_t je;
    *inexact = false;
    json_t *j = json_loadb(p, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!j && json_error_code(&je) == json_error_numeric_overflow) {
        /* Maybe an integer beyond int64 (valid JSON): as reals this time. */
        j = json_loadb(p, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL,
                       &je);
        if (j && gw_json_ints_back(j) != 0) {
            json_decref(j);
            j = NULL;
            snprintf(msg, msglen, "The request body could not be read (out of memory).");
            return NULL;
        }
        *inexact = j != NULL;
    }
    if (!j)
        snprintf(msg, msglen, "The request body is not valid JSON: %s (line %d, column %d).",
                 gw_json_why(json_error_code(&je)), je.line, je.column);
    return j;
}
