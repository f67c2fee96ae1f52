/*
 * sdnotify.h — telling systemd (Type=notify) what the process is doing, over
 * libsystemd's sd_notify(3). Every call is a no-op returning 0 when
 * NOTIFY_SOCKET is unset, i.e. when sluice is not started by systemd (tests,
 * a terminal, another supervisor), so callers never need to check first.
 *
 * Where the server calls them (contrib/systemd/sluice.service, docs/ops.md):
 *   sl_notify_ready()      once the listeners are open and the workers run
 *   sl_notify_reloading()  on SIGHUP, before the new conf is built; then
 *   sl_notify_ready()      when the reload is done, applied or refused
 *   sl_notify_stopping()   when a SIGTERM drain starts (never for the drain of
 *                          a SIGUSR2 upgrade: systemd would stop the unit)
 *   sl_notify_mainpid()    the new binary of a SIGUSR2 upgrade, once ready:
 *                          systemd then follows the new process (which
 *                          calls sl_notify_watchdog_adopt() at start)
 *   sl_notify_watchdog()   from the main loop, every sl_notify_watchdog_usec()/2
 *
 * Call them from the main thread: they read the environment (getenv), and
 * sl_notify_watchdog_adopt() writes it. Each is one sendmsg() on a unix
 * datagram socket, cheap enough for a main-loop timer.
 *
 * Return convention: 1 sent, 0 not under systemd (nothing sent), -1 the send
 * failed (errno set). The results are advisory: the gateway runs the same
 * either way, so callers may log a -1 and go on.
 */
#ifndef SL_SDNOTIFY_H
#define SL_SDNOTIFY_H

#include <stdint.h>

/* "READY=1": start-up (or a reload) is complete. */
int sl_notify_ready(void);

/* "RELOADING=1" with "MONOTONIC_USEC=<CLOCK_MONOTONIC now>": systemd >= 253
 * requires the timestamp for Type=notify-reload; Debian 12's 252 ignores
 * the extra field and takes RELOADING=1 alone. Follow with sl_notify_ready(). */
int sl_notify_reloading(void);

/* "STOPPING=1": the graceful drain of a SIGTERM has started. */
int sl_notify_stopping(void);

/* "WATCHDOG=1": the main loop is alive. */
int sl_notify_watchdog(void);

/* "MAINPID=<getpid()>" and "READY=1" in one datagram: the new process of a
 * binary upgrade takes over as the unit's main process (needs
 * NotifyAccess=all in the unit, which sluice.service sets). */
int sl_notify_mainpid(void);

/* "STATUS=<text>" (shown by systemctl status); text is cut at 256 bytes
 * and at its first newline so it cannot inject another assignment. */
int sl_notify_status(const char *text);

/* The watchdog interval systemd expects WATCHDOG=1 within, in microseconds
 * (WatchdogSec=), or 0 when no watchdog is set for this process. Ping at
 * half of it. Only honoured when WATCHDOG_PID, if set, names this process,
 * as sd_watchdog_enabled(3) does. */
int64_t sl_notify_watchdog_usec(void);

/* For the new process of a SIGUSR2 upgrade, at start while it is still
 * single-threaded (it calls setenv): systemd set WATCHDOG_PID to the old
 * process, this one's parent, so sd_watchdog_enabled() would say "not for
 * you". When WATCHDOG_PID names the parent, it is rewritten to this process.
 * Returns 1 adopted, 0 nothing to adopt (no watchdog, or meant for another
 * process). */
int sl_notify_watchdog_adopt(void);

#endif
