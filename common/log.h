/*
 * log.h — the error log (stderr or a file), one line per message with time,
 * level and thread. The access log is separate (gateway/accesslog.h).
 */
#ifndef SL_LOG_H
#define SL_LOG_H

#include "common/sl.h"

typedef enum { SL_LOG_DEBUG = 0, SL_LOG_INFO, SL_LOG_WARN, SL_LOG_ERROR } sl_log_level_t;

void sl_log_set_level(sl_log_level_t lvl);
sl_log_level_t sl_log_get_level(void);
/* Parses "debug", "info", "warn", "error"; -1 when unknown. */
int sl_log_level_parse(const char *s);

void sl_log(sl_log_level_t lvl, const char *fmt, ...) SL_PRINTF(2, 3) SL_COLD;

/* Where the error log goes: "stderr" (the process's own fd 2, the default)
 * or a file path, opened for append and dup2'd onto fd 2, so that stray
 * writes to stderr (libraries, a child's inherited fd) follow it too. Main
 * thread only. 0 ok, -1 with err filled (the previous target stays). */
int sl_log_set_target(const char *target, char *err, size_t errlen) SL_WUR;
/* Opens the file again (after logrotate moved it: SIGUSR1) and puts it on
 * fd 2; the swap is one dup2, so a line is written wholly to the old or the
 * new file. No-op with stderr. Main thread only. */
int sl_log_reopen(char *err, size_t errlen) SL_WUR;

#define sl_debug(...) sl_log(SL_LOG_DEBUG, __VA_ARGS__)
#define sl_info(...)  sl_log(SL_LOG_INFO, __VA_ARGS__)
#define sl_warn(...)  sl_log(SL_LOG_WARN, __VA_ARGS__)
#define sl_error(...) sl_log(SL_LOG_ERROR, __VA_ARGS__)

/*
 * Rate-limited messages, for failures that repeat during an outage (an
 * upstream refusing connections, a certificate that will not verify, Redis
 * down). Each message has a key naming its source and cause, e.g.
 * "up http://10.0.0.1:8000 connect". The first message of a key is written at
 * once; the ones after it inside the interval are counted, not written; the
 * first one after the interval is written with "(N more like this in the last
 * Ts)", and sl_log_limited_flush() writes the counts of keys that went quiet.
 * So an outage costs one line per key per interval, whatever the request rate.
 * sl_log_limited() decides and writes under one lock, so lines come out in the
 * order their keys were claimed: a cause logged before its consequence on
 * every thread is written before it, whichever thread writes each.
 */
typedef struct sl_logrl sl_logrl_t;

/* At most max_keys keys are tracked (the least recently written is dropped
 * past that); interval_ns between two lines of one key. */
sl_logrl_t *sl_logrl_new(size_t max_keys, int64_t interval_ns) SL_WUR;
void sl_logrl_free(sl_logrl_t *rl);

/* The pure decision, with the clock passed in. Returns 1 when a line is due
 * now and sets *held to the number of messages held back since the key's last
 * line; 0 when this message is only counted. Thread-safe. */
int sl_logrl_check(sl_logrl_t *rl, const char *key, int64_t now_ns, uint64_t *held);

/* Calls emit(key, held, arg) for every key with held-back messages whose
 * interval has passed, and resets them. Returns how many it reported. */
size_t sl_logrl_flush(sl_logrl_t *rl, int64_t now_ns,
                      void (*emit)(const char *key, uint64_t held, int64_t interval_ns, void *arg),
                      void *arg);

/* The process-wide limiter behind sl_log_limited (10 s by default). */
void sl_log_limited_set_interval(int64_t interval_ns);
void sl_log_limited(sl_log_level_t lvl, const char *key, const char *fmt, ...)
    SL_PRINTF(3, 4) SL_COLD;
/* Writes "<key>: N more like this in the last Ts" for quiet keys; call it
 * from a periodic timer (the server's main loop does, once a second). */
void sl_log_limited_flush(void);

#endif
