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

void sl_log(sl_log_level_t lvl, const char *fmt, ...) SL_PRINTF(2, 3);

#define sl_debug(...) sl_log(SL_LOG_DEBUG, __VA_ARGS__)
#define sl_info(...)  sl_log(SL_LOG_INFO, __VA_ARGS__)
#define sl_warn(...)  sl_log(SL_LOG_WARN, __VA_ARGS__)
#define sl_error(...) sl_log(SL_LOG_ERROR, __VA_ARGS__)

#endif
