/*
 * sl_chat.h — a chat-completions request's messages as plain data: what
 * the gateway's body scanner (gateway/body_scan.c) read, handed to the
 * policy modules (filters/, ratelimit/) without a JSON tree and without
 * their including gateway headers. Every string is the decoded JSON string
 * (it may contain NUL bytes: "\u0000" is valid JSON), borrowed from the
 * scanner for the duration of the call.
 */
#ifndef SL_CHAT_H
#define SL_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* The type of a JSON value, ABSENT when the key is not there (or the
 * container holding it is not an object). */
typedef enum sl_jkind {
    SL_J_ABSENT = 0,
    SL_J_NULL,
    SL_J_FALSE,
    SL_J_TRUE,
    SL_J_INT, /* an integer jansson holds as an integer (fits int64) */
    SL_J_REAL,
    /* (in sl_chat_t a number is INT or REAL by its token alone: a body with
     * an integer beyond int64 somewhere makes jansson read every number as a
     * real; no policy tells a number's kinds apart) */
    SL_J_STRING,
    SL_J_ARRAY,
    SL_J_OBJECT,
} sl_jkind_t;

typedef struct sl_text {
    const char *p;
    size_t len;
} sl_text_t;

/* One element of a message's content array. */
typedef struct sl_chat_part {
    sl_jkind_t kind;      /* the part itself (an object, normally) */
    sl_jkind_t type_kind; /* "type" */
    sl_text_t type;
    sl_jkind_t text_kind; /* "text" */
    sl_text_t text;
    bool image_url; /* has an "image_url" member */
} sl_chat_part_t;

typedef struct sl_chat_msg {
    sl_jkind_t kind;      /* the message itself (an object, normally) */
    sl_jkind_t role_kind; /* "role" */
    sl_text_t role;
    sl_jkind_t content_kind; /* "content": a string, or an array of parts */
    sl_text_t content;
    size_t part0, nparts; /* parts[part0 .. part0 + nparts) of the sl_chat_t */
    sl_jkind_t name_kind; /* "name" */
    sl_text_t name;
    sl_jkind_t tool_calls_kind; /* "tool_calls" */
    sl_text_t tool_calls;       /* its JSON text as sent (a span of the body), when an
                                 * array or object; NULL when not recorded */
} sl_chat_msg_t;

typedef struct sl_chat {
    sl_jkind_t messages_kind; /* "messages" */
    const sl_chat_msg_t *msgs;
    size_t nmsgs;
    const sl_chat_part_t *parts;
    sl_jkind_t tools_kind; /* "tools" */
    sl_text_t tools;       /* its JSON text as sent, when there (NULL: not recorded) */
    bool bigint;           /* an integer beyond int64 somewhere in the body */
} sl_chat_t;

/* strcmp()'s answer on a JSON string as jansson hands it out (it stops at
 * an embedded NUL): does t read as the C string lit? */
static inline bool sl_text_is_n(sl_text_t t, const char *lit, size_t n)
{
    return t.p && t.len >= n && memcmp(t.p, lit, n) == 0 && (t.len == n || t.p[n] == '\0');
}

/* The same for a literal; sl_text_is_n for a string of a table, with its
 * length kept beside it (a strlen a call otherwise). */
static inline bool sl_text_is(sl_text_t t, const char *lit)
{
    return sl_text_is_n(t, lit, strlen(lit));
}

#endif
